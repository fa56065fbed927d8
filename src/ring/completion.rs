//! Reaping completions: explicit CQEs, and the unsignaled operations a
//! signaled CQE completes implicitly.

use std::fmt;

use super::lifecycle::Done;
use super::{DeviceCq, InFlight, Key, QpHandle, QueueRef, Ring, SrqHandle};
use crate::backend::{peer_departure, QueuePair, RawCompletion, WcStatus};
use crate::buf::{OwnedBuf, OwnedBufs};
use crate::deadline::Deadline;
use crate::error::Error;
use crate::op::OpKind;

/// A finished operation: its buffer back, with what happened.
///
/// ```
/// # use rdma_ring::backend::{soft::SoftDevice, QpConfig};
/// # use rdma_ring::buf::RegisteredBuf;
/// # use rdma_ring::op::{Recv, Send};
/// # use rdma_ring::ring::{Ring, RingConfig};
/// # let dev = SoftDevice::new();
/// # let pd = dev.alloc_pd();
/// # let (a, b) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
/// # let (mut a, mut b) = (Ring::new(a, RingConfig::default()), Ring::new(b, RingConfig::default()));
/// b.submission().push(Recv::new(RegisteredBuf::new(&pd, vec![0u8; 16]).unwrap()).user_data(9)).unwrap();
/// b.submission().submit().unwrap();
/// a.submission().push(Send::new(RegisteredBuf::new(&pd, b"hi".to_vec()).unwrap())).unwrap();
/// a.submission().submit().unwrap();
/// let recv = b.completion().wait(1).unwrap().pop().unwrap();
/// assert_eq!(recv.user_data(), 9);
/// let (result, buf) = recv.into_parts();
/// assert_eq!(result.unwrap(), 2);
/// assert_eq!(&buf[..2], b"hi");
/// ```
pub struct Completion {
    kind: OpKind,
    user_data: u64,
    status: WcStatus,
    byte_len: u32,
    imm: Option<u32>,
    by_write_imm: bool,
    qp: Option<QpHandle>,
    srq: Option<SrqHandle>,
    bufs: OwnedBufs,
}

impl Completion {
    #[inline]
    pub(super) fn new(op: InFlight, done: Done, srq: Option<SrqHandle>) -> Self {
        Completion {
            kind: op.kind,
            user_data: op.user_data,
            status: done.status,
            byte_len: done.byte_len,
            imm: done.imm,
            by_write_imm: done.by_write_imm,
            qp: done.qp,
            srq,
            bufs: op.bufs,
        }
    }

    pub(super) fn unposted(op: super::Unposted) -> Self {
        Completion {
            kind: op.kind,
            user_data: op.user_data,
            status: WcStatus::WrFlushErr,
            byte_len: 0,
            imm: None,
            by_write_imm: false,
            qp: op.qp,
            srq: op.srq,
            bufs: op.bufs,
        }
    }

    /// The operation's kind.
    pub fn kind(&self) -> OpKind {
        self.kind
    }

    /// The tag given at push.
    pub fn user_data(&self) -> u64 {
        self.user_data
    }

    /// What happened.
    pub fn status(&self) -> WcStatus {
        self.status
    }

    /// Bytes moved: for a receive, the bytes that arrived (for one an
    /// RDMA WRITE with immediate consumed, the bytes it wrote to the
    /// remote slice, not to this receive's buffers); for other
    /// operations, the buffers' length on success and 0 otherwise.
    pub fn byte_len(&self) -> u32 {
        self.byte_len
    }

    /// Immediate data, for a receive that got it.
    pub fn imm(&self) -> Option<u32> {
        self.imm
    }

    /// For a receive: whether an RDMA WRITE with immediate consumed it
    /// rather than a SEND. Its buffers are then untouched, and
    /// [`byte_len`](Self::byte_len) counts the bytes written to the remote
    /// slice.
    pub fn is_write_imm(&self) -> bool {
        self.by_write_imm
    }

