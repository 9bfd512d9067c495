//! `config-snapshot replay`: runs scenarios over the simulator and
//! reports a timeline and the result of every expectation.
//!
//! - this module: a scenario run step by step ([`Session`]);
//! - [`checks`]: `expect` and `assert`, the same over replay's cluster and
//!   over objects read from a real API server.

mod checks;
pub mod invariants;
pub mod scenario;
pub mod simulator;
pub mod view;

use config_snapshot_policy::model::object::ObjectExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{anyhow, bail, Context as _, Result};
use config_snapshot_policy::host::host_error::HostError;
use config_snapshot_policy::model::duration::{parse_go_duration, parse_rfc3339};
use serde::Serialize;
use serde_json::Value;

use crate::cluster::selector::Selector;
use crate::kubewarden::admission_review;
use crate::kubewarden::engine::Engine;
use crate::replay::scenario::{Scenario, Step};
use crate::replay::simulator::{Admission, Fault, Recorded, Simulator};
pub use checks::{assert, effective_config, expect, CheckResult};

#[derive(Debug, Serialize)]
pub struct ScenarioResult {
    pub scenario: String,
    pub file: String,
    pub passed: bool,
    pub steps: Vec<StepResult>,
}

#[derive(Debug, Serialize)]
pub struct StepResult {
    pub index: usize,
    pub step: String,
    pub events: Vec<String>,
    pub checks: Vec<CheckResult>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl ScenarioResult {
    /// The first failure, as "step N (what): why".
    pub fn failure(&self) -> Option<String> {
        self.steps.iter().find_map(|s| {
            if let Some(e) = &s.error {
                return Some(format!("step {} ({}): {e}", s.index, s.step));
            }
            s.checks
                .iter()
                .find(|c| !c.ok)
                .map(|c| format!("step {} ({}): check {}: {}", s.index, s.step, c.check, c.detail))
        })
    }
}

pub fn load(path: &Path) -> Result<Scenario> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    // Through serde_json's data model: steps are single-key maps, which
    // serde_yaml would want written as YAML tags.
    let doc: Value = serde_yaml_ng::from_str(&text).with_context(|| format!("parsing scenario {}", path.display()))?;
    serde_json::from_value(doc).with_context(|| format!("reading scenario {}", path.display()))
}

pub fn run(engine: Arc<Engine>, path: &Path) -> Result<ScenarioResult> {
    run_recorded(engine, path, false).map(|(result, _)| result)
}

/// Runs a scenario and, if `record`, returns every admission it made with
/// the cluster state around it (see [`Recorded`]).
pub fn run_recorded(engine: Arc<Engine>, path: &Path, record: bool) -> Result<(ScenarioResult, Vec<Recorded>)> {
    let (result, session) = run_session(engine, path, record)?;
    Ok((result, session.sim.take_recorded()))
}

/// Runs a scenario and hands back the cluster it leaves behind (`history
/// --scenario`).
pub fn run_to_end(engine: Arc<Engine>, path: &Path) -> Result<(ScenarioResult, Simulator)> {
    let (result, session) = run_session(engine, path, false)?;
    Ok((result, session.sim))
}

fn run_session(engine: Arc<Engine>, path: &Path, record: bool) -> Result<(ScenarioResult, Session)> {
    let scenario = load(path)?;
    let base = path.parent().map(Path::to_path_buf).unwrap_or_default();
    let mut session = Session::new(engine, &scenario, base)?;
    if record {
        session.sim.record(true);
    }
    let mut result = ScenarioResult {
        scenario: scenario.name.clone().unwrap_or_else(|| path.display().to_string()),
        file: path.display().to_string(),
        passed: true,
        steps: Vec::new(),
    };
    let setup = session.load(&scenario.objects);
    let failed_setup = setup.error.is_some();
    result.steps.push(setup);
    if !failed_setup {
        for (i, step) in scenario.steps.iter().enumerate() {
            result.steps.push(session.step(i + 1, step));
        }
    }
    result.passed = result.failure().is_none();
    Ok((result, session))
}

/// A scenario being run: the cluster, and the admission the last step made
/// (for `expect`). Tests drive it step by step.
pub struct Session {
    pub sim: Simulator,
    base: PathBuf,
    last: Option<Admission>,
}

