//! The bodies of the host's fuzz targets (host/fuzz, `make fuzz-host`):
//! its boundaries fed arbitrary input. Each must never panic, and must keep
//! the promises of docs/security.md whatever it is given; a broken promise
//! panics, which the fuzzer reports. host/tests/fuzz_bodies.rs runs the same
//! bodies on proptest's inputs, so they build and hold on every CI run.

use config_snapshot_policy::model::object::ObjectExt;
use std::collections::BTreeMap;
use std::sync::Arc;

use config_snapshot_policy::host::operation::Operation;
use config_snapshot_policy::model::content::{snapshot_object, Content};
use config_snapshot_policy::model::keys;
use config_snapshot_policy::model::settings::Settings;
use config_snapshot_policy::model::source::{SourceId, SourceKind};
use serde_json::{json, Value};

use crate::capability::{Caller, Capability};
use crate::cluster::proof::Prover;
use crate::lifecycle::resync::{PassHost, ReadmitError};
use crate::lifecycle::{Driver, Effect, InFlight, Rules};
use crate::replay::simulator::Shared;

/// The namespace the caller is in; the fuzzed call may touch only it.
const CALLER_NS: &str = "team-a";
/// Excluded: nothing there may change.
const EXCLUDED_NS: &str = "kube-system";
const NOW: i64 = 1_900_000_000;

fn prover() -> Arc<Prover> {
    Arc::new(Prover::new(b"the fuzz targets' key, 32 bytes.."))
}

fn rules(prover: Arc<Prover>) -> Rules {
    Rules {
        excluded_namespaces: vec![EXCLUDED_NS.into()],
        ..Rules::new(Settings::default(), prover)
    }
}

/// A snapshot of `value` in `ns` as the host makes it: named for its
/// content, signed, long unused.
fn snapshot(prover: &Prover, ns: &str, value: &str) -> Value {
    let content = Content::from_object(SourceKind::ConfigMap, &json!({"data": {"v": value}})).unwrap_or_else(|_| {
        Content::from_object(SourceKind::ConfigMap, &json!({"data": {}})).expect("empty content is content")
    });
    let name = prover.snapshot_name(ns, "app", &content);
    let mut o = snapshot_object(&SourceId::new(SourceKind::ConfigMap, "app"), ns, &name, "1", &content);
    prover.sign(&mut o);
    o.set_meta("creationTimestamp", json!("2020-01-01T00:00:00Z"));
    o
}

/// Every object of the cluster, by (kind, namespace, name).
fn everything(shared: &Shared) -> BTreeMap<(String, String, String), Value> {
    shared
        .store()
        .all()
        .map(|o| {
            let key = (
                o["kind"].as_str().unwrap_or_default().to_string(),
                o.namespace().unwrap_or_default().to_string(),
                o.name().to_string(),
            );
            (key, o.clone())
        })
        .collect()
}

fn stored(objects: &[Value]) -> Shared {
    Shared::holding(objects, NOW)
}

/// The host capability called with any operation and any payload, by a
/// guest in `team-a`. Promises: no panic; nothing outside `team-a` changes;
/// a forged snapshot (our label, a signature over other content) is
/// neither changed nor deleted; whatever the host created it signed, and
/// no Secret it created is a token.
pub fn capability_call(operation: u8, payload: &[u8]) {
    let prover = prover();
    let mut forged = snapshot(&prover, CALLER_NS, "real");
    forged["data"]["v"] = json!("tampered");
    let forged_name = forged.name().to_string();
    let shared = Arc::new(stored(&[
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": "app", "namespace": CALLER_NS}, "data": {"v": "1"}}),
        json!({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/service-account-token",
               "metadata": {"name": "token", "namespace": CALLER_NS}, "data": {"t": "dA=="}}),
        snapshot(&prover, CALLER_NS, "kept"),
        forged,
        json!({"apiVersion": "apps/v1", "kind": "Deployment",
               "metadata": {"name": "web", "namespace": CALLER_NS},
               "spec": {"template": {"spec": {"containers": [{"name": "c",
                   "envFrom": [{"configMapRef": {"name": "app"}}]}]}}}}),
        json!({"apiVersion": "v1", "kind": "Secret",
               "metadata": {"name": "bootstrap", "namespace": EXCLUDED_NS}, "data": {"t": "dA=="}}),
        snapshot(&prover, EXCLUDED_NS, "old"),
        snapshot(&prover, "team-b", "old"),
    ]));
    let before = everything(&shared);
    let ops = Operation::ALL;
    let op = ops[operation as usize % ops.len()];
    let (binding, namespace) = op.binding();
    let capability = Capability::new(
        shared.clone(),
        Caller {
            uid: "fuzz".into(),
            namespace: CALLER_NS.into(),
            dry_run: operation >= 128,
            subject: Default::default(),
        },
        Arc::new(rules(prover.clone())),
        Arc::default(),
        shared.clone(),
    );
    let _ = capability.answer(binding, namespace, op.name(), payload);
    let after = everything(&shared);
    for (key, object) in &before {
        if key.1 != CALLER_NS {
            assert_eq!(
                after.get(key),
                Some(object),
                "{key:?} outside the caller's namespace changed"
            );
        }
        if key.2 == forged_name {
            let now = after.get(key).expect("a forged snapshot was deleted");
            assert_eq!(now["data"], object["data"], "a forged snapshot changed");
        }
    }
    for (key, object) in after.iter().filter(|(key, _)| !before.contains_key(*key)) {
        assert_eq!(key.1, CALLER_NS, "{key:?} created outside the caller's namespace");
        assert!(prover.ours(object), "{key:?} created unsigned");
        let type_ = object["type"].as_str().unwrap_or("Opaque");
        assert!(!type_.contains("token"), "{key:?} created as a {type_}");
    }
}

