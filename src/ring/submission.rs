//! Pushing operations and posting them with one doorbell per queue.

use std::fmt;

use super::lifecycle::Owner;
use super::{qp, InFlight, Key, PushResult, QpHandle, QueueRef, Ring, SrqHandle};
use crate::backend::{
    PostError, QueuePair, RecvWr, SendFlags, SendOpcode, SendWr, SgeSpan, WcStatus,
};
use crate::buf::OwnedBufs;
use crate::error::{Error, Rejected};
use crate::op::{Limits, OpKind, Operation};

/// The submission side of a [`Ring`], for one of its queue pairs.
///
/// ```
/// # use rdma_ring::backend::{soft::SoftDevice, QpConfig};
/// # use rdma_ring::buf::RegisteredBuf;
/// # use rdma_ring::op::Recv;
/// # use rdma_ring::ring::{Ring, RingConfig};
/// # let dev = SoftDevice::new();
/// # let pd = dev.alloc_pd();
/// # let (qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
/// let mut ring = Ring::new(qp, RingConfig::default());
/// let mut sq = ring.submission();
/// for i in 0..4 {
///     let buf = RegisteredBuf::new(&pd, vec![0u8; 256]).unwrap();
///     sq.push(Recv::new(buf).user_data(i)).unwrap();
/// }
/// assert_eq!(sq.len(), 4);
/// assert_eq!(sq.submit().unwrap(), 4); // one post for all four
/// assert_eq!(ring.stats().doorbells, 1);
/// ```
pub struct SubmissionQueue<'a, Q: QueuePair> {
    pub(super) ring: &'a mut Ring<Q>,
    /// The queue pair's slot key; `None` if the ring does not hold it.
    pub(super) qp: Option<Key>,
    /// Whether a handle named it (so a missing one was detached), rather
    /// than the ring having no default queue pair.
    pub(super) named: bool,
}

impl<Q: QueuePair> SubmissionQueue<'_, Q> {
    /// Pushes an operation, to be posted by the next
    /// [`submit`](Self::submit). Never blocks: if the queue is full, the
    /// queue pair is in error, or the operation is invalid for this queue
    /// pair, the operation comes back inside the error.
    #[inline]
    pub fn push<T: Operation>(&mut self, op: T) -> PushResult<T> {
        let target = self.target();
        self.ring.push_to(target, op, Owner::Queue).map(|_| ())
    }

    /// Pushes operations until one is refused. Returns how many were pushed;
    /// on refusal, the refused operation and the rest of the iterator come
    /// back, so nothing is lost.
    #[allow(clippy::type_complexity)]
    pub fn push_many<T: Operation, I: IntoIterator<Item = T>>(
        &mut self,
        ops: I,
    ) -> Result<usize, Rejected<(T, I::IntoIter)>> {
        let mut ops = ops.into_iter();
        let mut pushed = 0;
        while let Some(op) = ops.next() {
            if let Err(rejected) = self.push(op) {
                let (error, op) = rejected.into_parts();
                return Err(Rejected::new(error, (op, ops)));
            }
            pushed += 1;
        }
        Ok(pushed)
    }

    /// Posts everything pushed since the last submit, on every queue of
    /// the ring: one linked list per queue with work, one doorbell each.
    /// Returns how many work requests were posted. If a device refuses part
    /// of a list, the operations from the refused one on come back in the
    /// error (the other queues' posts go ahead). A queue pair's receives
    /// go before its sends, and its sends only if every receive went: a
    /// reply to a send must not find its receive refused.
    pub fn submit(&mut self) -> Result<usize, SubmitError> {
        self.ring.submit_all()
    }

    /// Operations pushed to this queue pair and not yet submitted.
    pub fn len(&self) -> usize {
        self.qp
            .and_then(|k| self.ring.qps.get(k))
            .map_or(0, |slot| slot.pending_send.len() + slot.pending_recv.len())
    }

    /// Whether nothing is waiting for submit on this queue pair.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Send operations that may be pushed now.
    pub fn send_room(&self) -> usize {
        self.qp.map_or(0, |k| self.ring.send_room_at(k))
    }

    /// Receives that may be pushed now (0 on a shared receive queue).
    pub fn recv_room(&self) -> usize {
        self.qp.map_or(0, |k| self.ring.recv_room_at(k))
    }

    /// The queue pair this side pushes to.
    pub fn qp(&self) -> Option<QpHandle> {
        self.qp.and_then(|k| self.ring.qp_handle(k))
    }

    #[inline]
    fn target(&self) -> Result<Key, Error> {
        // A match rather than `ok_or`: an error built eagerly is dropped on
        // every push, which costs a call to its drop glue.
        match self.qp {
            Some(key) => Ok(key),
            None if self.named => Err(Error::NotAttached("queue pair")),
            None => Err(Error::NoQueuePair),
        }
    }
}

