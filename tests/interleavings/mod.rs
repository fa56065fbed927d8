//! The fixed-buffer ring awaited, in any interleaving: pushes, polls and
//! drops of futures, submits, drives, device steps, a failing work
//! request, a queue pair failed on request, doorbell coalescing turned on
//! and off, a peer sending to a queue pair on a shared receive queue the
//! ring keeps topped up, awaits of its arrivals, and a close, decoded
//! from bytes (a property test's, or a fuzzer's).
//! Checked: a future resolves with its own operation's completion (its
//! slot, its kind, a status its operation can have); a future that was
//! left pending is woken before it can resolve (the adapter runs under
//! `Wakeup::Reactor`, so only the ring wakes it — or, once, the future
//! itself when it leaves its operation for a shared doorbell, which the
//! harness does not count); an arrival is a refill receive's, holding
//! one message the peer sent, whole and once, and every message the
//! device delivered arrives; and once the queue pairs are detached and
//! the shared queue removed, every future has resolved and every slot —
//! dropped futures' and the refill's too — is back.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use std::collections::HashSet;

use rdma_ring::backend::soft::{Progress, SoftDevice, SoftQp};
use rdma_ring::backend::{QpConfig, QueuePair, SrqConfig, WcStatus};
use rdma_ring::buf::{ExposedBuf, RegisteredBuf, RemoteAccess};
use rdma_ring::fixed::{
    FixedBufs, FixedCompletion, FixedQp, FixedRing, FixedRingConfig, FixedSrq, FixedSrqRefill,
    RecvFixed, WriteFixed,
};
use rdma_ring::future::{AsyncFixedRing, FixedOpFuture, SrqReceive, Wakeup};
use rdma_ring::op::{OpKind, Send};
use rdma_ring::ring::{Ring, RingConfig};
use rdma_ring::Error;

/// More than one poll of the ring takes (32), so a burst needs several,
/// with the refill's (up to 6) besides.
const SLOTS: u32 = 48;

/// What an injected failure completes a send with.
const INJECTED: WcStatus = WcStatus::RemAccessErr;

/// The tag of the shared receive queue's refill receives.
const REFILL_TAG: u64 = 0xbeef;

/// One step of a run.
#[derive(Clone, Copy, Debug)]
enum Step {
    PushWrite,
    /// A round of WRITEs pushed with one `push_all`.
    PushWrites(usize),
    PushRecv,
    Poll(usize),
    Drop(usize),
    Submit,
    Progress,
    Drive,
    Fail,
    Coalesce(bool),
    FailQp,
    /// The peer sends to the queue pair on the shared receive queue.
    PeerSend,
    /// The harness polls its await of the shared queue's next arrival.
    Receive,
    Close,
}

fn step(byte: u8) -> Step {
    let which = usize::from(byte >> 4);
    match byte % 16 {
        0 | 1 => Step::PushWrite,
        2 => Step::PushWrites(1 + which % 4),
        3..=5 => Step::PushRecv,
        6 | 7 => Step::Poll(which),
        8 => Step::Drop(which),
        9 => Step::Submit,
        10 => Step::Progress,
        11 => Step::Receive,
        15 if byte < 0x80 => Step::PeerSend,
        15 => Step::FailQp,
        12 => Step::Drive,
        13 => Step::Fail,
        _ if byte < 0x80 => Step::Coalesce(byte & 0x10 != 0),
        _ => Step::Close,
    }
}

/// A waker that notes it was woken.
struct Flag(AtomicBool);

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.0.store(true, Ordering::SeqCst);
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// A pushed operation's future and what its completion must say.
struct Pending {
    future: FixedOpFuture<SoftQp>,
    tag: u64,
    slot: u32,
    kind: OpKind,
    flag: Arc<Flag>,
    /// Whether a poll left it pending (its waker is registered).
    waiting: bool,
}

impl Pending {
    /// Polls once; a future that was left pending must have been woken
    /// since, if it resolves now without having polled the device itself
    /// (which `must_be_woken` says).
    fn poll(&mut self, must_be_woken: bool) -> Poll<Result<FixedCompletion, Error>> {
        let woken = self.flag.0.swap(false, Ordering::SeqCst);
        let waker = Waker::from(Arc::clone(&self.flag));
        let mut cx = Context::from_waker(&waker);
        let poll = std::future::Future::poll(std::pin::Pin::new(&mut self.future), &mut cx);
        if poll.is_ready() && self.waiting && must_be_woken {
            assert!(woken, "operation {} resolved without a wake-up", self.tag);
        }
        self.waiting = poll.is_pending();
        // A first poll that leaves its operation for a shared doorbell
        // wakes its own task: that wake-up is not one the ring owes later.
        self.flag.0.store(false, Ordering::SeqCst);
        poll
    }

