//! The plain data every layer shares: scatter/gather elements, work
//! requests, completion entries and their statuses, the identities and
//! limits of queues, and device events. No logic, no imports from the rest
//! of the crate, so any module may use it without import cycles. The types
//! are public through [`crate::backend`] (and [`crate::op`] for
//! [`OpKind`]).

mod event;
mod ids;
mod status;

pub use event::AsyncEvent;
pub use ids::{CqId, OpKind, PdId, QpCaps, SrqCaps, SrqId};
pub use status::WcStatus;

bitflags::bitflags! {
    /// Access rights of a memory registration. The values are those of
    /// `ibv_access_flags`, so a verbs backend passes them through unchanged.
    ///
    /// ```
    /// use rdma_ring::backend::Access;
    /// let rights = Access::LOCAL_WRITE | Access::REMOTE_READ;
    /// assert!(rights.contains(Access::REMOTE_READ));
    /// ```
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub struct Access: u32 {
        /// The local NIC may write the memory (RDMA READ target, receive buffer).
        const LOCAL_WRITE = 1;
        /// A remote peer may RDMA WRITE into the memory.
        const REMOTE_WRITE = 2;
        /// A remote peer may RDMA READ the memory.
        const REMOTE_READ = 4;
        /// A remote peer may run 8-byte atomics on the memory.
        const REMOTE_ATOMIC = 8;
    }
}

bitflags::bitflags! {
    /// Flags of a send work request. The values are those of
    /// `ibv_send_flags`.
    ///
    /// ```
    /// use rdma_ring::backend::SendFlags;
    /// assert!(!(SendFlags::SIGNALED | SendFlags::FENCE).contains(SendFlags::INLINE));
    /// ```
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub struct SendFlags: u32 {
        /// Wait for earlier RDMA READs and atomics before starting this WR.
        const FENCE = 1;
        /// Generate a completion queue entry for this WR.
        const SIGNALED = 2;
        /// Ask the receiver to raise a solicited event.
        const SOLICITED = 4;
        /// Copy the payload into the WR at post time.
        const INLINE = 8;
    }
}

/// One scatter/gather element: `len` bytes at `addr`, registered under `lkey`.
/// Laid out as `struct ibv_sge`, so a verbs backend posts a list of them as
/// it is.
///
/// ```
/// use rdma_ring::backend::Sge;
/// let sge = Sge { addr: 0x1000, len: 64, lkey: 7 };
/// assert_eq!(sge.len, 64);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[repr(C)]
pub struct Sge {
    /// Virtual address of the first byte.
    pub addr: u64,
    /// Number of bytes.
    pub len: u32,
    /// Local key of the registration covering the bytes.
    pub lkey: u32,
}

/// Which scatter/gather elements of a posted list belong to one work
/// request: `len` elements from index `start` of the list's element array.
/// A work request with no element (a zero-length message) has `len` 0.
///
/// ```
/// use rdma_ring::backend::{Sge, SgeSpan};
/// let sges = [Sge::default(), Sge { addr: 8, len: 4, lkey: 1 }];
/// let span = SgeSpan { start: 1, len: 1 };
/// assert_eq!(span.of(&sges).unwrap()[0].addr, 8);
/// assert!(SgeSpan { start: 1, len: 2 }.of(&sges).is_none());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct SgeSpan {
    /// Index of the first element.
    pub start: u32,
    /// Number of elements.
    pub len: u32,
}

impl SgeSpan {
    /// The elements this span names in `sges`, or `None` if it reaches
    /// past the end.
    #[inline]
    pub fn of(self, sges: &[Sge]) -> Option<&[Sge]> {
        let start = self.start as usize;
        sges.get(start..start.checked_add(self.len as usize)?)
    }

    /// Total bytes of the elements this span names in `sges` (0 if it
    /// reaches past the end).
    pub fn bytes(self, sges: &[Sge]) -> u64 {
        self.of(sges)
            .map_or(0, |s| s.iter().map(|sge| u64::from(sge.len)).sum())
    }
}

