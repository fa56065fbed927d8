//! The pump: one thread per host that takes every session's receives off
//! the ring, answers control messages, reposts receives, sends what the
//! outboxes hold as flow control allows, and keeps time (leases, request
//! timeouts, dead peers, closes).

use std::alloc::Layout;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use futures_core::Stream;

use super::granter::Wanted;
use super::host::{HostShared, CLOSE, CONTROL, RECV};
use super::state::{Arrived, Lent, Request, SessionShared, SessionState};
use super::wire::{self, Control, Message, RefuseReason, RegionDescriptor};
use super::SessionError;
use crate::backend::{QueuePair, WcStatus};
use crate::buf::{ExposedBuf, Region};
use crate::op::Send;
use crate::ring::Completion;
use crate::thread_waker::ThreadWaker;

/// How often the pump looks at the clock when nothing happens.
const TICK: Duration = Duration::from_millis(10);
/// Completions handled before the outboxes get a turn.
const BATCH: usize = 64;
/// How long after the end of a peer's handshake socket was seen a busy
/// host still gives its last messages to come in.
const WATCH_GRACE: Duration = Duration::from_millis(100);
/// Regions lent to us and not yet taken by our user, at most (and so
/// regions our user lends and has not had back, at most).
pub(super) const MAX_PENDING_LENDS: usize = 1024;

/// Regions granted to the peer at once, at most, counting those it handed
/// back that our user has not taken yet: each lent one is a registration
/// of its own, so a peer asking for many tiny regions is refused long
/// before the device's table of them fills, and one that asks and hands
/// back in a loop cannot pile up entries for our user without bound.
const MAX_LENT_REGIONS: usize = 4096;
/// Our allocation requests open at once, at most (the peer would refuse
/// grants beyond its `MAX_LENT_REGIONS` anyway): entries of requests
/// nobody waits for any more stay until the peer answers, and a peer that
/// never does must not grow the map without bound.
pub(super) const MAX_OPEN_REQUESTS: usize = MAX_LENT_REGIONS;

pub(super) fn pump_loop<Q: QueuePair + std::marker::Send + 'static>(host: &Arc<HostShared<Q>>) {
    let waker = Waker::from(Arc::new(ThreadWaker(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut completions = host.ring.completions();
    // Popped from the front: a turn cut short by a panic leaves the rest
    // for the next.
    let mut batch: std::collections::VecDeque<Completion> =
        std::collections::VecDeque::with_capacity(BATCH);
    let mut last_tick = Instant::now();
    loop {
        // Every session of the host relies on this thread, which runs
        // user code: the wakers of tasks waiting on sessions and on the
        // ring, and the drops of buffers whose futures went. One that
        // panics must not stop it (the panic hook has told of it). The
        // session wakers wait until the turn is over, so a panic among
        // them cannot cut a session's update short.
        let turn = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _deferral = crate::wakers::Deferral::start();
            let mut ended = false;
            while batch.len() < BATCH {
                match Pin::new(&mut completions).poll_next(&mut cx) {
                    Poll::Ready(Some(c)) => batch.push_back(c),
                    Poll::Ready(None) => {
                        ended = true;
                        break;
                    }
                    Poll::Pending => break,
                }
            }
            let busy = batch.len() == BATCH;
            while let Some(c) = batch.pop_front() {
                on_completion(host, c);
            }
            let now = Instant::now();
            let tick = now.duration_since(last_tick) >= TICK;
            if tick {
                last_tick = now;
                forward_events(host);
            }
            // A failed ring (its completion queue or device) gives no
            // completion more: a session waiting for one would wait for
            // ever, so each fails now.
            let ring_failed = if tick {
                host.ring.with_ring(|r| r.failure())
            } else {
                None
            };
            let sessions: Vec<_> = host.sessions().live.values().cloned().collect();
            for s in &sessions {
                service(host, s, now, tick, ring_failed, !busy);
            }
            if let Err(e) = host.ring.submit() {
                refused(host, &e);
            }
            let abandoned = host.abandoned.load(std::sync::atomic::Ordering::Acquire);
            (
                ended || (abandoned && host.sessions().live.is_empty()),
                busy,
            )
        }));
        let (stop, busy) = turn.unwrap_or((false, true));
        if stop {
            break;
        }
        if !busy {
            std::thread::park_timeout(TICK);
        }
    }
    host.pump.lock().unwrap_or_else(|p| p.into_inner()).take();
    host.events.lock().unwrap_or_else(|p| p.into_inner()).stop();
}

