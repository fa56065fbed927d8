//! Futures adapters: await any operation on any executor.
//!
//! [`AsyncRing`] shares a [`Ring`] between tasks. Each operation method
//! (`write`, `read`, `send`, `recv`, …) pushes and submits at once and
//! returns an [`OpFuture`] that owns the operation: awaiting it gives
//! `(result, buffer)`, the buffer back whatever happened. Built on
//! `futures-core` only; no executor is a dependency.
//!
//! A ring with many queue pairs is one [`AsyncRing`], one driver and one
//! completion channel: [`AsyncRing::attach`] (or [`AsyncRing::qp`]) gives
//! an [`AsyncQp`] with the same operation methods for one queue pair, and
//! [`AsyncRing::srq_recv`] awaits a receive of a shared receive queue.
//!
//! [`AsyncFixedRing`] does the same for the fixed-buffer ring
//! ([`FixedRing`](crate::fixed::FixedRing)), the lean path: an operation
//! names its slot by token, and its [`FixedOpFuture`] resolves to the
//! [`FixedCompletion`](crate::fixed::FixedCompletion) that hands the token
//! back. Operations pushed before they are awaited go out with one
//! doorbell, posted by the first poll of any of them. The wake-up sources
//! below work the same way for it ([`FixedDriver`] is its driver).
//!
//! # Ownership and cancel safety
//!
//! The buffer moves into the ring when the operation is pushed. Dropping
//! the future before completion marks the operation orphaned: the buffer
//! is released when its completion is reaped, never while the device may
//! still use it. Dropping the last [`AsyncRing`] handle closes the ring:
//! the queue pair moves to error, and futures still pending resolve with
//! a flush error (and their buffers) instead of hanging — those whose
//! operations the device flushes within the ring's `drain_timeout`. An
//! operation it does not return by then is leaked (never freed under the
//! NIC), and its future stays pending; so does a detach's
//! ([`AsyncQp::detach`]).
//!
//! A ring whose completion queue or device failed
//! ([`Ring::failure`](crate::ring::Ring::failure), through
//! [`AsyncRing::with_ring`]) can no longer tell when the device is done
//! with a posted operation's buffer, so an [`OpFuture`] of one stays
//! pending: its buffer is never handed back while the device may use it.
//! Code that awaits with a deadline checks the failure when the deadline
//! passes. ([`AsyncFixedRing`]'s futures resolve with
//! [`Error::RingFailed`] instead: their slot
//! stays with the ring.)
//!
//! # Wake-up sources
//!
//! Something must notice completions and wake the tasks awaiting them.
//! Choose with [`Wakeup`]:
//!
//! * [`Wakeup::Busy`]: every poll of a pending future polls the device and
//!   asks to be polled again. No threads, no file descriptors, lowest
//!   latency; it keeps a core busy while anything is pending. For
//!   dedicated polling threads and benchmarks.
//! * [`Wakeup::Reactor`]: the completion channel's file descriptor
//!   ([`AsyncRing::completion_fd`], `AsRawFd` + `AsFd`) goes to your
//!   reactor — tokio's `AsyncFd`, async-io's `Async` — and a small task
//!   calls [`AsyncRing::drive`] whenever it is readable, and
//!   [`AsyncRing::tick`] on a timer (idle-time work that raises no
//!   event: a refused post's recovery, device events, rdma_cm peers that
//!   left). Idle costs next to nothing. For async services.
//! * [`Wakeup::Thread`]: a small notifier thread blocks on the completion
//!   channel and calls `drive`. Works with any executor, including
//!   `futures::executor::block_on`, at the cost of one thread per ring.
//!
//! `drive` takes the pending events, re-arms the channel, and only then
//! polls the completion queue, so a completion that lands between the
//! poll and the re-arm still raises an event: no lost wake-ups.
//!
//! ## Busy polling, on `futures::executor::block_on`
//!
//! ```
//! use rdma_ring::backend::soft::SoftDevice;
//! use rdma_ring::backend::QpConfig;
//! use rdma_ring::buf::{ExposedBuf, RegisteredBuf, RemoteAccess};
//! use rdma_ring::future::{AsyncRing, Wakeup};
//! use rdma_ring::ring::{Ring, RingConfig};
//!
//! let dev = SoftDevice::new();
//! let pd = dev.alloc_pd();
//! let (qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
//! let exposed = ExposedBuf::new(&pd, vec![0u8; 64], RemoteAccess::WRITE).unwrap();
//! let ring = AsyncRing::new(Ring::new(qp, RingConfig::default()), Wakeup::Busy).unwrap();
//!
//! futures::executor::block_on(async {
//!     let buf = RegisteredBuf::new(&pd, vec![9u8; 64]).unwrap();
//!     let (result, buf) = ring.write(buf, exposed.remote()).await;
//!     assert_eq!(result.unwrap(), 64);
//!     assert_eq!(buf.len(), 64); // the buffer is back
//! });
//! drop(ring);
//! assert_eq!(exposed.into_inner().unwrap(), vec![9u8; 64]);
//! ```
//!
//! ## A reactor: tokio's `AsyncFd`
//!
//! ```
//! use rdma_ring::backend::soft::SoftDevice;
//! use rdma_ring::backend::QpConfig;
//! use rdma_ring::buf::{RegisteredBuf, RemoteAccess};
//! use rdma_ring::future::{AsyncRing, Wakeup};
//! use rdma_ring::ring::{Ring, RingConfig};
//! use tokio::io::{unix::AsyncFd, Interest};
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let dev = SoftDevice::new();
//! let pd = dev.alloc_pd();
//! let (qa, qb) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
//! let a = AsyncRing::new(Ring::new(qa, RingConfig::default()), Wakeup::Reactor).unwrap();
//! let b = AsyncRing::new(Ring::new(qb, RingConfig::default()), Wakeup::Reactor).unwrap();
//!
//! // One small task per ring turns readiness of the completion channel
//! // into wake-ups. A `Driver` does not keep the ring open.
//! for ring in [&a, &b] {
//!     let driver = ring.driver();
//!     let channel = driver.completion_fd().unwrap();
//!     // SAFETY: a `CompletionFd` keeps its descriptor open while it lives.
//!     let fd = unsafe { AsyncFd::register_with_interest(channel, Interest::READABLE) }.unwrap();
//!     tokio::spawn(async move {
//!         while let Ok(mut ready) = fd.readable().await {
//!             // An error is reported, not the end: keep driving.
//!             if let Err(e) = driver.drive() {
//!                 eprintln!("driving the ring: {e}");
//!             }
//!             ready.clear_ready();
//!         }
//!     });
//! }
//!
//! let recv = b.recv(RegisteredBuf::new(&pd, vec![0u8; 16]).unwrap());
//! let send = a.send_imm(RegisteredBuf::new(&pd, b"hello".to_vec()).unwrap(), 7);
//! let ((sent, _), (got, buf)) = tokio::join!(send, recv);
//! sent.unwrap();
//! let got = got.unwrap();
//! assert_eq!((got.len, got.imm), (5, Some(7)));
//! assert_eq!(&buf[..5], b"hello");
//! # });
//! ```
//!
//! ## A reactor: async-io's `Async` (smol)
//!
//! ```
//! use rdma_ring::backend::soft::SoftDevice;
//! use rdma_ring::backend::QpConfig;
//! use rdma_ring::buf::{ExposedBuf, RegisteredBuf, RemoteAccess};
//! use rdma_ring::future::{AsyncRing, Wakeup};
//! use rdma_ring::ring::{Ring, RingConfig};
//!
//! smol::block_on(async {
//!     let dev = SoftDevice::new();
//!     let pd = dev.alloc_pd();
//!     let (qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
//!     let exposed = ExposedBuf::new(&pd, vec![5u8; 64], RemoteAccess::READ).unwrap();
//!     let ring = AsyncRing::new(Ring::new(qp, RingConfig::default()), Wakeup::Reactor).unwrap();
//!     let driver = ring.driver();
//!     let fd = smol::Async::new(driver.completion_fd().unwrap()).unwrap();
//!     let _task = smol::spawn(async move {
//!         while fd.readable().await.is_ok() {
//!             if let Err(e) = driver.drive() {
//!                 eprintln!("driving the ring: {e}");
//!             }
//!         }
//!     });
//!     let (result, buf) = ring.read(RegisteredBuf::new(&pd, vec![0u8; 64]).unwrap(), exposed.remote()).await;
//!     assert_eq!(result.unwrap(), 64);
//!     assert!(buf.iter().all(|&b| b == 5));
//! });
//! ```
//!
//! ## A notifier thread, for executors without a reactor
//!
//! ```
//! use rdma_ring::backend::soft::SoftDevice;
//! use rdma_ring::backend::QpConfig;
//! use rdma_ring::buf::{BaseBuf, ExposedBuf, RegisteredBuf, RemoteAccess};
//! use rdma_ring::future::{AsyncRing, Wakeup};
//! use rdma_ring::ring::{Ring, RingConfig};
//!
//! let dev = SoftDevice::new();
//! let pd = dev.alloc_pd();
//! let (qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
//! let counter = ExposedBuf::new(&pd, Box::new(41u64), RemoteAccess::ATOMIC).unwrap();
//! let ring = AsyncRing::new(Ring::new(qp, RingConfig::default()), Wakeup::Thread).unwrap();
//! let word = RegisteredBuf::new(&pd, Box::new(0u64)).unwrap().word(0).unwrap();
//! let (result, word) = futures::executor::block_on(
//!     ring.fetch_add(word, counter.remote().word(0).unwrap(), 1),
//! );
//! result.unwrap();
//! assert_eq!(word.get(), 41);
//! drop(ring);
//! assert_eq!(*counter.into_inner().unwrap(), 42);
//! ```

