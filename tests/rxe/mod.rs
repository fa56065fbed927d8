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
/// `hello` is sent right after the endpoint, for protocols that exchange
/// one there. Its queue pair lives on [`device`]; the thread hands back
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
        let mut theirs = [0u8; ENDPOINT_WIRE_LEN];
        socket.read_exact(&mut theirs).unwrap();
        std::thread::sleep(pauses.0);
        socket.write_all(&qp.endpoint().encode()).unwrap();
        if let Some(hello) = hello {
            let mut their_hello = vec![0u8; hello.len()];
            socket.read_exact(&mut their_hello).unwrap();
            socket.write_all(&hello).unwrap();
        }
        let mut ready = [0u8; 1];
        // The listener's ready byte: it sends it, then waits for ours.
        if socket.read_exact(&mut ready).is_ok() {
            std::thread::sleep(pauses.1);
            let _ = socket.write_all(&ready);
        }
        (socket, qp, pd)
    })
}
