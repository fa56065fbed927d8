//! The device boundary: what the ring needs from an RDMA device, and nothing
//! more.
//!
//! A backend provides:
//!
//! * a [`ProtectionDomain`]: memory registration ([`MemoryRegion`]);
//! * a [`CompletionQueue`]: where the work requests of any number of queue
//!   pairs complete, with a completion channel ([`CompletionEvents`]) for
//!   threads and reactors to sleep on;
//! * [`QueuePair`]s (RC), each completing on one completion queue and
//!   taking its receives from its own receive queue or from a
//!   [`SharedReceiveQueue`];
//! * an [`AsyncEventSource`]: the device's asynchronous events.
//!
//! The ring speaks to it only in plain data: [`SendWr`], [`RecvWr`] and
//! their scatter/gather elements ([`Sge`]), [`RawCompletion`] and
//! [`AsyncEvent`]. Two backends exist:
//!
//! * [`soft`]: an in-process software RC device, for tests, examples and
//!   machines without RDMA hardware;
//! * `verbs` (feature `verbs`): libibverbs through rdma-sys.
//!
//! The ring never learns which one it drives. The traits the ring's
//! memory safety rests on are `unsafe` to implement; each states its
//! contract.

pub mod soft;
#[cfg(feature = "verbs")]
pub mod verbs;

use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::Duration;

pub use crate::work::{
    Access, AsyncEvent, CqId, PdId, QpCaps, RawCompletion, RecvWr, SendFlags, SendOpcode, SendWr,
    Sge, SgeSpan, SrqCaps, SrqId, WcStatus,
};

use crate::error::Error;

/// How a backend refused part of a posted list: the first `accepted` work
/// requests were posted, the rest were not. A backend that cannot tell
/// which it posted reports them all as accepted (`accepted` equal to the
/// list's length); the ring then moves the queue pair to error, so that
/// whatever the device did take comes back flushed. For sends it also
/// posts the queue pair's teardown marker behind the list (if it has one:
/// one is kept for each queue pair with a send queue of two or more that
/// fitted the completion queue), whose flush releases, as flushed, the
/// sends the device never took. Without one, and for receives, what the
/// device never took stays counted as posted until the queue pair is
/// detached or the ring closed, whose drain then times out on it and
/// leaks its buffers. A shared receive queue cannot be moved to error:
/// receives of such a post that the device never took stay counted as
/// posted (their buffers held, never freed under the device) until the
/// queue is removed.
///
/// ```
/// # use rdma_ring::backend::soft::SoftDevice;
/// # use rdma_ring::backend::{QpConfig, QueuePair, RecvWr, SgeSpan};
/// # use rdma_ring::Error;
/// # let dev = SoftDevice::new();
/// # let pd = dev.alloc_pd();
/// let mut qp = dev.create_qp(&pd, QpConfig::default()).unwrap();
/// let empty = RecvWr { wr_id: 1, sges: SgeSpan::default() };
/// let past_end = RecvWr { wr_id: 2, sges: SgeSpan { start: 0, len: 1 } };
/// // SAFETY: no scatter/gather element is posted, so no receive names memory.
/// let refused = unsafe { qp.post_recv(&[empty, past_end], &[]) }.unwrap_err();
/// assert_eq!(refused.accepted, 1); // `empty` is posted, `past_end` is not
/// assert!(matches!(refused.error, Error::PostRejected(_)));
/// ```
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
    /// Receive queue depth; ignored for a queue pair on a shared receive
    /// queue (it has none of its own).
    pub max_recv_wr: u32,
    /// Depth of the completion queue of a queue pair created with one of
    /// its own; 0 means enough for every WR the queues can hold plus one
    /// (what the ring's credit accounting needs for teardown).
    pub cq_entries: u32,
    /// Scatter/gather elements per send work request (clamped to what the
    /// device allows).
    pub max_send_sge: u32,
    /// Scatter/gather elements per receive work request (clamped likewise).
    pub max_recv_sge: u32,
    /// Largest payload that may be posted inline. Devices do not say
    /// how much they take; one that refuses this much is asked for half,
    /// and so on down to none, and the queue pair's
    /// [`QpCaps::max_inline_data`] says what it got (the ring refuses a
    /// larger inline push with [`Error::InlineTooLarge`]).
    pub max_inline_data: u32,
    /// RNR retries before a send fails with `RnrRetryExceeded`; 7 means
    /// forever, so the default is below it.
    pub rnr_retry: u8,
    /// Transport retries before a request fails with `RetryExceeded`.
    pub retry_cnt: u8,
    /// Local ACK timeout exponent, 1 to 31: a request is retried after
    /// 4.096 µs × 2^`ack_timeout` without an answer (16 ≈ 268 ms). A queue
    /// pair asked for 0 (which verbs take as never timing out, so a dead
    /// peer would never be noticed) or more than 31 (beyond the field) is
    /// refused.
    pub ack_timeout: u8,
    /// RDMA READs and atomics in flight at once, each way: this side
    /// issues at most this many and answers at most this many of the
    /// peer's, each within the device's limits and what the peer says it
    /// can answer or will issue. More lets READs of a deep queue overlap
    /// (perftest asks for the device's limit); each one answered holds a
    /// responder resource on the device. 0 is taken as 1.
    pub max_rd_atomic: u8,
    /// The traffic class of the queue pair's packets (RoCE: the IP
    /// header's DSCP and ECN bits, so `dscp << 2`), for fabrics that give
    /// RDMA a lossless class of its own (PFC, ECN). 0 by default. Over the
    /// TCP handshake it is this side's; over rdma_cm, a nonzero value
    /// overrides rdma_cm's (its `tos`) for the data path. Only packets
    /// with a global route header carry one: always on RoCE, not on
    /// InfiniBand within one subnet, where it is dropped.
    pub traffic_class: u8,
    /// The service level, 0 to 15, of the queue pair's packets
    /// (InfiniBand: the virtual lane; RoCE: the priority some devices map
    /// it to; Soft-RoCE keeps none). 0 by default; over rdma_cm, a nonzero
    /// value overrides rdma_cm's.
    pub service_level: u8,
}

