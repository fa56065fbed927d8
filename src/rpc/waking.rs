//! How a client's callers wait: the wakers of parked callers and awaiting
//! tasks, the driving token (one waiter at a time sleeps on the completion
//! channel) and the leave to poll. Wakes found under the client's lock
//! wait past it ([`crate::wakers::Deferral`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Wake, Waker};

/// Wakers of the callers and tasks waiting on calls: any completion
/// wakes them all, and each looks for its own result. It also holds the
/// client's driving token: one waiter at a time (a parked caller, or the
/// notifier) sleeps on the completion channel and drives the ring; the
/// others sleep until it wakes them.
#[derive(Default)]
pub(super) struct CallWakers {
    waiting: Mutex<HashMap<u64, Waker>>,
    driving: AtomicBool,
    /// Blocking callers inside `call` now: while there are any, they
    /// drive the ring themselves and the notifier stays out of their way.
    pub(super) callers: AtomicUsize,
    /// When the last blocking call ended, in nanoseconds since [`epoch`].
    last_call: std::sync::atomic::AtomicU64,
}

/// The origin of [`CallWakers`]' timestamps.
fn epoch() -> std::time::Instant {
    static EPOCH: OnceLock<std::time::Instant> = OnceLock::new();
    *EPOCH.get_or_init(std::time::Instant::now)
}

impl CallWakers {
    /// Takes the driving token, if nobody holds it.
    pub(super) fn try_drive(&self) -> bool {
        self.driving
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Gives the token back and wakes every waiter, so that one of them
    /// takes it over.
    pub(super) fn release_drive(self: &Arc<Self>) {
        self.driving.store(false, Ordering::Release);
        self.wake_by_ref();
    }

    /// Gives the token back without waking anyone (the notifier, when
    /// callers arrive: they are awake).
    pub(super) fn release_drive_quietly(&self) {
        self.driving.store(false, Ordering::Release);
    }

    pub(super) fn register(&self, id: u64, waker: &Waker) {
        let mut waiting = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
        match waiting.get(&id) {
            Some(w) if w.will_wake(waker) => {}
            _ => {
                waiting.insert(id, waker.clone());
            }
        }
    }

    pub(super) fn forget(&self, id: u64) {
        self.waiting
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id);
    }

    /// How long ago the last blocking call ended (long ago if none did).
    pub(super) fn since_last_call(&self) -> std::time::Duration {
        let last = self.last_call.load(Ordering::Acquire);
        if last == 0 {
            return std::time::Duration::MAX;
        }
        let now = epoch().elapsed().as_nanos() as u64;
        std::time::Duration::from_nanos(now.saturating_sub(last))
    }
}

impl Wake for CallWakers {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let woken: Vec<Waker> = {
            let mut waiting = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
            waiting.drain().map(|(_, w)| w).collect()
        };
        crate::wakers::wake_now_or_later(woken);
    }
}

/// Counts a blocking caller inside `call` while it lives.
pub(super) struct CallerGuard(Arc<CallWakers>);

impl CallerGuard {
    pub(super) fn enter(wakers: &Arc<CallWakers>) -> CallerGuard {
        wakers.callers.fetch_add(1, Ordering::AcqRel);
        CallerGuard(Arc::clone(wakers))
    }
}

impl Drop for CallerGuard {
    fn drop(&mut self) {
        let now = (epoch().elapsed().as_nanos() as u64).max(1);
        self.0.last_call.store(now, Ordering::Release);
        self.0.callers.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Blocking callers polling right now, over every client of the process.
static SPINNING: AtomicUsize = AtomicUsize::new(0);

/// Leave to poll: callers poll on all cores but one (and at least one),
/// so that polling callers leave room for the threads that answer them.
pub(super) struct SpinSlot;

impl SpinSlot {
    /// A slot, if one is free (always, for a busy-polling client, which
    /// has nothing else to wait on).
    pub(super) fn take(busy: bool) -> Option<SpinSlot> {
        if busy {
            SPINNING.fetch_add(1, Ordering::AcqRel);
            return Some(SpinSlot);
        }
        // Asked once: the answer costs system calls (and cgroup reads).
        static LIMIT: OnceLock<usize> = OnceLock::new();
        let limit = *LIMIT.get_or_init(|| {
            std::thread::available_parallelism().map_or(1, |n| n.get().saturating_sub(1).max(1))
        });
        SPINNING
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < limit).then_some(n + 1)
            })
            .ok()
            .map(|_| SpinSlot)
    }
}

impl Drop for SpinSlot {
    fn drop(&mut self) {
        SPINNING.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Flag(AtomicBool);
    impl Wake for Flag {
        fn wake(self: Arc<Self>) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    use crate::wakers::Deferral;

    #[test]
    fn wakes_under_a_deferral_wait_until_it_ends() {
        let wakers: Arc<CallWakers> = Arc::default();
        let flag = Arc::new(Flag(AtomicBool::new(false)));
        wakers.register(1, &Waker::from(Arc::clone(&flag)));
        {
            let _outer = Deferral::start();
            {
                let _inner = Deferral::start();
                wakers.wake_by_ref();
            }
            assert!(!flag.0.load(Ordering::SeqCst), "woken under the lock");
        }
        assert!(flag.0.load(Ordering::SeqCst), "never woken");
    }

    #[test]
    fn the_driving_token_has_one_holder() {
        let wakers: Arc<CallWakers> = Arc::default();
        assert!(wakers.try_drive());
        assert!(!wakers.try_drive());
        wakers.release_drive();
        assert!(wakers.try_drive());
    }
}
