//! A sub-range view of a whole buffer.

use std::ops::{Bound, RangeBounds};

use super::{sealed, BaseBuf, IoBufMut, OwnedBuf, SingleBuf, Word};
use crate::backend::{PdId, Sge};
use crate::error::Rejected;

/// A view of `start..end` of a whole buffer. Operations on it move only
/// those bytes; [`Slice::into_inner`] gives the whole buffer back.
///
/// ```
/// use rdma_ring::backend::soft::SoftDevice;
/// use rdma_ring::buf::{BaseBuf, RegisteredBuf};
/// let pd = SoftDevice::new().alloc_pd();
/// let buf = RegisteredBuf::new(&pd, (0u8..16).collect::<Vec<_>>()).unwrap();
/// let view = buf.slice(4..12).slice(2..4); // views compose
/// assert_eq!(&view[..], &[6, 7]);
/// assert_eq!((view.start(), view.end()), (6, 8));
/// ```
#[derive(Debug)]
pub struct Slice<T> {
    buf: T,
    start: usize,
    end: usize,
}

fn resolve(range: impl RangeBounds<usize>, len: usize) -> (usize, usize) {
    let start = match range.start_bound() {
        Bound::Included(&s) => s,
        Bound::Excluded(&s) => s.checked_add(1).expect("range start overflows"),
        Bound::Unbounded => 0,
    };
    let end = match range.end_bound() {
        Bound::Included(&e) => e.checked_add(1).expect("range end overflows"),
        Bound::Excluded(&e) => e,
        Bound::Unbounded => len,
    };
    assert!(
        start <= end && end <= len,
        "slice range {start}..{end} out of bounds for a buffer of {len} bytes"
    );
    (start, end)
}

impl<T: BaseBuf> Slice<T> {
    pub(crate) fn new(buf: T, range: impl RangeBounds<usize>) -> Self {
        let (start, end) = resolve(range, buf.bytes_len());
        Slice { buf, start, end }
    }

    /// A narrower view; `range` is relative to this view.
    ///
    /// # Panics
    ///
    /// If the range is out of bounds of this view.
    pub fn slice(self, range: impl RangeBounds<usize>) -> Slice<T> {
        let (start, end) = resolve(range, self.end - self.start);
        Slice {
            buf: self.buf,
            start: self.start + start,
            end: self.start + end,
        }
    }

    /// The 8 bytes at `offset` (relative to this view) as an atomic target.
    pub fn word(self, offset: usize) -> Result<Word<T>, Rejected<Self>>
    where
        T: IoBufMut,
    {
        if offset
            .checked_add(8)
            .is_none_or(|e| e > self.end - self.start)
        {
            let err = crate::Error::OutOfBounds {
                start: offset as u64,
                end: (offset as u64).saturating_add(8),
                len: (self.end - self.start) as u64,
            };
            return Err(Rejected::new(err, self));
        }
        let (start, end) = (self.start, self.end);
        Word::new(self.buf, start + offset).map_err(|r| {
            let (e, buf) = r.into_parts();
            Rejected::new(e, Slice { buf, start, end })
        })
    }

    /// Start of the view within the whole buffer.
    pub fn start(&self) -> usize {
        self.start
    }

    /// End of the view within the whole buffer.
    pub fn end(&self) -> usize {
        self.end
    }

    /// The whole buffer.
    pub fn get_ref(&self) -> &T {
        &self.buf
    }

    /// The whole buffer back.
    pub fn into_inner(self) -> T {
        self.buf
    }
}

impl<T: BaseBuf + std::ops::Deref<Target = [u8]>> std::ops::Deref for Slice<T> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.buf[self.start..self.end]
    }
}

impl<T: BaseBuf + std::ops::DerefMut<Target = [u8]>> std::ops::DerefMut for Slice<T> {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.buf[self.start..self.end]
    }
}

impl<T: BaseBuf> sealed::Sealed for Slice<T> {}

super::single_io_buf!(generic [T: BaseBuf] Slice<T>);

impl<T: BaseBuf> SingleBuf for Slice<T> {
    #[inline]
    fn single_len(&self) -> usize {
        self.end - self.start
    }
    fn sge(&self) -> Sge {
        let whole = self.buf.sge();
        Sge {
            addr: whole.addr + self.start as u64,
            len: (self.end - self.start) as u32,
            lkey: whole.lkey,
        }
    }
    fn pd(&self) -> PdId {
        self.buf.pd()
    }
    fn into_owned(self) -> OwnedBuf {
        OwnedBuf::new(self.buf.into_base(), self.start, self.end)
    }
    fn from_owned(buf: OwnedBuf) -> Result<Self, OwnedBuf> {
        let (base, start, end) = buf.into_base();
        match T::from_base(base) {
            Ok(buf) => Ok(Slice { buf, start, end }),
            Err(base) => Err(OwnedBuf::new(base, start, end)),
        }
    }
}

impl<T: BaseBuf + IoBufMut> IoBufMut for Slice<T> {}
