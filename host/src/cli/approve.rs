//! `status` and `approve`: what a workload's watched changes wait for, and
//! the approval of one (`config_snapshot::tools::status`).

use config_snapshot_policy::model::object::ObjectExt;
use std::process::ExitCode;

use anyhow::{anyhow, Result};
use config_snapshot::tools::history::Target;
use config_snapshot::tools::printable;
use config_snapshot::tools::status::{approval, pinned, render, status, Around};
use config_snapshot_policy::model::duration::unix_now;
use config_snapshot_policy::model::keys;
use config_snapshot_policy::model::settings::Settings;
use config_snapshot_policy::model::source::SourceId;
use serde_json::Value;

use super::ReadFrom;

/// What a workload's watched changes wait for: its watch mode, its rollout
/// window (open or when it opens), the changes pending and approved, its
/// last watch rollout and rollback.
#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    /// The workload: deploy/NAME, sts/NAME or ds/NAME.
    workload: String,
    #[command(flatten)]
    from: ReadFrom,
    /// The settings decide which sources a workload pins, and so watches.
    #[command(flatten)]
    settings: super::InstalledSettings,
}

/// Approve a workload's pending watch rollout (watch mode `approve`): it
/// rolls out within seconds. Refused when what you name is no longer
/// pending: its source changed again since you looked.
#[derive(Debug, clap::Args)]
pub struct ApproveArgs {
    /// The workload: deploy/NAME, sts/NAME or ds/NAME.
    workload: String,
    /// Approve only this pending snapshot (as `status` or the
    /// RolloutPending Event names it); repeatable. By default, every
    /// pending change.
    #[arg(long = "snapshot", value_name = "NAME")]
    snapshots: Vec<String>,
    /// The namespace (default: the kubeconfig context's).
    #[arg(short, long)]
    namespace: Option<String>,
}

/// What `status` read: the workload, the settings, the sources it pins
/// (and those it could not read), the clock.
type Read = (Value, Settings, Vec<Value>, Vec<SourceId>, i64);

pub fn status_command(args: StatusArgs) -> Result<ExitCode> {
    let target = Target::parse(&args.workload)?;
    let (workload, settings, sources, unread, now): Read = match args.from.replayed()? {
        Some(sim) => {
            let namespace = args.from.namespace_in(None);
            let workload = sim
                .get(target.kind.kind(), &namespace, &target.name)
                .ok_or_else(|| anyhow!("{target} not found in namespace {namespace}"))?;
            let settings = sim.effect_rules.settings.clone();
            let sources = pinned(&workload, &settings)
                .iter()
                .filter_map(|id| sim.get(id.kind.kind(), &namespace, &id.name))
                .collect();
            (workload, settings, sources, Vec::new(), sim.now())
        }
        None => super::runtime()?.block_on(async {
            let client = super::client().await?;
            let settings = args.settings.read(&client).await?;
            let namespace = args.from.namespace_in(Some(&client));
            let workload = read(&client, &target, &namespace).await?;
            let (sources, unread) = read_pinned(&client, &namespace, &pinned(&workload, &settings)).await;
            Ok::<_, anyhow::Error>((workload, settings, sources, unread, unix_now()))
        })?,
    };
    let around = Around {
        settings: &settings,
        sources: &sources,
        unread: &unread,
    };
    let status = status(&target, &workload, &around, now);
    if args.from.json() {
        println!("{}", serde_json::to_string_pretty(&status)?);
    } else {
        print!("{}", render(&status, now));
    }
    Ok(ExitCode::SUCCESS)
}

pub fn approve_command(args: ApproveArgs) -> Result<ExitCode> {
    let target = Target::parse(&args.workload)?;
    super::runtime()?.block_on(async {
        let client = super::client().await?;
        let namespace = args
            .namespace
            .clone()
            .unwrap_or_else(|| client.default_namespace().to_string());
        let workload = read(&client, &target, &namespace).await?;
        let approved = match approval(&target, &workload, &args.snapshots) {
            Ok(approved) => approved,
            Err(refused) => {
                eprintln!("config-snapshot: refused: {}", printable(&refused.to_string()));
                return Ok(ExitCode::from(1));
            }
        };
        // Pinned to the version read: a change recorded meanwhile is
        // judged again by whoever runs this again.
        let patch = serde_json::json!({"metadata": {
            "resourceVersion": workload.meta("resourceVersion"),
            "annotations": {keys::APPROVE: approved.to_string()},
        }});
        api(&client, &target, &namespace)
            .patch(
                &target.name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&patch),
            )
            .await
            .map_err(|e| anyhow!("approving on {target}: {e}"))?;
        println!(
            "approved on {target}: {}; it rolls out within seconds (see `config-snapshot status {target}`)",
            printable(&approved.to_string())
        );
        Ok(ExitCode::SUCCESS)
    })
}

fn api(client: &kube::Client, target: &Target, namespace: &str) -> kube::Api<kube::api::DynamicObject> {
    let resource =
        config_snapshot::serve::view::cache::api_resource(target.kind.kind()).expect("a workload kind of the table");
    kube::Api::namespaced_with(client.clone(), namespace, &resource)
}

/// The metadata of each of `ids` (what a source says of its readers is
/// there, and a Secret's data is not read), and the ids it could not get.
/// A source that does not exist is neither.
async fn read_pinned(client: &kube::Client, namespace: &str, ids: &[SourceId]) -> (Vec<Value>, Vec<SourceId>) {
    let (mut read, mut unread) = (Vec::new(), Vec::new());
    for id in ids {
        let resource =
            config_snapshot::serve::view::cache::api_resource(id.kind.kind()).expect("a source kind of the table");
        let api: kube::Api<kube::api::DynamicObject> = kube::Api::namespaced_with(client.clone(), namespace, &resource);
        match api.get_metadata_opt(&id.name).await {
            Ok(Some(meta)) => read.push(serde_json::json!({"kind": id.kind.kind(), "metadata": meta.metadata})),
            Ok(None) => {}
            Err(_) => unread.push(id.clone()),
        }
    }
    (read, unread)
}

async fn read(client: &kube::Client, target: &Target, namespace: &str) -> Result<Value> {
    let object = api(client, target, namespace)
        .get_opt(&target.name)
        .await
        .map_err(|e| anyhow!("reading {target}: {e}"))?
        .ok_or_else(|| anyhow!("{target} not found in namespace {namespace}"))?;
    Ok(serde_json::to_value(object)?)
}
