#![no_main]
//! serve's parsing of an AdmissionReview body.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| config_snapshot::fuzz::admission_request(data));
