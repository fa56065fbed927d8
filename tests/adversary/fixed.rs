//! The fixed ring over the same adversarial device, driven by the same
//! scenarios. Every slot token the ring hands back has its slot poisoned
//! and is kept out of use; at the end, after every queue pair is detached
//! and the device has run dry, each of those slots must still hold only
//! poison. The ring must never panic, never hand an operation back twice,
//! and every operation must come back, or closing the ring must say it
//! kept the slots' memory.
//!
//! Beside the two queue pairs of every scenario, the ring holds a shared
//! receive queue with a third queue pair on it, whose peer sends when a
//! step says so: its receives face the same forged, repeated and held
//! completions, and its queue pair is failed or replaced (detached,
//! destroyed, a new one with a new peer attached) mid-scenario.

use std::collections::HashSet;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use rdma_ring::backend::soft::{SoftDevice, SoftPd};
use rdma_ring::backend::{AsyncEvent, RawCompletion, SrqConfig, WcStatus};
use rdma_ring::fixed::{
    FixedBuf, FixedBufs, FixedCompletion, FixedQp, FixedRing, FixedRingConfig, FixedSrq,
    FixedSrqRefill, ReadFixed, RecvFixed, SendFixed, WriteFixed,
};
use rdma_ring::future::{AsyncFixedRing, Wakeup};

use super::device::{Device, RingStep};
use super::{AdvCq, AdvQp, AdvSrq, Shared, Step, LEN, POISON};

/// Slots in the table: more than a scenario can push.
const SLOTS: u32 = 512;

/// The fixed ring (over the adversary), the device side, and the
/// graveyard.
pub struct FixedAdversary {
    pub device: Device,
    ring: FixedRing<AdvQp>,
    handles: Vec<FixedQp>,
    srq: FixedSrq,
    /// The queue pair on the shared receive queue, and every one that was.
    srq_qp: FixedQp,
    srq_qpn: u32,
    srq_qps: HashSet<FixedQp>,
    /// Every handle of the other queue pairs, past ones too.
    other_qps: HashSet<FixedQp>,
    /// Operations pushed to the shared receive queue.
    srq_ids: HashSet<u64>,
    /// Whether the ring keeps the shared receive queue topped up.
    refilling: bool,
    next_id: u64,
    /// Polls made, to alternate the two ways of reaping.
    polls: u64,
    /// Pushes queued to go to the ring together: queue pair, kind,
    /// whether signaled.
    pending: Vec<(usize, u8, bool)>,
    /// Runs of pushes made, to alternate the two ways of pushing.
    runs: u64,
    pushed: HashSet<u64>,
    returned: HashSet<u64>,
    /// Per queue pair, the last send handed back: a queue pair's sends
    /// come back in the order they were pushed (ids rise), flushes of
    /// work never posted included.
    last_send: std::collections::HashMap<FixedQp, u64>,
    /// Queue pairs whose detach timed out: the device keeps work of theirs
    /// (a post it took part of and could not say so), so another detach
    /// would only wait the drain's timeout again. They stay until the end.
    stuck: HashSet<FixedQp>,
    /// Tokens handed back, their slots poisoned, never used again, and
    /// their slots' indexes (no slot may be handed back twice).
    graveyard: Vec<FixedBuf>,
    buried_slots: HashSet<u32>,
    /// What happened, for coverage reports.
    pub returned_ops: usize,
    pub failed_ops: usize,
    pub reattached: usize,
    pub reattached_late: usize,
    /// Queue pairs failed by an event or on request.
    pub fatal: usize,
    /// Receives of the shared queue that a message filled.
    pub srq_filled: usize,
    /// Queue pairs on the shared queue replaced, and failed.
    pub srq_replaced: usize,
    pub srq_failed: usize,
    /// The refill's receives handed back.
    pub refill_returned: usize,
    /// Operations pushed through a batch of more than one, and those
    /// refused by a batch (as it opened, or there).
    pub batched: usize,
    pub batch_refused: usize,
    /// Submits made, every third through one queue pair's `submit_qp`.
    submits: u64,
}

/// The tag of the refill's receives: no pushed operation's.
const REFILL_ID: u64 = u64::MAX;

/// An operation of a push step.
enum AnyOp {
    Write(WriteFixed),
    Read(ReadFixed),
    Send(SendFixed),
    Recv(RecvFixed),
}

impl AnyOp {
    fn into_buf(self) -> FixedBuf {
        match self {
            AnyOp::Write(op) => op.into_buf(),
            AnyOp::Read(op) => op.into_buf(),
            AnyOp::Send(op) => op.into_buf(),
            AnyOp::Recv(op) => op.into_buf(),
        }
    }
}

