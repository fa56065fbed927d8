//! The ring: pure logic, no FFI, no knowledge of the backend it drives.
//!
//! A [`Ring`] owns one completion queue and any number of queue pairs
//! attached to it (io_uring's one ring, many files), and optionally shared
//! receive queues. It keeps every pushed operation in a slab until its
//! completion is reaped. Its parts:
//!
//! * [`SubmissionQueue`] ([`Ring::submission`] for the default queue pair,
//!   [`Ring::submission_on`] for any): push typed operations, then
//!   [`submit`](SubmissionQueue::submit) posts everything pushed since the
//!   last submit, on every queue, with one post per queue that has work —
//!   one doorbell each. [`SrqSubmission`] ([`Ring::srq_submission`]) pushes
//!   receives to a shared receive queue.
//! * [`CompletionQueue`] ([`Ring::completion`]): reap typed
//!   [`Completion`]s, each handing back its operation's buffers, status,
//!   byte count, immediate data, `user_data`, and the queue pair it ran on.
//! * [`Ring::attach`] / [`Ring::detach`]: queue pairs join and leave at any
//!   time; [`Ring::add_srq`]: shared receive queues.
//! * [`Ring::watch_events`]: the device's asynchronous events.
//!
//! # Invariants the ring keeps
//!
//! * **Ownership**: an operation's buffers live in the slab from push until
//!   its completion is reaped and come back only there. A refused push
//!   returns the operation in [`Rejected`].
//! * **Identity**: `wr_id` is slot index plus generation, and a completion
//!   must also come from the queue pair the operation was posted on (its QP
//!   number): a completion of queue pair A can never release an operation
//!   of queue pair B; a completion naming anything else — a stale or
//!   foreign `wr_id`, a detached queue pair — is reported
//!   ([`Error::UnknownWrId`]) and ignored.
//! * **Selective signaling**, per queue pair: a send work request asks for
//!   a CQE only when the operation asks
//!   ([`Write::signaled`](crate::op::Write::signaled)), every
//!   [`RingConfig::signal_interval`] work requests, and always on the last
//!   one of a submit; an unsignaled operation is released when a later
//!   signaled CQE of the same queue pair arrives (RC completes each send
//!   queue in order), never by another queue pair's.
//! * **Credits**: per queue pair, pushed plus outstanding work never
//!   exceeds its send queue or receive queue; per shared receive queue,
//!   its depth; for the shared completion queue, the work of all its queue
//!   pairs never exceeds what it can hold, even if every work request is
//!   flushed with its own CQE. One send slot per queue pair and one CQE
//!   per queue pair are kept for the teardown marker, where there is room
//!   for them at attach (a send queue of two or more, two CQEs or more to
//!   spare); without one, every send of that queue pair asks for a CQE,
//!   so a drain still sees each come back.
//! * **Errors**, per queue pair: after an error completion (or a fatal
//!   async event) the queue pair is in error; the ring refuses new work for
//!   it ([`Error::QpInError`]) and every outstanding operation of it comes
//!   back, flushed. The other queue pairs keep running.
//! * **Teardown**: [`Ring::detach`] moves one queue pair with work in
//!   flight to error, drains its flushed completions from the shared
//!   completion queue (handling the others' as usual), and only then
//!   releases its buffers; dropping the ring (or [`Ring::close`]) does so
//!   for all of them, then destroys the shared receive queues and only then
//!   releases their receives. If the device cannot drain within
//!   [`RingConfig::drain_timeout`], the buffers are leaked, never freed
//!   under the NIC; once the completion queue itself failed (an overrun,
//!   a CQ error event), nothing more can come back, and they are leaked
//!   at once.
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
//!
//! Many queue pairs on one completion queue:
//!
//! ```
//! use rdma_ring::backend::soft::SoftDevice;
//! use rdma_ring::backend::QpConfig;
//! use rdma_ring::buf::RegisteredBuf;
//! use rdma_ring::op::{Recv, Send};
//! use rdma_ring::ring::{Ring, RingConfig};
//!
//! let dev = SoftDevice::new();
//! let pd = dev.alloc_pd();
//! let mut server = Ring::with_cq(dev.create_cq(1024).unwrap(), RingConfig::default());
//! let mut clients = Vec::new();
//! for i in 0..4u64 {
//!     let qp = dev.create_qp_on(&pd, server.cq(), None, QpConfig::default()).unwrap();
//!     let client = dev.create_qp(&pd, QpConfig::default()).unwrap();
//!     dev.connect(&qp, &client).unwrap();
//!     let handle = server.attach(qp).unwrap();
//!     let buf = RegisteredBuf::new(&pd, vec![0u8; 16]).unwrap();
//!     server.submission_on(handle).push(Recv::new(buf).user_data(i)).unwrap();
//!     clients.push((handle, Ring::new(client, RingConfig::default())));
//! }
//! server.submit().unwrap(); // one doorbell per queue pair with work
//! for (i, (_, client)) in clients.iter_mut().enumerate() {
//!     let msg = RegisteredBuf::new(&pd, vec![i as u8; 16]).unwrap();
//!     client.submission().push(Send::new(msg)).unwrap();
//!     client.submission().submit().unwrap();
//! }
//! let done = server.completion().wait(4).unwrap();
//! for c in &done {
//!     let (handle, _) = &clients[c.user_data() as usize];
//!     assert_eq!(c.qp(), Some(*handle)); // the completion names its queue pair
//!     assert_eq!(c.buf()[0], c.user_data() as u8);
//! }
//! ```

