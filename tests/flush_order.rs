//! A queue pair's completions come out in the order its work was pushed,
//! flushes included: work never posted, flushed when the queue pair fails,
//! is detached or the ring closes, comes out after the work it posted
//! (which the device completes or flushes first), on both rings.

use std::time::Duration;

use rdma_ring::backend::soft::{Progress, QpControl, SoftCq, SoftDevice, SoftPd, SoftQp, SoftSrq};
use rdma_ring::backend::{
    AsyncEvent, PostError, QpCaps, QpConfig, QueuePair, RecvWr, SendWr, Sge, WcStatus,
};
use rdma_ring::buf::{BufferPool, ExposedBuf, RemoteAccess};
use rdma_ring::fixed::{FixedBufs, FixedCompletion, FixedQp, FixedRing, FixedRingConfig};
use rdma_ring::fixed::{RecvFixed, WriteFixed};
use rdma_ring::op::{OpKind, Recv, Write};
use rdma_ring::ring::{Completion, Ring, RingConfig};

/// (user_data, status) of the sends, then of the receives, each in the
/// order they came out.
type Seen = (Vec<(u64, WcStatus)>, Vec<(u64, WcStatus)>);

fn split<T>(done: &[T], kind: impl Fn(&T) -> OpKind, seen: impl Fn(&T) -> (u64, WcStatus)) -> Seen {
    let sends = done
        .iter()
        .filter(|c| kind(c) != OpKind::Recv)
        .map(&seen)
        .collect();
    let recvs = done
        .iter()
        .filter(|c| kind(c) == OpKind::Recv)
        .map(&seen)
        .collect();
    (sends, recvs)
}

fn owned(done: &[Completion]) -> Seen {
    split(done, Completion::kind, |c| (c.user_data(), c.status()))
}

fn fixed(done: &[FixedCompletion]) -> Seen {
    split(done, FixedCompletion::kind, |c| (c.user_data(), c.status()))
}

const OK: WcStatus = WcStatus::Success;
const FLUSH: WcStatus = WcStatus::WrFlushErr;

/// An owned-buffer ring on one end of a connected pair: three WRITEs and a
/// receive posted (the WRITEs done, not yet reaped; the receive waiting
/// for a message that never comes), then two WRITEs and a receive pushed
/// and never posted.
struct Owned {
    ring: Ring<SoftQp>,
    _peer: SoftQp,
    _pool: BufferPool,
    _target: ExposedBuf<Vec<u8>>,
}

