//! Stress and cancel safety of the futures adapter on the soft device:
//! over a thousand concurrent awaited operations, completions in a random
//! order across queues, futures dropped mid-flight by `select!` and
//! timeouts, and rings dropped with futures pending. No hang, no lost
//! buffer.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use rdma_ring::backend::soft::{Progress, QpControl, SoftDevice, SoftPd, SoftQp};
use rdma_ring::backend::{QpConfig, WcStatus};
use rdma_ring::buf::{BaseBuf, BufferPool, ExposedBuf, RemoteAccess};
use rdma_ring::future::{AsyncRing, Wakeup};
use rdma_ring::ring::{Ring, RingConfig};
use rdma_ring::Error;

struct Setup {
    dev: SoftDevice,
    pd: SoftPd,
    a: AsyncRing<SoftQp>,
    b: AsyncRing<SoftQp>,
    controls: [QpControl; 2],
    pool: BufferPool,
    exposed: [ExposedBuf<Vec<u8>>; 2],
}

fn setup(progress: Progress, depth: u32, wakeup: Wakeup) -> Setup {
    let dev = SoftDevice::with_progress(progress);
    let pd = dev.alloc_pd();
    let config = QpConfig {
        max_send_wr: depth,
        max_recv_wr: depth,
        ..QpConfig::default()
    };
    let (qa, qb) = dev.connected_pair(&pd, &pd, config).unwrap();
    let controls = [qa.control(), qb.control()];
    let ring_config = RingConfig {
        signal_interval: 7,
        ..RingConfig::default()
    };
    let a = AsyncRing::new(Ring::new(qa, ring_config), wakeup).unwrap();
    let b = AsyncRing::new(Ring::new(qb, ring_config), wakeup).unwrap();
    let exposed = [
        ExposedBuf::new(&pd, vec![0u8; 64 * 2048], RemoteAccess::all()).unwrap(),
        ExposedBuf::new(&pd, vec![0u8; 64 * 2048], RemoteAccess::all()).unwrap(),
    ];
    let pool = BufferPool::new(&pd, 64, 4096).unwrap();
    Setup {
        dev,
        pd,
        a,
        b,
        controls,
        pool,
        exposed,
    }
}

/// Steps the two queue pairs in a pseudo-random order until stopped, so
/// completions interleave differently across the queues on every run.
fn random_stepper(
    controls: [QpControl; 2],
    seed: u64,
) -> (Arc<AtomicBool>, std::thread::JoinHandle<()>) {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&stop);
    let thread = std::thread::spawn(move || {
        let mut x = seed | 1;
        while !flag.load(Ordering::Acquire) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let side = (x & 1) as usize;
            for _ in 0..(x >> 8) % 5 {
                controls[side].step();
            }
            if x % 7 == 0 {
                std::thread::yield_now();
            }
        }
    });
    (stop, thread)
}

#[test]
fn a_thousand_concurrent_awaited_ops_in_random_order() {
    let s = setup(Progress::Manual, 1200, Wakeup::Thread);
    let (stop, stepper) = random_stepper(s.controls.clone(), 0x9e37_79b9_7f4a_7c15);
    let remote_on_b = s.exposed[1].remote();
    let remote_on_a = s.exposed[0].remote();
    futures::executor::block_on(async {
        // A writes 600 chunks to B while B writes 600 to A, and 200 sends
        // from A land in 200 receives posted by B: 1400 ops awaited at once.
        let recvs: Vec<_> = (0..200).map(|_| s.b.recv(s.pool.take().unwrap())).collect();
        let mut writes = Vec::new();
        for i in 0..600u64 {
            let mut chunk = s.pool.take().unwrap();
            chunk.fill(i as u8);
            writes.push(s.a.write(chunk, remote_on_b.slice(i * 64..(i + 1) * 64).unwrap()));
            let mut chunk = s.pool.take().unwrap();
            chunk.fill(!(i as u8));
            writes.push(s.b.write(chunk, remote_on_a.slice(i * 64..(i + 1) * 64).unwrap()));
        }
        let sends: Vec<_> = (0..200u8)
            .map(|i| {
                let mut chunk = s.pool.take().unwrap().slice(0..8);
                chunk.fill(i);
                s.a.send_imm(chunk, u32::from(i))
            })
            .collect();
        let (writes, sends, recvs) =
            futures::join!(join_all(writes), join_all(sends), join_all(recvs));
        for (result, _) in &writes {
            assert_eq!(*result.as_ref().unwrap(), 64);
        }
        for (result, _) in &sends {
            assert_eq!(*result.as_ref().unwrap(), 8);
        }
        // Receives complete in the order the sends ran: imm i carries bytes i.
        for (i, (result, buf)) in recvs.iter().enumerate() {
            let got = result.as_ref().unwrap();
            assert_eq!((got.len, got.imm), (8, Some(i as u32)));
            assert!(buf[..8].iter().all(|&b| b == i as u8));
        }
    });
    stop.store(true, Ordering::Release);
    stepper.join().unwrap();
    drop((s.a, s.b));
    let [on_a, on_b] = s.exposed;
    let (on_a, on_b) = (on_a.into_inner().unwrap(), on_b.into_inner().unwrap());
    for i in 0..600 {
        assert!(on_b[i * 64..(i + 1) * 64].iter().all(|&b| b == i as u8));
        assert!(on_a[i * 64..(i + 1) * 64].iter().all(|&b| b == !(i as u8)));
    }
    assert_eq!(
        s.pool.available(),
        s.pool.capacity(),
        "every buffer came back"
    );
    let _ = (s.dev, s.pd);
}