    /// The queue pair the operation ran on: for a receive of a shared
    /// receive queue, the queue pair that consumed it (`None` if it had
    /// been detached, or it was flushed unconsumed, or flushed naming a
    /// queue pair that took over the number of one detached from the
    /// queue, while the ring knows no error of it: maybe a late flush of
    /// the detached one).
    pub fn qp(&self) -> Option<QpHandle> {
        self.qp
    }

    /// The shared receive queue a receive was posted to, if it was.
    pub fn srq(&self) -> Option<SrqHandle> {
        self.srq
    }

    /// The buffer; for a scatter/gather operation, the first one (see
    /// [`bufs`](Self::bufs)).
    pub fn buf(&self) -> &OwnedBuf {
        &self.bufs[0]
    }

    /// Every buffer of the operation, in order.
    pub fn bufs(&self) -> &OwnedBufs {
        &self.bufs
    }

    /// `Ok(bytes moved)` through this operation's buffers, or the failure
    /// as an [`Error::Completion`]. A receive an RDMA WRITE with immediate
    /// consumed moved none (its buffers are untouched): `Ok(0)`, so that
    /// `&buf[..len]` holds only what arrived there, whatever length the
    /// peer wrote elsewhere ([`byte_len`](Self::byte_len) still says that
    /// length).
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::SoftDevice, QpConfig};
    /// # use rdma_ring::buf::{ExposedBuf, RegisteredBuf, RemoteAccess};
    /// # use rdma_ring::op::{Recv, WriteImm};
    /// # use rdma_ring::ring::{Ring, RingConfig};
    /// let dev = SoftDevice::new();
    /// let pd = dev.alloc_pd();
    /// let (qp, peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    /// let (mut ring, mut peer) = (Ring::new(qp, RingConfig::default()), Ring::new(peer, RingConfig::default()));
    /// let target = ExposedBuf::new(&pd, vec![0u8; 4096], RemoteAccess::WRITE).unwrap();
    /// // A 16-byte receive, used up by a 4 KiB write elsewhere.
    /// ring.submission().push(Recv::new(RegisteredBuf::new(&pd, vec![0u8; 16]).unwrap())).unwrap();
    /// ring.submit().unwrap();
    /// let data = RegisteredBuf::new(&pd, vec![7u8; 4096]).unwrap();
    /// peer.submission().push(WriteImm::new(data, target.remote(), 9)).unwrap();
    /// peer.submit().unwrap();
    /// let got = ring.completion().wait(1).unwrap().pop().unwrap();
    /// assert!(got.is_write_imm());
    /// assert_eq!((got.result().unwrap(), got.byte_len()), (0, 4096));
    /// ```
    #[inline]
    pub fn result(&self) -> Result<usize, Error> {
        if self.status.is_success() {
            Ok(if self.by_write_imm {
                0
            } else {
                self.byte_len as usize
            })
        } else {
            Err(Error::Completion {
                op: self.kind,
                status: self.status,
            })
        }
    }

    /// The buffer, dropping the rest; for a scatter/gather operation, the
    /// first (the others are dropped: see [`into_bufs`](Self::into_bufs)).
    #[inline]
    pub fn into_buf(self) -> OwnedBuf {
        self.bufs.into_first()
    }

    /// Every buffer, dropping the rest.
    #[inline]
    pub fn into_bufs(self) -> OwnedBufs {
        self.bufs
    }

    /// The result and the buffer (the first, for a scatter/gather
    /// operation).
    #[inline]
    pub fn into_parts(self) -> (Result<usize, Error>, OwnedBuf) {
        (self.result(), self.bufs.into_first())
    }
}

