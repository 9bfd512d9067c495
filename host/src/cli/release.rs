//! `config-snapshot release`: leaving config-snapshot after uninstalling
//! serve (docs/install.md, "Uninstall").

use std::process::ExitCode;

use anyhow::{Context as _, Result};
use clap::Args as ClapArgs;

use config_snapshot::tools::release::decide::Options;
use config_snapshot::tools::release::run::{release, Settings};

/// Points workloads back at their sources and deletes the snapshots
/// nothing names, then the signing key once no snapshot is left. Run it
/// after uninstalling serve, with your kubeconfig.
#[derive(ClapArgs)]
pub struct Args {
    /// Also point back workloads whose template change rolls their pods
    /// (Deployments, StatefulSets, DaemonSets, Rollouts): each rolls out
    /// once, to its sources' current content. Without it they keep their
    /// snapshots, and the run says which.
    #[arg(long)]
    roll: bool,
    /// Delete the revisions of pointed-back workloads that still name
    /// snapshots (ReplicaSets without pods, ControllerRevisions not in
    /// use), so that their snapshots go too. `rollout undo` to them is then
    /// gone; without it they keep their snapshots until the history limit
    /// takes them.
    #[arg(long)]
    prune_history: bool,
    /// Print what would be done; change nothing.
    #[arg(long)]
    dry_run: bool,
    /// Only these namespaces (repeat, or comma-separated); the key Secret
    /// is then kept. Default: every namespace.
    #[arg(short, long = "namespace", value_delimiter = ',')]
    namespaces: Vec<String>,
    /// Release although serve's webhook is still registered (it pins the
    /// workloads again as they are pointed back).
    #[arg(long)]
    force: bool,
    /// How long to wait for the rollouts --roll causes.
    #[arg(long, default_value = "10m", value_parser = duration)]
    timeout: std::time::Duration,
    /// serve's namespace, where its key Secret is.
    #[arg(long, default_value = "config-snapshot")]
    serve_namespace: String,
    /// The key Secret's name (serve's --signing-key-secret).
    #[arg(long, default_value = "config-snapshot-signing-key")]
    signing_key_secret: String,
    /// A backup of the key Secret (`kubectl get secret -o yaml`): its keys
    /// prove the snapshots when the Secret went with serve's namespace.
    #[arg(long, value_name = "FILE")]
    signing_key_file: Option<std::path::PathBuf>,
}

fn duration(text: &str) -> Result<std::time::Duration, String> {
    config_snapshot_policy::model::duration::parse_go_duration(text)
        .map(std::time::Duration::from_secs)
        .map_err(|e| format!("{text}: {e}"))
}

pub fn run(args: Args) -> Result<ExitCode> {
    config_snapshot::use_ring_for_tls();
    let settings = Settings {
        options: Options {
            roll: args.roll,
            prune_history: args.prune_history,
        },
        dry_run: args.dry_run,
        namespaces: args.namespaces,
        force: args.force,
        timeout: args.timeout,
        serve_namespace: args.serve_namespace,
        key_secret: args.signing_key_secret,
        key_file: args.signing_key_file,
    };
    super::runtime()?.block_on(async move {
        let client = kube::Client::try_default()
            .await
            .context("connecting to the API server (KUBECONFIG or in-cluster)")?;
        let mut out = String::new();
        let result = release(client, &settings, &mut out).await;
        print!("{}", config_snapshot::tools::printable_lines(&out));
        let outcome = result?;
        println!(
            "{}: {} workloads pointed back, {} revisions pruned, {} snapshots deleted, {} kept{}",
            if settings.dry_run {
                "dry run, would be"
            } else {
                "released"
            },
            outcome.pointed_back,
            outcome.pruned,
            outcome.deleted,
            outcome.kept,
            if outcome.conflicts > 0 {
                format!("; {} changed while read: run release again", outcome.conflicts)
            } else {
                String::new()
            }
        );
        Ok(if outcome.conflicts > 0 {
            ExitCode::from(1)
        } else {
            ExitCode::SUCCESS
        })
    })
}