impl QpConfig {
    /// Why no queue pair takes this configuration (its ACK timeout or
    /// service level), if none does.
    pub(crate) fn refusal(&self) -> Option<&'static str> {
        if !(1..=31).contains(&self.ack_timeout) {
            return Some(
                "ack_timeout must be 1 to 31 (0 would never time out, so a dead peer would go unnoticed)",
            );
        }
        (self.service_level > 15).then_some("service_level must be 0 to 15")
    }
}

impl Default for QpConfig {
    fn default() -> Self {
        QpConfig {
            max_send_wr: 128,
            max_recv_wr: 128,
            cq_entries: 0,
            max_send_sge: 4,
            max_recv_sge: 4,
            max_inline_data: 64,
            rnr_retry: 6,
            retry_cnt: 6,
            ack_timeout: 16,
            max_rd_atomic: 16,
            traffic_class: 0,
            service_level: 0,
        }
    }
}

impl QpConfig {
    /// The completion queue depth this configuration asks for.
    ///
    /// ```
    /// # use rdma_ring::backend::QpConfig;
    /// assert_eq!(QpConfig::default().completion_entries(), 128 + 128 + 1);
    /// let config = QpConfig { cq_entries: 64, ..QpConfig::default() };
    /// assert_eq!(config.completion_entries(), 64);
    /// ```
    pub fn completion_entries(&self) -> u32 {
        if self.cq_entries == 0 {
            // Saturating: a depth this large is refused by the device's
            // limits, with an error, not an overflow.
            self.max_send_wr
                .saturating_add(self.max_recv_wr)
                .saturating_add(1)
        } else {
            self.cq_entries
        }
    }
}

/// Shared receive queue settings common to all backends.
///
/// ```
/// use rdma_ring::backend::SrqConfig;
/// let config = SrqConfig { max_wr: 4096, ..SrqConfig::default() };
/// assert_eq!(config.max_sge, 1);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SrqConfig {
    /// Receives the queue holds at most.
    pub max_wr: u32,
    /// Scatter/gather elements per receive.
    pub max_sge: u32,
}

