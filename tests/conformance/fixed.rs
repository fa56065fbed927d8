//! The fixed-buffer ring on every backend: each operation moving real
//! bytes, many queue pairs on one completion queue, a failing operation
//! and its flushed successors, detach and drop with work in flight, queue
//! pairs failed on request and by their fatal event.

use std::time::Duration;

use rdma_ring::backend::{QueuePair, SrqConfig, WcStatus};
use rdma_ring::buf::{ExposedBuf, RegisteredBuf, RemoteAccess, RemoteSlice};
use rdma_ring::fixed::{
    CompareSwapFixed, FetchAddFixed, FixedBufs, FixedCompletion, FixedQp, FixedRing,
    FixedRingConfig, FixedSrq, FixedSrqRefill, ReadFixed, RecvFixed, SendFixed, WriteFixed,
};
use rdma_ring::future::{AsyncFixedRing, Wakeup};
use rdma_ring::op::{OpKind, Send};
use rdma_ring::ring::Ring;
use rdma_ring::Error;

use super::{config, exposed, ring_config, submit, wait, Fabric};

const SLOT: u32 = 4096;

fn fixed_config() -> FixedRingConfig {
    FixedRingConfig {
        wait_timeout: Duration::from_secs(30),
        ..FixedRingConfig::default()
    }
}

/// A fixed ring over `qp` (which brings its own completion queue), and
/// the queue pair's handle.
fn fixed_ring<F: Fabric>(f: &F, mut qp: F::Qp, slots: u32) -> (FixedRing<F::Qp>, FixedQp) {
    let cq = qp
        .take_cq()
        .expect("a queue pair with its own completion queue");
    let bufs = FixedBufs::new(f.pd(), slots, SLOT).unwrap();
    let mut ring = FixedRing::new(cq, bufs, fixed_config());
    let handle = ring
        .attach(qp)
        .unwrap_or_else(|r| panic!("attach: {}", r.error()));
    (ring, handle)
}

fn fixed_wait<Q: QueuePair>(ring: &mut FixedRing<Q>, n: usize) -> Vec<FixedCompletion> {
    ring.wait(n)
        .unwrap_or_else(|e| panic!("waiting for {n}: {e}"))
}

fn give_back<Q: QueuePair>(ring: &mut FixedRing<Q>, done: Vec<FixedCompletion>) {
    for c in done {
        ring.put_buf(c.into_buf()).unwrap();
    }
}

