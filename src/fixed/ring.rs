//! The fixed ring itself: attach, push, submit, detach, drain (its reaping
//! is in `reap.rs`, a batch of pushes in `batch.rs`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::queue::{wr_id, AttachedQp, RecvEntry, SendEntry, SeqRing, MAX_SLOTS, NO_SLOT};
use super::srq::{AttachedSrq, Consumers};
use super::{CompletionSink, FixedBuf, FixedBufs, FixedCompletion, FixedOp, FixedWork};
use crate::backend::{
    CompletionQueue as DeviceCq, CqId, PostError, QpCaps, QueuePair, RawCompletion, RecvWr,
    SendFlags, SendOpcode, SendWr, SgeSpan, WcStatus,
};
use crate::deadline::Deadline;
use crate::error::{Error, Rejected};
use crate::op::{Limits, OpKind};

/// Completion queue entries taken per poll.
pub(super) const POLL_BATCH: usize = 32;

/// Handles are never reused, across rings too: a stale or foreign handle
/// names nothing. (2^48 of them, at a million attaches a second, last
/// nine years.)
static NEXT_GENERATION: AtomicU64 = AtomicU64::new(1);

/// Bits of a handle that hold its queue pair's slot in the ring.
pub(super) const INDEX_BITS: u32 = 16;

/// How a [`FixedRing`] runs.
///
/// ```
/// use rdma_ring::fixed::FixedRingConfig;
/// let config = FixedRingConfig { signal_interval: 16, ..FixedRingConfig::default() };
/// assert_eq!(config.signal_interval, 16);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FixedRingConfig {
    /// Ask for a completion every this many sends of a queue pair (and
    /// always for the last send of a submit), rounded down to a power of
    /// two; 0: every half send queue.
    pub signal_interval: u32,
    /// How long detaching or dropping waits for a queue pair's flushed
    /// work before giving up (and, on drop, leaking the slots' memory
    /// rather than freeing it under the NIC).
    pub drain_timeout: Duration,
    /// How long [`FixedRing::wait`] polls.
    pub wait_timeout: Duration,
}

impl Default for FixedRingConfig {
    fn default() -> Self {
        FixedRingConfig {
            signal_interval: 0,
            drain_timeout: Duration::from_secs(5),
            wait_timeout: Duration::from_secs(30),
        }
    }
}

/// Names a queue pair attached to a [`FixedRing`]. A handle of a detached
/// queue pair, or of another ring, names nothing (pushes to it are
/// refused with [`Error::NotAttached`]).
///
/// ```
/// # use rdma_ring::backend::{soft::SoftDevice, QpConfig};
/// # use rdma_ring::fixed::*;
/// # let dev = SoftDevice::new();
/// # let pd = dev.alloc_pd();
/// let mut ring = FixedRing::new(dev.create_cq(256).unwrap(), FixedBufs::new(&pd, 4, 64).unwrap(), FixedRingConfig::default());
/// let a = ring.attach(dev.create_qp_on(&pd, ring.cq(), None, QpConfig::default()).unwrap()).unwrap();
/// let b = ring.attach(dev.create_qp_on(&pd, ring.cq(), None, QpConfig::default()).unwrap()).unwrap();
/// assert_ne!(a, b);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FixedQp {
    /// A generation unique in the process, above the slot's index.
    id: u64,
}

/// A handle's value: a generation unique in the process (shared by queue
/// pairs and shared receive queues) above the slot's index.
pub(super) fn fresh_handle(index: usize) -> u64 {
    let generation = NEXT_GENERATION
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_add(1))
        .expect("2^64 queues attached in one process");
    assert!(
        generation < 1 << (64 - INDEX_BITS),
        "2^48 queues attached in one process"
    );
    generation << INDEX_BITS | index as u64
}

/// The slot index of a handle's value.
#[inline(always)]
pub(super) fn handle_index(id: u64) -> usize {
    (id & ((1 << INDEX_BITS) - 1)) as usize
}

impl FixedQp {
    /// Names no queue pair (generation 0 is never handed out): the queue
    /// pair of a shared receive queue's receive that none is known to
    /// have taken.
    pub(super) const NONE: FixedQp = FixedQp { id: 0 };

    fn fresh(index: usize) -> Self {
        FixedQp {
            id: fresh_handle(index),
        }
    }

    #[inline(always)]
    pub(super) fn index(self) -> usize {
        handle_index(self.id)
    }
}

/// The lean ring: one completion queue, any number of queue pairs, and one
/// [`FixedBufs`] table whose slots every operation names by token. See the
/// [module docs](super) for what it does and does not do, and how it
/// differs from [`Ring`](crate::ring::Ring).
///
/// ```
/// use rdma_ring::backend::{soft::SoftDevice, QpConfig, QueuePair};
/// use rdma_ring::buf::{ExposedBuf, RemoteAccess};
/// use rdma_ring::fixed::{FixedBufs, FixedRing, FixedRingConfig, ReadFixed};
///
/// let dev = SoftDevice::new();
/// let pd = dev.alloc_pd();
/// let (mut qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
/// let source = ExposedBuf::new(&pd, vec![5u8; 64], RemoteAccess::READ).unwrap();
/// let cq = qp.take_cq().unwrap();
/// let mut ring = FixedRing::new(cq, FixedBufs::new(&pd, 8, 64).unwrap(), FixedRingConfig::default());
/// let conn = ring.attach(qp).unwrap();
/// let slot = ring.take_buf().unwrap();
/// ring.push(conn, ReadFixed::new(slot, 64, source.remote())).unwrap();
/// ring.submit().unwrap();
/// let done = ring.wait(1).unwrap();
/// assert_eq!(ring.bufs().bytes(done[0].buf()), &[5u8; 64]);
/// ```
pub struct FixedRing<Q: QueuePair> {
    // Dropped in this order: queue pairs before their shared receive
    // queues and completion queue, all before the memory they reach.
    pub(super) qps: Vec<Option<AttachedQp<Q>>>,
    pub(super) srqs: Vec<Option<AttachedSrq<Q::Srq>>>,
    pub(super) cq: Q::Cq,
    pub(super) bufs: FixedBufs,
    pub(super) cq_id: CqId,
    pub(super) cq_entries: usize,
    /// Completion queue entries that no pushed or outstanding work, and no
    /// queue pair's drain marker, may need.
    pub(super) cq_free: usize,
    /// Queue pairs pushed to since the last submit, to post then (one
    /// whose work `submit_qp` posted stays, with nothing left to post).
    pub(super) dirty: Vec<u32>,
    pub(super) cqes: Box<[RawCompletion; POLL_BATCH]>,
    /// Completions made outside a poll (work never posted, drains), handed
    /// out first by the next reap.
    pub(super) ready: Vec<FixedCompletion>,
    pub(super) config: FixedRingConfig,
    pub(super) unknown: u64,
    pub(super) failed: Option<&'static str>,
    /// Per queue pair slot, the send and receive sequence numbers its next
    /// queue pair starts from.
    resume: Vec<(u64, u64)>,
    /// Per shared receive queue slot, the sequence number its next queue
    /// starts from.
    pub(super) srq_resume: Vec<u64>,
    /// The attached queue pairs that take receives from a shared receive
    /// queue, by number: a completion names its queue pair only so.
    pub(super) consumers: Consumers,
    /// Whether a shared receive queue has pushed receives to post.
    pub(super) srqs_dirty: bool,
    /// Whether a shared receive queue has a refill, for reaps to run.
    pub(super) refilling: bool,
    /// Whether a refused post stopped a refill since an owner last asked
    /// ([`take_refill_stopped`](Self::take_refill_stopped)).
    pub(super) refill_stopped: bool,
    /// Shut down (by `close`); `Drop` has nothing left to do.
    closed: bool,
    /// Whether a queue pair may hold parked completions
    /// ([`AttachedQp::parked`]), for reaps to hand out once its posted
    /// work is back.
    pub(super) parked_any: bool,
    /// Why the device refused each queue pair that a refused post put in
    /// error ([`qp_refusal`](Self::qp_refusal)); off the post path, so
    /// kept beside the queue pairs rather than in them.
    refusals: Vec<(FixedQp, Box<str>)>,
}

