//! Webhook latency as kube-apiserver records it (issue "Fast where users
//! measure it"). On the real control plane, with the shipped webhook
//! configuration and serve logging at the shipped level, clients create
//! Deployments through the API (kube-rs, as a controller or kubectl would)
//! in four groups:
//! - pass-through: a Deployment that does not opt in;
//! - opted in with 1 reference, its snapshot existing;
//! - opted in with 8 references of every kind (4 ConfigMaps, 4 Secrets),
//!   their snapshots existing (re-apply, GitOps re-sync: the common case);
//! - opted in with 8 references whose content changed since the last
//!   create: 8 new snapshots to make;
//! - opted in with 8 references, re-applied: UPDATEs (a label edit) of
//!   Deployments whose templates name their snapshots, as a re-apply or a
//!   GitOps re-sync that changes nothing sends;
//!
//! and a watch fan-out: one ConfigMap edit rolls 50 Deployments.
//!
//! Each group runs at each client count of `BENCH_CLIENTS` (default
//! 1,8,32) for `BENCH_SAMPLES` creates (default 1000), and reports
//! kube-apiserver's own histogram for the group
//! (`apiserver_admission_webhook_admission_duration_seconds`, CREATE, read
//! before and after), serve's finer one (`config_snapshot_admission_
//! duration_seconds`, Deployment CREATE) and what the clients saw.
//!
//! Each client keeps a fleet of at most [`FLEET`] Deployments sharing its
//! sources, as in the setup (50 opted-in Deployments): once its
//! fleet is full, it deletes its oldest Deployment after each measured
//! create (not timed). A snapshot the warm Deployments' revisions own is
//! anchored by the first create that reuses it (docs/design.md, "Garbage
//! collection", Anchors), after which no workload becomes its owner.
//!
//! Deployments are created paused, with no replicas: the Deployment
//! controller makes no ReplicaSet for them, so the only CREATE admissions in
//! the window are the group's own. The sources' edits are UPDATEs: they
//! are reviewed too, but counted apart.
//!
//! `make bench-cluster` runs it with an optimised build and writes the table
//! into docs/BENCHMARKS.md; `make test` runs a short version as a
//! regression guard (see [`guard`]).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, Patch, PatchParams, PostParams};

use super::*;

#[path = "bench/guard.rs"]
mod guard;

const WEBHOOK: &str = "config-snapshot.config-snapshot.io";

/// The most Deployments one client keeps sharing its sources.
const FLEET: usize = 50;

/// A histogram as cumulative counts per upper bound (seconds).
#[derive(Clone, Debug, Default)]
struct Buckets(BTreeMap<u64, f64>);

impl Buckets {
    /// The lines of a Prometheus text exposition named `bucket_metric`
    /// whose labels include every one of `labels`, summed per `le`.
    fn parse(text: &str, bucket_metric: &str, labels: &[&str]) -> Buckets {
        let mut out = BTreeMap::new();
        for line in text.lines() {
            let Some(rest) = line.strip_prefix(bucket_metric) else {
                continue;
            };
            let Some((set, value)) = rest.rsplit_once(' ') else {
                continue;
            };
            if !set.starts_with('{') || !labels.iter().all(|l| set.contains(l)) {
                continue;
            }
            let Some(le) = set.split("le=\"").nth(1).and_then(|s| s.split('"').next()) else {
                continue;
            };
            let bound = if le == "+Inf" {
                u64::MAX
            } else {
                (le.parse::<f64>().unwrap_or(f64::MAX) * 1e6).round() as u64
            };
            *out.entry(bound).or_insert(0.0) += value.parse::<f64>().unwrap_or(0.0);
        }
        Buckets(out)
    }

    fn minus(&self, before: &Buckets) -> Buckets {
        Buckets(
            self.0
                .iter()
                .map(|(le, n)| (*le, n - before.0.get(le).copied().unwrap_or(0.0)))
                .collect(),
        )
    }

    fn total(&self) -> f64 {
        self.0.get(&u64::MAX).copied().unwrap_or(0.0)
    }

    /// The share within `micros` (a bucket bound).
    fn within(&self, micros: u64) -> f64 {
        let total = self.total();
        if total == 0.0 {
            return 0.0;
        }
        self.0.get(&micros).copied().unwrap_or(0.0) / total
    }

    /// The `q` quantile, interpolated inside its bucket as Prometheus's
    /// histogram_quantile does (µs).
    fn quantile(&self, q: f64) -> f64 {
        let rank = q * self.total();
        let mut lower = (0u64, 0.0);
        for (&le, &n) in &self.0 {
            if n >= rank {
                if le == u64::MAX {
                    return lower.0 as f64;
                }
                let span = n - lower.1;
                let into = if span > 0.0 { (rank - lower.1) / span } else { 1.0 };
                return lower.0 as f64 + (le - lower.0) as f64 * into;
            }
            lower = (le, n);
        }
        lower.0 as f64
    }
}

/// The webhook a group measures: serve, or the real Kubewarden
/// policy-server running the same policy (`POLICY_SERVER`).
#[derive(Clone, Copy)]
enum Hook<'a> {
    Serve(&'a ServeProcess),
    PolicyServer,
}

/// Which engine a row measured.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Engine {
    Serve,
    PolicyServer,
}

impl<'a> Hook<'a> {
    /// Its name in kube-apiserver's histogram.
    fn name(self) -> &'static str {
        match self {
            Hook::Serve(_) => WEBHOOK,
            Hook::PolicyServer => policy_server::WEBHOOK,
        }
    }

    fn engine(self) -> Engine {
        match self {
            Hook::Serve(_) => Engine::Serve,
            Hook::PolicyServer => Engine::PolicyServer,
        }
    }

    /// serve, whose own metrics the row reads too.
    fn serve(self) -> Option<&'a ServeProcess> {
        match self {
            Hook::Serve(serve) => Some(serve),
            Hook::PolicyServer => None,
        }
    }
}

/// The sum of the values of `series` (a metric's full name, `_sum` or
/// `_count` included) over the lines whose labels include all of
/// `labels`, in the Prometheus text `text`.
fn summed(text: &str, series: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter_map(|l| l.strip_prefix(series)?.strip_prefix('{'))
        .filter(|l| labels.iter().all(|label| l.contains(label)))
        .filter_map(|l| l.rsplit_once(' ').and_then(|(_, v)| v.parse::<f64>().ok()))
        .sum()
}

