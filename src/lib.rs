//! # rdma-ring
//!
//! An io_uring-style API over RDMA verbs. Build typed work requests
//! ([`op::Write`], [`op::Read`], [`op::Send`], [`op::Recv`],
//! [`op::CompareSwap`], …), push them into a [`ring::SubmissionQueue`],
//! post them all with one doorbell, and reap typed [`ring::Completion`]s.
//!
//! Every registered buffer moves into its operation and comes back only in
//! that operation's completion, success or error, so memory the NIC may
//! touch is never reachable from safe code, and nothing is freed while the
//! NIC may use it — not even when a ring is dropped with work in flight.
//!
//! ## Quick start
//!
//! Two connected queue pairs on the in-process [soft device]; one side
//! exposes memory, the other writes it in one batch and reads it back.
//!
//! ```
//! use rdma_ring::backend::soft::SoftDevice;
//! use rdma_ring::backend::QpConfig;
//! use rdma_ring::buf::{BaseBuf, BufferPool, ExposedBuf, RemoteAccess};
//! use rdma_ring::op::{Read, Write};
//! use rdma_ring::ring::{Ring, RingConfig};
//!
//! # fn main() -> Result<(), rdma_ring::Error> {
//! let dev = SoftDevice::new();
//! let (pd_a, pd_b) = (dev.alloc_pd(), dev.alloc_pd());
//! let (qp_a, _qp_b) = dev.connected_pair(&pd_a, &pd_b, QpConfig::default())?;
//!
//! // Side B exposes 32 KiB for reading and writing.
//! let exposed = ExposedBuf::new(&pd_b, vec![0u8; 32 * 1024], RemoteAccess::READ | RemoteAccess::WRITE)?;
//! let remote = exposed.remote(); // what B would send to A
//!
//! // Side A writes 8 chunks in one submit (one doorbell)...
//! let pool = BufferPool::new(&pd_a, 4096, 16)?;
//! let mut ring = Ring::new(qp_a, RingConfig::default());
//! for i in 0..8u64 {
//!     let mut chunk = pool.take()?;
//!     chunk.fill(i as u8);
//!     let target = remote.slice(i * 4096..(i + 1) * 4096)?;
//!     ring.submission().push(Write::new(chunk, target).user_data(i))?;
//! }
//! ring.submission().submit().map_err(|e| e.error)?;
//! for c in ring.completion().wait(8)? {
//!     c.result()?; // each chunk goes back to the pool when dropped
//! }
//!
//! // ...and reads the third one back.
//! let chunk = pool.take()?;
//! ring.submission().push(Read::new(chunk, remote.slice(2 * 4096..3 * 4096)?))?;
//! ring.submission().submit().map_err(|e| e.error)?;
//! let done = ring.completion().wait(1)?.pop().unwrap();
//! let (result, buf) = done.into_parts();
//! assert_eq!(result?, 4096);
//! assert!(buf.iter().all(|&b| b == 2));
//! # Ok(())
//! # }
//! ```
//!
//! ## Many queue pairs on one ring
//!
//! A server's shape is one ring per poller thread: [`ring::Ring::with_cq`]
//! takes a completion queue, [`ring::Ring::attach`] adds queue pairs created
//! on it (at any time), [`ring::Ring::add_srq`] adds shared receive queues,
//! and [`ring::Ring::watch_events`] the device's asynchronous events. Each
//! push names its queue pair ([`ring::Ring::submission_on`]); each
//! completion says which queue pair it came from; a completion of one queue
//! pair can never release another's operation. Credits, signaling and errors
//! are per queue pair, with one budget for the shared completion queue;
//! [`ring::Ring::detach`] drains one queue pair's work without disturbing
//! the others. The [`ring`] module docs state every rule.
//!
//! ## On real hardware
//!
//! The same ring drives a [`backend::verbs::VerbsQp`] (feature `verbs`):
//! open a device, connect a queue pair with [`connect::tcp::connect_qp`]
//! (or [`connect::tcp::handshake`], once its ring has receives posted), a
//! manual [`connect::Endpoint`], or [`connect::cm`] (rdma_cm), and hand it
//! to [`ring::Ring::new`]. To await operations on any executor, wrap the
//! ring in a [`future::AsyncRing`] (the fixed-buffer ring in a
//! [`future::AsyncFixedRing`]).
//!
//! ## Layout
//!
//! * [`op`]: the typed work requests.
//! * [`buf`]: owned buffers — registered memory, pools, slices, remote
//!   slices.
//! * [`ring`]: the pure-Rust ring — slab, submission, completion,
//!   signaling, credits, teardown.
//! * [`fixed`]: the fixed-buffer ring — slots of one registration named by
//!   tokens, the lean path.
//! * [`backend`]: the device boundary, the [soft device], and libibverbs
//!   (feature `verbs`).
//! * [`future`]: await any operation on any executor, on either ring.
//! * [`stream`]: a byte stream (std and async `Read`/`Write`) over RDMA.
//! * [`rpc`]: remote procedure calls — one poller thread serving many
//!   clients over a shared completion queue and receive queue, pipelined
//!   blocking and awaitable calls, messages of any size.
//! * [`session`]: connect in one line, registered memory of any size,
//!   memory regions lent and handed back, messages and every verb — the
//!   layer async-rdma users expect.
//! * [`connect`]: endpoint records, the TCP handshake and rdma_cm.
//! * [`leak`]: what was leaked rather than freed under the NIC.
//!
//! [soft device]: backend::soft

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

pub mod backend;
pub mod buf;
pub mod connect;
mod deadline;
pub mod error;
pub mod fixed;
pub mod future;
pub mod leak;
pub mod op;
pub mod ring;
pub mod rpc;
pub mod session;
pub mod stream;
mod thread_waker;
mod wakers;
mod work;

pub use error::{Error, Rejected};
