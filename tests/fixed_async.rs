//! The fixed-buffer ring awaited ([`AsyncFixedRing`]) on the soft device:
//! batching by push-then-await, slots of dropped futures coming back,
//! closing with work pending, many tasks at once, and each way of being
//! woken (busy polling, a notifier thread, a tokio reactor).

use std::time::Duration;

use futures::executor::LocalPool;
use futures::task::LocalSpawnExt;
use rdma_ring::backend::soft::{QpControl, SoftDevice, SoftPd, SoftQp};
use rdma_ring::backend::{QpConfig, QueuePair, WcStatus};
use rdma_ring::buf::{ExposedBuf, RemoteAccess};
use rdma_ring::fixed::{
    FixedBufs, FixedQp, FixedRing, FixedRingConfig, ReadFixed, RecvFixed, SendFixed, WriteFixed,
};
use rdma_ring::future::{AsyncFixedRing, FixedOpFuture, Wakeup};
use rdma_ring::Error;

mod interleavings;
mod peer_watch;

const SLOTS: u32 = 32;

struct Pair {
    _dev: SoftDevice,
    pd: SoftPd,
    a: AsyncFixedRing<SoftQp>,
    ha: FixedQp,
    control: QpControl,
    control_b: QpControl,
    b: AsyncFixedRing<SoftQp>,
    hb: FixedQp,
}

fn pair(wakeup: Wakeup) -> Pair {
    let dev = SoftDevice::new();
    let pd = dev.alloc_pd();
    let (mut qa, mut qb) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    let control = qa.control();
    let control_b = qb.control();
    let ring = |cq| {
        let bufs = FixedBufs::new(&pd, SLOTS, 256).unwrap();
        AsyncFixedRing::new(FixedRing::new(cq, bufs, FixedRingConfig::default()), wakeup).unwrap()
    };
    let a = ring(qa.take_cq().unwrap());
    let b = ring(qb.take_cq().unwrap());
    let ha = a.attach(qa).unwrap();
    let hb = b.attach(qb).unwrap();
    Pair {
        _dev: dev,
        pd,
        a,
        ha,
        control,
        control_b,
        b,
        hb,
    }
}

#[test]
fn writes_pushed_before_they_are_awaited_share_one_doorbell() {
    let p = pair(Wakeup::Busy);
    let target = ExposedBuf::new(&p.pd, vec![0u8; 16 * 256], RemoteAccess::WRITE).unwrap();
    let writes: Vec<FixedOpFuture<SoftQp>> = (0..16u64)
        .map(|i| {
            let mut slot = p.a.take_buf().unwrap();
            p.a.with_bufs(|bufs| bufs.bytes_mut(&mut slot).fill(i as u8))
                .unwrap();
            let remote = target.remote().slice(i * 256..(i + 1) * 256).unwrap();
            p.a.push(p.ha, WriteFixed::new(slot, 256, remote).user_data(i))
                .unwrap()
        })
        .collect();
    assert_eq!(p.control.counters().send_posts, 0, "pushing posts nothing");
    let done = futures::executor::block_on(futures::future::join_all(writes));
    assert_eq!(p.control.counters().send_posts, 1, "one doorbell for 16");
    for (i, c) in done.into_iter().enumerate() {
        let c = c.unwrap();
        assert_eq!((c.status(), c.user_data()), (WcStatus::Success, i as u64));
        p.a.put_buf(c.into_buf()).unwrap();
    }
    assert_eq!(p.a.with_bufs(|bufs| bufs.free()).unwrap(), SLOTS);
    drop(p.a);
    let bytes = target.into_inner().unwrap();
    for (i, chunk) in bytes.chunks(256).enumerate() {
        assert!(chunk.iter().all(|&b| b == i as u8), "chunk {i}");
    }
}

/// Futures post their operations themselves, so the error of a post the
/// device refused reaches no caller: the futures resolve flushed, every
/// slot comes back, and the ring tells why, for that queue pair only.
#[test]
fn a_post_the_device_refuses_resolves_flushed_and_the_ring_says_why() {
    let p = pair(Wakeup::Busy);
    let target = ExposedBuf::new(&p.pd, vec![0u8; 256], RemoteAccess::WRITE).unwrap();
    let write = |ring: &AsyncFixedRing<SoftQp>, qp| {
        let slot = ring.take_buf().unwrap();
        ring.push(qp, WriteFixed::new(slot, 8, target.remote()))
            .unwrap()
    };
    let refused = p.control.counters().send_posts;
    p.control.refuse_posts(1);
    let writes = vec![write(&p.a, p.ha), write(&p.a, p.ha)];
    let other = write(&p.b, p.hb);
    let done = futures::executor::block_on(futures::future::join_all(writes));
    for c in done {
        let c = c.unwrap();
        assert_eq!(c.status(), WcStatus::WrFlushErr);
        p.a.put_buf(c.into_buf()).unwrap();
    }
    assert_eq!(
        p.control.counters().send_posts,
        refused + 1,
        "one post, refused"
    );
    assert_eq!(p.a.with_bufs(|bufs| bufs.free()).unwrap(), SLOTS);
    assert_eq!(p.a.qp_error(p.ha).unwrap(), Some(WcStatus::WrFlushErr));
    let why = p.a.qp_refusal(p.ha).unwrap().expect("a refusal");
    assert!(why.contains("out of resources"), "{why}");
    // The peer's write fails on the queue pair in error: its queue pair
    // is in error too, by a completion, with no refusal to tell.
    let c = futures::executor::block_on(other).unwrap();
    assert_eq!(c.status(), WcStatus::RetryExcErr);
    assert_eq!(p.b.qp_error(p.hb).unwrap(), Some(WcStatus::RetryExcErr));
    assert_eq!(p.b.qp_refusal(p.hb).unwrap(), None);
    p.a.detach(p.ha).unwrap();
    assert!(matches!(p.a.qp_refusal(p.ha), Err(Error::NotAttached(_))));
}

