//! The periodic pass against forged labels, unsigned snapshots, excluded
//! namespaces and the holders of references (docs/security.md).

use std::sync::Arc;

use config_snapshot_policy::model::content::{snapshot_object, Content};
use config_snapshot_policy::model::duration::format_rfc3339;
use config_snapshot_policy::model::settings::Settings;
use config_snapshot_policy::model::source::{SourceId, SourceKind};
use serde_json::json;

use super::*;
use crate::cluster::proof::Prover;
use crate::lifecycle::{InFlight, Rules};
use crate::replay::simulator::Shared;

const KEY_MADE: i64 = 1_800_000_000;
const NOW: i64 = KEY_MADE + 86_400;

struct Nothing;

impl PassHost for Nothing {
    fn readmit(&self, _: &str, _: &Value, _: Option<&Value>) -> Result<Option<Value>, ReadmitError> {
        Ok(None)
    }
    fn submit(&self, _: Effect) {}
}

fn prover() -> Arc<Prover> {
    Arc::new(Prover::new(b"the resync tests' key, 32 bytes."))
}

/// A snapshot of `value` in `ns`, unused since long before the grace
/// period, created at `created`, signed or not.
fn snapshot(prover: &Prover, ns: &str, value: &str, created: i64, sign: bool) -> Value {
    let content = Content::from_object(SourceKind::ConfigMap, &json!({"data": {"v": value}})).unwrap();
    let name = prover.snapshot_name(ns, "app", &content);
    let mut o = snapshot_object(&SourceId::new(SourceKind::ConfigMap, "app"), ns, &name, "1", &content);
    if sign {
        prover.sign(&mut o);
    }
    o["metadata"]["creationTimestamp"] = json!(format_rfc3339(created));
    o
}

fn name(o: &Value) -> String {
    o.meta_str("name").unwrap().to_string()
}

/// A cluster of `objects`, each given a uid and a resourceVersion as the
/// API server would.
fn cluster(objects: &[Value]) -> Shared {
    Shared::holding(objects, NOW)
}

fn exists(shared: &Shared, o: &Value) -> bool {
    shared
        .get("ConfigMap", o.namespace().unwrap(), &name(o))
        .unwrap()
        .is_some()
}

fn pass(shared: &Shared, rules: &Rules) -> Pass {
    let in_flight = InFlight::default();
    Driver::new(shared, rules, &in_flight, shared).resync(&Nothing)
}

/// What the c7d6a24 sweep deleted on a real cluster: ConfigMaps that only
/// carry the label (one unused, one in kube-system, even one made to look
/// like a snapshot) are left alone and reported; what the host signed,
/// unused, is swept.
#[test]
fn a_label_alone_gets_nothing_deleted() {
    let p = prover();
    let labelled = |ns: &str, name: &str| {
        json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": ns, "creationTimestamp": format_rfc3339(NOW - 7200),
                "labels": {keys::MANAGED_BY: keys::MANAGED_BY_VALUE}},
            "data": {"config": "x"}})
    };
    let plain = labelled("shop", "payments-config");
    let system = labelled("kube-system", "kube-proxy");
    let lookalike = snapshot(&p, "shop", "lookalike", NOW - 7200, false);
    let ours = snapshot(&p, "shop", "ours", NOW - 7200, true);
    let shared = cluster(&[plain.clone(), system.clone(), lookalike.clone(), ours.clone()]);
    let done = pass(&shared, &Rules::new(Settings::default(), p));
    for kept in [&plain, &system, &lookalike] {
        assert!(exists(&shared, kept), "{} kept", name(kept));
    }
    assert!(!exists(&shared, &ours), "the host's own unused snapshot is swept");
    assert_eq!((done.swept, done.unproven), (1, 3));
    let told = shared.take_events();
    assert_eq!(
        told.iter().filter(|e| e.contains("UnprovenSnapshot")).count(),
        3,
        "{told:?}"
    );
}

/// Nothing is ours because of when it was made: an unsigned snapshot is
/// left alone and reported by every pass, however old, until an operator
/// signs it (`config-snapshot keys sign-unsigned`).
#[test]
fn an_unsigned_snapshot_is_never_signed_by_the_pass() {
    let p = prover();
    let old = snapshot(&p, "shop", "old", KEY_MADE - 86_400 * 365, false);
    let shared = cluster(std::slice::from_ref(&old));
    let rules = Rules::new(Settings::default(), p.clone());
    for _ in 0..2 {
        let done = pass(&shared, &rules);
        assert_eq!((done.swept, done.unproven), (0, 1));
    }
    let kept = shared.get("ConfigMap", "shop", &name(&old)).unwrap().unwrap();
    assert!(!p.proves(&kept) && !kept.has_annotation(crate::cluster::proof::SIGNATURE));
}

/// A Secret snapshot an earlier version made carries the plain SHA-256 of
/// its value, which anyone who reads metadata could test guesses against:
/// the pass takes it off, once, and the snapshot stays proven.
#[test]
fn the_pass_takes_the_unkeyed_hash_off_secret_snapshots() {
    let p = prover();
    let content = Content::from_object(SourceKind::Secret, &json!({"data": {"pw": "aHVudGVyMg=="}})).unwrap();
    let name = p.snapshot_name("shop", "db", &content);
    let mut made = snapshot_object(&SourceId::new(SourceKind::Secret, "db"), "shop", &name, "1", &content);
    made["metadata"]["annotations"][keys::CONTENT_HASH] = json!(content.hash());
    p.sign(&mut made);
    made["metadata"]["creationTimestamp"] = json!(format_rfc3339(NOW - 60));
    assert!(p.proves(&made));
    let shared = cluster(std::slice::from_ref(&made));
    let rules = Rules::new(Settings::default(), p.clone());
    assert_eq!(pass(&shared, &rules).unhashed, 1);
    let now = shared.get("Secret", "shop", &name).unwrap().unwrap();
    assert!(!now.has_annotation(keys::CONTENT_HASH), "{now}");
    assert!(p.proves(&now), "still proven");
    assert_eq!(pass(&shared, &rules).unhashed, 0, "once");
}

