//! `history` and `diff`: which config each revision of a workload runs,
//! read from the cluster alone. Every revision the controller keeps
//! (ReplicaSets, ControllerRevisions) names its snapshots in its template,
//! and a snapshot is immutable, so the config of revision 3 is still there
//! to read while revision 3 is.
//!
//! Secret values never leave this module: a Secret's keys are compared by
//! a digest of their values and shown by name only.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{anyhow, bail, Result};
use config_snapshot_policy::checksum::checksum_key;
use config_snapshot_policy::content::hex;
use config_snapshot_policy::keys;
use config_snapshot_policy::kinds::{self, WorkloadKind};
use config_snapshot_policy::references;
use config_snapshot_policy::source::SourceKind;
use config_snapshot_policy::template::{self, Snapshots};
use serde::Serialize;
use serde_json::Value;
use sha2::Digest as _;

use crate::memory::controllers::{REVISION_ANNOTATION, REVISION_HISTORY_ANNOTATION};
use crate::view::View;

/// A workload named the way kubectl takes it: `deploy/web`,
/// `statefulset/db`, `daemonsets/agent`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub kind: WorkloadKind,
    pub name: String,
}

impl Target {
    pub fn parse(text: &str) -> Result<Target> {
        let (kind, name) = text
            .split_once('/')
            .filter(|(_, n)| !n.is_empty())
            .ok_or_else(|| anyhow!("{text:?}: name a workload as KIND/NAME, e.g. deploy/web"))?;
        let Some(kind) = kinds::named(kind).and_then(|k| WorkloadKind::from_kind(k.kind)) else {
            bail!("{kind}: only workloads (Deployments, StatefulSets, DaemonSets) keep revisions");
        };
        Ok(Target {
            kind,
            name: name.to_string(),
        })
    }

    /// The kind that holds this workload's revisions.
    pub fn revision_kind(&self) -> &'static str {
        self.kind.revisions().kind
    }

    fn template_path(&self) -> &'static str {
        self.kind.revisions().template.unwrap_or_default()
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.kind.kind().to_ascii_lowercase(), self.name)
    }
}

/// A source's values in one revision: a ConfigMap's as they are, a
/// Secret's as digests (never shown).
#[derive(Debug, Clone, PartialEq)]
enum Values {
    Plain(BTreeMap<String, String>),
    Hidden(BTreeMap<String, String>),
}

impl Values {
    fn of(kind: SourceKind, object: &Value) -> Values {
        let mut out = BTreeMap::new();
        for field in ["data", "binaryData", "stringData"] {
            if let Some(map) = object[field].as_object() {
                for (k, v) in map {
                    let text = v.as_str().unwrap_or_default();
                    let shown = if field == "binaryData" {
                        format!("<{} bytes, base64>", text.len())
                    } else {
                        text.to_string()
                    };
                    out.insert(k.clone(), shown);
                }
            }
        }
        match kind {
            SourceKind::ConfigMap => Values::Plain(out),
            SourceKind::Secret => Values::Hidden(
                out.into_iter()
                    .map(|(k, v)| (k, hex(&sha2::Sha256::digest(v.as_bytes()))))
                    .collect(),
            ),
        }
    }

    fn map(&self) -> &BTreeMap<String, String> {
        match self {
            Values::Plain(m) | Values::Hidden(m) => m,
        }
    }

    /// The text a diff compares: a ConfigMap's values; a Secret's key
    /// names, marked where the value differs from `before`'s (pass the
    /// older side as `before` when rendering the newer, None for the older).
    fn render(&self, before: Option<&Values>) -> String {
        let mut out = String::new();
        for (key, value) in self.map() {
            match self {
                Values::Plain(_) => {
                    let mut lines = value.lines();
                    let first = lines.next().unwrap_or_default();
                    out.push_str(&format!("{key}: {first}\n"));
                    for line in lines {
                        out.push_str(&format!("{:width$}  {line}\n", "", width = key.len()));
                    }
                }
                Values::Hidden(_) => {
                    let changed = before.and_then(|o| o.map().get(key)).is_some_and(|v| v != value);
                    let marker = if changed { "<hidden, changed>" } else { "<hidden>" };
                    out.push_str(&format!("{key}: {marker}\n"));
                }
            }
        }
        out
    }
}