pub fn fixed_every_op_kind<F: Fabric>(f: &F) {
    let (qa, qb) = f.pair(config());
    let (mut a, ha) = fixed_ring(f, qa, 16);
    let (mut b, hb) = fixed_ring(f, qb, 16);
    assert_eq!(a.qp_error(ha).unwrap(), None);
    let target = exposed(f, 8192, RemoteAccess::READ | RemoteAccess::WRITE);
    let remote = target.remote();

    // WRITE then READ back, into another slot.
    let mut out = a.take_buf().unwrap();
    a.bufs()
        .bytes_mut(&mut out)
        .iter_mut()
        .enumerate()
        .for_each(|(i, b)| *b = (i * 3) as u8);
    let back = a.take_buf().unwrap();
    a.push(
        ha,
        WriteFixed::new(out, SLOT, remote.slice(0..4096).unwrap()).user_data(1),
    )
    .unwrap();
    a.push(
        ha,
        ReadFixed::new(back, SLOT, remote.slice(0..4096).unwrap()).user_data(2),
    )
    .unwrap();
    assert_eq!(a.submit().unwrap(), 2);
    let done = fixed_wait(&mut a, 2);
    assert_eq!(
        done.iter()
            .map(|c| (c.user_data(), c.kind(), c.status(), c.byte_len(), c.qp()))
            .collect::<Vec<_>>(),
        [
            (1, OpKind::Write, WcStatus::Success, SLOT, ha),
            (2, OpKind::Read, WcStatus::Success, SLOT, ha)
        ]
    );
    assert!(a
        .bufs()
        .bytes(done[1].buf())
        .iter()
        .enumerate()
        .all(|(i, &b)| b == (i * 3) as u8));
    give_back(&mut a, done);

    // SEND, SEND with immediate, WRITE with immediate into receives.
    for i in 0..3 {
        let slot = b.take_buf().unwrap();
        b.push(hb, RecvFixed::new(slot).user_data(10 + i)).unwrap();
    }
    assert_eq!(b.submit().unwrap(), 3);
    let mut plain = a.take_buf().unwrap();
    a.bufs().bytes_mut(&mut plain)[..10].copy_from_slice(b"plain send");
    let mut with_imm = a.take_buf().unwrap();
    a.bufs().bytes_mut(&mut with_imm)[..13].copy_from_slice(b"send with imm");
    let mut payload = a.take_buf().unwrap();
    a.bufs().bytes_mut(&mut payload)[..100].fill(0xee);
    a.push(ha, SendFixed::new(plain, 10)).unwrap();
    a.push(ha, SendFixed::new(with_imm, 13).imm(0xabcd))
        .unwrap();
    a.push(
        ha,
        WriteFixed::new(payload, 100, remote.slice(4096..4196).unwrap()).imm(0x1234),
    )
    .unwrap();
    a.submit().unwrap();
    let sent = fixed_wait(&mut a, 3);
    assert_eq!(
        sent.iter()
            .map(|c| (c.kind(), c.status()))
            .collect::<Vec<_>>(),
        [
            (OpKind::Send, WcStatus::Success),
            (OpKind::SendImm, WcStatus::Success),
            (OpKind::WriteImm, WcStatus::Success)
        ]
    );
    give_back(&mut a, sent);
    let got = fixed_wait(&mut b, 3);
    assert_eq!(
        got.iter()
            .map(|c| (
                c.user_data(),
                c.kind(),
                c.byte_len(),
                c.imm(),
                c.by_write_imm()
            ))
            .collect::<Vec<_>>(),
        [
            (10, OpKind::Recv, 10, None, false),
            (11, OpKind::Recv, 13, Some(0xabcd), false),
            (12, OpKind::Recv, 100, Some(0x1234), true)
        ]
    );
    assert_eq!(&b.bufs().bytes(got[0].buf())[..10], b"plain send");
    assert_eq!(&b.bufs().bytes(got[1].buf())[..13], b"send with imm");
    give_back(&mut b, got);

    // Both atomics: the old values land in the slots.
    let counters = ExposedBuf::new(
        f.pd(),
        vec![7u64, 100].into_boxed_slice(),
        RemoteAccess::ATOMIC,
    )
    .unwrap();
    let words = counters.remote();
    for op in 0..3 {
        let slot = a.take_buf().unwrap();
        let pushed = match op {
            0 => a
                .push(
                    ha,
                    CompareSwapFixed::new(slot, words.word(0).unwrap(), 7, 70),
                )
                .map_err(|r| r.into_parts().0),
            1 => a
                .push(
                    ha,
                    CompareSwapFixed::new(slot, words.word(0).unwrap(), 7, 99),
                )
                .map_err(|r| r.into_parts().0),
            _ => a
                .push(ha, FetchAddFixed::new(slot, words.word(8).unwrap(), 5))
                .map_err(|r| r.into_parts().0),
        };
        pushed.unwrap_or_else(|e| panic!("atomic {op}: {e}"));
    }
    a.submit().unwrap();
    let done = fixed_wait(&mut a, 3);
    let olds: Vec<u64> = done
        .iter()
        .map(|c| {
            assert!(c.status().is_success(), "{:?}", c.status());
            u64::from_ne_bytes(a.bufs().bytes(c.buf())[..8].try_into().unwrap())
        })
        .collect();
    assert_eq!(olds, [7, 70, 100], "CAS hit, CAS miss, FAA");
    give_back(&mut a, done);
    assert_eq!(
        (a.bufs().free(), b.bufs().free()),
        (16, 16),
        "every slot back"
    );
    drop((a, b));
    assert_eq!(&*counters.into_inner().unwrap(), &[70, 105]);
    let memory = target.into_inner().unwrap();
    assert!(memory[..4096]
        .iter()
        .enumerate()
        .all(|(i, &b)| b == (i * 3) as u8));
    assert!(memory[4096..4196].iter().all(|&b| b == 0xee));
}

