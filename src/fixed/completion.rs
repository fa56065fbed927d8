//! What the fixed ring hands back for each operation.

use super::{FixedBuf, FixedQp};
use crate::backend::WcStatus;
use crate::op::OpKind;

/// A finished operation of a [`FixedRing`](super::FixedRing): its slot's
/// token back, with the outcome. 56 bytes, where the owned-buffer ring's
/// [`Completion`](crate::ring::Completion) carries a whole buffer.
///
/// ```
/// use rdma_ring::backend::{soft::SoftDevice, QpConfig, QueuePair};
/// use rdma_ring::buf::{ExposedBuf, RemoteAccess};
/// use rdma_ring::fixed::{FixedBufs, FixedRing, FixedRingConfig, WriteFixed};
/// use rdma_ring::op::OpKind;
///
/// let dev = SoftDevice::new();
/// let pd = dev.alloc_pd();
/// let (mut qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
/// let target = ExposedBuf::new(&pd, vec![0u8; 64], RemoteAccess::WRITE).unwrap();
/// let cq = qp.take_cq().unwrap();
/// let bufs = FixedBufs::new(&pd, 1, 64).unwrap();
/// let mut ring = FixedRing::new(cq, bufs, FixedRingConfig::default());
/// let handle = ring.attach(qp).unwrap();
/// let buf = ring.take_buf().unwrap();
/// ring.push(handle, WriteFixed::new(buf, 32, target.remote()).user_data(5)).unwrap();
/// ring.submit().unwrap();
/// let done = ring.wait(1).unwrap();
/// let c = &done[0];
/// assert_eq!((c.user_data(), c.kind(), c.byte_len()), (5, OpKind::Write, 32));
/// assert!(c.status().is_success() && c.qp() == handle);
/// ```
#[derive(Debug)]
pub struct FixedCompletion {
    pub(super) user_data: u64,
    pub(super) buf: FixedBuf,
    pub(super) qp: FixedQp,
    pub(super) byte_len: u32,
    pub(super) imm: Option<u32>,
    pub(super) kind: OpKind,
    pub(super) status: WcStatus,
    pub(super) by_write_imm: bool,
}

impl FixedCompletion {
    /// Puts the operation's own tag back where an adapter's routing tag
    /// stood.
    pub(crate) fn set_user_data(&mut self, user_data: u64) {
        self.user_data = user_data;
    }

