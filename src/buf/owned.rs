//! A local buffer with its type erased, as the ring stores it.

use std::fmt;

use super::{sealed, PoolChunk, ReadOnlyBuf, Region, RegisteredBuf, SingleBuf};
use crate::backend::{PdId, Sge};

/// The whole buffers the crate knows; every local buffer is one of them,
/// possibly viewed through a range.
#[doc(hidden)]
pub enum Base {
    Registered(RegisteredBuf),
    ReadOnly(ReadOnlyBuf),
    Chunk(PoolChunk),
    Region(Region),
}

impl Base {
    #[inline]
    fn bytes(&self) -> &[u8] {
        match self {
            Base::Registered(b) => b,
            Base::ReadOnly(b) => b,
            Base::Chunk(b) => b,
            Base::Region(b) => b,
        }
    }

    fn bytes_mut(&mut self) -> Option<&mut [u8]> {
        match self {
            Base::Registered(b) => Some(b),
            Base::ReadOnly(_) => None,
            Base::Chunk(b) => Some(b),
            Base::Region(b) => Some(b),
        }
    }

    #[inline]
    fn sge(&self) -> Sge {
        match self {
            Base::Registered(b) => b.sge(),
            Base::ReadOnly(b) => b.sge(),
            Base::Chunk(b) => b.sge(),
            Base::Region(b) => b.sge(),
        }
    }

    #[inline]
    fn pd(&self) -> PdId {
        match self {
            Base::Registered(b) => b.pd(),
            Base::ReadOnly(b) => b.pd(),
            Base::Chunk(b) => b.pd(),
            Base::Region(b) => b.pd(),
        }
    }

    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.bytes().len()
    }
}

/// Any local buffer, type erased: what a [`Completion`] hands back. Turn it
/// back into the type you pushed with [`OwnedBuf::downcast`].
///
/// ```
/// use rdma_ring::backend::soft::SoftDevice;
/// use rdma_ring::buf::{BaseBuf, OwnedBuf, RegisteredBuf, SingleBuf, Slice};
/// let pd = SoftDevice::new().alloc_pd();
/// let buf = RegisteredBuf::new(&pd, vec![5u8; 32]).unwrap();
/// let owned: OwnedBuf = buf.slice(4..8).into_owned();
/// assert_eq!(&owned[..], &[5, 5, 5, 5]);
/// let back: Slice<RegisteredBuf> = owned.downcast().unwrap();
/// assert_eq!(back.into_inner().len(), 32);
/// ```
///
/// [`Completion`]: crate::ring::Completion
pub struct OwnedBuf {
    base: Base,
    start: usize,
    end: usize,
}

impl OwnedBuf {
    #[inline]
    pub(crate) fn new(base: Base, start: usize, end: usize) -> Self {
        debug_assert!(start <= end && end <= base.len());
        OwnedBuf { base, start, end }
    }

    #[inline]
    pub(crate) fn whole(base: Base) -> Self {
        let end = base.len();
        OwnedBuf::new(base, 0, end)
    }

    #[inline]
    pub(crate) fn into_base(self) -> (Base, usize, usize) {
        (self.base, self.start, self.end)
    }

    /// Start of the view within the whole buffer.
    pub fn start(&self) -> usize {
        self.start
    }

    /// Whether the NIC may write this buffer (it was registered with local
    /// write rights).
    pub fn is_writable(&self) -> bool {
        !matches!(self.base, Base::ReadOnly(_))
    }

    /// The viewed bytes, for writing; `None` for a read-only buffer.
    pub fn as_mut_slice(&mut self) -> Option<&mut [u8]> {
        let (start, end) = (self.start, self.end);
        self.base.bytes_mut().map(|b| &mut b[start..end])
    }

    /// The buffer as the type it was pushed as; the buffer itself if it is
    /// not of that type.
    pub fn downcast<T: SingleBuf>(self) -> Result<T, OwnedBuf> {
        T::from_owned(self)
    }
}

impl std::ops::Deref for OwnedBuf {
    type Target = [u8];
    #[inline]
    fn deref(&self) -> &[u8] {
        &self.base.bytes()[self.start..self.end]
    }
}

impl fmt::Debug for OwnedBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.base {
            Base::Registered(_) => "RegisteredBuf",
            Base::ReadOnly(_) => "ReadOnlyBuf",
            Base::Chunk(_) => "PoolChunk",
            Base::Region(_) => "Region",
        };
        f.debug_struct("OwnedBuf")
            .field("kind", &kind)
            .field("range", &(self.start..self.end))
            .finish()
    }
}

impl sealed::Sealed for OwnedBuf {}

super::single_io_buf!(OwnedBuf);

impl SingleBuf for OwnedBuf {
    #[inline]
    fn single_len(&self) -> usize {
        self.end - self.start
    }
    #[inline]
    fn sge(&self) -> Sge {
        let whole = self.base.sge();
        Sge {
            addr: whole.addr + self.start as u64,
            len: (self.end - self.start) as u32,
            lkey: whole.lkey,
        }
    }
    #[inline]
    fn pd(&self) -> PdId {
        self.base.pd()
    }
    #[inline]
    fn into_owned(self) -> OwnedBuf {
        self
    }
    #[inline]
    fn from_owned(buf: OwnedBuf) -> Result<Self, OwnedBuf> {
        Ok(buf)
    }
}
