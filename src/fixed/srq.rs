//! Shared receive queues of the fixed ring: receives posted once, taken by
//! whichever of the queue's queue pairs a message arrives on, and handed
//! back naming that queue pair.
//!
//! A queue's receives sit in a table of entries ([`ReceiveTable`]), not a
//! ring: they complete in any order across the queue's queue pairs, and
//! one the device never reports must hold one place, not the queue. Their
//! `wr_id` carries the queue's slot, a bit telling them from a queue
//! pair's, the entry and low bits of a sequence number. The device
//! reports a receive on the completion queue of the queue pair that took
//! it, with that queue pair's number, which is how the ring finds it
//! ([`Consumers`]); only a queue pair on the queue, attached or lately
//! detached, can complete one of its receives.

use std::collections::VecDeque;

use super::queue::{srq_wr_id, AttachedQp, RecvEntry, MAX_SLOTS};
use super::reap::recv_completion;
use super::receive_table::{ReceiveTable, MAX_DEPTH};
use super::ring::{admit, flushed, fresh_handle, handle_index, tally, INDEX_BITS};
use super::srq_refill::ActiveRefill;
use super::{FixedCompletion, FixedQp, FixedRing, RecvFixed};
use crate::backend::{
    PostError, QueuePair, RawCompletion, RecvWr, Sge, SgeSpan, SharedReceiveQueue, SrqId, WcStatus,
};
use crate::error::{Error, Rejected};
use crate::op::{Limits, OpKind};

/// Names a shared receive queue held by a [`FixedRing`]. A handle of a
/// removed queue, or of another ring, names nothing (pushes to it are
/// refused with [`Error::NotAttached`]).
///
/// ```
/// # use rdma_ring::backend::{soft::{SoftDevice, SoftQp}, SrqConfig};
/// # use rdma_ring::fixed::*;
/// let dev = SoftDevice::new();
/// let pd = dev.alloc_pd();
/// let mut ring: FixedRing<SoftQp> = FixedRing::new(dev.create_cq(256).unwrap(), FixedBufs::new(&pd, 4, 64).unwrap(), FixedRingConfig::default());
/// let a = ring.add_srq(dev.create_srq(&pd, SrqConfig::default()).unwrap()).unwrap();
/// let b = ring.add_srq(dev.create_srq(&pd, SrqConfig::default()).unwrap()).unwrap();
/// assert_ne!(a, b);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FixedSrq {
    /// A generation unique in the process, above the slot's index.
    id: u64,
}

impl FixedSrq {
    #[inline(always)]
    fn index(self) -> usize {
        handle_index(self.id)
    }

    /// A number no other queue's handle has in this process (below
    /// 2^48): its generation.
    pub(crate) fn generation(self) -> u64 {
        self.id >> INDEX_BITS
    }
}

/// What the ring keeps of one shared receive queue.
pub(super) struct AttachedSrq<S> {
    srq: S,
    id: SrqId,
    handle: FixedSrq,
    limits: Limits,
    /// Its receives, as many as the queue's depth.
    receives: ReceiveTable,
    wrs: Vec<RecvWr>,
    sges: Vec<Sge>,
    /// How many attached queue pairs take its receives.
    pub(super) attached: usize,
    /// Numbers of queue pairs detached from it (`true`), or announced on
    /// it and not attached yet ([`FixedRing::expect_on_srq`]), whose
    /// receives may be reported (the latest [`FORMER_KEPT`]), until the
    /// device says they took their last, one is attached, or the queue is
    /// removed.
    former: VecDeque<(u32, bool)>,
    /// How the ring keeps it topped up from its free slots, if it does.
    pub(super) refill: Option<ActiveRefill>,
}

/// Detached queue pairs' numbers a shared receive queue remembers.
const FORMER_KEPT: usize = 1024;

