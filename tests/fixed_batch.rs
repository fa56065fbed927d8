//! The fixed ring's batch of pushes (`FixedRing::batch`), its submit of
//! one queue pair (`FixedRing::submit_qp`) and its reap into a closure
//! (`FixedRing::reap_each`): a batch refuses what `push` refuses, with the
//! operation handed back, checks the ring and the queue pair once, and
//! loses nothing however it ends; `submit_qp` posts what `submit` posts
//! for that queue pair, shared receive queues first, and leaves the
//! others'; `reap_each` hands out what `reap` does, and a closure that
//! panics never gets a completion twice. A property test runs the same
//! work both ways and compares.

use std::panic::{catch_unwind, AssertUnwindSafe};

use proptest::prelude::*;
use rdma_ring::backend::soft::{QpControl, SoftDevice, SoftPd, SoftQp};
use rdma_ring::backend::{AsyncEvent, QpConfig, QueuePair, SrqConfig, WcStatus};
use rdma_ring::buf::{ExposedBuf, RemoteAccess};
use rdma_ring::fixed::{
    FixedBuf, FixedBufs, FixedCompletion, FixedQp, FixedRing, FixedRingConfig, ReadFixed,
    RecvFixed, SendFixed, WriteFixed,
};
use rdma_ring::Error;

struct Setup {
    _dev: SoftDevice,
    pd: SoftPd,
    ring: FixedRing<SoftQp>,
    qp: FixedQp,
    control: QpControl,
    peer: SoftQp,
    target: ExposedBuf<Vec<u8>>,
}

fn setup(config: QpConfig, slots: u32, ring_config: FixedRingConfig) -> Setup {
    let dev = SoftDevice::new();
    let pd = dev.alloc_pd();
    let (mut a, peer) = dev.connected_pair(&pd, &pd, config).unwrap();
    let cq = a.take_cq().unwrap();
    let control = a.control();
    let mut ring = FixedRing::new(cq, FixedBufs::new(&pd, slots, 64).unwrap(), ring_config);
    let qp = ring.attach(a).unwrap_or_else(|_| panic!("attach"));
    let target = ExposedBuf::new(
        &pd,
        vec![0u8; 256],
        RemoteAccess::WRITE | RemoteAccess::READ,
    )
    .unwrap();
    Setup {
        _dev: dev,
        pd,
        ring,
        qp,
        control,
        peer,
        target,
    }
}

/// Reaps until `n` completions came, with `reap_each`.
fn reap_each_until(ring: &mut FixedRing<SoftQp>, n: usize) -> Vec<FixedCompletion> {
    let mut got = Vec::new();
    for _ in 0..1000 {
        if got.len() >= n {
            break;
        }
        ring.reap_each(|c| got.push(c)).unwrap();
        std::thread::yield_now();
    }
    assert_eq!(got.len(), n, "completions that came");
    got
}

