// Memory registered read-only cannot be where a READ lands, nor an
// atomic's old value, nor part of a READ's scatter list.
use rdma_ring::backend::soft::SoftDevice;
use rdma_ring::buf::{BaseBuf, ReadOnlyBuf, RemoteAccess, RemoteSlice};
use rdma_ring::op::Read;

fn main() {
    let pd = SoftDevice::new().alloc_pd();
    let remote = RemoteSlice::new(0x1000, 64, 7, RemoteAccess::READ);
    let _read = Read::new(ReadOnlyBuf::new(&pd, vec![0u8; 64]).unwrap(), remote);
    let _word = ReadOnlyBuf::new(&pd, Box::new(0u64)).unwrap().word(0);
    let list = vec![ReadOnlyBuf::new(&pd, vec![0u8; 64]).unwrap()];
    let _scatter_read = Read::scatter(list, remote);
}
