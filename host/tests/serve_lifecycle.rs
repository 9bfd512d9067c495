//! One history, two hosts: every e2e scenario runs under `replay`, and again
//! with `serve` as the host: serve's admission path as the webhook, its
//! kube-rs caches, its effect queue and its resync, against the same
//! cluster model (controllers, garbage collector, kubectl verbs) served over
//! HTTP. The scenario's own assertions must pass both times, and the
//! objects left must be the same. This is what lets a scenario prove what
//! serve does.
//!
//! Scenarios that inject host faults, hold effects (`together`) or replay
//! AdmissionReview files reach into replay's in-process host and are run
//! under replay only.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Result};
use config_snapshot::kubewarden::engine::Engine;
use config_snapshot::replay::scenario::Step;
use config_snapshot::replay::simulator::Simulator;
use config_snapshot::replay::{self, CheckResult};
use config_snapshot::serve::view::cache::KINDS;
use config_snapshot::serve::{self, State};
use config_snapshot_policy::model::duration::{parse_go_duration, parse_rfc3339};
use config_snapshot_testing::standin::ApiServer;
use serde_json::value::RawValue;
use serde_json::{json, Value};

mod support;

use support::paths::policy;

fn options(settings: &Value, interval: &str) -> serve::Options {
    serve::Options {
        settings_json: settings.to_string(),
        watch_min_interval: Duration::from_secs(parse_go_duration(interval).unwrap()),
        queue_capacity: 1 << 16,
        policy_timeout: Duration::from_secs(10),
        shutdown_grace: Duration::from_secs(1),
        // Replay knows at once when a source change went; serve waits.
        effect_wait: Duration::from_secs(2),
        // A scenario plays hours in seconds: the per-namespace budget of
        // snapshot creations is tested where it is the subject.
        snapshot_rate: std::num::NonZeroU32::MAX,
        ..serve::Options::defaults(&policy().display().to_string())
    }
}

/// Whether a scenario runs only in replay (it reaches into replay's host).
fn replay_only(steps: &[Step]) -> bool {
    steps.iter().any(|s| match s {
        Step::Fault(_) | Step::Together(_) | Step::Review(_) => true,
        Step::Repeat(r) => r
            .steps
            .iter()
            .any(|v| v.get("fault").is_some() || v.get("together").is_some() || v.get("review").is_some()),
        _ => false,
    })
}

/// The cluster with serve as its host.
struct Served {
    sim: Arc<Simulator>,
    state: Arc<State>,
    base: PathBuf,
}

impl Served {
    fn now(&self) -> i64 {
        self.sim.now()
    }

    fn set_clock(&self, t: i64) {
        self.sim.shared.store().now = t;
        self.state.cluster.fix_clock(t);
    }

    /// Whether serve's caches hold exactly what the store holds.
    fn synced(&self) -> bool {
        let shared = self.sim.shared.clone();
        KINDS.iter().all(|k| {
            let kind = k.kind;
            let version = |o: &Value| {
                (
                    o["metadata"]["namespace"].as_str().unwrap_or_default().to_string(),
                    o["metadata"]["name"].as_str().unwrap_or_default().to_string(),
                    o["metadata"]["resourceVersion"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                )
            };
            let mut cached: Vec<_> = self.state.cluster.cache.all(kind).iter().map(version).collect();
            let mut stored: Vec<_> = shared
                .store()
                .all()
                .filter(|o| o["kind"] == *kind)
                .map(version)
                .collect();
            cached.sort();
            stored.sort();
            cached == stored
        })
    }

    /// Waits until serve has nothing left to do at this moment: its caches
    /// caught up and every effect done or held by the storm guard.
    async fn quiesce(&self) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut calm = 0;
        while calm < 3 {
            // Several looks in a row: an effect may be between a retry and
            // its resend.
            calm = if self.synced() && self.state.queue.quiet() {
                calm + 1
            } else {
                0
            };
            if Instant::now() > deadline {
                bail!("serve did not settle within 60 s");
            }
            tokio::time::sleep(Duration::from_millis(30)).await;
        }
        Ok(())
    }

