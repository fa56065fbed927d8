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
pub(crate) use region::footprint;
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
    ///
    /// ```
    /// # use rdma_ring::backend::soft::SoftDevice;
    /// use rdma_ring::buf::{BaseBuf, IoBuf, RegisteredBuf, SgList};
    /// # let pd = SoftDevice::new().alloc_pd();
    /// let a = RegisteredBuf::new(&pd, vec![0u8; 64]).unwrap();
    /// let b = RegisteredBuf::new(&pd, vec![0u8; 32]).unwrap();
    /// assert_eq!(a.bytes_len(), 64);
    /// // A list moves the bytes of all its buffers.
    /// assert_eq!(SgList::new([a.slice(..16), b.slice(..)]).bytes_len(), 48);
    /// ```
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
///
/// ```
/// # use rdma_ring::backend::soft::SoftDevice;
/// use rdma_ring::buf::{OwnedBuf, ReadOnlyBuf, RegisteredBuf, SingleBuf};
/// # let pd = SoftDevice::new().alloc_pd();
/// // Buffers of different types, erased so that one list holds both.
/// let bufs: Vec<OwnedBuf> = vec![
///     RegisteredBuf::new(&pd, vec![1u8; 16]).unwrap().into_owned(),
///     ReadOnlyBuf::new(&pd, &b"static data"[..]).unwrap().into_owned(),
/// ];
/// assert!(bufs[0].is_writable());
/// assert!(!bufs[1].is_writable());
/// ```
pub trait SingleBuf: IoBuf + Sized {
    /// The buffer, with its type erased (as a completion hands it back;
    /// [`OwnedBuf::downcast`] restores it).
    ///
    /// ```
    /// # use rdma_ring::backend::soft::SoftDevice;
    /// use rdma_ring::buf::{ReadOnlyBuf, RegisteredBuf, SingleBuf};
    /// # let pd = SoftDevice::new().alloc_pd();
    /// let owned = RegisteredBuf::new(&pd, vec![3u8; 8]).unwrap().into_owned();
    /// assert_eq!(&owned[..], &[3u8; 8]);
    /// // The erased buffer still knows its type: a wrong guess hands it back.
    /// let owned = owned.downcast::<ReadOnlyBuf>().unwrap_err();
    /// let buf: RegisteredBuf = owned.downcast().unwrap();
    /// assert_eq!(buf.len(), 8);
    /// ```
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
///
/// ```
/// # use rdma_ring::backend::{soft::{SoftDevice, SoftQp}, QpConfig};
/// use rdma_ring::buf::{BufferPool, ExposedBuf, IoBufMut, RegisteredBuf, RemoteAccess, RemoteSlice};
/// use rdma_ring::op::Read;
/// use rdma_ring::ring::{Ring, RingConfig};
/// # let dev = SoftDevice::new();
/// # let pd = dev.alloc_pd();
/// # let (qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
/// # let mut ring = Ring::new(qp, RingConfig::default());
/// let exposed = ExposedBuf::new(&pd, vec![7u8; 16], RemoteAccess::READ).unwrap();
/// // A READ lands in local memory, so it takes any buffer the NIC may write.
/// fn read_into<B: IoBufMut>(ring: &mut Ring<SoftQp>, buf: B, from: RemoteSlice) -> Vec<u8> {
///     ring.submission().push(Read::new(buf, from)).unwrap();
///     ring.submit().unwrap();
///     ring.completion().wait(1).unwrap()[0].buf().to_vec()
/// }
/// let pool = BufferPool::new(&pd, 16, 1).unwrap();
/// assert_eq!(read_into(&mut ring, pool.take().unwrap(), exposed.remote()), [7u8; 16]);
/// let own = RegisteredBuf::new(&pd, vec![0u8; 16]).unwrap();
/// assert_eq!(read_into(&mut ring, own, exposed.remote()), [7u8; 16]);
/// ```
pub trait IoBufMut: IoBuf {}

/// A whole registered buffer (not a view), which can be sliced.
///
/// ```
/// # use rdma_ring::backend::soft::SoftDevice;
/// use rdma_ring::buf::{BaseBuf, IoBuf, RegisteredBuf};
/// # let pd = SoftDevice::new().alloc_pd();
/// let buf = RegisteredBuf::new(&pd, (0u8..64).collect::<Vec<u8>>()).unwrap();
/// let view = buf.slice(8..12);
/// // An operation on the view moves only these 4 bytes.
/// assert_eq!(view.bytes_len(), 4);
/// assert_eq!(&view[..], &[8, 9, 10, 11]);
/// assert_eq!(view.into_inner().len(), 64);
/// ```
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
    ///
    /// ```
    /// # use rdma_ring::backend::soft::SoftDevice;
    /// use rdma_ring::buf::{BaseBuf, RegisteredBuf};
    /// # let pd = SoftDevice::new().alloc_pd();
    /// let buf = RegisteredBuf::new(&pd, b"header:payload".to_vec()).unwrap();
    /// let payload = buf.slice(7..);
    /// assert_eq!(&payload[..], b"payload");
    /// assert_eq!((payload.start(), payload.end()), (7, 14));
    /// ```
    fn slice(self, range: impl std::ops::RangeBounds<usize>) -> Slice<Self> {
        Slice::new(self, range)
    }

    /// The 8 bytes at `offset` as the local target of an atomic. Fails,
    /// handing the buffer back, unless they are in bounds and 8-aligned.
    ///
    /// ```
    /// # use rdma_ring::backend::soft::SoftDevice;
    /// use rdma_ring::buf::{BaseBuf, RegisteredBuf};
    /// use rdma_ring::Error;
    /// # let pd = SoftDevice::new().alloc_pd();
    /// // Memory of u64s starts 8-aligned, so offset 8 is aligned and 4 is not.
    /// let buf = RegisteredBuf::new(&pd, vec![0u64; 4].into_boxed_slice()).unwrap();
    /// let refused = buf.word(4).unwrap_err();
    /// assert!(matches!(refused.error(), Error::Misaligned { .. }));
    /// let word = refused.into_value().word(8).unwrap();
    /// assert_eq!(word.offset(), 8);
    /// ```
    fn word(self, offset: usize) -> Result<Word<Self>, crate::Rejected<Self>>
    where
        Self: IoBufMut,
    {
        Word::new(self, offset)
    }
}