impl FixedAdversary {
    pub fn new() -> FixedAdversary {
        let (mut device, cq) = Device::new();
        let bufs = FixedBufs::new(&device.pd, SLOTS, LEN as u32).unwrap();
        let mut ring: FixedRing<AdvQp> = FixedRing::new(
            cq,
            bufs,
            FixedRingConfig {
                signal_interval: 4,
                drain_timeout: super::DRAIN_TIMEOUT,
                ..FixedRingConfig::default()
            },
        );
        let handles: Vec<FixedQp> = device
            .queue_pairs(&ring.cq().inner)
            .into_iter()
            .map(|qp| ring.attach(qp).unwrap_or_else(|_| panic!("attach")))
            .collect();
        let other_qps = handles.iter().copied().collect();
        let srq = device
            .dev
            .create_srq(
                &device.pd,
                SrqConfig {
                    max_wr: 8,
                    max_sge: 1,
                },
            )
            .unwrap();
        let srq = ring
            .add_srq(AdvSrq::new(srq, &device.knobs))
            .unwrap_or_else(|_| panic!("add_srq"));
        let (qp, srq_qpn) = device.srq_queue_pair(&ring.cq().inner, &ring.srq(srq).unwrap().inner);
        let srq_qp = ring.attach(qp).unwrap_or_else(|_| panic!("attach"));
        FixedAdversary {
            device,
            ring,
            handles,
            srq,
            srq_qp,
            srq_qpn,
            srq_qps: HashSet::from([srq_qp]),
            other_qps,
            srq_ids: HashSet::new(),
            refilling: false,
            next_id: 1,
            polls: 0,
            pending: Vec::new(),
            runs: 0,
            pushed: HashSet::new(),
            returned: HashSet::new(),
            last_send: std::collections::HashMap::new(),
            stuck: HashSet::new(),
            graveyard: Vec::new(),
            buried_slots: HashSet::new(),
            returned_ops: 0,
            failed_ops: 0,
            reattached: 0,
            reattached_late: 0,
            fatal: 0,
            srq_filled: 0,
            srq_replaced: 0,
            srq_failed: 0,
            refill_returned: 0,
            batched: 0,
            batch_refused: 0,
            submits: 0,
        }
    }

    /// Slot tokens handed back and checked for late writes.
    pub fn buried(&self) -> usize {
        self.graveyard.len()
    }

    pub fn run(steps: &[Step]) -> FixedAdversary {
        let mut adversary = FixedAdversary::new();
        for step in steps {
            adversary.apply(step);
        }
        adversary.finish();
        adversary
    }

    fn apply(&mut self, step: &Step) {
        let step = self.device.apply(step);
        if !matches!(step, RingStep::Push { .. }) {
            self.push_pending();
        }
        match step {
            RingStep::None => {}
            RingStep::Push { qp, kind, signaled } => self.push(qp, kind, signaled),
            RingStep::Submit => {
                // A refused post's work comes back flushed from the next
                // reap. Every third submit rings one queue pair's doorbell
                // alone (the others' work waits for a later submit).
                self.submits += 1;
                let _ = if self.submits % 3 == 0 {
                    let qp = self.handles[(self.submits / 3) as usize % self.handles.len()];
                    self.ring.submit_qp(qp)
                } else {
                    self.ring.submit()
                };
                self.device.after_submit();
            }
            RingStep::Poll => self.poll(),
            RingStep::Reattach(qp) => {
                // Held completions would only make the drain time out.
                self.device.knobs.lock().unwrap().hold = None;
                self.reattached += 1;
                if self.stuck.contains(&self.handles[qp]) {
                    self.reattached_late += 1;
                    return;
                }
                match self.ring.detach(self.handles[qp]) {
                    Ok(back) => {
                        self.handles[qp] = self
                            .ring
                            .attach(back)
                            .unwrap_or_else(|_| panic!("attach again"));
                        self.other_qps.insert(self.handles[qp]);
                    }
                    // Still attached, in error: the scenario goes on.
                    Err(_) => {
                        self.reattached_late += 1;
                        self.stuck.insert(self.handles[qp]);
                    }
                }
            }
            RingStep::Fatal(qp) => {
                self.fatal += 1;
                // The main ring's harness takes this step as a peer's
                // receive: the device fails the queue pair only here.
                self.device.controls[qp].inject_fatal();
                let qp_num = self.device.qp_nums[qp];
                assert!(
                    self.ring.apply_event(AsyncEvent::QpFatal { qp_num }),
                    "an attached queue pair's event concerns the ring"
                );
            }
            RingStep::FailQp(qp) => {
                self.fatal += 1;
                self.ring.fail_qp(self.handles[qp]).unwrap();
            }
            RingStep::SrqRecv => self.push_srq(),
            RingStep::SrqRefill => {
                let refill = (!self.refilling).then_some(FixedSrqRefill {
                    low: 2,
                    target: 6,
                    user_data: REFILL_ID,
                });
                // A bent post stops the refill (its receives come back
                // flushed); a failed ring refuses it.
                let _ = self.ring.set_srq_refill(self.srq, refill);
                self.refilling = self.ring.srq_refill(self.srq).unwrap().is_some();
            }
            RingStep::SrqQp(true) => {
                self.srq_failed += 1;
                self.ring.fail_qp(self.srq_qp).unwrap();
            }
            RingStep::SrqQp(false) => {
                self.device.knobs.lock().unwrap().hold = None;
                // Still attached, in error, if the drain timed out: the
                // scenario goes on with it.
                if self.stuck.contains(&self.srq_qp) {
                    return;
                }
                let detached = self.ring.detach(self.srq_qp);
                if detached.is_err() {
                    self.stuck.insert(self.srq_qp);
                }
                if let Ok(old) = detached {
                    self.srq_replaced += 1;
                    // What it took comes back before it goes.
                    let last = AsyncEvent::LastWqeReached {
                        qp_num: self.srq_qpn,
                    };
                    assert!(
                        self.ring.apply_event(last),
                        "a queue pair detached from the queue"
                    );
                    drop(old);
                    let (qp, qpn) = self.device.srq_queue_pair(
                        &self.ring.cq().inner,
                        &self.ring.srq(self.srq).unwrap().inner,
                    );
                    self.srq_qpn = qpn;
                    self.srq_qp = self
                        .ring
                        .attach(qp)
                        .unwrap_or_else(|_| panic!("attach to the shared queue"));
                    self.srq_qps.insert(self.srq_qp);
                }
            }
        }
    }

