#![no_main]
//! Settings: any bytes either parse or give a message; validate_settings
//! always answers valid JSON.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = config_snapshot_policy::model::settings::Settings::from_json(data);
    let answer = config_snapshot_policy::validate_settings(data);
    let v: serde_json::Value = serde_json::from_slice(&answer).expect("valid JSON");
    assert!(v["valid"].is_boolean());
});
