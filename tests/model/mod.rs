//! A reference model of rings on the soft device, driven by a byte string:
//! the proptest model test and the `ring_model` fuzz target both run it.
//!
//! The topology: one server ring — one completion queue and, if the
//! scenario's first byte says so, one shared receive queue — with up to
//! three queue pairs attached, each connected to a client queue pair in a
//! client ring of its own. Scenarios push every kind of operation from
//! either side of any pair, submit, step or progress the device, poll,
//! inject failures, break links, raise fatal queue pair events, detach and
//! reattach server queue pairs, and close rings with work in flight.
//!
//! Each side of each pair exposes a region its peer writes, reads and runs
//! atomics on. The model keeps a plain copy of each region, updated from
//! the peer's successful completions (RC executes one requester's work in
//! order, and only that requester touches the region), and checks after
//! every step that:
//!
//! * every pushed operation comes back exactly once, with its kind, and a
//!   completion names the queue pair it was pushed to (for a receive of the
//!   shared queue: a queue pair its sender was connected to);
//! * a refused push hands the operation back, and is refused only for a
//!   real reason: its queue pair's send or receive queue, the shared
//!   receive queue, or the shared completion queue is full, its queue pair
//!   is in error or detached, or its ring is closed;
//! * credits hold: no device send queue exceeds its depth, and the shared
//!   completion queue never overruns (the ring never fails);
//! * bytes read, values returned by atomics, and payloads and immediates
//!   received match the model, pair by pair, in order;
//! * at the end, after every ring closes, every pool chunk is back, every
//!   region equals its model, and nothing was leaked.

#![allow(dead_code)]

use std::collections::{HashMap, HashSet, VecDeque};

use rdma_ring::backend::soft::{Progress, QpControl, SoftDevice, SoftPd, SoftQp};
use rdma_ring::backend::{QpConfig, SrqConfig, WcStatus};
use rdma_ring::buf::{BaseBuf, BufferPool, ExposedBuf, RemoteAccess, RemoteSlice};
use rdma_ring::op::{CompareSwap, FetchAdd, OpKind, Read, Recv, Send, SendImm, Write, WriteImm};
use rdma_ring::ring::{Completion, QpHandle, Ring, RingConfig, SrqHandle};
use rdma_ring::Error;

/// Queue pair slots of the server ring.
pub const PAIRS: usize = 3;
/// Bytes in each exposed region.
pub const REGION: usize = 256;
const CHUNK: usize = 64;
const SEND_DEPTH: u32 = 8;
const RECV_DEPTH: u32 = 4;
const SRQ_DEPTH: u32 = 6;
/// Small enough that the shared queue, not just each queue pair, fills.
const SERVER_CQ: u32 = 16;
const POOL_CHUNKS: usize = 160;

/// Which ring, or which end of a pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Side {
    /// The server queue pair of a pair (or, for submit/poll/close, the
    /// server ring).
    Server(usize),
    /// The client of a pair.
    Client(usize),
}

impl Side {
    fn pair(self) -> usize {
        match self {
            Side::Server(p) | Side::Client(p) => p,
        }
    }
}

/// One operation to push.
#[derive(Clone, Debug)]
pub struct OpSpec {
    pub kind: OpKind,
    pub offset: usize,
    pub len: usize,
    pub value: u64,
    pub bad_rkey: bool,
    pub signaled: bool,
}

/// One step of a scenario.
#[derive(Clone, Debug)]
pub enum Action {
    Push {
        side: Side,
        op: OpSpec,
    },
    Submit(Side),
    Step(Side),
    Progress,
    Poll(Side),
    PollEvents,
    Fail {
        side: Side,
        nth: u64,
        status: WcStatus,
    },
    Break(usize),
    Fatal(usize),
    Detach(usize),
    Reattach(usize),
    Close(Side),
}

