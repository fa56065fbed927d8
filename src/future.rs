//! Futures adapters: await any operation on any executor.
//!
//! [`AsyncRing`] shares a [`Ring`] between tasks. Each operation method
//! (`write`, `read`, `send`, `recv`, …) pushes and submits at once and
//! returns an [`OpFuture`] that owns the operation: awaiting it gives
//! `(result, buffer)`, the buffer back whatever happened. Built on
//! `futures-core` only; no executor is a dependency.
//!
//! # Ownership and cancel safety
//!
//! The buffer moves into the ring when the operation is pushed. Dropping
//! the future before completion marks the operation orphaned: the buffer
//! is released when its completion is reaped, never while the device may
//! still use it. Dropping the last [`AsyncRing`] handle closes the ring:
//! the queue pair moves to error, and futures still pending resolve with
//! a flush error (and their buffers) instead of hanging.
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
//!   calls [`AsyncRing::drive`] whenever it is readable. Idle costs
//!   nothing. For async services.
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
//!             driver.drive().unwrap();
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
//!             driver.drive().unwrap();
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

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::thread::JoinHandle;
use std::time::Duration;

use futures_core::Stream;

use crate::backend::{CompletionEvents, QueuePair};
use crate::buf::{BaseBuf, IoBuf, IoBufMut, RemoteSlice, RemoteWord, Word};
use crate::error::Error;
use crate::op::{self, Operation};
use crate::ring::{Completion, Key, Ring, SubmitError};

/// How tasks awaiting operations are woken. See the [module docs](self).
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

struct Shared<Q: QueuePair> {
    ring: Mutex<Ring<Q>>,
    wakeup: Wakeup,
    events: Option<Arc<dyn CompletionEvents>>,
    handles: AtomicUsize,
    stop: AtomicBool,
}

impl<Q: QueuePair> Shared<Q> {
    fn lock(&self) -> MutexGuard<'_, Ring<Q>> {
        // The ring's state stays consistent across a panicking waker.
        self.ring.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `f` on the locked ring, then wakes the wakers it collected
    /// with the lock released (see `ring::lifecycle`).
    fn with<R>(&self, f: impl FnOnce(&mut Ring<Q>) -> R) -> R {
        // The thread's list is reused so the steady state allocates nothing;
        // a thread already destroying its thread-locals (a future dropped in
        // another thread-local's destructor) gets a list of its own.
        let mut wakes = WAKES.try_with(|cell| cell.take()).unwrap_or_default();
        let result = {
            let mut ring = self.lock();
            let result = f(&mut ring);
            ring.take_wakes(&mut wakes);
            result
        };
        for waker in wakes.drain(..) {
            waker.wake();
        }
        let _ = WAKES.try_with(|cell| cell.replace(wakes));
        result
    }

    fn drive(&self) -> Result<usize, Error> {
        if let Some(events) = &self.events {
            events.take()?;
            events.arm()?;
        }
        self.with(|ring| ring.dispatch())
    }
}

/// A [`Ring`] shared between tasks, with awaitable operations. Cloning
/// gives another handle; dropping the last handle closes the ring.
pub struct AsyncRing<Q: QueuePair + Send + 'static> {
    shared: Arc<Shared<Q>>,
    notifier: Option<Arc<NotifierThread>>,
}

struct NotifierThread {
    handle: Mutex<Option<JoinHandle<()>>>,
}

