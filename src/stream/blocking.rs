//! The blocking stream: std `Read` and `Write` over a ring of its own.

use std::io;
use std::net::{Shutdown, SocketAddr};
use std::time::{Duration, Instant};

use super::connection::{Connection, Failure, ReadOutcome, SendBuffer, SendError};
use super::StreamConfig;
use crate::backend::soft::{SoftDevice, SoftQp};
use crate::backend::{CompletionQueue, ProtectionDomain, QueuePair};
use crate::deadline::Deadline;
use crate::error::Error;
use crate::future::Wakeup;
use crate::ring::{Completion, Ring, RingConfig, RingStats};

/// How long one wait for a completion lasts before the stream looks at its
/// deadlines and keep-alive again.
const TICK: Duration = Duration::from_millis(20);

/// A connected byte stream over RDMA, blocking like `std::net::TcpStream`.
///
/// Make one with [`RdmaStream::connect`] / [`RdmaListener`](super::RdmaListener)
/// (TCP handshake), [`RdmaStream::connect_cm`] (rdma_cm),
/// [`RdmaStream::soft_pair`] (in-process), or, over any queue pair,
/// [`RdmaStream::prepare`] then [`PendingStream::establish`].
///
/// Dropping it sends what was written and the end of stream (waiting up
/// to [`StreamConfig::linger`]), then closes the ring.
pub struct RdmaStream<Q: QueuePair> {
    /// Taken out only by [`RdmaStream::into_async`].
    core: Option<StreamCore<Q>>,
    read_timeout: Option<Duration>,
    write_timeout: Option<Duration>,
    nonblocking: bool,
    pub(super) linger: Duration,
    pub(super) local_addr: Option<SocketAddr>,
    pub(super) peer_addr: Option<SocketAddr>,
}

/// The ring and the connection it carries, driven by blocking waits.
pub(super) struct StreamCore<Q: QueuePair> {
    pub(super) ring: Ring<Q>,
    pub(super) conn: Connection,
    scratch: Vec<Completion>,
}

impl<Q: QueuePair> StreamCore<Q> {
    /// Its ring and connection, apart.
    pub(super) fn into_parts(self) -> (Ring<Q>, Connection) {
        (self.ring, self.conn)
    }

    /// A ring and connection [`into_parts`](Self::into_parts) took apart.
    pub(super) fn from_parts(ring: Ring<Q>, conn: Connection) -> Self {
        StreamCore {
            ring,
            conn,
            scratch: Vec::new(),
        }
    }

    /// Reaps completions (waiting up to a tick for one if `block`), applies
    /// them, and pushes and submits whatever may go now.
    fn turn(&mut self, block: bool) {
        let mut reaped = self.ring.completion().reap(&mut self.scratch);
        if block && self.scratch.is_empty() && reaped.is_ok() {
            let wait = self.ring.completion().wait_into(1, &mut self.scratch);
            reaped = match wait {
                Err(Error::Timeout(_)) => Ok(0),
                Err(Error::WaitUnsatisfiable { .. }) => {
                    // Nothing can arrive any more: without a failure this
                    // would wait forever.
                    self.conn.fail(Failure::Transport(
                        "no receive is posted and nothing is in flight".into(),
                    ));
                    Ok(0)
                }
                other => other,
            };
        }
        // What was reaped is applied before a failure of the reap is
        // recorded: it came first, and a connection that has failed
        // drops the data it receives.
        for c in self.scratch.drain(..) {
            self.conn.on_completion(c);
        }
        match reaped {
            Ok(_) | Err(Error::UnknownWrId { .. }) => {}
            Err(e) => self.conn.fail(Failure::Transport(e.to_string())),
        }
        self.push_now();
    }

    /// Pushes and submits whatever may go now, without reaping.
    fn push_now(&mut self) {
        self.fail_qp_now();
        let mut sq = self.ring.submission();
        if self.conn.pump(&mut sq) {
            if let Err(e) = self.ring.submit() {
                // What the device refused was never posted: its buffers
                // are back in the pools, and the connection cannot go on
                // (a grant for a receive it refused may have gone out).
                self.conn.fail(Failure::Transport(e.error.to_string()));
                self.fail_qp_now();
            }
        }
    }

    /// Moves the queue pair to error once the connection failed.
    fn fail_qp_now(&mut self) {
        if self.conn.take_fail_qp() {
            if let Some(qp) = self.ring.default_qp() {
                let _ = self.ring.fail_qp(qp);
            }
        }
    }

