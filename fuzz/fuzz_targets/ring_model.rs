//! Drives the rings and the soft device through the reference model of
//! `tests/model` (a server ring with several queue pairs on one completion
//! queue and, half the time, a shared receive queue), with the scenario
//! decoded from the fuzzer's bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../tests/model/mod.rs"]
mod model;

fuzz_target!(|data: &[u8]| {
    model::Model::run(&model::decode(data));
});
