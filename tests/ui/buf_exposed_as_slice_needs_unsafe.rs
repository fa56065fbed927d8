// The one way to look at exposed bytes in place is `unsafe`: the caller
// promises no peer writes them meanwhile.
use rdma_ring::backend::soft::SoftDevice;
use rdma_ring::buf::{ExposedBuf, RemoteAccess};

fn main() {
    let pd = SoftDevice::new().alloc_pd();
    let exposed = ExposedBuf::new(&pd, vec![0u8; 8], RemoteAccess::WRITE).unwrap();
    let _view: &[u8] = exposed.as_slice();
}
