//! Registered memory of any size: arenas registered once, cut into
//! regions on demand.

use std::alloc::Layout;
use std::fmt;
use std::ops::{Bound, RangeBounds};
use std::sync::{Arc, Mutex};

use offset_allocator::{Allocation, Allocator};

use super::registered::impl_base_buf;
use super::registration::Registration;
use super::{sealed, Base, BaseBuf, IoBufMut, OwnedBuf, SingleBuf};
use crate::backend::{PdId, ProtectionDomain, Sge};
use crate::error::Error;

/// Arenas are handed out in units of this many bytes, so every region
/// starts on a cache line (and can hold aligned atomic words).
const UNIT: usize = 64;

/// What a region for `layout` takes from the arenas: whole units, with the
/// slack an alignment beyond a unit needs (`None` past `usize`).
pub(crate) fn footprint(layout: Layout) -> Option<usize> {
    let slack = layout.align().saturating_sub(UNIT);
    let bytes = layout.size().checked_add(slack)?;
    bytes.div_ceil(UNIT).checked_mul(UNIT)
}

/// Allocations one arena keeps track of at most.
const MAX_ALLOCS_PER_ARENA: u32 = 64 * 1024;

/// `units` rounded up to a size the allocator's bins hold exactly (at most
/// four significant bits): it rounds requests up to a bin and files free
/// space down to one, so an arena of another size could not serve a
/// request of its own size.
fn bin_units(units: u32) -> Option<u32> {
    let shift = (u32::BITS - units.leading_zeros()).saturating_sub(4);
    let step = 1u32 << shift;
    units.checked_add(step - 1).map(|u| u & !(step - 1))
}

/// Registered memory of any size, with no registration per allocation:
/// the allocator registers arenas (local write rights only) and cuts
/// [`Region`]s out of them; when none has room it registers another
/// (sized for the request if that is larger), up to a limit. A region
/// goes back to its arena when dropped; arenas live as long as the
/// allocator or any of its regions.
///
/// The bookkeeping inside each arena is the `offset-allocator` crate (a
/// port of Sebastian Aaltonen's O(1) two-level bitmap allocator): constant
/// time allocation and free with bounded fragmentation, safe Rust, no
/// allocation per call — where a hand-written first-fit list would be
/// linear in the number of free ranges.
///
/// ```
/// use std::alloc::Layout;
/// use std::sync::Arc;
/// use rdma_ring::backend::soft::SoftDevice;
/// use rdma_ring::buf::RegionAllocator;
///
/// let pd = Arc::new(SoftDevice::new().alloc_pd());
/// let regions = RegionAllocator::new(pd, 1 << 20).unwrap();
/// let mut a = regions.alloc(Layout::from_size_align(1000, 8).unwrap()).unwrap();
/// a[..5].copy_from_slice(b"hello");
/// let zeroed = regions.alloc_zeroed(Layout::new::<[u64; 512]>()).unwrap();
/// assert!(zeroed.iter().all(|&b| b == 0));
/// assert_eq!(regions.arenas(), 1); // both from the first arena
/// ```
#[derive(Clone)]
pub struct RegionAllocator {
    shared: Arc<AllocShared>,
}

struct AllocShared {
    pd: Arc<dyn ProtectionDomain>,
    arena_bytes: usize,
    max_bytes: usize,
    arenas: Mutex<Arenas>,
}

#[derive(Default)]
struct Arenas {
    list: Vec<Arena>,
    registered: usize,
}

struct Arena {
    /// The arena's memory (a `Vec<u64>`), deregistered before it is freed.
    _registration: Registration,
    base: *mut u8,
    lkey: u32,
    pd: PdId,
    allocator: Allocator,
    largest_free: u32,
}

// SAFETY: `base` points into the arena's registered memory, owned by the
// registration; each region's bytes are reachable only through the one
// `Region` holding its allocation (the arena's allocator hands each range
// out once), so sharing arenas between threads never shares a region's
// bytes. The allocators are behind the mutex.
unsafe impl Send for Arenas {}

