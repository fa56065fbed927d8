//! Typed work requests, one small builder per operation: the required parts
//! in `new`, options as chained setters.
//!
//! Each builder takes ownership of its local buffer; the buffer comes back
//! in the operation's [`Completion`](crate::ring::Completion). The types
//! catch at compile time what can be caught:
//!
//! * the target of [`Read`] and [`Recv`] must be writable local memory
//!   ([`IoBufMut`]); a [`ReadOnlyBuf`](crate::buf::ReadOnlyBuf) is refused;
//! * the local target of [`CompareSwap`] and [`FetchAdd`] is a [`Word`]:
//!   exactly 8 bytes, 8-aligned, writable;
//! * the remote target of an atomic is a [`RemoteWord`]: 8 aligned bytes of
//!   a [`RemoteSlice`] with atomic rights;
//! * `inline` exists only on operations whose payload can be inline, and
//!   `solicited` only on those that consume a receive at the peer.
//!
//! What depends on values (the remote slice is large enough and grants the
//! right rights, the buffer's protection domain is the queue pair's, an
//! inline payload fits) is checked at push time, and a refused push hands
//! the builder back.
//!
//! Every buffer-carrying builder also takes a scatter/gather list of
//! buffers ([`SgList`]): [`Write::gather`], [`Send::gather`],
//! [`Read::scatter`], [`Recv::scatter`] and friends, up to the queue's
//! `max_sge` elements.
//!
//! Signaling is the ring's business: every operation comes back as a
//! completion whether or not its work request asked the device for a CQE.
//! [`Write::signaled`] and friends force a CQE, which releases the
//! operation (and those before it) as early as possible.

use crate::backend::{PdId, QpCaps, SendFlags, SendOpcode, SendWr, Sge, SgeSpan, SrqCaps};
use crate::buf::{
    BaseBuf, BufList, IoBuf, IoBufMut, OwnedBufs, RemoteAccess, RemoteSlice, RemoteWord, SgList,
    Word,
};
use crate::error::Error;

/// The largest payload one work request may carry (the RC message limit).
pub const MAX_MESSAGE_LEN: usize = 1 << 31;

pub use crate::work::OpKind;

mod sealed {
    pub trait Sealed {}
}

/// An operation the ring can push. Sealed: the eight builders of this
/// module are the operations.
pub trait Operation: sealed::Sealed + Sized {
    /// The buffer the operation owns and hands back.
    type Buf: IoBuf;
    /// Which operation this is.
    fn kind(&self) -> OpKind;
    /// The buffer back, without running the operation.
    fn into_buf(self) -> Self::Buf;
    #[doc(hidden)]
    fn check(&self, limits: &Limits) -> Result<(), Error>;
    #[doc(hidden)]
    fn push_sges(&self, out: &mut Vec<Sge>);
    #[doc(hidden)]
    fn into_prepared(self) -> Prepared;
}

/// What the queue an operation goes to accepts.
#[doc(hidden)]
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub(crate) pd: PdId,
    pub(crate) max_sge: u32,
    pub(crate) max_inline_data: u32,
    pub(crate) atomics: bool,
}

impl Limits {
    pub(crate) fn send(caps: &QpCaps) -> Self {
        Limits {
            pd: caps.pd,
            max_sge: caps.max_send_sge,
            max_inline_data: caps.max_inline_data,
            atomics: caps.atomics,
        }
    }

    pub(crate) fn recv(caps: &QpCaps) -> Self {
        Limits {
            pd: caps.pd,
            max_sge: caps.max_recv_sge,
            max_inline_data: 0,
            atomics: false,
        }
    }

    pub(crate) fn srq(caps: &SrqCaps) -> Self {
        Limits {
            pd: caps.pd,
            max_sge: caps.max_sge,
            max_inline_data: 0,
            atomics: false,
        }
    }
}

/// An operation lowered to what the ring stores and posts.
#[doc(hidden)]
pub struct Prepared {
    pub(crate) kind: OpKind,
    pub(crate) user_data: u64,
    pub(crate) bufs: OwnedBufs,
    /// The buffers' total length: what a send-side operation reports as
    /// moved on success, known here so that completing it costs no walk.
    pub(crate) len: u32,
    /// `None` for a receive. Its scatter/gather span is the ring's to fill.
    pub(crate) wr: Option<SendWr>,
}

