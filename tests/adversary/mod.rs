//! A ring over a device that misbehaves as far as the backend contract
//! lets it — and a little further — driven by a byte string: the proptest
//! `adversary_test` and the `adversarial_device` fuzz target run it.
//!
//! The adversary wraps the soft device (whose queue pairs really execute,
//! and which checks its own ordering promise). Around it:
//!
//! * posts are accepted in part, with an exact `accepted`, or refused while
//!   claiming more than was posted (a backend that cannot tell);
//! * completions are forged for `wr_id`s that were never posted, and old
//!   completions are delivered again;
//! * one queue pair's completions are held back while the others' pass,
//!   then released in order (reordering across queue pairs).
//!
//! Every buffer the ring hands back is poisoned and kept, still
//! registered. At the end, after the ring is closed and the device has run
//! dry, each must still hold only poison: if the ring had released a
//! buffer the device still held, the device's later write would show. The
//! device's reads show too: neither the peers' region nor any message a
//! peer received may hold poison. The ring must also never panic, never
//! hand an operation back twice, and hand each queue's operations back in
//! the order they were pushed; every operation must come back or be
//! counted as leaked, and no more may be leaked than the device kept while
//! saying it took it; every forged completion must be counted as unknown.

#![allow(dead_code)]

pub mod awaited;
pub mod device;
pub mod fixed;

use device::{Device, RingStep};

use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, Mutex};

use rdma_ring::backend::soft::{SoftCq, SoftQp, SoftSrq};
use rdma_ring::backend::{
    CompletionQueue, CqId, PostError, QpCaps, QueuePair, RawCompletion, RecvWr, SendWr, Sge,
    SharedReceiveQueue, SrqCaps,
};
use rdma_ring::buf::RegisteredBuf;
use rdma_ring::op::{Read, Recv, Send, Write};
use rdma_ring::ring::{Completion, QpHandle, Ring, RingConfig};
use rdma_ring::Error;

const QPS: usize = 2;
const LEN: usize = 32;
const POISON: u8 = 0xde;

/// What the adversary does next; shared by its queue pairs and queue.
#[derive(Default)]
pub struct Knobs {
    /// Take at most this many work requests of the next post.
    accept: Option<usize>,
    /// Refuse the next post after taking it all, claiming this many more.
    overclaim: Option<usize>,
    /// Completions to report before the real ones.
    forged: VecDeque<RawCompletion>,
    /// Hold back this queue pair's completions.
    hold: Option<u32>,
    held: VecDeque<RawCompletion>,
    /// Completions already reported, to report again.
    history: Vec<RawCompletion>,
    /// Every `wr_id` ever posted, so forged ones never name a real one.
    posted: HashSet<u64>,
    /// The same in the order posted, to forge near misses of recent ones.
    posted_order: Vec<u64>,
    /// Work requests the device did not take while it said it took them
    /// (a partial post overclaimed): the only work that may never come
    /// back, so the only operations a ring may count as leaked.
    pub untaken: usize,
    /// Forged and repeated completions the ring was handed: each names
    /// nothing of the ring's, so each must be counted as unknown.
    pub delivered_forgeries: u64,
    /// Posts the knobs bent: taken in part, and overclaimed (a knob a
    /// post never reached bent nothing).
    bent_partial: usize,
    bent_overclaims: usize,
}

impl Knobs {
    /// Whether reporting `cqe` stays within the contract: it repeats a
    /// completion already reported (whose work the ring has retired), or
    /// names a `wr_id` never posted.
    fn forged_ok(&self, cqe: &RawCompletion) -> bool {
        !self.posted.contains(&cqe.wr_id) || self.history.contains(cqe)
    }
}

pub type Shared = Arc<Mutex<Knobs>>;

pub struct AdvQp {
    inner: SoftQp,
    knobs: Shared,
}

pub struct AdvCq {
    inner: SoftCq,
    knobs: Shared,
}

/// A shared receive queue whose posts the knobs bend as a queue pair's.
pub struct AdvSrq {
    pub inner: SoftSrq,
    knobs: Shared,
}

impl AdvSrq {
    pub fn new(inner: SoftSrq, knobs: &Shared) -> AdvSrq {
        AdvSrq {
            inner,
            knobs: Arc::clone(knobs),
        }
    }
}

