//! Each ring invariant of DESIGN.md, checked on a chosen scenario: on the
//! soft device, and on a wrapper queue pair that misbehaves on purpose
//! (partial posts, forged CQEs, a device that cannot drain).

use rdma_ring::backend::soft::{Progress, SoftCq, SoftDevice, SoftPd, SoftQp, SoftSrq};
use rdma_ring::backend::{
    CompletionEvents, CompletionQueue, CqId, PostError, QpCaps, QpConfig, QueuePair, RawCompletion,
    RecvWr, SendWr, Sge, WcStatus,
};
use rdma_ring::buf::{
    BaseBuf, BufferPool, ExposedBuf, PoolChunk, RegisteredBuf, RemoteAccess, RemoteSlice,
};
use rdma_ring::future::{AsyncRing, Wakeup};
use rdma_ring::op::{OpKind, Read, Recv, Send, Write};
use rdma_ring::ring::{Completion, Ring, RingConfig};
use rdma_ring::Error;

struct Pair {
    dev: SoftDevice,
    pd: SoftPd,
    a: Ring<SoftQp>,
    b: Ring<SoftQp>,
    exposed: ExposedBuf<Vec<u8>>,
    pool: BufferPool,
}

fn pair(progress: Progress, config: QpConfig, ring: RingConfig) -> Pair {
    let dev = SoftDevice::with_progress(progress);
    let pd = dev.alloc_pd();
    let (qa, qb) = dev.connected_pair(&pd, &pd, config).unwrap();
    let exposed = ExposedBuf::new(&pd, vec![0u8; 64 * 1024], RemoteAccess::all()).unwrap();
    let pool = BufferPool::new(&pd, 1024, 256).unwrap();
    Pair {
        a: Ring::new(qa, ring),
        b: Ring::new(qb, ring),
        dev,
        pd,
        exposed,
        pool,
    }
}

fn default_pair() -> Pair {
    pair(Progress::Auto, QpConfig::default(), RingConfig::default())
}

/// Pushes a 1 KiB WRITE (not asking for a completion) for each id in `ids`, to
/// the id's KiB of `remote`, tagged with the id.
fn push_writes<Q: QueuePair>(
    ring: &mut Ring<Q>,
    pool: &BufferPool,
    remote: &RemoteSlice,
    ids: std::ops::Range<u64>,
) {
    for i in ids {
        let target = remote.slice(i * 1024..(i + 1) * 1024).unwrap();
        ring.submission()
            .push(Write::new(pool.take().unwrap(), target).user_data(i))
            .unwrap();
    }
}

fn reap_all<Q: QueuePair>(ring: &mut Ring<Q>) -> Vec<Completion> {
    let mut out = Vec::new();
    ring.completion().reap(&mut out).unwrap();
    out
}

/// `reap` hands completions polled earlier (left ready by `poll`) before
/// those it reaps itself, keeps what was already in the caller's vector,
/// and counts only what it added.
#[test]
fn reap_keeps_order_after_poll_left_completions_ready() {
    let mut p = pair(Progress::Manual, QpConfig::default(), RingConfig::default());
    let remote = p.exposed.remote();
    let push = |ring: &mut Ring<SoftQp>, tags: std::ops::Range<u64>| {
        for i in tags {
            let target = remote.slice(i * 1024..(i + 1) * 1024).unwrap();
            ring.submission()
                .push(
                    Write::new(p.pool.take().unwrap(), target)
                        .signaled()
                        .user_data(i),
                )
                .unwrap();
        }
        ring.submission().submit().unwrap();
    };
    push(&mut p.a, 0..4);
    p.dev.progress();
    let first = p.a.completion().poll().unwrap().expect("four are done");
    assert_eq!(first.user_data(), 0);
    assert_eq!(p.a.completion().ready(), 3, "the other three wait in order");
    push(&mut p.a, 4..6);
    p.dev.progress();
    let mut out = vec![first];
    assert_eq!(p.a.completion().reap(&mut out).unwrap(), 5);
    let tags: Vec<u64> = out.iter().map(|c| c.user_data()).collect();
    assert_eq!(tags, (0..6).collect::<Vec<_>>());
    assert_eq!(p.a.completion().ready(), 0);
    assert_eq!(p.a.completion().reap(&mut out).unwrap(), 0, "nothing new");
    assert_eq!(out.len(), 6);
}

#[test]
fn one_doorbell_for_a_batch_of_64() {
    let mut p = pair(
        Progress::Auto,
        QpConfig {
            max_send_wr: 128,
            ..QpConfig::default()
        },
        RingConfig::default(),
    );
    let remote = p.exposed.remote();
    let control = p.a.qp().control();
    push_writes(&mut p.a, &p.pool, &remote, 0..64);
    assert_eq!(p.a.submission().submit().unwrap(), 64);
    let counters = control.counters();
    assert_eq!((counters.send_posts, counters.send_wrs), (1, 64));
    assert_eq!(p.a.stats().doorbells, 1);
    let done = p.a.completion().wait(64).unwrap();
    let mut tags: Vec<u64> = done.iter().map(|c| c.user_data()).collect();
    tags.sort();
    assert_eq!(tags, (0..64).collect::<Vec<_>>());
}

#[test]
fn unsignaled_ops_complete_with_the_last_signaled_one() {
    let mut p = pair(
        Progress::Manual,
        QpConfig::default(),
        RingConfig {
            signal_interval: 1000,
            ..RingConfig::default()
        },
    );
    let remote = p.exposed.remote();
    push_writes(&mut p.a, &p.pool, &remote, 0..10);
    p.a.submission().submit().unwrap();
    assert_eq!(
        p.a.stats().signaled,
        1,
        "only the last WR of the submit asks for a CQE"
    );
    // Nine WRs run: no CQE yet, so nothing comes back.
    for _ in 0..9 {
        assert!(p.a.qp().control().step());
    }
    assert!(reap_all(&mut p.a).is_empty());
    assert!(p.a.qp().control().step());
    let done = reap_all(&mut p.a);
    assert_eq!(
        done.iter().map(|c| c.user_data()).collect::<Vec<_>>(),
        (0..10).collect::<Vec<_>>()
    );
    assert!(done
        .iter()
        .all(|c| c.status().is_success() && c.byte_len() == 1024));
    assert_eq!(p.a.stats().implicit, 9);
}

#[test]
fn signal_interval_bounds_unsignaled_runs() {
    let mut p = pair(
        Progress::Auto,
        QpConfig::default(),
        RingConfig {
            signal_interval: 4,
            ..RingConfig::default()
        },
    );
    let remote = p.exposed.remote();
    for i in 0..16u64 {
        let target = remote.slice(i * 1024..(i + 1) * 1024).unwrap();
        p.a.submission()
            .push(Write::new(p.pool.take().unwrap(), target))
            .unwrap();
    }
    p.a.submission().submit().unwrap();
    assert_eq!(p.a.stats().signaled, 4);
    assert_eq!(p.a.completion().wait(16).unwrap().len(), 16);
}

