//! Memory exposed to a peer.

use std::fmt;

use super::{RemoteAccess, RemoteSlice, StableBufMut};
use crate::backend::{Access, MemoryRegion, ProtectionDomain};
use crate::error::{Error, Rejected};

/// Memory you own, exposed so that a peer may read, write or run atomics on
/// it, with exactly the rights you grant. Because a peer may write it at any
/// moment, its bytes are reachable only through `unsafe`
/// ([`ExposedBuf::as_slice`]) or by taking the memory back with
/// [`ExposedBuf::into_inner`], which revokes the peer's access first.
///
/// ```
/// use rdma_ring::backend::soft::SoftDevice;
/// use rdma_ring::buf::{ExposedBuf, RemoteAccess};
/// let pd = SoftDevice::new().alloc_pd();
/// let exposed = ExposedBuf::new(&pd, vec![0u8; 4096], RemoteAccess::READ).unwrap();
/// let remote = exposed.remote(); // send remote.encode() to the peer
/// assert_eq!(remote.len(), 4096);
/// assert_eq!(remote.rights(), RemoteAccess::READ);
/// let memory: Vec<u8> = exposed.into_inner(); // the peer's rkey is dead now
/// assert_eq!(memory.len(), 4096);
/// ```
pub struct ExposedBuf<M: StableBufMut> {
    // Field order is load-bearing: revoke access before the memory is freed.
    region: Box<dyn MemoryRegion>,
    mem: M,
    ptr: *mut u8,
    len: usize,
    rights: RemoteAccess,
}

// SAFETY: `ptr` points into `mem`, owned by this value (`M: Send`).
unsafe impl<M: StableBufMut> Send for ExposedBuf<M> {}
// SAFETY: safe methods on `&self` do not touch the bytes at all.
unsafe impl<M: StableBufMut> Sync for ExposedBuf<M> {}

impl<M: StableBufMut> ExposedBuf<M> {
    /// Registers `mem` in `pd` with exactly `rights` for peers (plus the
    /// local write right verbs require alongside remote write and atomics).
    pub fn new(
        pd: &dyn ProtectionDomain,
        mut mem: M,
        rights: RemoteAccess,
    ) -> Result<Self, Rejected<M>> {
        let len = mem.stable_len();
        if len == 0 {
            return Err(Rejected::new(Error::EmptyBuffer, mem));
        }
        let mut access = Access::empty();
        if rights.contains(RemoteAccess::READ) {
            access |= Access::REMOTE_READ;
        }
        if rights.contains(RemoteAccess::WRITE) {
            access |= Access::REMOTE_WRITE | Access::LOCAL_WRITE;
        }
        if rights.contains(RemoteAccess::ATOMIC) {
            access |= Access::REMOTE_ATOMIC | Access::LOCAL_WRITE;
        }
        let ptr = mem.stable_mut_ptr();
        // SAFETY: `mem` moves into the returned value and is freed only after
        // the region is dropped (field order); its bytes do not move. Safe
        // code never forms references to the bytes while they are exposed.
        match unsafe { pd.register_raw(ptr, len, access) } {
            Ok(region) => Ok(ExposedBuf {
                region,
                mem,
                ptr,
                len,
                rights,
            }),
            Err(e) => Err(Rejected::new(e, mem)),
        }
    }

    /// The descriptor a peer needs: address, length, rkey and rights.
    pub fn remote(&self) -> RemoteSlice {
        RemoteSlice::new(
            self.ptr as u64,
            self.len as u64,
            self.region.rkey(),
            self.rights,
        )
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer is empty (never, registration refuses that).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes, while exposed.
    ///
    /// # Safety
    ///
    /// No peer may write them (RDMA WRITE or atomic) while the returned
    /// reference lives; arrange that with your protocol (e.g. the peer
    /// sends a message after its last write).
    pub unsafe fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` is valid for `len` bytes while `mem` lives; the caller
        // promises no concurrent device writes.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// The bytes, for writing, while exposed.
    ///
    /// # Safety
    ///
    /// No peer may read or write them while the returned reference lives.
    pub unsafe fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as for `as_slice`, with `&mut self` excluding local aliases
        // and the caller excluding peers.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    /// Revokes the peer's access (deregisters) and gives the memory back.
    pub fn into_inner(self) -> M {
        let ExposedBuf { region, mem, .. } = self;
        drop(region);
        mem
    }
}

impl<M: StableBufMut> fmt::Debug for ExposedBuf<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExposedBuf")
            .field("remote", &self.remote())
            .finish()
    }
}
