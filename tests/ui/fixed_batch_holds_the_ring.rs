// A batch checked the ring and its queue pair when it opened: while it is
// open, nothing may fail, detach or reap through the ring.
use rdma_ring::backend::{soft::SoftDevice, QpConfig, QueuePair};
use rdma_ring::fixed::{FixedBufs, FixedRing, FixedRingConfig, RecvFixed};

fn main() {
    let dev = SoftDevice::new();
    let pd = dev.alloc_pd();
    let (mut qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    let cq = qp.take_cq().unwrap();
    let mut ring = FixedRing::new(cq, FixedBufs::new(&pd, 2, 64).unwrap(), FixedRingConfig::default());
    let conn = ring.attach(qp).unwrap();
    let slot = ring.take_buf().unwrap();
    let mut batch = ring.batch(conn).unwrap();
    ring.fail_qp(conn).unwrap();
    batch.push(RecvFixed::new(slot)).unwrap();
}
