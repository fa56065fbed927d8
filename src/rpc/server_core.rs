//! The server's poller state: its connections, what each owes and holds,
//! and what one pass over the completion queue does.

use std::collections::{HashMap, VecDeque};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::handler::{Caller, HandlerError};
use super::server::{ServerStats, Service};
use super::tasks::{panic_text, Outcome, Tasks};
use super::waiting_reads::WaitingReads;
use super::wire::{self, ErrorCode, Hello, Kind, Message, HEADER_LEN};
use super::RpcConfig;
use crate::backend::{ProtectionDomain, QueuePair, WcStatus};
use crate::buf::{
    BaseBuf, BufferPool, ExposedBuf, PoolChunk, RegisteredBuf, RemoteAccess, RemoteSlice, Slice,
};
use crate::op::{OpKind, Read, Send};
use crate::ring::{Completion, QpHandle, Ring, SubmitError, Unposted};

/// Tag of the shared receive queue's receives.
pub(super) const RECV: u64 = 1;
/// Tag of every send.
const SEND: u64 = 2;
/// Tag bit of rendezvous reads; the rest is the read's key.
const READ: u64 = 1 << 63;
/// How long the device may go on refusing a connection's posts before the
/// connection is given up. A device short of resources takes posts again
/// as its work completes; one that refuses for this long will not.
pub(super) const REFUSALS_GIVEN_UP_AFTER: Duration = Duration::from_secs(1);
/// How long work the device refused waits before it is pushed again: a
/// refusing device is asked about once a millisecond, not on every pass.
const REFUSED_RETRY_AFTER: Duration = Duration::from_millis(1);

/// An answer (or hello, or goodbye) waiting for room in the send queue:
/// encoded in a send buffer already, or, when none was free, as bytes.
enum Outgoing {
    Ready {
        chunk: PoolChunk,
        len: usize,
        answers: bool,
        /// The call whose large response this message exposes: its
        /// release timeout starts when the message leaves.
        exposes: Option<u64>,
    },
    Later {
        kind: Kind,
        id: u64,
        aux: u64,
        body: Body,
    },
}

enum Body {
    Bytes(Vec<u8>),
    Remote(RemoteSlice),
}

/// One client's connection.
struct Conn {
    caller: Caller,
    outbox: VecDeque<Outgoing>,
    /// Rendezvous reads waiting for room in the send queue.
    pending_reads: VecDeque<(u64, RegisteredBuf, RemoteSlice)>,
    /// Client messages received and not answered yet (pushed).
    unanswered: usize,
    /// Sends and reads pushed and not completed.
    in_flight: usize,
    /// Large responses the client may still read, by call id, with when
    /// their descriptor left (the release timeout runs from then).
    exposed: HashMap<u64, (ExposedBuf<Vec<u8>>, Option<Instant>)>,
    /// The handshake's socket, whose end tells that the client is gone.
    watch: Option<std::net::TcpStream>,
    /// Whether the client sent anything yet: before, its receives for
    /// anything but the hello may not be posted.
    heard: bool,
    /// Why the connection ends, once it does; it is detached when nothing
    /// of it is in flight (or at once, if the device failed it).
    closing: Option<String>,
    /// Messages that came while it was closing (ignored).
    ignored: usize,
    /// The device failed the connection: detach now.
    broken: bool,
    goodbye: bool,
    /// Since when the device has refused to post the connection's work
    /// (reset by a submit that posts all of it, or by a completion).
    refused_since: Option<Instant>,
    /// When work the device refused is pushed again (while
    /// `refused_since` is set).
    retry_at: Instant,
    /// Whether this pass pushed any of its work.
    pushed: bool,
}

impl Conn {
    /// Ends the connection now, for a failure of the device's: it is
    /// detached at the end of the pass.
    fn fail(&mut self, why: impl FnOnce() -> String) {
        self.broken = true;
        self.closing.get_or_insert_with(why);
    }
}

/// A rendezvous read in flight: whose call it is, and what it reads (to
/// push it again if the device refuses it).
struct PendingRead {
    qp: QpHandle,
    id: u64,
    remote: RemoteSlice,
}

