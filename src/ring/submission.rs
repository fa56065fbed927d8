//! Pushing operations and posting them with one doorbell.

use std::fmt;

use super::{credit_error, InFlight, PushResult, Ring};
use crate::backend::{PostError, QueuePair, RecvWr, SendFlags, SendOpcode, SendWr, Sge, WcStatus};
use crate::buf::{IoBuf, OwnedBuf};
use crate::error::{Error, Rejected};
use crate::op::{OpKind, Operation};

/// The submission side of a [`Ring`].
///
/// ```
/// # use rdma_ring::backend::{soft::SoftDevice, QpConfig};
/// # use rdma_ring::buf::RegisteredBuf;
/// # use rdma_ring::op::Recv;
/// # use rdma_ring::ring::{Ring, RingConfig};
/// # let dev = SoftDevice::new();
/// # let pd = dev.alloc_pd();
/// # let (qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
/// let mut ring = Ring::new(qp, RingConfig::default());
/// let mut sq = ring.submission();
/// for i in 0..4 {
///     let buf = RegisteredBuf::new(&pd, vec![0u8; 256]).unwrap();
///     sq.push(Recv::new(buf).user_data(i)).unwrap();
/// }
/// assert_eq!(sq.len(), 4);
/// assert_eq!(sq.submit().unwrap(), 4); // one post for all four
/// assert_eq!(ring.stats().doorbells, 1);
/// ```
pub struct SubmissionQueue<'a, Q: QueuePair> {
    pub(super) ring: &'a mut Ring<Q>,
}

impl<Q: QueuePair> SubmissionQueue<'_, Q> {
    /// Pushes an operation, to be posted by the next
    /// [`submit`](Self::submit). Never blocks: if the queue is full, the
    /// queue pair is in error, or the operation is invalid for this queue
    /// pair, the operation comes back inside the error.
    pub fn push<T: Operation>(&mut self, op: T) -> PushResult<T> {
        self.ring.push(op)
    }

    /// Pushes operations until one is refused. Returns how many were pushed;
    /// on refusal, the refused operation and the rest of the iterator come
    /// back, so nothing is lost.
    #[allow(clippy::type_complexity)]
    pub fn push_many<T: Operation, I: IntoIterator<Item = T>>(
        &mut self,
        ops: I,
    ) -> Result<usize, Rejected<(T, I::IntoIter)>> {
        let mut ops = ops.into_iter();
        let mut pushed = 0;
        while let Some(op) = ops.next() {
            if let Err(rejected) = self.ring.push(op) {
                let (error, op) = rejected.into_parts();
                return Err(Rejected::new(error, (op, ops)));
            }
            pushed += 1;
        }
        Ok(pushed)
    }

    /// Posts everything pushed since the last submit: one linked list per
    /// queue, one doorbell each. Returns how many work requests were
    /// posted. If the device refuses part of a list, the operations from
    /// the refused one on come back in the error.
    pub fn submit(&mut self) -> Result<usize, SubmitError> {
        self.ring.submit()
    }

    /// Operations pushed and not yet submitted.
    pub fn len(&self) -> usize {
        self.ring.pending_send.len() + self.ring.pending_recv.len()
    }

    /// Whether nothing is waiting for submit.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Send operations that may be pushed now.
    pub fn send_room(&self) -> usize {
        self.ring.send_room()
    }

    /// Receives that may be pushed now.
    pub fn recv_room(&self) -> usize {
        self.ring.recv_room()
    }
}

/// An operation the device never took: its buffer, kind and tag.
#[derive(Debug)]
pub struct Unposted {
    /// The operation's kind.
    pub kind: OpKind,
    /// The operation's tag.
    pub user_data: u64,
    /// Its buffer, back.
    pub buf: OwnedBuf,
}

/// A submit the device refused in part: why, how many work requests were
/// posted, and every operation that was not.
pub struct SubmitError {
    /// The device's reason.
    pub error: Error,
    /// Work requests posted before the refusal (they complete normally).
    pub posted: usize,
    /// Operations not posted, in push order.
    pub unposted: Vec<Unposted>,
}

impl fmt::Debug for SubmitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SubmitError")
            .field("error", &self.error)
            .field("posted", &self.posted)
            .field("unposted", &self.unposted.len())
            .finish()
    }
}

