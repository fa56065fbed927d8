//! Where the soft device keeps hardware's rules that a lenient test
//! double would let slide, so that the rings' tests and fuzzers see what a
//! NIC would do to them.
//!
//! A queue's slots stay held until the CQE that gives them back is polled,
//! not merely until the work ran: a ring that counted its room from work
//! that ran, rather than from completions it reaped, would overfill a
//! NIC's queue, and is refused here as it would be there. `rnr_retry = 0`
//! means no retry. And a responder that an access violation or an invalid
//! request puts in error says so with an affiliated event, so a ring
//! learns of it without a completion of its own. A completion channel
//! armed for solicited events wakes only for a message that asked for one,
//! or for an error. Work whose ACK is late is flushed by an error that
//! acknowledges nothing, an injected responder fault fails the responder
//! as the real one would, and a message past the largest fails with a
//! length error.

use rdma_ring::backend::soft::{Progress, QpState, SoftCq, SoftDevice, SoftPd, SoftQp, SoftSrq};
use rdma_ring::backend::{
    AsyncEvent, AsyncEventSource, CompletionQueue, PostError, QpConfig, QueuePair, RawCompletion,
    RecvWr, SendFlags, SendOpcode, SendWr, Sge, SgeSpan, SharedReceiveQueue, SrqConfig, WcStatus,
};
use rdma_ring::buf::{ExposedBuf, RegisteredBuf, RemoteAccess};
use rdma_ring::Error;

const DEPTH: u32 = 4;

fn config() -> QpConfig {
    QpConfig {
        max_send_wr: DEPTH,
        max_recv_wr: DEPTH,
        ..QpConfig::default()
    }
}

fn refused_as(result: Result<(), PostError>, reason: &str) {
    let refused = result.expect_err("a full queue");
    assert_eq!(refused.accepted, 0);
    assert!(
        matches!(refused.error, Error::PostRejected(r) if r == reason),
        "refused with {:?}, expected {reason:?}",
        refused.error
    );
}

/// WRITEs of 8 bytes of `local` to `target`, `signaled[i]` saying which
/// ask for a CQE; `wr_id`s from `first`.
fn writes(
    first: u64,
    signaled: &[bool],
    local: &RegisteredBuf,
    target: &ExposedBuf<Vec<u8>>,
) -> (Vec<SendWr>, Vec<Sge>) {
    let sge = Sge {
        addr: local.as_ptr() as u64,
        len: 8,
        lkey: local.lkey(),
    };
    let wrs = signaled
        .iter()
        .enumerate()
        .map(|(i, &signaled)| {
            let mut wr = SendWr::new(
                first + i as u64,
                SendOpcode::Write,
                SgeSpan { start: 0, len: 1 },
            );
            if signaled {
                wr.flags |= SendFlags::SIGNALED;
            }
            wr.remote_addr = target.remote().addr();
            wr.rkey = target.remote().rkey();
            wr
        })
        .collect();
    (wrs, vec![sge])
}

fn post_writes(
    qp: &mut SoftQp,
    first: u64,
    signaled: &[bool],
    local: &RegisteredBuf,
    target: &ExposedBuf<Vec<u8>>,
) -> Result<(), PostError> {
    let (wrs, sges) = writes(first, signaled, local, target);
    // SAFETY: every element names bytes of `local` and every WRITE targets
    // `target`; both outlive the test's device work, which runs within it.
    unsafe { qp.post_send(&wrs, &sges) }
}

fn poll(cq: &mut impl CompletionQueue, max: usize) -> Vec<RawCompletion> {
    let mut out = vec![RawCompletion::default(); max];
    let n = cq.poll(&mut out).unwrap();
    out.truncate(n);
    out
}

/// A shared receive queue `DEPTH` deep.
fn shared_queue(dev: &SoftDevice, pd: &SoftPd) -> SoftSrq {
    let config = SrqConfig {
        max_wr: DEPTH,
        max_sge: 1,
    };
    dev.create_srq(pd, config).unwrap()
}

/// A queue pair on `cq` taking its receives from `srq`, connected to a
/// new queue pair of its own: (that one, its peer).
fn on_shared_queue(dev: &SoftDevice, pd: &SoftPd, cq: &SoftCq, srq: &SoftSrq) -> (SoftQp, SoftQp) {
    let receiver = dev.create_qp_on(pd, cq, Some(srq), config()).unwrap();
    let peer = dev.create_qp(pd, config()).unwrap();
    dev.connect(&peer, &receiver).unwrap();
    (receiver, peer)
}