#[inline(always)]
fn check_local<B: IoBuf>(buf: &B, limits: &Limits) -> Result<(), Error> {
    let count = buf.sge_count();
    if count == 0 {
        return Err(Error::EmptyBuffer);
    }
    if count > limits.max_sge as usize {
        return Err(Error::TooManySges {
            count,
            max: limits.max_sge,
        });
    }
    if let Some(other) = buf.foreign_pd(limits.pd) {
        return Err(Error::WrongPd {
            buf: other,
            qp: limits.pd,
        });
    }
    if buf.bytes_len() > MAX_MESSAGE_LEN {
        return Err(Error::TooLong(buf.bytes_len()));
    }
    Ok(())
}

#[inline(always)]
pub(crate) fn check_remote(
    op: OpKind,
    local: usize,
    remote: &RemoteSlice,
    needed: RemoteAccess,
    name: &'static str,
) -> Result<(), Error> {
    if local as u64 > remote.len() {
        return Err(Error::RemoteTooSmall {
            local,
            remote: remote.len(),
        });
    }
    if !remote.rights().contains(needed) {
        return Err(Error::MissingRemoteRights {
            op,
            needed: name,
            granted: format!("{:?}", remote.rights()),
        });
    }
    Ok(())
}

#[inline(always)]
pub(crate) fn check_inline(flags: SendFlags, len: usize, limits: &Limits) -> Result<(), Error> {
    if flags.contains(SendFlags::INLINE) && len > limits.max_inline_data as usize {
        return Err(Error::InlineTooLarge {
            len,
            max: limits.max_inline_data,
        });
    }
    Ok(())
}

#[inline(always)]
fn wr(opcode: SendOpcode, flags: SendFlags) -> SendWr {
    SendWr {
        flags,
        ..SendWr::new(0, opcode, SgeSpan::default())
    }
}

macro_rules! common_setters {
    ($ty:ident) => {
        impl<B> $ty<B> {
            /// Tags the operation; its completion carries the tag back.
            pub fn user_data(mut self, user_data: u64) -> Self {
                self.user_data = user_data;
                self
            }

            /// Asks the device for a completion queue entry for this work
            /// request, so it (and every unsignaled one before it) is
            /// released as soon as it completes. Without it the ring
            /// decides; the operation comes back either way.
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
        }
    };
}

macro_rules! inline_setter {
    ($ty:ident) => {
        impl<B> $ty<B> {
            /// Copies the payload into the work request at post time (up to
            /// the queue pair's `max_inline_data`), saving the NIC a DMA read.
            pub fn inline(mut self) -> Self {
                self.flags |= SendFlags::INLINE;
                self
            }
        }
    };
}

macro_rules! solicited_setter {
    ($ty:ident) => {
        impl<B> $ty<B> {
            /// Asks the receiver to raise a solicited completion event.
            pub fn solicited(mut self) -> Self {
                self.flags |= SendFlags::SOLICITED;
                self
            }
        }
    };
}

/// RDMA WRITE: copies the local buffer into the start of a remote slice
/// that grants `WRITE`. The remote slice must be at least as long.
///
/// ```
/// use rdma_ring::buf::{RemoteAccess, RemoteSlice, RegisteredBuf};
/// use rdma_ring::backend::soft::SoftDevice;
/// use rdma_ring::op::Write;
/// let pd = SoftDevice::new().alloc_pd();
/// let buf = RegisteredBuf::new(&pd, vec![1u8; 64]).unwrap();
/// let remote = RemoteSlice::new(0x1000, 64, 7, RemoteAccess::WRITE);
/// let op = Write::new(buf, remote).user_data(1).inline().signaled();
/// # let _ = op;
/// ```
#[derive(Debug)]
pub struct Write<B> {
    buf: B,
    remote: RemoteSlice,
    user_data: u64,
    flags: SendFlags,
}

impl<B: IoBuf> Write<B> {
    /// Writes `buf` to the start of `remote`.
    pub fn new(buf: B, remote: RemoteSlice) -> Self {
        Write {
            buf,
            remote,
            user_data: 0,
            flags: SendFlags::empty(),
        }
    }

    /// The buffer back, unsent.
    pub fn into_buf(self) -> B {
        self.buf
    }
}