#[inline(always)]
pub(super) fn attached_mut<Q>(
    qps: &mut [Option<AttachedQp<Q>>],
    handle: FixedQp,
) -> Result<&mut AttachedQp<Q>, Error> {
    match qps.get_mut(handle.index()) {
        Some(Some(slot)) if slot.handle == handle => Ok(slot),
        _ => Err(Error::NotAttached("queue pair")),
    }
}

impl<Q: QueuePair> FixedRing<Q> {
    /// A ring over `cq`, with `bufs` as its slots. Queue pairs join with
    /// [`attach`](Self::attach).
    ///
    /// ```
    /// use rdma_ring::backend::soft::SoftDevice;
    /// use rdma_ring::fixed::{FixedBufs, FixedRing, FixedRingConfig};
    /// use rdma_ring::backend::soft::SoftQp;
    ///
    /// let dev = SoftDevice::new();
    /// let pd = dev.alloc_pd();
    /// let bufs = FixedBufs::new(&pd, 64, 4096).unwrap();
    /// let ring: FixedRing<SoftQp> =
    ///     FixedRing::new(dev.create_cq(1024).unwrap(), bufs, FixedRingConfig::default());
    /// assert_eq!(ring.bufs().slots(), 64);
    /// ```
    pub fn new(cq: Q::Cq, bufs: FixedBufs, config: FixedRingConfig) -> Self {
        let cq_entries = cq.entries() as usize;
        FixedRing {
            qps: Vec::new(),
            srqs: Vec::new(),
            cq_id: cq.id(),
            cq,
            bufs,
            cq_entries,
            cq_free: cq_entries,
            dirty: Vec::new(),
            cqes: Box::new([RawCompletion::default(); POLL_BATCH]),
            ready: Vec::new(),
            config,
            unknown: 0,
            failed: None,
            resume: Vec::new(),
            srq_resume: Vec::new(),
            consumers: Consumers::default(),
            srqs_dirty: false,
            refilling: false,
            refill_stopped: false,
            closed: false,
            parked_any: false,
            refusals: Vec::new(),
        }
    }

