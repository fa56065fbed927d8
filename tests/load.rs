//! A load test on the soft device: 1,024 queue pairs on one completion
//! queue and one shared receive queue, against 1,024 queue pairs of a
//! client ring (also on one completion queue); over 100,000 operations in
//! 20 rounds, over 4,000 in flight at once. Every operation comes back
//! exactly once, with the right data, from the right queue pair; every
//! buffer goes back to its pool; nothing hangs.

use rdma_ring::backend::soft::{Progress, SoftDevice, SoftQp};
use rdma_ring::backend::{QpConfig, SrqConfig};
use rdma_ring::buf::{BaseBuf, BufferPool, ExposedBuf, RemoteAccess};
use rdma_ring::op::{OpKind, Read, Recv, Send, Write};
use rdma_ring::ring::{Completion, QpHandle, Ring, RingConfig};

const QPS: usize = 1024;
const ROUNDS: u64 = 20;
const CHUNK: usize = 64;

/// Encodes what a completion must be: round, queue pair, which op.
fn tag(round: u64, qp: usize, op: u64) -> u64 {
    (round << 32) | ((qp as u64) << 8) | op
}

fn drain(ring: &mut Ring<SoftQp>, n: usize) -> Vec<Completion> {
    let mut out = Vec::with_capacity(n);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while out.len() < n {
        ring.completion().reap(&mut out).unwrap();
        assert!(
            std::time::Instant::now() < deadline,
            "hung: {} of {n}",
            out.len()
        );
    }
    out
}

#[test]
fn a_thousand_queue_pairs_on_one_completion_queue() {
    let dev = SoftDevice::with_progress(Progress::Manual);
    let pd = dev.alloc_pd();
    let config = QpConfig {
        max_send_wr: 8,
        max_recv_wr: 4,
        ..QpConfig::default()
    };
    let ring_config = RingConfig::default();
    let mut server = Ring::with_cq(dev.create_cq(16384).unwrap(), ring_config);
    let srq = server
        .add_srq(
            dev.create_srq(
                &pd,
                SrqConfig {
                    max_wr: 2 * QPS as u32,
                    max_sge: 1,
                },
            )
            .unwrap(),
        )
        .unwrap();
    let mut client = Ring::with_cq(dev.create_cq(16384).unwrap(), ring_config);
    let mut server_qps: Vec<QpHandle> = Vec::with_capacity(QPS);
    let mut client_qps: Vec<QpHandle> = Vec::with_capacity(QPS);
    for _ in 0..QPS {
        let s = dev
            .create_qp_on(&pd, server.cq(), server.srq(srq), config)
            .unwrap();
        let c = dev.create_qp_on(&pd, client.cq(), None, config).unwrap();
        dev.connect(&s, &c).unwrap();
        server_qps.push(server.attach(s).unwrap());
        client_qps.push(client.attach(c).unwrap());
    }
    let exposed = ExposedBuf::new(&pd, vec![0u8; QPS * CHUNK], RemoteAccess::all()).unwrap();
    let pool = BufferPool::new(&pd, CHUNK, 6 * QPS).unwrap();
    let mut seen = std::collections::HashMap::<u64, u32>::new();
    let mut total = 0usize;
    let mut max_in_flight = 0usize;

    for round in 0..ROUNDS {
        for i in 0..QPS {
            server
                .srq_submission(srq)
                .push(Recv::new(pool.take().unwrap()).user_data(tag(round, i, 9)))
                .unwrap();
        }
        for (i, &h) in server_qps.iter().enumerate() {
            let slice = exposed
                .remote()
                .slice((i * CHUNK) as u64..((i + 1) * CHUNK) as u64)
                .unwrap();
            let mut sq = server.submission_on(h);
            for op in 0..2u64 {
                let mut chunk = pool.take().unwrap();
                chunk.fill((round as u8) ^ (i as u8) ^ op as u8);
                sq.push(Write::new(chunk, slice).user_data(tag(round, i, op)))
                    .unwrap();
            }
            sq.push(Read::new(pool.take().unwrap(), slice).user_data(tag(round, i, 2)))
                .unwrap();
        }
        for (i, &h) in client_qps.iter().enumerate() {
            let mut msg = pool.take().unwrap();
            msg[..2].copy_from_slice(&(i as u16).to_le_bytes());
            client
                .submission_on(h)
                .push(Send::new(msg.slice(0..2)).user_data(tag(round, i, 5)))
                .unwrap();
        }
        assert_eq!(server.submit().unwrap(), 4 * QPS);
        assert_eq!(client.submit().unwrap(), QPS);
        max_in_flight = max_in_flight.max(server.in_flight() + client.in_flight());
        dev.progress();

        let mut done = drain(&mut server, 4 * QPS);
        done.extend(drain(&mut client, QPS));
        for c in &done {
            assert!(c.status().is_success(), "{c:?}");
            *seen.entry(c.user_data()).or_default() += 1;
            let qp = ((c.user_data() >> 8) & 0xff_ffff) as usize;
            match c.kind() {
                OpKind::Recv => {
                    // A client's SEND: the consumer is its server queue pair.
                    let from = u16::from_le_bytes([c.buf()[0], c.buf()[1]]) as usize;
                    assert_eq!(c.qp(), Some(server_qps[from]));
                }
                OpKind::Read => {
                    assert_eq!(c.qp(), Some(server_qps[qp]));
                    // RC order on the queue pair: the second WRITE landed.
                    let want = (round as u8) ^ (qp as u8) ^ 1;
                    assert!(c.buf().iter().all(|&b| b == want));
                }
                OpKind::Write => assert_eq!(c.qp(), Some(server_qps[qp])),
                OpKind::Send => assert_eq!(c.qp(), Some(client_qps[qp])),
                other => panic!("unexpected {other:?}"),
            }
        }
        total += done.len();
        drop(done);
        assert_eq!(
            pool.available(),
            pool.capacity(),
            "round {round}: a buffer is out"
        );
    }
    assert!(total >= 100_000, "{total} operations");
    assert!(max_in_flight >= 4_000, "{max_in_flight} in flight at most");
    assert_eq!(seen.len(), total);
    assert!(
        seen.values().all(|&n| n == 1),
        "an operation came back twice"
    );
    assert_eq!(server.stats().doorbells, ROUNDS * (QPS as u64 + 1));
    drop((server, client));
    assert_eq!(pool.available(), pool.capacity());
}
