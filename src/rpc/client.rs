//! The client: calls in flight, matched to answers by id, within the
//! server's window; blocking and awaitable.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use futures_core::Stream;

use super::wire::{self, ErrorCode, Hello, Kind, Message, HEADER_LEN};
use super::{RpcConfig, RpcError};
use crate::backend::{CompletionQueue as _, ProtectionDomain, QueuePair};
use crate::buf::{
    BaseBuf, BufferPool, ExposedBuf, PoolChunk, RegisteredBuf, RemoteAccess, RemoteSlice,
};
use crate::future::{AsyncRing, CompletionStream, Wakeup};
use crate::op::{OpKind, Read, Recv, Send};
use crate::ring::{Completion, Ring, RingConfig, SubmissionQueue};
use crate::Error;

/// Tags of the client's operations.
const RECV: u64 = 1;
const HELLO: u64 = 2;
const SEND: u64 = 3;
const CLOSE: u64 = 4;
/// How long dropping a client waits for its close message to leave.
const CLOSE_LINGER: Duration = Duration::from_millis(200);
/// Tag bit of rendezvous reads; the rest is the call id.
const READ: u64 = 1 << 63;
/// The hello's receive buffer: a hello, or a refusal's error text.
const HELLO_BUFFER: usize = 512;

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
struct ClientCore {
    pd: Arc<dyn ProtectionDomain>,
    config: RpcConfig,
    hello: Option<Hello>,
    window: usize,
    max_inline: usize,
    next_id: u64,
    unanswered: usize,
    queue: VecDeque<Queued>,
    calls: HashMap<u64, Call>,
    /// Releases sent and not answered.
    releases: HashMap<u64, u64>,
    /// Large requests of abandoned calls, exposed until their answer
    /// shows the server is done reading them (revoking earlier would
    /// fail the server's read, and with it the connection).
    orphans: HashMap<u64, ExposedBuf<Vec<u8>>>,
    recv_pool: Option<BufferPool>,
    send_pool: Option<BufferPool>,
    to_post: Vec<PoolChunk>,
    reads: Vec<(u64, RegisteredBuf, RemoteSlice)>,
    failure: Option<RpcError>,
    fail_qp: bool,
    goodbye: bool,
    /// Calls whose result arrived since the last wake.
    finished: bool,
}

impl ClientCore {
    fn new(pd: Arc<dyn ProtectionDomain>, config: RpcConfig, max_inline: usize) -> Self {
        ClientCore {
            pd,
            config,
            hello: None,
            window: 0,
            max_inline,
            next_id: 1,
            unanswered: 0,
            queue: VecDeque::new(),
            calls: HashMap::new(),
            releases: HashMap::new(),
            orphans: HashMap::new(),
            recv_pool: None,
            send_pool: None,
            to_post: Vec::new(),
            reads: Vec::new(),
            failure: None,
            fail_qp: false,
            goodbye: false,
            finished: false,
        }
    }

    fn buffer_size(&self) -> usize {
        self.hello.map_or(0, |h| h.buffer_size as usize)
    }

    fn max_message(&self) -> usize {
        let server = self.hello.map_or(0, |h| h.max_message);
        server.min(self.config.max_message) as usize
    }

