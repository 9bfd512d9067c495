//! Random histories driven as users drive them, on the real control plane
//! (issue "Random histories and faults"): source edits, the three ways
//! GitOps tools re-sync a manifest (client-side apply, server-side apply
//! under another field manager, replace), scaling, `rollout undo` of a
//! Deployment and a DaemonSet, `rollout pause`/`resume`, waits,
//! and serve killed with SIGKILL right after a source edit (between the
//! admission and the rollout it implies). The same seed replays the same
//! history. After every step the invariants are checked against what the
//! API server holds:
//! - nothing dangles;
//! - no rollout without a reason: a step that edits no source and is no
//!   user's rollout leaves every pod template as it was;
//! - watch converges: after a source edit (and after serve comes back),
//!   every watcher never rolled back runs the new content, within the
//!   resync interval plus slack.
//!
//! A scripted tour that meets every fault once (kube-apiserver restarted,
//! etcd stopped 10 s, serve killed; then two replicas on a real Lease with
//! the leader killed mid-storm, real_cluster/fleet.rs), then `HISTORIES` (default 1) random
//! histories of `HISTORY_STEPS` (default 10) steps from `HISTORY_SEED`
//! (default 1), run in `make test`; `make soak-cluster` runs random
//! histories, faults included, for `SOAK_SECONDS`.

use std::collections::BTreeMap;

use proptest::prelude::Rng;
use proptest::test_runner::{RngAlgorithm, TestRng};

use super::*;

/// A seeded source of choices: the same seed, the same history.
struct Dice(TestRng);

impl Dice {
    fn new(seed: u64) -> Dice {
        let mut bytes = [0u8; 32];
        bytes[..8].copy_from_slice(&seed.to_le_bytes());
        Dice(TestRng::from_seed(RngAlgorithm::ChaCha, &bytes))
    }
    fn below(&mut self, n: u64) -> u64 {
        self.0.next_u64() % n
    }
}

#[derive(Debug, Clone, Copy)]
enum Action {
    Edit(usize),
    Apply,
    ServerSideApply,
    Replace,
    Scale(u32),
    /// `kubectl rollout undo` of this workload.
    Undo(&'static str),
    /// `kubectl rollout pause` of api, or `resume` if it is paused (live).
    PauseOrResume,
    Wait(u64),
    /// A source edit, and a fault right after it: between the admission
    /// and the rollout it implies.
    EditThen(usize, Fault),
}

#[derive(Debug, Clone, Copy)]
enum Fault {
    /// serve SIGKILLed, started again after this many seconds.
    KillServe(u64),
    /// kube-apiserver killed and started again (every watch is cut).
    RestartApiserver,
    /// etcd stopped for this many seconds.
    PauseEtcd(u64),
}

/// The sources: (kind, name, key).
const SOURCES: [(&str, &str, &str); 3] = [
    ("configmap", "a", "mode"),
    ("configmap", "b", "n"),
    ("secret", "s", "t"),
];

impl Action {
    fn roll(dice: &mut Dice) -> Action {
        match dice.below(20) {
            0..=3 => Action::Edit(dice.below(3) as usize),
            14 | 15 => Action::EditThen(dice.below(3) as usize, Fault::KillServe(dice.below(3))),
            16 => Action::EditThen(dice.below(3) as usize, Fault::RestartApiserver),
            17 => Action::EditThen(dice.below(3) as usize, Fault::PauseEtcd(10 + dice.below(21))),
            4 | 5 => Action::Apply,
            6 | 7 => Action::ServerSideApply,
            8 | 9 => Action::Replace,
            10 => Action::Scale(1 + dice.below(3) as u32),
            11 | 12 => Action::Undo("deployment/web"),
            18 => Action::Undo("daemonset/agent"),
            19 => Action::PauseOrResume,
            13 => Action::Wait(dice.below(4)),
            _ => unreachable!(),
        }
    }

