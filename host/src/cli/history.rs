//! `history` and `diff`: which config each revision of a workload runs, read
//! from the current kubeconfig's cluster or from a replayed scenario.

use std::process::ExitCode;

use anyhow::Result;
use config_snapshot::tools::history;

use super::ReadFrom;

/// Which config each revision of a workload runs: every revision its
/// controller keeps, oldest first, with its images and, per source, the
/// snapshot it pins and the keys changed since the revision before.
#[derive(Debug, clap::Args)]
pub struct HistoryArgs {
    /// The workload: deploy/NAME, sts/NAME or ds/NAME.
    workload: String,
    #[command(flatten)]
    cluster: ReadFrom,
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
    cluster: ReadFrom,
}

impl HistoryArgs {
    fn history(&self) -> Result<history::History> {
        read(&self.cluster, &self.workload)
    }
}

/// The history of `workload`, from the cluster `from` names.
fn read(from: &ReadFrom, workload: &str) -> Result<history::History> {
    let target = history::Target::parse(workload)?;
    if let Some(sim) = from.replayed()? {
        let namespace = from.namespace_in(None);
        return history::history(&sim, &target, &namespace, sim.now());
    }
    super::runtime()?.block_on(async {
        let client = super::client().await?;
        let namespace = from.namespace_in(Some(&client));
        let objects = history::fetch(client, &target, &namespace).await?;
        history::history(
            &objects,
            &target,
            &namespace,
            config_snapshot_policy::model::duration::unix_now(),
        )
    })
}

pub fn history(args: HistoryArgs) -> Result<ExitCode> {
    let history = args.history()?;
    if args.cluster.json() {
        println!("{}", serde_json::to_string_pretty(&history)?);
    } else {
        print!("{}", history::render_history(&history, history::Style::for_stdout()));
    }
    Ok(ExitCode::SUCCESS)
}

pub fn diff(args: DiffArgs) -> Result<ExitCode> {
    let history = read(&args.cluster, &args.workload)?;
    let diff = history::diff(&history, args.from, args.to)?;
    if args.cluster.json() {
        println!("{}", serde_json::to_string_pretty(&diff)?);
    } else {
        print!("{}", history::render_diff(&diff, history::Style::for_stdout()));
    }
    Ok(ExitCode::from(if diff.differs() { 1 } else { 0 }))
}