    fn fresh_id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    /// Starts a call; returns its id.
    fn start(&mut self, request: &[u8]) -> Result<u64, RpcError> {
        if let Some(e) = &self.failure {
            return Err(e.clone());
        }
        if self.goodbye {
            return Err(RpcError::ShuttingDown);
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
        let leaves_now = self.queue.is_empty() && self.unanswered < self.window;
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

    /// Gives up on call `id`: its answer, if one comes, is dropped (a
    /// large one released unread).
    fn abandon(&mut self, id: u64) {
        // Queued: skipped when its turn comes. Sent or reading: the
        // answer finds no call.
        if let Some(Call::Sent(Some(exposed))) = self.calls.remove(&id) {
            self.orphans.insert(id, exposed);
        }
    }

    /// The result of call `id`, if it is in.
    fn take_result(&mut self, id: u64) -> Option<Result<Vec<u8>, RpcError>> {
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

    /// Fails the connection: every call not finished gets `e`.
    fn fail(&mut self, e: RpcError) {
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

    fn on_completion(&mut self, c: Completion) {
        match c.kind() {
            OpKind::Recv => self.on_receive(c),
            OpKind::Read => {
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
        let Ok(chunk) = c.into_buf().downcast::<PoolChunk>() else {
            return;
        };
        if !status.is_success() {
            self.fail(RpcError::Disconnected(format!(
                "a receive failed: {status}"
            )));
            return;
        }
        if self.failure.is_some() {
            return;
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
                    self.finish(id, Ok(body.to_vec()));
                }
            }
            Message::ResponseRendezvous { id, remote } => {
                if !self.answered(id) {
                    return;
                }
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
            // Abandoned calls were sent (or are still queued: then an
            // answer is a lie, but one we cannot tell from a late one).
            None => id != 0 && id < self.next_id,
        };
        if !sent {
            self.fail(RpcError::Protocol(format!(
                "an answer to call {id}, which is not waiting for one"
            )));
            return false;
        }
        self.unanswered = self.unanswered.saturating_sub(1);
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
    fn pump<Q: QueuePair>(&mut self, sq: &mut SubmissionQueue<'_, Q>) -> bool {
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
                Ok(()) => pushed = true,
                Err(refused) => {
                    let buf = refused.into_parts().1.into_buf();
                    self.reads.push((id, buf, remote));
                    break;
                }
            }
        }
        while self.unanswered < self.window {
            let Some(next) = self.queue.pop_front() else {
                break;
            };
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

/// Wakers of the tasks (or threads) waiting on calls: any completion
/// wakes them all, and each looks for its own result. The first
/// registration after none unparks the notifier (if the client has one),
/// which then sleeps on the completion channel until nobody waits.
///
/// It also holds the client's driving token: one thread at a time (a
/// parked caller, or the notifier) sleeps on the completion channel and
/// drives the ring, and the others sleep until it wakes them.
#[derive(Default)]
struct CallWakers {
    waiting: Mutex<HashMap<u64, Waker>>,
    notifier: std::sync::OnceLock<std::thread::Thread>,
    driving: std::sync::atomic::AtomicBool,
}

impl CallWakers {
    /// Takes the driving token, if nobody holds it.
    fn try_drive(&self) -> bool {
        use std::sync::atomic::Ordering;
        self.driving
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Gives the token back and wakes every waiter (and the notifier), so
    /// that one of them takes it over.
    fn release_drive(self: &Arc<Self>) {
        self.driving
            .store(false, std::sync::atomic::Ordering::Release);
        self.wake_by_ref();
        if let Some(notifier) = self.notifier.get() {
            notifier.unpark();
        }
    }

    fn register(&self, id: u64, waker: &Waker) {
        let mut waiting = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
        let first = waiting.is_empty();
        match waiting.get(&id) {
            Some(w) if w.will_wake(waker) => {}
            _ => {
                waiting.insert(id, waker.clone());
            }
        }
        drop(waiting);
        if first {
            if let Some(notifier) = self.notifier.get() {
                notifier.unpark();
            }
        }
    }

    fn forget(&self, id: u64) {
        self.waiting
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id);
    }

    fn anyone_waiting(&self) -> bool {
        !self
            .waiting
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_empty()
    }
}

impl Wake for CallWakers {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let woken: Vec<Waker> = {
            let mut waiting = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
            waiting.drain().map(|(_, w)| w).collect()
        };
        for waker in woken {
            waker.wake();
        }
    }
}

/// How long the notifier sleeps on the completion channel before waking
/// the waiters anyway, so that they see their deadlines pass.
const NOTIFIER_TICK: Duration = Duration::from_millis(100);

/// The client's notifier thread ([`Wakeup::Thread`]): while any call is
/// parked or pending, it sleeps on the completion channel and drives the
/// ring; while none is, it sleeps, so a call answered while its caller
/// still polls costs no wake-up.
struct Notifier {
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Notifier {
    fn start<Q: QueuePair + std::marker::Send + 'static>(
        driver: crate::future::Driver<Q>,
        events: Arc<dyn crate::backend::CompletionEvents>,
        wakers: Arc<CallWakers>,
    ) -> Notifier {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("rdma-ring-rpc-notifier".into())
            .spawn(move || {
                use std::sync::atomic::Ordering;
                let mut holding = false;
                while !stopped.load(Ordering::Acquire) {
                    if !wakers.anyone_waiting() {
                        if std::mem::take(&mut holding) {
                            wakers.release_drive();
                        }
                        std::thread::park_timeout(NOTIFIER_TICK);
                        continue;
                    }
                    if !holding {
                        if !wakers.try_drive() {
                            // A parked caller drives; it wakes us when it
                            // lets go.
                            std::thread::park_timeout(NOTIFIER_TICK);
                            continue;
                        }
                        holding = true;
                        let _ = driver.drive();
                    }
                    let pending = events.wait(NOTIFIER_TICK).unwrap_or(false);
                    // Taking the events, re-arming and polling, in that
                    // order: a completion landing meanwhile raises a new
                    // event. The stream's waker wakes every waiter.
                    let reaped = driver.drive().unwrap_or(0);
                    if !pending && reaped == 0 {
                        // A quiet tick: waiters look at their deadlines.
                        wakers.wake_by_ref();
                    }
                }
                if holding {
                    wakers.release_drive();
                }
            })
            .expect("spawning the RPC notifier thread");
        Notifier {
            stop,
            thread: Some(thread),
        }
    }
}

/// The notifier's handle, for [`CallWakers::register`] to unpark.
fn wakers_notifier(thread: &std::thread::JoinHandle<()>) -> std::thread::Thread {
    thread.thread().clone()
}

impl Drop for Notifier {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Release);
        if let Some(thread) = self.thread.take() {
            thread.thread().unpark();
            let _ = thread.join();
        }
    }
}

struct ClientState<Q: QueuePair> {
    completions: CompletionStream<Q>,
    core: ClientCore,
}

struct ClientShared<Q: QueuePair + std::marker::Send + 'static> {
    ring: AsyncRing<Q>,
    state: Mutex<ClientState<Q>>,
    wakers: Arc<CallWakers>,
    config: RpcConfig,
    /// Whether nothing sleeps on the completion channel: a parked caller
    /// would never be woken, so callers poll instead.
    busy: bool,
    /// The completion channel, for the parked caller that drives.
    events: Option<Arc<dyn crate::backend::CompletionEvents>>,
    _notifier: Option<Notifier>,
}

impl<Q: QueuePair + std::marker::Send + 'static> ClientShared<Q> {
    fn lock(&self) -> MutexGuard<'_, ClientState<Q>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Applies the completions ready now and pushes what may go.
    fn turn(&self, state: &mut ClientState<Q>) {
        let waker = Waker::from(Arc::clone(&self.wakers));
        let mut cx = Context::from_waker(&waker);
        loop {
            match Pin::new(&mut state.completions).poll_next(&mut cx) {
                Poll::Ready(Some(c)) => state.core.on_completion(c),
                Poll::Ready(None) => {
                    state.core.fail(RpcError::Disconnected(
                        "the client's ring was closed".into(),
                    ));
                    break;
                }
                Poll::Pending => break,
            }
        }
        let core = &mut state.core;
        self.ring.with_ring(|mut ring| {
            if core.fail_qp {
                core.fail_qp = false;
                if let Some(qp) = ring.default_qp() {
                    let _ = ring.fail_qp(qp);
                }
            }
            if core.hello.is_some() || !core.to_post.is_empty() {
                let pushed = core.pump(&mut ring.submission());
                if pushed {
                    if let Err(e) = ring.submit() {
                        core.fail(RpcError::Disconnected(format!(
                            "the device refused work: {}",
                            e.error
                        )));
                    }
                }
            }
        });
        if std::mem::take(&mut core.finished) {
            self.wakers.wake_by_ref();
        }
    }

    /// Sleeps until call `id` may have progressed: as the driver (on the
    /// completion channel, then driving the ring, which wakes the others)
    /// if the token is free, else parked until the driver wakes it.
    fn sleep(&self, id: u64, deadline: Option<Instant>) {
        let tick = Duration::from_millis(10);
        let tick = deadline.map_or(tick, |d| {
            d.saturating_duration_since(Instant::now()).min(tick)
        });
        match &self.events {
            Some(events) if self.wakers.try_drive() => {
                // Take, re-arm and poll first: a completion that landed
                // since the last look raised no event that is still
                // pending.
                let _ = self.ring.drive();
                if !self.has_result(id) {
                    let _ = events.wait(tick);
                    let _ = self.ring.drive();
                }
                self.wakers.release_drive();
            }
            // poll_call registered this caller: the driver's completions
            // wake it, and so does the driver letting go of the token.
            _ => std::thread::park_timeout(tick),
        }
    }

    /// Whether call `id` has its result (or is gone), applying
    /// completions first.
    fn has_result(&self, id: u64) -> bool {
        let mut state = self.lock();
        self.turn(&mut state);
        matches!(state.core.calls.get(&id), Some(Call::Done(_)) | None)
    }

    /// Looks for call `id`'s result, applying completions first. With
    /// `register`, the waker is registered (before looking, so that a
    /// completion delivered meanwhile wakes this call rather than nobody).
    fn poll_call(
        &self,
        id: u64,
        deadline: Option<Instant>,
        cx: &mut Context<'_>,
        register: bool,
    ) -> Poll<Result<Vec<u8>, RpcError>> {
        if register {
            self.wakers.register(id, cx.waker());
        }
        let mut state = self.lock();
        self.turn(&mut state);
        if let Some(result) = state.core.take_result(id) {
            self.wakers.forget(id);
            return Poll::Ready(result);
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            state.core.abandon(id);
            self.wakers.forget(id);
            return Poll::Ready(Err(RpcError::Timeout(self.config.call_timeout)));
        }
        if self.busy && register {
            cx.waker().wake_by_ref();
        }
        Poll::Pending
    }
}

impl<Q: QueuePair + std::marker::Send + 'static> Drop for ClientShared<Q> {
    /// Tells the server the client leaves (so it frees the connection at
    /// once), if the window has room for one more message, and waits
    /// briefly for that to leave.
    fn drop(&mut self) {
        let state = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        let core = &mut state.core;
        if core.hello.is_none() || core.failure.is_some() || core.unanswered >= core.window {
            return;
        }
        let Some(Ok(mut chunk)) = core.send_pool.as_ref().map(BufferPool::take) else {
            return;
        };
        let n = wire::encode_inline(&mut chunk, Kind::Close, 0, &[]);
        let pushed = self.ring.with_ring(|mut ring| {
            let pushed = ring
                .submission()
                .push(Send::new(chunk.slice(..n)).user_data(CLOSE))
                .is_ok();
            pushed && ring.submit().is_ok()
        });
        if !pushed {
            return;
        }
        let waker = Waker::from(Arc::clone(&self.wakers));
        let mut cx = Context::from_waker(&waker);
        let deadline = Instant::now() + CLOSE_LINGER;
        while Instant::now() < deadline {
            match Pin::new(&mut state.completions).poll_next(&mut cx) {
                Poll::Ready(Some(c)) if c.user_data() == CLOSE => return,
                Poll::Ready(Some(_)) => {}
                Poll::Ready(None) => return,
                Poll::Pending => std::thread::sleep(Duration::from_micros(100)),
            }
        }
    }
}

/// A connection to an [`RpcServer`](super::RpcServer): calls from any
/// number of threads or tasks at once, up to the server's window in
/// flight (more wait their turn, in order). Clone it to share it.
///
/// `call` blocks the thread; `call_async` returns a future for any
/// executor. Each call times out after the config's `call_timeout`; a
/// dropped future abandons its call (its answer, when it comes, is
/// dropped). With [`Wakeup::Reactor`], drive [`ring`](Self::ring) from
/// your reactor; timeouts are then noticed when the call is next polled.
pub struct RpcClient<Q: QueuePair + std::marker::Send + 'static> {
    shared: Arc<ClientShared<Q>>,
}

