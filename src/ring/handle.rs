//! Handles to what a ring holds: its queue pairs and shared receive queues.

use std::sync::atomic::{AtomicU32, Ordering};

use super::slab::Key;

static NEXT_RING: AtomicU32 = AtomicU32::new(1);

/// A process-unique ring identity, so a handle of one ring is refused by
/// another.
pub(super) fn fresh_ring_id() -> u32 {
    NEXT_RING.fetch_add(1, Ordering::Relaxed)
}

/// A queue pair attached to a [`Ring`](super::Ring): what a push names
/// ([`Ring::submission_on`](super::Ring::submission_on)) and what a
/// completion reports ([`Completion::qp`](super::Completion::qp)). It names
/// that one attachment: after a detach, the handle is refused, even if
/// another queue pair takes the same place.
///
/// ```
/// # use rdma_ring::backend::{soft::SoftDevice, QpConfig};
/// # use rdma_ring::ring::{Ring, RingConfig};
/// # let dev = SoftDevice::new();
/// # let pd = dev.alloc_pd();
/// # let (qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
/// let ring = Ring::new(qp, RingConfig::default());
/// let handle = ring.default_qp().unwrap();
/// assert_eq!(ring.qp_of(handle).unwrap().qpn(), ring.qp().qpn());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct QpHandle {
    pub(super) ring: u32,
    pub(super) key: Key,
}

/// A shared receive queue held by a [`Ring`](super::Ring), as receives
/// pushed to it ([`Ring::srq_submission`](super::Ring::srq_submission)) and
/// their completions ([`Completion::srq`](super::Completion::srq)) name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SrqHandle {
    pub(super) ring: u32,
    pub(super) key: Key,
}
