//! Shared receive queues of the soft device.

use std::sync::Arc;

use super::post::{elements, refuse};
use super::state::{QueuedRecv, SrqEntry};
use super::{after_post, Shared};
use crate::backend::{PostError, RecvWr, Sge, SharedReceiveQueue, SrqCaps};
use crate::error::Error;

/// A soft shared receive queue: receives posted once, consumed by
/// whichever of its queue pairs a message arrives on. A SEND to a queue
/// pair whose shared queue is empty is answered with RNR NAKs, like a
/// private receive queue.
///
/// ```
/// use rdma_ring::backend::soft::SoftDevice;
/// use rdma_ring::backend::{SharedReceiveQueue, SrqConfig};
/// let dev = SoftDevice::new();
/// let pd = dev.alloc_pd();
/// let srq = dev.create_srq(&pd, SrqConfig { max_wr: 64, max_sge: 2 }).unwrap();
/// assert_eq!(srq.caps().max_wr, 64);
/// ```
pub struct SoftSrq {
    pub(super) shared: Arc<Shared>,
    pub(super) index: usize,
    pub(super) caps: SrqCaps,
    pub(super) destroyed: bool,
}

impl std::fmt::Debug for SoftSrq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SoftSrq")
            .field("index", &self.index)
            .field("caps", &self.caps)
            .finish()
    }
}

impl SoftSrq {
    pub(super) fn new(shared: &Arc<Shared>, index: usize, caps: SrqCaps) -> Self {
        SoftSrq {
            shared: Arc::clone(shared),
            index,
            caps,
            destroyed: false,
        }
    }

    /// Receives posted and not yet consumed.
    pub fn posted(&self) -> usize {
        self.shared
            .lock()
            .srq(self.index)
            .map_or(0, |srq| srq.queue.len())
    }

    /// The armed low-water mark (0: disarmed, as after it fired).
    pub fn limit(&self) -> u32 {
        self.shared
            .lock()
            .srq(self.index)
            .map_or(0, |srq| srq.limit)
    }
}

/// Checks each receive, then queues it.
fn push_receives(srq: &mut SrqEntry, wrs: &[RecvWr], sges: &[Sge]) -> Result<(), PostError> {
    for (i, wr) in wrs.iter().enumerate() {
        // Its depth bounds receives whose CQEs are not yet polled, not
        // only those waiting for a message.
        if srq.held >= srq.config.max_wr {
            return Err(refuse(i, "shared receive queue full"));
        }
        let list = elements(
            i,
            wr.sges,
            sges,
            srq.config.max_sge,
            "more scatter/gather elements than max_sge",
        )?;
        srq.queue.push_back(QueuedRecv {
            wr_id: wr.wr_id,
            sges: list.iter().copied().collect(),
        });
        srq.held += 1;
    }
    Ok(())
}

// SAFETY: a receive posted here is taken at most once, by a queue pair whose
// `srq` is this queue, and reported on that queue pair's completion queue
// with its number once its data has landed (or it failed); `destroy`
// removes the queue under the device lock, after which no execution finds
// its receives. Posts take a prefix and report its length exactly.
unsafe impl SharedReceiveQueue for SoftSrq {
    fn caps(&self) -> SrqCaps {
        self.caps
    }

    unsafe fn post_recv(&mut self, wrs: &[RecvWr], sges: &[Sge]) -> Result<(), PostError> {
        let mut state = self.shared.lock();
        let srq = state
            .srq(self.index)
            .ok_or_else(|| refuse(0, "shared receive queue destroyed"))?;
        let result = push_receives(srq, wrs, sges);
        after_post(&self.shared, &mut state);
        result
    }

    fn arm_limit(&mut self, limit: u32) -> Result<(), Error> {
        let mut state = self.shared.lock();
        let srq = state
            .srq(self.index)
            .ok_or(Error::Soft("shared receive queue destroyed"))?;
        if limit > srq.config.max_wr {
            return Err(Error::Soft("the limit exceeds the queue's depth"));
        }
        srq.limit = limit;
        Ok(())
    }

    fn destroy(&mut self) -> Result<(), Error> {
        if self.destroyed {
            return Ok(());
        }
        let mut state = self.shared.lock();
        let srq = state
            .srq(self.index)
            .ok_or(Error::Soft("shared receive queue destroyed"))?;
        if srq.attached > 0 {
            return Err(Error::Soft(
                "queue pairs are still attached to the shared receive queue",
            ));
        }
        state.srqs[self.index] = None;
        self.destroyed = true;
        Ok(())
    }
}

impl Drop for SoftSrq {
    fn drop(&mut self) {
        // Still attached: the queue stays for its queue pairs.
        let _ = self.destroy();
    }
}
