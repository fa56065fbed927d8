//! The conformance suite on a real verbs device — Soft-RoCE's `rxe0` in
//! the VM that `scripts/test` boots (`scripts/softroce`), or the device
//! named by `RDMA_RING_DEVICE`. These tests need a device, so they are
//! ignored in a plain `cargo test`; `scripts/test` runs them in the VM with
//! `--include-ignored`, where a missing device fails them loudly.
#![cfg(feature = "verbs")]

mod conformance;
mod rxe;

use std::net::{TcpListener, TcpStream};
use std::time::Duration;

use conformance::Fabric;
use rdma_ring::backend::verbs::{
    VerbsAsyncEvents, VerbsCq, VerbsDevice, VerbsPd, VerbsQp, VerbsSrq,
};
use rdma_ring::backend::{QpConfig, SrqConfig};
use rdma_ring::connect::tcp;
use rxe::rnr_naks;

struct Verbs {
    dev: VerbsDevice,
    pd: VerbsPd,
}

impl Verbs {
    fn new() -> Verbs {
        let name = std::env::var("RDMA_RING_DEVICE").unwrap_or_else(|_| "rxe0".into());
        let dev = VerbsDevice::open(&name).unwrap_or_else(|e| {
            panic!(
                "NO RDMA DEVICE: cannot open {name:?} ({e}). These tests need a device: \
                 run them in the Soft-RoCE VM (scripts/test does, through scripts/softroce)"
            )
        });
        let pd = dev.alloc_pd().unwrap();
        Verbs { dev, pd }
    }
}

impl Fabric for Verbs {
    type Qp = VerbsQp;
    type Pd = VerbsPd;
    type Events = VerbsAsyncEvents;
    fn cq(&self, entries: u32) -> VerbsCq {
        self.dev.create_cq(entries).unwrap()
    }
    fn srq(&self, config: SrqConfig) -> VerbsSrq {
        self.dev.create_srq(&self.pd, config).unwrap()
    }
    /// A queue pair on `cq`, connected manually to a new one with a
    /// completion queue of its own.
    fn pair_on(
        &self,
        cq: &VerbsCq,
        srq: Option<&VerbsSrq>,
        config: QpConfig,
    ) -> (VerbsQp, VerbsQp) {
        let a = self.dev.create_qp_on(&self.pd, cq, srq, config).unwrap();
        let b = self.dev.create_qp(&self.pd, config).unwrap();
        let (ea, eb) = (a.endpoint(), b.endpoint());
        a.connect(&eb).unwrap();
        b.connect(&ea).unwrap();
        (a, b)
    }
    fn qp_on(
        &self,
        cq: &VerbsCq,
        srq: Option<&VerbsSrq>,
        config: QpConfig,
    ) -> Result<VerbsQp, rdma_ring::Error> {
        self.dev.create_qp_on(&self.pd, cq, srq, config)
    }
    fn events(&self) -> VerbsAsyncEvents {
        self.dev.async_events().unwrap()
    }
    fn pd(&self) -> &VerbsPd {
        &self.pd
    }
    /// Two queue pairs on one device, connected manually (endpoint records
    /// handed over in memory).
    fn pair(&self, config: QpConfig) -> (VerbsQp, VerbsQp) {
        let a = self.dev.create_qp(&self.pd, config).unwrap();
        let b = self.dev.create_qp(&self.pd, config).unwrap();
        let (ea, eb) = (a.endpoint(), b.endpoint());
        a.connect(&eb).unwrap();
        b.connect(&ea).unwrap();
        (a, b)
    }
}

