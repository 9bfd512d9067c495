//! The fresh source reads an opted-in workload admission is about to make,
//! started together as the request arrives and run beside the policy.
//!
//! The policy reads each source it snapshots fresh (`disable_cache`), one
//! host call after another: wasm is single-threaded. With eight sources
//! that is eight API round trips in a row. serve knows the request before
//! the policy does, so it starts those reads at once, and each of the
//! policy's reads waits for its own (docs/serve.md, "How a request is
//! answered"). Nothing waits for a read the policy does not take: a
//! re-applied manifest keeps the snapshots it names, reads no source, and
//! its answer leaves without the reads ahead. They cost the API server a
//! GET each.
//!
//! Freshness is unchanged: every read ahead starts after the request
//! arrived, as the policy's own read would, and each answers one read only
//! (a second read of the same object goes to the API server). A read the
//! prefetch did not foresee goes to the API server as before.
//!
//! What one admission reads ahead is bounded in JSON values, not in reads
//! (`MAX_HELD_VALUES`): 64 sources of a MiB each would cost serve many
//! times the review's own body. A source or snapshot past that allowance
//! is dropped as it arrives, and the policy's read of it goes to the API
//! server.
//!
//! Which sources: those of the request's template that the workload opts in
//! and that the template names by their own name (not a snapshot): every
//! source of a CREATE, a roll forward, or a re-applied manifest. A template
//! that already names snapshots (a scale, a label edit) usually needs no
//! read at all, so nothing is fetched for it.
//!
//! With each source comes the snapshot the policy will make of it: its name
//! follows from the source's content and the keys the template reads, so
//! once the source is in, the snapshot is read too. When that snapshot
//! exists unowned (a second workload of the same sources, a re-created
//! one), this fresh read lets the host reuse it without a write
//! (`sweep::must_mark_reuse`): the reads of every source and snapshot run
//! at once, where the writes would run one after another. The host waits
//! for a snapshot's read only then: one its cache shows missing (a new
//! content, created at once) needs no fresh read, and one the cache shows
//! owned, or anchored and used recently (`reusable_as_cached`), is not read
//! ahead at all: a snapshot many workloads share costs no read per create.

use config_snapshot_policy::model::object::ObjectExt;
use std::collections::hash_map::Entry;
use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use config_snapshot_policy::model::content::{snapshot_name, Content};
use config_snapshot_policy::model::keys;
use config_snapshot_policy::model::kinds::WorkloadKind;
use config_snapshot_policy::model::optin::OptIn;
use config_snapshot_policy::model::settings::Settings;
use config_snapshot_policy::model::source::SourceKind;
use config_snapshot_policy::rollout::reads_ahead;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;
use tokio::sync::{oneshot, Semaphore};

use super::apiserver::{KubeCluster, Listed};
use super::source_reads::LIST_AT_MOST;
use crate::cluster;
use crate::cluster::count::Allowance;
use crate::cluster::proof::Prover;

/// A source to read, in the request's namespace.
#[derive(Debug, Clone, PartialEq)]
pub struct Wanted {
    pub kind: SourceKind,
    pub name: String,
    /// The keys the template reads (`None`: all), which the snapshot's
    /// content, and so its name, is made of.
    pub keys: Option<BTreeSet<String>>,
}

/// A read made ahead, still running or done.
pub type Pending = oneshot::Receiver<cluster::Result<Option<Value>>>;

/// The request's object alone: serde skips the rest of the request.
#[derive(Deserialize)]
pub(crate) struct ObjectOnly {
    #[serde(default)]
    pub object: Value,
}

/// The reads made ahead, by (kind, name), each taken at most once.
pub(crate) type Fetched = HashMap<(SourceKind, String), Pending>;

/// What one admission's reads ahead share: where their answers wait, its
/// part of the reads at once, and the JSON values they may hold in all.
#[derive(Clone)]
pub(crate) struct Share {
    pub pending: Arc<Mutex<Fetched>>,
    pub permits: Arc<Semaphore>,
    pub allowance: Arc<Allowance>,
}

