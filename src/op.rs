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

/// The largest payload one work request may carry: RC's message limit. A
/// port may allow less ([`QpCaps::max_message`]), which sends, reads,
/// writes and atomics are checked against at push.
pub const MAX_MESSAGE_LEN: usize = 1 << 31;

pub use crate::work::OpKind;

mod sealed {
    pub trait Sealed {}
}

/// An operation the ring can push. Sealed: the eight builders of this
/// module are the operations.
///
/// ```
/// # use rdma_ring::backend::{soft::SoftDevice, QpConfig, QueuePair};
/// # use rdma_ring::buf::RegisteredBuf;
/// # use rdma_ring::op::{Operation, Recv};
/// # use rdma_ring::ring::{Ring, RingConfig};
/// # let dev = SoftDevice::new();
/// # let (pd, other_pd) = (dev.alloc_pd(), dev.alloc_pd());
/// # let (qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
/// # let mut ring = Ring::new(qp, RingConfig::default());
/// // Any operation: a refused one gives its buffer back.
/// fn push_or_reclaim<Q: QueuePair, T: Operation>(ring: &mut Ring<Q>, op: T) -> Option<T::Buf> {
///     ring.submission().push(op).err().map(|refused| refused.into_value().into_buf())
/// }
/// let ours = RegisteredBuf::new(&pd, vec![0u8; 16]).unwrap();
/// assert!(push_or_reclaim(&mut ring, Recv::new(ours)).is_none());
/// let foreign = RegisteredBuf::new(&other_pd, vec![0u8; 16]).unwrap();
/// let back = push_or_reclaim(&mut ring, Recv::new(foreign)).unwrap();
/// assert_eq!(back.len(), 16);
/// ```
pub trait Operation: sealed::Sealed + Sized {
    /// The buffer the operation owns and hands back.
    type Buf: IoBuf;
    /// Which operation this is; its completion reports the same kind.
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::SoftDevice, QpConfig};
    /// # use rdma_ring::buf::RegisteredBuf;
    /// # use rdma_ring::op::{OpKind, Operation, Recv, Send};
    /// # use rdma_ring::ring::{Ring, RingConfig};
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// # let (qp, peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    /// # let (mut ring, mut peer) = (Ring::new(qp, RingConfig::default()), Ring::new(peer, RingConfig::default()));
    /// # peer.submission().push(Recv::new(RegisteredBuf::new(&pd, vec![0u8; 16]).unwrap())).unwrap();
    /// # peer.submit().unwrap();
    /// let op = Send::new(RegisteredBuf::new(&pd, b"ping".to_vec()).unwrap());
    /// assert_eq!(op.kind(), OpKind::Send);
    /// ring.submission().push(op).unwrap();
    /// ring.submit().unwrap();
    /// assert_eq!(ring.completion().wait(1).unwrap()[0].kind(), OpKind::Send);
    /// ```
    fn kind(&self) -> OpKind;
    /// The buffer back, without running the operation.
    ///
    /// ```
    /// # use rdma_ring::backend::soft::SoftDevice;
    /// # use rdma_ring::buf::RegisteredBuf;
    /// # use rdma_ring::op::{Operation, Send};
    /// # let pd = SoftDevice::new().alloc_pd();
    /// # let buf = |bytes: &[u8]| RegisteredBuf::new(&pd, bytes.to_vec()).unwrap();
    /// // Unsent operations of any kind give their buffers back alike.
    /// fn reclaim<T: Operation>(ops: Vec<T>) -> Vec<T::Buf> {
    ///     ops.into_iter().map(Operation::into_buf).collect()
    /// }
    /// let bufs = reclaim(vec![Send::new(buf(b"first")), Send::new(buf(b"second"))]);
    /// assert_eq!(&bufs[1][..], b"second");
    /// ```
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
    /// For an RDMA READ, which some devices allow fewer elements.
    pub(crate) max_read_sge: u32,
    pub(crate) max_inline_data: u32,
    pub(crate) atomics: bool,
    /// Most bytes one work request may move.
    pub(crate) max_len: u32,
}

impl Limits {
    pub(crate) fn send(caps: &QpCaps) -> Self {
        Limits {
            pd: caps.pd,
            max_sge: caps.max_send_sge,
            max_read_sge: caps.max_read_sge,
            max_inline_data: caps.max_inline_data,
            atomics: caps.atomics,
            max_len: caps.max_message,
        }
    }

