//! `history` and `diff`: which config each revision of a workload runs, read
//! from the current kubeconfig's cluster or from a replayed scenario.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context as _, Result};
use config_snapshot::engine::Engine;
use config_snapshot::{history, replay};

/// Which config each revision of a workload runs: every revision its
/// controller keeps, oldest first, with its images and, per source, the
/// snapshot it pins and the keys changed since the revision before.
#[derive(Debug, clap::Args)]
pub struct HistoryArgs {
    /// The workload: deploy/NAME, sts/NAME or ds/NAME.
    workload: String,
    #[command(flatten)]
    cluster: ClusterArgs,
}

/// A unified diff of two revisions' config (Secrets by key name only) and
/// pod templates; exits 1 when they differ, as diff does.
#[derive(Debug, clap::Args)]
pub struct DiffArgs {
    /// The workload: deploy/NAME, sts/NAME or ds/NAME.
    workload: String,
    /// The older revision number.
    from: i64,
    /// The newer revision number.
    to: i64,
    #[command(flatten)]
    cluster: ClusterArgs,
}

/// Where `history` and `diff` read the cluster.
#[derive(Debug, clap::Args)]
struct ClusterArgs {
    /// The workload's namespace (default: the kubeconfig context's, or
    /// `default` with --scenario).
    #[arg(short, long)]
    namespace: Option<String>,
    /// Read the cluster a replay of this scenario leaves behind instead of
    /// the current kubeconfig's.
    #[arg(long, value_name = "FILE")]
    scenario: Option<PathBuf>,
    /// With --scenario: the policy wasm.
    #[arg(long)]
    policy: Option<PathBuf>,
    /// text (aligned, colour on a terminal unless NO_COLOR) or json.
    #[arg(short, long, default_value = "text", value_parser = ["text", "json"])]
    output: String,
}

impl ClusterArgs {
    fn history(&self, workload: &str) -> Result<history::History> {
        let target = history::Target::parse(workload)?;
        match &self.scenario {
            Some(path) => {
                let engine = Arc::new(Engine::load(&super::policy_path(self.policy.clone())?)?);
                let (result, sim) = replay::run_to_end(engine, path)?;
                if let Some(failure) = result.failure() {
                    eprintln!("config-snapshot: the scenario did not pass ({failure}); showing the cluster it left");
                }
                let namespace = self.namespace.clone().unwrap_or_else(|| "default".into());
                history::history(&sim, &target, &namespace, sim.now())
            }
            None => super::runtime()?.block_on(async {
                config_snapshot::use_ring_for_tls();
                let client = kube::Client::try_default()
                    .await
                    .context("connecting to the API server (KUBECONFIG or in-cluster config)")?;
                let namespace = self
                    .namespace
                    .clone()
                    .unwrap_or_else(|| client.default_namespace().to_string());
                let objects = history::fetch(client, &target, &namespace).await?;
                history::history(
                    &objects,
                    &target,
                    &namespace,
                    config_snapshot_policy::duration::unix_now(),
                )
            }),
        }
    }

    fn json(&self) -> bool {
        self.output == "json"
    }
}

pub fn history(args: HistoryArgs) -> Result<ExitCode> {
    let history = args.cluster.history(&args.workload)?;
    if args.cluster.json() {
        println!("{}", serde_json::to_string_pretty(&history)?);
    } else {
        print!("{}", history::render_history(&history, history::Style::for_stdout()));
    }
    Ok(ExitCode::SUCCESS)
}

pub fn diff(args: DiffArgs) -> Result<ExitCode> {
    let history = args.cluster.history(&args.workload)?;
    let diff = history::diff(&history, args.from, args.to)?;
    if args.cluster.json() {
        println!("{}", serde_json::to_string_pretty(&diff)?);
    } else {
        print!("{}", history::render_diff(&diff, history::Style::for_stdout()));
    }
    Ok(ExitCode::from(if diff.differs() { 1 } else { 0 }))
}
