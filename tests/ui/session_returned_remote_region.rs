// A remote region handed back is gone: using it after `send_remote_mr`
// must not compile.
use std::alloc::Layout;
use rdma_ring::backend::soft::SoftDevice;
use rdma_ring::session::SessionHost;

fn main() {
    let (client, _server) = SessionHost::soft_pair(&SoftDevice::new(), Default::default()).unwrap();
    futures::executor::block_on(async {
        let remote = client.request_remote_mr(Layout::new::<[u8; 8]>()).await.unwrap();
        client.send_remote_mr(remote).unwrap();
        let _ = remote.remote();
    });
}
