//! Shared receive queues over verbs.

use std::sync::Arc;

use rdma_sys::{ibv_recv_wr, ibv_sge, ibv_srq, ibv_srq_attr, ibv_srq_init_attr};

use super::device::{last_error, verbs_error};
use super::pd::{PdInner, VerbsPd};
use super::{accepted, zeroed};
use crate::backend::{PostError, RecvWr, Sge, SharedReceiveQueue, SrqCaps, SrqConfig, SrqId};
use crate::error::Error;

/// A verbs shared receive queue (`ibv_create_srq`): receives posted once,
/// consumed by whichever of its queue pairs a message arrives on.
///
/// The device refuses to destroy one that queue pairs are still attached
/// to: outside a ring (which orders its teardown), drop its queue pairs
/// first, or the queue stays with the device until the device is closed.
pub struct VerbsSrq {
    _pd: Arc<PdInner>,
    srq: *mut ibv_srq,
    caps: SrqCaps,
    recv_wrs: Vec<ibv_recv_wr>,
    destroyed: bool,
}

// SAFETY: the SRQ pointer is owned by this value; libibverbs SRQs may be
// used from any thread, and `&mut self` serializes posting.
unsafe impl Send for VerbsSrq {}

impl std::fmt::Debug for VerbsSrq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsSrq")
            .field("caps", &self.caps)
            .finish()
    }
}

impl VerbsSrq {
    pub(super) fn new(pd: &VerbsPd, config: SrqConfig) -> Result<Self, Error> {
        let pd = Arc::clone(&pd.inner);
        let limits = pd.dev.limits;
        if config.max_wr == 0 || config.max_wr > limits.max_srq_wr {
            return Err(Error::Verbs {
                verb: "ibv_create_srq",
                source: std::io::Error::other(format!(
                    "{} receives: the device allows 1..={}",
                    config.max_wr, limits.max_srq_wr
                )),
            });
        }
        let id = SrqId::fresh();
        let max_sge = config.max_sge.clamp(1, limits.max_srq_sge.max(1));
        let mut init = ibv_srq_init_attr {
            // The SRQ's context carries its identity, so that an async event
            // naming it can be told apart.
            srq_context: id.get() as *mut _,
            attr: ibv_srq_attr {
                max_wr: config.max_wr,
                max_sge,
                srq_limit: 0,
            },
        };
        // SAFETY: the PD is live; `init` is a valid in/out pointer.
        let srq = unsafe { rdma_sys::ibv_create_srq(pd.pd, &mut init) };
        if srq.is_null() {
            return Err(last_error("ibv_create_srq"));
        }
        let caps = SrqCaps {
            id,
            pd: pd.id,
            max_wr: config.max_wr,
            max_sge,
        };
        Ok(VerbsSrq {
            _pd: pd,
            srq,
            caps,
            recv_wrs: zeroed(config.max_wr as usize),
            destroyed: false,
        })
    }

    pub(super) fn raw(&self) -> *mut ibv_srq {
        self.srq
    }

    /// Whether [`destroy`](SharedReceiveQueue::destroy) succeeded: the
    /// `ibv_srq` is then freed, and nothing may hand it to the library.
    pub(super) fn is_destroyed(&self) -> bool {
        self.destroyed
    }
}

// SAFETY: receives posted with `ibv_post_srq_recv` are consumed at most once
// and reported by the consuming QP's CQ, with its number; after
// `ibv_destroy_srq` succeeds the NIC no longer touches them; a refused post
// reports the prefix `bad_wr` proves (see `accepted`); caps are fixed.
unsafe impl SharedReceiveQueue for VerbsSrq {
    fn caps(&self) -> SrqCaps {
        self.caps
    }

    unsafe fn post_recv(&mut self, wrs: &[RecvWr], sges: &[Sge]) -> Result<(), PostError> {
        if wrs.is_empty() {
            return Ok(());
        }
        if self.destroyed {
            return Err(PostError {
                accepted: 0,
                error: Error::PostRejected("the shared receive queue was destroyed"),
            });
        }
        if wrs.len() > self.recv_wrs.len() {
            return Err(PostError {
                accepted: 0,
                error: Error::PostRejected("more receives than the shared receive queue holds"),
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
            // `Sge` is laid out as `ibv_sge`, and the NIC only reads the list.
            out.sg_list = list.as_ptr().cast::<ibv_sge>().cast_mut();
            out.num_sge = list.len() as i32;
        }
        let mut bad: *mut ibv_recv_wr = std::ptr::null_mut();
        // SAFETY: the list is linked within `recv_wrs`, each element list
        // lies in `sges`, both live across the call; the caller guarantees
        // the memory the elements name (this function's contract).
        let ret = unsafe { rdma_sys::ibv_post_srq_recv(self.srq, base, &mut bad) };
        if ret == 0 {
            return Ok(());
        }
        Err(PostError {
            accepted: accepted(base, bad, wrs.len()),
            error: verbs_error("ibv_post_srq_recv", ret),
        })
    }

    fn arm_limit(&mut self, limit: u32) -> Result<(), Error> {
        let mut attr = ibv_srq_attr {
            max_wr: 0,
            max_sge: 0,
            srq_limit: limit,
        };
        if self.destroyed {
            return Err(Error::Soft("the shared receive queue was destroyed"));
        }
        // The device may have made the queue deeper than asked (mlx5 rounds
        // up) and would take a mark the ring never fills to.
        if limit > self.caps.max_wr {
            return Err(Error::Verbs {
                verb: "ibv_modify_srq(IBV_SRQ_LIMIT)",
                source: std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!(
                        "limit {limit} exceeds the queue's depth {}",
                        self.caps.max_wr
                    ),
                ),
            });
        }
        // SAFETY: the SRQ is live; `attr` is valid for the limit field.
        let ret = unsafe {
            rdma_sys::ibv_modify_srq(
                self.srq,
                &mut attr,
                rdma_sys::ibv_srq_attr_mask::IBV_SRQ_LIMIT.0 as i32,
            )
        };
        if ret != 0 {
            return Err(verbs_error("ibv_modify_srq(IBV_SRQ_LIMIT)", ret));
        }
        Ok(())
    }

    fn destroy(&mut self) -> Result<(), Error> {
        if self.destroyed {
            return Ok(());
        }
        // SAFETY: the SRQ is live and destroyed at most once: on success the
        // flag is set; on failure (QPs still attached) it stays live.
        let ret = unsafe { rdma_sys::ibv_destroy_srq(self.srq) };
        if ret != 0 {
            return Err(verbs_error("ibv_destroy_srq", ret));
        }
        self.destroyed = true;
        Ok(())
    }
}

impl Drop for VerbsSrq {
    fn drop(&mut self) {
        // The ring destroys its queues explicitly and keeps the buffers of
        // one it could not; this covers a queue never given to a ring.
        let _ = self.destroy();
    }
}
