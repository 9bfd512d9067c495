//! `config-snapshot revoke` against a cluster, with the user's kubeconfig:
//! reads the source, its snapshots, the namespace's holders and record;
//! plans ([`super::decide::plan`]); writes the record first, then deletes;
//! and looks again for what started to name a revoked snapshot meanwhile.
//!
//! The record goes first: from the moment it is stored, serve refuses to
//! make the revoked content again and the policy refuses a rollback to it,
//! so a revision put back while the snapshots are being deleted is refused
//! rather than left naming one that is gone.

use std::fmt::Write as _;

use anyhow::{anyhow, bail, Context as _, Result};
use config_snapshot_policy::model::content;
use config_snapshot_policy::model::duration::unix_now;
use config_snapshot_policy::model::keys;
use config_snapshot_policy::model::kinds::{self, Role};
use config_snapshot_policy::model::object::ObjectExt;
use config_snapshot_policy::model::references;
use config_snapshot_policy::model::revocation::{is_record, Revocation, Revocations, RECORD};
use config_snapshot_policy::model::source::SourceId;
use config_snapshot_policy::rollout::annotation_path;
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams, Preconditions};
use kube::Client;
use serde_json::{json, Value};

use super::decide::{self, Options, Plan};
use crate::serve::view::cache::api_resource;

#[derive(Debug, Clone)]
pub struct Settings {
    pub source: SourceId,
    pub namespace: String,
    pub options: Options,
    pub dry_run: bool,
}

/// What a run did, for the exit code and the tests.
#[derive(Debug, Default)]
pub struct Outcome {
    pub deleted: usize,
    /// Refused: something runs on a snapshot to revoke (`--running`).
    pub refused: bool,
    /// What names a revoked snapshot in its current template after the
    /// run: a write that landed while it ran, or what `--running` let be.
    pub still_named: Vec<String>,
}

fn api(client: &Client, kind: &str, namespace: &str) -> Api<DynamicObject> {
    let resource = api_resource(kind).expect("a kind of the table");
    Api::namespaced_with(client.clone(), namespace, &resource)
}

/// An object as read, with its kind (list items may omit it) and its
/// status (what runs: a Pod's phase, a ReplicaSet's replicas, a
/// StatefulSet's current revision, a Job's end).
fn as_value(kind: &kinds::Kind, object: DynamicObject) -> Value {
    let mut value = serde_json::to_value(object).unwrap_or(Value::Null);
    value["apiVersion"] = json!(kind.api_version);
    value["kind"] = json!(kind.kind);
    value.remove_meta("managedFields");
    value
}

/// One object, `None` if it does not exist.
async fn get(client: &Client, kind: &kinds::Kind, namespace: &str, name: &str) -> Result<Option<Value>> {
    let found = api(client, kind.kind, namespace)
        .get_opt(name)
        .await
        .with_context(|| format!("reading {}/{name}", kind.kind.to_ascii_lowercase()))?;
    Ok(found.map(|o| as_value(kind, o)))
}

/// Every object of `kind` in `namespace` that `labels` selects; none of an
/// optional kind whose CRD is not installed.
async fn list(client: &Client, kind: &kinds::Kind, namespace: &str, labels: Option<&str>) -> Result<Vec<Value>> {
    let params = labels.map_or_else(ListParams::default, |l| ListParams::default().labels(l));
    match api(client, kind.kind, namespace).list(&params).await {
        Ok(list) => Ok(list.items.into_iter().map(|o| as_value(kind, o)).collect()),
        Err(kube::Error::Api(status)) if kind.optional && status.code == 404 => Ok(Vec::new()),
        // RBAC answers before the API server looks the resource up: a
        // namespace's editor is refused a kind that does not exist. Not
        // served, there is none of it; served, what it runs must be seen.
        Err(kube::Error::Api(status)) if kind.optional && status.code == 403 && !served(client, kind).await? => {
            Ok(Vec::new())
        }
        Err(e) => Err(anyhow!(e).context(format!("listing {} in {namespace}", kind.plural))),
    }
}