    /// Adds a queue pair that completes on the ring's completion queue and
    /// belongs to the slots' protection domain; one created on a shared
    /// receive queue the ring holds ([`add_srq`](Self::add_srq)) takes its
    /// receives from there. Refused (and handed back): one of another
    /// completion queue or domain, one on a shared receive queue the ring
    /// does not hold, one with a send queue under two (one place is kept
    /// for the drain marker) or without scatter/gather elements, when the
    /// completion queue has no entry left to keep for its drain marker, or
    /// when the ring has failed.
    ///
    /// A queue pair on a shared receive queue takes receives as soon as it
    /// is connected: attach it before, or announce it with
    /// [`expect_on_srq`](Self::expect_on_srq), or what it takes meanwhile
    /// is not handed back.
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::SoftDevice, QpConfig};
    /// # use rdma_ring::fixed::*;
    /// let dev = SoftDevice::new();
    /// let pd = dev.alloc_pd();
    /// let mut ring = FixedRing::new(dev.create_cq(256).unwrap(), FixedBufs::new(&pd, 4, 64).unwrap(), FixedRingConfig::default());
    /// let qp = dev.create_qp_on(&pd, ring.cq(), None, QpConfig::default()).unwrap();
    /// let conn = ring.attach(qp).unwrap();
    /// let foreign = dev.create_qp(&pd, QpConfig::default()).unwrap(); // its own CQ
    /// assert!(ring.attach(foreign).is_err());
    /// # let _ = conn;
    /// ```
    pub fn attach(&mut self, qp: Q) -> Result<FixedQp, Rejected<Q>> {
        let caps = qp.caps();
        let (index, srq) = match self.attach_place(&caps) {
            Ok(place) => place,
            Err(error) => return Err(Rejected::new(error, qp)),
        };
        let send_depth = caps.max_send_wr - 1;
        let signal_every = match self.config.signal_interval {
            0 => (send_depth / 2).max(1),
            n => n.min(send_depth),
        };
        // Rounded down to a power of two, to test by mask.
        let signal_mask = u64::from(1u32 << signal_every.ilog2()) - 1;
        let handle = FixedQp::fresh(index);
        // Sequence numbers go on from the slot's last queue pair, so a
        // late completion of that one can never match this one's work.
        let (send_start, recv_start) = self.resume[index];
        let blank_send = SendEntry {
            user_data: 0,
            index: NO_SLOT,
            len: 0,
            kind: OpKind::Send,
        };
        let mut reused_number = false;
        if let Some(srq) = srq {
            self.consumers.insert(caps.qp_num, index as u32);
            reused_number = self.srqs[srq as usize]
                .as_mut()
                .expect("found by attach_place")
                .join(caps.qp_num);
        }
        self.qps[index] = Some(AttachedQp {
            qpn: caps.qp_num,
            handle,
            srq,
            reused_number,
            limits: Limits::send(&caps).within_slots(self.bufs.slot_len()),
            send_depth: u64::from(send_depth),
            recv_depth: u64::from(caps.max_recv_wr),
            signal_mask,
            sends: SeqRing::new(caps.max_send_wr, blank_send, send_start),
            recvs: SeqRing::new(caps.max_recv_wr, RecvEntry::TAKEN, recv_start),
            send_wrs: Vec::with_capacity(caps.max_send_wr as usize),
            send_sges: Vec::with_capacity(caps.max_send_wr as usize),
            recv_wrs: Vec::with_capacity(caps.max_recv_wr as usize),
            recv_sges: Vec::with_capacity(caps.max_recv_wr as usize),
            last_signaled: true,
            marker_posted: false,
            recvs_taken_ahead: 0,
            dirty: false,
            error: None,
            parked: Vec::new(),
            last_wqe: false,
            qp,
        });
        // The drain marker's entry, kept until detach.
        self.cq_free -= 1;
        Ok(handle)
    }

    /// Checks a queue pair can join and finds it a place, and the slot of
    /// the shared receive queue it takes receives from.
    fn attach_place(&mut self, caps: &QpCaps) -> Result<(usize, Option<u32>), Error> {
        if let Some(why) = self.failed {
            return Err(Error::RingFailed(why));
        }
        if caps.cq != self.cq_id {
            return Err(Error::Incompatible(
                "it completes on another completion queue than the ring's",
            ));
        }
        let srq = match caps.srq {
            None => None,
            Some(id) => match self.srq_index_of(id) {
                Some(index) => Some(index as u32),
                None => {
                    return Err(Error::Incompatible(
                        "it takes receives from a shared receive queue the ring does not hold (add it first)",
                    ))
                }
            },
        };
        if caps.pd != self.bufs.pd() {
            return Err(Error::WrongPd {
                buf: self.bufs.pd(),
                qp: caps.pd,
            });
        }
        if caps.max_send_wr < 2 {
            return Err(Error::Incompatible(
                "its send queue holds fewer than 2 work requests (one place is kept for the drain marker)",
            ));
        }
        if caps.max_send_sge == 0
            || (srq.is_none() && caps.max_recv_wr > 0 && caps.max_recv_sge == 0)
        {
            return Err(Error::Incompatible(
                "its work requests take no scatter/gather element (a slot needs one)",
            ));
        }
        if self.cq_free == 0 {
            return Err(Error::CompletionQueueFull {
                possible: self.cq_entries,
                entries: self.cq_entries,
            });
        }
        let index = match self.qps.iter().position(Option::is_none) {
            Some(free) => free,
            None if self.qps.len() < MAX_SLOTS => {
                self.qps.push(None);
                self.resume.push((0, 0));
                self.qps.len() - 1
            }
            None => return Err(Error::Incompatible("the ring holds 65,536 queue pairs")),
        };
        Ok((index, srq))
    }

    /// Pushes an operation for `qp`; it is posted by the next
    /// [`submit`](Self::submit) (or [`submit_qp`](Self::submit_qp) of
    /// `qp`). Refused, and handed back whole: a handle
    /// naming nothing, a queue pair in error, a token of another table, an
    /// operation that does not fit its slot, the remote slice, or the queue
    /// pair's limits, a full send or receive queue, or a completion queue
    /// that could overflow.
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
    /// # let mut ring = FixedRing::new(cq, FixedBufs::new(&pd, 4, 64).unwrap(), FixedRingConfig::default());
    /// # let conn = ring.attach(qp).unwrap();
    /// let slot = ring.take_buf().unwrap();
    /// let too_long = WriteFixed::new(slot, 65, target.remote()); // the slots hold 64
    /// let (error, op) = ring.push(conn, too_long).unwrap_err().into_parts();
    /// assert!(matches!(error, rdma_ring::Error::OutOfBounds { .. }));
    /// ring.push(conn, WriteFixed::new(op.into_buf(), 64, target.remote())).unwrap();
    /// ```
    #[inline]
    pub fn push<O: FixedOp>(&mut self, qp: FixedQp, op: O) -> Result<(), Rejected<O>> {
        match self.try_push(qp, &op, None) {
            Ok(_) => Ok(()),
            Err(error) => Err(Rejected::new(error, op)),
        }
    }

    /// [`push`](Self::push) with `tag` as the work's `user_data` in place
    /// of the operation's own, which is returned (with whether the
    /// operation is a receive): for an adapter that routes completions by
    /// tag and gives the owner its own back.
    // Always: the awaited ring's pushes (one op, or many) each inline it,
    // and left out of line for two callers it costs each push some 15.
    #[inline(always)]
    pub(crate) fn push_tagged<O: FixedOp>(
        &mut self,
        qp: FixedQp,
        op: O,
        tag: u64,
    ) -> Result<(u64, bool), Rejected<O>> {
        self.try_push(qp, &op, Some(tag))
            .map_err(|error| Rejected::new(error, op))
    }

    /// Tops up the shared receive queues whose refill fell below its mark
    /// (a reap does so for the caller of [`reap`](Self::reap); an owner
    /// reaping with [`reap_all`](Self::reap_all) calls this after).
    #[inline]
    pub(crate) fn refill_due(&mut self) {
        if self.refilling {
            self.refill_srqs();
        }
    }

    /// Whether a refused post stopped a refill since the last call (here,
    /// in an event applied, or at a top-up): its receives then wait,
    /// flushed, for [`hand_out_ready`](Self::hand_out_ready).
    pub(crate) fn take_refill_stopped(&mut self) -> bool {
        std::mem::take(&mut self.refill_stopped)
    }

    /// Hands `out` the completions made outside a poll (work never
    /// posted, drains), as a reap does first.
    pub(crate) fn hand_out_ready(&mut self, out: &mut impl CompletionSink) {
        if !self.ready.is_empty() {
            out.put_all(self.ready.drain(..));
        }
    }

    /// Why the ring takes no more work, if its completion queue or the
    /// device failed.
    pub(crate) fn failure(&self) -> Option<&'static str> {
        self.failed
    }

    /// The ring takes no more work (the first reason stays): what was
    /// pushed and never posted comes back flushed from the next reap,
    /// without waiting for posted work, which may never come back.
    #[cold]
    pub(super) fn fail(&mut self, why: &'static str) {
        self.failed.get_or_insert(why);
        let table = self.bufs.table();
        for slot in self.qps.iter_mut().flatten() {
            let handle = slot.handle;
            flush_unposted(slot, handle, table, &mut self.ready, &mut self.cq_free);
            // The ring reaps no more: what waited for posted work goes
            // now, as that work may never come back.
            self.ready.append(&mut slot.parked);
        }
        self.parked_any = false;
        self.flush_srqs_unposted();
    }

    /// Whether nothing is pushed, posted or waiting to be handed out, and
    /// no refill would push anything (its receives' tags would be the
    /// refill's, where a new owner expects its own).
    pub(crate) fn idle(&self) -> bool {
        !self.refilling
            && self.ready.is_empty()
            && self.qps.iter().flatten().all(|slot| {
                !slot.busy()
                    && slot.parked.is_empty()
                    && slot.sends.tail == slot.sends.posted
                    && slot.recvs.tail == slot.recvs.posted
            })
            && self.srqs.iter().flatten().all(AttachedSrq::is_empty)
    }

    #[inline(always)]
    fn try_push<O: FixedOp>(
        &mut self,
        handle: FixedQp,
        op: &O,
        tag: Option<u64>,
    ) -> Result<(u64, bool), Error> {
        if let Some(why) = self.failed {
            return Err(Error::RingFailed(why));
        }
        let slot = attached_mut(&mut self.qps, handle)?;
        if let Some(status) = slot.error {
            return Err(Error::QpInError(status));
        }
        let credit = CqCredit {
            free: &mut self.cq_free,
            entries: self.cq_entries,
        };
        let pushed = push_onto(slot, &self.bufs, credit, op, tag)?;
        if !slot.dirty {
            slot.dirty = true;
            self.dirty.push(handle.index() as u32);
        }
        Ok(pushed)
    }

    /// Posts everything pushed since the last submit: one doorbell per
    /// shared receive queue with receives, then, queue pair by queue
    /// pair, one for its receives and one for its sends (so a request's
    /// reply finds the receive pushed with it to that queue pair, or to a
    /// shared receive queue). The last send of
    /// each queue pair asks for a completion, so every send comes back.
    /// Returns how many work requests were posted. ([`submit_qp`](Self::submit_qp)
    /// posts one queue pair's.)
    ///
    /// If the device refuses a post, that queue pair goes to error: the
    /// posted work requests come back as the device completes or flushes
    /// them, then the refused ones and those after them, flushed (at once
    /// if the device also refuses to move the queue pair to error, as then
    /// nothing may bring the posted ones back); the
    /// other queue pairs are posted as usual and the first error is
    /// returned. Work pushed for a queue pair already in error comes back
    /// flushed without being posted. Receives a shared receive queue
    /// refuses come back flushed from the next reap too; the queue takes
    /// more after.
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
    /// # let mut ring = FixedRing::new(cq, FixedBufs::new(&pd, 4, 64).unwrap(), FixedRingConfig::default());
    /// # let conn = ring.attach(qp).unwrap();
    /// for _ in 0..3 {
    ///     let slot = ring.take_buf().unwrap();
    ///     ring.push(conn, WriteFixed::new(slot, 8, target.remote())).unwrap();
    /// }
    /// assert_eq!(ring.submit().unwrap(), 3); // one doorbell
    /// assert_eq!(ring.submit().unwrap(), 0); // nothing new
    /// ```
    pub fn submit(&mut self) -> Result<usize, Error> {
        let table = self.bufs.table();
        let mut posted = 0;
        // Shared receive queues first, as receives go first on each queue
        // pair.
        let mut first_error = if self.srqs_dirty {
            self.submit_srqs(&mut posted)
        } else {
            None
        };
        for &index in &self.dirty {
            let Some(slot) = self.qps[index as usize].as_mut() else {
                continue;
            };
            slot.dirty = false;
            let result = submit_slot(
                slot,
                table,
                &mut self.ready,
                &mut self.cq_free,
                &mut self.parked_any,
                &mut self.refusals,
            );
            tally(&mut posted, &mut first_error, result);
        }
        self.dirty.clear();
        match first_error {
            None => Ok(posted),
            Some(error) => Err(error),
        }
    }

    /// Posts what queue pair `qp` was pushed, as [`submit`](Self::submit)
    /// does for each queue pair (after the receives pushed to every shared
    /// receive queue, which go first), and leaves the other queue pairs'
    /// work for a later submit: one queue pair's doorbell rung now. Returns
    /// how many work requests were posted (shared receive queues'
    /// included); fails as `submit` does, or with [`Error::NotAttached`]
    /// if `qp` names no attached queue pair. With one queue pair to post,
    /// it does less than `submit`, which walks its list of queue pairs
    /// with pushed work.
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::SoftDevice, QpConfig, QueuePair};
    /// # use rdma_ring::buf::{ExposedBuf, RemoteAccess};
    /// # use rdma_ring::fixed::*;
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// # let cq = dev.create_cq(16).unwrap();
    /// # let target = ExposedBuf::new(&pd, vec![0u8; 64], RemoteAccess::WRITE).unwrap();
    /// let mut ring = FixedRing::new(cq, FixedBufs::new(&pd, 4, 64).unwrap(), FixedRingConfig::default());
    /// # let (qa, qb) = (
    /// #     dev.create_qp_on(&pd, ring.cq(), None, QpConfig::default()).unwrap(),
    /// #     dev.create_qp_on(&pd, ring.cq(), None, QpConfig::default()).unwrap(),
    /// # );
    /// # let (pa, pb) = (dev.create_qp(&pd, QpConfig::default()).unwrap(), dev.create_qp(&pd, QpConfig::default()).unwrap());
    /// # dev.connect(&qa, &pa).unwrap();
    /// # dev.connect(&qb, &pb).unwrap();
    /// let (a, b) = (ring.attach(qa).unwrap(), ring.attach(qb).unwrap());
    /// for conn in [a, a, b] {
    ///     let slot = ring.take_buf().unwrap();
    ///     ring.push(conn, WriteFixed::new(slot, 8, target.remote())).unwrap();
    /// }
    /// assert_eq!(ring.submit_qp(a).unwrap(), 2); // b's write waits
    /// assert_eq!(ring.submit().unwrap(), 1);
    /// ```
    pub fn submit_qp(&mut self, qp: FixedQp) -> Result<usize, Error> {
        let table = self.bufs.table();
        let mut posted = 0;
        let mut first_error = None;
        if self.srqs_dirty {
            // A handle refused posts nothing.
            attached_mut(&mut self.qps, qp)?;
            first_error = self.submit_srqs(&mut posted);
        }
        // Left on the list of queue pairs with pushed work, if it is
        // there: `submit` finds nothing more to post for it.
        let slot = attached_mut(&mut self.qps, qp)?;
        let result = submit_slot(
            slot,
            table,
            &mut self.ready,
            &mut self.cq_free,
            &mut self.parked_any,
            &mut self.refusals,
        );
        tally(&mut posted, &mut first_error, result);
        match first_error {
            None => Ok(posted),
            Some(error) => Err(error),
        }
    }

    /// Posts the shared receive queues' pushed receives, adding to
    /// `posted`; the first refusal, if any.
    #[cold]
    fn submit_srqs(&mut self, posted: &mut usize) -> Option<Error> {
        let mut first_error = None;
        let result = self.post_srqs();
        tally(posted, &mut first_error, result);
        first_error
    }

    /// Posted operations not yet completed, on every queue pair and
    /// shared receive queue (not counting drain markers, nor receives
    /// already handed back out of order).
    pub(super) fn posted_outstanding(&self) -> usize {
        let on_qps: usize = self
            .qps
            .iter()
            .flatten()
            .map(|s| {
                let sends = s.sends.posted - s.sends.head - u64::from(s.marker_posted);
                let recvs = s.recvs.posted - s.recvs.head - s.recvs_taken_ahead;
                (sends + recvs) as usize
            })
            .sum();
        on_qps
            + self
                .srqs
                .iter()
                .flatten()
                .map(AttachedSrq::posted)
                .sum::<usize>()
    }

    /// Removes a queue pair and hands it back. Its work never posted comes
    /// back flushed from the next reap; if it has work in flight, it is
    /// moved to error and its flushed completions are drained first (the
    /// other queue pairs' completions meanwhile wait for the next reap),
    /// and come out before what it never posted.
    /// If the device does not flush everything within `drain_timeout`, it
    /// stays attached, in error, and [`Error::Timeout`] is returned; what
    /// it never posted comes back from the next reap then, ahead of posted
    /// work the device may still give back. (A
    /// device that refuses to move a busy queue pair to error leaves its
    /// work to run as it would: the drain waits for each completion all
    /// the same, and the queue pair comes back still working.)
    ///
    /// One that takes receives from a shared receive queue is moved to
    /// error even when idle, so it takes no more of them (it comes back in
    /// error; if the device refuses to move it, it stays attached, taking
    /// no more work, and the device's error is returned), and
    /// the completions already queued are reaped while it is attached
    /// (they name it). A receive it took whose flushed completion the
    /// device reports later comes back naming no queue pair
    /// ([`FixedCompletion::qp`]). The device says when it has reported
    /// them all with
    /// [`AsyncEvent::LastWqeReached`](crate::backend::AsyncEvent::LastWqeReached):
    /// apply that event ([`apply_event`](Self::apply_event), which reaps
    /// them; applied while it was still attached, the detach itself does)
    /// before dropping the queue pair, as a device may drop the
    /// completions of a destroyed queue pair. A receive lost so holds one
    /// of the queue's places, counted as posted (and its slot stays with
    /// the ring), until the queue is removed or the ring closed, which
    /// hand it back.
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
    /// # let mut ring = FixedRing::new(cq, FixedBufs::new(&pd, 4, 64).unwrap(), FixedRingConfig::default());
    /// # let conn = ring.attach(qp).unwrap();
    /// let slot = ring.take_buf().unwrap();
    /// ring.push(conn, RecvFixed::new(slot).user_data(9)).unwrap();
    /// ring.submit().unwrap();
    /// let qp = ring.detach(conn).unwrap(); // the receive is flushed first
    /// let back = ring.wait(1).unwrap();
    /// assert_eq!((back[0].user_data(), back[0].status()), (9, rdma_ring::backend::WcStatus::WrFlushErr));
    /// assert!(ring.qp_error(conn).is_err()); // the handle names nothing now
    /// # drop(qp);
    /// ```
    pub fn detach(&mut self, handle: FixedQp) -> Result<Q, Error> {
        let table = self.bufs.table();
        let slot = attached_mut(&mut self.qps, handle)?;
        // One on a shared receive queue goes to error even when idle: once
        // detached, it must take none of the queue's receives.
        let on_srq = slot.srq.is_some();
        let busy = slot.busy();
        if on_srq || busy {
            let status = WcStatus::WrFlushErr;
            let (parked, entered) = fail_slot(
                slot,
                handle,
                status,
                table,
                &mut self.ready,
                &mut self.cq_free,
            );
            self.parked_any |= parked;
            if on_srq {
                // A device that refuses leaves it attached: detached, it
                // would go on taking the queue's receives.
                entered?;
            }
        } else {
            self.parked_any |=
                flush_unposted(slot, handle, table, &mut self.ready, &mut self.cq_free);
        }
        if busy {
            let deadline = Deadline::after(self.config.drain_timeout);
            let busy = |ring: &Self| {
                ring.qps[handle.index()]
                    .as_ref()
                    .is_some_and(AttachedQp::busy)
            };
            while busy(self) {
                self.poll_into_ready(1)?;
                if deadline.expired() {
                    // What the device gave back by the deadline counts, all
                    // of it, not only the one batch polled above.
                    self.reap_queued_into_ready()?;
                    if busy(self) {
                        // What it never posted cannot be on the device:
                        // it comes back now, not behind work that may
                        // never come back.
                        let slot = attached_mut(&mut self.qps, handle)?;
                        self.ready.append(&mut slot.parked);
                        return Err(Error::Timeout(self.config.drain_timeout));
                    }
                }
                std::thread::yield_now();
            }
        }
        if on_srq && self.failed.is_none() {
            // Receives of the shared queue it took, already completed, are
            // reaped while it is attached, so they name it. (Only that: a
            // failing poll fails the ring, not the detach.)
            let _ = self.reap_queued_into_ready();
        }
        self.dirty.retain(|&i| i as usize != handle.index());
        self.refusals.retain(|(h, _)| *h != handle);
        let mut slot = self.qps[handle.index()].take().expect("checked above");
        // Its posted work is all back: what it never posted follows.
        self.ready.append(&mut slot.parked);
        self.resume[handle.index()] = (slot.sends.tail, slot.recvs.tail);
        self.cq_free += 1;
        if let Some(srq) = slot.srq {
            self.consumers.remove(slot.qpn);
            if let Some(srq) = self.srqs[srq as usize].as_mut() {
                // Its last receive's event came while attached, and what it
                // took was reaped above: no completion will name its number,
                // so it is not remembered (a queue pair that takes the
                // number over is not suspected of its late flushes).
                if slot.last_wqe && self.failed.is_none() {
                    srq.leave_for_good();
                } else {
                    srq.leave(slot.qpn);
                }
            }
        }
        Ok(slot.qp)
    }

    /// The completion queue, to create queue pairs on
    /// ([`SoftDevice::create_qp_on`](crate::backend::soft::SoftDevice::create_qp_on),
    /// say).
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::{SoftDevice, SoftQp}, CompletionQueue};
    /// # use rdma_ring::fixed::*;
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// let ring: FixedRing<SoftQp> = FixedRing::new(dev.create_cq(128).unwrap(), FixedBufs::new(&pd, 1, 8).unwrap(), FixedRingConfig::default());
    /// assert_eq!(ring.cq().entries(), 128);
    /// ```
    pub fn cq(&self) -> &Q::Cq {
        &self.cq
    }

    /// The slots, to read and write through tokens.
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
    /// # let mut ring = FixedRing::new(cq, FixedBufs::new(&pd, 4, 64).unwrap(), FixedRingConfig::default());
    /// # let conn = ring.attach(qp).unwrap();
    /// let mut slot = ring.take_buf().unwrap();
    /// ring.bufs().bytes_mut(&mut slot).fill(7);
    /// assert_eq!(ring.bufs().bytes(&slot), &[7u8; 64]);
    /// ring.put_buf(slot).unwrap();
    /// assert_eq!(ring.bufs().free(), 4);
    /// ```
    #[inline]
    pub fn bufs(&self) -> &FixedBufs {
        &self.bufs
    }

    /// Takes a free slot's token (see [`FixedBufs::take`]).
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
    /// # let mut ring = FixedRing::new(cq, FixedBufs::new(&pd, 4, 64).unwrap(), FixedRingConfig::default());
    /// # let conn = ring.attach(qp).unwrap();
    /// let all: Vec<_> = std::iter::from_fn(|| ring.take_buf()).collect();
    /// assert_eq!(all.len(), 4);
    /// ```
    #[inline]
    pub fn take_buf(&mut self) -> Option<FixedBuf> {
        self.bufs.take()
    }

    /// Gives a slot back (see [`FixedBufs::put`]).
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
    /// # let mut ring = FixedRing::new(cq, FixedBufs::new(&pd, 4, 64).unwrap(), FixedRingConfig::default());
    /// # let conn = ring.attach(qp).unwrap();
    /// let mut other = FixedBufs::new(&pd, 1, 8).unwrap();
    /// let foreign = other.take().unwrap();
    /// assert!(ring.put_buf(foreign).is_err()); // another table's
    /// ```
    #[inline]
    pub fn put_buf(&mut self, buf: FixedBuf) -> Result<(), Rejected<FixedBuf>> {
        self.bufs.put(buf)
    }

    /// Completions that named nothing the ring posted (a stale or foreign
    /// `wr_id`, or a queue pair not attached), ignored.
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
    /// # let mut ring = FixedRing::new(cq, FixedBufs::new(&pd, 4, 64).unwrap(), FixedRingConfig::default());
    /// # let conn = ring.attach(qp).unwrap();
    /// assert_eq!(ring.unknown_completions(), 0);
    /// ```
    pub fn unknown_completions(&self) -> u64 {
        self.unknown
    }

    /// Whether the queue pair is in error (and takes no more work).
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
    /// # let mut ring = FixedRing::new(cq, FixedBufs::new(&pd, 4, 64).unwrap(), FixedRingConfig::default());
    /// # let conn = ring.attach(qp).unwrap();
    /// assert_eq!(ring.qp_error(conn).unwrap(), None);
    /// ```
    pub fn qp_error(&self, handle: FixedQp) -> Result<Option<WcStatus>, Error> {
        match self.qps.get(handle.index()) {
            Some(Some(slot)) if slot.handle == handle => Ok(slot.error),
            _ => Err(Error::NotAttached("queue pair")),
        }
    }

    /// Why the device refused to post the queue pair's work, if that is
    /// what put it in error: the text of the error the refused submit
    /// returned. Its unposted work came back flushed
    /// ([`WcStatus::WrFlushErr`]), which says nothing of why; this does,
    /// for whoever did not call that submit (a future's poll, a driver).
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::SoftDevice, QpConfig, QueuePair, WcStatus};
    /// # use rdma_ring::buf::{ExposedBuf, RemoteAccess};
    /// # use rdma_ring::fixed::*;
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// # let (mut qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    /// # let target = ExposedBuf::new(&pd, vec![0u8; 64], RemoteAccess::WRITE).unwrap();
    /// # let cq = qp.take_cq().unwrap();
    /// let control = qp.control(); // the soft device's fault injection
    /// # let mut ring = FixedRing::new(cq, FixedBufs::new(&pd, 4, 64).unwrap(), FixedRingConfig::default());
    /// let conn = ring.attach(qp).unwrap();
    /// control.refuse_posts(1); // as a NIC out of resources would
    /// let slot = ring.take_buf().unwrap();
    /// ring.push(conn, WriteFixed::new(slot, 8, target.remote())).unwrap();
    /// let refused = ring.submit().unwrap_err();
    /// assert_eq!(ring.qp_error(conn).unwrap(), Some(WcStatus::WrFlushErr));
    /// assert_eq!(ring.qp_refusal(conn).unwrap(), Some(refused.to_string().as_str()));
    /// ```
    pub fn qp_refusal(&self, handle: FixedQp) -> Result<Option<&str>, Error> {
        match self.qps.get(handle.index()) {
            Some(Some(slot)) if slot.handle == handle => Ok(self
                .refusals
                .iter()
                .find(|(h, _)| *h == handle)
                .map(|(_, why)| &**why)),
            _ => Err(Error::NotAttached("queue pair")),
        }
    }
}