    /// Checks the completion is this operation's own.
    fn check(&self, done: Result<FixedCompletion, Error>) -> FixedCompletion {
        let c = done.unwrap_or_else(|e| panic!("operation {}: {e}", self.tag));
        assert_eq!(c.user_data(), self.tag, "its own tag");
        assert_eq!(
            c.buf().index(),
            self.slot,
            "operation {}: its own slot",
            self.tag
        );
        assert_eq!(c.kind(), self.kind, "operation {}: its own kind", self.tag);
        let possible: &[WcStatus] = match self.kind {
            // Nobody sends to it: a receive can only be flushed.
            OpKind::Recv => &[WcStatus::WrFlushErr],
            _ => &[WcStatus::Success, WcStatus::WrFlushErr, INJECTED],
        };
        assert!(
            possible.contains(&c.status()),
            "operation {} ({:?}) completed {:?}",
            self.tag,
            self.kind,
            c.status()
        );
        c
    }
}

/// The shared receive queue side: the ring's queue pair on it, its peer,
/// the harness's await of the next arrival, and what arrived.
struct SharedSide {
    srq: FixedSrq,
    qp: FixedQp,
    peer: Ring<SoftQp>,
    /// Messages the peer sent so far (the `n`th is `n % 256` repeated
    /// `8 + n % 8` times), and those the device delivered.
    sent: usize,
    delivered: usize,
    receiving: Option<(SrqReceive<SoftQp>, Arc<Flag>)>,
    /// Whether a poll left the await pending (its waker registered).
    waiting: bool,
    /// Messages that arrived, and those whose bytes were read.
    successes: usize,
    arrived: HashSet<u8>,
}

/// Messages the peer sends at most: each is told apart by its byte.
const MAX_MESSAGES: usize = 250;

impl SharedSide {
    fn send(&mut self, pd: &rdma_ring::backend::soft::SoftPd) {
        if self.sent == MAX_MESSAGES {
            return;
        }
        let n = self.sent as u8;
        let msg = RegisteredBuf::new(pd, vec![n; 8 + usize::from(n % 8)]).unwrap();
        if self.peer.submission().push(Send::new(msg)).is_ok() && self.peer.submit().is_ok() {
            self.sent += 1;
        }
    }

    /// The peer's send completions: how many messages the device delivered.
    fn reap_peer(&mut self) {
        let mut out = Vec::new();
        let _ = self.peer.completion().reap(&mut out);
        self.delivered += out.iter().filter(|c| c.status().is_success()).count();
    }

    /// Polls the await of the next arrival (a new one if none waits);
    /// `must_be_woken` as for [`Pending::poll`]. What arrived is checked
    /// and its slot given back (unless the ring is closed); returns the
    /// outcome, if it resolved.
    fn receive(
        &mut self,
        ring: &AsyncFixedRing<SoftQp>,
        must_be_woken: bool,
        closed: bool,
    ) -> Option<Result<(), Error>> {
        let (future, flag) = self.receiving.get_or_insert_with(|| {
            (
                ring.receive(self.srq),
                Arc::new(Flag(AtomicBool::new(false))),
            )
        });
        let woken = flag.0.swap(false, Ordering::SeqCst);
        let waker = Waker::from(Arc::clone(flag));
        let mut cx = Context::from_waker(&waker);
        let poll = std::future::Future::poll(std::pin::Pin::new(future), &mut cx);
        let Poll::Ready(done) = poll else {
            self.waiting = true;
            return None;
        };
        if self.waiting && must_be_woken {
            assert!(woken, "an arrival was handed out without a wake-up");
        }
        self.waiting = false;
        self.receiving = None;
        let c = match done {
            Ok(c) => c,
            Err(error) => return Some(Err(error)),
        };
        assert_eq!(
            (c.user_data(), c.kind()),
            (REFILL_TAG, OpKind::Recv),
            "a refill receive's"
        );
        match c.status() {
            WcStatus::Success => {
                assert_eq!(c.qp(), self.qp, "names the queue pair it came on");
                self.successes += 1;
                // Once closed, the slots' bytes are out of reach.
                if let Ok(bytes) =
                    ring.with_bufs(|b| b.bytes(c.buf())[..c.byte_len() as usize].to_vec())
                {
                    let n = bytes[0];
                    assert_eq!(bytes.len(), 8 + usize::from(n % 8), "message {n} whole");
                    assert!(bytes.iter().all(|&b| b == n), "message {n} whole");
                    assert!(self.arrived.insert(n), "message {n} arrived twice");
                }
            }
            // A flushed refill receive carries nothing: its slot goes
            // back to the ring, and it never arrives.
            other => panic!("an arrival completed {other:?}"),
        }
        if !closed {
            ring.put_buf(c.into_buf()).unwrap();
        }
        Some(Ok(()))
    }
}

