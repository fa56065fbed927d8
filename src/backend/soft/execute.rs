//! Executing send work requests in RC order, with their data effects.

use std::time::{Duration, Instant};

use super::state::{DeviceState, QpState, QueuedSend, SlotRelease};
use crate::backend::{Access, AsyncEvent, RawCompletion, SendFlags, SendOpcode, Sge, WcStatus};
use smallvec::SmallVec;

/// How long one RNR retry waits when the device progresses by itself.
pub(super) const RNR_TIMER: Duration = Duration::from_millis(5);

enum Outcome {
    Complete(WcStatus),
    /// The peer has no receive posted: Receiver Not Ready.
    Rnr,
}

impl DeviceState {
    /// Runs every queue pair as far as it can go. `manual` counts an RNR
    /// retry per call instead of by time.
    pub(super) fn run_all(&mut self, manual: bool) -> usize {
        (0..self.qps.len())
            .map(|qpn| self.run_qp(qpn, usize::MAX, manual))
            .sum()
    }

    /// Executes up to `max` work requests from the head of a send queue.
    pub(super) fn run_qp(&mut self, qpn: usize, max: usize, manual: bool) -> usize {
        let mut done = 0;
        while done < max {
            let Some(qp) = self.qp(qpn) else { break };
            if qp.state != QpState::ReadyToSend {
                break;
            }
            let Some(queued) = qp.sq.front().cloned() else {
                break;
            };
            qp.check_not_reported(&queued);
            let status = match self.execute(qpn, &queued) {
                Outcome::Complete(status) => status,
                Outcome::Rnr => {
                    let qp = self.qp(qpn).expect("running qp exists");
                    let retry = qp.config.rnr_retry;
                    // In auto mode the device looks at every post and
                    // poll; a retry (and its NAK) comes only once the
                    // timer since the last NAK ran out, so a failed send
                    // counts `retry + 1` NAKs, as a NIC's counter does.
                    if !manual
                        && qp
                            .rnr
                            .as_ref()
                            .is_some_and(|w| w.last.elapsed() < RNR_TIMER)
                    {
                        break;
                    }
                    qp.counters.rnr_naks += 1;
                    let wait = qp.rnr.get_or_insert(super::state::RnrWait {
                        attempts: 0,
                        last: Instant::now(),
                    });
                    wait.attempts += 1;
                    wait.last = Instant::now();
                    // `retry` retries after the first NAK: none at 0,
                    // which fails at the first NAK; 7 retries for ever.
                    if retry >= 7 || wait.attempts <= u32::from(retry) {
                        break;
                    }
                    WcStatus::RnrRetryExcErr
                }
            };
            let qp = self.qp(qpn).expect("running qp exists");
            // The fault countdown counts executed work requests, not RNR
            // retries.
            if let Some((n, fault)) = qp.fault {
                qp.fault = Some((n - 1, fault));
            }
            qp.sq.pop_front();
            qp.rnr = None;
            qp.counters.executed += 1;
            done += 1;
            let wr = queued.wr;
            qp.counters.fenced += u64::from(wr.flags.contains(SendFlags::FENCE));
            if status.is_success() {
                if wr.flags.contains(SendFlags::SIGNALED) {
                    qp.report_send(queued.seq);
                    let byte_len = queued.sges.iter().map(|s| s.len).sum();
                    let cqe = RawCompletion {
                        wr_id: wr.wr_id,
                        qp_num: qpn as u32,
                        status,
                        byte_len,
                        imm: None,
                        by_write_imm: false,
                    };
                    let release = SlotRelease::sends_through(queued.seq);
                    match qp.held_acks.as_mut() {
                        Some(held) => held.push_back((cqe, release)),
                        None => self.push_cqe(qpn, cqe, release),
                    }
                }
            } else {
                // An error completion always has a CQE, and the queue pair
                // goes to error, flushing everything behind it. Completions
                // held for their ACKs come first: a NAK acknowledges what
                // went before it, so they succeeded; with no path to the
                // peer, no ACK comes, so the oldest is the one whose
                // retries ran out and this one is flushed with the rest.
                qp.report_send(queued.seq);
                let status = if status == WcStatus::RetryExcErr {
                    self.retries_exhausted(qpn)
                } else {
                    self.deliver_held_acks(qpn);
                    status
                };
                self.push_cqe(
                    qpn,
                    RawCompletion {
                        wr_id: wr.wr_id,
                        qp_num: qpn as u32,
                        status,
                        byte_len: 0,
                        imm: None,
                        by_write_imm: false,
                    },
                    SlotRelease::sends_through(queued.seq),
                );
                self.enter_error(qpn);
            }
        }
        done
    }

