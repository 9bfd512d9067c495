//! Planning a workload admission: for each source the template references,
//! where its references should point, which snapshots must be created
//! first, and what the workload's records say afterwards (docs/design.md,
//! "Workload admission" and "A rollback always wins").
//!
//! Planning does no I/O of its own: it gets the request, the settings, the
//! clock and a [`Lookup`] for the few objects a decision may need (a
//! source to snapshot, the revisions a rollback is looked up in), which
//! the admission answers from the host and a test from plain data.

//!
//! - this module: the plan, and each source's snapshot;
//! - [`judge`]: what kind of write the admission is;
//! - [`kept`]: that what it keeps was not revoked and still exists;
//! - [`record`]: renewals and the rollback record.

mod judge;
mod kept;
mod record;
pub mod rewrite;

use crate::model::object::ObjectExt;
use serde_json::Value;

use crate::host::reads::Lookup;
use crate::host::Names;
use crate::model::content::{self, Content};
use crate::model::keys;
use crate::model::kinds::WorkloadKind;
use crate::model::optin::OptIn;
use crate::model::records::Rollback;
use crate::model::references::{self, Reference, SourceRefs};
use crate::model::request::{Rejection, SAY};
use crate::model::settings::{OnMissingSource, OnSnapshotFailure, Settings};
use crate::model::source::{SourceId, SourceKind, SA_TOKEN};
use crate::model::template::{self, Mapping, Snapshots};

/// Where a source's references end up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Snapshot(String),
    /// Back to (or left at) the source name, with no mapping entry.
    Source,
}

/// A snapshot this admission must create before it may reference it.
pub struct Write {
    pub group: usize,
    pub name: String,
    pub object: Value,
}

/// What kind of write the admission is, judged on the normalised templates
/// (snapshot names replaced by their sources).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    Create,
    /// Nothing a user would call a template change: a scale, a label edit,
    /// a re-apply, a resync's no-op update.
    NoOp,
    /// The host's own watch rollout: only references moved.
    WatchRollout,
    /// The template of an existing revision was put back.
    Rollback,
    /// Only references moved, by hand: kept, as the user wrote them.
    Repointed,
    /// A real change (image, `rollout restart`, any edit): config moves
    /// forward with it.
    RollForward,
}

impl Change {
    /// Whether a due renewal may take fresh snapshots at this admission. A
    /// rollback never renews (it would restore the old image with new
    /// config); neither does any other write that moves references, which
    /// keeps the move as it was made.
    fn may_renew(self) -> bool {
        matches!(self, Change::Create | Change::NoOp | Change::RollForward)
    }

    /// Whether references that name a snapshot keep it.
    fn keeps_snapshots(self) -> bool {
        !matches!(self, Change::RollForward)
    }
}

pub struct Plan {
    pub groups: Vec<SourceRefs>,
    pub targets: Vec<Target>,
    pub writes: Vec<Write>,
    pub warnings: Vec<String>,
    /// The `renewed-at` to write (unix seconds), if renew-duration is set.
    pub renewed_at: Option<i64>,
    /// The rollback record afterwards (`None`: no record).
    pub rollback: Option<Rollback>,
    pub change: Change,
}

/// Decides, for each source the template references, where it should point.
pub(crate) struct Planner<'a> {
    pub settings: &'a Settings,
    /// The request's namespace, where snapshots are made.
    pub namespace: &'a str,
    pub lookup: &'a dyn Lookup,
    /// The host's clock (unix seconds): renewals and rollbacks are dated.
    pub now: i64,
    pub kind: WorkloadKind,
    pub object: &'a Value,
    pub old: Option<&'a Value>,
    pub optin: &'a OptIn,
}