#[test]
fn a_send_keeps_its_slot_until_its_completion_is_polled() {
    for progress in [Progress::Manual, Progress::Auto, Progress::NoOp] {
        let dev = SoftDevice::with_progress(progress);
        let pd = dev.alloc_pd();
        let (mut qp, _peer) = dev.connected_pair(&pd, &pd, config()).unwrap();
        let mut cq = qp.take_cq().unwrap();
        let local = RegisteredBuf::new(&pd, vec![7u8; 8]).unwrap();
        let target = ExposedBuf::new(&pd, vec![0u8; 8], RemoteAccess::WRITE).unwrap();

        post_writes(&mut qp, 0, &[true; DEPTH as usize], &local, &target).unwrap();
        dev.progress();
        assert_eq!(qp.control().queued_sends(), 0, "{progress:?}: all ran");
        // Every WRITE ran, but no CQE was polled: the queue is full.
        refused_as(
            post_writes(&mut qp, 10, &[true], &local, &target),
            "send queue full",
        );
        let first = poll(&mut cq, 1);
        assert_eq!(first[0].wr_id, 0);
        // One CQE polled, one slot back, and no more.
        post_writes(&mut qp, 10, &[true], &local, &target).unwrap();
        refused_as(
            post_writes(&mut qp, 11, &[true], &local, &target),
            "send queue full",
        );
        dev.progress();
        let rest = poll(&mut cq, 8);
        assert_eq!(
            rest.iter().map(|c| c.wr_id).collect::<Vec<_>>(),
            [1, 2, 3, 10]
        );
        post_writes(&mut qp, 20, &[true; DEPTH as usize], &local, &target).unwrap();
    }
}

#[test]
fn unsignaled_sends_keep_their_slots_until_a_later_completion_is_polled() {
    for progress in [Progress::Manual, Progress::NoOp] {
        let dev = SoftDevice::with_progress(progress);
        let pd = dev.alloc_pd();
        let (mut qp, _peer) = dev.connected_pair(&pd, &pd, config()).unwrap();
        let mut cq = qp.take_cq().unwrap();
        let local = RegisteredBuf::new(&pd, vec![7u8; 8]).unwrap();
        let target = ExposedBuf::new(&pd, vec![0u8; 8], RemoteAccess::WRITE).unwrap();

        // Three unsignaled: they run and never give their slots back alone.
        post_writes(&mut qp, 0, &[false; 3], &local, &target).unwrap();
        dev.progress();
        assert!(poll(&mut cq, 4).is_empty());
        post_writes(&mut qp, 3, &[true], &local, &target).unwrap();
        dev.progress();
        refused_as(
            post_writes(&mut qp, 4, &[true], &local, &target),
            "send queue full",
        );
        // The signaled one's CQE gives back all four.
        assert_eq!(
            poll(&mut cq, 4).iter().map(|c| c.wr_id).collect::<Vec<_>>(),
            [3]
        );
        post_writes(&mut qp, 4, &[true; DEPTH as usize], &local, &target).unwrap();
    }
}

#[test]
fn flushed_sends_give_their_slots_back_as_their_completions_are_polled() {
    let dev = SoftDevice::with_progress(Progress::Manual);
    let pd = dev.alloc_pd();
    let (mut qp, _peer) = dev.connected_pair(&pd, &pd, config()).unwrap();
    let mut cq = qp.take_cq().unwrap();
    let local = RegisteredBuf::new(&pd, vec![7u8; 8]).unwrap();
    let target = ExposedBuf::new(&pd, vec![0u8; 8], RemoteAccess::WRITE).unwrap();

    post_writes(&mut qp, 0, &[false; DEPTH as usize], &local, &target).unwrap();
    qp.set_error().unwrap();
    assert_eq!(qp.control().state(), Some(QpState::Error));
    // Each flushed send has a CQE; until they are polled, a post (which
    // would only be flushed) finds the queue full.
    refused_as(
        post_writes(&mut qp, 10, &[true], &local, &target),
        "send queue full",
    );
    let flushed = poll(&mut cq, 2);
    assert!(flushed.iter().all(|c| c.status == WcStatus::WrFlushErr));
    post_writes(&mut qp, 10, &[true, true], &local, &target).unwrap();
    refused_as(
        post_writes(&mut qp, 12, &[true], &local, &target),
        "send queue full",
    );
    let rest = poll(&mut cq, 8);
    assert_eq!(
        rest.iter().map(|c| c.wr_id).collect::<Vec<_>>(),
        [2, 3, 10, 11]
    );
}

