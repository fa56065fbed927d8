//! The byte stream on the soft device: exact delivery under random write
//! and read sizes, back-pressure, end of stream and half-close, timeouts,
//! a peer that dies or breaks the protocol, and the async stream under
//! `futures::io::copy` (and tokio's, with the `tokio` feature).

use std::io::{ErrorKind, Read, Write};
use std::net::Shutdown;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use rdma_ring::backend::soft::{QpControl, SoftDevice, SoftPd, SoftQp};
use rdma_ring::backend::{QpConfig, WcStatus};
use rdma_ring::buf::{BaseBuf, RegisteredBuf};
use rdma_ring::future::Wakeup;
use rdma_ring::op::{Recv, SendImm};
use rdma_ring::ring::{Ring, RingConfig};
use rdma_ring::stream::frame::{self, Header, Hello, Kind};
use rdma_ring::stream::{RdmaStream, StreamConfig};
use rdma_ring::Error;

fn small() -> StreamConfig {
    StreamConfig {
        chunk_size: 64,
        recv_buffers: 3,
        answer_buffers: 2,
        send_buffers: 2,
        connect_timeout: Duration::from_secs(3),
        ..StreamConfig::default()
    }
}

/// Two connected streams, with the soft queue pairs' fault controls.
fn pair_with_controls(
    dev: &SoftDevice,
    config: StreamConfig,
) -> (RdmaStream<SoftQp>, RdmaStream<SoftQp>, QpControl, QpControl) {
    let (pd_a, pd_b) = (dev.alloc_pd(), dev.alloc_pd());
    let qa = dev.create_qp(&pd_a, config.qp_config()).unwrap();
    let qb = dev.create_qp(&pd_b, config.qp_config()).unwrap();
    dev.connect(&qa, &qb).unwrap();
    let (ca, cb) = (qa.control(), qb.control());
    let a = RdmaStream::prepare(qa, &pd_a, config).unwrap();
    let b = RdmaStream::prepare(qb, &pd_b, config).unwrap();
    let b = std::thread::spawn(move || b.establish().unwrap());
    let a = a.establish().unwrap();
    (a, b.join().unwrap(), ca, cb)
}

/// A queue pair too shallow for the stream's buffers, or with a completion
/// queue too small for them, is refused up front: the hello would promise
/// the peer receives it cannot post.
#[test]
fn a_queue_pair_shallower_than_the_buffers_is_refused() {
    let dev = SoftDevice::new();
    let config = StreamConfig::default();
    let pd = dev.alloc_pd();
    let deep = config.qp_config();
    for shallow in [
        QpConfig {
            max_recv_wr: deep.max_recv_wr - 1,
            ..deep
        },
        QpConfig {
            max_send_wr: deep.max_send_wr - 1,
            ..deep
        },
        QpConfig {
            cq_entries: deep.completion_entries() - 1,
            ..deep
        },
        QpConfig {
            cq_entries: 8,
            ..deep
        },
    ] {
        let qp = dev.create_qp(&pd, shallow).unwrap();
        let refused = RdmaStream::prepare(qp, &pd, config)
            .map(|_| ())
            .unwrap_err();
        assert!(matches!(refused, Error::Incompatible(_)), "{refused}");
    }
    let qp = dev.create_qp(&pd, deep).unwrap();
    assert!(RdmaStream::prepare(qp, &pd, config).is_ok());
}

