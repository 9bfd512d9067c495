//! Revision admission (docs/design.md, "Garbage collection"): a new
//! ReplicaSet or ControllerRevision asks the host to adopt the snapshots its
//! template uses, so Kubernetes' garbage collector removes them with the
//! revision and `revisionHistoryLimit` governs config history too.
//!
//! A revision whose adoption cannot even be queued is refused: if it were
//! admitted, pruning the older revision that owns its snapshots would let
//! the garbage collector delete them under it. The controller retries.
//!
//! A standalone kind (a Job, a Pod) that a user makes, opted in and with no
//! controller, is planned as a workload instead ([`standalone`]): its
//! sources are snapshotted, and it adopts them the same way.

use crate::model::object::ObjectExt;
use serde_json::value::RawValue;
use serde_json::Value;

use crate::admit::context::Context;
use crate::host::contract::{Owner, SnapshotRef};
use crate::model::kinds::Kind;
use crate::model::references;
use crate::model::request::{Outcome, SAY};
use crate::model::template::Mapping;

pub fn admit(ctx: &Context, revision: &Kind, raw: &RawValue) -> Outcome {
    if ctx.dry_run || !raw.get().contains(crate::model::keys::SNAPSHOTS) {
        return Outcome::accept();
    }
    let Ok(object) = serde_json::from_str::<Value>(raw.get()) else {
        return Outcome::accept();
    };
    let Some(template) = revision.template_of(&object) else {
        return Outcome::accept();
    };
    let snapshots = used_snapshots(template);
    if snapshots.is_empty() {
        return Outcome::accept();
    }
    let name = object.name();
    adopt(ctx, revision, name, snapshots)
}

/// Asks the host to make `revision` (named `name`, being created) an owner
/// of `snapshots` once it exists.
pub fn adopt(ctx: &Context, revision: &Kind, name: &str, snapshots: Vec<SnapshotRef>) -> Outcome {
    let kind = revision.kind;
    let owner = Owner {
        api_version: revision.api_version.to_string(),
        kind: kind.to_string(),
        name: name.to_string(),
        uid: None,
    };
    match ctx.host.adopt(owner, snapshots) {
        Ok(()) => Outcome::accept(),
        // Stock Kubewarden: nothing adopts, and the snapshots (made by an
        // earlier host) are kept by the sweep while referenced.
        Err(e) if e.unsupported() => Outcome::accept_with(vec![format!(
            "{SAY}this host cannot adopt the snapshots of {kind} {name} ({e}); they are kept while referenced"
        )]),
        Err(e) => Outcome::reject(
            format!(
                "{SAY}could not ask the host to adopt the snapshots of {kind} {name}, so it is refused until it can (the controller retries): {e}"
            ),
            500,
        ),
    }
}

/// Whether `object`, of a standalone revision kind, is the user's own to
/// snapshot: made without a controller (a CronJob's Job is its revision),
/// opted in by its own annotations, and naming no snapshot yet (a copy of
/// one that does adopts what it names).
pub fn standalone(object: &RawValue, settings: &crate::model::settings::Settings) -> bool {
    // Most Jobs and Pods are not opted in: the cheap parse decides first.
    let Ok(quick) = serde_json::from_str::<crate::admit::skim::AnnotationsSkim>(object.get()) else {
        return false;
    };
    if !crate::admit::skim::opts_in(&quick, settings) || object.get().contains(crate::model::keys::SNAPSHOTS) {
        return false;
    }
    // Then one generic parse (code the policy has anyway, rather than
    // types of its own, which would grow the module).
    serde_json::from_str::<Value>(object.get()).is_ok_and(|o| !crate::model::kinds::controlled(&o))
}

/// The snapshots a template references, per its mapping.
pub fn used_snapshots(template: &Value) -> Vec<SnapshotRef> {
    let mapping = Mapping::of(template);
    let mut out: Vec<SnapshotRef> = Vec::new();
    for r in references::collect(template) {
        let is_snapshot = mapping.0.iter().any(|(id, snap)| id.kind == r.kind && *snap == r.name);
        let entry = SnapshotRef {
            kind: r.kind,
            name: r.name,
        };
        if is_snapshot && !out.contains(&entry) {
            out.push(entry);
        }
    }
    out
}
