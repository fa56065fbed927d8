//! The soft device's completion channel: a socket pair whose read end
//! becomes readable when an armed completion queue gets a CQE.

use std::io::{ErrorKind, Read, Write};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::Duration;

use super::Shared;
use crate::backend::CompletionEvents;
use crate::error::Error;

/// What the next CQE must be to raise an event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Armed {
    No,
    /// Any CQE.
    Any,
    /// A receive's CQE whose message asked for a solicited event, or an
    /// error's.
    Solicited,
}

/// The device side of a channel, kept with its completion queue.
pub(super) struct EventSource {
    writer: UnixStream,
    armed: Armed,
    pending: u64,
}

impl EventSource {
    /// Raises an event if armed for this CQE (one-shot): `solicited` if it
    /// wakes a channel armed for solicited events only.
    pub(super) fn on_cqe(&mut self, solicited: bool) {
        let raise = match self.armed {
            Armed::No => false,
            Armed::Any => true,
            Armed::Solicited => solicited,
        };
        if raise {
            self.armed = Armed::No;
            self.pending += 1;
            // A full socket buffer means the reader is readable already.
            let _ = (&self.writer).write(&[1]);
        }
    }
}

/// The consumer side of a soft completion queue's channel.
pub struct SoftEvents {
    shared: Arc<Shared>,
    cq: usize,
    reader: UnixStream,
}

impl std::fmt::Debug for SoftEvents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SoftEvents").field("cq", &self.cq).finish()
    }
}

pub(super) fn channel(shared: &Arc<Shared>, cq: usize) -> Result<SoftEvents, Error> {
    let io = |source| Error::Verbs {
        verb: "socketpair (soft completion channel)",
        source,
    };
    let (reader, writer) = UnixStream::pair().map_err(io)?;
    reader.set_nonblocking(true).map_err(io)?;
    writer.set_nonblocking(true).map_err(io)?;
    let mut state = shared.lock();
    let entry = state
        .cq(cq)
        .ok_or(Error::Soft("completion queue destroyed"))?;
    entry.events = Some(EventSource {
        writer,
        armed: Armed::No,
        pending: 0,
    });
    state.has_channels = true;
    Ok(SoftEvents {
        shared: Arc::clone(shared),
        cq,
        reader,
    })
}

impl AsFd for SoftEvents {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.reader.as_fd()
    }
}

impl SoftEvents {
    /// Runs `f` on the device side of this channel, under the device lock.
    fn with_source(&self, f: impl FnOnce(&mut EventSource)) -> Result<(), Error> {
        let mut state = self.shared.lock();
        let cq = state
            .cq(self.cq)
            .ok_or(Error::Soft("completion queue destroyed"))?;
        if let Some(events) = cq.events.as_mut() {
            f(events);
        }
        Ok(())
    }
}

impl CompletionEvents for SoftEvents {
    fn arm(&self) -> Result<(), Error> {
        self.with_source(|events| events.armed = Armed::Any)
    }

    fn arm_solicited(&self) -> Result<(), Error> {
        self.with_source(|events| {
            // Armed for any CQE already: that wider request stands.
            if events.armed == Armed::No {
                events.armed = Armed::Solicited;
            }
        })
    }

    fn take(&self) -> Result<usize, Error> {
        let pending = {
            let mut state = self.shared.lock();
            let cq = state
                .cq(self.cq)
                .ok_or(Error::Soft("completion queue destroyed"))?;
            cq.events
                .as_mut()
                .map_or(0, |e| std::mem::take(&mut e.pending))
        };
        let mut sink = [0u8; 64];
        loop {
            match (&self.reader).read(&mut sink) {
                Ok(0) => break,
                Ok(_) => continue,
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(source) => {
                    return Err(Error::Verbs {
                        verb: "read (soft completion channel)",
                        source,
                    })
                }
            }
        }
        Ok(pending as usize)
    }

    fn wait(&self, timeout: Duration) -> Result<bool, Error> {
        let state = self.shared.lock();
        let pending = |s: &mut super::DeviceState| {
            s.cq(self.cq)
                .and_then(|q| q.events.as_ref())
                .map_or(0, |e| e.pending)
        };
        let (mut state, _) = self
            .shared
            .events
            .wait_timeout_while(state, timeout, |s| pending(s) == 0)
            .unwrap_or_else(|p| p.into_inner());
        Ok(pending(&mut state) > 0)
    }
}
