// A slot read through `bytes` keeps its token borrowed: the slot cannot
// be written through `bytes_mut`, nor its token moved into an operation,
// while the read slice lives.
use rdma_ring::backend::soft::SoftDevice;
use rdma_ring::buf::{RemoteAccess, RemoteSlice};
use rdma_ring::fixed::{FixedBufs, WriteFixed};

fn main() {
    let pd = SoftDevice::new().alloc_pd();
    let mut bufs = FixedBufs::new(&pd, 1, 64).unwrap();
    let mut slot = bufs.take().unwrap();
    let read = bufs.bytes(&slot);
    bufs.bytes_mut(&mut slot)[0] = 1;
    let op = WriteFixed::new(slot, 64, RemoteSlice::new(0x1000, 64, 7, RemoteAccess::WRITE));
    assert_eq!(read[0], 0);
    drop(op);
}