impl<S> AttachedSrq<S> {
    /// Queue pair `qpn` is attached: its number now names it. Returns
    /// whether a queue pair detached from this queue had the number
    /// (whose late flushes may still come, naming it).
    pub(super) fn join(&mut self, qpn: u32) -> bool {
        self.attached += 1;
        let reused = self
            .former
            .iter()
            .any(|&(n, detached)| n == qpn && detached);
        self.former.retain(|&(n, _)| n != qpn);
        reused
    }

    pub(super) fn leave(&mut self, qpn: u32) {
        self.attached -= 1;
        self.remember(qpn, true);
    }

    /// A queue pair leaves whose last receive was reported and reaped:
    /// nothing more can name its number.
    pub(super) fn leave_for_good(&mut self) {
        self.attached -= 1;
    }

    /// Remembers `qpn` as a queue pair on this queue, not attached
    /// (`detached`, or announced), whose receives may be reported.
    fn remember(&mut self, qpn: u32, detached: bool) {
        // Known already: it moves to the back, the newest, keeping whether
        // a queue pair detached with the number.
        let mut was_detached = false;
        self.former.retain(|&(n, d)| {
            was_detached |= n == qpn && d;
            n != qpn
        });
        if self.former.len() == FORMER_KEPT {
            self.former.pop_front();
        }
        self.former.push_back((qpn, detached || was_detached));
    }

    /// Whether `qpn` is remembered.
    fn had(&self, qpn: u32) -> bool {
        self.former.iter().any(|&(n, _)| n == qpn)
    }

    /// Forgets a detached queue pair that will report nothing more.
    fn forget_former(&mut self, qpn: u32) {
        self.former.retain(|&(n, _)| n != qpn);
    }

    /// Receives posted and not handed back.
    pub(super) fn posted(&self) -> usize {
        self.receives.posted()
    }

    pub(super) fn handle(&self) -> FixedSrq {
        self.handle
    }

    /// How many receives it holds at most.
    pub(super) fn depth(&self) -> usize {
        self.receives.depth()
    }

    /// Receives pushed or posted, and not handed back.
    pub(super) fn held(&self) -> usize {
        self.receives.in_use()
    }

    /// The refill's receives pushed or posted, and not handed back.
    pub(super) fn refills(&self) -> usize {
        self.receives.refills()
    }

    /// Whether it holds no receive, pushed or posted.
    pub(super) fn is_empty(&self) -> bool {
        self.receives.in_use() == 0
    }

    /// Posts its pushed receives with one doorbell; returns how many were
    /// posted. What the queue refuses comes back flushed, into `ready`,
    /// with its completion queue credits.
    pub(super) fn post(
        &mut self,
        table: u64,
        ready: &mut Vec<FixedCompletion>,
        cq_free: &mut usize,
    ) -> Result<usize, (usize, Error)>
    where
        S: SharedReceiveQueue,
    {
        if self.wrs.is_empty() {
            return Ok(0);
        }
        let count = self.wrs.len();
        // SAFETY: each receive names bytes of one slot of the ring's
        // table (registered in the queue's protection domain, checked
        // when it was added), whose token the ring keeps from push until
        // the completion is handed back; the table outlives the queue,
        // which is destroyed (or the table's memory leaked) before the
        // table goes. Its `wr_id` is unique among the queue's outstanding
        // receives.
        let (accepted, error) = match unsafe { self.srq.post_recv(&self.wrs, &self.sges) } {
            Ok(()) => (count, None),
            Err(PostError { accepted, error }) => (accepted.min(count), Some(error)),
        };
        self.receives.mark_posted(accepted);
        // What was refused was never posted: back, flushed.
        *cq_free += self.flush_unposted(table, ready);
        match error {
            None => Ok(accepted),
            Some(error) => Err((accepted, error)),
        }
    }

    /// Hands back the pushed, unposted receives as flushed completions.
    fn flush_unposted(&mut self, table: u64, ready: &mut Vec<FixedCompletion>) -> usize {
        self.wrs.clear();
        self.sges.clear();
        self.receives
            .take_pending(|receive| ready.push(flushed_recv(receive, table)))
    }

