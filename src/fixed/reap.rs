//! The fixed ring's reaping: completions polled from the device matched
//! to what the ring posted and handed out, into a list or to a closure,
//! and what a reap a panicking closure cut short keeps for the next.

use super::completion::{EachCompletion, UnhandedRun};
use super::queue::{parse_wr_id, take_recv, AttachedQp, RecvEntry, SendEntry, NO_SLOT, SRQ_BIT};
use super::ring::POLL_BATCH;
use super::srq::{complete_srq, AttachedSrq, Consumers};
use super::{CompletionSink, FixedBuf, FixedCompletion, FixedQp, FixedRing};
use crate::backend::{CompletionQueue as DeviceCq, QueuePair, RawCompletion, WcStatus};
use crate::deadline::Deadline;
use crate::error::Error;
use crate::op::OpKind;

impl<Q: QueuePair> FixedRing<Q> {
    /// [`reap`](Self::reap), polling the device until a poll comes back
    /// short of a full batch (or the queue's depth is polled): nothing a
    /// completion channel has already signaled is left behind for an
    /// event that will not come. A poll that fails still hands out what
    /// the failure flushed (work never posted).
    pub(crate) fn reap_all(&mut self, out: &mut impl CompletionSink) -> Result<(), Error> {
        if !self.ready.is_empty() {
            out.put_all(self.ready.drain(..));
        }
        // The queue holds `cq_entries` at most: that many polls empty it,
        // whatever arrives meanwhile (which raises an event of its own).
        for _ in 0..=self.cq_entries / POLL_BATCH {
            if self.failed.is_some() {
                break;
            }
            match self.reap_device(out) {
                Ok(n) if n < POLL_BATCH => break,
                Ok(_) => {}
                Err(error) => {
                    out.put_all(self.ready.drain(..));
                    return Err(error);
                }
            }
        }
        self.hand_parked(out);
        Ok(())
    }

