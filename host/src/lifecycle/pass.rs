//! What the periodic pass decides (serve's resync, replay's `advanceTime`),
//! from the objects as they are, without I/O. [`super::resync`] carries it
//! out, the same way for both hosts.
//! - **Adoption repair**: each revision owns the snapshots it references,
//!   even if its adoption was lost (a restart, a full queue).
//! - **Anchors and releases**: an owned snapshot a workload names but does
//!   not own is anchored in its namespace, and a workload stops owning the
//!   snapshots it no longer names.
//! - **Renewals**: renew-duration fires on time, not only when someone edits
//!   the workload: each workload with it is re-admitted as a no-op update.
//! - **Watch re-derivation**: each source some workload in its namespace
//!   watches is re-admitted as a CREATE, which rolls out only the watchers
//!   not on its content and not held by a rollback that declined it.
//! - **The timed sweep**: every unowned snapshot that nothing references and
//!   nothing has used for the grace period goes, whatever its source, so
//!   garbage is bounded by the grace period plus one pass.

use config_snapshot_policy::host::contract::SnapshotRef;
use config_snapshot_policy::model::object::ObjectExt;
use std::collections::{BTreeMap, HashMap, HashSet};

use config_snapshot_policy::model::keys;
use config_snapshot_policy::model::kinds::{self, WorkloadKind};
use config_snapshot_policy::model::optin::OptIn;
use config_snapshot_policy::model::readers::Readers;
use config_snapshot_policy::model::references;
use config_snapshot_policy::model::settings::Settings;
use config_snapshot_policy::model::source::{SourceId, SourceKind};
use config_snapshot_policy::model::template::Snapshots;
use config_snapshot_policy::snapshot;
use config_snapshot_policy::snapshot::used_snapshots;
use serde_json::{json, Value};

use super::effect::Effect;
use crate::cluster::{key, Key};

fn kind_of(object: &Value) -> &str {
    object["kind"].as_str().unwrap_or_default()
}

/// A patch the pass makes: the object, the version it was judged at, and
/// the operations.
pub type Patch = (Key, String, Vec<Value>);

/// Adoptions the revisions among `objects` are missing, as effects for the
/// usual adopt path.
pub(crate) fn missing_adoptions(objects: &[&Value]) -> Vec<Effect> {
    let snapshots: HashMap<Key, &Value> = objects
        .iter()
        .filter(|o| keys::is_snapshot(o))
        .map(|o| (key(o), *o))
        .collect();
    let mut out = Vec::new();
    for revision in objects {
        let Some(row) = kinds::find(kind_of(revision)).filter(|k| k.owns(revision)) else {
            continue;
        };
        let Some(template) = row.template_of(revision) else {
            continue;
        };
        let (_, ns, name) = key(revision);
        let uid = revision.uid();
        let missing: Vec<SnapshotRef> = used_snapshots(template)
            .iter()
            .filter_map(|s| {
                let (kind, snap) = (s.kind.kind(), s.name.as_str());
                let object = snapshots.get(&(kind.to_string(), ns.clone(), snap.to_string()))?;
                // An anchored snapshot needs no more owners.
                let owned =
                    snapshot::anchored(object) || object.owner_references().iter().any(|r| r["uid"].as_str() == uid);
                (!owned).then(|| SnapshotRef {
                    kind: s.kind,
                    name: snap.to_string(),
                })
            })
            .collect();
        if !missing.is_empty() {
            out.push(Effect::Adopt {
                namespace: ns,
                owner_kind: kind_of(revision).to_string(),
                owner_name: name,
                snapshots: missing,
                stored_as: None,
            });
        }
    }
    out
}

/// Workload ownership upkeep: the patches that drop a workload's ownership
/// of a snapshot once it no longer names it (so its revisions alone decide
/// how long it lives), unless a rollout on its way will make it name the
/// snapshot (`awaited`).
pub fn releases(objects: &[&Value], awaited: &HashSet<Key>) -> Vec<Patch> {
    let workloads: Vec<&Value> = objects
        .iter()
        .filter(|o| WorkloadKind::from_kind(kind_of(o)).is_some())
        .copied()
        .collect();
    // A workload's uid → the snapshots its template names.
    let mut named: HashMap<&str, HashSet<Key>> = HashMap::new();
    for w in &workloads {
        let (Some(uid), Some(template)) = (w.uid(), kinds::template_of(w)) else {
            continue;
        };
        let ns = w.namespace().unwrap_or_default();
        let snapshots = Snapshots::of(template);
        let names = named.entry(uid).or_default();
        for r in references::collect(template) {
            if snapshots.contains(r.kind, &r.name) {
                names.insert((r.kind.kind().to_string(), ns.to_string(), r.name));
            }
        }
    }
    let mut out = Vec::new();
    for snapshot in objects.iter().filter(|o| keys::is_snapshot(o)) {
        let k = key(snapshot);
        let current: Vec<Value> = snapshot.owner_references().to_vec();
        let names = |workload: &str| named.get(workload).is_some_and(|n| n.contains(&k));
        let wanted: Vec<Value> = current
            .iter()
            .filter(|r| {
                let Some(uid) = r["uid"].as_str() else { return true };
                // Owners that are gone are the garbage collector's business.
                if WorkloadKind::from_kind(r["kind"].as_str().unwrap_or_default()).is_none()
                    || !named.contains_key(uid)
                    || awaited.contains(&k)
                {
                    return true;
                }
                names(uid)
            })
            .cloned()
            .collect();
        if wanted != current {
            out.push((
                k,
                snapshot.resource_version().to_string(),
                vec![json!({"op": "add", "path": "/metadata/ownerReferences", "value": wanted})],
            ));
        }
    }
    out
}

