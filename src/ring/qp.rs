//! Queue pairs attached to a ring: their state, credits and signaling, and
//! attaching and detaching them.

use std::collections::VecDeque;

use super::lifecycle::Owner;
use super::{InFlight, Key, QpHandle, QueueRef, Ring};
use crate::backend::{
    QpCaps, QueuePair, RecvWr, SendFlags, SendOpcode, SendWr, Sge, SgeSpan, WcStatus,
};
use crate::buf::OwnedBufs;
use crate::deadline::Deadline;
use crate::error::{Error, Rejected};
use crate::op::OpKind;

/// Counters of one queue pair of a ring.
///
/// ```
/// use rdma_ring::ring::QpStats;
/// assert_eq!(QpStats::default().doorbells, 0);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct QpStats {
    /// Post calls made on its queues.
    pub doorbells: u64,
    /// Send work requests posted.
    pub send_wrs: u64,
    /// Send work requests posted with a CQE requested.
    pub signaled: u64,
    /// Receive work requests posted to its own receive queue.
    pub recv_wrs: u64,
    /// CQEs of its work reaped.
    pub cqes: u64,
    /// Operations completed implicitly by a later signaled CQE.
    pub implicit: u64,
    /// Send-queue operations pushed on it (posted or still pending, and
    /// those a refused post handed back), in push order.
    pub sends_pushed: u64,
    /// Of [`sends_pushed`](Self::sends_pushed), the first ones, in push
    /// order, that finished: completed (with a CQE of their own or
    /// implicitly), flushed, or handed back unposted, up to the first
    /// that has not. So the `n`-th send pushed has finished once
    /// `sends_done >= n` — what a layer above counts its own sends' slots
    /// with, whoever their futures went to. (Sends a refused post handed
    /// back count only once those posted before them finished.) The
    /// ring's own markers count in neither.
    pub sends_done: u64,
}

/// Queue depths a ring takes at most (per queue pair or shared receive
/// queue): its tables are sized from them.
pub(super) const MAX_DEPTH: u32 = 1 << 24;

/// A queue pair the ring gave back ([`Ring::detach`]).
#[derive(Debug)]
pub struct Detached<Q> {
    /// The queue pair, in the error state if it had work in flight.
    pub qp: Q,
    /// Whether every operation it had in flight came back (to its owner:
    /// the completion queue or a future). If not, the device did not
    /// return them within the drain timeout, and their buffers were leaked.
    pub drained: bool,
}

pub(super) struct QpSlot<Q> {
    pub(super) qp: Q,
    pub(super) caps: QpCaps,
    /// The ring's slot key of its shared receive queue.
    pub(super) srq: Option<Key>,
    pub(super) send_limit: usize,
    pub(super) recv_limit: usize,
    pub(super) signal_interval: usize,
    /// Whether a send slot and a CQE are kept for its teardown marker (the
    /// CQE moves from the reservation to the used budget when the marker is
    /// posted).
    pub(super) marker_reserved: bool,
    pub(super) pending_send: Vec<SendWr>,
    pub(super) send_sges: Vec<Sge>,
    pub(super) pending_recv: Vec<RecvWr>,
    pub(super) recv_sges: Vec<Sge>,
    /// Posted send work requests in posting order, for implicit completion.
    pub(super) send_order: VecDeque<Key>,
    pub(super) outstanding_send: usize,
    pub(super) outstanding_recv: usize,
    pub(super) since_signal: usize,
    pub(super) error: Option<WcStatus>,
    /// Its number was a queue pair's detached from the same shared receive
    /// queue, whose late flushes may still come naming it.
    pub(super) reused_number: bool,
    /// The first send of a post the backend could not account for (it
    /// reported every work request taken, not knowing which were): from
    /// it on, a send released without a CQE of its own may never have
    /// run, so it is released as flushed, not as done. Those before it
    /// ran, as RC completes in order.
    pub(super) unaccounted_from: Option<Key>,
    /// The last send the device took asked for no CQE, and no marker
    /// followed it: its completion, and those of the unsignaled sends
    /// before it, wait for a later signaled one.
    pub(super) tail_unsignaled: bool,
    /// The teardown marker in flight: a slab entry of its own, so its
    /// `wr_id` names this attachment only.
    pub(super) drain: Option<Key>,
    /// The ring's markers (sync and teardown) posted and not yet finished:
    /// they hold send slots but are nobody's operations.
    pub(super) markers_out: usize,
    /// Runs of send operations finished without being posted (handed
    /// back or flushed from the pending list), each with how many sends were posted before it:
    /// a run counts as done (in push order) only once they all finished,
    /// since it was pushed after them.
    pub(super) unposted_runs: VecDeque<(u64, u64)>,
    /// Unposted sends of runs already done.
    pub(super) unposted_done: u64,
    pub(super) dirty: bool,
    /// The device said it will take no more receives from the shared
    /// receive queue.
    pub(super) last_wqe: bool,
    pub(super) stats: QpStats,
}