/// Posts `wrs` to `queue` through `post`, as the knobs say: every
/// `wr_id` is recorded as posted (so no forgery names it), and the post
/// is taken in part, overclaimed, or both (taken in part and reported
/// as all taken: a backend that cannot tell).
fn post_bent<T, W: Copy>(
    knobs: &Shared,
    queue: &mut T,
    wrs: &[W],
    wr_id: impl Fn(&W) -> u64,
    post: impl FnOnce(&mut T, &[W]) -> Result<(), PostError>,
) -> Result<(), PostError> {
    let mut bent = knobs.lock().unwrap();
    bent.posted.extend(wrs.iter().map(&wr_id));
    bent.posted_order.extend(wrs.iter().map(&wr_id));
    let take = bent.accept.take().map_or(wrs.len(), |n| n.min(wrs.len()));
    let overclaim = bent.overclaim.take();
    if overclaim.is_some() {
        bent.untaken += wrs.len() - take;
    }
    bent.bent_partial += usize::from(take < wrs.len());
    bent.bent_overclaims += usize::from(overclaim.is_some());
    drop(bent);
    post(queue, &wrs[..take])?;
    if let Some(extra) = overclaim {
        // Never less than was taken: all of it (and more) claimed.
        return Err(PostError {
            accepted: wrs.len() + extra,
            error: Error::PostRejected("the adversary cannot tell what it took"),
        });
    }
    if take < wrs.len() {
        return Err(PostError {
            accepted: take,
            error: Error::PostRejected("the adversary took only part"),
        });
    }
    Ok(())
}

// SAFETY: every work request that reaches the device is the soft queue
// pair's; a partial post reports exactly what it took, and an overclaim
// covers everything (never less than was taken), as the contract allows.
unsafe impl QueuePair for AdvQp {
    type Cq = AdvCq;
    type Srq = AdvSrq;
    fn caps(&self) -> QpCaps {
        self.inner.caps()
    }
    unsafe fn post_send(&mut self, wrs: &[SendWr], sges: &[Sge]) -> Result<(), PostError> {
        // SAFETY: the caller's contract, passed through for what is posted.
        post_bent(
            &self.knobs,
            &mut self.inner,
            wrs,
            |w| w.wr_id,
            |qp, w| unsafe { qp.post_send(w, sges) },
        )
    }
    unsafe fn post_recv(&mut self, wrs: &[RecvWr], sges: &[Sge]) -> Result<(), PostError> {
        // SAFETY: as above.
        post_bent(
            &self.knobs,
            &mut self.inner,
            wrs,
            |w| w.wr_id,
            |qp, w| unsafe { qp.post_recv(w, sges) },
        )
    }
    fn set_error(&mut self) -> Result<(), Error> {
        self.inner.set_error()
    }
    fn take_cq(&mut self) -> Option<AdvCq> {
        None
    }
}

// SAFETY: what is posted goes to the soft queue unchanged, and a bent
// post reports what it took as `AdvQp`'s do; the rest is the soft
// queue's.
unsafe impl SharedReceiveQueue for AdvSrq {
    fn caps(&self) -> SrqCaps {
        self.inner.caps()
    }
    unsafe fn post_recv(&mut self, wrs: &[RecvWr], sges: &[Sge]) -> Result<(), PostError> {
        // SAFETY: the caller's contract, passed through for what is posted.
        post_bent(
            &self.knobs,
            &mut self.inner,
            wrs,
            |w| w.wr_id,
            |srq, w| unsafe { srq.post_recv(w, sges) },
        )
    }
    fn arm_limit(&mut self, limit: u32) -> Result<(), Error> {
        self.inner.arm_limit(limit)
    }
    fn destroy(&mut self) -> Result<(), Error> {
        self.inner.destroy()
    }
}