#[test]
fn a_batch_refuses_what_push_refuses_hands_the_operation_back_and_goes_on() {
    // Four send places, one kept for the drain marker; two receives.
    let config = QpConfig {
        max_send_wr: 4,
        max_recv_wr: 2,
        max_inline_data: 16,
        ..QpConfig::default()
    };
    let mut s = setup(config, 12, FixedRingConfig::default());
    let remote = s.target.remote().slice(0..64).unwrap();
    let short = s.target.remote().slice(0..8).unwrap();
    let mut slots: Vec<FixedBuf> = std::iter::from_fn(|| s.ring.take_buf()).collect();
    let mut batch = s.ring.batch(s.qp).unwrap();
    assert_eq!(batch.qp(), s.qp);

    // Pushes through the batch, expecting a refusal matching the pattern;
    // keeps the slot handed back.
    macro_rules! refused {
        ($op:expr, $pattern:pat) => {{
            let (e, op) = batch.push($op).unwrap_err().into_parts();
            assert!(matches!(e, $pattern), "{e}");
            slots.push(op.into_buf());
        }};
    }
    refused!(
        WriteFixed::new(slots.pop().unwrap(), 65, remote),
        Error::OutOfBounds { .. }
    );
    refused!(
        WriteFixed::new(slots.pop().unwrap(), 64, short),
        Error::RemoteTooSmall {
            local: 64,
            remote: 8
        }
    );
    refused!(
        SendFixed::new(slots.pop().unwrap(), 32).inline(),
        Error::InlineTooLarge { .. }
    );
    let mut foreign = FixedBufs::new(&s.pd, 1, 64).unwrap();
    let stranger = foreign.take().unwrap();
    let (e, op) = batch
        .push(WriteFixed::new(stranger, 64, remote))
        .unwrap_err()
        .into_parts();
    assert!(matches!(e, Error::ForeignFixedBuf), "{e}");
    foreign.put(op.into_buf()).unwrap();

    // The places: three sends, two receives; then each queue is full.
    for i in 0..3 {
        let op = WriteFixed::new(slots.pop().unwrap(), 64, remote).user_data(i);
        batch.push(op).unwrap();
    }
    refused!(
        WriteFixed::new(slots.pop().unwrap(), 64, remote),
        Error::SendQueueFull {
            outstanding: 3,
            depth: 3
        }
    );
    for i in 3..5 {
        batch
            .push(RecvFixed::new(slots.pop().unwrap()).user_data(i))
            .unwrap();
    }
    refused!(
        RecvFixed::new(slots.pop().unwrap()),
        Error::RecvQueueFull {
            outstanding: 2,
            depth: 2
        }
    );
    assert_eq!(batch.pushed(), 5);
    assert!(format!("{batch:?}").contains("pushed: 5"));

    // One doorbell per queue: the receives, then the sends.
    let before = s.control.counters();
    assert_eq!(s.ring.submit().unwrap(), 5);
    let after = s.control.counters();
    assert_eq!(after.send_posts - before.send_posts, 1);
    assert_eq!(after.recv_posts - before.recv_posts, 1);
    let done = reap_each_until(&mut s.ring, 3);
    let ids: Vec<u64> = done.iter().map(|c| c.user_data()).collect();
    assert_eq!(ids, [0, 1, 2]);
    assert!(done.iter().all(|c| c.status().is_success()));
    drop(s.peer);
}

#[test]
fn opening_a_batch_fails_as_a_push_would() {
    let mut s = setup(QpConfig::default(), 4, FixedRingConfig::default());
    // A handle of another ring names nothing here.
    let other = setup(QpConfig::default(), 1, FixedRingConfig::default());
    assert!(matches!(s.ring.batch(other.qp), Err(Error::NotAttached(_))));
    // A queue pair in error takes no more work.
    s.ring.fail_qp(s.qp).unwrap();
    assert!(matches!(s.ring.batch(s.qp), Err(Error::QpInError(_))));
    // A failed ring takes none at all.
    let mut t = setup(QpConfig::default(), 4, FixedRingConfig::default());
    assert!(t.ring.apply_event(AsyncEvent::DeviceFatal));
    assert!(matches!(t.ring.batch(t.qp), Err(Error::RingFailed(_))));
    // A detached queue pair's handle names nothing either.
    let mut u = setup(QpConfig::default(), 4, FixedRingConfig::default());
    let qp = u.ring.detach(u.qp).unwrap();
    assert!(matches!(u.ring.batch(u.qp), Err(Error::NotAttached(_))));
    drop(qp);
}

