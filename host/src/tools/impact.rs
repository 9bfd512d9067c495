//! `plan`: what applying a ConfigMap or Secret would roll, before it is
//! applied. For each workload of the namespace that references the object:
//! through which references and keys, whether a watch rollout would follow
//! and why not if none would, and what changes in the keys it reads.
//!
//! The rule is the policy's own (`config_snapshot_policy::admit::watch::watcher`,
//! the content's key subsets, the storm guard's record), run on the objects
//! as a cluster or a replayed scenario has them. Secret values never leave
//! here: their keys are compared by digest and shown by name.

use config_snapshot_policy::model::object::ObjectExt;
use std::collections::BTreeSet;

use anyhow::{anyhow, bail, Result};
use config_snapshot_policy::model::approval::WatchMode;
use config_snapshot_policy::model::content::Content;
use config_snapshot_policy::model::keys;
use config_snapshot_policy::model::kinds::WorkloadKind;
use config_snapshot_policy::model::optin::{OptIn, Standing};
use config_snapshot_policy::model::readers::Readers;
use config_snapshot_policy::model::records::WatchRollout;
use config_snapshot_policy::model::references::{Reference, SourceRefs};
use config_snapshot_policy::model::settings::Settings;
use config_snapshot_policy::model::source::{SourceId, SourceKind};
use config_snapshot_policy::rollout::{watcher, Watcher};
use serde::Serialize;
use serde_json::Value;

use crate::tools::history::{KeyChanges, Values};
use crate::tools::printable;

/// What applying one source would do.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Impact {
    /// `configmap/app`.
    pub source: String,
    pub namespace: String,
    /// Whether the object exists now (else applying creates it).
    pub exists: bool,
    /// Its keys, against the object as it is now.
    pub keys: KeyChanges,
    /// What it says of its readers once applied (`config-snapshot.io/readers`:
    /// `watch` or `ignore`; `None`: nothing, or a word that does not parse).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub readers: Option<&'static str>,
    /// What the manifest says wrong, as the host would read it (a bad
    /// readers word is read as none).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// Each workload that references it, in name order.
    pub workloads: Vec<WorkloadImpact>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadImpact {
    /// `deployment/web`.
    pub workload: String,
    /// How its pod template reads the source: `volume cfg`,
    /// `env main/MODE (key mode)`, `envFrom main`.
    pub references: Vec<String>,
    /// The keys it reads (`None`: all of them).
    pub reads: Option<BTreeSet<String>>,
    pub rolls: bool,
    /// The snapshot it would roll to. Never named: a snapshot's name is
    /// keyed by the installation's signing key, which plan does not hold
    /// (nor should: a name anyone could compute from a guess would confirm
    /// the guess). Kept in the JSON's shape for its readers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<String>,
    /// Why it rolls (and to what), or why not.
    pub why: String,
    /// What changes in the keys it reads.
    pub keys: KeyChanges,
    /// The key-level diff of what it reads: `- k: old`, `+ k: new`; a
    /// Secret's keys by name only.
    pub diff: Vec<String>,
}

/// The object a manifest holds, as the API server would store it: a
/// Secret's `stringData` becomes base64 `data`.
pub fn stored_form(mut manifest: Value) -> Result<(SourceKind, Value)> {
    let Some(kind) = manifest["kind"].as_str().and_then(SourceKind::from_kind) else {
        bail!("plan reads a ConfigMap or a Secret, not {}", manifest["kind"]);
    };
    if manifest.meta_str("name").is_none_or(str::is_empty) {
        bail!("the {} has no metadata.name", kind.kind());
    }
    if keys::is_snapshot(&manifest) {
        bail!("this is a snapshot, which config-snapshot made and never changes; plan its source instead");
    }
    if kind == SourceKind::Secret {
        crate::replay::simulator::fold_string_data(&mut manifest)?;
    }
    Ok((kind, manifest))
}

/// What a change is judged against besides the objects.
pub struct Judging<'a> {
    /// The policy's settings as installed.
    pub settings: &'a Settings,
    /// The namespace's ConfigMap snapshots: a workload whose snapshot holds
    /// the content applied (its content hash says so) already runs it.
    pub snapshots: &'a [Value],
    /// serve's storm guard, in seconds.
    pub watch_min_interval: i64,
    /// The clock, unix seconds.
    pub now: i64,
}

