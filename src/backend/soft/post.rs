//! What a post to the soft device checks and does: the checks a NIC
//! makes when work is posted, then each work request queued, flushed or
//! (no-op mode) completed at once. Queue pairs and shared receive queues
//! post through here.

use super::state::{flushed, DeviceState, QpState, QueuedRecv, QueuedSend, SlotRelease};
use super::Progress;
use crate::backend::{PostError, RawCompletion, RecvWr, SendFlags, SendWr, Sge, SgeSpan, WcStatus};
use crate::error::Error;

/// A post's refusal, after `accepted` work requests.
pub(super) fn refuse(accepted: usize, reason: &'static str) -> PostError {
    PostError {
        accepted,
        error: Error::PostRejected(reason),
    }
}

/// The elements work request `i` of a post names (`span` of `sges`), as
/// every post checks them: within the post's list, and at most `max`
/// (`too_many` says which limit when not).
pub(super) fn elements<'a>(
    i: usize,
    span: SgeSpan,
    sges: &'a [Sge],
    max: u32,
    too_many: &'static str,
) -> Result<&'a [Sge], PostError> {
    let Some(list) = span.of(sges) else {
        return Err(refuse(i, "scatter/gather span out of range"));
    };
    if list.len() > max as usize {
        return Err(refuse(i, too_many));
    }
    Ok(list)
}

const TOO_MANY_SENDS: &str = "more scatter/gather elements than max_send_sge";
const TOO_LONG_INLINE: &str = "inline payload exceeds max_inline_data";

/// The bytes a work request's elements name. Summed only where needed:
/// most work requests are neither inline nor signaled. One element is
/// the common case, and a summing loop's vector set-up would cost more
/// than it.
#[inline]
fn total_len(list: &[Sge]) -> u64 {
    match list {
        [one] => u64::from(one.len),
        _ => list.iter().map(|s| u64::from(s.len)).sum(),
    }
}

/// The CQE of a send no-op mode completed without running it.
#[inline]
fn no_op_send(wr_id: u64, qpn: usize, list: &[Sge]) -> RawCompletion {
    RawCompletion {
        wr_id,
        qp_num: qpn as u32,
        status: WcStatus::Success,
        byte_len: total_len(list) as u32,
        imm: None,
        by_write_imm: false,
    }
}

/// No-op mode's send path, behind an empty send queue of a connected
/// queue pair: each work request completes as soon as it passes the
/// post's checks, so nothing is queued (though each keeps its slot until
/// a CQE that gives it back is polled). The same checks, counters and
/// CQEs as the general path in `post_send`, with the queue pair and its
/// completion queue looked up once instead of per work request. Returns
/// how many it took: all of them, or fewer when the send queue has no
/// slot for the next (which the general path then refuses) or the
/// completion queue is full at the next one (which the general path then
/// takes: an overrun reaches every queue pair on the queue). A queue gone
/// from under its queue pair
/// cannot happen (`SoftCq`'s drop keeps an entry in use); if it did, the
/// general path would take it all.
#[inline]
pub(super) fn complete_sends_at_once(
    state: &mut DeviceState,
    qpn: usize,
    wrs: &[SendWr],
    sges: &[Sge],
) -> Result<usize, PostError> {
    let DeviceState { qps, cqs, .. } = state;
    let qp = qps[qpn].as_mut().expect("the caller found it");
    let Some(cq) = cqs.get_mut(qp.cq).and_then(Option::as_mut) else {
        return Ok(0);
    };
    let max_sge = qp.config.max_send_sge as usize;
    let max_inline = u64::from(qp.config.max_inline_data);
    // As many as the queue has slots for (slots whose CQEs were polled);
    // the general path refuses the rest.
    let room = u64::from(qp.config.max_send_wr).saturating_sub(qp.sends_held());
    let wrs = &wrs[..wrs.len().min(room as usize)];
    let mut taken = 0;
    // A reason, not a `PostError`: the loop stays small (the general
    // path's checks, written out).
    let mut refused = None;
    for wr in wrs {
        let Some(list) = wr.sges.of(sges) else {
            refused = Some("scatter/gather span out of range");
            break;
        };
        if list.len() > max_sge {
            refused = Some(TOO_MANY_SENDS);
            break;
        }
        if wr.flags.contains(SendFlags::INLINE) && total_len(list) > max_inline {
            refused = Some(TOO_LONG_INLINE);
            break;
        }
        if wr.flags.contains(SendFlags::SIGNALED) {
            let seq = qp.next_seq + taken as u64;
            let release = SlotRelease::sends_through(seq);
            if !cq.push_unless_full(no_op_send(wr.wr_id, qpn, list), release, false) {
                break;
            }
            qp.report_send(seq);
        }
        taken += 1;
    }
    qp.counters.send_wrs += taken as u64;
    qp.next_seq += taken as u64;
    match refused {
        Some(reason) => Err(refuse(taken, reason)),
        None => Ok(taken),
    }
}

