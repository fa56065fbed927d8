//! The soft device's state: registered memory, completion queues, shared
//! receive queues and queue pairs, and the checks real hardware makes on
//! keys, bounds and rights.

use std::collections::{HashMap, VecDeque};
use std::time::Instant;

use smallvec::SmallVec;

use super::async_events::AsyncEventQueue;
use super::events::EventSource;
use super::Progress;
use crate::backend::{
    Access, AsyncEvent, CqId, PdId, QpConfig, RawCompletion, SendWr, Sge, SrqConfig, SrqId,
    WcStatus,
};

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
#[non_exhaustive]
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
    /// Send work requests executed that asked for a fence
    /// (`IBV_SEND_FENCE`: to wait for the READs and atomics before them).
    /// The soft device runs a send queue in order, one at a time, so the
    /// fence changes nothing here; counted for tests that check it was
    /// asked for. (Not counted for work no-op mode completes at post.)
    pub fenced: u64,
}

pub(super) struct RnrWait {
    pub(super) attempts: u32,
    /// When the last RNR NAK came: the next retry waits a timer's length.
    pub(super) last: Instant,
}

/// Scatter/gather elements copied at post time, as a NIC reads the WQE.
pub(super) type SgeList = SmallVec<[Sge; 2]>;

/// A send work request waiting in a send queue, with its place in posting
/// order.
#[derive(Clone)]
pub(super) struct QueuedSend {
    pub(super) seq: u64,
    pub(super) wr: SendWr,
    pub(super) sges: SgeList,
}

/// A posted receive.
#[derive(Clone)]
pub(super) struct QueuedRecv {
    pub(super) wr_id: u64,
    pub(super) sges: SgeList,
}

/// The queue slots a CQE gives back once it is polled. Hardware reuses a
/// work request's slot only when its completion (for an unsignaled send,
/// a later send's) has been polled, not when the work ran; a device that
/// freed slots earlier would let a ring that counts its room wrongly
/// overfill a queue unseen. One word, so that a queued CQE stays small:
/// a send sequence number, or a receive's tag bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct SlotRelease(u64);

impl SlotRelease {
    const RECV_BIT: u64 = 1 << 63;
    const SRQ_BIT: u64 = 1 << 62;

    /// One receive of the queue pair's own receive queue.
    pub(super) const RECV: SlotRelease = SlotRelease(Self::RECV_BIT);

    /// The queue pair's send work requests up to sequence number `seq`
    /// (RC completes a send queue in order; numbers stay far below 2^62).
    #[inline]
    pub(super) fn sends_through(seq: u64) -> Self {
        debug_assert!(seq & (Self::RECV_BIT | Self::SRQ_BIT) == 0);
        SlotRelease(seq)
    }

    /// One receive of shared receive queue `index`.
    #[inline]
    pub(super) fn srq_recv(index: usize) -> Self {
        SlotRelease(Self::SRQ_BIT | index as u64)
    }
}

/// A CQE waiting to be polled, with the slots it gives back then.
pub(super) struct QueuedCqe {
    pub(super) cqe: RawCompletion,
    pub(super) release: SlotRelease,
}

/// Gives back the slots a polled CQE of queue pair `qpn` held (nothing if
/// its queue is gone).
#[inline]
pub(super) fn release_slots(
    qps: &mut [Option<QpEntry>],
    srqs: &mut [Option<SrqEntry>],
    qpn: usize,
    release: SlotRelease,
) {
    let bits = release.0;
    if bits & SlotRelease::SRQ_BIT != 0 {
        if let Some(Some(srq)) = srqs.get_mut((bits & !SlotRelease::SRQ_BIT) as usize) {
            srq.held -= 1;
        }
    } else if let Some(Some(qp)) = qps.get_mut(qpn) {
        if bits & SlotRelease::RECV_BIT == 0 {
            qp.sends_released_through = qp.sends_released_through.max(bits);
        } else {
            qp.recvs_held -= 1;
        }
    }
}

pub(super) struct CqEntry {
    pub(super) id: CqId,
    pub(super) entries: u32,
    pub(super) queue: VecDeque<QueuedCqe>,
    pub(super) overrun: bool,
    pub(super) events: Option<EventSource>,
    /// Whether its `SoftCq` still exists (nobody polls it otherwise).
    pub(super) owned: bool,
}