#[test]
fn futures_dropped_by_select_and_timeouts_release_buffers_only_after_the_device() {
    let s = setup(Progress::Manual, 64, Wakeup::Reactor);
    let remote = s.exposed[1].remote();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        // Nothing progresses: every op is still in flight when dropped.
        for i in 0..10u64 {
            let read = s.a.read(
                s.pool.take().unwrap(),
                remote.slice(i * 64..(i + 1) * 64).unwrap(),
            );
            tokio::select! {
                _ = read => panic!("the device never ran it"),
                _ = tokio::time::sleep(Duration::from_millis(1)) => {}
            }
        }
        for _ in 0..10 {
            let recv = s.b.recv(s.pool.take().unwrap());
            assert!(tokio::time::timeout(Duration::from_millis(1), recv)
                .await
                .is_err());
        }
        // smol-style select on futures' combinators, too.
        let write =
            s.a.write(s.pool.take().unwrap(), remote.slice(0..64).unwrap());
        let timer = futures::future::ready(());
        match futures::future::select(write, timer).await {
            futures::future::Either::Right(((), write)) => drop(write),
            futures::future::Either::Left(_) => panic!("the device never ran it"),
        }
    });
    // 21 buffers are orphaned but still owned by the ring: not back yet.
    assert_eq!(s.pool.available(), s.pool.capacity() - 21);
    // The device runs them; reaping releases the orphans.
    s.dev.progress();
    s.a.drive().unwrap();
    assert_eq!(
        s.pool.available(),
        s.pool.capacity() - 10,
        "the receives still wait for sends"
    );
    drop(s.b);
    assert_eq!(
        s.pool.available(),
        s.pool.capacity(),
        "closing B flushed its receives"
    );
}

#[test]
fn dropping_the_ring_resolves_pending_futures_with_a_flush() {
    let s = setup(Progress::Manual, 64, Wakeup::Thread);
    let recvs: Vec<_> = (0..16).map(|_| s.b.recv(s.pool.take().unwrap())).collect();
    let remote = s.exposed[0].remote();
    let reads: Vec<_> = (0..16u64)
        .map(|i| {
            s.b.read(
                s.pool.take().unwrap(),
                remote.slice(i * 64..(i + 1) * 64).unwrap(),
            )
        })
        .collect();
    let (waiting_tx, waiting_rx) = std::sync::mpsc::channel();
    let waiter = std::thread::spawn(move || {
        futures::executor::block_on(async {
            let mut both = std::pin::pin!(futures::future::join(join_all(recvs), join_all(reads)));
            assert!(futures::poll!(both.as_mut()).is_pending());
            waiting_tx.send(()).unwrap();
            let (recvs, reads) = both.await;
            let statuses: Vec<_> = recvs
                .iter()
                .map(|(r, _)| r.as_ref().map(|_| ()).map_err(status_of))
                .chain(
                    reads
                        .iter()
                        .map(|(r, _)| r.as_ref().map(|_| ()).map_err(status_of)),
                )
                .collect();
            statuses
        })
    });
    waiting_rx.recv().unwrap();
    drop(s.b); // the last handle: the ring closes, the QP is flushed
    let statuses = waiter.join().unwrap();
    assert_eq!(statuses.len(), 32);
    assert!(
        statuses.iter().all(|s| *s == Err(WcStatus::WrFlushErr)),
        "{statuses:?}"
    );
    assert_eq!(s.pool.available(), s.pool.capacity());
}

