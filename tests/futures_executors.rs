//! The futures adapter on three executors — tokio (reactor wake-ups through
//! `AsyncFd`), smol (async-io's `Async`), and `futures::executor::block_on`
//! (notifier thread, and busy polling) — on the soft device, both with
//! completions arriving inside the post (auto progress) and arriving later
//! from another thread (manual progress driven by a background thread).

#[path = "../examples/async_common/mod.rs"]
mod async_common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rdma_ring::backend::soft::{Progress, SoftDevice, SoftQp};
use rdma_ring::future::{AsyncRing, Wakeup};

/// Runs `dev.progress()` every few hundred microseconds until dropped, so
/// completions arrive late and only a real wake-up can resolve a future.
struct Progressor {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Progressor {
    fn start(dev: &SoftDevice) -> Progressor {
        let stop = Arc::new(AtomicBool::new(false));
        let (dev, flag) = (dev.clone(), Arc::clone(&stop));
        let thread = std::thread::spawn(move || {
            while !flag.load(Ordering::Acquire) {
                dev.progress();
                std::thread::sleep(Duration::from_micros(300));
            }
        });
        Progressor {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Progressor {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
    }
}

fn tokio_driver(ring: &AsyncRing<SoftQp>) -> tokio::task::JoinHandle<()> {
    use tokio::io::{unix::AsyncFd, Interest};
    let driver = ring.driver();
    let channel = driver.completion_fd().unwrap();
    // SAFETY: a `CompletionFd` keeps its descriptor open while it lives and
    // always reports the same one.
    let fd = unsafe { AsyncFd::register_with_interest(channel, Interest::READABLE) }
        .map_err(|e| e.to_string())
        .unwrap();
    tokio::spawn(async move {
        while let Ok(mut ready) = fd.readable().await {
            driver.drive().unwrap();
            ready.clear_ready();
        }
    })
}

fn smol_driver(ring: &AsyncRing<SoftQp>) -> smol::Task<()> {
    let driver = ring.driver();
    let fd = smol::Async::new(driver.completion_fd().unwrap()).unwrap();
    smol::spawn(async move {
        while fd.readable().await.is_ok() {
            driver.drive().unwrap();
        }
    })
}

fn tokio_run(dev: SoftDevice) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let e = async_common::endpoints_on(dev, Wakeup::Reactor).unwrap();
        let drivers = [tokio_driver(&e.a), tokio_driver(&e.b)];
        let result =
            tokio::time::timeout(Duration::from_secs(60), async_common::exercise(&e)).await;
        for d in drivers {
            d.abort();
        }
        result.expect("no hang").unwrap();
    });
}

fn smol_run(dev: SoftDevice) {
    smol::block_on(async {
        let e = async_common::endpoints_on(dev, Wakeup::Reactor).unwrap();
        let drivers = [smol_driver(&e.a), smol_driver(&e.b)];
        async_common::exercise(&e).await.unwrap();
        drop(drivers);
    });
}

fn block_on_run(dev: SoftDevice, wakeup: Wakeup) {
    futures::executor::block_on(async {
        let e = async_common::endpoints_on(dev, wakeup).unwrap();
        async_common::exercise(&e).await.unwrap();
    });
}

#[test]
fn tokio_quickstart() {
    tokio_run(SoftDevice::new());
}

#[test]
fn tokio_quickstart_with_late_completions() {
    let dev = SoftDevice::with_progress(Progress::Manual);
    let _progress = Progressor::start(&dev);
    tokio_run(dev.clone());
}

#[test]
fn smol_quickstart() {
    smol_run(SoftDevice::new());
}

#[test]
fn smol_quickstart_with_late_completions() {
    let dev = SoftDevice::with_progress(Progress::Manual);
    let _progress = Progressor::start(&dev);
    smol_run(dev.clone());
}

#[test]
fn block_on_quickstart_with_notifier_thread() {
    block_on_run(SoftDevice::new(), Wakeup::Thread);
}

#[test]
fn block_on_quickstart_with_late_completions() {
    let dev = SoftDevice::with_progress(Progress::Manual);
    let _progress = Progressor::start(&dev);
    block_on_run(dev.clone(), Wakeup::Thread);
}

