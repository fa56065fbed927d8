//! The fixed-buffer table: one registration cut into equal slots, each
//! named by a token.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::backend::{PdId, ProtectionDomain};
use crate::buf::Registration;
use crate::error::{Error, Rejected};

/// Slots start on this boundary, so each can hold aligned atomic words.
const SLOT_ALIGN: usize = 64;

/// Tells tables apart, so a token of one is refused by another: 64 bits,
/// never reused (a wrapped counter would give two live tables one
/// identity, and so two tokens one slot).
static NEXT_TABLE: AtomicU64 = AtomicU64::new(1);

fn next_table() -> u64 {
    NEXT_TABLE
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_add(1))
        .expect("2^64 fixed-buffer tables made in one process")
}

/// A table of equal-size slots in one registration, the buffers of a
/// [`FixedRing`](super::FixedRing) (io_uring's fixed buffers): an
/// operation names its slot by a [`FixedBuf`] token rather than carrying a
/// buffer, which is what makes the fixed path lean.
///
/// The memory has local rights only (no peer can reach it). Its bytes are
/// reachable only through a token: [`take`](Self::take) hands out each
/// free slot's token once, pushing an operation moves the token into the
/// ring, and its completion hands it back. So while the NIC may touch a
/// slot, nobody else can.
///
/// ```
/// use rdma_ring::backend::soft::SoftDevice;
/// use rdma_ring::fixed::FixedBufs;
///
/// let pd = SoftDevice::new().alloc_pd();
/// let mut bufs = FixedBufs::new(&pd, 4, 100).unwrap();
/// assert_eq!((bufs.slots(), bufs.slot_len(), bufs.free()), (4, 100, 4));
/// let mut a = bufs.take().unwrap();
/// bufs.bytes_mut(&mut a)[..5].copy_from_slice(b"hello");
/// assert_eq!(&bufs.bytes(&a)[..5], b"hello");
/// bufs.put(a).unwrap();
/// assert_eq!(bufs.free(), 4);
/// ```
pub struct FixedBufs {
    /// `None` only once leaked (the device may still reach the memory).
    registration: Option<Registration>,
    base: *mut u8,
    stride: usize,
    slot_len: u32,
    slots: u32,
    lkey: u32,
    pd: PdId,
    table: u64,
    free: Vec<u32>,
}

// SAFETY: the table owns its registration alone; `base` points into it.
// Moving the table to another thread moves that ownership, and the slots'
// bytes are reached only through `&self`/`&mut self` together with a token.
unsafe impl Send for FixedBufs {}

/// The token of one slot of a [`FixedBufs`] table: whoever holds it alone
/// may reach the slot's bytes. Tokens cannot be made or copied, only taken
/// from their table, moved into an operation and handed back by its
/// completion. A token that is dropped takes its slot out of use for the
/// table's lifetime; give it back with [`FixedBufs::put`].
///
/// ```
/// # use rdma_ring::backend::soft::SoftDevice;
/// # use rdma_ring::fixed::FixedBufs;
/// # let pd = SoftDevice::new().alloc_pd();
/// let mut bufs = FixedBufs::new(&pd, 2, 64).unwrap();
/// let a = bufs.take().unwrap();
/// let b = bufs.take().unwrap();
/// assert_ne!(a.index(), b.index());
/// assert!(bufs.take().is_none()); // both slots are out
/// ```
#[must_use = "a dropped token takes its slot out of use; put it back"]
#[derive(Debug, PartialEq, Eq)]
pub struct FixedBuf {
    pub(super) table: u64,
    pub(super) index: u32,
}

impl FixedBuf {
    /// The slot's index in its table.
    ///
    /// ```
    /// # use rdma_ring::backend::soft::SoftDevice;
    /// # use rdma_ring::fixed::FixedBufs;
    /// # let pd = SoftDevice::new().alloc_pd();
    /// let mut bufs = FixedBufs::new(&pd, 1, 64).unwrap();
    /// assert_eq!(bufs.take().unwrap().index(), 0);
    /// ```
    pub fn index(&self) -> u32 {
        self.index
    }

    /// The token again, when the ring hands the slot back.
    #[inline]
    pub(super) fn from_raw(table: u64, index: u32) -> Self {
        FixedBuf { table, index }
    }
}

