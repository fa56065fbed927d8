//! Accepting handshakes side by side, over TCP or rdma_cm.

use std::collections::{HashMap, VecDeque};
use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::cm::{CmListener, CmRequest};
use super::readiness::wait_readable;
use crate::deadline::Deadline;
use crate::error::Error;

/// Handshakes in progress at most: beyond, connections wait in the
/// kernel's backlog (TCP's, or rdma_cm's), so a flood of them costs a
/// bounded number of threads and queue pairs.
const MAX_HANDSHAKES: usize = 64;
/// Handshakes in progress from one address at most: one address whose
/// peers stall cannot take every slot. Its further attempts wait,
/// accepted, for its own handshakes to end.
const MAX_HANDSHAKES_PER_ORIGIN: usize = 8;
/// Attempts waiting so, at most (each holds a socket or an rdma_cm
/// request). A full queue drops the oldest attempt of the address with
/// the most waiting, or the new one if that is its own address; one that
/// waited longer than the connect timeout is dropped ([`drop_stale`]).
const MAX_WAITING: usize = 256;
/// The longest an idle accept sleeps before it asks its `stop` again.
/// It wakes at once for a new connection, a finished handshake or an
/// [`AcceptWaker`]; a stop that nothing wakes for is seen within this.
const ACCEPT_TICK: Duration = Duration::from_secs(1);
/// How often an accept looks when it cannot wait on descriptors.
const FALLBACK_TICK: Duration = Duration::from_millis(20);

/// Where connection attempts come from.
pub(crate) trait Incoming {
    /// One attempt, for a handshake thread to take over.
    type Attempt: Send + 'static;
    /// What goes wrong with the source itself.
    type Error;
    /// The next attempt waiting, if any; never blocks.
    fn try_next(&self) -> Result<Option<Self::Attempt>, Self::Error>;
    /// The address an attempt comes from, where the source says: the
    /// attempts of one address share [`MAX_HANDSHAKES_PER_ORIGIN`]
    /// (those without one share only the listener's slots).
    fn origin(_attempt: &Self::Attempt) -> Option<IpAddr> {
        None
    }

    /// Whether the source will give no more attempts, ever (its device
    /// went away): an accept loop may stop.
    fn ended(&self) -> bool {
        false
    }

    /// A descriptor that is readable when an attempt (or anything else
    /// `try_next` takes) may be waiting.
    fn readiness(&self) -> RawFd;
}

impl Incoming for TcpListener {
    type Attempt = (TcpStream, SocketAddr);
    type Error = io::Error;

    /// Needs the listener in non-blocking mode
    /// ([`HandshakeListener::tcp`] sets it).
    fn try_next(&self) -> io::Result<Option<(TcpStream, SocketAddr)>> {
        loop {
            match self.accept() {
                // Accepted sockets need not inherit the listener's
                // non-blocking mode on every platform: the handshake's
                // timeouts assume blocking. A socket that cannot be set so
                // is that peer's failure alone: it is dropped, and the peer
                // sees its connection close.
                Ok((socket, peer)) => {
                    if socket.set_nonblocking(false).is_ok() {
                        return Ok(Some((socket, peer)));
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
                Err(e) if one_peer_s_failure(&e) => {}
                Err(e) => return Err(e),
            }
        }
    }

    fn origin((_, peer): &(TcpStream, SocketAddr)) -> Option<IpAddr> {
        Some(peer.ip())
    }

    fn readiness(&self) -> RawFd {
        self.as_raw_fd()
    }
}

/// Whether an `accept` error is one connection's, not the listener's: a
/// peer that gave up before it was accepted, or (Linux passes a new
/// connection's pending network errors to `accept`, and accept(2) asks
/// that TCP's be retried) a network error of that peer.
pub(crate) fn one_peer_s_failure(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::Interrupted | io::ErrorKind::ConnectionAborted
    ) || matches!(
        e.raw_os_error(),
        Some(
            libc::ENETDOWN
                | libc::EPROTO
                | libc::ENOPROTOOPT
                | libc::EHOSTDOWN
                | libc::ENONET
                | libc::EHOSTUNREACH
                | libc::EOPNOTSUPP
                | libc::ENETUNREACH
        )
    )
}

impl Incoming for CmListener {
    type Attempt = CmRequest;
    type Error = Error;

