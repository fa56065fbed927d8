//! Wakes waiting calls at their deadlines when nothing else would. Under
//! [`Wakeup::Reactor`](crate::future::Wakeup::Reactor) a call's task is
//! woken only through the completion descriptor, so a call that gets no
//! answer (a server whose handler never finishes, or that died after its
//! device took the request) would never see its timeout pass. One thread
//! for the process, started on first use, sleeps until the earliest
//! deadline and wakes that client's waiting calls, which then find their
//! time is up.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::sync::{Arc, Condvar, Mutex, OnceLock, Weak};
use std::task::Wake;
use std::time::Instant;

use super::waking::CallWakers;

/// A deadline, and whose calls to wake at it.
struct Due {
    at: Instant,
    /// Orders deadlines that fall at the same instant.
    seq: u64,
    wakers: Weak<CallWakers>,
}

impl PartialEq for Due {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}

impl Eq for Due {}

impl PartialOrd for Due {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Due {
    /// Reversed, so the heap's top is the earliest deadline.
    fn cmp(&self, other: &Self) -> Ordering {
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

#[derive(Default)]
struct Deadlines {
    heap: BinaryHeap<Due>,
    next_seq: u64,
}

#[derive(Default)]
struct Timer {
    deadlines: Mutex<Deadlines>,
    changed: Condvar,
}

impl Timer {
    fn run(&self) {
        let mut deadlines = self.deadlines.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            let Some(at) = deadlines.heap.peek().map(|due| due.at) else {
                deadlines = self
                    .changed
                    .wait(deadlines)
                    .unwrap_or_else(|p| p.into_inner());
                continue;
            };
            let now = Instant::now();
            if at > now {
                deadlines = self
                    .changed
                    .wait_timeout(deadlines, at - now)
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
                continue;
            }
            let due = deadlines.heap.pop().expect("peeked");
            // Wakers run unlocked: one may poll its task inline.
            drop(deadlines);
            if let Some(wakers) = due.wakers.upgrade() {
                wakers.wake_by_ref();
            }
            deadlines = self.deadlines.lock().unwrap_or_else(|p| p.into_inner());
        }
    }
}

/// Wakes the calls waiting on `wakers` at `at` (if the client is still
/// there). If the timer thread cannot be started, nothing wakes them: the
/// caller's own wake-ups remain.
pub(super) fn wake_at(at: Instant, wakers: &Arc<CallWakers>) {
    static TIMER: OnceLock<Arc<Timer>> = OnceLock::new();
    let timer = TIMER.get_or_init(|| {
        let timer = Arc::new(Timer::default());
        let runs = Arc::clone(&timer);
        let _ = std::thread::Builder::new()
            .name("rdma-ring-rpc-timer".into())
            .spawn(move || runs.run());
        timer
    });
    let mut deadlines = timer.deadlines.lock().unwrap_or_else(|p| p.into_inner());
    let seq = deadlines.next_seq;
    deadlines.next_seq += 1;
    deadlines.heap.push(Due {
        at,
        seq,
        wakers: Arc::downgrade(wakers),
    });
    drop(deadlines);
    timer.changed.notify_one();
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};
    use std::task::Waker;
    use std::time::Duration;

    struct Flag(AtomicBool);

    impl Wake for Flag {
        fn wake(self: Arc<Self>) {
            self.0.store(true, AtomicOrdering::SeqCst);
        }
    }

    #[test]
    fn the_earliest_deadline_wakes_first_and_only_at_its_time() {
        let (early, late) = (
            Arc::new(CallWakers::default()),
            Arc::new(CallWakers::default()),
        );
        let (early_flag, late_flag) = (
            Arc::new(Flag(AtomicBool::new(false))),
            Arc::new(Flag(AtomicBool::new(false))),
        );
        early.register(1, &Waker::from(Arc::clone(&early_flag)));
        late.register(1, &Waker::from(Arc::clone(&late_flag)));
        let start = Instant::now();
        wake_at(start + Duration::from_secs(30), &late);
        wake_at(start + Duration::from_millis(50), &early);
        while !early_flag.0.load(AtomicOrdering::SeqCst) {
            assert!(start.elapsed() < Duration::from_secs(10), "never woken");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(start.elapsed() >= Duration::from_millis(50), "woken early");
        assert!(!late_flag.0.load(AtomicOrdering::SeqCst));
    }
}