    /// Appends the completions that are ready to `out` (without waiting)
    /// and returns how many. Each send-queue completion releases, in
    /// order, the unsignaled sends before it on its queue pair. A
    /// completion naming nothing the ring posted is counted
    /// ([`unknown_completions`](Self::unknown_completions)) and ignored.
    /// On an error of the completion queue, completions appended so far
    /// stay in `out`, and the ring takes no more work: what was pushed and
    /// never posted comes back flushed from the next reap. A reap ends by
    /// topping up the shared receive queues with a refill below their
    /// mark (see [`set_srq_refill`](Self::set_srq_refill)).
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::SoftDevice, QpConfig, QueuePair};
    /// # use rdma_ring::buf::{ExposedBuf, RemoteAccess};
    /// # use rdma_ring::fixed::*;
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// # let (mut qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    /// # let target = ExposedBuf::new(&pd, vec![0u8; 64], RemoteAccess::WRITE).unwrap();
    /// # let cq = qp.take_cq().unwrap();
    /// # let mut ring = FixedRing::new(cq, FixedBufs::new(&pd, 4, 64).unwrap(), FixedRingConfig::default());
    /// # let conn = ring.attach(qp).unwrap();
    /// let mut done = Vec::new();
    /// assert_eq!(ring.reap(&mut done).unwrap(), 0);
    /// let slot = ring.take_buf().unwrap();
    /// ring.push(conn, WriteFixed::new(slot, 8, target.remote()).user_data(3)).unwrap();
    /// ring.submit().unwrap();
    /// while done.is_empty() {
    ///     ring.reap(&mut done).unwrap();
    /// }
    /// assert_eq!(done[0].user_data(), 3);
    /// ```
    #[inline(always)]
    pub fn reap(&mut self, out: &mut Vec<FixedCompletion>) -> Result<usize, Error> {
        let before = out.len();
        self.reap_once(out)?;
        Ok(out.len() - before)
    }

    /// [`reap`](Self::reap), handing each completion to `f` as it is
    /// made instead of appending it to a list: returns how many `f` took.
    /// No list is filled and read back, so this is the cheaper reap when
    /// each completion is dealt with at once (its token put back, a
    /// reply pushed). On an error, the completions `f` took are still
    /// taken.
    ///
    /// If `f` panics, the panic goes on to the caller, and of the
    /// completions only the one `f` was handed goes with it (what `f` did
    /// with it stands; a token dropped in the unwinding takes its slot out
    /// of use for good): the ring has done its bookkeeping for everything
    /// the poll took from the device, and the completions `f` was not
    /// handed yet wait in the ring, in order, for the next reap. None is
    /// ever handed out twice. A reap a panic cut short does not top up the
    /// shared receive queues: the next reap does.
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::SoftDevice, QpConfig, QueuePair};
    /// # use rdma_ring::buf::{ExposedBuf, RemoteAccess};
    /// # use rdma_ring::fixed::*;
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// # let (mut qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    /// # let target = ExposedBuf::new(&pd, vec![0u8; 64], RemoteAccess::WRITE).unwrap();
    /// # let cq = qp.take_cq().unwrap();
    /// let mut ring = FixedRing::new(cq, FixedBufs::new(&pd, 4, 64).unwrap(), FixedRingConfig::default());
    /// let conn = ring.attach(qp).unwrap();
    /// let mut free: Vec<FixedBuf> = std::iter::from_fn(|| ring.take_buf()).collect();
    /// while let Some(slot) = free.pop() {
    ///     ring.push(conn, WriteFixed::new(slot, 64, target.remote())).unwrap();
    /// }
    /// ring.submit().unwrap();
    /// while free.len() < 4 {
    ///     ring.reap_each(|done| {
    ///         assert!(done.status().is_success());
    ///         free.push(done.into_buf());
    ///     })
    ///     .unwrap();
    /// }
    /// ```
    #[inline(always)]
    pub fn reap_each<F: FnMut(FixedCompletion)>(&mut self, f: F) -> Result<usize, Error> {
        let mut each = EachCompletion { f, taken: 0 };
        self.reap_once(&mut each)?;
        Ok(each.taken)
    }

    /// One reap into `out`: what is ready, then one poll of the device,
    /// then the shared receive queues' top-up.
    #[inline(always)]
    fn reap_once(&mut self, out: &mut impl CompletionSink) -> Result<(), Error> {
        if !self.ready.is_empty() {
            out.put_ready(&mut self.ready);
        }
        if self.failed.is_some() {
            return Ok(());
        }
        self.reap_device(out)?;
        self.hand_parked(out);
        if self.refilling {
            self.refill_srqs();
            // A refill stopped by a refused post: its receives, flushed,
            // go out with this reap (no completion may come to prompt
            // another).
            if self.take_refill_stopped() {
                out.put_ready(&mut self.ready);
            }
        }
        Ok(())
    }

    /// Polls until at least `min` completions are ready, up to the
    /// configured `wait_timeout`, and returns them (all that are ready).
    /// Fails at once if fewer than `min` can still come (posted work, and
    /// flushed work held back behind it, are all that can); on an error,
    /// what was reaped stays for the next call.
    ///
    /// ```
    /// # use rdma_ring::backend::{soft::SoftDevice, QpConfig, QueuePair};
    /// # use rdma_ring::buf::{ExposedBuf, RemoteAccess};
    /// # use rdma_ring::fixed::*;
    /// # let dev = SoftDevice::new();
    /// # let pd = dev.alloc_pd();
    /// # let (mut qp, _peer) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    /// # let target = ExposedBuf::new(&pd, vec![0u8; 64], RemoteAccess::WRITE).unwrap();
    /// # let cq = qp.take_cq().unwrap();
    /// # let mut ring = FixedRing::new(cq, FixedBufs::new(&pd, 4, 64).unwrap(), FixedRingConfig::default());
    /// # let conn = ring.attach(qp).unwrap();
    /// assert!(ring.wait(1).is_err()); // nothing posted, nothing can come
    /// let slot = ring.take_buf().unwrap();
    /// ring.push(conn, WriteFixed::new(slot, 8, target.remote())).unwrap();
    /// ring.submit().unwrap();
    /// assert!(ring.wait(1).unwrap()[0].status().is_success());
    /// ```
    pub fn wait(&mut self, min: usize) -> Result<Vec<FixedCompletion>, Error> {
        // No more than can come: a `min` beyond that fails below, and must
        // not first ask the allocator for room it cannot give.
        let can_come = self.ready.len() + self.posted_outstanding() + self.parked_len();
        let mut out = Vec::with_capacity(min.min(can_come));
        let deadline = Deadline::after(self.config.wait_timeout);
        loop {
            if let Err(error) = self.reap(&mut out) {
                self.keep_for_next_reap(out);
                return Err(error);
            }
            if out.len() >= min {
                return Ok(out);
            }
            if let Some(why) = self.failed {
                self.keep_for_next_reap(out);
                return Err(Error::RingFailed(why));
            }
            let possible = out.len() + self.posted_outstanding() + self.parked_len();
            let timed_out = deadline.expired();
            if possible < min || timed_out {
                self.keep_for_next_reap(out);
                return Err(if timed_out {
                    Error::Timeout(self.config.wait_timeout)
                } else {
                    Error::WaitUnsatisfiable {
                        wanted: min,
                        possible,
                    }
                });
            }
            std::thread::yield_now();
        }
    }

    /// Puts completions reaped and not handed out back in front of the
    /// ready list: they are older than anything a failure flushed into it
    /// meanwhile, and a queue pair's come out in order.
    fn keep_for_next_reap(&mut self, mut out: Vec<FixedCompletion>) {
        out.append(&mut self.ready);
        self.ready = out;
    }

    /// Polls into the ring's list of ready completions until the
    /// completion queue has nothing more to give now.
    pub(super) fn reap_queued_into_ready(&mut self) -> Result<(), Error> {
        self.poll_into_ready(self.cq_entries / POLL_BATCH + 1)
    }

    /// Polls the device into the ring's list of ready completions, up to
    /// `polls` times (less if a poll comes back short of a full batch).
    pub(super) fn poll_into_ready(&mut self, polls: usize) -> Result<(), Error> {
        let mut ready = std::mem::take(&mut self.ready);
        let mut polled = Ok(());
        for _ in 0..polls {
            match self.reap_device(&mut ready) {
                Ok(n) if n < POLL_BATCH => break,
                Ok(_) => {}
                Err(error) => {
                    polled = Err(error);
                    break;
                }
            }
        }
        if self.parked_any {
            self.release_parked();
        }
        // A failure the poll met flushed unposted work into the ring's
        // list meanwhile, and parked work may have been released: keep
        // both, after what was polled.
        ready.append(&mut self.ready);
        self.ready = ready;
        polled
    }

    /// Polls the device once into `out`; returns how many entries the
    /// poll took.
    #[inline(always)]
    pub(super) fn reap_device(&mut self, out: &mut impl CompletionSink) -> Result<usize, Error> {
        let n = match self.cq.poll(&mut self.cqes[..]) {
            Ok(n) => n,
            Err(error) => {
                self.fail("its completion queue failed");
                return Err(error);
            }
        };
        let table = self.bufs.table();
        let mut polled = PolledEntries {
            ring: self,
            next: 0,
            n,
        };
        while polled.next < polled.n {
            let ring = &mut *polled.ring;
            let cqe = &ring.cqes[polled.next];
            polled.next += 1;
            complete(
                &mut ring.qps,
                &mut ring.srqs,
                &ring.consumers,
                cqe,
                table,
                &mut ring.cq_free,
                &mut ring.unknown,
                out,
                &mut ring.ready,
            );
        }
        Ok(n)
    }

    /// Hands out the parked completions of the queue pairs whose posted
    /// work is all back, after a poll. Through the ready list, which a
    /// sink that panics leaves holding what it was not handed; and after
    /// the poll's loop, not in it, so the loop keeps the sink in registers.
    #[inline(always)]
    pub(super) fn hand_parked(&mut self, out: &mut impl CompletionSink) {
        if self.parked_any && self.release_parked() {
            out.put_ready(&mut self.ready);
        }
    }

    /// Moves the parked completions of the queue pairs whose posted work
    /// is all back to the ready list (after that work, as their work was
    /// pushed); returns whether it moved any.
    #[cold]
    #[inline(never)]
    pub(super) fn release_parked(&mut self) -> bool {
        let mut still = false;
        let mut moved = false;
        for slot in self.qps.iter_mut().flatten() {
            if slot.parked.is_empty() {
                continue;
            }
            if slot.busy() {
                still = true;
            } else {
                self.ready.append(&mut slot.parked);
                moved = true;
            }
        }
        self.parked_any = still;
        moved
    }

    /// How many parked completions wait for posted work to come back.
    pub(super) fn parked_len(&self) -> usize {
        if !self.parked_any {
            return 0;
        }
        self.qps
            .iter()
            .flatten()
            .map(|slot| slot.parked.len())
            .sum()
    }
}

