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
