//! An in-process software RC device: a test double for the NIC, so the
//! crate's users, examples and tests run with no RDMA hardware.
//!
//! It models what the ring relies on: registered memory with lkeys, rkeys
//! and access checks; connected queue pairs executing all eight operations
//! in RC order with their data effects, over scatter/gather lists;
//! completion queues shared by any number of queue pairs; receive queues,
//! shared receive queues with a low-water event, and RNR; immediate data;
//! 8-byte atomics with alignment checks; the QP state machine with error
//! flush (every flushed WR gets a CQE); completion queue depth and
//! overrun; asynchronous events ([`SoftDevice::async_events`]). It never
//! opens a socket.
//!
//! Queue depths are held as hardware holds them: a work request keeps its
//! slot in its send, receive or shared receive queue until its CQE is
//! polled (an unsignaled send, until a later send's CQE is), not merely
//! until it ran. A caller that counts its room from completions it has
//! reaped never sees "queue full"; one that counts from work that ran
//! does, here as on a NIC. A completion channel armed for solicited
//! events wakes only for a message that asked for one, or for an error.
//!
//! Execution follows the device's [`Progress`] mode: [`Progress::Auto`]
//! executes inside every post and poll (normal use); [`Progress::Manual`]
//! executes only in [`SoftDevice::progress`] and [`QpControl::step`], so
//! tests choose the interleaving; [`Progress::NoOp`] completes every work
//! request at once with no data effect, for measuring the software path.
//!
//! Faults are injectable: [`QpControl`] fails the n-th work request with a
//! chosen status, breaks the connection, or raises a fatal queue pair
//! error; the device takes a port down and up
//! ([`SoftDevice::set_port_active`]), fails as a whole
//! ([`SoftDevice::inject_device_fatal`]), or refuses deregistrations.
//!
//! Where it is kinder than a NIC, a test that passes here proves less:
//! its keys are never reused, so a revoked rkey always fails (a NIC may
//! give a later registration the same key, and a stale rkey then reaches
//! new memory); within one post, a receiver's completion is queued before
//! its sender's (a NIC orders no two completion queues); fences are
//! counted ([`QpCounters::fenced`]), not waited for; a request with no
//! path to its peer (the connection broken, the port down, the peer
//! gone or in error) fails with `RetryExcErr` at once, where a NIC
//! retries `retry_cnt` times, each after its ACK timeout, first (about
//! 2 s with the default [`QpConfig`]): a test
//! that waits less for such a failure passes here and times out on a NIC.
//!
//! ```
//! use rdma_ring::backend::soft::{SoftDevice, QpState};
//! use rdma_ring::backend::{QpConfig, WcStatus};
//! let dev = SoftDevice::new();
//! let pd = dev.alloc_pd();
//! let (a, b) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
//! assert_eq!(a.control().state(), Some(QpState::ReadyToSend));
//! b.control().fail_nth(1, WcStatus::RemOpErr); // b's next WR fails
//! ```

mod async_events;
mod cq;
mod events;
mod execute;
mod pd;
mod post;
mod qp;
mod srq;
mod state;

use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};

pub use async_events::SoftAsyncEvents;
pub use cq::SoftCq;
pub use events::SoftEvents;
pub use pd::SoftPd;
pub use qp::{QpControl, SoftQp};
pub use srq::SoftSrq;
pub use state::{QpCounters, QpState};

use crate::backend::{AsyncEvent, CqId, PdId, QpCaps, QpConfig, SrqCaps, SrqConfig, SrqId};
use crate::error::Error;
use state::{CqEntry, DeviceState, QpEntry, SrqEntry};

