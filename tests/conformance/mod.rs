//! The conformance suite: the same checks on every backend. A [`Fabric`]
//! makes connected queue pairs; `conformance_tests!` turns every check
//! into a test for one fabric.

#![allow(dead_code)]

use std::time::{Duration, Instant};

pub mod fixed;
pub mod many;

use rdma_ring::backend::{
    AsyncEventSource, ProtectionDomain, QpConfig, QueuePair, SrqConfig, WcStatus,
};
use rdma_ring::buf::{BaseBuf, BufferPool, ExposedBuf, RegisteredBuf, RemoteAccess, RemoteSlice};
use rdma_ring::future::{AsyncRing, Wakeup};
use rdma_ring::op::{CompareSwap, FetchAdd, OpKind, Read, Recv, Send, SendImm, Write, WriteImm};
use rdma_ring::ring::{Completion, Ring, RingConfig};
use rdma_ring::Error;

/// The completion queue type of a fabric's queue pairs.
pub type CqOf<F> = <<F as Fabric>::Qp as QueuePair>::Cq;
/// The shared receive queue type of a fabric's queue pairs.
pub type SrqOf<F> = <<F as Fabric>::Qp as QueuePair>::Srq;

/// A backend under test: a protection domain, connected RC pairs (each
/// with a completion queue of its own, or the first on a shared one),
/// completion and shared receive queues, and the device's events.
pub trait Fabric {
    type Qp: QueuePair + std::marker::Send + 'static;
    type Pd: ProtectionDomain;
    type Events: AsyncEventSource + 'static;
    fn pd(&self) -> &Self::Pd;
    fn pair(&self, config: QpConfig) -> (Self::Qp, Self::Qp);
    fn cq(&self, entries: u32) -> CqOf<Self>;
    fn srq(&self, config: SrqConfig) -> SrqOf<Self>;
    /// A queue pair on `cq` (taking receives from `srq`), connected to a
    /// new peer with a completion queue of its own.
    fn pair_on(
        &self,
        cq: &CqOf<Self>,
        srq: Option<&SrqOf<Self>>,
        config: QpConfig,
    ) -> (Self::Qp, Self::Qp);
    /// A queue pair on `cq` (taking receives from `srq`), not connected;
    /// the backend's error if it refuses one.
    fn qp_on(
        &self,
        cq: &CqOf<Self>,
        srq: Option<&SrqOf<Self>>,
        config: QpConfig,
    ) -> Result<Self::Qp, rdma_ring::Error>;
    fn events(&self) -> Self::Events;
}

fn config() -> QpConfig {
    QpConfig {
        max_send_wr: 128,
        max_recv_wr: 64,
        ..QpConfig::default()
    }
}

pub fn ring_config() -> RingConfig {
    RingConfig {
        wait_timeout: Duration::from_secs(30),
        ..RingConfig::default()
    }
}

fn rings<F: Fabric>(f: &F, config: QpConfig) -> (Ring<F::Qp>, Ring<F::Qp>) {
    let (a, b) = f.pair(config);
    (Ring::new(a, ring_config()), Ring::new(b, ring_config()))
}

fn submit<Q: QueuePair>(ring: &mut Ring<Q>) -> usize {
    ring.submission()
        .submit()
        .unwrap_or_else(|e| panic!("submit: {e}"))
}

fn wait<Q: QueuePair>(ring: &mut Ring<Q>, n: usize) -> Vec<Completion> {
    ring.completion()
        .wait(n)
        .unwrap_or_else(|e| panic!("waiting for {n}: {e}"))
}

fn exposed<F: Fabric>(f: &F, len: usize, rights: RemoteAccess) -> ExposedBuf<Vec<u8>> {
    ExposedBuf::new(f.pd(), vec![0u8; len], rights).unwrap()
}