#[test]
fn a_dropped_future_gives_its_slot_back_when_the_operation_completes() {
    let p = pair(Wakeup::Busy);
    let source = ExposedBuf::new(&p.pd, vec![3u8; 256], RemoteAccess::READ).unwrap();
    let read =
        p.a.push(
            p.ha,
            ReadFixed::new(p.a.take_buf().unwrap(), 256, source.remote()),
        )
        .unwrap();
    drop(read); // pushed, so posted now: dropping does not cancel
    assert_eq!(p.a.with_bufs(|bufs| bufs.free()).unwrap(), SLOTS - 1);
    assert_eq!(p.a.submit().unwrap(), 0, "nothing left to post");
    let mut polls = 0;
    while p.a.with_bufs(|bufs| bufs.free()).unwrap() < SLOTS {
        p.a.drive().unwrap();
        polls += 1;
        assert!(polls < 10_000, "the read's slot never came back");
    }
    // The tag the dropped future held is reused, and routes correctly.
    let again =
        p.a.push(
            p.ha,
            ReadFixed::new(p.a.take_buf().unwrap(), 256, source.remote()).user_data(8),
        )
        .unwrap();
    let c = futures::executor::block_on(again).unwrap();
    assert_eq!((c.status(), c.user_data()), (WcStatus::Success, 8));
    assert!(p
        .a
        .with_bufs(|bufs| bufs.bytes(c.buf()).iter().all(|&b| b == 3))
        .unwrap());
}

#[test]
fn a_refused_push_hands_the_operation_back() {
    let p = pair(Wakeup::Busy);
    let target = ExposedBuf::new(&p.pd, vec![0u8; 64], RemoteAccess::READ).unwrap();
    let slot = p.a.take_buf().unwrap();
    // The target grants READ only.
    let refused =
        p.a.push(p.ha, WriteFixed::new(slot, 64, target.remote()))
            .unwrap_err();
    assert!(matches!(refused.error(), Error::MissingRemoteRights { .. }));
    p.a.put_buf(refused.into_parts().1.into_buf()).unwrap();
    assert_eq!(p.a.with_bufs(|bufs| bufs.free()).unwrap(), SLOTS);
}

#[test]
fn closing_resolves_pending_futures_and_refuses_what_comes_after() {
    let p = pair(Wakeup::Busy);
    let posted: Vec<_> = (0..4u64)
        .map(|i| {
            p.b.push(p.hb, RecvFixed::new(p.b.take_buf().unwrap()).user_data(i))
                .unwrap()
        })
        .collect();
    p.b.submit().unwrap();
    // A future dropped before it is polled: its receive is posted then.
    let dropped =
        p.b.push(p.hb, RecvFixed::new(p.b.take_buf().unwrap()))
            .unwrap();
    drop(dropped);
    // Pushed after: never posted, it comes back flushed from the close.
    let unposted =
        p.b.push(p.hb, RecvFixed::new(p.b.take_buf().unwrap()).user_data(9))
            .unwrap();
    assert_eq!(
        p.control_b.counters().recv_wrs,
        5,
        "four posted, and the dropped one"
    );
    let other = p.b.clone();
    drop(p.b); // another handle keeps the ring open
    assert!(other.take_buf().is_some());
    other.close();
    for (i, recv) in posted.into_iter().enumerate() {
        let c = futures::executor::block_on(recv).unwrap();
        assert_eq!(
            (c.status(), c.user_data()),
            (WcStatus::WrFlushErr, i as u64)
        );
    }
    let c = futures::executor::block_on(unposted).unwrap();
    assert_eq!((c.status(), c.user_data()), (WcStatus::WrFlushErr, 9));
    let slot = p.a.take_buf().unwrap();
    let refused = other.push(p.hb, SendFixed::new(slot, 1)).unwrap_err();
    assert!(matches!(refused.error(), Error::Closed));
    assert!(other.take_buf().is_none());
    assert!(matches!(other.detach(p.hb), Err(Error::Closed)));
    other.close(); // twice is harmless
}

#[test]
fn many_tasks_share_the_ring() {
    let p = pair(Wakeup::Busy);
    let target = ExposedBuf::new(&p.pd, vec![0u8; 8 * 256], RemoteAccess::WRITE).unwrap();
    let mut pool = LocalPool::new();
    for task in 0..8u64 {
        let ring = p.a.clone();
        let qp = p.ha;
        let remote = target.remote().slice(task * 256..(task + 1) * 256).unwrap();
        pool.spawner()
            .spawn_local(async move {
                for round in 0..50u64 {
                    let mut slot = ring.take_buf().expect("a slot per task");
                    ring.with_bufs(|bufs| bufs.bytes_mut(&mut slot).fill((task + round) as u8))
                        .unwrap();
                    let write = WriteFixed::new(slot, 256, remote).user_data(task << 32 | round);
                    let c = ring.push(qp, write).unwrap().await.unwrap();
                    assert_eq!(
                        (c.status(), c.user_data()),
                        (WcStatus::Success, task << 32 | round)
                    );
                    ring.put_buf(c.into_buf()).unwrap();
                }
            })
            .unwrap();
    }
    pool.run();
    assert_eq!(p.a.with_bufs(|bufs| bufs.free()).unwrap(), SLOTS);
    assert_eq!(p.control.counters().send_wrs, 400);
    drop(p.a);
    let bytes = target.into_inner().unwrap();
    for (task, chunk) in bytes.chunks(256).enumerate() {
        assert!(chunk.iter().all(|&b| b == task as u8 + 49), "task {task}");
    }
}

/// `tasks` tasks each awaiting `each` writes in a row, one at a time;
/// returns the doorbells they rang.
fn tasks_writing(wakeup: Wakeup, coalesce: bool, tasks: u64, each: u64) -> u64 {
    let p = pair(wakeup);
    p.a.coalesce_doorbells(coalesce);
    let target = ExposedBuf::new(&p.pd, vec![0u8; 256], RemoteAccess::WRITE).unwrap();
    let mut pool = LocalPool::new();
    for _ in 0..tasks {
        let (ring, qp, remote) = (p.a.clone(), p.ha, target.remote());
        pool.spawner()
            .spawn_local(async move {
                let mut slot = ring.take_buf().expect("a slot per task");
                for _ in 0..each {
                    let write = WriteFixed::new(slot, 256, remote);
                    let done = ring.push(qp, write).unwrap().await.unwrap();
                    assert!(done.status().is_success());
                    slot = done.into_buf();
                }
                ring.put_buf(slot).unwrap();
            })
            .unwrap();
    }
    pool.run();
    assert_eq!(p.control.counters().send_wrs, tasks * each);
    p.control.counters().send_posts
}