pub(super) fn on_completion<Q: QueuePair + std::marker::Send + 'static>(
    host: &HostShared<Q>,
    c: Completion,
) {
    let Some(qp) = c.qp() else { return };
    let s = {
        let mut sessions = host.sessions();
        match sessions.live.get(&qp) {
            Some(s) => Arc::clone(s),
            None => {
                if let Some(early) = sessions.preparing.get_mut(&qp) {
                    early.push(c);
                }
                return; // or a session already gone: its buffers go with `c`
            }
        }
    };
    on_message(host, &s, c);
}

/// Handles a completion of session `s`'s queue pair.
pub(super) fn on_message<Q: QueuePair + std::marker::Send + 'static>(
    host: &HostShared<Q>,
    s: &Arc<SessionShared<Q>>,
    c: Completion,
) {
    match c.user_data() {
        RECV => on_receive(host, s, c),
        CLOSE => s.lock().close_done = true,
        CONTROL => {
            if let Err(e) = c.result() {
                let why = format!("a control message could not go: {e}");
                break_session(host, s, &mut s.lock(), SessionError::Disconnected(why));
            }
        }
        _ => {}
    }
}

fn on_receive<Q: QueuePair + std::marker::Send + 'static>(
    host: &HostShared<Q>,
    s: &Arc<SessionShared<Q>>,
    c: Completion,
) {
    let result = c.result();
    let (status, imm, write_imm) = (c.status(), c.imm(), c.is_write_imm());
    let Ok(region) = c.into_buf().downcast::<Region>() else {
        return;
    };
    let mut st = s.lock();
    let len = match result {
        Ok(len) => len,
        Err(_) if status == WcStatus::LocLenErr => {
            // The hello said how large a message may be.
            if st.failure.is_none() {
                let why = format!(
                    "a message longer than its receive buffer's {} bytes",
                    region.len()
                );
                break_session(host, s, &mut st, SessionError::Protocol(why));
            }
            return;
        }
        Err(e) => {
            if st.failure.is_none() {
                let why = match host.ring.with_ring(|r| r.qp_error(s.qp.handle())) {
                    Some(status) => format!("the queue pair failed ({status})"),
                    None => format!("a receive failed: {e}"),
                };
                break_session(host, s, &mut st, SessionError::Disconnected(why));
            }
            return;
        }
    };
    if st.failure.is_some() {
        return;
    }
    match receive(host, s, &mut st, region, len, imm, write_imm) {
        Ok((repost, ack)) => {
            st.reposts.push_back((repost.ok(), ack));
            repost_owed(host, s, &mut st);
            if st.peer_closed {
                // Nothing of ours is the peer's any more.
                reclaim_all(&mut st);
            }
            st.changed();
        }
        Err(why) => break_session(host, s, &mut st, SessionError::Protocol(why)),
    }
}

/// Posts the receives owed, in order, as memory and the queues allow
/// (what cannot go now is tried again on the next pass).
fn repost_owed<Q: QueuePair + std::marker::Send + 'static>(
    host: &HostShared<Q>,
    s: &SessionShared<Q>,
    st: &mut SessionState,
) {
    while let Some((region, ack)) = st.reposts.pop_front() {
        let region = match region.map_or_else(|| host.recv_region(), Ok) {
            Ok(region) => region,
            Err(_) => {
                st.reposts.push_front((None, ack)); // out of memory: later
                return;
            }
        };
        match host.post_recv(s.qp.handle(), region) {
            Ok(()) => st.flow.processed_one(ack),
            // The host's queues are full, or its slab holds finished work
            // nobody collected yet (another session's futures, say): this
            // session's receive waits for room, it is not at fault.
            Err((
                crate::Error::CompletionQueueFull { .. } | crate::Error::Unclaimed(_),
                region,
            )) => {
                st.reposts.push_front((Some(region), ack));
                return;
            }
            Err((e, _)) => {
                let why = format!("could not post a receive again: {e}");
                break_session(host, s, st, SessionError::Disconnected(why));
                return;
            }
        }
    }
}