/// An end of stream the device refuses to post fails the shutdown: the
/// stream does not report it sent.
#[test]
fn a_shutdown_whose_end_of_stream_the_device_refuses_fails() {
    let dev = SoftDevice::new();
    let (mut a, _b, ca, _cb) = pair_with_controls(&dev, StreamConfig::default());
    a.write_all(b"x").unwrap();
    a.flush().unwrap();
    ca.refuse_posts(1);
    let err = a.shutdown(Shutdown::Write).unwrap_err();
    assert!(err.to_string().contains("out of resources"), "{err}");
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn the_seed_client_and_server_exchange_greetings() {
    let dev = SoftDevice::new();
    let (mut client, mut server) = RdmaStream::soft_pair(&dev, StreamConfig::default()).unwrap();
    let server = std::thread::spawn(move || {
        let mut buf = [0u8; 40];
        let n = server.read(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"hello from client!");
        server.write_all(b"hello from server!").unwrap();
        server.flush().unwrap();
    });
    client.write_all(b"hello from client!").unwrap();
    client.flush().unwrap();
    let mut buf = [0u8; 40];
    let n = client.read(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"hello from server!");
    server.join().unwrap();
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Whatever the write and read sizes and the buffer counts, the reader
    /// gets exactly the bytes written, in order, then the end of stream.
    #[test]
    fn random_write_and_read_sizes_deliver_exactly_the_bytes(
        writes in proptest::collection::vec(1usize..300, 1..60),
        reads in proptest::collection::vec(1usize..200, 1..20),
        recv_buffers in 1u32..5,
        answer_buffers in 2u32..5,
        send_buffers in 1usize..4,
        chunk in 64usize..200,
    ) {
        let config = StreamConfig { chunk_size: chunk, recv_buffers, answer_buffers, send_buffers, ..StreamConfig::default() };
        let dev = SoftDevice::new();
        let (mut a, mut b, ca, cb) = pair_with_controls(&dev, config);
        let total: usize = writes.iter().sum();
        let sent = pattern(total, 7);
        let to_send = sent.clone();
        let writer = std::thread::spawn(move || {
            let mut at = 0;
            for w in writes {
                a.write_all(&to_send[at..at + w]).unwrap();
                at += w;
            }
            a.shutdown(Shutdown::Write).unwrap();
            a
        });
        let mut got = Vec::new();
        let mut sizes = reads.iter().cycle();
        loop {
            let mut buf = vec![0u8; *sizes.next().unwrap()];
            let n = b.read(&mut buf).unwrap();
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
        }
        let a = writer.join().unwrap();
        prop_assert_eq!(got.len(), total);
        prop_assert!(got == sent, "the bytes differ");
        prop_assert_eq!((ca.counters().rnr_naks, cb.counters().rnr_naks), (0, 0), "an RNR NAK");
        drop((a, b));
    }
}

/// A non-blocking writer that ends writing while the peer's buffers are
/// full is told it did (not `WouldBlock`, which would say it did not);
/// what it wrote, then the end of stream, goes out as the reader makes
/// room.
#[test]
fn a_non_blocking_shutdown_ends_writing_at_once_and_loses_nothing() {
    let dev = SoftDevice::new();
    let (mut a, mut b, _, _) = pair_with_controls(&dev, small());
    a.set_nonblocking(true);
    let data = pattern(64 * 64, 5);
    let mut written = 0;
    while let Ok(n) = a.write(&data[written..]) {
        written += n;
        assert!(written < data.len(), "nothing held the writer back");
    }
    a.shutdown(Shutdown::Write).unwrap();
    assert_eq!(a.write(b"more").unwrap_err().kind(), ErrorKind::BrokenPipe);
    b.set_nonblocking(true);
    let mut got = Vec::new();
    let mut buf = [0u8; 50];
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match b.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            Err(e) => panic!("{e}"),
        }
        // The writer's owner calls it now and then, as a socket's does.
        match a.flush() {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            Err(e) => panic!("{e}"),
        }
        assert!(Instant::now() < deadline, "the end of stream never came");
    }
    assert!(got == data[..written], "the bytes differ");
}

#[test]
fn a_slow_reader_holds_the_writer_back_and_loses_nothing() {
    let dev = SoftDevice::new();
    let (mut a, mut b, ca, cb) = pair_with_controls(&dev, small());
    a.set_nonblocking(true);
    let data = pattern(64 * 64, 3);
    // Nobody reads: the writer fills its send buffers and the reader's
    // receive buffers, then is told to wait.
    let mut written = 0;
    let refused = loop {
        match a.write(&data[written..]) {
            Ok(n) => written += n,
            Err(e) => break e,
        }
        assert!(written < data.len(), "nothing held the writer back");
    };
    assert_eq!(refused.kind(), ErrorKind::WouldBlock, "{refused}");
    // At most what the send buffers and the reader's receive buffers hold.
    let capacity = 64 * (small().send_buffers + small().recv_buffers as usize);
    assert!(
        written > 0 && written <= capacity,
        "wrote {written} with room for {capacity}"
    );
    // The reader drains slowly; the writer goes on as room comes back.
    let mut got = Vec::new();
    let mut buf = [0u8; 50];
    while got.len() < data.len() {
        // The writer keeps writing, then flushing (a stream moves only
        // when its owner calls it, as a socket's user does).
        let wrote = if written < data.len() {
            a.write(&data[written..]).map(|n| written += n)
        } else {
            a.flush()
        };
        match wrote {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            Err(e) => panic!("{e}"),
        }
        b.set_nonblocking(true);
        match b.read(&mut buf) {
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            Err(e) => panic!("{e}"),
        }
    }
    assert!(got == data, "bytes lost or reordered");
    // Never a message without a receive posted: the device counted no RNR
    // NAK either way.
    assert_eq!((ca.counters().rnr_naks, cb.counters().rnr_naks), (0, 0));
}

