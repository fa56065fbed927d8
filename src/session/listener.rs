//! Sessions on real devices: [`SessionBuilder`] connects or listens over a
//! TCP handshake or rdma_cm; [`SessionListener`] accepts many peers onto
//! one host.

use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use super::host::{host_cq_entries, Reservation};
use super::wire::{Greeting, Hello, HELLO_LEN};
use super::{Session, SessionConfig, SessionError, SessionHost};
use crate::backend::verbs::{DeviceOptions, VerbsDevice, VerbsPd, VerbsQp};
use crate::backend::QueuePair;
use crate::buf::RemoteAccess;
use crate::connect::accept::HandshakeListener;
use crate::connect::cm::{self, CmListener, CmQp, CmRequest};
use crate::connect::tcp;
use crate::deadline::Deadline;
use crate::Error;

/// The device and protection domain of a verbs host.
struct VerbsFabric {
    dev: VerbsDevice,
    pd: VerbsPd,
}

/// Builds sessions on an RDMA device: which device, port and GID, and the
/// [`SessionConfig`]. Then `connect`, `listen` (one peer), `bind` (many),
/// or their rdma_cm forms.
///
/// ```no_run
/// use rdma_ring::session::SessionBuilder;
/// let session = SessionBuilder::default().device("rxe0").gid_index(1).connect("10.0.0.2:7471").unwrap();
/// ```
#[derive(Clone, Debug, Default)]
pub struct SessionBuilder {
    device: Option<String>,
    options: DeviceOptions,
    config: SessionConfig,
}

impl SessionBuilder {
    /// The device to use, by name (default: the first one). Over rdma_cm
    /// ([`connect_cm`](Self::connect_cm), [`bind_cm`](Self::bind_cm)),
    /// the device, port and GID are rdma_cm's choice, from the address.
    pub fn device(mut self, name: &str) -> Self {
        self.device = Some(name.to_owned());
        self
    }

    /// The port (default 1; over rdma_cm, rdma_cm's choice).
    pub fn port(mut self, port: u8) -> Self {
        self.options.port = port;
        self
    }

    /// The GID index (default: a RoCE v2 IPv4-mapped GID if there is one;
    /// over rdma_cm, rdma_cm's choice).
    pub fn gid_index(mut self, index: u8) -> Self {
        self.options.gid_index = Some(index);
        self
    }

    /// Every size, cap and time at once.
    pub fn config(mut self, config: SessionConfig) -> Self {
        self.config = config;
        self
    }

    /// Receives kept posted per session.
    pub fn recv_depth(mut self, depth: u16) -> Self {
        self.config.recv_depth = depth;
        self
    }

    /// Largest user message.
    pub fn max_message(mut self, bytes: u32) -> Self {
        self.config.max_message = bytes;
        self
    }

    /// Sessions a host (a listener's, say) holds at once; one more
    /// handshake is refused (see [`SessionConfig::max_sessions`]).
    pub fn max_sessions(mut self, sessions: u32) -> Self {
        self.config.max_sessions = sessions;
        self
    }

