//! Many queue pairs on one ring, on the soft device: identity across queue
//! pairs, credits per queue pair and for the shared completion queue,
//! selective signaling per queue pair, errors that stay on their queue
//! pair, detach and teardown, shared receive queues, async events, and
//! scatter/gather lists.

use rdma_ring::backend::soft::{Progress, QpControl, SoftCq, SoftDevice, SoftPd, SoftQp, SoftSrq};
use rdma_ring::backend::{
    AsyncEvent, CompletionQueue, CqId, PostError, QpCaps, QpConfig, QueuePair, RawCompletion,
    RecvWr, SendWr, Sge, SrqConfig, WcStatus,
};
use rdma_ring::buf::{BaseBuf, BufferPool, ExposedBuf, RegisteredBuf, RemoteAccess, SgList};
use rdma_ring::op::{Read, Recv, Send, SendImm, Write};
use rdma_ring::ring::{Completion, QpHandle, Ring, RingConfig, SrqHandle, SrqRefill};
use rdma_ring::Error;

mod peer_watch;
use peer_watch::{PeerAnswer, Watched};

fn config() -> QpConfig {
    QpConfig {
        max_send_wr: 16,
        max_recv_wr: 16,
        ..QpConfig::default()
    }
}

/// A server ring on one completion queue, `n` queue pairs attached, each
/// connected to a client queue pair with a ring of its own.
struct Star {
    dev: SoftDevice,
    pd: SoftPd,
    server: Ring<SoftQp>,
    handles: Vec<QpHandle>,
    controls: Vec<QpControl>,
    clients: Vec<Ring<SoftQp>>,
    pool: BufferPool,
    exposed: ExposedBuf<Vec<u8>>,
    srq: Option<SrqHandle>,
}

fn star(progress: Progress, n: usize, cq_entries: u32, srq: Option<SrqConfig>) -> Star {
    star_with(progress, n, cq_entries, srq, RingConfig::default())
}

fn star_with(
    progress: Progress,
    n: usize,
    cq_entries: u32,
    srq: Option<SrqConfig>,
    ring_config: RingConfig,
) -> Star {
    let dev = SoftDevice::with_progress(progress);
    let pd = dev.alloc_pd();
    let mut server = Ring::with_cq(dev.create_cq(cq_entries).unwrap(), ring_config);
    let srq = srq.map(|c| server.add_srq(dev.create_srq(&pd, c).unwrap()).unwrap());
    let mut handles = Vec::new();
    let mut controls = Vec::new();
    let mut clients = Vec::new();
    for _ in 0..n {
        let qp = dev
            .create_qp_on(&pd, server.cq(), srq.and_then(|s| server.srq(s)), config())
            .unwrap();
        let client = dev.create_qp(&pd, config()).unwrap();
        dev.connect(&qp, &client).unwrap();
        controls.push(qp.control());
        handles.push(server.attach(qp).unwrap());
        clients.push(Ring::new(client, ring_config));
    }
    let pool = BufferPool::new(&pd, 256, 512).unwrap();
    let exposed = ExposedBuf::new(&pd, vec![0u8; 64 * 1024], RemoteAccess::all()).unwrap();
    Star {
        dev,
        pd,
        server,
        handles,
        controls,
        clients,
        pool,
        exposed,
        srq,
    }
}

fn reap<Q: QueuePair>(ring: &mut Ring<Q>) -> Vec<Completion> {
    let mut out = Vec::new();
    ring.completion().reap(&mut out).unwrap();
    out
}

/// Completions name their queue pair, and a submit rings one doorbell per
/// queue pair with work — counted by the ring and seen by the device.
#[test]
fn one_doorbell_per_queue_pair_and_completions_name_theirs() {
    let mut s = star(Progress::Auto, 4, 256, None);
    for (i, &h) in s.handles.iter().enumerate().take(3) {
        for j in 0..5u64 {
            let target = s.exposed.remote().slice(j * 256..(j + 1) * 256).unwrap();
            s.server
                .submission_on(h)
                .push(Write::new(s.pool.take().unwrap(), target).user_data(i as u64))
                .unwrap();
        }
    }
    assert_eq!(s.server.submit().unwrap(), 15);
    assert_eq!(s.server.stats().doorbells, 3, "three queue pairs had work");
    for (i, control) in s.controls.iter().enumerate() {
        let expected = u64::from(i < 3);
        assert_eq!(control.counters().send_posts, expected, "device saw qp {i}");
        assert_eq!(s.server.qp_stats(s.handles[i]).unwrap().doorbells, expected);
    }
    let done = s.server.completion().wait(15).unwrap();
    for c in &done {
        assert_eq!(c.qp(), Some(s.handles[c.user_data() as usize]));
        assert!(c.status().is_success());
    }
}

/// A queue pair on a shared completion queue that reports a made-up
/// completion next (`rewrite`), to test that the ring checks what it
/// names, or reports the device's next one as flushed (`flush_next`), or
/// gives a queue pair another number (`renumber`, with
/// `OnSoft::renumbered`).
struct Rewriting {
    inner: SoftCq,
    rewrite: std::sync::Arc<std::sync::Mutex<Option<(u64, u32)>>>,
    flush_next: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// Every completion naming the first number names the second.
    renumber: std::sync::Arc<std::sync::Mutex<Option<(u32, u32)>>>,
}

// SAFETY: reports the inner queue's completions; a rewritten one names the
// wrong queue pair, which the ring must refuse (the test's point): it never
// releases a buffer on such a report.
unsafe impl CompletionQueue for Rewriting {
    fn id(&self) -> CqId {
        self.inner.id()
    }
    fn entries(&self) -> u32 {
        self.inner.entries()
    }
    fn poll(&mut self, out: &mut [RawCompletion]) -> Result<usize, Error> {
        if let Some((wr_id, qp_num)) = self.rewrite.lock().unwrap().take() {
            out[0] = RawCompletion {
                wr_id,
                qp_num,
                ..RawCompletion::default()
            };
            return Ok(1);
        }
        let n = self.inner.poll(out)?;
        if let Some((from, to)) = *self.renumber.lock().unwrap() {
            for c in out[..n].iter_mut().filter(|c| c.qp_num == from) {
                c.qp_num = to;
            }
        }
        if n > 0
            && self
                .flush_next
                .swap(false, std::sync::atomic::Ordering::Relaxed)
        {
            out[0] = RawCompletion {
                status: WcStatus::WrFlushErr,
                byte_len: 0,
                imm: None,
                by_write_imm: false,
                ..out[0]
            };
        }
        Ok(n)
    }
}

/// A soft queue pair whose completion queue type is `C` and shared
/// receive queue type `S` (test wrappers of the soft ones).
struct OnSoft<C, S>(
    SoftQp,
    Option<u32>,
    std::marker::PhantomData<fn() -> (C, S)>,
);

impl<C, S> OnSoft<C, S> {
    fn new(qp: SoftQp) -> Self {
        OnSoft(qp, None, std::marker::PhantomData)
    }

    /// The queue pair, saying its number is `qpn` (its completions must be
    /// renumbered to match).
    fn renumbered(qp: SoftQp, qpn: u32) -> Self {
        OnSoft(qp, Some(qpn), std::marker::PhantomData)
    }
}

// SAFETY: everything is the soft queue pair's; its completions reach the
// wrapping `C` (made over its queue by the test), its receives come from
// the soft queue a wrapping `S` holds.
unsafe impl<C, S> QueuePair for OnSoft<C, S>
where
    C: CompletionQueue + std::marker::Send,
    S: rdma_ring::backend::SharedReceiveQueue + std::marker::Send,
{
    type Cq = C;
    type Srq = S;
    fn caps(&self) -> QpCaps {
        let caps = self.0.caps();
        QpCaps {
            qp_num: self.1.unwrap_or(caps.qp_num),
            ..caps
        }
    }
    unsafe fn post_send(&mut self, wrs: &[SendWr], sges: &[Sge]) -> Result<(), PostError> {
        // SAFETY: passed through.
        unsafe { self.0.post_send(wrs, sges) }
    }
    unsafe fn post_recv(&mut self, wrs: &[RecvWr], sges: &[Sge]) -> Result<(), PostError> {
        // SAFETY: passed through.
        unsafe { self.0.post_recv(wrs, sges) }
    }
    fn set_error(&mut self) -> Result<(), Error> {
        self.0.set_error()
    }
    fn take_cq(&mut self) -> Option<C> {
        None
    }
}

/// The queue pair type for a `Rewriting` queue.
type OnRewriting = OnSoft<Rewriting, SoftSrq>;