/// Posts `n` receives of 8 bytes of `local` from `wr_id` `first`.
fn recvs(first: u64, n: usize, local: &RegisteredBuf) -> (Vec<RecvWr>, Vec<Sge>) {
    let sges = vec![
        Sge {
            addr: local.as_ptr() as u64,
            len: 8,
            lkey: local.lkey(),
        };
        n
    ];
    let wrs = (0..n)
        .map(|i| RecvWr {
            wr_id: first + i as u64,
            sges: SgeSpan {
                start: i as u32,
                len: 1,
            },
        })
        .collect();
    (wrs, sges)
}

/// Sends of 8 bytes, each signaled, from `qp`.
fn sends(qp: &mut SoftQp, n: usize, local: &RegisteredBuf) {
    let sge = Sge {
        addr: local.as_ptr() as u64,
        len: 8,
        lkey: local.lkey(),
    };
    let wrs: Vec<SendWr> = (0..n)
        .map(|i| {
            let mut wr = SendWr::new(
                100 + i as u64,
                SendOpcode::Send,
                SgeSpan { start: 0, len: 1 },
            );
            wr.flags |= SendFlags::SIGNALED;
            wr
        })
        .collect();
    // SAFETY: the element names bytes of `local`, which outlives the
    // device's work, run within the test.
    unsafe { qp.post_send(&wrs, &[sge]) }.unwrap();
}

#[test]
fn a_receive_keeps_its_slot_until_its_completion_is_polled() {
    let dev = SoftDevice::with_progress(Progress::Manual);
    let pd = dev.alloc_pd();
    let (mut sender, mut receiver) = dev.connected_pair(&pd, &pd, config()).unwrap();
    let mut receiver_cq = receiver.take_cq().unwrap();
    let local = RegisteredBuf::new(&pd, vec![0u8; 8]).unwrap();

    let (wrs, sges) = recvs(0, DEPTH as usize, &local);
    // SAFETY: every element names bytes of `local`, which outlives the
    // device's work, run within the test.
    unsafe { receiver.post_recv(&wrs, &sges) }.unwrap();
    sends(&mut sender, DEPTH as usize, &local);
    dev.progress();
    // Every receive took a message; none was polled.
    let (more, more_sges) = recvs(10, 1, &local);
    // SAFETY: as above.
    refused_as(
        unsafe { receiver.post_recv(&more, &more_sges) },
        "receive queue full",
    );
    assert_eq!(poll(&mut receiver_cq, 1)[0].wr_id, 0);
    // SAFETY: as above.
    unsafe { receiver.post_recv(&more, &more_sges) }.unwrap();
    let (again, again_sges) = recvs(11, 1, &local);
    // SAFETY: as above.
    refused_as(
        unsafe { receiver.post_recv(&again, &again_sges) },
        "receive queue full",
    );
}

#[test]
fn a_shared_receive_keeps_its_slot_until_its_completion_is_polled() {
    let dev = SoftDevice::with_progress(Progress::Manual);
    let pd = dev.alloc_pd();
    let cq = dev.create_cq(16).unwrap();
    let mut srq = shared_queue(&dev, &pd);
    let (receiver, mut sender) = on_shared_queue(&dev, &pd, &cq, &srq);
    let mut cq = cq;
    let local = RegisteredBuf::new(&pd, vec![0u8; 8]).unwrap();

    let (wrs, sges) = recvs(0, DEPTH as usize, &local);
    // SAFETY: every element names bytes of `local`, which outlives the
    // device's work, run within the test.
    unsafe { srq.post_recv(&wrs, &sges) }.unwrap();
    sends(&mut sender, 2, &local);
    dev.progress();
    assert_eq!(srq.posted(), 2, "two receives wait for messages");
    let (more, more_sges) = recvs(10, 1, &local);
    // SAFETY: as above.
    refused_as(
        unsafe { srq.post_recv(&more, &more_sges) },
        "shared receive queue full",
    );
    let got = poll(&mut cq, 1);
    assert_eq!((got[0].wr_id, got[0].qp_num), (0, receiver.qpn()));
    // SAFETY: as above.
    unsafe { srq.post_recv(&more, &more_sges) }.unwrap();
    // SAFETY: as above.
    refused_as(
        unsafe { srq.post_recv(&more, &more_sges) },
        "shared receive queue full",
    );
    drop(receiver);
}

