//! The fixed ring's refusals on the soft device: each bad input is refused
//! with its own error and the operation (and so its slot) handed back; and
//! what a refused attach hands back.

use rdma_ring::backend::soft::{QpControl, SoftCq, SoftDevice, SoftPd, SoftQp, SoftSrq};
use rdma_ring::backend::{
    CompletionQueue, CqId, PostError, QpCaps, QpConfig, QueuePair, RawCompletion, RecvWr, SendWr,
    Sge, SrqConfig, WcStatus,
};
use rdma_ring::buf::{ExposedBuf, RegisteredBuf, RemoteAccess, RemoteSlice};
use rdma_ring::fixed::{
    FetchAddFixed, FixedBufs, FixedQp, FixedRing, FixedRingConfig, RecvFixed, SendFixed, WriteFixed,
};
use rdma_ring::op::Recv;
use rdma_ring::ring::{Ring, RingConfig};
use rdma_ring::Error;

mod peer_watch;
use peer_watch::{PeerAnswer, Watched};

struct Setup {
    _dev: SoftDevice,
    pd: SoftPd,
    ring: FixedRing<SoftQp>,
    qp: FixedQp,
    control: QpControl,
    _peer: SoftQp,
    target: ExposedBuf<Vec<u8>>,
}

fn setup(config: QpConfig, slots: u32) -> Setup {
    let dev = SoftDevice::new();
    let pd = dev.alloc_pd();
    let (mut a, peer) = dev.connected_pair(&pd, &pd, config).unwrap();
    let cq = a.take_cq().unwrap();
    let control = a.control();
    let mut ring = FixedRing::new(
        cq,
        FixedBufs::new(&pd, slots, 64).unwrap(),
        FixedRingConfig::default(),
    );
    let qp = ring.attach(a).unwrap_or_else(|_| panic!("attach"));
    let target = ExposedBuf::new(&pd, vec![0u8; 256], RemoteAccess::WRITE).unwrap();
    Setup {
        _dev: dev,
        pd,
        ring,
        qp,
        control,
        _peer: peer,
        target,
    }
}

/// Pushes `op`, expecting a refusal; puts the slot back and returns the
/// error.
macro_rules! refused {
    ($ring:expr, $qp:expr, $op:expr) => {{
        let (error, op) = $ring.push($qp, $op).unwrap_err().into_parts();
        $ring.put_buf(op.into_buf()).unwrap();
        error
    }};
}

#[test]
fn bad_operations_are_refused_and_handed_back() {
    let mut s = setup(QpConfig::default(), 4);
    let remote = s.target.remote().slice(0..64).unwrap();
    let (ring, qp) = (&mut s.ring, s.qp);

    let slot = ring.take_buf().unwrap();
    let e = refused!(ring, qp, WriteFixed::new(slot, 65, remote));
    assert!(
        matches!(
            e,
            Error::OutOfBounds {
                end: 65,
                len: 64,
                ..
            }
        ),
        "{e}"
    );

    let slot = ring.take_buf().unwrap();
    let small = s.target.remote().slice(0..32).unwrap();
    let e = refused!(ring, qp, WriteFixed::new(slot, 64, small));
    assert!(
        matches!(
            e,
            Error::RemoteTooSmall {
                local: 64,
                remote: 32
            }
        ),
        "{e}"
    );

    let slot = ring.take_buf().unwrap();
    let read_only = remote.restrict(RemoteAccess::READ);
    let e = refused!(ring, qp, WriteFixed::new(slot, 8, read_only));
    assert!(matches!(e, Error::MissingRemoteRights { .. }), "{e}");

    let mut other = FixedBufs::new(&s.pd, 1, 64).unwrap();
    let foreign = other.take().unwrap();
    let (e, op) = ring
        .push(qp, WriteFixed::new(foreign, 8, remote))
        .unwrap_err()
        .into_parts();
    assert!(matches!(e, Error::ForeignFixedBuf), "{e}");
    let foreign = op.into_buf();
    let (e, foreign) = ring.put_buf(foreign).unwrap_err().into_parts();
    assert!(matches!(e, Error::ForeignFixedBuf), "{e}");
    other.put(foreign).unwrap();

    let slot = ring.take_buf().unwrap();
    let e = refused!(ring, qp, SendFixed::new(slot, 65).inline());
    assert!(matches!(e, Error::OutOfBounds { .. }), "{e}");

    assert_eq!(ring.bufs().free(), 4, "every slot back");
    assert_eq!(
        s.control.counters().send_wrs,
        0,
        "nothing reached the device"
    );
}

#[test]
fn inline_payloads_beyond_the_queue_pairs_limit_are_refused() {
    let config = QpConfig {
        max_inline_data: 16,
        ..QpConfig::default()
    };
    let mut s = setup(config, 2);
    let slot = s.ring.take_buf().unwrap();
    let e = refused!(s.ring, s.qp, SendFixed::new(slot, 17).inline());
    assert!(
        matches!(e, Error::InlineTooLarge { len: 17, max: 16 }),
        "{e}"
    );
    let slot = s.ring.take_buf().unwrap();
    s.ring
        .push(s.qp, SendFixed::new(slot, 16).inline())
        .unwrap();
}

