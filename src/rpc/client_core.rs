//! The client's protocol state: calls in flight, matched to answers by
//! id, within the server's window; what to push next. No locking and no
//! waking here: [`super::client`] does those.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Instant;

use super::wire::{self, ErrorCode, Hello, Kind, Message, HEADER_LEN};
use super::{RpcConfig, RpcError};
use crate::backend::{ProtectionDomain, QueuePair, WcStatus};
use crate::buf::{
    BaseBuf, BufferPool, ExposedBuf, PoolChunk, RegisteredBuf, RemoteAccess, RemoteSlice,
};
use crate::op::{OpKind, Read, Recv, Send};
use crate::ring::{Completion, SubmissionQueue};

/// Tags of the client's operations.
pub(super) const RECV: u64 = 1;
pub(super) const HELLO: u64 = 2;
pub(super) const SEND: u64 = 3;
pub(super) const CLOSE: u64 = 4;
/// Tag bit of rendezvous reads; the rest is the call id.
pub(super) const READ: u64 = 1 << 63;

/// A request on its way out.
enum Request {
    /// Encoded in a send buffer.
    Encoded(PoolChunk, usize),
    /// Bytes waiting for a send buffer.
    Bytes(Vec<u8>),
    /// A large request, exposed for the server to read.
    Exposed(ExposedBuf<Vec<u8>>),
}

enum Call {
    Queued(Request),
    /// Sent; a large request stays exposed until the answer arrives.
    Sent(Option<ExposedBuf<Vec<u8>>>),
    /// The response is being read from the server.
    Reading,
    Done(Result<Vec<u8>, RpcError>),
}

/// What waits for the window: a call, or a release of a read response.
#[derive(Clone, Copy)]
enum Queued {
    Call(u64),
    Release { id: u64, call: u64 },
}

/// The client's protocol state, free of locking and waking.
pub(super) struct ClientCore {
    pd: Arc<dyn ProtectionDomain>,
    config: RpcConfig,
    pub(super) hello: Option<Hello>,
    pub(super) window: usize,
    max_inline: usize,
    next_id: u64,
    pub(super) unanswered: usize,
    /// Large responses whose descriptor arrived and whose release has not
    /// gone yet (being read, or the release queued). The server holds each
    /// until our release reaches it, and answers `Busy` past twice the
    /// window of them; so a call waits while `unanswered + holding` is
    /// that already (every unanswered call may bring one, and each
    /// release in flight is an unanswered message).
    holding: usize,
    queue: VecDeque<Queued>,
    calls: HashMap<u64, Call>,
    /// Releases sent and not answered.
    releases: HashMap<u64, u64>,
    /// Large requests of abandoned calls, exposed until their answer
    /// shows the server is done reading them (revoking earlier would
    /// fail the server's read, and with it the connection).
    orphans: HashMap<u64, ExposedBuf<Vec<u8>>>,
    recv_pool: Option<BufferPool>,
    pub(super) send_pool: Option<BufferPool>,
    pub(super) to_post: Vec<PoolChunk>,
    reads: Vec<(u64, RegisteredBuf, RemoteSlice)>,
    /// Rendezvous reads posted and not completed.
    reads_in_flight: usize,
    pub(super) failure: Option<RpcError>,
    pub(super) fail_qp: bool,
    pub(super) goodbye: bool,
    /// Calls whose result arrived since the last wake.
    pub(super) finished: bool,
    /// Calls abandoned after they were sent, not answered yet: each holds
    /// a slot of the window until its answer comes (so there are at most
    /// a window of them).
    abandoned: HashSet<u64>,
    /// Since when abandoned calls and releases have held the whole
    /// window with no answer coming: a server that answers none of them
    /// within a call timeout is stuck.
    stalled_since: Option<Instant>,
    /// Whether the close message went (after a goodbye, or on drop).
    pub(super) closed: bool,
}

