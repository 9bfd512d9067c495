//! Revoked content at the capability (docs/design.md, "Revocation"): what
//! the namespace's record revokes is never made or reused again, whatever
//! the guest asks, and `snapshot_name` says so.

use super::*;
use config_snapshot_policy::model::revocation::{Revocation, Revocations};

/// The record of `snapshot` of ConfigMap `app`, and the snapshot gone, as
/// `config-snapshot revoke` leaves them.
fn revoke(backend: &Recorder, snapshot: &str) {
    let record = Revocations(vec![Revocation {
        source: SourceId::new(SourceKind::ConfigMap, "app"),
        at: 1_800_000_000,
        by: "alice".into(),
        snapshots: vec![snapshot.to_string()],
    }]);
    backend.put(record.record_object("team-a"));
    if let Some(made) = backend.cluster.get("ConfigMap", "team-a", snapshot).unwrap() {
        let uid = made["metadata"]["uid"].as_str().unwrap_or_default().to_string();
        backend
            .cluster
            .delete(
                "ConfigMap",
                "team-a",
                snapshot,
                &Preconditions {
                    uid,
                    resource_version: None,
                },
            )
            .unwrap();
    }
}

/// The source set back to the revoked content: `snapshot_name` answers
/// the revocation, and `create_snapshot` of it is refused and writes
/// nothing, although the proposal is otherwise the very snapshot the host
/// would make. Other content of the same source is made as ever.
#[test]
fn revoked_content_is_never_made_again() {
    let (backend, cap) = capability(false);
    let proposal = good_snapshot("team-a");
    let name = name_of(&proposal);
    revoke(&backend, &name);
    backend.writes.lock().unwrap().clear();
    let content = Content::from_object(SourceKind::ConfigMap, &json!({"data": {"k": "v"}})).unwrap();
    let answer: Value = serde_json::from_slice(
        &write(
            &cap,
            "snapshot_name",
            json!({"source": {"kind": "ConfigMap", "name": "app"}, "contentHash": content.hash()}),
        )
        .unwrap(),
    )
    .unwrap();
    assert_eq!(
        answer["revoked"],
        json!({"snapshot": name, "at": 1_800_000_000, "by": "alice"}),
        "{answer}"
    );
    let refused = write(&cap, "create_snapshot", json!({"object": proposal}));
    let message = refused.as_ref().map_err(|e| e.message.clone()).unwrap_err();
    assert!(message.contains("configmap/app's content was revoked at"), "{message}");
    assert_refused(refused, &backend, &cap, "revoked content");
    let other = Content::from_object(SourceKind::ConfigMap, &json!({"data": {"k": "v", "other": "o"}})).unwrap();
    let other = proposal_of(&other);
    write(&cap, "create_snapshot", json!({"object": other})).expect("other content is made");
}

fn proposal_of(content: &Content) -> Value {
    proposal(&SourceId::new(SourceKind::ConfigMap, "app"), "team-a", content)
}

/// A record edited into something else forbids what it might: nothing is
/// made until it reads.
#[test]
fn a_broken_record_makes_nothing() {
    let (backend, cap) = capability(false);
    let mut broken = Revocations::default().record_object("team-a");
    broken["metadata"]["annotations"][keys::REVOCATIONS] = json!("not json");
    backend.put(broken);
    backend.writes.lock().unwrap().clear();
    let refused = write(&cap, "create_snapshot", json!({"object": good_snapshot("team-a")}));
    assert_refused(refused, &backend, &cap, "a broken record");
}
