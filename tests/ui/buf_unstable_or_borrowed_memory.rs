// Only memory that stays put while its owner moves, and that the crate
// may own, can be registered: not an array (inline bytes move with it),
// not borrowed memory; and read-only memory cannot be written by the NIC
// or exposed to peers.
use rdma_ring::backend::soft::SoftDevice;
use rdma_ring::buf::{ExposedBuf, RegisteredBuf, RemoteAccess};

fn main() {
    let pd = SoftDevice::new().alloc_pd();
    let _inline = RegisteredBuf::new(&pd, [0u8; 64]);
    let mut v = vec![0u8; 64];
    let _borrowed = RegisteredBuf::new(&pd, &mut v[..]);
    let _read_only = RegisteredBuf::new(&pd, &b"x"[..]);
    let _exposed = ExposedBuf::new(&pd, &b"x"[..], RemoteAccess::WRITE);
}
