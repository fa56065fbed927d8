//! Queue pairs of the soft device, and their test controls.

use std::sync::Arc;

use super::post::{complete_sends_at_once, post_each_recv, post_each_send, refuse};
use super::state::{QpCounters, QpState};
use super::{after_post, Progress, Shared, SoftCq, SoftSrq};
use crate::backend::{PostError, QpCaps, QueuePair, RecvWr, SendWr, Sge, WcStatus};
use crate::error::Error;

/// Why a post [`QpControl::refuse_posts`] asked for is refused.
const REFUSED_POST: &str = "out of resources (refused by QpControl::refuse_posts)";

/// Why a post to `qp`, not ready to send or asked to refuse, is refused:
/// before its connection, or as a NIC short of resources refuses one
/// (one in error takes it, and flushes it).
#[cold]
#[inline(never)]
fn refusal_before_post(qp: &mut super::state::QpEntry) -> Option<PostError> {
    match qp.state {
        QpState::Init => Some(refuse(0, "queue pair is not connected (not ready to send)")),
        QpState::ReadyToSend if qp.refuse_posts > 0 => {
            qp.refuse_posts -= 1;
            Some(refuse(0, REFUSED_POST))
        }
        _ => None,
    }
}

/// A soft RC queue pair. Created with a completion queue of its own
/// ([`SoftDevice::create_qp`](super::SoftDevice::create_qp)) or on a shared
/// one ([`SoftDevice::create_qp_on`](super::SoftDevice::create_qp_on)).
/// Dropping it destroys the queue pair; its peer's later requests fail with
/// `RetryExcErr`.
pub struct SoftQp {
    pub(super) shared: Arc<Shared>,
    pub(super) qpn: usize,
    pub(super) caps: QpCaps,
    pub(super) own_cq: Option<SoftCq>,
}

impl std::fmt::Debug for SoftQp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SoftQp").field("qpn", &self.qpn).finish()
    }
}

impl SoftQp {
    /// The queue pair number.
    pub fn qpn(&self) -> u32 {
        self.qpn as u32
    }

    /// A handle for tests: fault injection, stepping, counters. It stays
    /// usable while a ring owns the queue pair.
    pub fn control(&self) -> QpControl {
        QpControl {
            shared: Arc::clone(&self.shared),
            qpn: self.qpn,
        }
    }
}

// SAFETY: the soft device executes each send queue in order and reports a
// CQE, with this queue pair's number on the completion queue its caps name,
// only after a work request has executed (or been flushed, for which it
// always makes a CQE); posts copy the scatter/gather elements each span
// names and accept a prefix whose length they report exactly; `caps` is the
// configuration the queues were made with; the own completion queue is
// handed out once.
unsafe impl QueuePair for SoftQp {
    type Cq = SoftCq;
    type Srq = SoftSrq;

    fn caps(&self) -> QpCaps {
        self.caps
    }

    // What a post accepted before a refusal stays posted, and runs: a
    // NIC's doorbell does not take back the work requests before a bad
    // one (`after_post` runs for every post that reached the queue).
    unsafe fn post_send(&mut self, wrs: &[SendWr], sges: &[Sge]) -> Result<(), PostError> {
        let mut state = self.shared.lock();
        let progress = state.progress;
        let qpn = self.qpn;
        let qp = state
            .qp(qpn)
            .ok_or_else(|| refuse(0, "queue pair destroyed"))?;
        qp.counters.send_posts += 1;
        // One test in the common case (ready to send, nothing to refuse);
        // the rest out of line.
        if qp.state != QpState::ReadyToSend || qp.refuse_posts > 0 {
            if let Some(refused) = refusal_before_post(qp) {
                return Err(refused);
            }
        }
        let at_once =
            progress == Progress::NoOp && qp.state == QpState::ReadyToSend && qp.sq.is_empty();
        let result = if at_once {
            complete_sends_at_once(&mut state, qpn, wrs, sges).and_then(|taken| {
                if taken < wrs.len() {
                    post_each_send(&mut state, qpn, wrs, sges, taken)
                } else {
                    Ok(())
                }
            })
        } else {
            post_each_send(&mut state, qpn, wrs, sges, 0)
        };
        after_post(&self.shared, &mut state);
        result
    }