#[test]
fn full_send_queue_hands_the_op_back() {
    let mut p = pair(
        Progress::Manual,
        QpConfig {
            max_send_wr: 4,
            ..QpConfig::default()
        },
        RingConfig::default(),
    );
    let remote = p.exposed.remote().slice(0..1024).unwrap();
    for _ in 0..3 {
        p.a.submission()
            .push(Write::new(p.pool.take().unwrap(), remote))
            .unwrap();
    }
    let mut chunk = p.pool.take().unwrap();
    chunk[..4].copy_from_slice(b"mine");
    let rejected =
        p.a.submission()
            .push(Write::new(chunk, remote).user_data(7))
            .unwrap_err();
    assert!(matches!(
        rejected.error(),
        Error::SendQueueFull {
            outstanding: 3,
            depth: 3
        }
    ));
    let chunk = rejected.into_value().into_buf();
    assert_eq!(&chunk[..4], b"mine");
    // Room returns once completions are reaped.
    p.a.submission().submit().unwrap();
    p.dev.progress();
    assert_eq!(reap_all(&mut p.a).len(), 3);
    p.a.submission().push(Write::new(chunk, remote)).unwrap();
}

#[test]
fn full_receive_queue_hands_the_op_back() {
    let mut p = pair(
        Progress::Auto,
        QpConfig {
            max_recv_wr: 2,
            ..QpConfig::default()
        },
        RingConfig::default(),
    );
    for _ in 0..2 {
        p.b.submission()
            .push(Recv::new(p.pool.take().unwrap()))
            .unwrap();
    }
    let rejected =
        p.b.submission()
            .push(Recv::new(p.pool.take().unwrap()))
            .unwrap_err();
    assert!(matches!(rejected.error(), Error::RecvQueueFull { .. }));
}

#[test]
fn injected_error_fails_one_and_flushes_the_rest() {
    let mut p = pair(Progress::Manual, QpConfig::default(), RingConfig::default());
    let remote = p.exposed.remote();
    p.a.qp().control().fail_nth(3, WcStatus::RemOpErr);
    push_writes(&mut p.a, &p.pool, &remote, 0..6);
    p.a.submission().submit().unwrap();
    p.dev.progress();
    let done = reap_all(&mut p.a);
    let statuses: Vec<(u64, WcStatus)> = done.iter().map(|c| (c.user_data(), c.status())).collect();
    assert_eq!(
        statuses,
        vec![
            (0, WcStatus::Success),
            (1, WcStatus::Success),
            (2, WcStatus::RemOpErr),
            (3, WcStatus::WrFlushErr),
            (4, WcStatus::WrFlushErr),
            (5, WcStatus::WrFlushErr),
        ]
    );
    assert_eq!(p.a.error_status(), Some(WcStatus::RemOpErr));
    let refused = p.a.submission().push(Write::new(
        p.pool.take().unwrap(),
        remote.slice(0..8).unwrap(),
    ));
    assert!(matches!(
        refused.unwrap_err().error(),
        Error::QpInError(WcStatus::RemOpErr)
    ));
    drop(done);
    drop(p.a);
    drop(p.b);
    assert_eq!(p.pool.available(), p.pool.capacity());
}

#[test]
fn wrong_rkey_is_a_remote_access_error_and_moves_both_sides_to_error() {
    let mut p = default_pair();
    let good = p.exposed.remote();
    let forged = RemoteSlice::new(good.addr(), 1024, good.rkey() ^ 0x40, RemoteAccess::all());
    p.b.submission()
        .push(Recv::new(p.pool.take().unwrap()).user_data(50))
        .unwrap();
    p.b.submission().submit().unwrap();
    p.a.submission()
        .push(Write::new(p.pool.take().unwrap(), forged).user_data(1))
        .unwrap();
    p.a.submission()
        .push(Write::new(p.pool.take().unwrap(), good.slice(0..1024).unwrap()).user_data(2))
        .unwrap();
    p.a.submission().submit().unwrap();
    let done = p.a.completion().wait(2).unwrap();
    assert_eq!(done[0].status(), WcStatus::RemAccessErr);
    assert_eq!(done[1].status(), WcStatus::WrFlushErr);
    assert!(matches!(
        done[0].result(),
        Err(Error::Completion {
            op: OpKind::Write,
            ..
        })
    ));
    // The responder's receive is flushed: its QP went to error too (RC class C).
    let b_done = p.b.completion().wait(1).unwrap();
    assert_eq!(
        (b_done[0].user_data(), b_done[0].status()),
        (50, WcStatus::WrFlushErr)
    );
}

#[test]
fn push_checks_remote_bounds_rights_and_domain() {
    let mut p = default_pair();
    let read_only = p
        .exposed
        .remote()
        .slice(0..512)
        .unwrap()
        .restrict(RemoteAccess::READ);
    let r =
        p.a.submission()
            .push(Write::new(p.pool.take().unwrap(), read_only))
            .unwrap_err();
    assert!(matches!(
        r.error(),
        Error::RemoteTooSmall {
            local: 1024,
            remote: 512
        }
    ));
    let r =
        p.a.submission()
            .push(Write::new(p.pool.take().unwrap().slice(0..512), read_only))
            .unwrap_err();
    assert!(
        matches!(r.error(), Error::MissingRemoteRights { .. }),
        "{}",
        r.error()
    );

    let other_pd = p.dev.alloc_pd();
    let foreign = RegisteredBuf::new(&other_pd, vec![0u8; 16]).unwrap();
    let r = p.a.submission().push(Send::new(foreign)).unwrap_err();
    assert!(matches!(r.error(), Error::WrongPd { .. }));
    let back: RegisteredBuf = r.into_value().into_buf();
    assert_eq!(back.len(), 16);

    let big = RegisteredBuf::new(&p.pd, vec![0u8; 1000]).unwrap();
    let r = p.a.submission().push(Send::new(big).inline()).unwrap_err();
    assert!(matches!(
        r.error(),
        Error::InlineTooLarge { len: 1000, max: 64 }
    ));
}

#[test]
fn send_without_receive_fails_after_rnr_retries() {
    let mut p = pair(
        Progress::Manual,
        QpConfig {
            rnr_retry: 2,
            ..QpConfig::default()
        },
        RingConfig::default(),
    );
    p.a.submission()
        .push(Send::new(p.pool.take().unwrap()).user_data(1))
        .unwrap();
    p.a.submission().submit().unwrap();
    for _ in 0..2 {
        p.dev.progress();
        assert!(reap_all(&mut p.a).is_empty(), "still retrying");
    }
    p.dev.progress();
    let done = reap_all(&mut p.a);
    assert_eq!(done[0].status(), WcStatus::RnrRetryExcErr);
    assert_eq!(p.a.qp().control().counters().rnr_naks, 3);
}

