//! [`SessionHost`]: one device's shared parts — protection domain, region
//! allocator, ring (one completion queue, one driver) and the pump thread
//! serving every session's control channel.

use std::alloc::Layout;
use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::{Context, Poll, Waker};
use std::thread::{JoinHandle, Thread};

use super::state::{SessionShared, SessionState};
use super::wire::{Hello, MAX_CONTROL_BODY, TRAILER_LEN};
use super::{Session, SessionConfig, SessionError};
use crate::backend::soft::{SoftDevice, SoftQp};
use crate::backend::{AsyncEvent, CompletionQueue, ProtectionDomain, QueuePair};
use crate::buf::{Region, RegionAllocator};
use crate::future::{AsyncRing, Wakeup};
use crate::op::Recv;
use crate::ring::{Completion, QpHandle, Ring, RingConfig};
use crate::Error;

/// `user_data` of the session's own operations.
pub(super) const RECV: u64 = 1;
pub(super) const CONTROL: u64 = 2;
pub(super) const CLOSE: u64 = 3;

/// Device events kept for [`SessionHost::events`] at most.
const MAX_EVENTS: usize = 1024;

static NEXT_TOKEN: AtomicU64 = AtomicU64::new(1);

pub(crate) struct HostShared<Q: QueuePair + Send + 'static> {
    pub(super) ring: AsyncRing<Q>,
    pub(super) regions: RegionAllocator,
    pub(super) pd: Arc<dyn ProtectionDomain>,
    pub(super) config: SessionConfig,
    /// Sessions admitted at once: see [`SessionHost::max_sessions`].
    pub(super) most_sessions: usize,
    pub(super) sessions: Mutex<Sessions<Q>>,
    pub(super) events: Mutex<EventQueue>,
    /// Every [`SessionHost`] handle is gone: the pump ends with the last
    /// session.
    pub(super) abandoned: AtomicBool,
    pub(super) pump: Mutex<Option<Thread>>,
    /// The device, for making queue pairs (a soft or verbs fabric).
    pub(super) fabric: Box<dyn std::any::Any + Send + Sync>,
    /// Makes the regions peers ask for, off the pump's thread.
    pub(super) granter: super::granter::Granter<Q>,
    /// Bytes all sessions' peers hold of ours (lent, being granted, and
    /// granted and handed back but not yet taken by our user), as each
    /// session last reported: grants stop at half the memory limit, so
    /// peers together cannot take the memory every session needs for
    /// its receives and messages.
    pub(super) held_by_peers: std::sync::atomic::AtomicU64,
}

/// The host's queue pairs: sessions, and those still connecting, whose
/// early completions wait for their session.
pub(super) struct Sessions<Q: QueuePair + Send + 'static> {
    pub(super) live: HashMap<QpHandle, Arc<SessionShared<Q>>>,
    pub(super) preparing: HashMap<QpHandle, Vec<Completion>>,
    /// Handshakes holding a [`Reservation`]: from their start to their
    /// queue pair's attachment (which takes the ring's lock, never taken
    /// with this).
    pub(super) admitting: usize,
}

impl<Q: QueuePair + Send + 'static> Sessions<Q> {
    /// Sessions the host holds, handshakes under way included.
    fn held(&self) -> usize {
        self.live.len() + self.preparing.len() + self.admitting
    }
}

#[derive(Default)]
pub(super) struct EventQueue {
    pub(super) events: VecDeque<AsyncEvent>,
    pub(super) waiters: Vec<Waker>,
    /// The pump has ended: no more events come.
    pub(super) stopped: bool,
}

