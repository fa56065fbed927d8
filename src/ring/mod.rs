//! The ring: pure logic, no FFI, no knowledge of the backend it drives.
//!
//! A [`Ring`] owns one [`QueuePair`] and keeps every pushed operation in a
//! slab until its completion is reaped. Its parts:
//!
//! * [`SubmissionQueue`] ([`Ring::submission`]): push typed operations, then
//!   [`submit`](SubmissionQueue::submit) posts everything pushed since the
//!   last submit with one post per queue — one doorbell.
//! * [`CompletionQueue`] ([`Ring::completion`]): reap typed
//!   [`Completion`]s, each handing back its operation's buffer, status,
//!   byte count, immediate data and `user_data`.
//!
//! # Invariants the ring keeps
//!
//! * **Ownership**: an operation's buffer lives in the slab from push until
//!   its completion is reaped and comes back only there. A refused push
//!   returns the operation in [`Rejected`].
//! * **Identity**: `wr_id` is slot index plus generation; a completion naming
//!   anything else is reported ([`Error::UnknownWrId`]) and ignored.
//! * **Selective signaling**: a send work request asks for a CQE only when
//!   the operation asks ([`Write::signaled`](crate::op::Write::signaled)),
//!   every [`RingConfig::signal_interval`] work requests, and always on the
//!   last one of a submit, so an unsignaled operation is released no later
//!   than the end of its own batch (RC completes in order).
//! * **Credits**: pushed plus outstanding work never exceeds the send queue,
//!   the receive queue, or what the completion queue can hold, even if
//!   every work request is flushed with its own CQE. One send slot and one
//!   CQE are kept for the teardown marker.
//! * **Errors**: after an error completion the queue pair is in error; the
//!   ring refuses new work ([`Error::QpInError`]) and every outstanding
//!   operation comes back, flushed.
//! * **Teardown**: dropping the ring (or [`Ring::close`]) with work in
//!   flight moves the queue pair to error, drains the flushed completions
//!   within [`RingConfig::drain_timeout`], and only then releases buffers;
//!   if the device cannot drain, the buffers are leaked, never freed under
//!   the NIC.
//!
//! ```
//! use rdma_ring::backend::soft::SoftDevice;
//! use rdma_ring::backend::QpConfig;
//! use rdma_ring::buf::{RegisteredBuf, RemoteAccess, ExposedBuf};
//! use rdma_ring::op::Write;
//! use rdma_ring::ring::{Ring, RingConfig};
//!
//! let dev = SoftDevice::new();
//! let (pd_a, pd_b) = (dev.alloc_pd(), dev.alloc_pd());
//! let (qp_a, _qp_b) = dev.connected_pair(&pd_a, &pd_b, QpConfig::default()).unwrap();
//! let target = ExposedBuf::new(&pd_b, vec![0u8; 64], RemoteAccess::WRITE).unwrap();
//!
//! let mut ring = Ring::new(qp_a, RingConfig::default());
//! let buf = RegisteredBuf::new(&pd_a, vec![7u8; 64]).unwrap();
//! ring.submission().push(Write::new(buf, target.remote()).user_data(1)).unwrap();
//! ring.submission().submit().unwrap();
//! let done = ring.completion().wait(1).unwrap();
//! assert_eq!(done[0].user_data(), 1);
//! assert!(done[0].status().is_success());
//! assert_eq!(target.into_inner().unwrap(), vec![7u8; 64]);
//! ```

mod completion;
mod lifecycle;
mod slab;
mod submission;
mod teardown;

use std::collections::VecDeque;
use std::time::Duration;

pub use completion::{Completion, CompletionQueue};
pub use submission::{SubmissionQueue, SubmitError, Unposted};

use crate::backend::{QpCaps, QueuePair, RawCompletion, RecvWr, SendWr, WcStatus};
use crate::buf::OwnedBuf;
use crate::error::{Error, Rejected};
use crate::op::OpKind;
use lifecycle::Owner;
pub(crate) use slab::Key;
use slab::Slab;

/// The `wr_id` of the teardown marker; never a slab key (index `u32::MAX`
/// is beyond any slab).
const DRAIN_WR_ID: u64 = u64::MAX;

/// The `wr_id` of a sync marker: a zero-length signaled RDMA WRITE posted
/// when a partial post left the accepted prefix unsignaled, so that prefix
/// is released without waiting for later work. Its place in `send_order`
/// is held by [`SYNC_KEY`].
const SYNC_WR_ID: u64 = u64::MAX - 1;
const SYNC_KEY: Key = Key::from_wr_id(SYNC_WR_ID);

