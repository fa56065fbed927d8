//! The async handlers' futures, polled by the server's poller thread
//! between passes over the completion queue: a tiny executor with a wake
//! list, no threads of its own.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};

use super::handler::{HandlerError, ResponseFuture};

/// A future in flight, with what its result answers.
struct Task<T> {
    future: ResponseFuture,
    tag: T,
    waker: Waker,
}

/// Indexes of tasks woken since the last poll.
#[derive(Default)]
struct WakeList {
    woken: Mutex<Vec<usize>>,
    any: AtomicBool,
}

struct TaskWaker {
    index: usize,
    list: Arc<WakeList>,
}

impl Wake for TaskWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.list
            .woken
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(self.index);
        self.list.any.store(true, Ordering::Release);
    }
}

/// What a finished task produced: the handler's result, or a panic's text.
pub(super) type Outcome = Result<Result<Vec<u8>, HandlerError>, String>;

/// The pending futures, each tagged with what it answers.
pub(super) struct Tasks<T> {
    slots: Vec<Option<Task<T>>>,
    free: Vec<usize>,
    list: Arc<WakeList>,
    live: usize,
}

impl<T> Tasks<T> {
    pub(super) fn new() -> Self {
        Tasks {
            slots: Vec::new(),
            free: Vec::new(),
            list: Arc::default(),
            live: 0,
        }
    }

    /// Futures not finished yet.
    pub(super) fn len(&self) -> usize {
        self.live
    }

    /// Whether some future was woken since the last [`run`](Self::run).
    pub(super) fn woken(&self) -> bool {
        self.list.any.load(Ordering::Acquire)
    }

    /// Adds a future and polls it once.
    pub(super) fn spawn(&mut self, future: ResponseFuture, tag: T, done: &mut Vec<(T, Outcome)>) {
        let index = self.free.pop().unwrap_or_else(|| {
            self.slots.push(None);
            self.slots.len() - 1
        });
        let waker = Waker::from(Arc::new(TaskWaker {
            index,
            list: Arc::clone(&self.list),
        }));
        self.slots[index] = Some(Task { future, tag, waker });
        self.live += 1;
        self.poll_one(index, done);
    }

    /// Drops the futures whose tag matches, unfinished; returns their
    /// tags.
    pub(super) fn cancel(&mut self, mut matches: impl FnMut(&T) -> bool) -> Vec<T> {
        let mut cancelled = Vec::new();
        for (index, slot) in self.slots.iter_mut().enumerate() {
            if slot.as_ref().is_some_and(|task| matches(&task.tag)) {
                cancelled.push(slot.take().expect("checked").tag);
                self.free.push(index);
                self.live -= 1;
            }
        }
        cancelled
    }

    /// Polls every woken future; finished ones are appended to `done`.
    pub(super) fn run(&mut self, done: &mut Vec<(T, Outcome)>) {
        if !self.list.any.swap(false, Ordering::AcqRel) {
            return;
        }
        let woken = std::mem::take(&mut *self.list.woken.lock().unwrap_or_else(|p| p.into_inner()));
        for index in woken {
            self.poll_one(index, done);
        }
    }

    fn poll_one(&mut self, index: usize, done: &mut Vec<(T, Outcome)>) {
        // A stale wake of a finished (or reused) slot polls at most once
        // more, which futures allow.
        let Some(task) = self.slots.get_mut(index).and_then(Option::as_mut) else {
            return;
        };
        let mut cx = Context::from_waker(&task.waker);
        let future = &mut task.future;
        let polled = catch_unwind(AssertUnwindSafe(|| future.as_mut().poll(&mut cx)));
        let outcome = match polled {
            Ok(Poll::Pending) => return,
            Ok(Poll::Ready(result)) => Ok(result),
            Err(panic) => Err(panic_text(&*panic)),
        };
        let task = self.slots[index].take().expect("present");
        self.free.push(index);
        self.live -= 1;
        done.push((task.tag, outcome));
    }
}

/// A panic payload's message, when it has one.
pub(super) fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_futures_finish_at_spawn_and_woken_ones_on_run() {
        let mut tasks = Tasks::new();
        let mut done = Vec::new();
        tasks.spawn(Box::pin(async { Ok(b"now".to_vec()) }), 1u32, &mut done);
        assert_eq!(done.len(), 1);
        let (tx, rx) = futures::channel::oneshot::channel::<Vec<u8>>();
        tasks.spawn(
            Box::pin(async move { Ok(rx.await.unwrap_or_default()) }),
            2u32,
            &mut done,
        );
        assert_eq!((done.len(), tasks.len()), (1, 1));
        assert!(!tasks.woken());
        tx.send(b"later".to_vec()).unwrap();
        assert!(tasks.woken());
        tasks.run(&mut done);
        assert_eq!(done[1].0, 2);
        assert_eq!(done[1].1, Ok(Ok(b"later".to_vec())));
        assert_eq!(tasks.len(), 0);
    }

    #[test]
    fn a_panicking_future_is_reported_not_propagated() {
        let mut tasks = Tasks::new();
        let mut done = Vec::new();
        tasks.spawn(Box::pin(async { panic!("handler bug") }), (), &mut done);
        assert_eq!(done[0].1, Err("handler bug".to_string()));
    }
}
