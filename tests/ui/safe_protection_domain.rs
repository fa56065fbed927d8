// The ring trusts a protection domain's id and the keys its registrations
// report, so a backend must promise them with `unsafe impl`: a safe impl
// must not compile.
use rdma_ring::backend::{Access, MemoryRegion, PdId, ProtectionDomain};
use rdma_ring::Error;

struct Forger(PdId);

impl ProtectionDomain for Forger {
    fn id(&self) -> PdId {
        self.0
    }
    unsafe fn register_raw(
        &self,
        _: *mut u8,
        _: usize,
        _: Access,
    ) -> Result<Box<dyn MemoryRegion>, Error> {
        Err(Error::EmptyBuffer)
    }
}

fn main() {}
