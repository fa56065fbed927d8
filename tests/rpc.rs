//! The RPC layer on the soft device: many clients, pipelining, large
//! messages both ways, and every fault the server must survive.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdma_ring::backend::soft::{SoftDevice, SoftQp};
use rdma_ring::backend::QpConfig;
use rdma_ring::buf::{BufferPool, RegisteredBuf, RemoteAccess};
use rdma_ring::future::Wakeup;
use rdma_ring::op::{Recv, Send};
use rdma_ring::ring::{Ring, RingConfig};
use rdma_ring::rpc::wire::{self, Kind, Message};
use rdma_ring::rpc::{
    AsyncHandler, Caller, HandlerError, ResponseFuture, RpcClient, RpcConfig, RpcError, RpcServer,
    Service,
};

fn echo(_: &Caller, req: &[u8], resp: &mut Vec<u8>) -> Result<(), HandlerError> {
    resp.extend_from_slice(req);
    Ok(())
}

/// A request that says what to answer: "echo:..", "fail:..", "panic",
/// "big:N" (N bytes of a pattern).
fn scripted(caller: &Caller, req: &[u8], resp: &mut Vec<u8>) -> Result<(), HandlerError> {
    if let Some(rest) = req.strip_prefix(b"fail:") {
        return Err(HandlerError::new(String::from_utf8_lossy(rest)));
    }
    if req == b"panic" {
        panic!("scripted panic");
    }
    if let Some(n) = req.strip_prefix(b"big:") {
        let n: usize = std::str::from_utf8(n).unwrap().parse().unwrap();
        resp.extend((0..n).map(|i| (i % 251) as u8));
        return Ok(());
    }
    if req == b"who" {
        resp.extend_from_slice(&caller.client_id.to_le_bytes());
        return Ok(());
    }
    resp.extend_from_slice(req);
    Ok(())
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn rnr_naks(client: &RpcClient<SoftQp>) -> u64 {
    client
        .with_queue_pair(|qp| qp.control().counters().rnr_naks)
        .expect("the client's queue pair")
}

#[test]
fn calls_of_every_size_round_trip() {
    let dev = SoftDevice::new();
    let server = RpcServer::soft(&dev, Service::handler(echo), RpcConfig::default()).unwrap();
    let client = server.connect_soft().unwrap();
    assert_eq!(client.window(), 16);
    // Empty, inline-sized, exactly one buffer, one byte over (rendezvous),
    // and several MiB.
    let max_inline_body = RpcConfig::default().buffer_size as usize - wire::HEADER_LEN;
    assert_eq!(max_inline_body, 4096);
    for n in [
        0,
        1,
        100,
        max_inline_body,
        max_inline_body + 1,
        1 << 16,
        3 << 20,
    ] {
        let req = pattern(n, n as u8);
        let resp = client.call(&req).unwrap();
        assert!(resp == req, "a {n}-byte echo differs");
    }
    let stats = server.stats();
    assert_eq!(stats.requests, 7);
    assert_eq!(stats.errors, 0);
    assert_eq!(rnr_naks(&client), 0);
    server.shutdown().unwrap();
}

#[test]
fn large_responses_are_read_and_released() {
    let dev = SoftDevice::new();
    let server = RpcServer::soft(&dev, Service::handler(scripted), RpcConfig::default()).unwrap();
    let client = server.connect_soft().unwrap();
    for n in [5000usize, 1 << 20] {
        let resp = client.call(format!("big:{n}").as_bytes()).unwrap();
        assert_eq!(resp.len(), n);
        assert!(resp.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8));
    }
    // Each large response was released by the client (an answered
    // release per response), so none expires.
    let deadline = Instant::now() + Duration::from_secs(5);
    while server.stats().answers < 4 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    let stats = server.stats();
    assert_eq!(stats.answers, 4, "{stats:?}");
    assert_eq!(stats.releases_expired, 0);
}

/// Large requests from every client together hold at most `max_reading`
/// bytes on the server: the rest wait their turn and are answered all the
/// same. One request larger than the bound alone still goes.
#[test]
fn large_requests_of_many_clients_wait_for_memory_to_read_them() {
    let dev = SoftDevice::new();
    let config = RpcConfig {
        max_reading: 100_000,
        ..RpcConfig::default()
    };
    let server = RpcServer::soft(&dev, Service::handler(echo), config).unwrap();
    let clients: Vec<_> = (0..3).map(|_| server.connect_soft().unwrap()).collect();
    let reqs: Vec<Vec<u8>> = (0..24).map(|i| pattern(40_000, i as u8)).collect();
    let futures: Vec<_> = reqs
        .iter()
        .enumerate()
        .map(|(i, r)| clients[i % 3].call_async(r))
        .collect();
    let got = futures::executor::block_on(futures::future::join_all(futures));
    for (req, resp) in reqs.iter().zip(got) {
        assert!(&resp.unwrap() == req, "an echo differs");
    }
    let stats = server.stats();
    assert!(stats.reads_waited > 0, "{stats:?}");
    assert!(
        (40_000..=100_000).contains(&stats.peak_reading),
        "{stats:?}"
    );
    let big = pattern(250_000, 7);
    assert!(clients[0].call(&big).unwrap() == big);
    assert_eq!(server.stats().peak_reading, 250_000);
    server.shutdown().unwrap();
}

/// Requests waiting for memory to read them go in arrival order: a
/// small one that would fit now waits behind a large one that came
/// first. They arrived before the shutdown, so a shutdown reads and
/// answers them. The device runs work only when told, so the reads stay
/// in flight while the test looks.
#[test]
fn waiting_requests_go_in_order_and_are_answered_through_a_shutdown() {
    use rdma_ring::backend::soft::Progress;
    let dev = SoftDevice::new();
    let config = RpcConfig {
        max_reading: 100_000,
        ..RpcConfig::default()
    };
    let server = Arc::new(RpcServer::soft(&dev, Service::handler(echo), config).unwrap());
    let client = server.connect_soft().unwrap();
    let before = server.stats().messages;
    dev.set_progress(Progress::Manual);
    let reqs = [pattern(60_000, 1), pattern(60_000, 2), pattern(10_000, 3)];
    let calls: Vec<_> = reqs.iter().map(|r| client.call_async(r)).collect();
    dev.progress(); // the three descriptors arrive; no read runs yet
    wait_for("the three requests to be seen", || {
        server.stats().messages == before + 3
    });
    // The first is being read; the second waits for memory, and the
    // third, though it would fit, waits behind it.
    let stats = server.stats();
    assert_eq!(stats.reads_waited, 2, "{stats:?}");
    assert_eq!(stats.peak_reading, 60_000, "{stats:?}");
    // The shutdown begins (its goodbye rings a doorbell) with both
    // still waiting.
    let doorbells = stats.doorbells;
    let stopping = {
        let server = Arc::clone(&server);
        std::thread::spawn(move || server.shutdown())
    };
    wait_for("the shutdown to begin", || {
        server.stats().doorbells > doorbells
    });
    dev.set_progress(Progress::Auto);
    dev.progress();
    let got = futures::executor::block_on(futures::future::join_all(calls));
    for (req, resp) in reqs.iter().zip(got) {
        assert!(&resp.unwrap() == req, "an echo differs");
    }
    drop(client);
    stopping.join().unwrap().unwrap();
}

