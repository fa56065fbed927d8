//! RC queue pairs over verbs: creation on a completion queue (their own or
//! a shared one) and optionally a shared receive queue, state transitions,
//! linked-list posts.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use rdma_sys::{
    ibv_qp, ibv_qp_attr, ibv_qp_attr_mask, ibv_qp_init_attr, ibv_qp_state, ibv_recv_wr,
    ibv_send_wr, ibv_sge, ibv_wr_opcode,
};

use super::cq::{CqInner, VerbsCq};
use super::device::{query_gid, verbs_error};
use super::pd::{PdInner, VerbsPd};
use super::srq::VerbsSrq;
use super::{accepted, zeroed};
use crate::backend::{
    CompletionQueue, PostError, QpCaps, QpConfig, QueuePair, RecvWr, SendOpcode, SendWr, Sge,
};
use crate::connect::Endpoint;
use crate::error::Error;

/// An RC queue pair on a verbs device. Created in INIT (receives may be
/// posted), on a completion queue of its own
/// ([`VerbsDevice::create_qp`](super::VerbsDevice::create_qp)) or a shared
/// one ([`VerbsDevice::create_qp_on`](super::VerbsDevice::create_qp_on));
/// [`connect`](Self::connect) moves it through RTR to RTS.
pub struct VerbsQp {
    pd: Arc<PdInner>,
    _cq: Arc<CqInner>,
    own_cq: Option<VerbsCq>,
    qp: *mut ibv_qp,
    caps: QpCaps,
    config: QpConfig,
    psn: u32,
    connected: AtomicBool,
    /// Held around `ibv_modify_qp` and `ibv_query_qp`: libibverbs writes
    /// its copy of the state (`qp->state`) after the provider's call,
    /// unlocked, so two threads changing the state through `&self` would
    /// race on it.
    state_lock: std::sync::Mutex<()>,
    send_wrs: Vec<ibv_send_wr>,
    recv_wrs: Vec<ibv_recv_wr>,
}

// SAFETY: the QP pointer is owned by this value; libibverbs QPs may be used
// from any thread, `&mut self` serializes posting, and the state changes
// and queries through `&self` (`ibv_modify_qp`, `ibv_query_qp`) hold
// `state_lock`.
unsafe impl Send for VerbsQp {}
// SAFETY: as above: shared references only read fixed fields or change or
// query the state under `state_lock`.
unsafe impl Sync for VerbsQp {}

impl std::fmt::Debug for VerbsQp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsQp")
            .field("qpn", &self.qpn())
            .field("caps", &self.caps)
            .finish()
    }
}

