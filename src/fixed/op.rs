//! The operations of the fixed ring: each a small builder over a slot's
//! token — required fields in `new`, options as chained setters, then
//! `user_data`.

use super::FixedBuf;
use crate::backend::{SendFlags, SendOpcode, SendWr, SgeSpan};
use crate::buf::{RemoteAccess, RemoteSlice, RemoteWord};
use crate::error::Error;
use crate::op::{check_inline, check_remote, Limits, OpKind};

mod sealed {
    pub trait Sealed {}
}

/// An operation a [`FixedRing`](super::FixedRing) can push. Sealed: the
/// builders of this module are the operations.
///
/// ```
/// use rdma_ring::backend::QueuePair;
/// use rdma_ring::fixed::{FixedOp, FixedQp, FixedRing};
///
/// /// Pushes any fixed operation, and submits it at once.
/// fn post_now<Q: QueuePair, O: FixedOp>(ring: &mut FixedRing<Q>, qp: FixedQp, op: O) -> Result<(), O> {
///     ring.push(qp, op).map_err(|r| r.into_parts().1)?;
///     ring.submit().expect("posted");
///     Ok(())
/// }
/// ```
pub trait FixedOp: sealed::Sealed {
    /// Checks the operation against the slot size and the queue pair's
    /// limits and describes its work request.
    #[doc(hidden)]
    fn prepare(&self, slot_len: u32, limits: &Limits) -> Result<FixedWork, Error>;
}

/// An operation as the ring records and posts it.
#[doc(hidden)]
#[derive(Clone, Copy, Debug)]
pub struct FixedWork {
    pub(super) kind: OpKind,
    pub(super) table: u64,
    pub(super) index: u32,
    /// Bytes of the slot the work request covers.
    pub(super) len: u32,
    pub(super) user_data: u64,
    /// The send work request; its `wr_id` and scatter/gather span are the
    /// ring's to fill. Unused for a receive.
    pub(super) wr: SendWr,
}

#[inline(always)]
fn check_len(len: u32, slot_len: u32, limits: &Limits) -> Result<(), Error> {
    // The ring's limits are within its slots (`Limits::within_slots`).
    debug_assert!(limits.max_len <= slot_len);
    if len > limits.max_len {
        return Err(len_refused(len, slot_len, limits));
    }
    Ok(())
}

#[cold]
fn len_refused(len: u32, slot_len: u32, limits: &Limits) -> Error {
    if len > slot_len {
        Error::OutOfBounds {
            start: 0,
            end: u64::from(len),
            len: u64::from(slot_len),
        }
    } else {
        Error::TooLong {
            len: len as usize,
            max: limits.max_len as usize,
        }
    }
}

#[inline(always)]
fn send_wr(opcode: SendOpcode, flags: SendFlags) -> SendWr {
    let mut wr = SendWr::new(0, opcode, SgeSpan::default());
    wr.flags = flags;
    wr
}

#[inline(always)]
fn work(kind: OpKind, buf: &FixedBuf, len: u32, user_data: u64, wr: SendWr) -> FixedWork {
    FixedWork {
        kind,
        table: buf.table,
        index: buf.index,
        len,
        user_data,
        wr,
    }
}

macro_rules! common_setters {
    ($ty:ident) => {
        impl $ty {
            /// Tags the operation; its completion carries the tag back.
            pub fn user_data(mut self, user_data: u64) -> Self {
                self.user_data = user_data;
                self
            }

            /// Asks for a completion queue entry for this work request, so
            /// it (and every unsignaled one before it) is released as soon
            /// as it completes. Without it the ring decides; the operation
            /// comes back either way.
            pub fn signaled(mut self) -> Self {
                self.flags |= SendFlags::SIGNALED;
                self
            }

            /// Makes the work request wait until earlier RDMA READs and
            /// atomics on this queue pair have completed.
            pub fn fence(mut self) -> Self {
                self.flags |= SendFlags::FENCE;
                self
            }

            /// The slot's token back, unsent.
            pub fn into_buf(self) -> FixedBuf {
                self.buf
            }
        }
    };
}