/// A completion that names queue pair A with the `wr_id` of an operation
/// posted on queue pair B never releases B's operation; nor does one that
/// names a detached queue pair.
#[test]
fn a_completion_of_one_queue_pair_never_releases_another_s_operation() {
    let dev = SoftDevice::with_progress(Progress::Manual);
    let pd = dev.alloc_pd();
    let rewrite = std::sync::Arc::new(std::sync::Mutex::new(None));
    let inner = dev.create_cq(64).unwrap();
    let mut ring = Ring::with_cq(
        Rewriting {
            inner,
            rewrite: rewrite.clone(),
            flush_next: Default::default(),
            renumber: Default::default(),
        },
        RingConfig::default(),
    );
    let make = |ring: &mut Ring<OnRewriting>| {
        let qp = dev
            .create_qp_on(&pd, &ring.cq().inner, None, config())
            .unwrap();
        let peer = dev.create_qp(&pd, config()).unwrap();
        dev.connect(&qp, &peer).unwrap();
        let num = qp.qpn();
        (ring.attach(OnRewriting::new(qp)).unwrap(), num, peer)
    };
    let (a, a_num, _pa) = make(&mut ring);
    let (b, _b_num, _pb) = make(&mut ring);
    let buf = RegisteredBuf::new(&pd, vec![0u8; 32]).unwrap();
    ring.submission_on(b)
        .push(Recv::new(buf).user_data(7))
        .unwrap();
    ring.submit().unwrap();
    // Find B's receive's wr_id through a flush of a twin ring? Simpler: it
    // is the only operation, in slot 0, generation 0.
    let b_recv_wr_id = 0;
    *rewrite.lock().unwrap() = Some((b_recv_wr_id, a_num));
    let err = ring.completion().poll().unwrap_err();
    assert!(matches!(err, Error::UnknownWrId { .. }), "{err}");
    assert_eq!(ring.stats().unknown_cqes, 1);
    assert_eq!(ring.in_flight(), 1, "B's receive is still held");

    // A detached queue pair's number: reported, not acted on.
    let detached = ring.detach(a).unwrap();
    assert!(detached.drained);
    *rewrite.lock().unwrap() = Some((b_recv_wr_id, a_num));
    assert!(ring.completion().poll().is_err());
    assert_eq!(ring.in_flight(), 1);
    let back = ring.close();
    assert_eq!(back.len(), 1);
    assert_eq!((back[0].user_data(), back[0].qp()), (7, Some(b)));
}

/// The soft device, a protection domain, and a ring on a `Rewriting`
/// queue with a shared receive queue; the device runs work when told.
struct RewritingSrq {
    dev: SoftDevice,
    pd: SoftPd,
    ring: Ring<OnRewriting>,
    srq: SrqHandle,
    flush_next: std::sync::Arc<std::sync::atomic::AtomicBool>,
    renumber: std::sync::Arc<std::sync::Mutex<Option<(u32, u32)>>>,
}

impl RewritingSrq {
    fn new() -> Self {
        let dev = SoftDevice::with_progress(Progress::Manual);
        let pd = dev.alloc_pd();
        let flush_next = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let renumber = std::sync::Arc::new(std::sync::Mutex::new(None));
        let inner = dev.create_cq(64).unwrap();
        let mut ring: Ring<OnRewriting> = Ring::with_cq(
            Rewriting {
                inner,
                rewrite: Default::default(),
                flush_next: flush_next.clone(),
                renumber: renumber.clone(),
            },
            RingConfig::default(),
        );
        let srq = ring
            .add_srq(dev.create_srq(&pd, srq_config()).unwrap())
            .unwrap();
        RewritingSrq {
            dev,
            pd,
            ring,
            srq,
            flush_next,
            renumber,
        }
    }

    /// A queue pair on the queue, connected to a peer.
    fn qp(&self) -> (SoftQp, SoftQp) {
        let on = (self.ring.cq(), self.ring.srq(self.srq));
        let qp = self
            .dev
            .create_qp_on(&self.pd, &on.0.inner, on.1, config())
            .unwrap();
        let peer = self.dev.create_qp(&self.pd, config()).unwrap();
        self.dev.connect(&qp, &peer).unwrap();
        (qp, peer)
    }

    /// A receive of the queue, taken by a message from `peer` and
    /// reported flushed: what comes back.
    fn flushed_receive(&mut self, peer: SoftQp) -> Completion {
        let buf = RegisteredBuf::new(&self.pd, vec![0u8; 32]).unwrap();
        self.ring
            .srq_submission(self.srq)
            .push(Recv::new(buf).user_data(7))
            .unwrap();
        self.ring.submit().unwrap();
        let mut client = Ring::new(peer, RingConfig::default());
        let msg = RegisteredBuf::new(&self.pd, vec![2u8; 8]).unwrap();
        client.submission().push(Send::new(msg)).unwrap();
        client.submit().unwrap();
        self.dev.progress();
        self.flush_next
            .store(true, std::sync::atomic::Ordering::Relaxed);
        let back = self.ring.completion().poll().unwrap().expect("the flush");
        assert_eq!((back.user_data(), back.status()), (7, WcStatus::WrFlushErr));
        back
    }

    /// Whether a SEND pushed to `qp` is taken; the refusal's error if not.
    fn send_on(&mut self, qp: QpHandle) -> Result<(), String> {
        let send = RegisteredBuf::new(&self.pd, vec![1u8; 8]).unwrap();
        match self.ring.submission_on(qp).push(Send::new(send)) {
            Ok(_) => Ok(()),
            Err(refused) => Err(format!("{:?}", refused.error())),
        }
    }
}

/// A flushed shared receive names the queue pair that took it, which is
/// in error from then on (a device flushes only a queue pair's in error):
/// the ring learns of the failure even without watching events.
#[test]
fn a_flushed_shared_receive_fails_the_queue_pair_it_names() {
    let mut s = RewritingSrq::new();
    let (qp, peer) = s.qp();
    let b = s.ring.attach(OnRewriting::new(qp)).unwrap();
    assert_eq!(s.flushed_receive(peer).qp(), Some(b));
    let refused = s.send_on(b).unwrap_err();
    assert!(refused.contains("QpInError(WrFlushErr)"), "{refused}");
}

/// But a queue pair that took over the number of one detached from the
/// same queue (a device reuses numbers) may be named by a late flush of
/// the detached one's: with no error of its own known, such a flush names
/// no queue pair and fails none; the queue pair takes work on.
#[test]
fn a_late_flush_of_a_reused_number_fails_no_queue_pair() {
    let mut s = RewritingSrq::new();
    let (qp, _peer) = s.qp();
    let old_num = qp.qpn();
    let a = s.ring.attach(OnRewriting::new(qp)).unwrap();
    assert!(s.ring.detach(a).unwrap().drained);
    // The next queue pair gets the detached one's number.
    let (qp, peer) = s.qp();
    *s.renumber.lock().unwrap() = Some((qp.qpn(), old_num));
    let b = s.ring.attach(OnRewriting::renumbered(qp, old_num)).unwrap();
    assert_eq!(s.flushed_receive(peer).qp(), None);
    s.send_on(b).expect("the queue pair takes work on");
    s.ring.submit().unwrap();
}

/// A fixed ring on a `Rewriting` queue with a shared receive queue, and
/// the rewriting's switches.
struct FixedRewritingSrq {
    dev: SoftDevice,
    pd: SoftPd,
    ring: rdma_ring::fixed::FixedRing<OnRewriting>,
    srq: rdma_ring::fixed::FixedSrq,
    flush_next: std::sync::Arc<std::sync::atomic::AtomicBool>,
    renumber: std::sync::Arc<std::sync::Mutex<Option<(u32, u32)>>>,
}

impl FixedRewritingSrq {
    fn new() -> Self {
        use rdma_ring::fixed::{FixedBufs, FixedRing, FixedRingConfig};
        let dev = SoftDevice::with_progress(Progress::Manual);
        let pd = dev.alloc_pd();
        let flush_next = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let renumber = std::sync::Arc::new(std::sync::Mutex::new(None));
        let cq = Rewriting {
            inner: dev.create_cq(64).unwrap(),
            rewrite: Default::default(),
            flush_next: flush_next.clone(),
            renumber: renumber.clone(),
        };
        let mut ring = FixedRing::new(
            cq,
            FixedBufs::new(&pd, 8, 64).unwrap(),
            FixedRingConfig::default(),
        );
        let srq = ring
            .add_srq(dev.create_srq(&pd, srq_config()).unwrap())
            .unwrap_or_else(|_| panic!("add_srq"));
        FixedRewritingSrq {
            dev,
            pd,
            ring,
            srq,
            flush_next,
            renumber,
        }
    }

    /// A queue pair on the queue, connected to a peer.
    fn qp(&self) -> (SoftQp, SoftQp) {
        let qp = self
            .dev
            .create_qp_on(
                &self.pd,
                &self.ring.cq().inner,
                self.ring.srq(self.srq),
                config(),
            )
            .unwrap();
        let peer = self.dev.create_qp(&self.pd, config()).unwrap();
        self.dev.connect(&qp, &peer).unwrap();
        (qp, peer)
    }

    fn attach(&mut self, qp: OnRewriting) -> rdma_ring::fixed::FixedQp {
        self.ring.attach(qp).unwrap_or_else(|_| panic!("attach"))
    }

    /// A receive of the queue, taken by a message from `peer` and
    /// reported flushed: what comes back.
    fn flushed_receive(&mut self, peer: SoftQp) -> rdma_ring::fixed::FixedCompletion {
        let slot = self.ring.take_buf().unwrap();
        self.ring
            .push_srq(
                self.srq,
                rdma_ring::fixed::RecvFixed::new(slot).user_data(7),
            )
            .unwrap_or_else(|_| panic!("push_srq"));
        self.ring.submit().unwrap();
        let mut client = Ring::new(peer, RingConfig::default());
        let msg = RegisteredBuf::new(&self.pd, vec![2u8; 8]).unwrap();
        client.submission().push(Send::new(msg)).unwrap();
        client.submit().unwrap();
        self.dev.progress();
        self.flush_next
            .store(true, std::sync::atomic::Ordering::Relaxed);
        let back = self.ring.wait(1).unwrap().pop().unwrap();
        assert_eq!((back.user_data(), back.status()), (7, WcStatus::WrFlushErr));
        back
    }
}

