//! The software path in instructions per operation, for callgrind:
//! `scripts/instructions` runs this binary under `valgrind --tool=callgrind`
//! twice per configuration, with two round counts, and divides the
//! difference by the extra operations — setup and teardown cancel out, and
//! instruction counts (unlike times) do not depend on the machine's load.
//!
//! ```text
//! instructions --mode sync|awaited|coalesced|fixed|fixed-batch|fixed-awaited|fixed-awaited-all|raw|model --batch B --rounds R
//! ```
//!
//! Each round builds and pushes B WRITEs, submits once, and reaps them
//! (sync: the ring; awaited: B futures of an `AsyncRing` in busy-poll
//! mode, awaited in order, a doorbell each; coalesced: the same with
//! `coalesce_doorbells`, one doorbell per round), on the soft device in
//! no-op mode (the device completes every work request at once and moves
//! no data).
//!
//! `fixed` is the same through the fixed-buffer ring
//! ([`FixedRing`](rdma_ring::fixed::FixedRing)): slots of one registration
//! named by tokens, 56-byte completions; `fixed-batch` pushes each
//! round through one [`PushBatch`](rdma_ring::fixed::PushBatch) and
//! reaps with [`reap_each`](rdma_ring::fixed::FixedRing::reap_each);
//! `fixed-awaited` awaits its
//! operations through an
//! [`AsyncFixedRing`](rdma_ring::future::AsyncFixedRing) in busy-poll
//! mode, pushed before they are awaited (one doorbell per round);
//! `fixed-awaited-all` pushes each round's with one `push_all`.
//!
//! `raw` is the floor under all of them: no ring, no buffer ownership,
//! what a C verbs program does — B work requests built by hand into one
//! list over one registered buffer, the last one signaled, posted straight
//! to the backend's queue pair, and its one CQE polled. What any ring on
//! this device costs beyond that is its own.
//!
//! `model` is a yardstick between the two: a minimal ring of another shape
//! ([`lean_model`]), with buffers named by index, sends in a ring indexed
//! by sequence number and small completions, and fewer checks than the
//! crate's ring makes. It measures what that shape would cost on this
//! device, not the crate.
//!
//! It prints the heap allocations it made (`allocations: N`), which
//! `scripts/instructions` turns into allocations per operation the same
//! way. The awaited rounds reuse one vector of futures and await them in
//! order, so the harness itself allocates nothing per round.

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};

/// The system allocator, counting allocations.
struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: every call is forwarded to the system allocator unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract is `GlobalAlloc::alloc`'s.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System` with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as for `dealloc`; `new_size` is the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

use rdma_ring::backend::soft::{Progress, SoftDevice, SoftPd, SoftQp};
use rdma_ring::backend::{
    CompletionQueue, QpConfig, QueuePair, RawCompletion, SendFlags, SendOpcode, SendWr, Sge,
    SgeSpan,
};
use rdma_ring::buf::{BufferPool, ExposedBuf, PoolChunk, RegisteredBuf, RemoteAccess, RemoteSlice};
use rdma_ring::fixed::{
    FixedBuf, FixedBufs, FixedCompletion, FixedRing, FixedRingConfig, WriteFixed,
};
use rdma_ring::future::{AsyncFixedRing, AsyncRing, Wakeup};
use rdma_ring::op::Write;
use rdma_ring::ring::{Completion, Ring, RingConfig};