/// What applying `new` (a source, [`stored_form`]) in `namespace` would
/// do, given the object as it is (`live`) and the namespace's workloads.
pub fn impact(
    new: &Value,
    live: Option<&Value>,
    workloads: &[Value],
    namespace: &str,
    judging: &Judging,
) -> Result<Impact> {
    let kind = new["kind"]
        .as_str()
        .and_then(SourceKind::from_kind)
        .ok_or_else(|| anyhow!("not a ConfigMap or Secret"))?;
    let name = new.name();
    let id = SourceId::new(kind, name.to_string());
    let content = Content::from_object(kind, new).map_err(|e| anyhow!("{}/{name}: {e}", kind.tag()))?;
    let (before, after) = (live.map(|l| Values::of(kind, l)), Values::of(kind, new));
    // The word the source will carry once applied is the one its change is
    // judged by (the host reads the source as stored).
    let (readers, warnings) = match Readers::of(new) {
        Ok(readers) => (readers, Vec::new()),
        Err(e) => (Readers::Unsaid, vec![format!("{e}; read as no word")]),
    };
    let mut impacts = Vec::new();
    for workload in workloads {
        let Some(wkind) = workload["kind"].as_str().and_then(WorkloadKind::from_kind) else {
            continue;
        };
        let group = match watcher(wkind, workload, &id, readers, judging.settings) {
            Watcher::Unreferenced => continue,
            Watcher::NotWatched(group) | Watcher::Watches(group) => group,
        };
        let reads = group.key_subset();
        let only = |v: &Values| restricted(v, reads.as_ref());
        let (old, new_values) = (before.as_ref().map(only), only(&after));
        let changes = key_changes(old.as_ref(), &new_values, kind);
        let applied = (&group, &content, &changes);
        let (rolls, snapshot, why) = decide(wkind, workload, (&id, readers), applied, judging);
        let template = workload.pointer(wkind.template()).unwrap_or(&Value::Null);
        impacts.push(WorkloadImpact {
            workload: format!("{}/{}", wkind.kind().to_ascii_lowercase(), workload.name()),
            references: group.refs.iter().map(|r| describe(template, r)).collect(),
            reads,
            rolls,
            snapshot,
            why,
            diff: diff_lines(old.as_ref(), &new_values),
            keys: changes,
        });
    }
    impacts.sort_by(|a, b| a.workload.cmp(&b.workload));
    Ok(Impact {
        source: format!("{}/{name}", kind.tag()),
        namespace: namespace.to_string(),
        exists: live.is_some(),
        keys: key_changes(before.as_ref(), &after, kind),
        readers: readers.name(),
        warnings,
        workloads: impacts,
    })
}

/// The keys that change from `before` (none: the object is created) to
/// `after`.
fn key_changes(before: Option<&Values>, after: &Values, kind: SourceKind) -> KeyChanges {
    let empty = match kind {
        SourceKind::ConfigMap => Values::Plain(Default::default()),
        SourceKind::Secret => Values::Hidden(Default::default()),
    };
    KeyChanges::between(Some(before.unwrap_or(&empty)), Some(after)).expect("both sides are given")
}

fn restricted(values: &Values, keys: Option<&BTreeSet<String>>) -> Values {
    let keep = |m: &std::collections::BTreeMap<String, String>| {
        m.iter()
            .filter(|(k, _)| keys.is_none_or(|keys| keys.contains(*k)))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    };
    match values {
        Values::Plain(m) => Values::Plain(keep(m)),
        Values::Hidden(m) => Values::Hidden(keep(m)),
    }
}

/// What `plan` decides on besides the workload and the source: how the
/// workload reads the source, its new content, and what changes in the
/// keys read.
type Applied<'a> = (&'a SourceRefs, &'a Content, &'a KeyChanges);

