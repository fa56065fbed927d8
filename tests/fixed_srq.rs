//! The fixed ring's shared receive queues on the soft device: many peers'
//! messages landing in one queue's receives, each naming the queue pair
//! it arrived on; refusals; detach, removal and close handing every
//! receive back; a failed receive failing its queue pair alone; events.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use rdma_ring::backend::soft::{SoftDevice, SoftPd, SoftQp};
use rdma_ring::backend::{AsyncEvent, AsyncEventSource, QpConfig, SharedReceiveQueue};
use rdma_ring::backend::{SrqConfig, WcStatus};
use rdma_ring::fixed::{
    FixedBufs, FixedCompletion, FixedQp, FixedRing, FixedRingConfig, FixedSrq, FixedSrqRefill,
    RecvFixed, SendFixed,
};
use rdma_ring::future::{AsyncFixedRing, Wakeup};
use rdma_ring::Error;

/// A server ring whose queue pairs take receives from one shared queue.
struct Server {
    dev: SoftDevice,
    pd: SoftPd,
    ring: FixedRing<SoftQp>,
    srq: FixedSrq,
}

/// A peer of the server: a ring of its own over one queue pair.
struct Client {
    ring: FixedRing<SoftQp>,
    qp: FixedQp,
}

fn config(wait: Duration) -> FixedRingConfig {
    FixedRingConfig {
        wait_timeout: wait,
        ..FixedRingConfig::default()
    }
}

fn server(slot_len: u32, srq_depth: u32) -> Server {
    let dev = SoftDevice::new();
    let pd = dev.alloc_pd();
    let mut ring = FixedRing::new(
        dev.create_cq(256).unwrap(),
        FixedBufs::new(&pd, 32, slot_len).unwrap(),
        config(Duration::from_secs(10)),
    );
    let srq = ring
        .add_srq(
            dev.create_srq(
                &pd,
                SrqConfig {
                    max_wr: srq_depth,
                    ..SrqConfig::default()
                },
            )
            .unwrap(),
        )
        .unwrap_or_else(|r| panic!("add_srq: {}", r.error()));
    Server { dev, pd, ring, srq }
}

impl Server {
    /// A queue pair on the shared queue, attached, connected to a new
    /// client (64-byte slots).
    fn connect(&mut self) -> (FixedQp, Client) {
        let qp = self
            .dev
            .create_qp_on(
                &self.pd,
                self.ring.cq(),
                self.ring.srq(self.srq),
                QpConfig::default(),
            )
            .unwrap();
        let mut peer = self.dev.create_qp(&self.pd, QpConfig::default()).unwrap();
        self.dev.connect(&qp, &peer).unwrap();
        let handle = self
            .ring
            .attach(qp)
            .unwrap_or_else(|r| panic!("attach: {}", r.error()));
        let cq = rdma_ring::backend::QueuePair::take_cq(&mut peer).unwrap();
        let mut ring = FixedRing::new(
            cq,
            FixedBufs::new(&self.pd, 8, 64).unwrap(),
            config(Duration::from_secs(10)),
        );
        let qp = ring.attach(peer).unwrap_or_else(|_| panic!("attach"));
        (handle, Client { ring, qp })
    }

    fn post_receives(&mut self, n: usize, user_data: u64) {
        for i in 0..n {
            let slot = self.ring.take_buf().unwrap();
            self.ring
                .push_srq(
                    self.srq,
                    RecvFixed::new(slot).user_data(user_data + i as u64),
                )
                .unwrap();
        }
        self.ring.submit().unwrap();
    }

    fn give_back(&mut self, done: Vec<FixedCompletion>) {
        for c in done {
            self.ring.put_buf(c.into_buf()).unwrap();
        }
    }
}

/// Pushes a receive of a free slot to `srq`, expecting a refusal; puts
/// the slot back and returns the error.
fn refused_srq(ring: &mut FixedRing<SoftQp>, srq: FixedSrq) -> Error {
    let slot = ring.take_buf().unwrap();
    let (e, op) = ring
        .push_srq(srq, RecvFixed::new(slot))
        .unwrap_err()
        .into_parts();
    ring.put_buf(op.into_buf()).unwrap();
    e
}

impl Client {
    /// Sends `len` bytes of `byte` and waits for the send to complete.
    fn send(&mut self, byte: u8, len: u32) -> WcStatus {
        let mut slot = self.ring.take_buf().unwrap();
        self.ring.bufs().bytes_mut(&mut slot).fill(byte);
        self.ring
            .push(self.qp, SendFixed::new(slot, len))
            .unwrap_or_else(|r| panic!("push: {}", r.error()));
        self.ring.submit().unwrap();
        let done = self.ring.wait(1).unwrap().pop().unwrap();
        let status = done.status();
        self.ring.put_buf(done.into_buf()).unwrap();
        status
    }
}

