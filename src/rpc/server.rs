//! The server: a poller thread over one ring (one completion queue, one
//! shared receive queue, every connection's queue pair), fed new
//! connections by whatever accepts them.

use std::any::Any;
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::client::PendingClient;
use super::handler::{AsyncHandler, Handler};
use super::server_core::{ServerCore, RECV};
use super::{RpcClient, RpcConfig, RpcError};
use crate::backend::soft::{SoftDevice, SoftPd, SoftQp};
use crate::backend::{CompletionEvents, CompletionQueue, ProtectionDomain, QpConfig, QueuePair};
use crate::buf::BufferPool;
use crate::error::Error;
use crate::ring::{Completion, Ring, RingConfig, SrqHandle, SrqRefill};

/// What the server runs for each request.
pub enum Service {
    /// A [`Handler`], run on the poller thread.
    Sync(Box<dyn Handler>),
    /// An [`AsyncHandler`], whose futures the poller thread polls.
    Async(Box<dyn AsyncHandler>),
}

impl Service {
    /// Serves with `handler`.
    pub fn handler(handler: impl Handler) -> Service {
        Service::Sync(Box::new(handler))
    }

    /// Serves with the futures of `handler`.
    pub fn async_handler(handler: impl AsyncHandler) -> Service {
        Service::Async(Box::new(handler))
    }
}

impl std::fmt::Debug for Service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Service::Sync(_) => "Service::Sync",
            Service::Async(_) => "Service::Async",
        })
    }
}

/// Counters of what a server did.
///
/// ```
/// use rdma_ring::rpc::ServerStats;
/// assert_eq!(ServerStats::default().requests, 0);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ServerStats {
    /// Connections greeted.
    pub clients_accepted: u64,
    /// Connections refused (the server was full).
    pub clients_refused: u64,
    /// Connections closed (by the client, a fault, a violation or
    /// shutdown).
    pub clients_closed: u64,
    /// Connections the client closed (a close message).
    pub clients_left: u64,
    /// Connections open now.
    pub clients_open: u64,
    /// Messages received.
    pub messages: u64,
    /// Requests handed to the handler.
    pub requests: u64,
    /// Answers pushed (responses, errors, release answers).
    pub answers: u64,
    /// Error answers.
    pub errors: u64,
    /// Handler panics caught.
    pub panics: u64,
    /// Clients disconnected for breaking the protocol.
    pub protocol_errors: u64,
    /// Large responses freed because their client never released them.
    pub releases_expired: u64,
    /// Doorbells the poller rang (all queues).
    pub doorbells: u64,
    /// Reaps that failed without failing the ring (reading the device's
    /// events, or moving a queue pair whose peer left to the error
    /// state, failed); the poller went on serving.
    pub poll_errors: u64,
    /// Connection attempts whose handshake failed (garbage, a timeout, a
    /// peer that left, a queue pair the device refused); the server served
    /// on.
    pub handshakes_failed: u64,
    /// Large requests that waited for others to be read first
    /// (`max_reading`).
    pub reads_waited: u64,
    /// The most bytes of large requests held at once: at most
    /// `max_reading`, unless one request alone was larger.
    pub peak_reading: u64,
}

struct PollerState<Q: QueuePair> {
    ring: Ring<Q>,
    srq: SrqHandle,
    core: ServerCore,
    scratch: Vec<Completion>,
    last_expire: Instant,
    shutdown_began: Option<Instant>,
    /// Whether a shutdown dropped the handler futures still pending.
    aborted: bool,
    /// Why the poller stopped on its own: the ring failed.
    failure: Option<&'static str>,
}

/// A connected queue pair on its way to the poller.
struct Arrival<Q> {
    qp: Q,
    peer: Option<SocketAddr>,
    watch: Option<TcpStream>,
}

pub(super) struct ServerShared<Q: QueuePair> {
    /// Connections for the poller to take; `None` once it has stopped
    /// taking them. Before `state`, so that nothing in it outlives the
    /// ring (it is empty by then in any case).
    inbox: Mutex<Option<Vec<Arrival<Q>>>>,
    state: Mutex<PollerState<Q>>,
    events: Option<Arc<dyn CompletionEvents>>,
    stop: AtomicBool,
    /// Counted by the acceptor, which holds no lock of the poller's.
    pub(super) handshakes_failed: std::sync::atomic::AtomicU64,
    pub(super) config: RpcConfig,
    /// The device and protection domain connections are made on.
    pub(super) fabric: Box<dyn Any + std::marker::Send + Sync>,
}

impl<Q: QueuePair> ServerShared<Q> {
    fn lock(&self) -> MutexGuard<'_, PollerState<Q>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Makes a new connection's queue pair with `make`, on the server's
    /// completion queue and shared receive queue. It is connected before
    /// the poller attaches it, and a client may send at once: the ring is
    /// told its number, so the receives it takes before then count.
    pub(super) fn make_qp<E>(
        &self,
        make: impl FnOnce(&Q::Cq, &Q::Srq) -> Result<Q, E>,
    ) -> Result<Q, E> {
        let mut state = self.lock();
        let srq = state.ring.srq(state.srq).expect("the server's queue");
        let qp = make(state.ring.cq(), srq)?;
        let handle = state.srq;
        state
            .ring
            .expect_on_srq(handle, qp.caps().qp_num)
            .expect("the server's queue");
        Ok(qp)
    }

