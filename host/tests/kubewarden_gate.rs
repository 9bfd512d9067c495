//! The policy on today's Kubewarden: its metadata declares, in the
//! monorepo's pattern syntax, exactly the host capabilities and resources
//! it calls on stock Kubewarden, and under a gate that refuses everything
//! else (`config_snapshot::kubewarden::gate`, as policy-server 1.35+ does) it answers
//! every admission of every scenario as it does with nothing gated. Its
//! own write capability, which stock Kubewarden does not have, is refused
//! there, and the policy falls back to checksum mode: it never fails the
//! admission for that.
#![allow(clippy::too_many_lines, reason = "a test or benchmark is a story read top to bottom")]

use std::collections::BTreeSet;
use std::sync::Arc;

use config_snapshot::kubewarden::engine::Engine;
use config_snapshot::kubewarden::gate::{declared_resources, Allowed, Gate, KUBEWARDEN_CAPABILITIES};
use config_snapshot::replay;
use config_snapshot::replay::simulator::Simulator;
use serde_json::{json, Value};

mod support;
use support::paths::{policy, root, scenario_files};

fn metadata() -> Value {
    serde_yaml_ng::from_str(&std::fs::read_to_string(root().join("policy-metadata.yml")).unwrap()).unwrap()
}

fn declared() -> Vec<String> {
    metadata()["hostCapabilities"]
        .as_array()
        .expect("hostCapabilities is a list of patterns")
        .iter()
        .map(|p| p.as_str().expect("each pattern is a string").to_string())
        .collect()
}

/// The monorepo's parser reads the metadata's list (kwctl annotate would
/// refuse a pattern it does not know).
#[test]
fn the_metadata_declares_capabilities_the_monorepo_knows() {
    let declared = declared();
    assert!(!declared.is_empty());
    Allowed::parse(&declared).unwrap_or_else(|e| panic!("policy-metadata.yml hostCapabilities: {e}"));
    for pattern in &declared {
        assert!(
            KUBEWARDEN_CAPABILITIES.contains(&pattern.as_str()),
            "{pattern}: exact capabilities, no wildcard (least privilege)"
        );
    }
}

