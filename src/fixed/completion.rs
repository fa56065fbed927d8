//! What the fixed ring hands back for each operation.

use super::{FixedBuf, FixedQp};
use crate::backend::WcStatus;
use crate::op::OpKind;

/// A finished operation of a [`FixedRing`](super::FixedRing): its slot's
/// token back, with the outcome. 56 bytes, where the owned-buffer ring's
/// [`Completion`](crate::ring::Completion) carries a whole buffer.
///
/// ```
/// use rdma_ring::backend::{soft::SoftDevice, QpConfig, QueuePair};
/// use rdma_ring::buf::{ExposedBuf, RemoteAccess};
/// use rdma_ring::fixed::{FixedBufs, FixedRing, FixedRingConfig, WriteFixed};
/// use rdma_ring::op::OpKind;
///
/// let dev = SoftDevice::new();
/// let pd = dev.alloc_pd();
/// let (mut qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
/// let target = ExposedBuf::new(&pd, vec![0u8; 64], RemoteAccess::WRITE).unwrap();
/// let cq = qp.take_cq().unwrap();
/// let bufs = FixedBufs::new(&pd, 1, 64).unwrap();
/// let mut ring = FixedRing::new(cq, bufs, FixedRingConfig::default());
/// let handle = ring.attach(qp).unwrap();
/// let buf = ring.take_buf().unwrap();
/// ring.push(handle, WriteFixed::new(buf, 32, target.remote()).user_data(5)).unwrap();
/// ring.submit().unwrap();
/// let done = ring.wait(1).unwrap();
/// let c = &done[0];
/// assert_eq!((c.user_data(), c.kind(), c.byte_len()), (5, OpKind::Write, 32));
/// assert!(c.status().is_success() && c.qp() == handle);
/// ```
#[derive(Debug)]
pub struct FixedCompletion {
    pub(super) user_data: u64,
    pub(super) buf: FixedBuf,
    pub(super) qp: FixedQp,
    pub(super) byte_len: u32,
    pub(super) imm: Option<u32>,
    pub(super) kind: OpKind,
    pub(super) status: WcStatus,
    pub(super) by_write_imm: bool,
}

impl FixedCompletion {
    /// The tag the operation was pushed with.
    #[inline]
    pub fn user_data(&self) -> u64 {
        self.user_data
    }

    /// What the operation was.
    #[inline]
    pub fn kind(&self) -> OpKind {
        self.kind
    }

    /// How it ended. After a failure the queue pair is in error, and its
    /// later operations come back [`WcStatus::WrFlushErr`].
    #[inline]
    pub fn status(&self) -> WcStatus {
        self.status
    }

    /// Bytes moved: for a receive, the bytes that arrived (or, consumed by
    /// a WRITE with immediate, the bytes written to the remote slice); for
    /// the others, the bytes the operation covered if it succeeded, else
    /// zero.
    #[inline]
    pub fn byte_len(&self) -> u32 {
        self.byte_len
    }

    /// Immediate data that arrived with a receive.
    #[inline]
    pub fn imm(&self) -> Option<u32> {
        self.imm
    }

    /// Whether a WRITE with immediate (not a SEND) consumed this receive:
    /// then its slot is untouched.
    #[inline]
    pub fn by_write_imm(&self) -> bool {
        self.by_write_imm
    }

    /// The queue pair the operation ran on.
    #[inline]
    pub fn qp(&self) -> FixedQp {
        self.qp
    }

    /// The slot's token, to read the slot through
    /// [`FixedBufs::bytes`](super::FixedBufs::bytes).
    #[inline]
    pub fn buf(&self) -> &FixedBuf {
        &self.buf
    }

    /// The slot's token, to reuse or put back.
    #[inline]
    pub fn into_buf(self) -> FixedBuf {
        self.buf
    }
}

const _: () = assert!(std::mem::size_of::<FixedCompletion>() <= 56);
