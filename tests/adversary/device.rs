//! The device side of an adversarial scenario, shared by the harness of
//! each ring: the soft device in manual progress, its misbehaving queue
//! pairs and completion queue (through the knobs), and the honest peers.

use std::sync::Arc;

use rdma_ring::backend::soft::{Progress, QpControl, SoftCq, SoftDevice, SoftPd, SoftQp, SoftSrq};
use rdma_ring::backend::{QpConfig, RawCompletion, WcStatus};
use rdma_ring::buf::{ExposedBuf, RegisteredBuf, RemoteAccess, RemoteSlice};
use rdma_ring::op::{Recv, Send};
use rdma_ring::ring::{Ring, RingConfig};

use super::{AdvCq, AdvQp, Shared, Step, LEN, POISON, QPS};

/// A peer's received message holds no poison: the ring's buffer was not
/// handed back before the device read it.
fn check_no_poison(completions: Vec<rdma_ring::ring::Completion>) {
    for c in completions {
        if c.kind() == rdma_ring::op::OpKind::Recv && c.status().is_success() {
            for buf in c.into_bufs() {
                let buf: RegisteredBuf = buf.downcast().expect("a RegisteredBuf");
                assert!(
                    !buf.contains(&POISON),
                    "a peer received what a buffer held after the ring handed it back"
                );
            }
        }
    }
}

/// What a step leaves to the ring's harness once the device side has
/// done its part.
pub enum RingStep {
    None,
    Push {
        qp: usize,
        kind: u8,
        signaled: bool,
    },
    /// Submit, then call [`Device::after_submit`].
    Submit,
    Poll,
    Reattach(usize),
    /// The device already failed the queue pair: hand the ring the event.
    Fatal(usize),
    FailQp(usize),
    SrqRecv,
    /// Turn the shared receive queue's refill on, or off if it is on.
    SrqRefill,
    /// Fail the queue pair on the shared receive queue (`true`), or
    /// replace it (see [`Device::srq_queue_pair`]).
    SrqQp(bool),
}

/// The adversarial device and the peers of the ring's queue pairs.
pub struct Device {
    pub dev: SoftDevice,
    pub pd: SoftPd,
    pub controls: Vec<QpControl>,
    pub qp_nums: Vec<u32>,
    pub peers: Vec<Ring<SoftQp>>,
    /// The peer of the ring's queue pair on its shared receive queue, if
    /// the harness made one.
    pub srq_peer: Option<Ring<SoftQp>>,
    /// Messages that peer sent.
    pub srq_sends: usize,
    pub peer_region: ExposedBuf<Vec<u8>>,
    pub knobs: Shared,
    /// What happened, for coverage reports: posts taken in part, and
    /// overclaimed (as the device bent them, counted at each submit).
    pub partial_posts: usize,
    pub overclaims: usize,
    pub forged: usize,
    pub repeated: usize,
    pub held: usize,
}

impl Device {
    /// The device and the completion queue for the ring.
    pub fn new() -> (Device, AdvCq) {
        let dev = SoftDevice::with_progress(Progress::Manual);
        let pd = dev.alloc_pd();
        let knobs: Shared = Arc::default();
        let cq = AdvCq {
            inner: dev.create_cq(256).unwrap(),
            knobs: Arc::clone(&knobs),
        };
        let peer_region = ExposedBuf::new(&pd, vec![0x11u8; LEN * 4], RemoteAccess::all()).unwrap();
        let device = Device {
            dev,
            pd,
            controls: Vec::new(),
            qp_nums: Vec::new(),
            peers: Vec::new(),
            srq_peer: None,
            srq_sends: 0,
            peer_region,
            knobs,
            partial_posts: 0,
            overclaims: 0,
            forged: 0,
            repeated: 0,
            held: 0,
        };
        (device, cq)
    }

