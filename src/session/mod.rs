//! Sessions: connect in one line, allocate registered memory of any size,
//! hand memory regions to the peer and take them back, and run every verb
//! on them — the layer async-rdma users expect, on the ring's public API.
//!
//! ```
//! use std::alloc::Layout;
//! use rdma_ring::backend::soft::SoftDevice;
//! use rdma_ring::session::SessionHost;
//!
//! # futures::executor::block_on(async {
//! let dev = SoftDevice::new();
//! let (client, server) = SessionHost::soft_pair(&dev, Default::default()).unwrap();
//!
//! // The client asks the server for 8 bytes, writes them, hands them back.
//! let mut local = client.alloc_local_mr(Layout::new::<[u8; 8]>()).unwrap();
//! local.copy_from_slice(&[1u8; 8]);
//! let remote = client.request_remote_mr(Layout::new::<[u8; 8]>()).await.unwrap();
//! let (written, _local) = client.write(local, remote.remote()).await;
//! written.unwrap();
//! client.send_remote_mr(remote).unwrap();
//!
//! // The server gets its region back, no longer writable by the client.
//! let region = server.receive_local_mr().await.unwrap();
//! assert_eq!(*region, [1u8; 8]);
//! # });
//! ```
//!
//! On a real device, async-rdma's README example reads (the README shows
//! the same):
//!
//! ```no_run
//! # #[cfg(feature = "verbs")]
//! # mod real {
//! use std::alloc::Layout;
//! use rdma_ring::session::{SessionBuilder, SessionError};
//!
//! async fn client() -> Result<(), SessionError> {
//!     let rdma = SessionBuilder::default().connect("10.0.0.1:7500")?;
//!     let mut lmr = rdma.alloc_local_mr(Layout::new::<[u8; 8]>())?;
//!     let rmr = rdma.request_remote_mr(Layout::new::<[u8; 8]>()).await?;
//!     lmr.copy_from_slice(&[1u8; 8]); // load data into lmr
//!     let (written, _lmr) = rdma.write(lmr, rmr.remote()).await; // lmr comes back
//!     written?;
//!     rdma.send_remote_mr(rmr) // hand the region back to its owner
//! }
//!
//! async fn server() -> Result<(), SessionError> {
//!     let rdma = SessionBuilder::default().listen("0.0.0.0:7500")?;
//!     let lmr = rdma.receive_local_mr().await?; // the region the client wrote
//!     assert_eq!(*lmr, [1u8; 8]);
//!     Ok(())
//! }
//! # }
//! ```
//!
//! # Shape
//!
//! A [`SessionHost`] owns one device's shared parts: a protection domain,
//! a [`RegionAllocator`] of registered arenas, one [`AsyncRing`] (one
//! completion queue, one driver thread), one pump thread that serves the
//! control channel of every session on it, and one granter thread that
//! makes the regions peers ask for. A [`Session`] is one peer: a
//! queue pair attached to the host's ring. Make hosts and sessions with a
//! [`SessionBuilder`] (`connect`, `listen`, `bind` for many peers,
//! `connect_cm`, `bind_cm`) or, on the soft device, [`SessionHost::soft`].
//!
//! # Memory and ownership
//!
//! * [`Session::alloc_local_mr`] cuts a [`Region`] out of a registered
//!   arena: no registration per allocation.
//! * A region handed to the peer — granted on its request
//!   ([`Session::request_remote_mr`]) or sent ([`Session::send_local_mr`])
//!   — gets a registration of its own covering exactly that region, with
//!   exactly the rights asked for, and is unreachable locally while the
//!   peer holds it. It comes back ([`Session::receive_local_mr`]) when the
//!   peer hands it back ([`Session::send_remote_mr`]); when the peer
//!   releases it (drops its [`RemoteRegion`]) or its lease ends, a region
//!   granted on request is freed and a region our user sent comes back.
//!   The registration is revoked first, so the peer can no longer touch
//!   bytes safe code may now read.
//! * A peer asks for at most [`SessionConfig::max_remote_region`] bytes at
//!   a time, [`SessionConfig::max_remote_total`] in all (what the
//!   allocator takes for its grants, regions our user sent it, and those
//!   handed back and not yet taken), at most
//!   4096 regions at once, with rights within
//!   [`SessionConfig::max_remote_rights`].
//!
//! # Data path
//!
//! `read`, `write`, `atomic_cas` and `fetch_add` go straight to the ring
//! (awaitable [`OpFuture`]s, buffers returned with the result).
//! `write_with_imm` takes a receive of the peer's, so it waits, as a
//! message does, while the peer's user has its window unread (its buffer
//! comes back with the result). `send` / `receive` carry user messages of
//! up to [`SessionConfig::max_message`] bytes, received zero-copy into
//! regions.
//!
//! # Control channel
//!
//! Each session keeps `recv_depth` receives posted; every SEND ends with a
//! 16-byte trailer ([`wire`]) that tells user messages from control
//! messages and carries the flow-control counts ([`flow`]): no message
//! meets an empty receive queue, and a user who does not read holds up only
//! the peer's user messages. A malformed control message, a count of
//! messages never sent, a return of a region never lent, or a user message
//! past our `max_message` ends the session with
//! [`SessionError::Protocol`]; nothing local is lost. (A region handed
//! back twice is let be: it cannot be told from one whose lease ended as
//! it came back.)
//!
//! # Limits
//!
//! * The sessions of one host share its protection domain (their regions
//!   come from one allocator): an rkey lent to one peer works over any
//!   session of the host. Give peers that must not reach each other's
//!   regions hosts of their own.
//! * A lease's end is final: an operation on a region after it (or after
//!   handing the region back) fails with a remote access error, which ends
//!   the session, as RC does. [`RemoteRegion::expires_at`] is sent as the
//!   lease left when the descriptor leaves, and counted from when this
//!   side's pump takes the message in: it runs later than the lender's
//!   clock by the message's flight and by however long the message waited
//!   for the pump (a backlog of completions, the ring held by another
//!   user). Leave a margin before it.
//! * The sessions of one host share its ring: the results of operations
//!   a user leaves uncollected (futures neither awaited nor dropped) take
//!   room in it, and once it is full, every session's receives wait to be
//!   posted again (their peers' messages wait with them) until that user
//!   collects or drops them.
//! * A peer is known gone when its handshake socket closes (the TCP
//!   handshake), rdma_cm says it disconnected, or an operation to it fails
//!   after the transport's retries. A peer whose host vanished without a
//!   word (no socket end, no disconnect) is not noticed on an idle
//!   session until something is sent to it: bound the waits
//!   ([`SessionConfig::request_timeout`] does for requests), or send now
//!   and then.
//!
//! [`RegionAllocator`]: crate::buf::RegionAllocator
//! [`AsyncRing`]: crate::future::AsyncRing
//! [`OpFuture`]: crate::future::OpFuture