    unsafe fn post_recv(&mut self, wrs: &[RecvWr], sges: &[Sge]) -> Result<(), PostError> {
        let mut state = self.shared.lock();
        let qpn = self.qpn;
        let qp = state
            .qp(qpn)
            .ok_or_else(|| refuse(0, "queue pair destroyed"))?;
        qp.counters.recv_posts += 1;
        if qp.refuse_recv_posts > 0 {
            qp.refuse_recv_posts -= 1;
            return Err(refuse(0, REFUSED_POST));
        }
        if qp.srq.is_some() {
            return Err(refuse(
                0,
                "the queue pair takes its receives from a shared receive queue",
            ));
        }
        let result = post_each_recv(&mut state, qpn, wrs, sges);
        after_post(&self.shared, &mut state);
        result
    }

    fn set_error(&mut self) -> Result<(), Error> {
        let mut state = self.shared.lock();
        state
            .qp(self.qpn)
            .ok_or(Error::Soft("queue pair destroyed"))?;
        state.enter_error(self.qpn);
        self.shared.notify(&state);
        Ok(())
    }

    fn take_cq(&mut self) -> Option<SoftCq> {
        self.own_cq.take()
    }
}

impl Drop for SoftQp {
    fn drop(&mut self) {
        let mut state = self.shared.lock();
        let Some(qp) = state.qps[self.qpn].take() else {
            return;
        };
        if let Some(peer) = qp.peer.and_then(|p| state.qp(p)) {
            peer.link_broken = true;
        }
        if let Some(srq) = qp.srq.and_then(|s| state.srq(s)) {
            srq.attached -= 1;
        }
        // A completion queue nobody owns any more goes with its last queue
        // pair.
        let cq_in_use = state.qps.iter().flatten().any(|other| other.cq == qp.cq);
        if !cq_in_use && state.cq(qp.cq).is_some_and(|cq| !cq.owned) {
            state.remove_cq(qp.cq);
        }
    }
}

/// Test controls for one soft queue pair.
///
/// ```
/// use rdma_ring::backend::soft::{Progress, SoftDevice};
/// use rdma_ring::backend::QpConfig;
/// let dev = SoftDevice::with_progress(Progress::Manual);
/// let pd = dev.alloc_pd();
/// let (a, _b) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
/// let control = a.control();
/// assert!(!control.step()); // nothing queued
/// assert_eq!(control.counters().send_posts, 0);
/// ```
#[derive(Clone)]
pub struct QpControl {
    shared: Arc<Shared>,
    qpn: usize,
}

impl std::fmt::Debug for QpControl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QpControl").field("qpn", &self.qpn).finish()
    }
}

impl QpControl {
    /// The n-th send work request executed from now (1 = the next one)
    /// completes with `status`, and the queue pair goes to error. A status
    /// that says the responder failed (`RemAccessErr`, `RemInvReqErr`,
    /// `RemOpErr`) fails a healthy responder too, as the real fault would:
    /// it goes to error, with `QpAccessError` or `QpRequestError` for the
    /// first two.
    pub fn fail_nth(&self, n: u64, status: WcStatus) {
        if let Some(qp) = self.shared.lock().qp(self.qpn) {
            qp.fault = Some((n.max(1), status));
        }
    }