    /// Copies the bytes of `from` (checked pieces) across `to`, through the
    /// device's reusable copy buffer.
    fn copy_pieces(&mut self, from: &[(usize, usize)], to: &[(usize, usize)]) {
        let mut bytes = std::mem::take(&mut self.copy_buffer);
        gather_into(&mut bytes, from);
        scatter(&bytes, to);
        self.copy_buffer = bytes;
    }

    fn execute(&mut self, qpn: usize, queued: &QueuedSend) -> Outcome {
        let wr = &queued.wr;
        let port_active = self.port_active;
        let qp = self.qp(qpn).expect("running qp exists");
        if let Some((1, status)) = qp.fault {
            qp.fault = None;
            return self.injected(qpn, status);
        }
        let (local_pd, link_broken, peer) = (qp.pd, qp.link_broken, qp.peer);
        let peer_qpn = match peer {
            Some(p) if !link_broken && port_active => p,
            _ => return Outcome::Complete(WcStatus::RetryExcErr),
        };
        let Some(peer) = self.qps.get(peer_qpn).and_then(Option::as_ref) else {
            return Outcome::Complete(WcStatus::RetryExcErr);
        };
        // A responder in error drops requests silently; the requester's
        // retries run out.
        if peer.state != QpState::ReadyToSend {
            return Outcome::Complete(WcStatus::RetryExcErr);
        }
        let peer_pd = peer.pd;
        let needs_write = matches!(
            wr.opcode,
            SendOpcode::Read | SendOpcode::CompareSwap | SendOpcode::FetchAdd
        );
        let local = match self.check_local_list(&queued.sges, local_pd, needs_write) {
            Ok(list) => list,
            Err(status) => return Outcome::Complete(status),
        };
        let len: usize = local.iter().map(|&(_, n)| n).sum();
        if len > crate::op::MAX_MESSAGE_LEN {
            // Past the largest message the device announces (a gather
            // list may name one region many times over).
            return Outcome::Complete(WcStatus::LocLenErr);
        }
        match wr.opcode {
            SendOpcode::Write | SendOpcode::WriteImm => {
                // The receive the immediate consumes is looked for before
                // the rkey is checked, as rxe's responder does for a
                // message of one packet (it checks its resources first):
                // with none posted, the requester gets RNR, not an access
                // error, whatever the key. (rxe checks the key of the
                // first packet of a longer message before any receive;
                // this device has no packets.)
                if wr.opcode == SendOpcode::WriteImm && !self.has_receive(peer_qpn) {
                    return Outcome::Rnr;
                }
                let remote = match self.check_remote(
                    wr.rkey,
                    wr.remote_addr,
                    len as u64,
                    peer_pd,
                    Access::REMOTE_WRITE,
                ) {
                    Ok(addr) => addr,
                    Err(status) => return self.responder_error(peer_qpn, status),
                };
                self.copy_pieces(&local, &[(remote, len)]);
                if wr.opcode == SendOpcode::WriteImm {
                    let solicited = wr.flags.contains(SendFlags::SOLICITED);
                    self.deliver(peer_qpn, len as u32, Some(wr.imm), solicited);
                }
                Outcome::Complete(WcStatus::Success)
            }
            SendOpcode::Send | SendOpcode::SendImm => {
                if !self.has_receive(peer_qpn) {
                    return Outcome::Rnr;
                }
                let recv = self.take_receive(peer_qpn).expect("checked above");
                // The responder checks only the bytes the message lands
                // in (as rxe's copy does): the elements past its end, all
                // of a zero-length one's, and the tail of the element it
                // ends in are never looked at.
                let mut reached: super::state::SgeList = SmallVec::new();
                let mut covered = 0usize;
                for sge in &recv.sges {
                    if covered >= len {
                        break;
                    }
                    let take = (sge.len as usize).min(len - covered);
                    reached.push(Sge {
                        len: take as u32,
                        ..*sge
                    });
                    covered += take;
                }
                if covered < len {
                    // Too long for the receive: every element is looked
                    // at (a bad key still shows first), then the length.
                    reached = recv.sges.iter().copied().collect();
                }
                let target = match self.check_local_list(&reached, peer_pd, true) {
                    Ok(list) => list,
                    Err(status) => {
                        self.fail_receive(peer_qpn, recv.wr_id, status);
                        return Outcome::Complete(WcStatus::RemOpErr);
                    }
                };
                if len > target.iter().map(|&(_, n)| n).sum() {
                    self.fail_receive(peer_qpn, recv.wr_id, WcStatus::LocLenErr);
                    return Outcome::Complete(WcStatus::RemInvReqErr);
                }
                self.copy_pieces(&local, &target);
                let imm = (wr.opcode == SendOpcode::SendImm).then_some(wr.imm);
                let release = self.recv_release(peer_qpn);
                self.push_cqe_solicited(
                    peer_qpn,
                    RawCompletion {
                        wr_id: recv.wr_id,
                        qp_num: peer_qpn as u32,
                        status: WcStatus::Success,
                        byte_len: len as u32,
                        imm,
                        by_write_imm: false,
                    },
                    release,
                    wr.flags.contains(SendFlags::SOLICITED),
                );
                Outcome::Complete(WcStatus::Success)
            }
            SendOpcode::Read => {
                match self.check_remote(
                    wr.rkey,
                    wr.remote_addr,
                    len as u64,
                    peer_pd,
                    Access::REMOTE_READ,
                ) {
                    Ok(remote) => {
                        self.copy_pieces(&[(remote, len)], &local);
                        Outcome::Complete(WcStatus::Success)
                    }
                    Err(status) => self.responder_error(peer_qpn, status),
                }
            }
            SendOpcode::CompareSwap | SendOpcode::FetchAdd => {
                if len != 8 || local.len() != 1 {
                    return Outcome::Complete(WcStatus::LocLenErr);
                }
                let remote = match self.check_remote(
                    wr.rkey,
                    wr.remote_addr,
                    8,
                    peer_pd,
                    Access::REMOTE_ATOMIC,
                ) {
                    Ok(addr) => addr,
                    Err(status) => return self.responder_error(peer_qpn, status),
                };
                if remote % 8 != 0 {
                    return self.responder_error(peer_qpn, WcStatus::RemInvReqErr);
                }
                // SAFETY: `remote` is 8 bytes inside a live registration with
                // atomic rights and 8-aligned (checked above); registrations
                // stay valid until deregistered under the device lock we hold.
                let old = unsafe { (remote as *const u64).read() };
                let new = if wr.opcode == SendOpcode::CompareSwap {
                    if old == wr.compare_add {
                        wr.swap
                    } else {
                        old
                    }
                } else {
                    old.wrapping_add(wr.compare_add)
                };
                // SAFETY: as above; the local target is 8 bytes inside a live
                // registration with local write rights (checked), which the
                // ring keeps owned by this operation until it completes.
                unsafe {
                    (remote as *mut u64).write(new);
                    (local[0].0 as *mut u8).copy_from(old.to_ne_bytes().as_ptr(), 8);
                }
                Outcome::Complete(WcStatus::Success)
            }
        }
    }

