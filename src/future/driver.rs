//! Waking tasks: the driver, the completion channel's descriptor, and the
//! notifier thread.

use std::fmt;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use super::Shared;
use crate::backend::{CompletionEvents, QueuePair};
use crate::error::Error;

/// Drives a ring from a reactor task; see [`AsyncRing::driver`](crate::future::AsyncRing::driver).
///
/// The [module docs](crate::future) show driver tasks for tokio and smol.
pub struct Driver<Q: QueuePair> {
    pub(super) shared: Arc<Shared<Q>>,
}

impl<Q: QueuePair> Driver<Q> {
    /// See [`AsyncRing::drive`](crate::future::AsyncRing::drive).
    pub fn drive(&self) -> Result<usize, Error> {
        self.shared.drive()
    }

    /// See [`AsyncRing::tick`](crate::future::AsyncRing::tick).
    pub fn tick(&self) {
        self.shared.tick();
    }

    /// See [`AsyncRing::completion_fd`](crate::future::AsyncRing::completion_fd).
    pub fn completion_fd(&self) -> Option<CompletionFd> {
        self.shared.events.clone().map(CompletionFd)
    }
}

impl<Q: QueuePair> Clone for Driver<Q> {
    fn clone(&self) -> Self {
        Driver {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<Q: QueuePair> fmt::Debug for Driver<Q> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Driver")
            .field("wakeup", &self.shared.wakeup)
            .finish()
    }
}

/// The completion channel's descriptor, for a reactor: implements
/// `AsRawFd` (tokio `AsyncFd`) and `AsFd` (async-io `Async`).
#[derive(Clone)]
pub struct CompletionFd(pub(super) Arc<dyn CompletionEvents>);

impl AsFd for CompletionFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

impl AsRawFd for CompletionFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_fd().as_raw_fd()
    }
}

impl fmt::Debug for CompletionFd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("CompletionFd")
            .field(&self.as_raw_fd())
            .finish()
    }
}

/// How often the notifier thread ticks the ring: its idle-time work, which
/// raises no completion event, and a wake of the completion stream's task,
/// so tasks with timed work of their own (a byte stream's keep-alive
/// probe) get to run it.
const TICK: Duration = Duration::from_millis(250);

/// How long the notifier thread pauses after a drive that failed: a
/// channel whose device is gone may stay readable, and driving it again at
/// once would spin.
const PAUSE_AFTER_FAILURE: Duration = Duration::from_millis(50);

/// The notifier thread of [`Wakeup::Thread`](super::Wakeup::Thread): runs
/// `drive` whenever the completion channel `events` fires (pausing after
/// one that failed, which says so by returning false), and `tick` every
/// [`TICK`], busy or not (a peer that left must be found on a ring whose
/// other queue pairs keep completing), until `stop` is set.
pub(super) fn notifier_loop(
    events: Option<Arc<dyn CompletionEvents>>,
    stop: &AtomicBool,
    drive: impl Fn() -> bool,
    tick: impl Fn(),
) {
    let Some(events) = events else {
        return;
    };
    // Driving wakes tasks and drops the buffers of dropped futures: user
    // code, which may panic. Every awaited operation of the ring relies on
    // this thread, so a panic (which the panic hook has told of) must not
    // stop it; the ring's state is whole across one.
    let survive = |f: &dyn Fn()| {
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    };
    let mut ticked = std::time::Instant::now();
    while !stop.load(Ordering::Acquire) {
        match events.wait(Duration::from_millis(50)) {
            Ok(true) => {
                let drove = std::panic::catch_unwind(std::panic::AssertUnwindSafe(&drive));
                if !matches!(drove, Ok(true)) {
                    std::thread::sleep(PAUSE_AFTER_FAILURE);
                }
            }
            Ok(false) => {}
            Err(_) => std::thread::sleep(PAUSE_AFTER_FAILURE),
        }
        if ticked.elapsed() >= TICK {
            survive(&tick);
            ticked = std::time::Instant::now();
        }
    }
}

#[cfg(test)]
thread_local! {
    /// Makes this thread's next notifier spawn fail, as a system out of
    /// threads would.
    pub(crate) static REFUSE_NEXT_SPAWN: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// A running notifier thread, shared by the handles of one adapter.
pub(super) struct NotifierThread {
    handle: Mutex<Option<JoinHandle<()>>>,
}

impl NotifierThread {
    /// Starts `run` on a thread of its own; the system may have no thread
    /// to give.
    pub(super) fn spawn(run: impl FnOnce() + Send + 'static) -> Result<Arc<Self>, Error> {
        #[cfg(test)]
        if REFUSE_NEXT_SPAWN.with(|refuse| refuse.replace(false)) {
            return Err(Error::Verbs {
                verb: "pthread_create (the notifier thread)",
                source: std::io::Error::other("refused by a test"),
            });
        }
        let handle = std::thread::Builder::new()
            .name("rdma-ring-notifier".into())
            .spawn(run)
            .map_err(|source| Error::Verbs {
                verb: "pthread_create (the notifier thread)",
                source,
            })?;
        Ok(Arc::new(NotifierThread {
            handle: Mutex::new(Some(handle)),
        }))
    }

    /// Waits for the thread to end (its stop flag is set), unless this
    /// is that thread: a last handle can be dropped by a task the thread
    /// itself wakes.
    pub(super) fn join(&self) {
        let handle = self.handle.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(handle) = handle {
            if handle.thread().id() != std::thread::current().id() {
                let _ = handle.join();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;
    use std::sync::atomic::AtomicUsize;

    /// A channel whose device is gone: always readable, never takeable.
    struct Gone(UnixStream);

    impl AsFd for Gone {
        fn as_fd(&self) -> BorrowedFd<'_> {
            self.0.as_fd()
        }
    }

    impl CompletionEvents for Gone {
        fn arm(&self) -> Result<(), Error> {
            Err(Error::Soft("the device is gone"))
        }
        fn take(&self) -> Result<usize, Error> {
            Err(Error::Soft("the device is gone"))
        }
        fn wait(&self, _timeout: Duration) -> Result<bool, Error> {
            Ok(true)
        }
    }

    /// A drive that fails on a channel that stays readable is not run
    /// again at once: the thread pauses, so it does not spin a core (and
    /// take the ring's lock in a loop) until the last handle goes.
    #[test]
    fn the_notifier_pauses_after_a_failed_drive() {
        let (a, _b) = UnixStream::pair().unwrap();
        let events: Arc<dyn CompletionEvents> = Arc::new(Gone(a));
        let stop = Arc::new(AtomicBool::new(false));
        let drives = Arc::new(AtomicUsize::new(0));
        let thread = {
            let (stop, drives) = (Arc::clone(&stop), Arc::clone(&drives));
            std::thread::spawn(move || {
                notifier_loop(
                    Some(events),
                    &stop,
                    || {
                        drives.fetch_add(1, Ordering::Relaxed);
                        false
                    },
                    || {},
                )
            })
        };
        std::thread::sleep(Duration::from_millis(300));
        stop.store(true, Ordering::Release);
        thread.join().unwrap();
        // About six in 300 ms with the pause; without it, one per loop,
        // thousands. (A slow machine only runs fewer.)
        let drives = drives.load(Ordering::Relaxed);
        assert!((1..=20).contains(&drives), "{drives} drives in 300 ms");
    }
}
