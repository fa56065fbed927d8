//! [`LockedRing`]: the ring lent by an [`AsyncRing`](crate::future::AsyncRing).

use std::fmt;

use crate::backend::QueuePair;
use crate::ring::Ring;

/// A ring shared by an [`AsyncRing`](crate::future::AsyncRing), lent by [`AsyncRing::with_ring`](crate::future::AsyncRing::with_ring)
/// while its lock is held. It reads as a `&Ring` and hands out the
/// submission and completion sides; it never hands out `&mut Ring`, which
/// would let safe code swap the ring out from under pending futures.
///
/// Swapping two lent rings does not compile:
///
/// ```compile_fail
/// # use rdma_ring::backend::{soft::SoftDevice, QpConfig};
/// # use rdma_ring::future::{AsyncRing, Wakeup};
/// # use rdma_ring::ring::{Ring, RingConfig};
/// # let dev = SoftDevice::new();
/// # let pd = dev.alloc_pd();
/// # let (qa, qb) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
/// let a = AsyncRing::new(Ring::new(qa, RingConfig::default()), Wakeup::Busy).unwrap();
/// let b = AsyncRing::new(Ring::new(qb, RingConfig::default()), Wakeup::Busy).unwrap();
/// a.with_ring(|mut ra| b.with_ring(|mut rb| std::mem::swap(&mut *ra, &mut *rb)));
/// ```
pub struct LockedRing<'a, Q: QueuePair> {
    pub(super) ring: &'a mut Ring<Q>,
    /// The adapter's count of coalesced operations waiting for a
    /// doorbell, which a submit here posts.
    pub(super) deferred: &'a std::sync::atomic::AtomicUsize,
}

impl<Q: QueuePair> LockedRing<'_, Q> {
    /// The submission side: push operations whose completions go to the
    /// [`CompletionStream`](crate::future::CompletionStream) (or to [`completion`](Self::completion)).
    ///
    /// What is pushed here goes out at the next submit: yours
    /// ([`submit`](Self::submit), which hands back what the device
    /// refuses), or one the adapter makes for an awaited operation. What
    /// the device refuses at the adapter's submit comes back through the
    /// completion stream as flushed at once, so it can come out ahead of
    /// completions of work its queue pair posted before it (a device
    /// refuses part of a post only when it is out of room or failing).
    pub fn submission(&mut self) -> crate::ring::SubmissionQueue<'_, Q> {
        self.ring.submission()
    }

    /// The submission side for queue pair `qp`.
    pub fn submission_on(
        &mut self,
        qp: crate::ring::QpHandle,
    ) -> crate::ring::SubmissionQueue<'_, Q> {
        self.ring.submission_on(qp)
    }

    /// The submission side of shared receive queue `srq`.
    pub fn srq_submission(
        &mut self,
        srq: crate::ring::SrqHandle,
    ) -> crate::ring::SrqSubmission<'_, Q> {
        self.ring.srq_submission(srq)
    }

    /// Posts everything pushed since the last submit, on every queue.
    pub fn submit(&mut self) -> Result<usize, crate::ring::SubmitError> {
        // What waited for a doorbell goes out now: no future need wait a
        // round of the executor for it.
        self.deferred.store(0, std::sync::atomic::Ordering::Release);
        self.ring.submit()
    }

    /// Detaches queue pair `qp` (see [`Ring::detach`]), draining it with
    /// the ring locked.
    pub fn detach(
        &mut self,
        qp: crate::ring::QpHandle,
    ) -> Result<crate::ring::Detached<Q>, crate::Error> {
        self.ring.detach(qp)
    }

    /// Arms a shared receive queue's low-water event (see
    /// [`Ring::arm_srq_limit`]).
    pub fn arm_srq_limit(
        &mut self,
        srq: crate::ring::SrqHandle,
        limit: u32,
    ) -> Result<(), crate::Error> {
        self.ring.arm_srq_limit(srq, limit)
    }

    /// Keeps a shared receive queue topped up (see [`Ring::set_srq_refill`]).
    pub fn set_srq_refill(
        &mut self,
        srq: crate::ring::SrqHandle,
        refill: Option<crate::ring::SrqRefill>,
    ) -> Result<(), crate::Error> {
        self.ring.set_srq_refill(srq, refill)
    }

    /// Takes a shared receive queue into the ring (see [`Ring::add_srq`]).
    pub fn add_srq(
        &mut self,
        srq: <Q as QueuePair>::Srq,
    ) -> Result<crate::ring::SrqHandle, crate::Rejected<<Q as QueuePair>::Srq>> {
        self.ring.add_srq(srq)
    }

    /// Reads the device's events from `source` (see [`Ring::watch_events`]).
    pub fn watch_events(&mut self, source: impl crate::backend::AsyncEventSource + 'static) {
        self.ring.watch_events(source)
    }

    /// The default queue pair's handle (see [`Ring::default_qp`]).
    pub fn default_qp(&self) -> Option<crate::ring::QpHandle> {
        self.ring.default_qp()
    }

    /// Moves a queue pair to error (see [`Ring::fail_qp`]).
    pub fn fail_qp(&mut self, qp: crate::ring::QpHandle) -> Result<(), crate::Error> {
        self.ring.fail_qp(qp)
    }

    /// Reads device events now (see [`Ring::poll_events`]).
    pub fn poll_events(&mut self) -> Result<usize, crate::Error> {
        self.ring.poll_events()
    }

    /// The next device event the ring has seen.
    pub fn next_event(&mut self) -> Option<crate::backend::AsyncEvent> {
        self.ring.next_event()
    }

    /// The completion side, for operations pushed through
    /// [`submission`](Self::submission). Awaited operations are not
    /// reaped here: their CQEs go to their futures.
    pub fn completion(&mut self) -> crate::ring::CompletionQueue<'_, Q> {
        self.ring.completion()
    }
}

impl<Q: QueuePair> std::ops::Deref for LockedRing<'_, Q> {
    type Target = Ring<Q>;
    fn deref(&self) -> &Ring<Q> {
        self.ring
    }
}

impl<Q: QueuePair> fmt::Debug for LockedRing<'_, Q> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.ring.fmt(f)
    }
}
