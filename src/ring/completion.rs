//! Reaping completions: explicit CQEs, and the unsignaled operations a
//! signaled CQE completes implicitly.

use std::fmt;

use super::{InFlight, Key, Ring, DRAIN_WR_ID, SYNC_KEY, SYNC_WR_ID};
use crate::backend::{QueuePair, RawCompletion, WcStatus};
use crate::buf::OwnedBuf;
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
    buf: OwnedBuf,
}

impl Completion {
    #[inline]
    pub(super) fn new(
        op: InFlight,
        status: WcStatus,
        byte_len: u32,
        imm: Option<u32>,
        by_write_imm: bool,
    ) -> Self {
        Completion {
            kind: op.kind,
            user_data: op.user_data,
            status,
            byte_len,
            imm,
            by_write_imm,
            buf: op.buf,
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
            buf: op.buf,
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

    /// Bytes moved: for a receive, the bytes that arrived; for other
    /// operations, the buffer's length on success and 0 otherwise.
    pub fn byte_len(&self) -> u32 {
        self.byte_len
    }

    /// Immediate data, for a receive that got it.
    pub fn imm(&self) -> Option<u32> {
        self.imm
    }

    /// For a receive: whether an RDMA WRITE with immediate consumed it
    /// rather than a SEND. Its buffer is then untouched, and
    /// [`byte_len`](Self::byte_len) counts the bytes written to the remote
    /// slice.
    pub fn is_write_imm(&self) -> bool {
        self.by_write_imm
    }

    /// The buffer.
    pub fn buf(&self) -> &OwnedBuf {
        &self.buf
    }

    /// `Ok(bytes moved)` or the failure as an [`Error::Completion`].
    pub fn result(&self) -> Result<usize, Error> {
        if self.status.is_success() {
            Ok(self.byte_len as usize)
        } else {
            Err(Error::Completion {
                op: self.kind,
                status: self.status,
            })
        }
    }

    /// The buffer, dropping the rest.
    pub fn into_buf(self) -> OwnedBuf {
        self.buf
    }

    /// The result and the buffer.
    pub fn into_parts(self) -> (Result<usize, Error>, OwnedBuf) {
        (self.result(), self.buf)
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
            .field("buf", &self.buf)
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
    pub fn reap(&mut self, out: &mut Vec<Completion>) -> Result<usize, Error> {
        let result = self.ring.reap_device();
        let n = self.ring.ready.len();
        out.extend(self.ring.ready.drain(..));
        result.map(|_| n)
    }

    /// Waits (polling) until at least `min` completions are ready, up to the
    /// ring's `wait_timeout`, and returns all that are. Fails at once if
    /// fewer than `min` can still arrive. On any error nothing is lost: the
    /// completions reaped so far stay ready for the next call.
    pub fn wait(&mut self, min: usize) -> Result<Vec<Completion>, Error> {
        let mut out = Vec::with_capacity(min);
        match self.wait_into(min, &mut out) {
            Ok(_) => Ok(out),
            Err(e) => {
                for c in out.into_iter().rev() {
                    self.ring.ready.push_front(c);
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
            let possible = self.ring.outstanding_send + self.ring.outstanding_recv;
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
            match self.ring.events() {
                Some(events) => {
                    events.arm()?;
                    got += self.reap(out)?;
                    if got >= min {
                        return Ok(got);
                    }
                    // The tick bounds the sleep for devices that progress
                    // only when polled (the soft device in manual mode).
                    events.wait(deadline.remaining().min(SLEEP_TICK))?;
                    events.take()?;
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
    /// The queue pair's completion channel, fetched once.
    fn events(&mut self) -> Option<std::sync::Arc<dyn crate::backend::CompletionEvents>> {
        self.events
            .get_or_insert_with(|| self.qp.completion_events())
            .clone()
    }

    /// Moves CQEs from the device into `ready`, completing unsignaled
    /// operations implicitly. Returns how many CQEs were reaped.
    pub(super) fn reap_device(&mut self) -> Result<usize, Error> {
        if self.outstanding_send + self.outstanding_recv == 0 && !self.drain_posted {
            return Ok(0);
        }
        let n = self.qp.poll_cq(&mut self.scratch)?;
        let mut unknown = None;
        for i in 0..n {
            let raw = self.scratch[i];
            self.stats.cqes += 1;
            if !self.process(raw) {
                self.stats.unknown_cqes += 1;
                unknown.get_or_insert(raw.wr_id);
            }
        }
        match unknown {
            Some(wr_id) => Err(Error::UnknownWrId { wr_id }),
            None => Ok(n),
        }
    }

    /// Applies one CQE; false if it names no posted operation.
    #[inline]
    fn process(&mut self, raw: RawCompletion) -> bool {
        if raw.wr_id == DRAIN_WR_ID && self.drain_posted {
            self.drain_posted = false;
            // The marker went in last: every send before it is done, and
            // those without a CQE of their own ran before the error.
            while let Some(key) = self.send_order.pop_front() {
                self.complete_implicitly(key);
            }
            return true;
        }
        if raw.wr_id == SYNC_WR_ID {
            if !self.send_order.contains(&SYNC_KEY) {
                return false;
            }
            if !raw.status.is_success() {
                self.record_error(raw.status);
            }
            while let Some(front) = self.send_order.pop_front() {
                self.complete_implicitly(front);
                if front == SYNC_KEY {
                    break;
                }
            }
            return true;
        }
        let key = Key::from_wr_id(raw.wr_id);
        let (kind, posted) = match self.slab.get(key) {
            Some(op) => (op.kind, op.posted),
            None => return false,
        };
        if !posted {
            return false;
        }
        if !raw.status.is_success() {
            self.record_error(raw.status);
        }
        if kind.is_recv() {
            self.outstanding_recv -= 1;
            let byte_len = if raw.status.is_success() {
                raw.byte_len
            } else {
                0
            };
            self.finish(key, raw.status, Some(byte_len), raw.imm, raw.by_write_imm);
            return true;
        }
        // RC completes a send queue in order: everything posted before this
        // work request has completed too, and successfully — a work request
        // that fails or is flushed always gets a CQE of its own, signaled or
        // not, and that CQE would have arrived first.
        while let Some(front) = self.send_order.pop_front() {
            if front == key {
                break;
            }
            self.complete_implicitly(front);
        }
        self.outstanding_send -= 1;
        self.finish(key, raw.status, None, None, false);
        true
    }

    #[inline]
    fn complete_implicitly(&mut self, key: Key) {
        if key == SYNC_KEY {
            // A sync marker: it held a send slot and has no buffer.
            self.outstanding_send -= 1;
            return;
        }
        if self.slab.get(key).is_none() {
            return;
        }
        self.outstanding_send -= 1;
        self.stats.implicit += 1;
        self.finish(key, WcStatus::Success, None, None, false);
    }
}