#[test]
fn send_buffers_filled_in_place_keep_their_place_among_writes() {
    let dev = SoftDevice::new();
    let (mut a, mut b) = RdmaStream::soft_pair(&dev, small()).unwrap();
    let writer = std::thread::spawn(move || {
        let mut expected = Vec::new();
        for round in 0..200u32 {
            let head = round.to_le_bytes();
            a.write_all(&head).unwrap();
            expected.extend_from_slice(&head);
            let mut buf = a.send_buffer().unwrap();
            assert_eq!(buf.len(), 64, "capped at the message size");
            let len = 1 + round as usize % 64;
            for (i, byte) in buf[..len].iter_mut().enumerate() {
                *byte = (i as u8) ^ (round as u8);
            }
            expected.extend_from_slice(&buf[..len]);
            a.send(buf, len).unwrap();
        }
        // A buffer dropped unsent goes back to the pool; an oversized send
        // is refused and hands the buffer back, bytes and all, to be sent
        // with a length that fits.
        drop(a.send_buffer().unwrap());
        let mut buf = a.send_buffer().unwrap();
        buf[..64].fill(0xa5);
        let refused = a.send(buf, 65).unwrap_err();
        assert_eq!(refused.error().kind(), ErrorKind::InvalidInput);
        let buf = refused.into_buffer();
        assert!(buf[..64].iter().all(|&b| b == 0xa5), "the bytes were lost");
        a.send(buf, 64).unwrap();
        expected.extend_from_slice(&[0xa5; 64]);
        // After the shutdown a send is refused, and still hands back the
        // buffer taken before it.
        let mut late = a.send_buffer().unwrap();
        late[0] = 7;
        a.shutdown(Shutdown::Write).unwrap();
        let (error, late) = a.send(late, 1).unwrap_err().into_parts();
        assert_eq!(error.kind(), ErrorKind::BrokenPipe);
        assert_eq!(late[0], 7);
        (a, expected)
    });
    // Another stream's buffer is refused, handed to the wrong stream, and
    // comes back to go out on its own.
    let (mut c, mut d) = RdmaStream::soft_pair(&dev, small()).unwrap();
    let mut foreign = d.send_buffer().unwrap();
    foreign[0] = 42;
    let refused = c.send(foreign, 1).unwrap_err();
    assert_eq!(refused.error().kind(), ErrorKind::InvalidInput);
    let as_io: std::io::Error = refused.into();
    assert!(as_io.to_string().contains("another stream"), "{as_io}");
    let mut foreign = d.send_buffer().unwrap();
    foreign[0] = 43;
    let refused = c.send(foreign, 1).unwrap_err();
    d.send(refused.into_buffer(), 1).unwrap();
    let mut one = [0u8; 1];
    c.read_exact(&mut one).unwrap();
    assert_eq!(one, [43]);
    let mut got = Vec::new();
    b.read_to_end(&mut got).unwrap();
    let (_a, expected) = writer.join().unwrap();
    assert!(got == expected, "the bytes differ or are out of order");
}

#[test]
fn end_of_stream_and_half_close_behave_like_tcp() {
    let dev = SoftDevice::new();
    let (mut a, mut b) = RdmaStream::soft_pair(&dev, small()).unwrap();
    a.write_all(b"last words").unwrap();
    a.shutdown(Shutdown::Write).unwrap();
    let err = a.write(b"more").unwrap_err();
    assert_eq!(err.kind(), ErrorKind::BrokenPipe);
    let mut got = String::new();
    b.read_to_string(&mut got).unwrap();
    assert_eq!(got, "last words");
    assert_eq!(b.read(&mut [0u8; 8]).unwrap(), 0, "end of stream stays");
    // The other direction still works.
    b.write_all(b"reply after your FIN").unwrap();
    b.flush().unwrap();
    let mut reply = [0u8; 20];
    a.read_exact(&mut reply).unwrap();
    assert_eq!(&reply, b"reply after your FIN");
    // Dropping B sends its end of stream: A reads the end.
    drop(b);
    assert_eq!(a.read(&mut reply).unwrap(), 0);
}

/// Both sides write more than the other's receive buffers hold, shut
/// down writing, and only then read: as with TCP, neither waits for ever
/// in its shutdown, and each reads all the other wrote, then the end of
/// stream.
#[test]
fn both_sides_writing_then_shutting_down_then_reading_do_not_deadlock() {
    let dev = SoftDevice::new();
    let config = StreamConfig {
        connect_timeout: Duration::from_secs(10),
        ..small()
    };
    let (a, b, _ca, _cb) = pair_with_controls(&dev, config);
    let side = |mut s: RdmaStream<SoftQp>, seed: u8| {
        std::thread::spawn(move || -> std::io::Result<Vec<u8>> {
            s.set_write_timeout(Some(Duration::from_secs(5)))?;
            s.set_read_timeout(Some(Duration::from_secs(5)))?;
            s.write_all(&pattern(250, seed))?;
            s.shutdown(Shutdown::Write)?;
            let mut got = Vec::new();
            s.read_to_end(&mut got)?;
            Ok(got)
        })
    };
    let (a, b) = (side(a, 1), side(b, 2));
    let got_by_a = a.join().unwrap().expect("A's side");
    let got_by_b = b.join().unwrap().expect("B's side");
    assert!(
        got_by_a == pattern(250, 2),
        "A got {} bytes",
        got_by_a.len()
    );
    assert!(
        got_by_b == pattern(250, 1),
        "B got {} bytes",
        got_by_b.len()
    );
}

/// A caller holding every send buffer (taken, not sent) gets an error
/// from a write or for one more buffer, not a wait that cannot end; once
/// it sends one, writing goes on.
#[test]
fn holding_every_send_buffer_fails_a_write_instead_of_hanging_it() {
    let dev = SoftDevice::new();
    let (mut a, mut b, _ca, _cb) = pair_with_controls(&dev, small());
    // Without the check, the write would wait this long and time out.
    a.set_write_timeout(Some(Duration::from_secs(2))).unwrap();
    let held: Vec<_> = (0..small().send_buffers)
        .map(|_| a.send_buffer().unwrap())
        .collect();
    let err = a.write(b"more").unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
    let err = a.send_buffer().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
    let mut held = held.into_iter();
    let mut first = held.next().unwrap();
    first[..2].copy_from_slice(b"hi");
    a.send(first, 2).unwrap();
    a.write_all(b" there").unwrap();
    a.flush().unwrap();
    let mut got = [0u8; 8];
    b.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"hi there");
}