/// Three queue pairs on one completion queue: each completion names its
/// queue pair; batches of unsignaled WRITEs come back whole, in order.
pub fn fixed_many_qps_on_one_cq<F: Fabric>(f: &F) {
    let cq = f.cq(512);
    let bufs = FixedBufs::new(f.pd(), 64, 64).unwrap();
    let mut server = FixedRing::new(
        cq,
        bufs,
        FixedRingConfig {
            signal_interval: 8,
            ..fixed_config()
        },
    );
    let mut clients = Vec::new();
    let mut handles = Vec::new();
    for _ in 0..3 {
        let (qp, peer) = f.pair_on(server.cq(), None, config());
        handles.push(server.attach(qp).unwrap_or_else(|_| panic!("attach")));
        clients.push(Ring::new(peer, ring_config()));
    }
    // Each client sends one message; the server receives on each.
    for &h in &handles {
        let slot = server.take_buf().unwrap();
        server.push(h, RecvFixed::new(slot)).unwrap();
    }
    server.submit().unwrap();
    for (i, client) in clients.iter_mut().enumerate() {
        let msg = RegisteredBuf::new(f.pd(), vec![i as u8 + 1; 16]).unwrap();
        client.submission().push(Send::new(msg)).unwrap();
        submit(client);
        assert!(wait(client, 1)[0].status().is_success());
    }
    let got = fixed_wait(&mut server, 3);
    for c in &got {
        let i = handles
            .iter()
            .position(|&h| h == c.qp())
            .expect("a known queue pair");
        assert_eq!(c.byte_len(), 16);
        assert!(server.bufs().bytes(c.buf())[..16]
            .iter()
            .all(|&b| b == i as u8 + 1));
    }
    give_back(&mut server, got);

    // Then 20 unsignaled-by-default WRITEs per queue pair, one submit.
    let targets: Vec<ExposedBuf<Vec<u8>>> = (0..3)
        .map(|_| exposed(f, 20 * 64, RemoteAccess::WRITE))
        .collect();
    for (q, &h) in handles.iter().enumerate() {
        for k in 0..20u64 {
            let mut slot = server.take_buf().unwrap();
            server
                .bufs()
                .bytes_mut(&mut slot)
                .fill((q * 20) as u8 + k as u8);
            let remote = targets[q].remote().slice(k * 64..(k + 1) * 64).unwrap();
            server
                .push(
                    h,
                    WriteFixed::new(slot, 64, remote).user_data(q as u64 * 100 + k),
                )
                .unwrap();
        }
    }
    assert_eq!(server.submit().unwrap(), 60);
    let done = fixed_wait(&mut server, 60);
    for (q, &h) in handles.iter().enumerate() {
        let mine: Vec<u64> = done
            .iter()
            .filter(|c| c.qp() == h)
            .map(|c| c.user_data())
            .collect();
        assert_eq!(
            mine,
            (0..20).map(|k| q as u64 * 100 + k).collect::<Vec<_>>()
        );
    }
    assert!(done
        .iter()
        .all(|c| c.status().is_success() && c.byte_len() == 64));
    give_back(&mut server, done);
    assert_eq!(server.unknown_completions(), 0);
    for h in handles {
        server.detach(h).unwrap();
    }
    for (q, target) in targets.into_iter().enumerate() {
        let memory = target.into_inner().unwrap();
        for k in 0..20 {
            assert!(memory[k * 64..(k + 1) * 64]
                .iter()
                .all(|&b| b == (q * 20 + k) as u8));
        }
    }
    assert_eq!(server.bufs().free(), 64);
}

