//! Completion queues of the soft device.

use std::sync::{Arc, OnceLock};

use super::state::{release_slots, DeviceState, QueuedCqe};
use super::{events, kick_rnr_timer, Progress, Shared, SoftEvents};
use crate::backend::{CompletionEvents, CompletionQueue, CqId, RawCompletion};
use crate::error::Error;

/// A soft completion queue: where the completions of any number of queue
/// pairs arrive. It has one owner, the poller (a ring); queue pairs are
/// created on it with [`SoftDevice::create_qp_on`](super::SoftDevice::create_qp_on).
///
/// ```
/// use rdma_ring::backend::soft::SoftDevice;
/// use rdma_ring::backend::CompletionQueue;
/// let dev = SoftDevice::new();
/// let cq = dev.create_cq(256).unwrap();
/// assert_eq!(cq.entries(), 256);
/// ```
pub struct SoftCq {
    pub(super) shared: Arc<Shared>,
    pub(super) index: usize,
    pub(super) id: CqId,
    pub(super) entries: u32,
    pub(super) events: OnceLock<Option<Arc<SoftEvents>>>,
}

impl std::fmt::Debug for SoftCq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SoftCq")
            .field("index", &self.index)
            .field("entries", &self.entries)
            .finish()
    }
}

// SAFETY: completions come from the device state, where each is made once,
// after a work request executed or was flushed, with the number of the
// queue pair it ran on; the id and depth are fixed at creation.
unsafe impl CompletionQueue for SoftCq {
    fn id(&self) -> CqId {
        self.id
    }

    fn entries(&self) -> u32 {
        self.entries
    }

    fn poll(&mut self, out: &mut [RawCompletion]) -> Result<usize, Error> {
        let mut state = self.shared.lock();
        if state.progress == Progress::Auto {
            state.run_all(false);
            kick_rnr_timer(&self.shared, &mut state);
            self.shared.notify(&state);
        }
        let DeviceState { cqs, qps, srqs, .. } = &mut *state;
        // Not `ok_or`: its error, built eagerly, is dropped on every poll.
        let Some(cq) = cqs.get_mut(self.index).and_then(Option::as_mut) else {
            return Err(Error::Soft("completion queue destroyed"));
        };
        let mut n = 0;
        while let Some(slot) = out.get_mut(n) {
            let Some(QueuedCqe { cqe, release }) = cq.queue.pop_front() else {
                break;
            };
            *slot = cqe;
            // Polled: its work's queue slots are free again.
            release_slots(qps, srqs, slot.qp_num as usize, release);
            n += 1;
        }
        if n == 0 && cq.overrun {
            return Err(Error::CqOverrun);
        }
        Ok(n)
    }

    fn completion_events(&self) -> Option<Arc<dyn CompletionEvents>> {
        let events = self
            .events
            .get_or_init(|| events::channel(&self.shared, self.index).ok().map(Arc::new));
        events.clone().map(|e| e as Arc<dyn CompletionEvents>)
    }
}

impl Drop for SoftCq {
    fn drop(&mut self) {
        let mut state = self.shared.lock();
        let in_use = state.qps.iter().flatten().any(|qp| qp.cq == self.index);
        if in_use {
            // Queue pairs still complete here; nobody will poll.
            if let Some(cq) = state.cq(self.index) {
                cq.owned = false;
            }
        } else {
            state.remove_cq(self.index);
        }
    }
}