/// RDMA WRITE of the first `len` bytes of a slot to a remote slice (with
/// [`imm`](Self::imm): WRITE with immediate, which consumes a receive of
/// the peer).
///
/// ```
/// use rdma_ring::backend::soft::SoftDevice;
/// use rdma_ring::buf::{RemoteAccess, RemoteSlice};
/// use rdma_ring::fixed::{FixedBufs, WriteFixed};
///
/// let pd = SoftDevice::new().alloc_pd();
/// let mut bufs = FixedBufs::new(&pd, 1, 64).unwrap();
/// let remote = RemoteSlice::new(0x1000, 64, 7, RemoteAccess::WRITE);
/// let op = WriteFixed::new(bufs.take().unwrap(), 16, remote).imm(9).user_data(1);
/// bufs.put(op.into_buf()).unwrap();
/// ```
#[derive(Debug)]
pub struct WriteFixed {
    buf: FixedBuf,
    len: u32,
    remote: RemoteSlice,
    imm: Option<u32>,
    flags: SendFlags,
    user_data: u64,
}

impl WriteFixed {
    /// Writes `buf`'s first `len` bytes to `remote`.
    pub fn new(buf: FixedBuf, len: u32, remote: RemoteSlice) -> Self {
        WriteFixed {
            buf,
            len,
            remote,
            imm: None,
            flags: SendFlags::empty(),
            user_data: 0,
        }
    }

    /// Sends immediate data with the write (WRITE with immediate).
    pub fn imm(mut self, imm: u32) -> Self {
        self.imm = Some(imm);
        self
    }

    /// Asks the peer's completion channel to wake a waiter armed for
    /// solicited events only. Takes effect with [`imm`](Self::imm): a
    /// plain WRITE consumes no receive and makes no completion at the
    /// peer, so, as in verbs, the flag does nothing there.
    pub fn solicited(mut self) -> Self {
        self.flags |= SendFlags::SOLICITED;
        self
    }

    /// Copies the payload into the work request at post time (up to the
    /// queue pair's `max_inline_data`).
    pub fn inline(mut self) -> Self {
        self.flags |= SendFlags::INLINE;
        self
    }
}
common_setters!(WriteFixed);

impl sealed::Sealed for WriteFixed {}
impl FixedOp for WriteFixed {
    #[inline(always)]
    fn prepare(&self, slot_len: u32, limits: &Limits) -> Result<FixedWork, Error> {
        let kind = if self.imm.is_some() {
            OpKind::WriteImm
        } else {
            OpKind::Write
        };
        check_len(self.len, slot_len, limits)?;
        check_inline(self.flags, self.len as usize, limits)?;
        check_remote(
            kind,
            self.len as usize,
            &self.remote,
            RemoteAccess::WRITE,
            "WRITE",
        )?;
        let (opcode, imm) = match self.imm {
            Some(imm) => (SendOpcode::WriteImm, imm),
            None => (SendOpcode::Write, 0),
        };
        let mut wr = send_wr(opcode, self.flags);
        wr.remote_addr = self.remote.addr();
        wr.rkey = self.remote.rkey();
        wr.imm = imm;
        Ok(work(kind, &self.buf, self.len, self.user_data, wr))
    }
}

/// RDMA READ of a remote slice into the first `len` bytes of a slot.
///
/// ```
/// use rdma_ring::backend::soft::SoftDevice;
/// use rdma_ring::buf::{RemoteAccess, RemoteSlice};
/// use rdma_ring::fixed::{FixedBufs, ReadFixed};
///
/// let pd = SoftDevice::new().alloc_pd();
/// let mut bufs = FixedBufs::new(&pd, 1, 64).unwrap();
/// let remote = RemoteSlice::new(0x1000, 64, 7, RemoteAccess::READ);
/// let op = ReadFixed::new(bufs.take().unwrap(), 64, remote).user_data(2);
/// # bufs.put(op.into_buf()).unwrap();
/// ```
#[derive(Debug)]
pub struct ReadFixed {
    buf: FixedBuf,
    len: u32,
    remote: RemoteSlice,
    flags: SendFlags,
    user_data: u64,
}

impl ReadFixed {
    /// Reads `len` bytes of `remote` into `buf`.
    pub fn new(buf: FixedBuf, len: u32, remote: RemoteSlice) -> Self {
        ReadFixed {
            buf,
            len,
            remote,
            flags: SendFlags::empty(),
            user_data: 0,
        }
    }
}
common_setters!(ReadFixed);

