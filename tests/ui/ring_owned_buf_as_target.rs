// A completion's type-erased buffer may hide read-only memory: it cannot
// be the target of anything the NIC writes (turn it back into the type
// pushed, with `downcast`, first).
use rdma_ring::backend::soft::SoftDevice;
use rdma_ring::buf::{OwnedBuf, ReadOnlyBuf, RemoteAccess, RemoteSlice, SingleBuf};
use rdma_ring::op::{Read, Recv};

fn main() {
    let pd = SoftDevice::new().alloc_pd();
    let erased = || -> OwnedBuf { ReadOnlyBuf::new(&pd, &b"key"[..]).unwrap().into_owned() };
    let remote = RemoteSlice::new(0x1000, 64, 7, RemoteAccess::READ);
    let _recv = Recv::new(erased());
    let _read = Read::new(erased(), remote);
}
