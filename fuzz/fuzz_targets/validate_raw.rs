#![no_main]
//! Raw bytes into the policy's validate entry: it must never panic.

use libfuzzer_sys::fuzz_target;

#[path = "common.rs"]
mod common;

fuzz_target!(|data: &[u8]| {
    let host = common::host();
    let out = config_snapshot_policy::evaluate(data, &host);
    common::check(&out);
});
