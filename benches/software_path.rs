//! The software path per operation: build + push + submit + reap, on the
//! soft device's no-op mode (the device completes every work request at
//! once and moves no data), at 1, 16 and 64 operations per submit,
//! through the ring and through the fixed-buffer ring, unawaited and
//! awaited. Criterion reports time per operation (throughput in
//! elements).

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use rdma_ring::backend::soft::{Progress, SoftDevice, SoftQp};
use rdma_ring::backend::{QpConfig, QueuePair};
use rdma_ring::buf::{BufferPool, ExposedBuf, PoolChunk, RemoteAccess, RemoteSlice};
use rdma_ring::op::Write;
use rdma_ring::ring::{Completion, Ring, RingConfig};

struct Setup {
    ring: Ring<SoftQp>,
    remote: RemoteSlice,
    bufs: Vec<PoolChunk>,
    done: Vec<Completion>,
    _pool: BufferPool,
    _exposed: ExposedBuf<Vec<u8>>,
    /// Kept, so the link stays up for the whole benchmark.
    _peer: SoftQp,
}

/// Queue pairs deep enough for a round of 64 unsignaled sends.
fn qp_config() -> QpConfig {
    QpConfig {
        max_send_wr: 256,
        max_recv_wr: 1,
        ..QpConfig::default()
    }
}

fn setup(batch: usize) -> Setup {
    let dev = SoftDevice::with_progress(Progress::NoOp);
    let pd = dev.alloc_pd();
    let (qp, peer) = dev.connected_pair(&pd, &pd, qp_config()).unwrap();
    let exposed = ExposedBuf::new(&pd, vec![0u8; 64 * 64], RemoteAccess::WRITE).unwrap();
    let pool = BufferPool::new(&pd, 64, batch).unwrap();
    let bufs = (0..batch).map(|_| pool.take().unwrap()).collect();
    Setup {
        ring: Ring::new(qp, RingConfig::default()),
        remote: exposed.remote(),
        bufs,
        done: Vec::with_capacity(batch),
        _pool: pool,
        _exposed: exposed,
        _peer: peer,
    }
}

/// One round: push `bufs.len()` writes, submit once, reap them all, and
/// take the buffers back for the next round.
fn round(s: &mut Setup) {
    let n = s.bufs.len();
    let mut sq = s.ring.submission();
    for (i, buf) in s.bufs.drain(..).enumerate() {
        let target = s.remote.slice(i as u64 * 64..(i as u64 + 1) * 64).unwrap();
        sq.push(Write::new(buf, target).user_data(i as u64))
            .unwrap();
    }
    sq.submit().unwrap();
    let mut cq = s.ring.completion();
    while s.done.len() < n {
        cq.reap(&mut s.done).unwrap();
    }
    for c in s.done.drain(..) {
        s.bufs.push(c.into_buf().downcast::<PoolChunk>().unwrap());
    }
}

fn software_path(c: &mut Criterion) {
    let mut group = c.benchmark_group("software_path");
    for batch in [1usize, 16, 64] {
        group.throughput(Throughput::Elements(batch as u64));
        // Set up once: criterion calls the closure for every sample.
        let mut s = setup(batch);
        group.bench_function(format!("write_batch_{batch}"), |b| {
            b.iter(|| round(&mut s));
        });
    }
    group.finish();
}