impl Session {
    /// A cluster with the scenario's settings, clock and storm guard; its
    /// objects are loaded by [`Session::load`].
    pub fn new(engine: Arc<Engine>, scenario: &Scenario, base: PathBuf) -> Result<Session> {
        let now = match &scenario.now {
            Some(t) => parse_rfc3339(t).ok_or_else(|| anyhow!("now: {t:?} is not RFC 3339"))?,
            None => parse_rfc3339("2026-01-01T00:00:00Z").expect("valid"),
        };
        let mut sim = Simulator::new(engine, scenario.settings.clone(), now);
        if let Some(interval) = &scenario.watch_min_interval {
            sim.effect_rules.watch_min_interval =
                parse_go_duration(interval).map_err(|e| anyhow!("watchMinInterval: {e}"))? as i64;
        }
        Ok(Session { sim, base, last: None })
    }

    /// Loads the initial objects (step 0).
    pub fn load(&mut self, objects: &[Value]) -> StepResult {
        let mut setup = StepResult {
            index: 0,
            step: "load objects".into(),
            events: Vec::new(),
            checks: Vec::new(),
            error: None,
        };
        for object in objects {
            if let Err(e) = self.sim.load(object.clone()) {
                setup.error = Some(e.to_string());
                break;
            }
        }
        setup.events = self.sim.take_events();
        setup
    }

    /// Runs one step, then lets the controllers and effects catch up.
    pub fn step(&mut self, index: usize, step: &Step) -> StepResult {
        let mut out = StepResult {
            index,
            step: describe(step),
            events: Vec::new(),
            checks: Vec::new(),
            error: None,
        };
        let ran =
            run_step(&self.sim, step, &self.base, &mut self.last, &mut out.checks).and_then(|()| self.sim.catch_up());
        if let Err(e) = ran {
            out.error = Some(format!("{e:#}"));
        }
        out.events = self.sim.take_events();
        out
    }

    /// What admission said about the last step's write, if it made one.
    pub fn last(&self) -> Option<&Admission> {
        self.last.as_ref()
    }
}

/// Runs one step against a cluster (without letting it catch up: see
/// [`Session::step`]).
#[expect(clippy::too_many_lines, reason = "a table: one arm per scenario step kind")]
pub fn run_step(
    sim: &Simulator,
    step: &Step,
    base: &Path,
    last: &mut Option<Admission>,
    checks: &mut Vec<CheckResult>,
) -> Result<()> {
    match step {
        Step::Apply(object) => *last = Some(sim.apply(object.clone(), false, "kubectl")?),
        Step::DryRunApply(object) => *last = Some(sim.apply(object.clone(), true, "kubectl")?),
        Step::Edit(e) => *last = Some(sim.edit(&e.kind, &e.namespace, &e.name, &e.set, "kubectl")?),
        Step::Delete(d) => {
            let names: Vec<String> = match (&d.name, &d.selector) {
                (Some(name), None) => vec![name.clone()],
                (None, Some(selector)) => {
                    let selector = Selector::parse(selector).map_err(|e| anyhow!(e))?;
                    sim.objects()
                        .iter()
                        .filter(|o| o["kind"] == d.kind.as_str() && o.namespace() == Some(d.namespace.as_str()))
                        .filter(|o| selector.matches(o))
                        .filter_map(|o| o.meta_str("name").map(str::to_string))
                        .collect()
                }
                _ => bail!("delete needs a name or a selector, not both"),
            };
            for name in names {
                sim.delete(&d.kind, &d.namespace, &name)?;
            }
            *last = None;
        }
        Step::RolloutUndo(u) => *last = Some(sim.rollout_undo(&u.kind, &u.namespace, &u.name, u.to_revision)?),
        Step::RolloutRestart(r) => *last = Some(sim.rollout_restart(&r.kind, &r.namespace, &r.name)?),
        Step::CreateJob(j) => *last = Some(sim.create_job(&j.namespace, &j.from, &j.name)?),
        Step::AdvanceTime(d) => {
            let secs = parse_go_duration(d).map_err(|e| anyhow!("advanceTime: {e}"))?;
            sim.note(format!("clock advanced by {d}"));
            sim.advance(secs as i64)?;
        }
        Step::Review(file) => {
            let path: PathBuf = base.join(file);
            let request = admission_review::read_request(&path)?;
            let (admission, mutated) = sim.review_only(&request)?;
            let response = admission_review::response(&request, &admission.response, mutated.as_ref())?;
            sim.note(format!(
                "review {}: allowed={} patch={}",
                file,
                admission.allowed,
                response["response"]["patch"].as_str().map(|_| "yes").unwrap_or("none")
            ));
            *last = Some(admission);
        }
        Step::Fault(f) => {
            sim.note(format!(
                "fault injected: {} answers {:?} {}",
                f.operation,
                f.error,
                f.times.map_or("from now on".into(), |n| format!("{n} time(s)"))
            ));
            sim.add_fault(Fault {
                operation: f.operation.clone(),
                error: HostError::new(f.code, f.error.clone()),
                remaining: f.times,
                after: f.after,
            });
        }
        Step::Expect(e) => expect(last.as_ref(), e, checks),
        Step::Assert(list) => {
            for check in list {
                checks.push(assert(sim, check));
            }
        }
        Step::RestartHost(_) => {
            sim.restart_host();
            sim.note("host restarted: its queued effects are lost".to_string());
        }
        Step::Together(steps) => {
            sim.hold_effects(true);
            let result = steps.iter().try_for_each(|raw| {
                let step: Step =
                    serde_json::from_value(raw.clone()).with_context(|| format!("together: invalid step {raw}"))?;
                run_step(sim, &step, base, last, checks)
            });
            sim.hold_effects(false);
            result?;
            sim.settle()?;
        }
        Step::Repeat(r) => {
            for i in 1..=r.times {
                for raw in &r.steps {
                    let step: Step = serde_json::from_value(substitute(raw, &i.to_string()))
                        .with_context(|| format!("repeat: invalid step {raw}"))?;
                    run_step(sim, &step, base, last, checks).with_context(|| format!("repeat {i}"))?;
                }
            }
        }
    }
    Ok(())
}

