//! [`AsyncFixedRing`]: the fixed-buffer ring shared between tasks, with
//! awaitable operations.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

mod incoming;

use self::incoming::Incoming;
pub use self::incoming::SrqReceive;
use super::driver::{notifier_loop, NotifierThread};
use super::{CompletionFd, Wakeup, DEFERRED_MAX, WAKES};
use crate::backend::{AsyncEvent, CompletionEvents, CompletionQueue, QueuePair, WcStatus};
use crate::error::{Error, Rejected};
use crate::fixed::{
    CompletionSink, FixedBuf, FixedBufs, FixedCompletion, FixedOp, FixedQp, FixedRing, FixedSrq,
    RecvFixed,
};

/// A [`FixedRing`] shared between tasks: every operation pushed through
/// it is a [`FixedOpFuture`] that resolves to the operation's
/// [`FixedCompletion`] (the slot's token back, with the outcome).
/// Cloning gives another handle; dropping the last handle closes the
/// ring.
///
/// Pushes are batched as the ring batches them: [`push`](Self::push)
/// only queues, and the first poll of a future whose operation is still
/// unposted posts everything pushed (one doorbell per queue pair), so
/// operations pushed before they are awaited share a doorbell — or post
/// them yourself with [`submit`](Self::submit). Tasks that each push an
/// operation and await it share doorbells with
/// [`coalesce_doorbells`](Self::coalesce_doorbells). Tasks are woken as
/// [`Wakeup`] says, as for [`AsyncRing`](super::AsyncRing); a pending
/// future also polls the completion queue itself whenever it is polled.
///
/// The adapter tags each operation with its own `user_data` to route the
/// completion; the completion a future resolves to carries the tag the
/// operation was built with.
///
/// Dropping a future before it resolves does not cancel the operation: its
/// slot comes back to the ring's free slots ([`take_buf`](Self::take_buf))
/// when its completion is reaped, never while the device may still use
/// it. Closing the ring ([`close`](Self::close), or dropping the last
/// handle) moves every queue pair to error and drains it, so pending
/// futures resolve with their flushed completions; a future whose
/// completion the device never gives back (the drain timed out, and the
/// slots' memory is leaked rather than freed under the NIC) resolves with
/// [`Error::Closed`].
///
/// ```
/// use rdma_ring::backend::{soft::SoftDevice, QpConfig, QueuePair};
/// use rdma_ring::buf::{ExposedBuf, RemoteAccess};
/// use rdma_ring::fixed::{FixedBufs, FixedRing, FixedRingConfig, WriteFixed};
/// use rdma_ring::future::{AsyncFixedRing, Wakeup};
///
/// let dev = SoftDevice::new();
/// let pd = dev.alloc_pd();
/// let (mut qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
/// let target = ExposedBuf::new(&pd, vec![0u8; 4 * 64], RemoteAccess::WRITE).unwrap();
/// let cq = qp.take_cq().unwrap();
/// let ring = FixedRing::new(cq, FixedBufs::new(&pd, 4, 64).unwrap(), FixedRingConfig::default());
/// let ring = AsyncFixedRing::new(ring, Wakeup::Busy).unwrap();
/// let conn = ring.attach(qp).unwrap();
///
/// futures::executor::block_on(async {
///     // Four writes pushed, then awaited: one doorbell for the four.
///     let mut writes = Vec::new();
///     for i in 0..4u64 {
///         let mut slot = ring.take_buf().unwrap();
///         ring.with_bufs(|bufs| bufs.bytes_mut(&mut slot).fill(i as u8 + 1)).unwrap();
///         let target = target.remote().slice(i * 64..(i + 1) * 64).unwrap();
///         writes.push(ring.push(conn, WriteFixed::new(slot, 64, target).user_data(i)).unwrap());
///     }
///     for (i, write) in writes.into_iter().enumerate() {
///         let done = write.await.unwrap();
///         assert!(done.status().is_success());
///         assert_eq!(done.user_data(), i as u64); // the operation's own tag
///         ring.put_buf(done.into_buf()).unwrap();
///     }
/// });
/// drop(ring);
/// let bytes = target.into_inner().unwrap();
/// assert!(bytes[..64].iter().all(|&b| b == 1) && bytes[192..].iter().all(|&b| b == 4));
/// ```
pub struct AsyncFixedRing<Q: QueuePair + Send + 'static> {
    shared: Arc<FixedShared<Q>>,
    notifier: Option<Arc<NotifierThread>>,
}

struct FixedShared<Q: QueuePair> {
    inner: Mutex<Inner<Q>>,
    wakeup: Wakeup,
    events: Option<Arc<dyn CompletionEvents>>,
    handles: AtomicUsize,
    stop: AtomicBool,
    /// Whether the channel's last arm failed (see
    /// [`take_and_arm`](super::take_and_arm)).
    unarmed: AtomicBool,
}

/// Where one pushed operation stands, by its tag.
enum OpState {
    /// The tag is free.
    Free,
    /// In the ring, pushed before submit number `batch`; its future waits
    /// (with the operation's own tag). A receive is never left for a
    /// shared doorbell (a peer may be about to send).
    Waiting {
        waker: Option<Waker>,
        user_data: u64,
        batch: u64,
        recv: bool,
    },
    /// Completed; its future has not taken the completion yet.
    Done(FixedCompletion),
    /// In the ring; its future was dropped, so the slot goes back to the
    /// free slots when the completion comes.
    Orphaned,
}

/// Why no completion comes any more.
#[derive(Clone, Copy, Debug)]
enum Ended {
    Closed,
    Failed(&'static str),
}

impl Ended {
    fn error(self) -> Error {
        match self {
            Ended::Closed => Error::Closed,
            Ended::Failed(why) => Error::RingFailed(why),
        }
    }
}

/// The futures' side of the state: where each pushed operation stands,
/// by tag, and what a reap leaves to do once the ring is let go.
#[derive(Default)]
struct Futures {
    ops: Vec<OpState>,
    free: Vec<u32>,
    /// Wakers to wake once the lock is released.
    wakes: Vec<Waker>,
    /// Slots of completions whose futures are gone, for the ring once a
    /// reap is over.
    unowned: Vec<FixedBuf>,
    /// Completions of the ring's refill receives, for `receive`.
    incoming: Incoming,
}

impl Futures {
    /// A free tag for a new operation (its state still to be set).
    #[inline(always)]
    fn fresh_key(&mut self) -> u32 {
        match self.free.pop() {
            Some(key) => key,
            None => {
                self.ops.push(OpState::Free);
                (self.ops.len() - 1) as u32
            }
        }
    }

    /// A sink that hands completions to their futures as the ring reaps.
    fn settle(&mut self) -> Settle<'_> {
        Settle {
            futures: self,
            settled: 0,
        }
    }

    /// A completion no future owns: a refill receive's goes to its
    /// queue's arrivals, any other's slot back to the ring.
    // Out of line: the reap's hot path settles futures.
    #[cold]
    #[inline(never)]
    fn settle_unowned(&mut self, completion: FixedCompletion) {
        if let Err(completion) = self.incoming.put(completion, &mut self.wakes) {
            self.unowned.push(completion.into_buf());
        }
    }

    /// Tops up `ring`'s refilled shared receive queues; what a refused
    /// post brings back goes out at once (the slots of the refill's own
    /// receives back to the ring, waking the tasks awaiting that queue).
    fn refill<Q: QueuePair>(&mut self, ring: &mut FixedRing<Q>) {
        ring.refill_due();
        self.settle_refill_stop(ring);
    }

    /// If a refused post stopped a refill (here, in an event the ring
    /// applied, or at a refill's first top-up): hands out what it flushed
    /// (the refill's own slots back to the ring) and wakes every task
    /// awaiting arrivals — with no refill receive flushed, nothing else
    /// would, and its queue may have nothing left to await.
    fn settle_refill_stop<Q: QueuePair>(&mut self, ring: &mut FixedRing<Q>) {
        if ring.take_refill_stopped() {
            ring.hand_out_ready(&mut self.settle());
            self.give_back(ring);
            self.incoming.wake_all(&mut self.wakes);
        }
    }

    /// Gives the ring the slots of completions whose futures were gone.
    fn give_back<Q: QueuePair>(&mut self, ring: &mut FixedRing<Q>) {
        if !self.unowned.is_empty() {
            for buf in self.unowned.drain(..) {
                let _ = ring.put_buf(buf);
            }
        }
    }
}