impl ClientCore {
    pub(super) fn new(pd: Arc<dyn ProtectionDomain>, config: RpcConfig, max_inline: usize) -> Self {
        ClientCore {
            pd,
            config,
            hello: None,
            window: 0,
            max_inline,
            next_id: 1,
            unanswered: 0,
            holding: 0,
            queue: VecDeque::new(),
            calls: HashMap::new(),
            releases: HashMap::new(),
            orphans: HashMap::new(),
            recv_pool: None,
            send_pool: None,
            to_post: Vec::new(),
            reads: Vec::new(),
            reads_in_flight: 0,
            failure: None,
            fail_qp: false,
            goodbye: false,
            finished: false,
            abandoned: HashSet::new(),
            stalled_since: None,
            closed: false,
        }
    }

    fn buffer_size(&self) -> usize {
        self.hello.map_or(0, |h| h.buffer_size as usize)
    }

    fn max_message(&self) -> usize {
        let server = self.hello.map_or(0, |h| h.max_message);
        server.min(self.config.max_message) as usize
    }

    /// Whether the window lets a call go now: a slot for its message, and
    /// room at the server for the large response it may bring.
    fn call_may_go(&self) -> bool {
        self.unanswered < self.window && self.unanswered + self.holding < 2 * self.window
    }

    fn fresh_id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    /// Starts a call; returns its id.
    pub(super) fn start(&mut self, request: &[u8]) -> Result<u64, RpcError> {
        if self.goodbye {
            return Err(RpcError::ShuttingDown);
        }
        if let Some(e) = &self.failure {
            return Err(e.clone());
        }
        if request.len() > self.max_message() {
            return Err(RpcError::TooLarge(format!(
                "a request of {} bytes is longer than max_message {}",
                request.len(),
                self.max_message()
            )));
        }
        let id = self.fresh_id();
        // Encoded now only if it leaves now: a queued call must not hold a
        // send buffer that a release ahead of it needs.
        let leaves_now = self.queue.is_empty() && self.call_may_go();
        let request = if HEADER_LEN + request.len() > self.buffer_size() {
            match ExposedBuf::new(&*self.pd, request.to_vec(), RemoteAccess::READ) {
                Ok(exposed) => Request::Exposed(exposed),
                Err(refused) => {
                    return Err(RpcError::Busy(format!(
                        "registering the request failed: {}",
                        refused.error()
                    )))
                }
            }
        } else if !leaves_now {
            Request::Bytes(request.to_vec())
        } else {
            match self.send_pool.as_ref().expect("after hello").take() {
                Ok(mut chunk) => {
                    let n = wire::encode_inline(&mut chunk, Kind::Request, id, request);
                    Request::Encoded(chunk, n)
                }
                Err(_) => Request::Bytes(request.to_vec()),
            }
        };
        self.calls.insert(id, Call::Queued(request));
        self.queue.push_back(Queued::Call(id));
        Ok(id)
    }

    /// Whether every slot of the window is held by something no caller
    /// waits for: a call abandoned unanswered, or a release sent and not
    /// answered.
    fn window_held_for_nobody(&self) -> bool {
        self.window > 0 && self.abandoned.len() + self.releases.len() >= self.window
    }

    /// Gives up on call `id`: its answer, if one comes, is dropped (a
    /// large one released unread).
    pub(super) fn abandon(&mut self, id: u64) {
        // Queued: skipped when its turn comes. Sent or reading: the
        // answer finds no call.
        if let Some(Call::Sent(exposed)) = self.calls.remove(&id) {
            self.abandoned.insert(id);
            // The grace for their answers runs from when they first held
            // the whole window.
            if self.window_held_for_nobody() {
                self.stalled_since.get_or_insert_with(Instant::now);
            }
            if let Some(exposed) = exposed {
                self.orphans.insert(id, exposed);
            }
        }
    }

