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
    /// Arms the channel as `f` says, on its device side, under the device
    /// lock; fails instead while [`SoftDevice::fail_arms`] says so.
    ///
    /// [`SoftDevice::fail_arms`]: super::SoftDevice::fail_arms
    fn with_source(&self, f: impl FnOnce(&mut EventSource)) -> Result<(), Error> {
        let mut state = self.shared.lock();
        if state.fail_arms > 0 {
            state.fail_arms -= 1;
            return Err(Error::Verbs {
                verb: "ibv_req_notify_cq",
                source: std::io::Error::other("the soft device was told to fail this arm"),
            });
        }
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
        // The socket is drained under the lock that raises events: a CQE
        // raising one between the count's reset and the drain would leave
        // an event counted and the channel unreadable, and a reactor
        // waiting for readability would miss it.
        let mut state = self.shared.lock();
        let cq = state
            .cq(self.cq)
            .ok_or(Error::Soft("completion queue destroyed"))?;
        let pending = cq
            .events
            .as_mut()
            .map_or(0, |e| std::mem::take(&mut e.pending));
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
        drop(state);
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

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Barrier;

    use super::super::SoftDevice;
    use super::*;

    /// Whether `fd` is readable now.
    fn readable(fd: i32) -> bool {
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, a count of one, no wait.
        let n = unsafe { libc::poll(&mut pfd, 1, 0) };
        n == 1 && pfd.revents & libc::POLLIN != 0
    }

    /// A CQE raising an event while `take` runs: afterwards the channel
    /// is readable exactly when an event is pending, so a reactor that
    /// waits for readability misses none.
    #[test]
    fn an_event_raised_during_take_stays_readable() {
        let dev = SoftDevice::new();
        let cq = dev.create_cq(16).unwrap();
        let events = channel(&dev.shared, cq.index).unwrap();
        let fd = events.as_fd().as_raw_fd();
        let rounds = 20_000;
        let round = Barrier::new(2);
        let done = Barrier::new(2);
        let raised = AtomicBool::new(false);
        let mut mismatch = None;
        std::thread::scope(|s| {
            s.spawn(|| {
                for _ in 0..rounds {
                    round.wait();
                    // Spinning rather than parking, so the CQE can land
                    // the moment `take` lets the lock go.
                    let mut state = loop {
                        if let Ok(state) = dev.shared.state.try_lock() {
                            break state;
                        }
                        std::hint::spin_loop();
                    };
                    let source = state.cq(cq.index).unwrap().events.as_mut().unwrap();
                    source.on_cqe(false);
                    raised.store(true, Ordering::Relaxed);
                    drop(state);
                    done.wait();
                }
            });
            for i in 0..rounds {
                events.arm().unwrap();
                round.wait();
                events.take().unwrap();
                done.wait();
                let pending = {
                    let mut state = dev.shared.lock();
                    state.cq(cq.index).unwrap().events.as_ref().unwrap().pending
                };
                // Noted, not asserted here: a panic would leave the other
                // thread at its barrier.
                if (pending > 0) != readable(fd) && mismatch.is_none() {
                    mismatch = Some(format!(
                        "round {i}: {pending} pending, the channel readable: {}",
                        readable(fd)
                    ));
                }
                // Back to nothing pending for the next round.
                events.take().unwrap();
            }
        });
        assert_eq!(mismatch, None);
        assert!(raised.load(Ordering::Relaxed));
    }
}