/// The sources worth reading ahead for this AdmissionRequest (raw JSON),
/// whose `kind` and `operation` the caller has already parsed. A request
/// that cannot opt in costs string compares, or at most a substring
/// search, and no parse.
pub fn wanted(kind: &str, operation: &str, request: &RawValue, settings: &Settings) -> Vec<Wanted> {
    let Some(kind) = WorkloadKind::from_kind(kind).filter(|_| matches!(operation, "CREATE" | "UPDATE")) else {
        return Vec::new();
    };
    // Every opt-in annotation carries the prefix; most requests do not.
    if !request.get().contains(keys::PREFIX) {
        return Vec::new();
    }
    let Ok(ObjectOnly { object }) = serde_json::from_str(request.get()) else {
        return Vec::new();
    };
    let annotations = object.annotations();
    let Ok(optin) = OptIn::from_annotations(annotations, settings) else {
        return Vec::new();
    };
    let Some(pod_template) = object.pointer(kind.template()) else {
        return Vec::new();
    };
    // The planner's own rule (one group per source: none is read twice).
    reads_ahead(pod_template, &optin, settings)
        .into_iter()
        .map(|g| Wanted {
            keys: g.key_subset(),
            kind: g.id.kind,
            name: g.id.name,
        })
        .collect()
}

/// The name of the snapshot the host makes of `source` (as read, in
/// `namespace`) for a template reading its `keys`; `None` for what it makes
/// none of (an object that is itself a snapshot, content it refuses).
///
/// A Secret's snapshot is named by the keyed digest (`prover`), as the host
/// names it: a GET of a name with the plain hash of a Secret's content would
/// write that hash into the API server's audit log, where anyone who reads
/// the log could test guesses of the value against it. Without a prover a
/// Secret's snapshot is not read ahead at all.
pub fn snapshot_of(wanted: &Wanted, namespace: &str, source: &Value, prover: Option<&Prover>) -> Option<String> {
    if keys::is_snapshot(source) {
        return None;
    }
    let content = Content::from_object(wanted.kind, source)
        .ok()?
        .subset(wanted.keys.as_ref());
    match (wanted.kind, prover) {
        (_, Some(prover)) => Some(prover.snapshot_name(namespace, &wanted.name, &content)),
        (SourceKind::ConfigMap, None) => Some(snapshot_name(&wanted.name, &content.hash())),
        (SourceKind::Secret, None) => None,
    }
}

/// Reads one wanted source of `namespace`, then its snapshot, answering
/// `source` as soon as the first read is in. The snapshot's read is
/// registered in `pending` before that answer: the policy makes a snapshot
/// only after reading its source, so its `create_snapshot` finds the read.
///
/// At most [`SourceReads::at_once`](super::source_reads::SourceReads::at_once) reads of one admission run at once, and at
/// most [`IN_FLIGHT`](super::source_reads::IN_FLIGHT) of all admissions: a burst of reviews cannot turn
/// into an unbounded burst of GETs at the API server.
pub(crate) async fn read_ahead(
    cluster: Arc<KubeCluster>,
    namespace: String,
    wanted: Wanted,
    source: oneshot::Sender<cluster::Result<Option<Value>>>,
    share: Share,
    grace: u64,
) {
    let Share {
        pending,
        permits: admission,
        allowance,
    } = share;
    let read = {
        let (Ok(_one), Ok(_all)) = (admission.acquire().await, cluster.reads_ahead.acquire().await) else {
            return;
        };
        cluster.fetch(wanted.kind.kind(), &namespace, &wanted.name).await
    };
    // Past the allowance the source is dropped, and `source` with it: the
    // policy's read of it goes to the API server, as one not foreseen.
    if !fits(&read, &allowance) {
        return;
    }
    let snapshot = match &read {
        Ok(Some(object)) => snapshot_of(&wanted, &namespace, object, cluster.cache.prover()),
        _ => None,
    };
    // A snapshot the cache shows owned, or anchored and recently used, is
    // reused from the cache: the host reads it fresh only when the sweep
    // may judge it (to judge the reuse mark).
    let snapshot = snapshot.filter(|name| !reusable_in_cache(&cluster, wanted.kind, &namespace, name, grace));
    let snapshot = snapshot.and_then(|name| {
        let (tx, rx) = oneshot::channel();
        let mut pending = pending.lock().unwrap_or_else(|e| e.into_inner());
        let slot = pending.entry((wanted.kind, name.clone()));
        matches!(slot, Entry::Vacant(_)).then(|| {
            slot.or_insert(rx);
            (name, tx)
        })
    });
    let _ = source.send(read);
    if let Some((name, tx)) = snapshot {
        let (Ok(_one), Ok(_all)) = (admission.acquire().await, cluster.reads_ahead.acquire().await) else {
            return;
        };
        let read = cluster.fetch(wanted.kind.kind(), &namespace, &name).await;
        if fits(&read, &allowance) {
            let _ = tx.send(read);
        }
    }
}