// SAFETY: the real completions are the soft queue's, each reported once in
// each queue pair's order (holding back one queue pair's keeps its order);
// forged ones name `wr_id`s never posted, and repeated ones name work the
// ring has already retired: neither may release a buffer the device holds.
unsafe impl CompletionQueue for AdvCq {
    fn id(&self) -> CqId {
        self.inner.id()
    }
    fn entries(&self) -> u32 {
        self.inner.entries()
    }
    fn poll(&mut self, out: &mut [RawCompletion]) -> Result<usize, Error> {
        let mut knobs = self.knobs.lock().unwrap();
        let mut n = 0;
        while n < out.len() {
            let Some(forged) = knobs.forged.pop_front() else {
                break;
            };
            // A forgery may only name work the device does not hold: one
            // whose `wr_id` was posted after the forgery was planned (the
            // slot got reused) is dropped, as the contract requires.
            if knobs.forged_ok(&forged) {
                out[n] = forged;
                n += 1;
                knobs.delivered_forgeries += 1;
            }
        }
        // What was held of a queue pair no longer held goes first, in order.
        let mut still_held = VecDeque::new();
        while let Some(held) = knobs.held.pop_front() {
            if n < out.len() && knobs.hold != Some(held.qp_num) {
                knobs.history.push(held);
                out[n] = held;
                n += 1;
            } else {
                still_held.push_back(held);
            }
        }
        knobs.held = still_held;
        let mut real = vec![RawCompletion::default(); out.len() - n];
        let got = self.inner.poll(&mut real)?;
        for cqe in real.into_iter().take(got) {
            // Behind a held completion of its queue pair, one waits too:
            // a queue pair's completions keep their order.
            if knobs.hold == Some(cqe.qp_num) || knobs.held.iter().any(|h| h.qp_num == cqe.qp_num) {
                knobs.held.push_back(cqe);
            } else {
                knobs.history.push(cqe);
                out[n] = cqe;
                n += 1;
            }
        }
        Ok(n)
    }
}

/// One step of an adversarial scenario.
#[derive(Clone, Debug)]
pub enum Step {
    /// An operation on a queue pair: 0 WRITE, 1 READ, 2 SEND, 3 RECV.
    Push {
        qp: usize,
        kind: u8,
        signaled: bool,
    },
    Submit,
    SubmitTaking(usize),
    /// A post the device reports as all taken (and `extra` more), having
    /// taken all of it, or only the first `took`: it cannot tell.
    SubmitOverclaiming {
        extra: usize,
        took: Option<usize>,
    },
    Progress,
    /// One queue pair executes one work request.
    ExecuteOne(usize),
    Poll,
    Forge {
        forgery: Forgery,
        qp: usize,
    },
    Repeat(usize),
    Hold(usize),
    Release,
    Fail(usize),
    PeerRecv(usize),
    /// Detach a queue pair and attach it again (the fixed ring's harness;
    /// the ring's takes it as `PeerRecv`).
    Reattach(usize),
    /// The device fails a queue pair (`QP_FATAL`: to error, flushed) and
    /// the ring is handed the event (the fixed ring's harness; the ring's
    /// takes it as `PeerRecv`, its model test covers fatal events).
    Fatal(usize),
    /// The ring fails a queue pair on request (as the previous step, for
    /// the fixed ring's harness only).
    FailQp(usize),
    /// A receive pushed to the shared receive queue (`qp` 0), or its
    /// refill turned on or off (`qp` 1) (the fixed ring's harness; for the
    /// ring's, this and the next two steps are a `PeerRecv` of the queue
    /// pair).
    SrqRecv(usize),
    /// The peer of the queue pair on the shared receive queue sends it a
    /// message.
    SrqPeerSend(usize),
    /// The queue pair on the shared receive queue is failed on request
    /// (`qp` 1), or detached, destroyed, and replaced by a new one with a
    /// new peer (`qp` 0).
    SrqQp(usize),
}

/// Forged and repeated completions waiting to be reported, at most: a
/// drain that gives up reaps what its completion queue can hold (256
/// entries, of which the real work takes fewer than 64), and forgeries are
/// reported first.
pub const MAX_FORGED: usize = 64;

/// The `wr_id` of a forged completion.
#[derive(Clone, Copy, Debug)]
pub enum Forgery {
    /// Any 64 bits: almost always a slot no ring has.
    Raw(u64),
    /// A `wr_id` posted `back` posts ago, changed by one of
    /// [`NEAR_MISSES`]: the slot of a real operation, or the one beside it,
    /// with another generation or sequence number, or the other queue's
    /// bit. A forgery that names a `wr_id` posted is dropped, as the
    /// contract requires, so what reaches the ring names a slot it has and
    /// work it does not hold.
    NearMiss { back: usize, delta: usize },
}