/// An operation the device never took: its buffers, kind and tag.
#[derive(Debug)]
pub struct Unposted {
    /// The operation's kind.
    pub kind: OpKind,
    /// The operation's tag.
    pub user_data: u64,
    /// Its buffers, back.
    pub bufs: OwnedBufs,
    /// The queue pair it was pushed to (`None` for a shared receive queue).
    pub qp: Option<QpHandle>,
    /// The shared receive queue it was pushed to, if it was.
    pub srq: Option<SrqHandle>,
}

/// A submit the device refused in part: why, how many work requests were
/// posted, and every operation that was not.
pub struct SubmitError {
    /// The device's reason (the first refusal's, if several queues refused).
    pub error: Error,
    /// Work requests posted (they complete normally).
    pub posted: usize,
    /// Operations not posted, in push order per queue (a queue pair's
    /// receives before its sends).
    pub unposted: Vec<Unposted>,
}

impl fmt::Debug for SubmitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SubmitError")
            .field("error", &self.error)
            .field("posted", &self.posted)
            .field("unposted", &self.unposted.len())
            .finish()
    }
}

impl fmt::Display for SubmitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "submit posted {} work requests, then: {} ({} operations handed back unposted)",
            self.posted,
            self.error,
            self.unposted.len()
        )
    }
}

impl std::error::Error for SubmitError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

/// A submit in progress: how much was posted, and what failed.
#[derive(Default)]
pub(super) struct Posting {
    pub(super) posted: usize,
    pub(super) failure: Option<(Error, Vec<Unposted>)>,
}

impl Posting {
    pub(super) fn refused(&mut self, error: Error, unposted: Vec<Unposted>) {
        match &mut self.failure {
            Some((_, list)) => list.extend(unposted),
            None => self.failure = Some((error, unposted)),
        }
    }

    /// Operations not posted because of a refusal already noted.
    fn hold_back(&mut self, unposted: Vec<Unposted>) {
        if let Some((_, list)) = &mut self.failure {
            list.extend(unposted);
        }
    }

    fn into_result(self) -> Result<usize, SubmitError> {
        match self.failure {
            None => Ok(self.posted),
            Some((error, unposted)) => Err(SubmitError {
                error,
                posted: self.posted,
                unposted,
            }),
        }
    }
}