/// Every op kind, with its data effect checked.
pub fn every_op_kind<F: Fabric>(f: &F) {
    let (mut a, mut b) = rings(f, config());
    let pool = BufferPool::new(f.pd(), 4096, 16).unwrap();
    let target = exposed(f, 8192, RemoteAccess::READ | RemoteAccess::WRITE);
    let counters = ExposedBuf::new(
        f.pd(),
        vec![7u64, 100].into_boxed_slice(),
        RemoteAccess::ATOMIC,
    )
    .unwrap();
    let remote = target.remote();

    // WRITE then READ back.
    let mut chunk = pool.take().unwrap();
    chunk
        .iter_mut()
        .enumerate()
        .for_each(|(i, b)| *b = (i * 3) as u8);
    a.submission()
        .push(Write::new(chunk, remote.slice(0..4096).unwrap()).user_data(1))
        .unwrap();
    a.submission()
        .push(Read::new(pool.take().unwrap(), remote.slice(0..4096).unwrap()).user_data(2))
        .unwrap();
    submit(&mut a);
    let done = wait(&mut a, 2);
    assert_eq!(
        done.iter()
            .map(|c| (c.kind(), c.status()))
            .collect::<Vec<_>>(),
        [
            (OpKind::Write, WcStatus::Success),
            (OpKind::Read, WcStatus::Success)
        ]
    );
    assert!(done[1]
        .buf()
        .iter()
        .enumerate()
        .all(|(i, &b)| b == (i * 3) as u8));
    drop(done);

    // SEND, SEND with immediate, WRITE with immediate into posted receives.
    for i in 0..3 {
        b.submission()
            .push(Recv::new(pool.take().unwrap()).user_data(10 + i))
            .unwrap();
    }
    submit(&mut b);
    let msg = |text: &[u8]| RegisteredBuf::new(f.pd(), text.to_vec()).unwrap();
    a.submission().push(Send::new(msg(b"plain send"))).unwrap();
    a.submission()
        .push(SendImm::new(msg(b"send with imm"), 0xabcd))
        .unwrap();
    let mut payload = pool.take().unwrap().slice(0..100);
    payload.fill(0xee);
    a.submission()
        .push(WriteImm::new(
            payload,
            remote.slice(4096..4196).unwrap(),
            0x1234,
        ))
        .unwrap();
    submit(&mut a);
    assert!(wait(&mut a, 3).iter().all(|c| c.status().is_success()));
    let got = wait(&mut b, 3);
    assert_eq!(
        (got[0].user_data(), got[0].byte_len(), got[0].imm()),
        (10, 10, None)
    );
    assert_eq!(&got[0].buf()[..10], b"plain send");
    assert_eq!((got[1].byte_len(), got[1].imm()), (13, Some(0xabcd)));
    assert_eq!(&got[1].buf()[..13], b"send with imm");
    assert_eq!((got[2].byte_len(), got[2].imm()), (100, Some(0x1234)));
    assert_eq!(
        got.iter().map(|c| c.is_write_imm()).collect::<Vec<_>>(),
        [false, false, true],
        "only the WRITE with immediate is reported as one"
    );
    drop(got);

    // Both atomics.
    let word = || {
        RegisteredBuf::new(f.pd(), Box::new(0u64))
            .unwrap()
            .word(0)
            .unwrap()
    };
    let words = counters.remote();
    a.submission()
        .push(CompareSwap::new(word(), words.word(0).unwrap(), 7, 70))
        .unwrap();
    a.submission()
        .push(CompareSwap::new(word(), words.word(0).unwrap(), 7, 99))
        .unwrap();
    a.submission()
        .push(FetchAdd::new(word(), words.word(8).unwrap(), 5))
        .unwrap();
    submit(&mut a);
    let olds: Vec<u64> = wait(&mut a, 3)
        .into_iter()
        .map(|c| {
            assert!(c.status().is_success(), "{:?}", c.status());
            u64::from_ne_bytes(c.buf()[..8].try_into().unwrap())
        })
        .collect();
    assert_eq!(olds, [7, 70, 100], "CAS hit, CAS miss, FAA");
    drop((a, b));
    assert_eq!(&*counters.into_inner().unwrap(), &[70, 105]);
    let memory = target.into_inner().unwrap();
    assert!(memory[..4096]
        .iter()
        .enumerate()
        .all(|(i, &b)| b == (i * 3) as u8));
    assert!(memory[4096..4196].iter().all(|&b| b == 0xee));
}

