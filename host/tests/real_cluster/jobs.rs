//! Jobs, on the real node (their pods run to completion on the kubelet).
//!
//! A CronJob's config history, pruned by the real cronjob controller: each
//! Job adopts the snapshots its template names, so when
//! `successfulJobsHistoryLimit` deletes a finished Job, the garbage
//! collector takes exactly the config no kept Job and not the CronJob name.
//! Jobs are made with `kubectl create job --from=cronjob/…` (owned by the
//! CronJob, as its scheduled Jobs are), and each prints the config it ran
//! with, read from its log.
//!
//! A Job made directly owns the config snapshotted at its creation, so the
//! TTL-after-finished controller's delete collects it; so does a Pod made
//! directly (on the control plane alone: it needs no kubelet), while a
//! ReplicaSet's Pods are not even reviewed.

use std::collections::BTreeSet;

use serde_json::{json, Value};

use super::{config_map, eventually_or, no_dangling, set_data, snapshots, ControlPlane};

/// The snapshots a template at `pointer` names.
fn names(object: &Value, pointer: &str) -> BTreeSet<String> {
    object
        .pointer(pointer)
        .map(|t| {
            config_snapshot_policy::model::references::collect(t)
                .into_iter()
                .map(|r| r.name)
                .collect()
        })
        .unwrap_or_default()
}

/// `image` runs `sh` (the node's busybox).
pub fn history_limit_story(cp: &ControlPlane, image: &str) {
    let ns = "story-cronjob";
    cp.namespace(ns);
    cp.apply(ns, &config_map("report-config", json!({"mode": "v1"})));
    let cronjob = json!({
        "apiVersion": "batch/v1", "kind": "CronJob",
        "metadata": {"name": "report", "annotations": {"config-snapshot.io/watch": "report-config"}},
        "spec": {
            "schedule": "0 3 * * *",
            // Only the Jobs made here: none on schedule while the story runs.
            "suspend": true,
            "successfulJobsHistoryLimit": 1,
            "jobTemplate": {"spec": {"template": {"spec": {
                "restartPolicy": "Never",
                "containers": [{"name": "report", "image": image, "command": ["sh", "-c", "echo mode=$mode"],
                    "envFrom": [{"configMapRef": {"name": "report-config"}}]}]}}}}
        }
    });
    cp.apply(ns, &cronjob);
    let template = "/spec/jobTemplate/spec/template";
    let state = || {
        let view = cp.objects(ns);
        let jobs: Vec<String> = view
            .0
            .iter()
            .filter(|o| o["kind"] == "Job")
            .map(|j| {
                format!(
                    "{} {:?} {}",
                    j["metadata"]["name"],
                    names(j, "/spec/template"),
                    j["status"]
                )
            })
            .collect();
        format!("jobs: {jobs:?}\nsnapshots: {:?}", snapshots(&view))
    };
    let mut pinned = BTreeSet::new();
    for i in 1..=3 {
        if i > 1 {
            set_data(cp, ns, "report-config", json!({"mode": format!("v{i}")}));
        }
        // The CronJob names a snapshot of this version (the watch moved it).
        let before = pinned.clone();
        pinned = eventually_or("the CronJob pinned to a new snapshot", 60, state, || {
            let names = names(&cp.get(ns, "cronjob", "report")?, template);
            (names.len() == 1 && names != before && snapshots(&cp.objects(ns)).is_superset(&names)).then_some(names)
        });
        let job = format!("report-{i}");
        cp.kubectl(&["-n", ns, "create", "job", &job, "--from=cronjob/report"]);
        eventually_or(
            &format!("Job {job} adopting {pinned:?} and completing"),
            90,
            state,
            || {
                let j = cp.get(ns, "job", &job)?;
                let uid = j["metadata"]["uid"].clone();
                let complete = j["status"]["conditions"]
                    .as_array()
                    .is_some_and(|c| c.iter().any(|c| c["type"] == "Complete" && c["status"] == "True"));
                let owned = pinned.iter().all(|s| {
                    cp.get(ns, "configmap", s).is_some_and(|o| {
                        o["metadata"]["ownerReferences"]
                            .as_array()
                            .is_some_and(|r| r.iter().any(|r| r["uid"] == uid))
                    })
                });
                (complete && owned && names(&j, "/spec/template") == pinned).then_some(())
            },
        );
        // What the Job's container read.
        let log = cp.kubectl(&["-n", ns, "logs", &format!("job/{job}")]);
        assert_eq!(log.trim(), format!("mode=v{i}"), "Job {job} ran with its own config");
    }
    // The controller keeps one finished Job: report-3. The garbage
    // collector takes report-1's and report-2's config with them, and
    // keeps the one report-3 and the CronJob name.
    eventually_or("the history limit pruning Jobs and their config", 120, state, || {
        let view = cp.objects(ns);
        let jobs: Vec<&Value> = view.0.iter().filter(|o| o["kind"] == "Job").collect();
        let kept = jobs.len() == 1 && jobs[0]["metadata"]["name"] == "report-3";
        (kept && snapshots(&view) == pinned).then_some(())
    });
    let view = cp.objects(ns);
    no_dangling(&view, "after the cronjob controller pruned its Jobs");
    eprintln!(
        "cronjob story: successfulJobsHistoryLimit 1 kept report-3 and its config {pinned:?}, and collected the rest"
    );
    cp.kubectl(&["delete", "namespace", ns, "--wait=false"]);
}

