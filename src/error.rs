//! The crate's error type, and [`Rejected`], which hands back whatever a
//! refused call took ownership of.

use std::fmt;

use crate::work::{OpKind, PdId, WcStatus};

/// Everything that can go wrong, each variant saying what and why.
///
/// ```
/// use rdma_ring::Error;
/// let e = Error::SendQueueFull { outstanding: 127, depth: 127 };
/// assert!(e.to_string().contains("send queue full"));
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The send queue has no room for another work request.
    #[error("send queue full: {outstanding} of {depth} work requests outstanding or pushed; reap completions first")]
    SendQueueFull {
        /// Work requests posted or pushed and not yet completed.
        outstanding: usize,
        /// What the ring allows on this queue pair.
        depth: usize,
    },
    /// The receive queue has no room for another receive.
    #[error("receive queue full: {outstanding} of {depth} receives outstanding or pushed; reap completions first")]
    RecvQueueFull {
        /// Receives posted or pushed and not yet completed.
        outstanding: usize,
        /// What the ring allows on this queue pair.
        depth: usize,
    },
    /// Another work request could make the completion queue overflow.
    #[error("completion queue full: {possible} completions possible with {entries} entries; reap completions first")]
    CompletionQueueFull {
        /// Completions that outstanding work could still produce.
        possible: usize,
        /// Completion queue depth.
        entries: usize,
    },
    /// The queue pair is in the error state and takes no more work.
    #[error("queue pair is in the error state after a failed completion ({0}); it takes no more work requests")]
    QpInError(WcStatus),
    /// The ring is closed.
    #[error("the ring is closed")]
    Closed,
    /// The local buffer is longer than the remote slice it targets.
    #[error("local buffer of {local} bytes does not fit the remote slice of {remote} bytes")]
    RemoteTooSmall {
        /// Local length.
        local: usize,
        /// Remote length.
        remote: u64,
    },
    /// The remote slice does not grant what the operation needs.
    #[error("{op:?} needs remote {needed} rights, but the remote slice grants only {granted}")]
    MissingRemoteRights {
        /// The operation.
        op: OpKind,
        /// The right it needs.
        needed: &'static str,
        /// The rights granted, as text.
        granted: String,
    },
    /// A remote slice taken as an atomic target
    /// ([`RemoteSlice::word`](crate::buf::RemoteSlice::word)) does not
    /// grant remote atomics. Either atomic (compare-and-swap or
    /// fetch-and-add) needs them; the word does not know yet which it
    /// will serve.
    #[error(
        "an atomic target needs remote ATOMIC rights, but the remote slice grants only {granted}"
    )]
    MissingAtomicRights {
        /// The rights granted, as text.
        granted: String,
    },
    /// Inline data is larger than the queue pair allows.
    #[error("inline payload of {len} bytes exceeds the queue pair's limit of {max} bytes")]
    InlineTooLarge {
        /// Payload length.
        len: usize,
        /// The limit.
        max: u32,
    },
    /// A buffer of one protection domain was used on a queue pair of another.
    #[error(
        "buffer is registered in protection domain {buf:?} but the queue pair belongs to {qp:?}"
    )]
    WrongPd {
        /// The buffer's domain.
        buf: PdId,
        /// The queue pair's domain.
        qp: PdId,
    },
    /// The device does not support this operation.
    #[error("{0:?} is not supported by this device")]
    Unsupported(OpKind),
    /// An operation has more buffers than the queue takes scatter/gather
    /// elements per work request.
    #[error("{count} buffers in one operation, but the queue takes at most {max} scatter/gather elements per work request")]
    TooManySges {
        /// Buffers in the operation.
        count: usize,
        /// The queue's limit.
        max: u32,
    },
    /// A handle names no queue pair (or shared receive queue) of this ring:
    /// it was detached, or belongs to another ring.
    #[error("the {0} handle names nothing attached to this ring (detached, or another ring's)")]
    NotAttached(&'static str),
    /// A queue pair completes on another completion queue than the ring's,
    /// or takes receives from a shared receive queue the ring does not hold.
    #[error("the queue pair cannot join this ring: {0}")]
    Incompatible(&'static str),
    /// The ring has no queue pair to default to.
    #[error("the ring has no queue pair attached; name one with submission_on")]
    NoQueuePair,
    /// The completion queue failed or overran, or the device failed: the
    /// ring takes no more work.
    #[error("the ring's completion queue or device failed ({0}); it takes no more work")]
    RingFailed(&'static str),
    /// One work request can move at most 2^31 bytes, or what the port
    /// allows (its `max_msg_sz`), if less.
    #[error("{len} bytes exceed the {max}-byte limit of one work request")]
    TooLong {
        /// The bytes asked for.
        len: usize,
        /// The most one work request may move here.
        max: usize,
    },
    /// A range or offset lies outside the buffer or slice.
    #[error("range {start}..{end} is out of bounds for {len} bytes")]
    OutOfBounds {
        /// Range start.
        start: u64,
        /// Range end.
        end: u64,
        /// Length of what was sliced.
        len: u64,
    },
    /// An atomic target is not 8-byte aligned.
    #[error("atomic target at {addr:#x} is not 8-byte aligned")]
    Misaligned {
        /// The address.
        addr: u64,
    },
    /// A fixed-buffer token of another table than the ring's.
    #[error("the fixed buffer token belongs to another table than this one")]
    ForeignFixedBuf,
    /// A ring that already has work was handed to an adapter that must
    /// see all of it from the start.
    #[error(
        "the ring has work pushed, in flight or not yet reaped, or a refill set; share it while it is idle"
    )]
    RingNotIdle,
    /// Memory of zero bytes cannot be registered.
    #[error("cannot register an empty buffer")]
    EmptyBuffer,
    /// A scatter/gather list of no buffers was pushed (a zero-length
    /// operation is one empty buffer).
    #[error("a scatter/gather list needs at least one buffer")]
    EmptyList,
    /// A wire record is malformed.
    #[error("malformed {what}: {reason}")]
    Malformed {
        /// Which record.
        what: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// A work request completed with an error status.
    #[error("{op:?} work request failed: {status}")]
    Completion {
        /// The operation.
        op: OpKind,
        /// Its status.
        status: WcStatus,
    },
    /// A completion named a `wr_id` the ring never issued or already retired.
    #[error("completion for unknown wr_id {wr_id:#018x} (stale, duplicated or foreign); ignored")]
    UnknownWrId {
        /// The offending `wr_id`.
        wr_id: u64,
    },
    /// The device refused a work request at post time.
    #[error("device refused the work request at post time: {0}")]
    PostRejected(&'static str),
    /// The completion queue overflowed; the device moved the QP to error.
    #[error("completion queue overrun: the device dropped completions and moved the queue pair to error")]
    CqOverrun,
    /// Waiting for completions took longer than allowed.
    #[error("timed out after {0:?} waiting for completions")]
    Timeout(std::time::Duration),
    /// A wait asked for more completions than the work in flight can give.
    #[error("waiting for {wanted} completions, but only {possible} can still arrive")]
    WaitUnsatisfiable {
        /// Completions asked for.
        wanted: usize,
        /// Completions that can still arrive.
        possible: usize,
    },
    /// Finished operations awaited by futures fill the ring's slots.
    #[error("{0} finished operations are held for futures that have not collected them; poll or drop those futures")]
    Unclaimed(usize),
    /// Memory was asked back as a type it is not.
    #[error("the registered memory is not a {0}; the buffer is handed back")]
    WrongMemoryType(&'static str),
    /// A buffer pool's size does not fit in memory's address space.
    #[error("a pool of {count} chunks of {chunk_size} bytes is too large")]
    PoolTooLarge {
        /// Bytes per chunk asked for.
        chunk_size: usize,
        /// Chunks asked for.
        count: usize,
    },
    /// Allocating memory failed.
    #[error("could not allocate {0} bytes")]
    OutOfMemory(usize),
    /// The buffer pool has no free chunk.
    #[error("buffer pool exhausted: all {0} chunks are in use")]
    PoolExhausted(usize),
    /// A verb of libibverbs failed.
    #[error("{verb} failed: {source}")]
    Verbs {
        /// The verb, e.g. `ibv_reg_mr`.
        verb: &'static str,
        /// errno as an I/O error.
        source: std::io::Error,
    },
    /// The endpoint exchange with a peer failed.
    #[error("handshake failed while {step}: {reason}")]
    Handshake {
        /// What the handshake was doing.
        step: &'static str,
        /// What went wrong.
        reason: String,
    },
    /// The peer said nothing (or not all of it) within the handshake's
    /// time: what it was doing, and how far it got.
    #[error("handshake timed out while {step}: {reason}")]
    HandshakeTimeout {
        /// What the handshake was doing.
        step: &'static str,
        /// How far it got.
        reason: String,
    },
    /// No device of that name.
    #[error("no RDMA device named {0:?}")]
    NoSuchDevice(String),
    /// The soft device refused a request.
    #[error("soft device: {0}")]
    Soft(&'static str),
}

/// A refused call's error together with what the call took ownership of, so
/// that nothing is lost: a pushed op, a buffer, a pool chunk.
///
/// ```
/// use rdma_ring::{Error, Rejected};
/// let r = Rejected::new(Error::Closed, vec![1u8, 2, 3]);
/// let (error, value) = r.into_parts();
/// assert!(matches!(error, Error::Closed));
/// assert_eq!(value, vec![1, 2, 3]);
/// ```
pub struct Rejected<T> {
    error: Error,
    value: T,
}

impl<T> Rejected<T> {
    /// Pairs an error with the value it hands back.
    ///
    /// ```
    /// use rdma_ring::{Error, Rejected};
    /// // A refusal hands the job back, so the caller can retry it elsewhere.
    /// fn offer(open: bool, job: Vec<u8>) -> Result<(), Rejected<Vec<u8>>> {
    ///     if open { Ok(()) } else { Err(Rejected::new(Error::Closed, job)) }
    /// }
    /// let job = offer(false, vec![1, 2, 3]).unwrap_err().into_value();
    /// assert_eq!(job, vec![1, 2, 3]);
    /// ```
    pub fn new(error: Error, value: T) -> Self {
        Rejected { error, value }
    }
    /// Why the call was refused.
    ///
    /// ```
    /// # use rdma_ring::backend::soft::{SoftDevice, SoftQp};
    /// # use rdma_ring::buf::RegisteredBuf;
    /// # use rdma_ring::op::Recv;
    /// # use rdma_ring::ring::{Ring, RingConfig};
    /// use rdma_ring::Error;
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// let mut ring: Ring<SoftQp> = Ring::with_cq(dev.create_cq(16).unwrap(), RingConfig::default());
    /// let buf = RegisteredBuf::new(&pd, vec![0u8; 64]).unwrap();
    /// // No queue pair is attached, so the receive has nowhere to go.
    /// let refused = ring.submission().push(Recv::new(buf)).unwrap_err();
    /// assert!(matches!(refused.error(), Error::NoQueuePair));
    /// ```
    pub fn error(&self) -> &Error {
        &self.error
    }
    /// The value handed back.
    ///
    /// ```
    /// # use rdma_ring::backend::soft::SoftDevice;
    /// use rdma_ring::buf::RegisteredBuf;
    /// # let pd = SoftDevice::new().alloc_pd();
    /// // Zero bytes cannot be registered; the allocation comes back unused.
    /// let mem: Vec<u8> = Vec::with_capacity(64);
    /// let mem = RegisteredBuf::new(&pd, mem).unwrap_err().into_value();
    /// assert_eq!(mem.capacity(), 64);
    /// ```
    pub fn into_value(self) -> T {
        self.value
    }
    /// Both parts.
    ///
    /// ```
    /// # use rdma_ring::backend::soft::SoftDevice;
    /// use rdma_ring::buf::{BaseBuf, RegisteredBuf};
    /// use rdma_ring::Error;
    /// # let pd = SoftDevice::new().alloc_pd();
    /// let buf = RegisteredBuf::new(&pd, vec![0u64; 2].into_boxed_slice()).unwrap();
    /// let (error, buf) = buf.word(16).unwrap_err().into_parts();
    /// assert!(matches!(error, Error::OutOfBounds { start: 16, end: 24, len: 16 }));
    /// assert_eq!(buf.len(), 16);
    /// ```
    pub fn into_parts(self) -> (Error, T) {
        (self.error, self.value)
    }
}

impl<T> fmt::Debug for Rejected<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Rejected")
            .field("error", &self.error)
            .finish_non_exhaustive()
    }
}

impl<T> fmt::Display for Rejected<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (the value is handed back)", self.error)
    }
}

impl<T> std::error::Error for Rejected<T> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

impl<T> From<Rejected<T>> for Error {
    fn from(r: Rejected<T>) -> Error {
        r.error
    }
}