/// What the poller knows; `Ring` is passed in, so the accept path can
/// lock both together.
pub(super) struct ServerCore {
    config: RpcConfig,
    pd: Arc<dyn ProtectionDomain>,
    send_pool: BufferPool,
    service: Service,
    conns: HashMap<QpHandle, Conn>,
    reads: HashMap<u64, PendingRead>,
    /// Bytes of the rendezvous requests in `reads` (registered here and
    /// not yet read and handled).
    reading: u64,
    /// Rendezvous requests waiting for `reading` to fall under
    /// `max_reading`, the clients taking turns: each holds a descriptor
    /// only.
    waiting_reads: WaitingReads,
    next_read: u64,
    tasks: Tasks<(QpHandle, u64)>,
    finished: Vec<((QpHandle, u64), Outcome)>,
    response: Vec<u8>,
    max_inline: usize,
    pub(super) stats: ServerStats,
    next_client: u32,
    pub(super) shutting_down: bool,
}

impl ServerCore {
    pub(super) fn new(
        config: RpcConfig,
        pd: Arc<dyn ProtectionDomain>,
        send_pool: BufferPool,
        service: Service,
        max_inline: usize,
    ) -> Self {
        ServerCore {
            config,
            pd,
            send_pool,
            service,
            conns: HashMap::new(),
            reads: HashMap::new(),
            reading: 0,
            waiting_reads: WaitingReads::default(),
            next_read: 0,
            tasks: Tasks::new(),
            finished: Vec::new(),
            response: Vec::new(),
            max_inline,
            stats: ServerStats::default(),
            next_client: 1,
            shutting_down: false,
        }
    }

    pub(super) fn connections(&self) -> usize {
        self.conns.len()
    }

    /// Whether a future of an async handler was woken.
    pub(super) fn tasks_woken(&self) -> bool {
        self.tasks.woken()
    }

    /// Whether a pass has anything to wait for besides new requests.
    pub(super) fn busy(&self) -> bool {
        self.tasks.len() > 0
            || self
                .conns
                .values()
                .any(|c| c.in_flight > 0 || c.refused_since.is_some())
    }

    fn new_conn(&mut self, qp_num: u32, peer: Option<std::net::SocketAddr>) -> Conn {
        let client_id = self.next_client;
        self.next_client = self.next_client.wrapping_add(1).max(1);
        Conn {
            caller: Caller {
                client_id,
                peer,
                qp_num,
            },
            outbox: VecDeque::new(),
            pending_reads: VecDeque::new(),
            unanswered: 0,
            in_flight: 0,
            exposed: HashMap::new(),
            watch: None,
            heard: false,
            closing: None,
            ignored: 0,
            broken: false,
            goodbye: false,
            refused_since: None,
            retry_at: Instant::now(),
            pushed: false,
        }
    }

    /// Takes a connected queue pair attached as `qp`, and greets it.
    pub(super) fn adopt(
        &mut self,
        qp: QpHandle,
        qp_num: u32,
        max_inline: u32,
        peer: Option<std::net::SocketAddr>,
        watch: Option<std::net::TcpStream>,
    ) {
        self.max_inline = self.max_inline.min(max_inline as usize);
        let mut conn = self.new_conn(qp_num, peer);
        conn.watch = watch.filter(|socket| socket.set_nonblocking(true).is_ok());
        let mut body = vec![0u8; wire::HELLO_LEN];
        Hello {
            window: self.config.window,
            buffer_size: self.config.buffer_size,
            max_message: self.config.max_message,
            client_id: conn.caller.client_id,
        }
        .encode(&mut body);
        conn.outbox.push_back(Outgoing::Later {
            kind: Kind::Hello,
            id: 0,
            aux: 0,
            body: Body::Bytes(body),
        });
        if self.shutting_down {
            conn.closing = Some("the server is shutting down".into());
        }
        self.conns.insert(qp, conn);
        self.stats.clients_accepted += 1;
    }

    /// Takes a connected queue pair only to tell its client that the
    /// server is full; it is detached once that left.
    pub(super) fn refuse(&mut self, qp: QpHandle, qp_num: u32, peer: Option<std::net::SocketAddr>) {
        let mut conn = self.new_conn(qp_num, peer);
        let text = format!("the server is full ({} clients)", self.config.max_clients);
        conn.outbox.push_back(Outgoing::Later {
            kind: Kind::Error,
            id: 0,
            aux: ErrorCode::Busy as u64,
            body: Body::Bytes(text.into_bytes()),
        });
        conn.closing = Some("refused: the server is full".into());
        self.conns.insert(qp, conn);
        self.stats.clients_refused += 1;
    }

