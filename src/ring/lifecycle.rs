//! Who an in-flight operation goes back to: the completion queue, or a
//! future, and what happens when that future is dropped.
//!
//! Wakers are never woken nor dropped inside the ring: they are collected
//! in `Ring::wakes` and the futures adapter wakes them after releasing the
//! ring's lock, so a waker that runs or drops its task inline cannot
//! re-enter the ring, and a panicking waker cannot leave it half-updated.

use std::task::Waker;

use super::{Completion, Key, Ring, Unposted};
use crate::backend::{QueuePair, WcStatus};
use crate::buf::IoBuf;
use crate::error::Rejected;
use crate::op::Operation;

/// The lifecycle of an operation's owner.
pub(crate) enum Owner {
    /// Reaped through the completion queue.
    Queue,
    /// Awaited by a future: still running (with the waker to call), or
    /// finished, its result kept until the future collects it.
    Awaited {
        waker: Option<Waker>,
        done: Option<(WcStatus, u32, Option<u32>, bool)>,
    },
    /// Its future was dropped: the buffer is released when the completion
    /// is reaped, never before.
    Orphaned,
}

impl<Q: QueuePair> Ring<Q> {
    /// Hands a finished operation to its owner. `byte_len` of `None` means
    /// "the buffer's length if it succeeded" (send-side operations).
    #[inline]
    pub(super) fn finish(
        &mut self,
        key: Key,
        status: WcStatus,
        byte_len: Option<u32>,
        imm: Option<u32>,
        by_write_imm: bool,
    ) {
        let Some(op) = self.slab.get_mut(key) else {
            return;
        };
        let byte_len = byte_len.unwrap_or(if status.is_success() {
            op.buf.bytes_len() as u32
        } else {
            0
        });
        op.posted = false;
        match &mut op.owner {
            Owner::Queue => {
                let op = self.slab.remove(key).expect("present above");
                self.queued_in_flight -= 1;
                self.ready
                    .push_back(Completion::new(op, status, byte_len, imm, by_write_imm));
                self.wake_stream();
            }
            Owner::Awaited { waker, done } => {
                *done = Some((status, byte_len, imm, by_write_imm));
                if let Some(waker) = waker.take() {
                    self.wakes.push(waker);
                }
            }
            Owner::Orphaned => {
                self.slab.remove(key);
            }
        }
    }

    fn wake_stream(&mut self) {
        if let Some(waker) = self.ready_waker.take() {
            self.wakes.push(waker);
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

    /// Pushes an operation whose completion goes to a future.
    pub(crate) fn push_awaited<T: Operation>(&mut self, op: T) -> Result<Key, Rejected<T>> {
        self.push_owned(
            op,
            Owner::Awaited {
                waker: None,
                done: None,
            },
        )
    }

    /// The completion of an awaited operation, if it finished; otherwise
    /// remembers `waker` to wake when it does.
    pub(crate) fn poll_awaited(&mut self, key: Key, waker: &Waker) -> Option<Completion> {
        let op = self.slab.get_mut(key)?;
        let Owner::Awaited { waker: slot, done } = &mut op.owner else {
            return None;
        };
        match *done {
            Some((status, byte_len, imm, by_write_imm)) => {
                let op = self.remove_quietly(key).expect("present above");
                Some(Completion::new(op, status, byte_len, imm, by_write_imm))
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
            self.remove_quietly(key);
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
        self.pending_send.iter().any(|wr| wr.wr_id == wr_id)
            || self.pending_recv.iter().any(|wr| wr.wr_id == wr_id)
    }

    /// Remembers `waker` to wake when a completion is queued for the
    /// completion queue.
    pub(crate) fn set_ready_waker(&mut self, waker: &Waker) {
        if !self
            .ready_waker
            .as_ref()
            .is_some_and(|w| w.will_wake(waker))
        {
            if let Some(old) = self.ready_waker.replace(waker.clone()) {
                self.wakes.push(old);
            }
        }
    }

    /// Moves every CQE the device has to its owner.
    pub(crate) fn dispatch(&mut self) -> Result<usize, crate::Error> {
        let mut total = 0;
        loop {
            let n = self.reap_device()?;
            total += n;
            if n < self.scratch.len() {
                return Ok(total);
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
}
