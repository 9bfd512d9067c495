//! Serve's driver of the periodic pass, over the shared decisions of
//! [`crate::lifecycle::resync`] (replay's `advanceTime` runs the same ones):
//! adoption repair, renewals, watch re-derivation, and the timed sweep.
//! Every admission it makes goes through the policy in the same wasm engine
//! as the webhook's.

use std::sync::Arc;

use serde_json::value::RawValue;
use serde_json::{json, Value};

use super::admission;
use super::cache::KINDS;
use super::State;
use crate::capability::delete_guarded;
use crate::lifecycle::effects::precondition;
use crate::lifecycle::resync::{bridges, missing_adoptions, orphans, renewals, watched_sources};

/// Request uids of synthetic admissions start with this.
pub const UID_PREFIX: &str = "resync-";
const RESYNC_USER: &str = "system:serviceaccount:config-snapshot:resync";

/// What one pass did, for logs and tests.
#[derive(Debug, Default, PartialEq)]
pub struct Pass {
    pub adoptions: usize,
    pub renewed: usize,
    pub sources_checked: usize,
    pub swept: usize,
}

fn cached(state: &State) -> Vec<Value> {
    KINDS.iter().flat_map(|k| state.cluster.cache.all(k.kind)).collect()
}

pub async fn once(state: &Arc<State>) -> Pass {
    let mut pass = Pass::default();
    let objects = cached(state);
    let all: Vec<&Value> = objects.iter().collect();
    for effect in missing_adoptions(&all) {
        tracing::info!("resync: {} was missing", effect.describe());
        state.queue.submit(effect);
        pass.adoptions += 1;
    }
    for ((kind, ns, name), ops) in bridges(&all) {
        match state.cluster.patch(&kind, &ns, &name, ops).await {
            Ok(()) => tracing::info!("resync: {kind}/{name}'s owners brought up to date"),
            Err(e) => tracing::debug!("resync: {kind}/{name}: {e}"),
        }
    }
    for workload in renewals(&all) {
        match renew(state, workload).await {
            Ok(true) => pass.renewed += 1,
            Ok(false) => {}
            Err(e) => tracing::warn!("resync: {e}"),
        }
    }
    for source in watched_sources(&all, &state.settings) {
        pass.sources_checked += 1;
        if let Err(e) = readmit(state, "CREATE", source, None).await {
            tracing::warn!("resync: {e}");
        }
    }
    // The sweep judges what the pass left; its deletes carry the version
    // judged, so a snapshot reused meanwhile is kept.
    let objects = cached(state);
    let all: Vec<&Value> = objects.iter().collect();
    let doomed = orphans(
        &all,
        &state.cluster.awaited_targets(),
        state.cluster.now(),
        state.settings.orphan_grace_period_secs,
    );
    for d in doomed {
        let Some(snapshot) = objects
            .iter()
            .find(|o| {
                o["kind"] == d.kind.as_str()
                    && o["metadata"]["namespace"] == d.namespace.as_str()
                    && o["metadata"]["name"] == d.name.as_str()
            })
            .cloned()
        else {
            continue;
        };
        let cluster = state.cluster.clone();
        let deleted = tokio::task::spawn_blocking(move || {
            delete_guarded(cluster.as_ref(), &snapshot, &d.uid, Some(&d.resource_version))
        })
        .await;
        match deleted {
            Ok(Ok(())) => pass.swept += 1,
            Ok(Err(e)) => tracing::debug!("resync: kept a snapshot: {e}"),
            Err(e) => tracing::warn!("resync: {e}"),
        }
    }
    tracing::info!(
        adoptions = pass.adoptions,
        renewed = pass.renewed,
        sources = pass.sources_checked,
        swept = pass.swept,
        "resync pass"
    );
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
    state
        .cluster
        .patch(kind, ns, name, ops)
        .await
        .map_err(|e| format!("renewing {kind}/{name}: {e}"))?;
    tracing::info!("renew: {kind}/{name} renewed its snapshots");
    state.cluster.events.publish(
        workload,
        super::events::Reason::ConfigRenewed,
        "renew-duration passed: re-admitted, so its pods take its sources' current config".into(),
    );
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
