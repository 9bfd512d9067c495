//! The periodic resync, the one thing admission alone cannot do:
//! - renew-duration fires on time, not only when someone edits the workload:
//!   each workload with the annotation is re-admitted as a no-op UPDATE, and
//!   a renewal is written back (with a resourceVersion precondition);
//! - watch rollouts lost to a restart or a full queue are re-derived: each
//!   source in a namespace with watchers is re-admitted as a CREATE, which
//!   rolls out only the watchers not already on its current content.
//!
//! Both go through the policy in the same wasm engine as admissions.

use std::collections::BTreeSet;
use std::sync::Arc;

use config_snapshot_policy::keys;
use serde_json::value::RawValue;
use serde_json::{json, Value};

use super::admission;
use super::effects::{precondition, send_json_patch};
use super::State;

const WORKLOADS: [&str; 3] = ["Deployment", "StatefulSet", "DaemonSet"];
const SOURCES: [&str; 2] = ["ConfigMap", "Secret"];
/// Request uids of synthetic admissions start with this.
pub const UID_PREFIX: &str = "resync-";
const RESYNC_USER: &str = "system:serviceaccount:config-snapshot:resync";

/// What one pass did, for logs and tests.
#[derive(Debug, Default, PartialEq)]
pub struct Pass {
    pub renewed: usize,
    pub sources_checked: usize,
}

pub async fn once(state: &Arc<State>) -> Pass {
    let mut pass = Pass::default();
    let workloads: Vec<Value> = WORKLOADS.iter().flat_map(|k| state.cluster.cache.all(k)).collect();
    let watched: BTreeSet<String> = workloads
        .iter()
        .filter(|w| w["metadata"]["annotations"].get(keys::WATCH).is_some())
        .filter_map(|w| w["metadata"]["namespace"].as_str().map(str::to_string))
        .collect();
    for workload in workloads
        .iter()
        .filter(|w| w["metadata"]["annotations"].get(keys::RENEW_DURATION).is_some())
    {
        match renew(state, workload).await {
            Ok(true) => pass.renewed += 1,
            Ok(false) => {}
            Err(e) => tracing::warn!("resync: {e}"),
        }
    }
    for kind in SOURCES {
        for source in state.cluster.cache.all(kind) {
            let ns = source["metadata"]["namespace"].as_str().unwrap_or_default();
            let is_snapshot = source["metadata"]["labels"][keys::MANAGED_BY] == keys::MANAGED_BY_VALUE;
            if is_snapshot || !watched.contains(ns) {
                continue;
            }
            pass.sources_checked += 1;
            if let Err(e) = readmit(state, "CREATE", &source, None).await {
                tracing::warn!("resync: {e}");
            }
        }
    }
    tracing::info!(renewed = pass.renewed, sources = pass.sources_checked, "resync pass");
    pass
}

/// Re-admits a workload unchanged; writes back what the policy renewed.
async fn renew(state: &Arc<State>, workload: &Value) -> Result<bool, String> {
    let Some(mutated) = readmit(state, "UPDATE", workload, Some(workload)).await? else {
        return Ok(false);
    };
    let (kind, ns, name) = (
        workload["kind"].as_str().unwrap_or_default(),
        workload["metadata"]["namespace"].as_str().unwrap_or_default(),
        workload["metadata"]["name"].as_str().unwrap_or_default(),
    );
    let diff = json_patch::diff(workload, &mutated);
    if diff.0.is_empty() {
        return Ok(false);
    }
    let mut ops = vec![precondition(workload)];
    ops.extend(
        serde_json::to_value(&diff)
            .map_err(|e| e.to_string())?
            .as_array()
            .cloned()
            .unwrap_or_default(),
    );
    send_json_patch(&state.cluster, kind, ns, name, ops).await?;
    tracing::info!("renew: {kind}/{name} renewed its snapshots");
    Ok(true)
}

/// Runs one synthetic admission; returns the mutated object if allowed and
/// changed.
async fn readmit(
    state: &Arc<State>,
    operation: &str,
    object: &Value,
    old: Option<&Value>,
) -> Result<Option<Value>, String> {
    let kind = object["kind"].as_str().unwrap_or_default();
    let api_version = object["apiVersion"].as_str().unwrap_or("v1");
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let gvk = json!({"group": group, "version": version, "kind": kind});
    let request = json!({
        "uid": format!("{UID_PREFIX}{}", state.next_id()),
        "kind": gvk, "requestKind": gvk,
        "resource": {"group": group, "version": version, "resource": format!("{}s", kind.to_ascii_lowercase())},
        "name": object["metadata"]["name"],
        "namespace": object["metadata"]["namespace"],
        "operation": operation,
        "userInfo": {"username": RESYNC_USER},
        "object": object,
        "oldObject": old,
        "dryRun": false,
        "options": {},
    });
    let raw = RawValue::from_string(request.to_string()).map_err(|e| e.to_string())?;
    let state = state.clone();
    let answer = tokio::task::spawn_blocking(move || admission::admit(&state, &raw))
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("{e:?}"))?;
    Ok(answer.mutated.filter(|_| answer.allowed))
}