    /// After the queue was destroyed: hands back its posted receives,
    /// which the device no longer touches, as flushed completions.
    fn release_posted(&mut self, table: u64, ready: &mut Vec<FixedCompletion>) -> usize {
        self.receives
            .take_posted(|receive| ready.push(flushed_recv(receive, table)))
    }
}

/// A shared receive queue's receive handed back unconsumed: no queue pair
/// took it.
fn flushed_recv(entry: RecvEntry, table: u64) -> FixedCompletion {
    flushed(
        FixedQp::NONE,
        table,
        entry.index,
        entry.user_data,
        OpKind::Recv,
    )
}

/// The attached queue pairs on shared receive queues, by queue pair
/// number: (number, slot), sorted, found by binary search.
#[derive(Default)]
pub(super) struct Consumers(Vec<(u32, u32)>);

impl Consumers {
    pub(super) fn insert(&mut self, qpn: u32, index: u32) {
        match self.0.binary_search_by_key(&qpn, |&(n, _)| n) {
            Ok(at) => self.0[at].1 = index,
            Err(at) => self.0.insert(at, (qpn, index)),
        }
    }

    pub(super) fn remove(&mut self, qpn: u32) {
        if let Ok(at) = self.0.binary_search_by_key(&qpn, |&(n, _)| n) {
            self.0.remove(at);
        }
    }

    fn clear(&mut self) {
        self.0.clear();
    }

    /// The slot of the attached queue pair numbered `qpn`.
    #[inline]
    pub(super) fn find(&self, qpn: u32) -> Option<usize> {
        self.0
            .binary_search_by_key(&qpn, |&(n, _)| n)
            .ok()
            .map(|at| self.0[at].1 as usize)
    }
}

/// What a completion of a shared receive queue's receive hands out, if it
/// names one the ring posted, with the attached queue pair the entry's
/// number names, if any (a failed receive puts it in error).
// Out of line: the reap loop of rings without a shared queue stays small.
#[allow(clippy::too_many_arguments)]
#[inline(never)]
pub(super) fn complete_srq<Q, S>(
    qps: &mut [Option<AttachedQp<Q>>],
    srqs: &mut [Option<AttachedSrq<S>>],
    consumers: &Consumers,
    index: usize,
    recv: bool,
    bits: u64,
    table: u64,
    cqe: &RawCompletion,
) -> Option<FixedCompletion> {
    if !recv {
        return None;
    }
    let srq = srqs.get_mut(index)?.as_mut()?;
    // Only a queue pair on this queue, attached or detached from it, can
    // have taken one of its receives: any other number (another ring's
    // queue pair, say) names none of them.
    let qp = consumers
        .find(cqe.qp_num)
        .and_then(|at| qps.get_mut(at)?.as_mut())
        .filter(|slot| slot.srq == Some(index as u32));
    if qp.is_none() && !srq.had(cqe.qp_num) {
        return None;
    }
    let entry = srq.receives.take(bits)?;
    let handle = match qp {
        // Maybe a late flush of a detached queue pair whose number this
        // one took over: it names neither. Were this one in error, its
        // own completions and events say so.
        Some(slot)
            if cqe.status == WcStatus::WrFlushErr && slot.reused_number && slot.error.is_none() =>
        {
            FixedQp::NONE
        }
        Some(slot) => {
            // A flush too: the device flushes only a queue pair's in
            // error, so the ring learns of it even without events.
            if !cqe.status.is_success() {
                slot.error.get_or_insert(cqe.status);
            }
            slot.handle
        }
        // Taken by a queue pair detached since (its receive flushed late).
        None => FixedQp::NONE,
    };
    Some(recv_completion(entry, handle, table, cqe))
}

