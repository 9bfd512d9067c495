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

/// The policy's settings from a file (JSON or YAML, the chart's
/// `settings`); none: the defaults.
pub fn settings_file(path: Option<&PathBuf>) -> Result<config_snapshot_policy::model::settings::Settings> {
    use config_snapshot_policy::model::settings::Settings;
    let Some(path) = path else {
        return Ok(Settings::default());
    };
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    settings_text(&text).map_err(|e| anyhow!("{}: {e}", path.display()))
}

fn settings_text(text: &str) -> Result<config_snapshot_policy::model::settings::Settings> {
    let value: serde_json::Value = serde_yaml_ng::from_str(text).context("not YAML or JSON")?;
    Ok(config_snapshot_policy::model::settings::Settings::from_json(
        value.to_string().as_bytes(),
    )?)
}

/// The ConfigMap serve's settings are in (deploy/serve/settings.yaml, and
/// the chart's for a release named config-snapshot), and its key.
pub const SETTINGS_CONFIGMAP: &str = "config-snapshot-settings";
const SETTINGS_KEY: &str = "settings.json";

/// Where a command reading a live cluster finds the settings it judges by.
#[derive(Debug, Clone, clap::Args)]
pub struct InstalledSettings {
    /// The policy's settings (JSON or YAML; the chart's `settings`) instead
    /// of serve's own, read from its settings ConfigMap. A scenario brings
    /// its own.
    #[arg(long, value_name = "FILE")]
    pub settings: Option<PathBuf>,
    /// serve's namespace, where its settings ConfigMap is.
    #[arg(long, value_name = "NAMESPACE", default_value = "config-snapshot")]
    pub serve_namespace: String,
    /// serve's settings ConfigMap (the chart's `<release>-settings`).
    #[arg(long, value_name = "NAME", default_value = SETTINGS_CONFIGMAP)]
    pub settings_configmap: String,
}

impl InstalledSettings {
    /// `--settings FILE` if given; else serve's, as installed; else (no
    /// such ConfigMap, or not readable by you) the defaults, said on
    /// stderr: a plan judged by other settings than serve's says so.
    pub async fn read(&self, client: &kube::Client) -> Result<config_snapshot_policy::model::settings::Settings> {
        use config_snapshot_policy::model::settings::Settings;
        if self.settings.is_some() {
            return settings_file(self.settings.as_ref());
        }
        let api: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
            kube::Api::namespaced(client.clone(), &self.serve_namespace);
        let at = format!("ConfigMap {}/{}", self.serve_namespace, self.settings_configmap);
        match api.get_opt(&self.settings_configmap).await {
            Ok(Some(cm)) => {
                let text = cm
                    .data
                    .and_then(|mut d| d.remove(SETTINGS_KEY))
                    .ok_or_else(|| anyhow!("{at} has no {SETTINGS_KEY}"))?;
                settings_text(&text).with_context(|| format!("serve's settings in {at}"))
            }
            Ok(None) => {
                eprintln!(
                    "config-snapshot: no {at}; judging by the default settings (--serve-namespace and --settings-configmap name serve's, --settings FILE gives them)"
                );
                Ok(Settings::default())
            }
            Err(kube::Error::Api(status)) if status.code == 403 => {
                eprintln!(
                    "config-snapshot: you may not read {at}; judging by the default settings (--settings FILE gives them)"
                );
                Ok(Settings::default())
            }
            Err(e) => Err(e).with_context(|| format!("reading serve's settings in {at}")),
        }
    }
}

/// A client for the current kubeconfig's cluster (or the in-cluster one).
pub async fn client() -> Result<kube::Client> {
    config_snapshot::use_ring_for_tls();
    kube::Client::try_default()
        .await
        .context("connecting to the API server (KUBECONFIG or in-cluster config)")
}
