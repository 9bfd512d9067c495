//! Workload admission (docs/design.md, "Workload admission"): snapshot the
//! opted-in sources and rewrite the pod template to reference the
//! snapshots. [`crate::plan`] decides; this module carries it out.

use crate::model::object::ObjectExt;
use serde_json::value::RawValue;
use serde_json::Value;

use crate::admit::checksum;
use crate::admit::context::Context;
use crate::admit::skim::{opts_in, Annotated, AnnotationsSkim};
use crate::admit::sweep;
use crate::host::contract::Owner;
use crate::host::reads::Reads;
use crate::host::CallError;
use crate::model::keys;
use crate::model::kinds::WorkloadKind;
use crate::model::optin::OptIn;
use crate::model::records::WatchRollout;
use crate::model::references;
use crate::model::request::{Outcome, SAY};
use crate::model::settings::OnSnapshotFailure;
use crate::model::source::SourceId;
use crate::plan::rewrite::{self, annotation_path};
use crate::plan::{Change, Plan, Planner, Target};

/// An answer found before the last phase: a request refused, passed
/// through, or degraded to checksums ends there. (Boxed: an `Outcome` is
/// large, and the happy path should not carry its size.)
type Phase<T> = Result<T, Box<Outcome>>;

/// The request as the phases after [`prepare`] read it.
struct Admission {
    kind: WorkloadKind,
    object: Value,
    /// The live object, on an UPDATE.
    old: Option<Value>,
    optin: OptIn,
}

/// Admits a workload: prepare → plan → make snapshots → rewrite → adopt
/// (a standalone revision) → respond. Each phase can end the admission
/// with its answer.
pub fn admit(
    ctx: &Context,
    kind: WorkloadKind,
    operation: &str,
    raw: &RawValue,
    old_raw: Option<&RawValue>,
) -> Outcome {
    let phases = || -> Phase<Outcome> {
        let mut admission = prepare(ctx, kind, operation, raw, old_raw)?;
        let reads = Reads::new(&ctx.host, ctx.namespace);
        let mut plan = plan(ctx, &reads, &admission)?;
        if !ctx.dry_run {
            make_snapshots(ctx, &reads, &mut admission, &mut plan)?;
        }
        let original = admission.object.clone();
        let mut warnings = rewrite_object(&mut admission, plan);
        warnings.extend(adopt_standalone(ctx, &admission)?);
        let mutated = (admission.object != original).then_some(admission.object);
        Ok(Outcome {
            accepted: true,
            message: None,
            code: None,
            mutated,
            warnings,
        })
    };
    phases().unwrap_or_else(|answer| *answer)
}

/// Parses what the phases read, and ends here what needs no plan: a
/// workload that does not opt in (which keeps the host's records), one
/// without a pod template, one naming too many sources.
fn prepare(
    ctx: &Context,
    kind: WorkloadKind,
    operation: &str,
    raw: &RawValue,
    old_raw: Option<&RawValue>,
) -> Phase<Admission> {
    let invalid = |e: serde_json::Error| Outcome::reject(format!("{SAY}invalid {}: {e}", kind.kind()), 400);
    let quick: AnnotationsSkim = serde_json::from_slice(raw.get().as_bytes()).map_err(invalid)?;
    if !opts_in(&quick, ctx.settings) {
        return Err(keep_records(&quick, raw, old_raw.filter(|_| operation == "UPDATE")).into());
    }
    let object: Value = serde_json::from_str(raw.get()).map_err(invalid)?;
    let optin = OptIn::from_annotations(object.annotations(), ctx.settings)
        .map_err(|e| Outcome::reject(format!("{SAY}{e}"), 400))?;
    if object.pointer(kind.template()).is_none() {
        return Err(Outcome::accept().into());
    }
    let old = match (operation, old_raw) {
        ("UPDATE", Some(old)) => serde_json::from_str::<Value>(old.get()).ok(),
        _ => None,
    };
    if let Some(outcome) = too_many_sources(ctx, kind, &object) {
        return Err(outcome.into());
    }
    Ok(Admission {
        kind,
        object,
        old,
        optin,
    })
}

fn plan(ctx: &Context, reads: &Reads, admission: &Admission) -> Phase<Plan> {
    Planner {
        settings: ctx.settings,
        namespace: ctx.namespace,
        lookup: reads,
        now: ctx.host.now(),
        kind: admission.kind,
        object: &admission.object,
        old: admission.old.as_ref(),
        optin: &admission.optin,
    }
    .plan()
    .map_err(|rejection| Box::new(Outcome::from(rejection)))
}

