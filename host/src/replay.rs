//! `config-snapshot replay`: runs scenarios over the in-memory cluster and
//! reports a timeline and the result of every expectation.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{anyhow, bail, Context as _, Result};
use base64::Engine as _;
use config_snapshot_policy::content::{Content, ContentError};
use config_snapshot_policy::duration::{parse_go_duration, parse_rfc3339};
use config_snapshot_policy::host_error::HostError;
use config_snapshot_policy::source::{SourceId, SourceKind};
use config_snapshot_policy::template;
use serde::Serialize;
use serde_json::{json, Value};

use crate::engine::Engine;
use crate::invariants;
use crate::memory::{Admission, Fault, Recorded, Simulator};
use crate::review;
use crate::scenario::{Check, EffectiveConfig, Expect, Invariant, Scenario, Step};
use crate::selector::Selector;
use crate::view::View;

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

#[derive(Debug, Serialize)]
pub struct CheckResult {
    pub check: String,
    pub ok: bool,
    pub detail: String,
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
    let doc: Value = serde_yaml::from_str(&text).with_context(|| format!("parsing scenario {}", path.display()))?;
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
        let ran = run_step(&self.sim, step, &self.base, &mut self.last, &mut out.checks)
            .and_then(|()| self.sim.catch_up());
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
                        .filter(|o| o["kind"] == d.kind.as_str() && o["metadata"]["namespace"] == d.namespace.as_str())
                        .filter(|o| selector.matches(o))
                        .filter_map(|o| o["metadata"]["name"].as_str().map(str::to_string))
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
        Step::AdvanceTime(d) => {
            let secs = parse_go_duration(d).map_err(|e| anyhow!("advanceTime: {e}"))?;
            sim.note(format!("clock advanced by {d}"));
            sim.advance(secs as i64)?;
        }
        Step::Review(file) => {
            let path: PathBuf = base.join(file);
            let request = review::read_request(&path)?;
            let (admission, mutated) = sim.review_only(&request)?;
            let response = review::response(&request, &admission.response, mutated.as_ref())?;
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
            o["metadata"]["name"].as_str().unwrap_or("?")
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
        Step::AdvanceTime(d) => format!("advance time {d}"),
        Step::Review(f) => format!("review {f}"),
        Step::Fault(f) => format!("fault {}", f.operation),
        Step::Expect(_) => "expect".into(),
        Step::Assert(_) => "assert".into(),
        Step::Together(s) => format!("together: {} writes before the host catches up", s.len()),
        Step::Repeat(r) => format!("repeat {} step(s) {} times", r.steps.len(), r.times),
    }
}

/// Evaluates an `expect` step against the last admission.
pub fn expect(last: Option<&Admission>, e: &Expect, checks: &mut Vec<CheckResult>) {
    let Some(a) = last else {
        checks.push(CheckResult {
            check: "expect".into(),
            ok: false,
            detail: "the previous step made no admission request".into(),
        });
        return;
    };
    if let Some(allowed) = e.allowed {
        checks.push(CheckResult {
            check: format!("allowed == {allowed}"),
            ok: a.allowed == allowed,
            detail: format!(
                "allowed was {} (message: {})",
                a.allowed,
                a.message.as_deref().unwrap_or("none")
            ),
        });
    }
    if let Some(warnings) = &e.warnings {
        if warnings.is_empty() {
            checks.push(CheckResult {
                check: "no warnings".into(),
                ok: a.warnings.is_empty(),
                detail: format!("warnings: {:?}", a.warnings),
            });
        }
        for w in warnings {
            checks.push(CheckResult {
                check: format!("warning contains {w:?}"),
                ok: a.warnings.iter().any(|x| x.contains(w.as_str())),
                detail: format!("warnings: {:?}", a.warnings),
            });
        }
    }
    if let Some(m) = &e.message_contains {
        checks.push(CheckResult {
            check: format!("message contains {m:?}"),
            ok: a.message.as_deref().is_some_and(|x| x.contains(m.as_str())),
            detail: format!("message: {:?}", a.message),
        });
    }
}

