// A slot's token cannot be duplicated: two tokens would reach one slot.
use rdma_ring::backend::soft::SoftDevice;
use rdma_ring::fixed::FixedBufs;

fn main() {
    let pd = SoftDevice::new().alloc_pd();
    let mut bufs = FixedBufs::new(&pd, 1, 64).unwrap();
    let slot = bufs.take().unwrap();
    let twin = slot.clone();
    let (a, b) = (bufs.bytes(&slot), bufs.bytes(&twin));
    assert_eq!(a, b);
}
