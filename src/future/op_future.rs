//! [`OpFuture`]: one awaited operation.

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};

use super::{Shared, Wakeup};
use crate::backend::QueuePair;
use crate::buf::{IoBuf, IoBufMut};
use crate::error::Error;
use crate::op::Operation;
use crate::ring::{Completion, Key, QpHandle, SrqHandle};

/// What a receive got. `len` counts only bytes in the receive's own
/// buffer, so `&buf[..len]` never reaches past what arrived: a receive an
/// RDMA WRITE with immediate consumed has `len` 0, and what the WRITE put
/// in the peer's chosen region is `written`.
///
/// ```
/// use rdma_ring::future::Received;
/// let r = Received { len: 5, written: 0, imm: Some(7), write_imm: false, qp: None };
/// assert_eq!(r.imm, Some(7));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Received {
    /// Bytes that arrived in the buffer (0 for an RDMA WRITE with
    /// immediate, which leaves the buffer untouched).
    pub len: usize,
    /// For an RDMA WRITE with immediate, the bytes it wrote (into the
    /// region it targeted, not this buffer); 0 for a SEND.
    pub written: usize,
    /// Immediate data, if the sender sent some.
    pub imm: Option<u32>,
    /// Whether an RDMA WRITE with immediate consumed the receive (the
    /// buffer is untouched) rather than a SEND.
    pub write_imm: bool,
    /// The queue pair the message arrived on (for a shared receive queue's
    /// receive, the one that consumed it).
    pub qp: Option<QpHandle>,
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
            written: if c.is_write_imm() {
                c.byte_len() as usize
            } else {
                0
            },
            imm: c.imm(),
            write_imm: c.is_write_imm(),
            qp: c.qp(),
        })
    }
}

pub(super) enum State<B> {
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
    /// Polled before: a first poll may leave the doorbell to the next.
    polled: bool,
    _out: PhantomData<fn() -> O>,
}

impl<Q: QueuePair> Shared<Q> {
    /// Pushes `op` to queue pair `qp` (the default one for `None`) for a
    /// future, without submitting.
    pub(super) fn push_on<T: Operation, O>(
        self: &Arc<Self>,
        qp: Option<QpHandle>,
        op: T,
    ) -> OpFuture<Q, T::Buf, O> {
        let state = self.with(|ring| State::pushed(ring.push_awaited(qp, op)));
        self.future(state)
    }

    /// Pushes `op` and submits it at once — or, when the ring coalesces
    /// doorbells, at the second poll of a future whose operation waits for
    /// its doorbell, or drive (so operations pushed by many tasks in one
    /// round of the executor share one doorbell), or when `DEFERRED_MAX`
    /// wait. Awaited operations the device refused resolve through their
    /// futures (flushed: they never ran); operations pushed for the
    /// completion queue go to it, so nothing is lost.
    pub(super) fn op_on<T: Operation, O>(
        self: &Arc<Self>,
        qp: Option<QpHandle>,
        op: T,
    ) -> OpFuture<Q, T::Buf, O> {
        let is_recv = op.kind() == crate::op::OpKind::Recv;
        // The state is written into the future in place, rather than
        // returned through the lock and moved in (it holds a buffer and an
        // error for a refusal, so it is large).
        let mut future = self.future(State::Done);
        let state = &mut future.state;
        self.with(|ring| {
            // Read under the ring's lock, so that turning coalescing off
            // (which flushes under it) leaves nothing deferred behind.
            let defer = !is_recv && self.coalesce.load(Ordering::Acquire);
            // What is replaced is the `Done` just made, which holds
            // nothing: forgetting it spares the push a call to the state's
            // drop glue.
            let old = std::mem::replace(state, State::pushed(ring.push_awaited(qp, op)));
            debug_assert!(matches!(old, State::Done));
            std::mem::forget(old);
            // Short-circuit: the count moves only for deferred operations.
            if matches!(state, State::InFlight(_))
                && (!defer
                    || self.deferred.fetch_add(1, Ordering::AcqRel) + 1 >= super::DEFERRED_MAX)
            {
                if let Some(error) = self.submit_pushed(ring) {
                    refused_at_post(ring, state, error);
                }
            }
        });
        future
    }

    /// A receive on shared receive queue `srq`, submitted at once.
    pub(super) fn srq_recv<B: IoBufMut>(
        self: &Arc<Self>,
        srq: SrqHandle,
        buf: B,
    ) -> OpFuture<Q, B, Received> {
        let op = crate::op::Recv::new(buf);
        let mut future = self.future(State::Done);
        let state = &mut future.state;
        // Pushed and submitted under one lock: nothing can post or reap
        // the receive in between, so only this submit's refusal can have
        // finished it after.
        self.with(|ring| {
            *state = State::pushed(ring.push_srq_awaited(srq, op));
            if matches!(state, State::InFlight(_)) {
                if let Some(error) = self.submit_pushed(ring) {
                    refused_at_post(ring, state, error);
                }
            }
        });
        future
    }

    fn future<B, O>(self: &Arc<Self>, state: State<B>) -> OpFuture<Q, B, O> {
        OpFuture {
            shared: Arc::clone(self),
            state,
            polled: false,
            _out: PhantomData,
        }
    }
}

