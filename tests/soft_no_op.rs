//! The soft device's no-op mode (what the instruction benchmark measures)
//! against a model of what a post must do there: the same checks, in the
//! same order, as in every other mode; a CQE for each signaled work
//! request accepted, carrying its bytes; an overrun of a full completion
//! queue that puts its queue pair in error, after which every work
//! request is accepted and flushed, and its CQE dropped (on every queue
//! pair of a shared queue). No-op mode takes a shortcut behind an empty
//! send queue, so this checks the shortcut and the general path it hands
//! over to agree with the model, and that a later mode finds the queue
//! pair's send numbering where the shortcut left it. A send's slot stays
//! held until a polled CQE (its own or a later send's) gives it back, as
//! on hardware, so a send queue fills with work that has long run.

use std::time::{Duration, Instant};

use proptest::prelude::*;

use rdma_ring::backend::soft::{Progress, QpState, SoftDevice};
use rdma_ring::backend::{
    CompletionQueue, QpConfig, QueuePair, RawCompletion, RecvWr, SendFlags, SendOpcode, SendWr,
    Sge, SgeSpan, WcStatus,
};
use rdma_ring::buf::{ExposedBuf, RegisteredBuf, RemoteAccess};
use rdma_ring::Error;

const MAX_SGE: u32 = 2;
const MAX_INLINE: u32 = 32;
const CQ_DEPTH: u32 = 6;
const SEND_DEPTH: u32 = 8;

/// One work request as the strategy makes it: where its span starts and
/// how long it is (possibly past the end of the list), whether it is
/// signaled or inline.
#[derive(Clone, Debug)]
struct Wr {
    start: u32,
    len: u32,
    signaled: bool,
    inline: bool,
}

#[derive(Clone, Debug)]
enum Step {
    /// A post of these work requests, over elements of these lengths.
    Post(Vec<Wr>, Vec<u32>),
    /// A poll for at most this many CQEs.
    Poll(usize),
}

fn step() -> impl Strategy<Value = Step> {
    let wr = (0u32..5, 0u32..4, any::<bool>(), prop::bool::weighted(0.2)).prop_map(
        |(start, len, signaled, inline)| Wr {
            start,
            len,
            signaled,
            inline,
        },
    );
    prop_oneof![
        3 => (prop::collection::vec(wr, 0..6), prop::collection::vec(1u32..24, 0..5))
            .prop_map(|(wrs, lens)| Step::Post(wrs, lens)),
        1 => (1usize..4).prop_map(Step::Poll),
    ]
}

/// What the device should hold. The queue pair is in error exactly when
/// its completion queue overran.
#[derive(Default)]
struct Model {
    cqes: Vec<(u64, WcStatus, u32)>,
    /// The send sequence number of each CQE in `cqes`: what polling it
    /// gives back.
    cqe_seqs: Vec<u64>,
    /// Send work requests accepted (the last one's sequence number).
    accepted: u64,
    /// The last send whose slot a polled CQE gave back.
    released_through: u64,
    overrun: bool,
    send_posts: u64,
    send_wrs: u64,
    /// The `wr_id` of the next work request posted: unique in a run.
    next_id: u64,
}

impl Model {
    fn push(&mut self, cqe: (u64, WcStatus, u32)) {
        if self.overrun {
            return;
        }
        if self.cqes.len() >= CQ_DEPTH as usize {
            self.overrun = true;
            return;
        }
        self.cqes.push(cqe);
        self.cqe_seqs.push(self.accepted);
    }

    /// Takes the next `n` CQEs as a poll does, giving back their slots.
    fn poll(&mut self, n: usize) -> Vec<(u64, WcStatus, u32)> {
        let n = n.min(self.cqes.len());
        for seq in self.cqe_seqs.drain(..n) {
            self.released_through = self.released_through.max(seq);
        }
        self.cqes.drain(..n).collect()
    }

