//! Host invariants, tested at the capability with a hostile caller's
//! payloads: every refused call must leave the cluster untouched.

use super::*;
use config_snapshot_policy::model::content::{plain_snapshot, Content};
use config_snapshot_policy::model::duration::format_rfc3339;
use config_snapshot_policy::model::keys;
use config_snapshot_policy::model::source::{SourceId, SourceKind};
use std::sync::Mutex;

use crate::cluster::{self, Preconditions, Selector};

/// The simulator, with every write that lands written down.
#[derive(Default)]
pub(super) struct Recorder {
    pub(super) cluster: crate::replay::simulator::Shared,
    pub(super) writes: Mutex<Vec<String>>,
    /// Plays a cache that has not seen another replica's write yet:
    /// `get` misses, `get_fresh` and `create` see the truth.
    stale_cache: bool,
    /// A version `get` keeps answering for its name, as a cache that
    /// missed the object's deletion would.
    pinned: Mutex<Option<Value>>,
    /// Says it gains by concurrent writes, as serve's API client does.
    concurrent: bool,
    /// The names read past the cache (`get_fresh`), in order.
    fresh_reads: Mutex<Vec<String>>,
    /// Plays a cache whose watch is failing: its lag has no bound.
    lagging: std::sync::atomic::AtomicBool,
}

impl Recorder {
    pub(super) fn put(&self, object: Value) {
        self.cluster.store().persist(object);
    }

    fn landed(&self, result: cluster::Result<()>, what: String) -> cluster::Result<()> {
        if result.is_ok() {
            self.writes.lock().unwrap().push(what);
        }
        result
    }
}

impl Cluster for Recorder {
    fn get(&self, kind: &str, ns: &str, name: &str) -> cluster::Result<Option<Value>> {
        if self.stale_cache {
            return Ok(None);
        }
        if let Some(pinned) = self
            .pinned
            .lock()
            .unwrap()
            .as_ref()
            .filter(|p| p["metadata"]["name"] == name)
        {
            return Ok(Some(pinned.clone()));
        }
        self.cluster.get(kind, ns, name)
    }
    fn following(&self, _kind: &str, _namespace: &str) -> bool {
        !self.lagging.load(std::sync::atomic::Ordering::SeqCst)
    }
    fn get_fresh(&self, kind: &str, ns: &str, name: &str) -> cluster::Result<Option<Value>> {
        self.fresh_reads.lock().unwrap().push(name.to_string());
        self.cluster.get(kind, ns, name)
    }
    fn list(
        &self,
        kind: &str,
        ns: Option<&str>,
        selector: &Selector,
        visit: &mut dyn FnMut(&Value),
    ) -> cluster::Result<()> {
        self.cluster.list(kind, ns, selector, visit)
    }
    fn list_referencing(
        &self,
        kind: &str,
        ns: &str,
        source: &SourceId,
        visit: &mut dyn FnMut(&Value),
    ) -> cluster::Result<()> {
        self.cluster.list_referencing(kind, ns, source, visit)
    }
    fn create(&self, object: Value) -> cluster::Result<()> {
        let what = format!("create {}", object["metadata"]["name"]);
        self.landed(self.cluster.create(object), what)
    }
    fn concurrent_writes(&self) -> bool {
        self.concurrent
    }
    fn delete(&self, kind: &str, ns: &str, name: &str, pre: &Preconditions) -> cluster::Result<()> {
        self.landed(self.cluster.delete(kind, ns, name, pre), format!("delete {name}"))
    }
    fn patch(&self, kind: &str, ns: &str, name: &str, rv: &str, ops: Vec<Value>) -> cluster::Result<()> {
        self.landed(self.cluster.patch(kind, ns, name, rv, ops), format!("annotate {name}"))
    }
    fn now(&self) -> i64 {
        self.cluster.now()
    }
    fn namespace_uid(&self, ns: &str) -> cluster::Result<Option<String>> {
        self.cluster.namespace_uid(ns)
    }
}