/// 64 work requests posted with one post, selectively signaled.
pub fn batch_of_64_with_one_doorbell<F: Fabric>(f: &F) {
    let (mut a, _b) = rings(f, config());
    let pool = BufferPool::new(f.pd(), 256, 64).unwrap();
    let target = exposed(f, 64 * 256, RemoteAccess::WRITE);
    let remote = target.remote();
    for i in 0..64u64 {
        let mut chunk = pool.take().unwrap();
        chunk.fill(i as u8);
        a.submission()
            .push(Write::new(chunk, remote.slice(i * 256..(i + 1) * 256).unwrap()).user_data(i))
            .unwrap();
    }
    assert_eq!(submit(&mut a), 64);
    assert_eq!(a.stats().doorbells, 1, "one post for 64 WRs");
    let done = wait(&mut a, 64);
    assert_eq!(
        done.iter().map(|c| c.user_data()).collect::<Vec<_>>(),
        (0..64).collect::<Vec<_>>()
    );
    assert!(done.iter().all(|c| c.status().is_success()));
    assert!(
        a.stats().signaled < 64,
        "selective signaling: {} CQEs asked for",
        a.stats().signaled
    );
    assert_eq!(a.stats().implicit, 64 - a.stats().signaled);
    drop((done, a));
    let memory = target.into_inner().unwrap();
    assert!((0..64).all(|i| memory[i * 256..(i + 1) * 256].iter().all(|&b| b == i as u8)));
}

/// A wrong rkey: remote access error, buffer back, later ops flushed.
pub fn wrong_rkey_fails_and_flushes<F: Fabric>(f: &F) {
    let (mut a, _b) = rings(f, config());
    let target = exposed(f, 4096, RemoteAccess::WRITE);
    let good = target.remote();
    let forged = RemoteSlice::new(
        good.addr(),
        64,
        good.rkey() ^ 0x0101_0000,
        RemoteAccess::WRITE,
    );
    let pool = BufferPool::new(f.pd(), 64, 8).unwrap();
    a.submission()
        .push(Write::new(pool.take().unwrap(), good.slice(0..64).unwrap()).user_data(0))
        .unwrap();
    a.submission()
        .push(
            Write::new(pool.take().unwrap(), forged)
                .user_data(1)
                .signaled(),
        )
        .unwrap();
    for i in 2..6 {
        a.submission()
            .push(Write::new(pool.take().unwrap(), good.slice(0..64).unwrap()).user_data(i))
            .unwrap();
    }
    submit(&mut a);
    let done = wait(&mut a, 6);
    let statuses: Vec<_> = done.iter().map(|c| (c.user_data(), c.status())).collect();
    assert_eq!(statuses[0], (0, WcStatus::Success));
    assert_eq!(statuses[1], (1, WcStatus::RemAccessErr));
    assert!(
        statuses[2..]
            .iter()
            .all(|(_, s)| *s == WcStatus::WrFlushErr),
        "{statuses:?}"
    );
    assert!(matches!(
        a.submission().push(Write::new(pool.take().unwrap(), good.slice(0..64).unwrap())),
        Err(r) if matches!(r.error(), Error::QpInError(_))
    ));
    drop(done);
    assert_eq!(pool.available(), 8, "every buffer came back");
}

/// A send with no receive posted fails after the RNR retries.
pub fn rnr_without_receive<F: Fabric>(f: &F) {
    let config = QpConfig {
        rnr_retry: 1,
        ..config()
    };
    let (mut a, _b) = rings(f, config);
    let buf = RegisteredBuf::new(f.pd(), vec![1u8; 32]).unwrap();
    a.submission().push(Send::new(buf).user_data(5)).unwrap();
    submit(&mut a);
    let done = poll_until(&mut a, 1, Duration::from_secs(30));
    assert_eq!(
        (done[0].user_data(), done[0].status()),
        (5, WcStatus::RnrRetryExcErr)
    );
}

