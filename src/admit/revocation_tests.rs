//! Revocation at admission (docs/design.md, "Revocation"), against the
//! in-memory fake host: what `config-snapshot revoke` deleted is never
//! named again, by a rollback or by any write, and revoked content is never
//! snapshotted again.

use serde_json::{json, Value};

use crate::admit::workload::tests::{deployment, payload, run, secret};
use crate::host::fake::FakeHost;
use crate::host::host_error::{Code, HostError};
use crate::model::keys;
use crate::model::object::ObjectExt;
use crate::model::request::Outcome;
use crate::model::revocation::{Revocation, Revocations, RECORD};
use crate::model::source::{SourceId, SourceKind};

const LEAKED: &str = "bGVha2Vk";
const ROTATED: &str = "cm90YXRlZA==";

fn env_from_secret() -> Value {
    json!({"containers": [{"name": "c", "image": "api:1", "envFrom": [{"secretRef": {"name": "db"}}]}]})
}

fn secret_ref(workload: &Value) -> String {
    workload["spec"]["template"]["spec"]["containers"][0]["envFrom"][0]["secretRef"]["name"]
        .as_str()
        .unwrap()
        .to_string()
}

fn update(host: &FakeHost, old: &Value, new: &Value) -> Outcome {
    run(host, &payload("Deployment", "UPDATE", new, Some(old), false, json!({})))
}

fn set_secret(host: &FakeHost, value: &str) {
    host.objects
        .borrow_mut()
        .retain(|o| !(o["kind"] == "Secret" && o.name() == "db"));
    host.objects
        .borrow_mut()
        .push(secret("db", json!({"password": value}), "Opaque"));
}