    /// Sends whose slots are not yet given back.
    fn held(&self) -> u64 {
        self.accepted - self.released_through
    }

    /// The post's outcome: how many were accepted and why the next was
    /// refused, if one was.
    fn post(&mut self, wrs: &[Wr], lens: &[u32]) -> (usize, Option<&'static str>) {
        self.send_posts += 1;
        let first = self.next_id;
        self.next_id += wrs.len() as u64;
        for (i, wr) in wrs.iter().enumerate() {
            let id = first + i as u64;
            if self.held() >= u64::from(SEND_DEPTH) {
                return (i, Some("send queue full"));
            }
            let end = (wr.start + wr.len) as usize;
            if end > lens.len() {
                return (i, Some("scatter/gather span out of range"));
            }
            if wr.len > MAX_SGE {
                return (i, Some("more scatter/gather elements than max_send_sge"));
            }
            let bytes: u32 = lens[wr.start as usize..end].iter().sum();
            if wr.inline && bytes > MAX_INLINE {
                return (i, Some("inline payload exceeds max_inline_data"));
            }
            self.send_wrs += 1;
            self.accepted += 1;
            if self.overrun {
                self.push((id, WcStatus::WrFlushErr, 0));
            } else if wr.signaled {
                self.push((id, WcStatus::Success, bytes));
            }
        }
        (wrs.len(), None)
    }
}