/// The sources this template's admission may read fresh, as known before
/// the write is classified: each one the workload snapshots and the
/// template names by its own name (not a snapshot), as a CREATE, a roll
/// forward and a re-applied manifest do. The planner reads no other
/// source for such a template (a snapshot kept costs no read), and a host
/// reads these ahead, beside the policy (serve's prefetch), so that the
/// rule is written here once. Nothing, for a template the policy refuses
/// for naming too many sources, or for names that are not names (only a
/// forged review carries one; the API server refuses them).
pub fn reads_ahead(template: &Value, optin: &OptIn, settings: &Settings) -> Vec<SourceRefs> {
    if references::distinct(&references::collect(template)) > references::MAX_SOURCES {
        return Vec::new();
    }
    crate::model::template::own_groups(template)
        .into_iter()
        .filter(|g| crate::model::selection::is_dns_subdomain(&g.id.name))
        .filter(|g| optin.snapshots(&g.id, settings) && g.refs.iter().any(|r| r.name == g.id.name))
        .collect()
}

/// One lookup of the workload's revisions, made only when needed.
#[derive(Default, Clone, Copy)]
struct RevisionMatch {
    /// A revision's template equals the new one byte for byte (minus the
    /// controller's additions): `kubectl rollout undo` put it back.
    exact: bool,
    /// A revision's template equals the new one once normalised.
    normalised: bool,
}