/// A stream dropped without reading drops what arrives while it lingers:
/// a peer that writes more than our buffers hold before it reads is not
/// held up, and gets our tail and end of stream, not a reset.
#[test]
fn a_lingering_stream_drops_what_arrives_so_the_peer_goes_on() {
    let dev = SoftDevice::new();
    let config = StreamConfig {
        connect_timeout: Duration::from_secs(10),
        linger: Duration::from_secs(10),
        ..small()
    };
    let (mut a, b, _ca, _cb) = pair_with_controls(&dev, config);
    let b = std::thread::spawn(move || -> std::io::Result<Vec<u8>> {
        let mut b = b;
        b.set_write_timeout(Some(Duration::from_secs(8)))?;
        b.set_read_timeout(Some(Duration::from_secs(8)))?;
        // More than A's receive buffers and our send buffers hold.
        b.write_all(&pattern(2000, 2))?;
        let mut got = Vec::new();
        b.read_to_end(&mut got)?;
        Ok(got)
    });
    // Fits our send buffers and B's receive buffers: the write returns
    // with part of it still waiting to go.
    a.write_all(&pattern(250, 1)).unwrap();
    drop(a);
    let got = b.join().unwrap().expect("B wrote, then read to the end");
    assert!(got == pattern(250, 1), "B got {} bytes", got.len());
}

/// The same through the async stream: each side writes, closes, then
/// reads to the end.
#[test]
fn both_async_sides_writing_then_closing_then_reading_do_not_deadlock() {
    use futures::io::{AsyncReadExt, AsyncWriteExt};
    let dev = SoftDevice::new();
    let (a, b, _ca, _cb) = pair_with_controls(&dev, small());
    let side = |s: RdmaStream<SoftQp>, seed: u8| {
        let mut s = s.into_async(Wakeup::Thread).unwrap();
        std::thread::spawn(move || {
            futures::executor::block_on(async {
                s.write_all(&pattern(250, seed)).await?;
                s.close().await?;
                let mut got = Vec::new();
                s.read_to_end(&mut got).await?;
                std::io::Result::Ok(got)
            })
        })
    };
    let (a, b) = (side(a, 1), side(b, 2));
    let deadline = Instant::now() + Duration::from_secs(20);
    while !(a.is_finished() && b.is_finished()) {
        assert!(
            Instant::now() < deadline,
            "the two sides wait on each other"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let got_by_a = a.join().unwrap().expect("A's side");
    let got_by_b = b.join().unwrap().expect("B's side");
    assert!(
        got_by_a == pattern(250, 2),
        "A got {} bytes",
        got_by_a.len()
    );
    assert!(
        got_by_b == pattern(250, 1),
        "B got {} bytes",
        got_by_b.len()
    );
}

/// An async close waits for the end of stream and the data before it,
/// not for the credits a reading task keeps sending: it is done while the
/// peer goes on writing to us.
#[test]
fn an_async_close_is_not_held_up_by_credits_the_reader_sends() {
    use futures::io::{AsyncReadExt, AsyncWriteExt};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let dev = SoftDevice::new();
    let (a, mut b) = RdmaStream::soft_pair(&dev, small()).unwrap();
    let a = a.into_async(Wakeup::Thread).unwrap();
    let closed = Arc::new(AtomicBool::new(false));
    // The peer writes until our close is done (or 20 s, a failure).
    let peer = {
        let closed = Arc::clone(&closed);
        std::thread::spawn(move || {
            let until = Instant::now() + Duration::from_secs(20);
            while !closed.load(Ordering::Acquire) && Instant::now() < until {
                b.write_all(&[7u8; 64]).unwrap();
                b.flush().unwrap();
            }
            let ran_out = !closed.load(Ordering::Acquire);
            // Our end of stream arrived.
            let mut rest = Vec::new();
            b.read_to_end(&mut rest).unwrap();
            ran_out
        })
    };
    let (mut reader, mut writer) = a.split();
    let reading = std::thread::spawn(move || {
        futures::executor::block_on(async {
            let mut buf = [0u8; 64];
            let mut got = 0usize;
            while let Ok(n) = reader.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                got += n;
            }
            (got, reader)
        })
    });
    // Some of the peer's data has been read (credits are flowing).
    std::thread::sleep(Duration::from_millis(100));
    futures::executor::block_on(async {
        writer.write_all(b"last words").await.unwrap();
        writer.close().await.unwrap();
    });
    closed.store(true, Ordering::Release);
    assert!(
        !peer.join().unwrap(),
        "the close waited until the peer stopped writing"
    );
    // The reader reads to the peer's end of stream.
    let (got, reader) = reading.join().unwrap();
    assert!(got > 0, "nothing was read, so no credit went out");
    drop((reader, writer));
}

#[test]
fn shutdown_read_drops_what_arrives_and_keeps_the_writer_going() {
    let dev = SoftDevice::new();
    let (mut a, mut b) = RdmaStream::soft_pair(&dev, small()).unwrap();
    b.shutdown(Shutdown::Read).unwrap();
    assert_eq!(b.read(&mut [0u8; 4]).unwrap(), 0);
    // Far more than the buffers hold: the dropped bytes' buffers go back.
    let data = pattern(64 * 100, 1);
    let writer = std::thread::spawn(move || {
        a.write_all(&data).unwrap();
        a.flush().unwrap();
        a
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    while !writer.is_finished() {
        assert!(Instant::now() < deadline, "the writer was held back");
        let _ = b.read(&mut [0u8; 4]);
        std::thread::sleep(Duration::from_millis(1));
    }
    writer.join().unwrap();
}

#[test]
fn a_read_timeout_says_timed_out_and_the_stream_goes_on() {
    let dev = SoftDevice::new();
    let (mut a, mut b) = RdmaStream::soft_pair(&dev, small()).unwrap();
    assert!(b.set_read_timeout(Some(Duration::ZERO)).is_err());
    b.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    // Bytes already there come back at once, even fewer than asked for.
    a.write_all(b"early").unwrap();
    let mut got = [0u8; 8];
    assert_eq!(b.read(&mut got).unwrap(), 5);
    assert_eq!(&got[..5], b"early");
    let started = Instant::now();
    let err = b.read(&mut [0u8; 8]).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::TimedOut);
    assert!(started.elapsed() >= Duration::from_millis(50));
    a.write_all(b"late").unwrap();
    let mut got = [0u8; 4];
    b.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"late");
}

#[test]
fn a_dead_peer_resets_the_connection_in_bounded_time() {
    let dev = SoftDevice::new();
    let config = StreamConfig {
        keepalive: Duration::from_millis(50),
        ..small()
    };
    let (mut a, b, _ca, cb) = pair_with_controls(&dev, config);
    // The link goes down while A only reads: its keep-alive probe fails.
    cb.break_connection();
    let started = Instant::now();
    let err = a.read(&mut [0u8; 8]).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ConnectionReset, "{err}");
    assert!(started.elapsed() < Duration::from_secs(10));
    // Writes fail too, and say why.
    let err = a.write(b"anyone?").unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ConnectionReset, "{err}");
    drop(b);
}