impl CqEntry {
    /// Adds a CQE, or drops it once the queue has overrun (as every later
    /// one is). `false`, with nothing changed, when the queue is full: the
    /// overrun that follows touches every queue pair on it, which only
    /// [`DeviceState::overrun`] can reach.
    #[inline]
    pub(super) fn push_unless_full(
        &mut self,
        cqe: RawCompletion,
        release: SlotRelease,
        solicited: bool,
    ) -> bool {
        if self.overrun {
            return true;
        }
        if self.queue.len() >= self.entries as usize {
            return false;
        }
        let status = cqe.status;
        self.queue.push_back(QueuedCqe { cqe, release });
        if let Some(events) = self.events.as_mut() {
            // An error wakes a channel armed for solicited events too.
            events.on_cqe(solicited || !status.is_success());
        }
        true
    }
}

pub(super) struct SrqEntry {
    pub(super) id: SrqId,
    pub(super) pd: PdId,
    pub(super) config: SrqConfig,
    pub(super) queue: VecDeque<QueuedRecv>,
    /// Receives posted whose CQEs have not been polled (those queued
    /// among them): what the queue's depth bounds.
    pub(super) held: u32,
    /// The armed low-water mark; 0 when disarmed.
    pub(super) limit: u32,
    /// Queue pairs that take receives from it.
    pub(super) attached: usize,
}

pub(super) struct QpEntry {
    pub(super) pd: PdId,
    pub(super) config: QpConfig,
    pub(super) cq: usize,
    pub(super) srq: Option<usize>,
    pub(super) state: QpState,
    pub(super) peer: Option<usize>,
    pub(super) link_broken: bool,
    pub(super) sq: VecDeque<QueuedSend>,
    pub(super) rq: VecDeque<QueuedRecv>,
    /// Sequence number of the next send work request posted.
    pub(super) next_seq: u64,
    /// The last send work request whose slot a polled CQE gave back (and,
    /// in order, every earlier one's).
    pub(super) sends_released_through: u64,
    /// Receives posted to its own queue whose CQEs have not been polled.
    pub(super) recvs_held: u32,
    /// The last send work request whose completion (and so, RC being in
    /// order, every earlier one's) the device has reported.
    pub(super) reported_through: u64,
    pub(super) rnr: Option<RnrWait>,
    /// Fail the n-th work request executed from now with this status.
    pub(super) fault: Option<(u64, WcStatus)>,
    /// Send posts still to refuse, as a NIC out of resources does.
    pub(super) refuse_posts: u32,
    /// Receive posts still to refuse, the same way.
    pub(super) refuse_recv_posts: u32,
    /// While set, the successful completions of its signaled sends wait
    /// here, in order, as a requester's do for a late or lost ACK.
    pub(super) held_acks: Option<VecDeque<(RawCompletion, SlotRelease)>>,
    pub(super) counters: QpCounters,
}

impl QpEntry {
    pub(super) fn new(pd: PdId, config: QpConfig, cq: usize, srq: Option<usize>) -> Self {
        QpEntry {
            pd,
            config,
            cq,
            srq,
            state: QpState::Init,
            peer: None,
            link_broken: false,
            sq: VecDeque::with_capacity(config.max_send_wr as usize),
            rq: VecDeque::with_capacity(if srq.is_some() {
                0
            } else {
                config.max_recv_wr as usize
            }),
            next_seq: 1,
            sends_released_through: 0,
            recvs_held: 0,
            reported_through: 0,
            rnr: None,
            fault: None,
            refuse_posts: 0,
            refuse_recv_posts: 0,
            held_acks: None,
            counters: QpCounters::default(),
        }
    }