impl<Q: QueuePair> Ring<Q> {
    /// Pushes `op` to queue pair `target` for `owner`.
    ///
    /// The common case costs one slot lookup and a handful of compares;
    /// every refusal is worked out in [`push_refusal`](Self::push_refusal),
    /// off the hot path. Always inlined: an out-of-line push saves and
    /// restores registers and returns its result through memory, which
    /// costs more than the push's own work.
    #[inline(always)]
    pub(super) fn push_to<T: Operation>(
        &mut self,
        target: Result<Key, Error>,
        op: T,
        owner: Owner,
    ) -> Result<Key, Rejected<T>> {
        let recv = op.kind().is_recv();
        // Both arms move `target` out, so no drop of it is left behind on
        // the way through.
        let qp = match target {
            Ok(qp) => qp,
            Err(error) => return Err(Rejected::new(self.ring_refusal(Some(error)), op)),
        };
        if self.closed || self.failed.is_some() {
            return Err(Rejected::new(self.ring_refusal(None), op));
        }
        let slab_room = self.slab.len() + self.qps.len() < self.slab.capacity();
        let cqe_room = self.cqe_room() > 0;
        let slot = self.qps.get_mut(qp).expect("a live queue pair");
        let room = if recv {
            slot.srq.is_none() && slot.outstanding_recv + slot.pending_recv.len() < slot.recv_limit
        } else {
            slot.outstanding_send + slot.pending_send.len() < slot.send_limit
        };
        if !(room && slab_room && cqe_room && slot.error.is_none()) {
            return Err(Rejected::new(self.push_refusal(qp, recv), op));
        }
        let limits = if recv {
            Limits::recv(&slot.caps)
        } else {
            Limits::send(&slot.caps)
        };
        if let Err(error) = op.check(&limits) {
            return Err(Rejected::new(error, op));
        }
        let sges = if recv {
            &mut slot.recv_sges
        } else {
            &mut slot.send_sges
        };
        let start = sges.len() as u32;
        op.push_sges(sges);
        let span = SgeSpan {
            start,
            len: sges.len() as u32 - start,
        };
        let prepared = op.into_prepared();
        let queued = matches!(owner, Owner::Queue);
        // The slab holds the buffers before any work request names them.
        let key = self.slab.insert_with_room(InFlight {
            kind: prepared.kind,
            queue: QueueRef::Qp(qp),
            user_data: prepared.user_data,
            len: prepared.len,
            bufs: prepared.bufs,
            posted: false,
            owner,
        });
        match prepared.wr {
            None => slot.pending_recv.push(RecvWr {
                wr_id: key.to_wr_id(),
                sges: span,
            }),
            Some(mut wr) => {
                wr.wr_id = key.to_wr_id();
                wr.sges = span;
                slot.since_signal += 1;
                if slot.since_signal >= slot.signal_interval {
                    wr.flags |= SendFlags::SIGNALED;
                }
                if wr.flags.contains(SendFlags::SIGNALED) {
                    slot.since_signal = 0;
                }
                slot.pending_send.push(wr);
            }
        }
        if !slot.dirty {
            slot.dirty = true;
            self.dirty.push(QueueRef::Qp(qp));
        }
        if queued {
            self.queued_in_flight += 1;
        }
        self.cqe_used += 1;
        Ok(key)
    }

    /// Why the ring takes no work now, or else the target's own error.
    #[cold]
    fn ring_refusal(&self, target: Option<Error>) -> Error {
        if self.closed {
            Error::Closed
        } else if let Some(why) = self.failed {
            Error::RingFailed(why)
        } else {
            target.unwrap_or(Error::NoQueuePair)
        }
    }

    /// Why queue pair `qp` refuses an operation of this kind now.
    #[cold]
    fn push_refusal(&self, qp: Key, recv: bool) -> Error {
        let slot = self.qps.get(qp).expect("a live queue pair");
        if let Some(status) = slot.error {
            return Error::QpInError(status);
        }
        self.qp_credit_error(qp, recv)
            .expect("push refused for a reason qp_credit_error names")
    }

    /// Slab entries held by operations finished but not collected (by
    /// futures), roughly: for the error message of a full slab.
    pub(super) fn unclaimed(&self) -> usize {
        self.slab
            .len()
            .saturating_sub(self.cqe_used.min(self.slab.len()))
    }

    /// Posts the pending work of every queue that has some.
    pub(super) fn submit_all(&mut self) -> Result<usize, SubmitError> {
        if self.dirty.is_empty() {
            return Ok(0);
        }
        if let Some(why) = self.failed {
            return Err(self.refuse_pending(why));
        }
        let mut posting = Posting::default();
        // Walked by index, not drained: the list keeps its place and
        // capacity. Nothing below adds a queue to it or drops one.
        let mut next = 0;
        while let Some(&queue) = self.dirty.get(next) {
            next += 1;
            match queue {
                QueueRef::Qp(key) => self.submit_qp(key, &mut posting),
                QueueRef::Srq(key) => {
                    if let Some(slot) = self.srqs.get_mut(key) {
                        slot.dirty = false;
                        self.submit_srq(key, &mut posting);
                    }
                }
            }
        }
        self.dirty.clear();
        posting.into_result()
    }