impl fmt::Display for SubmitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "submit posted {} work requests, then: {} ({} operations handed back unposted)",
            self.posted,
            self.error,
            self.unposted.len()
        )
    }
}

impl std::error::Error for SubmitError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

impl<Q: QueuePair> Ring<Q> {
    pub(super) fn push<T: Operation>(&mut self, op: T) -> PushResult<T> {
        self.push_owned(op, super::Owner::Queue).map(|_| ())
    }

    pub(super) fn push_owned<T: Operation>(
        &mut self,
        op: T,
        owner: super::Owner,
    ) -> Result<super::Key, Rejected<T>> {
        if self.closed {
            return Err(Rejected::new(Error::Closed, op));
        }
        if let Some(status) = self.error {
            return Err(Rejected::new(Error::QpInError(status), op));
        }
        let recv = op.kind().is_recv();
        if let Some(error) = credit_error(self, recv) {
            return Err(Rejected::new(error, op));
        }
        if let Err(error) = op.check(&self.caps) {
            return Err(Rejected::new(error, op));
        }
        if self.slab.is_full() {
            let unclaimed = self.slab.len() - self.outstanding_send - self.outstanding_recv;
            return Err(Rejected::new(Error::Unclaimed(unclaimed), op));
        }
        let prepared = op.into_prepared();
        let queued = matches!(owner, super::Owner::Queue);
        let key = self
            .slab
            .insert(InFlight {
                kind: prepared.kind,
                user_data: prepared.user_data,
                buf: prepared.buf,
                posted: false,
                owner,
            })
            .expect("checked above that the slab has room");
        if queued {
            self.queued_in_flight += 1;
        }
        match prepared.wr {
            None => {
                let sge = self.slab.get(key).expect("just inserted").buf.sge();
                self.pending_recv.push(RecvWr {
                    wr_id: key.to_wr_id(),
                    sge,
                })
            }
            Some(mut wr) => {
                wr.wr_id = key.to_wr_id();
                self.since_signal += 1;
                if self.force_signal || self.since_signal >= self.signal_interval {
                    wr.flags |= SendFlags::SIGNALED;
                }
                if wr.flags.contains(SendFlags::SIGNALED) {
                    self.since_signal = 0;
                    self.force_signal = false;
                }
                self.pending_send.push(wr);
            }
        }
        Ok(key)
    }

    pub(super) fn submit(&mut self) -> Result<usize, SubmitError> {
        let mut posted = 0;
        let mut failure: Option<(Error, Vec<Unposted>)> = None;

        if !self.pending_recv.is_empty() {
            // SAFETY: each receive names exactly the bytes of an `OwnedBuf`
            // that the slab holds until the receive's completion is reaped;
            // on a failed teardown the buffer is leaked, never freed.
            let result = unsafe { self.qp.post_recv(&self.pending_recv) };
            self.stats.doorbells += 1;
            let accepted = self.accepted(&result, self.pending_recv.len());
            for i in 0..accepted {
                let key = super::Key::from_wr_id(self.pending_recv[i].wr_id);
                self.slab
                    .get_mut(key)
                    .expect("pending op is in the slab")
                    .posted = true;
            }
            self.outstanding_recv += accepted;
            self.stats.recv_wrs += accepted as u64;
            posted += accepted;
            if let Err(PostError { error, .. }) = result {
                let unposted = self.take_unposted_recv(accepted);
                failure = Some((error, unposted));
            }
            self.pending_recv.clear();
        }

        if let Some(last) = self.pending_send.last_mut() {
            if !last.flags.contains(SendFlags::SIGNALED) {
                last.flags |= SendFlags::SIGNALED;
                self.since_signal = 0;
            }
            // SAFETY: as for receives: every SGE names bytes of an `OwnedBuf`
            // held by the slab until the work request completes (its own CQE,
            // a later signaled CQE on this send queue, or a flush).
            let result = unsafe { self.qp.post_send(&self.pending_send) };
            self.stats.doorbells += 1;
            let accepted = self.accepted(&result, self.pending_send.len());
            for i in 0..accepted {
                let wr = self.pending_send[i];
                let key = super::Key::from_wr_id(wr.wr_id);
                self.slab
                    .get_mut(key)
                    .expect("pending op is in the slab")
                    .posted = true;
                self.send_order.push_back(key);
                if wr.flags.contains(SendFlags::SIGNALED) {
                    self.stats.signaled += 1;
                }
            }
            self.outstanding_send += accepted;
            self.stats.send_wrs += accepted as u64;
            posted += accepted;
            if let Err(PostError { error, .. }) = result {
                if accepted > 0
                    && !self.pending_send[accepted - 1]
                        .flags
                        .contains(SendFlags::SIGNALED)
                {
                    self.post_sync_marker();
                }
                let unposted = self.take_unposted_send(accepted);
                match &mut failure {
                    Some((_, list)) => list.extend(unposted),
                    None => failure = Some((error, unposted)),
                }
            }
            self.pending_send.clear();
        }

        match failure {
            None => Ok(posted),
            Some((error, unposted)) => Err(SubmitError {
                error,
                posted,
                unposted,
            }),
        }
    }