/// kube-apiserver's metrics at one edge of a window, for `webhook`'s calls
/// on `operation` (CREATE, or UPDATE for re-applies), from one reading.
struct ApiserverView {
    /// The histogram of the calls to the webhook.
    buckets: Buckets,
    /// Their total seconds.
    webhook_secs: f64,
    /// The rest of the API server's own account of a Deployment write
    /// (seconds, observations): the whole request
    /// (`apiserver_request_duration_seconds`, the verb the group writes
    /// with) and etcd's write of the Deployment
    /// (`etcd_request_duration_seconds`). What the request leaves after
    /// them and the webhook is the API server's own work: authentication,
    /// decoding, the other admission steps, validation, encoding.
    split: [(f64, f64); 2],
    /// Writes the webhook's matchConditions kept from it (never sent).
    excluded: f64,
}

fn apiserver_view(cp: &ControlPlane, webhook: &str, operation: &str) -> ApiserverView {
    let text = cp.kubectl(&["get", "--raw", "/metrics"]);
    let (name, admitted) = (format!("name=\"{webhook}\""), format!("operation=\"{operation}\""));
    let labels = [name.as_str(), admitted.as_str(), "type=\"admit\""];
    let (verb, etcd_operation) = match operation {
        "UPDATE" => ("verb=\"PATCH\"", "operation=\"update\""),
        _ => ("verb=\"POST\"", "operation=\"create\""),
    };
    let split = [
        (
            "apiserver_request_duration_seconds",
            &[verb, "resource=\"deployments\"", "subresource=\"\""][..],
        ),
        ("etcd_request_duration_seconds", &[etcd_operation, "deployments"][..]),
    ]
    .map(|(metric, labels)| {
        (
            summed(&text, &format!("{metric}_sum"), labels),
            summed(&text, &format!("{metric}_count"), labels),
        )
    });
    ApiserverView {
        buckets: Buckets::parse(
            &text,
            "apiserver_admission_webhook_admission_duration_seconds_bucket",
            &labels,
        ),
        webhook_secs: summed(
            &text,
            "apiserver_admission_webhook_admission_duration_seconds_sum",
            &labels,
        ),
        split,
        excluded: summed(
            &text,
            "apiserver_admission_match_condition_exclusions_total",
            &[name.as_str(), admitted.as_str(), "kind=\"webhook\""],
        ),
    }
}

/// Requests for ConfigMaps and Secrets kube-apiserver served, from anyone
/// (`apiserver_request_total`), by verb: reads are GET and LIST, writes
/// POST, PATCH and DELETE.
fn config_requests(cp: &ControlPlane) -> BTreeMap<&'static str, f64> {
    let text = cp.kubectl(&["get", "--raw", "/metrics"]);
    ["GET", "LIST", "POST", "PATCH", "DELETE"]
        .into_iter()
        .map(|verb| {
            let verb_label = format!("verb=\"{verb}\"");
            let n: f64 = ["resource=\"configmaps\"", "resource=\"secrets\""]
                .iter()
                .map(|resource| summed(&text, "apiserver_request_total", &[&verb_label, resource]))
                .sum();
            (verb, n)
        })
        .collect()
}

/// serve's own requests to the API server outside its watches, by verb
/// (`config_snapshot_api_requests_total`).
fn serve_requests(serve: &ServeProcess) -> BTreeMap<String, f64> {
    let (_, text) = serve.ops_get("/metrics").expect("serve's metrics");
    text.lines()
        .filter_map(|l| l.strip_prefix("config_snapshot_api_requests_total{verb=\""))
        .filter_map(|l| {
            let (verb, rest) = l.split_once('"')?;
            Some((verb.to_string(), rest.rsplit_once(' ')?.1.parse().ok()?))
        })
        .collect()
}

/// The requests a window cost: serve's own per admission (reads, writes),
/// and what everyone else did to ConfigMaps and Secrets beside serve and
/// the clients' own source edits (the garbage collector, chiefly), per
/// workload deleted in the window.
#[derive(Clone, Debug, Default)]
struct Requests {
    serve_reads: f64,
    serve_writes: f64,
    others_reads: f64,
    others_writes: f64,
    deleted: usize,
}

/// serve's host-call histogram's sums and counts, by operation: where an
/// admission's time goes.
fn host_calls(serve: &ServeProcess) -> BTreeMap<String, (f64, f64)> {
    let (_, text) = serve.ops_get("/metrics").expect("serve's metrics");
    let mut calls: BTreeMap<String, (f64, f64)> = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("config_snapshot_host_call_duration_seconds_") else {
            continue;
        };
        let (series, value) = rest.rsplit_once(' ').unwrap_or_default();
        let Some(op) = series.split("operation=\"").nth(1).and_then(|o| o.split('"').next()) else {
            continue;
        };
        let value: f64 = value.parse().unwrap_or(0.0);
        let entry = calls.entry(op.to_string()).or_default();
        if series.starts_with("sum") {
            entry.0 += value;
        } else if series.starts_with("count") {
            entry.1 += value;
        }
    }
    calls
}

/// serve's total seconds answering Deployment `operation`s.
fn serve_seconds(serve: &ServeProcess, operation: &str) -> f64 {
    let (_, text) = serve.ops_get("/metrics").expect("serve's metrics");
    let operation = format!("operation=\"{operation}\"");
    text.lines()
        .filter(|l| {
            l.starts_with("config_snapshot_admission_duration_seconds_sum{")
                && l.contains("kind=\"Deployment\"")
                && l.contains(&operation)
        })
        .filter_map(|l| l.rsplit_once(' ').and_then(|(_, v)| v.parse::<f64>().ok()))
        .sum()
}

fn serve_buckets(serve: &ServeProcess, operation: &str) -> Buckets {
    let (_, text) = serve.ops_get("/metrics").expect("serve's metrics");
    Buckets::parse(
        &text,
        "config_snapshot_admission_duration_seconds_bucket",
        &["kind=\"Deployment\"", &format!("operation=\"{operation}\"")],
    )
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Group {
    PassThrough,
    OneExisting,
    EightExisting,
    EightNew,
    /// UPDATEs of opted-in Deployments that keep their snapshots: a
    /// re-apply, a label edit, a GitOps re-sync that changes nothing.
    Reapplied,
}

impl Group {
    const ALL: [Group; 5] = [
        Group::PassThrough,
        Group::OneExisting,
        Group::EightExisting,
        Group::EightNew,
        Group::Reapplied,
    ];

    /// The admissions the group measures.
    fn operation(self) -> &'static str {
        match self {
            Group::Reapplied => "UPDATE",
            _ => "CREATE",
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Group::PassThrough => "not opted in (pass-through)",
            Group::OneExisting => "opted in, 1 reference, snapshot exists",
            Group::EightExisting => "opted in, 8 references, snapshots exist",
            Group::EightNew => "opted in, 8 references, 8 new snapshots",
            Group::Reapplied => "opted in, 8 references, re-applied (UPDATE keeping its snapshots)",
        }
    }
}

