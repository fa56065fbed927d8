//! The device's asynchronous events, as the ring applies them.

use std::collections::VecDeque;

use super::{EventSource, Ring};
use crate::backend::{AsyncEvent, AsyncEventSource, QueuePair, WcStatus};
use crate::error::Error;

/// Events kept for the caller at most; older ones are dropped.
const MAX_KEPT: usize = 4096;

#[derive(Default)]
pub(super) struct EventState {
    source: Option<EventSource>,
    kept: VecDeque<AsyncEvent>,
    /// Which queue pair the next idle look asks about its peer.
    pub(super) peer_cursor: u32,
}

impl EventState {
    pub(super) fn watching(&self) -> bool {
        self.source.is_some()
    }
}

impl<Q: QueuePair> Ring<Q> {
    /// Reads the device's asynchronous events from `source` from now on: the
    /// ring reads them when idle and in [`poll_events`](Self::poll_events),
    /// applies those that concern it, and keeps every event for
    /// [`next_event`](Self::next_event). A device has one event channel, so
    /// with several rings on one device, read it yourself and hand each ring
    /// its events with [`apply_event`](Self::apply_event).
    ///
    /// What an event does to the ring:
    ///
    /// * `QpFatal`, `QpRequestError`, `QpAccessError`: that queue pair is in
    ///   error (moved there if the device did not), its operations come
    ///   back flushed, and it takes no more work;
    /// * `LastWqeReached`: a detach of that queue pair stops waiting; for
    ///   a queue pair already detached from a shared receive queue, the
    ///   completions queued are reaped while its number is still known (a
    ///   device may drop a destroyed queue pair's completions, and with
    ///   them the count of receives it took), and the number is forgotten;
    /// * `SrqLimitReached` of a shared receive queue of the ring with a
    ///   refill: the completions queued are reaped (the receives the
    ///   device took count as posted until then), and the queues with a
    ///   refill are topped up;
    /// * `CqError` of the ring's queue, `DeviceFatal`: the ring takes no
    ///   more work ([`Ring::failure`]); on `DeviceFatal` every queue pair is
    ///   moved to error.
    ///
    /// ```
    /// use rdma_ring::backend::soft::SoftDevice;
    /// use rdma_ring::backend::{AsyncEvent, QpConfig};
    /// use rdma_ring::ring::{Ring, RingConfig};
    /// let dev = SoftDevice::new();
    /// let pd = dev.alloc_pd();
    /// let (qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    /// let control = qp.control();
    /// let mut ring = Ring::new(qp, RingConfig::default());
    /// ring.watch_events(dev.async_events().unwrap());
    /// control.inject_fatal();
    /// ring.poll_events().unwrap();
    /// assert_eq!(ring.next_event(), Some(AsyncEvent::QpFatal { qp_num: control_qpn(&ring) }));
    /// assert!(ring.error_status().is_some());
    /// # fn control_qpn(ring: &Ring<rdma_ring::backend::soft::SoftQp>) -> u32 { ring.qp().qpn() }
    /// ```
    pub fn watch_events(&mut self, source: impl AsyncEventSource + 'static) {
        self.events.source = Some(Box::new(source));
    }