/// `rnr_retry = 0` allows no retry: the first RNR NAK fails the send, in
/// auto mode as in manual mode.
#[test]
fn no_rnr_retry_fails_at_the_first_nak() {
    for progress in [Progress::Manual, Progress::Auto] {
        let dev = SoftDevice::with_progress(progress);
        let pd = dev.alloc_pd();
        let config = QpConfig {
            rnr_retry: 0,
            ..config()
        };
        let (mut sender, _receiver) = dev.connected_pair(&pd, &pd, config).unwrap();
        let mut cq = sender.take_cq().unwrap();
        let local = RegisteredBuf::new(&pd, vec![0u8; 8]).unwrap();
        sends(&mut sender, 1, &local);
        dev.progress();
        let done = poll(&mut cq, 1);
        assert_eq!(done.len(), 1, "{progress:?}: failed at once");
        assert_eq!(done[0].status, WcStatus::RnrRetryExcErr, "{progress:?}");
        assert_eq!(sender.control().counters().rnr_naks, 1, "{progress:?}");
    }
}

/// In auto mode the device looks at a waiting send at every post and
/// poll, but retries it (and counts a NAK) only once its RNR timer has
/// run since the last NAK: a send that runs out of retries counts
/// `rnr_retry + 1` NAKs, however often it was polled meanwhile.
#[test]
fn rnr_naks_are_counted_once_per_retry_however_often_the_device_is_polled() {
    let dev = SoftDevice::with_progress(Progress::Auto);
    let pd = dev.alloc_pd();
    let config = QpConfig {
        rnr_retry: 3,
        ..config()
    };
    let (mut sender, _receiver) = dev.connected_pair(&pd, &pd, config).unwrap();
    let mut cq = sender.take_cq().unwrap();
    let local = RegisteredBuf::new(&pd, vec![0u8; 8]).unwrap();
    sends(&mut sender, 1, &local);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let mut polls = 0u64;
    let done = loop {
        let done = poll(&mut cq, 1);
        if !done.is_empty() {
            break done;
        }
        polls += 1;
        assert!(
            std::time::Instant::now() < deadline,
            "the send never failed"
        );
    };
    assert_eq!(done[0].status, WcStatus::RnrRetryExcErr);
    assert_eq!(
        sender.control().counters().rnr_naks,
        4,
        "polled {polls} times"
    );
}

/// A WRITE under a key the responder never gave out fails the requester
/// with a remote access error, and the responder, moved to error too, is
/// told with `QpAccessError` on its queue pair.
#[test]
fn a_responders_access_violation_raises_its_event() {
    let dev = SoftDevice::with_progress(Progress::Manual);
    let events = dev.async_events().unwrap();
    let pd = dev.alloc_pd();
    let (mut requester, responder) = dev.connected_pair(&pd, &pd, config()).unwrap();
    let mut cq = requester.take_cq().unwrap();
    let local = RegisteredBuf::new(&pd, vec![7u8; 8]).unwrap();
    let target = ExposedBuf::new(&pd, vec![0u8; 8], RemoteAccess::READ).unwrap();
    post_writes(&mut requester, 0, &[true], &local, &target).unwrap();
    dev.progress();
    assert_eq!(poll(&mut cq, 1)[0].status, WcStatus::RemAccessErr);
    assert_eq!(responder.control().state(), Some(QpState::Error));
    assert_eq!(
        events.next_event().unwrap(),
        Some(AsyncEvent::QpAccessError {
            qp_num: responder.qpn()
        })
    );
    assert_eq!(events.next_event().unwrap(), None);
}

/// A misaligned atomic is an invalid request: the requester's completion
/// says so, and the responder goes to error with `QpRequestError`.
#[test]
fn a_misaligned_atomic_fails_the_responder_too() {
    let dev = SoftDevice::with_progress(Progress::Manual);
    let events = dev.async_events().unwrap();
    let pd = dev.alloc_pd();
    let (mut requester, responder) = dev.connected_pair(&pd, &pd, config()).unwrap();
    let mut cq = requester.take_cq().unwrap();
    let local = RegisteredBuf::new(&pd, vec![0u8; 8]).unwrap();
    let target = ExposedBuf::new(&pd, vec![0u8; 16], RemoteAccess::ATOMIC).unwrap();
    let mut add = SendWr::new(1, SendOpcode::FetchAdd, SgeSpan { start: 0, len: 1 });
    add.flags |= SendFlags::SIGNALED;
    add.remote_addr = target.remote().addr() + 4;
    add.rkey = target.remote().rkey();
    add.compare_add = 1;
    let sge = Sge {
        addr: local.as_ptr() as u64,
        len: 8,
        lkey: local.lkey(),
    };
    // SAFETY: the element names `local`'s 8 bytes and the atomic targets
    // `target`'s; both outlive the device's work, run within the test.
    unsafe { requester.post_send(&[add], &[sge]) }.unwrap();
    dev.progress();
    assert_eq!(poll(&mut cq, 1)[0].status, WcStatus::RemInvReqErr);
    assert_eq!(responder.control().state(), Some(QpState::Error));
    assert_eq!(
        events.next_event().unwrap(),
        Some(AsyncEvent::QpRequestError {
            qp_num: responder.qpn()
        })
    );
}