    /// The result of call `id`, if it is in.
    pub(super) fn take_result(&mut self, id: u64) -> Option<Result<Vec<u8>, RpcError>> {
        match self.calls.get(&id) {
            Some(Call::Done(_)) => match self.calls.remove(&id) {
                Some(Call::Done(result)) => Some(result),
                _ => unreachable!("checked"),
            },
            Some(_) => None,
            None => Some(Err(self.failure.clone().unwrap_or_else(|| {
                RpcError::Protocol(format!("call {id} is unknown to this client"))
            }))),
        }
    }

    fn finish(&mut self, id: u64, result: Result<Vec<u8>, RpcError>) {
        if let Some(call) = self.calls.get_mut(&id) {
            *call = Call::Done(result);
            self.finished = true;
        }
    }

    /// Whether call `id` has its result (or is gone).
    pub(super) fn has_result(&self, id: u64) -> bool {
        matches!(self.calls.get(&id), Some(Call::Done(_)) | None)
    }

    /// Whether nothing of ours is in flight or waiting to go: a read of a
    /// large response included (its release follows it).
    pub(super) fn idle(&self) -> bool {
        self.unanswered == 0
            && self.reads_in_flight == 0
            && self.reads.is_empty()
            && self.queue.is_empty()
    }

    /// Whether only the server's messages can move things on (no read in
    /// flight, nothing queued for a send buffer): then a sleeper may wait
    /// for solicited completions only.
    pub(super) fn waits_for_server_only(&self) -> bool {
        self.reads_in_flight == 0 && self.reads.is_empty() && self.queue.is_empty()
    }

    /// Fails the connection: every call not finished gets `e`.
    pub(super) fn fail(&mut self, e: RpcError) {
        if self.failure.is_some() {
            return;
        }
        self.failure = Some(e.clone());
        self.fail_qp = true;
        for call in self.calls.values_mut() {
            if !matches!(call, Call::Done(_)) {
                *call = Call::Done(Err(e.clone()));
            }
        }
        self.queue.clear();
        self.finished = true;
    }

    pub(super) fn on_completion(&mut self, c: Completion) {
        match c.kind() {
            OpKind::Recv => self.on_receive(c),
            OpKind::Read => {
                self.reads_in_flight = self.reads_in_flight.saturating_sub(1);
                let id = c.user_data() & !READ;
                let status = c.status();
                let buf = c.into_buf();
                if !status.is_success() {
                    self.fail(RpcError::Disconnected(format!(
                        "reading a response failed: {status}"
                    )));
                    return;
                }
                if self.calls.contains_key(&id) {
                    self.finish(id, Ok(buf.to_vec()));
                }
                let release = self.fresh_id();
                self.queue.push_front(Queued::Release {
                    id: release,
                    call: id,
                });
            }
            _ => {
                if !c.status().is_success() && self.failure.is_none() {
                    self.fail(RpcError::Disconnected(format!(
                        "a send failed: {}",
                        c.status()
                    )));
                }
            }
        }
    }