/// A scenario: whether the server uses a shared receive queue, and the
/// steps. Every byte string is a valid scenario.
pub fn decode(bytes: &[u8]) -> (bool, Vec<Action>) {
    let use_srq = bytes.first().is_some_and(|b| b & 1 == 1);
    let mut it = bytes.iter().copied().skip(1);
    let mut actions = Vec::new();
    while let Some(b0) = it.next() {
        let pair = usize::from(b0 >> 6) % PAIRS;
        let server = b0 & 0x20 != 0;
        let side = if server {
            Side::Server(pair)
        } else {
            Side::Client(pair)
        };
        let action = match b0 & 0x1f {
            0..=9 => {
                let (b1, b2, b3, b4) = (
                    it.next().unwrap_or(0),
                    it.next().unwrap_or(0),
                    it.next().unwrap_or(0),
                    it.next().unwrap_or(0),
                );
                let kind = OpKind::ALL[usize::from(b1 % 8)];
                let (offset, len) = match kind {
                    OpKind::CompareSwap | OpKind::FetchAdd => {
                        (usize::from(b2) % (REGION / 8) * 8, 8)
                    }
                    _ => {
                        let len = 1 + usize::from(b3) % CHUNK;
                        (usize::from(b2) % (REGION - len + 1), len)
                    }
                };
                Action::Push {
                    side,
                    op: OpSpec {
                        kind,
                        offset,
                        len,
                        value: u64::from(b4) | (u64::from(b2) << 8),
                        bad_rkey: (b1 >> 3) & 0x0f == 0x0f && b4 & 1 == 0,
                        signaled: b1 & 0x80 != 0,
                    },
                }
            }
            10..=13 => Action::Submit(side),
            14 | 15 => Action::Step(side),
            16 => Action::Progress,
            17..=20 => Action::Poll(side),
            21 => Action::PollEvents,
            22 => {
                let b1 = it.next().unwrap_or(0);
                if b1 < 48 {
                    let status = [
                        WcStatus::RemOpErr,
                        WcStatus::RetryExcErr,
                        WcStatus::LocProtErr,
                    ][usize::from(b1 % 3)];
                    Action::Fail {
                        side,
                        nth: 1 + u64::from(b1 % 4),
                        status,
                    }
                } else {
                    Action::Progress
                }
            }
            23 => match it.next().unwrap_or(0) {
                0..=15 => Action::Break(pair),
                16..=31 => Action::Fatal(pair),
                _ => Action::Progress,
            },
            24 | 25 => Action::Detach(pair),
            26 | 27 => Action::Reattach(pair),
            _ => match it.next().unwrap_or(0) {
                0..=23 => Action::Close(side),
                _ => Action::Poll(side),
            },
        };
        actions.push(action);
    }
    (use_srq, actions)
}

struct Expect {
    side: Side,
    /// The pair's generation when pushed (reattach starts a new one).
    generation: u32,
    kind: OpKind,
    spec: OpSpec,
    payload: Vec<u8>,
    /// Pushed to the shared receive queue.
    shared: bool,
}

#[derive(Debug, PartialEq, Eq)]
struct Delivery {
    imm: Option<u32>,
    len: usize,
    /// `None` for WRITE with immediate, whose receive buffer stays untouched.
    payload: Option<Vec<u8>>,
}

/// One end of a pair: its exposed region and the model of it.
struct End {
    exposed: Option<ExposedBuf<Vec<u8>>>,
    region: Vec<u8>,
    /// Sends pushed and not completed, and receives (own queue).
    sends: usize,
    recvs: usize,
    saw_error: bool,
}

impl End {
    fn new(pd: &SoftPd) -> End {
        End {
            exposed: Some(ExposedBuf::new(pd, vec![0u8; REGION], RemoteAccess::all()).unwrap()),
            region: vec![0u8; REGION],
            sends: 0,
            recvs: 0,
            saw_error: false,
        }
    }

    fn remote(&self) -> RemoteSlice {
        self.exposed.as_ref().expect("live").remote()
    }

    /// The region, once nothing can write it any more, against its model.
    fn check_region(&mut self) {
        if let Some(exposed) = self.exposed.take() {
            let memory = exposed.into_inner().unwrap();
            assert_eq!(memory, self.region, "region differs from the model");
        }
    }
}

