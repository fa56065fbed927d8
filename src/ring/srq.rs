//! Shared receive queues held by a ring: pushing receives to them, their
//! credits, the low-water mark, and refilling them from a buffer pool.

use std::collections::VecDeque;

use super::lifecycle::Owner;
use super::submission::Posting;
use super::{InFlight, Key, QueueRef, Ring, SrqHandle};
use crate::backend::{
    PostError, QueuePair, RecvWr, Sge, SgeSpan, SharedReceiveQueue, SrqCaps, SrqId,
};
use crate::buf::{BufferPool, IoBufMut};
use crate::error::{Error, Rejected};
use crate::op::{Limits, Operation, Recv};

/// Keeps a shared receive queue topped up from a [`BufferPool`]: after
/// reaping, whenever fewer than `low` receives are posted, the ring pushes
/// pool chunks until `target` are (or the pool runs dry), and posts them
/// with one doorbell. Their completions arrive like any other receive, with
/// `user_data`; dropping a completion's buffer returns the chunk to the
/// pool. `low` is at least 1 and at most `target`, which is at most the
/// queue's depth. A post of the refill's that the device refuses hands
/// its receives back flushed (their chunks go home once the completions
/// are dropped), and the refill tries again at the next reap below the
/// mark: a queue that refuses for a while takes receives again after.
///
/// ```
/// use rdma_ring::ring::SrqRefill;
/// # use rdma_ring::backend::soft::SoftDevice;
/// # use rdma_ring::buf::BufferPool;
/// # let pd = SoftDevice::new().alloc_pd();
/// let pool = BufferPool::new(&pd, 4096, 256).unwrap();
/// let refill = SrqRefill { pool, low: 64, target: 192, user_data: u64::MAX };
/// assert!(refill.low < refill.target);
/// ```
#[derive(Clone, Debug)]
pub struct SrqRefill {
    /// Where the receive buffers come from.
    pub pool: BufferPool,
    /// Refill when fewer than this many receives are posted.
    pub low: usize,
    /// Refill up to this many.
    pub target: usize,
    /// The tag of the refill receives' completions.
    pub user_data: u64,
}

pub(super) struct SrqSlot<S> {
    pub(super) srq: S,
    pub(super) caps: SrqCaps,
    pub(super) pending: Vec<RecvWr>,
    pub(super) sges: Vec<Sge>,
    /// Receives posted and not yet completed.
    pub(super) outstanding: usize,
    pub(super) dirty: bool,
    pub(super) refill: Option<SrqRefill>,
    pub(super) doorbells: u64,
    /// Numbers of queue pairs on it that are not attached: detached from
    /// it (`true`), or announced before attaching (the latest
    /// [`FORMER_KEPT`]). A receive one of them took may be reported.
    former: VecDeque<(u32, bool)>,
}

/// Detached queue pairs' numbers a shared receive queue remembers.
const FORMER_KEPT: usize = 1024;

impl<S> SrqSlot<S> {
    fn slab_share(&self) -> usize {
        2 * self.caps.max_wr as usize
    }

    /// Queue pair `qpn` takes its receives from this queue: its number
    /// names it now, not a former holder of the number. Returns whether
    /// a queue pair detached from this queue had the number (whose late
    /// flushes may still come, naming it).
    pub(super) fn join(&mut self, qpn: u32) -> bool {
        let reused = self
            .former
            .iter()
            .any(|&(n, detached)| n == qpn && detached);
        self.former.retain(|&(n, _)| n != qpn);
        reused
    }

    /// Queue pair `qpn`, detached, may still have taken receives of this
    /// queue.
    pub(super) fn leave(&mut self, qpn: u32) {
        self.remember(qpn, true);
    }

    /// Queue pair `qpn` will take receives from this queue before it is
    /// attached (remembered once, however often announced, and as a
    /// former holder's number if it was one).
    pub(super) fn announce(&mut self, qpn: u32) {
        let reused = self.join(qpn);
        self.remember(qpn, reused);
    }

