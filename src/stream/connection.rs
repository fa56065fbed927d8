//! One stream connection's buffers and state, between the user's reads and
//! writes and the ring: what to post, and what each completion means. The
//! blocking and the async stream both drive it; neither knows the rules.

use std::collections::VecDeque;
use std::io;
use std::time::{Duration, Instant};

use super::flow::{Flow, Limits, Received};
use super::frame::{self, Header, Hello, Kind};
use super::StreamConfig;
use crate::backend::{ProtectionDomain, QueuePair, WcStatus};
use crate::buf::{BaseBuf, BufferPool, ExposedBuf, PoolChunk, RemoteAccess, RemoteSlice};
use crate::op::{Read, Recv, SendImm};
use crate::ring::{Completion, SubmissionQueue};
use crate::Error;

/// `user_data` of the stream's operations.
const RECV: u64 = 1;
const DATA: u64 = 2;
const CONTROL: u64 = 3;
const PROBE: u64 = 4;
/// The end of stream's send: a control message, told apart because an
/// async close is fine only if it (and the data before it) arrived.
const FIN: u64 = 5;

/// Bytes of each control buffer (hello, credit, FIN, probe target).
const CONTROL_CHUNK: usize = 64;

/// Why a connection cannot go on.
#[derive(Clone, Debug)]
pub(crate) enum Failure {
    /// The peer broke the protocol.
    Protocol(String),
    /// The device reported a failed work request: the peer is gone or
    /// unreachable, or the queue pair failed.
    Transport(String),
}

impl Failure {
    pub(crate) fn to_io(&self) -> io::Error {
        match self {
            Failure::Protocol(why) => io::Error::new(
                io::ErrorKind::InvalidData,
                format!("the peer broke the stream protocol: {why}; the connection is closed"),
            ),
            Failure::Transport(why) => io::Error::new(
                io::ErrorKind::ConnectionReset,
                format!("the connection failed: {why}"),
            ),
        }
    }
}

/// A received data buffer the reader has not emptied yet.
struct Inbound {
    chunk: PoolChunk,
    len: usize,
    taken: usize,
}

/// A registered send buffer of a stream, filled in place: the bytes
/// written into it go to the device with no copy. Get one with
/// [`RdmaStream::send_buffer`](super::RdmaStream::send_buffer) and send it
/// with [`RdmaStream::send`](super::RdmaStream::send); dropped unsent, it
/// goes back to the stream's pool.
pub struct SendBuffer {
    chunk: PoolChunk,
    limit: usize,
    /// The connection it belongs to.
    owner: u64,
}

impl std::ops::Deref for SendBuffer {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.chunk[..self.limit]
    }
}

impl std::ops::DerefMut for SendBuffer {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.chunk[..self.limit]
    }
}

impl std::fmt::Debug for SendBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SendBuffer")
            .field("len", &self.limit)
            .finish()
    }
}

/// A send buffer that [`RdmaStream::send`](super::RdmaStream::send)
/// refused, handed back with the reason, so the bytes filled into it are
/// not lost: send it again (to its own stream, or with a length that
/// fits), copy its bytes out, or drop it (it goes back to its pool).
///
/// Converts into the [`io::Error`] it carries, so `?` works in a function
/// that returns `io::Result`.
///
/// ```
/// # use rdma_ring::backend::soft::SoftDevice;
/// # use rdma_ring::stream::{RdmaStream, StreamConfig};
/// # let dev = SoftDevice::new();
/// # let (mut a, _b) = RdmaStream::soft_pair(&dev, StreamConfig::default()).unwrap();
/// let mut buf = a.send_buffer().unwrap();
/// let fits = buf.len();
/// buf[..3].copy_from_slice(b"abc");
/// let refused = a.send(buf, fits + 1).unwrap_err();
/// assert_eq!(refused.error().kind(), std::io::ErrorKind::InvalidInput);
/// let buf = refused.into_buffer();
/// assert_eq!(&buf[..3], b"abc"); // nothing lost: send what fits
/// a.send(buf, 3).unwrap();
/// ```
pub struct SendError {
    error: io::Error,
    buf: SendBuffer,
}

impl SendError {
    /// Why the buffer was refused.
    pub fn error(&self) -> &io::Error {
        &self.error
    }