impl<Q> QpSlot<Q> {
    /// Its counters, with the send counts worked out from the queue's
    /// state (kept off the push and reap paths).
    fn stats(&self) -> QpStats {
        QpStats {
            sends_pushed: self.stats.send_wrs
                + self.unposted_done
                + self.unposted_runs.iter().map(|&(_, n)| n).sum::<u64>()
                + self.pending_send.len() as u64,
            sends_done: self.sends_done(),
            ..self.stats
        }
    }

    /// Posted sends finished: a prefix of those posted, RC completing a
    /// send queue in order (and the ring releasing in that order).
    fn posted_sends_done(&self) -> u64 {
        let out = self.outstanding_send.saturating_sub(self.markers_out) as u64;
        self.stats.send_wrs.saturating_sub(out)
    }

    /// The sends finished before the first that is not, in push order: the
    /// posted ones finished, and the unposted runs pushed after no posted
    /// send still out.
    fn sends_done(&self) -> u64 {
        let posted = self.posted_sends_done();
        let runs: u64 = self
            .unposted_runs
            .iter()
            .take_while(|&&(after, _)| after <= posted)
            .map(|&(_, n)| n)
            .sum();
        posted + self.unposted_done + runs
    }

    /// Counts a send finishing unposted, pushed after every send posted
    /// so far.
    pub(super) fn note_unposted_send(&mut self) {
        let posted = self.posted_sends_done();
        while let Some(&(after, n)) = self.unposted_runs.front() {
            if after > posted {
                break;
            }
            self.unposted_done += n;
            self.unposted_runs.pop_front();
        }
        let after = self.stats.send_wrs;
        match self.unposted_runs.back_mut() {
            Some((last, n)) if *last == after => *n += 1,
            _ => self.unposted_runs.push_back((after, 1)),
        }
    }

    pub(super) fn record_error(&mut self, status: WcStatus) {
        if self.error.is_none() {
            self.error = Some(status);
        }
    }

    /// Operations pushed or posted, not yet completed.
    pub(super) fn outstanding(&self) -> usize {
        self.outstanding_send
            + self.outstanding_recv
            + self.pending_send.len()
            + self.pending_recv.len()
    }

    /// Slab slots this queue pair may need: every operation its queues
    /// allow, and as many again finished but not yet collected by futures.
    pub(super) fn slab_share(&self) -> usize {
        2 * (self.send_limit + self.recv_limit)
    }
}