/// The revision the Deployment controller makes of `workload`'s template.
fn revision_of(workload: &Value, name: &str) -> Value {
    let mut template = workload["spec"]["template"].clone();
    template["metadata"]["labels"]["pod-template-hash"] = json!(name);
    json!({"apiVersion": "apps/v1", "kind": "ReplicaSet",
        "metadata": {"name": name, "namespace": "default", "labels": {"app": "web"},
                     "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "web", "uid": "dep-uid"}]},
        "spec": {"template": template}})
}

/// A Deployment pinned to the leaked Secret (revision 1), then rolled
/// forward to the rotated one (revision 2): the host, v1, v2.
fn rotated() -> (FakeHost, Value, Value) {
    rotated_with(json!({ keys::SNAPSHOT: "secret/db" }))
}

fn rotated_with(annotations: Value) -> (FakeHost, Value, Value) {
    let host = FakeHost::with(vec![secret("db", json!({"password": LEAKED}), "Opaque")]);
    let created = deployment(annotations, env_from_secret());
    let v1 = run(
        &host,
        &payload("Deployment", "CREATE", &created, None, false, json!({})),
    )
    .mutated
    .unwrap();
    host.objects.borrow_mut().push(revision_of(&v1, "web-1"));
    set_secret(&host, ROTATED);
    let mut next = v1.clone();
    next["spec"]["template"]["spec"]["containers"][0]["image"] = json!("api:2");
    let v2 = update(&host, &v1, &next).mutated.unwrap();
    host.objects.borrow_mut().push(revision_of(&v2, "web-2"));
    assert_ne!(secret_ref(&v1), secret_ref(&v2));
    (host, v1, v2)
}

/// What `revoke` leaves: the record naming `snapshot`, and the snapshot
/// deleted.
fn revoke(host: &FakeHost, snapshot: &str) {
    let record = Revocations(vec![Revocation {
        source: SourceId::new(SourceKind::Secret, "db"),
        at: 1_800_000_000,
        by: "alice@example.com".into(),
        snapshots: vec![snapshot.to_string()],
    }]);
    host.objects.borrow_mut().push(record.record_object("default"));
    host.objects.borrow_mut().retain(|o| o.name() != snapshot);
}

/// `kubectl rollout undo` to revision 1 puts its template back.
fn undo(v1: &Value, v2: &Value) -> Value {
    let mut undo = v2.clone();
    undo["spec"]["template"] = v1["spec"]["template"].clone();
    undo
}

/// A rollback to a revision naming a revoked snapshot is refused, and the
/// message names the revocation: without it the answer would name a
/// snapshot that is gone, and the pods fail (CreateContainerConfigError).
#[test]
fn a_rollback_to_a_revoked_snapshot_is_refused_naming_the_revocation() {
    let (host, v1, v2) = rotated();
    let leaked = secret_ref(&v1);
    revoke(&host, &leaked);
    let out = update(&host, &v2, &undo(&v1, &v2));
    assert!(!out.accepted, "{out:?}");
    let message = out.message.unwrap_or_default();
    assert!(
        message.contains(&format!("snapshot {leaked} of secret/db was revoked at"))
            && message.contains("by alice@example.com")
            && message.contains("roll forward instead"),
        "{message}"
    );
    assert!(!message.contains(LEAKED) && !message.contains(ROTATED), "{message}");
}

/// The record deleted (an editor may): the snapshot is gone all the same,
/// and a rollback that would name it is refused, as any write that would
/// name a snapshot that does not exist. With the snapshot there, the same
/// rollback is admitted and kept exactly.
#[test]
fn a_rollback_to_a_snapshot_that_no_longer_exists_is_refused() {
    let (host, v1, v2) = rotated();
    let out = update(&host, &v2, &undo(&v1, &v2));
    assert!(out.accepted, "{out:?}");
    assert_eq!(secret_ref(&out.mutated.unwrap()), secret_ref(&v1), "kept exactly");
    let leaked = secret_ref(&v1);
    host.objects.borrow_mut().retain(|o| o.name() != leaked);
    let out = update(&host, &v2, &undo(&v1, &v2));
    assert!(!out.accepted, "{out:?}");
    let message = out.message.unwrap_or_default();
    assert!(
        message.contains(&format!("snapshot {leaked} of secret/db no longer exists")),
        "{message}"
    );
    // A created workload naming it (an exported manifest applied again) too.
    let exported = deployment(
        json!({ keys::SNAPSHOT: "secret/db" }),
        v1["spec"]["template"]["spec"].clone(),
    );
    let mut exported = exported;
    exported["spec"]["template"]["metadata"] = v1["spec"]["template"]["metadata"].clone();
    let out = run(
        &host,
        &payload("Deployment", "CREATE", &exported, None, false, json!({})),
    );
    assert!(!out.accepted, "{out:?}");
}

/// What the live object names already costs nothing: a scale of a
/// workload reads neither the record nor its snapshots.
#[test]
fn a_write_that_keeps_what_the_live_object_names_reads_nothing_more() {
    let (host, _, v2) = rotated();
    host.calls.borrow_mut().clear();
    let mut scaled = v2.clone();
    scaled["spec"]["replicas"] = json!(5);
    let out = update(&host, &v2, &scaled);
    assert!(out.accepted && out.mutated.is_none(), "{out:?}");
    assert!(host.ops("get_resource").is_empty(), "{:?}", host.ops("get_resource"));
}

/// A Secret set back to the leaked value (a GitOps re-sync of an old
/// commit, a stale vault version) gets the revoked name again: the write
/// that would snapshot it is refused, and nothing is created. Leaving the
/// reference to the source instead would have the pods read it from there.
#[test]
fn revoked_content_is_never_snapshotted_again() {
    let (host, v1, v2) = rotated();
    let leaked = secret_ref(&v1);
    revoke(&host, &leaked);
    set_secret(&host, LEAKED);
    host.calls.borrow_mut().clear();
    let mut next = v2.clone();
    next["spec"]["template"]["spec"]["containers"][0]["image"] = json!("api:3");
    for settings in [json!({}), json!({"onSnapshotFailure": "warn"})] {
        let out = run(
            &host,
            &payload("Deployment", "UPDATE", &next, Some(&v2), false, settings),
        );
        assert!(!out.accepted, "{out:?}");
        let message = out.message.unwrap_or_default();
        assert!(
            message.contains("secret/db holds content revoked at") && message.contains(&leaked),
            "{message}"
        );
    }
    assert!(host.ops("create_snapshot").is_empty(), "nothing made again");
    assert!(host.find("Secret", &leaked).is_none());
}

/// A record that cannot be read is not taken as none: a write that would
/// name a snapshot the live object does not is refused until it can be.
#[test]
fn a_record_that_cannot_be_read_forbids_what_it_might() {
    let (host, v1, v2) = rotated();
    host.fail_with("get_resource", HostError::new(Code::Unavailable, "etcd is away"));
    let out = update(&host, &v2, &undo(&v1, &v2));
    assert!(!out.accepted, "{out:?}");
    assert!(
        out.message
            .as_deref()
            .unwrap_or_default()
            .contains(&format!("could not read configmap/{RECORD}")),
        "{out:?}"
    );
    host.failures.borrow_mut().clear();
    let mut broken = Revocations::default().record_object("default");
    broken["metadata"]["annotations"][keys::REVOCATIONS] = json!("[{\"source\": \"secret/db\"}]");
    host.objects.borrow_mut().push(broken);
    let out = update(&host, &v2, &undo(&v1, &v2));
    assert!(!out.accepted, "{out:?}");
    assert!(
        out.message
            .as_deref()
            .unwrap_or_default()
            .contains("an entry has no valid time"),
        "{out:?}"
    );
}

/// A watched Secret set back to the leaked value rolls no watcher to it:
/// each is told, in a warning on the re-admission (serve's log), and stays
/// on what it runs.
#[test]
fn a_watch_never_rolls_to_revoked_content() {
    let (host, v1, mut v2) = rotated_with(json!({ keys::WATCH: "secret/db" }));
    let leaked = secret_ref(&v1);
    v2["metadata"]["resourceVersion"] = json!("41");
    host.objects.borrow_mut().push(v2);
    revoke(&host, &leaked);
    let old = secret("db", json!({"password": ROTATED}), "Opaque");
    let new = secret("db", json!({"password": LEAKED}), "Opaque");
    host.calls.borrow_mut().clear();
    let out = run(&host, &payload("Secret", "UPDATE", &new, Some(&old), false, json!({})));
    assert!(out.accepted, "a source write is never refused: {out:?}");
    assert!(host.ops("patch_workload").is_empty(), "rolled to revoked content");
    assert!(
        out.warnings.iter().any(|w| w.contains(
            "Deployment web not rolled out: secret/db holds content revoked at 2027-01-15T08:00:00Z by alice@example.com"
        )),
        "{:?}",
        out.warnings
    );
    // Another content rolls as ever.
    let other = secret("db", json!({"password": "b3RoZXI="}), "Opaque");
    run(
        &host,
        &payload("Secret", "UPDATE", &other, Some(&old), false, json!({})),
    );
    assert_eq!(host.ops("patch_workload").len(), 1);
}
