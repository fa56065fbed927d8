//! The client: calls from any number of threads or tasks over one
//! connection, blocking or awaited, and what wakes them.
//!
//! A blocking caller polls the ring itself while a core is free for it,
//! then sleeps on the completion channel as the client's driver (one at a
//! time; the others park until it wakes them). The notifier thread
//! ([`Wakeup::Thread`]) does the same for awaiting tasks and for the
//! connection's own business (answers nobody polls for, large responses
//! to read, the server's goodbye), and keeps out of the way while
//! blocking callers are active, so a call answered while its caller polls
//! costs no wake-up.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use futures_core::Stream;

use super::client_core::{ClientCore, HELLO};
use super::waking::{CallWakers, CallerGuard, SpinSlot};
use super::{RpcConfig, RpcError};
use crate::backend::{CompletionEvents, CompletionQueue as _, ProtectionDomain, QueuePair};
use crate::buf::BufferPool;
use crate::deadline::Deadline;
use crate::future::{AsyncRing, CompletionFd, CompletionStream, Wakeup};
use crate::op::Recv;
use crate::ring::{Ring, RingConfig, RingStats};
use crate::thread_waker::ThreadWaker;
use crate::wakers::Deferral;
use crate::Error;

/// How long dropping a client waits for its close message to leave.
const CLOSE_LINGER: Duration = Duration::from_millis(200);
/// The hello's receive buffer: a hello, or a refusal's error text.
const HELLO_BUFFER: usize = 512;
/// How long the notifier sleeps on the completion channel before waking
/// the waiters anyway, so that they see their deadlines pass.
const NOTIFIER_TICK: Duration = Duration::from_millis(100);
/// How long after a blocking call the notifier leaves the ring to the
/// callers (back-to-back calls would otherwise wake it each time).
const STEP_ASIDE: Duration = Duration::from_millis(5);
/// The longest a parked caller sleeps between looks.
const PARK_TICK: Duration = Duration::from_millis(10);

struct ClientState<Q: QueuePair> {
    completions: CompletionStream<Q>,
    core: ClientCore,
}

/// The state, locked; wakes found meanwhile run after the unlock.
struct Locked<'a, Q: QueuePair> {
    // Declared first, dropped first: the lock goes before the wakes.
    guard: MutexGuard<'a, ClientState<Q>>,
    _deferral: Deferral,
}

impl<Q: QueuePair> std::ops::Deref for Locked<'_, Q> {
    type Target = ClientState<Q>;
    fn deref(&self) -> &ClientState<Q> {
        &self.guard
    }
}

impl<Q: QueuePair> std::ops::DerefMut for Locked<'_, Q> {
    fn deref_mut(&mut self) -> &mut ClientState<Q> {
        &mut self.guard
    }
}

struct ClientShared<Q: QueuePair + std::marker::Send + 'static> {
    ring: AsyncRing<Q>,
    state: Mutex<ClientState<Q>>,
    wakers: Arc<CallWakers>,
    config: RpcConfig,
    /// Whether nothing sleeps on the completion channel: a parked caller
    /// would never be woken, so callers poll instead.
    busy: bool,
    /// The completion channel, for whichever waiter drives.
    events: Option<Arc<dyn CompletionEvents>>,
    notifier: OnceLock<Notifier>,
    /// The deadline the timer will tell this client of, if any: the
    /// earliest of its waiting calls' when it was set.
    timer_armed: Mutex<Option<Instant>>,
    /// The handshake's socket, kept open while connected: each side
    /// watches it for the other's end.
    socket: Option<std::net::TcpStream>,
    /// When the socket was last looked at by a call or `progress` (the
    /// notifier thread, where there is one, looks on its own).
    watched: Mutex<Instant>,
}

impl<Q: QueuePair + std::marker::Send + 'static> super::timer::Target for ClientShared<Q> {
    fn fired(&self, at: Instant) {
        {
            let mut armed = self.timer_armed.lock().unwrap_or_else(|p| p.into_inner());
            if *armed == Some(at) {
                *armed = None;
            }
        }
        // Every waiting call looks: those whose time is up resolve, and the
        // first of the rest to wait again sets the next deadline.
        self.wakers.wake_by_ref();
    }
}

