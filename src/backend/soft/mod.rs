//! An in-process software RC device: a test double for the NIC, so the
//! crate's users, examples and tests run with no RDMA hardware.
//!
//! It models what the ring relies on: registered memory with lkeys, rkeys
//! and access checks; connected queue pairs executing all eight operations
//! in RC order with their data effects; receive queues and RNR; immediate
//! data; 8-byte atomics with alignment checks; the QP state machine with
//! error flush (every flushed WR gets a CQE); completion queue depth and
//! overrun. It never opens a socket.
//!
//! Execution follows the device's [`Progress`] mode: [`Progress::Auto`]
//! executes inside every post and poll (normal use); [`Progress::Manual`]
//! executes only in [`SoftDevice::progress`] and [`QpControl::step`], so
//! tests choose the interleaving; [`Progress::NoOp`] completes every work
//! request at once with no data effect, for measuring the software path.
//!
//! [`QpControl`] injects faults: fail the n-th work request with a chosen
//! status, or break the connection.
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

mod events;
mod execute;
mod state;

use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};

pub use events::SoftEvents;
pub use state::{QpCounters, QpState};

use crate::backend::{
    Access, CompletionEvents, MemoryRegion, PdId, PostError, ProtectionDomain, QpCaps, QpConfig,
    QueuePair, RawCompletion, RecvWr, SendFlags, SendWr, WcStatus,
};
use crate::error::Error;
use state::{flushed, DeviceState, MrEntry, QpEntry, QueuedSend, RKEY_BIT};

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
    /// effect: the device costs next to nothing, for benchmarks.
    NoOp,
}

/// Queue depths the soft device accepts at most.
pub const MAX_QP_WR: u32 = 1 << 14;

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
    pub fn new() -> Self {
        SoftDevice::with_progress(Progress::Auto)
    }

    /// A device in the given progress mode.
    pub fn with_progress(progress: Progress) -> Self {
        SoftDevice {
            shared: Arc::new(Shared {
                state: Mutex::new(DeviceState::new(progress)),
                events: Condvar::new(),
            }),
        }
    }

    /// The device's name, as the examples print it.
    pub fn name(&self) -> &'static str {
        "soft"
    }

    /// The current progress mode.
    pub fn progress_mode(&self) -> Progress {
        self.shared.lock().progress
    }

    /// Changes the progress mode.
    pub fn set_progress(&self, progress: Progress) {
        self.shared.lock().progress = progress;
    }

    /// Executes every work request that can run now, on every queue pair;
    /// returns how many ran. In manual mode each call is one RNR retry for
    /// a send whose peer has no receive.
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
    pub fn fail_deregistrations(&self, n: u32) {
        self.shared.lock().fail_deregistrations = n;
    }

    /// A new protection domain.
    pub fn alloc_pd(&self) -> SoftPd {
        SoftPd {
            shared: Arc::clone(&self.shared),
            id: PdId::fresh(),
        }
    }

    /// A new queue pair in [`QpState::Init`], with its own completion queue.
    pub fn create_qp(&self, pd: &SoftPd, config: QpConfig) -> Result<SoftQp, Error> {
        if !Arc::ptr_eq(&pd.shared, &self.shared) {
            return Err(Error::Soft(
                "the protection domain belongs to another soft device",
            ));
        }
        if config.max_send_wr == 0
            || config.max_send_wr > MAX_QP_WR
            || config.max_recv_wr > MAX_QP_WR
        {
            return Err(Error::Soft(
                "queue depths must be 1..=16384 sends and 0..=16384 receives",
            ));
        }
        let mut state = self.shared.lock();
        let qpn = state.qps.len();
        state.qps.push(Some(QpEntry::new(pd.id, config)));
        Ok(SoftQp {
            shared: Arc::clone(&self.shared),
            events: OnceLock::new(),
            qpn,
            caps: QpCaps {
                max_send_wr: config.max_send_wr,
                max_recv_wr: config.max_recv_wr,
                cq_entries: config.completion_entries(),
                max_inline_data: config.max_inline_data,
                atomics: true,
                pd: pd.id,
            },
        })
    }

    /// Connects two queue pairs of this device to each other and moves
    /// both to [`QpState::ReadyToSend`].
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

    /// Two new queue pairs, connected.
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
}