/// Runs `steps` against the model, on a queue pair with a completion
/// queue of its own or (`shared`) one it shares with a second, idle
/// queue pair; then, unless the queue overran, a WRITE in manual mode,
/// which must run as the next send in order.
fn run(steps: Vec<Step>, shared: bool) -> Result<(), TestCaseError> {
    let dev = SoftDevice::with_progress(Progress::NoOp);
    let pd = dev.alloc_pd();
    let config = QpConfig {
        cq_entries: CQ_DEPTH,
        max_send_wr: SEND_DEPTH,
        max_send_sge: MAX_SGE,
        max_inline_data: MAX_INLINE,
        ..QpConfig::default()
    };
    let (mut qp, mut cq, neighbour, _peers) = if shared {
        let cq = dev.create_cq(CQ_DEPTH).unwrap();
        let qp = dev.create_qp_on(&pd, &cq, None, config).unwrap();
        let neighbour = dev.create_qp_on(&pd, &cq, None, config).unwrap();
        let peers = [
            dev.create_qp(&pd, config).unwrap(),
            dev.create_qp(&pd, config).unwrap(),
        ];
        dev.connect(&qp, &peers[0]).unwrap();
        dev.connect(&neighbour, &peers[1]).unwrap();
        (
            qp,
            cq,
            Some(neighbour),
            peers.into_iter().collect::<Vec<_>>(),
        )
    } else {
        let (mut qp, peer) = dev.connected_pair(&pd, &pd, config).unwrap();
        let cq = qp.take_cq().unwrap();
        (qp, cq, None, vec![peer])
    };
    let control = qp.control();
    let local = RegisteredBuf::new(&pd, vec![0u8; 4 * 24]).unwrap();
    let mut model = Model::default();
    for step in steps {
        match step {
            Step::Post(wrs, lens) => {
                let sges: Vec<Sge> = lens
                    .iter()
                    .enumerate()
                    .map(|(i, &len)| Sge {
                        addr: local.as_ptr() as u64 + 24 * (i as u64 % 4),
                        len,
                        lkey: local.lkey(),
                    })
                    .collect();
                let first = model.next_id;
                let work: Vec<SendWr> = wrs
                    .iter()
                    .enumerate()
                    .map(|(i, wr)| {
                        let span = SgeSpan {
                            start: wr.start,
                            len: wr.len,
                        };
                        let mut send = SendWr::new(first + i as u64, SendOpcode::Send, span);
                        if wr.signaled {
                            send.flags |= SendFlags::SIGNALED;
                        }
                        if wr.inline {
                            send.flags |= SendFlags::INLINE;
                        }
                        send
                    })
                    .collect();
                // SAFETY: no-op mode touches no memory; every element names
                // bytes of `local`, which outlives the device's queue pair.
                let got = unsafe { qp.post_send(&work, &sges) };
                let (accepted, refused) = model.post(&wrs, &lens);
                match (got, refused) {
                    (Ok(()), None) => {}
                    (Err(e), Some(reason)) => {
                        prop_assert_eq!(e.accepted, accepted);
                        prop_assert!(
                            matches!(e.error, Error::PostRejected(r) if r == reason),
                            "refused with {:?}, expected {:?}",
                            e.error,
                            reason
                        );
                    }
                    (got, refused) => {
                        prop_assert!(false, "post gave {:?}, expected {:?}", got, refused)
                    }
                }
            }
            Step::Poll(max) => {
                let mut out = [RawCompletion::default(); 4];
                match cq.poll(&mut out[..max]) {
                    Ok(n) => {
                        let want = model.poll(n);
                        let got: Vec<_> = out[..n]
                            .iter()
                            .map(|c| (c.wr_id, c.status, c.byte_len))
                            .collect();
                        prop_assert_eq!(got, want);
                        prop_assert!(n == max || model.cqes.is_empty());
                        prop_assert!(out[..n].iter().all(|c| c.qp_num == qp.qpn()));
                    }
                    Err(e) => {
                        prop_assert!(matches!(e, Error::CqOverrun), "poll failed: {:?}", e);
                        prop_assert!(model.overrun && model.cqes.is_empty());
                    }
                }
            }
        }
        let counters = control.counters();
        prop_assert_eq!(counters.send_posts, model.send_posts);
        prop_assert_eq!(counters.send_wrs, model.send_wrs);
        let state = control.state().unwrap();
        prop_assert_eq!(state == QpState::Error, model.overrun);
        if let Some(neighbour) = &neighbour {
            let state = neighbour.control().state().unwrap();
            prop_assert_eq!(state == QpState::Error, model.overrun);
        }
        prop_assert_eq!(control.queued_sends(), 0);
    }
    if model.overrun {
        return Ok(());
    }
    // The shortcut numbered every send it took and reported the signaled
    // ones: a send queued now must come after them (the device asserts
    // it before running one).
    let mut out = [RawCompletion::default(); CQ_DEPTH as usize];
    let before = cq.poll(&mut out).unwrap();
    prop_assert_eq!(before, model.cqes.len());
    model.poll(before);
    dev.set_progress(Progress::Manual);
    let target = ExposedBuf::new(&pd, vec![0u8; 8], RemoteAccess::WRITE).unwrap();
    let sge = Sge {
        addr: local.as_ptr() as u64,
        len: 8,
        lkey: local.lkey(),
    };
    let mut write = SendWr::new(u64::MAX, SendOpcode::Write, SgeSpan { start: 0, len: 1 });
    write.flags = SendFlags::SIGNALED;
    write.remote_addr = target.remote().addr();
    write.rkey = target.remote().rkey();
    // SAFETY: the element names bytes of `local`, and the WRITE targets
    // `target`'s; both outlive the step below, which runs it.
    let posted = unsafe { qp.post_send(&[write], &[sge]) };
    if model.held() >= u64::from(SEND_DEPTH) {
        // Unsignaled sends after the last CQE keep their slots for good.
        let refused = posted.expect_err("a send queue full of unreleased sends");
        prop_assert!(matches!(
            refused.error,
            Error::PostRejected("send queue full")
        ));
        return Ok(());
    }
    posted.unwrap();
    prop_assert_eq!(control.queued_sends(), 1);
    prop_assert!(control.step());
    prop_assert_eq!(cq.poll(&mut out).unwrap(), 1);
    prop_assert_eq!((out[0].wr_id, out[0].status), (u64::MAX, WcStatus::Success));
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn no_op_posts_match_the_model(
        steps in prop::collection::vec(step(), 1..24),
        shared in any::<bool>(),
    ) {
        run(steps, shared)?;
    }
}