    /// Sends what was written and the end of stream, and waits (up to
    /// `linger`) for them to leave, so that the ring's teardown does not
    /// flush them. Nothing will read what arrives meanwhile: it is
    /// dropped, and its buffers granted back, so a peer blocked writing
    /// to us goes on to read what we send.
    pub(super) fn linger(&mut self, linger: Duration) {
        if !self.conn.established() {
            // No end of stream can go to a peer that never said hello.
            return;
        }
        self.conn.shutdown_read();
        self.conn.shutdown_write();
        let deadline = Instant::now().checked_add(linger);
        loop {
            self.turn(false);
            let sent = self.conn.fin_done();
            if sent || self.conn.failure().is_some() {
                return;
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return;
            }
            self.turn(true);
        }
    }
}

/// A stream whose receives are posted but whose queue pair may not be
/// connected yet: connect it (see [`qp`](Self::qp)), then
/// [`establish`](Self::establish).
pub struct PendingStream<Q: QueuePair> {
    stream: RdmaStream<Q>,
    connect_timeout: Duration,
    /// The connect timeout from [`RdmaStream::prepare`] on, for the
    /// crate's listeners and `connect*`.
    deadline: Deadline,
}

impl<Q: QueuePair> PendingStream<Q> {
    /// The queue pair, to connect (e.g. `tcp::handshake`).
    pub fn qp(&self) -> &Q {
        self.stream.core().ring.qp()
    }

    /// When connecting gives up, counted from [`RdmaStream::prepare`]: the
    /// crate's own listeners and `connect*` bound the handshake and the
    /// hellos together by it.
    #[cfg_attr(not(feature = "verbs"), allow(dead_code))]
    pub(crate) fn deadline(&self) -> Deadline {
        self.deadline
    }

    /// Sends the hello and waits (up to the config's `connect_timeout`)
    /// for the peer's.
    pub fn establish(self) -> io::Result<RdmaStream<Q>> {
        let deadline = Deadline::after(self.connect_timeout);
        self.establish_by(deadline)
    }

    /// [`establish`](Self::establish) by the deadline counted from
    /// [`RdmaStream::prepare`], the one the handshake had.
    #[cfg_attr(not(feature = "verbs"), allow(dead_code))]
    pub(crate) fn establish_in_time(self) -> io::Result<RdmaStream<Q>> {
        let deadline = self.deadline;
        self.establish_by(deadline)
    }

    fn establish_by(mut self, deadline: Deadline) -> io::Result<RdmaStream<Q>> {
        self.start()?;
        self.finish(deadline)
    }

    fn start(&mut self) -> io::Result<()> {
        let core = self.stream.core_mut();
        core.conn.allow_hello();
        core.turn(false);
        Ok(())
    }

    fn finish(mut self, deadline: Deadline) -> io::Result<RdmaStream<Q>> {
        while !self.stream.core().conn.established() {
            if let Some(failure) = self.stream.core().conn.failure() {
                return Err(failure.to_io());
            }
            if deadline.expired() {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "the peer's stream hello did not come within the connect timeout ({:?})",
                        self.connect_timeout
                    ),
                ));
            }
            self.stream.core_mut().turn(true);
        }
        Ok(self.stream)
    }
}

impl<Q: QueuePair> RdmaStream<Q> {
    /// A stream over `qp` (with a completion queue of its own), its buffers
    /// registered in `pd`, which `qp` belongs to. Its receives are posted
    /// here, so connect the queue pair only now, then
    /// [`establish`](PendingStream::establish). `qp` must be made with
    /// [`StreamConfig::qp_config`] (or deeper queues): one with shallower
    /// queues, or a smaller completion queue, is refused with
    /// [`Error::Incompatible`].
    pub fn prepare(
        qp: Q,
        pd: &dyn ProtectionDomain,
        config: StreamConfig,
    ) -> Result<PendingStream<Q>, Error> {
        let deadline = Deadline::after(config.connect_timeout);
        // The hello promises the peer every receive buffer: a queue too
        // shallow to post them all would meet the peer's sends with
        // receiver-not-ready.
        let (caps, needed) = (qp.caps(), config.qp_config());
        if caps.max_recv_wr < needed.max_recv_wr || caps.max_send_wr < needed.max_send_wr {
            return Err(Error::Incompatible(
                "its queues are shallower than the stream's buffers need (make it with StreamConfig::qp_config)",
            ));
        }
        let mut conn = Connection::new(pd, &config)?;
        let ring = Ring::try_new(
            qp,
            RingConfig {
                wait_timeout: TICK,
                spin_polls: config.spin_polls,
                ..RingConfig::default()
            },
        )
        .map_err(|r| r.into_parts().0)?;
        // The ring posts a receive only with room for its completion, so a
        // smaller completion queue would leave receives the hello promises
        // unposted, and the peer's sends would meet receiver-not-ready.
        if ring.cq().entries() < needed.completion_entries() {
            return Err(Error::Incompatible(
                "its completion queue is smaller than the stream's queues need (make it with StreamConfig::qp_config)",
            ));
        }
        conn.set_max_inline(ring.caps().max_inline_data);
        conn.post_all_receives()?;
        let mut core = StreamCore {
            ring,
            conn,
            scratch: Vec::new(),
        };
        // Post the receives now: the peer may send as soon as the queue
        // pair is connected.
        let mut sq = core.ring.submission();
        core.conn.pump_receives(&mut sq);
        core.ring.submit().map_err(|e| e.error)?;
        let stream = RdmaStream {
            core: Some(core),
            read_timeout: None,
            write_timeout: None,
            nonblocking: false,
            linger: config.linger,
            local_addr: None,
            peer_addr: None,
        };
        Ok(PendingStream {
            stream,
            connect_timeout: config.connect_timeout,
            deadline,
        })
    }

