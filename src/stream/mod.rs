//! A byte stream over RDMA: [`RdmaStream`] (std `Read`/`Write`),
//! [`AsyncRdmaStream`] (`futures-io`'s `AsyncRead`/`AsyncWrite`, and
//! tokio's behind the `tokio` feature) and, on real devices,
//! [`RdmaListener`] with [`RdmaStream::connect`] (TCP handshake) or
//! [`RdmaCmListener`] with [`RdmaStream::connect_cm`] (rdma_cm).
//!
//! Ordered, reliable bytes with TCP's manners: partial reads, end of stream
//! after the peer's shutdown or close, half-close, back-pressure when the
//! peer does not read (a blocking write waits, a non-blocking one says
//! `WouldBlock`), `ConnectionReset` when the peer dies, `InvalidData` when
//! it breaks the protocol. Built on the ring's public API only.
//!
//! One manner differs: `flush` (and `poll_flush`) waits until what was
//! written is with the device, which takes the peer's grants: bytes
//! beyond its receive buffers wait for it to read. Two sides that each
//! write more than that, then flush before they read, wait on each other
//! (a blocking flush until its write timeout), where TCP's flush returns
//! at once. Read first, or end writing with `shutdown` (`poll_close`),
//! which returns at once when the peer's bytes wait unread.
//!
//! # Design
//!
//! Each side owns a ring with one queue pair and three pools of registered
//! buffers, made once per connection — nothing is registered per call, and
//! no memory descriptor crosses the wire except an 8-byte read-only pad the
//! peer reads to see that the connection is alive.
//!
//! * **Writes** copy into a send buffer (`chunk_size` bytes); a full
//!   buffer, or a partly filled one when nothing else waits, goes out as
//!   one SEND with immediate data. Small writes made while the peer's
//!   buffers are all in use are batched into one message.
//! * **Reads** copy out of receive buffers the device filled and handed
//!   back with their completions; an emptied buffer is posted again and
//!   granted back to the writer.
//! * **Credits** count receive buffers, and a buffer is posted again only
//!   once the reader emptied it, so a writer can never overwrite bytes the
//!   reader still holds, and never sends into a queue without a receive (no
//!   RNR). The rules, and why they cannot deadlock, are in [`flow`]; the
//!   wire format in [`frame`].
//!
//! SEND was chosen over RDMA WRITE with immediate into a ring buffer: the
//! device puts the bytes straight into buffers the reader owns (returned
//! with their completions), so no memory is exposed for writing, nothing
//! the peer does can race a local read, and a lying length is impossible
//! (the device reports what arrived). A receive consumes a whole buffer
//! either way; batching small writes keeps that cheap.
//!
//! ```
//! use std::io::{Read, Write};
//! use rdma_ring::backend::soft::SoftDevice;
//! use rdma_ring::stream::{RdmaStream, StreamConfig};
//!
//! let dev = SoftDevice::new();
//! let (mut a, mut b) = RdmaStream::soft_pair(&dev, StreamConfig::default()).unwrap();
//! a.write_all(b"hello from client!").unwrap();
//! a.flush().unwrap();
//! let mut got = [0u8; 18];
//! b.read_exact(&mut got).unwrap();
//! assert_eq!(&got, b"hello from client!");
//! a.shutdown(std::net::Shutdown::Write).unwrap();
//! assert_eq!(b.read(&mut got).unwrap(), 0); // end of stream
//! ```

mod async_stream;
mod blocking;
mod connection;
pub mod flow;
pub mod frame;
#[cfg(feature = "verbs")]
mod listener;

use std::time::Duration;

pub use async_stream::AsyncRdmaStream;
pub use blocking::{PendingStream, RdmaStream};
pub use connection::{SendBuffer, SendError};
#[cfg(feature = "verbs")]
pub use listener::{RdmaCmListener, RdmaListener};

use crate::backend::QpConfig;
use crate::Error;

