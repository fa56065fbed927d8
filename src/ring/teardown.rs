//! Closing a ring with work in flight: error, drain, destroy, and only then
//! release.

use super::lifecycle::Owner;
use super::{Completion, Key, QueueRef, Ring};
use crate::backend::{QueuePair, SharedReceiveQueue};
use crate::buf::SingleBuf;
use crate::deadline::Deadline;
use crate::error::Error;

impl<Q: QueuePair> Ring<Q> {
    /// Closes the ring and hands back every operation it still holds, each
    /// with its buffers: completions already reaped, then operations flushed
    /// by moving every queue pair to error (what each never posted after
    /// what it did, so a queue pair's keep the order its work was pushed
    /// in), then the receives still posted to shared receive queues (after
    /// the queue pairs and those queues are destroyed). Operations the
    /// device did not return within
    /// [`RingConfig::drain_timeout`](super::RingConfig) are leaked (their
    /// memory is never freed while the NIC may use it) and are not in the
    /// list.
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

    /// Error, drain, destroy, release. Returns whether every posted
    /// operation came back; the ring is closed afterwards either way.
    pub(super) fn shutdown(&mut self) -> bool {
        if self.closed {
            return !self.slab_holds_posted();
        }
        self.closed = true;
        let qps = self.qps.keys();
        let srqs = self.srqs.keys();
        // What the queue pairs never posted comes back after what they
        // did, below.
        let unposted: Vec<Vec<Key>> = qps
            .iter()
            .map(|&key| self.take_pending(QueueRef::Qp(key)))
            .collect();
        for &key in &srqs {
            self.flush_pending(QueueRef::Srq(key));
        }
        // Every queue pair to error, idle ones too: one on a shared receive
        // queue must stop taking its receives before the queue goes.
        let mut refused = Vec::new();
        for &key in &qps {
            if !self.start_drain(key, true) {
                refused.push(key);
            }
        }
        let deadline = Deadline::after(self.config.drain_timeout);
        let busy = |ring: &Self, key: Key| {
            ring.qps
                .get(key)
                .is_some_and(|slot| slot.outstanding() > 0 || slot.drain.is_some())
        };
        while qps.iter().any(|&k| !refused.contains(&k) && busy(self, k)) {
            // Unknown wr_ids are counted in stats; teardown goes on.
            let _ = self.reap_device();
            if deadline.expired() || self.cq_lost {
                break;
            }
            std::thread::yield_now();
        }
        // Completions already queued (receives of a shared queue that a
        // message filled, say) are taken while their queue pairs are still
        // known, so none is mistaken for an unconsumed receive below.
        self.reap_queued();
        for keys in unposted {
            self.flush_unposted(keys);
        }
        let mut drained = true;
        for &key in &qps {
            if busy(self, key) {
                drained = false;
                self.leak_ops_of(QueueRef::Qp(key));
            }
        }
        // Queue pairs first: a shared receive queue cannot be destroyed while
        // one is attached, and none may take a receive once it is gone.
        for key in self.qps.keys() {
            drop(self.qps.remove(key));
        }
        self.by_qpn.clear();
        self.default_qp = None;
        for &key in &srqs {
            let destroyed = drained
                && self
                    .srqs
                    .get_mut(key)
                    .is_some_and(|s| s.srq.destroy().is_ok());
            if destroyed {
                self.release_srq_receives(key);
            } else {
                drained = false;
                self.leak_ops_of(QueueRef::Srq(key));
            }
        }
        self.wake_stream();
        drained
    }

    /// Reaps until the completion queue has nothing more to give now
    /// (past CQEs naming nothing of ours, which are counted in stats).
    pub(super) fn reap_queued(&mut self) {
        let batch = self.scratch.len().max(1);
        for _ in 0..self.cq_entries / batch + 1 {
            match self.reap_device() {
                Ok(n) if n >= batch => {}
                // Its batch may have been full: poll on.
                Err(Error::UnknownWrId { .. }) => {}
                _ => break,
            }
        }
    }

    /// Whether any operation the device may still hold is in the slab.
    fn slab_holds_posted(&self) -> bool {
        self.slab
            .keys()
            .into_iter()
            .any(|k| self.slab.get(k).is_some_and(|op| op.posted))
    }

    /// The device may still hold `queue`'s posted operations and will not
    /// give them back: keep their buffers forever. Operations owned by the
    /// completion queue or orphaned are taken out (their memory leaked);
    /// those a future awaits stay, and that future stays pending (the ring
    /// forgets their buffers when it is dropped). Their CQE budget stays
    /// spent: a late completion still finds room.
    pub(super) fn leak_ops_of(&mut self, queue: QueueRef) {
        let keys: Vec<Key> = self
            .slab
            .keys()
            .into_iter()
            .filter(|k| {
                self.slab
                    .get(*k)
                    .is_some_and(|op| op.queue == queue && op.posted)
            })
            .collect();
        for key in keys {
            let op = self.slab.get(key).expect("listed above");
            if matches!(op.owner, Owner::Awaited { .. }) {
                continue;
            }
            let op = self.slab.remove(key).expect("listed above");
            if matches!(op.owner, Owner::Queue) {
                self.queued_in_flight -= 1;
            }
            // The length from the buffer's range, not through a slice of
            // its bytes: the device may be writing them.
            for buf in op.bufs.iter() {
                crate::leak::record_buffer(buf.single_len());
            }
            std::mem::forget(op.bufs);
        }
    }
}

impl<Q: QueuePair> Drop for Ring<Q> {
    fn drop(&mut self) {
        self.shutdown();
        // What is left in the slab and posted is what the device may still
        // hold (leaked above, or awaited by a future that will never see
        // it): never free it.
        for op in self.slab.drain() {
            if op.posted {
                for buf in op.bufs.iter() {
                    crate::leak::record_buffer(buf.single_len());
                }
                std::mem::forget(op.bufs);
            }
        }
    }
}