impl<Q: QueuePair + std::marker::Send + 'static> ClientShared<Q> {
    /// Sees that a call waiting until `deadline` is woken by then. With
    /// no notifier thread ticking and no busy polling, only a completion
    /// would wake it, and an unanswered call would wait for ever; so the
    /// timer is asked to tell this client, unless it will already be
    /// told by then.
    fn wake_at(self: &Arc<Self>, deadline: Instant) {
        if self.busy || self.notifier.get().is_some() {
            return;
        }
        let mut armed = self.timer_armed.lock().unwrap_or_else(|p| p.into_inner());
        if armed.is_some_and(|at| at <= deadline) {
            return;
        }
        let target: Arc<dyn super::timer::Target> = Arc::clone(self) as _;
        if super::timer::tell_at(deadline, Arc::downgrade(&target)) {
            *armed = Some(deadline);
        }
    }

    fn lock(&self) -> Locked<'_, Q> {
        let deferral = Deferral::start();
        Locked {
            guard: self.state.lock().unwrap_or_else(|p| p.into_inner()),
            _deferral: deferral,
        }
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
    /// completion channel) if the token is free, else parked until the
    /// driver wakes it (poll_call registered it).
    fn sleep(&self, id: u64, deadline: Option<Instant>) {
        let tick = deadline.map_or(PARK_TICK, |d| {
            d.saturating_duration_since(Instant::now()).min(PARK_TICK)
        });
        match &self.events {
            Some(events) if self.wakers.try_drive() => {
                // Arm, then look once more: a completion that landed
                // before the arm raised no event. Then sleep, and take
                // the event; the caller's next look applies what came.
                match self.arm_and_look(&**events, || self.has_result(id)) {
                    Some(false) => {
                        if events.wait(tick).unwrap_or(false) {
                            let _ = events.take();
                        }
                    }
                    Some(true) => {}
                    // No event will come (the device is failing): the next
                    // look waits a tick, rather than spin.
                    None => std::thread::park_timeout(tick),
                }
                self.wakers.release_drive();
            }
            _ => std::thread::park_timeout(tick),
        }
    }

    /// Arms the channel for what can move the connection on (the
    /// server's solicited messages only, unless a read or a send buffer
    /// is awaited), then runs `look`. A look that starts a read or queues
    /// a message while the channel waits for the server only (a response
    /// to fetch that arrived before the arm) arms it for any completion
    /// and looks again: that read's completion is not solicited, and would
    /// wake no one. Returns the last look's answer, or `None` if the
    /// channel could not be armed.
    fn arm_and_look(
        &self,
        events: &dyn CompletionEvents,
        mut look: impl FnMut() -> bool,
    ) -> Option<bool> {
        let mut server_only = self.lock().core.waits_for_server_only();
        loop {
            let armed = if server_only {
                events.arm_solicited()
            } else {
                events.arm()
            };
            armed.ok()?;
            let seen = look();
            if !server_only || self.lock().core.waits_for_server_only() {
                return Some(seen);
            }
            server_only = false;
        }
    }

    /// Whether call `id` has its result (or is gone), applying
    /// completions first.
    fn has_result(&self, id: u64) -> bool {
        let mut state = self.lock();
        self.turn(&mut state);
        state.core.has_result(id)
    }

    /// Looks for call `id`'s result, applying completions first. With
    /// `register`, the waker is registered (before looking, so that a
    /// completion delivered meanwhile wakes this call rather than nobody).
    fn poll_call(
        &self,
        id: u64,
        deadline: Option<Instant>,
        timeout: Duration,
        cx: &mut Context<'_>,
        register: bool,
    ) -> Poll<Result<Vec<u8>, RpcError>> {
        if register {
            self.wakers.register(id, cx.waker());
        }
        self.watch_server_in_time();
        let mut state = self.lock();
        self.turn(&mut state);
        if let Some(result) = state.core.take_result(id) {
            self.wakers.forget(id);
            return Poll::Ready(result);
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            state.core.abandon(id);
            self.wakers.forget(id);
            return Poll::Ready(Err(RpcError::Timeout(timeout)));
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
        if let Some(notifier) = self.notifier.get() {
            notifier.stop();
        }
        let state = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        let core = &mut state.core;
        if core.closed || core.unanswered >= core.window {
            return;
        }
        let pushed = self
            .ring
            .with_ring(|mut ring| core.push_close(&mut ring.submission()) && ring.submit().is_ok());
        if !pushed {
            return;
        }
        let waker = Waker::from(Arc::clone(&self.wakers));
        let mut cx = Context::from_waker(&waker);
        let deadline = Instant::now() + CLOSE_LINGER;
        while Instant::now() < deadline {
            match Pin::new(&mut state.completions).poll_next(&mut cx) {
                Poll::Ready(Some(c)) if c.user_data() == super::client_core::CLOSE => return,
                Poll::Ready(Some(_)) => {}
                Poll::Ready(None) => return,
                Poll::Pending => std::thread::sleep(Duration::from_micros(100)),
            }
        }
    }
}

/// The client's notifier thread ([`Wakeup::Thread`]).
struct Notifier {
    stop: Arc<AtomicBool>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Notifier {
    fn start<Q: QueuePair + std::marker::Send + 'static>(
        client: Weak<ClientShared<Q>>,
        events: Arc<dyn CompletionEvents>,
        wakers: Arc<CallWakers>,
    ) -> Notifier {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("rdma-ring-rpc-notifier".into())
            .spawn(move || notifier_loop(&client, &*events, &wakers, &stopped))
            .expect("spawning the RPC notifier thread");
        Notifier {
            stop,
            thread: Mutex::new(Some(thread)),
        }
    }