/// What a near miss adds to (wrapping) or flips in a posted `wr_id`:
/// whatever the layout, the low bits are a slot or a sequence number and
/// the high bits a generation or a slot.
const NEAR_MISSES: [(u64, bool); 8] = [
    (1, false),
    (u64::MAX, false),
    (2, false),
    (1 << 32, false),
    (u64::MAX << 32, false),
    (1 << 47, true),
    (1 << 46, true),
    (1 << 48, false),
];

impl Forgery {
    /// The `wr_id` to forge, given what was posted in order; none if
    /// nothing was posted that far back.
    pub fn wr_id(self, posted: &[u64]) -> Option<u64> {
        match self {
            Forgery::Raw(wr_id) => Some(wr_id),
            Forgery::NearMiss { back, delta } => {
                let base = *posted.get(posted.len().checked_sub(back + 1)?)?;
                let (change, flip) = NEAR_MISSES[delta % NEAR_MISSES.len()];
                Some(if flip {
                    base ^ change
                } else {
                    base.wrapping_add(change)
                })
            }
        }
    }
}

/// Every byte string is a scenario.
pub fn decode(bytes: &[u8]) -> Vec<Step> {
    let mut it = bytes.iter().copied();
    let mut steps = Vec::new();
    while let Some(b) = it.next() {
        let qp = usize::from(b >> 7);
        let step = match b & 0x1f {
            0..=7 => {
                let b1 = it.next().unwrap_or(0);
                Step::Push {
                    qp,
                    kind: b1 & 3,
                    signaled: b1 & 4 != 0,
                }
            }
            8..=9 => Step::Submit,
            10 => Step::SubmitTaking(usize::from(it.next().unwrap_or(0) % 4)),
            11 => {
                let b1 = it.next().unwrap_or(0);
                Step::SubmitOverclaiming {
                    extra: usize::from(b1 % 3),
                    took: (b1 & 0x80 != 0).then_some(usize::from((b1 >> 4) & 3)),
                }
            }
            12 | 13 => Step::Progress,
            14 => Step::ExecuteOne(qp),
            15..=17 => Step::Poll,
            18 => {
                let b1 = it.next().unwrap_or(0);
                Step::Forge {
                    forgery: Forgery::NearMiss {
                        back: usize::from(b1 & 7),
                        delta: usize::from(b1 >> 3),
                    },
                    qp,
                }
            }
            19 => {
                let mut raw = [0u8; 8];
                for byte in &mut raw {
                    *byte = it.next().unwrap_or(0);
                }
                Step::Forge {
                    forgery: Forgery::Raw(u64::from_le_bytes(raw)),
                    qp,
                }
            }
            20 | 21 => Step::Repeat(usize::from(it.next().unwrap_or(0))),
            22 => Step::Hold(qp),
            23 | 24 => Step::Release,
            25 => Step::Fail(qp),
            26 => Step::Fatal(qp),
            27 => Step::FailQp(qp),
            28 => Step::SrqRecv(qp),
            29 => Step::SrqPeerSend(qp),
            30 => Step::SrqQp(qp),
            31 => Step::Reattach(qp),
            _ => Step::PeerRecv(qp),
        };
        steps.push(step);
    }
    steps
}

/// The server ring (over the adversary), the device side, and the
/// graveyard.
pub struct Adversary {
    pub device: Device,
    ring: Ring<AdvQp>,
    handles: Vec<QpHandle>,
    next_id: u64,
    pushed: HashSet<u64>,
    returned: HashSet<u64>,
    /// Per queue pair and queue (sends, receives), the last operation
    /// handed back: each queue's come back in the order pushed.
    last_back: std::collections::HashMap<(QpHandle, bool), u64>,
    /// Buffers handed back, poisoned, still registered.
    graveyard: Vec<RegisteredBuf>,
    leaked_before: u64,
    /// Held for the run: the leak count it reads is the process's.
    _counting: std::sync::MutexGuard<'static, ()>,
    /// What happened, for coverage reports.
    pub returned_ops: usize,
}