/// A queue pair connected before it is attached takes receives at once;
/// announced, what it takes meanwhile comes back (naming no queue pair
/// yet), nothing is lost and no slot stays posted, and once attached its
/// messages name it.
#[test]
fn receives_taken_before_an_announced_queue_pair_is_attached_come_back() {
    let mut s = server(64, 8);
    s.post_receives(2, 100);
    let qp = s
        .dev
        .create_qp_on(&s.pd, s.ring.cq(), s.ring.srq(s.srq), QpConfig::default())
        .unwrap();
    s.ring.expect_on_srq(s.srq, qp.qpn()).unwrap();
    let mut peer = s.dev.create_qp(&s.pd, QpConfig::default()).unwrap();
    s.dev.connect(&qp, &peer).unwrap();
    let cq = rdma_ring::backend::QueuePair::take_cq(&mut peer).unwrap();
    let mut ring = FixedRing::new(
        cq,
        FixedBufs::new(&s.pd, 8, 64).unwrap(),
        config(Duration::from_secs(10)),
    );
    let client_qp = ring.attach(peer).unwrap_or_else(|_| panic!("attach"));
    let mut client = Client {
        ring,
        qp: client_qp,
    };
    assert_eq!(client.send(7, 12), WcStatus::Success);
    let early = s.ring.wait(1).unwrap().pop().unwrap();
    assert_eq!(early.status(), WcStatus::Success);
    assert_eq!((early.user_data(), early.byte_len()), (100, 12));
    assert_eq!(s.ring.bufs().bytes(early.buf())[0], 7);
    let handle = s
        .ring
        .attach(qp)
        .unwrap_or_else(|r| panic!("attach: {}", r.error()));
    assert_ne!(early.qp(), handle, "taken before it was attached");
    assert_eq!(client.send(8, 3), WcStatus::Success);
    let late = s.ring.wait(1).unwrap().pop().unwrap();
    assert_eq!((late.user_data(), late.qp()), (101, handle));
    assert_eq!(
        s.ring.srq_posted(s.srq).unwrap(),
        0,
        "no receive stays posted"
    );
    s.give_back(vec![early, late]);
}

#[test]
fn many_peers_land_in_one_queue_and_each_message_names_its_queue_pair() {
    let mut s = server(64, 8);
    let peers: Vec<(FixedQp, Client)> = (0..3).map(|_| s.connect()).collect();
    let mut peers = peers;
    for round in 0..3u8 {
        s.post_receives(6, 100);
        assert_eq!(s.ring.srq_posted(s.srq).unwrap(), 6);
        for (i, (_, client)) in peers.iter_mut().enumerate() {
            for k in 0..2u8 {
                let byte = round * 64 + i as u8 * 8 + k;
                assert_eq!(client.send(byte, 10 + u32::from(k)), WcStatus::Success);
            }
        }
        let done = s.ring.wait(6).unwrap();
        assert_eq!(done.len(), 6);
        assert_eq!(s.ring.srq_posted(s.srq).unwrap(), 0);
        for c in &done {
            assert_eq!(c.status(), WcStatus::Success);
            let bytes = s.ring.bufs().bytes(c.buf());
            let byte = bytes[0];
            let (sender, k) = (((byte - round * 64) / 8) as usize, (byte % 8) as u32);
            assert_eq!(
                c.qp(),
                peers[sender].0,
                "the completion names the queue pair the message came on"
            );
            assert_eq!(c.byte_len(), 10 + k);
            assert!(bytes[..c.byte_len() as usize].iter().all(|&b| b == byte));
        }
        let mut tags: Vec<u64> = done.iter().map(|c| c.user_data()).collect();
        tags.sort_unstable();
        assert_eq!(tags, [100, 101, 102, 103, 104, 105]);
        s.give_back(done);
    }
    assert_eq!(s.ring.unknown_completions(), 0);
}

#[test]
fn what_the_shared_queue_cannot_take_is_refused_and_handed_back() {
    let mut s = server(64, 2);
    let (conn, _client) = s.connect();

    // A receive pushed to a queue pair on the shared queue.
    let slot = s.ring.take_buf().unwrap();
    let (e, op) = s
        .ring
        .push(conn, RecvFixed::new(slot))
        .unwrap_err()
        .into_parts();
    assert!(
        matches!(e, Error::Incompatible(why) if why.contains("push_srq")),
        "{e}"
    );
    s.ring.put_buf(op.into_buf()).unwrap();

    // A full shared queue.
    s.post_receives(2, 0);
    let e = refused_srq(&mut s.ring, s.srq);
    assert!(
        matches!(
            e,
            Error::RecvQueueFull {
                outstanding: 2,
                depth: 2
            }
        ),
        "{e}"
    );

    // Another table's token.
    let mut other = FixedBufs::new(&s.pd, 1, 64).unwrap();
    let foreign = other.take().unwrap();
    let (e, op) = s
        .ring
        .push_srq(s.srq, RecvFixed::new(foreign))
        .unwrap_err()
        .into_parts();
    assert!(matches!(e, Error::ForeignFixedBuf), "{e}");
    other.put(op.into_buf()).unwrap();

    // A queue of another domain, one held already, and a queue pair on a
    // queue the ring does not hold.
    let other_pd = s.dev.alloc_pd();
    let foreign = s.dev.create_srq(&other_pd, SrqConfig::default()).unwrap();
    let id = foreign.caps().id;
    let (e, back) = s.ring.add_srq(foreign).unwrap_err().into_parts();
    assert!(matches!(e, Error::Incompatible(_)), "{e}");
    assert_eq!(back.caps().id, id, "the same queue handed back");
    let unheld = s.dev.create_srq(&s.pd, SrqConfig::default()).unwrap();
    let on_unheld = s
        .dev
        .create_qp_on(&s.pd, s.ring.cq(), Some(&unheld), QpConfig::default())
        .unwrap();
    let (e, _) = s.ring.attach(on_unheld).unwrap_err().into_parts();
    assert!(
        matches!(e, Error::Incompatible(why) if why.contains("does not hold")),
        "{e}"
    );

    // A handle of another ring names nothing here.
    let mut elsewhere = server(64, 2);
    let e = refused_srq(&mut s.ring, elsewhere.srq);
    assert!(matches!(e, Error::NotAttached(_)), "{e}");
    assert!(s.ring.srq_posted(elsewhere.srq).is_err());
    assert!(s.ring.srq(elsewhere.srq).is_none());
    elsewhere.post_receives(1, 0);
}

