//! Workload admission (SPEC §5.1–5.3, 5.6, 5.7): snapshot the opted-in
//! sources and rewrite the pod template to reference the snapshots.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;

use crate::content::{self, Content};
use crate::duration::{format_rfc3339, parse_rfc3339};
use crate::host::{Cluster, WriteError};
use crate::keys;
use crate::kind::{SourceId, SourceKind};
use crate::optin::OptIn;
use crate::references::{self, SourceRefs};
use crate::request::{Outcome, Rejection, SAY};
use crate::settings::{OnMissingSource, OnSnapshotFailure, Settings, WithoutSnapshotCapability};
use crate::sweep;
use crate::template::{self, Mapping};

/// What every handler needs to know about the request it serves.
pub struct Context<'a> {
    pub cluster: Cluster<'a>,
    pub settings: &'a Settings,
    pub namespace: &'a str,
    pub dry_run: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkloadKind {
    Deployment,
    StatefulSet,
    DaemonSet,
}

impl WorkloadKind {
    pub const ALL: [WorkloadKind; 3] = [
        WorkloadKind::Deployment,
        WorkloadKind::StatefulSet,
        WorkloadKind::DaemonSet,
    ];

    pub fn from_kind(kind: &str) -> Option<Self> {
        match kind {
            "Deployment" => Some(WorkloadKind::Deployment),
            "StatefulSet" => Some(WorkloadKind::StatefulSet),
            "DaemonSet" => Some(WorkloadKind::DaemonSet),
            _ => None,
        }
    }

    pub fn kind(self) -> &'static str {
        match self {
            WorkloadKind::Deployment => "Deployment",
            WorkloadKind::StatefulSet => "StatefulSet",
            WorkloadKind::DaemonSet => "DaemonSet",
        }
    }
}

/// Just the annotations, for the pass-through check: serde skips the rest of
/// the object without building it.
#[derive(Deserialize, Default)]
#[serde(default)]
struct Quick {
    metadata: QuickMeta,
    spec: QuickSpec,
}
#[derive(Deserialize, Default)]
#[serde(default)]
struct QuickMeta {
    annotations: Option<BTreeMap<String, String>>,
}
#[derive(Deserialize, Default)]
#[serde(default)]
struct QuickSpec {
    template: QuickTemplate,
}
#[derive(Deserialize, Default)]
#[serde(default)]
struct QuickTemplate {
    metadata: QuickMeta,
}

/// Where a source's references end up.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Target {
    Snapshot(String),
    /// Back to (or left at) the source name, with no mapping entry.
    Source,
}

/// A snapshot this admission must create before it may reference it.
struct Write {
    group: usize,
    name: String,
    object: Value,
}

pub fn admit(
    ctx: &Context,
    kind: WorkloadKind,
    operation: &str,
    raw: &RawValue,
    old_raw: Option<&RawValue>,
) -> Outcome {
    let quick: Quick = match serde_json::from_str(raw.get()) {
        Ok(q) => q,
        Err(e) => return Outcome::reject(format!("{SAY}invalid {}: {e}", kind.kind()), 400),
    };
    let marked = quick
        .spec
        .template
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.keys().any(|k| keys::is_policy_template_annotation(k)));
    if !marked && !OptIn::any_opt_in(quick.metadata.annotations.as_ref(), ctx.settings) {
        return Outcome::accept();
    }

    let mut object: Value = match serde_json::from_str(raw.get()) {
        Ok(v) => v,
        Err(e) => return Outcome::reject(format!("{SAY}invalid {}: {e}", kind.kind()), 400),
    };
    let optin = match OptIn::from_annotations(
        object.pointer("/metadata/annotations").and_then(Value::as_object),
        ctx.settings,
    ) {
        Ok(o) => o,
        Err(e) => return Outcome::reject(format!("{SAY}{e}"), 400),
    };
    let Some(template) = object.pointer("/spec/template") else {
        return Outcome::accept();
    };
    let old_template: Option<Value> = match (operation, old_raw) {
        ("UPDATE", Some(old)) => serde_json::from_str::<Value>(old.get())
            .ok()
            .and_then(|mut o| o.pointer_mut("/spec/template").map(Value::take)),
        _ => None,
    };

    let planner = Planner::new(ctx, kind, &object, template, &optin, old_template.as_ref());
    let plan = match planner.plan() {
        Ok(plan) => plan,
        Err(rejection) => return rejection.into(),
    };
    let Plan {
        groups,
        mut targets,
        writes,
        mut warnings,
        renewed_at,
        ..
    } = plan;

    // Create every snapshot before rewriting anything: a reference to a
    // snapshot that does not exist would break the pods.
    let mut created_sources: Vec<(SourceId, String)> = Vec::new();
    if !ctx.dry_run {
        for (i, w) in writes.iter().enumerate() {
            let id = &groups[w.group].id;
            match ctx.cluster.create_snapshot(&w.object) {
                Ok(true) => created_sources.push((id.clone(), w.name.clone())),
                Ok(false) => {}
                Err(WriteError::Unsupported(m)) if i == 0 => {
                    return degrade(ctx, &mut object, &groups, &optin, &m);
                }
                Err(e) => match ctx.settings.on_snapshot_failure {
                    OnSnapshotFailure::Reject => {
                        return Outcome::reject(
                            format!("{SAY}could not create snapshot {} of {id}: {}", w.name, e.message()),
                            500,
                        );
                    }
                    OnSnapshotFailure::Warn => {
                        targets[w.group] = Target::Source;
                        warnings.push(format!(
                            "{SAY}could not create snapshot {} of {id}, left the reference to the source: {}",
                            w.name,
                            e.message()
                        ));
                    }
                },
            }
        }
        for (id, keep) in &created_sources {
            sweep::sweep(ctx, id, keep);
        }
    }

    let template = object.pointer_mut("/spec/template").expect("checked above");
    let original = template.clone();
    apply(template, &groups, &targets, &optin, renewed_at);
    let mutated = (*template != original).then_some(object);
    Outcome {
        accepted: true,
        message: None,
        code: None,
        mutated,
        warnings,
    }
}