impl VerbsQp {
    pub(super) fn new(
        pd: &VerbsPd,
        cq: &VerbsCq,
        srq: Option<&VerbsSrq>,
        config: QpConfig,
    ) -> Result<Self, Error> {
        use crate::backend::SharedReceiveQueue;
        let pd = Arc::clone(&pd.inner);
        let limits = pd.dev.limits;
        // Receive limits mean nothing with a shared receive queue, and some
        // devices refuse a QP whose (ignored) receive depth exceeds their
        // cap: ask for none.
        let max_recv_wr = if srq.is_some() { 0 } else { config.max_recv_wr };
        if config.max_send_wr == 0
            || config.max_send_wr > limits.max_qp_wr
            || max_recv_wr > limits.max_qp_wr
        {
            return Err(Error::Verbs {
                verb: "ibv_create_qp",
                source: std::io::Error::other(format!(
                    "queue depths {}/{} exceed the device's max_qp_wr {}",
                    config.max_send_wr, max_recv_wr, limits.max_qp_wr
                )),
            });
        }
        if let Some(why) = config.refusal() {
            return Err(Error::Verbs {
                verb: "ibv_create_qp",
                source: std::io::Error::other(why),
            });
        }
        // A destroyed queue's `ibv_srq` is freed memory: it must never
        // reach `ibv_create_qp`.
        if srq.is_some_and(VerbsSrq::is_destroyed) {
            return Err(Error::Verbs {
                verb: "ibv_create_qp",
                source: std::io::Error::other("the shared receive queue was destroyed"),
            });
        }
        // libibverbs names the completion queue to the kernel by a handle
        // of its own device context, looked up in the protection domain's:
        // across two openings of a device (or two devices) it would name
        // another queue, or none.
        if cq.inner.dev.ctx != pd.dev.ctx {
            return Err(Error::Verbs {
                verb: "ibv_create_qp",
                source: std::io::Error::other(
                    "the completion queue and the protection domain come from different \
                     openings of the device (open it once and share the VerbsDevice)",
                ),
            });
        }
        if srq.is_some_and(|s| s.caps().pd != pd.id) {
            return Err(Error::Verbs {
                verb: "ibv_create_qp",
                source: std::io::Error::other(
                    "the shared receive queue belongs to another protection domain",
                ),
            });
        }
        let max_sge = limits.max_sge.max(1);
        let max_send_sge = config.max_send_sge.clamp(1, max_sge);
        let max_recv_sge = if srq.is_some() {
            0
        } else {
            config.max_recv_sge.clamp(1, max_sge)
        };
        // SAFETY: a plain C struct, for which all-zero is valid.
        let mut init: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        init.send_cq = cq.inner.cq;
        init.recv_cq = cq.inner.cq;
        init.srq = srq.map_or(std::ptr::null_mut(), VerbsSrq::raw);
        init.qp_type = rdma_sys::ibv_qp_type::IBV_QPT_RC;
        init.sq_sig_all = 0;
        let mut max_inline_data = config.max_inline_data;
        let qp = loop {
            // In and out: set afresh for each try.
            init.cap.max_send_wr = config.max_send_wr;
            init.cap.max_recv_wr = if srq.is_some() { 0 } else { max_recv_wr.max(1) };
            init.cap.max_send_sge = max_send_sge;
            init.cap.max_recv_sge = if srq.is_some() { 0 } else { max_recv_sge };
            init.cap.max_inline_data = max_inline_data;
            // SAFETY: the PD, CQ and SRQ are live; `init` is a valid in/out
            // pointer.
            let qp = unsafe { rdma_sys::ibv_create_qp(pd.pd, &mut init) };
            if !qp.is_null() {
                break qp;
            }
            let err = std::io::Error::last_os_error();
            // Devices report no inline limit to check against beforehand
            // and refuse a queue pair asking for more with EINVAL: ask
            // again for half as much, down to none. Another fault fails
            // every try alike and is reported as it is.
            if max_inline_data == 0 || err.raw_os_error() != Some(libc::EINVAL) {
                return Err(Error::Verbs {
                    verb: "ibv_create_qp",
                    source: err,
                });
            }
            max_inline_data /= 2;
        };
        // SAFETY: just created.
        let qp_num = unsafe { (*qp).qp_num };
        let caps = QpCaps {
            qp_num,
            cq: cq.id(),
            srq: srq.map(|s| s.caps().id),
            pd: pd.id,
            max_send_wr: config.max_send_wr,
            max_recv_wr,
            max_send_sge,
            max_recv_sge,
            max_inline_data: init.cap.max_inline_data.min(max_inline_data),
            atomics: limits.atomics,
            // A device that reports no figure for reads is taken to allow
            // one element.
            max_read_sge: max_send_sge.min(limits.max_sge_rd.max(1)),
            // A port that reports no figure is taken at RC's.
            max_message: match pd.dev.max_msg_sz {
                0 => crate::op::MAX_MESSAGE_LEN as u32,
                max => max.min(crate::op::MAX_MESSAGE_LEN as u32),
            },
        };
        let this = VerbsQp {
            send_wrs: zeroed(config.max_send_wr as usize + 1),
            recv_wrs: zeroed(max_recv_wr.max(1) as usize),
            pd,
            _cq: Arc::clone(&cq.inner),
            own_cq: None,
            qp,
            caps,
            config,
            psn: random_psn(),
            connected: AtomicBool::new(false),
            state_lock: std::sync::Mutex::new(()),
        };
        this.enter_init()?;
        Ok(this)
    }

    pub(super) fn with_own_cq(mut self, cq: VerbsCq) -> Self {
        self.own_cq = Some(cq);
        self
    }