#[test]
fn writing_to_a_dead_peer_fails() {
    let dev = SoftDevice::new();
    let (mut a, b, _ca, cb) = pair_with_controls(&dev, small());
    cb.break_connection();
    let data = pattern(4096, 5);
    // More than the buffers hold: the sends must fail, and the writer
    // hear of it.
    let err = a.write_all(&data).and_then(|()| a.flush()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ConnectionReset, "{err}");
    drop(b);
}

/// A raw ring posing as a stream peer, to send what a stream never would.
struct RawPeer {
    ring: Ring<SoftQp>,
    pd: SoftPd,
}

impl RawPeer {
    fn send(&mut self, header: Header, payload: &[u8]) {
        let buf = RegisteredBuf::new(&self.pd, payload.to_vec()).unwrap();
        let op = SendImm::new(buf.slice(..), header.encode());
        self.ring.submission().push(op).unwrap();
        self.ring.submit().unwrap();
    }

    /// A zero-length RDMA WRITE with `header` as its immediate: it uses up
    /// a receive, whose buffer holds what an earlier message left.
    fn write_imm(&mut self, header: Header) {
        let buf = RegisteredBuf::new(&self.pd, vec![0u8; 1]).unwrap();
        let nowhere =
            rdma_ring::buf::RemoteSlice::new(0x1000, 0, 1, rdma_ring::buf::RemoteAccess::WRITE);
        let op = rdma_ring::op::WriteImm::new(buf.slice(..0), nowhere, header.encode());
        self.ring.submission().push(op).unwrap();
        self.ring.submit().unwrap();
    }

    fn hello(&mut self) {
        let hello = Hello {
            chunk: 64,
            data_receives: 4,
            answer_receives: 4,
            probe: rdma_ring::buf::RemoteSlice::new(
                0x1000,
                8,
                1,
                rdma_ring::buf::RemoteAccess::READ,
            ),
        };
        let header = Header {
            kind: Kind::Hello,
            grant: 0,
            ack: 0,
        };
        self.send(header, &hello.encode());
    }
}

/// A stream (not yet established) and a raw peer connected to it, with
/// receives posted on the raw side.
fn stream_and_raw_peer(dev: &SoftDevice) -> (rdma_ring::stream::PendingStream<SoftQp>, RawPeer) {
    stream_with_config_and_raw_peer(dev, small())
}

fn stream_with_config_and_raw_peer(
    dev: &SoftDevice,
    config: StreamConfig,
) -> (rdma_ring::stream::PendingStream<SoftQp>, RawPeer) {
    let (pd_a, pd_b) = (dev.alloc_pd(), dev.alloc_pd());
    let qa = dev.create_qp(&pd_a, small().qp_config()).unwrap();
    let qb = dev.create_qp(&pd_b, small().qp_config()).unwrap();
    dev.connect(&qa, &qb).unwrap();
    let stream = RdmaStream::prepare(qa, &pd_a, config).unwrap();
    let mut ring = Ring::new(qb, RingConfig::default());
    for _ in 0..small().qp_config().max_recv_wr {
        let buf = RegisteredBuf::new(&pd_b, vec![0u8; 64]).unwrap();
        ring.submission().push(Recv::new(buf)).unwrap();
    }
    ring.submit().unwrap();
    (stream, RawPeer { ring, pd: pd_b })
}