    /// Counts a connection attempt whose handshake failed (only the
    /// verbs listeners handshake).
    #[cfg(feature = "verbs")]
    pub(super) fn handshake_failed(&self) {
        self.handshakes_failed.fetch_add(1, Ordering::Relaxed);
    }

    /// Hands a connected queue pair (made by [`make_qp`](Self::make_qp)) to the
    /// poller, which greets it; `watch` is the handshake's socket, kept
    /// open by the client for the connection's life, whose end tells that
    /// the client's process is gone. Refused once the server stops: the
    /// queue pair is dropped, and `false` returned.
    pub(super) fn admit(&self, qp: Q, peer: Option<SocketAddr>, watch: Option<TcpStream>) -> bool {
        !self.stopping() && self.enqueue(Arrival { qp, peer, watch })
    }

    /// Puts `arrival` in the poller's inbox, unless the poller stopped
    /// taking arrivals: then it is dropped, and `false` returned. Checked
    /// under the inbox's lock, which the poller holds to close it, so an
    /// arrival is either taken by the poller or dropped here, never left
    /// behind (holding receives of the shared queue past the ring's end).
    fn enqueue(&self, arrival: Arrival<Q>) -> bool {
        let mut inbox = self.inbox();
        match inbox.as_mut() {
            Some(arrivals) => {
                arrivals.push(arrival);
                true
            }
            None => {
                drop(inbox);
                drop(arrival);
                false
            }
        }
    }

    fn inbox(&self) -> MutexGuard<'_, Option<Vec<Arrival<Q>>>> {
        self.inbox.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes what the inbox holds.
    fn take_arrivals(&self) -> Vec<Arrival<Q>> {
        self.inbox()
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// Takes what the inbox holds, and refuses arrivals from now on.
    fn close_inbox(&self) -> Vec<Arrival<Q>> {
        self.inbox().take().unwrap_or_default()
    }

    pub(super) fn stopping(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }
}

/// Serves RPCs: one poller thread serves every client over one
/// completion queue and one shared receive queue (see the [module
/// docs](super)). Clients come from a listener ([`RpcServer::bind`],
/// [`RpcServer::bind_cm`]) or, on the soft device, from
/// [`RpcServer::connect_soft`].
///
/// A send or read the device refuses to post (a NIC short of resources)
/// is pushed again a millisecond later, and counted once in
/// [`ServerStats`]; a connection whose posts the device goes on refusing
/// for a second is closed, and only that one.
///
/// Dropping the server shuts it down as [`shutdown`](Self::shutdown)
/// does.
pub struct RpcServer<Q: QueuePair + std::marker::Send + 'static> {
    pub(super) shared: Arc<ServerShared<Q>>,
    poller: Mutex<Option<JoinHandle<()>>>,
    /// The poller thread's id: a shutdown called on it (by a handler)
    /// cannot wait for it.
    poller_id: std::thread::ThreadId,
    /// Whether the poller thread ended in a panic (every shutdown says so).
    poller_panicked: AtomicBool,
    pub(super) acceptor: Mutex<Option<Acceptor>>,
    pub(super) local_addr: Option<SocketAddr>,
}

/// The thread that accepts clients for a server made by a listener.
pub(super) struct Acceptor {
    pub(super) thread: JoinHandle<()>,
    /// Wakes the thread's idle wait, for it to see that the server stops.
    pub(super) wake: Box<dyn Fn() + Send + Sync>,
}

impl<Q: QueuePair + std::marker::Send + 'static> std::fmt::Debug for RpcServer<Q> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RpcServer")
            .field("local_addr", &self.local_addr)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

/// The queue pair settings of a server's connections.
pub(super) fn server_qp_config(config: &RpcConfig) -> QpConfig {
    let window = u32::from(config.window);
    QpConfig {
        // Answers and rendezvous reads (a window each), the hello, a
        // goodbye or error, and the ring's teardown marker.
        max_send_wr: 2 * window + 4,
        max_recv_wr: 1,
        max_send_sge: 1,
        max_recv_sge: 1,
        ..QpConfig::default()
    }
}

/// The queue pair settings of a client.
pub(super) fn client_qp_config(config: &RpcConfig) -> QpConfig {
    let window = u32::from(config.window);
    QpConfig {
        // Requests and releases (a window), rendezvous reads (a window),
        // and the teardown marker.
        max_send_wr: 2 * window + 2,
        // Answers, the two unsolicited messages, and the hello.
        max_recv_wr: window + 3,
        max_send_sge: 1,
        max_recv_sge: 1,
        ..QpConfig::default()
    }
}

/// Completion queue entries a server needs.
pub(super) fn server_cq_entries(config: &RpcConfig) -> u32 {
    let sends = config.max_clients * server_qp_config(config).max_send_wr;
    (config.srq_depth() + sends + 64).min(65536)
}