struct Inner<Q: QueuePair> {
    /// `None` once closed.
    ring: Option<FixedRing<Q>>,
    futures: Futures,
    /// Operations pushed since the last submit.
    unposted_ops: usize,
    /// Submits so far: an operation pushed before submit `batch` went out
    /// with it.
    submits: u64,
    /// Whether a future's first poll leaves its operation for a shared
    /// doorbell (see [`AsyncFixedRing::coalesce_doorbells`]).
    coalesce: bool,
    ended: Option<Ended>,
    /// Wakers replaced or let go, dropped once the lock is released (a
    /// waker's drop may run anything, this ring included).
    dropped: Vec<Waker>,
}

/// Where [`Inner::push_with`] pushes: a queue pair or a shared receive
/// queue. A trait rather than a closure, so the push is inlined into
/// every caller however many there are (a closure's body shared by two
/// callers is left out of line, some 20 instructions dearer per push).
trait PushTarget<Q: QueuePair, O> {
    /// Pushes `op` with `tag` as its work's `user_data`; returns the
    /// operation's own `user_data` and whether it is a receive.
    fn push(self, ring: &mut FixedRing<Q>, op: O, tag: u64) -> Result<(u64, bool), Rejected<O>>;
}

impl<Q: QueuePair, O: FixedOp> PushTarget<Q, O> for FixedQp {
    #[inline(always)]
    fn push(self, ring: &mut FixedRing<Q>, op: O, tag: u64) -> Result<(u64, bool), Rejected<O>> {
        ring.push_tagged(self, op, tag)
    }
}

impl<Q: QueuePair> PushTarget<Q, RecvFixed> for FixedSrq {
    #[inline(always)]
    fn push(
        self,
        ring: &mut FixedRing<Q>,
        op: RecvFixed,
        tag: u64,
    ) -> Result<(u64, bool), Rejected<RecvFixed>> {
        ring.push_srq_tagged(self, op, tag).map(|own| (own, true))
    }
}

/// Keeps the waiting state of an operation pushed under tag `key`
/// (counted as unposted until the next submit, number `submits`), or
/// frees the tag of one the ring refused.
#[inline(always)]
fn keep_pushed<O>(
    futures: &mut Futures,
    unposted_ops: &mut usize,
    submits: u64,
    key: u32,
    pushed: Result<(u64, bool), Rejected<O>>,
) -> Result<u32, Rejected<O>> {
    match pushed {
        Ok((user_data, recv)) => {
            futures.ops[key as usize] = OpState::Waiting {
                waker: None,
                user_data,
                batch: submits,
                recv,
            };
            *unposted_ops += 1;
            Ok(key)
        }
        Err(rejected) => {
            futures.free.push(key);
            Err(rejected)
        }
    }
}

impl<Q: QueuePair> Inner<Q> {
    /// Pushes `op` to `target` with a fresh tag, and keeps a waiting
    /// state under that tag.
    #[inline(always)]
    fn push_with<O>(&mut self, target: impl PushTarget<Q, O>, op: O) -> Result<u32, Rejected<O>> {
        let Some(ring) = self.ring.as_mut() else {
            return Err(Rejected::new(Error::Closed, op));
        };
        let key = self.futures.fresh_key();
        let pushed = target.push(ring, op, u64::from(key));
        keep_pushed(
            &mut self.futures,
            &mut self.unposted_ops,
            self.submits,
            key,
            pushed,
        )
    }

    /// Pushes `ops` to `qp` in order through one [`PushBatch`] (the ring
    /// and the queue pair checked once), each with a fresh tag whose
    /// waiting state it keeps, calling `pushed` with each tag; stops at
    /// the first refused, leaving those after it in `ops`.
    fn push_all<O: FixedOp>(
        &mut self,
        qp: FixedQp,
        ops: &mut Vec<O>,
        mut pushed: impl FnMut(u32),
    ) -> Result<usize, Rejected<O>> {
        let mut drained = ops.drain(..);
        let Some(first) = drained.next() else {
            return Ok(0);
        };
        let refused = 'push: {
            let opened = match self.ring.as_mut() {
                Some(ring) => ring.batch(qp),
                None => Err(Error::Closed),
            };
            let mut batch = match opened {
                Ok(batch) => batch,
                Err(error) => break 'push Rejected::new(error, first),
            };
            let (mut op, mut count) = (first, 0);
            loop {
                let key = self.futures.fresh_key();
                let result = batch.push_tagged(op, u64::from(key));
                match keep_pushed(
                    &mut self.futures,
                    &mut self.unposted_ops,
                    self.submits,
                    key,
                    result,
                ) {
                    Ok(key) => {
                        count += 1;
                        pushed(key);
                    }
                    Err(rejected) => break 'push rejected,
                }
                match drained.next() {
                    Some(next) => op = next,
                    None => return Ok(count),
                }
            }
        };
        let rest: Vec<O> = drained.collect();
        ops.extend(rest);
        Err(refused)
    }

    fn submit(&mut self) -> Result<usize, Error> {
        // Not `ok_or`: its error, built eagerly, would be dropped on every
        // submit.
        let Some(ring) = self.ring.as_mut() else {
            return Err(Error::Closed);
        };
        // Work pushed before a failure stays unposted: its futures have
        // resolved with the failure, and it comes back flushed at close.
        if let Some(why) = self.ended {
            return Err(why.error());
        }
        self.unposted_ops = 0;
        self.submits += 1;
        // What the device refuses comes back flushed, after what it took.
        ring.submit()
    }

    /// Moves every completion ready in the ring, and every one the device
    /// holds, to its future.
    fn reap(&mut self) -> Result<usize, Error> {
        let Some(ring) = self.ring.as_mut() else {
            return Ok(0);
        };
        let mut settle = self.futures.settle();
        let result = ring.reap_all(&mut settle);
        let n = settle.settled;
        self.futures.give_back(ring);
        self.futures.refill(ring);
        // However the failure was met (this poll, or a detach's drain),
        // nothing more will complete.
        if let Some(why) = ring.failure() {
            self.end(Ended::Failed(why));
        }
        result.map(|()| n)
    }

    /// Posts what was pushed, unless nothing can complete any more.
    fn submit_pushed(&mut self) {
        if self.unposted_ops > 0 && self.ended.is_none() {
            let _ = self.submit();
        }
    }

    /// Takes `key`'s completion if it has one, else posts what waits to
    /// be, polls the device, and looks again; then notes who waits. On a
    /// future's `first` poll with doorbells coalesced, a send-queue
    /// operation still waiting for its doorbell is left for it (up to
    /// [`DEFERRED_MAX`] waiting), and the future's task is woken (once the
    /// lock is released) to poll it again, which posts it.
    fn poll_op(
        &mut self,
        key: u32,
        waker: &Waker,
        first: bool,
    ) -> Poll<Result<FixedCompletion, Error>> {
        let state = &self.futures.ops[key as usize];
        let defer = first
            && self.coalesce
            && self.unposted_ops < DEFERRED_MAX
            && matches!(state, OpState::Waiting { batch, recv: false, .. } if *batch == self.submits);
        // Another future's poll may have reaped this one's completion: no
        // device poll then.
        if !defer && !matches!(state, OpState::Done(_)) {
            self.submit_pushed();
            let _ = self.reap();
        }
        let state = &mut self.futures.ops[key as usize];
        let poll = match state {
            OpState::Done(_) => {
                let OpState::Done(completion) = std::mem::replace(state, OpState::Free) else {
                    unreachable!("matched above");
                };
                self.futures.free.push(key);
                Poll::Ready(Ok(completion))
            }
            OpState::Waiting { .. } if self.ended.is_some() => {
                *state = OpState::Free;
                self.futures.free.push(key);
                Poll::Ready(Err(self.ended.expect("checked").error()))
            }
            OpState::Waiting { waker: slot, .. } => {
                if !slot.as_ref().is_some_and(|w| w.will_wake(waker)) {
                    self.dropped.extend(slot.replace(waker.clone()));
                }
                Poll::Pending
            }
            OpState::Free | OpState::Orphaned => {
                unreachable!("a future's tag is its own until it resolves or drops")
            }
        };
        if defer && poll.is_pending() {
            self.futures.wakes.push(waker.clone());
        }
        poll
    }

    /// A future dropped before it resolved: its slot goes back to the free
    /// slots now if it completed, else when it does. Dropping does not
    /// cancel: an operation still waiting to be posted is posted now.
    fn forget(&mut self, key: u32) {
        let state = std::mem::replace(&mut self.futures.ops[key as usize], OpState::Free);
        match state {
            OpState::Done(completion) => {
                if let Some(ring) = self.ring.as_mut() {
                    let _ = ring.put_buf(completion.into_buf());
                    // The slot may be what a refilled queue waits for.
                    self.futures.refill(ring);
                }
                self.futures.free.push(key);
            }
            OpState::Waiting { waker, .. } if self.ring.is_some() => {
                self.dropped.extend(waker);
                self.futures.ops[key as usize] = OpState::Orphaned;
                self.submit_pushed();
            }
            OpState::Waiting { waker, .. } => {
                self.dropped.extend(waker);
                self.futures.free.push(key);
            }
            _ => self.futures.free.push(key),
        }
    }

    /// Nothing more completes from the device: every waiting future is
    /// woken to resolve with `why`. Once the ring is gone, the tags of
    /// dropped futures are free too; while it stays (failed), their
    /// flushed work may still come back through it.
    fn end(&mut self, why: Ended) {
        self.ended.get_or_insert(why);
        self.futures.incoming.wake_all(&mut self.futures.wakes);
        let ring_gone = self.ring.is_none();
        for (key, state) in self.futures.ops.iter_mut().enumerate() {
            match state {
                OpState::Waiting { waker, .. } => self.futures.wakes.extend(waker.take()),
                OpState::Orphaned if ring_gone => {
                    *state = OpState::Free;
                    self.futures.free.push(key as u32);
                }
                OpState::Orphaned | OpState::Free | OpState::Done(_) => {}
            }
        }
    }

    /// Moves every queue pair to error and drains them all under one
    /// deadline (work never posted comes back flushed), hands out what
    /// came back, and lets the ring go. What the device does not give
    /// back in time stays with the ring, whose memory is then leaked
    /// rather than freed under the NIC.
    fn close(&mut self) -> Option<FixedRing<Q>> {
        let mut ring = self.ring.take()?;
        let mut reaped = Vec::new();
        ring.shutdown_into(&mut reaped);
        self.futures.settle().put_all(reaped.into_iter());
        self.futures.give_back(&mut ring);
        let why = ring.failure().map_or(Ended::Closed, Ended::Failed);
        // The ring is out of `self`: dropped futures' tags are free too.
        self.end(why);
        Some(ring)
    }
}

