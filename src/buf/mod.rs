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
//! * [`ExposedBuf`]: memory a peer may read, write or run atomics on; it is
//!   never a local buffer, and its bytes are reachable only through
//!   `unsafe` or by taking the memory back with [`ExposedBuf::into_inner`].
//! * [`RemoteSlice`] / [`RemoteWord`]: a peer's exposed memory.
//! * [`OwnedBuf`]: any local buffer with its type erased, as completions
//!   hand it back.

mod exposed;
mod owned;
mod pool;
mod registered;
mod registration;
mod remote;
mod slice;
mod stable;
mod word;

pub use exposed::ExposedBuf;
pub use owned::OwnedBuf;
pub use pool::{BufferPool, PoolChunk};
pub use registered::{ReadOnlyBuf, RegisteredBuf};
pub use remote::{RemoteAccess, RemoteSlice, RemoteWord, REMOTE_SLICE_WIRE_LEN};
pub use slice::Slice;
pub use stable::{StableBuf, StableBufMut};
pub use word::Word;

pub(crate) use owned::Base;

use crate::backend::{PdId, Sge};

pub(crate) mod sealed {
    pub trait Sealed {}
}

/// A registered local buffer an operation can take: the crate's buffer
/// types and views of them. Sealed: bring your own memory through
/// [`StableBufMut`] and [`RegisteredBuf::new`].
///
/// ```
/// use rdma_ring::backend::soft::SoftDevice;
/// use rdma_ring::buf::{IoBuf, RegisteredBuf, BaseBuf};
/// let dev = SoftDevice::new();
/// let pd = dev.alloc_pd();
/// let buf = RegisteredBuf::new(&pd, vec![0u8; 64]).unwrap();
/// assert_eq!(buf.slice(8..24).bytes_len(), 16);
/// ```
pub trait IoBuf: sealed::Sealed + Send + 'static {
    /// Number of bytes an operation on this buffer moves.
    fn bytes_len(&self) -> usize;
    #[doc(hidden)]
    fn sge(&self) -> Sge;
    #[doc(hidden)]
    fn pd(&self) -> PdId;
    #[doc(hidden)]
    fn into_owned(self) -> OwnedBuf;
    #[doc(hidden)]
    fn from_owned(buf: OwnedBuf) -> Result<Self, OwnedBuf>
    where
        Self: Sized;
}

/// A local buffer the NIC may write: the target of READ, RECV and atomics.
/// Registered with local write rights.
pub trait IoBufMut: IoBuf {}

/// A whole registered buffer (not a view), which can be sliced.
pub trait BaseBuf: IoBuf + Sized {
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