impl FixedBufs {
    /// Registers `slots` slots of `slot_len` bytes each (zeroed, local
    /// rights), each starting on a 64-byte boundary.
    ///
    /// Errors: no slots, an empty or over-2^31-byte slot, a table too big
    /// for memory, or a failed registration.
    ///
    /// ```
    /// # use rdma_ring::backend::soft::SoftDevice;
    /// # use rdma_ring::fixed::FixedBufs;
    /// # let pd = SoftDevice::new().alloc_pd();
    /// assert!(FixedBufs::new(&pd, 0, 64).is_err());
    /// assert!(FixedBufs::new(&pd, 8, 0).is_err());
    /// assert!(FixedBufs::new(&pd, 8, 4096).is_ok());
    /// ```
    pub fn new(pd: &dyn ProtectionDomain, slots: u32, slot_len: u32) -> Result<Self, Error> {
        if slots == 0 || slot_len == 0 {
            return Err(Error::EmptyBuffer);
        }
        if slot_len > 1 << 31 {
            return Err(Error::TooLong {
                len: slot_len as usize,
                max: crate::op::MAX_MESSAGE_LEN,
            });
        }
        let stride = (slot_len as usize).next_multiple_of(SLOT_ALIGN);
        let total = stride
            .checked_mul(slots as usize)
            .ok_or(Error::OutOfMemory(usize::MAX))?;
        let registration = Registration::zeroed_aligned(pd, total, SLOT_ALIGN)?;
        Ok(FixedBufs {
            base: registration.ptr(),
            lkey: registration.lkey(),
            pd: registration.pd(),
            registration: Some(registration),
            stride,
            slot_len,
            slots,
            table: next_table(),
            // Popped from the end: slot 0 goes out first.
            free: (0..slots).rev().collect(),
        })
    }

    /// Takes a free slot's token, or `None` if every slot is out.
    ///
    /// ```
    /// # use rdma_ring::backend::soft::SoftDevice;
    /// # use rdma_ring::fixed::FixedBufs;
    /// # let pd = SoftDevice::new().alloc_pd();
    /// let mut bufs = FixedBufs::new(&pd, 1, 64).unwrap();
    /// let slot = bufs.take().unwrap();
    /// assert!(bufs.take().is_none());
    /// # bufs.put(slot).unwrap();
    /// ```
    #[inline]
    pub fn take(&mut self) -> Option<FixedBuf> {
        let index = self.free.pop()?;
        Some(FixedBuf {
            table: self.table,
            index,
        })
    }

    /// Gives a slot back to the table. A token of another table is
    /// refused and handed back.
    ///
    /// ```
    /// # use rdma_ring::backend::soft::SoftDevice;
    /// # use rdma_ring::fixed::FixedBufs;
    /// # let pd = SoftDevice::new().alloc_pd();
    /// let (mut a, mut b) = (FixedBufs::new(&pd, 1, 8).unwrap(), FixedBufs::new(&pd, 1, 8).unwrap());
    /// let token = a.take().unwrap();
    /// let token = b.put(token).unwrap_err().into_parts().1; // refused, handed back
    /// a.put(token).unwrap();
    /// ```
    pub fn put(&mut self, buf: FixedBuf) -> Result<(), Rejected<FixedBuf>> {
        if buf.table != self.table {
            return Err(Rejected::new(Error::ForeignFixedBuf, buf));
        }
        self.free.push(buf.index);
        Ok(())
    }

    /// The slot's bytes, all [`slot_len`](Self::slot_len) of them.
    ///
    /// # Panics
    ///
    /// If the token belongs to another table.
    ///
    /// ```
    /// # use rdma_ring::backend::soft::SoftDevice;
    /// # use rdma_ring::fixed::FixedBufs;
    /// # let pd = SoftDevice::new().alloc_pd();
    /// let mut bufs = FixedBufs::new(&pd, 1, 16).unwrap();
    /// let slot = bufs.take().unwrap();
    /// assert_eq!(bufs.bytes(&slot), &[0u8; 16]); // zeroed at registration
    /// ```
    #[inline]
    pub fn bytes<'a>(&'a self, buf: &'a FixedBuf) -> &'a [u8] {
        let start = self.slot_start(buf);
        // SAFETY: `start` is the slot's first byte inside the live
        // registration and the slot holds `slot_len` bytes. The NIC does
        // not touch the slot: its token is here, not in an operation, and
        // the token stays borrowed (shared) for the slice's life, which
        // rules out `bytes_mut` on it and moving it into an operation.
        unsafe { std::slice::from_raw_parts(start, self.slot_len as usize) }
    }