/// The checks every push makes, whatever its queue: `op` prepared for
/// `limits`, its slot of this table, a completion queue entry free
/// (`credit`: entries free, of how many); with `tag` in place of its
/// `user_data`, which is returned.
#[inline(always)]
pub(super) fn admit<O: FixedOp>(
    op: &O,
    limits: &Limits,
    tag: Option<u64>,
    bufs: &FixedBufs,
    (cq_free, cq_entries): (usize, usize),
) -> Result<(FixedWork, u64), Error> {
    let mut work = op.prepare(bufs.slot_len(), limits)?;
    let own_user_data = work.user_data;
    if let Some(tag) = tag {
        work.user_data = tag;
    }
    if work.table != bufs.table() {
        return Err(Error::ForeignFixedBuf);
    }
    if cq_free == 0 {
        return Err(Error::CompletionQueueFull {
            possible: cq_entries,
            entries: cq_entries,
        });
    }
    Ok((work, own_user_data))
}

/// The completion queue's free entries, as a push takes one.
pub(super) struct CqCredit<'a> {
    pub(super) free: &'a mut usize,
    pub(super) entries: usize,
}

/// Checks `op` against the queue pair in `slot` and records it as pushed
/// and not posted; returns the operation's own `user_data` and whether it
/// is a receive. The caller has checked that the ring has not failed and
/// that the queue pair is attached and not in error.
#[inline(always)]
pub(super) fn push_onto<Q, O: FixedOp>(
    slot: &mut AttachedQp<Q>,
    bufs: &FixedBufs,
    credit: CqCredit<'_>,
    op: &O,
    tag: Option<u64>,
) -> Result<(u64, bool), Error> {
    let handle = slot.handle;
    let (work, own_user_data) = admit(op, &slot.limits, tag, bufs, (*credit.free, credit.entries))?;
    let sge = bufs.sge_of(work.index, work.len);
    if work.kind == OpKind::Recv {
        if slot.srq.is_some() {
            return Err(Error::Incompatible(
                "its receives come from a shared receive queue: push them there (push_srq)",
            ));
        }
        if slot.recvs.outstanding() >= slot.recv_depth {
            return Err(Error::RecvQueueFull {
                outstanding: slot.recvs.outstanding() as usize,
                depth: slot.recv_depth as usize,
            });
        }
        let seq = slot.recvs.push(RecvEntry {
            user_data: work.user_data,
            index: work.index,
        });
        let start = slot.recv_sges.len() as u32;
        slot.recv_sges.push(sge);
        slot.recv_wrs.push(RecvWr {
            wr_id: wr_id(handle.index() as u32, true, seq),
            sges: SgeSpan { start, len: 1 },
        });
    } else {
        if slot.sends.outstanding() >= slot.send_depth {
            return Err(Error::SendQueueFull {
                outstanding: slot.sends.outstanding() as usize,
                depth: slot.send_depth as usize,
            });
        }
        let seq = slot.sends.push(SendEntry {
            user_data: work.user_data,
            index: work.index,
            len: work.len,
            kind: work.kind,
        });
        let start = slot.send_sges.len() as u32;
        slot.send_sges.push(sge);
        let mut wr = work.wr;
        wr.wr_id = wr_id(handle.index() as u32, false, seq);
        // No element for no bytes: some devices read a zero length as
        // 2^31.
        wr.sges = SgeSpan {
            start,
            len: u32::from(work.len != 0),
        };
        // Every `signal_every`-th send by sequence number: no counter
        // to keep, and never more than that many unsignaled in a row.
        if seq & slot.signal_mask == slot.signal_mask {
            wr.flags |= SendFlags::SIGNALED;
        }
        slot.send_wrs.push(wr);
    }
    *credit.free -= 1;
    Ok((own_user_data, work.kind == OpKind::Recv))
}