    fn on_receive(&mut self, c: Completion) {
        let (status, len, tag) = (c.status(), c.byte_len() as usize, c.user_data());
        let by_write = c.is_write_imm();
        let Ok(chunk) = c.into_buf().downcast::<PoolChunk>() else {
            return;
        };
        if status == WcStatus::LocLenErr {
            // The server's hello said how large a message may be.
            let size = self.buffer_size();
            return self.fail(RpcError::Protocol(format!(
                "a message longer than the receive buffers' {size} bytes"
            )));
        }
        if !status.is_success() {
            self.fail(RpcError::Disconnected(format!(
                "a receive failed: {status}"
            )));
            return;
        }
        if self.failure.is_some() {
            return;
        }
        if by_write {
            // Its buffer holds whatever an earlier message left there.
            return self.fail(RpcError::Protocol(
                "an RDMA WRITE with immediate used up a receive: not part of the protocol".into(),
            ));
        }
        let bytes = &chunk[..len.min(chunk.len())];
        let message = match Message::decode(bytes) {
            Ok(m) => m,
            Err(why) => return self.fail(RpcError::Protocol(why)),
        };
        if tag == HELLO {
            match message {
                Message::Hello(hello) => self.on_hello(hello),
                Message::Error { id: 0, code, text } => self.fail(connection_error(code, text)),
                other => self.fail(RpcError::Protocol(format!(
                    "the server's first message is not a hello: {other:?}"
                ))),
            }
            return; // the hello's buffer is not posted again
        }
        match message {
            Message::Response { id, body } => {
                if self.answered(id) && self.calls.contains_key(&id) {
                    let result = if body.len() > self.max_message() {
                        // Inline, when max_message is below what a receive
                        // buffer holds: refused as a large one would be.
                        Err(RpcError::TooLarge(format!(
                            "a response of {} bytes is longer than max_message {}",
                            body.len(),
                            self.max_message()
                        )))
                    } else {
                        Ok(body.to_vec())
                    };
                    self.finish(id, result);
                }
            }
            Message::ResponseRendezvous { id, remote } => {
                if !self.answered(id) {
                    return;
                }
                // Read or not, it is released below or once read.
                self.holding += 1;
                let wanted = self.calls.contains_key(&id);
                if wanted && remote.len() as usize <= self.max_message() {
                    match RegisteredBuf::new(&*self.pd, vec![0u8; remote.len() as usize]) {
                        Ok(buf) => {
                            self.calls.insert(id, Call::Reading);
                            self.reads.push((id, buf, remote));
                            // The release goes after the read.
                        }
                        Err(refused) => {
                            let why =
                                format!("registering the response failed: {}", refused.error());
                            self.finish(id, Err(RpcError::Busy(why)));
                            let release = self.fresh_id();
                            self.queue.push_front(Queued::Release {
                                id: release,
                                call: id,
                            });
                        }
                    }
                } else {
                    if wanted {
                        let why = format!(
                            "a response of {} bytes is longer than max_message {}",
                            remote.len(),
                            self.max_message()
                        );
                        self.finish(id, Err(RpcError::TooLarge(why)));
                    }
                    let release = self.fresh_id();
                    self.queue.push_front(Queued::Release {
                        id: release,
                        call: id,
                    });
                }
            }
            Message::Released { id } => {
                if self.releases.remove(&id).is_none() {
                    return self.fail(RpcError::Protocol(format!(
                        "an answer to release {id}, which was never sent"
                    )));
                }
                self.unanswered = self.unanswered.saturating_sub(1);
                self.stalled_since = None;
            }
            Message::Error { id: 0, code, text } => self.fail(connection_error(code, text)),
            Message::Error { id, code, text } => {
                if self.answered(id) && self.calls.contains_key(&id) {
                    self.finish(id, Err(call_error(code, text)));
                }
            }
            Message::Goodbye => {
                self.goodbye = true;
                let queued: Vec<u64> = self
                    .queue
                    .iter()
                    .filter_map(|q| match q {
                        Queued::Call(id) => Some(*id),
                        Queued::Release { .. } => None,
                    })
                    .collect();
                self.queue.retain(|q| matches!(q, Queued::Release { .. }));
                for id in queued {
                    self.finish(id, Err(RpcError::ShuttingDown));
                }
            }
            other => {
                return self.fail(RpcError::Protocol(format!(
                    "the server sent a message only clients send: {other:?}"
                )))
            }
        }
        if self.failure.is_none() {
            self.to_post.push(chunk);
        }
    }

    /// Accounts for an answer to call `id`; false (and the connection
    /// failed) if no such call was ever sent.
    fn answered(&mut self, id: u64) -> bool {
        let sent = match self.calls.get(&id) {
            Some(Call::Sent(_)) => true,
            Some(_) => false,
            // A late answer to a call abandoned after it was sent, once; a
            // second answer, or one to a call never sent, is a lie.
            None => self.abandoned.remove(&id),
        };
        if !sent {
            self.fail(RpcError::Protocol(format!(
                "an answer to call {id}, which is not waiting for one"
            )));
            return false;
        }
        self.unanswered = self.unanswered.saturating_sub(1);
        // An answer is progress: a window held for nobody again is a
        // stall from then on.
        self.stalled_since = None;
        self.orphans.remove(&id);
        // The request's exposed buffer (if any) goes now: the server has
        // read it.
        if let Some(Call::Sent(_)) = self.calls.get(&id) {
            self.calls.insert(id, Call::Reading);
        }
        true
    }

