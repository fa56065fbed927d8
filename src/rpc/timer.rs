//! Wakes waiting calls at their deadlines when nothing else would. Under
//! [`Wakeup::Reactor`](crate::future::Wakeup::Reactor) a call's task is
//! woken only through the completion descriptor, so a call that gets no
//! answer (a server whose handler never finishes, or that died after its
//! device took the request) would never see its timeout pass. One thread
//! for the process, started on first use, sleeps until the earliest
//! deadline and tells its client, which wakes its waiting calls; they
//! find whether their time is up. A client keeps about one deadline here
//! at a time (its earliest), not one per call.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::sync::{Arc, Condvar, Mutex, OnceLock, Weak};
use std::time::Instant;

/// Whom a deadline is for.
pub(super) trait Target: Send + Sync {
    /// Deadline `at` passed.
    fn fired(&self, at: Instant);
}

/// A deadline, and whom to tell at it.
struct Due {
    at: Instant,
    /// Orders deadlines that fall at the same instant.
    seq: u64,
    target: Weak<dyn Target>,
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
            // Told unlocked: it wakes tasks, and one may run inline.
            drop(deadlines);
            if let Some(target) = due.target.upgrade() {
                target.fired(due.at);
            }
            deadlines = self.deadlines.lock().unwrap_or_else(|p| p.into_inner());
        }
    }
}

/// Tells `target` at `at` (if it is still there). Returns false, keeping
/// nothing, if the timer thread could not be started.
pub(super) fn tell_at(at: Instant, target: Weak<dyn Target>) -> bool {
    static TIMER: OnceLock<Option<Arc<Timer>>> = OnceLock::new();
    let timer = TIMER.get_or_init(|| {
        let timer = Arc::new(Timer::default());
        let runs = Arc::clone(&timer);
        std::thread::Builder::new()
            .name("rdma-ring-rpc-timer".into())
            .spawn(move || runs.run())
            .ok()
            .map(|_| timer)
    });
    let Some(timer) = timer else {
        return false;
    };
    let mut deadlines = timer.deadlines.lock().unwrap_or_else(|p| p.into_inner());
    let seq = deadlines.next_seq;
    deadlines.next_seq += 1;
    deadlines.heap.push(Due { at, seq, target });
    drop(deadlines);
    timer.changed.notify_one();
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use std::time::Duration;

    #[derive(Default)]
    struct Told(Mutex<Vec<Instant>>);

    impl Target for Told {
        fn fired(&self, at: Instant) {
            self.0.lock().unwrap().push(at);
        }
    }

    #[test]
    fn the_earliest_deadline_is_told_first_and_only_at_its_time() {
        let (early, late) = (Arc::new(Told::default()), Arc::new(Told::default()));
        let start = Instant::now();
        let (soon, later) = (
            start + Duration::from_millis(50),
            start + Duration::from_secs(30),
        );
        let weak = |t: &Arc<Told>| -> Weak<dyn Target> {
            let t: Arc<dyn Target> = t.clone();
            Arc::downgrade(&t)
        };
        assert!(tell_at(later, weak(&late)));
        assert!(tell_at(soon, weak(&early)));
        while early.0.lock().unwrap().is_empty() {
            assert!(start.elapsed() < Duration::from_secs(10), "never told");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(Instant::now() >= soon, "told early");
        assert_eq!(*early.0.lock().unwrap(), [soon]);
        assert!(late.0.lock().unwrap().is_empty());
    }
}