#[test]
fn a_batch_of_a_shared_receive_queues_queue_pair_refuses_receives() {
    let dev = SoftDevice::new();
    let pd = dev.alloc_pd();
    let mut ring: FixedRing<SoftQp> = FixedRing::new(
        dev.create_cq(64).unwrap(),
        FixedBufs::new(&pd, 4, 64).unwrap(),
        FixedRingConfig::default(),
    );
    let srq = ring
        .add_srq(dev.create_srq(&pd, SrqConfig::default()).unwrap())
        .unwrap_or_else(|_| panic!("add_srq"));
    let qp = dev
        .create_qp_on(
            &pd,
            ring.cq(),
            Some(ring.srq(srq).unwrap()),
            QpConfig::default(),
        )
        .unwrap();
    let conn = ring.attach(qp).unwrap_or_else(|_| panic!("attach"));
    let slot = ring.take_buf().unwrap();
    let mut batch = ring.batch(conn).unwrap();
    let (e, op) = batch.push(RecvFixed::new(slot)).unwrap_err().into_parts();
    assert!(matches!(e, Error::Incompatible(_)), "{e}");
    assert_eq!(batch.pushed(), 0);
    ring.put_buf(op.into_buf()).unwrap();
    assert_eq!(ring.bufs().free(), 4);
}

#[test]
fn a_batch_takes_completion_queue_credits_as_push_does() {
    // A completion queue of 4 entries and one queue pair: one entry is
    // kept for its drain marker, three operations fit.
    let dev = SoftDevice::new();
    let pd = dev.alloc_pd();
    let mut ring: FixedRing<SoftQp> = FixedRing::new(
        dev.create_cq(4).unwrap(),
        FixedBufs::new(&pd, 8, 64).unwrap(),
        FixedRingConfig::default(),
    );
    let qp = dev
        .create_qp_on(&pd, ring.cq(), None, QpConfig::default())
        .unwrap();
    let peer = dev.create_qp(&pd, QpConfig::default()).unwrap();
    dev.connect(&qp, &peer).unwrap();
    let conn = ring.attach(qp).unwrap_or_else(|_| panic!("attach"));
    let mut slots: Vec<FixedBuf> = std::iter::from_fn(|| ring.take_buf()).collect();
    let mut batch = ring.batch(conn).unwrap();
    for _ in 0..3 {
        batch.push(RecvFixed::new(slots.pop().unwrap())).unwrap();
    }
    let (e, op) = batch
        .push(RecvFixed::new(slots.pop().unwrap()))
        .unwrap_err()
        .into_parts();
    assert!(
        matches!(e, Error::CompletionQueueFull { entries: 4, .. }),
        "{e}"
    );
    slots.push(op.into_buf());
    // A push after the batch counts the batch's credits too.
    let (e, _op) = ring
        .push(conn, RecvFixed::new(slots.pop().unwrap()))
        .unwrap_err()
        .into_parts();
    assert!(matches!(e, Error::CompletionQueueFull { .. }), "{e}");
    drop(peer);
}

#[test]
fn a_forgotten_or_empty_batch_loses_nothing_and_posts_nothing_extra() {
    let mut s = setup(QpConfig::default(), 8, FixedRingConfig::default());
    let remote = s.target.remote().slice(0..64).unwrap();
    // An empty batch: nothing to post, no doorbell.
    let batch = s.ring.batch(s.qp).unwrap();
    assert_eq!(batch.pushed(), 0);
    assert_eq!(s.ring.submit().unwrap(), 0);
    assert_eq!(s.control.counters().send_posts, 0);
    assert_eq!(s.control.counters().recv_posts, 0);
    // A forgotten batch: what it pushed goes out with the next submit.
    let slots: Vec<FixedBuf> = (0..3).map(|_| s.ring.take_buf().unwrap()).collect();
    let mut batch = s.ring.batch(s.qp).unwrap();
    for (i, slot) in slots.into_iter().enumerate() {
        batch
            .push(WriteFixed::new(slot, 64, remote).user_data(i as u64))
            .unwrap();
    }
    // Never dropped: whatever a batch's end did, a batch must not need it.
    let _forgotten = std::mem::ManuallyDrop::new(batch);
    assert_eq!(s.ring.submit().unwrap(), 3);
    let done = reap_each_until(&mut s.ring, 3);
    let ids: Vec<u64> = done.iter().map(|c| c.user_data()).collect();
    assert_eq!(ids, [0, 1, 2]);
    for c in done {
        s.ring.put_buf(c.into_buf()).unwrap();
    }
    // Two batches to one queue pair before a submit: one doorbell.
    let posts = s.control.counters().send_posts;
    for i in 0..2 {
        let slot = s.ring.take_buf().unwrap();
        let mut batch = s.ring.batch(s.qp).unwrap();
        batch
            .push(WriteFixed::new(slot, 64, remote).user_data(10 + i))
            .unwrap();
    }
    assert_eq!(s.ring.submit().unwrap(), 2);
    assert_eq!(s.control.counters().send_posts, posts + 1);
    let ids: Vec<u64> = reap_each_until(&mut s.ring, 2)
        .iter()
        .map(|c| c.user_data())
        .collect();
    assert_eq!(ids, [10, 11]);
    s.ring.close().unwrap();
}