#[test]
fn a_full_completion_queue_refuses_shared_receives() {
    let dev = SoftDevice::new();
    let pd = dev.alloc_pd();
    let mut ring: FixedRing<SoftQp> = FixedRing::new(
        dev.create_cq(4).unwrap(),
        FixedBufs::new(&pd, 8, 64).unwrap(),
        FixedRingConfig::default(),
    );
    let srq = ring
        .add_srq(dev.create_srq(&pd, SrqConfig::default()).unwrap())
        .unwrap();
    for _ in 0..4 {
        let slot = ring.take_buf().unwrap();
        ring.push_srq(srq, RecvFixed::new(slot)).unwrap();
    }
    let e = refused_srq(&mut ring, srq);
    assert!(matches!(e, Error::CompletionQueueFull { .. }), "{e}");
}

#[test]
fn a_detached_queue_pair_takes_no_more_of_the_queues_receives() {
    let mut s = server(64, 8);
    let (gone, mut leaving) = s.connect();
    let (stays, mut staying) = s.connect();
    s.post_receives(2, 0);
    let qp = s.ring.detach(gone).unwrap();
    // Detached while idle, it was still moved to error: the peer's message
    // fails, and the shared queue keeps both receives.
    assert_ne!(leaving.send(1, 8), WcStatus::Success);
    assert_eq!(s.ring.srq_posted(s.srq).unwrap(), 2);
    assert!(matches!(s.ring.qp_error(gone), Err(Error::NotAttached(_))));
    // The queue pair that stays takes one.
    assert_eq!(staying.send(2, 8), WcStatus::Success);
    let done = s.ring.wait(1).unwrap();
    assert_eq!((done[0].qp(), done[0].byte_len()), (stays, 8));
    s.give_back(done);

    // Removal waits for the queue pairs: attached, then alive.
    assert!(matches!(
        s.ring.remove_srq(s.srq),
        Err(Error::Incompatible(_))
    ));
    drop(s.ring.detach(stays).unwrap());
    assert!(
        s.ring.remove_srq(s.srq).is_err(),
        "a queue pair created on the queue still exists"
    );
    assert_eq!(s.ring.srq_posted(s.srq).unwrap(), 1, "the refusal kept it");
    drop(qp);
    let srq = s.ring.remove_srq(s.srq).unwrap();
    let back = s.ring.wait(1).unwrap();
    assert_eq!(
        (back[0].user_data(), back[0].status()),
        (1, WcStatus::WrFlushErr)
    );
    assert!(
        s.ring.qp_error(back[0].qp()).is_err(),
        "no queue pair took it"
    );
    s.give_back(back);
    assert_eq!(s.ring.bufs().free(), 32, "every slot came back");
    assert!(matches!(
        s.ring.srq_posted(s.srq),
        Err(Error::NotAttached(_))
    ));
    drop(srq);
}

#[test]
fn a_failed_receive_fails_its_queue_pair_alone() {
    // 16-byte receives: a 64-byte message does not fit.
    let mut s = server(16, 8);
    let (bad, mut big) = s.connect();
    let (good, mut small) = s.connect();
    s.post_receives(2, 0);
    assert_ne!(big.send(7, 64), WcStatus::Success);
    let done = s.ring.wait(1).unwrap();
    assert_eq!(
        (done[0].qp(), done[0].status(), done[0].byte_len()),
        (bad, WcStatus::LocLenErr, 0)
    );
    assert_eq!(s.ring.qp_error(bad).unwrap(), Some(WcStatus::LocLenErr));
    s.give_back(done);
    assert_eq!(small.send(3, 16), WcStatus::Success);
    let done = s.ring.wait(1).unwrap();
    assert_eq!((done[0].qp(), done[0].status()), (good, WcStatus::Success));
    assert_eq!(s.ring.qp_error(good).unwrap(), None);
    s.give_back(done);
}

#[test]
fn waiting_counts_the_shared_queues_receives_as_possible() {
    let dev = SoftDevice::new();
    let pd = dev.alloc_pd();
    let mut ring: FixedRing<SoftQp> = FixedRing::new(
        dev.create_cq(64).unwrap(),
        FixedBufs::new(&pd, 4, 64).unwrap(),
        config(Duration::from_millis(50)),
    );
    let srq = ring
        .add_srq(dev.create_srq(&pd, SrqConfig::default()).unwrap())
        .unwrap();
    assert!(matches!(ring.wait(1), Err(Error::WaitUnsatisfiable { .. })));
    let slot = ring.take_buf().unwrap();
    ring.push_srq(srq, RecvFixed::new(slot)).unwrap();
    ring.submit().unwrap();
    // A posted receive may still complete: the wait runs to its timeout.
    assert!(matches!(ring.wait(1), Err(Error::Timeout(_))));
    assert!(matches!(
        ring.wait(2),
        Err(Error::WaitUnsatisfiable {
            wanted: 2,
            possible: 1
        })
    ));
}

#[test]
fn closing_with_shared_receives_posted_and_pushed_lets_go_of_everything() {
    let mut s = server(64, 8);
    let (_conn, _client) = s.connect();
    s.post_receives(3, 0);
    // Pushed and never posted, too.
    let slot = s.ring.take_buf().unwrap();
    s.ring.push_srq(s.srq, RecvFixed::new(slot)).unwrap();
    s.ring.close().expect("everything comes back");
}

#[test]
fn awaited_shared_receives_name_their_queue_pair_and_come_back_at_close() {
    let mut s = server(64, 8);
    let (conn, mut client) = s.connect();
    let ring = AsyncFixedRing::new(s.ring, Wakeup::Busy).unwrap();
    let srq = s.srq;
    let recvs: Vec<_> = (0..3)
        .map(|i| {
            let slot = ring.take_buf().unwrap();
            ring.push_srq(srq, RecvFixed::new(slot).user_data(i))
                .unwrap()
        })
        .collect();
    ring.submit().unwrap();
    assert_eq!(ring.srq_posted(srq).unwrap(), 3);
    assert_eq!(client.send(9, 12), WcStatus::Success);
    let mut recvs = recvs.into_iter();
    let first = futures::executor::block_on(recvs.next().unwrap()).unwrap();
    assert_eq!(
        (
            first.user_data(),
            first.qp(),
            first.byte_len(),
            first.status()
        ),
        (0, conn, 12, WcStatus::Success)
    );
    assert_eq!(
        ring.with_bufs(|b| b.bytes(first.buf())[..12].to_vec())
            .unwrap(),
        [9u8; 12]
    );
    ring.close();
    for (i, pending) in recvs.enumerate() {
        let back = futures::executor::block_on(pending).unwrap();
        assert_eq!(
            (back.user_data(), back.status()),
            (i as u64 + 1, WcStatus::WrFlushErr)
        );
    }
}

