//! Many pushes to one queue pair, checked once: the ring's state and the
//! queue pair's handle are looked at when the batch opens, not per push.

use super::queue::AttachedQp;
use super::ring::{attached_mut, push_onto, CqCredit};
use super::{FixedBufs, FixedOp, FixedQp, FixedRing};
use crate::backend::QueuePair;
use crate::error::{Error, Rejected};

/// Pushes to one queue pair of a [`FixedRing`], from
/// [`FixedRing::batch`]. Each [`push`](Self::push) is a
/// [`FixedRing::push`] to that queue pair, without the checks the batch
/// made once when it opened: that the ring has not failed, that the handle
/// names an attached queue pair, that the queue pair is not in error.
/// None of those can change while the batch borrows the ring. What was
/// pushed goes out with the next [`submit`](FixedRing::submit) (or
/// [`submit_qp`](FixedRing::submit_qp) of its queue pair), as any push
/// does; dropping the batch (or forgetting it) loses nothing.
///
/// ```
/// # use rdma_ring::backend::{soft::SoftDevice, QpConfig, QueuePair};
/// # use rdma_ring::buf::{ExposedBuf, RemoteAccess};
/// # use rdma_ring::fixed::*;
/// # let dev = SoftDevice::new();
/// # let pd = dev.alloc_pd();
/// # let (mut qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
/// # let control = qp.control();
/// # let target = ExposedBuf::new(&pd, vec![0u8; 64], RemoteAccess::WRITE).unwrap();
/// # let cq = qp.take_cq().unwrap();
/// let mut ring = FixedRing::new(cq, FixedBufs::new(&pd, 4, 64).unwrap(), FixedRingConfig::default());
/// let conn = ring.attach(qp).unwrap();
/// let slots: Vec<FixedBuf> = std::iter::from_fn(|| ring.take_buf()).collect();
/// let mut batch = ring.batch(conn).unwrap();
/// for (i, slot) in slots.into_iter().enumerate() {
///     batch.push(WriteFixed::new(slot, 16, target.remote()).user_data(i as u64)).unwrap();
/// }
/// assert_eq!(batch.pushed(), 4);
/// assert_eq!(ring.submit().unwrap(), 4);
/// assert_eq!(control.counters().send_posts, 1); // one doorbell for the four
/// ```
pub struct PushBatch<'a, Q: QueuePair> {
    slot: &'a mut AttachedQp<Q>,
    bufs: &'a FixedBufs,
    cq_free: &'a mut usize,
    cq_entries: usize,
    pushed: usize,
}

impl<Q: QueuePair> FixedRing<Q> {
    /// Opens a batch of pushes to `qp` ([`PushBatch`]): the ring's and
    /// the queue pair's state are checked here, once, instead of at each
    /// push. Fails as [`push`](Self::push) would for any operation: the
    /// ring failed ([`Error::RingFailed`]), `qp` names no attached queue
    /// pair ([`Error::NotAttached`]), or the queue pair is in error
    /// ([`Error::QpInError`]).
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::SoftDevice, QpConfig, QueuePair};
    /// # use rdma_ring::fixed::*;
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// # let (mut qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    /// # let cq = qp.take_cq().unwrap();
    /// let mut ring = FixedRing::new(cq, FixedBufs::new(&pd, 4, 64).unwrap(), FixedRingConfig::default());
    /// let conn = ring.attach(qp).unwrap();
    /// let qp = ring.detach(conn).unwrap();
    /// assert!(matches!(ring.batch(conn), Err(rdma_ring::Error::NotAttached(_))));
    /// # drop(qp);
    /// ```
    pub fn batch(&mut self, qp: FixedQp) -> Result<PushBatch<'_, Q>, Error> {
        if let Some(why) = self.failed {
            return Err(Error::RingFailed(why));
        }
        let slot = attached_mut(&mut self.qps, qp)?;
        if let Some(status) = slot.error {
            return Err(Error::QpInError(status));
        }
        // Marked before anything is pushed, so that a batch forgotten
        // after its pushes still has them posted; a submit finds nothing
        // to post for a batch that pushed nothing.
        if !slot.dirty {
            slot.dirty = true;
            self.dirty.push(qp.index() as u32);
        }
        Ok(PushBatch {
            slot,
            bufs: &self.bufs,
            cq_free: &mut self.cq_free,
            cq_entries: self.cq_entries,
            pushed: 0,
        })
    }
}

