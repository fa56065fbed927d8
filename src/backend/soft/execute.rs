//! Executing send work requests in RC order, with their data effects.

use std::time::{Duration, Instant};

use super::state::{DeviceState, QpState};
use crate::backend::{Access, RawCompletion, SendFlags, SendOpcode, SendWr, WcStatus};

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
            let Some(&queued) = qp.sq.front() else { break };
            qp.check_not_reported(&queued);
            let wr = queued.wr;
            let status = match self.execute(qpn, &wr) {
                Outcome::Complete(status) => status,
                Outcome::Rnr => {
                    let qp = self.qp(qpn).expect("running qp exists");
                    qp.counters.rnr_naks += 1;
                    let retry = qp.config.rnr_retry;
                    let wait = qp.rnr.get_or_insert(super::state::RnrWait {
                        attempts: 0,
                        since: Instant::now(),
                    });
                    wait.attempts += 1;
                    let exhausted = retry < 7
                        && if manual {
                            wait.attempts > u32::from(retry)
                        } else {
                            wait.since.elapsed() > RNR_TIMER * (u32::from(retry) + 1)
                        };
                    if !exhausted {
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
            if status.is_success() {
                if wr.flags.contains(SendFlags::SIGNALED) {
                    qp.report_send(queued.seq);
                    qp.push_cqe(RawCompletion {
                        wr_id: wr.wr_id,
                        status,
                        byte_len: wr.sge.len,
                        imm: None,
                        by_write_imm: false,
                    });
                }
            } else {
                // An error completion always has a CQE, and the queue pair
                // goes to error, flushing everything behind it.
                qp.report_send(queued.seq);
                qp.push_cqe(RawCompletion {
                    wr_id: wr.wr_id,
                    status,
                    byte_len: 0,
                    imm: None,
                    by_write_imm: false,
                });
                qp.enter_error();
            }
        }
        done
    }

    fn execute(&mut self, qpn: usize, wr: &SendWr) -> Outcome {
        let qp = self.qp(qpn).expect("running qp exists");
        if let Some((1, status)) = qp.fault {
            qp.fault = None;
            return Outcome::Complete(status);
        }
        let (local_pd, link_broken, peer) = (qp.pd, qp.link_broken, qp.peer);
        let peer_qpn = match peer {
            Some(p) if !link_broken => p,
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
        let local = match self.check_local(wr.sge, local_pd, needs_write) {
            Ok(addr) => addr,
            Err(status) => return Outcome::Complete(status),
        };
        let len = wr.sge.len as usize;
        match wr.opcode {
            SendOpcode::Write | SendOpcode::WriteImm => {
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
                if wr.opcode == SendOpcode::WriteImm && self.peer_rq_empty(peer_qpn) {
                    return Outcome::Rnr;
                }
                copy(local, remote, len);
                if wr.opcode == SendOpcode::WriteImm {
                    self.deliver(peer_qpn, len as u32, Some(wr.imm), true);
                }
                Outcome::Complete(WcStatus::Success)
            }
            SendOpcode::Send | SendOpcode::SendImm => {
                let peer = self.qp(peer_qpn).expect("peer checked above");
                let Some(&recv) = peer.rq.front() else {
                    return Outcome::Rnr;
                };
                let target = match self.check_local(recv.sge, peer_pd, true) {
                    Ok(addr) => addr,
                    Err(status) => {
                        self.fail_receive(peer_qpn, status);
                        return Outcome::Complete(WcStatus::RemOpErr);
                    }
                };
                if len > recv.sge.len as usize {
                    self.fail_receive(peer_qpn, WcStatus::LocLenErr);
                    return Outcome::Complete(WcStatus::RemInvReqErr);
                }
                copy(local, target, len);
                let imm = (wr.opcode == SendOpcode::SendImm).then_some(wr.imm);
                self.deliver(peer_qpn, len as u32, imm, false);
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
                        copy(remote, local, len);
                        Outcome::Complete(WcStatus::Success)
                    }
                    Err(status) => self.responder_error(peer_qpn, status),
                }
            }
            SendOpcode::CompareSwap | SendOpcode::FetchAdd => {
                if len != 8 {
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
                    return Outcome::Complete(WcStatus::RemInvReqErr);
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
                    (local as *mut u8).copy_from(old.to_ne_bytes().as_ptr(), 8);
                }
                Outcome::Complete(WcStatus::Success)
            }
        }
    }

    fn peer_rq_empty(&mut self, peer: usize) -> bool {
        self.qp(peer).is_none_or(|p| p.rq.is_empty())
    }

    /// Consumes the peer's next receive with a successful CQE.
    fn deliver(&mut self, peer: usize, byte_len: u32, imm: Option<u32>, by_write_imm: bool) {
        let peer = self.qp(peer).expect("peer exists");
        let recv = peer.rq.pop_front().expect("receive checked present");
        peer.push_cqe(RawCompletion {
            wr_id: recv.wr_id,
            status: WcStatus::Success,
            byte_len,
            imm,
            by_write_imm,
        });
    }

    /// The peer's receive fails (its buffer is bad or too small); the peer
    /// goes to error.
    fn fail_receive(&mut self, peer: usize, status: WcStatus) {
        let peer = self.qp(peer).expect("peer exists");
        let recv = peer.rq.pop_front().expect("receive checked present");
        peer.push_cqe(RawCompletion {
            wr_id: recv.wr_id,
            status,
            byte_len: 0,
            imm: None,
            by_write_imm: false,
        });
        peer.enter_error();
    }

    /// A remote access violation NAKs the requester and, as on RC hardware
    /// (class C error), moves the responder to error too.
    fn responder_error(&mut self, peer: usize, status: WcStatus) -> Outcome {
        if let Some(p) = self.qp(peer) {
            p.enter_error();
        }
        Outcome::Complete(status)
    }
}

fn copy(from: usize, to: usize, len: usize) {
    if len == 0 {
        return;
    }
    // SAFETY: both ranges were checked to lie inside live registrations (local
    // ones owned by in-flight operations, remote ones exposed with the right
    // rights), and a registration's memory stays valid until it is
    // deregistered, which takes the device lock held by every caller.
    // `copy` tolerates overlap (a loopback pair may name the same memory).
    unsafe { std::ptr::copy(from as *const u8, to as *mut u8, len) }
}