/// Hands each completion to its future as the ring reaps it, or, if the
/// future is gone, its slot to `unowned`, for the ring once it is no
/// longer reaping.
struct Settle<'a> {
    futures: &'a mut Futures,
    settled: usize,
}

impl CompletionSink for Settle<'_> {
    #[inline(always)]
    fn put(&mut self, mut completion: FixedCompletion) {
        self.settled += 1;
        // A refill receive's tag does not fit a key (nor, where `usize` is
        // 32 bits, truncate to one).
        let key = usize::try_from(completion.user_data()).unwrap_or(usize::MAX);
        match self.futures.ops.get_mut(key) {
            Some(state @ OpState::Waiting { .. }) => {
                let OpState::Waiting {
                    waker, user_data, ..
                } = std::mem::replace(state, OpState::Free)
                else {
                    unreachable!("matched above");
                };
                completion.set_user_data(user_data);
                *state = OpState::Done(completion);
                if let Some(waker) = waker {
                    self.futures.wakes.push(waker);
                }
            }
            Some(state @ OpState::Orphaned) => {
                *state = OpState::Free;
                self.futures.free.push(key as u32);
                self.futures.unowned.push(completion.into_buf());
            }
            // A refill receive's (its tag is above every future's), or an
            // operation's whose future already resolved with the ring's
            // failure (no push succeeds after it, so the tag was not
            // reused): its slot goes back.
            _ => self.futures.settle_unowned(completion),
        }
    }
}

impl<Q: QueuePair> FixedShared<Q> {
    /// The idle-time work ([`AsyncFixedRing::tick`]): peers that left.
    /// What failing their queue pairs brings back at once (work never
    /// posted) raises no completion event, so it goes to its futures here.
    fn tick(&self) -> usize {
        let failed = self.with(|inner| {
            let failed = inner.ring.as_mut().map_or(0, FixedRing::check_peers);
            if failed > 0 {
                let _ = inner.reap();
            }
            failed
        });
        // No event would come to drive a channel left unarmed.
        if self.unarmed.load(Ordering::Acquire) {
            let _ = self.drive();
        }
        failed
    }

    fn lock(&self) -> MutexGuard<'_, Inner<Q>> {
        // The state stays consistent across a panicking waker.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `f` on the locked state, then wakes what it woke with the lock
    /// released.
    #[inline]
    fn with<R>(&self, f: impl FnOnce(&mut Inner<Q>) -> R) -> R {
        let mut inner = self.lock();
        let result = f(&mut inner);
        if !inner.futures.wakes.is_empty() || !inner.dropped.is_empty() {
            Self::release_and_wake(inner);
        }
        result
    }

    /// Releases the lock, then wakes the wakers `inner` collected and
    /// drops those it let go.
    #[inline(never)]
    fn release_and_wake(mut inner: MutexGuard<'_, Inner<Q>>) {
        let dropped = std::mem::take(&mut inner.dropped);
        // The list changes places with the thread's spare one, so the
        // steady state allocates nothing.
        let mut wakes = WAKES.try_with(|cell| cell.take()).unwrap_or_default();
        std::mem::swap(&mut wakes, &mut inner.futures.wakes);
        drop(inner);
        crate::wakers::wake_all(wakes.drain(..));
        let _ = WAKES.try_with(|cell| cell.replace(wakes));
        crate::wakers::drop_quietly(dropped);
    }

    /// Takes the channel's events and re-arms it before polling, so a
    /// completion landing in between still raises an event; under the
    /// lock, so a close cannot take the completion queue away meanwhile.
    fn drive(&self) -> Result<usize, Error> {
        self.with(|inner| {
            if inner.ring.is_none() {
                // Closed: the events still pending are taken (so a
                // reactor's readiness clears), and the channel is not
                // armed again.
                if let Some(events) = &self.events {
                    let _ = events.take();
                }
                return Ok(0);
            }
            // Completions reach their futures even when the channel
            // fails: a failed arm is tried again by the next drive or tick.
            let channel = self.events.as_ref().map_or(Ok(()), |events| {
                super::take_and_arm(events.as_ref(), &self.unarmed)
            });
            inner.submit_pushed();
            let reaped = inner.reap();
            channel.and(reaped)
        })
    }

    fn close(&self) {
        // The ring drains (up to its drain timeout) under the lock, so no
        // operation is pushed meanwhile; it is dropped after, unlocked.
        // Nothing is left for a notifier thread to drive.
        self.stop.store(true, Ordering::Release);
        let ring = self.with(Inner::close);
        drop(ring);
    }
}