struct Pair {
    generation: u32,
    /// The server queue pair, while attached.
    handle: Option<QpHandle>,
    server_control: QpControl,
    client_control: QpControl,
    client: Option<Ring<SoftQp>>,
    server: End,
    client_end: End,
}

/// The rings, their device, and what the model expects.
pub struct Model {
    dev: SoftDevice,
    pd: SoftPd,
    pool: BufferPool,
    server: Option<Ring<SoftQp>>,
    srq: Option<SrqHandle>,
    pairs: Vec<Pair>,
    /// Which pair (and generation) a server queue pair handle was.
    handles: HashMap<QpHandle, (usize, u32)>,
    outstanding: HashMap<u64, Expect>,
    /// Receives pushed to the shared queue and not completed.
    srq_recvs: usize,
    /// Successful sends towards an end, waiting to meet its receive: keyed
    /// by (receiving side, generation).
    delivered: HashMap<(Side, u32), VecDeque<Delivery>>,
    /// Successful receives of an end, waiting to meet the peer's send.
    received: HashMap<(Side, u32), VecDeque<Delivery>>,
    next_id: u64,
    leaked_before: u64,
    /// Pairs (and generations) that something may have failed: a fault
    /// injected, the link broken, a fatal event, a detach or a close, an
    /// operation with a bad rkey, or one that takes a receive (which may
    /// find none, RNR). Only these may see an error completion or have
    /// work refused for an error: an error on one pair fails no other.
    may_fail: HashSet<(usize, u32)>,
    /// Queue pairs attached again after a detach, for coverage reports.
    pub reattached: usize,
    /// What happened, for coverage reports.
    pub pushed: usize,
    pub completed: usize,
    pub kinds_ok: [usize; 8],
    pub refused_full: usize,
    pub refused_cq: usize,
    pub flushed: usize,
    pub failed: usize,
    pub closed_in_flight: usize,
    pub detached_in_flight: usize,
    pub srq_received: usize,
    pub fatal: usize,
}

fn payload_for(id: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (id as usize * 131 + i * 7 + 3) as u8)
        .collect()
}

fn qp_config() -> QpConfig {
    QpConfig {
        max_send_wr: SEND_DEPTH,
        max_recv_wr: RECV_DEPTH,
        ..QpConfig::default()
    }
}

fn ring_config() -> RingConfig {
    RingConfig {
        signal_interval: 3,
        last_wqe_timeout: std::time::Duration::ZERO,
        ..RingConfig::default()
    }
}

impl Model {
    /// The server ring with every pair attached, on a soft device in
    /// manual progress mode.
    pub fn new(use_srq: bool) -> Model {
        let dev = SoftDevice::with_progress(Progress::Manual);
        let pd = dev.alloc_pd();
        let mut server = Ring::with_cq(dev.create_cq(SERVER_CQ).unwrap(), ring_config());
        server.watch_events(dev.async_events().unwrap());
        let srq = use_srq.then(|| {
            server
                .add_srq(
                    dev.create_srq(
                        &pd,
                        SrqConfig {
                            max_wr: SRQ_DEPTH,
                            max_sge: 1,
                        },
                    )
                    .unwrap(),
                )
                .unwrap()
        });
        let pool = BufferPool::new(&pd, CHUNK, POOL_CHUNKS).unwrap();
        let mut model = Model {
            leaked_before: rdma_ring::leak::leaked().buffers,
            may_fail: HashSet::new(),
            reattached: 0,
            dev,
            pd,
            pool,
            server: Some(server),
            srq,
            pairs: Vec::new(),
            handles: HashMap::new(),
            outstanding: HashMap::new(),
            srq_recvs: 0,
            delivered: HashMap::new(),
            received: HashMap::new(),
            next_id: 1,
            pushed: 0,
            completed: 0,
            kinds_ok: [0; 8],
            refused_full: 0,
            refused_cq: 0,
            flushed: 0,
            failed: 0,
            closed_in_flight: 0,
            detached_in_flight: 0,
            srq_received: 0,
            fatal: 0,
        };
        for p in 0..PAIRS {
            let pair = model.new_pair(0);
            model.pairs.push(pair);
            model.register(p);
        }
        model
    }