#[test]
fn a_hello_naming_a_pad_that_refuses_reads_is_a_protocol_violation() {
    let dev = SoftDevice::new();
    let config = StreamConfig {
        keepalive: Duration::from_millis(20),
        ..small()
    };
    let (stream, mut peer) = stream_with_config_and_raw_peer(&dev, config);
    // The raw peer's hello names rkey 1, which nothing registered: the
    // first keep-alive read of it is refused by the peer's device.
    peer.hello();
    let mut s = stream.establish().unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let err = s.read(&mut [0u8; 8]).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidData, "{err}");
    assert!(err.to_string().contains("keep-alive pad"), "{err}");
    drop(peer);
}

fn hostile(script: impl FnOnce(&mut RawPeer) + Send + 'static) -> std::io::Error {
    let dev = SoftDevice::new();
    let (stream, mut peer) = stream_and_raw_peer(&dev);
    script(&mut peer);
    let result = stream.establish().and_then(|mut s| {
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        // A violation after the end of stream does not change what reads
        // say (the end stands); the connection is closed all the same, as
        // a write then says.
        for _ in 0..3 {
            let _bytes = s.read(&mut [0u8; 64])?;
        }
        s.write(b"?").map(|_| ())
    });
    drop(peer);
    result.unwrap_err()
}

#[test]
fn a_peer_that_breaks_the_protocol_gets_invalid_data() {
    let data = |grant, ack| Header {
        kind: Kind::Data,
        grant,
        ack,
    };
    type Script = Box<dyn FnOnce(&mut RawPeer) + Send>;
    let cases: Vec<(&str, Script)> = vec![
        (
            "before the hello",
            Box::new(move |p: &mut RawPeer| p.send(data(0, 0), b"sneaky")),
        ),
        (
            "magic",
            Box::new(|p: &mut RawPeer| {
                let header = Header {
                    kind: Kind::Hello,
                    grant: 0,
                    ack: 0,
                };
                p.send(header, &[0x55; frame::HELLO_LEN]);
            }),
        ),
        (
            "grants back 9",
            Box::new(move |p: &mut RawPeer| {
                p.hello();
                p.send(data(9, 0), b"x");
            }),
        ),
        (
            "acknowledges 5",
            Box::new(move |p: &mut RawPeer| {
                p.hello();
                p.send(data(0, 5), b"x");
            }),
        ),
        (
            "WRITE with immediate",
            Box::new(move |p: &mut RawPeer| {
                p.hello();
                p.send(data(0, 0), b"first");
                p.write_imm(data(0, 0));
            }),
        ),
        (
            "sent more than the 3 receive buffers",
            Box::new(move |p: &mut RawPeer| {
                p.hello();
                for _ in 0..3 {
                    p.send(data(0, 0), b"flood");
                }
            }),
        ),
        (
            "longer than the receive buffers' 64 bytes",
            Box::new(move |p: &mut RawPeer| {
                p.hello();
                p.send(data(0, 0), &[7u8; 65]);
            }),
        ),
        (
            "data after the end of the stream",
            Box::new(move |p: &mut RawPeer| {
                p.hello();
                let fin = Header {
                    kind: Kind::Fin,
                    grant: 0,
                    ack: 0,
                };
                p.send(fin, &frame::encode_total(0));
                p.send(data(0, 0), b"zombie");
            }),
        ),
        (
            "says it sent 1000 bytes",
            Box::new(|p: &mut RawPeer| {
                p.hello();
                let fin = Header {
                    kind: Kind::Fin,
                    grant: 0,
                    ack: 0,
                };
                p.send(fin, &frame::encode_total(1000));
            }),
        ),
    ];
    for (expect, script) in cases {
        let err = hostile(script);
        assert_eq!(err.kind(), ErrorKind::InvalidData, "{err}");
        assert!(err.to_string().contains(expect), "{expect:?} not in: {err}");
    }
}

/// A connect timeout of zero would time every peer out at once (some
/// without a word, where a listener drops a peer that times out): the
/// config is refused.
#[test]
fn a_zero_connect_timeout_is_refused() {
    let config = StreamConfig {
        connect_timeout: Duration::ZERO,
        ..small()
    };
    let err = RdmaStream::soft_pair(&SoftDevice::new(), config).unwrap_err();
    assert!(err.to_string().contains("connect_timeout"), "{err}");
}

/// A keep-alive of zero would send probe after probe: refused.
#[test]
fn a_zero_keepalive_is_refused() {
    let config = StreamConfig {
        keepalive: Duration::ZERO,
        ..small()
    };
    let err = RdmaStream::soft_pair(&SoftDevice::new(), config).unwrap_err();
    assert!(err.to_string().contains("keepalive"), "{err}");
}

#[test]
fn a_silent_peer_fails_the_connect_with_a_timeout() {
    let dev = SoftDevice::new();
    let (stream, peer) = stream_and_raw_peer(&dev);
    let config_timeout = small().connect_timeout;
    let started = Instant::now();
    // The raw peer never says hello: establish gives up at the timeout,
    // and does not linger on top of it.
    let err = stream.establish().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::TimedOut, "{err}");
    let took = started.elapsed();
    assert!(
        took >= config_timeout && took < config_timeout + Duration::from_secs(1),
        "took {took:?}"
    );
    drop(peer);
}