impl<L: BufList> Write<SgList<L>> {
    /// Writes the bytes of several buffers, gathered in order, to the start
    /// of `remote`, with one work request.
    ///
    /// ```
    /// use rdma_ring::buf::{RemoteAccess, RemoteSlice, RegisteredBuf};
    /// use rdma_ring::backend::soft::SoftDevice;
    /// use rdma_ring::op::Write;
    /// let pd = SoftDevice::new().alloc_pd();
    /// let head = RegisteredBuf::new(&pd, vec![1u8; 16]).unwrap();
    /// let body = RegisteredBuf::new(&pd, vec![2u8; 48]).unwrap();
    /// let op = Write::gather([head, body], RemoteSlice::new(0x1000, 64, 7, RemoteAccess::WRITE));
    /// # let _ = op;
    /// ```
    pub fn gather(list: L, remote: RemoteSlice) -> Self {
        Write::new(SgList::new(list), remote)
    }
}
common_setters!(Write);
inline_setter!(Write);

/// RDMA WRITE with immediate data: like [`Write`], and also consumes a
/// receive at the peer, whose completion carries `imm` and the length.
///
/// ```
/// use rdma_ring::buf::{RemoteAccess, RemoteSlice, RegisteredBuf};
/// use rdma_ring::backend::soft::SoftDevice;
/// use rdma_ring::op::WriteImm;
/// let pd = SoftDevice::new().alloc_pd();
/// let buf = RegisteredBuf::new(&pd, vec![1u8; 64]).unwrap();
/// let remote = RemoteSlice::new(0x1000, 64, 7, RemoteAccess::WRITE);
/// let op = WriteImm::new(buf, remote, 0xfeed).solicited().user_data(2);
/// # let _ = op;
/// ```
#[derive(Debug)]
pub struct WriteImm<B> {
    buf: B,
    remote: RemoteSlice,
    imm: u32,
    user_data: u64,
    flags: SendFlags,
}

impl<B: IoBuf> WriteImm<B> {
    /// Writes `buf` to the start of `remote` and notifies the peer with `imm`.
    pub fn new(buf: B, remote: RemoteSlice, imm: u32) -> Self {
        WriteImm {
            buf,
            remote,
            imm,
            user_data: 0,
            flags: SendFlags::empty(),
        }
    }

    /// The buffer back, unsent.
    pub fn into_buf(self) -> B {
        self.buf
    }
}

impl<L: BufList> WriteImm<SgList<L>> {
    /// Like [`Write::gather`], and notifies the peer with `imm`.
    pub fn gather(list: L, remote: RemoteSlice, imm: u32) -> Self {
        WriteImm::new(SgList::new(list), remote, imm)
    }
}
common_setters!(WriteImm);
inline_setter!(WriteImm);
solicited_setter!(WriteImm);

/// SEND: the peer's next posted receive gets the local buffer's bytes.
///
/// ```
/// use rdma_ring::buf::RegisteredBuf;
/// use rdma_ring::backend::soft::SoftDevice;
/// use rdma_ring::op::Send;
/// let pd = SoftDevice::new().alloc_pd();
/// let op = Send::new(RegisteredBuf::new(&pd, b"ping".to_vec()).unwrap()).user_data(3);
/// # let _ = op;
/// ```
#[derive(Debug)]
pub struct Send<B> {
    buf: B,
    user_data: u64,
    flags: SendFlags,
}

impl<B: IoBuf> Send<B> {
    /// Sends `buf`.
    pub fn new(buf: B) -> Self {
        Send {
            buf,
            user_data: 0,
            flags: SendFlags::empty(),
        }
    }

    /// The buffer back, unsent.
    pub fn into_buf(self) -> B {
        self.buf
    }
}

impl<L: BufList> Send<SgList<L>> {
    /// Sends the bytes of several buffers, gathered in order, as one
    /// message.
    pub fn gather(list: L) -> Self {
        Send::new(SgList::new(list))
    }
}
common_setters!(Send);
inline_setter!(Send);
solicited_setter!(Send);