impl<Q: QueuePair + std::marker::Send + 'static> Clone for RpcClient<Q> {
    fn clone(&self) -> Self {
        RpcClient {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<Q: QueuePair + std::marker::Send + 'static> std::fmt::Debug for RpcClient<Q> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.shared.lock();
        f.debug_struct("RpcClient")
            .field("client_id", &state.core.hello.map(|h| h.client_id))
            .field("window", &state.core.window)
            .field("in_flight", &state.core.unanswered)
            .finish_non_exhaustive()
    }
}

/// A client whose queue pair is made and whose hello receive is posted,
/// ready for the connection handshake.
pub(crate) struct PendingClient<Q: QueuePair> {
    ring: Ring<Q>,
    pd: Arc<dyn ProtectionDomain>,
    config: RpcConfig,
    _hello_pool: BufferPool,
}

impl<Q: QueuePair + std::marker::Send + 'static> PendingClient<Q> {
    /// Takes a fresh queue pair (with a completion queue of its own) and
    /// posts the receive for the server's hello.
    pub(crate) fn new(
        qp: Q,
        pd: Arc<dyn ProtectionDomain>,
        config: RpcConfig,
    ) -> Result<Self, Error> {
        let ring_config = RingConfig {
            spin_polls: config.spin_polls,
            ..RingConfig::default()
        };
        let mut ring = Ring::try_new(qp, ring_config).map_err(|r| r.into_parts().0)?;
        let hello_pool = BufferPool::new(&*pd, HELLO_BUFFER, 1)?;
        let chunk = hello_pool.take()?;
        ring.submission()
            .push(Recv::new(chunk).user_data(HELLO))
            .map_err(|r| r.into_parts().0)?;
        ring.submit().map_err(|e| e.error)?;
        Ok(PendingClient {
            ring,
            pd,
            config,
            _hello_pool: hello_pool,
        })
    }

    /// The queue pair, for the handshake.
    #[cfg_attr(not(feature = "verbs"), allow(dead_code))]
    pub(crate) fn qp(&self) -> &Q {
        self.ring.qp()
    }

    /// Waits for the server's hello (the queue pair is connected).
    pub(crate) fn establish(self) -> Result<RpcClient<Q>, RpcError> {
        let max_inline = self.ring.caps().max_inline_data as usize;
        // The ring's own wake-up is the reactor kind (the channel armed,
        // nothing sleeping on it): blocking callers poll, and only parked
        // callers and pending futures need the notifier.
        let events = self.ring.cq().completion_events();
        let wakeup = match (&events, self.config.wakeup) {
            (None, _) | (_, Wakeup::Busy) => Wakeup::Busy,
            (Some(_), _) => Wakeup::Reactor,
        };
        let ring =
            AsyncRing::new(self.ring, wakeup).map_err(|e| RpcError::Connect(e.to_string()))?;
        let completions = ring.completions();
        let wakers: Arc<CallWakers> = Arc::default();
        let notifier = match (&events, self.config.wakeup) {
            (Some(events), Wakeup::Thread) => {
                let notifier =
                    Notifier::start(ring.driver(), Arc::clone(events), Arc::clone(&wakers));
                let thread = notifier.thread.as_ref().map(wakers_notifier);
                if let Some(thread) = thread {
                    let _ = wakers.notifier.set(thread);
                }
                Some(notifier)
            }
            _ => None,
        };
        let shared = Arc::new(ClientShared {
            ring,
            state: Mutex::new(ClientState {
                completions,
                core: ClientCore::new(self.pd, self.config, max_inline),
            }),
            wakers,
            config: self.config,
            busy: wakeup == Wakeup::Busy,
            events,
            _notifier: notifier,
        });
        let deadline = Instant::now() + self.config.connect_timeout;
        loop {
            {
                let mut state = shared.lock();
                shared.turn(&mut state);
                if let Some(e) = &state.core.failure {
                    return Err(e.clone());
                }
                if state.core.hello.is_some() {
                    break;
                }
            }
            if Instant::now() >= deadline {
                return Err(RpcError::Connect(format!(
                    "no hello from the server within {:?}",
                    self.config.connect_timeout
                )));
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        Ok(RpcClient { shared })
    }
}

impl<Q: QueuePair + std::marker::Send + 'static> RpcClient<Q> {
    /// Sends `request` and waits for its response (up to the config's
    /// `call_timeout`).
    pub fn call(&self, request: &[u8]) -> Result<Vec<u8>, RpcError> {
        let id = self.start(request)?;
        let deadline = Instant::now().checked_add(self.shared.config.call_timeout);
        let waker = Waker::from(Arc::new(ThreadWaker(std::thread::current())));
        let mut cx = Context::from_waker(&waker);
        // Polling, the caller needs nobody to wake it; once it parks, it
        // registers, and the notifier (or a reactor) wakes it. It polls
        // only while a core is free for it: callers polling on every core
        // would starve whatever answers them.
        let mut spin = SpinSlot::take(self.shared.busy);
        let mut idle = 0usize;
        loop {
            if spin.is_some() && idle >= self.shared.config.spin_polls && !self.shared.busy {
                spin = None;
            }
            let park = spin.is_none() && !self.shared.busy;
            if let Poll::Ready(result) = self.shared.poll_call(id, deadline, &mut cx, park) {
                return result;
            }
            if park {
                self.shared.sleep(id, deadline);
            } else {
                idle += 1;
                // Yield rather than spin: the thread that completes this
                // call (a peer in this process, the device's own threads)
                // may need this core.
                std::thread::yield_now();
            }
        }
    }

    /// Sends `request`; the future resolves to its response. The request
    /// leaves at once (or when the window has room, in call order), not
    /// when the future is first polled.
    pub fn call_async(&self, request: &[u8]) -> CallFuture<Q> {
        let started = self.start(request);
        CallFuture {
            shared: Arc::clone(&self.shared),
            deadline: Instant::now().checked_add(self.shared.config.call_timeout),
            call: Some(started),
        }
    }

    fn start(&self, request: &[u8]) -> Result<u64, RpcError> {
        let mut state = self.shared.lock();
        let id = state.core.start(request)?;
        self.shared.turn(&mut state);
        Ok(id)
    }

    /// The server's name for this connection.
    pub fn client_id(&self) -> u32 {
        self.shared.lock().core.hello.map_or(0, |h| h.client_id)
    }

    /// Calls that may be unanswered at once.
    pub fn window(&self) -> usize {
        self.shared.lock().core.window
    }

    /// Whether the server said goodbye (new calls are refused).
    pub fn server_closing(&self) -> bool {
        let mut state = self.shared.lock();
        self.shared.turn(&mut state);
        state.core.goodbye
    }

    /// Why the connection failed, if it did.
    pub fn failure(&self) -> Option<RpcError> {
        let mut state = self.shared.lock();
        self.shared.turn(&mut state);
        state.core.failure.clone()
    }

    /// The client's ring (for stats, or its driver under
    /// [`Wakeup::Reactor`]).
    pub fn ring(&self) -> &AsyncRing<Q> {
        &self.shared.ring
    }
}

