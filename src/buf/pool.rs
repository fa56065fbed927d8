//! One registration cut into fixed-size chunks.

use std::fmt;
use std::sync::{Arc, Mutex};

use super::registered::impl_base_buf;
use super::registration::Registration;
use super::{sealed, Base, BaseBuf, IoBufMut, OwnedBuf, SingleBuf};
use crate::backend::{PdId, ProtectionDomain, Sge};
use crate::error::Error;

/// Chunks start on this boundary, so every chunk can hold aligned atomic
/// words and no two chunks share a cache line.
const CHUNK_ALIGN: usize = 64;

/// A pool of equal, pre-registered chunks: register once, then take and
/// return chunks with no registration per operation. A chunk goes back to
/// the pool when it is dropped.
///
/// ```
/// use rdma_ring::backend::soft::SoftDevice;
/// use rdma_ring::buf::BufferPool;
/// let pd = SoftDevice::new().alloc_pd();
/// let pool = BufferPool::new(&pd, 4096, 8).unwrap();
/// let mut chunk = pool.take().unwrap();
/// chunk[0] = 1;
/// assert_eq!(pool.available(), 7);
/// drop(chunk);
/// assert_eq!(pool.available(), 8);
/// ```
#[derive(Clone)]
pub struct BufferPool {
    shared: Arc<PoolShared>,
}

struct PoolShared {
    /// The pool's memory (a `Vec<u64>`), deregistered before it is freed.
    _registration: Registration,
    base: *mut u8,
    lkey: u32,
    pd: PdId,
    chunk_size: usize,
    stride: usize,
    count: usize,
    free: Mutex<Vec<u32>>,
}

// SAFETY: `base` points into the registered memory, owned by this value; each chunk's
// bytes are reachable only through the one `PoolChunk` holding its index
// (the free list hands each index out once), so sharing the pool between
// threads never shares a chunk's bytes.
unsafe impl Send for PoolShared {}
// SAFETY: as above; the free list is behind a mutex.
unsafe impl Sync for PoolShared {}

impl BufferPool {
    /// Registers `count` chunks of `chunk_size` bytes in `pd`, with local
    /// write rights only.
    pub fn new(pd: &dyn ProtectionDomain, chunk_size: usize, count: usize) -> Result<Self, Error> {
        if chunk_size == 0 || count == 0 {
            return Err(Error::EmptyBuffer);
        }
        let too_large = || Error::PoolTooLarge { chunk_size, count };
        if u32::try_from(count).is_err() {
            return Err(too_large());
        }
        let stride = chunk_size
            .checked_next_multiple_of(CHUNK_ALIGN)
            .ok_or_else(too_large)?;
        let total = stride.checked_mul(count).ok_or_else(too_large)?;
        if total.checked_add(CHUNK_ALIGN).is_none() {
            return Err(too_large());
        }
        let registration = Registration::zeroed_aligned(pd, total, CHUNK_ALIGN)?;
        Ok(BufferPool {
            shared: Arc::new(PoolShared {
                lkey: registration.lkey(),
                pd: registration.pd(),
                base: registration.ptr(),
                _registration: registration,
                chunk_size,
                stride,
                count,
                free: Mutex::new((0..count as u32).rev().collect()),
            }),
        })
    }

    /// Takes a free chunk; fails with [`Error::PoolExhausted`] when all are in use.
    pub fn take(&self) -> Result<PoolChunk, Error> {
        let index = self
            .shared
            .free
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop()
            .ok_or(Error::PoolExhausted(self.shared.count))?;
        Ok(PoolChunk {
            shared: Arc::clone(&self.shared),
            index,
        })
    }

    /// Returns a chunk to the pool (the same as dropping it).
    pub fn put(&self, chunk: PoolChunk) {
        drop(chunk);
    }

    /// Chunks free now.
    pub fn available(&self) -> usize {
        self.shared
            .free
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len()
    }

    /// Bytes per chunk.
    pub fn chunk_size(&self) -> usize {
        self.shared.chunk_size
    }

    /// Chunks in the pool.
    pub fn capacity(&self) -> usize {
        self.shared.count
    }
}

impl fmt::Debug for BufferPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BufferPool")
            .field("chunk_size", &self.shared.chunk_size)
            .field("capacity", &self.shared.count)
            .field("available", &self.available())
            .finish()
    }
}

/// One chunk of a [`BufferPool`], 64-byte aligned. Dropping it returns it
/// to the pool; the pool's memory lives as long as any chunk does.
pub struct PoolChunk {
    shared: Arc<PoolShared>,
    index: u32,
}

impl PoolChunk {
    #[inline]
    fn ptr(&self) -> *mut u8 {
        self.shared
            .base
            .wrapping_add(self.index as usize * self.shared.stride)
    }

    /// Which chunk of the pool this is.
    pub fn index(&self) -> usize {
        self.index as usize
    }

    #[inline]
    fn base_lkey(&self) -> u32 {
        self.shared.lkey
    }

    #[inline]
    fn base_pd(&self) -> PdId {
        self.shared.pd
    }
}

impl Drop for PoolChunk {
    fn drop(&mut self) {
        self.shared
            .free
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(self.index);
    }
}

impl std::ops::Deref for PoolChunk {
    type Target = [u8];
    #[inline]
    fn deref(&self) -> &[u8] {
        // SAFETY: the chunk lies inside the pool's live memory, this value is
        // the only holder of its index, and the device writes it only while
        // an operation owns this value.
        unsafe { std::slice::from_raw_parts(self.ptr(), self.shared.chunk_size) }
    }
}

impl std::ops::DerefMut for PoolChunk {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`; `&mut self` makes this the only access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr(), self.shared.chunk_size) }
    }
}

impl fmt::Debug for PoolChunk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PoolChunk")
            .field("index", &self.index)
            .field("len", &self.shared.chunk_size)
            .finish()
    }
}

impl_base_buf!(PoolChunk, Chunk);
impl IoBufMut for PoolChunk {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::soft::SoftDevice;

    #[test]
    fn chunks_are_aligned_and_disjoint() {
        let pd = SoftDevice::new().alloc_pd();
        let pool = BufferPool::new(&pd, 100, 4).unwrap();
        let chunks: Vec<_> = (0..4).map(|_| pool.take().unwrap()).collect();
        for c in &chunks {
            assert_eq!(c.as_ptr() as usize % CHUNK_ALIGN, 0);
            assert_eq!(c.len(), 100);
        }
        let mut starts: Vec<_> = chunks.iter().map(|c| c.as_ptr() as usize).collect();
        starts.sort();
        starts.dedup();
        assert_eq!(starts.len(), 4);
        assert!(matches!(pool.take(), Err(Error::PoolExhausted(4))));
    }

    #[test]
    fn memory_outlives_the_pool_handle() {
        let pd = SoftDevice::new().alloc_pd();
        let pool = BufferPool::new(&pd, 16, 1).unwrap();
        let mut chunk = pool.take().unwrap();
        drop(pool);
        chunk.fill(9);
        assert!(chunk.iter().all(|&b| b == 9));
    }
}