/// When the soft device executes work requests.
///
/// ```
/// use rdma_ring::backend::soft::{Progress, SoftDevice};
/// let dev = SoftDevice::with_progress(Progress::Manual);
/// assert_eq!(dev.progress_mode(), Progress::Manual);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Progress {
    /// Execute inside every post and poll, as a NIC would on its own.
    Auto,
    /// Execute only in [`SoftDevice::progress`] and [`QpControl::step`].
    Manual,
    /// Complete every work request at once, successfully, with no data
    /// effect, for benchmarks: what the device still costs is its lock,
    /// the checks a NIC makes when work is posted, and the completion
    /// queue (`scripts/instructions` shows that share beside each figure).
    /// Only behind an empty queue: work queued in another mode runs first
    /// (in order) when the device progresses. A receive completes with no
    /// message, so it never wakes a channel armed for solicited events.
    /// A shared receive queue's receives do not: no message comes to take
    /// one, and until one does it belongs to no queue pair to complete
    /// on, so they stay queued (and hold the queue's room).
    NoOp,
}

/// Queue depths the soft device accepts at most.
pub const MAX_QP_WR: u32 = 1 << 14;

/// Completion queue depth the soft device accepts at most.
pub const MAX_CQE: u32 = 1 << 16;

/// Scatter/gather elements per work request the soft device accepts at
/// most.
pub const MAX_SGE: u32 = 16;

/// Inline bytes per send the soft device grants at most, as a NIC grants
/// a few hundred: a queue pair asking for more gets this much (its caps
/// say so), so inline sizes that a NIC would not take fail here too.
pub const MAX_INLINE: u32 = 256;

struct Shared {
    state: Mutex<DeviceState>,
    /// Signaled after anything that may have raised a completion event.
    events: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, DeviceState> {
        // A panic while holding the lock cannot leave memory half-copied in
        // a way that matters more than the panic itself; keep going.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Wakes threads blocked in `SoftEvents::wait`, if there can be any.
    fn notify(&self, state: &DeviceState) {
        if state.has_channels {
            self.events.notify_all();
        }
    }
}

/// What follows every post, refused partway or not: in auto mode the
/// device runs what was accepted, as a NIC does; waiters hear of any CQE
/// the post made (a flush, or a no-op completion).
fn after_post(shared: &Arc<Shared>, state: &mut DeviceState) {
    if state.progress == Progress::Auto {
        state.run_all(false);
        kick_rnr_timer(shared, state);
    }
    shared.notify(state);
}

/// In auto mode a send waiting on RNR is retried by the device itself, as a
/// NIC would, even if nobody posts or polls: a timer thread runs while any
/// queue pair waits.
fn kick_rnr_timer(shared: &Arc<Shared>, state: &mut DeviceState) {
    let waiting = |s: &DeviceState| s.qps.iter().flatten().any(|qp| qp.rnr.is_some());
    if state.progress != Progress::Auto || state.rnr_timer || !waiting(state) {
        return;
    }
    state.rnr_timer = true;
    let shared = Arc::clone(shared);
    std::thread::spawn(move || loop {
        std::thread::sleep(execute::RNR_TIMER);
        let mut state = shared.lock();
        if state.progress == Progress::Auto {
            state.run_all(false);
        }
        shared.notify(&state);
        if state.progress != Progress::Auto || !waiting(&state) {
            state.rnr_timer = false;
            return;
        }
    });
}

/// The in-process software RC device. Cloning gives another handle to the
/// same device.
///
/// ```
/// use rdma_ring::backend::soft::SoftDevice;
/// let dev = SoftDevice::new();
/// assert_eq!(dev.name(), "soft");
/// ```
#[derive(Clone)]
pub struct SoftDevice {
    shared: Arc<Shared>,
}

impl Default for SoftDevice {
    fn default() -> Self {
        SoftDevice::new()
    }
}

impl std::fmt::Debug for SoftDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SoftDevice")
            .field("progress", &self.progress_mode())
            .finish()
    }
}

impl SoftDevice {
    /// A device that progresses by itself ([`Progress::Auto`]).
    ///
    /// ```
    /// # use rdma_ring::backend::soft::{Progress, SoftDevice};
    /// let dev = SoftDevice::new();
    /// assert_eq!(dev.progress_mode(), Progress::Auto);
    /// ```
    pub fn new() -> Self {
        SoftDevice::with_progress(Progress::Auto)
    }

