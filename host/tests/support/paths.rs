//! Where the tests find the workspace, the built policy and the scenarios.

#![allow(dead_code)]

use std::path::PathBuf;

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The policy wasm as `make policy.wasm` builds it (optimised by
/// wasm-opt): the module that ships.
pub fn policy() -> PathBuf {
    let built = root().join("policy.wasm");
    assert!(built.exists(), "build the policy first: make policy.wasm");
    built
}

/// Every e2e scenario file, in name order.
pub fn scenario_files() -> Vec<PathBuf> {
    let mut scenarios: Vec<PathBuf> = std::fs::read_dir(root().join("e2e-tests"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    scenarios.sort();
    scenarios
}