pub(super) fn capability(dry_run: bool) -> (Arc<Recorder>, Capability) {
    let backend = Arc::new(Recorder::default());
    backend.put(json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "plain", "namespace": "team-a", "uid": "u1"}, "data": {"a": "1"}}));
    (backend.clone(), capability_on(backend, dry_run))
}

pub(super) fn capability_on(backend: Arc<Recorder>, dry_run: bool) -> Capability {
    // The source of `good_snapshot`: a snapshot is made only of what is
    // stored.
    if backend.cluster.get("ConfigMap", "team-a", "app").unwrap().is_none() {
        backend.put(json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "app", "namespace": "team-a", "uid": "u2"}, "data": {"k": "v", "other": "o"}}));
    }
    Capability::new(
        backend,
        Caller {
            uid: "r".into(),
            namespace: "team-a".into(),
            dry_run,
            subject: Default::default(),
        },
        Arc::new(crate::lifecycle::Rules::new(
            config_snapshot_policy::model::settings::Settings::default(),
            Arc::new(crate::cluster::proof::Prover::replay()),
        )),
        Arc::default(),
        Arc::new(crate::lifecycle::Silent),
    )
}

pub(super) fn good_snapshot(ns: &str) -> Value {
    let content = Content::from_object(SourceKind::ConfigMap, &json!({"data": {"k": "v"}})).unwrap();
    proposal(&SourceId::new(SourceKind::ConfigMap, "app"), ns, &content)
}

/// The snapshot of `content` a guest proposes, under the name the host
/// (replay's key) gives it.
pub(super) fn proposal(source: &SourceId, ns: &str, content: &Content) -> Value {
    let name = crate::cluster::proof::Prover::replay().snapshot_name(ns, &source.name, content);
    config_snapshot_policy::model::content::snapshot_object(source, ns, &name, "1", content)
}

/// `snapshot` as the host signs what it creates (replay's key).
pub(super) fn signed(mut snapshot: Value) -> Value {
    crate::cluster::proof::Prover::replay().sign(&mut snapshot);
    snapshot
}

pub(super) fn write(cap: &Capability, op: &str, body: Value) -> Result<Vec<u8>, HostError> {
    cap.answer("config-snapshot", "v1", op, &serde_json::to_vec(&body).unwrap())
}

pub(super) fn assert_refused(result: Result<Vec<u8>, HostError>, backend: &Recorder, cap: &Capability, why: &str) {
    let err = result.expect_err(why);
    assert!(
        matches!(err.code, Code::Refused | Code::Conflict | Code::DryRun),
        "{why}: {err:?}"
    );
    assert!(backend.writes.lock().unwrap().is_empty(), "{why}: a write happened");
    assert!(cap.take_staged().is_empty(), "{why}: an effect was queued");
}

/// `list_referencing` answers, even in a dry run, only the workloads
/// whose template references the source, pruned to the masks; it
/// refuses kinds that are not workloads or sources.
#[test]
fn list_referencing_answers_the_referrers_only() {
    let (backend, cap) = capability(true);
    for (name, source) in [("web", "app"), ("api", "other")] {
        backend.put(json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": "team-a", "labels": {"team": "a"}},
            "spec": {"template": {"spec": {"containers": [{"name": "c",
                "envFrom": [{"configMapRef": {"name": source}}]}]}}}}));
    }
    let ask = |kind: &str, source_kind: &str| {
        write(
            &cap,
            "list_referencing",
            json!({"kind": kind, "namespace": "team-a", "source_kind": source_kind,
                   "source_name": "app", "field_masks": ["metadata.name"]}),
        )
    };
    let answer: Value = serde_json::from_slice(&ask("Deployment", "ConfigMap").unwrap()).unwrap();
    assert_eq!(answer["items"], json!([{"metadata": {"name": "web"}}]));
    // Kinds are typed by the contract: another kind is not this
    // operation's request at all.
    let refused = ask("ReplicaSet", "ConfigMap").unwrap_err();
    assert_eq!(refused.code, Code::BadRequest, "{refused}");
    assert!(
        refused.message.contains("\"ReplicaSet\" is not a workload kind"),
        "{refused}"
    );
    let refused = ask("Deployment", "Pod").unwrap_err();
    assert_eq!(refused.code, Code::BadRequest, "{refused}");
    assert!(backend.writes.lock().unwrap().is_empty());
}

