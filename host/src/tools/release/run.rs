//! `config-snapshot release` against a cluster, with the user's kubeconfig
//! and no serve: reads each namespace, plans ([`super::plan`]), points
//! workloads back, waits for the rollouts it caused, prunes history if
//! asked, deletes the snapshots nothing names, and last the signing key,
//! once no proven snapshot is left anywhere.
//!
//! Every write is guarded by the object's uid and resourceVersion as read:
//! a workload or snapshot that changed since is left alone, and the run
//! says so (run it again).

use config_snapshot_policy::model::object::ObjectExt;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context as _, Result};
use config_snapshot_policy::model::keys;
use config_snapshot_policy::model::kinds::{self, Role};
use config_snapshot_policy::model::source::SourceKind;
use config_snapshot_policy::rollout;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, Preconditions};
use kube::Client;
use serde_json::{json, Value};

use super::decide::{self, Action, Guard, Options, Plan};
use crate::cluster::proof::{Keyring, Prover};
use crate::serve::trust::signing::ring_of;
use crate::serve::view::cache::api_resource;

/// serve's webhook (deploy/serve/webhook.yaml): while it is registered,
/// serve pins workloads again as they are pointed back.
pub use crate::serve::trust::registration::WEBHOOK;

#[derive(Debug, Clone)]
pub struct Settings {
    pub options: Options,
    pub dry_run: bool,
    /// Empty: every namespace (and then the key can go).
    pub namespaces: Vec<String>,
    /// Release although serve's webhook is registered.
    pub force: bool,
    /// How long to wait for the rollouts `--roll` causes.
    pub timeout: Duration,
    /// serve's namespace and its key Secret.
    pub serve_namespace: String,
    pub key_secret: String,
    /// A backup of the key Secret (`kubectl get secret -o yaml`), for when
    /// the Secret went with serve's namespace.
    pub key_file: Option<std::path::PathBuf>,
}

/// What a run did, for the caller's exit code and the tests.
#[derive(Debug, Default)]
pub struct Outcome {
    pub pointed_back: usize,
    pub pruned: usize,
    pub deleted: usize,
    pub kept: usize,
    /// Writes refused because the object changed since it was read.
    pub conflicts: usize,
    pub key_deleted: bool,
}

fn api(client: &Client, kind: &str, namespace: Option<&str>) -> Api<DynamicObject> {
    let resource = api_resource(kind).expect("a kind of the table");
    match namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
        None => Api::all_with(client.clone(), &resource),
    }
}

/// The kinds a plan reads: every kind with a template, and the sources
/// (only those labelled as snapshots).
fn kinds_read() -> impl Iterator<Item = &'static kinds::Kind> {
    kinds::KINDS
        .iter()
        .filter(|k| k.template.is_some() || matches!(k.role, Role::Source(_)))
}

/// What a plan reads in one namespace.
#[derive(Default)]
struct Namespace {
    objects: Vec<Value>,
    sources: BTreeSet<(SourceKind, String)>,
}

/// The objects of one namespace (or all, `None`) a plan needs, by
/// namespace, each with its kind and status; and which ConfigMaps and
/// Secrets exist (their metadata only).
async fn read(client: &Client, namespace: Option<&str>) -> Result<BTreeMap<String, Namespace>> {
    let mut by_namespace: BTreeMap<String, Namespace> = BTreeMap::new();
    for kind in [SourceKind::ConfigMap, SourceKind::Secret] {
        let list = api(client, kind.kind(), namespace)
            .list_metadata(&ListParams::default())
            .await
            .with_context(|| format!("listing {}s", kind.kind()))?;
        for item in list.items {
            let ns = item.metadata.namespace.clone().unwrap_or_default();
            let name = item.metadata.name.clone().unwrap_or_default();
            by_namespace.entry(ns).or_default().sources.insert((kind, name));
        }
    }
    for kind in kinds_read() {
        let params = match kind.role {
            Role::Source(_) => {
                ListParams::default().labels(&format!("{}={}", keys::MANAGED_BY, keys::MANAGED_BY_VALUE))
            }
            _ => ListParams::default(),
        };
        let list = match api(client, kind.kind, namespace).list(&params).await {
            Ok(list) => list,
            // An optional kind whose CRD is not installed.
            Err(kube::Error::Api(status)) if kind.optional && status.code == 404 => continue,
            Err(e) => return Err(anyhow!(e).context(format!("listing {}", kind.plural))),
        };
        for item in list.items {
            let ns = item.metadata.namespace.clone().unwrap_or_default();
            let mut value = serde_json::to_value(item)?;
            value["apiVersion"] = json!(kind.api_version);
            value["kind"] = json!(kind.kind);
            value.remove_meta("managedFields");
            by_namespace.entry(ns).or_default().objects.push(value);
        }
    }
    Ok(by_namespace)
}