/// Ends session `s` for `e`: records it (waking every waiter), moves its
/// queue pair to error, so that its work and the peer's fail rather than
/// wait, and takes back what the peer held of ours.
fn break_session<Q: QueuePair + std::marker::Send + 'static>(
    host: &HostShared<Q>,
    s: &SessionShared<Q>,
    st: &mut SessionState,
    e: SessionError,
) {
    st.fail(e);
    st.outbox.clear();
    reclaim_all(st);
    let _ = host.ring.with_ring(|mut r| r.fail_qp(s.qp.handle()));
}

/// Takes back every region the peer holds of ours.
fn reclaim_all(st: &mut SessionState) {
    let lent: Vec<_> = st.lent.drain().map(|(_, l)| l).collect();
    for l in lent {
        reclaim(st, l, false);
    }
}

/// Handles one arrived message; returns the region to post again, and
/// whether the message was an ack.
fn receive<Q: QueuePair + std::marker::Send + 'static>(
    host: &HostShared<Q>,
    s: &Arc<SessionShared<Q>>,
    st: &mut SessionState,
    mut region: Region,
    len: usize,
    imm: Option<u32>,
    write_imm: bool,
) -> Result<(Result<Region, crate::Error>, bool), String> {
    st.flow.on_arrival()?;
    // As both sides count it: ours, or less against a shallower peer.
    let window = st.flow.own_window() as usize;
    if write_imm {
        if st.unread() >= window {
            return Err(format!(
                "a WRITE with immediate beyond the user window of {window}"
            ));
        }
        st.write_imms.push_back(imm.unwrap_or_default());
        return Ok((Ok(region), false)); // untouched: post it again as it is
    }
    let bytes = region
        .get(..len)
        .ok_or_else(|| format!("the device reported {len} bytes in a smaller buffer"))?;
    let (trailer, message) = wire::decode(bytes).map_err(|e| e.to_string())?;
    st.flow.on_report(trailer.processed, trailer.taken)?;
    match message {
        Message::User(payload) => {
            let n = payload.len();
            // Receive buffers have room for control messages too, so one
            // past our max_message may fit them: the hello's word binds.
            if n > host.config.max_message as usize {
                return Err(format!(
                    "a message of {n} bytes, longer than our max_message of {}",
                    host.config.max_message
                ));
            }
            if st.unread() >= window {
                return Err(format!("a message beyond the user window of {window}"));
            }
            region.truncate(n);
            st.messages.push_back((region, imm));
            Ok((host.recv_region(), false))
        }
        Message::Control(control) => {
            if imm.is_some() {
                return Err("a control message with immediate data".into());
            }
            on_control(host, s, st, control)?;
            Ok((Ok(region), control == Control::Ack))
        }
    }
}

