//! Drives the fixed ring over the adversarial device (partial and
//! unprovable posts, forged, repeated and held-back completions, failing
//! work requests) through the harness of `tests/adversary/fixed.rs`, with
//! the scenario decoded from the fuzzer's bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../tests/adversary/mod.rs"]
mod adversary;

fuzz_target!(|data: &[u8]| {
    adversary::fixed::FixedAdversary::run(&adversary::decode(data));
});
