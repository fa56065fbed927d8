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

// SAFETY: `id` is fixed at creation; every region is registered in this
// PD by `ibv_reg_mr` with exactly the rights asked, and `VerbsMr` keeps the
// `MemoryRegion` promises.
unsafe impl ProtectionDomain for VerbsPd {
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
        // SAFETY: `mr` was just returned non-NULL by `ibv_reg_mr`.
        let (lkey, rkey) = unsafe { ((*mr).lkey, (*mr).rkey) };
        // Providers hand out an rkey for every registration (mlx5's equals
        // the lkey); one with no remote right has none to give, as
        // `MemoryRegion` promises.
        let remote = Access::REMOTE_READ | Access::REMOTE_WRITE | Access::REMOTE_ATOMIC;
        let rkey = if access.intersects(remote) { rkey } else { 0 };
        Ok(Box::new(VerbsMr {
            _pd: Arc::clone(&self.inner),
            mr,
            lkey,
            rkey,
            id: self.inner.id,
        }))
    }
}

struct VerbsMr {
    _pd: Arc<PdInner>,
    /// NULL once deregistered.
    mr: *mut ibv_mr,
    lkey: u32,
    rkey: u32,
    id: PdId,
}

// SAFETY: an MR handle is used only to deregister it, which libibverbs
// allows from any thread; the keys are copies.
unsafe impl Send for VerbsMr {}
// SAFETY: shared references only read the copied keys.
unsafe impl Sync for VerbsMr {}

// SAFETY: the keys are those `ibv_reg_mr` returned for exactly the bytes and
// rights asked; `ibv_dereg_mr` returning 0 means the NIC no longer accesses
// the memory, and its failure is reported, never ignored.
unsafe impl MemoryRegion for VerbsMr {
    fn lkey(&self) -> u32 {
        self.lkey
    }
    fn rkey(&self) -> u32 {
        self.rkey
    }
    fn pd(&self) -> PdId {
        self.id
    }
    fn deregister(&mut self) -> Result<(), Error> {
        if self.mr.is_null() {
            return Ok(());
        }
        // SAFETY: the MR is registered (non-NULL) and deregistered at most
        // once: on success the pointer is cleared.
        let ret = unsafe { rdma_sys::ibv_dereg_mr(self.mr) };
        if ret != 0 {
            return Err(super::device::verbs_error("ibv_dereg_mr", ret));
        }
        self.mr = std::ptr::null_mut();
        Ok(())
    }
}

impl Drop for VerbsMr {
    fn drop(&mut self) {
        // Owners deregister before freeing and keep the memory when that
        // fails; this is the last attempt, for a region dropped without it.
        let _ = self.deregister();
    }
}