    fn on_hello(&mut self, hello: Hello) {
        let window = usize::from(hello.window).min(usize::from(self.config.window));
        let size = hello.buffer_size as usize;
        // Answers the window allows, and two for the server's unsolicited
        // messages (goodbye, a connection error).
        let recv = BufferPool::new(&*self.pd, size, window + 2);
        let send = BufferPool::new(&*self.pd, size, 2 * window + 2);
        match (recv, send) {
            (Ok(recv), Ok(send)) => {
                for _ in 0..window + 2 {
                    self.to_post.push(recv.take().expect("sized"));
                }
                self.recv_pool = Some(recv);
                self.send_pool = Some(send);
                self.window = window;
                self.hello = Some(hello);
            }
            (Err(e), _) | (_, Err(e)) => {
                self.fail(RpcError::Busy(format!("registering buffers failed: {e}")))
            }
        }
    }

    /// Pushes receives to post again, reads, and what the window lets go.
    pub(super) fn pump<Q: QueuePair>(&mut self, sq: &mut SubmissionQueue<'_, Q>) -> bool {
        if self.window_held_for_nobody() && self.failure.is_none() {
            // Every slot is held by a call abandoned unanswered or by a
            // release: calls wait for their answers, late or not. A
            // server that gives none within a call timeout is stuck, and
            // no call could go any more.
            let since = *self.stalled_since.get_or_insert_with(Instant::now);
            if since.elapsed() >= self.config.call_timeout {
                self.fail(RpcError::Disconnected(format!(
                    "the server left {} abandoned calls and {} releases unanswered, \
                     the whole window, for {:?}",
                    self.abandoned.len(),
                    self.releases.len(),
                    self.config.call_timeout
                )));
                return false;
            }
        } else {
            self.stalled_since = None;
        }
        let mut pushed = false;
        while let Some(chunk) = self.to_post.pop() {
            match sq.push(Recv::new(chunk).user_data(RECV)) {
                Ok(()) => pushed = true,
                Err(refused) => {
                    let chunk = refused.into_parts().1.into_buf();
                    self.to_post.push(chunk);
                    break;
                }
            }
        }
        while let Some((id, buf, remote)) = self.reads.pop() {
            match sq.push(Read::new(buf, remote).user_data(READ | id)) {
                Ok(()) => {
                    pushed = true;
                    self.reads_in_flight += 1;
                }
                Err(refused) => {
                    let buf = refused.into_parts().1.into_buf();
                    self.reads.push((id, buf, remote));
                    break;
                }
            }
        }
        if self.goodbye && !self.closed && self.idle() {
            // The server shuts down: once nothing of ours is in flight,
            // say so, and it lets the connection go.
            pushed |= self.push_close(sq);
        }
        while self.unanswered < self.window {
            let Some(&next) = self.queue.front() else {
                break;
            };
            if matches!(next, Queued::Call(_)) && !self.call_may_go() {
                // Releases are queued ahead of calls: none waits behind.
                break;
            }
            self.queue.pop_front();
            match self.push_one(sq, next) {
                Ok(true) => {
                    self.unanswered += 1;
                    pushed = true;
                }
                Ok(false) => {} // abandoned
                Err(()) => {
                    self.queue.push_front(next);
                    break;
                }
            }
        }
        pushed
    }