impl<Q: QueuePair + std::marker::Send + 'static> RpcServer<Q> {
    /// Starts a server's poller over `cq` and `srq` (made on `pd`);
    /// connections come through [`ServerShared::admit`].
    pub(super) fn start(
        cq: Q::Cq,
        srq: Q::Srq,
        pd: Arc<dyn ProtectionDomain>,
        service: Service,
        config: RpcConfig,
        fabric: Box<dyn Any + std::marker::Send + Sync>,
    ) -> Result<Self, Error> {
        config.check()?;
        let events = cq.completion_events();
        let ring_config = RingConfig {
            spin_polls: config.spin_polls,
            ..RingConfig::default()
        };
        let mut ring = Ring::with_cq(cq, ring_config);
        let srq = ring.add_srq(srq).map_err(|r| r.into_parts().0)?;
        let depth = config.srq_depth() as usize;
        // Buffers held while a pass handles them come on top of the
        // queue's depth.
        let recv_pool = BufferPool::new(&*pd, config.buffer_size as usize, depth + 64)?;
        ring.set_srq_refill(
            srq,
            Some(SrqRefill {
                pool: recv_pool,
                low: depth,
                target: depth,
                user_data: RECV,
            }),
        )?;
        ring.submit().map_err(|e| e.error)?;
        let sends = config.max_clients as usize * (usize::from(config.window) + 2);
        let send_pool = BufferPool::new(&*pd, config.buffer_size as usize, sends)?;
        let max_inline = QpConfig::default().max_inline_data as usize;
        let core = ServerCore::new(config, pd, send_pool, service, max_inline);
        let shared = Arc::new(ServerShared {
            state: Mutex::new(PollerState {
                ring,
                srq,
                core,
                scratch: Vec::new(),
                last_expire: Instant::now(),
                shutdown_began: None,
                aborted: false,
                failure: None,
            }),
            inbox: Mutex::new(Some(Vec::new())),
            events,
            stop: AtomicBool::new(false),
            handshakes_failed: std::sync::atomic::AtomicU64::new(0),
            config,
            fabric,
        });
        let poller_shared = Arc::clone(&shared);
        let poller = std::thread::Builder::new()
            .name("rdma-ring-rpc-poller".into())
            .spawn(move || poller_loop(&poller_shared))
            .map_err(|_| Error::Soft("could not spawn the poller thread"))?;
        Ok(RpcServer {
            shared,
            poller_id: poller.thread().id(),
            poller: Mutex::new(Some(poller)),
            poller_panicked: AtomicBool::new(false),
            acceptor: Mutex::new(None),
            local_addr: None,
        })
    }

    /// What the server did so far.
    pub fn stats(&self) -> ServerStats {
        let state = self.shared.lock();
        let mut stats = state.core.stats;
        stats.clients_open = state.core.connections() as u64;
        stats.doorbells = state.ring.stats().doorbells;
        stats.handshakes_failed = self.shared.handshakes_failed.load(Ordering::Relaxed);
        stats
    }

    /// Why the server stopped serving on its own, if it did: its ring
    /// failed (the completion queue overran or failed, or the device
    /// failed), so nothing could be sent or received any more. The poller
    /// then let every connection go at once (clients see their calls
    /// fail) and stopped; new connections are refused with
    /// [`RpcError::ShuttingDown`].
    ///
    /// ```
    /// # use rdma_ring::backend::soft::SoftDevice;
    /// # use rdma_ring::rpc::{RpcConfig, RpcServer, Service, Caller, HandlerError};
    /// # fn echo(_: &Caller, req: &[u8], resp: &mut Vec<u8>) -> Result<(), HandlerError> {
    /// #     resp.extend_from_slice(req);
    /// #     Ok(())
    /// # }
    /// let dev = SoftDevice::new();
    /// let server = RpcServer::soft(&dev, Service::handler(echo), RpcConfig::default()).unwrap();
    /// assert_eq!(server.failure(), None);
    /// ```
    pub fn failure(&self) -> Option<&'static str> {
        self.shared.lock().failure
    }

    /// Whether new clients can connect through the server's listener:
    /// false for a server made without one, once [`shutdown`](Self::shutdown)
    /// began, and once the listener's device went away (over rdma_cm,
    /// rdma_cm said it was removed: the listener hears no more requests,
    /// and the server serves on the clients it has).
    ///
    /// ```
    /// # use rdma_ring::backend::soft::SoftDevice;
    /// # use rdma_ring::rpc::{RpcConfig, RpcServer, Service, Caller, HandlerError};
    /// # fn echo(_: &Caller, req: &[u8], resp: &mut Vec<u8>) -> Result<(), HandlerError> {
    /// #     resp.extend_from_slice(req);
    /// #     Ok(())
    /// # }
    /// let dev = SoftDevice::new();
    /// // In-process clients connect through the server itself, not a listener.
    /// let server = RpcServer::soft(&dev, Service::handler(echo), RpcConfig::default()).unwrap();
    /// assert!(!server.accepting());
    /// ```
    pub fn accepting(&self) -> bool {
        !self.shared.stopping()
            && self
                .acceptor
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .as_ref()
                .is_some_and(|acceptor| !acceptor.thread.is_finished())
    }

    /// The address it listens on, for servers made by a listener.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.local_addr
    }

    /// Shuts down gracefully: stops accepting, tells every client (their
    /// new calls fail with [`RpcError::ShuttingDown`]), answers the calls
    /// already received (a call arriving after the goodbye is refused with
    /// `ShuttingDown`), and waits for each client to close once its calls
    /// are answered and its large responses read. Clients that do not
    /// close within `release_timeout` (a client nobody polls, with
    /// [`Wakeup::Busy`](crate::future::Wakeup::Busy) or
    /// [`Wakeup::Reactor`](crate::future::Wakeup::Reactor)) are
    /// disconnected then, and handler futures still pending are dropped.
    /// A client that has not called yet when the shutdown begins cannot
    /// be told (the server speaks unasked only once a client has spoken,
    /// so that its receives are posted): its connection is let go at
    /// once, and its calls fail as on a lost connection. A client that
    /// goes on calling is answered `ShuttingDown` each time, but holds up
    /// the end no more than two seconds past `release_timeout`. Returns
    /// once the poller has stopped — except on the poller's own thread (a
    /// handler that shuts its server down), where it only starts the
    /// shutdown and returns at once.
    pub fn shutdown(&self) -> Result<(), RpcError> {
        self.shared.stop.store(true, Ordering::Release);
        if std::thread::current().id() == self.poller_id {
            return Ok(());
        }
        // Each thread is joined with its slot locked, so that a shutdown
        // racing this one (or the drop) returns only once it has ended too.
        let mut acceptor = self.acceptor.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(acceptor) = acceptor.take() {
            (acceptor.wake)();
            let _ = acceptor.thread.join();
        }
        drop(acceptor);
        let mut poller = self.poller.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(thread) = poller.take() {
            if thread.join().is_err() {
                self.poller_panicked.store(true, Ordering::Release);
            }
        }
        if self.poller_panicked.load(Ordering::Acquire) {
            return Err(RpcError::Disconnected("the poller thread panicked".into()));
        }
        Ok(())
    }
}