/// A responder on a shared receive queue reports its access error before
/// it says it will take no more receives from the queue.
#[test]
fn an_access_error_comes_before_the_last_receive_event() {
    let dev = SoftDevice::with_progress(Progress::Manual);
    let events = dev.async_events().unwrap();
    let pd = dev.alloc_pd();
    let cq = dev.create_cq(16).unwrap();
    let srq = shared_queue(&dev, &pd);
    let (responder, mut requester) = on_shared_queue(&dev, &pd, &cq, &srq);
    let local = RegisteredBuf::new(&pd, vec![7u8; 8]).unwrap();
    let target = ExposedBuf::new(&pd, vec![0u8; 8], RemoteAccess::READ).unwrap();
    post_writes(&mut requester, 0, &[true], &local, &target).unwrap();
    dev.progress();
    let qp_num = responder.qpn();
    assert_eq!(
        events.next_event().unwrap(),
        Some(AsyncEvent::QpAccessError { qp_num })
    );
    assert_eq!(
        events.next_event().unwrap(),
        Some(AsyncEvent::LastWqeReached { qp_num })
    );
    drop((responder, cq));
}

/// A completion queue overrun moves its queue pairs to error; one on a
/// shared receive queue says it takes no more of its receives, as for any
/// other move to error (and a later move to error says nothing again).
#[test]
fn an_overrun_ends_a_shared_queue_s_queue_pair_with_the_last_receive_event() {
    let dev = SoftDevice::with_progress(Progress::Manual);
    let events = dev.async_events().unwrap();
    let pd = dev.alloc_pd();
    let cq = dev.create_cq(16).unwrap();
    let srq = shared_queue(&dev, &pd);
    let (mut responder, _requester) = on_shared_queue(&dev, &pd, &cq, &srq);
    responder.control().overrun_cq();
    let qp_num = responder.qpn();
    assert!(matches!(
        events.next_event().unwrap(),
        Some(AsyncEvent::CqError { .. })
    ));
    assert_eq!(
        events.next_event().unwrap(),
        Some(AsyncEvent::LastWqeReached { qp_num })
    );
    responder.set_error().unwrap();
    assert_eq!(events.next_event().unwrap(), None);
    drop((responder, cq));
}

/// The receives a shared receive queue gave out come back to it when the
/// completion queue holding their unpolled CQEs is destroyed: nobody can
/// poll those any more, and the queue pairs on other completion queues
/// must not find the queue full for good.
#[test]
fn a_dropped_completion_queue_gives_back_its_shared_receives() {
    let dev = SoftDevice::with_progress(Progress::Manual);
    let pd = dev.alloc_pd();
    let (cq_a, cq_b) = (dev.create_cq(16).unwrap(), dev.create_cq(16).unwrap());
    let mut srq = shared_queue(&dev, &pd);
    let a = dev.create_qp_on(&pd, &cq_a, Some(&srq), config()).unwrap();
    let b = dev.create_qp_on(&pd, &cq_b, Some(&srq), config()).unwrap();
    let mut sender = dev.create_qp(&pd, config()).unwrap();
    dev.connect(&sender, &a).unwrap();
    let local = RegisteredBuf::new(&pd, vec![0u8; 8]).unwrap();
    let (wrs, sges) = recvs(0, DEPTH as usize, &local);
    // SAFETY: every element names bytes of `local`, which outlives the
    // device's work, run within the test.
    unsafe { srq.post_recv(&wrs, &sges) }.unwrap();
    sends(&mut sender, 2, &local);
    dev.progress();
    let (more, more_sges) = recvs(10, 1, &local);
    // SAFETY: as above.
    refused_as(
        unsafe { srq.post_recv(&more, &more_sges) },
        "shared receive queue full",
    );
    // A's completion queue goes with its two unpolled CQEs.
    drop(a);
    drop(cq_a);
    let (two, two_sges) = recvs(10, 2, &local);
    // SAFETY: as above.
    unsafe { srq.post_recv(&two, &two_sges) }.unwrap();
    drop((b, cq_b));
}

