// A slot's token is moved into its operation: the slot cannot be read or
// written while the NIC may touch it.
use rdma_ring::backend::soft::SoftDevice;
use rdma_ring::buf::{RemoteAccess, RemoteSlice};
use rdma_ring::fixed::{FixedBufs, WriteFixed};

fn main() {
    let pd = SoftDevice::new().alloc_pd();
    let mut bufs = FixedBufs::new(&pd, 1, 64).unwrap();
    let mut slot = bufs.take().unwrap();
    let op = WriteFixed::new(slot, 64, RemoteSlice::new(0x1000, 64, 7, RemoteAccess::WRITE));
    bufs.bytes_mut(&mut slot)[0] = 1;
    drop(op);
}
