// The ring's table cannot be swapped out from under operations in flight:
// the ring lends it only shared.
use rdma_ring::backend::soft::{SoftDevice, SoftQp};
use rdma_ring::fixed::{FixedBufs, FixedRing, FixedRingConfig};

fn main() {
    let dev = SoftDevice::new();
    let pd = dev.alloc_pd();
    let mut ring: FixedRing<SoftQp> = FixedRing::new(
        dev.create_cq(16).unwrap(),
        FixedBufs::new(&pd, 1, 64).unwrap(),
        FixedRingConfig::default(),
    );
    let mut other = FixedBufs::new(&pd, 1, 64).unwrap();
    std::mem::swap(ring.bufs(), &mut other);
}