fn on_control<Q: QueuePair + std::marker::Send + 'static>(
    host: &HostShared<Q>,
    s: &Arc<SessionShared<Q>>,
    st: &mut SessionState,
    control: Control,
) -> Result<(), String> {
    match control {
        Control::Ack => {}
        Control::Close => st.peer_closed = true,
        Control::AllocRequest {
            request,
            size,
            align,
            rights,
        } => match admit_grant(host, st, size, align, rights) {
            // Made by the granter: answered once it is.
            Ok((layout, charge)) => {
                // Already in the host's count: `admit_grant` took it.
                st.granting += 1;
                st.granting_bytes += charge;
                let wanted = Wanted {
                    request,
                    layout,
                    rights,
                    charge,
                };
                host.granter.grant(s, st, wanted);
            }
            Err(reason) => st
                .outbox
                .push_back(Control::AllocRefuse { request, reason }),
        },
        Control::AllocGrant { request, region } => match st.requests.get(&request) {
            Some(&Request::Waiting { size, rights, .. }) => {
                if region.remote.len() < size || !region.remote.rights().contains(rights) {
                    return Err(format!(
                        "a grant of {} bytes with {:?} for a request of {size} bytes with {rights:?}",
                        region.remote.len(),
                        region.remote.rights()
                    ));
                }
                st.requests
                    .insert(request, Request::Done(Ok(Arrived::now(region))));
            }
            Some(Request::TimedOut { answered: false }) => {
                st.requests
                    .insert(request, Request::TimedOut { answered: true });
                st.outbox.push_back(Control::Release { id: region.id });
            }
            Some(Request::Abandoned) => {
                st.requests.remove(&request);
                st.outbox.push_back(Control::Release { id: region.id });
            }
            _ => {
                return Err(format!(
                    "a grant for request {request}, which is not waiting"
                ))
            }
        },
        Control::AllocRefuse { request, reason } => match st.requests.get(&request) {
            Some(Request::Waiting { .. }) => {
                st.requests
                    .insert(request, Request::Done(Err(SessionError::Refused(reason))));
            }
            Some(Request::TimedOut { answered: false }) => {
                st.requests
                    .insert(request, Request::TimedOut { answered: true });
            }
            Some(Request::Abandoned) => {
                st.requests.remove(&request);
            }
            _ => {
                return Err(format!(
                    "a refusal of request {request}, which is not waiting"
                ))
            }
        },
        Control::Lend(region) => {
            if st.lent_to_us.len() >= MAX_PENDING_LENDS {
                return Err(format!(
                    "more than {MAX_PENDING_LENDS} regions lent and not received"
                ));
            }
            st.lent_to_us.push_back(Arrived::now(region));
        }
        // The peer cannot hand back what it has not been told of yet: its
        // descriptor still waits here for the peer's window.
        Control::Return { id } | Control::Release { id } if descriptor_unsent(st, id) => {
            return Err(format!(
                "the peer returned region {id}, whose descriptor it has not been sent"
            ))
        }
        Control::Return { id } | Control::Release { id } => match st.lent.remove(&id) {
            Some(lent) => reclaim(st, lent, matches!(control, Control::Return { .. })),
            // Taken back at the end of its lease while coming back (or
            // handed back twice, which cannot be told from it).
            None if (1..st.next_region).contains(&id) => {
                st.lent_expired.remove(&id);
            }
            None => {
                return Err(format!(
                    "the peer returned region {id}, which was never lent"
                ))
            }
        },
    }
    Ok(())
}

/// Whether the peer's request may have a region, with what it takes of
/// the peer's quota: its layout and charge.
fn admit_grant<Q: QueuePair + std::marker::Send + 'static>(
    host: &HostShared<Q>,
    st: &mut SessionState,
    size: u64,
    align: u32,
    rights: crate::buf::RemoteAccess,
) -> Result<(Layout, u64), RefuseReason> {
    let config = &host.config;
    if st.closing {
        return Err(RefuseReason::Closing);
    }
    if size > config.max_remote_region || size > u64::from(u32::MAX) {
        return Err(RefuseReason::TooLarge);
    }
    if !config.max_remote_rights.contains(rights) {
        return Err(RefuseReason::Rights);
    }
    let layout = Layout::from_size_align(size as usize, align as usize)
        .map_err(|_| RefuseReason::TooLarge)?;
    // What the allocator will take, not what was asked: a byte aligned to
    // a page takes a page.
    let charge = crate::buf::footprint(layout).ok_or(RefuseReason::TooLarge)? as u64;
    // Grants being made count as lent.
    let held = st.lent_bytes + st.returned_bytes + st.granting_bytes;
    // Grants handed back carry their charge; our user's own lends, back,
    // carry none (and are bounded on our side).
    let handed_back = st.returned.iter().filter(|(_, charge)| *charge > 0).count();
    let regions = st.lent.len() + handed_back + st.granting;
    if held + charge > config.max_remote_total || regions >= MAX_LENT_REGIONS {
        return Err(RefuseReason::Quota);
    }
    // All peers together keep within the host's grant limit: one peer
    // with many sessions must not take the memory every session needs.
    // The charge is taken from it here, in one step (another session's
    // request may be admitted on another thread at once), and counted as
    // reported: the caller adds it to what is being granted.
    host.report_held(st);
    let limit = host.grant_limit();
    host.held_by_peers
        .fetch_update(
            std::sync::atomic::Ordering::AcqRel,
            std::sync::atomic::Ordering::Acquire,
            |by_all| by_all.checked_add(charge).filter(|&after| after <= limit),
        )
        .map_err(|_| RefuseReason::OutOfMemory)?;
    st.reported_held += charge;
    Ok((layout, charge))
}