    /// The device's limits.
    pub fn device_limits(&self) -> super::DeviceLimits {
        self.pd.dev.limits
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
        let (rd_atomic, init_rd_atomic) = dev.limits.rd_atomic_depths(&self.config);
        Endpoint {
            qpn: self.qpn(),
            psn: self.psn,
            lid: dev.lid,
            gid: dev.gid,
            mtu: dev.active_mtu as u8,
            rd_atomic,
            init_rd_atomic,
        }
    }

    fn modify(
        &self,
        attr: &mut ibv_qp_attr,
        mask: ibv_qp_attr_mask,
        verb: &'static str,
    ) -> Result<(), Error> {
        let _state = self.state_lock.lock().unwrap_or_else(|p| p.into_inner());
        // SAFETY: the QP is live; `attr` is valid for the fields `mask` names.
        let ret = unsafe { rdma_sys::ibv_modify_qp(self.qp, attr, mask.0 as i32) };
        if ret != 0 {
            return Err(verbs_error(verb, ret));
        }
        Ok(())
    }

    fn enter_init(&self) -> Result<(), Error> {
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
    /// It takes `&self`, so a queue pair already in a ring (with receives
    /// posted, say) can be connected through [`Ring::qp`](crate::ring::Ring::qp).
    /// A queue pair whose connect failed may be left half way (ready to
    /// receive, not to send): connect a new one rather than retry.
    ///
    /// The device refusing `remote` (a GID nobody answers for, say; on
    /// RoCE, one of zeros) is [`Error::Handshake`] at the step "connecting
    /// to the peer's endpoint", the peer's doing, which a listener drops to
    /// serve on; unless our own GID is gone from the device's table (its
    /// interface lost the address), which is [`Error::Verbs`].
    pub fn connect(&self, remote: &Endpoint) -> Result<(), Error> {
        if !(1..=5).contains(&remote.mtu) {
            return Err(Error::Incompatible(
                "the peer's MTU must be an ibv_mtu code (1..=5)",
            ));
        }
        let dev = Arc::clone(&self.pd.dev);
        let limits = dev.limits;
        // SAFETY: a plain C struct, for which all-zero is valid.
        let mut attr: ibv_qp_attr = unsafe { std::mem::zeroed() };
        attr.qp_state = ibv_qp_state::IBV_QPS_RTR;
        attr.path_mtu = dev.active_mtu.min(u32::from(remote.mtu));
        attr.dest_qp_num = remote.qpn;
        attr.rq_psn = remote.psn;
        // Answer as many READs/atomics as the peer may issue, within our means.
        let ours = limits.rd_atomic_depths(&self.config).0;
        attr.max_dest_rd_atomic = match remote.init_rd_atomic {
            0 => ours,
            theirs => ours.min(theirs),
        };
        attr.min_rnr_timer = MIN_RNR_TIMER;
        attr.ah_attr.dlid = remote.lid;
        attr.ah_attr.sl = self.config.service_level;
        attr.ah_attr.src_path_bits = 0;
        attr.ah_attr.port_num = dev.port;
        if remote.gid.iter().any(|&b| b != 0) {
            attr.ah_attr.is_global = 1;
            attr.ah_attr.grh.dgid.raw = remote.gid;
            attr.ah_attr.grh.sgid_index = dev.gid_index;
            attr.ah_attr.grh.hop_limit = 64;
            attr.ah_attr.grh.traffic_class = self.config.traffic_class;
        }
        let mask = ibv_qp_attr_mask::IBV_QP_STATE
            | ibv_qp_attr_mask::IBV_QP_AV
            | ibv_qp_attr_mask::IBV_QP_PATH_MTU
            | ibv_qp_attr_mask::IBV_QP_DEST_QPN
            | ibv_qp_attr_mask::IBV_QP_RQ_PSN
            | ibv_qp_attr_mask::IBV_QP_MAX_DEST_RD_ATOMIC
            | ibv_qp_attr_mask::IBV_QP_MIN_RNR_TIMER;
        self.modify(&mut attr, mask, "ibv_modify_qp(RTR)")
            .map_err(|e| refused_endpoint(&dev, remote, e))?;

        // SAFETY: as above.
        let mut attr: ibv_qp_attr = unsafe { std::mem::zeroed() };
        attr.qp_state = ibv_qp_state::IBV_QPS_RTS;
        attr.timeout = self.config.ack_timeout;
        attr.retry_cnt = self.config.retry_cnt.min(7);
        // 7 retries for ever: the config's to ask for (its default stays
        // below it).
        attr.rnr_retry = self.config.rnr_retry.min(7);
        attr.sq_psn = self.psn;
        // Never have more outstanding than the peer can answer. A peer
        // that did not say (an endpoint made by hand for another verbs
        // program) gets one at a time, which every RC responder answers:
        // more than it has room for would be refused as an invalid
        // request, failing the queue pair.
        let ours = limits.rd_atomic_depths(&self.config).1;
        attr.max_rd_atomic = match remote.rd_atomic {
            0 => ours.min(1),
            theirs => ours.min(theirs),
        };
        let mask = ibv_qp_attr_mask::IBV_QP_STATE
            | ibv_qp_attr_mask::IBV_QP_TIMEOUT
            | ibv_qp_attr_mask::IBV_QP_RETRY_CNT
            | ibv_qp_attr_mask::IBV_QP_RNR_RETRY
            | ibv_qp_attr_mask::IBV_QP_SQ_PSN
            | ibv_qp_attr_mask::IBV_QP_MAX_QP_RD_ATOMIC;
        self.modify(&mut attr, mask, "ibv_modify_qp(RTS)")?;
        self.connected.store(true, Ordering::Release);
        Ok(())
    }

    /// Applies attributes computed elsewhere (rdma_cm's `rdma_init_qp_attr`).
    pub(crate) fn modify_raw(
        &self,
        attr: &mut ibv_qp_attr,
        mask: i32,
        verb: &'static str,
    ) -> Result<(), Error> {
        self.modify(attr, ibv_qp_attr_mask(mask as u32), verb)
    }

    pub(crate) fn mark_connected(&self) {
        self.connected.store(true, Ordering::Release);
    }

    /// Whether [`connect`](Self::connect) has succeeded.
    pub fn is_connected(&self) -> bool {
        self.connected.load(Ordering::Acquire)
    }

    /// What the device says the queue pair runs with now
    /// (`ibv_query_qp`), however it was connected: over TCP or rdma_cm,
    /// whose attributes are its own unless [`QpConfig`] sets them.
    ///
    /// ```no_run
    /// // Needs an RDMA device, so it is compiled but not run here.
    /// use rdma_ring::backend::verbs::VerbsDevice;
    /// use rdma_ring::backend::QpConfig;
    /// let dev = VerbsDevice::open("rxe0").unwrap();
    /// let pd = dev.alloc_pd().unwrap();
    /// let qp = dev.create_qp(&pd, QpConfig { ack_timeout: 12, ..QpConfig::default() }).unwrap();
    /// // ... connect it, then:
    /// assert_eq!(qp.attributes().unwrap().ack_timeout, 12);
    /// ```
    pub fn attributes(&self) -> Result<QpAttributes, Error> {
        // SAFETY: plain C structs, for which all-zero is valid.
        let mut attr: ibv_qp_attr = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let mut init: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        let mask = ibv_qp_attr_mask::IBV_QP_STATE
            | ibv_qp_attr_mask::IBV_QP_AV
            | ibv_qp_attr_mask::IBV_QP_PATH_MTU
            | ibv_qp_attr_mask::IBV_QP_TIMEOUT
            | ibv_qp_attr_mask::IBV_QP_RETRY_CNT
            | ibv_qp_attr_mask::IBV_QP_RNR_RETRY
            | ibv_qp_attr_mask::IBV_QP_MIN_RNR_TIMER
            | ibv_qp_attr_mask::IBV_QP_MAX_QP_RD_ATOMIC
            | ibv_qp_attr_mask::IBV_QP_MAX_DEST_RD_ATOMIC;
        let _state = self.state_lock.lock().unwrap_or_else(|p| p.into_inner());
        // SAFETY: the QP is live until `Drop`; both out-pointers are valid
        // and written only during the call.
        let ret = unsafe { rdma_sys::ibv_query_qp(self.qp, &mut attr, mask.0 as i32, &mut init) };
        if ret != 0 {
            return Err(verbs_error("ibv_query_qp", ret));
        }
        Ok(QpAttributes {
            path_mtu: match attr.path_mtu as u32 {
                m @ 1..=5 => 128 << m,
                _ => 0,
            },
            ack_timeout: attr.timeout,
            retry_cnt: attr.retry_cnt,
            rnr_retry: attr.rnr_retry,
            min_rnr_timer: attr.min_rnr_timer,
            max_rd_atomic: attr.max_rd_atomic,
            max_dest_rd_atomic: attr.max_dest_rd_atomic,
            traffic_class: attr.ah_attr.grh.traffic_class,
            service_level: attr.ah_attr.sl,
        })
    }

    /// Moves the queue pair to the error state (see
    /// [`QueuePair::set_error`]), through a shared reference.
    pub fn set_error_shared(&self) -> Result<(), Error> {
        // SAFETY: a plain C struct, for which all-zero is valid.
        let mut attr: ibv_qp_attr = unsafe { std::mem::zeroed() };
        attr.qp_state = ibv_qp_state::IBV_QPS_ERR;
        self.modify(
            &mut attr,
            ibv_qp_attr_mask::IBV_QP_STATE,
            "ibv_modify_qp(ERR)",
        )
    }
}

/// A queue pair's attributes as the device reports them
/// ([`VerbsQp::attributes`]).
///
/// ```
/// use rdma_ring::backend::verbs::QpAttributes;
/// let attrs = QpAttributes {
///     path_mtu: 1024, ack_timeout: 16, retry_cnt: 7, rnr_retry: 6,
///     min_rnr_timer: 12, max_rd_atomic: 16, max_dest_rd_atomic: 16,
///     traffic_class: 0, service_level: 0,
/// };
/// // 4.096 µs × 2^16: about 268 ms without an ACK before a retry.
/// assert_eq!(attrs.ack_timeout, 16);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpAttributes {
    /// The path MTU in bytes (0 before the queue pair is ready to receive).
    pub path_mtu: u32,
    /// Local ACK timeout: 4.096 µs × 2^`ack_timeout` (0: never).
    pub ack_timeout: u8,
    /// Retries after a timeout before the queue pair fails.
    pub retry_cnt: u8,
    /// Retries after a receiver-not-ready NAK (7: for ever).
    pub rnr_retry: u8,
    /// The RNR NAK timer this side asks senders to wait (an IB code).
    pub min_rnr_timer: u8,
    /// READs and atomics this side may have outstanding as initiator.
    pub max_rd_atomic: u8,
    /// READs and atomics this side answers at once as responder.
    pub max_dest_rd_atomic: u8,
    /// The traffic class of its packets (the GRH's; 0 without one).
    pub traffic_class: u8,
    /// The service level of its packets.
    pub service_level: u8,
}

