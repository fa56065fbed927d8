//! The buffers of one operation, as its completion hands them back.

use std::fmt;

use super::{IoBuf, OwnedBuf};

/// An operation's buffers with their types erased: one buffer, or the
/// elements of a scatter/gather list in order. Never empty. Turn them back
/// into what was pushed with [`downcast`](Self::downcast).
///
/// ```
/// use rdma_ring::backend::soft::SoftDevice;
/// use rdma_ring::buf::{IoBuf, OwnedBufs, RegisteredBuf, SgList};
/// let pd = SoftDevice::new().alloc_pd();
/// let a = RegisteredBuf::new(&pd, vec![1u8; 4]).unwrap();
/// let b = RegisteredBuf::new(&pd, vec![2u8; 8]).unwrap();
/// let bufs: OwnedBufs = SgList::new([a, b]).into_bufs();
/// assert_eq!(bufs.len(), 2);
/// assert_eq!(&bufs[1][..], &[2u8; 8]);
/// let [a, b] = bufs.downcast::<SgList<[RegisteredBuf; 2]>>().unwrap().into_inner();
/// assert_eq!((a.len(), b.len()), (4, 8));
/// ```
pub struct OwnedBufs {
    repr: Repr,
}

enum Repr {
    One(OwnedBuf),
    Many(Box<[OwnedBuf]>),
}

impl OwnedBufs {
    #[doc(hidden)]
    #[inline]
    pub fn one(buf: OwnedBuf) -> Self {
        OwnedBufs {
            repr: Repr::One(buf),
        }
    }

    /// No buffer at all (the ring's own markers; never handed out).
    pub(crate) fn none() -> Self {
        OwnedBufs {
            repr: Repr::Many(Box::new([])),
        }
    }

    pub(crate) fn many(bufs: Vec<OwnedBuf>) -> Self {
        debug_assert!(!bufs.is_empty());
        OwnedBufs {
            repr: Repr::Many(bufs.into_boxed_slice()),
        }
    }

    /// The only buffer, if there is exactly one; otherwise all of them back.
    #[inline]
    pub fn into_single(self) -> Result<OwnedBuf, OwnedBufs> {
        match self.repr {
            Repr::One(buf) => Ok(buf),
            Repr::Many(many) if many.len() == 1 => Ok(many.into_vec().pop().expect("one element")),
            repr => Err(OwnedBufs { repr }),
        }
    }

    /// The first buffer (every operation has at least one) and the rest,
    /// dropped.
    #[inline]
    pub fn into_first(self) -> OwnedBuf {
        match self.repr {
            Repr::One(buf) => buf,
            Repr::Many(many) => many.into_vec().swap_remove(0),
        }
    }

    /// The buffers as a vector.
    pub fn into_vec(self) -> Vec<OwnedBuf> {
        match self.repr {
            Repr::One(buf) => vec![buf],
            Repr::Many(many) => many.into_vec(),
        }
    }

    /// The buffers as the type they were pushed as; themselves if they are
    /// not of that type.
    pub fn downcast<T: IoBuf>(self) -> Result<T, OwnedBufs> {
        T::from_bufs(self)
    }
}

impl std::ops::Deref for OwnedBufs {
    type Target = [OwnedBuf];
    #[inline]
    fn deref(&self) -> &[OwnedBuf] {
        match &self.repr {
            Repr::One(buf) => std::slice::from_ref(buf),
            Repr::Many(many) => many,
        }
    }
}

impl IntoIterator for OwnedBufs {
    type Item = OwnedBuf;
    type IntoIter = std::vec::IntoIter<OwnedBuf>;
    fn into_iter(self) -> Self::IntoIter {
        self.into_vec().into_iter()
    }
}

impl fmt::Debug for OwnedBufs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}
