//! Waiting for descriptors to become readable, for the connection code's
//! idle waits (rdma_cm event channels, listening sockets, wake-ups).

use std::io;
use std::os::fd::RawFd;
use std::time::Duration;

/// Waits up to `up_to` for one of `fds` to be readable (or for a signal);
/// takes nothing. A descriptor closed by another thread meanwhile (its
/// number perhaps reused) makes a missed or spurious wake-up at worst:
/// callers bound each wait and look again.
pub(crate) fn wait_readable(fds: &[RawFd], up_to: Duration) -> io::Result<()> {
    let mut polled: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let ms = up_to.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32;
    // SAFETY: `polled` is a valid, exclusively borrowed array of
    // `polled.len()` pollfds for the call; poll reads nothing through the
    // descriptors themselves.
    if unsafe { libc::poll(polled.as_mut_ptr(), polled.len() as libc::nfds_t, ms) } < 0 {
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
    Ok(())
}
