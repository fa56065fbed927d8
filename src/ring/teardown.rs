//! Closing a ring with work in flight: error, drain, and only then release.

use super::{Completion, Ring, DRAIN_WR_ID};
use crate::backend::{QueuePair, SendFlags, SendOpcode, SendWr, Sge, WcStatus};
use crate::deadline::Deadline;

impl<Q: QueuePair> Ring<Q> {
    /// Closes the ring and hands back every operation it still holds, each
    /// with its buffer: completions already reaped, then operations flushed
    /// by moving the queue pair to error. Operations the device did not
    /// return within [`RingConfig::drain_timeout`](super::RingConfig) are
    /// leaked (their memory is never freed while the NIC may use it) and
    /// are not in the list.
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::SoftDevice, QpConfig, WcStatus};
    /// # use rdma_ring::buf::RegisteredBuf;
    /// # use rdma_ring::op::Recv;
    /// # use rdma_ring::ring::{Ring, RingConfig};
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// # let (qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    /// let mut ring = Ring::new(qp, RingConfig::default());
    /// let buf = RegisteredBuf::new(&pd, vec![0u8; 64]).unwrap();
    /// ring.submission().push(Recv::new(buf)).unwrap();
    /// ring.submission().submit().unwrap();
    /// let back = ring.close(); // nobody sent anything: the receive is flushed
    /// assert_eq!(back.len(), 1);
    /// assert_eq!(back[0].status(), WcStatus::WrFlushErr);
    /// ```
    pub fn close(mut self) -> Vec<Completion> {
        self.shutdown();
        self.ready.drain(..).collect()
    }

    /// Error, drain, release. Returns whether every posted operation came
    /// back; the ring is closed afterwards either way.
    pub(super) fn shutdown(&mut self) -> bool {
        if self.closed {
            return self.slab.len() == 0;
        }
        self.closed = true;
        self.flush_pending();
        if self.outstanding_send + self.outstanding_recv == 0 {
            return true;
        }
        self.record_error(WcStatus::WrFlushErr);
        if self.qp.set_error().is_err() {
            return false;
        }
        // A signaled marker behind everything else: once its flush CQE
        // arrives, every earlier send has completed. The ones still without a
        // CQE then ran successfully before the error, since a flushed work
        // request always gets a CQE of its own (and that came first).
        if self.marker_reserved {
            let mut marker = SendWr::new(DRAIN_WR_ID, SendOpcode::Send, Sge::default());
            marker.flags = SendFlags::SIGNALED;
            // SAFETY: the marker has no scatter/gather element, so it names no
            // memory at all.
            if unsafe { self.qp.post_send(&[marker]) }.is_ok() {
                self.drain_posted = true;
            }
        }
        let deadline = Deadline::after(self.config.drain_timeout);
        while self.outstanding_send + self.outstanding_recv > 0 {
            // Unknown wr_ids are counted in stats; teardown goes on.
            let _ = self.reap_device();
            if deadline.expired() {
                return false;
            }
            std::thread::yield_now();
        }
        true
    }
}

impl<Q: QueuePair> Drop for Ring<Q> {
    fn drop(&mut self) {
        if !self.shutdown() {
            // The device may still own these buffers: leak them rather than
            // free memory under the NIC.
            for op in self.slab.drain() {
                if op.posted {
                    crate::leak::record_buffer(op.buf.len());
                    std::mem::forget(op.buf);
                }
            }
        }
    }
}
