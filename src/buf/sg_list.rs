//! Several buffers as one operation's scatter/gather list.

use super::{sealed, IoBuf, IoBufMut, OwnedBufs, SingleBuf};
use crate::backend::{PdId, Sge};

/// A list of buffers that can be an operation's scatter/gather list: an
/// array `[B; N]` or a `Vec<B>` of single buffers.
pub trait BufList: sealed::Sealed + Send + 'static + Sized {
    /// The buffer type.
    type Item: SingleBuf;
    /// The buffers, in order.
    fn as_slice(&self) -> &[Self::Item];
    #[doc(hidden)]
    fn into_vec(self) -> Vec<Self::Item>;
    #[doc(hidden)]
    fn from_vec(items: Vec<Self::Item>) -> Result<Self, Vec<Self::Item>>;
}

impl<B: SingleBuf, const N: usize> sealed::Sealed for [B; N] {}
impl<B: SingleBuf, const N: usize> BufList for [B; N] {
    type Item = B;
    fn as_slice(&self) -> &[B] {
        self
    }
    fn into_vec(self) -> Vec<B> {
        Vec::from(self)
    }
    fn from_vec(items: Vec<B>) -> Result<Self, Vec<B>> {
        items.try_into()
    }
}

impl<B: SingleBuf> sealed::Sealed for Vec<B> {}
impl<B: SingleBuf> BufList for Vec<B> {
    type Item = B;
    fn as_slice(&self) -> &[B] {
        self
    }
    fn into_vec(self) -> Vec<B> {
        self
    }
    fn from_vec(items: Vec<B>) -> Result<Self, Vec<B>> {
        Ok(items)
    }
}

/// Several buffers as one operation's scatter/gather list: a send-side
/// operation gathers their bytes in order into one message, a READ or a
/// receive scatters the incoming bytes across them in order. The operation
/// owns every buffer, and its completion hands them all back. The queue
/// pair's `max_send_sge` / `max_recv_sge` (or the shared receive queue's
/// `max_sge`) bounds their number; an empty list is refused at push.
///
/// ```
/// use rdma_ring::backend::soft::SoftDevice;
/// use rdma_ring::buf::{BaseBuf, IoBuf, RegisteredBuf, SgList};
/// let pd = SoftDevice::new().alloc_pd();
/// let header = RegisteredBuf::new(&pd, b"head".to_vec()).unwrap();
/// let body = RegisteredBuf::new(&pd, vec![7u8; 100]).unwrap().slice(0..60);
/// let list = SgList::new(vec![header.slice(..), body]);
/// assert_eq!(list.bytes_len(), 64);
/// ```
#[derive(Debug)]
pub struct SgList<L> {
    list: L,
}

impl<L: BufList> SgList<L> {
    /// The buffers `list` holds, as one scatter/gather list.
    pub fn new(list: L) -> Self {
        SgList { list }
    }

    /// The buffers back.
    pub fn into_inner(self) -> L {
        self.list
    }

    /// The buffers.
    pub fn get_ref(&self) -> &L {
        &self.list
    }
}

impl<L: BufList> sealed::Sealed for SgList<L> {}

impl<L: BufList> IoBuf for SgList<L> {
    fn bytes_len(&self) -> usize {
        self.list.as_slice().iter().map(|b| b.single_len()).sum()
    }
    fn sge_count(&self) -> usize {
        self.list.as_slice().len()
    }
    fn push_sges(&self, out: &mut Vec<Sge>) {
        // No element for no bytes (see the single buffers' `push_sges`).
        out.extend(
            self.list
                .as_slice()
                .iter()
                .map(SingleBuf::sge)
                .filter(|sge| sge.len != 0),
        );
    }
    fn foreign_pd(&self, pd: PdId) -> Option<PdId> {
        self.list
            .as_slice()
            .iter()
            .map(SingleBuf::pd)
            .find(|&own| own != pd)
    }
    fn into_bufs(self) -> OwnedBufs {
        OwnedBufs::many(
            self.list
                .into_vec()
                .into_iter()
                .map(SingleBuf::into_owned)
                .collect(),
        )
    }
    fn from_bufs(bufs: OwnedBufs) -> Result<Self, OwnedBufs> {
        let owned = bufs.into_vec();
        let mut items = Vec::with_capacity(owned.len());
        let mut rest = owned.into_iter();
        for buf in rest.by_ref() {
            match L::Item::from_owned(buf) {
                Ok(item) => items.push(item),
                Err(buf) => {
                    // Not this type: give everything back, as it was.
                    let mut back: Vec<_> = items.into_iter().map(SingleBuf::into_owned).collect();
                    back.push(buf);
                    back.extend(rest);
                    return Err(OwnedBufs::many(back));
                }
            }
        }
        L::from_vec(items).map(SgList::new).map_err(|items| {
            OwnedBufs::many(items.into_iter().map(SingleBuf::into_owned).collect())
        })
    }
}

impl<L: BufList> IoBufMut for SgList<L> where L::Item: IoBufMut {}
