//! RC queue pairs over verbs: CQ with a completion channel, state
//! transitions, linked-list posts, batched polls.

use std::sync::{Arc, OnceLock};

use rdma_sys::{
    ibv_comp_channel, ibv_cq, ibv_qp, ibv_qp_attr, ibv_qp_attr_mask, ibv_qp_init_attr,
    ibv_qp_state, ibv_recv_wr, ibv_send_wr, ibv_sge, ibv_wc, ibv_wr_opcode,
};

use super::device::{last_error, verbs_error};
use super::events::VerbsEvents;
use super::pd::{PdInner, VerbsPd};
use crate::backend::{
    CompletionEvents, PostError, QpCaps, QpConfig, QueuePair, RawCompletion, RecvWr, SendOpcode,
    SendWr, WcStatus,
};
use crate::connect::Endpoint;
use crate::error::Error;

/// A completion queue and its channel, shared by a queue pair and the
/// completion events handed to reactors (which may outlive the QP).
pub(super) struct CqInner {
    pub(super) _pd: Arc<PdInner>,
    pub(super) channel: *mut ibv_comp_channel,
    pub(super) cq: *mut ibv_cq,
}

// SAFETY: CQs and channels are thread-safe in libibverbs; the pointers are
// owned by this value and destroyed once, in `Drop`.
unsafe impl Send for CqInner {}
// SAFETY: as above.
unsafe impl Sync for CqInner {}

impl Drop for CqInner {
    fn drop(&mut self) {
        // SAFETY: the QP using this CQ was destroyed first (it holds an `Arc`
        // of this value), and events are acknowledged as they are taken, so
        // the CQ and then its channel can be destroyed, once each.
        unsafe {
            rdma_sys::ibv_destroy_cq(self.cq);
            rdma_sys::ibv_destroy_comp_channel(self.channel);
        }
    }
}

/// An RC queue pair on a verbs device, with its own completion queue.
/// Created in INIT; [`connect`](Self::connect) moves it through RTR to RTS.
pub struct VerbsQp {
    pd: Arc<PdInner>,
    cq: Arc<CqInner>,
    qp: *mut ibv_qp,
    caps: QpCaps,
    config: QpConfig,
    psn: u32,
    connected: bool,
    send_wrs: Vec<ibv_send_wr>,
    send_sges: Vec<ibv_sge>,
    recv_wrs: Vec<ibv_recv_wr>,
    recv_sges: Vec<ibv_sge>,
    wcs: Vec<ibv_wc>,
    events: OnceLock<Option<Arc<VerbsEvents>>>,
}

// SAFETY: the QP pointer is owned by this value; libibverbs QPs may be used
// from any thread, and `&mut self` serializes posting and polling.
unsafe impl Send for VerbsQp {}

impl std::fmt::Debug for VerbsQp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsQp")
            .field("qpn", &self.qpn())
            .field("caps", &self.caps)
            .finish()
    }
}

impl VerbsQp {
    pub(super) fn new(pd: &VerbsPd, config: QpConfig) -> Result<Self, Error> {
        let pd = Arc::clone(&pd.inner);
        let limits = pd.dev.limits;
        if config.max_send_wr == 0
            || config.max_send_wr > limits.max_qp_wr
            || config.max_recv_wr > limits.max_qp_wr
        {
            return Err(Error::Verbs {
                verb: "ibv_create_qp",
                source: std::io::Error::other(format!(
                    "queue depths {}/{} exceed the device's max_qp_wr {}",
                    config.max_send_wr, config.max_recv_wr, limits.max_qp_wr
                )),
            });
        }
        let cq_entries = config.completion_entries().min(limits.max_cqe);
        // SAFETY: the context is open while `pd.dev` lives.
        let channel = unsafe { rdma_sys::ibv_create_comp_channel(pd.dev.ctx) };
        if channel.is_null() {
            return Err(last_error("ibv_create_comp_channel"));
        }
        // SAFETY: as above; the channel was just created on this context.
        let cq = unsafe {
            rdma_sys::ibv_create_cq(
                pd.dev.ctx,
                cq_entries as i32,
                std::ptr::null_mut(),
                channel,
                0,
            )
        };
        if cq.is_null() {
            let err = last_error("ibv_create_cq");
            // SAFETY: created above, unused.
            unsafe { rdma_sys::ibv_destroy_comp_channel(channel) };
            return Err(err);
        }
        let cq = Arc::new(CqInner {
            _pd: Arc::clone(&pd),
            channel,
            cq,
        });
        // SAFETY: a plain C struct, for which all-zero is valid.
        let mut init: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        init.send_cq = cq.cq;
        init.recv_cq = cq.cq;
        init.cap.max_send_wr = config.max_send_wr;
        init.cap.max_recv_wr = config.max_recv_wr.max(1);
        init.cap.max_send_sge = 1;
        init.cap.max_recv_sge = 1;
        init.cap.max_inline_data = config.max_inline_data;
        init.qp_type = rdma_sys::ibv_qp_type::IBV_QPT_RC;
        init.sq_sig_all = 0;
        // SAFETY: the PD and CQ are live; `init` is a valid in/out pointer.
        let qp = unsafe { rdma_sys::ibv_create_qp(pd.pd, &mut init) };
        if qp.is_null() {
            return Err(last_error("ibv_create_qp"));
        }
        let caps = QpCaps {
            max_send_wr: config.max_send_wr,
            max_recv_wr: config.max_recv_wr,
            cq_entries,
            max_inline_data: init.cap.max_inline_data.min(config.max_inline_data),
            atomics: limits.atomics,
            pd: pd.id,
        };
        let send_len = config.max_send_wr as usize + 1;
        let recv_len = config.max_recv_wr.max(1) as usize;
        let mut this = VerbsQp {
            send_wrs: zeroed(send_len),
            send_sges: zeroed(send_len),
            recv_wrs: zeroed(recv_len),
            recv_sges: zeroed(recv_len),
            wcs: zeroed(64),
            pd,
            cq,
            qp,
            caps,
            config,
            psn: random_psn(),
            connected: false,
            events: OnceLock::new(),
        };
        this.enter_init()?;
        Ok(this)
    }