/// Records `exposed` as lent to the peer, counting `charge` against its
/// quota; returns its descriptor.
pub(super) fn lend(
    st: &mut SessionState,
    exposed: ExposedBuf<Region>,
    lease: Duration,
    granted: bool,
    charge: u64,
) -> RegionDescriptor {
    let id = st.next_region;
    st.next_region += 1;
    st.lent_bytes += charge;
    let descriptor = RegionDescriptor {
        id,
        remote: exposed.remote(),
        // At least 1: 0 on the wire means no lease at all.
        lease_ms: u32::try_from(lease.as_millis()).unwrap_or(u32::MAX).max(1),
    };
    st.lent.insert(
        id,
        Lent {
            exposed,
            deadline: Instant::now().checked_add(lease),
            granted,
            charge,
        },
    );
    descriptor
}

/// Takes a lent region back: revokes the peer's access, then hands the
/// memory to our user (`returned`, or a region our user lent) or frees it.
/// A granted region the peer handed back counts against its quota until
/// our user takes it: else a peer that asks and hands back in a loop
/// would pile up our memory without bound.
fn reclaim(st: &mut SessionState, lent: Lent, returned: bool) {
    let bytes = lent.exposed.len();
    st.lent_bytes = st.lent_bytes.saturating_sub(lent.charge);
    match lent.exposed.into_inner() {
        Ok(region) if returned || !lent.granted => {
            let charge = if lent.granted { lent.charge } else { 0 };
            st.returned_bytes += charge;
            st.returned.push_back((region, charge));
        }
        Ok(_freed) => {}
        // The device would not deregister: the peer may still reach the
        // memory, so it must never be freed or read; leak it (counted).
        Err(still_exposed) => {
            crate::leak::record_region(bytes);
            std::mem::forget(still_exposed);
        }
    }
}

/// Whether the handshake's socket says the peer is gone; a peer that
/// writes on it (nothing should, once connected) breaks the protocol.
fn peer_gone(socket: &std::net::TcpStream) -> Option<SessionError> {
    match socket.peek(&mut [0u8; 1]) {
        Ok(0) => Some(SessionError::Disconnected(
            "the peer is gone (its end of the handshake's socket closed)".into(),
        )),
        Ok(_) => Some(SessionError::Protocol(
            "the peer wrote on the handshake's socket after connecting".into(),
        )),
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => None,
        Err(e) => Some(SessionError::Disconnected(format!(
            "the handshake's socket failed: {e}"
        ))),
    }
}

/// Timers, liveness, outbox and close of one session; `drained` says
/// this turn took every completion queued.
fn service<Q: QueuePair + std::marker::Send + 'static>(
    host: &HostShared<Q>,
    s: &Arc<SessionShared<Q>>,
    now: Instant,
    tick: bool,
    ring_failed: Option<&'static str>,
    drained: bool,
) {
    let mut st = s.lock();
    if tick {
        if let Some(why) = ring_failed.filter(|_| st.failure.is_none()) {
            let e = SessionError::Disconnected(format!("the host's ring failed: {why}"));
            break_session(host, s, &mut st, e);
        }
        if st.failure.is_none() && !st.closing && !st.peer_closed {
            match s.watch.as_ref().and_then(peer_gone) {
                // The socket's end can overtake the peer's last messages,
                // and a busy turn leaves completions queued: the peer is
                // gone once a turn that took them all came after the end
                // was first seen (its close, if it sent one, is then in),
                // or, on a host kept busy by others, a grace after it.
                Some(SessionError::Disconnected(_))
                    if st
                        .watch_ended
                        .is_none_or(|seen| !drained && now < seen + WATCH_GRACE) =>
                {
                    st.watch_ended.get_or_insert(now);
                }
                Some(e) => break_session(host, s, &mut st, e),
                None => {}
            }
        }
        expire(&mut st, now);
    }
    if st.failure.is_none() {
        repost_owed(host, s, &mut st);
        flush(host, s, &mut st);
    }
    if std::mem::take(&mut st.slots.waited) {
        // A user message waits for a send slot, which comes back as a
        // completion nobody tells us of is reaped: it looks again.
        st.changed();
    }
    // A peer that closed first needs no Close of ours (flush drops it):
    // nothing is left to wait for.
    let close_now = st.closing
        && (st.close_done
            || st.peer_closed
            || st.failure.is_some()
            || st.close_deadline.is_some_and(|d| now >= d));
    // Regions taken back above leave the host's count.
    host.report_held(&mut st);
    drop(st);
    if close_now {
        host.sessions().live.remove(&s.qp.handle());
        let _ = host.ring.with_ring(|mut r| r.detach(s.qp.handle()));
        // What the peer holds of ours is revoked with the session.
        let mut st = s.lock();
        reclaim_all(&mut st);
        host.report_held(&mut st);
        st.changed();
    }
}