impl<Q: QueuePair + Send + 'static> AsyncFixedRing<Q> {
    /// Shares `ring`, woken as `wakeup` says. Refused, with the ring handed
    /// back: a ring that is not idle — something pushed, in flight or left
    /// to reap, or a shared receive queue refill set (set it through the
    /// adapter: [`set_srq_refill`](Self::set_srq_refill)) — with
    /// [`Error::RingNotIdle`]; and for [`Wakeup::Reactor`]
    /// and [`Wakeup::Thread`], a completion queue without a completion
    /// channel.
    ///
    /// ```
    /// # use rdma_ring::backend::soft::{SoftDevice, SoftQp};
    /// # use rdma_ring::fixed::{FixedBufs, FixedRing, FixedRingConfig};
    /// use rdma_ring::future::{AsyncFixedRing, Wakeup};
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// let ring: FixedRing<SoftQp> = FixedRing::new(dev.create_cq(64).unwrap(), FixedBufs::new(&pd, 8, 64).unwrap(), FixedRingConfig::default());
    /// let ring = AsyncFixedRing::new(ring, Wakeup::Thread).unwrap();
    /// assert!(ring.completion_fd().is_some());
    /// ```
    // Refusing hands the whole ring back, as large as it is: this runs
    // once per ring, never on a hot path.
    #[allow(clippy::result_large_err)]
    pub fn new(ring: FixedRing<Q>, wakeup: Wakeup) -> Result<Self, Rejected<FixedRing<Q>>> {
        // Completions of work pushed before would carry their owners'
        // tags where the adapter expects its own.
        if !ring.idle() {
            return Err(Rejected::new(Error::RingNotIdle, ring));
        }
        let events = match wakeup {
            Wakeup::Busy => None,
            Wakeup::Reactor | Wakeup::Thread => match ring.cq().completion_events() {
                Some(events) => Some(events),
                None => {
                    let error = Error::Soft(
                        "this completion queue has no completion channel; use Wakeup::Busy",
                    );
                    return Err(Rejected::new(error, ring));
                }
            },
        };
        if let Some(events) = &events {
            if let Err(error) = events.arm() {
                return Err(Rejected::new(error, ring));
            }
        }
        let shared = Arc::new(FixedShared {
            inner: Mutex::new(Inner {
                ring: Some(ring),
                futures: Futures::default(),
                unposted_ops: 0,
                submits: 0,
                coalesce: false,
                ended: None,
                dropped: Vec::new(),
            }),
            wakeup,
            events,
            handles: AtomicUsize::new(1),
            stop: AtomicBool::new(false),
            unarmed: AtomicBool::new(false),
        });
        let notifier = (wakeup == Wakeup::Thread).then(|| {
            let shared = Arc::clone(&shared);
            NotifierThread::spawn(move || {
                notifier_loop(
                    shared.events.clone(),
                    &shared.stop,
                    || shared.drive().is_ok(),
                    || {
                        shared.tick();
                    },
                )
            })
        });
        let notifier = match notifier.transpose() {
            Ok(notifier) => notifier,
            // The thread's closure, and its handle on `shared`, went with
            // the failed spawn: the ring comes back whole.
            Err(error) => {
                let ring = Arc::try_unwrap(shared)
                    .ok()
                    .and_then(|shared| shared.inner.into_inner().ok()?.ring)
                    .expect("the only handle, holding the ring");
                return Err(Rejected::new(error, ring));
            }
        };
        Ok(AsyncFixedRing { shared, notifier })
    }

    /// Attaches a queue pair created on the ring's completion queue (see
    /// [`FixedRing::attach`]).
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::SoftDevice, QpConfig};
    /// # use rdma_ring::fixed::{FixedBufs, FixedRing, FixedRingConfig};
    /// # use rdma_ring::future::{AsyncFixedRing, Wakeup};
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// let ring = AsyncFixedRing::new(FixedRing::new(dev.create_cq(64).unwrap(), FixedBufs::new(&pd, 8, 64).unwrap(), FixedRingConfig::default()), Wakeup::Busy).unwrap();
    /// let qp = dev.create_qp_on(&pd, &dev.create_cq(8).unwrap(), None, QpConfig::default()).unwrap();
    /// assert!(ring.attach(qp).is_err()); // another completion queue
    /// ```
    pub fn attach(&self, qp: Q) -> Result<FixedQp, Rejected<Q>> {
        self.shared.with(|inner| match inner.ring.as_mut() {
            Some(ring) => ring.attach(qp),
            None => Err(Rejected::new(Error::Closed, qp)),
        })
    }

    /// Detaches a queue pair (see [`FixedRing::detach`]): its work comes
    /// back flushed, to its futures, before it is handed back. If the
    /// device does not flush it all within the ring's `drain_timeout`,
    /// the queue pair stays attached, in error, [`Error::Timeout`] is
    /// returned, and its futures wait for the rest (or for the close).
    /// The drain runs with the ring locked: the ring's other futures wait
    /// for it (up to `drain_timeout`), as for [`close`](Self::close).
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::SoftDevice, QpConfig, QueuePair, WcStatus};
    /// # use rdma_ring::fixed::{FixedBufs, FixedRing, FixedRingConfig, RecvFixed};
    /// # use rdma_ring::future::{AsyncFixedRing, Wakeup};
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// # let (mut qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    /// # let cq = qp.take_cq().unwrap();
    /// let ring = AsyncFixedRing::new(FixedRing::new(cq, FixedBufs::new(&pd, 4, 64).unwrap(), FixedRingConfig::default()), Wakeup::Busy).unwrap();
    /// let conn = ring.attach(qp).unwrap();
    /// let recv = ring.push(conn, RecvFixed::new(ring.take_buf().unwrap())).unwrap();
    /// ring.submit().unwrap();
    /// let _qp = ring.detach(conn).unwrap();
    /// let done = futures::executor::block_on(recv).unwrap();
    /// assert_eq!(done.status(), WcStatus::WrFlushErr);
    /// ```
    pub fn detach(&self, qp: FixedQp) -> Result<Q, Error> {
        self.shared.with(|inner| {
            let ring = inner.ring.as_mut().ok_or(Error::Closed)?;
            let detached = ring.detach(qp);
            // What the drain brought back goes to its futures now, whether
            // or not it finished; a completion queue that failed during it
            // ends them all.
            let _ = inner.reap();
            detached
        })
    }

    /// Applies one of the device's asynchronous events as
    /// [`FixedRing::apply_event`] does, and returns whether it concerned
    /// the ring. What it brings back (work of a queue pair now in error
    /// that was never posted) goes to its futures flushed, once the work
    /// that queue pair posted is back (at once if the device refused to
    /// move it to error); after
    /// a failure of the completion queue or the device, work never posted
    /// resolves so too, and every future of posted work with
    /// [`Error::RingFailed`].
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::SoftDevice, AsyncEventSource, QpConfig, QueuePair};
    /// # use rdma_ring::buf::{ExposedBuf, RemoteAccess};
    /// # use rdma_ring::fixed::{FixedBufs, FixedRing, FixedRingConfig, WriteFixed};
    /// # use rdma_ring::future::{AsyncFixedRing, Wakeup};
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// let events = dev.async_events().unwrap();
    /// # let (mut qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    /// # let target = ExposedBuf::new(&pd, vec![0u8; 64], RemoteAccess::WRITE).unwrap();
    /// # let cq = qp.take_cq().unwrap();
    /// let ring = AsyncFixedRing::new(FixedRing::new(cq, FixedBufs::new(&pd, 4, 64).unwrap(), FixedRingConfig::default()), Wakeup::Busy).unwrap();
    /// let conn = ring.attach(qp).unwrap();
    /// let write = ring.push(conn, WriteFixed::new(ring.take_buf().unwrap(), 64, target.remote())).unwrap();
    /// ring.submit().unwrap();
    /// dev.inject_device_fatal();
    /// assert!(ring.apply_event(events.next_event().unwrap().unwrap()));
    /// assert!(matches!(futures::executor::block_on(write), Err(rdma_ring::Error::RingFailed(_))));
    /// ```
    pub fn apply_event(&self, event: AsyncEvent) -> bool {
        self.shared.with(|inner| {
            let Some(ring) = inner.ring.as_mut() else {
                return false;
            };
            let concerned = ring.apply_event(event);
            if concerned {
                let _ = inner.reap();
            }
            concerned
        })
    }

    /// Moves queue pair `qp` to error, as [`FixedRing::fail_qp`] does; what
    /// it brings back goes to its futures (flushed), what it never posted
    /// after what it did.
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::SoftDevice, QpConfig, QueuePair, WcStatus};
    /// # use rdma_ring::fixed::{FixedBufs, FixedRing, FixedRingConfig, RecvFixed};
    /// # use rdma_ring::future::{AsyncFixedRing, Wakeup};
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// # let (mut qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    /// # let cq = qp.take_cq().unwrap();
    /// let ring = AsyncFixedRing::new(FixedRing::new(cq, FixedBufs::new(&pd, 4, 64).unwrap(), FixedRingConfig::default()), Wakeup::Busy).unwrap();
    /// let conn = ring.attach(qp).unwrap();
    /// let recv = ring.push(conn, RecvFixed::new(ring.take_buf().unwrap())).unwrap();
    /// ring.fail_qp(conn).unwrap();
    /// assert_eq!(futures::executor::block_on(recv).unwrap().status(), WcStatus::WrFlushErr);
    /// ```
    pub fn fail_qp(&self, qp: FixedQp) -> Result<(), Error> {
        self.shared.with(|inner| {
            let ring = inner.ring.as_mut().ok_or(Error::Closed)?;
            // Even if the device refuses to move it, what was never posted
            // comes back (at once then, as nothing it posted may): to its
            // futures.
            let failed = ring.fail_qp(qp);
            let _ = inner.reap();
            failed
        })
    }

    /// Whether queue pair `qp` is in error, and with what status, as
    /// [`FixedRing::qp_error`] says; [`Error::Closed`] once the ring is
    /// closed.
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::SoftDevice, QpConfig, QueuePair, WcStatus};
    /// # use rdma_ring::fixed::{FixedBufs, FixedRing, FixedRingConfig};
    /// # use rdma_ring::future::{AsyncFixedRing, Wakeup};
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// # let (mut qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    /// # let cq = qp.take_cq().unwrap();
    /// let ring = AsyncFixedRing::new(FixedRing::new(cq, FixedBufs::new(&pd, 4, 64).unwrap(), FixedRingConfig::default()), Wakeup::Busy).unwrap();
    /// let conn = ring.attach(qp).unwrap();
    /// assert_eq!(ring.qp_error(conn).unwrap(), None);
    /// ring.fail_qp(conn).unwrap();
    /// assert_eq!(ring.qp_error(conn).unwrap(), Some(WcStatus::WrFlushErr));
    /// ```
    pub fn qp_error(&self, qp: FixedQp) -> Result<Option<WcStatus>, Error> {
        self.shared.with(|inner| {
            let ring = inner.ring.as_ref().ok_or(Error::Closed)?;
            ring.qp_error(qp)
        })
    }

    /// Why the device refused to post queue pair `qp`'s work, if that is
    /// what put it in error, as [`FixedRing::qp_refusal`] says. A future
    /// posts its operation itself (on its poll, or the next future's, or a
    /// drive), so no caller sees that submit's error: the futures of the
    /// refused work resolve flushed ([`WcStatus::WrFlushErr`]), and this
    /// tells why.
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::SoftDevice, QpConfig, QueuePair, WcStatus};
    /// # use rdma_ring::buf::{ExposedBuf, RemoteAccess};
    /// # use rdma_ring::fixed::{FixedBufs, FixedRing, FixedRingConfig, WriteFixed};
    /// # use rdma_ring::future::{AsyncFixedRing, Wakeup};
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// # let (mut qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    /// # let target = ExposedBuf::new(&pd, vec![0u8; 64], RemoteAccess::WRITE).unwrap();
    /// # let cq = qp.take_cq().unwrap();
    /// let control = qp.control(); // the soft device's fault injection
    /// let ring = AsyncFixedRing::new(FixedRing::new(cq, FixedBufs::new(&pd, 4, 64).unwrap(), FixedRingConfig::default()), Wakeup::Busy).unwrap();
    /// let conn = ring.attach(qp).unwrap();
    /// control.refuse_posts(1); // as a NIC out of resources would
    /// let write = ring.push(conn, WriteFixed::new(ring.take_buf().unwrap(), 8, target.remote())).unwrap();
    /// let done = futures::executor::block_on(write).unwrap();
    /// assert_eq!(done.status(), WcStatus::WrFlushErr);
    /// assert!(ring.qp_refusal(conn).unwrap().unwrap().contains("out of resources"));
    /// ```
    pub fn qp_refusal(&self, qp: FixedQp) -> Result<Option<String>, Error> {
        self.shared.with(|inner| {
            let ring = inner.ring.as_ref().ok_or(Error::Closed)?;
            Ok(ring.qp_refusal(qp)?.map(str::to_owned))
        })
    }

    /// Pushes `op` for `qp` and returns its future; refused, and handed
    /// back whole, as [`FixedRing::push`] refuses (or once the ring is
    /// closed). The operation is posted, with everything else pushed, by
    /// the next [`submit`](Self::submit), [`drive`](Self::drive), or poll of
    /// any pending future of the ring (with
    /// [`coalesce_doorbells`](Self::coalesce_doorbells), a future's first
    /// poll leaves it to the next) — at the latest
    /// when its own future is first polled (second, with coalescing), or
    /// dropped. So
    /// await it, or submit, before waiting on anything that needs it to
    /// have run: in `let w = ring.push(..)?; answer.await; w.await`, where
    /// `answer` is the peer's reply to `w`'s message, nothing posts it.
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::SoftDevice, QpConfig, QueuePair};
    /// # use rdma_ring::buf::{ExposedBuf, RemoteAccess};
    /// # use rdma_ring::fixed::{FixedBufs, FixedRing, FixedRingConfig, ReadFixed};
    /// # use rdma_ring::future::{AsyncFixedRing, Wakeup};
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// # let (mut qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    /// # let source = ExposedBuf::new(&pd, vec![7u8; 64], RemoteAccess::READ).unwrap();
    /// # let cq = qp.take_cq().unwrap();
    /// let ring = AsyncFixedRing::new(FixedRing::new(cq, FixedBufs::new(&pd, 4, 64).unwrap(), FixedRingConfig::default()), Wakeup::Busy).unwrap();
    /// let conn = ring.attach(qp).unwrap();
    /// let read = ring.push(conn, ReadFixed::new(ring.take_buf().unwrap(), 64, source.remote())).unwrap();
    /// let done = futures::executor::block_on(read).unwrap();
    /// assert!(ring.with_bufs(|bufs| bufs.bytes(done.buf()).iter().all(|&b| b == 7)).unwrap());
    ///
    /// let too_long = ReadFixed::new(done.into_buf(), 65, source.remote()); // the slots hold 64
    /// let (error, op) = ring.push(conn, too_long).unwrap_err().into_parts();
    /// assert!(matches!(error, rdma_ring::Error::OutOfBounds { .. }));
    /// ring.put_buf(op.into_buf()).unwrap();
    /// ```
    pub fn push<O: FixedOp>(&self, qp: FixedQp, op: O) -> Result<FixedOpFuture<Q>, Rejected<O>> {
        // A push wakes nothing and lets no waker go: no `with`.
        let key = self.shared.lock().push_with(qp, op)?;
        Ok(FixedOpFuture {
            shared: Arc::clone(&self.shared),
            key,
            polled: false,
            resolved: false,
        })
    }

    /// Pushes the operations in `ops` for `qp`, in order, under one lock
    /// (where [`push`](Self::push) takes it for each), appending each
    /// one's future to `futures` and leaving `ops` empty. Stops at the
    /// first refused, handing it back whole as `push` does: those before
    /// it stay pushed (their futures in `futures`), and those after it
    /// stay in `ops`. Returns how many were pushed (on a refusal, what
    /// `futures` gained says). With room in `futures`, it allocates
    /// nothing (a refusal may).
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::SoftDevice, QpConfig, QueuePair};
    /// # use rdma_ring::buf::{ExposedBuf, RemoteAccess};
    /// # use rdma_ring::fixed::{FixedBufs, FixedRing, FixedRingConfig, WriteFixed};
    /// # use rdma_ring::future::{AsyncFixedRing, Wakeup};
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// # let (mut qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    /// # let control = qp.control();
    /// # let target = ExposedBuf::new(&pd, vec![0u8; 64], RemoteAccess::WRITE).unwrap();
    /// # let cq = qp.take_cq().unwrap();
    /// let ring = AsyncFixedRing::new(FixedRing::new(cq, FixedBufs::new(&pd, 8, 64).unwrap(), FixedRingConfig::default()), Wakeup::Busy).unwrap();
    /// let conn = ring.attach(qp).unwrap();
    /// let mut writes: Vec<_> = std::iter::from_fn(|| ring.take_buf())
    ///     .map(|slot| WriteFixed::new(slot, 64, target.remote()))
    ///     .collect();
    /// let mut futures = Vec::with_capacity(8);
    /// assert_eq!(ring.push_all(conn, &mut writes, &mut futures).unwrap(), 8);
    /// assert!(writes.is_empty());
    /// futures::executor::block_on(async {
    ///     for write in futures.drain(..) {
    ///         ring.put_buf(write.await.unwrap().into_buf()).unwrap();
    ///     }
    /// });
    /// assert_eq!(control.counters().send_posts, 1); // one doorbell for the eight
    /// ```
    pub fn push_all<O: FixedOp>(
        &self,
        qp: FixedQp,
        ops: &mut Vec<O>,
        futures: &mut Vec<FixedOpFuture<Q>>,
    ) -> Result<usize, Rejected<O>> {
        // As `push`: nothing to wake, no waker let go. No caller code runs
        // under the lock (a `Vec`, not an iterator, holds the operations).
        let mut inner = self.shared.lock();
        inner.push_all(qp, ops, |key| {
            futures.push(FixedOpFuture {
                shared: Arc::clone(&self.shared),
                key,
                polled: false,
                resolved: false,
            });
        })
    }

    /// Takes a shared receive queue into the ring, as
    /// [`FixedRing::add_srq`] does. Queue pairs created on it are then
    /// attached with [`attach`](Self::attach); the queue itself is reached
    /// for that with [`with_srq`](Self::with_srq).
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::SoftDevice, QpConfig, SrqConfig};
    /// # use rdma_ring::fixed::{FixedBufs, FixedRing, FixedRingConfig};
    /// # use rdma_ring::future::{AsyncFixedRing, Wakeup};
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// let ring = AsyncFixedRing::new(FixedRing::new(dev.create_cq(64).unwrap(), FixedBufs::new(&pd, 8, 64).unwrap(), FixedRingConfig::default()), Wakeup::Busy).unwrap();
    /// let srq = ring.add_srq(dev.create_srq(&pd, SrqConfig::default()).unwrap()).unwrap();
    /// let qp = ring.with_srq(srq, |cq, srq| dev.create_qp_on(&pd, cq, srq, QpConfig::default())).unwrap().unwrap();
    /// ring.attach(qp).unwrap();
    /// ```
    pub fn add_srq(&self, srq: Q::Srq) -> Result<FixedSrq, Rejected<Q::Srq>> {
        self.shared.with(|inner| match inner.ring.as_mut() {
            Some(ring) => ring.add_srq(srq),
            None => Err(Rejected::new(Error::Closed, srq)),
        })
    }

    /// Announces queue pair number `qp_num`, made on shared receive queue
    /// `srq` and not attached yet, so the receives it takes before it is
    /// attached reach their futures (see [`FixedRing::expect_on_srq`]).
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::SoftDevice, QpConfig, SrqConfig};
    /// # use rdma_ring::fixed::*;
    /// # use rdma_ring::future::{AsyncFixedRing, Wakeup};
    /// let dev = SoftDevice::new();
    /// let pd = dev.alloc_pd();
    /// let ring = FixedRing::new(dev.create_cq(64).unwrap(), FixedBufs::new(&pd, 4, 64).unwrap(), FixedRingConfig::default());
    /// let ring = AsyncFixedRing::new(ring, Wakeup::Busy).unwrap();
    /// let srq = ring.add_srq(dev.create_srq(&pd, SrqConfig::default()).unwrap()).unwrap();
    /// let qp = ring.with_srq(srq, |cq, srq| dev.create_qp_on(&pd, cq, srq, QpConfig::default())).unwrap().unwrap();
    /// ring.expect_on_srq(srq, qp.qpn()).unwrap();
    /// // ... connect it; then:
    /// ring.attach(qp).unwrap();
    /// ```
    pub fn expect_on_srq(&self, srq: FixedSrq, qp_num: u32) -> Result<(), Error> {
        self.shared.with(|inner| match inner.ring.as_mut() {
            Some(ring) => ring.expect_on_srq(srq, qp_num),
            None => Err(Error::Closed),
        })
    }

    /// Calls `f` with the ring's completion queue and shared receive queue
    /// `srq` (`None` if it names nothing): to create a queue pair on them.
    /// `f` runs under the ring's lock, so it must not call the ring, nor
    /// drop a future of it (a drop takes the lock too): that would
    /// deadlock.
    pub fn with_srq<R>(
        &self,
        srq: FixedSrq,
        f: impl FnOnce(&Q::Cq, Option<&Q::Srq>) -> R,
    ) -> Result<R, Error> {
        self.shared.with(|inner| match inner.ring.as_ref() {
            Some(ring) => Ok(f(ring.cq(), ring.srq(srq))),
            None => Err(Error::Closed),
        })
    }

    /// Pushes a receive to shared receive queue `srq` and returns its
    /// future, which resolves with the completion of the message that
    /// took it (naming the queue pair it arrived on); refused, and handed
    /// back whole, as [`FixedRing::push_srq`] refuses (or once the ring is
    /// closed). It is posted as any pushed operation is (see
    /// [`push`](Self::push)), never left waiting for a shared doorbell. A
    /// receive taken by a queue pair dropped before the device reported it
    /// (see [`FixedRing::detach`]) resolves only when the queue is removed
    /// or the ring closed.
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::{SoftDevice, SoftQp}, SrqConfig, WcStatus};
    /// # use rdma_ring::fixed::{FixedBufs, FixedRing, FixedRingConfig, RecvFixed};
    /// # use rdma_ring::future::{AsyncFixedRing, Wakeup};
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// let ring: AsyncFixedRing<SoftQp> = AsyncFixedRing::new(FixedRing::new(dev.create_cq(64).unwrap(), FixedBufs::new(&pd, 8, 64).unwrap(), FixedRingConfig::default()), Wakeup::Busy).unwrap();
    /// let srq = ring.add_srq(dev.create_srq(&pd, SrqConfig::default()).unwrap()).unwrap();
    /// let recv = ring.push_srq(srq, RecvFixed::new(ring.take_buf().unwrap()).user_data(3)).unwrap();
    /// ring.submit().unwrap();
    /// let _srq = ring.remove_srq(srq).unwrap(); // no queue pair took it
    /// let back = futures::executor::block_on(recv).unwrap();
    /// assert_eq!((back.user_data(), back.status()), (3, WcStatus::WrFlushErr));
    /// ```
    pub fn push_srq(
        &self,
        srq: FixedSrq,
        op: RecvFixed,
    ) -> Result<FixedOpFuture<Q>, Rejected<RecvFixed>> {
        let key = self.shared.lock().push_with(srq, op)?;
        Ok(FixedOpFuture {
            shared: Arc::clone(&self.shared),
            key,
            polled: false,
            resolved: false,
        })
    }

    /// Receives of `srq` posted and not yet handed back (see
    /// [`FixedRing::srq_posted`]).
    pub fn srq_posted(&self, srq: FixedSrq) -> Result<usize, Error> {
        self.shared.with(|inner| match inner.ring.as_ref() {
            Some(ring) => ring.srq_posted(srq),
            None => Err(Error::Closed),
        })
    }

    /// Removes, destroys and hands back shared receive queue `srq`, as
    /// [`FixedRing::remove_srq`] does; its receives go to their futures,
    /// flushed.
    pub fn remove_srq(&self, srq: FixedSrq) -> Result<Q::Srq, Error> {
        self.shared.with(|inner| {
            let ring = inner.ring.as_mut().ok_or(Error::Closed)?;
            let removed = ring.remove_srq(srq);
            let _ = inner.reap();
            // Tasks awaiting its arrivals take what came, then learn it
            // is gone.
            inner.futures.incoming.wake(srq, &mut inner.futures.wakes);
            removed
        })
    }

    /// With `on`, a future's first poll no longer posts its send, write,
    /// read or atomic: it yields once (waking its own task), so the tasks
    /// polled in that round of the executor add theirs, and its second
    /// poll posts them all — one doorbell per queue pair — as does a
    /// drive, a submit, turning coalescing off, or dropping a future whose
    /// operation has not completed; and a first poll while 32 or more
    /// wait posts at once. Receives are never left waiting (a peer may be
    /// about to send). Tasks that each push one operation and await it
    /// then share doorbells. Off by default: each first poll posts at
    /// once, which is what a lone task wants — and with it on, a future
    /// polled once and then kept without being polled again (a `select!`
    /// arm that lost, held for later) leaves its operation unposted until
    /// something above posts it (dropping it does). Closing
    /// does not post what waits: it comes back flushed, never run.
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::SoftDevice, QpConfig, QueuePair};
    /// # use rdma_ring::buf::{ExposedBuf, RemoteAccess};
    /// # use rdma_ring::fixed::{FixedBufs, FixedRing, FixedRingConfig, WriteFixed};
    /// # use rdma_ring::future::{AsyncFixedRing, Wakeup};
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// # let (mut qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    /// # let control = qp.control();
    /// # let target = ExposedBuf::new(&pd, vec![0u8; 64], RemoteAccess::WRITE).unwrap();
    /// # let cq = qp.take_cq().unwrap();
    /// let ring = AsyncFixedRing::new(FixedRing::new(cq, FixedBufs::new(&pd, 8, 64).unwrap(), FixedRingConfig::default()), Wakeup::Busy).unwrap();
    /// let conn = ring.attach(qp).unwrap();
    /// ring.coalesce_doorbells(true);
    /// // Eight tasks, each pushing a write and awaiting it.
    /// let tasks = (0..8).map(|_| async {
    ///     let slot = ring.take_buf().unwrap();
    ///     let done = ring.push(conn, WriteFixed::new(slot, 64, target.remote())).unwrap().await.unwrap();
    ///     ring.put_buf(done.into_buf()).unwrap();
    /// });
    /// futures::executor::block_on(futures::future::join_all(tasks));
    /// assert_eq!(control.counters().send_posts, 1); // one doorbell for the eight
    /// ```
    pub fn coalesce_doorbells(&self, on: bool) {
        self.shared.with(|inner| {
            inner.coalesce = on;
            if !on {
                inner.submit_pushed();
            }
        });
    }

    /// Posts everything pushed since the last submit: one doorbell per
    /// queue pair with work (see [`FixedRing::submit`]). Returns how many
    /// work requests were posted.
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::SoftDevice, QpConfig, QueuePair};
    /// # use rdma_ring::fixed::{FixedBufs, FixedRing, FixedRingConfig, RecvFixed};
    /// # use rdma_ring::future::{AsyncFixedRing, Wakeup};
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// # let (mut qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    /// # let cq = qp.take_cq().unwrap();
    /// let ring = AsyncFixedRing::new(FixedRing::new(cq, FixedBufs::new(&pd, 4, 64).unwrap(), FixedRingConfig::default()), Wakeup::Busy).unwrap();
    /// let conn = ring.attach(qp).unwrap();
    /// let recvs: Vec<_> = (0..4).map(|_| ring.push(conn, RecvFixed::new(ring.take_buf().unwrap())).unwrap()).collect();
    /// assert_eq!(ring.submit().unwrap(), 4); // one doorbell
    /// # drop(recvs);
    /// ```
    pub fn submit(&self) -> Result<usize, Error> {
        self.shared.with(Inner::submit)
    }

    /// A free slot's token (see [`FixedRing::take_buf`]); `None` when all
    /// are taken or the ring is closed.
    ///
    /// ```
    /// # use rdma_ring::backend::soft::{SoftDevice, SoftQp};
    /// # use rdma_ring::fixed::{FixedBufs, FixedRing, FixedRingConfig};
    /// # use rdma_ring::future::{AsyncFixedRing, Wakeup};
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// let ring: AsyncFixedRing<SoftQp> = AsyncFixedRing::new(FixedRing::new(dev.create_cq(8).unwrap(), FixedBufs::new(&pd, 1, 64).unwrap(), FixedRingConfig::default()), Wakeup::Busy).unwrap();
    /// let slot = ring.take_buf().unwrap();
    /// assert!(ring.take_buf().is_none());
    /// ring.put_buf(slot).unwrap();
    /// ```
    pub fn take_buf(&self) -> Option<FixedBuf> {
        self.shared.with(|inner| inner.ring.as_mut()?.take_buf())
    }

    /// Gives a slot's token back to the free slots (see
    /// [`FixedRing::put_buf`]).
    ///
    /// ```
    /// # use rdma_ring::backend::soft::{SoftDevice, SoftQp};
    /// # use rdma_ring::fixed::{FixedBufs, FixedRing, FixedRingConfig};
    /// # use rdma_ring::future::{AsyncFixedRing, Wakeup};
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// # let ring: AsyncFixedRing<SoftQp> = AsyncFixedRing::new(FixedRing::new(dev.create_cq(8).unwrap(), FixedBufs::new(&pd, 1, 64).unwrap(), FixedRingConfig::default()), Wakeup::Busy).unwrap();
    /// let slot = ring.take_buf().unwrap();
    /// ring.put_buf(slot).unwrap();
    /// ```
    pub fn put_buf(&self, buf: FixedBuf) -> Result<(), Rejected<FixedBuf>> {
        self.shared.with(|inner| match inner.ring.as_mut() {
            Some(ring) => {
                ring.put_buf(buf)?;
                // The slot may be what a refilled queue waits for: nothing
                // else reaps while no receive is posted.
                inner.futures.refill(ring);
                Ok(())
            }
            None => Err(Rejected::new(Error::Closed, buf)),
        })
    }

    /// Runs `f` on the slots, to read and write them through tokens (see
    /// [`FixedBufs::bytes`] and [`FixedBufs::bytes_mut`]); [`Error::Closed`]
    /// once the ring is closed (its slots are gone). `f` runs with the
    /// ring locked: it must not call back into the ring, nor drop a
    /// future of it (a drop takes the lock too): that would wait for
    /// ever.
    ///
    /// ```
    /// # use rdma_ring::backend::soft::{SoftDevice, SoftQp};
    /// # use rdma_ring::fixed::{FixedBufs, FixedRing, FixedRingConfig};
    /// # use rdma_ring::future::{AsyncFixedRing, Wakeup};
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// # let ring: AsyncFixedRing<SoftQp> = AsyncFixedRing::new(FixedRing::new(dev.create_cq(8).unwrap(), FixedBufs::new(&pd, 1, 64).unwrap(), FixedRingConfig::default()), Wakeup::Busy).unwrap();
    /// let mut slot = ring.take_buf().unwrap();
    /// ring.with_bufs(|bufs| bufs.bytes_mut(&mut slot)[..2].copy_from_slice(b"hi")).unwrap();
    /// assert_eq!(ring.with_bufs(|bufs| bufs.bytes(&slot)[..2].to_vec()).unwrap(), b"hi");
    /// ```
    pub fn with_bufs<R>(&self, f: impl FnOnce(&FixedBufs) -> R) -> Result<R, Error> {
        self.shared.with(|inner| {
            let ring = inner.ring.as_ref().ok_or(Error::Closed)?;
            Ok(f(ring.bufs()))
        })
    }

    /// The completion channel's descriptor, for your reactor
    /// ([`Wakeup::Reactor`]); `None` without a channel.
    ///
    /// ```
    /// # use rdma_ring::backend::soft::{SoftDevice, SoftQp};
    /// # use rdma_ring::fixed::{FixedBufs, FixedRing, FixedRingConfig};
    /// # use rdma_ring::future::{AsyncFixedRing, Wakeup};
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// let ring: AsyncFixedRing<SoftQp> = AsyncFixedRing::new(FixedRing::new(dev.create_cq(8).unwrap(), FixedBufs::new(&pd, 1, 64).unwrap(), FixedRingConfig::default()), Wakeup::Busy).unwrap();
    /// assert!(ring.completion_fd().is_none()); // busy polling arms no channel
    /// ```
    pub fn completion_fd(&self) -> Option<CompletionFd> {
        self.shared.events.clone().map(CompletionFd)
    }

    /// Takes pending completion events, re-arms the channel, posts what
    /// waits to be, then moves every completion to its future (waking
    /// it). Call it whenever the completion descriptor is readable.
    /// Returns how many completions it handed out. An error (the channel
    /// or the device failed) is reported once the completions that could
    /// be reaped reached their futures; keep driving: a driver that stops
    /// strands every pending future (pause a little after an error: a
    /// channel whose device is gone may stay readable). After a failed arm,
    /// [`tick`](Self::tick) drives until an arm succeeds.
    ///
    /// ```
    /// # use rdma_ring::backend::soft::{SoftDevice, SoftQp};
    /// # use rdma_ring::fixed::{FixedBufs, FixedRing, FixedRingConfig};
    /// # use rdma_ring::future::{AsyncFixedRing, Wakeup};
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// let ring: AsyncFixedRing<SoftQp> = AsyncFixedRing::new(FixedRing::new(dev.create_cq(8).unwrap(), FixedBufs::new(&pd, 1, 64).unwrap(), FixedRingConfig::default()), Wakeup::Reactor).unwrap();
    /// assert_eq!(ring.drive().unwrap(), 0);
    /// ```
    pub fn drive(&self) -> Result<usize, Error> {
        self.shared.drive()
    }

    /// The ring's idle-time work, for a reactor's timer: asks the queue
    /// pairs whether their peer left and fails those that say so, as
    /// [`FixedRing::check_peers`] does, their futures resolving flushed
    /// (returns how many it failed). Nothing raises a completion event for
    /// a peer that left, so with [`Wakeup::Reactor`] and rdma_cm queue
    /// pairs, call it every 100 ms or so; the notifier thread of
    /// [`Wakeup::Thread`] does, every 250 ms.
    ///
    /// ```
    /// # use rdma_ring::backend::soft::{SoftDevice, SoftQp};
    /// # use rdma_ring::fixed::{FixedBufs, FixedRing, FixedRingConfig};
    /// # use rdma_ring::future::{AsyncFixedRing, Wakeup};
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// let ring: AsyncFixedRing<SoftQp> = AsyncFixedRing::new(FixedRing::new(dev.create_cq(8).unwrap(), FixedBufs::new(&pd, 1, 64).unwrap(), FixedRingConfig::default()), Wakeup::Reactor).unwrap();
    /// assert_eq!(ring.tick(), 0);
    /// ```
    pub fn tick(&self) -> usize {
        self.shared.tick()
    }

    /// A handle that can [`drive`](FixedDriver::drive) the ring (from a
    /// reactor task) without keeping it open: the ring still closes when
    /// the last [`AsyncFixedRing`] handle drops.
    ///
    /// ```
    /// # use rdma_ring::backend::soft::{SoftDevice, SoftQp};
    /// # use rdma_ring::fixed::{FixedBufs, FixedRing, FixedRingConfig};
    /// # use rdma_ring::future::{AsyncFixedRing, Wakeup};
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// let ring: AsyncFixedRing<SoftQp> = AsyncFixedRing::new(FixedRing::new(dev.create_cq(8).unwrap(), FixedBufs::new(&pd, 1, 64).unwrap(), FixedRingConfig::default()), Wakeup::Reactor).unwrap();
    /// let driver = ring.driver();
    /// drop(ring);
    /// assert_eq!(driver.drive().unwrap(), 0); // closed: nothing to hand out
    /// ```
    pub fn driver(&self) -> FixedDriver<Q> {
        FixedDriver {
            shared: Arc::clone(&self.shared),
        }
    }

    /// Closes the ring now, as dropping the last handle does: every queue
    /// pair moves to error and is drained, so pending futures resolve with
    /// their flushed completions, and further pushes are refused with
    /// [`Error::Closed`]. This waits, with the ring locked, up to the
    /// ring's `drain_timeout` (once, for all queue pairs) for the device
    /// to flush.
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::SoftDevice, QpConfig, QueuePair, WcStatus};
    /// # use rdma_ring::fixed::{FixedBufs, FixedRing, FixedRingConfig, RecvFixed};
    /// # use rdma_ring::future::{AsyncFixedRing, Wakeup};
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// # let (mut qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    /// # let cq = qp.take_cq().unwrap();
    /// let ring = AsyncFixedRing::new(FixedRing::new(cq, FixedBufs::new(&pd, 4, 64).unwrap(), FixedRingConfig::default()), Wakeup::Busy).unwrap();
    /// let conn = ring.attach(qp).unwrap();
    /// let recv = ring.push(conn, RecvFixed::new(ring.take_buf().unwrap())).unwrap();
    /// ring.close();
    /// let done = futures::executor::block_on(recv).unwrap();
    /// assert_eq!(done.status(), WcStatus::WrFlushErr); // never posted: flushed
    /// assert!(ring.take_buf().is_none());
    /// ```
    pub fn close(&self) {
        self.shared.close();
    }
}

