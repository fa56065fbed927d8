//! Awaiting what arrives in a shared receive queue the ring keeps topped
//! up: the completions of its refill receives, which no future of the
//! caller's owns, wait here per queue until [`AsyncFixedRing::receive`]
//! takes them.

use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use super::{AsyncFixedRing, FixedShared, Inner, Wakeup};
use crate::backend::{QueuePair, WcStatus};
use crate::error::Error;
use crate::fixed::{FixedCompletion, FixedSrq, FixedSrqRefill};

/// The tag bit of refill receives: above every future's tag (a `u32`).
/// Below it, the queue's handle's generation, unique in the process, so
/// a late completion of a queue that is gone matches no later one.
const REFILL_TAG: u64 = 1 << 63;

/// Refill receives' completions, by shared receive queue.
#[derive(Default)]
pub(super) struct Incoming {
    queues: Vec<IncomingQueue>,
}

struct IncomingQueue {
    srq: FixedSrq,
    /// The refill's own `user_data`, put back on its completions.
    user_data: u64,
    arrived: VecDeque<FixedCompletion>,
    /// The futures awaiting an arrival, by their own number (two of one
    /// task have one waker, and each takes only its own entry away).
    waiting: Vec<(u64, Waker)>,
}

/// Numbers [`SrqReceive`]s, unique in the process.
static NEXT_RECEIVE: AtomicU64 = AtomicU64::new(0);

impl Incoming {
    /// The tag of `srq`'s refill receives, whose completions get
    /// `user_data` back.
    fn tag_for(&mut self, srq: FixedSrq, user_data: u64) -> u64 {
        match self.queues.iter_mut().find(|q| q.srq == srq) {
            Some(queue) => queue.user_data = user_data,
            None => self.queues.push(IncomingQueue {
                srq,
                user_data,
                arrived: VecDeque::new(),
                waiting: Vec::new(),
            }),
        }
        REFILL_TAG | srq.generation()
    }

    /// Queues a refill receive's completion for its queue's
    /// [`receive`](AsyncFixedRing::receive), moving the tasks awaiting it
    /// to `wakes`; hands back a completion that is not one, or that is a
    /// refill receive's flushed (it carries nothing: its slot goes back,
    /// and the tasks awaiting its queue look again, as it may have been
    /// the last that could arrive).
    pub(super) fn put(
        &mut self,
        mut completion: FixedCompletion,
        wakes: &mut Vec<Waker>,
    ) -> Result<(), FixedCompletion> {
        let tag = completion.user_data();
        if tag & REFILL_TAG == 0 {
            return Err(completion);
        }
        let generation = tag & !REFILL_TAG;
        let Some(queue) = self
            .queues
            .iter_mut()
            .find(|q| q.srq.generation() == generation)
        else {
            return Err(completion);
        };
        wakes.extend(queue.waiting.drain(..).map(|(_, waker)| waker));
        if completion.status() == WcStatus::WrFlushErr {
            return Err(completion);
        }
        completion.set_user_data(queue.user_data);
        queue.arrived.push_back(completion);
        Ok(())
    }

    fn take(&mut self, srq: FixedSrq) -> Option<FixedCompletion> {
        self.queues
            .iter_mut()
            .find(|q| q.srq == srq)?
            .arrived
            .pop_front()
    }

    /// Forgets `srq`'s queue, gone from the ring, once nothing waits in it
    /// (its late completions, if any, then give their slots back).
    fn forget_if_empty(&mut self, srq: FixedSrq) {
        self.queues
            .retain(|q| q.srq != srq || !q.arrived.is_empty() || !q.waiting.is_empty());
    }

    /// Notes that future `id` awaits an arrival in `srq`'s queue, to be
    /// woken with `waker` (replacing the one it left before, which goes
    /// to `dropped`, to be dropped unlocked).
    fn wait(&mut self, srq: FixedSrq, id: u64, waker: &Waker, dropped: &mut Vec<Waker>) {
        let Some(queue) = self.queues.iter_mut().find(|q| q.srq == srq) else {
            return;
        };
        match queue.waiting.iter_mut().find(|(of, _)| *of == id) {
            Some((_, old)) if old.will_wake(waker) => {}
            Some((_, old)) => dropped.push(std::mem::replace(old, waker.clone())),
            None => queue.waiting.push((id, waker.clone())),
        }
    }

    /// Future `id` is gone: its entry leaves the list (its waker to
    /// `dropped`), so futures dropped before anything arrived do not pile
    /// up, and no other future's entry goes with it.
    fn unwait(&mut self, srq: FixedSrq, id: u64, dropped: &mut Vec<Waker>) {
        if let Some(queue) = self.queues.iter_mut().find(|q| q.srq == srq) {
            if let Some(at) = queue.waiting.iter().position(|(of, _)| *of == id) {
                dropped.push(queue.waiting.swap_remove(at).1);
            }
        }
    }