fn preconditions(guard: &Guard) -> DeleteParams {
    DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(guard.uid.clone()),
            resource_version: Some(guard.resource_version.clone()),
        }),
        ..DeleteParams::default()
    }
}

/// Whether an API error says the object moved or went since it was read.
fn moved(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(status) if matches!(status.code, 404 | 409 | 422))
}

/// Carries out one workload's step: a JSON Patch pinned to the uid and
/// resourceVersion read.
async fn apply_step(client: &Client, namespace: &str, step: &decide::Step) -> Result<(), kube::Error> {
    let mut ops = vec![
        json!({"op": "test", "path": "/metadata/uid", "value": step.guard.uid}),
        json!({"op": "test", "path": "/metadata/resourceVersion", "value": step.guard.resource_version}),
    ];
    if let Some(Action::PointBack { template, .. }) = &step.action {
        ops.push(json!({"op": "replace", "path": step.template_path, "value": template}));
    }
    for record in &step.records {
        ops.push(json!({"op": "remove", "path": rollout::annotation_path(record)}));
    }
    let patch: json_patch::Patch = serde_json::from_value(Value::Array(ops)).expect("well-formed ops");
    api(client, step.workload.kind, Some(namespace))
        .patch(&step.workload.name, &PatchParams::default(), &Patch::Json::<()>(patch))
        .await
        .map(|_| ())
}

/// Prints the workload steps of `plan`, `would` in a dry run.
fn describe_steps(out: &mut String, plan: &Plan, dry_run: bool) {
    let (will, verb) = if dry_run { ("would ", "be ") } else { ("", "") };
    for step in &plan.steps {
        let what = match &step.action {
            Some(Action::PointBack { rolls: true, .. }) => {
                format!("{will}{verb}pointed back at its sources (it rolls out)")
            }
            Some(Action::PointBack { rolls: false, .. }) => {
                format!("{will}{verb}pointed back at its sources (rolls nothing)")
            }
            Some(Action::WouldRoll) => "kept on its snapshots: pointing it back rolls it (--roll)".to_string(),
            Some(Action::SourceGone(source)) => {
                format!("kept on its snapshots: its source {source} is gone (recreate it, then run release again)")
            }
            None => format!("{will}{verb}cleared of config-snapshot's records"),
        };
        let _ = writeln!(out, "  {}  {what}", step.workload);
    }
}

/// Prints what `plan` prunes, deletes and keeps.
fn describe_collect(out: &mut String, plan: &Plan, dry_run: bool) {
    let (will, verb) = if dry_run { ("would ", "be ") } else { ("", "") };
    for (revision, _) in &plan.prune {
        let _ = writeln!(
            out,
            "  {revision}  {will}{verb}deleted (revision history, --prune-history)"
        );
    }
    for (snapshot, _) in &plan.delete {
        let _ = writeln!(out, "  {snapshot}  {will}{verb}deleted: nothing names it");
    }
    for kept in &plan.keep {
        let _ = writeln!(out, "  {}  kept: {}", kept.snapshot, kept.why);
    }
    for unproven in &plan.unproven {
        let _ = writeln!(
            out,
            "  {unproven}  left alone: labelled as a snapshot but not signed by this installation's key"
        );
    }
}

/// Whether `plan` points back a workload with a rollout.
fn rolls_out(plan: &Plan) -> bool {
    plan.steps
        .iter()
        .any(|s| matches!(s.action, Some(Action::PointBack { rolls: true, .. })))
}