#[test]
fn events_about_the_shared_queue_and_its_queue_pairs_concern_the_ring() {
    let mut s = server(64, 8);
    let events = s.dev.async_events().unwrap();
    let (conn, mut client) = s.connect();
    s.post_receives(3, 0);
    s.ring.arm_srq_limit(s.srq, 2).unwrap();
    assert_eq!(client.send(1, 4), WcStatus::Success);
    assert_eq!(client.send(2, 4), WcStatus::Success);
    let event = std::iter::from_fn(|| events.next_event().unwrap())
        .find(|e| matches!(e, AsyncEvent::SrqLimitReached { .. }))
        .expect("the low-water event");
    assert!(s.ring.apply_event(event));
    let id = s.ring.srq(s.srq).unwrap().caps().id;
    assert!(s.ring.apply_event(AsyncEvent::SrqError { srq: id }));
    let foreign = s.dev.create_srq(&s.pd, SrqConfig::default()).unwrap();
    assert!(!s.ring.apply_event(AsyncEvent::SrqLimitReached {
        srq: foreign.caps().id
    }));
    assert_eq!(
        s.ring.qp_error(conn).unwrap(),
        None,
        "the events change nothing"
    );
    let done = s.ring.wait(2).unwrap();
    s.give_back(done);
}

#[test]
fn another_rings_queue_pair_on_the_queue_releases_none_of_this_rings_receives() {
    // Two rings on one device, each with a shared queue in its first
    // slot: their receives' work request ids are the same.
    let mut a = server(64, 8);
    let dev = a.dev.clone();
    let mut b: FixedRing<SoftQp> = FixedRing::new(
        dev.create_cq(64).unwrap(),
        FixedBufs::new(&a.pd, 4, 64).unwrap(),
        config(Duration::from_secs(1)),
    );
    let b_srq = b
        .add_srq(dev.create_srq(&a.pd, SrqConfig::default()).unwrap())
        .unwrap();
    let slot = b.take_buf().unwrap();
    b.push_srq(b_srq, RecvFixed::new(slot)).unwrap();
    b.submit().unwrap();
    a.post_receives(1, 0);
    // A queue pair on ring b's completion queue taking ring a's receives,
    // attached to neither.
    let stray = dev
        .create_qp_on(&a.pd, b.cq(), a.ring.srq(a.srq), QpConfig::default())
        .unwrap();
    let mut peer = dev.create_qp(&a.pd, QpConfig::default()).unwrap();
    dev.connect(&stray, &peer).unwrap();
    let cq = rdma_ring::backend::QueuePair::take_cq(&mut peer).unwrap();
    let mut sender = FixedRing::new(
        cq,
        FixedBufs::new(&a.pd, 2, 64).unwrap(),
        config(Duration::from_secs(10)),
    );
    let qp = sender.attach(peer).unwrap_or_else(|_| panic!("attach"));
    let mut client = Client { ring: sender, qp };
    assert_eq!(client.send(4, 8), WcStatus::Success);
    let mut out = Vec::new();
    b.reap(&mut out).unwrap();
    assert!(out.is_empty(), "another ring's receive released {out:?}");
    assert_eq!(b.unknown_completions(), 1);
    assert_eq!(
        b.srq_posted(b_srq).unwrap(),
        1,
        "b's receive is still posted"
    );

    // Ring a never hears of the receive the stray queue pair took: it
    // holds one of the queue's eight places, not the queue. Three rounds
    // of seven go through it.
    let (conn, mut peer) = a.connect();
    for round in 0..3u8 {
        a.post_receives(7, 0);
        for _ in 0..7 {
            assert_eq!(peer.send(round, 4), WcStatus::Success);
        }
        let done = a.ring.wait(7).unwrap();
        assert!(done
            .iter()
            .all(|c| c.qp() == conn && c.status().is_success()));
        a.give_back(done);
    }
    assert_eq!(a.ring.srq_posted(a.srq).unwrap(), 1, "the lost one");
    drop(stray);
}

/// The device's `LastWqeReached` applied while the queue pair is still
/// attached (failed, here on request) is not lost: once it is detached, its
/// number is not kept as a former queue pair's, since nothing more can
/// name it (a later queue pair with the number would be suspected of its
/// late flushes, and a caller waiting for the event would wait for ever).
#[test]
fn the_last_receive_s_event_applied_while_attached_is_kept_for_the_detach() {
    let mut s = server(64, 8);
    let events = s.dev.async_events().unwrap();
    let (conn, _client) = s.connect();
    s.post_receives(1, 0);
    s.ring.fail_qp(conn).unwrap();
    let last = std::iter::from_fn(|| events.next_event().unwrap())
        .find(|e| matches!(e, AsyncEvent::LastWqeReached { .. }))
        .expect("the device says the failed queue pair took its last receive");
    assert!(s.ring.apply_event(last), "an attached queue pair's");
    let qp = s.ring.detach(conn).unwrap();
    assert_eq!(last.qp_num(), Some(qp.qpn()));
    assert!(
        !s.ring.apply_event(last),
        "its number was kept as a former queue pair's"
    );
    drop(qp);
    assert_eq!(s.ring.srq_posted(s.srq).unwrap(), 1);
}