    /// A failed ring posts nothing: what was pushed before the failure
    /// (an awaited operation whose doorbell was deferred, say) would
    /// complete on a completion queue that gives nothing back, and be
    /// leaked. It goes back instead, intact: to the caller in the error,
    /// or, for awaited operations, to their futures as flushed.
    #[cold]
    #[inline(never)]
    fn refuse_pending(&mut self, why: &'static str) -> SubmitError {
        let mut unposted = Vec::new();
        for queue in std::mem::take(&mut self.dirty) {
            let keys = self.take_pending(queue);
            let (qp, srq) = match queue {
                QueueRef::Qp(key) => {
                    if let Some(slot) = self.qps.get_mut(key) {
                        slot.dirty = false;
                    }
                    (self.qp_handle(key), None)
                }
                QueueRef::Srq(key) => {
                    if let Some(slot) = self.srqs.get_mut(key) {
                        slot.dirty = false;
                    }
                    (None, self.srq_handle_of(queue))
                }
            };
            unposted.extend(self.remove_unposted(keys.into_iter().map(Key::to_wr_id), qp, srq));
        }
        SubmitError {
            error: Error::RingFailed(why),
            posted: 0,
            unposted,
        }
    }

    /// Posts queue pair `qp`'s pending receives and sends, one doorbell
    /// each. The common case (sends only, every one accepted) looks the
    /// queue pair up once.
    fn submit_qp(&mut self, qp: Key, posting: &mut Posting) {
        let Some(slot) = self.qps.get_mut(qp) else {
            return;
        };
        slot.dirty = false;
        let slot = if slot.pending_recv.is_empty() {
            slot
        } else if self.submit_recvs(qp, posting) {
            self.qps.get_mut(qp).expect("a live queue pair")
        } else {
            // Receives first, and sends only if they all went: a request
            // and the receive for its reply pushed in one submit must not
            // let the reply find no receive. The sends come back unposted
            // with the receives.
            let held = self.hand_back_from(qp, 0, |slot| &mut slot.pending_send);
            if let Some(slot) = self.qps.get_mut(qp) {
                slot.send_sges.clear();
            }
            posting.hold_back(held);
            return;
        };
        if !slot.pending_send.is_empty() {
            let last = slot.pending_send.last_mut().expect("not empty");
            if !last.flags.contains(SendFlags::SIGNALED) {
                last.flags |= SendFlags::SIGNALED;
                slot.since_signal = 0;
            }
            // SAFETY: every element names bytes of buffers held by the slab
            // until the work request completes (its own CQE, a later
            // signaled CQE on this send queue, or a flush); on a failed
            // teardown they are leaked, never freed.
            let result = unsafe { slot.qp.post_send(&slot.pending_send, &slot.send_sges) };
            let accepted = slot.accepted(&result, slot.pending_send.len());
            if matches!(&result, Err(e) if e.accepted >= slot.pending_send.len()) {
                // The device may have taken any prefix of this post: from
                // its first send on, what is released without a CQE of
                // its own may never have run.
                let first = Key::from_wr_id(slot.pending_send[0].wr_id);
                slot.unaccounted_from.get_or_insert(first);
            }
            // The slot and the slab are separate fields: the list is walked
            // in place, with no move out and back.
            let run = &slot.pending_send[..accepted];
            let mut signaled = 0;
            for wr in run {
                let key = Key::from_wr_id(wr.wr_id);
                self.slab
                    .get_mut(key)
                    .expect("pending op is in the slab")
                    .posted = true;
                signaled += u64::from(wr.flags.contains(SendFlags::SIGNALED));
            }
            // A run goes in with one extend (room made once, the keys
            // copied in); a single send with a push, which costs less than
            // setting up the extend.
            match run {
                [one] => slot.send_order.push_back(Key::from_wr_id(one.wr_id)),
                _ => slot
                    .send_order
                    .extend(run.iter().map(|wr| Key::from_wr_id(wr.wr_id))),
            }
            // What the device took last decides whether completions wait
            // for a later signaled send; a post it took none of changes
            // nothing (an earlier unsignaled tail still waits).
            if accepted > 0 {
                slot.tail_unsignaled = !slot.pending_send[accepted - 1]
                    .flags
                    .contains(SendFlags::SIGNALED);
            }
            let tail_unsignaled = slot.tail_unsignaled;
            slot.outstanding_send += accepted;
            slot.stats.doorbells += 1;
            slot.stats.send_wrs += accepted as u64;
            slot.stats.signaled += signaled;
            slot.send_sges.clear();
            self.stats.doorbells += 1;
            self.stats.send_wrs += accepted as u64;
            self.stats.signaled += signaled;
            self.expecting += accepted;
            posting.posted += accepted;
            if let Err(PostError { error, .. }) = result {
                // Refused with every request counted as taken: the backend
                // could not tell which it took (see `accepted`).
                let unaccounted = accepted == slot.pending_send.len();
                let unposted = self.hand_back_from(qp, accepted, |slot| &mut slot.pending_send);
                if unaccounted {
                    // What the device never took gets no CQE, its last
                    // send's included: the teardown marker goes in now,
                    // behind everything, and its flush releases the post
                    // (as flushed) without waiting for a detach or close
                    // to time out on it.
                    self.start_drain(qp, false);
                } else if tail_unsignaled {
                    self.post_sync_marker(qp);
                }
                posting.refused(error, unposted);
            } else {
                slot.pending_send.clear();
            }
        }
    }