/// `answer` with the times in its records blanked: on stock Kubewarden
/// the policy reads the clock itself, and two runs may straddle a second.
fn timeless(answer: &Value) -> String {
    let text = answer.to_string();
    let mut out = String::with_capacity(text.len());
    let mut rest = text.as_str();
    let marker = r#"\"at\":\""#;
    while let Some(at) = rest.find(marker) {
        let (head, tail) = rest.split_at(at + marker.len());
        out.push_str(head);
        out.push_str("TIME");
        rest = &tail[tail.find(r#"\""#).unwrap_or(0)..];
    }
    out.push_str(rest);
    out
}

/// Stock settings: what deploy/kubewarden/policy.yaml sets, over the
/// scenario's own (its opt-in defaults and exclusions).
fn stock(settings: &Value) -> Value {
    let mut s = settings.clone();
    s["withoutSnapshotCapability"] = json!("checksum");
    s
}

/// Every admission of every scenario, replayed on stock Kubewarden's host
/// (reads only) twice: under the gate with the declared capabilities and
/// resources, and with everything allowed. Same answers; nothing refused
/// but the write capability stock Kubewarden lacks; and what was asked is
/// exactly what is declared.
#[test]
fn every_scenario_admission_runs_under_the_declared_capabilities() {
    let engine = Arc::new(Engine::load(&policy()).unwrap());
    let allowed = Allowed::parse(declared()).unwrap();
    let resources = declared_resources(&metadata());
    let everything: BTreeSet<String> = resources
        .iter()
        .cloned()
        .chain(["v1/Namespace".to_string(), "v1/ServiceAccount".to_string()])
        .collect();
    let (mut admissions, mut checksums) = (0, 0);
    // The kinds deploy/kubewarden/policy.yaml has kube-apiserver send.
    let shipped: Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(root().join("deploy/kubewarden/policy.yaml")).unwrap())
            .unwrap();
    let stock_kinds: BTreeSet<String> = shipped["spec"]["rules"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| r["resources"].as_array().unwrap().clone())
        .filter_map(|r| {
            let plural = r.as_str()?;
            config_snapshot_policy::model::kinds::KINDS
                .iter()
                .find(|k| k.plural == plural)
                .map(|k| k.kind.to_string())
        })
        .collect();
    let mut unreviewed = 0;
    let mut asked_capabilities = BTreeSet::new();
    let mut asked_resources = BTreeSet::new();
    for path in scenario_files() {
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let (_, recorded) = replay::run_recorded(engine.clone(), &path, true).unwrap();
        for (i, rec) in recorded.iter().enumerate().filter(|(_, r)| !r.faulted) {
            let settings = stock(&rec.settings);
            let answer = |allowed: Allowed, resources: BTreeSet<String>| {
                let sim = Simulator::new(engine.clone(), settings.clone(), rec.now);
                for object in &rec.before {
                    sim.shared.store().persist(object.clone());
                }
                let gate = Arc::new(Gate::new(sim.dry_run_host(&rec.request), allowed, resources));
                let validation = engine.validate(&rec.request, &settings, gate.clone()).unwrap();
                (validation, gate.asked())
            };
            let at = format!(
                "{name} admission {i} ({} {} {})",
                rec.request["operation"], rec.request["kind"]["kind"], rec.request["name"]
            );
            let (gated, asked) = answer(allowed.clone(), resources.clone());
            let (open, _) = answer(Allowed::All, everything.clone());
            assert_eq!(
                timeless(&gated),
                timeless(&open),
                "{at}: the declared capabilities change the answer"
            );
            for refusal in &asked.refused {
                assert_eq!(refusal, "unknown binding: config-snapshot", "{at}");
            }
            asked_capabilities.extend(asked.capabilities.into_iter().filter(|c| !c.contains(':')));
            asked_resources.extend(asked.resources);
            // What deploy/kubewarden does not review does nothing there.
            let kind = rec.request["kind"]["kind"].as_str().unwrap_or_default();
            if !stock_kinds.contains(kind) {
                assert!(
                    gated["accepted"] == true && gated["mutated_object"].is_null(),
                    "{at}: a {kind} review on stock Kubewarden changed something: {gated}"
                );
                unreviewed += 1;
            }
            admissions += 1;
            let patched = gated["mutated_object"].to_string();
            checksums += usize::from(patched.contains("config-snapshot.io/checksum-"));
        }
    }
    // A CronJob's job template edited (no scenario edits one by hand on
    // stock): its revisions are its Jobs, listed to tell an undo.
    let engine2 = engine.clone();
    let cronjob = |image: &str| {
        json!({"apiVersion": "batch/v1", "kind": "CronJob",
            "metadata": {"name": "nightly", "namespace": "default", "uid": "cj-1", "resourceVersion": "4",
                "annotations": {"config-snapshot.io/snapshot": "*"}},
            "spec": {"schedule": "0 3 * * *", "jobTemplate": {"spec": {"template": {"spec": {"restartPolicy": "Never",
                "containers": [{"name": "c", "image": image, "envFrom": [{"configMapRef": {"name": "app"}}]}]}}}}}})
    };
    let request = json!({"uid": "cj", "kind": {"group": "batch", "version": "v1", "kind": "CronJob"},
        "resource": {"group": "batch", "version": "v1", "resource": "cronjobs"},
        "namespace": "default", "name": "nightly", "operation": "UPDATE", "userInfo": {"username": "alice"},
        "object": cronjob("x:2"), "oldObject": cronjob("x:1")});
    let settings = stock(&json!({}));
    let sim = Simulator::new(engine2.clone(), settings.clone(), 1_700_000_000);
    sim.shared
        .store()
        .persist(json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "app", "namespace": "default", "uid": "u1", "resourceVersion": "1"}, "data": {"a": "1"}}));
    let gate = Arc::new(Gate::new(
        sim.dry_run_host(&request),
        allowed.clone(),
        resources.clone(),
    ));
    let validation = engine2.validate(&request, &settings, gate.clone()).unwrap();
    assert_eq!(validation["accepted"], true, "{validation}");
    let asked = gate.asked();
    assert!(
        asked.refused.iter().all(|r| r == "unknown binding: config-snapshot"),
        "{:?}",
        asked.refused
    );
    asked_capabilities.extend(asked.capabilities.into_iter().filter(|c| !c.contains(':')));
    asked_resources.extend(asked.resources);
    eprintln!(
        "{admissions} admissions, {checksums} stamped with checksums; asked {asked_capabilities:?} of {asked_resources:?}"
    );
    assert!(admissions > 100 && checksums > 10, "{admissions} {checksums}");
    assert!(
        unreviewed > 50,
        "the reviews deploy/kubewarden leaves out were tried: {unreviewed}"
    );
    let declared: BTreeSet<String> = declared().into_iter().collect();
    assert_eq!(
        asked_capabilities, declared,
        "declared, and no more, is what the policy calls"
    );
    assert_eq!(
        asked_resources, resources,
        "declared, and no more, is what the policy reads"
    );
}