    /// Applies one completion.
    pub(super) fn on_completion(&mut self, c: Completion) {
        let Some(qp) = c.qp() else { return };
        match c.kind() {
            OpKind::Recv => self.on_receive(qp, c),
            OpKind::Read => self.on_read(qp, c),
            _ => {
                if let Some(conn) = self.conns.get_mut(&qp) {
                    conn.in_flight = conn.in_flight.saturating_sub(1);
                    conn.refused_since = None;
                    if !c.status().is_success() {
                        conn.fail(|| format!("a send failed: {}", c.status()));
                    }
                }
            }
        }
    }

    fn on_receive(&mut self, qp: QpHandle, c: Completion) {
        let status = c.status();
        let len = c.byte_len() as usize;
        let by_write = c.is_write_imm();
        let Ok(chunk) = c.into_buf().downcast::<PoolChunk>() else {
            return;
        };
        let Some(conn) = self.conns.get_mut(&qp) else {
            return; // a connection already gone: the buffer goes back
        };
        if !status.is_success() {
            conn.broken = true;
            if conn.closing.is_none() {
                conn.closing = Some(if status == WcStatus::LocLenErr {
                    // The hello said how large a message may be: a
                    // violation, though the failed queue pair cannot be
                    // told so.
                    self.stats.protocol_errors += 1;
                    let size = self.config.buffer_size;
                    format!("a message longer than the receive buffers' {size} bytes")
                } else {
                    format!("a receive failed: {status}")
                });
            }
            return;
        }
        if conn.closing.is_some() {
            // Ignored, but counted: a client that goes on sending to a
            // connection that is closing (its last word to us still
            // waiting to be delivered) takes shared receive buffers from
            // every other client, as a flood on an open one does, and is
            // cut off the same way. One that keeps the protocol has at
            // most a window of messages unanswered, these included.
            conn.ignored += 1;
            if conn.ignored > usize::from(self.config.window) && !conn.broken {
                self.stats.protocol_errors += 1;
                conn.broken = true;
                conn.closing = Some(format!(
                    "protocol violation: {} messages after the connection began to close, beyond the window of {}",
                    conn.ignored, self.config.window
                ));
            }
            return;
        }
        if by_write {
            // Its buffer holds whatever an earlier message left there.
            return self.violation(
                qp,
                "an RDMA WRITE with immediate used up a receive: not part of the protocol".into(),
            );
        }
        self.stats.messages += 1;
        conn.heard = true;
        let bytes = &chunk[..len.min(chunk.len())];
        let message = match Message::decode(bytes) {
            Ok(m) if m.kind().from_client() => m,
            Ok(m) => {
                return self.violation(qp, format!("a client sent a server message ({m:?})"));
            }
            Err(why) => return self.violation(qp, why),
        };
        if message == Message::Close {
            // Calls in progress are dropped with the connection; what the
            // client exposed is its own business now.
            conn.closing = Some("the client closed the connection".into());
            conn.outbox.clear();
            self.stats.clients_left += 1;
            self.drop_unpushed_reads(qp);
            return;
        }
        conn.unanswered += 1;
        if conn.unanswered > usize::from(self.config.window) {
            // A flood: it takes shared receive buffers from every other
            // client, so the connection ends now, with no word (a message
            // would let the flood go on until it left).
            self.stats.protocol_errors += 1;
            conn.broken = true;
            conn.closing = Some(format!(
                "protocol violation: {} messages unanswered, beyond the window of {}",
                conn.unanswered, self.config.window
            ));
            return;
        }
        match message {
            Message::Request { id, body } => {
                if self.shutting_down {
                    self.answer_error(qp, id, ErrorCode::ShuttingDown, "shutting down");
                } else if body.len() > self.config.max_message as usize {
                    // Inline, when max_message is below what a receive
                    // buffer holds: refused as a large one would be.
                    let why = format!(
                        "the request of {} bytes is longer than max_message {}",
                        body.len(),
                        self.config.max_message
                    );
                    self.answer_error(qp, id, ErrorCode::TooLarge, &why);
                } else {
                    self.run_handler(qp, id, body);
                }
            }
            Message::RequestRendezvous { id, remote } => self.start_read(qp, id, remote),
            Message::Release { id, call } => {
                // A release of a call already expired (or never large) is
                // answered the same: the buffer is gone either way.
                conn.exposed.remove(&call);
                self.send_now_or_queue(qp, Kind::Released, id, 0, &[]);
            }
            _ => unreachable!("checked to come from a client"),
        }
    }

