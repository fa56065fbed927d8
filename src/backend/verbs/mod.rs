//! The libibverbs backend (feature `verbs`), through rdma-sys: real RDMA
//! hardware, or Soft-RoCE.
//!
//! * [`VerbsDevice`]: open a device by name, pick its port and GID (RoCE v2
//!   IPv4-mapped by default), read its limits.
//! * [`VerbsPd`]: a protection domain; registers memory with exactly the
//!   access rights asked for.
//! * [`VerbsQp`]: an RC queue pair with its own completion queue and
//!   completion channel. `post_send` posts one linked `ibv_send_wr` list
//!   (one doorbell); a refusal at `bad_wr` reports how many were taken, from
//!   the return value; `poll_cq` reaps in batches.
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

mod device;
mod events;
mod pd;
mod qp;

use std::ffi::CStr;

pub use device::{DeviceLimits, DeviceOptions, VerbsDevice};
pub use events::VerbsEvents;
pub use pd::VerbsPd;
pub use qp::VerbsQp;

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
