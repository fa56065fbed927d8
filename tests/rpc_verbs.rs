//! The RPC layer on a real verbs device — Soft-RoCE's `rxe0` (TCP
//! handshake) and `rxe1` (rdma_cm, at 10.99.0.1) in the VM that
//! `scripts/test` boots, or the device named by `RDMA_RING_DEVICE`. These
//! tests need a device, so they are ignored in a plain `cargo test`;
//! `scripts/test` runs them in the VM with `--include-ignored`, where a
//! missing device fails them loudly.
#![cfg(feature = "verbs")]

mod rxe;

use rxe::{device, device_name, free_port};

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdma_ring::rpc::{
    AsyncHandler, Caller, HandlerError, ResponseFuture, RpcClient, RpcConfig, RpcError, RpcServer,
    Service,
};

/// Set in a child process: what it plays (`server ADDR` or `client ADDR`).
const CHILD_ENV: &str = "RDMA_RING_RPC_CHILD";
/// The rdma_cm address of rxe1 in the VM.
const CM_ADDR: &str = "10.99.0.1";

fn echo(_: &Caller, req: &[u8], resp: &mut Vec<u8>) -> Result<(), HandlerError> {
    resp.extend_from_slice(req);
    Ok(())
}

fn pattern(len: usize, seed: usize) -> Vec<u8> {
    (0..len)
        .map(|i| ((i * 131 + seed * 7) % 251) as u8)
        .collect()
}