    /// The ring's queue pairs on `cq`, each connected to a peer.
    pub fn queue_pairs(&mut self, cq: &SoftCq) -> Vec<AdvQp> {
        let config = QpConfig {
            max_send_wr: 16,
            max_recv_wr: 8,
            ..QpConfig::default()
        };
        (0..QPS)
            .map(|_| {
                let qp = self.dev.create_qp_on(&self.pd, cq, None, config).unwrap();
                let peer = self.dev.create_qp(&self.pd, config).unwrap();
                self.dev.connect(&qp, &peer).unwrap();
                self.controls.push(qp.control());
                self.qp_nums.push(qp.qpn());
                self.peers.push(Ring::new(peer, RingConfig::default()));
                AdvQp {
                    inner: qp,
                    knobs: Arc::clone(&self.knobs),
                }
            })
            .collect()
    }

    /// A queue pair of the ring on `cq` taking receives from `srq`,
    /// connected to a new peer (which replaces the last one's); its
    /// number.
    pub fn srq_queue_pair(&mut self, cq: &SoftCq, srq: &SoftSrq) -> (AdvQp, u32) {
        let config = QpConfig {
            max_send_wr: 16,
            max_recv_wr: 8,
            ..QpConfig::default()
        };
        let qp = self
            .dev
            .create_qp_on(&self.pd, cq, Some(srq), config)
            .unwrap();
        let peer = self.dev.create_qp(&self.pd, config).unwrap();
        self.dev.connect(&qp, &peer).unwrap();
        if let Some(old) = self
            .srq_peer
            .replace(Ring::new(peer, RingConfig::default()))
        {
            drop(old.close());
        }
        let qpn = qp.qpn();
        let qp = AdvQp {
            inner: qp,
            knobs: Arc::clone(&self.knobs),
        };
        (qp, qpn)
    }

    /// Where the ring's READs and WRITEs go.
    pub fn target(&self) -> RemoteSlice {
        self.peer_region.remote().slice(0..LEN as u64).unwrap()
    }

    /// Does the device's part of `step`.
    pub fn apply(&mut self, step: &Step) -> RingStep {
        match *step {
            Step::Push { qp, kind, signaled } => return RingStep::Push { qp, kind, signaled },
            Step::Submit => return RingStep::Submit,
            Step::SubmitTaking(n) => {
                self.knobs.lock().unwrap().accept = Some(n);
                return RingStep::Submit;
            }
            Step::SubmitOverclaiming { extra, took } => {
                let mut knobs = self.knobs.lock().unwrap();
                knobs.overclaim = Some(extra);
                knobs.accept = took;
                return RingStep::Submit;
            }
            Step::Poll => return RingStep::Poll,
            Step::Reattach(qp) => return RingStep::Reattach(qp),
            Step::Fatal(qp) => return RingStep::Fatal(qp),
            Step::FailQp(qp) => return RingStep::FailQp(qp),
            Step::Progress => {
                self.dev.progress();
            }
            Step::ExecuteOne(qp) => {
                self.controls[qp].step();
            }
            Step::Forge { forgery, qp } => {
                let mut knobs = self.knobs.lock().unwrap();
                let Some(wr_id) = forgery.wr_id(&knobs.posted_order) else {
                    return RingStep::None;
                };
                if !knobs.posted.contains(&wr_id) && knobs.forged.len() < super::MAX_FORGED {
                    self.forged += 1;
                    knobs.forged.push_back(RawCompletion {
                        wr_id,
                        qp_num: self.qp_nums[qp],
                        ..RawCompletion::default()
                    });
                }
            }
            Step::Repeat(k) => {
                let mut knobs = self.knobs.lock().unwrap();
                if !knobs.history.is_empty() && knobs.forged.len() < super::MAX_FORGED {
                    let old = knobs.history[k % knobs.history.len()];
                    knobs.forged.push_back(old);
                    self.repeated += 1;
                }
            }
            Step::Hold(qp) => {
                self.held += 1;
                self.knobs.lock().unwrap().hold = Some(self.qp_nums[qp]);
            }
            Step::Release => self.knobs.lock().unwrap().hold = None,
            Step::Fail(qp) => self.controls[qp].fail_nth(1, WcStatus::RemOpErr),
            // Without a shared receive queue, these are what they were
            // before it was added: a peer's receive.
            Step::SrqRecv(qp) | Step::SrqPeerSend(qp) | Step::SrqQp(qp)
                if self.srq_peer.is_none() =>
            {
                self.peer_recv(qp)
            }
            Step::SrqRecv(0) => return RingStep::SrqRecv,
            Step::SrqRecv(_) => return RingStep::SrqRefill,
            Step::SrqQp(qp) => return RingStep::SrqQp(qp == 1),
            Step::SrqPeerSend(_) => {
                let peer = self.srq_peer.as_mut().expect("checked above");
                let msg = RegisteredBuf::new(&self.pd, vec![0x5au8; LEN]).unwrap();
                if peer.submission().push(Send::new(msg)).is_ok() {
                    let _ = peer.submit();
                    self.srq_sends += 1;
                }
            }
            Step::PeerRecv(qp) => self.peer_recv(qp),
        }
        RingStep::None
    }