/// A write with immediate to a peer with no receive posted is Receiver
/// Not Ready even when its rkey is wrong: the responder looks for the
/// receive the immediate needs before it checks the key (as rxe does).
pub fn write_imm_without_receive_is_rnr_before_its_rkey_is_checked<F: Fabric>(f: &F) {
    let config = QpConfig {
        rnr_retry: 1,
        ..config()
    };
    let (mut a, _b) = rings(f, config);
    let target = exposed(f, 4096, RemoteAccess::WRITE);
    let good = target.remote();
    let forged = RemoteSlice::new(
        good.addr(),
        32,
        good.rkey() ^ 0x0101_0000,
        RemoteAccess::WRITE,
    );
    let buf = RegisteredBuf::new(f.pd(), vec![1u8; 32]).unwrap();
    a.submission()
        .push(WriteImm::new(buf, forged, 7).user_data(5))
        .unwrap();
    submit(&mut a);
    let done = poll_until(&mut a, 1, Duration::from_secs(30));
    assert_eq!(
        (done[0].user_data(), done[0].status()),
        (5, WcStatus::RnrRetryExcErr)
    );
}

/// Polls (progressing the soft device in any mode) until `n` completions.
fn poll_until<Q: QueuePair>(ring: &mut Ring<Q>, n: usize, limit: Duration) -> Vec<Completion> {
    let start = Instant::now();
    let mut out = Vec::new();
    while out.len() < n {
        ring.completion().reap(&mut out).unwrap();
        assert!(
            start.elapsed() < limit,
            "only {} of {n} completions in {limit:?}",
            out.len()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    out
}

/// The peer disappears mid-flight: every op completes with an error in
/// bounded time.
pub fn vanished_peer_fails_in_bounded_time<F: Fabric>(f: &F) {
    let config = QpConfig {
        retry_cnt: 2,
        ack_timeout: 14,
        ..config()
    };
    let (mut a, b) = rings(f, config);
    let target = exposed(f, 4096, RemoteAccess::READ);
    let pool = BufferPool::new(f.pd(), 64, 8).unwrap();
    drop(b);
    for i in 0..4u64 {
        a.submission()
            .push(Read::new(
                pool.take().unwrap(),
                target.remote().slice(i * 64..(i + 1) * 64).unwrap(),
            ))
            .unwrap();
    }
    submit(&mut a);
    let done = poll_until(&mut a, 4, Duration::from_secs(60));
    assert!(!done[0].status().is_success(), "{:?}", done[0].status());
    assert!(done.iter().all(|c| !c.status().is_success()));
    drop(done);
    assert_eq!(pool.available(), 8);
}

/// Dropping a ring with sends and receives in flight gives every buffer
/// back, after the device flushed them.
pub fn teardown_with_ops_in_flight<F: Fabric>(f: &F) {
    let (mut a, _b) = rings(f, config());
    let pool = BufferPool::new(f.pd(), 256, 48).unwrap();
    let target = exposed(f, 32 * 256, RemoteAccess::WRITE);
    for _ in 0..16 {
        a.submission()
            .push(Recv::new(pool.take().unwrap()))
            .unwrap();
    }
    for i in 0..32u64 {
        a.submission()
            .push(Write::new(
                pool.take().unwrap(),
                target.remote().slice(i * 256..(i + 1) * 256).unwrap(),
            ))
            .unwrap();
    }
    submit(&mut a);
    drop(a);
    assert_eq!(
        pool.available(),
        48,
        "every buffer came back after the drain"
    );
}

/// Awaited operations on the fabric, woken by the notifier thread.
pub fn awaited_ops<F: Fabric>(f: &F) {
    let (qa, qb) = f.pair(config());
    let a = AsyncRing::new(Ring::new(qa, ring_config()), Wakeup::Thread).unwrap();
    let b = AsyncRing::new(Ring::new(qb, ring_config()), Wakeup::Thread).unwrap();
    let target = exposed(f, 4096, RemoteAccess::READ | RemoteAccess::WRITE);
    let pool = BufferPool::new(f.pd(), 1024, 8).unwrap();
    futures::executor::block_on(async {
        let mut chunk = pool.take().unwrap();
        chunk.fill(0x42);
        let (result, _) = a
            .write(chunk, target.remote().slice(0..1024).unwrap())
            .await;
        assert_eq!(result.unwrap(), 1024);
        let (result, back) = a
            .read(
                pool.take().unwrap(),
                target.remote().slice(0..1024).unwrap(),
            )
            .await;
        assert_eq!(result.unwrap(), 1024);
        assert!(back.iter().all(|&b| b == 0x42));
        let recv = b.recv(pool.take().unwrap());
        let send = a.send_imm(RegisteredBuf::new(f.pd(), b"ping".to_vec()).unwrap(), 9);
        let ((sent, _), (got, buf)) = futures::join!(send, recv);
        sent.unwrap();
        let got = got.unwrap();
        assert_eq!((got.len, got.imm), (4, Some(9)));
        assert_eq!(&buf[..4], b"ping");
        // A receive nobody answers, dropped: its chunk waits for the flush.
        drop(b.recv(pool.take().unwrap()));
    });
    drop((a, b));
    assert_eq!(pool.available(), 8);
}

/// A wait that outlasts its polling phase sleeps on the completion channel
/// and wakes for a completion that arrives later, from another thread.
pub fn long_wait_sleeps_and_wakes<F: Fabric>(f: &F) {
    let (qa, qb) = f.pair(config());
    let mut b = Ring::new(
        qb,
        RingConfig {
            spin_polls: 10,
            ..ring_config()
        },
    );
    b.submission()
        .push(Recv::new(RegisteredBuf::new(f.pd(), vec![0u8; 64]).unwrap()).user_data(6))
        .unwrap();
    submit(&mut b);
    let mut a = Ring::new(qa, ring_config());
    let msg = RegisteredBuf::new(f.pd(), b"late".to_vec()).unwrap();
    let sender = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(150));
        a.submission().push(Send::new(msg)).unwrap();
        submit(&mut a);
        wait(&mut a, 1);
    });
    let got = wait(&mut b, 1);
    assert_eq!((got[0].user_data(), got[0].byte_len()), (6, 4));
    // It slept on the channel rather than poll for 150 ms.
    assert!(b.stats().channel_sleeps >= 1, "{:?}", b.stats());
    sender.join().unwrap();
}