/// A protection domain of the soft device.
pub struct SoftPd {
    shared: Arc<Shared>,
    id: PdId,
}

impl std::fmt::Debug for SoftPd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SoftPd").field("id", &self.id).finish()
    }
}

// SAFETY: `id` is fixed at creation, and every region is registered in this
// domain; `SoftMr` keeps the `MemoryRegion` promises (see there).
unsafe impl ProtectionDomain for SoftPd {
    fn id(&self) -> PdId {
        self.id
    }

    unsafe fn register_raw(
        &self,
        addr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<Box<dyn MemoryRegion>, Error> {
        if len == 0 {
            return Err(Error::EmptyBuffer);
        }
        if (addr as usize).checked_add(len).is_none() {
            return Err(Error::Soft("registration wraps the address space"));
        }
        let mut state = self.shared.lock();
        let key = state.next_mr;
        if key & RKEY_BIT != 0 {
            return Err(Error::Soft("memory key space exhausted"));
        }
        state.next_mr += 1;
        state.mrs.insert(
            key,
            MrEntry {
                addr: addr as usize,
                len,
                access,
                pd: self.id,
            },
        );
        let remote =
            access.intersects(Access::REMOTE_READ | Access::REMOTE_WRITE | Access::REMOTE_ATOMIC);
        Ok(Box::new(SoftMr {
            shared: Arc::clone(&self.shared),
            key,
            rkey: if remote { key | RKEY_BIT } else { 0 },
            pd: self.id,
            registered: true,
        }))
    }
}

struct SoftMr {
    shared: Arc<Shared>,
    key: u32,
    rkey: u32,
    pd: PdId,
    registered: bool,
}

// SAFETY: the keys name the `MrEntry` made in `register_raw` for exactly the
// bytes and rights asked; execution reaches memory only through an entry
// found under the device lock, and `deregister` removes the entry under that
// lock, so after it returns `Ok` no execution can reach the memory.
unsafe impl MemoryRegion for SoftMr {
    fn lkey(&self) -> u32 {
        self.key
    }
    fn rkey(&self) -> u32 {
        self.rkey
    }
    fn pd(&self) -> PdId {
        self.pd
    }
    fn deregister(&mut self) -> Result<(), Error> {
        if !self.registered {
            return Ok(());
        }
        let mut state = self.shared.lock();
        if state.fail_deregistrations > 0 {
            state.fail_deregistrations -= 1;
            return Err(Error::Soft("injected deregistration failure"));
        }
        state.mrs.remove(&self.key);
        self.registered = false;
        Ok(())
    }
}

impl Drop for SoftMr {
    fn drop(&mut self) {
        if self.registered {
            // Under the device lock: once this returns, no execution can
            // reach the memory through either key.
            self.shared.lock().mrs.remove(&self.key);
        }
    }
}

/// A soft RC queue pair with its own completion queue. Dropping it destroys
/// the queue pair; its peer's later requests fail with `RetryExcErr`.
pub struct SoftQp {
    shared: Arc<Shared>,
    events: OnceLock<Option<Arc<SoftEvents>>>,
    qpn: usize,
    caps: QpCaps,
}

impl std::fmt::Debug for SoftQp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SoftQp").field("qpn", &self.qpn).finish()
    }
}

impl SoftQp {
    /// The queue pair number.
    pub fn qpn(&self) -> u32 {
        self.qpn as u32
    }