/// `image` runs `sh` (the node's busybox).
pub fn bare_job_ttl_story(cp: &ControlPlane, image: &str) {
    let ns = "story-bare-job";
    cp.namespace(ns);
    cp.apply(ns, &config_map("migrate-config", json!({"target": "v1"})));
    let job = json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "migrate", "annotations": {"config-snapshot.io/snapshot": "migrate-config"}},
        "spec": {
            "ttlSecondsAfterFinished": 0,
            "template": {"spec": {
                "restartPolicy": "Never",
                "containers": [{"name": "migrate", "image": image, "command": ["sh", "-c", "echo target=$target"],
                    "envFrom": [{"configMapRef": {"name": "migrate-config"}}]}]}}
        }
    });
    // `kubectl create -o json` prints the Job as stored: admitted, pinned.
    let created: Value = serde_json::from_str(
        &cp.try_kubectl(&["-n", ns, "create", "-o", "json", "-f", "-"], Some(&job.to_string()))
            .unwrap_or_else(|e| panic!("{e}")),
    )
    .unwrap();
    let pinned = names(&created, "/spec/template");
    assert!(
        pinned.len() == 1 && pinned.iter().all(|n| n.starts_with("migrate-config-")),
        "the Job names a snapshot: {pinned:?}"
    );
    let state = || {
        format!(
            "snapshots: {:?}, job: {:?}",
            snapshots(&cp.objects(ns)),
            cp.get(ns, "job", "migrate")
        )
    };
    // The Job finishes, the TTL controller deletes it, and the garbage
    // collector takes the snapshot it owned (unowned, the sweep would keep
    // it for orphanGracePeriod, far beyond this wait).
    eventually_or("the finished Job and its config collected", 90, state, || {
        let view = cp.objects(ns);
        (cp.get(ns, "job", "migrate").is_none() && snapshots(&view).is_empty()).then_some(())
    });
    assert!(cp.get(ns, "configmap", "migrate-config").is_some(), "the source stays");
    eprintln!("bare Job story: ttlSecondsAfterFinished took the Job and its snapshot {pinned:?}");
    cp.kubectl(&["delete", "namespace", ns, "--wait=false"]);
}