/// Held by every run that counts leaked buffers, so that runs in parallel
/// threads take turns: the count is the process's, and another run's
/// leaks would hide this one's lost operations.
pub fn leak_counting() -> std::sync::MutexGuard<'static, ()> {
    static COUNTING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    COUNTING.lock().unwrap_or_else(|p| p.into_inner())
}

impl Adversary {
    /// Buffers handed back and checked for late writes.
    pub fn buried(&self) -> usize {
        self.graveyard.len()
    }

    pub fn new() -> Adversary {
        let counting = leak_counting();
        let (device, ring, handles) = ring_over_device(RingConfig {
            signal_interval: 4,
            ..RingConfig::default()
        });
        Adversary {
            leaked_before: rdma_ring::leak::leaked().buffers,
            _counting: counting,
            device,
            ring,
            handles,
            next_id: 1,
            pushed: HashSet::new(),
            returned: HashSet::new(),
            last_back: std::collections::HashMap::new(),
            graveyard: Vec::new(),
            returned_ops: 0,
        }
    }

    pub fn run(steps: &[Step]) -> Adversary {
        let mut adversary = Adversary::new();
        for step in steps {
            adversary.apply(step);
        }
        adversary.finish();
        adversary
    }

    fn apply(&mut self, step: &Step) {
        match self.device.apply(step) {
            RingStep::None => {}
            RingStep::Push { qp, kind, signaled } => self.push(qp, kind, signaled),
            RingStep::Submit => self.submit(),
            RingStep::Poll => self.poll(),
            // This ring's scenarios keep their queue pairs whole; these
            // steps read as a peer's receive, as before they existed.
            RingStep::Reattach(qp) | RingStep::Fatal(qp) | RingStep::FailQp(qp) => {
                self.device.apply(&Step::PeerRecv(qp));
            }
            // Only a harness with a shared receive queue's peer gets these.
            RingStep::SrqRecv | RingStep::SrqRefill | RingStep::SrqQp(_) => {
                unreachable!("no shared receive queue")
            }
        }
    }

    fn push(&mut self, qp: usize, kind: u8, signaled: bool) {
        let id = self.next_id;
        self.next_id += 1;
        let target = self.device.target();
        let buf = RegisteredBuf::new(&self.device.pd, vec![(id as u8) | 1; LEN]).unwrap();
        let mut sq = self.ring.submission_on(self.handles[qp]);
        macro_rules! push {
            ($op:expr) => {{
                let op = $op.user_data(id);
                let op = if signaled { op.signaled() } else { op };
                sq.push(op).map_err(|r| r.into_parts().1.into_buf())
            }};
        }
        let refused = match kind {
            0 => push!(Write::new(buf, target)),
            1 => push!(Read::new(buf, target)),
            2 => push!(Send::new(buf)),
            _ => sq
                .push(Recv::new(buf).user_data(id))
                .map_err(|r| r.into_parts().1.into_buf()),
        };
        match refused {
            Ok(()) => {
                self.pushed.insert(id);
            }
            Err(buf) => self.bury(buf),
        }
    }

    fn submit(&mut self) {
        if let Err(e) = self.ring.submit() {
            for unposted in e.unposted {
                assert!(self.pushed.remove(&unposted.user_data), "unposted twice");
                for buf in unposted.bufs {
                    self.bury(buf.downcast().expect("a RegisteredBuf"));
                }
            }
        }
        self.device.after_submit();
    }

    fn poll(&mut self) {
        let mut out = Vec::new();
        // Unknown `wr_id`s are reported as errors; the completions polled
        // with them are kept, and the ring goes on. Nothing else may fail.
        if let Err(e) = self.ring.completion().reap(&mut out) {
            assert!(matches!(e, Error::UnknownWrId { .. }), "reap failed: {e}");
        }
        for c in out {
            self.returned_op(c);
        }
        self.device.peers_reap();
    }

