//! Regions of a [`RegionAllocator`] as the buffers of operations on the
//! soft device: written, read, sent and received through their views,
//! handed back by completions, and recycled.

use std::alloc::Layout;
use std::sync::Arc;

use rdma_ring::backend::soft::SoftDevice;
use rdma_ring::backend::QpConfig;
use rdma_ring::buf::{BaseBuf, ExposedBuf, Region, RegionAllocator, RemoteAccess, Slice};
use rdma_ring::op::{Read, Recv, Send, Write};
use rdma_ring::ring::{Ring, RingConfig};

#[test]
fn regions_carry_writes_reads_sends_and_receives() {
    let dev = SoftDevice::new();
    let (pd_a, pd_b) = (Arc::new(dev.alloc_pd()), Arc::new(dev.alloc_pd()));
    let (qp_a, qp_b) = dev
        .connected_pair(&pd_a, &pd_b, QpConfig::default())
        .unwrap();
    let regions_a = RegionAllocator::new(pd_a.clone(), 1 << 16).unwrap();
    let regions_b = RegionAllocator::new(pd_b.clone(), 1 << 16).unwrap();
    let exposed = ExposedBuf::new(
        &*pd_b,
        vec![0u8; 8192],
        RemoteAccess::READ | RemoteAccess::WRITE,
    )
    .unwrap();
    let mut a = Ring::new(qp_a, RingConfig::default());
    let mut b = Ring::new(qp_b, RingConfig::default());

    // WRITE 3000 bytes of a region, then READ them back into another.
    let mut src = regions_a
        .alloc(Layout::from_size_align(3000, 8).unwrap())
        .unwrap();
    for (i, byte) in src.iter_mut().enumerate() {
        *byte = (i % 251) as u8;
    }
    let remote = exposed.remote().slice(1000..4000).unwrap();
    a.submission().push(Write::new(src, remote)).unwrap();
    a.submit().unwrap();
    let done = a.completion().wait(1).unwrap().pop().unwrap();
    let (result, buf) = done.into_parts();
    assert_eq!(result.unwrap(), 3000);
    let src: Region = buf.downcast().unwrap(); // the same region, back
    let dst = regions_a
        .alloc_zeroed(Layout::from_size_align(3000, 64).unwrap())
        .unwrap();
    a.submission().push(Read::new(dst, remote)).unwrap();
    a.submit().unwrap();
    let dst: Region = a
        .completion()
        .wait(1)
        .unwrap()
        .pop()
        .unwrap()
        .into_buf()
        .downcast()
        .unwrap();
    assert!(dst[..] == src[..]);

    // SEND a view of a region into a region posted as a receive.
    let recv = regions_b.alloc_zeroed(Layout::new::<[u8; 256]>()).unwrap();
    b.submission().push(Recv::new(recv)).unwrap();
    b.submit().unwrap();
    a.submission().push(Send::new(src.slice(0..100))).unwrap();
    a.submit().unwrap();
    let got = b.completion().wait(1).unwrap().pop().unwrap();
    assert_eq!(got.byte_len(), 100);
    let recv: Region = got.into_buf().downcast().unwrap();
    assert!(recv[..100] == dst[..100]);
    let sent: Slice<Region> = a
        .completion()
        .wait(1)
        .unwrap()
        .pop()
        .unwrap()
        .into_buf()
        .downcast()
        .unwrap();
    assert_eq!(sent.into_inner().len(), 3000);

    // A region of another protection domain is refused, and handed back.
    let foreign = regions_b.alloc(Layout::new::<[u8; 64]>()).unwrap();
    let refused = a.submission().push(Send::new(foreign)).unwrap_err();
    assert!(
        refused.error().to_string().contains("domain"),
        "{}",
        refused.error()
    );
}