#[test]
fn full_queues_and_a_full_completion_queue_refuse_work() {
    // Four send places, one kept for the drain marker.
    let config = QpConfig {
        max_send_wr: 4,
        max_recv_wr: 2,
        ..QpConfig::default()
    };
    let mut s = setup(config, 8);
    let remote = s.target.remote().slice(0..64).unwrap();
    for _ in 0..3 {
        let slot = s.ring.take_buf().unwrap();
        s.ring
            .push(s.qp, WriteFixed::new(slot, 64, remote))
            .unwrap();
    }
    let slot = s.ring.take_buf().unwrap();
    let e = refused!(s.ring, s.qp, WriteFixed::new(slot, 64, remote));
    assert!(
        matches!(
            e,
            Error::SendQueueFull {
                outstanding: 3,
                depth: 3
            }
        ),
        "{e}"
    );
    for _ in 0..2 {
        let slot = s.ring.take_buf().unwrap();
        s.ring.push(s.qp, RecvFixed::new(slot)).unwrap();
    }
    let slot = s.ring.take_buf().unwrap();
    let e = refused!(s.ring, s.qp, RecvFixed::new(slot));
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
    // Submitted and reaped, the places are free again.
    assert_eq!(s.ring.submit().unwrap(), 5);
    let sent = s.ring.wait(3).unwrap();
    assert!(sent.iter().all(|c| c.status().is_success()));
    for c in sent {
        s.ring.put_buf(c.into_buf()).unwrap();
    }
    let slot = s.ring.take_buf().unwrap();
    s.ring
        .push(s.qp, WriteFixed::new(slot, 64, remote))
        .unwrap();

    // A completion queue of 4 entries with two queue pairs keeps one for
    // each drain marker: two operations fit, the third is refused.
    let dev = SoftDevice::new();
    let pd = dev.alloc_pd();
    let cq = dev.create_cq(4).unwrap();
    let mut ring: FixedRing<SoftQp> = FixedRing::new(
        cq,
        FixedBufs::new(&pd, 4, 64).unwrap(),
        FixedRingConfig::default(),
    );
    let (handles, _, _peers) = attach_connected(&dev, &pd, &mut ring, 2);
    for &h in &handles {
        let slot = ring.take_buf().unwrap();
        ring.push(h, RecvFixed::new(slot)).unwrap();
    }
    let slot = ring.take_buf().unwrap();
    let e = refused!(ring, handles[0], RecvFixed::new(slot));
    assert!(
        matches!(e, Error::CompletionQueueFull { entries: 4, .. }),
        "{e}"
    );
    // A third queue pair cannot be attached either: no entry for its marker.
    let qp = dev
        .create_qp_on(&pd, ring.cq(), None, QpConfig::default())
        .unwrap();
    let (e, _qp) = ring.attach(qp).unwrap_err().into_parts();
    assert!(matches!(e, Error::CompletionQueueFull { .. }), "{e}");
}

#[test]
fn attach_refuses_what_the_ring_cannot_serve_and_hands_it_back() {
    let dev = SoftDevice::new();
    let pd = dev.alloc_pd();
    let cq = dev.create_cq(64).unwrap();
    let mut ring: FixedRing<SoftQp> = FixedRing::new(
        cq,
        FixedBufs::new(&pd, 4, 64).unwrap(),
        FixedRingConfig::default(),
    );

    let elsewhere = dev.create_qp(&pd, QpConfig::default()).unwrap();
    let qpn = elsewhere.qpn();
    let (e, back) = ring.attach(elsewhere).unwrap_err().into_parts();
    assert!(matches!(e, Error::Incompatible(_)), "{e}");
    assert_eq!(back.qpn(), qpn, "the same queue pair handed back");

    let other_pd = dev.alloc_pd();
    let foreign = dev
        .create_qp_on(&other_pd, ring.cq(), None, QpConfig::default())
        .unwrap();
    let (e, _) = ring.attach(foreign).unwrap_err().into_parts();
    assert!(matches!(e, Error::WrongPd { .. }), "{e}");

    let srq = dev.create_srq(&pd, SrqConfig::default()).unwrap();
    let on_srq = dev
        .create_qp_on(&pd, ring.cq(), Some(&srq), QpConfig::default())
        .unwrap();
    let (e, _) = ring.attach(on_srq).unwrap_err().into_parts();
    assert!(
        matches!(e, Error::Incompatible(why) if why.contains("does not hold")),
        "{e}"
    );

    let tiny = QpConfig {
        max_send_wr: 1,
        ..QpConfig::default()
    };
    let shallow = dev.create_qp_on(&pd, ring.cq(), None, tiny).unwrap();
    let (e, _) = ring.attach(shallow).unwrap_err().into_parts();
    assert!(matches!(e, Error::Incompatible(_)), "{e}");
}

