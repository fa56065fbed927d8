//! [`Session`]: one peer — its memory regions, messages and verbs.

use std::alloc::Layout;
use std::fmt;
use std::sync::{Arc, Weak};
use std::task::Poll;
use std::time::Instant;

use super::host::SessionHost;
use super::remote_region::RemoteRegion;
use super::state::{Arrived, Request, ReturnSink, SessionShared, SessionState};
use super::wire::{Control, Kind, Trailer, MAX_ALIGN, TRAILER_LEN};
use super::SessionError;
use crate::backend::QueuePair;
use crate::buf::{
    BaseBuf, ExposedBuf, IoBuf, IoBufMut, Region, RemoteAccess, RemoteSlice, RemoteWord, SgList,
    Slice, Word,
};
use crate::future::OpFuture;
use crate::op;

/// A user message's buffers on the wire: the payload, then the trailer.
type MessageList = SgList<[Slice<Region>; 2]>;

/// A connection to one peer: allocate memory, lend and borrow regions,
/// exchange messages, and read, write or run atomics on the peer's memory.
/// Every method takes `&self`: share a session between tasks (in an `Arc`)
/// freely. Dropping it closes it: the peer is told, and what it holds of
/// ours is revoked.
///
/// See the [module docs](super) for an example.
pub struct Session<Q: QueuePair + Send + 'static> {
    pub(super) shared: Arc<SessionShared<Q>>,
    host: SessionHost<Q>,
}

