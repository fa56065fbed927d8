//! Identities of device objects, operation kinds, and queue limits.

use std::sync::atomic::{AtomicU64, Ordering};

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

fn fresh() -> u64 {
    NEXT_ID.fetch_add(1, Ordering::Relaxed)
}

/// A protection domain's identity. Every registration and queue pair names
/// the domain it belongs to, so the ring can refuse a buffer from another
/// domain before the device does.
///
/// ```
/// use rdma_ring::backend::PdId;
/// assert_ne!(PdId::fresh(), PdId::fresh());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PdId(u64);

impl PdId {
    /// A process-unique identity, for a backend creating a new domain.
    pub fn fresh() -> Self {
        PdId(fresh())
    }
}

/// A completion queue's identity. A queue pair names the completion queue
/// it completes on, so a ring attaches only queue pairs of its own queue.
///
/// ```
/// use rdma_ring::backend::CqId;
/// assert_ne!(CqId::fresh(), CqId::fresh());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CqId(u64);

impl CqId {
    /// A process-unique identity, for a backend creating a new queue.
    pub fn fresh() -> Self {
        CqId(fresh())
    }

    /// The identity as a number (what a verbs backend stores as the queue's
    /// context, to name it in device events).
    pub fn get(self) -> u64 {
        self.0
    }

    /// The identity [`get`](Self::get) returned.
    pub fn from_raw(raw: u64) -> Self {
        CqId(raw)
    }
}

/// A shared receive queue's identity, as queue pairs and device events
/// name it.
///
/// ```
/// use rdma_ring::backend::SrqId;
/// assert_ne!(SrqId::fresh(), SrqId::fresh());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SrqId(u64);

impl SrqId {
    /// A process-unique identity, for a backend creating a new queue.
    pub fn fresh() -> Self {
        SrqId(fresh())
    }

    /// The identity as a number (see [`CqId::get`]).
    pub fn get(self) -> u64 {
        self.0
    }

    /// The identity [`get`](Self::get) returned.
    pub fn from_raw(raw: u64) -> Self {
        SrqId(raw)
    }
}

/// Which operation a work request is.
///
/// ```
/// use rdma_ring::op::OpKind;
/// assert!(OpKind::Recv.is_recv());
/// assert!(!OpKind::SendImm.is_recv());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OpKind {
    /// RDMA READ.
    Read,
    /// RDMA WRITE.
    Write,
    /// RDMA WRITE with immediate data.
    WriteImm,
    /// SEND.
    Send,
    /// SEND with immediate data.
    SendImm,
    /// Receive.
    Recv,
    /// 8-byte compare-and-swap.
    CompareSwap,
    /// 8-byte fetch-and-add.
    FetchAdd,
}

impl OpKind {
    /// All eight kinds.
    pub const ALL: [OpKind; 8] = [
        OpKind::Read,
        OpKind::Write,
        OpKind::WriteImm,
        OpKind::Send,
        OpKind::SendImm,
        OpKind::Recv,
        OpKind::CompareSwap,
        OpKind::FetchAdd,
    ];

    /// Whether this is a receive (posted to a receive queue).
    pub fn is_recv(self) -> bool {
        self == OpKind::Recv
    }
}

/// The limits and identities of a queue pair, as created.
///
/// ```
/// use rdma_ring::backend::{CqId, PdId, QpCaps};
/// let caps = QpCaps {
///     qp_num: 17, cq: CqId::fresh(), srq: None, pd: PdId::fresh(),
///     max_send_wr: 64, max_recv_wr: 64, max_send_sge: 4, max_recv_sge: 4,
///     max_inline_data: 64, atomics: true, max_read_sge: 4, max_message: 1 << 31,
/// };
/// assert!(caps.srq.is_none());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpCaps {
    /// The queue pair number, as completions name it.
    pub qp_num: u32,
    /// The completion queue its work requests complete on.
    pub cq: CqId,
    /// The shared receive queue it takes receives from, if any (then it
    /// has no receive queue of its own).
    pub srq: Option<SrqId>,
    /// Its protection domain.
    pub pd: PdId,
    /// Send queue depth.
    pub max_send_wr: u32,
    /// Receive queue depth (0 with a shared receive queue).
    pub max_recv_wr: u32,
    /// Scatter/gather elements per send work request.
    pub max_send_sge: u32,
    /// Scatter/gather elements per receive work request.
    pub max_recv_sge: u32,
    /// Largest payload that may be posted inline.
    pub max_inline_data: u32,
    /// Whether the device runs 8-byte atomics.
    pub atomics: bool,
    /// Scatter/gather elements per RDMA READ: at most
    /// [`max_send_sge`](Self::max_send_sge), fewer on devices whose reads
    /// take fewer (`max_sge_rd`).
    pub max_read_sge: u32,
    /// Most bytes one work request may move: the port's `max_msg_sz`, at
    /// most 2^31 (RC's limit).
    pub max_message: u32,
}

/// The limits and identity of a shared receive queue, as created.
///
/// ```
/// use rdma_ring::backend::{PdId, SrqCaps, SrqId};
/// let caps = SrqCaps { id: SrqId::fresh(), pd: PdId::fresh(), max_wr: 1024, max_sge: 2 };
/// assert_eq!(caps.max_wr, 1024);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SrqCaps {
    /// Its identity.
    pub id: SrqId,
    /// Its protection domain.
    pub pd: PdId,
    /// Receives it holds at most.
    pub max_wr: u32,
    /// Scatter/gather elements per receive.
    pub max_sge: u32,
}