/// Reaps with `reap_each`, the closure panicking at the `k`-th completion
/// it is handed (from 1): returns those handed before it, and the
/// `user_data` of the one it panicked on (lost with the panic).
fn reap_panicking_at(ring: &mut FixedRing<SoftQp>, k: usize) -> (Vec<FixedCompletion>, u64) {
    let mut kept = Vec::new();
    let mut lost = None;
    for _ in 0..1000 {
        let result = catch_unwind(AssertUnwindSafe(|| {
            ring.reap_each(|c| {
                if kept.len() + 1 == k {
                    lost = Some(c.user_data());
                    panic!("the caller's closure fails");
                }
                kept.push(c);
            })
        }));
        if result.is_err() {
            return (kept, lost.expect("the panic's completion"));
        }
        std::thread::yield_now();
    }
    panic!("fewer than {k} completions came");
}

/// Reaps with `reap_each` until a reap hands nothing out.
fn reap_rest(ring: &mut FixedRing<SoftQp>) -> Vec<FixedCompletion> {
    let mut got = Vec::new();
    while ring.reap_each(|c| got.push(c)).unwrap() > 0 {}
    got
}

/// After a panic: every operation but the lost one came back once, in
/// order, with `status`, the slots all came back but the lost one's, and
/// the ring closes with nothing outstanding.
fn check_after_panic(
    mut s: Setup,
    before: Vec<FixedCompletion>,
    lost: u64,
    ids: std::ops::Range<u64>,
    status: WcStatus,
    slots: u32,
) {
    let after = reap_rest(&mut s.ring);
    let seen: Vec<u64> = before.iter().chain(&after).map(|c| c.user_data()).collect();
    let expected: Vec<u64> = ids.filter(|&id| id != lost).collect();
    assert_eq!(
        seen, expected,
        "every operation but the lost one, once, in order"
    );
    for c in before.iter().chain(&after) {
        assert_eq!(c.status(), status, "{c:?}");
    }
    for c in before.into_iter().chain(after) {
        s.ring.put_buf(c.into_buf()).unwrap();
    }
    assert_eq!(
        s.ring.bufs().free(),
        slots - 1,
        "only the lost one's slot is gone"
    );
    s.ring.close().unwrap();
}

/// Pushes WRITEs `ids` through one batch and submits them.
fn write_all(s: &mut Setup, ids: std::ops::Range<u64>) {
    let remote = s.target.remote().slice(0..64).unwrap();
    let slots: Vec<FixedBuf> = ids.clone().map(|_| s.ring.take_buf().unwrap()).collect();
    let mut batch = s.ring.batch(s.qp).unwrap();
    for (id, slot) in ids.zip(slots) {
        batch
            .push(WriteFixed::new(slot, 64, remote).user_data(id))
            .unwrap();
    }
}

/// Eight WRITEs, a completion every `signal_interval` sends; the closure
/// panics at the `k`-th completion it is handed (WRITE `k - 1`).
fn panic_among_eight_writes(signal_interval: u32, k: usize) {
    let config = FixedRingConfig {
        signal_interval,
        ..FixedRingConfig::default()
    };
    let mut s = setup(QpConfig::default(), 16, config);
    write_all(&mut s, 0..8);
    assert_eq!(s.ring.submit().unwrap(), 8);
    let (before, lost) = reap_panicking_at(&mut s.ring, k);
    assert_eq!((before.len(), lost), (k - 1, k as u64 - 1));
    check_after_panic(s, before, lost, 0..8, WcStatus::Success, 16);
}