mod completion;
mod events;
mod handle;
mod lifecycle;
mod qp;
mod slab;
mod srq;
mod submission;
mod teardown;

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

pub use completion::{Completion, CompletionQueue};
pub use handle::{QpHandle, SrqHandle};
pub use qp::{Detached, QpStats};
pub use srq::{SrqRefill, SrqSubmission};
pub use submission::{SubmissionQueue, SubmitError, Unposted};

use crate::backend::{
    AsyncEventSource, CompletionEvents, CompletionQueue as DeviceCq, CqId, QueuePair, RawCompletion,
};
use crate::buf::OwnedBufs;
use crate::error::{Error, Rejected};
use crate::op::OpKind;
use lifecycle::Owner;
pub(crate) use slab::Key;
use slab::Slab;
use srq::SrqSlot;

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
    /// Ask for a CQE at least every this many send work requests of a queue
    /// pair (besides the last of each submit). 0 means half its send queue.
    pub signal_interval: usize,
    /// How long teardown (of the ring or one queue pair) waits for flushed
    /// completions before leaking (not at all once the completion queue
    /// failed).
    pub drain_timeout: Duration,
    /// How long [`CompletionQueue::wait`] waits.
    pub wait_timeout: Duration,
    /// Empty polls [`CompletionQueue::wait`] makes before it sleeps on the
    /// completion channel (if the backend has one); `usize::MAX` never
    /// sleeps.
    pub spin_polls: usize,
    /// Completions moved from the device per poll call.
    pub poll_batch: usize,
    /// How long [`Ring::detach`] waits, after draining a queue pair on a
    /// shared receive queue, for the device's
    /// [`AsyncEvent::LastWqeReached`](crate::backend::AsyncEvent::LastWqeReached) (when the ring watches events), so
    /// that a receive it had taken is not lost with it. Devices that never
    /// raise it (Soft-RoCE before Linux 6.5) cost this much per detach.
    pub last_wqe_timeout: Duration,
}

impl Default for RingConfig {
    fn default() -> Self {
        RingConfig {
            signal_interval: 0,
            drain_timeout: Duration::from_secs(5),
            wait_timeout: Duration::from_secs(30),
            spin_polls: 10_000,
            poll_batch: 32,
            last_wqe_timeout: Duration::from_millis(100),
        }
    }
}

/// Counters of what a ring did, over all its queues.
///
/// ```
/// use rdma_ring::ring::RingStats;
/// assert_eq!(RingStats::default().doorbells, 0);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RingStats {
    /// Post calls made (one per queue with work per submit).
    pub doorbells: u64,
    /// Send work requests posted.
    pub send_wrs: u64,
    /// Send work requests posted with a CQE requested.
    pub signaled: u64,
    /// Receive work requests posted (own receive queues and shared ones).
    pub recv_wrs: u64,
    /// CQEs reaped from the device.
    pub cqes: u64,
    /// Operations completed implicitly by a later signaled CQE.
    pub implicit: u64,
    /// CQEs that named an unknown `wr_id`, or a queue pair other than the
    /// one their operation was posted on.
    pub unknown_cqes: u64,
    /// Asynchronous events applied.
    pub events: u64,
    /// Queue pairs attached so far.
    pub attached: u64,
    /// Queue pairs detached so far.
    pub detached: u64,
    /// Times a waiting thread slept on the completion channel (once its
    /// polls found nothing), each until an event or a short tick.
    pub channel_sleeps: u64,
}

/// Which queue an operation was pushed to: the key (index and generation)
/// of its queue pair's or shared receive queue's slot, so that an
/// operation left behind by a queue pair that could not be drained never
/// names the queue pair attached in its place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum QueueRef {
    Qp(Key),
    Srq(Key),
}