    pub(crate) fn recv(caps: &QpCaps) -> Self {
        Limits {
            pd: caps.pd,
            max_sge: caps.max_recv_sge,
            max_read_sge: 0,
            max_inline_data: 0,
            atomics: false,
            // A receive larger than any message the port carries is no
            // harm: only what arrives is written.
            max_len: MAX_MESSAGE_LEN as u32,
        }
    }

    /// These limits for operations on slots of `slot_len` bytes (the
    /// fixed-buffer ring's), which move no more than a slot holds: one
    /// test of a length then checks both.
    pub(crate) fn within_slots(self, slot_len: u32) -> Self {
        Limits {
            max_len: self.max_len.min(slot_len),
            ..self
        }
    }

    pub(crate) fn srq(caps: &SrqCaps) -> Self {
        Limits {
            pd: caps.pd,
            max_sge: caps.max_sge,
            max_read_sge: 0,
            max_inline_data: 0,
            atomics: false,
            max_len: MAX_MESSAGE_LEN as u32,
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
        return Err(Error::EmptyList);
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
    if buf.bytes_len() > limits.max_len as usize {
        return Err(Error::TooLong {
            len: buf.bytes_len(),
            max: limits.max_len as usize,
        });
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

// The hidden setup of the setters' examples, shared so that each
// operation type's example runs against a live peer: a ring and its
// connected peer ring (two receives posted), `buf(len)` and `word()` for
// fresh local buffers, and `remote`, 4 KiB of the peer's memory open to
// every operation.
macro_rules! setter_example_setup {
    () => {
        concat!(
            "# use rdma_ring::backend::{soft::SoftDevice, CompletionEvents, CompletionQueue, QpConfig};\n",
            "# use rdma_ring::buf::{BaseBuf, ExposedBuf, RegisteredBuf, RemoteAccess};\n",
            "# use rdma_ring::op::*;\n",
            "# use rdma_ring::ring::{Ring, RingConfig};\n",
            "# use rdma_ring::Error;\n",
            "# use std::time::Duration;\n",
            "# let dev = SoftDevice::new();\n",
            "# let pd = dev.alloc_pd();\n",
            "# let (qp, peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();\n",
            "# let mut ring = Ring::new(qp, RingConfig::default());\n",
            "# let mut peer = Ring::new(peer, RingConfig::default());\n",
            "# let buf = |len: usize| RegisteredBuf::new(&pd, vec![1u8; len]).unwrap();\n",
            "# let word = || RegisteredBuf::new(&pd, Box::new(0u64)).unwrap().word(0).unwrap();\n",
            "# let rights = RemoteAccess::READ | RemoteAccess::WRITE | RemoteAccess::ATOMIC;\n",
            "# let target = ExposedBuf::new(&pd, vec![0u64; 512].into_boxed_slice(), rights).unwrap();\n",
            "# let remote = target.remote();\n",
            "# for _ in 0..2 {\n",
            "#     peer.submission().push(Recv::new(buf(4096))).unwrap();\n",
            "# }\n",
            "# peer.submit().unwrap();\n",
        )
    };
}

// `$new` builds a fresh operation of `$ty` in the examples (see
// `setter_example_setup`).
macro_rules! common_setters {
    ($ty:ident, $new:literal) => {
        impl<B> $ty<B> {
            /// Tags the operation; its completion carries the tag back.
            ///
            #[doc = concat!(
                "```\n",
                setter_example_setup!(),
                "let op = ", $new, ".user_data(42);\n",
                "ring.submission().push(op).unwrap();\n",
                "ring.submit().unwrap();\n",
                "let done = ring.completion().wait(1).unwrap();\n",
                "assert_eq!(done[0].kind(), OpKind::", stringify!($ty), ");\n",
                "assert_eq!(done[0].user_data(), 42);\n",
                "```",
            )]
            pub fn user_data(mut self, user_data: u64) -> Self {
                self.user_data = user_data;
                self
            }

            /// Asks the device for a completion queue entry for this work
            /// request, so it (and every unsignaled one before it) is
            /// released as soon as it completes. Without it the ring
            /// decides; the operation comes back either way.
            ///
            #[doc = concat!(
                "```\n",
                setter_example_setup!(),
                "let mut sq = ring.submission();\n",
                "sq.push(", $new, ".signaled()).unwrap();\n",
                "sq.push(", $new, ").unwrap();\n",
                "sq.submit().unwrap();\n",
                "// The ring signals the last work request of a submit anyway.\n",
                "assert_eq!(ring.stats().signaled, 2);\n",
                "assert_eq!(ring.completion().wait(2).unwrap().len(), 2);\n",
                "// Each came back on its own CQE, none released by a later one.\n",
                "assert_eq!(ring.stats().implicit, 0);\n",
                "```",
            )]
            pub fn signaled(mut self) -> Self {
                self.flags |= SendFlags::SIGNALED;
                self
            }

            /// Makes the work request wait until earlier RDMA READs and
            /// atomics on this queue pair have completed.
            ///
            #[doc = concat!(
                "```\n",
                setter_example_setup!(),
                "let mut sq = ring.submission();\n",
                "sq.push(Read::new(buf(8), remote)).unwrap();\n",
                "// Must not overtake the READ (it may overwrite, or let the peer reuse, what the READ reads).\n",
                "sq.push(", $new, ".fence()).unwrap();\n",
                "sq.submit().unwrap();\n",
                "let done = ring.completion().wait(2).unwrap();\n",
                "assert_eq!([done[0].kind(), done[1].kind()], [OpKind::Read, OpKind::", stringify!($ty), "]);\n",
                "assert!(done.iter().all(|c| c.status().is_success()));\n",
                "```",
            )]
            pub fn fence(mut self) -> Self {
                self.flags |= SendFlags::FENCE;
                self
            }
        }
    };
}