    /// Send work requests posted whose slots no polled CQE has given
    /// back: what the send queue's depth bounds.
    #[inline]
    pub(super) fn sends_held(&self) -> u64 {
        self.next_seq - 1 - self.sends_released_through
    }

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

pub(super) fn flushed(wr_id: u64, qp_num: usize) -> RawCompletion {
    RawCompletion {
        wr_id,
        qp_num: qp_num as u32,
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
    pub(super) cqs: Vec<Option<CqEntry>>,
    pub(super) srqs: Vec<Option<SrqEntry>>,
    /// Whether any completion queue has a channel (so waiters exist).
    pub(super) has_channels: bool,
    /// Whether the auto-mode RNR retry timer is running.
    pub(super) rnr_timer: bool,
    /// Deregistrations still to fail (fault injection).
    pub(super) fail_deregistrations: u32,
    /// Completion channel arms still to fail (fault injection).
    pub(super) fail_arms: u32,
    pub(super) port_active: bool,
    pub(super) async_events: AsyncEventQueue,
    /// Reused for every copy, so execution allocates nothing in steady
    /// state.
    pub(super) copy_buffer: Vec<u8>,
}

impl DeviceState {
    pub(super) fn new(progress: Progress) -> Self {
        DeviceState {
            progress,
            mrs: HashMap::new(),
            next_mr: 1,
            qps: Vec::new(),
            cqs: Vec::new(),
            srqs: Vec::new(),
            has_channels: false,
            rnr_timer: false,
            fail_deregistrations: 0,
            fail_arms: 0,
            port_active: true,
            async_events: AsyncEventQueue::default(),
            copy_buffer: Vec::new(),
        }
    }

    pub(super) fn qp(&mut self, qpn: usize) -> Option<&mut QpEntry> {
        self.qps.get_mut(qpn).and_then(Option::as_mut)
    }

    /// Removes completion queue `index`, giving back the slots its
    /// unpolled CQEs held (a shared receive queue's may serve queue pairs
    /// on other completion queues).
    pub(super) fn remove_cq(&mut self, index: usize) {
        let Some(cq) = self.cqs.get_mut(index).and_then(Option::take) else {
            return;
        };
        for queued in cq.queue {
            release_slots(
                &mut self.qps,
                &mut self.srqs,
                queued.cqe.qp_num as usize,
                queued.release,
            );
        }
    }

    pub(super) fn cq(&mut self, index: usize) -> Option<&mut CqEntry> {
        self.cqs.get_mut(index).and_then(Option::as_mut)
    }

    pub(super) fn srq(&mut self, index: usize) -> Option<&mut SrqEntry> {
        self.srqs.get_mut(index).and_then(Option::as_mut)
    }

    pub(super) fn raise(&mut self, event: AsyncEvent) {
        self.async_events.raise(event);
    }

    /// Adds a CQE for queue pair `qpn` to its completion queue. A full
    /// queue is an overrun, which the device answers as hardware does: the
    /// queue is unusable from then on, every queue pair on it goes to error
    /// with its work requests gone without CQEs (the ring then cannot
    /// drain, and leaks their buffers), and a `CqError` event is raised.
    pub(super) fn push_cqe(&mut self, qpn: usize, cqe: RawCompletion, release: SlotRelease) {
        self.push_cqe_solicited(qpn, cqe, release, false);
    }

    /// [`push_cqe`](Self::push_cqe), saying whether the CQE is solicited
    /// (a receive whose message asked for an event): what wakes a channel
    /// armed for solicited events (errors wake it whatever this says).
    pub(super) fn push_cqe_solicited(
        &mut self,
        qpn: usize,
        cqe: RawCompletion,
        release: SlotRelease,
        solicited: bool,
    ) {
        let Some(cq_index) = self.qp(qpn).map(|qp| qp.cq) else {
            return;
        };
        self.push_cqe_on(cq_index, qpn, cqe, release, solicited);
    }

    /// [`push_cqe`](Self::push_cqe) for a caller that knows the queue
    /// pair's completion queue (`qpn`'s, as `QpEntry::cq` names it).
    #[inline]
    pub(super) fn push_cqe_on(
        &mut self,
        cq_index: usize,
        qpn: usize,
        cqe: RawCompletion,
        release: SlotRelease,
        solicited: bool,
    ) {
        debug_assert_eq!(self.qp(qpn).map(|qp| qp.cq), Some(cq_index));
        let Some(cq) = self.cq(cq_index) else {
            return;
        };
        if !cq.push_unless_full(cqe, release, solicited) {
            self.overrun(cq_index);
        }
    }

    /// A CQE found completion queue `cq_index` full: see
    /// [`push_cqe`](Self::push_cqe).
    #[cold]
    pub(super) fn overrun(&mut self, cq_index: usize) {
        let Some(cq) = self.cq(cq_index) else {
            return;
        };
        cq.overrun = true;
        let id = cq.id;
        // A queue pair on a shared receive queue says it takes no more of
        // its receives, as for any move to error.
        let mut last_wqe = Vec::new();
        for (qpn, qp) in self.qps.iter_mut().enumerate() {
            let Some(qp) = qp else { continue };
            if qp.cq == cq_index {
                if qp.srq.is_some() && qp.state != QpState::Error {
                    last_wqe.push(qpn as u32);
                }
                qp.state = QpState::Error;
                qp.sq.clear();
                qp.rq.clear();
                // Completions held for late ACKs go with the rest.
                if let Some(held) = qp.held_acks.as_mut() {
                    held.clear();
                }
                qp.rnr = None;
            }
        }
        self.raise(AsyncEvent::CqError { cq: id });
        for qp_num in last_wqe {
            self.raise(AsyncEvent::LastWqeReached { qp_num });
        }
    }

    /// Moves a queue pair to error and flushes every queued work request,
    /// each with a CQE whether or not it was signaled. Receives of a shared
    /// receive queue stay there for the other queue pairs; the device says
    /// this queue pair will take no more with `LastWqeReached`.
    pub(super) fn enter_error(&mut self, qpn: usize) {
        // Work whose ACK had not come is not complete: flushed, first.
        self.flush_held_acks(qpn);
        let Some(qp) = self.qp(qpn) else { return };
        let was = qp.state;
        qp.state = QpState::Error;
        qp.rnr = None;
        let sends: Vec<QueuedSend> = qp.sq.drain(..).collect();
        let recvs: Vec<QueuedRecv> = qp.rq.drain(..).collect();
        let on_srq = qp.srq.is_some();
        for queued in sends {
            if let Some(qp) = self.qp(qpn) {
                qp.report_send(queued.seq);
            }
            self.push_cqe(
                qpn,
                flushed(queued.wr.wr_id, qpn),
                SlotRelease::sends_through(queued.seq),
            );
        }
        for recv in recvs {
            self.push_cqe(qpn, flushed(recv.wr_id, qpn), SlotRelease::RECV);
        }
        if on_srq && was != QpState::Error {
            self.raise(AsyncEvent::LastWqeReached { qp_num: qpn as u32 });
        }
    }

    /// Flushes the completions held for late ACKs (the queue pair goes to
    /// error before their ACKs came), in order.
    pub(super) fn flush_held_acks(&mut self, qpn: usize) {
        let held = match self.qp(qpn).and_then(|qp| qp.held_acks.as_mut()) {
            Some(held) if !held.is_empty() => std::mem::take(held),
            _ => return,
        };
        for (cqe, release) in held {
            self.push_cqe(qpn, flushed(cqe.wr_id, qpn), release);
        }
    }

    /// Delivers, in order, the completions of queue pair `qpn` held for
    /// late ACKs: their ACKs came (released, or acknowledged by a later
    /// request's NAK). It goes on holding later ones if it was.
    pub(super) fn deliver_held_acks(&mut self, qpn: usize) {
        let held = match self.qp(qpn).and_then(|qp| qp.held_acks.as_mut()) {
            Some(held) if !held.is_empty() => std::mem::take(held),
            _ => return,
        };
        for (cqe, release) in held {
            self.push_cqe(qpn, cqe, release);
        }
    }

    /// Whether a receive is waiting for queue pair `qpn` (in its own queue
    /// or its shared receive queue).
    pub(super) fn has_receive(&mut self, qpn: usize) -> bool {
        let Some(qp) = self.qp(qpn) else { return false };
        match qp.srq {
            Some(srq) => self.srq(srq).is_some_and(|s| !s.queue.is_empty()),
            None => !qp.rq.is_empty(),
        }
    }

    /// What the CQE of a receive queue pair `qpn` took gives back: a slot
    /// of its shared receive queue, or of its own.
    pub(super) fn recv_release(&mut self, qpn: usize) -> SlotRelease {
        match self.qp(qpn).and_then(|qp| qp.srq) {
            Some(srq) => SlotRelease::srq_recv(srq),
            None => SlotRelease::RECV,
        }
    }

    /// Takes the next receive for queue pair `qpn`, raising the shared
    /// receive queue's limit event when it falls below its armed mark.
    pub(super) fn take_receive(&mut self, qpn: usize) -> Option<QueuedRecv> {
        let qp = self.qp(qpn)?;
        let Some(srq_index) = qp.srq else {
            return qp.rq.pop_front();
        };
        let srq = self.srq(srq_index)?;
        let recv = srq.queue.pop_front()?;
        if srq.limit > 0 && (srq.queue.len() as u32) < srq.limit {
            srq.limit = 0;
            let id = srq.id;
            self.raise(AsyncEvent::SrqLimitReached { srq: id });
        }
        Some(recv)
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

    /// Every element of a local list checked: their addresses and lengths.
    pub(super) fn check_local_list(
        &self,
        sges: &[Sge],
        pd: PdId,
        write: bool,
    ) -> Result<SmallVec<[(usize, usize); 2]>, WcStatus> {
        sges.iter()
            .map(|&sge| Ok((self.check_local(sge, pd, write)?, sge.len as usize)))
            .collect()
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