/// What an owned, unanchored snapshot a workload names without owning it
/// needs ([`unkept`]).
#[derive(Debug, PartialEq)]
pub enum Keep<'a> {
    /// Others' revisions own it: anchored in its namespace.
    Anchor(&'a Value),
    /// Only the workload's own older revisions own it (a rollback, a change
    /// back): the workload owns it again, so that its history limit still
    /// collects it.
    Own { snapshot: &'a Value, workload: &'a Value },
}

/// The snapshots that owners alone keep, named by a workload that does not
/// own them: the garbage collector would take one when its owners go,
/// while the workload names it (docs/design.md, "Garbage collection",
/// Anchors). An admission or a watch rollout that makes a workload name
/// one sees to it; this catches the rest (a write lost, a restart, a
/// rollback the controller wrote).
pub fn unkept<'a>(objects: &[&'a Value]) -> Vec<Keep<'a>> {
    let mut named: HashMap<Key, Vec<&'a Value>> = HashMap::new();
    for w in objects.iter().filter(|o| WorkloadKind::from_kind(kind_of(o)).is_some()) {
        let Some(template) = kinds::template_of(w).filter(|_| w.uid().is_some()) else {
            continue;
        };
        let ns = w.namespace().unwrap_or_default();
        let snapshots = Snapshots::of(template);
        for r in references::collect(template) {
            if snapshots.contains(r.kind, &r.name) {
                named
                    .entry((r.kind.kind().to_string(), ns.to_string(), r.name))
                    .or_default()
                    .push(*w);
            }
        }
    }
    let revisions: HashMap<(String, String, String), &Value> = objects
        .iter()
        .filter(|o| kinds::find(kind_of(o)).is_some_and(|k| k.is_revision()))
        .map(|o| (key(o), *o))
        .collect();
    let mut out = Vec::new();
    for snapshot in objects.iter().filter(|o| snapshot::only_owners_collect(o)) {
        let Some(workloads) = named.get(&key(snapshot)) else {
            continue;
        };
        let ns = snapshot.namespace().unwrap_or_default().to_string();
        let revision = |kind: &str, name: &str| {
            revisions
                .get(&(kind.to_string(), ns.clone(), name.to_string()))
                .map(|r| (*r).clone())
        };
        let owns = |w: &Value| {
            w.uid().is_some_and(|uid| {
                snapshot
                    .owner_references()
                    .iter()
                    .any(|r| r["uid"].as_str() == Some(uid))
            })
        };
        let lacking: Vec<&Value> = workloads.iter().copied().filter(|w| !owns(w)).collect();
        if lacking.is_empty() {
            continue;
        }
        let own = |w: &Value| {
            w.uid()
                .is_some_and(|uid| super::verdict::own_history(snapshot, uid, &revision))
        };
        if lacking.iter().all(|w| own(w)) {
            out.extend(lacking.into_iter().map(|workload| Keep::Own { snapshot, workload }));
        } else {
            out.push(Keep::Anchor(snapshot));
        }
    }
    out
}

/// The workload controlling `revision`: kind, name and uid from its
/// controller ownerReference.
pub(crate) fn controller_of(revision: &Value) -> Option<(String, String, String)> {
    let r = revision.controller()?;
    let text = |v: &Value| v.as_str().map(str::to_string);
    Some((text(&r["kind"])?, text(&r["name"])?, text(&r["uid"])?))
}

/// The workloads to re-admit for renew-duration.
pub(crate) fn renewals<'a>(objects: &[&'a Value]) -> Vec<&'a Value> {
    objects
        .iter()
        .filter(|o| WorkloadKind::from_kind(kind_of(o)).is_some())
        .filter(|o| o.has_annotation(keys::RENEW_DURATION))
        .copied()
        .collect()
}

/// The sources to re-admit: those some workload in their namespace
/// watches, by the policy's own opt-in rules.
pub(crate) fn watched_sources<'a>(objects: &[&'a Value], settings: &Settings) -> Vec<&'a Value> {
    let workloads: Vec<&Value> = objects
        .iter()
        .filter(|o| WorkloadKind::from_kind(kind_of(o)).is_some())
        .copied()
        .collect();
    let watchers = Watchers::new(&workloads, settings);
    objects
        .iter()
        .filter(|o| SourceKind::from_kind(kind_of(o)).is_some() && watchers.watch(o))
        .copied()
        .collect()
}

