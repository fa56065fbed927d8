//! The device boundary: what the ring needs from an RDMA device, and nothing
//! more.
//!
//! A backend provides a [`ProtectionDomain`] (memory registration) and a
//! [`QueuePair`] (an RC queue pair together with the completion queue its
//! work requests complete on). The ring speaks to it only in plain data:
//! [`SendWr`], [`RecvWr`] and [`RawCompletion`]. Two backends exist:
//!
//! * [`soft`]: an in-process software RC device, for tests, examples and
//!   machines without RDMA hardware;
//! * `verbs` (feature `verbs`): libibverbs through rdma-sys.
//!
//! The ring never learns which one it drives.

pub mod soft;
#[cfg(feature = "verbs")]
pub mod verbs;
mod wc;

use std::os::fd::AsFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub use wc::WcStatus;

use crate::error::Error;

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
        static NEXT: AtomicU64 = AtomicU64::new(1);
        PdId(NEXT.fetch_add(1, Ordering::Relaxed))
    }
}

/// One scatter/gather element: `len` bytes at `addr`, registered under `lkey`.
///
/// ```
/// use rdma_ring::backend::Sge;
/// let sge = Sge { addr: 0x1000, len: 64, lkey: 7 };
/// assert_eq!(sge.len, 64);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Sge {
    /// Virtual address of the first byte.
    pub addr: u64,
    /// Number of bytes; zero means "no scatter/gather element".
    pub len: u32,
    /// Local key of the registration covering the bytes.
    pub lkey: u32,
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
///
/// ```
/// use rdma_ring::backend::{SendWr, SendOpcode, SendFlags, Sge};
/// let wr = SendWr::new(1, SendOpcode::Send, Sge::default());
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
    /// Local memory (source, or target for READ and atomics).
    pub sge: Sge,
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
    pub fn new(wr_id: u64, opcode: SendOpcode, sge: Sge) -> Self {
        SendWr {
            wr_id,
            opcode,
            flags: SendFlags::empty(),
            sge,
            remote_addr: 0,
            rkey: 0,
            imm: 0,
            compare_add: 0,
            swap: 0,
        }
    }
}

/// A receive work request in plain data.
///
/// ```
/// use rdma_ring::backend::{RecvWr, Sge};
/// let wr = RecvWr { wr_id: 9, sge: Sge::default() };
/// assert_eq!(wr.wr_id, 9);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecvWr {
    /// Identity echoed in the completion.
    pub wr_id: u64,
    /// Where the incoming payload lands.
    pub sge: Sge,
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
    /// Outcome.
    pub status: WcStatus,
    /// Bytes transferred (receives: bytes that arrived).
    pub byte_len: u32,
    /// Immediate data that arrived with a receive.
    pub imm: Option<u32>,
    /// Whether an RDMA WRITE with immediate (not a SEND) consumed this
    /// receive: its buffer is untouched and `byte_len` counts the bytes
    /// written to the remote slice.
    pub by_write_imm: bool,
}

/// The limits of a queue pair and its completion queue, as created.
///
/// ```
/// # use rdma_ring::backend::{QpCaps, PdId};
/// let caps = QpCaps { max_send_wr: 64, max_recv_wr: 64, cq_entries: 129, max_inline_data: 64, atomics: true, pd: PdId::fresh() };
/// assert!(caps.cq_entries >= caps.max_send_wr + caps.max_recv_wr);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpCaps {
    /// Send queue depth.
    pub max_send_wr: u32,
    /// Receive queue depth.
    pub max_recv_wr: u32,
    /// Completion queue depth.
    pub cq_entries: u32,
    /// Largest payload that may be posted inline.
    pub max_inline_data: u32,
    /// Whether the device runs 8-byte atomics.
    pub atomics: bool,
    /// The protection domain of the queue pair.
    pub pd: PdId,
}

/// How a backend refused part of a posted list: the first `accepted` work
/// requests were posted, the rest were not. A backend that cannot tell
/// which it posted reports them all as accepted (`accepted` equal to the
/// list's length); the ring then moves the queue pair to error, so that
/// whatever the device did take comes back flushed.
#[derive(Debug)]
pub struct PostError {
    /// Number of work requests the device took before the one it refused.
    pub accepted: usize,
    /// Why it refused.
    pub error: Error,
}

