//! What one session knows, behind its lock: flow counts, the control
//! outbox, what arrived for the user, the regions lent each way, and the
//! requests awaiting an answer.

use std::collections::{HashMap, HashSet, VecDeque};
use std::net::TcpStream;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Waker};
use std::time::{Duration, Instant};

use super::flow::Flow;
use super::host::HostShared;
use super::send_slots::MessageSlots;
use super::wire::{Control, Hello, RegionDescriptor};
use super::SessionError;
use crate::backend::QueuePair;
use crate::buf::{ExposedBuf, Region};
use crate::future::AsyncQp;

/// A region of ours the peer holds.
pub(super) struct Lent {
    pub(super) exposed: ExposedBuf<Region>,
    pub(super) deadline: Option<Instant>,
    /// Granted on the peer's request (freed when it expires) rather than
    /// sent by our user (given back to our user when it expires).
    pub(super) granted: bool,
    /// What it counts against the peer's quota: for a granted region, what
    /// it takes from the allocator (rounding and alignment included).
    pub(super) charge: u64,
}

/// A region's descriptor as it came from the peer, with the end of its
/// lease reckoned from its arrival. The lease runs from when the peer
/// sent it, not from when our user takes the region: reckoned at taking,
/// a region left waiting would outlive, on our clock, the peer's lease,
/// and an operation in that gap would end the session.
pub(super) struct Arrived {
    pub(super) descriptor: RegionDescriptor,
    pub(super) expires_at: Option<Instant>,
}

impl Arrived {
    /// `descriptor`, arrived now.
    pub(super) fn now(descriptor: RegionDescriptor) -> Self {
        let expires_at = (descriptor.lease_ms != 0)
            .then(|| {
                Instant::now().checked_add(Duration::from_millis(u64::from(descriptor.lease_ms)))
            })
            .flatten();
        Arrived {
            descriptor,
            expires_at,
        }
    }
}

/// One of our allocation requests.
pub(super) enum Request {
    /// Sent; no answer yet.
    Waiting {
        deadline: Option<Instant>,
        size: u64,
        rights: crate::buf::RemoteAccess,
    },
    Done(Result<Arrived, SessionError>),
    /// No answer in time; `answered` once a late one came (and a grant
    /// was released straight away).
    TimedOut {
        answered: bool,
    },
    /// Its future is gone: a late grant is released straight away.
    Abandoned,
}

pub(super) struct SessionState {
    pub(super) flow: Flow,
    /// Our messages that may still hold their send queue slots.
    pub(super) slots: MessageSlots,
    pub(super) peer: Hello,
    pub(super) outbox: VecDeque<Control>,
    /// Receives to post again, in order (a region to reuse, or `None`:
    /// allocate one), each with whether its message was an ack; counted
    /// as processed only once posted, so the peer never sends into a
    /// missing receive.
    pub(super) reposts: VecDeque<(Option<Region>, bool)>,
    pub(super) messages: VecDeque<(Region, Option<u32>)>,
    pub(super) write_imms: VecDeque<u32>,
    pub(super) lent_to_us: VecDeque<Arrived>,
    /// Regions handed back to our user, each with the share of the peer's
    /// quota it still counts for (a granted one, until our user takes it).
    pub(super) returned: VecDeque<(Region, u64)>,
    /// What `returned` counts against the peer's quota.
    pub(super) returned_bytes: u64,
    pub(super) lent: HashMap<u64, Lent>,
    pub(super) lent_bytes: u64,
    /// Regions admitted and not yet made or refused (with the granter),
    /// and their charge against the peer's quota.
    pub(super) granting: usize,
    pub(super) granting_bytes: u64,
    /// What this session last added to the host's count of what peers
    /// hold ([`HostShared::held_by_peers`](super::host::HostShared)).
    pub(super) reported_held: u64,
    /// Regions our user lent whose lease ended after their descriptor
    /// went: the peer may still keep them waiting for its user, until it
    /// hands them back.
    pub(super) lent_expired: HashSet<u64>,
    /// Regions our user is lending whose registration is under way
    /// (outside the lock): counted with those lent.
    pub(super) lending: usize,
    pub(super) next_region: u64,
    pub(super) requests: HashMap<u64, Request>,
    pub(super) next_request: u64,
    pub(super) failure: Option<SessionError>,
    /// Our user closed the session (the close message is queued).
    pub(super) closing: bool,
    /// When our close message completed (or could not go).
    pub(super) close_done: bool,
    pub(super) close_deadline: Option<Instant>,
    pub(super) peer_closed: bool,
    /// When the handshake's socket was first seen closed (the completions
    /// queued then may not all have been handled yet).
    pub(super) watch_ended: Option<Instant>,
    waiters: Vec<Waker>,
}

impl SessionState {
    pub(super) fn new(own: Hello, peer: Hello) -> SessionState {
        // Both sides count with the smaller depth: each side's send queue
        // has room for its own depth of messages, and a deep peer's
        // receives must not let a shallow side's messages take the slots
        // its data operations were promised. The same on both sides, so
        // each one's acks still come as often as the other's limit needs
        // (see `flow`). A window stays below the depth it is counted in.
        let depth = own.recv_depth.min(peer.recv_depth);
        let window = |w: u16| u32::from(w.min(depth - 1));
        SessionState {
            // Our sends are bounded by the peer's receives and window.
            flow: Flow::new(
                u32::from(depth),
                window(peer.user_window),
                u32::from(depth),
                window(own.user_window),
            ),
            slots: MessageSlots::new(super::send_slots::message_slots(own.recv_depth) as usize),
            peer,
            outbox: VecDeque::new(),
            reposts: VecDeque::new(),
            messages: VecDeque::new(),
            write_imms: VecDeque::new(),
            lent_to_us: VecDeque::new(),
            returned: VecDeque::new(),
            returned_bytes: 0,
            lent: HashMap::new(),
            lent_bytes: 0,
            granting: 0,
            granting_bytes: 0,
            reported_held: 0,
            lent_expired: HashSet::new(),
            lending: 0,
            next_region: 1,
            requests: HashMap::new(),
            next_request: 1,
            failure: None,
            closing: false,
            close_done: false,
            close_deadline: None,
            peer_closed: false,
            watch_ended: None,
            waiters: Vec::new(),
        }
    }

