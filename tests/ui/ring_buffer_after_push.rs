// A buffer is moved into its operation: once pushed, it cannot be read
// or written while the NIC may touch it; it comes back in the completion.
use rdma_ring::backend::soft::SoftDevice;
use rdma_ring::backend::QpConfig;
use rdma_ring::buf::{ExposedBuf, RegisteredBuf, RemoteAccess};
use rdma_ring::op::Read;
use rdma_ring::ring::{Ring, RingConfig};

fn main() {
    let dev = SoftDevice::new();
    let pd = dev.alloc_pd();
    let (qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    let mut ring = Ring::new(qp, RingConfig::default());
    let source = ExposedBuf::new(&pd, vec![0u8; 64], RemoteAccess::READ).unwrap();
    let mut buf = RegisteredBuf::new(&pd, vec![0u8; 64]).unwrap();
    ring.submission().push(Read::new(buf, source.remote())).unwrap();
    buf[0] = 1;
}