/// Blocking callers polling right now, over every client of the process.
static SPINNING: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Leave to poll: callers poll on all cores but one (and at least one),
/// so that polling callers leave room for the threads that answer them.
struct SpinSlot;

impl SpinSlot {
    /// A slot, if one is free (always, for a busy-polling client, which
    /// has nothing else to wait on).
    fn take(busy: bool) -> Option<SpinSlot> {
        use std::sync::atomic::Ordering;
        if busy {
            SPINNING.fetch_add(1, Ordering::AcqRel);
            return Some(SpinSlot);
        }
        // Asked once: the answer costs system calls (and cgroup reads).
        static LIMIT: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
        let limit = *LIMIT.get_or_init(|| {
            std::thread::available_parallelism().map_or(1, |n| n.get().saturating_sub(1).max(1))
        });
        SPINNING
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < limit).then_some(n + 1)
            })
            .ok()
            .map(|_| SpinSlot)
    }
}

impl Drop for SpinSlot {
    fn drop(&mut self) {
        SPINNING.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

struct ThreadWaker(std::thread::Thread);

impl Wake for ThreadWaker {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

/// A call in flight; resolves to its response. Dropping it abandons the
/// call.
pub struct CallFuture<Q: QueuePair + std::marker::Send + 'static> {
    shared: Arc<ClientShared<Q>>,
    deadline: Option<Instant>,
    /// The call's id, or why it could not start; `None` once resolved.
    call: Option<Result<u64, RpcError>>,
}

impl<Q: QueuePair + std::marker::Send + 'static> Future for CallFuture<Q> {
    type Output = Result<Vec<u8>, RpcError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let id = match self.call.take() {
            None => panic!("CallFuture polled after it resolved"),
            Some(Err(e)) => return Poll::Ready(Err(e)),
            Some(Ok(id)) => id,
        };
        match self.shared.poll_call(id, self.deadline, cx, true) {
            Poll::Ready(result) => Poll::Ready(result),
            Poll::Pending => {
                self.call = Some(Ok(id));
                Poll::Pending
            }
        }
    }
}