/// A channel armed for solicited events wakes for a SEND or WRITE with
/// immediate that asked for one, not for another message's receive nor
/// for its own sends; armed for any CQE first, that wider request stands.
#[test]
fn a_solicited_arm_wakes_only_for_what_asked() {
    let dev = SoftDevice::with_progress(Progress::Manual);
    let pd = dev.alloc_pd();
    let (mut sender, receiver) = dev.connected_pair(&pd, &pd, config()).unwrap();
    let mut receiver = receiver;
    let mut cq = receiver.take_cq().unwrap();
    let events = cq.completion_events().unwrap();
    let local = RegisteredBuf::new(&pd, vec![0u8; 8]).unwrap();
    let (wrs, sges) = recvs(0, 3, &local);
    // SAFETY: every element names bytes of `local`, which outlives the
    // device's work, run within the test.
    unsafe { receiver.post_recv(&wrs, &sges) }.unwrap();
    let send = |sender: &mut SoftQp, id: u64, flags: SendFlags| {
        let mut wr = SendWr::new(id, SendOpcode::Send, SgeSpan { start: 0, len: 1 });
        wr.flags = flags;
        let sge = Sge {
            addr: local.as_ptr() as u64,
            len: 8,
            lkey: local.lkey(),
        };
        // SAFETY: the element names `local`'s bytes, which outlive the
        // device's work, run within the test.
        unsafe { sender.post_send(&[wr], &[sge]) }.unwrap();
        dev.progress();
    };
    events.arm_solicited().unwrap();
    send(&mut sender, 1, SendFlags::SIGNALED);
    assert_eq!(poll(&mut cq, 4).len(), 1, "the message arrived");
    assert_eq!(events.take().unwrap(), 0, "and woke no one");
    send(&mut sender, 2, SendFlags::SIGNALED | SendFlags::SOLICITED);
    assert_eq!(events.take().unwrap(), 1);
    // Armed for any CQE, then for solicited ones: any CQE still wakes.
    events.arm().unwrap();
    events.arm_solicited().unwrap();
    send(&mut sender, 3, SendFlags::SIGNALED);
    assert_eq!(events.take().unwrap(), 1);
    assert_eq!(poll(&mut cq, 4).len(), 2);
}

/// Memory a peer may write must be writable by the device locally too:
/// ibv_reg_mr refuses REMOTE_WRITE or REMOTE_ATOMIC without LOCAL_WRITE,
/// and so does the soft device, so a registration that only the soft
/// device would take cannot hide in a test.
#[test]
fn remote_write_without_local_write_is_refused_at_registration() {
    use rdma_ring::backend::{Access, ProtectionDomain};
    let dev = SoftDevice::new();
    let pd = dev.alloc_pd();
    let mut memory = vec![0u8; 64];
    for access in [
        Access::REMOTE_WRITE,
        Access::REMOTE_ATOMIC | Access::REMOTE_READ,
    ] {
        // SAFETY: `memory` outlives every registration made here (a
        // refused one holds nothing).
        let refused = unsafe { pd.register_raw(memory.as_mut_ptr(), memory.len(), access) };
        assert!(
            matches!(&refused, Err(Error::Soft(why)) if why.contains("LOCAL_WRITE")),
            "{access:?}: {:?}",
            refused.err()
        );
    }
    for access in [
        Access::REMOTE_READ,
        Access::REMOTE_WRITE | Access::LOCAL_WRITE,
        Access::REMOTE_ATOMIC | Access::LOCAL_WRITE,
    ] {
        // SAFETY: as above; the region is dropped before `memory`.
        let mr = unsafe { pd.register_raw(memory.as_mut_ptr(), memory.len(), access) };
        assert!(mr.is_ok(), "{access:?}");
    }
}

/// A queue pair asking for more inline bytes than a NIC grants gets the
/// device's most, and its caps say so: an inline send beyond that is
/// refused, as a NIC's would be.
#[test]
fn inline_data_is_granted_up_to_the_device_s_most() {
    use rdma_ring::backend::soft::MAX_INLINE;
    let dev = SoftDevice::new();
    let pd = dev.alloc_pd();
    let config = QpConfig {
        max_inline_data: 4096,
        ..QpConfig::default()
    };
    let (mut qp, _peer) = dev.connected_pair(&pd, &pd, config).unwrap();
    assert_eq!(qp.caps().max_inline_data, MAX_INLINE);
    let local = RegisteredBuf::new(&pd, vec![0u8; 4096]).unwrap();
    let mut wr = SendWr::new(1, SendOpcode::Send, SgeSpan { start: 0, len: 1 });
    wr.flags = SendFlags::INLINE | SendFlags::SIGNALED;
    let sge = Sge {
        addr: local.as_ptr() as u64,
        len: MAX_INLINE + 1,
        lkey: local.lkey(),
    };
    // SAFETY: the element names bytes of `local`, alive past the post.
    let refused = unsafe { qp.post_send(&[wr], &[sge]) }.unwrap_err();
    assert!(
        matches!(refused.error, Error::PostRejected(r) if r.contains("max_inline_data")),
        "{:?}",
        refused.error
    );
}