    /// The tag the operation was pushed with.
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::SoftDevice, QpConfig, QueuePair};
    /// # use rdma_ring::buf::{ExposedBuf, RemoteAccess};
    /// # use rdma_ring::fixed::*;
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// # let (mut qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    /// # let target = ExposedBuf::new(&pd, vec![0u8; 64], RemoteAccess::WRITE).unwrap();
    /// # let cq = qp.take_cq().unwrap();
    /// # let mut ring = FixedRing::new(cq, FixedBufs::new(&pd, 4, 64).unwrap(), FixedRingConfig::default());
    /// # let conn = ring.attach(qp).unwrap();
    /// # let slot = ring.take_buf().unwrap();
    /// # ring.push(conn, WriteFixed::new(slot, 16, target.remote()).user_data(4)).unwrap();
    /// # ring.submit().unwrap();
    /// # let c = ring.wait(1).unwrap().pop().unwrap();
    /// assert_eq!(c.user_data(), 4);
    /// ```
    #[inline]
    pub fn user_data(&self) -> u64 {
        self.user_data
    }

    /// What the operation was.
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::SoftDevice, QpConfig, QueuePair};
    /// # use rdma_ring::buf::{ExposedBuf, RemoteAccess};
    /// # use rdma_ring::fixed::*;
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// # let (mut qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    /// # let target = ExposedBuf::new(&pd, vec![0u8; 64], RemoteAccess::WRITE).unwrap();
    /// # let cq = qp.take_cq().unwrap();
    /// # let mut ring = FixedRing::new(cq, FixedBufs::new(&pd, 4, 64).unwrap(), FixedRingConfig::default());
    /// # let conn = ring.attach(qp).unwrap();
    /// # let slot = ring.take_buf().unwrap();
    /// # ring.push(conn, WriteFixed::new(slot, 16, target.remote()).user_data(4)).unwrap();
    /// # ring.submit().unwrap();
    /// # let c = ring.wait(1).unwrap().pop().unwrap();
    /// assert_eq!(c.kind(), rdma_ring::op::OpKind::Write);
    /// ```
    #[inline]
    pub fn kind(&self) -> OpKind {
        self.kind
    }

    /// How it ended. After a failure the queue pair is in error, and its
    /// later operations come back [`WcStatus::WrFlushErr`].
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::SoftDevice, QpConfig, QueuePair};
    /// # use rdma_ring::buf::{ExposedBuf, RemoteAccess};
    /// # use rdma_ring::fixed::*;
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// # let (mut qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    /// # let target = ExposedBuf::new(&pd, vec![0u8; 64], RemoteAccess::WRITE).unwrap();
    /// # let cq = qp.take_cq().unwrap();
    /// # let mut ring = FixedRing::new(cq, FixedBufs::new(&pd, 4, 64).unwrap(), FixedRingConfig::default());
    /// # let conn = ring.attach(qp).unwrap();
    /// # let slot = ring.take_buf().unwrap();
    /// # ring.push(conn, WriteFixed::new(slot, 16, target.remote()).user_data(4)).unwrap();
    /// # ring.submit().unwrap();
    /// # let c = ring.wait(1).unwrap().pop().unwrap();
    /// assert!(c.status().is_success());
    /// ```
    #[inline]
    pub fn status(&self) -> WcStatus {
        self.status
    }

    /// Bytes moved: for a receive, the bytes that arrived (or, consumed by
    /// a WRITE with immediate, the bytes written to the remote slice); for
    /// the others, the bytes the operation covered if it succeeded, else
    /// zero.
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::SoftDevice, QpConfig, QueuePair};
    /// # use rdma_ring::buf::{ExposedBuf, RemoteAccess};
    /// # use rdma_ring::fixed::*;
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// # let (mut qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    /// # let target = ExposedBuf::new(&pd, vec![0u8; 64], RemoteAccess::WRITE).unwrap();
    /// # let cq = qp.take_cq().unwrap();
    /// # let mut ring = FixedRing::new(cq, FixedBufs::new(&pd, 4, 64).unwrap(), FixedRingConfig::default());
    /// # let conn = ring.attach(qp).unwrap();
    /// # let slot = ring.take_buf().unwrap();
    /// # ring.push(conn, WriteFixed::new(slot, 16, target.remote()).user_data(4)).unwrap();
    /// # ring.submit().unwrap();
    /// # let c = ring.wait(1).unwrap().pop().unwrap();
    /// assert_eq!(c.byte_len(), 16);
    /// ```
    #[inline]
    pub fn byte_len(&self) -> u32 {
        self.byte_len
    }

    /// Immediate data that arrived with a receive.
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::SoftDevice, QpConfig, QueuePair};
    /// # use rdma_ring::buf::{ExposedBuf, RemoteAccess};
    /// # use rdma_ring::fixed::*;
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// # let (mut qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    /// # let target = ExposedBuf::new(&pd, vec![0u8; 64], RemoteAccess::WRITE).unwrap();
    /// # let cq = qp.take_cq().unwrap();
    /// # let mut ring = FixedRing::new(cq, FixedBufs::new(&pd, 4, 64).unwrap(), FixedRingConfig::default());
    /// # let conn = ring.attach(qp).unwrap();
    /// # let slot = ring.take_buf().unwrap();
    /// # ring.push(conn, WriteFixed::new(slot, 16, target.remote()).user_data(4)).unwrap();
    /// # ring.submit().unwrap();
    /// # let c = ring.wait(1).unwrap().pop().unwrap();
    /// assert_eq!(c.imm(), None); // a WRITE carries none back
    /// ```
    #[inline]
    pub fn imm(&self) -> Option<u32> {
        self.imm
    }

    /// Whether a WRITE with immediate (not a SEND) consumed this receive:
    /// then its slot is untouched.
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::SoftDevice, QpConfig, QueuePair};
    /// # use rdma_ring::buf::{ExposedBuf, RemoteAccess};
    /// # use rdma_ring::fixed::*;
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// # let (mut qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    /// # let target = ExposedBuf::new(&pd, vec![0u8; 64], RemoteAccess::WRITE).unwrap();
    /// # let cq = qp.take_cq().unwrap();
    /// # let mut ring = FixedRing::new(cq, FixedBufs::new(&pd, 4, 64).unwrap(), FixedRingConfig::default());
    /// # let conn = ring.attach(qp).unwrap();
    /// # let slot = ring.take_buf().unwrap();
    /// # ring.push(conn, WriteFixed::new(slot, 16, target.remote()).user_data(4)).unwrap();
    /// # ring.submit().unwrap();
    /// # let c = ring.wait(1).unwrap().pop().unwrap();
    /// assert!(!c.by_write_imm());
    /// ```
    #[inline]
    pub fn by_write_imm(&self) -> bool {
        self.by_write_imm
    }

    /// The queue pair the operation ran on. For a receive of a shared
    /// receive queue, the queue pair the message arrived on — or, if none
    /// is known, a handle that names nothing (as
    /// [`FixedRing::qp_error`](super::FixedRing::qp_error) reports): a
    /// receive handed back unconsumed when its queue was removed, closed,
    /// refused or never posted, one whose queue pair was detached before
    /// its completion was reaped, or a flush naming the number of a queue
    /// pair detached from its queue, which a queue pair attached since took
    /// over (the flush may be a late one of the detached queue pair's).
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::SoftDevice, QpConfig, QueuePair};
    /// # use rdma_ring::buf::{ExposedBuf, RemoteAccess};
    /// # use rdma_ring::fixed::*;
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// # let (mut qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    /// # let target = ExposedBuf::new(&pd, vec![0u8; 64], RemoteAccess::WRITE).unwrap();
    /// # let cq = qp.take_cq().unwrap();
    /// # let mut ring = FixedRing::new(cq, FixedBufs::new(&pd, 4, 64).unwrap(), FixedRingConfig::default());
    /// # let conn = ring.attach(qp).unwrap();
    /// # let slot = ring.take_buf().unwrap();
    /// # ring.push(conn, WriteFixed::new(slot, 16, target.remote()).user_data(4)).unwrap();
    /// # ring.submit().unwrap();
    /// # let c = ring.wait(1).unwrap().pop().unwrap();
    /// assert_eq!(c.qp(), conn);
    /// ```
    #[inline]
    pub fn qp(&self) -> FixedQp {
        self.qp
    }

    /// The slot's token, to read the slot through
    /// [`FixedBufs::bytes`](super::FixedBufs::bytes).
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::SoftDevice, QpConfig, QueuePair};
    /// # use rdma_ring::buf::{ExposedBuf, RemoteAccess};
    /// # use rdma_ring::fixed::*;
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// # let (mut qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    /// # let target = ExposedBuf::new(&pd, vec![0u8; 64], RemoteAccess::WRITE).unwrap();
    /// # let cq = qp.take_cq().unwrap();
    /// # let mut ring = FixedRing::new(cq, FixedBufs::new(&pd, 4, 64).unwrap(), FixedRingConfig::default());
    /// # let conn = ring.attach(qp).unwrap();
    /// # let slot = ring.take_buf().unwrap();
    /// # ring.push(conn, WriteFixed::new(slot, 16, target.remote()).user_data(4)).unwrap();
    /// # ring.submit().unwrap();
    /// # let c = ring.wait(1).unwrap().pop().unwrap();
    /// assert_eq!(ring.bufs().bytes(c.buf()).len(), 64);
    /// ```
    #[inline]
    pub fn buf(&self) -> &FixedBuf {
        &self.buf
    }

    /// The slot's token, to reuse or put back.
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::SoftDevice, QpConfig, QueuePair};
    /// # use rdma_ring::buf::{ExposedBuf, RemoteAccess};
    /// # use rdma_ring::fixed::*;
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// # let (mut qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    /// # let target = ExposedBuf::new(&pd, vec![0u8; 64], RemoteAccess::WRITE).unwrap();
    /// # let cq = qp.take_cq().unwrap();
    /// # let mut ring = FixedRing::new(cq, FixedBufs::new(&pd, 4, 64).unwrap(), FixedRingConfig::default());
    /// # let conn = ring.attach(qp).unwrap();
    /// # let slot = ring.take_buf().unwrap();
    /// # ring.push(conn, WriteFixed::new(slot, 16, target.remote()).user_data(4)).unwrap();
    /// # ring.submit().unwrap();
    /// # let c = ring.wait(1).unwrap().pop().unwrap();
    /// ring.put_buf(c.into_buf()).unwrap();
    /// ```
    #[inline]
    pub fn into_buf(self) -> FixedBuf {
        self.buf
    }
}