    /// Registers `cx`'s waker for the next change.
    pub(super) fn wait(&mut self, cx: &Context<'_>) {
        crate::wakers::register(&mut self.waiters, cx.waker(), |full| {
            crate::wakers::wake_now_or_later(full)
        });
    }

    /// Wakes everyone waiting for a change.
    pub(super) fn changed(&mut self) {
        crate::wakers::wake_now_or_later(self.waiters.drain(..));
    }

    /// Takes allocation request `request` out of the outbox if flow
    /// control still holds it there: whether it was. A request withdrawn
    /// so is never answered, and the peer registers no memory for nobody.
    pub(super) fn withdraw_request(&mut self, request: u64) -> bool {
        let queued = self.outbox.len();
        self.outbox
            .retain(|c| !matches!(*c, Control::AllocRequest { request: r, .. } if r == request));
        self.outbox.len() < queued
    }

    /// Records the session's first failure; later ones add nothing.
    pub(super) fn fail(&mut self, e: SessionError) {
        if self.failure.is_none() {
            self.failure = Some(e);
        }
        self.changed();
    }

    /// Why nothing new may start, if so.
    pub(super) fn refusal(&self) -> Option<SessionError> {
        if let Some(e) = &self.failure {
            return Some(e.duplicate());
        }
        if self.closing {
            return Some(SessionError::Closed("closed here"));
        }
        if self.peer_closed {
            return Some(SessionError::Closed("the peer closed the session"));
        }
        None
    }

    /// Unread user items (messages and immediates): at most our window.
    pub(super) fn unread(&self) -> usize {
        self.messages.len() + self.write_imms.len()
    }
}

/// A session as the pump and the user's handle share it.
pub(super) struct SessionShared<Q: QueuePair + Send + 'static> {
    pub(super) host: Arc<HostShared<Q>>,
    pub(super) qp: AsyncQp<Q>,
    /// Tells this session's remote regions from any other's.
    pub(super) token: u64,
    pub(super) state: Mutex<SessionState>,
    /// The handshake's socket, kept open by both sides while connected:
    /// its end of file says the peer's process is gone.
    pub(super) watch: Option<TcpStream>,
}

impl<Q: QueuePair + Send + 'static> SessionShared<Q> {
    pub(super) fn lock(&self) -> MutexGuard<'_, SessionState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether a message of ours may take a send queue slot now; if not,
    /// the pump looks again for a waiting user.
    pub(super) fn message_slot_free(&self, st: &mut SessionState) -> bool {
        let stats = self.qp.stats();
        // Room in the send queue itself (its depth less the ring's
        // teardown marker): data operations beyond `max_send_wr` take the
        // places kept for messages, and a message then waits for one
        // rather than being refused.
        let depth = u64::from(self.host.config.qp_config().max_send_wr - 1);
        let room = stats.is_none_or(|s| s.sends_pushed - s.sends_done < depth);
        let free = room && st.slots.free(|| stats.map(|s| s.sends_done));
        st.slots.waited |= !free;
        free
    }

    /// After a message of ours completed: sends complete in order, so the
    /// oldest slot held is free now. A user message waiting for one looks
    /// again, and the pump runs if its own messages wait, rather than at
    /// its next turn (up to 10 ms later).
    pub(super) fn message_done(&self) {
        let mut st = self.lock();
        if std::mem::take(&mut st.slots.waited) {
            st.changed();
        }
        let pump_work = !st.outbox.is_empty() || st.flow.wants_ack();
        drop(st);
        if pump_work {
            self.host.nudge();
        }
    }

    /// Counts a message of ours that just went (after the sends pushed
    /// so far: those since can only place it later).
    pub(super) fn message_went(&self, st: &mut SessionState) {
        let at = self.qp.stats().map_or(0, |s| s.sends_pushed);
        st.slots.took(at);
    }
}

/// Hands a peer's region back (a [`Control::Return`] or
/// [`Control::Release`]) when its [`RemoteRegion`](super::RemoteRegion)
/// goes, without naming the backend.
pub(super) trait ReturnSink: Send + Sync {
    /// Queues `message`; on a session that failed or was closed (here or
    /// by the peer, who took back all it lent) nothing goes, and the
    /// error says why.
    fn give_back(&self, message: Control) -> Result<(), SessionError>;
}

impl<Q: QueuePair + Send + 'static> ReturnSink for SessionShared<Q> {
    fn give_back(&self, message: Control) -> Result<(), SessionError> {
        let mut st = self.lock();
        if let Some(e) = st.refusal() {
            return Err(e);
        }
        st.outbox.push_back(message);
        drop(st);
        self.host.nudge();
        Ok(())
    }
}

impl<Q: QueuePair + Send + 'static> Drop for SessionShared<Q> {
    fn drop(&mut self) {
        // What the session held goes with it (its regions are freed or
        // leaked with its state).
        let st = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        let reported = std::mem::take(&mut st.reported_held);
        self.host
            .held_by_peers
            .fetch_sub(reported, std::sync::atomic::Ordering::AcqRel);
    }
}