    /// Posts queue pair `qp`'s pending receives with one doorbell.
    /// Returns whether the device took them all.
    fn submit_recvs(&mut self, qp: Key, posting: &mut Posting) -> bool {
        let slot = self.qps.get_mut(qp).expect("a live queue pair");
        // SAFETY: each receive names exactly the bytes of the buffers the
        // slab holds until the receive's completion is reaped; on a failed
        // teardown they are leaked, never freed.
        let result = unsafe { slot.qp.post_recv(&slot.pending_recv, &slot.recv_sges) };
        let accepted = slot.accepted(&result, slot.pending_recv.len());
        // The slot and the slab are separate fields: the list is walked in
        // place.
        for wr in &slot.pending_recv[..accepted] {
            let key = Key::from_wr_id(wr.wr_id);
            self.slab
                .get_mut(key)
                .expect("pending op is in the slab")
                .posted = true;
        }
        slot.outstanding_recv += accepted;
        slot.stats.doorbells += 1;
        slot.stats.recv_wrs += accepted as u64;
        slot.recv_sges.clear();
        self.stats.doorbells += 1;
        self.stats.recv_wrs += accepted as u64;
        self.expecting += accepted;
        posting.posted += accepted;
        if let Err(PostError { error, .. }) = result {
            let unposted = self.hand_back_from(qp, accepted, |slot| &mut slot.pending_recv);
            posting.refused(error, unposted);
            false
        } else {
            slot.pending_recv.clear();
            true
        }
    }

    /// Empties one of queue pair `qp`'s pending lists after a post the
    /// device refused from `accepted` on, handing the refused operations
    /// back. The list leaves the slot meanwhile (the slab is updated as
    /// they go) and comes back empty, keeping its capacity.
    fn hand_back_from<W: PendingWr>(
        &mut self,
        qp: Key,
        accepted: usize,
        list: impl Fn(&mut qp::QpSlot<Q>) -> &mut Vec<W>,
    ) -> Vec<Unposted> {
        let slot = self.qps.get_mut(qp).expect("a live queue pair");
        let mut pending = std::mem::take(list(slot));
        let handle = self.qp_handle(qp);
        let unposted = self.remove_unposted(
            pending[accepted..].iter().map(PendingWr::wr_id),
            handle,
            None,
        );
        pending.clear();
        *list(self.qps.get_mut(qp).expect("a live queue pair")) = pending;
        unposted
    }

