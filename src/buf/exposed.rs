//! Memory exposed to a peer.

use std::fmt;
use std::marker::PhantomData;

use super::registration::Registration;
use super::{RemoteAccess, RemoteSlice, StableBufMut};
use crate::backend::{Access, ProtectionDomain};
use crate::error::Rejected;

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
/// let memory: Vec<u8> = exposed.into_inner().unwrap(); // the peer's rkey is dead now
/// assert_eq!(memory.len(), 4096);
/// ```
pub struct ExposedBuf<M: StableBufMut> {
    registration: Registration,
    rights: RemoteAccess,
    _memory: PhantomData<M>,
}

impl<M: StableBufMut> ExposedBuf<M> {
    /// Registers `mem` in `pd` with exactly `rights` for peers (plus the
    /// local write right verbs require alongside remote write and atomics).
    pub fn new(
        pd: &dyn ProtectionDomain,
        mem: M,
        rights: RemoteAccess,
    ) -> Result<Self, Rejected<M>> {
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
        // SAFETY: `StableBufMut` promises the bytes are `mem`'s own, outside
        // itself, and stay put while it lives; safe code never forms
        // references to them while they are exposed.
        let registered = unsafe {
            Registration::new(pd, mem, access, |m: &mut M| {
                (m.stable_mut_ptr(), m.stable_len())
            })
        };
        match registered {
            Ok(registration) => Ok(ExposedBuf {
                registration,
                rights,
                _memory: PhantomData,
            }),
            Err((e, mem)) => Err(Rejected::new(e, mem)),
        }
    }

    /// The descriptor a peer needs: address, length, rkey and rights.
    pub fn remote(&self) -> RemoteSlice {
        RemoteSlice::new(
            self.registration.ptr() as u64,
            self.registration.len() as u64,
            self.registration.rkey(),
            self.rights,
        )
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.registration.len()
    }

    /// Whether the buffer is empty (never, registration refuses that).
    pub fn is_empty(&self) -> bool {
        self.registration.len() == 0
    }

    /// The bytes, while exposed.
    ///
    /// # Safety
    ///
    /// No peer may write them (RDMA WRITE or atomic) while the returned
    /// reference lives; arrange that with your protocol (e.g. the peer
    /// sends a message after its last write).
    pub unsafe fn as_slice(&self) -> &[u8] {
        // SAFETY: the bytes are valid while the registration lives; the
        // caller promises no concurrent device writes.
        unsafe { std::slice::from_raw_parts(self.registration.ptr(), self.registration.len()) }
    }

    /// The bytes, for writing, while exposed.
    ///
    /// # Safety
    ///
    /// No peer may read or write them while the returned reference lives.
    pub unsafe fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as for `as_slice`, with `&mut self` excluding local aliases
        // and the caller excluding peers.
        unsafe { std::slice::from_raw_parts_mut(self.registration.ptr(), self.registration.len()) }
    }

    /// Revokes the peer's access (deregisters) and gives the memory back. If
    /// the device refuses to deregister, the buffer comes back, still
    /// exposed, and the memory is not handed out.
    pub fn into_inner(self) -> Result<M, Rejected<Self>> {
        let rights = self.rights;
        self.registration
            .into_memory::<M>()
            .map_err(|(e, registration)| {
                Rejected::new(
                    e,
                    ExposedBuf {
                        registration,
                        rights,
                        _memory: PhantomData,
                    },
                )
            })
    }
}

impl<M: StableBufMut> fmt::Debug for ExposedBuf<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExposedBuf")
            .field("remote", &self.remote())
            .finish()
    }
}
