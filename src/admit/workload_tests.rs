//! Unit tests for workload admission, against the in-memory fake host.

use crate::model::object::ObjectExt;
use serde_json::{json, Value};

use crate::host::fake::FakeHost;
use crate::model::keys;
use crate::model::request::Outcome;

pub fn cm(name: &str, data: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap",
           "metadata": {"name": name, "namespace": "default", "resourceVersion": "7"}, "data": data})
}

pub fn secret(name: &str, data: Value, type_: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Secret", "type": type_,
           "metadata": {"name": name, "namespace": "default", "resourceVersion": "9"}, "data": data})
}

pub fn deployment(annotations: Value, pod_spec: Value) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "default", "uid": "dep-uid", "annotations": annotations},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}}, "spec": pod_spec}
        }
    })
}

pub fn payload(kind: &str, op: &str, object: &Value, old: Option<&Value>, dry_run: bool, settings: Value) -> Vec<u8> {
    let group = crate::model::kinds::find(kind).map_or("apps", |k| k.group());
    serde_json::to_vec(&json!({
        "settings": settings,
        "request": {
            "uid": "req-1", "kind": {"group": group, "version": "v1", "kind": kind},
            "operation": op, "namespace": "default", "name": object["metadata"]["name"],
            "dryRun": dry_run, "object": object, "oldObject": old,
        }
    }))
    .unwrap()
}

pub fn run(host: &FakeHost, payload: &[u8]) -> Outcome {
    crate::evaluate(payload, host)
}

fn create(host: &FakeHost, object: &Value) -> Outcome {
    run(host, &payload("Deployment", "CREATE", object, None, false, json!({})))
}

fn update(host: &FakeHost, old: &Value, new: &Value) -> Outcome {
    run(host, &payload("Deployment", "UPDATE", new, Some(old), false, json!({})))
}

fn snapshot_all() -> Value {
    json!({ keys::SNAPSHOT: "*" })
}

/// The issue's acceptance example: a ConfigMap volume, a Secret envFrom and a
/// projected ConfigMap with items.
fn three_refs() -> Value {
    json!({
        "containers": [{"name": "app", "image": "nginx:1", "envFrom": [{"secretRef": {"name": "creds"}}],
                        "volumeMounts": [{"name": "cfg", "mountPath": "/etc/app"}]}],
        "volumes": [
            {"name": "cfg", "configMap": {"name": "app"}},
            {"name": "proj", "projected": {"sources": [{"configMap": {"name": "extra", "items": [{"key": "a", "path": "a"}]}}]}}
        ]
    })
}

fn three_host() -> FakeHost {
    FakeHost::with(vec![
        cm("app", json!({"mode": "blue"})),
        secret("creds", json!({"password": "aHVudGVyMg=="}), "Opaque"),
        cm("extra", json!({"a": "1", "b": "2"})),
    ])
}

fn names(obj: &Value) -> (String, String, String) {
    let t = &obj["spec"]["template"]["spec"];
    (
        t["volumes"][0]["configMap"]["name"].as_str().unwrap().to_string(),
        t["containers"][0]["envFrom"][0]["secretRef"]["name"]
            .as_str()
            .unwrap()
            .to_string(),
        t["volumes"][1]["projected"]["sources"][0]["configMap"]["name"]
            .as_str()
            .unwrap()
            .to_string(),
    )
}