/// Ends leases and requests whose time is up.
fn expire(st: &mut SessionState, now: Instant) {
    let expired: Vec<u64> = st
        .lent
        .iter()
        .filter(|(_, l)| l.deadline.is_some_and(|d| now >= d))
        .map(|(&id, _)| id)
        .collect();
    let mut changed = !expired.is_empty();
    for id in expired {
        let lent = st.lent.remove(&id).expect("listed");
        let sent_by_user = !lent.granted;
        reclaim(st, lent, false);
        if !withdraw_unsent(st, id) && sent_by_user {
            // The peer may keep it waiting for its user until that user
            // takes it and hands it back: it still counts against the
            // regions a peer keeps waiting.
            st.lent_expired.insert(id);
        }
    }
    let timed_out: Vec<u64> = st
        .requests
        .iter()
        .filter(|(_, r)| matches!(r, Request::Waiting { deadline: Some(d), .. } if now >= *d))
        .map(|(&id, _)| id)
        .collect();
    for id in timed_out {
        // One still in the outbox is never sent: no answer will come.
        let answered = st.withdraw_request(id);
        st.requests.insert(id, Request::TimedOut { answered });
        changed = true;
    }
    if changed {
        st.changed();
    }
}

/// Whether `control` lends or grants a region whose lease has ended.
fn lease_ended(st: &SessionState, control: &Control) -> bool {
    let id = match control {
        Control::Lend(d) | Control::AllocGrant { region: d, .. } => d.id,
        _ => return false,
    };
    st.lent
        .get(&id)
        .and_then(|l| l.deadline)
        .is_some_and(|deadline| Instant::now() >= deadline)
}

/// Whether region `id`'s descriptor (a lend, or the grant of a request)
/// still waits in the outbox.
fn descriptor_unsent(st: &SessionState, id: u64) -> bool {
    st.outbox.iter().any(|c| match c {
        Control::Lend(d) => d.id == id,
        Control::AllocGrant { region, .. } => region.id == id,
        _ => false,
    })
}

/// Region `id`, taken back, must never reach the peer if its descriptor
/// has not left yet (flow control held it): a lend is dropped, and a grant
/// becomes a refusal, so the request is still answered.
fn withdraw_unsent(st: &mut SessionState, id: u64) -> bool {
    let queued = st.outbox.len();
    st.outbox
        .retain(|c| !matches!(c, Control::Lend(d) if d.id == id));
    let withdrawn = st.outbox.len() < queued;
    for control in st.outbox.iter_mut() {
        if let Control::AllocGrant { request, region } = *control {
            if region.id == id {
                *control = Control::AllocRefuse {
                    request,
                    reason: RefuseReason::LeaseEnded,
                };
            }
        }
    }
    withdrawn
}

