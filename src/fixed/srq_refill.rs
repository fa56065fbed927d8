//! Keeping a fixed ring's shared receive queues topped up from the ring's
//! own free slots, so a server of many peers never runs its receives dry
//! between two of its own pushes.

use super::srq::FixedSrq;
use super::{FixedRing, RecvFixed};
use crate::backend::QueuePair;
use crate::error::Error;

/// Keeps a [`FixedRing`]'s shared receive queue topped up from the ring's
/// free slots (see [`FixedRing::set_srq_refill`]): after a reap, whenever
/// fewer than `low` of its receives are pushed or posted, the ring takes
/// free slots and pushes a receive into each (the whole slot) until
/// `target` are, or the free slots run out, and posts them at once with
/// one doorbell. Their completions come from the reaps like any other
/// receive, tagged `user_data` and naming the queue pair the message came
/// on; give each slot back ([`FixedRing::put_buf`]) for later refills.
///
/// Slots the caller holds are never taken: a refill only takes free ones,
/// so a caller that keeps slots out for a while gets fewer receives posted
/// meanwhile (the next reap after the slots come back tops up again; the
/// awaited ring also tops up when a slot is put back).
///
/// Each refill receive holds a completion queue entry, as any pushed work
/// does: size the completion queue for `target` beside the rest, or a
/// refill leaves pushes refused with
/// [`Error::CompletionQueueFull`](crate::Error::CompletionQueueFull) until
/// messages arrive (and a refill short of entries stops short, to go on
/// at the next reap). A refill posts its queue's receives pushed and not
/// yet submitted with its own, in one doorbell.
///
/// ```
/// use rdma_ring::fixed::FixedSrqRefill;
/// let refill = FixedSrqRefill { low: 16, target: 48, user_data: 0xfeed };
/// assert!(refill.low <= refill.target);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FixedSrqRefill {
    /// Refill when fewer than this many receives are pushed or posted (at
    /// least 1).
    pub low: u32,
    /// Refill up to this many (at least `low`, at most the queue's depth).
    pub target: u32,
    /// The tag of the refill receives' completions.
    pub user_data: u64,
}

/// A queue's refill as the ring runs it.
#[derive(Clone, Copy, Debug)]
pub(super) struct ActiveRefill {
    pub(super) config: FixedSrqRefill,
    /// The `user_data` its receives' work requests carry in place of the
    /// configured one, for an owner that routes completions by tag.
    pub(super) tag: Option<u64>,
}

impl<Q: QueuePair> FixedRing<Q> {
    /// Keeps shared receive queue `srq` topped up from the ring's free
    /// slots (see [`FixedSrqRefill`]); `None` stops (receives already
    /// posted stay posted). The first top-up runs at once.
    ///
    /// Refused: a handle naming nothing ([`Error::NotAttached`]), a
    /// `low` of 0, above `target`, or a `target` deeper than the queue
    /// ([`Error::Incompatible`]), a failed ring, or a first top-up whose
    /// post the device refuses (the refill is then off, and the refused
    /// receives come back flushed from the next reap). Should the device
    /// refuse a later refill's post, the refill stops the same way
    /// ([`srq_refill`](Self::srq_refill) says `None` again), and the
    /// refused receives come back flushed from the reap that ran the
    /// top-up (or, for a top-up an applied event ran, the next reap).
    ///
    /// ```
    /// use rdma_ring::backend::{soft::SoftDevice, QpConfig, SrqConfig};
    /// use rdma_ring::fixed::{FixedBufs, FixedRing, FixedRingConfig, FixedSrqRefill};
    ///
    /// let dev = SoftDevice::new();
    /// let pd = dev.alloc_pd();
    /// let mut server = FixedRing::new(dev.create_cq(256).unwrap(), FixedBufs::new(&pd, 64, 256).unwrap(), FixedRingConfig::default());
    /// let srq = server.add_srq(dev.create_srq(&pd, SrqConfig::default()).unwrap()).unwrap();
    /// let conn = server.attach(dev.create_qp_on(&pd, server.cq(), server.srq(srq), QpConfig::default()).unwrap()).unwrap();
    /// let refill = FixedSrqRefill { low: 8, target: 32, user_data: 7 };
    /// server.set_srq_refill(srq, Some(refill)).unwrap();
    /// assert_eq!(server.srq_posted(srq).unwrap(), 32); // posted already
    /// assert_eq!(server.bufs().free(), 32);
    /// assert_eq!(server.srq_refill(srq).unwrap(), Some(refill));
    /// # let _ = conn;
    /// ```
    pub fn set_srq_refill(
        &mut self,
        srq: FixedSrq,
        refill: Option<FixedSrqRefill>,
    ) -> Result<(), Error> {
        self.set_srq_refill_tagged(srq, refill, None)
    }