/// Whether `read` fits in what `allowance` has left, which it then takes:
/// a missing object or a failed read holds no tree.
fn fits(read: &cluster::Result<Option<Value>>, allowance: &Allowance) -> bool {
    match read {
        Ok(Some(object)) => allowance.take(object),
        _ => true,
    }
}

/// Reads `slots` (sources of one kind in `namespace`) with one consistent
/// LIST, and answers each, and registers its snapshot, from it: two fresh
/// reads per source for the price of one round trip. A source the LIST
/// could not show (a failed or cut listing) is read with its own GET.
pub(crate) async fn read_listed(
    cluster: Arc<KubeCluster>,
    namespace: String,
    kind: SourceKind,
    slots: Vec<(Wanted, oneshot::Sender<cluster::Result<Option<Value>>>)>,
    share: Share,
    grace: u64,
) {
    let Share {
        pending,
        permits: admission,
        allowance,
    } = share;
    let listed = {
        let (Ok(_one), Ok(_all)) = (admission.acquire().await, cluster.reads_ahead.acquire().await) else {
            return;
        };
        cluster.list_fresh(kind.kind(), &namespace, LIST_AT_MOST).await
    };
    // A failed listing shows nothing and is not complete: every source
    // is then read with its own GET, as a cut one's missing ones are.
    let Listed { objects, complete } = listed.unwrap_or(Listed {
        objects: Vec::new(),
        complete: false,
    });
    let by_name: HashMap<&str, &Value> = objects.iter().map(|o| (o.name(), o)).collect();
    // What the listing shows of `name`, copied if it fits the allowance
    // (`Err`: it does not, and is read when the policy asks).
    let shown = |name: &str| match by_name.get(name) {
        Some(o) if allowance.take(o) => Ok(Some((*o).clone())),
        Some(_) => Err(()),
        None => Ok(None),
    };
    let mut unshown = Vec::new();
    for (wanted, tx) in slots {
        let read = match shown(&wanted.name) {
            Ok(Some(found)) => Some(found),
            Err(()) => continue,
            Ok(None) if complete => None,
            Ok(None) => {
                unshown.push((wanted, tx));
                continue;
            }
        };
        let snapshot = read
            .as_ref()
            .and_then(|object| snapshot_of(&wanted, &namespace, object, cluster.cache.prover()))
            .filter(|name| !reusable_in_cache(&cluster, kind, &namespace, name, grace))
            .filter(|name| complete || by_name.contains_key(name.as_str()));
        // A snapshot past the allowance is not registered: the policy's
        // read of it goes to the API server.
        if let Some((name, Ok(shown))) = snapshot.map(|name| {
            let shown = shown(&name);
            (name, shown)
        }) {
            let (stx, srx) = oneshot::channel();
            let _ = stx.send(Ok(shown));
            let mut pending = pending.lock().unwrap_or_else(|e| e.into_inner());
            pending.entry((kind, name)).or_insert(srx);
        }
        let _ = tx.send(Ok(read));
    }
    for (wanted, tx) in unshown {
        read_ahead(
            cluster.clone(),
            namespace.clone(),
            wanted,
            tx,
            Share {
                pending: pending.clone(),
                permits: admission.clone(),
                allowance: allowance.clone(),
            },
            grace,
        )
        .await;
    }
}

/// Whether a LIST of `kind` in `namespace` is worth making for `wanted`
/// sources: two or more, in a namespace serve's cache shows small.
pub(crate) fn worth_listing(cluster: &KubeCluster, kind: SourceKind, namespace: &str, wanted: usize) -> bool {
    wanted >= 2
        && cluster
            .cache
            .held_in(kind.kind(), namespace)
            .is_some_and(|n| n <= LIST_AT_MOST as usize)
}