const _: () = assert!(std::mem::size_of::<FixedCompletion>() <= 56);

/// Where the ring hands reaped completions: a list, or an adapter that
/// gives each to its owner at once (no list to fill and drain again).
pub(crate) trait CompletionSink {
    /// Whether taking a completion may panic (it runs a caller's
    /// closure): the reap then keeps what a panic would leave unhanded
    /// for the next one.
    const MAY_UNWIND: bool = false;

    /// Takes one completion.
    fn put(&mut self, completion: FixedCompletion);

    /// Takes a run of them (a signaled send and the unsignaled before it).
    #[inline]
    fn put_all(&mut self, completions: impl Iterator<Item = FixedCompletion>) {
        // Internal iteration: a run of a range folds into a counted loop.
        completions.for_each(|completion| self.put(completion));
    }

    /// Takes every completion of the ring's ready list (made outside a
    /// poll), leaving it empty.
    #[inline]
    fn put_ready(&mut self, ready: &mut Vec<FixedCompletion>) {
        self.put_all(ready.drain(..));
    }
}

impl CompletionSink for Vec<FixedCompletion> {
    #[inline(always)]
    fn put(&mut self, completion: FixedCompletion) {
        self.push(completion);
    }

    #[inline(always)]
    fn put_all(&mut self, completions: impl Iterator<Item = FixedCompletion>) {
        self.extend(completions);
    }

