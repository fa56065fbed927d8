//! The endpoint record a peer sends during the handshake is untrusted: the
//! decoder must never panic, and whatever it accepts must re-encode to the
//! same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rdma_ring::connect::Endpoint;

fuzz_target!(|data: &[u8]| {
    if let Ok(endpoint) = Endpoint::decode(data) {
        assert_eq!(&endpoint.encode()[..], data);
        assert!((2..1 << 24).contains(&endpoint.qpn) && endpoint.psn < 1 << 24);
        assert!((1..=5).contains(&endpoint.mtu));
    }
});