    fn push_srq(&mut self) {
        let Some(mut buf) = self.ring.take_buf() else {
            return;
        };
        let id = self.next_id;
        self.next_id += 1;
        self.ring.bufs().bytes_mut(&mut buf).fill((id as u8) | 1);
        match self
            .ring
            .push_srq(self.srq, RecvFixed::new(buf).user_data(id))
        {
            Ok(()) => {
                self.pushed.insert(id);
                self.srq_ids.insert(id);
            }
            Err(refused) => self.bury(refused.into_parts().1.into_buf()),
        }
    }

    /// Queues a push: a run of pushes to one queue pair goes to the ring
    /// together, at the next step of another kind (pushes touch no device,
    /// so none is reordered against anything the device sees).
    fn push(&mut self, qp: usize, kind: u8, signaled: bool) {
        if self.pending.first().is_some_and(|&(first, ..)| first != qp) {
            self.push_pending();
        }
        self.pending.push((qp, kind, signaled));
    }

    /// Pushes the queued run: every other run through one batch (the
    /// ring's and the queue pair's checks made once; a batch that does not
    /// open refuses them all), the others one push at a time.
    fn push_pending(&mut self) {
        let Some(&(qp, ..)) = self.pending.first() else {
            return;
        };
        self.runs += 1;
        let batched = self.runs % 2 == 0;
        let handle = self.handles[qp];
        let target = self.device.target();
        let mut ops = Vec::new();
        for (_, kind, signaled) in std::mem::take(&mut self.pending) {
            let Some(mut buf) = self.ring.take_buf() else {
                break;
            };
            let id = self.next_id;
            self.next_id += 1;
            self.ring.bufs().bytes_mut(&mut buf).fill((id as u8) | 1);
            macro_rules! send {
                ($op:expr) => {{
                    let op = $op.user_data(id);
                    if signaled {
                        op.signaled()
                    } else {
                        op
                    }
                }};
            }
            let op = match kind {
                0 => AnyOp::Write(send!(WriteFixed::new(buf, LEN as u32, target))),
                1 => AnyOp::Read(send!(ReadFixed::new(buf, LEN as u32, target))),
                2 => AnyOp::Send(send!(SendFixed::new(buf, LEN as u32))),
                _ => AnyOp::Recv(RecvFixed::new(buf).user_data(id)),
            };
            ops.push((id, op));
        }
        // Each operation's id, and its slot if it was refused.
        let mut done: Vec<(u64, Option<FixedBuf>)> = Vec::new();
        macro_rules! each {
            ($op:expr, $x:ident => $push:expr) => {
                match $op {
                    AnyOp::Write($x) => $push.map_err(|r| r.into_parts().1.into_buf()),
                    AnyOp::Read($x) => $push.map_err(|r| r.into_parts().1.into_buf()),
                    AnyOp::Send($x) => $push.map_err(|r| r.into_parts().1.into_buf()),
                    AnyOp::Recv($x) => $push.map_err(|r| r.into_parts().1.into_buf()),
                }
            };
        }
        if batched {
            match self.ring.batch(handle) {
                Ok(mut batch) => {
                    let many = ops.len() > 1;
                    for (id, op) in ops {
                        let refused = each!(op, op => batch.push(op)).err();
                        if many {
                            self.batched += 1;
                            self.batch_refused += usize::from(refused.is_some());
                        }
                        done.push((id, refused));
                    }
                }
                Err(_) => {
                    self.batch_refused += ops.len();
                    for (id, op) in ops {
                        done.push((id, Some(op.into_buf())));
                    }
                }
            }
        } else {
            for (id, op) in ops {
                done.push((id, each!(op, op => self.ring.push(handle, op)).err()));
            }
        }
        for (id, refused) in done {
            match refused {
                None => {
                    self.pushed.insert(id);
                }
                Some(buf) => self.bury(buf),
            }
        }
    }

    fn poll(&mut self) {
        // Every other poll hands each completion to a closure as it is
        // made.
        self.polls += 1;
        let mut out = Vec::new();
        // Forged completions are counted (`unknown_completions`), not
        // reported: no reap may fail.
        let reaped = if self.polls % 2 == 0 {
            let taken = self.ring.reap_each(|c| out.push(c));
            if let Ok(taken) = taken {
                assert_eq!(taken, out.len(), "what reap_each says it handed out");
            }
            taken.map(drop)
        } else {
            self.ring.reap(&mut out).map(drop)
        };
        if let Err(e) = reaped {
            panic!("reap failed: {e}");
        }
        self.returned_all(out);
        self.device.peers_reap();
    }