/// A snapshot the timed sweep deletes, with the preconditions that make
/// the delete fail if it was reused since it was judged. It borrows the
/// object judged, so that the delete needs no search for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Doomed<'a> {
    pub kind: String,
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub resource_version: String,
    pub snapshot: &'a Value,
}

/// The snapshots among `objects` that nothing owns, nothing references,
/// no pending effect targets (`pending`), and nothing has used for the
/// grace period.
pub fn orphans<'a>(objects: &[&'a Value], pending: &HashSet<Key>, now: i64, grace: u64) -> Vec<Doomed<'a>> {
    let mut referenced: HashSet<Key> = HashSet::new();
    for holder in objects {
        add_references(&mut referenced, holder);
    }
    doomed(objects, &referenced, pending, now, grace)
}

/// Adds every ConfigMap and Secret `holder` references, if it is a kind
/// that holds references (workloads, revisions, Pods).
pub(crate) fn add_references(referenced: &mut HashSet<Key>, holder: &Value) {
    let Some(row) = kinds::find(kind_of(holder)).filter(|k| k.template.is_some()) else {
        return;
    };
    let ns = holder.namespace().unwrap_or_default();
    for kind in [SourceKind::ConfigMap, SourceKind::Secret] {
        let mut names = std::collections::BTreeSet::new();
        snapshot::add_references(&mut names, row, holder, kind);
        referenced.extend(names.into_iter().map(|n| (kind.kind().to_string(), ns.to_string(), n)));
    }
}

/// The snapshots among `candidates` a sweep deletes: ours, unowned, unused
/// for the grace period, and neither `referenced` nor `pending`.
pub(crate) fn doomed<'a>(
    candidates: &[&'a Value],
    referenced: &HashSet<Key>,
    pending: &HashSet<Key>,
    now: i64,
    grace: u64,
) -> Vec<Doomed<'a>> {
    candidates
        .iter()
        .filter(|o| snapshot::is_orphan(o, now, grace))
        .filter(|o| {
            let k = key(o);
            !referenced.contains(&k) && !pending.contains(&k)
        })
        .map(|o| {
            let (kind, namespace, name) = key(o);
            Doomed {
                kind,
                namespace,
                name,
                uid: o.uid().unwrap_or_default().to_string(),
                resource_version: o.resource_version().to_string(),
                snapshot: o,
            }
        })
        .collect()
}

/// The opt-ins of every workload that opts anything in, by namespace. The
/// resync re-admits only sources one of them watches, with the policy's
/// own predicate and the source's word about its readers, so it skips
/// nothing the policy would roll out and does not re-evaluate every
/// ConfigMap of a namespace because one Deployment there watches one.
pub(crate) struct Watchers<'s> {
    settings: &'s Settings,
    by_namespace: BTreeMap<String, Vec<OptIn>>,
}

impl<'s> Watchers<'s> {
    pub fn new(workloads: &[&Value], settings: &'s Settings) -> Self {
        let mut by_namespace: BTreeMap<String, Vec<OptIn>> = BTreeMap::new();
        for workload in workloads {
            let annotations = workload.annotations();
            // A workload whose annotations do not parse is refused at its
            // own admission; a watch rollout could not patch it either.
            let Ok(opt_in) = OptIn::from_annotations(annotations, settings) else {
                continue;
            };
            // One that snapshots something may watch a source on the
            // source's own word (`readers: watch`); one that opts nothing
            // in watches nothing, whatever a source says.
            if opt_in.watch.is_empty() && opt_in.snapshot.is_empty() {
                continue;
            }
            let ns = workload.namespace().unwrap_or_default();
            by_namespace.entry(ns.to_string()).or_default().push(opt_in);
        }
        Watchers { settings, by_namespace }
    }

    pub fn watch(&self, source: &Value) -> bool {
        if keys::is_snapshot(source) {
            return false;
        }
        let (Some(kind), Some(name), Some(ns)) = (
            source["kind"].as_str().and_then(SourceKind::from_kind),
            source.meta_str("name"),
            source.namespace(),
        ) else {
            return false;
        };
        self.watches(ns, &SourceId::new(kind, name), Readers::said_by(source))
    }

    /// Whether a workload of `namespace` watches the source `id`, which
    /// says `readers` of its readers.
    pub fn watches(&self, namespace: &str, id: &SourceId, readers: Readers) -> bool {
        self.by_namespace
            .get(namespace)
            .is_some_and(|opt_ins| opt_ins.iter().any(|o| o.watches(id, readers, self.settings)))
    }
}

#[cfg(test)]
#[path = "pass_tests.rs"]
mod tests;