fn status_of(e: &Error) -> WcStatus {
    match e {
        Error::Completion { status, .. } => *status,
        other => panic!("not a completion error: {other}"),
    }
}

#[test]
fn a_full_queue_resolves_at_once_with_the_buffer() {
    let s = setup(Progress::Manual, 4, Wakeup::Busy);
    let remote = s.exposed[1].remote();
    futures::executor::block_on(async {
        let pending: Vec<_> = (0..3)
            .map(|i| {
                s.a.read(
                    s.pool.take().unwrap(),
                    remote.slice(i * 64..(i + 1) * 64).unwrap(),
                )
            })
            .collect();
        let (result, chunk) =
            s.a.read(s.pool.take().unwrap(), remote.slice(0..64).unwrap())
                .await;
        assert!(matches!(result, Err(Error::SendQueueFull { .. })));
        assert_eq!(chunk.len(), 64);
        drop(chunk);
        s.dev.progress();
        for (result, _) in join_all(pending).await {
            assert_eq!(result.unwrap(), 64);
        }
    });
    let _ = &s.pd;
}

#[test]
fn the_completion_stream_yields_batched_ops() {
    use futures::StreamExt;
    let s = setup(Progress::Auto, 64, Wakeup::Thread);
    let remote = s.exposed[1].remote();
    s.a.with_ring(|mut ring| {
        let mut sq = ring.submission();
        for i in 0..20u64 {
            sq.push(
                rdma_ring::op::Write::new(
                    s.pool.take().unwrap(),
                    remote.slice(i * 64..(i + 1) * 64).unwrap(),
                )
                .user_data(i),
            )
            .unwrap();
        }
        sq.submit().unwrap();
    });
    let tags: Vec<u64> =
        futures::executor::block_on(s.a.completions().take(20).map(|c| c.user_data()).collect());
    assert_eq!(tags, (0..20).collect::<Vec<_>>());
    drop(s.a);
}

#[test]
fn one_event_for_many_completions_wakes_every_future() {
    // 64 receives awaited; the first 40 futures are dropped; then 41 sends
    // complete in one burst, raising one event: the driver must reap past
    // the 40 orphans to wake the 41st receive.
    let s = setup(Progress::Manual, 128, Wakeup::Reactor);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        use tokio::io::{unix::AsyncFd, Interest};
        let driver = s.b.driver();
        // SAFETY: a `CompletionFd` keeps its descriptor open while it lives.
        let fd = unsafe {
            AsyncFd::register_with_interest(driver.completion_fd().unwrap(), Interest::READABLE)
        }
        .map_err(|e| e.to_string())
        .unwrap();
        let task = tokio::spawn(async move {
            while let Ok(mut ready) = fd.readable().await {
                driver.drive().unwrap();
                ready.clear_ready();
            }
        });
        let mut recvs: Vec<_> = (0..64).map(|_| s.b.recv(s.pool.take().unwrap())).collect();
        let kept = recvs.split_off(40);
        drop(recvs);
        let mut kept = kept.into_iter();
        // The 41st receive waits in its own task: only a wake-up from the
        // driver can resolve it.
        let first = tokio::spawn(kept.next().unwrap());
        tokio::task::yield_now().await;
        let sends: Vec<_> = (0..41u8)
            .map(|i| {
                s.a.send_imm(s.pool.take().unwrap().slice(0..4), u32::from(i))
            })
            .collect();
        s.dev.progress();
        let (got, _) = tokio::time::timeout(Duration::from_secs(10), first)
            .await
            .expect("woken")
            .unwrap();
        assert_eq!(got.unwrap().imm, Some(40));
        for (result, _) in join_all(sends).await {
            result.unwrap();
        }
        drop(kept);
        task.abort();
    });
}