impl sealed::Sealed for ReadFixed {}
impl FixedOp for ReadFixed {
    #[inline(always)]
    fn prepare(&self, slot_len: u32, limits: &Limits) -> Result<FixedWork, Error> {
        check_len(self.len, slot_len, limits)?;
        check_remote(
            OpKind::Read,
            self.len as usize,
            &self.remote,
            RemoteAccess::READ,
            "READ",
        )?;
        let mut wr = send_wr(SendOpcode::Read, self.flags);
        wr.remote_addr = self.remote.addr();
        wr.rkey = self.remote.rkey();
        Ok(work(OpKind::Read, &self.buf, self.len, self.user_data, wr))
    }
}

/// SEND of the first `len` bytes of a slot, into a receive the peer
/// posted (with [`imm`](Self::imm): SEND with immediate).
///
/// ```
/// use rdma_ring::backend::soft::SoftDevice;
/// use rdma_ring::fixed::{FixedBufs, SendFixed};
///
/// let pd = SoftDevice::new().alloc_pd();
/// let mut bufs = FixedBufs::new(&pd, 1, 64).unwrap();
/// let op = SendFixed::new(bufs.take().unwrap(), 10).imm(3).solicited();
/// # bufs.put(op.into_buf()).unwrap();
/// ```
#[derive(Debug)]
pub struct SendFixed {
    buf: FixedBuf,
    len: u32,
    imm: Option<u32>,
    flags: SendFlags,
    user_data: u64,
}

impl SendFixed {
    /// Sends `buf`'s first `len` bytes.
    pub fn new(buf: FixedBuf, len: u32) -> Self {
        SendFixed {
            buf,
            len,
            imm: None,
            flags: SendFlags::empty(),
            user_data: 0,
        }
    }

    /// Sends immediate data with the message (SEND with immediate).
    pub fn imm(mut self, imm: u32) -> Self {
        self.imm = Some(imm);
        self
    }

    /// Asks the peer's completion channel to wake a waiter armed for
    /// solicited events only.
    pub fn solicited(mut self) -> Self {
        self.flags |= SendFlags::SOLICITED;
        self
    }

    /// Copies the payload into the work request at post time (up to the
    /// queue pair's `max_inline_data`).
    pub fn inline(mut self) -> Self {
        self.flags |= SendFlags::INLINE;
        self
    }
}
common_setters!(SendFixed);

impl sealed::Sealed for SendFixed {}
impl FixedOp for SendFixed {
    #[inline(always)]
    fn prepare(&self, slot_len: u32, limits: &Limits) -> Result<FixedWork, Error> {
        check_len(self.len, slot_len, limits)?;
        check_inline(self.flags, self.len as usize, limits)?;
        let (kind, opcode, imm) = match self.imm {
            Some(imm) => (OpKind::SendImm, SendOpcode::SendImm, imm),
            None => (OpKind::Send, SendOpcode::Send, 0),
        };
        let mut wr = send_wr(opcode, self.flags);
        wr.imm = imm;
        Ok(work(kind, &self.buf, self.len, self.user_data, wr))
    }
}

/// A receive into a whole slot: a SEND of the peer fills it, a WRITE with
/// immediate consumes it and leaves it untouched.
///
/// ```
/// use rdma_ring::backend::soft::SoftDevice;
/// use rdma_ring::fixed::{FixedBufs, RecvFixed};
///
/// let pd = SoftDevice::new().alloc_pd();
/// let mut bufs = FixedBufs::new(&pd, 1, 64).unwrap();
/// let op = RecvFixed::new(bufs.take().unwrap()).user_data(4);
/// # bufs.put(op.into_buf()).unwrap();
/// ```
#[derive(Debug)]
pub struct RecvFixed {
    buf: FixedBuf,
    user_data: u64,
}

impl RecvFixed {
    /// Receives into all of `buf`.
    pub fn new(buf: FixedBuf) -> Self {
        RecvFixed { buf, user_data: 0 }
    }

    /// Tags the operation; its completion carries the tag back.
    pub fn user_data(mut self, user_data: u64) -> Self {
        self.user_data = user_data;
        self
    }

    /// The slot's token back, unposted.
    pub fn into_buf(self) -> FixedBuf {
        self.buf
    }
}

impl sealed::Sealed for RecvFixed {}
impl FixedOp for RecvFixed {
    #[inline(always)]
    fn prepare(&self, slot_len: u32, _limits: &Limits) -> Result<FixedWork, Error> {
        let wr = send_wr(SendOpcode::Send, SendFlags::empty());
        Ok(work(OpKind::Recv, &self.buf, slot_len, self.user_data, wr))
    }
}

