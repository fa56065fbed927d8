//! A reference model of two connected rings on the soft device, driven by
//! a byte string: the proptest model test and the `ring_model` fuzz target
//! both run it.
//!
//! Each side exposes a region the other side writes, reads and runs
//! atomics on, and posts receives for the other side's sends. The model
//! keeps a plain copy of each region, updated from the writer's successful
//! completions (RC executes one requester's work in order, and only that
//! requester touches the region), and checks after every step that:
//!
//! * every pushed operation comes back exactly once, with its kind, and no
//!   completion names an unknown operation;
//! * a refused push hands the operation back, and is refused only for a
//!   real reason (full queue, queue pair in error);
//! * credits hold: the device's queues never exceed their depth and its
//!   completion queue never overruns;
//! * bytes read, values returned by atomics, and payloads and immediates
//!   received match the model;
//! * at the end, after both rings close, every pool chunk is back and each
//!   region equals its model.

#![allow(dead_code)]

use std::collections::{HashMap, VecDeque};

use rdma_ring::backend::soft::{Progress, QpControl, SoftDevice, SoftQp};
use rdma_ring::backend::{QpConfig, WcStatus};
use rdma_ring::buf::{BaseBuf, BufferPool, ExposedBuf, RemoteAccess, RemoteSlice};
use rdma_ring::op::{CompareSwap, FetchAdd, OpKind, Read, Recv, Send, SendImm, Write, WriteImm};
use rdma_ring::ring::{Completion, Ring, RingConfig};
use rdma_ring::Error;

/// Bytes in each side's exposed region.
pub const REGION: usize = 256;
const CHUNK: usize = 64;
const SEND_DEPTH: u32 = 8;
const RECV_DEPTH: u32 = 4;
const POOL_CHUNKS: usize = 64;

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
        side: usize,
        op: OpSpec,
    },
    Submit(usize),
    Step(usize),
    Progress,
    Poll(usize),
    Fail {
        side: usize,
        nth: u64,
        status: WcStatus,
    },
    Break,
    Close(usize),
}

/// Decodes a scenario from bytes; every byte string is a valid scenario.
pub fn decode(bytes: &[u8]) -> Vec<Action> {
    let mut it = bytes.iter().copied();
    let mut actions = Vec::new();
    while let Some(b0) = it.next() {
        let side = usize::from(b0 >> 7);
        let action = match b0 & 0x0f {
            0..=6 => {
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
            7..=9 => Action::Submit(side),
            10 => Action::Step(side),
            11 => Action::Progress,
            12 | 13 => Action::Poll(side),
            14 => {
                let b1 = it.next().unwrap_or(0);
                if b1 < 64 {
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
                    Action::Poll(side)
                }
            }
            _ => match it.next().unwrap_or(0) {
                0..=15 => Action::Break,
                16..=47 => Action::Close(side),
                _ => Action::Progress,
            },
        };
        actions.push(action);
    }
    actions
}

struct Expect {
    kind: OpKind,
    spec: OpSpec,
    payload: Vec<u8>,
}

#[derive(Debug, PartialEq, Eq)]
struct Delivery {
    imm: Option<u32>,
    len: usize,
    /// `None` for WRITE with immediate, whose receive buffer stays untouched.
    payload: Option<Vec<u8>>,
}

struct Side {
    ring: Option<Ring<SoftQp>>,
    control: QpControl,
    exposed: Option<ExposedBuf<Vec<u8>>>,
    /// The other side's region, as this side targets it.
    remote: RemoteSlice,
    /// Model of this side's own region.
    region: Vec<u8>,
    outstanding: HashMap<u64, Expect>,
    sends: usize,
    recvs: usize,
    saw_error: bool,
    /// Successful sends of this side, waiting to meet the other's receive.
    delivered: VecDeque<Delivery>,
    /// Successful receives of this side, waiting to meet the other's send.
    received: VecDeque<Delivery>,
}

/// The two sides and their shared device.
pub struct Model {
    dev: SoftDevice,
    pool: BufferPool,
    sides: [Side; 2],
    next_id: u64,
    /// Operations pushed and completions seen, for coverage reports.
    pub pushed: usize,
    pub completed: usize,
    pub kinds_ok: [usize; 8],
    pub refused_full: usize,
    pub flushed: usize,
    pub failed: usize,
    pub closed_in_flight: usize,
}

fn payload_for(id: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (id as usize * 131 + i * 7 + 3) as u8)
        .collect()
}

