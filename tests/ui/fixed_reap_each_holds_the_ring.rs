// reap_each's closure runs while the ring is mid-reap: it cannot reach the
// ring (to push, put a token back or reap again).
use rdma_ring::backend::{soft::SoftDevice, QpConfig, QueuePair};
use rdma_ring::fixed::{FixedBufs, FixedRing, FixedRingConfig};

fn main() {
    let dev = SoftDevice::new();
    let pd = dev.alloc_pd();
    let (mut qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    let cq = qp.take_cq().unwrap();
    let mut ring = FixedRing::new(cq, FixedBufs::new(&pd, 2, 64).unwrap(), FixedRingConfig::default());
    ring.attach(qp).unwrap();
    ring.reap_each(|c| ring.put_buf(c.into_buf()).unwrap()).unwrap();
}