    fn remember(&mut self, qpn: u32, detached: bool) {
        if self.former.len() == FORMER_KEPT {
            self.former.pop_front();
        }
        self.former.push_back((qpn, detached));
    }

    /// Whether queue pair `qpn` is on this queue without being attached.
    pub(super) fn had(&self, qpn: u32) -> bool {
        self.former.iter().any(|&(n, _)| n == qpn)
    }

    /// Queue pair `qpn`, detached, takes no more receives from this queue.
    fn forget(&mut self, qpn: u32) {
        self.former.retain(|&(n, _)| n != qpn);
    }
}

impl<Q: QueuePair> Ring<Q> {
    /// A detached queue pair's last receive has completed
    /// ([`AsyncEvent::LastWqeReached`](crate::backend::AsyncEvent::LastWqeReached)):
    /// reaps what is queued while its number still names a receiver, then
    /// forgets the number.
    pub(super) fn last_receive_of_former(&mut self, qpn: u32) {
        let known = self
            .srqs
            .keys()
            .into_iter()
            .any(|k| self.srqs.get(k).is_some_and(|s| s.had(qpn)));
        if !known {
            return;
        }
        if self.failed.is_none() {
            self.reap_queued();
        }
        for k in self.srqs.keys() {
            if let Some(slot) = self.srqs.get_mut(k) {
                slot.forget(qpn);
            }
        }
    }
}

/// The submission side of one of a ring's shared receive queues: it takes
/// receives only.
///
/// ```
/// use rdma_ring::backend::soft::SoftDevice;
/// use rdma_ring::backend::SrqConfig;
/// use rdma_ring::buf::RegisteredBuf;
/// use rdma_ring::op::Recv;
/// use rdma_ring::ring::{Ring, RingConfig};
/// # use rdma_ring::backend::soft::SoftQp;
/// let dev = SoftDevice::new();
/// let pd = dev.alloc_pd();
/// let mut ring: Ring<SoftQp> = Ring::with_cq(dev.create_cq(256).unwrap(), RingConfig::default());
/// let srq = ring.add_srq(dev.create_srq(&pd, SrqConfig::default()).unwrap()).unwrap();
/// let buf = RegisteredBuf::new(&pd, vec![0u8; 1024]).unwrap();
/// ring.srq_submission(srq).push(Recv::new(buf)).unwrap();
/// ring.submit().unwrap();
/// assert_eq!(ring.srq_posted(srq), Some(1));
/// ```
pub struct SrqSubmission<'a, Q: QueuePair> {
    ring: &'a mut Ring<Q>,
    srq: Option<Key>,
}

impl<Q: QueuePair> SrqSubmission<'_, Q> {
    /// Pushes a receive, to be posted by the next submit. Refused, with the
    /// receive back, when the queue is full or the buffers do not fit it.
    pub fn push<B: IoBufMut>(&mut self, op: Recv<B>) -> Result<(), Rejected<Recv<B>>> {
        let Some(srq) = self.srq else {
            return Err(Rejected::new(
                Error::NotAttached("shared receive queue"),
                op,
            ));
        };
        self.ring.push_srq(srq, op, Owner::Queue).map(|_| ())
    }

    /// Posts everything pushed since the last submit, on every queue of
    /// the ring (see [`Ring::submit`]).
    pub fn submit(&mut self) -> Result<usize, super::SubmitError> {
        self.ring.submit_all()
    }

    /// Receives that may be pushed now.
    pub fn room(&self) -> usize {
        self.srq.map_or(0, |k| self.ring.srq_room_at(k))
    }
}