    /// The queue pair number.
    pub fn qpn(&self) -> u32 {
        // SAFETY: the QP is live until `Drop`.
        unsafe { (*self.qp).qp_num }
    }

    /// What a peer needs to connect to this queue pair: send it (e.g. with
    /// [`Endpoint::encode`]) any way you like.
    pub fn endpoint(&self) -> Endpoint {
        let dev = &self.pd.dev;
        Endpoint {
            qpn: self.qpn(),
            psn: self.psn,
            lid: dev.lid,
            gid: dev.gid,
            mtu: dev.active_mtu as u8,
            rd_atomic: dev.limits.max_qp_rd_atom.clamp(1, 16),
            init_rd_atomic: dev.limits.max_qp_init_rd_atom.clamp(1, 16),
        }
    }

    fn modify(
        &mut self,
        attr: &mut ibv_qp_attr,
        mask: ibv_qp_attr_mask,
        verb: &'static str,
    ) -> Result<(), Error> {
        // SAFETY: the QP is live; `attr` is valid for the fields `mask` names.
        let ret = unsafe { rdma_sys::ibv_modify_qp(self.qp, attr, mask.0 as i32) };
        if ret != 0 {
            return Err(verbs_error(verb, ret));
        }
        Ok(())
    }

    fn enter_init(&mut self) -> Result<(), Error> {
        // SAFETY: a plain C struct, for which all-zero is valid.
        let mut attr: ibv_qp_attr = unsafe { std::mem::zeroed() };
        attr.qp_state = ibv_qp_state::IBV_QPS_INIT;
        attr.pkey_index = 0;
        attr.port_num = self.pd.dev.port;
        // The QP allows every remote operation; each memory registration
        // decides what a peer may really do (least privilege lives there).
        attr.qp_access_flags = (rdma_sys::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE
            | rdma_sys::ibv_access_flags::IBV_ACCESS_REMOTE_READ
            | rdma_sys::ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC)
            .0;
        let mask = ibv_qp_attr_mask::IBV_QP_STATE
            | ibv_qp_attr_mask::IBV_QP_PKEY_INDEX
            | ibv_qp_attr_mask::IBV_QP_PORT
            | ibv_qp_attr_mask::IBV_QP_ACCESS_FLAGS;
        self.modify(&mut attr, mask, "ibv_modify_qp(INIT)")
    }