#[test]
fn a_closure_panicking_in_a_run_of_sends_loses_only_what_it_was_handed() {
    // One completion for eight sends: the run the closure panics in.
    panic_among_eight_writes(8, 3);
}

#[test]
fn a_closure_panicking_at_a_runs_signaled_completion_loses_only_it() {
    panic_among_eight_writes(8, 8);
}

#[test]
fn a_closure_panicking_in_a_run_keeps_the_runs_rest_before_the_polls_next_entries() {
    // Two completions of four sends each, taken by one poll: the panic in
    // the first run leaves its rest, then the second run, in order.
    panic_among_eight_writes(4, 2);
}

#[test]
fn a_closure_panicking_early_in_a_poll_leaves_the_polls_other_entries_for_the_next_reap() {
    // A completion per send: one poll takes all eight entries.
    panic_among_eight_writes(1, 2);
}

#[test]
fn a_closure_panicking_at_a_receive_leaves_the_next_receive_for_the_next_reap() {
    let dev = SoftDevice::new();
    let pd = dev.alloc_pd();
    let (mut a, mut b) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    let (cq_a, cq_b) = (a.take_cq().unwrap(), b.take_cq().unwrap());
    let config = FixedRingConfig::default();
    let mut receiver = FixedRing::new(cq_a, FixedBufs::new(&pd, 4, 64).unwrap(), config);
    let mut sender = FixedRing::new(cq_b, FixedBufs::new(&pd, 4, 64).unwrap(), config);
    let (qa, qb) = (
        receiver.attach(a).unwrap_or_else(|_| panic!("attach")),
        sender.attach(b).unwrap_or_else(|_| panic!("attach")),
    );
    for id in 0..2 {
        let slot = receiver.take_buf().unwrap();
        receiver
            .push(qa, RecvFixed::new(slot).user_data(id))
            .unwrap();
    }
    receiver.submit().unwrap();
    for id in 0..2 {
        let slot = sender.take_buf().unwrap();
        sender
            .push(qb, SendFixed::new(slot, 8).user_data(id))
            .unwrap();
    }
    sender.submit().unwrap();
    let (before, lost) = reap_panicking_at(&mut receiver, 1);
    assert_eq!((before.len(), lost), (0, 0));
    let after = reap_rest(&mut receiver);
    let ids: Vec<(u64, u32)> = after
        .iter()
        .map(|c| (c.user_data(), c.byte_len()))
        .collect();
    assert_eq!(ids, [(1, 8)], "the other receive, once");
    receiver
        .put_buf(after.into_iter().next().unwrap().into_buf())
        .unwrap();
    assert_eq!(receiver.bufs().free(), 3);
    // The lost receive completed: nothing is outstanding.
    receiver.close().unwrap();
    drop(sender);
}

#[test]
fn a_closure_panicking_at_a_flushed_completion_leaves_the_rest_for_the_next_reap() {
    let mut s = setup(QpConfig::default(), 8, FixedRingConfig::default());
    // Pushed, never posted: failing the queue pair flushes them into the
    // ring's ready list.
    write_all(&mut s, 0..3);
    s.ring.fail_qp(s.qp).unwrap();
    let (before, lost) = reap_panicking_at(&mut s.ring, 2);
    assert_eq!((before.len(), lost), (1, 1));
    check_after_panic(s, before, lost, 0..3, WcStatus::WrFlushErr, 8);
}