/// Creates every snapshot before anything is rewritten: a reference to a
/// snapshot that does not exist would break the pods. Together where the
/// host can (one call, created concurrently); one by one where it cannot,
/// or for a single snapshot. Then sweeps the older versions of the sources
/// that got a new one.
fn make_snapshots(ctx: &Context, reads: &Reads, admission: &mut Admission, plan: &mut Plan) -> Phase<()> {
    let kind = admission.kind;
    // A standalone revision (a bare Job) is not a workload the host can
    // make an owner at once: it adopts its snapshots later, as revisions do.
    let owner = (!kind.is_standalone()).then(|| Owner::workload(kind, &admission.object));
    let mut answers: Vec<Result<bool, CallError>> = Vec::new();
    if plan.writes.len() > 1 {
        let objects: Vec<&Value> = plan.writes.iter().map(|w| &w.object).collect();
        match ctx.host.create_snapshots(&objects, owner.as_ref()) {
            Ok(all) => answers = all,
            Err(e) if e.unsupported() => {}
            Err(e) => answers = plan.writes.iter().map(|_| Err(e.clone())).collect(),
        }
    }
    let mut answers = answers.into_iter();
    let mut to_sweep: Vec<(SourceId, String)> = Vec::new();
    for (i, w) in plan.writes.iter().enumerate() {
        let id = &plan.groups[w.group].id;
        let answer = answers
            .next()
            .unwrap_or_else(|| ctx.host.create_snapshot(&w.object, owner.as_ref()));
        match answer {
            Ok(true) => to_sweep.push((id.clone(), w.name.clone())),
            Ok(false) => {}
            Err(e) if i == 0 && e.unsupported() => {
                let object = (kind, &mut admission.object);
                let degraded = checksum::degrade(ctx, reads, object, &plan.groups, &admission.optin, &e);
                return Err(degraded.into());
            }
            Err(e) => match ctx.settings.on_snapshot_failure {
                OnSnapshotFailure::Reject => {
                    return Err(Outcome::reject(
                        format!("{SAY}could not create snapshot {} of {id}: {e}", w.name),
                        500,
                    )
                    .into());
                }
                OnSnapshotFailure::Warn => {
                    plan.targets[w.group] = Target::Source;
                    plan.warnings.push(format!(
                        "{SAY}could not create snapshot {} of {id}, left the reference to the source: {e}",
                        w.name
                    ));
                }
            },
        }
    }
    for (id, keep) in &to_sweep {
        sweep::sweep(ctx, id, keep);
    }
    Ok(())
}

/// Points the template at the plan's targets and writes the records; the
/// plan's warnings are the answer's.
fn rewrite_object(admission: &mut Admission, plan: Plan) -> Vec<String> {
    let Admission {
        kind,
        object,
        old,
        optin,
    } = admission;
    let Some(template) = object.pointer_mut(kind.template()) else {
        return plan.warnings;
    };
    rewrite::apply(template, &plan.groups, &plan.targets, optin, plan.renewed_at);
    // A record carried from the live object keeps its generation; one this
    // write makes gets the generation the write really produces.
    let rollback = plan.rollback.map(|mut r| {
        if let (Change::Rollback, Some(old)) = (plan.change, &old) {
            r.generation = crate::model::records::generation_after(old, object);
        }
        r
    });
    rewrite::set_rollback(object, rollback.as_ref());
    carry_host_records(object, old.as_ref(), plan.change);
    plan.warnings
}

/// Keeps the annotations only the host writes as the live object has them.
fn carry_host_records(object: &mut Value, old: Option<&Value>, change: Change) {
    // An undo brings back the annotations its revision was made with,
    // pending changes and approvals among them, which speak of content
    // since gone: the workload keeps its own (the host clears a pending
    // change the rollback voids).
    if let (Change::Rollback, Some(old)) = (change, old) {
        for key in [keys::PENDING, keys::APPROVE, keys::SETTLE_UNTIL] {
            let kept = old.pointer(&annotation_path(key)).cloned();
            if object.pointer(&annotation_path(key)) != kept.as_ref() {
                rewrite::set_annotation(object, key, kept);
            }
        }
    }
    // The watch-rollout record changes only with the host's own rollout.
    // Copied from another object on CREATE, it speaks of that object's
    // generations; rewound by a rollback, it would reset the storm guard.
    let path = annotation_path(keys::WATCH_ROLLOUT);
    let kept = match old {
        Some(old) if !WatchRollout::made(object, old) => old.pointer(&path).cloned(),
        Some(_) => object.pointer(&path).cloned(),
        None => None,
    };
    if object.pointer(&path) != kept.as_ref() {
        rewrite::set_annotation(object, keys::WATCH_ROLLOUT, kept);
    }
}