/// Prunes and deletes what `plan` says, in that order (a revision goes
/// before the snapshots it names).
async fn collect(client: &Client, namespace: &str, plan: &Plan, outcome: &mut Outcome, out: &mut String) -> Result<()> {
    for (revision, guard) in &plan.prune {
        match api(client, revision.kind, Some(namespace))
            .delete(&revision.name, &preconditions(guard))
            .await
        {
            Ok(_) => outcome.pruned += 1,
            Err(e) if moved(&e) => {
                outcome.conflicts += 1;
                let _ = writeln!(out, "  {revision}  changed since it was read; left (run release again)");
            }
            Err(e) => return Err(anyhow!(e).context(format!("deleting {revision} in {namespace}"))),
        }
    }
    for (snapshot, guard) in &plan.delete {
        // The uid alone: a snapshot's content never changes, and the
        // garbage collector edits its owners (or deletes it) when a pruned
        // revision owned it. Gone already is as good as deleted.
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(guard.uid.clone()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match api(client, snapshot.kind, Some(namespace))
            .delete(&snapshot.name, &params)
            .await
        {
            Ok(_) => outcome.deleted += 1,
            Err(kube::Error::Api(status)) if status.code == 404 => outcome.deleted += 1,
            Err(e) if moved(&e) => {
                outcome.conflicts += 1;
                let _ = writeln!(out, "  {snapshot}  changed since it was read; left (run release again)");
            }
            Err(e) => return Err(anyhow!(e).context(format!("deleting {snapshot} in {namespace}"))),
        }
    }
    outcome.kept += plan.keep.len();
    Ok(())
}

/// The installation's keyring (from the backup file if given, else its
/// Secret), and the Secret if it exists.
async fn keyring(client: &Client, settings: &Settings) -> Result<(Option<Keyring>, Option<Secret>)> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &settings.serve_namespace);
    let secret = secrets
        .get_opt(&settings.key_secret)
        .await
        .with_context(|| format!("reading Secret {}/{}", settings.serve_namespace, settings.key_secret))?;
    let ring = match (&settings.key_file, &secret) {
        (Some(path), live) => {
            let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
            let backup: Secret =
                serde_yaml_ng::from_str(&text).with_context(|| format!("{} is not a Secret", path.display()))?;
            let ring = ring_of(&backup)?;
            match live {
                Some(live) => Some(ring.merged(&ring_of(live)?).map_err(|e| anyhow!("{e}"))?),
                None => Some(ring),
            }
        }
        (None, Some(live)) => Some(ring_of(live)?),
        (None, None) => None,
    };
    Ok((ring, secret))
}

/// Refuses while serve's webhook is registered: it would pin what release
/// points back.
async fn serve_gone(client: &Client) -> Result<()> {
    let configurations: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let list = configurations
        .list(&ListParams::default())
        .await
        .context("listing MutatingWebhookConfigurations")?;
    for configuration in list.items {
        if configuration
            .webhooks
            .unwrap_or_default()
            .iter()
            .any(|w| w.name == WEBHOOK)
        {
            return Err(anyhow!(
                "serve's webhook is still registered (MutatingWebhookConfiguration {}): it would pin the workloads \
                 again as they are pointed back. Uninstall first: helm uninstall, or with kustomize delete that \
                 configuration and serve's Deployment, keeping its namespace (its signing key is there; \
                 docs/install.md, \"Uninstall\"), or pass --force",
                configuration.metadata.name.unwrap_or_default()
            ));
        }
    }
    Ok(())
}

pub async fn release(client: Client, settings: &Settings, out: &mut String) -> Result<Outcome> {
    if !settings.force {
        serve_gone(&client).await?;
    }
    let (ring, key) = keyring(&client, settings).await?;
    let prover = match &ring {
        Some(ring) => Prover::with(ring),
        None => {
            let _ = writeln!(
                out,
                "no signing key Secret {}/{} (and no --signing-key-file): no snapshot can be proven, so none is \
                 released or deleted",
                settings.serve_namespace, settings.key_secret
            );
            Prover::new(&Prover::generate_key())
        }
    };
    let scopes: Vec<Option<&str>> = if settings.namespaces.is_empty() {
        vec![None]
    } else {
        settings.namespaces.iter().map(|n| Some(n.as_str())).collect()
    };
    let mut outcome = Outcome::default();
    let mut rolling: Vec<String> = Vec::new();
    for scope in &scopes {
        for (namespace, read) in read(&client, *scope).await? {
            let plan = decide::plan(&read.objects, &read.sources, &prover, settings.options);
            if plan.is_empty() && plan.keep.is_empty() && plan.unproven.is_empty() {
                continue;
            }
            let _ = writeln!(out, "namespace {namespace}");
            describe_steps(out, &plan, settings.dry_run);
            if settings.dry_run {
                dry_run(&read, plan, &prover, settings, &mut outcome, out);
            } else if carry_out(&client, &namespace, &plan, &mut outcome, out).await? {
                rolling.push(namespace.clone());
            }
        }
    }
    // The rollouts --roll caused: wait for their old pods to go, then
    // prune and delete from a fresh read.
    let deadline = Instant::now() + settings.timeout;
    for namespace in &rolling {
        collect_after_rollouts(&client, namespace, (&prover, settings, deadline), &mut outcome, out).await?;
    }
    // The key goes last, and only once no proven snapshot is left anywhere.
    if let (true, false, Some(secret)) = (settings.namespaces.is_empty(), settings.dry_run, &key) {
        retire_key(&client, secret, (&prover, settings), &mut outcome, out).await?;
    }
    Ok(outcome)
}

