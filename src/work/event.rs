//! Asynchronous device events, as plain data.

use super::{CqId, SrqId};

/// An asynchronous event of a device (`ibv_get_async_event`): something
/// happened to a queue pair, a shared receive queue, a completion queue, a
/// port or the whole device, outside any work request. Events are read
/// from the device's event channel and acknowledged by the backend before
/// they reach you.
///
/// ```
/// use rdma_ring::backend::AsyncEvent;
/// let event = AsyncEvent::QpFatal { qp_num: 7 };
/// assert_eq!(event.qp_num(), Some(7));
/// assert!(event.is_fatal());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AsyncEvent {
    /// An error on the queue pair moved it to the error state; its work
    /// requests complete flushed.
    QpFatal {
        /// The queue pair.
        qp_num: u32,
    },
    /// An invalid request on the queue pair moved it to the error state.
    QpRequestError {
        /// The queue pair.
        qp_num: u32,
    },
    /// A local access violation moved the queue pair to the error state.
    QpAccessError {
        /// The queue pair.
        qp_num: u32,
    },
    /// The first message arrived on a queue pair ready to receive.
    CommEstablished {
        /// The queue pair.
        qp_num: u32,
    },
    /// The send queue finished draining (after a move to SQD).
    SendQueueDrained {
        /// The queue pair.
        qp_num: u32,
    },
    /// A queue pair attached to a shared receive queue, in the error state,
    /// will take no more receives from it: it may now be destroyed without
    /// losing one.
    LastWqeReached {
        /// The queue pair.
        qp_num: u32,
    },
    /// A shared receive queue fell below the limit it was armed with; the
    /// limit is disarmed until armed again.
    SrqLimitReached {
        /// The shared receive queue.
        srq: SrqId,
    },
    /// A shared receive queue failed.
    SrqError {
        /// The shared receive queue.
        srq: SrqId,
    },
    /// A completion queue overran or failed; completions were lost.
    CqError {
        /// The completion queue.
        cq: CqId,
    },
    /// A port became active.
    PortActive {
        /// The port (from 1).
        port: u8,
    },
    /// A port went down.
    PortError {
        /// The port (from 1).
        port: u8,
    },
    /// A port's addressing changed (LID, P_Key, GID table, subnet manager).
    PortChanged {
        /// The port (from 1).
        port: u8,
    },
    /// The device failed; nothing on it works any more.
    DeviceFatal,
    /// An event this crate does not name, with its `ibv_event_type` code.
    Other {
        /// The code.
        code: u32,
    },
}

impl AsyncEvent {
    /// The queue pair the event concerns, if it concerns one.
    pub fn qp_num(&self) -> Option<u32> {
        match *self {
            AsyncEvent::QpFatal { qp_num }
            | AsyncEvent::QpRequestError { qp_num }
            | AsyncEvent::QpAccessError { qp_num }
            | AsyncEvent::CommEstablished { qp_num }
            | AsyncEvent::SendQueueDrained { qp_num }
            | AsyncEvent::LastWqeReached { qp_num } => Some(qp_num),
            _ => None,
        }
    }

    /// Whether the event means something is in error for good: a queue
    /// pair, a shared receive queue, a completion queue (and with it every
    /// queue pair that completes there: completions were lost) or the
    /// whole device. The rings act on those of a queue pair, a completion
    /// queue or the device themselves when handed them (`apply_event`);
    /// a failed shared receive queue changes nothing there, its queue
    /// pairs being failed by their own events. This is for code that
    /// watches events beside the rings.
    ///
    /// ```
    /// use rdma_ring::backend::{AsyncEvent, CqId};
    /// let cq = CqId::fresh();
    /// assert!(AsyncEvent::CqError { cq }.is_fatal());
    /// assert!(!AsyncEvent::PortActive { port: 1 }.is_fatal());
    /// ```
    pub fn is_fatal(&self) -> bool {
        matches!(
            self,
            AsyncEvent::QpFatal { .. }
                | AsyncEvent::QpRequestError { .. }
                | AsyncEvent::QpAccessError { .. }
                | AsyncEvent::SrqError { .. }
                | AsyncEvent::CqError { .. }
                | AsyncEvent::DeviceFatal
        )
    }
}