/// SEND with immediate data: like [`Send`]; the peer's receive completion
/// also carries `imm`.
///
/// ```
/// use rdma_ring::buf::RegisteredBuf;
/// use rdma_ring::backend::soft::SoftDevice;
/// use rdma_ring::op::SendImm;
/// let pd = SoftDevice::new().alloc_pd();
/// let op = SendImm::new(RegisteredBuf::new(&pd, b"ping".to_vec()).unwrap(), 42);
/// # let _ = op;
/// ```
#[derive(Debug)]
pub struct SendImm<B> {
    buf: B,
    imm: u32,
    user_data: u64,
    flags: SendFlags,
}

impl<B: IoBuf> SendImm<B> {
    /// Sends `buf` with immediate data `imm`.
    pub fn new(buf: B, imm: u32) -> Self {
        SendImm {
            buf,
            imm,
            user_data: 0,
            flags: SendFlags::empty(),
        }
    }

    /// The buffer back, unsent.
    pub fn into_buf(self) -> B {
        self.buf
    }
}

impl<L: BufList> SendImm<SgList<L>> {
    /// Like [`Send::gather`], with immediate data.
    pub fn gather(list: L, imm: u32) -> Self {
        SendImm::new(SgList::new(list), imm)
    }
}
common_setters!(SendImm);
inline_setter!(SendImm);
solicited_setter!(SendImm);

/// RDMA READ: copies the start of a remote slice that grants `READ` into
/// the local buffer, which must be writable.
///
/// ```
/// use rdma_ring::buf::{RemoteAccess, RemoteSlice, RegisteredBuf};
/// use rdma_ring::backend::soft::SoftDevice;
/// use rdma_ring::op::Read;
/// let pd = SoftDevice::new().alloc_pd();
/// let buf = RegisteredBuf::new(&pd, vec![0u8; 64]).unwrap();
/// let op = Read::new(buf, RemoteSlice::new(0x1000, 64, 7, RemoteAccess::READ)).user_data(4);
/// # let _ = op;
/// ```
///
/// A read-only buffer is refused at compile time:
///
/// ```compile_fail
/// use rdma_ring::buf::{RemoteAccess, RemoteSlice, ReadOnlyBuf};
/// use rdma_ring::backend::soft::SoftDevice;
/// use rdma_ring::op::Read;
/// let pd = SoftDevice::new().alloc_pd();
/// let buf = ReadOnlyBuf::new(&pd, &b"constant"[..]).unwrap();
/// let op = Read::new(buf, RemoteSlice::new(0x1000, 64, 7, RemoteAccess::READ));
/// ```
#[derive(Debug)]
pub struct Read<B> {
    buf: B,
    remote: RemoteSlice,
    user_data: u64,
    flags: SendFlags,
}

impl<B: IoBufMut> Read<B> {
    /// Reads `buf.len()` bytes from the start of `remote` into `buf`.
    pub fn new(buf: B, remote: RemoteSlice) -> Self {
        Read {
            buf,
            remote,
            user_data: 0,
            flags: SendFlags::empty(),
        }
    }

    /// The buffer back, unread.
    pub fn into_buf(self) -> B {
        self.buf
    }
}

impl<L: BufList> Read<SgList<L>>
where
    L::Item: IoBufMut,
{
    /// Reads the start of `remote` and scatters it, in order, across
    /// several writable buffers.
    pub fn scatter(list: L, remote: RemoteSlice) -> Self {
        Read::new(SgList::new(list), remote)
    }
}
common_setters!(Read);

/// A receive: the buffer waits for the peer's next SEND (or WRITE with
/// immediate, which leaves the buffer untouched and delivers `imm`).
///
/// ```
/// use rdma_ring::buf::RegisteredBuf;
/// use rdma_ring::backend::soft::SoftDevice;
/// use rdma_ring::op::Recv;
/// let pd = SoftDevice::new().alloc_pd();
/// let op = Recv::new(RegisteredBuf::new(&pd, vec![0u8; 4096]).unwrap()).user_data(5);
/// # let _ = op;
/// ```
#[derive(Debug)]
pub struct Recv<B> {
    buf: B,
    user_data: u64,
}

impl<B: IoBufMut> Recv<B> {
    /// Posts `buf` to receive into.
    pub fn new(buf: B) -> Self {
        Recv { buf, user_data: 0 }
    }

    /// Tags the operation; its completion carries the tag back.
    pub fn user_data(mut self, user_data: u64) -> Self {
        self.user_data = user_data;
        self
    }

    /// The buffer back, unposted.
    pub fn into_buf(self) -> B {
        self.buf
    }
}