impl<Q: QueuePair + Send + 'static> Clone for AsyncFixedRing<Q> {
    fn clone(&self) -> Self {
        self.shared.handles.fetch_add(1, Ordering::AcqRel);
        AsyncFixedRing {
            shared: Arc::clone(&self.shared),
            notifier: self.notifier.clone(),
        }
    }
}

impl<Q: QueuePair + Send + 'static> Drop for AsyncFixedRing<Q> {
    fn drop(&mut self) {
        if self.shared.handles.fetch_sub(1, Ordering::AcqRel) != 1 {
            return;
        }
        self.shared.close();
        if let Some(notifier) = &self.notifier {
            notifier.join();
        }
    }
}

impl<Q: QueuePair + Send + 'static> fmt::Debug for AsyncFixedRing<Q> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = self.shared.lock();
        f.debug_struct("AsyncFixedRing")
            .field("wakeup", &self.shared.wakeup)
            .field("ring", &inner.ring)
            .field("ended", &inner.ended)
            .finish()
    }
}

/// Drives an [`AsyncFixedRing`] from a reactor task; see
/// [`AsyncFixedRing::driver`]. The [module docs](crate::future) show
/// driver tasks for tokio and smol.
///
/// ```
/// # use rdma_ring::backend::soft::{SoftDevice, SoftQp};
/// # use rdma_ring::fixed::{FixedBufs, FixedRing, FixedRingConfig};
/// use rdma_ring::future::{AsyncFixedRing, FixedDriver, Wakeup};
/// # let dev = SoftDevice::new();
/// # let pd = dev.alloc_pd();
/// let ring: AsyncFixedRing<SoftQp> = AsyncFixedRing::new(FixedRing::new(dev.create_cq(8).unwrap(), FixedBufs::new(&pd, 1, 64).unwrap(), FixedRingConfig::default()), Wakeup::Reactor).unwrap();
/// let driver: FixedDriver<SoftQp> = ring.driver();
/// std::thread::spawn(move || driver.drive().unwrap()).join().unwrap();
/// ```
pub struct FixedDriver<Q: QueuePair> {
    shared: Arc<FixedShared<Q>>,
}