impl<Q: QueuePair> PushBatch<'_, Q> {
    /// Pushes `op`, as [`FixedRing::push`] does to the batch's queue pair:
    /// a refused operation comes back whole with the reason (a full
    /// queue, a slot too short, a foreign token, …), and the batch stays
    /// open for the next.
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::SoftDevice, QpConfig, QueuePair};
    /// # use rdma_ring::buf::{ExposedBuf, RemoteAccess};
    /// # use rdma_ring::fixed::*;
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// # let (mut qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    /// # let target = ExposedBuf::new(&pd, vec![0u8; 64], RemoteAccess::WRITE).unwrap();
    /// # let cq = qp.take_cq().unwrap();
    /// let mut ring = FixedRing::new(cq, FixedBufs::new(&pd, 2, 64).unwrap(), FixedRingConfig::default());
    /// let conn = ring.attach(qp).unwrap();
    /// let (a, b) = (ring.take_buf().unwrap(), ring.take_buf().unwrap());
    /// let mut batch = ring.batch(conn).unwrap();
    /// let (error, op) = batch.push(WriteFixed::new(a, 65, target.remote())).unwrap_err().into_parts();
    /// assert!(matches!(error, rdma_ring::Error::OutOfBounds { .. }));
    /// batch.push(WriteFixed::new(b, 64, target.remote())).unwrap();
    /// batch.push(WriteFixed::new(op.into_buf(), 64, target.remote())).unwrap();
    /// assert_eq!(ring.submit().unwrap(), 2);
    /// ```
    #[inline]
    pub fn push<O: FixedOp>(&mut self, op: O) -> Result<(), Rejected<O>> {
        match self.push_with(&op, None) {
            Ok(_) => Ok(()),
            Err(error) => Err(Rejected::new(error, op)),
        }
    }

    /// [`push`](Self::push) with `tag` as the work's `user_data` in place
    /// of the operation's own, which is returned (with whether the
    /// operation is a receive), as [`FixedRing::push_tagged`] does.
    #[inline(always)]
    pub(crate) fn push_tagged<O: FixedOp>(
        &mut self,
        op: O,
        tag: u64,
    ) -> Result<(u64, bool), Rejected<O>> {
        self.push_with(&op, Some(tag))
            .map_err(|error| Rejected::new(error, op))
    }

    #[inline(always)]
    fn push_with<O: FixedOp>(&mut self, op: &O, tag: Option<u64>) -> Result<(u64, bool), Error> {
        let credit = CqCredit {
            free: self.cq_free,
            entries: self.cq_entries,
        };
        let pushed = push_onto(self.slot, self.bufs, credit, op, tag)?;
        self.pushed += 1;
        Ok(pushed)
    }

    /// How many operations this batch has pushed.
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::SoftDevice, QpConfig, QueuePair};
    /// # use rdma_ring::fixed::*;
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// # let (mut qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    /// # let cq = qp.take_cq().unwrap();
    /// let mut ring = FixedRing::new(cq, FixedBufs::new(&pd, 2, 64).unwrap(), FixedRingConfig::default());
    /// let conn = ring.attach(qp).unwrap();
    /// let slot = ring.take_buf().unwrap();
    /// let mut batch = ring.batch(conn).unwrap();
    /// assert_eq!(batch.pushed(), 0);
    /// batch.push(RecvFixed::new(slot)).unwrap();
    /// assert_eq!(batch.pushed(), 1);
    /// ```
    pub fn pushed(&self) -> usize {
        self.pushed
    }

    /// The queue pair this batch pushes to.
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::SoftDevice, QpConfig, QueuePair};
    /// # use rdma_ring::fixed::*;
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// # let (mut qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    /// # let cq = qp.take_cq().unwrap();
    /// let mut ring = FixedRing::new(cq, FixedBufs::new(&pd, 2, 64).unwrap(), FixedRingConfig::default());
    /// let conn = ring.attach(qp).unwrap();
    /// assert_eq!(ring.batch(conn).unwrap().qp(), conn);
    /// ```
    pub fn qp(&self) -> FixedQp {
        self.slot.handle
    }
}

impl<Q: QueuePair> std::fmt::Debug for PushBatch<'_, Q> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PushBatch")
            .field("qp", &self.slot.handle)
            .field("pushed", &self.pushed)
            .finish()
    }
}