#[test]
fn a_good_snapshot_is_created_once() {
    let (backend, cap) = capability(false);
    let answer = write(&cap, "create_snapshot", json!({"object": good_snapshot("team-a")})).unwrap();
    assert_eq!(
        serde_json::from_slice::<Value>(&answer).unwrap(),
        json!({"created": true, "sweeps": true})
    );
    // The sweep of its source's older versions is staged for after the
    // admission; a reuse stages none.
    let staged = cap.take_staged();
    assert!(
        matches!(&staged[..], [Effect::Sweep { namespace, source, keep }]
            if namespace == "team-a" && source.name == "app" && *keep == name_of(&good_snapshot("team-a"))),
        "{staged:?}"
    );
    let again = write(&cap, "create_snapshot", json!({"object": good_snapshot("team-a")})).unwrap();
    assert_eq!(
        serde_json::from_slice::<Value>(&again).unwrap(),
        json!({"created": false})
    );
    assert!(cap.take_staged().is_empty(), "a reuse sweeps nothing");
    // Created once; reused a moment later, with no sweep near, it needs
    // no mark (see the next test).
    let writes = backend.writes.lock().unwrap().clone();
    assert_eq!(writes.len(), 1, "{writes:?}");
    assert!(writes[0].starts_with("create"), "{writes:?}");
}

/// docs/design.md, "Garbage collection", Reuse: the write that marks a
/// reused snapshot is skipped only when a read as fresh as the request
/// leaves the sweep more than the margin away.
#[test]
fn a_reuse_is_marked_unless_a_fresh_read_shows_the_sweep_a_margin_away() {
    const T0: i64 = 1_800_000_000;
    let reuse = |cap: &Capability| {
        let answer = write(cap, "create_snapshot", json!({"object": good_snapshot("team-a")})).unwrap();
        assert_eq!(
            serde_json::from_slice::<Value>(&answer).unwrap(),
            json!({"created": false})
        );
    };
    let written = |backend: &Recorder| backend.writes.lock().unwrap().clone();

    let fresh = Arc::new(Recorder::default());
    fresh.cluster.store().now = T0;
    let cap = capability_on(fresh.clone(), false);
    write(&cap, "create_snapshot", json!({"object": good_snapshot("team-a")})).unwrap();
    fresh.cluster.store().now = T0 + 60;
    reuse(&cap);
    assert_eq!(
        written(&fresh).len(),
        1,
        "made a minute ago: nothing to write {:?}",
        written(&fresh)
    );
    let margin = config_snapshot_policy::snapshot::REUSE_MARGIN_SECS as i64;
    fresh.cluster.store().now = T0 + 600 - margin;
    reuse(&cap);
    assert_eq!(written(&fresh).len(), 2, "a sweep is within the margin: marked");
    assert!(written(&fresh)[1].starts_with("annotate"));
    let marked = fresh
        .cluster
        .get("ConfigMap", "team-a", &name_of(&good_snapshot("team-a")))
        .unwrap()
        .unwrap();
    assert_eq!(
        marked["metadata"]["annotations"][keys::LAST_USED_AT],
        format_rfc3339(T0 + 600 - margin)
    );
    fresh.cluster.store().now += 1;
    reuse(&cap);
    assert_eq!(written(&fresh).len(), 2, "the mark counts as a use");

    // On a cached read the decision waits for a fresh one: a snapshot
    // the cache still shows after its deletion is made again, not named
    // dangling.
    let cached = Arc::new(Recorder::default());
    cached.cluster.store().now = T0;
    let cap = capability_on(cached.clone(), false);
    write(&cap, "create_snapshot", json!({"object": good_snapshot("team-a")})).unwrap();
    cached.cluster.store().now = T0 + 60;
    reuse(&cap);
    assert_eq!(written(&cached).len(), 1, "{:?}", written(&cached));
    let gone = good_snapshot("team-a");
    let stale = cached
        .cluster
        .get("ConfigMap", "team-a", &name_of(&gone))
        .unwrap()
        .unwrap();
    let uid = stale.uid().unwrap().to_string();
    cached
        .cluster
        .delete(
            "ConfigMap",
            "team-a",
            &name_of(&gone),
            &Preconditions {
                uid,
                resource_version: None,
            },
        )
        .unwrap();
    *cached.pinned.lock().unwrap() = Some(stale);
    let answer = write(&cap, "create_snapshot", json!({"object": gone.clone()})).unwrap();
    assert_eq!(
        serde_json::from_slice::<Value>(&answer).unwrap(),
        json!({"created": true, "sweeps": true})
    );
    assert!(cached
        .cluster
        .get("ConfigMap", "team-a", &name_of(&gone))
        .unwrap()
        .is_some());
}