/// The fixed ring does the same: a flushed shared receive names the
/// queue pair that took it, which is in error from then on; but a flush
/// naming a number that a queue pair detached from the same queue had
/// names no queue pair, and fails none.
#[test]
fn on_the_fixed_ring_a_flush_fails_its_queue_pair_unless_its_number_was_reused() {
    let mut s = FixedRewritingSrq::new();
    let (qp, peer) = s.qp();
    let a = s.attach(OnRewriting::new(qp));
    assert_eq!(s.flushed_receive(peer).qp(), a);
    assert_eq!(s.ring.qp_error(a).unwrap(), Some(WcStatus::WrFlushErr));

    let mut s = FixedRewritingSrq::new();
    let (qp, _old_peer) = s.qp();
    let old_num = qp.qpn();
    let a = s.attach(OnRewriting::new(qp));
    s.ring.detach(a).unwrap();
    // The next queue pair gets the detached one's number.
    let (qp, peer) = s.qp();
    *s.renumber.lock().unwrap() = Some((qp.qpn(), old_num));
    let b = s.attach(OnRewriting::renumbered(qp, old_num));
    let back = s.flushed_receive(peer);
    assert_ne!(back.qp(), b, "it names no queue pair");
    assert!(s.ring.qp_error(back.qp()).is_err());
    assert_eq!(s.ring.qp_error(b).unwrap(), None, "and fails none");
}

/// A queue pair whose detach heard the device say it took its last
/// receive leaves no late flushes behind: one that takes over its number
/// is failed by a flush naming it, as any other.
#[test]
fn a_number_reused_after_the_last_receive_is_not_suspected() {
    let mut s = RewritingSrq::new();
    s.ring.watch_events(s.dev.async_events().unwrap());
    let (qp, _peer) = s.qp();
    let old_num = qp.qpn();
    let a = s.ring.attach(OnRewriting::new(qp)).unwrap();
    assert!(s.ring.detach(a).unwrap().drained);
    assert!(
        std::iter::from_fn(|| s.ring.next_event())
            .any(|e| e == AsyncEvent::LastWqeReached { qp_num: old_num }),
        "the detach heard the last receive"
    );
    let (qp, peer) = s.qp();
    *s.renumber.lock().unwrap() = Some((qp.qpn(), old_num));
    let b = s.ring.attach(OnRewriting::renumbered(qp, old_num)).unwrap();
    assert_eq!(s.flushed_receive(peer).qp(), Some(b));
    let refused = s.send_on(b).unwrap_err();
    assert!(refused.contains("QpInError(WrFlushErr)"), "{refused}");
}

/// One queue pair's full send queue does not stop another's pushes; the
/// shared completion queue's budget covers them all.
#[test]
fn credits_per_queue_pair_and_for_the_shared_completion_queue() {
    let mut s = star(Progress::Manual, 3, 40, None);
    let (a, b, c) = (s.handles[0], s.handles[1], s.handles[2]);
    let target = s.exposed.remote().slice(0..256).unwrap();
    // Queue pair a: 16 deep, one slot kept for its teardown marker.
    for _ in 0..15 {
        s.server
            .submission_on(a)
            .push(Write::new(s.pool.take().unwrap(), target))
            .unwrap();
    }
    let refused = s
        .server
        .submission_on(a)
        .push(Write::new(s.pool.take().unwrap(), target))
        .unwrap_err();
    assert!(
        matches!(refused.error(), Error::SendQueueFull { .. }),
        "{}",
        refused.error()
    );
    // b still takes work, until the completion queue (40 entries, 3 kept
    // for markers) could not report it all.
    let mut pushed_b = 0;
    let refused = loop {
        match s
            .server
            .submission_on(b)
            .push(Write::new(s.pool.take().unwrap(), target))
        {
            Ok(()) => pushed_b += 1,
            Err(r) => break r,
        }
    };
    assert_eq!(pushed_b, 15, "b's own limit first");
    assert!(matches!(refused.error(), Error::SendQueueFull { .. }));
    let mut pushed_c = 0;
    let refused = loop {
        match s
            .server
            .submission_on(c)
            .push(Recv::new(s.pool.take().unwrap()))
        {
            Ok(()) => pushed_c += 1,
            Err(r) => break r,
        }
    };
    assert_eq!(
        15 + 15 + pushed_c,
        40 - 3,
        "the CQ budget, less three markers"
    );
    assert!(
        matches!(refused.error(), Error::CompletionQueueFull { .. }),
        "{}",
        refused.error()
    );
    drop(refused);
    s.server.submit().unwrap();
    s.dev.progress();
    s.dev.progress();
    let done = s.server.completion().wait(30).unwrap();
    assert_eq!(done.len(), 30);
}

/// An unsignaled operation of queue pair A is never released by a signaled
/// completion of queue pair B; A's own signaled completion releases it.
#[test]
fn implicit_completion_follows_each_queue_pair_s_own_order() {
    let ring_config = RingConfig {
        signal_interval: 64,
        ..RingConfig::default()
    };
    let mut s = star_with(Progress::Manual, 2, 128, None, ring_config);
    let (a, b) = (s.handles[0], s.handles[1]);
    let target = s.exposed.remote().slice(0..256).unwrap();
    for i in 0..3u64 {
        s.server
            .submission_on(a)
            .push(Write::new(s.pool.take().unwrap(), target).user_data(i))
            .unwrap();
    }
    s.server
        .submission_on(b)
        .push(Write::new(s.pool.take().unwrap(), target).user_data(10))
        .unwrap();
    s.server.submit().unwrap();
    // Only b runs: its one (signaled) completion arrives.
    assert!(s.controls[1].step());
    let done = reap(&mut s.server);
    assert_eq!(done.iter().map(|c| c.user_data()).collect::<Vec<_>>(), [10]);
    assert_eq!(s.server.in_flight(), 3, "a's operations are still a's");
    // a's first two run: nothing is released (they are unsignaled).
    assert!(s.controls[0].step());
    assert!(s.controls[0].step());
    assert!(reap(&mut s.server).is_empty());
    assert!(s.controls[0].step());
    let done = reap(&mut s.server);
    assert_eq!(
        done.iter().map(|c| c.user_data()).collect::<Vec<_>>(),
        [0, 1, 2]
    );
    assert_eq!(s.server.stats().implicit, 2);
}

/// An error on one queue pair flushes that one only; the others keep
/// running.
#[test]
fn an_error_flushes_only_its_own_queue_pair() {
    let mut s = star(Progress::Auto, 2, 256, None);
    let (a, b) = (s.handles[0], s.handles[1]);
    let target = s.exposed.remote().slice(0..256).unwrap();
    s.controls[0].fail_nth(2, WcStatus::RemOpErr);
    for i in 0..4u64 {
        s.server
            .submission_on(a)
            .push(Write::new(s.pool.take().unwrap(), target).user_data(i))
            .unwrap();
    }
    s.server.submit().unwrap();
    let done = s.server.completion().wait(4).unwrap();
    let statuses: Vec<_> = done.iter().map(|c| c.status()).collect();
    assert_eq!(
        statuses,
        [
            WcStatus::Success,
            WcStatus::RemOpErr,
            WcStatus::WrFlushErr,
            WcStatus::WrFlushErr
        ]
    );
    assert_eq!(s.server.qp_error(a), Some(WcStatus::RemOpErr));
    let refused = s
        .server
        .submission_on(a)
        .push(Write::new(s.pool.take().unwrap(), target))
        .unwrap_err();
    assert!(matches!(refused.error(), Error::QpInError(_)));
    drop(refused);
    // b is untouched.
    assert_eq!(s.server.qp_error(b), None);
    s.server
        .submission_on(b)
        .push(Write::new(s.pool.take().unwrap(), target).user_data(9))
        .unwrap();
    s.server.submit().unwrap();
    let done = s.server.completion().wait(1).unwrap();
    assert_eq!(
        (done[0].user_data(), done[0].status()),
        (9, WcStatus::Success)
    );
}

/// Detaching a queue pair with work in flight drains only its flushed
/// completions (the other queue pair's completions still arrive), then
/// releases its buffers; its handle is refused afterwards.
#[test]
fn detach_drains_only_its_own_work() {
    let mut s = star(Progress::Manual, 2, 256, None);
    let (a, b) = (s.handles[0], s.handles[1]);
    let target = s.exposed.remote().slice(0..256).unwrap();
    for i in 0..4u64 {
        s.server
            .submission_on(a)
            .push(Recv::new(s.pool.take().unwrap()).user_data(i))
            .unwrap();
        s.server
            .submission_on(a)
            .push(Write::new(s.pool.take().unwrap(), target).user_data(10 + i))
            .unwrap();
    }
    s.server
        .submission_on(b)
        .push(Write::new(s.pool.take().unwrap(), target).user_data(100))
        .unwrap();
    s.server.submit().unwrap();
    assert!(s.controls[1].step());
    let before = s.pool.available();
    let detached = s.server.detach(a).unwrap();
    assert!(detached.drained);
    let done = reap(&mut s.server);
    assert_eq!(done.len(), 9, "a's eight flushed, b's one done");
    for c in &done {
        if c.user_data() == 100 {
            assert_eq!((c.status(), c.qp()), (WcStatus::Success, Some(b)));
        } else {
            assert_eq!((c.status(), c.qp()), (WcStatus::WrFlushErr, Some(a)));
        }
    }
    drop(done);
    assert_eq!(s.pool.available(), before + 9);
    let refused = s
        .server
        .submission_on(a)
        .push(Recv::new(s.pool.take().unwrap()))
        .unwrap_err();
    assert!(matches!(refused.error(), Error::NotAttached(_)));
    assert!(matches!(s.server.detach(a), Err(Error::NotAttached(_))));
    assert_eq!(s.server.qps(), vec![b]);
}

