//! An rdma_cm connection whose device goes away. The ring learns of it
//! from rdma_cm's DEVICE_REMOVAL event and moves the queue pair to error,
//! so new work is refused at once. Closing the ring does not hang on the
//! vanished device: what the device may still hold comes back flushed or is
//! leaked, never freed.
//!
//! The removal itself completes only once the process exits (librdmacm
//! keeps a context of every device it has used open until then), so this
//! test starts it and leaves it; `scripts/lib/vm-suite.sh` runs the test
//! alone, last, in the Soft-RoCE VM, then checks that the removal completed
//! and adds `rxe1` back. Plain `cargo test` lists it as ignored.
#![cfg(feature = "verbs")]

use std::process::Command;
use std::time::{Duration, Instant};

use rdma_ring::backend::verbs::VerbsDevice;
use rdma_ring::backend::QpConfig;
use rdma_ring::buf::RegisteredBuf;
use rdma_ring::connect::cm;
use rdma_ring::op::Recv;
use rdma_ring::ring::{Ring, RingConfig};
use rdma_ring::Error;

#[test]
#[ignore = "deletes rxe1: scripts/test runs it alone, last, in the Soft-RoCE VM"]
fn a_removed_device_fails_the_connection_instead_of_hanging() {
    let dev = VerbsDevice::open("rxe1").unwrap_or_else(|e| panic!("NO RDMA DEVICE rxe1: {e}"));
    let pd = dev.alloc_pd().unwrap();
    let addr: std::net::SocketAddr = "10.99.0.1:7474".parse().unwrap();
    let timeout = Duration::from_secs(20);
    let listener = cm::CmListener::bind(addr).unwrap();
    // An RPC server listening on the same device stops accepting, and
    // says so.
    let rpc = rdma_ring::rpc::RpcServer::bind_cm(
        "10.99.0.1:7475".parse().unwrap(),
        rdma_ring::rpc::Service::handler(
            |_: &rdma_ring::rpc::Caller, _: &[u8], _: &mut Vec<u8>| Ok(()),
        ),
        rdma_ring::rpc::RpcConfig::default(),
    )
    .unwrap();
    assert!(rpc.accepting());
    // So do a session listener and a stream listener: each tells its end
    // from a peer's failure.
    let sessions = rdma_ring::session::SessionBuilder::default()
        .bind_cm("10.99.0.1:7476".parse().unwrap())
        .unwrap();
    let streams = rdma_ring::stream::RdmaCmListener::bind(
        "10.99.0.1:7479".parse().unwrap(),
        rdma_ring::stream::StreamConfig::default(),
    )
    .unwrap();
    assert!(!sessions.ended() && !streams.ended());
    let (server_dev, server_pd) = (dev.clone(), pd.clone());
    let server = std::thread::spawn(move || {
        listener
            .accept(&server_dev, &server_pd, QpConfig::default(), b"", timeout)
            .map(|qp| (qp, listener))
    });
    std::thread::sleep(Duration::from_millis(200));
    let qp = cm::connect(&dev, &pd, addr, QpConfig::default(), b"", timeout).unwrap();
    let (server_qp, listener) = server.join().unwrap().unwrap();
    let mut ring = Ring::new(
        qp,
        RingConfig {
            drain_timeout: Duration::from_secs(2),
            ..RingConfig::default()
        },
    );
    ring.submission()
        .push(Recv::new(RegisteredBuf::new(&pd, vec![0u8; 64]).unwrap()).user_data(9))
        .unwrap();
    ring.submit().unwrap();

    // The removal waits for every user of the device to let go, so it runs
    // in the background and outlives this process (the VM suite checks
    // that it finishes): it is never waited for here.
    #[allow(clippy::zombie_processes)]
    let _removal = Command::new("rdma")
        .args(["link", "delete", "rxe1"])
        .spawn()
        .expect("running rdma");
    let deadline = Instant::now() + timeout;
    while ring.error_status().is_none() {
        let _ = ring.completion().reap(&mut Vec::new());
        assert!(
            Instant::now() < deadline,
            "the ring never learned of the removal"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let refused = ring
        .submission()
        .push(Recv::new(RegisteredBuf::new(&pd, vec![0u8; 8]).unwrap()))
        .unwrap_err();
    assert!(
        matches!(refused.error(), Error::QpInError(_)),
        "{}",
        refused.error()
    );
    drop(refused);

    // The listener heard the removal too, and hears nothing more: a
    // request fails, then every later one at once (not after waiting out
    // its timeout for a request that cannot come).
    let first = listener.request(Duration::from_secs(10));
    assert!(first.is_err(), "a request on a removed device");
    assert!(listener.removed(), "{:?}", first.err());
    let started = Instant::now();
    let again = listener
        .request(Duration::from_secs(10))
        .expect_err("a request on a removed device");
    assert!(matches!(again, Error::Verbs { .. }), "{again}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "waited {:?} for {again}",
        started.elapsed()
    );

    let deadline = Instant::now() + Duration::from_secs(10);
    while rpc.accepting() {
        assert!(
            Instant::now() < deadline,
            "the RPC server still accepts on a removed device"
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    // Bounded: a listener that missed the removal fails here, not hangs.
    let (told, ended) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let accepted = sessions.accept().map(|_| ());
        let _ = told.send((accepted, sessions.ended()));
    });
    let (accepted, session_listener_ended) = ended
        .recv_timeout(Duration::from_secs(10))
        .expect("the session listener still accepts on a removed device");
    let err = accepted.expect_err("a session on a removed device");
    assert!(session_listener_ended, "{err}");
    // The listener's fault, not a peer's: a caller that accepts again on
    // a peer's failure must not spin on it.
    assert!(!err.is_peer_failure(), "{err}");
    let err = streams
        .accept_timeout(Duration::from_secs(10))
        .expect_err("a stream on a removed device");
    assert_ne!(err.kind(), std::io::ErrorKind::TimedOut, "{err}");
    assert!(streams.ended(), "{err}");

    let leaked = rdma_ring::leak::leaked().buffers;
    let started = Instant::now();
    let back = ring.close();
    assert!(started.elapsed() < Duration::from_secs(10), "close hung");
    // The receive either came back flushed or, the device being gone
    // before it could flush, was leaked; never both, never neither.
    let flushed = back.iter().filter(|c| c.user_data() == 9).count();
    let kept = (rdma_ring::leak::leaked().buffers - leaked) as usize;
    assert_eq!(flushed + kept, 1, "flushed {flushed}, leaked {kept}");
    drop((back, server_qp, listener, pd, dev));
}