impl<Q: QueuePair> FixedRing<Q> {
    /// Takes `srq` into the ring: queue pairs created on it (and on the
    /// ring's completion queue) may then be attached, and receives pushed
    /// to it with [`push_srq`](Self::push_srq). Its receives complete on
    /// the ring's completion queue, each naming the queue pair that took
    /// it ([`FixedCompletion::qp`]). Refused (and handed back): a queue of
    /// another protection domain than the slots', one without
    /// scatter/gather elements, one the ring already holds, or when the
    /// ring has failed.
    ///
    /// Closing or dropping the ring moves its queue pairs to error, drains
    /// them, destroys them, then destroys the queue, and only then lets go
    /// of the slots its receives still name.
    ///
    /// ```
    /// use rdma_ring::backend::{soft::SoftDevice, QpConfig, SrqConfig};
    /// use rdma_ring::fixed::{FixedBufs, FixedRing, FixedRingConfig, RecvFixed};
    ///
    /// let dev = SoftDevice::new();
    /// let pd = dev.alloc_pd();
    /// let mut server = FixedRing::new(dev.create_cq(256).unwrap(), FixedBufs::new(&pd, 16, 256).unwrap(), FixedRingConfig::default());
    /// let srq = server.add_srq(dev.create_srq(&pd, SrqConfig::default()).unwrap()).unwrap();
    /// let qp = dev.create_qp_on(&pd, server.cq(), server.srq(srq), QpConfig::default()).unwrap();
    /// let conn = server.attach(qp).unwrap();
    /// for _ in 0..4 {
    ///     let slot = server.take_buf().unwrap();
    ///     server.push_srq(srq, RecvFixed::new(slot)).unwrap();
    /// }
    /// assert_eq!(server.submit().unwrap(), 4);
    /// assert_eq!(server.srq_posted(srq).unwrap(), 4);
    /// # let _ = conn;
    /// ```
    pub fn add_srq(&mut self, srq: Q::Srq) -> Result<FixedSrq, Rejected<Q::Srq>> {
        let caps = srq.caps();
        let refuse = |error, srq| Err(Rejected::new(error, srq));
        if let Some(why) = self.failed {
            return refuse(Error::RingFailed(why), srq);
        }
        if caps.pd != self.bufs.pd() {
            return refuse(
                Error::Incompatible(
                    "it belongs to another protection domain than the ring's slots",
                ),
                srq,
            );
        }
        if caps.max_sge == 0 || caps.max_wr == 0 {
            return refuse(
                Error::Incompatible("it takes no receive with a scatter/gather element"),
                srq,
            );
        }
        if caps.max_wr > MAX_DEPTH {
            return refuse(
                Error::Incompatible("it holds more receives than the ring serves (2^20)"),
                srq,
            );
        }
        if self.srq_index_of(caps.id).is_some() {
            return refuse(
                Error::Incompatible("the ring holds this shared receive queue already"),
                srq,
            );
        }
        let index = match self.srqs.iter().position(Option::is_none) {
            Some(free) => free,
            None if self.srqs.len() < MAX_SLOTS => {
                self.srqs.push(None);
                self.srq_resume.push(0);
                self.srqs.len() - 1
            }
            None => {
                return refuse(
                    Error::Incompatible("the ring holds 65,536 shared receive queues"),
                    srq,
                )
            }
        };
        let handle = FixedSrq {
            id: fresh_handle(index),
        };
        // Sequence numbers go on from the slot's last queue, so a late
        // completion of that one can never match this one's receives.
        let start = self.srq_resume[index];
        self.srqs[index] = Some(AttachedSrq {
            srq,
            id: caps.id,
            handle,
            limits: Limits::srq(&caps).within_slots(self.bufs.slot_len()),
            receives: ReceiveTable::new(caps.max_wr, start),
            wrs: Vec::with_capacity(caps.max_wr as usize),
            sges: Vec::with_capacity(caps.max_wr as usize),
            attached: 0,
            former: VecDeque::new(),
            refill: None,
        });
        Ok(handle)
    }