impl<Q: QueuePair + std::marker::Send + 'static> Drop for RpcServer<Q> {
    fn drop(&mut self) {
        let _ = self.shutdown();
    }
}

/// How long a shutdown that ran out of time waits for its last answers.
const ABORT_GRACE: Duration = Duration::from_secs(1);

/// How often the poller looks for expired responses and departed clients.
const LOOK_EVERY: Duration = Duration::from_millis(250);

/// The longest the poller sleeps on the completion channel between looks
/// at its other inputs (new connections, shutdown, expiries).
const TICK: Duration = Duration::from_millis(20);
/// The longest it sleeps while handler futures are pending, which may be
/// woken from outside.
const TASK_TICK: Duration = Duration::from_millis(1);

fn poller_loop<Q: QueuePair>(shared: &ServerShared<Q>) {
    let mut idle = 0usize;
    loop {
        let mut state = shared.lock();
        let progressed = pass(shared, &mut state);
        if let Some(why) = state.ring.failure() {
            // Nothing more can be sent or received: no goodbye could
            // leave, no client could close. Every connection goes now.
            state.failure = Some(why);
            shared.stop.store(true, Ordering::Release);
            state.core.abort_tasks();
            finish(shared, &mut state);
            return;
        }
        if shared.stopping() && state.shutdown_began.is_none() {
            state.core.begin_shutdown();
            state.shutdown_began = Some(Instant::now());
        }
        if let Some(began) = state.shutdown_began {
            // Done when every client has gone (each closes once its calls
            // are answered). After `release_timeout`, handler futures
            // still pending are dropped and their calls answered
            // `ShuttingDown`; once those answers left (or a second more),
            // the clients that did not close are let go. One more pass
            // first, for requests that landed since the last.
            let waited = began.elapsed();
            let waited_out = waited > shared.config.release_timeout;
            if waited_out && !state.aborted {
                state.aborted = true;
                state.core.abort_tasks();
                continue;
            }
            // Saturating: a release timeout of `Duration::MAX` means never.
            let grace_past = |graces: u32| {
                shared
                    .config
                    .release_timeout
                    .saturating_add(ABORT_GRACE * graces)
            };
            let give_up = waited_out && (state.core.quiet() || waited > grace_past(1));
            // A client that goes on calling keeps every pass busy: past
            // a second grace the end comes all the same.
            let overdue = waited > grace_past(2);
            if (state.core.connections() == 0 || give_up) && (!pass(shared, &mut state) || overdue)
            {
                finish(shared, &mut state);
                return;
            }
        }
        if progressed {
            idle = 0;
            continue;
        }
        idle += 1;
        if idle < shared.config.spin_polls {
            drop(state);
            std::thread::yield_now();
            continue;
        }
        let tick = if state.core.busy() { TASK_TICK } else { TICK };
        match &shared.events {
            Some(events) => {
                if events.arm().is_err() {
                    drop(state);
                    std::thread::sleep(TASK_TICK);
                    continue;
                }
                // A completion that landed before the arm raised nothing:
                // look once more before sleeping.
                if pass(shared, &mut state) || state.core.tasks_woken() {
                    continue;
                }
                drop(state);
                if events.wait(tick).unwrap_or(false) {
                    let _ = events.take();
                }
            }
            None => {
                drop(state);
                std::thread::sleep(Duration::from_micros(50));
            }
        }
        idle = 0;
    }
}

