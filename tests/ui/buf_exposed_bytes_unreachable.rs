// Memory exposed to peers may change under any reference to it: safe code
// cannot reach its bytes while it is exposed (take it back with
// `into_inner`, which revokes the peers' key first).
use rdma_ring::backend::soft::SoftDevice;
use rdma_ring::buf::{ExposedBuf, RemoteAccess};

fn main() {
    let pd = SoftDevice::new().alloc_pd();
    let exposed = ExposedBuf::new(&pd, vec![0u8; 8], RemoteAccess::WRITE).unwrap();
    let _byte = exposed[0];
    let _bytes: &[u8] = &exposed;
}