/// Queue-pair settings common to all backends.
///
/// ```
/// use rdma_ring::backend::QpConfig;
/// let config = QpConfig { max_send_wr: 256, ..QpConfig::default() };
/// assert_eq!(config.completion_entries(), 256 + 128 + 1);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpConfig {
    /// Send queue depth.
    pub max_send_wr: u32,
    /// Receive queue depth.
    pub max_recv_wr: u32,
    /// Completion queue depth; 0 means enough for every WR the queues can
    /// hold plus one (what the ring's credit accounting needs for teardown).
    pub cq_entries: u32,
    /// Largest payload that may be posted inline.
    pub max_inline_data: u32,
    /// RNR retries before a send fails with `RnrRetryExceeded`; 7 means
    /// forever, so the default is below it.
    pub rnr_retry: u8,
    /// Transport retries before a request fails with `RetryExceeded`.
    pub retry_cnt: u8,
    /// Local ACK timeout exponent: a request is retried after 4.096 µs ×
    /// 2^`ack_timeout` without an answer (16 ≈ 268 ms).
    pub ack_timeout: u8,
}

impl Default for QpConfig {
    fn default() -> Self {
        QpConfig {
            max_send_wr: 128,
            max_recv_wr: 128,
            cq_entries: 0,
            max_inline_data: 64,
            rnr_retry: 6,
            retry_cnt: 6,
            ack_timeout: 16,
        }
    }
}

impl QpConfig {
    /// The completion queue depth this configuration asks for.
    pub fn completion_entries(&self) -> u32 {
        if self.cq_entries == 0 {
            self.max_send_wr + self.max_recv_wr + 1
        } else {
            self.cq_entries
        }
    }
}

/// A memory registration.
///
/// # Safety
///
/// The ring and the buffer types hand memory to the device on the strength
/// of these promises, so an implementation must keep them:
///
/// * [`lkey`](Self::lkey) and [`rkey`](Self::rkey) name a registration of
///   exactly the bytes passed to [`ProtectionDomain::register_raw`], with
///   exactly the access rights asked for (an rkey of 0 when no remote right
///   was asked), in the domain [`pd`](Self::pd) names;
/// * once [`deregister`](Self::deregister) returns `Ok`, the device never
///   touches the memory again through either key, so its owner may free it;
///   when it returns `Err`, the registration may still be live, and the
///   owner keeps the memory (or leaks it) rather than free it;
/// * dropping a region that was not deregistered deregisters it, if it can.
pub unsafe trait MemoryRegion: Send + Sync {
    /// Local key, for scatter/gather elements.
    fn lkey(&self) -> u32;
    /// Remote key, for peers; meaningful only with remote access rights.
    fn rkey(&self) -> u32;
    /// The protection domain the memory is registered in.
    fn pd(&self) -> PdId;
    /// Ends the registration: after `Ok` the device no longer accesses the
    /// memory. Calling it again after `Ok` does nothing.
    fn deregister(&mut self) -> Result<(), Error>;
}

/// A protection domain: the scope of memory registrations and queue pairs.
///
/// Safe registration lives in [`crate::buf`] ([`RegisteredBuf::new`],
/// [`BufferPool::new`], [`ExposedBuf::new`]), which take ownership of the
/// memory so that it outlives its registration.
///
/// [`RegisteredBuf::new`]: crate::buf::RegisteredBuf::new
/// [`BufferPool::new`]: crate::buf::BufferPool::new
/// [`ExposedBuf::new`]: crate::buf::ExposedBuf::new
///
/// # Safety
///
/// [`id`](Self::id) is this domain's identity for as long as it lives, and
/// every region [`register_raw`](Self::register_raw) returns belongs to it
/// and keeps the promises of [`MemoryRegion`]. The ring refuses a buffer
/// of another domain on the strength of `id`.
pub unsafe trait ProtectionDomain: Send + Sync {
    /// This domain's identity.
    fn id(&self) -> PdId;