fn owned_with_posted_and_pushed() -> Owned {
    let dev = SoftDevice::new();
    let pd = dev.alloc_pd();
    let (qp, peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    let mut ring = Ring::new(qp, RingConfig::default());
    let pool = BufferPool::new(&pd, 64, 8).unwrap();
    let target = ExposedBuf::new(&pd, vec![0u8; 64], RemoteAccess::WRITE).unwrap();
    let write = |ring: &mut Ring<SoftQp>, user_data| {
        let op = Write::new(pool.take().unwrap(), target.remote()).user_data(user_data);
        ring.submission().push(op).unwrap();
    };
    let recv = |ring: &mut Ring<SoftQp>, user_data| {
        let op = Recv::new(pool.take().unwrap()).user_data(user_data);
        ring.submission().push(op).unwrap();
    };
    recv(&mut ring, 10);
    for i in 0..3 {
        write(&mut ring, i);
    }
    ring.submit().unwrap();
    recv(&mut ring, 11);
    write(&mut ring, 3);
    write(&mut ring, 4);
    Owned {
        ring,
        _peer: peer,
        _pool: pool,
        _target: target,
    }
}

fn expected_owned() -> Seen {
    (
        vec![(0, OK), (1, OK), (2, OK), (3, FLUSH), (4, FLUSH)],
        vec![(10, FLUSH), (11, FLUSH)],
    )
}

#[test]
fn detaching_hands_back_posted_work_before_what_was_never_posted() {
    let mut s = owned_with_posted_and_pushed();
    let handle = s.ring.default_qp().unwrap();
    let detached = s.ring.detach(handle).unwrap();
    assert!(detached.drained);
    let mut done = Vec::new();
    s.ring.completion().reap(&mut done).unwrap();
    assert_eq!(owned(&done), expected_owned());
}

#[test]
fn closing_hands_back_posted_work_before_what_was_never_posted() {
    let s = owned_with_posted_and_pushed();
    let done = s.ring.close();
    assert_eq!(owned(&done), expected_owned());
}

/// A fixed-buffer ring on one end of a connected pair, the device
/// stepped by hand: a WRITE and a receive posted and still in the
/// device, then a WRITE and a receive pushed and never posted.
struct Fixed {
    dev: SoftDevice,
    ring: FixedRing<SoftQp>,
    conn: FixedQp,
    qpn: u32,
    _pd: SoftPd,
    _peer: SoftQp,
    _target: ExposedBuf<Vec<u8>>,
}

fn fixed_with_posted_and_pushed(progress: Progress) -> Fixed {
    let dev = SoftDevice::with_progress(progress);
    let pd = dev.alloc_pd();
    let (mut qp, peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    let qpn = qp.caps().qp_num;
    let cq = qp.take_cq().unwrap();
    let mut ring = FixedRing::new(
        cq,
        FixedBufs::new(&pd, 8, 64).unwrap(),
        FixedRingConfig::default(),
    );
    let conn = ring.attach(qp).unwrap_or_else(|_| panic!("attach"));
    let target = ExposedBuf::new(&pd, vec![0u8; 64], RemoteAccess::WRITE).unwrap();
    let write = |ring: &mut FixedRing<SoftQp>, user_data| {
        let slot = ring.take_buf().unwrap();
        let op = WriteFixed::new(slot, 64, target.remote()).user_data(user_data);
        ring.push(conn, op).unwrap();
    };
    let recv = |ring: &mut FixedRing<SoftQp>, user_data| {
        let slot = ring.take_buf().unwrap();
        ring.push(conn, RecvFixed::new(slot).user_data(user_data))
            .unwrap();
    };
    recv(&mut ring, 10);
    write(&mut ring, 1);
    ring.submit().unwrap();
    recv(&mut ring, 11);
    write(&mut ring, 2);
    Fixed {
        dev,
        ring,
        conn,
        qpn,
        _pd: pd,
        _peer: peer,
        _target: target,
    }
}

fn all_flushed() -> Seen {
    (vec![(1, FLUSH), (2, FLUSH)], vec![(10, FLUSH), (11, FLUSH)])
}

#[test]
fn a_failed_fixed_queue_pair_hands_back_posted_work_first() {
    let mut s = fixed_with_posted_and_pushed(Progress::Manual);
    s.ring.fail_qp(s.conn).unwrap();
    s.dev.progress();
    let done = s.ring.wait(4).unwrap();
    assert_eq!(fixed(&done), all_flushed());
    for c in done {
        s.ring.put_buf(c.into_buf()).unwrap();
    }
    assert_eq!(s.ring.bufs().free(), 8);
}

#[test]
fn a_fixed_queue_pair_failed_by_an_event_hands_back_posted_work_first() {
    let mut s = fixed_with_posted_and_pushed(Progress::Manual);
    assert!(s.ring.apply_event(AsyncEvent::QpFatal { qp_num: s.qpn }));
    s.dev.progress();
    let done = s.ring.wait(4).unwrap();
    let (sends, recvs) = fixed(&done);
    let keys = |seen: Vec<(u64, WcStatus)>| seen.into_iter().map(|(k, _)| k).collect::<Vec<_>>();
    assert_eq!((keys(sends), keys(recvs)), (vec![1, 2], vec![10, 11]));
}

/// A queue pair that does not act on a move to error: it takes it (with
/// `false`) or refuses it (with `true`). Its posted work stays out.
struct StaysUp(SoftQp, bool);

// SAFETY: the soft queue pair's, except that `set_error` does nothing
// (the work stays posted, so no buffer is handed back early).
unsafe impl QueuePair for StaysUp {
    type Cq = SoftCq;
    type Srq = SoftSrq;
    fn caps(&self) -> QpCaps {
        self.0.caps()
    }
    unsafe fn post_send(&mut self, wrs: &[SendWr], sges: &[Sge]) -> Result<(), PostError> {
        // SAFETY: passed through.
        unsafe { self.0.post_send(wrs, sges) }
    }
    unsafe fn post_recv(&mut self, wrs: &[RecvWr], sges: &[Sge]) -> Result<(), PostError> {
        // SAFETY: passed through.
        unsafe { self.0.post_recv(wrs, sges) }
    }
    fn set_error(&mut self) -> Result<(), rdma_ring::Error> {
        match self.1 {
            true => Err(rdma_ring::Error::Soft("refused")),
            false => Ok(()),
        }
    }
    fn take_cq(&mut self) -> Option<SoftCq> {
        self.0.take_cq()
    }
}

/// A ring of one queue pair that does not act on a move to error
/// (refusing it with `refuse`), with a receive posted (user data 1) and
/// one pushed (2).
fn one_posted_one_pushed(refuse: bool) -> (FixedRing<StaysUp>, FixedQp, QpControl, SoftQp) {
    let dev = SoftDevice::with_progress(Progress::Manual);
    let pd = dev.alloc_pd();
    let (mut qp, peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    let control = qp.control();
    let cq = qp.take_cq().unwrap();
    let config = FixedRingConfig {
        wait_timeout: Duration::from_millis(50),
        ..FixedRingConfig::default()
    };
    let mut ring = FixedRing::new(cq, FixedBufs::new(&pd, 4, 64).unwrap(), config);
    let conn = ring
        .attach(StaysUp(qp, refuse))
        .unwrap_or_else(|_| panic!("attach"));
    for user_data in [1, 2] {
        let slot = ring.take_buf().unwrap();
        ring.push(conn, RecvFixed::new(slot).user_data(user_data))
            .unwrap();
        if user_data == 1 {
            ring.submit().unwrap();
        }
    }
    (ring, conn, control, peer)
}

#[test]
fn a_wait_counts_the_work_held_back_behind_posted_work() {
    let (mut ring, conn, control, _peer) = one_posted_one_pushed(false);
    ring.fail_qp(conn).unwrap();
    // One receive posted and still out, one held back behind it: two can
    // still come, so the wait runs to its timeout rather than refusing.
    let waited = ring.wait(2).unwrap_err();
    assert!(matches!(waited, rdma_ring::Error::Timeout(_)), "{waited:?}");
    assert!(matches!(
        ring.wait(3),
        Err(rdma_ring::Error::WaitUnsatisfiable {
            wanted: 3,
            possible: 2
        })
    ));
    control.inject_fatal();
    let done = ring.wait(2).unwrap();
    let seen: Vec<_> = done.iter().map(|c| (c.user_data(), c.status())).collect();
    assert_eq!(seen, [(1, FLUSH), (2, FLUSH)]);
}

#[test]
fn detaching_a_fixed_queue_pair_hands_back_posted_work_first() {
    let mut s = fixed_with_posted_and_pushed(Progress::Auto);
    let qp = s.ring.detach(s.conn).unwrap();
    let done = s.ring.wait(4).unwrap();
    assert_eq!(
        fixed(&done),
        (vec![(1, OK), (2, FLUSH)], vec![(10, FLUSH), (11, FLUSH)])
    );
    drop(qp);
}

#[test]
fn work_never_posted_is_not_held_behind_a_queue_pair_the_device_will_not_fail() {
    // Nothing would bring the posted receive back: holding the pushed one
    // behind it would hold it for ever.
    let (mut ring, conn, control, _peer) = one_posted_one_pushed(true);
    assert!(ring.fail_qp(conn).is_err());
    let mut out = Vec::new();
    ring.reap(&mut out).unwrap();
    let seen: Vec<_> = out.iter().map(|c| (c.user_data(), c.status())).collect();
    assert_eq!(seen, [(2, FLUSH)]);
    control.inject_fatal();
    let done = ring.wait(1).unwrap();
    assert_eq!((done[0].user_data(), done[0].status()), (1, FLUSH));
}