/// Sizes and times of a stream connection.
///
/// ```
/// use rdma_ring::stream::StreamConfig;
/// let config = StreamConfig { chunk_size: 4096, ..StreamConfig::default() };
/// assert_eq!(config.recv_buffers, 16);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamConfig {
    /// Bytes per send and receive buffer: the longest message.
    pub chunk_size: usize,
    /// Receive buffers for the peer's data: how many messages it may have
    /// in flight or unread.
    pub recv_buffers: u32,
    /// Receive buffers kept for the peer's acknowledgements: how many of
    /// our messages may go unacknowledged (at least 2).
    pub answer_buffers: u32,
    /// Send buffers: how much written data may wait for the peer.
    pub send_buffers: usize,
    /// Quiet time after which the peer is probed (an 8-byte read), so a
    /// dead peer fails the connection in bounded time; not zero. A read its
    /// peer's device refuses (the peer's hello named memory that is not
    /// its pad) is the peer breaking the protocol: `InvalidData`.
    pub keepalive: Duration,
    /// How long connecting may take, handshake and hellos together; not
    /// zero. Opening the TCP connection, or resolving the rdma_cm route,
    /// comes before and has a timeout of its own of this length.
    pub connect_timeout: Duration,
    /// How long dropping a stream waits for written data and its end of
    /// stream to leave.
    pub linger: Duration,
    /// Empty polls of the completion queue a blocked read or write makes
    /// before it sleeps on the completion channel: more polls, lower
    /// latency and more CPU while waiting.
    pub spin_polls: usize,
}

impl Default for StreamConfig {
    fn default() -> Self {
        StreamConfig {
            chunk_size: 64 * 1024,
            recv_buffers: 16,
            answer_buffers: 8,
            send_buffers: 16,
            keepalive: Duration::from_secs(1),
            connect_timeout: Duration::from_secs(10),
            linger: Duration::from_secs(2),
            spin_polls: 2000,
        }
    }
}

impl StreamConfig {
    /// Refuses sizes a hello cannot announce.
    pub(crate) fn check(&self) -> Result<(), Error> {
        let chunk_ok =
            (frame::MIN_CHUNK as usize..=frame::MAX_CHUNK as usize).contains(&self.chunk_size);
        if !chunk_ok
            || !(1..=frame::MAX_COUNT).contains(&self.recv_buffers)
            || !(2..=frame::MAX_COUNT).contains(&self.answer_buffers)
            || !(1..=frame::MAX_COUNT as usize).contains(&self.send_buffers)
        {
            return Err(Error::Incompatible(
                "stream config out of range: chunk_size 64 B to 16 MiB, recv_buffers 1 to 32767, \
                 answer_buffers 2 to 32767, send_buffers 1 to 32767",
            ));
        }
        if self.connect_timeout.is_zero() {
            // Every peer would time out at once, some without a word.
            return Err(Error::Incompatible("connect_timeout must be above zero"));
        }
        if self.keepalive.is_zero() {
            // A probe would follow a probe without pause.
            return Err(Error::Incompatible("keepalive must be above zero"));
        }
        Ok(())
    }

    /// Control buffers: hello, FIN, a probe, and the credits in flight.
    pub(crate) fn control_buffers(&self) -> usize {
        self.answer_buffers as usize + 4
    }

    /// The queue pair a connection with this config needs.
    ///
    /// ```
    /// use rdma_ring::stream::StreamConfig;
    /// let qp = StreamConfig::default().qp_config();
    /// assert_eq!(qp.max_recv_wr, 16 + 8);
    /// ```
    pub fn qp_config(&self) -> QpConfig {
        QpConfig {
            // Data and control sends, plus the slot the ring keeps for its
            // teardown marker.
            max_send_wr: (self.send_buffers + self.control_buffers() + 1) as u32,
            max_recv_wr: self.recv_buffers + self.answer_buffers,
            max_send_sge: 1,
            max_recv_sge: 1,
            ..QpConfig::default()
        }
    }
}