/// A WRITE to a wrong key fails; what follows it comes back flushed; the
/// queue pair then refuses work, handing the operation back.
pub fn fixed_wrong_rkey_fails_and_flushes<F: Fabric>(f: &F) {
    let (a, _b) = f.pair(config());
    let (mut ring, h) = fixed_ring(f, a, 8);
    let target = exposed(f, 256, RemoteAccess::WRITE);
    let good = target.remote().slice(0..64).unwrap();
    let bad = RemoteSlice::new(good.addr(), 64, good.rkey() ^ 0x5a5a, RemoteAccess::WRITE);
    for (i, remote) in [good, bad, good, good].into_iter().enumerate() {
        let slot = ring.take_buf().unwrap();
        ring.push(h, WriteFixed::new(slot, 64, remote).user_data(i as u64))
            .unwrap();
    }
    ring.submit().unwrap();
    let done = fixed_wait(&mut ring, 4);
    let statuses: Vec<_> = done.iter().map(|c| (c.user_data(), c.status())).collect();
    assert_eq!(statuses[0], (0, WcStatus::Success));
    assert_eq!(statuses[1].0, 1);
    assert!(
        !statuses[1].1.is_success() && !statuses[1].1.is_flush(),
        "{statuses:?}"
    );
    assert_eq!(
        &statuses[2..],
        [(2, WcStatus::WrFlushErr), (3, WcStatus::WrFlushErr)]
    );
    assert!(done[1..].iter().all(|c| c.byte_len() == 0));
    give_back(&mut ring, done);
    let slot = ring.take_buf().unwrap();
    let refused = ring.push(h, WriteFixed::new(slot, 64, good)).unwrap_err();
    assert!(
        matches!(refused.error(), Error::QpInError(_)),
        "{}",
        refused.error()
    );
    ring.put_buf(refused.into_parts().1.into_buf()).unwrap();
    assert_eq!(ring.bufs().free(), 8, "every slot back");
}

/// Receives in flight: detaching hands them back flushed and the queue
/// pair too; dropping a ring with receives in flight drains them, leaking
/// nothing.
pub fn fixed_detach_and_drop_with_work_in_flight<F: Fabric>(f: &F) {
    let (a, _peer) = f.pair(config());
    let (mut ring, h) = fixed_ring(f, a, 8);
    for i in 0..4 {
        let slot = ring.take_buf().unwrap();
        ring.push(h, RecvFixed::new(slot).user_data(i)).unwrap();
    }
    ring.submit().unwrap();
    let slot = ring.take_buf().unwrap();
    ring.push(h, RecvFixed::new(slot).user_data(4)).unwrap(); // never posted
    let qp = ring.detach(h).unwrap();
    assert!(matches!(ring.detach(h), Err(Error::NotAttached(_))));
    let mut back = Vec::new();
    ring.reap(&mut back).unwrap();
    let mut ids: Vec<u64> = back.iter().map(|c| c.user_data()).collect();
    ids.sort_unstable();
    assert_eq!(ids, [0, 1, 2, 3, 4]);
    assert!(back.iter().all(|c| c.status() == WcStatus::WrFlushErr));
    give_back(&mut ring, back);
    drop(qp);

    let (a, _peer) = f.pair(config());
    let (mut ring, h) = fixed_ring(f, a, 8);
    for _ in 0..4 {
        let slot = ring.take_buf().unwrap();
        ring.push(h, RecvFixed::new(slot)).unwrap();
    }
    ring.submit().unwrap();
    ring.close().expect("drained, not leaked");
}

