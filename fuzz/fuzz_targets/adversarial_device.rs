//! Drives a ring over an adversarial device (partial and unprovable posts,
//! forged, repeated and reordered completions) through the harness of
//! `tests/adversary`, with the scenario decoded from the fuzzer's bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../tests/adversary/mod.rs"]
mod adversary;

fuzz_target!(|data: &[u8]| {
    adversary::Adversary::run(&adversary::decode(data));
});