    /// Stops the thread and waits for it, unless this is the thread (it
    /// may hold the last handle of its client, and so drop it).
    fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        let thread = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(thread) = thread {
            thread.thread().unpark();
            if thread.thread().id() != std::thread::current().id() {
                let _ = thread.join();
            }
        }
    }
}

fn notifier_loop<Q: QueuePair + std::marker::Send + 'static>(
    client: &Weak<ClientShared<Q>>,
    events: &dyn CompletionEvents,
    wakers: &Arc<CallWakers>,
    stop: &AtomicBool,
) {
    let mut last_tick = Instant::now();
    while !stop.load(Ordering::Acquire) {
        // A turn wakes tasks, whose wakers are user code and may panic:
        // every awaiting task of the client relies on this thread, so a
        // panic (which the panic hook has told of) must not stop it, nor
        // keep the driving token from the callers.
        let driving = std::cell::Cell::new(false);
        let turn = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            notifier_turn(client, events, wakers, &mut last_tick, &driving)
        }));
        match turn {
            Ok(Turn::Go) => {}
            Ok(Turn::Stop) => return,
            Err(_) => {
                if driving.get() {
                    wakers.release_drive();
                }
            }
        }
    }
}

/// Whether the notifier goes on.
enum Turn {
    Go,
    Stop,
}

/// One turn of the notifier; `driving` says while it holds the driving
/// token.
fn notifier_turn<Q: QueuePair + std::marker::Send + 'static>(
    client: &Weak<ClientShared<Q>>,
    events: &dyn CompletionEvents,
    wakers: &Arc<CallWakers>,
    last_tick: &mut Instant,
    driving: &std::cell::Cell<bool>,
) -> Turn {
    let callers_active =
        wakers.callers.load(Ordering::Acquire) > 0 || wakers.since_last_call() < STEP_ASIDE;
    if last_tick.elapsed() >= NOTIFIER_TICK {
        // Every tick: awaiting tasks look at their deadlines, and the
        // server's socket is looked at.
        match client.upgrade() {
            Some(client) => client.watch_server(),
            None => return Turn::Stop,
        }
        wakers.wake_by_ref();
        *last_tick = Instant::now();
    }
    if callers_active || !wakers.try_drive() {
        // Blocking callers drive.
        std::thread::park_timeout(STEP_ASIDE);
        return Turn::Go;
    }
    driving.set(true);
    let Some(client) = client.upgrade() else {
        wakers.release_drive_quietly();
        return Turn::Stop;
    };
    // Arm, look (a completion that landed before the arm raised no
    // event), sleep, take, look.
    let looked = client.arm_and_look(events, || {
        client.background_turn();
        false
    });
    let tick = NOTIFIER_TICK.saturating_sub(last_tick.elapsed());
    if looked.is_some() {
        if events.wait(tick).unwrap_or(false) {
            let _ = events.take();
        }
        client.background_turn();
    } else {
        // No event will come (the device is failing): look again at the
        // tick, rather than spin.
        std::thread::park_timeout(tick);
    }
    drop(client);
    driving.set(false);
    if wakers.callers.load(Ordering::Acquire) > 0 {
        // A caller came and may have parked, waiting for the token.
        wakers.release_drive();
    } else {
        wakers.release_drive_quietly();
    }
    Turn::Go
}

impl<Q: QueuePair + std::marker::Send + 'static> ClientShared<Q> {
    /// Fails the connection if the server's end of the handshake socket
    /// closed: its process died, or it let the connection go.
    fn watch_server(&self) {
        if self
            .socket
            .as_ref()
            .is_some_and(crate::connect::tcp::peer_closed)
        {
            let mut state = self.lock();
            self.turn(&mut state);
            state.core.fail(RpcError::Disconnected(
                "the server closed the connection (its handshake socket ended)".into(),
            ));
            self.turn(&mut state);
        }
    }

    /// Without a notifier thread (under [`Wakeup::Reactor`] or
    /// [`Wakeup::Busy`]), looks at the server's socket on behalf of the
    /// calls that wait and of `progress`, at most once a notifier tick.
    fn watch_server_in_time(&self) {
        if self.socket.is_none() || self.notifier.get().is_some() {
            return;
        }
        // Another look under way is as good.
        let Ok(mut watched) = self.watched.try_lock() else {
            return;
        };
        if watched.elapsed() < NOTIFIER_TICK {
            return;
        }
        *watched = Instant::now();
        drop(watched);
        self.watch_server();
    }

    /// A turn on nobody's behalf: answers applied, reads and queued calls
    /// pushed, the close sent after a goodbye.
    fn background_turn(&self) {
        let mut state = self.lock();
        self.turn(&mut state);
    }
}