/// A gate that grants our write capability's calls nothing, in any words a
/// host may use, leaves the policy in checksum mode: the admission is
/// answered, with a checksum, never failed for it.
#[test]
fn a_refused_write_capability_falls_back_to_checksum_mode() {
    use config_snapshot::kubewarden::engine::{CallFailure, CallHandler};
    /// A host that knows our binding but refuses it, as a gate would.
    struct Refusing(Arc<dyn CallHandler>);
    impl CallHandler for Refusing {
        fn call(&self, binding: &str, ns: &str, op: &str, payload: &[u8]) -> Result<Vec<u8>, CallFailure> {
            if binding == "config-snapshot" {
                return Err(CallFailure::Foreign(format!(
                    "Policy has not been granted access to the '{ns}/{op}' host capability. The violation has been reported."
                )));
            }
            self.0.call(binding, ns, op, payload)
        }
    }
    let engine = Arc::new(Engine::load(&policy()).unwrap());
    let settings = json!({"withoutSnapshotCapability": "checksum", "onSnapshotFailure": "reject"});
    let sim = Simulator::new(engine.clone(), settings.clone(), 1_700_000_000);
    sim.shared
        .store()
        .persist(json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "app", "namespace": "default", "uid": "u1", "resourceVersion": "1"},
        "data": {"mode": "blue"}}));
    let request = json!({"uid": "1", "kind": {"group": "apps", "version": "v1", "kind": "Deployment"},
        "resource": {"group": "apps", "version": "v1", "resource": "deployments"},
        "namespace": "default", "name": "web", "operation": "CREATE", "userInfo": {"username": "alice"},
        "object": {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "default", "annotations": {"config-snapshot.io/snapshot": "*"}},
            "spec": {"selector": {"matchLabels": {"app": "web"}}, "template": {"metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "c", "image": "x:1", "envFrom": [{"configMapRef": {"name": "app"}}]}]}}}}});
    let gate = Allowed::parse(declared()).unwrap();
    for host in [
        Arc::new(Gate::new(
            sim.dry_run_host(&request),
            gate.clone(),
            declared_resources(&metadata()),
        )) as Arc<dyn CallHandler>,
        Arc::new(Refusing(sim.dry_run_host(&request))),
    ] {
        let validation = engine.validate(&request, &settings, host).unwrap();
        assert_eq!(validation["accepted"], true, "{validation}");
        let annotations = &validation["mutated_object"]["spec"]["template"]["metadata"]["annotations"];
        assert!(
            annotations
                .as_object()
                .unwrap()
                .keys()
                .any(|k| k.starts_with("config-snapshot.io/checksum-")),
            "checksum mode: {validation}"
        );
    }
}