/// Worker `w`'s sources: 4 ConfigMaps and 4 Secrets.
fn source_names(w: usize) -> (Vec<String>, Vec<String>) {
    (
        (0..4).map(|i| format!("cm-{w}-{i}")).collect(),
        (0..4).map(|i| format!("s-{w}-{i}")).collect(),
    )
}

/// A Deployment with no replicas, paused (no ReplicaSet) or not; `refs`:
/// 0 (not opted in), 1 or 8.
fn deployment(name: &str, worker: usize, refs: usize, paused: bool) -> Deployment {
    let (cms, secrets) = source_names(worker);
    let mut container = json!({"name": "main", "image": "app:1"});
    let mut volumes = json!([]);
    let mut annotations = json!({});
    if refs == 1 {
        annotations = json!({"config-snapshot.io/snapshot": "*"});
        container["envFrom"] = json!([{"configMapRef": {"name": cms[0]}}]);
    } else if refs == 8 {
        annotations = json!({"config-snapshot.io/snapshot": "*"});
        // Every reference kind: envFrom, env valueFrom, a volume, a
        // projected volume; for ConfigMaps and Secrets alike.
        container["envFrom"] = json!([{"configMapRef": {"name": cms[0]}}, {"secretRef": {"name": secrets[0]}}]);
        container["env"] = json!([
            {"name": "A", "valueFrom": {"configMapKeyRef": {"name": cms[1], "key": "k"}}},
            {"name": "B", "valueFrom": {"secretKeyRef": {"name": secrets[1], "key": "k"}}}
        ]);
        volumes = json!([
            {"name": "c", "configMap": {"name": cms[2]}},
            {"name": "s", "secret": {"secretName": secrets[2]}},
            {"name": "p", "projected": {"sources": [
                {"configMap": {"name": cms[3]}}, {"secret": {"name": secrets[3]}}]}}
        ]);
    }
    serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"paused": paused, "replicas": 0, "selector": {"matchLabels": {"app": "bench"}},
            "template": {"metadata": {"labels": {"app": "bench"}},
                "spec": {"containers": [container], "volumes": volumes}}}
    }))
    .unwrap()
}

/// What one group at one client count measured.
struct Row {
    /// serve or policy-server.
    hook: Engine,
    group: Group,
    clients: usize,
    samples: usize,
    apiserver: Buckets,
    /// kube-apiserver's total seconds in the webhook for the window.
    apiserver_secs: f64,
    serve: Buckets,
    /// What the clients saw, sorted (µs).
    client: Vec<u64>,
    /// serve's host calls in the window, by operation: seconds, calls.
    calls: BTreeMap<String, (f64, f64)>,
    /// serve's seconds answering the window's creates.
    serve_secs: f64,
    /// Writes the webhook did not answer (an error, or let through
    /// untouched past its timeout): counted, not timed.
    unanswered: usize,
    /// kube-apiserver's request and etcd write over the window
    /// ([`ApiserverView::split`]): seconds, observations.
    split: [(f64, f64); 2],
    /// Writes in the window the webhook's matchConditions kept from it.
    excluded: f64,
    /// The requests the window cost, and who made them.
    requests: Requests,
}

impl Row {
    fn describe(&self) -> String {
        match self.hook {
            Engine::Serve => self.group.describe().to_string(),
            Engine::PolicyServer => format!("policy-server: {}", self.group.describe()),
        }
    }

    /// serve's mean time answering the window's writes (µs).
    fn serve_mean(&self) -> f64 {
        self.serve_secs * 1e6 / self.samples.max(1) as f64
    }

    /// kube-apiserver's mean time in the webhook (µs).
    fn apiserver_mean(&self) -> f64 {
        self.apiserver_secs * 1e6 / self.apiserver.total().max(1.0)
    }

    fn client_quantile(&self, q: f64) -> u64 {
        let i = ((self.client.len() as f64 * q).ceil() as usize).clamp(1, self.client.len()) - 1;
        self.client[i]
    }
}