#[test]
fn the_device_saying_a_detached_queue_pair_took_its_last_receive_concerns_the_ring() {
    let mut s = server(64, 8);
    let events = s.dev.async_events().unwrap();
    let (conn, _client) = s.connect();
    s.post_receives(1, 0);
    let qp = s.ring.detach(conn).unwrap();
    let last = std::iter::from_fn(|| events.next_event().unwrap())
        .find(|e| matches!(e, AsyncEvent::LastWqeReached { .. }))
        .expect("the device says the detached queue pair took its last receive");
    assert_eq!(last.qp_num(), Some(qp.qpn()));
    assert!(
        s.ring.apply_event(last),
        "a queue pair detached from the queue"
    );
    assert!(!s.ring.apply_event(last), "forgotten once applied");
    drop(qp);
    assert_eq!(s.ring.srq_posted(s.srq).unwrap(), 1);
}

#[test]
fn a_failed_ring_hands_back_the_shared_receives_it_never_posted() {
    let mut s = server(64, 8);
    let events = s.dev.async_events().unwrap();
    let (conn, _client) = s.connect();
    s.post_receives(1, 0);
    let slot = s.ring.take_buf().unwrap();
    s.ring
        .push_srq(s.srq, RecvFixed::new(slot).user_data(7))
        .unwrap();
    s.dev.inject_device_fatal();
    let fatal = std::iter::from_fn(|| events.next_event().unwrap())
        .find(|e| matches!(e, AsyncEvent::DeviceFatal))
        .unwrap();
    assert!(s.ring.apply_event(fatal));
    let mut out = Vec::new();
    s.ring.reap(&mut out).unwrap();
    let seen: Vec<_> = out.iter().map(|c| (c.user_data(), c.status())).collect();
    assert_eq!(
        seen,
        [(7, WcStatus::WrFlushErr)],
        "the unposted one, at once"
    );
    s.give_back(out);
    let e = refused_srq(&mut s.ring, s.srq);
    assert!(matches!(e, Error::RingFailed(_)), "{e}");
    let another = s.dev.create_srq(&s.pd, SrqConfig::default()).unwrap();
    assert!(matches!(
        s.ring.add_srq(another).unwrap_err().error(),
        Error::RingFailed(_)
    ));
    // The posted one comes back when the queue goes.
    drop(s.ring.detach(conn).unwrap());
    drop(s.ring.remove_srq(s.srq).unwrap());
    let back = s.ring.wait(1).unwrap();
    let seen: Vec<_> = back.iter().map(|c| (c.user_data(), c.status())).collect();
    assert_eq!(seen, [(0, WcStatus::WrFlushErr)]);
    assert!(matches!(s.ring.wait(1), Err(Error::RingFailed(_))));
}

/// Every slot of the server's table is free, posted, or held by the test.
fn assert_slots_add_up(s: &Server, held: usize) {
    let free = s.ring.bufs().free() as usize;
    let posted = s.ring.srq_posted(s.srq).unwrap();
    assert_eq!(
        free + posted + held,
        32,
        "free {free}, posted {posted}, held {held}"
    );
}

#[test]
fn a_refilled_queue_keeps_taking_messages_far_beyond_its_depth() {
    let mut s = server(64, 8);
    let mut peers: Vec<(FixedQp, Client)> = (0..2).map(|_| s.connect()).collect();
    let refill = FixedSrqRefill {
        low: 3,
        target: 6,
        user_data: 77,
    };
    s.ring.set_srq_refill(s.srq, Some(refill)).unwrap();
    assert_eq!(s.ring.srq_posted(s.srq).unwrap(), 6, "topped up at once");
    let mut out = Vec::new();
    let mut lowest = usize::MAX;
    // Five messages a round, more than the refill leaves posted above its
    // low-water mark, forty in all: five times the queue's depth.
    for round in 0..8u8 {
        for k in 0..5u8 {
            let (_, client) = &mut peers[usize::from(k % 2)];
            assert_eq!(client.send(round * 8 + k, 16), WcStatus::Success);
            while out.is_empty() {
                s.ring.reap(&mut out).unwrap();
            }
            let c = out.pop().unwrap();
            assert_eq!((c.user_data(), c.status()), (77, WcStatus::Success));
            assert_eq!(c.qp(), peers[usize::from(k % 2)].0);
            assert!(s.ring.bufs().bytes(c.buf())[..16]
                .iter()
                .all(|&b| b == round * 8 + k));
            let posted = s.ring.srq_posted(s.srq).unwrap();
            assert!(
                (3..=6).contains(&posted),
                "after a reap, between the low-water mark and the target: {posted}"
            );
            lowest = lowest.min(posted);
            assert_slots_add_up(&s, 1);
            s.ring.put_buf(c.into_buf()).unwrap();
        }
    }
    assert_eq!(lowest, 3, "the refill waits for the low-water mark");
    assert_eq!(s.ring.unknown_completions(), 0);
    assert_eq!(s.ring.srq_refill(s.srq).unwrap(), Some(refill));
    // Stopped: the posted receives stay posted, and reaps take no slot.
    s.ring.set_srq_refill(s.srq, None).unwrap();
    let before = s.ring.srq_posted(s.srq).unwrap();
    for k in 0..before as u8 {
        assert_eq!(peers[0].1.send(k, 8), WcStatus::Success);
    }
    let done = s.ring.wait(before).unwrap();
    assert_eq!(
        s.ring.srq_posted(s.srq).unwrap(),
        0,
        "no refill once stopped"
    );
    s.give_back(done);
    assert_slots_add_up(&s, 0);
}