    fn try_next(&self) -> Result<Option<CmRequest>, Error> {
        match self.request(Duration::ZERO) {
            Ok(request) => Ok(Some(request)),
            Err(Error::HandshakeTimeout { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn origin(request: &CmRequest) -> Option<IpAddr> {
        request.peer_addr().map(|addr| addr.ip())
    }

    fn ended(&self) -> bool {
        self.removed()
    }

    fn readiness(&self) -> RawFd {
        self.event_fd()
    }
}

/// Wakes an idle accept of a [`HandshakeListener`]: a handshake that
/// finished, or whoever changed what its `stop` says.
#[derive(Clone)]
pub(crate) struct AcceptWaker(Arc<WakePair>);

/// A connected pair of non-blocking sockets: a byte written to `wake`
/// makes `woken` readable. A waker holds both ends, so the reading end
/// outlives every writer: a wake-up after the listener is gone goes into
/// the buffer, never to a closed peer (which would raise SIGPIPE where
/// writes do not ask the kernel to spare the process).
struct WakePair {
    woken: UnixStream,
    wake: UnixStream,
}

impl AcceptWaker {
    pub(crate) fn wake(&self) {
        // A full socket already holds a wake-up.
        let _ = (&self.0.wake).write(&[1]);
    }
}

/// Wakes the accept when dropped.
struct WakeOnDrop(AcceptWaker);

impl Drop for WakeOnDrop {
    fn drop(&mut self) {
        self.0.wake();
    }
}

/// A listener whose handshakes run on threads of their own, so a peer
/// that stalls (for as long as the handshake's timeout) holds up none of
/// the peers behind it. An accept hands out the next handshake to finish,
/// whoever's it is: a connection made, or the error of a peer that failed.
pub(crate) struct HandshakeListener<S: Incoming, T> {
    source: S,
    finished: Mutex<Receiver<T>>,
    finish: Sender<T>,
    slots: HandshakeSlots,
    origins: OriginSlots,
    /// Attempts accepted while their address had its handshakes running,
    /// oldest first.
    waiting: Mutex<VecDeque<Parked<S::Attempt>>>,
    /// How long an attempt may wait so (see [`drop_stale`]).
    patience: Duration,
    /// Readable once a handshake finished or an [`AcceptWaker`] woke us.
    waker: AcceptWaker,
    /// Idle waits so far, for tests.
    #[cfg(test)]
    idle_waits: AtomicUsize,
}

/// An attempt waiting for its address's turn.
struct Parked<A> {
    attempt: A,
    origin: IpAddr,
    since: Instant,
}

/// Counts the handshakes in progress, up to [`MAX_HANDSHAKES`].
#[derive(Clone, Default)]
struct HandshakeSlots(Arc<AtomicUsize>);

impl HandshakeSlots {
    /// A slot for one more handshake, unless all are taken.
    fn take(&self) -> Option<HandshakeSlot> {
        self.0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < MAX_HANDSHAKES).then_some(n + 1)
            })
            .ok()
            .map(|_| HandshakeSlot(Arc::clone(&self.0)))
    }

    fn running(&self) -> usize {
        self.0.load(Ordering::Acquire)
    }
}

/// A handshake in progress, counted while it lives (however it ends, a
/// panic included).
struct HandshakeSlot(Arc<AtomicUsize>);

impl Drop for HandshakeSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Counts the handshakes in progress per address, up to
/// [`MAX_HANDSHAKES_PER_ORIGIN`] each.
#[derive(Clone, Default)]
struct OriginSlots(Arc<Mutex<HashMap<IpAddr, usize>>>);

impl OriginSlots {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<IpAddr, usize>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A slot for one more handshake from `origin`, unless all its slots
    /// are taken.
    fn take(&self, origin: IpAddr) -> Option<OriginSlot> {
        let mut running = self.lock();
        let n = running.entry(origin).or_insert(0);
        if *n >= MAX_HANDSHAKES_PER_ORIGIN {
            return None;
        }
        *n += 1;
        Some(OriginSlot {
            slots: self.clone(),
            origin,
        })
    }