/// Runs one group at one client count in namespace `ns`.
async fn measure(
    cp: &ControlPlane,
    hook: Hook<'_>,
    client: &kube::Client,
    ns: &str,
    group: Group,
    clients: usize,
    samples: usize,
) -> Row {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    // Every worker's sources, and one create per worker first: the
    // snapshots "existing" groups find exist.
    for w in 0..clients {
        let (cms, ss) = source_names(w);
        for name in cms {
            let cm: ConfigMap =
                serde_json::from_value(json!({"metadata": {"name": name}, "data": {"k": "0"}})).unwrap();
            let _ = configmaps.create(&PostParams::default(), &cm).await;
        }
        for name in ss {
            let s: Secret =
                serde_json::from_value(json!({"metadata": {"name": name}, "stringData": {"k": "0"}})).unwrap();
            let _ = secrets.create(&PostParams::default(), &s).await;
        }
        let refs = match group {
            Group::PassThrough => 0,
            Group::OneExisting => 1,
            _ => 8,
        };
        deployments
            .create(
                &PostParams::default(),
                &deployment(&format!("warm-{w}"), w, refs, false),
            )
            .await
            .unwrap();
    }
    // As in a running cluster, the snapshots that exist are owned by the
    // warm Deployments' ReplicaSets: the reuse the groups measure is the
    // common one, not the reuse of an orphan waiting for the sweep.
    // (policy-server makes none: nothing to wait for.)
    eventually(&format!("the warm snapshots in {ns} to be adopted"), 60, || {
        let view = cp.objects(ns);
        view.0
            .iter()
            .filter(|o| config_snapshot_policy::model::keys::is_snapshot(o))
            .all(|o| {
                o["metadata"]["ownerReferences"]
                    .as_array()
                    .is_some_and(|r| !r.is_empty())
            })
            .then_some(())
    });
    // The fleet a re-apply group updates, made once the warm snapshots are
    // owned (the first of it anchors them): at most 400 in all.
    let fleet = if group == Group::Reapplied {
        FLEET.min(samples.div_ceil(clients)).min((400 / clients).max(1))
    } else {
        FLEET
    };
    if group == Group::Reapplied {
        for w in 0..clients {
            for j in 0..fleet {
                deployments
                    .create(&PostParams::default(), &deployment(&format!("d-{w}-{j}"), w, 8, true))
                    .await
                    .unwrap();
            }
        }
    }
    // The warm Deployments' ReplicaSets are CREATEs too: all made before
    // the window opens.
    settle(cp, ns);
    let operation = group.operation();
    let api_before = apiserver_view(cp, hook.name(), operation);
    let serve_view = |serve: Option<&ServeProcess>| match serve {
        Some(serve) => (
            serve_buckets(serve, operation),
            host_calls(serve),
            serve_seconds(serve, operation),
        ),
        None => (Buckets::default(), BTreeMap::new(), 0.0),
    };
    let serve = hook.serve();
    let (serve_before, calls_before, secs_before) = serve_view(serve);
    let config_before = config_requests(cp);
    let serve_requests_before = serve.map(serve_requests).unwrap_or_default();
    let per_worker = samples.div_ceil(clients);
    let mut tasks = Vec::new();
    for w in 0..clients {
        let (deployments, configmaps, secrets) = (deployments.clone(), configmaps.clone(), secrets.clone());
        tasks.push(tokio::spawn(async move {
            let mut took = Vec::with_capacity(per_worker);
            let mut unanswered = 0;
            let (cms, ss) = source_names(w);
            for i in 0..per_worker {
                if group == Group::Reapplied {
                    // A metadata edit: the template, which names the
                    // snapshots, stays as it is.
                    let name = format!("d-{w}-{}", i % fleet);
                    let edit = Patch::Merge(json!({"metadata": {"labels": {"sample": i.to_string()}}}));
                    let start = Instant::now();
                    match deployments.patch(&name, &PatchParams::default(), &edit).await {
                        Ok(_) => took.push(start.elapsed().as_micros() as u64),
                        Err(e) if unanswered_by_webhook(&e) => unanswered += 1,
                        Err(e) => panic!("{e}"),
                    }
                    continue;
                }
                let refs = match group {
                    Group::PassThrough => 0,
                    Group::OneExisting => 1,
                    Group::EightExisting | Group::Reapplied => 8,
                    Group::EightNew => {
                        // New content in all 8 (UPDATE admissions, not
                        // counted with the creates).
                        let data = json!({"k": format!("{}", i + 1)});
                        for name in &cms {
                            configmaps
                                .patch(name, &PatchParams::default(), &Patch::Merge(json!({"data": data})))
                                .await
                                .unwrap();
                        }
                        for name in &ss {
                            secrets
                                .patch(
                                    name,
                                    &PatchParams::default(),
                                    &Patch::Merge(json!({"stringData": data})),
                                )
                                .await
                                .unwrap();
                        }
                        8
                    }
                };
                let d = deployment(&format!("d-{w}-{i}"), w, refs, true);
                let start = Instant::now();
                let created = match deployments.create(&PostParams::default(), &d).await {
                    Ok(created) => created,
                    Err(e) if unanswered_by_webhook(&e) => {
                        unanswered += 1;
                        continue;
                    }
                    Err(e) => panic!("{e}"),
                };
                let elapsed = start.elapsed().as_micros() as u64;
                if i >= FLEET {
                    // Gone already if its own create went unanswered.
                    match deployments
                        .delete(&format!("d-{w}-{}", i - FLEET), &Default::default())
                        .await
                    {
                        Ok(_) => {}
                        Err(kube::Error::Api(status)) if status.code == 404 => {}
                        Err(e) => panic!("{e}"),
                    }
                }
                // The measurement is void if the webhook was skipped: serve
                // pins a snapshot, policy-server stamps checksums.
                let template = created.spec.map(|s| s.template);
                let pinned = template
                    .as_ref()
                    .and_then(|t| t.spec.as_ref())
                    .map(|s| serde_json::to_value(&s.containers[0]).unwrap().to_string());
                let stamped = template
                    .and_then(|t| t.metadata)
                    .and_then(|m| m.annotations)
                    .is_some_and(|a| a.keys().any(|k| k.starts_with("config-snapshot.io/checksum-")));
                // One the webhook did not answer in time (failurePolicy
                // Ignore lets it through untouched) is counted, not timed.
                if refs == 0 || stamped || !pinned.unwrap_or_default().contains(&format!("\"{}\"", cms[0])) {
                    took.push(elapsed);
                } else {
                    unanswered += 1;
                }
            }
            (took, unanswered)
        }));
    }
    let mut unanswered = 0;
    let mut client_times = Vec::new();
    for t in tasks {
        let (took, missed) = t.await.unwrap();
        client_times.extend(took);
        unanswered += missed;
    }
    client_times.sort_unstable();
    let api_after = apiserver_view(cp, hook.name(), operation);
    let (serve_after, calls_after, secs_after) = serve_view(serve);
    // The garbage collector works after each delete, not within it: the
    // window's deletes are given the settling time to be cleaned up after.
    let deleted = if group == Group::Reapplied {
        0
    } else {
        per_worker.saturating_sub(FLEET) * clients
    };
    if deleted > 0 {
        settle(cp, ns);
    }
    let config_after = config_requests(cp);
    let serve_requests_after = serve.map(serve_requests).unwrap_or_default();
    let delta = |verbs: &[&str], after: &dyn Fn(&str) -> f64, before: &dyn Fn(&str) -> f64| -> f64 {
        verbs.iter().map(|v| after(v) - before(v)).sum()
    };
    let config = |m: &BTreeMap<&'static str, f64>, v: &str| m.get(v).copied().unwrap_or(0.0);
    let own = |m: &BTreeMap<String, f64>, v: &str| m.get(v).copied().unwrap_or(0.0);
    let serve_reads = delta(&["get", "list"], &|v| own(&serve_requests_after, v), &|v| {
        own(&serve_requests_before, v)
    });
    let serve_writes = delta(
        &["create", "patch", "delete"],
        &|v| own(&serve_requests_after, v),
        &|v| own(&serve_requests_before, v),
    );
    // The clients' own source edits: 8 PATCHes per create of new content.
    let clients_writes = if group == Group::EightNew {
        8.0 * client_times.len() as f64
    } else {
        0.0
    };
    let all_reads = delta(&["GET", "LIST"], &|v| config(&config_after, v), &|v| {
        config(&config_before, v)
    });
    let all_writes = delta(&["POST", "PATCH", "DELETE"], &|v| config(&config_after, v), &|v| {
        config(&config_before, v)
    });
    let requests = Requests {
        serve_reads,
        serve_writes,
        // serve's namespace reads are not ConfigMaps' or Secrets'.
        others_reads: (all_reads - serve_reads).max(0.0),
        others_writes: (all_writes - serve_writes - clients_writes).max(0.0),
        deleted,
    };
    Row {
        requests,
        hook: hook.engine(),
        group,
        clients,
        samples: client_times.len(),
        unanswered,
        apiserver: api_after.buckets.minus(&api_before.buckets),
        apiserver_secs: api_after.webhook_secs - api_before.webhook_secs,
        serve: serve_after.minus(&serve_before),
        client: client_times,
        serve_secs: secs_after - secs_before,
        excluded: api_after.excluded - api_before.excluded,
        split: std::array::from_fn(|i| {
            (
                api_after.split[i].0 - api_before.split[i].0,
                api_after.split[i].1 - api_before.split[i].1,
            )
        }),
        calls: calls_after
            .into_iter()
            .map(|(op, (secs, n))| {
                let (secs0, n0) = calls_before.get(&op).copied().unwrap_or_default();
                (op, (secs - secs0, n - n0))
            })
            .filter(|(_, (_, n))| *n > 0.0)
            .collect(),
    }
}