    /// Connects to a peer's endpoint: INIT → RTR → RTS. Works with any RC
    /// peer that exchanged endpoints another way (e.g. `ibv_rc_pingpong`:
    /// its QPN, PSN, LID and GID), as long as both use the same GID type.
    pub fn connect(&mut self, remote: &Endpoint) -> Result<(), Error> {
        let dev = Arc::clone(&self.pd.dev);
        let limits = dev.limits;
        // SAFETY: a plain C struct, for which all-zero is valid.
        let mut attr: ibv_qp_attr = unsafe { std::mem::zeroed() };
        attr.qp_state = ibv_qp_state::IBV_QPS_RTR;
        attr.path_mtu = dev.active_mtu.min(u32::from(remote.mtu));
        attr.dest_qp_num = remote.qpn;
        attr.rq_psn = remote.psn;
        // Answer as many READs/atomics as the peer may issue, within our means.
        let ours = limits.max_qp_rd_atom.clamp(1, 16);
        attr.max_dest_rd_atomic = match remote.init_rd_atomic {
            0 => ours,
            theirs => ours.min(theirs),
        };
        attr.min_rnr_timer = 12; // 0.64 ms
        attr.ah_attr.dlid = remote.lid;
        attr.ah_attr.sl = 0;
        attr.ah_attr.src_path_bits = 0;
        attr.ah_attr.port_num = dev.port;
        if remote.gid.iter().any(|&b| b != 0) {
            attr.ah_attr.is_global = 1;
            attr.ah_attr.grh.dgid.raw = remote.gid;
            attr.ah_attr.grh.sgid_index = dev.gid_index;
            attr.ah_attr.grh.hop_limit = 64;
        }
        let mask = ibv_qp_attr_mask::IBV_QP_STATE
            | ibv_qp_attr_mask::IBV_QP_AV
            | ibv_qp_attr_mask::IBV_QP_PATH_MTU
            | ibv_qp_attr_mask::IBV_QP_DEST_QPN
            | ibv_qp_attr_mask::IBV_QP_RQ_PSN
            | ibv_qp_attr_mask::IBV_QP_MAX_DEST_RD_ATOMIC
            | ibv_qp_attr_mask::IBV_QP_MIN_RNR_TIMER;
        self.modify(&mut attr, mask, "ibv_modify_qp(RTR)")?;

        // SAFETY: as above.
        let mut attr: ibv_qp_attr = unsafe { std::mem::zeroed() };
        attr.qp_state = ibv_qp_state::IBV_QPS_RTS;
        attr.timeout = self.config.ack_timeout;
        attr.retry_cnt = self.config.retry_cnt.min(7);
        // 7 would retry forever: keep below it.
        attr.rnr_retry = self.config.rnr_retry.min(6);
        attr.sq_psn = self.psn;
        // Never have more outstanding than the peer can answer.
        let ours = limits.max_qp_init_rd_atom.clamp(1, 16);
        attr.max_rd_atomic = match remote.rd_atomic {
            0 => ours,
            theirs => ours.min(theirs),
        };
        let mask = ibv_qp_attr_mask::IBV_QP_STATE
            | ibv_qp_attr_mask::IBV_QP_TIMEOUT
            | ibv_qp_attr_mask::IBV_QP_RETRY_CNT
            | ibv_qp_attr_mask::IBV_QP_RNR_RETRY
            | ibv_qp_attr_mask::IBV_QP_SQ_PSN
            | ibv_qp_attr_mask::IBV_QP_MAX_QP_RD_ATOMIC;
        self.modify(&mut attr, mask, "ibv_modify_qp(RTS)")?;
        self.connected = true;
        Ok(())
    }

    /// Applies attributes computed elsewhere (rdma_cm's `rdma_init_qp_attr`).
    pub(crate) fn modify_raw(
        &mut self,
        attr: &mut ibv_qp_attr,
        mask: i32,
        verb: &'static str,
    ) -> Result<(), Error> {
        self.modify(attr, ibv_qp_attr_mask(mask as u32), verb)
    }

    pub(crate) fn mark_connected(&mut self) {
        self.connected = true;
    }

    /// Whether [`connect`](Self::connect) has succeeded.
    pub fn is_connected(&self) -> bool {
        self.connected
    }
}

fn random_psn() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64),
    );
    (h.finish() as u32) & 0x00ff_ffff
}

/// C structs of libibverbs for which all-zero bytes are a valid value.
///
/// # Safety
///
/// Implement only for plain C structs and unions of integers and raw
/// pointers, for which `mem::zeroed` is a valid value.
unsafe trait Zeroable: Sized {}
// SAFETY: each is a plain C struct of integers, raw pointers and unions of
// those.
unsafe impl Zeroable for ibv_send_wr {}
// SAFETY: as above.
unsafe impl Zeroable for ibv_recv_wr {}
// SAFETY: as above.
unsafe impl Zeroable for ibv_sge {}
// SAFETY: as above.
unsafe impl Zeroable for ibv_wc {}

/// `n` zeroed values, the reusable staging arrays of a queue pair.
fn zeroed<T: Zeroable>(n: usize) -> Vec<T> {
    // SAFETY: all-zero is a valid `T` (the `Zeroable` contract).
    (0..n).map(|_| unsafe { std::mem::zeroed() }).collect()
}

