//! [`AsyncRing`]: a ring shared between tasks.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::driver::{notifier_loop, NotifierThread};
use super::{
    AsyncQp, CompletionFd, CompletionStream, Driver, LockedRing, OpFuture, Received, Shared, Wakeup,
};
use crate::backend::QueuePair;
use crate::buf::{BaseBuf, IoBuf, IoBufMut, RemoteSlice, RemoteWord, Word};
use crate::error::{Error, Rejected};
use crate::op::{self, Operation};
use crate::ring::{QpHandle, Ring, SrqHandle, SubmitError};

/// A [`Ring`] shared between tasks, with awaitable operations. Cloning
/// gives another handle; dropping the last handle closes the ring.
pub struct AsyncRing<Q: QueuePair + Send + 'static> {
    shared: Arc<Shared<Q>>,
    notifier: Option<Arc<NotifierThread>>,
}

impl<Q: QueuePair + Send + 'static> AsyncRing<Q> {
    /// Shares `ring`, woken as `wakeup` says. [`Wakeup::Reactor`] and
    /// [`Wakeup::Thread`] need a backend with a completion channel. If
    /// the notifier thread of [`Wakeup::Thread`] cannot start, the ring is
    /// closed (drained) and the error returned.
    pub fn new(ring: Ring<Q>, wakeup: Wakeup) -> Result<Self, Error> {
        // A ring handed back closes as it drops.
        Self::new_or_back(ring, wakeup).map_err(|(e, _ring)| e)
    }

    /// [`new`](Self::new), handing the ring back with the error when it
    /// cannot be shared (for a caller that has more to do with it first,
    /// as a stream delivering what was written).
    pub(crate) fn new_or_back(
        mut ring: Ring<Q>,
        wakeup: Wakeup,
    ) -> Result<Self, (Error, Box<Ring<Q>>)> {
        let events = match wakeup {
            Wakeup::Busy => None,
            Wakeup::Reactor | Wakeup::Thread => match ring.cq_channel() {
                Some(events) => Some(events),
                None => {
                    let e = Error::Soft(
                        "this completion queue has no completion channel; use Wakeup::Busy",
                    );
                    return Err((e, Box::new(ring)));
                }
            },
        };
        if let Some(events) = &events {
            if let Err(e) = events.arm() {
                return Err((e, Box::new(ring)));
            }
        }
        let shared = Arc::new(Shared {
            ring: Mutex::new(ring),
            wakeup,
            events,
            handles: AtomicUsize::new(1),
            stop: AtomicBool::new(false),
            coalesce: AtomicBool::new(false),
            deferred: AtomicUsize::new(0),
            unarmed: AtomicBool::new(false),
        });
        let notifier = (wakeup == Wakeup::Thread).then(|| {
            let shared = Arc::clone(&shared);
            NotifierThread::spawn(move || {
                notifier_loop(
                    shared.events.clone(),
                    &shared.stop,
                    || shared.drive().is_ok(),
                    || shared.tick(),
                )
            })
        });
        match notifier.transpose() {
            Ok(notifier) => Ok(AsyncRing { shared, notifier }),
            // The failed spawn dropped the thread's closure, and with it
            // the only other handle on `shared`.
            Err(e) => match Arc::try_unwrap(shared) {
                Ok(shared) => {
                    let ring = shared.ring.into_inner().unwrap_or_else(|p| p.into_inner());
                    Err((e, Box::new(ring)))
                }
                Err(_) => unreachable!("the failed spawn kept no handle"),
            },
        }
    }

    /// The completion channel's descriptor, for your reactor
    /// ([`Wakeup::Reactor`]); `None` without a channel.
    pub fn completion_fd(&self) -> Option<CompletionFd> {
        self.shared.events.clone().map(CompletionFd)
    }

    /// Takes pending completion events, re-arms the channel, then moves
    /// every completion to its future (waking it). Call it whenever the
    /// completion descriptor is readable. Returns how many CQEs it reaped;
    /// a CQE that names no operation of the ring is counted in
    /// [`RingStats::unknown_cqes`](crate::ring::RingStats::unknown_cqes),
    /// not returned as an error.
    ///
    /// An error (the channel or the device failed) is reported once the
    /// completions that could be reaped reached their futures; keep
    /// driving: a driver that stops strands every pending future (pause
    /// a little after an error: a channel whose device is gone may stay
    /// readable). After a failed arm, [`tick`](Self::tick) drives until
    /// an arm succeeds.
    pub fn drive(&self) -> Result<usize, Error> {
        self.shared.drive()
    }

    /// The ring's idle-time work, for a reactor's timer: none of it raises
    /// a completion event, so a reactor that drives only when the
    /// descriptor is readable never does it. With [`Wakeup::Reactor`],
    /// call it every 100 ms or so (the notifier thread of
    /// [`Wakeup::Thread`] does, every 250 ms; busy polling does
    /// it as it polls). It
    ///
    /// * tries again a sync marker the device refused: after a post the
    ///   device took only in part, the completion of the part it took
    ///   comes through that marker, and their futures wait for it;
    /// * reads the device's async events, if the ring watches them
    ///   ([`Ring::watch_events`]);
    /// * asks one queue pair (in turn) whether its peer left, which is how
    ///   an rdma_cm disconnect fails its queue pair.
    ///
    /// Cheap when there is nothing to do.
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::SoftDevice, QpConfig};
    /// # use rdma_ring::future::{AsyncRing, Wakeup};
    /// # use rdma_ring::ring::{Ring, RingConfig};
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// # let (qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    /// let ring = AsyncRing::new(Ring::new(qp, RingConfig::default()), Wakeup::Reactor).unwrap();
    /// // On the reactor's timer, beside `drive` on readiness:
    /// ring.tick();
    /// ```
    pub fn tick(&self) {
        self.shared.tick();
    }

    /// A handle that can [`drive`](Driver::drive) the ring (from a reactor
    /// task) without keeping it open: the ring still closes when the last
    /// [`AsyncRing`] handle drops.
    pub fn driver(&self) -> Driver<Q> {
        Driver {
            shared: Arc::clone(&self.shared),
        }
    }

    /// Pushes `op` to the default queue pair and submits it at once (one
    /// doorbell; or with others, see
    /// [`coalesce_doorbells`](Self::coalesce_doorbells)); the future
    /// resolves to the result and the buffer. A refused push resolves at
    /// once with the error and the buffer.
    pub fn op<T: Operation>(&self, op: T) -> OpFuture<Q, T::Buf> {
        self.shared.op_on(None, op)
    }

    /// Pushes `op` to the default queue pair without submitting: push
    /// several, then [`submit`] them with one doorbell, then await them.
    /// A future awaited, or dropped, before the submit posts what was
    /// pushed, its own operation included, with one doorbell: nothing
    /// pushed waits for a later, unrelated submit.
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::SoftDevice, QpConfig};
    /// # use rdma_ring::buf::{ExposedBuf, RegisteredBuf, RemoteAccess};
    /// # use rdma_ring::future::{AsyncRing, Wakeup};
    /// # use rdma_ring::op::Write;
    /// # use rdma_ring::ring::{Ring, RingConfig};
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// # let (qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    /// # let target = ExposedBuf::new(&pd, vec![0u8; 2], RemoteAccess::WRITE).unwrap();
    /// let ring = AsyncRing::new(Ring::new(qp, RingConfig::default()), Wakeup::Busy).unwrap();
    /// let (x, y) = (target.remote().slice(0..1).unwrap(), target.remote().slice(1..2).unwrap());
    /// let a = ring.push(Write::new(RegisteredBuf::new(&pd, b"a".to_vec()).unwrap(), x));
    /// let b = ring.push(Write::new(RegisteredBuf::new(&pd, b"b".to_vec()).unwrap(), y));
    /// ring.submit().unwrap(); // one doorbell for both
    /// let ((wrote_a, _), (wrote_b, _)) = futures::executor::block_on(futures::future::join(a, b));
    /// assert_eq!((wrote_a.unwrap(), wrote_b.unwrap()), (1, 1));
    /// assert_eq!(ring.with_ring(|r| r.stats().doorbells), 1);
    /// ```
    ///
    /// [`submit`]: Self::submit
    pub fn push<T: Operation>(&self, op: T) -> OpFuture<Q, T::Buf> {
        self.shared.push_on(None, op)
    }

    /// With `on`, awaited sends, writes, reads and atomics
    /// ([`op`](Self::op) and the methods built on it) no longer ring a
    /// doorbell each: they are posted together — one doorbell per queue —
    /// by the second poll of a future whose operation is among them, or a
    /// drive of the ring, or as soon as 32 wait. A future's first poll
    /// yields once while operations wait (it wakes its own task, so the
    /// delay is one round of the executor): the tasks polled in that round
    /// add theirs to the same doorbell. Operations that many tasks push
    /// before anyone awaits, or push again as their previous ones
    /// complete, then share one doorbell. Receives are always posted at once
    /// (a peer may be about to send); so is an operation whose future is
    /// dropped unpolled. Off by default: with it on, an operation is not
    /// posted until its own future (or that of another operation waiting
    /// with it) is polled a second time, the ring is driven, or 32 wait —
    /// in `let w = ring.send(x); other.await; w.await` the send leaves
    /// only after `other` is done, so if `other` waits for the peer's
    /// answer to it, it waits for ever: await `w` first (or join them), or
    /// leave coalescing off.
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::SoftDevice, QpConfig};
    /// # use rdma_ring::buf::{BufferPool, ExposedBuf, RemoteAccess};
    /// # use rdma_ring::future::{AsyncRing, Wakeup};
    /// # use rdma_ring::ring::{Ring, RingConfig};
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// # let (qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    /// # let exposed = ExposedBuf::new(&pd, vec![0u8; 16 * 64], RemoteAccess::WRITE).unwrap();
    /// # let pool = BufferPool::new(&pd, 64, 16).unwrap();
    /// let ring = AsyncRing::new(Ring::new(qp, RingConfig::default()), Wakeup::Busy).unwrap();
    /// ring.coalesce_doorbells(true);
    /// let writes: Vec<_> = (0..16u64)
    ///     .map(|i| ring.write(pool.take().unwrap(), exposed.remote().slice(i * 64..(i + 1) * 64).unwrap()))
    ///     .collect();
    /// for (result, _buf) in futures::executor::block_on(futures::future::join_all(writes)) {
    ///     result.unwrap();
    /// }
    /// assert_eq!(ring.with_ring(|r| r.stats().doorbells), 1);
    /// ```
    pub fn coalesce_doorbells(&self, on: bool) {
        self.shared
            .coalesce
            .store(on, std::sync::atomic::Ordering::Release);
        if !on {
            self.shared.with(|ring| self.shared.submit_deferred(ring));
        }
    }

    /// Posts everything pushed since the last submit, on every queue: one
    /// doorbell per queue with work.
    pub fn submit(&self) -> Result<usize, SubmitError> {
        self.shared.with(|ring| {
            self.shared.deferred.store(0, Ordering::Release);
            ring.submit()
        })
    }

    /// Attaches a queue pair created on the ring's completion queue (see
    /// [`Ring::attach`]); its operations are awaited through the returned
    /// [`AsyncQp`], driven by the same driver as every other.
    pub fn attach(&self, qp: Q) -> Result<AsyncQp<Q>, Rejected<Q>> {
        let handle = self.shared.with(|ring| ring.attach(qp))?;
        Ok(AsyncQp::new(Arc::clone(&self.shared), handle))
    }

    /// The awaitable side of an attached queue pair.
    pub fn qp(&self, qp: QpHandle) -> AsyncQp<Q> {
        AsyncQp::new(Arc::clone(&self.shared), qp)
    }

    /// A receive posted to shared receive queue `srq` (see
    /// [`Ring::add_srq`]); resolves to what arrived, with the queue pair
    /// that consumed it in [`Received::qp`].
    pub fn srq_recv<B: IoBufMut>(&self, srq: SrqHandle, buf: B) -> OpFuture<Q, B, Received> {
        self.shared.srq_recv(srq, buf)
    }

    /// Runs `f` on the ring, locked: push operations whose completions go
    /// to [`completions`](Self::completions), read stats, and so on. The
    /// ring is lent as a [`LockedRing`], never as `&mut Ring`, so it
    /// cannot be swapped or replaced under the futures that own
    /// operations in it. `f` must not use this ring's handles (nor drop a
    /// future of it): the lock is held, and taking it again deadlocks.
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
        self.shared.with(|ring| {
            f(LockedRing {
                ring,
                deferred: &self.shared.deferred,
            })
        })
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

    /// Closes the ring now: every queue pair moves to error and every pending
    /// future resolves with a flush error and its buffer. This waits, with
    /// the ring locked, up to the ring's `drain_timeout` for the device to
    /// flush; operations it does not return by then are leaked (never freed
    /// under the NIC) and their futures stay pending.
    pub fn close(&self) {
        self.shared.with(|ring| {
            // Coalesced operations were pushed before the close: they go
            // out first, as they would have without coalescing.
            self.shared.submit_deferred(ring);
            ring.shutdown_in_place()
        });
    }

    fn op_as<T: Operation, O>(&self, op: T) -> OpFuture<Q, T::Buf, O> {
        self.shared.op_on(None, op)
    }

    awaitable_ops!();
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
        self.shared.with(|ring| {
            self.shared.submit_deferred(ring);
            ring.shutdown_in_place()
        });
        self.shared.stop.store(true, Ordering::Release);
        if let Some(notifier) = &self.notifier {
            notifier.join();
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
