//! The remote-slice wire decoder takes untrusted peer input: it must never
//! panic, and whatever it accepts must re-encode to the same bytes and
//! describe a range that does not overflow.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rdma_ring::buf::RemoteSlice;

fuzz_target!(|data: &[u8]| {
    if let Ok(slice) = RemoteSlice::decode(data) {
        assert_eq!(&slice.encode()[..], data);
        assert!(slice.addr().checked_add(slice.len()).is_some());
        if let Ok(part) = slice.slice(slice.len() / 2..) {
            assert!(part.addr() + part.len() <= slice.addr() + slice.len());
        }
    }
});
