//! `config-snapshot revoke`: a leaked Secret's (or a ConfigMap's) earlier
//! contents gone for good (`config_snapshot::tools::revoke`).

use std::process::ExitCode;

use anyhow::{anyhow, Result};
use config_snapshot::tools::revoke::decide::Options;
use config_snapshot::tools::revoke::run::{revoke, Settings};
use config_snapshot_policy::model::kinds::{self, Role};
use config_snapshot_policy::model::source::SourceId;

/// Deletes every snapshot of a Secret or ConfigMap but the one of its
/// current content, and records it in the namespace (ConfigMap
/// config-snapshot-revocations): from then on `rollout undo` to a revision
/// that names one is refused, and that content is never snapshotted again.
/// Rotate the Secret first. Runs with your kubeconfig.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The source: secret/NAME or configmap/NAME.
    source: String,
    /// The namespace (default: the kubeconfig context's).
    #[arg(short, long)]
    namespace: Option<String>,
    /// Revoke the snapshots of its current content too (rotate the Secret
    /// first, or no workload can take a new snapshot of it).
    #[arg(long)]
    current: bool,
    /// Revoke although a workload's template, a revision in use or a Pod
    /// names the snapshot: its pods then fail to start. Without it the run
    /// is refused, and says what to roll forward first.
    #[arg(long)]
    running: bool,
    /// Print what would be done; change nothing.
    #[arg(long)]
    dry_run: bool,
}

fn source(text: &str) -> Result<SourceId> {
    let (kind, name) = text
        .split_once('/')
        .filter(|(_, n)| !n.is_empty())
        .ok_or_else(|| anyhow!("{text:?}: name the source as secret/NAME or configmap/NAME"))?;
    match kinds::named(kind).map(|k| k.role) {
        Some(Role::Source(kind)) => Ok(SourceId::new(kind, name)),
        _ => Err(anyhow!("{kind}: revoke takes a Secret or a ConfigMap")),
    }
}

pub fn run(args: Args) -> Result<ExitCode> {
    let source = source(&args.source)?;
    super::runtime()?.block_on(async move {
        let client = super::client().await?;
        let settings = Settings {
            source,
            namespace: args.namespace.unwrap_or_else(|| client.default_namespace().to_string()),
            options: Options {
                current: args.current,
                running: args.running,
            },
            dry_run: args.dry_run,
        };
        let mut out = String::new();
        let result = revoke(client, &settings, &mut out).await;
        print!("{}", config_snapshot::tools::printable_lines(&out));
        let outcome = result?;
        if !outcome.refused && !settings.dry_run && outcome.deleted > 0 {
            println!("revoked {} snapshots of {}", outcome.deleted, settings.source);
        }
        Ok(if outcome.refused || !outcome.still_named.is_empty() {
            ExitCode::from(1)
        } else {
            ExitCode::SUCCESS
        })
    })
}