impl<Q: QueuePair + std::marker::Send + 'static> Drop for CallFuture<Q> {
    fn drop(&mut self) {
        if let Some(Ok(id)) = self.call {
            self.shared.lock().core.abandon(id);
            self.shared.wakers.forget(id);
        }
    }
}

impl<Q: QueuePair + std::marker::Send + 'static> std::fmt::Debug for CallFuture<Q> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallFuture").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::soft::{SoftDevice, SoftQp};
    use crate::backend::QpConfig;

    /// A client connected to a bare queue pair the test plays the server
    /// on: hello sent, receives posted.
    struct FakeServer {
        ring: Ring<SoftQp>,
        pool: BufferPool,
    }

    impl FakeServer {
        fn send(&mut self, bytes: &[u8]) {
            let mut chunk = self.pool.take().unwrap();
            chunk[..bytes.len()].copy_from_slice(bytes);
            self.ring
                .submission()
                .push(Send::new(chunk.slice(..bytes.len())))
                .unwrap();
            self.ring.submit().unwrap();
        }

        /// The next request's id.
        fn next_request(&mut self) -> u64 {
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                let mut out = Vec::new();
                self.ring.completion().reap(&mut out).unwrap();
                for c in out {
                    if c.kind() == OpKind::Recv {
                        let n = c.byte_len() as usize;
                        if let Ok(Message::Request { id, .. }) = Message::decode(&c.buf()[..n]) {
                            return id;
                        }
                    }
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            panic!("no request");
        }
    }

    fn connect() -> (RpcClient<SoftQp>, FakeServer) {
        let dev = SoftDevice::new();
        let (pd_c, pd_s) = (dev.alloc_pd(), dev.alloc_pd());
        let (client_qp, server_qp) = dev
            .connected_pair(&pd_c, &pd_s, QpConfig::default())
            .unwrap();
        let config = RpcConfig {
            call_timeout: Duration::from_secs(10),
            ..RpcConfig::default()
        };
        let pending = PendingClient::new(client_qp, Arc::new(pd_c), config).unwrap();
        let pool = BufferPool::new(&pd_s, 4096, 32).unwrap();
        let mut ring = Ring::new(server_qp, RingConfig::default());
        for _ in 0..16 {
            ring.submission()
                .push(Recv::new(pool.take().unwrap()))
                .unwrap();
        }
        ring.submit().unwrap();
        let mut server = FakeServer { ring, pool };
        let mut body = [0u8; wire::HELLO_LEN];
        Hello {
            window: 4,
            buffer_size: 4096,
            max_message: 1 << 20,
            client_id: 9,
        }
        .encode(&mut body);
        let mut buf = [0u8; 64];
        let n = wire::encode_inline(&mut buf, Kind::Hello, 0, &body);
        server.send(&buf[..n]);
        let client = pending.establish().unwrap();
        assert_eq!((client.client_id(), client.window()), (9, 4));
        (client, server)
    }

    #[test]
    fn an_answer_to_a_call_never_made_fails_the_connection() {
        let (client, mut server) = connect();
        let call = client.call_async(b"hello");
        let id = server.next_request();
        let mut buf = [0u8; 64];
        let n = wire::encode_inline(&mut buf, Kind::Response, id + 1000, b"lie");
        server.send(&buf[..n]);
        match futures::executor::block_on(call) {
            Err(RpcError::Protocol(why)) => assert!(why.contains("not waiting"), "{why}"),
            other => panic!("expected a protocol error, got {other:?}"),
        }
        assert!(matches!(client.call(b"again"), Err(RpcError::Protocol(_))));
    }

    #[test]
    fn garbage_and_client_only_messages_from_the_server_fail_the_connection() {
        let (client, mut server) = connect();
        let call = client.call_async(b"x");
        server.next_request();
        server.send(b"\x00\x01garbage that is long enough for a header");
        match futures::executor::block_on(call) {
            Err(RpcError::Protocol(why)) => assert!(why.contains("magic"), "{why}"),
            other => panic!("expected a protocol error, got {other:?}"),
        }
        let (client, mut server) = connect();
        let call = client.call_async(b"x");
        server.next_request();
        let mut buf = [0u8; 64];
        let n = wire::encode_inline(&mut buf, Kind::Request, 1, b"turnabout");
        server.send(&buf[..n]);
        match futures::executor::block_on(call) {
            Err(RpcError::Protocol(why)) => assert!(why.contains("only clients send"), "{why}"),
            other => panic!("expected a protocol error, got {other:?}"),
        }
    }

    #[test]
    fn a_rendezvous_response_larger_than_allowed_is_refused_and_released() {
        let (client, mut server) = connect();
        let call = client.call_async(b"x");
        let id = server.next_request();
        let remote = RemoteSlice::new(0x1000, 2 << 20, 5, RemoteAccess::READ);
        let mut buf = [0u8; 64];
        let n = wire::encode_rendezvous(&mut buf, Kind::ResponseRendezvous, id, &remote);
        server.send(&buf[..n]);
        match futures::executor::block_on(call) {
            Err(RpcError::TooLarge(why)) => assert!(why.contains("2097152"), "{why}"),
            other => panic!("expected TooLarge, got {other:?}"),
        }
        // The client releases the buffer it will not read.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            assert!(Instant::now() < deadline, "no release");
            let mut out = Vec::new();
            server.ring.completion().reap(&mut out).unwrap();
            let released = out.iter().any(|c| {
                c.kind() == OpKind::Recv
                    && matches!(
                        Message::decode(&c.buf()[..c.byte_len() as usize]),
                        Ok(Message::Release { call, .. }) if call == id
                    )
            });
            if released {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}