    /// Whether the step may move a pod template: a source changes, or the
    /// user rolls the workload.
    fn has_reason(self) -> bool {
        matches!(self, Action::Edit(_) | Action::EditThen(..) | Action::Undo(_))
    }
}

fn source(index: usize, value: u64) -> Value {
    let (kind, name, key) = SOURCES[index];
    if kind == "secret" {
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "stringData": {key: value.to_string()}})
    } else {
        config_map(name, json!({key: value.to_string()}))
    }
}

/// The manifests a GitOps tool holds: each workload as git has it.
fn manifests() -> Vec<Value> {
    let refs = json!([{"configMapRef": {"name": "a"}}, {"configMapRef": {"name": "b"}}, {"secretRef": {"name": "s"}}]);
    vec![
        // Renewal on, never due within a history: a re-sync must not renew.
        workload(
            "Deployment",
            "web",
            json!({"config-snapshot.io/watch": "*", "config-snapshot.io/renew-duration": "24h"}),
            "web:1",
            refs.clone(),
            5,
        ),
        workload(
            "Deployment",
            "api",
            json!({"config-snapshot.io/watch": "configmap/b"}),
            "api:1",
            json!([{"configMapRef": {"name": "b"}}]),
            5,
        ),
        workload(
            "StatefulSet",
            "db",
            json!({"config-snapshot.io/watch": "a"}),
            "db:1",
            json!([{"configMapRef": {"name": "a"}}]),
            5,
        ),
        workload(
            "DaemonSet",
            "agent",
            json!({"config-snapshot.io/watch": "*"}),
            "agent:1",
            json!([{"configMapRef": {"name": "b"}}, {"secretRef": {"name": "s"}}]),
            5,
        ),
    ]
}

/// Which sources each workload watches, as (kind, name).
fn watched(workload: &str) -> Vec<usize> {
    match workload {
        "web" => vec![0, 1, 2],
        "api" => vec![1],
        "agent" => vec![1, 2],
        _ => vec![0],
    }
}

fn templates(cp: &ControlPlane, ns: &str) -> BTreeMap<String, Value> {
    manifests()
        .iter()
        .map(|m| {
            let kind = m["kind"].as_str().unwrap();
            let name = m["metadata"]["name"].as_str().unwrap();
            let live = cp.get(ns, kind, name).unwrap_or(Value::Null);
            (name.to_string(), live["spec"]["template"].clone())
        })
        .collect()
}

fn is_paused(cp: &ControlPlane, ns: &str, kind: &str, name: &str) -> bool {
    cp.get(ns, kind, name).is_some_and(|w| w["spec"]["paused"] == true)
}

fn sync(cp: &ControlPlane, ns: &str, how: &[&str]) {
    let list = json!({"apiVersion": "v1", "kind": "List", "items": manifests()});
    let mut args = vec!["-n", ns];
    args.extend_from_slice(how);
    args.extend(["-f", "-"]);
    cp.try_kubectl(&args, Some(&list.to_string()))
        .unwrap_or_else(|e| panic!("{e}"));
}

/// Every fault once, each right after a source edit, among the three ways
/// of re-syncing and a rollback: the history CI always runs.
const TOUR: [Action; 14] = [
    Action::Edit(0),
    Action::EditThen(1, Fault::KillServe(1)),
    Action::Replace,
    Action::Undo("deployment/web"),
    Action::PauseOrResume,
    Action::Edit(1),
    Action::Undo("daemonset/agent"),
    Action::ServerSideApply,
    Action::EditThen(2, Fault::RestartApiserver),
    Action::Apply,
    Action::EditThen(0, Fault::PauseEtcd(10)),
    Action::Replace,
    Action::Scale(2),
    Action::PauseOrResume,
];