/// What a run did on the shared receive queue's side.
#[derive(Clone, Copy, Debug, Default)]
#[allow(dead_code)] // Read by the property tests, not the fuzz target.
pub struct Summary {
    /// Messages the peer sent, and those that arrived whole.
    pub sent: usize,
    pub arrived: usize,
}

/// Runs the steps `bytes` decode to, and checks what the module says.
pub fn run(bytes: &[u8]) -> Summary {
    let dev = SoftDevice::with_progress(Progress::Manual);
    let pd = dev.alloc_pd();
    let config = QpConfig {
        max_send_wr: 64,
        max_recv_wr: 64,
        ..QpConfig::default()
    };
    let (mut qa, _qb) = dev.connected_pair(&pd, &pd, config).unwrap();
    let control = qa.control();
    let target = ExposedBuf::new(&pd, vec![0u8; 64], RemoteAccess::WRITE).unwrap();
    let ring = AsyncFixedRing::new(
        FixedRing::new(
            qa.take_cq().unwrap(),
            FixedBufs::new(&pd, SLOTS, 64).unwrap(),
            FixedRingConfig::default(),
        ),
        Wakeup::Reactor,
    )
    .unwrap();
    let h = ring.attach(qa).unwrap();
    let srq = ring
        .add_srq(
            dev.create_srq(
                &pd,
                SrqConfig {
                    max_wr: 8,
                    max_sge: 1,
                },
            )
            .unwrap(),
        )
        .unwrap();
    let on_srq = ring
        .with_srq(srq, |cq, srq| dev.create_qp_on(&pd, cq, srq, config))
        .unwrap()
        .unwrap();
    let peer = dev.create_qp(&pd, config).unwrap();
    dev.connect(&on_srq, &peer).unwrap();
    let mut shared = SharedSide {
        srq,
        qp: ring.attach(on_srq).unwrap(),
        peer: Ring::new(peer, RingConfig::default()),
        sent: 0,
        delivered: 0,
        receiving: None,
        waiting: false,
        successes: 0,
        arrived: HashSet::new(),
    };
    let refill = FixedSrqRefill {
        low: 2,
        target: 6,
        user_data: REFILL_TAG,
    };
    ring.set_srq_refill(srq, Some(refill)).unwrap();
    let mut pending: Vec<Pending> = Vec::new();
    let mut tag = 0u64;
    let mut closed = false;
    for &byte in bytes {
        match step(byte) {
            Step::PushWrite | Step::PushRecv => {
                let Some(slot) = ring.take_buf() else {
                    continue;
                };
                tag += 1;
                let index = slot.index();
                let (pushed, kind) = if matches!(step(byte), Step::PushWrite) {
                    let op = WriteFixed::new(slot, 64, target.remote()).user_data(tag);
                    let pushed = ring.push(h, op);
                    (
                        pushed.map_err(|r| r.into_parts().1.into_buf()),
                        OpKind::Write,
                    )
                } else {
                    let pushed = ring.push(h, RecvFixed::new(slot).user_data(tag));
                    (
                        pushed.map_err(|r| r.into_parts().1.into_buf()),
                        OpKind::Recv,
                    )
                };
                match pushed {
                    Ok(future) => pending.push(Pending {
                        future,
                        tag,
                        slot: index,
                        kind,
                        flag: Arc::new(Flag(AtomicBool::new(false))),
                        waiting: false,
                    }),
                    // A full queue, or a queue pair in error: the slot
                    // comes back with the refusal.
                    Err(slot) => ring.put_buf(slot).unwrap(),
                }
            }
            Step::PushWrites(count) => {
                let mut ops = Vec::new();
                let mut tags = Vec::new();
                while let Some(slot) = (ops.len() < count).then(|| ring.take_buf()).flatten() {
                    tag += 1;
                    tags.push((tag, slot.index()));
                    ops.push(WriteFixed::new(slot, 64, target.remote()).user_data(tag));
                }
                let mut futures = Vec::new();
                let pushed = ring.push_all(h, &mut ops, &mut futures);
                // Those before a refusal are pushed, in order; the refused
                // one comes back, and those after it stay in `ops`.
                assert_eq!(
                    futures.len() + ops.len() + usize::from(pushed.is_err()),
                    tags.len()
                );
                for (future, &(tag, slot)) in futures.into_iter().zip(&tags) {
                    pending.push(Pending {
                        future,
                        tag,
                        slot,
                        kind: OpKind::Write,
                        flag: Arc::new(Flag(AtomicBool::new(false))),
                        waiting: false,
                    });
                }
                if let Err(refused) = pushed {
                    ring.put_buf(refused.into_parts().1.into_buf()).unwrap();
                }
                for op in ops {
                    ring.put_buf(op.into_buf()).unwrap();
                }
            }
            Step::Poll(i) if !pending.is_empty() => {
                let i = i % pending.len();
                // Its own poll may reap its completion: no wake-up owed.
                if let Poll::Ready(done) = pending[i].poll(false) {
                    let op = pending.swap_remove(i);
                    let c = op.check(done);
                    if !closed {
                        ring.put_buf(c.into_buf()).unwrap();
                    }
                }
            }
            Step::Drop(i) if !pending.is_empty() => {
                let i = i % pending.len();
                drop(pending.swap_remove(i));
            }
            Step::Submit if !closed => {
                ring.submit().unwrap();
            }
            Step::Progress => {
                dev.progress();
                shared.reap_peer();
            }
            Step::PeerSend => shared.send(&pd),
            Step::Receive => {
                if let Some(Err(error)) = shared.receive(&ring, false, closed) {
                    assert!(closed, "no arrival can fail to come while open: {error}");
                    assert!(matches!(error, Error::Closed), "{error}");
                }
            }
            Step::Drive => {
                ring.drive().unwrap();
            }
            Step::Fail => control.fail_nth(1, INJECTED),
            Step::Coalesce(on) => ring.coalesce_doorbells(on),
            // Everything it held comes back flushed, waking its futures;
            // it takes no more work.
            Step::FailQp if closed => assert!(matches!(ring.fail_qp(h), Err(Error::Closed))),
            Step::FailQp => ring.fail_qp(h).unwrap(),
            Step::Close => {
                ring.close();
                closed = true;
            }
            Step::Poll(_) | Step::Drop(_) | Step::Submit => {}
        }
    }
    if !closed {
        // Every future polled once (its waker registered), everything
        // posted and run; then the queue pair fails, and each receive
        // comes back flushed with a completion of its own — more at once
        // than one poll of the ring takes, when enough are posted. One
        // drive must hand every one of them out, waking its future.
        for i in (0..pending.len()).rev() {
            if let Poll::Ready(done) = pending[i].poll(false) {
                let op = pending.swap_remove(i);
                ring.put_buf(op.check(done).into_buf()).unwrap();
            }
        }
        let _ = ring.submit();
        dev.progress();
        control.inject_fatal();
        ring.drive().unwrap();
        for op in &pending {
            if op.kind == OpKind::Recv {
                assert!(
                    op.flag.0.load(Ordering::SeqCst),
                    "receive {} flushed, but its future was not woken",
                    op.tag
                );
            }
        }
    }
    // The shared side settles: the device runs every send it can (one
    // without a receive fails after its retries), and a drive hands out
    // what arrived, waking the await if it waits.
    for _ in 0..10 {
        dev.progress();
        shared.reap_peer();
        let _ = ring.drive();
    }
    if shared.waiting && !closed {
        // Nothing is left for its own poll to reap: what it takes came
        // through the drive, which owed it a wake-up.
        let _ = shared.receive(&ring, true, closed);
    }
    if closed {
        // The close woke it; it takes what arrived before, then the
        // error.
        loop {
            match shared.receive(&ring, true, closed) {
                Some(Ok(())) => {}
                Some(Err(error)) => {
                    assert!(matches!(error, Error::Closed), "{error}");
                    break;
                }
                None => panic!("an await of arrivals still pending after the close"),
            }
        }
    } else {
        // Every arrival taken; then the queue goes (its queue pair first),
        // its refill receives' slots back to the ring, and the await
        // ends.
        while let Some(outcome) = shared.receive(&ring, false, closed) {
            outcome.unwrap();
        }
        assert!(shared.waiting);
        drop(ring.detach(shared.qp).unwrap());
        drop(ring.remove_srq(srq).unwrap());
        loop {
            match shared.receive(&ring, true, closed) {
                Some(Ok(())) => {}
                Some(Err(error)) => {
                    assert!(matches!(error, Error::NotAttached(_)), "{error}");
                    break;
                }
                None => panic!("an await of arrivals still pending after the removal"),
            }
        }
    }
    assert_eq!(
        shared.successes, shared.delivered,
        "every message the device delivered arrived, once"
    );
    // What is left comes back flushed: by a detach, or by the close.
    let qp = if closed {
        None
    } else {
        Some(ring.detach(h).unwrap())
    };
    for mut op in pending {
        // Settled by the detach or the close, not by this poll: woken.
        match op.poll(true) {
            Poll::Ready(done) => {
                let c = op.check(done);
                if !closed {
                    ring.put_buf(c.into_buf()).unwrap();
                }
            }
            Poll::Pending => panic!("operation {} still pending at the end", op.tag),
        }
    }
    if !closed {
        assert_eq!(
            ring.with_bufs(|bufs| bufs.free()).unwrap(),
            SLOTS,
            "every slot is back, dropped futures' too"
        );
    }
    drop(qp);
    Summary {
        sent: shared.sent,
        arrived: shared.successes,
    }
}