impl<'a> Planner<'a> {
    fn template(&self) -> &'a Value {
        self.object.pointer(self.kind.template()).unwrap_or(&Value::Null)
    }

    /// What the live object opted in, before this write.
    fn old_optin(&self) -> Option<OptIn> {
        let annotations = self.old?.annotations();
        OptIn::from_annotations(annotations, self.settings).ok()
    }

    fn old_template(&self) -> Option<&'a Value> {
        self.old.and_then(|o| o.pointer(self.kind.template()))
    }

    pub fn plan(&self) -> Result<Plan, Rejection> {
        let settings = self.settings;
        let template = self.template();
        let old_template = self.old_template();
        let refs = references::collect(template);
        let old_refs = old_template.map(references::collect).unwrap_or_default();
        let known = self.known_snapshots(&refs, &old_refs);
        let groups = template::group_by_source(&refs, &known);
        let mut warnings = Vec::new();
        let change = self.classify(&refs, &old_refs, &known, &mut warnings);
        let old_mapping = old_template.map(Mapping::of).unwrap_or_default();
        let (renewing, renewed_at) = self.renewal(change);

        let mut targets = Vec::with_capacity(groups.len());
        let mut writes = Vec::new();
        for (g, group) in groups.iter().enumerate() {
            let current = current_snapshot(group);
            if !self.optin.snapshots(&group.id, settings) {
                // Not opted in: references go back to the source on the
                // update that drops the opt-in, and on a roll-forward. A
                // pinned snapshot otherwise stays: a rollback restores its
                // revision exactly (`rollout undo` of a StatefulSet or
                // DaemonSet restores the template, not the annotations), and
                // a watch rollout of another source or a scale must not
                // undo that.
                let dropped = self.old_optin().is_some_and(|o| o.snapshots(&group.id, settings));
                let keep = match change {
                    Change::Rollback | Change::WatchRollout | Change::Repointed => true,
                    Change::NoOp => !dropped,
                    Change::Create | Change::RollForward => false,
                };
                targets.push(match (current, keep) {
                    (Some(snap), true) => Target::Snapshot(snap),
                    _ => Target::Source,
                });
                continue;
            }
            let keep = if renewing {
                None
            } else if let Some(snap) = &current {
                change.keeps_snapshots().then(|| snap.clone())
            } else if change == Change::NoOp {
                // Re-applied manifest with source names (e.g. server-side
                // apply): nothing changed, so keep what the live object uses.
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
        self.check_kept(change, (&groups, &targets), &writes, &old_refs, &mut warnings)?;
        let rollback = self.rollback_record(change, renewing, &groups, &targets, &old_refs, &known);
        Ok(Plan {
            groups,
            targets,
            writes,
            warnings,
            renewed_at,
            rollback,
            change,
        })
    }

    /// Every snapshot either template names: the mappings, plus unmapped
    /// names recognised by what they are (our label and source-name
    /// annotation). Only snapshot-shaped names cost a read, and that read is
    /// the one a snapshot of that name would need anyway.
    fn known_snapshots(&self, refs: &[Reference], old_refs: &[Reference]) -> Snapshots {
        let mut known = Snapshots::of(self.template());
        if let Some(old) = self.old_template() {
            known.add_mapping(&Mapping::of(old));
        }
        // A request's old object is not bounded by the limit on the new
        // one (docs/design.md, "Limits"): no more reads for it either.
        let mut read = std::collections::BTreeSet::new();
        for r in refs.iter().chain(old_refs) {
            if known.contains(r.kind, &r.name) || !template::looks_like_snapshot(&r.name) {
                continue;
            }
            if !read.insert((r.kind, r.name.as_str())) {
                continue;
            }
            if read.len() > references::MAX_SOURCES {
                break;
            }
            if let Ok(Some(object)) = self.lookup.source(r.kind, &r.name) {
                if let Some(source) = keys::snapshot_source(&object) {
                    known.insert(r.kind, &r.name, source);
                }
            }
        }
        known
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
        let source = match self.lookup.source(id.kind, &id.name) {
            Ok(s) => s,
            Err(e) => {
                return match self.settings.on_snapshot_failure {
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
            return match self.settings.on_missing_source {
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
        if keys::is_snapshot(&source) {
            // Only reachable when the name was not recognised as a snapshot
            // (its source-name annotation is gone): never copy a copy.
            warnings.push(format!(
                "{SAY}{id} is a snapshot without a source-name annotation; left its references unchanged"
            ));
            return Ok(None);
        }
        if id.kind == SourceKind::Secret && source.get("type").and_then(Value::as_str) == Some(SA_TOKEN) {
            warnings.push(format!("{SAY}{id} is a service-account token and is never snapshotted"));
            return Ok(None);
        }
        let content = match Content::from_object(id.kind, &source) {
            Ok(c) => c.subset(group.key_subset().as_ref()),
            Err(e) => return Err(Rejection::new(format!("{SAY}{id} has malformed content: {e}"), 400)),
        };
        let rv = source.resource_version();
        let Some(name) = self.name_of(id, &content, warnings)? else {
            return Ok(None);
        };
        let object = content::snapshot_object(id, self.namespace, &name, rv, &content);
        Ok(Some((name, object)))
    }

    /// The name the snapshot of `content` gets. `Ok(None)` leaves the
    /// references as they are; `Err` rejects the request, as does content
    /// that was revoked: no snapshot of it is made again, and leaving the
    /// reference to the source would have the pods read it from there
    /// (docs/design.md, "Revocation").
    fn name_of(
        &self,
        id: &SourceId,
        content: &Content,
        warnings: &mut Vec<String>,
    ) -> Result<Option<String>, Rejection> {
        match self.lookup.snapshot_name(id, content) {
            Ok(Names {
                revoked: Some(revoked), ..
            }) => Err(Rejection::new(
                format!(
                    "{SAY}{id} holds content {revoked} (snapshot {}): rotate it",
                    revoked.snapshot
                ),
                403,
            )),
            Ok(names) => Ok(Some(names.name)),
            Err(e) => match self.settings.on_snapshot_failure {
                OnSnapshotFailure::Reject => Err(Rejection::new(
                    format!("{SAY}could not name a snapshot of {id}: {e}"),
                    500,
                )),
                OnSnapshotFailure::Warn => {
                    warnings.push(format!(
                        "{SAY}could not name a snapshot of {id}, left its references unchanged: {e}"
                    ));
                    Ok(None)
                }
            },
        }
    }
}

/// The snapshot every reference of the group names, if they all name one.
fn current_snapshot(group: &SourceRefs) -> Option<String> {
    let first = &group.refs.first()?.name;
    (first != &group.id.name && group.refs.iter().all(|r| &r.name == first)).then(|| first.clone())
}