#[test]
fn the_completion_stream_ends_when_the_ring_closes() {
    use futures::StreamExt;
    let s = setup(Progress::Manual, 16, Wakeup::Thread);
    let stream = s.a.completions();
    let (waiting_tx, waiting_rx) = std::sync::mpsc::channel();
    let waiter = std::thread::spawn(move || {
        futures::executor::block_on(async {
            let mut count = std::pin::pin!(stream.count());
            assert!(futures::poll!(count.as_mut()).is_pending());
            waiting_tx.send(()).unwrap();
            count.await
        })
    });
    waiting_rx.recv().unwrap();
    drop(s.a);
    assert_eq!(waiter.join().unwrap(), 0);
}

#[test]
fn rnr_exhaustion_resolves_without_anyone_polling() {
    let dev = SoftDevice::new();
    let pd = dev.alloc_pd();
    let config = QpConfig {
        rnr_retry: 2,
        ..QpConfig::default()
    };
    let (qa, _qb) = dev.connected_pair(&pd, &pd, config).unwrap();
    let ring = AsyncRing::new(Ring::new(qa, RingConfig::default()), Wakeup::Thread).unwrap();
    let buf = rdma_ring::buf::RegisteredBuf::new(&pd, vec![1u8; 8]).unwrap();
    let (result, _) = futures::executor::block_on(ring.send(buf));
    assert!(
        matches!(
            result,
            Err(Error::Completion {
                status: WcStatus::RnrRetryExcErr,
                ..
            })
        ),
        "{result:?}"
    );
}

#[test]
fn coalesced_awaited_writes_of_many_tasks_share_doorbells() {
    // Sixteen tasks each await one WRITE; all push before any is polled,
    // so the first poll posts them with one doorbell (the aim: under half
    // a doorbell per awaited operation at depth 16).
    use rdma_ring::buf::{BufferPool, ExposedBuf, RemoteAccess};
    use rdma_ring::future::AsyncRing;
    use rdma_ring::ring::{Ring, RingConfig};

    let dev = rdma_ring::backend::soft::SoftDevice::new();
    let pd = dev.alloc_pd();
    let (qp, _peer) = dev
        .connected_pair(&pd, &pd, rdma_ring::backend::QpConfig::default())
        .unwrap();
    let exposed = ExposedBuf::new(&pd, vec![0u8; 16 * 64], RemoteAccess::WRITE).unwrap();
    let pool = BufferPool::new(&pd, 64, 64).unwrap();
    let ring = AsyncRing::new(Ring::new(qp, RingConfig::default()), Wakeup::Busy).unwrap();
    ring.coalesce_doorbells(true);
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let mut ops = 0u64;
    for _round in 0..4 {
        rt.block_on(async {
            let tasks: Vec<_> = (0..16u64)
                .map(|i| {
                    let target = exposed.remote().slice(i * 64..(i + 1) * 64).unwrap();
                    let op = ring.write(pool.take().unwrap(), target);
                    tokio::spawn(async move { op.await.0 })
                })
                .collect();
            for t in tasks {
                assert_eq!(t.await.unwrap().unwrap(), 64);
            }
        });
        ops += 16;
    }
    let doorbells = ring.with_ring(|r| r.stats().doorbells);
    assert!(
        (doorbells as f64) / (ops as f64) < 0.5,
        "{doorbells} doorbells for {ops} awaited writes"
    );
    // A coalesced write whose future is dropped unpolled still goes out.
    let mut chunk = pool.take().unwrap();
    chunk.fill(0xab);
    drop(ring.write(chunk, exposed.remote().slice(15 * 64..16 * 64).unwrap()));
    // Off again: one doorbell per operation, as before.
    ring.coalesce_doorbells(false);
    let before = ring.with_ring(|r| r.stats().doorbells);
    let op = ring.write(pool.take().unwrap(), exposed.remote().slice(0..64).unwrap());
    assert_eq!(ring.with_ring(|r| r.stats().doorbells), before + 1);
    assert_eq!(futures::executor::block_on(op).0.unwrap(), 64);
    drop(ring);
    let memory = exposed.into_inner().unwrap();
    assert!(
        memory[15 * 64..].iter().all(|&b| b == 0xab),
        "the dropped write never ran"
    );
}

