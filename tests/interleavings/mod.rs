//! The fixed-buffer ring awaited, in any interleaving: pushes, polls and
//! drops of futures, submits, drives, device steps, a failing work
//! request, a queue pair failed on request, doorbell coalescing turned on
//! and off, and a close, decoded
//! from bytes (a property test's, or a fuzzer's).
//! Checked: a future resolves with its own operation's completion (its
//! slot, its kind, a status its operation can have); a future that was
//! left pending is woken before it can resolve (the adapter runs under
//! `Wakeup::Reactor`, so only the ring wakes it — or, once, the future
//! itself when it leaves its operation for a shared doorbell, which the
//! harness does not count); and once the queue pair
//! is detached, every future has resolved and every slot — dropped
//! futures' too — is back.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use rdma_ring::backend::soft::{Progress, SoftDevice, SoftQp};
use rdma_ring::backend::{QpConfig, QueuePair, WcStatus};
use rdma_ring::buf::{ExposedBuf, RemoteAccess};
use rdma_ring::fixed::{
    FixedBufs, FixedCompletion, FixedRing, FixedRingConfig, RecvFixed, WriteFixed,
};
use rdma_ring::future::{AsyncFixedRing, FixedOpFuture, Wakeup};
use rdma_ring::op::OpKind;
use rdma_ring::Error;

/// More than one poll of the ring takes (32), so a burst needs several.
const SLOTS: u32 = 40;

/// What an injected failure completes a send with.
const INJECTED: WcStatus = WcStatus::RemAccessErr;

/// One step of a run.
#[derive(Clone, Copy, Debug)]
enum Step {
    PushWrite,
    PushRecv,
    Poll(usize),
    Drop(usize),
    Submit,
    Progress,
    Drive,
    Fail,
    Coalesce(bool),
    FailQp,
    Close,
}

fn step(byte: u8) -> Step {
    let which = usize::from(byte >> 4);
    match byte % 16 {
        0..=2 => Step::PushWrite,
        3..=5 => Step::PushRecv,
        6 | 7 => Step::Poll(which),
        8 => Step::Drop(which),
        9 => Step::Submit,
        10 | 11 => Step::Progress,
        15 if byte < 0x80 => Step::Progress,
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

/// Runs the steps `bytes` decode to, and checks what the module says.
pub fn run(bytes: &[u8]) {
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
}