/// serve's parsing of a request body (header, screening, read-ahead).
/// Promises: no panic; a body is refused or previewed, and a ConfigMap's or
/// Secret's review is never the policy's to evaluate (serve learns of
/// sources from its watch) nor read ahead for.
pub fn admission_request(body: &[u8]) {
    if let Ok(preview) = crate::serve::answer::admission::preview(body, &Settings::default()) {
        let kind = serde_json::from_slice::<Value>(body)
            .ok()
            .and_then(|v| v["request"]["kind"]["kind"].as_str().map(str::to_string))
            .unwrap_or_default();
        if matches!(kind.as_str(), "ConfigMap" | "Secret") && preview.decision == "policy" {
            panic!("a {kind}'s review would be evaluated");
        }
        if preview.decision != "policy" {
            assert_eq!(preview.read_ahead, 0, "read ahead for a review answered untouched");
        }
    }
}

struct Nothing;

impl PassHost for Nothing {
    fn readmit(&self, _: &str, _: &Value, _: Option<&Value>) -> Result<Option<Value>, ReadmitError> {
        Ok(None)
    }
    fn submit(&self, _: Effect) {}
}

/// One object for [`forged_labels`]: its shape from a few bytes.
fn shaped(prover: &Prover, i: usize, bytes: &[u8]) -> Value {
    let b = |n: usize| bytes.get(n).copied().unwrap_or(0);
    let ns = [CALLER_NS, EXCLUDED_NS, "team-b"][b(0) as usize % 3];
    let mut o = snapshot(prover, ns, &format!("v{}", b(1)));
    match b(2) % 8 {
        0 => {} // genuine
        1 => {
            o["data"]["v"] = json!(format!("tampered{}", b(3)));
        }
        2 => {
            o.set_annotation(
                crate::cluster::proof::SIGNATURE,
                json!(String::from_utf8_lossy(&bytes[3.min(bytes.len())..])),
            );
        }
        3 => {
            o.annotations_mut().map(|a| a.remove(crate::cluster::proof::SIGNATURE));
        }
        4 => {
            o["immutable"] = json!(false);
        }
        5 => {
            o.set_meta("name", json!(format!("app-{i}")));
        }
        6 => {
            o["kind"] = json!("Secret");
            o["type"] = json!("Opaque");
        }
        _ => {
            o = json!({"apiVersion": "v1", "kind": "ConfigMap",
                       "metadata": {"name": format!("plain-{i}"), "namespace": ns,
                                    "labels": {keys::MANAGED_BY: keys::MANAGED_BY_VALUE}},
                       "data": {"k": "v"}});
        }
    }
    if b(4) % 2 == 1 {
        o.set_meta("creationTimestamp", json!("2020-01-01T00:00:00Z"));
    }
    o
}

/// The periodic pass over objects that carry our label, some genuine and
/// most forged (tampered content, made-up or missing signatures, mutable,
/// misnamed, plain). Promises: no panic; nothing in an excluded namespace
/// changes; an object this key did not sign (and that is no pre-key
/// snapshot, which the pass signs) is never deleted and never changed.
pub fn forged_labels(data: &[u8]) {
    let prover = prover();
    let objects: Vec<Value> = data
        .chunks(8)
        .take(24)
        .enumerate()
        .map(|(i, chunk)| shaped(&prover, i, chunk))
        .collect();
    let shared = stored(&objects);
    let before = everything(&shared);
    let rules = rules(prover.clone());
    let in_flight = InFlight::default();
    Driver::new(&shared, &rules, &in_flight, &shared).resync(&Nothing);
    let after = everything(&shared);
    for (key, object) in &before {
        if key.1 == EXCLUDED_NS {
            assert_eq!(after.get(key), Some(object), "{key:?} in an excluded namespace changed");
            continue;
        }
        // Judged apart from `Prover::ours`, which the pass relies on.
        if prover.verify(object).is_ok() {
            continue;
        }
        let now = after
            .get(key)
            .unwrap_or_else(|| panic!("{key:?}, not ours, was deleted"));
        for field in ["data", "immutable"] {
            assert_eq!(now[field], object[field], "{key:?}, not ours, changed");
        }
        assert_eq!(now.labels(), object.labels(), "{key:?}, not ours, changed");
        assert_eq!(now.annotations(), object.annotations(), "{key:?}, not ours, changed");
    }
}
