//! Regression tests for soundness and robustness defects found by review:
//! each failed (or aborted, or panicked) before its fix. Compile-time
//! guarantees are in `compile_fail.rs`, aliasing in `miri_aliasing.rs`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rdma_ring::backend::soft::{Progress, SoftCq, SoftDevice, SoftQp, SoftSrq};
use rdma_ring::backend::{PostError, QpCaps, QpConfig, QueuePair, RecvWr, SendWr, Sge, WcStatus};
use rdma_ring::buf::{
    BaseBuf, BufferPool, ExposedBuf, RegisteredBuf, RemoteAccess, SgList, StableBuf, StableBufMut,
};
use rdma_ring::op::{Read, Recv, Send, Write};
use rdma_ring::ring::{Ring, RingConfig};
use rdma_ring::Error;

/// A READ queued in manual mode, then a WRITE posted in no-op mode: the
/// no-op shortcut must not complete the WRITE ahead of the READ (the ring
/// would release the READ's buffer while the device still had to write
/// it).
#[test]
fn no_op_mode_never_completes_ahead_of_queued_work() {
    let dev = SoftDevice::with_progress(Progress::Manual);
    let pd = dev.alloc_pd();
    let (qa, _qb) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    let target = ExposedBuf::new(&pd, vec![0x5a_u8; 64], RemoteAccess::all()).unwrap();
    let mut ring = Ring::new(qa, RingConfig::default());
    let into = RegisteredBuf::new(&pd, vec![0u8; 64]).unwrap();
    ring.submission()
        .push(Read::new(into, target.remote()).user_data(1))
        .unwrap();
    ring.submission().submit().unwrap();

    dev.set_progress(Progress::NoOp);
    let from = RegisteredBuf::new(&pd, vec![0x11_u8; 64]).unwrap();
    ring.submission()
        .push(Write::new(from, target.remote()).user_data(2))
        .unwrap();
    ring.submission().submit().unwrap();
    let mut early = Vec::new();
    ring.completion().reap(&mut early).unwrap();
    assert!(
        early.is_empty(),
        "completed ahead of the queued READ: {early:?}"
    );
    assert_eq!(ring.in_flight(), 2);

    dev.set_progress(Progress::Manual);
    dev.progress();
    let done = ring.completion().wait(2).unwrap();
    assert_eq!(
        done.iter().map(|c| c.user_data()).collect::<Vec<_>>(),
        [1, 2]
    );
    assert!(done.iter().all(|c| c.status().is_success()));
    assert!(
        done[0].buf().iter().all(|&b| b == 0x5a),
        "the READ ran first, in order"
    );
}

/// Memory whose drop is observable.
#[derive(Debug)]
struct Tracked {
    bytes: Vec<u8>,
    freed: Arc<AtomicBool>,
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.freed.store(true, Ordering::SeqCst);
    }
}

// SAFETY: the bytes are the Vec's heap buffer, which never moves or
// resizes while registered (nothing resizes it).
unsafe impl StableBuf for Tracked {
    fn stable_ptr(&self) -> *const u8 {
        self.bytes.as_ptr()
    }
    fn stable_len(&self) -> usize {
        self.bytes.len()
    }
}
// SAFETY: as above.
unsafe impl StableBufMut for Tracked {
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        self.bytes.as_mut_ptr()
    }
}

fn tracked(fill: u8) -> (Tracked, Arc<AtomicBool>) {
    let freed = Arc::new(AtomicBool::new(false));
    let mem = Tracked {
        bytes: vec![fill; 64],
        freed: Arc::clone(&freed),
    };
    (mem, freed)
}

