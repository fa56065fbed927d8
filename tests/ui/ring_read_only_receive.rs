// Memory registered read-only cannot be the target of anything the NIC
// writes: a receive, a READ, an atomic's old value.
use rdma_ring::backend::soft::SoftDevice;
use rdma_ring::buf::ReadOnlyBuf;
use rdma_ring::op::Recv;

fn main() {
    let pd = SoftDevice::new().alloc_pd();
    let buf = ReadOnlyBuf::new(&pd, vec![0u8; 64]).unwrap();
    let _op = Recv::new(buf);
}