/// Whether the change rolls one referencing workload (reading the source
/// through `group`) out, and why: first whether it watches the source at
/// all, and whose word decided (docs/design.md, "The source decides").
fn decide(
    kind: WorkloadKind,
    workload: &Value,
    (id, readers): (&SourceId, Readers),
    applied: Applied,
    judging: &Judging,
) -> (bool, Option<String>, String) {
    let settings = judging.settings;
    let stays = |why: String| (false, None, why);
    let optin = match OptIn::from_annotations(workload.annotations(), settings) {
        Ok(optin) => optin,
        Err(e) => return stays(format!("its config-snapshot annotations do not parse: {e}")),
    };
    if !kind.watches() {
        return stays(format!(
            "a {}'s template never changes: the next one made reads it",
            kind.kind()
        ));
    }
    if optin.excluded(id, settings) {
        return stays(format!("{id} is excluded (its exclude annotation or the settings)"));
    }
    let pinned = "it keeps the snapshot it pinned until its next rollout";
    let word = keys::READERS;
    let called = match optin.standing(id, readers, settings) {
        Standing::Unpinned => {
            return stays(format!(
                "it does not watch {id}: it reads the live object: mounted files follow within a minute, env only on a restart"
            ))
        }
        Standing::Ignored => {
            return stays(format!(
                "it does not watch {id}: {id} says {word}: ignore, and it does not name it in watch; {pinned}"
            ))
        }
        Standing::PinnedByName => {
            return stays(format!(
                "it does not watch {id}: it names it in snapshot alone, which {id}'s {word}: watch does not override; {pinned}"
            ))
        }
        Standing::Own(false) => return stays(format!("it does not watch {id}: {pinned}")),
        Standing::Called => true,
        Standing::Named | Standing::Own(true) => false,
    };
    let (rolls, snapshot, why) = decide_watched(workload, &optin, id, applied, judging);
    if called {
        return (rolls, snapshot, format!("{why} (it watches {id} on its {word}: watch)"));
    }
    (rolls, snapshot, why)
}

/// [`decide`] for a workload that watches the source: whether the change
/// rolls it, now or once its mode, settle time, window or storm guard
/// lets it.
fn decide_watched(
    workload: &Value,
    optin: &OptIn,
    id: &SourceId,
    (group, content, changes): Applied,
    judging: &Judging,
) -> (bool, Option<String>, String) {
    let Judging {
        snapshots,
        watch_min_interval,
        now,
        ..
    } = *judging;
    let stays = |why: String| (false, None, why);
    let annotations = workload.annotations();
    if changes.is_empty() {
        return stays("none of the keys it reads changes".to_string());
    }
    if let Some(name) = runs_already(id, group, content, snapshots) {
        return stays(format!("it already runs this content ({name})"));
    }
    let (snapshot, to) = (None, format!("a new snapshot of {id}"));
    match WatchMode::of(annotations) {
        WatchMode::Roll => {}
        WatchMode::Notify => {
            return stays(format!(
                "its watch mode is notify: it is told it would roll to {to}, and nothing rolls"
            ))
        }
        WatchMode::Approve => {
            return stays(format!(
                "its watch mode is approve: it would roll to {to} once approved (config-snapshot approve)"
            ))
        }
    }
    if let Some(settle) = optin.settle_in(WatchMode::Roll) {
        return (
            true,
            snapshot,
            format!("rolls to {to} once its sources have been quiet for {settle}s, with their other changes in the same rollout"),
        );
    }
    if let Some((_, why)) = crate::lifecycle::window_clock::held(workload, now) {
        return (
            true,
            snapshot,
            format!("rolls to {to} when its rollout window opens: {why}"),
        );
    }
    if let Some(last) = WatchRollout::of(workload).filter(|l| now < l.at + watch_min_interval) {
        let wait = last.at + watch_min_interval - now;
        let ago = now - last.at;
        return (
            true,
            snapshot,
            format!("rolls to {to} in {wait}s, after the storm guard (its last watch rollout was {ago}s ago)"),
        );
    }
    (true, snapshot, format!("rolls to {to}"))
}

/// The snapshot a workload reading `id` through `group` runs, if it holds
/// `content` already (of the keys it reads). A ConfigMap snapshot says its
/// content's hash; a Secret's says none, so of a Secret plan cannot tell.
fn runs_already(id: &SourceId, group: &SourceRefs, content: &Content, snapshots: &[Value]) -> Option<String> {
    if id.kind != SourceKind::ConfigMap {
        return None;
    }
    let hash = content.subset(group.key_subset().as_ref()).hash();
    let holds = |name: &str| {
        snapshots.iter().any(|s| {
            s.name() == name
                && keys::snapshot_source(s) == Some(id.name.as_str())
                && s.annotation(keys::CONTENT_HASH) == Some(hash.as_str())
        })
    };
    group
        .refs
        .iter()
        .all(|r| holds(&r.name))
        .then(|| group.refs[0].name.clone())
}

