#![allow(unused_mut)]
// An AsyncRing lends its ring without `&mut Ring`: swapping two lent
// rings under pending futures must not compile.
use rdma_ring::backend::{soft::SoftDevice, QpConfig};
use rdma_ring::future::{AsyncRing, Wakeup};
use rdma_ring::ring::{Ring, RingConfig};

fn main() {
    let dev = SoftDevice::new();
    let pd = dev.alloc_pd();
    let (qa, qb) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    let a = AsyncRing::new(Ring::new(qa, RingConfig::default()), Wakeup::Busy).unwrap();
    let b = AsyncRing::new(Ring::new(qb, RingConfig::default()), Wakeup::Busy).unwrap();
    a.with_ring(|mut ra| b.with_ring(|mut rb| std::mem::swap(&mut *ra, &mut *rb)));
}
