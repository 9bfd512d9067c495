//! Unit tests for source admission (watch), against the in-memory fake host.
use serde_json::{json, Value};

use crate::admit::workload::tests::{cm, deployment, payload, run};
use crate::host::fake::FakeHost;
use crate::host::host_error::{Code, HostError};
use crate::model::keys;

/// A cluster with a watcher of `app`, created through the policy so its
/// template already names a snapshot.
fn cluster(watch: &str, spec: Value) -> (FakeHost, Value) {
    let host = FakeHost::with(vec![
        cm("app", json!({"mode": "blue", "other": "x"})),
        cm("unrelated", json!({"a": "1"})),
    ]);
    let mut d = deployment(json!({ keys::WATCH: watch }), spec);
    d = run(&host, &payload("Deployment", "CREATE", &d, None, false, json!({})))
        .mutated
        .unwrap_or(d);
    d["metadata"]["resourceVersion"] = json!("41");
    host.objects.borrow_mut().push(d.clone());
    host.calls.borrow_mut().clear();
    (host, d)
}

fn env_from(name: &str) -> Value {
    json!({"containers": [{"name": "c", "envFrom": [{"configMapRef": {"name": name}}]}]})
}

fn edit(host: &FakeHost, data: Value, dry_run: bool) -> crate::model::request::Outcome {
    let old = cm("app", json!({"mode": "blue", "other": "x"}));
    let mut new = cm("app", data);
    new["metadata"]["resourceVersion"] = json!("8");
    run(
        host,
        &payload("ConfigMap", "UPDATE", &new, Some(&old), dry_run, json!({})),
    )
}

/// A source's review carries content the API server has not stored (and a
/// forged one, content it never will): no snapshot is made of it. Each
/// watcher gets a deferred patch naming the snapshot the host makes once
/// the content is stored, and the keys it holds.
#[test]
fn a_content_change_rolls_out_every_watcher_through_a_deferred_patch() {
    let (host, _) = cluster("app", env_from("app"));
    let out = edit(&host, json!({"mode": "green", "other": "x"}), false);
    assert!(
        out.accepted && out.mutated.is_none() && out.warnings.is_empty(),
        "{out:?}"
    );
    assert!(
        host.ops("create_snapshot").is_empty(),
        "no snapshot of unstored content"
    );
    let green = crate::model::content::Content::from_object(
        crate::model::source::SourceKind::ConfigMap,
        &json!({"data": {"mode": "green", "other": "x"}}),
    )
    .unwrap();
    let snap = FakeHost::keyed_name("app", &green.hash());
    let patches = host.ops("patch_workload");
    assert_eq!(patches.len(), 1);
    let p = &patches[0];
    assert_eq!(p["kind"], "Deployment");
    assert_eq!(p["name"], "web");
    assert_eq!(p["resourceVersion"], "41");
    assert_eq!(p["snapshot"], snap.as_str());
    assert_eq!(
        p["patch"][0],
        json!({"op": "replace", "path": "/spec/template/spec/containers/0/envFrom/0/configMapRef/name", "value": snap})
    );
    // The mapping annotation is rewritten to name the new snapshot.
    let last = p["patch"].as_array().unwrap().last().unwrap();
    assert_eq!(
        last["path"],
        "/spec/template/metadata/annotations/config-snapshot.io~1snapshots"
    );
    assert_eq!(last["value"], json!({"configmap/app": snap}).to_string());
    assert_eq!(p["source"]["name"], "app");
    assert_eq!(p["source"]["contentHash"], green.hash());
    assert_eq!(p["keys"], Value::Null, "the whole source");
    // Only the workloads that reference the source were asked for,
    // with field masks; nothing listed the namespace.
    let list = &host.ops("list_referencing")[0];
    assert_eq!(
        (&list["source_kind"], &list["source_name"]),
        (&json!("ConfigMap"), &json!("app"))
    );
    assert!(list["field_masks"]
        .as_array()
        .unwrap()
        .contains(&json!("spec.template.spec.containers.envFrom")));
    assert_eq!(workload_lists(&host), 0);
}

/// Lists of whole workload kinds (the sweep lists snapshots too).
fn workload_lists(host: &FakeHost) -> usize {
    host.ops("list_resources_by_namespace")
        .iter()
        .filter(|l| super::WorkloadKind::from_kind(l["kind"].as_str().unwrap_or_default()).is_some())
        .count()
}

