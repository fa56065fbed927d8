//! Exactly 8 aligned bytes of a whole buffer: an atomic's local target.

use super::{sealed, BaseBuf, IoBufMut, OwnedBuf, SingleBuf};
use crate::backend::{PdId, Sge};
use crate::error::{Error, Rejected};

/// The 8 bytes at an 8-aligned offset of a writable buffer: the local
/// target of [`CompareSwap`](crate::op::CompareSwap) and
/// [`FetchAdd`](crate::op::FetchAdd), which write the remote word's old
/// value here. The type guarantees size and alignment, so an atomic cannot
/// be built with anything else.
///
/// ```
/// use rdma_ring::backend::soft::SoftDevice;
/// use rdma_ring::buf::{BaseBuf, RegisteredBuf};
/// let pd = SoftDevice::new().alloc_pd();
/// let buf = RegisteredBuf::new(&pd, Box::new(0u64)).unwrap();
/// let mut word = buf.word(0).unwrap();
/// word.set(42);
/// assert_eq!(word.get(), 42);
/// ```
#[derive(Debug)]
pub struct Word<T> {
    buf: T,
    offset: usize,
}

impl<T: BaseBuf + IoBufMut> Word<T> {
    pub(crate) fn new(buf: T, offset: usize) -> Result<Self, Rejected<T>> {
        let len = buf.single_len();
        if offset.checked_add(8).is_none_or(|end| end > len) {
            let err = Error::OutOfBounds {
                start: offset as u64,
                end: (offset as u64).saturating_add(8),
                len: len as u64,
            };
            return Err(Rejected::new(err, buf));
        }
        let addr = buf.sge().addr + offset as u64;
        if addr % 8 != 0 {
            return Err(Rejected::new(Error::Misaligned { addr }, buf));
        }
        Ok(Word { buf, offset })
    }

    /// Offset of the word within the whole buffer.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// The whole buffer back.
    pub fn into_inner(self) -> T {
        self.buf
    }
}

impl<T: BaseBuf + IoBufMut + std::ops::Deref<Target = [u8]>> Word<T> {
    /// The word's value, in host byte order (the order RDMA atomics use on
    /// the host that ran them).
    pub fn get(&self) -> u64 {
        let bytes: [u8; 8] = self.buf[self.offset..self.offset + 8]
            .try_into()
            .expect("a word is 8 bytes");
        u64::from_ne_bytes(bytes)
    }
}

impl<T: BaseBuf + IoBufMut + std::ops::DerefMut<Target = [u8]>> Word<T> {
    /// Sets the word's value, in host byte order.
    pub fn set(&mut self, value: u64) {
        let offset = self.offset;
        self.buf[offset..offset + 8].copy_from_slice(&value.to_ne_bytes());
    }
}

impl<T: BaseBuf + IoBufMut> sealed::Sealed for Word<T> {}

super::single_io_buf!(generic [T: BaseBuf + IoBufMut] Word<T>);

impl<T: BaseBuf + IoBufMut> SingleBuf for Word<T> {
    fn single_len(&self) -> usize {
        8
    }
    fn sge(&self) -> Sge {
        let whole = self.buf.sge();
        Sge {
            addr: whole.addr + self.offset as u64,
            len: 8,
            lkey: whole.lkey,
        }
    }
    fn pd(&self) -> PdId {
        self.buf.pd()
    }
    fn into_owned(self) -> OwnedBuf {
        OwnedBuf::new(self.buf.into_base(), self.offset, self.offset + 8)
    }
    fn from_owned(buf: OwnedBuf) -> Result<Self, OwnedBuf> {
        if buf.single_len() != 8 || buf.sge().addr % 8 != 0 {
            return Err(buf);
        }
        let (base, start, end) = buf.into_base();
        match T::from_base(base) {
            Ok(buf) => Ok(Word { buf, offset: start }),
            Err(base) => Err(OwnedBuf::new(base, start, end)),
        }
    }
}

impl<T: BaseBuf + IoBufMut> IoBufMut for Word<T> {}