/// A standalone revision (a bare Job) adopts the snapshots it uses, as a
/// controller's revisions do; it cannot be watched, which it is told.
fn adopt_standalone(ctx: &Context, admission: &Admission) -> Phase<Vec<String>> {
    let Admission {
        kind, object, optin, ..
    } = admission;
    let mut warnings = Vec::new();
    if !kind.is_standalone() {
        return Ok(warnings);
    }
    if !optin.watch.is_empty() {
        warnings.push(format!(
            "{SAY}{} {} cannot be watched: its template never changes, so it keeps the config it was created with",
            kind.kind(),
            object.name()
        ));
    }
    let template = object.pointer(kind.template()).unwrap_or(&Value::Null);
    let used = crate::admit::revision::used_snapshots(template);
    if !ctx.dry_run && !used.is_empty() {
        let adopted = crate::admit::revision::adopt(ctx, kind.row(), object.name(), used);
        if !adopted.accepted {
            return Err(adopted.into());
        }
        warnings.extend(adopted.warnings);
    }
    Ok(warnings)
}

/// A workload that stops opting in keeps the records the host made on it:
/// `kubectl rollout undo` replaces a Deployment's annotations with an older
/// revision's, so an undo to a revision from before the opt-in drops the
/// opt-in and the records together. An undo back to a watching revision
/// would then find neither: the storm guard would let the next watch
/// rollout through at once, however recent the last one, and the rollback
/// count would start again, below what a waiting rollout saw, so that
/// rollout would not be voided (docs/design.md, "Deferred effects").
/// Everything else about such a workload passes through.
fn keep_records(quick: &AnnotationsSkim, raw: &RawValue, old_raw: Option<&RawValue>) -> Outcome {
    let Some(old) = old_raw.and_then(|o| serde_json::from_str::<Annotated>(o.get()).ok()) else {
        return Outcome::accept();
    };
    let kept = old.into_records();
    if !quick.loses_records(&kept) {
        return Outcome::accept();
    }
    let Ok(mut object) = serde_json::from_str::<Value>(raw.get()) else {
        return Outcome::accept();
    };
    if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        if meta.get("annotations").is_some_and(Value::is_null) {
            meta.remove("annotations");
        }
    }
    for (key, record) in keys::RECORDS.iter().zip(kept) {
        if let Some(record) = record {
            rewrite::set_annotation(&mut object, key, Some(Value::String(record)));
        }
    }
    Outcome {
        mutated: Some(object),
        ..Outcome::accept()
    }
}

/// The answer for a template that names more distinct ConfigMaps and
/// Secrets than [`references::MAX_SOURCES`], decided before anything is
/// read: refused, or with `onSnapshotFailure: warn` admitted as it is,
/// with a warning. (The old object's names cost no more than as many
/// reads: the planner looks up at most that many.)
fn too_many_sources(ctx: &Context, kind: WorkloadKind, object: &Value) -> Option<Outcome> {
    let named = object
        .pointer(kind.template())
        .map_or(0, |t| references::distinct(&references::collect(t)));
    if named <= references::MAX_SOURCES {
        return None;
    }
    let (kind, name, most) = (kind.kind(), object.name(), references::MAX_SOURCES);
    Some(match ctx.settings.on_snapshot_failure {
        OnSnapshotFailure::Reject => Outcome::reject(
            format!("{SAY}{kind} {name} names {named} distinct ConfigMaps and Secrets; config-snapshot takes at most {most} per workload"),
            400,
        ),
        OnSnapshotFailure::Warn => Outcome::accept_with(vec![format!(
            "{SAY}{kind} {name} names {named} distinct ConfigMaps and Secrets; config-snapshot takes at most {most} per workload, so it was admitted without snapshots"
        )]),
    })
}

#[cfg(test)]
#[path = "workload_tests.rs"]
pub(crate) mod tests;

#[cfg(test)]
#[path = "revocation_tests.rs"]
mod revocation_tests;