/// The cases the model exists for, made sure of: a refusal midway keeps
/// the CQEs of those before it, and a full queue overruns at the CQE that
/// does not fit, with the rest of the post flushed into nothing.
#[test]
fn a_refusal_midway_and_an_overrun() {
    let signaled = |start| Wr {
        start,
        len: 1,
        signaled: true,
        inline: false,
    };
    let bad = Wr {
        start: 9,
        len: 1,
        signaled: true,
        inline: false,
    };
    let steps = vec![
        Step::Post(vec![signaled(0), signaled(1), bad.clone()], vec![3, 5]),
        Step::Poll(3),
        Step::Post((0..8).map(|_| signaled(0)).collect(), vec![7]),
        Step::Poll(3),
        Step::Poll(3),
        Step::Poll(3),
        Step::Post(vec![signaled(0)], vec![7]),
        Step::Poll(1),
    ];
    run(steps.clone(), false).unwrap();
    run(steps, true).unwrap();
    // And without an overrun, so that a manual-mode send follows.
    run(
        vec![
            Step::Post(vec![signaled(0), signaled(1), bad], vec![3, 5]),
            Step::Post(vec![signaled(0), signaled(0)], vec![4]),
        ],
        false,
    )
    .unwrap();
}

/// A post refused partway still tells whoever waits on the completion
/// channel about the CQEs of what it accepted.
#[test]
fn a_post_refused_partway_wakes_a_waiting_thread() {
    for recv in [false, true] {
        let dev = SoftDevice::with_progress(Progress::NoOp);
        let pd = dev.alloc_pd();
        let (mut qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
        let mut cq = qp.take_cq().unwrap();
        let events = cq
            .completion_events()
            .expect("the soft device has channels");
        events.arm().unwrap();
        let local = RegisteredBuf::new(&pd, vec![0u8; 64]).unwrap();
        let sges = [Sge {
            addr: local.as_ptr() as u64,
            len: 64,
            lkey: local.lkey(),
        }];
        let waiter = {
            let events = events.clone();
            std::thread::spawn(move || {
                let start = Instant::now();
                let woken = events.wait(Duration::from_secs(30)).unwrap();
                (woken, start.elapsed())
            })
        };
        // Let the waiter block first: a CQE before it waits is found
        // without a wake-up.
        std::thread::sleep(Duration::from_millis(200));
        let good = SgeSpan { start: 0, len: 1 };
        let bad = SgeSpan { start: 5, len: 1 };
        // SAFETY: no-op mode touches no memory; the element names bytes of
        // `local`, which outlives the queue pair.
        let refused = unsafe {
            if recv {
                let wrs = [
                    RecvWr {
                        wr_id: 1,
                        sges: good,
                    },
                    RecvWr {
                        wr_id: 2,
                        sges: bad,
                    },
                ];
                qp.post_recv(&wrs, &sges)
            } else {
                let mut wrs = [
                    SendWr::new(1, SendOpcode::Send, good),
                    SendWr::new(2, SendOpcode::Send, bad),
                ];
                wrs[0].flags = SendFlags::SIGNALED;
                qp.post_send(&wrs, &sges)
            }
        }
        .unwrap_err();
        assert_eq!(refused.accepted, 1);
        let (woken, waited) = waiter.join().unwrap();
        assert!(woken);
        assert!(
            waited < Duration::from_secs(20),
            "the waiter slept {waited:?}: the refused post (receive: {recv}) woke nobody"
        );
        let mut out = [RawCompletion::default(); 2];
        assert_eq!(cq.poll(&mut out).unwrap(), 1);
        assert_eq!(out[0].wr_id, 1);
    }
}