/// The operation of a send work request.
///
/// ```
/// use rdma_ring::backend::SendOpcode;
/// assert!(SendOpcode::CompareSwap.is_atomic());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SendOpcode {
    /// RDMA WRITE.
    Write,
    /// RDMA WRITE with immediate data; consumes a receive at the peer.
    WriteImm,
    /// SEND; consumes a receive at the peer.
    Send,
    /// SEND with immediate data; consumes a receive at the peer.
    SendImm,
    /// RDMA READ.
    Read,
    /// 8-byte compare-and-swap.
    CompareSwap,
    /// 8-byte fetch-and-add.
    FetchAdd,
}

impl SendOpcode {
    /// Whether this is one of the two 8-byte atomics.
    pub fn is_atomic(self) -> bool {
        matches!(self, SendOpcode::CompareSwap | SendOpcode::FetchAdd)
    }
}

/// A send work request in plain data, as the ring hands it to a backend.
/// Its local memory is a span of the scatter/gather array posted with it.
///
/// ```
/// use rdma_ring::backend::{SendWr, SendOpcode, SendFlags, SgeSpan};
/// let wr = SendWr::new(1, SendOpcode::Send, SgeSpan { start: 0, len: 1 });
/// assert_eq!(wr.flags, SendFlags::empty());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SendWr {
    /// Identity echoed in the completion.
    pub wr_id: u64,
    /// What to do.
    pub opcode: SendOpcode,
    /// Signaling, fence, solicited event, inline.
    pub flags: SendFlags,
    /// Local memory: the source, or the target for READ and atomics.
    pub sges: SgeSpan,
    /// Remote address for RDMA and atomic operations.
    pub remote_addr: u64,
    /// Remote key for RDMA and atomic operations.
    pub rkey: u32,
    /// Immediate data (host order) for `WriteImm` and `SendImm`.
    pub imm: u32,
    /// Compare value (compare-and-swap) or addend (fetch-and-add).
    pub compare_add: u64,
    /// Swap value (compare-and-swap).
    pub swap: u64,
}

impl SendWr {
    /// A work request with no remote part and no flags.
    pub fn new(wr_id: u64, opcode: SendOpcode, sges: SgeSpan) -> Self {
        SendWr {
            wr_id,
            opcode,
            flags: SendFlags::empty(),
            sges,
            remote_addr: 0,
            rkey: 0,
            imm: 0,
            compare_add: 0,
            swap: 0,
        }
    }
}

/// A receive work request in plain data: where an incoming payload lands,
/// as a span of the scatter/gather array posted with it.
///
/// ```
/// use rdma_ring::backend::{RecvWr, SgeSpan};
/// let wr = RecvWr { wr_id: 9, sges: SgeSpan { start: 0, len: 1 } };
/// assert_eq!(wr.wr_id, 9);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecvWr {
    /// Identity echoed in the completion.
    pub wr_id: u64,
    /// Where the incoming payload lands, in order.
    pub sges: SgeSpan,
}

/// A completion queue entry in plain data, as a backend reports it.
///
/// ```
/// use rdma_ring::backend::{RawCompletion, WcStatus};
/// let c = RawCompletion::default();
/// assert_eq!(c.status, WcStatus::Success);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct RawCompletion {
    /// The `wr_id` of the work request that completed.
    pub wr_id: u64,
    /// The queue pair the work request ran on: for a receive from a shared
    /// receive queue, the queue pair that consumed it.
    pub qp_num: u32,
    /// Outcome.
    pub status: WcStatus,
    /// Bytes that arrived, for a successful receive. For other work a
    /// backend may give 0 (the verbs backend does: a NIC need not report
    /// it); the rings count those from what was posted.
    pub byte_len: u32,
    /// Immediate data that arrived with a receive.
    pub imm: Option<u32>,
    /// Whether an RDMA WRITE with immediate (not a SEND) consumed this
    /// receive: its buffer is untouched and `byte_len` counts the bytes
    /// written to the remote slice.
    pub by_write_imm: bool,
}