/// An operation the ring holds, from push to completion.
struct InFlight {
    kind: OpKind,
    queue: QueueRef,
    user_data: u64,
    /// The buffers' total length, reported as moved when a send-side
    /// operation succeeds.
    len: u32,
    bufs: OwnedBufs,
    /// Posted and not yet completed: a CQE may name it.
    posted: bool,
    owner: Owner,
}

/// An io_uring-style ring over one completion queue and the queue pairs
/// attached to it. See the [module docs](self) for the invariants it keeps.
///
/// ```
/// # use rdma_ring::backend::{soft::SoftDevice, QpConfig};
/// use rdma_ring::buf::RegisteredBuf;
/// use rdma_ring::op::{Recv, Send};
/// use rdma_ring::ring::{Ring, RingConfig};
/// # let dev = SoftDevice::new();
/// # let pd = dev.alloc_pd();
/// let (qa, qb) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
/// let mut a = Ring::new(qa, RingConfig::default());
/// let mut b = Ring::new(qb, RingConfig::default());
/// b.submission().push(Recv::new(RegisteredBuf::new(&pd, vec![0u8; 16]).unwrap())).unwrap();
/// b.submit().unwrap();
/// a.submission().push(Send::new(RegisteredBuf::new(&pd, b"ping".to_vec()).unwrap())).unwrap();
/// a.submit().unwrap();
/// let got = b.completion().wait(1).unwrap();
/// assert_eq!(got[0].byte_len(), 4);
/// assert_eq!(&got[0].buf()[..4], b"ping");
/// ```
pub struct Ring<Q: QueuePair> {
    id: u32,
    cq: Q::Cq,
    cq_id: CqId,
    cq_entries: usize,
    config: RingConfig,
    qps: Slab<qp::QpSlot<Q>>,
    srqs: Slab<SrqSlot<Q::Srq>>,
    /// Attached queue pairs by QP number, for completions from shared
    /// receive queues and for events.
    by_qpn: HashMap<u32, Key>,
    default_qp: Option<QpHandle>,
    /// Queues with pushed, unsubmitted work.
    dirty: Vec<QueueRef>,
    /// CQEs that pushed and posted work may still produce (markers aside).
    cqe_used: usize,
    /// CQEs kept for teardown markers (one per queue pair that has one).
    cqe_reserved: usize,
    /// Posted work requests and markers whose completion is still awaited.
    expecting: usize,
    slab: Slab<InFlight>,
    ready: VecDeque<Completion>,
    /// The caller's vector while [`CompletionQueue::reap`] runs: queue-owned
    /// completions go straight into it rather than through `ready`.
    reaping_into: Option<Vec<Completion>>,
    /// Woken when a completion is queued in `ready` (the async streams).
    ready_wakers: Vec<std::task::Waker>,
    /// The completion channel, once asked for (`None` inside: the backend
    /// has none).
    cq_events: Option<Option<Arc<dyn CompletionEvents>>>,
    events: events::EventState,
    /// Wakers to wake once the caller has released the ring.
    wakes: Vec<std::task::Waker>,
    /// The buffers of operations whose futures were dropped, dropped once
    /// the caller has released the ring: a buffer's drop may run anything,
    /// a panic or this ring included, and the ring's bookkeeping (the rest
    /// of a poll's CQEs, say) must not stop half-way for it.
    let_go: Vec<OwnedBufs>,
    /// Queue-owned operations pushed and not yet in `ready`.
    queued_in_flight: usize,
    scratch: Vec<RawCompletion>,
    /// Why the ring as a whole takes no more work (its completion queue or
    /// device failed).
    failed: Option<&'static str>,
    /// Whether the completion queue itself failed: nothing more comes
    /// back from it, so a drain gives up at once (its buffers are leaked)
    /// rather than waiting out `drain_timeout`.
    cq_lost: bool,
    /// A sync marker could not be posted: tried again while the ring
    /// waits.
    sync_owed: bool,
    closed: bool,
    /// Empty polls since the last look at events and peers.
    idle_polls: u32,
    stats: RingStats,
}