    /// A device in the given progress mode.
    ///
    /// ```
    /// # use rdma_ring::backend::soft::{Progress, SoftDevice};
    /// let dev = SoftDevice::with_progress(Progress::NoOp);
    /// assert_eq!(dev.progress_mode(), Progress::NoOp);
    /// ```
    pub fn with_progress(progress: Progress) -> Self {
        SoftDevice {
            shared: Arc::new(Shared {
                state: Mutex::new(DeviceState::new(progress)),
                events: Condvar::new(),
            }),
        }
    }

    /// The device's name, as the examples print it.
    ///
    /// ```
    /// # use rdma_ring::backend::soft::SoftDevice;
    /// let dev = SoftDevice::new();
    /// println!("device: {}", dev.name());
    /// assert_eq!(dev.name(), "soft");
    /// ```
    pub fn name(&self) -> &'static str {
        "soft"
    }

    /// The current progress mode.
    ///
    /// ```
    /// # use rdma_ring::backend::soft::{Progress, SoftDevice};
    /// let dev = SoftDevice::new();
    /// let handle = dev.clone();
    /// handle.set_progress(Progress::Manual);
    /// assert_eq!(dev.progress_mode(), Progress::Manual); // one device, two handles
    /// ```
    pub fn progress_mode(&self) -> Progress {
        self.shared.lock().progress
    }

    /// Changes the progress mode.
    ///
    /// ```
    /// # use rdma_ring::backend::soft::{Progress, SoftDevice};
    /// let dev = SoftDevice::new();
    /// dev.set_progress(Progress::Manual); // from here on the test picks the interleaving
    /// assert_eq!(dev.progress_mode(), Progress::Manual);
    /// ```
    ///
    /// # Panics
    ///
    /// On a switch to [`Progress::NoOp`] while a queue pair holds its
    /// completions back ([`QpControl::hold_acks`]): no-op work would
    /// complete ahead of them, out of order. Release them first.
    pub fn set_progress(&self, progress: Progress) {
        let mut state = self.shared.lock();
        if progress == Progress::NoOp && state.qps.iter().flatten().any(|qp| qp.held_acks.is_some())
        {
            drop(state); // the device stays usable
            panic!(
                "soft device: switching to no-op mode while a queue pair holds completions \
                 back; release them first"
            );
        }
        state.progress = progress;
    }

    /// Executes every work request that can run now, on every queue pair;
    /// returns how many ran. In manual mode each call is one RNR retry for
    /// a send whose peer has no receive.
    ///
    /// ```
    /// # use rdma_ring::backend::soft::{Progress, SoftDevice};
    /// # use rdma_ring::backend::QpConfig;
    /// # use rdma_ring::buf::{ExposedBuf, RegisteredBuf, RemoteAccess};
    /// # use rdma_ring::op::Write;
    /// # use rdma_ring::ring::{Ring, RingConfig};
    /// let dev = SoftDevice::with_progress(Progress::Manual);
    /// let pd = dev.alloc_pd();
    /// let (qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    /// let mut ring = Ring::new(qp, RingConfig::default());
    /// let target = ExposedBuf::new(&pd, vec![0u8; 2], RemoteAccess::WRITE).unwrap();
    /// let hi = RegisteredBuf::new(&pd, b"hi".to_vec()).unwrap();
    /// ring.submission().push(Write::new(hi, target.remote())).unwrap();
    /// ring.submit().unwrap();
    /// assert_eq!(ring.qp().control().queued_sends(), 1); // posted, not run
    /// assert_eq!(dev.progress(), 1);
    /// assert_eq!(ring.qp().control().queued_sends(), 0);
    /// ```
    pub fn progress(&self) -> usize {
        let mut state = self.shared.lock();
        let manual = state.progress == Progress::Manual;
        let ran = state.run_all(manual);
        self.shared.notify(&state);
        ran
    }

    /// Makes the next `n` deregistrations on this device fail, as a
    /// registration with memory windows still bound would on hardware: the
    /// memory's owner must then keep it rather than free it.
    ///
    /// ```
    /// # use rdma_ring::backend::soft::SoftDevice;
    /// # use rdma_ring::buf::RegisteredBuf;
    /// let dev = SoftDevice::new();
    /// let buf = RegisteredBuf::new(&dev.alloc_pd(), vec![0u8; 64]).unwrap();
    /// dev.fail_deregistrations(1);
    /// let refused = buf.into_inner::<Vec<u8>>().unwrap_err();
    /// // The memory stays registered, inside the buffer, and is not freed.
    /// let buf = refused.into_value();
    /// let memory: Vec<u8> = buf.into_inner().unwrap(); // the next one succeeds
    /// assert_eq!(memory.len(), 64);
    /// ```
    pub fn fail_deregistrations(&self, n: u32) {
        self.shared.lock().fail_deregistrations = n;
    }

    /// Makes the next `n` arms of a completion channel (of any of the
    /// device's completion queues) fail, as `ibv_req_notify_cq` may: the
    /// queue is left unarmed, and raises no event for its next CQE.
    ///
    /// ```
    /// # use rdma_ring::backend::soft::SoftDevice;
    /// # use rdma_ring::backend::{CompletionEvents, CompletionQueue};
    /// let dev = SoftDevice::new();
    /// let cq = dev.create_cq(8).unwrap();
    /// let events = cq.completion_events().unwrap();
    /// dev.fail_arms(1);
    /// assert!(events.arm().is_err());
    /// assert!(events.arm().is_ok()); // the next one succeeds
    /// ```
    pub fn fail_arms(&self, n: u32) {
        self.shared.lock().fail_arms = n;
    }

    /// How many of the arms [`fail_arms`](Self::fail_arms) asked to fail
    /// are still to fail: how often the channel was armed meanwhile.
    ///
    /// ```
    /// # use rdma_ring::backend::soft::SoftDevice;
    /// # use rdma_ring::backend::{CompletionEvents, CompletionQueue};
    /// let dev = SoftDevice::new();
    /// let events = dev.create_cq(8).unwrap().completion_events().unwrap();
    /// dev.fail_arms(3);
    /// assert!(events.arm().is_err());
    /// assert_eq!(dev.arms_left_to_fail(), 2);
    /// ```
    pub fn arms_left_to_fail(&self) -> u32 {
        self.shared.lock().fail_arms
    }

    /// A new protection domain.
    ///
    /// ```
    /// # use rdma_ring::backend::soft::SoftDevice;
    /// # use rdma_ring::backend::{ProtectionDomain, QpConfig};
    /// let dev = SoftDevice::new();
    /// let (a, b) = (dev.alloc_pd(), dev.alloc_pd());
    /// assert_ne!(a.id(), b.id());
    /// assert!(SoftDevice::new().create_qp(&a, QpConfig::default()).is_err()); // another device's
    /// ```
    pub fn alloc_pd(&self) -> SoftPd {
        SoftPd {
            shared: Arc::clone(&self.shared),
            id: PdId::fresh(),
        }
    }

    /// A new completion queue holding `entries` completions, for any number
    /// of queue pairs ([`create_qp_on`](Self::create_qp_on)).
    ///
    /// ```
    /// # use rdma_ring::backend::soft::SoftDevice;
    /// # use rdma_ring::backend::CompletionQueue;
    /// let dev = SoftDevice::new();
    /// let cq = dev.create_cq(1024).unwrap();
    /// assert_eq!(cq.entries(), 1024);
    /// assert!(dev.create_cq(0).is_err());
    /// ```
    pub fn create_cq(&self, entries: u32) -> Result<SoftCq, Error> {
        if entries == 0 || entries > MAX_CQE {
            return Err(Error::Soft("completion queue depth must be 1..=65536"));
        }
        let id = CqId::fresh();
        let mut state = self.shared.lock();
        let index = state.cqs.len();
        state.cqs.push(Some(CqEntry {
            id,
            entries,
            queue: std::collections::VecDeque::with_capacity(entries as usize),
            overrun: false,
            events: None,
            owned: true,
        }));
        Ok(SoftCq {
            shared: Arc::clone(&self.shared),
            index,
            id,
            entries,
            events: OnceLock::new(),
        })
    }

    /// A new shared receive queue in `pd`.
    ///
    /// ```
    /// # use rdma_ring::backend::soft::SoftDevice;
    /// # use rdma_ring::backend::SrqConfig;
    /// let dev = SoftDevice::new();
    /// let pd = dev.alloc_pd();
    /// let srq = dev.create_srq(&pd, SrqConfig { max_wr: 4096, max_sge: 2 }).unwrap();
    /// assert_eq!(srq.posted(), 0);
    /// assert!(dev.create_srq(&pd, SrqConfig { max_wr: 0, max_sge: 1 }).is_err());
    /// ```
    pub fn create_srq(&self, pd: &SoftPd, config: SrqConfig) -> Result<SoftSrq, Error> {
        self.check_pd(pd)?;
        if config.max_wr == 0 || config.max_wr > MAX_QP_WR || config.max_sge == 0 {
            return Err(Error::Soft(
                "shared receive queue depth must be 1..=16384, with at least one element",
            ));
        }
        let caps = SrqCaps {
            id: SrqId::fresh(),
            pd: pd.id,
            max_wr: config.max_wr,
            max_sge: config.max_sge.min(MAX_SGE),
        };
        let mut state = self.shared.lock();
        let index = state.srqs.len();
        state.srqs.push(Some(SrqEntry {
            id: caps.id,
            pd: pd.id,
            config: SrqConfig {
                max_sge: caps.max_sge,
                ..config
            },
            queue: std::collections::VecDeque::with_capacity(config.max_wr as usize),
            held: 0,
            limit: 0,
            attached: 0,
        }));
        Ok(SoftSrq::new(&self.shared, index, caps))
    }

    fn check_pd(&self, pd: &SoftPd) -> Result<(), Error> {
        if Arc::ptr_eq(&pd.shared, &self.shared) {
            Ok(())
        } else {
            Err(Error::Soft(
                "the protection domain belongs to another soft device",
            ))
        }
    }

    /// A new queue pair in [`QpState::Init`], with a completion queue of its
    /// own (`config.completion_entries()` deep), which
    /// [`Ring::new`](crate::ring::Ring::new) takes.
    ///
    /// ```
    /// # use rdma_ring::backend::soft::{QpState, SoftDevice};
    /// # use rdma_ring::backend::{CompletionQueue, QpConfig, QueuePair};
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// let config = QpConfig::default();
    /// let mut qp = dev.create_qp(&pd, config).unwrap();
    /// assert_eq!(qp.control().state(), Some(QpState::Init)); // connect it before sending
    /// assert_eq!(qp.take_cq().unwrap().entries(), config.completion_entries());
    /// ```
    pub fn create_qp(&self, pd: &SoftPd, config: QpConfig) -> Result<SoftQp, Error> {
        let cq = self.create_cq(config.completion_entries())?;
        let mut qp = self.create_qp_on(pd, &cq, None, config)?;
        qp.own_cq = Some(cq);
        Ok(qp)
    }

    /// A new queue pair in [`QpState::Init`] completing on `cq` (shared with
    /// other queue pairs), taking its receives from `srq` if one is given
    /// (then `config.max_recv_wr` is ignored: it has no receive queue).
    ///
    /// ```
    /// # use rdma_ring::backend::soft::SoftDevice;
    /// # use rdma_ring::backend::{QpConfig, QueuePair, SrqConfig};
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// let cq = dev.create_cq(1024).unwrap();
    /// let srq = dev.create_srq(&pd, SrqConfig::default()).unwrap();
    /// let a = dev.create_qp_on(&pd, &cq, None, QpConfig::default()).unwrap();
    /// let b = dev.create_qp_on(&pd, &cq, Some(&srq), QpConfig::default()).unwrap();
    /// assert_eq!(a.caps().cq, b.caps().cq);
    /// assert_eq!(b.caps().max_recv_wr, 0); // its receives come from `srq`
    /// ```
    pub fn create_qp_on(
        &self,
        pd: &SoftPd,
        cq: &SoftCq,
        srq: Option<&SoftSrq>,
        config: QpConfig,
    ) -> Result<SoftQp, Error> {
        self.check_pd(pd)?;
        if !Arc::ptr_eq(&cq.shared, &self.shared)
            || srq.is_some_and(|s| !Arc::ptr_eq(&s.shared, &self.shared))
        {
            return Err(Error::Soft(
                "the completion or shared receive queue belongs to another soft device",
            ));
        }
        if let Some(why) = config.refusal() {
            return Err(Error::Soft(why));
        }
        let max_recv_wr = if srq.is_some() { 0 } else { config.max_recv_wr };
        if config.max_send_wr == 0 || config.max_send_wr > MAX_QP_WR || max_recv_wr > MAX_QP_WR {
            return Err(Error::Soft(
                "queue depths must be 1..=16384 sends and 0..=16384 receives",
            ));
        }
        let config = QpConfig {
            max_recv_wr,
            max_send_sge: config.max_send_sge.clamp(1, MAX_SGE),
            max_recv_sge: config.max_recv_sge.clamp(1, MAX_SGE),
            max_inline_data: config.max_inline_data.min(MAX_INLINE),
            ..config
        };
        let mut state = self.shared.lock();
        if let Some(srq) = srq {
            match state.srq(srq.index) {
                None => return Err(Error::Soft("the shared receive queue was destroyed")),
                Some(entry) if entry.pd != pd.id => {
                    return Err(Error::Soft(
                        "the shared receive queue belongs to another protection domain",
                    ))
                }
                Some(_) => {}
            }
        }
        if state.cq(cq.index).is_none() {
            return Err(Error::Soft("the completion queue was destroyed"));
        }
        let qpn = state.qps.len();
        state.qps.push(Some(QpEntry::new(
            pd.id,
            config,
            cq.index,
            srq.map(|s| s.index),
        )));
        if let Some(entry) = srq.and_then(|s| state.srq(s.index)) {
            entry.attached += 1;
        }
        Ok(SoftQp {
            shared: Arc::clone(&self.shared),
            qpn,
            caps: QpCaps {
                qp_num: qpn as u32,
                cq: cq.id,
                srq: srq.map(|s| s.caps.id),
                pd: pd.id,
                max_send_wr: config.max_send_wr,
                max_recv_wr,
                max_send_sge: config.max_send_sge,
                max_recv_sge: config.max_recv_sge,
                max_inline_data: config.max_inline_data,
                atomics: true,
                max_read_sge: config.max_send_sge,
                max_message: crate::op::MAX_MESSAGE_LEN as u32,
            },
            own_cq: None,
        })
    }

    /// Connects two queue pairs of this device to each other and moves
    /// both to [`QpState::ReadyToSend`].
    ///
    /// ```
    /// # use rdma_ring::backend::soft::{QpState, SoftDevice};
    /// # use rdma_ring::backend::QpConfig;
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// let a = dev.create_qp(&pd, QpConfig::default()).unwrap();
    /// let b = dev.create_qp(&pd, QpConfig::default()).unwrap();
    /// dev.connect(&a, &b).unwrap();
    /// assert_eq!(b.control().state(), Some(QpState::ReadyToSend));
    /// assert!(dev.connect(&a, &b).is_err()); // no longer in Init
    /// ```
    pub fn connect(&self, a: &SoftQp, b: &SoftQp) -> Result<(), Error> {
        if !Arc::ptr_eq(&a.shared, &self.shared) || !Arc::ptr_eq(&b.shared, &self.shared) {
            return Err(Error::Soft(
                "both queue pairs must belong to this soft device",
            ));
        }
        if a.qpn == b.qpn {
            return Err(Error::Soft("a queue pair cannot connect to itself"));
        }
        let mut state = self.shared.lock();
        // Check both before changing either, so a refusal changes nothing.
        for qpn in [a.qpn, b.qpn] {
            let qp = state.qp(qpn).ok_or(Error::Soft("queue pair destroyed"))?;
            if qp.state != QpState::Init {
                return Err(Error::Soft("queue pair is not in the Init state"));
            }
        }
        for (qpn, peer) in [(a.qpn, b.qpn), (b.qpn, a.qpn)] {
            let qp = state.qp(qpn).expect("checked above");
            qp.peer = Some(peer);
            qp.state = QpState::ReadyToSend;
        }
        Ok(())
    }

    /// Two new queue pairs, each with a completion queue of its own,
    /// connected.
    ///
    /// ```
    /// # use rdma_ring::backend::soft::{QpState, SoftDevice};
    /// # use rdma_ring::backend::{QpConfig, QueuePair};
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// let (a, b) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    /// assert_eq!(a.control().state(), Some(QpState::ReadyToSend));
    /// assert_ne!(a.caps().cq, b.caps().cq); // each has a completion queue of its own
    /// ```
    pub fn connected_pair(
        &self,
        pd_a: &SoftPd,
        pd_b: &SoftPd,
        config: QpConfig,
    ) -> Result<(SoftQp, SoftQp), Error> {
        let a = self.create_qp(pd_a, config)?;
        let b = self.create_qp(pd_b, config)?;
        self.connect(&a, &b)?;
        Ok((a, b))
    }

    /// The device's asynchronous event channel. A device has one reader at
    /// a time (as events go to one consumer); opening another replaces it.
    /// Events raised before it was opened are kept (up to a bound).
    ///
    /// ```
    /// # use rdma_ring::backend::soft::SoftDevice;
    /// # use rdma_ring::backend::{AsyncEvent, AsyncEventSource};
    /// let dev = SoftDevice::new();
    /// dev.set_port_active(false); // before anyone listens
    /// let events = dev.async_events().unwrap();
    /// assert_eq!(events.next_event().unwrap(), Some(AsyncEvent::PortError { port: 1 }));
    /// ```
    pub fn async_events(&self) -> Result<SoftAsyncEvents, Error> {
        async_events::open(&self.shared)
    }

    /// Takes the port down (`false`) or up: the device raises
    /// [`AsyncEvent::PortError`] or [`AsyncEvent::PortActive`]. While it is
    /// down, requests find no path to the peer: they fail with
    /// `RetryExcErr` once executed.
    ///
    /// ```
    /// # use rdma_ring::backend::soft::SoftDevice;
    /// # use rdma_ring::backend::{AsyncEvent, AsyncEventSource};
    /// let dev = SoftDevice::new();
    /// let events = dev.async_events().unwrap();
    /// dev.set_port_active(false);
    /// dev.set_port_active(false); // no change, no event
    /// dev.set_port_active(true);
    /// assert_eq!(events.next_event().unwrap(), Some(AsyncEvent::PortError { port: 1 }));
    /// assert_eq!(events.next_event().unwrap(), Some(AsyncEvent::PortActive { port: 1 }));
    /// assert_eq!(events.next_event().unwrap(), None);
    /// ```
    pub fn set_port_active(&self, active: bool) {
        let mut state = self.shared.lock();
        if state.port_active != active {
            state.port_active = active;
            state.raise(if active {
                AsyncEvent::PortActive { port: 1 }
            } else {
                AsyncEvent::PortError { port: 1 }
            });
        }
        self.shared.notify(&state);
    }

    /// The whole device fails: it raises [`AsyncEvent::DeviceFatal`] and
    /// every queue pair goes to error, flushing its work requests.
    ///
    /// ```
    /// # use rdma_ring::backend::soft::{QpState, SoftDevice};
    /// # use rdma_ring::backend::{AsyncEvent, AsyncEventSource, QpConfig};
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// let events = dev.async_events().unwrap();
    /// let (qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    /// dev.inject_device_fatal();
    /// assert_eq!(events.next_event().unwrap(), Some(AsyncEvent::DeviceFatal));
    /// assert_eq!(qp.control().state(), Some(QpState::Error));
    /// ```
    pub fn inject_device_fatal(&self) {
        let mut state = self.shared.lock();
        state.raise(AsyncEvent::DeviceFatal);
        for qpn in 0..state.qps.len() {
            state.enter_error(qpn);
        }
        self.shared.notify(&state);
    }
}
