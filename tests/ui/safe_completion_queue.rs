// A completion queue's reports release buffers to safe code, so a backend
// must promise their truth with `unsafe impl`.
use rdma_ring::backend::{CompletionQueue, CqId, RawCompletion};
use rdma_ring::Error;

struct Forger;

impl CompletionQueue for Forger {
    fn id(&self) -> CqId {
        CqId::fresh()
    }
    fn entries(&self) -> u32 {
        1
    }
    fn poll(&mut self, out: &mut [RawCompletion]) -> Result<usize, Error> {
        out[0] = RawCompletion::default();
        Ok(1)
    }
}

fn main() {}
