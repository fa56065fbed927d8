// The ring's unsafe code trusts what a queue pair reports, so a backend
// must promise it with `unsafe impl`: a safe impl must not compile.
use rdma_ring::backend::soft::{SoftCq, SoftQp, SoftSrq};
use rdma_ring::backend::{PostError, QpCaps, QueuePair, RecvWr, SendWr, Sge};
use rdma_ring::Error;

struct Forger(SoftQp);

impl QueuePair for Forger {
    type Cq = SoftCq;
    type Srq = SoftSrq;
    fn caps(&self) -> QpCaps {
        self.0.caps()
    }
    unsafe fn post_send(&mut self, _: &[SendWr], _: &[Sge]) -> Result<(), PostError> {
        Ok(())
    }
    unsafe fn post_recv(&mut self, _: &[RecvWr], _: &[Sge]) -> Result<(), PostError> {
        Ok(())
    }
    fn set_error(&mut self) -> Result<(), Error> {
        Ok(())
    }
    fn take_cq(&mut self) -> Option<SoftCq> {
        None
    }
}

fn main() {}