#[test]
fn a_refill_takes_only_free_slots_and_tops_up_once_they_come_back() {
    let mut s = server(64, 16);
    let held: Vec<_> = (0..28).map(|_| s.ring.take_buf().unwrap()).collect();
    let refill = FixedSrqRefill {
        low: 8,
        target: 12,
        user_data: 1,
    };
    s.ring.set_srq_refill(s.srq, Some(refill)).unwrap();
    assert_eq!(s.ring.srq_posted(s.srq).unwrap(), 4, "the four free slots");
    assert_eq!(s.ring.bufs().free(), 0);
    for slot in held {
        s.ring.put_buf(slot).unwrap();
    }
    assert_eq!(s.ring.srq_posted(s.srq).unwrap(), 4, "until a reap");
    let mut out = Vec::new();
    assert_eq!(s.ring.reap(&mut out).unwrap(), 0);
    assert_eq!(s.ring.srq_posted(s.srq).unwrap(), 12);
    assert_slots_add_up(&s, 0);
}

#[test]
fn a_refill_that_cannot_work_is_refused() {
    let mut s = server(64, 8);
    let bad = |low, target| FixedSrqRefill {
        low,
        target,
        user_data: 0,
    };
    for (low, target) in [(0, 4), (5, 4), (2, 9)] {
        let error = s.ring.set_srq_refill(s.srq, Some(bad(low, target)));
        assert!(
            matches!(error, Err(Error::Incompatible(_))),
            "low {low}, target {target}: {error:?}"
        );
    }
    assert_eq!(s.ring.srq_refill(s.srq).unwrap(), None);
    assert_eq!(s.ring.srq_posted(s.srq).unwrap(), 0, "nothing taken");
    assert_eq!(s.ring.bufs().free(), 32);
    let srq = s.ring.remove_srq(s.srq).unwrap();
    assert!(matches!(
        s.ring.set_srq_refill(s.srq, Some(bad(1, 4))),
        Err(Error::NotAttached(_))
    ));
    assert!(matches!(
        s.ring.srq_refill(s.srq),
        Err(Error::NotAttached(_))
    ));
    drop(srq);
}

#[test]
fn the_low_water_event_tops_up_a_refilled_queue_before_a_reap() {
    let mut s = server(64, 8);
    let events = s.dev.async_events().unwrap();
    let (conn, mut client) = s.connect();
    let refill = FixedSrqRefill {
        low: 4,
        target: 8,
        user_data: 5,
    };
    s.ring.set_srq_refill(s.srq, Some(refill)).unwrap();
    s.ring.arm_srq_limit(s.srq, 4).unwrap();
    for k in 0..5 {
        assert_eq!(client.send(k, 4), WcStatus::Success);
    }
    let event = std::iter::from_fn(|| events.next_event().unwrap())
        .find(|e| matches!(e, AsyncEvent::SrqLimitReached { .. }))
        .expect("the low-water event");
    assert_eq!(s.ring.srq_posted(s.srq).unwrap(), 8, "not reaped yet");
    assert_eq!(s.ring.bufs().free(), 32 - 8);
    assert!(s.ring.apply_event(event));
    assert_eq!(
        (s.ring.srq_posted(s.srq).unwrap(), s.ring.bufs().free()),
        (8, 32 - 8 - 5),
        "the five taken were reaped and five more posted"
    );
    let mut out = Vec::new();
    s.ring.reap(&mut out).unwrap();
    assert_eq!(out.len(), 5, "the event's reap kept them for the next");
    assert!(out.iter().all(|c| c.qp() == conn && c.user_data() == 5));
    s.give_back(out);
    assert_slots_add_up(&s, 0);
}

#[test]
fn removing_a_refilled_queue_hands_its_receives_back_and_ends_the_refill() {
    let mut s = server(64, 8);
    let (conn, mut client) = s.connect();
    let refill = FixedSrqRefill {
        low: 2,
        target: 8,
        user_data: 3,
    };
    s.ring.set_srq_refill(s.srq, Some(refill)).unwrap();
    assert_eq!(client.send(9, 4), WcStatus::Success);
    drop(s.ring.detach(conn).unwrap());
    let _srq = s.ring.remove_srq(s.srq).unwrap();
    let mut out = Vec::new();
    while out.len() < 8 {
        assert!(s.ring.reap(&mut out).unwrap() > 0, "all eight come back");
    }
    let ok = out
        .iter()
        .filter(|c| c.status() == WcStatus::Success)
        .count();
    assert_eq!(ok, 1, "the message that came");
    assert!(out.iter().all(|c| c.user_data() == 3));
    assert!(out
        .iter()
        .filter(|c| c.status() != WcStatus::Success)
        .all(|c| c.status() == WcStatus::WrFlushErr));
    for c in out {
        s.ring.put_buf(c.into_buf()).unwrap();
    }
    let mut more = Vec::new();
    assert_eq!(s.ring.reap(&mut more).unwrap(), 0);
    assert_eq!(s.ring.bufs().free(), 32, "no refill of a removed queue");
}

