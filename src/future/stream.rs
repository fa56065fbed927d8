//! [`CompletionStream`]: completions of operations pushed for the queue.

use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures_core::Stream;

use super::{Shared, Wakeup};
use crate::backend::QueuePair;
use crate::ring::Completion;

/// The completions of operations pushed through [`AsyncRing::with_ring`](crate::future::AsyncRing::with_ring).
pub struct CompletionStream<Q: QueuePair> {
    pub(super) shared: Arc<Shared<Q>>,
}

impl<Q: QueuePair> Stream for CompletionStream<Q> {
    type Item = Completion;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Completion>> {
        let polled = self.shared.with(|ring| {
            let _ = ring.dispatch();
            if let Some(c) = ring.pop_ready() {
                return Poll::Ready(Some(c));
            }
            if ring.stream_ended() {
                return Poll::Ready(None);
            }
            ring.set_ready_waker(cx.waker());
            Poll::Pending
        });
        if polled.is_pending() && self.shared.wakeup == Wakeup::Busy {
            cx.waker().wake_by_ref();
        }
        polled
    }
}

impl<Q: QueuePair> fmt::Debug for CompletionStream<Q> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompletionStream").finish_non_exhaustive()
    }
}