/// Completions held back for late ACKs come in order after release, and
/// before the flush of a queue pair that fails meanwhile; no-op mode,
/// which would complete new work ahead of them, is refused while any are
/// held.
#[test]
fn held_acks_keep_their_order_before_a_flush_and_refuse_no_op_mode() {
    use rdma_ring::backend::soft::{Progress, SoftDevice};
    use rdma_ring::backend::{QpConfig, WcStatus};
    use rdma_ring::buf::{ExposedBuf, RegisteredBuf, RemoteAccess};
    use rdma_ring::op::Write;
    use rdma_ring::ring::{Ring, RingConfig};
    let dev = SoftDevice::new();
    let pd = dev.alloc_pd();
    let (qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    let control = qp.control();
    let mut ring = Ring::new(
        qp,
        RingConfig {
            signal_interval: 1,
            ..RingConfig::default()
        },
    );
    let target = ExposedBuf::new(&pd, vec![0u8; 64], RemoteAccess::WRITE).unwrap();
    let write = |tag: u64| {
        Write::new(
            RegisteredBuf::new(&pd, vec![1u8; 8]).unwrap(),
            target.remote(),
        )
        .user_data(tag)
    };
    control.hold_acks();
    for tag in 0..3 {
        ring.submission().push(write(tag)).unwrap();
    }
    ring.submit().unwrap();
    assert_eq!(control.counters().executed, 3, "they ran");
    assert!(ring.completion().poll().unwrap().is_none(), "held back");
    let refused = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        dev.set_progress(Progress::NoOp)
    }));
    assert!(refused.is_err(), "no-op mode while completions are held");
    // One more that fails: the held three come first, then its error.
    control.fail_nth(1, WcStatus::RemAccessErr);
    ring.submission().push(write(3)).unwrap();
    ring.submit().unwrap();
    let done = ring.completion().wait(4).unwrap();
    let got: Vec<_> = done.iter().map(|c| (c.user_data(), c.status())).collect();
    assert_eq!(
        got,
        vec![
            (0, WcStatus::Success),
            (1, WcStatus::Success),
            (2, WcStatus::Success),
            (3, WcStatus::RemAccessErr)
        ]
    );
    control.release_acks();
    dev.set_progress(Progress::NoOp);
}

/// Completions held for late ACKs are not complete when their queue pair
/// goes to error for a reason that acknowledges nothing: moved to error by
/// its owner (or a fatal event), they are flushed; with the path to the
/// peer gone, the oldest fails with `RetryExcErr` and the rest, the work
/// request that found the path gone included, are flushed.
#[test]
fn held_acks_are_flushed_by_an_error_that_acknowledges_nothing() {
    let held = |qp: &mut SoftQp, cq: &mut SoftCq, pd: &SoftPd, n: usize| {
        let local = RegisteredBuf::new(pd, vec![7u8; 8]).unwrap();
        let target = ExposedBuf::new(pd, vec![0u8; 8], RemoteAccess::WRITE).unwrap();
        qp.control().hold_acks();
        post_writes(qp, 0, &vec![true; n], &local, &target).unwrap();
        assert_eq!(qp.control().counters().executed, n as u64, "they ran");
        assert!(poll(cq, 4).is_empty(), "held back");
        (local, target)
    };
    let statuses = |cq: &mut SoftCq| -> Vec<(u64, WcStatus)> {
        poll(cq, 8).iter().map(|c| (c.wr_id, c.status)).collect()
    };
    let dev = SoftDevice::new();
    let pd = dev.alloc_pd();

    // Moved to error by its owner.
    let (mut qp, _peer) = dev.connected_pair(&pd, &pd, config()).unwrap();
    let mut cq = qp.take_cq().unwrap();
    let _bufs = held(&mut qp, &mut cq, &pd, 2);
    qp.set_error().unwrap();
    assert_eq!(
        statuses(&mut cq),
        vec![(0, WcStatus::WrFlushErr), (1, WcStatus::WrFlushErr)]
    );

    // The path to the peer gone: the next work request finds no ACK comes.
    let (mut qp, _peer) = dev.connected_pair(&pd, &pd, config()).unwrap();
    let mut cq = qp.take_cq().unwrap();
    let (local, target) = held(&mut qp, &mut cq, &pd, 2);
    qp.control().break_connection();
    post_writes(&mut qp, 2, &[true], &local, &target).unwrap();
    assert_eq!(
        statuses(&mut cq),
        vec![
            (0, WcStatus::RetryExcErr),
            (1, WcStatus::WrFlushErr),
            (2, WcStatus::WrFlushErr)
        ]
    );
}

