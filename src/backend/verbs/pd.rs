//! Protection domains and memory registration over verbs.

use std::sync::Arc;

use rdma_sys::{ibv_mr, ibv_pd};

use super::device::{last_error, DeviceInner};
use crate::backend::{Access, MemoryRegion, PdId, ProtectionDomain};
use crate::error::Error;

pub(super) struct PdInner {
    pub(super) dev: Arc<DeviceInner>,
    pub(super) pd: *mut ibv_pd,
    pub(super) id: PdId,
}

// SAFETY: libibverbs PDs are thread-safe; the pointer is owned by this value
// and freed once, in `Drop`.
unsafe impl Send for PdInner {}
// SAFETY: as above.
unsafe impl Sync for PdInner {}

impl Drop for PdInner {
    fn drop(&mut self) {
        // SAFETY: every MR and QP of this PD holds an `Arc` of this value, so
        // they are gone; the PD is freed exactly once.
        unsafe { rdma_sys::ibv_dealloc_pd(self.pd) };
    }
}

/// A protection domain on a verbs device.
#[derive(Clone)]
pub struct VerbsPd {
    pub(super) inner: Arc<PdInner>,
}

impl std::fmt::Debug for VerbsPd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsPd")
            .field("id", &self.inner.id)
            .finish()
    }
}

impl VerbsPd {
    pub(super) fn new(dev: Arc<DeviceInner>) -> Result<Self, Error> {
        // SAFETY: the context is open while `dev` lives.
        let pd = unsafe { rdma_sys::ibv_alloc_pd(dev.ctx) };
        if pd.is_null() {
            return Err(last_error("ibv_alloc_pd"));
        }
        Ok(VerbsPd {
            inner: Arc::new(PdInner {
                dev,
                pd,
                id: PdId::fresh(),
            }),
        })
    }
}

impl ProtectionDomain for VerbsPd {
    fn id(&self) -> PdId {
        self.inner.id
    }

    unsafe fn register_raw(
        &self,
        addr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<Box<dyn MemoryRegion>, Error> {
        // SAFETY: the caller keeps the memory valid until the region drops
        // (this function's contract); the PD is live while `self` is.
        let mr =
            unsafe { rdma_sys::ibv_reg_mr(self.inner.pd, addr.cast(), len, access.bits() as i32) };
        if mr.is_null() {
            return Err(last_error("ibv_reg_mr"));
        }
        Ok(Box::new(VerbsMr {
            _pd: Arc::clone(&self.inner),
            mr,
            id: self.inner.id,
        }))
    }
}

struct VerbsMr {
    _pd: Arc<PdInner>,
    mr: *mut ibv_mr,
    id: PdId,
}

// SAFETY: an MR handle is used only to read its keys and to deregister it
// once; both are thread-safe.
unsafe impl Send for VerbsMr {}
// SAFETY: as above.
unsafe impl Sync for VerbsMr {}

impl MemoryRegion for VerbsMr {
    fn lkey(&self) -> u32 {
        // SAFETY: the MR is registered until `Drop`.
        unsafe { (*self.mr).lkey }
    }
    fn rkey(&self) -> u32 {
        // SAFETY: as above.
        unsafe { (*self.mr).rkey }
    }
    fn pd(&self) -> PdId {
        self.id
    }
}

impl Drop for VerbsMr {
    fn drop(&mut self) {
        // SAFETY: deregistered exactly once; after this the NIC no longer
        // accesses the memory, which its owner frees afterwards.
        unsafe { rdma_sys::ibv_dereg_mr(self.mr) };
    }
}