    /// How long a peer may hold a region of ours.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.config.lease = lease;
        self
    }

    /// Largest region a peer may ask for, and the rights it may ask for.
    pub fn remote_caps(mut self, max_region: u64, rights: RemoteAccess) -> Self {
        self.config.max_remote_region = max_region;
        self.config.max_remote_rights = rights;
        self
    }

    /// How long connecting and remote allocation requests may take.
    pub fn timeouts(mut self, connect: Duration, request: Duration) -> Self {
        self.config.connect_timeout = connect;
        self.config.request_timeout = request;
        self
    }

    fn open(&self) -> Result<VerbsDevice, Error> {
        match &self.device {
            Some(name) => VerbsDevice::open_with(name, self.options),
            None => {
                let names = crate::backend::verbs::device_names()?;
                let name = names.first().ok_or(Error::Incompatible(
                    "no RDMA device on this machine (name one, or use the soft device)",
                ))?;
                VerbsDevice::open_with(name, self.options)
            }
        }
    }

    /// A host on the device, for many sessions sharing one allocator,
    /// completion queue and driver.
    pub fn host(&self) -> Result<SessionHost<VerbsQp>, SessionError> {
        Ok(start_host::<VerbsQp>(&self.open()?, self.config)?)
    }

    /// Connects to the session listening at `addr` (TCP handshake).
    pub fn connect(&self, addr: impl ToSocketAddrs) -> Result<Session<VerbsQp>, SessionError> {
        self.host()?.connect(addr)
    }

    /// Waits for one peer at `addr` (TCP handshake) — async-rdma's
    /// `listen`. A connection whose peer fails the handshake (a port
    /// probe, a peer that sends garbage or an endpoint our device refuses
    /// to connect to, goes silent or leaves) is dropped, and it waits on
    /// for one that succeeds; a failure of our own (the listener's, or the
    /// device refusing a queue pair) is returned. For many peers,
    /// [`bind`](Self::bind).
    pub fn listen(&self, addr: impl ToSocketAddrs) -> Result<Session<VerbsQp>, SessionError> {
        let listener = self.bind(addr)?;
        loop {
            match listener.next_handshake()? {
                Err(e) if e.is_peer_failure() => continue,
                done => return done,
            }
        }
    }

    /// Listens at `addr` (TCP handshake) for many peers on one host.
    pub fn bind(&self, addr: impl ToSocketAddrs) -> Result<SessionListener<VerbsQp>, SessionError> {
        let failed = |e: std::io::Error| SessionError::Connect(e.to_string());
        let listener = TcpListener::bind(addr).map_err(failed)?;
        let listener =
            HandshakeListener::tcp(listener, self.config.connect_timeout).map_err(failed)?;
        Ok(SessionListener {
            host: self.host()?,
            kind: ListenerKind::Tcp(listener),
        })
    }

    /// Connects over rdma_cm to the session listening at `addr`, on the
    /// device that routes there.
    pub fn connect_cm(&self, addr: SocketAddr) -> Result<Session<CmQp>, SessionError> {
        let timeout = self.config.connect_timeout;
        let route = cm::resolve(addr, timeout)?;
        let dev = route.open_device()?;
        let host = start_host::<CmQp>(&dev, self.config)?;
        let reservation = host.reserve()?;
        let fabric = verbs_fabric(&host);
        let config = self.config.qp_config();
        let qp =
            host.create_qp(|cq| route.create_qp_on(&fabric.dev, &fabric.pd, cq, None, config))?;
        let prepared = host.prepare(reservation, qp)?;
        let hello = self.config.hello().encode();
        let connected = host.with_qp(&prepared, |qp| {
            qp.connect(&hello, timeout)
                .map_err(|e| match greeting_in_private_data(qp.peer_private_data()) {
                    // A full host rejects with its greeting: say so.
                    Ok(Greeting::HostFull { most }) => SessionError::HostFull {
                        most: most as usize,
                        peer: true,
                    },
                    _ => e.into(),
                })
                .map(|()| qp.peer_private_data().to_vec())
        });
        let connected = connected.and_then(|private| hello_in_private_data(&private));
        match connected {
            Ok(peer) => Ok(host.admit(prepared, peer, None)),
            Err(e) => {
                host.abandon(prepared);
                Err(e)
            }
        }
    }

    /// Listens over rdma_cm at `addr`, the address of one RDMA device's
    /// interface, for many peers on one host.
    pub fn bind_cm(&self, addr: SocketAddr) -> Result<SessionListener<CmQp>, SessionError> {
        let listener = CmListener::bind(addr)?;
        let dev = listener.open_device()?;
        Ok(SessionListener {
            host: start_host::<CmQp>(&dev, self.config)?,
            kind: ListenerKind::Cm(HandshakeListener::cm(
                listener,
                self.config.connect_timeout,
            )?),
        })
    }
}