/// A failed deregistration leaks the memory (and counts it) instead of
/// freeing memory the device may still reach.
#[test]
fn a_failed_deregistration_leaks_rather_than_frees() {
    let dev = SoftDevice::new();
    let pd = dev.alloc_pd();
    let before = rdma_ring::leak::leaked();
    let (mem, freed) = tracked(1);
    let buf = RegisteredBuf::new(&pd, mem).unwrap();
    dev.fail_deregistrations(1);
    drop(buf);
    assert!(
        !freed.load(Ordering::SeqCst),
        "memory freed while registered"
    );
    let after = rdma_ring::leak::leaked();
    assert!(after.regions > before.regions);
    assert!(after.bytes >= before.bytes + 64);

    // Taking the memory back: a failure hands the buffer back, still
    // registered and usable; a retry succeeds.
    let (mem, freed) = tracked(2);
    let mut buf = RegisteredBuf::new(&pd, mem).unwrap();
    dev.fail_deregistrations(1);
    let (error, back) = buf.into_inner::<Tracked>().unwrap_err().into_parts();
    assert!(error.to_string().contains("deregistration"), "{error}");
    buf = back;
    buf[0] = 9;
    let mem: Tracked = buf.into_inner().unwrap();
    assert_eq!(mem.bytes[..2], [9, 2]);
    drop(mem);
    assert!(freed.load(Ordering::SeqCst));

    // The wrong type is refused with the buffer back, not a silent loss.
    let buf = RegisteredBuf::new(&pd, vec![0u8; 8]).unwrap();
    let refused = buf.into_inner::<Box<[u8]>>().unwrap_err();
    assert!(matches!(refused.error(), Error::WrongMemoryType(_)));
    assert_eq!(refused.into_value().len(), 8);
}

/// Exposed memory whose deregistration fails stays exposed: it comes back
/// as an `ExposedBuf`, and the peer can still use it.
#[test]
fn exposed_memory_stays_exposed_when_deregistration_fails() {
    let dev = SoftDevice::new();
    let pd = dev.alloc_pd();
    let (qa, _qb) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    let (mem, freed) = tracked(0);
    let exposed = ExposedBuf::new(&pd, mem, RemoteAccess::WRITE).unwrap();
    dev.fail_deregistrations(1);
    let exposed = exposed.into_inner().unwrap_err().into_value();
    let mut ring = Ring::new(qa, RingConfig::default());
    let src = RegisteredBuf::new(&pd, vec![7u8; 64]).unwrap();
    ring.submission()
        .push(Write::new(src, exposed.remote()))
        .unwrap();
    ring.submission().submit().unwrap();
    assert!(ring.completion().wait(1).unwrap()[0].status().is_success());
    let mem = exposed.into_inner().unwrap();
    assert!(mem.bytes.iter().all(|&b| b == 7));
    assert!(!freed.load(Ordering::SeqCst));

    let pool = BufferPool::new(&pd, 64, 4).unwrap();
    let before = rdma_ring::leak::leaked().regions;
    dev.fail_deregistrations(1);
    drop(pool);
    assert!(rdma_ring::leak::leaked().regions > before, "pool leaked");
}

/// A queue pair that posts everything, then claims a refusal with an
/// `accepted` it cannot vouch for.
struct LyingPost {
    inner: SoftQp,
    claim: usize,
}

// SAFETY: everything really posted is the soft queue pair's, which keeps
// the contract; the lie is only in `accepted`, which the contract allows
// to cover every work request (and the ring must survive more).
unsafe impl QueuePair for LyingPost {
    type Cq = SoftCq;
    type Srq = SoftSrq;
    fn caps(&self) -> QpCaps {
        self.inner.caps()
    }
    unsafe fn post_send(&mut self, wrs: &[SendWr], sges: &[Sge]) -> Result<(), PostError> {
        // SAFETY: the caller's contract, passed through.
        unsafe { self.inner.post_send(wrs, sges) }?;
        Err(PostError {
            accepted: wrs.len() + self.claim,
            error: Error::PostRejected("a device bug"),
        })
    }
    unsafe fn post_recv(&mut self, wrs: &[RecvWr], sges: &[Sge]) -> Result<(), PostError> {
        // SAFETY: the caller's contract, passed through.
        unsafe { self.inner.post_recv(wrs, sges) }
    }
    fn set_error(&mut self) -> Result<(), Error> {
        self.inner.set_error()
    }
    fn take_cq(&mut self) -> Option<SoftCq> {
        self.inner.take_cq()
    }
}