    /// The shared receive queue `srq` names, to create queue pairs on
    /// ([`SoftDevice::create_qp_on`](crate::backend::soft::SoftDevice::create_qp_on),
    /// say); `None` if it names nothing.
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::{SoftDevice, SoftQp}, SharedReceiveQueue, SrqConfig};
    /// # use rdma_ring::fixed::*;
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// # let mut ring: FixedRing<SoftQp> = FixedRing::new(dev.create_cq(256).unwrap(), FixedBufs::new(&pd, 4, 64).unwrap(), FixedRingConfig::default());
    /// let srq = ring.add_srq(dev.create_srq(&pd, SrqConfig { max_wr: 32, ..SrqConfig::default() }).unwrap()).unwrap();
    /// assert_eq!(ring.srq(srq).unwrap().caps().max_wr, 32);
    /// ```
    pub fn srq(&self, srq: FixedSrq) -> Option<&Q::Srq> {
        match self.srqs.get(srq.index()) {
            Some(Some(slot)) if slot.handle == srq => Some(&slot.srq),
            _ => None,
        }
    }

    /// Pushes a receive to shared receive queue `srq`; it is posted by the
    /// next [`submit`](Self::submit), and completes naming the queue pair
    /// a message took it on. Refused, and handed back whole: a handle
    /// naming nothing, a token of another table, a full queue, a
    /// completion queue that could overflow, or a failed ring.
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::{SoftDevice, SoftQp}, SrqConfig};
    /// # use rdma_ring::fixed::*;
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// let mut ring: FixedRing<SoftQp> = FixedRing::new(dev.create_cq(256).unwrap(), FixedBufs::new(&pd, 4, 64).unwrap(), FixedRingConfig::default());
    /// let srq = ring.add_srq(dev.create_srq(&pd, SrqConfig { max_wr: 2, ..SrqConfig::default() }).unwrap()).unwrap();
    /// for _ in 0..2 {
    ///     let slot = ring.take_buf().unwrap();
    ///     ring.push_srq(srq, RecvFixed::new(slot)).unwrap();
    /// }
    /// let third = RecvFixed::new(ring.take_buf().unwrap());
    /// let (error, op) = ring.push_srq(srq, third).unwrap_err().into_parts();
    /// assert!(matches!(error, rdma_ring::Error::RecvQueueFull { .. }));
    /// ring.put_buf(op.into_buf()).unwrap();
    /// ```
    pub fn push_srq(&mut self, srq: FixedSrq, op: RecvFixed) -> Result<(), Rejected<RecvFixed>> {
        match self.try_push_srq(srq, &op, None, false) {
            Ok(_) => Ok(()),
            Err(error) => Err(Rejected::new(error, op)),
        }
    }

    /// [`push_srq`](Self::push_srq) with `tag` as the work's `user_data`
    /// in place of the receive's own, which is returned (as
    /// [`push_tagged`](Self::push_tagged) does).
    pub(crate) fn push_srq_tagged(
        &mut self,
        srq: FixedSrq,
        op: RecvFixed,
        tag: u64,
    ) -> Result<u64, Rejected<RecvFixed>> {
        self.try_push_srq(srq, &op, Some(tag), false)
            .map_err(|error| Rejected::new(error, op))
    }

    /// Pushes `op` (the refill's, if `refill`) with `tag` as its work's
    /// `user_data` in place of its own, if given; returns its own.
    pub(super) fn try_push_srq(
        &mut self,
        handle: FixedSrq,
        op: &RecvFixed,
        tag: Option<u64>,
        refill: bool,
    ) -> Result<u64, Error> {
        if let Some(why) = self.failed {
            return Err(Error::RingFailed(why));
        }
        let slot = match self.srqs.get_mut(handle.index()) {
            Some(Some(slot)) if slot.handle == handle => slot,
            _ => return Err(Error::NotAttached("shared receive queue")),
        };
        let credit = (self.cq_free, self.cq_entries);
        let (work, own_user_data) = admit(op, &slot.limits, tag, &self.bufs, credit)?;
        let Some(seq) = slot.receives.push(
            RecvEntry {
                user_data: work.user_data,
                index: work.index,
            },
            refill,
        ) else {
            return Err(Error::RecvQueueFull {
                outstanding: slot.receives.in_use(),
                depth: slot.receives.depth(),
            });
        };
        let start = slot.sges.len() as u32;
        slot.sges.push(self.bufs.sge_of(work.index, work.len));
        slot.wrs.push(RecvWr {
            wr_id: srq_wr_id(handle.index() as u32, seq),
            sges: SgeSpan { start, len: 1 },
        });
        self.cq_free -= 1;
        self.srqs_dirty = true;
        Ok(own_user_data)
    }

    /// Posts every shared receive queue's pushed receives, one doorbell
    /// each; returns how many were posted. Receives a queue refuses come
    /// back flushed from the next reap (the queue takes more work after);
    /// the first refusal is returned with the posted count.
    pub(super) fn post_srqs(&mut self) -> Result<usize, (usize, Error)> {
        self.srqs_dirty = false;
        let table = self.bufs.table();
        let mut posted = 0;
        let mut first_error = None;
        for slot in self.srqs.iter_mut().flatten() {
            let result = slot.post(table, &mut self.ready, &mut self.cq_free);
            tally(&mut posted, &mut first_error, result);
        }
        match first_error {
            None => Ok(posted),
            Some(error) => Err((posted, error)),
        }
    }

    /// Hands back every shared receive queue's pushed, unposted receives,
    /// flushed, from the next reap.
    pub(super) fn flush_srqs_unposted(&mut self) {
        let table = self.bufs.table();
        for slot in self.srqs.iter_mut().flatten() {
            self.cq_free += slot.flush_unposted(table, &mut self.ready);
        }
        self.srqs_dirty = false;
    }

    /// Receives of `srq` posted and not yet handed back.
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::{SoftDevice, SoftQp}, SrqConfig};
    /// # use rdma_ring::fixed::*;
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// # let mut ring: FixedRing<SoftQp> = FixedRing::new(dev.create_cq(256).unwrap(), FixedBufs::new(&pd, 4, 64).unwrap(), FixedRingConfig::default());
    /// let srq = ring.add_srq(dev.create_srq(&pd, SrqConfig::default()).unwrap()).unwrap();
    /// let slot = ring.take_buf().unwrap();
    /// ring.push_srq(srq, RecvFixed::new(slot)).unwrap();
    /// assert_eq!(ring.srq_posted(srq).unwrap(), 0); // pushed, not posted
    /// ring.submit().unwrap();
    /// assert_eq!(ring.srq_posted(srq).unwrap(), 1);
    /// ```
    pub fn srq_posted(&self, srq: FixedSrq) -> Result<usize, Error> {
        match self.srqs.get(srq.index()) {
            Some(Some(slot)) if slot.handle == srq => Ok(slot.posted()),
            _ => Err(Error::NotAttached("shared receive queue")),
        }
    }

    /// Arms `srq`'s low-water event: when fewer than `limit` receives
    /// remain posted, the device raises
    /// [`AsyncEvent::SrqLimitReached`](crate::backend::AsyncEvent::SrqLimitReached)
    /// once, on its event channel (which the caller reads; see
    /// [`apply_event`](Self::apply_event)).
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::{SoftDevice, SoftQp}, SrqConfig};
    /// # use rdma_ring::fixed::*;
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// # let mut ring: FixedRing<SoftQp> = FixedRing::new(dev.create_cq(256).unwrap(), FixedBufs::new(&pd, 4, 64).unwrap(), FixedRingConfig::default());
    /// let srq = ring.add_srq(dev.create_srq(&pd, SrqConfig { max_wr: 16, ..SrqConfig::default() }).unwrap()).unwrap();
    /// ring.arm_srq_limit(srq, 4).unwrap();
    /// assert!(ring.arm_srq_limit(srq, 17).is_err()); // deeper than the queue
    /// ```
    pub fn arm_srq_limit(&mut self, srq: FixedSrq, limit: u32) -> Result<(), Error> {
        match self.srqs.get_mut(srq.index()) {
            Some(Some(slot)) if slot.handle == srq => slot.srq.arm_limit(limit),
            _ => Err(Error::NotAttached("shared receive queue")),
        }
    }

    /// Removes shared receive queue `srq`, destroys it, and hands it back;
    /// its receives come back flushed from the next reap (those a message
    /// already filled, as they completed). Refused while queue pairs that
    /// take its receives are attached ([`Error::Incompatible`]), and if
    /// the device refuses to destroy it — as it does while a queue pair
    /// created on it still exists, detached or not: drop those first. A
    /// refused removal leaves the queue held and its posted receives
    /// posted (those pushed and not posted come back flushed, and those
    /// already completed as they completed).
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::{SoftDevice, SoftQp}, QpConfig, SrqConfig, WcStatus};
    /// # use rdma_ring::fixed::*;
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// let mut ring: FixedRing<SoftQp> = FixedRing::new(dev.create_cq(256).unwrap(), FixedBufs::new(&pd, 4, 64).unwrap(), FixedRingConfig::default());
    /// let srq = ring.add_srq(dev.create_srq(&pd, SrqConfig::default()).unwrap()).unwrap();
    /// let conn = ring.attach(dev.create_qp_on(&pd, ring.cq(), ring.srq(srq), QpConfig::default()).unwrap()).unwrap();
    /// let slot = ring.take_buf().unwrap();
    /// ring.push_srq(srq, RecvFixed::new(slot).user_data(5)).unwrap();
    /// ring.submit().unwrap();
    /// assert!(ring.remove_srq(srq).is_err()); // a queue pair on it is attached
    /// drop(ring.detach(conn).unwrap());
    /// let _srq = ring.remove_srq(srq).unwrap();
    /// let back = ring.wait(1).unwrap();
    /// assert_eq!((back[0].user_data(), back[0].status()), (5, WcStatus::WrFlushErr));
    /// ```
    pub fn remove_srq(&mut self, srq: FixedSrq) -> Result<Q::Srq, Error> {
        let index = srq.index();
        let slot = match self.srqs.get_mut(index) {
            Some(Some(slot)) if slot.handle == srq => slot,
            _ => return Err(Error::NotAttached("shared receive queue")),
        };
        if slot.attached > 0 {
            return Err(Error::Incompatible(
                "queue pairs that take its receives are still attached",
            ));
        }
        let table = self.bufs.table();
        self.cq_free += slot.flush_unposted(table, &mut self.ready);
        // Receives a message already filled have their completions queued:
        // take them before the rest come back flushed.
        if self.failed.is_none() {
            let _ = self.reap_queued_into_ready();
        }
        let slot = self.srqs[index].as_mut().expect("checked above");
        slot.srq.destroy()?;
        self.cq_free += slot.release_posted(table, &mut self.ready);
        let slot = self.srqs[index].take().expect("checked above");
        self.srq_resume[index] = slot.receives.next_seq();
        self.refilling = self.srqs.iter().flatten().any(|s| s.refill.is_some());
        Ok(slot.srq)
    }

    /// Announces queue pair number `qp_num`, made on shared receive queue
    /// `srq` and not attached yet (connected first, say, and attached once
    /// its handshake is done). A completion of one of the queue's receives
    /// is acted on only if it names a queue pair on that queue: attached,
    /// detached from it, or announced here. Any other number may be a
    /// queue pair on another ring's queue whose `wr_id` only looks like
    /// one of ours while our receive is still posted, so such a completion
    /// is counted as unknown and not acted on, and a receive a queue pair
    /// took before it was attached or announced stays counted as posted
    /// (its slot held) until the queue is removed. The receives an
    /// announced queue pair takes before it is attached complete naming
    /// no queue pair ([`FixedCompletion::qp`] equals no handle the ring
    /// gave out). The latest 1024 numbers announced or detached are
    /// remembered.
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::SoftDevice, QpConfig, SrqConfig};
    /// # use rdma_ring::fixed::*;
    /// let dev = SoftDevice::new();
    /// let pd = dev.alloc_pd();
    /// let mut ring = FixedRing::new(dev.create_cq(64).unwrap(), FixedBufs::new(&pd, 4, 64).unwrap(), FixedRingConfig::default());
    /// let srq = ring.add_srq(dev.create_srq(&pd, SrqConfig::default()).unwrap()).unwrap();
    /// let qp = dev.create_qp_on(&pd, ring.cq(), ring.srq(srq), QpConfig::default()).unwrap();
    /// ring.expect_on_srq(srq, qp.qpn()).unwrap();
    /// // ... connect it, and let it take receives; then:
    /// ring.attach(qp).unwrap();
    /// ```
    pub fn expect_on_srq(&mut self, srq: FixedSrq, qp_num: u32) -> Result<(), Error> {
        let index = self
            .srq_slot_of(srq)
            .ok_or(Error::NotAttached("shared receive queue"))?;
        if self.consumers.find(qp_num).is_some() {
            // Attached: its number already names it.
            return Ok(());
        }
        self.srqs[index]
            .as_mut()
            .expect("found above")
            .remember(qp_num, false);
        Ok(())
    }

    /// The slot of the shared receive queue `srq` names, if it names one.
    pub(super) fn srq_slot_of(&self, srq: FixedSrq) -> Option<usize> {
        match self.srqs.get(srq.index()) {
            Some(Some(slot)) if slot.handle == srq => Some(srq.index()),
            _ => None,
        }
    }

    /// The slot of the held shared receive queue `id`.
    pub(super) fn srq_index_of(&self, id: SrqId) -> Option<usize> {
        self.srqs
            .iter()
            .position(|slot| slot.as_ref().is_some_and(|s| s.id == id))
    }

    /// The device reported every receive that queue pair `qpn`, detached
    /// from one of the ring's shared receive queues, took: reaps them (so
    /// they are not lost with it) and forgets it. Whether it was one.
    pub(super) fn last_receive_of_former(&mut self, qpn: u32) -> bool {
        let known = self.srqs.iter().flatten().any(|slot| slot.had(qpn));
        if !known {
            return false;
        }
        // Reaped while it is remembered: its completions still name one
        // of the queue's receives.
        if self.failed.is_none() {
            let _ = self.reap_queued_into_ready();
        }
        for slot in self.srqs.iter_mut().flatten() {
            slot.forget_former(qpn);
        }
        true
    }

    /// At teardown, after the queue pairs drained (`drained`): reaps what
    /// is queued while they are known, destroys them, then destroys each
    /// shared receive queue and hands back its receives, flushed, to
    /// `out`. Returns whether every queue was destroyed (else the caller
    /// leaks the slots' memory: the device may still fill them).
    pub(super) fn release_srqs(&mut self, drained: bool, out: &mut Vec<FixedCompletion>) -> bool {
        if self.failed.is_none() {
            let _ = self.reap_queued_into_ready();
        }
        out.append(&mut self.ready);
        // Queue pairs first: a shared receive queue cannot be destroyed
        // while one is on it, and none may take a receive once it is gone.
        for slot in &mut self.qps {
            *slot = None;
        }
        self.consumers.clear();
        let table = self.bufs.table();
        let mut all = true;
        for slot in self.srqs.iter_mut().flatten() {
            slot.attached = 0;
            if drained && slot.srq.destroy().is_ok() {
                self.cq_free += slot.release_posted(table, out);
            } else {
                all = false;
            }
        }
        all
    }
}