/// Sends what the outbox holds, as flow control allows, then an ack if
/// one is due.
fn flush<Q: QueuePair + std::marker::Send + 'static>(
    host: &HostShared<Q>,
    s: &SessionShared<Q>,
    st: &mut SessionState,
) {
    if st.peer_closed {
        // The peer is letting its queue pair go: anything sent now would
        // fail, and nothing it holds of ours is lent any more.
        st.outbox.clear();
        return;
    }
    while let Some(&control) = st.outbox.front() {
        if !st.flow.can_send() {
            break;
        }
        if lease_ended(st, &control) {
            // Expired between ticks: take it back (which withdraws this
            // descriptor) before it can go out.
            expire(st, Instant::now());
            continue;
        }
        match send_control(host, s, st, control) {
            Ok(true) => {
                st.outbox.pop_front();
            }
            Ok(false) => return, // the send queue is full: next time
            Err(e) => {
                let why = format!("a control message could not go: {e}");
                break_session(host, s, st, SessionError::Disconnected(why));
                return;
            }
        }
    }
    // An ack goes when nothing else carries the counts — also when the
    // outbox waits for them, or both sides could wait for each other.
    if (st.outbox.is_empty() || !st.flow.can_send()) && st.flow.wants_ack() {
        let _ = send_control(host, s, st, Control::Ack);
    }
}

/// Pushes one control message; `Ok(false)` if the send queue (or the
/// part of it kept for messages) is full.
fn send_control<Q: QueuePair + std::marker::Send + 'static>(
    host: &HostShared<Q>,
    s: &SessionShared<Q>,
    st: &mut SessionState,
    control: Control,
) -> Result<bool, crate::Error> {
    if !st.slots.free(|| s.qp.stats().map(|x| x.sends_done)) {
        return Ok(false); // its completion comes: next time
    }
    let (processed, taken) = st.flow.counts();
    let bytes = with_lease_left(st, control).encode(processed, taken);
    let layout = Layout::from_size_align(bytes.len(), 8).expect("a small layout");
    let Ok(mut region) = host.regions.alloc(layout) else {
        return Ok(false); // out of memory: next time
    };
    region.copy_from_slice(&bytes);
    let tag = if control == Control::Close {
        CLOSE
    } else {
        CONTROL
    };
    let mut send = Send::new(region).user_data(tag);
    if matches!(
        control,
        Control::Return { .. } | Control::Release { .. } | Control::Close
    ) {
        // It lets the peer free memory: our READs and atomics before it
        // finish first. A READ whose response was lost is run again by the
        // responder when retransmitted, against what the message let go.
        send = send.fence();
    }
    let handle = s.qp.handle();
    let pushed = host.ring.with_ring(|mut ring| {
        ring.submission_on(handle)
            .push(send)
            .map_err(|r| r.into_parts().0)?;
        Ok(ring.qp_stats(handle).map_or(0, |x| x.sends_pushed))
    });
    match pushed {
        Ok(at) => {
            st.flow.sent(false);
            st.slots.took(at);
            Ok(true)
        }
        Err(
            crate::Error::SendQueueFull { .. }
            | crate::Error::CompletionQueueFull { .. }
            | crate::Error::Unclaimed(_),
        ) => Ok(false),
        Err(e) => Err(e),
    }
}

/// The device refused to post some of the pump's work: the sessions it
/// belonged to cannot go on (their counts assume it went).
pub(super) fn refused<Q: QueuePair + std::marker::Send + 'static>(
    host: &HostShared<Q>,
    e: &crate::ring::SubmitError,
) {
    let qps: std::collections::HashSet<_> = e.unposted.iter().filter_map(|op| op.qp).collect();
    for qp in qps {
        let s = host.sessions().live.get(&qp).cloned();
        if let Some(s) = s {
            let why = format!("the device refused to post: {}", e.error);
            break_session(host, &s, &mut s.lock(), SessionError::Disconnected(why));
        }
    }
}

/// `control` with a lent region's lease as it stands now, so the peer's
/// clock, started on receipt, does not outlast ours.
fn with_lease_left(st: &SessionState, control: Control) -> Control {
    let left = |d: &RegionDescriptor| {
        let deadline = st.lent.get(&d.id).and_then(|l| l.deadline);
        match deadline {
            Some(deadline) => {
                let left = deadline
                    .saturating_duration_since(Instant::now())
                    .as_millis();
                u32::try_from(left).unwrap_or(u32::MAX).max(1)
            }
            None => d.lease_ms,
        }
    };
    match control {
        Control::Lend(d) => Control::Lend(RegionDescriptor {
            lease_ms: left(&d),
            ..d
        }),
        Control::AllocGrant { request, region } => Control::AllocGrant {
            request,
            region: RegionDescriptor {
                lease_ms: left(&region),
                ..region
            },
        },
        other => other,
    }
}

