//! Connecting streams on real devices: over a TCP handshake
//! ([`RdmaListener`], [`RdmaStream::connect`]) or rdma_cm
//! ([`RdmaCmListener`], [`RdmaStream::connect_cm`]).

use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::blocking::to_io;
use super::{RdmaStream, StreamConfig};
use crate::backend::verbs::{VerbsDevice, VerbsPd, VerbsQp};
use crate::connect::accept::HandshakeListener;
use crate::connect::cm::{self, CmListener, CmQp, CmRequest};
use crate::connect::tcp;
use crate::deadline::Deadline;
use crate::error::Error;

/// The first RDMA device, for callers that name none.
fn first_device() -> io::Result<VerbsDevice> {
    VerbsDevice::open_first().map_err(to_io)?.ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            "no RDMA device on this machine (open one by name, or use the soft device)",
        )
    })
}

/// Accepts stream connections: a TCP listener for the handshake, and a
/// device on which each accepted stream gets a queue pair and buffers of
/// its own.
///
/// ```no_run
/// use std::io::{Read, Write};
/// use rdma_ring::stream::RdmaListener;
/// let listener = RdmaListener::bind("0.0.0.0:7480").unwrap();
/// for stream in listener.incoming() {
///     // A connection that failed its handshake (a port probe, a peer that
///     // sent garbage) is that peer's error: serve on.
///     let Ok(mut stream) = stream else { continue };
///     let mut buf = [0u8; 40];
///     let n = stream.read(&mut buf).unwrap();
///     stream.write_all(&buf[..n]).unwrap();
/// }
/// ```
#[derive(Debug)]
pub struct RdmaListener {
    tcp: HandshakeListener<TcpListener, io::Result<RdmaStream<VerbsQp>>>,
    dev: VerbsDevice,
    pd: VerbsPd,
    config: StreamConfig,
}

impl RdmaListener {
    /// Listens on `addr` (TCP, for the handshake) with the first RDMA device
    /// and the default config.
    pub fn bind(addr: impl ToSocketAddrs) -> io::Result<RdmaListener> {
        RdmaListener::bind_with(addr, &first_device()?, StreamConfig::default())
    }

    /// Listens on `addr` with device `dev` and `config`.
    pub fn bind_with(
        addr: impl ToSocketAddrs,
        dev: &VerbsDevice,
        config: StreamConfig,
    ) -> io::Result<RdmaListener> {
        config.check().map_err(to_io)?;
        Ok(RdmaListener {
            tcp: HandshakeListener::tcp(TcpListener::bind(addr)?, config.connect_timeout)?,
            dev: dev.clone(),
            pd: dev.alloc_pd().map_err(to_io)?,
            config,
        })
    }

    /// The TCP address it listens on.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.tcp.local_addr()
    }

    /// Waits for the next peer and connects a stream to it: a queue pair
    /// with its receives posted, the handshake, then the hellos (all of it
    /// within the config's `connect_timeout`). Handshakes run side by
    /// side, on threads of their own (64 at most; more peers wait in the
    /// TCP backlog), so a peer that stalls holds up nobody behind it while
    /// fewer than 64 stall at once. One address has 8 at most; its further peers wait their turn, accepted, so
    /// one address's stalling peers cannot take every slot. This returns
    /// the next one to finish. A peer that sends garbage, or
    /// stalls past the timeout, gets an error for the call that returns
    /// it; the listener goes on.
    pub fn accept(&self) -> io::Result<RdmaStream<VerbsQp>> {
        let (dev, pd, config) = (self.dev.clone(), self.pd.clone(), self.config);
        self.tcp.accept(move |(socket, peer)| {
            over_tcp(socket, &dev, &pd, config).map(|mut s| {
                s.peer_addr = Some(peer);
                s
            })
        })?
    }

    /// Accepted streams, one per call of `next`.
    pub fn incoming(&self) -> impl Iterator<Item = io::Result<RdmaStream<VerbsQp>>> + '_ {
        std::iter::repeat_with(|| self.accept())
    }
}