    /// A fresh pair: a server queue pair attached to the server ring, a
    /// client ring, two regions.
    fn new_pair(&mut self, generation: u32) -> Pair {
        let server = self.server.as_mut().expect("the server ring is open");
        let srq = self.srq.and_then(|h| server.srq(h));
        let qp = self
            .dev
            .create_qp_on(&self.pd, server.cq(), srq, qp_config())
            .unwrap();
        let client_qp = self.dev.create_qp(&self.pd, qp_config()).unwrap();
        self.dev.connect(&qp, &client_qp).unwrap();
        let server_control = qp.control();
        let client_control = client_qp.control();
        // Nothing in a scenario may make an attach fail: a refusal would
        // leave the pair detached for good, every push refused.
        let handle = Some(
            server
                .attach(qp)
                .unwrap_or_else(|r| panic!("attach refused: {r:?}")),
        );
        Pair {
            generation,
            handle,
            server_control,
            client_control,
            client: Some(Ring::new(client_qp, ring_config())),
            server: End::new(&self.pd),
            client_end: End::new(&self.pd),
        }
    }

    fn register(&mut self, p: usize) {
        if let Some(h) = self.pairs[p].handle {
            self.handles.insert(h, (p, self.pairs[p].generation));
        }
    }

    /// Runs a scenario to the end, checking after every step.
    pub fn run(scenario: &(bool, Vec<Action>)) -> Model {
        let mut model = Model::new(scenario.0);
        for action in &scenario.1 {
            model.apply(action);
            model.check_credits();
        }
        model.finish();
        model
    }

    fn apply(&mut self, action: &Action) {
        match action {
            Action::Push { side, op } => self.push(*side, op.clone()),
            Action::Submit(side) => {
                if let Some(ring) = self.ring(*side) {
                    if let Err(e) = ring.submit() {
                        panic!("submit refused by the device: {e}");
                    }
                }
            }
            Action::Step(side) => {
                self.control(*side).step();
            }
            Action::Progress => {
                self.dev.progress();
            }
            Action::Poll(side) => self.poll(*side),
            Action::PollEvents => {
                if let Some(server) = self.server.as_mut() {
                    server.poll_events().unwrap();
                    while server.next_event().is_some() {}
                }
            }
            Action::Fail { side, nth, status } => {
                self.may_fail(side.pair());
                self.control(*side).fail_nth(*nth, *status);
            }
            Action::Break(p) => {
                self.may_fail(*p);
                self.pairs[*p].server_control.break_connection();
            }
            Action::Fatal(p) => {
                self.may_fail(*p);
                if self.pairs[*p].handle.is_some() {
                    self.fatal += 1;
                    self.pairs[*p].server_control.inject_fatal();
                }
            }
            Action::Detach(p) => self.detach(*p),
            Action::Reattach(p) => self.reattach(*p),
            Action::Close(side) => self.close(*side),
        }
    }

    /// Notes that pair `p`, as it is now, may see errors.
    fn may_fail(&mut self, p: usize) {
        self.may_fail.insert((p, self.pairs[p].generation));
    }

    fn ring(&mut self, side: Side) -> Option<&mut Ring<SoftQp>> {
        match side {
            Side::Server(_) => self.server.as_mut(),
            Side::Client(p) => self.pairs[p].client.as_mut(),
        }
    }

    fn control(&self, side: Side) -> &QpControl {
        match side {
            Side::Server(p) => &self.pairs[p].server_control,
            Side::Client(p) => &self.pairs[p].client_control,
        }
    }

    fn end(&mut self, side: Side) -> &mut End {
        match side {
            Side::Server(p) => &mut self.pairs[p].server,
            Side::Client(p) => &mut self.pairs[p].client_end,
        }
    }

    /// The side whose region `side`'s operations target, and which receives
    /// its sends.
    fn peer(side: Side) -> Side {
        match side {
            Side::Server(p) => Side::Client(p),
            Side::Client(p) => Side::Server(p),
        }
    }

