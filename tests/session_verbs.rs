//! Sessions on a real verbs device — Soft-RoCE's `rxe0` (TCP handshake)
//! and `rxe1` (rdma_cm, at 10.99.0.1) in the VM that `scripts/test`
//! boots, or the device named by `RDMA_RING_DEVICE`. These tests need a
//! device, so they are ignored in a plain `cargo test`; `scripts/test`
//! runs them in the VM with `--include-ignored`, where a missing device
//! fails them loudly.
#![cfg(feature = "verbs")]

mod rxe;

use rxe::{device, device_name, free_port};

use std::alloc::Layout;
use std::time::Duration;

use rdma_ring::backend::QueuePair;
use rdma_ring::buf::{BaseBuf, RemoteAccess};
use rdma_ring::session::{Session, SessionBuilder, SessionError, SessionHost};

/// Set in a child process: the address it connects to.
const CHILD_ENV: &str = "RDMA_RING_SESSION_CHILD";
/// The rdma_cm address of rxe1 in the VM.
const CM_ADDR: &str = "10.99.0.1";

fn layout(n: usize) -> Layout {
    Layout::from_size_align(n, 8).unwrap()
}

/// The client's part: a message, a requested region written and handed
/// back, a lent region read by the server, a WRITE with immediate.
async fn client_steps<Q: QueuePair + Send + 'static>(s: &Session<Q>, seed: u8) {
    let mut msg = s.alloc_local_mr(layout(16)).unwrap();
    msg.fill(seed);
    s.send(msg.slice(..)).await.0.unwrap();

    let remote = s.request_remote_mr(layout(64 << 10)).await.unwrap();
    let mut local = s.alloc_local_mr(layout(64 << 10)).unwrap();
    local.fill(seed.wrapping_add(1));
    let (written, local) = s.write(local, remote.remote()).await;
    assert_eq!(written.unwrap(), 64 << 10);
    let (written, _) = s
        .write_with_imm(
            local.slice(..8),
            remote.slice(0..8).unwrap(),
            u32::from(seed),
        )
        .await;
    written.unwrap();
    s.send_remote_mr(remote).unwrap();

    let mut lent = s.alloc_local_mr(layout(4096)).unwrap();
    lent.fill(seed.wrapping_add(2));
    s.send_local_mr(lent, RemoteAccess::READ)
        .map_err(|(e, _)| e)
        .unwrap();
    let back = s.receive_local_mr().await.unwrap();
    assert!(back.iter().all(|&b| b == seed.wrapping_add(2)));
}

async fn server_steps<Q: QueuePair + Send + 'static>(s: &Session<Q>) {
    let msg = s.receive().await.unwrap();
    let seed = msg[0];
    assert!(msg.iter().all(|&b| b == seed));
    assert_eq!(s.receive_write_imm().await.unwrap(), u32::from(seed));
    let region = s.receive_local_mr().await.unwrap();
    assert_eq!(region.len(), 64 << 10);
    assert!(region.iter().all(|&b| b == seed.wrapping_add(1)));

    let remote = s.receive_remote_mr().await.unwrap();
    let into = s.alloc_local_mr_zeroed(layout(4096)).unwrap();
    let (read, into) = s.read(into, remote.remote()).await;
    assert_eq!(read.unwrap(), 4096);
    assert!(into.iter().all(|&b| b == seed.wrapping_add(2)));
    s.send_remote_mr(remote).unwrap();
}

#[test]
#[ignore = "needs an RDMA device (runs in the Soft-RoCE VM)"]
fn many_peers_share_one_host_over_the_tcp_handshake() {
    let name = device_name();
    drop(device()); // fails loudly without one
    let port = free_port();
    // More sessions than the device's completion queue holds the queues
    // of: the host takes the largest queue the device makes, and admits
    // as many sessions as fit it.
    let listener = SessionBuilder::default()
        .device(&name)
        .max_sessions(4096)
        .bind(("127.0.0.1", port))
        .unwrap();
    let most = listener.host().max_sessions();
    assert!((3..4096).contains(&most), "{most}");
    let clients: Vec<_> = (0..3u8)
        .map(|i| {
            let name = name.clone();
            std::thread::spawn(move || {
                let session = SessionBuilder::default()
                    .device(&name)
                    .connect(("127.0.0.1", port))
                    .unwrap();
                futures::executor::block_on(client_steps(&session, 10 * (i + 1)));
            })
        })
        .collect();
    let sessions: Vec<_> = (0..3).map(|_| listener.accept().unwrap()).collect();
    assert_eq!(
        listener.host().sessions(),
        3,
        "one host, one CQ, one allocator"
    );
    futures::executor::block_on(futures::future::join_all(sessions.iter().map(server_steps)));
    for c in clients {
        c.join().unwrap();
    }
}