impl<L: BufList> Recv<SgList<L>>
where
    L::Item: IoBufMut,
{
    /// A receive whose incoming message is scattered, in order, across
    /// several writable buffers (a header and a body, say).
    ///
    /// ```
    /// use rdma_ring::buf::RegisteredBuf;
    /// use rdma_ring::backend::soft::SoftDevice;
    /// use rdma_ring::op::Recv;
    /// let pd = SoftDevice::new().alloc_pd();
    /// let header = RegisteredBuf::new(&pd, vec![0u8; 16]).unwrap();
    /// let body = RegisteredBuf::new(&pd, vec![0u8; 4096]).unwrap();
    /// let op = Recv::scatter([header, body]);
    /// # let _ = op;
    /// ```
    pub fn scatter(list: L) -> Self {
        Recv::new(SgList::new(list))
    }
}

/// 8-byte compare-and-swap: if the remote word equals `compare`, it becomes
/// `swap`; either way the word's old value lands in the local [`Word`].
///
/// ```
/// use rdma_ring::buf::{BaseBuf, RemoteAccess, RemoteSlice, RegisteredBuf};
/// use rdma_ring::backend::soft::SoftDevice;
/// use rdma_ring::op::CompareSwap;
/// let pd = SoftDevice::new().alloc_pd();
/// let local = RegisteredBuf::new(&pd, Box::new(0u64)).unwrap().word(0).unwrap();
/// let remote = RemoteSlice::new(0x1000, 64, 7, RemoteAccess::ATOMIC).word(8).unwrap();
/// let op = CompareSwap::new(local, remote, 0, 1).user_data(6);
/// # let _ = op;
/// ```
#[derive(Debug)]
pub struct CompareSwap<B> {
    word: Word<B>,
    remote: RemoteWord,
    compare: u64,
    swap: u64,
    user_data: u64,
    flags: SendFlags,
}

impl<B: BaseBuf + IoBufMut> CompareSwap<B> {
    /// Compares the remote word with `compare` and, if equal, swaps in `swap`.
    pub fn new(word: Word<B>, remote: RemoteWord, compare: u64, swap: u64) -> Self {
        CompareSwap {
            word,
            remote,
            compare,
            swap,
            user_data: 0,
            flags: SendFlags::empty(),
        }
    }

    /// The word back, unsent.
    pub fn into_buf(self) -> Word<B> {
        self.word
    }
}
common_setters!(CompareSwap);

/// 8-byte fetch-and-add: adds `add` to the remote word (wrapping); the
/// word's old value lands in the local [`Word`].
///
/// ```
/// use rdma_ring::buf::{BaseBuf, RemoteAccess, RemoteSlice, RegisteredBuf};
/// use rdma_ring::backend::soft::SoftDevice;
/// use rdma_ring::op::FetchAdd;
/// let pd = SoftDevice::new().alloc_pd();
/// let local = RegisteredBuf::new(&pd, Box::new(0u64)).unwrap().word(0).unwrap();
/// let remote = RemoteSlice::new(0x1000, 64, 7, RemoteAccess::ATOMIC).word(0).unwrap();
/// let op = FetchAdd::new(local, remote, 5).user_data(7);
/// # let _ = op;
/// ```
#[derive(Debug)]
pub struct FetchAdd<B> {
    word: Word<B>,
    remote: RemoteWord,
    add: u64,
    user_data: u64,
    flags: SendFlags,
}

impl<B: BaseBuf + IoBufMut> FetchAdd<B> {
    /// Adds `add` to the remote word.
    pub fn new(word: Word<B>, remote: RemoteWord, add: u64) -> Self {
        FetchAdd {
            word,
            remote,
            add,
            user_data: 0,
            flags: SendFlags::empty(),
        }
    }

    /// The word back, unsent.
    pub fn into_buf(self) -> Word<B> {
        self.word
    }
}
common_setters!(FetchAdd);