/// After a submit the device refused: an operation of `state` that the
/// refusal handed back (flushed: it never ran) is refused as a push is,
/// so that [`OpFuture::was_refused`] tells its caller at once that nothing
/// was posted. Only the refusal can have finished it here: a submit does
/// not reap.
fn refused_at_post<Q: QueuePair, B: IoBuf>(
    ring: &mut crate::ring::Ring<Q>,
    state: &mut State<B>,
    error: Error,
) {
    if let State::InFlight(key) = *state {
        if let Some(completion) = ring.take_awaited_if_done(key) {
            let buf = B::from_bufs(completion.into_bufs()).unwrap_or_else(|_| {
                unreachable!("the ring hands back the buffer type it was given")
            });
            *state = State::Failed(Some((error, buf)));
        }
    }
}

impl<B> State<B> {
    fn pushed<T: Operation<Buf = B>>(pushed: Result<Key, crate::error::Rejected<T>>) -> Self {
        match pushed {
            Ok(key) => State::InFlight(key),
            Err(rejected) => {
                let (error, op) = rejected.into_parts();
                State::Failed(Some((error, op.into_buf())))
            }
        }
    }
}

// Nothing in the future is ever pinned in place (the buffer moves out on
// completion), so it is `Unpin` whatever the buffer type.
impl<Q: QueuePair, B, O> OpFuture<Q, B, O> {
    /// Whether the push was refused (a full queue, a buffer of another
    /// protection domain, a closed ring, …), or the device refused the
    /// post that the push's own submit made (a NIC out of resources):
    /// nothing was posted, and the future resolves at once with the error
    /// and the buffer. (With doorbell coalescing the post comes later, and
    /// a refusal then resolves the future as flushed.)
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::SoftDevice, QpConfig};
    /// # use rdma_ring::buf::RegisteredBuf;
    /// # use rdma_ring::future::{AsyncRing, Wakeup};
    /// # use rdma_ring::ring::{Ring, RingConfig};
    /// let dev = SoftDevice::new();
    /// let (pd, other) = (dev.alloc_pd(), dev.alloc_pd());
    /// let (qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    /// let control = qp.control();
    /// let ring = AsyncRing::new(Ring::new(qp, RingConfig::default()), Wakeup::Busy).unwrap();
    /// let foreign = RegisteredBuf::new(&other, vec![0u8; 8]).unwrap();
    /// assert!(ring.send(foreign).was_refused()); // wrong protection domain
    /// control.refuse_posts(1);
    /// let send = ring.send(RegisteredBuf::new(&pd, vec![0u8; 8]).unwrap());
    /// assert!(send.was_refused()); // the device refused its post
    /// let (result, _buf) = futures::executor::block_on(send);
    /// assert!(result.unwrap_err().to_string().contains("out of resources"));
    /// ```
    pub fn was_refused(&self) -> bool {
        matches!(self.state, State::Failed(_))
    }
}

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
                let first = !std::mem::replace(&mut this.polled, true);
                if first && this.shared.holds_deferred() {
                    // Coalescing: the first poll yields once, waking its own
                    // task, so that the tasks the executor polls before it
                    // comes back add their operations to the same doorbell.
                    // The delay is bounded by one round of the executor:
                    // this future's next poll posts them all.
                    cx.waker().wake_by_ref();
                    return Poll::Pending;
                }
                // The completion becomes the output under the lock, so
                // that what comes out of it is the small output rather than
                // the whole completion.
                let output = |completion: Completion| {
                    let result = O::from_completion(&completion);
                    let buf = B::from_bufs(completion.into_bufs()).unwrap_or_else(|_| {
                        unreachable!("the ring hands back the buffer type it was given")
                    });
                    (result, buf)
                };
                let polled = this.shared.with(|ring| {
                    // Finished by an earlier dispatch (another future's, or
                    // the driver's): no trip to the device.
                    if let Some(completion) = ring.take_awaited_if_done(key) {
                        return Some(output(completion));
                    }
                    // Only a future whose own operation still waits for its
                    // doorbell rings it (for every operation waiting): one
                    // whose operation is out leaves the operations pushed in
                    // this round of the executor to their own futures. A
                    // pushed one awaited before any submit is among them:
                    // left for a submit, it would wait for ever.
                    if ring.awaits_doorbell(key) {
                        // What the device refuses goes to its futures.
                        let _ = this.shared.submit_pushed(ring);
                    }
                    // Unknown CQEs are counted in the ring's stats; they
                    // cannot belong to this operation.
                    let _ = ring.dispatch();
                    ring.poll_awaited(key, cx.waker()).map(output)
                });
                match polled {
                    Some(output) => {
                        // The state replaced is `InFlight`, which holds
                        // nothing to drop: forgetting it spares a call to
                        // the state's drop glue.
                        std::mem::forget(std::mem::replace(&mut this.state, State::Done));
                        Poll::Ready(output)
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
            self.shared.with(|ring| {
                // An operation dropped before it went out goes out now, with
                // whatever waits for the same doorbell, as the fixed
                // adapter's do: left pushed, it would go out at whichever
                // submit came next, maybe long after the caller moved on
                // (a remote region reused meanwhile). A coalesced one goes
                // out as it would have without coalescing.
                if ring.awaits_doorbell(key) {
                    let _ = self.shared.submit_pushed(ring);
                }
                ring.orphan(key)
            });
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
