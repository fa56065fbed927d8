//! The fixed-buffer ring: the lean path, for when every buffer can be a
//! slot of one registration (io_uring's fixed buffers).
//!
//! A [`FixedRing`] owns one completion queue, any number of queue pairs
//! and one [`FixedBufs`] table. An operation names its buffer by a
//! [`FixedBuf`] token, moved into the ring at push and handed back by its
//! [`FixedCompletion`], so ownership still keeps the NIC and the program
//! apart — but no buffer moves: the ring keeps a 4-byte slot index per
//! operation. A queue
//! pair's sends and receives sit in rings indexed by sequence number, which
//! is also their `wr_id`; a completion is 56 bytes. What that saves is the
//! owned-buffer ring's general bookkeeping: buffers of any type, a slab
//! shared by every queue and owner, futures.
//!
//! What it keeps of [`Ring`](crate::ring::Ring)'s invariants:
//!
//! * **Ownership**: a slot is reachable only through its token, which is in
//!   the ring from push until the completion is reaped; a refused push
//!   hands the operation back whole ([`Rejected`](crate::Rejected)).
//! * **Identity**: a completion is matched by queue pair slot, QP number
//!   and sequence number (which go on, never restart, when a slot is
//!   reused); one that names nothing posted is counted
//!   ([`FixedRing::unknown_completions`]) and ignored.
//! * **Selective signaling**: a send asks for a completion every
//!   [`FixedRingConfig::signal_interval`] sends and always as the last of a
//!   submit; a completion releases the unsignaled sends before it on its
//!   queue pair, never another's.
//! * **Credits**: per queue pair its send and receive queue depths, and for
//!   the completion queue the work of all queue pairs, even if every work
//!   request were flushed with its own entry; one send place and one entry
//!   per queue pair are kept for the drain marker.
//! * **Errors**: after a failed completion or post the queue pair takes no
//!   more work ([`Error::QpInError`](crate::Error::QpInError)) and its work
//!   comes back flushed; the others run on. The device's asynchronous
//!   events, read by the caller from its one event channel, are applied
//!   with [`FixedRing::apply_event`] (a queue pair's fatal error fails it,
//!   a failed completion queue or device fails the ring);
//!   [`FixedRing::check_peers`] fails the queue pairs whose rdma_cm peer
//!   left, and [`FixedRing::fail_qp`] fails one on request.
//! * **Teardown**: [`FixedRing::detach`] and dropping the ring move busy
//!   queue pairs to error and drain them before letting go. A detach the
//!   device does not flush in time fails with a timeout and keeps the queue
//!   pair attached; a dropped ring whose queue pairs do not drain in time
//!   leaks the slots' memory, never frees it under the NIC.
//!
//! **Batches**: [`FixedRing::batch`] opens a [`PushBatch`] of pushes to
//! one queue pair, which checks the ring and the queue pair once instead
//! of at every push; [`FixedRing::reap_each`] hands each completion to a
//! closure as it is made, with no list to fill and read back. Together
//! they are the cheapest way through the ring (`scripts/instructions`
//! counts both ways).
//!
//! To await its operations from tasks, share it as an
//! [`AsyncFixedRing`](crate::future::AsyncFixedRing).
//!
//! **Shared receive queues** ([`FixedRing::add_srq`]): receives pushed once
//! with [`FixedRing::push_srq`], taken by whichever of the queue's queue
//! pairs a message arrives on; each completion names that queue pair
//! (found by the number in the completion queue entry). Teardown destroys
//! the queue pairs before the queue and the queue before its receives'
//! slots are let go.
//!
//! It keeps a shared receive queue topped up from its free slots when
//! asked ([`FixedRing::set_srq_refill`]); awaited, what arrives there is
//! taken with [`AsyncFixedRing::receive`](crate::future::AsyncFixedRing::receive).
//!
//! What it does not do: buffers other than its slots (a slot is one
//! scatter/gather element), reading the device's event channel itself.
//! For those, use [`Ring`](crate::ring::Ring).
//!
//! ```
//! use rdma_ring::backend::{soft::SoftDevice, QpConfig, QueuePair};
//! use rdma_ring::fixed::{FixedBufs, FixedRing, FixedRingConfig, RecvFixed, SendFixed};
//!
//! let dev = SoftDevice::new();
//! let pd = dev.alloc_pd();
//! let (mut a, mut b) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
//! let (cq_a, cq_b) = (a.take_cq().unwrap(), b.take_cq().unwrap());
//! let mut left = FixedRing::new(cq_a, FixedBufs::new(&pd, 8, 256).unwrap(), FixedRingConfig::default());
//! let mut right = FixedRing::new(cq_b, FixedBufs::new(&pd, 8, 256).unwrap(), FixedRingConfig::default());
//! let (qa, qb) = (left.attach(a).unwrap(), right.attach(b).unwrap());
//!
//! let slot = right.take_buf().unwrap();
//! right.push(qb, RecvFixed::new(slot).user_data(1)).unwrap();
//! right.submit().unwrap();
//!
//! let mut msg = left.take_buf().unwrap();
//! left.bufs().bytes_mut(&mut msg)[..5].copy_from_slice(b"hello");
//! left.push(qa, SendFixed::new(msg, 5)).unwrap();
//! left.submit().unwrap();
//! let sent = left.wait(1).unwrap();
//! left.put_buf(sent.into_iter().next().unwrap().into_buf()).unwrap();
//!
//! let got = right.wait(1).unwrap();
//! assert_eq!(got[0].byte_len(), 5);
//! assert_eq!(&right.bufs().bytes(got[0].buf())[..5], b"hello");
//! ```

mod batch;
mod bufs;
mod completion;
mod events;
mod op;
mod queue;
mod reap;
mod receive_table;
mod ring;
mod srq;
mod srq_refill;

pub use batch::PushBatch;
pub use bufs::{FixedBuf, FixedBufs};
pub(crate) use completion::CompletionSink;
pub use completion::FixedCompletion;
pub use op::{
    CompareSwapFixed, FetchAddFixed, FixedOp, FixedWork, ReadFixed, RecvFixed, SendFixed,
    WriteFixed,
};
pub use ring::{FixedQp, FixedRing, FixedRingConfig};
pub use srq::FixedSrq;
pub use srq_refill::FixedSrqRefill;
