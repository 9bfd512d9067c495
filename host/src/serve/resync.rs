//! The periodic resync, the one thing admission alone cannot do:
//! - renew-duration fires on time, not only when someone edits the workload:
//!   each workload with the annotation is re-admitted as a no-op UPDATE, and
//!   a renewal is written back (with a resourceVersion precondition);
//! - watch rollouts lost to a restart or a full queue are re-derived: each
//!   source some workload in its namespace watches is re-admitted as a
//!   CREATE, which rolls out only the watchers not already on its current
//!   content.
//!
//! Both go through the policy in the same wasm engine as admissions.

use std::collections::BTreeMap;
use std::sync::Arc;

use config_snapshot_policy::keys;
use config_snapshot_policy::kind::{SourceId, SourceKind};
use config_snapshot_policy::optin::OptIn;
use config_snapshot_policy::settings::Settings;
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
    let watchers = Watchers::new(&workloads, &state.settings);
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
            if !watchers.watch(&source) {
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

/// The watch opt-ins of every workload, by namespace. The resync re-admits
/// only sources one of them watches, with the policy's own predicate, so it
/// skips nothing the policy would roll out and does not re-evaluate every
/// ConfigMap of a namespace because one Deployment there watches one.
struct Watchers<'s> {
    settings: &'s Settings,
    by_namespace: BTreeMap<String, Vec<OptIn>>,
}

impl<'s> Watchers<'s> {
    fn new(workloads: &[Value], settings: &'s Settings) -> Self {
        let mut by_namespace: BTreeMap<String, Vec<OptIn>> = BTreeMap::new();
        for workload in workloads {
            let annotations = workload["metadata"]["annotations"].as_object();
            // A workload whose annotations do not parse is refused at its
            // own admission; a watch rollout could not patch it either.
            let Ok(opt_in) = OptIn::from_annotations(annotations, settings) else {
                continue;
            };
            if opt_in.watch.is_empty() {
                continue;
            }
            let ns = workload["metadata"]["namespace"].as_str().unwrap_or_default();
            by_namespace.entry(ns.to_string()).or_default().push(opt_in);
        }
        Watchers { settings, by_namespace }
    }

    fn watch(&self, source: &Value) -> bool {
        if keys::is_snapshot(source) {
            return false;
        }
        let metadata = &source["metadata"];
        let (Some(kind), Some(name), Some(ns)) = (
            source["kind"].as_str().and_then(SourceKind::from_kind),
            metadata["name"].as_str(),
            metadata["namespace"].as_str(),
        ) else {
            return false;
        };
        let id = SourceId::new(kind, name);
        self.by_namespace
            .get(ns)
            .is_some_and(|opt_ins| opt_ins.iter().any(|o| o.watches(&id, self.settings)))
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn workload(ns: &str, annotations: Value) -> Value {
        json!({"kind": "Deployment", "metadata": {"name": "w", "namespace": ns, "annotations": annotations}})
    }

    fn source(kind: &str, ns: &str, name: &str) -> Value {
        json!({"kind": kind, "metadata": {"name": name, "namespace": ns}})
    }

    #[test]
    fn only_sources_a_workload_in_their_namespace_watches_are_readmitted() {
        let settings = Settings::default();
        let workloads = [
            workload("shop", json!({"config-snapshot.io/watch": "app-config,secret/tls"})),
            workload("shop", json!({"config-snapshot.io/snapshot": "*"})),
            workload(
                "bank",
                json!({"config-snapshot.io/watch": "*", "config-snapshot.io/exclude": "noisy"}),
            ),
            workload("broken", json!({"config-snapshot.io/watch": "Not A Name!"})),
        ];
        let watchers = Watchers::new(&workloads, &settings);
        assert!(watchers.watch(&source("ConfigMap", "shop", "app-config")));
        assert!(watchers.watch(&source("Secret", "shop", "tls")));
        assert!(
            !watchers.watch(&source("ConfigMap", "shop", "other")),
            "snapshot-only is not watch"
        );
        assert!(!watchers.watch(&source("ConfigMap", "shop", "tls")), "the kind matters");
        assert!(!watchers.watch(&source("ConfigMap", "other-ns", "app-config")));
        assert!(watchers.watch(&source("ConfigMap", "bank", "anything")));
        assert!(!watchers.watch(&source("ConfigMap", "bank", "noisy")), "excluded");
        assert!(!watchers.watch(&source("ConfigMap", "broken", "x")));
        let mut snapshot = source("ConfigMap", "bank", "anything-5d41402abc");
        snapshot["metadata"]["labels"] = json!({keys::MANAGED_BY: keys::MANAGED_BY_VALUE});
        assert!(!watchers.watch(&snapshot), "snapshots are never sources");
    }

    #[test]
    fn watch_by_default_makes_every_workload_a_watcher() {
        let settings =
            Settings::from_json(br#"{"watchByDefault": true, "excludedSources": ["configmap/kube-root-ca.crt"]}"#)
                .unwrap();
        let workloads = [workload("shop", json!({}))];
        let watchers = Watchers::new(&workloads, &settings);
        assert!(watchers.watch(&source("ConfigMap", "shop", "app-config")));
        assert!(!watchers.watch(&source("ConfigMap", "shop", "kube-root-ca.crt")));
        assert!(!watchers.watch(&source("Secret", "empty-ns", "tls")));
    }
}
