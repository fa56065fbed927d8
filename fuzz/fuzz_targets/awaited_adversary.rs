//! Drives the awaited ring (`AsyncRing`) over the adversarial device
//! through the harness of `tests/adversary/awaited.rs`: futures posting
//! at once, refused in part or whole, completed, flushed and dropped,
//! with the scenario decoded from the fuzzer's bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../tests/adversary/mod.rs"]
mod adversary;

fuzz_target!(|data: &[u8]| {
    adversary::awaited::AwaitedAdversary::run(&adversary::decode(data));
});