/// `listen` waits for one session: connections that fail their handshake
/// first (a port probe that connects and closes, another that sends a
/// line of text) are dropped, not returned as the listen's error.
#[test]
#[ignore = "needs an RDMA device (runs in the Soft-RoCE VM)"]
fn listen_outlasts_a_port_probe() {
    let name = device_name();
    drop(device()); // fails loudly without one
    let port = free_port();
    let server = {
        let name = name.clone();
        std::thread::spawn(move || {
            SessionBuilder::default()
                .device(&name)
                .listen(("127.0.0.1", port))
        })
    };
    // The probe, once the port listens: connect, say nothing, close.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let probe = loop {
        match std::net::TcpStream::connect(("127.0.0.1", port)) {
            Ok(probe) => break probe,
            Err(e) => assert!(std::time::Instant::now() < deadline, "never listened: {e}"),
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    drop(probe);
    std::thread::sleep(Duration::from_millis(200));
    let mut talker = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    std::io::Write::write_all(&mut talker, b"GET / HTTP/1.1\r\nHost: rdma-ring\r\n\r\n").unwrap();
    std::thread::sleep(Duration::from_millis(200));
    drop(talker);
    let client = SessionBuilder::default()
        .device(&name)
        .connect(("127.0.0.1", port))
        .expect("the session after the probe");
    let server = server
        .join()
        .unwrap()
        .expect("listen returns the session, not the probe's failure");
    assert!(server.failure().is_none() && client.failure().is_none());
}

/// A session listener on the loopback interface of the test device, with
/// `connect_timeout`; its port and config.
fn loopback_listener(
    connect_timeout: Duration,
) -> (
    rdma_ring::session::SessionListener<rdma_ring::backend::verbs::VerbsQp>,
    u16,
    rdma_ring::session::SessionConfig,
) {
    let port = free_port();
    let config = rdma_ring::session::SessionConfig {
        connect_timeout,
        ..Default::default()
    };
    let listener = SessionBuilder::default()
        .device(&device_name())
        .config(config)
        .bind(("127.0.0.1", port))
        .unwrap();
    (listener, port, config)
}

/// A peer that connects over TCP and says nothing holds up no peer
/// behind it: the listener hands out the session that finishes its
/// handshake first, then the silent one's error. Nor does it hold the
/// host's room: a host of one session takes the speaking peer.
#[test]
#[ignore = "needs an RDMA device (runs in the Soft-RoCE VM)"]
fn a_silent_peer_does_not_hold_up_the_listener() {
    let name = device_name();
    drop(device()); // fails loudly without one
    let port = free_port();
    let listener = SessionBuilder::default()
        .device(&name)
        .max_sessions(1)
        .timeouts(Duration::from_secs(5), Duration::from_secs(10))
        .bind(("127.0.0.1", port))
        .unwrap();
    let silent = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let client = std::thread::spawn(move || {
        SessionBuilder::default()
            .device(&name)
            .connect(("127.0.0.1", port))
            .unwrap()
    });
    let started = std::time::Instant::now();
    let session = listener.accept().expect("the speaking peer's session");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
    assert!(session.failure().is_none());
    assert!(listener.accept().is_err(), "the silent peer's handshake");
    drop((silent, client.join().unwrap()));
}

/// The connect timeout bounds a handshake as a whole, the hellos
/// included: a peer that takes most of it over each step times out, not
/// one timeout per step.
#[test]
#[ignore = "needs an RDMA device (runs in the Soft-RoCE VM)"]
fn a_peer_pacing_its_handshake_steps_times_out_once() {
    let (listener, port, config) = loopback_listener(Duration::from_secs(2));
    let hello = rdma_ring::session::Hello {
        recv_depth: config.recv_depth,
        user_window: config.user_window,
        max_message: config.max_message,
    };
    let peer = rxe::pacing_peer(
        ([127, 0, 0, 1], port).into(),
        (Duration::from_millis(400), Duration::from_millis(1700)),
        Some(hello.encode().to_vec()),
    );
    let err = listener.accept().expect_err("the pacing peer's handshake");
    assert!(
        err.to_string().contains("waiting for the peer to be ready"),
        "{err}"
    );
    assert_eq!(
        std::io::Error::from(err).kind(),
        std::io::ErrorKind::TimedOut
    );
    peer.join().unwrap();
}

/// A peer that sends only part of its hello times out like any silent
/// peer: a timeout, naming the step, not a bare connect failure.
#[test]
#[ignore = "needs an RDMA device (runs in the Soft-RoCE VM)"]
fn a_peer_silent_in_the_hellos_times_out() {
    use std::io::{Read, Write};
    let (listener, port, _) = loopback_listener(Duration::from_secs(2));
    // It sends one byte of a hello, then waits.
    let peer = std::thread::spawn(move || {
        let mut socket = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        socket.write_all(b"S").unwrap();
        let mut theirs = [0u8; 1];
        // Until the listener gives up: it never answers a partial hello.
        assert_eq!(socket.read(&mut theirs).unwrap_or(0), 0);
    });
    let err = listener.accept().expect_err("the silent peer's handshake");
    assert!(
        matches!(
            &err,
            SessionError::Device(rdma_ring::Error::HandshakeTimeout { step, reason })
                if step.contains("session hello") && reason.contains("1 of 12 bytes")
        ),
        "{err:?}"
    );
    assert_eq!(
        std::io::Error::from(err).kind(),
        std::io::ErrorKind::TimedOut
    );
    peer.join().unwrap();
}

/// A peer whose endpoint our device refuses to connect to (a RoCE GID of
/// zeros: no route header, which RoCE needs) failed its own handshake:
/// `listen` drops it and waits on for a peer that succeeds, as for any
/// peer that sends garbage, rather than failing as if our device had.
#[test]
#[ignore = "needs an RDMA device (runs in the Soft-RoCE VM)"]
fn listen_outlasts_a_peer_whose_endpoint_the_device_refuses() {
    use rdma_ring::connect::{Endpoint, ENDPOINT_WIRE_LEN};
    use std::io::{Read, Write};
    let name = device_name();
    drop(device()); // fails loudly without one
    let port = free_port();
    let listening = std::thread::spawn({
        let name = name.clone();
        move || {
            SessionBuilder::default()
                .device(&name)
                .listen(("127.0.0.1", port))
        }
    });
    let mut socket = loop {
        match std::net::TcpStream::connect(("127.0.0.1", port)) {
            Ok(socket) => break socket,
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    let config = rdma_ring::session::SessionConfig::default();
    let hello = rdma_ring::session::Hello {
        recv_depth: config.recv_depth,
        user_window: config.user_window,
        max_message: config.max_message,
    }
    .encode();
    socket.write_all(&hello).unwrap();
    let mut their_hello = vec![0u8; hello.len()];
    socket.read_exact(&mut their_hello).unwrap();
    let unroutable = Endpoint {
        qpn: 0x1234,
        psn: 1,
        lid: 0,
        gid: [0; 16],
        mtu: 3,
        rd_atomic: 1,
        init_rd_atomic: 1,
    };
    socket.write_all(&unroutable.encode()).unwrap();
    let mut theirs = [0u8; ENDPOINT_WIRE_LEN];
    socket.read_exact(&mut theirs).unwrap();
    // No ready byte: the listener gave this peer up.
    let mut ready = [0u8; 1];
    assert_eq!(socket.read(&mut ready).unwrap_or(0), 0);
    let client = SessionBuilder::default()
        .device(&name)
        .connect(("127.0.0.1", port))
        .expect("the next peer gets in");
    let session = listening
        .join()
        .unwrap()
        .expect("listen waited on for the peer that succeeded");
    assert!(session.failure().is_none() && client.failure().is_none());
}

/// One round against a listener whose host holds one session at most:
/// the first peer gets in; the second hears that the host is full, and
/// the listener's accept says so too; the first session goes on; once it
/// ends, a third peer gets in.
fn a_full_host_round<Q: QueuePair + Send + 'static>(
    host: &SessionHost<Q>,
    accept: impl Fn() -> Result<Session<Q>, SessionError>,
    connect: impl Fn() -> Result<Session<Q>, SessionError> + Clone + Send + 'static,
) {
    assert_eq!(host.max_sessions(), 1);
    let first = std::thread::spawn(connect.clone());
    let first_server = accept().unwrap();
    let first = first.join().unwrap().unwrap();
    let second = std::thread::spawn(connect.clone());
    let refused = accept().expect_err("the host is full");
    assert!(
        matches!(
            refused,
            SessionError::HostFull {
                most: 1,
                peer: false
            }
        ),
        "{refused:?}"
    );
    let err = second.join().unwrap().expect_err("the peer's host is full");
    assert!(
        matches!(
            err,
            SessionError::HostFull {
                most: 1,
                peer: true
            }
        ),
        "{err:?}"
    );
    assert!(err
        .to_string()
        .contains("the peer's host holds its most sessions, 1"));
    assert_eq!(
        std::io::Error::from(err).kind(),
        std::io::ErrorKind::ConnectionRefused
    );
    futures::executor::block_on(futures::future::join(
        client_steps(&first, 3),
        server_steps(&first_server),
    ));
    drop((first, first_server));
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while host.sessions() > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the session never left"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let third = std::thread::spawn(connect);
    let third_server = accept().unwrap();
    let third = third.join().unwrap().unwrap();
    futures::executor::block_on(futures::future::join(
        client_steps(&third, 4),
        server_steps(&third_server),
    ));
}

/// A host that holds its most sessions tells a peer so in place of its
/// hello (TCP handshake) and in its rejection (rdma_cm): the peer's error
/// says the host is full, not that the connection closed.
#[test]
#[ignore = "needs an RDMA device (runs in the Soft-RoCE VM)"]
fn a_full_host_says_so_over_tcp_and_rdma_cm() {
    let name = device_name();
    drop(device()); // fails loudly without one
    let port = free_port();
    let listener = SessionBuilder::default()
        .device(&name)
        .max_sessions(1)
        .bind(("127.0.0.1", port))
        .unwrap();
    let connect = {
        let name = name.clone();
        move || {
            SessionBuilder::default()
                .device(&name)
                .connect(("127.0.0.1", port))
        }
    };
    a_full_host_round(listener.host(), || listener.accept(), connect.clone());
    // A handshake that fails after it took the room (its peer greets,
    // then leaves) gives the room back.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while listener.host().sessions() > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the session never left"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let config = *listener.host().config();
    let leaving = std::thread::spawn(move || {
        use std::io::{Read, Write};
        let hello = rdma_ring::session::Hello {
            recv_depth: config.recv_depth,
            user_window: config.user_window,
            max_message: config.max_message,
        };
        let mut raw = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        raw.write_all(&hello.encode()).unwrap();
        let mut theirs = [0u8; rdma_ring::session::wire::HELLO_LEN];
        raw.read_exact(&mut theirs).unwrap();
        rdma_ring::session::Greeting::decode(&theirs)
    });
    // Handshakes move while the listener accepts.
    assert!(listener.accept().is_err(), "the peer left mid-handshake");
    assert!(matches!(
        leaving.join().unwrap(),
        Ok(rdma_ring::session::Greeting::Hello(_))
    ));
    let client = std::thread::spawn(connect);
    let server = listener.accept().expect("the room came back");
    let client = client.join().unwrap().unwrap();
    futures::executor::block_on(futures::future::join(
        client_steps(&client, 5),
        server_steps(&server),
    ));
    let addr: std::net::SocketAddr = format!("{CM_ADDR}:{}", free_port()).parse().unwrap();
    let listener = SessionBuilder::default()
        .max_sessions(1)
        .bind_cm(addr)
        .unwrap();
    a_full_host_round(
        listener.host(),
        || listener.accept(),
        move || SessionBuilder::default().connect_cm(addr),
    );
}

#[test]
#[ignore = "needs an RDMA device (runs in the Soft-RoCE VM)"]
fn a_session_over_rdma_cm() {
    let addr: std::net::SocketAddr = format!("{CM_ADDR}:{}", free_port()).parse().unwrap();
    let listener = SessionBuilder::default().bind_cm(addr).unwrap();
    let client = std::thread::spawn(move || {
        let session = SessionBuilder::default().connect_cm(addr).unwrap();
        futures::executor::block_on(client_steps(&session, 7));
    });
    let session = listener.accept().unwrap();
    futures::executor::block_on(server_steps(&session));
    client.join().unwrap();
}

/// A peer that asks to connect over rdma_cm and never confirms holds up
/// none of the host's sessions and no peer behind it: while its handshake
/// waits, a session of the same host goes on sending, writing and
/// reading, and a peer that comes later is accepted first; then its
/// handshake fails with a timeout.
#[test]
#[ignore = "needs an RDMA device (runs in the Soft-RoCE VM)"]
fn a_peer_that_never_confirms_holds_up_no_session_and_no_peer() {
    let addr: std::net::SocketAddrV4 = format!("{CM_ADDR}:{}", free_port()).parse().unwrap();
    let config = rdma_ring::session::SessionConfig {
        connect_timeout: Duration::from_secs(8),
        ..Default::default()
    };
    let listener = SessionBuilder::default()
        .config(config)
        .bind_cm(addr.into())
        .unwrap();
    let client = std::thread::spawn(move || {
        SessionBuilder::default()
            .config(config)
            .connect_cm(addr.into())
            .unwrap()
    });
    let server = listener.accept().unwrap();
    let client = client.join().unwrap();
    let hello = rdma_ring::session::Hello {
        recv_depth: config.recv_depth,
        user_window: config.user_window,
        max_message: config.max_message,
    };
    let (answered, hang_up, peer) = rxe::unconfirming_cm_peer(addr, hello.encode().to_vec());
    // The listener goes with its accepts (it is not Sync); the sessions
    // it made stay here.
    let accepts = std::thread::spawn(move || {
        let first = listener.accept();
        let second = listener.accept();
        (first, second)
    });
    answered
        .recv_timeout(Duration::from_secs(20))
        .expect("the listener answers the request");
    // A peer that asks after the silent one, and confirms.
    let later = std::thread::spawn(move || {
        SessionBuilder::default()
            .config(config)
            .connect_cm(addr.into())
            .unwrap()
    });
    // Meanwhile the host's other session does all its steps.
    futures::executor::block_on(futures::future::join(
        client_steps(&client, 9),
        server_steps(&server),
    ));
    let later_client = later.join().unwrap();
    let (first, second) = accepts.join().unwrap();
    // Handshakes one after the other would have handed out the silent
    // peer's timeout first.
    let later_server = first.expect("the later peer, accepted while the silent one waits");
    let err = second.expect_err("never confirmed");
    assert!(
        matches!(
            &err,
            SessionError::Device(rdma_ring::Error::HandshakeTimeout { step, .. })
                if step.contains("establishing")
        ),
        "{err:?}"
    );
    drop(hang_up);
    peer.join().unwrap();
    // The sessions are unharmed.
    futures::executor::block_on(futures::future::join(
        client_steps(&client, 10),
        server_steps(&server),
    ));
    futures::executor::block_on(futures::future::join(
        client_steps(&later_client, 11),
        server_steps(&later_server),
    ));
}

#[test]
#[ignore = "needs an RDMA device (runs in the Soft-RoCE VM)"]
fn a_killed_peer_fails_a_waiting_receive() {
    if let Ok(addr) = std::env::var(CHILD_ENV) {
        // The child: connect, then wait to be killed.
        let _session = SessionBuilder::default()
            .device(&device_name())
            .connect(addr.as_str())
            .unwrap();
        std::thread::sleep(Duration::from_secs(60));
        return;
    }
    let port = free_port();
    let listener = SessionBuilder::default()
        .device(&device_name())
        .bind(("127.0.0.1", port))
        .unwrap();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "a_killed_peer_fails_a_waiting_receive",
            "--include-ignored",
            "--exact",
            "--nocapture",
        ])
        .env(CHILD_ENV, format!("127.0.0.1:{port}"))
        .spawn()
        .unwrap();
    let session = listener.accept().unwrap();
    let (err, started) = futures::executor::block_on(async {
        // The receive waits before the peer dies, so the death must
        // reach a waiter (not only a call made after it).
        let mut receive = std::pin::pin!(session.receive());
        assert!(futures::poll!(receive.as_mut()).is_pending());
        child.kill().unwrap();
        child.wait().unwrap();
        let started = std::time::Instant::now();
        (receive.await.unwrap_err(), started)
    });
    assert!(matches!(err, SessionError::Disconnected(_)), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "noticed in {:?}",
        started.elapsed()
    );
}
