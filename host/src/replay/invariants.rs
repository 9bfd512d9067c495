//! The lifecycle's invariants, checked over a cluster's objects
//! (docs/design.md, "Where features meet"). Scenarios assert them
//! (`invariants: [nothingDangles, garbageBounded]`) and the random-history
//! test checks them after every step.

use config_snapshot_policy::model::object::ObjectExt;
use std::collections::HashSet;

use config_snapshot_policy::model::keys;
use config_snapshot_policy::model::references;
use config_snapshot_policy::model::template::Snapshots;
use serde_json::Value;

use crate::cluster::{key, Key};

use config_snapshot_policy::model::kinds::template_of;

/// The snapshots each holder's template names (by its mapping), as
/// (holder, snapshot key) pairs.
fn named_snapshots(objects: &[Value]) -> Vec<(String, Key)> {
    let mut out = Vec::new();
    for holder in objects {
        let Some(template) = template_of(holder) else { continue };
        let ns = holder.namespace().unwrap_or_default();
        let snapshots = Snapshots::of(template);
        for r in references::collect(template) {
            if snapshots.contains(r.kind, &r.name) {
                out.push((
                    format!("{}/{}", holder["kind"].as_str().unwrap_or_default(), holder.name()),
                    (r.kind.kind().to_string(), ns.to_string(), r.name),
                ));
            }
        }
    }
    out
}

/// I1, nothing dangles: every snapshot a workload, revision or Pod template
/// names exists. Returns the violations.
pub fn nothing_dangles(objects: &[Value]) -> Vec<String> {
    let present: HashSet<Key> = objects.iter().map(key).collect();
    named_snapshots(objects)
        .into_iter()
        .filter(|(_, k)| !present.contains(k))
        .map(|(holder, (kind, _, name))| format!("{holder} names {kind}/{name}, which does not exist"))
        .collect()
}

/// I2, garbage is bounded: every snapshot is owned by a live object,
/// referenced by one, or awaited by a pending effect. Meaningful once time
/// has passed the grace period and a resync ran.
pub fn garbage_bounded(objects: &[Value], awaited: &HashSet<Key>) -> Vec<String> {
    let uids: HashSet<&str> = objects.iter().filter_map(|o| o.uid()).collect();
    let mut referenced: HashSet<Key> = HashSet::new();
    for holder in objects {
        let Some(template) = template_of(holder) else { continue };
        let ns = holder.namespace().unwrap_or_default();
        for r in references::collect(template) {
            referenced.insert((r.kind.kind().to_string(), ns.to_string(), r.name));
        }
    }
    objects
        .iter()
        .filter(|o| keys::is_snapshot(o))
        .filter(|o| {
            let owned = o
                .owner_references()
                .iter()
                .any(|r| r["uid"].as_str().is_some_and(|u| uids.contains(u)));
            let k = key(o);
            !owned && !referenced.contains(&k) && !awaited.contains(&k)
        })
        .map(|o| {
            format!(
                "{}/{} is neither owned, referenced nor awaited",
                o["kind"].as_str().unwrap_or_default(),
                o.name()
            )
        })
        .collect()
}