/// One step of the property test.
#[derive(Clone, Debug)]
enum Step {
    /// An operation: kind (write, read, send, receive), length, whether
    /// its remote slice is short (32 bytes), whether it asks for a
    /// completion.
    Push(u8, u32, bool, bool),
    Submit,
    Reap,
    /// The device fails the queue pair's n-th work request from now.
    FailNth(u64),
    /// The queue pair fails on request.
    FailQp,
    /// A reap whose `n`-th completion is lost: with `reap_each`, the
    /// closure panics at it (and the harness reaps again for the rest);
    /// with `reap`, the harness drops it.
    PanicAt(usize),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => (0u8..4, 0u32..=70, any::<bool>(), any::<bool>())
            .prop_map(|(kind, len, short, signaled)| Step::Push(kind, len, short, signaled)),
        2 => Just(Step::Submit),
        2 => Just(Step::Reap),
        1 => (1u64..6).prop_map(Step::FailNth),
        1 => Just(Step::FailQp),
        1 => (1usize..6).prop_map(Step::PanicAt),
    ]
}

/// What one side saw: per push its refusal (if any), per submit its
/// result, per reap its completions.
#[derive(Debug, PartialEq)]
enum Seen {
    Pushed(Option<String>),
    Submitted(Result<usize, String>),
    Reaped(Vec<(u64, WcStatus, u32, String)>),
    Lost(Option<u64>),
}

fn seen(c: &FixedCompletion) -> (u64, WcStatus, u32, String) {
    (
        c.user_data(),
        c.status(),
        c.byte_len(),
        format!("{:?}", c.kind()),
    )
}

/// The operation of a `Push` step, on `slot`.
fn op_of(
    s: &Setup,
    slot: FixedBuf,
    (kind, len, short, signaled): (u8, u32, bool, bool),
    id: u64,
) -> AnyOp {
    let remote = if short {
        s.target.remote().slice(0..32).unwrap()
    } else {
        s.target.remote().slice(0..64).unwrap()
    };
    match kind {
        0 => {
            let op = WriteFixed::new(slot, len, remote).user_data(id);
            AnyOp::Write(if signaled { op.signaled() } else { op })
        }
        1 => {
            let op = ReadFixed::new(slot, len, remote).user_data(id);
            AnyOp::Read(if signaled { op.signaled() } else { op })
        }
        2 => {
            let op = SendFixed::new(slot, len).user_data(id);
            AnyOp::Send(if signaled { op.signaled() } else { op })
        }
        _ => AnyOp::Recv(RecvFixed::new(slot).user_data(id)),
    }
}

enum AnyOp {
    Write(WriteFixed),
    Read(ReadFixed),
    Send(SendFixed),
    Recv(RecvFixed),
}

/// Pushes `$op` with `$push` (a ring's or a batch's push of `$x`),
/// returning the refusal and the slot of a refused operation.
macro_rules! push_any {
    ($op:expr, $x:ident => $push:expr) => {{
        macro_rules! back {
            ($result:expr) => {
                $result.err().map(|r| {
                    let (e, op) = r.into_parts();
                    (format!("{e}"), op.into_buf())
                })
            };
        }
        match $op {
            AnyOp::Write($x) => back!($push),
            AnyOp::Read($x) => back!($push),
            AnyOp::Send($x) => back!($push),
            AnyOp::Recv($x) => back!($push),
        }
    }};
}