    /// How many of `len` posted work requests the device took. A refusal
    /// that claims them all (the backend could not tell which it took) or
    /// more than were posted (a backend bug) counts as taking them all, and
    /// moves the queue pair to error: whatever the device did take then
    /// comes back flushed, and nothing it may hold is handed back early.
    fn accepted(&mut self, result: &Result<(), PostError>, len: usize) -> usize {
        match result {
            Ok(()) => len,
            Err(PostError { accepted, .. }) if *accepted < len => *accepted,
            Err(_) => {
                self.record_error(WcStatus::LocQpOpErr);
                // If even this fails the ring still refuses new work; the
                // operations come back when the device reports them, or are
                // leaked at teardown.
                let _ = self.qp.set_error();
                len
            }
        }
    }

    /// The accepted prefix of a partial post ends unsignaled: post a
    /// zero-length signaled RDMA WRITE behind it, whose CQE releases the
    /// prefix. It takes the send slot (and CQE) an unposted op freed. If
    /// even that post fails, the next send asks for a CQE instead.
    fn post_sync_marker(&mut self) {
        let mut marker = SendWr::new(super::SYNC_WR_ID, SendOpcode::Write, Sge::default());
        marker.flags = SendFlags::SIGNALED;
        // SAFETY: a zero-length work request names no memory.
        let posted = unsafe { self.qp.post_send(&[marker]) }.is_ok();
        self.stats.doorbells += 1;
        if posted {
            self.send_order.push_back(super::SYNC_KEY);
            self.outstanding_send += 1;
            self.stats.signaled += 1;
        } else {
            self.force_signal = true;
        }
    }

    fn take_unposted_recv(&mut self, from: usize) -> Vec<Unposted> {
        let keys: Vec<_> = self.pending_recv[from..]
            .iter()
            .map(|wr| super::Key::from_wr_id(wr.wr_id))
            .collect();
        self.remove_unposted(keys)
    }

    fn take_unposted_send(&mut self, from: usize) -> Vec<Unposted> {
        let keys: Vec<_> = self.pending_send[from..]
            .iter()
            .map(|wr| super::Key::from_wr_id(wr.wr_id))
            .collect();
        self.remove_unposted(keys)
    }

    /// Operations the device did not take go back to their owners: to the
    /// caller in the list, or, for awaited ones, to their futures as
    /// flushed (they never ran).
    fn remove_unposted(&mut self, keys: Vec<super::Key>) -> Vec<Unposted> {
        let mut unposted = Vec::new();
        for key in keys {
            let queued = matches!(
                self.slab.get(key).map(|op| &op.owner),
                Some(super::Owner::Queue)
            );
            if !queued {
                self.finish(key, WcStatus::WrFlushErr, Some(0), None, false);
                continue;
            }
            let op = self.slab.remove(key).expect("pending op is in the slab");
            self.queued_in_flight -= 1;
            unposted.push(Unposted {
                kind: op.kind,
                user_data: op.user_data,
                buf: op.buf,
            });
        }
        unposted
    }

    /// Hands every pushed-but-unsubmitted operation back as a flushed
    /// completion (teardown).
    pub(super) fn flush_pending(&mut self) {
        let keys: Vec<_> = self
            .pending_recv
            .drain(..)
            .map(|wr| wr.wr_id)
            .chain(self.pending_send.drain(..).map(|wr| wr.wr_id))
            .map(super::Key::from_wr_id)
            .collect();
        for key in keys {
            self.finish(key, WcStatus::WrFlushErr, Some(0), None, false);
        }
    }
}