impl<Q: QueuePair + Send + 'static> HostShared<Q> {
    /// The most all peers together may hold of ours: half the memory
    /// limit, the rest kept for the sessions' own receives and messages
    /// and our users' regions.
    pub(super) fn grant_limit(&self) -> u64 {
        self.config.memory_limit as u64 / 2
    }

    /// Adds to the host's count the change in what `st`'s peer holds
    /// since the session last reported.
    pub(super) fn report_held(&self, st: &mut super::state::SessionState) {
        use std::sync::atomic::Ordering;
        let now = st.lent_bytes + st.returned_bytes + st.granting_bytes;
        let before = std::mem::replace(&mut st.reported_held, now);
        if now >= before {
            self.held_by_peers.fetch_add(now - before, Ordering::AcqRel);
        } else {
            self.held_by_peers.fetch_sub(before - now, Ordering::AcqRel);
        }
    }

    /// Wakes the pump: something for it to send, or to look at.
    pub(super) fn nudge(&self) {
        if let Some(t) = &*self.pump.lock().unwrap_or_else(|p| p.into_inner()) {
            t.unpark();
        }
    }

    pub(super) fn sessions(&self) -> MutexGuard<'_, Sessions<Q>> {
        self.sessions.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A receive region: the largest message the peer may send us (or
    /// control message, if larger), plus the trailer.
    pub(super) fn recv_region(&self) -> Result<Region, Error> {
        let len = (self.config.max_message as usize).max(MAX_CONTROL_BODY) + TRAILER_LEN;
        self.regions
            .alloc(Layout::from_size_align(len, 64).expect("a small layout"))
    }

    /// Pushes a receive of `region` on `qp` (not yet submitted); a
    /// refused one comes back with the error.
    pub(super) fn post_recv(&self, qp: QpHandle, region: Region) -> Result<(), (Error, Region)> {
        self.ring.with_ring(|mut ring| {
            ring.submission_on(qp)
                .push(Recv::new(region).user_data(RECV))
                .map(|_| ())
                .map_err(|r| {
                    let (e, op) = r.into_parts();
                    (e, op.into_buf())
                })
        })
    }
}

/// A queue pair attached to a host with its receives posted, not yet a
/// session: connect it, then [`SessionHost::admit`] it.
pub(super) struct Prepared {
    pub(super) handle: QpHandle,
}

/// One device's sessions: see the [module docs](super). Cloning gives
/// another handle; sessions keep their host alive.
///
/// ```
/// use rdma_ring::backend::soft::SoftDevice;
/// use rdma_ring::session::{SessionConfig, SessionHost};
/// let dev = SoftDevice::new();
/// let host = SessionHost::soft(&dev, SessionConfig::default()).unwrap();
/// let (a, b) = host.connect_soft(&host).unwrap(); // two sessions, one ring
/// assert_eq!(host.sessions(), 2);
/// drop((a, b));
/// ```
pub struct SessionHost<Q: QueuePair + Send + 'static> {
    pub(super) shared: Arc<HostShared<Q>>,
    handle: Arc<HostHandle<Q>>,
}

struct HostHandle<Q: QueuePair + Send + 'static> {
    shared: Weak<HostShared<Q>>,
    pump: Mutex<Option<JoinHandle<()>>>,
}

impl<Q: QueuePair + Send + 'static> Drop for HostHandle<Q> {
    fn drop(&mut self) {
        if let Some(shared) = self.shared.upgrade() {
            shared.abandoned.store(true, Ordering::Release);
            shared.nudge();
        }
        // The pump ends once the last session is gone; it is not joined
        // here, so dropping a host never waits for its peers.
        drop(self.pump.lock().unwrap_or_else(|p| p.into_inner()).take());
    }
}

impl<Q: QueuePair + Send + 'static> Clone for SessionHost<Q> {
    fn clone(&self) -> Self {
        SessionHost {
            shared: Arc::clone(&self.shared),
            handle: Arc::clone(&self.handle),
        }
    }
}

impl<Q: QueuePair + Send + 'static> fmt::Debug for SessionHost<Q> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SessionHost")
            .field("sessions", &self.sessions())
            .field("regions", &self.shared.regions)
            .finish_non_exhaustive()
    }
}