#[test]
fn block_on_quickstart_busy_polling() {
    let dev = SoftDevice::with_progress(Progress::Manual);
    let _progress = Progressor::start(&dev);
    block_on_run(dev.clone(), Wakeup::Busy);
}

/// Records that it was woken.
struct Woken(AtomicBool);

impl futures::task::ArcWake for Woken {
    fn wake_by_ref(arc_self: &Arc<Self>) {
        arc_self.0.store(true, Ordering::SeqCst);
    }
}

/// A blocking wait through `with_ring` sleeps on the adapter's own
/// completion channel; it leaves the channel armed, so a reactor still
/// hears of the completions that come after it.
#[tokio::test]
async fn a_blocking_wait_through_with_ring_leaves_the_reactor_its_wakeups() {
    use rdma_ring::buf::RegisteredBuf;
    use rdma_ring::op::{Recv, Send};
    use rdma_ring::ring::{Ring, RingConfig};
    use std::future::Future;
    use tokio::io::unix::AsyncFd;
    use tokio::io::Interest;

    let dev = SoftDevice::new();
    let pd = dev.alloc_pd();
    let (qa, qb) = dev
        .connected_pair(&pd, &pd, rdma_ring::backend::QpConfig::default())
        .unwrap();
    let config = RingConfig {
        spin_polls: 1,
        ..RingConfig::default()
    };
    let a = AsyncRing::new(Ring::new(qa, config), Wakeup::Reactor).unwrap();
    let driver = a.driver();
    // SAFETY: a `CompletionFd` keeps its descriptor open while it lives.
    let fd = unsafe {
        AsyncFd::register_with_interest(driver.completion_fd().unwrap(), Interest::READABLE)
    }
    .unwrap();
    let reactor = tokio::spawn(async move {
        while let Ok(mut ready) = fd.readable().await {
            driver.drive().unwrap();
            ready.clear_ready();
        }
    });

    // The peer sends once the wait below sleeps, and again when told.
    let (go, again) = std::sync::mpsc::channel::<()>();
    let msgs: Vec<_> = (0..2u8)
        .map(|round| RegisteredBuf::new(&pd, vec![round; 4]).unwrap())
        .collect();
    let peer = std::thread::spawn(move || {
        let mut b = Ring::new(qb, RingConfig::default());
        for (round, msg) in msgs.into_iter().enumerate() {
            if round == 0 {
                std::thread::sleep(Duration::from_millis(50));
            } else {
                again.recv().unwrap();
            }
            b.submission().push(Send::new(msg)).unwrap();
            b.submit().unwrap();
            b.completion().wait(1).unwrap();
        }
    });
    let got = a.with_ring(|mut ring| {
        let buf = RegisteredBuf::new(&pd, vec![9u8; 4]).unwrap();
        ring.submission().push(Recv::new(buf)).unwrap();
        ring.submit().unwrap();
        ring.completion().wait(1).unwrap()
    });
    assert_eq!(got.len(), 1);
    assert!(got[0].status().is_success());

    // An awaited receive, polled once (its waker registered) before its
    // message is sent: only the reactor can wake it (polling it again
    // would reap by itself, so it is not polled until woken).
    let mut recv = a.recv(RegisteredBuf::new(&pd, vec![9u8; 4]).unwrap());
    let woken = Arc::new(Woken(AtomicBool::new(false)));
    let waker = futures::task::waker(Arc::clone(&woken));
    let first = std::pin::Pin::new(&mut recv).poll(&mut std::task::Context::from_waker(&waker));
    assert!(first.is_pending());
    go.send(()).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !woken.0.load(Ordering::SeqCst) {
        assert!(
            std::time::Instant::now() < deadline,
            "the reactor never heard of the second message"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (result, buf) = recv.await;
    assert_eq!(result.unwrap().len, 4);
    assert_eq!(&buf[..], &[1u8; 4]);
    peer.join().unwrap();
    reactor.abort();
}

/// A failed arm of the completion channel (ibv_req_notify_cq refused)
/// neither keeps the drive that met it from handing out the completions
/// waiting, nor leaves the ring unarmed for good: with no event to come,
/// the next tick drives, and arms again.
#[test]
fn a_failed_arm_strands_no_completion() {
    use rdma_ring::buf::{ExposedBuf, RegisteredBuf, RemoteAccess};
    use rdma_ring::ring::{Ring, RingConfig};
    use std::future::Future;
    use std::task::{Context, Poll};

    let dev = SoftDevice::with_progress(Progress::Manual);
    let pd = dev.alloc_pd();
    let (qp, _peer) = dev
        .connected_pair(&pd, &pd, rdma_ring::backend::QpConfig::default())
        .unwrap();
    let target = ExposedBuf::new(&pd, vec![0u8; 8], RemoteAccess::WRITE).unwrap();
    let ring = AsyncRing::new(Ring::new(qp, RingConfig::default()), Wakeup::Reactor).unwrap();
    let write = |byte: u8| {
        let buf = RegisteredBuf::new(&pd, vec![byte; 8]).unwrap();
        Box::pin(ring.write(buf, target.remote()))
    };
    let woken = Arc::new(Woken(AtomicBool::new(false)));
    let waker = futures::task::waker(Arc::clone(&woken));
    let mut cx = Context::from_waker(&waker);

    // The first write completes; the drive for its event fails to arm.
    let mut first = write(1);
    assert!(first.as_mut().poll(&mut cx).is_pending());
    dev.fail_arms(1);
    dev.progress();
    assert!(ring.drive().is_err(), "the arm's failure is reported");
    assert!(
        woken.0.swap(false, Ordering::SeqCst),
        "the drive handed out the completion all the same"
    );
    let Poll::Ready((done, _)) = first.as_mut().poll(&mut cx) else {
        panic!("the first write's completion was left in the queue");
    };
    done.unwrap();

    // The second raises no event (the channel is not armed): a tick
    // drives, and arms the channel again.
    let mut second = write(2);
    assert!(second.as_mut().poll(&mut cx).is_pending());
    dev.progress();
    ring.tick();
    assert!(
        woken.0.swap(false, Ordering::SeqCst),
        "the tick drove the unarmed ring"
    );
    let Poll::Ready((done, _)) = second.as_mut().poll(&mut cx) else {
        panic!("the second write's completion was stranded");
    };
    done.unwrap();

    // Armed again: the third raises an event, and the drive is clean.
    let mut third = write(3);
    assert!(third.as_mut().poll(&mut cx).is_pending());
    dev.progress();
    let events = ring.completion_fd().unwrap();
    let mut fds = [libc::pollfd {
        fd: std::os::fd::AsRawFd::as_raw_fd(&events),
        events: libc::POLLIN,
        revents: 0,
    }];
    // SAFETY: one valid pollfd, for the length given.
    assert_eq!(
        unsafe { libc::poll(fds.as_mut_ptr(), 1, 1000) },
        1,
        "an event came"
    );
    assert_eq!(ring.drive().unwrap(), 1);
    assert!(matches!(
        third.as_mut().poll(&mut cx),
        Poll::Ready((Ok(_), _))
    ));
}

/// A future of a pushed operation dropped before the submit posts it at
/// once (with whatever else was pushed), not at some later, unrelated
/// submit: the write lands before the drop returns.
#[test]
fn a_pushed_operation_dropped_before_its_submit_goes_out_at_the_drop() {
    use rdma_ring::buf::{ExposedBuf, RegisteredBuf, RemoteAccess};
    use rdma_ring::op::Write;
    use rdma_ring::ring::{Ring, RingConfig};

    let dev = SoftDevice::new();
    let pd = dev.alloc_pd();
    let (qp, _peer) = dev
        .connected_pair(&pd, &pd, rdma_ring::backend::QpConfig::default())
        .unwrap();
    let rights = RemoteAccess::WRITE | RemoteAccess::READ;
    let target = ExposedBuf::new(&pd, vec![0u8; 8], rights).unwrap();
    let ring = AsyncRing::new(Ring::new(qp, RingConfig::default()), Wakeup::Busy).unwrap();
    let buf = RegisteredBuf::new(&pd, vec![7u8; 8]).unwrap();
    let write = ring.push(Write::new(buf, target.remote()));
    assert_eq!(ring.with_ring(|r| r.stats().doorbells), 0, "pushed only");
    drop(write);
    assert_eq!(
        ring.with_ring(|r| r.stats().doorbells),
        1,
        "posted at the drop"
    );
    // What it wrote is there; its completion is reaped like any
    // orphan's, nothing left over.
    futures::executor::block_on(async {
        let buf = RegisteredBuf::new(&pd, vec![0u8; 8]).unwrap();
        let (read, buf) = ring.read(buf, target.remote()).await;
        assert_eq!(read.unwrap(), 8);
        assert_eq!(&buf[..], &[7u8; 8]);
    });
    assert_eq!(ring.with_ring(|r| r.in_flight()), 0);
}

/// A pushed operation awaited before any submit goes out at its first
/// poll, with everything pushed before it, in one doorbell: it does not
/// wait for a submit that never comes.
#[test]
fn a_pushed_operation_awaited_before_a_submit_goes_out_at_its_poll() {
    use rdma_ring::buf::{ExposedBuf, RegisteredBuf, RemoteAccess};
    use rdma_ring::op::Write;
    use rdma_ring::ring::{Ring, RingConfig};

    let dev = SoftDevice::new();
    let pd = dev.alloc_pd();
    let rights = RemoteAccess::WRITE | RemoteAccess::READ;
    let target = ExposedBuf::new(&pd, vec![0u8; 16], rights).unwrap();
    // Without the fix the awaits hang: a watchdog says so.
    let (done, finished) = std::sync::mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
            finished.recv_timeout(Duration::from_secs(60))
        {
            eprintln!("a pushed operation awaited before a submit never went out");
            std::process::abort();
        }
    });
    for wakeup in [Wakeup::Busy, Wakeup::Thread] {
        let (qp, _peer) = dev
            .connected_pair(&pd, &pd, rdma_ring::backend::QpConfig::default())
            .unwrap();
        let ring = AsyncRing::new(Ring::new(qp, RingConfig::default()), wakeup).unwrap();
        let first = ring.push(Write::new(
            RegisteredBuf::new(&pd, vec![1u8; 8]).unwrap(),
            target.remote().slice(0..8).unwrap(),
        ));
        let second = ring.push(Write::new(
            RegisteredBuf::new(&pd, vec![2u8; 8]).unwrap(),
            target.remote().slice(8..16).unwrap(),
        ));
        let (written, _) = futures::executor::block_on(second);
        assert_eq!(written.unwrap(), 8);
        assert_eq!(ring.with_ring(|r| r.stats().doorbells), 1, "one for both");
        let (written, _) = futures::executor::block_on(first);
        assert_eq!(written.unwrap(), 8);
        assert_eq!(ring.with_ring(|r| r.stats().doorbells), 1);
        let into = RegisteredBuf::new(&pd, vec![0u8; 16]).unwrap();
        let (read, got) = futures::executor::block_on(ring.read(into, target.remote()));
        assert_eq!(read.unwrap(), 16);
        assert_eq!(got[..8], [1u8; 8]);
        assert_eq!(got[8..], [2u8; 8]);
    }
    done.send(()).unwrap();
    watchdog.join().unwrap();
}