/// A reference as a user finds it in the manifest.
fn describe(template: &Value, r: &Reference) -> String {
    let parts: Vec<&str> = r.pointer.trim_start_matches('/').split('/').collect();
    let at = |n: usize| -> &Value {
        let pointer = format!("/{}", parts[..n.min(parts.len())].join("/"));
        template.pointer(&pointer).unwrap_or(&Value::Null)
    };
    let named = |v: &Value| v["name"].as_str().unwrap_or("?").to_string();
    let keys = match &r.keys {
        Some(k) => format!(" (key {})", k.iter().cloned().collect::<Vec<_>>().join(", ")),
        None => String::new(),
    };
    // spec/volumes/N/…, spec/<containers>/N/env/M/…, spec/<containers>/N/envFrom/M/…
    match parts.get(1).copied() {
        Some("volumes") if parts.get(3) == Some(&"projected") => format!("projected volume {}{keys}", named(at(3))),
        Some("volumes") => format!("volume {}{keys}", named(at(3))),
        Some(list) => {
            let container = named(at(3));
            let prefix = if list == "containers" {
                String::new()
            } else {
                format!("{list} ")
            };
            match parts.get(3).copied() {
                Some("env") => format!("{prefix}env {container}/{}{keys}", named(at(5))),
                _ => format!("{prefix}envFrom {container}{keys}"),
            }
        }
        None => r.pointer.clone(),
    }
}

/// `- k: old` / `+ k: new` for a ConfigMap's keys; a Secret's by name,
/// marked added, removed or changed.
fn diff_lines(before: Option<&Values>, after: &Values) -> Vec<String> {
    let empty = std::collections::BTreeMap::new();
    let old = before.map(Values::map).unwrap_or(&empty);
    let new = after.map();
    let keys: BTreeSet<&String> = old.keys().chain(new.keys()).collect();
    let mut lines = Vec::new();
    for key in keys {
        let (a, b) = (old.get(key), new.get(key));
        if a == b {
            continue;
        }
        match after {
            Values::Plain(_) => {
                if let Some(a) = a {
                    lines.push(format!("- {key}: {a}"));
                }
                if let Some(b) = b {
                    lines.push(format!("+ {key}: {b}"));
                }
            }
            Values::Hidden(_) => lines.push(match (a, b) {
                (None, _) => format!("+ {key}: <hidden>"),
                (_, None) => format!("- {key}: <hidden>"),
                _ => format!("~ {key}: <hidden, changed>"),
            }),
        }
    }
    lines
}

/// The text `plan` prints.
pub fn render(impact: &Impact) -> String {
    let mut out = String::new();
    let verb = if impact.exists { "applying" } else { "creating" };
    out.push_str(&format!(
        "{verb} {} in namespace {}: {}\n",
        printable(&impact.source),
        printable(&impact.namespace),
        printable(&impact.keys.describe())
    ));
    if let Some(word) = impact.readers {
        out.push_str(&format!("it says {}: {word}\n", keys::READERS));
    }
    for warning in &impact.warnings {
        out.push_str(&format!("warning: {warning}\n"));
    }
    if impact.workloads.is_empty() {
        out.push_str("no workload references it\n");
    }
    for w in &impact.workloads {
        let mark = if w.rolls { "ROLLS" } else { "stays" };
        out.push_str(&format!(
            "\n{mark}  {}: {}\n",
            printable(&w.workload),
            printable(&w.why)
        ));
        out.push_str(&format!("       through {}\n", printable(&w.references.join(", "))));
        for line in &w.diff {
            out.push_str(&format!("       {}\n", printable(line)));
        }
    }
    let rolls = impact.workloads.iter().filter(|w| w.rolls).count();
    out.push_str(&format!(
        "\n{rolls} of {} referencing workloads would roll\n",
        impact.workloads.len()
    ));
    out
}