impl fmt::Debug for Completion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Completion")
            .field("kind", &self.kind)
            .field("user_data", &self.user_data)
            .field("status", &self.status)
            .field("byte_len", &self.byte_len)
            .field("imm", &self.imm)
            .field("by_write_imm", &self.by_write_imm)
            .field("qp", &self.qp)
            .field("srq", &self.srq)
            .field("bufs", &self.bufs)
            .finish()
    }
}

/// The completion side of a [`Ring`].
pub struct CompletionQueue<'a, Q: QueuePair> {
    pub(super) ring: &'a mut Ring<Q>,
}

impl<Q: QueuePair> CompletionQueue<'_, Q> {
    /// The next completion, if one is ready; never blocks. A CQE naming an
    /// unknown `wr_id` is reported as [`Error::UnknownWrId`] after the
    /// others polled with it are queued.
    pub fn poll(&mut self) -> Result<Option<Completion>, Error> {
        if let Some(c) = self.ring.ready.pop_front() {
            return Ok(Some(c));
        }
        self.ring.reap_device()?;
        Ok(self.ring.ready.pop_front())
    }

    /// Moves every ready completion into `out`; returns how many.
    #[inline]
    pub fn reap(&mut self, out: &mut Vec<Completion>) -> Result<usize, Error> {
        let before = out.len();
        if !self.ring.ready.is_empty() {
            out.extend(self.ring.ready.drain(..));
        }
        // The completions reaped now go straight into `out`, after those
        // that were ready: one move each instead of two.
        self.ring.reaping_into = Some(std::mem::take(out));
        let result = self.ring.reap_device();
        *out = self.ring.reaping_into.take().expect("set above");
        result.map(|_| out.len() - before)
    }

    /// Waits (polling) until at least `min` completions are ready, up to the
    /// ring's `wait_timeout`, and returns all that are. Fails at once if
    /// fewer than `min` can still arrive. On any error nothing is lost: the
    /// completions reaped so far stay ready for the next call.
    pub fn wait(&mut self, min: usize) -> Result<Vec<Completion>, Error> {
        // No more than can come: a `min` beyond that fails below, and must
        // not first ask the allocator for room it cannot give.
        let can_come = self.ring.ready.len() + self.ring.expecting;
        let mut out = Vec::with_capacity(min.min(can_come));
        match self.wait_into(min, &mut out) {
            Ok(_) => Ok(out),
            Err(e) => {
                let put_back = !out.is_empty();
                for c in out.into_iter().rev() {
                    self.ring.ready.push_front(c);
                }
                if put_back {
                    // A completion stream waiting on this ring learns of
                    // them only so.
                    self.ring.wake_stream();
                }
                Err(e)
            }
        }
    }

    /// Like [`wait`](Self::wait), appending to `out`; returns how many were
    /// appended. On error, the completions appended so far stay in `out`.
    ///
    /// It polls first (completions usually arrive within microseconds),
    /// then, if the backend has a completion channel and nothing arrived
    /// after `RingConfig::spin_polls` polls, sleeps on the channel instead
    /// of burning the core: arm, poll once more (a completion that landed
    /// before the arm raised no event), then block until an event or a
    /// short tick, whichever comes first.
    pub fn wait_into(&mut self, min: usize, out: &mut Vec<Completion>) -> Result<usize, Error> {
        let timeout = self.ring.config.wait_timeout;
        let deadline = Deadline::after(timeout);
        let mut got = 0;
        let mut idle = 0usize;
        loop {
            got += self.reap(out)?;
            if got >= min {
                return Ok(got);
            }
            if !self.ring.ready.is_empty() {
                // Queued by the reap itself (a refused refill's receives,
                // say): the next reap takes them.
                continue;
            }
            let possible = self.ring.expecting;
            if got + possible < min {
                return Err(Error::WaitUnsatisfiable {
                    wanted: min,
                    possible: got + possible,
                });
            }
            if deadline.expired() {
                return Err(Error::Timeout(timeout));
            }
            idle += 1;
            if idle < self.ring.config.spin_polls {
                std::thread::yield_now();
                continue;
            }
            match self.ring.cq_channel() {
                Some(events) => {
                    events.arm()?;
                    got += self.reap(out)?;
                    if got >= min {
                        return Ok(got);
                    }
                    // The tick bounds the sleep for devices that progress
                    // only when polled (the soft device in manual mode).
                    self.ring.stats.channel_sleeps += 1;
                    events.wait(deadline.remaining().min(SLEEP_TICK))?;
                    events.take()?;
                    // Armed again at once: the channel may be the futures
                    // adapter's too (a wait through `with_ring`), whose
                    // driver hears of no later completion on a channel
                    // left unarmed.
                    events.arm()?;
                }
                None => std::thread::yield_now(),
            }
        }
    }

    /// Completions ready without polling the device.
    pub fn ready(&self) -> usize {
        self.ring.ready.len()
    }
}