impl<Q: QueuePair> FixedDriver<Q> {
    /// See [`AsyncFixedRing::drive`].
    ///
    /// ```
    /// # use rdma_ring::backend::soft::{SoftDevice, SoftQp};
    /// # use rdma_ring::fixed::{FixedBufs, FixedRing, FixedRingConfig};
    /// # use rdma_ring::future::{AsyncFixedRing, Wakeup};
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// # let ring: AsyncFixedRing<SoftQp> = AsyncFixedRing::new(FixedRing::new(dev.create_cq(8).unwrap(), FixedBufs::new(&pd, 1, 64).unwrap(), FixedRingConfig::default()), Wakeup::Reactor).unwrap();
    /// assert_eq!(ring.driver().drive().unwrap(), 0);
    /// ```
    pub fn drive(&self) -> Result<usize, Error> {
        self.shared.drive()
    }

    /// See [`AsyncFixedRing::tick`].
    ///
    /// ```
    /// # use rdma_ring::backend::soft::{SoftDevice, SoftQp};
    /// # use rdma_ring::fixed::{FixedBufs, FixedRing, FixedRingConfig};
    /// # use rdma_ring::future::{AsyncFixedRing, Wakeup};
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// # let ring: AsyncFixedRing<SoftQp> = AsyncFixedRing::new(FixedRing::new(dev.create_cq(8).unwrap(), FixedBufs::new(&pd, 1, 64).unwrap(), FixedRingConfig::default()), Wakeup::Reactor).unwrap();
    /// assert_eq!(ring.driver().tick(), 0);
    /// ```
    pub fn tick(&self) -> usize {
        self.shared.tick()
    }

