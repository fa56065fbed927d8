//! Waking many tasks at once, and waking them only once a lock is let go.

use std::cell::RefCell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::task::Waker;

thread_local! {
    /// Wakers found while this thread holds a lock under a [`Deferral`],
    /// woken once it lets go: waking may run a task that takes the same
    /// lock, or a waker that panics, which must not cut the holder's
    /// update short.
    static DEFERRED: RefCell<Option<Vec<Waker>>> = const { RefCell::new(None) };
}

/// Marks this thread as holding a lock: wakes through
/// [`wake_now_or_later`] wait until the outermost deferral is dropped
/// (after the lock is released, when it is declared before the guard).
pub(crate) struct Deferral {
    outer: bool,
}

impl Deferral {
    pub(crate) fn start() -> Deferral {
        let outer = DEFERRED.with(|d| {
            let mut d = d.borrow_mut();
            let outer = d.is_none();
            if outer {
                *d = Some(Vec::new());
            }
            outer
        });
        Deferral { outer }
    }
}

impl Drop for Deferral {
    fn drop(&mut self) {
        if !self.outer {
            return;
        }
        let woken = DEFERRED.with(|d| d.borrow_mut().take()).unwrap_or_default();
        wake_all(woken);
    }
}

/// Wakes `wakers` now, or, under a [`Deferral`], once it ends.
pub(crate) fn wake_now_or_later(wakers: impl IntoIterator<Item = Waker>) {
    let mut wakers = wakers.into_iter();
    DEFERRED.with(|d| {
        if let Some(later) = d.borrow_mut().as_mut() {
            later.extend(&mut wakers);
        }
    });
    wake_all(wakers);
}

/// Wakes every waker of `wakers`. A waker that panics (the panic hook has
/// told of it) neither keeps the others asleep — what they wait for has
/// happened, and nothing later may come to wake them — nor reaches the
/// caller, whose own work went fine and may hold what must not be lost (a
/// completion it took, say), and who may be unwinding already.
// Out of line, as is `drop_quietly`: waking is off the rings' hot paths,
// and inlined into their callers it changed how the compiler laid out
// those paths (the fixed-buffer ring's batch path cost 7 more per
// operation at batch 16).
#[inline(never)]
pub(crate) fn wake_all(wakers: impl IntoIterator<Item = Waker>) {
    for waker in wakers {
        let _ = catch_unwind(AssertUnwindSafe(|| waker.wake()));
    }
}

/// Drops `value`, whose drop runs code of the user's (a buffer's, a
/// waker's): as with [`wake_all`], a panic in it is the panic hook's to
/// report, not the caller's.
#[inline(never)]
pub(crate) fn drop_quietly<T>(value: T) {
    let _ = catch_unwind(AssertUnwindSafe(move || drop(value)));
}

/// Most wakers a list of tasks waiting for a change keeps (see
/// [`register`]): far more than tasks really wait on one session or
/// ring at once (a session has at most 4096 requests open), since a full
/// list of live waiters would be woken again and again.
pub(crate) const MAX_WAITERS: usize = 1 << 16;

/// Adds `waker` to `waiters` unless one there wakes the same task. Such a
/// list is emptied only at the next change, and grows meanwhile by one for
/// each task that polled and went away (its future dropped): a full one
/// is handed to `wake` first. Waking is spurious for the tasks still
/// waiting, which poll again and register anew; it bounds the list.
pub(crate) fn register(
    waiters: &mut Vec<Waker>,
    waker: &Waker,
    wake: impl FnOnce(std::vec::Drain<'_, Waker>),
) {
    register_within(waiters, waker, MAX_WAITERS, wake);
}

/// [`register`], with a list full at `max`.
fn register_within(
    waiters: &mut Vec<Waker>,
    waker: &Waker,
    max: usize,
    wake: impl FnOnce(std::vec::Drain<'_, Waker>),
) {
    if waiters.iter().any(|w| w.will_wake(waker)) {
        return;
    }
    if waiters.len() >= max {
        wake(waiters.drain(..));
    }
    waiters.push(waker.clone());
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::Wake;

    struct Count(AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// A list of waiters stays bounded however many tasks register and go
    /// away: the full list is woken, and the newcomer kept.
    #[test]
    fn a_full_list_of_waiters_is_woken_not_grown() {
        const MAX: usize = 8;
        let woken = Arc::new(Count(AtomicUsize::new(0)));
        let mut waiters = Vec::new();
        let tasks: Vec<Waker> = (0..=MAX)
            .map(|_| Waker::from(Arc::new(Count(AtomicUsize::new(0)))))
            .collect();
        let counted = Waker::from(Arc::clone(&woken));
        let mut register = |waker: &Waker| {
            register_within(&mut waiters, waker, MAX, |full| wake_all(full));
            waiters.len()
        };
        register(&counted);
        assert_eq!(register(&counted), 1, "one task, once");
        let mut len = 0;
        for task in &tasks[..MAX - 1] {
            len = register(task);
        }
        assert_eq!(len, MAX);
        assert_eq!(woken.0.load(Ordering::SeqCst), 0);
        assert_eq!(register(&tasks[MAX]), 1, "the full list went");
        assert_eq!(woken.0.load(Ordering::SeqCst), 1, "and was woken");
    }
}
