//! The libibverbs backend (feature `verbs`), through rdma-sys.
//!
//! So far this lists the host's RDMA devices, which is how the examples
//! decide between real hardware and the soft device. Queue pairs, memory
//! registration and completion channels over verbs are the next step; the
//! [`QueuePair`](crate::backend::QueuePair) and
//! [`ProtectionDomain`](crate::backend::ProtectionDomain) traits are the
//! boundary they will implement.

use std::ffi::CStr;

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
        if err.raw_os_error() == Some(libc_enosys()) {
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

fn libc_enosys() -> i32 {
    38
}