impl<Q: QueuePair + Send + 'static> AsyncRing<Q> {
    /// Shares `ring`, woken as `wakeup` says. [`Wakeup::Reactor`] and
    /// [`Wakeup::Thread`] need a backend with a completion channel.
    pub fn new(ring: Ring<Q>, wakeup: Wakeup) -> Result<Self, Error> {
        let events = match wakeup {
            Wakeup::Busy => None,
            Wakeup::Reactor | Wakeup::Thread => Some(ring.qp().completion_events().ok_or(
                Error::Soft("this queue pair has no completion channel; use Wakeup::Busy"),
            )?),
        };
        if let Some(events) = &events {
            events.arm()?;
        }
        let shared = Arc::new(Shared {
            ring: Mutex::new(ring),
            wakeup,
            events,
            handles: AtomicUsize::new(1),
            stop: AtomicBool::new(false),
        });
        let notifier = (wakeup == Wakeup::Thread).then(|| {
            let shared = Arc::clone(&shared);
            let handle = std::thread::Builder::new()
                .name("rdma-ring-notifier".into())
                .spawn(move || notifier_loop(&shared))
                .expect("spawning the notifier thread");
            Arc::new(NotifierThread {
                handle: Mutex::new(Some(handle)),
            })
        });
        Ok(AsyncRing { shared, notifier })
    }

    /// The completion channel's descriptor, for your reactor
    /// ([`Wakeup::Reactor`]); `None` without a channel.
    pub fn completion_fd(&self) -> Option<CompletionFd> {
        self.shared.events.clone().map(CompletionFd)
    }

    /// Takes pending completion events, re-arms the channel, then moves
    /// every completion to its future (waking it). Call it whenever the
    /// completion descriptor is readable. Returns how many CQEs it reaped.
    pub fn drive(&self) -> Result<usize, Error> {
        self.shared.drive()
    }

    /// A handle that can [`drive`](Driver::drive) the ring (from a reactor
    /// task) without keeping it open: the ring still closes when the last
    /// [`AsyncRing`] handle drops.
    pub fn driver(&self) -> Driver<Q> {
        Driver {
            shared: Arc::clone(&self.shared),
        }
    }

    /// Pushes `op` and submits it at once (one doorbell); the future
    /// resolves to the result and the buffer. A refused push resolves at
    /// once with the error and the buffer.
    pub fn op<T: Operation>(&self, op: T) -> OpFuture<Q, T::Buf> {
        let future = self.push(op);
        if future.key().is_some() {
            // Awaited operations the device refused resolve through their
            // futures (flushed: they never ran); operations pushed for the
            // completion queue go to it, so nothing is lost.
            self.shared.with(|ring| {
                if let Err(e) = ring.submission().submit() {
                    ring.requeue_unposted(e.unposted);
                }
            });
        }
        future
    }

    /// Pushes `op` without submitting: push several, then [`submit`] them
    /// with one doorbell, then await them.
    ///
    /// [`submit`]: Self::submit
    pub fn push<T: Operation>(&self, op: T) -> OpFuture<Q, T::Buf> {
        let state = self.shared.with(|ring| match ring.push_awaited(op) {
            Ok(key) => State::InFlight(key),
            Err(rejected) => {
                let (error, op) = rejected.into_parts();
                State::Failed(Some((error, op.into_buf())))
            }
        });
        OpFuture {
            shared: Arc::clone(&self.shared),
            state,
            _out: PhantomData,
        }
    }

    /// Posts everything pushed since the last submit, with one doorbell.
    pub fn submit(&self) -> Result<usize, SubmitError> {
        self.shared.with(|ring| ring.submission().submit())
    }

    /// Runs `f` on the ring, locked: push operations whose completions go
    /// to [`completions`](Self::completions), read stats, and so on. The
    /// ring is lent as a [`LockedRing`], never as `&mut Ring`, so it
    /// cannot be swapped or replaced under the futures that own
    /// operations in it.
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::SoftDevice, QpConfig};
    /// # use rdma_ring::future::{AsyncRing, Wakeup};
    /// # use rdma_ring::ring::{Ring, RingConfig};
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// # let (qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    /// let ring = AsyncRing::new(Ring::new(qp, RingConfig::default()), Wakeup::Busy).unwrap();
    /// assert_eq!(ring.with_ring(|r| r.stats().doorbells), 0);
    /// ```
    pub fn with_ring<R>(&self, f: impl FnOnce(LockedRing<'_, Q>) -> R) -> R {
        self.shared.with(|ring| f(LockedRing { ring }))
    }

    /// A stream of the completions of operations pushed through
    /// [`with_ring`](Self::with_ring) (not of awaited ones), for users who
    /// batch and reap asynchronously. It ends once the ring is closed and
    /// drained.
    pub fn completions(&self) -> CompletionStream<Q> {
        CompletionStream {
            shared: Arc::clone(&self.shared),
        }
    }

    /// Closes the ring now: the queue pair moves to error and every pending
    /// future resolves with a flush error and its buffer. This waits, with
    /// the ring locked, up to the ring's `drain_timeout` for the device to
    /// flush; operations it does not return by then are leaked (never freed
    /// under the NIC) and their futures stay pending.
    pub fn close(&self) {
        self.shared.with(|ring| ring.shutdown_in_place());
    }

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
        let future = self.op(op::Recv::new(buf));
        OpFuture {
            shared: Arc::clone(&future.shared),
            state: future.take_state(),
            _out: PhantomData,
        }
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
}