impl Arena {
    fn register(pd: &dyn ProtectionDomain, bytes: usize) -> Result<Arena, Error> {
        let units32 = u32::try_from(bytes.div_ceil(UNIT))
            .ok()
            .and_then(bin_units)
            .ok_or(Error::OutOfMemory(bytes))?;
        let total = units32 as usize * UNIT;
        let registration = Registration::zeroed_aligned(pd, total, UNIT)?;
        Ok(Arena {
            lkey: registration.lkey(),
            pd: registration.pd(),
            base: registration.ptr(),
            _registration: registration,
            // An arena never holds more regions than units.
            allocator: Allocator::with_max_allocs(
                units32,
                MAX_ALLOCS_PER_ARENA.min(units32.saturating_add(2)),
            ),
            largest_free: units32,
        })
    }

    /// Cuts `units` out of the arena, if it has room.
    fn allocate(&mut self, units: u32) -> Option<Allocation> {
        if units > self.largest_free {
            return None;
        }
        let allocation = self.allocator.allocate(units);
        self.largest_free = self.allocator.storage_report().largest_free_region;
        allocation
    }

    fn free(&mut self, allocation: Allocation) {
        self.allocator.free(allocation);
        self.largest_free = self.allocator.storage_report().largest_free_region;
    }
}

impl RegionAllocator {
    /// An allocator registering arenas of `arena_bytes` in `pd` (the
    /// first one now), with no limit on how many.
    pub fn new(pd: Arc<dyn ProtectionDomain>, arena_bytes: usize) -> Result<Self, Error> {
        RegionAllocator::with_limit(pd, arena_bytes, usize::MAX)
    }

    /// Like [`new`](Self::new), registering at most `max_bytes` in all;
    /// beyond, allocations fail with [`Error::OutOfMemory`].
    pub fn with_limit(
        pd: Arc<dyn ProtectionDomain>,
        arena_bytes: usize,
        max_bytes: usize,
    ) -> Result<Self, Error> {
        if arena_bytes == 0 {
            return Err(Error::EmptyBuffer);
        }
        let arena_bytes = arena_bytes
            .checked_next_multiple_of(UNIT)
            .and_then(|b| u32::try_from(b / UNIT).ok())
            .and_then(bin_units)
            .map(|units| units as usize * UNIT)
            .ok_or(Error::OutOfMemory(arena_bytes))?;
        if arena_bytes > max_bytes {
            return Err(Error::OutOfMemory(arena_bytes));
        }
        let first = Arena::register(&*pd, arena_bytes)?;
        Ok(RegionAllocator {
            shared: Arc::new(AllocShared {
                pd,
                arena_bytes,
                max_bytes,
                arenas: Mutex::new(Arenas {
                    list: vec![first],
                    registered: arena_bytes,
                }),
            }),
        })
    }

    /// A region for `layout`: `layout.size()` bytes at an address aligned
    /// to `layout.align()` (at least 64). Its contents are whatever the
    /// arena held (zeros, or a freed region's bytes).
    pub fn alloc(&self, layout: Layout) -> Result<Region, Error> {
        if layout.size() == 0 {
            return Err(Error::EmptyBuffer);
        }
        // No operation carries more (a scatter/gather element's length is
        // 32 bits, a message's at most 2^31 bytes): a larger region could
        // be allocated, and used by no operation whole.
        if layout.size() > crate::op::MAX_MESSAGE_LEN {
            return Err(Error::TooLong {
                len: layout.size(),
                max: crate::op::MAX_MESSAGE_LEN,
            });
        }
        let bytes = footprint(layout).ok_or(Error::OutOfMemory(usize::MAX))?;
        let units = u32::try_from(bytes / UNIT).map_err(|_| Error::OutOfMemory(bytes))?;
        let mut arenas = self.shared.arenas.lock().unwrap_or_else(|p| p.into_inner());
        let found = arenas
            .list
            .iter_mut()
            .enumerate()
            .find_map(|(i, arena)| arena.allocate(units).map(|a| (i, a)));
        let (index, allocation) = match found {
            Some(found) => found,
            None => {
                let fitted = bin_units(units).ok_or(Error::OutOfMemory(bytes))? as usize * UNIT;
                let size = self.shared.arena_bytes.max(fitted);
                let room = self.shared.max_bytes.saturating_sub(arenas.registered);
                if size > room {
                    return Err(Error::OutOfMemory(bytes));
                }
                let mut arena = Arena::register(&*self.shared.pd, size)?;
                let allocation = arena.allocate(units).ok_or(Error::OutOfMemory(bytes))?;
                arenas.registered += size;
                arenas.list.push(arena);
                (arenas.list.len() - 1, allocation)
            }
        };
        let arena = &arenas.list[index];
        let start = arena.base.wrapping_add(allocation.offset as usize * UNIT);
        let ptr = start.wrapping_add(start.align_offset(layout.align()));
        Ok(Region {
            inner: Box::new(RegionInner {
                shared: Arc::clone(&self.shared),
                arena: index,
                allocation,
                ptr,
                len: layout.size(),
                lkey: arena.lkey,
                pd: arena.pd,
            }),
        })
    }