#[test]
fn coalesced_doorbells_are_shared_by_tasks_awaiting_one_write_each() {
    let alone = tasks_writing(Wakeup::Busy, false, 16, 8);
    assert_eq!(alone, 16 * 8, "without coalescing, a doorbell per write");
    let shared = tasks_writing(Wakeup::Busy, true, 16, 8);
    // The sixteen tasks push in one round of the executor: about one
    // doorbell per round of writes.
    assert!(
        shared <= 2 * 8,
        "coalesced: {shared} doorbells for 128 writes in 8 rounds"
    );
}

#[test]
fn coalesced_doorbells_under_the_notifier_thread() {
    // Only the futures' own wake-ups bring their second polls here.
    let shared = tasks_writing(Wakeup::Thread, true, 16, 8);
    assert!(
        shared <= 2 * 8,
        "{shared} doorbells for 128 writes in 8 rounds"
    );
}

/// Polls `future` once, with a waker that does nothing.
fn poll_once(future: &mut FixedOpFuture<SoftQp>) -> bool {
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    std::future::Future::poll(std::pin::Pin::new(future), &mut cx).is_ready()
}

#[test]
fn what_posts_an_operation_left_for_a_shared_doorbell() {
    let p = pair(Wakeup::Reactor);
    p.a.coalesce_doorbells(true);
    let target = ExposedBuf::new(&p.pd, vec![0u8; 256], RemoteAccess::WRITE).unwrap();
    let posts = || p.control.counters().send_posts;
    let write = || {
        let slot = p.a.take_buf().unwrap();
        p.a.push(p.ha, WriteFixed::new(slot, 256, target.remote()))
            .unwrap()
    };
    /// What is done with a future whose first poll left its write waiting.
    type Trigger<'a> = Box<dyn Fn(FixedOpFuture<SoftQp>) + 'a>;
    let mut triggers: Vec<(&str, Trigger)> = vec![
        (
            "a second poll",
            Box::new(|mut f| {
                let _ = poll_once(&mut f);
            }),
        ),
        ("a drop", Box::new(drop)),
        (
            "a drive",
            Box::new(|f| {
                p.a.drive().unwrap();
                drop(f);
            }),
        ),
        (
            "a submit",
            Box::new(|f| {
                p.a.submit().unwrap();
                drop(f);
            }),
        ),
        (
            "coalescing turned off",
            Box::new(|f| {
                p.a.coalesce_doorbells(false);
                p.a.coalesce_doorbells(true);
                drop(f);
            }),
        ),
    ];
    for (what, trigger) in triggers.drain(..) {
        let before = posts();
        let mut f = write();
        assert!(!poll_once(&mut f), "{what}: the first poll yields");
        assert_eq!(posts(), before, "{what}: nothing posted by the first poll");
        trigger(f);
        assert_eq!(posts(), before + 1, "{what} posts it");
    }
    // A receive is never left waiting.
    let recvs = p.control_b.counters().recv_posts;
    p.b.coalesce_doorbells(true);
    let mut recv =
        p.b.push(p.hb, RecvFixed::new(p.b.take_buf().unwrap()))
            .unwrap();
    assert!(!poll_once(&mut recv));
    assert_eq!(
        p.control_b.counters().recv_posts,
        recvs + 1,
        "posted at its first poll"
    );
}

#[test]
fn the_notifier_thread_wakes_a_receive_answered_from_another_thread() {
    let p = pair(Wakeup::Thread);
    let recv =
        p.b.push(p.hb, RecvFixed::new(p.b.take_buf().unwrap()))
            .unwrap();
    p.b.submit().unwrap();
    let (a, ha) = (p.a.clone(), p.ha);
    let (waiting_tx, waiting_rx) = std::sync::mpsc::channel();
    let sender = std::thread::spawn(move || {
        // Sent once the receive waits: only the notifier can wake it.
        waiting_rx.recv().unwrap();
        let mut msg = a.take_buf().unwrap();
        a.with_bufs(|bufs| bufs.bytes_mut(&mut msg)[..3].copy_from_slice(b"hey"))
            .unwrap();
        let sent = futures::executor::block_on(a.push(ha, SendFixed::new(msg, 3).imm(4)).unwrap());
        assert!(sent.unwrap().status().is_success());
    });
    let got = futures::executor::block_on(async {
        let mut recv = std::pin::pin!(recv);
        assert!(futures::poll!(recv.as_mut()).is_pending());
        waiting_tx.send(()).unwrap();
        recv.await
    })
    .unwrap();
    sender.join().unwrap();
    assert_eq!((got.byte_len(), got.imm()), (3, Some(4)));
    assert_eq!(
        p.b.with_bufs(|bufs| bufs.bytes(got.buf())[..3].to_vec())
            .unwrap(),
        b"hey"
    );
}

