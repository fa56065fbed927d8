//! The soft device's state: registered memory and queue pairs, and the
//! checks real hardware makes on keys, bounds and rights.

use std::collections::{HashMap, VecDeque};
use std::time::Instant;

use super::Progress;
use crate::backend::{Access, PdId, QpConfig, RawCompletion, RecvWr, SendWr, Sge, WcStatus};

/// The bit that tells an rkey from an lkey, so one can never pass for the
/// other.
pub(super) const RKEY_BIT: u32 = 0x8000_0000;

pub(super) struct MrEntry {
    pub(super) addr: usize,
    pub(super) len: usize,
    pub(super) access: Access,
    pub(super) pd: PdId,
}

/// The states a soft queue pair passes through.
///
/// ```
/// use rdma_ring::backend::soft::QpState;
/// assert_ne!(QpState::Init, QpState::ReadyToSend);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QpState {
    /// Created; receives may be posted, sends may not.
    Init,
    /// Connected to its peer; everything may be posted.
    ReadyToSend,
    /// Failed or torn down: every work request completes flushed.
    Error,
}

/// What a soft queue pair has seen, for tests that count doorbells.
///
/// ```
/// use rdma_ring::backend::soft::QpCounters;
/// assert_eq!(QpCounters::default().send_posts, 0);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QpCounters {
    /// `post_send` calls.
    pub send_posts: u64,
    /// Send work requests accepted.
    pub send_wrs: u64,
    /// `post_recv` calls.
    pub recv_posts: u64,
    /// Receive work requests accepted.
    pub recv_wrs: u64,
    /// Send work requests executed (successfully or not).
    pub executed: u64,
    /// RNR NAKs the requester saw.
    pub rnr_naks: u64,
}

pub(super) struct RnrWait {
    pub(super) attempts: u32,
    pub(super) since: Instant,
}

pub(super) struct QpEntry {
    pub(super) pd: PdId,
    pub(super) config: QpConfig,
    pub(super) state: QpState,
    pub(super) peer: Option<usize>,
    pub(super) link_broken: bool,
    pub(super) sq: VecDeque<QueuedSend>,
    /// Sequence number of the next send work request posted.
    pub(super) next_seq: u64,
    /// The last send work request whose completion (and so, RC being in
    /// order, every earlier one's) the device has reported.
    pub(super) reported_through: u64,
    pub(super) rq: VecDeque<RecvWr>,
    pub(super) cq: VecDeque<RawCompletion>,
    pub(super) overrun: bool,
    pub(super) rnr: Option<RnrWait>,
    /// Fail the n-th work request executed from now with this status.
    pub(super) fault: Option<(u64, WcStatus)>,
    pub(super) counters: QpCounters,
    pub(super) events: Option<super::events::EventSource>,
}

impl QpEntry {
    pub(super) fn new(pd: PdId, config: QpConfig) -> Self {
        QpEntry {
            pd,
            config,
            state: QpState::Init,
            peer: None,
            link_broken: false,
            sq: VecDeque::with_capacity(config.max_send_wr as usize),
            next_seq: 1,
            reported_through: 0,
            rq: VecDeque::with_capacity(config.max_recv_wr as usize),
            cq: VecDeque::with_capacity(config.completion_entries() as usize),
            overrun: false,
            rnr: None,
            fault: None,
            counters: QpCounters::default(),
            events: None,
        }
    }

    /// Adds a CQE; a full CQ is an overrun, which the device answers by
    /// moving the queue pair to error, as hardware does.
    pub(super) fn push_cqe(&mut self, cqe: RawCompletion) {
        if self.cq.len() >= self.config.completion_entries() as usize {
            // The CQ is unusable from here on, as on hardware: the queue pair
            // is in error and its work requests are gone without CQEs (the
            // ring then cannot drain, and leaks their buffers).
            self.overrun = true;
            self.state = QpState::Error;
            self.sq.clear();
            self.rq.clear();
        } else {
            self.cq.push_back(cqe);
            if let Some(events) = self.events.as_mut() {
                events.on_cqe();
            }
        }
    }

    /// Moves to error and flushes every queued work request, each with a
    /// CQE whether or not it was signaled.
    pub(super) fn enter_error(&mut self) {
        self.state = QpState::Error;
        self.rnr = None;
        while let Some(queued) = self.sq.pop_front() {
            self.report_send(queued.seq);
            self.push_cqe(flushed(queued.wr.wr_id));
        }
        while let Some(wr) = self.rq.pop_front() {
            self.push_cqe(flushed(wr.wr_id));
        }
    }
}

