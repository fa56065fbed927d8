//! The byte stream on a real verbs device — Soft-RoCE's `rxe0` (TCP
//! handshake) and `rxe1` (rdma_cm, at 10.99.0.1) in the VM that
//! `scripts/test` boots, or the device named by `RDMA_RING_DEVICE`. These
//! tests need a device, so they are ignored in a plain `cargo test`;
//! `scripts/test` runs them in the VM with `--include-ignored`, where a
//! missing device fails them loudly.
#![cfg(feature = "verbs")]

mod rxe;

use rxe::{device, free_port};

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr};
use std::time::{Duration, Instant};

use rdma_ring::future::Wakeup;
use rdma_ring::stream::{RdmaCmListener, RdmaListener, RdmaStream, StreamConfig};

/// Set in the child process of the peer-death test: the address its
/// listener binds.
const CHILD_ENV: &str = "RDMA_RING_STREAM_CHILD";

/// RNR NAKs the device's requesters received so far.
fn rnr_naks() -> u64 {
    rxe::rnr_naks(&rxe::device_name())
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(29) ^ 0x5a)
        .collect()
}

#[test]
#[ignore = "needs an RDMA device (runs in the Soft-RoCE VM)"]
fn sixteen_mib_over_the_tcp_handshake_arrive_intact_with_tokio_copy() {
    let dev = device();
    let listener = RdmaListener::bind_with("127.0.0.1:0", &dev, StreamConfig::default()).unwrap();
    let addr = listener.local_addr().unwrap();
    let server = std::thread::spawn(move || listener.accept().unwrap());
    let client = RdmaStream::connect_with(addr, &dev, StreamConfig::default()).unwrap();
    let server = server.join().unwrap();
    assert_eq!(client.peer_addr().unwrap(), addr);
    assert_eq!(server.local_addr().unwrap(), addr);

    let data = pattern(16 << 20);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let got = rt.block_on(async {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut a = client.into_async(Wakeup::Thread).unwrap();
        let mut b = server.into_async(Wakeup::Thread).unwrap();
        let send = async {
            let mut source = &data[..];
            tokio::io::copy(&mut source, &mut a).await.unwrap();
            a.shutdown().await.unwrap();
        };
        let receive = async {
            let mut got = Vec::with_capacity(16 << 20);
            b.read_to_end(&mut got).await.unwrap();
            got
        };
        tokio::join!(send, receive).1
    });
    assert_eq!(got.len(), data.len());
    assert!(got == data, "the bytes differ");
}

/// A peer that connects over TCP and says nothing holds up no peer
/// behind it: handshakes run side by side, and the listener hands out
/// the one that finishes first, then the silent one's timeout.
#[test]
#[ignore = "needs an RDMA device (runs in the Soft-RoCE VM)"]
fn a_silent_peer_does_not_hold_up_the_listener() {
    let dev = device();
    let config = StreamConfig {
        connect_timeout: Duration::from_secs(5),
        ..StreamConfig::default()
    };
    let listener = RdmaListener::bind_with("127.0.0.1:0", &dev, config).unwrap();
    let addr = listener.local_addr().unwrap();
    let silent = std::net::TcpStream::connect(addr).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let client = std::thread::spawn(move || {
        let mut s = RdmaStream::connect_with(addr, &device(), config).unwrap();
        s.write_all(b"after the silent one").unwrap();
        s.flush().unwrap();
        s
    });
    let started = Instant::now();
    let mut server = listener.accept().expect("the speaking peer's stream");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
    let mut got = [0u8; 20];
    server.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"after the silent one");
    let err = listener.accept().expect_err("the silent peer's handshake");
    assert_eq!(err.kind(), ErrorKind::TimedOut, "{err}");
    drop((silent, client.join().unwrap()));
}

