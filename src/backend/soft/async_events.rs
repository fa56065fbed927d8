//! The soft device's asynchronous event channel: a queue of events and a
//! socket pair whose read end is readable while events are pending.

use std::collections::VecDeque;
use std::io::{ErrorKind, Read, Write};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::Duration;

use super::Shared;
use crate::backend::{AsyncEvent, AsyncEventSource};
use crate::error::Error;

/// Events kept while nobody reads them, at most; older ones are dropped
/// (a kernel's event queue is bounded too).
const MAX_QUEUED: usize = 4096;

/// The device side: pending events and the writer that wakes readers.
#[derive(Default)]
pub(super) struct AsyncEventQueue {
    queue: VecDeque<AsyncEvent>,
    writer: Option<UnixStream>,
}

impl AsyncEventQueue {
    pub(super) fn raise(&mut self, event: AsyncEvent) {
        if self.queue.len() >= MAX_QUEUED {
            self.queue.pop_front();
        }
        self.queue.push_back(event);
        if let Some(writer) = &self.writer {
            // A full socket buffer means the reader is readable already.
            let _ = (&*writer).write(&[1]);
        }
    }
}

/// The reader of a soft device's asynchronous events: readable (for a
/// reactor) while events are pending. A device has one reader at a time;
/// opening another replaces it, as events go to one consumer.
pub struct SoftAsyncEvents {
    shared: Arc<Shared>,
    reader: UnixStream,
}

impl std::fmt::Debug for SoftAsyncEvents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SoftAsyncEvents").finish_non_exhaustive()
    }
}

pub(super) fn open(shared: &Arc<Shared>) -> Result<SoftAsyncEvents, Error> {
    let io = |source| Error::Verbs {
        verb: "socketpair (soft async event channel)",
        source,
    };
    let (reader, writer) = UnixStream::pair().map_err(io)?;
    reader.set_nonblocking(true).map_err(io)?;
    writer.set_nonblocking(true).map_err(io)?;
    let mut state = shared.lock();
    if !state.async_events.queue.is_empty() {
        let _ = (&writer).write(&[1]);
    }
    state.async_events.writer = Some(writer);
    state.has_channels = true;
    Ok(SoftAsyncEvents {
        shared: Arc::clone(shared),
        reader,
    })
}

impl SoftAsyncEvents {
    fn drain_wakeups(&self) {
        let mut sink = [0u8; 64];
        loop {
            match (&self.reader).read(&mut sink) {
                Ok(n) if n > 0 => continue,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                _ => break,
            }
        }
    }
}

impl AsFd for SoftAsyncEvents {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.reader.as_fd()
    }
}

impl AsyncEventSource for SoftAsyncEvents {
    fn next_event(&self) -> Result<Option<AsyncEvent>, Error> {
        let mut state = self.shared.lock();
        let event = state.async_events.queue.pop_front();
        if state.async_events.queue.is_empty() {
            self.drain_wakeups();
        }
        Ok(event)
    }

    fn wait(&self, timeout: Duration) -> Result<bool, Error> {
        let state = self.shared.lock();
        let (state, _) = self
            .shared
            .events
            .wait_timeout_while(state, timeout, |s| s.async_events.queue.is_empty())
            .unwrap_or_else(|p| p.into_inner());
        Ok(!state.async_events.queue.is_empty())
    }
}
