//! `plan -f FILE`: what applying a ConfigMap or Secret would roll, read from
//! the current kubeconfig's cluster or from a replayed scenario; nothing is
//! written (`config_snapshot::tools::impact`).

use config_snapshot_policy::model::object::ObjectExt;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{anyhow, Context as _, Result};
use config_snapshot::tools::impact::{impact, render, stored_form, Impact, Judging};
use config_snapshot_policy::model::duration::parse_go_duration;
use config_snapshot_policy::model::keys;
use config_snapshot_policy::model::kinds::WorkloadKind;
use serde_json::Value;

use super::ReadFrom;

/// What applying a ConfigMap or Secret would roll: each workload that
/// references it, through which references and keys, whether it would
/// roll and why not, and the key-level diff (Secrets by key name only).
/// Reads; never writes.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The manifest: one ConfigMap or Secret (YAML or JSON; `-` for stdin).
    #[arg(short = 'f', long = "filename")]
    file: PathBuf,
    #[command(flatten)]
    from: ReadFrom,
    #[command(flatten)]
    settings: super::InstalledSettings,
    /// serve's --watch-min-interval (the storm guard), without --scenario.
    #[arg(long, default_value = "30s", value_parser = |t: &str| parse_go_duration(t).map(Duration::from_secs))]
    watch_min_interval: Duration,
}

fn manifest(path: &PathBuf) -> Result<Value> {
    let text = if path.as_os_str() == "-" {
        std::io::read_to_string(std::io::stdin()).context("reading stdin")?
    } else {
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?
    };
    serde_yaml_ng::from_str(&text).with_context(|| format!("{}: not a YAML or JSON object", path.display()))
}

pub fn run(args: Args) -> Result<ExitCode> {
    let (kind, new) = stored_form(manifest(&args.file)?)?;
    let name = new.name().to_string();
    let impact = match args.from.replayed()? {
        Some(sim) => {
            let namespace = namespace_of(&new, args.from.namespace.clone(), "default");
            let objects = sim.objects();
            let workloads: Vec<Value> = objects
                .iter()
                .filter(|o| o.namespace() == Some(namespace.as_str()))
                .filter(|o| o["kind"].as_str().and_then(WorkloadKind::from_kind).is_some())
                .cloned()
                .collect();
            let live = sim.get(kind.kind(), &namespace, &name);
            let snapshots: Vec<Value> = objects
                .iter()
                .filter(|o| o.namespace() == Some(namespace.as_str()) && o["kind"] == "ConfigMap")
                .filter(|o| keys::is_snapshot(o))
                .cloned()
                .collect();
            impact(
                &new,
                live.as_ref(),
                &workloads,
                &namespace,
                &Judging {
                    settings: &sim.effect_rules.settings,
                    snapshots: &snapshots,
                    watch_min_interval: sim.effect_rules.watch_min_interval,
                    now: sim.now(),
                },
            )?
        }
        None => super::runtime()?.block_on(online(&args, &new, kind.kind(), &name))?,
    };
    if args.from.json() {
        println!("{}", serde_json::to_string_pretty(&impact)?);
    } else {
        print!("{}", render(&impact));
    }
    Ok(ExitCode::SUCCESS)
}

fn namespace_of(new: &Value, flag: Option<String>, default: &str) -> String {
    new.namespace()
        .map(str::to_string)
        .or(flag)
        .unwrap_or_else(|| default.to_string())
}

/// Reads the namespace's workloads and the object as it is, with kube-rs.
async fn online(args: &Args, new: &Value, kind: &str, name: &str) -> Result<Impact> {
    use config_snapshot::serve::view::cache::{api_resource, trim};
    use kube::api::{Api, DynamicObject, ListParams};
    let client = super::client().await?;
    let settings = &args.settings.read(&client).await?;
    let namespace = namespace_of(new, args.from.namespace.clone(), client.default_namespace());
    let api = |kind: &str| -> Result<(Api<DynamicObject>, kube::discovery::ApiResource)> {
        let resource = api_resource(kind).ok_or_else(|| anyhow!("{kind}: not a kind of the table"))?;
        Ok((Api::namespaced_with(client.clone(), &namespace, &resource), resource))
    };
    let (sources, resource) = api(kind)?;
    let live = sources
        .get_opt(name)
        .await
        .map_err(|e| anyhow!("reading {kind}/{name}: {e}"))?
        .map(|o| trim(o, &resource));
    let mut workloads = Vec::new();
    for workload in WorkloadKind::all() {
        let (api, resource) = api(workload.kind())?;
        match api.list(&ListParams::default()).await {
            Ok(list) => workloads.extend(list.items.into_iter().map(|o| trim(o, &resource))),
            // A kind the cluster does not serve (Argo Rollouts not installed).
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(e) => return Err(anyhow!("listing {}s in {namespace}: {e}", workload.kind())),
        }
    }
    let (configmaps, resource) = api("ConfigMap")?;
    let snapshots: Vec<Value> = configmaps
        .list(&ListParams::default().labels(&format!("{}={}", keys::MANAGED_BY, keys::MANAGED_BY_VALUE)))
        .await
        .map_err(|e| anyhow!("listing the snapshots in {namespace}: {e}"))?
        .items
        .into_iter()
        .map(|o| trim(o, &resource))
        .collect();
    impact(
        new,
        live.as_ref(),
        &workloads,
        &namespace,
        &Judging {
            settings,
            snapshots: &snapshots,
            watch_min_interval: args.watch_min_interval.as_secs() as i64,
            now: config_snapshot_policy::model::duration::unix_now(),
        },
    )
}