/// The eight awaitable operations, for a type with `op` and `op_as`.
macro_rules! awaitable_ops {
    () => {
        /// RDMA WRITE of `buf` to the start of `remote`.
        pub fn write<B: IoBuf>(&self, buf: B, remote: RemoteSlice) -> OpFuture<Q, B> {
            self.op(op::Write::new(buf, remote))
        }

        /// RDMA WRITE with immediate data.
        pub fn write_imm<B: IoBuf>(&self, buf: B, remote: RemoteSlice, imm: u32) -> OpFuture<Q, B> {
            self.op(op::WriteImm::new(buf, remote, imm))
        }

        /// RDMA READ of the start of `remote` into `buf`.
        pub fn read<B: IoBufMut>(&self, buf: B, remote: RemoteSlice) -> OpFuture<Q, B> {
            self.op(op::Read::new(buf, remote))
        }

        /// SEND of `buf`.
        pub fn send<B: IoBuf>(&self, buf: B) -> OpFuture<Q, B> {
            self.op(op::Send::new(buf))
        }

        /// SEND with immediate data.
        pub fn send_imm<B: IoBuf>(&self, buf: B, imm: u32) -> OpFuture<Q, B> {
            self.op(op::SendImm::new(buf, imm))
        }

        /// A receive into `buf`; resolves to what arrived.
        pub fn recv<B: IoBufMut>(&self, buf: B) -> OpFuture<Q, B, Received> {
            self.op_as(op::Recv::new(buf))
        }

        /// Compare-and-swap on a remote word; the old value lands in `word`.
        pub fn compare_swap<B: BaseBuf + IoBufMut>(
            &self,
            word: Word<B>,
            remote: RemoteWord,
            compare: u64,
            swap: u64,
        ) -> OpFuture<Q, Word<B>> {
            self.op(op::CompareSwap::new(word, remote, compare, swap))
        }

        /// Fetch-and-add on a remote word; the old value lands in `word`.
        pub fn fetch_add<B: BaseBuf + IoBufMut>(
            &self,
            word: Word<B>,
            remote: RemoteWord,
            add: u64,
        ) -> OpFuture<Q, Word<B>> {
            self.op(op::FetchAdd::new(word, remote, add))
        }
    };
}