fn wait_for(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs this test binary's `test` as a child process playing `role`.
fn spawn_child(test: &str, role: &str) -> std::process::Child {
    std::process::Command::new(std::env::current_exe().unwrap())
        .args([test, "--include-ignored", "--exact", "--nocapture"])
        .env(CHILD_ENV, role)
        .spawn()
        .unwrap()
}

#[test]
#[ignore = "needs an RDMA device (runs in the Soft-RoCE VM)"]
fn sixteen_clients_pipeline_calls_of_every_size_without_rnr() {
    let dev = device();
    let config = RpcConfig {
        window: 8,
        max_clients: 16,
        ..RpcConfig::default()
    };
    let server = RpcServer::bind_with("127.0.0.1:0", &dev, Service::handler(echo), config).unwrap();
    let addr = server.local_addr().unwrap();
    let rnr_before = rxe::rnr_naks(&device_name());
    let clients: Vec<_> = (0..16)
        .map(|_| RpcClient::connect_with(addr, &dev, config).unwrap())
        .collect();
    let threads: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(k, client)| {
            std::thread::spawn(move || {
                // 24 calls in flight per client; sizes from 1 byte to
                // 100 KB, so inline messages and rendezvous both run.
                let reqs: Vec<Vec<u8>> = (0..24)
                    .map(|i| pattern([1, 64, 4096, 4097, 100_000][i % 5], k * 100 + i))
                    .collect();
                let got = futures::executor::block_on(futures::future::join_all(
                    reqs.iter().map(|r| client.call_async(r)),
                ));
                for (req, resp) in reqs.iter().zip(got) {
                    assert!(&resp.unwrap() == req, "an echo differs");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let stats = server.stats();
    assert_eq!(stats.requests, 16 * 24);
    assert_eq!(stats.errors, 0);
    assert_eq!(
        rxe::rnr_naks(&device_name()),
        rnr_before,
        "a receive queue ran dry"
    );
    wait_for("every client to leave", Duration::from_secs(10), || {
        server.stats().clients_open == 0
    });
    println!("{stats:?}");
}

/// Peers that stall their TCP handshake hold up no client behind them,
/// and one that takes less than the connect timeout over each step, but
/// more over the two, is cut off at the one deadline of the whole, not
/// admitted.
#[test]
#[ignore = "needs an RDMA device (runs in the Soft-RoCE VM)"]
fn stalling_peers_hold_up_no_client_and_a_pacing_one_is_not_admitted() {
    let dev = device();
    let config = RpcConfig {
        connect_timeout: Duration::from_secs(2),
        ..RpcConfig::default()
    };
    let server = RpcServer::bind_with("127.0.0.1:0", &dev, Service::handler(echo), config).unwrap();
    let addr = server.local_addr().unwrap();
    let silent: Vec<_> = (0..3)
        .map(|_| std::net::TcpStream::connect(addr).unwrap())
        .collect();
    let pacing = rxe::pacing_peer(
        addr,
        (Duration::from_millis(400), Duration::from_millis(1700)),
        None,
    );
    // Behind three silent peers in one acceptor, the client's own connect
    // timeout would run out.
    let client = RpcClient::connect_with(addr, &dev, config).unwrap();
    assert_eq!(
        client.call(b"past the stalled").unwrap(),
        b"past the stalled"
    );
    // Still connected: had its handshake had a timeout per step, the
    // pacing peer would be admitted by now, and counted.
    let pacing = pacing.join().unwrap();
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(server.stats().clients_open, 1);
    // The three silent peers and the pacing one failed their handshakes,
    // and the server counted each.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while server.stats().handshakes_failed < 4 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(server.stats().handshakes_failed, 4, "{:?}", server.stats());
    // Failed handshakes stop no listener.
    assert!(server.accepting());
    drop((client, pacing));
    server.shutdown().unwrap();
    assert!(!server.accepting());
    drop(silent);
}

#[test]
#[ignore = "needs an RDMA device (runs in the Soft-RoCE VM)"]
fn rdma_cm_clients_are_served_on_rxe1() {
    let port = free_port();
    let addr = format!("{CM_ADDR}:{port}").parse().unwrap();
    let kv = {
        let mut map = std::collections::HashMap::<Vec<u8>, Vec<u8>>::new();
        move |_: &Caller, req: &[u8], resp: &mut Vec<u8>| -> Result<(), HandlerError> {
            match req.split_first() {
                Some((b'P', rest)) => {
                    let (k, v) = rest.split_at(8);
                    map.insert(k.to_vec(), v.to_vec());
                    Ok(())
                }
                Some((b'G', k)) => {
                    resp.extend_from_slice(map.get(k).ok_or(HandlerError::new("no such key"))?);
                    Ok(())
                }
                _ => Err(HandlerError::new("bad request")),
            }
        }
    };
    let server = RpcServer::bind_cm(addr, Service::handler(kv), RpcConfig::default()).unwrap();
    let clients: Vec<_> = (0..4)
        .map(|_| RpcClient::connect_cm(addr, RpcConfig::default()).unwrap())
        .collect();
    for (k, client) in clients.iter().enumerate() {
        let key = format!("key{k:05}");
        let value = pattern(10_000, k);
        let mut put = b"P".to_vec();
        put.extend_from_slice(key.as_bytes());
        put.extend_from_slice(&value);
        client.call(&put).unwrap();
        assert_eq!(client.call(format!("G{key}").as_bytes()).unwrap(), value);
        assert_eq!(
            client.call(b"Gmissing!"),
            Err(RpcError::Handler("no such key".into()))
        );
    }
    assert_eq!(server.stats().clients_accepted, 4);
    drop(clients);
    wait_for("the clients to leave", Duration::from_secs(10), || {
        server.stats().clients_open == 0
    });
    server.shutdown().unwrap();
}

/// Answers only when the test opens the gate.
struct Gate {
    open: Arc<Mutex<Vec<futures::channel::oneshot::Sender<()>>>>,
    started: Arc<AtomicUsize>,
}

impl AsyncHandler for Gate {
    fn call(&mut self, _caller: Caller, request: Vec<u8>) -> ResponseFuture {
        let (tx, rx) = futures::channel::oneshot::channel();
        self.open.lock().unwrap().push(tx);
        self.started.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move {
            let _ = rx.await;
            Ok(request)
        })
    }
}

#[test]
#[ignore = "needs an RDMA device (runs in the Soft-RoCE VM)"]
fn a_killed_client_process_is_detached_and_others_are_served() {
    const TEST: &str = "a_killed_client_process_is_detached_and_others_are_served";
    if let Ok(role) = std::env::var(CHILD_ENV) {
        // The child: a client that leaves four calls in flight, then hangs
        // until killed.
        let addr = role.strip_prefix("client ").unwrap();
        let client = RpcClient::connect_with(addr, &device(), RpcConfig::default()).unwrap();
        let _calls: Vec<_> = (0..4u8).map(|i| client.call_async(&[i; 64])).collect();
        loop {
            std::thread::sleep(Duration::from_secs(60));
        }
    }
    let open = Arc::new(Mutex::new(Vec::new()));
    let started = Arc::new(AtomicUsize::new(0));
    let gate = Gate {
        open: Arc::clone(&open),
        started: Arc::clone(&started),
    };
    let dev = device();
    let server = RpcServer::bind_with(
        "127.0.0.1:0",
        &dev,
        Service::async_handler(gate),
        RpcConfig::default(),
    )
    .unwrap();
    let addr = server.local_addr().unwrap();
    let mut child = spawn_child(TEST, &format!("client {addr}"));
    wait_for("the child's four calls", Duration::from_secs(60), || {
        started.load(Ordering::SeqCst) == 4
    });
    child.kill().unwrap();
    child.wait().unwrap();
    // The answers go to a dead peer: the sends fail after the transport's
    // retries, and the server lets the connection go.
    for gate in open.lock().unwrap().drain(..) {
        let _ = gate.send(());
    }
    let t0 = Instant::now();
    wait_for(
        "the dead client to be detached",
        Duration::from_secs(60),
        || server.stats().clients_closed == 1,
    );
    println!("the dead client was detached after {:?}", t0.elapsed());
    let other = RpcClient::connect_with(addr, &dev, RpcConfig::default()).unwrap();
    let call = other.call_async(b"alive");
    wait_for("the new call", Duration::from_secs(30), || {
        started.load(Ordering::SeqCst) == 5
    });
    for gate in open.lock().unwrap().drain(..) {
        let _ = gate.send(());
    }
    assert_eq!(futures::executor::block_on(call).unwrap(), b"alive");
}

#[test]
#[ignore = "needs an RDMA device (runs in the Soft-RoCE VM)"]
fn a_killed_server_fails_calls_and_a_restarted_one_serves_new_clients() {
    const TEST: &str = "a_killed_server_fails_calls_and_a_restarted_one_serves_new_clients";
    if let Ok(role) = std::env::var(CHILD_ENV) {
        let addr = role.strip_prefix("server ").unwrap();
        let _server = RpcServer::bind_with(
            addr,
            &device(),
            Service::handler(echo),
            RpcConfig::default(),
        )
        .unwrap();
        loop {
            std::thread::sleep(Duration::from_secs(60));
        }
    }
    let addr = format!("127.0.0.1:{}", free_port());
    let connect = |addr: &str| {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match RpcClient::connect_with(addr, &device(), RpcConfig::default()) {
                Ok(client) => break client,
                Err(e) if Instant::now() < deadline => {
                    let _ = e;
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(e) => panic!("the server never came up: {e}"),
            }
        }
    };
    let mut first = spawn_child(TEST, &format!("server {addr}"));
    let old = connect(&addr);
    assert_eq!(old.call(b"before").unwrap(), b"before");
    first.kill().unwrap();
    first.wait().unwrap();
    let t0 = Instant::now();
    // Idle, the client still learns of it: the server's end of the
    // handshake socket closed with its process.
    wait_for("the idle client to notice", Duration::from_secs(10), || {
        old.failure().is_some()
    });
    println!(
        "the idle client noticed the dead server after {:?}",
        t0.elapsed()
    );
    match old.call(b"after") {
        Err(RpcError::Disconnected(why)) => {
            println!(
                "the dead server was noticed after {:?}: {why}",
                t0.elapsed()
            )
        }
        other => panic!("expected Disconnected, got {other:?}"),
    }
    let mut second = spawn_child(TEST, &format!("server {addr}"));
    let new = connect(&addr);
    assert_eq!(new.call(b"restarted").unwrap(), b"restarted");
    second.kill().unwrap();
    second.wait().unwrap();
}

#[test]
#[ignore = "needs an RDMA device (runs in the Soft-RoCE VM)"]
fn an_idle_killed_client_is_detached_over_either_handshake() {
    const TEST: &str = "an_idle_killed_client_is_detached_over_either_handshake";
    if let Ok(role) = std::env::var(CHILD_ENV) {
        // The child: one call, then idle until killed.
        match role.split_once(' ') {
            Some(("tcp", addr)) => {
                let client =
                    RpcClient::connect_with(addr, &device(), RpcConfig::default()).unwrap();
                client.call(b"hello").unwrap();
                idle_forever(&client)
            }
            Some(("cm", addr)) => {
                let client =
                    RpcClient::connect_cm(addr.parse().unwrap(), RpcConfig::default()).unwrap();
                client.call(b"hello").unwrap();
                idle_forever(&client)
            }
            _ => panic!("unknown role {role:?}"),
        }
    }
    let tcp = RpcServer::bind_with(
        "127.0.0.1:0",
        &device(),
        Service::handler(echo),
        RpcConfig::default(),
    )
    .unwrap();
    let cm_addr: std::net::SocketAddr = format!("{CM_ADDR}:{}", free_port()).parse().unwrap();
    let cm = RpcServer::bind_cm(cm_addr, Service::handler(echo), RpcConfig::default()).unwrap();
    for (name, server, role) in [
        (
            "TCP handshake",
            &tcp as &dyn Stats,
            format!("tcp {}", tcp.local_addr().unwrap()),
        ),
        ("rdma_cm", &cm as &dyn Stats, format!("cm {cm_addr}")),
    ] {
        let mut child = spawn_child(TEST, &role);
        wait_for("the child's call", Duration::from_secs(60), || {
            server.requests() == 1
        });
        child.kill().unwrap();
        child.wait().unwrap();
        let t0 = Instant::now();
        wait_for(
            "the idle dead client to be detached",
            Duration::from_secs(30),
            || server.closed() == 1,
        );
        println!(
            "{name}: the idle dead client was detached after {:?}",
            t0.elapsed()
        );
    }
}

/// The two servers' counters, whatever their queue pair type.
trait Stats {
    fn requests(&self) -> u64;
    fn closed(&self) -> u64;
}

impl<Q: rdma_ring::backend::QueuePair + Send + 'static> Stats for RpcServer<Q> {
    fn requests(&self) -> u64 {
        self.stats().requests
    }
    fn closed(&self) -> u64 {
        self.stats().clients_closed
    }
}

/// Keeps `_client` connected until the process is killed.
fn idle_forever<T>(_client: &T) -> ! {
    loop {
        std::thread::sleep(Duration::from_secs(60));
    }
}