    /// Ends a connection whose client broke the protocol: it is told why,
    /// then detached.
    fn violation(&mut self, qp: QpHandle, why: String) {
        self.stats.protocol_errors += 1;
        let Some(conn) = self.conns.get_mut(&qp) else {
            return;
        };
        conn.outbox.clear();
        let text = wire::error_text(&why).as_bytes().to_vec();
        conn.outbox.push_back(Outgoing::Later {
            kind: Kind::Error,
            id: 0,
            aux: ErrorCode::Protocol as u64,
            body: Body::Bytes(text),
        });
        conn.closing = Some(format!("protocol violation: {why}"));
        self.drop_unpushed_reads(qp);
    }

    fn run_handler(&mut self, qp: QpHandle, id: u64, request: &[u8]) {
        let caller = self.conns[&qp].caller;
        self.stats.requests += 1;
        match &mut self.service {
            Service::Sync(handler) => {
                let mut response = std::mem::take(&mut self.response);
                response.clear();
                let ran = catch_unwind(AssertUnwindSafe(|| {
                    handler.handle(&caller, request, &mut response)
                }));
                let outcome = match ran {
                    Ok(result) => Ok(result),
                    Err(panic) => Err(panic_text(&*panic)),
                };
                self.answer(qp, id, outcome, &mut response);
                self.response = response;
            }
            Service::Async(handler) => {
                let request = request.to_vec();
                match catch_unwind(AssertUnwindSafe(|| handler.call(caller, request))) {
                    Ok(future) => {
                        let finished = &mut self.finished;
                        self.tasks.spawn(future, (qp, id), finished);
                    }
                    Err(panic) => self.finished.push(((qp, id), Err(panic_text(&*panic)))),
                }
                self.answer_finished();
            }
        }
    }

    /// Polls woken handler futures and answers those that finished.
    pub(super) fn run_tasks(&mut self) {
        self.tasks.run(&mut self.finished);
        self.answer_finished();
    }

    fn answer_finished(&mut self) {
        let mut finished = std::mem::take(&mut self.finished);
        for ((qp, id), outcome) in finished.drain(..) {
            if !self.conns.contains_key(&qp) {
                continue;
            }
            let mut response = Vec::new();
            let outcome = outcome.map(|r| {
                r.map(|bytes| {
                    response = bytes;
                })
            });
            self.answer(qp, id, outcome, &mut response);
        }
        self.finished = finished;
    }

    /// Answers call `id` with the handler's outcome; a response too large
    /// to travel inline is exposed for the client to read. `response` may
    /// be taken (when exposed).
    fn answer(
        &mut self,
        qp: QpHandle,
        id: u64,
        outcome: Result<Result<(), HandlerError>, String>,
        response: &mut Vec<u8>,
    ) {
        match outcome {
            Err(panic) => {
                self.stats.panics += 1;
                self.answer_error(qp, id, ErrorCode::Panicked, &panic)
            }
            Ok(Err(e)) => self.answer_error(qp, id, ErrorCode::Handler, &e.to_string()),
            Ok(Ok(())) if response.len() > self.config.max_message as usize => {
                let why = format!(
                    "the response of {} bytes is longer than max_message {}",
                    response.len(),
                    self.config.max_message
                );
                self.answer_error(qp, id, ErrorCode::TooLarge, &why)
            }
            Ok(Ok(())) if HEADER_LEN + response.len() <= self.config.buffer_size as usize => {
                self.send_now_or_queue(qp, Kind::Response, id, 0, response);
            }
            Ok(Ok(())) if self.unreleased(qp) >= 2 * usize::from(self.config.window) => {
                let why = "too many large responses not released yet";
                self.answer_error(qp, id, ErrorCode::Busy, why)
            }
            Ok(Ok(())) if self.past_max_exposed(response.len()) => {
                let why = "the server holds max_exposed bytes of large responses not released yet";
                self.answer_error(qp, id, ErrorCode::Busy, why)
            }
            Ok(Ok(())) => {
                let memory = std::mem::take(response);
                match ExposedBuf::new(&*self.pd, memory, RemoteAccess::READ) {
                    Ok(exposed) => {
                        let remote = exposed.remote();
                        match self.conns.get_mut(&qp) {
                            Some(conn) if conn.closing.is_none() => {
                                conn.exposed.insert(id, (exposed, None));
                            }
                            _ => return,
                        }
                        self.queue(
                            qp,
                            Outgoing::Later {
                                kind: Kind::ResponseRendezvous,
                                id,
                                aux: 0,
                                body: Body::Remote(remote),
                            },
                        );
                    }
                    Err(refused) => {
                        let why = format!("registering the response failed: {}", refused.error());
                        self.answer_error(qp, id, ErrorCode::Busy, &why);
                    }
                }
            }
        }
    }