    /// Like [`alloc`](Self::alloc), with every byte zero.
    pub fn alloc_zeroed(&self, layout: Layout) -> Result<Region, Error> {
        let mut region = self.alloc(layout)?;
        region.fill(0);
        Ok(region)
    }

    /// Arenas registered so far.
    pub fn arenas(&self) -> usize {
        self.shared
            .arenas
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .list
            .len()
    }

    /// Bytes registered so far, over all arenas.
    pub fn registered_bytes(&self) -> usize {
        self.shared
            .arenas
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .registered
    }
}

impl fmt::Debug for RegionAllocator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegionAllocator")
            .field("arena_bytes", &self.shared.arena_bytes)
            .field("arenas", &self.arenas())
            .field("registered_bytes", &self.registered_bytes())
            .finish()
    }
}

/// Registered memory cut from a [`RegionAllocator`]'s arena: a buffer any
/// operation can take, of exactly the size asked for. Dropping it returns
/// the memory to its arena.
///
/// It reads and writes as a byte slice; [`get`](Self::get) and
/// [`get_mut`](Self::get_mut) are checked sub-slices (many shared ones, or
/// one mutable one, as the borrow checker allows), and
/// [`slice`](BaseBuf::slice) is the view an operation takes.
///
/// ```
/// use std::alloc::Layout;
/// use std::sync::Arc;
/// use rdma_ring::backend::soft::SoftDevice;
/// use rdma_ring::buf::RegionAllocator;
/// let pd = Arc::new(SoftDevice::new().alloc_pd());
/// let regions = RegionAllocator::new(pd, 4096).unwrap();
/// let mut region = regions.alloc_zeroed(Layout::from_size_align(100, 8).unwrap()).unwrap();
/// region.get_mut(10..20).unwrap().fill(7);
/// assert_eq!(region.get(10..12), Some(&[7u8, 7][..]));
/// assert_eq!(region.get(90..101), None); // out of bounds
/// ```
pub struct Region {
    // One pointer wide, so that operations carrying it stay small.
    inner: Box<RegionInner>,
}

struct RegionInner {
    shared: Arc<AllocShared>,
    arena: usize,
    allocation: Allocation,
    ptr: *mut u8,
    len: usize,
    lkey: u32,
    pd: PdId,
}

// SAFETY: `ptr..ptr + len` lies in an arena that lives while `shared`
// does, and is reachable only through this region (its allocation is
// handed out once until freed in `drop`), so moving it or sharing `&Region`
// between threads shares nothing else.
unsafe impl Send for Region {}
// SAFETY: as above; `&Region` only reads.
unsafe impl Sync for Region {}

impl Region {
    /// The bytes of `range`, if it lies within the region.
    pub fn get(&self, range: impl RangeBounds<usize>) -> Option<&[u8]> {
        let (start, end) = bounds(range, self.len())?;
        Some(&self[start..end])
    }

    /// The bytes of `range`, for writing, if it lies within the region.
    pub fn get_mut(&mut self, range: impl RangeBounds<usize>) -> Option<&mut [u8]> {
        let (start, end) = bounds(range, self.len())?;
        Some(&mut self[start..end])
    }