#[test]
fn handles_of_detached_queue_pairs_and_other_rings_name_nothing() {
    let mut s = setup(QpConfig::default(), 2);
    let other = setup(QpConfig::default(), 2);
    let remote = s.target.remote().slice(0..64).unwrap();
    let slot = s.ring.take_buf().unwrap();
    let e = refused!(s.ring, other.qp, WriteFixed::new(slot, 8, remote));
    assert!(matches!(e, Error::NotAttached(_)), "{e}");
    assert!(matches!(
        s.ring.qp_error(other.qp),
        Err(Error::NotAttached(_))
    ));
    let qp = s.ring.detach(s.qp).unwrap();
    let slot = s.ring.take_buf().unwrap();
    let e = refused!(s.ring, s.qp, WriteFixed::new(slot, 8, remote));
    assert!(matches!(e, Error::NotAttached(_)), "{e}");
    // Attached again, it has a new handle; the old one still names nothing.
    let again = s.ring.attach(qp).unwrap_or_else(|_| panic!("attach"));
    assert_ne!(again, s.qp);
    let slot = s.ring.take_buf().unwrap();
    let e = refused!(s.ring, s.qp, WriteFixed::new(slot, 8, remote));
    assert!(matches!(e, Error::NotAttached(_)), "{e}");
}

#[test]
fn work_pushed_before_a_failure_is_seen_comes_back_flushed_unposted() {
    let mut s = setup(QpConfig::default(), 4);
    let remote = s.target.remote().slice(0..64).unwrap();
    s.control.fail_nth(1, WcStatus::RemOpErr);
    let slot = s.ring.take_buf().unwrap();
    s.ring
        .push(s.qp, WriteFixed::new(slot, 64, remote).user_data(1))
        .unwrap();
    s.ring.submit().unwrap();
    let slot = s.ring.take_buf().unwrap();
    s.ring
        .push(s.qp, WriteFixed::new(slot, 64, remote).user_data(2))
        .unwrap();
    let failed = s.ring.wait(1).unwrap();
    assert_eq!(
        (failed[0].user_data(), failed[0].status()),
        (1, WcStatus::RemOpErr)
    );
    assert_eq!(s.ring.qp_error(s.qp).unwrap(), Some(WcStatus::RemOpErr));
    let posted_before = s.control.counters().send_wrs;
    assert_eq!(
        s.ring.submit().unwrap(),
        0,
        "nothing posted to a failed queue pair"
    );
    assert_eq!(s.control.counters().send_wrs, posted_before);
    let flushed = s.ring.wait(1).unwrap();
    assert_eq!(
        (
            flushed[0].user_data(),
            flushed[0].status(),
            flushed[0].byte_len()
        ),
        (2, WcStatus::WrFlushErr, 0)
    );
}

#[test]
fn a_zero_length_write_moves_nothing_and_completes() {
    let mut s = setup(QpConfig::default(), 1);
    let remote = s.target.remote().slice(0..64).unwrap();
    // A write of the slot's bytes would show in the target.
    let mut slot = s.ring.take_buf().unwrap();
    s.ring.bufs().bytes_mut(&mut slot).fill(0xff);
    s.ring.push(s.qp, WriteFixed::new(slot, 0, remote)).unwrap();
    s.ring.submit().unwrap();
    let done = s.ring.wait(1).unwrap();
    assert_eq!(
        (done[0].status(), done[0].byte_len()),
        (WcStatus::Success, 0)
    );
    // Nothing more can come: waiting for one fails at once.
    assert!(matches!(
        s.ring.wait(1),
        Err(Error::WaitUnsatisfiable {
            wanted: 1,
            possible: 0
        })
    ));
    drop(done);
    s.ring.close().unwrap();
    let target = s.target.into_inner().unwrap();
    assert!(target.iter().all(|&b| b == 0), "nothing was written");
}