/// A queue pair that refuses to move to error (allowed: then it is never
/// reported drained).
struct Wedged(SoftQp);
// SAFETY: the soft queue pair's, except that it refuses `set_error`
// (allowed: then it is never reported drained).
unsafe impl QueuePair for Wedged {
    type Cq = SoftCq;
    type Srq = SoftSrq;
    fn caps(&self) -> QpCaps {
        self.0.caps()
    }
    unsafe fn post_send(&mut self, wrs: &[SendWr], sges: &[Sge]) -> Result<(), PostError> {
        // SAFETY: passed through.
        unsafe { self.0.post_send(wrs, sges) }
    }
    unsafe fn post_recv(&mut self, wrs: &[RecvWr], sges: &[Sge]) -> Result<(), PostError> {
        // SAFETY: passed through.
        unsafe { self.0.post_recv(wrs, sges) }
    }
    fn set_error(&mut self) -> Result<(), Error> {
        Err(Error::Soft("wedged"))
    }
    fn take_cq(&mut self) -> Option<SoftCq> {
        self.0.take_cq()
    }
}

/// A ring over one `Wedged` queue pair (manual progress), its handle and
/// its connected peer.
fn wedged_ring() -> (SoftDevice, SoftPd, Ring<Wedged>, QpHandle, SoftQp) {
    let dev = SoftDevice::with_progress(Progress::Manual);
    let pd = dev.alloc_pd();
    let mut ring: Ring<Wedged> = Ring::with_cq(dev.create_cq(64).unwrap(), RingConfig::default());
    let qp = dev.create_qp_on(&pd, ring.cq(), None, config()).unwrap();
    let peer = dev.create_qp(&pd, config()).unwrap();
    dev.connect(&qp, &peer).unwrap();
    let h = ring.attach(Wedged(qp)).unwrap();
    (dev, pd, ring, h, peer)
}

/// A queue pair that refuses to move to error cannot be drained: detach
/// leaks its in-flight buffers (never frees them) and says so.
#[test]
fn detach_leaks_what_it_cannot_drain() {
    let (_dev, pd, mut ring, h, peer) = wedged_ring();
    let pool = BufferPool::new(&pd, 64, 4).unwrap();
    for _ in 0..3 {
        ring.submission_on(h)
            .push(Recv::new(pool.take().unwrap()))
            .unwrap();
    }
    ring.submit().unwrap();
    let leaked_before = rdma_ring::leak::leaked().buffers;
    let detached = ring.detach(h).unwrap();
    assert!(!detached.drained);
    assert_eq!(pool.available(), 1, "three chunks kept, never freed");
    assert!(rdma_ring::leak::leaked().buffers >= leaked_before + 3);
    drop((detached, ring, peer));
    assert_eq!(pool.available(), 1);
}

/// What such a queue pair's device already gave back is no work in
/// flight: detach hands it back, and leaks nothing of it.
#[test]
fn detach_of_a_queue_pair_that_refuses_error_hands_back_what_completed() {
    let (dev, pd, mut ring, h, peer) = wedged_ring();
    let pool = BufferPool::new(&pd, 64, 4).unwrap();
    let target = ExposedBuf::new(&pd, vec![0u8; 64], RemoteAccess::WRITE).unwrap();
    for i in 0..3 {
        let write = Write::new(pool.take().unwrap(), target.remote()).user_data(i);
        ring.submission_on(h).push(write).unwrap();
    }
    ring.submit().unwrap();
    // The device runs them; their completion waits in the queue, unreaped.
    dev.progress();
    let detached = ring.detach(h).unwrap();
    assert!(!detached.drained, "it refused to move to error");
    let back = ring.completion().wait(3).unwrap();
    assert_eq!(
        back.iter()
            .map(|c| (c.user_data(), c.status()))
            .collect::<Vec<_>>(),
        (0..3).map(|i| (i, WcStatus::Success)).collect::<Vec<_>>()
    );
    drop(back);
    // (The process's leak count is shared with tests running beside this
    // one: the pool says what this ring kept.)
    assert_eq!(pool.available(), 4, "nothing kept");
    drop((detached, ring, peer));
}

/// A queue pair that cannot say whether its peer left (its connection's
/// event channel failed) is failed alone: its work comes back flushed and
/// it takes no more, while the reaps go on and the other queue pair on the
/// ring keeps working.
#[test]
fn a_queue_pair_that_cannot_watch_its_peer_fails_alone() {
    let dev = SoftDevice::new();
    let pd = dev.alloc_pd();
    let mut ring: Ring<Watched> = Ring::with_cq(dev.create_cq(64).unwrap(), RingConfig::default());
    let pool = BufferPool::new(&pd, 64, 8).unwrap();
    let mut handles = Vec::new();
    let mut peers = Vec::new();
    for answer in [PeerAnswer::CannotTell, PeerAnswer::Stayed] {
        let qp = dev.create_qp_on(&pd, ring.cq(), None, config()).unwrap();
        let peer = dev.create_qp(&pd, config()).unwrap();
        dev.connect(&qp, &peer).unwrap();
        handles.push(ring.attach(Watched { qp, answer }).unwrap());
        peers.push(Ring::new(peer, RingConfig::default()));
    }
    let (broken, sound) = (handles[0], handles[1]);
    for (i, &h) in handles.iter().enumerate() {
        ring.submission_on(h)
            .push(Recv::new(pool.take().unwrap()).user_data(i as u64))
            .unwrap();
    }
    ring.submit().unwrap();
    // Idle reaps: now and then one asks a queue pair whether its peer left.
    let mut done = Vec::new();
    for _ in 0..1024 {
        ring.completion().reap(&mut done).unwrap();
        if !done.is_empty() {
            break;
        }
    }
    assert_eq!(done.len(), 1, "the broken queue pair's receive came back");
    assert_eq!(
        (done[0].user_data(), done[0].status()),
        (0, WcStatus::WrFlushErr)
    );
    assert_eq!(ring.qp_error(broken), Some(WcStatus::FatalErr));
    assert_eq!(ring.qp_error(sound), None);
    let refused = ring
        .submission_on(broken)
        .push(Recv::new(pool.take().unwrap()))
        .unwrap_err();
    assert!(matches!(refused.error(), Error::QpInError(_)));
    drop(refused);
    // The other queue pair still receives.
    let message = RegisteredBuf::new(&pd, vec![7u8; 16]).unwrap();
    peers[1].submission().push(Send::new(message)).unwrap();
    peers[1].submit().unwrap();
    let got = ring.completion().wait(1).unwrap();
    assert_eq!(
        (got[0].user_data(), got[0].status(), got[0].byte_len()),
        (1, WcStatus::Success, 16)
    );
}

/// Dropping the ring tears down every queue pair and gives every buffer
/// back.
#[test]
fn dropping_the_ring_tears_down_every_queue_pair() {
    let mut s = star(Progress::Manual, 5, 512, None);
    let target = s.exposed.remote().slice(0..256).unwrap();
    for &h in &s.handles {
        for _ in 0..3 {
            s.server
                .submission_on(h)
                .push(Recv::new(s.pool.take().unwrap()))
                .unwrap();
            s.server
                .submission_on(h)
                .push(Write::new(s.pool.take().unwrap(), target))
                .unwrap();
        }
    }
    s.server.submit().unwrap();
    let pool = s.pool.clone();
    let capacity = pool.capacity();
    assert_eq!(pool.available(), capacity - 30);
    let back = s.server.close();
    assert_eq!(back.len(), 30);
    assert!(back.iter().all(|c| c.status() == WcStatus::WrFlushErr));
    drop(back);
    assert_eq!(pool.available(), capacity);
}

fn srq_config() -> SrqConfig {
    SrqConfig {
        max_wr: 32,
        max_sge: 2,
    }
}

/// Receives of a shared receive queue are consumed by whichever queue pair
/// a message arrives on, and their completions say which.
#[test]
fn a_shared_receive_queue_serves_every_queue_pair() {
    let mut s = star(Progress::Auto, 3, 256, Some(srq_config()));
    let srq = s.srq.unwrap();
    for i in 0..6u64 {
        s.server
            .srq_submission(srq)
            .push(Recv::new(s.pool.take().unwrap()).user_data(i))
            .unwrap();
    }
    s.server.submit().unwrap();
    assert_eq!(s.server.srq_posted(srq), Some(6));
    // A receive cannot go to a queue pair on a shared receive queue.
    let refused = s
        .server
        .submission_on(s.handles[0])
        .push(Recv::new(s.pool.take().unwrap()))
        .unwrap_err();
    assert!(matches!(refused.error(), Error::Incompatible(_)));
    drop(refused);
    for (i, client) in s.clients.iter_mut().enumerate() {
        for j in 0..2u8 {
            let mut msg = s.pool.take().unwrap();
            msg[0] = i as u8;
            msg[1] = j;
            client
                .submission()
                .push(SendImm::new(msg.slice(0..16), i as u32))
                .unwrap();
        }
        client.submit().unwrap();
        assert_eq!(client.completion().wait(2).unwrap().len(), 2);
    }
    let done = s.server.completion().wait(6).unwrap();
    let mut seen = vec![0; 3];
    for c in &done {
        let from = c.imm().unwrap() as usize;
        assert_eq!(c.qp(), Some(s.handles[from]), "the consumer is named");
        assert_eq!(c.srq(), Some(srq));
        assert_eq!(c.buf()[0] as usize, from);
        assert_eq!(c.byte_len(), 16);
        seen[from] += 1;
    }
    assert_eq!(seen, [2, 2, 2]);
    assert_eq!(s.server.srq_posted(srq), Some(0));
}

