//! The commands of the `config-snapshot` binary, one module each, with
//! their arguments: `main.rs` only parses and dispatches.

pub mod history;
pub mod keys;
pub mod module;
pub mod oci;
pub mod plan;
pub mod release;
pub mod replay;
pub mod review;

use std::path::PathBuf;

use anyhow::{anyhow, Context as _, Result};

/// `--policy`, else `$CONFIG_SNAPSHOT_POLICY`, else the workspace's build.
pub fn policy_path(explicit: Option<PathBuf>) -> Result<PathBuf> {
    if let Some(p) = explicit.or_else(|| std::env::var_os("CONFIG_SNAPSHOT_POLICY").map(PathBuf::from)) {
        return Ok(p);
    }
    let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let candidates = [
        PathBuf::from("policy.wasm"),
        workspace.join("policy.wasm"),
        workspace.join("target/wasm32-wasip1/policy/config_snapshot_policy.wasm"),
    ];
    candidates
        .into_iter()
        .find(|p| p.exists())
        .ok_or_else(|| anyhow!("no policy wasm found: run `make policy.wasm` or pass --policy"))
}

pub fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
}