impl<Q: QueuePair + Send + 'static> Session<Q> {
    pub(super) fn new(shared: Arc<SessionShared<Q>>, host: SessionHost<Q>) -> Self {
        Session { shared, host }
    }

    /// The host this session lives on (its allocator, its other sessions).
    pub fn host(&self) -> &SessionHost<Q> {
        &self.host
    }

    /// Runs `f` on the session's queue pair (its endpoint, its state, a
    /// soft device's fault injection); `None` once the session is closed.
    /// `f` runs with the host's ring locked: it must not call this
    /// session, its host, or any of their sessions.
    pub fn with_queue_pair<R>(&self, f: impl FnOnce(&Q) -> R) -> Option<R> {
        let handle = self.shared.qp.handle();
        self.shared
            .host
            .ring
            .with_ring(|ring| ring.qp_of(handle).map(f))
    }

    /// Largest message the peer accepts.
    pub fn max_message(&self) -> u32 {
        self.shared.lock().peer.max_message
    }

    /// Why the session failed, if it did.
    pub fn failure(&self) -> Option<SessionError> {
        self.shared
            .lock()
            .failure
            .as_ref()
            .map(SessionError::duplicate)
    }

    /// Registered memory for `layout`, from the host's arenas (no
    /// registration per allocation). Its bytes are whatever the arena held.
    pub fn alloc_local_mr(&self, layout: Layout) -> Result<Region, SessionError> {
        Ok(self.host.regions().alloc(layout)?)
    }

    /// Like [`alloc_local_mr`](Self::alloc_local_mr), zeroed.
    pub fn alloc_local_mr_zeroed(&self, layout: Layout) -> Result<Region, SessionError> {
        Ok(self.host.regions().alloc_zeroed(layout)?)
    }

    /// Asks the peer to allocate a region for `layout` and lend it to us
    /// with read and write rights; waits up to the configured
    /// `request_timeout`.
    ///
    /// A request whose wait ended (timed out, or its future dropped)
    /// stays open until the peer answers it, so that a late grant goes
    /// back at once. While 4096 are open, a new request fails at once
    /// with [`SessionError::TooManyRequests`]: a peer that never answers
    /// cannot make the session grow without bound.
    pub async fn request_remote_mr(&self, layout: Layout) -> Result<RemoteRegion, SessionError> {
        self.request_remote_mr_with(layout, RemoteAccess::READ | RemoteAccess::WRITE)
            .await
    }

    /// Like [`request_remote_mr`](Self::request_remote_mr), with `rights`
    /// (the peer refuses rights beyond its `max_remote_rights`).
    pub async fn request_remote_mr_with(
        &self,
        layout: Layout,
        rights: RemoteAccess,
    ) -> Result<RemoteRegion, SessionError> {
        if layout.size() == 0 || rights.is_empty() {
            return Err(crate::Error::EmptyBuffer.into());
        }
        if layout.align() > MAX_ALIGN as usize {
            return Err(
                crate::Error::Incompatible("a remote region's alignment is at most 4096").into(),
            );
        }
        let config = self.host.config();
        let request = {
            let mut st = self.shared.lock();
            if let Some(e) = st.refusal() {
                return Err(e);
            }
            let max = super::pump::MAX_OPEN_REQUESTS;
            if st.requests.len() >= max {
                return Err(SessionError::TooManyRequests { max });
            }
            let request = st.next_request;
            st.next_request += 1;
            let waiting = Request::Waiting {
                deadline: Instant::now().checked_add(config.request_timeout),
                size: layout.size() as u64,
                rights,
            };
            st.requests.insert(request, waiting);
            st.outbox.push_back(Control::AllocRequest {
                request,
                size: layout.size() as u64,
                align: layout.align() as u32,
                rights,
            });
            request
        };
        self.shared.host.nudge();
        // Whatever ends the wait (an answer, a timeout, a dropped future),
        // the guard leaves the request's entry as a late answer needs.
        let _guard = AbandonOnDrop {
            shared: &self.shared,
            request,
        };
        let timeout = config.request_timeout;
        let answer = self
            .wait(|st| match st.requests.get(&request) {
                // A grant that came before the peer closed (or the session
                // failed) was taken back with everything else.
                Some(Request::Done(_)) if st.peer_closed || st.failure.is_some() => {
                    st.requests.remove(&request);
                    st.refusal().map(Err)
                }
                Some(Request::Done(_)) => match st.requests.remove(&request) {
                    Some(Request::Done(answer)) => Some(answer),
                    _ => unreachable!("just matched"),
                },
                Some(Request::TimedOut { .. }) => Some(Err(SessionError::Timeout(timeout))),
                // A peer that closed or failed will not answer.
                _ => st.refusal().map(Err),
            })
            .await;
        answer.map(|descriptor| self.remote_region(descriptor))
    }

    /// Lends `region` to the peer with exactly `rights`: it gets a
    /// registration of its own, and the peer receives it with
    /// [`receive_remote_mr`](Self::receive_remote_mr). It is ours again
    /// ([`receive_local_mr`](Self::receive_local_mr)) when the peer hands
    /// it back or the lease ends. If it cannot be lent, it comes back with
    /// the error: [`SessionError::TooManyLent`] while 1024 regions this
    /// side lent are not back (a peer keeps that many at most waiting
    /// for its user to receive them).
    pub fn send_local_mr(
        &self,
        region: Region,
        rights: RemoteAccess,
    ) -> Result<(), (SessionError, Region)> {
        {
            let mut st = self.shared.lock();
            if let Some(e) = st.refusal() {
                return Err((e, region));
            }
            // Those not yet back (lent, being registered, or taken back at
            // the end of a lease but not yet handed back by the peer)
            // include every one the peer's user has not received, which
            // the peer counts against the same limit.
            let max = super::pump::MAX_PENDING_LENDS;
            let out = st.lent.values().filter(|lent| !lent.granted).count();
            if out + st.lending + st.lent_expired.len() >= max {
                return Err((SessionError::TooManyLent { max }, region));
            }
            st.lending += 1;
        }
        // Registering pins every page, in time that grows with the
        // region: done without the session's lock, which the pump takes
        // in turn for every session of the host.
        let registered = ExposedBuf::new(&*self.shared.host.pd, region, rights);
        let mut st = self.shared.lock();
        st.lending -= 1;
        let exposed = match registered {
            Ok(exposed) => exposed,
            Err(rejected) => {
                let (e, region) = rejected.into_parts();
                return Err((e.into(), region));
            }
        };
        if let Some(e) = st.refusal() {
            // The session ended meanwhile: nothing goes, and the region
            // comes back unregistered. If the device will not deregister
            // it, it stays with the session (never sent; freed, or leaked,
            // when the session goes) and there is nothing to hand back.
            drop(st);
            return match exposed.into_inner() {
                Ok(region) => Err((e, region)),
                Err(rejected) => {
                    let mut st = self.shared.lock();
                    let (_, exposed) = rejected.into_parts();
                    let lease = self.host.config().lease;
                    let _ = super::pump::lend(&mut st, exposed, lease, false, 0);
                    Ok(())
                }
            };
        }
        let charge = exposed.len() as u64;
        let descriptor =
            super::pump::lend(&mut st, exposed, self.host.config().lease, false, charge);
        self.shared.host.report_held(&mut st);
        st.outbox.push_back(Control::Lend(descriptor));
        drop(st);
        self.shared.host.nudge();
        Ok(())
    }

    /// The next region the peer lent us. Once the peer closed the session
    /// (or it failed), none: the peer took back all it lent.
    pub async fn receive_remote_mr(&self) -> Result<RemoteRegion, SessionError> {
        let descriptor = self
            .wait(|st| match st.refusal() {
                Some(e) => Some(Err(e)),
                None => st.lent_to_us.pop_front().map(Ok),
            })
            .await?;
        Ok(self.remote_region(descriptor))
    }

    /// Hands a region of the peer's back to the peer's user, who takes it
    /// with [`receive_local_mr`](Self::receive_local_mr). A region of
    /// another session's peer is refused ([`SessionError::WrongSession`])
    /// and handed back through its own session all the same. On a session
    /// that failed or is closed (here or by the peer) nothing goes, and
    /// the error says why: the peer took back all it lent when the
    /// session ended.
    pub fn send_remote_mr(&self, region: RemoteRegion) -> Result<(), SessionError> {
        let own = region.token() == self.shared.token;
        let handed = region.hand_back();
        if own {
            handed
        } else {
            Err(SessionError::WrongSession)
        }
    }

    /// The next region of ours the peer handed back with
    /// [`send_remote_mr`](Self::send_remote_mr) (or one our user lent, once
    /// the peer released it or its lease ended), no longer reachable by
    /// the peer. A region the peer asked us for and handed back counts
    /// against its [`max_remote_total`](super::SessionConfig::max_remote_total)
    /// until it is taken here.
    pub async fn receive_local_mr(&self) -> Result<Region, SessionError> {
        self.wait(|st| match st.returned.pop_front() {
            Some((region, charge)) => {
                st.returned_bytes -= charge;
                self.shared.host.report_held(st);
                Some(Ok(region))
            }
            None => st.refusal().map(Err),
        })
        .await
    }

    /// Sends `msg` (at most [`max_message`](Self::max_message) bytes);
    /// waits while the peer's user has a window of messages unread. The
    /// buffer comes back with the result.
    pub async fn send(&self, msg: Slice<Region>) -> (Result<(), SessionError>, Slice<Region>) {
        self.send_message(msg, None).await
    }

    /// [`send`](Self::send) with immediate data.
    pub async fn send_with_imm(
        &self,
        msg: Slice<Region>,
        imm: u32,
    ) -> (Result<(), SessionError>, Slice<Region>) {
        self.send_message(msg, Some(imm)).await
    }

    async fn send_message(
        &self,
        msg: Slice<Region>,
        imm: Option<u32>,
    ) -> (Result<(), SessionError>, Slice<Region>) {
        let max = self.max_message();
        if msg.len() > max as usize {
            let len = msg.len();
            return (Err(SessionError::TooLarge { len, max }), msg);
        }
        let mut msg = Some(msg);
        let pushed = self
            .when_window_open(|st| self.push_message(st, &mut msg, imm))
            .await
            .and_then(|pushed| pushed);
        match pushed {
            Ok(op) => {
                let (result, list) = op.await;
                self.shared.message_done();
                let [msg, _trailer] = list.into_inner();
                (result.map(|_| ()).map_err(SessionError::from), msg)
            }
            Err(e) => (Err(e), msg.expect("not pushed")),
        }
    }

    /// Pushes the message in `msg` (taking it) with its trailer.
    fn push_message(
        &self,
        st: &mut SessionState,
        msg: &mut Option<Slice<Region>>,
        imm: Option<u32>,
    ) -> Result<OpFuture<Q, MessageList>, SessionError> {
        let (processed, taken) = st.flow.counts();
        let trailer = Trailer {
            kind: Kind::User,
            processed,
            taken,
        };
        let layout = Layout::from_size_align(TRAILER_LEN, 8).expect("a small layout");
        let mut tail = self.host.regions().alloc(layout)?;
        tail.copy_from_slice(&trailer.encode());
        let list = [msg.take().expect("one push"), tail.slice(..)];
        let op = match imm {
            Some(imm) => self.shared.qp.op(op::SendImm::gather(list, imm)),
            None => self.shared.qp.op(op::Send::gather(list)),
        };
        if !op.was_refused() {
            st.flow.sent(true);
            self.shared.message_went(st);
        }
        Ok(op)
    }

    /// The next message the peer sent: a region holding exactly its bytes.
    pub async fn receive(&self) -> Result<Region, SessionError> {
        self.receive_with_imm().await.map(|(region, _)| region)
    }

    /// The next message with its immediate data, if it had some.
    pub async fn receive_with_imm(&self) -> Result<(Region, Option<u32>), SessionError> {
        self.take(|st| st.messages.pop_front()).await
    }

    /// The immediate data of the peer's next WRITE with immediate.
    pub async fn receive_write_imm(&self) -> Result<u32, SessionError> {
        self.take(|st| st.write_imms.pop_front()).await
    }

    /// Takes a user item; our user took it, so the peer may send another.
    async fn take<T>(
        &self,
        mut pop: impl FnMut(&mut SessionState) -> Option<T>,
    ) -> Result<T, SessionError> {
        let item = self
            .wait(|st| match pop(st) {
                Some(item) => {
                    st.flow.taken_one();
                    Some(Ok((item, st.flow.wants_ack())))
                }
                None => st.refusal().map(Err),
            })
            .await;
        item.map(|(item, ack)| {
            if ack {
                self.shared.host.nudge();
            }
            item
        })
    }

    /// RDMA READ of the start of `remote` into `buf`.
    pub fn read<B: IoBufMut>(&self, buf: B, remote: RemoteSlice) -> OpFuture<Q, B> {
        self.shared.qp.read(buf, remote)
    }

    /// RDMA WRITE of `buf` to the start of `remote`.
    pub fn write<B: IoBuf>(&self, buf: B, remote: RemoteSlice) -> OpFuture<Q, B> {
        self.shared.qp.write(buf, remote)
    }

    /// RDMA WRITE with immediate data: the peer learns `imm` from
    /// [`receive_write_imm`](Self::receive_write_imm). Like a message, it
    /// waits while the peer's user has a window unread.
    pub async fn write_with_imm<B: IoBuf>(
        &self,
        buf: B,
        remote: RemoteSlice,
        imm: u32,
    ) -> (Result<usize, SessionError>, B) {
        let mut buf = Some(buf);
        let pushed = self
            .when_window_open(|st| {
                let op = self
                    .shared
                    .qp
                    .write_imm(buf.take().expect("one push"), remote, imm);
                if !op.was_refused() {
                    st.flow.sent_write_imm();
                    self.shared.message_went(st);
                }
                op
            })
            .await;
        match pushed {
            Ok(op) => {
                let (result, buf) = op.await;
                self.shared.message_done();
                (result.map_err(SessionError::from), buf)
            }
            Err(e) => (Err(e), buf.expect("not pushed")),
        }
    }

    /// Compare-and-swap on a remote word; the old value lands in `word`.
    pub fn atomic_cas<B: BaseBuf + IoBufMut>(
        &self,
        word: Word<B>,
        remote: RemoteWord,
        compare: u64,
        swap: u64,
    ) -> OpFuture<Q, Word<B>> {
        self.shared.qp.compare_swap(word, remote, compare, swap)
    }

    /// Fetch-and-add on a remote word; the old value lands in `word`.
    pub fn fetch_add<B: BaseBuf + IoBufMut>(
        &self,
        word: Word<B>,
        remote: RemoteWord,
        add: u64,
    ) -> OpFuture<Q, Word<B>> {
        self.shared.qp.fetch_add(word, remote, add)
    }

    /// Closes the session (as dropping it does). A close message goes to
    /// the peer, which sees [`SessionError::Closed`] after what was sent
    /// before it; the queue pair goes once the device acknowledges the
    /// close, or after [`SessionConfig::close_grace`] if it never does
    /// (at once if the peer closed first).
    ///
    /// [`SessionConfig::close_grace`]: super::SessionConfig::close_grace
    pub fn close(self) {}

    fn remote_region(&self, arrived: Arrived) -> RemoteRegion {
        let weak: Weak<SessionShared<Q>> = Arc::downgrade(&self.shared);
        let sink: Weak<dyn ReturnSink> = weak;
        RemoteRegion::new(arrived, sink, self.shared.token)
    }

    /// Waits until the peer's user window has room (or the session cannot
    /// go on), then runs `push` under the session's lock, so that what it
    /// counts and posts goes out in the order counted.
    async fn when_window_open<T>(
        &self,
        mut push: impl FnMut(&mut SessionState) -> T,
    ) -> Result<T, SessionError> {
        self.wait(|st| {
            if let Some(e) = st.refusal() {
                return Some(Err(e));
            }
            let go = st.flow.can_send_user() && self.shared.message_slot_free(st);
            go.then(|| Ok(push(st)))
        })
        .await
    }

    /// Waits until `ready` gives something, looking again at every change.
    async fn wait<T>(&self, mut ready: impl FnMut(&mut SessionState) -> Option<T>) -> T {
        std::future::poll_fn(|cx| {
            let mut st = self.shared.lock();
            match ready(&mut st) {
                Some(t) => Poll::Ready(t),
                None => {
                    st.wait(cx);
                    Poll::Pending
                }
            }
        })
        .await
    }
}