#[test]
fn without_the_hosts_index_every_workload_is_listed_and_the_rollout_is_the_same() {
    let (host, _) = cluster("app", env_from("app"));
    host.fail_with(
        "list_referencing",
        HostError::new(
            Code::Unsupported,
            "unknown operation config-snapshot/v1/list_referencing",
        ),
    );
    let out = edit(&host, json!({"mode": "green", "other": "x"}), false);
    assert!(out.accepted && out.warnings.is_empty(), "{out:?}");
    assert_eq!(host.ops("patch_workload").len(), 1);
    // Asked once, then every watching kind is listed whole.
    assert_eq!(host.ops("list_referencing").len(), 1);
    assert_eq!(
        workload_lists(&host),
        crate::model::kinds::WorkloadKind::all().filter(|k| k.watches()).count()
    );
}

/// Stock Kubewarden does not know our capability, so no watch rollout can
/// happen there: a source update lists nothing (no read, and no host
/// capability to declare, for nothing) and is accepted as it is.
#[test]
fn on_a_host_without_our_capability_a_source_update_reads_nothing() {
    let (mut host, _) = cluster("app", env_from("app"));
    host.stock = true;
    let out = edit(&host, json!({"mode": "green", "other": "x"}), false);
    assert!(
        out.accepted && out.warnings.is_empty() && out.mutated.is_none(),
        "{out:?}"
    );
    assert_eq!(host.ops("list_referencing").len(), 1, "asked once");
    assert_eq!(workload_lists(&host), 0, "nothing listed");
    assert!(host.ops("get_resource").is_empty());
}

#[test]
fn a_failing_index_is_a_warning_not_a_silent_fallback() {
    let (host, _) = cluster("app", env_from("app"));
    host.fail_with(
        "list_referencing",
        HostError::new(Code::Timeout, "the server timed out"),
    );
    let out = edit(&host, json!({"mode": "green", "other": "x"}), false);
    assert!(out.accepted, "{out:?}");
    assert!(
        out.warnings
            .iter()
            .any(|w| w.contains("could not list") && w.contains("timed out")),
        "{out:?}"
    );
    assert!(host.ops("patch_workload").is_empty());
}

#[test]
fn metadata_only_edits_are_a_no_op_without_host_calls() {
    let (host, _) = cluster("app", env_from("app"));
    let out = edit(&host, json!({"other": "x", "mode": "blue"}), false);
    assert_eq!(out, crate::model::request::Outcome::accept());
    assert!(host.calls.borrow().is_empty(), "{:?}", host.calls.borrow());
}

#[test]
fn snapshots_and_excluded_sources_are_passed_through_without_host_calls() {
    let host = FakeHost::with(vec![]);
    let mut snap = cm("app-0123456789", json!({"a": "1"}));
    snap["metadata"]["labels"] = json!({keys::MANAGED_BY: keys::MANAGED_BY_VALUE});
    run(&host, &payload("ConfigMap", "CREATE", &snap, None, false, json!({})));
    let ca = cm("kube-root-ca.crt", json!({"ca.crt": "x"}));
    run(&host, &payload("ConfigMap", "CREATE", &ca, None, false, json!({})));
    assert!(host.calls.borrow().is_empty());
}

#[test]
fn snapshot_only_and_unrelated_workloads_are_not_rolled() {
    let (host, _) = cluster("unrelated", env_from("app"));
    edit(&host, json!({"mode": "green", "other": "x"}), false);
    assert!(host.ops("patch_workload").is_empty());
    let mut d = deployment(json!({ keys::SNAPSHOT: "app" }), env_from("app"));
    d["metadata"]["name"] = json!("snap-only");
    host.objects.borrow_mut().push(d);
    edit(&host, json!({"mode": "red", "other": "x"}), false);
    assert!(host.ops("patch_workload").is_empty());
}