/// The entries of one poll not yet completed. Should a sink panic partway
/// (a caller's closure, in [`FixedRing::reap_each`]), the rest are
/// completed into the ring's ready list as the stack unwinds: an entry
/// the device gave up is never left undone (a receive never marked
/// taken would hold its place, and a drain would wait for it, forever).
struct PolledEntries<'a, Q: QueuePair> {
    ring: &'a mut FixedRing<Q>,
    next: usize,
    n: usize,
}

impl<Q: QueuePair> Drop for PolledEntries<'_, Q> {
    #[inline]
    fn drop(&mut self) {
        if self.next < self.n {
            self.complete_rest();
        }
    }
}

impl<Q: QueuePair> PolledEntries<'_, Q> {
    #[cold]
    #[inline(never)]
    fn complete_rest(&mut self) {
        let ring = &mut *self.ring;
        let table = ring.bufs.table();
        for cqe in &ring.cqes[self.next..self.n] {
            complete(
                &mut ring.qps,
                &mut ring.srqs,
                &ring.consumers,
                cqe,
                table,
                &mut ring.cq_free,
                &mut ring.unknown,
                &mut ring.ready,
                // A list takes every completion: nothing to spill.
                &mut Vec::new(),
            );
        }
        self.next = self.n;
    }
}

