//! Drives the fixed-buffer ring awaited (`AsyncFixedRing`) through the
//! interleavings of `tests/interleavings`: pushes, polls and drops of
//! futures, submits, drives, device steps, failing work requests,
//! doorbell coalescing turned on and off, and a close, decoded from the
//! fuzzer's bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../tests/interleavings/mod.rs"]
mod interleavings;

fuzz_target!(|data: &[u8]| {
    interleavings::run(data);
});