/// A dry run's namespace: what is pointed back, and what is collected, now
/// or once the rollouts are done.
fn dry_run(
    read: &Namespace,
    plan: Plan,
    prover: &Prover,
    settings: &Settings,
    outcome: &mut Outcome,
    out: &mut String,
) {
    outcome.pointed_back += plan
        .steps
        .iter()
        .filter(|s| matches!(s.action, Some(Action::PointBack { .. })))
        .count();
    let end = if rolls_out(&plan) {
        let _ = writeln!(out, "  once the rollouts are done:");
        let after = decide::after_rollouts(&read.objects, &plan);
        decide::plan(&after, &read.sources, prover, settings.options)
    } else {
        plan
    };
    describe_collect(out, &end, true);
    outcome.pruned += end.prune.len();
    outcome.deleted += end.delete.len();
    outcome.kept += end.keep.len();
}

/// Carries out a namespace's steps, and collects at once unless they roll
/// workloads (`true`: collect once the rollouts are done) or one of them
/// met a workload that changed since it was read.
async fn carry_out(
    client: &Client,
    namespace: &str,
    plan: &Plan,
    outcome: &mut Outcome,
    out: &mut String,
) -> Result<bool> {
    let mut failed = false;
    for step in &plan.steps {
        match apply_step(client, namespace, step).await {
            Ok(()) => {
                if matches!(step.action, Some(Action::PointBack { .. })) {
                    outcome.pointed_back += 1;
                }
            }
            Err(e) if moved(&e) => {
                failed = true;
                outcome.conflicts += 1;
                let _ = writeln!(
                    out,
                    "  {}  changed since it was read; left (run release again)",
                    step.workload
                );
            }
            Err(e) => return Err(anyhow!(e).context(format!("patching {} in {namespace}", step.workload))),
        }
    }
    if rolls_out(plan) {
        let _ = writeln!(out, "  waiting for the rollouts");
        return Ok(true);
    }
    if !failed {
        // Deletions assumed every step done.
        describe_collect(out, plan, false);
        collect(client, namespace, plan, outcome, out).await?;
    }
    Ok(false)
}

/// Waits (until `deadline`) for the rollouts a namespace's steps caused,
/// then collects from a fresh read.
async fn collect_after_rollouts(
    client: &Client,
    namespace: &str,
    (prover, settings, deadline): (&Prover, &Settings, Instant),
    outcome: &mut Outcome,
    out: &mut String,
) -> Result<()> {
    let plan = loop {
        let read = read(client, Some(namespace))
            .await?
            .remove(namespace)
            .unwrap_or_default();
        let plan = decide::plan(&read.objects, &read.sources, prover, settings.options);
        if plan.waiting.is_empty() || Instant::now() >= deadline {
            break plan;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    };
    let _ = writeln!(out, "namespace {namespace}, its rollouts done");
    for waiting in &plan.waiting {
        let _ = writeln!(
            out,
            "  {waiting}  still on a snapshot after {:?}: run release again later",
            settings.timeout
        );
    }
    describe_collect(out, &plan, false);
    collect(client, namespace, &plan, outcome, out).await
}

/// Deletes the signing key Secret once no proven snapshot is left anywhere:
/// while one is, the key proves it if serve comes back.
async fn retire_key(
    client: &Client,
    secret: &Secret,
    (prover, settings): (&Prover, &Settings),
    outcome: &mut Outcome,
    out: &mut String,
) -> Result<()> {
    let left: usize = read_snapshots(client)
        .await?
        .iter()
        .filter(|s| !s.is_deleting() && prover.proves(s))
        .count();
    let (ns, name) = (&settings.serve_namespace, &settings.key_secret);
    if left > 0 {
        let _ = writeln!(
            out,
            "signing key {ns}/{name}: kept ({left} proven snapshots are left; it proves them if serve comes back)"
        );
        return Ok(());
    }
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: secret.metadata.uid.clone(),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    secrets
        .delete(name, &params)
        .await
        .with_context(|| format!("deleting the key Secret {ns}/{name}"))?;
    outcome.key_deleted = true;
    let _ = writeln!(out, "signing key {ns}/{name}: deleted (no proven snapshot is left)");
    Ok(())
}

/// Every object labelled as a snapshot, cluster-wide.
async fn read_snapshots(client: &Client) -> Result<Vec<Value>> {
    let params = ListParams::default().labels(&format!("{}={}", keys::MANAGED_BY, keys::MANAGED_BY_VALUE));
    let mut all = Vec::new();
    for kind in ["ConfigMap", "Secret"] {
        for item in api(client, kind, None).list(&params).await?.items {
            let mut value = serde_json::to_value(item)?;
            value["apiVersion"] = json!("v1");
            value["kind"] = json!(kind);
            all.push(value);
        }
    }
    Ok(all)
}
