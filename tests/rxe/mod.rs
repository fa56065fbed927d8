//! Soft-RoCE's own counters, for tests that observe the device rather than
//! the ring's bookkeeping.

/// RNR NAKs the device's requesters received so far (rxe's counter).
#[allow(dead_code)]
pub fn rnr_naks(device: &str) -> u64 {
    let path = format!("/sys/class/infiniband/{device}/ports/1/hw_counters/rcvd_rnr_err");
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| {
            panic!("cannot read {path} ({e}): this check needs Soft-RoCE's counters")
        })
        .trim()
        .parse()
        .unwrap()
}

// Shared by several test binaries, each using part of this module.

/// The device these tests run on: `RDMA_RING_DEVICE`, or `rxe0`.
#[allow(dead_code)]
pub fn device_name() -> String {
    std::env::var("RDMA_RING_DEVICE").unwrap_or_else(|_| "rxe0".into())
}

/// Opens [`device_name`], failing loudly when there is none.
#[allow(dead_code)]
pub fn device() -> rdma_ring::backend::verbs::VerbsDevice {
    let name = device_name();
    rdma_ring::backend::verbs::VerbsDevice::open(&name).unwrap_or_else(|e| {
        panic!(
            "NO RDMA DEVICE: cannot open {name:?} ({e}). These tests need a device: \
             run them in the Soft-RoCE VM (scripts/test does, through scripts/softroce)"
        )
    })
}

/// A TCP port free on the loopback interface now.
#[allow(dead_code)]
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A peer that takes `pauses.0` over the first step of a TCP handshake
/// with the listener at `addr` (its endpoint) and `pauses.1` over the
/// second (its ready byte): each in time for a timeout per step longer
/// than either, the two together not for one of less than their sum.
/// `hello` is sent first, and the listener's read, before the endpoints,
/// for protocols where the connecting side greets first (sessions). Its queue pair lives on [`device`]; the thread hands back
/// the socket and the queue pair, so that the listener cannot learn of
/// its end before the test drops them.
#[allow(dead_code)]
pub fn pacing_peer(
    addr: std::net::SocketAddr,
    pauses: (std::time::Duration, std::time::Duration),
    hello: Option<Vec<u8>>,
) -> std::thread::JoinHandle<impl Send> {
    use rdma_ring::connect::ENDPOINT_WIRE_LEN;
    use std::io::{Read, Write};
    let dev = device();
    std::thread::spawn(move || {
        let pd = dev.alloc_pd().unwrap();
        let qp = dev
            .create_qp(&pd, rdma_ring::backend::QpConfig::default())
            .unwrap();
        let mut socket = std::net::TcpStream::connect(addr).unwrap();
        if let Some(hello) = hello {
            socket.write_all(&hello).unwrap();
            let mut their_hello = vec![0u8; hello.len()];
            socket.read_exact(&mut their_hello).unwrap();
        }
        let mut theirs = [0u8; ENDPOINT_WIRE_LEN];
        socket.read_exact(&mut theirs).unwrap();
        std::thread::sleep(pauses.0);
        socket.write_all(&qp.endpoint().encode()).unwrap();
        let mut ready = [0u8; 1];
        // The listener's ready byte: it sends it, then waits for ours.
        if socket.read_exact(&mut ready).is_ok() {
            std::thread::sleep(pauses.1);
            let _ = socket.write_all(&ready);
        }
        (socket, qp, pd)
    })
}

/// An rdma_cm peer that asks the listener at `addr` to connect, with
/// `private` as its request's private data, and once answered never
/// confirms: no queue pair, no `rdma_establish`, so no RTU, and the
/// listener waits for ESTABLISHED until its own timeout. The first
/// receiver hears when the listener's answer arrived; the peer keeps its
/// id until the second is sent to (or dropped).
#[allow(dead_code)]
pub fn unconfirming_cm_peer(
    addr: std::net::SocketAddrV4,
    private: Vec<u8>,
) -> (
    std::sync::mpsc::Receiver<()>,
    std::sync::mpsc::Sender<()>,
    std::thread::JoinHandle<()>,
) {
    use rdma_sys::rdma_cm_event_type as ev;
    let (answered_tx, answered) = std::sync::mpsc::channel();
    let (hang_up, hung_up) = std::sync::mpsc::channel::<()>();
    let peer = std::thread::spawn(move || {
        // The channel blocks: each wait below is for an event librdmacm
        // delivers within its own timeouts.
        let next = |channel: *mut rdma_sys::rdma_event_channel, want: ev::Type| {
            let mut event = std::ptr::null_mut();
            // SAFETY: a live channel and a valid out-pointer; the event is
            // read, then acknowledged once.
            unsafe {
                assert_eq!(rdma_sys::rdma_get_cm_event(channel, &mut event), 0);
                let got = (*event).event;
                rdma_sys::rdma_ack_cm_event(event);
                assert_eq!(got, want, "rdma_cm event {got}, wanted {want}");
            }
        };
        // SAFETY: librdmacm calls on the channel and id made here, each
        // destroyed once at the end; `sin` and `param` (and the private
        // data it points at) live across the calls that read them.
        unsafe {
            let channel = rdma_sys::rdma_create_event_channel();
            assert!(!channel.is_null());
            let mut id = std::ptr::null_mut();
            assert_eq!(
                rdma_sys::rdma_create_id(
                    channel,
                    &mut id,
                    std::ptr::null_mut(),
                    rdma_sys::rdma_port_space::RDMA_PS_TCP,
                ),
                0
            );
            let mut sin: libc::sockaddr_in = std::mem::zeroed();
            sin.sin_family = libc::AF_INET as libc::sa_family_t;
            sin.sin_port = addr.port().to_be();
            sin.sin_addr.s_addr = u32::from(*addr.ip()).to_be();
            let dst = (&mut sin as *mut libc::sockaddr_in).cast();
            assert_eq!(
                rdma_sys::rdma_resolve_addr(id, std::ptr::null_mut(), dst, 2000),
                0
            );
            next(channel, ev::RDMA_CM_EVENT_ADDR_RESOLVED);
            assert_eq!(rdma_sys::rdma_resolve_route(id, 2000), 0);
            next(channel, ev::RDMA_CM_EVENT_ROUTE_RESOLVED);
            let mut param: rdma_sys::rdma_conn_param = std::mem::zeroed();
            param.private_data = private.as_ptr().cast();
            param.private_data_len = private.len() as u8;
            param.responder_resources = 1;
            param.initiator_depth = 1;
            param.retry_count = 7;
            param.rnr_retry_count = 7;
            // No queue pair behind it: it is never used, as the
            // connection is never confirmed.
            param.qp_num = 0x1234;
            assert_eq!(rdma_sys::rdma_connect(id, &mut param), 0);
            next(channel, ev::RDMA_CM_EVENT_CONNECT_RESPONSE);
            let _ = answered_tx.send(());
            let _ = hung_up.recv();
            rdma_sys::rdma_destroy_id(id);
            rdma_sys::rdma_destroy_event_channel(channel);
        }
    });
    (answered, hang_up, peer)
}