#[tokio::test]
async fn a_tokio_reactor_drives_the_ring() {
    use tokio::io::unix::AsyncFd;
    use tokio::io::Interest;

    let p = pair(Wakeup::Reactor);
    let mut drivers = Vec::new();
    for ring in [&p.a, &p.b] {
        let driver = ring.driver();
        let channel = driver.completion_fd().unwrap();
        // SAFETY: a `CompletionFd` keeps its descriptor open while it lives.
        let fd = unsafe { AsyncFd::register_with_interest(channel, Interest::READABLE) }.unwrap();
        drivers.push(tokio::spawn(async move {
            while let Ok(mut ready) = fd.readable().await {
                driver.drive().unwrap();
                ready.clear_ready();
            }
        }));
    }
    let recv =
        p.b.push(p.hb, RecvFixed::new(p.b.take_buf().unwrap()))
            .unwrap();
    p.b.submit().unwrap();
    let mut msg = p.a.take_buf().unwrap();
    p.a.with_bufs(|bufs| bufs.bytes_mut(&mut msg)[..2].copy_from_slice(b"ok"))
        .unwrap();
    let send = p.a.push(p.ha, SendFixed::new(msg, 2)).unwrap();
    let (sent, got) =
        tokio::time::timeout(Duration::from_secs(10), async { tokio::join!(send, recv) })
            .await
            .expect("the reactor woke both");
    assert!(sent.unwrap().status().is_success());
    assert_eq!(got.unwrap().byte_len(), 2);
    for driver in drivers {
        driver.abort();
    }
}

#[test]
fn the_adapter_and_its_futures_cross_threads() {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}
    send_sync::<AsyncFixedRing<SoftQp>>();
    send::<FixedOpFuture<SoftQp>>();
}

/// Polls `future` until it resolves, failing after `limit` (a future
/// that never resolves would otherwise hang the test run).
fn resolve_within(
    limit: Duration,
    mut future: FixedOpFuture<SoftQp>,
) -> Result<rdma_ring::fixed::FixedCompletion, Error> {
    let deadline = std::time::Instant::now() + limit;
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    loop {
        if let std::task::Poll::Ready(done) =
            std::future::Future::poll(std::pin::Pin::new(&mut future), &mut cx)
        {
            return done;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the future never resolved"
        );
        std::thread::yield_now();
    }
}