    /// Wakes the tasks awaiting `srq`'s queue, to look again.
    pub(super) fn wake(&mut self, srq: FixedSrq, wakes: &mut Vec<Waker>) {
        if let Some(queue) = self.queues.iter_mut().find(|q| q.srq == srq) {
            wakes.extend(queue.waiting.drain(..).map(|(_, waker)| waker));
        }
    }

    /// Wakes every task awaiting any queue, to look again (when a refill
    /// stopped, say, or nothing more arrives).
    pub(super) fn wake_all(&mut self, wakes: &mut Vec<Waker>) {
        for queue in &mut self.queues {
            wakes.extend(queue.waiting.drain(..).map(|(_, waker)| waker));
        }
    }
}

impl<Q: QueuePair> Inner<Q> {
    fn set_srq_refill(
        &mut self,
        srq: FixedSrq,
        refill: Option<FixedSrqRefill>,
    ) -> Result<(), Error> {
        let ring = self.ring.as_mut().ok_or(Error::Closed)?;
        ring.check_srq_refill(srq, refill.as_ref())?;
        let tag = refill.map(|r| self.futures.incoming.tag_for(srq, r.user_data));
        let set = ring.set_srq_refill_tagged(srq, refill, tag);
        self.futures.settle_refill_stop(ring);
        if refill.is_none() || set.is_err() {
            // Tasks awaiting a queue no refill feeds any more look again.
            self.futures.incoming.wake(srq, &mut self.futures.wakes);
        }
        set
    }

    /// Takes the next arrival in `srq`'s queue, reaping if none has come
    /// yet; else notes that `waker`'s task awaits one.
    fn poll_receive(
        &mut self,
        srq: FixedSrq,
        id: u64,
        waker: &Waker,
    ) -> Poll<Result<FixedCompletion, Error>> {
        if let Some(arrived) = self.futures.incoming.take(srq) {
            return Poll::Ready(Ok(arrived));
        }
        if let Some(ended) = self.ended {
            return Poll::Ready(Err(ended.error()));
        }
        self.submit_pushed();
        let _ = self.reap();
        if let Some(arrived) = self.futures.incoming.take(srq) {
            return Poll::Ready(Ok(arrived));
        }
        if let Some(ended) = self.ended {
            return Poll::Ready(Err(ended.error()));
        }
        let Some(ring) = self.ring.as_ref() else {
            return Poll::Ready(Err(Error::Closed));
        };
        match ring.srq_refill(srq) {
            Err(error) => {
                // The queue is gone and everything it held was taken.
                self.futures.incoming.forget_if_empty(srq);
                return Poll::Ready(Err(error));
            }
            // Stopped, with none of its receives left to complete.
            Ok(None) if matches!(ring.srq_refills(srq), Ok(0)) => {
                return Poll::Ready(Err(Error::Incompatible(
                    "no refill keeps the shared receive queue's receives coming (set_srq_refill)",
                )))
            }
            Ok(_) => {}
        }
        self.futures
            .incoming
            .wait(srq, id, waker, &mut self.dropped);
        Poll::Pending
    }
}