    /// A handle for tests: fault injection, stepping, counters. It stays
    /// usable while a ring owns the queue pair.
    pub fn control(&self) -> QpControl {
        QpControl {
            shared: Arc::clone(&self.shared),
            qpn: self.qpn,
        }
    }

    fn post_error(accepted: usize, reason: &'static str) -> PostError {
        PostError {
            accepted,
            error: Error::PostRejected(reason),
        }
    }
}

// SAFETY: the soft device executes each send queue in order and reports a
// CQE only after a work request has executed (or been flushed, for which it
// always makes a CQE); a post accepts a prefix and reports its length
// exactly; `caps` is the configuration the queues were made with.
unsafe impl QueuePair for SoftQp {
    fn caps(&self) -> QpCaps {
        self.caps
    }

    unsafe fn post_send(&mut self, wrs: &[SendWr]) -> Result<(), PostError> {
        let mut state = self.shared.lock();
        let progress = state.progress;
        let qp = state
            .qp(self.qpn)
            .ok_or(Self::post_error(0, "queue pair destroyed"))?;
        qp.counters.send_posts += 1;
        if qp.state == QpState::Init {
            return Err(Self::post_error(
                0,
                "queue pair is not connected (not ready to send)",
            ));
        }
        for (i, wr) in wrs.iter().enumerate() {
            if qp.sq.len() >= qp.config.max_send_wr as usize {
                return Err(Self::post_error(i, "send queue full"));
            }
            if wr.flags.contains(SendFlags::INLINE) && wr.sge.len > qp.config.max_inline_data {
                return Err(Self::post_error(
                    i,
                    "inline payload exceeds max_inline_data",
                ));
            }
            qp.counters.send_wrs += 1;
            let seq = qp.take_seq();
            if qp.state == QpState::Error {
                qp.report_send(seq);
                qp.push_cqe(flushed(wr.wr_id));
            } else if progress == Progress::NoOp && qp.sq.is_empty() {
                // Completing at once is only in order behind nothing: a work
                // request queued earlier (in another mode) must run first.
                if wr.flags.contains(SendFlags::SIGNALED) {
                    qp.report_send(seq);
                    qp.push_cqe(RawCompletion {
                        wr_id: wr.wr_id,
                        status: WcStatus::Success,
                        byte_len: wr.sge.len,
                        imm: None,
                        by_write_imm: false,
                    });
                }
            } else {
                qp.sq.push_back(QueuedSend { seq, wr: *wr });
            }
        }
        if progress == Progress::Auto {
            state.run_all(false);
            kick_rnr_timer(&self.shared, &mut state);
        }
        self.shared.notify(&state);
        Ok(())
    }

    unsafe fn post_recv(&mut self, wrs: &[RecvWr]) -> Result<(), PostError> {
        let mut state = self.shared.lock();
        let progress = state.progress;
        let qp = state
            .qp(self.qpn)
            .ok_or(Self::post_error(0, "queue pair destroyed"))?;
        qp.counters.recv_posts += 1;
        for (i, wr) in wrs.iter().enumerate() {
            if qp.rq.len() >= qp.config.max_recv_wr as usize {
                return Err(Self::post_error(i, "receive queue full"));
            }
            qp.counters.recv_wrs += 1;
            if qp.state == QpState::Error {
                qp.push_cqe(flushed(wr.wr_id));
            } else if progress == Progress::NoOp && qp.rq.is_empty() {
                qp.push_cqe(RawCompletion {
                    wr_id: wr.wr_id,
                    status: WcStatus::Success,
                    byte_len: 0,
                    imm: None,
                    by_write_imm: false,
                });
            } else {
                qp.rq.push_back(*wr);
            }
        }
        if progress == Progress::Auto {
            state.run_all(false);
            kick_rnr_timer(&self.shared, &mut state);
        }
        self.shared.notify(&state);
        Ok(())
    }