    /// The refused buffer, with the bytes filled into it.
    pub fn into_buffer(self) -> SendBuffer {
        self.buf
    }

    /// Both the reason and the buffer.
    pub fn into_parts(self) -> (io::Error, SendBuffer) {
        (self.error, self.buf)
    }
}

impl std::fmt::Debug for SendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SendError")
            .field("error", &self.error)
            .field("buf", &self.buf)
            .finish()
    }
}

impl std::fmt::Display for SendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "send buffer refused: {}", self.error)
    }
}

impl std::error::Error for SendError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

impl From<SendError> for io::Error {
    fn from(refused: SendError) -> io::Error {
        refused.error
    }
}

/// What a read found.
pub(crate) enum ReadOutcome {
    /// This many bytes were copied (at least one).
    Bytes(usize),
    /// The peer ended the stream and every byte before it was read.
    End,
    /// Nothing to read yet.
    Empty,
}

pub(crate) struct Connection {
    /// Tells this connection's send buffers from others'.
    id: u64,
    flow: Flow,
    recv_pool: BufferPool,
    send_pool: BufferPool,
    control_pool: BufferPool,
    /// The 8 bytes the peer may read to see that we are alive. Never read
    /// or written locally; kept exposed while the connection lives.
    probe_pad: ExposedBuf<Vec<u8>>,
    peer_probe: Option<RemoteSlice>,
    /// Receive buffers to post, and whether posting each grants the peer a
    /// message (a data, FIN or hello buffer) or not (an answer's).
    to_post: Vec<(PoolChunk, bool)>,
    /// The buffer being filled by writes, and how much of it is.
    staging: Option<(PoolChunk, usize)>,
    /// Filled buffers waiting for a grant, in order.
    outbox: VecDeque<(PoolChunk, usize)>,
    inbox: VecDeque<Inbound>,
    /// Data sends and the end of stream's posted and not completed: what
    /// a close waits for (credits and probes carry nothing the peer's
    /// reader needs).
    data_in_flight: usize,
    /// Whether a data send or the end of stream's failed: what was
    /// written, or the end of stream, may not have arrived.
    sends_lost: bool,
    probe_in_flight: bool,
    hello_allowed: bool,
    shutdown_write: bool,
    shutdown_read: bool,
    /// Once set, no more work is pushed; completions still return buffers.
    failure: Option<Failure>,
    /// The queue pair must be moved to error (the peer broke the protocol).
    fail_qp: bool,
    last_heard: Instant,
    keepalive: Duration,
    /// Messages up to this long go inline (copied into the work request).
    max_inline: usize,
}

impl Connection {
    /// Buffers for a connection with `config`, registered in `pd`.
    pub(crate) fn new(pd: &dyn ProtectionDomain, config: &StreamConfig) -> Result<Self, Error> {
        config.check()?;
        let receives = (config.recv_buffers + config.answer_buffers) as usize;
        let probe_pad =
            ExposedBuf::new(pd, vec![0u8; 8], RemoteAccess::READ).map_err(|r| r.into_parts().0)?;
        static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        Ok(Connection {
            id: NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            flow: Flow::new(Limits {
                chunk: config.chunk_size as u32,
                data_receives: config.recv_buffers,
                answer_receives: config.answer_buffers,
            }),
            recv_pool: BufferPool::new(pd, config.chunk_size, receives)?,
            send_pool: BufferPool::new(pd, config.chunk_size, config.send_buffers)?,
            control_pool: BufferPool::new(pd, CONTROL_CHUNK, config.control_buffers())?,
            probe_pad,
            peer_probe: None,
            to_post: Vec::with_capacity(receives),
            staging: None,
            outbox: VecDeque::with_capacity(config.send_buffers),
            inbox: VecDeque::with_capacity(receives),
            data_in_flight: 0,
            sends_lost: false,
            probe_in_flight: false,
            hello_allowed: false,
            shutdown_write: false,
            shutdown_read: false,
            failure: None,
            fail_qp: false,
            last_heard: Instant::now(),
            keepalive: config.keepalive,
            max_inline: 0,
        })
    }

