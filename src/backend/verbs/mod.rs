//! The libibverbs backend (feature `verbs`), through rdma-sys: real RDMA
//! hardware, or Soft-RoCE.
//!
//! * [`VerbsDevice`]: open a device by name, pick its port and GID (RoCE v2
//!   IPv4-mapped by default), read its limits.
//! * [`VerbsPd`]: a protection domain; registers memory with exactly the
//!   access rights asked for.
//! * [`VerbsCq`]: a completion queue with its completion channel, polled
//!   in batches, shared by any number of queue pairs.
//! * [`VerbsSrq`]: a shared receive queue, with its low-water limit.
//! * [`VerbsQp`]: an RC queue pair, on a completion queue of its own or a
//!   shared one, optionally on a shared receive queue. `post_send` posts one
//!   linked `ibv_send_wr` list (one doorbell), each work request pointing at
//!   its scatter/gather elements where the ring keeps them; a refusal at
//!   `bad_wr` reports how many were taken, as far as `bad_wr` proves it.
//! * [`VerbsAsyncEvents`]: the device's asynchronous events, acknowledged
//!   as they are read.
//!
//! Every failing verb becomes [`Error::Verbs`] naming the verb and errno.
//!
//! ```no_run
//! use rdma_ring::backend::verbs::VerbsDevice;
//! use rdma_ring::backend::QpConfig;
//! let dev = VerbsDevice::open("rxe0").unwrap();
//! let pd = dev.alloc_pd().unwrap();
//! let mut a = dev.create_qp(&pd, QpConfig::default()).unwrap();
//! let mut b = dev.create_qp(&pd, QpConfig::default()).unwrap();
//! let (ea, eb) = (a.endpoint(), b.endpoint());
//! a.connect(&eb).unwrap();
//! b.connect(&ea).unwrap();
//! ```

mod async_events;
mod cq;
mod device;
mod events;
mod pd;
mod qp;
mod srq;
#[cfg(test)]
mod translation_probe;

use std::ffi::CStr;

pub use async_events::VerbsAsyncEvents;
pub use cq::VerbsCq;
pub use device::{DeviceLimits, DeviceOptions, VerbsDevice};
pub use events::VerbsEvents;
pub use pd::VerbsPd;
pub(crate) use qp::MIN_RNR_TIMER;
pub use qp::{QpAttributes, VerbsQp};
pub use srq::VerbsSrq;

use rdma_sys::{ibv_recv_wr, ibv_send_wr, ibv_sge, ibv_wc};

use crate::backend::Sge;

// The ring's scatter/gather elements are handed to the NIC as they are.
static_assertions::assert_eq_size!(Sge, ibv_sge);
static_assertions::assert_eq_align!(Sge, ibv_sge);
static_assertions::const_assert_eq!(
    std::mem::offset_of!(Sge, addr),
    std::mem::offset_of!(ibv_sge, addr)
);
static_assertions::const_assert_eq!(
    std::mem::offset_of!(Sge, len),
    std::mem::offset_of!(ibv_sge, length)
);
static_assertions::const_assert_eq!(
    std::mem::offset_of!(Sge, lkey),
    std::mem::offset_of!(ibv_sge, lkey)
);

/// C structs of libibverbs for which all-zero bytes are a valid value.
///
/// # Safety
///
/// Implement only for plain C structs and unions of integers and raw
/// pointers, for which `mem::zeroed` is a valid value.
unsafe trait Zeroable: Sized {}
// SAFETY: each is a plain C struct of integers, raw pointers and unions of
// those.
unsafe impl Zeroable for ibv_send_wr {}
// SAFETY: as above.
unsafe impl Zeroable for ibv_recv_wr {}
// SAFETY: as above.
unsafe impl Zeroable for ibv_wc {}

/// `n` zeroed values, the reusable staging arrays of a queue.
fn zeroed<T: Zeroable>(n: usize) -> Vec<T> {
    // SAFETY: all-zero is a valid `T` (the `Zeroable` contract).
    (0..n).map(|_| unsafe { std::mem::zeroed() }).collect()
}

/// How many work requests of the `len` linked from `base` the device took
/// before refusing `bad`. A `bad` that is NULL or does not point at one of
/// them proves nothing, and work requests that may have been taken must
/// never be handed back as refused (their buffers would be freed under the
/// NIC): then all `len` count as taken.
fn accepted<T>(base: *const T, bad: *const T, len: usize) -> usize {
    let size = std::mem::size_of::<T>();
    let offset = (bad as usize).wrapping_sub(base as usize);
    if bad.is_null() || offset % size != 0 || offset / size >= len {
        return len;
    }
    offset / size
}

use crate::error::Error;

/// The names of the RDMA devices libibverbs sees, in its order.
///
/// ```
/// // On a host without RDMA this is empty, not an error.
/// let names = rdma_ring::backend::verbs::device_names().unwrap();
/// println!("{} RDMA device(s)", names.len());
/// ```
pub fn device_names() -> Result<Vec<String>, Error> {
    let mut count: i32 = 0;
    // SAFETY: `ibv_get_device_list` writes the count through the valid
    // pointer and returns a NULL-terminated array (or NULL) that we free
    // with `ibv_free_device_list` below.
    let list = unsafe { rdma_sys::ibv_get_device_list(&mut count) };
    if list.is_null() {
        let err = std::io::Error::last_os_error();
        // ENOSYS: no RDMA subsystem in this kernel, which means "no devices".
        if err.raw_os_error() == Some(libc::ENOSYS) {
            return Ok(Vec::new());
        }
        return Err(Error::Verbs {
            verb: "ibv_get_device_list",
            source: err,
        });
    }
    let mut names = Vec::with_capacity(count.max(0) as usize);
    for i in 0..count.max(0) as usize {
        // SAFETY: the list holds `count` valid device pointers.
        let dev = unsafe { *list.add(i) };
        if dev.is_null() {
            break;
        }
        // SAFETY: `dev` is a valid device; its name is a NUL-terminated
        // string owned by the list, copied before the list is freed.
        let name = unsafe { CStr::from_ptr(rdma_sys::ibv_get_device_name(dev)) };
        names.push(name.to_string_lossy().into_owned());
    }
    // SAFETY: `list` came from `ibv_get_device_list` and is freed once.
    unsafe { rdma_sys::ibv_free_device_list(list) };
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::accepted;

    #[test]
    fn bad_wr_is_trusted_only_when_it_names_a_posted_request() {
        let list = [0u64; 4];
        let base = list.as_ptr();
        assert_eq!(accepted(base, base.wrapping_add(2), 4), 2);
        assert_eq!(accepted(base, base, 4), 0);
        // NULL, past the end, before the start, or misaligned: unprovable,
        // so every request counts as taken.
        assert_eq!(accepted(base, std::ptr::null(), 4), 4);
        assert_eq!(accepted(base, base.wrapping_add(4), 4), 4);
        assert_eq!(accepted(base, base.wrapping_add(1000), 4), 4);
        assert_eq!(accepted(base, base.wrapping_sub(1), 4), 4);
        let odd = (base as usize + 3) as *const u64;
        assert_eq!(accepted(base, odd, 4), 4);
    }
}