/// Clients take turns at the memory for reading large requests: one
/// client's backlog of them does not make another's wait for all of it.
/// Only one request fits at a time, so the handler sees them in the order
/// they were read.
#[test]
fn clients_take_turns_at_reading_large_requests() {
    use rdma_ring::backend::soft::Progress;
    let dev = SoftDevice::new();
    let config = RpcConfig {
        max_reading: 100_000,
        ..RpcConfig::default()
    };
    let seen = Arc::new(Mutex::new(Vec::new()));
    let handler = {
        let seen = Arc::clone(&seen);
        move |_: &Caller, req: &[u8], resp: &mut Vec<u8>| -> Result<(), HandlerError> {
            seen.lock().unwrap().push(req[0]);
            resp.extend_from_slice(req);
            Ok(())
        }
    };
    let server = RpcServer::soft(&dev, Service::handler(handler), config).unwrap();
    let hog = server.connect_soft().unwrap();
    let other = server.connect_soft().unwrap();
    let before = server.stats().messages;
    dev.set_progress(Progress::Manual);
    let hogs: Vec<Vec<u8>> = (1..=5).map(|i| pattern(60_000, i)).collect();
    let mut calls: Vec<_> = hogs.iter().map(|r| hog.call_async(r)).collect();
    dev.progress(); // the hog's descriptors arrive; one read starts
    wait_for("the hog's requests to be seen", || {
        server.stats().messages == before + 5
    });
    let late = pattern(60_000, 99);
    calls.push(other.call_async(&late));
    dev.set_progress(Progress::Auto);
    dev.progress();
    let got = futures::executor::block_on(futures::future::join_all(calls));
    for (req, resp) in hogs.iter().chain([&late]).zip(got) {
        assert!(&resp.unwrap() == req, "an echo differs");
    }
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 6, "{seen:?}");
    // The hog's own requests keep their order.
    let hogs_seen: Vec<u8> = seen.iter().copied().filter(|&s| s != 99).collect();
    assert_eq!(hogs_seen, [1, 2, 3, 4, 5]);
    // However the other's descriptor met the hog's reads, at least two of
    // the hog's were still waiting behind it: in arrival order, it would
    // have gone last.
    let at = seen.iter().position(|&s| s == 99).unwrap();
    assert!(
        at <= 3,
        "the other client's request was read after {at} of the hog's: {seen:?}"
    );
    server.shutdown().unwrap();
}

/// A client's large requests that arrive together are read, and handled,
/// in the order they were sent.
#[test]
fn a_client_s_large_requests_are_read_in_the_order_sent() {
    use rdma_ring::backend::soft::Progress;
    let dev = SoftDevice::new();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let handler = {
        let seen = Arc::clone(&seen);
        move |_: &Caller, req: &[u8], resp: &mut Vec<u8>| -> Result<(), HandlerError> {
            seen.lock().unwrap().push(req[0]);
            resp.extend_from_slice(req);
            Ok(())
        }
    };
    let server = RpcServer::soft(&dev, Service::handler(handler), RpcConfig::default()).unwrap();
    let client = server.connect_soft().unwrap();
    let before = server.stats().messages;
    dev.set_progress(Progress::Manual);
    let requests: Vec<Vec<u8>> = (1..=4).map(|i| pattern(60_000, i)).collect();
    let calls: Vec<_> = requests.iter().map(|r| client.call_async(r)).collect();
    dev.progress(); // the descriptors arrive together; the reads go out
    wait_for("the requests to be seen", || {
        server.stats().messages == before + 4
    });
    dev.set_progress(Progress::Auto);
    dev.progress();
    let got = futures::executor::block_on(futures::future::join_all(calls));
    for (req, resp) in requests.iter().zip(got) {
        assert!(&resp.unwrap() == req, "an echo differs");
    }
    assert_eq!(*seen.lock().unwrap(), [1, 2, 3, 4]);
    server.shutdown().unwrap();
}

/// A release timeout of `Duration::MAX` means never: a shutdown does not
/// overflow adding its graces to it.
#[test]
fn a_release_timeout_of_never_shuts_down() {
    let dev = SoftDevice::new();
    let config = RpcConfig {
        release_timeout: Duration::MAX,
        ..RpcConfig::default()
    };
    let server = RpcServer::soft(&dev, Service::handler(scripted), config).unwrap();
    let client = server.connect_soft().unwrap();
    assert_eq!(client.call(b"hi").unwrap(), b"hi");
    drop(client);
    server.shutdown().unwrap();
}

#[test]
fn sixteen_clients_pipeline_calls_without_rnr() {
    let dev = SoftDevice::new();
    let config = RpcConfig {
        window: 8,
        max_clients: 16,
        ..RpcConfig::default()
    };
    let server = RpcServer::soft(&dev, Service::handler(scripted), config).unwrap();
    let clients: Vec<_> = (0..16).map(|_| server.connect_soft().unwrap()).collect();
    let ids: std::collections::HashSet<u32> = clients.iter().map(|c| c.client_id()).collect();
    assert_eq!(ids.len(), 16, "every connection has its own id");
    let threads: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(k, client)| {
            std::thread::spawn(move || {
                // 40 calls in flight at once (the window lets 8 go; the
                // rest wait their turn), every few a large one.
                let reqs: Vec<Vec<u8>> = (0..40)
                    .map(|i| pattern(if i % 9 == 0 { 10_000 } else { 64 + i }, k as u8 ^ i as u8))
                    .collect();
                let futures: Vec<_> = reqs.iter().map(|r| client.call_async(r)).collect();
                let got = futures::executor::block_on(futures::future::join_all(futures));
                for (req, resp) in reqs.iter().zip(got) {
                    assert_eq!(&resp.unwrap(), req);
                }
                // The server knows who called.
                let who = client.call(b"who").unwrap();
                assert_eq!(
                    u32::from_le_bytes(who.try_into().unwrap()),
                    client.client_id()
                );
                rnr_naks(&client)
            })
        })
        .collect();
    for t in threads {
        assert_eq!(t.join().unwrap(), 0, "a client met an empty receive queue");
    }
    let stats = server.stats();
    assert_eq!(stats.requests, 16 * 41);
    // Each client said it was leaving when dropped: the server let go of
    // every connection at once.
    wait_for("every client to be closed", || {
        server.stats().clients_closed == 16
    });
    let stats = server.stats();
    assert_eq!((stats.clients_left, stats.clients_open), (16, 0));
    // Answers made in one pass share a doorbell per connection.
    assert!(
        stats.doorbells < stats.answers + stats.messages,
        "no batching: {stats:?}"
    );
}

#[test]
fn handler_errors_and_panics_fail_one_call_and_the_server_serves_on() {
    let dev = SoftDevice::new();
    let server = RpcServer::soft(&dev, Service::handler(scripted), RpcConfig::default()).unwrap();
    let a = server.connect_soft().unwrap();
    let b = server.connect_soft().unwrap();
    assert_eq!(
        a.call(b"fail:no such key"),
        Err(RpcError::Handler("no such key".into()))
    );
    match a.call(b"panic") {
        Err(RpcError::Panicked(text)) => assert!(text.contains("scripted panic"), "{text}"),
        other => panic!("expected a panic error, got {other:?}"),
    }
    assert_eq!(a.call(b"still here").unwrap(), b"still here");
    assert_eq!(b.call(b"me too").unwrap(), b"me too");
    let stats = server.stats();
    assert_eq!((stats.panics, stats.errors), (1, 2));
}

