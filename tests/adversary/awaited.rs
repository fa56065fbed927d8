//! The awaited ring (`AsyncRing`) over the adversarial device: each
//! operation pushed through a future, which posts it at once (a doorbell
//! of its own for one work request, so a device that takes part of a post
//! takes none of it, and refuses that operation alone), polled a round at
//! a time, and some dropped unawaited; the peers send to the ring's
//! receives. What a future hands back, refused at its post or
//! completed, is poisoned and kept: the device must never write it after.
//! No future may resolve twice (the futures enforce that by construction:
//! one resolved is dropped here), and every operation must resolve, be
//! dropped, or be counted as leaked.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use rdma_ring::buf::RegisteredBuf;
use rdma_ring::future::{AsyncRing, OpFuture, Wakeup};
use rdma_ring::op::{Read, Recv, Send, Write};
use rdma_ring::ring::{QpHandle, RingConfig};

use super::device::{Device, RingStep};
use super::{bury, check_graveyard, check_losses, ring_over_device, AdvQp, Step, LEN};

type Awaited = OpFuture<AdvQp, RegisteredBuf>;

/// The awaited ring over the adversary, its futures, and the graveyard.
pub struct AwaitedAdversary {
    pub device: Device,
    /// Taken at the end: the ring counts the buffers of operations the
    /// device never gave back as leaked when it is dropped.
    ring: Option<AsyncRing<AdvQp>>,
    handles: Vec<QpHandle>,
    next_id: u64,
    /// Futures not yet resolved, with their operation's id and kind.
    futures: Vec<(u64, u8, Awaited)>,
    /// A knob set by a submit step waits for the next push: each push
    /// posts at once.
    knob_armed: bool,
    graveyard: Vec<RegisteredBuf>,
    leaked_before: u64,
    /// Held for the run: the leak count it reads is the process's.
    _counting: std::sync::MutexGuard<'static, ()>,
    /// What happened, for coverage reports.
    pub pushed: usize,
    pub refused_at_once: usize,
    pub resolved: usize,
    pub dropped: usize,
    /// READs and receives that completed: the device wrote their buffers
    /// before handing them back, and must not after.
    pub written_ok: usize,
}

impl AwaitedAdversary {
    pub fn new() -> AwaitedAdversary {
        let counting = super::leak_counting();
        let (device, ring, handles) = ring_over_device(RingConfig::default());
        AwaitedAdversary {
            leaked_before: rdma_ring::leak::leaked().buffers,
            _counting: counting,
            device,
            ring: Some(AsyncRing::new(ring, Wakeup::Busy).unwrap_or_else(|_| panic!("idle"))),
            handles,
            next_id: 1,
            futures: Vec::new(),
            knob_armed: false,
            graveyard: Vec::new(),
            pushed: 0,
            refused_at_once: 0,
            resolved: 0,
            dropped: 0,
            written_ok: 0,
        }
    }

    pub fn run(steps: &[Step]) -> AwaitedAdversary {
        let mut adversary = AwaitedAdversary::new();
        for step in steps {
            adversary.apply(step);
        }
        adversary.finish();
        adversary
    }

    fn ring(&self) -> &AsyncRing<AdvQp> {
        self.ring
            .as_ref()
            .expect("the ring lives until the run's end")
    }

    /// Buffers handed back and checked for late writes.
    pub fn buried(&self) -> usize {
        self.graveyard.len()
    }

    fn apply(&mut self, step: &Step) {
        match self.device.apply(step) {
            RingStep::None => {}
            RingStep::Push { qp, kind, signaled } => self.push(qp, kind, signaled),
            RingStep::Submit => {
                // Nothing waits for a doorbell (no coalescing): the knob,
                // if any, bends the next push's post.
                if let Err(e) = self.ring().submit() {
                    assert!(
                        e.unposted.is_empty(),
                        "an awaited operation came back as unposted"
                    );
                }
                self.knob_armed = true;
            }
            RingStep::Poll => self.poll_all(),
            // The ring's receives need messages to take: a peer sends.
            RingStep::Reattach(qp) => self.device.peer_send(qp),
            RingStep::Fatal(qp) | RingStep::FailQp(qp) => {
                self.device.apply(&Step::PeerRecv(qp));
            }
            RingStep::SrqRecv | RingStep::SrqRefill | RingStep::SrqQp(_) => {
                unreachable!("no shared receive queue")
            }
        }
    }

    fn push(&mut self, qp: usize, kind: u8, keep: bool) {
        let id = self.next_id;
        self.next_id += 1;
        let target = self.device.target();
        let buf = RegisteredBuf::new(&self.device.pd, vec![(id as u8) | 1; LEN]).unwrap();
        let qp = self.ring().qp(self.handles[qp]);
        let future = match kind {
            0 => qp.op(Write::new(buf, target)),
            1 => qp.op(Read::new(buf, target)),
            2 => qp.op(Send::new(buf)),
            _ => qp.op(Recv::new(buf)),
        };
        if std::mem::take(&mut self.knob_armed) {
            self.device.after_submit();
        }
        self.pushed += 1;
        if future.was_refused() {
            // Nothing was posted: it resolves at once, buffer and all.
            self.refused_at_once += 1;
            self.futures.push((id, kind, future));
            let resolved = self.poll_one(self.futures.len() - 1);
            assert!(resolved, "a refused future must resolve at once");
        } else if keep || id % 3 != 0 {
            self.futures.push((id, kind, future));
        } else {
            // Dropped unawaited: the ring releases its buffer once the
            // device is done with it.
            drop(future);
            self.dropped += 1;
        }
    }

    /// Polls future `at` once; resolved, it is buried and removed.
    fn poll_one(&mut self, at: usize) -> bool {
        let mut cx = Context::from_waker(Waker::noop());
        match Pin::new(&mut self.futures[at].2).poll(&mut cx) {
            Poll::Ready((result, buf)) => {
                let (id, kind, _) = self.futures.swap_remove(at);
                match kind {
                    // Read by the device, never written: still its own.
                    0 | 2 => assert!(
                        buf.iter().all(|&b| b == (id as u8) | 1),
                        "operation {id} came back with another's buffer"
                    ),
                    _ if result.is_ok() => self.written_ok += 1,
                    _ => {}
                }
                self.resolved += 1;
                bury(&mut self.graveyard, buf);
                true
            }
            Poll::Pending => false,
        }
    }

    fn poll_all(&mut self) {
        let mut at = 0;
        while at < self.futures.len() {
            if !self.poll_one(at) {
                at += 1;
            }
        }
        self.device.peers_reap();
    }

    fn finish(&mut self) {
        // A knob no push used would bend the close's marker instead.
        if std::mem::take(&mut self.knob_armed) {
            self.device.after_submit();
        }
        self.device.settle();
        self.poll_all();
        // Close: every pending future resolves flushed, unless the device
        // never gives its operation back (then it is leaked).
        self.ring().close();
        self.poll_all();
        let pending = std::mem::take(&mut self.futures);
        let unresolved = pending.len();
        drop(pending);
        // The last handle: what the device kept (operations it never gave
        // back, their futures pending until dropped above) is counted now.
        drop(self.ring.take());
        self.device.run_dry();
        check_graveyard(&self.graveyard);
        self.device.check_peers_saw_no_poison();
        let leaked = (rdma_ring::leak::leaked().buffers - self.leaked_before) as usize;
        check_losses(unresolved, leaked, self.device.untaken());
    }
}

impl Default for AwaitedAdversary {
    fn default() -> Self {
        AwaitedAdversary::new()
    }
}