impl<Q: QueuePair + Send + 'static> SessionHost<Q> {
    /// A host over completion queue `cq` of `pd`'s device (its ring set
    /// up by `setup`, e.g. to watch the device's events), and its pump.
    pub(super) fn start(
        cq: Q::Cq,
        pd: Arc<dyn ProtectionDomain>,
        setup: impl FnOnce(&mut Ring<Q>),
        config: SessionConfig,
        fabric: Box<dyn std::any::Any + Send + Sync>,
    ) -> Result<Self, Error> {
        config.check()?;
        let most_sessions = most_sessions(&config, cq.entries());
        let regions =
            RegionAllocator::with_limit(Arc::clone(&pd), config.arena_bytes, config.memory_limit)?;
        let mut ring = Ring::with_cq(cq, RingConfig::default());
        setup(&mut ring);
        let ring = AsyncRing::new(ring, Wakeup::Thread)?;
        let shared = Arc::new(HostShared {
            ring,
            regions,
            pd,
            config,
            most_sessions,
            sessions: Mutex::new(Sessions {
                live: HashMap::new(),
                preparing: HashMap::new(),
                admitting: 0,
            }),
            events: Mutex::new(EventQueue::default()),
            abandoned: AtomicBool::new(false),
            pump: Mutex::new(None),
            fabric,
            granter: super::granter::Granter::new(),
            held_by_peers: std::sync::atomic::AtomicU64::new(0),
        });
        let pump_shared = Arc::clone(&shared);
        let pump = std::thread::Builder::new()
            .name("rdma-ring-session-pump".into())
            .spawn(move || super::pump::pump_loop(&pump_shared))
            .map_err(|_| Error::Soft("could not spawn the session pump thread"))?;
        *shared.pump.lock().unwrap_or_else(|p| p.into_inner()) = Some(pump.thread().clone());
        Ok(SessionHost {
            handle: Arc::new(HostHandle {
                shared: Arc::downgrade(&shared),
                pump: Mutex::new(Some(pump)),
            }),
            shared,
        })
    }

    /// A queue pair made by `create` on the host's completion queue.
    pub(super) fn create_qp(
        &self,
        create: impl FnOnce(&Q::Cq) -> Result<Q, Error>,
    ) -> Result<Q, Error> {
        self.shared.ring.with_ring(|ring| create(ring.cq()))
    }

    /// Room for one more session ([`SessionConfig::max_sessions`]), held
    /// by a handshake from its start, before it takes anything of the
    /// device's or tells the peer its hello.
    pub(super) fn reserve(&self) -> Result<Reservation<'_, Q>, SessionError> {
        let mut sessions = self.shared.sessions();
        if sessions.held() >= self.shared.most_sessions {
            return Err(SessionError::HostFull {
                most: self.shared.most_sessions,
                peer: false,
            });
        }
        sessions.admitting += 1;
        Ok(Reservation { host: self })
    }

    /// Attaches `qp` and posts its receives, in the room `reservation`
    /// holds.
    pub(super) fn prepare(
        &self,
        reservation: Reservation<'_, Q>,
        qp: Q,
    ) -> Result<Prepared, Error> {
        let attached = self
            .shared
            .ring
            .attach(qp)
            .map(|attached| attached.handle());
        {
            let mut sessions = self.shared.sessions();
            // The room passes to the prepared queue pair under the same
            // hold of the lock, so no other handshake sees it counted
            // twice, or not at all.
            reservation.settle(&mut sessions);
            if let Ok(handle) = attached {
                sessions.preparing.insert(handle, Vec::new());
            }
        }
        let handle = attached.map_err(|r| r.into_parts().0)?;
        let prepared = Prepared { handle };
        let regions: Result<Vec<Region>, Error> = (0..self.shared.config.recv_depth)
            .map(|_| self.shared.recv_region())
            .collect();
        // Pushed and submitted under one hold of the ring, so that no
        // other handshake's receives go out with them. The pump's pushed
        // work may: what the device refuses of it fails its sessions, as
        // the pump's own submit would.
        let submitted = regions.and_then(|regions| {
            let mut refused = None;
            self.shared.ring.with_ring(|mut ring| {
                for region in regions {
                    ring.submission_on(handle)
                        .push(Recv::new(region).user_data(RECV))
                        .map_err(|r| r.into_parts().0)?;
                }
                refused = ring.submit().err();
                Ok::<(), Error>(())
            })?;
            let Some(refused) = refused else {
                return Ok(());
            };
            // Out of the ring's lock: failing a session takes it. Another
            // session's refused work fails that session, not this
            // handshake, unless ours was refused too.
            super::pump::refused(&self.shared, &refused);
            if refused.unposted.iter().any(|op| op.qp == Some(handle)) {
                Err(refused.error)
            } else {
                Ok(())
            }
        });
        match submitted {
            Ok(()) => Ok(prepared),
            Err(e) => {
                self.abandon(prepared);
                Err(e)
            }
        }
    }

    /// Drops a prepared queue pair (its receives drained first).
    pub(super) fn abandon(&self, prepared: Prepared) {
        self.shared.sessions().preparing.remove(&prepared.handle);
        let _ = self
            .shared
            .ring
            .with_ring(|mut r| r.detach(prepared.handle));
    }

    /// Runs `f` on the prepared queue pair (to connect it).
    #[cfg_attr(not(feature = "verbs"), allow(dead_code))]
    pub(super) fn with_qp<R>(&self, prepared: &Prepared, f: impl FnOnce(&Q) -> R) -> R {
        self.shared
            .ring
            .with_ring(|ring| f(ring.qp_of(prepared.handle).expect("attached")))
    }

    /// A connected, prepared queue pair becomes a session with a peer that
    /// said `peer`.
    pub(super) fn admit(
        &self,
        prepared: Prepared,
        peer: Hello,
        watch: Option<TcpStream>,
    ) -> Session<Q> {
        if let Some(w) = &watch {
            let _ = w.set_nonblocking(true);
        }
        let shared = Arc::new(SessionShared {
            host: Arc::clone(&self.shared),
            qp: self.shared.ring.qp(prepared.handle),
            token: NEXT_TOKEN.fetch_add(1, Ordering::Relaxed),
            state: Mutex::new(SessionState::new(self.shared.config.hello(), peer)),
            watch,
        });
        // What arrived before the session existed goes first, in order;
        // what arrives meanwhile still waits in `preparing`.
        loop {
            let early = {
                let mut sessions = self.shared.sessions();
                let early = sessions
                    .preparing
                    .get_mut(&prepared.handle)
                    .map(std::mem::take)
                    .unwrap_or_default();
                if early.is_empty() {
                    sessions.preparing.remove(&prepared.handle);
                    sessions.live.insert(prepared.handle, Arc::clone(&shared));
                    break;
                }
                early
            };
            for c in early {
                super::pump::on_message(&self.shared, &shared, c);
            }
        }
        self.shared.nudge();
        Session::new(shared, self.clone())
    }

    /// Sessions this host admits at once: [`SessionConfig::max_sessions`],
    /// or fewer where its device's completion queue cannot hold that many
    /// sessions' queues.
    ///
    /// ```
    /// use rdma_ring::backend::soft::SoftDevice;
    /// use rdma_ring::session::{SessionConfig, SessionHost};
    /// let host = SessionHost::soft(&SoftDevice::new(), SessionConfig::default()).unwrap();
    /// assert_eq!(host.max_sessions(), 64);
    /// ```
    pub fn max_sessions(&self) -> usize {
        self.shared.most_sessions
    }

    /// Sessions open on this host.
    pub fn sessions(&self) -> usize {
        self.shared.sessions().live.len()
    }

    /// The host's region allocator (shared by all its sessions).
    pub fn regions(&self) -> &RegionAllocator {
        &self.shared.regions
    }

    /// The configuration sessions of this host use.
    pub fn config(&self) -> &SessionConfig {
        &self.shared.config
    }

    /// The device's asynchronous events (port state, queue pair errors, …),
    /// as the host's ring saw them.
    pub fn events(&self) -> SessionEvents<Q> {
        SessionEvents {
            shared: Arc::clone(&self.shared),
        }
    }
}