    fn returned_all(&mut self, out: Vec<FixedCompletion>) {
        for c in out {
            let id = c.user_data();
            if id == REFILL_ID {
                // Not tracked one by one: the slot is (see `bury`).
                self.refill_returned += 1;
            } else {
                assert!(
                    self.pushed.contains(&id),
                    "an op that was never pushed came back"
                );
                assert!(self.returned.insert(id), "op {id} came back twice");
                if c.kind() != rdma_ring::op::OpKind::Recv {
                    let last = self.last_send.insert(c.qp(), id).unwrap_or(0);
                    assert!(
                        last < id,
                        "send {id} of {:?} came back after send {last}",
                        c.qp()
                    );
                }
            }
            self.returned_ops += 1;
            if !c.status().is_success() {
                self.failed_ops += 1;
            } else if id == REFILL_ID || self.srq_ids.contains(&id) {
                self.srq_filled += 1;
                // The queue pair it arrived on (which may have been
                // replaced since), or none, if it was detached before the
                // completion was reaped; never another.
                assert!(
                    self.srq_qps.contains(&c.qp())
                        || (self.ring.qp_error(c.qp()).is_err()
                            && !self.other_qps.contains(&c.qp())),
                    "a filled shared receive names another queue pair: {c:?}"
                );
            }
            self.bury(c.into_buf());
        }
    }

    /// Poisons a slot the ring handed back and keeps its token.
    fn bury(&mut self, mut buf: FixedBuf) {
        assert!(
            self.buried_slots.insert(buf.index()),
            "slot {} handed back twice",
            buf.index()
        );
        self.ring.bufs().bytes_mut(&mut buf).fill(POISON);
        self.graveyard.push(buf);
    }

    fn finish(&mut self) {
        self.push_pending();
        self.device.settle();
        self.poll();
        // Detach every queue pair: to error, drained (or left attached
        // when the adversary keeps its work); what was never posted and
        // what the drain brought back come out of the next reap.
        let mut drained = true;
        for handle in self.handles.clone() {
            drained &= self.ring.detach(handle).is_ok();
        }
        // The queue pair on the shared queue goes too, and is destroyed;
        // then the queue, whose receives come back flushed.
        match self.ring.detach(self.srq_qp) {
            Ok(qp) => {
                drop(qp);
                drained &= self.ring.remove_srq(self.srq).is_ok();
            }
            Err(_) => drained = false,
        }
        let mut out = Vec::new();
        let _ = self.ring.reap(&mut out);
        self.returned_all(out);
        let delivered = self.device.knobs.lock().unwrap().delivered_forgeries;
        let unknown = self.ring.unknown_completions();
        assert!(
            unknown >= delivered,
            "{delivered} forged completions handed to the ring, {unknown} counted as unknown"
        );
        // Run the device dry: nothing it still held may touch a buried
        // slot.
        self.device.run_dry();
        self.device.check_peers_saw_no_poison();
        for (i, buf) in self.graveyard.iter().enumerate() {
            assert!(
                self.ring.bufs().bytes(buf).iter().all(|&b| b == POISON),
                "slot {} (token {i}) was written after the ring handed it back",
                buf.index()
            );
        }
        // Every slot the ring took (for a push or a refill) and did not
        // hand back; the harness keeps none outside the graveyard.
        let missing = (SLOTS - self.ring.bufs().free()) as usize - self.graveyard.len();
        assert!(
            missing >= self.pushed.len() - self.returned.len(),
            "every pushed operation missing holds a slot"
        );
        assert!(
            drained || missing > 0,
            "a detach timed out with every operation back"
        );
        // Only work the device kept while saying it took it may be missing
        // (or hold up a detach).
        let untaken = self.device.untaken();
        assert!(
            missing <= untaken,
            "{missing} slots never came back, but the device kept only {untaken} work requests"
        );
        assert!(
            self.stuck.is_empty() || untaken > 0,
            "a detach timed out though the device kept nothing"
        );
        // Closing says whether the ring let go of everything: it must not
        // have, if operations are missing (it keeps their memory then).
        let blank = blank_ring(&self.device.dev, &self.device.pd, &self.device.knobs);
        let ring = std::mem::replace(&mut self.ring, blank);
        let closed = ring.close();
        assert_eq!(
            closed.is_ok(),
            missing == 0,
            "{missing} slots never came back; closing said {closed:?}"
        );
    }
}

/// A waker that notes it was woken.
struct Flag(AtomicBool);

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// A lowered flag and a waker that raises it.
fn flag() -> (Arc<Flag>, Waker) {
    let flag = Arc::new(Flag(AtomicBool::new(false)));
    let waker = Waker::from(Arc::clone(&flag));
    (flag, waker)
}

/// Polls `future` once with a waker that does nothing (the fuzz targets
/// that share this module have no executor crate).
fn now<F: Future>(future: F) -> Option<F::Output> {
    let mut cx = Context::from_waker(Waker::noop());
    match std::pin::pin!(future).poll(&mut cx) {
        Poll::Ready(output) => Some(output),
        Poll::Pending => None,
    }
}