impl<Q: QueuePair> Ring<Q> {
    /// A ring over `qp` and the completion queue it was created with for
    /// itself alone (`create_qp`), which becomes the ring's; `qp` is its
    /// first (and default) queue pair. All memory the ring needs for it is
    /// allocated here, sized by its queue depths.
    ///
    /// # Panics
    ///
    /// If `qp` has no completion queue of its own (it was created on a
    /// shared one): make the ring with [`Ring::with_cq`] and
    /// [`attach`](Self::attach) it. [`Ring::try_new`] returns the queue pair
    /// instead.
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::SoftDevice, QpConfig};
    /// # use rdma_ring::ring::{Ring, RingConfig};
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// let (qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    /// let qpn = qp.qpn();
    /// let ring = Ring::new(qp, RingConfig::default());
    /// assert_eq!(ring.qps().len(), 1);
    /// assert_eq!(ring.qp().qpn(), qpn);
    /// ```
    pub fn new(qp: Q, config: RingConfig) -> Self {
        match Self::try_new(qp, config) {
            Ok(ring) => ring,
            Err(r) => panic!("Ring::new: {}", r.error()),
        }
    }

    /// Like [`Ring::new`], handing the queue pair back if it has no
    /// completion queue of its own.
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::SoftDevice, QpConfig};
    /// # use rdma_ring::ring::{Ring, RingConfig};
    /// use rdma_ring::Error;
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// let cq = dev.create_cq(256).unwrap();
    /// // Made on a shared completion queue, it has none of its own to give.
    /// let qp = dev.create_qp_on(&pd, &cq, None, QpConfig::default()).unwrap();
    /// let refused = Ring::try_new(qp, RingConfig::default()).unwrap_err();
    /// assert!(matches!(refused.error(), Error::Incompatible(_)));
    /// let mut ring = Ring::with_cq(cq, RingConfig::default());
    /// assert!(ring.attach(refused.into_value()).is_ok());
    /// ```
    pub fn try_new(mut qp: Q, config: RingConfig) -> Result<Self, Rejected<Q>> {
        // What `attach` would refuse is refused before the queue pair's
        // completion queue is taken, which could not be given back.
        if let Some(why) = qp::depth_refusal(&qp.caps()) {
            return Err(Rejected::new(why, qp));
        }
        let Some(cq) = qp.take_cq() else {
            return Err(Rejected::new(
                Error::Incompatible(
                    "it has no completion queue of its own; use Ring::with_cq and attach",
                ),
                qp,
            ));
        };
        let mut ring = Ring::with_cq(cq, config);
        ring.attach(qp)?;
        Ok(ring)
    }

    /// A ring over `cq`, with no queue pair yet: create queue pairs on
    /// [`cq`](Self::cq) and [`attach`](Self::attach) them.
    ///
    /// ```
    /// # use rdma_ring::backend::soft::{SoftDevice, SoftQp};
    /// # use rdma_ring::backend::QpConfig;
    /// # use rdma_ring::ring::{Ring, RingConfig};
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// let mut ring: Ring<SoftQp> = Ring::with_cq(dev.create_cq(1024).unwrap(), RingConfig::default());
    /// assert_eq!(ring.default_qp(), None);
    /// let qp = dev.create_qp_on(&pd, ring.cq(), None, QpConfig::default()).unwrap();
    /// let first = ring.attach(qp).unwrap();
    /// // The first queue pair attached becomes the default one.
    /// assert_eq!(ring.default_qp(), Some(first));
    /// ```
    pub fn with_cq(cq: Q::Cq, config: RingConfig) -> Self {
        let cq_entries = cq.entries() as usize;
        let batch = config.poll_batch.max(1);
        Ring {
            id: handle::fresh_ring_id(),
            cq_id: cq.id(),
            cq,
            cq_entries,
            config,
            qps: Slab::with_capacity(0),
            srqs: Slab::with_capacity(0),
            by_qpn: HashMap::new(),
            default_qp: None,
            dirty: Vec::new(),
            cqe_used: 0,
            cqe_reserved: 0,
            expecting: 0,
            slab: Slab::with_capacity(0),
            ready: VecDeque::new(),
            reaping_into: None,
            ready_wakers: Vec::new(),
            cq_events: None,
            events: events::EventState::default(),
            wakes: Vec::new(),
            let_go: Vec::new(),
            queued_in_flight: 0,
            scratch: vec![RawCompletion::default(); batch],
            failed: None,
            cq_lost: false,
            sync_owed: false,
            closed: false,
            idle_polls: 0,
            stats: RingStats::default(),
        }
    }

    /// The submission side for the default queue pair (the one
    /// [`Ring::new`] took, or the first attached).
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::SoftDevice, QpConfig};
    /// # use rdma_ring::ring::{Ring, RingConfig};
    /// # use rdma_ring::buf::RegisteredBuf;
    /// # use rdma_ring::op::Recv;
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// # let (qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    /// let mut ring = Ring::new(qp, RingConfig::default());
    /// let buf = RegisteredBuf::new(&pd, vec![0u8; 64]).unwrap();
    /// ring.submission().push(Recv::new(buf)).unwrap();
    /// // Pushed work waits for the submit.
    /// assert_eq!(ring.submission().len(), 1);
    /// assert_eq!(ring.stats().recv_wrs, 0);
    /// ring.submission().submit().unwrap();
    /// assert_eq!(ring.stats().recv_wrs, 1);
    /// ```
    pub fn submission(&mut self) -> SubmissionQueue<'_, Q> {
        let qp = self.default_qp().map(|h| h.key);
        SubmissionQueue {
            ring: self,
            qp,
            named: false,
        }
    }

    /// The submission side for queue pair `qp`. A handle this ring does not
    /// hold (detached, or another ring's) makes every push fail with
    /// [`Error::NotAttached`], handing the operation back.
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::SoftDevice, QpConfig};
    /// # use rdma_ring::ring::{Ring, RingConfig};
    /// # use rdma_ring::buf::RegisteredBuf;
    /// # use rdma_ring::op::Recv;
    /// use rdma_ring::Error;
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// let (qa, qb) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    /// let mut a = Ring::new(qa, RingConfig::default());
    /// let mut b = Ring::new(qb, RingConfig::default());
    /// let handle = a.default_qp().unwrap();
    /// let buf = RegisteredBuf::new(&pd, vec![0u8; 64]).unwrap();
    /// // `b` does not hold `a`'s queue pair, so the receive comes back.
    /// let refused = b.submission_on(handle).push(Recv::new(buf)).unwrap_err();
    /// assert!(matches!(refused.error(), Error::NotAttached(_)));
    /// a.submission_on(handle).push(refused.into_value()).unwrap();
    /// ```
    pub fn submission_on(&mut self, qp: QpHandle) -> SubmissionQueue<'_, Q> {
        let qp = self.qp_key(qp);
        SubmissionQueue {
            ring: self,
            qp,
            named: true,
        }
    }

    /// Posts everything pushed since the last submit, on every queue: one
    /// doorbell per queue with work. See [`SubmissionQueue::submit`].
    ///
    /// ```
    /// # use rdma_ring::backend::soft::{SoftDevice, SoftQp};
    /// # use rdma_ring::backend::QpConfig;
    /// # use rdma_ring::ring::{Ring, RingConfig};
    /// # use rdma_ring::buf::RegisteredBuf;
    /// # use rdma_ring::op::Recv;
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// let mut ring: Ring<SoftQp> = Ring::with_cq(dev.create_cq(1024).unwrap(), RingConfig::default());
    /// for _ in 0..2 {
    ///     let qp = dev.create_qp_on(&pd, ring.cq(), None, QpConfig::default()).unwrap();
    ///     let handle = ring.attach(qp).unwrap();
    ///     for _ in 0..3 {
    ///         let buf = RegisteredBuf::new(&pd, vec![0u8; 64]).unwrap();
    ///         ring.submission_on(handle).push(Recv::new(buf)).unwrap();
    ///     }
    /// }
    /// // Six receives on two queue pairs: one doorbell each.
    /// assert_eq!(ring.submit().unwrap(), 6);
    /// assert_eq!(ring.stats().doorbells, 2);
    /// ```
    pub fn submit(&mut self) -> Result<usize, SubmitError> {
        self.submit_all()
    }

    /// The completion side: reap completions of every queue.
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::SoftDevice, QpConfig};
    /// # use rdma_ring::ring::{Ring, RingConfig};
    /// # use rdma_ring::buf::{ExposedBuf, RegisteredBuf, RemoteAccess};
    /// # use rdma_ring::op::Write;
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// # let (qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    /// # let target = ExposedBuf::new(&pd, vec![0u8; 64], RemoteAccess::WRITE).unwrap();
    /// let mut ring = Ring::new(qp, RingConfig::default());
    /// let buf = RegisteredBuf::new(&pd, vec![1u8; 32]).unwrap();
    /// ring.submission().push(Write::new(buf, target.remote()).user_data(5)).unwrap();
    /// ring.submit().unwrap();
    /// let done = ring.completion().wait(1).unwrap();
    /// assert_eq!(done[0].user_data(), 5);
    /// assert_eq!(done[0].result().unwrap(), 32);
    /// // Nothing else is in flight.
    /// assert!(ring.completion().poll().unwrap().is_none());
    /// ```
    pub fn completion(&mut self) -> CompletionQueue<'_, Q> {
        CompletionQueue { ring: self }
    }

    /// The ring's completion queue (create queue pairs on it).
    ///
    /// ```
    /// # use rdma_ring::backend::soft::{SoftDevice, SoftQp};
    /// # use rdma_ring::backend::QpConfig;
    /// # use rdma_ring::ring::{Ring, RingConfig};
    /// use rdma_ring::backend::CompletionQueue;
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// let mut ring: Ring<SoftQp> = Ring::with_cq(dev.create_cq(512).unwrap(), RingConfig::default());
    /// assert_eq!(ring.cq().entries(), 512);
    /// // Queue pairs made on the ring's completion queue can join it.
    /// let qp = dev.create_qp_on(&pd, ring.cq(), None, QpConfig::default()).unwrap();
    /// assert!(ring.attach(qp).is_ok());
    /// ```
    pub fn cq(&self) -> &Q::Cq {
        &self.cq
    }

    /// The default queue pair.
    ///
    /// # Panics
    ///
    /// If there is none (it was detached, or nothing was attached to a
    /// ring made with [`Ring::with_cq`]); [`Ring::qp_of`] never panics.
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::SoftDevice, QpConfig};
    /// # use rdma_ring::ring::{Ring, RingConfig};
    /// use rdma_ring::backend::soft::QpState;
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// let (qp, peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    /// let ring = Ring::new(qp, RingConfig::default());
    /// assert_ne!(ring.qp().qpn(), peer.qpn());
    /// assert_eq!(ring.qp().control().state(), Some(QpState::ReadyToSend));
    /// ```
    pub fn qp(&self) -> &Q {
        self.default_qp
            .and_then(|h| self.qp_of(h))
            .expect("the ring has no default queue pair (detached, or never attached)")
    }

    /// The default queue pair's handle, if it is still attached.
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::SoftDevice, QpConfig};
    /// # use rdma_ring::ring::{Ring, RingConfig};
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// # let (qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    /// let mut ring = Ring::new(qp, RingConfig::default());
    /// let handle = ring.default_qp().unwrap();
    /// ring.detach(handle).unwrap();
    /// assert_eq!(ring.default_qp(), None);
    /// ```
    pub fn default_qp(&self) -> Option<QpHandle> {
        self.default_qp.filter(|h| self.qp_key(*h).is_some())
    }

    /// An attached queue pair.
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::SoftDevice, QpConfig};
    /// # use rdma_ring::ring::{Ring, RingConfig};
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// # let (qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    /// let qpn = qp.qpn();
    /// let mut ring = Ring::new(qp, RingConfig::default());
    /// let handle = ring.default_qp().unwrap();
    /// assert_eq!(ring.qp_of(handle).unwrap().qpn(), qpn);
    /// let detached = ring.detach(handle).unwrap();
    /// // The handle named that attachment only.
    /// assert!(ring.qp_of(handle).is_none());
    /// assert_eq!(detached.qp.qpn(), qpn);
    /// ```
    pub fn qp_of(&self, qp: QpHandle) -> Option<&Q> {
        self.qp_key(qp)
            .and_then(|k| self.qps.get(k))
            .map(|slot| &slot.qp)
    }

    /// The handles of every attached queue pair.
    ///
    /// ```
    /// # use rdma_ring::backend::soft::{SoftDevice, SoftQp};
    /// # use rdma_ring::backend::QpConfig;
    /// # use rdma_ring::ring::{Ring, RingConfig};
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// let mut ring: Ring<SoftQp> = Ring::with_cq(dev.create_cq(1024).unwrap(), RingConfig::default());
    /// let mut handles = Vec::new();
    /// for _ in 0..3 {
    ///     let qp = dev.create_qp_on(&pd, ring.cq(), None, QpConfig::default()).unwrap();
    ///     handles.push(ring.attach(qp).unwrap());
    /// }
    /// ring.detach(handles[1]).unwrap();
    /// assert_eq!(ring.qps(), vec![handles[0], handles[2]]);
    /// ```
    pub fn qps(&self) -> Vec<QpHandle> {
        self.qps
            .keys()
            .into_iter()
            .map(|key| QpHandle { ring: self.id, key })
            .collect()
    }

    /// The handle of the attached queue pair with QP number `qp_num`.
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::SoftDevice, QpConfig};
    /// # use rdma_ring::ring::{Ring, RingConfig};
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// let (qp, peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    /// let ring = Ring::new(qp, RingConfig::default());
    /// // Completions and events name a queue pair by its number.
    /// assert_eq!(ring.qp_by_num(ring.qp().qpn()), ring.default_qp());
    /// assert_eq!(ring.qp_by_num(peer.qpn()), None);
    /// ```
    pub fn qp_by_num(&self, qp_num: u32) -> Option<QpHandle> {
        let key = *self.by_qpn.get(&qp_num)?;
        self.qp_handle(key)
    }

    /// The default queue pair's limits.
    ///
    /// # Panics
    ///
    /// As [`Ring::qp`].
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::SoftDevice, QpConfig};
    /// # use rdma_ring::ring::{Ring, RingConfig};
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// let config = QpConfig { max_send_wr: 64, max_inline_data: 128, ..QpConfig::default() };
    /// let (qp, _peer) = dev.connected_pair(&pd, &pd, config).unwrap();
    /// let ring = Ring::new(qp, RingConfig::default());
    /// assert_eq!(ring.caps().max_send_wr, 64);
    /// assert_eq!(ring.caps().max_inline_data, 128);
    /// ```
    pub fn caps(&self) -> crate::backend::QpCaps {
        self.qp().caps()
    }

    /// What the ring has done so far, over all its queues.
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::SoftDevice, QpConfig};
    /// # use rdma_ring::ring::{Ring, RingConfig};
    /// # use rdma_ring::buf::{ExposedBuf, RegisteredBuf, RemoteAccess};
    /// # use rdma_ring::op::Write;
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// # let (qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    /// # let target = ExposedBuf::new(&pd, vec![0u8; 64], RemoteAccess::WRITE).unwrap();
    /// let mut ring = Ring::new(qp, RingConfig::default());
    /// for i in 0..4 {
    ///     let buf = RegisteredBuf::new(&pd, vec![0u8; 64]).unwrap();
    ///     ring.submission().push(Write::new(buf, target.remote()).user_data(i)).unwrap();
    /// }
    /// ring.submit().unwrap();
    /// ring.completion().wait(4).unwrap();
    /// let s = ring.stats();
    /// // One doorbell; only the last write asked for a CQE, and it completed
    /// // the three before it.
    /// assert_eq!((s.doorbells, s.send_wrs, s.signaled, s.implicit), (1, 4, 1, 3));
    /// ```
    pub fn stats(&self) -> RingStats {
        self.stats
    }

    /// Operations pushed or in flight whose completion has not been reaped
    /// from the device yet, on every queue.
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::SoftDevice, QpConfig};
    /// # use rdma_ring::ring::{Ring, RingConfig};
    /// # use rdma_ring::buf::{ExposedBuf, RegisteredBuf, RemoteAccess};
    /// # use rdma_ring::op::Write;
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// # let (qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    /// # let target = ExposedBuf::new(&pd, vec![0u8; 64], RemoteAccess::WRITE).unwrap();
    /// let mut ring = Ring::new(qp, RingConfig::default());
    /// let buf = RegisteredBuf::new(&pd, vec![0u8; 64]).unwrap();
    /// ring.submission().push(Write::new(buf, target.remote())).unwrap();
    /// assert_eq!(ring.in_flight(), 1); // pushed counts, posted or not
    /// ring.submit().unwrap();
    /// ring.completion().wait(1).unwrap();
    /// assert_eq!(ring.in_flight(), 0);
    /// ```
    pub fn in_flight(&self) -> usize {
        self.slab.len()
    }

    /// Send work requests that may be pushed now on the default queue pair
    /// (0 without one).
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::SoftDevice, QpConfig};
    /// # use rdma_ring::ring::{Ring, RingConfig};
    /// # use rdma_ring::buf::{ExposedBuf, RegisteredBuf, RemoteAccess};
    /// # use rdma_ring::op::Write;
    /// use rdma_ring::Error;
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// # let target = ExposedBuf::new(&pd, vec![0u8; 64], RemoteAccess::WRITE).unwrap();
    /// let config = QpConfig { max_send_wr: 4, ..QpConfig::default() };
    /// let (qp, _peer) = dev.connected_pair(&pd, &pd, config).unwrap();
    /// let mut ring = Ring::new(qp, RingConfig::default());
    /// // One send slot stays free for the teardown marker.
    /// assert_eq!(ring.send_room(), 3);
    /// for _ in 0..3 {
    ///     let buf = RegisteredBuf::new(&pd, vec![0u8; 64]).unwrap();
    ///     ring.submission().push(Write::new(buf, target.remote())).unwrap();
    /// }
    /// assert_eq!(ring.send_room(), 0);
    /// let buf = RegisteredBuf::new(&pd, vec![0u8; 64]).unwrap();
    /// let refused = ring.submission().push(Write::new(buf, target.remote())).unwrap_err();
    /// assert!(matches!(refused.error(), Error::SendQueueFull { .. }));
    /// ```
    pub fn send_room(&self) -> usize {
        self.default_qp
            .and_then(|h| self.qp_key(h))
            .map_or(0, |k| self.send_room_at(k))
    }

    /// Receives that may be pushed now on the default queue pair (0 without
    /// one, or when it takes receives from a shared receive queue).
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::SoftDevice, QpConfig};
    /// # use rdma_ring::ring::{Ring, RingConfig};
    /// # use rdma_ring::buf::RegisteredBuf;
    /// # use rdma_ring::op::Recv;
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// let config = QpConfig { max_recv_wr: 8, ..QpConfig::default() };
    /// let (qp, _peer) = dev.connected_pair(&pd, &pd, config).unwrap();
    /// let mut ring = Ring::new(qp, RingConfig::default());
    /// assert_eq!(ring.recv_room(), 8);
    /// let buf = RegisteredBuf::new(&pd, vec![0u8; 64]).unwrap();
    /// ring.submission().push(Recv::new(buf)).unwrap();
    /// assert_eq!(ring.recv_room(), 7);
    /// ```
    pub fn recv_room(&self) -> usize {
        self.default_qp
            .and_then(|h| self.qp_key(h))
            .map_or(0, |k| self.recv_room_at(k))
    }

    /// The status of the error that put the default queue pair in error, if
    /// one did.
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::SoftDevice, QpConfig};
    /// # use rdma_ring::ring::{Ring, RingConfig};
    /// # use rdma_ring::buf::{ExposedBuf, RegisteredBuf, RemoteAccess};
    /// # use rdma_ring::op::Write;
    /// use rdma_ring::backend::WcStatus;
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// # let target = ExposedBuf::new(&pd, vec![0u8; 64], RemoteAccess::WRITE).unwrap();
    /// let (qp, peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    /// let mut ring = Ring::new(qp, RingConfig::default());
    /// assert_eq!(ring.error_status(), None);
    /// drop(peer); // nobody answers the requests any more
    /// let buf = RegisteredBuf::new(&pd, vec![0u8; 64]).unwrap();
    /// ring.submission().push(Write::new(buf, target.remote())).unwrap();
    /// ring.submit().unwrap();
    /// ring.completion().wait(1).unwrap();
    /// assert_eq!(ring.error_status(), Some(WcStatus::RetryExcErr));
    /// ```
    pub fn error_status(&self) -> Option<crate::backend::WcStatus> {
        self.default_qp
            .and_then(|h| self.qp_key(h))
            .and_then(|k| self.qps.get(k))
            .and_then(|slot| slot.error)
    }

    /// Why the ring as a whole takes no more work, if it does not: its
    /// completion queue overran or failed, or the device failed.
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::SoftDevice, QpConfig};
    /// # use rdma_ring::ring::{Ring, RingConfig};
    /// # use rdma_ring::buf::RegisteredBuf;
    /// # use rdma_ring::op::Recv;
    /// use rdma_ring::Error;
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// # let (qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    /// let mut ring = Ring::new(qp, RingConfig::default());
    /// ring.watch_events(dev.async_events().unwrap());
    /// assert_eq!(ring.failure(), None);
    /// dev.inject_device_fatal();
    /// ring.poll_events().unwrap();
    /// assert!(ring.failure().is_some());
    /// let buf = RegisteredBuf::new(&pd, vec![0u8; 64]).unwrap();
    /// let refused = ring.submission().push(Recv::new(buf)).unwrap_err();
    /// assert!(matches!(refused.error(), Error::RingFailed(_)));
    /// ```
    pub fn failure(&self) -> Option<&'static str> {
        self.failed
    }

    /// The slot key of `qp`, if this ring holds it.
    fn qp_key(&self, qp: QpHandle) -> Option<Key> {
        (qp.ring == self.id && self.qps.get(qp.key).is_some()).then_some(qp.key)
    }

    /// The handle of the queue pair in slot `key`, if it is still there.
    fn qp_handle(&self, key: Key) -> Option<QpHandle> {
        self.qps.get(key).map(|_| QpHandle { ring: self.id, key })
    }

    /// CQEs that may be added to the completion queue now.
    fn cqe_room(&self) -> usize {
        self.cq_entries
            .saturating_sub(self.cqe_reserved)
            .saturating_sub(self.cqe_used)
    }

    /// Marks a queue as having unsubmitted work.
    fn mark_dirty(&mut self, queue: QueueRef) {
        let flag = match queue {
            QueueRef::Qp(k) => &mut self.qps.get_mut(k).expect("pushed to a live queue").dirty,
            QueueRef::Srq(k) => &mut self.srqs.get_mut(k).expect("pushed to a live queue").dirty,
        };
        if !*flag {
            *flag = true;
            self.dirty.push(queue);
        }
    }
}

impl<Q: QueuePair> std::fmt::Debug for Ring<Q> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ring")
            .field("queue_pairs", &self.qps.len())
            .field("shared_receive_queues", &self.srqs.len())
            .field("cq_entries", &self.cq_entries)
            .field("in_flight", &self.slab.len())
            .field("failed", &self.failed)
            .field("stats", &self.stats)
            .finish()
    }
}

/// What a push returns: nothing, or the refused operation with the reason.
type PushResult<T> = Result<(), Rejected<T>>;

/// The event source type the ring keeps.
type EventSource = Box<dyn AsyncEventSource>;

// Operations move through the slab, the ready queue and the caller's hands
// several times each: keep them small.
static_assertions::const_assert!(std::mem::size_of::<InFlight>() <= 128);
static_assertions::const_assert!(std::mem::size_of::<Completion>() <= 104);