/// The soft device a soft host was made on.
struct SoftFabric {
    dev: SoftDevice,
    pd: Arc<crate::backend::soft::SoftPd>,
}

impl SessionHost<SoftQp> {
    /// A host on the in-process soft device. It reads the device's
    /// asynchronous events ([`events`](Self::events)); the soft device has
    /// one reader, so the newest host on a device takes them.
    pub fn soft(dev: &SoftDevice, config: SessionConfig) -> Result<Self, Error> {
        config.check()?;
        let pd = Arc::new(dev.alloc_pd());
        let cq = dev.create_cq(host_cq_entries(&config))?;
        let events = dev.async_events()?;
        let fabric = SoftFabric {
            dev: dev.clone(),
            pd: Arc::clone(&pd),
        };
        let setup = move |ring: &mut Ring<SoftQp>| ring.watch_events(events);
        SessionHost::start(cq, pd, setup, config, Box::new(fabric))
    }

    /// A session on this host connected to a bare queue pair made with
    /// `config` (in a protection domain of its own, with its own
    /// completion queue) whose peer said `hello`: for tests that play a
    /// peer breaking the protocol. Post the bare queue pair's receives
    /// before the session may send to it.
    pub fn connect_soft_raw(
        &self,
        hello: Hello,
        config: crate::backend::QpConfig,
    ) -> Result<(Session<SoftQp>, SoftQp, Arc<crate::backend::soft::SoftPd>), SessionError> {
        let fabric = self.soft_fabric();
        let pd = Arc::new(fabric.dev.alloc_pd());
        let reservation = self.reserve()?;
        let raw = fabric.dev.create_qp(&pd, config)?;
        let ours = self.create_soft_qp()?;
        fabric.dev.connect(&ours, &raw)?;
        let prepared = self.prepare(reservation, ours)?;
        Ok((self.admit(prepared, hello, None), raw, pd))
    }