/// How many work requests of the `len` linked from `base` the device took
/// before refusing `bad`. A `bad` that is NULL or does not point at one of
/// them proves nothing, and work requests that may have been taken must
/// never be handed back as refused (their buffers would be freed under the
/// NIC): then all `len` count as taken.
fn accepted<T>(base: *const T, bad: *const T, len: usize) -> usize {
    let size = std::mem::size_of::<T>();
    let offset = (bad as usize).wrapping_sub(base as usize);
    if bad.is_null() || offset % size != 0 || offset / size >= len {
        return len;
    }
    offset / size
}

fn opcode(op: SendOpcode) -> rdma_sys::ibv_wr_opcode::Type {
    match op {
        SendOpcode::Write => ibv_wr_opcode::IBV_WR_RDMA_WRITE,
        SendOpcode::WriteImm => ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM,
        SendOpcode::Send => ibv_wr_opcode::IBV_WR_SEND,
        SendOpcode::SendImm => ibv_wr_opcode::IBV_WR_SEND_WITH_IMM,
        SendOpcode::Read => ibv_wr_opcode::IBV_WR_RDMA_READ,
        SendOpcode::CompareSwap => ibv_wr_opcode::IBV_WR_ATOMIC_CMP_AND_SWP,
        SendOpcode::FetchAdd => ibv_wr_opcode::IBV_WR_ATOMIC_FETCH_AND_ADD,
    }
}

// SAFETY: completions come from `ibv_poll_cq` on this queue pair's own CQ,
// which reports each work request once, after the NIC is done with it, in
// send-queue order, and always for failed or flushed ones; a refused post
// reports the prefix `bad_wr` proves and otherwise claims every work request
// (see `accepted`); `caps` are the depths the QP and CQ were created with.
unsafe impl QueuePair for VerbsQp {
    fn caps(&self) -> QpCaps {
        self.caps
    }

    unsafe fn post_send(&mut self, wrs: &[SendWr]) -> Result<(), PostError> {
        if wrs.is_empty() {
            return Ok(());
        }
        if wrs.len() > self.send_wrs.len() {
            return Err(PostError {
                accepted: 0,
                error: Error::PostRejected("more work requests than the send queue holds"),
            });
        }
        let base = self.send_wrs.as_mut_ptr();
        let sges = self.send_sges.as_mut_ptr();
        for (i, wr) in wrs.iter().enumerate() {
            self.send_sges[i] = ibv_sge {
                addr: wr.sge.addr,
                length: wr.sge.len,
                lkey: wr.sge.lkey,
            };
            let out = &mut self.send_wrs[i];
            out.wr_id = wr.wr_id;
            out.next = if i + 1 < wrs.len() {
                base.wrapping_add(i + 1)
            } else {
                std::ptr::null_mut()
            };
            out.sg_list = sges.wrapping_add(i);
            out.num_sge = i32::from(wr.sge.len != 0);
            out.opcode = opcode(wr.opcode);
            out.send_flags = wr.flags.bits();
            out.imm_data_invalidated_rkey_union.imm_data = wr.imm.to_be();
            if wr.opcode.is_atomic() {
                out.wr.atomic = rdma_sys::atomic_t {
                    remote_addr: wr.remote_addr,
                    compare_add: wr.compare_add,
                    swap: wr.swap,
                    rkey: wr.rkey,
                };
            } else {
                out.wr.rdma = rdma_sys::rdma_t {
                    remote_addr: wr.remote_addr,
                    rkey: wr.rkey,
                };
            }
        }
        let mut bad: *mut ibv_send_wr = std::ptr::null_mut();
        // SAFETY: the list is linked within `send_wrs`, each SGE points into
        // `send_sges`, both live across the call; the caller guarantees the
        // memory the SGEs name (this function's contract).
        let ret = unsafe { rdma_sys::ibv_post_send(self.qp, base, &mut bad) };
        if ret == 0 {
            return Ok(());
        }
        Err(PostError {
            accepted: accepted(base, bad, wrs.len()),
            error: verbs_error("ibv_post_send", ret),
        })
    }

