//! Remote procedure calls over the ring: an [`RpcServer`] whose one
//! poller thread serves every client over one completion queue and one
//! shared receive queue, and an [`RpcClient`] with blocking and awaitable
//! calls, many in flight at once.
//!
//! ```
//! use rdma_ring::backend::soft::SoftDevice;
//! use rdma_ring::rpc::{Caller, HandlerError, RpcConfig, RpcServer, Service};
//!
//! let dev = SoftDevice::new();
//! let echo = |_: &Caller, req: &[u8], resp: &mut Vec<u8>| -> Result<(), HandlerError> {
//!     resp.extend_from_slice(req);
//!     Ok(())
//! };
//! let server = RpcServer::soft(&dev, Service::handler(echo), RpcConfig::default()).unwrap();
//! let client = server.connect_soft().unwrap();
//! assert_eq!(client.call(b"ping").unwrap(), b"ping");
//! // Large messages go by rendezvous, transparently.
//! let big = vec![7u8; 1 << 20];
//! assert_eq!(client.call(&big).unwrap(), big);
//! server.shutdown().unwrap();
//! ```
//!
//! # Design
//!
//! * **One poller.** The server's thread owns a ring with one completion
//!   queue and one shared receive queue, topped up from a buffer pool;
//!   every connection's queue pair is attached to it, and each completion
//!   names its connection. Responses made in one pass go out with one
//!   doorbell per connection.
//! * **Credits.** The server's hello grants each client a window of
//!   unanswered messages; the shared receive queue holds a window for
//!   every client it admits (`max_clients` × `window`), and a buffer goes
//!   back as soon as its request was handled, so clients keeping to their
//!   windows never meet an empty queue (no RNR). A client that sends more
//!   is flooding: it is cut off as soon as the poller sees the excess.
//!   The excess has taken shared receive buffers by then (a queue pair
//!   can post its whole send queue in one doorbell), so until the poller
//!   refills the queue, the other clients' messages may meet
//!   receiver-not-ready, which their NICs retry (`rnr_retry`). The client posts a receive for every answer its
//!   window allows, plus two for the server's unsolicited messages (which
//!   the server sends only once the client has spoken, so after its
//!   receives are posted).
//! * **Messages of any size.** A message that fits a receive buffer
//!   (`buffer_size`, header included) is one SEND. A larger one goes by
//!   rendezvous: its owner exposes it read-only and SENDs its descriptor;
//!   the peer RDMA-READs it. A large request's buffer is released by its
//!   response; a large response's by the client's release message, or by
//!   the server after `release_timeout`. The server reads large requests
//!   into memory it registers for them, at most `max_reading` bytes at
//!   once over all clients; the rest wait, each client's in its order and
//!   the clients taking turns, so one client's backlog of large requests
//!   does not hold the others up for all of its length.
//! * **Faults.** A malformed message or a lying descriptor ends that
//!   connection only (with an error message to the client first, where
//!   one can go); a handler's panic fails that call only. A client that
//!   dies is detached when a send to it fails, when rdma_cm reports its
//!   departure, or, over the TCP handshake, when its end of the
//!   handshake's socket (kept open for the connection's life) closes;
//!   its unreleased buffers and pending handler futures go with it. The
//!   client watches the same socket for the server. A client may hold at
//!   most twice its window of unreleased large responses (past that, a
//!   call is answered `Busy`); ours keeps to it, holding a call back
//!   while its unanswered messages and the large responses it has not
//!   released yet come to that. The wire format
//!   is in [`wire`]: versioned, strictly decoded, fuzzed.
//! * **Shutdown.** The server says goodbye to every client that has
//!   spoken; each answers with a close once its calls are answered, and
//!   the server stops when all have gone — or, after `release_timeout`,
//!   answers the calls its handler futures still hold with
//!   `ShuttingDown` and lets the rest go.

mod client;
mod client_core;
mod handler;
#[cfg(feature = "verbs")]
mod listener;
mod server;
mod server_core;
mod tasks;
mod timer;
mod waiting_reads;
mod waking;
pub mod wire;

use std::fmt;
use std::time::Duration;

pub use client::{CallFuture, RpcClient};
pub use handler::{AsyncHandler, Caller, Handler, HandlerError, ResponseFuture};
pub use server::{RpcServer, ServerStats, Service};

use crate::future::Wakeup;
use crate::Error;