impl<B> sealed::Sealed for Write<B> {}
impl<B: IoBuf> Operation for Write<B> {
    type Buf = B;
    fn into_buf(self) -> B {
        self.buf
    }
    fn kind(&self) -> OpKind {
        OpKind::Write
    }
    #[inline(always)]
    fn push_sges(&self, out: &mut Vec<Sge>) {
        self.buf.push_sges(out);
    }
    #[inline(always)]
    fn check(&self, limits: &Limits) -> Result<(), Error> {
        check_local(&self.buf, limits)?;
        check_inline(self.flags, self.buf.bytes_len(), limits)?;
        check_remote(
            OpKind::Write,
            self.buf.bytes_len(),
            &self.remote,
            RemoteAccess::WRITE,
            "WRITE",
        )
    }
    #[inline(always)]
    fn into_prepared(self) -> Prepared {
        let mut wr = wr(SendOpcode::Write, self.flags);
        wr.remote_addr = self.remote.addr();
        wr.rkey = self.remote.rkey();
        Prepared {
            kind: OpKind::Write,
            user_data: self.user_data,
            len: self.buf.bytes_len() as u32,
            bufs: self.buf.into_bufs(),
            wr: Some(wr),
        }
    }
}

impl<B> sealed::Sealed for WriteImm<B> {}
impl<B: IoBuf> Operation for WriteImm<B> {
    type Buf = B;
    fn into_buf(self) -> B {
        self.buf
    }
    fn kind(&self) -> OpKind {
        OpKind::WriteImm
    }
    #[inline(always)]
    fn push_sges(&self, out: &mut Vec<Sge>) {
        self.buf.push_sges(out);
    }
    #[inline(always)]
    fn check(&self, limits: &Limits) -> Result<(), Error> {
        check_local(&self.buf, limits)?;
        check_inline(self.flags, self.buf.bytes_len(), limits)?;
        check_remote(
            OpKind::WriteImm,
            self.buf.bytes_len(),
            &self.remote,
            RemoteAccess::WRITE,
            "WRITE",
        )
    }
    #[inline(always)]
    fn into_prepared(self) -> Prepared {
        let mut wr = wr(SendOpcode::WriteImm, self.flags);
        wr.remote_addr = self.remote.addr();
        wr.rkey = self.remote.rkey();
        wr.imm = self.imm;
        Prepared {
            kind: OpKind::WriteImm,
            user_data: self.user_data,
            len: self.buf.bytes_len() as u32,
            bufs: self.buf.into_bufs(),
            wr: Some(wr),
        }
    }
}

impl<B> sealed::Sealed for Send<B> {}
impl<B: IoBuf> Operation for Send<B> {
    type Buf = B;
    fn into_buf(self) -> B {
        self.buf
    }
    fn kind(&self) -> OpKind {
        OpKind::Send
    }
    #[inline(always)]
    fn push_sges(&self, out: &mut Vec<Sge>) {
        self.buf.push_sges(out);
    }
    #[inline(always)]
    fn check(&self, limits: &Limits) -> Result<(), Error> {
        check_local(&self.buf, limits)?;
        check_inline(self.flags, self.buf.bytes_len(), limits)
    }
    #[inline(always)]
    fn into_prepared(self) -> Prepared {
        let wr = wr(SendOpcode::Send, self.flags);
        Prepared {
            kind: OpKind::Send,
            user_data: self.user_data,
            len: self.buf.bytes_len() as u32,
            bufs: self.buf.into_bufs(),
            wr: Some(wr),
        }
    }
}

impl<B> sealed::Sealed for SendImm<B> {}
impl<B: IoBuf> Operation for SendImm<B> {
    type Buf = B;
    fn into_buf(self) -> B {
        self.buf
    }
    fn kind(&self) -> OpKind {
        OpKind::SendImm
    }
    #[inline(always)]
    fn push_sges(&self, out: &mut Vec<Sge>) {
        self.buf.push_sges(out);
    }
    #[inline(always)]
    fn check(&self, limits: &Limits) -> Result<(), Error> {
        check_local(&self.buf, limits)?;
        check_inline(self.flags, self.buf.bytes_len(), limits)
    }
    #[inline(always)]
    fn into_prepared(self) -> Prepared {
        let mut wr = wr(SendOpcode::SendImm, self.flags);
        wr.imm = self.imm;
        Prepared {
            kind: OpKind::SendImm,
            user_data: self.user_data,
            len: self.buf.bytes_len() as u32,
            bufs: self.buf.into_bufs(),
            wr: Some(wr),
        }
    }
}