    #[inline]
    fn put_ready(&mut self, ready: &mut Vec<FixedCompletion>) {
        self.append(ready);
    }
}

/// A [`CompletionSink`] that hands each completion to a closure.
pub(super) struct EachCompletion<F> {
    pub(super) f: F,
    pub(super) taken: usize,
}

impl<F: FnMut(FixedCompletion)> CompletionSink for EachCompletion<F> {
    const MAY_UNWIND: bool = true;

    #[inline(always)]
    fn put(&mut self, completion: FixedCompletion) {
        self.taken += 1;
        (self.f)(completion);
    }

    /// From the front (the list reversed, and popped: it keeps its
    /// room); should the closure panic, what it was not handed stays in
    /// the list, in order, for the next reap.
    fn put_ready(&mut self, ready: &mut Vec<FixedCompletion>) {
        ready.reverse();
        let unhanded = Reversed(ready);
        while let Some(completion) = unhanded.0.pop() {
            self.put(completion);
        }
    }
}

/// A list reversed to be popped from its front, turned back when
/// dropped.
struct Reversed<'a>(&'a mut Vec<FixedCompletion>);

impl Drop for Reversed<'_> {
    fn drop(&mut self) {
        self.0.reverse();
    }
}

/// The sends one completion released and not yet handed out (the
/// unsignaled ones, `seqs`, then the signaled one if `signaled`), spilled
/// into a list if dropped with any left (a sink panicked).
pub(super) struct UnhandedRun<'a, F, G>
where
    F: Fn(u64) -> FixedCompletion,
    G: Fn() -> FixedCompletion,
{
    pub(super) seqs: std::ops::Range<u64>,
    pub(super) signaled: bool,
    pub(super) release: F,
    pub(super) release_signaled: G,
    pub(super) spill: &'a mut Vec<FixedCompletion>,
}

impl<F, G> Drop for UnhandedRun<'_, F, G>
where
    F: Fn(u64) -> FixedCompletion,
    G: Fn() -> FixedCompletion,
{
    #[inline]
    fn drop(&mut self) {
        if !self.seqs.is_empty() || self.signaled {
            self.spill_rest();
        }
    }
}

impl<F, G> UnhandedRun<'_, F, G>
where
    F: Fn(u64) -> FixedCompletion,
    G: Fn() -> FixedCompletion,
{
    #[cold]
    #[inline(never)]
    fn spill_rest(&mut self) {
        self.spill.extend(self.seqs.by_ref().map(&self.release));
        if std::mem::take(&mut self.signaled) {
            self.spill.push((self.release_signaled)());
        }
    }
}