/// Sizes and times of RPC connections. The server's values of `window`,
/// `buffer_size` and `max_message` are the ones in force: it announces
/// them in its hello.
///
/// ```
/// use rdma_ring::rpc::RpcConfig;
/// let config = RpcConfig { window: 32, ..RpcConfig::default() };
/// assert_eq!(config.buffer_size, 4096 + 24); // 4 KiB of payload inline
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RpcConfig {
    /// Unanswered messages a client may have in flight (server side).
    pub window: u16,
    /// Bytes of each receive buffer on both sides: messages up to this
    /// size, header included, travel inline (server side). The default
    /// carries 4 KiB of payload inline.
    pub buffer_size: u32,
    /// The longest request or response (server side); a client also
    /// refuses responses longer than its own value.
    pub max_message: u32,
    /// Bytes of large requests (those that go by rendezvous) the server
    /// reads at once, over all clients (server side): memory registered
    /// for each until it is read and handed to the handler. A request
    /// that would go past it waits until earlier ones are handed over:
    /// each client's in its arrival order, the clients taking turns (one
    /// request each), and nothing overtakes the request whose turn it is
    /// (a small one waits behind a large one); one request alone is
    /// always read. Requests waiting when a shutdown begins
    /// are read and answered through it. Without the bound, every client
    /// could make the server register a window of `max_message`-sized
    /// requests.
    pub max_reading: u64,
    /// Bytes of large responses (those that go by rendezvous) the server
    /// keeps exposed for their clients to read, over all clients (server
    /// side): memory registered for each until its client releases it or
    /// `release_timeout` ends. A response that would go past it is
    /// dropped, and its call answered [`RpcError::Busy`] (one alone always
    /// goes); one client may take all of it. Each client
    /// holds two windows of them at most besides; without this bound,
    /// every client could make the server keep that many
    /// `max_message`-sized responses registered.
    pub max_exposed: u64,
    /// Connections open at once (server side), closing ones included:
    /// the shared receive queue holds `max_clients` × `window` buffers;
    /// later clients are refused with [`RpcError::Busy`].
    pub max_clients: u32,
    /// How long the server keeps a large response the client has not
    /// released (server side).
    pub release_timeout: Duration,
    /// How long connecting may take, handshake and hellos together; not
    /// zero. Opening the TCP connection, or resolving the rdma_cm route,
    /// comes before and has a timeout of its own of this length.
    pub connect_timeout: Duration,
    /// How long a call may take before it fails with
    /// [`RpcError::Timeout`] (client side).
    pub call_timeout: Duration,
    /// Empty polls a blocking call (or the server's poller) makes before
    /// it sleeps.
    pub spin_polls: usize,
    /// What wakes a client's awaiting tasks (client side); see [`Wakeup`].
    pub wakeup: Wakeup,
}

impl Default for RpcConfig {
    fn default() -> Self {
        RpcConfig {
            window: 16,
            buffer_size: 4096 + wire::HEADER_LEN as u32,
            max_message: 64 << 20,
            max_reading: 256 << 20,
            max_exposed: 1 << 30,
            max_clients: 64,
            release_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(10),
            call_timeout: Duration::from_secs(30),
            spin_polls: 2000,
            wakeup: Wakeup::Thread,
        }
    }
}

impl RpcConfig {
    /// Refuses sizes the wire cannot carry or a device cannot hold.
    pub(crate) fn check(&self) -> Result<(), Error> {
        // Every buffer must hold an error message with its longest text.
        let min_buffer = (wire::HEADER_LEN + wire::MAX_ERROR_TEXT) as u32;
        let ok = (1..=wire::MAX_WINDOW).contains(&self.window)
            && (min_buffer..=wire::MAX_BUFFER).contains(&self.buffer_size)
            && self.max_message > 0
            && (1..=4096).contains(&self.max_clients)
            && u64::from(self.max_clients) * u64::from(self.window) <= 16384
            && !self.connect_timeout.is_zero();
        if ok {
            Ok(())
        } else {
            Err(Error::Incompatible(
                "rpc config out of range: window 1 to 1024, buffer_size 280 B to 1 MiB, \
                 max_message at least 1, max_clients 1 to 4096, max_clients × window at most 16384, \
                 connect_timeout above zero",
            ))
        }
    }