#[test]
fn a_burst_of_more_completions_than_one_poll_takes_wakes_every_task() {
    let dev = SoftDevice::new();
    let pd = dev.alloc_pd();
    let config = QpConfig {
        max_send_wr: 128,
        max_recv_wr: 128,
        ..QpConfig::default()
    };
    let (mut qa, mut qb) = dev.connected_pair(&pd, &pd, config).unwrap();
    let ring = |cq| {
        let bufs = FixedBufs::new(&pd, 128, 64).unwrap();
        AsyncFixedRing::new(
            FixedRing::new(cq, bufs, FixedRingConfig::default()),
            Wakeup::Thread,
        )
        .unwrap()
    };
    let a = ring(qa.take_cq().unwrap());
    let b = ring(qb.take_cq().unwrap());
    let (ha, hb) = (a.attach(qa).unwrap(), b.attach(qb).unwrap());
    const N: usize = 100;
    let recvs: Vec<(FixedOpFuture<SoftQp>, u32)> = (0..N)
        .map(|i| {
            let slot = b.take_buf().unwrap();
            let index = slot.index();
            let recv = b.push(hb, RecvFixed::new(slot).user_data(i as u64));
            (recv.unwrap(), index)
        })
        .collect();
    b.submit().unwrap();
    let slots: Vec<u32> = recvs.iter().map(|(_, slot)| *slot).collect();
    let recvs: Vec<FixedOpFuture<SoftQp>> = recvs.into_iter().map(|(f, _)| f).collect();
    // Every receive awaited by a task of its own: only woken tasks are
    // polled again, and nobody polls the device for them. The tasks run
    // on a thread of their own, which gives up (failing the test) rather
    // than wait for ever.
    let (waiting_tx, waiting_rx) = std::sync::mpsc::channel();
    let receiving = std::thread::spawn(move || {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        let mut pool = LocalPool::new();
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        for (i, recv) in recvs.into_iter().enumerate() {
            let done_tx = done_tx.clone();
            pool.spawner()
                .spawn_local(async move {
                    let c = recv.await.unwrap();
                    done_tx.send((i, c.user_data(), c.buf().index())).unwrap();
                })
                .unwrap();
        }
        // The burst lands while every task waits: the sender goes once
        // each has been polled (and is pending).
        pool.run_until_stalled();
        waiting_tx.send(()).unwrap();
        let mut got = Vec::new();
        while got.len() < N {
            pool.run_until_stalled();
            got.extend(done_rx.try_iter());
            assert!(
                std::time::Instant::now() < deadline,
                "{} of {N} receives were never woken",
                N - got.len()
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        got
    });
    waiting_rx.recv().unwrap();
    let sends: Vec<_> = (0..N)
        .map(|_| {
            a.push(ha, SendFixed::new(a.take_buf().unwrap(), 8))
                .unwrap()
        })
        .collect();
    assert_eq!(a.submit().unwrap(), N, "one burst");
    for c in futures::executor::block_on(futures::future::join_all(sends)) {
        assert!(c.unwrap().status().is_success());
    }
    let got = receiving.join().expect("every receive was woken");
    assert_eq!(got.len(), N);
    for (i, user_data, index) in got {
        // Its own completion: its tag and its own slot.
        assert_eq!((user_data, index), (i as u64, slots[i]));
    }
}

/// A ring whose queue pair shares a four-entry completion queue with a
/// stranger, whose receives can overrun it. Fields drop in order: the
/// stranger before the memory its receives name.
struct SharedCq {
    ring: AsyncFixedRing<SoftQp>,
    qp: FixedQp,
    /// A second queue pair of the ring's.
    other: FixedQp,
    stranger: SoftQp,
    scratch: rdma_ring::buf::RegisteredBuf,
    _dev: SoftDevice,
}

impl SharedCq {
    fn new(progress: rdma_ring::backend::soft::Progress) -> Self {
        let dev = SoftDevice::with_progress(progress);
        let pd = dev.alloc_pd();
        let cq = dev.create_cq(4).unwrap();
        let config = QpConfig::default();
        let scratch = rdma_ring::buf::RegisteredBuf::new(&pd, vec![0u8; 64]).unwrap();
        let mine = dev.create_qp_on(&pd, &cq, None, config).unwrap();
        let other = dev.create_qp_on(&pd, &cq, None, config).unwrap();
        let stranger = dev.create_qp_on(&pd, &cq, None, config).unwrap();
        let bufs = FixedBufs::new(&pd, 8, 64).unwrap();
        let ring = AsyncFixedRing::new(
            FixedRing::new(cq, bufs, FixedRingConfig::default()),
            Wakeup::Busy,
        )
        .unwrap();
        let qp = ring.attach(mine).unwrap();
        let other = ring.attach(other).unwrap();
        SharedCq {
            ring,
            qp,
            other,
            stranger,
            scratch,
            _dev: dev,
        }
    }

    /// Posts `n` receives on the stranger, into the scratch memory.
    fn stranger_receives(&mut self, n: u64) {
        let sge = rdma_ring::backend::Sge {
            addr: self.scratch.as_ptr() as u64,
            len: 64,
            lkey: self.scratch.lkey(),
        };
        let wrs: Vec<_> = (0..n)
            .map(|i| rdma_ring::backend::RecvWr {
                wr_id: 1000 + i,
                sges: rdma_ring::backend::SgeSpan { start: 0, len: 1 },
            })
            .collect();
        // SAFETY: `scratch` is registered and dropped after `stranger`
        // (field order); the tests complete the receives without writing
        // (no-op mode) or flush them (an error), and nobody sends to them.
        unsafe { self.stranger.post_recv(&wrs, &[sge]) }.unwrap();
    }

    fn push_recv(&self, user_data: u64) -> FixedOpFuture<SoftQp> {
        self.push_recv_on(self.qp, user_data)
    }

    fn push_recv_on(&self, qp: FixedQp, user_data: u64) -> FixedOpFuture<SoftQp> {
        let slot = self.ring.take_buf().unwrap();
        self.ring
            .push(qp, RecvFixed::new(slot).user_data(user_data))
            .unwrap()
    }
}

#[test]
fn a_failed_completion_queue_ends_pending_futures() {
    let mut shared = SharedCq::new(rdma_ring::backend::soft::Progress::NoOp);
    let first = shared.push_recv(1);
    shared.ring.submit().unwrap(); // completes at once (no-op mode)
    shared.stranger_receives(4); // the fourth overruns the queue
                                 // Posted after the overrun: flushed into a queue that takes no more.
    let second = shared.push_recv(2);
    shared.ring.submit().unwrap();
    let c = futures::executor::block_on(first).unwrap();
    assert_eq!((c.user_data(), c.status()), (1, WcStatus::Success));
    let second = resolve_within(Duration::from_secs(10), second);
    assert!(matches!(second, Err(Error::RingFailed(_))), "{second:?}");
}

#[test]
fn a_completion_queue_failing_during_a_detach_ends_pending_futures() {
    let mut shared = SharedCq::new(rdma_ring::backend::soft::Progress::Manual);
    let pending = shared.push_recv(0);
    shared.ring.submit().unwrap(); // waits: nobody sends
                                   // On the other queue pair, which the detach leaves alone.
    let unposted = shared.push_recv_on(shared.other, 1);
    // The stranger's receives, flushed, overrun the queue.
    shared.stranger_receives(8);
    shared.stranger.set_error().unwrap();
    let qp = shared.qp;
    assert!(
        shared.ring.detach(qp).is_err(),
        "the drain meets the failed queue"
    );
    let result = resolve_within(Duration::from_secs(10), pending);
    assert!(matches!(result, Err(Error::RingFailed(_))), "{result:?}");
    // What the failure found never posted comes back flushed, slot and all.
    let unposted = resolve_within(Duration::from_secs(10), unposted).unwrap();
    assert_eq!(
        (unposted.user_data(), unposted.status()),
        (1, WcStatus::WrFlushErr)
    );
}

#[test]
fn dropping_an_unposted_future_still_posts_its_operation() {
    let p = pair(Wakeup::Busy);
    let target = ExposedBuf::new(&p.pd, vec![0u8; 256], RemoteAccess::WRITE).unwrap();
    let write =
        p.a.push(
            p.ha,
            WriteFixed::new(p.a.take_buf().unwrap(), 256, target.remote()),
        )
        .unwrap();
    assert_eq!(p.control.counters().send_wrs, 0);
    drop(write);
    assert_eq!(p.control.counters().send_wrs, 1, "posted when dropped");
    while p.a.with_bufs(|bufs| bufs.free()).unwrap() < SLOTS {
        p.a.drive().unwrap();
    }
}

#[test]
fn a_ring_with_work_is_refused() {
    let dev = SoftDevice::new();
    let pd = dev.alloc_pd();
    let (mut qa, _qb) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    let mut ring = FixedRing::new(
        qa.take_cq().unwrap(),
        FixedBufs::new(&pd, 2, 64).unwrap(),
        FixedRingConfig::default(),
    );
    let h = ring.attach(qa).unwrap();
    let slot = ring.take_buf().unwrap();
    ring.push(h, RecvFixed::new(slot)).unwrap();
    let (error, mut ring) = AsyncFixedRing::new(ring, Wakeup::Busy)
        .unwrap_err()
        .into_parts();
    assert!(matches!(error, Error::RingNotIdle), "{error}");
    // The ring comes back whole: its work is still there.
    assert_eq!(ring.submit().unwrap(), 1);
    ring.close().unwrap();
}

#[test]
fn push_all_pushes_in_order_under_one_lock_and_stops_at_a_refusal_losing_nothing() {
    let p = pair(Wakeup::Busy);
    let target = ExposedBuf::new(&p.pd, vec![0u8; 5 * 256], RemoteAccess::WRITE).unwrap();
    let write = |i: u64, len: u32| {
        let slot = p.a.take_buf().unwrap();
        let remote = target.remote().slice(i * 256..(i + 1) * 256).unwrap();
        WriteFixed::new(slot, len, remote).user_data(i)
    };
    // The third is longer than its slot (256 bytes).
    let mut ops = vec![
        write(0, 8),
        write(1, 8),
        write(2, 257),
        write(3, 8),
        write(4, 8),
    ];
    let mut futures = Vec::new();
    let (error, refused) =
        p.a.push_all(p.ha, &mut ops, &mut futures)
            .unwrap_err()
            .into_parts();
    assert!(matches!(error, Error::OutOfBounds { .. }), "{error}");
    assert_eq!(futures.len(), 2, "the two before it pushed");
    assert_eq!(ops.len(), 2, "the two after it left in place");
    p.a.put_buf(refused.into_buf()).unwrap();
    assert_eq!(p.a.push_all(p.ha, &mut ops, &mut futures).unwrap(), 2);
    assert!(ops.is_empty());
    let tags: Vec<u64> = futures::executor::block_on(async {
        let mut tags = Vec::new();
        for f in futures.drain(..) {
            let done = f.await.unwrap();
            assert!(done.status().is_success());
            tags.push(done.user_data());
            p.a.put_buf(done.into_buf()).unwrap();
        }
        tags
    });
    assert_eq!(tags, [0, 1, 3, 4], "each future its own operation's");
    assert_eq!(
        p.control.counters().send_posts,
        1,
        "one doorbell for the four"
    );
    assert_eq!(p.a.with_bufs(|bufs| bufs.free()).unwrap(), SLOTS);
    // A handle of another ring: the first is refused, the rest stay.
    let mut ops = vec![write(0, 8), write(1, 8)];
    let (error, first) =
        p.a.push_all(p.hb, &mut ops, &mut futures)
            .unwrap_err()
            .into_parts();
    assert!(matches!(error, Error::NotAttached(_)), "{error}");
    assert_eq!((futures.len(), ops.len()), (0, 1));
    p.a.put_buf(first.into_buf()).unwrap();
    p.a.put_buf(ops.pop().unwrap().into_buf()).unwrap();
    assert_eq!(p.a.with_bufs(|bufs| bufs.free()).unwrap(), SLOTS);
    // Closed: the first is refused, the rest stay.
    let mut ops = vec![write(0, 8), write(1, 8)];
    p.a.close();
    let (error, first) =
        p.a.push_all(p.ha, &mut ops, &mut futures)
            .unwrap_err()
            .into_parts();
    assert!(matches!(error, Error::Closed), "{error}");
    assert_eq!((futures.len(), ops.len()), (0, 1));
    drop((first, ops));
    // Nothing to push: nothing refused, closed or not.
    let mut none: Vec<WriteFixed> = Vec::new();
    assert_eq!(p.a.push_all(p.ha, &mut none, &mut futures).unwrap(), 0);
}

#[test]
fn forty_receives_flushed_at_once_are_all_handed_out_by_one_drive() {
    // Byte 3 decodes to a receive pushed: forty of them, more than one
    // poll of the ring takes.
    interleavings::run(&[3; 40]);
}

#[test]
fn arrivals_in_a_refilled_shared_queue_are_awaited_in_any_order() {
    // 0x0f: the peer sends; 0x0a: the device runs; 0x0b: an await of the
    // next arrival is polled; 0x0c: a drive; 0x8e: the close.
    let sends = [0x0f, 0x0f, 0x0f, 0x0a, 0x0b, 0x0b, 0x0b, 0x0b];
    let summary = interleavings::run(&sends);
    assert_eq!((summary.sent, summary.arrived), (3, 3));
    // The await left waiting is woken by a drive that reaps the arrival.
    let summary = interleavings::run(&[0x0b, 0x0f, 0x0a, 0x0c, 0x0b]);
    assert_eq!((summary.sent, summary.arrived), (1, 1));
    // Closed with one arrival untaken: it comes out, then the error.
    let summary = interleavings::run(&[0x0f, 0x0a, 0x0b, 0x0f, 0x0a, 0x8e]);
    assert_eq!((summary.sent, summary.arrived), (2, 2));
}

#[test]
fn random_interleavings_reach_the_shared_queue() {
    use proptest::strategy::{Strategy, ValueTree};
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let strategy = proptest::collection::vec(proptest::prelude::any::<u8>(), 100..300);
    let mut total = interleavings::Summary::default();
    for _ in 0..64 {
        let bytes = strategy.new_tree(&mut runner).unwrap().current();
        let summary = interleavings::run(&bytes);
        total.sent += summary.sent;
        total.arrived += summary.arrived;
    }
    println!("{total:?}");
    assert!(total.sent > 100 && total.arrived > 20);
    assert!(total.arrived < total.sent, "some sends found no receive");
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig {
        cases: 256,
        ..proptest::prelude::ProptestConfig::default()
    })]
    #[test]
    fn awaited_operations_in_any_order_lose_nothing(
        bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200)
    ) {
        interleavings::run(&bytes);
    }
}

