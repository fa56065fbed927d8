//! The device's asynchronous events, peers that left, and failing a queue
//! pair on request, as the fixed ring applies them.

use super::ring::{attached_mut, enter_error, fail_slot};
use super::FixedQp;
use super::FixedRing;
use crate::backend::{peer_departure, AsyncEvent, QueuePair, WcStatus};
use crate::error::Error;

impl<Q: QueuePair> FixedRing<Q> {
    /// Applies one of the device's asynchronous events, read by the caller
    /// from the device's event channel (one reader per device, so several
    /// rings on one device are each handed the events). Returns whether
    /// the event concerned this ring.
    ///
    /// * `QpFatal`, `QpRequestError`, `QpAccessError` of an attached queue
    ///   pair: it is in error with `FatalErr` (unless it already was: the
    ///   first status stays), moved there if the device did not; its work
    ///   comes back flushed (what was never posted after what was, so its
    ///   completions keep the order its work was pushed in), and it takes
    ///   no more work;
    /// * `CqError` of the ring's completion queue: the ring takes no more
    ///   work and polls the queue no more (its completions were lost), as
    ///   when a poll fails; work pushed and never posted comes back
    ///   flushed from the next reap, what was posted only from a detach
    ///   or close, if the device gives it back in time (a shared receive
    ///   queue's receives from its removal or the close);
    /// * `DeviceFatal`: the same, and every queue pair is moved to error;
    /// * `LastWqeReached` of a queue pair detached from one of the ring's
    ///   shared receive queues: the device has reported every receive it
    ///   took; the ring reaps them (they come back from the next reap) and
    ///   forgets the queue pair, which may now be dropped without losing
    ///   one (see [`detach`](Self::detach));
    /// * `SrqLimitReached` of a shared receive queue the ring holds: if a
    ///   queue has a refill ([`set_srq_refill`](Self::set_srq_refill)),
    ///   the ring reaps what is queued (it comes back from the next reap)
    ///   and tops the queues up now; else the queue is the caller's to
    ///   refill (`true` says the event concerns the ring);
    /// * `LastWqeReached` of an attached queue pair on a shared receive
    ///   queue: kept for its detach, which reaps what it took and then
    ///   forgets it at once (no later event is needed to drop it);
    /// * `SrqError` of a shared receive queue the ring holds: nothing
    ///   changes (it concerns the ring, and `true` says so). A failed
    ///   shared receive queue's queue pairs are failed by their own
    ///   events.
    ///
    /// Other events change nothing here.
    ///
    /// ```
    /// use rdma_ring::backend::{soft::SoftDevice, AsyncEventSource, QpConfig, QueuePair, WcStatus};
    /// use rdma_ring::fixed::{FixedBufs, FixedRing, FixedRingConfig};
    /// let dev = SoftDevice::new();
    /// let pd = dev.alloc_pd();
    /// let events = dev.async_events().unwrap();
    /// let (mut qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    /// let control = qp.control();
    /// let cq = qp.take_cq().unwrap();
    /// let mut ring = FixedRing::new(cq, FixedBufs::new(&pd, 4, 64).unwrap(), FixedRingConfig::default());
    /// let conn = ring.attach(qp).unwrap();
    /// control.inject_fatal();
    /// let event = events.next_event().unwrap().unwrap();
    /// assert!(ring.apply_event(event));
    /// assert_eq!(ring.qp_error(conn).unwrap(), Some(WcStatus::FatalErr));
    /// ```
    pub fn apply_event(&mut self, event: AsyncEvent) -> bool {
        match event {
            AsyncEvent::QpFatal { qp_num }
            | AsyncEvent::QpRequestError { qp_num }
            | AsyncEvent::QpAccessError { qp_num } => {
                let Some(slot) = self.qps.iter_mut().flatten().find(|s| s.qpn == qp_num) else {
                    return false;
                };
                let handle = slot.handle;
                // A device that refuses leaves the drain to time out.
                let (parked, _) = fail_slot(
                    slot,
                    handle,
                    WcStatus::FatalErr,
                    self.bufs.table(),
                    &mut self.ready,
                    &mut self.cq_free,
                );
                self.parked_any |= parked;
                true
            }
            AsyncEvent::CqError { cq } if cq == self.cq_id => {
                self.fail("its completion queue failed");
                true
            }
            AsyncEvent::DeviceFatal => {
                self.fail("the device failed");
                for slot in self.qps.iter_mut().flatten() {
                    let handle = slot.handle;
                    let _ = enter_error(slot, handle, WcStatus::FatalErr);
                }
                true
            }
            AsyncEvent::SrqLimitReached { srq } => {
                let held = self.srq_index_of(srq).is_some();
                if held && self.refilling && self.failed.is_none() {
                    // The receives the device says were taken are the
                    // ring's to count only once reaped: reap them (they
                    // come back from the next reap), then top up.
                    let _ = self.reap_queued_into_ready();
                    self.refill_srqs();
                }
                held
            }
            AsyncEvent::SrqError { srq } => self.srq_index_of(srq).is_some(),
            AsyncEvent::LastWqeReached { qp_num } => {
                let attached = self.qps.iter_mut().flatten().find(|s| s.qpn == qp_num);
                match attached {
                    Some(slot) => {
                        // Only for a queue pair the ring knows is in error:
                        // a live one of a reused number must not take an
                        // earlier holder's event for its own.
                        slot.last_wqe = slot.srq.is_some() && slot.error.is_some();
                        true
                    }
                    None => self.last_receive_of_former(qp_num),
                }
            }
            _ => false,
        }
    }