impl Model {
    /// Two connected rings on a soft device in manual progress mode.
    pub fn new() -> Model {
        let dev = SoftDevice::with_progress(Progress::Manual);
        let pd = dev.alloc_pd();
        let config = QpConfig {
            max_send_wr: SEND_DEPTH,
            max_recv_wr: RECV_DEPTH,
            ..QpConfig::default()
        };
        let (qp_a, qp_b) = dev.connected_pair(&pd, &pd, config).unwrap();
        let pool = BufferPool::new(&pd, CHUNK, POOL_CHUNKS).unwrap();
        let rights = RemoteAccess::all();
        let ex_a = ExposedBuf::new(&pd, vec![0u8; REGION], rights).unwrap();
        let ex_b = ExposedBuf::new(&pd, vec![0u8; REGION], rights).unwrap();
        let ring_config = RingConfig {
            signal_interval: 3,
            ..RingConfig::default()
        };
        let side = |qp: SoftQp, exposed: ExposedBuf<Vec<u8>>, remote: RemoteSlice| Side {
            control: qp.control(),
            ring: Some(Ring::new(qp, ring_config)),
            exposed: Some(exposed),
            remote,
            region: vec![0u8; REGION],
            outstanding: HashMap::new(),
            sends: 0,
            recvs: 0,
            saw_error: false,
            delivered: VecDeque::new(),
            received: VecDeque::new(),
        };
        let (remote_a, remote_b) = (ex_a.remote(), ex_b.remote());
        Model {
            sides: [side(qp_a, ex_a, remote_b), side(qp_b, ex_b, remote_a)],
            dev,
            pool,
            next_id: 1,
            pushed: 0,
            completed: 0,
            kinds_ok: [0; 8],
            refused_full: 0,
            flushed: 0,
            failed: 0,
            closed_in_flight: 0,
        }
    }

