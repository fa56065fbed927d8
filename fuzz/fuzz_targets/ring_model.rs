//! Drives the ring and the soft device through the reference model of
//! `tests/model`, with the scenario decoded from the fuzzer's bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../tests/model/mod.rs"]
mod model;

fuzz_target!(|data: &[u8]| {
    model::Model::run(&model::decode(data));
});
