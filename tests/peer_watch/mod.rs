// Each test crate uses part of it.
#![allow(dead_code)]

//! A soft queue pair whose answer to "did your peer leave?" a test
//! chooses: what an rdma_cm queue pair says when its connection's
//! DISCONNECTED event came, or when its event channel failed.

use rdma_ring::backend::soft::{SoftCq, SoftQp, SoftSrq};
use rdma_ring::backend::{PostError, QpCaps, QueuePair, RecvWr, SendWr, Sge};
use rdma_ring::Error;

/// What [`Watched`] answers when asked whether its peer left.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerAnswer {
    /// No.
    Stayed,
    /// Yes (rdma_cm's DISCONNECTED).
    Left,
    /// An error: the connection's event channel failed.
    CannotTell,
}

pub struct Watched {
    pub qp: SoftQp,
    pub answer: PeerAnswer,
}

// SAFETY: the soft queue pair's, passed through, except the answer to the
// peer check, where any answer (an error too) is allowed.
unsafe impl QueuePair for Watched {
    type Cq = SoftCq;
    type Srq = SoftSrq;
    fn caps(&self) -> QpCaps {
        self.qp.caps()
    }
    unsafe fn post_send(&mut self, wrs: &[SendWr], sges: &[Sge]) -> Result<(), PostError> {
        // SAFETY: the caller's contract, passed through.
        unsafe { self.qp.post_send(wrs, sges) }
    }
    unsafe fn post_recv(&mut self, wrs: &[RecvWr], sges: &[Sge]) -> Result<(), PostError> {
        // SAFETY: the caller's contract, passed through.
        unsafe { self.qp.post_recv(wrs, sges) }
    }
    fn set_error(&mut self) -> Result<(), Error> {
        self.qp.set_error()
    }
    fn take_cq(&mut self) -> Option<SoftCq> {
        self.qp.take_cq()
    }
    fn peer_disconnected(&mut self) -> Result<bool, Error> {
        match self.answer {
            PeerAnswer::Stayed => self.qp.peer_disconnected(),
            PeerAnswer::Left => Ok(true),
            PeerAnswer::CannotTell => Err(Error::Soft("the connection's event channel failed")),
        }
    }
}