/// How a ring behaves.
///
/// ```
/// use rdma_ring::ring::RingConfig;
/// use std::time::Duration;
/// let config = RingConfig { signal_interval: 16, ..RingConfig::default() };
/// assert_eq!(config.drain_timeout, Duration::from_secs(5));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingConfig {
    /// Ask for a CQE at least every this many send work requests (besides
    /// the last of each submit). 0 means half the send queue.
    pub signal_interval: usize,
    /// How long teardown waits for flushed completions before leaking.
    pub drain_timeout: Duration,
    /// How long [`CompletionQueue::wait`] waits.
    pub wait_timeout: Duration,
    /// Empty polls [`CompletionQueue::wait`] makes before it sleeps on the
    /// completion channel (if the backend has one); `usize::MAX` never
    /// sleeps.
    pub spin_polls: usize,
    /// Completions moved from the device per poll call.
    pub poll_batch: usize,
}

impl Default for RingConfig {
    fn default() -> Self {
        RingConfig {
            signal_interval: 0,
            drain_timeout: Duration::from_secs(5),
            wait_timeout: Duration::from_secs(30),
            spin_polls: 10_000,
            poll_batch: 32,
        }
    }
}

/// Counters of what a ring did.
///
/// ```
/// use rdma_ring::ring::RingStats;
/// assert_eq!(RingStats::default().doorbells, 0);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RingStats {
    /// Post calls made (one per non-empty queue per submit).
    pub doorbells: u64,
    /// Send work requests posted.
    pub send_wrs: u64,
    /// Send work requests posted with a CQE requested.
    pub signaled: u64,
    /// Receive work requests posted.
    pub recv_wrs: u64,
    /// CQEs reaped from the device.
    pub cqes: u64,
    /// Operations completed implicitly by a later signaled CQE.
    pub implicit: u64,
    /// CQEs that named an unknown `wr_id`.
    pub unknown_cqes: u64,
}

/// An operation the ring holds, from push to completion.
struct InFlight {
    kind: OpKind,
    user_data: u64,
    buf: OwnedBuf,
    /// Posted and not yet completed: a CQE may name it.
    posted: bool,
    owner: Owner,
}

/// An io_uring-style ring over one queue pair. See the [module
/// docs](self) for the invariants it keeps.
pub struct Ring<Q: QueuePair> {
    qp: Q,
    caps: QpCaps,
    config: RingConfig,
    marker_reserved: bool,
    send_limit: usize,
    recv_limit: usize,
    cqe_limit: usize,
    signal_interval: usize,
    slab: Slab<InFlight>,
    pending_send: Vec<SendWr>,
    pending_recv: Vec<RecvWr>,
    /// Posted send work requests in posting order, for implicit completion.
    send_order: VecDeque<Key>,
    outstanding_send: usize,
    outstanding_recv: usize,
    since_signal: usize,
    force_signal: bool,
    ready: VecDeque<Completion>,
    /// Woken when a completion is queued in `ready` (the async stream).
    ready_waker: Option<std::task::Waker>,
    /// The completion channel, once asked for (`None` inside: the backend
    /// has none).
    events: Option<Option<std::sync::Arc<dyn crate::backend::CompletionEvents>>>,
    /// Wakers to wake once the caller has released the ring.
    wakes: Vec<std::task::Waker>,
    /// Queue-owned operations pushed and not yet in `ready`.
    queued_in_flight: usize,
    scratch: Vec<RawCompletion>,
    error: Option<WcStatus>,
    drain_posted: bool,
    closed: bool,
    stats: RingStats,
}

