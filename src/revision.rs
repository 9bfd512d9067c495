//! Revision admission (docs/design.md, "Garbage collection"): a new
//! ReplicaSet or ControllerRevision asks the host to adopt the snapshots its
//! template uses, so Kubernetes' garbage collector removes them with the
//! revision and `revisionHistoryLimit` governs config history too.
//!
//! A revision whose adoption cannot even be queued is refused: if it were
//! admitted, pruning the older revision that owns its snapshots would let
//! the garbage collector delete them under it. The controller retries.

use serde_json::value::RawValue;
use serde_json::{json, Value};

use crate::host::WriteError;
use crate::references;
use crate::request::{Outcome, SAY};
use crate::template::Mapping;
use crate::workload::Context;

pub fn admit(ctx: &Context, kind: &str, raw: &RawValue) -> Outcome {
    if ctx.dry_run || !raw.get().contains(crate::keys::SNAPSHOTS) {
        return Outcome::accept();
    }
    let Ok(object) = serde_json::from_str::<Value>(raw.get()) else {
        return Outcome::accept();
    };
    let path = if kind == "ReplicaSet" {
        "/spec/template"
    } else {
        "/data/spec/template"
    };
    let Some(template) = object.pointer(path) else {
        return Outcome::accept();
    };
    let snapshots = used_snapshots(template);
    if snapshots.is_empty() {
        return Outcome::accept();
    }
    let name = object
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let owner = json!({"apiVersion": "apps/v1", "kind": kind, "name": name});
    match ctx.cluster.adopt(owner, snapshots) {
        Ok(()) => Outcome::accept(),
        // Stock Kubewarden: nothing adopts, and the snapshots (made by an
        // earlier host) are kept by the sweep while referenced.
        Err(WriteError::Unsupported(m)) => Outcome::accept_with(vec![format!(
            "{SAY}this host cannot adopt the snapshots of {kind} {name} ({m}); they are kept while referenced"
        )]),
        Err(e) => Outcome::reject(
            format!(
                "{SAY}could not ask the host to adopt the snapshots of {kind} {name}, so it is refused until it can (the controller retries): {}",
                e.message()
            ),
            500,
        ),
    }
}

/// The snapshots a template references, per its mapping.
pub fn used_snapshots(template: &Value) -> Vec<Value> {
    let mapping = Mapping::of(template);
    let mut out: Vec<Value> = Vec::new();
    for r in references::collect(template) {
        let is_snapshot = mapping.0.iter().any(|(id, snap)| id.kind == r.kind && *snap == r.name);
        let entry = json!({"kind": r.kind.kind(), "name": r.name});
        if is_snapshot && !out.contains(&entry) {
            out.push(entry);
        }
    }
    out
}