    #[cfg(test)]
    fn running(&self, origin: IpAddr) -> usize {
        self.lock().get(&origin).copied().unwrap_or(0)
    }
}

/// The address whose handshakes count together: an IPv4 peer of a
/// dual-stack listener counts as over IPv4. Each IPv6 address counts on
/// its own: a fabric commonly puts a whole rack in one /64, and one peer
/// there must not hold up the rest.
fn address_group(ip: IpAddr) -> IpAddr {
    ip.to_canonical()
}

/// Queues `attempt` from `origin` to wait for its address's turn. A full
/// queue makes room by dropping (closing or rejecting) the oldest attempt
/// of the address with the most waiting, unless `origin` would then have
/// as many: then the new one is dropped. A burst from one address waits
/// whole while there is room, and no address crowds the others out.
fn park<A>(waiting: &mut VecDeque<Parked<A>>, attempt: A, origin: IpAddr) {
    if waiting.len() >= MAX_WAITING {
        let mut counts: HashMap<IpAddr, usize> = HashMap::new();
        for parked in waiting.iter() {
            *counts.entry(parked.origin).or_default() += 1;
        }
        let own = counts.get(&origin).copied().unwrap_or(0);
        let Some((most, n)) = counts.into_iter().max_by_key(|&(_, n)| n) else {
            return;
        };
        if own + 1 >= n {
            return;
        }
        let oldest = waiting.iter().position(|parked| parked.origin == most);
        drop(waiting.remove(oldest.expect("counted")));
    }
    waiting.push_back(Parked {
        attempt,
        origin,
        since: Instant::now(),
    });
}

/// Drops (closes or rejects) the attempts that waited longer than
/// `patience` for their address's turn: their peers, waiting as long as
/// the listener's connect timeout, have given up, and handshaking them
/// would only cost a queue pair each.
fn drop_stale<A>(waiting: &mut VecDeque<Parked<A>>, patience: Duration) {
    // Oldest first: `park` pushes at the back and removes from anywhere.
    while waiting
        .front()
        .is_some_and(|parked| parked.since.elapsed() > patience)
    {
        drop(waiting.pop_front());
    }
}

/// An attempt taken for a handshake, with its address's slot (when the
/// source says where it comes from).
type Taken<A> = (A, Option<OriginSlot>);

/// A handshake in progress from one address, counted while it lives.
struct OriginSlot {
    slots: OriginSlots,
    origin: IpAddr,
}

impl Drop for OriginSlot {
    fn drop(&mut self) {
        let mut running = self.slots.lock();
        if let Some(n) = running.get_mut(&self.origin) {
            *n -= 1;
            if *n == 0 {
                running.remove(&self.origin);
            }
        }
    }
}

impl<T: Send + 'static> HandshakeListener<TcpListener, T> {
    /// Over `tcp`, which it makes non-blocking; an attempt waits for its
    /// address's turn up to `patience` (see [`HandshakeListener::new`]).
    pub(crate) fn tcp(tcp: TcpListener, patience: Duration) -> io::Result<Self> {
        tcp.set_nonblocking(true)?;
        HandshakeListener::new(tcp, patience)
    }

    pub(crate) fn local_addr(&self) -> io::Result<SocketAddr> {
        self.source.local_addr()
    }
}

impl<T: Send + 'static> HandshakeListener<CmListener, T> {
    /// Over rdma_cm's `listener`; an attempt waits for its address's turn
    /// up to `patience` (see [`HandshakeListener::new`]).
    pub(crate) fn cm(listener: CmListener, patience: Duration) -> Result<Self, Error> {
        HandshakeListener::new(listener, patience).map_err(|source| Error::Verbs {
            verb: "socketpair (an accept's wake-up)",
            source,
        })
    }
}