/// The RNR NAK timer our queue pairs ask senders to wait before trying a
/// send again that found no receive posted: code 12, 0.64 ms (code 0,
/// rdma_cm's choice, means 655 ms).
pub(crate) const MIN_RNR_TIMER: u8 = 12;

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

/// Fills the first `wrs.len()` entries of `list` (refused if it has no
/// room for them) from the ring's work requests, linked in order, each naming its
/// elements in `sges`: all the verbs backend does per work request before
/// the provider's post. Apart so that its cost can be measured without a
/// device (see `translation_probe`).
#[inline]
pub(super) fn fill_send_list(
    list: &mut [ibv_send_wr],
    wrs: &[SendWr],
    sges: &[Sge],
) -> Result<(), PostError> {
    let Some(list) = list.get_mut(..wrs.len()) else {
        return Err(PostError {
            accepted: 0,
            error: Error::PostRejected("more work requests than the send queue holds"),
        });
    };
    let base = list.as_mut_ptr();
    for (i, (wr, out)) in wrs.iter().zip(list.iter_mut()).enumerate() {
        let Some(elements) = wr.sges.of(sges) else {
            return Err(PostError {
                accepted: 0,
                error: Error::PostRejected("scatter/gather span out of range"),
            });
        };
        out.wr_id = wr.wr_id;
        out.next = if i + 1 < wrs.len() {
            base.wrapping_add(i + 1)
        } else {
            std::ptr::null_mut()
        };
        // `Sge` is laid out as `ibv_sge` (asserted in `verbs`), and the
        // NIC only reads the list.
        out.sg_list = elements.as_ptr().cast::<ibv_sge>().cast_mut();
        out.num_sge = elements.len() as i32;
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
    Ok(())
}

// SAFETY: work requests complete on the CQ this QP was created on (named in
// `caps`), reported by `ibv_poll_cq` once each, after the NIC is done with
// them, in send-queue order, and always for failed or flushed ones; posts
// hand the NIC exactly the element lists the spans name; a refused post
// reports the prefix `bad_wr` proves and otherwise claims every work
// request (see `accepted`); `caps` are fixed at creation; the own CQ is
// handed out once.
unsafe impl QueuePair for VerbsQp {
    type Cq = VerbsCq;
    type Srq = VerbsSrq;

    fn caps(&self) -> QpCaps {
        self.caps
    }

    unsafe fn post_send(&mut self, wrs: &[SendWr], sges: &[Sge]) -> Result<(), PostError> {
        if wrs.is_empty() {
            return Ok(());
        }
        fill_send_list(&mut self.send_wrs, wrs, sges)?;
        let base = self.send_wrs.as_mut_ptr();
        let mut bad: *mut ibv_send_wr = std::ptr::null_mut();
        // SAFETY: the list is linked within `send_wrs`, each element list lies
        // in `sges`, both live across the call; the caller guarantees the
        // memory the elements name (this function's contract).
        let ret = unsafe { rdma_sys::ibv_post_send(self.qp, base, &mut bad) };
        if ret == 0 {
            return Ok(());
        }
        Err(PostError {
            accepted: accepted(base, bad, wrs.len()),
            error: verbs_error("ibv_post_send", ret),
        })
    }

    unsafe fn post_recv(&mut self, wrs: &[RecvWr], sges: &[Sge]) -> Result<(), PostError> {
        if wrs.is_empty() {
            return Ok(());
        }
        if self.caps.srq.is_some() {
            return Err(PostError {
                accepted: 0,
                error: Error::PostRejected(
                    "the queue pair takes its receives from a shared receive queue",
                ),
            });
        }
        if wrs.len() > self.recv_wrs.len() {
            return Err(PostError {
                accepted: 0,
                error: Error::PostRejected("more receives than the receive queue holds"),
            });
        }
        let base = self.recv_wrs.as_mut_ptr();
        for (i, wr) in wrs.iter().enumerate() {
            let Some(list) = wr.sges.of(sges) else {
                return Err(PostError {
                    accepted: 0,
                    error: Error::PostRejected("scatter/gather span out of range"),
                });
            };
            let out = &mut self.recv_wrs[i];
            out.wr_id = wr.wr_id;
            out.next = if i + 1 < wrs.len() {
                base.wrapping_add(i + 1)
            } else {
                std::ptr::null_mut()
            };
            out.sg_list = list.as_ptr().cast::<ibv_sge>().cast_mut();
            out.num_sge = list.len() as i32;
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

    fn set_error(&mut self) -> Result<(), Error> {
        self.set_error_shared()
    }

    fn take_cq(&mut self) -> Option<VerbsCq> {
        self.own_cq.take()
    }
}

impl Drop for VerbsQp {
    fn drop(&mut self) {
        // SAFETY: the QP is destroyed once; the ring that posted to it has
        // drained or leaked its buffers before dropping it.
        unsafe { rdma_sys::ibv_destroy_qp(self.qp) };
    }
}

/// Why the device refused to make a queue pair ready to receive from
/// `remote`. The peer's record is what RTR takes from outside, so with
/// our own GID still in place (RoCE's GID table follows the interface's
/// addresses) the refusal is the peer's: a handshake failure, which a
/// listener drops to serve on. A GID of ours gone or changed is ours.
fn refused_endpoint(dev: &super::device::DeviceInner, remote: &Endpoint, e: Error) -> Error {
    let Error::Verbs { verb, source } = e else {
        return e;
    };
    match query_gid(dev.ctx, dev.port, dev.gid_index) {
        Ok(gid) if gid == dev.gid => Error::Handshake {
            step: "connecting to the peer's endpoint",
            reason: format!("{verb} refused {remote:?}: {source}"),
        },
        _ => Error::Verbs {
            verb: "ibv_modify_qp(RTR), our GID gone or changed since the device was opened",
            source,
        },
    }
}