fn main() {
    let mut mode = "sync".to_string();
    let (mut batch, mut rounds) = (16usize, 1000usize);
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().expect("a value after each flag");
        match arg.as_str() {
            "--mode" => mode = value(),
            "--batch" => batch = value().parse().expect("--batch N"),
            "--rounds" => rounds = value().parse().expect("--rounds N"),
            // What `cargo bench` passes to every bench binary.
            "--bench" => {}
            other => panic!("unknown argument {other:?}"),
        }
    }
    let dev = SoftDevice::with_progress(Progress::NoOp);
    let pd = dev.alloc_pd();
    let config = QpConfig {
        max_send_wr: 256,
        max_recv_wr: 1,
        ..QpConfig::default()
    };
    let (qp, peer) = dev.connected_pair(&pd, &pd, config).unwrap();
    let exposed = ExposedBuf::new(&pd, vec![0u8; 64 * batch], RemoteAccess::WRITE).unwrap();
    let remote = exposed.remote();
    let pool = BufferPool::new(&pd, 64, batch).unwrap();
    let mut bufs: Vec<PoolChunk> = (0..batch).map(|_| pool.take().unwrap()).collect();
    let targets: Vec<_> = (0..batch as u64)
        .map(|i| remote.slice(i * 64..(i + 1) * 64).unwrap())
        .collect();
    match mode.as_str() {
        "sync" => {
            let mut ring = Ring::new(qp, RingConfig::default());
            let mut done: Vec<Completion> = Vec::with_capacity(batch);
            // The harness moves buffers with `pop`/`push`, which cost a few
            // instructions each, so that its own vector juggling (a `drain`
            // costs some 40 per round) does not pass for the ring's.
            for _ in 0..rounds {
                let mut sq = ring.submission();
                let mut i = 0;
                while let Some(buf) = bufs.pop() {
                    sq.push(Write::new(buf, targets[i]).user_data(i as u64))
                        .unwrap();
                    i += 1;
                }
                sq.submit().unwrap();
                let mut cq = ring.completion();
                while done.len() < batch {
                    cq.reap(&mut done).unwrap();
                }
                while let Some(c) = done.pop() {
                    bufs.push(c.into_buf().downcast::<PoolChunk>().unwrap());
                }
            }
        }
        "awaited" | "coalesced" => {
            let ring = AsyncRing::new(Ring::new(qp, RingConfig::default()), Wakeup::Busy).unwrap();
            ring.coalesce_doorbells(mode == "coalesced");
            let mut ops = Vec::with_capacity(batch);
            futures::executor::block_on(async {
                for _ in 0..rounds {
                    ops.extend(
                        bufs.drain(..)
                            .enumerate()
                            .map(|(i, buf)| ring.write(buf, targets[i])),
                    );
                    for op in ops.drain(..) {
                        let (result, buf) = op.await;
                        result.unwrap();
                        bufs.push(buf);
                    }
                }
            });
        }
        "raw" => {
            let mut qp = qp;
            let mut cq = qp.take_cq().expect("a queue pair made with its own CQ");
            let local = RegisteredBuf::new(&pd, vec![0u8; 64 * batch]).unwrap();
            let (addr, lkey) = (local.as_ptr() as u64, local.lkey());
            let mut wrs = Vec::with_capacity(batch);
            let mut sges = Vec::with_capacity(batch);
            let mut cqes = [RawCompletion::default(); 32];
            for _ in 0..rounds {
                wrs.clear();
                sges.clear();
                for (i, target) in targets.iter().enumerate() {
                    sges.push(Sge {
                        addr: addr + 64 * i as u64,
                        len: 64,
                        lkey,
                    });
                    let span = SgeSpan {
                        start: i as u32,
                        len: 1,
                    };
                    let mut wr = SendWr::new(i as u64, SendOpcode::Write, span);
                    wr.remote_addr = target.addr();
                    wr.rkey = target.rkey();
                    if i + 1 == batch {
                        wr.flags = SendFlags::SIGNALED;
                    }
                    wrs.push(wr);
                }
                // SAFETY: every element names bytes of `local`, which stays
                // registered and unmoved until after the last round. Each
                // round waits for the CQE of its last work request, which is
                // signaled, and an RC send queue completes in order, so every
                // work request of the round has completed before the next
                // round reuses the lists or `local` is dropped. The targets
                // are remote slices of `exposed`, which outlives the arm.
                unsafe { qp.post_send(&wrs, &sges) }.unwrap();
                let mut got = 0;
                while got == 0 {
                    got = cq.poll(&mut cqes).unwrap();
                }
                assert!(cqes[..got].iter().all(|c| c.status.is_success()));
            }
            black_box(&local);
        }
        "fixed" => {
            let mut qp = qp;
            let cq = qp.take_cq().expect("a queue pair made with its own CQ");
            let slots = FixedBufs::new(&pd, batch as u32, 64).unwrap();
            let mut ring = FixedRing::new(cq, slots, FixedRingConfig::default());
            let handle = ring.attach(qp).unwrap();
            let mut free: Vec<FixedBuf> = (0..batch).map(|_| ring.take_buf().unwrap()).collect();
            let mut done: Vec<FixedCompletion> = Vec::with_capacity(batch);
            for _ in 0..rounds {
                let mut i = 0;
                while let Some(buf) = free.pop() {
                    ring.push(
                        handle,
                        WriteFixed::new(buf, 64, targets[i]).user_data(i as u64),
                    )
                    .unwrap();
                    i += 1;
                }
                ring.submit().unwrap();
                while done.len() < batch {
                    ring.reap(&mut done).unwrap();
                }
                while let Some(c) = done.pop() {
                    assert!(c.status().is_success());
                    free.push(c.into_buf());
                }
            }
            black_box(&free);
        }
        "fixed-batch" => fixed_batch(qp, &pd, &targets, rounds),
        "fixed-awaited" => {
            let mut qp = qp;
            let cq = qp.take_cq().expect("a queue pair made with its own CQ");
            let slots = FixedBufs::new(&pd, batch as u32, 64).unwrap();
            let ring = FixedRing::new(cq, slots, FixedRingConfig::default());
            let ring = AsyncFixedRing::new(ring, Wakeup::Busy).unwrap();
            let handle = ring.attach(qp).unwrap();
            let mut free: Vec<FixedBuf> = (0..batch).map(|_| ring.take_buf().unwrap()).collect();
            let mut ops = Vec::with_capacity(batch);
            futures::executor::block_on(async {
                for _ in 0..rounds {
                    let mut i = 0;
                    while let Some(buf) = free.pop() {
                        let write = WriteFixed::new(buf, 64, targets[i]).user_data(i as u64);
                        ops.push(ring.push(handle, write).unwrap());
                        i += 1;
                    }
                    // The first await posts the round's writes: one doorbell.
                    for op in ops.drain(..) {
                        let c = op.await.unwrap();
                        assert!(c.status().is_success());
                        free.push(c.into_buf());
                    }
                }
            });
            black_box(&free);
        }
        "fixed-awaited-all" => fixed_awaited_all(qp, &pd, &targets, rounds),
        "model" => {
            let local = RegisteredBuf::new(&pd, vec![0u8; 64 * batch]).unwrap();
            lean_model::run(qp, &local, &targets, rounds);
        }
        other => panic!(
            "unknown mode {other:?} (sync, awaited, coalesced, fixed, fixed-batch, fixed-awaited, fixed-awaited-all, raw or model)"
        ),
    }
    black_box(&bufs);
    drop(peer);
    println!("allocations: {}", ALLOCATIONS.load(Ordering::Relaxed));
}