conformance_tests!(Verbs::new(), #[ignore = "needs an RDMA device: scripts/test runs it in the Soft-RoCE VM"]);

/// A queue pair's completion queue and protection domain must come from
/// one opening of the device: libibverbs names the queue to the kernel by
/// a handle of its own context, which in another context names another
/// queue (or none), so the backend refuses the mix.
#[test]
#[ignore = "needs an RDMA device: scripts/test runs it in the Soft-RoCE VM"]
fn a_queue_pair_across_two_openings_of_a_device_is_refused() {
    let (a, b) = (Verbs::new(), Verbs::new());
    let cq_a = a.dev.create_cq(16).unwrap();
    let mixed = b.dev.create_qp_on(&b.pd, &cq_a, None, QpConfig::default());
    let err = mixed.expect_err("a completion queue of another opening");
    assert!(err.to_string().contains("different"), "{err}");
    assert!(
        b.dev.create_qp(&a.pd, QpConfig::default()).is_err(),
        "a domain of another opening"
    );
    assert!(a
        .dev
        .create_qp_on(&a.pd, &cq_a, None, QpConfig::default())
        .is_ok());
    assert!(b.dev.create_qp(&b.pd, QpConfig::default()).is_ok());
}

/// A queue pair's caps carry the port's message limit and the device's
/// RDMA READ elements, and a WRITE past the limit is refused at push (its
/// buffer handed back) rather than posted to put the queue pair in error.
#[test]
#[ignore = "needs an RDMA device: scripts/test runs it in the Soft-RoCE VM"]
fn a_queue_pair_carries_the_port_s_message_limit_and_the_device_s_read_elements() {
    use rdma_ring::backend::QueuePair;
    use rdma_ring::buf::{ExposedBuf, RegisteredBuf, RemoteAccess};
    use rdma_ring::op::{Write, MAX_MESSAGE_LEN};
    use rdma_ring::ring::{Ring, RingConfig};
    let v = Verbs::new();
    let config = QpConfig {
        max_send_sge: 4,
        ..QpConfig::default()
    };
    let (a, _b) = v.pair(config);
    let caps = a.caps();
    let limits = v.dev.limits();
    eprintln!(
        "{}: max_message {:#x}, max_read_sge {} (device max_sge_rd {}), max_send_sge {}",
        v.dev.name(),
        caps.max_message,
        caps.max_read_sge,
        limits.max_sge_rd,
        caps.max_send_sge
    );
    assert!(caps.max_message > 0 && caps.max_message as usize <= MAX_MESSAGE_LEN);
    assert!(
        limits.max_sge_rd > 0,
        "the device reports its READ elements"
    );
    assert_eq!(
        caps.max_read_sge,
        caps.max_send_sge.min(limits.max_sge_rd),
        "{caps:?}"
    );
    if (caps.max_message as usize) < MAX_MESSAGE_LEN && caps.max_message <= 64 << 20 {
        let len = caps.max_message as usize + 1;
        let mut ring = Ring::new(a, RingConfig::default());
        let target = ExposedBuf::new(&v.pd, vec![0u8; len], RemoteAccess::WRITE).unwrap();
        let data = RegisteredBuf::new(&v.pd, vec![1u8; len]).unwrap();
        let refused = ring
            .submission()
            .push(Write::new(data, target.remote()))
            .unwrap_err();
        assert!(
            matches!(refused.error(), rdma_ring::Error::TooLong { .. }),
            "{}",
            refused.error()
        );
        assert_eq!(refused.into_value().into_buf().len(), len);
    } else {
        eprintln!("the port carries 2^31-byte messages: nothing smaller to refuse");
    }
}

/// A device reports no inline limit; asked for more inline data than it
/// takes, the backend asks again for less, and the queue pair's caps say
/// what it got: an inline write of that size runs, one byte more is
/// refused at push with its buffer handed back.
#[test]
#[ignore = "needs an RDMA device: scripts/test runs it in the Soft-RoCE VM"]
fn more_inline_data_than_the_device_takes_is_asked_for_again_by_halves() {
    use rdma_ring::backend::QueuePair;
    use rdma_ring::buf::{ExposedBuf, RegisteredBuf, RemoteAccess};
    use rdma_ring::op::Write;
    use rdma_ring::ring::{Ring, RingConfig};
    let v = Verbs::new();
    // Far past any device's inline room (rxe takes a few hundred bytes).
    let asked = 1 << 20;
    let config = QpConfig {
        max_inline_data: asked,
        ..QpConfig::default()
    };
    let (a, _b) = v.pair(config);
    let got = a.caps().max_inline_data;
    eprintln!(
        "{}: asked for {asked} bytes inline, got {got}",
        v.dev.name()
    );
    assert!(got > 0 && got < asked, "{got}");
    assert!(asked % got == 0, "a halving of the request: {got}");
    let mut ring = Ring::new(a, RingConfig::default());
    let len = got as usize;
    let target = ExposedBuf::new(&v.pd, vec![0u8; len + 1], RemoteAccess::WRITE).unwrap();
    let too_long = RegisteredBuf::new(&v.pd, vec![2u8; len + 1]).unwrap();
    let refused = ring
        .submission()
        .push(Write::new(too_long, target.remote()).inline())
        .unwrap_err();
    assert!(
        matches!(refused.error(), rdma_ring::Error::InlineTooLarge { .. }),
        "{}",
        refused.error()
    );
    assert_eq!(refused.into_value().into_buf().len(), len + 1);
    let data = RegisteredBuf::new(&v.pd, vec![1u8; len]).unwrap();
    let remote = target.remote().slice(0..len as u64).unwrap();
    ring.submission()
        .push(Write::new(data, remote).inline().signaled())
        .unwrap();
    ring.submit().unwrap();
    let done = ring.completion().wait(1).unwrap();
    assert!(done[0].status().is_success(), "{:?}", done[0].status());
    drop(done);
    let bytes = target.into_inner().unwrap();
    assert!(bytes[..len].iter().all(|&b| b == 1) && bytes[len] == 0);
}

/// The TCP handshake connects two queue pairs: each side in its own
/// thread, endpoints exchanged over loopback TCP, then a SEND crosses.
#[test]
#[ignore = "needs an RDMA device: scripts/test runs it in the Soft-RoCE VM"]
fn connects_over_a_tcp_handshake() {
    use rdma_ring::buf::RegisteredBuf;
    use rdma_ring::op::{Recv, Send};
    use rdma_ring::ring::{Ring, RingConfig};

    let fabric = Verbs::new();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let timeout = Duration::from_secs(30);
    let server_qp = fabric
        .dev
        .create_qp(&fabric.pd, QpConfig::default())
        .unwrap();
    let client_qp = fabric
        .dev
        .create_qp(&fabric.pd, QpConfig::default())
        .unwrap();
    let server = std::thread::spawn(move || {
        let qp = server_qp;
        let (mut stream, _) = listener.accept().unwrap();
        let remote = tcp::exchange(&mut stream, &qp.endpoint(), timeout).unwrap();
        qp.connect(&remote).unwrap();
        (qp, stream)
    });
    let qp = client_qp;
    let mut stream = TcpStream::connect(addr).unwrap();
    let remote = tcp::exchange(&mut stream, &qp.endpoint(), timeout).unwrap();
    qp.connect(&remote).unwrap();
    let (server_qp, mut server_stream) = server.join().unwrap();

    let mut server_ring = Ring::new(server_qp, RingConfig::default());
    server_ring
        .submission()
        .push(Recv::new(
            RegisteredBuf::new(&fabric.pd, vec![0u8; 64]).unwrap(),
        ))
        .unwrap();
    server_ring.submission().submit().unwrap();
    let ready = std::thread::spawn(move || tcp::ready(&mut server_stream, timeout));
    tcp::ready(&mut stream, timeout).unwrap();
    ready.join().unwrap().unwrap();

    let mut client_ring = Ring::new(qp, RingConfig::default());
    client_ring
        .submission()
        .push(Send::new(
            RegisteredBuf::new(&fabric.pd, b"over tcp".to_vec()).unwrap(),
        ))
        .unwrap();
    client_ring.submission().submit().unwrap();
    assert!(client_ring.completion().wait(1).unwrap()[0]
        .status()
        .is_success());
    let got = server_ring.completion().wait(1).unwrap().pop().unwrap();
    assert_eq!(&got.buf()[..got.byte_len() as usize], b"over tcp");
}

/// A peer that speaks garbage during the handshake gets a clear error.
#[test]
#[ignore = "needs an RDMA device: scripts/test runs it in the Soft-RoCE VM"]
fn a_garbage_peer_is_refused() {
    use std::io::{Read, Write};
    let fabric = Verbs::new();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let peer = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut theirs = [0u8; 32];
        s.read_exact(&mut theirs).unwrap();
        s.write_all(&[0xff; 32]).unwrap();
    });
    let qp = fabric
        .dev
        .create_qp(&fabric.pd, QpConfig::default())
        .unwrap();
    let mut stream = TcpStream::connect(addr).unwrap();
    let err = tcp::exchange(&mut stream, &qp.endpoint(), Duration::from_secs(10)).unwrap_err();
    assert!(
        err.to_string().contains("malformed endpoint record"),
        "{err}"
    );
    peer.join().unwrap();
}