pub(super) fn name_of(object: &Value) -> String {
    object.meta_str("name").unwrap().to_string()
}

/// The snapshot `name` as another workload's revision (ReplicaSet
/// `other-1`) would leave it: owned by that alone, and stored so.
fn owned_by_another(backend: &Recorder, name: &str) -> Value {
    let mut made = backend.cluster.get("ConfigMap", "team-a", name).unwrap().unwrap();
    made["metadata"]["ownerReferences"] =
        json!([{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "other-1", "uid": "rs-other"}]);
    backend.put(made);
    backend.cluster.get("ConfigMap", "team-a", name).unwrap().unwrap()
}

#[test]
fn losing_a_create_race_to_the_same_snapshot_is_not_an_error() {
    let backend = Arc::new(Recorder {
        stale_cache: true,
        ..Recorder::default()
    });
    backend.put(signed(good_snapshot("team-a")));
    let cap = capability_on(backend.clone(), false);
    let answer = write(&cap, "create_snapshot", json!({"object": good_snapshot("team-a")})).unwrap();
    assert_eq!(
        serde_json::from_slice::<Value>(&answer).unwrap(),
        json!({"created": false})
    );

    // Another object under the snapshot's name is not ours to reuse.
    let mut other = good_snapshot("team-a");
    other["data"]["k"] = json!("different");
    backend.put(other);
    let err = write(&cap, "create_snapshot", json!({"object": good_snapshot("team-a")})).unwrap_err();
    assert_eq!(err.code, Code::Refused, "{err}");
    assert!(err.message.contains("a different ConfigMap"), "{err}");
}

#[test]
fn refuses_another_namespace() {
    let (backend, cap) = capability(false);
    assert_refused(
        write(&cap, "create_snapshot", json!({"object": good_snapshot("kube-system")})),
        &backend,
        &cap,
        "other namespace",
    );
}

/// The host builds the snapshot from what the guest proposes: owners,
/// finalizers, labels and annotations it did not decide are not copied,
/// and its own label and signature are added whatever the guest sent.
#[test]
fn what_the_host_creates_is_built_not_copied() {
    let (backend, cap) = capability(false);
    let mut proposed = good_snapshot("team-a");
    proposed["metadata"]["labels"] = json!({"team": "a"});
    proposed["metadata"]["ownerReferences"] =
        json!([{"apiVersion": "v1", "kind": "Namespace", "name": "team-a", "uid": "ns-uid"}]);
    proposed["metadata"]["finalizers"] = json!(["example.com/hold"]);
    proposed["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"] = json!("{}");
    proposed["metadata"]["annotations"][keys::SOURCE_RESOURCE_VERSION] = json!("12; rm -rf");
    write(&cap, "create_snapshot", json!({"object": proposed})).unwrap();
    let name = name_of(&good_snapshot("team-a"));
    let made = backend.cluster.get("ConfigMap", "team-a", &name).unwrap().unwrap();
    assert!(made["metadata"].get("ownerReferences").is_none(), "{made}");
    assert!(made["metadata"].get("finalizers").is_none(), "{made}");
    assert_eq!(made["metadata"]["labels"][keys::MANAGED_BY], keys::MANAGED_BY_VALUE);
    assert!(made["metadata"]["labels"].get("team").is_none(), "{made}");
    let annotations = made.annotations().unwrap();
    assert!(!annotations.contains_key("kubectl.kubernetes.io/last-applied-configuration"));
    assert_eq!(annotations[keys::SOURCE_RESOURCE_VERSION], "12");
    assert!(cap.rules.prover.proves(&made), "signed: {made}");
}