/// `fixed-batch`: as `fixed`, each round's pushes through one
/// [`PushBatch`](rdma_ring::fixed::PushBatch), which checks the ring and
/// the queue pair once, posted with
/// [`submit_qp`](FixedRing::submit_qp) (that queue pair's doorbell, with
/// no walk over the ring's list of queue pairs with pushed work), and its
/// completions handed to a closure as they are made
/// ([`reap_each`](FixedRing::reap_each)), with no list to fill and read
/// back. Out of line, as `fixed_awaited_all`.
#[inline(never)]
fn fixed_batch(qp: SoftQp, pd: &SoftPd, targets: &[RemoteSlice], rounds: usize) {
    let batch = targets.len();
    let mut qp = qp;
    let cq = qp.take_cq().expect("a queue pair made with its own CQ");
    let slots = FixedBufs::new(pd, batch as u32, 64).unwrap();
    let mut ring = FixedRing::new(cq, slots, FixedRingConfig::default());
    let handle = ring.attach(qp).unwrap();
    let mut free: Vec<FixedBuf> = (0..batch).map(|_| ring.take_buf().unwrap()).collect();
    for _ in 0..rounds {
        let mut pushes = ring.batch(handle).unwrap();
        let mut i = 0;
        while let Some(buf) = free.pop() {
            pushes
                .push(WriteFixed::new(buf, 64, targets[i]).user_data(i as u64))
                .unwrap();
            i += 1;
        }
        ring.submit_qp(handle).unwrap();
        while free.len() < batch {
            ring.reap_each(|c| {
                assert!(c.status().is_success());
                free.push(c.into_buf());
            })
            .unwrap();
        }
    }
    black_box(&free);
}

