// The ring's unsafe code trusts what a queue pair reports, so a backend
// must promise it with `unsafe impl`: a safe impl must not compile.
use rdma_ring::backend::{PostError, QpCaps, QueuePair, RawCompletion, RecvWr, SendWr};
use rdma_ring::Error;

struct Forger;

impl QueuePair for Forger {
    fn caps(&self) -> QpCaps {
        unimplemented!()
    }
    unsafe fn post_send(&mut self, _: &[SendWr]) -> Result<(), PostError> {
        Ok(())
    }
    unsafe fn post_recv(&mut self, _: &[RecvWr]) -> Result<(), PostError> {
        Ok(())
    }
    fn poll_cq(&mut self, _: &mut [RawCompletion]) -> Result<usize, Error> {
        Ok(0)
    }
    fn set_error(&mut self) -> Result<(), Error> {
        Ok(())
    }
}

fn main() {}