impl FixedAdversary {
    /// The scenario's ring, shared awaited (busy polling), a blank ring
    /// left in its place.
    fn awaited(&mut self) -> AsyncFixedRing<AdvQp> {
        let blank = blank_ring(&self.device.dev, &self.device.pd, &self.device.knobs);
        let ring = std::mem::replace(&mut self.ring, blank);
        AsyncFixedRing::new(ring, Wakeup::Busy).unwrap_or_else(|_| panic!("idle"))
    }
}

/// A ring with no queue pairs, to put in the place of one being dropped.
fn blank_ring(dev: &SoftDevice, pd: &SoftPd, knobs: &Shared) -> FixedRing<AdvQp> {
    FixedRing::new(
        AdvCq {
            inner: dev.create_cq(1).unwrap(),
            knobs: Arc::clone(knobs),
        },
        FixedBufs::new(pd, 1, 8).unwrap(),
        FixedRingConfig::default(),
    )
}

impl Default for FixedAdversary {
    fn default() -> Self {
        FixedAdversary::new()
    }
}

/// A completion of a queue pair's earlier attachment, delivered again
/// after the same queue pair is detached and attached anew (the slot and
/// QP number are the same), must not release the new attachment's work;
/// nor may a forged failed completion naming nothing put it in error.
pub fn replayed_completion_after_reattach() {
    let mut a = FixedAdversary::new();
    let first = a.handles[0];
    let slot = a.ring.take_buf().unwrap();
    a.ring
        .push(
            first,
            ReadFixed::new(slot, LEN as u32, a.device.target()).user_data(1),
        )
        .unwrap();
    a.ring.submit().unwrap();
    a.device.dev.progress();
    let mut out = a.ring.wait(1).unwrap();
    assert!(out[0].status().is_success());
    let old = *a
        .device
        .knobs
        .lock()
        .unwrap()
        .history
        .last()
        .expect("reported");
    for c in out.drain(..) {
        a.ring.put_buf(c.into_buf()).unwrap();
    }
    let qp = a.ring.detach(first).unwrap();
    let again = a.ring.attach(qp).unwrap_or_else(|_| panic!("attach"));
    assert_ne!(again, first);
    // The new READ sits in the device, not executed (manual progress).
    let slot = a.ring.take_buf().unwrap();
    a.ring
        .push(
            again,
            ReadFixed::new(slot, LEN as u32, a.device.target()).user_data(2),
        )
        .unwrap();
    a.ring.submit().unwrap();
    let unknown = a.ring.unknown_completions();
    {
        let mut knobs = a.device.knobs.lock().unwrap();
        knobs.forged.push_back(old);
        // Slot 0's first receive, never posted, failed.
        knobs.forged.push_back(RawCompletion {
            wr_id: 1 << 47,
            qp_num: a.device.qp_nums[0],
            status: WcStatus::RemAccessErr,
            ..RawCompletion::default()
        });
    }
    a.ring.reap(&mut out).unwrap();
    assert!(out.is_empty(), "a replayed completion released {out:?}");
    assert_eq!(a.ring.unknown_completions(), unknown + 2);
    assert_eq!(a.ring.qp_error(again).unwrap(), None);
    // The device runs it; now it comes back, once.
    a.device.dev.progress();
    let out = a.ring.wait(1).unwrap();
    assert_eq!(out.len(), 1);
    assert_eq!(
        (out[0].user_data(), out[0].status()),
        (2, WcStatus::Success)
    );
}

/// Completions that name a shared receive queue's receive without being
/// its own — the queue bit without the receive bit, another queue's slot,
/// a replay of one already handed back — release nothing; the real one
/// comes back once, naming its queue pair.
pub fn forged_shared_receive_completions_release_nothing() {
    const RECV: u64 = 1 << 47;
    const SRQ: u64 = 1 << 46;
    let mut a = FixedAdversary::new();
    for id in [1, 2] {
        let slot = a.ring.take_buf().unwrap();
        a.ring
            .push_srq(a.srq, RecvFixed::new(slot).user_data(id))
            .unwrap();
    }
    a.ring.submit().unwrap();
    let srq_qpn = a.srq_qpn;
    let unknown = a.ring.unknown_completions();
    let forge = |a: &mut FixedAdversary, wr_id: u64| {
        a.device
            .knobs
            .lock()
            .unwrap()
            .forged
            .push_back(RawCompletion {
                wr_id,
                qp_num: srq_qpn,
                byte_len: LEN as u32,
                ..RawCompletion::default()
            });
    };
    // Sequence 0 of the queue in slot 0: without the receive bit, and in
    // slot 1 (no queue there).
    forge(&mut a, SRQ);
    forge(&mut a, (1 << 48) | RECV | SRQ);
    let mut out = Vec::new();
    a.ring.reap(&mut out).unwrap();
    assert!(out.is_empty(), "a forged completion released {out:?}");
    assert_eq!(a.ring.unknown_completions(), unknown + 2);

    // The peer's message fills the first receive: it comes back once.
    a.device.apply(&super::Step::SrqPeerSend(0));
    a.device.dev.progress();
    let done = a.ring.wait(1).unwrap();
    assert_eq!(
        (done[0].user_data(), done[0].status(), done[0].qp()),
        (1, WcStatus::Success, a.srq_qp)
    );
    let real = *a.device.knobs.lock().unwrap().history.last().unwrap();
    assert_eq!(real.wr_id, RECV | SRQ, "the ring's own wr_id layout");
    forge(&mut a, real.wr_id);
    a.device.knobs.lock().unwrap().forged.push_back(real);
    let mut out = Vec::new();
    a.ring.reap(&mut out).unwrap();
    assert!(out.is_empty(), "a replayed completion released {out:?}");
    assert_eq!(a.ring.unknown_completions(), unknown + 4);
    assert_eq!(
        a.ring.srq_posted(a.srq).unwrap(),
        1,
        "the second still posted"
    );
}