impl<Q: QueuePair + Send + 'static> AsyncFixedRing<Q> {
    /// Keeps shared receive queue `srq` topped up from the ring's free
    /// slots, as [`FixedRing::set_srq_refill`](crate::fixed::FixedRing::set_srq_refill)
    /// does (`None` stops). What arrives in the refill's receives is
    /// awaited with [`receive`](Self::receive); each completion carries
    /// the `user_data` of the refill set when it is reaped. Refused as
    /// that refuses, or once the ring is closed.
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::{SoftDevice, SoftQp}, SrqConfig};
    /// # use rdma_ring::fixed::{FixedBufs, FixedRing, FixedRingConfig, FixedSrqRefill};
    /// # use rdma_ring::future::{AsyncFixedRing, Wakeup};
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// let ring: AsyncFixedRing<SoftQp> = AsyncFixedRing::new(FixedRing::new(dev.create_cq(64).unwrap(), FixedBufs::new(&pd, 16, 64).unwrap(), FixedRingConfig::default()), Wakeup::Busy).unwrap();
    /// let srq = ring.add_srq(dev.create_srq(&pd, SrqConfig::default()).unwrap()).unwrap();
    /// ring.set_srq_refill(srq, Some(FixedSrqRefill { low: 4, target: 8, user_data: 1 })).unwrap();
    /// assert_eq!(ring.srq_posted(srq).unwrap(), 8);
    /// ```
    pub fn set_srq_refill(
        &self,
        srq: FixedSrq,
        refill: Option<FixedSrqRefill>,
    ) -> Result<(), Error> {
        self.shared.with(|inner| inner.set_srq_refill(srq, refill))
    }

    /// The next message to arrive in one of shared receive queue `srq`'s
    /// refill receives (see [`set_srq_refill`](Self::set_srq_refill)):
    /// its completion names the queue pair it came on, and holds the slot
    /// (give it back with [`put_buf`](Self::put_buf) for later refills).
    /// Arrivals wait in order until a `receive` takes them, so dropping
    /// this future loses nothing. A refill receive that comes back
    /// flushed (a refused post, the queue's removal, the close) carried
    /// nothing and does not arrive: its slot goes back to the ring. After
    /// every arrival was taken, resolves with an error once nothing more
    /// can arrive: the ring closed or failed ([`Error::Closed`],
    /// [`Error::RingFailed`]), the queue removed
    /// ([`Error::NotAttached`]), or its refill stopped with none of its
    /// receives left to complete ([`Error::Incompatible`]; those still
    /// posted when it stopped go on taking messages, which arrive here).
    ///
    /// ```
    /// use rdma_ring::backend::{soft::{SoftDevice, SoftQp}, QpConfig, SrqConfig, WcStatus};
    /// use rdma_ring::fixed::{FixedBufs, FixedRing, FixedRingConfig, FixedSrqRefill, SendFixed};
    /// use rdma_ring::future::{AsyncFixedRing, Wakeup};
    ///
    /// let dev = SoftDevice::new();
    /// let pd = dev.alloc_pd();
    /// let server: AsyncFixedRing<SoftQp> = AsyncFixedRing::new(FixedRing::new(dev.create_cq(64).unwrap(), FixedBufs::new(&pd, 16, 64).unwrap(), FixedRingConfig::default()), Wakeup::Busy).unwrap();
    /// let srq = server.add_srq(dev.create_srq(&pd, SrqConfig::default()).unwrap()).unwrap();
    /// server.set_srq_refill(srq, Some(FixedSrqRefill { low: 2, target: 4, user_data: 9 })).unwrap();
    /// let qp = server.with_srq(srq, |cq, srq| dev.create_qp_on(&pd, cq, srq, QpConfig::default())).unwrap().unwrap();
    /// let mut peer = dev.create_qp(&pd, QpConfig::default()).unwrap();
    /// dev.connect(&qp, &peer).unwrap();
    /// let conn = server.attach(qp).unwrap();
    /// # let cq = rdma_ring::backend::QueuePair::take_cq(&mut peer).unwrap();
    /// # let mut client = FixedRing::new(cq, FixedBufs::new(&pd, 1, 64).unwrap(), FixedRingConfig::default());
    /// # let to_server = client.attach(peer).unwrap();
    /// # let slot = client.take_buf().unwrap();
    /// # client.push(to_server, SendFixed::new(slot, 5)).unwrap();
    /// # client.submit().unwrap();
    /// # client.wait(1).unwrap();
    /// // A peer sent 5 bytes.
    /// let message = futures::executor::block_on(server.receive(srq)).unwrap();
    /// assert_eq!((message.qp(), message.byte_len(), message.user_data()), (conn, 5, 9));
    /// server.put_buf(message.into_buf()).unwrap();
    /// ```
    pub fn receive(&self, srq: FixedSrq) -> SrqReceive<Q> {
        SrqReceive {
            shared: Arc::clone(&self.shared),
            srq,
            id: NEXT_RECEIVE.fetch_add(1, Ordering::Relaxed),
            waiting: false,
        }
    }
}

/// The next arrival in a shared receive queue's refill receives; see
/// [`AsyncFixedRing::receive`].
#[must_use = "a receive future does nothing unless awaited"]
pub struct SrqReceive<Q: QueuePair> {
    shared: Arc<FixedShared<Q>>,
    srq: FixedSrq,
    /// Its number in the queue's list of waiting futures.
    id: u64,
    /// Whether its last poll left it in that list.
    waiting: bool,
}

impl<Q: QueuePair> Future for SrqReceive<Q> {
    type Output = Result<FixedCompletion, Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let (srq, id) = (this.srq, this.id);
        let poll = this
            .shared
            .with(|inner| inner.poll_receive(srq, id, cx.waker()));
        this.waiting = poll.is_pending();
        if poll.is_pending() && this.shared.wakeup == Wakeup::Busy {
            // Busy polling reschedules at once.
            cx.waker().wake_by_ref();
        }
        poll
    }
}

impl<Q: QueuePair> Drop for SrqReceive<Q> {
    fn drop(&mut self) {
        if self.waiting {
            let (srq, id) = (self.srq, self.id);
            self.shared
                .with(|inner| inner.futures.incoming.unwait(srq, id, &mut inner.dropped));
        }
    }
}

impl<Q: QueuePair> fmt::Debug for SrqReceive<Q> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SrqReceive")
            .field("srq", &self.srq)
            .finish()
    }
}