/// Evaluates one check against a view of a cluster.
pub fn assert(sim: &dyn View, check: &Check) -> CheckResult {
    match check {
        Check::EffectiveConfig(ec) => {
            let name = format!("effectiveConfig {}/{} {}", ec.kind, ec.name, ec.source);
            let secret = ec.source.starts_with("secret/");
            match effective_config(sim, ec) {
                Ok((object, data)) => {
                    let want: BTreeMap<String, String> = serde_json::from_value(ec.data.clone()).unwrap_or_default();
                    let ok = data == want;
                    let detail = if ok {
                        format!("reads {object}")
                    } else if secret {
                        // Never print Secret values, even in a failing test.
                        format!(
                            "reads {object} with keys {:?}, which differ from the expected keys {:?} or values",
                            data.keys().collect::<Vec<_>>(),
                            want.keys().collect::<Vec<_>>()
                        )
                    } else {
                        format!("reads {object} = {}, expected {}", json!(data), json!(want))
                    };
                    CheckResult {
                        check: name,
                        ok,
                        detail,
                    }
                }
                Err(e) => CheckResult {
                    check: name,
                    ok: false,
                    detail: e.to_string(),
                },
            }
        }
        Check::Exists(r) | Check::Absent(r) => {
            let want = matches!(check, Check::Exists(_));
            let found = sim.get(&r.kind, &r.namespace, &r.name).is_some();
            CheckResult {
                check: format!("{} {}/{}", if want { "exists" } else { "absent" }, r.kind, r.name),
                ok: found == want,
                detail: if found {
                    "it exists".into()
                } else {
                    "it does not exist".into()
                },
            }
        }
        Check::Count(c) => {
            let check = format!(
                "count {} {} == {}",
                c.kind,
                c.selector.as_deref().unwrap_or(""),
                c.equals
            );
            match Selector::parse(c.selector.as_deref().unwrap_or("")) {
                Ok(sel) => {
                    let found: Vec<String> = sim
                        .objects()
                        .iter()
                        .filter(|o| {
                            o["kind"] == c.kind.as_str()
                                && o["metadata"]["namespace"] == c.namespace.as_str()
                                && sel.matches(o)
                        })
                        .map(|o| o["metadata"]["name"].as_str().unwrap_or_default().to_string())
                        .collect();
                    CheckResult {
                        ok: found.len() == c.equals,
                        detail: format!("found {}: {found:?}", found.len()),
                        check,
                    }
                }
                Err(e) => CheckResult {
                    check,
                    ok: false,
                    detail: e.to_string(),
                },
            }
        }
        Check::Invariants(list) => {
            let objects = sim.objects();
            let mut broken = Vec::new();
            for invariant in list {
                broken.extend(match invariant {
                    Invariant::NothingDangles => invariants::nothing_dangles(&objects),
                    Invariant::GarbageBounded => invariants::garbage_bounded(&objects, &sim.awaited()),
                });
            }
            CheckResult {
                check: format!("invariants {list:?}"),
                ok: broken.is_empty(),
                detail: if broken.is_empty() {
                    "hold".into()
                } else {
                    broken.join("; ")
                },
            }
        }
        Check::JsonPath(j) => {
            let check = format!("jsonPath {}/{} {} == {}", j.kind, j.name, j.path, j.equals);
            let Some(object) = sim.get(&j.kind, &j.namespace, &j.name) else {
                return CheckResult {
                    check,
                    ok: false,
                    detail: "the object does not exist".into(),
                };
            };
            let path = if j.path.starts_with('$') {
                j.path.clone()
            } else if j.path.starts_with('.') || j.path.starts_with('[') {
                format!("${}", j.path)
            } else {
                format!("$.{}", j.path)
            };
            match serde_json_path::JsonPath::parse(&path) {
                Ok(p) => {
                    let found: Vec<&Value> = p.query(&object).all();
                    let got = match found.as_slice() {
                        [one] => (*one).clone(),
                        [] => Value::Null,
                        many => json!(many),
                    };
                    let secret_data =
                        j.kind == "Secret" && (path.contains("data") || path.contains('*') || path.contains(".."));
                    let detail = if got == j.equals || !secret_data {
                        format!("got {got}")
                    } else {
                        "got a different value (Secret data is not printed)".into()
                    };
                    CheckResult {
                        ok: got == j.equals,
                        detail,
                        check,
                    }
                }
                Err(e) => CheckResult {
                    check,
                    ok: false,
                    detail: format!("bad JSONPath: {e}"),
                },
            }
        }
    }
}

/// Why a workload's effective config cannot be told.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EffectiveError {
    #[error("source must be configmap/NAME or secret/NAME")]
    Source,
    #[error("{kind}/{name} has no current revision")]
    NoRevision { kind: String, name: String },
    #[error("the current revision does not reference {0}")]
    NotReferenced(SourceId),
    #[error("the references to {id} disagree: {names:?}")]
    Disagree { id: SourceId, names: Vec<String> },
    #[error("the current revision references {kind}/{name}, which does not exist")]
    Missing { kind: &'static str, name: String },
    #[error(transparent)]
    Content(#[from] ContentError),
}

/// The data the pods of the workload's current revision read from a source:
/// follows the revision's reference, through a snapshot if it names one.
pub fn effective_config(
    sim: &dyn View,
    ec: &EffectiveConfig,
) -> Result<(String, BTreeMap<String, String>), EffectiveError> {
    let (tag, source_name) = ec.source.split_once('/').ok_or(EffectiveError::Source)?;
    let kind = SourceKind::from_tag(tag).ok_or(EffectiveError::Source)?;
    let id = SourceId::new(kind, source_name);
    let template = sim
        .current_revision_template(&ec.kind, &ec.namespace, &ec.name)
        .ok_or_else(|| EffectiveError::NoRevision {
            kind: ec.kind.clone(),
            name: ec.name.clone(),
        })?;
    let group = template::own_group(&template, &id).ok_or_else(|| EffectiveError::NotReferenced(id.clone()))?;
    let mut names: Vec<&str> = group.refs.iter().map(|r| r.name.as_str()).collect();
    names.dedup();
    if names.len() != 1 {
        return Err(EffectiveError::Disagree {
            id,
            names: names.into_iter().map(str::to_string).collect(),
        });
    }
    let object_name = names[0];
    let Some(object) = sim.get(kind.kind(), &ec.namespace, object_name) else {
        return if group.all_optional() {
            Ok((format!("{} (optional, missing)", object_name), BTreeMap::new()))
        } else {
            Err(EffectiveError::Missing {
                kind: kind.kind(),
                name: object_name.to_string(),
            })
        };
    };
    let content = Content::from_object(kind, &object)?.subset(group.key_subset().as_ref());
    let mut data = BTreeMap::new();
    for (k, v) in content.data.iter().chain(content.binary_data.iter()) {
        let value = if kind == SourceKind::Secret || content.binary_data.contains_key(k) {
            base64::engine::general_purpose::STANDARD
                .decode(v)
                .ok()
                .and_then(|b| String::from_utf8(b).ok())
                .unwrap_or_else(|| v.clone())
        } else {
            v.clone()
        };
        data.insert(k.clone(), value);
    }
    Ok((format!("{}/{object_name}", kind.kind()), data))
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