    /// See [`AsyncFixedRing::completion_fd`].
    ///
    /// ```
    /// # use rdma_ring::backend::soft::{SoftDevice, SoftQp};
    /// # use rdma_ring::fixed::{FixedBufs, FixedRing, FixedRingConfig};
    /// # use rdma_ring::future::{AsyncFixedRing, Wakeup};
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// # let ring: AsyncFixedRing<SoftQp> = AsyncFixedRing::new(FixedRing::new(dev.create_cq(8).unwrap(), FixedBufs::new(&pd, 1, 64).unwrap(), FixedRingConfig::default()), Wakeup::Reactor).unwrap();
    /// assert!(ring.driver().completion_fd().is_some());
    /// ```
    pub fn completion_fd(&self) -> Option<CompletionFd> {
        self.shared.events.clone().map(CompletionFd)
    }
}

impl<Q: QueuePair> Clone for FixedDriver<Q> {
    fn clone(&self) -> Self {
        FixedDriver {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<Q: QueuePair> fmt::Debug for FixedDriver<Q> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FixedDriver")
            .field("wakeup", &self.shared.wakeup)
            .finish()
    }
}

/// One operation pushed through an [`AsyncFixedRing`]: resolves to its
/// [`FixedCompletion`], or to [`Error::Closed`] (or
/// [`Error::RingFailed`]) if the ring can no longer give it back. Dropping
/// it does not cancel the operation (see [`AsyncFixedRing`]).
///
/// ```
/// # use rdma_ring::backend::{soft::SoftDevice, QpConfig, QueuePair};
/// # use rdma_ring::buf::{ExposedBuf, RemoteAccess};
/// # use rdma_ring::fixed::{FixedBufs, FixedRing, FixedRingConfig, WriteFixed};
/// # use rdma_ring::future::{AsyncFixedRing, Wakeup};
/// # let dev = SoftDevice::new();
/// # let pd = dev.alloc_pd();
/// # let (mut qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
/// # let target = ExposedBuf::new(&pd, vec![0u8; 64], RemoteAccess::WRITE).unwrap();
/// # let cq = qp.take_cq().unwrap();
/// let ring = AsyncFixedRing::new(FixedRing::new(cq, FixedBufs::new(&pd, 1, 64).unwrap(), FixedRingConfig::default()), Wakeup::Busy).unwrap();
/// let conn = ring.attach(qp).unwrap();
/// let write = ring.push(conn, WriteFixed::new(ring.take_buf().unwrap(), 64, target.remote())).unwrap();
/// drop(write); // the write still runs; its slot comes back when it completes
/// ring.submit().unwrap();
/// futures::executor::block_on(async {
///     while ring.take_buf().is_none() {
///         ring.drive().unwrap();
///     }
/// });
/// ```
#[must_use = "an operation runs whether or not its future is awaited; await it for the outcome and the slot"]
pub struct FixedOpFuture<Q: QueuePair> {
    shared: Arc<FixedShared<Q>>,
    key: u32,
    polled: bool,
    resolved: bool,
}

impl<Q: QueuePair> Future for FixedOpFuture<Q> {
    type Output = Result<FixedCompletion, Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        assert!(!this.resolved, "a FixedOpFuture polled after it resolved");
        let key = this.key;
        let first = !std::mem::replace(&mut this.polled, true);
        let poll = this
            .shared
            .with(|inner| inner.poll_op(key, cx.waker(), first));
        match poll {
            Poll::Ready(output) => {
                this.resolved = true;
                Poll::Ready(output)
            }
            Poll::Pending => {
                // Busy polling reschedules at once.
                if this.shared.wakeup == Wakeup::Busy {
                    cx.waker().wake_by_ref();
                }
                Poll::Pending
            }
        }
    }
}

impl<Q: QueuePair> Drop for FixedOpFuture<Q> {
    fn drop(&mut self) {
        if !self.resolved {
            let key = self.key;
            self.shared.with(|inner| inner.forget(key));
        }
    }
}

impl<Q: QueuePair> fmt::Debug for FixedOpFuture<Q> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FixedOpFuture")
            .field("key", &self.key)
            .field("resolved", &self.resolved)
            .finish()
    }
}