#[test]
fn a_device_fatal_event_ends_pending_futures_and_hands_back_unposted_work() {
    use rdma_ring::backend::{AsyncEvent, AsyncEventSource};
    let p = pair(Wakeup::Busy);
    p._dev
        .set_progress(rdma_ring::backend::soft::Progress::Manual);
    let events = p._dev.async_events().unwrap();
    let target = ExposedBuf::new(&p.pd, vec![0u8; 64], RemoteAccess::WRITE).unwrap();
    let write = |user_data| {
        let slot = p.a.take_buf().unwrap();
        p.a.push(
            p.ha,
            WriteFixed::new(slot, 64, target.remote()).user_data(user_data),
        )
        .unwrap()
    };
    let posted = write(1);
    p.a.submit().unwrap(); // in flight: the device waits to be stepped
    let unposted = write(2);
    p._dev.inject_device_fatal();
    let fatal = std::iter::from_fn(|| events.next_event().unwrap())
        .find(|e| *e == AsyncEvent::DeviceFatal)
        .expect("the device raised it");
    assert!(p.a.apply_event(fatal));
    let posted = resolve_within(Duration::from_secs(10), posted);
    assert!(matches!(posted, Err(Error::RingFailed(_))), "{posted:?}");
    let unposted = resolve_within(Duration::from_secs(10), unposted).unwrap();
    assert_eq!(
        (unposted.user_data(), unposted.status()),
        (2, WcStatus::WrFlushErr)
    );
    let slot = p.a.take_buf().unwrap();
    let refused = p.a.push(p.ha, WriteFixed::new(slot, 64, target.remote()));
    let (error, _) = refused.unwrap_err().into_parts();
    assert!(matches!(error, Error::RingFailed(_)), "{error:?}");
    assert!(!p.b.apply_event(AsyncEvent::PortError { port: 1 }));
}

