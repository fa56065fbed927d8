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
            max_send_sge: 4,
            max_recv_sge: 4,
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
pub unsafe trait QueuePair {
    /// The completion queues this queue pair can complete on.
    type Cq: CompletionQueue + Send;
    /// The shared receive queues it can take receives from.
    type Srq: SharedReceiveQueue + Send;

    /// Queue depths, limits and identities.
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
    unsafe fn post_send(&mut self, wrs: &[SendWr], sges: &[Sge]) -> Result<(), PostError>;

    /// Posts a linked list of receive work requests to this queue pair's
    /// own receive queue, with one doorbell.
    ///
    /// # Safety
    ///
    /// As for [`QueuePair::post_send`]: the memory belongs to the device
    /// until the receive completes.
    unsafe fn post_recv(&mut self, wrs: &[RecvWr], sges: &[Sge]) -> Result<(), PostError>;

    /// Moves the queue pair to the error state: every outstanding and future
    /// work request of its own queues completes with
    /// [`WcStatus::WrFlushErr`].
    fn set_error(&mut self) -> Result<(), Error>;

    /// The completion queue this queue pair was created with for itself
    /// alone, once; `None` for a queue pair on a shared completion queue
    /// (or if already taken). [`Ring::new`](crate::ring::Ring::new) takes it.
    fn take_cq(&mut self) -> Option<Self::Cq>;

    /// Whether the peer has gone (a connection manager's disconnect): the
    /// ring asks from time to time when idle, and moves the queue pair to
    /// error when it has. Queue pairs without such news say no.
    fn peer_disconnected(&mut self) -> Result<bool, Error> {
        Ok(false)
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
pub unsafe trait CompletionQueue {
    /// This queue's identity, as its queue pairs' caps name it.
    fn id(&self) -> CqId;

    /// How many completions the queue holds before it overruns.
    fn entries(&self) -> u32;

    /// Moves up to `out.len()` completions into `out`; returns how many.
    fn poll(&mut self, out: &mut [RawCompletion]) -> Result<usize, Error>;

    /// The queue's completion channel, if the backend has one: threads and
    /// reactors sleep on it instead of polling.
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
pub unsafe trait SharedReceiveQueue {
    /// Depth, scatter/gather limit and identity.
    fn caps(&self) -> SrqCaps;

    /// Posts receives with one doorbell.
    ///
    /// # Safety
    ///
    /// As for [`QueuePair::post_recv`].
    unsafe fn post_recv(&mut self, wrs: &[RecvWr], sges: &[Sge]) -> Result<(), PostError>;

    /// Arms the low-water event: when fewer than `limit` receives remain
    /// posted, the device raises [`AsyncEvent::SrqLimitReached`] once.
    fn arm_limit(&mut self, limit: u32) -> Result<(), Error>;

    /// Destroys the queue. It fails while queue pairs are still attached;
    /// after `Ok`, the device never touches the receives still posted.
    fn destroy(&mut self) -> Result<(), Error>;
}

/// A device's asynchronous event channel: its descriptor is readable when
/// an event is pending, for reactors; [`next_event`](Self::next_event)
/// never blocks.
pub trait AsyncEventSource: AsFd + Send + Sync {
    /// The next pending event, already acknowledged; `None` if there is
    /// none now.
    fn next_event(&self) -> Result<Option<AsyncEvent>, Error>;

    /// Blocks until an event may be pending or `timeout` passes.
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
/// [`arm`]: CompletionEvents::arm
/// [`take`]: CompletionEvents::take
pub trait CompletionEvents: AsFd + Send + Sync {
    /// Requests an event for the next CQE.
    fn arm(&self) -> Result<(), Error>;
    /// Requests an event for the next *solicited* CQE only: a received
    /// message whose sender asked for one (the `solicited` flag of a
    /// SEND or WRITE with immediate), or a failed work request — so a
    /// waiter for the peer's messages is not woken by its own sends'
    /// completions. Backends without the distinction arm for any CQE,
    /// which is correct, only less selective.
    fn arm_solicited(&self) -> Result<(), Error> {
        self.arm()
    }
    /// Consumes pending events without blocking; returns how many there were.
    fn take(&self) -> Result<usize, Error>;
    /// Blocks until an event is pending or `timeout` passes; returns whether
    /// one is pending (it stays pending until [`take`](Self::take)).
    fn wait(&self, timeout: Duration) -> Result<bool, Error>;
}