    /// Large responses of `qp` its client has not released.
    fn unreleased(&self, qp: QpHandle) -> usize {
        self.conns.get(&qp).map_or(0, |c| c.exposed.len())
    }

    /// Whether exposing `len` more bytes of a large response would go past
    /// `max_exposed` (one alone always goes). Summed when asked: a large
    /// response costs a registration anyway, and there are at most two
    /// windows of them per client.
    fn past_max_exposed(&self, len: usize) -> bool {
        let held: u64 = self
            .conns
            .values()
            .flat_map(|c| c.exposed.values())
            .map(|(exposed, _)| exposed.len() as u64)
            .sum();
        held > 0 && held + len as u64 > self.config.max_exposed
    }

    fn answer_error(&mut self, qp: QpHandle, id: u64, code: ErrorCode, text: &str) {
        self.stats.errors += 1;
        let text = wire::error_text(text);
        self.send_now_or_queue(qp, Kind::Error, id, code as u64, text.as_bytes());
    }

    /// Queues an inline message, encoded straight into a send buffer (no
    /// allocation), or copied if none is free.
    fn send_now_or_queue(&mut self, qp: QpHandle, kind: Kind, id: u64, aux: u64, body: &[u8]) {
        let Some(conn) = self.conns.get_mut(&qp).filter(|c| c.closing.is_none()) else {
            return; // nobody to answer
        };
        let out = match self.send_pool.take() {
            Ok(mut chunk) => {
                let len = wire::encode_with_aux(&mut chunk, kind, id, aux, body);
                Outgoing::Ready {
                    chunk,
                    len,
                    answers: kind.answers(),
                    exposes: None,
                }
            }
            Err(_) => Outgoing::Later {
                kind,
                id,
                aux,
                body: Body::Bytes(body.to_vec()),
            },
        };
        conn.outbox.push_back(out);
    }

    fn queue(&mut self, qp: QpHandle, out: Outgoing) {
        if let Some(conn) = self.conns.get_mut(&qp).filter(|c| c.closing.is_none()) {
            conn.outbox.push_back(out);
        }
    }

    fn start_read(&mut self, qp: QpHandle, id: u64, remote: RemoteSlice) {
        if self.shutting_down {
            return self.answer_error(qp, id, ErrorCode::ShuttingDown, "shutting down");
        }
        if remote.len() > u64::from(self.config.max_message) {
            let why = format!(
                "the request of {} bytes is longer than max_message {}",
                remote.len(),
                self.config.max_message
            );
            return self.answer_error(qp, id, ErrorCode::TooLarge, &why);
        }
        // Memory for requests being read is bounded over all clients:
        // each client may have a window of requests as large as
        // max_message. Those waiting go first: a stream of small requests
        // must not starve a large one.
        if !self.waiting_reads.is_empty() || !self.may_read(remote) {
            self.stats.reads_waited += 1;
            self.waiting_reads.push(qp, id, remote);
            return;
        }
        self.read_request(qp, id, remote);
    }

    /// Whether a request of `remote`'s length may be read now: one alone
    /// always may.
    fn may_read(&self, remote: RemoteSlice) -> bool {
        self.reading == 0 || self.reading + remote.len() <= self.config.max_reading
    }

    /// Registers memory for a request and queues its read.
    fn read_request(&mut self, qp: QpHandle, id: u64, remote: RemoteSlice) {
        let memory = vec![0u8; remote.len() as usize];
        let buf = match RegisteredBuf::new(&*self.pd, memory) {
            Ok(buf) => buf,
            Err(refused) => {
                let why = format!("registering the request failed: {}", refused.error());
                return self.answer_error(qp, id, ErrorCode::Busy, &why);
            }
        };
        let key = self.next_read;
        self.next_read = (self.next_read + 1) & !READ;
        self.reads.insert(key, PendingRead { qp, id, remote });
        self.reading += remote.len();
        self.stats.peak_reading = self.stats.peak_reading.max(self.reading);
        // The read is pushed with the connection's sends, in `push`.
        self.conns
            .get_mut(&qp)
            .expect("a live connection")
            .pending_reads
            .push_back((key, buf, remote));
    }

    fn on_read(&mut self, qp: QpHandle, c: Completion) {
        let Some(PendingRead { id, remote, .. }) = self.reads.remove(&(c.user_data() & !READ))
        else {
            return;
        };
        self.handle_read(qp, id, c);
        // Its memory is free once handled (an async handler has a copy).
        self.reading -= remote.len();
        self.start_waiting_reads();
    }