mod connection;
pub mod flow;
mod granter;
mod host;
#[cfg(feature = "verbs")]
mod listener;
mod pump;
mod remote_region;
mod send_slots;
mod state;
pub mod wire;

use std::time::Duration;

pub use crate::buf::Region;
pub use connection::Session;
pub use host::{SessionEvents, SessionHost};
#[cfg(feature = "verbs")]
pub use listener::{SessionBuilder, SessionListener};
pub use remote_region::RemoteRegion;
pub use wire::{Greeting, Hello, RefuseReason};

use crate::buf::RemoteAccess;
use crate::Error;

/// Sizes, caps and times of sessions.
///
/// ```
/// use std::time::Duration;
/// use rdma_ring::session::SessionConfig;
/// let config = SessionConfig { lease: Duration::from_secs(5), ..SessionConfig::default() };
/// assert!(config.check().is_ok());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionConfig {
    /// Receives each session keeps posted (4..=1024). Messages in flight
    /// each way are bounded by the smaller of the two sides' depths, so
    /// a side's send queue never holds more of them than its own depth,
    /// whatever its peer's.
    pub recv_depth: u16,
    /// User messages the peer may send that our user has not taken yet
    /// (1..recv_depth); below the smaller of the two sides' depths, as
    /// both sides count it.
    pub user_window: u16,
    /// Largest user message, in bytes (up to 1 MiB). Every posted receive
    /// is this large (plus the 16-byte trailer).
    pub max_message: u32,
    /// Largest region the peer may ask us to allocate (no more than half
    /// the `memory_limit` is ever granted: see `max_remote_total`).
    pub max_remote_region: u64,
    /// Most bytes the peer may hold of ours at once (granted and sent),
    /// counting what each grant takes from the allocator (a byte aligned
    /// to 4 KiB takes 4 KiB) and the grants it handed back that our user
    /// has not taken with [`Session::receive_local_mr`] yet. A peer holds
    /// at most 4096 regions at once, whatever their size (each is a
    /// registration of its own), counting those it handed back that our
    /// user has not taken yet. Grants stop once what all of a host's
    /// peers hold (our users' lends included) would pass half its
    /// `memory_limit` (a request past it is refused as
    /// [`RefuseReason::OutOfMemory`]): the rest stays for every
    /// session's receives and messages, so one peer with many sessions
    /// cannot starve the others of those (it can still take the grants
    /// the others would have had).
    pub max_remote_total: u64,
    /// Rights the peer may ask for.
    pub max_remote_rights: RemoteAccess,
    /// How long the peer may hold a region of ours before we take it
    /// back; not zero.
    pub lease: Duration,
    /// How long [`Session::request_remote_mr`] waits for the peer; not
    /// zero.
    pub request_timeout: Duration,
    /// How long connecting may take, handshake and hellos together; not
    /// zero. Opening the TCP connection, or resolving the rdma_cm route,
    /// comes before and has a timeout of its own of this length.
    pub connect_timeout: Duration,
    /// Bytes of each registered arena.
    pub arena_bytes: usize,
    /// Most bytes all arenas may register together; peers' grants take
    /// at most half (see `max_remote_total`).
    pub memory_limit: usize,
    /// Send queue slots for data operations (reads, writes, atomics) in
    /// flight per session; the queue pair has room for messages besides.
    /// More data operations than this are not refused by the session:
    /// they take the slots kept for messages, whose sends then wait for
    /// room, and the ring refuses one (`SendQueueFull`) only once the
    /// whole send queue is full.
    pub max_send_wr: u32,
    /// Sessions a host holds at once, handshakes under way included
    /// (1..=4096). The host's completion queue has room for each one's
    /// full queues (its receives and its send queue), so no number of
    /// sessions, idle or busy, starves another of completion queue room;
    /// a handshake beyond is refused with [`SessionError::HostFull`], on
    /// both sides: a full host tells its peer so in place of its hello.
    /// A connecting handshake holds its room from before it dials; an
    /// accepted one from the peer's hello (a peer that connects and says
    /// nothing holds none), each until it ends, within the connect
    /// timeout (where one session's queues are so
    /// deep that the most the device's queue holds, at most 65536 entries,
    /// fits fewer, at that many: [`SessionHost::max_sessions`] says). The
    /// completion queue grows with it: about 322 entries per session by
    /// default.
    pub max_sessions: u32,
    /// How long a dropped session waits for its close message to leave
    /// (and the peer to receive it) before its queue pair goes; not zero.
    /// A session whose peer closed first, or that failed, has nothing to
    /// send and goes at once. A grace too long to add to the clock
    /// (`Duration::MAX`) has no end: the session goes once its close has
    /// reached the peer, or its queue pair fails (a peer gone for good
    /// fails it when the transport's retries run out).
    pub close_grace: Duration,
}