/// Awaited operations on the fixed-buffer ring, woken by the notifier
/// thread on the completion channel: a batch of writes pushed before they
/// are awaited goes out with one doorbell, a read brings the bytes back,
/// a send meets an awaited receive with its immediate, and a receive
/// whose future is dropped comes back to the free slots when a detach
/// flushes it.
pub fn fixed_awaited_ops<F: Fabric>(f: &F) {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    let (mut qa, qb) = f.pair(config());
    // A's posts counted where they reach the backend.
    let posts = Arc::new(AtomicU64::new(0));
    let cq = qa
        .take_cq()
        .expect("a queue pair with its own completion queue");
    let mut a = FixedRing::new(
        cq,
        FixedBufs::new(f.pd(), 16, SLOT).unwrap(),
        fixed_config(),
    );
    let counting = super::many::Counting {
        inner: qa,
        posts: Arc::clone(&posts),
    };
    let ha = a
        .attach(counting)
        .unwrap_or_else(|r| panic!("attach: {}", r.error()));
    let (b, hb) = fixed_ring(f, qb, 16);
    let a = AsyncFixedRing::new(a, Wakeup::Thread).unwrap();
    let b = AsyncFixedRing::new(b, Wakeup::Thread).unwrap();
    let target = exposed(f, 8 * 512, RemoteAccess::READ | RemoteAccess::WRITE);
    futures::executor::block_on(async {
        let mut writes = Vec::new();
        for i in 0..8u64 {
            let mut slot = a.take_buf().unwrap();
            a.with_bufs(|bufs| bufs.bytes_mut(&mut slot)[..512].fill(0x10 + i as u8))
                .unwrap();
            let remote = target.remote().slice(i * 512..(i + 1) * 512).unwrap();
            let write = WriteFixed::new(slot, 512, remote).user_data(100 + i);
            writes.push(a.push(ha, write).unwrap());
        }
        assert_eq!(posts.load(Ordering::Relaxed), 0, "pushed, not posted");
        for (i, write) in writes.into_iter().enumerate() {
            let done = write.await.unwrap();
            assert_eq!(
                (done.status(), done.user_data(), done.byte_len()),
                (WcStatus::Success, 100 + i as u64, 512)
            );
            a.put_buf(done.into_buf()).unwrap();
        }
        assert_eq!(
            posts.load(Ordering::Relaxed),
            1,
            "eight writes, one doorbell"
        );
        let back = a.take_buf().unwrap();
        let read = ReadFixed::new(back, 1024, target.remote().slice(3 * 512..5 * 512).unwrap());
        let done = a.push(ha, read).unwrap().await.unwrap();
        assert!(done.status().is_success());
        a.with_bufs(|bufs| {
            let bytes = bufs.bytes(done.buf());
            assert!(bytes[..512].iter().all(|&x| x == 0x13));
            assert!(bytes[512..1024].iter().all(|&x| x == 0x14));
        })
        .unwrap();
        a.put_buf(done.into_buf()).unwrap();

        let recv = b.push(hb, RecvFixed::new(b.take_buf().unwrap())).unwrap();
        let mut msg = a.take_buf().unwrap();
        a.with_bufs(|bufs| bufs.bytes_mut(&mut msg)[..4].copy_from_slice(b"ping"))
            .unwrap();
        let send = a.push(ha, SendFixed::new(msg, 4).imm(9)).unwrap();
        let (sent, got) = futures::join!(send, recv);
        a.put_buf(sent.unwrap().into_buf()).unwrap();
        let got = got.unwrap();
        assert_eq!(
            (got.status(), got.byte_len(), got.imm()),
            (WcStatus::Success, 4, Some(9))
        );
        assert_eq!(
            b.with_bufs(|bufs| bufs.bytes(got.buf())[..4].to_vec())
                .unwrap(),
            b"ping"
        );
        b.put_buf(got.into_buf()).unwrap();

        // A receive nobody answers, its future dropped.
        drop(b.push(hb, RecvFixed::new(b.take_buf().unwrap())).unwrap());
        b.submit().unwrap();
    });
    assert_eq!(
        a.with_bufs(|bufs| bufs.free()).unwrap(),
        16,
        "every slot of a back"
    );
    assert_eq!(
        b.with_bufs(|bufs| bufs.free()).unwrap(),
        15,
        "the dropped receive's slot is still in flight"
    );
    // Detaching flushes the receive: its slot comes back though nobody
    // awaits it.
    let qp = b.detach(hb).unwrap();
    assert_eq!(b.with_bufs(|bufs| bufs.free()).unwrap(), 16);
    drop(qp);
    let driver = b.driver();
    b.close();
    assert!(b.take_buf().is_none(), "closed");
    assert_eq!(driver.drive().unwrap(), 0);
}

