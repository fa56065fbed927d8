//! The completion channel of a verbs CQ, as [`CompletionEvents`].

use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Arc;
use std::time::Duration;

use super::cq::CqInner;
use super::device::verbs_error;
use crate::backend::CompletionEvents;
use crate::error::Error;

/// A verbs completion channel: its descriptor is non-blocking, so reactors
/// can watch it and [`take`](CompletionEvents::take) never blocks.
pub struct VerbsEvents {
    cq: Arc<CqInner>,
}

impl std::fmt::Debug for VerbsEvents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsEvents")
            .field("fd", &self.fd())
            .finish()
    }
}

impl VerbsEvents {
    pub(super) fn new(cq: Arc<CqInner>) -> Result<Self, Error> {
        let events = VerbsEvents { cq };
        let fd = events.fd();
        // SAFETY: `fd` is the channel's open descriptor; F_GETFL/F_SETFL only
        // change its flags.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        // SAFETY: as above.
        if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
            return Err(Error::Verbs {
                verb: "fcntl(O_NONBLOCK) on the completion channel",
                source: std::io::Error::last_os_error(),
            });
        }
        Ok(events)
    }

    fn fd(&self) -> i32 {
        // SAFETY: the channel lives as long as `self.cq`.
        unsafe { (*self.cq.channel).fd }
    }
}

impl AsFd for VerbsEvents {
    fn as_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the descriptor stays open while the channel lives, which is
        // at least as long as `self`.
        unsafe { BorrowedFd::borrow_raw(self.fd()) }
    }
}

impl CompletionEvents for VerbsEvents {
    fn arm(&self) -> Result<(), Error> {
        // SAFETY: the CQ is live while `self.cq` is.
        let ret = unsafe { rdma_sys::ibv_req_notify_cq(self.cq.cq, 0) };
        if ret != 0 {
            return Err(verbs_error("ibv_req_notify_cq", ret));
        }
        Ok(())
    }

    fn arm_solicited(&self) -> Result<(), Error> {
        // SAFETY: the CQ is live while `self.cq` is.
        let ret = unsafe { rdma_sys::ibv_req_notify_cq(self.cq.cq, 1) };
        if ret != 0 {
            return Err(verbs_error("ibv_req_notify_cq", ret));
        }
        Ok(())
    }

    fn take(&self) -> Result<usize, Error> {
        let mut n = 0u32;
        loop {
            let mut cq = std::ptr::null_mut();
            let mut ctx = std::ptr::null_mut();
            // SAFETY: the channel is live; the descriptor is non-blocking, so
            // this returns -1 (EAGAIN) once no event is pending.
            let ret = unsafe { rdma_sys::ibv_get_cq_event(self.cq.channel, &mut cq, &mut ctx) };
            if ret != 0 {
                let err = std::io::Error::last_os_error();
                if matches!(
                    err.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
                ) {
                    break;
                }
                if n > 0 {
                    // SAFETY: acknowledges the events taken before the failure.
                    unsafe { rdma_sys::ibv_ack_cq_events(self.cq.cq, n) };
                }
                return Err(Error::Verbs {
                    verb: "ibv_get_cq_event",
                    source: err,
                });
            }
            n += 1;
        }
        if n > 0 {
            // SAFETY: acknowledges exactly the events just taken from this CQ,
            // so that destroying the CQ never waits for them.
            unsafe { rdma_sys::ibv_ack_cq_events(self.cq.cq, n) };
        }
        Ok(n as usize)
    }

    fn wait(&self, timeout: Duration) -> Result<bool, Error> {
        let mut pfd = libc::pollfd {
            fd: self.fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // Round up, so that a sub-millisecond timeout waits instead of spinning.
        let ms = timeout.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32;
        // SAFETY: one valid pollfd.
        let ret = unsafe { libc::poll(&mut pfd, 1, ms) };
        if ret < 0 {
            let err = std::io::Error::last_os_error();
            if err.kind() == std::io::ErrorKind::Interrupted {
                return Ok(false);
            }
            return Err(Error::Verbs {
                verb: "poll on the completion channel",
                source: err,
            });
        }
        Ok(ret > 0)
    }
}