    /// Sends up to `max` bytes inline (the queue pair's limit).
    pub(crate) fn set_max_inline(&mut self, max: u32) {
        self.max_inline = max as usize;
    }

    /// Queues every receive buffer for posting (the first [`pump`](Self::pump)
    /// posts them): before the peer may send.
    pub(crate) fn post_all_receives(&mut self) -> Result<(), Error> {
        while self.recv_pool.available() > 0 {
            self.to_post.push((self.recv_pool.take()?, false));
        }
        Ok(())
    }

    /// Whether the peer's hello arrived.
    pub(crate) fn established(&self) -> bool {
        self.flow.peer().is_some()
    }

    pub(crate) fn failure(&self) -> Option<&Failure> {
        self.failure.as_ref()
    }

    /// Whether the queue pair must be moved to error now (once).
    pub(crate) fn take_fail_qp(&mut self) -> bool {
        std::mem::take(&mut self.fail_qp)
    }

    /// Records why the connection cannot go on (the first reason wins).
    pub(crate) fn fail(&mut self, failure: Failure) {
        if self.failure.is_none() {
            // Whatever the reason, the queue pair goes to error, so the
            // peer learns (its sends and keep-alive probes fail) instead of
            // waiting for a connection that will not move.
            self.fail_qp = true;
            self.failure = Some(failure);
        }
    }

    /// Applies one completion of the connection's ring.
    pub(crate) fn on_completion(&mut self, c: Completion) {
        let status = c.status();
        match c.user_data() {
            RECV => self.on_receive(c),
            DATA | CONTROL | FIN | PROBE => {
                if matches!(c.user_data(), DATA | FIN) {
                    self.data_in_flight = self.data_in_flight.saturating_sub(1);
                }
                if c.user_data() == PROBE {
                    self.probe_in_flight = false;
                }
                if status.is_success() {
                    self.last_heard = Instant::now();
                    return;
                }
                // A credit or a probe carries nothing the peer's reader
                // needs: what was written is lost only with data or the
                // end of stream.
                if matches!(c.user_data(), DATA | FIN) {
                    self.sends_lost = true;
                }
                if c.user_data() == PROBE
                    && matches!(status, WcStatus::RemAccessErr | WcStatus::RemInvReqErr)
                {
                    // The pad lives as long as the peer's queue pair, so a
                    // refused read means the hello named memory that is
                    // not the peer's pad: a broken peer, not a lost one.
                    self.fail(Failure::Protocol(format!(
                        "its hello named a keep-alive pad that refuses reads ({status})"
                    )));
                    return;
                }
                if status != WcStatus::WrFlushErr || self.failure.is_none() {
                    let what = match c.user_data() {
                        DATA => "a data send",
                        CONTROL => "a control send",
                        FIN => "the end of stream's send",
                        _ => "a keep-alive read of the peer",
                    };
                    self.fail(Failure::Transport(format!("{what} failed: {status}")));
                }
                // Dropping the completion returns the buffer to its pool.
            }
            _ => {}
        }
    }

    fn on_receive(&mut self, c: Completion) {
        let status = c.status();
        let (len, imm, by_write) = (c.byte_len(), c.imm(), c.is_write_imm());
        let Ok(chunk) = c.into_buf().downcast::<PoolChunk>() else {
            // Only our receives are posted on this queue pair; one more
            // way of saying so must not lose a receive the hello counted.
            self.fail(Failure::Transport(
                "a receive completion without its buffer".into(),
            ));
            return;
        };
        if status == WcStatus::LocLenErr {
            // The peer sent more than a receive holds: the hello told it
            // how much that is, so this breaks the protocol.
            self.fail(Failure::Protocol(format!(
                "a message longer than the receive buffers' {} bytes",
                self.flow.ours().chunk
            )));
            return;
        }
        if !status.is_success() {
            if self.failure.is_none() {
                self.fail(Failure::Transport(format!("a receive failed: {status}")));
            }
            return;
        }
        self.last_heard = Instant::now();
        if self.failure.is_some() {
            return;
        }
        if by_write {
            // Its buffer holds whatever an earlier message left there.
            self.fail(Failure::Protocol(
                "an RDMA WRITE with immediate used up a receive: not part of the protocol".into(),
            ));
            return;
        }
        let Some(imm) = imm else {
            self.fail(Failure::Protocol("a message without its header".into()));
            return;
        };
        let payload = &chunk[..(len as usize).min(chunk.len())];
        match self.flow.receive(Header::decode(imm), len, payload) {
            Err(why) => self.fail(Failure::Protocol(why)),
            Ok(Received::Data(len)) => {
                if self.shutdown_read {
                    self.to_post.push((chunk, true));
                } else {
                    self.inbox.push_back(Inbound {
                        chunk,
                        len: len as usize,
                        taken: 0,
                    });
                }
            }
            Ok(Received::Credit) => self.to_post.push((chunk, false)),
            Ok(Received::Fin) => self.to_post.push((chunk, true)),
            Ok(Received::Hello(hello)) => {
                self.peer_probe = Some(hello.probe);
                self.to_post.push((chunk, true));
            }
        }
    }