/// One ConfigMap edit, 50 watching Deployments: the time from the edit's
/// answer until every one of them pins the new snapshot, `rounds` times.
async fn fan_out(cp: &ControlPlane, client: &kube::Client, ns: &str, rounds: usize) -> Vec<Duration> {
    const WATCHERS: usize = 50;
    cp.namespace(ns);
    cp.apply(ns, &config_map("fan", json!({"round": "0"})));
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    for i in 0..WATCHERS {
        let mut d = workload(
            "Deployment",
            &format!("w-{i}"),
            json!({"config-snapshot.io/watch": "fan"}),
            "app:1",
            json!([{"configMapRef": {"name": "fan"}}]),
            2,
        );
        d["spec"]["replicas"] = json!(0);
        deployments
            .create(&PostParams::default(), &serde_json::from_value(d).unwrap())
            .await
            .unwrap();
    }
    settle(cp, ns);
    let pins = || async {
        let list = deployments.list(&Default::default()).await.unwrap();
        list.items
            .iter()
            .map(|d| env_ref(&serde_json::to_value(d).unwrap()))
            .collect::<BTreeSet<String>>()
    };
    let mut out = Vec::new();
    for round in 1..=rounds {
        let before = pins().await;
        assert_eq!(
            before.len(),
            1,
            "the watchers do not agree before round {round}: {before:?}"
        );
        cp.apply(ns, &config_map("fan", json!({"round": round.to_string()})));
        let edited = Instant::now();
        let deadline = edited + Duration::from_secs(60);
        loop {
            let now = pins().await;
            if now.len() == 1 && now != before {
                out.push(edited.elapsed());
                break;
            }
            assert!(Instant::now() < deadline, "round {round} never fully rolled: {now:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Past the storm guard's interval (1 s here) before the next edit.
        settle(cp, ns);
    }
    out.sort();
    out
}

fn ms(micros: f64) -> String {
    format!("{:.1}", micros / 1000.0)
}

fn table(rows: &[Row], fan: &[Duration], build: &str) -> String {
    let mut out = String::new();
    let date = today();
    let _ = writeln!(
        out,
        "Measured {date}, shared by etcd, kube-apiserver, \
         kube-controller-manager, serve ({build} build) and the clients. Deployment CREATEs \
         (for re-applies, UPDATEs) through the API with kube-rs; the shipped webhook \
         configuration; each client keeps at most {FLEET} Deployments sharing its sources.\n"
    );
    let _ = writeln!(
        out,
        "| group | clients | samples | apiserver ≤ 5 ms | ≤ 25 ms | ≤ 100 ms | serve p50 / p99 (ms) | client p50 / p99 (ms) |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|");
    for r in rows {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {:.1}% | {:.1}% | {:.1}% | {} / {} | {} / {} |",
            r.describe(),
            r.clients,
            r.samples,
            100.0 * r.apiserver.within(5_000),
            100.0 * r.apiserver.within(25_000),
            100.0 * r.apiserver.within(100_000),
            ms(r.serve.quantile(0.5)),
            ms(r.serve.quantile(0.99)),
            ms(r.client_quantile(0.5) as f64),
            ms(r.client_quantile(0.99) as f64),
        );
    }
    let _ = writeln!(
        out,
        "\nWhere serve's time went: the policy's host calls per admission, by operation \
         (calls, and mean ms per admission; `config_snapshot_host_call_duration_seconds`), \
         against serve's mean time per admission. The rest is the policy's own work and the \
         HTTP and JSON around it.\n"
    );
    let _ = writeln!(out, "| group | clients | serve mean (ms) | host calls per admission |");
    let _ = writeln!(out, "|---|---|---|---|");
    for r in rows.iter().filter(|r| r.hook == Engine::Serve) {
        let n = r.samples.max(1) as f64;
        let calls: Vec<String> = r
            .calls
            .iter()
            .map(|(op, (secs, count))| format!("{op} {:.1} × {:.2} ms", count / n, secs * 1000.0 / n))
            .collect();
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} |",
            r.describe(),
            r.clients,
            ms(r.serve_mean()),
            if calls.is_empty() {
                "none".to_string()
            } else {
                calls.join(", ")
            }
        );
    }
    let _ = writeln!(
        out,
        "\nWhat each window cost the API server, and who asked: serve's own requests per \
         admission (`config_snapshot_api_requests_total`: reads made fresh, and every write), \
         and the rest of kube-apiserver's ConfigMap and Secret requests (`apiserver_request_total`, \
         less serve's and the clients' own source edits: the garbage collector's cleanup, \
         chiefly) per Deployment deleted in the window, counted after it settled. serve's \
         reads of other kinds are subtracted too: others' reads are a lower bound.\n"
    );
    let _ = writeln!(
        out,
        "| group | clients | serve reads per admission | serve writes per admission | deleted | others' reads per deleted | others' writes per deleted |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|");
    for r in rows.iter().filter(|r| r.hook == Engine::Serve) {
        let n = r.samples.max(1) as f64;
        let q = &r.requests;
        let per_deleted = |x: f64| {
            if q.deleted == 0 {
                "-".to_string()
            } else {
                format!("{:.2}", x / q.deleted as f64)
            }
        };
        let _ = writeln!(
            out,
            "| {} | {} | {:.2} | {:.2} | {} | {} | {} |",
            r.describe(),
            r.clients,
            q.serve_reads / n,
            q.serve_writes / n,
            q.deleted,
            per_deleted(q.others_reads),
            per_deleted(q.others_writes),
        );
    }
    let _ = writeln!(
        out,
        "\nWhere kube-apiserver's time went, from its own histograms over each window: the \
         Deployment write's mean (`apiserver_request_duration_seconds`), the mean call to the \
         webhook, and etcd's mean write of a Deployment (`etcd_request_duration_seconds`). \
         The rest is the API server's own work (authentication, decoding, the other admission \
         steps, validation, encoding) and waiting for a core.\n"
    );
    let _ = writeln!(
        out,
        "| group | clients | request mean (ms) | webhook mean (ms) | etcd write mean (ms) | rest (ms) |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|");
    for r in rows {
        let mean = |(secs, n): (f64, f64)| secs * 1e6 / n.max(1.0);
        let [request, etcd] = r.split.map(mean);
        let webhook = r.apiserver_mean();
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} |",
            r.describe(),
            r.clients,
            ms(request),
            ms(webhook),
            ms(etcd),
            ms(request - webhook - etcd),
        );
    }
    let compared: Vec<(&Row, &Row)> = rows
        .iter()
        .filter(|r| r.hook != Engine::Serve)
        .filter_map(|p| {
            rows.iter()
                .find(|s| s.hook == Engine::Serve && s.group == p.group && s.clients == p.clients)
                .map(|s| (s, p))
        })
        .collect();
    if !compared.is_empty() {
        let _ = writeln!(
            out,
            "\nserve : policy-server, the same creates through the same kube-apiserver (below 1: \
             serve is faster). policy-server runs the same policy in checksum mode, reading every \
             opted-in source fresh; serve makes and reuses snapshots.\n"
        );
        let _ = writeln!(
            out,
            "| group | clients | apiserver mean, serve / policy-server (ms) | ratio | client p50, serve / policy-server (ms) | ratio | unanswered, serve / policy-server |"
        );
        let _ = writeln!(out, "|---|---|---|---|---|---|---|");
        for (s, p) in compared {
            let (sp50, pp50) = (s.client_quantile(0.5) as f64, p.client_quantile(0.5) as f64);
            let _ = writeln!(
                out,
                "| {} | {} | {} / {} | {:.2} | {} / {} | {:.2} | {} / {} |",
                s.group.describe(),
                s.clients,
                ms(s.apiserver_mean()),
                ms(p.apiserver_mean()),
                s.apiserver_mean() / p.apiserver_mean().max(1.0),
                ms(sp50),
                ms(pp50),
                sp50 / pp50.max(1.0),
                s.unanswered,
                p.unanswered,
            );
        }
    }
    if !fan.is_empty() {
        let _ = writeln!(
            out,
            "\nWatch fan-out, one ConfigMap edit rolling 50 Deployments, {} rounds: fully rolled after \
             {:.2} s median, {:.2} s worst.",
            fan.len(),
            fan[fan.len() / 2].as_secs_f64(),
            fan[fan.len() - 1].as_secs_f64()
        );
    }
    out
}

