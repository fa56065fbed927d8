//! Memory together with its registration, released in the one safe order:
//! deregister, then free — or, if deregistration fails, keep the memory
//! forever rather than free it while the device may still reach it.

use std::any::Any;

use crate::backend::{Access, MemoryRegion, PdId, ProtectionDomain};
use crate::error::Error;

/// Owned memory, registered. The memory is boxed before its address is
/// taken, and never moves again while registered: the address the device
/// uses stays derived from the memory's final place, which is what Rust's
/// aliasing rules require of a raw pointer kept across moves of its owner.
pub(crate) struct Registration {
    region: Box<dyn MemoryRegion>,
    /// `None` only after the memory was handed back.
    mem: Option<Box<dyn Any + Send>>,
    ptr: *mut u8,
    len: usize,
    lkey: u32,
    pd: PdId,
}

// SAFETY: `ptr` points into `mem`, which this value owns alone; moving the
// value to another thread moves that sole ownership (`mem: Send`).
unsafe impl Send for Registration {}
// SAFETY: a shared `Registration` gives out only its keys, address and
// length; what may be done with the bytes is up to the owning buffer type,
// which documents it.
unsafe impl Sync for Registration {}

impl Registration {
    /// Registers `total` fresh, zeroed bytes starting on an `align`
    /// boundary (a power of two, at most 4096), with local write rights:
    /// the memory of a pool or an arena, cut into buffers by its owner,
    /// which alone reaches the bytes (through the buffers it hands out).
    pub(crate) fn zeroed_aligned(
        pd: &dyn ProtectionDomain,
        total: usize,
        align: usize,
    ) -> Result<Self, Error> {
        debug_assert!(align.is_power_of_two() && align >= 8);
        // Over-allocate by one alignment unit so the start can be moved to
        // an `align` boundary.
        let words = total.checked_add(align).ok_or(Error::OutOfMemory(total))? / 8;
        let mut memory: Vec<u64> = Vec::new();
        memory
            .try_reserve_exact(words)
            .map_err(|_| Error::OutOfMemory(total))?;
        memory.resize(words, 0);
        // SAFETY: a Vec's heap buffer is the Vec's own, outside the Vec
        // value, and does not move while the Vec is not resized (nothing
        // resizes it once registered); `start..start + total` lies inside
        // it. Safe code reaches the bytes only through the buffers the
        // owner hands out, each held by one value, which an in-flight
        // operation owns.
        unsafe {
            Registration::new(pd, memory, Access::LOCAL_WRITE, |m: &mut Vec<u64>| {
                let raw = m.as_mut_ptr().cast::<u8>();
                (raw.wrapping_add(raw.align_offset(align)), total)
            })
        }
        .map_err(|(e, _)| e)
    }

    /// Registers the bytes `locate` finds in `mem` (called once `mem` is in
    /// its box) with `access`. On failure `mem` comes back with the error.
    ///
    /// # Safety
    ///
    /// `locate` must return bytes that `mem` owns outside of itself (on the
    /// heap or in static memory), that stay allocated at that address while
    /// `mem` lives, and that nothing but the device and the owning buffer
    /// type accesses while registered.
    pub(crate) unsafe fn new<M: Any + Send>(
        pd: &dyn ProtectionDomain,
        mem: M,
        access: Access,
        locate: impl FnOnce(&mut M) -> (*mut u8, usize),
    ) -> Result<Self, (Error, M)> {
        let mut mem = Box::new(mem);
        let (ptr, len) = locate(&mut mem);
        if len == 0 {
            return Err((Error::EmptyBuffer, *mem));
        }
        // SAFETY: the caller's promise about `locate`; `mem` moves into the
        // result and is freed only after a successful deregistration.
        match unsafe { pd.register_raw(ptr, len, access) } {
            Ok(region) => Ok(Registration {
                lkey: region.lkey(),
                pd: region.pd(),
                region,
                mem: Some(mem),
                ptr,
                len,
            }),
            Err(e) => Err((e, *mem)),
        }
    }

    pub(crate) fn ptr(&self) -> *mut u8 {
        self.ptr
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn lkey(&self) -> u32 {
        self.lkey
    }

    pub(crate) fn rkey(&self) -> u32 {
        self.region.rkey()
    }

    pub(crate) fn pd(&self) -> PdId {
        self.pd
    }

    /// Whether the registered memory is an `M`.
    pub(crate) fn holds<M: Any>(&self) -> bool {
        self.mem.as_deref().is_some_and(|m| m.is::<M>())
    }

    /// Deregisters and hands the memory back as the `M` it must be (check
    /// with [`holds`](Self::holds) first). If deregistration fails, the
    /// registration comes back intact: still registered, still usable.
    pub(crate) fn into_memory<M: Any>(mut self) -> Result<M, (Error, Self)> {
        debug_assert!(self.holds::<M>());
        match self.region.deregister() {
            Ok(()) => {
                let mem = self.mem.take().expect("present until handed back");
                Ok(*mem.downcast::<M>().expect("type checked by the caller"))
            }
            Err(e) => Err((e, self)),
        }
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let Some(mem) = self.mem.take() else {
            return;
        };
        if self.region.deregister().is_ok() {
            drop(mem);
        } else {
            // The device may still reach the memory: never free it.
            crate::leak::record_region(self.len);
            std::mem::forget(mem);
        }
    }
}