#[test]
fn awaited_arrivals_of_a_refilled_queue_from_concurrent_peers_all_come() {
    let mut s = server(64, 8);
    let peers: Vec<(FixedQp, Client)> = (0..3).map(|_| s.connect()).collect();
    let srq = s.srq;
    let ring = AsyncFixedRing::new(s.ring, Wakeup::Thread).unwrap();
    let refill = FixedSrqRefill {
        low: 3,
        target: 6,
        user_data: 40,
    };
    ring.set_srq_refill(srq, Some(refill)).unwrap();
    // One receive of the caller's own on the same queue: its future gets
    // whichever message takes it, the refill's arrivals the rest.
    let own = ring
        .push_srq(srq, RecvFixed::new(ring.take_buf().unwrap()).user_data(1))
        .unwrap();
    ring.submit().unwrap();
    let handles: Vec<FixedQp> = peers.iter().map(|(h, _)| *h).collect();
    let mut seen = Vec::new();
    std::thread::scope(|scope| {
        for (i, (_, mut client)) in peers.into_iter().enumerate() {
            scope.spawn(move || {
                for k in 0..10u8 {
                    let byte = i as u8 * 16 + k;
                    assert_eq!(client.send(byte, 24), WcStatus::Success);
                }
            });
        }
        let mut own = Some(own);
        futures::executor::block_on(async {
            while seen.len() < 30 {
                let c = match own.as_mut().map(futures::FutureExt::now_or_never) {
                    Some(Some(done)) => {
                        own = None;
                        let c = done.unwrap();
                        assert_eq!(c.user_data(), 1);
                        c
                    }
                    _ => {
                        let c = ring.receive(srq).await.unwrap();
                        assert_eq!(c.user_data(), 40);
                        c
                    }
                };
                assert_eq!(c.status(), WcStatus::Success);
                let byte = ring.with_bufs(|b| b.bytes(c.buf())[0]).unwrap();
                let sender = usize::from(byte / 16);
                assert_eq!(c.qp(), handles[sender], "names the sender's queue pair");
                assert!(ring
                    .with_bufs(|b| b.bytes(c.buf())[..24].iter().all(|&x| x == byte))
                    .unwrap());
                seen.push(byte);
                ring.put_buf(c.into_buf()).unwrap();
            }
        });
    });
    seen.sort_unstable();
    let sent: Vec<u8> = (0..3u8)
        .flat_map(|i| (0..10u8).map(move |k| i * 16 + k))
        .collect();
    assert_eq!(seen, sent, "every message once");
    ring.close();
}

#[test]
fn awaiting_arrivals_ends_with_an_error_once_none_can_come() {
    use futures::FutureExt;
    let mut s = server(64, 8);
    let (conn, mut client) = s.connect();
    let srq = s.srq;
    let ring = AsyncFixedRing::new(s.ring, Wakeup::Busy).unwrap();
    let none = ring.receive(srq).now_or_never().expect("resolved at once");
    assert!(matches!(none, Err(Error::Incompatible(_))), "{none:?}");
    let refill = FixedSrqRefill {
        low: 1,
        target: 4,
        user_data: 6,
    };
    ring.set_srq_refill(srq, Some(refill)).unwrap();
    // Polled once and dropped: the message that comes later goes to the
    // next await (below).
    assert!(ring.receive(srq).now_or_never().is_none());
    // Stopped: its four receives still posted go on taking messages.
    ring.set_srq_refill(srq, None).unwrap();
    assert!(
        ring.receive(srq).now_or_never().is_none(),
        "four may arrive"
    );
    assert_eq!(client.send(3, 5), WcStatus::Success);
    let c = ring.receive(srq).now_or_never().unwrap().unwrap();
    assert_eq!(
        (c.user_data(), c.qp(), c.byte_len()),
        (6, conn, 5),
        "arrived after the refill stopped"
    );
    ring.put_buf(c.into_buf()).unwrap();
    assert!(ring.receive(srq).now_or_never().is_none(), "three may");
    // The queue goes: its three receives carried nothing, and their slots
    // go back to the ring without arriving.
    drop(ring.detach(conn).unwrap());
    let _srq = ring.remove_srq(srq).unwrap();
    for _ in 0..2 {
        let gone = ring.receive(srq).now_or_never().expect("resolved at once");
        assert!(matches!(gone, Err(Error::NotAttached(_))), "{gone:?}");
    }
    assert_eq!(ring.with_bufs(|b| b.free()).unwrap(), 32);
}

#[test]
fn closing_resolves_awaited_arrivals_after_the_ones_that_came() {
    let mut s = server(64, 8);
    let (_conn, mut client) = s.connect();
    let srq = s.srq;
    let ring = AsyncFixedRing::new(s.ring, Wakeup::Busy).unwrap();
    let refill = FixedSrqRefill {
        low: 2,
        target: 3,
        user_data: 8,
    };
    ring.set_srq_refill(srq, Some(refill)).unwrap();
    assert_eq!(client.send(5, 4), WcStatus::Success);
    ring.close();
    let c = futures::executor::block_on(ring.receive(srq)).unwrap();
    assert_eq!(
        (c.status(), c.byte_len(), c.user_data()),
        (WcStatus::Success, 4, 8)
    );
    // The two left posted came back flushed at the close: they do not
    // arrive.
    let end = futures::executor::block_on(ring.receive(srq));
    assert!(matches!(end, Err(Error::Closed)), "{end:?}");
}

#[test]
fn a_ring_with_a_refill_set_is_not_shared() {
    let mut s = server(64, 8);
    let held: Vec<_> = std::iter::from_fn(|| s.ring.take_buf()).collect();
    let refill = FixedSrqRefill {
        low: 1,
        target: 4,
        user_data: 0,
    };
    s.ring.set_srq_refill(s.srq, Some(refill)).unwrap();
    assert_eq!(s.ring.srq_posted(s.srq).unwrap(), 0, "no free slot yet");
    let (error, mut ring) = AsyncFixedRing::new(s.ring, Wakeup::Busy)
        .map(|_| ())
        .unwrap_err()
        .into_parts();
    assert!(matches!(error, Error::RingNotIdle), "{error:?}");
    ring.set_srq_refill(s.srq, None).unwrap();
    for slot in held {
        ring.put_buf(slot).unwrap();
    }
    assert!(AsyncFixedRing::new(ring, Wakeup::Busy).is_ok());
}

/// A waker that notes it was woken.
struct Flag(AtomicBool);

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Polls `future` once with `flag`'s waker (the flag lowered first).
fn poll_flagged<F: Future + Unpin>(future: &mut F, flag: &Arc<Flag>) -> Poll<F::Output> {
    flag.0.store(false, Ordering::SeqCst);
    let waker = Waker::from(Arc::clone(flag));
    Pin::new(future).poll(&mut Context::from_waker(&waker))
}