impl<S: Incoming, T: Send + 'static> HandshakeListener<S, T> {
    /// Over `source`, whose `try_next` must not block. An attempt that
    /// waits for its address's turn longer than `patience` (the connect
    /// timeout: its peer has given up by then) is dropped unhandshaken.
    pub(crate) fn new(source: S, patience: Duration) -> io::Result<Self> {
        let (finish, finished) = mpsc::channel();
        let (woken, wake) = UnixStream::pair()?;
        woken.set_nonblocking(true)?;
        wake.set_nonblocking(true)?;
        Ok(HandshakeListener {
            source,
            finished: Mutex::new(finished),
            finish,
            slots: HandshakeSlots::default(),
            origins: OriginSlots::default(),
            waiting: Mutex::new(VecDeque::new()),
            patience,
            waker: AcceptWaker(Arc::new(WakePair { woken, wake })),
            #[cfg(test)]
            idle_waits: AtomicUsize::new(0),
        })
    }

    /// Wakes an idle accept, for one that changed what its `stop` says.
    pub(crate) fn waker(&self) -> AcceptWaker {
        self.waker.clone()
    }

    /// Whether the source will give no more attempts (see
    /// [`Incoming::ended`]).
    pub(crate) fn ended(&self) -> bool {
        self.source.ended()
    }

    /// Waits for the next handshake to finish, starting `handshake` on a
    /// thread of its own for each connection attempt that comes meanwhile.
    /// An error of the source itself (out of descriptors, say) is returned
    /// as is; an attempt that cannot get a thread is dropped (closed or
    /// rejected), a failure of that peer alone.
    pub(crate) fn accept<F>(&self, handshake: F) -> Result<T, S::Error>
    where
        F: Fn(S::Attempt) -> T + Clone + Send + 'static,
    {
        loop {
            if let Some(done) = self.accept_until(handshake.clone(), || false, None)? {
                return Ok(done);
            }
        }
    }

    /// Like [`accept`](Self::accept), giving up with `None` once `stop`
    /// says so (asked whenever something wakes the accept, and every
    /// [`ACCEPT_TICK`]: wake it with [`waker`](Self::waker) when what
    /// `stop` says changes) or `deadline` passes; handshakes in progress
    /// go on, and what they return is handed out by later calls.
    pub(crate) fn accept_until<F>(
        &self,
        handshake: F,
        stop: impl Fn() -> bool,
        deadline: Option<Deadline>,
    ) -> Result<Option<T>, S::Error>
    where
        F: Fn(S::Attempt) -> T + Clone + Send + 'static,
    {
        let finished = self.finished.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Ok(done) = finished.try_recv() {
                return Ok(Some(done));
            }
            // Asked before each attempt is taken: one taken after the stop
            // would be handshaken for nobody.
            if stop() || deadline.is_some_and(|d| d.expired()) {
                return Ok(None);
            }
            // Beyond the slots, attempts wait in the source's backlog:
            // the source is watched only while a slot is free.
            let mut watched = vec![self.waker.0.woken.as_raw_fd()];
            if let Some(slot) = self.slots.take() {
                if let Some((attempt, origin)) = self.next_attempt()? {
                    self.start(attempt, handshake.clone(), (slot, origin));
                    continue;
                }
                watched.push(self.source.readiness());
            }
            self.idle_wait(&watched, deadline);
        }
    }

    /// Sleeps until one of `watched` is readable, up to the first of
    /// `deadline`, [`ACCEPT_TICK`] and the moment the oldest parked
    /// attempt goes stale (those stale already are dropped first, slots
    /// free or not, so that one cannot cut every sleep to nothing); then
    /// takes the wake-ups that came.
    fn idle_wait(&self, watched: &[RawFd], deadline: Option<Deadline>) {
        #[cfg(test)]
        self.idle_waits.fetch_add(1, Ordering::Relaxed);
        let mut up_to = ACCEPT_TICK;
        if let Some(deadline) = deadline {
            up_to = up_to.min(deadline.remaining());
        }
        let mut waiting = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
        drop_stale(&mut waiting, self.patience);
        if let Some(oldest) = waiting.front() {
            up_to = up_to.min(self.patience.saturating_sub(oldest.since.elapsed()));
        }
        drop(waiting);
        if wait_readable(watched, up_to).is_err() {
            // poll itself failed (out of memory, say): pace the looks
            // instead, as a plain tick would.
            std::thread::sleep(FALLBACK_TICK.min(up_to));
        }
        let mut taken = [0u8; 64];
        while matches!((&self.waker.0.woken).read(&mut taken), Ok(n) if n > 0) {}
    }

    /// The next attempt whose address has a handshake slot free, with
    /// that slot: the oldest waiting for its address's turn first, else a
    /// new one. New attempts from an address whose slots are all taken
    /// wait ([`park`]).
    fn next_attempt(&self) -> Result<Option<Taken<S::Attempt>>, S::Error> {
        let mut waiting = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
        drop_stale(&mut waiting, self.patience);
        for i in 0..waiting.len() {
            if let Some(slot) = self.origins.take(waiting[i].origin) {
                let parked = waiting.remove(i).expect("in range");
                return Ok(Some((parked.attempt, Some(slot))));
            }
        }
        // Bounded: attempts that keep coming from an address with no room
        // must not keep this call from handing out finished handshakes.
        for _ in 0..MAX_WAITING + MAX_HANDSHAKES {
            let Some(attempt) = self.source.try_next()? else {
                return Ok(None);
            };
            let Some(origin) = S::origin(&attempt).map(address_group) else {
                return Ok(Some((attempt, None)));
            };
            if let Some(slot) = self.origins.take(origin) {
                return Ok(Some((attempt, Some(slot))));
            }
            park(&mut waiting, attempt, origin);
        }
        Ok(None)
    }

    /// Runs `handshake` on a thread of its own. Without a thread (the
    /// system out of them), the attempt is dropped, which closes or
    /// rejects it: that peer's failure alone.
    fn start<F>(&self, attempt: S::Attempt, handshake: F, slot: (HandshakeSlot, Option<OriginSlot>))
    where
        F: FnOnce(S::Attempt) -> T + Send + 'static,
    {
        let finish = self.finish.clone();
        let wake = WakeOnDrop(self.waker.clone());
        let _ = std::thread::Builder::new()
            .name("rdma-ring-handshake".into())
            .spawn(move || {
                // However the handshake ends (a panic included), its slot
                // is free, then the accept is woken to use it.
                let _wake = wake;
                let _slot = slot;
                // A listener dropped meanwhile drops what it would have
                // handed out.
                let _ = finish.send(handshake(attempt));
            });
    }
}