/// One pass: new connections, completions, handler futures, pushes and
/// one submit, expiries, detaches. Returns whether anything happened.
fn pass<Q: QueuePair>(shared: &ServerShared<Q>, state: &mut PollerState<Q>) -> bool {
    let PollerState {
        ring,
        core,
        scratch,
        last_expire,
        ..
    } = state;
    let mut progressed = false;
    let arrivals = shared.take_arrivals();
    for Arrival { qp, peer, watch } in arrivals {
        progressed = true;
        let caps = qp.caps();
        let full = core.connections() >= shared.config.max_clients as usize;
        match ring.attach(qp) {
            Ok(handle) if full => core.refuse(handle, caps.qp_num, peer),
            Ok(handle) => core.adopt(handle, caps.qp_num, caps.max_inline_data, peer, watch),
            Err(_) => core.stats.clients_refused += 1,
        }
    }
    match ring.completion().reap(scratch) {
        Ok(_) | Err(Error::UnknownWrId { .. }) => {}
        // A failed ring (its completion queue overran or failed) is the
        // poller's to end; any other error concerns one look that failed,
        // and the next pass looks again.
        Err(_) if ring.failure().is_some() => {}
        Err(_) => core.stats.poll_errors += 1,
    }
    if !scratch.is_empty() {
        progressed = true;
    }
    for c in scratch.drain(..) {
        core.on_completion(c);
    }
    if core.tasks_woken() {
        progressed = true;
        core.run_tasks();
    }
    // Work the device refused to post all of is no progress: the poller
    // does not spin on a refusing device, it tries again after a tick.
    let now = Instant::now();
    if core.push(ring, now) {
        progressed |= core.submitted(ring.submit(), now);
    }
    if now.duration_since(*last_expire) > LOOK_EVERY {
        core.expire(now);
        core.check_liveness(ring);
        *last_expire = now;
    }
    for (qp, _why) in core.take_finished() {
        progressed = true;
        // Detaching drains the queue pair's flushed work; buffers it could
        // not drain are leaked, never freed under the device.
        let _ = ring.detach(qp);
    }
    progressed
}

/// The poller's last step: refuses arrivals from now on, and lets every
/// connection go, those that arrived since the last pass (their
/// handshake saw the server running) included. On a failed ring each is
/// only moved to error, not drained one by one (a dead device may flush
/// nothing, and each drain would wait out its timeout with the server
/// locked): the ring's own teardown drains them all at once, when the
/// server goes.
fn finish<Q: QueuePair>(shared: &ServerShared<Q>, state: &mut PollerState<Q>) {
    let failed = state.ring.failure().is_some();
    let arrivals = shared.close_inbox();
    for qp in state.core.take_all() {
        if failed {
            let _ = state.ring.fail_qp(qp);
        } else {
            let _ = state.ring.detach(qp);
        }
    }
    for Arrival { qp, .. } in arrivals {
        // A failed ring takes none: the queue pair is dropped here.
        if let Ok(handle) = state.ring.attach(qp) {
            let _ = state.ring.detach(handle);
        }
    }
}

/// The soft device and protection domain of a soft server.
struct SoftFabric {
    dev: SoftDevice,
    pd: Arc<SoftPd>,
}

impl RpcServer<SoftQp> {
    /// A server on the in-process soft device; connect clients with
    /// [`connect_soft`](Self::connect_soft).
    pub fn soft(dev: &SoftDevice, service: Service, config: RpcConfig) -> Result<Self, Error> {
        config.check()?;
        let pd = Arc::new(dev.alloc_pd());
        let cq = dev.create_cq(server_cq_entries(&config))?;
        let srq = dev.create_srq(&pd, config.srq_config())?;
        let fabric = SoftFabric {
            dev: dev.clone(),
            pd: Arc::clone(&pd),
        };
        RpcServer::start(cq, srq, pd, service, config, Box::new(fabric))
    }

    /// A queue pair on the server's queues, connected to a fresh one (in
    /// a protection domain of its own) made with `client`; the server's is
    /// not admitted yet.
    fn soft_pair(&self, client: QpConfig) -> Result<(SoftQp, SoftQp, Arc<SoftPd>), Error> {
        let fabric = self
            .shared
            .fabric
            .downcast_ref::<SoftFabric>()
            .expect("a soft server");
        let server_qp = self.shared.make_qp(|cq, srq| {
            fabric.dev.create_qp_on(
                &fabric.pd,
                cq,
                Some(srq),
                server_qp_config(&self.shared.config),
            )
        })?;
        let pd = Arc::new(fabric.dev.alloc_pd());
        let qp = fabric.dev.create_qp(&pd, client)?;
        fabric.dev.connect(&server_qp, &qp)?;
        Ok((server_qp, qp, pd))
    }

    /// A client connected to this server, with its own queue pair and
    /// completion queue on the same soft device, and `config`'s client
    /// side.
    pub fn connect_soft_with(&self, config: RpcConfig) -> Result<RpcClient<SoftQp>, RpcError> {
        if self.shared.stopping() {
            return Err(RpcError::ShuttingDown);
        }
        let failed = |e: Error| RpcError::Connect(e.to_string());
        let (server_qp, client_qp, pd) =
            self.soft_pair(client_qp_config(&config)).map_err(failed)?;
        // The hello's receive is posted before the server may send it.
        let pending = PendingClient::new(client_qp, pd, config).map_err(failed)?;
        if !self.shared.admit(server_qp, None, None) {
            return Err(RpcError::ShuttingDown);
        }
        pending.establish()
    }

    /// A bare queue pair connected to this server, with its protection
    /// domain, for tests that play a client breaking the protocol: the
    /// server greets it with a hello, like any client, and judges what it
    /// sends.
    pub fn connect_soft_raw(&self, config: QpConfig) -> Result<(SoftQp, Arc<SoftPd>), Error> {
        let (server_qp, qp, pd) = self.soft_pair(config)?;
        if !self.shared.admit(server_qp, None, None) {
            return Err(Error::Soft("the server is shutting down"));
        }
        Ok((qp, pd))
    }