/// 8-byte compare-and-swap on a remote word; the word's old value lands
/// in the slot's first 8 bytes (native byte order, as
/// `u64::from_ne_bytes` reads it).
///
/// ```
/// use rdma_ring::backend::soft::SoftDevice;
/// use rdma_ring::buf::{RemoteAccess, RemoteSlice};
/// use rdma_ring::fixed::{CompareSwapFixed, FixedBufs};
///
/// let pd = SoftDevice::new().alloc_pd();
/// let mut bufs = FixedBufs::new(&pd, 1, 8).unwrap();
/// let word = RemoteSlice::new(0x1000, 64, 7, RemoteAccess::ATOMIC).word(0).unwrap();
/// let op = CompareSwapFixed::new(bufs.take().unwrap(), word, 0, 1);
/// # bufs.put(op.into_buf()).unwrap();
/// ```
#[derive(Debug)]
pub struct CompareSwapFixed {
    buf: FixedBuf,
    word: RemoteWord,
    compare: u64,
    swap: u64,
    flags: SendFlags,
    user_data: u64,
}

impl CompareSwapFixed {
    /// Sets `word` to `swap` if it holds `compare`.
    pub fn new(buf: FixedBuf, word: RemoteWord, compare: u64, swap: u64) -> Self {
        CompareSwapFixed {
            buf,
            word,
            compare,
            swap,
            flags: SendFlags::empty(),
            user_data: 0,
        }
    }
}
common_setters!(CompareSwapFixed);

/// 8-byte fetch-and-add on a remote word; the word's old value lands in
/// the slot's first 8 bytes (native byte order).
///
/// ```
/// use rdma_ring::backend::soft::SoftDevice;
/// use rdma_ring::buf::{RemoteAccess, RemoteSlice};
/// use rdma_ring::fixed::{FetchAddFixed, FixedBufs};
///
/// let pd = SoftDevice::new().alloc_pd();
/// let mut bufs = FixedBufs::new(&pd, 1, 8).unwrap();
/// let word = RemoteSlice::new(0x1000, 64, 7, RemoteAccess::ATOMIC).word(8).unwrap();
/// let op = FetchAddFixed::new(bufs.take().unwrap(), word, 1);
/// # bufs.put(op.into_buf()).unwrap();
/// ```
#[derive(Debug)]
pub struct FetchAddFixed {
    buf: FixedBuf,
    word: RemoteWord,
    add: u64,
    flags: SendFlags,
    user_data: u64,
}

impl FetchAddFixed {
    /// Adds `add` to `word`.
    pub fn new(buf: FixedBuf, word: RemoteWord, add: u64) -> Self {
        FetchAddFixed {
            buf,
            word,
            add,
            flags: SendFlags::empty(),
            user_data: 0,
        }
    }
}
common_setters!(FetchAddFixed);

#[inline(always)]
fn atomic(
    kind: OpKind,
    opcode: SendOpcode,
    word: &RemoteWord,
    flags: SendFlags,
    slot_len: u32,
    limits: &Limits,
) -> Result<SendWr, Error> {
    if !limits.atomics {
        return Err(Error::Unsupported(kind));
    }
    check_len(8, slot_len, limits)?;
    let mut wr = send_wr(opcode, flags);
    wr.remote_addr = word.addr();
    wr.rkey = word.rkey();
    Ok(wr)
}

impl sealed::Sealed for CompareSwapFixed {}
impl FixedOp for CompareSwapFixed {
    fn prepare(&self, slot_len: u32, limits: &Limits) -> Result<FixedWork, Error> {
        let kind = OpKind::CompareSwap;
        let mut wr = atomic(
            kind,
            SendOpcode::CompareSwap,
            &self.word,
            self.flags,
            slot_len,
            limits,
        )?;
        wr.compare_add = self.compare;
        wr.swap = self.swap;
        Ok(work(kind, &self.buf, 8, self.user_data, wr))
    }
}

impl sealed::Sealed for FetchAddFixed {}
impl FixedOp for FetchAddFixed {
    fn prepare(&self, slot_len: u32, limits: &Limits) -> Result<FixedWork, Error> {
        let kind = OpKind::FetchAdd;
        let mut wr = atomic(
            kind,
            SendOpcode::FetchAdd,
            &self.word,
            self.flags,
            slot_len,
            limits,
        )?;
        wr.compare_add = self.add;
        Ok(work(kind, &self.buf, 8, self.user_data, wr))
    }
}