/// A connection to an [`RpcServer`](super::RpcServer): calls from any
/// number of threads or tasks at once, up to the server's window in
/// flight (more wait their turn, in order). Clone it to share it.
///
/// `call` blocks the thread; `call_async` returns a future for any
/// executor. Each call times out after the config's `call_timeout`; a
/// dropped future abandons its call (its answer, when it comes, is
/// dropped; if the server leaves a whole window of such calls, and of
/// releases of large responses, unanswered for a `call_timeout`, the
/// connection fails). Dropping the
/// last handle tells the server the client leaves.
///
/// With [`Wakeup::Thread`] (the default) the connection makes progress
/// on its own. With [`Wakeup::Reactor`], call [`progress`](Self::progress)
/// whenever the completion descriptor ([`completion_fd`](Self::completion_fd)) is
/// readable (a call the server never answers is woken at its deadline by
/// a timer thread, one for the process); with [`Wakeup::Busy`], awaiting
/// futures poll without end.
/// Under either, a connection nobody calls on does not answer the
/// server's goodbye, and the server disconnects it after its
/// `release_timeout`; and a server that dies (its end of the TCP
/// handshake's socket closes) is found by the calls that wait, which
/// look at the socket every tenth of a second (the timer wakes awaited
/// ones for it), or by the next call or `progress`.
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
    socket: Option<std::net::TcpStream>,
    /// When connecting gives up: one deadline for the handshake and the
    /// server's hello together, so the config's `connect_timeout` bounds
    /// the whole.
    deadline: Deadline,
}

impl<Q: QueuePair + std::marker::Send + 'static> PendingClient<Q> {
    /// Takes a fresh queue pair (with a completion queue of its own) and
    /// posts the receive for the server's hello. The connect timeout runs
    /// from here.
    pub(crate) fn new(
        qp: Q,
        pd: Arc<dyn ProtectionDomain>,
        config: RpcConfig,
    ) -> Result<Self, Error> {
        // A window of 0, say, would let no call go.
        config.check_client()?;
        let deadline = Deadline::after(config.connect_timeout);
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
            socket: None,
            deadline,
        })
    }

    /// When connecting gives up, for the handshake's steps.
    #[cfg_attr(not(feature = "verbs"), allow(dead_code))]
    pub(crate) fn deadline(&self) -> Deadline {
        self.deadline
    }

    /// The queue pair, for the handshake.
    #[cfg_attr(not(feature = "verbs"), allow(dead_code))]
    pub(crate) fn qp(&self) -> &Q {
        self.ring.qp()
    }

    /// Keeps the handshake's socket open for the connection's life.
    #[cfg_attr(not(feature = "verbs"), allow(dead_code))]
    pub(crate) fn keep(mut self, socket: std::net::TcpStream) -> Self {
        self.socket = Some(socket);
        self
    }

    /// Waits for the server's hello (the queue pair is connected).
    pub(crate) fn establish(self) -> Result<RpcClient<Q>, RpcError> {
        let max_inline = self.ring.caps().max_inline_data as usize;
        // The ring's own wake-up is the reactor kind (the channel armed,
        // nothing sleeping on it unless a waiter drives).
        let events = self.ring.cq().completion_events();
        let wakeup = match (&events, self.config.wakeup) {
            (None, _) | (_, Wakeup::Busy) => Wakeup::Busy,
            (Some(_), _) => Wakeup::Reactor,
        };
        let ring =
            AsyncRing::new(self.ring, wakeup).map_err(|e| RpcError::Connect(e.to_string()))?;
        let completions = ring.completions();
        let shared = Arc::new(ClientShared {
            ring,
            state: Mutex::new(ClientState {
                completions,
                core: ClientCore::new(self.pd, self.config, max_inline),
            }),
            wakers: Arc::default(),
            config: self.config,
            busy: wakeup == Wakeup::Busy,
            events: events.clone(),
            notifier: OnceLock::new(),
            timer_armed: Mutex::new(None),
            socket: self
                .socket
                .filter(|socket| socket.set_nonblocking(true).is_ok()),
            watched: Mutex::new(Instant::now()),
        });
        let deadline = self.deadline;
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
            // The server keeps its end open for the connection's life: an
            // end before its hello is a refusal (a server stopping, say).
            if shared
                .socket
                .as_ref()
                .is_some_and(crate::connect::tcp::peer_closed)
            {
                return Err(RpcError::Connect(
                    "the server closed the connection before its hello".into(),
                ));
            }
            if deadline.expired() {
                return Err(RpcError::Connect(format!(
                    "no hello from the server within {:?}",
                    self.config.connect_timeout
                )));
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        if let (Some(events), Wakeup::Thread) = (events, self.config.wakeup) {
            let notifier =
                Notifier::start(Arc::downgrade(&shared), events, Arc::clone(&shared.wakers));
            let _ = shared.notifier.set(notifier);
        }
        Ok(RpcClient { shared })
    }
}