/// Moves the ring's device events to the host's queue (the ring already
/// acted on them: a fatal event flushes its queue pair, whose session then
/// fails).
fn forward_events<Q: QueuePair + std::marker::Send + 'static>(host: &HostShared<Q>) {
    let events: Vec<_> = host.ring.with_ring(|mut r| {
        let _ = r.poll_events();
        std::iter::from_fn(|| r.next_event()).collect()
    });
    if events.is_empty() {
        return;
    }
    let mut queue = host.events.lock().unwrap_or_else(|p| p.into_inner());
    for e in events {
        queue.push(e);
    }
}

#[cfg(test)]
mod tests {
    use super::BATCH;
    use crate::backend::soft::SoftDevice;
    use crate::buf::{BaseBuf, RemoteAccess};
    use crate::session::{SessionConfig, SessionError, SessionHost};
    use futures::executor::block_on;
    use std::alloc::Layout;
    use std::net::{TcpListener, TcpStream};
    use std::time::{Duration, Instant};

    fn socket_pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        (a, listener.accept().unwrap().0)
    }

    /// The peer sends a message and closes, and its handshake socket ends,
    /// while our pump has more than a turn's batch of completions queued
    /// ahead of them: the end of the socket is seen before the message
    /// and the close are taken. The message is delivered all the same,
    /// and the session ends as closed, not as a peer gone.
    #[test]
    fn a_peer_s_last_messages_count_though_its_socket_s_end_came_first() {
        let bytes = |n| Layout::from_size_align(n, 8).unwrap();
        let dev = SoftDevice::new();
        // Room for more messages unreported than a batch.
        let config = SessionConfig {
            recv_depth: 128,
            ..SessionConfig::default()
        };
        let host_a = SessionHost::soft(&dev, config).unwrap();
        let host_b = SessionHost::soft(&dev, config).unwrap();
        let (socket_a, socket_b) = socket_pair();
        // The session's socket, nonblocking once admitted.
        let watch = socket_a.try_clone().unwrap();
        let (a, b) = host_a
            .connect_soft_watching(&host_b, (Some(socket_a), Some(socket_b)))
            .unwrap();
        let control = a.with_queue_pair(|qp| qp.control()).unwrap();
        // More than a batch of completions of our pump's own sends (its
        // messages lending regions), held by the device for now.
        control.hold_acks();
        let before = control.counters().send_wrs;
        let lends = BATCH as u64 + 8;
        for _ in 0..lends {
            let region = a.alloc_local_mr(bytes(8)).unwrap();
            a.send_local_mr(region, RemoteAccess::READ).unwrap();
        }
        let pushed = Instant::now() + Duration::from_secs(10);
        while control.counters().send_wrs < before + lends {
            assert!(Instant::now() < pushed, "the lends did not go");
            std::thread::sleep(Duration::from_millis(1));
        }
        // Our pump is kept out (the ring is held) while the device hands
        // them over, the peer sends and closes, and its socket ends.
        a.with_queue_pair(move |_| {
            control.release_acks();
            let mut msg = b.alloc_local_mr(bytes(3)).unwrap();
            msg.copy_from_slice(b"bye");
            block_on(b.send(msg.slice(..))).0.unwrap();
            drop(b);
            let gone = Instant::now() + Duration::from_secs(10);
            while !matches!(watch.peek(&mut [0u8; 1]), Ok(0)) {
                assert!(Instant::now() < gone, "the peer's socket did not end");
                std::thread::sleep(Duration::from_millis(1));
            }
            // The pump's next turn looks at its sockets.
            std::thread::sleep(Duration::from_millis(30));
        })
        .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        let got = block_on(a.receive()).unwrap_or_else(|e| panic!("the message: {e}"));
        assert_eq!(&got[..], b"bye");
        assert!(
            matches!(block_on(a.receive()), Err(SessionError::Closed(_))),
            "{:?}",
            a.failure()
        );
        assert!(Instant::now() < deadline);
    }
}