#[test]
fn an_edit_outside_the_key_subset_rolls_nothing() {
    let spec = json!({"containers": [{"name": "c", "env": [{"name": "M", "valueFrom": {"configMapKeyRef": {"name": "app", "key": "mode"}}}]}]});
    let (host, _) = cluster("app", spec);
    edit(&host, json!({"mode": "blue", "other": "CHANGED"}), false);
    assert!(host.ops("create_snapshot").is_empty());
    assert!(host.ops("patch_workload").is_empty());
    edit(&host, json!({"mode": "green", "other": "CHANGED"}), false);
    let patches = host.ops("patch_workload");
    assert_eq!(patches.len(), 1);
    assert_eq!(patches[0]["keys"], json!(["mode"]), "the snapshot holds the key read");
    let green = crate::model::content::Content::from_object(
        crate::model::source::SourceKind::ConfigMap,
        &json!({"data": {"mode": "green"}}),
    )
    .unwrap();
    assert_eq!(patches[0]["snapshot"], FakeHost::keyed_name("app", &green.hash()));
}

#[test]
fn a_source_created_after_its_watcher_moves_the_watcher_to_a_snapshot() {
    let host = FakeHost::with(vec![]);
    let d = deployment(json!({ keys::WATCH: "late" }), env_from("late"));
    let out = run(&host, &payload("Deployment", "CREATE", &d, None, false, json!({})));
    assert!(out.mutated.is_none());
    host.objects.borrow_mut().push(d);
    run(
        &host,
        &payload(
            "ConfigMap",
            "CREATE",
            &cm("late", json!({"a": "1"})),
            None,
            false,
            json!({}),
        ),
    );
    assert_eq!(host.ops("patch_workload").len(), 1);
}

#[test]
fn dry_runs_write_nothing_and_failures_only_warn() {
    let (host, _) = cluster("app", env_from("app"));
    edit(&host, json!({"mode": "green", "other": "x"}), true);
    assert!(host.ops("create_snapshot").is_empty() && host.ops("patch_workload").is_empty());
    host.fail("patch_workload", "forbidden");
    let out = edit(&host, json!({"mode": "green", "other": "x"}), false);
    assert!(out.accepted, "a source is never rejected for a watch failure");
    assert!(
        out.warnings[0].contains("could not roll out Deployment web"),
        "{:?}",
        out.warnings
    );
}

/// Watch rollouts against the workload's rollback record.
mod rollback_tests {
    use serde_json::{json, Value};

    use crate::admit::workload::tests::{cm, deployment, payload, run};
    use crate::host::fake::FakeHost;
    use crate::model::keys;

    fn watcher(host: &FakeHost, rollback: Option<&str>) -> Value {
        let spec = json!({"containers": [{"name": "c", "envFrom": [{"configMapRef": {"name": "app"}}]}]});
        let mut d = deployment(json!({ keys::WATCH: "app" }), spec);
        d = run(host, &payload("Deployment", "CREATE", &d, None, false, json!({})))
            .mutated
            .unwrap();
        d["metadata"]["generation"] = json!(6);
        if let Some(r) = rollback {
            d["metadata"]["annotations"][keys::ROLLBACK] = json!(r);
        }
        host.objects.borrow_mut().push(d.clone());
        host.calls.borrow_mut().clear();
        d
    }

    fn name_of(data: Value) -> String {
        let c = crate::model::content::Content::from_object(
            crate::model::source::SourceKind::ConfigMap,
            &json!({ "data": data }),
        )
        .unwrap();
        FakeHost::keyed_name("app", &c.hash())
    }