/// An injected fault that says the responder failed (a remote access
/// error, an invalid request, a remote operational error) fails the
/// responder too, as the real fault would: it goes to error, flushing its
/// receives, and for the first two says so with its event.
#[test]
fn an_injected_responder_fault_fails_the_responder_too() {
    /// The event a responder's fault raises, named by its queue pair.
    type Event = fn(u32) -> AsyncEvent;
    let cases: [(WcStatus, Option<Event>); 3] = [
        (
            WcStatus::RemAccessErr,
            Some(|qp_num| AsyncEvent::QpAccessError { qp_num }),
        ),
        (
            WcStatus::RemInvReqErr,
            Some(|qp_num| AsyncEvent::QpRequestError { qp_num }),
        ),
        (WcStatus::RemOpErr, None),
    ];
    for (status, event) in cases {
        let dev = SoftDevice::with_progress(Progress::Manual);
        let events = dev.async_events().unwrap();
        let pd = dev.alloc_pd();
        let (mut requester, mut responder) = dev.connected_pair(&pd, &pd, config()).unwrap();
        let mut cq = requester.take_cq().unwrap();
        let mut responder_cq = responder.take_cq().unwrap();
        let receive = RegisteredBuf::new(&pd, vec![0u8; 8]).unwrap();
        let (wrs, sges) = recvs(9, 1, &receive);
        // SAFETY: the receive names `receive`, which outlives the device's
        // use of it (flushed below, within the test).
        unsafe { responder.post_recv(&wrs, &sges) }.unwrap();
        let local = RegisteredBuf::new(&pd, vec![7u8; 8]).unwrap();
        let target = ExposedBuf::new(&pd, vec![0u8; 8], RemoteAccess::WRITE).unwrap();
        requester.control().fail_nth(1, status);
        post_writes(&mut requester, 0, &[true], &local, &target).unwrap();
        dev.progress();
        assert_eq!(poll(&mut cq, 1)[0].status, status);
        assert_eq!(
            responder.control().state(),
            Some(QpState::Error),
            "{status}"
        );
        let flushed: Vec<_> = poll(&mut responder_cq, 2)
            .iter()
            .map(|c| (c.wr_id, c.status))
            .collect();
        assert_eq!(flushed, vec![(9, WcStatus::WrFlushErr)], "{status}");
        assert_eq!(
            events.next_event().unwrap(),
            event.map(|event| event(responder.qpn())),
            "{status}"
        );
    }
}

/// A gather list longer in all than the largest message the device
/// announces (2 GiB; here one region named three times) fails with a
/// local length error, as a NIC's would, rather than run.
#[test]
fn a_message_past_the_largest_fails_with_a_length_error() {
    let dev = SoftDevice::new();
    let pd = dev.alloc_pd();
    let (mut qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    let mut cq = qp.take_cq().unwrap();
    // Never written: the pages stay untouched.
    let local = RegisteredBuf::new(&pd, vec![0u8; 1 << 30]).unwrap();
    let target = ExposedBuf::new(&pd, vec![0u8; 8], RemoteAccess::WRITE).unwrap();
    let sge = Sge {
        addr: local.as_ptr() as u64,
        len: 1 << 30,
        lkey: local.lkey(),
    };
    let mut wr = SendWr::new(7, SendOpcode::Write, SgeSpan { start: 0, len: 3 });
    wr.flags |= SendFlags::SIGNALED;
    wr.remote_addr = target.remote().addr();
    wr.rkey = target.remote().rkey();
    // SAFETY: every element names bytes of `local`, and the WRITE targets
    // `target`; both outlive the device's use of them (it fails at once).
    unsafe { qp.post_send(&[wr], &[sge; 3]) }.unwrap();
    let done = poll(&mut cq, 1);
    assert_eq!((done[0].wr_id, done[0].status), (7, WcStatus::LocLenErr));
}