    /// Starts the waiting rendezvous requests that fit now, the clients
    /// taking turns. They arrived before any shutdown began, so they are
    /// read and handled through one; those of a connection that is
    /// closing go.
    fn start_waiting_reads(&mut self) {
        while let Some((qp, _, remote)) = self.waiting_reads.next() {
            if self.conns.get(&qp).is_none_or(|c| c.closing.is_some()) {
                self.waiting_reads.remove_client(qp);
                continue;
            }
            if !self.may_read(remote) {
                return;
            }
            let (qp, id, remote) = self.waiting_reads.take_next().expect("looked at above");
            self.read_request(qp, id, remote);
        }
    }

    /// Forgets the reads of `qp` not yet pushed (its connection is
    /// closing) and those waiting, and starts others in their place.
    fn drop_unpushed_reads(&mut self, qp: QpHandle) {
        let Some(conn) = self.conns.get_mut(&qp) else {
            return;
        };
        for (key, ..) in conn.pending_reads.drain(..) {
            if let Some(read) = self.reads.remove(&key) {
                self.reading -= read.remote.len();
            }
        }
        self.waiting_reads.remove_client(qp);
        self.start_waiting_reads();
    }

    fn handle_read(&mut self, qp: QpHandle, id: u64, c: Completion) {
        let status = c.status();
        let Some(conn) = self.conns.get_mut(&qp) else {
            return;
        };
        conn.in_flight = conn.in_flight.saturating_sub(1);
        conn.refused_since = None;
        if !status.is_success() {
            // A lying descriptor fails the read with an access error, which
            // also moves the queue pair to error: the connection is over.
            conn.fail(|| format!("reading a request failed: {status}"));
            return;
        }
        // A connection closed (or cut off) while its request was read
        // drops the call, as it drops those it had not read yet: no
        // handler runs for a client that will never see the answer.
        if conn.closing.is_some() {
            return;
        }
        let buf = c.into_buf();
        let request: &[u8] = &buf;
        self.run_handler(qp, id, request);
    }

    /// Frees large responses their clients did not release in time.
    pub(super) fn expire(&mut self, now: Instant) {
        let timeout = self.config.release_timeout;
        for conn in self.conns.values_mut() {
            let before = conn.exposed.len();
            conn.exposed.retain(|_, (_, since)| {
                since.is_none_or(|since| now.duration_since(since) < timeout)
            });
            self.stats.releases_expired += (before - conn.exposed.len()) as u64;
        }
    }

    /// Drops the handler futures still pending (a shutdown ran out of
    /// time), answering their calls with `ShuttingDown`.
    pub(super) fn abort_tasks(&mut self) {
        for (qp, id) in self.tasks.cancel(|_| true) {
            let why = "the server shut down before the handler finished";
            self.answer_error(qp, id, ErrorCode::ShuttingDown, why);
        }
    }

    /// Whether no connection has anything to send or in flight.
    pub(super) fn quiet(&self) -> bool {
        self.waiting_reads.is_empty()
            && self
                .conns
                .values()
                .all(|c| c.in_flight == 0 && c.outbox.is_empty() && c.pending_reads.is_empty())
    }

    /// Finds clients that are gone without a word: a queue pair the
    /// device (or rdma_cm) failed, or a handshake socket that ended (the
    /// client's process died, or dropped the client).
    pub(super) fn check_liveness<Q: QueuePair>(&mut self, ring: &Ring<Q>) {
        for (&qp, conn) in self.conns.iter_mut() {
            if conn.broken {
                continue;
            }
            if let Some(status) = ring.qp_error(qp) {
                conn.fail(|| format!("the connection failed: {status}"));
                continue;
            }
            if conn
                .watch
                .as_ref()
                .is_some_and(crate::connect::tcp::peer_closed)
            {
                conn.fail(|| "the client's handshake socket closed".into());
            }
        }
    }

    /// Starts a graceful shutdown: every client is told, new calls are
    /// refused, calls in progress finish.
    pub(super) fn begin_shutdown(&mut self) {
        self.shutting_down = true;
        for conn in self.conns.values_mut() {
            // A connection closing already (its client said goodbye, or it
            // broke) is told nothing more.
            if conn.closing.is_some() {
                continue;
            }
            if conn.heard {
                queue_goodbye(conn);
            } else {
                // It may have no receive for a goodbye posted yet; its
                // first call will find the connection gone.
                conn.closing
                    .get_or_insert_with(|| "the server is shutting down".into());
            }
        }
    }