impl Default for SessionConfig {
    fn default() -> Self {
        SessionConfig {
            recv_depth: 32,
            user_window: 16,
            max_message: 4096,
            max_remote_region: 64 << 20,
            max_remote_total: 256 << 20,
            max_remote_rights: RemoteAccess::READ | RemoteAccess::WRITE | RemoteAccess::ATOMIC,
            lease: Duration::from_secs(60),
            request_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(10),
            arena_bytes: 8 << 20,
            memory_limit: 1 << 30,
            max_send_wr: 256,
            max_sessions: 64,
            close_grace: Duration::from_secs(1),
        }
    }
}

impl SessionConfig {
    /// Checks every field's range.
    ///
    /// ```
    /// use rdma_ring::session::SessionConfig;
    /// assert!(SessionConfig::default().check().is_ok());
    /// // The user window must leave receives for control messages.
    /// let config = SessionConfig { recv_depth: 8, user_window: 8, ..SessionConfig::default() };
    /// let err = config.check().unwrap_err();
    /// assert!(err.to_string().contains("user_window must be 1..recv_depth"));
    /// // Connecting must be given some time.
    /// let config = SessionConfig { connect_timeout: std::time::Duration::ZERO, ..SessionConfig::default() };
    /// assert!(config.check().unwrap_err().to_string().contains("connect_timeout"));
    /// // So must a lease.
    /// let config = SessionConfig { lease: std::time::Duration::ZERO, ..SessionConfig::default() };
    /// assert!(config.check().unwrap_err().to_string().contains("lease"));
    /// // And a close.
    /// let config = SessionConfig { close_grace: std::time::Duration::ZERO, ..SessionConfig::default() };
    /// assert!(config.check().unwrap_err().to_string().contains("close_grace"));
    /// ```
    pub fn check(&self) -> Result<(), Error> {
        let bad = |what: &'static str| Err(Error::Incompatible(what));
        if !(4..=1024).contains(&self.recv_depth) {
            return bad("recv_depth must be 4..=1024");
        }
        if self.user_window == 0 || self.user_window >= self.recv_depth {
            return bad("user_window must be 1..recv_depth");
        }
        if self.max_message > 1 << 20 {
            return bad("max_message must be at most 1 MiB");
        }
        if self.max_send_wr == 0 || self.max_send_wr > 16384 {
            return bad("max_send_wr must be 1..=16384");
        }
        if !(1..=4096).contains(&self.max_sessions) {
            return bad("max_sessions must be 1..=4096");
        }
        if self.arena_bytes == 0 || self.arena_bytes > self.memory_limit {
            return bad("arena_bytes must be 1..=memory_limit");
        }
        if self.connect_timeout.is_zero() {
            return bad("connect_timeout must be above zero");
        }
        // Zero would take back every region as it went, and time out
        // every request at the pump's next turn.
        if self.lease.is_zero() {
            return bad("lease must be above zero");
        }
        if self.request_timeout.is_zero() {
            return bad("request_timeout must be above zero");
        }
        // Zero would drop the queue pair before the close could leave:
        // the peer would see a broken connection, not a close.
        if self.close_grace.is_zero() {
            return bad("close_grace must be above zero");
        }
        Ok(())
    }