#[test]
fn futures_io_copy_moves_16_mib_intact() {
    use futures::io::{AsyncReadExt, AsyncWriteExt};
    let dev = SoftDevice::new();
    let (a, b) = RdmaStream::soft_pair(&dev, StreamConfig::default()).unwrap();
    let mut a = a.into_async(Wakeup::Thread).unwrap();
    let mut b = b.into_async(Wakeup::Thread).unwrap();
    let data = pattern(16 << 20, 9);
    let expected = checksum(&data);
    let writer = async {
        let mut source = futures::io::Cursor::new(&data);
        let n = futures::io::copy(&mut source, &mut a).await.unwrap();
        a.close().await.unwrap();
        n
    };
    let reader = async {
        let mut got = Vec::with_capacity(16 << 20);
        b.read_to_end(&mut got).await.unwrap();
        got
    };
    let (n, got) = futures::executor::block_on(futures::future::join(writer, reader));
    assert_eq!(n, 16 << 20);
    assert_eq!(got.len(), 16 << 20);
    assert_eq!(checksum(&got), expected);
}

fn checksum(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

#[cfg(feature = "tokio")]
#[test]
fn tokio_copy_moves_16_mib_intact_and_split_halves_echo() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let dev = SoftDevice::new();
        let (a, b) = RdmaStream::soft_pair(&dev, StreamConfig::default()).unwrap();
        let mut a = a.into_async(Wakeup::Thread).unwrap();
        let b = b.into_async(Wakeup::Thread).unwrap();
        let data = pattern(16 << 20, 4);
        let expected = checksum(&data);
        // B echoes everything back through its split halves, reading and
        // writing from two tasks.
        let echo = tokio::spawn(async move {
            let (mut r, mut w) = tokio::io::split(b);
            let n = tokio::io::copy(&mut r, &mut w).await.unwrap();
            w.shutdown().await.unwrap();
            n
        });
        let (mut ra, mut wa) = tokio::io::split(&mut a);
        let send = async {
            let mut source = &data[..];
            let n = tokio::io::copy(&mut source, &mut wa).await.unwrap();
            wa.shutdown().await.unwrap();
            n
        };
        let receive = async {
            let mut got = Vec::with_capacity(16 << 20);
            ra.read_to_end(&mut got).await.unwrap();
            got
        };
        let (n, got) = tokio::join!(send, receive);
        assert_eq!(n, 16 << 20);
        assert_eq!(echo.await.unwrap(), 16 << 20);
        assert_eq!(got.len(), 16 << 20);
        assert_eq!(checksum(&got), expected);
    });
}

/// A soft completion queue without a completion channel, as some
/// backends' queues are.
struct NoChannelCq(rdma_ring::backend::soft::SoftCq);

// SAFETY: reports the soft queue's completions as they are.
unsafe impl rdma_ring::backend::CompletionQueue for NoChannelCq {
    fn id(&self) -> rdma_ring::backend::CqId {
        self.0.id()
    }
    fn entries(&self) -> u32 {
        self.0.entries()
    }
    fn poll(
        &mut self,
        out: &mut [rdma_ring::backend::RawCompletion],
    ) -> Result<usize, rdma_ring::Error> {
        self.0.poll(out)
    }
}

/// A soft queue pair whose completion queue has no channel.
struct NoChannelQp(SoftQp);

// SAFETY: everything is the soft queue pair's.
unsafe impl rdma_ring::backend::QueuePair for NoChannelQp {
    type Cq = NoChannelCq;
    type Srq = rdma_ring::backend::soft::SoftSrq;
    fn caps(&self) -> rdma_ring::backend::QpCaps {
        self.0.caps()
    }
    unsafe fn post_send(
        &mut self,
        wrs: &[rdma_ring::backend::SendWr],
        sges: &[rdma_ring::backend::Sge],
    ) -> Result<(), rdma_ring::backend::PostError> {
        // SAFETY: passed through.
        unsafe { self.0.post_send(wrs, sges) }
    }
    unsafe fn post_recv(
        &mut self,
        wrs: &[rdma_ring::backend::RecvWr],
        sges: &[rdma_ring::backend::Sge],
    ) -> Result<(), rdma_ring::backend::PostError> {
        // SAFETY: passed through.
        unsafe { self.0.post_recv(wrs, sges) }
    }
    fn set_error(&mut self) -> Result<(), rdma_ring::Error> {
        self.0.set_error()
    }
    fn take_cq(&mut self) -> Option<NoChannelCq> {
        self.0.take_cq().map(NoChannelCq)
    }
    fn peer_disconnected(&mut self) -> Result<bool, rdma_ring::Error> {
        self.0.peer_disconnected()
    }
}