    fn returned_op(&mut self, c: Completion) {
        let id = c.user_data();
        assert!(
            self.pushed.contains(&id),
            "an op that was never pushed came back"
        );
        assert!(self.returned.insert(id), "op {id} came back twice");
        let qp = c.qp().expect("every operation is of a queue pair");
        let recv = c.kind() == rdma_ring::op::OpKind::Recv;
        let last = self.last_back.insert((qp, recv), id).unwrap_or(0);
        assert!(last < id, "op {id} of {qp:?} came back after op {last}");
        self.returned_ops += 1;
        for buf in c.into_bufs() {
            self.bury(buf.downcast().expect("a RegisteredBuf"));
        }
    }

    fn bury(&mut self, buf: RegisteredBuf) {
        bury(&mut self.graveyard, buf);
    }

    fn finish(&mut self) {
        self.device.settle();
        self.poll();
        // Every forgery the ring was handed names nothing of its own.
        let delivered = self.device.knobs.lock().unwrap().delivered_forgeries;
        let unknown = self.ring.stats().unknown_cqes;
        assert!(
            unknown >= delivered,
            "{delivered} forged completions handed to the ring, {unknown} counted as unknown"
        );
        // Close: every queue pair to error, drained (or leaked); whatever
        // the adversary still holds comes out too.
        let ring = std::mem::replace(
            &mut self.ring,
            Ring::with_cq(
                AdvCq {
                    inner: self.device.dev.create_cq(1).unwrap(),
                    knobs: Arc::clone(&self.device.knobs),
                },
                RingConfig::default(),
            ),
        );
        for c in ring.close() {
            self.returned_op(c);
        }
        // Run the device dry: nothing it still held may touch a buried
        // buffer.
        self.device.run_dry();
        check_graveyard(&self.graveyard);
        self.device.check_peers_saw_no_poison();
        let leaked = (rdma_ring::leak::leaked().buffers - self.leaked_before) as usize;
        let missing = self.pushed.len() - self.returned.len();
        check_losses(missing, leaked, self.device.untaken());
    }
}

/// How long a drain waits for what the adversary keeps. Short, as only
/// such work waits it out: the soft device flushes a queue pair's work as
/// the queue pair moves to error, so a drain that can finish finds every
/// completion already queued, and each drain reaps all that is queued
/// before it gives up (a descheduled thread cannot make it miss any), up
/// to what its completion queue holds, which [`MAX_FORGED`] keeps the
/// forged backlog well within.
pub const DRAIN_TIMEOUT: std::time::Duration = std::time::Duration::from_millis(20);

/// The device side, and a ring over its completion queue (with a short
/// drain timeout: what the adversary keeps is leaked soon) with its queue
/// pairs attached.
fn ring_over_device(config: RingConfig) -> (Device, Ring<AdvQp>, Vec<QpHandle>) {
    let (mut device, cq) = Device::new();
    let mut ring: Ring<AdvQp> = Ring::with_cq(
        cq,
        RingConfig {
            drain_timeout: DRAIN_TIMEOUT,
            ..config
        },
    );
    let handles = device
        .queue_pairs(&ring.cq().inner)
        .into_iter()
        .map(|qp| ring.attach(qp).unwrap_or_else(|_| panic!("attach")))
        .collect();
    (device, ring, handles)
}

/// Operations that never came back (`missing`) must each be counted as
/// leaked, and only work the device said it took and did not may be
/// missing: a ring that loses a completion, or leaks an operation the
/// device gave back, fails here.
fn check_losses(missing: usize, leaked: usize, untaken: usize) {
    assert!(
        missing <= leaked,
        "{missing} operations never came back, {leaked} buffers counted as leaked"
    );
    assert!(
        leaked <= untaken,
        "{leaked} buffers leaked, but the device kept only {untaken} work requests"
    );
}

/// Poisons a buffer a ring handed back and keeps it, still registered.
fn bury(graveyard: &mut Vec<RegisteredBuf>, mut buf: RegisteredBuf) {
    buf.fill(POISON);
    graveyard.push(buf);
}

/// Once the device has run dry: no buffer handed back was written after.
fn check_graveyard(graveyard: &[RegisteredBuf]) {
    for (i, buf) in graveyard.iter().enumerate() {
        assert!(
            buf.iter().all(|&b| b == POISON),
            "buffer {i} was written after the ring handed it back"
        );
    }
}

impl Default for Adversary {
    fn default() -> Self {
        Adversary::new()
    }
}
