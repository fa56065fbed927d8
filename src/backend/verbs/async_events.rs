//! A verbs device's asynchronous event channel.

use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Arc;
use std::time::Duration;

use super::device::DeviceInner;
use crate::backend::{AsyncEvent, AsyncEventSource, CqId, SrqId};
use crate::error::Error;

/// `struct ibv_async_event`, with its type read as a plain integer: a
/// newer libibverbs may report an event type this crate's bindings do not
/// list, which must not become an invalid Rust enum.
#[repr(C)]
struct RawAsyncEvent {
    element: RawElement,
    event_type: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
union RawElement {
    ptr: *mut std::ffi::c_void,
    port_num: std::ffi::c_int,
}

static_assertions::assert_eq_size!(RawAsyncEvent, rdma_sys::ibv_async_event);
static_assertions::assert_eq_align!(RawAsyncEvent, rdma_sys::ibv_async_event);

/// The asynchronous events of a verbs device (`ibv_get_async_event`): its
/// descriptor is non-blocking and readable while events are pending, for a
/// reactor. Each event is acknowledged as soon as it is read, so that
/// destroying the queue it names never waits for it. A device delivers
/// each event to one reader.
pub struct VerbsAsyncEvents {
    dev: Arc<DeviceInner>,
}

impl std::fmt::Debug for VerbsAsyncEvents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsAsyncEvents")
            .field("device", &self.dev.name)
            .finish()
    }
}

impl VerbsAsyncEvents {
    pub(super) fn new(dev: Arc<DeviceInner>) -> Result<Self, Error> {
        let events = VerbsAsyncEvents { dev };
        let fd = events.fd();
        // SAFETY: `fd` is the context's open async descriptor; F_GETFL and
        // F_SETFL only change its flags.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        // SAFETY: as above.
        if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
            return Err(Error::Verbs {
                verb: "fcntl(O_NONBLOCK) on the async event channel",
                source: std::io::Error::last_os_error(),
            });
        }
        Ok(events)
    }

    fn fd(&self) -> i32 {
        // SAFETY: the context is open while `dev` lives.
        unsafe { (*self.dev.ctx).async_fd }
    }
}

impl AsFd for VerbsAsyncEvents {
    fn as_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the descriptor stays open while the context does, which is
        // at least as long as `self`.
        unsafe { BorrowedFd::borrow_raw(self.fd()) }
    }
}

/// The typed event for a raw one. Reads the object the event names, which
/// stays valid until the event is acknowledged.
///
/// # Safety
///
/// `raw` was filled by `ibv_get_async_event` and is not yet acknowledged.
unsafe fn typed(raw: &RawAsyncEvent) -> AsyncEvent {
    use rdma_sys::ibv_event_type as t;
    let code = raw.event_type;
    let is = |e: t| code == e as u32;
    // SAFETY: for QP events the element is the QP, alive until the ack.
    let qp_num = || unsafe { (*raw.element.ptr.cast::<rdma_sys::ibv_qp>()).qp_num };
    // SAFETY: for SRQ events the element is the SRQ, alive until the ack;
    // its context is the identity the crate stored at creation.
    let srq = || {
        SrqId::from_raw(
            unsafe { (*raw.element.ptr.cast::<rdma_sys::ibv_srq>()).srq_context } as u64,
        )
    };
    // SAFETY: likewise for CQ events.
    let cq = || {
        CqId::from_raw(unsafe { (*raw.element.ptr.cast::<rdma_sys::ibv_cq>()).cq_context } as u64)
    };
    // SAFETY: for port events the element is the port number.
    let port = || unsafe { raw.element.port_num }.clamp(0, 255) as u8;
    if is(t::IBV_EVENT_QP_FATAL) {
        AsyncEvent::QpFatal { qp_num: qp_num() }
    } else if is(t::IBV_EVENT_QP_REQ_ERR) {
        AsyncEvent::QpRequestError { qp_num: qp_num() }
    } else if is(t::IBV_EVENT_QP_ACCESS_ERR) {
        AsyncEvent::QpAccessError { qp_num: qp_num() }
    } else if is(t::IBV_EVENT_COMM_EST) {
        AsyncEvent::CommEstablished { qp_num: qp_num() }
    } else if is(t::IBV_EVENT_SQ_DRAINED) {
        AsyncEvent::SendQueueDrained { qp_num: qp_num() }
    } else if is(t::IBV_EVENT_QP_LAST_WQE_REACHED) {
        AsyncEvent::LastWqeReached { qp_num: qp_num() }
    } else if is(t::IBV_EVENT_SRQ_LIMIT_REACHED) {
        AsyncEvent::SrqLimitReached { srq: srq() }
    } else if is(t::IBV_EVENT_SRQ_ERR) {
        AsyncEvent::SrqError { srq: srq() }
    } else if is(t::IBV_EVENT_CQ_ERR) {
        AsyncEvent::CqError { cq: cq() }
    } else if is(t::IBV_EVENT_PORT_ACTIVE) {
        AsyncEvent::PortActive { port: port() }
    } else if is(t::IBV_EVENT_PORT_ERR) {
        AsyncEvent::PortError { port: port() }
    } else if is(t::IBV_EVENT_LID_CHANGE)
        || is(t::IBV_EVENT_PKEY_CHANGE)
        || is(t::IBV_EVENT_SM_CHANGE)
        || is(t::IBV_EVENT_CLIENT_REREGISTER)
        || is(t::IBV_EVENT_GID_CHANGE)
    {
        AsyncEvent::PortChanged { port: port() }
    } else if is(t::IBV_EVENT_DEVICE_FATAL) {
        AsyncEvent::DeviceFatal
    } else {
        AsyncEvent::Other { code }
    }
}

impl AsyncEventSource for VerbsAsyncEvents {
    fn next_event(&self) -> Result<Option<AsyncEvent>, Error> {
        let mut raw = RawAsyncEvent {
            element: RawElement {
                ptr: std::ptr::null_mut(),
            },
            event_type: 0,
        };
        // SAFETY: the context is open; `raw` has the layout of
        // `ibv_async_event` (asserted above); the descriptor is
        // non-blocking, so this returns -1 (EAGAIN) when none is pending.
        let ret = unsafe {
            rdma_sys::ibv_get_async_event(self.dev.ctx, (&mut raw as *mut RawAsyncEvent).cast())
        };
        if ret != 0 {
            let err = std::io::Error::last_os_error();
            if matches!(
                err.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
            ) {
                return Ok(None);
            }
            return Err(Error::Verbs {
                verb: "ibv_get_async_event",
                source: err,
            });
        }
        // SAFETY: filled by `ibv_get_async_event`, not yet acknowledged.
        let event = unsafe { typed(&raw) };
        // SAFETY: acknowledges exactly the event just taken, once.
        unsafe { rdma_sys::ibv_ack_async_event((&mut raw as *mut RawAsyncEvent).cast()) };
        Ok(Some(event))
    }

    fn wait(&self, timeout: Duration) -> Result<bool, Error> {
        let mut pfd = libc::pollfd {
            fd: self.fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = timeout.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32;
        // SAFETY: one valid pollfd.
        let ret = unsafe { libc::poll(&mut pfd, 1, ms) };
        if ret < 0 {
            let err = std::io::Error::last_os_error();
            if err.kind() == std::io::ErrorKind::Interrupted {
                return Ok(false);
            }
            return Err(Error::Verbs {
                verb: "poll on the async event channel",
                source: err,
            });
        }
        Ok(ret > 0)
    }
}