/// Every group measured what it says: kube-apiserver called the webhook
/// once per create in the window, and no more (a skipped webhook, or
/// other CREATEs in the window, would make the figures someone else's).
/// serve's webhook is not called for a workload that is not opted in at
/// all: its matchConditions keep every such write from it (the promise
/// "a write that has nothing to do with us never waits on us", counted).
fn valid(rows: &[Row]) {
    for r in rows {
        if r.group == Group::PassThrough && r.hook == Engine::Serve {
            assert_eq!(
                r.apiserver.total(),
                0.0,
                "{} at {} clients: the apiserver called serve's webhook for writes that are not opted in",
                r.describe(),
                r.clients
            );
            assert!(
                r.excluded >= r.samples as f64,
                "{} at {} clients: the matchConditions kept {} of {} creates from the webhook",
                r.describe(),
                r.clients,
                r.excluded,
                r.samples
            );
            continue;
        }
        assert_eq!(
            r.apiserver.total() as usize,
            r.samples + r.unanswered,
            "{} at {} clients: the apiserver counted {} webhook calls for {} creates ({} unanswered)",
            r.describe(),
            r.clients,
            r.apiserver.total(),
            r.samples,
            r.unanswered
        );
    }
}

/// The targets, as met or missed by an optimised build (printed by
/// `make bench-cluster`, not asserted: a benchmark reports its gaps).
fn against_targets(rows: &[Row], fan: &[Duration]) -> String {
    let mut out = String::from("\nAgainst the targets:\n\n");
    let mut line = |what: String, met: bool| {
        let _ = writeln!(out, "- {what}: {}", if met { "met" } else { "**missed**" });
    };
    for r in rows.iter().filter(|r| r.clients <= 8 && r.hook == Engine::Serve) {
        match r.group {
            Group::PassThrough => line(
                format!(
                    "not opted in at {} clients, never sent to the webhook ({} calls, {} kept back by its matchConditions)",
                    r.clients,
                    r.apiserver.total(),
                    r.excluded
                ),
                r.apiserver.total() == 0.0,
            ),
            Group::EightExisting | Group::Reapplied => line(
                format!(
                    "{} at {} clients, ≥ 95% within 5 ms ({:.1}%)",
                    r.group.describe(),
                    r.clients,
                    100.0 * r.apiserver.within(5_000)
                ),
                r.apiserver.within(5_000) >= 0.95,
            ),
            Group::EightNew => {
                line(
                    format!(
                        "8 new snapshots at {} clients, 100% within 25 ms ({:.1}%)",
                        r.clients,
                        100.0 * r.apiserver.within(25_000)
                    ),
                    r.apiserver.within(25_000) >= 1.0,
                );
                line(
                    format!(
                        "8 new snapshots at {} clients, serve's p99 ≤ 15 ms ({} ms)",
                        r.clients,
                        ms(r.serve.quantile(0.99))
                    ),
                    r.serve.quantile(0.99) <= 15_000.0,
                );
            }
            _ => {}
        }
    }
    if let Some(worst) = fan.last() {
        line(
            format!(
                "50-Deployment fan-out fully rolled ≤ 2 s ({:.2} s worst)",
                worst.as_secs_f64()
            ),
            *worst <= Duration::from_secs(2),
        );
    }
    out
}