/// Connects a stream over `socket`, a TCP connection to the peer's side.
fn over_tcp(
    mut socket: TcpStream,
    dev: &VerbsDevice,
    pd: &VerbsPd,
    config: StreamConfig,
) -> io::Result<RdmaStream<VerbsQp>> {
    let local = socket.local_addr().ok();
    let peer = socket.peer_addr().ok();
    let qp = dev.create_qp(pd, config.qp_config()).map_err(to_io)?;
    let pending = RdmaStream::prepare(qp, pd, config).map_err(to_io)?;
    tcp::handshake_by(&mut socket, pending.qp(), pending.deadline()).map_err(to_io)?;
    let mut stream = pending.establish_in_time()?;
    stream.local_addr = local;
    stream.peer_addr = peer;
    Ok(stream)
}

impl RdmaStream<VerbsQp> {
    /// Connects to an [`RdmaListener`] at `addr` with the first RDMA device
    /// and the default config.
    pub fn connect(addr: impl ToSocketAddrs) -> io::Result<RdmaStream<VerbsQp>> {
        RdmaStream::connect_with(addr, &first_device()?, StreamConfig::default())
    }

    /// Connects to an [`RdmaListener`] at `addr` with device `dev`.
    pub fn connect_with(
        addr: impl ToSocketAddrs,
        dev: &VerbsDevice,
        config: StreamConfig,
    ) -> io::Result<RdmaStream<VerbsQp>> {
        config.check().map_err(to_io)?;
        let socket = tcp::dial(addr, config.connect_timeout).map_err(to_io)?;
        let pd = dev.alloc_pd().map_err(to_io)?;
        over_tcp(socket, dev, &pd, config)
    }
}

/// Accepts stream connections over rdma_cm: each request gets a queue pair
/// on the device it arrived on, with its receives posted before it is
/// accepted. Handshakes run side by side, on threads of their own (64 at
/// most; more requests wait in rdma_cm's backlog), so a peer that stalls
/// holds up nobody behind it while fewer than 64 stall at once; one
/// address has 8 at most (its further requests wait their turn).
///
/// ```no_run
/// use std::io::Read;
/// use rdma_ring::stream::{RdmaCmListener, StreamConfig};
/// let listener = RdmaCmListener::bind("10.99.0.1:7481".parse().unwrap(), StreamConfig::default()).unwrap();
/// let mut stream = listener.accept().unwrap();
/// let mut buf = Vec::new();
/// stream.read_to_end(&mut buf).unwrap();
/// ```
pub struct RdmaCmListener {
    cm: HandshakeListener<CmListener, io::Result<RdmaStream<CmQp>>>,
    addr: SocketAddr,
    /// The device of the last request and its protection domain: requests
    /// usually all arrive on one.
    device: Arc<Mutex<Option<(VerbsDevice, VerbsPd)>>>,
    config: StreamConfig,
}