/// How a revision gets a source's config.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase", tag = "state")]
pub enum State {
    /// Pinned to an immutable snapshot.
    Snapshot { snapshot: String },
    /// It named a snapshot that no longer exists.
    Collected { snapshot: String },
    /// Checksum mode (a host without the write capability): the live
    /// source, with a hash that rolls the workload out when it changes.
    Checksum,
    /// The live source, not opted in.
    Live,
    /// Optional and absent when the revision was made.
    OptionalMissing,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct KeyChanges {
    pub added: Vec<String>,
    pub removed: Vec<String>,
    pub changed: Vec<String>,
}

impl KeyChanges {
    fn between(before: Option<&Values>, after: Option<&Values>) -> Option<KeyChanges> {
        let (before, after) = (before?.map(), after?.map());
        let keys: BTreeSet<&String> = before.keys().chain(after.keys()).collect();
        let mut changes = KeyChanges {
            added: vec![],
            removed: vec![],
            changed: vec![],
        };
        for key in keys {
            match (before.get(key), after.get(key)) {
                (None, Some(_)) => changes.added.push(key.clone()),
                (Some(_), None) => changes.removed.push(key.clone()),
                (Some(a), Some(b)) if a != b => changes.changed.push(key.clone()),
                _ => {}
            }
        }
        Some(changes)
    }

    fn is_empty(&self) -> bool {
        self.added.is_empty() && self.removed.is_empty() && self.changed.is_empty()
    }