#[test]
fn receive_too_small_fails_both_sides() {
    let mut p = default_pair();
    p.b.submission()
        .push(Recv::new(p.pool.take().unwrap().slice(0..8)).user_data(9))
        .unwrap();
    p.b.submission().submit().unwrap();
    p.a.submission()
        .push(Send::new(p.pool.take().unwrap()))
        .unwrap();
    p.a.submission().submit().unwrap();
    assert_eq!(
        p.a.completion().wait(1).unwrap()[0].status(),
        WcStatus::RemInvReqErr
    );
    assert_eq!(
        p.b.completion().wait(1).unwrap()[0].status(),
        WcStatus::LocLenErr
    );
}

#[test]
fn a_vanished_peer_fails_ops_in_bounded_time() {
    let mut p = default_pair();
    let remote = p.exposed.remote();
    p.a.qp().control().break_connection();
    for i in 0..4u64 {
        let target = remote.slice(i * 1024..(i + 1) * 1024).unwrap();
        p.a.submission()
            .push(Read::new(p.pool.take().unwrap(), target))
            .unwrap();
    }
    p.a.submission().submit().unwrap();
    let done = p.a.completion().wait(4).unwrap();
    assert_eq!(done[0].status(), WcStatus::RetryExcErr);
    assert!(done[1..].iter().all(|c| c.status() == WcStatus::WrFlushErr));

    // Dropping the peer's ring (and so its QP) has the same effect.
    let mut p = default_pair();
    drop(p.b);
    p.a.submission()
        .push(Write::new(
            p.pool.take().unwrap(),
            p.exposed.remote().slice(0..1024).unwrap(),
        ))
        .unwrap();
    p.a.submission().submit().unwrap();
    assert_eq!(
        p.a.completion().wait(1).unwrap()[0].status(),
        WcStatus::RetryExcErr
    );
}

#[test]
fn dropping_a_ring_with_ops_in_flight_returns_every_buffer() {
    let mut p = pair(Progress::Manual, QpConfig::default(), RingConfig::default());
    let remote = p.exposed.remote();
    for i in 0..20u64 {
        let target = remote.slice(i * 1024..(i + 1) * 1024).unwrap();
        p.a.submission()
            .push(Write::new(p.pool.take().unwrap(), target))
            .unwrap();
    }
    p.a.submission().submit().unwrap();
    p.a.submission()
        .push(Recv::new(p.pool.take().unwrap()))
        .unwrap(); // never submitted
    p.a.qp().control().step(); // one ran, nineteen never will
    let control = p.a.qp().control();
    drop(p.a);
    assert_eq!(control.state(), None, "the QP is destroyed after the drain");
    assert_eq!(p.pool.available(), p.pool.capacity());
}

#[test]
fn close_hands_every_op_back() {
    let mut p = pair(Progress::Manual, QpConfig::default(), RingConfig::default());
    for i in 0..5 {
        p.a.submission()
            .push(Recv::new(p.pool.take().unwrap()).user_data(i))
            .unwrap();
    }
    p.a.submission().submit().unwrap();
    p.a.submission()
        .push(Recv::new(p.pool.take().unwrap()).user_data(5))
        .unwrap();
    let back = p.a.close();
    let mut tags: Vec<u64> = back.iter().map(|c| c.user_data()).collect();
    tags.sort();
    assert_eq!(tags, (0..6).collect::<Vec<_>>());
    assert!(back.iter().all(|c| c.status() == WcStatus::WrFlushErr));
    let chunk: PoolChunk = back
        .into_iter()
        .next()
        .unwrap()
        .into_buf()
        .downcast()
        .unwrap();
    assert_eq!(chunk.len(), 1024);
}

