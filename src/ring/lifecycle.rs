//! Who an in-flight operation goes back to: the completion queue, or a
//! future, and what happens when that future is dropped.
//!
//! Wakers are never woken nor dropped inside the ring: they are collected
//! in `Ring::wakes` and the futures adapter wakes them after releasing the
//! ring's lock, so a waker that runs or drops its task inline cannot
//! re-enter the ring, and a panicking waker cannot leave it half-updated.

use std::task::Waker;

use super::{Completion, Key, QpHandle, QueueRef, Ring, Unposted};
use crate::backend::{QueuePair, WcStatus};
use crate::buf::OwnedBufs;
use crate::error::{Error, Rejected};
use crate::op::Operation;

/// What happened to a finished operation.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Done {
    pub(crate) status: WcStatus,
    pub(crate) byte_len: u32,
    pub(crate) imm: Option<u32>,
    pub(crate) by_write_imm: bool,
    /// The queue pair it ran on (for a shared receive queue's receive: the
    /// one that consumed it, if known).
    pub(crate) qp: Option<QpHandle>,
}

/// The lifecycle of an operation's owner.
pub(crate) enum Owner {
    /// Reaped through the completion queue.
    Queue,
    /// Awaited by a future: still running (with the waker to call), or
    /// finished, its result kept until the future collects it.
    Awaited {
        waker: Option<Waker>,
        done: Option<Done>,
    },
    /// Its future was dropped: the buffers are released when the completion
    /// is reaped, never before.
    Orphaned,
    /// The ring's own sync marker: no buffer, nobody to tell.
    Marker,
}

impl<Q: QueuePair> Ring<Q> {
    /// Hands a finished operation to its owner. `byte_len` of `None` means
    /// "the buffers' length if it succeeded" (send-side operations);
    /// `ran_on` names the queue pair the operation ran on when the caller
    /// knows it is attached (a CQE just named it), or the one that consumed
    /// a shared receive queue's receive. With `None`, a queue pair's
    /// operation looks its queue pair up (it may have been detached), and a
    /// shared receive queue's receive names none. Returns whether it
    /// finished an operation (not the ring's own marker, nor a key no
    /// longer held).
    // Always inlined: most calls pass constants (a flush's status and
    // length, no immediate, a known queue pair), which then fold away.
    #[inline(always)]
    pub(super) fn finish(
        &mut self,
        key: Key,
        status: WcStatus,
        byte_len: Option<u32>,
        imm: Option<u32>,
        by_write_imm: bool,
        ran_on: Option<QpHandle>,
    ) -> bool {
        let Some(op) = self.slab.get_mut(key) else {
            return false;
        };
        let qp = match (op.queue, ran_on) {
            (_, Some(handle)) => Some(handle),
            (QueueRef::Qp(qp), None) => self.qps.get(qp).map(|_| QpHandle {
                ring: self.id,
                key: qp,
            }),
            (QueueRef::Srq(_), None) => None,
        };
        let byte_len = byte_len.unwrap_or(if status.is_success() { op.len } else { 0 });
        let done = Done {
            status,
            byte_len,
            imm,
            by_write_imm,
            qp,
        };
        if std::mem::replace(&mut op.posted, false) {
            self.expecting -= 1;
        }
        self.cqe_used -= 1;
        match &mut op.owner {
            Owner::Queue => {
                let op = self.slab.remove_present(key);
                self.queued_in_flight -= 1;
                let srq = self.srq_handle_of(op.queue);
                let completion = Completion::new(op, done, srq);
                match &mut self.reaping_into {
                    // With room known, the push has no growth path, and the
                    // completion is written straight into the vector rather
                    // than staged on the stack around a call.
                    Some(out) if out.len() < out.capacity() => out.push(completion),
                    Some(out) => out.push(completion),
                    None => {
                        self.ready.push_back(completion);
                        self.wake_stream();
                    }
                }
            }
            Owner::Awaited { waker, done: slot } => {
                *slot = Some(done);
                if let Some(waker) = waker.take() {
                    self.wakes.push(waker);
                }
            }
            Owner::Orphaned => {
                let op = self.slab.remove_present(key);
                self.let_go.push(op.bufs);
            }
            Owner::Marker => {
                self.slab.remove_present(key);
                if let Some(slot) = qp.and_then(|h| self.qps.get_mut(h.key)) {
                    debug_assert!(slot.markers_out > 0, "a marker nobody counted");
                    slot.markers_out = slot.markers_out.saturating_sub(1);
                }
                return false;
            }
        }
        true
    }