impl<Q: QueuePair> Ring<Q> {
    /// A ring over `qp`. All memory the ring needs is allocated here, sized
    /// by the queue pair's depths.
    pub fn new(qp: Q, config: RingConfig) -> Self {
        let caps = qp.caps();
        // One send slot and one CQE are kept for the teardown marker, if the
        // queues are deep enough to spare them.
        let marker_reserved = caps.max_send_wr >= 2 && caps.cq_entries >= 2;
        let reserve = usize::from(marker_reserved);
        let send_limit = (caps.max_send_wr as usize - reserve).max(1);
        let recv_limit = caps.max_recv_wr as usize;
        let cqe_limit = (caps.cq_entries as usize - reserve).max(1);
        let signal_interval = match config.signal_interval {
            0 => (send_limit / 2).max(1),
            n => n.min(send_limit),
        };
        // Room for every operation the queues allow, and as many again for
        // operations that finished but whose futures have not collected them.
        let capacity = 2 * (send_limit + recv_limit);
        Ring {
            qp,
            caps,
            config,
            marker_reserved,
            send_limit,
            recv_limit,
            cqe_limit,
            signal_interval,
            slab: Slab::with_capacity(capacity),
            pending_send: Vec::with_capacity(send_limit),
            pending_recv: Vec::with_capacity(recv_limit),
            send_order: VecDeque::with_capacity(send_limit),
            outstanding_send: 0,
            outstanding_recv: 0,
            since_signal: 0,
            force_signal: false,
            ready: VecDeque::with_capacity(capacity),
            ready_waker: None,
            wakes: Vec::with_capacity(capacity + 1),
            events: None,
            queued_in_flight: 0,
            scratch: vec![RawCompletion::default(); config.poll_batch.max(1)],
            error: None,
            drain_posted: false,
            closed: false,
            stats: RingStats::default(),
        }
    }

    /// The submission side: push operations, then submit them.
    pub fn submission(&mut self) -> SubmissionQueue<'_, Q> {
        SubmissionQueue { ring: self }
    }

    /// The completion side: reap completions.
    pub fn completion(&mut self) -> CompletionQueue<'_, Q> {
        CompletionQueue { ring: self }
    }

    /// The queue pair.
    pub fn qp(&self) -> &Q {
        &self.qp
    }

    /// The queue pair's limits.
    pub fn caps(&self) -> QpCaps {
        self.caps
    }

    /// What the ring has done so far.
    pub fn stats(&self) -> RingStats {
        self.stats
    }

    /// Operations pushed or in flight whose completion has not been reaped
    /// from the device yet.
    pub fn in_flight(&self) -> usize {
        self.slab.len()
    }

    /// Send work requests that may be pushed now.
    pub fn send_room(&self) -> usize {
        let used = self.outstanding_send + self.pending_send.len();
        let cqes = used + self.outstanding_recv + self.pending_recv.len();
        (self.send_limit - used.min(self.send_limit)).min(self.cqe_limit - cqes.min(self.cqe_limit))
    }

    /// Receives that may be pushed now.
    pub fn recv_room(&self) -> usize {
        let used = self.outstanding_recv + self.pending_recv.len();
        let cqes = used + self.outstanding_send + self.pending_send.len();
        (self.recv_limit - used.min(self.recv_limit)).min(self.cqe_limit - cqes.min(self.cqe_limit))
    }

    /// The status of the error completion that put the queue pair in error,
    /// if one did.
    pub fn error_status(&self) -> Option<WcStatus> {
        self.error
    }

    fn record_error(&mut self, status: WcStatus) {
        if self.error.is_none() {
            self.error = Some(status);
        }
    }
}

impl<Q: QueuePair> std::fmt::Debug for Ring<Q> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ring")
            .field("caps", &self.caps)
            .field("in_flight", &self.slab.len())
            .field("pending_send", &self.pending_send.len())
            .field("pending_recv", &self.pending_recv.len())
            .field("error", &self.error)
            .field("stats", &self.stats)
            .finish()
    }
}

/// What a push returns: nothing, or the refused operation with the reason.
type PushResult<T> = Result<(), Rejected<T>>;

/// Credits: why an operation of this kind cannot be pushed now, if it cannot.
fn credit_error<Q: QueuePair>(ring: &Ring<Q>, recv: bool) -> Option<Error> {
    let sends = ring.outstanding_send + ring.pending_send.len();
    let recvs = ring.outstanding_recv + ring.pending_recv.len();
    if recv && recvs >= ring.recv_limit {
        return Some(Error::RecvQueueFull {
            outstanding: recvs,
            depth: ring.recv_limit,
        });
    }
    if !recv && sends >= ring.send_limit {
        return Some(Error::SendQueueFull {
            outstanding: sends,
            depth: ring.send_limit,
        });
    }
    if sends + recvs >= ring.cqe_limit {
        return Some(Error::CompletionQueueFull {
            possible: sends + recvs,
            entries: ring.cqe_limit,
        });
    }
    None
}
// Operations move through the slab, the ready queue and the caller's hands
// several times each: keep them small (one cache line and a half at most).
static_assertions::const_assert!(std::mem::size_of::<InFlight>() <= 96);
static_assertions::const_assert!(std::mem::size_of::<Completion>() <= 72);