/// A queue pair failed on request, and one failed by its fatal event:
/// everything each held comes back flushed (what the device held, and
/// what was never posted), it takes no more work, and it detaches at once.
pub fn fixed_failed_queue_pairs_flush_what_they_held<F: Fabric>(f: &F) {
    use rdma_ring::backend::AsyncEvent;
    for by_event in [false, true] {
        let (a, _peer) = f.pair(config());
        let qp_num = a.caps().qp_num;
        let (mut ring, h) = fixed_ring(f, a, 8);
        for i in 0..4 {
            let slot = ring.take_buf().unwrap();
            ring.push(h, RecvFixed::new(slot).user_data(i)).unwrap();
        }
        ring.submit().unwrap(); // held by the device: nobody sends
        let slot = ring.take_buf().unwrap();
        ring.push(h, RecvFixed::new(slot).user_data(4)).unwrap(); // never posted
        let status = if by_event {
            assert!(ring.apply_event(AsyncEvent::QpFatal { qp_num }));
            WcStatus::FatalErr
        } else {
            ring.fail_qp(h).unwrap();
            WcStatus::WrFlushErr
        };
        assert_eq!(ring.qp_error(h).unwrap(), Some(status));
        let back = fixed_wait(&mut ring, 5);
        let mut ids: Vec<u64> = back.iter().map(|c| c.user_data()).collect();
        ids.sort_unstable();
        assert_eq!(ids, [0, 1, 2, 3, 4], "by event: {by_event}");
        assert!(back.iter().all(|c| c.status() == WcStatus::WrFlushErr));
        give_back(&mut ring, back);
        let slot = ring.take_buf().unwrap();
        let refused = ring.push(h, RecvFixed::new(slot)).unwrap_err();
        assert!(
            matches!(refused.error(), Error::QpInError(s) if *s == status),
            "{}",
            refused.error()
        );
        ring.put_buf(refused.into_parts().1.into_buf()).unwrap();
        let qp = ring.detach(h).expect("nothing left to drain");
        assert_eq!(ring.bufs().free(), 8, "every slot back");
        drop(qp);
    }
}

/// A fixed ring of `slots` 64-byte slots holding a shared receive queue
/// `depth` deep, with `peers` queue pairs on it, each connected to a
/// client ring.
struct SrqServer<F: Fabric> {
    ring: FixedRing<F::Qp>,
    srq: FixedSrq,
    handles: Vec<FixedQp>,
    clients: Vec<Ring<F::Qp>>,
}

fn srq_server<F: Fabric>(f: &F, slots: u32, depth: u32, peers: usize) -> SrqServer<F> {
    let mut ring = FixedRing::new(
        f.cq(256),
        FixedBufs::new(f.pd(), slots, 64).unwrap(),
        fixed_config(),
    );
    let srq = ring
        .add_srq(f.srq(SrqConfig {
            max_wr: depth,
            max_sge: 1,
        }))
        .unwrap_or_else(|r| panic!("add_srq: {}", r.error()));
    let mut handles = Vec::new();
    let mut clients = Vec::new();
    for _ in 0..peers {
        let (qp, peer) = f.pair_on(ring.cq(), ring.srq(srq), config());
        handles.push(
            ring.attach(qp)
                .unwrap_or_else(|r| panic!("attach: {}", r.error())),
        );
        clients.push(Ring::new(peer, ring_config()));
    }
    SrqServer {
        ring,
        srq,
        handles,
        clients,
    }
}