fn start_host<Q>(dev: &VerbsDevice, config: SessionConfig) -> Result<SessionHost<Q>, Error>
where
    Q: QueuePair<Cq = crate::backend::verbs::VerbsCq> + Send + 'static,
{
    config.check()?;
    let pd = dev.alloc_pd()?;
    let cq = dev.create_cq(host_cq_entries(&config).min(dev.limits().max_cqe))?;
    let events = dev.async_events().ok();
    let fabric = VerbsFabric {
        dev: dev.clone(),
        pd: pd.clone(),
    };
    SessionHost::start(
        cq,
        Arc::new(pd),
        move |ring| {
            if let Some(events) = events {
                ring.watch_events(events);
            }
        },
        config,
        Box::new(fabric),
    )
}

fn verbs_fabric<Q: QueuePair + Send + 'static>(host: &SessionHost<Q>) -> &VerbsFabric {
    host.shared
        .fabric
        .downcast_ref::<VerbsFabric>()
        .expect("a verbs host")
}

/// The peer's greeting from rdma_cm private data, which the transport
/// may pad with zeros.
fn greeting_in_private_data(private: &[u8]) -> Result<Greeting, SessionError> {
    let bad = |why: String| SessionError::Protocol(format!("the peer's hello: {why}"));
    if private.len() < HELLO_LEN || private[HELLO_LEN..].iter().any(|&b| b != 0) {
        return Err(bad(format!("{} bytes of private data", private.len())));
    }
    Greeting::decode(&private[..HELLO_LEN]).map_err(|e| bad(e.to_string()))
}

/// The peer's hello from rdma_cm private data: in a request or an
/// acceptance, nothing else will do.
fn hello_in_private_data(private: &[u8]) -> Result<Hello, SessionError> {
    match greeting_in_private_data(private)? {
        Greeting::Hello(hello) => Ok(hello),
        Greeting::HostFull { .. } => Err(SessionError::Protocol(
            "the peer's hello: a full host's greeting where a hello belongs".into(),
        )),
    }
}

impl SessionHost<VerbsQp> {
    /// A host on `dev` (sessions over the TCP handshake).
    pub fn verbs(dev: &VerbsDevice, config: SessionConfig) -> Result<Self, Error> {
        start_host(dev, config)
    }

    /// Connects a new session on this host to the session listening at
    /// `addr` (TCP handshake).
    pub fn connect(&self, addr: impl ToSocketAddrs) -> Result<Session<VerbsQp>, SessionError> {
        let reservation = self.reserve()?;
        // One deadline for the dial and the handshake: the room reserved
        // is held no longer than the connect timeout.
        let deadline = Deadline::after(self.config().connect_timeout);
        let stream = tcp::dial(addr, deadline.remaining())?;
        self.handshake(stream, Some(reservation), deadline)
    }

    /// The session protocol over an open TCP stream: greetings, endpoints,
    /// connect, receives posted, ready. The connecting side holds its
    /// `reservation` and greets first; the accepting side (`None`) takes
    /// its room once the peer has greeted it, and answers with its hello,
    /// or that the host is full. Every step is done by `deadline`: a peer
    /// that answers each just in time cannot hold an accept's handshake
    /// for a timeout per step. The stream stays open for the session's
    /// life: its end tells either side that the other's process is gone.
    fn handshake(
        &self,
        mut stream: TcpStream,
        reservation: Option<Reservation<'_, VerbsQp>>,
        deadline: Deadline,
    ) -> Result<Session<VerbsQp>, SessionError> {
        let config = *self.config();
        // Greetings come first, so that a full host, or a peer that sends
        // garbage, costs the other side no queue pair; and a peer that
        // connects and says nothing holds none of the host's room.
        let (reservation, theirs) = match reservation {
            Some(reservation) => {
                send_greeting(&mut stream, Greeting::Hello(config.hello()))?;
                (reservation, read_greeting(&mut stream, deadline)?)
            }
            None => {
                let theirs = read_greeting(&mut stream, deadline)?;
                if let Greeting::HostFull { .. } = theirs {
                    // A connecting side holds its room before it dials.
                    return Err(SessionError::Protocol(
                        "the peer's hello: a full host's greeting from the connecting side".into(),
                    ));
                }
                let reservation = self.reserve();
                let ours = match &reservation {
                    Ok(_) => Greeting::Hello(config.hello()),
                    Err(_) => Greeting::HostFull {
                        most: self.max_sessions() as u32,
                    },
                };
                let sent = send_greeting(&mut stream, ours);
                (reservation?, sent.map(|()| theirs)?)
            }
        };
        let peer = match theirs {
            Greeting::Hello(peer) => peer,
            Greeting::HostFull { most } => {
                return Err(SessionError::HostFull {
                    most: most as usize,
                    peer: true,
                })
            }
        };
        let fabric = verbs_fabric(self);
        let qp = self.create_qp(|cq| {
            fabric
                .dev
                .create_qp_on(&fabric.pd, cq, None, config.qp_config())
        })?;
        let remote = tcp::exchange_by(&mut stream, &qp.endpoint(), deadline)?;
        // Connected before it joins the host's ring, out of the ring's
        // lock: moving to RTR may wait on the kernel (resolving the address
        // of the GID the peer named), and the host's other sessions go on
        // meanwhile. Its receives are posted before the ready byte goes,
        // and the peer sends nothing before that byte.
        qp.connect(&remote)?;
        let prepared = self.prepare(reservation, qp)?;
        match tcp::ready_by(&mut stream, deadline) {
            Ok(()) => Ok(self.admit(prepared, peer, Some(stream))),
            Err(e) => {
                self.abandon(prepared);
                Err(e.into())
            }
        }
    }
}