/// The benchmark: serve restarted as shipped (info logs), the groups, the
/// fan-out, the table; then serve back as the other stories use it.
/// `short`: the regression guard's sizes unless the environment says
/// otherwise (200 samples at 1 client, which is all its ratios read, and 3 fan-out rounds).
pub fn webhook_latency(cp: &ControlPlane, serve: &mut ServeProcess, kubeconfig: &Path, short: bool) {
    let env = |name: &str, full: &str, quick: &str| {
        std::env::var(name).unwrap_or_else(|_| if short { quick } else { full }.to_string())
    };
    let samples: usize = env("BENCH_SAMPLES", "1000", "200").parse().unwrap();
    let clients: Vec<usize> = env("BENCH_CLIENTS", "1,8,32", "1")
        .split(',')
        .filter_map(|c| c.trim().parse().ok())
        .collect();
    let rounds: usize = env("BENCH_FAN_ROUNDS", "10", "3").parse().unwrap();
    let build = if cfg!(debug_assertions) {
        "unoptimised"
    } else {
        "release"
    };

    serve.stop();
    // The storm guard at 1 s so that the fan-out's rounds come quickly; the
    // periodic pass out of the way of the measurement; the per-namespace
    // snapshot budget (600 a minute, a guard against floods) above what
    // the benchmark makes on purpose.
    let mut flags = serve_flags_with("{}", "1s");
    let at = flags.iter().position(|f| *f == "--resync-interval").unwrap();
    flags[at + 1] = "120s";
    flags.extend([
        "--snapshot-rate",
        "1000000",
        "--snapshot-bytes-rate",
        "4095Mi",
        "--snapshot-bytes-rate-total",
        "4095Mi",
    ]);
    // BENCH_SOURCE_READS: the groups' serve reads its sources that way
    // instead of the default; `none` is the slowed build the guard must
    // catch (docs/BENCHMARKS.md, "The regression guard, shown failing").
    let slowed = std::env::var("BENCH_SOURCE_READS").unwrap_or_default();
    let mut measured = flags.clone();
    if !slowed.is_empty() {
        measured.extend(["--source-reads", slowed.as_str()]);
    }
    let mut bench = serving(cp, kubeconfig, &measured);

    config_snapshot::use_ring_for_tls();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let client = runtime.block_on(async {
        let config = kube::Config::from_custom_kubeconfig(
            // The cluster admin: its certificate is X.509 v3, which rustls takes.
            kube::config::Kubeconfig::read_from(&cp.kubeconfig).unwrap(),
            &Default::default(),
        )
        .await
        .unwrap();
        kube::Client::try_from(config).unwrap()
    });
    let mut rows = Vec::new();
    for group in Group::ALL {
        for &n in &clients {
            let ns = format!("bench-{}-{n}", rows.len());
            cp.namespace(&ns);
            let row = runtime.block_on(measure(cp, Hook::Serve(&bench), &client, &ns, group, n, samples));
            eprintln!(
                "bench: {} at {n} clients: {} samples, apiserver within 5 ms {:.1}%, serve p99 {} ms",
                group.describe(),
                row.samples,
                100.0 * row.apiserver.within(5_000),
                ms(row.serve.quantile(0.99))
            );
            rows.push(row);
            // Each group on a cluster as small as the last one's.
            let _ = cp.try_kubectl(&["delete", "namespace", &ns, "--timeout=300s"], None);
        }
    }
    let fan = runtime.block_on(fan_out(cp, &client, "bench-fan-out", rounds));
    // The ways to read a workload's sources fresh, each on serve restarted
    // with it, in this one run (docs/BENCHMARKS.md, "Fresh reads").
    let strategies = env("BENCH_READS", "", "");
    if !strategies.is_empty() {
        bench.stop();
        let reads = compare_reads(cp, kubeconfig, &flags, &runtime, &client, &strategies, samples);
        publish("bench-reads", &reads);
        eprintln!("{reads}");
        bench = serving(cp, kubeconfig, &measured);
    }
    // The real Kubewarden engine on the same creates, if POLICY_SERVER
    // names it: serve and its webhook out of the way first.
    if let Some(binary) = policy_server::binary() {
        bench.stop();
        let _ = cp.try_kubectl(&["delete", "mutatingwebhookconfiguration", "config-snapshot"], None);
        let groups = [
            Group::PassThrough,
            Group::OneExisting,
            Group::EightExisting,
            Group::Reapplied,
        ];
        let names: Vec<String> = groups
            .iter()
            .enumerate()
            .flat_map(|(g, _)| clients.iter().map(move |n| format!("ps-bench-{g}-{n}")))
            .collect();
        let server = policy_server::PolicyServer::start(&binary, &policy_server::reader_kubeconfig(cp));
        let mut namespaces: Vec<&str> = names.iter().map(String::as_str).collect();
        namespaces.push("ps-bench-probe");
        policy_server::register(cp, &server, &namespaces);
        policy_server::answers(cp, "ps-bench-probe");
        for (g, group) in groups.into_iter().enumerate() {
            for &n in &clients {
                let ns = format!("ps-bench-{g}-{n}");
                cp.namespace(&ns);
                let row = runtime.block_on(measure(cp, Hook::PolicyServer, &client, &ns, group, n, samples));
                eprintln!(
                    "bench: policy-server, {} at {n} clients: apiserver within 5 ms {:.1}%, mean {} ms",
                    group.describe(),
                    100.0 * row.apiserver.within(5_000),
                    ms(row.apiserver_mean())
                );
                rows.push(row);
                let _ = cp.try_kubectl(&["delete", "namespace", &ns, "--timeout=300s"], None);
            }
        }
        policy_server::unregister(cp);
        drop(server);
    }
    let mut text = table(&rows, &fan, build);
    if build == "release" {
        text.push_str(&against_targets(&rows, &fan));
    }
    eprintln!("{text}");
    publish("bench-cluster", &text);
    valid(&rows);
    guard::check(&rows);

    drop(bench);
    serve.restart(kubeconfig, &serve_flags("{}"));
    serve.wait_ready();
    register(cp, serve, yaml("deploy/serve/webhook.yaml").remove(0));
    webhook_answers(cp);
}

/// serve started as the benchmark runs it (info logs, `flags`), its
/// webhook registered and answering.
fn serving(cp: &ControlPlane, kubeconfig: &Path, flags: &[&str]) -> ServeProcess {
    serving_build(cp, ServeProcess::this_build(), kubeconfig, flags)
}

/// [`serving`] with `binary` as serve: another build, to compare against.
fn serving_build(cp: &ControlPlane, binary: &Path, kubeconfig: &Path, flags: &[&str]) -> ServeProcess {
    let mut serve = ServeProcess::start_build(binary, kubeconfig, flags, "info");
    serve.wait_ready();
    register(cp, &serve, yaml("deploy/serve/webhook.yaml").remove(0));
    webhook_answers(cp);
    serve
}

/// Whether a write failed because its webhook did not answer: the API
/// server's 500 for a failed webhook call (failurePolicy Fail). Anything
/// else is the benchmark's own error.
fn unanswered_by_webhook(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(status) if status.code == 500)
}