fn notifier_loop<Q: QueuePair>(shared: &Shared<Q>) {
    let Some(events) = shared.events.clone() else {
        return;
    };
    while !shared.stop.load(Ordering::Acquire) {
        match events.wait(Duration::from_millis(50)) {
            Ok(true) => {
                let _ = shared.drive();
            }
            Ok(false) => {}
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

impl<Q: QueuePair + Send + 'static> Clone for AsyncRing<Q> {
    fn clone(&self) -> Self {
        self.shared.handles.fetch_add(1, Ordering::AcqRel);
        AsyncRing {
            shared: Arc::clone(&self.shared),
            notifier: self.notifier.clone(),
        }
    }
}

impl<Q: QueuePair + Send + 'static> Drop for AsyncRing<Q> {
    fn drop(&mut self) {
        if self.shared.handles.fetch_sub(1, Ordering::AcqRel) != 1 {
            return;
        }
        self.shared.with(|ring| ring.shutdown_in_place());
        self.shared.stop.store(true, Ordering::Release);
        if let Some(notifier) = &self.notifier {
            let handle = notifier
                .handle
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take();
            if let Some(handle) = handle {
                if handle.thread().id() != std::thread::current().id() {
                    let _ = handle.join();
                }
            }
        }
    }
}

impl<Q: QueuePair + Send + 'static> fmt::Debug for AsyncRing<Q> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AsyncRing")
            .field("wakeup", &self.shared.wakeup)
            .field("ring", &*self.shared.lock())
            .finish()
    }
}

/// A ring shared by an [`AsyncRing`], lent by [`AsyncRing::with_ring`]
/// while its lock is held. It reads as a `&Ring` and hands out the
/// submission and completion sides; it never hands out `&mut Ring`, which
/// would let safe code swap the ring out from under pending futures.
///
/// Swapping two lent rings does not compile:
///
/// ```compile_fail
/// # use rdma_ring::backend::{soft::SoftDevice, QpConfig};
/// # use rdma_ring::future::{AsyncRing, Wakeup};
/// # use rdma_ring::ring::{Ring, RingConfig};
/// # let dev = SoftDevice::new();
/// # let pd = dev.alloc_pd();
/// # let (qa, qb) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
/// let a = AsyncRing::new(Ring::new(qa, RingConfig::default()), Wakeup::Busy).unwrap();
/// let b = AsyncRing::new(Ring::new(qb, RingConfig::default()), Wakeup::Busy).unwrap();
/// a.with_ring(|mut ra| b.with_ring(|mut rb| std::mem::swap(&mut *ra, &mut *rb)));
/// ```
pub struct LockedRing<'a, Q: QueuePair> {
    ring: &'a mut Ring<Q>,
}

impl<Q: QueuePair> LockedRing<'_, Q> {
    /// The submission side: push operations whose completions go to the
    /// [`CompletionStream`] (or to [`completion`](Self::completion)).
    pub fn submission(&mut self) -> crate::ring::SubmissionQueue<'_, Q> {
        self.ring.submission()
    }

    /// The completion side, for operations pushed through
    /// [`submission`](Self::submission). Awaited operations are not
    /// reaped here: their CQEs go to their futures.
    pub fn completion(&mut self) -> crate::ring::CompletionQueue<'_, Q> {
        self.ring.completion()
    }
}

impl<Q: QueuePair> std::ops::Deref for LockedRing<'_, Q> {
    type Target = Ring<Q>;
    fn deref(&self) -> &Ring<Q> {
        self.ring
    }
}

impl<Q: QueuePair> fmt::Debug for LockedRing<'_, Q> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.ring.fmt(f)
    }
}

/// Drives a ring from a reactor task; see [`AsyncRing::driver`].
///
/// The [module docs](self) show driver tasks for tokio and smol.
pub struct Driver<Q: QueuePair> {
    shared: Arc<Shared<Q>>,
}

impl<Q: QueuePair> Driver<Q> {
    /// See [`AsyncRing::drive`].
    pub fn drive(&self) -> Result<usize, Error> {
        self.shared.drive()
    }

    /// See [`AsyncRing::completion_fd`].
    pub fn completion_fd(&self) -> Option<CompletionFd> {
        self.shared.events.clone().map(CompletionFd)
    }
}

impl<Q: QueuePair> Clone for Driver<Q> {
    fn clone(&self) -> Self {
        Driver {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<Q: QueuePair> fmt::Debug for Driver<Q> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Driver")
            .field("wakeup", &self.shared.wakeup)
            .finish()
    }
}

/// The completion channel's descriptor, for a reactor: implements
/// `AsRawFd` (tokio `AsyncFd`) and `AsFd` (async-io `Async`).
#[derive(Clone)]
pub struct CompletionFd(Arc<dyn CompletionEvents>);

impl AsFd for CompletionFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

impl AsRawFd for CompletionFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_fd().as_raw_fd()
    }
}

impl fmt::Debug for CompletionFd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("CompletionFd")
            .field(&self.as_raw_fd())
            .finish()
    }
}