    /// The next `n` posts of send work requests while the queue pair is
    /// ready to send are refused whole, as a NIC out of resources refuses
    /// them (`ENOMEM` from `ibv_post_send`): nothing of them is queued,
    /// and the queue pair stays as it is.
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::SoftDevice, QpConfig};
    /// # use rdma_ring::buf::RegisteredBuf;
    /// # use rdma_ring::op::Send;
    /// # use rdma_ring::ring::{Ring, RingConfig};
    /// let dev = SoftDevice::new();
    /// let pd = dev.alloc_pd();
    /// let (qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    /// let control = qp.control();
    /// let mut ring = Ring::new(qp, RingConfig::default());
    /// let send = || Send::new(RegisteredBuf::new(&pd, vec![7u8; 8]).unwrap());
    /// control.refuse_posts(1);
    /// ring.submission().push(send()).unwrap();
    /// let refused = ring.submit().unwrap_err();
    /// assert_eq!(refused.unposted.len(), 1); // handed back, never posted
    /// ring.submission().push(send()).unwrap();
    /// ring.submit().unwrap(); // the next one goes
    /// ```
    pub fn refuse_posts(&self, n: u32) {
        if let Some(qp) = self.shared.lock().qp(self.qpn) {
            qp.refuse_posts = n;
        }
    }

    /// The next `n` posts of receive work requests are refused whole, as
    /// [`refuse_posts`](Self::refuse_posts) refuses sends. A ring posts a
    /// queue pair's sends only if its receives went, so a send pushed with
    /// them comes back too.
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::SoftDevice, QpConfig};
    /// # use rdma_ring::buf::RegisteredBuf;
    /// # use rdma_ring::op::{Recv, Send};
    /// # use rdma_ring::ring::{Ring, RingConfig};
    /// let dev = SoftDevice::new();
    /// let pd = dev.alloc_pd();
    /// let (qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    /// let control = qp.control();
    /// let mut ring = Ring::new(qp, RingConfig::default());
    /// let buf = || RegisteredBuf::new(&pd, vec![0u8; 8]).unwrap();
    /// control.refuse_recv_posts(1);
    /// ring.submission().push(Recv::new(buf())).unwrap();
    /// ring.submission().push(Send::new(buf())).unwrap();
    /// let refused = ring.submit().unwrap_err();
    /// assert_eq!((refused.posted, refused.unposted.len()), (0, 2));
    /// assert_eq!(control.counters().send_posts, 0);
    /// ```
    pub fn refuse_recv_posts(&self, n: u32) {
        if let Some(qp) = self.shared.lock().qp(self.qpn) {
            qp.refuse_recv_posts = n;
        }
    }

    /// Holds back the completions of this queue pair's successful
    /// signaled sends, as a requester's wait for an ACK that comes late
    /// (coalesced, or lost and covered by a later one): the work has run
    /// and the peer has seen it — its receive completes, and it may
    /// answer — but the send's slot is not given back until
    /// [`release_acks`](Self::release_acks). Errors still complete at
    /// once, after the held completions: those succeed if the error is a
    /// NAK (which acknowledges what went before it) or, on this device, a
    /// local error of a later work request; a move to error that
    /// acknowledges nothing (by the owner, a fatal event, the responder
    /// failing) flushes them, and with the path to the peer gone the
    /// oldest fails with `RetryExcErr` and the rest are flushed. Work that
    /// [`Progress::NoOp`] completes as it is posted runs nowhere and is
    /// not held.
    ///
    /// [`Progress::NoOp`]: super::Progress::NoOp
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::SoftDevice, QpConfig};
    /// # use rdma_ring::buf::RegisteredBuf;
    /// # use rdma_ring::op::{Recv, Send};
    /// # use rdma_ring::ring::{Ring, RingConfig};
    /// let dev = SoftDevice::new();
    /// let pd = dev.alloc_pd();
    /// let (qp, peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    /// let control = qp.control();
    /// let (mut ring, mut peer) = (Ring::new(qp, RingConfig::default()), Ring::new(peer, RingConfig::default()));
    /// peer.submission().push(Recv::new(RegisteredBuf::new(&pd, vec![0u8; 8]).unwrap())).unwrap();
    /// peer.submit().unwrap();
    /// control.hold_acks();
    /// ring.submission().push(Send::new(RegisteredBuf::new(&pd, b"late".to_vec()).unwrap())).unwrap();
    /// ring.submit().unwrap();
    /// assert_eq!(peer.completion().wait(1).unwrap().len(), 1); // it arrived
    /// assert!(ring.completion().poll().unwrap().is_none()); // its ACK did not
    /// control.release_acks();
    /// assert!(ring.completion().wait(1).unwrap()[0].status().is_success());
    /// ```
    pub fn hold_acks(&self) {
        if let Some(qp) = self.shared.lock().qp(self.qpn) {
            qp.held_acks.get_or_insert_with(Default::default);
        }
    }

    /// Delivers, in order, the completions [`hold_acks`](Self::hold_acks)
    /// held, and holds no more.
    pub fn release_acks(&self) {
        let mut state = self.shared.lock();
        state.deliver_held_acks(self.qpn);
        if let Some(qp) = state.qp(self.qpn) {
            qp.held_acks = None;
        }
        self.shared.notify(&state);
    }

    /// Cuts the link to the peer, both ways: every later request of either
    /// side fails with `RetryExcErr`, as if the peer had vanished.
    pub fn break_connection(&self) {
        let mut state = self.shared.lock();
        let peer = state.qp(self.qpn).and_then(|qp| {
            qp.link_broken = true;
            qp.peer
        });
        if let Some(peer) = peer.and_then(|p| state.qp(p)) {
            peer.link_broken = true;
        }
    }

    /// A fatal error inside the device on this queue pair, as hardware
    /// reports with `IBV_EVENT_QP_FATAL`: the device raises the event and
    /// moves the queue pair to error, flushing its work requests.
    pub fn inject_fatal(&self) {
        let mut state = self.shared.lock();
        if state.qp(self.qpn).is_some() {
            state.raise(crate::backend::AsyncEvent::QpFatal {
                qp_num: self.qpn as u32,
            });
            state.enter_error(self.qpn);
        }
        self.shared.notify(&state);
    }

    /// Overruns the completion queue this queue pair completes on, as a
    /// flood of completions would: the queue is unusable from then on,
    /// every queue pair on it goes to error with its work gone without
    /// completions, and a `CqError` event is raised.
    ///
    /// ```
    /// # use rdma_ring::backend::soft::SoftDevice;
    /// # use rdma_ring::backend::{CompletionQueue, QpConfig, QueuePair, RawCompletion};
    /// # use rdma_ring::backend::soft::QpState;
    /// # use rdma_ring::Error;
    /// let dev = SoftDevice::new();
    /// let pd = dev.alloc_pd();
    /// let (mut qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    /// qp.control().overrun_cq();
    /// assert_eq!(qp.control().state(), Some(QpState::Error));
    /// let mut cq = qp.take_cq().unwrap();
    /// let mut out = [RawCompletion::default(); 4];
    /// assert!(matches!(cq.poll(&mut out), Err(Error::CqOverrun)));
    /// ```
    pub fn overrun_cq(&self) {
        let mut state = self.shared.lock();
        if let Some(cq) = state.qp(self.qpn).map(|qp| qp.cq) {
            state.overrun(cq);
        }
        self.shared.notify(&state);
    }

    /// Executes at most one send work request of this queue pair (manual
    /// mode); returns whether one completed.
    pub fn step(&self) -> bool {
        let mut state = self.shared.lock();
        let ran = state.run_qp(self.qpn, 1, true) == 1;
        self.shared.notify(&state);
        ran
    }

    /// The queue pair's state, or `None` once destroyed.
    pub fn state(&self) -> Option<QpState> {
        self.shared.lock().qp(self.qpn).map(|qp| qp.state)
    }

    /// What the queue pair has seen.
    pub fn counters(&self) -> QpCounters {
        self.shared
            .lock()
            .qp(self.qpn)
            .map(|qp| qp.counters)
            .unwrap_or_default()
    }

    /// Send work requests queued and not yet executed.
    pub fn queued_sends(&self) -> usize {
        self.shared.lock().qp(self.qpn).map_or(0, |qp| qp.sq.len())
    }
}