/// Generates one `#[test]` per check for the fabric `$make` builds.
#[macro_export]
macro_rules! conformance_tests {
    ($make:expr $(, #[$attr:meta])*) => {
        $(#[$attr])* #[test] fn every_op_kind() { conformance::every_op_kind(&$make) }
        $(#[$attr])* #[test] fn batch_of_64_with_one_doorbell() { conformance::batch_of_64_with_one_doorbell(&$make) }
        $(#[$attr])* #[test] fn wrong_rkey_fails_and_flushes() { conformance::wrong_rkey_fails_and_flushes(&$make) }
        $(#[$attr])* #[test] fn rnr_without_receive() { conformance::rnr_without_receive(&$make) }
        $(#[$attr])* #[test] fn write_imm_without_receive_is_rnr_before_its_rkey_is_checked() { conformance::write_imm_without_receive_is_rnr_before_its_rkey_is_checked(&$make) }
        $(#[$attr])* #[test] fn vanished_peer_fails_in_bounded_time() { conformance::vanished_peer_fails_in_bounded_time(&$make) }
        $(#[$attr])* #[test] fn teardown_with_ops_in_flight() { conformance::teardown_with_ops_in_flight(&$make) }
        $(#[$attr])* #[test] fn awaited_ops() { conformance::awaited_ops(&$make) }
        $(#[$attr])* #[test] fn long_wait_sleeps_and_wakes() { conformance::long_wait_sleeps_and_wakes(&$make) }
        $(#[$attr])* #[test] fn many_queue_pairs_on_one_cq_and_srq() { conformance::many::many_queue_pairs_on_one_cq_and_srq(&$make) }
        $(#[$attr])* #[test] fn scatter_gather_on_the_device() { conformance::many::scatter_gather_on_the_device(&$make) }
        $(#[$attr])* #[test] fn srq_limit_event() { conformance::many::srq_limit_event(&$make) }
        $(#[$attr])* #[test] fn srq_limit_event_refills_at_once() { conformance::many::srq_limit_event_refills_at_once(&$make) }
        $(#[$attr])* #[test] fn a_queue_pair_on_a_destroyed_srq_is_refused() { conformance::many::a_queue_pair_on_a_destroyed_srq_is_refused(&$make) }
        $(#[$attr])* #[test] fn an_ack_timeout_that_never_fires_is_refused() { conformance::many::an_ack_timeout_that_never_fires_is_refused(&$make) }
        $(#[$attr])* #[test] fn detach_with_work_in_flight() { conformance::many::detach_with_work_in_flight(&$make) }
        $(#[$attr])* #[test] fn doorbells_seen_by_the_device() { conformance::many::doorbells_seen_by_the_device(&$make) }
        $(#[$attr])* #[test] fn a_failing_unsignaled_request_gets_its_own_completion() { conformance::many::a_failing_unsignaled_request_gets_its_own_completion(&$make) }
        $(#[$attr])* #[test] fn the_device_refuses_rights_it_was_not_given() { conformance::many::the_device_refuses_rights_it_was_not_given(&$make) }
        $(#[$attr])* #[test] fn a_partial_post_on_the_device() { conformance::many::a_partial_post_on_the_device(&$make) }
        $(#[$attr])* #[test] fn a_shared_cq_is_never_overrun() { conformance::many::a_shared_cq_is_never_overrun(&$make) }
        $(#[$attr])* #[test] fn events_have_a_descriptor() { conformance::many::events_have_a_descriptor(&$make) }
        $(#[$attr])* #[test] fn raw_completions_and_keys_say_only_what_they_should() { conformance::many::raw_completions_and_keys_say_only_what_they_should(&$make) }
        $(#[$attr])* #[test] fn a_receive_element_the_message_never_reaches_is_not_checked() { conformance::many::a_receive_element_the_message_never_reaches_is_not_checked(&$make) }
        $(#[$attr])* #[test] fn a_large_poll_takes_every_queued_completion() { conformance::many::a_large_poll_takes_every_queued_completion(&$make) }
        $(#[$attr])* #[test] fn fixed_every_op_kind() { conformance::fixed::fixed_every_op_kind(&$make) }
        $(#[$attr])* #[test] fn fixed_many_qps_on_one_cq() { conformance::fixed::fixed_many_qps_on_one_cq(&$make) }
        $(#[$attr])* #[test] fn fixed_wrong_rkey_fails_and_flushes() { conformance::fixed::fixed_wrong_rkey_fails_and_flushes(&$make) }
        $(#[$attr])* #[test] fn fixed_detach_and_drop_with_work_in_flight() { conformance::fixed::fixed_detach_and_drop_with_work_in_flight(&$make) }
        $(#[$attr])* #[test] fn fixed_awaited_ops() { conformance::fixed::fixed_awaited_ops(&$make) }
        $(#[$attr])* #[test] fn fixed_failed_queue_pairs_flush_what_they_held() { conformance::fixed::fixed_failed_queue_pairs_flush_what_they_held(&$make) }
        $(#[$attr])* #[test] fn fixed_many_peers_on_one_srq() { conformance::fixed::fixed_many_peers_on_one_srq(&$make) }
        $(#[$attr])* #[test] fn fixed_refilled_srq_awaited() { conformance::fixed::fixed_refilled_srq_awaited(&$make) }
    };
}