    /// Consumes the peer's next receive with a successful CQE of a WRITE
    /// with immediate (the receive's buffer is untouched).
    fn deliver(&mut self, peer: usize, byte_len: u32, imm: Option<u32>, solicited: bool) {
        let recv = self.take_receive(peer).expect("receive checked present");
        let release = self.recv_release(peer);
        self.push_cqe_solicited(
            peer,
            RawCompletion {
                wr_id: recv.wr_id,
                qp_num: peer as u32,
                status: WcStatus::Success,
                byte_len,
                imm,
                by_write_imm: true,
            },
            release,
            solicited,
        );
    }

    /// The peer's receive fails (its buffer is bad or too small); the peer
    /// goes to error.
    fn fail_receive(&mut self, peer: usize, wr_id: u64, status: WcStatus) {
        let release = self.recv_release(peer);
        self.push_cqe(
            peer,
            RawCompletion {
                wr_id,
                qp_num: peer as u32,
                status,
                byte_len: 0,
                imm: None,
                by_write_imm: false,
            },
            release,
        );
        self.enter_error(peer);
    }

    /// An injected fault: the work request completes with `status`. A
    /// status that says the responder failed (a NAK for an access
    /// violation, an invalid request or its own failure) fails a healthy
    /// responder too, as a real one would have.
    fn injected(&mut self, qpn: usize, status: WcStatus) -> Outcome {
        let healthy_peer = self
            .qp(qpn)
            .and_then(|qp| qp.peer)
            .filter(|&p| self.qp(p).is_some_and(|p| p.state == QpState::ReadyToSend));
        match (status, healthy_peer) {
            (WcStatus::RemAccessErr | WcStatus::RemInvReqErr, Some(peer)) => {
                self.responder_error(peer, status)
            }
            (WcStatus::RemOpErr, Some(peer)) => {
                self.enter_error(peer);
                Outcome::Complete(status)
            }
            _ => Outcome::Complete(status),
        }
    }