#[test]
fn refuses_a_name_that_does_not_match_the_content() {
    let (backend, cap) = capability(false);
    let mut obj = good_snapshot("team-a");
    obj["data"]["k"] = json!("tampered");
    assert_refused(
        write(&cap, "create_snapshot", json!({"object": obj})),
        &backend,
        &cap,
        "hash mismatch",
    );
    let mut mutable = good_snapshot("team-a");
    mutable["immutable"] = json!(false);
    assert_refused(
        write(&cap, "create_snapshot", json!({"object": mutable})),
        &backend,
        &cap,
        "mutable",
    );
}

#[test]
fn refuses_to_overwrite_a_different_object() {
    let (backend, cap) = capability(false);
    let obj = good_snapshot("team-a");
    let mut squatter = obj.clone();
    squatter["metadata"]["labels"] = json!({});
    backend.put(squatter);
    assert_refused(
        write(&cap, "create_snapshot", json!({"object": obj})),
        &backend,
        &cap,
        "squatter",
    );
}

#[test]
fn refuses_to_delete_an_unlabelled_object() {
    let (backend, cap) = capability(false);
    assert_refused(
        write(
            &cap,
            "delete_snapshot",
            json!({"kind": "ConfigMap", "name": "plain", "uid": "u1"}),
        ),
        &backend,
        &cap,
        "unlabelled delete",
    );
}

#[test]
fn refuses_a_patch_outside_the_pod_template() {
    let (backend, cap) = capability(false);
    // A request as the policy makes it, but for its patch.
    let body = |patch: Value| {
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "name": "web", "resourceVersion": "1",
            "patch": patch, "snapshot": "app-1",
            "source": {"kind": "ConfigMap", "name": "app", "contentHash": "a".repeat(64)}})
    };
    let inside = json!([{"op": "replace", "path": "/spec/template/metadata/labels/x", "value": "y"}]);
    assert!(
        write(&cap, "patch_workload", body(inside)).is_ok(),
        "inside the template"
    );
    assert_eq!(cap.take_staged().len(), 1);
    for path in ["/spec/replicas", "/metadata/labels/x", "/spec/template"] {
        let patch = json!([{"op": "replace", "path": path, "value": 0}]);
        assert_refused(write(&cap, "patch_workload", body(patch)), &backend, &cap, path);
    }
    for (op, from) in [("move", "/spec/selector"), ("copy", "/metadata/annotations")] {
        let patch = json!([{"op": op, "from": from, "path": "/spec/template/x"}]);
        let why = format!("{op} from outside");
        assert_refused(write(&cap, "patch_workload", body(patch)), &backend, &cap, &why);
    }
    let mut pod = body(json!([]));
    pod["kind"] = json!("Pod");
    let err = write(&cap, "patch_workload", pod).unwrap_err();
    assert_eq!(err.code, Code::BadRequest, "not a workload: {err}");
    assert!(cap.take_staged().is_empty());
}

#[test]
fn refuses_every_write_during_a_dry_run() {
    let (backend, cap) = capability(true);
    assert_refused(
        write(&cap, "create_snapshot", json!({"object": good_snapshot("team-a")})),
        &backend,
        &cap,
        "dry create",
    );
    assert_refused(
        write(
            &cap,
            "adopt",
            json!({"owner": {"kind": "ReplicaSet", "name": "x"}, "snapshots": []}),
        ),
        &backend,
        &cap,
        "dry adopt",
    );
    let patch = json!({"apiVersion": "apps/v1", "kind": "Deployment", "name": "web", "patch": []});
    assert_refused(write(&cap, "patch_workload", patch), &backend, &cap, "dry patch");
}