/// Whether the API serves `kind` (its group and version are discovered).
async fn served(client: &Client, kind: &kinds::Kind) -> Result<bool> {
    match client.list_api_group_resources(kind.api_version).await {
        Ok(resources) => Ok(resources.resources.iter().any(|r| r.name == kind.plural)),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(false),
        Err(e) => Err(anyhow!(e).context(format!("discovering {}", kind.api_version))),
    }
}

/// Every object of the namespace whose template may name a snapshot.
async fn holders(client: &Client, namespace: &str) -> Result<Vec<Value>> {
    let mut all = Vec::new();
    for kind in kinds::KINDS.iter().filter(|k| k.template.is_some()) {
        all.extend(list(client, kind, namespace, None).await?);
    }
    Ok(all)
}

/// What the API server says the user running this is (a SelfSubjectReview,
/// `kubectl auth whoami`), for the record.
async fn who(client: &Client) -> String {
    let review = Api::<SelfSubjectReview>::all(client.clone())
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await;
    match review {
        Ok(review) => review
            .status
            .and_then(|s| s.user_info)
            .and_then(|u| u.username)
            .unwrap_or_else(|| "(the API server named no user)".to_string()),
        Err(e) => format!("(unknown: a SelfSubjectReview failed: {})", status_of(&e)),
    }
}

/// A failure's status alone: `403 Forbidden`.
fn status_of(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => format!("{} {}", s.code, s.reason),
        _ => "no answer".to_string(),
    }
}

/// The namespace's record as read, and the object's version (`None`: no
/// record yet). An object of that name that is not the record is a user's:
/// left alone, and the run refused.
async fn read_record(client: &Client, namespace: &str) -> Result<Option<(Revocations, Value)>> {
    let configmap = kinds::find("ConfigMap").expect("a kind of the table");
    let Some(object) = get(client, configmap, namespace, RECORD).await? else {
        return Ok(None);
    };
    if !is_record(&object) {
        bail!(
            "configmap/{RECORD} in {namespace} is not config-snapshot's record (it lacks the label {}={}): \
             rename it, it is the record's name",
            keys::RECORD_LABEL,
            keys::RECORD_LABEL_VALUE
        );
    }
    Ok(Some((Revocations::of(&object)?, object)))
}

/// Adds `entry` to the namespace's record: created if there is none, else
/// patched pinned to the version read, read again if it moved.
async fn record(client: &Client, namespace: &str, entry: &Revocation) -> Result<()> {
    let configmaps = api(client, "ConfigMap", namespace);
    for _ in 0..5 {
        let written = match read_record(client, namespace).await? {
            None => {
                let object = Revocations(vec![entry.clone()]).record_object(namespace);
                configmaps
                    .create(&PostParams::default(), &serde_json::from_value(object)?)
                    .await
                    .map(drop)
            }
            Some((mut revocations, object)) => {
                revocations.0.push(entry.clone());
                let text = Value::from(revocations.to_annotation());
                let set = if object.annotations().is_some() {
                    json!({"op": "add", "path": annotation_path(keys::REVOCATIONS), "value": text})
                } else {
                    json!({"op": "add", "path": "/metadata/annotations", "value": {keys::REVOCATIONS: text}})
                };
                let ops = json!([
                    {"op": "test", "path": "/metadata/resourceVersion", "value": object.resource_version()},
                    set,
                ]);
                let patch: json_patch::Patch = serde_json::from_value(ops)?;
                configmaps
                    .patch(RECORD, &PatchParams::default(), &Patch::Json::<()>(patch))
                    .await
                    .map(drop)
            }
        };
        match written {
            Ok(()) => return Ok(()),
            // Written by someone else meanwhile: read again.
            Err(kube::Error::Api(s)) if matches!(s.code, 409 | 422) => continue,
            Err(e) => return Err(anyhow!(e).context(format!("writing configmap/{RECORD} in {namespace}"))),
        }
    }
    bail!("configmap/{RECORD} in {namespace} kept changing while it was written: run revoke again")
}