    fn push(&mut self, side: Side, spec: OpSpec) {
        let id = self.next_id;
        self.next_id += 1;
        let p = side.pair();
        let generation = self.pairs[p].generation;
        let shared = matches!(side, Side::Server(_)) && spec.kind.is_recv() && self.srq.is_some();
        let peer_remote = {
            let peer = Self::peer(side);
            let end = self.end(peer);
            match &end.exposed {
                Some(ex) => ex.remote(),
                None => return,
            }
        };
        // The server queue pair's handle: the live one, or (detached) a
        // stale one, which the ring must refuse.
        let handle = self.pairs[p].handle.or_else(|| {
            self.handles
                .iter()
                .find(|(_, &(q, _))| q == p)
                .map(|(h, _)| *h)
        });
        let srq = self.srq;
        let pool = self.pool.clone();
        let Ok(chunk) = pool.take() else { return };
        let remote = if spec.bad_rkey {
            RemoteSlice::new(
                peer_remote.addr(),
                peer_remote.len(),
                peer_remote.rkey() ^ 0x10,
                RemoteAccess::all(),
            )
        } else {
            peer_remote
        };
        let target = remote
            .slice(spec.offset as u64..(spec.offset + spec.len) as u64)
            .unwrap();
        let payload = payload_for(id, spec.len);
        let mut data = chunk.slice(0..spec.len);
        data.copy_from_slice(&payload);
        let compare = if spec.value & 1 == 0 { 0 } else { spec.value };
        let Some(ring) = (match side {
            Side::Server(_) => self.server.as_mut(),
            Side::Client(q) => self.pairs[q].client.as_mut(),
        }) else {
            return;
        };
        macro_rules! push {
            ($op:expr) => {{
                let op = $op.user_data(id);
                let op = if spec.signaled { op.signaled() } else { op };
                let mut sq = match (side, handle) {
                    (Side::Server(_), Some(h)) => ring.submission_on(h),
                    _ => ring.submission(),
                };
                sq.push(op).map_err(|r| {
                    let (e, op) = r.into_parts();
                    drop(op.into_buf()); // the op, and so its buffer, came back
                    e
                })
            }};
        }
        let result = match spec.kind {
            OpKind::Write => push!(Write::new(data, target)),
            OpKind::WriteImm => push!(WriteImm::new(data, target, id as u32)),
            OpKind::Send => push!(Send::new(data)),
            OpKind::SendImm => push!(SendImm::new(data, id as u32)),
            OpKind::Read => push!(Read::new(data, target)),
            OpKind::Recv if shared => ring
                .srq_submission(srq.expect("shared"))
                .push(Recv::new(data).user_data(id))
                .map_err(|r| {
                    let (e, op) = r.into_parts();
                    drop(op.into_buf());
                    e
                }),
            OpKind::Recv => {
                let op = Recv::new(data).user_data(id);
                let mut sq = match (side, handle) {
                    (Side::Server(_), Some(h)) => ring.submission_on(h),
                    _ => ring.submission(),
                };
                sq.push(op).map_err(|r| {
                    let (e, op) = r.into_parts();
                    drop(op.into_buf());
                    e
                })
            }
            OpKind::CompareSwap | OpKind::FetchAdd => {
                let word = data.into_inner().word(0).unwrap();
                let remote_word = remote.word(spec.offset as u64).unwrap();
                if spec.kind == OpKind::CompareSwap {
                    push!(CompareSwap::new(word, remote_word, compare, spec.value))
                } else {
                    push!(FetchAdd::new(word, remote_word, spec.value))
                }
            }
        };
        self.pushed_or_refused(id, side, generation, spec, payload, shared, result);
    }

