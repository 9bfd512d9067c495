//! The e2e scenarios through the kube-backed implementation. Every
//! admission a scenario makes in replay is made again through `serve`'s
//! admission path: kube-rs against the API server stand-in, with the cache
//! and the API server holding the exact cluster replay had at that moment,
//! and the same clock. The answer must be the same (allowed, message,
//! warnings, mutated object), and so must the objects that exist afterwards
//! (snapshots created, orphans swept).
//!
//! Admissions under an injected fault are skipped: the fault lives in
//! replay's backend.

mod support;

use std::collections::BTreeSet;
use std::sync::Arc;

use config_snapshot::kubewarden::engine::Engine;
use config_snapshot::replay::simulator::Recorded;
use config_snapshot::{replay, serve};
use config_snapshot_testing::standin::ApiServer;
use serde_json::value::RawValue;
use serde_json::Value;

use support::paths::policy;

fn keys(objects: &[Value]) -> BTreeSet<(String, String, String)> {
    objects
        .iter()
        .filter(|o| config_snapshot_policy::model::kinds::find(o["kind"].as_str().unwrap_or_default()).is_some())
        .map(|o| {
            (
                o["kind"].as_str().unwrap().to_string(),
                o["metadata"]["namespace"].as_str().unwrap_or("default").to_string(),
                o["metadata"]["name"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn options(settings: &Value) -> serve::Options {
    serve::Options {
        settings_json: settings.to_string(),
        queue_capacity: 1 << 16,
        policy_timeout: std::time::Duration::from_secs(10),
        shutdown_grace: std::time::Duration::from_secs(1),
        // A scenario plays hours in seconds: the per-namespace budget of
        // snapshot creations is tested where it is the subject.
        snapshot_rate: std::num::NonZeroU32::MAX,
        ..serve::Options::defaults(&policy().display().to_string())
    }
}

fn warnings(v: &Value) -> Vec<Value> {
    v.as_array().cloned().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_scenario_admission_answers_the_same_through_the_kube_backend() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let api = ApiServer::start().await;
    let client = kube::Client::try_from(kube::Config::new(api.url().parse().unwrap())).unwrap();
    let engine = Arc::new(Engine::load(&policy()).unwrap());
    let scenarios = support::paths::scenario_files();
    assert!(scenarios.len() >= 16);
    let (mut compared, mut skipped, mut mutated, mut created) = (0, 0, 0, 0);
    for path in &scenarios {
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let (result, recorded): (_, Vec<Recorded>) = {
            let (engine, path) = (engine.clone(), path.clone());
            tokio::task::spawn_blocking(move || replay::run_recorded(engine, &path, true))
                .await
                .unwrap()
                .unwrap()
        };
        assert!(result.passed, "{name} fails in replay");
        let Some(first) = recorded.first() else { continue };
        let (state, _worker) = serve::build_with_engine(
            &options(&first.settings),
            client.clone(),
            engine.clone(),
            config_snapshot::cluster::proof::Prover::replay(),
        )
        .unwrap();
        for (i, rec) in recorded.iter().enumerate() {
            if rec.faulted {
                skipped += 1;
                continue;
            }
            let at = format!(
                "{name}, admission {i} ({} {} {})",
                rec.request["operation"], rec.request["kind"]["kind"], rec.request["name"]
            );
            api.reset(&rec.before);
            state.cluster.cache.clear();
            for o in rec.before.iter().filter(|o| {
                config_snapshot_policy::model::kinds::find(o["kind"].as_str().unwrap_or_default()).is_some()
            }) {
                state.cluster.cache.observe(o.clone());
            }
            state.cluster.fix_clock(rec.now);
            api.fix_clock(rec.now);
            let raw = RawValue::from_string(rec.request.to_string()).unwrap();
            let answer = {
                let state = state.clone();
                tokio::task::spawn_blocking(move || serve::admit(&state, &raw))
                    .await
                    .unwrap()
            }
            .unwrap_or_else(|e| panic!("{at}: {e:?}"));
            let expected = &rec.response;
            assert_eq!(answer.allowed, expected["accepted"] == true, "{at}: {}", answer.review);
            let response = &answer.review["response"];
            if !answer.allowed {
                assert_eq!(response["status"]["message"], expected["message"], "{at}");
            }
            assert_eq!(warnings(&response["warnings"]), warnings(&expected["warnings"]), "{at}");
            let want = expected.get("mutated_object").filter(|m| !m.is_null());
            assert_eq!(answer.mutated.as_ref(), want, "{at}: mutated object");
            let mut after: BTreeSet<_> = api.keys().into_iter().collect();
            let before = keys(&rec.before);
            let want_after = keys(&rec.after);
            after.retain(|k| config_snapshot_policy::model::kinds::find(&k.0).is_some());
            assert_eq!(after, want_after, "{at}: objects after the admission");
            compared += 1;
            mutated += usize::from(want.is_some());
            created += want_after.difference(&before).count();
        }
    }
    eprintln!(
        "{compared} admissions compared ({mutated} mutated, {created} objects created), {skipped} under faults skipped"
    );
    assert!(
        compared > 100 && mutated > 20 && created > 20,
        "{compared} {mutated} {created}"
    );
}
