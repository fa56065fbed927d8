//! A waker that unparks a thread: for the threads that run futures or wait
//! for wake-ups themselves (the RPC client's driver, the session pump).

use std::sync::Arc;
use std::task::Wake;

/// Wakes a parked thread.
pub(crate) struct ThreadWaker(pub(crate) std::thread::Thread);

impl Wake for ThreadWaker {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}