    /// Shortens the region to its first `len` bytes (no effect if it is
    /// not longer); the whole allocation is still freed when it drops.
    ///
    /// ```
    /// # use std::alloc::Layout;
    /// # use std::sync::Arc;
    /// # use rdma_ring::backend::soft::SoftDevice;
    /// # use rdma_ring::buf::RegionAllocator;
    /// # let regions = RegionAllocator::new(Arc::new(SoftDevice::new().alloc_pd()), 4096).unwrap();
    /// let mut region = regions.alloc(Layout::array::<u8>(100).unwrap()).unwrap();
    /// region.truncate(10);
    /// assert_eq!(region.len(), 10);
    /// ```
    pub fn truncate(&mut self, len: usize) {
        self.inner.len = self.inner.len.min(len);
    }

    #[inline]
    fn base_lkey(&self) -> u32 {
        self.inner.lkey
    }

    #[inline]
    fn base_pd(&self) -> PdId {
        self.inner.pd
    }
}

/// `range` as start and end within `len`, if it fits.
fn bounds(range: impl RangeBounds<usize>, len: usize) -> Option<(usize, usize)> {
    let start = match range.start_bound() {
        Bound::Included(&s) => s,
        Bound::Excluded(&s) => s.checked_add(1)?,
        Bound::Unbounded => 0,
    };
    let end = match range.end_bound() {
        Bound::Included(&e) => e.checked_add(1)?,
        Bound::Excluded(&e) => e,
        Bound::Unbounded => len,
    };
    (start <= end && end <= len).then_some((start, end))
}

impl Drop for Region {
    fn drop(&mut self) {
        let mut arenas = self
            .inner
            .shared
            .arenas
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        arenas.list[self.inner.arena].free(self.inner.allocation);
    }
}

impl std::ops::Deref for Region {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: the region lies inside its arena's live memory, this value
        // is the only holder of its allocation, and the device writes it only
        // while an operation owns this value.
        unsafe { std::slice::from_raw_parts(self.inner.ptr, self.inner.len) }
    }
}