/// Runs `steps` on a fresh ring: with `batched`, each run of pushes
/// through one batch and each reap with `reap_each`; else one `push` at a
/// time and `reap` into a list.
fn run(steps: &[Step], batched: bool) -> Vec<Seen> {
    // The peer posts no receives: a SEND waits on RNR for good (7), as
    // retries that run out on the clock would make the two runs differ.
    let config = QpConfig {
        max_send_wr: 8,
        max_recv_wr: 4,
        rnr_retry: 7,
        ..QpConfig::default()
    };
    let ring_config = FixedRingConfig {
        signal_interval: 4,
        ..FixedRingConfig::default()
    };
    let mut s = setup(config, 24, ring_config);
    let mut log = Vec::new();
    let mut free: Vec<FixedBuf> = std::iter::from_fn(|| s.ring.take_buf()).collect();
    let mut id = 0;
    let mut at = 0;
    while at < steps.len() {
        match steps[at] {
            Step::Push(..) => {
                // The run of pushes, each with a slot taken before it.
                let mut group = Vec::new();
                while let Some(&Step::Push(kind, len, short, signaled)) = steps.get(at) {
                    at += 1;
                    let Some(slot) = free.pop() else { continue };
                    id += 1;
                    group.push(op_of(&s, slot, (kind, len, short, signaled), id));
                }
                let mut refused = Vec::new();
                if batched {
                    match s.ring.batch(s.qp) {
                        Ok(mut batch) => {
                            for op in group {
                                refused.push(push_any!(op, op => batch.push(op)));
                            }
                        }
                        // As each push would be refused.
                        Err(e) => {
                            for op in group {
                                let buf = match op {
                                    AnyOp::Write(op) => op.into_buf(),
                                    AnyOp::Read(op) => op.into_buf(),
                                    AnyOp::Send(op) => op.into_buf(),
                                    AnyOp::Recv(op) => op.into_buf(),
                                };
                                refused.push(Some((format!("{e}"), buf)));
                            }
                        }
                    }
                } else {
                    let qp = s.qp;
                    for op in group {
                        refused.push(push_any!(op, op => s.ring.push(qp, op)));
                    }
                }
                for r in refused {
                    log.push(Seen::Pushed(r.as_ref().map(|(e, _)| e.clone())));
                    if let Some((_, buf)) = r {
                        free.push(buf);
                    }
                }
                continue;
            }
            Step::FailNth(n) => s.control.fail_nth(n, WcStatus::RemOpErr),
            Step::PanicAt(n) => {
                let mut out = Vec::new();
                let lost = if batched {
                    let mut lost = None;
                    let cut = catch_unwind(AssertUnwindSafe(|| {
                        s.ring.reap_each(|c| {
                            if out.len() + 1 == n {
                                lost = Some(c.user_data());
                                panic!("the caller's closure fails");
                            }
                            out.push(c);
                        })
                    }));
                    if cut.is_err() {
                        // What the panic left: the rest of that reap (the
                        // queue holds fewer entries than one poll takes, so
                        // a second poll finds nothing more).
                        s.ring.reap_each(|c| out.push(c)).unwrap();
                    }
                    lost
                } else {
                    s.ring.reap(&mut out).unwrap();
                    (out.len() >= n).then(|| out.remove(n - 1).user_data())
                };
                log.push(Seen::Lost(lost));
                log.push(Seen::Reaped(out.iter().map(seen).collect()));
                free.extend(out.into_iter().map(FixedCompletion::into_buf));
            }
            Step::FailQp => log.push(Seen::Submitted(
                s.ring.fail_qp(s.qp).map(|()| 0).map_err(|e| format!("{e}")),
            )),
            // Batched, one queue pair's doorbell: as the ring's submit.
            Step::Submit if batched => log.push(Seen::Submitted(
                s.ring.submit_qp(s.qp).map_err(|e| format!("{e}")),
            )),
            Step::Submit => log.push(Seen::Submitted(s.ring.submit().map_err(|e| format!("{e}")))),
            Step::Reap => {
                let mut out = Vec::new();
                let n = if batched {
                    s.ring.reap_each(|c| out.push(c)).unwrap()
                } else {
                    s.ring.reap(&mut out).unwrap()
                };
                assert_eq!(n, out.len(), "what a reap says it handed out");
                log.push(Seen::Reaped(out.iter().map(seen).collect()));
                free.extend(out.into_iter().map(FixedCompletion::into_buf));
            }
        }
        at += 1;
    }
    // Everything comes back at the end, either way.
    let _ = s.ring.submit();
    let mut out = Vec::new();
    for _ in 0..100 {
        if batched {
            s.ring.reap_each(|c| out.push(c)).unwrap();
        } else {
            s.ring.reap(&mut out).unwrap();
        }
    }
    log.push(Seen::Reaped(out.iter().map(seen).collect()));
    log
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn batches_and_reap_each_do_what_push_and_reap_do(
        steps in proptest::collection::vec(step(), 1..60)
    ) {
        let one_by_one = run(&steps, false);
        let batched = run(&steps, true);
        prop_assert_eq!(one_by_one, batched);
    }
}