/// Whether `flag` is raised within ten seconds (by the ring, from
/// whichever thread).
fn woken(flag: &Flag) -> bool {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !flag.0.load(Ordering::SeqCst) {
        if std::time::Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    true
}

/// Polls an await of `srq`'s next arrival until it waits (its waker with
/// the ring), then runs `end`; the ring must wake it, and it must then
/// resolve with `expected`.
fn woken_by(
    ring: &AsyncFixedRing<SoftQp>,
    srq: FixedSrq,
    end: impl FnOnce(),
    expected: fn(&Result<FixedCompletion, Error>) -> bool,
) {
    let flag = Arc::new(Flag(AtomicBool::new(false)));
    let mut waiting = ring.receive(srq);
    assert!(poll_flagged(&mut waiting, &flag).is_pending());
    end();
    assert!(woken(&flag), "the ring woke the waiting task");
    match poll_flagged(&mut waiting, &flag) {
        Poll::Ready(outcome) => assert!(expected(&outcome), "{outcome:?}"),
        Poll::Pending => panic!("woken, but still pending"),
    }
}

#[test]
fn a_task_awaiting_arrivals_wakes_when_its_refill_stops_its_queue_goes_or_the_ring_closes() {
    let mut s = server(64, 8);
    let held: Vec<_> = std::iter::from_fn(|| s.ring.take_buf()).collect();
    let srq = s.srq;
    let ring = AsyncFixedRing::new(s.ring, Wakeup::Thread).unwrap();
    let refill = FixedSrqRefill {
        low: 1,
        target: 4,
        user_data: 0,
    };
    // No free slot: nothing is posted, nothing arrives.
    ring.set_srq_refill(srq, Some(refill)).unwrap();
    woken_by(
        &ring,
        srq,
        || ring.set_srq_refill(srq, None).unwrap(),
        |o| matches!(o, Err(Error::Incompatible(_))),
    );
    ring.set_srq_refill(srq, Some(refill)).unwrap();
    woken_by(
        &ring,
        srq,
        || drop(ring.remove_srq(srq).unwrap()),
        |o| matches!(o, Err(Error::NotAttached(_))),
    );
    let other = ring
        .add_srq(s.dev.create_srq(&s.pd, SrqConfig::default()).unwrap())
        .unwrap();
    ring.set_srq_refill(other, Some(refill)).unwrap();
    woken_by(
        &ring,
        other,
        || ring.close(),
        |o| matches!(o, Err(Error::Closed)),
    );
    drop(held);
}

#[test]
fn a_slot_put_back_tops_up_a_drained_queue_and_the_waiting_task_gets_the_next_message() {
    // Eight slots, four taken by the refill; the other four held.
    let dev = SoftDevice::new();
    let pd = dev.alloc_pd();
    let mut ring = FixedRing::new(
        dev.create_cq(64).unwrap(),
        FixedBufs::new(&pd, 8, 64).unwrap(),
        config(Duration::from_secs(10)),
    );
    let srq = ring
        .add_srq(dev.create_srq(&pd, SrqConfig::default()).unwrap())
        .unwrap_or_else(|_| panic!("add_srq"));
    let mut s = Server { dev, pd, ring, srq };
    let (conn, mut client) = s.connect();
    let ring = AsyncFixedRing::new(s.ring, Wakeup::Thread).unwrap();
    let refill = FixedSrqRefill {
        low: 2,
        target: 4,
        user_data: 1,
    };
    ring.set_srq_refill(srq, Some(refill)).unwrap();
    let mut held: Vec<_> = std::iter::from_fn(|| ring.take_buf()).collect();
    assert_eq!(held.len(), 4);
    // Four messages fill the four receives; their slots stay out too.
    for k in 0..4 {
        assert_eq!(client.send(k, 4), WcStatus::Success);
        let c = futures::executor::block_on(ring.receive(srq)).unwrap();
        held.push(c.into_buf());
    }
    assert_eq!(ring.srq_posted(srq).unwrap(), 0, "drained: no slot free");
    // A task waits; nothing reaps. Putting one slot back posts a receive
    // at once, so the next message finds it.
    let flag = Arc::new(Flag(AtomicBool::new(false)));
    let mut waiting = ring.receive(srq);
    assert!(poll_flagged(&mut waiting, &flag).is_pending());
    ring.put_buf(held.pop().unwrap()).unwrap();
    assert_eq!(ring.srq_posted(srq).unwrap(), 1);
    assert_eq!(
        client.send(9, 6),
        WcStatus::Success,
        "no RNR: a receive was posted"
    );
    assert!(woken(&flag), "the notifier woke the task");
    let Poll::Ready(Ok(c)) = poll_flagged(&mut waiting, &flag) else {
        panic!("woken, but nothing arrived");
    };
    assert_eq!((c.qp(), c.byte_len()), (conn, 6));
    ring.close();
}

#[test]
fn a_dropped_await_leaves_no_waker_behind() {
    let s = server(64, 8);
    let srq = s.srq;
    let ring = AsyncFixedRing::new(s.ring, Wakeup::Reactor).unwrap();
    let refill = FixedSrqRefill {
        low: 1,
        target: 4,
        user_data: 0,
    };
    ring.set_srq_refill(srq, Some(refill)).unwrap();
    let flag = Arc::new(Flag(AtomicBool::new(false)));
    for _ in 0..3 {
        let mut waiting = ring.receive(srq);
        assert!(poll_flagged(&mut waiting, &flag).is_pending());
        assert!(Arc::strong_count(&flag) > 1, "its waker is with the ring");
        drop(waiting);
        assert_eq!(Arc::strong_count(&flag), 1, "and gone with the future");
    }
}