/// `fixed-awaited-all`: as `fixed-awaited`, each round's pushes under one
/// lock (`push_all`). Out of line, so the other modes' code in `main` is
/// compiled as it was without it.
#[inline(never)]
fn fixed_awaited_all(qp: SoftQp, pd: &SoftPd, targets: &[RemoteSlice], rounds: usize) {
    let batch = targets.len();

    let mut qp = qp;
    let cq = qp.take_cq().expect("a queue pair made with its own CQ");
    let slots = FixedBufs::new(pd, batch as u32, 64).unwrap();
    let ring = FixedRing::new(cq, slots, FixedRingConfig::default());
    let ring = AsyncFixedRing::new(ring, Wakeup::Busy).unwrap();
    let handle = ring.attach(qp).unwrap();
    let mut free: Vec<FixedBuf> = (0..batch).map(|_| ring.take_buf().unwrap()).collect();
    let mut writes = Vec::with_capacity(batch);
    let mut ops = Vec::with_capacity(batch);
    futures::executor::block_on(async {
        for _ in 0..rounds {
            let mut i = 0;
            while let Some(buf) = free.pop() {
                writes.push(WriteFixed::new(buf, 64, targets[i]).user_data(i as u64));
                i += 1;
            }
            // The round's pushes under one lock.
            ring.push_all(handle, &mut writes, &mut ops).unwrap();
            for op in ops.drain(..) {
                let c = op.await.unwrap();
                assert!(c.status().is_success());
                free.push(c.into_buf());
            }
        }
    });
    black_box(&free);
}

/// A minimal ring of another shape than the crate's, as a yardstick: how
/// few instructions an io_uring-style ring with fixed buffers could spend
/// on this device. Buffers are chunks of one registration named by index
/// (io_uring's fixed buffers), a queue pair's sends sit in a ring indexed
/// by their sequence number (the `wr_id`), and a completion is 24 bytes.
/// It checks a buffer's index, whether it is in flight, and the lengths,
/// but not protection domains, queue pair or ring errors, or completion
/// queue credits, and it hands no buffer ownership back.
mod lean_model {
    use std::hint::black_box;

    use rdma_ring::backend::{
        CompletionQueue, QueuePair, RawCompletion, SendFlags, SendOpcode, SendWr, Sge, SgeSpan,
        WcStatus,
    };
    use rdma_ring::buf::{RegisteredBuf, RemoteSlice};

    const CHUNK: u32 = 64;
    const DEPTH: usize = 256;

    #[derive(Clone, Copy, Default)]
    struct Slot {
        user_data: u64,
        buf: u32,
        len: u32,
    }

    struct Done {
        user_data: u64,
        buf: u32,
        status: WcStatus,
    }

    struct Model<Q: QueuePair> {
        qp: Q,
        cq: Q::Cq,
        slots: Vec<Slot>,
        /// Sequence numbers: the oldest send not completed, the next to
        /// push, and the first not posted.
        head: u64,
        tail: u64,
        posted: u64,
        wrs: Vec<SendWr>,
        sges: Vec<Sge>,
        in_flight: Vec<bool>,
        base: u64,
        lkey: u32,
        cqes: [RawCompletion; 32],
        since_signal: usize,
    }