    /// Why `refill` cannot be set on `srq`, if it cannot; else the queue's
    /// slot.
    pub(crate) fn check_srq_refill(
        &self,
        srq: FixedSrq,
        refill: Option<&FixedSrqRefill>,
    ) -> Result<usize, Error> {
        if let Some(why) = self.failed {
            return Err(Error::RingFailed(why));
        }
        let index = self
            .srq_slot_of(srq)
            .ok_or(Error::NotAttached("shared receive queue"))?;
        let slot = self.srqs[index].as_ref().expect("found above");
        if let Some(config) = refill {
            if config.low == 0 || config.low > config.target {
                return Err(Error::Incompatible(
                    "a refill's low-water mark must be at least 1 and at most its target",
                ));
            }
            if config.target as usize > slot.depth() {
                return Err(Error::Incompatible(
                    "a refill's target is deeper than the shared receive queue",
                ));
            }
        }
        Ok(index)
    }

    /// [`set_srq_refill`](Self::set_srq_refill), with the refill's work
    /// requests carrying `tag` as their `user_data` (their completions
    /// carry it too, for the owner to put the configured one back).
    pub(crate) fn set_srq_refill_tagged(
        &mut self,
        srq: FixedSrq,
        refill: Option<FixedSrqRefill>,
        tag: Option<u64>,
    ) -> Result<(), Error> {
        let index = self.check_srq_refill(srq, refill.as_ref())?;
        let slot = self.srqs[index].as_mut().expect("checked");
        slot.refill = refill.map(|config| ActiveRefill { config, tag });
        self.refilling = self.srqs.iter().flatten().any(|s| s.refill.is_some());
        self.refill_srq(index)
    }

    /// The refill's receives of `srq` pushed or posted and not yet handed
    /// back: those still to complete, whether or not it still refills.
    pub(crate) fn srq_refills(&self, srq: FixedSrq) -> Result<usize, Error> {
        let index = self
            .srq_slot_of(srq)
            .ok_or(Error::NotAttached("shared receive queue"))?;
        Ok(self.srqs[index].as_ref().expect("found above").refills())
    }

    /// How `srq` is kept topped up, if it is: `None` if no refill was set,
    /// it was stopped, or the device refused one's post.
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::{SoftDevice, SoftQp}, SrqConfig};
    /// # use rdma_ring::fixed::*;
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// # let mut ring: FixedRing<SoftQp> = FixedRing::new(dev.create_cq(256).unwrap(), FixedBufs::new(&pd, 4, 64).unwrap(), FixedRingConfig::default());
    /// let srq = ring.add_srq(dev.create_srq(&pd, SrqConfig::default()).unwrap()).unwrap();
    /// assert_eq!(ring.srq_refill(srq).unwrap(), None);
    /// ```
    pub fn srq_refill(&self, srq: FixedSrq) -> Result<Option<FixedSrqRefill>, Error> {
        let index = self
            .srq_slot_of(srq)
            .ok_or(Error::NotAttached("shared receive queue"))?;
        let slot = self.srqs[index].as_ref().expect("found above");
        Ok(slot.refill.map(|refill| refill.config))
    }

    /// Tops up every shared receive queue whose refill fell below its
    /// low-water mark. A refused post stops that queue's refill (noted in
    /// `refill_stopped`), and its refused receives wait flushed in the
    /// ring's ready list.
    // Out of line and cold: reaps test one flag before calling it.
    #[cold]
    #[inline(never)]
    pub(super) fn refill_srqs(&mut self) {
        for index in 0..self.srqs.len() {
            let _ = self.refill_srq(index);
        }
    }

    /// Tops up the shared receive queue in slot `index` if its refill fell
    /// below its low-water mark, and posts what it pushed.
    fn refill_srq(&mut self, index: usize) -> Result<(), Error> {
        if self.failed.is_some() {
            return Ok(());
        }
        let Some(slot) = self.srqs.get(index).and_then(Option::as_ref) else {
            return Ok(());
        };
        let Some(refill) = slot.refill else {
            return Ok(());
        };
        if slot.held() >= refill.config.low as usize {
            return Ok(());
        }
        let handle = slot.handle();
        let target = refill.config.target as usize;
        while self.srqs[index].as_ref().expect("held").held() < target {
            let Some(buf) = self.bufs.take() else { break };
            let op = RecvFixed::new(buf).user_data(refill.config.user_data);
            // Refused when the completion queue has no entry to spare:
            // the next reap frees some and tries again.
            if self.try_push_srq(handle, &op, refill.tag, true).is_err() {
                let _ = self.bufs.put(op.into_buf());
                break;
            }
        }
        let table = self.bufs.table();
        let slot = self.srqs[index].as_mut().expect("held");
        match slot.post(table, &mut self.ready, &mut self.cq_free) {
            Ok(_) => Ok(()),
            Err((_, error)) => {
                slot.refill = None;
                self.refill_stopped = true;
                self.refilling = self.srqs.iter().flatten().any(|s| s.refill.is_some());
                Err(error)
            }
        }
    }
}