/// The connect timeout bounds a handshake as a whole: a peer that takes
/// most of it over each step times out, not one timeout per step.
#[test]
#[ignore = "needs an RDMA device (runs in the Soft-RoCE VM)"]
fn a_peer_pacing_its_handshake_steps_times_out_once() {
    let dev = device();
    let config = StreamConfig {
        connect_timeout: Duration::from_secs(2),
        ..StreamConfig::default()
    };
    let listener = RdmaListener::bind_with("127.0.0.1:0", &dev, config).unwrap();
    let peer = rxe::pacing_peer(
        listener.local_addr().unwrap(),
        (Duration::from_millis(400), Duration::from_millis(1700)),
        None,
    );
    let err = listener.accept().expect_err("the pacing peer's handshake");
    assert_eq!(err.kind(), ErrorKind::TimedOut, "{err}");
    assert!(err.to_string().contains("ready"), "{err}");
    peer.join().unwrap();
}

#[test]
#[ignore = "needs an RDMA device (runs in the Soft-RoCE VM)"]
fn a_slow_reader_holds_a_blocking_writer_back_without_rnr() {
    let dev = device();
    let config = StreamConfig {
        chunk_size: 4096,
        recv_buffers: 4,
        answer_buffers: 2,
        send_buffers: 2,
        ..StreamConfig::default()
    };
    let listener = RdmaListener::bind_with("127.0.0.1:0", &dev, config).unwrap();
    let addr = listener.local_addr().unwrap();
    let server = std::thread::spawn(move || listener.accept().unwrap());
    let mut writer = RdmaStream::connect_with(addr, &dev, config).unwrap();
    let mut reader = server.join().unwrap();
    let rnr_before = rnr_naks();
    let data = pattern(1 << 20);
    let sent = data.clone();
    let writing = std::thread::spawn(move || {
        writer.write_all(&sent).unwrap();
        writer.shutdown(Shutdown::Write).unwrap();
        writer
    });
    // The reader sleeps now and then; the writer must wait, not fail.
    let mut got = Vec::new();
    let mut buf = [0u8; 1000];
    loop {
        let n = reader.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
        if got.len() % 100_000 < 1000 {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let writer = writing.join().unwrap();
    assert!(got == data, "bytes lost or reordered");
    assert_eq!(rnr_naks(), rnr_before, "a message met no receive (RNR NAK)");
    drop((writer, reader));
}

#[test]
#[ignore = "needs an RDMA device (runs in the Soft-RoCE VM)"]
fn rdma_cm_streams_echo_on_rxe1() {
    let addr: SocketAddr = format!("10.99.0.1:{}", free_port()).parse().unwrap();
    let listener = RdmaCmListener::bind(addr, StreamConfig::default()).unwrap();
    let server = std::thread::spawn(move || {
        let mut stream = listener.accept_timeout(Duration::from_secs(20)).unwrap();
        let mut all = Vec::new();
        stream.read_to_end(&mut all).unwrap();
        stream.write_all(&all).unwrap();
        stream.shutdown(Shutdown::Write).unwrap();
        all.len()
    });
    let mut client = RdmaStream::connect_cm(addr, StreamConfig::default()).unwrap();
    let data = pattern(3 << 20);
    client.write_all(&data).unwrap();
    client.shutdown(Shutdown::Write).unwrap();
    let mut echo = Vec::new();
    client.read_to_end(&mut echo).unwrap();
    assert_eq!(server.join().unwrap(), data.len());
    assert!(echo == data, "the echo differs");
}

/// A peer that connects over rdma_cm and never says its stream hello
/// holds up no peer behind it: the listener hands out the stream that
/// finishes first, then the silent one's failure.
#[test]
#[ignore = "needs an RDMA device (runs in the Soft-RoCE VM)"]
fn a_silent_rdma_cm_peer_does_not_hold_up_the_listener() {
    use rdma_ring::backend::verbs::VerbsDevice;
    use rdma_ring::backend::QpConfig;
    use rdma_ring::buf::RegisteredBuf;
    use rdma_ring::connect::cm;
    use rdma_ring::op::Recv;
    use rdma_ring::ring::{Ring, RingConfig};

    let addr: SocketAddr = format!("10.99.0.1:{}", free_port()).parse().unwrap();
    let config = StreamConfig {
        connect_timeout: Duration::from_secs(4),
        ..StreamConfig::default()
    };
    let listener = RdmaCmListener::bind(addr, config).unwrap();
    let (done, hang_up) = std::sync::mpsc::channel::<()>();
    let silent = std::thread::spawn(move || {
        let timeout = Duration::from_secs(20);
        let route = cm::resolve(addr, timeout).unwrap();
        let dev = VerbsDevice::open(&route.device_name().unwrap()).unwrap();
        let pd = dev.alloc_pd().unwrap();
        let qp = route.create_qp(&dev, &pd, QpConfig::default()).unwrap();
        let mut ring = Ring::new(qp, RingConfig::default());
        // Receives for what the listener sends, so that nothing fails for
        // want of them: the silent peer fails by silence alone.
        for _ in 0..8 {
            let buf = RegisteredBuf::new(&pd, vec![0u8; 65536]).unwrap();
            ring.submission().push(Recv::new(buf)).unwrap();
        }
        ring.submit().unwrap();
        ring.qp().connect(b"", timeout).unwrap();
        let _ = hang_up.recv();
        ring
    });
    std::thread::sleep(Duration::from_millis(300));
    let client = std::thread::spawn(move || {
        let mut s = RdmaStream::connect_cm(addr, config).unwrap();
        s.write_all(b"after the silent one").unwrap();
        s.flush().unwrap();
        s
    });
    let mut server = listener
        .accept_timeout(Duration::from_secs(20))
        .expect("the speaking peer's stream");
    let mut got = [0u8; 20];
    server.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"after the silent one");
    let err = listener
        .accept_timeout(Duration::from_secs(20))
        .expect_err("the silent peer's handshake");
    assert_eq!(err.kind(), ErrorKind::TimedOut, "{err}");
    done.send(()).unwrap();
    drop((silent.join().unwrap(), client.join().unwrap()));
}

/// The peer process is killed (no end of stream, no teardown): a reader
/// gets `ConnectionReset` in bounded time, from the keep-alive probe.
#[test]
#[ignore = "needs an RDMA device (runs in the Soft-RoCE VM)"]
fn a_killed_peer_process_resets_the_connection() {
    if let Ok(addr) = std::env::var(CHILD_ENV) {
        // The child: accept one stream, say hello, then hang until killed.
        let listener = RdmaListener::bind_with(addr, &device(), StreamConfig::default()).unwrap();
        let mut stream = listener.accept().unwrap();
        stream.write_all(b"ready").unwrap();
        stream.flush().unwrap();
        loop {
            std::thread::sleep(Duration::from_secs(60));
        }
    }
    let addr = format!("127.0.0.1:{}", free_port());
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "a_killed_peer_process_resets_the_connection",
            "--include-ignored",
            "--exact",
            "--nocapture",
        ])
        .env(CHILD_ENV, &addr)
        .spawn()
        .unwrap();
    let config = StreamConfig {
        keepalive: Duration::from_millis(200),
        ..StreamConfig::default()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut stream = loop {
        match RdmaStream::connect_with(addr.as_str(), &device(), config) {
            Ok(stream) => break stream,
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => panic!("the child never listened: {e}"),
        }
    };
    let mut ready = [0u8; 5];
    stream.read_exact(&mut ready).unwrap();
    assert_eq!(&ready, b"ready");
    child.kill().unwrap();
    child.wait().unwrap();
    let started = Instant::now();
    let err = stream.read(&mut [0u8; 8]).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ConnectionReset, "{err}");
    let took = started.elapsed();
    println!("the dead peer was noticed after {took:?}: {err}");
    assert!(took < Duration::from_secs(30), "took {took:?}");
}