/// Whether serve's cache shows `name` so that `create_snapshot` reuses it
/// from the cache and waits for no fresh read: owned and not anchored, or
/// anchored and recently used (`reusable_as_cached`, the one rule for
/// both; `grace` is the settings' orphan grace period), and the watch
/// that holds the namespace follows the API server (not failing, not
/// listing again: `Cache::following`).
fn reusable_in_cache(cluster: &KubeCluster, kind: SourceKind, namespace: &str, name: &str, grace: u64) -> bool {
    let now = cluster.now();
    cluster.cache.following(kind.kind(), namespace)
        && cluster
            .cache
            .inspect(kind.kind(), namespace, name, |o| {
                config_snapshot_policy::snapshot::reusable_as_cached(o, now, grace)
            })
            .is_ok_and(|reusable| reusable == Some(true))
}

#[cfg(test)]
mod tests {
    use super::*;
    use config_snapshot_policy::model::references;
    use serde_json::json;

    fn request(kind: &str, operation: &str, annotations: Value, env: Value) -> Box<RawValue> {
        let text = json!({
            "uid": "u", "kind": {"group": "apps", "version": "v1", "kind": kind},
            "operation": operation, "namespace": "shop",
            "object": {"metadata": {"name": "web", "annotations": annotations},
                       "spec": {"template": {"spec": {"containers": [{"name": "c", "env": env}]}}}}
        })
        .to_string();
        RawValue::from_string(text).unwrap()
    }

    fn env(names: &[(&str, &str)]) -> Value {
        Value::Array(
            names
                .iter()
                .map(|(var, cm)| json!({"name": var, "valueFrom": {"configMapKeyRef": {"name": cm, "key": "k"}}}))
                .collect(),
        )
    }

    /// `wanted`, given the header fields as `admit` parses them.
    fn ahead(request: &RawValue, settings: &Settings) -> Vec<Wanted> {
        let head: Value = serde_json::from_str(request.get()).unwrap();
        let (kind, operation) = (
            head["kind"]["kind"].as_str().unwrap(),
            head["operation"].as_str().unwrap(),
        );
        wanted(kind, operation, request, settings)
    }

    fn names(wanted: &[Wanted]) -> Vec<&str> {
        wanted.iter().map(|w| w.name.as_str()).collect()
    }

    #[test]
    fn an_opted_in_create_reads_each_selected_source_once() {
        let settings = Settings::default();
        let r = request(
            "Deployment",
            "CREATE",
            json!({"config-snapshot.io/snapshot": "configmap/a,configmap/b"}),
            env(&[("A", "a"), ("A2", "a"), ("B", "b"), ("C", "c")]),
        );
        assert_eq!(names(&ahead(&r, &settings)), ["a", "b"]);
    }

    /// The snapshot read ahead is the one the policy makes: of the keys the
    /// template reads, named for the source; none of a snapshot.
    #[test]
    fn each_source_comes_with_the_snapshot_its_keys_make() {
        let settings = Settings::default();
        let r = request(
            "Deployment",
            "CREATE",
            json!({"config-snapshot.io/snapshot": "*"}),
            env(&[("A", "a")]),
        );
        let wanted = ahead(&r, &settings);
        assert_eq!(wanted[0].keys, Some(BTreeSet::from(["k".to_string()])));
        let source = json!({"metadata": {"name": "a"}, "data": {"k": "1", "other": "2"}});
        let only_k = Content::from_object(SourceKind::ConfigMap, &json!({"data": {"k": "1"}})).unwrap();
        assert_eq!(
            snapshot_of(&wanted[0], "ns", &source, None),
            Some(snapshot_name("a", &only_k.hash()))
        );
        let mut copy = source.clone();
        copy["metadata"]["labels"] = json!({keys::MANAGED_BY: keys::MANAGED_BY_VALUE});
        copy["metadata"]["annotations"] = json!({keys::SOURCE_NAME: "a"});
        assert_eq!(
            snapshot_of(&wanted[0], "ns", &copy, None),
            None,
            "a snapshot has no snapshot"
        );
    }