/// Adds a post's outcome to a submit's: the work requests posted, and
/// the first refusal.
#[inline(always)]
pub(super) fn tally(
    posted: &mut usize,
    first_error: &mut Option<Error>,
    result: Result<usize, (usize, Error)>,
) {
    match result {
        Ok(n) => *posted += n,
        Err((n, error)) => {
            *posted += n;
            first_error.get_or_insert(error);
        }
    }
}

/// Posts the work pushed to the queue pair in `slot`, or, if it is in
/// error, hands that work back flushed (parked behind what it posted);
/// on a refusal, the posted count and the error. `parked_any` is raised
/// when something is left parked.
#[inline(always)]
fn submit_slot<Q: QueuePair>(
    slot: &mut AttachedQp<Q>,
    table: u64,
    ready: &mut Vec<FixedCompletion>,
    cq_free: &mut usize,
    parked_any: &mut bool,
    refusals: &mut Vec<(FixedQp, Box<str>)>,
) -> Result<usize, (usize, Error)> {
    let handle = slot.handle;
    if slot.error.is_some() {
        *parked_any |= flush_unposted(slot, handle, table, ready, cq_free);
        return Ok(0);
    }
    let result = post(slot, handle, table, ready, cq_free);
    if let Err((_, error)) = &result {
        *parked_any |= !slot.parked.is_empty();
        note_refusal(refusals, handle, error);
    }
    result
}