/// Sends our greeting. A fresh socket's 12 bytes fit its buffer: the
/// write does not wait.
fn send_greeting(stream: &mut TcpStream, ours: Greeting) -> Result<(), SessionError> {
    stream
        .write_all(&ours.encode())
        .map_err(|e| tcp::io_error("sending the session hello", e, 0, HELLO_LEN).into())
}

/// Reads the peer's greeting by `deadline`. Its error says whether the
/// peer went silent (`HandshakeTimeout`) or went away.
fn read_greeting(stream: &mut TcpStream, deadline: Deadline) -> Result<Greeting, SessionError> {
    let mut bytes = [0u8; HELLO_LEN];
    tcp::read_exact(
        stream,
        &mut bytes,
        deadline,
        "reading the peer's session hello",
    )?;
    Greeting::decode(&bytes).map_err(|e| SessionError::Protocol(format!("the peer's hello: {e}")))
}

enum ListenerKind {
    Tcp(HandshakeListener<TcpListener, Result<Session<VerbsQp>, SessionError>>),
    Cm(HandshakeListener<CmListener, Result<Session<CmQp>, SessionError>>),
}

/// Accepts peers onto one host: every session shares its allocator,
/// completion queue and driver.
pub struct SessionListener<Q: QueuePair + Send + 'static> {
    host: SessionHost<Q>,
    kind: ListenerKind,
}

impl<Q: QueuePair + Send + 'static> SessionListener<Q> {
    /// The host accepted sessions live on.
    pub fn host(&self) -> &SessionHost<Q> {
        &self.host
    }

    /// The address listened at.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        match &self.kind {
            ListenerKind::Tcp(l) => l.local_addr().ok(),
            ListenerKind::Cm(_) => None,
        }
    }

    /// Whether the listener hears no more peers, ever: over rdma_cm,
    /// rdma_cm said its device was removed (a TCP listener never ends so).
    /// After an error from an accept, this tells the listener's end (stop
    /// accepting; the host's sessions go on) from one peer's failed
    /// handshake (accept again).
    ///
    /// ```no_run
    /// // Needs an RDMA device and rdma_cm, so it is compiled but not run here.
    /// use rdma_ring::session::SessionBuilder;
    /// let listener = SessionBuilder::default().bind_cm("10.99.0.1:7490".parse().unwrap()).unwrap();
    /// while !listener.ended() {
    ///     match listener.accept() {
    ///         Ok(session) => drop(session), // serve it
    ///         Err(e) => eprintln!("{e}"),
    ///     }
    /// }
    /// ```
    pub fn ended(&self) -> bool {
        match &self.kind {
            ListenerKind::Tcp(_) => false,
            ListenerKind::Cm(l) => l.ended(),
        }
    }
}