impl<Q: QueuePair + std::marker::Send + 'static> RpcClient<Q> {
    /// Sends `request` and waits for its response (up to the config's
    /// `call_timeout`).
    pub fn call(&self, request: &[u8]) -> Result<Vec<u8>, RpcError> {
        self.call_with_timeout(request, self.shared.config.call_timeout)
    }

    /// Like [`call`](Self::call), giving up after `timeout`.
    pub fn call_with_timeout(
        &self,
        request: &[u8],
        timeout: Duration,
    ) -> Result<Vec<u8>, RpcError> {
        let _caller = CallerGuard::enter(&self.shared.wakers);
        let id = self.start(request)?;
        let deadline = Instant::now().checked_add(timeout);
        let waker = Waker::from(Arc::new(ThreadWaker(std::thread::current())));
        let mut cx = Context::from_waker(&waker);
        // Polling, the caller needs nobody to wake it; once it sleeps, it
        // registers. It polls only while a core is free for it: callers
        // polling on every core would starve whatever answers them.
        let mut spin = SpinSlot::take(self.shared.busy);
        let mut idle = 0usize;
        loop {
            if spin.is_some() && idle >= self.shared.config.spin_polls && !self.shared.busy {
                spin = None;
            }
            let sleep = spin.is_none() && !self.shared.busy;
            if let Poll::Ready(result) =
                self.shared.poll_call(id, deadline, timeout, &mut cx, sleep)
            {
                return result;
            }
            if sleep {
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
    /// leaves at once, or, when the window is full, as soon as it has
    /// room (in call order).
    pub fn call_async(&self, request: &[u8]) -> CallFuture<Q> {
        self.call_async_with_timeout(request, self.shared.config.call_timeout)
    }

    /// Like [`call_async`](Self::call_async), giving up after `timeout`.
    pub fn call_async_with_timeout(&self, request: &[u8], timeout: Duration) -> CallFuture<Q> {
        let started = self.start(request);
        CallFuture {
            shared: Arc::clone(&self.shared),
            deadline: Instant::now().checked_add(timeout),
            timeout,
            call: Some(started),
        }
    }

    fn start(&self, request: &[u8]) -> Result<u64, RpcError> {
        let mut state = self.shared.lock();
        let id = state.core.start(request)?;
        self.shared.turn(&mut state);
        Ok(id)
    }

    /// Applies what the device completed and sends what may go: for
    /// [`Wakeup::Reactor`], call it whenever the completion descriptor
    /// is readable. (It drives the ring first.)
    pub fn progress(&self) {
        self.shared.watch_server_in_time();
        let _ = self.shared.ring.drive();
        let mut state = self.shared.lock();
        self.shared.turn(&mut state);
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

    /// The completion channel's descriptor, for your reactor under
    /// [`Wakeup::Reactor`] (call [`progress`](Self::progress) when it is
    /// readable); `None` without a channel.
    ///
    /// The client's ring itself is not lent out: an operation pushed to
    /// it, or a completion taken from it, behind the client's back would
    /// take a response from its call.
    ///
    /// ```
    /// # use rdma_ring::backend::soft::SoftDevice;
    /// # use rdma_ring::rpc::{Caller, HandlerError, RpcConfig, RpcServer, Service};
    /// # let dev = SoftDevice::new();
    /// # let echo = |_: &Caller, req: &[u8], resp: &mut Vec<u8>| -> Result<(), HandlerError> {
    /// #     resp.extend_from_slice(req);
    /// #     Ok(())
    /// # };
    /// # let server = RpcServer::soft(&dev, Service::handler(echo), RpcConfig::default()).unwrap();
    /// let client = server.connect_soft().unwrap(); // woken by its own thread
    /// assert!(client.completion_fd().is_some());
    /// ```
    pub fn completion_fd(&self) -> Option<CompletionFd> {
        self.shared.ring.completion_fd()
    }

    /// What the client's ring did (doorbells, work requests, completions).
    ///
    /// ```
    /// # use rdma_ring::backend::soft::SoftDevice;
    /// # use rdma_ring::rpc::{Caller, HandlerError, RpcConfig, RpcServer, Service};
    /// # let dev = SoftDevice::new();
    /// # let echo = |_: &Caller, req: &[u8], resp: &mut Vec<u8>| -> Result<(), HandlerError> {
    /// #     resp.extend_from_slice(req);
    /// #     Ok(())
    /// # };
    /// # let server = RpcServer::soft(&dev, Service::handler(echo), RpcConfig::default()).unwrap();
    /// let client = server.connect_soft().unwrap();
    /// client.call(b"ping").unwrap();
    /// assert!(client.ring_stats().doorbells > 0);
    /// ```
    pub fn ring_stats(&self) -> RingStats {
        self.shared.ring.with_ring(|ring| ring.stats())
    }

    /// Calls `f` with the client's queue pair, read-only (its number, its
    /// capabilities, a soft device's test controls); `None` once it is
    /// gone from the ring. `f` runs with the client's ring locked: it must
    /// not use the client.
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::SoftDevice, QueuePair};
    /// # use rdma_ring::rpc::{Caller, HandlerError, RpcConfig, RpcServer, Service};
    /// # let dev = SoftDevice::new();
    /// # let echo = |_: &Caller, req: &[u8], resp: &mut Vec<u8>| -> Result<(), HandlerError> {
    /// #     resp.extend_from_slice(req);
    /// #     Ok(())
    /// # };
    /// # let server = RpcServer::soft(&dev, Service::handler(echo), RpcConfig::default()).unwrap();
    /// let client = server.connect_soft().unwrap();
    /// assert!(client.with_queue_pair(|qp| qp.qpn()).is_some());
    /// ```
    pub fn with_queue_pair<R>(&self, f: impl FnOnce(&Q) -> R) -> Option<R> {
        self.shared.ring.with_ring(|ring| {
            let qp = ring.default_qp()?;
            ring.qp_of(qp).map(f)
        })
    }
}

/// A call in flight; resolves to its response. Dropping it abandons the
/// call.
pub struct CallFuture<Q: QueuePair + std::marker::Send + 'static> {
    shared: Arc<ClientShared<Q>>,
    deadline: Option<Instant>,
    timeout: Duration,
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
        match self
            .shared
            .poll_call(id, self.deadline, self.timeout, cx, true)
        {
            Poll::Ready(result) => Poll::Ready(result),
            Poll::Pending => {
                self.call = Some(Ok(id));
                // Woken by its deadline, and, while a server's socket is to
                // be watched, by the next look at it.
                let look = self
                    .shared
                    .socket
                    .is_some()
                    .then(|| Instant::now() + NOTIFIER_TICK);
                if let Some(at) = self.deadline.into_iter().chain(look).min() {
                    self.shared.wake_at(at);
                }
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
    use crate::buf::{BaseBuf, RemoteAccess, RemoteSlice};
    use crate::op::{OpKind, Send};
    use crate::rpc::wire::{self, Hello, Kind, Message};

    /// A client connected to a bare queue pair the test plays the server
    /// on: hello sent, receives posted.
    struct FakeServer {
        ring: Ring<SoftQp>,
        pool: BufferPool,
        pd: crate::backend::soft::SoftPd,
    }

    impl FakeServer {
        /// Sends `bytes`, solicited, as the real server sends.
        fn send(&mut self, bytes: &[u8]) {
            let mut chunk = self.pool.take().unwrap();
            chunk[..bytes.len()].copy_from_slice(bytes);
            self.ring
                .submission()
                .push(Send::new(chunk.slice(..bytes.len())).solicited())
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

        /// The next `n` messages the client sends, in order, as many as
        /// came `within`.
        fn next_messages(&mut self, n: usize, within: Duration) -> Vec<(Kind, u64)> {
            let mut got = Vec::new();
            let deadline = Instant::now() + within;
            while got.len() < n && Instant::now() < deadline {
                let mut out = Vec::new();
                self.ring.completion().reap(&mut out).unwrap();
                for c in out {
                    if c.kind() == OpKind::Recv {
                        let len = c.byte_len() as usize;
                        let header = wire::Header::decode(&c.buf()[..len]).unwrap();
                        got.push((header.kind, header.id));
                    }
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            got
        }
    }

    fn connect() -> (RpcClient<SoftQp>, FakeServer) {
        let config = RpcConfig {
            call_timeout: Duration::from_secs(10),
            ..RpcConfig::default()
        };
        connect_with(config, None)
    }

    /// A client of `config`, keeping `socket` as its handshake's.
    fn connect_with(
        config: RpcConfig,
        socket: Option<std::net::TcpStream>,
    ) -> (RpcClient<SoftQp>, FakeServer) {
        let dev = SoftDevice::new();
        let (pd_c, pd_s) = (dev.alloc_pd(), dev.alloc_pd());
        let (client_qp, server_qp) = dev
            .connected_pair(&pd_c, &pd_s, QpConfig::default())
            .unwrap();
        let mut pending = PendingClient::new(client_qp, Arc::new(pd_c), config).unwrap();
        if let Some(socket) = socket {
            pending = pending.keep(socket);
        }
        // Larger than the hello's buffer size, to send what it forbids.
        let pool = BufferPool::new(&pd_s, 8192, 32).unwrap();
        let mut ring = Ring::new(server_qp, RingConfig::default());
        for _ in 0..16 {
            ring.submission()
                .push(Recv::new(pool.take().unwrap()))
                .unwrap();
        }
        ring.submit().unwrap();
        let mut server = FakeServer {
            ring,
            pool,
            pd: pd_s,
        };
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

    /// A server that lets the connection go before its hello (one that is
    /// stopping) fails the connect at once: the client does not wait out
    /// its connect timeout.
    #[test]
    fn a_server_closing_the_handshake_socket_before_its_hello_fails_the_connect() {
        let dev = SoftDevice::new();
        let (pd_c, pd_s) = (dev.alloc_pd(), dev.alloc_pd());
        let (client_qp, _server_qp) = dev
            .connected_pair(&pd_c, &pd_s, QpConfig::default())
            .unwrap();
        let config = RpcConfig {
            connect_timeout: Duration::from_secs(60),
            ..RpcConfig::default()
        };
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let socket = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        drop(listener.accept().unwrap()); // the server's end, gone
        let pending = PendingClient::new(client_qp, Arc::new(pd_c), config).unwrap();
        match pending.keep(socket).establish() {
            Err(RpcError::Connect(why)) => assert!(why.contains("closed"), "{why}"),
            other => panic!("expected a connect error, got {:?}", other.map(|_| ())),
        }
    }

    /// Without a notifier thread, the calls that wait look at the
    /// server's socket: a dead server fails them within about a tick, not
    /// at their timeout (awaited or blocking, under `Reactor` or `Busy`).
    #[test]
    fn a_client_without_a_notifier_finds_a_dead_server() {
        for wakeup in [Wakeup::Reactor, Wakeup::Busy] {
            for awaited in [true, false] {
                let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
                let socket = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
                let server_end = listener.accept().unwrap().0;
                // Found before the timeout: a timeout would be the
                // error.
                let config = RpcConfig {
                    call_timeout: Duration::from_secs(30),
                    wakeup,
                    ..RpcConfig::default()
                };
                let (client, mut server) = connect_with(config, Some(socket));
                let caller = std::thread::spawn(move || {
                    if awaited {
                        futures::executor::block_on(client.call_async(b"x"))
                    } else {
                        client.call(b"x")
                    }
                });
                server.next_request();
                drop(server_end); // the server's process ends
                match caller.join().unwrap() {
                    Err(RpcError::Disconnected(why)) => assert!(why.contains("socket"), "{why}"),
                    other => panic!("{wakeup:?}, awaited {awaited}: {other:?}"),
                }
            }
        }
    }

    /// A completion channel that cannot be armed (a failing device) makes
    /// the notifier and a blocking caller look again at their ticks, not
    /// spin: arms are tried a few times a second, not thousands.
    #[test]
    fn a_channel_that_cannot_be_armed_is_not_spun_on() {
        let dev = SoftDevice::new();
        let echo = |_: &super::super::Caller,
                    req: &[u8],
                    resp: &mut Vec<u8>|
         -> Result<(), super::super::HandlerError> {
            resp.extend_from_slice(req);
            Ok(())
        };
        let config = RpcConfig {
            call_timeout: Duration::from_millis(500),
            ..RpcConfig::default()
        };
        let server =
            super::super::RpcServer::soft(&dev, super::super::Service::handler(echo), config)
                .unwrap();
        let client = server.connect_soft().unwrap();
        assert_eq!(client.call(b"x").unwrap(), b"x");
        const FAILING: u32 = 100_000;
        dev.fail_arms(FAILING);
        // An idle notifier, then a blocking caller (answered or not: the
        // server's poller arms the same device's channels).
        std::thread::sleep(Duration::from_millis(300));
        let _ = client.call(b"y");
        let tried = FAILING - dev.arms_left_to_fail();
        dev.fail_arms(0);
        assert!((1..FAILING / 10).contains(&tried), "{tried} arms tried");
        drop(client);
        server.shutdown().unwrap();
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
    fn a_message_longer_than_the_hello_allows_fails_the_connection() {
        let (client, mut server) = connect();
        let call = client.call_async(b"x");
        server.next_request();
        server.send(&[0u8; 4097]);
        match futures::executor::block_on(call) {
            Err(RpcError::Protocol(why)) => {
                assert!(
                    why.contains("longer than the receive buffers' 4096"),
                    "{why}"
                )
            }
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

    /// A client the server said goodbye to closes only once nothing of
    /// its own is in flight: a read of a large response included. Its
    /// close would otherwise go out behind the read, and a server that
    /// lets the connection go on the close could pull the response's
    /// buffer from under the read.
    #[test]
    fn a_goodbye_close_waits_for_the_read_of_a_large_response() {
        let (client, mut server) = connect();
        let call = client.call_async(b"x");
        let id = server.next_request();
        let mut buf = [0u8; 64];
        let n = wire::encode_inline(&mut buf, Kind::Goodbye, 0, &[]);
        server.send(&buf[..n]);
        let response =
            crate::buf::ExposedBuf::new(&server.pd, vec![5u8; 8192], RemoteAccess::READ).unwrap();
        let n = wire::encode_rendezvous(&mut buf, Kind::ResponseRendezvous, id, &response.remote());
        server.send(&buf[..n]);
        assert_eq!(futures::executor::block_on(call).unwrap(), vec![5u8; 8192]);
        // The release comes first; the close only once it is answered.
        let got = server.next_messages(1, Duration::from_secs(10));
        assert!(matches!(got[..], [(Kind::Release, _)]), "{got:?}");
        let release = got[0].1;
        let early = server.next_messages(1, Duration::from_millis(200));
        assert!(
            early.is_empty(),
            "closed before the release was answered: {early:?}"
        );
        let n = wire::encode_inline(&mut buf, Kind::Released, release, &[]);
        server.send(&buf[..n]);
        let got = server.next_messages(1, Duration::from_secs(10));
        assert!(matches!(got[..], [(Kind::Close, _)]), "{got:?}");
        drop(response);
    }

    /// A release of a large response holds a slot of the window until
    /// the server answers it, as an abandoned call does: a server that
    /// answers neither (its poller stuck) fails the connection once they
    /// hold the whole window for a call timeout, rather than time out
    /// every call after for ever.
    #[test]
    fn a_window_held_by_a_release_and_abandoned_calls_fails_the_connection() {
        let config = RpcConfig {
            call_timeout: Duration::from_millis(300),
            ..RpcConfig::default()
        };
        let (client, mut server) = connect_with(config, None);
        let call = client.call_async(b"big");
        let id = server.next_request();
        let response =
            crate::buf::ExposedBuf::new(&server.pd, vec![7u8; 8192], RemoteAccess::READ).unwrap();
        let mut buf = [0u8; 64];
        let n = wire::encode_rendezvous(&mut buf, Kind::ResponseRendezvous, id, &response.remote());
        server.send(&buf[..n]);
        assert_eq!(futures::executor::block_on(call).unwrap(), vec![7u8; 8192]);
        let got = server.next_messages(1, Duration::from_secs(10));
        assert!(matches!(got[..], [(Kind::Release, _)]), "{got:?}");
        // Never answered; nor are the calls that take the rest of the
        // window (3 of the fake server's 4).
        for _ in 0..3 {
            assert!(matches!(client.call(b"x"), Err(RpcError::Timeout(_))));
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        let why = loop {
            match client.call(b"y") {
                Err(RpcError::Disconnected(why)) => break why,
                Err(RpcError::Timeout(_)) => {
                    assert!(Instant::now() < deadline, "the connection never failed")
                }
                other => panic!("expected the connection to fail, got {other:?}"),
            }
        };
        assert!(
            why.contains("whole window") && why.contains("1 releases"),
            "{why}"
        );
        assert!(client.failure().is_some());
        drop(response);
    }

    /// A client's config is checked as a server's is: one that could make
    /// no call (a window of 0) is refused at connect, not left to time
    /// out every call.
    #[test]
    fn a_client_config_that_cannot_work_is_refused_at_connect() {
        fn echo(
            _: &crate::rpc::Caller,
            req: &[u8],
            resp: &mut Vec<u8>,
        ) -> Result<(), crate::rpc::HandlerError> {
            resp.extend_from_slice(req);
            Ok(())
        }
        let dev = SoftDevice::new();
        let server = super::super::RpcServer::soft(
            &dev,
            super::super::Service::handler(echo),
            RpcConfig::default(),
        )
        .unwrap();
        let config = RpcConfig {
            window: 0,
            ..RpcConfig::default()
        };
        match server.connect_soft_with(config) {
            Err(RpcError::Connect(why)) => assert!(why.contains("window"), "{why}"),
            other => panic!("expected a refused config, got {:?}", other.map(|_| ())),
        }
        // The server-side limits are not the client's: a window no server
        // of 64 clients could offer is cut to the server's.
        let wide = RpcConfig {
            window: 512,
            ..RpcConfig::default()
        };
        let client = server.connect_soft_with(wide).unwrap();
        assert_eq!(client.window(), RpcConfig::default().window as usize);
    }

    /// A late answer to an abandoned call is taken once; a second one is
    /// a lie, and fails the connection with a protocol error (it would
    /// otherwise free a window slot twice, and the client would flood the
    /// server).
    #[test]
    fn a_second_answer_to_an_abandoned_call_fails_the_connection() {
        let (client, mut server) = connect();
        let call = client.call_async(b"x");
        let id = server.next_request();
        drop(call);
        let mut buf = [0u8; 64];
        let n = wire::encode_inline(&mut buf, Kind::Response, id, b"late");
        server.send(&buf[..n]);
        let next = client.call_async(b"y");
        let next_id = server.next_request();
        let n = wire::encode_inline(&mut buf, Kind::Response, next_id, b"y");
        server.send(&buf[..n]);
        assert_eq!(futures::executor::block_on(next).unwrap(), b"y");
        let n = wire::encode_inline(&mut buf, Kind::Response, id, b"again");
        server.send(&buf[..n]);
        match client.call(b"z") {
            Err(RpcError::Protocol(why)) => assert!(why.contains("not waiting"), "{why}"),
            other => panic!("expected a protocol error, got {other:?}"),
        }
    }
}