/// Posts a queue pair's pushed work; on a refusal, the posted count and
/// the error.
#[inline(always)]
fn post<Q: QueuePair>(
    slot: &mut AttachedQp<Q>,
    handle: FixedQp,
    table: u64,
    ready: &mut Vec<FixedCompletion>,
    cq_free: &mut usize,
) -> Result<usize, (usize, Error)> {
    let mut posted = 0;
    let mut refused = None;
    // Receives first: a request and the receive for its reply pushed in
    // one submit must not let the reply find no receive.
    if !slot.recv_wrs.is_empty() {
        let count = slot.recv_wrs.len();
        // SAFETY: each receive names bytes of one slot of the ring's table
        // (registered in the queue pair's protection domain, checked at
        // attach), whose token the ring keeps from push until the
        // completion is handed back; the table outlives every queue pair,
        // which is drained (or its memory leaked) before the table goes.
        // Its `wr_id` is unique among the queue pair's outstanding work.
        match unsafe { slot.qp.post_recv(&slot.recv_wrs, &slot.recv_sges) } {
            Ok(()) => {
                slot.recvs.posted += count as u64;
                posted += count;
            }
            Err(PostError { accepted, error }) => {
                let accepted = accepted.min(count);
                slot.recvs.posted += accepted as u64;
                posted += accepted;
                refused = Some(error);
            }
        }
        slot.recv_wrs.clear();
        slot.recv_sges.clear();
    }
    if refused.is_none() {
        if let Some(last) = slot.send_wrs.last_mut() {
            last.flags |= SendFlags::SIGNALED;
            let count = slot.send_wrs.len();
            // SAFETY: as for the receives: each work request names one
            // slot of the table, held by the ring until the completion is
            // handed back.
            match unsafe { slot.qp.post_send(&slot.send_wrs, &slot.send_sges) } {
                Ok(()) => {
                    slot.sends.posted += count as u64;
                    slot.last_signaled = true;
                    posted += count;
                }
                Err(PostError { accepted, error }) => {
                    let accepted = accepted.min(count);
                    if accepted > 0 {
                        slot.last_signaled = slot.send_wrs[accepted - 1]
                            .flags
                            .contains(SendFlags::SIGNALED);
                    }
                    slot.sends.posted += accepted as u64;
                    posted += accepted;
                    refused = Some(error);
                }
            }
            slot.send_wrs.clear();
            slot.send_sges.clear();
        }
    }
    match refused {
        None => Ok(posted),
        Some(error) => {
            // The caller sees what stays parked.
            let _ = fail_slot(slot, handle, WcStatus::WrFlushErr, table, ready, cq_free);
            Err((posted, error))
        }
    }
}