/// An awaited receive an RDMA WRITE with immediate used up says 0 bytes
/// arrived in its buffer (so `&buf[..len]` stays inside what arrived, as
/// the sync ring's `result` does) and how many the WRITE wrote elsewhere.
#[test]
fn an_awaited_receive_used_by_a_write_with_immediate_holds_nothing() {
    use rdma_ring::buf::{ExposedBuf, RegisteredBuf, RemoteAccess};
    use rdma_ring::op::WriteImm;
    use rdma_ring::ring::{Ring, RingConfig};

    let dev = SoftDevice::new();
    let pd = dev.alloc_pd();
    let (qp, peer) = dev
        .connected_pair(&pd, &pd, rdma_ring::backend::QpConfig::default())
        .unwrap();
    let target = ExposedBuf::new(&pd, vec![0u8; 4096], RemoteAccess::WRITE).unwrap();
    let ring = AsyncRing::new(Ring::new(qp, RingConfig::default()), Wakeup::Busy).unwrap();
    let mut peer = Ring::new(peer, RingConfig::default());
    let recv = ring.recv(RegisteredBuf::new(&pd, vec![0u8; 16]).unwrap());
    let data = RegisteredBuf::new(&pd, vec![7u8; 4096]).unwrap();
    peer.submission()
        .push(WriteImm::new(data, target.remote(), 9))
        .unwrap();
    peer.submit().unwrap();
    let (got, buf) = futures::executor::block_on(recv);
    let got = got.unwrap();
    assert!(got.write_imm);
    assert_eq!((got.len, got.written, got.imm), (0, 4096, Some(9)));
    assert!(buf[..got.len].is_empty());
}