/// A Pod made directly owns the config snapshotted at its creation; the
/// Pods a ReplicaSet makes are not reviewed at all (the webhook's
/// matchCondition) and own nothing.
pub fn bare_pod_story(cp: &ControlPlane) {
    let ns = "story-bare-pod";
    cp.namespace(ns);
    cp.apply(ns, &config_map("debug-config", json!({"level": "info"})));
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "debug", "annotations": {"config-snapshot.io/snapshot": "debug-config"}},
        "spec": {"containers": [{"name": "debug", "image": "busybox:1.36",
            "envFrom": [{"configMapRef": {"name": "debug-config"}}]}]}
    });
    let created: Value = serde_json::from_str(
        &cp.try_kubectl(&["-n", ns, "create", "-o", "json", "-f", "-"], Some(&pod.to_string()))
            .unwrap_or_else(|e| panic!("{e}")),
    )
    .unwrap();
    // The ServiceAccount admission plugin, which runs before webhooks, has
    // added the token volume and its `kube-root-ca.crt` (excluded from
    // snapshots by default): left as it is.
    let all = names(&created, "");
    assert!(all.contains("kube-root-ca.crt"), "{all:?}");
    let pinned: Vec<String> = all.into_iter().filter(|n| n.starts_with("debug-config")).collect();
    assert!(
        pinned.len() == 1 && pinned[0].starts_with("debug-config-"),
        "the Pod names a snapshot: {pinned:?}"
    );
    let uid = created["metadata"]["uid"].clone();
    let owners = |name: &str| -> Vec<Value> {
        cp.get(ns, "configmap", name)
            .and_then(|o| o["metadata"]["ownerReferences"].as_array().cloned())
            .unwrap_or_default()
    };
    let state = || format!("snapshots: {:?}", snapshots(&cp.objects(ns)));
    eventually_or("the Pod owning its snapshot", 60, state, || {
        owners(&pinned[0]).iter().any(|r| r["uid"] == uid).then_some(())
    });
    // New content for the Deployment below, so its snapshot is not the
    // Pod's.
    set_data(cp, ns, "debug-config", json!({"level": "debug"}));
    // A Deployment's Pods carry its template's mapping, and own nothing.
    let web = super::workload(
        "Deployment",
        "web",
        json!({"config-snapshot.io/snapshot": "debug-config"}),
        "nginx:1.25",
        json!([{"configMapRef": {"name": "debug-config"}}]),
        2,
    );
    cp.apply(ns, &web);
    let deployed = eventually_or("the Deployment's Pod", 60, state, || {
        let view = cp.objects(ns);
        view.0
            .iter()
            .find(|o| o["kind"] == "Pod" && o["metadata"]["name"] != "debug")
            .map(|p| super::env_ref(&json!({"spec": {"template": p}})))
    });
    assert_ne!(deployed, pinned[0], "the Deployment pinned the new content");
    std::thread::sleep(std::time::Duration::from_secs(3));
    let kinds: BTreeSet<String> = owners(&deployed)
        .iter()
        .map(|r| r["kind"].as_str().unwrap_or_default().to_string())
        .collect();
    assert!(!kinds.contains("Pod"), "a ReplicaSet's Pod owns nothing: {kinds:?}");
    // Deleting the Pod takes its config (unowned, the sweep would keep it
    // for the 600 s grace period); the Deployment's stays.
    cp.kubectl(&["-n", ns, "delete", "pod", "debug", "--wait=false"]);
    eventually_or("the Pod's snapshot collected with it", 90, state, || {
        let kept = snapshots(&cp.objects(ns));
        (kept.contains(&deployed) && !kept.contains(&pinned[0])).then_some(())
    });
    no_dangling(&cp.objects(ns), "after the bare Pod went");
    eprintln!(
        "bare Pod story: {} owned by the Pod and collected with it; the ReplicaSet's Pods own nothing",
        pinned[0]
    );
    cp.kubectl(&["delete", "namespace", ns, "--wait=false"]);
}