// `$pre` and `$post` surround the payload buffer to build an operation of
// `$ty` in the example (see `setter_example_setup`).
macro_rules! inline_setter {
    ($ty:ident, $pre:literal, $post:literal) => {
        impl<B> $ty<B> {
            /// Copies the payload into the work request at post time (up to
            /// the queue pair's `max_inline_data`), saving the NIC a DMA read.
            ///
            #[doc = concat!(
                "```\n",
                setter_example_setup!(),
                "let max = ring.caps().max_inline_data as usize;\n",
                "let too_big = ", $pre, "buf(max + 1)", $post, ".inline();\n",
                "let refused = ring.submission().push(too_big).unwrap_err();\n",
                "assert!(matches!(refused.error(), Error::InlineTooLarge { .. }));\n",
                "ring.submission().push(", $pre, "buf(max)", $post, ".inline()).unwrap();\n",
                "ring.submit().unwrap();\n",
                "assert_eq!(ring.completion().wait(1).unwrap()[0].result().unwrap(), max);\n",
                "```",
            )]
            pub fn inline(mut self) -> Self {
                self.flags |= SendFlags::INLINE;
                self
            }
        }
    };
}

// `$new` builds an operation of `$ty` carrying 8 bytes in the example (see
// `setter_example_setup`).
// Left as written: rustfmt does not settle this macro's doc attribute in
// one run (each of its first runs indents it further), so a file it had
// formatted once could fail `cargo fmt --check`.
#[rustfmt::skip]
macro_rules! solicited_setter {
    ($ty:ident, $new:literal) => {
        impl<B> $ty<B> {
            /// Asks the receiver to raise a solicited completion event.
            ///
            #[doc = concat!(
                "```\n",
                setter_example_setup!(),
                "let events = peer.cq().completion_events().unwrap();\n",
                "events.arm_solicited().unwrap();\n",
                "ring.submission().push(", $new, ").unwrap();\n",
                "ring.submit().unwrap();\n",
                "// A message that did not ask for an event wakes no one.\n",
                "assert_eq!(events.take().unwrap(), 0);\n",
                "ring.submission().push(", $new, ".solicited()).unwrap();\n",
                "ring.submit().unwrap();\n",
                "assert!(events.wait(Duration::from_secs(5)).unwrap());\n",
                "assert_eq!(peer.completion().wait(2).unwrap().len(), 2);\n",
                "```",
            )]
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
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::SoftDevice, QpConfig};
    /// # use rdma_ring::buf::{ExposedBuf, RegisteredBuf, RemoteAccess};
    /// # use rdma_ring::op::Write;
    /// # use rdma_ring::ring::{Ring, RingConfig};
    /// # use rdma_ring::Error;
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// # let (qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    /// # let mut ring = Ring::new(qp, RingConfig::default());
    /// # let buf = |bytes: &[u8]| RegisteredBuf::new(&pd, bytes.to_vec()).unwrap();
    /// let target = ExposedBuf::new(&pd, vec![0u8; 8], RemoteAccess::WRITE).unwrap();
    /// let refused = ring.submission().push(Write::new(buf(b"too long!"), target.remote()));
    /// assert!(matches!(refused.unwrap_err().error(), Error::RemoteTooSmall { local: 9, remote: 8 }));
    /// ring.submission().push(Write::new(buf(b"8 bytes!"), target.remote())).unwrap();
    /// ring.submit().unwrap();
    /// assert_eq!(ring.completion().wait(1).unwrap()[0].result().unwrap(), 8);
    /// assert_eq!(target.into_inner().unwrap(), b"8 bytes!");
    /// ```
    pub fn new(buf: B, remote: RemoteSlice) -> Self {
        Write {
            buf,
            remote,
            user_data: 0,
            flags: SendFlags::empty(),
        }
    }

    /// The buffer back, unsent.
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::SoftDevice, QpConfig};
    /// # use rdma_ring::buf::{ExposedBuf, RegisteredBuf, RemoteAccess};
    /// # use rdma_ring::op::Write;
    /// # use rdma_ring::ring::{Ring, RingConfig};
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// # let (qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    /// # let mut ring = Ring::new(qp, RingConfig::default());
    /// let read_only = ExposedBuf::new(&pd, vec![0u8; 64], RemoteAccess::READ).unwrap();
    /// let buf = RegisteredBuf::new(&pd, b"payload".to_vec()).unwrap();
    /// let refused = ring.submission().push(Write::new(buf, read_only.remote())).unwrap_err();
    /// // The slice grants no WRITE: take the buffer back for another target.
    /// let buf = refused.into_value().into_buf();
    /// assert_eq!(&buf[..], b"payload");
    /// ```
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
common_setters!(Write, "Write::new(buf(8), remote)");
inline_setter!(Write, "Write::new(", ", remote)");

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
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::SoftDevice, QpConfig};
    /// # use rdma_ring::buf::{ExposedBuf, RegisteredBuf, RemoteAccess};
    /// # use rdma_ring::op::{Recv, WriteImm};
    /// # use rdma_ring::ring::{Ring, RingConfig};
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// # let (qp, peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    /// # let (mut ring, mut peer) = (Ring::new(qp, RingConfig::default()), Ring::new(peer, RingConfig::default()));
    /// # let buf = |bytes: &[u8]| RegisteredBuf::new(&pd, bytes.to_vec()).unwrap();
    /// let target = ExposedBuf::new(&pd, vec![0u8; 8], RemoteAccess::WRITE).unwrap();
    /// // The notification consumes one of the peer's receives.
    /// peer.submission().push(Recv::new(buf(&[0; 16]))).unwrap();
    /// peer.submit().unwrap();
    /// ring.submission().push(WriteImm::new(buf(b"8 bytes!"), target.remote(), 0xfeed)).unwrap();
    /// ring.submit().unwrap();
    /// let got = peer.completion().wait(1).unwrap().pop().unwrap();
    /// assert!(got.is_write_imm());
    /// assert_eq!((got.imm(), got.byte_len()), (Some(0xfeed), 8));
    /// assert_eq!(target.into_inner().unwrap(), b"8 bytes!");
    /// ```
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
    ///
    /// ```
    /// # use rdma_ring::backend::soft::SoftDevice;
    /// # use rdma_ring::buf::{RegisteredBuf, RemoteAccess, RemoteSlice};
    /// # use rdma_ring::op::WriteImm;
    /// # let pd = SoftDevice::new().alloc_pd();
    /// let remote = RemoteSlice::new(0x1000, 64, 7, RemoteAccess::WRITE);
    /// let op = WriteImm::new(RegisteredBuf::new(&pd, b"draft".to_vec()).unwrap(), remote, 1);
    /// assert_eq!(&op.into_buf()[..], b"draft");
    /// ```
    pub fn into_buf(self) -> B {
        self.buf
    }
}