/// A refusal whose `accepted` covers the whole list, or more, hands
/// nothing back (the device may hold it all), moves the queue pair to
/// error, and every operation still comes back, flushed or done.
#[test]
fn an_unprovable_post_refusal_hands_nothing_back_early() {
    for claim in [0, 5, usize::MAX / 2] {
        let dev = SoftDevice::with_progress(Progress::Manual);
        let pd = dev.alloc_pd();
        let (qa, _qb) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
        let target = ExposedBuf::new(&pd, vec![0u8; 256], RemoteAccess::WRITE).unwrap();
        let pool = BufferPool::new(&pd, 64, 4).unwrap();
        let mut ring = Ring::new(LyingPost { inner: qa, claim }, RingConfig::default());
        for i in 0..4u64 {
            let slice = target.remote().slice(i * 64..(i + 1) * 64).unwrap();
            ring.submission()
                .push(Write::new(pool.take().unwrap(), slice).user_data(i))
                .unwrap();
        }
        let err = ring.submission().submit().unwrap_err();
        assert_eq!((err.posted, err.unposted.len()), (4, 0), "claim {claim}");
        let extra = RegisteredBuf::new(&pd, vec![0u8; 8]).unwrap();
        let refused = ring.submission().push(Recv::new(extra)).unwrap_err();
        assert!(
            matches!(refused.error(), Error::QpInError(_)),
            "claim {claim}"
        );
        let back = ring.close();
        assert_eq!(back.len(), 4, "claim {claim}");
        assert!(back.iter().all(|c| c.status() == WcStatus::WrFlushErr));
        drop(back);
        assert_eq!(pool.available(), 4);
    }
}

/// `Duration::MAX` as a wait or drain timeout means "no deadline", not a
/// panic (the panic in a ring's drop used to free in-flight buffers).
#[test]
fn unbounded_timeouts_do_not_panic() {
    let dev = SoftDevice::new();
    let pd = dev.alloc_pd();
    let (qa, qb) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    let config = RingConfig {
        wait_timeout: Duration::MAX,
        drain_timeout: Duration::MAX,
        ..RingConfig::default()
    };
    let (mut a, mut b) = (Ring::new(qa, config), Ring::new(qb, config));
    let pool = BufferPool::new(&pd, 64, 4).unwrap();
    b.submission()
        .push(Recv::new(pool.take().unwrap()))
        .unwrap();
    b.submission()
        .push(Recv::new(pool.take().unwrap()))
        .unwrap();
    b.submission().submit().unwrap();
    a.submission()
        .push(Send::new(pool.take().unwrap()))
        .unwrap();
    a.submission().submit().unwrap();
    assert_eq!(a.completion().wait(1).unwrap().len(), 1);
    assert_eq!(b.completion().wait(1).unwrap()[0].byte_len(), 64);
    drop(b); // a receive still in flight: drained, not panicked
    assert_eq!(pool.available(), 4);
}

/// The TCP handshake with `Duration::MAX`.
#[test]
fn an_unbounded_handshake_timeout_does_not_panic() {
    use rdma_ring::connect::{tcp, Endpoint};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let endpoint = |n: u32| Endpoint {
        qpn: 0x10 + n,
        psn: 1,
        lid: 0,
        gid: [0; 16],
        mtu: 3,
        rd_atomic: 1,
        init_rd_atomic: 1,
    };
    let peer = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let got = tcp::exchange(&mut s, &endpoint(2), Duration::MAX).unwrap();
        tcp::ready(&mut s, Duration::MAX).unwrap();
        got
    });
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    assert_eq!(
        tcp::exchange(&mut s, &endpoint(1), Duration::MAX)
            .unwrap()
            .qpn,
        0x12
    );
    tcp::ready(&mut s, Duration::MAX).unwrap();
    assert_eq!(peer.join().unwrap().qpn, 0x11);
}