impl<B> sealed::Sealed for Read<B> {}
impl<B: IoBufMut> Operation for Read<B> {
    type Buf = B;
    fn into_buf(self) -> B {
        self.buf
    }
    fn kind(&self) -> OpKind {
        OpKind::Read
    }
    #[inline(always)]
    fn push_sges(&self, out: &mut Vec<Sge>) {
        self.buf.push_sges(out);
    }
    #[inline(always)]
    fn check(&self, limits: &Limits) -> Result<(), Error> {
        check_local(&self.buf, limits)?;
        check_remote(
            OpKind::Read,
            self.buf.bytes_len(),
            &self.remote,
            RemoteAccess::READ,
            "READ",
        )
    }
    #[inline(always)]
    fn into_prepared(self) -> Prepared {
        let mut wr = wr(SendOpcode::Read, self.flags);
        wr.remote_addr = self.remote.addr();
        wr.rkey = self.remote.rkey();
        Prepared {
            kind: OpKind::Read,
            user_data: self.user_data,
            len: self.buf.bytes_len() as u32,
            bufs: self.buf.into_bufs(),
            wr: Some(wr),
        }
    }
}

impl<B> sealed::Sealed for Recv<B> {}
impl<B: IoBufMut> Operation for Recv<B> {
    type Buf = B;
    fn into_buf(self) -> B {
        self.buf
    }
    fn kind(&self) -> OpKind {
        OpKind::Recv
    }
    #[inline(always)]
    fn push_sges(&self, out: &mut Vec<Sge>) {
        self.buf.push_sges(out);
    }
    #[inline(always)]
    fn check(&self, limits: &Limits) -> Result<(), Error> {
        check_local(&self.buf, limits)
    }
    #[inline(always)]
    fn into_prepared(self) -> Prepared {
        Prepared {
            kind: OpKind::Recv,
            user_data: self.user_data,
            len: self.buf.bytes_len() as u32,
            bufs: self.buf.into_bufs(),
            wr: None,
        }
    }
}

impl<B> sealed::Sealed for CompareSwap<B> {}
impl<B: BaseBuf + IoBufMut> Operation for CompareSwap<B> {
    type Buf = Word<B>;
    fn into_buf(self) -> Word<B> {
        self.word
    }
    fn kind(&self) -> OpKind {
        OpKind::CompareSwap
    }
    #[inline(always)]
    fn push_sges(&self, out: &mut Vec<Sge>) {
        self.word.push_sges(out);
    }
    #[inline(always)]
    fn check(&self, limits: &Limits) -> Result<(), Error> {
        if !limits.atomics {
            return Err(Error::Unsupported(OpKind::CompareSwap));
        }
        check_local(&self.word, limits)
    }
    #[inline(always)]
    fn into_prepared(self) -> Prepared {
        let mut wr = wr(SendOpcode::CompareSwap, self.flags);
        wr.remote_addr = self.remote.addr();
        wr.rkey = self.remote.rkey();
        wr.compare_add = self.compare;
        wr.swap = self.swap;
        Prepared {
            kind: OpKind::CompareSwap,
            user_data: self.user_data,
            len: 8,
            bufs: self.word.into_bufs(),
            wr: Some(wr),
        }
    }
}

impl<B> sealed::Sealed for FetchAdd<B> {}
impl<B: BaseBuf + IoBufMut> Operation for FetchAdd<B> {
    type Buf = Word<B>;
    fn into_buf(self) -> Word<B> {
        self.word
    }
    fn kind(&self) -> OpKind {
        OpKind::FetchAdd
    }
    #[inline(always)]
    fn push_sges(&self, out: &mut Vec<Sge>) {
        self.word.push_sges(out);
    }
    #[inline(always)]
    fn check(&self, limits: &Limits) -> Result<(), Error> {
        if !limits.atomics {
            return Err(Error::Unsupported(OpKind::FetchAdd));
        }
        check_local(&self.word, limits)
    }
    #[inline(always)]
    fn into_prepared(self) -> Prepared {
        let mut wr = wr(SendOpcode::FetchAdd, self.flags);
        wr.remote_addr = self.remote.addr();
        wr.rkey = self.remote.rkey();
        wr.compare_add = self.add;
        Prepared {
            kind: OpKind::FetchAdd,
            user_data: self.user_data,
            len: 8,
            bufs: self.word.into_bufs(),
            wr: Some(wr),
        }
    }
}