    /// A tick (the notifier thread's, or `AsyncRing::tick`): the
    /// idle-time work of a reap, which nothing else would do on a ring
    /// whose owners all wait — tries again the sync markers the device
    /// refused, reads device events, asks one queue pair whether its peer
    /// left — and wakes the completion streams' tasks (spuriously, which
    /// is allowed) for tasks that have timed work of their own. Its looks'
    /// errors have nobody to go to: a lasting one meets the next reap.
    pub(crate) fn quiet_tick(&mut self) {
        let _ = self.idle_checks();
        self.wake_stream();
    }

    pub(super) fn wake_stream(&mut self) {
        if !self.ready_wakers.is_empty() {
            self.wakes.append(&mut self.ready_wakers);
        }
    }

    /// Removes an entry, keeping any waker it holds out of the slab's drop.
    fn remove_quietly(&mut self, key: Key) -> Option<super::InFlight> {
        let mut op = self.slab.remove(key)?;
        if let Owner::Awaited { waker, .. } = &mut op.owner {
            if let Some(waker) = waker.take() {
                self.wakes.push(waker);
            }
        }
        Some(op)
    }

    /// Pushes an operation to queue pair `qp` (the default one for `None`)
    /// whose completion goes to a future.
    #[inline]
    pub(crate) fn push_awaited<T: Operation>(
        &mut self,
        qp: Option<QpHandle>,
        op: T,
    ) -> Result<Key, Rejected<T>> {
        // Matches rather than `ok_or`, whose eagerly built error would be
        // dropped on every push.
        let key = match qp {
            Some(handle) => self.qp_key(handle),
            None => self.default_qp().map(|h| h.key),
        };
        let target = match (key, qp) {
            (Some(key), _) => Ok(key),
            (None, Some(_)) => Err(Error::NotAttached("queue pair")),
            (None, None) => Err(Error::NoQueuePair),
        };
        self.push_to(target, op, Self::awaited())
    }

    pub(super) fn awaited() -> Owner {
        Owner::Awaited {
            waker: None,
            done: None,
        }
    }

    /// The completion of an awaited operation if it has already finished
    /// (nothing is polled, no waker kept): so an operation completed by an
    /// earlier poll costs its future no trip to the device.
    #[inline]
    pub(crate) fn take_awaited_if_done(&mut self, key: Key) -> Option<Completion> {
        let op = self.slab.get(key)?;
        let Owner::Awaited {
            done: Some(done), ..
        } = op.owner
        else {
            return None;
        };
        let mut op = self.slab.remove_present(key);
        // Finishing took its waker; should one be left, it is woken outside
        // the lock like any other, never dropped inside.
        if let Owner::Awaited {
            waker: waker @ Some(_),
            ..
        } = &mut op.owner
        {
            self.wakes.extend(waker.take());
        }
        let srq = self.srq_handle_of(op.queue);
        Some(Completion::new(op, done, srq))
    }

    /// Whether an awaited operation was pushed and not yet posted.
    #[inline]
    pub(crate) fn awaits_doorbell(&self, key: Key) -> bool {
        self.slab
            .get(key)
            .is_some_and(|op| !op.posted && matches!(op.owner, Owner::Awaited { done: None, .. }))
    }

    /// The completion of an awaited operation, if it finished; otherwise
    /// remembers `waker` to wake when it does.
    pub(crate) fn poll_awaited(&mut self, key: Key, waker: &Waker) -> Option<Completion> {
        let op = self.slab.get_mut(key)?;
        let Owner::Awaited { waker: slot, done } = &mut op.owner else {
            return None;
        };
        match *done {
            Some(done) => {
                let op = self.remove_quietly(key).expect("present above");
                let srq = self.srq_handle_of(op.queue);
                Some(Completion::new(op, done, srq))
            }
            None => {
                if !slot.as_ref().is_some_and(|w| w.will_wake(waker)) {
                    // The replaced waker is woken (spuriously, which is
                    // allowed) outside the lock rather than dropped inside.
                    if let Some(old) = slot.replace(waker.clone()) {
                        self.wakes.push(old);
                    }
                }
                None
            }
        }
    }

    /// The future of an operation was dropped: release the operation now if
    /// it has finished or never reached the device, else when its
    /// completion is reaped.
    pub(crate) fn orphan(&mut self, key: Key) {
        let pending = self.is_pending(key);
        let Some(op) = self.slab.get_mut(key) else {
            return;
        };
        let finished = matches!(op.owner, Owner::Awaited { done: Some(_), .. });
        if finished || (!op.posted && !pending) {
            if let Some(op) = self.remove_quietly(key) {
                self.let_go.push(op.bufs);
            }
        } else {
            if let Owner::Awaited {
                waker: Some(waker), ..
            } = std::mem::replace(&mut op.owner, Owner::Orphaned)
            {
                self.wakes.push(waker);
            }
        }
    }

