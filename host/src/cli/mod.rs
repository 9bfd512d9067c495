//! The commands of the `config-snapshot` binary, one module each, with
//! their arguments: `main.rs` only parses and dispatches.

pub mod approve;
pub mod history;
pub mod keyring;
pub mod module;
pub mod oci;
pub mod plan;
pub mod release;
pub mod replay;
pub mod review;
pub mod revoke;

use std::path::PathBuf;

use anyhow::{anyhow, Context as _, Result};

/// `--policy`, else `$CONFIG_SNAPSHOT_POLICY`, else the workspace's build.
pub fn policy_path(explicit: Option<PathBuf>) -> Result<PathBuf> {
    if let Some(p) = explicit.or_else(|| std::env::var_os("CONFIG_SNAPSHOT_POLICY").map(PathBuf::from)) {
        return Ok(p);
    }
    let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let candidates = [
        PathBuf::from("policy.wasm"),
        workspace.join("policy.wasm"),
        workspace.join("target/wasm32-wasip1/policy/config_snapshot_policy.wasm"),
    ];
    candidates
        .into_iter()
        .find(|p| p.exists())
        .ok_or_else(|| anyhow!("no policy wasm found: run `make policy.wasm` or pass --policy"))
}

pub fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
}

/// Where the reading commands (`history`, `diff`, `plan`, `status`) read the
/// cluster: the current kubeconfig's, or the one a replayed scenario leaves.
#[derive(Debug, clap::Args)]
pub struct ReadFrom {
    /// The namespace (default: the kubeconfig context's, or `default` with
    /// --scenario; `plan` takes the manifest's first).
    #[arg(short, long)]
    pub namespace: Option<String>,
    /// Read the cluster a replay of this scenario leaves behind instead of
    /// the current kubeconfig's.
    #[arg(long, value_name = "FILE")]
    pub scenario: Option<PathBuf>,
    /// With --scenario: the policy wasm.
    #[arg(long)]
    pub policy: Option<PathBuf>,
    /// text (aligned, colour on a terminal unless NO_COLOR) or json.
    #[arg(short, long, default_value = "text", value_parser = ["text", "json"])]
    pub output: String,
}

impl ReadFrom {
    /// The simulator a replay of `--scenario` leaves, if one was named. A
    /// scenario that does not pass is still read, with a word on stderr.
    pub fn replayed(&self) -> Result<Option<config_snapshot::replay::simulator::Simulator>> {
        let Some(path) = &self.scenario else {
            return Ok(None);
        };
        let engine = std::sync::Arc::new(config_snapshot::kubewarden::engine::Engine::load(&policy_path(
            self.policy.clone(),
        )?)?);
        let (result, sim) = config_snapshot::replay::run_to_end(engine, path)?;
        if let Some(failure) = result.failure() {
            eprintln!("config-snapshot: the scenario did not pass ({failure}); reading the cluster it left");
        }
        Ok(Some(sim))
    }

    /// The namespace to read: `--namespace`, else `default` in a replayed
    /// scenario, else the kubeconfig context's.
    pub fn namespace_in(&self, client: Option<&kube::Client>) -> String {
        self.namespace
            .clone()
            .unwrap_or_else(|| client.map_or_else(|| "default".to_string(), |c| c.default_namespace().to_string()))
    }

    pub fn json(&self) -> bool {
        self.output == "json"
    }
}

/// The policy's settings as installed, from a file (JSON or YAML, the
/// chart's `settings`); none: the defaults.
pub fn settings_file(path: Option<&PathBuf>) -> Result<config_snapshot_policy::model::settings::Settings> {
    use config_snapshot_policy::model::settings::Settings;
    let Some(path) = path else {
        return Ok(Settings::default());
    };
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let value: serde_json::Value =
        serde_yaml_ng::from_str(&text).with_context(|| format!("{}: not YAML or JSON", path.display()))?;
    Settings::from_json(value.to_string().as_bytes()).map_err(|e| anyhow!("{}: {e}", path.display()))
}

/// A client for the current kubeconfig's cluster (or the in-cluster one).
pub async fn client() -> Result<kube::Client> {
    config_snapshot::use_ring_for_tls();
    kube::Client::try_default()
        .await
        .context("connecting to the API server (KUBECONFIG or in-cluster config)")
}