thread_local! {
    static ACCEPT: std::cell::Cell<Option<usize>> = const { std::cell::Cell::new(None) };
    static FORGED: std::cell::RefCell<Vec<RawCompletion>> = const { std::cell::RefCell::new(Vec::new()) };
    static WEDGED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    static NO_SEND_QUEUE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    static CANNOT_TELL: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    static REFUSE_EMPTY: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    static WITH_CHANNEL: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Accept at most this many send WRs per post (this thread's rings).
fn set_accept(n: Option<usize>) {
    ACCEPT.with(|a| a.set(n));
}

/// Refuse posts of one work request naming no memory (the ring's
/// markers).
fn set_refuse_empty(refuse: bool) {
    REFUSE_EMPTY.with(|r| r.set(refuse));
}

/// A partial post reports every work request as accepted: a backend that
/// cannot tell which it took, as the contract allows.
fn set_cannot_tell(cannot_tell: bool) {
    CANNOT_TELL.with(|c| c.set(cannot_tell));
}

/// Rings made from now on (on this thread) find the soft completion
/// queue's channel (forged CQEs raise no event on it).
fn set_with_channel(with: bool) {
    WITH_CHANNEL.with(|c| c.set(with));
}

/// Report these CQEs before the real ones.
fn set_forged(cqes: Vec<RawCompletion>) {
    FORGED.with(|f| *f.borrow_mut() = cqes);
}

/// Refuse to move to error and report no completions: a device that
/// cannot drain.
fn set_wedged(wedged: bool) {
    WEDGED.with(|w| w.set(wedged));
}

/// A queue pair that misbehaves on purpose, around a soft one, with a
/// completion queue that does too; the knobs are thread-local so a test
/// can turn them while a ring owns the queue pair.
struct Misbehaving {
    inner: SoftQp,
}

struct MisbehavingCq {
    inner: SoftCq,
}

// SAFETY: misbehaves only in ways the contract allows (partial posts with
// an exact `accepted`); every real completion is the inner soft queue
// pair's.
unsafe impl QueuePair for Misbehaving {
    type Cq = MisbehavingCq;
    type Srq = SoftSrq;
    fn caps(&self) -> QpCaps {
        let mut caps = self.inner.caps();
        if NO_SEND_QUEUE.with(|n| n.get()) {
            caps.max_send_wr = 0;
        }
        caps
    }
    unsafe fn post_send(&mut self, wrs: &[SendWr], sges: &[Sge]) -> Result<(), PostError> {
        if WEDGED.with(|w| w.get()) {
            return Err(PostError {
                accepted: 0,
                error: Error::PostRejected("wedged"),
            });
        }
        if REFUSE_EMPTY.with(|r| r.get()) && wrs.len() == 1 && wrs[0].sges.len == 0 {
            return Err(PostError {
                accepted: 0,
                error: Error::PostRejected("test refuses markers"),
            });
        }
        let n = ACCEPT
            .with(|a| a.get())
            .map_or(wrs.len(), |n| n.min(wrs.len()));
        // SAFETY: the caller's contract is passed through unchanged.
        unsafe { self.inner.post_send(&wrs[..n], sges) }?;
        if n < wrs.len() {
            let cannot_tell = CANNOT_TELL.with(|c| c.get());
            return Err(PostError {
                accepted: if cannot_tell { wrs.len() } else { n },
                error: Error::PostRejected("test refuses the rest"),
            });
        }
        Ok(())
    }
    unsafe fn post_recv(&mut self, wrs: &[RecvWr], sges: &[Sge]) -> Result<(), PostError> {
        // SAFETY: the caller's contract is passed through unchanged.
        unsafe { self.inner.post_recv(wrs, sges) }
    }
    fn set_error(&mut self) -> Result<(), Error> {
        if WEDGED.with(|w| w.get()) {
            return Err(Error::Soft("wedged"));
        }
        self.inner.set_error()
    }
    fn take_cq(&mut self) -> Option<MisbehavingCq> {
        self.inner.take_cq().map(|inner| MisbehavingCq { inner })
    }
}

// SAFETY: reports only the inner queue's completions, plus forged ones with
// `wr_id`s that name no posted work request (the contract's "never for a
// work request that was not posted" is what the ring must survive being
// tested on: the forged ids are stale or foreign).
unsafe impl CompletionQueue for MisbehavingCq {
    fn id(&self) -> CqId {
        self.inner.id()
    }
    fn entries(&self) -> u32 {
        self.inner.entries()
    }
    fn poll(&mut self, out: &mut [RawCompletion]) -> Result<usize, Error> {
        if WEDGED.with(|w| w.get()) {
            return Ok(0);
        }
        if let Some(c) = FORGED.with(|f| f.borrow_mut().pop()) {
            out[0] = c;
            return Ok(1);
        }
        self.inner.poll(out)
    }
    fn completion_events(&self) -> Option<std::sync::Arc<dyn CompletionEvents>> {
        if WITH_CHANNEL.with(|c| c.get()) {
            self.inner.completion_events()
        } else {
            None
        }
    }
}

fn misbehaving(p: &Pair) -> Ring<Misbehaving> {
    let (qp, peer) = p
        .dev
        .connected_pair(&p.pd, &p.pd, QpConfig::default())
        .unwrap();
    std::mem::forget(peer); // keep the link up for the test's lifetime
    Ring::new(
        Misbehaving { inner: qp },
        RingConfig {
            drain_timeout: std::time::Duration::from_millis(50),
            wait_timeout: std::time::Duration::from_secs(5),
            ..RingConfig::default()
        },
    )
}

/// A queue pair no ring takes (here, one that says it has no send queue)
/// is refused by `Ring::try_new` with its own completion queue still in it.
#[test]
fn a_queue_pair_try_new_refuses_keeps_its_completion_queue() {
    let p = default_pair();
    let (qp, _peer) = p
        .dev
        .connected_pair(&p.pd, &p.pd, QpConfig::default())
        .unwrap();
    NO_SEND_QUEUE.with(|n| n.set(true));
    let refused = Ring::try_new(Misbehaving { inner: qp }, RingConfig::default()).unwrap_err();
    NO_SEND_QUEUE.with(|n| n.set(false));
    assert!(
        matches!(refused.error(), Error::Incompatible(_)),
        "{}",
        refused.error()
    );
    let mut qp = refused.into_value();
    assert!(
        qp.take_cq().is_some(),
        "the completion queue is still the queue pair's"
    );
}

#[test]
fn a_partial_post_hands_back_the_unposted_ops() {
    let p = default_pair();
    let mut ring = misbehaving(&p);
    let remote = p.exposed.remote();
    push_writes(&mut ring, &p.pool, &remote, 0..5);
    let qp = ring.default_qp().unwrap();
    let sends = |ring: &Ring<Misbehaving>| {
        let stats = ring.qp_stats(qp).unwrap();
        (stats.sends_pushed, stats.sends_done)
    };
    assert_eq!(sends(&ring), (5, 0));
    // Accept two, refuse from the third on.
    set_accept(Some(2));
    let err = ring.submission().submit().unwrap_err();
    assert_eq!(err.posted, 2);
    // The three handed back are finished, but not the two posted before
    // them: in push order, nothing has finished yet.
    assert_eq!(sends(&ring), (5, 0));
    assert_eq!(
        err.unposted.iter().map(|u| u.user_data).collect::<Vec<_>>(),
        vec![2, 3, 4]
    );
    assert!(err.unposted.iter().all(|u| u.bufs[0].len() == 1024));
    drop(err);
    set_accept(None);
    // The posted prefix ended unsignaled; the ring's sync marker releases it
    // without waiting for later work.
    let done = ring.completion().wait(2).unwrap();
    assert_eq!(
        done.iter().map(|c| c.user_data()).collect::<Vec<_>>(),
        vec![0, 1]
    );
    assert!(done.iter().all(|c| c.status().is_success()));
    assert_eq!(ring.in_flight(), 0);
    // The marker took a send slot but is no operation: it counts in
    // neither figure.
    assert_eq!(sends(&ring), (5, 5));
    ring.submission()
        .push(Write::new(p.pool.take().unwrap(), remote.slice(0..1024).unwrap()).user_data(9))
        .unwrap();
    assert_eq!(sends(&ring), (6, 5));
    ring.submission().submit().unwrap();
    assert_eq!(ring.completion().wait(1).unwrap()[0].user_data(), 9);
    assert_eq!(sends(&ring), (6, 6));
}

/// The ring's counts of a queue pair's sends pushed and finished, in push
/// order: sends a refused post handed back count only once those posted
/// before them finished, and the sync marker behind a partial post, which
/// holds a send slot, is nobody's operation and counts in neither.
#[test]
fn sends_finish_in_push_order_around_a_partial_post_and_its_marker() {
    let p = default_pair();
    let mut ring = misbehaving(&p);
    let qp = ring.default_qp().unwrap();
    let remote = p.exposed.remote();
    let sends = |ring: &Ring<Misbehaving>| {
        let stats = ring.qp_stats(qp).unwrap();
        (stats.sends_pushed, stats.sends_done)
    };
    let push = |ring: &mut Ring<Misbehaving>, n: u64| {
        for i in 0..n {
            let target = remote.slice(i * 1024..(i + 1) * 1024).unwrap();
            ring.submission()
                .push(Write::new(p.pool.take().unwrap(), target).user_data(i))
                .unwrap();
        }
    };
    push(&mut ring, 2);
    ring.submission().submit().unwrap();
    ring.completion().wait(2).unwrap();
    assert_eq!(sends(&ring), (2, 2));
    push(&mut ring, 5);
    set_accept(Some(2));
    let err = ring.submission().submit().unwrap_err();
    set_accept(None);
    assert_eq!((err.posted, err.unposted.len()), (2, 3));
    // Two posted and a marker out: the first two pushes are all that
    // finished in order.
    assert_eq!(sends(&ring), (7, 2));
    drop(err);
    ring.completion().wait(2).unwrap();
    assert_eq!(sends(&ring), (7, 7));
}

/// A backend that cannot tell which work requests of a post it took
/// reports them all; the ring then moves the queue pair to error. What the
/// device never took gets no completion, so the flush that releases the
/// rest at teardown must not report it as done: from that post on, no
/// send released without a completion of its own comes back successful.
/// Those posted before it ran (RC completes in order), and say so.
#[test]
fn a_post_the_backend_cannot_account_for_reports_no_success_it_did_not_see() {
    let p = default_pair();
    let mut ring = misbehaving(&p);
    let remote = p.exposed.remote();
    let push = |ring: &mut Ring<Misbehaving>, i: u64| {
        let target = remote.slice(i * 1024..(i + 1) * 1024).unwrap();
        ring.submission()
            .push(Write::new(p.pool.take().unwrap(), target).user_data(i))
            .unwrap();
    };
    // Accounted for: taken whole, completions not reaped yet.
    for i in 0..3 {
        push(&mut ring, i);
    }
    ring.submission().submit().unwrap();
    for i in 3..8 {
        push(&mut ring, i);
    }
    // The device takes two and the backend cannot say so.
    set_accept(Some(2));
    set_cannot_tell(true);
    let err = ring.submission().submit().unwrap_err();
    set_accept(None);
    set_cannot_tell(false);
    assert_eq!((err.posted, err.unposted.len()), (5, 0));
    drop(err);
    let back = ring.close();
    assert_eq!(
        back.iter()
            .map(|c| (c.user_data(), c.status()))
            .collect::<Vec<_>>(),
        [0, 1, 2]
            .map(|i| (i, WcStatus::Success))
            .into_iter()
            .chain((3..8).map(|i| (i, WcStatus::WrFlushErr)))
            .collect::<Vec<_>>(),
        "every operation comes back once: those accounted for as done, the rest as flushed"
    );
}

/// What the device never took of a post the backend could not account
/// for gets no CQE, its last (signaled) send's included: the ring's
/// teardown marker, posted behind it at once, releases it, so its
/// operations come back from a wait (as flushed), not only at a close
/// that times out on them.
#[test]
fn an_unaccounted_post_comes_back_without_a_close() {
    let p = default_pair();
    let mut ring = misbehaving(&p);
    let remote = p.exposed.remote();
    push_writes(&mut ring, &p.pool, &remote, 0..5);
    set_accept(Some(2));
    set_cannot_tell(true);
    let err = ring.submission().submit().unwrap_err();
    set_accept(None);
    set_cannot_tell(false);
    assert_eq!((err.posted, err.unposted.len()), (5, 0));
    drop(err);
    let back = ring.completion().wait(5).unwrap();
    assert_eq!(
        back.iter()
            .map(|c| (c.user_data(), c.status()))
            .collect::<Vec<_>>(),
        (0..5)
            .map(|i| (i, WcStatus::WrFlushErr))
            .collect::<Vec<_>>()
    );
    assert_eq!(ring.in_flight(), 0);
    let qp = ring.default_qp().unwrap();
    let drained = ring.detach(qp).unwrap();
    assert!(drained.drained, "nothing was left to drain");
}

/// Three writes in one post the backend cannot account for, of which the
/// device takes the first `took`, with the one at `signaled` asking for
/// its own completion; what each came back as once the ring is closed.
fn unaccounted_post_of_three(signaled: u64, took: usize) -> Vec<(u64, WcStatus)> {
    let p = default_pair();
    let mut ring = misbehaving(&p);
    let remote = p.exposed.remote();
    for i in 0..3u64 {
        let target = remote.slice(i * 1024..(i + 1) * 1024).unwrap();
        let write = Write::new(p.pool.take().unwrap(), target).user_data(i);
        let write = if i == signaled {
            write.signaled()
        } else {
            write
        };
        ring.submission().push(write).unwrap();
    }
    set_accept(Some(took));
    set_cannot_tell(true);
    let err = ring.submission().submit().unwrap_err();
    set_accept(None);
    set_cannot_tell(false);
    assert_eq!((err.posted, err.unposted.len()), (3, 0));
    drop(err);
    ring.close()
        .iter()
        .map(|c| (c.user_data(), c.status()))
        .collect()
}

/// The same when the post the backend could not account for starts with
/// a send that asked for its own completion, and nothing before it is
/// outstanding: that completion comes first, and those after it must
/// still not come back as done.
#[test]
fn an_unaccounted_post_whose_first_send_completes_reports_the_rest_flushed() {
    assert_eq!(
        unaccounted_post_of_three(0, 1),
        [
            (0, WcStatus::Success),
            (1, WcStatus::WrFlushErr),
            (2, WcStatus::WrFlushErr)
        ]
    );
}

/// A completion of a send inside a post the backend could not account
/// for proves the device took the post up to that send (a post is taken
/// as a prefix), and RC completes in order: the sends before it without a
/// completion of their own ran, and come back as done. Only what the
/// teardown marker releases may never have been taken.
#[test]
fn an_unaccounted_post_whose_later_send_completes_reports_those_before_it_done() {
    assert_eq!(
        unaccounted_post_of_three(1, 2),
        [
            (0, WcStatus::Success),
            (1, WcStatus::Success),
            (2, WcStatus::WrFlushErr)
        ]
    );
}

/// A partial post whose sync marker the device refuses too: the
/// accepted prefix ended unsignaled, and its owners may wait for it
/// before sending anything more. The ring tries the marker again while
/// it waits, and the prefix comes back.
#[test]
fn a_refused_sync_marker_is_tried_again_while_the_ring_waits() {
    let p = default_pair();
    let mut ring = misbehaving(&p);
    let remote = p.exposed.remote();
    push_writes(&mut ring, &p.pool, &remote, 0..4);
    set_accept(Some(2));
    set_refuse_empty(true);
    let err = ring.submission().submit().unwrap_err();
    set_accept(None);
    assert_eq!((err.posted, err.unposted.len()), (2, 2));
    drop(err);
    // Still refused: the prefix waits.
    assert!(ring.completion().poll().unwrap().is_none());
    // A later send the device refuses whole takes nothing, and leaves the
    // prefix waiting still.
    ring.submission()
        .push(Write::new(p.pool.take().unwrap(), remote.slice(0..1024).unwrap()).user_data(9))
        .unwrap();
    set_accept(Some(0));
    let err = ring.submission().submit().unwrap_err();
    set_accept(None);
    assert_eq!((err.posted, err.unposted.len()), (0, 1));
    drop(err);
    assert!(ring.completion().poll().unwrap().is_none());
    set_refuse_empty(false);
    let done = ring.completion().wait(2).unwrap();
    assert_eq!(
        done.iter()
            .map(|c| (c.user_data(), c.status()))
            .collect::<Vec<_>>(),
        vec![(0, WcStatus::Success), (1, WcStatus::Success)]
    );
    assert_eq!(ring.in_flight(), 0);
}

/// The same on an awaited ring woken by a reactor, which drives only when
/// the completion descriptor is readable: a refused marker raises no
/// event, so the futures of the prefix wait until the reactor's timer
/// ticks the ring, which posts the marker again; its completion raises
/// the event, and a drive completes them.
#[test]
fn a_refused_sync_marker_is_tried_again_by_a_reactor_s_tick() {
    use std::future::Future;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::{Context, Poll, Wake, Waker};
    use std::time::Duration;

    struct Wakes(AtomicUsize);
    impl Wake for Wakes {
        fn wake(self: std::sync::Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    let p = default_pair();
    set_with_channel(true);
    let ring = AsyncRing::new(misbehaving(&p), Wakeup::Reactor).unwrap();
    let events = ring.with_ring(|r| r.cq().completion_events()).unwrap();
    set_with_channel(false);
    let remote = p.exposed.remote();
    let mut writes: Vec<_> = (0..4u64)
        .map(|i| {
            let target = remote.slice(i * 1024..(i + 1) * 1024).unwrap();
            Box::pin(ring.push(Write::new(p.pool.take().unwrap(), target)))
        })
        .collect();
    set_accept(Some(2));
    set_refuse_empty(true);
    let err = ring.submit().unwrap_err();
    set_accept(None);
    set_refuse_empty(false);
    // The two the device did not take go back to their futures.
    assert_eq!(err.posted, 2);
    drop(err);
    let wakes = std::sync::Arc::new(Wakes(AtomicUsize::new(0)));
    let waker = Waker::from(wakes.clone());
    let mut cx = Context::from_waker(&waker);
    for w in &mut writes[..2] {
        assert!(w.as_mut().poll(&mut cx).is_pending());
    }
    for w in &mut writes[2..] {
        assert!(matches!(w.as_mut().poll(&mut cx), Poll::Ready((Err(_), _))));
    }
    // Nothing makes the descriptor readable: the reactor would not drive.
    assert!(!events.wait(Duration::from_millis(50)).unwrap());
    assert_eq!(wakes.0.load(Ordering::SeqCst), 0);
    ring.tick();
    assert!(events.wait(Duration::from_secs(5)).unwrap(), "no event");
    ring.drive().unwrap();
    assert!(wakes.0.load(Ordering::SeqCst) > 0, "not woken");
    for w in &mut writes[..2] {
        match w.as_mut().poll(&mut cx) {
            Poll::Ready((result, _buf)) => assert_eq!(result.unwrap(), 1024),
            Poll::Pending => panic!("still pending"),
        }
    }
}

#[test]
fn forged_and_stale_completions_are_reported_not_trusted() {
    let p = default_pair();
    let mut ring = misbehaving(&p);
    ring.submission()
        .push(
            Write::new(
                p.pool.take().unwrap(),
                p.exposed.remote().slice(0..1024).unwrap(),
            )
            .user_data(1),
        )
        .unwrap();
    ring.submission().submit().unwrap();
    let first = ring.completion().wait(1).unwrap();
    assert_eq!(first[0].user_data(), 1);
    // Nothing is in flight now; forge a CQE for a new op's slot with a bad
    // generation, and one for an index that never existed.
    ring.submission()
        .push(Recv::new(p.pool.take().unwrap()).user_data(2))
        .unwrap();
    ring.submission().submit().unwrap();
    set_forged(vec![
        RawCompletion {
            wr_id: 0xdead_0000_0000_0000,
            ..RawCompletion::default()
        },
        RawCompletion {
            wr_id: 0x0000_0001_0000_ffff,
            ..RawCompletion::default()
        },
    ]);
    let err = ring.completion().poll().unwrap_err();
    assert!(matches!(err, Error::UnknownWrId { .. }), "{err}");
    let err = ring.completion().poll().unwrap_err();
    assert!(matches!(err, Error::UnknownWrId { .. }), "{err}");
    assert_eq!(ring.stats().unknown_cqes, 2);
    assert_eq!(ring.in_flight(), 1, "the real receive is untouched");
}

#[test]
fn a_device_that_cannot_drain_leaks_instead_of_freeing() {
    let p = pair(Progress::Manual, QpConfig::default(), RingConfig::default());
    let mut ring = misbehaving(&p);
    for i in 0..3u64 {
        let target = p.exposed.remote().slice(i * 1024..(i + 1) * 1024).unwrap();
        ring.submission()
            .push(Write::new(p.pool.take().unwrap(), target))
            .unwrap();
    }
    ring.submission().submit().unwrap();
    set_wedged(true);
    drop(ring);
    set_wedged(false);
    assert_eq!(
        p.pool.available(),
        p.pool.capacity() - 3,
        "in-flight buffers leaked, not freed"
    );
}

#[test]
fn a_failed_wait_loses_nothing() {
    let mut p = default_pair();
    p.b.submission()
        .push(Recv::new(p.pool.take().unwrap()).user_data(4))
        .unwrap();
    p.b.submission().submit().unwrap();
    p.a.submission()
        .push(Send::new(p.pool.take().unwrap().slice(0..8)))
        .unwrap();
    p.a.submission().submit().unwrap();
    let err = p.b.completion().wait(2).unwrap_err();
    assert!(
        matches!(
            err,
            Error::WaitUnsatisfiable {
                wanted: 2,
                possible: 1
            }
        ),
        "{err}"
    );
    let got = p.b.completion().wait(1).unwrap();
    assert_eq!((got[0].user_data(), got[0].byte_len()), (4, 8));
}

/// A soft queue pair that claims less than it has (`claim` maps its caps
/// to what it says): the ring must refuse what goes past the claim.
struct Claiming(SoftQp, fn(QpCaps) -> QpCaps);

// SAFETY: everything but `caps` is the soft queue pair's, and every claim
// made here only takes something away (atomics, a smaller limit), which
// makes the ring refuse more, never post what the device cannot take.
unsafe impl QueuePair for Claiming {
    type Cq = SoftCq;
    type Srq = SoftSrq;
    fn caps(&self) -> QpCaps {
        (self.1)(self.0.caps())
    }
    unsafe fn post_send(&mut self, wrs: &[SendWr], sges: &[Sge]) -> Result<(), PostError> {
        // SAFETY: the caller's contract is passed through unchanged.
        unsafe { self.0.post_send(wrs, sges) }
    }
    unsafe fn post_recv(&mut self, wrs: &[RecvWr], sges: &[Sge]) -> Result<(), PostError> {
        // SAFETY: the caller's contract is passed through unchanged.
        unsafe { self.0.post_recv(wrs, sges) }
    }
    fn set_error(&mut self) -> Result<(), Error> {
        self.0.set_error()
    }
    fn take_cq(&mut self) -> Option<SoftCq> {
        self.0.take_cq()
    }
}

/// A device without atomics: the push is refused, the word handed back.
#[test]
fn atomics_are_refused_on_a_device_without_them() {
    let p = default_pair();
    let (qp, _peer) = p
        .dev
        .connected_pair(&p.pd, &p.pd, QpConfig::default())
        .unwrap();
    let no_atomics = |caps| QpCaps {
        atomics: false,
        ..caps
    };
    let mut ring = Ring::new(Claiming(qp, no_atomics), RingConfig::default());
    let word = RegisteredBuf::new(&p.pd, Box::new(5u64))
        .unwrap()
        .word(0)
        .unwrap();
    let remote = p.exposed.remote().word(0).unwrap();
    let refused = ring
        .submission()
        .push(rdma_ring::op::FetchAdd::new(word, remote, 1))
        .unwrap_err();
    assert!(matches!(
        refused.error(),
        Error::Unsupported(OpKind::FetchAdd)
    ));
    assert_eq!(refused.into_value().into_buf().get(), 5);
}

/// A port that carries smaller messages than RC's 2^31 bytes, and a device
/// whose RDMA READs take fewer scatter/gather elements than its other
/// sends: what goes past either is refused at push, its buffers handed
/// back, rather than posted to fail and put the queue pair in error. On
/// both rings.
#[test]
fn a_port_s_message_limit_and_a_device_s_read_elements_are_checked_at_push() {
    use rdma_ring::fixed::{FixedBufs, FixedRing, FixedRingConfig, ReadFixed, WriteFixed};
    let limited = |caps| QpCaps {
        max_message: 1024,
        max_read_sge: 1,
        ..caps
    };
    let p = default_pair();
    let remote = p.exposed.remote();
    let config = QpConfig {
        max_send_sge: 2,
        ..QpConfig::default()
    };
    let (qp, _peer) = p.dev.connected_pair(&p.pd, &p.pd, config).unwrap();
    let mut ring = Ring::new(Claiming(qp, limited), RingConfig::default());
    let buf = |n: usize| RegisteredBuf::new(&p.pd, vec![1u8; n]).unwrap();
    let refused = ring
        .submission()
        .push(Write::new(buf(1025), remote.slice(0..1025).unwrap()))
        .unwrap_err();
    assert!(
        matches!(
            refused.error(),
            Error::TooLong {
                len: 1025,
                max: 1024
            }
        ),
        "{}",
        refused.error()
    );
    assert_eq!(refused.into_value().into_buf().len(), 1025);
    let refused = ring
        .submission()
        .push(Read::scatter(
            [buf(8), buf(8)],
            remote.slice(0..16).unwrap(),
        ))
        .unwrap_err();
    assert!(matches!(
        refused.error(),
        Error::TooManySges { count: 2, max: 1 }
    ));
    // A gathered WRITE may still use both elements, and a receive may be
    // larger than any message (only what arrives is written).
    ring.submission()
        .push(Write::gather([buf(512), buf(512)], remote.slice(0..1024).unwrap()).user_data(1))
        .unwrap();
    ring.submission()
        .push(Read::new(buf(1024), remote.slice(0..1024).unwrap()).user_data(2))
        .unwrap();
    ring.submission().push(Recv::new(buf(4096))).unwrap();
    ring.submit().unwrap();
    let done = ring.completion().wait(2).unwrap();
    assert!(done.iter().all(|c| c.status().is_success()));

    // The fixed-buffer ring: slots of 4 KiB, messages of at most 1 KiB.
    let (mut qp, _peer) = p.dev.connected_pair(&p.pd, &p.pd, config).unwrap();
    let cq = qp.take_cq().unwrap();
    let bufs = FixedBufs::new(&p.pd, 2, 4096).unwrap();
    let mut fixed: FixedRing<Claiming> = FixedRing::new(cq, bufs, FixedRingConfig::default());
    let conn = fixed
        .attach(Claiming(qp, limited))
        .unwrap_or_else(|_| panic!("attach"));
    let slot = fixed.take_buf().unwrap();
    let (error, op) = fixed
        .push(
            conn,
            WriteFixed::new(slot, 2048, remote.slice(0..2048).unwrap()),
        )
        .unwrap_err()
        .into_parts();
    assert!(
        matches!(
            error,
            Error::TooLong {
                len: 2048,
                max: 1024
            }
        ),
        "{error}"
    );
    let (error, op) = fixed
        .push(
            conn,
            ReadFixed::new(op.into_buf(), 8192, remote.slice(0..8192).unwrap()),
        )
        .unwrap_err()
        .into_parts();
    assert!(matches!(error, Error::OutOfBounds { .. }), "{error}");
    fixed
        .push(
            conn,
            ReadFixed::new(op.into_buf(), 1024, remote.slice(0..1024).unwrap()),
        )
        .unwrap();
    fixed.submit().unwrap();
    assert!(fixed.wait(1).unwrap()[0].status().is_success());
}

/// A long wait sleeps on the completion channel (after a few polls) and
/// still returns as soon as the completion arrives from another thread.
#[test]
fn a_long_wait_sleeps_on_the_channel_and_wakes_for_the_completion() {
    let mut p = pair(
        Progress::Auto,
        QpConfig::default(),
        RingConfig {
            spin_polls: 10,
            ..RingConfig::default()
        },
    );
    p.b.submission()
        .push(Recv::new(p.pool.take().unwrap()).user_data(3))
        .unwrap();
    p.b.submission().submit().unwrap();
    let (mut a, pool) = (p.a, p.pool.clone());
    let sender = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(150));
        a.submission()
            .push(Send::new(pool.take().unwrap().slice(0..5)))
            .unwrap();
        a.submission().submit().unwrap();
        a.completion().wait(1).unwrap();
    });
    let got = p.b.completion().wait(1).unwrap();
    assert_eq!((got[0].user_data(), got[0].byte_len()), (3, 5));
    // It slept on the channel rather than poll for 150 ms.
    assert!(p.b.stats().channel_sleeps >= 1, "{:?}", p.b.stats());
    sender.join().unwrap();
}

/// A ring whose completion queue failed gives up its drains at once:
/// nothing more can come back from the queue, so what is out is leaked,
/// not waited for (the drain timeout here is two minutes).
#[test]
fn a_drain_on_a_failed_completion_queue_gives_up_at_once() {
    use std::time::{Duration, Instant};
    let dev = SoftDevice::new();
    let pd = dev.alloc_pd();
    let config = RingConfig {
        drain_timeout: Duration::from_secs(120),
        ..RingConfig::default()
    };
    let mut ring: Ring<SoftQp> = Ring::with_cq(dev.create_cq(8).unwrap(), config);
    let qa = dev
        .create_qp_on(&pd, ring.cq(), None, QpConfig::default())
        .unwrap();
    let qb = dev.create_qp(&pd, QpConfig::default()).unwrap();
    dev.connect(&qa, &qb).unwrap();
    let control = qa.control();
    let handle = ring.attach(qa).unwrap();
    for _ in 0..2 {
        let buf = RegisteredBuf::new(&pd, vec![0u8; 8]).unwrap();
        ring.submission_on(handle).push(Recv::new(buf)).unwrap();
    }
    ring.submit().unwrap();
    // The ring's completion queue overruns: the receives are gone with no
    // completion.
    control.overrun_cq();
    let started = Instant::now();
    let detached = ring.detach(handle).unwrap();
    assert!(!detached.drained, "the receives cannot come back");
    assert!(ring.failure().is_some());
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "waited {:?} for a queue that gives nothing back",
        started.elapsed()
    );
    drop(qb);
}