    fn is_pending(&self, key: Key) -> bool {
        let wr_id = key.to_wr_id();
        let Some(op) = self.slab.get(key) else {
            return false;
        };
        match op.queue {
            QueueRef::Qp(qp) => self.qps.get(qp).is_some_and(|slot| {
                slot.pending_send.iter().any(|wr| wr.wr_id == wr_id)
                    || slot.pending_recv.iter().any(|wr| wr.wr_id == wr_id)
            }),
            QueueRef::Srq(srq) => self
                .srqs
                .get(srq)
                .is_some_and(|slot| slot.pending.iter().any(|wr| wr.wr_id == wr_id)),
        }
    }

    /// Remembers `waker` to wake when a completion is queued for the
    /// completion queue: beside the others waiting, not in their place
    /// (streams that displaced each other's wakers would wake each other
    /// for ever). A full list is woken (once the lock is let go) rather
    /// than grown: see [`register`](crate::wakers::register).
    pub(crate) fn set_ready_waker(&mut self, waker: &Waker) {
        let wakes = &mut self.wakes;
        crate::wakers::register(&mut self.ready_wakers, waker, |full| wakes.extend(full));
    }

    /// Moves every CQE the device has to its owner. A CQE that named no
    /// operation of ours is reported ([`Error::UnknownWrId`]) once the
    /// queue is drained, never before: what follows it must reach its
    /// owner too, as no event will come for it.
    pub(crate) fn dispatch(&mut self) -> Result<usize, crate::Error> {
        let mut total = 0;
        loop {
            let n = match self.reap_device() {
                Ok(n) => n,
                Err(e) => return self.dispatch_after(e),
            };
            total += n;
            if n < self.scratch.len() {
                return Ok(total);
            }
        }
    }

    /// The rest of a dispatch whose poll failed with `error`: an unknown
    /// `wr_id` is reported only once the queue is drained; anything else
    /// at once. Out of line, off the awaited path.
    #[cold]
    #[inline(never)]
    fn dispatch_after(&mut self, error: crate::Error) -> Result<usize, crate::Error> {
        let Error::UnknownWrId { .. } = error else {
            return Err(error);
        };
        loop {
            match self.reap_device() {
                Ok(n) if n < self.scratch.len() => return Err(error),
                // A full batch, or one with an unknown CQE (which may have
                // been full): poll on. Each unknown CQE is one fewer in
                // the queue, so this ends.
                Ok(_) | Err(Error::UnknownWrId { .. }) => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Operations the device refused at submit, handed to the completion
    /// queue as flushed (they never ran), so that nothing is lost when the
    /// caller of the submit was an awaited operation's future.
    pub(crate) fn requeue_unposted(&mut self, unposted: Vec<Unposted>) {
        for op in unposted {
            self.ready.push_back(Completion::unposted(op));
        }
        self.wake_stream();
    }

    /// Takes the next completion queued for the completion queue.
    pub(crate) fn pop_ready(&mut self) -> Option<Completion> {
        self.ready.pop_front()
    }

    /// Whether the completion stream has ended: the ring is closed and
    /// nothing pushed for the completion queue remains.
    pub(crate) fn stream_ended(&self) -> bool {
        self.closed && self.queued_in_flight == 0 && self.ready.is_empty()
    }

    /// Closes the ring in place: error, drain, owners get their operations.
    pub(crate) fn shutdown_in_place(&mut self) -> bool {
        let drained = self.shutdown();
        self.wake_stream();
        drained
    }

    /// Moves the wakers collected so far into `into` (which keeps its
    /// capacity, as the ring's list keeps its own), to be woken once the
    /// ring's lock is released.
    pub(crate) fn take_wakes(&mut self, into: &mut Vec<Waker>) {
        into.append(&mut self.wakes);
    }

    /// Whether wakers wait to be woken, or buffers to be dropped, once the
    /// ring's lock is released.
    #[inline]
    pub(crate) fn has_wakes(&self) -> bool {
        !self.wakes.is_empty() || !self.let_go.is_empty()
    }

    /// The buffers of operations whose futures were dropped, if there are
    /// any, to be dropped once the ring's lock is released.
    #[inline]
    pub(crate) fn take_let_go(&mut self) -> Option<Vec<OwnedBufs>> {
        if self.let_go.is_empty() {
            return None;
        }
        Some(std::mem::take(&mut self.let_go))
    }
}