#[test]
fn coalesced_tasks_that_push_again_as_ops_complete_share_doorbells() {
    // The steady state of a pipelined client: sixteen tasks each await one
    // WRITE at a time, eight in a row. A task pushes its next write as its
    // last completes, so pushes are spread over the executor's rounds; a
    // future's first poll yields once so that the round's pushes go out
    // together, and only a future whose own write still waits rings the
    // doorbell. Without that, nearly every write rang its own (113 for
    // 128); with it, one per round.
    use rdma_ring::buf::{BufferPool, ExposedBuf, RemoteAccess};
    use rdma_ring::future::AsyncRing;
    use rdma_ring::ring::{Ring, RingConfig};

    let dev = rdma_ring::backend::soft::SoftDevice::new();
    let pd = dev.alloc_pd();
    let (qp, _peer) = dev
        .connected_pair(&pd, &pd, rdma_ring::backend::QpConfig::default())
        .unwrap();
    let exposed = ExposedBuf::new(&pd, vec![0u8; 16 * 64], RemoteAccess::WRITE).unwrap();
    let pool = BufferPool::new(&pd, 64, 16).unwrap();
    let ring = AsyncRing::new(Ring::new(qp, RingConfig::default()), Wakeup::Busy).unwrap();
    ring.coalesce_doorbells(true);
    let (tasks, each) = (16u64, 8u64);
    let task = |i: u64| {
        let (ring, pool, exposed) = (&ring, &pool, &exposed);
        async move {
            let target = exposed.remote().slice(i * 64..(i + 1) * 64).unwrap();
            for _ in 0..each {
                let (result, chunk) = ring.write(pool.take().unwrap(), target).await;
                assert_eq!(result.unwrap(), 64);
                drop(chunk);
            }
        }
    };
    futures::executor::block_on(futures::future::join_all((0..tasks).map(task)));
    let stats = ring.with_ring(|r| r.stats());
    assert_eq!(stats.send_wrs, tasks * each);
    assert!(
        stats.doorbells * 4 <= tasks * each,
        "{} doorbells for {} awaited writes (aim: at most one per four)",
        stats.doorbells,
        tasks * each
    );
}

/// A waker that panics when woken.
#[derive(Default)]
struct PanickingWaker(std::sync::atomic::AtomicBool);

impl std::task::Wake for PanickingWaker {
    fn wake(self: Arc<Self>) {
        // Said first: a test checks the panic happened.
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
        panic!("a waker that panics");
    }
}

impl PanickingWaker {
    fn panicked(&self) -> bool {
        self.0.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// A waker that counts its wakes.
#[derive(Default)]
struct CountingWaker(std::sync::atomic::AtomicUsize);

impl std::task::Wake for CountingWaker {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// A waker that panics does not keep the others collected with it from
/// being woken, nor reaches the caller (the panic hook reports it), and
/// every operation still completes.
#[test]
fn a_panicking_waker_does_not_keep_the_others_asleep() {
    use std::future::Future;
    use std::task::{Context, Poll, Waker};
    let s = setup(Progress::Manual, 16, Wakeup::Reactor);
    let remote = s.exposed[1].remote();
    let mut first = Box::pin(s.a.write(s.pool.take().unwrap(), remote.slice(0..64).unwrap()));
    let mut second = Box::pin(s.a.write(s.pool.take().unwrap(), remote.slice(64..128).unwrap()));
    let panics = Arc::new(PanickingWaker::default());
    let panicking = Waker::from(Arc::clone(&panics));
    let counting = Arc::new(CountingWaker::default());
    let counted = Waker::from(Arc::clone(&counting));
    assert!(first
        .as_mut()
        .poll(&mut Context::from_waker(&panicking))
        .is_pending());
    assert!(second
        .as_mut()
        .poll(&mut Context::from_waker(&counted))
        .is_pending());
    s.dev.progress();
    let driven = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| s.a.drive()));
    assert!(panics.panicked(), "the panicking waker was never woken");
    // The panic hook told of it; the caller's own drive went fine.
    assert!(
        driven.is_ok(),
        "another task's waker panicked into the caller"
    );
    assert_eq!(
        counting.0.load(Ordering::SeqCst),
        1,
        "the other task was woken"
    );
    let noop = &mut Context::from_waker(Waker::noop());
    for op in [&mut first, &mut second] {
        match op.as_mut().poll(noop) {
            Poll::Ready((result, _buf)) => assert_eq!(result.unwrap(), 64),
            Poll::Pending => panic!("a completed operation is still pending"),
        }
    }
}

/// Memory whose drop panics (unless already unwinding).
struct PanicsOnDrop(Vec<u8>);

// SAFETY: the Vec's heap buffer is never reallocated: nothing here takes
// `&mut Vec`, and moving the Vec does not move its buffer.
unsafe impl rdma_ring::buf::StableBuf for PanicsOnDrop {
    fn stable_ptr(&self) -> *const u8 {
        self.0.as_ptr()
    }
    fn stable_len(&self) -> usize {
        self.0.len()
    }
}

// SAFETY: as above; `as_mut_ptr` is the same address.
unsafe impl rdma_ring::buf::StableBufMut for PanicsOnDrop {
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        self.0.as_mut_ptr()
    }
}