#[test]
fn atomics_need_eight_bytes_of_slot() {
    let dev = SoftDevice::new();
    let pd = dev.alloc_pd();
    let (mut a, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    let cq = a.take_cq().unwrap();
    let mut ring = FixedRing::new(
        cq,
        FixedBufs::new(&pd, 1, 4).unwrap(),
        FixedRingConfig::default(),
    );
    let qp = ring.attach(a).unwrap_or_else(|_| panic!("attach"));
    let word = RemoteSlice::new(0x1000, 64, 7, RemoteAccess::ATOMIC)
        .word(0)
        .unwrap();
    let slot = ring.take_buf().unwrap();
    let e = refused!(ring, qp, FetchAddFixed::new(slot, word, 1));
    assert!(
        matches!(e, Error::OutOfBounds { end: 8, len: 4, .. }),
        "{e}"
    );
}

#[test]
#[should_panic(expected = "a fixed buffer token of another table")]
fn a_token_of_another_table_reaches_no_slot() {
    let pd = SoftDevice::new().alloc_pd();
    let (mut a, b) = (
        FixedBufs::new(&pd, 1, 8).unwrap(),
        FixedBufs::new(&pd, 1, 8).unwrap(),
    );
    let token = a.take().unwrap();
    let _ = b.bytes(&token);
}

#[test]
fn a_failed_completion_queue_fails_the_ring_and_waits_end_at_once() {
    let dev = SoftDevice::new();
    let pd = dev.alloc_pd();
    // No time to wait: a wait that did not see the failure would end in a
    // timeout, not in `RingFailed`.
    let mut ring: FixedRing<SoftQp> = FixedRing::new(
        dev.create_cq(4).unwrap(),
        FixedBufs::new(&pd, 4, 64).unwrap(),
        FixedRingConfig {
            wait_timeout: std::time::Duration::ZERO,
            ..FixedRingConfig::default()
        },
    );
    let qp = dev
        .create_qp_on(&pd, ring.cq(), None, QpConfig::default())
        .unwrap();
    let peer = dev.create_qp(&pd, QpConfig::default()).unwrap();
    dev.connect(&qp, &peer).unwrap();
    let conn = ring.attach(qp).unwrap_or_else(|_| panic!("attach"));
    let slot = ring.take_buf().unwrap();
    ring.push(conn, RecvFixed::new(slot)).unwrap();
    ring.submit().unwrap();
    // A queue pair outside the ring, on its completion queue, overruns it.
    let mut stranger = dev
        .create_qp_on(&pd, ring.cq(), None, QpConfig::default())
        .unwrap();
    stranger.set_error().unwrap();
    for _ in 0..8 {
        let wr = rdma_ring::backend::RecvWr {
            wr_id: 0,
            sges: rdma_ring::backend::SgeSpan::default(),
        };
        // SAFETY: no memory is named.
        let _ = unsafe { stranger.post_recv(&[wr], &[]) };
    }
    // The stranger's completions that fit name nothing of the ring's; then
    // the overrun.
    let mut out = Vec::new();
    assert_eq!(ring.reap(&mut out).unwrap(), 0);
    assert_eq!(ring.unknown_completions(), 4);
    let slot = ring.take_buf().unwrap();
    ring.push(conn, RecvFixed::new(slot).user_data(9)).unwrap(); // never posted
    assert!(matches!(ring.reap(&mut out), Err(Error::CqOverrun)));
    // Nothing more goes to the failed queue: what the failure found
    // pushed comes back flushed; then nothing more can come.
    assert_eq!(ring.submit().unwrap(), 0);
    let flushed = ring.wait(1).unwrap();
    let seen: Vec<_> = flushed
        .iter()
        .map(|c| (c.user_data(), c.status()))
        .collect();
    assert_eq!(seen, [(9, WcStatus::WrFlushErr)]);
    assert!(matches!(ring.wait(1), Err(Error::RingFailed(_))));
    let slot = ring.take_buf().unwrap();
    let e = refused!(ring, conn, RecvFixed::new(slot));
    assert!(matches!(e, Error::RingFailed(_)), "{e}");
}

/// `n` queue pairs on the ring's completion queue, each connected to a
/// peer of its own: their handles, controls and peers.
fn attach_connected(
    dev: &SoftDevice,
    pd: &SoftPd,
    ring: &mut FixedRing<SoftQp>,
    n: usize,
) -> (Vec<FixedQp>, Vec<QpControl>, Vec<SoftQp>) {
    let (mut handles, mut controls, mut peers) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..n {
        let qp = dev
            .create_qp_on(pd, ring.cq(), None, QpConfig::default())
            .unwrap();
        let peer = dev.create_qp(pd, QpConfig::default()).unwrap();
        dev.connect(&qp, &peer).unwrap();
        controls.push(qp.control());
        handles.push(ring.attach(qp).unwrap_or_else(|_| panic!("attach")));
        peers.push(peer);
    }
    (handles, controls, peers)
}

/// Two queue pairs on one ring, the device progressing by hand, its event
/// channel open: (ring, handles, controls, event channel, target, device).
#[allow(clippy::type_complexity)]
fn two_on_one_ring() -> (
    FixedRing<SoftQp>,
    [FixedQp; 2],
    [QpControl; 2],
    rdma_ring::backend::soft::SoftAsyncEvents,
    ExposedBuf<Vec<u8>>,
    Vec<SoftQp>,
    SoftDevice,
) {
    let dev = SoftDevice::new();
    dev.set_progress(rdma_ring::backend::soft::Progress::Manual);
    let events = dev.async_events().unwrap();
    let pd = dev.alloc_pd();
    let mut ring: FixedRing<SoftQp> = FixedRing::new(
        dev.create_cq(64).unwrap(),
        FixedBufs::new(&pd, 8, 64).unwrap(),
        FixedRingConfig::default(),
    );
    let (handles, controls, peers) = attach_connected(&dev, &pd, &mut ring, 2);
    let target = ExposedBuf::new(&pd, vec![0u8; 64], RemoteAccess::WRITE).unwrap();
    (
        ring,
        [handles[0], handles[1]],
        [controls[0].clone(), controls[1].clone()],
        events,
        target,
        peers,
        dev,
    )
}

#[test]
fn a_fatal_event_fails_its_queue_pair_alone_and_everything_it_held_comes_back() {
    use rdma_ring::backend::{AsyncEvent, AsyncEventSource, CompletionQueue};
    let (mut ring, [a, b], [control_a, _], events, target, _peers, dev) = two_on_one_ring();
    let write = |ring: &mut FixedRing<SoftQp>, qp, user_data| {
        let slot = ring.take_buf().unwrap();
        ring.push(
            qp,
            WriteFixed::new(slot, 64, target.remote()).user_data(user_data),
        )
        .unwrap();
    };
    write(&mut ring, a, 1);
    write(&mut ring, b, 2);
    ring.submit().unwrap(); // both in flight: the device waits to be stepped
    write(&mut ring, a, 3); // pushed, never posted
    control_a.inject_fatal();
    let event = events.next_event().unwrap().expect("the device raised it");
    assert!(matches!(event, AsyncEvent::QpFatal { .. }), "{event:?}");
    assert!(ring.apply_event(event));
    assert_eq!(ring.qp_error(a).unwrap(), Some(WcStatus::FatalErr));
    assert_eq!(ring.qp_error(b).unwrap(), None);
    let slot = ring.take_buf().unwrap();
    let refused = refused!(ring, a, WriteFixed::new(slot, 64, target.remote()));
    assert!(
        matches!(refused, Error::QpInError(WcStatus::FatalErr)),
        "{refused:?}"
    );
    // Events about queues the ring does not hold change nothing.
    let foreign = dev.create_cq(4).unwrap();
    for other in [
        AsyncEvent::QpFatal { qp_num: 9_999 },
        AsyncEvent::CqError { cq: foreign.id() },
        AsyncEvent::PortError { port: 1 },
    ] {
        assert!(!ring.apply_event(other), "{other:?}");
    }
    dev.progress();
    let mut back = ring.wait(3).unwrap();
    back.sort_by_key(|c| c.user_data());
    let seen: Vec<_> = back.iter().map(|c| (c.user_data(), c.status())).collect();
    assert_eq!(
        seen,
        [
            (1, WcStatus::WrFlushErr),
            (2, WcStatus::Success),
            (3, WcStatus::WrFlushErr)
        ]
    );
    // The other queue pair goes on.
    for c in back {
        ring.put_buf(c.into_buf()).unwrap();
    }
    write(&mut ring, b, 4);
    ring.submit().unwrap();
    dev.progress();
    let done = ring.wait(1).unwrap().pop().unwrap();
    assert_eq!((done.user_data(), done.status()), (4, WcStatus::Success));
    ring.put_buf(done.into_buf()).unwrap();
    assert_eq!(ring.bufs().free(), 8, "every slot is back");
}

#[test]
fn a_device_fatal_event_fails_the_ring_at_once() {
    use rdma_ring::backend::{AsyncEvent, AsyncEventSource};
    let (mut ring, [a, b], _, events, target, _peers, dev) = two_on_one_ring();
    let slot = ring.take_buf().unwrap();
    ring.push(a, WriteFixed::new(slot, 64, target.remote()))
        .unwrap();
    ring.submit().unwrap();
    dev.inject_device_fatal();
    let fatal = std::iter::from_fn(|| events.next_event().unwrap())
        .find(|e| *e == AsyncEvent::DeviceFatal)
        .expect("the device raised it");
    assert!(ring.apply_event(fatal));
    for qp in [a, b] {
        assert_eq!(ring.qp_error(qp).unwrap(), Some(WcStatus::FatalErr));
    }
    let slot = ring.take_buf().unwrap();
    let refused = refused!(ring, b, WriteFixed::new(slot, 64, target.remote()));
    assert!(matches!(refused, Error::RingFailed(_)), "{refused:?}");
    // No wait for what a failed device may never give back (a wait would
    // end in a timeout, not `RingFailed`).
    assert!(matches!(ring.wait(1), Err(Error::RingFailed(_))));
}

#[test]
fn a_completion_queue_error_event_fails_the_ring() {
    use rdma_ring::backend::{AsyncEvent, CompletionQueue};
    let (mut ring, [a, _], [control_a, _], _events, target, _peers, _dev) = two_on_one_ring();
    let slot = ring.take_buf().unwrap();
    ring.push(a, WriteFixed::new(slot, 64, target.remote()).user_data(5))
        .unwrap();
    let cq = ring.cq().id();
    assert!(ring.apply_event(AsyncEvent::CqError { cq }));
    let slot = ring.take_buf().unwrap();
    let refused = refused!(ring, a, WriteFixed::new(slot, 64, target.remote()));
    assert!(matches!(refused, Error::RingFailed(_)), "{refused:?}");
    // Nothing goes to a failed completion queue: what was pushed comes
    // back flushed, never posted.
    assert_eq!(ring.submit().unwrap(), 0);
    assert_eq!(control_a.counters().send_wrs, 0);
    let mut back = Vec::new();
    ring.reap(&mut back).unwrap();
    let seen: Vec<_> = back.iter().map(|c| (c.user_data(), c.status())).collect();
    assert_eq!(seen, [(5, WcStatus::WrFlushErr)]);
}

#[test]
fn a_failed_queue_pair_flushes_what_it_held_and_takes_no_more() {
    let (mut ring, [a, b], [control_a, _], _events, target, _peers, dev) = two_on_one_ring();
    let slot = ring.take_buf().unwrap();
    ring.push(a, WriteFixed::new(slot, 64, target.remote()).user_data(1))
        .unwrap();
    ring.submit().unwrap();
    let slot = ring.take_buf().unwrap();
    ring.push(a, RecvFixed::new(slot).user_data(2)).unwrap();
    let posted = control_a.counters().send_wrs;
    ring.fail_qp(a).unwrap();
    assert_eq!(ring.qp_error(a).unwrap(), Some(WcStatus::WrFlushErr));
    dev.progress();
    let mut back = ring.wait(2).unwrap();
    back.sort_by_key(|c| c.user_data());
    let seen: Vec<_> = back.iter().map(|c| (c.user_data(), c.status())).collect();
    assert_eq!(seen, [(1, WcStatus::WrFlushErr), (2, WcStatus::WrFlushErr)]);
    assert_eq!(
        control_a.counters().recv_wrs,
        0,
        "the receive pushed before the failure was never posted"
    );
    for c in back {
        ring.put_buf(c.into_buf()).unwrap();
    }
    let slot = ring.take_buf().unwrap();
    let refused = refused!(ring, a, WriteFixed::new(slot, 64, target.remote()));
    assert!(
        matches!(refused, Error::QpInError(WcStatus::WrFlushErr)),
        "{refused:?}"
    );
    assert_eq!(ring.submit().unwrap(), 0);
    assert!(
        control_a.counters().send_wrs <= posted + 1,
        "at most a drain marker"
    );
    let qp = ring.detach(a).unwrap();
    drop(qp);
    assert!(matches!(ring.fail_qp(a), Err(Error::NotAttached(_))));
    assert_eq!(ring.qp_error(b).unwrap(), None);
}

#[test]
fn a_wait_cut_short_by_a_failed_completion_queue_keeps_a_queue_pairs_order() {
    let dev = SoftDevice::new();
    let pd = dev.alloc_pd();
    let mut ring: FixedRing<SoftQp> = FixedRing::new(
        dev.create_cq(4).unwrap(),
        FixedBufs::new(&pd, 4, 64).unwrap(),
        FixedRingConfig::default(),
    );
    let (handles, _, peers) = attach_connected(&dev, &pd, &mut ring, 1);
    let conn = handles[0];
    let target = ExposedBuf::new(&pd, vec![0u8; 64], RemoteAccess::WRITE).unwrap();
    // A receive that stays posted (so the wait may go on), and a WRITE
    // that completes at once.
    let slot = ring.take_buf().unwrap();
    ring.push(conn, RecvFixed::new(slot).user_data(1)).unwrap();
    let slot = ring.take_buf().unwrap();
    ring.push(
        conn,
        WriteFixed::new(slot, 64, target.remote()).user_data(2),
    )
    .unwrap();
    ring.submit().unwrap();
    // A queue pair outside the ring fills the queue behind the WRITE's
    // entry, and overruns it.
    let mut stranger = dev
        .create_qp_on(&pd, ring.cq(), None, QpConfig::default())
        .unwrap();
    stranger.set_error().unwrap();
    for _ in 0..8 {
        let wr = rdma_ring::backend::RecvWr {
            wr_id: 0,
            sges: rdma_ring::backend::SgeSpan::default(),
        };
        // SAFETY: no memory is named.
        let _ = unsafe { stranger.post_recv(&[wr], &[]) };
    }
    // Pushed, never posted: the failure flushes it.
    let slot = ring.take_buf().unwrap();
    ring.push(
        conn,
        WriteFixed::new(slot, 64, target.remote()).user_data(3),
    )
    .unwrap();
    // The wait reaps the WRITE, then meets the overrun.
    assert!(matches!(ring.wait(2), Err(Error::CqOverrun)));
    let mut out = Vec::new();
    ring.reap(&mut out).unwrap();
    let seen: Vec<_> = out.iter().map(|c| (c.user_data(), c.status())).collect();
    assert_eq!(
        seen,
        [(2, WcStatus::Success), (3, WcStatus::WrFlushErr)],
        "the queue pair's sends in order"
    );
    drop(peers);
}

/// A SEND, or a WRITE with immediate, that asks for a solicited event
/// wakes the peer's completion channel armed for solicited events only;
/// one that does not ask wakes no one, and neither does a plain WRITE,
/// which makes no completion at the peer whatever its flags.
#[test]
fn solicited_messages_and_writes_with_immediate_wake_a_solicited_waiter() {
    let dev = SoftDevice::new();
    let pd = dev.alloc_pd();
    let (mut a, b) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    let cq = a.take_cq().unwrap();
    let bufs = FixedBufs::new(&pd, 2, 64).unwrap();
    let mut ring = FixedRing::new(cq, bufs, FixedRingConfig::default());
    let qp = ring.attach(a).unwrap_or_else(|_| panic!("attach"));
    let mut peer = Ring::new(b, RingConfig::default());
    let target = ExposedBuf::new(&pd, vec![0u8; 64], RemoteAccess::WRITE).unwrap();
    let remote = target.remote();
    let events = peer.cq().completion_events().expect("a completion channel");
    events.arm_solicited().unwrap();

    // Pushes the operation `make` builds from a slot, waits for its
    // completion, and says how many completions the peer got and how
    // many events were raised.
    macro_rules! run {
        ($make:expr) => {{
            let recv = RegisteredBuf::new(&pd, vec![0u8; 64]).unwrap();
            peer.submission().push(Recv::new(recv)).unwrap();
            peer.submit().unwrap();
            let slot = ring.take_buf().unwrap();
            ring.push(qp, $make(slot)).unwrap();
            ring.submit().unwrap();
            let mut done = ring.wait(1).unwrap();
            let done = done.pop().unwrap();
            assert_eq!(done.status(), WcStatus::Success);
            ring.put_buf(done.into_buf()).unwrap();
            let mut arrived = Vec::new();
            peer.completion().reap(&mut arrived).unwrap();
            (arrived.len(), events.take().unwrap())
        }};
    }

    assert_eq!(run!(|s| SendFixed::new(s, 8)), (1, 0));
    assert_eq!(run!(|s| WriteFixed::new(s, 8, remote).imm(1)), (1, 0));
    assert_eq!(run!(|s| WriteFixed::new(s, 8, remote).solicited()), (0, 0));
    assert_eq!(
        run!(|s| WriteFixed::new(s, 8, remote).imm(2).solicited()),
        (1, 1)
    );
    events.arm_solicited().unwrap();
    assert_eq!(run!(|s| SendFixed::new(s, 8).solicited()), (1, 1));
}

/// `check_peers` fails each queue pair whose peer left (`RetryExcErr`) or
/// that cannot say (`FatalErr`): its posted receive comes back flushed and
/// it takes no more work. A queue pair whose peer stayed runs on.
#[test]
fn check_peers_fails_the_queue_pairs_whose_peer_left_or_cannot_say() {
    let dev = SoftDevice::new();
    let pd = dev.alloc_pd();
    let cq = dev.create_cq(64).unwrap();
    let bufs = FixedBufs::new(&pd, 8, 64).unwrap();
    let mut ring: FixedRing<Watched> = FixedRing::new(cq, bufs, FixedRingConfig::default());
    let answers = [PeerAnswer::Left, PeerAnswer::CannotTell, PeerAnswer::Stayed];
    let mut conns = Vec::new();
    let mut peers = Vec::new();
    for (i, answer) in answers.into_iter().enumerate() {
        let qp = dev
            .create_qp_on(&pd, ring.cq(), None, QpConfig::default())
            .unwrap();
        let peer = dev.create_qp(&pd, QpConfig::default()).unwrap();
        dev.connect(&qp, &peer).unwrap();
        let conn = ring
            .attach(Watched { qp, answer })
            .unwrap_or_else(|_| panic!("attach"));
        let slot = ring.take_buf().unwrap();
        ring.push(conn, RecvFixed::new(slot).user_data(i as u64))
            .unwrap();
        conns.push(conn);
        peers.push(peer);
    }
    ring.submit().unwrap();
    assert_eq!(ring.check_peers(), 2);
    let mut back = ring.wait(2).unwrap();
    back.sort_by_key(|c| c.user_data());
    let got: Vec<_> = back.iter().map(|c| (c.user_data(), c.status())).collect();
    assert_eq!(got, [(0, WcStatus::WrFlushErr), (1, WcStatus::WrFlushErr)]);
    for c in back {
        ring.put_buf(c.into_buf()).unwrap();
    }
    let errors: Vec<_> = conns.iter().map(|&c| ring.qp_error(c).unwrap()).collect();
    assert_eq!(
        errors,
        [Some(WcStatus::RetryExcErr), Some(WcStatus::FatalErr), None]
    );
    let slot = ring.take_buf().unwrap();
    let refused = refused!(ring, conns[0], RecvFixed::new(slot));
    assert!(matches!(refused, Error::QpInError(_)), "{refused}");
    // Asked again, the failed ones are not asked: nothing more fails.
    assert_eq!(ring.check_peers(), 0);
}

thread_local! {
    /// CQEs the next polls of a `ForgingCq` (on this thread) report first.
    static FORGED: std::cell::RefCell<Vec<RawCompletion>> = const { std::cell::RefCell::new(Vec::new()) };
    /// The `wr_id`s a `Recording` queue pair posted as sends.
    static SENT: std::cell::RefCell<Vec<u64>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// A soft completion queue that reports forged CQEs before its own.
struct ForgingCq(SoftCq);

// SAFETY: the soft queue's completions, passed through; the forged ones
// name work requests that are stale, which the ring must survive being
// shown.
unsafe impl CompletionQueue for ForgingCq {
    fn id(&self) -> CqId {
        self.0.id()
    }
    fn entries(&self) -> u32 {
        self.0.entries()
    }
    fn poll(&mut self, out: &mut [RawCompletion]) -> Result<usize, Error> {
        if let Some(cqe) = FORGED.with(|f| f.borrow_mut().pop()) {
            out[0] = cqe;
            return Ok(1);
        }
        self.0.poll(out)
    }
}

/// A soft queue pair that records the `wr_id` of each send it posts.
struct Recording(SoftQp);

// SAFETY: the soft queue pair's, passed through.
unsafe impl QueuePair for Recording {
    type Cq = ForgingCq;
    type Srq = SoftSrq;
    fn caps(&self) -> QpCaps {
        self.0.caps()
    }
    unsafe fn post_send(&mut self, wrs: &[SendWr], sges: &[Sge]) -> Result<(), PostError> {
        SENT.with(|s| s.borrow_mut().extend(wrs.iter().map(|wr| wr.wr_id)));
        // SAFETY: the caller's contract, passed through.
        unsafe { self.0.post_send(wrs, sges) }
    }
    unsafe fn post_recv(&mut self, wrs: &[RecvWr], sges: &[Sge]) -> Result<(), PostError> {
        // SAFETY: the caller's contract, passed through.
        unsafe { self.0.post_recv(wrs, sges) }
    }
    fn set_error(&mut self) -> Result<(), Error> {
        self.0.set_error()
    }
    fn take_cq(&mut self) -> Option<ForgingCq> {
        self.0.take_cq().map(ForgingCq)
    }
}

/// A queue pair's place in the ring, reused by the next one attached,
/// goes on with the sequence numbers (its `wr_id`s) where the last left
/// off: a late CQE of the detached queue pair — even one naming the new
/// queue pair's number, as a device reusing numbers could — matches
/// nothing of the new one's, and releases none of its work early.
#[test]
fn a_stale_completion_of_a_detached_queue_pair_releases_nothing_of_its_successor() {
    let dev = SoftDevice::new();
    let pd = dev.alloc_pd();
    let cq = ForgingCq(dev.create_cq(64).unwrap());
    let bufs = FixedBufs::new(&pd, 4, 64).unwrap();
    let mut ring: FixedRing<Recording> = FixedRing::new(cq, bufs, FixedRingConfig::default());
    let target = ExposedBuf::new(&pd, vec![0u8; 64], RemoteAccess::WRITE).unwrap();
    let mut peers = Vec::new();
    let mut connected = |ring: &FixedRing<Recording>| {
        let qp = dev
            .create_qp_on(&pd, &ring.cq().0, None, QpConfig::default())
            .unwrap();
        let peer = dev.create_qp(&pd, QpConfig::default()).unwrap();
        dev.connect(&qp, &peer).unwrap();
        peers.push(peer);
        qp
    };

    // The first queue pair: one write, done; then detached.
    let first = ring
        .attach(Recording(connected(&ring)))
        .unwrap_or_else(|_| panic!("attach"));
    let slot = ring.take_buf().unwrap();
    ring.push(
        first,
        WriteFixed::new(slot, 8, target.remote()).user_data(1),
    )
    .unwrap();
    ring.submit().unwrap();
    let done = ring.wait(1).unwrap().pop().unwrap();
    ring.put_buf(done.into_buf()).unwrap();
    let stale = SENT.with(|s| *s.borrow().last().unwrap());
    drop(ring.detach(first).unwrap());

    // The next one takes its place; its write's completion is held back.
    let qp = connected(&ring);
    let (control, qpn) = (qp.control(), qp.caps().qp_num);
    let next = ring
        .attach(Recording(qp))
        .unwrap_or_else(|_| panic!("attach"));
    control.hold_acks();
    let slot = ring.take_buf().unwrap();
    ring.push(next, WriteFixed::new(slot, 8, target.remote()).user_data(2))
        .unwrap();
    ring.submit().unwrap();
    let unknown = ring.unknown_completions();
    FORGED.with(|f| {
        f.borrow_mut().push(RawCompletion {
            wr_id: stale,
            qp_num: qpn,
            status: WcStatus::Success,
            byte_len: 8,
            imm: None,
            by_write_imm: false,
        })
    });
    let mut got = Vec::new();
    ring.reap(&mut got).unwrap();
    assert!(got.is_empty(), "the stale CQE released {got:?}");
    assert_eq!(ring.unknown_completions(), unknown + 1);
    control.release_acks();
    let done = ring.wait(1).unwrap().pop().unwrap();
    assert_eq!((done.user_data(), done.status()), (2, WcStatus::Success));
    ring.put_buf(done.into_buf()).unwrap();
}

/// A drain that runs out of time still takes everything the device gave
/// back by then, more than one poll batch of it: with no time at all, a
/// soft queue pair flushes its 40 receives at once, and a detach, or a
/// close, takes them all (nothing leaked, no timeout).
#[test]
fn a_drain_out_of_time_takes_every_completion_already_queued() {
    for close in [false, true] {
        let dev = SoftDevice::new();
        let pd = dev.alloc_pd();
        let (mut a, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
        let cq = a.take_cq().unwrap();
        let config = FixedRingConfig {
            drain_timeout: std::time::Duration::ZERO,
            ..FixedRingConfig::default()
        };
        let mut ring = FixedRing::new(cq, FixedBufs::new(&pd, 64, 64).unwrap(), config);
        let qp = ring.attach(a).unwrap_or_else(|_| panic!("attach"));
        for _ in 0..40 {
            let slot = ring.take_buf().unwrap();
            ring.push(qp, RecvFixed::new(slot)).unwrap();
        }
        ring.submit().unwrap();
        if close {
            // Not drained, it would leak the slots' memory and say so.
            ring.close().expect("everything came back");
        } else {
            ring.detach(qp).expect("everything came back");
            let back = ring.wait(40).unwrap();
            assert_eq!(back.len(), 40);
            assert!(back.iter().all(|c| c.status() == WcStatus::WrFlushErr));
        }
    }
}

/// A wait for more completions than can ever come fails, whatever it
/// asks for, rather than asking the allocator for room first.
#[test]
fn a_wait_for_more_than_can_come_fails_without_allocating_it() {
    let mut s = setup(QpConfig::default(), 4);
    for min in [1, 1 << 40, usize::MAX] {
        assert!(
            matches!(s.ring.wait(min), Err(Error::WaitUnsatisfiable { .. })),
            "{min}"
        );
    }
}