    /// Pushes what every connection has waiting (work the device refused,
    /// once its retry is due at `now`); returns whether anything was
    /// pushed.
    pub(super) fn push<Q: QueuePair>(&mut self, ring: &mut Ring<Q>, now: Instant) -> bool {
        let mut pushed = false;
        let send_pool = &self.send_pool;
        for (&qp, conn) in self.conns.iter_mut() {
            if conn.broken || (conn.refused_since.is_some() && now < conn.retry_at) {
                continue;
            }
            let mut sq = ring.submission_on(qp);
            while let Some((key, buf, remote)) = conn.pending_reads.pop_front() {
                match sq.push(Read::new(buf, remote).user_data(READ | key)) {
                    Ok(()) => {
                        conn.in_flight += 1;
                        conn.pushed = true;
                        pushed = true;
                    }
                    Err(refused) => {
                        let buf = refused.into_parts().1.into_buf();
                        conn.pending_reads.push_front((key, buf, remote));
                        break;
                    }
                }
            }
            while let Some(out) = conn.outbox.pop_front() {
                let (chunk, len, answers, exposes) = match out {
                    Outgoing::Ready {
                        chunk,
                        len,
                        answers,
                        exposes,
                    } => (chunk, len, answers, exposes),
                    Outgoing::Later {
                        kind,
                        id,
                        aux,
                        body,
                    } => {
                        let Ok(mut chunk) = send_pool.take() else {
                            conn.outbox.push_front(Outgoing::Later {
                                kind,
                                id,
                                aux,
                                body,
                            });
                            break;
                        };
                        let len = match &body {
                            Body::Bytes(bytes) => {
                                wire::encode_with_aux(&mut chunk, kind, id, aux, bytes)
                            }
                            Body::Remote(remote) => {
                                wire::encode_rendezvous(&mut chunk, kind, id, remote)
                            }
                        };
                        let exposes = (kind == Kind::ResponseRendezvous).then_some(id);
                        (chunk, len, kind.answers(), exposes)
                    }
                };
                // Solicited: a client sleeping on its completion channel
                // is woken by our messages, not by its own sends.
                let mut op = Send::new(chunk.slice(..len)).user_data(SEND).solicited();
                if len <= self.max_inline {
                    op = op.inline();
                }
                if let Err(refused) = sq.push(op) {
                    let chunk = refused.into_parts().1.into_buf().into_inner();
                    conn.outbox.push_front(Outgoing::Ready {
                        chunk,
                        len,
                        answers,
                        exposes,
                    });
                    break;
                }
                if answers {
                    conn.unanswered = conn.unanswered.saturating_sub(1);
                    self.stats.answers += 1;
                }
                if let Some(entry) = exposes.and_then(|id| conn.exposed.get_mut(&id)) {
                    entry.1 = Some(Instant::now());
                }
                conn.in_flight += 1;
                conn.pushed = true;
                pushed = true;
            }
        }
        pushed
    }

    /// After the submit of what [`push`](Self::push) pushed: what the
    /// device refused goes back ([`take_back`](Self::take_back)), and a
    /// connection whose pushed work all went out is no longer refused.
    /// Returns whether anything was posted.
    pub(super) fn submitted(&mut self, result: Result<usize, SubmitError>, now: Instant) -> bool {
        let posted = match result {
            Ok(_) => true,
            Err(refused) => {
                let posted = refused.posted > 0;
                self.take_back(refused, now);
                posted
            }
        };
        for conn in self.conns.values_mut() {
            if std::mem::take(&mut conn.pushed) {
                conn.refused_since = None;
            }
        }
        posted
    }