    /// Pushes one queued message: `Ok(false)` if it was abandoned,
    /// `Err` if there is no room (it stays queued).
    fn push_one<Q: QueuePair>(
        &mut self,
        sq: &mut SubmissionQueue<'_, Q>,
        next: Queued,
    ) -> Result<bool, ()> {
        let pool = self.send_pool.as_ref().expect("after hello");
        match next {
            Queued::Release { id, call } => {
                let mut chunk = pool.take().map_err(|_| ())?;
                let n = wire::encode_with_aux(&mut chunk, Kind::Release, id, call, &[]);
                self.push_send(sq, chunk, n).map_err(|_| ())?;
                self.releases.insert(id, call);
                self.holding -= 1;
                Ok(true)
            }
            Queued::Call(id) => {
                let Some(Call::Queued(request)) = self.calls.remove(&id) else {
                    return Ok(false);
                };
                let (chunk, n, exposed) = match request {
                    Request::Encoded(chunk, n) => (chunk, n, None),
                    Request::Bytes(bytes) => match pool.take() {
                        Ok(mut chunk) => {
                            let n = wire::encode_inline(&mut chunk, Kind::Request, id, &bytes);
                            (chunk, n, None)
                        }
                        Err(_) => {
                            self.calls.insert(id, Call::Queued(Request::Bytes(bytes)));
                            return Err(());
                        }
                    },
                    Request::Exposed(exposed) => match pool.take() {
                        Ok(mut chunk) => {
                            let n = wire::encode_rendezvous(
                                &mut chunk,
                                Kind::RequestRendezvous,
                                id,
                                &exposed.remote(),
                            );
                            (chunk, n, Some(exposed))
                        }
                        Err(_) => {
                            self.calls
                                .insert(id, Call::Queued(Request::Exposed(exposed)));
                            return Err(());
                        }
                    },
                };
                match self.push_send(sq, chunk, n) {
                    Ok(()) => {
                        self.calls.insert(id, Call::Sent(exposed));
                        Ok(true)
                    }
                    Err(chunk) => {
                        let request = match exposed {
                            Some(exposed) => Request::Exposed(exposed),
                            None => Request::Encoded(chunk, n),
                        };
                        self.calls.insert(id, Call::Queued(request));
                        Err(())
                    }
                }
            }
        }
    }

    /// Pushes the close message (once); returns whether it went.
    pub(super) fn push_close<Q: QueuePair>(&mut self, sq: &mut SubmissionQueue<'_, Q>) -> bool {
        if self.closed || self.hello.is_none() || self.failure.is_some() {
            return false;
        }
        let Some(Ok(mut chunk)) = self.send_pool.as_ref().map(BufferPool::take) else {
            return false;
        };
        let n = wire::encode_inline(&mut chunk, Kind::Close, 0, &[]);
        let mut op = Send::new(chunk.slice(..n)).user_data(CLOSE);
        if n <= self.max_inline {
            op = op.inline();
        }
        self.closed = sq.push(op).is_ok();
        self.closed
    }

    fn push_send<Q: QueuePair>(
        &self,
        sq: &mut SubmissionQueue<'_, Q>,
        chunk: PoolChunk,
        n: usize,
    ) -> Result<(), PoolChunk> {
        let mut op = Send::new(chunk.slice(..n)).user_data(SEND);
        if n <= self.max_inline {
            op = op.inline();
        }
        sq.push(op)
            .map_err(|refused| refused.into_parts().1.into_buf().into_inner())
    }
}

fn call_error(code: ErrorCode, text: &str) -> RpcError {
    let text = text.to_string();
    match code {
        ErrorCode::Handler => RpcError::Handler(text),
        ErrorCode::Panicked => RpcError::Panicked(text),
        ErrorCode::TooLarge => RpcError::TooLarge(text),
        ErrorCode::ReadFailed => RpcError::ReadFailed(text),
        ErrorCode::ShuttingDown => RpcError::ShuttingDown,
        ErrorCode::Busy => RpcError::Busy(text),
        ErrorCode::Protocol => RpcError::Protocol(format!("the server says: {text}")),
    }
}

fn connection_error(code: ErrorCode, text: &str) -> RpcError {
    match code {
        ErrorCode::Busy => RpcError::Busy(text.to_string()),
        ErrorCode::ShuttingDown => RpcError::ShuttingDown,
        _ => RpcError::Protocol(format!("the server closed the connection: {text}")),
    }
}
