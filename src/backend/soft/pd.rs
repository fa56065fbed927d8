//! Protection domains and memory registration on the soft device.

use std::sync::Arc;

use super::state::{MrEntry, RKEY_BIT};
use super::Shared;
use crate::backend::{Access, MemoryRegion, PdId, ProtectionDomain};
use crate::error::Error;

/// A protection domain of the soft device.
pub struct SoftPd {
    pub(super) shared: Arc<Shared>,
    pub(super) id: PdId,
}

impl std::fmt::Debug for SoftPd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SoftPd").field("id", &self.id).finish()
    }
}

// SAFETY: `id` is fixed at creation, and every region is registered in this
// domain; `SoftMr` keeps the `MemoryRegion` promises (see there).
unsafe impl ProtectionDomain for SoftPd {
    fn id(&self) -> PdId {
        self.id
    }

    unsafe fn register_raw(
        &self,
        addr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<Box<dyn MemoryRegion>, Error> {
        if len == 0 {
            return Err(Error::EmptyBuffer);
        }
        if (addr as usize).checked_add(len).is_none() {
            return Err(Error::Soft("registration wraps the address space"));
        }
        // As ibv_reg_mr refuses it (EINVAL): memory a peer may write must
        // be writable by the device locally too.
        if access.intersects(Access::REMOTE_WRITE | Access::REMOTE_ATOMIC)
            && !access.contains(Access::LOCAL_WRITE)
        {
            return Err(Error::Soft(
                "REMOTE_WRITE or REMOTE_ATOMIC without LOCAL_WRITE (ibv_reg_mr refuses it)",
            ));
        }
        let mut state = self.shared.lock();
        let key = state.next_mr;
        if key & RKEY_BIT != 0 {
            return Err(Error::Soft("memory key space exhausted"));
        }
        state.next_mr += 1;
        state.mrs.insert(
            key,
            MrEntry {
                addr: addr as usize,
                len,
                access,
                pd: self.id,
            },
        );
        let remote =
            access.intersects(Access::REMOTE_READ | Access::REMOTE_WRITE | Access::REMOTE_ATOMIC);
        Ok(Box::new(SoftMr {
            shared: Arc::clone(&self.shared),
            key,
            rkey: if remote { key | RKEY_BIT } else { 0 },
            pd: self.id,
            registered: true,
        }))
    }
}

struct SoftMr {
    shared: Arc<Shared>,
    key: u32,
    rkey: u32,
    pd: PdId,
    registered: bool,
}

// SAFETY: the keys name the `MrEntry` made in `register_raw` for exactly the
// bytes and rights asked; execution reaches memory only through an entry
// found under the device lock, and `deregister` removes the entry under that
// lock, so after it returns `Ok` no execution can reach the memory.
unsafe impl MemoryRegion for SoftMr {
    fn lkey(&self) -> u32 {
        self.key
    }
    fn rkey(&self) -> u32 {
        self.rkey
    }
    fn pd(&self) -> PdId {
        self.pd
    }
    fn deregister(&mut self) -> Result<(), Error> {
        if !self.registered {
            return Ok(());
        }
        let mut state = self.shared.lock();
        if state.fail_deregistrations > 0 {
            state.fail_deregistrations -= 1;
            return Err(Error::Soft("injected deregistration failure"));
        }
        state.mrs.remove(&self.key);
        self.registered = false;
        Ok(())
    }
}

impl Drop for SoftMr {
    fn drop(&mut self) {
        if self.registered {
            // Under the device lock: once this returns, no execution can
            // reach the memory through either key.
            self.shared.lock().mrs.remove(&self.key);
        }
    }
}