    /// Queue pair settings of a session.
    pub(crate) fn qp_config(&self) -> crate::backend::QpConfig {
        crate::backend::QpConfig {
            // Data operations, messages (a window of the peer's
            // receives, and one spare) and the ring's teardown marker.
            max_send_wr: self.max_send_wr + send_slots::message_slots(self.recv_depth) + 1,
            max_recv_wr: u32::from(self.recv_depth),
            max_send_sge: 2,
            max_recv_sge: 1,
            ..crate::backend::QpConfig::default()
        }
    }

    fn hello(&self) -> wire::Hello {
        wire::Hello {
            recv_depth: self.recv_depth,
            user_window: self.user_window,
            max_message: self.max_message,
        }
    }
}

/// What went wrong in a session.
///
/// ```
/// use std::alloc::Layout;
/// use rdma_ring::backend::soft::SoftDevice;
/// use rdma_ring::session::{RefuseReason, SessionError, SessionHost};
/// # futures::executor::block_on(async {
/// let dev = SoftDevice::new();
/// let (client, _server) = SessionHost::soft_pair(&dev, Default::default()).unwrap();
/// // The server lends at most `max_remote_region` bytes (64 MiB by default) at once.
/// let layout = Layout::from_size_align(128 << 20, 8).unwrap();
/// let err = client.request_remote_mr(layout).await.unwrap_err();
/// assert!(matches!(err, SessionError::Refused(RefuseReason::TooLarge)));
/// // The session survives a refusal.
/// assert!(client.failure().is_none());
/// # });
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SessionError {
    /// The device or the ring refused.
    #[error(transparent)]
    Device(#[from] Error),
    /// The peer broke the protocol; the session is closed.
    #[error("the peer broke the session protocol: {0}")]
    Protocol(String),
    /// The peer closed the session, or it was closed here.
    #[error("the session is closed ({0})")]
    Closed(&'static str),
    /// The connection failed: the peer is gone or unreachable.
    #[error("the connection failed: {0}")]
    Disconnected(String),
    /// The peer refused an allocation.
    #[error("the peer refused the allocation: {0}")]
    Refused(RefuseReason),
    /// The peer did not answer in time.
    #[error("the peer did not answer within {0:?}")]
    Timeout(Duration),
    /// A message is larger than the peer accepts.
    #[error("a message of {len} bytes is larger than the peer's limit of {max}")]
    TooLarge {
        /// The message's length.
        len: usize,
        /// The peer's limit.
        max: u32,
    },
    /// A remote region was handed to another session than its own.
    #[error("this remote region belongs to another session")]
    WrongSession,
    /// More regions sent with `send_local_mr` and not yet back than a
    /// peer keeps waiting for its user: wait for some to come back.
    #[error("{max} regions lent and not yet back: the peer keeps no more waiting for its user")]
    TooManyLent {
        /// The limit.
        max: usize,
    },
    /// More of our allocation requests are open (sent and not answered,
    /// including those whose wait ended) than a session keeps: wait for
    /// the peer to answer some. A peer lends at most that many regions at
    /// once anyway.
    #[error("{max} allocation requests are not yet answered by the peer")]
    TooManyRequests {
        /// The limit.
        max: usize,
    },
    /// Connecting failed.
    #[error("connecting failed: {0}")]
    Connect(String),
    /// A host holds its most sessions already
    /// ([`SessionConfig::max_sessions`], handshakes under way included):
    /// this side's (`peer: false`; connecting, nothing was sent; accepting,
    /// the peer was told so), or the peer's, which said so in place of its
    /// hello (`peer: true`). Connect again once a session there has ended.
    #[error(
        "{} host holds its most sessions, {most} (SessionConfig::max_sessions): connect again once one ends",
        if *peer { "the peer's" } else { "this" }
    )]
    HostFull {
        /// The sessions that host holds at most.
        most: usize,
        /// Whether it is the peer's host.
        peer: bool,
    },
}