thread_local! {
    static HELD: std::cell::RefCell<Option<Box<dyn std::any::Any>>> =
        const { std::cell::RefCell::new(None) };
}

/// A future dropped by a thread-local's destructor, after the adapter's
/// own thread-local is gone, used to abort the process.
#[test]
fn a_future_dropped_during_thread_local_teardown_does_not_abort() {
    use rdma_ring::future::{AsyncRing, Wakeup};
    std::thread::spawn(|| {
        // Touched first, so destroyed last: after the adapter's own list.
        HELD.with(|h| h.borrow_mut().take());
        let dev = SoftDevice::new();
        let pd = dev.alloc_pd();
        let (qa, qb) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
        let ring = AsyncRing::new(Ring::new(qa, RingConfig::default()), Wakeup::Busy).unwrap();
        let pending = ring.recv(RegisteredBuf::new(&pd, vec![0u8; 16]).unwrap());
        HELD.with(|h| *h.borrow_mut() = Some(Box::new((pending, ring, qb))));
    })
    .join()
    .expect("the thread ended normally");
}

/// Sizes and offsets at the edge of `usize` are clear errors.
#[test]
fn huge_sizes_and_offsets_are_errors_not_panics() {
    let pd = SoftDevice::new().alloc_pd();
    assert!(matches!(
        BufferPool::new(&pd, usize::MAX, 1),
        Err(Error::PoolTooLarge { .. })
    ));
    assert!(matches!(
        BufferPool::new(&pd, 64, usize::MAX),
        Err(Error::PoolTooLarge { .. })
    ));
    assert!(matches!(
        BufferPool::new(&pd, 1 << 40, 1 << 20),
        Err(Error::PoolTooLarge { .. } | Error::OutOfMemory(_))
    ));
    let buf = RegisteredBuf::new(&pd, vec![0u8; 64]).unwrap();
    let refused = buf.word(usize::MAX - 3).unwrap_err();
    assert!(matches!(refused.error(), Error::OutOfBounds { .. }));
    let slice = refused.into_value().slice(8..64);
    let refused = slice.word(usize::MAX - 3).unwrap_err();
    assert!(matches!(refused.error(), Error::OutOfBounds { .. }));
}

/// A view of no bytes posts no scatter/gather element, alone or in a
/// list: some devices read an element's zero length as 2^31, which under a
/// pool's key would reach the chunks beside it. The operations still run.
#[test]
fn a_view_of_no_bytes_names_no_memory() {
    use rdma_ring::buf::IoBuf;
    let dev = SoftDevice::new();
    let pd = dev.alloc_pd();
    let pool = BufferPool::new(&pd, 64, 8).unwrap();
    let mut sges = Vec::new();
    pool.take().unwrap().slice(3..3).push_sges(&mut sges);
    assert!(sges.is_empty(), "{sges:?}");
    let list = SgList::new(vec![
        pool.take().unwrap().slice(0..4),
        pool.take().unwrap().slice(5..5),
    ]);
    list.push_sges(&mut sges);
    assert_eq!(sges.iter().map(|s| s.len).collect::<Vec<_>>(), [4]);

    let (qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    let mut ring = Ring::new(qp, RingConfig::default());
    let target = ExposedBuf::new(&pd, vec![0u8; 64], RemoteAccess::WRITE).unwrap();
    let empty = pool.take().unwrap();
    ring.submission()
        .push(Write::new(empty.slice(0..0), target.remote()).user_data(1))
        .unwrap();
    ring.submission()
        .push(Write::new(list, target.remote()).user_data(2))
        .unwrap();
    ring.submit().unwrap();
    let done = ring.completion().wait(2).unwrap();
    let seen: Vec<_> = done
        .iter()
        .map(|c| (c.user_data(), c.status(), c.byte_len()))
        .collect();
    assert_eq!(seen, [(1, WcStatus::Success, 0), (2, WcStatus::Success, 4)]);
}