#[test]
fn missing_objects_read_as_not_found_errors() {
    let (_, cap) = capability(false);
    let req =
        json!({"api_version": "v1", "kind": "ConfigMap", "name": "nope", "namespace": "team-a", "disable_cache": true});
    let err = cap
        .answer(
            "kubewarden",
            "kubernetes",
            "get_resource",
            &serde_json::to_vec(&req).unwrap(),
        )
        .unwrap_err();
    assert_eq!(err.code, Code::NotFound, "{err}");
    let err = cap.answer("nope", "v1", "x", b"{}").unwrap_err();
    assert_eq!(err.code, Code::Unsupported, "{err}");
}

mod attacks;
mod revoked;

/// `create_snapshots` answers each item as `create_snapshot` would, in
/// order, whether the cluster takes the writes one by one or concurrently;
/// it is bounded, and refused in a dry run like any write.
#[test]
fn create_snapshots_answers_each_item_in_order_and_is_bounded() {
    for concurrent in [false, true] {
        let backend = Arc::new(Recorder {
            concurrent,
            ..Recorder::default()
        });
        let cap = capability_on(backend.clone(), false);
        let mut mutable = good_snapshot("team-a");
        mutable["immutable"] = json!(false);
        let items = json!({"items": [{"object": good_snapshot("team-a")}, {"object": mutable}, {"object": good_snapshot("team-a")}]});
        let answer: Value = serde_json::from_slice(&write(&cap, "create_snapshots", items).unwrap()).unwrap();
        let results = answer["results"].as_array().unwrap();
        assert_eq!(results.len(), 3, "{answer}");
        // The first and the third are the same snapshot: one of them made
        // it, the other found it (concurrently, either may be first).
        let created: Vec<bool> = [0, 2].iter().map(|&i| results[i]["created"] == true).collect();
        assert_eq!(created.iter().filter(|c| **c).count(), 1, "{answer}");
        let refused: HostError = serde_json::from_value(results[1]["error"].clone()).unwrap();
        assert_eq!(refused.code, Code::Refused, "{refused}");
        assert_eq!(backend.writes.lock().unwrap().len(), 1);

        let too_many: Vec<Value> = (0..=config_snapshot_policy::host::operation::SNAPSHOTS_PER_CALL)
            .map(|_| json!({"object": good_snapshot("team-a")}))
            .collect();
        let err = write(&cap, "create_snapshots", json!({ "items": too_many })).unwrap_err();
        assert_eq!(err.code, Code::Refused, "{err}");
    }
    let (backend, cap) = capability(true);
    assert_refused(
        write(
            &cap,
            "create_snapshots",
            json!({"items": [{"object": good_snapshot("team-a")}]}),
        ),
        &backend,
        &cap,
        "a dry run's batch",
    );
}

/// After a key is lost, a workload runs snapshots signed by a key the ring
/// no longer holds. `snapshot_name` names such a snapshot among the
/// aliases when it holds the very content asked about, so that a watch does
/// not roll the workload off it for nothing; one holding other content, or
/// not a snapshot of this source, is not named.
#[test]
fn a_running_snapshot_of_a_lost_key_is_an_alias_of_its_content() {
    let (backend, cap) = capability(true);
    let lost = crate::cluster::proof::Prover::new(b"a key this installation has lost");
    let content = Content::from_object(SourceKind::Secret, &json!({"data": {"pw": "b25l"}})).unwrap();
    let old_name = lost.snapshot_name("team-a", "db", &content);
    let mut old = config_snapshot_policy::model::content::snapshot_object(
        &SourceId::new(SourceKind::Secret, "db"),
        "team-a",
        &old_name,
        "1",
        &content,
    );
    lost.sign(&mut old);
    backend.put(old);
    let ask = |hash: &str, current: &[&str]| -> Value {
        serde_json::from_slice(
            &write(
                &cap,
                "snapshot_name",
                json!({"source": {"kind": "Secret", "name": "db"}, "contentHash": hash, "current": current}),
            )
            .unwrap(),
        )
        .unwrap()
    };
    let answer = ask(&content.hash(), &[&old_name]);
    assert_ne!(answer["name"], old_name.as_str(), "named with the current key");
    assert_eq!(answer["aliases"], json!([old_name]), "{answer}");
    let other = Content::from_object(SourceKind::Secret, &json!({"data": {"pw": "dHdv"}})).unwrap();
    assert_eq!(ask(&other.hash(), &[&old_name])["aliases"], json!([]), "other content");
    assert_eq!(
        ask(&content.hash(), &[])["aliases"],
        json!([]),
        "only what is asked about"
    );
}