    fn describe(&self) -> String {
        let mut parts = Vec::new();
        for (what, keys) in [
            ("changed", &self.changed),
            ("added", &self.added),
            ("removed", &self.removed),
        ] {
            if !keys.is_empty() {
                parts.push(format!("{what} {}", keys.join(", ")));
            }
        }
        if parts.is_empty() {
            "unchanged".to_string()
        } else {
            parts.join("; ")
        }
    }
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SourceConfig {
    /// `configmap/app-config`.
    pub source: String,
    #[serde(flatten)]
    pub state: State,
    /// Since the previous revision kept, when both have the values.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub keys: Option<KeyChanges>,
    #[serde(skip)]
    values: Option<Values>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Revision {
    pub revision: i64,
    /// The ReplicaSet or ControllerRevision.
    pub name: String,
    pub age_seconds: Option<i64>,
    pub current: bool,
    /// The revisions this one was before a rollback made it current again.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub rollback_of: Vec<i64>,
    pub images: Vec<String>,
    pub sources: Vec<SourceConfig>,
    #[serde(skip)]
    template: Value,
}

#[derive(Debug, Clone, Serialize)]
pub struct History {
    pub workload: String,
    pub namespace: String,
    pub revisions: Vec<Revision>,
}

/// The revisions of `target` the cluster still keeps, oldest first.
pub fn history(cluster: &dyn View, target: &Target, namespace: &str, now: i64) -> Result<History> {
    let workload = cluster
        .get(target.kind.kind(), namespace, &target.name)
        .ok_or_else(|| anyhow!("{target} not found in namespace {namespace}"))?;
    let uid = workload["metadata"]["uid"].clone();
    let mut kept: Vec<Value> = cluster
        .objects()
        .into_iter()
        .filter(|o| o["kind"] == target.revision_kind() && o["metadata"]["namespace"] == namespace)
        .filter(|o| {
            o["metadata"]["ownerReferences"]
                .as_array()
                .is_some_and(|refs| refs.iter().any(|r| r["uid"] == uid))
        })
        .collect();
    if kept.is_empty() {
        bail!("{target} has no revisions yet (its controller has not made one)");
    }
    kept.sort_by_key(|r| revision_number(target, r));
    let newest = kept.last().map(|r| revision_number(target, r));
    let mut revisions: Vec<Revision> = Vec::new();
    for object in &kept {
        let template = object.pointer(target.template_path()).cloned().unwrap_or(Value::Null);
        let mut sources = sources_of(cluster, namespace, &template);
        if let Some(previous) = revisions.last() {
            for source in &mut sources {
                let before = previous.sources.iter().find(|s| s.source == source.source);
                source.keys = KeyChanges::between(before.and_then(|b| b.values.as_ref()), source.values.as_ref());
            }
        }
        let number = revision_number(target, object);
        revisions.push(Revision {
            revision: number,
            name: object["metadata"]["name"].as_str().unwrap_or_default().to_string(),
            age_seconds: object["metadata"]["creationTimestamp"]
                .as_str()
                .and_then(config_snapshot_policy::duration::parse_rfc3339)
                .map(|t| (now - t).max(0)),
            current: Some(number) == newest,
            rollback_of: object["metadata"]["annotations"][REVISION_HISTORY_ANNOTATION]
                .as_str()
                .map(|h| h.split(',').filter_map(|n| n.trim().parse().ok()).collect())
                .unwrap_or_default(),
            images: template["spec"]["containers"]
                .as_array()
                .map(|cs| {
                    cs.iter()
                        .filter_map(|c| c["image"].as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default(),
            sources,
            template,
        });
    }
    Ok(History {
        workload: target.to_string(),
        namespace: namespace.to_string(),
        revisions,
    })
}

fn revision_number(target: &Target, revision: &Value) -> i64 {
    if target.revision_kind() == "ReplicaSet" {
        revision["metadata"]["annotations"][REVISION_ANNOTATION]
            .as_str()
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    } else {
        revision["revision"].as_i64().unwrap_or(0)
    }
}

/// Each source a revision's template reads, and where its config comes from.
fn sources_of(cluster: &dyn View, namespace: &str, template: &Value) -> Vec<SourceConfig> {
    let refs = references::collect(template);
    let mut known = Snapshots::of(template);
    // A snapshot the mapping does not name is still recognised by its labels.
    for r in &refs {
        if known.contains(r.kind, &r.name) || !template::looks_like_snapshot(&r.name) {
            continue;
        }
        if let Some(object) = cluster.get(r.kind.kind(), namespace, &r.name) {
            if keys::is_snapshot(&object) {
                if let Some(source) = object["metadata"]["annotations"][keys::SOURCE_NAME].as_str() {
                    known.insert(r.kind, &r.name, source);
                }
            }
        }
    }
    template::group_by_source(&refs, &known)
        .into_iter()
        .map(|group| {
            let id = group.id.clone();
            let named = &group.refs[0].name;
            let object = cluster.get(id.kind.kind(), namespace, named);
            let (state, values) = if known.contains(id.kind, named) {
                match &object {
                    Some(o) => (
                        State::Snapshot {
                            snapshot: named.clone(),
                        },
                        Some(Values::of(id.kind, o)),
                    ),
                    None => (
                        State::Collected {
                            snapshot: named.clone(),
                        },
                        None,
                    ),
                }
            } else if template::template_annotation(template, &checksum_key(&id)).is_some() {
                (State::Checksum, None)
            } else if object.is_none() && group.all_optional() {
                (State::OptionalMissing, None)
            } else {
                (State::Live, None)
            };
            SourceConfig {
                source: id.to_string(),
                state,
                keys: None,
                values,
            }
        })
        .collect()
}

/// What changed between two revisions: each source's values and the
/// template, snapshot names not counted.
#[derive(Debug, Clone, Serialize)]
pub struct Diff {
    pub from: i64,
    pub to: i64,
    /// Unified diffs, by source (`configmap/app-config`), of the ones that differ.
    pub sources: BTreeMap<String, String>,
    /// The unified diff of the pod templates, if they differ.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
    /// Sources whose config cannot be compared (not snapshotted, or collected).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub unknown: BTreeMap<String, String>,
}

impl Diff {
    pub fn differs(&self) -> bool {
        !self.sources.is_empty() || self.template.is_some()
    }
}

pub fn diff(history: &History, from: i64, to: i64) -> Result<Diff> {
    let find = |n: i64| {
        history.revisions.iter().find(|r| r.revision == n).ok_or_else(|| {
            let kept: Vec<String> = history.revisions.iter().map(|r| r.revision.to_string()).collect();
            anyhow!("{} has no revision {n} (kept: {})", history.workload, kept.join(", "))
        })
    };
    let (a, b) = (find(from)?, find(to)?);
    let mut out = Diff {
        from,
        to,
        sources: BTreeMap::new(),
        template: None,
        unknown: BTreeMap::new(),
    };
    let names: BTreeSet<&String> = a.sources.iter().chain(&b.sources).map(|s| &s.source).collect();
    for name in names {
        let va = a.sources.iter().find(|s| &s.source == name);
        let vb = b.sources.iter().find(|s| &s.source == name);
        for (rev, side) in [(a, va), (b, vb)] {
            if let Some(s) = side.filter(|s| s.values.is_none()) {
                out.unknown.insert(
                    name.clone(),
                    format!("revision {}: {}", rev.revision, describe_state(&s.state)),
                );
            }
        }
        let left = va.and_then(|s| s.values.as_ref());
        let right = vb.and_then(|s| s.values.as_ref());
        let text_a = left.map(|v| v.render(None)).unwrap_or_default();
        let text_b = right.map(|v| v.render(left)).unwrap_or_default();
        if let Some(d) = unified(&text_a, &text_b, name, from, to) {
            out.sources.insert(name.clone(), d);
        }
    }
    let yaml = |r: &Revision| serde_yaml::to_string(&template::normalise(&r.template)).unwrap_or_default();
    out.template = unified(&yaml(a), &yaml(b), "template", from, to);
    Ok(out)
}

fn unified(a: &str, b: &str, what: &str, from: i64, to: i64) -> Option<String> {
    if a == b {
        return None;
    }
    let diff = similar::TextDiff::from_lines(a, b);
    Some(
        diff.unified_diff()
            .context_radius(3)
            .header(&format!("{what} (revision {from})"), &format!("{what} (revision {to})"))
            .to_string(),
    )
}

fn describe_state(state: &State) -> String {
    match state {
        State::Snapshot { snapshot } => format!("snapshot {snapshot}"),
        State::Collected { snapshot } => format!("snapshot {snapshot} no longer exists (collected or deleted)"),
        State::Checksum => "checksum mode, no snapshot (the live source)".into(),
        State::Live => "not snapshotted (the live source)".into(),
        State::OptionalMissing => "optional, and missing".into(),
    }
}

/// Colour, when the output is a terminal and NO_COLOR is not set.
#[derive(Debug, Clone, Copy)]
pub struct Style {
    pub colour: bool,
}

impl Style {
    pub fn for_stdout() -> Style {
        use std::io::IsTerminal;
        Style {
            colour: std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty()),
        }
    }

    fn paint(&self, code: &str, text: &str) -> String {
        if self.colour {
            format!("\x1b[{code}m{text}\x1b[0m")
        } else {
            text.to_string()
        }
    }
}

fn age(seconds: Option<i64>) -> String {
    let Some(s) = seconds else { return "?".into() };
    match s {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

/// The history as a table: one line per revision, one indented line per
/// source.
pub fn render_history(history: &History, style: Style) -> String {
    let rows: Vec<[String; 4]> = history
        .revisions
        .iter()
        .map(|r| {
            let mut note = String::new();
            if r.current {
                note.push_str("current");
            }
            if !r.rollback_of.is_empty() {
                let was: Vec<String> = r.rollback_of.iter().map(i64::to_string).collect();
                if !note.is_empty() {
                    note.push_str(", ");
                }
                note.push_str(&format!("rollback to revision {}'s template", was.join(", ")));
            }
            [r.revision.to_string(), age(r.age_seconds), r.images.join(", "), note]
        })
        .collect();
    let header = ["REVISION", "AGE", "IMAGES", ""];
    let width = |i: usize| {
        rows.iter()
            .map(|r| r[i].len())
            .chain([header[i].len()])
            .max()
            .unwrap_or(0)
    };
    let (w0, w1, w2) = (width(0), width(1), width(2));
    let mut out = format!(
        "{} in {}: {} revision(s) kept\n",
        history.workload,
        history.namespace,
        history.revisions.len()
    );
    out.push_str(format!("{:w0$}  {:w1$}  {:w2$}", header[0], header[1], header[2]).trim_end());
    out.push('\n');
    for (r, row) in history.revisions.iter().zip(&rows) {
        let line = format!("{:w0$}  {:w1$}  {:w2$}  {}", row[0], row[1], row[2], row[3]);
        let line = line.trim_end();
        out.push_str(&if r.current {
            style.paint("1", line)
        } else {
            line.to_string()
        });
        out.push('\n');
        let sw = r.sources.iter().map(|s| s.source.len()).max().unwrap_or(0);
        for s in &r.sources {
            let mut detail = describe_state(&s.state);
            if let Some(k) = s.keys.as_ref() {
                detail.push_str(&format!(" ({})", k.describe()));
            } else if matches!(s.state, State::Snapshot { .. }) && r.revision != history.revisions[0].revision {
                detail.push_str(" (new source)");
            }
            let detail = match &s.state {
                State::Collected { .. } => style.paint("33", &detail),
                _ if s.keys.as_ref().is_some_and(|k| !k.is_empty()) => style.paint("36", &detail),
                _ => detail,
            };
            out.push_str(&format!("{:w0$}  {:sw$}  {detail}\n", "", s.source));
        }
    }
    out
}

pub fn render_diff(diff: &Diff, style: Style) -> String {
    let mut out = String::new();
    for (source, why) in &diff.unknown {
        out.push_str(&format!("# {source}: {why}\n"));
    }
    for text in diff.sources.values().chain(diff.template.as_ref()) {
        for line in text.lines() {
            let painted = match line.chars().next() {
                Some('+') if !line.starts_with("+++") => style.paint("32", line),
                Some('-') if !line.starts_with("---") => style.paint("31", line),
                Some('@') => style.paint("36", line),
                _ => line.to_string(),
            };
            out.push_str(&painted);
            out.push('\n');
        }
    }
    if !diff.differs() {
        out.push_str(&format!(
            "revisions {} and {} run the same config and template\n",
            diff.from, diff.to
        ));
    }
    out
}

/// The objects `history` needs, read from the API server with kube-rs: the
/// workload, its revisions, and the ConfigMaps and Secrets they name (each
/// read by name: nothing else in the namespace is fetched).
pub async fn fetch(client: kube::Client, target: &Target, namespace: &str) -> Result<crate::view::Objects> {
    use crate::serve::cache::{api_resource, trim};
    use kube::api::{Api, DynamicObject, ListParams};
    let api = |kind: &str| -> Api<DynamicObject> {
        let resource = api_resource(kind).expect("a kind of the table");
        Api::namespaced_with(client.clone(), namespace, &resource)
    };
    let as_value = |kind: &str, object: DynamicObject| -> Result<Value> {
        Ok(trim(object, &api_resource(kind).expect("a kind of the table")))
    };
    let workload = api(target.kind.kind())
        .get_opt(&target.name)
        .await
        .map_err(|e| anyhow!("reading {target}: {e}"))?
        .ok_or_else(|| anyhow!("{target} not found in namespace {namespace}"))?;
    let uid = workload.metadata.uid.clone();
    let mut objects = vec![as_value(target.kind.kind(), workload)?];
    let revisions = api(target.revision_kind())
        .list(&ListParams::default())
        .await
        .map_err(|e| anyhow!("listing {}s: {e}", target.revision_kind()))?;
    let mut names: BTreeSet<(SourceKind, String)> = BTreeSet::new();
    for revision in revisions.items {
        let owned = revision
            .metadata
            .owner_references
            .as_ref()
            .is_some_and(|refs| refs.iter().any(|r| Some(&r.uid) == uid.as_ref()));
        if !owned {
            continue;
        }
        let value = as_value(target.revision_kind(), revision)?;
        if let Some(template) = value.pointer(target.template_path()) {
            names.extend(references::collect(template).into_iter().map(|r| (r.kind, r.name)));
        }
        objects.push(value);
    }
    for (kind, name) in names {
        if let Some(object) = api(kind.kind())
            .get_opt(&name)
            .await
            .map_err(|e| anyhow!("reading {}/{name}: {e}", kind.tag()))?
        {
            objects.push(as_value(kind.kind(), object)?);
        }
    }
    Ok(crate::view::Objects(objects))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workloads_are_named_as_kubectl_names_them() {
        assert_eq!(Target::parse("deploy/web").unwrap().kind.kind(), "Deployment");
        assert_eq!(Target::parse("StatefulSets/db").unwrap().kind.kind(), "StatefulSet");
        assert_eq!(Target::parse("ds/agent").unwrap().revision_kind(), "ControllerRevision");
        assert!(Target::parse("web").unwrap_err().to_string().contains("KIND/NAME"));
        assert!(Target::parse("pod/web")
            .unwrap_err()
            .to_string()
            .contains("keep revisions"));
    }

    #[test]
    fn secret_values_are_compared_but_never_rendered() {
        let a = Values::of(
            SourceKind::Secret,
            &serde_json::json!({"data": {"password": "Y2FuYXJ5"}}),
        );
        let b = Values::of(
            SourceKind::Secret,
            &serde_json::json!({"data": {"password": "b3RoZXI="}}),
        );
        let text = a.render(None) + &b.render(Some(&a));
        assert!(!text.contains("Y2FuYXJ5") && !text.contains("b3RoZXI="), "{text}");
        assert!(text.contains("password: <hidden, changed>"), "{text}");
        let changes = KeyChanges::between(Some(&a), Some(&b)).unwrap();
        assert_eq!(changes.changed, ["password"]);
    }
}