    async fn step(
        &self,
        step: Step,
        last: &mut Option<config_snapshot::replay::simulator::Admission>,
    ) -> Result<Vec<CheckResult>> {
        if let Step::AdvanceTime(d) = &step {
            let secs = parse_go_duration(d).map_err(|e| anyhow!("advanceTime: {e}"))? as i64;
            return self.advance(secs).await.map(|()| Vec::new());
        }
        if let Step::Repeat(r) = &step {
            let mut checks = Vec::new();
            for i in 1..=r.times {
                for raw in &r.steps {
                    let text = raw.to_string().replace("{{i}}", &i.to_string());
                    let inner: Step = serde_json::from_str(&text)?;
                    checks.extend(Box::pin(self.step(inner, last)).await?);
                }
            }
            return Ok(checks);
        }
        let (sim, base) = (self.sim.clone(), self.base.clone());
        let mut carried = last.take();
        let (checks, carried) = tokio::task::spawn_blocking(move || -> Result<_> {
            let mut checks = Vec::new();
            replay::run_step(&sim, &step, &base, &mut carried, &mut checks)?;
            sim.catch_up()?;
            Ok((checks, carried))
        })
        .await??;
        *last = carried;
        self.quiesce().await?;
        Ok(checks)
    }

    /// `advanceTime` as replay does it: through each moment the storm guard
    /// releases a held rollout, then one resync pass.
    async fn advance(&self, secs: i64) -> Result<()> {
        let target = self.now() + secs;
        while let Some(t) = self.state.queue.next_due().filter(|t| *t <= target) {
            self.set_clock(t.max(self.now()));
            tokio::time::sleep(Duration::from_millis(250)).await;
            self.quiesce().await?;
        }
        self.set_clock(target);
        let sim = self.sim.clone();
        tokio::task::spawn_blocking(move || sim.catch_up()).await??;
        self.quiesce().await?;
        serve::answer::resync_timer::once(&self.state).await;
        self.quiesce().await
    }
}

/// Objects as a user compares them: the kinds of the cluster model (serve
/// also writes Events, which replay tells in its timeline), without what
/// the API server assigns.
fn comparable(objects: Vec<Value>) -> BTreeMap<(String, String, String), Value> {
    objects
        .into_iter()
        .filter(|o| config_snapshot_policy::model::kinds::find(o["kind"].as_str().unwrap_or_default()).is_some())
        .map(|mut o| {
            let key = (
                o["kind"].as_str().unwrap_or_default().to_string(),
                o["metadata"]["namespace"].as_str().unwrap_or_default().to_string(),
                o["metadata"]["name"].as_str().unwrap_or_default().to_string(),
            );
            if let Some(meta) = o["metadata"].as_object_mut() {
                for field in ["uid", "resourceVersion", "generation", "creationTimestamp"] {
                    meta.remove(field);
                }
                if let Some(refs) = meta.get_mut("ownerReferences").and_then(Value::as_array_mut) {
                    for r in refs.iter_mut() {
                        r.as_object_mut().map(|r| r.remove("uid"));
                    }
                    refs.sort_by_key(|r| r.to_string());
                }
                if let Some(ann) = meta.get_mut("annotations").and_then(Value::as_object_mut) {
                    // The source's version at the time: a count of writes.
                    ann.remove("config-snapshot.io/source-resource-version");
                }
            }
            (key, o)
        })
        .collect()
}