    /// A Secret's snapshot is read ahead under the name the host gives it,
    /// keyed per namespace: a GET of the plain-hash name would put an
    /// unkeyed hash of the Secret's value into the API server's audit log
    /// (round 3, finding 3). Without a prover it is not read ahead at all.
    #[test]
    fn a_secret_snapshot_is_read_ahead_by_its_keyed_name_only() {
        let wanted = Wanted {
            kind: SourceKind::Secret,
            name: "db".to_string(),
            keys: None,
        };
        let secret = json!({"kind": "Secret", "metadata": {"name": "db"}, "data": {"password": "aHVudGVyMg=="}});
        let content = Content::from_object(SourceKind::Secret, &secret).unwrap();
        let plain = snapshot_name("db", &content.hash());
        let prover = Prover::new(b"the prefetch tests' key, 32 byte");
        let named = snapshot_of(&wanted, "payments", &secret, Some(&prover)).unwrap();
        assert_eq!(named, prover.snapshot_name("payments", "db", &content));
        assert_ne!(named, plain, "never the unkeyed hash");
        assert!(!named.contains(&content.hash()[..10]));
        assert_ne!(
            snapshot_of(&wanted, "dev", &secret, Some(&prover)).unwrap(),
            named,
            "keyed per namespace"
        );
        assert_eq!(snapshot_of(&wanted, "payments", &secret, None), None);
    }

    /// Finding 2 and 5 of docs/security.md: a name that is not one is not
    /// read ahead, and a template past the source limit reads nothing.
    #[test]
    fn nothing_is_read_ahead_for_names_that_are_not_names_or_past_the_limit() {
        let settings = Settings::default();
        let r = request(
            "Deployment",
            "CREATE",
            json!({"config-snapshot.io/snapshot": "*"}),
            env(&[("A", "a"), ("B", "../kube-system/configmaps/aws-auth"), ("C", "c?x")]),
        );
        assert_eq!(names(&ahead(&r, &settings)), ["a"]);
        let many: Vec<(String, String)> = (0..=references::MAX_SOURCES)
            .map(|i| (format!("V{i}"), format!("cm-{i}")))
            .collect();
        let many: Vec<(&str, &str)> = many.iter().map(|(v, c)| (v.as_str(), c.as_str())).collect();
        let r = request(
            "Deployment",
            "CREATE",
            json!({"config-snapshot.io/snapshot": "*"}),
            env(&many),
        );
        assert!(
            ahead(&r, &settings).is_empty(),
            "past the limit: the policy refuses it unread"
        );
        let r = request(
            "Deployment",
            "CREATE",
            json!({"config-snapshot.io/snapshot": "*"}),
            env(&many[..references::MAX_SOURCES]),
        );
        assert_eq!(ahead(&r, &settings).len(), references::MAX_SOURCES);
    }

    #[test]
    fn nothing_for_requests_the_policy_reads_no_source_for() {
        let settings = Settings::default();
        let plain = request("Deployment", "CREATE", json!({}), env(&[("A", "a")]));
        assert!(ahead(&plain, &settings).is_empty(), "no opt-in");
        let cm = request(
            "ConfigMap",
            "UPDATE",
            json!({"config-snapshot.io/snapshot": "*"}),
            env(&[("A", "a")]),
        );
        assert!(ahead(&cm, &settings).is_empty(), "not a workload");
        let delete = request(
            "Deployment",
            "DELETE",
            json!({"config-snapshot.io/snapshot": "*"}),
            env(&[("A", "a")]),
        );
        assert!(ahead(&delete, &settings).is_empty(), "a delete");
        let bad = request(
            "Deployment",
            "CREATE",
            json!({"config-snapshot.io/snapshot": "nonsense/kind"}),
            env(&[("A", "a")]),
        );
        assert!(ahead(&bad, &settings).is_empty(), "an annotation the policy refuses");
    }

    #[test]
    fn a_template_that_names_snapshots_reads_ahead_only_what_the_policy_will_read() {
        let settings = Settings::default();
        let pinned = request(
            "Deployment",
            "UPDATE",
            json!({"config-snapshot.io/snapshot": "*"}),
            env(&[("A", "a-0123456789"), ("B", "b")]),
        );
        // `a-0123456789` is snapshot-shaped but unmapped: the policy reads it
        // fresh to learn its source, so it is read ahead too.
        assert_eq!(names(&ahead(&pinned, &settings)), ["a-0123456789", "b"]);
        // Mapped in the template's annotation, it stands for `a`, which
        // the policy need not read: nothing ahead but `b`.
        let mut object: Value = serde_json::from_str(pinned.get()).unwrap();
        object["object"]["spec"]["template"]["metadata"] =
            json!({"annotations": {"config-snapshot.io/snapshots": r#"{"configmap/a":"a-0123456789"}"#}});
        let mapped = RawValue::from_string(object.to_string()).unwrap();
        assert_eq!(names(&ahead(&mapped, &settings)), ["b"]);
    }
}