mod driver;
mod fixed;
mod locked;
mod op_future;
mod qp;
mod ring;
mod stream;

use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::{Arc, Mutex, MutexGuard};

#[cfg(test)]
pub(crate) use driver::REFUSE_NEXT_SPAWN;
pub use driver::{CompletionFd, Driver};
pub use fixed::{AsyncFixedRing, FixedDriver, FixedOpFuture, SrqReceive};
pub use locked::LockedRing;
pub use op_future::{OpFuture, OpOutput, Received};
pub use qp::AsyncQp;
pub use ring::AsyncRing;
pub use stream::CompletionStream;

use crate::backend::{CompletionEvents, QueuePair};
use crate::error::Error;
use crate::ring::Ring;

/// How tasks awaiting operations are woken. See the [module docs](self).
///
/// ```
/// # use rdma_ring::backend::{soft::SoftDevice, QpConfig};
/// use rdma_ring::future::{AsyncRing, Wakeup};
/// use rdma_ring::ring::{Ring, RingConfig};
/// # let dev = SoftDevice::new();
/// # let pd = dev.alloc_pd();
/// let (qa, qb) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
/// // Busy polling needs no completion channel; a reactor watches one.
/// let busy = AsyncRing::new(Ring::new(qa, RingConfig::default()), Wakeup::Busy).unwrap();
/// assert!(busy.completion_fd().is_none());
/// let reactor = AsyncRing::new(Ring::new(qb, RingConfig::default()), Wakeup::Reactor).unwrap();
/// assert!(reactor.completion_fd().is_some());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wakeup {
    /// Pending futures poll the device on every poll and reschedule
    /// themselves at once.
    Busy,
    /// Your reactor watches [`AsyncRing::completion_fd`] and calls
    /// [`AsyncRing::drive`] when it is readable.
    Reactor,
    /// A notifier thread blocks on the completion channel and drives.
    Thread,
}