    #[allow(clippy::too_many_arguments)]
    fn pushed_or_refused(
        &mut self,
        id: u64,
        side: Side,
        generation: u32,
        spec: OpSpec,
        payload: Vec<u8>,
        shared: bool,
        result: Result<(), Error>,
    ) {
        let p = side.pair();
        let recv = spec.kind.is_recv();
        match result {
            Ok(()) => {
                assert!(
                    shared || !self.end(side).saw_error,
                    "push accepted after an error completion was reaped"
                );
                let takes_a_receive =
                    matches!(spec.kind, OpKind::Send | OpKind::SendImm | OpKind::WriteImm);
                if spec.bad_rkey || takes_a_receive {
                    self.may_fail.insert((p, generation));
                }
                if shared {
                    self.srq_recvs += 1;
                } else if recv {
                    self.end(side).recvs += 1;
                } else {
                    self.end(side).sends += 1;
                }
                self.pushed += 1;
                self.outstanding.insert(
                    id,
                    Expect {
                        side,
                        generation,
                        kind: spec.kind,
                        spec,
                        payload,
                        shared,
                    },
                );
            }
            Err(Error::QpInError(_)) => {
                let known = match side {
                    Side::Server(_) => self.pairs[p]
                        .handle
                        .and_then(|h| self.server.as_ref().and_then(|s| s.qp_error(h)))
                        .is_some(),
                    Side::Client(_) => self.pairs[p]
                        .client
                        .as_ref()
                        .is_some_and(|r| r.error_status().is_some()),
                };
                assert!(known, "refused for an error the ring never saw");
                assert!(
                    self.may_fail.contains(&(p, generation)),
                    "pair {p} refused work for an error nothing could have caused"
                );
            }
            Err(Error::NotAttached(_)) => {
                assert!(
                    matches!(side, Side::Server(_)) && self.pairs[p].handle.is_none(),
                    "refused as detached while attached"
                );
            }
            Err(Error::SendQueueFull { .. }) => {
                self.refused_full += 1;
                assert!(!recv);
                let sends = self.end(side).sends;
                assert!(
                    sends >= SEND_DEPTH as usize - 1,
                    "send queue refused with {sends} in use"
                );
            }
            Err(Error::RecvQueueFull { .. }) => {
                self.refused_full += 1;
                assert!(recv);
                if shared {
                    assert!(
                        self.srq_recvs >= SRQ_DEPTH as usize,
                        "shared queue refused early"
                    );
                } else {
                    let recvs = self.end(side).recvs;
                    assert!(recvs >= RECV_DEPTH as usize, "receive queue refused early");
                }
            }
            Err(Error::CompletionQueueFull { .. }) => {
                self.refused_cq += 1;
                assert!(
                    matches!(side, Side::Server(_)),
                    "only the server queue is shared"
                );
                let possible = self.server_possible();
                let attached = self.pairs.iter().filter(|p| p.handle.is_some()).count();
                assert!(
                    possible + attached >= SERVER_CQ as usize,
                    "completion queue refused with {possible} possible"
                );
            }
            Err(e) => panic!("unexpected push refusal: {e}"),
        }
    }

    /// Completions the server's work may still produce.
    fn server_possible(&self) -> usize {
        self.outstanding
            .values()
            .filter(|e| matches!(e.side, Side::Server(_)))
            .count()
    }

    fn poll(&mut self, side: Side) {
        loop {
            let Some(ring) = self.ring(side) else {
                return;
            };
            match ring.completion().poll() {
                Ok(Some(c)) => self.complete(side, c),
                Ok(None) => return,
                Err(e) => panic!("poll failed: {e}"),
            }
        }
    }

    fn detach(&mut self, p: usize) {
        let Some(h) = self.pairs[p].handle.take() else {
            return;
        };
        let Some(server) = self.server.as_mut() else {
            return;
        };
        let generation = self.pairs[p].generation;
        let of_this_pair =
            |e: &Expect| e.side == Side::Server(p) && e.generation == generation && !e.shared;
        if self.outstanding.values().any(of_this_pair) {
            self.detached_in_flight += 1;
        }
        self.may_fail.insert((p, generation));
        let detached = server.detach(h).unwrap();
        assert!(detached.drained, "the soft device always drains");
        // Its flushed completions are in the server's queue: take them now,
        // under the generation they belong to.
        self.poll(Side::Server(p));
        // Drained to zero: nothing of its own is still out.
        assert!(
            !self.outstanding.values().any(of_this_pair),
            "a detach said it drained, but work of the queue pair is still out"
        );
    }