    /// The slot's bytes, to write. Two tokens are two slots, so several
    /// slots may be borrowed at once (copy between them, say).
    ///
    /// # Panics
    ///
    /// If the token belongs to another table.
    ///
    /// ```
    /// # use rdma_ring::backend::soft::SoftDevice;
    /// # use rdma_ring::fixed::FixedBufs;
    /// # let pd = SoftDevice::new().alloc_pd();
    /// let mut bufs = FixedBufs::new(&pd, 2, 8).unwrap();
    /// let (mut a, b) = (bufs.take().unwrap(), bufs.take().unwrap());
    /// bufs.bytes_mut(&mut a).copy_from_slice(bufs.bytes(&b));
    /// ```
    #[inline]
    #[allow(clippy::mut_from_ref)]
    pub fn bytes_mut<'a>(&'a self, buf: &'a mut FixedBuf) -> &'a mut [u8] {
        let start = self.slot_start(buf);
        // SAFETY: as in `bytes`; and the token is borrowed mutably for the
        // slice's life, so no other borrow of this slot exists (tokens are
        // unique per slot), while other slots are disjoint ranges.
        unsafe { std::slice::from_raw_parts_mut(start, self.slot_len as usize) }
    }

    #[inline]
    fn slot_start(&self, buf: &FixedBuf) -> *mut u8 {
        assert!(
            buf.table == self.table,
            "a fixed buffer token of another table"
        );
        // Tokens are made only by `take` (and handed back by the ring), so
        // this holds; it is checked because the slice below relies on it.
        assert!(buf.index < self.slots, "a slot index out of the table");
        self.base.wrapping_add(buf.index as usize * self.stride)
    }

    /// The address and key of a slot, to post it.
    #[inline]
    pub(super) fn sge_of(&self, index: u32, len: u32) -> crate::backend::Sge {
        // The ring checked the token's table, whose tokens are all below
        // `slots`.
        debug_assert!(index < self.slots);
        crate::backend::Sge {
            addr: self.base as u64 + index as u64 * self.stride as u64,
            len,
            lkey: self.lkey,
        }
    }

    /// The table's identity, which its tokens carry.
    #[inline]
    pub(super) fn table(&self) -> u64 {
        self.table
    }

    /// Never frees the memory: the device may still reach it.
    pub(super) fn leak(&mut self) {
        if let Some(registration) = self.registration.take() {
            crate::leak::record_region(registration.len());
            std::mem::forget(registration);
        }
    }

    /// Bytes per slot.
    ///
    /// ```
    /// # use rdma_ring::backend::soft::SoftDevice;
    /// # use rdma_ring::fixed::FixedBufs;
    /// # let pd = SoftDevice::new().alloc_pd();
    /// assert_eq!(FixedBufs::new(&pd, 2, 100).unwrap().slot_len(), 100);
    /// ```
    pub fn slot_len(&self) -> u32 {
        self.slot_len
    }

    /// Slots in the table.
    ///
    /// ```
    /// # use rdma_ring::backend::soft::SoftDevice;
    /// # use rdma_ring::fixed::FixedBufs;
    /// # let pd = SoftDevice::new().alloc_pd();
    /// assert_eq!(FixedBufs::new(&pd, 2, 100).unwrap().slots(), 2);
    /// ```
    pub fn slots(&self) -> u32 {
        self.slots
    }

    /// Slots whose token is in the table (not taken).
    ///
    /// ```
    /// # use rdma_ring::backend::soft::SoftDevice;
    /// # use rdma_ring::fixed::FixedBufs;
    /// # let pd = SoftDevice::new().alloc_pd();
    /// let mut bufs = FixedBufs::new(&pd, 2, 8).unwrap();
    /// let _slot = bufs.take();
    /// assert_eq!(bufs.free(), 1);
    /// ```
    pub fn free(&self) -> u32 {
        self.free.len() as u32
    }

    /// The protection domain the slots are registered in.
    ///
    /// ```
    /// # use rdma_ring::backend::soft::SoftDevice;
    /// # use rdma_ring::fixed::FixedBufs;
    /// # let pd = SoftDevice::new().alloc_pd();
    /// use rdma_ring::backend::ProtectionDomain;
    /// assert_eq!(FixedBufs::new(&pd, 1, 8).unwrap().pd(), pd.id());
    /// ```
    pub fn pd(&self) -> PdId {
        self.pd
    }
}

impl fmt::Debug for FixedBufs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FixedBufs")
            .field("slots", &self.slots)
            .field("slot_len", &self.slot_len)
            .field("free", &self.free.len())
            .finish()
    }
}
