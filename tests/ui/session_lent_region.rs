// A region lent to the peer is out of reach until it comes back: reading
// it after `send_local_mr` must not compile.
use std::alloc::Layout;
use rdma_ring::backend::soft::SoftDevice;
use rdma_ring::buf::RemoteAccess;
use rdma_ring::session::SessionHost;

fn main() {
    let (client, _server) = SessionHost::soft_pair(&SoftDevice::new(), Default::default()).unwrap();
    let region = client.alloc_local_mr(Layout::new::<[u8; 8]>()).unwrap();
    client.send_local_mr(region, RemoteAccess::WRITE).unwrap();
    println!("{}", region[0]);
}