    /// Two sessions connected to each other on one new soft host: the
    /// quickest way to try sessions.
    pub fn soft_pair(
        dev: &SoftDevice,
        config: SessionConfig,
    ) -> Result<(Session<SoftQp>, Session<SoftQp>), SessionError> {
        let host = SessionHost::soft(dev, config)?;
        host.connect_soft(&host)
    }

    /// A new session pair on the soft device: one on this host, one on
    /// `other` (which may be this host), connected to each other.
    pub fn connect_soft(
        &self,
        other: &SessionHost<SoftQp>,
    ) -> Result<(Session<SoftQp>, Session<SoftQp>), SessionError> {
        self.connect_soft_watching(other, (None, None))
    }

    /// [`connect_soft`](Self::connect_soft), each session watching a
    /// socket as a handshake's (its end says the peer is gone).
    pub(super) fn connect_soft_watching(
        &self,
        other: &SessionHost<SoftQp>,
        (watch_a, watch_b): (Option<TcpStream>, Option<TcpStream>),
    ) -> Result<(Session<SoftQp>, Session<SoftQp>), SessionError> {
        let ra = self.reserve()?;
        let rb = other.reserve().map_err(|e| match e {
            SessionError::HostFull { most, .. } => SessionError::HostFull { most, peer: true },
            e => e,
        })?;
        // Connected before either is attached: nobody can send before
        // both sessions exist, and the ring's lock is not needed twice.
        let (qa, qb) = (self.create_soft_qp()?, other.create_soft_qp()?);
        self.soft_fabric().dev.connect(&qa, &qb)?;
        let a = self.prepare(ra, qa)?;
        let b = match other.prepare(rb, qb) {
            Ok(b) => b,
            Err(e) => {
                self.abandon(a);
                return Err(e.into());
            }
        };
        let (ha, hb) = (self.config().hello(), other.config().hello());
        Ok((self.admit(a, hb, watch_a), other.admit(b, ha, watch_b)))
    }

    fn soft_fabric(&self) -> &SoftFabric {
        self.shared
            .fabric
            .downcast_ref::<SoftFabric>()
            .expect("a soft host")
    }

    fn create_soft_qp(&self) -> Result<SoftQp, Error> {
        let fabric = self.soft_fabric();
        let config = self.shared.config.qp_config();
        self.create_qp(|cq| fabric.dev.create_qp_on(&fabric.pd, cq, None, config))
    }
}

/// Completion queue entries one session may take at most: a completion
/// for each of its send queue's slots and each of its receives.
fn session_cq_entries(config: &SessionConfig) -> u32 {
    config.qp_config().max_send_wr + u32::from(config.recv_depth)
}

/// Room for one session on a host, from a handshake's start until its
/// queue pair is attached; dropped, the room is free again.
pub(super) struct Reservation<'a, Q: QueuePair + Send + 'static> {
    host: &'a SessionHost<Q>,
}

impl<Q: QueuePair + Send + 'static> Reservation<'_, Q> {
    /// Gives up the room to what `sessions` counts in its place.
    fn settle(self, sessions: &mut Sessions<Q>) {
        sessions.admitting -= 1;
        std::mem::forget(self);
    }
}