    #[test]
    fn a_readmitted_source_does_not_undo_a_rollback_that_declined_its_content() {
        let host = FakeHost::with(vec![cm("app", json!({"mode": "blue"}))]);
        let declined = name_of(json!({"mode": "green"}));
        let record =
            format!(r#"{{"generation":6,"at":"2026-01-01T00:00:00Z","sources":{{"configmap/app":"{declined}"}}}}"#);
        watcher(&host, Some(&record));
        // The resync re-admits the source, which holds what was declined.
        let green = cm("app", json!({"mode": "green"}));
        run(&host, &payload("ConfigMap", "CREATE", &green, None, false, json!({})));
        assert!(host.ops("patch_workload").is_empty(), "the rollback stands");
        assert!(host.ops("create_snapshot").is_empty(), "and no garbage is made");
        // Nor a review of an UPDATE that carries it (a forged one can
        // carry anything): the rollback stands until the source holds
        // something else.
        let blue = cm("app", json!({"mode": "blue"}));
        run(
            &host,
            &payload("ConfigMap", "UPDATE", &green, Some(&blue), false, json!({})),
        );
        assert!(host.ops("patch_workload").is_empty(), "the rollback stands");
        // A content the rollback never saw rolls out, by either.
        let red = cm("app", json!({"mode": "red"}));
        run(&host, &payload("ConfigMap", "CREATE", &red, None, false, json!({})));
        assert_eq!(host.ops("patch_workload").len(), 1);
        host.calls.borrow_mut().clear();
        run(
            &host,
            &payload("ConfigMap", "UPDATE", &red, Some(&green), false, json!({})),
        );
        assert_eq!(host.ops("patch_workload").len(), 1);
    }

    /// A rollback that could not read the source declines whatever is
    /// re-admitted, but not a real change.
    #[test]
    fn an_unreadable_decline_holds_against_readmission_only() {
        let host = FakeHost::with(vec![cm("app", json!({"mode": "blue"}))]);
        let record = r#"{"generation":6,"at":"2026-01-01T00:00:00Z","sources":{"configmap/app":""}}"#;
        watcher(&host, Some(record));
        let green = cm("app", json!({"mode": "green"}));
        run(&host, &payload("ConfigMap", "CREATE", &green, None, false, json!({})));
        assert!(host.ops("patch_workload").is_empty());
        let blue = cm("app", json!({"mode": "blue"}));
        run(
            &host,
            &payload("ConfigMap", "UPDATE", &green, Some(&blue), false, json!({})),
        );
        assert_eq!(host.ops("patch_workload").len(), 1);
    }

    #[test]
    fn the_patch_says_when_it_was_decided_and_what_the_source_was() {
        let host = FakeHost::with(vec![cm("app", json!({"mode": "blue"}))]);
        watcher(&host, Some(r#"{"generation":5,"count":3,"at":"2026-01-01T00:00:00Z"}"#));
        let old = cm("app", json!({"mode": "blue"}));
        let new = cm("app", json!({"mode": "green"}));
        run(
            &host,
            &payload("ConfigMap", "UPDATE", &new, Some(&old), false, json!({})),
        );
        let p = &host.ops("patch_workload")[0];
        assert_eq!(p["rollbacks"], 3, "the rollbacks it was decided after");
        assert_eq!(p["source"]["resourceVersion"], "7");
        assert_eq!(p["snapshot"], name_of(json!({"mode": "green"})).as_str());
    }
}

/// Argo Rollouts' CRD not installed: its lists answer NotFound, and that
/// is no rollout to make, not a warning. A built-in kind answering so is
/// still reported.
/// The readers of `app` a source-side test rolls or not: one workload per
/// way of opting in, each created through the policy (its template names
/// a snapshot), named for what it says.
fn readers_of_app(host: &FakeHost, annotations: &[(&str, Value)]) {
    for (name, ann) in annotations {
        let mut d = deployment(ann.clone(), env_from("app"));
        d["metadata"]["name"] = json!(name);
        d["metadata"]["uid"] = json!(format!("uid-{name}"));
        d = run(host, &payload("Deployment", "CREATE", &d, None, false, json!({})))
            .mutated
            .unwrap_or(d);
        d["metadata"]["resourceVersion"] = json!("41");
        host.objects.borrow_mut().push(d);
    }
    host.calls.borrow_mut().clear();
}

/// `app`'s stored change, re-admitted as serve's watch does it: an UPDATE
/// with no old object, the source as stored, its readers word among its
/// annotations.
fn stored_change(host: &FakeHost, readers: Option<&str>) -> crate::model::request::Outcome {
    let mut new = cm("app", json!({"mode": "green", "other": "x"}));
    new["metadata"]["resourceVersion"] = json!("8");
    if let Some(word) = readers {
        new["metadata"]["annotations"] = json!({ keys::READERS: word });
    }
    run(host, &payload("ConfigMap", "UPDATE", &new, None, false, json!({})))
}

fn patched(host: &FakeHost) -> Vec<String> {
    let mut names: Vec<String> = host
        .ops("patch_workload")
        .iter()
        .map(|p| p["name"].as_str().unwrap().to_string())
        .collect();
    names.sort();
    names
}

/// `readers: watch` on a source rolls the readers that snapshot it
/// without naming it (Reloader's `search` with `match`), besides those
/// that watch it; never one that names it in `snapshot` alone, or one that
/// does not opt in (the webhook is not even called for it).
#[test]
fn a_source_that_says_watch_rolls_the_readers_that_pin_it_without_naming_it() {
    let host = FakeHost::with(vec![cm("app", json!({"mode": "blue", "other": "x"}))]);
    readers_of_app(
        &host,
        &[
            ("all", json!({ keys::SNAPSHOT: "*" })),
            ("configmaps", json!({ keys::SNAPSHOT: "configmap/*" })),
            ("named-watch", json!({ keys::WATCH: "app" })),
            ("named-pin", json!({ keys::SNAPSHOT: "configmap/app" })),
            ("secrets", json!({ keys::SNAPSHOT: "secret/*" })),
            ("excluded", json!({ keys::SNAPSHOT: "*", keys::EXCLUDE: "*" })),
            ("plain", json!({})),
        ],
    );
    let out = stored_change(&host, Some("watch"));
    assert!(out.accepted && out.warnings.is_empty(), "{out:?}");
    assert_eq!(patched(&host), ["all", "configmaps", "named-watch"]);
    // Without the word, only the workload that watches it rolls.
    host.calls.borrow_mut().clear();
    stored_change(&host, None);
    assert_eq!(patched(&host), ["named-watch"]);
}

/// `readers: ignore` takes the source's edits out of every `*`, whole
/// kind and default: only a workload that names it in `watch` still rolls.
#[test]
fn a_source_that_says_ignore_rolls_only_the_readers_that_name_it() {
    let host = FakeHost::with(vec![cm("app", json!({"mode": "blue", "other": "x"}))]);
    readers_of_app(
        &host,
        &[
            ("all", json!({ keys::WATCH: "*" })),
            ("configmaps", json!({ keys::WATCH: "configmap/*" })),
            ("named", json!({ keys::WATCH: "configmap/app" })),
        ],
    );
    stored_change(&host, Some("ignore"));
    assert_eq!(patched(&host), ["named"]);
    // Under watchByDefault, a workload with no annotation yields too.
    let host = FakeHost::with(vec![cm("app", json!({"mode": "blue", "other": "x"}))]);
    let mut d = deployment(json!({}), env_from("app"));
    let by_default = json!({"watchByDefault": true});
    d = run(
        &host,
        &payload("Deployment", "CREATE", &d, None, false, by_default.clone()),
    )
    .mutated
    .unwrap();
    host.objects.borrow_mut().push(d);
    let mut new = cm("app", json!({"mode": "green", "other": "x"}));
    for (word, rolls) in [(Some("ignore"), 0), (None, 1)] {
        host.calls.borrow_mut().clear();
        new["metadata"]["annotations"] = word.map_or(json!({}), |w| json!({ keys::READERS: w }));
        run(
            &host,
            &payload("ConfigMap", "UPDATE", &new, None, false, by_default.clone()),
        );
        assert_eq!(host.ops("patch_workload").len(), rolls, "{word:?}");
    }
}

/// A word that is neither is no word: the readers' own annotations
/// decide, and the re-admission says so, naming the annotation and the
/// token.
#[test]
fn a_bad_readers_word_is_read_as_none_and_said() {
    let host = FakeHost::with(vec![cm("app", json!({"mode": "blue", "other": "x"}))]);
    readers_of_app(
        &host,
        &[
            ("all", json!({ keys::SNAPSHOT: "*" })),
            ("named", json!({ keys::WATCH: "app" })),
        ],
    );
    let out = stored_change(&host, Some("true"));
    assert_eq!(patched(&host), ["named"]);
    assert_eq!(
        out.warnings,
        ["config-snapshot: configmap/app: config-snapshot.io/readers: bad token \"true\": \"watch\" or \"ignore\"; read as no word"]
    );
}

#[test]
fn an_absent_crd_kind_has_no_watchers_to_roll_out() {
    let (host, _) = cluster("app", env_from("app"));
    host.fail_list_of_with(
        "Rollout",
        HostError::new(Code::NotFound, "the server could not find the requested resource"),
    );
    let out = edit(&host, json!({"mode": "green", "other": "x"}), false);
    assert!(out.accepted && out.warnings.is_empty(), "{out:?}");
    assert_eq!(host.ops("patch_workload").len(), 1, "the Deployment still rolls");

    let (host, _) = cluster("app", env_from("app"));
    host.fail_list_of_with("StatefulSet", HostError::new(Code::NotFound, "not found"));
    let out = edit(&host, json!({"mode": "green", "other": "x"}), false);
    assert!(
        out.warnings.iter().any(|w| w.contains("could not list StatefulSets")),
        "{out:?}"
    );
}