    pub(super) fn core(&self) -> &StreamCore<Q> {
        self.core.as_ref().expect("present until into_async")
    }

    fn core_mut(&mut self) -> &mut StreamCore<Q> {
        self.core.as_mut().expect("present until into_async")
    }

    /// Waits for progress before `deadline` (or says why not).
    fn wait(&mut self, deadline: Option<Instant>, what: &str) -> io::Result<()> {
        if self.nonblocking {
            return Err(io::Error::new(
                io::ErrorKind::WouldBlock,
                format!("the stream is non-blocking and cannot {what} now"),
            ));
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("timed out: could not {what}"),
            ));
        }
        self.core_mut().turn(true);
        Ok(())
    }

    /// A send buffer to fill in place, saving the copy [`write`](io::Write::write)
    /// makes: for large messages, where the copy costs. It holds one
    /// message (up to the smaller of our and the peer's buffer size); waits
    /// (as a write does) while every send buffer is in use. If the caller
    /// holds every one (taken, not sent), this and a write fail with
    /// `InvalidInput` instead of waiting for ever.
    ///
    /// ```
    /// use std::io::Read;
    /// # use rdma_ring::backend::soft::SoftDevice;
    /// # use rdma_ring::stream::{RdmaStream, StreamConfig};
    /// # let (mut a, mut b) = RdmaStream::soft_pair(&SoftDevice::new(), StreamConfig::default()).unwrap();
    /// let mut buf = a.send_buffer().unwrap();
    /// buf[..5].copy_from_slice(b"zero!");
    /// a.send(buf, 5).unwrap();
    /// let mut got = [0u8; 5];
    /// b.read_exact(&mut got).unwrap();
    /// assert_eq!(&got, b"zero!");
    /// ```
    pub fn send_buffer(&mut self) -> io::Result<SendBuffer> {
        let deadline = deadline_after(self.write_timeout);
        let mut reaped = false;
        loop {
            let core = self.core_mut();
            if let Some(buf) = core.conn.take_send_buffer()? {
                return Ok(buf);
            }
            if reaped {
                self.wait(
                    deadline,
                    "get a send buffer: the peer has not read what was sent",
                )?;
            } else {
                core.turn(false);
                reaped = true;
            }
        }
    }

    /// Sends the first `len` bytes of `buf` as the next message, after
    /// everything written before.
    ///
    /// A refusal hands the buffer back inside the [`SendError`], with the
    /// bytes filled into it: when `len` exceeds the buffer
    /// (`InvalidInput`), when the buffer is another stream's
    /// (`InvalidInput`), when writing was shut down (`BrokenPipe`), or when
    /// the connection failed (its error).
    pub fn send(&mut self, buf: SendBuffer, len: usize) -> Result<(), SendError> {
        let core = self.core_mut();
        core.conn.queue_send_buffer(buf, len)?;
        core.push_now();
        Ok(())
    }

    /// Bounds each blocking read (`None`: wait as long as it takes); a read
    /// that runs out of time fails with `TimedOut` (and loses nothing).
    /// Zero is refused, as `std::net::TcpStream` does.
    pub fn set_read_timeout(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        self.read_timeout = check_timeout(timeout)?;
        Ok(())
    }

    /// Bounds each blocking write and flush.
    pub fn set_write_timeout(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        self.write_timeout = check_timeout(timeout)?;
        Ok(())
    }

    /// The read timeout.
    pub fn read_timeout(&self) -> Option<Duration> {
        self.read_timeout
    }

    /// The write timeout.
    pub fn write_timeout(&self) -> Option<Duration> {
        self.write_timeout
    }

    /// Non-blocking reads and writes return `WouldBlock` instead of waiting.
    pub fn set_nonblocking(&mut self, nonblocking: bool) {
        self.nonblocking = nonblocking;
    }

    /// Ends writing, reading, or both. Ending writing waits, as
    /// [`flush`](std::io::Write::flush) does, until everything written and
    /// the end of stream are with the device (the peer reads the end of
    /// stream after those bytes); ending reading drops bytes not read yet
    /// and any that arrive.
    ///
    /// Ending writing returns at once, though, when the end of stream
    /// cannot go yet while bytes the peer sent wait here unread: the peer
    /// may be waiting for us to read before it takes more (two sides that
    /// each write, shut down and then read would otherwise wait on each
    /// other for ever).
    /// The rest of what was written, then the end of stream, goes out as
    /// later reads make room, or in the drop's linger, as TCP's would.
    /// A non-blocking stream never waits here: writing ends at once, and
    /// the rest goes out so as later calls (a read, a flush) make room.
    pub fn shutdown(&mut self, how: Shutdown) -> io::Result<()> {
        if matches!(how, Shutdown::Read | Shutdown::Both) {
            self.core_mut().conn.shutdown_read();
        }
        if matches!(how, Shutdown::Write | Shutdown::Both) {
            self.core_mut().conn.shutdown_write();
            let deadline = deadline_after(self.write_timeout);
            loop {
                let core = self.core_mut();
                core.turn(false);
                // Before the end of stream's own check: it counts as sent
                // once pushed, and a post the device refused fails the
                // connection instead.
                if let Some(failure) = core.conn.failure() {
                    return Err(failure.to_io());
                }
                if core.conn.fin_sent() {
                    break;
                }
                // Non-blocking, it is done once recorded: writing has ended
                // either way, so `WouldBlock` would say what is not so.
                if core.conn.readable() > 0 || self.nonblocking {
                    break;
                }
                self.wait(
                    deadline,
                    "send the end of stream: the peer has not read what was sent",
                )?;
            }
        }
        self.core_mut().turn(false);
        Ok(())
    }

    /// The peer's address (TCP handshake and rdma_cm connections).
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.peer_addr.ok_or_else(no_address)
    }

    /// Our address (TCP handshake and rdma_cm connections).
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.local_addr.ok_or_else(no_address)
    }

    /// Bytes received and not read yet.
    pub fn readable(&self) -> usize {
        self.core().conn.readable()
    }

    /// What the stream's ring did (doorbells, work requests, completions).
    pub fn ring_stats(&self) -> RingStats {
        self.core().ring.stats()
    }

    /// The same connection as an [`AsyncRdmaStream`](super::AsyncRdmaStream),
    /// woken as `wakeup` says. If that wake-up cannot be had (a completion
    /// queue without a channel, for [`Wakeup::Reactor`] or
    /// [`Wakeup::Thread`], or no thread to be had for the latter's
    /// notifier), the error comes back and the stream closes as a dropped
    /// one does: what was written is delivered, then the end of stream.
    pub fn into_async(self, wakeup: Wakeup) -> io::Result<super::AsyncRdmaStream<Q>>
    where
        Q: Send + 'static,
    {
        super::AsyncRdmaStream::from_blocking(self, wakeup)
    }

    /// Takes the ring and connection out, without lingering.
    pub(super) fn into_core(mut self) -> (StreamCore<Q>, Duration) {
        (
            self.core.take().expect("present until into_async"),
            self.linger,
        )
    }
}