/// kube-apiserver's count of GET and LIST requests for ConfigMaps and
/// Secrets: the reads a window cost the API server.
fn source_reads_served(cp: &ControlPlane) -> f64 {
    let text = cp.kubectl(&["get", "--raw", "/metrics"]);
    let mut reads = 0.0;
    for verb in ["verb=\"GET\"", "verb=\"LIST\""] {
        for resource in ["resource=\"configmaps\"", "resource=\"secrets\""] {
            reads += summed(&text, "apiserver_request_total", &[verb, resource]);
        }
    }
    reads
}

/// The opted-in CREATE groups at one client, on serve restarted with each
/// `--source-reads` way in turn: a table of kube-apiserver's mean time in
/// the webhook, serve's own, the clients' p50, and the source reads each
/// admission cost the API server.
fn compare_reads(
    cp: &ControlPlane,
    kubeconfig: &Path,
    flags: &[&str],
    runtime: &tokio::runtime::Runtime,
    client: &kube::Client,
    strategies: &str,
    samples: usize,
) -> String {
    let mut text = format!(
        "Fresh reads, {} ({} build), 1 client, {samples} creates per row; reads: kube-apiserver's GET and LIST \
         requests for ConfigMaps and Secrets per create.\n\n\
         | `--source-reads` | group | apiserver mean (ms) | serve mean (ms) | client p50 (ms) | reads per create |\n\
         |---|---|---|---|---|---|\n",
        today(),
        if cfg!(debug_assertions) {
            "unoptimised"
        } else {
            "release"
        },
    );
    // With BENCH_AGAINST naming another build's binary, each way is run
    // on it too, right after this build's: two builds compared in one run.
    let builds: Vec<(PathBuf, &str)> = std::iter::once((ServeProcess::this_build().to_path_buf(), ""))
        .chain(
            std::env::var("BENCH_AGAINST")
                .ok()
                .filter(|b| !b.is_empty())
                .map(|b| (PathBuf::from(b), " (BENCH_AGAINST)")),
        )
        .collect();
    let runs = strategies
        .split(',')
        .map(str::trim)
        .flat_map(|way| builds.iter().map(move |(binary, label)| (way, binary, *label)));
    let mut verdicts = Vec::new();
    for (i, (way, binary, label)) in runs.enumerate() {
        let mut flags = flags.to_vec();
        flags.extend(["--source-reads", way]);
        let mut serve = serving_build(cp, binary, kubeconfig, &flags);
        let mut means = Vec::new();
        for group in [Group::OneExisting, Group::EightExisting] {
            let ns = format!("bench-reads-{i}-{}", group as usize);
            cp.namespace(&ns);
            let before = source_reads_served(cp);
            let row = runtime.block_on(measure(cp, Hook::Serve(&serve), client, &ns, group, 1, samples));
            let reads = (source_reads_served(cp) - before) / row.samples.max(1) as f64;
            let serve_mean = row.serve_mean();
            text.push_str(&format!(
                "| `{way}`{label} | {} | {} | {} | {} | {reads:.1} |\n",
                group.describe(),
                ms(row.apiserver_mean()),
                ms(serve_mean),
                ms(row.client_quantile(0.5) as f64),
            ));
            means.push(serve_mean);
            let _ = cp.try_kubectl(&["delete", "namespace", &ns, "--timeout=300s"], None);
        }
        serve.stop();
        verdicts.push(format!(
            "- `{way}`{label}: {}\n",
            guard::eight_to_one(means[0], means[1])
        ));
    }
    text.push_str("\nThe regression guard's 8 : 1 bound on each way:\n\n");
    text.extend(verdicts);
    text
}

/// Writes a measured table to target/NAME.md and, with
/// `BENCH_WRITE_DOCS=1`, into docs/BENCHMARKS.md between NAME's markers
/// (`<!-- NAME:begin -->` and `<!-- NAME:end -->`).
pub fn publish(name: &str, text: &str) {
    std::fs::write(root().join(format!("target/{name}.md")), text).unwrap();
    if std::env::var("BENCH_WRITE_DOCS").is_ok_and(|v| v == "1") {
        let path = root().join("docs/BENCHMARKS.md");
        let doc = std::fs::read_to_string(&path).unwrap();
        let (begin, end) = (format!("<!-- {name}:begin -->"), format!("<!-- {name}:end -->"));
        let (head, rest) = doc
            .split_once(&begin)
            .unwrap_or_else(|| panic!("docs/BENCHMARKS.md has the {name} markers"));
        let (_, tail) = rest.split_once(&end).unwrap();
        std::fs::write(&path, format!("{head}{begin}\n{text}{end}{tail}")).unwrap();
    }
}

/// When and where a measurement ran: "2026-11-26 12:00 UTC on 2 cores (CPU model)".
pub fn today() -> String {
    let machine = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_default();
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let date = Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    format!("{date} on {cores} cores ({machine})")
}

#[cfg(test)]
mod buckets {
    use super::{summed, Buckets};

    #[test]
    fn a_series_is_summed_over_the_lines_with_every_label() {
        let text = "etcd_request_duration_seconds_sum{operation=\"create\",type=\"deployments.apps\"} 0.5\n\
                    etcd_request_duration_seconds_sum{operation=\"create\",type=\"/registry/deployments\"} 0.25\n\
                    etcd_request_duration_seconds_sum{operation=\"update\",type=\"deployments.apps\"} 4\n\
                    etcd_request_duration_seconds_count{operation=\"create\",type=\"deployments.apps\"} 2\n\
                    etcd_request_duration_seconds_sum_other{operation=\"create\",type=\"deployments\"} 8\n";
        let labels = ["operation=\"create\"", "deployments"];
        assert_eq!(summed(text, "etcd_request_duration_seconds_sum", &labels), 0.75);
        assert_eq!(summed(text, "etcd_request_duration_seconds_count", &labels), 2.0);
        assert_eq!(
            summed(text, "etcd_request_duration_seconds_sum", &["operation=\"delete\""]),
            0.0
        );
    }

    #[test]
    fn quantiles_interpolate_inside_a_bucket() {
        let text = "m_bucket{a=\"x\",le=\"0.005\"} 50\nm_bucket{a=\"x\",le=\"0.025\"} 100\nm_bucket{a=\"x\",le=\"+Inf\"} 100\nm_bucket{a=\"y\",le=\"+Inf\"} 7\n";
        let b = Buckets::parse(text, "m_bucket", &["a=\"x\""]);
        assert_eq!(b.total(), 100.0);
        assert_eq!(b.within(5_000), 0.5);
        assert_eq!(b.quantile(0.5), 5_000.0);
        assert_eq!(b.quantile(0.75), 15_000.0);
    }
}