/// A stream refused as an async one (its completion queue has no channel
/// for the wake-up asked for) is not torn down: it closes as a dropped
/// stream does, delivering what was written and then the end of stream.
#[test]
fn a_stream_refused_as_async_still_delivers_what_was_written() {
    let dev = SoftDevice::new();
    let (pd_a, pd_b) = (dev.alloc_pd(), dev.alloc_pd());
    let qa = NoChannelQp(dev.create_qp(&pd_a, small().qp_config()).unwrap());
    let qb = dev.create_qp(&pd_b, small().qp_config()).unwrap();
    dev.connect(&qa.0, &qb).unwrap();
    let a = RdmaStream::prepare(qa, &pd_a, small()).unwrap();
    let b = RdmaStream::prepare(qb, &pd_b, small()).unwrap();
    let b = std::thread::spawn(move || b.establish().unwrap());
    let mut a = a.establish().unwrap();
    let mut b = b.join().unwrap();

    // More than the reader has room for: some of it waits in the
    // writer's send buffers.
    a.set_nonblocking(true);
    let data = pattern(64 * 64, 5);
    let mut written = 0;
    while let Ok(n) = a.write(&data[written..]) {
        written += n;
    }
    assert!(written > 64 * small().recv_buffers as usize);
    let reader = std::thread::spawn(move || {
        b.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut got = Vec::new();
        b.read_to_end(&mut got).map(|_| got)
    });
    let Err(refused) = a.into_async(Wakeup::Thread) else {
        panic!("a queue without a channel gave a woken stream");
    };
    assert!(
        refused.to_string().contains("completion channel"),
        "{refused}"
    );
    let got = reader.join().unwrap().expect("an orderly end of stream");
    assert!(got == data[..written], "{} of {written} bytes", got.len());
}

/// An async stream whose completion queue fails (it overruns here) fails
/// its reads with an error, as
/// a blocking stream does, rather than waiting for ever for completions
/// that cannot come.
#[test]
fn an_async_stream_on_a_failed_completion_queue_fails_its_reads() {
    use futures::io::AsyncReadExt;
    let dev = SoftDevice::new();
    let (a, _b, ca, _) = pair_with_controls(&dev, small());
    let mut a = a.into_async(Wakeup::Busy).unwrap();
    ca.overrun_cq();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = [0u8; 16];
        let read = futures::executor::block_on(a.read(&mut buf));
        let _ = tx.send(read.map_err(|e| (e.kind(), e.to_string())));
    });
    let read = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("the read waited on a failed completion queue");
    let (kind, why) = read.expect_err("nothing was sent to read");
    assert_eq!(kind, ErrorKind::ConnectionReset, "{why}");
    assert!(why.contains("overrun"), "{why}");
}

/// A failure one task finds wakes the other: with a reactor to wake
/// them (nothing here), a reader waiting on a completion queue that then
/// fails under a writer's poll would otherwise wait for ever, as a failed
/// queue gives no completion.
#[test]
fn a_failure_found_by_the_writing_task_wakes_the_reading_one() {
    use futures::io::{AsyncReadExt, AsyncWriteExt};
    use futures::task::LocalSpawnExt;
    let dev = SoftDevice::new();
    // The peer's drop lingers for its end of stream, which cannot arrive.
    let config = StreamConfig {
        linger: Duration::from_millis(100),
        ..small()
    };
    let (a, _b, ca, _) = pair_with_controls(&dev, config);
    let a = a.into_async(Wakeup::Reactor).unwrap();
    let (mut reader, mut writer) = a.split();
    let mut pool = futures::executor::LocalPool::new();
    let read = std::rc::Rc::new(std::cell::RefCell::new(None));
    let into = std::rc::Rc::clone(&read);
    pool.spawner()
        .spawn_local(async move {
            let mut buf = [0u8; 16];
            *into.borrow_mut() = Some(reader.read(&mut buf).await);
        })
        .unwrap();
    pool.run_until_stalled();
    assert!(read.borrow().is_none(), "nothing was sent to read");
    // The stream's completion queue overruns.
    ca.overrun_cq();
    // The writer finds the failure.
    let write = pool.run_until(async { writer.write_all(b"x").await });
    assert!(write.is_err(), "{write:?}");
    pool.run_until_stalled();
    let read = read.borrow_mut().take().expect("the reader was woken");
    let err = read.expect_err("the queue failed");
    assert_eq!(err.kind(), ErrorKind::ConnectionReset, "{err}");
}

/// An async close is ready once the end of stream has left, and says so
/// only if it arrived: when the link dies under it and the end of stream's
/// send fails, so does the close.
#[test]
fn an_async_close_whose_last_sends_fail_fails() {
    use futures::io::AsyncWriteExt;
    let dev = SoftDevice::new();
    let (a, b, ca, _cb) = pair_with_controls(&dev, small());
    let mut a = a.into_async(Wakeup::Busy).unwrap();
    // The bytes go; the end of stream after them is lost, as if the link
    // died while it was on the wire.
    ca.fail_nth(2, WcStatus::RetryExcErr);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let closed = futures::executor::block_on(async {
            a.write_all(b"last words").await?;
            a.close().await
        });
        let _ = tx.send(closed.map_err(|e| (e.kind(), e.to_string())));
    });
    let closed = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("the close waited for ever");
    let (kind, why) = closed.expect_err("the bytes and the end of stream were lost");
    assert_eq!(kind, ErrorKind::ConnectionReset, "{why}");
    drop(b);
}