    /// Copies received bytes into `dst`.
    pub(crate) fn read(&mut self, dst: &mut [u8]) -> Result<ReadOutcome, io::Error> {
        if self.shutdown_read {
            return Ok(ReadOutcome::End);
        }
        let mut copied = 0;
        while copied < dst.len() {
            let Some(front) = self.inbox.front_mut() else {
                break;
            };
            let n = (front.len - front.taken).min(dst.len() - copied);
            dst[copied..copied + n].copy_from_slice(&front.chunk[front.taken..front.taken + n]);
            front.taken += n;
            copied += n;
            if front.taken == front.len {
                let done = self.inbox.pop_front().expect("front exists");
                self.to_post.push((done.chunk, true));
            }
        }
        if copied > 0 {
            return Ok(ReadOutcome::Bytes(copied));
        }
        // The end of stream arrived in order after every byte: it stands
        // even if the connection failed afterwards.
        if self.flow.fin_received() {
            return Ok(ReadOutcome::End);
        }
        if let Some(failure) = &self.failure {
            return Err(failure.to_io());
        }
        Ok(ReadOutcome::Empty)
    }

    /// Bytes received and not read yet.
    pub(crate) fn readable(&self) -> usize {
        self.inbox.iter().map(|i| i.len - i.taken).sum()
    }

    /// Copies as much of `src` as the send buffers take; `Ok(0)` means
    /// they are all full (wait for the peer to read), an error that the
    /// caller holds every one.
    pub(crate) fn write(&mut self, src: &[u8]) -> Result<usize, io::Error> {
        self.check_writable()?;
        let limit = self.message_limit();
        let mut copied = 0;
        while copied < src.len() {
            if self.staging.is_none() {
                match self.send_pool.take() {
                    Ok(chunk) => self.staging = Some((chunk, 0)),
                    Err(_) if copied == 0 => {
                        self.check_not_all_held()?;
                        break;
                    }
                    Err(_) => break,
                }
            }
            let (chunk, filled) = self.staging.as_mut().expect("just set");
            let n = (limit - *filled).min(src.len() - copied);
            chunk[*filled..*filled + n].copy_from_slice(&src[copied..copied + n]);
            *filled += n;
            copied += n;
            if *filled == limit {
                let full = self.staging.take().expect("staging");
                self.outbox.push_back(full);
            }
        }
        Ok(copied)
    }

    /// A free send buffer for the caller to fill in place (`None`: all are
    /// in use). Bytes written before are sealed first, so they go ahead.
    pub(crate) fn take_send_buffer(&mut self) -> Result<Option<SendBuffer>, io::Error> {
        self.check_writable()?;
        if let Some(partial) = self.staging.take_if(|(_, n)| *n > 0) {
            self.outbox.push_back(partial);
        }
        let chunk = match self.staging.take() {
            Some((chunk, _)) => Some(chunk),
            None => self.send_pool.take().ok(),
        };
        if chunk.is_none() {
            self.check_not_all_held()?;
        }
        Ok(chunk.map(|chunk| SendBuffer {
            chunk,
            limit: self.message_limit(),
            owner: self.id,
        }))
    }