    unsafe fn post_recv(&mut self, wrs: &[RecvWr]) -> Result<(), PostError> {
        if wrs.is_empty() {
            return Ok(());
        }
        if wrs.len() > self.recv_wrs.len() {
            return Err(PostError {
                accepted: 0,
                error: Error::PostRejected("more receives than the receive queue holds"),
            });
        }
        let base = self.recv_wrs.as_mut_ptr();
        let sges = self.recv_sges.as_mut_ptr();
        for (i, wr) in wrs.iter().enumerate() {
            self.recv_sges[i] = ibv_sge {
                addr: wr.sge.addr,
                length: wr.sge.len,
                lkey: wr.sge.lkey,
            };
            let out = &mut self.recv_wrs[i];
            out.wr_id = wr.wr_id;
            out.next = if i + 1 < wrs.len() {
                base.wrapping_add(i + 1)
            } else {
                std::ptr::null_mut()
            };
            out.sg_list = sges.wrapping_add(i);
            out.num_sge = i32::from(wr.sge.len != 0);
        }
        let mut bad: *mut ibv_recv_wr = std::ptr::null_mut();
        // SAFETY: as for `post_send`.
        let ret = unsafe { rdma_sys::ibv_post_recv(self.qp, base, &mut bad) };
        if ret == 0 {
            return Ok(());
        }
        Err(PostError {
            accepted: accepted(base, bad, wrs.len()),
            error: verbs_error("ibv_post_recv", ret),
        })
    }

    fn poll_cq(&mut self, out: &mut [RawCompletion]) -> Result<usize, Error> {
        let max = out.len().min(self.wcs.len());
        // SAFETY: the CQ is live; `wcs` has room for `max` entries.
        let n = unsafe { rdma_sys::ibv_poll_cq(self.cq.cq, max as i32, self.wcs.as_mut_ptr()) };
        if n < 0 {
            // ibv_poll_cq reports failure as a negative count, not an errno.
            return Err(Error::Verbs {
                verb: "ibv_poll_cq",
                source: std::io::Error::other(format!(
                    "returned {n}: the completion queue is broken"
                )),
            });
        }
        for (slot, wc) in out.iter_mut().zip(&self.wcs[..n as usize]) {
            let status = WcStatus::from_code(wc.status);
            // Only a successful completion's flags and length are defined.
            let ok = status.is_success();
            let with_imm = ok && wc.wc_flags & rdma_sys::ibv_wc_flags::IBV_WC_WITH_IMM.0 != 0;
            *slot = RawCompletion {
                wr_id: wc.wr_id,
                status,
                byte_len: if ok { wc.byte_len } else { 0 },
                // SAFETY: with IBV_WC_WITH_IMM the union holds the immediate.
                imm: with_imm
                    .then(|| u32::from_be(unsafe { wc.imm_data_invalidated_rkey_union.imm_data })),
                by_write_imm: ok && wc.opcode == rdma_sys::ibv_wc_opcode::IBV_WC_RECV_RDMA_WITH_IMM,
            };
        }
        Ok(n as usize)
    }

    fn set_error(&mut self) -> Result<(), Error> {
        // SAFETY: a plain C struct, for which all-zero is valid.
        let mut attr: ibv_qp_attr = unsafe { std::mem::zeroed() };
        attr.qp_state = ibv_qp_state::IBV_QPS_ERR;
        self.modify(
            &mut attr,
            ibv_qp_attr_mask::IBV_QP_STATE,
            "ibv_modify_qp(ERR)",
        )
    }

    fn completion_events(&self) -> Option<Arc<dyn CompletionEvents>> {
        let events = self
            .events
            .get_or_init(|| VerbsEvents::new(Arc::clone(&self.cq)).ok().map(Arc::new));
        events.clone().map(|e| e as Arc<dyn CompletionEvents>)
    }
}

impl Drop for VerbsQp {
    fn drop(&mut self) {
        // SAFETY: the QP is destroyed once; the ring that posted to it has
        // drained or leaked its buffers before dropping it.
        unsafe { rdma_sys::ibv_destroy_qp(self.qp) };
    }
}

#[cfg(test)]
mod tests {
    use super::accepted;

    #[test]
    fn bad_wr_is_trusted_only_when_it_names_a_posted_request() {
        let list = [0u64; 4];
        let base = list.as_ptr();
        assert_eq!(accepted(base, base.wrapping_add(2), 4), 2);
        assert_eq!(accepted(base, base, 4), 0);
        // NULL, past the end, before the start, or misaligned: unprovable,
        // so every request counts as taken.
        assert_eq!(accepted(base, std::ptr::null(), 4), 4);
        assert_eq!(accepted(base, base.wrapping_add(4), 4), 4);
        assert_eq!(accepted(base, base.wrapping_add(1000), 4), 4);
        assert_eq!(accepted(base, base.wrapping_sub(1), 4), 4);
        let odd = (base as usize + 3) as *const u64;
        assert_eq!(accepted(base, odd, 4), 4);
    }
}