#[test]
fn too_large_messages_are_refused_on_both_sides() {
    let dev = SoftDevice::new();
    let config = RpcConfig {
        max_message: 64 << 10,
        ..RpcConfig::default()
    };
    let server = RpcServer::soft(&dev, Service::handler(scripted), config).unwrap();
    let client = server.connect_soft().unwrap();
    match client.call(&vec![0u8; (64 << 10) + 1]) {
        Err(RpcError::TooLarge(_)) => {}
        other => panic!("expected TooLarge, got {other:?}"),
    }
    match client.call(b"big:100000") {
        Err(RpcError::TooLarge(text)) => assert!(text.contains("100000"), "{text}"),
        other => panic!("expected TooLarge, got {other:?}"),
    }
    assert_eq!(client.call(b"ok").unwrap(), b"ok");
}

/// A `max_message` below what a receive buffer holds binds inline
/// messages too: the server refuses a longer request without running its
/// handler, and a client a longer response.
#[test]
fn a_small_max_message_binds_inline_messages_too() {
    let dev = SoftDevice::new();
    let small = RpcConfig {
        max_message: 100,
        ..RpcConfig::default()
    };
    let server = RpcServer::soft(&dev, Service::handler(scripted), small).unwrap();
    // A raw client sends what ours would refuse to.
    let mut raw = RawClient::new(&server);
    match Message::decode(&raw.call(1, &[b'x'; 101])) {
        Ok(Message::Error { id: 1, code, text }) => {
            assert_eq!(code, wire::ErrorCode::TooLarge);
            assert!(text.contains("101"), "{text}");
        }
        other => panic!("expected TooLarge, got {other:?}"),
    }
    assert_eq!(server.stats().requests, 0, "the handler ran");
    // Answers of 1000 bytes travel inline; a client of max_message 100
    // refuses them.
    let roomy = RpcServer::soft(&dev, Service::handler(scripted), RpcConfig::default()).unwrap();
    let client = roomy.connect_soft_with(small).unwrap();
    match client.call(b"big:1000") {
        Err(RpcError::TooLarge(text)) => assert!(text.contains("1000"), "{text}"),
        other => panic!("expected TooLarge, got {other:?}"),
    }
    assert_eq!(client.call(b"ok").unwrap(), b"ok");
}

/// The senders that let a gated handler's futures finish.
type Gates = Arc<Mutex<Vec<futures::channel::oneshot::Sender<()>>>>;

/// An async handler whose answers wait for the test to release them.
struct Gate {
    waiting: Gates,
    started: Arc<AtomicUsize>,
}

impl AsyncHandler for Gate {
    fn call(&mut self, _caller: Caller, request: Vec<u8>) -> ResponseFuture {
        let (tx, rx) = futures::channel::oneshot::channel();
        self.waiting.lock().unwrap().push(tx);
        self.started.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move {
            if rx.await.is_err() {
                return Err(HandlerError::new("gate dropped"));
            }
            if request == b"panic" {
                panic!("async panic");
            }
            Ok(request)
        })
    }
}

fn gate() -> (Gate, Gates, Arc<AtomicUsize>) {
    let waiting = Arc::new(Mutex::new(Vec::new()));
    let started = Arc::new(AtomicUsize::new(0));
    (
        Gate {
            waiting: Arc::clone(&waiting),
            started: Arc::clone(&started),
        },
        waiting,
        started,
    )
}

/// A soft server with a window of 2 whose answers wait for the test
/// ([`gate`]).
fn gated_server_of_window_2(dev: &SoftDevice) -> (RpcServer<SoftQp>, Gates, Arc<AtomicUsize>) {
    let (handler, waiting, started) = gate();
    let config = RpcConfig {
        window: 2,
        ..RpcConfig::default()
    };
    let server = RpcServer::soft(dev, Service::async_handler(handler), config).unwrap();
    (server, waiting, started)
}

/// Two shutdowns at once (say, one and a drop) both return only once the
/// server has stopped: the second waits for the first's end.
#[test]
fn a_second_shutdown_returns_only_once_the_server_stopped() {
    let dev = SoftDevice::new();
    let (server, waiting, started) = gated_server_of_window_2(&dev);
    let server = Arc::new(server);
    let client = server.connect_soft().unwrap();
    let call = std::thread::spawn(move || client.call(b"held"));
    wait_for("the handler", || started.load(Ordering::SeqCst) == 1);
    let (done, returned) = std::sync::mpsc::channel();
    for _ in 0..2 {
        let (server, done) = (Arc::clone(&server), done.clone());
        std::thread::spawn(move || done.send(server.shutdown()).unwrap());
    }
    // The first shutdown waits for the held call's answer; so does the
    // second.
    assert!(
        returned.recv_timeout(Duration::from_millis(300)).is_err(),
        "a shutdown returned while the server still ran"
    );
    for gate in waiting.lock().unwrap().drain(..) {
        let _ = gate.send(());
    }
    for _ in 0..2 {
        returned
            .recv_timeout(Duration::from_secs(20))
            .unwrap()
            .unwrap();
    }
    assert_eq!(call.join().unwrap().unwrap(), b"held");
}

/// A handler may shut its own server down: on the poller's thread the
/// shutdown only starts (it cannot wait for its own thread), the call is
/// answered, and a shutdown from elsewhere then waits for the end.
#[test]
fn a_handler_may_shut_its_server_down() {
    let dev = SoftDevice::new();
    let slot: Arc<std::sync::OnceLock<Arc<RpcServer<SoftQp>>>> = Arc::default();
    let seen = Arc::clone(&slot);
    let handler = move |_: &Caller, req: &[u8], resp: &mut Vec<u8>| -> Result<(), HandlerError> {
        if req == b"stop" {
            let server = seen.get().expect("the server is set before any call");
            server
                .shutdown()
                .map_err(|e| HandlerError::new(e.to_string()))?;
        }
        resp.extend_from_slice(req);
        Ok(())
    };
    let server = RpcServer::soft(&dev, Service::handler(handler), RpcConfig::default()).unwrap();
    let server = Arc::new(server);
    assert!(slot.set(Arc::clone(&server)).is_ok());
    let client = server.connect_soft().unwrap();
    assert_eq!(client.call(b"stop").unwrap(), b"stop");
    server.shutdown().unwrap();
    let after = client.call(b"after");
    assert!(
        matches!(
            after,
            Err(RpcError::ShuttingDown | RpcError::Disconnected(_))
        ),
        "{after:?}"
    );
}

fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn async_handlers_answer_in_the_order_they_finish() {
    let dev = SoftDevice::new();
    let (handler, waiting, started) = gate();
    let server =
        RpcServer::soft(&dev, Service::async_handler(handler), RpcConfig::default()).unwrap();
    let client = server.connect_soft().unwrap();
    let first = client.call_async(b"first");
    let second = client.call_async(b"second");
    let panics = client.call_async(b"panic");
    wait_for("three calls to start", || {
        started.load(Ordering::SeqCst) == 3
    });
    // Release the second, then the first, then the panicking one.
    let gates: Vec<_> = waiting.lock().unwrap().drain(..).collect();
    let mut gates = gates.into_iter();
    let (g1, g2, g3) = (
        gates.next().unwrap(),
        gates.next().unwrap(),
        gates.next().unwrap(),
    );
    g2.send(()).unwrap();
    assert_eq!(futures::executor::block_on(second).unwrap(), b"second");
    g1.send(()).unwrap();
    assert_eq!(futures::executor::block_on(first).unwrap(), b"first");
    g3.send(()).unwrap();
    match futures::executor::block_on(panics) {
        Err(RpcError::Panicked(t)) => assert!(t.contains("async panic")),
        other => panic!("expected a panic error, got {other:?}"),
    }
}