    /// Queues `len` bytes of a buffer from
    /// [`take_send_buffer`](Self::take_send_buffer) as the next message.
    pub(crate) fn queue_send_buffer(
        &mut self,
        buf: SendBuffer,
        len: usize,
    ) -> Result<(), SendError> {
        if let Err(error) = self.check_writable() {
            return Err(SendError { error, buf });
        }
        if buf.owner != self.id {
            let error = io::Error::new(
                io::ErrorKind::InvalidInput,
                "this send buffer belongs to another stream",
            );
            return Err(SendError { error, buf });
        }
        if len > buf.limit {
            let error = io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{len} bytes do not fit a send buffer of {}", buf.limit),
            );
            return Err(SendError { error, buf });
        }
        if len > 0 {
            if let Some(partial) = self.staging.take_if(|(_, n)| *n > 0) {
                self.outbox.push_back(partial);
            }
            self.outbox.push_back((buf.chunk, len));
        }
        Ok(())
    }

    fn check_writable(&self) -> Result<(), io::Error> {
        if let Some(failure) = &self.failure {
            return Err(failure.to_io());
        }
        if self.shutdown_write {
            return Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "the stream was shut down for writing",
            ));
        }
        Ok(())
    }

    /// Refuses to wait for a send buffer when none can come back: every
    /// one is a [`SendBuffer`] the caller took and has not sent (none is
    /// free, filled, queued or in flight), so a wait would never end.
    fn check_not_all_held(&self) -> Result<(), io::Error> {
        // Asked only once the pool had none to give.
        let none_coming =
            self.staging.is_none() && self.outbox.is_empty() && self.data_in_flight == 0;
        if none_coming {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "every send buffer is held by a SendBuffer not sent yet: send or drop one first",
            ));
        }
        Ok(())
    }

    /// The longest message: our send buffers, capped by the peer's receive
    /// buffers.
    fn message_limit(&self) -> usize {
        let ours = self.send_pool.chunk_size();
        match self.flow.max_message() {
            0 => ours,
            peer => ours.min(peer as usize),
        }
    }

    /// Whether written bytes are still waiting for the device.
    pub(crate) fn unsent(&self) -> bool {
        self.staging.as_ref().is_some_and(|(_, n)| *n > 0) || !self.outbox.is_empty()
    }

    /// Whether every data send and the end of stream's, once completed,
    /// arrived.
    pub(crate) fn sends_arrived(&self) -> bool {
        !self.sends_lost
    }

    /// Whether the end of stream went out and it and every data send
    /// completed: what a close waits for. Credits and probes the device
    /// still holds do not count; a reader's credits could otherwise hold
    /// it up for as long as the peer keeps sending.
    pub(crate) fn fin_done(&self) -> bool {
        self.fin_sent() && self.data_in_flight == 0
    }

    /// No more writes; the end of the stream goes out after the bytes
    /// already written.
    pub(crate) fn shutdown_write(&mut self) {
        self.shutdown_write = true;
    }

    /// No more reads: bytes not read yet, and any that arrive, are dropped
    /// (their buffers go back to the peer).
    pub(crate) fn shutdown_read(&mut self) {
        self.shutdown_read = true;
        while let Some(done) = self.inbox.pop_front() {
            self.to_post.push((done.chunk, true));
        }
    }

    /// Whether our end of stream went to the device.
    pub(crate) fn fin_sent(&self) -> bool {
        self.flow.fin_sent()
    }

    /// Pushes everything that may go now: receives first (so a grant never
    /// precedes its buffer), then the hello, data, the end of stream, a
    /// credit, and a keep-alive probe if the peer has been quiet. Returns
    /// whether anything was pushed; the caller submits.
    pub(crate) fn pump<Q: QueuePair>(&mut self, sq: &mut SubmissionQueue<'_, Q>) -> bool {
        let mut pushed = self.pump_receives(sq);
        if self.failure.is_some() || !self.hello_allowed {
            return pushed;
        }
        if self.flow.can_send(Kind::Hello) {
            let hello = Hello {
                chunk: self.flow.ours().chunk,
                data_receives: self.flow.ours().data_receives,
                answer_receives: self.flow.ours().answer_receives,
                probe: self.probe_pad.remote(),
            };
            pushed |= self.push_control(sq, Kind::Hello, &hello.encode());
        }
        while self.flow.can_send(Kind::Data) {
            if self.outbox.is_empty() {
                // Nothing waits for a grant: send a partly filled buffer
                // now rather than wait for more writes.
                match self.staging.take_if(|(_, n)| *n > 0) {
                    Some(partial) => self.outbox.push_back(partial),
                    None => break,
                }
            }
            let (chunk, len) = self.outbox.pop_front().expect("not empty");
            let header = self.flow.header(Kind::Data);
            let mut op = SendImm::new(chunk.slice(..len), header.encode()).user_data(DATA);
            if len <= self.max_inline {
                op = op.inline();
            }
            match sq.push(op) {
                Ok(()) => {
                    self.flow.commit(header, len as u32);
                    self.data_in_flight += 1;
                    pushed = true;
                }
                Err(refused) => {
                    let chunk = refused.into_parts().1.into_buf().into_inner();
                    self.outbox.push_front((chunk, len));
                    break;
                }
            }
        }
        if self.shutdown_write && !self.unsent() && self.flow.can_send(Kind::Fin) {
            let total = frame::encode_total(self.flow.bytes_sent());
            pushed |= self.push_control(sq, Kind::Fin, &total);
        }
        if self.flow.wants_credit() {
            let total = frame::encode_total(self.flow.bytes_sent());
            pushed |= self.push_control(sq, Kind::Credit, &total);
        }
        pushed |= self.probe(sq);
        pushed
    }

    /// Pushes the receive buffers waiting to be posted; returns whether it
    /// pushed any. A data buffer posted again is granted in the next
    /// message, which the caller's submit posts after it.
    pub(crate) fn pump_receives<Q: QueuePair>(&mut self, sq: &mut SubmissionQueue<'_, Q>) -> bool {
        let mut pushed = false;
        while let Some((chunk, grants)) = self.to_post.pop() {
            match sq.push(Recv::new(chunk).user_data(RECV)) {
                Ok(()) => {
                    pushed = true;
                    if grants {
                        self.flow.reposted(1);
                    }
                }
                Err(refused) => {
                    let chunk = refused.into_parts().1.into_buf();
                    self.to_post.push((chunk, grants));
                    break;
                }
            }
        }
        pushed
    }

    /// Lets the hello go (the queue pair is connected).
    pub(crate) fn allow_hello(&mut self) {
        self.hello_allowed = true;
    }

    fn push_control<Q: QueuePair>(
        &mut self,
        sq: &mut SubmissionQueue<'_, Q>,
        kind: Kind,
        payload: &[u8],
    ) -> bool {
        let Ok(mut chunk) = self.control_pool.take() else {
            // Every control buffer is in flight: this goes out when one
            // comes back.
            return false;
        };
        chunk[..payload.len()].copy_from_slice(payload);
        let header = self.flow.header(kind);
        let tag = if kind == Kind::Fin { FIN } else { CONTROL };
        let mut op = SendImm::new(chunk.slice(..payload.len()), header.encode()).user_data(tag);
        if payload.len() <= self.max_inline {
            op = op.inline();
        }
        if sq.push(op).is_err() {
            return false;
        }
        self.flow.commit(header, 0);
        self.data_in_flight += usize::from(tag == FIN);
        true
    }

    /// Reads the peer's probe pad if nothing was heard for the keep-alive
    /// interval: a peer that is gone makes the read fail (after the
    /// transport's retries), which fails the connection.
    fn probe<Q: QueuePair>(&mut self, sq: &mut SubmissionQueue<'_, Q>) -> bool {
        let Some(remote) = self.peer_probe else {
            return false;
        };
        if self.probe_in_flight || self.last_heard.elapsed() < self.keepalive {
            return false;
        }
        let Ok(chunk) = self.control_pool.take() else {
            return false;
        };
        if sq
            .push(Read::new(chunk.slice(..8), remote).user_data(PROBE))
            .is_err()
        {
            return false;
        }
        self.probe_in_flight = true;
        true
    }
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("flow", &self.flow)
            .field("readable", &self.readable())
            .field("unsent", &self.unsent())
            .field("data_in_flight", &self.data_in_flight)
            .field("to_post", &self.to_post.len())
            .field("outbox", &self.outbox.len())
            .field("failure", &self.failure)
            .finish_non_exhaustive()
    }
}