impl<Q: QueuePair> Ring<Q> {
    /// Attaches `qp`, which must have been created on this ring's
    /// completion queue ([`cq`](Self::cq)) and, if it takes receives from a
    /// shared receive queue, on one this ring holds
    /// ([`add_srq`](Self::add_srq)). Memory for its operations is allocated
    /// here, once. Refused (with the queue pair back) if the ring is closed
    /// or failed, or the queue pair does not fit. One on a shared receive
    /// queue that may take receives before it is attached (connected
    /// first) is announced first, with
    /// [`expect_on_srq`](Self::expect_on_srq).
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::SoftDevice, QpConfig};
    /// # use rdma_ring::ring::{Ring, RingConfig};
    /// let dev = SoftDevice::new();
    /// let pd = dev.alloc_pd();
    /// let mut ring = Ring::with_cq(dev.create_cq(512).unwrap(), RingConfig::default());
    /// let qp = dev.create_qp_on(&pd, ring.cq(), None, QpConfig::default()).unwrap();
    /// let handle = ring.attach(qp).unwrap();
    /// assert_eq!(ring.qps(), vec![handle]);
    /// // A queue pair with a completion queue of its own belongs elsewhere.
    /// let other = dev.create_qp(&pd, QpConfig::default()).unwrap();
    /// assert!(ring.attach(other).is_err());
    /// ```
    pub fn attach(&mut self, qp: Q) -> Result<QpHandle, Rejected<Q>> {
        if self.closed {
            return Err(Rejected::new(Error::Closed, qp));
        }
        if let Some(why) = self.failed {
            return Err(Rejected::new(Error::RingFailed(why), qp));
        }
        let caps = qp.caps();
        if caps.cq != self.cq_id {
            return Err(Rejected::new(
                Error::Incompatible("it completes on another completion queue than the ring's"),
                qp,
            ));
        }
        let srq =
            match caps.srq {
                None => None,
                Some(id) => match self.srq_key_by_id(id) {
                    Some(key) => Some(key),
                    None => return Err(Rejected::new(
                        Error::Incompatible(
                            "its shared receive queue is not held by this ring (add_srq it first)",
                        ),
                        qp,
                    )),
                },
            };
        if self.by_qpn.contains_key(&caps.qp_num) {
            return Err(Rejected::new(
                Error::Incompatible("a queue pair with its number is already attached"),
                qp,
            ));
        }
        if let Some(why) = depth_refusal(&caps) {
            return Err(Rejected::new(why, qp));
        }
        // One send slot and one CQE for the teardown marker, if there is
        // room to spare; without a marker, every send asks for a CQE, so a
        // drain still sees each one come back.
        let marker_reserved = caps.max_send_wr >= 2 && self.cqe_room() >= 2;
        let reserve = usize::from(marker_reserved);
        let send_limit = (caps.max_send_wr as usize - reserve).max(1);
        let recv_limit = if srq.is_some() {
            0
        } else {
            caps.max_recv_wr as usize
        };
        let signal_interval = match (marker_reserved, self.config.signal_interval) {
            (false, _) => 1,
            (true, 0) => (send_limit / 2).max(1),
            (true, n) => n.min(send_limit),
        };
        let slot = QpSlot {
            qp,
            caps,
            srq,
            send_limit,
            recv_limit,
            signal_interval,
            marker_reserved,
            pending_send: Vec::with_capacity(send_limit),
            send_sges: Vec::with_capacity(send_limit),
            pending_recv: Vec::with_capacity(recv_limit),
            recv_sges: Vec::with_capacity(recv_limit),
            send_order: VecDeque::with_capacity(send_limit + 1),
            outstanding_send: 0,
            outstanding_recv: 0,
            since_signal: 0,
            error: None,
            unaccounted_from: None,
            tail_unsignaled: false,
            drain: None,
            markers_out: 0,
            unposted_runs: VecDeque::new(),
            unposted_done: 0,
            dirty: false,
            last_wqe: false,
            reused_number: false,
            stats: QpStats::default(),
        };
        self.reserve_slots(slot.slab_share());
        if self.qps.len() == self.qps.capacity() {
            self.qps.grow(self.qps.capacity().max(4));
        }
        let key = self.qps.insert(slot).expect("grown above");
        self.by_qpn.insert(caps.qp_num, key);
        if let Some(slot) = srq.and_then(|srq| self.srqs.get_mut(srq)) {
            let reused = slot.join(caps.qp_num);
            self.qps.get_mut(key).expect("inserted").reused_number = reused;
        }
        self.cqe_reserved += reserve;
        let handle = QpHandle { ring: self.id, key };
        if self.default_qp().is_none() {
            self.default_qp = Some(handle);
        }
        self.stats.attached += 1;
        Ok(handle)
    }

    /// Makes room for `share` more operations in flight (and their
    /// completions), growing the tables only past the most the ring has
    /// needed so far, so attach/detach cycles do not grow them.
    pub(super) fn reserve_slots(&mut self, share: usize) {
        let needed = self.qps_share() + self.srqs_share() + share;
        let capacity = self.slab.capacity();
        if needed > capacity {
            self.slab.grow(needed - capacity);
            self.ready
                .reserve(needed.saturating_sub(self.ready.capacity()));
            self.wakes
                .reserve(needed.saturating_sub(self.wakes.capacity()));
        }
    }

    fn qps_share(&self) -> usize {
        self.qps
            .keys()
            .into_iter()
            .filter_map(|k| self.qps.get(k))
            .map(|slot| slot.slab_share())
            .sum()
    }

    /// Detaches queue pair `qp`: if it has work in flight, it is moved to
    /// error and its flushed completions are drained from the shared
    /// completion queue (completions of the other queue pairs are handled
    /// as usual meanwhile); only then are its buffers released to their
    /// owners. Operations pushed and not submitted come back flushed after
    /// those, so its completions keep the order its work was pushed in. On a
    /// shared receive queue, it then waits (up to
    /// [`RingConfig::last_wqe_timeout`](super::RingConfig::last_wqe_timeout),
    /// if the ring watches events) for the device to say it will take no
    /// more receives. The queue pair comes back in [`Detached`], in the
    /// error state; if the device did not drain in time, its in-flight
    /// buffers are leaked (never freed under the NIC) and `drained` is
    /// false. So it is too if the device refused to move the queue pair to
    /// error while it had work in flight or took receives from a shared
    /// receive queue: it may then still run (what the device had already
    /// given back is handed back, the rest leaked), and receives it takes
    /// from a shared receive queue complete as a former queue pair's. An
    /// idle queue pair of its own receives that the device refused to move
    /// comes back drained, in the state it was in.
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::SoftDevice, QpConfig, WcStatus};
    /// # use rdma_ring::buf::RegisteredBuf;
    /// # use rdma_ring::op::Recv;
    /// # use rdma_ring::ring::{Ring, RingConfig};
    /// let dev = SoftDevice::new();
    /// let pd = dev.alloc_pd();
    /// let (qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    /// let mut ring = Ring::new(qp, RingConfig::default());
    /// let handle = ring.default_qp().unwrap();
    /// ring.submission().push(Recv::new(RegisteredBuf::new(&pd, vec![0u8; 8]).unwrap())).unwrap();
    /// ring.submit().unwrap();
    /// let detached = ring.detach(handle).unwrap();
    /// assert!(detached.drained);
    /// let back = ring.completion().wait(1).unwrap();
    /// assert_eq!(back[0].status(), WcStatus::WrFlushErr);
    /// ```
    pub fn detach(&mut self, qp: QpHandle) -> Result<Detached<Q>, Error> {
        let key = self.qp_key(qp).ok_or(Error::NotAttached("queue pair"))?;
        let deadline = Deadline::after(self.config.drain_timeout);
        let mut drained = self.drain_qp(key, deadline);
        if drained {
            self.await_last_wqe(key);
            // Completions already in the queue (receives of a shared queue
            // it consumed, say) are reaped while it is still attached, so
            // they name it.
            self.reap_queued();
        } else {
            // The device may still hold its work: keep those buffers
            // forever (see `leak_ops_of`).
            self.leak_ops_of(QueueRef::Qp(key));
        }
        let slot = self.qps.remove(key).expect("checked above");
        drained &= slot.outstanding() == 0 && slot.drain.is_none();
        self.by_qpn.remove(&slot.caps.qp_num);
        // Once the device said it takes no more receives, and what it took
        // was reaped above, no completion will name it: its number is not
        // remembered, so a queue pair that takes it over is not suspected
        // of another's late flushes.
        if let Some(srq) = slot.srq.and_then(|srq| self.srqs.get_mut(srq)) {
            if !(drained && slot.last_wqe) {
                srq.leave(slot.caps.qp_num);
            }
        }
        self.cqe_reserved -= usize::from(slot.marker_reserved);
        self.dirty.retain(|q| *q != QueueRef::Qp(key));
        if self.default_qp == Some(qp) {
            self.default_qp = None;
        }
        self.stats.detached += 1;
        Ok(Detached {
            qp: slot.qp,
            drained,
        })
    }

    /// Moves queue pair `key` to error and reaps until its work has all come
    /// back, or `deadline`; then flushes what it never posted, which so
    /// comes out after what it did. Returns whether it drained.
    pub(super) fn drain_qp(&mut self, key: Key, deadline: Deadline) -> bool {
        let unposted = self.take_pending(QueueRef::Qp(key));
        let drained = self.drain_posted(key, deadline);
        self.flush_unposted(unposted);
        drained
    }

    fn drain_posted(&mut self, key: Key, deadline: Deadline) -> bool {
        if !self.start_drain(key, true) {
            // It may still run, so it is not drained; but what the device
            // already gave back is done, and is taken before the rest is
            // leaked.
            self.reap_queued();
            return false;
        }
        let drained = |ring: &Self| {
            let slot = ring.qps.get(key).expect("draining a live queue pair");
            slot.outstanding() == 0 && slot.drain.is_none()
        };
        loop {
            if drained(self) {
                return true;
            }
            // Unknown wr_ids are counted in stats; the drain goes on.
            let _ = self.reap_device();
            if deadline.expired() || self.cq_lost {
                // What the device gave back by the deadline counts, all of
                // it: not only the one batch polled above, or what waits
                // in the queue would be taken for work the device kept.
                self.reap_queued();
                return drained(self);
            }
            std::thread::yield_now();
        }
    }

    /// Moves queue pair `key` to error and posts its teardown marker, if it
    /// has work in flight (or always, with `always`: a queue pair leaving the
    /// ring must stop taking shared receives). Returns false if the device
    /// refused to move it to error while it had work (it cannot be
    /// drained).
    pub(super) fn start_drain(&mut self, key: Key, always: bool) -> bool {
        let slot = self.qps.get_mut(key).expect("draining a live queue pair");
        if slot.drain.is_some() {
            return true;
        }
        let idle = slot.outstanding() == 0;
        if idle && !always {
            return true;
        }
        slot.record_error(WcStatus::WrFlushErr);
        if slot.qp.set_error().is_err() {
            return idle && slot.srq.is_none();
        }
        if idle || !slot.marker_reserved {
            // Without a marker every send asked for a CQE of its own.
            return true;
        }
        // A signaled marker behind everything else: once its flush CQE
        // arrives, every earlier send has completed. The ones still without
        // a CQE then ran successfully before the error, since a flushed work
        // request always gets a CQE of its own (and that came first).
        let Some(marker) = self.slab.insert(InFlight {
            kind: OpKind::Send,
            queue: QueueRef::Qp(key),
            user_data: 0,
            len: 0,
            bufs: OwnedBufs::none(),
            posted: false,
            owner: Owner::Marker,
        }) else {
            return true;
        };
        let slot = self.qps.get_mut(key).expect("draining a live queue pair");
        let mut wr = SendWr::new(marker.to_wr_id(), SendOpcode::Send, SgeSpan::default());
        wr.flags = SendFlags::SIGNALED;
        // SAFETY: the marker has no scatter/gather element, so it names no
        // memory at all.
        if marker_taken(unsafe { slot.qp.post_send(&[wr], &[]) }) {
            slot.drain = Some(marker);
            slot.send_order.push_back(marker);
            slot.outstanding_send += 1;
            slot.markers_out += 1;
            // Its CQE moves from the reservation to the used budget.
            slot.marker_reserved = false;
            self.cqe_reserved -= 1;
            self.cqe_used += 1;
            self.expecting += 1;
            self.slab.get_mut(marker).expect("just inserted").posted = true;
        } else {
            self.slab.remove(marker);
        }
        true
    }

    /// After a drain, waits for the device to say a queue pair on a shared
    /// receive queue will take no more receives from it.
    fn await_last_wqe(&mut self, key: Key) {
        let slot = self.qps.get(key).expect("live");
        if slot.srq.is_none()
            || slot.last_wqe
            || !self.events.watching()
            || self.config.last_wqe_timeout.is_zero()
        {
            return;
        }
        let deadline = Deadline::after(self.config.last_wqe_timeout);
        while !self.qps.get(key).expect("live").last_wqe && !deadline.expired() {
            let _ = self.poll_events();
            let _ = self.reap_device();
            std::thread::yield_now();
        }
    }

    /// Counters of queue pair `qp`.
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
    /// let handle = ring.default_qp().unwrap();
    /// for _ in 0..3 {
    ///     let buf = RegisteredBuf::new(&pd, vec![0u8; 64]).unwrap();
    ///     ring.submission_on(handle).push(Recv::new(buf)).unwrap();
    /// }
    /// ring.submit().unwrap();
    /// let stats = ring.qp_stats(handle).unwrap();
    /// assert_eq!((stats.recv_wrs, stats.doorbells), (3, 1));
    /// ```
    pub fn qp_stats(&self, qp: QpHandle) -> Option<QpStats> {
        self.qp_key(qp)
            .and_then(|k| self.qps.get(k))
            .map(QpSlot::stats)
    }

    /// The status of the error that put queue pair `qp` in error, if one
    /// did.
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::SoftDevice, QpConfig};
    /// # use rdma_ring::buf::{ExposedBuf, RegisteredBuf, RemoteAccess};
    /// # use rdma_ring::op::Write;
    /// # use rdma_ring::ring::{Ring, RingConfig};
    /// use rdma_ring::backend::WcStatus;
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// # let (qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    /// # let target = ExposedBuf::new(&pd, vec![0u8; 64], RemoteAccess::WRITE).unwrap();
    /// qp.control().fail_nth(1, WcStatus::RemAccessErr);
    /// let mut ring = Ring::new(qp, RingConfig::default());
    /// let handle = ring.default_qp().unwrap();
    /// assert_eq!(ring.qp_error(handle), None);
    /// let buf = RegisteredBuf::new(&pd, vec![1u8; 64]).unwrap();
    /// ring.submission_on(handle).push(Write::new(buf, target.remote())).unwrap();
    /// ring.submit().unwrap();
    /// ring.completion().wait(1).unwrap();
    /// assert_eq!(ring.qp_error(handle), Some(WcStatus::RemAccessErr));
    /// ```
    pub fn qp_error(&self, qp: QpHandle) -> Option<WcStatus> {
        self.qp_key(qp)
            .and_then(|k| self.qps.get(k))
            .and_then(|slot| slot.error)
    }

    /// Moves queue pair `qp` to the error state: its outstanding operations
    /// come back flushed, and it takes no more work (detach it to release
    /// it). For a peer that went away, say, as a connection manager told.
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::SoftDevice, QpConfig};
    /// # use rdma_ring::buf::RegisteredBuf;
    /// # use rdma_ring::op::Recv;
    /// # use rdma_ring::ring::{Ring, RingConfig};
    /// use rdma_ring::Error;
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// # let (qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    /// let mut ring = Ring::new(qp, RingConfig::default());
    /// let handle = ring.default_qp().unwrap();
    /// let buf = RegisteredBuf::new(&pd, vec![0u8; 64]).unwrap();
    /// ring.submission_on(handle).push(Recv::new(buf).user_data(7)).unwrap();
    /// ring.submit().unwrap();
    /// ring.fail_qp(handle).unwrap();
    /// // The posted receive comes back flushed, and no new work is taken.
    /// let flushed = ring.completion().wait(1).unwrap();
    /// assert_eq!(flushed[0].user_data(), 7);
    /// assert!(!flushed[0].status().is_success());
    /// let buf = RegisteredBuf::new(&pd, vec![0u8; 64]).unwrap();
    /// let refused = ring.submission_on(handle).push(Recv::new(buf)).unwrap_err();
    /// assert!(matches!(refused.error(), Error::QpInError(_)));
    /// ```
    pub fn fail_qp(&mut self, qp: QpHandle) -> Result<(), Error> {
        let key = self.qp_key(qp).ok_or(Error::NotAttached("queue pair"))?;
        let slot = self.qps.get_mut(key).expect("checked");
        slot.record_error(WcStatus::WrFlushErr);
        slot.qp.set_error()
    }

    pub(super) fn send_room_at(&self, key: Key) -> usize {
        let Some(slot) = self.qps.get(key) else {
            return 0;
        };
        let used = slot.outstanding_send + slot.pending_send.len();
        slot.send_limit.saturating_sub(used).min(self.cqe_room())
    }

    pub(super) fn recv_room_at(&self, key: Key) -> usize {
        let Some(slot) = self.qps.get(key) else {
            return 0;
        };
        let used = slot.outstanding_recv + slot.pending_recv.len();
        slot.recv_limit.saturating_sub(used).min(self.cqe_room())
    }

    /// Why an operation of this kind cannot be pushed to queue pair `index`
    /// now, if it cannot.
    pub(super) fn qp_credit_error(&self, key: Key, recv: bool) -> Option<Error> {
        let slot = self.qps.get(key).expect("checked by the caller");
        if recv && slot.srq.is_some() {
            return Some(Error::Incompatible(
                "it takes its receives from a shared receive queue: push them with srq_submission",
            ));
        }
        let sends = slot.outstanding_send + slot.pending_send.len();
        let recvs = slot.outstanding_recv + slot.pending_recv.len();
        if recv && recvs >= slot.recv_limit {
            return Some(Error::RecvQueueFull {
                outstanding: recvs,
                depth: slot.recv_limit,
            });
        }
        if !recv && sends >= slot.send_limit {
            return Some(Error::SendQueueFull {
                outstanding: sends,
                depth: slot.send_limit,
            });
        }
        self.cq_credit_error()
    }

    pub(super) fn cq_credit_error(&self) -> Option<Error> {
        // One slab slot per queue pair stays free for its teardown marker.
        if self.slab.len() + self.qps.len() >= self.slab.capacity() {
            return Some(Error::Unclaimed(self.unclaimed()));
        }
        (self.cqe_room() == 0).then(|| Error::CompletionQueueFull {
            possible: self.cqe_used,
            entries: self.cq_entries.saturating_sub(self.cqe_reserved),
        })
    }
}

/// Why no ring takes a queue pair of these depths, if none does.
pub(super) fn depth_refusal(caps: &QpCaps) -> Option<Error> {
    let fits =
        caps.max_send_wr > 0 && caps.max_send_wr <= MAX_DEPTH && caps.max_recv_wr <= MAX_DEPTH;
    (!fits).then_some(Error::Incompatible(
        "its queue depths are beyond what a ring takes (1 to 2^24 sends, up to 2^24 receives)",
    ))
}

/// Whether the device took a marker posted alone: a backend that cannot
/// tell what it took reports it taken, as it may have been, and its
/// completion must then find its entry.
pub(super) fn marker_taken(posted: Result<(), crate::backend::PostError>) -> bool {
    matches!(
        posted,
        Ok(()) | Err(crate::backend::PostError { accepted: 1.., .. })
    )
}