#[test]
fn snapshots_and_rewrites_every_opted_in_reference() {
    let host = three_host();
    let out = create(&host, &deployment(snapshot_all(), three_refs()));
    assert!(out.accepted, "{out:?}");
    let mutated = out.mutated.expect("mutated");
    let (app, creds, extra) = names(&mutated);
    assert!(app.starts_with("app-") && app.len() == 14, "{app}");
    assert!(creds.starts_with("creds-"), "{creds}");
    assert!(extra.starts_with("extra-"), "{extra}");
    for (kind, name) in [("ConfigMap", &app), ("Secret", &creds), ("ConfigMap", &extra)] {
        let snap = host.find(kind, name).unwrap_or_else(|| panic!("{name} not created"));
        assert_eq!(snap["immutable"], true);
        assert_eq!(snap["metadata"]["labels"][keys::MANAGED_BY], "config-snapshot");
    }
    // The projected source selects key "a" only.
    assert_eq!(host.find("ConfigMap", &extra).unwrap()["data"], json!({"a": "1"}));
    assert_eq!(host.find("Secret", &creds).unwrap()["type"], "Opaque");
    let mapping: Value = serde_json::from_str(
        mutated["spec"]["template"]["metadata"]["annotations"][keys::SNAPSHOTS]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(
        mapping,
        json!({"configmap/app": app, "configmap/extra": extra, "secret/creds": creds})
    );
}

#[test]
fn opt_in_is_per_source_and_exclusions_apply() {
    let host = three_host();
    let ann = json!({ keys::SNAPSHOT: "configmap/app,creds,extra", keys::EXCLUDE: "extra" });
    let mutated = create(&host, &deployment(ann, three_refs())).mutated.unwrap();
    let (app, creds, extra) = names(&mutated);
    assert_ne!(app, "app");
    assert_ne!(creds, "creds");
    assert_eq!(extra, "extra");
    let none = create(&host, &deployment(json!({}), three_refs()));
    assert_eq!(none, Outcome::accept());
}

#[test]
fn unknown_fields_survive_and_a_second_evaluation_changes_nothing() {
    let host = three_host();
    let mut object = deployment(snapshot_all(), three_refs());
    object["spec"]["template"]["spec"]["containers"][0]["futureField"] = json!({"x": [1, 2]});
    object["spec"]["someAlphaField"] = json!("kept");
    object["status"] = json!({"observedGeneration": 3});
    let first = create(&host, &object).mutated.unwrap();
    assert_eq!(
        first["spec"]["template"]["spec"]["containers"][0]["futureField"],
        json!({"x": [1, 2]})
    );
    assert_eq!(first["spec"]["someAlphaField"], "kept");
    assert_eq!(first["status"], object["status"]);
    // Only names and our annotation changed.
    let mut back = crate::model::template::normalise(&first["spec"]["template"]);
    back["metadata"]["labels"] = json!({"app": "web"});
    assert_eq!(back, crate::model::template::normalise(&object["spec"]["template"]));
    // Reinvocation: the same input gives the same output, i.e. no further change.
    let again = create(&host, &first);
    assert!(again.accepted && again.mutated.is_none(), "{again:?}");
}

#[test]
fn update_tells_no_op_roll_forward_and_rollback_apart() {
    let host = three_host();
    let v1 = create(&host, &deployment(snapshot_all(), three_refs()))
        .mutated
        .unwrap();
    let (app_v1, ..) = names(&v1);
    // The Deployment controller's ReplicaSet for revision 1.
    let mut rs1 = json!({"apiVersion": "apps/v1", "kind": "ReplicaSet",
        "metadata": {"name": "web-1", "namespace": "default", "labels": {"app": "web"},
                     "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "web", "uid": "dep-uid"}]},
        "spec": {"template": v1["spec"]["template"].clone()}});
    rs1["spec"]["template"]["metadata"]["labels"]["pod-template-hash"] = json!("abc");
    host.objects.borrow_mut().push(rs1);

    // The ConfigMap changes; no watch.
    host.objects.borrow_mut().retain(|o| o["metadata"]["name"] != "app");
    host.objects.borrow_mut().push(cm("app", json!({"mode": "green"})));

    // A scale is a no-op: the snapshot is kept.
    let mut scaled = v1.clone();
    scaled["spec"]["replicas"] = json!(5);
    let out = update(&host, &v1, &scaled);
    assert!(out.mutated.is_none(), "scale must not change the template: {out:?}");

    // A new image is a roll-forward: fresh snapshot of the edited ConfigMap.
    let mut v2_in = v1.clone();
    v2_in["spec"]["template"]["spec"]["containers"][0]["image"] = json!("nginx:2");
    let v2 = update(&host, &v1, &v2_in).mutated.unwrap();
    let (app_v2, ..) = names(&v2);
    assert_ne!(app_v2, app_v1);
    assert_eq!(
        host.find("ConfigMap", &app_v2).unwrap()["data"],
        json!({"mode": "green"})
    );

    // rollout undo puts back revision 1's template: keep its snapshot.
    let undo_in = {
        let mut d = v2.clone();
        d["spec"]["template"] = v1["spec"]["template"].clone();
        d
    };
    let out = update(&host, &v2, &undo_in);
    let undone = out.mutated.expect("a rollback is recorded on the workload");
    assert_eq!(
        undone["spec"]["template"], undo_in["spec"]["template"],
        "a rollback keeps the old snapshot and the template exactly as the revision had it"
    );
    let record = crate::model::records::Rollback::of(&undone).expect("rollback record");
    assert_eq!(record.generation, 1, "the generation the rollback produces");
    let listed = host.ops("list_resources_by_namespace");
    let last = listed.last().unwrap();
    assert_eq!(last["kind"], "ReplicaSet");
    assert_eq!(last["label_selector"], "app=web");
    assert!(last["field_masks"]
        .as_array()
        .unwrap()
        .contains(&json!("spec.template")));

    // The same template edited by hand back to image 1 but not equal to any
    // revision (a new env var) is a roll-forward.
    let mut edited = undo_in.clone();
    edited["spec"]["template"]["spec"]["containers"][0]["env"] = json!([{"name": "X", "value": "1"}]);
    let out = update(&host, &v2, &edited).mutated.unwrap();
    assert_eq!(names(&out).0, app_v2);
}

#[test]
fn rollback_needs_a_revision_of_this_workload() {
    let host = three_host();
    let v1 = create(&host, &deployment(snapshot_all(), three_refs()))
        .mutated
        .unwrap();
    // A ReplicaSet with the same template but owned by someone else.
    host.objects
        .borrow_mut()
        .push(json!({"apiVersion": "apps/v1", "kind": "ReplicaSet",
        "metadata": {"name": "other", "namespace": "default", "labels": {"app": "web"},
                     "ownerReferences": [{"kind": "Deployment", "name": "other", "uid": "other-uid"}]},
        "spec": {"template": v1["spec"]["template"].clone()}}));
    host.objects.borrow_mut().retain(|o| o["metadata"]["name"] != "app");
    host.objects.borrow_mut().push(cm("app", json!({"mode": "green"})));
    let mut v2 = v1.clone();
    v2["spec"]["template"]["spec"]["containers"][0]["image"] = json!("nginx:2");
    let v2 = update(&host, &v1, &v2).mutated.unwrap();
    let mut back = v2.clone();
    back["spec"]["template"] = v1["spec"]["template"].clone();
    let out = update(&host, &v2, &back);
    let rewritten = out.mutated.expect("not a rollback of this workload: fresh snapshot");
    assert_ne!(names(&rewritten).0, names(&v1).0);
}

#[test]
fn server_side_reapply_with_source_names_keeps_the_live_snapshot() {
    let host = three_host();
    let plain = deployment(snapshot_all(), three_refs());
    let live = create(&host, &plain).mutated.unwrap();
    host.objects.borrow_mut().retain(|o| o["metadata"]["name"] != "app");
    host.objects.borrow_mut().push(cm("app", json!({"mode": "green"})));
    let out = update(&host, &live, &plain).mutated.unwrap();
    assert_eq!(names(&out), names(&live));
}

#[test]
fn optional_and_missing_sources() {
    let spec = json!({"containers": [{"name": "c", "envFrom": [
        {"configMapRef": {"name": "maybe", "optional": true}},
        {"configMapRef": {"name": "later"}}]}]});
    let host = FakeHost::with(vec![]);
    let out = create(&host, &deployment(snapshot_all(), spec.clone()));
    assert!(out.accepted);
    assert_eq!(out.warnings.len(), 1, "{:?}", out.warnings);
    assert!(out.warnings[0].contains("configmap/later") && out.warnings[0].contains("does not exist"));
    assert!(out.mutated.is_none());
    assert_eq!(host.count("ConfigMap"), 0);

    let strict = run(
        &host,
        &payload(
            "Deployment",
            "CREATE",
            &deployment(snapshot_all(), spec),
            None,
            false,
            json!({"onMissingSource": "reject"}),
        ),
    );
    assert!(!strict.accepted);
    assert!(strict.message.unwrap().contains("configmap/later"));
}

#[test]
fn service_account_token_secrets_are_skipped_with_a_warning() {
    let host = FakeHost::with(vec![secret(
        "sa-token",
        json!({"token": "dG9r"}),
        "kubernetes.io/service-account-token",
    )]);
    let spec = json!({"containers": [{"name": "c"}], "volumes": [{"name": "t", "secret": {"secretName": "sa-token"}}]});
    let out = create(&host, &deployment(snapshot_all(), spec));
    assert!(out.accepted && out.mutated.is_none());
    assert!(out.warnings[0].contains("service-account token"));
    assert_eq!(host.count("Secret"), 1);
}

#[test]
fn dry_run_returns_the_same_mutation_without_writes() {
    let wet_host = three_host();
    let wet = create(&wet_host, &deployment(snapshot_all(), three_refs()))
        .mutated
        .unwrap();
    let host = three_host();
    let dry = run(
        &host,
        &payload(
            "Deployment",
            "CREATE",
            &deployment(snapshot_all(), three_refs()),
            None,
            true,
            json!({}),
        ),
    );
    assert_eq!(dry.mutated.unwrap(), wet);
    assert!(host.ops("create_snapshot").is_empty());
    assert_eq!(host.count("ConfigMap"), 2);
}

#[test]
fn a_failed_write_rejects_without_rewriting_anything() {
    let host = three_host();
    host.fail("create_snapshot", "configmaps is forbidden: exceeded quota");
    let out = create(&host, &deployment(snapshot_all(), three_refs()));
    assert!(!out.accepted && out.mutated.is_none());
    assert!(out.message.unwrap().contains("exceeded quota"));
}

#[test]
fn a_failed_write_with_warn_leaves_that_reference() {
    let host = three_host();
    host.fail("create_snapshot", "conflict");
    let out = run(
        &host,
        &payload(
            "Deployment",
            "CREATE",
            &deployment(snapshot_all(), three_refs()),
            None,
            false,
            json!({"onSnapshotFailure": "warn"}),
        ),
    );
    assert!(out.accepted);
    assert_eq!(out.warnings.len(), 3);
    // Nothing was created, so nothing may be referenced.
    assert!(out.mutated.is_none());
}

#[test]
fn without_the_capability_checksum_mode_stamps_hashes_with_one_warning() {
    let mut host = three_host();
    host.stock = true;
    let out = create(&host, &deployment(snapshot_all(), three_refs()));
    assert!(out.accepted);
    assert_eq!(out.warnings.len(), 1, "{:?}", out.warnings);
    assert!(out.warnings[0].contains("rollout undo will not restore"));
    let mutated = out.mutated.unwrap();
    assert_eq!(names(&mutated), ("app".into(), "creds".into(), "extra".into()));
    let ann = &mutated["spec"]["template"]["metadata"]["annotations"];
    let expected = crate::model::content::Content::from_object(
        crate::model::source::SourceKind::ConfigMap,
        &cm("app", json!({"mode": "blue"})),
    )
    .unwrap()
    .hash();
    assert_eq!(ann["config-snapshot.io/checksum-configmap-app"], expected);
    assert!(ann["config-snapshot.io/checksum-secret-creds"].is_string());
    assert!(ann[keys::SNAPSHOTS].is_null());
    // The reads bypass Kubewarden's cache.
    assert!(host.ops("get_resource").iter().all(|r| r["disable_cache"] == true));

    for (mode, accepted) in [("warn", true), ("reject", false)] {
        let out = run(
            &host,
            &payload(
                "Deployment",
                "CREATE",
                &deployment(snapshot_all(), three_refs()),
                None,
                false,
                json!({"withoutSnapshotCapability": mode}),
            ),
        );
        assert_eq!(out.accepted, accepted, "{mode}");
        assert!(out.mutated.is_none());
    }
}

#[test]
fn checksum_keys_are_shortened_past_63() {
    use crate::model::source::{SourceId, SourceKind};
    let short = crate::admit::checksum::checksum_key(&SourceId::new(SourceKind::Secret, "tls"));
    assert_eq!(short, "config-snapshot.io/checksum-secret-tls");
    let long = crate::admit::checksum::checksum_key(&SourceId::new(SourceKind::ConfigMap, "a".repeat(80)));
    let name_part = long.strip_prefix("config-snapshot.io/").unwrap();
    assert!(name_part.len() <= 63, "{}", name_part.len());
    let other =
        crate::admit::checksum::checksum_key(&SourceId::new(SourceKind::ConfigMap, format!("{}b", "a".repeat(79))));
    assert_ne!(long, other);
}

#[test]
fn bad_annotations_are_rejected_naming_annotation_and_token() {
    let host = three_host();
    let out = create(
        &host,
        &deployment(json!({ keys::SNAPSHOT: "configmap/app,pvc/data" }), three_refs()),
    );
    assert!(!out.accepted);
    let msg = out.message.unwrap();
    assert!(msg.contains(keys::SNAPSHOT) && msg.contains("pvc/data"), "{msg}");
}

#[test]
fn key_subsets_ignore_edits_to_other_keys() {
    let spec = json!({"containers": [{"name": "c", "env": [
        {"name": "M", "valueFrom": {"configMapKeyRef": {"name": "app", "key": "mode"}}}]}]});
    let host = FakeHost::with(vec![cm("app", json!({"mode": "blue", "unused": "1"}))]);
    let first = create(&host, &deployment(snapshot_all(), spec.clone()))
        .mutated
        .unwrap();
    host.objects.borrow_mut().retain(|o| o["metadata"]["name"] != "app");
    host.objects
        .borrow_mut()
        .push(cm("app", json!({"mode": "blue", "unused": "2"})));
    let second = create(&host, &deployment(snapshot_all(), spec)).mutated.unwrap();
    assert_eq!(first["spec"]["template"], second["spec"]["template"]);
}

#[test]
fn renew_duration_forces_a_fresh_snapshot_once_due() {
    let mut host = three_host();
    let ann = json!({ keys::SNAPSHOT: "*", keys::RENEW_DURATION: "1h" });
    let v1 = create(&host, &deployment(ann, three_refs())).mutated.unwrap();
    let stamped = v1["spec"]["template"]["metadata"]["annotations"][keys::RENEWED_AT]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(crate::model::duration::parse_rfc3339(&stamped), Some(host.now));
    host.objects.borrow_mut().retain(|o| o["metadata"]["name"] != "app");
    host.objects.borrow_mut().push(cm("app", json!({"mode": "green"})));
    // Not yet due: a no-op update keeps everything.
    host.now += 1800;
    assert!(update(&host, &v1, &v1).mutated.is_none());
    // Due: fresh snapshot and a new renewed-at.
    host.now += 1800;
    let v2 = update(&host, &v1, &v1).mutated.unwrap();
    assert_ne!(names(&v2).0, names(&v1).0);
    assert_ne!(
        v2["spec"]["template"]["metadata"]["annotations"][keys::RENEWED_AT],
        json!(stamped)
    );
}

/// `kubectl replace` (Argo CD's Replace=true) of the unchanged manifest,
/// which never carried `renewed-at`, before the renewal is due: nothing
/// moves. Found on the real control plane (issue "Random histories and
/// faults"): the mark was read from the new template only, so a replace
/// renewed early and rolled the workload out.
#[test]
fn replacing_the_manifest_does_not_renew_early() {
    let mut host = three_host();
    let ann = json!({ keys::SNAPSHOT: "*", keys::RENEW_DURATION: "24h" });
    let manifest = deployment(ann, three_refs());
    let v1 = create(&host, &manifest).mutated.unwrap();
    host.now += 3600;
    let replaced = update(&host, &v1, &manifest).mutated.unwrap();
    assert_eq!(replaced["spec"]["template"], v1["spec"]["template"]);
    // Once due, a replace renews as any other write does.
    host.now += 86_400;
    let due = update(&host, &v1, &manifest).mutated.unwrap();
    assert_ne!(
        due["spec"]["template"]["metadata"]["annotations"][keys::RENEWED_AT],
        v1["spec"]["template"]["metadata"]["annotations"][keys::RENEWED_AT]
    );
}

#[test]
fn secret_data_never_appears_in_messages_or_warnings() {
    const CANARY: &str = "Q0FOQVJZLXMzY3IzdA=="; // base64 of CANARY-s3cr3t
    let host = FakeHost::with(vec![secret("creds", json!({"password": CANARY}), "Opaque")]);
    let spec = json!({"containers": [{"name": "c", "envFrom": [{"secretRef": {"name": "creds"}}, {"configMapRef": {"name": "gone"}}]}]});
    host.fail("create_snapshot", "conflict");
    for settings in [json!({}), json!({"onSnapshotFailure": "warn"})] {
        let out = run(
            &host,
            &payload(
                "Deployment",
                "CREATE",
                &deployment(snapshot_all(), spec.clone()),
                None,
                false,
                settings,
            ),
        );
        let text = format!("{:?} {:?}", out.message, out.warnings);
        assert!(!text.contains(CANARY) && !text.contains("CANARY-s3cr3t"), "{text}");
    }
}

#[test]
fn malformed_requests_are_refused_not_panicked_on() {
    let host = FakeHost::default();
    for bad in [&b"not json"[..], b"{}", b"{\"request\": 5}", b"\xff\xfe"] {
        let out = crate::evaluate(bad, &host);
        assert!(!out.accepted, "{:?}", String::from_utf8_lossy(bad));
        assert!(out.message.unwrap().starts_with("config-snapshot: "));
    }
    let weird = json!({"request": {"kind": {"group": "apps", "kind": "Deployment"}, "operation": "CREATE",
                                   "object": {"metadata": {"annotations": {keys::SNAPSHOT: "*"}}, "spec": "nope"}}});
    let out = crate::evaluate(&serde_json::to_vec(&weird).unwrap(), &host);
    assert!(!out.accepted, "{out:?}");
}

#[test]
fn revisions_adopt_the_snapshots_they_use() {
    let host = three_host();
    let v1 = create(&host, &deployment(snapshot_all(), three_refs()))
        .mutated
        .unwrap();
    let rs = json!({"apiVersion": "apps/v1", "kind": "ReplicaSet",
        "metadata": {"name": "web-abc", "namespace": "default"}, "spec": {"template": v1["spec"]["template"].clone()}});
    let out = run(&host, &payload("ReplicaSet", "CREATE", &rs, None, false, json!({})));
    assert!(out.accepted && out.mutated.is_none());
    let adopt = host.ops("adopt");
    assert_eq!(adopt.len(), 1);
    assert_eq!(
        adopt[0]["owner"],
        json!({"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-abc"})
    );
    assert_eq!(adopt[0]["snapshots"].as_array().unwrap().len(), 3);
    let cr = json!({"apiVersion": "apps/v1", "kind": "ControllerRevision",
        "metadata": {"name": "db-1", "namespace": "default"}, "data": {"spec": {"template": v1["spec"]["template"].clone()}}});
    run(
        &host,
        &payload("ControllerRevision", "CREATE", &cr, None, false, json!({})),
    );
    assert_eq!(host.ops("adopt")[1]["owner"]["kind"], "ControllerRevision");
    // Dry run: no adopt.
    run(&host, &payload("ReplicaSet", "CREATE", &rs, None, true, json!({})));
    assert_eq!(host.ops("adopt").len(), 2);
}

/// `kinds::KINDS` is what the dispatch really does: every handled kind and
/// operation reaches a handler (it calls the host for an opted-in object),
/// and nothing else does.
#[test]
fn handled_table_matches_the_dispatch() {
    let d = deployment(snapshot_all(), three_refs());
    let template = d["spec"]["template"].clone();
    let object_for = |group: &str, kind: &str| -> Value {
        match kind {
            "ConfigMap" | "Secret" => {
                let mut o = cm("app", json!({"mode": "new"}));
                o["kind"] = json!(kind);
                o
            }
            "ReplicaSet" | "Job" => {
                json!({"apiVersion": format!("{group}/v1"), "kind": kind, "metadata": {"name": "rs", "namespace": "default"},
                "spec": {"template": {"metadata": {"annotations": {keys::SNAPSHOTS: "{\"configmap/app\":\"app-0123456789\"}"}},
                         "spec": {"containers": [{"name": "c", "envFrom": [{"configMapRef": {"name": "app-0123456789"}}]}]}}}})
            }
            "ControllerRevision" => {
                json!({"apiVersion": "apps/v1", "kind": kind, "metadata": {"name": "cr", "namespace": "default"},
                "data": {"spec": {"template": {"metadata": {"annotations": {keys::SNAPSHOTS: "{\"configmap/app\":\"app-0123456789\"}"}},
                         "spec": {"containers": [{"name": "c", "envFrom": [{"configMapRef": {"name": "app-0123456789"}}]}]}}}}})
            }
            "Pod" => {
                json!({"apiVersion": "v1", "kind": kind,
                       "metadata": {"name": "pod", "namespace": "default", "annotations": snapshot_all()},
                       "spec": template["spec"].clone()})
            }
            "CronJob" => {
                let mut w = d.clone();
                w["kind"] = json!(kind);
                w["metadata"]["annotations"][keys::WATCH] = json!("*");
                w["spec"] = json!({"schedule": "@hourly", "jobTemplate": {"spec": {"template": template.clone()}}});
                w
            }
            _ => {
                let mut w = d.clone();
                w["kind"] = json!(kind);
                w["metadata"]["annotations"][keys::WATCH] = json!("*");
                w["spec"]["template"] = template.clone();
                w
            }
        }
    };
    let watcher = {
        let mut w = d.clone();
        w["metadata"]["annotations"][keys::WATCH] = json!("*");
        w
    };
    let all_kinds = [
        "Deployment",
        "StatefulSet",
        "DaemonSet",
        "ReplicaSet",
        "ControllerRevision",
        "ConfigMap",
        "Secret",
        "Pod",
        "Job",
        "CronJob",
        "Rollout",
    ];
    for kind in all_kinds {
        for group in ["", "apps", "batch", "argoproj.io"] {
            for op in ["CREATE", "UPDATE", "DELETE", "CONNECT"] {
                let host = three_host();
                host.objects.borrow_mut().push(watcher.clone());
                let object = object_for(group, kind);
                let old = object_for(group, kind);
                let mut p: Value =
                    serde_json::from_slice(&payload(kind, op, &object, Some(&old), false, json!({}))).unwrap();
                p["request"]["kind"]["group"] = json!(group);
                if op == "UPDATE" && (kind == "ConfigMap" || kind == "Secret") {
                    p["request"]["oldObject"]["data"] = json!({"mode": "old"});
                }
                let out = crate::evaluate(&serde_json::to_vec(&p).unwrap(), &host);
                let handled = crate::model::kinds::handles(group, kind, op);
                let called = !host.calls.borrow().is_empty();
                assert_eq!(called, handled, "{group}/{kind} {op}: {out:?}");
            }
        }
    }
}

#[test]
fn dropping_the_opt_in_restores_source_names() {
    let host = three_host();
    let v1 = create(&host, &deployment(snapshot_all(), three_refs()))
        .mutated
        .unwrap();
    let mut opted_out = v1.clone();
    opted_out["metadata"]["annotations"] = json!({});
    let out = update(&host, &v1, &opted_out);
    let restored = out.mutated.expect("references restored");
    assert_eq!(names(&restored), ("app".into(), "creds".into(), "extra".into()));
    assert!(restored["spec"]["template"]["metadata"]["annotations"][keys::SNAPSHOTS].is_null());
}

/// Making a snapshot sweeps its source's older versions: the policy does,
/// inline, unless the host says it sweeps after the admission itself (our
/// hosts do, off the admission's latency). Then the admission lists and
/// deletes nothing.
#[test]
fn the_sweep_after_a_new_snapshot_is_the_hosts_when_it_says_so() {
    let (old, orphan) = snapshot_of_cm("app", json!({"mode": "old"}));
    let web = deployment(json!({ keys::SNAPSHOT: "*" }), env_from_cm("app"));
    for host_sweeps in [false, true] {
        let mut host = FakeHost::with(vec![cm("app", json!({"mode": "blue"})), orphan.clone()]);
        host.sweeps = host_sweeps;
        let out = create(&host, &web);
        assert!(out.accepted, "{:?}", out.message);
        assert_eq!(host.ops("create_snapshot").len(), 1, "a new snapshot");
        let deleted: Vec<Value> = host.ops("delete_snapshot").iter().map(|d| d["name"].clone()).collect();
        if host_sweeps {
            assert!(deleted.is_empty(), "the host sweeps");
            assert!(host.ops("list_resources_by_namespace").is_empty(), "nothing listed");
        } else {
            assert_eq!(deleted, [json!(old)], "the policy swept the old version");
        }
    }
}

/// A snapshot object as the host would have created it for `source`.
fn snapshot_of_cm(source: &str, data: Value) -> (String, Value) {
    let content = crate::model::content::Content::from_object(
        crate::model::source::SourceKind::ConfigMap,
        &json!({"data": data}),
    )
    .unwrap();
    let id = crate::model::source::SourceId::new(crate::model::source::SourceKind::ConfigMap, source);
    let name = FakeHost::keyed_name(source, &content.hash());
    let mut object = crate::model::content::snapshot_object(&id, "default", &name, "7", &content);
    object["metadata"]["uid"] = json!(format!("uid-{name}"));
    object["metadata"]["creationTimestamp"] = json!("2026-01-01T00:00:00Z");
    (name, object)
}

fn env_from_cm(name: &str) -> Value {
    json!({"containers": [{"name": "c", "image": "nginx:1", "envFrom": [{"configMapRef": {"name": name}}]}]})
}

fn mapping_of(object: &Value) -> Value {
    serde_json::from_str(
        object["spec"]["template"]["metadata"]["annotations"][keys::SNAPSHOTS]
            .as_str()
            .unwrap_or("{}"),
    )
    .unwrap()
}

fn revision_of(workload: &Value, name: &str) -> Value {
    let mut template = workload["spec"]["template"].clone();
    template["metadata"]["labels"]["pod-template-hash"] = json!(name);
    json!({"apiVersion": "apps/v1", "kind": "ReplicaSet",
        "metadata": {"name": name, "namespace": "default", "labels": {"app": "web"},
                     "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "web", "uid": "dep-uid"}]},
        "spec": {"template": template}})
}

#[test]
fn an_exported_manifest_without_its_mapping_keeps_its_snapshot_and_regains_the_mapping() {
    let (snap, snap_object) = snapshot_of_cm("app", json!({"mode": "blue"}));
    let host = FakeHost::with(vec![cm("app", json!({"mode": "green"})), snap_object]);
    // `kubectl get -o yaml` of a running Deployment, the mapping stripped.
    let exported = deployment(json!({ keys::WATCH: "configmap/app" }), env_from_cm(&snap));
    let out = create(&host, &exported);
    assert!(out.accepted, "{out:?}");
    let mutated = out.mutated.expect("the mapping is written back");
    assert_eq!(
        mutated["spec"]["template"]["spec"]["containers"][0]["envFrom"][0]["configMapRef"]["name"],
        snap.as_str(),
        "the snapshot is kept, never snapshotted again"
    );
    assert_eq!(mapping_of(&mutated), json!({"configmap/app": snap}));
    assert!(host.ops("create_snapshot").is_empty(), "no snapshot of a snapshot");

    // Re-applied over the live object (which has the mapping), unchanged.
    let out = update(&host, &mutated, &exported);
    let again = out.mutated.expect("the mapping is restored");
    assert_eq!(mapping_of(&again), json!({"configmap/app": snap}));
    assert!(host.ops("create_snapshot").is_empty());

    // A real change still moves config forward, to the source's content.
    let mut image = exported.clone();
    image["spec"]["template"]["spec"]["containers"][0]["image"] = json!("nginx:2");
    let forward = update(&host, &mutated, &image).mutated.unwrap();
    let created = host.ops("create_snapshot");
    assert_eq!(created.len(), 1);
    assert_eq!(created[0]["object"]["data"], json!({"mode": "green"}));
    assert_eq!(
        mapping_of(&forward)["configmap/app"],
        created[0]["object"]["metadata"]["name"]
    );
}

#[test]
fn a_rollback_is_never_renewed_and_starts_a_fresh_renew_period() {
    let t0 = 1_800_000_000;
    let mut host = FakeHost::with(vec![cm("app", json!({"mode": "blue"}))]);
    host.now = t0;
    let annotations = json!({ keys::SNAPSHOT: "configmap/app", keys::RENEW_DURATION: "1h" });
    let v1 = create(&host, &deployment(annotations.clone(), env_from_cm("app")))
        .mutated
        .unwrap();
    host.objects.borrow_mut().push(revision_of(&v1, "web-1"));
    host.objects.borrow_mut().retain(|o| o["metadata"]["name"] != "app");
    host.objects.borrow_mut().push(cm("app", json!({"mode": "green"})));
    let mut v2_in = v1.clone();
    v2_in["spec"]["template"]["spec"]["containers"][0]["image"] = json!("nginx:2");
    let mut v2 = update(&host, &v1, &v2_in).mutated.unwrap();
    v2["metadata"]["generation"] = json!(2);
    host.objects.borrow_mut().push(revision_of(&v2, "web-2"));

    // Two hours later, past the renew period: rollout undo to revision 1.
    host.now = t0 + 7200;
    let mut undo = v2.clone();
    undo["spec"]["template"] = v1["spec"]["template"].clone();
    let out = update(&host, &v2, &undo);
    let undone = out.mutated.expect("recorded");
    assert_eq!(
        undone["spec"]["template"], v1["spec"]["template"],
        "the old config comes back with the old image, not a renewal"
    );
    let record = crate::model::records::Rollback::of(&undone).unwrap();
    assert_eq!((record.generation, record.at), (3, t0 + 7200));

    // The renew period restarts at the rollback: the resync's no-op update
    // half an hour later renews nothing.
    let mut live = undone.clone();
    live["metadata"]["generation"] = json!(3);
    host.now = t0 + 7200 + 1800;
    assert!(update(&host, &live, &live).mutated.is_none());
    // An hour after the rollback it renews.
    host.now = t0 + 7200 + 3600;
    let renewed = update(&host, &live, &live).mutated.expect("renewed");
    assert_ne!(mapping_of(&renewed), mapping_of(&live));
    assert_eq!(
        renewed["spec"]["template"]["metadata"]["annotations"][keys::RENEWED_AT],
        crate::model::duration::format_rfc3339(t0 + 7200 + 3600)
    );
}

#[test]
fn a_watch_rollout_back_to_an_old_revision_is_not_a_rollback() {
    let (snap_a, a) = snapshot_of_cm("app", json!({"mode": "a"}));
    let (snap_b, b) = snapshot_of_cm("app", json!({"mode": "b"}));
    let host = FakeHost::with(vec![cm("app", json!({"mode": "a"})), a, b]);
    let mut v1 = create(&host, &deployment(json!({ keys::WATCH: "app" }), env_from_cm("app")))
        .mutated
        .unwrap();
    assert_eq!(mapping_of(&v1)["configmap/app"], snap_a.as_str());
    v1["metadata"]["generation"] = json!(1);
    host.objects.borrow_mut().push(revision_of(&v1, "web-1"));
    // Moved to b by a watch rollout, then back to a by the next one: the
    // template is revision 1's again, byte for byte.
    let mut on_b = v1.clone();
    on_b["spec"]["template"]["spec"]["containers"][0]["envFrom"][0]["configMapRef"]["name"] = json!(snap_b);
    on_b["spec"]["template"]["metadata"]["annotations"][keys::SNAPSHOTS] =
        json!(json!({"configmap/app": snap_b}).to_string());
    on_b["metadata"]["generation"] = json!(2);
    let record = |generation: i64| crate::model::records::WatchRollout {
        generation,
        at: 1_800_000_000,
        source: crate::model::source::SourceId::new(crate::model::source::SourceKind::ConfigMap, "app"),
        snapshot: snap_a.clone(),
    };
    let mut back_to_a = on_b.clone();
    back_to_a["spec"]["template"] = v1["spec"]["template"].clone();
    back_to_a["metadata"]["annotations"][keys::WATCH_ROLLOUT] = json!(record(3).to_annotation());
    let out = update(&host, &on_b, &back_to_a);
    assert!(out.mutated.is_none(), "the host's own rollout is kept as is: {out:?}");

    // The same template put back by a user (or with a stale record, as
    // `kubectl rollout undo` copies a ReplicaSet's annotations back) is a
    // rollback.
    back_to_a["metadata"]["annotations"][keys::WATCH_ROLLOUT] = json!(record(2).to_annotation());
    let undone = update(&host, &on_b, &back_to_a).mutated.expect("recorded");
    let rollback = crate::model::records::Rollback::of(&undone).unwrap();
    assert_eq!(rollback.generation, 3);
    // It declined the content the source has now ("a": the one it restores).
    assert_eq!(
        rollback.sources.iter().map(|(_, s)| s).collect::<Vec<_>>(),
        vec![&snap_a],
        "{rollback:?}"
    );
}

#[test]
fn a_rollback_records_the_watched_content_it_declined_until_references_move() {
    let host = FakeHost::with(vec![cm("app", json!({"mode": "blue"}))]);
    let mut v1 = create(&host, &deployment(json!({ keys::WATCH: "app" }), env_from_cm("app")))
        .mutated
        .unwrap();
    v1["metadata"]["generation"] = json!(1);
    host.objects.borrow_mut().push(revision_of(&v1, "web-1"));
    host.objects.borrow_mut().retain(|o| o["metadata"]["name"] != "app");
    host.objects.borrow_mut().push(cm("app", json!({"mode": "green"})));
    let mut v2_in = v1.clone();
    v2_in["spec"]["template"]["spec"]["containers"][0]["image"] = json!("nginx:2");
    let mut v2 = update(&host, &v1, &v2_in).mutated.unwrap();
    v2["metadata"]["generation"] = json!(2);
    let mut undo = v2.clone();
    undo["spec"]["template"] = v1["spec"]["template"].clone();
    let undone = update(&host, &v2, &undo).mutated.unwrap();
    let record = crate::model::records::Rollback::of(&undone).unwrap();
    let green = FakeHost::keyed_name(
        "app",
        &crate::model::content::Content::from_object(
            crate::model::source::SourceKind::ConfigMap,
            &json!({"data": {"mode": "green"}}),
        )
        .unwrap()
        .hash(),
    );
    let id = crate::model::source::SourceId::new(crate::model::source::SourceKind::ConfigMap, "app");
    assert_eq!(record.declined(&id), Some(green.as_str()));
    // A scale keeps the record whole; a roll-forward clears what it declined.
    let mut live = undone.clone();
    live["metadata"]["generation"] = json!(3);
    let mut scaled = live.clone();
    scaled["spec"]["replicas"] = json!(9);
    assert!(update(&host, &live, &scaled).mutated.is_none());
    let mut forward = live.clone();
    forward["spec"]["template"]["spec"]["containers"][0]["image"] = json!("nginx:3");
    let moved = update(&host, &live, &forward).mutated.unwrap();
    let after = crate::model::records::Rollback::of(&moved).unwrap();
    assert!(after.sources.is_empty() && after.generation == 3, "{after:?}");
}

/// A rollback declines the live content of every source it pins, watched
/// or not: a source that says `readers: watch` after the undo makes the
/// workload its watcher, and the periodic pass must not roll the rollback
/// forward to what it declined (docs/design.md, "The source decides").
#[test]
fn a_rollback_declines_the_content_of_every_source_it_pins() {
    let host = FakeHost::with(vec![cm("app", json!({"mode": "blue"}))]);
    let mut v1 = create(&host, &deployment(snapshot_all(), env_from_cm("app")))
        .mutated
        .unwrap();
    v1["metadata"]["generation"] = json!(1);
    host.objects.borrow_mut().push(revision_of(&v1, "web-1"));
    host.objects.borrow_mut().retain(|o| o["metadata"]["name"] != "app");
    host.objects.borrow_mut().push(cm("app", json!({"mode": "green"})));
    let mut v2_in = v1.clone();
    v2_in["spec"]["template"]["spec"]["containers"][0]["image"] = json!("nginx:2");
    let mut v2 = update(&host, &v1, &v2_in).mutated.unwrap();
    v2["metadata"]["generation"] = json!(2);
    let mut undo = v2.clone();
    undo["spec"]["template"] = v1["spec"]["template"].clone();
    let undone = update(&host, &v2, &undo).mutated.unwrap();
    let record = crate::model::records::Rollback::of(&undone).unwrap();
    let (green, _) = snapshot_of_cm("app", json!({"mode": "green"}));
    let id = crate::model::source::SourceId::new(crate::model::source::SourceKind::ConfigMap, "app");
    assert_eq!(record.declined(&id), Some(green.as_str()), "{record:?}");
}

/// On stock Kubewarden a checksum is what rolls a workload on its next
/// write after an edit: a source that says `readers: ignore` gets none,
/// unless the workload names it in `watch`; a bad word is said and read
/// as none.
#[test]
fn checksum_mode_stamps_no_checksum_of_a_source_that_says_ignore() {
    let said = |word: &str| {
        let mut app = cm("app", json!({"mode": "blue"}));
        app["metadata"]["annotations"] = json!({ keys::READERS: word });
        let mut host = FakeHost::with(vec![
            app,
            secret("creds", json!({"password": "aHVudGVyMg=="}), "Opaque"),
            cm("extra", json!({"a": "1", "b": "2"})),
        ]);
        host.stock = true;
        host
    };
    let stamps = |out: &Outcome| -> Vec<String> {
        let ann = out.mutated.as_ref().unwrap()["spec"]["template"]["metadata"]["annotations"].clone();
        ann.as_object().unwrap().keys().cloned().collect()
    };
    let ignored = create(&said("ignore"), &deployment(snapshot_all(), three_refs()));
    assert_eq!(
        stamps(&ignored),
        [
            "config-snapshot.io/checksum-configmap-extra",
            "config-snapshot.io/checksum-secret-creds"
        ]
    );
    assert_eq!(ignored.warnings.len(), 1, "{:?}", ignored.warnings);
    let named = create(
        &said("ignore"),
        &deployment(
            json!({ keys::SNAPSHOT: "*", keys::WATCH: "configmap/app" }),
            three_refs(),
        ),
    );
    assert!(stamps(&named).contains(&"config-snapshot.io/checksum-configmap-app".to_string()));
    let bad = create(&said("yes"), &deployment(snapshot_all(), three_refs()));
    assert_eq!(stamps(&bad).len(), 3);
    assert!(
        bad.warnings
            .iter()
            .any(|w| w.contains("config-snapshot.io/readers: bad token \"yes\"")),
        "{:?}",
        bad.warnings
    );
}

#[test]
fn a_created_workload_drops_records_copied_from_another() {
    let host = FakeHost::with(vec![cm("app", json!({"mode": "blue"}))]);
    let annotations = json!({
        keys::WATCH: "app",
        keys::ROLLBACK: r#"{"generation":40,"at":"2026-01-01T00:00:00Z"}"#,
        keys::WATCH_ROLLOUT: r#"{"generation":41,"at":"2026-01-01T00:00:00Z","source":"configmap/app","snapshot":"app-0123456789"}"#,
    });
    let out = create(&host, &deployment(annotations, env_from_cm("app")))
        .mutated
        .unwrap();
    let ann = out.annotations().unwrap();
    assert!(
        !ann.contains_key(keys::ROLLBACK) && !ann.contains_key(keys::WATCH_ROLLOUT),
        "{ann:?}"
    );
}

#[test]
fn a_user_write_cannot_rewind_the_watch_rollout_record() {
    let host = FakeHost::with(vec![cm("app", json!({"mode": "blue"}))]);
    let mut live = create(&host, &deployment(json!({ keys::WATCH: "app" }), env_from_cm("app")))
        .mutated
        .unwrap();
    live["metadata"]["generation"] = json!(7);
    let recent = r#"{"generation":7,"at":"2027-01-15T08:00:00Z","source":"configmap/app","snapshot":"app-0123456789"}"#;
    live["metadata"]["annotations"][keys::WATCH_ROLLOUT] = json!(recent);
    // `kubectl rollout undo` copies a ReplicaSet's older annotations back.
    let mut undo = live.clone();
    undo["metadata"]["annotations"][keys::WATCH_ROLLOUT] =
        json!(r#"{"generation":2,"at":"2026-01-01T00:00:00Z","source":"configmap/app","snapshot":"app-0123456789"}"#);
    undo["spec"]["replicas"] = json!(4);
    let out = update(&host, &live, &undo).mutated.expect("the record is restored");
    assert_eq!(out["metadata"]["annotations"][keys::WATCH_ROLLOUT], recent);
    // Nor can an apply remove it.
    let mut bare = live.clone();
    bare["metadata"]["annotations"]
        .as_object_mut()
        .unwrap()
        .remove(keys::WATCH_ROLLOUT);
    let out = update(&host, &live, &bare).mutated.expect("the record is restored");
    assert_eq!(out["metadata"]["annotations"][keys::WATCH_ROLLOUT], recent);
}

/// An undo to a revision from before the opt-in drops the opt-in and the
/// host's records together (kubectl replaces a Deployment's annotations);
/// the records stay, so an undo back resets neither the storm guard nor the
/// rollback count.
#[test]
fn a_workload_that_stops_opting_in_keeps_the_hosts_records() {
    let host = FakeHost::with(vec![cm("app", json!({"mode": "blue"}))]);
    let mut live = create(&host, &deployment(json!({ keys::WATCH: "app" }), env_from_cm("app")))
        .mutated
        .unwrap();
    let recent = r#"{"generation":7,"at":"2027-01-15T08:00:00Z","source":"configmap/app","snapshot":"app-0123456789"}"#;
    let rollback = r#"{"generation":6,"count":3,"at":"2027-01-15T07:00:00Z"}"#;
    live["metadata"]["annotations"][keys::WATCH_ROLLOUT] = json!(recent);
    live["metadata"]["annotations"][keys::ROLLBACK] = json!(rollback);
    let before_opt_in = deployment(json!({"team": "a"}), env_from_cm("app"));
    let out = update(&host, &live, &before_opt_in)
        .mutated
        .expect("the records are kept");
    assert_eq!(
        out["metadata"]["annotations"],
        json!({"team": "a", keys::WATCH_ROLLOUT: recent, keys::ROLLBACK: rollback})
    );
    assert_eq!(out["spec"], before_opt_in["spec"], "nothing else is touched");
    // With no annotations at all, as an undo to a bare revision may send them.
    let mut bare = before_opt_in.clone();
    bare["metadata"]["annotations"] = Value::Null;
    let out = update(&host, &live, &bare).mutated.expect("the records are kept");
    assert_eq!(out["metadata"]["annotations"][keys::WATCH_ROLLOUT], recent);
    assert_eq!(out["metadata"]["annotations"][keys::ROLLBACK], rollback);
    // A workload that never had them passes through untouched.
    let never = deployment(json!({}), env_from_cm("app"));
    assert!(update(&host, &never, &before_opt_in).mutated.is_none());
    assert!(update(&host, &out, &out).mutated.is_none());
}

#[test]
fn a_host_that_batches_gets_every_snapshot_in_one_call_and_the_same_result() {
    let one_by_one = three_host();
    let mut batching = three_host();
    batching.batches = true;
    let object = deployment(snapshot_all(), three_refs());
    let (a, b) = (create(&one_by_one, &object), create(&batching, &object));
    assert!(a.accepted && b.accepted);
    assert_eq!(a.mutated, b.mutated);
    assert_eq!(batching.ops("create_snapshots").len(), 1);
    assert_eq!(batching.ops("create_snapshot").len(), 3);
    // The host that does not batch was asked once, said so, and got one
    // call per snapshot.
    assert_eq!(one_by_one.ops("create_snapshots").len(), 1);
    assert_eq!(one_by_one.ops("create_snapshot").len(), 3);
    assert_eq!(batching.count("ConfigMap"), one_by_one.count("ConfigMap"));
}

#[test]
fn a_batched_failure_is_judged_per_snapshot_as_a_single_one_is() {
    for setting in ["warn", "reject"] {
        let mut host = three_host();
        host.batches = true;
        host.fail("create_snapshot", "conflict");
        let out = run(
            &host,
            &payload(
                "Deployment",
                "CREATE",
                &deployment(snapshot_all(), three_refs()),
                None,
                false,
                json!({"onSnapshotFailure": setting}),
            ),
        );
        assert_eq!(host.ops("create_snapshots").len(), 1);
        if setting == "warn" {
            assert!(out.accepted);
            assert_eq!(out.warnings.len(), 3, "{:?}", out.warnings);
            assert!(out.mutated.is_none(), "a reference to a snapshot that was not made");
        } else {
            assert!(!out.accepted);
        }
    }
}

/// A CronJob is a workload whose template sits in its job template: its
/// sources are snapshotted on create, and a Job made from it (by the
/// cronjob controller, or `kubectl create job --from`) adopts them.
#[test]
fn a_cronjob_pins_its_job_template_and_its_jobs_adopt_the_snapshots() {
    let host = three_host();
    let deploy = deployment(snapshot_all(), three_refs());
    let cronjob = json!({"apiVersion": "batch/v1", "kind": "CronJob",
        "metadata": {"name": "nightly", "namespace": "default", "annotations": snapshot_all()},
        "spec": {"schedule": "@daily", "jobTemplate": {"spec": {"template": deploy["spec"]["template"].clone()}}}});
    let out = run(&host, &payload("CronJob", "CREATE", &cronjob, None, false, json!({})));
    assert!(out.accepted, "{out:?}");
    let pinned = out.mutated.expect("the job template is rewritten");
    let template = &pinned["spec"]["jobTemplate"]["spec"]["template"];
    let (cfg, creds, extra) = names(&json!({"spec": {"template": template}}));
    assert!(cfg.starts_with("app-") && creds.starts_with("creds-") && extra.starts_with("extra-"));
    assert!(
        pinned["spec"]["template"].is_null(),
        "nothing written outside the job template"
    );
    for name in [&cfg, &creds, &extra] {
        assert!(
            host.objects
                .borrow()
                .iter()
                .any(|o| o["metadata"]["name"] == name.as_str()),
            "snapshot {name} made before the reference"
        );
    }

    // A Job of it carries the template with the Job controller's labels.
    let mut job_template = template.clone();
    job_template["metadata"]["labels"]["batch.kubernetes.io/job-name"] = json!("nightly-29000000");
    let job = json!({"apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "nightly-29000000", "namespace": "default",
                     "ownerReferences": [{"apiVersion": "batch/v1", "kind": "CronJob", "name": "nightly", "uid": "cj-uid", "controller": true}]},
        "spec": {"template": job_template}});
    let out = run(&host, &payload("Job", "CREATE", &job, None, false, json!({})));
    assert!(out.accepted && out.mutated.is_none(), "{out:?}");
    let adopt = host.ops("adopt");
    assert_eq!(adopt.len(), 1);
    assert_eq!(
        adopt[0]["owner"],
        json!({"apiVersion": "batch/v1", "kind": "Job", "name": "nightly-29000000"})
    );
    assert_eq!(adopt[0]["snapshots"].as_array().unwrap().len(), 3);

    // An edit of the CronJob that leaves its template alone changes nothing.
    let mut suspended = pinned.clone();
    suspended["spec"]["suspend"] = json!(true);
    let out = run(
        &host,
        &payload("CronJob", "UPDATE", &suspended, Some(&pinned), false, json!({})),
    );
    assert!(out.accepted, "{out:?}");
    assert!(out.mutated.is_none_or(|m| m == suspended), "no rewrite on a suspend");
}

/// On a host without our capability a bare Job cannot be pinned, and a
/// checksum on it would change nothing (it never rolls out): it is left as
/// it is, and the answer says why.
#[test]
fn without_the_capability_a_bare_job_is_left_as_it_is() {
    let mut host = three_host();
    host.stock = true;
    let deploy = deployment(json!({ keys::SNAPSHOT: "*" }), three_refs());
    let job = json!({"apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "migrate", "namespace": "default", "annotations": deploy["metadata"]["annotations"].clone()},
        "spec": {"template": deploy["spec"]["template"].clone()}});
    let out = run(&host, &payload("Job", "CREATE", &job, None, false, json!({})));
    assert!(out.accepted && out.mutated.is_none(), "{out:?}");
    assert_eq!(out.warnings.len(), 1, "{:?}", out.warnings);
    assert!(
        out.warnings[0].contains("a Job made directly reads its sources"),
        "{:?}",
        out.warnings
    );
}

/// A Job a user makes, opted in, has its sources snapshotted at CREATE and
/// owns them (it adopts them, as a revision does); watch cannot apply, and
/// says so. One a controller makes is its revision: nothing is snapshotted.
#[test]
fn a_bare_job_pins_its_config_and_owns_it() {
    let host = three_host();
    let deploy = deployment(
        json!({ keys::SNAPSHOT: "*", keys::WATCH: "configmap/app" }),
        three_refs(),
    );
    let job = json!({"apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "migrate", "namespace": "default", "annotations": deploy["metadata"]["annotations"].clone()},
        "spec": {"template": deploy["spec"]["template"].clone()}});
    let out = run(&host, &payload("Job", "CREATE", &job, None, false, json!({})));
    assert!(out.accepted, "{out:?}");
    let pinned = out.mutated.clone().expect("the template is rewritten");
    let (cfg, creds, extra) = names(&pinned);
    assert!(cfg.starts_with("app-") && creds.starts_with("creds-") && extra.starts_with("extra-"));
    let adopt = host.ops("adopt");
    assert_eq!(adopt.len(), 1, "the Job owns what it names");
    assert_eq!(
        adopt[0]["owner"],
        json!({"apiVersion": "batch/v1", "kind": "Job", "name": "migrate"})
    );
    assert_eq!(adopt[0]["snapshots"].as_array().unwrap().len(), 3);
    assert!(
        out.warnings.iter().any(|w| w.contains("cannot be watched")),
        "{:?}",
        out.warnings
    );

    // Dry run: the same rewrite, no adoption.
    let dry = run(&host, &payload("Job", "CREATE", &job, None, true, json!({})));
    assert_eq!(dry.mutated, out.mutated);
    assert_eq!(host.ops("adopt").len(), 1);

    // Not opted in: untouched.
    let mut plain = job.clone();
    plain["metadata"]["annotations"] = json!({});
    let out = run(&host, &payload("Job", "CREATE", &plain, None, false, json!({})));
    assert!(out.accepted && out.mutated.is_none(), "{out:?}");

    // Made by a controller (opted in or not), a Job is its revision: it
    // adopts what its template names and snapshots nothing.
    let mut owned = job.clone();
    owned["metadata"]["ownerReferences"] =
        json!([{"apiVersion": "batch/v1", "kind": "CronJob", "name": "c", "uid": "u", "controller": true}]);
    let calls = host.calls.borrow().len();
    let out = run(&host, &payload("Job", "CREATE", &owned, None, false, json!({})));
    assert!(out.accepted && out.mutated.is_none(), "{out:?}");
    assert_eq!(
        host.calls.borrow().len(),
        calls,
        "no host call for a template naming no snapshot"
    );
}

/// A Pod made directly and opted in is pinned at CREATE and owns its
/// snapshots; a controller's Pod (its ReplicaSet owns the config) is left
/// alone, even though it carries the template's mapping.
#[test]
fn a_bare_pod_pins_its_config_and_a_controllers_pod_is_left_alone() {
    let host = three_host();
    let template = deployment(snapshot_all(), three_refs())["spec"]["template"].clone();
    let pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "debug", "namespace": "default", "annotations": snapshot_all()},
        "spec": template["spec"].clone()});
    let out = run(&host, &payload("Pod", "CREATE", &pod, None, false, json!({})));
    assert!(out.accepted && out.warnings.is_empty(), "{out:?}");
    let pinned = out.mutated.expect("the Pod is rewritten");
    let name = pinned["spec"]["volumes"][0]["configMap"]["name"].as_str().unwrap();
    assert!(name.starts_with("app-"), "{pinned}");
    assert!(
        pinned["metadata"]["annotations"][keys::SNAPSHOTS].is_string(),
        "the mapping sits in the Pod's own metadata"
    );
    let adopt = host.ops("adopt");
    assert_eq!(adopt.len(), 1);
    assert_eq!(
        adopt[0]["owner"],
        json!({"apiVersion": "v1", "kind": "Pod", "name": "debug"})
    );

    // A ReplicaSet's Pod: the mapping came with the template; nothing to do.
    let mut owned = pinned.clone();
    owned["metadata"]["name"] = json!("web-abc-xyz");
    owned["metadata"]["ownerReferences"] =
        json!([{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-abc", "uid": "u", "controller": true}]);
    let calls = host.calls.borrow().len();
    let out = run(&host, &payload("Pod", "CREATE", &owned, None, false, json!({})));
    assert!(out.accepted && out.mutated.is_none(), "{out:?}");
    assert_eq!(host.calls.borrow().len(), calls, "no host call for a controller's Pod");

    // A copy of a pinned Pod, made directly: it owns what it names.
    let mut copy = pinned.clone();
    copy["metadata"]["name"] = json!("debug-2");
    let out = run(&host, &payload("Pod", "CREATE", &copy, None, false, json!({})));
    assert!(out.accepted && out.mutated.is_none(), "{out:?}");
    assert_eq!(host.ops("adopt").len(), 2);
}

/// Finding 5 of docs/security.md: a template naming more distinct
/// ConfigMaps and Secrets than the limit is refused (or, with
/// `onSnapshotFailure: warn`, admitted unchanged) before anything is read;
/// one at the limit is planned as usual.
#[test]
fn a_template_past_the_source_limit_is_refused_before_any_read() {
    let many = |n: usize| {
        let env: Vec<Value> = (0..n)
            .map(|i| json!({"name": format!("V{i}"), "valueFrom": {"configMapKeyRef": {"name": format!("cm-{i}"), "key": "k"}}}))
            .collect();
        deployment(
            json!({keys::SNAPSHOT: "*"}),
            json!({"containers": [{"name": "c", "env": env}]}),
        )
    };
    let limit = crate::model::references::MAX_SOURCES;
    let host = FakeHost::with((0..=limit).map(|i| cm(&format!("cm-{i}"), json!({"k": "v"}))).collect());
    let out = run(
        &host,
        &payload("Deployment", "CREATE", &many(limit + 1), None, false, json!({})),
    );
    assert!(!out.accepted, "{out:?}");
    assert!(
        out.message
            .as_deref()
            .unwrap_or_default()
            .contains(&format!("takes at most {limit} per workload")),
        "{out:?}"
    );
    assert!(host.ops("get_resource").is_empty(), "nothing read for it");
    let warned = run(
        &host,
        &payload(
            "Deployment",
            "CREATE",
            &many(limit + 1),
            None,
            false,
            json!({"onSnapshotFailure": "warn"}),
        ),
    );
    assert!(warned.accepted && warned.mutated.is_none(), "{warned:?}");
    assert!(warned.warnings[0].contains("admitted without snapshots"), "{warned:?}");
    assert!(host.ops("get_resource").is_empty());
    let at_limit = run(
        &host,
        &payload("Deployment", "CREATE", &many(limit), None, false, json!({})),
    );
    assert!(at_limit.accepted && at_limit.mutated.is_some(), "{at_limit:?}");
}

/// What a host reads ahead (`plan::reads_ahead`) is what the policy reads
/// fresh for a CREATE: every source it snapshots, and nothing it does not
/// (an excluded source, an optional one that is not there still costs its
/// read, as the planner makes it).
#[test]
fn reads_ahead_are_the_fresh_reads_of_a_create() {
    let host = three_host();
    let annotations = json!({ keys::SNAPSHOT: "*", keys::EXCLUDE: "configmap/extra" });
    let mut pod = three_refs();
    pod["containers"][0]["envFrom"]
        .as_array_mut()
        .unwrap()
        .push(json!({"configMapRef": {"name": "ghost", "optional": true}}));
    let object = deployment(annotations.clone(), pod);
    let out = create(&host, &object);
    assert!(out.accepted, "{out:?}");
    let read: std::collections::BTreeSet<(String, String)> = host
        .ops("get_resource")
        .iter()
        .filter(|r| r["disable_cache"] == true && matches!(r["kind"].as_str(), Some("ConfigMap" | "Secret")))
        .map(|r| (r["kind"].as_str().unwrap().into(), r["name"].as_str().unwrap().into()))
        .collect();
    let settings = crate::model::settings::Settings::default();
    let optin = crate::model::optin::OptIn::from_annotations(annotations.as_object(), &settings).unwrap();
    let ahead: std::collections::BTreeSet<(String, String)> =
        crate::plan::reads_ahead(&object["spec"]["template"], &optin, &settings)
            .into_iter()
            .map(|g| (g.id.kind.kind().to_string(), g.id.name))
            .collect();
    assert_eq!(read, ahead);
    assert!(
        ahead.contains(&("ConfigMap".into(), "ghost".into())) && !ahead.contains(&("ConfigMap".into(), "extra".into()))
    );
}