impl<L: BufList> WriteImm<SgList<L>> {
    /// Like [`Write::gather`], and notifies the peer with `imm`.
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::SoftDevice, QpConfig};
    /// # use rdma_ring::buf::{ExposedBuf, RegisteredBuf, RemoteAccess};
    /// # use rdma_ring::op::{Recv, WriteImm};
    /// # use rdma_ring::ring::{Ring, RingConfig};
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// # let (qp, peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    /// # let (mut ring, mut peer) = (Ring::new(qp, RingConfig::default()), Ring::new(peer, RingConfig::default()));
    /// # let buf = |bytes: &[u8]| RegisteredBuf::new(&pd, bytes.to_vec()).unwrap();
    /// # peer.submission().push(Recv::new(buf(&[0; 16]))).unwrap();
    /// # peer.submit().unwrap();
    /// let target = ExposedBuf::new(&pd, vec![0u8; 8], RemoteAccess::WRITE).unwrap();
    /// let op = WriteImm::gather([buf(b"head"), buf(b"body")], target.remote(), 2);
    /// ring.submission().push(op).unwrap();
    /// ring.submit().unwrap();
    /// let got = peer.completion().wait(1).unwrap().pop().unwrap();
    /// assert_eq!((got.imm(), got.byte_len()), (Some(2), 8));
    /// assert_eq!(target.into_inner().unwrap(), b"headbody");
    /// ```
    pub fn gather(list: L, remote: RemoteSlice, imm: u32) -> Self {
        WriteImm::new(SgList::new(list), remote, imm)
    }
}
common_setters!(WriteImm, "WriteImm::new(buf(8), remote, 1)");
inline_setter!(WriteImm, "WriteImm::new(", ", remote, 1)");
solicited_setter!(WriteImm, "WriteImm::new(buf(8), remote, 1)");

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
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::SoftDevice, QpConfig};
    /// # use rdma_ring::buf::RegisteredBuf;
    /// # use rdma_ring::op::{Recv, Send};
    /// # use rdma_ring::ring::{Ring, RingConfig};
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// # let (qp, peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    /// # let (mut ring, mut peer) = (Ring::new(qp, RingConfig::default()), Ring::new(peer, RingConfig::default()));
    /// # let buf = |bytes: &[u8]| RegisteredBuf::new(&pd, bytes.to_vec()).unwrap();
    /// peer.submission().push(Recv::new(buf(&[0; 16]))).unwrap();
    /// peer.submit().unwrap();
    /// ring.submission().push(Send::new(buf(b"ping"))).unwrap();
    /// ring.submit().unwrap();
    /// let (len, got) = peer.completion().wait(1).unwrap().pop().unwrap().into_parts();
    /// assert_eq!(&got[..len.unwrap()], b"ping");
    /// ```
    pub fn new(buf: B) -> Self {
        Send {
            buf,
            user_data: 0,
            flags: SendFlags::empty(),
        }
    }

    /// The buffer back, unsent.
    ///
    /// ```
    /// # use rdma_ring::backend::soft::SoftDevice;
    /// # use rdma_ring::buf::RegisteredBuf;
    /// # use rdma_ring::op::Send;
    /// # let pd = SoftDevice::new().alloc_pd();
    /// let op = Send::new(RegisteredBuf::new(&pd, b"draft".to_vec()).unwrap());
    /// assert_eq!(&op.into_buf()[..], b"draft");
    /// ```
    pub fn into_buf(self) -> B {
        self.buf
    }
}