/// With the shared receive queue empty, a SEND is answered with RNR NAKs
/// until a receive is posted, or until the sender's RNR retries run out.
#[test]
fn an_empty_shared_receive_queue_answers_with_rnr() {
    let mut s = star(Progress::Manual, 1, 64, Some(srq_config()));
    let srq = s.srq.unwrap();
    let msg = s.pool.take().unwrap();
    s.clients[0]
        .submission()
        .push(Send::new(msg.slice(0..8)).user_data(1))
        .unwrap();
    s.clients[0].submit().unwrap();
    s.dev.progress();
    s.dev.progress();
    assert!(reap(&mut s.clients[0]).is_empty(), "waiting on RNR");
    s.server
        .srq_submission(srq)
        .push(Recv::new(s.pool.take().unwrap()).user_data(5))
        .unwrap();
    s.server.submit().unwrap();
    s.dev.progress();
    let sent = s.clients[0].completion().wait(1).unwrap();
    assert_eq!(sent[0].status(), WcStatus::Success);
    let got = s.server.completion().wait(1).unwrap();
    assert_eq!((got[0].user_data(), got[0].byte_len()), (5, 8));
    // Nothing posted this time: the retries (6 by default) run out.
    s.clients[0]
        .submission()
        .push(Send::new(s.pool.take().unwrap().slice(0..8)).user_data(2))
        .unwrap();
    s.clients[0].submit().unwrap();
    for _ in 0..8 {
        s.dev.progress();
    }
    let failed = s.clients[0].completion().wait(1).unwrap();
    assert_eq!(
        (failed[0].user_data(), failed[0].status()),
        (2, WcStatus::RnrRetryExcErr)
    );
}

/// The low-water event fires once when the queue falls below the armed
/// limit, and the pool-backed refill tops the queue up.
#[test]
fn srq_limit_event_and_pool_refill() {
    let mut s = star(Progress::Auto, 2, 256, Some(srq_config()));
    s.server.watch_events(s.dev.async_events().unwrap());
    let srq = s.srq.unwrap();
    for i in 0..4u64 {
        s.server
            .srq_submission(srq)
            .push(Recv::new(s.pool.take().unwrap()).user_data(i))
            .unwrap();
    }
    s.server.submit().unwrap();
    s.server.arm_srq_limit(srq, 2).unwrap();
    let send = |client: &mut Ring<SoftQp>, pool: &BufferPool| {
        client
            .submission()
            .push(Send::new(pool.take().unwrap().slice(0..4)))
            .unwrap();
        client.submit().unwrap();
        client.completion().wait(1).unwrap();
    };
    send(&mut s.clients[0], &s.pool);
    send(&mut s.clients[1], &s.pool);
    s.server.poll_events().unwrap();
    assert_eq!(s.server.next_event(), None, "2 left: not below 2");
    send(&mut s.clients[0], &s.pool);
    s.server.completion().wait(3).unwrap();
    s.server.poll_events().unwrap();
    let events: Vec<_> = std::iter::from_fn(|| s.server.next_event()).collect();
    let fired = events
        .iter()
        .filter(|e| matches!(e, AsyncEvent::SrqLimitReached { .. }))
        .count();
    assert_eq!(fired, 1, "{events:?}");

    // Refill from a pool: below 3 posted, top up to 8.
    let refill_pool = BufferPool::new(&s.pd, 64, 16).unwrap();
    s.server
        .set_srq_refill(
            srq,
            Some(SrqRefill {
                pool: refill_pool.clone(),
                low: 3,
                target: 8,
                user_data: 77,
            }),
        )
        .unwrap();
    assert_eq!(s.server.srq_posted(srq), Some(8));
    assert_eq!(refill_pool.available(), 16 - 7);
    let doorbells = s.server.srq_doorbells(srq).unwrap();
    for _ in 0..6 {
        send(&mut s.clients[1], &s.pool);
    }
    let got = s.server.completion().wait(6).unwrap();
    assert!(got.iter().all(|c| c.status().is_success()));
    // The one receive left from before the refill went first (in order),
    // then the pool's.
    assert_eq!(got[0].user_data(), 3);
    assert!(got[1..].iter().all(|c| c.user_data() == 77));
    drop(got);
    s.server.completion().reap(&mut Vec::new()).unwrap();
    assert!(s.server.srq_posted(srq).unwrap() >= 3, "topped up again");
    assert!(s.server.srq_doorbells(srq).unwrap() > doorbells);
}

/// Closing a ring with receives posted to a shared receive queue destroys
/// the queue pairs, then the queue, and only then hands the receives back.
#[test]
fn closing_gives_back_shared_receives_after_destroying_the_queue() {
    let mut s = star(Progress::Auto, 2, 256, Some(srq_config()));
    let srq = s.srq.unwrap();
    for i in 0..5u64 {
        s.server
            .srq_submission(srq)
            .push(Recv::new(s.pool.take().unwrap()).user_data(i))
            .unwrap();
    }
    s.server.submit().unwrap();
    let pool = s.pool.clone();
    let back = s.server.close();
    assert_eq!(back.len(), 5);
    assert!(back
        .iter()
        .all(|c| c.status() == WcStatus::WrFlushErr && c.srq() == Some(srq)));
    drop(back);
    assert_eq!(pool.available(), pool.capacity());
}

/// Detaching a queue pair on a shared receive queue waits for the device to
/// say it will take no more receives (the soft device says so at once), and
/// leaves the shared receives to the other queue pairs.
#[test]
fn detach_on_a_shared_receive_queue_waits_for_last_wqe() {
    let mut s = star(Progress::Auto, 2, 256, Some(srq_config()));
    s.server.watch_events(s.dev.async_events().unwrap());
    let srq = s.srq.unwrap();
    for _ in 0..2 {
        s.server
            .srq_submission(srq)
            .push(Recv::new(s.pool.take().unwrap()))
            .unwrap();
    }
    s.server.submit().unwrap();
    let a = s.handles[0];
    let a_num = s.server.qp_of(a).unwrap().qpn();
    let detached = s.server.detach(a).unwrap();
    assert!(detached.drained);
    let events: Vec<_> = std::iter::from_fn(|| s.server.next_event()).collect();
    assert!(
        events.contains(&AsyncEvent::LastWqeReached { qp_num: a_num }),
        "{events:?}"
    );
    assert_eq!(s.server.srq_posted(srq), Some(2), "still there for b");
    s.clients[1]
        .submission()
        .push(Send::new(s.pool.take().unwrap().slice(0..2)))
        .unwrap();
    s.clients[1].submit().unwrap();
    let got = s.server.completion().wait(1).unwrap();
    assert_eq!(got[0].qp(), Some(s.handles[1]));
}

/// The device's word that a queue pair detached from a shared receive
/// queue took its last receive reaps what is queued while that number
/// still names a receiver (a device may drop a destroyed queue pair's
/// completions, and the count of the receives it took with them). Here
/// the ring does not watch events, so the detach could not wait for it.
#[test]
fn last_wqe_of_a_detached_queue_pair_reaps_what_is_queued() {
    let mut s = star(Progress::Auto, 2, 256, Some(srq_config()));
    let srq = s.srq.unwrap();
    for _ in 0..2 {
        s.server
            .srq_submission(srq)
            .push(Recv::new(s.pool.take().unwrap()))
            .unwrap();
    }
    s.server.submit().unwrap();
    let a = s.handles[0];
    let a_num = s.server.qp_of(a).unwrap().qpn();
    assert!(s.server.detach(a).unwrap().drained);
    s.clients[1]
        .submission()
        .push(Send::new(s.pool.take().unwrap().slice(0..2)))
        .unwrap();
    s.clients[1].submit().unwrap();
    s.clients[1].completion().wait(1).unwrap();
    let cqes = s.server.stats().cqes;
    s.server
        .apply_event(AsyncEvent::LastWqeReached { qp_num: a_num });
    assert_eq!(s.server.stats().cqes, cqes + 1, "the queued receive reaped");
    let got = s.server.completion().poll().unwrap().expect("reaped");
    assert_eq!(got.qp(), Some(s.handles[1]));
}