impl RdmaStream<SoftQp> {
    /// Two connected streams on the in-process soft device.
    ///
    /// ```
    /// use std::io::{Read, Write};
    /// use rdma_ring::backend::soft::SoftDevice;
    /// use rdma_ring::stream::{RdmaStream, StreamConfig};
    /// let (mut a, mut b) = RdmaStream::soft_pair(&SoftDevice::new(), StreamConfig::default()).unwrap();
    /// b.write_all(b"pong").unwrap();
    /// let mut got = [0u8; 4];
    /// a.read_exact(&mut got).unwrap();
    /// assert_eq!(&got, b"pong");
    /// ```
    pub fn soft_pair(
        dev: &SoftDevice,
        config: StreamConfig,
    ) -> io::Result<(RdmaStream<SoftQp>, RdmaStream<SoftQp>)> {
        let (pd_a, pd_b) = (dev.alloc_pd(), dev.alloc_pd());
        let qp_config = config.qp_config();
        let qa = dev.create_qp(&pd_a, qp_config).map_err(to_io)?;
        let qb = dev.create_qp(&pd_b, qp_config).map_err(to_io)?;
        let mut a = RdmaStream::prepare(qa, &pd_a, config).map_err(to_io)?;
        let mut b = RdmaStream::prepare(qb, &pd_b, config).map_err(to_io)?;
        dev.connect(a.qp(), b.qp()).map_err(to_io)?;
        a.start()?;
        b.start()?;
        let (deadline_a, deadline_b) = (a.deadline, b.deadline);
        let a = a.finish(deadline_a)?;
        let b = b.finish(deadline_b)?;
        Ok((a, b))
    }
}