/// One history, of `steps` random actions from `seed`, or of `script`;
/// returns the steps it took.
fn history(
    cp: &ControlPlane,
    serve: &mut ServeProcess,
    kubeconfig: &Path,
    seed: u64,
    steps: usize,
    script: Option<&[Action]>,
) -> usize {
    let steps = script.map_or(steps, <[Action]>::len);
    let ns = format!("history-{seed}");
    cp.namespace(&ns);
    let mut dice = Dice::new(seed);
    let mut values = [0u64; 3];
    for (i, v) in values.iter().enumerate() {
        cp.apply(&ns, &source(i, *v));
    }
    sync(cp, &ns, &["apply"]);
    settle(cp, &ns);
    let mut undone: BTreeSet<String> = BTreeSet::new();
    let mut log: Vec<String> = Vec::new();
    for step in 0..steps {
        let action = match script {
            Some(actions) => actions[step],
            None => Action::roll(&mut dice),
        };
        log.push(format!("{step}: {action:?}"));
        let said = || format!("seed {seed}, history so far:\n  {}", log.join("\n  "));
        let before = templates(cp, &ns);
        match action {
            Action::Edit(i) => {
                values[i] += 1;
                cp.apply(&ns, &source(i, values[i]));
            }
            Action::EditThen(i, fault) => {
                values[i] += 1;
                cp.apply(&ns, &source(i, values[i]));
                match fault {
                    Fault::KillServe(down) => {
                        serve.stop();
                        std::thread::sleep(Duration::from_secs(down));
                        serve.restart(kubeconfig, &serve_flags("{}"));
                        serve.wait_ready();
                    }
                    Fault::RestartApiserver => cp.control(&["restart-apiserver"]),
                    Fault::PauseEtcd(secs) => cp.control(&["pause-etcd", &secs.to_string()]),
                }
            }
            Action::Apply => sync(cp, &ns, &["apply"]),
            Action::ServerSideApply => sync(
                cp,
                &ns,
                &["apply", "--server-side", "--field-manager=gitops", "--force-conflicts"],
            ),
            Action::Replace => sync(cp, &ns, &["replace"]),
            Action::Scale(n) => {
                cp.kubectl(&["-n", &ns, "scale", "deployment/web", &format!("--replicas={n}")]);
            }
            Action::Undo(which) => {
                // Only once it has a revision to go back to (and, for a
                // Deployment, while it is not paused).
                if cp.try_kubectl(&["-n", &ns, "rollout", "undo", which], None).is_ok() {
                    undone.insert(which.split('/').nth(1).unwrap().into());
                }
            }
            Action::PauseOrResume => {
                // As it is live: a replace of the manifest resumes it.
                let paused = is_paused(cp, &ns, "Deployment", "api");
                let verb = if paused { "resume" } else { "pause" };
                cp.kubectl(&["-n", &ns, "rollout", verb, "deployment/api"]);
                if paused {
                    // Resumed, it runs what its sources hold now.
                    settle(cp, &ns);
                    for &i in &watched("api") {
                        let (kind, name, key) = SOURCES[i];
                        let expected = json!({key: values[i].to_string()});
                        eventually_or(
                            &format!("the resumed api to run {kind}/{name} = {expected} (step {step})"),
                            60,
                            said,
                            || {
                                (effective(&cp.objects(&ns), "Deployment", "api", &ns, &format!("{kind}/{name}"))
                                    == expected)
                                    .then_some(())
                            },
                        );
                    }
                }
            }
            Action::Wait(secs) => std::thread::sleep(Duration::from_secs(secs)),
        }
        settle(cp, &ns);
        no_dangling(&cp.objects(&ns), &said());
        if !action.has_reason() {
            let after = templates(cp, &ns);
            for (name, template) in &before {
                if after.get(name) != Some(template) {
                    let logs: Vec<String> = serve
                        .logs()
                        .lines()
                        .filter(|l| l.contains(&ns) || l.contains(name.as_str()))
                        .map(String::from)
                        .collect();
                    panic!(
                        "{name} rolled out without a reason at step {step}; {}\nbefore: {template}\nafter: {}\nlive: {}\nserve:\n{}",
                        said(),
                        after.get(name).cloned().unwrap_or_default(),
                        ["deployment", "statefulset", "daemonset"]
                            .iter()
                            .filter_map(|k| cp
                                .try_kubectl(&["-n", &ns, "get", k, name, "-o", "json", "--show-managed-fields"], None)
                                .ok())
                            .collect::<String>(),
                        logs[logs.len().saturating_sub(40)..].join("\n")
                    );
                }
            }
        }
        if let Action::Edit(i) | Action::EditThen(i, _) = action {
            let (kind, name, key) = SOURCES[i];
            let expected = json!({key: values[i].to_string()});
            for m in manifests() {
                let workload = m["metadata"]["name"].as_str().unwrap().to_string();
                let kind_of = m["kind"].as_str().unwrap().to_string();
                // Paused, a Deployment runs what it ran: the new content
                // comes with the resume (checked there).
                if undone.contains(&workload)
                    || !watched(&workload).contains(&i)
                    || is_paused(cp, &ns, &kind_of, &workload)
                {
                    continue;
                }
                let id = format!("{kind}/{name}");
                eventually_or(
                    &format!("{kind_of}/{workload} to run {id} = {expected} (step {step})"),
                    // The resync interval (5 s), the storm guard, the
                    // watcher's relist backoff after a fault, and slack.
                    60,
                    || {
                        let logs: Vec<String> = serve
                            .logs()
                            .lines()
                            .filter(|l| l.contains(&ns))
                            .map(String::from)
                            .collect();
                        format!(
                            "{}\nlive: {}\nserve:\n{}",
                            said(),
                            cp.get(&ns, &kind_of, &workload).unwrap_or_default(),
                            logs[logs.len().saturating_sub(30)..].join("\n")
                        )
                    },
                    || (effective(&cp.objects(&ns), &kind_of, &workload, &ns, &id) == expected).then_some(()),
                );
            }
            settle(cp, &ns);
        }
    }
    eprintln!("history {seed}: {}", log.join("; "));
    steps
}