/// An endpoint made by hand (for a peer of another verbs program) is
/// checked before the device sees it, one the device refuses is the
/// peer's failure, and one that does not say how many READs and atomics
/// the peer answers at once gets one at a time.
#[test]
#[ignore = "needs an RDMA device: scripts/test runs it in the Soft-RoCE VM"]
fn an_endpoint_made_by_hand_is_checked_refused_as_the_peer_s_and_its_unknown_depth_is_one() {
    let fabric = Verbs::new();
    let config = QpConfig::default();
    let a = fabric.dev.create_qp(&fabric.pd, config).unwrap();
    let b = fabric.dev.create_qp(&fabric.pd, config).unwrap();
    let no_mtu = rdma_ring::connect::Endpoint {
        mtu: 0,
        ..b.endpoint()
    };
    let err = a.connect(&no_mtu).unwrap_err();
    assert!(err.to_string().contains("ibv_mtu"), "{err}");
    assert!(!a.is_connected());
    // A GID of zeros gives RoCE no route header: the device refuses it,
    // and the refusal is the peer's record's, not our device's fault.
    let c = fabric.dev.create_qp(&fabric.pd, config).unwrap();
    let unroutable = rdma_ring::connect::Endpoint {
        gid: [0; 16],
        ..b.endpoint()
    };
    match c.connect(&unroutable).unwrap_err() {
        rdma_ring::Error::Handshake { step, reason } => {
            assert_eq!(step, "connecting to the peer's endpoint");
            assert!(reason.contains("ibv_modify_qp(RTR)"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    let unknown = rdma_ring::connect::Endpoint {
        rd_atomic: 0,
        init_rd_atomic: 0,
        ..b.endpoint()
    };
    a.connect(&unknown).unwrap();
    let attrs = a.attributes().unwrap();
    assert_eq!(attrs.max_rd_atomic, 1, "{attrs:?}");
    // Answering more than the peer issues costs nothing: ours.
    assert!(attrs.max_dest_rd_atomic >= 1, "{attrs:?}");
}

/// A queue pair runs with the ACK timeout and retries its config asks
/// for, and our RNR timer, connected by endpoints or through rdma_cm —
/// whose own attributes (an ACK timeout following the path's packet
/// lifetime, an RNR timer of 655 ms) would otherwise decide how soon a
/// dead peer is noticed and how long a sender waits for a receive.
#[test]
#[ignore = "needs an RDMA device: scripts/test runs it in the Soft-RoCE VM"]
fn queue_pairs_run_with_their_config_s_timers_however_connected() {
    use rdma_ring::connect::cm;
    let fabric = Verbs::new();
    // RNR retries of 7 (for ever) are the config's to ask for, as 4 are;
    // each side's counts differ, so that none can come from the peer's.
    // So is the traffic class (each side's its own; the service level
    // asked for here is the class's top three bits).
    let config = |ack_timeout, rnr_retry| {
        let traffic_class = 8 * (ack_timeout + rnr_retry);
        QpConfig {
            ack_timeout,
            retry_cnt: rnr_retry - 2,
            rnr_retry,
            traffic_class,
            service_level: traffic_class >> 5,
            ..QpConfig::default()
        }
    };
    let a = fabric.dev.create_qp(&fabric.pd, config(13, 7)).unwrap();
    let b = fabric.dev.create_qp(&fabric.pd, config(15, 4)).unwrap();
    a.connect(&b.endpoint()).unwrap();
    b.connect(&a.endpoint()).unwrap();
    for (qp, ack_timeout, rnr_retry) in [(&a, 13, 7), (&b, 15, 4)] {
        let attrs = qp.attributes().unwrap();
        assert_eq!(
            (attrs.ack_timeout, attrs.retry_cnt, attrs.rnr_retry),
            (ack_timeout, rnr_retry - 2, rnr_retry),
            "{attrs:?}"
        );
        // The service level is asked for too, but Soft-RoCE keeps none
        // (RoCE packets carry no SL field), so only the class is checked.
        let asked = config(ack_timeout, rnr_retry);
        assert_eq!(attrs.traffic_class, asked.traffic_class, "{attrs:?}");
        // Code 12, 0.64 ms: a sender that found no receive tries again soon.
        assert_eq!(attrs.min_rnr_timer, 12, "{attrs:?}");
        assert!(attrs.path_mtu >= 256, "{attrs:?}");
    }

    let name = std::env::var("RDMA_RING_CM_DEVICE").unwrap_or_else(|_| "rxe1".into());
    let addr: std::net::SocketAddr = "10.99.0.1:7476".parse().unwrap();
    let dev = VerbsDevice::open(&name)
        .unwrap_or_else(|e| panic!("NO RDMA DEVICE {name:?} for rdma_cm: {e}"));
    let pd = dev.alloc_pd().unwrap();
    let timeout = Duration::from_secs(30);
    let listener = cm::CmListener::bind(addr).unwrap();
    let (server_dev, server_pd) = (dev.clone(), pd.clone());
    let server = std::thread::spawn(move || {
        let qp = listener
            .accept(&server_dev, &server_pd, config(14, 4), b"", timeout)
            .unwrap();
        qp.qp().attributes().unwrap()
    });
    let qp = cm::connect(&dev, &pd, addr, config(12, 7), b"", timeout).unwrap();
    let client = qp.qp().attributes().unwrap();
    let server = server.join().unwrap();
    for (attrs, ack_timeout, rnr_retry) in [(client, 12, 7), (server, 14, 4)] {
        assert_eq!(
            (attrs.ack_timeout, attrs.retry_cnt, attrs.rnr_retry),
            (ack_timeout, rnr_retry - 2, rnr_retry),
            "{attrs:?}"
        );
        // The service level is asked for too, but Soft-RoCE keeps none
        // (RoCE packets carry no SL field), so only the class is checked.
        let asked = config(ack_timeout, rnr_retry);
        assert_eq!(attrs.traffic_class, asked.traffic_class, "{attrs:?}");
        // Code 12, 0.64 ms: a sender that found no receive tries again soon.
        assert_eq!(attrs.min_rnr_timer, 12, "{attrs:?}");
    }
}

/// rdma_cm connects two queue pairs, carrying private data both ways; then
/// a SEND with immediate data and an RDMA WRITE cross. rdma_cm cannot route
/// over loopback, so this uses `rxe1` on the VM's guest-only dummy
/// interface (10.99.0.1), or `RDMA_RING_CM_DEVICE` / `RDMA_RING_CM_ADDR`.
#[test]
#[ignore = "needs an RDMA device: scripts/test runs it in the Soft-RoCE VM"]
fn connects_through_rdma_cm() {
    use rdma_ring::buf::{ExposedBuf, RegisteredBuf, RemoteAccess, RemoteSlice};
    use rdma_ring::connect::cm;
    use rdma_ring::op::{Recv, SendImm, Write};
    use rdma_ring::ring::{Ring, RingConfig};

    let name = std::env::var("RDMA_RING_CM_DEVICE").unwrap_or_else(|_| "rxe1".into());
    let addr: std::net::SocketAddr = std::env::var("RDMA_RING_CM_ADDR")
        .unwrap_or_else(|_| "10.99.0.1:7472".into())
        .parse()
        .unwrap();
    let dev = VerbsDevice::open(&name)
        .unwrap_or_else(|e| panic!("NO RDMA DEVICE {name:?} for rdma_cm: {e}"));
    let pd = dev.alloc_pd().unwrap();
    let timeout = Duration::from_secs(30);
    let listener = cm::CmListener::bind(addr).unwrap();

    // The server exposes memory and puts its descriptor in the reply's
    // private data.
    let exposed = ExposedBuf::new(&pd, vec![0u8; 4096], RemoteAccess::WRITE).unwrap();
    let descriptor = exposed.remote().encode();
    let (server_dev, server_pd) = (dev.clone(), pd.clone());
    let server = std::thread::spawn(move || {
        let qp = listener
            .accept(
                &server_dev,
                &server_pd,
                QpConfig::default(),
                &descriptor,
                timeout,
            )
            .unwrap();
        // rdma_cm pads private data to the transport's fixed size.
        assert!(qp.peer_private_data().starts_with(b"hello from the client"));
        let mut ring = Ring::new(qp, RingConfig::default());
        ring.submission()
            .push(Recv::new(
                RegisteredBuf::new(&server_pd, vec![0u8; 64]).unwrap(),
            ))
            .unwrap();
        ring.submission().submit().unwrap();
        let got = ring.completion().wait(1).unwrap().pop().unwrap();
        assert!(got.status().is_success(), "{:?}", got.status());
        (got.imm(), got.buf()[..got.byte_len() as usize].to_vec())
    });

    std::thread::sleep(Duration::from_millis(200));
    let qp = cm::connect(
        &dev,
        &pd,
        addr,
        QpConfig::default(),
        b"hello from the client",
        timeout,
    )
    .unwrap();
    let remote =
        RemoteSlice::decode(&qp.peer_private_data()[..rdma_ring::buf::REMOTE_SLICE_WIRE_LEN])
            .unwrap();
    let mut ring = Ring::new(qp, RingConfig::default());
    ring.submission()
        .push(Write::new(
            RegisteredBuf::new(&pd, vec![0x77u8; 4096]).unwrap(),
            remote,
        ))
        .unwrap();
    // The server posts its receive right after accepting; RNR retries cover
    // the moment before.
    ring.submission()
        .push(SendImm::new(
            RegisteredBuf::new(&pd, b"via rdma_cm".to_vec()).unwrap(),
            3,
        ))
        .unwrap();
    ring.submission().submit().unwrap();
    for c in ring.completion().wait(2).unwrap() {
        assert!(c.status().is_success(), "{:?}", c.status());
    }
    let (imm, payload) = server.join().unwrap();
    assert_eq!((imm, payload.as_slice()), (Some(3), &b"via rdma_cm"[..]));
    // The server's queue pair is gone (it disconnected when dropped): a
    // receive posted now is flushed instead of waiting forever.
    ring.submission()
        .push(Recv::new(RegisteredBuf::new(&pd, vec![0u8; 16]).unwrap()).user_data(8))
        .unwrap();
    ring.submission().submit().unwrap();
    let flushed = ring.completion().wait(1).unwrap().pop().unwrap();
    assert_eq!(
        (flushed.user_data(), flushed.status()),
        (8, rdma_ring::backend::WcStatus::WrFlushErr)
    );
    drop(ring);
    assert!(exposed.into_inner().unwrap().iter().all(|&b| b == 0x77));
}

/// `connect_qp` / `accept_qp` do the whole TCP handshake in one call each.
#[test]
#[ignore = "needs an RDMA device: scripts/test runs it in the Soft-RoCE VM"]
fn connects_with_one_call_per_side() {
    use rdma_ring::buf::RegisteredBuf;
    use rdma_ring::op::{Recv, Send};
    use rdma_ring::ring::{Ring, RingConfig};

    let fabric = Verbs::new();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let timeout = Duration::from_secs(30);
    // A non-blocking listener polls: with nobody waiting, a timeout, not
    // a failure.
    listener.set_nonblocking(true).unwrap();
    let err = tcp::accept_qp(
        &listener,
        &fabric.dev,
        &fabric.pd,
        QpConfig::default(),
        timeout,
    )
    .unwrap_err();
    assert!(
        matches!(err, rdma_ring::Error::HandshakeTimeout { .. }),
        "{err:?}"
    );
    listener.set_nonblocking(false).unwrap();
    let (dev, pd) = (fabric.dev.clone(), fabric.pd.clone());
    let (posted_tx, posted_rx) = std::sync::mpsc::channel();
    let server = std::thread::spawn(move || {
        let qp = tcp::accept_qp(&listener, &dev, &pd, QpConfig::default(), timeout).unwrap();
        let mut ring = Ring::new(qp, RingConfig::default());
        ring.submission()
            .push(Recv::new(RegisteredBuf::new(&pd, vec![0u8; 16]).unwrap()))
            .unwrap();
        ring.submission().submit().unwrap();
        posted_tx.send(()).unwrap();
        let got = ring.completion().wait(1).unwrap().pop().unwrap();
        got.buf()[..got.byte_len() as usize].to_vec()
    });
    let qp = tcp::connect_qp(&fabric.dev, &fabric.pd, addr, QpConfig::default(), timeout).unwrap();
    posted_rx.recv().unwrap();
    let mut ring = Ring::new(qp, RingConfig::default());
    ring.submission()
        .push(Send::new(
            RegisteredBuf::new(&fabric.pd, b"one call".to_vec()).unwrap(),
        ))
        .unwrap();
    ring.submission().submit().unwrap();
    assert!(ring.completion().wait(1).unwrap()[0].status().is_success());
    assert_eq!(server.join().unwrap(), b"one call");
}

/// The listener puts its queue pair in a ring and posts receives before
/// the TCP handshake; the connecting side sends the moment the handshake
/// ends. The device saw no RNR NAK: the receives were in place in time.
#[test]
#[ignore = "needs an RDMA device: scripts/test runs it in the Soft-RoCE VM"]
fn receives_posted_before_the_tcp_handshake_take_the_first_messages() {
    use rdma_ring::buf::RegisteredBuf;
    use rdma_ring::op::{Recv, Send};
    use rdma_ring::ring::{Ring, RingConfig};

    let fabric = Verbs::new();
    let name = fabric.dev.name().to_owned();
    let before = rnr_naks(&name);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let timeout = Duration::from_secs(30);
    let (dev, pd) = (fabric.dev.clone(), fabric.pd.clone());
    let server = std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        let mut ring = Ring::new(
            dev.create_qp(&pd, QpConfig::default()).unwrap(),
            RingConfig::default(),
        );
        for i in 0..8 {
            ring.submission()
                .push(Recv::new(RegisteredBuf::new(&pd, vec![0u8; 16]).unwrap()).user_data(i))
                .unwrap();
        }
        ring.submit().unwrap(); // posted in INIT
        tcp::handshake(&mut stream, ring.qp(), timeout).unwrap();
        let got = ring.completion().wait(8).unwrap();
        got.iter().map(|c| c.buf()[0]).collect::<Vec<_>>()
    });
    let mut stream = tcp::dial(addr, timeout).unwrap();
    let mut ring = Ring::new(
        fabric
            .dev
            .create_qp(&fabric.pd, QpConfig::default())
            .unwrap(),
        RingConfig::default(),
    );
    tcp::handshake(&mut stream, ring.qp(), timeout).unwrap();
    for i in 0..8u8 {
        ring.submission()
            .push(Send::new(
                RegisteredBuf::new(&fabric.pd, vec![i; 16]).unwrap(),
            ))
            .unwrap();
    }
    ring.submit().unwrap();
    assert!(ring
        .completion()
        .wait(8)
        .unwrap()
        .iter()
        .all(|c| c.status().is_success()));
    assert_eq!(server.join().unwrap(), (0..8).collect::<Vec<u8>>());
    assert_eq!(rnr_naks(&name), before, "a message met no receive");
}

/// rdma_cm in steps: the listener creates the queue pair on its ring's
/// shared completion queue, attaches it and posts receives before
/// accepting; the connecting side posts receives before connecting. Both
/// send the moment they are connected; no RNR NAK on the device.
#[test]
#[ignore = "needs an RDMA device: scripts/test runs it in the Soft-RoCE VM"]
fn rdma_cm_in_steps_posts_receives_before_the_peer_can_send() {
    use rdma_ring::buf::RegisteredBuf;
    use rdma_ring::connect::cm;
    use rdma_ring::op::{Recv, Send};
    use rdma_ring::ring::{Ring, RingConfig};

    let name = std::env::var("RDMA_RING_CM_DEVICE").unwrap_or_else(|_| "rxe1".into());
    let addr: std::net::SocketAddr = std::env::var("RDMA_RING_CM_ADDR")
        .unwrap_or_else(|_| "10.99.0.1:7473".into())
        .parse()
        .unwrap();
    let dev = VerbsDevice::open(&name)
        .unwrap_or_else(|e| panic!("NO RDMA DEVICE {name:?} for rdma_cm: {e}"));
    let pd = dev.alloc_pd().unwrap();
    let timeout = Duration::from_secs(30);
    let before = rnr_naks(&name);
    let listener = cm::CmListener::bind(addr).unwrap();
    let (server_dev, server_pd) = (dev.clone(), pd.clone());
    let server = std::thread::spawn(move || {
        let (dev, pd) = (server_dev, server_pd);
        let mut ring = Ring::with_cq(dev.create_cq(256).unwrap(), RingConfig::default());
        let request = listener.request(timeout).unwrap();
        assert!(request.private_data().starts_with(b"steps"));
        // The requester is on this host, at the listener's address.
        let peer = request.peer_addr().expect("an IP requester");
        assert_eq!(peer.ip(), addr.ip(), "{peer}");
        assert_ne!(peer.port(), 0, "{peer}");
        let qp = request
            .create_qp_on(&dev, &pd, ring.cq(), None, QpConfig::default())
            .unwrap();
        let handle = ring.attach(qp).unwrap();
        for i in 0..4 {
            ring.submission_on(handle)
                .push(Recv::new(RegisteredBuf::new(&pd, vec![0u8; 16]).unwrap()).user_data(i))
                .unwrap();
        }
        ring.submit().unwrap();
        ring.qp_of(handle)
            .unwrap()
            .accept(b"accepted", timeout)
            .unwrap();
        for i in 0..4u8 {
            ring.submission_on(handle)
                .push(Send::new(
                    RegisteredBuf::new(&pd, vec![100 + i; 16]).unwrap(),
                ))
                .unwrap();
        }
        ring.submit().unwrap();
        let done = ring.completion().wait(8).unwrap();
        assert!(done
            .iter()
            .all(|c| c.status().is_success() && c.qp() == Some(handle)));
        let mut got: Vec<u8> = done
            .iter()
            .filter(|c| c.kind() == rdma_ring::op::OpKind::Recv)
            .map(|c| c.buf()[0])
            .collect();
        got.sort();
        got
    });
    std::thread::sleep(Duration::from_millis(200));
    let route = cm::resolve(addr, timeout).unwrap();
    assert_eq!(route.device_name().as_deref(), Some(name.as_str()));
    let mut ring = Ring::new(
        route.create_qp(&dev, &pd, QpConfig::default()).unwrap(),
        RingConfig::default(),
    );
    for i in 0..4 {
        ring.submission()
            .push(Recv::new(RegisteredBuf::new(&pd, vec![0u8; 16]).unwrap()).user_data(i))
            .unwrap();
    }
    ring.submit().unwrap();
    ring.qp().connect(b"steps", timeout).unwrap();
    assert!(ring.qp().peer_private_data().starts_with(b"accepted"));
    for i in 0..4u8 {
        ring.submission()
            .push(Send::new(RegisteredBuf::new(&pd, vec![i; 16]).unwrap()))
            .unwrap();
    }
    ring.submit().unwrap();
    let done = ring.completion().wait(8).unwrap();
    assert!(done.iter().all(|c| c.status().is_success()));
    let mut got: Vec<u8> = done
        .iter()
        .filter(|c| c.kind() == rdma_ring::op::OpKind::Recv)
        .map(|c| c.buf()[0])
        .collect();
    got.sort();
    assert_eq!(got, [100, 101, 102, 103]);
    assert_eq!(server.join().unwrap(), [0, 1, 2, 3]);
    assert_eq!(rnr_naks(&name), before, "a message met no receive");
}

/// A requester that gives up before the listener answers (its connect
/// timed out and its id went) fails that handshake as a peer's doing, not
/// as a fault of the listener's device, and the listener serves the next
/// requester.
#[test]
#[ignore = "needs an RDMA device: scripts/test runs it in the Soft-RoCE VM"]
fn a_requester_gone_before_its_answer_fails_as_the_peer_s_doing() {
    use rdma_ring::connect::cm;
    use rdma_ring::Error;

    let name = std::env::var("RDMA_RING_CM_DEVICE").unwrap_or_else(|_| "rxe1".into());
    let ip = std::env::var("RDMA_RING_CM_ADDR")
        .unwrap_or_else(|_| "10.99.0.1:7473".into())
        .parse::<std::net::SocketAddr>()
        .unwrap()
        .ip();
    let addr = std::net::SocketAddr::new(ip, 7479);
    let dev = VerbsDevice::open(&name)
        .unwrap_or_else(|e| panic!("NO RDMA DEVICE {name:?} for rdma_cm: {e}"));
    let pd = dev.alloc_pd().unwrap();
    let timeout = Duration::from_secs(30);
    let listener = cm::CmListener::bind(addr).unwrap();
    let gone = cm::resolve(addr, timeout)
        .unwrap()
        .create_qp(&dev, &pd, QpConfig::default())
        .unwrap();
    let err = gone
        .connect(b"gone", Duration::from_millis(500))
        .expect_err("nobody answered");
    drop(gone);
    eprintln!("the requester gave up: {err}");
    std::thread::sleep(Duration::from_millis(500));
    let request = listener.request(timeout).unwrap();
    let answered = request
        .create_qp(&dev, &pd, QpConfig::default())
        .and_then(|qp| qp.accept(b"too late", Duration::from_secs(5)).map(|()| qp));
    let err = answered.expect_err("the requester is gone");
    assert!(
        matches!(
            err,
            Error::Handshake { .. } | Error::HandshakeTimeout { .. }
        ),
        "{err:?}"
    );
    // The listener goes on: the next requester connects.
    let server = std::thread::spawn(move || {
        let request = listener.request(timeout).unwrap();
        let qp = request.create_qp(&dev, &pd, QpConfig::default()).unwrap();
        qp.accept(b"welcome", timeout).unwrap();
        (qp, dev, pd)
    });
    let (dev, pd) = {
        let dev = VerbsDevice::open(&name).unwrap();
        let pd = dev.alloc_pd().unwrap();
        (dev, pd)
    };
    let qp = cm::connect(&dev, &pd, addr, QpConfig::default(), b"next", timeout).unwrap();
    assert!(qp.peer_private_data().starts_with(b"welcome"));
    drop(server.join().unwrap());
}

/// Makes `slave` the active port of bond0 (on the Soft-RoCE VM: two dummy
/// ports of their own MAC addresses, the bond following the active one's);
/// whether `ip` did.
fn set_bond_active(slave: &str) -> bool {
    std::process::Command::new("ip")
        .args(["link", "set", "bond0", "type", "bond", "active_slave"])
        .arg(slave)
        .status()
        .is_ok_and(|status| status.success())
}

fn bond_active(slave: &str) {
    assert!(set_bond_active(slave), "bond0: active_slave {slave}");
}

/// Puts bond0's first port back in charge when dropped.
struct BondRestored;

impl Drop for BondRestored {
    fn drop(&mut self) {
        set_bond_active("dummy1");
    }
}

/// A listener bound to a wildcard address has no one device to open, and
/// the layers that serve on the listener's device refuse one, saying why.
#[test]
#[ignore = "needs rdma_cm devices: scripts/test runs it in the Soft-RoCE VM"]
fn a_wildcard_cm_listener_opens_no_device_and_servers_refuse_it() {
    use rdma_ring::connect::cm;
    use rdma_ring::Error;

    let wildcard = |port: u16| std::net::SocketAddr::from(([0, 0, 0, 0], port));
    let says_wildcard =
        |e: &Error| matches!(e, Error::Incompatible(why) if why.contains("wildcard address"));
    let listener = cm::CmListener::bind(wildcard(7478)).unwrap();
    let err = listener.open_device().unwrap_err();
    assert!(says_wildcard(&err), "{err:?}");
    drop(listener);
    let err = rdma_ring::rpc::RpcServer::bind_cm(
        wildcard(7478),
        rdma_ring::rpc::Service::handler(
            |_: &rdma_ring::rpc::Caller, _: &[u8], _: &mut Vec<u8>| Ok(()),
        ),
        rdma_ring::rpc::RpcConfig::default(),
    )
    .map(|_| ())
    .unwrap_err();
    assert!(says_wildcard(&err), "{err:?}");
    let err = rdma_ring::session::SessionBuilder::default()
        .bind_cm(wildcard(7478))
        .map(|_| ())
        .unwrap_err();
    assert!(
        matches!(&err, rdma_ring::session::SessionError::Device(e) if says_wildcard(e)),
        "{err:?}"
    );
}

/// Whether `err` is a handshake's failure that says the path went stale.
fn says_stale_path(err: &rdma_ring::Error) -> bool {
    matches!(err, rdma_ring::Error::Handshake { reason, .. }
        if reason.contains("changed its hardware address"))
}

/// Bonding failovers (each changes the bond's hardware address: rdma_cm
/// says `ADDR_CHANGE` to every id on it, and the kernel renews the port's
/// GIDs). A handshake whose path was taken before one fails at once on
/// either side, saying why; the listener goes on, and a new attempt
/// connects over the new port and carries messages.
#[test]
#[ignore = "needs rxe2 on a bond: scripts/test runs it in the Soft-RoCE VM"]
fn a_failover_fails_a_stale_handshake_clearly_and_the_next_connects() {
    use rdma_ring::buf::RegisteredBuf;
    use rdma_ring::connect::cm;
    use rdma_ring::op::{Recv, Send};
    use rdma_ring::ring::{Ring, RingConfig};

    let addr: std::net::SocketAddr = "10.99.1.1:7477".parse().unwrap();
    let timeout = Duration::from_secs(30);
    let _restore = BondRestored;
    let listener = cm::CmListener::bind(addr)
        .unwrap_or_else(|e| panic!("NO BONDED RDMA DEVICE at {addr} (rxe2 on bond0): {e}"));
    assert_eq!(listener.device_name().as_deref(), Some("rxe2"));
    let server = std::thread::spawn(move || {
        let dev = listener.open_device().unwrap();
        let pd = dev.alloc_pd().unwrap();
        // The first request is answered after a failover.
        let request = listener.request(timeout).unwrap();
        bond_active("dummy2");
        std::thread::sleep(Duration::from_millis(500));
        let qp = request.create_qp(&dev, &pd, QpConfig::default()).unwrap();
        let stale = qp.accept(b"", timeout).unwrap_err();
        drop(qp);
        // Should a later stale attempt's request get here, its handshake
        // fails and the next request is taken.
        loop {
            let request = listener
                .request(timeout)
                .expect("the listener outlives the failovers");
            let mut ring = Ring::new(
                request.create_qp(&dev, &pd, QpConfig::default()).unwrap(),
                RingConfig::default(),
            );
            ring.submission()
                .push(Recv::new(RegisteredBuf::new(&pd, vec![0u8; 16]).unwrap()))
                .unwrap();
            ring.submit().unwrap();
            if ring.qp().accept(b"", timeout).is_err() {
                continue;
            }
            match ring.completion().wait(1) {
                Ok(got) if got[0].status().is_success() => return (stale, got[0].buf()[0]),
                _ => continue,
            }
        }
    });
    std::thread::sleep(Duration::from_millis(200));
    let connect = |route: cm::CmRoute| {
        let dev = route.open_device().unwrap();
        let pd = dev.alloc_pd().unwrap();
        let qp = route.create_qp(&dev, &pd, QpConfig::default()).unwrap();
        qp.connect(b"", timeout).map(|()| (qp, pd))
    };
    // The server fails over while this attempt waits for its reply: it
    // hears of it too, or of the server's refusal, whichever comes first.
    let first = cm::resolve(addr, timeout).unwrap();
    assert!(connect(first).is_err());
    // This attempt's path is resolved, then the bond fails back.
    let stale = cm::resolve(addr, timeout).unwrap();
    bond_active("dummy1");
    std::thread::sleep(Duration::from_millis(500));
    let err = connect(stale).map(|_| ()).unwrap_err();
    assert!(says_stale_path(&err), "{err:?}");

    let route = cm::resolve(addr, timeout).unwrap();
    let (qp, pd) = connect(route).expect("connecting after the failovers");
    let mut ring = Ring::new(qp, RingConfig::default());
    ring.submission()
        .push(Send::new(RegisteredBuf::new(&pd, vec![7u8; 16]).unwrap()))
        .unwrap();
    ring.submit().unwrap();
    let sent = ring.completion().wait(1).unwrap();
    assert!(sent[0].status().is_success(), "{:?}", sent[0].status());
    let (stale_accept, got) = server.join().unwrap();
    assert!(says_stale_path(&stale_accept), "{stale_accept:?}");
    assert_eq!(got, 7);
}

/// Brings an interface back up when dropped, whatever the test did.
struct LinkUp(&'static str);

impl Drop for LinkUp {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip")
            .args(["link", "set", self.0, "up"])
            .status();
    }
}

fn ip_link(interface: &str, state: &str) {
    let status = std::process::Command::new("ip")
        .args(["link", "set", interface, state])
        .status()
        .expect("running ip");
    assert!(status.success(), "ip link set {interface} {state}");
}

/// Taking rxe1's interface down and up raises port events on the device,
/// which the ring reads and hands out.
#[test]
#[ignore = "needs an RDMA device: scripts/test runs it in the Soft-RoCE VM"]
fn port_events_reach_the_ring() {
    use rdma_ring::backend::AsyncEvent;
    use rdma_ring::ring::{Ring, RingConfig};

    let dev = VerbsDevice::open("rxe1").unwrap_or_else(|e| panic!("NO RDMA DEVICE rxe1: {e}"));
    let pd = dev.alloc_pd().unwrap();
    let mut ring = Ring::new(
        dev.create_qp(&pd, QpConfig::default()).unwrap(),
        RingConfig::default(),
    );
    ring.watch_events(dev.async_events().unwrap());
    let _restore = LinkUp("dummy0");
    let mut wait_for = |want: AsyncEvent| {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            ring.poll_events().unwrap();
            if std::iter::from_fn(|| ring.next_event()).any(|e| e == want) {
                return;
            }
            assert!(std::time::Instant::now() < deadline, "no {want:?}");
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    ip_link("dummy0", "down");
    wait_for(AsyncEvent::PortError { port: 1 });
    ip_link("dummy0", "up");
    wait_for(AsyncEvent::PortActive { port: 1 });
}