/// The fixed-buffer ring's rounds, as `round` does them for the ring:
/// slots named by tokens, unawaited and awaited (pushed, then awaited in
/// order: one doorbell per round).
fn fixed_path(c: &mut Criterion) {
    use rdma_ring::fixed::{
        FixedBuf, FixedBufs, FixedCompletion, FixedRing, FixedRingConfig, WriteFixed,
    };
    use rdma_ring::future::{AsyncFixedRing, Wakeup};

    let mut group = c.benchmark_group("fixed_path");
    for batch in [1usize, 16, 64] {
        let dev = SoftDevice::with_progress(Progress::NoOp);
        let pd = dev.alloc_pd();
        let config = qp_config();
        let exposed = ExposedBuf::new(&pd, vec![0u8; 64 * 64], RemoteAccess::WRITE).unwrap();
        let targets: Vec<RemoteSlice> = (0..batch as u64)
            .map(|i| exposed.remote().slice(i * 64..(i + 1) * 64).unwrap())
            .collect();
        let ring = |qp: &mut SoftQp| {
            let bufs = FixedBufs::new(&pd, batch as u32, 64).unwrap();
            FixedRing::new(qp.take_cq().unwrap(), bufs, FixedRingConfig::default())
        };
        group.throughput(Throughput::Elements(batch as u64));

        let (mut qp, peer) = dev.connected_pair(&pd, &pd, config).unwrap();
        let mut fixed = ring(&mut qp);
        let h = fixed.attach(qp).unwrap();
        let mut free: Vec<FixedBuf> = (0..batch).map(|_| fixed.take_buf().unwrap()).collect();
        let mut done: Vec<FixedCompletion> = Vec::with_capacity(batch);
        group.bench_function(format!("write_batch_{batch}"), |b| {
            b.iter(|| {
                let mut i = 0;
                while let Some(buf) = free.pop() {
                    fixed
                        .push(h, WriteFixed::new(buf, 64, targets[i]).user_data(i as u64))
                        .unwrap();
                    i += 1;
                }
                fixed.submit().unwrap();
                while done.len() < batch {
                    fixed.reap(&mut done).unwrap();
                }
                while let Some(c) = done.pop() {
                    free.push(c.into_buf());
                }
            });
        });
        drop((fixed, peer));

        // The same through one batch a round, each completion handed to a
        // closure (no list).
        let (mut qp, peer) = dev.connected_pair(&pd, &pd, config).unwrap();
        let mut fixed = ring(&mut qp);
        let h = fixed.attach(qp).unwrap();
        let mut free: Vec<FixedBuf> = (0..batch).map(|_| fixed.take_buf().unwrap()).collect();
        group.bench_function(format!("batched_write_batch_{batch}"), |b| {
            b.iter(|| {
                let mut pushes = fixed.batch(h).unwrap();
                let mut i = 0;
                while let Some(buf) = free.pop() {
                    pushes
                        .push(WriteFixed::new(buf, 64, targets[i]).user_data(i as u64))
                        .unwrap();
                    i += 1;
                }
                fixed.submit().unwrap();
                while free.len() < batch {
                    fixed.reap_each(|c| free.push(c.into_buf())).unwrap();
                }
            });
        });
        drop((fixed, peer));

        let (mut qp, peer) = dev.connected_pair(&pd, &pd, config).unwrap();
        let awaited = AsyncFixedRing::new(ring(&mut qp), Wakeup::Busy).unwrap();
        let h = awaited.attach(qp).unwrap();
        let mut free: Vec<FixedBuf> = (0..batch).map(|_| awaited.take_buf().unwrap()).collect();
        let mut ops = Vec::with_capacity(batch);
        group.bench_function(format!("awaited_write_batch_{batch}"), |b| {
            b.iter(|| {
                futures::executor::block_on(async {
                    let mut i = 0;
                    while let Some(buf) = free.pop() {
                        let write = WriteFixed::new(buf, 64, targets[i]).user_data(i as u64);
                        ops.push(awaited.push(h, write).unwrap());
                        i += 1;
                    }
                    for op in ops.drain(..) {
                        free.push(op.await.unwrap().into_buf());
                    }
                })
            });
        });
        drop((awaited, peer));

        // The same, each round's pushes under one lock.
        let (mut qp, peer) = dev.connected_pair(&pd, &pd, config).unwrap();
        let awaited = AsyncFixedRing::new(ring(&mut qp), Wakeup::Busy).unwrap();
        let h = awaited.attach(qp).unwrap();
        let mut free: Vec<FixedBuf> = (0..batch).map(|_| awaited.take_buf().unwrap()).collect();
        let mut writes = Vec::with_capacity(batch);
        let mut ops = Vec::with_capacity(batch);
        group.bench_function(format!("awaited_push_all_write_batch_{batch}"), |b| {
            b.iter(|| {
                futures::executor::block_on(async {
                    let mut i = 0;
                    while let Some(buf) = free.pop() {
                        writes.push(WriteFixed::new(buf, 64, targets[i]).user_data(i as u64));
                        i += 1;
                    }
                    awaited.push_all(h, &mut writes, &mut ops).unwrap();
                    for op in ops.drain(..) {
                        free.push(op.await.unwrap().into_buf());
                    }
                })
            });
        });
        drop((awaited, peer));
    }
    group.finish();
}

criterion_group!(benches, software_path, fixed_path, one_poller);
criterion_main!(benches);

/// One poller serving many queue pairs: rounds of 16 WRITEs on one queue
/// pair at a time, taking the queue pairs in turn, over a ring with 1, 64
/// or 1,024 queue pairs on one completion queue. The time per operation
/// should not grow with the number of queue pairs (per-queue-pair state
/// is found by index, never searched).
fn one_poller(c: &mut Criterion) {
    use rdma_ring::ring::QpHandle;

    let mut group = c.benchmark_group("one_poller");
    for qps in [1usize, 64, 1024] {
        group.throughput(Throughput::Elements(16));
        // Set up once: criterion calls the closure for every sample.
        {
            let dev = SoftDevice::with_progress(Progress::NoOp);
            let pd = dev.alloc_pd();
            let config = QpConfig {
                max_send_wr: 64,
                max_recv_wr: 1,
                ..QpConfig::default()
            };
            let mut ring: Ring<SoftQp> =
                Ring::with_cq(dev.create_cq(4 * 1024 + 64).unwrap(), RingConfig::default());
            let mut handles: Vec<QpHandle> = Vec::new();
            let mut peers = Vec::new();
            for _ in 0..qps {
                let qp = dev.create_qp_on(&pd, ring.cq(), None, config).unwrap();
                let peer = dev.create_qp(&pd, config).unwrap();
                dev.connect(&qp, &peer).unwrap();
                handles.push(ring.attach(qp).unwrap());
                peers.push(peer);
            }
            let exposed = ExposedBuf::new(&pd, vec![0u8; 16 * 64], RemoteAccess::WRITE).unwrap();
            let remote = exposed.remote();
            let pool = BufferPool::new(&pd, 64, 16).unwrap();
            let mut bufs: Vec<PoolChunk> = (0..16).map(|_| pool.take().unwrap()).collect();
            let mut done: Vec<Completion> = Vec::with_capacity(16);
            let mut next = 0usize;
            group.bench_function(format!("qps_{qps}"), |b| {
                b.iter(|| {
                    let h = handles[next % qps];
                    next += 1;
                    let mut sq = ring.submission_on(h);
                    for (i, buf) in bufs.drain(..).enumerate() {
                        let target = remote.slice(i as u64 * 64..(i as u64 + 1) * 64).unwrap();
                        sq.push(Write::new(buf, target).user_data(i as u64))
                            .unwrap();
                    }
                    sq.submit().unwrap();
                    while done.len() < 16 {
                        ring.completion().reap(&mut done).unwrap();
                    }
                    for c in done.drain(..) {
                        bufs.push(c.into_buf().downcast::<PoolChunk>().unwrap());
                    }
                });
            });
            drop(peers);
        }
    }
    group.finish();
}