/// An anchored snapshot used recently is reused on the cache's word, with
/// no request at all; once the sweep is within the margin, it is read
/// fresh and marked, as an unowned one always is.
#[test]
fn an_anchored_snapshot_used_recently_is_reused_without_a_fresh_read() {
    const T0: i64 = 1_800_000_000;
    let margin = config_snapshot_policy::snapshot::REUSE_MARGIN_SECS as i64;
    let name = name_of(&good_snapshot("team-a"));
    let backend = Arc::new(Recorder::default());
    backend.cluster.store().now = T0;
    let cap = capability_on(backend.clone(), false);
    let request = json!({"object": good_snapshot("team-a"), "owner": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"}});
    write(&cap, "create_snapshot", request.clone()).unwrap();
    owned_by_another(&backend, &name);
    write(&cap, "create_snapshot", request.clone()).unwrap();
    let anchored = backend.cluster.get("ConfigMap", "team-a", &name).unwrap().unwrap();
    assert!(config_snapshot_policy::snapshot::anchored(&anchored));
    // Fresh reads of the snapshot (its source is read fresh on every reuse).
    let fresh = |b: &Recorder| b.fresh_reads.lock().unwrap().iter().filter(|n| **n == name).count();
    let writes = |b: &Recorder| b.writes.lock().unwrap().len();

    let (reads, written) = (fresh(&backend), writes(&backend));
    backend.cluster.store().now = T0 + 600 - margin - 1;
    write(&cap, "create_snapshot", request.clone()).unwrap();
    assert_eq!(
        fresh(&backend),
        reads,
        "used within the margin: the cache's copy decides"
    );
    assert_eq!(writes(&backend), written, "and nothing is written");

    // The same, while the cache's watch is failing: its copy could lag
    // without bound, so the snapshot is read fresh (and needs no mark).
    backend.lagging.store(true, std::sync::atomic::Ordering::SeqCst);
    write(&cap, "create_snapshot", request.clone()).unwrap();
    backend.lagging.store(false, std::sync::atomic::Ordering::SeqCst);
    assert_eq!(fresh(&backend), reads + 1, "a failing watch: read fresh");
    assert_eq!(writes(&backend), written, "and still nothing is written");
    let reads = reads + 1;

    backend.cluster.store().now = T0 + 600 - margin;
    write(&cap, "create_snapshot", request).unwrap();
    assert_eq!(fresh(&backend), reads + 1, "the sweep within the margin: read fresh");
    assert_eq!(writes(&backend), written + 1, "and marked");
    let marked = backend.cluster.get("ConfigMap", "team-a", &name).unwrap().unwrap();
    assert_eq!(
        marked["metadata"]["annotations"][keys::LAST_USED_AT],
        format_rfc3339(T0 + 600 - margin)
    );
}

/// A cached copy that does not prove to be the snapshot (as after a
/// keyring rotation, before serve's cache has digested its sources again)
/// is judged again on a fresh read, not refused as a different one.
#[test]
fn a_cached_copy_that_does_not_prove_is_judged_on_a_fresh_read() {
    let name = name_of(&good_snapshot("team-a"));
    let backend = Arc::new(Recorder::default());
    let cap = capability_on(backend.clone(), false);
    write(&cap, "create_snapshot", json!({"object": good_snapshot("team-a")})).unwrap();
    let mut unproven = owned_by_another(&backend, &name);
    unproven["data"] = json!({"k": "what the cache digested with another key"});
    *backend.pinned.lock().unwrap() = Some(unproven);
    let request = json!({"object": good_snapshot("team-a"), "owner": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"}});
    let answer = write(&cap, "create_snapshot", request).unwrap();
    assert_eq!(serde_json::from_slice::<Value>(&answer).unwrap()["created"], false);
    assert!(
        backend.fresh_reads.lock().unwrap().contains(&name),
        "judged on a fresh read"
    );
}

/// A cached copy proved to be the snapshot spares only its own first
/// judgement the proof: when the write made on it conflicts, the object
/// read fresh is proved again, and one that is not the snapshot (another
/// object under its name since) is refused, with nothing written.
#[test]
fn a_proved_cached_copy_vouches_for_itself_only() {
    let name = name_of(&good_snapshot("team-a"));
    let backend = Arc::new(Recorder::default());
    let cap = capability_on(backend.clone(), false);
    write(&cap, "create_snapshot", json!({"object": good_snapshot("team-a")})).unwrap();
    // The cache holds the snapshot as it was; the cluster holds another
    // object under its name, at a later version.
    let cached = owned_by_another(&backend, &name);
    *backend.pinned.lock().unwrap() = Some(cached.clone());
    let mut other = cached;
    other["data"] = json!({"k": "not the snapshot's content"});
    backend.put(other);
    let writes = backend.writes.lock().unwrap().len();
    let request = json!({"object": good_snapshot("team-a"), "owner": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"}});
    let refused = write(&cap, "create_snapshot", request).unwrap_err();
    assert_eq!(refused.code, Code::Refused, "{refused}");
    assert!(
        backend.fresh_reads.lock().unwrap().contains(&name),
        "the conflict was judged on a fresh read"
    );
    assert_eq!(backend.writes.lock().unwrap().len(), writes, "nothing written");
}

/// A snapshot others own, reused: anchored in its namespace by one write,
/// which marks it used too; reused again, nothing is written, whoever
/// reuses it (a bare Pod, with no owner to name, anchors it as well).
#[test]
fn a_snapshot_others_own_is_anchored_once_then_reused_without_a_write() {
    const T0: i64 = 1_800_000_000;
    let name = name_of(&good_snapshot("team-a"));
    let written = |backend: &Recorder| backend.writes.lock().unwrap().clone();
    for owner in [
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"}),
        Value::Null,
    ] {
        let backend = Arc::new(Recorder::default());
        backend.cluster.store().now = T0;
        let cap = capability_on(backend.clone(), false);
        write(&cap, "create_snapshot", json!({"object": good_snapshot("team-a")})).unwrap();
        owned_by_another(&backend, &name);
        backend.cluster.store().now = T0 + 60;
        let before = written(&backend).len();
        let request = json!({"object": good_snapshot("team-a"), "owner": owner});
        write(&cap, "create_snapshot", request.clone()).unwrap();
        let anchored = backend.cluster.get("ConfigMap", "team-a", &name).unwrap().unwrap();
        let owners: Vec<&str> = anchored["metadata"]["ownerReferences"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["kind"].as_str().unwrap())
            .collect();
        assert_eq!(owners, ["ReplicaSet", "Namespace"], "{owner}");
        assert_eq!(
            anchored["metadata"]["ownerReferences"][1]["uid"],
            backend.cluster.namespace_uid("team-a").unwrap().unwrap()
        );
        assert_eq!(
            anchored["metadata"]["annotations"][keys::LAST_USED_AT],
            format_rfc3339(T0 + 60)
        );
        assert_eq!(
            written(&backend).len(),
            before + 1,
            "one write: {:?}",
            written(&backend)
        );
        backend.cluster.store().now = T0 + 120;
        write(&cap, "create_snapshot", request).unwrap();
        assert_eq!(written(&backend).len(), before + 1, "anchored: nothing more to write");
    }
}
