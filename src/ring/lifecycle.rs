//! Who an in-flight operation goes back to: the completion queue, or a
//! future, and what happens when that future is dropped.

use std::task::Waker;

use super::{Completion, Key, Ring};
use crate::backend::{QueuePair, WcStatus};
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
        done: Option<(WcStatus, u32, Option<u32>)>,
    },
    /// Its future was dropped: the buffer is released when the completion
    /// is reaped, never before.
    Orphaned,
}

impl<Q: QueuePair> Ring<Q> {
    /// Hands a finished operation to its owner.
    pub(super) fn finish(&mut self, key: Key, status: WcStatus, byte_len: u32, imm: Option<u32>) {
        let Some(op) = self.slab.get_mut(key) else {
            return;
        };
        op.posted = false;
        match &mut op.owner {
            Owner::Queue => {
                let op = self.slab.remove(key).expect("present above");
                self.ready
                    .push_back(Completion::new(op, status, byte_len, imm));
                if let Some(waker) = self.ready_waker.take() {
                    waker.wake();
                }
            }
            Owner::Awaited { waker, done } => {
                *done = Some((status, byte_len, imm));
                if let Some(waker) = waker.take() {
                    waker.wake();
                }
            }
            Owner::Orphaned => {
                self.slab.remove(key);
            }
        }
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
            Some((status, byte_len, imm)) => {
                let op = self.slab.remove(key).expect("present above");
                Some(Completion::new(op, status, byte_len, imm))
            }
            None => {
                if !slot.as_ref().is_some_and(|w| w.will_wake(waker)) {
                    *slot = Some(waker.clone());
                }
                None
            }
        }
    }

    /// The future of an operation was dropped: release the operation now if
    /// it has finished, else when its completion is reaped.
    pub(crate) fn orphan(&mut self, key: Key) {
        let pending = self.is_pending(key);
        let Some(op) = self.slab.get_mut(key) else {
            return;
        };
        // Finished, or never handed to the device (and not about to be):
        // nothing can touch the buffer, so release it now.
        if matches!(op.owner, Owner::Awaited { done: Some(_), .. }) || (!op.posted && !pending) {
            self.slab.remove(key);
        } else {
            op.owner = Owner::Orphaned;
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
            self.ready_waker = Some(waker.clone());
        }
    }

    /// Moves CQEs from the device to their owners.
    pub(crate) fn dispatch(&mut self) -> Result<usize, crate::Error> {
        self.reap_device()
    }

    /// Takes the next completion queued for the completion queue.
    pub(crate) fn pop_ready(&mut self) -> Option<Completion> {
        self.ready.pop_front()
    }

    /// Whether the ring is closed.
    pub(crate) fn is_closed(&self) -> bool {
        self.closed
    }

    /// Closes the ring in place: error, drain, owners get their operations.
    pub(crate) fn shutdown_in_place(&mut self) -> bool {
        self.shutdown()
    }
}