/// Notes why the device refused queue pair `handle`'s post (text: the
/// error itself goes to the submit's caller). Out of line, off the post
/// path.
#[cold]
#[inline(never)]
fn note_refusal(refusals: &mut Vec<(FixedQp, Box<str>)>, handle: FixedQp, error: &Error) {
    refusals.retain(|(h, _)| *h != handle);
    refusals.push((handle, error.to_string().into()));
}

/// Hands back the queue pair's pushed, unposted work as flushed
/// completions: into `ready`, or, while work it posted is still out, into
/// its parked list, to follow that work out (a queue pair's completions
/// come out in the order its work was pushed). Returns whether it parked
/// any.
pub(super) fn flush_unposted<Q>(
    slot: &mut AttachedQp<Q>,
    handle: FixedQp,
    table: u64,
    ready: &mut Vec<FixedCompletion>,
    cq_free: &mut usize,
) -> bool {
    let unposted = slot.sends.tail - slot.sends.posted + slot.recvs.tail - slot.recvs.posted;
    if unposted == 0 {
        return false;
    }
    let park = slot.busy() || !slot.parked.is_empty();
    let ready = if park { &mut slot.parked } else { ready };
    for seq in slot.sends.posted..slot.sends.tail {
        let entry = slot.sends.get(seq);
        ready.push(flushed(
            handle,
            table,
            entry.index,
            entry.user_data,
            entry.kind,
        ));
    }
    for seq in slot.recvs.posted..slot.recvs.tail {
        let entry = slot.recvs.get(seq);
        ready.push(flushed(
            handle,
            table,
            entry.index,
            entry.user_data,
            OpKind::Recv,
        ));
    }
    *cq_free += unposted as usize;
    slot.sends.tail = slot.sends.posted;
    slot.recvs.tail = slot.recvs.posted;
    slot.send_wrs.clear();
    slot.send_sges.clear();
    slot.recv_wrs.clear();
    slot.recv_sges.clear();
    park
}

pub(super) fn flushed(
    qp: FixedQp,
    table: u64,
    index: u32,
    user_data: u64,
    kind: OpKind,
) -> FixedCompletion {
    FixedCompletion {
        user_data,
        buf: FixedBuf::from_raw(table, index),
        qp,
        byte_len: 0,
        imm: None,
        kind,
        status: WcStatus::WrFlushErr,
        by_write_imm: false,
    }
}

