//! The awaited path allocates nothing per operation in steady state: a
//! counting global allocator watches a thousand awaited writes, reads and
//! atomics after a warm-up. It counts the test's own thread only: the test
//! harness's main thread may allocate while it waits for the test (the
//! first time it blocks on its channel), which is none of the ring's doing
//! and made the count flaky.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};

use rdma_ring::backend::soft::SoftDevice;
use rdma_ring::backend::QpConfig;
use rdma_ring::buf::{BaseBuf, BufferPool, ExposedBuf, RegisteredBuf, RemoteAccess};
use rdma_ring::future::{AsyncRing, Wakeup};
use rdma_ring::ring::{Ring, RingConfig};

struct Counting;

thread_local! {
    /// Whether this thread's allocations are counted.
    static COUNTING: Cell<bool> = const { Cell::new(false) };
}

fn counting() -> bool {
    COUNTING.try_with(Cell::get).unwrap_or(false)
}
static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded unchanged to the system allocator; the
// counter has no effect on the memory handed out.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if counting() {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded with the caller's pointer and layout.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if counting() {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: forwarded unchanged.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn awaited_ops_allocate_nothing_in_steady_state() {
    let dev = SoftDevice::new();
    let pd = dev.alloc_pd();
    let (qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    let exposed = ExposedBuf::new(&pd, vec![0u8; 4096], RemoteAccess::all()).unwrap();
    let remote = exposed.remote();
    let pool = BufferPool::new(&pd, 64, 4).unwrap();
    let ring = AsyncRing::new(Ring::new(qp, RingConfig::default()), Wakeup::Busy).unwrap();
    let mut chunk = Some(pool.take().unwrap());
    let mut word = Some(
        RegisteredBuf::new(&pd, Box::new(0u64))
            .unwrap()
            .word(0)
            .unwrap(),
    );
    let target = remote.slice(0..64).unwrap();
    let counter = remote.word(64).unwrap();

    let mut round = |i: u64| {
        futures::executor::block_on(async {
            let (result, back) = ring.write(chunk.take().unwrap(), target).await;
            assert_eq!(result.unwrap(), 64);
            let (result, back) = ring.read(back, target).await;
            assert_eq!(result.unwrap(), 64);
            chunk = Some(back);
            let (result, back) = ring.fetch_add(word.take().unwrap(), counter, 1).await;
            result.unwrap();
            assert_eq!(back.get(), i);
            word = Some(back);
        })
    };
    for i in 0..100 {
        round(i);
    }
    COUNTING.with(|c| c.set(true));
    for i in 100..1100 {
        round(i);
    }
    COUNTING.with(|c| c.set(false));
    let allocations = ALLOCATIONS.load(Ordering::SeqCst);
    assert_eq!(
        allocations, 0,
        "{allocations} allocations over 3000 awaited ops"
    );
}

#[test]
fn awaited_fixed_ops_pushed_together_allocate_nothing_in_steady_state() {
    use rdma_ring::fixed::{FixedBufs, FixedRing, FixedRingConfig, WriteFixed};
    use rdma_ring::future::AsyncFixedRing;
    let dev = SoftDevice::new();
    let pd = dev.alloc_pd();
    let (mut qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    let exposed = ExposedBuf::new(&pd, vec![0u8; 16 * 64], RemoteAccess::WRITE).unwrap();
    let cq = rdma_ring::backend::QueuePair::take_cq(&mut qp).unwrap();
    let slots = FixedBufs::new(&pd, 16, 64).unwrap();
    let ring = AsyncFixedRing::new(
        FixedRing::new(cq, slots, FixedRingConfig::default()),
        Wakeup::Busy,
    )
    .unwrap();
    let conn = ring.attach(qp).unwrap();
    let mut writes = Vec::with_capacity(16);
    let mut futures = Vec::with_capacity(16);
    let mut round = || {
        let mut i = 0;
        while let Some(slot) = ring.take_buf() {
            let target = exposed.remote().slice(i * 64..(i + 1) * 64).unwrap();
            writes.push(WriteFixed::new(slot, 64, target));
            i += 1;
        }
        assert_eq!(ring.push_all(conn, &mut writes, &mut futures).unwrap(), 16);
        futures::executor::block_on(async {
            for write in futures.drain(..) {
                let done = write.await.unwrap();
                ring.put_buf(done.into_buf()).unwrap();
            }
        });
    };
    for _ in 0..20 {
        round();
    }
    COUNTING.with(|c| c.set(true));
    for _ in 0..100 {
        round();
    }
    COUNTING.with(|c| c.set(false));
    let allocations = ALLOCATIONS.load(Ordering::SeqCst);
    assert_eq!(
        allocations, 0,
        "{allocations} allocations over 1600 awaited writes pushed 16 at a time"
    );
}
