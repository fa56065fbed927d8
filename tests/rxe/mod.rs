//! Soft-RoCE's own counters, for tests that observe the device rather than
//! the ring's bookkeeping.

/// RNR NAKs the device's requesters received so far (rxe's counter).
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
