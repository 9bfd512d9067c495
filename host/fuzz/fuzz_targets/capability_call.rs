#![no_main]
//! The host capability: any operation (first byte), any payload.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Some((operation, payload)) = data.split_first() {
        config_snapshot::fuzz::capability_call(*operation, payload);
    }
});