    /// The transport's retries ran out with no path to the peer: no ACK
    /// comes for the completions held for one, so the oldest of them
    /// fails with `RetryExcErr` and the rest are flushed. Returns the
    /// status of the work request that found the path gone: `RetryExcErr`
    /// if none was held, else flushed after them.
    fn retries_exhausted(&mut self, qpn: usize) -> WcStatus {
        let held = match self.qp(qpn).and_then(|qp| qp.held_acks.as_mut()) {
            Some(held) if !held.is_empty() => std::mem::take(held),
            _ => return WcStatus::RetryExcErr,
        };
        for (i, (mut cqe, release)) in held.into_iter().enumerate() {
            cqe.status = if i == 0 {
                WcStatus::RetryExcErr
            } else {
                WcStatus::WrFlushErr
            };
            cqe.byte_len = 0;
            self.push_cqe(qpn, cqe, release);
        }
        WcStatus::WrFlushErr
    }

    /// A remote access violation or an invalid request (a misaligned
    /// atomic) NAKs the requester and, as on RC hardware (class C error),
    /// moves the responder to error too, telling its owner with an
    /// affiliated event: `QpAccessError` or `QpRequestError`.
    /// The event comes before the error's others (a queue pair on a shared
    /// receive queue says it will take no more receives after it).
    fn responder_error(&mut self, peer: usize, status: WcStatus) -> Outcome {
        let qp_num = peer as u32;
        self.raise(match status {
            WcStatus::RemAccessErr => AsyncEvent::QpAccessError { qp_num },
            _ => AsyncEvent::QpRequestError { qp_num },
        });
        self.enter_error(peer);
        Outcome::Complete(status)
    }
}

/// The bytes of a list of checked (address, length) pieces, in order, into
/// `bytes` (cleared first): a copy, so that source and target may overlap
/// (a loopback pair may name the same memory).
fn gather_into(bytes: &mut Vec<u8>, pieces: &[(usize, usize)]) {
    bytes.clear();
    for &(addr, len) in pieces {
        if len == 0 {
            continue;
        }
        // SAFETY: every piece was checked to lie inside a live registration
        // (local ones owned by in-flight operations, remote ones exposed
        // with the right rights), and a registration's memory stays valid
        // until it is deregistered, which takes the device lock held by
        // every caller.
        bytes.extend_from_slice(unsafe { std::slice::from_raw_parts(addr as *const u8, len) });
    }
}

/// Writes `bytes` across checked (address, length) pieces, in order, as
/// far as they go.
fn scatter(bytes: &[u8], pieces: &[(usize, usize)]) {
    let mut rest = bytes;
    for &(addr, len) in pieces {
        let n = len.min(rest.len());
        if n == 0 {
            continue;
        }
        // SAFETY: as in `gather`; the piece is writable (checked with write
        // rights) and `n` is within it.
        unsafe { std::ptr::copy_nonoverlapping(rest.as_ptr(), addr as *mut u8, n) };
        rest = &rest[n..];
    }
}