impl<Q: QueuePair + Send + 'static> std::fmt::Debug for SessionListener<Q> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionListener")
            .field("local_addr", &self.local_addr())
            .field("host", &self.host)
            .finish()
    }
}

impl SessionListener<VerbsQp> {
    /// Waits for the next peer and connects a session to it. Handshakes
    /// run side by side, on threads of their own (64 at most; more peers
    /// wait in the TCP backlog), so a peer that stalls holds up nobody
    /// behind it while fewer than 64 stall at once. One address has 8 at
    /// most; its further peers wait their turn, accepted, so one address's
    /// stalling peers cannot take every slot (see the README for the
    /// bounds). This returns the next one to finish. A peer that fails its
    /// handshake is dropped with an error for the call that returns it;
    /// call again.
    pub fn accept(&self) -> Result<Session<VerbsQp>, SessionError> {
        self.next_handshake()?
    }

    /// The next handshake to finish, or the listener's own failure.
    fn next_handshake(&self) -> Result<Result<Session<VerbsQp>, SessionError>, SessionError> {
        let ListenerKind::Tcp(listener) = &self.kind else {
            unreachable!("a TCP listener")
        };
        let host = self.host.clone();
        listener
            .accept(move |(stream, _)| {
                let deadline = Deadline::after(host.config().connect_timeout);
                host.handshake(stream, None, deadline)
            })
            .map_err(|e| SessionError::Connect(e.to_string()))
    }
}

impl SessionListener<CmQp> {
    /// Waits for the next peer and accepts it into a session over
    /// rdma_cm. Handshakes run side by side, on threads of their own (64
    /// at most; more requests wait in rdma_cm's backlog), so a peer that
    /// stalls — one that never confirms, holding its handshake for the
    /// connect timeout — holds up nobody behind it while fewer than 64
    /// stall at once, and one address has 8 at most (its further requests
    /// wait their turn): this returns the next one to finish. A request
    /// without a valid hello is rejected, and a peer that fails its
    /// handshake comes out as an error for the call that returns it; call
    /// again. The host's other sessions go on meanwhile. Once rdma_cm says
    /// the device was removed, every call fails at once: the listener
    /// hears no more requests.
    pub fn accept(&self) -> Result<Session<CmQp>, SessionError> {
        let ListenerKind::Cm(listener) = &self.kind else {
            unreachable!("an rdma_cm listener")
        };
        let host = self.host.clone();
        listener
            .accept(move |request| accept_cm(&host, request))
            .map_err(SessionError::from)?
    }
}

/// The session handshake of one rdma_cm request, on a thread of its own.
fn accept_cm(host: &SessionHost<CmQp>, request: CmRequest) -> Result<Session<CmQp>, SessionError> {
    let config = *host.config();
    let peer = hello_in_private_data(request.private_data())?; // dropping rejects
    let reservation = match host.reserve() {
        Ok(reservation) => reservation,
        Err(e) => {
            let full = Greeting::HostFull {
                most: host.max_sessions() as u32,
            };
            // Twelve bytes: private data has room.
            let _ = request.reject_with(&full.encode());
            return Err(e);
        }
    };
    let fabric = verbs_fabric(host);
    let qp = host.create_qp(|cq| {
        request.create_qp_on(&fabric.dev, &fabric.pd, cq, None, config.qp_config())
    })?;
    let prepared = host.prepare(reservation, qp)?;
    let hello = config.hello().encode();
    // The host's ring is locked to answer and for each look at the
    // channel, not while the peer takes its time to confirm: the other
    // sessions' work goes on meanwhile.
    let accepted = host
        .with_qp(&prepared, |qp| qp.answer(&hello).map(|()| qp.event_fd()))
        .and_then(|fd| {
            cm::await_confirmation(fd, config.connect_timeout, || {
                host.with_qp(&prepared, CmQp::confirmed)
            })
        });
    match accepted {
        Ok(()) => Ok(host.admit(prepared, peer, None)),
        Err(e) => {
            host.abandon(prepared);
            Err(e.into())
        }
    }
}