    /// Refuses what a client uses and could not work with; the fields
    /// marked server side are the server's business (a client's window
    /// is cut to the server's).
    pub(crate) fn check_client(&self) -> Result<(), Error> {
        let ok = (1..=wire::MAX_WINDOW).contains(&self.window)
            && self.max_message > 0
            && !self.connect_timeout.is_zero();
        if ok {
            Ok(())
        } else {
            Err(Error::Incompatible(
                "rpc client config out of range: window 1 to 1024, max_message at least 1, \
                 connect_timeout above zero",
            ))
        }
    }

    /// Receive buffers of the server's shared receive queue.
    pub(crate) fn srq_depth(&self) -> u32 {
        self.max_clients * u32::from(self.window)
    }

    /// The server's shared receive queue.
    pub(crate) fn srq_config(&self) -> crate::backend::SrqConfig {
        crate::backend::SrqConfig {
            max_wr: self.srq_depth(),
            max_sge: 1,
        }
    }
}

/// Why a call failed.
///
/// ```
/// # use rdma_ring::backend::soft::SoftDevice;
/// # use rdma_ring::rpc::{Caller, HandlerError, RpcConfig, RpcServer, Service};
/// use rdma_ring::rpc::RpcError;
/// # let dev = SoftDevice::new();
/// let refuse = |_: &Caller, _: &[u8], _: &mut Vec<u8>| -> Result<(), HandlerError> {
///     Err(HandlerError::new("no such key"))
/// };
/// # let server = RpcServer::soft(&dev, Service::handler(refuse), RpcConfig::default()).unwrap();
/// # let client = server.connect_soft().unwrap();
/// let err = client.call(b"get x").unwrap_err();
/// assert_eq!(err, RpcError::Handler("no such key".into()));
/// assert_eq!(err.to_string(), "the handler failed: no such key");
/// # server.shutdown().unwrap();
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RpcError {
    /// The handler refused the request with this text.
    Handler(String),
    /// The handler panicked (the server serves on).
    Panicked(String),
    /// The request or response is longer than `max_message`.
    TooLarge(String),
    /// The server could not read the (rendezvous) request. This crate's
    /// server never answers so (see [`wire::ErrorCode::ReadFailed`]): a
    /// failed READ ends the connection.
    ReadFailed(String),
    /// The server is shutting down and took no new call.
    ShuttingDown,
    /// The server had no room for this call now: for a connection (the
    /// server is full), or for a large response (too many of them, or too
    /// many bytes, not released yet). The handler ran for the latter, and
    /// its response was dropped: retry only a call that may run twice.
    Busy(String),
    /// No answer within the call timeout; a late answer is dropped.
    Timeout(Duration),
    /// The connection is gone (the server died, restarted or closed it).
    Disconnected(String),
    /// The peer broke the protocol; the connection is closed.
    Protocol(String),
    /// Connecting failed (device, handshake, or no hello in time).
    Connect(String),
}

impl fmt::Display for RpcError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RpcError::Handler(t) => write!(f, "the handler failed: {t}"),
            RpcError::Panicked(t) => write!(f, "the handler panicked: {t}"),
            RpcError::TooLarge(t) => write!(f, "message too large: {t}"),
            RpcError::ReadFailed(t) => write!(f, "the server could not read the request: {t}"),
            RpcError::ShuttingDown => f.write_str("the server is shutting down"),
            RpcError::Busy(t) => write!(f, "the server is busy: {t}"),
            RpcError::Timeout(d) => write!(f, "no answer within {d:?}"),
            RpcError::Disconnected(t) => write!(f, "disconnected: {t}"),
            RpcError::Protocol(t) => write!(f, "protocol violation: {t}"),
            RpcError::Connect(t) => write!(f, "connecting failed: {t}"),
        }
    }
}

impl std::error::Error for RpcError {}

impl From<RpcError> for std::io::Error {
    fn from(e: RpcError) -> std::io::Error {
        use std::io::ErrorKind;
        let kind = match &e {
            RpcError::Timeout(_) => ErrorKind::TimedOut,
            RpcError::Disconnected(_) | RpcError::ShuttingDown => ErrorKind::ConnectionReset,
            RpcError::Connect(_) => ErrorKind::ConnectionRefused,
            RpcError::Protocol(_) => ErrorKind::InvalidData,
            RpcError::TooLarge(_) => ErrorKind::InvalidInput,
            _ => ErrorKind::Other,
        };
        std::io::Error::new(kind, e)
    }
}