impl<Q: QueuePair> Ring<Q> {
    /// Takes `srq` into the ring: queue pairs created on it may then be
    /// attached, and receives pushed to it with
    /// [`srq_submission`](Self::srq_submission). The ring destroys it at
    /// teardown, after its queue pairs, and only then hands back the
    /// receives still posted (flushed).
    ///
    /// ```
    /// # use rdma_ring::backend::soft::{SoftDevice, SoftQp};
    /// # use rdma_ring::backend::SrqConfig;
    /// # use rdma_ring::ring::{Ring, RingConfig};
    /// use rdma_ring::backend::SharedReceiveQueue;
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// let mut ring: Ring<SoftQp> = Ring::with_cq(dev.create_cq(256).unwrap(), RingConfig::default());
    /// let srq = dev.create_srq(&pd, SrqConfig { max_wr: 64, max_sge: 1 }).unwrap();
    /// let handle = ring.add_srq(srq).unwrap();
    /// assert_eq!(ring.srq(handle).unwrap().caps().max_wr, 64);
    /// // The ring counts its credits from now on.
    /// assert_eq!(ring.srq_submission(handle).room(), 64);
    /// ```
    pub fn add_srq(&mut self, srq: Q::Srq) -> Result<SrqHandle, Rejected<Q::Srq>> {
        if self.closed {
            return Err(Rejected::new(Error::Closed, srq));
        }
        let caps = srq.caps();
        if self.srq_key_by_id(caps.id).is_some() {
            return Err(Rejected::new(
                Error::Incompatible("this shared receive queue is already held"),
                srq,
            ));
        }
        let slot = SrqSlot {
            srq,
            caps,
            pending: Vec::with_capacity(caps.max_wr as usize),
            sges: Vec::with_capacity(caps.max_wr as usize),
            outstanding: 0,
            dirty: false,
            refill: None,
            doorbells: 0,
            former: VecDeque::new(),
        };
        self.reserve_slots(slot.slab_share());
        if self.srqs.len() == self.srqs.capacity() {
            self.srqs.grow(self.srqs.capacity().max(2));
        }
        let key = self.srqs.insert(slot).expect("grown above");
        Ok(SrqHandle { ring: self.id, key })
    }

    /// The handles of every shared receive queue the ring holds.
    ///
    /// ```
    /// # use rdma_ring::backend::soft::{SoftDevice, SoftQp};
    /// # use rdma_ring::backend::SrqConfig;
    /// # use rdma_ring::ring::{Ring, RingConfig};
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// let mut ring: Ring<SoftQp> = Ring::with_cq(dev.create_cq(256).unwrap(), RingConfig::default());
    /// let a = ring.add_srq(dev.create_srq(&pd, SrqConfig::default()).unwrap()).unwrap();
    /// let b = ring.add_srq(dev.create_srq(&pd, SrqConfig::default()).unwrap()).unwrap();
    /// let held = ring.srqs();
    /// assert_eq!(held.len(), 2);
    /// assert!(held.contains(&a) && held.contains(&b));
    /// ```
    pub fn srqs(&self) -> Vec<SrqHandle> {
        self.srqs
            .keys()
            .into_iter()
            .map(|key| SrqHandle { ring: self.id, key })
            .collect()
    }

    /// A shared receive queue the ring holds (create queue pairs on it).
    ///
    /// ```
    /// # use rdma_ring::backend::soft::{SoftDevice, SoftQp};
    /// # use rdma_ring::backend::SrqConfig;
    /// # use rdma_ring::ring::{Ring, RingConfig};
    /// use rdma_ring::backend::{QpConfig, QueuePair, SharedReceiveQueue};
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// let mut ring: Ring<SoftQp> = Ring::with_cq(dev.create_cq(256).unwrap(), RingConfig::default());
    /// let srq = ring.add_srq(dev.create_srq(&pd, SrqConfig::default()).unwrap()).unwrap();
    /// let qp = dev.create_qp_on(&pd, ring.cq(), ring.srq(srq), QpConfig::default()).unwrap();
    /// assert_eq!(qp.caps().srq, Some(ring.srq(srq).unwrap().caps().id));
    /// ```
    pub fn srq(&self, srq: SrqHandle) -> Option<&Q::Srq> {
        self.srq_key(srq)
            .and_then(|k| self.srqs.get(k))
            .map(|slot| &slot.srq)
    }