impl std::ops::DerefMut for Region {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`; `&mut self` makes this the only access.
        unsafe { std::slice::from_raw_parts_mut(self.inner.ptr, self.inner.len) }
    }
}

impl fmt::Debug for Region {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Region")
            .field("arena", &self.inner.arena)
            .field("len", &self.inner.len)
            .finish()
    }
}

// SAFETY: the bytes lie in an arena, outside the `Region` value, and stay
// put (the arena is never moved or freed while a region of it lives); the
// allocation is this region's alone until it drops. The length changes
// only through `truncate(&mut self)`, which nobody can call while the
// region is registered: the registration owns it and reads its length
// once.
unsafe impl super::StableBuf for Region {
    fn stable_ptr(&self) -> *const u8 {
        self.inner.ptr
    }
    fn stable_len(&self) -> usize {
        self.inner.len
    }
}

// SAFETY: as for `StableBuf`; the same address, written only through
// `&mut self`.
unsafe impl super::StableBufMut for Region {
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        self.inner.ptr
    }
}

impl_base_buf!(Region, Region);
impl IoBufMut for Region {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::soft::SoftDevice;

    fn allocator(arena: usize, limit: usize) -> RegionAllocator {
        let pd = Arc::new(SoftDevice::new().alloc_pd());
        RegionAllocator::with_limit(pd, arena, limit).unwrap()
    }

    #[test]
    fn regions_are_aligned_disjoint_and_exactly_sized() {
        let regions = allocator(1 << 16, usize::MAX);
        let mut all = Vec::new();
        for (size, align) in [(1, 1), (100, 8), (4096, 4096), (64, 64), (3000, 256)] {
            let r = regions
                .alloc(Layout::from_size_align(size, align).unwrap())
                .unwrap();
            assert_eq!(r.len(), size);
            assert_eq!(r.as_ptr() as usize % align.max(UNIT), 0, "{size}/{align}");
            all.push(r);
        }
        let mut spans: Vec<(usize, usize)> = all
            .iter()
            .map(|r| (r.as_ptr() as usize, r.as_ptr() as usize + r.len()))
            .collect();
        spans.sort();
        for pair in spans.windows(2) {
            assert!(pair[0].1 <= pair[1].0, "overlapping regions");
        }
        // Writes to one never show in another.
        for (i, r) in all.iter_mut().enumerate() {
            r.fill(i as u8 + 1);
        }
        for (i, r) in all.iter().enumerate() {
            assert!(r.iter().all(|&b| b == i as u8 + 1));
        }
    }

    #[test]
    fn freed_memory_is_reused_and_zeroed_on_request() {
        let regions = allocator(4096, 4096);
        let layout = Layout::from_size_align(4096, 64).unwrap();
        let mut a = regions.alloc(layout).unwrap();
        a.fill(0xaa);
        assert!(matches!(regions.alloc(layout), Err(Error::OutOfMemory(_))));
        drop(a);
        let b = regions.alloc_zeroed(layout).unwrap();
        assert!(b.iter().all(|&x| x == 0));
        assert_eq!(regions.arenas(), 1);
    }

    #[test]
    fn arenas_grow_up_to_the_limit_and_fit_large_requests() {
        let regions = allocator(4096, 64 * 1024);
        let page = Layout::from_size_align(4096, 64).unwrap();
        let a = regions.alloc(page).unwrap();
        let b = regions.alloc(page).unwrap();
        assert_eq!(regions.arenas(), 2);
        // Larger than an arena: an arena of its own.
        let big = regions
            .alloc(Layout::from_size_align(40 * 1024, 64).unwrap())
            .unwrap();
        assert_eq!(regions.arenas(), 3);
        assert_eq!(regions.registered_bytes(), 48 * 1024);
        // Beyond the limit: a clear error, nothing registered.
        assert!(matches!(
            regions.alloc(Layout::from_size_align(20 * 1024, 64).unwrap()),
            Err(Error::OutOfMemory(_))
        ));
        assert_eq!(regions.registered_bytes(), 48 * 1024);
        drop((a, b, big));
        assert!(regions.alloc(page).is_ok());
    }

    #[test]
    fn sizes_between_the_allocators_bins_are_served() {
        // 16385 units rounds up to a bin of 18432: an arena of exactly
        // 16385 units could not hold it.
        let regions = allocator(1 << 20, usize::MAX);
        let big = regions
            .alloc(Layout::from_size_align((1 << 20) + 64, 64).unwrap())
            .unwrap();
        assert_eq!(big.len(), (1 << 20) + 64);
        // An arena size that is no bin (79 units) still serves 74 units.
        let odd = allocator(5000, usize::MAX);
        assert!(odd.alloc(Layout::from_size_align(4700, 8).unwrap()).is_ok());
        assert_eq!(odd.arenas(), 1);
        for units in 1..5000u32 {
            let bin = bin_units(units).unwrap();
            assert!(bin >= units && (bin - units) as f64 <= units as f64 / 8.0 + 1.0);
        }
    }

    #[test]
    fn bad_layouts_are_refused() {
        let regions = allocator(4096, usize::MAX);
        assert!(matches!(
            regions.alloc(Layout::from_size_align(0, 8).unwrap()),
            Err(Error::EmptyBuffer)
        ));
        assert!(matches!(
            regions.alloc(Layout::from_size_align(1 << 40, 8).unwrap()),
            Err(Error::TooLong { .. })
        ));
        // Past the largest message, though a scatter/gather element's
        // 32 bits would hold it: no operation could use it whole.
        assert!(matches!(
            regions.alloc(Layout::from_size_align((1 << 31) + 1, 8).unwrap()),
            Err(Error::TooLong { max, .. }) if max == crate::op::MAX_MESSAGE_LEN
        ));
        assert!(
            RegionAllocator::new(Arc::new(SoftDevice::new().alloc_pd()), usize::MAX - 10).is_err()
        );
    }

    #[test]
    fn memory_outlives_the_allocator_handle() {
        let regions = allocator(4096, usize::MAX);
        let mut r = regions.alloc(Layout::new::<[u8; 128]>()).unwrap();
        drop(regions);
        r.fill(5);
        assert!(r.iter().all(|&b| b == 5));
    }
}
