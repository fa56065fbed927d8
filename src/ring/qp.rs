//! Queue pairs attached to a ring: their state, credits and signaling, and
//! attaching and detaching them.

use std::collections::VecDeque;

use super::{marker_key, Key, QpHandle, QueueRef, Ring, DRAIN_INDEX};
use crate::backend::{
    QpCaps, QueuePair, RecvWr, SendFlags, SendOpcode, SendWr, Sge, SgeSpan, WcStatus,
};
use crate::deadline::Deadline;
use crate::error::{Error, Rejected};

/// Counters of one queue pair of a ring.
///
/// ```
/// use rdma_ring::ring::QpStats;
/// assert_eq!(QpStats::default().doorbells, 0);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
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
}

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
    /// The ring's table index of its shared receive queue.
    pub(super) srq: Option<u32>,
    pub(super) send_limit: usize,
    pub(super) recv_limit: usize,
    pub(super) signal_interval: usize,
    /// Whether a send slot and a CQE are kept for its teardown marker.
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
    pub(super) force_signal: bool,
    pub(super) error: Option<WcStatus>,
    pub(super) drain_posted: bool,
    pub(super) dirty: bool,
    /// The device said it will take no more receives from the shared
    /// receive queue.
    pub(super) last_wqe: bool,
    pub(super) stats: QpStats,
}

impl<Q> QpSlot<Q> {
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
    /// or failed, or the queue pair does not fit.
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
                Some(id) => match self.srq_index_by_id(id) {
                    Some(index) => Some(index),
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
            force_signal: false,
            error: None,
            drain_posted: false,
            dirty: false,
            last_wqe: false,
            stats: QpStats::default(),
        };
        self.reserve_slots(slot.slab_share());
        if self.qps.len() == self.qps.capacity() {
            self.qps.grow(self.qps.capacity().max(4));
        }
        let key = self.qps.insert(slot).expect("grown above");
        self.by_qpn.insert(caps.qp_num, key.index);
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