/// A send work request waiting in a send queue, with its place in posting
/// order.
#[derive(Clone, Copy)]
pub(super) struct QueuedSend {
    pub(super) seq: u64,
    pub(super) wr: SendWr,
}

impl QpEntry {
    /// Numbers the next send work request in posting order.
    pub(super) fn take_seq(&mut self) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        seq
    }

    /// Notes that a CQE for send work request `seq` is being reported: the
    /// requester may now release it and, RC being in order, everything
    /// posted before it.
    pub(super) fn report_send(&mut self, seq: u64) {
        self.reported_through = self.reported_through.max(seq);
    }

    /// The device's own check of the ordering promise the ring relies on:
    /// a work request about to execute must not be one whose completion
    /// was already implied to the requester. If it were, the requester
    /// could have handed its buffer back to safe code, and the device
    /// would now touch memory it no longer owns.
    pub(super) fn check_not_reported(&self, queued: &QueuedSend) {
        assert!(
            queued.seq > self.reported_through,
            "soft device: executing send work request {:#x} (#{}) after the completion of \
             #{} was reported; its buffer may already be back in safe code",
            queued.wr.wr_id,
            queued.seq,
            self.reported_through
        );
    }
}

pub(super) fn flushed(wr_id: u64) -> RawCompletion {
    RawCompletion {
        wr_id,
        status: WcStatus::WrFlushErr,
        byte_len: 0,
        imm: None,
        by_write_imm: false,
    }
}

pub(super) struct DeviceState {
    pub(super) progress: Progress,
    pub(super) mrs: HashMap<u32, MrEntry>,
    pub(super) next_mr: u32,
    pub(super) qps: Vec<Option<QpEntry>>,
    /// Whether any queue pair has a completion channel (so waiters exist).
    pub(super) has_channels: bool,
    /// Whether the auto-mode RNR retry timer is running.
    pub(super) rnr_timer: bool,
    /// Deregistrations still to fail (fault injection).
    pub(super) fail_deregistrations: u32,
}

impl DeviceState {
    pub(super) fn new(progress: Progress) -> Self {
        DeviceState {
            progress,
            mrs: HashMap::new(),
            next_mr: 1,
            qps: Vec::new(),
            has_channels: false,
            rnr_timer: false,
            fail_deregistrations: 0,
        }
    }

    pub(super) fn qp(&mut self, qpn: usize) -> Option<&mut QpEntry> {
        self.qps.get_mut(qpn).and_then(Option::as_mut)
    }

    /// The address of a local scatter/gather element, if its lkey, domain,
    /// bounds and rights check out; otherwise the status hardware reports.
    pub(super) fn check_local(&self, sge: Sge, pd: PdId, write: bool) -> Result<usize, WcStatus> {
        if sge.len == 0 {
            return Ok(0);
        }
        let mr = if sge.lkey & RKEY_BIT == 0 {
            self.mrs.get(&sge.lkey)
        } else {
            None
        };
        let mr = mr.ok_or(WcStatus::LocProtErr)?;
        if mr.pd != pd || (write && !mr.access.contains(Access::LOCAL_WRITE)) {
            return Err(WcStatus::LocProtErr);
        }
        within(mr, sge.addr, u64::from(sge.len)).ok_or(WcStatus::LocProtErr)
    }

    /// The address of `len` remote bytes at `addr` under `rkey`, if the key
    /// is the responder's, grants `right`, and covers the bytes.
    pub(super) fn check_remote(
        &self,
        rkey: u32,
        addr: u64,
        len: u64,
        pd: PdId,
        right: Access,
    ) -> Result<usize, WcStatus> {
        // A zero-length request touches no memory, so no key is checked.
        if len == 0 {
            return Ok(addr as usize);
        }
        let mr = if rkey & RKEY_BIT != 0 {
            self.mrs.get(&(rkey & !RKEY_BIT))
        } else {
            None
        };
        let mr = mr.ok_or(WcStatus::RemAccessErr)?;
        if mr.pd != pd || !mr.access.contains(right) {
            return Err(WcStatus::RemAccessErr);
        }
        within(mr, addr, len).ok_or(WcStatus::RemAccessErr)
    }
}

fn within(mr: &MrEntry, addr: u64, len: u64) -> Option<usize> {
    let start = mr.addr as u64;
    let end = start + mr.len as u64;
    let last = addr.checked_add(len)?;
    (addr >= start && last <= end).then_some(addr as usize)
}