/// A wait for more than can ever come fails at once, however many it
/// asks for: it does not first ask the allocator for room for them all.
#[test]
fn a_wait_for_more_than_can_come_fails_without_allocating_for_it() {
    let mut p = default_pair();
    p.a.submission()
        .push(Recv::new(p.pool.take().unwrap()))
        .unwrap();
    p.a.submission().submit().unwrap();
    for min in [2, 1 << 50, usize::MAX] {
        let err = p.a.completion().wait(min).unwrap_err();
        assert!(
            matches!(err, Error::WaitUnsatisfiable { wanted, possible: 1 } if wanted == min),
            "{err}"
        );
    }
}

/// Work pushed before the ring failed (its completion queue overran) is
/// not posted: it would complete where nothing is read any more, and be
/// leaked. The submit hands it back, buffers intact.
#[test]
fn a_failed_ring_hands_back_what_was_pushed_before_instead_of_posting_it() {
    let mut p = default_pair();
    // A receive in flight, so the ring looks at its completion queue.
    p.a.submission()
        .push(Recv::new(p.pool.take().unwrap()).user_data(4))
        .unwrap();
    p.a.submission().submit().unwrap();
    let target = p.exposed.remote().slice(0..1024).unwrap();
    p.a.submission()
        .push(Write::new(p.pool.take().unwrap(), target).user_data(5))
        .unwrap();
    p.a.qp().control().overrun_cq();
    let err = p.a.completion().poll().unwrap_err();
    assert!(matches!(err, Error::CqOverrun), "{err}");
    let refused = p.a.submission().submit().unwrap_err();
    assert!(
        matches!(refused.error, Error::RingFailed(_)),
        "{}",
        refused.error
    );
    assert_eq!(refused.posted, 0);
    assert_eq!(
        refused
            .unposted
            .iter()
            .map(|u| (u.user_data, u.bufs[0].len()))
            .collect::<Vec<_>>(),
        vec![(5, 1024)]
    );
    // The receive the device holds stays the ring's.
    assert_eq!(p.a.in_flight(), 1);
}