/// A fatal queue pair event moves that queue pair to error (its work comes
/// back flushed) and leaves the others alone; port events are delivered;
/// a device failure stops the ring.
#[test]
fn async_events_reach_the_ring() {
    let mut s = star(Progress::Manual, 2, 256, None);
    s.server.watch_events(s.dev.async_events().unwrap());
    let (a, b) = (s.handles[0], s.handles[1]);
    for &h in &[a, b] {
        s.server
            .submission_on(h)
            .push(Recv::new(s.pool.take().unwrap()))
            .unwrap();
    }
    s.server.submit().unwrap();
    s.controls[0].inject_fatal();
    s.dev.set_port_active(false);
    s.dev.set_port_active(true);
    assert_eq!(s.server.poll_events().unwrap(), 3);
    let a_num = s.server.qp_of(a).unwrap().qpn();
    assert_eq!(
        std::iter::from_fn(|| s.server.next_event()).collect::<Vec<_>>(),
        [
            AsyncEvent::QpFatal { qp_num: a_num },
            AsyncEvent::PortError { port: 1 },
            AsyncEvent::PortActive { port: 1 },
        ]
    );
    assert_eq!(s.server.qp_error(a), Some(WcStatus::FatalErr));
    let flushed = s.server.completion().wait(1).unwrap();
    assert_eq!(
        (flushed[0].qp(), flushed[0].status()),
        (Some(a), WcStatus::WrFlushErr)
    );
    assert_eq!(s.server.qp_error(b), None);
    assert!(s.server.failure().is_none());

    s.dev.inject_device_fatal();
    s.server.poll_events().unwrap();
    assert!(s.server.failure().is_some());
    let refused = s
        .server
        .submission_on(b)
        .push(Recv::new(s.pool.take().unwrap()))
        .unwrap_err();
    assert!(matches!(refused.error(), Error::RingFailed(_)));
    drop(refused);
    // b's receive came back flushed by the device failure.
    let flushed = s.server.completion().wait(1).unwrap();
    assert_eq!(
        (flushed[0].qp(), flushed[0].status()),
        (Some(b), WcStatus::WrFlushErr)
    );
}

/// Operations with several buffers: gathered WRITE and SEND, scattered
/// READ and receive; every buffer comes back; above `max_sge` the
/// operation is refused and handed back.
#[test]
fn scatter_gather_lists() {
    let dev = SoftDevice::new();
    let pd = dev.alloc_pd();
    let config = QpConfig {
        max_send_sge: 3,
        max_recv_sge: 2,
        ..QpConfig::default()
    };
    let (qa, qb) = dev.connected_pair(&pd, &pd, config).unwrap();
    let (mut a, mut b) = (
        Ring::new(qa, RingConfig::default()),
        Ring::new(qb, RingConfig::default()),
    );
    assert_eq!(a.caps().max_send_sge, 3);
    let target = ExposedBuf::new(&pd, vec![0u8; 64], RemoteAccess::all()).unwrap();
    let buf = |fill: u8, len: usize| RegisteredBuf::new(&pd, vec![fill; len]).unwrap();

    a.submission()
        .push(Write::gather([buf(1, 4), buf(2, 8), buf(3, 4)], target.remote()).user_data(1))
        .unwrap();
    a.submission()
        .push(Read::scatter([buf(0, 10), buf(0, 6)], target.remote()).user_data(2))
        .unwrap();
    a.submission().submit().unwrap();
    let done = a.completion().wait(2).unwrap();
    assert_eq!(done[0].bufs().len(), 3, "all three buffers came back");
    assert_eq!(done[0].byte_len(), 16);
    let read: Vec<u8> = done[1]
        .bufs()
        .iter()
        .flat_map(|b| b.iter().copied())
        .collect();
    assert_eq!(read, [1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3]);
    let [first, second] = done
        .into_iter()
        .nth(1)
        .unwrap()
        .into_bufs()
        .downcast::<SgList<[RegisteredBuf; 2]>>()
        .unwrap()
        .into_inner();
    assert_eq!((first.len(), second.len()), (10, 6));

    // A gathered SEND into a scattered receive: header and body.
    b.submission()
        .push(Recv::scatter([buf(0, 4), buf(0, 32)]).user_data(3))
        .unwrap();
    b.submission().submit().unwrap();
    a.submission()
        .push(Send::gather(vec![buf(9, 4), buf(8, 20)]))
        .unwrap();
    a.submission().submit().unwrap();
    a.completion().wait(1).unwrap();
    let got = b.completion().wait(1).unwrap();
    assert_eq!(got[0].byte_len(), 24);
    assert_eq!(&got[0].bufs()[0][..], &[9; 4]);
    assert_eq!(&got[0].bufs()[1][..20], &[8; 20]);

    // Too many elements, or none: refused, buffers back.
    let refused = a
        .submission()
        .push(Write::gather(
            [buf(1, 1), buf(1, 1), buf(1, 1), buf(1, 1)],
            target.remote(),
        ))
        .unwrap_err();
    assert!(matches!(
        refused.error(),
        Error::TooManySges { count: 4, max: 3 }
    ));
    assert_eq!(refused.into_value().into_buf().into_inner().len(), 4);
    let refused = b
        .submission()
        .push(Recv::new(SgList::new(Vec::<RegisteredBuf>::new())))
        .unwrap_err();
    assert!(matches!(refused.error(), Error::EmptyList));
    drop(target);
}

/// A queue pair from another completion queue, or whose shared receive
/// queue the ring does not hold, is refused with the queue pair back; a
/// handle of another ring is refused.
#[test]
fn attach_refuses_what_does_not_belong() {
    let dev = SoftDevice::new();
    let pd = dev.alloc_pd();
    let mut ring: Ring<SoftQp> = Ring::with_cq(dev.create_cq(64).unwrap(), RingConfig::default());
    let foreign_cq = dev.create_cq(64).unwrap();
    let qp = dev.create_qp_on(&pd, &foreign_cq, None, config()).unwrap();
    let refused = ring.attach(qp).unwrap_err();
    assert!(matches!(refused.error(), Error::Incompatible(_)));
    let srq = dev.create_srq(&pd, srq_config()).unwrap();
    let qp = dev
        .create_qp_on(&pd, ring.cq(), Some(&srq), config())
        .unwrap();
    let refused = ring.attach(qp).unwrap_err();
    assert!(
        refused.error().to_string().contains("add_srq"),
        "{}",
        refused.error()
    );
    let qp = refused.into_value();
    let srq_handle = ring.add_srq(srq).unwrap();
    let handle = ring.attach(qp).unwrap();
    assert_eq!(ring.default_qp(), Some(handle));
    assert!(ring.srq(srq_handle).is_some());

    let (other_qp, _peer) = dev.connected_pair(&pd, &pd, config()).unwrap();
    let mut other = Ring::new(other_qp, RingConfig::default());
    let refused = other
        .submission_on(handle)
        .push(Send::new(RegisteredBuf::new(&pd, vec![1u8]).unwrap()))
        .unwrap_err();
    assert!(matches!(refused.error(), Error::NotAttached(_)));
    assert!(other.qp_of(handle).is_none());
}

/// The futures adapter over one ring with several queue pairs and a shared
/// receive queue: one driver for all.
#[test]
fn awaiting_operations_on_several_queue_pairs() {
    use rdma_ring::future::{AsyncRing, Wakeup};
    let s = star(Progress::Auto, 3, 256, Some(srq_config()));
    let Star {
        dev: _dev,
        server,
        handles,
        clients,
        pool,
        exposed,
        srq,
        ..
    } = s;
    let srq = srq.unwrap();
    let ring = AsyncRing::new(server, Wakeup::Thread).unwrap();
    let clients: Vec<_> = clients
        .into_iter()
        .map(|c| AsyncRing::new(c, Wakeup::Thread).unwrap())
        .collect();
    futures::executor::block_on(async {
        let recvs: Vec<_> = (0..3)
            .map(|_| ring.srq_recv(srq, pool.take().unwrap()))
            .collect();
        let mut sends = Vec::new();
        for (i, client) in clients.iter().enumerate() {
            let mut msg = pool.take().unwrap();
            msg[0] = i as u8;
            sends.push(client.send(msg.slice(0..1)));
        }
        for send in sends {
            send.await.0.unwrap();
        }
        let mut from = Vec::new();
        for recv in recvs {
            let (got, buf) = recv.await;
            let got = got.unwrap();
            assert_eq!(got.qp, Some(handles[buf[0] as usize]));
            from.push(buf[0]);
        }
        from.sort();
        assert_eq!(from, [0, 1, 2]);
        // Each attached queue pair awaits its own WRITEs.
        let writes: Vec<_> = handles
            .iter()
            .enumerate()
            .map(|(i, &h)| {
                let target = exposed
                    .remote()
                    .slice(i as u64 * 256..(i as u64 + 1) * 256)
                    .unwrap();
                ring.qp(h).write(pool.take().unwrap(), target)
            })
            .collect();
        for w in writes {
            assert_eq!(w.await.0.unwrap(), 256);
        }
    });
    drop((ring, clients));
    assert_eq!(pool.available(), pool.capacity());
    drop(exposed);
}

/// A queue pair on a ring's completion queue that the ring never
/// attached, connected to a peer of its own.
struct Stray {
    qp: SoftQp,
    peer: SoftQp,
}

impl Stray {
    fn on(dev: &SoftDevice, pd: &SoftPd, cq: &SoftCq) -> Stray {
        let qp = dev.create_qp_on(pd, cq, None, config()).unwrap();
        let peer = dev.create_qp(pd, config()).unwrap();
        dev.connect(&qp, &peer).unwrap();
        Stray { qp, peer }
    }

    /// Puts one completion naming nothing of the ring's (`wr_id`
    /// 0xdead_beef) into its completion queue.
    fn complete_unknown(&mut self, dev: &SoftDevice) {
        use rdma_ring::backend::{SendFlags, SendOpcode, SgeSpan};
        let empty = SgeSpan { start: 0, len: 0 };
        let mut send = SendWr::new(1, SendOpcode::Send, empty);
        send.flags = SendFlags::SIGNALED;
        // SAFETY: no scatter/gather element: the device touches no memory.
        unsafe {
            self.qp
                .post_recv(
                    &[RecvWr {
                        wr_id: 0xdead_beef,
                        sges: empty,
                    }],
                    &[],
                )
                .unwrap();
            self.peer.post_send(&[send], &[]).unwrap();
        }
        dev.progress();
    }
}