struct Plan {
    groups: Vec<SourceRefs>,
    targets: Vec<Target>,
    writes: Vec<Write>,
    warnings: Vec<String>,
    /// The `renewed-at` to write (unix seconds), if renew-duration is set.
    renewed_at: Option<i64>,
}

/// Decides, for each source the template references, where it should point.
struct Planner<'a> {
    ctx: &'a Context<'a>,
    kind: WorkloadKind,
    object: &'a Value,
    template: &'a Value,
    optin: &'a OptIn,
    old_template: Option<&'a Value>,
}

impl<'a> Planner<'a> {
    fn new(
        ctx: &'a Context<'a>,
        kind: WorkloadKind,
        object: &'a Value,
        template: &'a Value,
        optin: &'a OptIn,
        old_template: Option<&'a Value>,
    ) -> Self {
        Planner {
            ctx,
            kind,
            object,
            template,
            optin,
            old_template,
        }
    }

    fn plan(&self) -> Result<Plan, Rejection> {
        let settings = self.ctx.settings;
        let mapping = Mapping::of(self.template);
        let refs = references::collect(self.template);
        let groups = template::group_by_source(&refs, &mapping);
        let mut warnings = Vec::new();

        // Only an UPDATE compares templates; a CREATE never needs the normal form.
        let normalised = self.old_template.map(|_| template::normalise(self.template));
        let same_as_old = match (self.old_template, &normalised) {
            (Some(old), Some(new)) => template::normalise(old) == *new,
            _ => false,
        };
        let old_mapping = self.old_template.map(Mapping::of).unwrap_or_default();
        let mut is_rollback: Option<bool> = None;

        let (renew_due, renewed_at) = self.renewal();

        let mut targets = Vec::with_capacity(groups.len());
        let mut writes = Vec::new();
        for (g, group) in groups.iter().enumerate() {
            if !self.optin.snapshots(&group.id, settings) {
                targets.push(Target::Source);
                continue;
            }
            let current = current_snapshot(group);
            let keep = if renew_due {
                None
            } else if let Some(snap) = &current {
                // Names a snapshot: keep it on CREATE, on a no-op UPDATE, and on a rollback.
                let keep = match self.old_template {
                    None => true,
                    Some(_) if same_as_old => true,
                    Some(_) => *is_rollback.get_or_insert_with(|| {
                        normalised
                            .as_ref()
                            .is_some_and(|n| self.matches_revision(n, &mut warnings))
                    }),
                };
                keep.then(|| snap.clone())
            } else if same_as_old {
                // Re-applied manifest with source names (e.g. server-side apply):
                // nothing changed, so keep what the live object uses.
                old_mapping.0.get(&group.id).cloned()
            } else {
                None
            };
            if let Some(name) = keep {
                targets.push(Target::Snapshot(name));
                continue;
            }
            match self.snapshot_of(group, current.as_deref(), &mut warnings)? {
                Some((name, object)) => {
                    writes.push(Write {
                        group: g,
                        name: name.clone(),
                        object,
                    });
                    targets.push(Target::Snapshot(name));
                }
                None => targets.push(match current {
                    Some(snap) => Target::Snapshot(snap),
                    None => Target::Source,
                }),
            }
        }
        Ok(Plan {
            groups,
            targets,
            writes,
            warnings,
            renewed_at,
        })
    }

