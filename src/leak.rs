//! What the crate leaked rather than free memory a device might still use.
//!
//! Two situations leak on purpose: a ring (or one of its queue pairs)
//! that cannot drain its flushed completions in time keeps the buffers of
//! the operations still in flight, and a registration whose
//! deregistration fails keeps its memory. Both are counted here, so a
//! long-running program can watch for them.
//!
//! ```
//! let before = rdma_ring::leak::leaked();
//! // ... run a workload ...
//! let after = rdma_ring::leak::leaked();
//! assert!(after.bytes >= before.bytes);
//! ```

use std::sync::atomic::{AtomicU64, Ordering};

static REGIONS: AtomicU64 = AtomicU64::new(0);
static BUFFERS: AtomicU64 = AtomicU64::new(0);
static BYTES: AtomicU64 = AtomicU64::new(0);

/// Counts of what was leaked since the process started.
///
/// ```
/// use rdma_ring::leak::Leaked;
/// assert_eq!(Leaked::default().buffers, 0);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Leaked {
    /// Memory registrations whose deregistration failed, with their memory.
    pub regions: u64,
    /// In-flight operations whose buffers were kept because their queue
    /// pair could not be drained.
    pub buffers: u64,
    /// Bytes of memory in both.
    pub bytes: u64,
}

/// What the crate has leaked so far, process-wide.
///
/// ```
/// use rdma_ring::backend::soft::SoftDevice;
/// use rdma_ring::buf::RegisteredBuf;
/// use rdma_ring::leak::leaked;
/// let dev = SoftDevice::new();
/// let pd = dev.alloc_pd();
/// let buf = RegisteredBuf::new(&pd, vec![0u8; 4096]).unwrap();
/// let before = leaked();
/// // The device may still reach memory it could not deregister, so
/// // dropping the buffer keeps that memory instead of freeing it.
/// dev.fail_deregistrations(1);
/// drop(buf);
/// let after = leaked();
/// assert_eq!(after.regions - before.regions, 1);
/// assert_eq!(after.bytes - before.bytes, 4096);
/// ```
pub fn leaked() -> Leaked {
    Leaked {
        regions: REGIONS.load(Ordering::Relaxed),
        buffers: BUFFERS.load(Ordering::Relaxed),
        bytes: BYTES.load(Ordering::Relaxed),
    }
}

pub(crate) fn record_region(bytes: usize) {
    REGIONS.fetch_add(1, Ordering::Relaxed);
    BYTES.fetch_add(bytes as u64, Ordering::Relaxed);
}

pub(crate) fn record_buffer(bytes: usize) {
    BUFFERS.fetch_add(1, Ordering::Relaxed);
    BYTES.fetch_add(bytes as u64, Ordering::Relaxed);
}