async fn run_served(engine: Arc<Engine>, path: &Path) -> Result<(Vec<String>, Vec<Value>)> {
    let scenario = replay::load(path)?;
    let now = match &scenario.now {
        Some(t) => parse_rfc3339(t).ok_or_else(|| anyhow!("bad now"))?,
        None => parse_rfc3339("2026-01-01T00:00:00Z").unwrap(),
    };
    let interval = scenario.watch_min_interval.clone().unwrap_or_else(|| "30s".into());
    let mut sim = Simulator::new(engine.clone(), scenario.settings.clone(), now);
    sim.effect_rules.watch_min_interval = parse_go_duration(&interval).map_err(|e| anyhow!(e))? as i64;
    let sim = Arc::new(sim);
    let api = ApiServer::simulating(sim.clone()).await;
    let client = kube::Client::try_from(kube::Config::new(api.url().parse()?))?;
    let settings = if scenario.settings.is_null() {
        json!({})
    } else {
        scenario.settings.clone()
    };
    let (state, worker) = serve::build_with_engine(
        &options(&settings, &interval),
        client.clone(),
        engine,
        config_snapshot::cluster::proof::Prover::replay(),
    )?;
    state.cluster.fix_clock(now);
    let caches = state.cluster.cache.start(client);
    let worker = tokio::spawn(worker.run());
    let webhook_state = state.clone();
    sim.set_webhook(Arc::new(move |request: &Value| {
        let raw = RawValue::from_string(request.to_string())?;
        let answer = serve::admit(&webhook_state, &raw).map_err(|e| anyhow!("{e:?}"))?;
        let response = &answer.review["response"];
        Ok(json!({
            "accepted": answer.allowed,
            "message": response["status"]["message"],
            "warnings": response["warnings"],
            "mutated_object": answer.mutated,
        }))
    }));
    let served = Served {
        sim: sim.clone(),
        state,
        base: path.parent().map(Path::to_path_buf).unwrap_or_default(),
    };
    while !served.state.cluster.cache.synced() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for object in scenario.objects.clone() {
        let sim = sim.clone();
        tokio::task::spawn_blocking(move || sim.load(object)).await??;
        served.quiesce().await?;
    }
    let mut failures = Vec::new();
    let mut last = None;
    for (i, step) in scenario.steps.iter().enumerate() {
        for c in served
            .step(step.clone(), &mut last)
            .await
            .map_err(|e| anyhow!("step {}: {e:#}", i + 1))?
        {
            if !c.ok {
                failures.push(format!("step {}: {}: {}", i + 1, c.check, c.detail));
            }
        }
    }
    let objects = sim.objects();
    worker.abort();
    for c in caches {
        c.abort();
    }
    Ok((failures, objects))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_scenario_leaves_the_same_cluster_under_replay_and_serve() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let engine = Arc::new(Engine::load(&policy()).unwrap());
    let scenarios = support::paths::scenario_files();
    let (mut compared, mut skipped) = (Vec::new(), Vec::new());
    for path in &scenarios {
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let scenario = replay::load(path).unwrap();
        if replay_only(&scenario.steps) {
            skipped.push(name);
            continue;
        }
        let replayed = {
            let (engine, path) = (engine.clone(), path.clone());
            tokio::task::spawn_blocking(move || {
                let scenario = replay::load(&path).unwrap();
                let mut session =
                    replay::Session::new(engine, &scenario, path.parent().unwrap().to_path_buf()).unwrap();
                let setup = session.load(&scenario.objects);
                assert!(setup.error.is_none());
                for (i, step) in scenario.steps.iter().enumerate() {
                    let r = session.step(i + 1, step);
                    assert!(
                        r.error.is_none() && r.checks.iter().all(|c| c.ok),
                        "{name} fails in replay: {r:?}"
                    );
                }
                session.sim.objects()
            })
            .await
            .unwrap()
        };
        let (failures, served) = run_served(engine.clone(), path)
            .await
            .unwrap_or_else(|e| panic!("{}: {e:#}", path.display()));
        assert!(
            failures.is_empty(),
            "{} under serve:\n{}",
            path.display(),
            failures.join("\n")
        );
        let (replayed, served) = (comparable(replayed), comparable(served));
        let names = |m: &BTreeMap<(String, String, String), Value>| m.keys().cloned().collect::<Vec<_>>();
        assert_eq!(
            names(&served),
            names(&replayed),
            "{}: the objects left differ",
            path.display()
        );
        for (key, object) in &replayed {
            assert_eq!(&served[key], object, "{}: {key:?} differs", path.display());
        }
        compared.push(path.file_name().unwrap().to_string_lossy().to_string());
    }
    eprintln!("compared under replay and serve: {compared:?}\nreplay only: {skipped:?}");
    assert!(compared.len() >= 15, "{compared:?}");
}