/// When a request's wait ends: a request still unanswered is marked
/// abandoned (a late grant is then released straight away), a grant nobody
/// took goes back at once, and answered entries go.
struct AbandonOnDrop<'a, Q: QueuePair + Send + 'static> {
    shared: &'a SessionShared<Q>,
    request: u64,
}

impl<Q: QueuePair + Send + 'static> Drop for AbandonOnDrop<'_, Q> {
    fn drop(&mut self) {
        let mut st = self.shared.lock();
        let waiting = matches!(
            st.requests.get(&self.request),
            Some(Request::Waiting { .. })
        );
        if waiting && st.withdraw_request(self.request) {
            // Never sent: no answer will come to release.
            st.requests.remove(&self.request);
            return;
        }
        match st.requests.get(&self.request) {
            Some(Request::Waiting { .. } | Request::TimedOut { answered: false }) => {
                st.requests.insert(self.request, Request::Abandoned);
            }
            None | Some(Request::Abandoned) => {}
            Some(Request::Done(Ok(_))) => {
                if let Some(Request::Done(Ok(d))) = st.requests.remove(&self.request) {
                    st.outbox.push_back(Control::Release {
                        id: d.descriptor.id,
                    });
                    drop(st);
                    self.shared.host.nudge();
                }
            }
            _ => {
                st.requests.remove(&self.request);
            }
        }
    }
}

impl<Q: QueuePair + Send + 'static> Drop for Session<Q> {
    fn drop(&mut self) {
        let mut st = self.shared.lock();
        if !st.closing {
            st.closing = true;
            if st.failure.is_none() {
                st.outbox.push_back(Control::Close);
                st.close_deadline = Instant::now().checked_add(self.host.config().close_grace);
            }
            st.changed();
        }
        drop(st);
        self.shared.host.nudge();
    }
}

impl<Q: QueuePair + Send + 'static> fmt::Debug for Session<Q> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let st = self.shared.lock();
        f.debug_struct("Session")
            .field("qp", &self.shared.qp.handle())
            .field("in_flight", &st.flow.in_flight())
            .field("failure", &st.failure)
            .finish_non_exhaustive()
    }
}