    /// Takes back the operations a submit could not post, as if they had
    /// never been pushed: each connection's sends go back to the front of
    /// its outbox in their order, its reads back to its pending reads,
    /// and a later pass pushes them again. A device short of resources
    /// (a full send queue, out of memory) takes them once its work
    /// completes; a connection whose posts it goes on refusing for
    /// [`REFUSALS_GIVEN_UP_AFTER`] is broken.
    fn take_back(&mut self, refused: SubmitError, now: Instant) {
        // The first refusal's, which may be another queue's.
        let why = refused.error;
        let mut sends: HashMap<QpHandle, Vec<Outgoing>> = HashMap::new();
        let mut reads: HashMap<QpHandle, Vec<(u64, RegisteredBuf, RemoteSlice)>> = HashMap::new();
        for Unposted {
            kind,
            user_data,
            bufs,
            qp,
            ..
        } in refused.unposted
        {
            // A receive of the shared queue goes back to its pool; the
            // ring's refill posts another.
            let Some((qp, conn)) = qp.and_then(|qp| Some((qp, self.conns.get_mut(&qp)?))) else {
                continue;
            };
            conn.in_flight = conn.in_flight.saturating_sub(1);
            conn.pushed = false;
            conn.retry_at = now + REFUSED_RETRY_AFTER;
            let since = *conn.refused_since.get_or_insert(now);
            if kind == OpKind::Read {
                let key = user_data & !READ;
                match (self.reads.get(&key), bufs.downcast::<RegisteredBuf>()) {
                    (Some(read), Ok(buf)) => {
                        reads.entry(qp).or_default().push((key, buf, read.remote));
                    }
                    _ => conn.fail(|| "a refused read came back unknown".into()),
                }
            } else {
                let taken_back = bufs.downcast::<Slice<PoolChunk>>().ok().and_then(|slice| {
                    let len = slice.end() - slice.start();
                    let header = wire::Header::decode(&slice[..len]).ok()?;
                    Some((slice.into_inner(), len, header))
                });
                let Some((chunk, len, header)) = taken_back else {
                    conn.fail(|| "a refused send came back unknown".into());
                    continue;
                };
                let answers = header.kind.answers();
                if answers {
                    conn.unanswered += 1;
                    self.stats.answers = self.stats.answers.saturating_sub(1);
                }
                let exposes = (header.kind == Kind::ResponseRendezvous).then_some(header.id);
                // Its release timeout runs from when it leaves.
                if let Some(entry) = exposes.and_then(|id| conn.exposed.get_mut(&id)) {
                    entry.1 = None;
                }
                sends.entry(qp).or_default().push(Outgoing::Ready {
                    chunk,
                    len,
                    answers,
                    exposes,
                });
            }
            if now.duration_since(since) >= REFUSALS_GIVEN_UP_AFTER {
                conn.fail(|| {
                    format!(
                        "the device refused to post its work for {REFUSALS_GIVEN_UP_AFTER:?} (the last submit's first refusal: {why})"
                    )
                });
            }
        }
        for (qp, taken_back) in sends {
            let conn = self.conns.get_mut(&qp).expect("looked up above");
            for out in taken_back.into_iter().rev() {
                conn.outbox.push_front(out);
            }
        }
        // Back in front, in the order they were pushed.
        for (qp, taken_back) in reads {
            let conn = self.conns.get_mut(&qp).expect("looked up above");
            for read in taken_back.into_iter().rev() {
                conn.pending_reads.push_front(read);
            }
        }
    }

    /// Connections to detach now, with why: broken ones at once, closing
    /// ones once their last send left.
    pub(super) fn take_finished(&mut self) -> Vec<(QpHandle, String)> {
        let done: Vec<QpHandle> = self
            .conns
            .iter()
            .filter(|(_, c)| {
                c.broken || (c.closing.is_some() && c.in_flight == 0 && c.outbox.is_empty())
            })
            .map(|(&qp, _)| qp)
            .collect();
        let finished: Vec<(QpHandle, String)> = done
            .into_iter()
            .map(|qp| {
                let conn = self.conns.remove(&qp).expect("listed");
                self.reads.retain(|_, r| r.qp != qp);
                self.waiting_reads.remove_client(qp);
                // Nobody is left to answer: the handler's futures go.
                let _ = self.tasks.cancel(|(owner, _)| *owner == qp);
                self.stats.clients_closed += 1;
                (qp, conn.closing.unwrap_or_default())
            })
            .collect();
        if !finished.is_empty() {
            self.reading = self.reads.values().map(|r| r.remote.len()).sum();
            self.start_waiting_reads();
        }
        finished
    }

    /// Every connection, to close them all at the end.
    pub(super) fn take_all(&mut self) -> Vec<QpHandle> {
        let all: Vec<QpHandle> = self.conns.keys().copied().collect();
        self.stats.clients_closed += all.len() as u64;
        self.conns.clear();
        self.reads.clear();
        self.reading = 0;
        self.waiting_reads.clear();
        let _ = self.tasks.cancel(|_| true);
        all
    }
}

fn queue_goodbye(conn: &mut Conn) {
    if !conn.goodbye {
        conn.goodbye = true;
        conn.outbox.push_back(Outgoing::Later {
            kind: Kind::Goodbye,
            id: 0,
            aux: 0,
            body: Body::Bytes(Vec::new()),
        });
    }
}
