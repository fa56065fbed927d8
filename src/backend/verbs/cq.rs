//! Completion queues over verbs: `ibv_create_cq` with a completion channel,
//! polled in batches.

use std::sync::{Arc, OnceLock};

use rdma_sys::{ibv_comp_channel, ibv_cq, ibv_wc};

use super::device::{last_error, DeviceInner};
use super::events::VerbsEvents;
use super::zeroed;
use crate::backend::{CompletionEvents, CompletionQueue, CqId, RawCompletion, WcStatus};
use crate::error::Error;

/// The CQ and its channel, shared by the poller, the queue pairs created on
/// it (so it outlives them), and the completion events handed to reactors.
pub(super) struct CqInner {
    pub(super) dev: Arc<DeviceInner>,
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
        // SAFETY: every QP created on this CQ holds an `Arc` of this value,
        // so they are destroyed; events are acknowledged as they are taken,
        // so the CQ and then its channel can be destroyed, once each.
        unsafe {
            rdma_sys::ibv_destroy_cq(self.cq);
            rdma_sys::ibv_destroy_comp_channel(self.channel);
        }
    }
}

/// A verbs completion queue with its completion channel: where the work
/// requests of any number of queue pairs complete. It has one owner, the
/// poller (a ring).
pub struct VerbsCq {
    pub(super) inner: Arc<CqInner>,
    id: CqId,
    entries: u32,
    wcs: Vec<ibv_wc>,
    events: OnceLock<Arc<VerbsEvents>>,
}

// SAFETY: the CQ is owned through `inner` (thread-safe); `wcs` is plain data
// used only through `&mut self`.
unsafe impl Send for VerbsCq {}

impl std::fmt::Debug for VerbsCq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsCq")
            .field("entries", &self.entries)
            .finish()
    }
}

impl VerbsCq {
    pub(super) fn new(dev: &Arc<DeviceInner>, entries: u32) -> Result<Self, Error> {
        let limits = dev.limits;
        if entries == 0 || entries > limits.max_cqe {
            return Err(Error::Verbs {
                verb: "ibv_create_cq",
                source: std::io::Error::other(format!(
                    "{entries} entries: the device allows 1..={}",
                    limits.max_cqe
                )),
            });
        }
        let id = CqId::fresh();
        // SAFETY: the context is open while `dev` lives.
        let channel = unsafe { rdma_sys::ibv_create_comp_channel(dev.ctx) };
        if channel.is_null() {
            return Err(last_error("ibv_create_comp_channel"));
        }
        // SAFETY: as above; the channel was just created on this context. The
        // CQ's context carries its identity, so that an async event naming
        // it can be told apart.
        let cq = unsafe {
            rdma_sys::ibv_create_cq(dev.ctx, entries as i32, id.get() as *mut _, channel, 0)
        };
        if cq.is_null() {
            let err = last_error("ibv_create_cq");
            // SAFETY: created above, unused.
            unsafe { rdma_sys::ibv_destroy_comp_channel(channel) };
            return Err(err);
        }
        Ok(VerbsCq {
            inner: Arc::new(CqInner {
                dev: Arc::clone(dev),
                channel,
                cq,
            }),
            id,
            entries,
            wcs: zeroed(64),
            events: OnceLock::new(),
        })
    }
}

/// A work completion as the ring takes it: all the verbs backend does per
/// completion after the provider's poll. Apart so that its cost can be
/// measured without a device (see `translation_probe`).
#[inline]
pub(super) fn raw_completion(wc: &ibv_wc) -> RawCompletion {
    let status = WcStatus::from_code(wc.status);
    // Only a successful receive's flags and length are defined: a provider
    // may set IBV_WC_WITH_IMM on the sender's own completion of a send or
    // write with immediate and write neither the immediate nor the length
    // (`wcs` is reused, so those would be an earlier completion's).
    let recv = status.is_success() && wc.opcode & rdma_sys::ibv_wc_opcode::IBV_WC_RECV != 0;
    let with_imm = recv && wc.wc_flags & rdma_sys::ibv_wc_flags::IBV_WC_WITH_IMM.0 != 0;
    RawCompletion {
        wr_id: wc.wr_id,
        qp_num: wc.qp_num,
        status,
        byte_len: if recv { wc.byte_len } else { 0 },
        // SAFETY: with IBV_WC_WITH_IMM the union holds the immediate.
        imm: with_imm.then(|| u32::from_be(unsafe { wc.imm_data_invalidated_rkey_union.imm_data })),
        by_write_imm: recv && wc.opcode == rdma_sys::ibv_wc_opcode::IBV_WC_RECV_RDMA_WITH_IMM,
    }
}

// SAFETY: completions come from `ibv_poll_cq`, which reports each work
// request once, after the NIC is done with it, with the number of the QP it
// ran on; the id and depth are fixed at creation.
unsafe impl CompletionQueue for VerbsCq {
    fn id(&self) -> CqId {
        self.id
    }

    fn entries(&self) -> u32 {
        self.entries
    }

    fn poll(&mut self, out: &mut [RawCompletion]) -> Result<usize, Error> {
        // A short batch means the queue is drained (the trait's contract),
        // so the staging array must take as many as asked; it grows only
        // past the largest batch asked so far.
        if out.len() > self.wcs.len() {
            self.wcs = zeroed(out.len());
        }
        let max = out.len().min(i32::MAX as usize);
        // SAFETY: the CQ is live; `wcs` has room for `max` entries.
        let n = unsafe { rdma_sys::ibv_poll_cq(self.inner.cq, max as i32, self.wcs.as_mut_ptr()) };
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
            *slot = raw_completion(wc);
        }
        Ok(n as usize)
    }

    fn completion_events(&self) -> Option<Arc<dyn CompletionEvents>> {
        // A failure (setting the channel non-blocking) is not kept: the
        // next call tries again. Two made at once share the channel, and
        // the one not kept only set its flag.
        let events = match self.events.get() {
            Some(events) => events,
            None => {
                let made = VerbsEvents::new(Arc::clone(&self.inner)).ok()?;
                self.events.get_or_init(|| Arc::new(made))
            }
        };
        Some(Arc::clone(events) as Arc<dyn CompletionEvents>)
    }
}