impl Default for SrqConfig {
    fn default() -> Self {
        SrqConfig {
            max_wr: 1024,
            max_sge: 1,
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
///
/// ```
/// # use rdma_ring::backend::soft::SoftDevice;
/// # use rdma_ring::backend::{Access, ProtectionDomain};
/// let pd = SoftDevice::new().alloc_pd();
/// let mut memory = vec![0u8; 4096];
/// // SAFETY: `memory` is declared first, so it is freed after the region,
/// // and nothing touches it while registered.
/// let mut mr = unsafe { pd.register_raw(memory.as_mut_ptr(), 4096, Access::LOCAL_WRITE) }.unwrap();
/// assert_eq!(mr.pd(), pd.id());
/// mr.deregister().unwrap();
/// memory[0] = 1; // the device no longer reaches it
/// ```
pub unsafe trait MemoryRegion: Send + Sync {
    /// Local key, for scatter/gather elements.
    ///
    /// ```
    /// # use rdma_ring::backend::soft::SoftDevice;
    /// # use rdma_ring::backend::{Access, ProtectionDomain, Sge};
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// # let mut memory = vec![0u8; 64];
    /// # // SAFETY: `memory` is declared first, so it is freed after the region,
    /// # // and nothing touches it while registered.
    /// # let mr = unsafe { pd.register_raw(memory.as_mut_ptr(), 64, Access::LOCAL_WRITE) }.unwrap();
    /// let sge = Sge { addr: memory.as_ptr() as u64, len: 64, lkey: mr.lkey() };
    /// // SAFETY: the bytes `mr` registers; `memory` outlives both regions, untouched.
    /// let again = unsafe { pd.register_raw(memory.as_mut_ptr(), 64, Access::LOCAL_WRITE) }.unwrap();
    /// assert_ne!(again.lkey(), sge.lkey); // each registration has a key of its own
    /// ```
    fn lkey(&self) -> u32;
    /// Remote key, for peers; meaningful only with remote access rights.
    ///
    /// ```
    /// # use rdma_ring::backend::soft::SoftDevice;
    /// # use rdma_ring::backend::{Access, ProtectionDomain};
    /// # let pd = SoftDevice::new().alloc_pd();
    /// let (mut local, mut shared) = (vec![0u8; 64], vec![0u8; 64]);
    /// // SAFETY: both vectors are declared before their regions, so they are
    /// // freed after them, and nothing touches them while registered.
    /// let (local_mr, shared_mr) = unsafe {
    ///     (pd.register_raw(local.as_mut_ptr(), 64, Access::LOCAL_WRITE).unwrap(),
    ///      pd.register_raw(shared.as_mut_ptr(), 64, Access::REMOTE_READ).unwrap())
    /// };
    /// assert_eq!(local_mr.rkey(), 0); // no remote right was asked for
    /// assert_ne!(shared_mr.rkey(), 0);
    /// ```
    fn rkey(&self) -> u32;
    /// The protection domain the memory is registered in.
    ///
    /// ```
    /// # use rdma_ring::backend::soft::SoftDevice;
    /// # use rdma_ring::backend::{Access, ProtectionDomain};
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// # let mut memory = vec![0u8; 64];
    /// # // SAFETY: `memory` is declared first, so it is freed after the region,
    /// # // and nothing touches it while registered.
    /// # let mr = unsafe { pd.register_raw(memory.as_mut_ptr(), 64, Access::LOCAL_WRITE) }.unwrap();
    /// assert_eq!(mr.pd(), pd.id());
    /// assert_ne!(mr.pd(), dev.alloc_pd().id());
    /// ```
    fn pd(&self) -> PdId;
    /// Ends the registration: after `Ok` the device no longer accesses the
    /// memory. Calling it again after `Ok` does nothing.
    ///
    /// ```
    /// # use rdma_ring::backend::soft::SoftDevice;
    /// # use rdma_ring::backend::{Access, ProtectionDomain};
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// # let mut memory = vec![0u8; 64];
    /// # // SAFETY: `memory` is declared first, so it is freed after the region,
    /// # // and nothing touches it while registered.
    /// # let mut mr = unsafe { pd.register_raw(memory.as_mut_ptr(), 64, Access::LOCAL_WRITE) }.unwrap();
    /// dev.fail_deregistrations(1);
    /// assert!(mr.deregister().is_err()); // still registered: keep the memory
    /// mr.deregister().unwrap();
    /// mr.deregister().unwrap(); // already done: nothing to do
    /// ```
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
///
/// ```
/// # use rdma_ring::backend::soft::SoftDevice;
/// # use rdma_ring::backend::QpConfig;
/// # use rdma_ring::buf::RegisteredBuf;
/// # use rdma_ring::op::Send;
/// # use rdma_ring::ring::{Ring, RingConfig};
/// # use rdma_ring::Error;
/// let dev = SoftDevice::new();
/// let (pd, other) = (dev.alloc_pd(), dev.alloc_pd());
/// let (qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
/// let mut ring = Ring::new(qp, RingConfig::default());
/// let foreign = RegisteredBuf::new(&other, b"hi".to_vec()).unwrap();
/// let refused = ring.submission().push(Send::new(foreign)).unwrap_err();
/// assert!(matches!(refused.error(), Error::WrongPd { .. }));
/// ```
pub unsafe trait ProtectionDomain: Send + Sync {
    /// This domain's identity.
    ///
    /// ```
    /// # use rdma_ring::backend::soft::SoftDevice;
    /// # use rdma_ring::backend::{ProtectionDomain, QpConfig, QueuePair};
    /// let dev = SoftDevice::new();
    /// let pd = dev.alloc_pd();
    /// let qp = dev.create_qp(&pd, QpConfig::default()).unwrap();
    /// assert_eq!(qp.caps().pd, pd.id());
    /// assert_ne!(dev.alloc_pd().id(), pd.id());
    /// ```
    fn id(&self) -> PdId;

    /// Registers `len` bytes at `addr` with `access` rights.
    ///
    /// # Safety
    ///
    /// The memory must stay allocated, at the same address, until the
    /// returned region is dropped, and the caller must not create Rust
    /// references to bytes the device may be writing (in-flight local
    /// targets, or any byte while remote write or atomic rights are granted).
    ///
    /// ```
    /// # use rdma_ring::backend::soft::SoftDevice;
    /// # use rdma_ring::backend::{Access, ProtectionDomain};
    /// let pd = SoftDevice::new().alloc_pd();
    /// let mut memory = vec![0u8; 4096];
    /// let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
    /// // SAFETY: `memory` is declared first, so it is freed after the region,
    /// // and nothing reads or writes it while a peer may write it.
    /// let mr = unsafe { pd.register_raw(memory.as_mut_ptr(), memory.len(), access) }.unwrap();
    /// assert_ne!(mr.rkey(), 0); // what a peer needs to write here
    /// ```
    unsafe fn register_raw(
        &self,
        addr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<Box<dyn MemoryRegion>, Error>;
}

/// An RC queue pair. Its work requests complete on the completion queue
/// its [`caps`](Self::caps) names; its receives come from its own receive
/// queue, or from the shared receive queue its caps name.
///
/// The ring is the only intended caller; the methods are public so that new
/// backends can be written outside the crate.
///
/// # Safety
///
/// The ring releases an operation's buffer to safe code when a completion
/// reports the operation done, so an implementation must keep these
/// promises, together with its [`CompletionQueue`]:
///
/// * every work request posted here completes on the completion queue
///   `caps().cq` names, with this queue pair's `caps().qp_num`, once the
///   device has finished with every byte it names, at most once, and never
///   before;
/// * send work requests complete in posting order, and one that fails or
///   is flushed is reported whether or not it asked for a completion;
///   after [`set_error`](Self::set_error) returns `Ok`, every outstanding
///   work request of this queue pair's own queues is reported, flushed or
///   not, in bounded time;
/// * a post that returns `Err(PostError { accepted, .. })` handed exactly
///   the first `accepted` work requests to the device and none after them
///   (when it cannot tell, it must report them all as accepted: a work
///   request wrongly reported as refused would be freed under the device);
/// * a work request's memory is exactly the scatter/gather elements its
///   span names in the array posted with it;
/// * [`caps`](Self::caps) describes the queue pair as created and never
///   changes: the ring keeps within those depths so that no completion is
///   dropped;
/// * [`take_cq`](Self::take_cq) hands out the queue pair's own completion
///   queue (the one `caps().cq` names) at most once.
///
/// ```
/// # use rdma_ring::backend::soft::SoftDevice;
/// # use rdma_ring::backend::{CompletionQueue, QpConfig, QueuePair};
/// let dev = SoftDevice::new();
/// let pd = dev.alloc_pd();
/// let (mut qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
/// let cq = qp.take_cq().unwrap();
/// assert_eq!(qp.caps().cq, cq.id()); // where its work requests complete
/// ```
pub unsafe trait QueuePair {
    /// The completion queues this queue pair can complete on.
    type Cq: CompletionQueue + Send;
    /// The shared receive queues it can take receives from.
    type Srq: SharedReceiveQueue + Send;

    /// Queue depths, limits and identities.
    ///
    /// ```
    /// # use rdma_ring::backend::soft::{SoftDevice, MAX_SGE};
    /// # use rdma_ring::backend::{QpConfig, QueuePair};
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// let config = QpConfig { max_send_wr: 64, max_send_sge: 100, ..QpConfig::default() };
    /// let qp = dev.create_qp(&pd, config).unwrap();
    /// assert_eq!(qp.caps().max_send_wr, 64);
    /// assert_eq!(qp.caps().max_send_sge, MAX_SGE); // clamped to what the device allows
    /// assert_eq!(qp.caps().qp_num, qp.qpn());
    /// ```
    fn caps(&self) -> QpCaps;

    /// Posts a linked list of send work requests with one doorbell; each
    /// names its memory as a span of `sges`.
    ///
    /// # Safety
    ///
    /// Every byte named by a work request's scatter/gather elements must
    /// stay valid and must not be accessed by the caller until the work
    /// request has completed (its own completion, or a later signaled
    /// completion on this send queue, or a flush).
    ///
    /// ```
    /// # use rdma_ring::backend::soft::SoftDevice;
    /// # use rdma_ring::backend::{CompletionQueue, QpConfig, QueuePair, RawCompletion};
    /// # use rdma_ring::backend::{SendFlags, SendOpcode, SendWr, Sge, SgeSpan};
    /// # use rdma_ring::buf::{ExposedBuf, RegisteredBuf, RemoteAccess};
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// let (mut qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    /// let source = RegisteredBuf::new(&pd, b"data".to_vec()).unwrap();
    /// let target = ExposedBuf::new(&pd, vec![0u8; 4], RemoteAccess::WRITE).unwrap(); // the peer's
    /// let sge = Sge { addr: source.as_ptr() as u64, len: 4, lkey: source.lkey() };
    /// let remote = target.remote();
    /// let write = SendWr::new(1, SendOpcode::Write, SgeSpan { start: 0, len: 1 });
    /// let wr = SendWr { flags: SendFlags::SIGNALED, remote_addr: remote.addr(), rkey: remote.rkey(), ..write };
    /// // SAFETY: `source` lives, untouched, until after the completion polled below.
    /// unsafe { qp.post_send(&[wr], &[sge]) }.unwrap();
    /// let mut done = [RawCompletion::default(); 1];
    /// assert_eq!(qp.take_cq().unwrap().poll(&mut done).unwrap(), 1);
    /// assert_eq!(target.into_inner().unwrap(), b"data");
    /// ```
    unsafe fn post_send(&mut self, wrs: &[SendWr], sges: &[Sge]) -> Result<(), PostError>;

    /// Posts a linked list of receive work requests to this queue pair's
    /// own receive queue, with one doorbell.
    ///
    /// # Safety
    ///
    /// As for [`QueuePair::post_send`]: the memory belongs to the device
    /// until the receive completes.
    ///
    /// ```
    /// # use rdma_ring::backend::soft::SoftDevice;
    /// # use rdma_ring::backend::{CompletionQueue, QpConfig, QueuePair, RawCompletion};
    /// # use rdma_ring::backend::{RecvWr, SendOpcode, SendWr, Sge, SgeSpan};
    /// # use rdma_ring::buf::RegisteredBuf;
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// let (mut peer, mut qp) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    /// let mut inbox = RegisteredBuf::new(&pd, vec![0u8; 16]).unwrap();
    /// let sge = Sge { addr: inbox.as_mut_ptr() as u64, len: 16, lkey: inbox.lkey() };
    /// let recv = RecvWr { wr_id: 7, sges: SgeSpan { start: 0, len: 1 } };
    /// // SAFETY: `inbox` lives, untouched, until after the completion polled below.
    /// unsafe { qp.post_recv(&[recv], &[sge]) }.unwrap();
    /// # let hi = RegisteredBuf::new(&pd, b"hi".to_vec()).unwrap();
    /// # let sge = Sge { addr: hi.as_ptr() as u64, len: 2, lkey: hi.lkey() };
    /// # let send = SendWr::new(1, SendOpcode::Send, SgeSpan { start: 0, len: 1 });
    /// # // SAFETY: `hi` is only read, and lives until the end.
    /// # unsafe { peer.post_send(&[send], &[sge]) }.unwrap();
    /// // Once the peer's SEND of "hi" has arrived:
    /// let mut done = [RawCompletion::default(); 1];
    /// assert_eq!(qp.take_cq().unwrap().poll(&mut done).unwrap(), 1);
    /// assert_eq!((done[0].wr_id, done[0].byte_len), (7, 2));
    /// assert_eq!(&inbox[..2], b"hi");
    /// ```
    unsafe fn post_recv(&mut self, wrs: &[RecvWr], sges: &[Sge]) -> Result<(), PostError>;

    /// Moves the queue pair to the error state: every outstanding and future
    /// work request of its own queues completes with
    /// [`WcStatus::WrFlushErr`].
    ///
    /// ```
    /// # use rdma_ring::backend::soft::{QpState, SoftDevice};
    /// # use rdma_ring::backend::{QpConfig, QueuePair};
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// let (mut qp, peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    /// qp.set_error().unwrap();
    /// assert_eq!(qp.control().state(), Some(QpState::Error));
    /// // The peer learns of it only when its own requests go unanswered.
    /// assert_eq!(peer.control().state(), Some(QpState::ReadyToSend));
    /// ```
    fn set_error(&mut self) -> Result<(), Error>;

    /// The completion queue this queue pair was created with for itself
    /// alone, once; `None` for a queue pair on a shared completion queue
    /// (or if already taken). [`Ring::new`](crate::ring::Ring::new) takes it.
    ///
    /// ```
    /// # use rdma_ring::backend::soft::SoftDevice;
    /// # use rdma_ring::backend::{QpConfig, QueuePair};
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// let mut own = dev.create_qp(&pd, QpConfig::default()).unwrap();
    /// assert!(own.take_cq().is_some());
    /// assert!(own.take_cq().is_none()); // handed out once
    /// let cq = dev.create_cq(64).unwrap();
    /// let mut on_shared = dev.create_qp_on(&pd, &cq, None, QpConfig::default()).unwrap();
    /// assert!(on_shared.take_cq().is_none());
    /// ```
    fn take_cq(&mut self) -> Option<Self::Cq>;

    /// Whether the peer has gone (a connection manager's disconnect): the
    /// ring asks from time to time when idle, and moves the queue pair to
    /// error when it has. Queue pairs without such news say no.
    ///
    /// ```
    /// # use rdma_ring::backend::soft::SoftDevice;
    /// # use rdma_ring::backend::{QpConfig, QueuePair};
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// let (mut qp, peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    /// drop(peer);
    /// // No connection manager tells the soft device; the lost peer shows as
    /// // requests that fail.
    /// assert!(!qp.peer_disconnected().unwrap());
    /// ```
    fn peer_disconnected(&mut self) -> Result<bool, Error> {
        Ok(false)
    }
}

/// The status a ring fails `qp` with if its peer is known gone:
/// `RetryExcErr` when it says its peer left, `FatalErr` when it cannot say
/// (its connection's event channel failed: nobody could learn that its
/// peer left, and one connection's failure must not fail the others).
pub(crate) fn peer_departure(qp: &mut impl QueuePair) -> Option<WcStatus> {
    match qp.peer_disconnected() {
        Ok(false) => None,
        Ok(true) => Some(WcStatus::RetryExcErr),
        Err(_) => Some(WcStatus::FatalErr),
    }
}

/// A completion queue, shared by any number of queue pairs.
///
/// # Safety
///
/// [`poll`](Self::poll) reports a completion for a `wr_id` only as the
/// [`QueuePair`] contract allows (once the device is done with the work
/// request's memory, at most once, never for a work request that was not
/// posted) and names truthfully the queue pair it ran on; [`id`](Self::id)
/// and [`entries`](Self::entries) never change.
///
/// ```
/// # use rdma_ring::backend::soft::SoftDevice;
/// # use rdma_ring::backend::{CompletionQueue, QpConfig, QueuePair};
/// # let dev = SoftDevice::new();
/// # let pd = dev.alloc_pd();
/// let cq = dev.create_cq(512).unwrap();
/// let a = dev.create_qp_on(&pd, &cq, None, QpConfig::default()).unwrap();
/// let b = dev.create_qp_on(&pd, &cq, None, QpConfig::default()).unwrap();
/// assert_eq!(a.caps().cq, cq.id());
/// assert_eq!(b.caps().cq, cq.id());
/// ```
pub unsafe trait CompletionQueue {
    /// This queue's identity, as its queue pairs' caps name it.
    ///
    /// ```
    /// # use rdma_ring::backend::soft::SoftDevice;
    /// # use rdma_ring::backend::{CompletionQueue, QpConfig, QueuePair};
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// let mut qp = dev.create_qp(&pd, QpConfig::default()).unwrap();
    /// let cq = qp.take_cq().unwrap();
    /// assert_eq!(cq.id(), qp.caps().cq);
    /// assert_ne!(cq.id(), dev.create_cq(16).unwrap().id());
    /// ```
    fn id(&self) -> CqId;

    /// How many completions the queue holds before it overruns.
    ///
    /// ```
    /// # use rdma_ring::backend::soft::SoftDevice;
    /// # use rdma_ring::backend::{CompletionQueue, QpConfig, QueuePair};
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// let config = QpConfig { max_send_wr: 32, max_recv_wr: 32, ..QpConfig::default() };
    /// let mut qp = dev.create_qp(&pd, config).unwrap();
    /// assert_eq!(qp.take_cq().unwrap().entries(), 32 + 32 + 1);
    /// ```
    fn entries(&self) -> u32;

    /// Moves up to `out.len()` completions into `out`; returns how many.
    /// Fewer than `out.len()` means the queue had no more: the rings stop
    /// polling on a short batch, taking the queue as drained.
    ///
    /// ```
    /// # use rdma_ring::backend::soft::SoftDevice;
    /// # use rdma_ring::backend::{CompletionQueue, QpConfig, QueuePair, RawCompletion};
    /// # use rdma_ring::backend::{SendFlags, SendOpcode, SendWr, SgeSpan, WcStatus};
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// let (mut qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    /// let mut cq = qp.take_cq().unwrap();
    /// let write = SendWr::new(5, SendOpcode::Write, SgeSpan::default());
    /// // SAFETY: a zero-length WRITE names no memory.
    /// unsafe { qp.post_send(&[SendWr { flags: SendFlags::SIGNALED, ..write }], &[]) }.unwrap();
    /// let mut out = [RawCompletion::default(); 8];
    /// assert_eq!(cq.poll(&mut out).unwrap(), 1);
    /// assert_eq!((out[0].wr_id, out[0].status), (5, WcStatus::Success));
    /// assert_eq!(cq.poll(&mut out).unwrap(), 0); // each completion comes once
    /// ```
    fn poll(&mut self, out: &mut [RawCompletion]) -> Result<usize, Error>;

    /// The queue's completion channel, if the backend has one: threads and
    /// reactors sleep on it instead of polling.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use rdma_ring::backend::soft::SoftDevice;
    /// # use rdma_ring::backend::CompletionQueue;
    /// let cq = SoftDevice::new().create_cq(64).unwrap();
    /// let events = cq.completion_events().unwrap(); // the soft device has a channel
    /// events.arm().unwrap();
    /// // Armed, but no completion has arrived.
    /// assert!(!events.wait(Duration::from_millis(1)).unwrap());
    /// ```
    fn completion_events(&self) -> Option<Arc<dyn CompletionEvents>> {
        None
    }
}

/// A shared receive queue: receives posted once, consumed by whichever
/// attached queue pair a message arrives on.
///
/// # Safety
///
/// A receive posted here is consumed at most once, by a queue pair whose
/// caps name this queue, and is reported on that queue pair's completion
/// queue (with that queue pair's number) once the device has finished
/// with its memory. Receives still posted when [`destroy`](Self::destroy)
/// returns `Ok` are never touched by the device again (they get no
/// completion). Posts report `accepted` as [`QueuePair::post_recv`]
/// does; [`caps`](Self::caps) never changes.
///
/// ```
/// # use rdma_ring::backend::soft::SoftDevice;
/// # use rdma_ring::backend::{QpConfig, QueuePair, SharedReceiveQueue, SrqConfig};
/// # let dev = SoftDevice::new();
/// # let pd = dev.alloc_pd();
/// let srq = dev.create_srq(&pd, SrqConfig::default()).unwrap();
/// let cq = dev.create_cq(512).unwrap();
/// let qp = dev.create_qp_on(&pd, &cq, Some(&srq), QpConfig::default()).unwrap();
/// assert_eq!(qp.caps().srq, Some(srq.caps().id));
/// assert_eq!(qp.caps().max_recv_wr, 0); // no receive queue of its own
/// ```
pub unsafe trait SharedReceiveQueue {
    /// Depth, scatter/gather limit and identity.
    ///
    /// ```
    /// # use rdma_ring::backend::soft::{SoftDevice, MAX_SGE};
    /// # use rdma_ring::backend::{ProtectionDomain, SharedReceiveQueue, SrqConfig};
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// let srq = dev.create_srq(&pd, SrqConfig { max_wr: 256, max_sge: 64 }).unwrap();
    /// assert_eq!(srq.caps().max_wr, 256);
    /// assert_eq!(srq.caps().max_sge, MAX_SGE); // clamped to what the device allows
    /// assert_eq!(srq.caps().pd, pd.id());
    /// ```
    fn caps(&self) -> SrqCaps;

    /// Posts receives with one doorbell.
    ///
    /// # Safety
    ///
    /// As for [`QueuePair::post_recv`].
    ///
    /// ```
    /// # use rdma_ring::backend::soft::SoftDevice;
    /// # use rdma_ring::backend::{CompletionQueue, QpConfig, QueuePair, RawCompletion, RecvWr};
    /// # use rdma_ring::backend::{SendOpcode, SendWr, SharedReceiveQueue, Sge, SgeSpan, SrqConfig};
    /// # use rdma_ring::buf::RegisteredBuf;
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// let mut srq = dev.create_srq(&pd, SrqConfig::default()).unwrap();
    /// let mut cq = dev.create_cq(64).unwrap();
    /// let qp = dev.create_qp_on(&pd, &cq, Some(&srq), QpConfig::default()).unwrap();
    /// let mut inbox = RegisteredBuf::new(&pd, vec![0u8; 64]).unwrap();
    /// let sge = Sge { addr: inbox.as_mut_ptr() as u64, len: 64, lkey: inbox.lkey() };
    /// let recv = RecvWr { wr_id: 3, sges: SgeSpan { start: 0, len: 1 } };
    /// // SAFETY: `inbox` lives, untouched, until after the completion polled below.
    /// unsafe { srq.post_recv(&[recv], &[sge]) }.unwrap();
    /// assert_eq!(srq.posted(), 1);
    /// # let mut peer = dev.create_qp(&pd, QpConfig::default()).unwrap();
    /// # dev.connect(&qp, &peer).unwrap();
    /// # let hi = RegisteredBuf::new(&pd, b"hi".to_vec()).unwrap();
    /// # let sge = Sge { addr: hi.as_ptr() as u64, len: 2, lkey: hi.lkey() };
    /// # let send = SendWr::new(1, SendOpcode::Send, SgeSpan { start: 0, len: 1 });
    /// # // SAFETY: `hi` is only read, and lives until the end.
    /// # unsafe { peer.post_send(&[send], &[sge]) }.unwrap();
    /// // Once a peer's SEND of "hi" has reached `qp`:
    /// let mut done = [RawCompletion::default(); 1];
    /// assert_eq!(cq.poll(&mut done).unwrap(), 1);
    /// assert_eq!((done[0].wr_id, done[0].qp_num), (3, qp.qpn())); // consumed by `qp`
    /// assert_eq!(&inbox[..2], b"hi");
    /// ```
    unsafe fn post_recv(&mut self, wrs: &[RecvWr], sges: &[Sge]) -> Result<(), PostError>;

    /// Arms the low-water event: when fewer than `limit` receives remain
    /// posted, the device raises [`AsyncEvent::SrqLimitReached`] once. A
    /// `limit` above the depth asked for ([`SrqCaps::max_wr`]) is refused,
    /// even where the device made the queue deeper.
    ///
    /// ```
    /// # use rdma_ring::backend::soft::SoftDevice;
    /// # use rdma_ring::backend::{SharedReceiveQueue, SrqConfig};
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// let mut srq = dev.create_srq(&pd, SrqConfig { max_wr: 64, max_sge: 1 }).unwrap();
    /// srq.arm_limit(8).unwrap();
    /// assert_eq!(srq.limit(), 8);
    /// assert!(srq.arm_limit(65).is_err()); // deeper than the queue
    /// ```
    fn arm_limit(&mut self, limit: u32) -> Result<(), Error>;

    /// Destroys the queue. It fails while a queue pair created on it still
    /// exists (on verbs, detached from a ring or not); after `Ok`, the
    /// device never touches the receives still posted.
    ///
    /// ```
    /// # use rdma_ring::backend::soft::SoftDevice;
    /// # use rdma_ring::backend::{QpConfig, SharedReceiveQueue, SrqConfig};
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// let mut srq = dev.create_srq(&pd, SrqConfig::default()).unwrap();
    /// let cq = dev.create_cq(64).unwrap();
    /// let qp = dev.create_qp_on(&pd, &cq, Some(&srq), QpConfig::default()).unwrap();
    /// assert!(srq.destroy().is_err()); // `qp` still takes its receives from it
    /// drop(qp);
    /// srq.destroy().unwrap();
    /// ```
    fn destroy(&mut self) -> Result<(), Error>;
}

/// A device's asynchronous event channel: its descriptor is readable when
/// an event is pending, for reactors; [`next_event`](Self::next_event)
/// never blocks.
///
/// ```
/// # use rdma_ring::backend::soft::SoftDevice;
/// # use rdma_ring::backend::{AsyncEvent, AsyncEventSource};
/// let dev = SoftDevice::new();
/// let events = dev.async_events().unwrap();
/// dev.set_port_active(false);
/// dev.set_port_active(true);
/// let mut seen = Vec::new();
/// while let Some(event) = events.next_event().unwrap() {
///     seen.push(event);
/// }
/// assert_eq!(seen, [AsyncEvent::PortError { port: 1 }, AsyncEvent::PortActive { port: 1 }]);
/// ```
pub trait AsyncEventSource: AsFd + Send + Sync {
    /// The next pending event, already acknowledged; `None` if there is
    /// none now.
    ///
    /// ```
    /// # use rdma_ring::backend::soft::SoftDevice;
    /// # use rdma_ring::backend::{AsyncEvent, AsyncEventSource, QpConfig};
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// let events = dev.async_events().unwrap();
    /// assert_eq!(events.next_event().unwrap(), None); // nothing pending: no waiting
    /// let (qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    /// qp.control().inject_fatal();
    /// assert_eq!(events.next_event().unwrap(), Some(AsyncEvent::QpFatal { qp_num: qp.qpn() }));
    /// ```
    fn next_event(&self) -> Result<Option<AsyncEvent>, Error>;

    /// Blocks until an event may be pending or `timeout` passes.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use rdma_ring::backend::soft::SoftDevice;
    /// # use rdma_ring::backend::AsyncEventSource;
    /// let dev = SoftDevice::new();
    /// let events = dev.async_events().unwrap();
    /// assert!(!events.wait(Duration::from_millis(1)).unwrap()); // timed out
    /// let handle = dev.clone();
    /// std::thread::spawn(move || handle.set_port_active(false));
    /// assert!(events.wait(Duration::from_secs(10)).unwrap());
    /// assert!(events.next_event().unwrap().is_some());
    /// ```
    fn wait(&self, timeout: Duration) -> Result<bool, Error>;
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
/// ```
/// # use std::time::Duration;
/// # use rdma_ring::backend::soft::SoftDevice;
/// # use rdma_ring::backend::{CompletionEvents, CompletionQueue, QpConfig};
/// # use rdma_ring::buf::{ExposedBuf, RegisteredBuf, RemoteAccess};
/// # use rdma_ring::op::Write;
/// # use rdma_ring::ring::{Ring, RingConfig};
/// # let dev = SoftDevice::new();
/// # let pd = dev.alloc_pd();
/// # let (qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
/// # let target = ExposedBuf::new(&pd, vec![0u8; 2], RemoteAccess::WRITE).unwrap();
/// let mut ring = Ring::new(qp, RingConfig::default());
/// let events = ring.cq().completion_events().unwrap();
/// events.arm().unwrap();
/// let hi = RegisteredBuf::new(&pd, b"hi".to_vec()).unwrap();
/// ring.submission().push(Write::new(hi, target.remote()).signaled()).unwrap();
/// ring.submit().unwrap();
/// assert!(events.wait(Duration::from_secs(10)).unwrap());
/// events.take().unwrap(); // step 1
/// events.arm().unwrap(); // step 2
/// assert_eq!(ring.completion().wait(1).unwrap().len(), 1); // step 3
/// ```
///
/// [`arm`]: CompletionEvents::arm
/// [`take`]: CompletionEvents::take
pub trait CompletionEvents: AsFd + Send + Sync {
    /// Requests an event for the next CQE.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use rdma_ring::backend::soft::SoftDevice;
    /// # use rdma_ring::backend::{CompletionEvents, CompletionQueue, QpConfig};
    /// # use rdma_ring::buf::{ExposedBuf, RegisteredBuf, RemoteAccess};
    /// # use rdma_ring::op::Write;
    /// # use rdma_ring::ring::{Ring, RingConfig};
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// # let (qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    /// # let target = ExposedBuf::new(&pd, vec![0u8; 2], RemoteAccess::WRITE).unwrap();
    /// let mut ring = Ring::new(qp, RingConfig::default());
    /// let write = || Write::new(RegisteredBuf::new(&pd, b"hi".to_vec()).unwrap(), target.remote()).signaled();
    /// let events = ring.cq().completion_events().unwrap();
    /// events.arm().unwrap();
    /// ring.submission().push(write()).unwrap();
    /// ring.submit().unwrap();
    /// assert_eq!(events.take().unwrap(), 1);
    /// // One-shot: not armed again, the next completion raises nothing.
    /// ring.submission().push(write()).unwrap();
    /// ring.submit().unwrap();
    /// assert_eq!(events.take().unwrap(), 0);
    /// ```
    fn arm(&self) -> Result<(), Error>;
    /// Requests an event for the next *solicited* CQE only: a received
    /// message whose sender asked for one (the `solicited` flag of a
    /// SEND or WRITE with immediate), or a failed work request — so a
    /// waiter for the peer's messages is not woken by its own sends'
    /// completions. Backends without the distinction arm for any CQE,
    /// which is correct, only less selective. Devices differ on errors:
    /// the soft device wakes for any failed work request, as the verbs man
    /// page says; rxe raises no solicited event for the completions of a
    /// queue pair's own sends, failed or flushed ones included, so a
    /// waiter there learns of those on its next look.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use rdma_ring::backend::soft::SoftDevice;
    /// # use rdma_ring::backend::{CompletionEvents, CompletionQueue, QpConfig};
    /// # use rdma_ring::buf::{ExposedBuf, RegisteredBuf, RemoteAccess};
    /// # use rdma_ring::op::Write;
    /// # use rdma_ring::ring::{Ring, RingConfig};
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// # let (qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    /// # let target = ExposedBuf::new(&pd, vec![0u8; 2], RemoteAccess::WRITE).unwrap();
    /// # let gone = ExposedBuf::new(&pd, vec![0u8; 2], RemoteAccess::WRITE).unwrap().remote();
    /// let mut ring = Ring::new(qp, RingConfig::default());
    /// let write = |to| Write::new(RegisteredBuf::new(&pd, b"hi".to_vec()).unwrap(), to).signaled();
    /// let events = ring.cq().completion_events().unwrap();
    /// events.arm_solicited().unwrap();
    /// ring.submission().push(write(target.remote())).unwrap();
    /// ring.submit().unwrap();
    /// // Our own write's completion wakes no one...
    /// assert_eq!(events.take().unwrap(), 0);
    /// ring.submission().push(write(gone)).unwrap(); // its region was deregistered
    /// ring.submit().unwrap();
    /// // ...a failed one does.
    /// assert!(events.wait(Duration::from_secs(5)).unwrap());
    /// ```
    fn arm_solicited(&self) -> Result<(), Error> {
        self.arm()
    }
    /// Consumes pending events without blocking; returns how many there were.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use rdma_ring::backend::soft::SoftDevice;
    /// # use rdma_ring::backend::{CompletionEvents, CompletionQueue, QpConfig};
    /// # use rdma_ring::buf::{ExposedBuf, RegisteredBuf, RemoteAccess};
    /// # use rdma_ring::op::Write;
    /// # use rdma_ring::ring::{Ring, RingConfig};
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// # let (qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    /// # let target = ExposedBuf::new(&pd, vec![0u8; 2], RemoteAccess::WRITE).unwrap();
    /// let mut ring = Ring::new(qp, RingConfig::default());
    /// let write = || Write::new(RegisteredBuf::new(&pd, b"hi".to_vec()).unwrap(), target.remote()).signaled();
    /// let events = ring.cq().completion_events().unwrap();
    /// assert_eq!(events.take().unwrap(), 0); // none pending: it returns at once
    /// events.arm().unwrap();
    /// ring.submission().push(write()).unwrap();
    /// ring.submit().unwrap();
    /// assert_eq!(events.take().unwrap(), 1);
    /// assert!(!events.wait(Duration::ZERO).unwrap()); // taken
    /// ```
    fn take(&self) -> Result<usize, Error>;
    /// Blocks until an event is pending or `timeout` passes; returns whether
    /// one is pending (it stays pending until [`take`](Self::take)).
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use rdma_ring::backend::soft::SoftDevice;
    /// # use rdma_ring::backend::{CompletionEvents, CompletionQueue, QpConfig};
    /// # use rdma_ring::buf::{ExposedBuf, RegisteredBuf, RemoteAccess};
    /// # use rdma_ring::op::Write;
    /// # use rdma_ring::ring::{Ring, RingConfig};
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// # let (qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    /// # let target = ExposedBuf::new(&pd, vec![0u8; 2], RemoteAccess::WRITE).unwrap();
    /// let mut ring = Ring::new(qp, RingConfig::default());
    /// let write = || Write::new(RegisteredBuf::new(&pd, b"hi".to_vec()).unwrap(), target.remote()).signaled();
    /// let events = ring.cq().completion_events().unwrap();
    /// events.arm().unwrap();
    /// assert!(!events.wait(Duration::from_millis(1)).unwrap()); // no completion yet
    /// ring.submission().push(write()).unwrap();
    /// ring.submit().unwrap();
    /// assert!(events.wait(Duration::from_secs(10)).unwrap());
    /// assert!(events.wait(Duration::ZERO).unwrap()); // pending until taken
    /// ```
    fn wait(&self, timeout: Duration) -> Result<bool, Error>;
}