impl<L: BufList> Send<SgList<L>> {
    /// Sends the bytes of several buffers, gathered in order, as one
    /// message.
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::SoftDevice, QpConfig};
    /// # use rdma_ring::buf::RegisteredBuf;
    /// # use rdma_ring::op::{Recv, Send};
    /// # use rdma_ring::ring::{Ring, RingConfig};
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// # let (qp, peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    /// # let (mut ring, mut peer) = (Ring::new(qp, RingConfig::default()), Ring::new(peer, RingConfig::default()));
    /// # let buf = |bytes: &[u8]| RegisteredBuf::new(&pd, bytes.to_vec()).unwrap();
    /// # peer.submission().push(Recv::new(buf(&[0; 16]))).unwrap();
    /// # peer.submit().unwrap();
    /// ring.submission().push(Send::gather([buf(b"he"), buf(b"llo")])).unwrap();
    /// ring.submit().unwrap();
    /// let (len, got) = peer.completion().wait(1).unwrap().pop().unwrap().into_parts();
    /// assert_eq!(&got[..len.unwrap()], b"hello");
    /// ```
    pub fn gather(list: L) -> Self {
        Send::new(SgList::new(list))
    }
}
common_setters!(Send, "Send::new(buf(8))");
inline_setter!(Send, "Send::new(", ")");
solicited_setter!(Send, "Send::new(buf(8))");

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
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::SoftDevice, QpConfig};
    /// # use rdma_ring::buf::RegisteredBuf;
    /// # use rdma_ring::op::{Recv, SendImm};
    /// # use rdma_ring::ring::{Ring, RingConfig};
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// # let (qp, peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    /// # let (mut ring, mut peer) = (Ring::new(qp, RingConfig::default()), Ring::new(peer, RingConfig::default()));
    /// # let buf = |bytes: &[u8]| RegisteredBuf::new(&pd, bytes.to_vec()).unwrap();
    /// peer.submission().push(Recv::new(buf(&[0; 16]))).unwrap();
    /// peer.submit().unwrap();
    /// ring.submission().push(SendImm::new(buf(b"ping"), 42)).unwrap();
    /// ring.submit().unwrap();
    /// let got = peer.completion().wait(1).unwrap().pop().unwrap();
    /// assert_eq!(got.imm(), Some(42));
    /// assert_eq!(&got.buf()[..got.byte_len() as usize], b"ping");
    /// ```
    pub fn new(buf: B, imm: u32) -> Self {
        SendImm {
            buf,
            imm,
            user_data: 0,
            flags: SendFlags::empty(),
        }
    }

    /// The buffer back, unsent.
    ///
    /// ```
    /// # use rdma_ring::backend::soft::SoftDevice;
    /// # use rdma_ring::buf::RegisteredBuf;
    /// # use rdma_ring::op::SendImm;
    /// # let pd = SoftDevice::new().alloc_pd();
    /// let op = SendImm::new(RegisteredBuf::new(&pd, b"draft".to_vec()).unwrap(), 42);
    /// assert_eq!(&op.into_buf()[..], b"draft");
    /// ```
    pub fn into_buf(self) -> B {
        self.buf
    }
}