/// A submit through `with_ring` posts the coalesced operations waiting
/// for a doorbell, and the adapter knows it: their futures' first polls
/// do not yield for a doorbell that already rang.
#[test]
fn a_locked_submit_rings_the_coalesced_operations_doorbell() {
    use rdma_ring::buf::{ExposedBuf, RegisteredBuf, RemoteAccess};
    use rdma_ring::ring::{Ring, RingConfig};
    use std::future::Future;
    use std::task::{Context, Poll};

    let dev = SoftDevice::new();
    let pd = dev.alloc_pd();
    let (qp, _peer) = dev
        .connected_pair(&pd, &pd, rdma_ring::backend::QpConfig::default())
        .unwrap();
    let target = ExposedBuf::new(&pd, vec![0u8; 8], RemoteAccess::WRITE).unwrap();
    let ring = AsyncRing::new(Ring::new(qp, RingConfig::default()), Wakeup::Busy).unwrap();
    ring.coalesce_doorbells(true);
    let mut write = Box::pin(ring.write(
        RegisteredBuf::new(&pd, vec![3u8; 8]).unwrap(),
        target.remote(),
    ));
    assert_eq!(ring.with_ring(|r| r.stats().doorbells), 0, "deferred");
    assert_eq!(ring.with_ring(|mut r| r.submit().unwrap()), 1);
    let waker = futures::task::noop_waker();
    let mut cx = Context::from_waker(&waker);
    assert!(
        matches!(write.as_mut().poll(&mut cx), Poll::Ready((Ok(8), _))),
        "done at the first poll"
    );
}