impl Drop for PanicsOnDrop {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            panic!("a buffer whose drop panics");
        }
    }
}

/// The buffer of an operation whose future was dropped is dropped once
/// the ring is released, not in the middle of its bookkeeping: a drop that
/// panics (the panic hook reports it) cuts nothing short, and the other
/// operations completed by the same poll still reach their futures.
#[test]
fn a_buffer_whose_drop_panics_loses_no_other_completion() {
    use rdma_ring::buf::RegisteredBuf;
    use std::future::Future;
    use std::task::{Context, Poll, Waker};
    let s = setup(Progress::Manual, 16, Wakeup::Reactor);
    let remote = s.exposed[1].remote();
    let noop = &mut Context::from_waker(Waker::noop());
    let panics = RegisteredBuf::new(&s.pd, PanicsOnDrop(vec![0u8; 64])).unwrap();
    let mut dropped = Box::pin(s.a.write(panics, remote.slice(0..64).unwrap()));
    let mut kept: Vec<_> = (1..4u64)
        .map(|i| {
            let target = remote.slice(i * 64..(i + 1) * 64).unwrap();
            Box::pin(s.a.write(s.pool.take().unwrap(), target))
        })
        .collect();
    assert!(dropped.as_mut().poll(noop).is_pending());
    for op in &mut kept {
        assert!(op.as_mut().poll(noop).is_pending());
    }
    drop(dropped);
    s.dev.progress();
    let driven = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| s.a.drive()));
    // The panic hook told of it; the caller's own drive went fine.
    assert!(
        driven.is_ok(),
        "a dropped future's buffer panicked into the caller"
    );
    for op in &mut kept {
        match op.as_mut().poll(noop) {
            Poll::Ready((result, _buf)) => assert_eq!(result.unwrap(), 64),
            Poll::Pending => panic!("a completed operation is still pending"),
        }
    }
    s.a.with_ring(|ring| assert_eq!(ring.in_flight(), 0));
}