    /// The submission side of shared receive queue `srq`. A handle this ring
    /// does not hold makes every push fail, handing the receive back.
    ///
    /// ```
    /// # use rdma_ring::backend::soft::{SoftDevice, SoftQp};
    /// # use rdma_ring::backend::SrqConfig;
    /// # use rdma_ring::ring::{Ring, RingConfig};
    /// # use rdma_ring::buf::RegisteredBuf;
    /// # use rdma_ring::op::Recv;
    /// use rdma_ring::Error;
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// let mut a: Ring<SoftQp> = Ring::with_cq(dev.create_cq(64).unwrap(), RingConfig::default());
    /// let mut b: Ring<SoftQp> = Ring::with_cq(dev.create_cq(64).unwrap(), RingConfig::default());
    /// let srq = a.add_srq(dev.create_srq(&pd, SrqConfig::default()).unwrap()).unwrap();
    /// let buf = RegisteredBuf::new(&pd, vec![0u8; 256]).unwrap();
    /// // The handle is ring `a`'s, so ring `b` hands the receive back.
    /// let refused = b.srq_submission(srq).push(Recv::new(buf)).unwrap_err();
    /// assert!(matches!(refused.error(), Error::NotAttached(_)));
    /// a.srq_submission(srq).push(refused.into_value()).unwrap();
    /// ```
    pub fn srq_submission(&mut self, srq: SrqHandle) -> SrqSubmission<'_, Q> {
        let srq = self.srq_key(srq);
        SrqSubmission { ring: self, srq }
    }

    /// Announces queue pair number `qp_num`, made on shared receive queue
    /// `srq` and not attached yet (connected first, say, and attached
    /// once its handshake is done). A receive of the queue is handed back
    /// only on a completion naming a queue pair on that queue: attached,
    /// detached from it, or announced here. Any other number may be a
    /// queue pair on another ring's queue whose `wr_id` only looks like
    /// one of ours, while our receive is still posted, so such a
    /// completion is reported ([`Error::UnknownWrId`]) and not acted on;
    /// a receive a queue pair took before it was attached or announced
    /// stays counted as posted until the queue is removed. The latest
    /// 1024 numbers announced or detached are remembered, each until the
    /// device says that queue pair took its last receive
    /// ([`AsyncEvent::LastWqeReached`](crate::backend::AsyncEvent::LastWqeReached)).
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::SoftDevice, QpConfig, SrqConfig};
    /// # use rdma_ring::ring::{Ring, RingConfig};
    /// let dev = SoftDevice::new();
    /// let pd = dev.alloc_pd();
    /// let mut ring = Ring::with_cq(dev.create_cq(64).unwrap(), RingConfig::default());
    /// let srq = ring.add_srq(dev.create_srq(&pd, SrqConfig::default()).unwrap()).unwrap();
    /// let qp = dev.create_qp_on(&pd, ring.cq(), ring.srq(srq), QpConfig::default()).unwrap();
    /// ring.expect_on_srq(srq, qp.qpn()).unwrap();
    /// // ... connect it, and let it take receives; then:
    /// ring.attach(qp).unwrap();
    /// ```
    pub fn expect_on_srq(&mut self, srq: SrqHandle, qp_num: u32) -> Result<(), Error> {
        let key = self
            .srq_key(srq)
            .ok_or(Error::NotAttached("shared receive queue"))?;
        if self.by_qpn.contains_key(&qp_num) {
            // Attached: its number already names it.
            return Ok(());
        }
        self.srqs
            .get_mut(key)
            .expect("found above")
            .announce(qp_num);
        Ok(())
    }

    /// Receives posted to `srq` and not yet consumed (pushed ones not
    /// counted).
    ///
    /// ```
    /// # use rdma_ring::backend::soft::{SoftDevice, SoftQp};
    /// # use rdma_ring::backend::SrqConfig;
    /// # use rdma_ring::ring::{Ring, RingConfig};
    /// # use rdma_ring::buf::RegisteredBuf;
    /// # use rdma_ring::op::Recv;
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// let mut ring: Ring<SoftQp> = Ring::with_cq(dev.create_cq(64).unwrap(), RingConfig::default());
    /// let srq = ring.add_srq(dev.create_srq(&pd, SrqConfig::default()).unwrap()).unwrap();
    /// let buf = RegisteredBuf::new(&pd, vec![0u8; 256]).unwrap();
    /// ring.srq_submission(srq).push(Recv::new(buf)).unwrap();
    /// assert_eq!(ring.srq_posted(srq), Some(0));
    /// ring.submit().unwrap();
    /// assert_eq!(ring.srq_posted(srq), Some(1));
    /// ```
    pub fn srq_posted(&self, srq: SrqHandle) -> Option<usize> {
        self.srq_key(srq)
            .and_then(|k| self.srqs.get(k))
            .map(|slot| slot.outstanding)
    }

    /// Arms `srq`'s low-water event: when fewer than `limit` receives remain
    /// posted, the device raises
    /// [`AsyncEvent::SrqLimitReached`](crate::backend::AsyncEvent::SrqLimitReached)
    /// once (see [`Ring::watch_events`]).
    ///
    /// ```
    /// # use rdma_ring::backend::soft::{SoftDevice, SoftQp};
    /// # use rdma_ring::backend::SrqConfig;
    /// # use rdma_ring::ring::{Ring, RingConfig};
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// let mut ring: Ring<SoftQp> = Ring::with_cq(dev.create_cq(64).unwrap(), RingConfig::default());
    /// let config = SrqConfig { max_wr: 256, max_sge: 1 };
    /// let srq = ring.add_srq(dev.create_srq(&pd, config).unwrap()).unwrap();
    /// ring.arm_srq_limit(srq, 16).unwrap();
    /// assert_eq!(ring.srq(srq).unwrap().limit(), 16);
    /// // A mark above the queue's depth could never be crossed.
    /// assert!(ring.arm_srq_limit(srq, 257).is_err());
    /// ```
    pub fn arm_srq_limit(&mut self, srq: SrqHandle, limit: u32) -> Result<(), Error> {
        let key = self
            .srq_key(srq)
            .ok_or(Error::NotAttached("shared receive queue"))?;
        self.srqs
            .get_mut(key)
            .expect("checked")
            .srq
            .arm_limit(limit)
    }

    /// Keeps `srq` topped up from a pool (see [`SrqRefill`]); `None` stops.
    /// The first top-up happens at once.
    ///
    /// ```
    /// # use rdma_ring::backend::soft::{SoftDevice, SoftQp};
    /// # use rdma_ring::backend::SrqConfig;
    /// # use rdma_ring::ring::{Ring, RingConfig};
    /// use rdma_ring::buf::BufferPool;
    /// use rdma_ring::ring::SrqRefill;
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// let mut ring: Ring<SoftQp> = Ring::with_cq(dev.create_cq(64).unwrap(), RingConfig::default());
    /// let srq = ring.add_srq(dev.create_srq(&pd, SrqConfig::default()).unwrap()).unwrap();
    /// let pool = BufferPool::new(&pd, 1024, 32).unwrap();
    /// let refill = SrqRefill { pool, low: 8, target: 16, user_data: 0 };
    /// ring.set_srq_refill(srq, Some(refill)).unwrap();
    /// assert_eq!(ring.srq_posted(srq), Some(16));
    /// assert_eq!(ring.srq_doorbells(srq), Some(1));
    /// ```
    pub fn set_srq_refill(
        &mut self,
        srq: SrqHandle,
        refill: Option<SrqRefill>,
    ) -> Result<(), Error> {
        let key = self
            .srq_key(srq)
            .ok_or(Error::NotAttached("shared receive queue"))?;
        let slot = self.srqs.get_mut(key).expect("checked");
        if let Some(refill) = &refill {
            if refill.low == 0 || refill.low > refill.target {
                return Err(Error::Incompatible(
                    "a refill's low-water mark must be at least 1 and at most its target",
                ));
            }
            if refill.target > slot.caps.max_wr as usize {
                return Err(Error::Incompatible(
                    "a refill's target is deeper than the shared receive queue",
                ));
            }
        }
        slot.refill = refill;
        self.refill_srqs();
        Ok(())
    }

    /// Doorbells rung on `srq` so far.
    ///
    /// ```
    /// # use rdma_ring::backend::soft::{SoftDevice, SoftQp};
    /// # use rdma_ring::backend::SrqConfig;
    /// # use rdma_ring::ring::{Ring, RingConfig};
    /// # use rdma_ring::buf::RegisteredBuf;
    /// # use rdma_ring::op::Recv;
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// let mut ring: Ring<SoftQp> = Ring::with_cq(dev.create_cq(64).unwrap(), RingConfig::default());
    /// let srq = ring.add_srq(dev.create_srq(&pd, SrqConfig::default()).unwrap()).unwrap();
    /// for _ in 0..4 {
    ///     let buf = RegisteredBuf::new(&pd, vec![0u8; 256]).unwrap();
    ///     ring.srq_submission(srq).push(Recv::new(buf)).unwrap();
    /// }
    /// ring.submit().unwrap();
    /// ring.submit().unwrap(); // nothing pushed: no doorbell
    /// assert_eq!(ring.srq_doorbells(srq), Some(1));
    /// ```
    pub fn srq_doorbells(&self, srq: SrqHandle) -> Option<u64> {
        self.srq_key(srq)
            .and_then(|k| self.srqs.get(k))
            .map(|slot| slot.doorbells)
    }

    fn srq_key(&self, srq: SrqHandle) -> Option<Key> {
        (srq.ring == self.id && self.srqs.get(srq.key).is_some()).then_some(srq.key)
    }

    pub(super) fn srq_key_by_id(&self, id: SrqId) -> Option<Key> {
        self.srqs
            .keys()
            .into_iter()
            .find(|k| self.srqs.get(*k).is_some_and(|slot| slot.caps.id == id))
    }

    pub(super) fn srqs_share(&self) -> usize {
        self.srqs
            .keys()
            .into_iter()
            .filter_map(|k| self.srqs.get(k))
            .map(|slot| slot.slab_share())
            .sum()
    }

    pub(super) fn srq_room_at(&self, srq: Key) -> usize {
        self.srqs.get(srq).map_or(0, |slot| {
            (slot.caps.max_wr as usize)
                .saturating_sub(slot.outstanding + slot.pending.len())
                .min(self.cqe_room())
        })
    }

    /// Pushes a receive to shared receive queue `srq` for `owner`.
    pub(super) fn push_srq<T: Operation>(
        &mut self,
        srq: Key,
        op: T,
        owner: Owner,
    ) -> Result<Key, Rejected<T>> {
        if self.closed {
            return Err(Rejected::new(Error::Closed, op));
        }
        if let Some(why) = self.failed {
            return Err(Rejected::new(Error::RingFailed(why), op));
        }
        let slot = self.srqs.get(srq).expect("a live shared receive queue");
        let posted = slot.outstanding + slot.pending.len();
        if posted >= slot.caps.max_wr as usize {
            return Err(Rejected::new(
                Error::RecvQueueFull {
                    outstanding: posted,
                    depth: slot.caps.max_wr as usize,
                },
                op,
            ));
        }
        if let Some(error) = self.cq_credit_error() {
            return Err(Rejected::new(error, op));
        }
        if let Err(error) = op.check(&Limits::srq(&slot.caps)) {
            return Err(Rejected::new(error, op));
        }
        let slot = self.srqs.get_mut(srq).expect("live");
        let start = slot.sges.len() as u32;
        op.push_sges(&mut slot.sges);
        let span = SgeSpan {
            start,
            len: slot.sges.len() as u32 - start,
        };
        let prepared = op.into_prepared();
        if matches!(owner, Owner::Queue) {
            self.queued_in_flight += 1;
        }
        let key = self
            .slab
            .insert(InFlight {
                kind: prepared.kind,
                queue: QueueRef::Srq(srq),
                user_data: prepared.user_data,
                len: prepared.len,
                bufs: prepared.bufs,
                posted: false,
                owner,
            })
            .expect("checked above that the slab has room");
        self.cqe_used += 1;
        self.srqs.get_mut(srq).expect("live").pending.push(RecvWr {
            wr_id: key.to_wr_id(),
            sges: span,
        });
        self.mark_dirty(QueueRef::Srq(srq));
        Ok(key)
    }

    /// Pushes a receive whose completion goes to a future.
    pub(crate) fn push_srq_awaited<T: Operation>(
        &mut self,
        srq: SrqHandle,
        op: T,
    ) -> Result<Key, Rejected<T>> {
        match self.srq_key(srq) {
            Some(key) => self.push_srq(key, op, Self::awaited()),
            None => Err(Rejected::new(
                Error::NotAttached("shared receive queue"),
                op,
            )),
        }
    }

    pub(super) fn submit_srq(&mut self, srq: Key, posting: &mut Posting) {
        let handle = Some(SrqHandle {
            ring: self.id,
            key: srq,
        });
        let slot = self.srqs.get_mut(srq).expect("a live shared receive queue");
        if slot.pending.is_empty() {
            return;
        }
        let mut pending = std::mem::take(&mut slot.pending);
        // SAFETY: each receive names exactly the bytes of buffers the slab
        // holds until its completion is reaped, or until the queue is
        // destroyed at teardown; if that fails they are leaked, never freed.
        let result = unsafe { slot.srq.post_recv(&pending, &slot.sges) };
        slot.doorbells += 1;
        self.stats.doorbells += 1;
        let accepted = match &result {
            Ok(()) => pending.len(),
            Err(PostError { accepted, .. }) => (*accepted).min(pending.len()),
        };
        for wr in &pending[..accepted] {
            let key = Key::from_wr_id(wr.wr_id);
            self.slab
                .get_mut(key)
                .expect("pending op is in the slab")
                .posted = true;
        }
        let slot = self.srqs.get_mut(srq).expect("live");
        slot.outstanding += accepted;
        slot.sges.clear();
        self.stats.recv_wrs += accepted as u64;
        self.expecting += accepted;
        posting.posted += accepted;
        if let Err(PostError { error, .. }) = result {
            let unposted =
                self.remove_unposted(pending[accepted..].iter().map(|wr| wr.wr_id), None, handle);
            posting.refused(error, unposted);
        }
        pending.clear();
        self.srqs.get_mut(srq).expect("live").pending = pending;
    }

    /// Tops up every shared receive queue that has a refill and fell below
    /// its low-water mark.
    pub(super) fn refill_srqs(&mut self) {
        // Runs on every poll: nothing is allocated or cloned unless a queue
        // is below its low-water mark.
        if self.srqs.len() == 0 || self.closed || self.failed.is_some() {
            return;
        }
        let mut refilled = false;
        for index in 0..self.srqs.capacity() as u32 {
            let Some(key) = self.srqs.key_at(index) else {
                continue;
            };
            let slot = self.srqs.get(key).expect("key_at found it");
            let Some(refill) = slot.refill.as_ref() else {
                continue;
            };
            if slot.outstanding + slot.pending.len() >= refill.low {
                continue;
            }
            let refill = refill.clone();
            while self
                .srqs
                .get(key)
                .is_some_and(|s| s.outstanding + s.pending.len() < refill.target)
            {
                let Ok(chunk) = refill.pool.take() else { break };
                let op = Recv::new(chunk).user_data(refill.user_data);
                if self.push_srq(key, op, Owner::Queue).is_err() {
                    break;
                }
                refilled = true;
            }
        }
        if !refilled {
            return;
        }
        // Post the refilled queues now (only those: other queues' pushed
        // work waits for the caller's submit). Refused receives go back to
        // the completion queue as flushed, so their chunks return to the
        // pool.
        let mut posting = Posting::default();
        for index in 0..self.srqs.capacity() as u32 {
            let Some(key) = self.srqs.key_at(index) else {
                continue;
            };
            let slot = self.srqs.get_mut(key).expect("key_at found it");
            if slot.dirty && slot.refill.is_some() {
                slot.dirty = false;
                self.dirty.retain(|q| *q != QueueRef::Srq(key));
                self.submit_srq(key, &mut posting);
            }
        }
        if let Some((_, unposted)) = posting.failure {
            self.requeue_unposted(unposted);
        }
    }

    /// Destroys shared receive queue `srq` and hands back its receives
    /// (flushed). Refused while queue pairs on it are attached, or if the
    /// device refuses to destroy it (the receives then stay posted).
    ///
    /// ```
    /// # use rdma_ring::backend::soft::SoftDevice;
    /// # use rdma_ring::backend::{QpConfig, SrqConfig, WcStatus};
    /// # use rdma_ring::buf::RegisteredBuf;
    /// # use rdma_ring::op::Recv;
    /// # use rdma_ring::ring::{Ring, RingConfig};
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// let mut ring = Ring::with_cq(dev.create_cq(64).unwrap(), RingConfig::default());
    /// let srq = ring.add_srq(dev.create_srq(&pd, SrqConfig::default()).unwrap()).unwrap();
    /// let qp = dev.create_qp_on(&pd, ring.cq(), ring.srq(srq), QpConfig::default()).unwrap();
    /// let qp = ring.attach(qp).unwrap();
    /// let buf = RegisteredBuf::new(&pd, vec![0u8; 256]).unwrap();
    /// ring.srq_submission(srq).push(Recv::new(buf).user_data(3)).unwrap();
    /// ring.submit().unwrap();
    /// assert!(ring.remove_srq(srq).is_err()); // a queue pair on it is attached
    /// ring.detach(qp).unwrap();
    /// ring.remove_srq(srq).unwrap();
    /// let flushed = ring.completion().wait(1).unwrap();
    /// assert_eq!(flushed[0].user_data(), 3);
    /// assert_eq!(flushed[0].status(), WcStatus::WrFlushErr);
    /// ```
    pub fn remove_srq(&mut self, srq: SrqHandle) -> Result<Q::Srq, Error> {
        let key = self
            .srq_key(srq)
            .ok_or(Error::NotAttached("shared receive queue"))?;
        let attached = self
            .qps
            .keys()
            .into_iter()
            .any(|k| self.qps.get(k).is_some_and(|slot| slot.srq == Some(key)));
        if attached {
            return Err(Error::Incompatible(
                "queue pairs on this shared receive queue are still attached",
            ));
        }
        // Its refill stops first: the reaps below would top it up again.
        let refill = self.srqs.get_mut(key).expect("checked").refill.take();
        self.flush_pending(QueueRef::Srq(key));
        // Receives a message already filled have their completions queued:
        // take them before the rest are handed back as flushed.
        self.reap_queued();
        let slot = self.srqs.get_mut(key).expect("checked");
        if let Err(e) = slot.srq.destroy() {
            slot.refill = refill;
            return Err(e);
        }
        self.release_srq_receives(key);
        let slot = self.srqs.remove(key).expect("checked");
        self.dirty.retain(|q| *q != QueueRef::Srq(key));
        Ok(slot.srq)
    }

    /// After shared receive queue `srq` was destroyed: the device no
    /// longer touches its receives, which go back to their owners flushed.
    pub(super) fn release_srq_receives(&mut self, srq: Key) {
        let keys: Vec<Key> = self
            .slab
            .keys()
            .into_iter()
            .filter(|k| {
                self.slab
                    .get(*k)
                    .is_some_and(|op| op.queue == QueueRef::Srq(srq) && op.posted)
            })
            .collect();
        for key in keys {
            if let Some(slot) = self.srqs.get_mut(srq) {
                slot.outstanding -= 1;
            }
            self.finish(
                key,
                crate::backend::WcStatus::WrFlushErr,
                Some(0),
                None,
                false,
                None,
            );
        }
    }
}