#[test]
fn a_queue_pair_failed_by_an_event_wakes_its_waiting_futures() {
    use rdma_ring::backend::AsyncEvent;
    let dev = SoftDevice::new();
    dev.set_progress(rdma_ring::backend::soft::Progress::Manual);
    let pd = dev.alloc_pd();
    let (mut qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    let qp_num = qp.qpn();
    let bufs = FixedBufs::new(&pd, 4, 64).unwrap();
    let ring = FixedRing::new(qp.take_cq().unwrap(), bufs, FixedRingConfig::default());
    let ring = AsyncFixedRing::new(ring, Wakeup::Thread).unwrap();
    let conn = ring.attach(qp).unwrap();
    let target = ExposedBuf::new(&pd, vec![0u8; 64], RemoteAccess::WRITE).unwrap();
    let slot = ring.take_buf().unwrap();
    let write = ring
        .push(
            conn,
            WriteFixed::new(slot, 64, target.remote()).user_data(7),
        )
        .unwrap();
    ring.submit().unwrap(); // in flight: the device waits to be stepped

    // Awaited on a thread of its own, which says when the future has been
    // polled and left pending (its waker registered): only a wake-up
    // resolves it then.
    let (pending_tx, pending_rx) = std::sync::mpsc::channel();
    let (tx, rx) = std::sync::mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let mut write = write;
        let done = futures::executor::block_on(std::future::poll_fn(|cx| {
            let poll = std::future::Future::poll(std::pin::Pin::new(&mut write), cx);
            if poll.is_pending() {
                let _ = pending_tx.send(());
            }
            poll
        }));
        let _ = tx.send(done);
    });
    pending_rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the future was polled");
    assert!(rx.try_recv().is_err(), "nothing ran it");
    // As a device that reports the queue pair's failure before flushing it
    // would: the ring moves it to error, so the device flushes its work.
    assert!(ring.apply_event(AsyncEvent::QpAccessError { qp_num }));
    let done = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the waiting future was woken")
        .unwrap();
    waiter.join().unwrap();
    assert_eq!((done.user_data(), done.status()), (7, WcStatus::WrFlushErr));
    ring.put_buf(done.into_buf()).unwrap();
    let slot = ring.take_buf().unwrap();
    let (error, _) = ring
        .push(conn, WriteFixed::new(slot, 64, target.remote()))
        .unwrap_err()
        .into_parts();
    assert!(
        matches!(error, Error::QpInError(WcStatus::FatalErr)),
        "{error:?}"
    );
}

/// A waker that panics when woken.
#[derive(Default)]
struct PanickingWaker(std::sync::atomic::AtomicBool);

impl std::task::Wake for PanickingWaker {
    fn wake(self: std::sync::Arc<Self>) {
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
    fn wake(self: std::sync::Arc<Self>) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// A waker that panics does not keep the others collected with it from
/// being woken, nor reaches the caller (the panic hook reports it), and
/// every operation still completes.
#[test]
fn a_panicking_waker_does_not_keep_the_others_asleep() {
    use std::future::Future;
    use std::sync::{atomic::Ordering, Arc};
    use std::task::{Context, Poll, Waker};
    let dev = SoftDevice::with_progress(rdma_ring::backend::soft::Progress::Manual);
    let pd = dev.alloc_pd();
    let (mut qa, _qb) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    let bufs = FixedBufs::new(&pd, SLOTS, 256).unwrap();
    let cq = qa.take_cq().unwrap();
    let ring = FixedRing::new(cq, bufs, FixedRingConfig::default());
    let a = AsyncFixedRing::new(ring, Wakeup::Reactor).unwrap();
    let ha = a.attach(qa).unwrap();
    let target = ExposedBuf::new(&pd, vec![0u8; 512], RemoteAccess::WRITE).unwrap();
    let write = |i: u64| {
        let remote = target.remote().slice(i * 256..(i + 1) * 256).unwrap();
        a.push(
            ha,
            WriteFixed::new(a.take_buf().unwrap(), 256, remote).signaled(),
        )
        .unwrap()
    };
    let (mut first, mut second) = (write(0), write(1));
    let panics = Arc::new(PanickingWaker::default());
    let panicking = Waker::from(Arc::clone(&panics));
    let counting = Arc::new(CountingWaker::default());
    let counted = Waker::from(Arc::clone(&counting));
    use std::pin::Pin;
    assert!(Pin::new(&mut first)
        .poll(&mut Context::from_waker(&panicking))
        .is_pending());
    assert!(Pin::new(&mut second)
        .poll(&mut Context::from_waker(&counted))
        .is_pending());
    dev.progress();
    let driven = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| a.drive()));
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
        match Pin::new(op).poll(noop) {
            Poll::Ready(done) => assert!(done.unwrap().status().is_success()),
            Poll::Pending => panic!("a completed operation is still pending"),
        }
    }
}