    /// Registers `len` bytes at `addr` with `access` rights.
    ///
    /// # Safety
    ///
    /// The memory must stay allocated, at the same address, until the
    /// returned region is dropped, and the caller must not create Rust
    /// references to bytes the device may be writing (in-flight local
    /// targets, or any byte while remote write or atomic rights are granted).
    unsafe fn register_raw(
        &self,
        addr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<Box<dyn MemoryRegion>, Error>;
}

/// An RC queue pair and the completion queue its work requests complete on.
///
/// The ring is the only intended caller; the methods are public so that new
/// backends can be written outside the crate.
///
/// # Safety
///
/// The ring releases an operation's buffer to safe code when the queue pair
/// reports the operation complete, so an implementation must report
/// truthfully:
///
/// * [`poll_cq`](Self::poll_cq) reports a completion for a `wr_id` only
///   once the device has finished with every byte that work request names,
///   at most once per posted work request, and never for a `wr_id` that was
///   not posted (a `wr_id` it cannot vouch for must not be reported);
/// * send work requests complete in posting order, and one that fails or
///   is flushed is reported whether or not it asked for a completion;
///   after [`set_error`](Self::set_error) returns `Ok`, every outstanding
///   work request is reported, flushed or not, in bounded time;
/// * a post that returns `Err(PostError { accepted, .. })` handed exactly
///   the first `accepted` work requests to the device and none after them
///   (when it cannot tell, it must report them all as accepted: a work
///   request wrongly reported as refused would be freed under the device);
/// * [`caps`](Self::caps) describes the queue pair as created: the ring
///   keeps within those depths so that no completion is dropped.
pub unsafe trait QueuePair {
    /// Queue depths and limits.
    fn caps(&self) -> QpCaps;

    /// Posts a linked list of send work requests with one doorbell.
    ///
    /// # Safety
    ///
    /// Every byte named by a work request's scatter/gather element must stay
    /// valid and must not be accessed by the caller until the work request
    /// has completed (its own completion, or a later signaled completion on
    /// this send queue, or a flush).
    unsafe fn post_send(&mut self, wrs: &[SendWr]) -> Result<(), PostError>;

    /// Posts a linked list of receive work requests with one doorbell.
    ///
    /// # Safety
    ///
    /// As for [`QueuePair::post_send`]: the memory belongs to the device
    /// until the receive completes.
    unsafe fn post_recv(&mut self, wrs: &[RecvWr]) -> Result<(), PostError>;

    /// Moves up to `out.len()` completions into `out`; returns how many.
    fn poll_cq(&mut self, out: &mut [RawCompletion]) -> Result<usize, Error>;

    /// Moves the queue pair to the error state: every outstanding and future
    /// work request completes with [`WcStatus::WrFlushErr`].
    fn set_error(&mut self) -> Result<(), Error>;

    /// The completion channel of this queue pair's completion queue, if the
    /// backend has one. The futures adapter uses it to sleep until a
    /// completion arrives instead of polling.
    fn completion_events(&self) -> Option<Arc<dyn CompletionEvents>> {
        None
    }
}

/// A completion channel: tells a sleeping thread, or a reactor watching
/// its file descriptor, that a completion arrived.
///
/// Events are one-shot, as with `ibv_req_notify_cq`: after [`arm`], the
/// next CQE added to the completion queue raises one event and disarms.
/// CQEs that were already there raise nothing, so a consumer must arm
/// first and poll the completion queue after — the order that loses no
/// wake-up:
///
/// 1. [`take`] the pending events (the descriptor stops being readable);
/// 2. [`arm`] again;
/// 3. poll the completion queue until it is empty.
///
/// [`arm`]: CompletionEvents::arm
/// [`take`]: CompletionEvents::take
pub trait CompletionEvents: AsFd + Send + Sync {
    /// Requests an event for the next CQE.
    fn arm(&self) -> Result<(), Error>;
    /// Consumes pending events without blocking; returns how many there were.
    fn take(&self) -> Result<usize, Error>;
    /// Blocks until an event is pending or `timeout` passes; returns whether
    /// one is pending (it stays pending until [`take`](Self::take)).
    fn wait(&self, timeout: Duration) -> Result<bool, Error>;
}