/// The notifier thread (`Wakeup::Thread`) runs the wakers of the tasks it
/// wakes: one that panics does not stop it, and operations awaited later
/// are still woken.
#[test]
fn a_panicking_waker_does_not_stop_the_notifier() {
    use std::future::Future;
    use std::task::{Context, Poll, Waker};
    let s = setup(Progress::Manual, 16, Wakeup::Thread);
    let remote = s.exposed[1].remote();
    let mut first = Box::pin(s.a.write(s.pool.take().unwrap(), remote.slice(0..64).unwrap()));
    let panics = Arc::new(PanickingWaker::default());
    let panicking = Waker::from(Arc::clone(&panics));
    assert!(first
        .as_mut()
        .poll(&mut Context::from_waker(&panicking))
        .is_pending());
    s.dev.progress(); // the notifier drives, and the waker panics
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !panics.panicked() {
        assert!(
            std::time::Instant::now() < deadline,
            "the waker never panicked"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut later = Box::pin(s.a.write(s.pool.take().unwrap(), remote.slice(64..128).unwrap()));
    // Polled (and posted) before the device runs it: only the notifier's
    // wake can tell its task it is done.
    let woken = Arc::new(CountingWaker::default());
    let waker = Waker::from(Arc::clone(&woken));
    assert!(later
        .as_mut()
        .poll(&mut Context::from_waker(&waker))
        .is_pending());
    s.dev.progress();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while woken.0.load(Ordering::SeqCst) == 0 {
        assert!(std::time::Instant::now() < deadline, "nobody woke the task");
        std::thread::sleep(Duration::from_millis(10));
    }
    let noop = &mut Context::from_waker(Waker::noop());
    let Poll::Ready((written, _buf)) = later.as_mut().poll(noop) else {
        panic!("woken, and not done");
    };
    assert_eq!(written.unwrap(), 64);
    drop(first);
}

/// Two completion streams of one ring wait side by side: a poll of one
/// does not wake the other (they would wake each other for ever, a core
/// spinning for nothing), and a completion wakes both.
#[test]
fn two_completion_streams_wait_without_waking_each_other() {
    use futures::Stream;
    use std::task::{Context, Poll, Waker};
    let s = setup(Progress::Manual, 16, Wakeup::Reactor);
    let mut streams = [s.a.completions(), s.a.completions()];
    let counts = [0, 1].map(|_| Arc::new(CountingWaker::default()));
    let wakers = counts.clone().map(Waker::from);
    for _ in 0..3 {
        for (stream, waker) in streams.iter_mut().zip(&wakers) {
            let polled = std::pin::Pin::new(stream).poll_next(&mut Context::from_waker(waker));
            assert!(polled.is_pending());
        }
    }
    let woken = || counts.each_ref().map(|c| c.0.load(Ordering::SeqCst));
    assert_eq!(woken(), [0, 0], "nothing completed: nobody to wake");
    s.a.with_ring(|mut ring| {
        let mut sq = ring.submission();
        sq.push(
            rdma_ring::op::Write::new(
                s.pool.take().unwrap(),
                s.exposed[1].remote().slice(0..64).unwrap(),
            )
            .user_data(7),
        )
        .unwrap();
        sq.submit().unwrap();
    });
    s.dev.progress();
    s.a.drive().unwrap();
    assert_eq!(woken(), [1, 1], "a completion wakes every stream waiting");
    let got = std::pin::Pin::new(&mut streams[0]).poll_next(&mut Context::from_waker(&wakers[0]));
    assert!(matches!(got, Poll::Ready(Some(c)) if c.user_data() == 7));
}

/// A `wait` through `with_ring` that times out puts what it reaped back
/// for the completion stream, and wakes the stream's task for it: under
/// `Wakeup::Reactor` nothing else would until the next completion.
#[test]
fn a_failed_wait_under_the_lock_wakes_the_completion_stream() {
    use futures::StreamExt;
    use rdma_ring::op::Write;
    use std::task::{Context, Waker};
    let dev = SoftDevice::with_progress(Progress::Manual);
    let pd = dev.alloc_pd();
    let (qa, _qb) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    let config = RingConfig {
        wait_timeout: Duration::from_millis(50),
        ..RingConfig::default()
    };
    let a = AsyncRing::new(Ring::new(qa, config), Wakeup::Reactor).unwrap();
    let target = ExposedBuf::new(&pd, vec![0u8; 4096], RemoteAccess::all()).unwrap();
    let pool = BufferPool::new(&pd, 4, 64).unwrap();
    let mut stream = a.completions();
    let woken = Arc::new(CountingWaker::default());
    let waker = Waker::from(Arc::clone(&woken));
    assert!(stream
        .poll_next_unpin(&mut Context::from_waker(&waker))
        .is_pending());
    let write = |i: u64| {
        Write::new(
            pool.take().unwrap(),
            target.remote().slice(i * 64..(i + 1) * 64).unwrap(),
        )
        .signaled()
        .user_data(i)
    };
    let waited = a.with_ring(|mut ring| {
        ring.submission().push(write(1)).unwrap();
        ring.submit().unwrap();
        dev.progress();
        // The second never runs: the wait reaps the first, then times out.
        ring.submission().push(write(2)).unwrap();
        ring.submit().unwrap();
        ring.completion().wait(2).map(|got| got.len())
    });
    assert!(waited.is_err(), "{waited:?}");
    assert!(
        woken.0.load(Ordering::SeqCst) > 0,
        "the stream's task was not told of the completion put back"
    );
    let first = stream
        .poll_next_unpin(&mut Context::from_waker(Waker::noop()))
        .map(|c| c.map(|c| c.user_data()));
    assert_eq!(first, std::task::Poll::Ready(Some(1)));
    dev.progress();
}