/// Runs the histories; returns (histories, steps).
pub fn random_histories(cp: &ControlPlane, serve: &mut ServeProcess, kubeconfig: &Path) -> (usize, usize) {
    let env = |name: &str, default: u64| std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default);
    let first = env("HISTORY_SEED", 1);
    let count = env("HISTORIES", 1);
    let steps = env("HISTORY_STEPS", 10) as usize;
    let until = Instant::now() + Duration::from_secs(env("SOAK_SECONDS", 0));
    // One serve configuration throughout, the one a fault restarts it
    // with: the parts before may have left it running with other flags (the
    // scenarios sign with replay's key), and a restart under another key
    // would make every snapshot made before it unproven.
    serve.restart(kubeconfig, &serve_flags("{}"));
    serve.wait_ready();
    let mut done = (1, history(cp, serve, kubeconfig, 0, 0, Some(&TOUR)));
    // The last fault, once: two replicas on a real Lease, the leader
    // killed mid-storm.
    super::fleet::leader_killed_mid_storm(cp, serve, kubeconfig, "fleet-0");
    let mut failovers = 1;
    let mut seed = first;
    while seed < first + count || Instant::now() < until {
        done.1 += history(cp, serve, kubeconfig, seed, steps, None);
        done.0 += 1;
        seed += 1;
        // A soak meets the failover again every few histories.
        if Instant::now() < until && seed % 4 == 0 {
            super::fleet::leader_killed_mid_storm(cp, serve, kubeconfig, &format!("fleet-{seed}"));
            failovers += 1;
        }
    }
    eprintln!(
        "random histories: {} histories, {} steps, seeds {first}..{seed}, {failovers} leader failovers",
        done.0, done.1
    );
    done
}
