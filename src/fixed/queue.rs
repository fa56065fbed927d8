//! One queue pair of the fixed ring: its sends and receives in rings
//! indexed by sequence number, which is also the `wr_id`.

use crate::backend::{RecvWr, SendWr, Sge, WcStatus};
use crate::op::{Limits, OpKind};

/// A `wr_id`: the slot in the ring (16 bits) of its queue pair, or of its
/// shared receive queue, whether it is a receive (1 bit), whether of a
/// shared receive queue (1 bit), and the low bits of its sequence number.
const INDEX_SHIFT: u32 = 48;
const RECV_BIT: u64 = 1 << 47;
/// Set, with [`RECV_BIT`], in a receive of a shared receive queue.
pub(super) const SRQ_BIT: u64 = 1 << 46;
pub(super) const SEQ_MASK: u64 = SRQ_BIT - 1;
/// Queue pairs, and shared receive queues, one fixed ring holds at most:
/// the index bits of a `wr_id`.
pub(super) const MAX_SLOTS: usize = 1 << (64 - INDEX_SHIFT);
/// The buffer index of what names no slot of the table: the drain marker,
/// and a receive already handed back.
pub(super) const NO_SLOT: u32 = u32::MAX;

#[inline(always)]
pub(super) fn wr_id(index: u32, recv: bool, seq: u64) -> u64 {
    (u64::from(index) << INDEX_SHIFT) | (u64::from(recv) * RECV_BIT) | (seq & SEQ_MASK)
}

/// The `wr_id` of a receive of the shared receive queue in slot `index`.
#[inline(always)]
pub(super) fn srq_wr_id(index: u32, seq: u64) -> u64 {
    (u64::from(index) << INDEX_SHIFT) | RECV_BIT | SRQ_BIT | (seq & SEQ_MASK)
}

/// A `wr_id` taken apart: queue pair (or shared receive queue) slot,
/// whether a receive, sequence bits.
#[inline(always)]
pub(super) fn parse_wr_id(wr_id: u64) -> (usize, bool, u64) {
    (
        (wr_id >> INDEX_SHIFT) as usize,
        wr_id & RECV_BIT != 0,
        wr_id & SEQ_MASK,
    )
}

/// A send-queue operation from push to completion.
#[derive(Clone, Copy, Debug)]
pub(super) struct SendEntry {
    pub(super) user_data: u64,
    /// Its slot, or [`NO_SLOT`].
    pub(super) index: u32,
    pub(super) len: u32,
    pub(super) kind: OpKind,
}

/// A receive from push to completion.
#[derive(Clone, Copy, Debug)]
pub(super) struct RecvEntry {
    pub(super) user_data: u64,
    /// Its slot, or [`NO_SLOT`] once completed.
    pub(super) index: u32,
}

impl RecvEntry {
    /// What a completed receive leaves behind.
    pub(super) const TAKEN: RecvEntry = RecvEntry {
        user_data: 0,
        index: NO_SLOT,
    };
}

/// Operations of one queue in push order, indexed by sequence number:
/// `head` is the oldest not completed, `posted` the first not posted,
/// `tail` the next to push.
pub(super) struct SeqRing<T> {
    entries: Box<[T]>,
    mask: u64,
    pub(super) head: u64,
    pub(super) posted: u64,
    pub(super) tail: u64,
}

impl<T: Copy> SeqRing<T> {
    /// A ring for `depth` operations whose first has sequence number
    /// `start`.
    pub(super) fn new(depth: u32, fill: T, start: u64) -> Self {
        let capacity = (depth.max(1) as usize).next_power_of_two();
        SeqRing {
            entries: vec![fill; capacity].into_boxed_slice(),
            mask: capacity as u64 - 1,
            head: start,
            posted: start,
            tail: start,
        }
    }

    /// Operations pushed and not completed.
    #[inline(always)]
    pub(super) fn outstanding(&self) -> u64 {
        self.tail - self.head
    }

    /// Appends; the caller has checked there is room.
    #[inline(always)]
    pub(super) fn push(&mut self, entry: T) -> u64 {
        let seq = self.tail;
        self.entries[(seq & self.mask) as usize] = entry;
        self.tail = seq + 1;
        seq
    }