    /// The accepted prefix of a partial post ends unsignaled: post a
    /// zero-length signaled RDMA WRITE behind it, whose CQE releases the
    /// prefix. It takes the send slot (and CQE) an unposted op freed, and a
    /// slab entry of its own, so that its `wr_id` is as unique as an
    /// operation's. If it cannot be posted, the queue pair's tail stays
    /// unsignaled: the next submit's last send asks for a CQE, and, should
    /// none come, the ring tries the marker again while it waits
    /// ([`retry_sync_markers`](Self::retry_sync_markers)): the prefix's
    /// owners may wait for it before sending anything more.
    fn post_sync_marker(&mut self, qp: Key) {
        // Not into the slab entries kept for teardown markers: awaited
        // operations handed back unposted keep theirs until their futures
        // take them, so the slab may be that full.
        if self.slab.len() + self.qps.len() >= self.slab.capacity() {
            self.sync_owed = true;
            return;
        }
        let Some(key) = self.slab.insert(InFlight {
            kind: OpKind::Write,
            queue: QueueRef::Qp(qp),
            user_data: 0,
            len: 0,
            bufs: OwnedBufs::none(),
            posted: false,
            owner: Owner::Marker,
        }) else {
            self.sync_owed = true;
            return;
        };
        let slot = self.qps.get_mut(qp).expect("a live queue pair");
        let mut marker = SendWr::new(key.to_wr_id(), SendOpcode::Write, SgeSpan::default());
        marker.flags = SendFlags::SIGNALED;
        // SAFETY: a zero-length work request names no memory.
        let posted = qp::marker_taken(unsafe { slot.qp.post_send(&[marker], &[]) });
        slot.stats.doorbells += 1;
        self.stats.doorbells += 1;
        if posted {
            slot.tail_unsignaled = false;
            slot.send_order.push_back(key);
            slot.outstanding_send += 1;
            slot.markers_out += 1;
            slot.stats.signaled += 1;
            self.stats.signaled += 1;
            self.cqe_used += 1;
            self.expecting += 1;
            self.slab.get_mut(key).expect("just inserted").posted = true;
        } else {
            self.sync_owed = true;
            self.slab.remove(key);
        }
    }

    /// Posts again the sync markers that could not be posted, for queue
    /// pairs that have sent nothing since (a send would have asked for
    /// the CQE itself) and have room for one; the rest wait for the next
    /// try. Run while the ring waits, off the reap path.
    #[cold]
    #[inline(never)]
    pub(super) fn retry_sync_markers(&mut self) {
        self.sync_owed = false;
        if self.closed || self.failed.is_some() {
            // Nothing more is read from the completion queue.
            return;
        }
        for key in self.qps.keys() {
            let Some(slot) = self.qps.get(key) else {
                continue;
            };
            if !slot.tail_unsignaled || slot.error.is_some() || slot.send_order.is_empty() {
                continue;
            }
            if !slot.pending_send.is_empty() || self.qp_credit_error(key, false).is_some() {
                // A submit will post a signaled send; or no room yet (a
                // send slot, a CQE, a slab entry beyond the teardown
                // markers' reservation).
                self.sync_owed = true;
                continue;
            }
            self.post_sync_marker(key);
        }
    }

    /// Operations the device did not take go back to their owners: to the
    /// caller in the list, or, for awaited ones, to their futures as
    /// flushed (they never ran).
    pub(super) fn remove_unposted(
        &mut self,
        wr_ids: impl Iterator<Item = u64>,
        qp: Option<QpHandle>,
        srq: Option<SrqHandle>,
    ) -> Vec<Unposted> {
        let mut unposted = Vec::new();
        for key in wr_ids.map(Key::from_wr_id) {
            self.count_unposted_send(key);
            let queued = matches!(self.slab.get(key).map(|op| &op.owner), Some(Owner::Queue));
            if !queued {
                self.finish(key, WcStatus::WrFlushErr, Some(0), None, false, None);
                continue;
            }
            let op = self.slab.remove(key).expect("pending op is in the slab");
            self.queued_in_flight -= 1;
            self.cqe_used -= 1;
            unposted.push(Unposted {
                kind: op.kind,
                user_data: op.user_data,
                bufs: op.bufs,
                qp,
                srq,
            });
        }
        unposted
    }