/// What a receive got.
///
/// ```
/// use rdma_ring::future::Received;
/// let r = Received { len: 5, imm: Some(7), write_imm: false };
/// assert_eq!(r.imm, Some(7));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Received {
    /// Bytes that arrived (for a WRITE with immediate: bytes written).
    pub len: usize,
    /// Immediate data, if the sender sent some.
    pub imm: Option<u32>,
    /// Whether an RDMA WRITE with immediate consumed the receive (the
    /// buffer is untouched) rather than a SEND.
    pub write_imm: bool,
}

/// How a finished operation's result is presented.
pub trait OpOutput: Sized {
    #[doc(hidden)]
    fn from_completion(c: &Completion) -> Result<Self, Error>;
}

impl OpOutput for usize {
    fn from_completion(c: &Completion) -> Result<Self, Error> {
        c.result()
    }
}

impl OpOutput for Received {
    fn from_completion(c: &Completion) -> Result<Self, Error> {
        c.result().map(|len| Received {
            len,
            imm: c.imm(),
            write_imm: c.is_write_imm(),
        })
    }
}

enum State<B> {
    InFlight(Key),
    Failed(Option<(Error, B)>),
    Done,
}

/// An operation in flight; resolves to `(result, buffer)`. Dropping it
/// early is safe: the buffer is released when the device is done with it.
#[must_use = "an operation's buffer comes back only through its future"]
pub struct OpFuture<Q: QueuePair, B, O = usize> {
    shared: Arc<Shared<Q>>,
    state: State<B>,
    _out: PhantomData<fn() -> O>,
}

impl<Q: QueuePair, B, O> OpFuture<Q, B, O> {
    fn key(&self) -> Option<Key> {
        match self.state {
            State::InFlight(key) => Some(key),
            _ => None,
        }
    }

    fn take_state(mut self) -> State<B> {
        std::mem::replace(&mut self.state, State::Done)
    }
}

// Nothing in the future is ever pinned in place (the buffer moves out on
// completion), so it is `Unpin` whatever the buffer type.
impl<Q: QueuePair, B, O> Unpin for OpFuture<Q, B, O> {}

impl<Q: QueuePair, B: IoBuf, O: OpOutput> Future for OpFuture<Q, B, O> {
    type Output = (Result<O, Error>, B);

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        match &mut this.state {
            State::Failed(failed) => {
                let (error, buf) = failed.take().expect("polled after completion");
                this.state = State::Done;
                Poll::Ready((Err(error), buf))
            }
            State::Done => panic!("OpFuture polled after completion"),
            State::InFlight(key) => {
                let key = *key;
                // Unknown CQEs are counted in the ring's stats; they cannot
                // belong to this operation.
                let polled = this.shared.with(|ring| {
                    let _ = ring.dispatch();
                    ring.poll_awaited(key, cx.waker())
                });
                match polled {
                    Some(completion) => {
                        this.state = State::Done;
                        let result = O::from_completion(&completion);
                        let buf = B::from_owned(completion.into_buf()).unwrap_or_else(|_| {
                            unreachable!("the ring hands back the buffer type it was given")
                        });
                        Poll::Ready((result, buf))
                    }
                    None => {
                        if this.shared.wakeup == Wakeup::Busy {
                            cx.waker().wake_by_ref();
                        }
                        Poll::Pending
                    }
                }
            }
        }
    }
}

impl<Q: QueuePair, B, O> Drop for OpFuture<Q, B, O> {
    fn drop(&mut self) {
        if let State::InFlight(key) = self.state {
            self.shared.with(|ring| ring.orphan(key));
        }
    }
}

impl<Q: QueuePair, B, O> fmt::Debug for OpFuture<Q, B, O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match self.state {
            State::InFlight(_) => "in flight",
            State::Failed(_) => "refused",
            State::Done => "done",
        };
        f.debug_struct("OpFuture").field("state", &state).finish()
    }
}

/// The completions of operations pushed through [`AsyncRing::with_ring`].
pub struct CompletionStream<Q: QueuePair> {
    shared: Arc<Shared<Q>>,
}

impl<Q: QueuePair> Stream for CompletionStream<Q> {
    type Item = Completion;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Completion>> {
        let polled = self.shared.with(|ring| {
            let _ = ring.dispatch();
            if let Some(c) = ring.pop_ready() {
                return Poll::Ready(Some(c));
            }
            if ring.stream_ended() {
                return Poll::Ready(None);
            }
            ring.set_ready_waker(cx.waker());
            Poll::Pending
        });
        if polled.is_pending() && self.shared.wakeup == Wakeup::Busy {
            cx.waker().wake_by_ref();
        }
        polled
    }
}

impl<Q: QueuePair> fmt::Debug for CompletionStream<Q> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompletionStream").finish_non_exhaustive()
    }
}