    /// The peer of the ring's queue pair `qp` sends it a message (which a
    /// receive of the ring's takes, or which waits, RNR, for one).
    pub fn peer_send(&mut self, qp: usize) {
        let msg = RegisteredBuf::new(&self.pd, vec![0x5au8; LEN]).unwrap();
        if self.peers[qp].submission().push(Send::new(msg)).is_ok() {
            let _ = self.peers[qp].submit();
        }
    }

    fn peer_recv(&mut self, qp: usize) {
        let buf = RegisteredBuf::new(&self.pd, vec![0u8; LEN]).unwrap();
        let _ = self.peers[qp].submission().push(Recv::new(buf));
        let _ = self.peers[qp].submit();
    }

    /// Knobs a post did not use do not linger; the posts they bent are
    /// counted (a submit that posted nothing bent nothing).
    pub fn after_submit(&mut self) {
        let mut knobs = self.knobs.lock().unwrap();
        knobs.accept = None;
        knobs.overclaim = None;
        self.partial_posts = knobs.bent_partial;
        self.overclaims = knobs.bent_overclaims;
    }

    /// The peers reap what they can; what a message brought them must
    /// not be poison.
    pub fn peers_reap(&mut self) {
        let mut out = Vec::new();
        for peer in self.peers.iter_mut().chain(self.srq_peer.as_mut()) {
            let _ = peer.completion().reap(&mut out);
        }
        check_no_poison(out);
    }

    /// Work requests the device kept while saying it took them.
    pub fn untaken(&self) -> usize {
        self.knobs.lock().unwrap().untaken
    }

    /// Once the device has run dry: nothing the ring's WRITEs put in the
    /// peer's region was poison. Poison there (or in what a peer received,
    /// checked as the peers reap) is a buffer the ring handed back while
    /// the device had yet to read it.
    pub fn check_peers_saw_no_poison(&self) {
        // SAFETY: the device ran dry and every queue pair that could
        // write the region is closed: nothing writes it while read.
        let region = unsafe { self.peer_region.as_slice() };
        assert!(
            !region.contains(&POISON),
            "the peer's region holds what a buffer held after the ring handed it back"
        );
    }

    /// Lets go of every held completion and runs the device a while: what
    /// it will report, it reports.
    pub fn settle(&mut self) {
        self.knobs.lock().unwrap().hold = None;
        for _ in 0..4 {
            self.dev.progress();
        }
    }

    /// Runs the device dry, the peers closed: after this, nothing the
    /// device still held can be written.
    pub fn run_dry(&mut self) {
        for _ in 0..8 {
            self.dev.progress();
        }
        for peer in self.peers.drain(..).chain(self.srq_peer.take()) {
            check_no_poison(peer.close());
        }
        for _ in 0..8 {
            self.dev.progress();
        }
    }
}
