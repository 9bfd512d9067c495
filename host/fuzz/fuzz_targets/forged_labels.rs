#![no_main]
//! The periodic pass over labelled objects, most of them forged.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| config_snapshot::fuzz::forged_labels(data));