/// A `with_ring` closure that panics after its reap handed an awaited
/// operation its completion: the operation's task is woken all the same
/// (nothing else might wake it on a quiet ring).
#[test]
fn a_panicking_with_ring_closure_still_wakes_what_its_reap_completed() {
    use rdma_ring::backend::QpConfig;
    use rdma_ring::buf::{ExposedBuf, RegisteredBuf, RemoteAccess};
    use rdma_ring::ring::{Ring, RingConfig};
    use std::future::Future;

    let dev = SoftDevice::with_progress(Progress::Manual);
    let pd = dev.alloc_pd();
    let (qa, _qb) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    let target = ExposedBuf::new(&pd, vec![0u8; 8], RemoteAccess::WRITE).unwrap();
    let a = AsyncRing::new(Ring::new(qa, RingConfig::default()), Wakeup::Reactor)
        .unwrap_or_else(|_| panic!("a fresh ring"));
    let mut write = a.write(
        RegisteredBuf::new(&pd, vec![1u8; 8]).unwrap(),
        target.remote(),
    );
    let woken = Arc::new(Woken(AtomicBool::new(false)));
    let waker = futures::task::waker(Arc::clone(&woken));
    let first = std::pin::Pin::new(&mut write).poll(&mut std::task::Context::from_waker(&waker));
    assert!(first.is_pending(), "not run yet");
    dev.progress();
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        a.with_ring(|mut ring| {
            let mut unawaited = Vec::new();
            ring.completion().reap(&mut unawaited).unwrap();
            panic!("the caller's closure panics after its reap");
        })
    }));
    assert!(panicked.is_err());
    assert!(
        woken.0.load(Ordering::SeqCst),
        "the write's task was never woken"
    );
    let done = futures::executor::block_on(write);
    assert!(done.0.is_ok());
}