/// A shared receive queue that takes only part of a post: the rest comes
/// back flushed, never posted, with its completion queue credit, and the
/// queue takes more after.
pub fn a_partly_refused_shared_post_hands_the_rest_back() {
    let mut a = FixedAdversary::new();
    let posted_before = a.ring.srq_posted(a.srq).unwrap();
    for id in 1..=3 {
        let slot = a.ring.take_buf().unwrap();
        a.ring
            .push_srq(a.srq, RecvFixed::new(slot).user_data(id))
            .unwrap();
    }
    a.device.knobs.lock().unwrap().accept = Some(1);
    assert!(a.ring.submit().is_err(), "the refusal is reported");
    a.device.after_submit();
    let mut out = Vec::new();
    a.ring.reap(&mut out).unwrap();
    let mut seen: Vec<_> = out.iter().map(|c| (c.user_data(), c.status())).collect();
    seen.sort_unstable_by_key(|&(id, _)| id);
    assert_eq!(seen, [(2, WcStatus::WrFlushErr), (3, WcStatus::WrFlushErr)]);
    assert_eq!(a.ring.srq_posted(a.srq).unwrap(), posted_before + 1);
    for c in out {
        a.ring.put_buf(c.into_buf()).unwrap();
    }
    // The queue (depth 8) takes seven more: the refused ones' places and
    // credits came back.
    for id in 4..=10 {
        let slot = a.ring.take_buf().unwrap();
        a.ring
            .push_srq(a.srq, RecvFixed::new(slot).user_data(id))
            .unwrap();
    }
    assert_eq!(a.ring.submit().unwrap(), 7);
    assert_eq!(a.ring.srq_posted(a.srq).unwrap(), 8);
}

/// A receive post the device takes none of while saying it took it all:
/// the sends pushed beside it are never posted, and wait behind it. When
/// the detach gives up on the receive, they come back from the next reap
/// (none of them is on the device), not only when the ring is closed.
pub fn what_a_timed_out_detach_never_posted_comes_back() {
    let mut a = FixedAdversary::new();
    let qp = a.handles[0];
    let target = a.device.target();
    let slot = a.ring.take_buf().unwrap();
    a.ring.push(qp, RecvFixed::new(slot).user_data(1)).unwrap();
    for id in 2..=4 {
        let slot = a.ring.take_buf().unwrap();
        let write = WriteFixed::new(slot, LEN as u32, target).user_data(id);
        a.ring.push(qp, write).unwrap();
    }
    {
        let mut knobs = a.device.knobs.lock().unwrap();
        knobs.accept = Some(0);
        knobs.overclaim = Some(0);
    }
    assert!(a.ring.submit().is_err(), "the refusal is reported");
    a.device.after_submit();
    assert!(matches!(
        a.ring.detach(qp),
        Err(rdma_ring::Error::Timeout(_))
    ));
    let mut out = Vec::new();
    a.ring.reap(&mut out).unwrap();
    let seen: Vec<_> = out.iter().map(|c| (c.user_data(), c.status())).collect();
    let flushed = WcStatus::WrFlushErr;
    assert_eq!(seen, [(2, flushed), (3, flushed), (4, flushed)]);
}

/// A receive the detached queue pair took, whose completion comes after
/// the detach: applying the device's `LastWqeReached` for it reaps it,
/// naming no queue pair, and forgets the queue pair.
pub fn the_last_receive_of_a_detached_queue_pair_comes_back_on_its_event() {
    let mut a = FixedAdversary::new();
    let slot = a.ring.take_buf().unwrap();
    a.ring
        .push_srq(a.srq, RecvFixed::new(slot).user_data(1))
        .unwrap();
    a.ring.submit().unwrap();
    a.device.knobs.lock().unwrap().hold = Some(a.srq_qpn);
    a.device.apply(&super::Step::SrqPeerSend(0));
    a.device.dev.progress();
    let qp = a.ring.detach(a.srq_qp).unwrap();
    let mut out = Vec::new();
    a.ring.reap(&mut out).unwrap();
    assert!(out.is_empty(), "held back: {out:?}");
    a.device.knobs.lock().unwrap().hold = None;
    let last = AsyncEvent::LastWqeReached { qp_num: a.srq_qpn };
    assert!(a.ring.apply_event(last));
    a.ring.reap(&mut out).unwrap();
    assert_eq!(out.len(), 1, "{out:?}");
    assert_eq!(
        (out[0].user_data(), out[0].status()),
        (1, WcStatus::Success)
    );
    assert!(a.ring.qp_error(out[0].qp()).is_err(), "names no queue pair");
    assert!(!a.ring.apply_event(last), "forgotten");
    drop(qp);
}