    /// [`connect_soft_with`](Self::connect_soft_with) the server's config.
    pub fn connect_soft(&self) -> Result<RpcClient<SoftQp>, RpcError> {
        self.connect_soft_with(self.shared.config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rpc::{Caller, HandlerError};

    fn echo(_: &Caller, req: &[u8], resp: &mut Vec<u8>) -> Result<(), HandlerError> {
        resp.extend_from_slice(req);
        Ok(())
    }

    /// A connection whose handshake saw the server running but that
    /// arrives once the poller has stopped is let go at once: nothing is
    /// left in the inbox, holding receives of the shared queue past the
    /// ring's end.
    #[test]
    fn an_arrival_after_the_poller_stopped_is_dropped_not_kept() {
        let dev = SoftDevice::new();
        let server = RpcServer::soft(&dev, Service::handler(echo), RpcConfig::default()).unwrap();
        let (server_qp, _client_qp, _pd) = server
            .soft_pair(client_qp_config(&server.shared.config))
            .unwrap();
        server.shutdown().unwrap();
        // Its check of the stop flag came before the stop.
        let arrival = Arrival {
            qp: server_qp,
            peer: None,
            watch: None,
        };
        assert!(
            !server.shared.enqueue(arrival),
            "kept after the poller stopped"
        );
        assert!(server.shared.take_arrivals().is_empty());
    }

    use crate::backend::soft::{SoftCq, SoftSrq};
    use crate::backend::{CqId, PostError, QpCaps, RawCompletion, RecvWr, SendWr, Sge};
    use std::sync::atomic::AtomicU32;

    /// Faults to make in a server's queues.
    #[derive(Default)]
    struct Faults {
        /// The completion queue's polls fail (an overrun).
        cq: AtomicBool,
        /// This many peer checks say the peer left, after which the queue
        /// pair fails to move to the error state, once.
        peer_checks: AtomicU32,
    }

    /// The server's soft completion queue, with `Faults::cq`.
    struct FaultyCq {
        cq: SoftCq,
        faults: Arc<Faults>,
    }

    // SAFETY: the soft completion queue's completions, passed through; a
    // poll may fail instead, which the contract allows.
    unsafe impl CompletionQueue for FaultyCq {
        fn id(&self) -> CqId {
            self.cq.id()
        }
        fn entries(&self) -> u32 {
            self.cq.entries()
        }
        fn poll(&mut self, out: &mut [RawCompletion]) -> Result<usize, Error> {
            if self.faults.cq.load(Ordering::Acquire) {
                return Err(Error::CqOverrun);
            }
            self.cq.poll(out)
        }
        fn completion_events(&self) -> Option<Arc<dyn CompletionEvents>> {
            self.cq.completion_events()
        }
    }

    /// A server's soft queue pair, with `Faults::peer_checks`.
    struct FaultyQp {
        qp: SoftQp,
        faults: Arc<Faults>,
        refuse_set_error: bool,
    }

    // SAFETY: the soft queue pair's, passed through; a peer check may say
    // the peer left and a move to error may fail, which the contract
    // allows.
    unsafe impl QueuePair for FaultyQp {
        type Cq = FaultyCq;
        type Srq = SoftSrq;
        fn caps(&self) -> QpCaps {
            self.qp.caps()
        }
        unsafe fn post_send(&mut self, wrs: &[SendWr], sges: &[Sge]) -> Result<(), PostError> {
            // SAFETY: the caller's contract, passed through.
            unsafe { self.qp.post_send(wrs, sges) }
        }
        unsafe fn post_recv(&mut self, wrs: &[RecvWr], sges: &[Sge]) -> Result<(), PostError> {
            // SAFETY: the caller's contract, passed through.
            unsafe { self.qp.post_recv(wrs, sges) }
        }
        fn set_error(&mut self) -> Result<(), Error> {
            if std::mem::take(&mut self.refuse_set_error) {
                return Err(Error::Soft("the move to error failed"));
            }
            self.qp.set_error()
        }
        fn take_cq(&mut self) -> Option<FaultyCq> {
            None
        }
        fn peer_disconnected(&mut self) -> Result<bool, Error> {
            let checks = &self.faults.peer_checks;
            let left = checks
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
                .is_ok();
            self.refuse_set_error |= left;
            Ok(left)
        }
    }

    /// A server whose queues fail as its `Faults` say; calls time out
    /// after half a second.
    fn faulty_server() -> (SoftDevice, Arc<Faults>, RpcServer<FaultyQp>) {
        let dev = SoftDevice::new();
        let faults = Arc::new(Faults::default());
        let config = RpcConfig {
            call_timeout: Duration::from_millis(500),
            ..RpcConfig::default()
        };
        let pd = Arc::new(dev.alloc_pd());
        let cq = FaultyCq {
            cq: dev.create_cq(server_cq_entries(&config)).unwrap(),
            faults: Arc::clone(&faults),
        };
        let srq = dev.create_srq(&pd, config.srq_config()).unwrap();
        let fabric = SoftFabric {
            dev: dev.clone(),
            pd: Arc::clone(&pd),
        };
        let service = Service::handler(echo);
        let server = RpcServer::start(cq, srq, pd, service, config, Box::new(fabric)).unwrap();
        (dev, faults, server)
    }

    fn faulty_client(server: &RpcServer<FaultyQp>, faults: &Arc<Faults>) -> RpcClient<SoftQp> {
        let config = server.shared.config;
        let fabric = server.shared.fabric.downcast_ref::<SoftFabric>().unwrap();
        let server_qp = server
            .shared
            .make_qp(|cq, srq| {
                let qp = fabric.dev.create_qp_on(
                    &fabric.pd,
                    &cq.cq,
                    Some(srq),
                    server_qp_config(&config),
                )?;
                Ok::<_, Error>(FaultyQp {
                    qp,
                    faults: Arc::clone(faults),
                    refuse_set_error: false,
                })
            })
            .unwrap();
        let pd = Arc::new(fabric.dev.alloc_pd());
        let qp = fabric
            .dev
            .create_qp(&pd, client_qp_config(&config))
            .unwrap();
        fabric.dev.connect(&server_qp.qp, &qp).unwrap();
        let pending = PendingClient::new(qp, pd, config).unwrap();
        assert!(server.shared.admit(server_qp, None, None));
        pending.establish().unwrap()
    }

    fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !done() {
            assert!(Instant::now() < deadline, "waited too long for {what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// A ring that failed (its completion queue overran) ends the server
    /// at once, saying why: no goodbye could leave, no client could
    /// close, so nothing waits for them; new connections are refused.
    #[test]
    fn a_failed_ring_ends_the_server_at_once_and_says_why() {
        let (_dev, faults, server) = faulty_server();
        let client = faulty_client(&server, &faults);
        assert_eq!(client.call(b"before").unwrap(), b"before");
        faults.cq.store(true, Ordering::Release);
        wait_until("the failure", || server.failure().is_some());
        assert_eq!(server.failure(), Some("completion queue overrun"));
        let stats = server.stats();
        assert_eq!((stats.clients_open, stats.clients_closed), (0, 1));
        assert!(server.shared.stopping(), "new connections are refused");
        assert!(client.call(b"after").is_err());
        // Nothing left to wait for: not the release timeout (10 s).
        let t0 = Instant::now();
        server.shutdown().unwrap();
        assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    }

    /// A reap that fails without failing the ring (here: a queue pair
    /// whose peer left could not be moved to error) is counted, and the
    /// server serves on: that connection ends, the other is served.
    #[test]
    fn a_failed_look_at_one_connection_leaves_the_others_served() {
        let (_dev, faults, server) = faulty_server();
        let clients = [
            faulty_client(&server, &faults),
            faulty_client(&server, &faults),
        ];
        for client in &clients {
            assert_eq!(client.call(b"before").unwrap(), b"before");
        }
        faults.peer_checks.store(1, Ordering::Release);
        wait_until("the failed look", || server.stats().poll_errors == 1);
        wait_until("its connection to end", || {
            server.stats().clients_closed == 1
        });
        assert_eq!(server.failure(), None);
        let served = clients.iter().filter(|c| c.call(b"after").is_ok()).count();
        assert_eq!(served, 1, "{:?}", server.stats());
        assert_eq!(server.stats().clients_open, 1);
    }

    /// A client of `server`, with a handle on the server's end of its
    /// queue pair.
    fn client_with_control(
        server: &RpcServer<SoftQp>,
        config: RpcConfig,
    ) -> (RpcClient<SoftQp>, crate::backend::soft::QpControl) {
        let (server_qp, client_qp, pd) = server.soft_pair(client_qp_config(&config)).unwrap();
        let control = server_qp.control();
        let pending = PendingClient::new(client_qp, pd, config).unwrap();
        assert!(server.shared.admit(server_qp, None, None));
        (pending.establish().unwrap(), control)
    }

    /// A client pipelining calls whose responses are large keeps within
    /// what the server holds for it (twice the window of unreleased
    /// responses): while its reads are slow to finish, the next call
    /// waits for a release rather than being answered `Busy` after its
    /// handler ran.
    #[test]
    fn a_client_reading_slowly_is_never_answered_busy() {
        let dev = SoftDevice::new();
        let config = RpcConfig {
            window: 1,
            ..RpcConfig::default()
        };
        let large = |_: &Caller, _: &[u8], resp: &mut Vec<u8>| -> Result<(), HandlerError> {
            resp.resize(8192, 7);
            Ok(())
        };
        let server = RpcServer::soft(&dev, Service::handler(large), config).unwrap();
        // Queues and buffers for a window of 16, so that only the server's
        // window of 1 holds calls back (held completions keep their send
        // queue slots and send buffers).
        let roomy = RpcConfig {
            window: 16,
            ..config
        };
        let (server_qp, client_qp, pd) = server.soft_pair(client_qp_config(&roomy)).unwrap();
        let reads = client_qp.control();
        let pending = PendingClient::new(client_qp, pd, roomy).unwrap();
        assert!(server.shared.admit(server_qp, None, None));
        let client = pending.establish().unwrap();
        // The reads run; their completions (and so the releases) wait.
        reads.hold_acks();
        let calls = std::thread::spawn(move || {
            let calls = [(); 3].map(|_| client.call_async(b"x"));
            futures::executor::block_on(futures::future::join_all(calls))
        });
        let since = Instant::now();
        wait_until("two calls, or a third", || {
            let requests = server.stats().requests;
            requests >= 3 || (requests == 2 && since.elapsed() > Duration::from_millis(300))
        });
        reads.release_acks();
        for answer in calls.join().unwrap() {
            assert_eq!(answer.unwrap(), vec![7u8; 8192]);
        }
        assert_eq!(server.stats().requests, 3);
    }

    /// A client that closes while the server reads its large request
    /// drops the call: the read's completion, come after the close, runs
    /// no handler (the answer could never reach the client), as a call
    /// whose read had not started is dropped.
    #[test]
    fn a_request_read_after_its_client_closed_is_not_handled() {
        let dev = SoftDevice::new();
        let handled = Arc::new(AtomicU32::new(0));
        let counting = {
            let handled = Arc::clone(&handled);
            move |_: &Caller, _: &[u8], _: &mut Vec<u8>| -> Result<(), HandlerError> {
                handled.fetch_add(1, Ordering::SeqCst);
                Ok(())
            }
        };
        let config = RpcConfig::default();
        let server = RpcServer::soft(&dev, Service::handler(counting), config).unwrap();
        let (client, control) = client_with_control(&server, config);
        // The server's read of the request runs; its completion waits.
        control.hold_acks();
        let mut call = Box::pin(client.call_async(&[3u8; 64 << 10]));
        let noop = &mut std::task::Context::from_waker(std::task::Waker::noop());
        assert!(std::future::Future::poll(call.as_mut(), noop).is_pending());
        wait_until("the request", || server.stats().messages == 1);
        drop(call);
        drop(client);
        wait_until("the close", || server.stats().clients_left == 1);
        control.release_acks();
        wait_until("the connection to go", || {
            server.stats().clients_closed == 1
        });
        let stats = server.stats();
        // The read was pushed, came back, and found the connection
        // closing (not broken: no violation).
        assert_eq!(
            (
                handled.load(Ordering::SeqCst),
                stats.requests,
                stats.protocol_errors
            ),
            (0, 0, 0),
            "{stats:?}"
        );
        assert_eq!(stats.peak_reading, 64 << 10, "{stats:?}");
    }

    /// Sends and reads the device refuses to post (a NIC short of
    /// resources) go out on a later pass: the connection lives on, each
    /// call is answered once and counted once.
    #[test]
    fn posts_the_device_refuses_are_pushed_again() {
        let dev = SoftDevice::new();
        let config = RpcConfig::default();
        let server = RpcServer::soft(&dev, Service::handler(echo), config).unwrap();
        let (client, control) = client_with_control(&server, config);
        // The answer's send.
        let before = control.counters().send_posts;
        control.refuse_posts(2);
        assert_eq!(client.call(b"small").unwrap(), b"small");
        // Two posts refused, then the one taken.
        assert_eq!(control.counters().send_posts - before, 3);
        // The read of a large request, then the send of its large answer.
        let large: Vec<u8> = (0..64 << 10).map(|i| i as u8).collect();
        control.refuse_posts(1);
        assert_eq!(client.call(&large).unwrap(), large);
        control.refuse_posts(3);
        assert_eq!(client.call(&large).unwrap(), large);
        // Answered and counted once each (releases of the large answers
        // are answered too, once they arrive): an answer pushed again is
        // not counted again, nor one lost.
        let settled = Instant::now() + Duration::from_secs(10);
        while server.stats().answers < server.stats().messages && Instant::now() < settled {
            std::thread::sleep(Duration::from_millis(5));
        }
        let stats = server.stats();
        assert_eq!(stats.requests, 3, "{stats:?}");
        assert_eq!(stats.answers, stats.messages, "{stats:?}");
        assert_eq!(stats.clients_closed, 0, "{stats:?}");
    }

    /// A device that goes on refusing a connection's posts ends that
    /// connection, and only after a while (not at the first refusal),
    /// asked again about once a millisecond meanwhile, not on every pass.
    #[test]
    fn a_connection_whose_posts_the_device_keeps_refusing_ends() {
        let dev = SoftDevice::new();
        let config = RpcConfig::default();
        let server = RpcServer::soft(&dev, Service::handler(echo), config).unwrap();
        let (client, control) = client_with_control(&server, config);
        let (other, _) = client_with_control(&server, config);
        let posts_before = control.counters().send_posts;
        control.refuse_posts(u32::MAX);
        let call = std::thread::spawn(move || {
            let call = client.call_with_timeout(b"never answered", Duration::from_secs(3));
            (call, client)
        });
        // The refusals begin after this: half the time to give up will
        // not have passed since.
        std::thread::sleep(super::super::server_core::REFUSALS_GIVEN_UP_AFTER / 2);
        let stats = server.stats();
        assert_eq!(stats.clients_closed, 0, "closed at once: {stats:?}");
        assert_eq!(stats.answers, 0, "the refused answer counted: {stats:?}");
        // At most one try a millisecond (a few hundred here); a poller
        // spinning on the refusals makes thousands in this time.
        let posts = control.counters().send_posts - posts_before;
        assert!(posts < 1000, "{posts} posts tried");
        wait_until("a refused post", || {
            control.counters().send_posts > posts_before
        });
        let given_up = Instant::now() + Duration::from_secs(10);
        while server.stats().clients_closed == 0 && Instant::now() < given_up {
            std::thread::sleep(Duration::from_millis(5));
        }
        let stats = server.stats();
        assert_eq!(stats.clients_closed, 1, "{stats:?}");
        assert_eq!(stats.answers, 0, "{stats:?}");
        let (call, _client) = call.join().unwrap();
        assert!(call.is_err(), "{call:?}");
        // The other client is served as before.
        assert_eq!(other.call(b"still here").unwrap(), b"still here");
    }
}
