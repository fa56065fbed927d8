// Memory exposed to the peer is not a local operation's buffer: the peer
// may write it at any time, so it is reachable only through unsafe code
// or by taking it back (which revokes the peer's key first).
use rdma_ring::backend::soft::SoftDevice;
use rdma_ring::buf::{ExposedBuf, RemoteAccess, RemoteSlice};
use rdma_ring::op::Write;

fn main() {
    let pd = SoftDevice::new().alloc_pd();
    let exposed = ExposedBuf::new(&pd, vec![0u8; 64], RemoteAccess::WRITE).unwrap();
    let _op = Write::new(exposed, RemoteSlice::new(0x1000, 64, 7, RemoteAccess::WRITE));
}
