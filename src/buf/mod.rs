//! Owned, registered buffers.
//!
//! A buffer the NIC may touch is never reachable from safe code: pushing an
//! operation moves its buffer into the ring, and the buffer comes back only
//! in the operation's completion. The types here are the only ones an
//! operation accepts, so the ring always knows the key, bounds and rights
//! of the memory it posts.
//!
//! * [`RegisteredBuf`]: memory you own ([`StableBufMut`]), registered for
//!   local access; readable and writable between operations.
//! * [`ReadOnlyBuf`]: memory registered without local write rights (static
//!   data, say); only a source for writes and sends.
//! * [`BufferPool`] / [`PoolChunk`]: one registration cut into fixed-size
//!   chunks, so steady-state operations register nothing.
//! * [`Slice`]: a sub-range of one of the above; [`Word`]: exactly 8
//!   aligned bytes of one, the local target of an atomic.
//! * [`SgList`]: several of the above as one operation's scatter/gather
//!   list (`[B; N]` or `Vec<B>`), all owned by the operation.
//! * [`ExposedBuf`]: memory a peer may read, write or run atomics on; it is
//!   never a local buffer, and its bytes are reachable only through
//!   `unsafe` or by taking the memory back with [`ExposedBuf::into_inner`].
//! * [`RemoteSlice`] / [`RemoteWord`]: a peer's exposed memory.
//! * [`OwnedBuf`]: any single local buffer with its type erased;
//!   [`OwnedBufs`]: an operation's buffers, as its completion hands them
//!   back.

mod exposed;
mod owned;
mod owned_bufs;
mod pool;
mod region;
mod registered;
mod registration;
mod remote;
mod sg_list;
mod slice;
mod stable;
mod word;

pub use exposed::ExposedBuf;
pub use owned::OwnedBuf;
pub use owned_bufs::OwnedBufs;
pub use pool::{BufferPool, PoolChunk};
pub use region::{Region, RegionAllocator};
pub use registered::{ReadOnlyBuf, RegisteredBuf};
pub use remote::{RemoteAccess, RemoteSlice, RemoteWord, REMOTE_SLICE_WIRE_LEN};
pub use sg_list::{BufList, SgList};
pub use slice::Slice;
pub use stable::{StableBuf, StableBufMut};
pub use word::Word;

pub(crate) use owned::Base;
pub(crate) use registration::Registration;

use crate::backend::{PdId, Sge};

pub(crate) mod sealed {
    pub trait Sealed {}
}

/// A registered local buffer an operation can take: the crate's buffer
/// types, views of them, and scatter/gather lists of them ([`SgList`]).
/// Sealed: bring your own memory through [`StableBufMut`] and
/// [`RegisteredBuf::new`].
///
/// ```
/// use rdma_ring::backend::soft::SoftDevice;
/// use rdma_ring::buf::{IoBuf, RegisteredBuf, BaseBuf, SgList};
/// let dev = SoftDevice::new();
/// let pd = dev.alloc_pd();
/// let a = RegisteredBuf::new(&pd, vec![0u8; 64]).unwrap();
/// let b = RegisteredBuf::new(&pd, vec![0u8; 32]).unwrap();
/// assert_eq!(a.slice(8..24).bytes_len(), 16);
/// assert_eq!(SgList::new([b.slice(0..8), RegisteredBuf::new(&pd, vec![0u8; 4]).unwrap().slice(..)]).bytes_len(), 12);
/// ```
pub trait IoBuf: sealed::Sealed + Send + 'static {
    /// Number of bytes an operation on this buffer moves.
    fn bytes_len(&self) -> usize;
    #[doc(hidden)]
    fn sge_count(&self) -> usize;
    #[doc(hidden)]
    fn push_sges(&self, out: &mut Vec<Sge>);
    /// The first protection domain among the buffer's that is not `pd`.
    #[doc(hidden)]
    fn foreign_pd(&self, pd: PdId) -> Option<PdId>;
    #[doc(hidden)]
    fn into_bufs(self) -> OwnedBufs;
    #[doc(hidden)]
    fn from_bufs(bufs: OwnedBufs) -> Result<Self, OwnedBufs>
    where
        Self: Sized;
}