/// The longest a waiting thread sleeps on the completion channel before
/// polling again.
const SLEEP_TICK: std::time::Duration = std::time::Duration::from_millis(20);

impl<Q: QueuePair> Ring<Q> {
    /// The completion queue's channel, fetched once.
    pub(crate) fn cq_channel(
        &mut self,
    ) -> Option<std::sync::Arc<dyn crate::backend::CompletionEvents>> {
        self.cq_events
            .get_or_insert_with(|| self.cq.completion_events())
            .clone()
    }

    /// Moves CQEs from the device into `ready`, completing unsignaled
    /// operations implicitly. Returns how many CQEs were reaped. When the
    /// queue is idle it now and then reads device events and asks queue
    /// pairs whether their peer left.
    pub(super) fn reap_device(&mut self) -> Result<usize, Error> {
        let n = if self.expecting == 0 {
            0
        } else {
            match self.cq.poll(&mut self.scratch) {
                Ok(n) => n,
                Err(e) => return Err(self.poll_failed(e)),
            }
        };
        let mut unknown = None;
        for i in 0..n {
            let raw = self.scratch[i];
            self.stats.cqes += 1;
            if !self.process(raw) {
                self.stats.unknown_cqes += 1;
                unknown.get_or_insert(raw.wr_id);
            }
        }
        if n == 0 {
            self.idle_polls += 1;
            if self.idle_polls >= IDLE_CHECK_EVERY {
                self.idle_polls = 0;
                self.idle_checks()?;
            }
        }
        if self.srqs.len() > 0 {
            self.refill_srqs();
        }
        match unknown {
            Some(wr_id) => Err(Error::UnknownWrId { wr_id }),
            None => Ok(n),
        }
    }

    /// Applies one CQE; false if it names no operation posted on the queue
    /// it came from.
    #[inline]
    fn process(&mut self, raw: RawCompletion) -> bool {
        let key = Key::from_wr_id(raw.wr_id);
        let (kind, queue, posted) = match self.slab.get(key) {
            Some(op) => (op.kind, op.queue, op.posted),
            None => return false,
        };
        if !posted {
            return false;
        }
        match queue {
            QueueRef::Qp(qp) => {
                let Some(slot) = self.qps.get_mut(qp) else {
                    return false;
                };
                // A CQE of another queue pair can never release this one's
                // operation.
                if slot.caps.qp_num != raw.qp_num {
                    return false;
                }
                slot.stats.cqes += 1;
                if !raw.status.is_success() {
                    slot.record_error(raw.status);
                }
                let handle = Some(QpHandle {
                    ring: self.id,
                    key: qp,
                });
                if kind.is_recv() {
                    slot.outstanding_recv -= 1;
                    self.finish_received(key, &raw, handle);
                    return true;
                }
                // RC completes a send queue in order: everything posted
                // before this work request on this queue pair has completed
                // too, and successfully — a work request that fails or is
                // flushed always gets a CQE of its own, and that CQE would
                // have arrived first.
                let slot = if slot.send_order.front() == Some(&key) {
                    // Every send signaled (one per submit, or each one
                    // asked to be): nothing to release before it.
                    slot.send_order.pop_front();
                    if slot.unaccounted_from == Some(key) {
                        // Passed with its own CQE: those after it are of
                        // the post the backend could not account for.
                        slot.unaccounted_from = slot.send_order.front().copied();
                    }
                    slot
                } else {
                    self.release_sends_before(qp, key);
                    self.qps.get_mut(qp).expect("live above")
                };
                slot.outstanding_send -= 1;
                if slot.drain == Some(key) {
                    // The teardown marker went in last: every send before
                    // it is done (released above), and it has no owner.
                    slot.drain = None;
                }
                self.finish(key, raw.status, None, None, false, handle);
                true
            }
            QueueRef::Srq(srq) => self.process_srq(key, srq, raw),
        }
    }