thread_local! {
    /// Wakers collected under a ring's lock, woken after it is released.
    static WAKES: std::cell::RefCell<Vec<std::task::Waker>> = const { std::cell::RefCell::new(Vec::new()) };
}

pub(crate) struct Shared<Q: QueuePair> {
    pub(crate) ring: Mutex<Ring<Q>>,
    pub(crate) wakeup: Wakeup,
    pub(crate) events: Option<Arc<dyn CompletionEvents>>,
    pub(crate) handles: AtomicUsize,
    pub(crate) stop: AtomicBool,
    /// Whether awaited sends, writes, reads and atomics wait for a shared
    /// doorbell (see [`AsyncRing::coalesce_doorbells`]).
    pub(crate) coalesce: AtomicBool,
    /// Awaited operations pushed and not submitted yet: they go out, with
    /// one doorbell per queue, at the next poll of an awaited operation
    /// among them (a future whose own operation is out leaves them to
    /// theirs), at a drive or a drop of one of their futures, or at once
    /// when [`DEFERRED_MAX`] wait.
    pub(crate) deferred: AtomicUsize,
    /// Whether the completion channel's last arm failed: until an arm
    /// succeeds, ticks drive the ring (see [`take_and_arm`]).
    pub(crate) unarmed: AtomicBool,
}

/// Takes the channel's pending events and arms it again, noting in
/// `unarmed` whether the arm failed: a channel left unarmed raises no
/// event, so whatever ticks must drive instead until an arm succeeds.
pub(crate) fn take_and_arm(
    events: &dyn CompletionEvents,
    unarmed: &AtomicBool,
) -> Result<(), Error> {
    let taken = events.take().map(drop);
    let armed = events.arm();
    unarmed.store(armed.is_err(), std::sync::atomic::Ordering::Release);
    taken.and(armed)
}

/// Awaited operations that may wait for a doorbell at most: the bound on
/// how long a push that nobody awaits stays unposted.
pub(crate) const DEFERRED_MAX: usize = 32;

/// Armed while a caller's closure runs on the locked ring: if the closure
/// panics, what it collected to wake (an awaited operation its reap
/// completed, say) is woken all the same once the unwinding released the
/// lock, as nothing else may wake it on a quiet ring. Defused (forgotten)
/// on the normal path, where it costs nothing.
struct WakeOnUnwind<'a, Q: QueuePair>(&'a Shared<Q>);