impl SessionError {
    /// Whether a handshake that failed with this error failed through its
    /// peer's doing (garbage, silence, a peer that left, an endpoint our
    /// device refuses to connect to), or for want of room while other
    /// handshakes held it, rather than through a fault of ours: a
    /// listener's [`accept`](SessionListener::accept) may be called again
    /// after it, as [`SessionBuilder::listen`] does.
    ///
    /// ```
    /// use rdma_ring::session::SessionError;
    /// assert!(SessionError::Protocol("a bad hello".into()).is_peer_failure());
    /// assert!(!SessionError::Connect("address in use".into()).is_peer_failure());
    /// ```
    pub fn is_peer_failure(&self) -> bool {
        matches!(
            self,
            SessionError::Protocol(_)
                | SessionError::Disconnected(_)
                | SessionError::Timeout(_)
                | SessionError::HostFull { .. }
                | SessionError::Device(
                    Error::Handshake { .. }
                        | Error::HandshakeTimeout { .. }
                        | Error::Malformed { .. }
                )
        )
    }

    /// A copy, for the many waiters of one failure.
    fn duplicate(&self) -> SessionError {
        match self {
            SessionError::Device(e) => SessionError::Disconnected(e.to_string()),
            SessionError::Protocol(s) => SessionError::Protocol(s.clone()),
            SessionError::Closed(s) => SessionError::Closed(s),
            SessionError::Disconnected(s) => SessionError::Disconnected(s.clone()),
            SessionError::Refused(r) => SessionError::Refused(*r),
            SessionError::Timeout(t) => SessionError::Timeout(*t),
            SessionError::TooLarge { len, max } => SessionError::TooLarge {
                len: *len,
                max: *max,
            },
            SessionError::WrongSession => SessionError::WrongSession,
            SessionError::TooManyLent { max } => SessionError::TooManyLent { max: *max },
            SessionError::TooManyRequests { max } => SessionError::TooManyRequests { max: *max },
            SessionError::Connect(s) => SessionError::Connect(s.clone()),
            SessionError::HostFull { most, peer } => SessionError::HostFull {
                most: *most,
                peer: *peer,
            },
        }
    }
}

impl From<SessionError> for std::io::Error {
    fn from(e: SessionError) -> std::io::Error {
        use std::io::ErrorKind;
        let kind = match &e {
            SessionError::Timeout(_) | SessionError::Device(Error::HandshakeTimeout { .. }) => {
                ErrorKind::TimedOut
            }
            SessionError::Closed(_) | SessionError::Disconnected(_) => ErrorKind::ConnectionReset,
            SessionError::Connect(_)
            | SessionError::HostFull { .. }
            | SessionError::Device(Error::Handshake { .. }) => ErrorKind::ConnectionRefused,
            SessionError::Protocol(_) => ErrorKind::InvalidData,
            SessionError::TooLarge { .. } | SessionError::WrongSession => ErrorKind::InvalidInput,
            _ => ErrorKind::Other,
        };
        std::io::Error::new(kind, e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::ErrorKind;

    /// A handshake that failed reads as a refused connection, one that
    /// timed out as a timeout, whichever step it was in.
    #[test]
    fn handshake_failures_keep_their_kind_as_io_errors() {
        let kind = |e: SessionError| std::io::Error::from(e).kind();
        let timed_out = Error::HandshakeTimeout {
            step: "reading the peer's session hello",
            reason: "timed out after 1 of 12 bytes".into(),
        };
        assert_eq!(kind(timed_out.into()), ErrorKind::TimedOut);
        let closed = Error::Handshake {
            step: "reading the peer's session hello",
            reason: "peer closed the connection after 0 of 12 bytes".into(),
        };
        assert_eq!(kind(closed.into()), ErrorKind::ConnectionRefused);
        assert_eq!(
            kind(SessionError::Connect("no route".into())),
            ErrorKind::ConnectionRefused
        );
        assert_eq!(
            kind(SessionError::Timeout(Duration::from_secs(1))),
            ErrorKind::TimedOut
        );
    }
}