    /// Whether a renewal is due now, and the `renewed-at` to record.
    fn renewal(&self) -> (bool, Option<i64>) {
        let Some(every) = self.optin.renew_secs else {
            return (false, None);
        };
        let last = template::template_annotation(self.template, keys::RENEWED_AT).and_then(parse_rfc3339);
        let now = self.ctx.cluster.now();
        match last {
            Some(t) if now.saturating_sub(t) < every as i64 => (false, Some(t)),
            _ => (true, Some(now)),
        }
    }

    /// Reads the source and builds its snapshot. `Ok(None)` leaves the
    /// references as they are; `Err` rejects the request.
    fn snapshot_of(
        &self,
        group: &SourceRefs,
        current: Option<&str>,
        warnings: &mut Vec<String>,
    ) -> Result<Option<(String, Value)>, Rejection> {
        let id = &group.id;
        let source = match self.ctx.cluster.get("v1", id.kind.kind(), self.ctx.namespace, &id.name) {
            Ok(s) => s,
            Err(e) => {
                return match self.ctx.settings.on_snapshot_failure {
                    OnSnapshotFailure::Reject => Err(Rejection::new(format!("{SAY}could not read {id}: {e}"), 500)),
                    OnSnapshotFailure::Warn => {
                        warnings.push(format!("{SAY}could not read {id}, left its references unchanged: {e}"));
                        Ok(None)
                    }
                };
            }
        };
        let Some(source) = source else {
            if let Some(snap) = current {
                warnings.push(format!("{SAY}{id} does not exist; kept snapshot {snap}"));
                return Ok(None);
            }
            if group.all_optional() {
                return Ok(None);
            }
            return match self.ctx.settings.on_missing_source {
                OnMissingSource::Warn => {
                    warnings.push(format!(
                        "{SAY}{id} does not exist yet; left the reference to it unchanged"
                    ));
                    Ok(None)
                }
                OnMissingSource::Reject => Err(Rejection::new(
                    format!("{SAY}{id} does not exist (onMissingSource is reject)"),
                    404,
                )),
            };
        };
        if id.kind == SourceKind::Secret && source.get("type").and_then(Value::as_str) == Some(SA_TOKEN) {
            warnings.push(format!("{SAY}{id} is a service-account token and is never snapshotted"));
            return Ok(None);
        }
        let content = match Content::from_object(id.kind, &source) {
            Ok(c) => c.subset(group.key_subset().as_ref()),
            Err(e) => return Err(Rejection::new(format!("{SAY}{id} has malformed content: {e}"), 400)),
        };
        let rv = source
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .unwrap_or("");
        Ok(Some(content::snapshot_object(id, self.ctx.namespace, rv, &content)))
    }

    /// A rollback puts back the template of an existing revision of this
    /// workload. The lookup lists the revisions with field masks, so only
    /// owners and templates cross the host boundary.
    fn matches_revision(&self, normalised: &Value, warnings: &mut Vec<String>) -> bool {
        let uid = self.object.pointer("/metadata/uid").and_then(Value::as_str);
        let selector = label_selector(self.object.pointer("/spec/selector/matchLabels"));
        let (kind, masks, path): (&str, &[&str], &str) = match self.kind {
            WorkloadKind::Deployment => (
                "ReplicaSet",
                &["metadata.ownerReferences", "spec.template"],
                "/spec/template",
            ),
            _ => (
                "ControllerRevision",
                &["metadata.ownerReferences", "data"],
                "/data/spec/template",
            ),
        };
        let revisions = match self
            .ctx
            .cluster
            .list("apps/v1", kind, self.ctx.namespace, selector, masks)
        {
            Ok(items) => items,
            Err(e) => {
                warnings.push(format!(
                    "{SAY}could not list {kind}s to detect a rollback, treated as a new rollout: {e}"
                ));
                return false;
            }
        };
        revisions.iter().any(|rev| {
            owned_by(rev, uid, self.kind.kind())
                && rev.pointer(path).is_some_and(|t| template::normalise(t) == *normalised)
        })
    }
}

pub const SA_TOKEN: &str = "kubernetes.io/service-account-token";

/// The snapshot every reference of the group names, if they all name one.
fn current_snapshot(group: &SourceRefs) -> Option<String> {
    let first = &group.refs.first()?.name;
    (first != &group.id.name && group.refs.iter().all(|r| &r.name == first)).then(|| first.clone())
}

fn owned_by(object: &Value, uid: Option<&str>, kind: &str) -> bool {
    let Some(owners) = object.pointer("/metadata/ownerReferences").and_then(Value::as_array) else {
        return false;
    };
    owners.iter().any(|o| {
        o.get("kind").and_then(Value::as_str) == Some(kind)
            && uid.is_none_or(|uid| o.get("uid").and_then(Value::as_str) == Some(uid))
    })
}

