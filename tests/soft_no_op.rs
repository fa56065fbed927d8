//! The soft device's no-op mode (what the instruction benchmark measures)
//! against a model of what a post must do there: the same checks, in the
//! same order, as in every other mode; a CQE for each signaled work
//! request accepted, carrying its bytes; an overrun of a full completion
//! queue that puts its queue pair in error, after which every work
//! request is accepted and flushed, and its CQE dropped. No-op mode takes
//! a shortcut behind an empty send queue, so this checks the shortcut and
//! the general path it hands over to agree with the model.

use proptest::prelude::*;

use rdma_ring::backend::soft::{Progress, QpState, SoftDevice};
use rdma_ring::backend::{
    CompletionQueue, QpConfig, QueuePair, RawCompletion, SendFlags, SendOpcode, SendWr, Sge,
    SgeSpan, WcStatus,
};
use rdma_ring::buf::RegisteredBuf;
use rdma_ring::Error;

const MAX_SGE: u32 = 2;
const MAX_INLINE: u32 = 32;
const CQ_DEPTH: u32 = 6;

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

/// What the device should hold.
#[derive(Default)]
struct Model {
    cqes: Vec<(u64, WcStatus, u32)>,
    overrun: bool,
    error: bool,
    send_posts: u64,
    send_wrs: u64,
}

impl Model {
    fn push(&mut self, cqe: (u64, WcStatus, u32)) {
        if self.overrun {
            return;
        }
        if self.cqes.len() >= CQ_DEPTH as usize {
            self.overrun = true;
            self.error = true;
            return;
        }
        self.cqes.push(cqe);
    }

    /// The post's outcome: how many were accepted and why the next was
    /// refused, if one was.
    fn post(&mut self, wrs: &[Wr], lens: &[u32]) -> (usize, Option<&'static str>) {
        self.send_posts += 1;
        for (i, wr) in wrs.iter().enumerate() {
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
            if self.error {
                self.push((i as u64, WcStatus::WrFlushErr, 0));
            } else if wr.signaled {
                self.push((i as u64, WcStatus::Success, bytes));
            }
        }
        (wrs.len(), None)
    }
}

fn run(steps: Vec<Step>) -> Result<(), TestCaseError> {
    let dev = SoftDevice::with_progress(Progress::NoOp);
    let pd = dev.alloc_pd();
    let config = QpConfig {
        cq_entries: CQ_DEPTH,
        max_send_sge: MAX_SGE,
        max_inline_data: MAX_INLINE,
        ..QpConfig::default()
    };
    let (mut qp, _peer) = dev.connected_pair(&pd, &pd, config).unwrap();
    let control = qp.control();
    let mut cq = qp.take_cq().unwrap();
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
                let work: Vec<SendWr> = wrs
                    .iter()
                    .enumerate()
                    .map(|(i, wr)| {
                        let span = SgeSpan {
                            start: wr.start,
                            len: wr.len,
                        };
                        let mut send = SendWr::new(i as u64, SendOpcode::Send, span);
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
                        let want: Vec<_> = model.cqes.drain(..n.min(model.cqes.len())).collect();
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
        prop_assert_eq!(state == QpState::Error, model.error);
        prop_assert_eq!(control.queued_sends(), 0);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn no_op_posts_match_the_model(steps in prop::collection::vec(step(), 1..24)) {
        run(steps)?;
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
    run(vec![
        Step::Post(vec![signaled(0), signaled(1), bad], vec![3, 5]),
        Step::Poll(3),
        Step::Post((0..8).map(|_| signaled(0)).collect(), vec![7]),
        Step::Poll(3),
        Step::Poll(3),
        Step::Poll(3),
        Step::Post(vec![signaled(0)], vec![7]),
        Step::Poll(1),
    ])
    .unwrap();
}