/// `submit_qp` rings one queue pair's doorbell: another queue pair's
/// pushed work waits for the ring's submit, as does work pushed to the
/// first one after it; receives pushed to a shared receive queue go
/// first; a handle of no attached queue pair is refused and posts nothing.
#[test]
fn submit_qp_posts_one_queue_pair_and_the_shared_receives_first() {
    let dev = SoftDevice::new();
    let pd = dev.alloc_pd();
    let cq = dev.create_cq(64).unwrap();
    let mut ring = FixedRing::new(
        cq,
        FixedBufs::new(&pd, 16, 64).unwrap(),
        FixedRingConfig::default(),
    );
    let srq = ring
        .add_srq(dev.create_srq(&pd, SrqConfig::default()).unwrap())
        .unwrap();
    let (a, b) = (
        dev.create_qp_on(&pd, ring.cq(), None, QpConfig::default())
            .unwrap(),
        dev.create_qp_on(&pd, ring.cq(), None, QpConfig::default())
            .unwrap(),
    );
    let (pa, pb) = (
        dev.create_qp(&pd, QpConfig::default()).unwrap(),
        dev.create_qp(&pd, QpConfig::default()).unwrap(),
    );
    dev.connect(&a, &pa).unwrap();
    dev.connect(&b, &pb).unwrap();
    let (control_a, control_b) = (a.control(), b.control());
    let (a, b) = (
        ring.attach(a).unwrap_or_else(|_| panic!("attach")),
        ring.attach(b).unwrap_or_else(|_| panic!("attach")),
    );
    let target = ExposedBuf::new(&pd, vec![0u8; 64], RemoteAccess::WRITE).unwrap();
    let write = |ring: &mut FixedRing<SoftQp>, qp, id| {
        let slot = ring.take_buf().unwrap();
        ring.push(qp, WriteFixed::new(slot, 8, target.remote()).user_data(id))
            .unwrap();
    };
    for _ in 0..2 {
        let slot = ring.take_buf().unwrap();
        ring.push_srq(srq, RecvFixed::new(slot)).unwrap();
    }
    write(&mut ring, a, 1);
    write(&mut ring, a, 2);
    write(&mut ring, b, 3);

    // A handle of no attached queue pair: refused, nothing posted.
    let mut detached_ring = setup(QpConfig::default(), 2, FixedRingConfig::default());
    let foreign = detached_ring.qp;
    drop(detached_ring.ring.detach(foreign).unwrap());
    assert!(matches!(
        ring.submit_qp(foreign),
        Err(Error::NotAttached(_))
    ));
    assert_eq!(ring.srq_posted(srq).unwrap(), 0);

    // The shared receives and a's two writes, one doorbell for a.
    assert_eq!(ring.submit_qp(a).unwrap(), 4);
    assert_eq!(ring.srq_posted(srq).unwrap(), 2);
    assert_eq!(control_a.counters().send_posts, 1);
    assert_eq!(control_b.counters().send_posts, 0, "b's write waits");
    // Pushed to a after its doorbell: goes with the ring's submit.
    write(&mut ring, a, 4);
    assert_eq!(ring.submit().unwrap(), 2);
    assert_eq!(control_a.counters().send_wrs, 3);
    assert_eq!(control_b.counters().send_wrs, 1);
    assert_eq!(ring.submit().unwrap(), 0);
    let mut ids: Vec<u64> = reap_each_until(&mut ring, 4)
        .iter()
        .map(|c| {
            assert!(c.status().is_success());
            c.user_data()
        })
        .collect();
    ids.sort_unstable();
    assert_eq!(ids, [1, 2, 3, 4]);
}