    /// Applies a CQE of shared receive queue `srq`'s receive `key`. Out of
    /// line: its checks would otherwise weigh on the queue pairs' path,
    /// which every send takes.
    #[inline(never)]
    fn process_srq(&mut self, key: Key, srq: Key, raw: RawCompletion) -> bool {
        // Only a queue pair on this queue (attached, detached from
        // it, or announced with `expect_on_srq`) can have taken
        // one of its receives: another number (a queue pair on
        // another ring's queue that completes here, whose
        // receives' `wr_id`s ours share) names none of them, and
        // the receive is still posted.
        let mut consumer = self.qp_by_num(raw.qp_num);
        match consumer.and_then(|h| self.qps.get_mut(h.key)) {
            Some(slot) if slot.srq == Some(srq) => {
                slot.stats.cqes += 1;
                if raw.status == WcStatus::WrFlushErr && slot.reused_number && slot.error.is_none()
                {
                    // Maybe a late flush of a detached queue pair whose
                    // number this one took over: it names neither (an
                    // error recorded here would stay for good, and the
                    // owner may end a healthy connection). Were this one
                    // in error, its own completions and events say so.
                    consumer = None;
                } else if !raw.status.is_success() {
                    slot.record_error(raw.status);
                }
            }
            Some(_) => return false,
            None if self.srqs.get(srq).is_some_and(|s| s.had(raw.qp_num)) => {}
            None => return false,
        }
        if let Some(slot) = self.srqs.get_mut(srq) {
            slot.outstanding -= 1;
        }
        self.finish_received(key, &raw, consumer);
        true
    }

    /// Hands a receive's completion to its owner: the bytes that came,
    /// unless it failed.
    #[inline(always)]
    fn finish_received(&mut self, key: Key, raw: &RawCompletion, qp: Option<QpHandle>) {
        let byte_len = if raw.status.is_success() {
            raw.byte_len
        } else {
            0
        };
        self.finish(
            key,
            raw.status,
            Some(byte_len),
            raw.imm,
            raw.by_write_imm,
            qp,
        );
    }

    /// Completes, in posting order, the sends of queue pair `qp` posted
    /// before `key`: unsignaled work requests a later CQE released (their
    /// send slots come back too).
    ///
    /// This is the hot path of selective signaling (most sends end here), so
    /// the queue pair's handle and counters are worked out once per CQE,
    /// not per operation: the order leaves the slot while its sends are
    /// finished (and comes back, keeping its capacity), so the queue pair
    /// is not looked up for each.
    #[inline]
    fn release_sends_before(&mut self, qp: Key, key: Key) {
        match self.qps.get(qp).map(|slot| slot.unaccounted_from) {
            None => {}
            // The common case: `None` folds the status to a constant.
            Some(None) => self.release_run(qp, key, None),
            Some(from) => self.release_unaccounted(qp, key, from),
        }
    }