#[test]
fn a_call_times_out_and_the_client_goes_on() {
    let dev = SoftDevice::new();
    let (handler, waiting, started) = gate();
    let server =
        RpcServer::soft(&dev, Service::async_handler(handler), RpcConfig::default()).unwrap();
    let config = RpcConfig {
        call_timeout: Duration::from_millis(1000),
        ..RpcConfig::default()
    };
    let client = server.connect_soft_with(config).unwrap();
    let t0 = Instant::now();
    assert_eq!(
        client.call(b"never"),
        Err(RpcError::Timeout(Duration::from_millis(1000)))
    );
    assert!(t0.elapsed() >= Duration::from_millis(1000));
    // A timeout of its own, per call: against a client whose own is a
    // minute, so a loaded machine cannot blur the two.
    let patient = server
        .connect_soft_with(RpcConfig {
            call_timeout: Duration::from_secs(60),
            ..RpcConfig::default()
        })
        .unwrap();
    let t0 = Instant::now();
    assert_eq!(
        patient.call_with_timeout(b"never", Duration::from_millis(50)),
        Err(RpcError::Timeout(Duration::from_millis(50)))
    );
    assert!(t0.elapsed() < Duration::from_secs(30), "{:?}", t0.elapsed());
    let late = client.call_async_with_timeout(b"never", Duration::from_millis(50));
    assert_eq!(
        futures::executor::block_on(late),
        Err(RpcError::Timeout(Duration::from_millis(50)))
    );
    // The late answers are dropped; the next call gets its own.
    for g in waiting.lock().unwrap().drain(..) {
        let _ = g.send(());
    }
    // A timeout of its own, so that a loaded machine cannot time it out.
    let next = client.call_async_with_timeout(b"next", Duration::from_secs(30));
    let answered = std::thread::spawn(move || futures::executor::block_on(next));
    // Its handler starts after the three that timed out, and is let go.
    wait_for("the next call's handler", || {
        for g in waiting.lock().unwrap().drain(..) {
            let _ = g.send(());
        }
        started.load(Ordering::SeqCst) == 4
    });
    for g in waiting.lock().unwrap().drain(..) {
        let _ = g.send(());
    }
    assert_eq!(answered.join().unwrap().unwrap(), b"next");
}

/// Under `Wakeup::Reactor` an awaited call the server never answers
/// still times out: nothing comes through the completion descriptor for
/// it, so without a timer its task would never be woken again.
#[test]
fn an_unanswered_call_times_out_under_a_reactor_too() {
    let dev = SoftDevice::new();
    let (handler, waiting, _started) = gate();
    let server =
        RpcServer::soft(&dev, Service::async_handler(handler), RpcConfig::default()).unwrap();
    let config = RpcConfig {
        wakeup: Wakeup::Reactor,
        call_timeout: Duration::from_millis(200),
        ..RpcConfig::default()
    };
    let client = server.connect_soft_with(config).unwrap();
    let (done, result) = std::sync::mpsc::channel();
    let call = client.call_async(b"never");
    // A later deadline too: the timer is told again once the first passed.
    let later = client.call_async_with_timeout(b"never either", Duration::from_millis(500));
    let t0 = Instant::now();
    let caller = std::thread::spawn(move || {
        let _ = done.send(futures::executor::block_on(futures::future::join(
            call, later,
        )));
    });
    let (first, second) = result
        .recv_timeout(Duration::from_secs(10))
        .expect("the calls were never woken at their deadlines");
    assert_eq!(first, Err(RpcError::Timeout(Duration::from_millis(200))));
    assert_eq!(second, Err(RpcError::Timeout(Duration::from_millis(500))));
    assert!(t0.elapsed() >= Duration::from_millis(500));
    caller.join().unwrap();
    for g in waiting.lock().unwrap().drain(..) {
        let _ = g.send(());
    }
}

/// Unbounded timeouts mean no deadline, not a panic.
#[test]
fn unbounded_timeouts_connect_and_call() {
    let dev = SoftDevice::new();
    let server = RpcServer::soft(&dev, Service::handler(echo), RpcConfig::default()).unwrap();
    let client = server
        .connect_soft_with(RpcConfig {
            connect_timeout: Duration::MAX,
            call_timeout: Duration::MAX,
            ..RpcConfig::default()
        })
        .unwrap();
    assert_eq!(client.call(b"no deadline").unwrap(), b"no deadline");
    let reply = futures::executor::block_on(client.call_async(b"async"));
    assert_eq!(reply.unwrap(), b"async");
}