impl<S: Incoming + std::fmt::Debug, T> std::fmt::Debug for HandshakeListener<S, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let waiting = self.waiting.lock().map_or(0, |w| w.len());
        f.debug_struct("HandshakeListener")
            .field("source", &self.source)
            .field("running", &self.slots.running())
            .field("waiting", &waiting)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::time::Instant;

    /// A listener on this host, whose waiting attempts never go stale
    /// within a test.
    fn listen<T: Send + 'static>() -> HandshakeListener<TcpListener, T> {
        let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
        HandshakeListener::tcp(tcp, Duration::from_secs(600)).unwrap()
    }

    /// A peer that connects and says nothing holds up no peer behind it:
    /// the handshake of the one that speaks finishes first and comes out.
    #[test]
    fn a_silent_peer_holds_up_nobody_behind_it() {
        let listener = listen();
        let addr = listener.local_addr().unwrap();
        let _silent = TcpStream::connect(addr).unwrap();
        let mut speaking = TcpStream::connect(addr).unwrap();
        speaking.write_all(b"hi").unwrap();
        let handshake = |(mut socket, _peer): (TcpStream, SocketAddr)| {
            socket
                .set_read_timeout(Some(Duration::from_secs(5)))
                .unwrap();
            let mut word = [0u8; 2];
            socket.read_exact(&mut word).map(|()| word)
        };
        let started = Instant::now();
        let first = listener.accept(handshake).unwrap();
        assert_eq!(first.unwrap(), *b"hi");
        assert!(
            started.elapsed() < Duration::from_secs(4),
            "{:?}",
            started.elapsed()
        );
        // The silent one times out in its own thread, and comes out next.
        let second = listener.accept(handshake).unwrap();
        assert_eq!(second.unwrap_err().kind(), io::ErrorKind::WouldBlock);
    }

    /// An idle accept sleeps until something happens, not on a short
    /// tick: it wakes for a new connection, and at once when a handshake
    /// finishes.
    #[test]
    fn an_idle_accept_sleeps_until_a_connection_or_a_finished_handshake() {
        let listener = listen();
        let addr = listener.local_addr().unwrap();
        let peer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(600));
            let mut socket = TcpStream::connect(addr).unwrap();
            let connected = Instant::now();
            std::thread::sleep(Duration::from_millis(300));
            socket.write_all(b"hi").unwrap();
            (socket, connected)
        });
        let handshake = |(mut socket, _peer): (TcpStream, SocketAddr)| {
            let started = Instant::now();
            let mut word = [0u8; 2];
            let said = socket.read_exact(&mut word).map(|()| word);
            (said, started, Instant::now())
        };
        let (said, started, finished) = listener.accept(handshake).unwrap();
        let seen_after = finished.elapsed();
        assert_eq!(said.unwrap(), *b"hi");
        let (_socket, connected) = peer.join().unwrap();
        let waits = listener.idle_waits.load(Ordering::Relaxed);
        assert!(waits <= 4, "{waits} idle waits over about 0.9 s");
        // Within the tick, the accept would only take the connection, and
        // see the handshake's result, at its end.
        let taken_after = started.saturating_duration_since(connected);
        assert!(
            taken_after < Duration::from_millis(250),
            "the accept took the connection {taken_after:?} late"
        );
        assert!(
            seen_after < Duration::from_millis(250),
            "the accept saw the finished handshake {seen_after:?} late"
        );
    }

    /// A new connection's own network error, which Linux hands to
    /// `accept`, fails that peer alone; the listener's own troubles (out
    /// of descriptors) are the listener's.
    #[test]
    fn one_peer_s_network_error_is_not_the_listener_s() {
        for errno in [
            libc::ENETDOWN,
            libc::EPROTO,
            libc::EHOSTUNREACH,
            libc::ENETUNREACH,
        ] {
            assert!(one_peer_s_failure(&io::Error::from_raw_os_error(errno)));
        }
        assert!(one_peer_s_failure(&io::ErrorKind::ConnectionAborted.into()));
        for errno in [libc::EMFILE, libc::ENFILE, libc::ENOBUFS, libc::EINVAL] {
            assert!(!one_peer_s_failure(&io::Error::from_raw_os_error(errno)));
        }
    }

    /// Told to stop, an accept gives up; the handshake it started goes on,
    /// and what it returns comes out of the next accept.
    #[test]
    fn a_stopped_accept_leaves_its_handshakes_to_the_next() {
        let listener = listen();
        let mut peer = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let handshake = |(mut socket, _peer): (TcpStream, SocketAddr)| {
            let mut word = [0u8; 2];
            socket.read_exact(&mut word).map(|()| word)
        };
        // Stopped at the second look, after the first took the peer (the
        // connection may reach the listener's queue a moment after
        // `connect` returns: again until one took it).
        for _ in 0..100 {
            let looked = std::cell::Cell::new(0);
            let stopped = listener
                .accept_until(
                    handshake,
                    || {
                        looked.set(looked.get() + 1);
                        looked.get() > 1
                    },
                    None,
                )
                .unwrap();
            assert!(stopped.is_none(), "nothing has finished yet");
            if listener.slots.running() == 1 {
                break;
            }
        }
        assert_eq!(listener.slots.running(), 1, "the peer's handshake goes on");
        peer.write_all(b"hi").unwrap();
        assert_eq!(listener.accept(handshake).unwrap().unwrap(), *b"hi");
    }

    /// An accept whose deadline passes gives up, whatever `stop` says,
    /// and sleeps until then: it does not spin on a spent deadline.
    #[test]
    fn an_accept_gives_up_at_its_deadline() {
        let listener = listen();
        let handshake = |_: (TcpStream, SocketAddr)| ();
        let started = std::time::Instant::now();
        let deadline = Deadline::after(Duration::from_millis(200));
        // Asked on and on past the deadline, `stop` fails the test.
        let stop = || {
            let late = started.elapsed();
            assert!(late < Duration::from_secs(5), "still accepting {late:?} on");
            false
        };
        let gave_up = listener.accept_until(handshake, stop, Some(deadline));
        assert!(gave_up.unwrap().is_none());
        let took = started.elapsed();
        assert!(took >= Duration::from_millis(200), "{took:?}");
        assert!(
            listener.idle_waits.load(Ordering::Relaxed) <= 4,
            "{} idle waits",
            listener.idle_waits.load(Ordering::Relaxed)
        );
    }

    /// A socket connected to `addr` from `from` (any 127/8 address is this
    /// host, as far as the listener can tell a different one).
    fn connect_from(from: &str, addr: SocketAddr) -> TcpStream {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()
            .unwrap();
        runtime.block_on(async {
            let socket = tokio::net::TcpSocket::new_v4().unwrap();
            socket.bind(format!("{from}:0").parse().unwrap()).unwrap();
            let stream = socket.connect(addr).await.unwrap();
            stream.into_std().unwrap()
        })
    }

    /// One address whose peers connect and say nothing, more of them than
    /// the listener has handshake slots, holds at most eight handshakes;
    /// its further attempts wait, and a peer from another address is
    /// served at once. Each one waiting gets its turn.
    #[test]
    fn one_address_cannot_take_every_handshake() {
        let listener = listen();
        let addr = listener.local_addr().unwrap();
        let silent: Vec<TcpStream> = (0..70).map(|_| connect_from("127.0.0.3", addr)).collect();
        let mut speaking = connect_from("127.0.0.2", addr);
        speaking.write_all(b"hi").unwrap();
        let handshake = |(mut socket, peer): (TcpStream, SocketAddr)| {
            socket
                .set_read_timeout(Some(Duration::from_secs(5)))
                .unwrap();
            let mut word = [0u8; 2];
            (peer.ip(), socket.read_exact(&mut word).map(|()| word))
        };
        let started = Instant::now();
        let (from, said) = listener.accept(handshake).unwrap();
        assert!(
            started.elapsed() < Duration::from_secs(4),
            "{:?}",
            started.elapsed()
        );
        assert_eq!(from, "127.0.0.2".parse::<IpAddr>().unwrap());
        assert_eq!(said.unwrap(), *b"hi");
        // Every attempt was taken from the backlog (in order) before the
        // speaking one's.
        let stalling: IpAddr = "127.0.0.3".parse().unwrap();
        assert_eq!(
            listener.origins.running(stalling),
            MAX_HANDSHAKES_PER_ORIGIN
        );
        assert_eq!(
            listener.waiting.lock().unwrap().len(),
            70 - MAX_HANDSHAKES_PER_ORIGIN
        );
        // Once the silent peers leave, every handshake, those that waited
        // included, runs and fails on its own.
        drop(silent);
        for _ in 0..70 {
            let (from, said) = listener.accept(handshake).unwrap();
            assert_eq!(from, stalling);
            assert_eq!(said.unwrap_err().kind(), io::ErrorKind::UnexpectedEof);
        }
        assert!(listener.waiting.lock().unwrap().is_empty());
    }

    /// A full queue of waiting attempts drops the oldest of the address
    /// with the most, never leaving one address more than another's share.
    #[test]
    fn a_full_waiting_queue_drops_from_the_address_with_the_most() {
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let mut waiting = VecDeque::new();
        for i in 0..MAX_WAITING {
            park(&mut waiting, i, a);
        }
        // A new one of the crowding address is dropped.
        park(&mut waiting, 999, a);
        assert_eq!(waiting.len(), MAX_WAITING);
        assert!(waiting.iter().all(|parked| parked.attempt != 999));
        // Another address's take the crowding one's oldest places, until
        // both have half.
        for i in 0..MAX_WAITING {
            park(&mut waiting, 1000 + i, b);
        }
        let of = |o: IpAddr| waiting.iter().filter(|p| p.origin == o).count();
        assert_eq!((of(a), of(b)), (MAX_WAITING / 2, MAX_WAITING / 2));
        assert_eq!(
            waiting.iter().find(|p| p.origin == a).unwrap().attempt,
            MAX_WAITING / 2
        );
    }

    /// Attempts that waited for their address's turn longer than the
    /// listener's patience are dropped unhandshaken, their peers seeing
    /// the connection closed; those that come after are handshaken.
    #[test]
    fn attempts_that_waited_too_long_are_dropped() {
        // Long enough that the fresh attempt below, which may wait while
        // the silent peers' threads end, does not go stale itself.
        let patience = Duration::from_secs(1);
        let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
        let listener = HandshakeListener::tcp(tcp, patience).unwrap();
        let addr = listener.local_addr().unwrap();
        let from = "127.0.0.4";
        let started = Arc::new(AtomicUsize::new(0));
        let handshake = {
            let started = Arc::clone(&started);
            move |(mut socket, _peer): (TcpStream, SocketAddr)| {
                started.fetch_add(1, Ordering::SeqCst);
                socket
                    .set_read_timeout(Some(Duration::from_secs(5)))
                    .unwrap();
                let mut word = [0u8; 2];
                socket.read_exact(&mut word).map(|()| word)
            }
        };
        // Eight silent peers take the address's slots; four more wait.
        let silent: Vec<TcpStream> = (0..MAX_HANDSHAKES_PER_ORIGIN)
            .map(|_| connect_from(from, addr))
            .collect();
        let mut stale: Vec<TcpStream> = (0..4).map(|_| connect_from(from, addr)).collect();
        let settled = Instant::now() + Duration::from_secs(5);
        while listener.waiting.lock().unwrap().len() < stale.len() {
            assert!(Instant::now() < settled, "the attempts never waited");
            let stop = std::cell::Cell::new(false);
            let none = listener.accept_until(handshake.clone(), || stop.replace(true), None);
            assert!(none.unwrap().is_none());
        }
        std::thread::sleep(patience + Duration::from_millis(200));
        // A newer one, once the silent peers leave, is served; the stale
        // ones were dropped at the first look after their time ran out.
        let mut fresh = connect_from(from, addr);
        fresh.write_all(b"hi").unwrap();
        drop(silent);
        let mut said = Vec::new();
        for _ in 0..MAX_HANDSHAKES_PER_ORIGIN + 1 {
            said.push(listener.accept(handshake.clone()).unwrap().ok());
        }
        assert_eq!(said.iter().flatten().collect::<Vec<_>>(), [b"hi"]);
        // Closed at once, not after a handshake's 5 s: none ran for them.
        for socket in &mut stale {
            socket.set_nonblocking(false).unwrap();
            socket
                .set_read_timeout(Some(Duration::from_secs(2)))
                .unwrap();
            assert_eq!(socket.read(&mut [0u8; 1]).unwrap(), 0, "closed");
        }
        assert_eq!(
            started.load(Ordering::SeqCst),
            MAX_HANDSHAKES_PER_ORIGIN + 1
        );
        assert!(listener.waiting.lock().unwrap().is_empty());
    }

    /// IPv4 peers of a dual-stack listener count as IPv4; IPv6 addresses
    /// of one /64 count each on its own.
    #[test]
    fn addresses_count_on_their_own() {
        let group = |s: &str| address_group(s.parse().unwrap());
        assert_ne!(group("2001:db8::1"), group("2001:db8::2"));
        assert_eq!(group("::ffff:10.0.0.1"), group("10.0.0.1"));
        assert_ne!(group("10.0.0.1"), group("10.0.0.2"));
    }
}