/// An rdma_cm peer that left raises no completion event: the notifier
/// thread's quiet tick asks the queue pairs, fails the one whose peer
/// left, and its pending receive resolves flushed; a reactor's timer does
/// the same with `tick`.
#[test]
fn a_peer_that_left_is_found_by_the_quiet_tick() {
    use peer_watch::{PeerAnswer, Watched};
    for wakeup in [Wakeup::Thread, Wakeup::Reactor] {
        let dev = SoftDevice::new();
        let pd = dev.alloc_pd();
        let (qp, peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
        let mut qp = Watched {
            qp,
            answer: PeerAnswer::Left,
        };
        let cq = qp.take_cq().unwrap();
        let bufs = FixedBufs::new(&pd, 4, 64).unwrap();
        let ring =
            AsyncFixedRing::new(FixedRing::new(cq, bufs, FixedRingConfig::default()), wakeup)
                .unwrap();
        let conn = ring.attach(qp).unwrap();
        let slot = ring.take_buf().unwrap();
        let recv = ring.push(conn, RecvFixed::new(slot)).unwrap();
        ring.submit().unwrap();
        if wakeup == Wakeup::Reactor {
            assert_eq!(ring.tick(), 1);
        }
        let waited = std::thread::spawn(move || futures::executor::block_on(recv));
        let done = waited.join().unwrap().unwrap();
        assert_eq!(done.status(), WcStatus::WrFlushErr);
        assert_eq!(ring.qp_error(conn).unwrap(), Some(WcStatus::RetryExcErr));
        ring.put_buf(done.into_buf()).unwrap();
        drop(peer);
    }
}

/// The notifier thread ticks on a busy ring too: another queue pair's
/// completions keep coming, and the queue pair whose peer left is still
/// found and failed.
#[test]
fn a_peer_that_left_is_found_on_a_busy_ring() {
    use peer_watch::{PeerAnswer, Watched};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let dev = SoftDevice::new();
    let pd = dev.alloc_pd();
    let cq = dev.create_cq(64).unwrap();
    let mut peers = Vec::new();
    let mut connected = |answer| {
        let qp = dev
            .create_qp_on(&pd, &cq, None, QpConfig::default())
            .unwrap();
        let peer = dev.create_qp(&pd, QpConfig::default()).unwrap();
        dev.connect(&qp, &peer).unwrap();
        peers.push(peer);
        Watched { qp, answer }
    };
    let (gone, busy) = (connected(PeerAnswer::Left), connected(PeerAnswer::Stayed));
    let bufs = FixedBufs::new(&pd, 8, 64).unwrap();
    let ring = AsyncFixedRing::new(
        FixedRing::new(cq, bufs, FixedRingConfig::default()),
        Wakeup::Thread,
    )
    .unwrap();
    let (gone, busy) = (ring.attach(gone).unwrap(), ring.attach(busy).unwrap());
    let target = ExposedBuf::new(&pd, vec![0u8; 64], RemoteAccess::WRITE).unwrap();
    let remote = target.remote();
    let stop = Arc::new(AtomicBool::new(false));
    // Writes on the other queue pair, one every millisecond or so.
    let writer = {
        let (ring, stop) = (ring.clone(), stop.clone());
        std::thread::spawn(move || {
            let give_up = std::time::Instant::now() + Duration::from_secs(10);
            while !stop.load(Ordering::Acquire) && std::time::Instant::now() < give_up {
                let slot = ring.take_buf().unwrap();
                let write = ring.push(busy, WriteFixed::new(slot, 8, remote)).unwrap();
                ring.submit().unwrap();
                let done = futures::executor::block_on(write).unwrap();
                ring.put_buf(done.into_buf()).unwrap();
                std::thread::sleep(Duration::from_millis(1));
            }
        })
    };
    let slot = ring.take_buf().unwrap();
    let recv = ring.push(gone, RecvFixed::new(slot)).unwrap();
    ring.submit().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(futures::executor::block_on(recv));
    });
    let done = rx.recv_timeout(Duration::from_secs(5));
    stop.store(true, Ordering::Release);
    writer.join().unwrap();
    let done = done
        .expect("the receive of the queue pair whose peer left")
        .unwrap();
    assert_eq!(done.status(), WcStatus::WrFlushErr);
    assert_eq!(ring.qp_error(gone).unwrap(), Some(WcStatus::RetryExcErr));
    ring.put_buf(done.into_buf()).unwrap();
}

/// A failed arm of the completion channel neither keeps the drive that met
/// it from handing out the completions waiting, nor leaves the ring
/// unarmed for good: the next tick drives, and arms again.
#[test]
fn a_failed_arm_strands_no_completion() {
    use rdma_ring::backend::soft::Progress;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    struct Woken(AtomicBool);
    impl futures::task::ArcWake for Woken {
        fn wake_by_ref(arc_self: &Arc<Self>) {
            arc_self.0.store(true, Ordering::SeqCst);
        }
    }
    let dev = SoftDevice::with_progress(Progress::Manual);
    let pd = dev.alloc_pd();
    let (mut qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    let bufs = FixedBufs::new(&pd, 4, 64).unwrap();
    let cq = qp.take_cq().unwrap();
    let ring = AsyncFixedRing::new(
        FixedRing::new(cq, bufs, FixedRingConfig::default()),
        Wakeup::Reactor,
    )
    .unwrap();
    let conn = ring.attach(qp).unwrap();
    let target = ExposedBuf::new(&pd, vec![0u8; 64], RemoteAccess::WRITE).unwrap();
    let woken = Arc::new(Woken(AtomicBool::new(false)));
    let waker = futures::task::waker(Arc::clone(&woken));
    let mut cx = std::task::Context::from_waker(&waker);
    let mut write = || {
        let slot = ring.take_buf().unwrap();
        let mut write = ring
            .push(conn, WriteFixed::new(slot, 64, target.remote()))
            .unwrap();
        let polled = std::future::Future::poll(std::pin::Pin::new(&mut write), &mut cx);
        assert!(polled.is_pending(), "nothing ran yet");
        write
    };

    // The drive for the first write's event fails to arm, and hands out
    // the completion all the same.
    let first = write();
    dev.fail_arms(1);
    dev.progress();
    assert!(ring.drive().is_err(), "the arm's failure is reported");
    assert!(woken.0.swap(false, Ordering::SeqCst), "the write was woken");
    assert!(futures::executor::block_on(first)
        .unwrap()
        .status()
        .is_success());

    // The second raises no event: a tick drives, and arms again.
    let second = write();
    dev.progress();
    ring.tick();
    assert!(woken.0.swap(false, Ordering::SeqCst), "the tick drove");
    assert!(futures::executor::block_on(second)
        .unwrap()
        .status()
        .is_success());
    let third = write();
    dev.progress();
    assert_eq!(ring.drive().unwrap(), 1, "armed again: a clean drive");
    assert!(futures::executor::block_on(third)
        .unwrap()
        .status()
        .is_success());
}