/// `matchLabels` as a label selector string, to narrow the revision list.
fn label_selector(match_labels: Option<&Value>) -> Option<String> {
    let labels = match_labels?.as_object()?;
    let parts: Vec<String> = labels
        .iter()
        .filter_map(|(k, v)| v.as_str().map(|v| format!("{k}={v}")))
        .collect();
    (!parts.is_empty()).then(|| parts.join(","))
}

/// Rewrites names and the policy's annotations in place.
fn apply(template: &mut Value, groups: &[SourceRefs], targets: &[Target], optin: &OptIn, renewed_at: Option<i64>) {
    let mut mapping = Mapping::default();
    for (group, target) in groups.iter().zip(targets) {
        let name = match target {
            Target::Snapshot(name) => {
                mapping.0.insert(group.id.clone(), name.clone());
                name.as_str()
            }
            Target::Source => group.id.name.as_str(),
        };
        for r in &group.refs {
            references::set_name(template, &r.pointer, name);
        }
    }
    let mut marks: Vec<(&str, String)> = Vec::new();
    if !mapping.0.is_empty() {
        marks.push((keys::SNAPSHOTS, mapping.to_annotation()));
    }
    if let (Some(_), Some(t)) = (optin.renew_secs, renewed_at) {
        marks.push((keys::RENEWED_AT, format_rfc3339(t)));
    }
    set_marks(template, marks);
}

/// Replaces the policy's template annotations with `marks`, leaving the
/// user's alone and not adding an empty map where there was none.
fn set_marks(template: &mut Value, marks: Vec<(&str, String)>) {
    let has_annotations = template.pointer("/metadata/annotations").is_some();
    if !has_annotations && marks.is_empty() {
        return;
    }
    if let Some(ann) = template::annotations_mut(template) {
        ann.retain(|k, _| !keys::is_policy_template_annotation(k));
        for (k, v) in marks {
            ann.insert(k.to_string(), Value::String(v));
        }
        if ann.is_empty() && !has_annotations {
            template["metadata"].as_object_mut().map(|m| m.remove("annotations"));
        }
    }
}

/// The host has no write capability (stock Kubewarden): SPEC §5.7.
fn degrade(ctx: &Context, object: &mut Value, groups: &[SourceRefs], optin: &OptIn, why: &str) -> Outcome {
    match ctx.settings.without_snapshot_capability {
        WithoutSnapshotCapability::Reject => Outcome::reject(
            format!("{SAY}this host cannot create snapshots ({why}) and withoutSnapshotCapability is reject"),
            500,
        ),
        WithoutSnapshotCapability::Warn => Outcome::accept_with(vec![format!(
            "{SAY}this host cannot create snapshots ({why}); references left unchanged, so config changes will not roll out and rollback will not restore config"
        )]),
        WithoutSnapshotCapability::Checksum => {
            let mut marks = Vec::new();
            let mut warnings = vec![format!(
                "{SAY}this host cannot create snapshots; stamped config checksums instead, so a config change rolls out on the next apply, but rollout undo will not restore old config"
            )];
            for group in groups {
                if !optin.snapshots(&group.id, ctx.settings) {
                    continue;
                }
                match ctx.cluster.get("v1", group.id.kind.kind(), ctx.namespace, &group.id.name) {
                    Ok(Some(source)) => {
                        if source.get("type").and_then(Value::as_str) == Some(SA_TOKEN) {
                            continue;
                        }
                        if let Ok(c) = Content::from_object(group.id.kind, &source) {
                            let hash = c.subset(group.key_subset().as_ref()).hash();
                            marks.push((checksum_key(&group.id), hash));
                        }
                    }
                    Ok(None) => {}
                    Err(e) => warnings.push(format!("{SAY}could not read {}: {e}", group.id)),
                }
            }
            let template = object.pointer_mut("/spec/template").expect("checked by caller");
            let original = template.clone();
            let targets = vec![Target::Source; groups.len()];
            apply(template, groups, &targets, &OptIn::default(), None);
            let marks: Vec<(&str, String)> = marks.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
            set_marks(template, marks);
            let changed = *template != original;
            Outcome {
                accepted: true,
                message: None,
                code: None,
                mutated: changed.then(|| object.clone()),
                warnings,
            }
        }
    }
}

/// `config-snapshot.io/checksum-<kind>-<name>`, the name part shortened with
/// a hash when it would pass the 63 characters an annotation name allows.
pub fn checksum_key(id: &SourceId) -> String {
    let name_part = format!("checksum-{}-{}", id.kind.tag(), id.name);
    if name_part.len() <= 63 {
        return format!("{}{name_part}", keys::PREFIX);
    }
    let digest = content::hex(&sha2::Sha256::digest(id.name.as_bytes()));
    let head = name_part[..52].trim_end_matches(['-', '.']);
    format!("{}{head}-{}", keys::PREFIX, &digest[..10])
}

use sha2::Digest;

#[cfg(test)]
#[path = "workload_tests.rs"]
pub(crate) mod tests;