impl<L: BufList> SendImm<SgList<L>> {
    /// Like [`Send::gather`], with immediate data.
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::SoftDevice, QpConfig};
    /// # use rdma_ring::buf::RegisteredBuf;
    /// # use rdma_ring::op::{Recv, SendImm};
    /// # use rdma_ring::ring::{Ring, RingConfig};
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// # let (qp, peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    /// # let (mut ring, mut peer) = (Ring::new(qp, RingConfig::default()), Ring::new(peer, RingConfig::default()));
    /// # let buf = |bytes: &[u8]| RegisteredBuf::new(&pd, bytes.to_vec()).unwrap();
    /// # peer.submission().push(Recv::new(buf(&[0; 16]))).unwrap();
    /// # peer.submit().unwrap();
    /// ring.submission().push(SendImm::gather([buf(b"he"), buf(b"llo")], 42)).unwrap();
    /// ring.submit().unwrap();
    /// let got = peer.completion().wait(1).unwrap().pop().unwrap();
    /// assert_eq!(got.imm(), Some(42));
    /// assert_eq!(&got.buf()[..got.byte_len() as usize], b"hello");
    /// ```
    pub fn gather(list: L, imm: u32) -> Self {
        SendImm::new(SgList::new(list), imm)
    }
}
common_setters!(SendImm, "SendImm::new(buf(8), 1)");
inline_setter!(SendImm, "SendImm::new(", ", 1)");
solicited_setter!(SendImm, "SendImm::new(buf(8), 1)");

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
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::SoftDevice, QpConfig};
    /// # use rdma_ring::buf::{ExposedBuf, RegisteredBuf, RemoteAccess};
    /// # use rdma_ring::op::Read;
    /// # use rdma_ring::ring::{Ring, RingConfig};
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// # let (qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    /// # let mut ring = Ring::new(qp, RingConfig::default());
    /// # let buf = |bytes: &[u8]| RegisteredBuf::new(&pd, bytes.to_vec()).unwrap();
    /// let source = ExposedBuf::new(&pd, b"remote bytes".to_vec(), RemoteAccess::READ).unwrap();
    /// ring.submission().push(Read::new(buf(&[0; 6]), source.remote())).unwrap();
    /// ring.submit().unwrap();
    /// let (len, got) = ring.completion().wait(1).unwrap().pop().unwrap().into_parts();
    /// assert_eq!(len.unwrap(), 6);
    /// assert_eq!(&got[..], b"remote");
    /// ```
    pub fn new(buf: B, remote: RemoteSlice) -> Self {
        Read {
            buf,
            remote,
            user_data: 0,
            flags: SendFlags::empty(),
        }
    }

    /// The buffer back, unread.
    ///
    /// ```
    /// # use rdma_ring::backend::soft::SoftDevice;
    /// # use rdma_ring::buf::{RegisteredBuf, RemoteAccess, RemoteSlice};
    /// # use rdma_ring::op::Read;
    /// # let pd = SoftDevice::new().alloc_pd();
    /// let remote = RemoteSlice::new(0x1000, 64, 7, RemoteAccess::READ);
    /// let op = Read::new(RegisteredBuf::new(&pd, vec![0u8; 16]).unwrap(), remote);
    /// assert_eq!(op.into_buf().len(), 16);
    /// ```
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
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::SoftDevice, QpConfig};
    /// # use rdma_ring::buf::{ExposedBuf, RegisteredBuf, RemoteAccess};
    /// # use rdma_ring::op::Read;
    /// # use rdma_ring::ring::{Ring, RingConfig};
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// # let (qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    /// # let mut ring = Ring::new(qp, RingConfig::default());
    /// # let buf = |bytes: &[u8]| RegisteredBuf::new(&pd, bytes.to_vec()).unwrap();
    /// let source = ExposedBuf::new(&pd, b"headbody".to_vec(), RemoteAccess::READ).unwrap();
    /// let op = Read::scatter([buf(&[0; 4]), buf(&[0; 4])], source.remote());
    /// ring.submission().push(op).unwrap();
    /// ring.submit().unwrap();
    /// let bufs = ring.completion().wait(1).unwrap().pop().unwrap().into_bufs();
    /// assert_eq!((&bufs[0][..], &bufs[1][..]), (&b"head"[..], &b"body"[..]));
    /// ```
    pub fn scatter(list: L, remote: RemoteSlice) -> Self {
        Read::new(SgList::new(list), remote)
    }
}
common_setters!(Read, "Read::new(buf(8), remote)");

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
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::SoftDevice, QpConfig};
    /// # use rdma_ring::buf::RegisteredBuf;
    /// # use rdma_ring::op::{Recv, Send};
    /// # use rdma_ring::ring::{Ring, RingConfig};
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// # let (qp, peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    /// # let (mut ring, mut peer) = (Ring::new(qp, RingConfig::default()), Ring::new(peer, RingConfig::default()));
    /// # let buf = |bytes: &[u8]| RegisteredBuf::new(&pd, bytes.to_vec()).unwrap();
    /// ring.submission().push(Recv::new(buf(&[0; 16]))).unwrap();
    /// ring.submit().unwrap();
    /// peer.submission().push(Send::new(buf(b"hi"))).unwrap();
    /// peer.submit().unwrap();
    /// let got = ring.completion().wait(1).unwrap().pop().unwrap();
    /// assert_eq!(got.byte_len(), 2);
    /// assert_eq!(&got.buf()[..2], b"hi");
    /// ```
    pub fn new(buf: B) -> Self {
        Recv { buf, user_data: 0 }
    }

    /// Tags the operation; its completion carries the tag back.
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::SoftDevice, QpConfig};
    /// # use rdma_ring::buf::RegisteredBuf;
    /// # use rdma_ring::op::{Recv, Send};
    /// # use rdma_ring::ring::{Ring, RingConfig};
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// # let (qp, peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    /// # let (mut ring, mut peer) = (Ring::new(qp, RingConfig::default()), Ring::new(peer, RingConfig::default()));
    /// # let buf = |bytes: &[u8]| RegisteredBuf::new(&pd, bytes.to_vec()).unwrap();
    /// ring.submission().push(Recv::new(buf(&[0; 16])).user_data(1)).unwrap();
    /// ring.submission().push(Recv::new(buf(&[0; 16])).user_data(2)).unwrap();
    /// ring.submit().unwrap();
    /// peer.submission().push(Send::new(buf(b"first"))).unwrap();
    /// peer.submit().unwrap();
    /// // Receives are consumed in the order they were posted.
    /// assert_eq!(ring.completion().wait(1).unwrap()[0].user_data(), 1);
    /// ```
    pub fn user_data(mut self, user_data: u64) -> Self {
        self.user_data = user_data;
        self
    }

    /// The buffer back, unposted.
    ///
    /// ```
    /// # use rdma_ring::backend::soft::SoftDevice;
    /// # use rdma_ring::buf::RegisteredBuf;
    /// # use rdma_ring::op::Recv;
    /// # let pd = SoftDevice::new().alloc_pd();
    /// let op = Recv::new(RegisteredBuf::new(&pd, vec![0u8; 4096]).unwrap());
    /// assert_eq!(op.into_buf().len(), 4096);
    /// ```
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
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::SoftDevice, QpConfig};
    /// # use rdma_ring::buf::{BaseBuf, ExposedBuf, RegisteredBuf, RemoteAccess, Word};
    /// # use rdma_ring::op::CompareSwap;
    /// # use rdma_ring::ring::{Ring, RingConfig};
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// # let (qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    /// # let mut ring = Ring::new(qp, RingConfig::default());
    /// # let buf = |bytes: &[u8]| RegisteredBuf::new(&pd, bytes.to_vec()).unwrap();
    /// # let word = || RegisteredBuf::new(&pd, Box::new(0u64)).unwrap().word(0).unwrap();
    /// let lock = ExposedBuf::new(&pd, Box::new(5u64), RemoteAccess::ATOMIC).unwrap();
    /// let remote = lock.remote().word(0).unwrap();
    /// let mut sq = ring.submission();
    /// sq.push(CompareSwap::new(word(), remote, 5, 9)).unwrap(); // 5 == 5: swaps
    /// sq.push(CompareSwap::new(word(), remote, 5, 7)).unwrap(); // 9 != 5: leaves it
    /// sq.submit().unwrap();
    /// for (done, old) in ring.completion().wait(2).unwrap().into_iter().zip([5, 9]) {
    ///     assert_eq!(done.into_buf().downcast::<Word<RegisteredBuf>>().unwrap().get(), old);
    /// }
    /// assert_eq!(*lock.into_inner().unwrap(), 9);
    /// ```
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
    ///
    /// ```
    /// # use rdma_ring::backend::soft::SoftDevice;
    /// # use rdma_ring::buf::{BaseBuf, RegisteredBuf, RemoteAccess, RemoteSlice};
    /// # use rdma_ring::op::CompareSwap;
    /// # let pd = SoftDevice::new().alloc_pd();
    /// let mut word = RegisteredBuf::new(&pd, Box::new(0u64)).unwrap().word(0).unwrap();
    /// word.set(7);
    /// let remote = RemoteSlice::new(0x1000, 64, 7, RemoteAccess::ATOMIC).word(0).unwrap();
    /// let op = CompareSwap::new(word, remote, 0, 1);
    /// assert_eq!(op.into_buf().get(), 7);
    /// ```
    pub fn into_buf(self) -> Word<B> {
        self.word
    }
}
common_setters!(
    CompareSwap,
    "CompareSwap::new(word(), remote.word(0).unwrap(), 0, 1)"
);

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
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::SoftDevice, QpConfig};
    /// # use rdma_ring::buf::{BaseBuf, ExposedBuf, RegisteredBuf, RemoteAccess, Word};
    /// # use rdma_ring::op::FetchAdd;
    /// # use rdma_ring::ring::{Ring, RingConfig};
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// # let (qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    /// # let mut ring = Ring::new(qp, RingConfig::default());
    /// # let buf = |bytes: &[u8]| RegisteredBuf::new(&pd, bytes.to_vec()).unwrap();
    /// # let word = || RegisteredBuf::new(&pd, Box::new(0u64)).unwrap().word(0).unwrap();
    /// let counter = ExposedBuf::new(&pd, Box::new(41u64), RemoteAccess::ATOMIC).unwrap();
    /// ring.submission().push(FetchAdd::new(word(), counter.remote().word(0).unwrap(), 1)).unwrap();
    /// ring.submit().unwrap();
    /// let old = ring.completion().wait(1).unwrap().pop().unwrap().into_buf();
    /// assert_eq!(old.downcast::<Word<RegisteredBuf>>().unwrap().get(), 41);
    /// assert_eq!(*counter.into_inner().unwrap(), 42);
    /// ```
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
    ///
    /// ```
    /// # use rdma_ring::backend::soft::SoftDevice;
    /// # use rdma_ring::buf::{BaseBuf, RegisteredBuf, RemoteAccess, RemoteSlice};
    /// # use rdma_ring::op::FetchAdd;
    /// # let pd = SoftDevice::new().alloc_pd();
    /// let mut word = RegisteredBuf::new(&pd, Box::new(0u64)).unwrap().word(0).unwrap();
    /// word.set(7);
    /// let remote = RemoteSlice::new(0x1000, 64, 7, RemoteAccess::ATOMIC).word(0).unwrap();
    /// let op = FetchAdd::new(word, remote, 1);
    /// assert_eq!(op.into_buf().get(), 7);
    /// ```
    pub fn into_buf(self) -> Word<B> {
        self.word
    }
}
common_setters!(
    FetchAdd,
    "FetchAdd::new(word(), remote.word(0).unwrap(), 1)"
);

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
        let count = self.buf.sge_count();
        if count > limits.max_read_sge as usize {
            return Err(Error::TooManySges {
                count,
                max: limits.max_read_sge,
            });
        }
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