impl<Q: QueuePair + Send + 'static> Drop for Reservation<'_, Q> {
    fn drop(&mut self) {
        self.host.shared.sessions().admitting -= 1;
    }
}

/// Completion queue entries a host asks for: room for `max_sessions`
/// sessions' full queues, within what a completion queue holds (a device
/// may hold fewer: see [`most_sessions`]).
pub(super) fn host_cq_entries(config: &SessionConfig) -> u32 {
    (session_cq_entries(config) * config.max_sessions).clamp(1024, 65536)
}

/// Sessions a host whose completion queue has `cq_entries` admits at
/// once: `max_sessions`, or fewer if that many sessions' queues do not
/// fit (at least one: a session's queues always fit 65536 entries, and a
/// device holding fewer is asked for no more than it holds).
pub(super) fn most_sessions(config: &SessionConfig, cq_entries: u32) -> usize {
    (cq_entries / session_cq_entries(config)).clamp(1, config.max_sessions) as usize
}

/// The device's asynchronous events as a host saw them: port changes,
/// queue pair errors, and the rest of [`AsyncEvent`]. The host keeps the
/// latest 1024 until they are taken.
pub struct SessionEvents<Q: QueuePair + Send + 'static> {
    shared: Arc<HostShared<Q>>,
}

impl<Q: QueuePair + Send + 'static> SessionEvents<Q> {
    /// The next event, if one is waiting.
    pub fn try_next(&self) -> Option<AsyncEvent> {
        self.queue().events.pop_front()
    }

    /// The next event, awaited; `None` once the host has stopped (its
    /// last handle and session gone).
    pub async fn next(&self) -> Option<AsyncEvent> {
        std::future::poll_fn(|cx: &mut Context<'_>| {
            let mut q = self.queue();
            match q.events.pop_front() {
                Some(e) => Poll::Ready(Some(e)),
                None if q.stopped => Poll::Ready(None),
                None => {
                    crate::wakers::register(&mut q.waiters, cx.waker(), |full| {
                        crate::wakers::wake_now_or_later(full)
                    });
                    Poll::Pending
                }
            }
        })
        .await
    }

    fn queue(&self) -> MutexGuard<'_, EventQueue> {
        self.shared.events.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl<Q: QueuePair + Send + 'static> fmt::Debug for SessionEvents<Q> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SessionEvents").finish_non_exhaustive()
    }
}

impl EventQueue {
    /// Keeps `event` (dropping the oldest beyond the bound) and wakes
    /// whoever waits.
    pub(super) fn push(&mut self, event: AsyncEvent) {
        if self.events.len() == MAX_EVENTS {
            self.events.pop_front();
        }
        self.events.push_back(event);
        self.wake();
    }

    /// No more events will come.
    pub(super) fn stop(&mut self) {
        self.stopped = true;
        self.wake();
    }

    fn wake(&mut self) {
        crate::wakers::wake_now_or_later(self.waiters.drain(..));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every session the host admits has room for its full queues in the
    /// completion queue, whatever the configuration.
    #[test]
    fn the_sessions_a_host_admits_fit_its_completion_queue() {
        for (max_send_wr, recv_depth, max_sessions) in [
            (256, 32, 16),
            (1, 4, 1),
            (16384, 1024, 4096),
            (4096, 64, 64),
            (256, 32, 4096),
        ] {
            let config = SessionConfig {
                max_send_wr,
                recv_depth,
                user_window: 1,
                max_sessions,
                ..SessionConfig::default()
            };
            config.check().unwrap();
            // As asked, and on a device that holds fewer entries.
            for entries in [
                host_cq_entries(&config),
                host_cq_entries(&config).min(32767),
            ] {
                let most = most_sessions(&config, entries);
                assert!(most >= 1, "{config:?}");
                assert!(most <= max_sessions as usize);
                let needed = most as u64 * u64::from(session_cq_entries(&config));
                assert!(needed <= u64::from(entries), "{config:?} in {entries}");
            }
        }
        let config = SessionConfig::default();
        assert_eq!(most_sessions(&config, host_cq_entries(&config)), 64);
    }
}
