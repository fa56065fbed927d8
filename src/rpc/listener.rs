//! Serving and connecting on real devices: over a TCP handshake
//! ([`RpcServer::bind`], [`RpcClient::connect`]) or rdma_cm
//! ([`RpcServer::bind_cm`], [`RpcClient::connect_cm`]).

use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use super::client::PendingClient;
use super::server::{
    client_qp_config, server_cq_entries, server_qp_config, Acceptor, ServerShared,
};
use super::{RpcClient, RpcConfig, RpcError, RpcServer, Service};
use crate::backend::verbs::{VerbsDevice, VerbsPd, VerbsQp};
use crate::backend::QueuePair;
use crate::connect::accept::{HandshakeListener, Incoming};
use crate::connect::cm::{self, CmListener, CmQp, CmRequest};
use crate::connect::tcp;
use crate::deadline::Deadline;
use crate::error::Error;

/// How long the accept loop pauses after an error of the listener
/// itself (out of descriptors, say) before it tries again.
const LISTENER_ERROR_PAUSE: Duration = Duration::from_millis(20);

/// The device and protection domain of a verbs server.
struct VerbsFabric {
    dev: VerbsDevice,
    pd: VerbsPd,
}

fn first_device() -> Result<VerbsDevice, Error> {
    VerbsDevice::open_first()?.ok_or(Error::Incompatible(
        "no RDMA device on this machine (open one by name, or use the soft device)",
    ))
}

/// A server's queues on `dev`, and its poller.
fn start_on<Q>(
    dev: &VerbsDevice,
    service: Service,
    config: RpcConfig,
) -> Result<RpcServer<Q>, Error>
where
    Q: crate::backend::QueuePair<
            Cq = crate::backend::verbs::VerbsCq,
            Srq = crate::backend::verbs::VerbsSrq,
        > + Send
        + 'static,
{
    config.check()?;
    let pd = dev.alloc_pd()?;
    let cq = dev.create_cq(server_cq_entries(&config))?;
    let srq = dev.create_srq(&pd, config.srq_config())?;
    let fabric = VerbsFabric {
        dev: dev.clone(),
        pd: pd.clone(),
    };
    RpcServer::start(cq, srq, Arc::new(pd), service, config, Box::new(fabric))
}

impl RpcServer<VerbsQp> {
    /// Serves clients that connect over a TCP handshake to `addr`, on the
    /// first RDMA device.
    ///
    /// ```no_run
    /// use rdma_ring::rpc::{Caller, HandlerError, RpcConfig, RpcServer, Service};
    /// let echo = |_: &Caller, req: &[u8], resp: &mut Vec<u8>| -> Result<(), HandlerError> {
    ///     resp.extend_from_slice(req);
    ///     Ok(())
    /// };
    /// let server = RpcServer::bind("0.0.0.0:7490", Service::handler(echo), RpcConfig::default()).unwrap();
    /// # server.shutdown().unwrap();
    /// ```
    pub fn bind(
        addr: impl ToSocketAddrs,
        service: Service,
        config: RpcConfig,
    ) -> Result<Self, Error> {
        RpcServer::bind_with(addr, &first_device()?, service, config)
    }

    /// Like [`bind`](Self::bind), on device `dev`.
    pub fn bind_with(
        addr: impl ToSocketAddrs,
        dev: &VerbsDevice,
        service: Service,
        config: RpcConfig,
    ) -> Result<Self, Error> {
        let failed = |e: std::io::Error| Error::Handshake {
            step: "listening over TCP",
            reason: e.to_string(),
        };
        let listener = TcpListener::bind(addr)
            .and_then(|tcp| HandshakeListener::tcp(tcp, config.connect_timeout))
            .map_err(failed)?;
        let local = listener.local_addr().map_err(failed)?;
        let mut server = start_on::<VerbsQp>(dev, service, config)?;
        server.local_addr = Some(local);
        spawn_acceptor(&server, listener, |(socket, peer), shared| {
            if handshake_tcp(socket, peer, shared).is_err() {
                shared.handshake_failed();
            }
        })?;
        Ok(server)
    }
}

/// Starts the thread that runs [`accept_all`] for `server`, which wakes
/// it when it stops.
fn spawn_acceptor<S, Q>(
    server: &RpcServer<Q>,
    listener: HandshakeListener<S, ()>,
    handshake: fn(S::Attempt, &ServerShared<Q>),
) -> Result<(), Error>
where
    S: Incoming + Send + 'static,
    Q: QueuePair + Send + 'static,
{
    let shared = Arc::clone(&server.shared);
    let waker = listener.waker();
    let thread = std::thread::Builder::new()
        .name("rdma-ring-rpc-accept".into())
        .spawn(move || accept_all(&listener, &shared, handshake))
        .map_err(|_| Error::Soft("could not spawn the accept thread"))?;
    *server.acceptor.lock().unwrap_or_else(|p| p.into_inner()) = Some(Acceptor {
        thread,
        wake: Box::new(move || waker.wake()),
    });
    Ok(())
}

/// Takes connection attempts until the server stops; each handshake runs
/// on a thread of its own (64 at most, more wait in the backlog), so a
/// slow peer delays nobody while fewer than 64 stall at once. One
/// address has 8 at most (its further peers wait their turn, accepted),
/// so one address's stalling peers cannot take every slot. A failed
/// handshake concerns that peer only.
fn accept_all<S: Incoming, Q: QueuePair + Send + 'static>(
    listener: &HandshakeListener<S, ()>,
    shared: &Arc<ServerShared<Q>>,
    handshake: fn(S::Attempt, &ServerShared<Q>),
) {
    while !shared.stopping() {
        let server = Arc::clone(shared);
        let accepted = listener.accept_until(
            move |attempt| handshake(attempt, &server),
            || shared.stopping(),
            None,
        );
        if accepted.is_err() {
            // A listener whose device went away hears nothing more; the
            // server serves on the clients it has.
            if listener.ended() {
                return;
            }
            std::thread::sleep(LISTENER_ERROR_PAUSE);
        }
    }
}