/// A detach whose drain runs out of time still takes everything the
/// device gave back by then, more than one poll batch of it: with no time
/// at all, a soft queue pair flushes its 40 receives at once, and they all
/// come back flushed, none leaked.
#[test]
fn a_detach_out_of_time_takes_every_completion_already_queued() {
    let dev = SoftDevice::new();
    let pd = dev.alloc_pd();
    let (qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    let config = RingConfig {
        drain_timeout: std::time::Duration::ZERO,
        poll_batch: 32,
        ..RingConfig::default()
    };
    let mut ring = Ring::new(qp, config);
    let handle = ring.default_qp().unwrap();
    for _ in 0..40 {
        let buf = RegisteredBuf::new(&pd, vec![0u8; 8]).unwrap();
        ring.submission().push(Recv::new(buf)).unwrap();
    }
    ring.submit().unwrap();
    let detached = ring.detach(handle).unwrap();
    assert!(detached.drained, "everything came back");
    let back = ring.completion().wait(40).unwrap();
    assert_eq!(back.len(), 40);
    assert!(back.iter().all(|c| c.status() == WcStatus::WrFlushErr));
    assert_eq!(ring.stats().unknown_cqes, 0);
}

/// A queue pair whose receives the device refuses posts none of the sends
/// pushed with them (a reply to one must not find its receive refused):
/// both come back unposted, receives first, and go out when pushed
/// again.
#[test]
fn refused_receives_hold_back_the_sends_pushed_with_them() {
    let dev = SoftDevice::new();
    let pd = dev.alloc_pd();
    let (qp, peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    let control = qp.control();
    let mut ring = Ring::new(qp, RingConfig::default());
    let mut peer = Ring::new(peer, RingConfig::default());
    let buf = |byte: u8| RegisteredBuf::new(&pd, vec![byte; 8]).unwrap();
    peer.submission()
        .push(Recv::new(buf(0)).user_data(9))
        .unwrap();
    peer.submit().unwrap();
    control.refuse_recv_posts(1);
    ring.submission()
        .push(Recv::new(buf(0)).user_data(1))
        .unwrap();
    ring.submission()
        .push(Send::new(buf(5)).user_data(2))
        .unwrap();
    let refused = ring.submit().unwrap_err();
    assert_eq!(refused.posted, 0);
    let back: Vec<u64> = refused.unposted.iter().map(|op| op.user_data).collect();
    assert_eq!(back, [1, 2]);
    assert_eq!(control.counters().send_posts, 0, "no send went");
    assert_eq!(ring.in_flight(), 0);
    drop(refused);
    ring.submission()
        .push(Recv::new(buf(0)).user_data(1))
        .unwrap();
    ring.submission()
        .push(Send::new(buf(5)).user_data(2))
        .unwrap();
    assert_eq!(ring.submit().unwrap(), 2);
    let done = ring.completion().wait(1).unwrap();
    assert_eq!(
        (done[0].user_data(), done[0].status()),
        (2, WcStatus::Success)
    );
    let got = peer.completion().wait(1).unwrap();
    assert_eq!(got[0].user_data(), 9);
}