    /// Hands every pushed-but-unsubmitted operation of `queue` back as a
    /// flushed completion (teardown).
    pub(super) fn flush_pending(&mut self, queue: QueueRef) {
        let keys = self.take_pending(queue);
        self.flush_unposted(keys);
    }

    /// Takes `queue`'s pushed-but-unsubmitted operations off its lists
    /// (they stay in the slab): a drain flushes them once the work the
    /// queue posted is back, so a queue pair's completions come out in the
    /// order its work was pushed.
    pub(super) fn take_pending(&mut self, queue: QueueRef) -> Vec<Key> {
        match queue {
            QueueRef::Qp(key) => {
                let Some(slot) = self.qps.get_mut(key) else {
                    return Vec::new();
                };
                slot.send_sges.clear();
                slot.recv_sges.clear();
                slot.pending_recv
                    .drain(..)
                    .map(|wr| wr.wr_id)
                    .chain(slot.pending_send.drain(..).map(|wr| wr.wr_id))
                    .map(Key::from_wr_id)
                    .collect()
            }
            QueueRef::Srq(key) => {
                let Some(slot) = self.srqs.get_mut(key) else {
                    return Vec::new();
                };
                slot.sges.clear();
                slot.pending
                    .drain(..)
                    .map(|wr| Key::from_wr_id(wr.wr_id))
                    .collect()
            }
        }
    }

    /// Counts operation `key`, about to finish unposted, in its queue
    /// pair's finished sends if it is a send.
    fn count_unposted_send(&mut self, key: Key) {
        let Some(op) = self.slab.get(key) else { return };
        if let (false, QueueRef::Qp(qp)) = (op.kind.is_recv(), op.queue) {
            if let Some(slot) = self.qps.get_mut(qp) {
                slot.note_unposted_send();
            }
        }
    }

    /// Hands operations [`take_pending`](Self::take_pending) took back as
    /// flushed completions.
    pub(super) fn flush_unposted(&mut self, keys: Vec<Key>) {
        for key in keys {
            self.count_unposted_send(key);
            self.finish(key, WcStatus::WrFlushErr, Some(0), None, false, None);
        }
    }
}

impl<Q: QueuePair> qp::QpSlot<Q> {
    /// How many of `len` posted work requests the device took. A refusal
    /// that claims them all (the backend could not tell which it took) or
    /// more than were posted (a backend bug) counts as taking them all, and
    /// moves the queue pair to error: whatever the device did take then
    /// comes back flushed, and nothing it may hold is handed back early
    /// (the send path also marks where such a post began, see
    /// `unaccounted_from`, and posts the teardown marker behind it, if it
    /// has one, whose flush releases what the device never took; what a
    /// receive post never took waits for the drain's timeout).
    #[inline]
    fn accepted(&mut self, result: &Result<(), PostError>, len: usize) -> usize {
        match result {
            Ok(()) => len,
            Err(PostError { accepted, .. }) if *accepted < len => *accepted,
            Err(_) => {
                self.record_error(WcStatus::LocQpOpErr);
                // If even this fails the ring still refuses new work; the
                // operations come back when the device reports them, or are
                // leaked at teardown.
                let _ = self.qp.set_error();
                len
            }
        }
    }
}

/// A pending work request of either queue: what a refused post hands back
/// by.
trait PendingWr {
    fn wr_id(&self) -> u64;
}

impl PendingWr for SendWr {
    fn wr_id(&self) -> u64 {
        self.wr_id
    }
}

impl PendingWr for RecvWr {
    fn wr_id(&self) -> u64 {
        self.wr_id
    }
}