    impl<Q: QueuePair> Model<Q> {
        #[inline(always)]
        fn push(&mut self, buf: u32, len: u32, remote: &RemoteSlice, user_data: u64) -> bool {
            if self.tail - self.head >= DEPTH as u64 - 1 {
                return false;
            }
            let Some(busy) = self.in_flight.get_mut(buf as usize) else {
                return false;
            };
            if *busy || len > CHUNK || u64::from(len) > remote.len() {
                return false;
            }
            *busy = true;
            let seq = self.tail;
            self.tail += 1;
            self.slots[seq as usize % DEPTH] = Slot {
                user_data,
                buf,
                len,
            };
            let start = self.sges.len() as u32;
            self.sges.push(Sge {
                addr: self.base + u64::from(buf * CHUNK),
                len,
                lkey: self.lkey,
            });
            let mut wr = SendWr::new(seq, SendOpcode::Write, SgeSpan { start, len: 1 });
            wr.remote_addr = remote.addr();
            wr.rkey = remote.rkey();
            self.since_signal += 1;
            if self.since_signal >= DEPTH / 2 {
                wr.flags = SendFlags::SIGNALED;
                self.since_signal = 0;
            }
            self.wrs.push(wr);
            true
        }

        fn submit(&mut self) {
            if let Some(last) = self.wrs.last_mut() {
                last.flags = SendFlags::SIGNALED;
                self.since_signal = 0;
            }
            // SAFETY: every element names a chunk of the registration the
            // caller keeps alive (and unmoved) until the run ends, after
            // the last work request has completed.
            unsafe { self.qp.post_send(&self.wrs, &self.sges) }.unwrap();
            self.posted += self.wrs.len() as u64;
            self.wrs.clear();
            self.sges.clear();
        }

        fn reap(&mut self, out: &mut Vec<Done>) {
            let n = self.cq.poll(&mut self.cqes).unwrap();
            for i in 0..n {
                let cqe = self.cqes[i];
                let seq = cqe.wr_id;
                if seq < self.head || seq >= self.posted {
                    continue;
                }
                // In order: the CQE completes every send up to its own.
                while self.head <= seq {
                    let slot = self.slots[self.head as usize % DEPTH];
                    let status = if self.head == seq {
                        cqe.status
                    } else {
                        WcStatus::Success
                    };
                    self.in_flight[slot.buf as usize] = false;
                    out.push(Done {
                        user_data: slot.user_data,
                        buf: slot.buf,
                        status,
                    });
                    black_box(slot.len);
                    self.head += 1;
                }
            }
        }
    }

    /// Rounds of `targets.len()` WRITEs from chunks of `local`, as the
    /// ring's modes run them.
    pub fn run<Q: QueuePair>(
        mut qp: Q,
        local: &RegisteredBuf,
        targets: &[RemoteSlice],
        rounds: usize,
    ) {
        let batch = targets.len();
        let cq = qp.take_cq().expect("a queue pair made with its own CQ");
        let mut model = Model {
            qp,
            cq,
            slots: vec![Slot::default(); DEPTH],
            head: 0,
            tail: 0,
            posted: 0,
            wrs: Vec::with_capacity(DEPTH),
            sges: Vec::with_capacity(DEPTH),
            in_flight: vec![false; batch],
            base: local.as_ptr() as u64,
            lkey: local.lkey(),
            cqes: [RawCompletion::default(); 32],
            since_signal: 0,
        };
        let mut free: Vec<u32> = (0..batch as u32).collect();
        let mut done = Vec::with_capacity(batch);
        for _ in 0..rounds {
            let mut i = 0;
            while let Some(buf) = free.pop() {
                assert!(model.push(buf, CHUNK, &targets[i], i as u64));
                i += 1;
            }
            model.submit();
            while done.len() < batch {
                model.reap(&mut done);
            }
            while let Some(c) = done.pop() {
                assert!(c.status.is_success() && c.user_data < batch as u64);
                free.push(c.buf);
            }
        }
    }
}