/// The pass does not look in a namespace the webhook excludes: not even
/// the host's own snapshots there are touched.
#[test]
fn an_excluded_namespace_is_not_swept() {
    let p = prover();
    let there = snapshot(&p, "kube-system", "there", NOW - 7200, true);
    let shared = cluster(std::slice::from_ref(&there));
    let rules = Rules {
        excluded_namespaces: vec!["kube-system".into()],
        ..Rules::new(Settings::default(), p)
    };
    assert_eq!(pass(&shared, &rules).swept, 0);
    assert!(exists(&shared, &there));
}

/// Config that only a CronJob or a Job names is in use: kept.
#[test]
fn config_used_by_a_cronjob_or_a_job_is_kept() {
    let p = prover();
    let by_cron = snapshot(&p, "shop", "cron", NOW - 7200, true);
    let by_job = snapshot(&p, "shop", "job", NOW - 7200, true);
    let uses =
        |name: &str| json!({"spec": {"containers": [{"name": "c", "envFrom": [{"configMapRef": {"name": name}}]}]}});
    let cronjob = json!({"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "nightly", "namespace": "shop"},
        "spec": {"schedule": "@daily", "jobTemplate": {"spec": {"template": uses(&name(&by_cron))}}}});
    let job = json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "once", "namespace": "shop"},
        "spec": {"template": uses(&name(&by_job))}});
    let shared = cluster(&[by_cron.clone(), by_job.clone(), cronjob, job]);
    assert_eq!(pass(&shared, &Rules::new(Settings::default(), p)).swept, 0);
    assert!(exists(&shared, &by_cron) && exists(&shared, &by_job));
}

/// A cluster as serve's cache shows it once a namespace passed its budget
/// between two of its listings: its sources still listed across the
/// cluster, its workloads no longer, and every listing of the namespace
/// itself refused (`Cache::held`).
struct DroppedWorkloads<'a> {
    inner: &'a Shared,
    namespace: &'a str,
}

impl Cluster for DroppedWorkloads<'_> {
    fn following(&self, kind: &str, namespace: &str) -> bool {
        namespace != self.namespace && self.inner.following(kind, namespace)
    }
    fn get(&self, kind: &str, namespace: &str, name: &str) -> cluster::Result<Option<Value>> {
        self.inner.get(kind, namespace, name)
    }
    fn list(
        &self,
        kind: &str,
        namespace: Option<&str>,
        selector: &Selector,
        visit: &mut dyn FnMut(&Value),
    ) -> cluster::Result<()> {
        if namespace == Some(self.namespace) {
            return Err(cluster::ApiError::Unavailable("not held".into()));
        }
        let source = config_snapshot_policy::model::source::SourceKind::from_kind(kind).is_some();
        self.inner.list(kind, namespace, selector, &mut |o| {
            if source || o.namespace() != Some(self.namespace) {
                visit(o)
            }
        })
    }
    fn create(&self, object: Value) -> cluster::Result<()> {
        self.inner.create(object)
    }
    fn patch(&self, kind: &str, namespace: &str, name: &str, rv: &str, ops: Vec<Value>) -> cluster::Result<()> {
        self.inner.patch(kind, namespace, name, rv, ops)
    }
    fn delete(&self, kind: &str, namespace: &str, name: &str, pre: &cluster::Preconditions) -> cluster::Result<()> {
        self.inner.delete(kind, namespace, name, pre)
    }
    fn now(&self) -> i64 {
        self.inner.now()
    }
    fn namespace_uid(&self, namespace: &str) -> cluster::Result<Option<String>> {
        self.inner.namespace_uid(namespace)
    }
}

/// Finding "Contained" (serve's cache unbounded per tenant): the sweep
/// judged a snapshot against the holders of one cluster-wide listing, so a
/// namespace dropped from serve's cache part-way (its snapshots listed, its
/// workloads not) had a snapshot in use swept. What the holders name is
/// listed again per namespace before its deletes, and a namespace that
/// cannot be listed whole keeps its snapshots; another namespace is swept
/// as before.
#[test]
fn a_namespace_the_cache_holds_in_part_keeps_its_snapshots() {
    let p = prover();
    let used = snapshot(&p, "tenant", "used", NOW - 7200, true);
    let unused = snapshot(&p, "shop", "unused", NOW - 7200, true);
    let deployment = json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "tenant"},
        "spec": {"template": {"spec": {"containers": [{"name": "c",
            "envFrom": [{"configMapRef": {"name": name(&used)}}]}]}}}});
    let shared = cluster(&[used.clone(), unused.clone(), deployment]);
    let rules = Rules::new(Settings::default(), p);
    let dropped = DroppedWorkloads {
        inner: &shared,
        namespace: "tenant",
    };
    let in_flight = InFlight::default();
    let swept = Driver::new(&dropped, &rules, &in_flight, &shared)
        .resync(&Nothing)
        .swept;
    assert!(exists(&shared, &used), "a snapshot its workload names is kept");
    assert!(!exists(&shared, &unused) && swept == 1, "another namespace is swept");
}