/// A buffer that is one registered range: the crate's buffer types and
/// views of them, but not a scatter/gather list. Any such buffer can be
/// type-erased into an [`OwnedBuf`].
pub trait SingleBuf: IoBuf + Sized {
    /// The buffer, with its type erased (as a completion hands it back;
    /// [`OwnedBuf::downcast`] restores it).
    fn into_owned(self) -> OwnedBuf;
    #[doc(hidden)]
    fn single_len(&self) -> usize;
    #[doc(hidden)]
    fn sge(&self) -> Sge;
    #[doc(hidden)]
    fn pd(&self) -> PdId;
    #[doc(hidden)]
    fn from_owned(buf: OwnedBuf) -> Result<Self, OwnedBuf>;
}

/// `IoBuf` for a single buffer type, from its `SingleBuf` parts.
macro_rules! single_io_buf {
    ($ty:ident) => {
        $crate::buf::single_io_buf!(generic [] $ty);
    };
    (generic [$($gen:tt)*] $ty:ty) => {
        impl<$($gen)*> $crate::buf::IoBuf for $ty {
            #[inline]
            fn bytes_len(&self) -> usize {
                $crate::buf::SingleBuf::single_len(self)
            }
            #[inline]
            fn sge_count(&self) -> usize {
                1
            }
            #[inline]
            fn push_sges(&self, out: &mut Vec<$crate::backend::Sge>) {
                let sge = $crate::buf::SingleBuf::sge(self);
                // No element for no bytes: some devices read a zero
                // length as 2^31, which under a pool's or an arena's key
                // would reach its neighbours.
                if sge.len != 0 {
                    out.push(sge);
                }
            }
            #[inline]
            fn foreign_pd(&self, pd: $crate::backend::PdId) -> Option<$crate::backend::PdId> {
                let own = $crate::buf::SingleBuf::pd(self);
                (own != pd).then_some(own)
            }
            #[inline]
            fn into_bufs(self) -> $crate::buf::OwnedBufs {
                $crate::buf::OwnedBufs::one($crate::buf::SingleBuf::into_owned(self))
            }
            #[inline]
            fn from_bufs(bufs: $crate::buf::OwnedBufs) -> Result<Self, $crate::buf::OwnedBufs> {
                let one = bufs.into_single()?;
                <Self as $crate::buf::SingleBuf>::from_owned(one).map_err($crate::buf::OwnedBufs::one)
            }
        }
    };
}
pub(crate) use single_io_buf;

/// A local buffer the NIC may write: the target of READ, RECV and atomics.
/// Registered with local write rights.
pub trait IoBufMut: IoBuf {}

/// A whole registered buffer (not a view), which can be sliced.
pub trait BaseBuf: SingleBuf {
    #[doc(hidden)]
    fn into_base(self) -> Base;
    #[doc(hidden)]
    fn from_base(base: Base) -> Result<Self, Base>;

    /// A view of `range` of this buffer; operations on the view move only
    /// those bytes, and the whole buffer comes back with
    /// [`Slice::into_inner`].
    ///
    /// # Panics
    ///
    /// If the range is out of bounds, as slice indexing does.
    fn slice(self, range: impl std::ops::RangeBounds<usize>) -> Slice<Self> {
        Slice::new(self, range)
    }

    /// The 8 bytes at `offset` as the local target of an atomic. Fails,
    /// handing the buffer back, unless they are in bounds and 8-aligned.
    fn word(self, offset: usize) -> Result<Word<Self>, crate::Rejected<Self>>
    where
        Self: IoBufMut,
    {
        Word::new(self, offset)
    }
}