/// Prints the plan: what goes, what stays, what runs.
fn describe(out: &mut String, settings: &Settings, plan: &Plan) {
    let (source, ns) = (&settings.source, &settings.namespace);
    let _ = writeln!(out, "{source} in namespace {ns}");
    for kept in &plan.current {
        let _ = writeln!(
            out,
            "  {kept}  kept: it holds {source}'s current content (--current revokes it too)"
        );
    }
    for doomed in &plan.revoke {
        let by: Vec<String> = doomed.named_by.iter().map(ToString::to_string).collect();
        let history = match by.is_empty() {
            true => "no revision names it".to_string(),
            false => format!("rollout undo to {} is refused from now on", by.join(", ")),
        };
        let _ = writeln!(out, "  {}  revoked: {history}", doomed.name);
    }
    for running in &plan.running {
        let _ = writeln!(
            out,
            "  {}  runs on {}: {}",
            running.holder, running.snapshot, running.advice
        );
    }
}

/// What, after the run, names a revoked snapshot in the template it runs
/// or makes pods from: a rollback or a forward roll that landed between the
/// plan and the deletes, or what `--running` let be.
async fn still_named(client: &Client, namespace: &str, source: &SourceId, revoked: &[String]) -> Result<Vec<String>> {
    let mut named = Vec::new();
    for holder in holders(client, namespace).await? {
        let Some(kind) = kinds::find(holder["kind"].as_str().unwrap_or_default()) else {
            continue;
        };
        // A Pod on its way out starts no container again (as `decide` judges
        // it): the old ReplicaSet's last pods, terminating after a rollout.
        if !matches!(kind.role, Role::Workload { .. } | Role::Run) || holder.is_deleting() {
            continue;
        }
        let Some(template) = kind.template_of(&holder) else {
            continue;
        };
        for r in references::collect(template) {
            if r.kind == source.kind && revoked.contains(&r.name) {
                named.push(format!(
                    "{}/{} names {}",
                    kind.kind.to_ascii_lowercase(),
                    holder.name(),
                    r.name
                ));
            }
        }
    }
    named.dedup();
    Ok(named)
}

pub async fn revoke(client: Client, settings: &Settings, out: &mut String) -> Result<Outcome> {
    let (source, ns) = (&settings.source, settings.namespace.as_str());
    let kind = kinds::find(source.kind.kind()).expect("a source kind of the table");
    let current = get(&client, kind, ns, &source.name).await?;
    let snapshots = list(&client, kind, ns, Some(&content::snapshots_of(&source.name))).await?;
    let holders = holders(&client, ns).await?;
    let record_now = read_record(&client, ns).await?.map(|(r, _)| r).unwrap_or_default();
    let plan = decide::plan(
        source,
        current.as_ref(),
        &snapshots,
        &holders,
        &record_now,
        settings.options,
    );
    describe(out, settings, &plan);
    let mut outcome = Outcome::default();
    if plan.refused(settings.options) {
        let _ = writeln!(
            out,
            "refused: revoking would break the restarts of what runs on it (above); do that first, or pass --running"
        );
        outcome.refused = true;
        return Ok(outcome);
    }
    if plan.revoke.is_empty() {
        let _ = writeln!(out, "nothing to revoke");
        return Ok(outcome);
    }
    if settings.dry_run {
        let _ = writeln!(out, "dry run: nothing written");
        return Ok(outcome);
    }
    let to_record = plan.to_record();
    if !to_record.is_empty() {
        let entry = Revocation {
            source: source.clone(),
            at: unix_now(),
            by: who(&client).await,
            snapshots: to_record,
        };
        record(&client, ns, &entry).await?;
        let _ = writeln!(out, "recorded in configmap/{RECORD}: {entry}");
    }
    for doomed in &plan.revoke {
        // The uid alone: a snapshot's content never changes, and its owners
        // may (the garbage collector, an anchor). Gone already is as good.
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(doomed.guard.uid.clone()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match api(&client, source.kind.kind(), ns).delete(&doomed.name, &params).await {
            Ok(_) => outcome.deleted += 1,
            Err(kube::Error::Api(s)) if s.code == 404 => outcome.deleted += 1,
            Err(e) => return Err(anyhow!(e).context(format!("deleting {}/{}", source.kind.tag(), doomed.name))),
        }
    }
    let revoked: Vec<String> = plan.revoke.iter().map(|d| d.name.clone()).collect();
    outcome.still_named = still_named(&client, ns, source, &revoked).await?;
    for named in &outcome.still_named {
        let _ = writeln!(out, "  {named}, which is gone: its pods cannot start; roll it forward");
    }
    Ok(outcome)
}