    fn poll_cq(&mut self, out: &mut [RawCompletion]) -> Result<usize, Error> {
        let mut state = self.shared.lock();
        if state.progress == Progress::Auto {
            state.run_all(false);
            kick_rnr_timer(&self.shared, &mut state);
            self.shared.notify(&state);
        }
        let qp = state
            .qp(self.qpn)
            .ok_or(Error::Soft("queue pair destroyed"))?;
        let mut n = 0;
        while n < out.len() {
            match qp.cq.pop_front() {
                Some(cqe) => {
                    out[n] = cqe;
                    n += 1;
                }
                None => break,
            }
        }
        if n == 0 && qp.overrun {
            return Err(Error::CqOverrun);
        }
        Ok(n)
    }

    fn set_error(&mut self) -> Result<(), Error> {
        let mut state = self.shared.lock();
        let qp = state
            .qp(self.qpn)
            .ok_or(Error::Soft("queue pair destroyed"))?;
        qp.enter_error();
        self.shared.notify(&state);
        Ok(())
    }

    fn completion_events(&self) -> Option<Arc<dyn CompletionEvents>> {
        let events = self
            .events
            .get_or_init(|| events::channel(&self.shared, self.qpn).ok().map(Arc::new));
        events.clone().map(|e| e as Arc<dyn CompletionEvents>)
    }
}

impl Drop for SoftQp {
    fn drop(&mut self) {
        let mut state = self.shared.lock();
        let peer = state.qps[self.qpn].take().and_then(|qp| qp.peer);
        if let Some(peer) = peer.and_then(|p| state.qp(p)) {
            peer.link_broken = true;
        }
    }
}

/// Test controls for one soft queue pair.
///
/// ```
/// use rdma_ring::backend::soft::{Progress, SoftDevice};
/// use rdma_ring::backend::QpConfig;
/// let dev = SoftDevice::with_progress(Progress::Manual);
/// let pd = dev.alloc_pd();
/// let (a, _b) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
/// let control = a.control();
/// assert!(!control.step()); // nothing queued
/// assert_eq!(control.counters().send_posts, 0);
/// ```
#[derive(Clone)]
pub struct QpControl {
    shared: Arc<Shared>,
    qpn: usize,
}

impl std::fmt::Debug for QpControl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QpControl").field("qpn", &self.qpn).finish()
    }
}

impl QpControl {
    /// The n-th send work request executed from now (1 = the next one)
    /// completes with `status`, and the queue pair goes to error.
    pub fn fail_nth(&self, n: u64, status: WcStatus) {
        if let Some(qp) = self.shared.lock().qp(self.qpn) {
            qp.fault = Some((n.max(1), status));
        }
    }

    /// Cuts the link to the peer, both ways: every later request of either
    /// side fails with `RetryExcErr`, as if the peer had vanished.
    pub fn break_connection(&self) {
        let mut state = self.shared.lock();
        let peer = state.qp(self.qpn).and_then(|qp| {
            qp.link_broken = true;
            qp.peer
        });
        if let Some(peer) = peer.and_then(|p| state.qp(p)) {
            peer.link_broken = true;
        }
    }

    /// Executes at most one send work request of this queue pair (manual
    /// mode); returns whether one completed.
    pub fn step(&self) -> bool {
        let mut state = self.shared.lock();
        let ran = state.run_qp(self.qpn, 1, true) == 1;
        self.shared.notify(&state);
        ran
    }

    /// The queue pair's state, or `None` once destroyed.
    pub fn state(&self) -> Option<QpState> {
        self.shared.lock().qp(self.qpn).map(|qp| qp.state)
    }

    /// What the queue pair has seen.
    pub fn counters(&self) -> QpCounters {
        self.shared
            .lock()
            .qp(self.qpn)
            .map(|qp| qp.counters)
            .unwrap_or_default()
    }

    /// Send work requests queued and not yet executed.
    pub fn queued_sends(&self) -> usize {
        self.shared.lock().qp(self.qpn).map_or(0, |qp| qp.sq.len())
    }
}