/// A shared receive queue that refuses part of a refill's post: the
/// refill stops, says so, and the refused receives come back flushed with
/// their slots, places and credits; the queue takes pushes after.
pub fn a_refused_refill_post_stops_the_refill() {
    let mut a = FixedAdversary::new();
    let posted_before = a.ring.srq_posted(a.srq).unwrap();
    let free_before = a.ring.bufs().free();
    let refill = FixedSrqRefill {
        low: 4,
        target: 4,
        user_data: 0xabc,
    };
    let wanted = 4 - posted_before;
    assert!(wanted >= 2, "the scenario leaves room: {posted_before}");
    a.device.knobs.lock().unwrap().accept = Some(1);
    assert!(
        a.ring.set_srq_refill(a.srq, Some(refill)).is_err(),
        "the refusal is reported"
    );
    a.device.after_submit();
    assert_eq!(a.ring.srq_refill(a.srq).unwrap(), None, "stopped");
    assert_eq!(a.ring.srq_posted(a.srq).unwrap(), posted_before + 1);
    let mut out = Vec::new();
    a.ring.reap(&mut out).unwrap();
    let flushed: Vec<_> = out
        .iter()
        .filter(|c| c.user_data() == 0xabc)
        .map(|c| c.status())
        .collect();
    assert_eq!(flushed, vec![WcStatus::WrFlushErr; wanted - 1]);
    for c in out {
        a.ring.put_buf(c.into_buf()).unwrap();
    }
    assert_eq!(a.ring.bufs().free(), free_before - 1);
    // No refill on later reaps.
    let mut more = Vec::new();
    a.ring.reap(&mut more).unwrap();
    assert_eq!(a.ring.srq_posted(a.srq).unwrap(), posted_before + 1);
    for id in 0..wanted - 1 {
        let slot = a.ring.take_buf().unwrap();
        a.ring
            .push_srq(a.srq, RecvFixed::new(slot).user_data(id as u64))
            .unwrap();
    }
    assert_eq!(a.ring.submit().unwrap(), wanted - 1);
}

/// Refill posts refused under the awaited ring: at the first top-up, and
/// at a top-up a reap starts. The refused receives' slots go back to the
/// ring at once and never arrive; messages in the receives the device
/// took still arrive; and the await ends only once none of the refill's
/// receives is left to complete.
pub fn refused_refill_posts_under_the_awaited_ring() {
    use rdma_ring::Error;
    let mut a = FixedAdversary::new();
    let ring = a.awaited();
    let srq = a.srq;
    let free = || ring.with_bufs(|b| b.free()).unwrap();
    let before = free();
    let refill = FixedSrqRefill {
        low: 4,
        target: 4,
        user_data: 7,
    };
    // The first top-up: one of four taken.
    a.device.knobs.lock().unwrap().accept = Some(1);
    assert!(ring.set_srq_refill(srq, Some(refill)).is_err());
    a.device.after_submit();
    assert_eq!(free(), before - 1, "the three refused, back at once");
    assert!(now(ring.receive(srq)).is_none(), "one may arrive");
    a.device.apply(&super::Step::SrqPeerSend(0));
    a.device.dev.progress();
    let c = now(ring.receive(srq)).unwrap().unwrap();
    assert_eq!((c.status(), c.user_data()), (WcStatus::Success, 7));
    ring.put_buf(c.into_buf()).unwrap();
    let end = now(ring.receive(srq)).expect("resolved at once");
    assert!(matches!(end, Err(Error::Incompatible(_))), "{end:?}");
    assert_eq!(free(), before);

    // A top-up a reap starts: three messages take three of four; the
    // reap that hands them out tops up, and that post is refused.
    ring.set_srq_refill(srq, Some(FixedSrqRefill { low: 2, ..refill }))
        .unwrap();
    assert_eq!(free(), before - 4);
    for _ in 0..3 {
        a.device.apply(&super::Step::SrqPeerSend(0));
    }
    a.device.dev.progress();
    a.device.knobs.lock().unwrap().accept = Some(0);
    let mut arrived = Vec::new();
    for _ in 0..3 {
        let c = now(ring.receive(srq)).unwrap().unwrap();
        assert_eq!((c.status(), c.user_data()), (WcStatus::Success, 7));
        arrived.push(c);
    }
    a.device.after_submit();
    assert_eq!(
        free(),
        before - 4,
        "the three the refill pushed were refused and are back"
    );
    assert!(now(ring.receive(srq)).is_none(), "one may arrive");
    for c in arrived {
        ring.put_buf(c.into_buf()).unwrap();
    }
    assert_eq!(free(), before - 1, "the refill stopped: slots stay free");
    drop(ring.detach(a.srq_qp).unwrap());
    drop(ring.remove_srq(srq).unwrap());
    let end = now(ring.receive(srq)).expect("resolved at once");
    assert!(matches!(end, Err(Error::NotAttached(_))), "{end:?}");
    assert_eq!(free(), before, "the last one's slot back too");
    ring.close();
}