/// Wakes nothing; records that it was woken.
struct WokenFlag(std::sync::atomic::AtomicBool);

impl futures::task::ArcWake for WokenFlag {
    fn wake_by_ref(arc_self: &std::sync::Arc<Self>) {
        arc_self.0.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// A completion that names nothing of the ring's (a stray queue pair's,
/// on the shared completion queue but never attached) is counted, not
/// returned as the drive's error, and the driver goes on past it: every completion behind it, in the same
/// full batch and after, reaches its future, whose task is woken. (A
/// driver that stopped at it left them in the queue, with no event to
/// come for them: their tasks slept for ever.)
#[test]
fn an_unknown_completion_does_not_stop_the_driver_short() {
    use rdma_ring::future::{AsyncRing, Wakeup};
    use std::future::Future;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::task::Context;

    let dev = SoftDevice::with_progress(Progress::Manual);
    let pd = dev.alloc_pd();
    let ring_config = RingConfig {
        poll_batch: 4,
        ..RingConfig::default()
    };
    let mut server = Ring::with_cq(dev.create_cq(64).unwrap(), ring_config);
    let qp = dev.create_qp_on(&pd, server.cq(), None, config()).unwrap();
    let client = dev.create_qp(&pd, config()).unwrap();
    dev.connect(&qp, &client).unwrap();
    let handle = server.attach(qp).unwrap();
    let mut stray = Stray::on(&dev, &pd, server.cq());
    let ring = AsyncRing::new(server, Wakeup::Reactor).unwrap();
    let pool = BufferPool::new(&pd, 64, 16).unwrap();

    let mut recvs: Vec<_> = (0..8)
        .map(|_| ring.qp(handle).op(Recv::new(pool.take().unwrap())))
        .collect();
    let flags: Vec<_> = (0..8)
        .map(|_| Arc::new(WokenFlag(AtomicBool::new(false))))
        .collect();
    for (recv, flag) in recvs.iter_mut().zip(&flags) {
        let waker = futures::task::waker(Arc::clone(flag));
        let polled = std::pin::Pin::new(recv).poll(&mut Context::from_waker(&waker));
        assert!(polled.is_pending());
    }

    // The stray's completion goes into the queue first, then eight of
    // the ring's: two full batches of four and one more.
    stray.complete_unknown(&dev);
    let mut client = Ring::new(client, RingConfig::default());
    let mut sq = client.submission();
    for i in 0..8u8 {
        let mut msg = pool.take().unwrap();
        msg[0] = i;
        sq.push(Send::new(msg.slice(0..1))).unwrap();
    }
    sq.submit().unwrap();
    dev.progress();

    // One drive applies all of them. The stray's completion is counted,
    // not returned: a driver loop that stopped at an error would strand
    // every future behind it.
    assert_eq!(
        ring.drive().unwrap(),
        9,
        "eight of the ring's and the stray's"
    );
    assert_eq!(ring.with_ring(|r| r.stats().unknown_cqes), 1);
    for (i, flag) in flags.iter().enumerate() {
        assert!(
            flag.0.load(Ordering::SeqCst),
            "receive {i}'s task was never woken"
        );
    }
    futures::executor::block_on(async {
        for (i, recv) in recvs.into_iter().enumerate() {
            let (got, buf) = recv.await;
            assert_eq!(got.unwrap(), 1);
            assert_eq!(buf[0], i as u8);
        }
    });
    assert_eq!(ring.with_ring(|r| r.stats().unknown_cqes), 1);
    drop(stray);
}

/// Closing goes past a completion that names nothing of the ring's: the
/// shared receives that messages filled, queued behind it, come back with
/// their messages, not as flushed.
#[test]
fn closing_goes_past_an_unknown_completion_to_the_filled_shared_receives() {
    let dev = SoftDevice::with_progress(Progress::Manual);
    let pd = dev.alloc_pd();
    let ring_config = RingConfig {
        poll_batch: 2,
        ..RingConfig::default()
    };
    let mut server = Ring::with_cq(dev.create_cq(64).unwrap(), ring_config);
    let srq = server
        .add_srq(dev.create_srq(&pd, srq_config()).unwrap())
        .unwrap();
    let qp = dev
        .create_qp_on(&pd, server.cq(), server.srq(srq), config())
        .unwrap();
    let client = dev.create_qp(&pd, config()).unwrap();
    dev.connect(&qp, &client).unwrap();
    server.attach(qp).unwrap();
    let mut stray = Stray::on(&dev, &pd, server.cq());
    let pool = BufferPool::new(&pd, 64, 16).unwrap();
    for i in 0..4u64 {
        server
            .srq_submission(srq)
            .push(Recv::new(pool.take().unwrap()).user_data(i))
            .unwrap();
    }
    server.submit().unwrap();

    stray.complete_unknown(&dev);
    let mut client = Ring::new(client, RingConfig::default());
    let mut sq = client.submission();
    for i in 0..3u8 {
        let mut msg = pool.take().unwrap();
        msg[0] = 10 + i;
        sq.push(Send::new(msg.slice(0..1))).unwrap();
    }
    sq.submit().unwrap();
    dev.progress();

    let mut back = server.close();
    back.sort_by_key(|c| c.user_data());
    let got: Vec<_> = back
        .iter()
        .map(|c| (c.user_data(), c.status(), c.byte_len()))
        .collect();
    assert_eq!(
        got,
        [
            (0, WcStatus::Success, 1),
            (1, WcStatus::Success, 1),
            (2, WcStatus::Success, 1),
            (3, WcStatus::WrFlushErr, 0),
        ]
    );
    drop(stray);
}

/// A shared receive queue that takes `accept` more receives, then refuses
/// the rest of a post, as a device out of room would.
struct Refusing {
    inner: SoftSrq,
    accept: std::sync::Arc<std::sync::Mutex<usize>>,
}

// SAFETY: what it takes goes to the soft queue as posted; what it refuses
// never reaches a device, and the refusal says how many it took.
unsafe impl rdma_ring::backend::SharedReceiveQueue for Refusing {
    fn caps(&self) -> rdma_ring::backend::SrqCaps {
        self.inner.caps()
    }
    unsafe fn post_recv(&mut self, wrs: &[RecvWr], sges: &[Sge]) -> Result<(), PostError> {
        let mut accept = self.accept.lock().unwrap();
        let n = (*accept).min(wrs.len());
        *accept -= n;
        // SAFETY: passed through, for the first `n`.
        unsafe { self.inner.post_recv(&wrs[..n], sges) }?;
        if n < wrs.len() {
            return Err(PostError {
                accepted: n,
                error: Error::PostRejected("the test's queue is out of room"),
            });
        }
        Ok(())
    }
    fn arm_limit(&mut self, limit: u32) -> Result<(), Error> {
        self.inner.arm_limit(limit)
    }
    fn destroy(&mut self) -> Result<(), Error> {
        self.inner.destroy()
    }
}

/// The queue pair type for a `Refusing` shared receive queue.
type OnRefusing = OnSoft<SoftCq, Refusing>;

/// A ring holding a `Refusing` shared receive queue, which takes
/// `accept` receives in all (more once `accept` is raised).
struct RefusingRing {
    _dev: SoftDevice,
    pd: SoftPd,
    ring: Ring<OnRefusing>,
    srq: SrqHandle,
    accept: std::sync::Arc<std::sync::Mutex<usize>>,
}

fn refusing_ring(accept: usize) -> RefusingRing {
    let dev = SoftDevice::new();
    let pd = dev.alloc_pd();
    let accept = std::sync::Arc::new(std::sync::Mutex::new(accept));
    let mut ring: Ring<OnRefusing> =
        Ring::with_cq(dev.create_cq(64).unwrap(), RingConfig::default());
    let srq = ring
        .add_srq(Refusing {
            inner: dev.create_srq(&pd, srq_config()).unwrap(),
            accept: accept.clone(),
        })
        .unwrap();
    RefusingRing {
        _dev: dev,
        pd,
        ring,
        srq,
        accept,
    }
}

/// A refill from `pool`: below 2 posted, up to `target`, tagged 9.
fn refill(pool: &BufferPool, target: usize) -> SrqRefill {
    SrqRefill {
        pool: pool.clone(),
        low: 2,
        target,
        user_data: 9,
    }
}

/// Receives of a refill the device refused come back flushed, naming the
/// shared receive queue they were pushed to, and their chunks go home.
#[test]
fn refused_refill_receives_name_their_shared_receive_queue() {
    let RefusingRing {
        pd, mut ring, srq, ..
    } = refusing_ring(3);
    let refill_pool = BufferPool::new(&pd, 64, 8).unwrap();
    ring.set_srq_refill(srq, Some(refill(&refill_pool, 5)))
        .unwrap();
    assert_eq!(ring.srq_posted(srq), Some(3), "the device took three");
    let mut out = Vec::new();
    ring.completion().reap(&mut out).unwrap();
    let refused: Vec<_> = out
        .iter()
        .map(|c| (c.user_data(), c.status(), c.srq(), c.qp()))
        .collect();
    assert_eq!(
        refused,
        [(9, WcStatus::WrFlushErr, Some(srq), None); 2],
        "the two refused"
    );
    drop(out);
    assert_eq!(refill_pool.available(), 8 - 3);
    drop(ring.close());
    assert_eq!(refill_pool.available(), 8);
}

/// A wait on a ring whose only work is a refill the device refuses: the
/// refill's receives come back flushed from the reap inside the wait, and
/// the wait returns them; it does not say they cannot come.
#[test]
fn a_wait_returns_a_refused_refill_s_receives() {
    let RefusingRing {
        pd, mut ring, srq, ..
    } = refusing_ring(0);
    // The pool is empty when the refill is set (its chunks held here), so
    // the first top-up waits for the reap inside the wait.
    let refill_pool = BufferPool::new(&pd, 64, 4).unwrap();
    let held: Vec<_> = (0..4).map(|_| refill_pool.take().unwrap()).collect();
    ring.set_srq_refill(srq, Some(refill(&refill_pool, 4)))
        .unwrap();
    assert_eq!(ring.in_flight(), 0, "nothing posted");
    drop(held);
    let back = ring.completion().wait(1).unwrap();
    assert_eq!(back.len(), 4);
    assert!(back
        .iter()
        .all(|c| (c.user_data(), c.status()) == (9, WcStatus::WrFlushErr)));
}

/// A refill whose post the device refuses hands its receives back
/// flushed, and tries again at a later reap: once the device takes
/// receives again, the queue is topped up (a server whose queue refused
/// for a while is not left deaf).
#[test]
fn a_refused_refill_tries_again_and_tops_up_once_the_queue_takes_receives() {
    let RefusingRing {
        pd,
        mut ring,
        srq,
        accept,
        ..
    } = refusing_ring(0);
    let refill_pool = BufferPool::new(&pd, 64, 8).unwrap();
    ring.set_srq_refill(srq, Some(refill(&refill_pool, 5)))
        .unwrap();
    let mut out = Vec::new();
    ring.completion().reap(&mut out).unwrap();
    assert!(out
        .iter()
        .all(|c| (c.user_data(), c.status()) == (9, WcStatus::WrFlushErr)));
    assert_eq!(ring.srq_posted(srq), Some(0));
    drop(out);
    *accept.lock().unwrap() = usize::MAX;
    let mut out = Vec::new();
    ring.completion().reap(&mut out).unwrap();
    drop(out);
    assert_eq!(
        ring.srq_posted(srq),
        Some(5),
        "topped up once it takes them"
    );
}

/// A refill's marks are checked: a low-water mark of 0 (it would never
/// run), above the target, or a target deeper than the queue is refused.
#[test]
fn a_refill_s_marks_are_checked() {
    let s = star(Progress::Auto, 1, 256, Some(srq_config()));
    let (mut server, srq) = (s.server, s.srq.unwrap());
    let refill = |low, target| SrqRefill {
        pool: s.pool.clone(),
        low,
        target,
        user_data: 0,
    };
    for (low, target) in [(0, 4), (5, 4), (2, 33)] {
        let err = server
            .set_srq_refill(srq, Some(refill(low, target)))
            .unwrap_err();
        assert!(
            matches!(err, Error::Incompatible(_)),
            "{low} {target}: {err}"
        );
    }
    assert_eq!(server.srq_posted(srq), Some(0), "nothing taken");
    server.set_srq_refill(srq, Some(refill(2, 32))).unwrap();
    assert_eq!(server.srq_posted(srq), Some(32));
}

/// Removing a shared receive queue does not top it up first: the reap that
/// takes its filled receives' completions would, with chunks that came
/// home since, and post them only to flush them.
#[test]
fn removing_a_shared_receive_queue_does_not_refill_it() {
    let mut s = star(Progress::Auto, 1, 256, Some(srq_config()));
    let srq = s.srq.unwrap();
    let refill_pool = BufferPool::new(&s.pd, 64, 5).unwrap();
    s.server
        .set_srq_refill(
            srq,
            Some(SrqRefill {
                pool: refill_pool.clone(),
                low: 2,
                target: 5,
                user_data: 9,
            }),
        )
        .unwrap();
    // Four messages fill four receives; the pool is empty, so the reap
    // that takes them tops nothing up.
    for _ in 0..4 {
        s.clients[0]
            .submission()
            .push(Send::new(s.pool.take().unwrap().slice(0..4)))
            .unwrap();
        s.clients[0].submit().unwrap();
        s.clients[0].completion().wait(1).unwrap();
    }
    let filled = s.server.completion().wait(4).unwrap();
    assert_eq!(s.server.srq_posted(srq), Some(1));
    let detached = s.server.detach(s.handles[0]).unwrap();
    assert!(detached.drained);
    drop(detached);
    // Their chunks go home; then the queue goes.
    drop(filled);
    assert_eq!(refill_pool.available(), 4);
    let doorbells = s.server.stats().doorbells;
    s.server.remove_srq(srq).unwrap();
    assert_eq!(s.server.stats().doorbells, doorbells, "topped up to flush");
    let back = s.server.completion().wait(1).unwrap();
    assert_eq!(back.len(), 1, "the one receive left, flushed");
    drop(back);
    assert_eq!(refill_pool.available(), 5);
}

/// A queue pair made on this ring's completion queue but on another
/// ring's shared receive queue (never attached) consumes the other
/// ring's receive; its completion, naming a `wr_id` this ring also
/// uses, must not hand back this ring's receive, which is still posted.
#[test]
fn a_completion_from_another_ring_s_shared_queue_releases_nothing() {
    let dev = SoftDevice::new();
    let pd = dev.alloc_pd();
    let mut r1: Ring<SoftQp> = Ring::with_cq(dev.create_cq(64).unwrap(), RingConfig::default());
    let mut r2: Ring<SoftQp> = Ring::with_cq(dev.create_cq(64).unwrap(), RingConfig::default());
    let s1 = r1
        .add_srq(dev.create_srq(&pd, srq_config()).unwrap())
        .unwrap();
    let s2 = r2
        .add_srq(dev.create_srq(&pd, srq_config()).unwrap())
        .unwrap();
    let pool = BufferPool::new(&pd, 64, 8).unwrap();
    r1.srq_submission(s1)
        .push(Recv::new(pool.take().unwrap()).user_data(1))
        .unwrap();
    r1.submit().unwrap();
    r2.srq_submission(s2)
        .push(Recv::new(pool.take().unwrap()).user_data(2))
        .unwrap();
    r2.submit().unwrap();

    let rogue = dev
        .create_qp_on(&pd, r1.cq(), r2.srq(s2), config())
        .unwrap();
    let sender = dev.create_qp(&pd, config()).unwrap();
    dev.connect(&rogue, &sender).unwrap();
    let mut sender = Ring::new(sender, RingConfig::default());
    sender
        .submission()
        .push(Send::new(pool.take().unwrap().slice(0..4)))
        .unwrap();
    sender.submit().unwrap();
    assert_eq!(sender.completion().wait(1).unwrap().len(), 1);

    // The rogue's completion lands on r1's queue: reported, not acted on.
    let mut out = Vec::new();
    let reaped = r1.completion().reap(&mut out);
    assert!(
        matches!(reaped, Err(Error::UnknownWrId { .. })),
        "{reaped:?}"
    );
    assert!(out.is_empty(), "r1 handed back a receive still posted");
    assert_eq!(r1.srq_posted(s1), Some(1));
    assert_eq!(r1.srq(s1).unwrap().posted(), 1, "the device still holds it");
    drop(rogue);
}

/// A queue pair made on the ring's shared receive queue and connected
/// before it is attached (as a server does during a handshake) may take
/// receives at once: announced, their completions are applied (naming no
/// queue pair yet), and the queue's count goes down; after the attach
/// they name it.
#[test]
fn receives_taken_before_the_attach_count_once_announced() {
    let dev = SoftDevice::new();
    let pd = dev.alloc_pd();
    let mut ring: Ring<SoftQp> = Ring::with_cq(dev.create_cq(64).unwrap(), RingConfig::default());
    let srq = ring
        .add_srq(dev.create_srq(&pd, srq_config()).unwrap())
        .unwrap();
    let pool = BufferPool::new(&pd, 64, 8).unwrap();
    for i in 0..2u64 {
        ring.srq_submission(srq)
            .push(Recv::new(pool.take().unwrap()).user_data(i))
            .unwrap();
    }
    ring.submit().unwrap();
    let qp = dev
        .create_qp_on(&pd, ring.cq(), ring.srq(srq), config())
        .unwrap();
    ring.expect_on_srq(srq, qp.qpn()).unwrap();
    let client = dev.create_qp(&pd, config()).unwrap();
    dev.connect(&qp, &client).unwrap();
    let mut client = Ring::new(client, RingConfig::default());
    let send = |client: &mut Ring<SoftQp>| {
        client
            .submission()
            .push(Send::new(pool.take().unwrap().slice(0..3)))
            .unwrap();
        client.submit().unwrap();
        client.completion().wait(1).unwrap();
    };
    send(&mut client);
    let early = ring.completion().wait(1).unwrap();
    assert_eq!(
        (early[0].user_data(), early[0].byte_len(), early[0].qp()),
        (0, 3, None)
    );
    assert_eq!(ring.srq_posted(srq), Some(1));
    let handle = ring.attach(qp).unwrap();
    send(&mut client);
    let late = ring.completion().wait(1).unwrap();
    assert_eq!((late[0].user_data(), late[0].qp()), (1, Some(handle)));
    assert_eq!(ring.srq_posted(srq), Some(0));
    let mut other: Ring<SoftQp> = Ring::with_cq(dev.create_cq(8).unwrap(), RingConfig::default());
    let foreign = other
        .add_srq(dev.create_srq(&pd, srq_config()).unwrap())
        .unwrap();
    assert!(
        ring.expect_on_srq(foreign, 1).is_err(),
        "a queue the ring does not hold"
    );
}