fn substitute(value: &Value, i: &str) -> Value {
    match value {
        Value::String(s) => Value::String(s.replace("{{i}}", i)),
        Value::Array(a) => Value::Array(a.iter().map(|v| substitute(v, i)).collect()),
        Value::Object(m) => Value::Object(m.iter().map(|(k, v)| (k.clone(), substitute(v, i))).collect()),
        other => other.clone(),
    }
}

fn describe(step: &Step) -> String {
    let obj = |o: &Value| {
        format!(
            "{}/{}",
            o["kind"].as_str().unwrap_or("?"),
            o.meta_str("name").unwrap_or("?")
        )
    };
    match step {
        Step::Apply(o) => format!("apply {}", obj(o)),
        Step::DryRunApply(o) => format!("apply --dry-run=server {}", obj(o)),
        Step::Edit(e) => format!("edit {}/{}", e.kind, e.name),
        Step::Delete(d) => match (&d.name, &d.selector) {
            (Some(name), _) => format!("delete {}/{name}", d.kind),
            (None, selector) => format!("delete {} -l {}", d.kind, selector.as_deref().unwrap_or("")),
        },
        Step::RolloutUndo(u) => match u.to_revision {
            Some(n) => format!("rollout undo {}/{} --to-revision={n}", u.kind, u.name),
            None => format!("rollout undo {}/{}", u.kind, u.name),
        },
        Step::RolloutRestart(r) => format!("rollout restart {}/{}", r.kind, r.name),
        Step::CreateJob(j) => format!("create job {} --from=cronjob/{}", j.name, j.from),
        Step::AdvanceTime(d) => format!("advance time {d}"),
        Step::Review(f) => format!("review {f}"),
        Step::Fault(f) => format!("fault {}", f.operation),
        Step::Expect(_) => "expect".into(),
        Step::Assert(_) => "assert".into(),
        Step::Together(s) => format!("together: {} writes before the host catches up", s.len()),
        Step::Repeat(r) => format!("repeat {} step(s) {} times", r.steps.len(), r.times),
        Step::RestartHost(_) => "the host restarts".into(),
    }
}

/// Prints a readable timeline of one scenario.
pub fn print_timeline(result: &ScenarioResult) {
    println!("== {} ({})", result.scenario, result.file);
    for step in &result.steps {
        if step.index == 0 && step.events.is_empty() && step.error.is_none() {
            continue;
        }
        println!("[{:02}] {}", step.index, step.step);
        for e in &step.events {
            println!("       {e}");
        }
        for c in &step.checks {
            println!(
                "       {} {} ({})",
                if c.ok { "ok  " } else { "FAIL" },
                c.check,
                c.detail
            );
        }
        if let Some(e) = &step.error {
            println!("       ERROR {e}");
        }
    }
    match result.failure() {
        None => println!("PASS {}\n", result.scenario),
        Some(f) => println!("FAIL {}: {f}\n", result.scenario),
    }
}