    /// A detached pair gets new queue pairs and regions: the old client
    /// ring closes first (its completions checked), the old regions are
    /// checked against their models.
    fn reattach(&mut self, p: usize) {
        if self.pairs[p].handle.is_some() || self.server.is_none() {
            return;
        }
        self.close(Side::Client(p));
        self.poll(Side::Server(p));
        self.pairs[p].server.check_region();
        self.pairs[p].client_end.check_region();
        let generation = self.pairs[p].generation + 1;
        let pair = self.new_pair(generation);
        self.pairs[p] = pair;
        self.register(p);
        self.reattached += 1;
    }

    fn close(&mut self, side: Side) {
        match side {
            Side::Server(_) => (0..self.pairs.len()).for_each(|p| self.may_fail(p)),
            Side::Client(p) => self.may_fail(p),
        }
        let ring = match side {
            Side::Server(_) => self.server.take(),
            Side::Client(p) => self.pairs[p].client.take(),
        };
        if let Some(ring) = ring {
            if ring.in_flight() > 0 {
                self.closed_in_flight += 1;
            }
            for c in ring.close() {
                self.complete(side, c);
            }
            if matches!(side, Side::Server(_)) {
                for pair in &mut self.pairs {
                    pair.handle = None;
                }
            }
        }
    }

    fn complete(&mut self, ring_side: Side, c: Completion) {
        self.completed += 1;
        let expect = self.outstanding.remove(&c.user_data()).unwrap_or_else(|| {
            panic!(
                "completion for unknown or already completed op {}",
                c.user_data()
            )
        });
        assert_eq!(c.kind(), expect.kind, "completion kind");
        let side = expect.side;
        match (ring_side, side) {
            (Side::Server(_), Side::Server(_)) | (Side::Client(_), Side::Client(_)) => {}
            _ => panic!("a completion came back on the wrong ring"),
        }
        if let Side::Client(p) = ring_side {
            assert_eq!(
                side,
                Side::Client(p),
                "a client ring got another's completion"
            );
        }
        // The queue pair a completion names.
        let named = c.qp().and_then(|h| self.handles.get(&h).copied());
        if matches!(side, Side::Server(_)) {
            match (expect.shared, named) {
                (false, n) => assert_eq!(
                    n,
                    Some((side.pair(), expect.generation)),
                    "a completion names another queue pair"
                ),
                (true, Some(_)) => {}
                (true, None) => assert!(
                    !c.status().is_success(),
                    "a successful shared receive names no queue pair"
                ),
            }
        }
        if expect.shared {
            self.srq_recvs -= 1;
        } else if expect.kind.is_recv() {
            self.end(side).recvs -= 1;
        } else {
            self.end(side).sends -= 1;
        }
        if !c.status().is_success() {
            if !expect.shared {
                assert!(
                    self.may_fail.contains(&(side.pair(), expect.generation)),
                    "an operation of pair {} failed ({}), though nothing could fail it",
                    side.pair(),
                    c.status()
                );
                self.end(side).saw_error = true;
            }
            if c.status().is_flush() {
                self.flushed += 1;
            } else {
                self.failed += 1;
            }
            return;
        }
        self.kinds_ok[OpKind::ALL.iter().position(|k| *k == expect.kind).unwrap()] += 1;
        let spec = &expect.spec;
        let range = spec.offset..spec.offset + spec.len;
        let word_of = |bytes: &[u8]| u64::from_ne_bytes(bytes[..8].try_into().unwrap());
        let peer = Self::peer(side);
        let generation = expect.generation;
        let key = (peer, generation);
        match expect.kind {
            OpKind::Write => self.end(peer).region[range].copy_from_slice(&expect.payload),
            OpKind::WriteImm => {
                self.end(peer).region[range].copy_from_slice(&expect.payload);
                self.delivered.entry(key).or_default().push_back(Delivery {
                    imm: Some(c.user_data() as u32),
                    len: spec.len,
                    payload: None,
                });
            }
            OpKind::Send | OpKind::SendImm => {
                self.delivered.entry(key).or_default().push_back(Delivery {
                    imm: (expect.kind == OpKind::SendImm).then_some(c.user_data() as u32),
                    len: spec.len,
                    payload: Some(expect.payload.clone()),
                })
            }
            OpKind::Read => {
                assert_eq!(c.byte_len() as usize, spec.len);
                assert_eq!(
                    &c.buf()[..],
                    &self.end(peer).region[range],
                    "bytes read differ from the model"
                );
            }
            OpKind::CompareSwap | OpKind::FetchAdd => {
                let old = word_of(&c.buf()[..]);
                let at = spec.offset..spec.offset + 8;
                let model_old = word_of(&self.end(peer).region[at.clone()]);
                assert_eq!(
                    old, model_old,
                    "atomic returned a value the model does not hold"
                );
                let new = if expect.kind == OpKind::FetchAdd {
                    old.wrapping_add(spec.value)
                } else if old == if spec.value & 1 == 0 { 0 } else { spec.value } {
                    spec.value
                } else {
                    old
                };
                self.end(peer).region[at].copy_from_slice(&new.to_ne_bytes());
            }
            OpKind::Recv => {
                // The receiving end: for a shared receive, the pair whose
                // queue pair consumed it.
                let (recv_side, generation) = match (side, named) {
                    (Side::Server(_), Some((p, g))) => (Side::Server(p), g),
                    _ => (side, expect.generation),
                };
                if expect.shared {
                    self.srq_received += 1;
                }
                let len = c.byte_len() as usize;
                // After a WRITE with immediate the length is the write's, and
                // the receive buffer (perhaps shorter) is untouched.
                let payload = (!c.is_write_imm()).then(|| c.buf()[..len].to_vec());
                self.received
                    .entry((recv_side, generation))
                    .or_default()
                    .push_back(Delivery {
                        imm: c.imm(),
                        len,
                        payload,
                    });
            }
        }
        self.match_deliveries();
    }

