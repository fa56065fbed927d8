// The ring trusts what a shared receive queue reports (its depth bounds
// what it posts), so a backend must promise it with `unsafe impl`: a safe
// impl must not compile.
use rdma_ring::backend::soft::SoftSrq;
use rdma_ring::backend::{PostError, RecvWr, SharedReceiveQueue, Sge, SrqCaps};

struct Forger(SoftSrq);

impl SharedReceiveQueue for Forger {
    fn caps(&self) -> SrqCaps {
        self.0.caps()
    }
    unsafe fn post_recv(&mut self, _: &[RecvWr], _: &[Sge]) -> Result<(), PostError> {
        Ok(())
    }
}

fn main() {}