/// Moves a queue pair to error, its unposted work flushed first (a drain
/// marker goes behind what was posted): parked behind its posted work if
/// that is sure to come back (the device moved the queue pair to error,
/// and a signaled send closes its send queue), else handed to `ready` now,
/// as nothing would release it. Returns whether any stays parked, and the
/// device's answer.
pub(super) fn fail_slot<Q: QueuePair>(
    slot: &mut AttachedQp<Q>,
    handle: FixedQp,
    status: WcStatus,
    table: u64,
    ready: &mut Vec<FixedCompletion>,
    cq_free: &mut usize,
) -> (bool, Result<(), Error>) {
    flush_unposted(slot, handle, table, ready, cq_free);
    let entered = enter_error(slot, handle, status);
    let comes_back =
        entered.is_ok() && (slot.last_signaled || slot.sends.head == slot.sends.posted);
    if !comes_back {
        ready.append(&mut slot.parked);
    }
    (!slot.parked.is_empty(), entered)
}

/// Moves the queue pair to error, so the device flushes its outstanding
/// work; if its last posted send asked for no completion, posts a
/// signaled marker behind it, whose flushed completion releases it. The
/// queue pair takes no more work either way; the error is the device's
/// refusal to move it (then nothing is posted, and its posted work comes
/// back only as the device completes it).
pub(super) fn enter_error<Q: QueuePair>(
    slot: &mut AttachedQp<Q>,
    handle: FixedQp,
    status: WcStatus,
) -> Result<(), Error> {
    slot.error.get_or_insert(status);
    // A queue pair the device cannot move to error would run a marker for
    // real: none is posted, and the drain times out on what is not
    // flushed (dropping the ring then leaks the slots' memory).
    slot.qp.set_error()?;
    if slot.last_signaled || slot.sends.head == slot.sends.posted {
        return Ok(());
    }
    // The send queue keeps one place for this marker (send_depth), and
    // the completion queue one entry (kept since attach).
    let seq = slot.sends.push(SendEntry {
        user_data: 0,
        index: NO_SLOT,
        len: 0,
        kind: OpKind::Write,
    });
    // A zero-length WRITE: were it to run, it would touch no memory and
    // consume no receive of the peer.
    let mut wr = SendWr::new(
        wr_id(handle.index() as u32, false, seq),
        SendOpcode::Write,
        SgeSpan::default(),
    );
    wr.flags = SendFlags::SIGNALED;
    // SAFETY: the marker names no memory.
    match unsafe { slot.qp.post_send(&[wr], &[]) } {
        // A backend that cannot tell reports it taken: it may have been.
        Ok(()) | Err(PostError { accepted: 1.., .. }) => {
            slot.sends.posted += 1;
            slot.last_signaled = true;
            slot.marker_posted = true;
        }
        // Not posted: the drain times out on what is not flushed.
        Err(_) => slot.sends.tail -= 1,
    }
    Ok(())
}

impl<Q: QueuePair> FixedRing<Q> {
    /// Closes the ring, as dropping it does, and says whether it let go of
    /// everything: every queue pair with work in flight (and every one on
    /// a shared receive queue) goes to error and is drained; then the
    /// queue pairs are destroyed, then the shared receive queues. If the
    /// device does not flush everything within `drain_timeout`, or refuses
    /// to destroy a shared receive queue (a queue pair created on it still
    /// exists elsewhere), the slots' memory is leaked (counted in
    /// [`leak`](crate::leak)), never freed under the NIC, and
    /// [`Error::Timeout`] is returned.
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
    /// let slot = ring.take_buf().unwrap();
    /// ring.push(conn, RecvFixed::new(slot)).unwrap();
    /// ring.submit().unwrap();
    /// ring.close().unwrap(); // the receive was flushed and drained
    /// ```
    pub fn close(mut self) -> Result<(), Error> {
        if self.shutdown() {
            Ok(())
        } else {
            Err(Error::Timeout(self.config.drain_timeout))
        }
    }

    /// Error, drain, and leak the memory if the drain fell short. Returns
    /// whether everything came back; once only.
    fn shutdown(&mut self) -> bool {
        let mut discarded = Vec::new();
        self.shutdown_into(&mut discarded)
    }

    /// [`shutdown`](Self::shutdown), handing what comes back (flushed
    /// unposted work, drained completions, what was ready) to `out`, for
    /// an adapter whose owners wait for it. Every queue pair drains under
    /// one deadline.
    pub(crate) fn shutdown_into(&mut self, out: &mut Vec<FixedCompletion>) -> bool {
        if std::mem::replace(&mut self.closed, true) {
            return true;
        }
        let table = self.bufs.table();
        self.flush_srqs_unposted();
        out.append(&mut self.ready);
        for slot in self.qps.iter_mut().flatten() {
            let handle = slot.handle;
            self.parked_any |= flush_unposted(slot, handle, table, out, &mut self.cq_free);
            // Idle ones on a shared receive queue too: they must stop
            // taking its receives before it is destroyed.
            if slot.busy() || slot.srq.is_some() {
                let _ = enter_error(slot, handle, WcStatus::WrFlushErr);
            }
        }
        let deadline = Deadline::after(self.config.drain_timeout);
        while self.qps.iter().flatten().any(AttachedQp::busy) {
            if self.reap_device(out).is_err() {
                break;
            }
            if deadline.expired() {
                // What the device gave back by the deadline counts, all of
                // it: the slots' memory is leaked for work it kept.
                for _ in 0..self.cq_entries / POLL_BATCH + 1 {
                    if !matches!(self.reap_device(out), Ok(POLL_BATCH)) {
                        break;
                    }
                }
                self.hand_parked(out);
                break;
            }
            self.hand_parked(out);
            std::thread::yield_now();
        }
        let mut drained = !self.qps.iter().flatten().any(AttachedQp::busy);
        // What was never posted follows what was, drained or not (a
        // failed poll moved it to the ready list).
        out.append(&mut self.ready);
        for slot in self.qps.iter_mut().flatten() {
            out.append(&mut slot.parked);
        }
        self.parked_any = false;
        if self.srqs.iter().any(Option::is_some) {
            drained = self.release_srqs(drained, out) && drained;
        }
        if !drained {
            self.bufs.leak();
        }
        drained
    }
}

impl<Q: QueuePair> Drop for FixedRing<Q> {
    /// [`close`](FixedRing::close), without the answer.
    fn drop(&mut self) {
        self.shutdown();
    }
}

impl<Q: QueuePair> std::fmt::Debug for FixedRing<Q> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FixedRing")
            .field("qps", &self.qps.iter().flatten().count())
            .field("bufs", &self.bufs)
            .field("cq_entries", &self.cq_entries)
            .field("unknown", &self.unknown)
            .finish()
    }
}