    /// [`release_sends_before`](Self::release_sends_before) on a queue
    /// pair that had a post the backend could not account for: out of
    /// line, off the reap path.
    #[cold]
    #[inline(never)]
    fn release_unaccounted(&mut self, qp: Key, key: Key, from: Option<Key>) {
        self.release_run(qp, key, from);
    }

    /// Releases the run of sends before `key`: as done, since RC
    /// completes in order, unless the device may never have taken them:
    /// from `unaccounted_from` (the first send of a post the backend could
    /// not account for) on, as flushed, when the teardown marker releases
    /// them. A send's own completion proves the device took its post up
    /// to it (a post is taken as a prefix): those before it ran.
    #[inline(always)]
    fn release_run(&mut self, qp: Key, key: Key, unaccounted_from: Option<Key>) {
        let handle = Some(QpHandle {
            ring: self.id,
            key: qp,
        });
        let slot = self.qps.get_mut(qp).expect("looked up by the caller");
        let by_marker = slot.drain == Some(key);
        let mut order = std::mem::take(&mut slot.send_order);
        let mut released = 0;
        let mut implicit = 0;
        let mut status = WcStatus::Success;
        let mut passed = false;
        while let Some(front) = order.pop_front() {
            if unaccounted_from == Some(front) {
                passed = true;
                if by_marker {
                    status = WcStatus::WrFlushErr;
                }
            }
            if front == key {
                break;
            }
            released += 1;
            let operation = self.finish(front, status, None, None, false, handle);
            implicit += u64::from(operation);
        }
        let slot = self.qps.get_mut(qp).expect("live above");
        if passed {
            // Passed now: the sends still after it are its post's too.
            slot.unaccounted_from = order.front().copied();
        }
        slot.send_order = order;
        slot.outstanding_send -= released;
        slot.stats.implicit += implicit;
        self.stats.implicit += implicit;
    }

    /// A queue that fails to poll gives nothing more back: the ring takes
    /// no more work, and owners that wait (a stream, say) can tell, as
    /// with the fixed ring. Out of line, off the reap path.
    #[cold]
    #[inline(never)]
    fn poll_failed(&mut self, error: Error) -> Error {
        self.cq_lost = true;
        self.failed.get_or_insert(match error {
            Error::CqOverrun => "completion queue overrun",
            _ => "its completion queue failed",
        });
        error
    }

    /// The idle-time looks: sync markers owed, device events, and peers
    /// that left.
    pub(super) fn idle_checks(&mut self) -> Result<(), Error> {
        if self.sync_owed {
            self.retry_sync_markers();
        }
        self.poll_events()?;
        self.check_peers()
    }

    /// Asks one attached queue pair (round robin) whether its peer left,
    /// and moves it to error if so (or if it cannot say), so its work
    /// comes back flushed; see [`peer_departure`].
    fn check_peers(&mut self) -> Result<(), Error> {
        let keys = self.qps.len();
        if keys == 0 {
            return Ok(());
        }
        let capacity = self.qps.capacity() as u32;
        for _ in 0..capacity {
            self.events.peer_cursor = (self.events.peer_cursor + 1) % capacity.max(1);
            let index = self.events.peer_cursor;
            if let Some(slot) = self.qps.at_mut(index) {
                if slot.error.is_none() {
                    if let Some(status) = peer_departure(&mut slot.qp) {
                        slot.record_error(status);
                        slot.qp.set_error()?;
                    }
                }
                break;
            }
        }
        Ok(())
    }

    /// The handle of the shared receive queue an operation was pushed to.
    pub(super) fn srq_handle_of(&self, queue: QueueRef) -> Option<SrqHandle> {
        match queue {
            QueueRef::Qp(_) => None,
            QueueRef::Srq(key) => self.srqs.get(key).map(|_| SrqHandle { ring: self.id, key }),
        }
    }
}

/// Empty polls between idle-time looks at device events and departed
/// peers (each may cost a system call).
const IDLE_CHECK_EVERY: u32 = 64;