/// A refill stopped while nothing of its own is left to complete: the
/// post it is refused is of a receive its owner pushed, in a top-up an
/// event started, so no refill receive comes back flushed. The task
/// awaiting the queue must still be woken, and learn nothing more can
/// arrive. On the plain ring, a reap whose top-up is refused hands the
/// refused receives out itself.
pub fn a_refill_stopped_with_nothing_outstanding_wakes_its_waiters() {
    use rdma_ring::Error;
    let (flag, waker) = flag();
    let mut cx = Context::from_waker(&waker);

    // The plain ring first: a reap's top-up refused.
    let mut a = FixedAdversary::new();
    let refill = FixedSrqRefill {
        low: 4,
        target: 4,
        user_data: 7,
    };
    a.ring.set_srq_refill(a.srq, Some(refill)).unwrap();
    a.device.apply(&super::Step::SrqPeerSend(0));
    a.device.dev.progress();
    a.device.knobs.lock().unwrap().accept = Some(0);
    let mut out = Vec::new();
    a.ring.reap(&mut out).unwrap();
    a.device.after_submit();
    let statuses: Vec<_> = out.iter().map(|c| c.status()).collect();
    assert_eq!(
        statuses,
        [WcStatus::Success, WcStatus::WrFlushErr],
        "the message, and the refused top-up in the same reap"
    );
    assert_eq!(a.ring.srq_refill(a.srq).unwrap(), None);
    for c in out {
        a.ring.put_buf(c.into_buf()).unwrap();
    }

    // The awaited ring: the refill's four receives all taken, no slot free.
    let mut a = FixedAdversary::new();
    let srq = a.srq;
    let id = rdma_ring::backend::SharedReceiveQueue::caps(a.ring.srq(srq).unwrap()).id;
    let ring = a.awaited();
    ring.set_srq_refill(srq, Some(refill)).unwrap();
    let mut held: Vec<_> = std::iter::from_fn(|| ring.take_buf()).collect();
    for _ in 0..4 {
        a.device.apply(&super::Step::SrqPeerSend(0));
    }
    a.device.dev.progress();
    for _ in 0..4 {
        let mut next = ring.receive(srq);
        let Poll::Ready(Ok(c)) = std::pin::Pin::new(&mut next).poll(&mut cx) else {
            panic!("four messages arrived");
        };
        held.push(c.into_buf());
    }
    assert_eq!(ring.srq_posted(srq).unwrap(), 0);
    let mut waiting = ring.receive(srq);
    assert!(std::pin::Pin::new(&mut waiting).poll(&mut cx).is_pending());
    flag.0.store(false, Ordering::SeqCst); // busy polling's own wake-up
                                           // One receive of the owner's own, pushed and not posted (the await's
                                           // poll would have posted it).
    let mine = RecvFixed::new(held.pop().unwrap()).user_data(1);
    let mut mine = ring.push_srq(srq, mine).unwrap();
    a.device.knobs.lock().unwrap().accept = Some(0);
    assert!(ring.apply_event(AsyncEvent::SrqLimitReached { srq: id }));
    a.device.after_submit();
    assert!(
        flag.0.load(Ordering::SeqCst),
        "the stop woke the waiting task"
    );
    match std::pin::Pin::new(&mut waiting).poll(&mut cx) {
        Poll::Ready(Err(Error::Incompatible(_))) => {}
        other => panic!("nothing more can arrive: {other:?}"),
    }
    let Poll::Ready(Ok(back)) = std::pin::Pin::new(&mut mine).poll(&mut cx) else {
        panic!("the owner's receive came back");
    };
    assert_eq!(back.status(), WcStatus::WrFlushErr);
    drop(held);
    ring.close();
}

/// Two awaits of one queue in one task (one waker): dropping one leaves
/// the other's place in the list, so an arrival still wakes the task.
pub fn dropping_one_of_two_awaits_in_a_task_keeps_the_others_wake_up() {
    let (flag, waker) = flag();
    let mut cx = Context::from_waker(&waker);
    let mut a = FixedAdversary::new();
    let ring = a.awaited();
    let srq = a.srq;
    let refill = FixedSrqRefill {
        low: 2,
        target: 4,
        user_data: 0,
    };
    ring.set_srq_refill(srq, Some(refill)).unwrap();
    let mut first = ring.receive(srq);
    let mut second = ring.receive(srq);
    assert!(std::pin::Pin::new(&mut first).poll(&mut cx).is_pending());
    assert!(std::pin::Pin::new(&mut second).poll(&mut cx).is_pending());
    drop(first);
    flag.0.store(false, Ordering::SeqCst); // busy polling's own wake-ups
    a.device.apply(&super::Step::SrqPeerSend(0));
    a.device.dev.progress();
    ring.drive().unwrap();
    assert!(flag.0.load(Ordering::SeqCst), "the arrival woke the task");
    assert!(std::pin::Pin::new(&mut second).poll(&mut cx).is_ready());
    ring.close();
}