fn handshake_tcp(
    mut socket: TcpStream,
    peer: SocketAddr,
    shared: &ServerShared<VerbsQp>,
) -> Result<(), Error> {
    // One deadline for the whole handshake: the slot it holds is back in
    // the connect timeout, however the peer paces its steps.
    let deadline = Deadline::after(shared.config.connect_timeout);
    let fabric = shared
        .fabric
        .downcast_ref::<VerbsFabric>()
        .expect("a verbs server");
    let qp = shared.make_qp(|cq, srq| {
        fabric
            .dev
            .create_qp_on(&fabric.pd, cq, Some(srq), server_qp_config(&shared.config))
    })?;
    tcp::connect_by(&mut socket, &qp.endpoint(), deadline, |remote| {
        // A server stopping says so before the ready byte, by closing the
        // connection: the client need not wait for a hello that would
        // never come.
        if shared.stopping() {
            return Err(Error::Handshake {
                step: "connecting the queue pair",
                reason: "the server is stopping".into(),
            });
        }
        qp.connect(remote)
    })?;
    // The client keeps its end open while connected: its end of file
    // tells the poller the client is gone.
    shared.admit(qp, Some(peer), Some(socket));
    Ok(())
}

impl RpcServer<CmQp> {
    /// Serves clients that connect over rdma_cm to `addr`, an address of
    /// an RDMA device's interface (the server's queues live on that
    /// device; requests arriving on another are rejected).
    pub fn bind_cm(addr: SocketAddr, service: Service, config: RpcConfig) -> Result<Self, Error> {
        let listener = CmListener::bind(addr)?;
        let dev = listener.open_device()?;
        let listener = HandshakeListener::cm(listener, config.connect_timeout)?;
        let mut server = start_on::<CmQp>(&dev, service, config)?;
        server.local_addr = Some(addr);
        spawn_acceptor(&server, listener, handshake_cm)?;
        Ok(server)
    }
}

/// Accepts an rdma_cm request: its queue pair on the server's queues,
/// then the accept (rdma_cm tells the ring when the peer disconnects).
fn handshake_cm(request: CmRequest, shared: &ServerShared<CmQp>) {
    let fabric = shared
        .fabric
        .downcast_ref::<VerbsFabric>()
        .expect("a verbs server");
    let made = shared.make_qp(|cq, srq| {
        request.create_qp_on(
            &fabric.dev,
            &fabric.pd,
            cq,
            Some(srq),
            server_qp_config(&shared.config),
        )
    });
    match made {
        Ok(qp) if qp.accept(b"", shared.config.connect_timeout).is_ok() => {
            shared.admit(qp, None, None);
        }
        _ => shared.handshake_failed(),
    }
}

fn connect_failed(e: Error) -> RpcError {
    RpcError::Connect(e.to_string())
}

impl RpcClient<VerbsQp> {
    /// Connects to an [`RpcServer::bind`] server at `addr` with the first
    /// RDMA device.
    ///
    /// ```no_run
    /// use rdma_ring::rpc::{RpcClient, RpcConfig};
    /// let client = RpcClient::connect("10.0.0.1:7490", RpcConfig::default()).unwrap();
    /// let answer = client.call(b"hello").unwrap();
    /// ```
    pub fn connect(addr: impl ToSocketAddrs, config: RpcConfig) -> Result<Self, RpcError> {
        let dev = first_device().map_err(connect_failed)?;
        RpcClient::connect_with(addr, &dev, config)
    }

    /// Like [`connect`](Self::connect), on device `dev`.
    pub fn connect_with(
        addr: impl ToSocketAddrs,
        dev: &VerbsDevice,
        config: RpcConfig,
    ) -> Result<Self, RpcError> {
        let mut socket = tcp::dial(addr, config.connect_timeout).map_err(connect_failed)?;
        let pd = dev.alloc_pd().map_err(connect_failed)?;
        let qp = dev
            .create_qp(&pd, client_qp_config(&config))
            .map_err(connect_failed)?;
        let pending = PendingClient::new(qp, Arc::new(pd), config).map_err(connect_failed)?;
        tcp::handshake_by(&mut socket, pending.qp(), pending.deadline()).map_err(connect_failed)?;
        // Kept open while connected: the server watches it for the end.
        pending.keep(socket).establish()
    }
}

impl RpcClient<CmQp> {
    /// Connects to an [`RpcServer::bind_cm`] server at `addr` over
    /// rdma_cm, on the device the route leads through.
    pub fn connect_cm(addr: SocketAddr, config: RpcConfig) -> Result<Self, RpcError> {
        let route = cm::resolve(addr, config.connect_timeout).map_err(connect_failed)?;
        let dev = route.open_device().map_err(connect_failed)?;
        let pd = dev.alloc_pd().map_err(connect_failed)?;
        let qp = route
            .create_qp(&dev, &pd, client_qp_config(&config))
            .map_err(connect_failed)?;
        let pending = PendingClient::new(qp, Arc::new(pd), config).map_err(connect_failed)?;
        pending
            .qp()
            .connect(b"", pending.deadline().remaining())
            .map_err(connect_failed)?;
        pending.establish()
    }
}
