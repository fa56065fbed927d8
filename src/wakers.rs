//! Waking many tasks at once.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::task::Waker;

/// Wakes every waker of `wakers`. A waker that panics does not keep the
/// others asleep (what they wait for has happened, and nothing later may
/// come to wake them): the rest are woken as its panic unwinds, and then
/// the panic goes on to the caller.
pub(crate) fn wake_all<I: Iterator<Item = Waker>>(wakers: impl IntoIterator<IntoIter = I>) {
    let mut rest = Unwoken(wakers.into_iter());
    for waker in rest.0.by_ref() {
        waker.wake();
    }
}

/// The wakers not woken yet. Its drop wakes them, which only a panicking
/// waker leaves it anything to do: the path without a panic pays nothing
/// for the guard but one look at an empty iterator.
struct Unwoken<I: Iterator<Item = Waker>>(I);

impl<I: Iterator<Item = Waker>> Drop for Unwoken<I> {
    fn drop(&mut self) {
        for waker in &mut self.0 {
            // Already unwinding: a second panic would abort the process,
            // so each is caught (the first panic is the one that goes on).
            let _ = catch_unwind(AssertUnwindSafe(|| waker.wake()));
        }
    }
}