    /// Detaches queue pair `qp`: operations pushed and not submitted come
    /// back flushed; if it has work in flight, it is moved to error and its
    /// flushed completions are drained from the shared completion queue
    /// (completions of the other queue pairs are handled as usual
    /// meanwhile); only then are its buffers released to their owners. On a
    /// shared receive queue, it then waits (up to
    /// [`RingConfig::last_wqe_timeout`](super::RingConfig::last_wqe_timeout),
    /// if the ring watches events) for the device to say it will take no
    /// more receives. The queue pair comes back in [`Detached`], in the
    /// error state; if the device did not drain in time, its in-flight
    /// buffers are leaked (never freed under the NIC) and `drained` is
    /// false.
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
        let index = self.qp_index(qp).ok_or(Error::NotAttached("queue pair"))?;
        let deadline = Deadline::after(self.config.drain_timeout);
        let mut drained = self.drain_qp(index, deadline);
        if drained {
            self.await_last_wqe(index);
        } else {
            self.leak_ops_of(super::QueueRef::Qp(index));
        }
        let slot = self.qps.remove(qp.key).expect("checked above");
        self.by_qpn.remove(&slot.caps.qp_num);
        self.cqe_reserved -= usize::from(slot.marker_reserved);
        self.dirty.retain(|q| *q != QueueRef::Qp(index));
        if self.default_qp == Some(qp) {
            self.default_qp = None;
        }
        self.stats.detached += 1;
        drained &= slot.outstanding() == 0;
        Ok(Detached {
            qp: slot.qp,
            drained,
        })
    }

    /// Moves queue pair `index` to error (if it has work in flight) and
    /// reaps until its work has all come back, or `deadline`. Returns
    /// whether it did.
    pub(super) fn drain_qp(&mut self, index: u32, deadline: Deadline) -> bool {
        self.flush_pending(QueueRef::Qp(index));
        if !self.start_drain(index, true) {
            return false;
        }
        loop {
            let slot = self.qps.at(index).expect("draining a live queue pair");
            if slot.outstanding() == 0 && !slot.drain_posted {
                return true;
            }
            // Unknown wr_ids are counted in stats; the drain goes on.
            let _ = self.reap_device();
            if deadline.expired() {
                return false;
            }
            std::thread::yield_now();
        }
    }

    /// Moves queue pair `index` to error and posts its teardown marker, if
    /// it has work in flight (or always, with `always`: a queue pair leaving
    /// the ring must stop taking shared receives). Returns false if the
    /// device refused to move it to error (it cannot be drained).
    pub(super) fn start_drain(&mut self, index: u32, always: bool) -> bool {
        let slot = self.qps.at_mut(index).expect("draining a live queue pair");
        if slot.drain_posted {
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
        if idle {
            return true;
        }
        // A signaled marker behind everything else: once its flush CQE
        // arrives, every earlier send has completed. The ones still without
        // a CQE then ran successfully before the error, since a flushed work
        // request always gets a CQE of its own (and that came first).
        if slot.marker_reserved {
            let mut marker = SendWr::new(
                marker_key(DRAIN_INDEX, index).to_wr_id(),
                SendOpcode::Send,
                SgeSpan::default(),
            );
            marker.flags = SendFlags::SIGNALED;
            // SAFETY: the marker has no scatter/gather element, so it names
            // no memory at all.
            if unsafe { slot.qp.post_send(&[marker], &[]) }.is_ok() {
                slot.drain_posted = true;
                self.expecting += 1;
            }
        }
        true
    }

    /// After a drain, waits for the device to say a queue pair on a shared
    /// receive queue will take no more receives from it.
    fn await_last_wqe(&mut self, index: u32) {
        let slot = self.qps.at(index).expect("live");
        if slot.srq.is_none()
            || slot.last_wqe
            || !self.events.watching()
            || self.config.last_wqe_timeout.is_zero()
        {
            return;
        }
        let deadline = Deadline::after(self.config.last_wqe_timeout);
        while !self.qps.at(index).expect("live").last_wqe && !deadline.expired() {
            let _ = self.poll_events();
            let _ = self.reap_device();
            std::thread::yield_now();
        }
    }

    /// Counters of queue pair `qp`.
    pub fn qp_stats(&self, qp: QpHandle) -> Option<QpStats> {
        self.qp_index(qp)
            .and_then(|i| self.qps.at(i))
            .map(|slot| slot.stats)
    }

    /// The status of the error that put queue pair `qp` in error, if one
    /// did.
    pub fn qp_error(&self, qp: QpHandle) -> Option<WcStatus> {
        self.qp_index(qp)
            .and_then(|i| self.qps.at(i))
            .and_then(|slot| slot.error)
    }

    /// Moves queue pair `qp` to the error state: its outstanding operations
    /// come back flushed, and it takes no more work (detach it to release
    /// it). For a peer that went away, say, as a connection manager told.
    pub fn fail_qp(&mut self, qp: QpHandle) -> Result<(), Error> {
        let index = self.qp_index(qp).ok_or(Error::NotAttached("queue pair"))?;
        let slot = self.qps.at_mut(index).expect("checked");
        slot.record_error(WcStatus::WrFlushErr);
        slot.qp.set_error()
    }

    pub(super) fn send_room_at(&self, index: u32) -> usize {
        let Some(slot) = self.qps.at(index) else {
            return 0;
        };
        let used = slot.outstanding_send + slot.pending_send.len();
        slot.send_limit.saturating_sub(used).min(self.cqe_room())
    }

    pub(super) fn recv_room_at(&self, index: u32) -> usize {
        let Some(slot) = self.qps.at(index) else {
            return 0;
        };
        let used = slot.outstanding_recv + slot.pending_recv.len();
        slot.recv_limit.saturating_sub(used).min(self.cqe_room())
    }

    /// Why an operation of this kind cannot be pushed to queue pair `index`
    /// now, if it cannot.
    pub(super) fn qp_credit_error(&self, index: u32, recv: bool) -> Option<Error> {
        let slot = self.qps.at(index).expect("checked by the caller");
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
        (self.cqe_room() == 0).then(|| Error::CompletionQueueFull {
            possible: self.cqe_used,
            entries: self.cq_entries.saturating_sub(self.cqe_reserved),
        })
    }
}