    /// The event source's descriptor, readable while events are pending
    /// (for a reactor), if the ring watches one.
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::SoftDevice, QpConfig};
    /// # use rdma_ring::ring::{Ring, RingConfig};
    /// use std::time::Duration;
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// # let (qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    /// let mut ring = Ring::new(qp, RingConfig::default());
    /// assert!(ring.event_source().is_none());
    /// ring.watch_events(dev.async_events().unwrap());
    /// let source = ring.event_source().unwrap();
    /// assert!(!source.wait(Duration::ZERO).unwrap());
    /// dev.set_port_active(false);
    /// // What a reactor watching the descriptor would see: an event is pending.
    /// assert!(ring.event_source().unwrap().wait(Duration::ZERO).unwrap());
    /// ```
    pub fn event_source(&self) -> Option<&dyn AsyncEventSource> {
        self.events.source.as_deref()
    }

    /// Reads and applies every pending event now; returns how many.
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::SoftDevice, QpConfig};
    /// # use rdma_ring::ring::{Ring, RingConfig};
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// # let (qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    /// let mut ring = Ring::new(qp, RingConfig::default());
    /// ring.watch_events(dev.async_events().unwrap());
    /// dev.set_port_active(false);
    /// dev.set_port_active(true);
    /// assert_eq!(ring.poll_events().unwrap(), 2);
    /// assert_eq!(ring.poll_events().unwrap(), 0);
    /// ```
    pub fn poll_events(&mut self) -> Result<usize, Error> {
        let mut n = 0;
        while let Some(event) = match &self.events.source {
            Some(source) => source.next_event()?,
            None => None,
        } {
            self.apply_event(event);
            n += 1;
        }
        Ok(n)
    }

    /// Applies one event (see [`watch_events`](Self::watch_events)) and
    /// keeps it for [`next_event`](Self::next_event). Events about queues
    /// the ring does not hold are kept but change nothing.
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::SoftDevice, QpConfig, WcStatus};
    /// # use rdma_ring::buf::RegisteredBuf;
    /// # use rdma_ring::op::Recv;
    /// # use rdma_ring::ring::{Ring, RingConfig};
    /// use rdma_ring::backend::AsyncEvent;
    /// use rdma_ring::Error;
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// # let (qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    /// let mut ring = Ring::new(qp, RingConfig::default());
    /// // Read from the device's one channel elsewhere and handed to this ring.
    /// ring.apply_event(AsyncEvent::QpFatal { qp_num: ring.qp().qpn() });
    /// assert_eq!(ring.error_status(), Some(WcStatus::FatalErr));
    /// let buf = RegisteredBuf::new(&pd, vec![0u8; 64]).unwrap();
    /// let refused = ring.submission().push(Recv::new(buf)).unwrap_err();
    /// assert!(matches!(refused.error(), Error::QpInError(WcStatus::FatalErr)));
    /// ```
    pub fn apply_event(&mut self, event: AsyncEvent) {
        self.stats.events += 1;
        // Kept first: applying it may reap, and a reap may read (and keep)
        // later events.
        if self.events.kept.len() >= MAX_KEPT {
            self.events.kept.pop_front();
        }
        self.events.kept.push_back(event);
        match event {
            AsyncEvent::QpFatal { qp_num }
            | AsyncEvent::QpRequestError { qp_num }
            | AsyncEvent::QpAccessError { qp_num } => {
                if let Some(key) = self.by_qpn.get(&qp_num).copied() {
                    let slot = self.qps.get_mut(key).expect("indexed");
                    slot.record_error(WcStatus::FatalErr);
                    // Hardware moved it already; make sure, so its work is
                    // flushed either way.
                    let _ = slot.qp.set_error();
                }
            }
            AsyncEvent::LastWqeReached { qp_num } => {
                if let Some(key) = self.by_qpn.get(&qp_num).copied() {
                    self.qps.get_mut(key).expect("indexed").last_wqe = true;
                } else {
                    self.last_receive_of_former(qp_num);
                }
            }
            AsyncEvent::SrqLimitReached { srq } => {
                // The receives the device says were taken are counted as
                // posted until reaped: reap them, or the refill finds
                // nothing to top up (and the device has disarmed the
                // limit). Only for a queue of ours that is refilled.
                let refilled = self
                    .srq_key_by_id(srq)
                    .and_then(|k| self.srqs.get(k))
                    .is_some_and(|s| s.refill.is_some());
                if refilled && self.failed.is_none() {
                    self.reap_queued();
                    self.refill_srqs();
                }
            }
            AsyncEvent::CqError { cq } if cq == self.cq_id => {
                self.failed = Some("completion queue error");
                self.cq_lost = true;
            }
            AsyncEvent::DeviceFatal => {
                self.failed = Some("device fatal error");
                for key in self.qps.keys() {
                    let slot = self.qps.get_mut(key).expect("listed");
                    slot.record_error(WcStatus::FatalErr);
                    let _ = slot.qp.set_error();
                }
            }
            _ => {}
        }
    }

    /// The next event the ring has seen and not yet handed out.
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::SoftDevice, QpConfig};
    /// # use rdma_ring::ring::{Ring, RingConfig};
    /// use rdma_ring::backend::AsyncEvent;
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// # let (qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    /// let mut ring = Ring::new(qp, RingConfig::default());
    /// ring.watch_events(dev.async_events().unwrap());
    /// dev.set_port_active(false);
    /// ring.poll_events().unwrap();
    /// assert_eq!(ring.next_event(), Some(AsyncEvent::PortError { port: 1 }));
    /// assert_eq!(ring.next_event(), None);
    /// ```
    pub fn next_event(&mut self) -> Option<AsyncEvent> {
        self.events.kept.pop_front()
    }
}