impl std::fmt::Debug for RdmaCmListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdmaCmListener")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl RdmaCmListener {
    /// Listens on `addr`, an address of an RDMA device's interface.
    pub fn bind(addr: SocketAddr, config: StreamConfig) -> io::Result<RdmaCmListener> {
        config.check().map_err(to_io)?;
        Ok(RdmaCmListener {
            cm: HandshakeListener::cm(
                CmListener::bind(addr).map_err(to_io)?,
                config.connect_timeout,
            )
            .map_err(to_io)?,
            addr,
            device: Arc::default(),
            config,
        })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Whether the listener hears no more requests, ever: rdma_cm said its
    /// device was removed. After an error from an accept, this tells the
    /// listener's end (stop accepting) from one peer's failed handshake
    /// (accept again).
    ///
    /// ```no_run
    /// // Needs an RDMA device and rdma_cm, so it is compiled but not run here.
    /// use rdma_ring::stream::{RdmaCmListener, StreamConfig};
    /// let listener = RdmaCmListener::bind("10.99.0.1:7481".parse().unwrap(), StreamConfig::default()).unwrap();
    /// while !listener.ended() {
    ///     match listener.accept() {
    ///         Ok(stream) => drop(stream), // serve it
    ///         Err(e) => eprintln!("{e}"),
    ///     }
    /// }
    /// ```
    pub fn ended(&self) -> bool {
        self.cm.ended()
    }

    /// Waits (up to `timeout`) for the next handshake to finish: a stream
    /// connected, or the error of a peer whose handshake failed. A
    /// handshake still running when the wait ends goes on, and comes out
    /// of a later call. Once rdma_cm says the device was removed, every
    /// call fails at once: the listener hears no more requests.
    pub fn accept_timeout(&self, timeout: Duration) -> io::Result<RdmaStream<CmQp>> {
        let deadline = Deadline::after(timeout);
        let (device, config, addr) = (Arc::clone(&self.device), self.config, self.addr);
        let handshake = move |request: CmRequest| {
            let mut stream = cm_handshake(request, &device, config)?;
            stream.local_addr = Some(addr);
            Ok(stream)
        };
        match self
            .cm
            .accept_until(handshake, || deadline.expired(), Some(deadline))
            .map_err(to_io)?
        {
            Some(done) => done,
            None => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("no stream connected within {timeout:?}"),
            )),
        }
    }

    /// Like [`accept_timeout`](Self::accept_timeout), waiting as long as
    /// it takes: a peer whose handshake times out is dropped, and the wait
    /// goes on.
    pub fn accept(&self) -> io::Result<RdmaStream<CmQp>> {
        loop {
            match self.accept_timeout(Duration::from_secs(3600)) {
                Err(e) if e.kind() == io::ErrorKind::TimedOut => continue,
                other => return other,
            }
        }
    }
}

/// Connects a stream to `request`: a queue pair on the device it arrived
/// on (`device` caches the last one), its receives, the accept, the
/// hellos.
fn cm_handshake(
    request: CmRequest,
    device: &Mutex<Option<(VerbsDevice, VerbsPd)>>,
    config: StreamConfig,
) -> io::Result<RdmaStream<CmQp>> {
    let name = request.device_name().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            "the connection request names no RDMA device",
        )
    })?;
    let (dev, pd) = {
        let mut cached = device.lock().unwrap_or_else(|p| p.into_inner());
        match &*cached {
            Some((dev, pd)) if dev.name() == name && dev.port() == request.port() => {
                (dev.clone(), pd.clone())
            }
            _ => {
                let dev = request.open_device().map_err(to_io)?;
                let pd = dev.alloc_pd().map_err(to_io)?;
                *cached = Some((dev.clone(), pd.clone()));
                (dev, pd)
            }
        }
    };
    let qp = request
        .create_qp(&dev, &pd, config.qp_config())
        .map_err(to_io)?;
    let pending = RdmaStream::prepare(qp, &pd, config).map_err(to_io)?;
    pending
        .qp()
        .accept(b"", pending.deadline().remaining())
        .map_err(to_io)?;
    pending.establish_in_time()
}

impl RdmaStream<CmQp> {
    /// Connects to an [`RdmaCmListener`] at `addr` over rdma_cm, on the
    /// device the route leads through.
    pub fn connect_cm(addr: SocketAddr, config: StreamConfig) -> io::Result<RdmaStream<CmQp>> {
        config.check().map_err(to_io)?;
        let route = cm::resolve(addr, config.connect_timeout).map_err(to_io)?;
        let dev = route.open_device().map_err(|e| match e {
            // The route names no device: none to be found, as for a
            // request that names none.
            Error::Incompatible(_) => io::Error::new(io::ErrorKind::NotFound, e),
            e => to_io(e),
        })?;
        let pd = dev.alloc_pd().map_err(to_io)?;
        let qp = route
            .create_qp(&dev, &pd, config.qp_config())
            .map_err(to_io)?;
        let pending = RdmaStream::prepare(qp, &pd, config).map_err(to_io)?;
        pending
            .qp()
            .connect(b"", pending.deadline().remaining())
            .map_err(to_io)?;
        let mut stream = pending.establish_in_time()?;
        stream.peer_addr = Some(addr);
        Ok(stream)
    }
}