    /// Runs a scenario to the end, checking after every step.
    pub fn run(actions: &[Action]) -> Model {
        let mut model = Model::new();
        for action in actions {
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
                if let Some(ring) = self.sides[*side].ring.as_mut() {
                    if let Err(e) = ring.submission().submit() {
                        panic!("submit refused by the device: {e}");
                    }
                }
            }
            Action::Step(side) => {
                self.sides[*side].control.step();
            }
            Action::Progress => {
                self.dev.progress();
            }
            Action::Poll(side) => self.poll(*side),
            Action::Fail { side, nth, status } => self.sides[*side].control.fail_nth(*nth, *status),
            Action::Break => self.sides[0].control.break_connection(),
            Action::Close(side) => self.close(*side),
        }
    }

    fn push(&mut self, s: usize, spec: OpSpec) {
        let id = self.next_id;
        self.next_id += 1;
        let pool = self.pool.clone();
        let side = &mut self.sides[s];
        let Some(ring) = side.ring.as_mut() else {
            return;
        };
        let Ok(chunk) = pool.take() else { return };
        let remote = if spec.bad_rkey {
            RemoteSlice::new(
                side.remote.addr(),
                side.remote.len(),
                side.remote.rkey() ^ 0x10,
                RemoteAccess::all(),
            )
        } else {
            side.remote
        };
        let target = remote
            .slice(spec.offset as u64..(spec.offset + spec.len) as u64)
            .unwrap();
        let payload = payload_for(id, spec.len);
        let mut data = chunk.slice(0..spec.len);
        data.copy_from_slice(&payload);
        let compare = if spec.value & 1 == 0 { 0 } else { spec.value };
        let mut sq = ring.submission();
        macro_rules! push {
            ($op:expr) => {{
                let op = $op.user_data(id);
                let op = if spec.signaled { op.signaled() } else { op };
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
            OpKind::Recv => sq.push(Recv::new(data).user_data(id)).map_err(|r| {
                let (e, op) = r.into_parts();
                drop(op.into_buf());
                e
            }),
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
        match result {
            Ok(()) => {
                assert!(
                    !side.saw_error,
                    "push accepted after an error completion was reaped"
                );
                if spec.kind.is_recv() {
                    side.recvs += 1;
                } else {
                    side.sends += 1;
                }
                self.pushed += 1;
                side.outstanding.insert(
                    id,
                    Expect {
                        kind: spec.kind,
                        spec,
                        payload,
                    },
                );
            }
            Err(Error::QpInError(_)) => {
                assert!(
                    ring.error_status().is_some(),
                    "refused for an error the ring never saw"
                );
            }
            Err(Error::SendQueueFull { .. }) => {
                self.refused_full += 1;
                assert!(!spec.kind.is_recv());
                assert!(
                    side.sends >= SEND_DEPTH as usize - 1,
                    "send queue refused with {} in use",
                    side.sends
                );
            }
            Err(Error::RecvQueueFull { .. }) => {
                self.refused_full += 1;
                assert!(spec.kind.is_recv());
                assert!(
                    side.recvs >= RECV_DEPTH as usize,
                    "receive queue refused with {} in use",
                    side.recvs
                );
            }
            Err(e) => panic!("unexpected push refusal: {e}"),
        }
    }

    fn poll(&mut self, s: usize) {
        loop {
            let Some(ring) = self.sides[s].ring.as_mut() else {
                return;
            };
            match ring.completion().poll() {
                Ok(Some(c)) => self.complete(s, c),
                Ok(None) => return,
                Err(e) => panic!("poll failed: {e}"),
            }
        }
    }

    fn close(&mut self, s: usize) {
        if let Some(ring) = self.sides[s].ring.take() {
            if ring.in_flight() > 0 {
                self.closed_in_flight += 1;
            }
            for c in ring.close() {
                self.complete(s, c);
            }
        }
    }

    fn complete(&mut self, s: usize, c: Completion) {
        self.completed += 1;
        let o = 1 - s;
        let expect = self.sides[s]
            .outstanding
            .remove(&c.user_data())
            .unwrap_or_else(|| {
                panic!(
                    "completion for unknown or already completed op {}",
                    c.user_data()
                )
            });
        assert_eq!(c.kind(), expect.kind, "completion kind");
        if expect.kind.is_recv() {
            self.sides[s].recvs -= 1;
        } else {
            self.sides[s].sends -= 1;
        }
        if !c.status().is_success() {
            self.sides[s].saw_error = true;
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
        match expect.kind {
            OpKind::Write => self.sides[o].region[range].copy_from_slice(&expect.payload),
            OpKind::WriteImm => {
                self.sides[o].region[range].copy_from_slice(&expect.payload);
                self.sides[s].delivered.push_back(Delivery {
                    imm: Some(c.user_data() as u32),
                    len: spec.len,
                    payload: None,
                });
            }
            OpKind::Send | OpKind::SendImm => self.sides[s].delivered.push_back(Delivery {
                imm: (expect.kind == OpKind::SendImm).then_some(c.user_data() as u32),
                len: spec.len,
                payload: Some(expect.payload.clone()),
            }),
            OpKind::Read => {
                assert_eq!(c.byte_len() as usize, spec.len);
                assert_eq!(
                    &c.buf()[..],
                    &self.sides[o].region[range],
                    "bytes read differ from the model"
                );
            }
            OpKind::CompareSwap | OpKind::FetchAdd => {
                let old = word_of(&c.buf()[..]);
                let at = spec.offset..spec.offset + 8;
                let model_old = word_of(&self.sides[o].region[at.clone()]);
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
                self.sides[o].region[at].copy_from_slice(&new.to_ne_bytes());
            }
            OpKind::Recv => {
                let len = c.byte_len() as usize;
                // After a WRITE with immediate the length is the write's, and
                // the receive buffer (perhaps shorter) is untouched.
                let payload = (!c.is_write_imm()).then(|| c.buf()[..len].to_vec());
                self.sides[s].received.push_back(Delivery {
                    imm: c.imm(),
                    len,
                    payload,
                });
            }
        }
        self.match_deliveries();
    }

    /// Pairs each side's successful sends with the other's receives, in order.
    fn match_deliveries(&mut self) {
        for s in 0..2 {
            let o = 1 - s;
            while !self.sides[s].delivered.is_empty() && !self.sides[o].received.is_empty() {
                let sent = self.sides[s].delivered.pop_front().unwrap();
                let got = self.sides[o].received.pop_front().unwrap();
                assert_eq!(sent.imm, got.imm, "immediate data");
                assert_eq!(sent.len, got.len, "received length");
                assert_eq!(
                    sent.payload, got.payload,
                    "received payload, or WRITE-with-immediate kind"
                );
            }
        }
    }

    fn check_credits(&self) {
        for side in &self.sides {
            assert!(
                side.control.queued_sends() <= SEND_DEPTH as usize,
                "send queue overflow"
            );
            if let Some(ring) = &side.ring {
                assert!(ring.in_flight() <= side.outstanding.len());
                assert!(ring.in_flight() < (SEND_DEPTH + RECV_DEPTH) as usize);
            }
        }
    }

    fn finish(&mut self) {
        self.dev.progress();
        for s in 0..2 {
            self.poll(s);
        }
        for s in 0..2 {
            self.close(s);
        }
        for s in 0..2 {
            let side = &mut self.sides[s];
            assert!(
                side.outstanding.is_empty(),
                "{} ops never came back",
                side.outstanding.len()
            );
            assert!(
                side.delivered.is_empty() && side.received.is_empty(),
                "unmatched send or receive"
            );
            let memory = side.exposed.take().unwrap().into_inner().unwrap();
            assert_eq!(memory, side.region, "region differs from the model");
        }
        assert_eq!(
            self.pool.available(),
            self.pool.capacity(),
            "a buffer was lost"
        );
    }
}

impl Default for Model {
    fn default() -> Self {
        Model::new()
    }
}