    /// Moves queue pair `qp` to error, as for a peer a connection manager
    /// reported gone: its work comes back flushed (`WrFlushErr`; what was
    /// never posted after what was, as the work was pushed), and it takes
    /// no more work (detach it to release it). Fails if the device refuses
    /// to move it: the ring still gives it no more work, what it never
    /// posted comes back from the next reap, and what it posted only as
    /// the device completes it.
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::SoftDevice, QpConfig, QueuePair, WcStatus};
    /// # use rdma_ring::buf::{ExposedBuf, RemoteAccess};
    /// # use rdma_ring::fixed::*;
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// # let (mut qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    /// # let cq = qp.take_cq().unwrap();
    /// # let mut ring = FixedRing::new(cq, FixedBufs::new(&pd, 4, 64).unwrap(), FixedRingConfig::default());
    /// # let conn = ring.attach(qp).unwrap();
    /// let slot = ring.take_buf().unwrap();
    /// ring.push(conn, RecvFixed::new(slot).user_data(1)).unwrap();
    /// ring.submit().unwrap();
    /// ring.fail_qp(conn).unwrap();
    /// let back = ring.wait(1).unwrap();
    /// assert_eq!((back[0].user_data(), back[0].status()), (1, WcStatus::WrFlushErr));
    /// assert_eq!(ring.qp_error(conn).unwrap(), Some(WcStatus::WrFlushErr));
    /// ```
    pub fn fail_qp(&mut self, qp: FixedQp) -> Result<(), Error> {
        let slot = attached_mut(&mut self.qps, qp)?;
        let (parked, entered) = fail_slot(
            slot,
            qp,
            WcStatus::WrFlushErr,
            self.bufs.table(),
            &mut self.ready,
            &mut self.cq_free,
        );
        self.parked_any |= parked;
        entered
    }

    /// Asks every attached queue pair not yet in error whether its peer
    /// left ([`QueuePair::peer_disconnected`]: an rdma_cm queue pair reads
    /// its connection's events; others say no), and fails each that says
    /// so, as [`fail_qp`](Self::fail_qp) does, with `RetryExcErr`: its
    /// work comes back flushed and it takes no more. A queue pair that
    /// cannot say (its connection's event channel failed) is failed too,
    /// with `FatalErr`, as nobody could learn that its peer left. Returns
    /// how many it failed. The ring does not ask by itself (it reads no
    /// channel of its own): call it now and then, say every 100 ms, when
    /// queue pairs come from rdma_cm.
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::SoftDevice, QpConfig, QueuePair};
    /// # use rdma_ring::fixed::*;
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// # let (mut qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    /// # let cq = qp.take_cq().unwrap();
    /// # let mut ring = FixedRing::new(cq, FixedBufs::new(&pd, 4, 64).unwrap(), FixedRingConfig::default());
    /// # let conn = ring.attach(qp).unwrap();
    /// // A soft queue pair has no connection manager to say its peer left.
    /// assert_eq!(ring.check_peers(), 0);
    /// assert_eq!(ring.qp_error(conn).unwrap(), None);
    /// ```
    pub fn check_peers(&mut self) -> usize {
        let mut failed = 0;
        for slot in self.qps.iter_mut().flatten() {
            if slot.error.is_some() {
                continue;
            }
            let Some(status) = peer_departure(&mut slot.qp) else {
                continue;
            };
            let handle = slot.handle;
            // A device that refuses leaves the drain to time out.
            let (parked, _) = fail_slot(
                slot,
                handle,
                status,
                self.bufs.table(),
                &mut self.ready,
                &mut self.cq_free,
            );
            self.parked_any |= parked;
            failed += 1;
        }
        failed
    }
}