#[test]
fn a_client_that_vanishes_with_calls_in_flight_is_detached() {
    let dev = SoftDevice::new();
    let (handler, waiting, started) = gate();
    let server =
        RpcServer::soft(&dev, Service::async_handler(handler), RpcConfig::default()).unwrap();
    let doomed = server.connect_soft().unwrap();
    let other = server.connect_soft().unwrap();
    let calls: Vec<_> = (0..4).map(|i| doomed.call_async(&[i; 10])).collect();
    wait_for("four calls to start", || {
        started.load(Ordering::SeqCst) == 4
    });
    drop(calls);
    drop(doomed); // its ring closes: the queue pair goes to error
    for g in waiting.lock().unwrap().drain(..) {
        let _ = g.send(());
    }
    wait_for("the server to notice", || {
        server.stats().clients_closed == 1
    });
    assert_eq!(server.stats().clients_open, 1);
    // The other client is served as before.
    let served = std::thread::spawn({
        let waiting = Arc::clone(&waiting);
        move || {
            for _ in 0..400 {
                for g in waiting.lock().unwrap().drain(..) {
                    let _ = g.send(());
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    });
    assert_eq!(other.call(b"alive").unwrap(), b"alive");
    served.join().unwrap();
    assert_nothing_leaked();
}

/// Nothing in this test binary leaked a buffer or a registration (a
/// detach that could not drain would have).
fn assert_nothing_leaked() {
    assert_eq!(rdma_ring::leak::leaked(), Default::default());
}

#[test]
fn shutdown_finishes_calls_in_flight_and_refuses_new_ones() {
    let dev = SoftDevice::new();
    let (handler, waiting, started) = gate();
    let server =
        RpcServer::soft(&dev, Service::async_handler(handler), RpcConfig::default()).unwrap();
    let client = server.connect_soft().unwrap();
    let calls: Vec<_> = (0..6u8).map(|i| client.call_async(&[i; 100])).collect();
    wait_for("six calls to start", || started.load(Ordering::SeqCst) == 6);
    let server = Arc::new(server);
    let stopper = std::thread::spawn({
        let server = Arc::clone(&server);
        move || server.shutdown()
    });
    wait_for("the goodbye", || client.server_closing());
    match client.call(b"late") {
        Err(RpcError::ShuttingDown) => {}
        other => panic!("expected ShuttingDown, got {other:?}"),
    }
    for g in waiting.lock().unwrap().drain(..) {
        g.send(()).unwrap();
    }
    let got = futures::executor::block_on(futures::future::join_all(calls));
    for (i, r) in got.into_iter().enumerate() {
        assert_eq!(r.unwrap(), vec![i as u8; 100]);
    }
    stopper.join().unwrap().unwrap();
    // The connection is closed now: calls fail, they do not hang.
    match client.call(b"after") {
        Err(RpcError::ShuttingDown) | Err(RpcError::Disconnected(_)) => {}
        other => panic!("expected a closed connection, got {other:?}"),
    }
}

#[test]
fn a_restarted_server_serves_new_clients_and_old_ones_get_errors() {
    let dev = SoftDevice::new();
    let config = RpcConfig {
        call_timeout: Duration::from_secs(5),
        ..RpcConfig::default()
    };
    let first = RpcServer::soft(&dev, Service::handler(echo), config).unwrap();
    let old = first.connect_soft().unwrap();
    assert_eq!(old.call(b"one").unwrap(), b"one");
    drop(first);
    match old.call(b"two") {
        Err(RpcError::ShuttingDown) | Err(RpcError::Disconnected(_)) => {}
        other => panic!("expected an error from a dead server, got {other:?}"),
    }
    let second = RpcServer::soft(&dev, Service::handler(echo), config).unwrap();
    let new = second.connect_soft().unwrap();
    assert_eq!(new.call(b"three").unwrap(), b"three");
}

#[test]
fn a_full_server_refuses_with_a_clear_error() {
    let dev = SoftDevice::new();
    let config = RpcConfig {
        max_clients: 2,
        ..RpcConfig::default()
    };
    let server = RpcServer::soft(&dev, Service::handler(echo), config).unwrap();
    let _a = server.connect_soft().unwrap();
    let _b = server.connect_soft().unwrap();
    match server.connect_soft() {
        Err(RpcError::Busy(text)) => assert!(text.contains("full"), "{text}"),
        other => panic!("expected Busy, got {other:?}"),
    }
    wait_for("the refusal to be closed", || {
        server.stats().clients_refused == 1
    });
}

/// A bare client: a ring over a raw queue pair connected to the server,
/// receives posted, the hello read.
struct RawClient {
    ring: Ring<SoftQp>,
    pool: BufferPool,
}

impl RawClient {
    fn new(server: &RpcServer<SoftQp>) -> RawClient {
        let (qp, pd) = server.connect_soft_raw(QpConfig::default()).unwrap();
        let pool = BufferPool::new(&*pd, 4096, 64).unwrap();
        let mut ring = Ring::new(qp, RingConfig::default());
        for _ in 0..32 {
            ring.submission()
                .push(Recv::new(pool.take().unwrap()).user_data(1))
                .unwrap();
        }
        ring.submit().unwrap();
        let mut raw = RawClient { ring, pool };
        match raw.receive() {
            Some(bytes) => assert!(matches!(Message::decode(&bytes), Ok(Message::Hello(_)))),
            None => panic!("no hello"),
        }
        raw
    }

    fn send(&mut self, bytes: &[u8]) {
        let mut chunk = self.pool.take().unwrap();
        chunk[..bytes.len()].copy_from_slice(bytes);
        use rdma_ring::buf::BaseBuf;
        self.ring
            .submission()
            .push(Send::new(chunk.slice(..bytes.len())).user_data(2))
            .unwrap();
        self.ring.submit().unwrap();
    }

    /// Sends request `id` with `body` inline, and returns the next message
    /// received (its answer).
    fn call(&mut self, id: u64, body: &[u8]) -> Vec<u8> {
        let mut message = vec![0u8; wire::HEADER_LEN + body.len()];
        let n = wire::encode_inline(&mut message, Kind::Request, id, body);
        self.send(&message[..n]);
        self.receive().expect("an answer")
    }

    /// The next message received, or `None` if the connection failed.
    fn receive(&mut self) -> Option<Vec<u8>> {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            let mut out = Vec::new();
            if self.ring.completion().reap(&mut out).is_err() {
                return None;
            }
            for c in out {
                if c.user_data() == 1 {
                    if !c.status().is_success() {
                        return None;
                    }
                    let n = c.byte_len() as usize;
                    return Some(c.buf()[..n].to_vec());
                }
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        panic!("nothing arrived");
    }
}

/// Large responses clients leave unreleased are bounded over the whole
/// server (`max_exposed`): past it, a call is answered `Busy`, and once
/// one is released the next goes out.
#[test]
fn large_responses_left_unreleased_are_bounded_over_the_server() {
    let dev = SoftDevice::new();
    let config = RpcConfig {
        max_exposed: 150_000,
        ..RpcConfig::default()
    };
    let server = RpcServer::soft(&dev, Service::handler(scripted), config).unwrap();
    let mut raw = RawClient::new(&server);
    let kind = |answer: &[u8]| wire::Header::decode(answer).unwrap().kind;
    // The first is exposed and never released; the second would go past.
    assert_eq!(kind(&raw.call(1, b"big:100000")), Kind::ResponseRendezvous);
    match Message::decode(&raw.call(2, b"big:100000")) {
        Ok(Message::Error { id: 2, code, text }) => {
            assert_eq!(code, wire::ErrorCode::Busy);
            assert!(text.contains("max_exposed"), "{text}");
        }
        other => panic!("expected Busy, got {other:?}"),
    }
    // A client that reads and releases its responses is served once the
    // first one is released.
    let mut message = vec![0u8; 64];
    let n = wire::encode_with_aux(&mut message, Kind::Release, 3, 1, b"");
    raw.send(&message[..n]);
    assert_eq!(
        wire::Header::decode(&raw.receive().unwrap()).unwrap().kind,
        Kind::Released
    );
    assert_eq!(kind(&raw.call(4, b"big:100000")), Kind::ResponseRendezvous);
}

fn protocol_error(bytes: &[u8]) -> String {
    match Message::decode(bytes) {
        Ok(Message::Error { id: 0, text, .. }) => text.to_string(),
        other => panic!("expected a connection error, got {other:?}"),
    }
}

#[test]
fn hostile_clients_are_told_and_cut_off_and_others_are_served() {
    let dev = SoftDevice::new();
    let server = RpcServer::soft(&dev, Service::handler(echo), RpcConfig::default()).unwrap();
    let good = server.connect_soft().unwrap();
    let mut buf = vec![0u8; 256];

    // Garbage.
    let mut raw = RawClient::new(&server);
    raw.send(b"GET / HTTP/1.1\r\n\r\n_________");
    assert!(protocol_error(&raw.receive().unwrap()).contains("magic"));

    // A truncated message: the header announces more than arrived.
    let mut raw = RawClient::new(&server);
    let n = wire::encode_inline(&mut buf, Kind::Request, 1, b"0123456789");
    raw.send(&buf[..n - 3]);
    assert!(protocol_error(&raw.receive().unwrap()).contains("carries"));

    // A server-only message.
    let mut raw = RawClient::new(&server);
    let n = wire::encode_inline(&mut buf, Kind::Response, 1, b"x");
    raw.send(&buf[..n]);
    assert!(protocol_error(&raw.receive().unwrap()).contains("server message"));

    // A window overrun: 17 requests at once against a window of 16, in
    // one doorbell. A flood takes shared receive buffers from everyone,
    // so the server cuts it off at once, without a word.
    let mut raw = RawClient::new(&server);
    for i in 0..17u64 {
        let mut chunk = raw.pool.take().unwrap();
        let n = wire::encode_inline(&mut chunk, Kind::Request, i + 1, b"r");
        use rdma_ring::buf::BaseBuf;
        raw.ring
            .submission()
            .push(Send::new(chunk.slice(..n)).user_data(2))
            .unwrap();
    }
    raw.ring.submit().unwrap();
    wait_for("the flood to be cut off", || {
        server.stats().protocol_errors == 4
    });

    wait_for("the four violators to be closed", || {
        server.stats().clients_closed == 4
    });
    let mut raw = RawClient::new(&server);
    let lie = rdma_ring::buf::RemoteSlice::new(0x1000, 100_000, 0xdead, RemoteAccess::READ);
    let n = wire::encode_rendezvous(&mut buf, Kind::RequestRendezvous, 1, &lie);
    raw.send(&buf[..n]);
    wait_for("the liar to be cut off", || {
        server.stats().clients_closed == 5
    });

    assert_eq!(good.call(b"unharmed").unwrap(), b"unharmed");
    let stats = server.stats();
    assert_eq!(stats.protocol_errors, 4, "{stats:?}");
    server.shutdown().unwrap();
    assert_nothing_leaked();
}

/// An echo server, a well-behaved client of it, and the queue pair of a
/// raw one (with its protection domain) to misbehave with.
fn server_good_and_raw() -> (
    RpcServer<SoftQp>,
    RpcClient<SoftQp>,
    SoftQp,
    Arc<rdma_ring::backend::soft::SoftPd>,
) {
    let dev = SoftDevice::new();
    let server = RpcServer::soft(&dev, Service::handler(echo), RpcConfig::default()).unwrap();
    let good = server.connect_soft().unwrap();
    let (qp, pd) = server.connect_soft_raw(QpConfig::default()).unwrap();
    // Attached (its hello on the way, unread): a message sent before the
    // server takes the connection in is not the protocol's (a client
    // speaks after the hello), and the server counts nothing of it.
    wait_for("the raw client to be attached", || {
        server.stats().clients_accepted == 2
    });
    (server, good, qp, pd)
}

/// The raw client alone was cut off, for one protocol violation, and the
/// good one is still served.
fn only_the_raw_client_was_cut_off(
    server: RpcServer<SoftQp>,
    good: &RpcClient<SoftQp>,
    raw: Ring<SoftQp>,
) {
    wait_for("the client to be closed", || {
        server.stats().clients_closed == 1
    });
    let stats = server.stats();
    assert_eq!(stats.protocol_errors, 1, "{stats:?}");
    assert_eq!(good.call(b"unharmed").unwrap(), b"unharmed");
    drop(raw);
    server.shutdown().unwrap();
}

/// A client's message longer than the buffer size the hello gave fails
/// its receive on the device: the server counts a protocol violation,
/// closes that connection, and serves the others.
#[test]
fn a_message_longer_than_the_hello_allows_is_a_violation() {
    let (server, good, qp, pd) = server_good_and_raw();
    let mut ring = Ring::new(qp, RingConfig::default());
    let size = RpcConfig::default().buffer_size as usize;
    let mut big = vec![0u8; size + 1];
    wire::encode_inline(&mut big, Kind::Request, 1, b"r");
    let big = RegisteredBuf::new(&*pd, big).unwrap();
    ring.submission().push(Send::new(big).user_data(2)).unwrap();
    ring.submit().unwrap();
    only_the_raw_client_was_cut_off(server, &good, ring);
}

/// A client's RDMA WRITE with immediate uses up one of the server's
/// receives, whose buffer holds what an earlier message left there: a
/// violation, not a message read from stale bytes.
#[test]
fn a_write_with_immediate_is_a_violation() {
    let dev = SoftDevice::new();
    let server = RpcServer::soft(&dev, Service::handler(echo), RpcConfig::default()).unwrap();
    let good = server.connect_soft().unwrap();
    let mut raw = RawClient::new(&server);
    assert_eq!(good.call(b"before").unwrap(), b"before");
    let chunk = raw.pool.take().unwrap();
    let nowhere = rdma_ring::buf::RemoteSlice::new(0x1000, 0, 1, RemoteAccess::WRITE);
    use rdma_ring::buf::BaseBuf;
    raw.ring
        .submission()
        .push(rdma_ring::op::WriteImm::new(chunk.slice(..0), nowhere, 7).user_data(2))
        .unwrap();
    raw.ring.submit().unwrap();
    let why = protocol_error(&raw.receive().unwrap());
    assert!(why.contains("WRITE with immediate"), "{why}");
    assert_eq!(good.call(b"unharmed").unwrap(), b"unharmed");
    assert_eq!(server.stats().protocol_errors, 1);
    server.shutdown().unwrap();
}

/// A client that closes and goes on sending (here before it has even
/// read the server's hello, so the connection lingers while that is
/// retried) is cut off as a flood is, not ignored while it takes shared
/// receive buffers.
#[test]
fn a_client_that_floods_after_closing_is_cut_off() {
    // Attached (see the helper), so what follows meets an open connection
    // that then closes.
    let (server, good, qp, pd) = server_good_and_raw();
    let pool = BufferPool::new(&*pd, 64, 64).unwrap();
    let mut ring = Ring::new(qp, RingConfig::default());
    let mut sq = ring.submission();
    for i in 0..41u64 {
        let mut chunk = pool.take().unwrap();
        let n = if i == 0 {
            wire::encode_inline(&mut chunk, Kind::Close, 0, b"")
        } else {
            wire::encode_inline(&mut chunk, Kind::Request, i, b"r")
        };
        use rdma_ring::buf::BaseBuf;
        sq.push(Send::new(chunk.slice(..n)).user_data(2)).unwrap();
    }
    sq.submit().unwrap();
    only_the_raw_client_was_cut_off(server, &good, ring);
}

/// A connect timeout of zero would time every client out at once: the
/// config is refused.
#[test]
fn a_zero_connect_timeout_is_refused() {
    let config = RpcConfig {
        connect_timeout: Duration::ZERO,
        ..RpcConfig::default()
    };
    match RpcServer::soft(&SoftDevice::new(), Service::handler(echo), config) {
        Err(err) => assert!(err.to_string().contains("connect_timeout"), "{err}"),
        Ok(_) => panic!("a server with no time to connect"),
    }
}

#[test]
fn unreleased_large_responses_expire() {
    let dev = SoftDevice::new();
    let config = RpcConfig {
        release_timeout: Duration::from_millis(200),
        ..RpcConfig::default()
    };
    let server = RpcServer::soft(&dev, Service::handler(scripted), config).unwrap();
    let mut raw = RawClient::new(&server);
    match Message::decode(&raw.call(1, b"big:100000")) {
        Ok(Message::ResponseRendezvous { id: 1, remote }) => assert_eq!(remote.len(), 100_000),
        other => panic!("expected a rendezvous response, got {other:?}"),
    }
    // Never released: the server frees it after the timeout.
    wait_for("the expiry", || server.stats().releases_expired == 1);
}

#[test]
fn busy_wakeup_clients_work_without_a_notifier() {
    let dev = SoftDevice::new();
    let server = RpcServer::soft(&dev, Service::handler(echo), RpcConfig::default()).unwrap();
    let client = server
        .connect_soft_with(RpcConfig {
            wakeup: Wakeup::Busy,
            ..RpcConfig::default()
        })
        .unwrap();
    let got = futures::executor::block_on(futures::future::join_all(
        (0..32u8).map(|i| client.call_async(&[i; 33])),
    ));
    for (i, r) in got.into_iter().enumerate() {
        assert_eq!(r.unwrap(), vec![i as u8; 33]);
    }
}

#[test]
fn callers_that_sleep_at_once_are_woken_in_every_wakeup_mode() {
    // spin_polls 0: every blocking call parks at once, so the wake-up
    // path (the notifier, or the caller sleeping on the channel itself)
    // carries every answer.
    let dev = SoftDevice::new();
    let server = RpcServer::soft(&dev, Service::handler(echo), RpcConfig::default()).unwrap();
    for wakeup in [Wakeup::Thread, Wakeup::Reactor, Wakeup::Busy] {
        let client = server
            .connect_soft_with(RpcConfig {
                wakeup,
                spin_polls: 0,
                call_timeout: Duration::from_secs(10),
                ..RpcConfig::default()
            })
            .unwrap();
        let threads: Vec<_> = (0..3u8)
            .map(|t| {
                let client = client.clone();
                std::thread::spawn(move || {
                    for i in 0..50u8 {
                        let req = [t, i, 7];
                        assert_eq!(client.call(&req).unwrap(), req, "{wakeup:?}");
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        if wakeup == Wakeup::Thread {
            // Awaited calls are woken by the notifier too.
            let got = futures::executor::block_on(futures::future::join_all(
                (0..20u8).map(|i| client.call_async(&[i])),
            ));
            for (i, r) in got.into_iter().enumerate() {
                assert_eq!(r.unwrap(), [i as u8]);
            }
        }
    }
}

#[test]
fn shutdown_is_prompt_when_clients_close_and_bounded_when_they_do_not() {
    let dev = SoftDevice::new();
    // A release timeout far above any stall of a loaded machine, so a
    // shutdown that waited it out cannot pass for a prompt one.
    let patient = RpcConfig {
        release_timeout: Duration::from_secs(30),
        ..RpcConfig::default()
    };
    let server = RpcServer::soft(&dev, Service::handler(echo), patient).unwrap();
    // An idle client with a notifier answers the goodbye with a close.
    let polite = server.connect_soft().unwrap();
    assert_eq!(polite.call(b"x").unwrap(), b"x");
    let t0 = Instant::now();
    server.shutdown().unwrap();
    assert!(t0.elapsed() < Duration::from_secs(15), "{:?}", t0.elapsed());
    assert_eq!(server.stats().clients_left, 1);

    let config = RpcConfig {
        release_timeout: Duration::from_millis(1500),
        ..RpcConfig::default()
    };

    // A client nobody polls (busy wake-up, no notifier) never answers:
    // the server waits its release timeout, then lets it go.
    let server = RpcServer::soft(&dev, Service::handler(echo), config).unwrap();
    let silent = server
        .connect_soft_with(RpcConfig {
            wakeup: Wakeup::Busy,
            ..config
        })
        .unwrap();
    assert_eq!(silent.call(b"y").unwrap(), b"y");
    let t0 = Instant::now();
    server.shutdown().unwrap();
    let took = t0.elapsed();
    assert!(
        (Duration::from_millis(1500)..Duration::from_secs(5)).contains(&took),
        "{took:?}"
    );
    assert_eq!(server.stats().clients_left, 0);
    assert!(silent.call(b"z").is_err());
}

/// A client that goes on calling through a shutdown, its whole window in
/// flight (each call answered `ShuttingDown`, each answer followed by the
/// next call), is refused each time, and the shutdown still ends soon
/// after the release timeout. (On the soft device the poller still finds
/// a quiet pass now and then; on a NIC a caller could keep every pass
/// busy, which the poller's bound of a second grace covers.)
#[test]
fn a_client_that_goes_on_calling_does_not_hold_up_shutdown_for_ever() {
    let dev = SoftDevice::new();
    let config = RpcConfig {
        release_timeout: Duration::from_millis(200),
        ..RpcConfig::default()
    };
    let server = RpcServer::soft(&dev, Service::handler(echo), config).unwrap();
    let mut raw = RawClient::new(&server);
    let refused = Arc::new(AtomicUsize::new(0));
    let answered = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let caller = {
        let (refused, answered, stop) = (refused.clone(), answered.clone(), stop.clone());
        std::thread::spawn(move || {
            let give_up = Instant::now() + Duration::from_secs(20);
            let mut next_id = 1u64;
            // Pushes the next call; false once the connection failed.
            let mut call = |raw: &mut RawClient| {
                use rdma_ring::buf::BaseBuf;
                let mut chunk = raw.pool.take().unwrap();
                let n = wire::encode_inline(&mut chunk, Kind::Request, next_id, b"again");
                next_id += 1;
                let send = Send::new(chunk.slice(..n)).user_data(2);
                raw.ring.submission().push(send).is_ok() && raw.ring.submit().is_ok()
            };
            // The whole window in flight at all times: each answer (or
            // refusal) is followed by the next call at once.
            for _ in 0..16 {
                call(&mut raw);
            }
            let mut heard = Instant::now();
            while !stop.load(Ordering::Acquire) && Instant::now() < give_up {
                if heard.elapsed() > Duration::from_secs(1) {
                    break; // the server is gone
                }
                let mut out = Vec::new();
                if raw.ring.completion().reap(&mut out).is_err() {
                    break;
                }
                for c in out.into_iter().filter(|c| c.user_data() == 1) {
                    if !c.status().is_success() {
                        return;
                    }
                    heard = Instant::now();
                    let answer = match Message::decode(&c.buf()[..c.byte_len() as usize]) {
                        Ok(Message::Response { .. }) => true,
                        Ok(Message::Error { code, .. }) => {
                            assert_eq!(code, wire::ErrorCode::ShuttingDown);
                            refused.fetch_add(1, Ordering::AcqRel);
                            true
                        }
                        Ok(Message::Goodbye) => false,
                        other => panic!("unexpected {other:?}"),
                    };
                    drop(c);
                    let recv = Recv::new(raw.pool.take().unwrap()).user_data(1);
                    if raw.ring.submission().push(recv).is_err() {
                        return;
                    }
                    if answer {
                        answered.fetch_add(1, Ordering::AcqRel);
                        if !call(&mut raw) {
                            return;
                        }
                    }
                }
                if raw.ring.submit().is_err() {
                    return;
                }
            }
        })
    };
    wait_for("calls to be answered", || {
        answered.load(Ordering::Acquire) >= 10
    });
    let t0 = Instant::now();
    server.shutdown().unwrap();
    let took = t0.elapsed();
    stop.store(true, Ordering::Release);
    caller.join().unwrap();
    assert!(refused.load(Ordering::Acquire) > 0, "no call was refused");
    assert!(took < Duration::from_secs(6), "{took:?}");
}

#[test]
fn a_handler_future_that_never_finishes_does_not_hold_up_shutdown() {
    let dev = SoftDevice::new();
    let (handler, _waiting, started) = gate();
    let config = RpcConfig {
        release_timeout: Duration::from_millis(300),
        ..RpcConfig::default()
    };
    let server = RpcServer::soft(&dev, Service::async_handler(handler), config).unwrap();
    let client = server.connect_soft().unwrap();
    let call = client.call_async(b"forever");
    wait_for("the call to start", || started.load(Ordering::SeqCst) == 1);
    let t0 = Instant::now();
    server.shutdown().unwrap();
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
    // The call fails rather than hangs: the connection is gone.
    assert!(futures::executor::block_on(call).is_err());
}

#[test]
fn a_window_of_abandoned_calls_fails_the_connection_clearly() {
    let dev = SoftDevice::new();
    let (server, _waiting, _started) = gated_server_of_window_2(&dev);
    let client = server
        .connect_soft_with(RpcConfig {
            call_timeout: Duration::from_millis(100),
            ..RpcConfig::default()
        })
        .unwrap();
    assert_eq!(client.window(), 2);
    for _ in 0..2 {
        assert!(matches!(client.call(b"never"), Err(RpcError::Timeout(_))));
    }
    // It waits for the abandoned calls' answers, for a call timeout, then
    // the connection fails.
    let t0 = Instant::now();
    match client.call_with_timeout(b"stuck", Duration::from_secs(10)) {
        Err(RpcError::Disconnected(why)) => assert!(why.contains("whole window"), "{why}"),
        other => panic!("expected Disconnected, got {other:?}"),
    }
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
}

/// Calls abandoned before their answers came (dropped futures, as a
/// `select!` drops them) hold the window only until the server answers:
/// a call made meanwhile waits for a slot rather than failing the
/// connection.
#[test]
fn a_window_of_dropped_calls_answered_late_does_not_fail_the_connection() {
    let dev = SoftDevice::new();
    let (server, waiting, started) = gated_server_of_window_2(&dev);
    let client = server.connect_soft().unwrap();
    for _ in 0..2 {
        drop(client.call_async(b"dropped"));
    }
    wait_for("both calls to start", || {
        started.load(Ordering::SeqCst) == 2
    });
    let next = {
        let client = client.clone();
        std::thread::spawn(move || client.call(b"next"))
    };
    std::thread::sleep(Duration::from_millis(100));
    // The slow handler answers: the dropped calls' slots come back.
    for gate in waiting.lock().unwrap().drain(..) {
        gate.send(()).unwrap();
    }
    wait_for("the next call to start", || {
        started.load(Ordering::SeqCst) == 3
    });
    for gate in waiting.lock().unwrap().drain(..) {
        gate.send(()).unwrap();
    }
    assert_eq!(next.join().unwrap().unwrap(), b"next");
}

#[test]
fn a_future_nobody_polls_still_reads_its_large_response_in_time() {
    // The notifier posts the rendezvous read on the client's behalf, so
    // the server's release timeout cannot pass before the read: the
    // server answers the release while the future is yet to be polled.
    let dev = SoftDevice::new();
    let config = RpcConfig {
        release_timeout: Duration::from_secs(2),
        ..RpcConfig::default()
    };
    let server = RpcServer::soft(&dev, Service::handler(scripted), config).unwrap();
    let client = server.connect_soft().unwrap();
    let call = client.call_async(b"big:300000");
    wait_for("the release", || server.stats().answers == 2);
    assert_eq!(server.stats().releases_expired, 0);
    let resp = futures::executor::block_on(call).unwrap();
    assert_eq!(resp.len(), 300_000);
}

#[test]
fn a_client_hoarding_large_responses_is_refused_more() {
    let dev = SoftDevice::new();
    let config = RpcConfig {
        window: 4,
        ..RpcConfig::default()
    };
    let server = RpcServer::soft(&dev, Service::handler(scripted), config).unwrap();
    let mut raw = RawClient::new(&server);
    // One at a time (within the window), never released: the server
    // keeps at most twice the window of them.
    for id in 1..=9u64 {
        let answer = raw.call(id, b"big:10000");
        match Message::decode(&answer).unwrap() {
            Message::ResponseRendezvous { id: got, .. } if id <= 8 => assert_eq!(got, id),
            Message::Error { id: 9, code, text } => {
                assert_eq!(code, wire::ErrorCode::Busy);
                assert!(text.contains("not released"), "{text}");
            }
            other => panic!("call {id}: unexpected {other:?}"),
        }
    }
}

/// A waker that panics when woken on another thread than its own (once
/// it has said so).
struct PanickingWaker {
    home: std::thread::ThreadId,
    woken_elsewhere: std::sync::atomic::AtomicBool,
}

impl std::task::Wake for PanickingWaker {
    fn wake(self: Arc<Self>) {
        if std::thread::current().id() != self.home {
            self.woken_elsewhere.store(true, Ordering::SeqCst);
            panic!("a waker that panics");
        }
    }
}

/// A waker that counts its wakes.
#[derive(Default)]
struct CountingWaker(AtomicUsize);

impl std::task::Wake for CountingWaker {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// The client's notifier thread runs the wakers of awaiting tasks: one
/// that panics does not stop it (nor keep the driving token from blocking
/// callers), and calls awaited later are still woken.
#[test]
fn a_panicking_waker_does_not_stop_the_notifier() {
    use std::future::Future;
    use std::task::{Context, Poll, Waker};
    let dev = SoftDevice::new();
    let (handler, waiting, started) = gate();
    let server =
        RpcServer::soft(&dev, Service::async_handler(handler), RpcConfig::default()).unwrap();
    let client = server.connect_soft().unwrap();
    let release = |n: usize| {
        wait_for("the call to reach the handler", || {
            started.load(Ordering::SeqCst) == n
        });
        for gate in waiting.lock().unwrap().drain(..) {
            gate.send(()).unwrap();
        }
    };
    // Held by the server, the call waits; the notifier's tick wakes every
    // waiting task (to look at its deadline), and this one's waker panics.
    let mut first = Box::pin(client.call_async(b"first"));
    let panics = Arc::new(PanickingWaker {
        home: std::thread::current().id(),
        woken_elsewhere: Default::default(),
    });
    let panicking = Waker::from(Arc::clone(&panics));
    wait_for("the notifier to wake the held call", || {
        assert!(first
            .as_mut()
            .poll(&mut Context::from_waker(&panicking))
            .is_pending());
        std::thread::sleep(Duration::from_millis(20));
        panics.woken_elsewhere.load(Ordering::SeqCst)
    });
    release(1);
    let mut later = Box::pin(client.call_async(b"later"));
    let woken = Arc::new(CountingWaker::default());
    let waker = Waker::from(Arc::clone(&woken));
    wait_for("the later call to reach the handler", || {
        started.load(Ordering::SeqCst) == 2
    });
    // Polled before its answer can come, and then only when woken: every
    // wake here is the notifier's (some spurious: every waiting task is
    // woken by any answer, and looks for its own).
    let mut polls = 0;
    let answer = loop {
        let before = woken.0.load(Ordering::SeqCst);
        match later.as_mut().poll(&mut Context::from_waker(&waker)) {
            Poll::Ready(answer) => break answer,
            Poll::Pending => {
                polls += 1;
                if polls == 1 {
                    release(2);
                }
                wait_for("the notifier to wake the later call", || {
                    woken.0.load(Ordering::SeqCst) > before
                });
            }
        }
    };
    assert_eq!(answer.unwrap(), b"later");
    let noop = &mut Context::from_waker(Waker::noop());
    let Poll::Ready(answer) = first.as_mut().poll(noop) else {
        panic!("the first call was answered, and its future is pending");
    };
    assert_eq!(answer.unwrap(), b"first");
    let blocking = std::thread::spawn({
        let client = client.clone();
        move || client.call(b"blocking")
    });
    release(3);
    assert_eq!(blocking.join().unwrap().unwrap(), b"blocking");
}