    /// Pairs each end's successful sends with the other's receives, in order.
    fn match_deliveries(&mut self) {
        let keys: Vec<_> = self.received.keys().copied().collect();
        for key in keys {
            while let (Some(sent), Some(got)) = (
                self.delivered.get(&key).and_then(|q| q.front()),
                self.received.get(&key).and_then(|q| q.front()),
            ) {
                assert_eq!(sent.imm, got.imm, "immediate data");
                assert_eq!(sent.len, got.len, "received length");
                assert_eq!(
                    sent.payload, got.payload,
                    "received payload, or WRITE-with-immediate kind"
                );
                self.delivered.get_mut(&key).unwrap().pop_front();
                self.received.get_mut(&key).unwrap().pop_front();
            }
        }
    }

    fn check_credits(&self) {
        for pair in &self.pairs {
            for control in [&pair.server_control, &pair.client_control] {
                assert!(
                    control.queued_sends() <= SEND_DEPTH as usize,
                    "send queue overflow"
                );
            }
        }
        if let Some(server) = &self.server {
            assert!(
                server.failure().is_none(),
                "the server ring failed: {:?}",
                server.failure()
            );
            assert!(server.in_flight() <= self.server_possible());
        }
    }

    fn finish(&mut self) {
        self.dev.progress();
        self.dev.progress();
        self.poll(Side::Server(0));
        for p in 0..PAIRS {
            self.poll(Side::Client(p));
        }
        for p in 0..PAIRS {
            self.close(Side::Client(p));
        }
        self.close(Side::Server(0));
        assert!(
            self.outstanding.is_empty(),
            "{} ops never came back",
            self.outstanding.len()
        );
        for (key, queue) in self.delivered.iter().chain(self.received.iter()) {
            assert!(
                queue.is_empty(),
                "unmatched send or receive at {key:?}: {queue:?}"
            );
        }
        for pair in &mut self.pairs {
            pair.server.check_region();
            pair.client_end.check_region();
        }
        assert_eq!(
            self.pool.available(),
            self.pool.capacity(),
            "a buffer was lost"
        );
        assert_eq!(
            rdma_ring::leak::leaked().buffers,
            self.leaked_before,
            "a buffer was leaked"
        );
    }
}