fn check_timeout(timeout: Option<Duration>) -> io::Result<Option<Duration>> {
    if timeout == Some(Duration::ZERO) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "a zero timeout is not allowed (use set_nonblocking)",
        ));
    }
    Ok(timeout)
}

fn no_address() -> io::Error {
    io::Error::new(
        io::ErrorKind::AddrNotAvailable,
        "this stream was not connected over an IP address",
    )
}

pub(super) fn to_io(e: Error) -> io::Error {
    let kind = match &e {
        Error::Timeout(_) | Error::HandshakeTimeout { .. } => io::ErrorKind::TimedOut,
        Error::Handshake { .. } => io::ErrorKind::ConnectionRefused,
        Error::NoSuchDevice(_) => io::ErrorKind::NotFound,
        _ => io::ErrorKind::Other,
    };
    io::Error::new(kind, e)
}

fn deadline_after(timeout: Option<Duration>) -> Option<Instant> {
    timeout.and_then(|t| Instant::now().checked_add(t))
}

impl<Q: QueuePair> io::Read for RdmaStream<Q> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let deadline = deadline_after(self.read_timeout);
        // Bytes already received are read without asking the device; only
        // when there are none does it reap, then wait.
        let mut reaped = false;
        loop {
            let core = self.core_mut();
            match core.conn.read(buf)? {
                ReadOutcome::Bytes(n) => {
                    // Post the emptied buffers again (and grant them).
                    core.push_now();
                    return Ok(n);
                }
                ReadOutcome::End => {
                    // Still move the connection along (after a read-side
                    // shutdown, arriving bytes are dropped as they come).
                    if !reaped {
                        core.turn(false);
                    }
                    return Ok(0);
                }
                ReadOutcome::Empty if !reaped => {
                    core.turn(false);
                    reaped = true;
                }
                ReadOutcome::Empty => self.wait(deadline, "read")?,
            }
        }
    }
}

impl<Q: QueuePair> io::Write for RdmaStream<Q> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let deadline = deadline_after(self.write_timeout);
        let mut reaped = false;
        loop {
            let core = self.core_mut();
            let n = core.conn.write(buf)?;
            if n > 0 {
                core.push_now();
                return Ok(n);
            }
            if reaped {
                self.wait(deadline, "write: the peer has not read what was sent")?;
            } else {
                // Sends that completed give their buffers back.
                core.turn(false);
                reaped = true;
            }
        }
    }

    /// Waits until every byte written is with the device — which waits for
    /// the peer's reader when its buffers are full — but not until the peer
    /// read them.
    fn flush(&mut self) -> io::Result<()> {
        let deadline = deadline_after(self.write_timeout);
        loop {
            let core = self.core_mut();
            core.turn(false);
            if let Some(failure) = core.conn.failure() {
                return Err(failure.to_io());
            }
            if !core.conn.unsent() {
                return Ok(());
            }
            self.wait(deadline, "flush: the peer has not read what was sent")?;
        }
    }
}

impl<Q: QueuePair> Drop for RdmaStream<Q> {
    fn drop(&mut self) {
        let linger = self.linger;
        if let Some(core) = &mut self.core {
            core.linger(linger);
        }
    }
}

impl<Q: QueuePair> std::fmt::Debug for RdmaStream<Q> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdmaStream")
            .field("connection", &self.core.as_ref().map(|c| &c.conn))
            .field("ring", &self.core.as_ref().map(|c| &c.ring))
            .field("peer_addr", &self.peer_addr)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handshake_that_timed_out_is_timed_out_not_refused() {
        let timed_out = to_io(Error::HandshakeTimeout {
            step: "waiting for an rdma_cm event",
            reason: "no event within 1s".into(),
        });
        assert_eq!(timed_out.kind(), io::ErrorKind::TimedOut);
        let refused = to_io(Error::Handshake {
            step: "reading the peer's endpoint",
            reason: "bad magic".into(),
        });
        assert_eq!(refused.kind(), io::ErrorKind::ConnectionRefused);
    }
}
