//! [`AsyncQp`]: the awaitable side of one queue pair of a shared ring.

use std::fmt;
use std::sync::Arc;

use super::{OpFuture, Received, Shared};
use crate::backend::QueuePair;
use crate::buf::{BaseBuf, IoBuf, IoBufMut, RemoteSlice, RemoteWord, Word};
use crate::error::Error;
use crate::op::{self, Operation};
use crate::ring::{Detached, QpHandle, QpStats};

/// One queue pair of an [`AsyncRing`](crate::future::AsyncRing): the same
/// awaitable operations, pushed to this queue pair, completed by the ring's
/// one driver. Cheap to clone; it does not keep the ring open (when the
/// last `AsyncRing` handle drops, its operations fail with
/// [`Error::Closed`]).
///
/// ```
/// use rdma_ring::backend::soft::SoftDevice;
/// use rdma_ring::backend::QpConfig;
/// use rdma_ring::buf::RegisteredBuf;
/// use rdma_ring::future::{AsyncRing, Wakeup};
/// use rdma_ring::ring::{Ring, RingConfig};
///
/// let dev = SoftDevice::new();
/// let pd = dev.alloc_pd();
/// let cq = dev.create_cq(256).unwrap();
/// let ring = AsyncRing::new(Ring::with_cq(cq, RingConfig::default()), Wakeup::Busy).unwrap();
/// let server_qp = ring.with_ring(|r| dev.create_qp_on(&pd, r.cq(), None, QpConfig::default())).unwrap();
/// let client_qp = dev.create_qp(&pd, QpConfig::default()).unwrap();
/// dev.connect(&server_qp, &client_qp).unwrap();
/// let conn = ring.attach(server_qp).unwrap();
/// let client = AsyncRing::new(Ring::new(client_qp, RingConfig::default()), Wakeup::Busy).unwrap();
/// futures::executor::block_on(async {
///     let recv = conn.recv(RegisteredBuf::new(&pd, vec![0u8; 8]).unwrap());
///     let send = client.send(RegisteredBuf::new(&pd, b"hi".to_vec()).unwrap());
///     let ((sent, _), (got, buf)) = futures::join!(send, recv);
///     sent.unwrap();
///     let got = got.unwrap();
///     assert_eq!((got.len, got.qp), (2, Some(conn.handle())));
///     assert_eq!(&buf[..2], b"hi");
/// });
/// ```
pub struct AsyncQp<Q: QueuePair> {
    shared: Arc<Shared<Q>>,
    qp: QpHandle,
}

impl<Q: QueuePair> AsyncQp<Q> {
    pub(super) fn new(shared: Arc<Shared<Q>>, qp: QpHandle) -> Self {
        AsyncQp { shared, qp }
    }

    /// The queue pair's handle in the ring.
    pub fn handle(&self) -> QpHandle {
        self.qp
    }

    /// Pushes `op` to this queue pair and submits at once; see
    /// [`AsyncRing::op`](crate::future::AsyncRing::op).
    pub fn op<T: Operation>(&self, op: T) -> OpFuture<Q, T::Buf> {
        self.shared.op_on(Some(self.qp), op)
    }

    /// Pushes `op` to this queue pair without submitting.
    pub fn push<T: Operation>(&self, op: T) -> OpFuture<Q, T::Buf> {
        self.shared.push_on(Some(self.qp), op)
    }

    /// Counters of this queue pair (`None` once detached).
    pub fn stats(&self) -> Option<QpStats> {
        self.shared.with(|ring| ring.qp_stats(self.qp))
    }

    /// Detaches the queue pair (see [`Ring::detach`](crate::ring::Ring::detach)):
    /// its pending futures resolve flushed; the drain runs with the ring
    /// locked. If the device does not flush an operation within the
    /// ring's `drain_timeout` (`drained` is false), the operation is
    /// leaked, never freed under the NIC, and its future stays pending.
    pub fn detach(self) -> Result<Detached<Q>, Error> {
        self.shared.with(|ring| ring.detach(self.qp))
    }

    fn op_as<T: Operation, O>(&self, op: T) -> OpFuture<Q, T::Buf, O> {
        self.shared.op_on(Some(self.qp), op)
    }

    awaitable_ops!();
}

impl<Q: QueuePair> Clone for AsyncQp<Q> {
    fn clone(&self) -> Self {
        AsyncQp {
            shared: Arc::clone(&self.shared),
            qp: self.qp,
        }
    }
}

impl<Q: QueuePair> fmt::Debug for AsyncQp<Q> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AsyncQp").field("qp", &self.qp).finish()
    }
}