/// Many peers' messages land in one shared receive queue of a fixed ring;
/// each completion names the queue pair it arrived on. Then the queue
/// pairs leave and the queue is removed: its receives come back flushed.
pub fn fixed_many_peers_on_one_srq<F: Fabric>(f: &F) {
    const PEERS: usize = 6;
    let SrqServer {
        ring: mut server,
        srq,
        handles,
        mut clients,
    } = srq_server(f, 64, 32, PEERS);
    for i in 0..2 * PEERS as u64 + 4 {
        let slot = server.take_buf().unwrap();
        server
            .push_srq(srq, RecvFixed::new(slot).user_data(i))
            .unwrap();
    }
    assert_eq!(server.submit().unwrap(), 2 * PEERS + 4);
    for (i, client) in clients.iter_mut().enumerate() {
        for k in 0..2u8 {
            let msg = RegisteredBuf::new(f.pd(), vec![(i as u8) << 1 | k; 8 + k as usize]).unwrap();
            client.submission().push(Send::new(msg)).unwrap();
        }
        submit(client);
        assert!(wait(client, 2).iter().all(|c| c.status().is_success()));
    }
    let got = fixed_wait(&mut server, 2 * PEERS);
    let mut seen = vec![0u8; PEERS];
    for c in &got {
        assert_eq!(c.status(), WcStatus::Success);
        let byte = server.bufs().bytes(c.buf())[0];
        let (peer, k) = ((byte >> 1) as usize, u32::from(byte & 1));
        assert_eq!(c.qp(), handles[peer], "named by the queue pair it came on");
        assert_eq!(c.byte_len(), 8 + k);
        seen[peer] |= 1 << k;
    }
    assert_eq!(seen, vec![3u8; PEERS], "every message, once");
    assert_eq!(server.srq_posted(srq).unwrap(), 4);
    give_back(&mut server, got);

    // The queue pairs leave (each moved to error, idle as it is), and
    // are destroyed; the queue goes, and its four receives come back.
    for &h in &handles {
        drop(server.detach(h).unwrap());
    }
    drop(server.remove_srq(srq).unwrap());
    let back = fixed_wait(&mut server, 4);
    assert!(back.iter().all(|c| c.status() == WcStatus::WrFlushErr));
    give_back(&mut server, back);
    assert_eq!(server.bufs().free(), 64, "every slot came back");
    assert_eq!(server.unknown_completions(), 0);
}

/// A shared receive queue the ring keeps topped up from its free slots,
/// awaited through the adapter: three peers send eight messages each,
/// three times the queue's depth, each arriving in a refill receive that
/// names the queue pair it came on; then the queue pairs leave, the queue
/// goes, and the slots of the receives left posted go back to the ring.
pub fn fixed_refilled_srq_awaited<F: Fabric>(f: &F) {
    const PEERS: usize = 3;
    const EACH: usize = 8;
    let SrqServer {
        ring: server,
        srq,
        handles,
        mut clients,
    } = srq_server(f, 32, 8, PEERS);
    let server = AsyncFixedRing::new(server, Wakeup::Thread).unwrap();
    let refill = FixedSrqRefill {
        low: 3,
        target: 6,
        user_data: 50,
    };
    server.set_srq_refill(srq, Some(refill)).unwrap();
    assert_eq!(server.srq_posted(srq).unwrap(), 6);
    let mut seen = vec![0u32; PEERS];
    futures::executor::block_on(async {
        for k in 0..EACH {
            for (i, client) in clients.iter_mut().enumerate() {
                let byte = (i * EACH + k) as u8;
                let msg = RegisteredBuf::new(f.pd(), vec![byte; 16]).unwrap();
                client.submission().push(Send::new(msg)).unwrap();
                submit(client);
                assert!(wait(client, 1)[0].status().is_success());
                let c = server.receive(srq).await.unwrap();
                assert_eq!(
                    (c.status(), c.user_data(), c.byte_len()),
                    (WcStatus::Success, 50, 16)
                );
                assert_eq!(c.qp(), handles[i], "named by the queue pair it came on");
                let first = server.with_bufs(|b| b.bytes(c.buf())[0]).unwrap();
                assert_eq!(first, byte);
                seen[i] |= 1 << k;
                server.put_buf(c.into_buf()).unwrap();
            }
        }
    });
    assert_eq!(seen, vec![(1u32 << EACH) - 1; PEERS], "every message, once");
    let posted = server.srq_posted(srq).unwrap();
    assert!(
        (3..=6).contains(&posted),
        "kept between its marks: {posted}"
    );
    for &h in &handles {
        drop(server.detach(h).unwrap());
    }
    assert_eq!(
        server.with_bufs(|b| b.free()).unwrap() as usize,
        32 - posted
    );
    drop(server.remove_srq(srq).unwrap());
    // The receives left posted carried nothing: their slots go back to
    // the ring, and the await ends.
    let end = futures::executor::block_on(server.receive(srq));
    assert!(matches!(end, Err(Error::NotAttached(_))), "{end:?}");
    assert_eq!(
        server.with_bufs(|b| b.free()).unwrap(),
        32,
        "every slot came back"
    );
}