impl<Q: QueuePair> Drop for WakeOnUnwind<'_, Q> {
    fn drop(&mut self) {
        let mut ring = self.0.lock();
        let mut wakes = Vec::new();
        ring.take_wakes(&mut wakes);
        let let_go = ring.take_let_go();
        drop(ring);
        crate::wakers::wake_all(wakes);
        if let Some(let_go) = let_go {
            crate::wakers::drop_quietly(let_go);
        }
    }
}

impl<Q: QueuePair> Shared<Q> {
    pub(crate) fn lock(&self) -> MutexGuard<'_, Ring<Q>> {
        // The ring's state stays consistent across a panicking waker.
        self.ring.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `f` on the locked ring, then wakes the wakers it collected
    /// with the lock released (see `ring::lifecycle`).
    pub(crate) fn with<R>(&self, f: impl FnOnce(&mut Ring<Q>) -> R) -> R {
        // Declared before the lock's guard, so dropped after it: an
        // unwinding closure releases the lock first.
        let on_unwind = WakeOnUnwind(self);
        let mut ring = self.lock();
        let result = f(&mut ring);
        std::mem::forget(on_unwind);
        // Most calls leave nobody to wake: they skip the thread-local.
        if !ring.has_wakes() {
            return result;
        }
        // The thread's list is reused so the steady state allocates nothing;
        // a thread already destroying its thread-locals (a future dropped in
        // another thread-local's destructor) gets a list of its own.
        let mut wakes = WAKES.try_with(|cell| cell.take()).unwrap_or_default();
        ring.take_wakes(&mut wakes);
        let let_go = ring.take_let_go();
        drop(ring);
        crate::wakers::wake_all(wakes.drain(..));
        let _ = WAKES.try_with(|cell| cell.replace(wakes));
        if let Some(let_go) = let_go {
            crate::wakers::drop_quietly(let_go);
        }
        result
    }

    pub(crate) fn drive(&self) -> Result<usize, Error> {
        // Completions reach their futures even when the channel fails: a
        // failed arm is tried again by the next drive or tick.
        let channel = self.events.as_ref().map_or(Ok(()), |events| {
            take_and_arm(events.as_ref(), &self.unarmed)
        });
        let reaped = self.with(|ring| {
            self.submit_deferred(ring);
            let before = ring.stats().cqes;
            match ring.dispatch() {
                // Counted in the ring's stats, and no reason to stop
                // driving: a driver that stopped would strand every
                // future.
                Ok(_) | Err(Error::UnknownWrId { .. }) => {
                    Ok(usize::try_from(ring.stats().cqes - before).unwrap_or(usize::MAX))
                }
                Err(e) => Err(e),
            }
        });
        channel.and(reaped)
    }

    /// The ring's idle-time work, and a drive if the channel's last arm
    /// failed (no event would come to drive it).
    pub(crate) fn tick(&self) {
        self.with(|ring| ring.quiet_tick());
        if self.unarmed.load(std::sync::atomic::Ordering::Acquire) {
            let _ = self.drive();
        }
    }

    /// Whether coalesced operations wait for a doorbell.
    #[inline]
    pub(crate) fn holds_deferred(&self) -> bool {
        self.deferred.load(std::sync::atomic::Ordering::Acquire) > 0
    }

    /// Posts the awaited operations waiting for a doorbell, if any. What
    /// the device refuses goes back to its futures (flushed: never ran).
    pub(crate) fn submit_deferred(&self, ring: &mut Ring<Q>) {
        if self.holds_deferred() {
            let _ = self.submit_pushed(ring);
        }
    }

    /// Posts everything pushed (deferred operations included). What the
    /// device refuses goes back to its futures (flushed: never ran), and
    /// the refusal is returned.
    pub(crate) fn submit_pushed(&self, ring: &mut Ring<Q>) -> Option<crate::Error> {
        self.deferred.store(0, std::sync::atomic::Ordering::Release);
        match ring.submit() {
            Ok(_) => None,
            Err(e) => {
                ring.requeue_unposted(e.unposted);
                Some(e.error)
            }
        }
    }
}