    #[inline(always)]
    pub(super) fn set(&mut self, seq: u64, entry: T) {
        self.entries[(seq & self.mask) as usize] = entry;
    }

    #[inline(always)]
    pub(super) fn get(&self, seq: u64) -> T {
        self.entries[(seq & self.mask) as usize]
    }

    /// The posted sequence number whose low bits a `wr_id` carries, if
    /// any is outstanding.
    #[inline(always)]
    pub(super) fn posted_seq(&self, bits: u64) -> Option<u64> {
        let seq = self.head + (bits.wrapping_sub(self.head) & SEQ_MASK);
        (seq < self.posted).then_some(seq)
    }
}

/// Takes the posted receive whose low sequence bits a `wr_id` carries out
/// of `recvs`, once: a device may report receives out of order, so each
/// has its own entry, marked taken; `head` moves past taken entries, and `taken_ahead` counts those
/// it has not reached yet.
#[inline]
pub(super) fn take_recv(
    recvs: &mut SeqRing<RecvEntry>,
    taken_ahead: &mut u64,
    bits: u64,
) -> Option<RecvEntry> {
    let seq = recvs.posted_seq(bits)?;
    let entry = recvs.get(seq);
    if entry.index == NO_SLOT {
        return None;
    }
    recvs.set(seq, RecvEntry::TAKEN);
    *taken_ahead += 1;
    while recvs.head < recvs.posted && recvs.get(recvs.head).index == NO_SLOT {
        recvs.head += 1;
        *taken_ahead -= 1;
    }
    Some(entry)
}

/// What the ring keeps of one attached queue pair.
pub(super) struct AttachedQp<Q> {
    pub(super) qp: Q,
    pub(super) qpn: u32,
    pub(super) handle: super::FixedQp,
    /// The slot of the shared receive queue its receives come from.
    pub(super) srq: Option<u32>,
    /// A queue pair detached from that queue had its number: a flush
    /// naming it may be a late one of that queue pair's.
    pub(super) reused_number: bool,
    /// The device said it takes no more of the shared queue's receives
    /// (`LastWqeReached`, applied while attached): once its completions
    /// are reaped at detach, none can name its number.
    pub(super) last_wqe: bool,
    pub(super) limits: Limits,
    /// Sends the ring lets be outstanding: the send queue's depth less the
    /// drain marker's place.
    pub(super) send_depth: u64,
    pub(super) recv_depth: u64,
    pub(super) sends: SeqRing<SendEntry>,
    pub(super) recvs: SeqRing<RecvEntry>,
    pub(super) send_wrs: Vec<SendWr>,
    pub(super) send_sges: Vec<Sge>,
    pub(super) recv_wrs: Vec<RecvWr>,
    pub(super) recv_sges: Vec<Sge>,
    /// A send whose sequence number has these bits all set asks for a
    /// completion.
    pub(super) signal_mask: u64,
    /// Whether the last posted send asked for a completion: if not, a
    /// drain needs a marker behind it.
    pub(super) last_signaled: bool,
    /// Whether the drain marker is posted and not yet completed.
    pub(super) marker_posted: bool,
    /// Receives already handed back (out of order) whose entries `head`
    /// has not passed yet.
    pub(super) recvs_taken_ahead: u64,
    /// In the ring's list of queue pairs pushed to since the last submit
    /// (possibly with nothing left to post, after `submit_qp`).
    pub(super) dirty: bool,
    /// Set by the first failed completion or post; the queue pair then
    /// takes no more work.
    pub(super) error: Option<WcStatus>,
    /// Flushed completions of work it never posted, held back while
    /// posted work is out: a queue pair's completions come out in the
    /// order its work was pushed, flushes included (unless a detach timed
    /// out on that posted work, which may never come back).
    pub(super) parked: Vec<super::FixedCompletion>,
}

impl<Q> AttachedQp<Q> {
    /// Whether anything posted has not come back.
    pub(super) fn busy(&self) -> bool {
        self.sends.head < self.sends.posted || self.recvs.head < self.recvs.posted
    }
}
