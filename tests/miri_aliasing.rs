//! Aliasing checks for the owned-buffer types: run under Miri
//! (`cargo +nightly miri test --no-default-features --test miri_aliasing`),
//! which reports a raw pointer used after the memory it points to was
//! retagged by a move. Plain `cargo test` runs them too, as behaviour tests.

use rdma_ring::backend::soft::SoftDevice;
use rdma_ring::buf::{ExposedBuf, ReadOnlyBuf, RegisteredBuf, RemoteAccess};

#[test]
fn boxed_slice_registered_then_moved() {
    let pd = SoftDevice::new().alloc_pd();
    let buf = RegisteredBuf::new(&pd, vec![1u8; 16].into_boxed_slice()).unwrap();
    let mut moved = Box::new(buf);
    moved[0] = 7;
    assert_eq!(moved[0], 7);
    let back: Box<[u8]> = moved.into_inner().unwrap();
    assert_eq!(back[0], 7);
}

#[test]
fn boxed_word_registered_then_moved() {
    let pd = SoftDevice::new().alloc_pd();
    let buf = RegisteredBuf::new(&pd, Box::new(5u64)).unwrap();
    let moved = [buf];
    assert_eq!(moved[0][..8], 5u64.to_ne_bytes());
}

#[test]
fn exposed_boxed_slice_moved_then_read() {
    let pd = SoftDevice::new().alloc_pd();
    let exposed =
        ExposedBuf::new(&pd, vec![3u8; 16].into_boxed_slice(), RemoteAccess::READ).unwrap();
    let moved = Box::new(exposed);
    // SAFETY: no peer exists, so nothing writes the bytes.
    assert_eq!(unsafe { moved.as_slice() }[0], 3);
}

#[test]
fn read_only_boxed_array_moved_then_read() {
    let pd = SoftDevice::new().alloc_pd();
    let buf = ReadOnlyBuf::new(&pd, Box::new([9u8; 8])).unwrap();
    let moved = [buf];
    assert_eq!(moved[0][3], 9);
}

/// The device reads and writes buffers through the addresses it was
/// given while their owners move: pool chunks, a boxed slice, exposed
/// memory and an atomic word, through a ring on the soft device.
#[test]
fn device_access_through_moved_buffers() {
    use rdma_ring::backend::QpConfig;
    use rdma_ring::buf::{BaseBuf, BufferPool};
    use rdma_ring::op::{FetchAdd, Read, Write};
    use rdma_ring::ring::{Ring, RingConfig};

    let dev = SoftDevice::new();
    let pd = dev.alloc_pd();
    let config = QpConfig {
        max_send_wr: 8,
        max_recv_wr: 2,
        ..QpConfig::default()
    };
    let (qa, _qb) = dev.connected_pair(&pd, &pd, config).unwrap();
    // u64s: 8-aligned, so the atomic's target is aligned.
    let exposed =
        ExposedBuf::new(&pd, vec![0u64; 8].into_boxed_slice(), RemoteAccess::all()).unwrap();
    let exposed = Box::new(exposed); // the owner moves; the device's address must stay valid
    let remote = exposed.remote();
    let pool = BufferPool::new(&pd, 32, 2).unwrap();
    let mut ring = Ring::new(qa, RingConfig::default());

    let mut chunk = pool.take().unwrap();
    chunk.fill(0xab);
    let source = RegisteredBuf::new(&pd, vec![0xcd_u8; 32].into_boxed_slice()).unwrap();
    let source = vec![source].pop().unwrap();
    ring.submission()
        .push(Write::new(chunk, remote.slice(0..32).unwrap()))
        .unwrap();
    ring.submission()
        .push(Write::new(source, remote.slice(32..64).unwrap()))
        .unwrap();
    ring.submission()
        .push(Read::new(
            pool.take().unwrap(),
            remote.slice(16..48).unwrap(),
        ))
        .unwrap();
    let word = RegisteredBuf::new(&pd, Box::new(0u64))
        .unwrap()
        .word(0)
        .unwrap();
    ring.submission()
        .push(FetchAdd::new(word, remote.word(0).unwrap(), 1))
        .unwrap();
    ring.submission().submit().unwrap();
    let done = ring.completion().wait(4).unwrap();
    assert!(done.iter().all(|c| c.status().is_success()));
    assert_eq!(&done[2].buf()[..16], &[0xab; 16]);
    assert_eq!(&done[2].buf()[16..], &[0xcd; 16]);
    assert_eq!(
        done[3].buf()[..8],
        u64::from_ne_bytes([0xab; 8]).to_ne_bytes()
    );
    drop((done, ring));
    let memory = exposed.into_inner().unwrap();
    assert_eq!(memory[1..4], [u64::from_ne_bytes([0xab; 8]); 3]);
}

/// Regions cut from a registered arena, moved and written while other
/// regions of the same arena are live, then freed and cut again.
#[test]
fn regions_moved_written_and_recycled() {
    use rdma_ring::buf::RegionAllocator;
    use std::alloc::Layout;
    use std::sync::Arc;

    let pd = Arc::new(SoftDevice::new().alloc_pd());
    let regions = RegionAllocator::new(pd, 4096).unwrap();
    let layout = Layout::from_size_align(100, 8).unwrap();
    let mut a = regions.alloc_zeroed(layout).unwrap();
    let b = Box::new(regions.alloc_zeroed(layout).unwrap());
    a[0] = 1;
    let moved = [a];
    assert_eq!((moved[0][0], b[0]), (1, 0));
    drop(moved);
    let c = regions.alloc_zeroed(layout).unwrap();
    assert_eq!(c[0], 0);
}

/// A region lent to a peer: exposed (a second registration over arena
/// memory), moved while exposed, taken back and read — what a session does
/// with every region it lends.
#[test]
fn region_exposed_moved_and_taken_back() {
    use rdma_ring::buf::RegionAllocator;
    use std::alloc::Layout;
    use std::sync::Arc;

    let pd = Arc::new(SoftDevice::new().alloc_pd());
    let regions = RegionAllocator::new(Arc::clone(&pd) as _, 4096).unwrap();
    let mut region = regions
        .alloc_zeroed(Layout::from_size_align(64, 8).unwrap())
        .unwrap();
    region[3] = 9;
    let neighbour = regions
        .alloc_zeroed(Layout::from_size_align(64, 8).unwrap())
        .unwrap();
    let exposed = ExposedBuf::new(&*pd, region, RemoteAccess::WRITE).unwrap();
    assert_eq!(exposed.remote().len(), 64);
    let moved = Box::new(exposed);
    let mut back = moved.into_inner().unwrap();
    back[4] = 1;
    assert_eq!((back[3], back[4], neighbour[3]), (9, 1, 0));
}