/// The send path of every mode: each work request from `start` on is
/// checked, then queued, completed at once (no-op mode, behind an empty
/// queue) or flushed (a queue pair in error). Out of line: no-op mode
/// behind an empty queue, which benchmarks measure, comes here only at
/// a full send queue or a completion queue's overrun.
#[inline(never)]
pub(super) fn post_each_send(
    state: &mut DeviceState,
    qpn: usize,
    wrs: &[SendWr],
    sges: &[Sge],
    start: usize,
) -> Result<(), PostError> {
    let progress = state.progress;
    for (i, wr) in wrs.iter().enumerate().skip(start) {
        let qp = state.qp(qpn).expect("the caller found it");
        // Its depth bounds work whose CQE (or a later send's) is not yet
        // polled, not only work waiting to run.
        if qp.sends_held() >= u64::from(qp.config.max_send_wr) {
            return Err(refuse(i, "send queue full"));
        }
        let list = elements(i, wr.sges, sges, qp.config.max_send_sge, TOO_MANY_SENDS)?;
        if wr.flags.contains(SendFlags::INLINE)
            && total_len(list) > u64::from(qp.config.max_inline_data)
        {
            return Err(refuse(i, TOO_LONG_INLINE));
        }
        qp.counters.send_wrs += 1;
        let seq = qp.take_seq();
        let cq = qp.cq;
        let release = SlotRelease::sends_through(seq);
        if qp.state == QpState::Error {
            qp.report_send(seq);
            state.push_cqe(qpn, flushed(wr.wr_id, qpn), release);
        } else if progress == Progress::NoOp && qp.sq.is_empty() {
            // Completing at once is only in order behind nothing: a work
            // request queued earlier (in another mode) must run first.
            if wr.flags.contains(SendFlags::SIGNALED) {
                qp.report_send(seq);
                state.push_cqe_on(cq, qpn, no_op_send(wr.wr_id, qpn, list), release, false);
            }
        } else {
            qp.sq.push_back(QueuedSend {
                seq,
                wr: *wr,
                sges: list.iter().copied().collect(),
            });
        }
    }
    Ok(())
}

/// The receive path of every mode: each work request is checked, then
/// queued, completed at once (no-op mode, behind an empty queue) or
/// flushed (a queue pair in error).
pub(super) fn post_each_recv(
    state: &mut DeviceState,
    qpn: usize,
    wrs: &[RecvWr],
    sges: &[Sge],
) -> Result<(), PostError> {
    let progress = state.progress;
    for (i, wr) in wrs.iter().enumerate() {
        let qp = state.qp(qpn).expect("the caller found it");
        if qp.recvs_held >= qp.config.max_recv_wr {
            return Err(refuse(i, "receive queue full"));
        }
        let list = elements(
            i,
            wr.sges,
            sges,
            qp.config.max_recv_sge,
            "more scatter/gather elements than max_recv_sge",
        )?;
        qp.counters.recv_wrs += 1;
        qp.recvs_held += 1;
        if qp.state == QpState::Error {
            state.push_cqe(qpn, flushed(wr.wr_id, qpn), SlotRelease::RECV);
        } else if progress == Progress::NoOp && qp.rq.is_empty() {
            state.push_cqe(
                qpn,
                RawCompletion {
                    wr_id: wr.wr_id,
                    qp_num: qpn as u32,
                    status: WcStatus::Success,
                    byte_len: 0,
                    imm: None,
                    by_write_imm: false,
                },
                SlotRelease::RECV,
            );
        } else {
            qp.rq.push_back(QueuedRecv {
                wr_id: wr.wr_id,
                sges: list.iter().copied().collect(),
            });
        }
    }
    Ok(())
}