/// Hands out what one completion queue entry completes.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn complete<Q, S, K: CompletionSink>(
    qps: &mut [Option<AttachedQp<Q>>],
    srqs: &mut [Option<AttachedSrq<S>>],
    consumers: &Consumers,
    cqe: &RawCompletion,
    table: u64,
    cq_free: &mut usize,
    unknown: &mut u64,
    out: &mut K,
    spill: &mut Vec<FixedCompletion>,
) {
    let (index, recv, bits) = parse_wr_id(cqe.wr_id);
    // One bit here; `complete_srq`, out of line, checks the receive bit
    // too (no `wr_id` the ring posts has one without the other).
    if cqe.wr_id & SRQ_BIT != 0 {
        match complete_srq(qps, srqs, consumers, index, recv, bits, table, cqe) {
            Some(completion) => {
                *cq_free += 1;
                out.put(completion);
            }
            None => *unknown += 1,
        }
        return;
    }
    let Some(Some(slot)) = qps.get_mut(index) else {
        *unknown += 1;
        return;
    };
    if slot.qpn != cqe.qp_num {
        *unknown += 1;
        return;
    }
    let qp = slot.handle;
    if recv {
        let Some(entry) = take_recv(&mut slot.recvs, &mut slot.recvs_taken_ahead, bits) else {
            *unknown += 1;
            return;
        };
        if !cqe.status.is_success() {
            slot.error.get_or_insert(cqe.status);
        }
        *cq_free += 1;
        out.put(recv_completion(entry, qp, table, cqe));
        return;
    }
    let Some(seq) = slot.sends.posted_seq(bits) else {
        *unknown += 1;
        return;
    };
    if !cqe.status.is_success() {
        slot.error.get_or_insert(cqe.status);
    }
    // RC completes a send queue in order: this entry completes every
    // unsignaled send before it, successfully, whatever its own status:
    // an unsignaled send that succeeds makes no CQE, and one flushed or
    // failed makes its own, so none of those is in the run. (The drain
    // marker is always the last send posted, so it can only be this
    // entry.) The queue moves on before anything is handed out, so a sink
    // that panics (a caller's closure) can never be handed the run twice;
    // what it was not handed is spilled into `spill` as the stack unwinds.
    let head = slot.sends.head;
    let entry = slot.sends.get(seq);
    slot.sends.head = seq + 1;
    *cq_free += (seq - head) as usize;
    let marker = entry.index == NO_SLOT;
    if marker {
        slot.marker_posted = false;
    } else {
        *cq_free += 1;
    }
    let sends = &slot.sends;
    let release = move |at| send_completion(sends.get(at), qp, table, WcStatus::Success);
    // Guarded only where a panic could leave something unhanded: a
    // completion alone is the one the sink was handed.
    if K::MAY_UNWIND && head < seq {
        // The signaled one too, at `seq`, unless it is the marker.
        let mut run = UnhandedRun {
            seqs: head..seq,
            signaled: !marker,
            release,
            release_signaled: move || send_completion(entry, qp, table, cqe.status),
            spill,
        };
        out.put_all(run.seqs.by_ref().map(&run.release));
        if run.signaled {
            run.signaled = false;
            out.put((run.release_signaled)());
        }
    } else {
        if head < seq {
            out.put_all((head..seq).map(release));
        }
        if !marker {
            out.put(send_completion(entry, qp, table, cqe.status));
        }
    }
}

/// What a receive's completion queue entry hands out.
#[inline(always)]
pub(super) fn recv_completion(
    entry: RecvEntry,
    qp: FixedQp,
    table: u64,
    cqe: &RawCompletion,
) -> FixedCompletion {
    let ok = cqe.status.is_success();
    FixedCompletion {
        user_data: entry.user_data,
        buf: FixedBuf::from_raw(table, entry.index),
        qp,
        // Undefined on a failure (verbs leaves it so).
        byte_len: if ok { cqe.byte_len } else { 0 },
        imm: cqe.imm.filter(|_| ok),
        kind: OpKind::Recv,
        status: cqe.status,
        by_write_imm: cqe.by_write_imm && ok,
    }
}

#[inline(always)]
fn send_completion(entry: SendEntry, qp: FixedQp, table: u64, status: WcStatus) -> FixedCompletion {
    FixedCompletion {
        user_data: entry.user_data,
        buf: FixedBuf::from_raw(table, entry.index),
        qp,
        byte_len: if status.is_success() { entry.len } else { 0 },
        imm: None,
        kind: entry.kind,
        status,
        by_write_imm: false,
    }
}
