//! `config-snapshot`: the host for the config-snapshot policy.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{anyhow, Context as _, Result};
use clap::{Parser, Subcommand};
use serde_json::Value;

use config_snapshot::engine::Engine;
use config_snapshot::memory::Simulator;
use config_snapshot::{annotate, history, interactions, replay, review, serve};

#[derive(Parser)]
#[command(
    name = "config-snapshot",
    version,
    about = "Roll ConfigMaps and Secrets forward and back with the workloads that use them"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

// Parsed once at start: the size of the largest variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Replay scenarios over an in-memory cluster and print a timeline.
    Replay {
        /// Scenario files (YAML).
        #[arg(required = true)]
        scenarios: Vec<PathBuf>,
        /// The policy wasm; defaults to the project's freshly built one.
        #[arg(long)]
        policy: Option<PathBuf>,
        /// Print machine-readable results instead of the timeline.
        #[arg(long)]
        json: bool,
    },
    /// Evaluate AdmissionReview files and print AdmissionReview responses.
    Review {
        /// AdmissionReview v1 files, or bare AdmissionRequest files.
        #[arg(required = true)]
        reviews: Vec<PathBuf>,
        #[arg(long)]
        policy: Option<PathBuf>,
        /// The cluster the policy reads: a multi-document YAML stream.
        #[arg(long)]
        objects: Option<PathBuf>,
        /// Policy settings as JSON.
        #[arg(long, default_value = "{}")]
        settings_json: String,
        /// Answer the policy's host calls from a kwctl interactions file,
        /// as stock Kubewarden (`kwctl run --replay-host-capabilities-interactions`).
        #[arg(long, value_name = "FILE", conflicts_with_all = ["objects", "record_host_capabilities_interactions"])]
        replay_host_capabilities_interactions: Option<PathBuf>,
        /// Answer Kubewarden's reads from `--objects`, as stock Kubewarden,
        /// and write the exchanges to FILE in kwctl's format.
        #[arg(long, value_name = "FILE")]
        record_host_capabilities_interactions: Option<PathBuf>,
    },
    /// Push a policy module to an OCI registry in Kubewarden's layout (what
    /// `kwctl pull` fetches); prints the reference with its digest.
    Push {
        /// The (annotated) policy wasm.
        wasm: PathBuf,
        /// HOST/REPO:TAG, with or without `registry://`.
        reference: String,
        /// Sign the pushed module with this cosign private key (its
        /// password from COSIGN_PASSWORD, as cosign reads it).
        #[arg(long, value_name = "FILE")]
        sign_key: Option<PathBuf>,
        #[command(flatten)]
        registry: config_snapshot::registry::Access,
    },
    /// Pull a policy module from an OCI registry (by tag, or by digest,
    /// which is then verified); prints the reference with its digest.
    Pull {
        /// HOST/REPO:TAG or HOST/REPO@sha256:…, with or without `registry://`.
        reference: String,
        #[arg(short, long)]
        output: PathBuf,
        /// Refuse the module unless its manifest digest is this one.
        #[arg(long)]
        digest: Option<String>,
        #[command(flatten)]
        registry: config_snapshot::registry::Access,
    },
    /// Which config each revision of a workload runs: every revision its
    /// controller keeps, oldest first, with its images and, per source, the
    /// snapshot it pins and the keys changed since the revision before.
    History {
        /// The workload: deploy/NAME, sts/NAME or ds/NAME.
        workload: String,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// A unified diff of two revisions' config (Secrets by key name only)
    /// and pod templates; exits 1 when they differ, as diff does.
    Diff {
        /// The workload: deploy/NAME, sts/NAME or ds/NAME.
        workload: String,
        /// The older revision number.
        from: i64,
        /// The newer revision number.
        to: i64,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// Run the mutating admission webhook against the cluster (HTTPS).
    Serve(serve::Options),
    /// Compile the policy ahead of time for `serve --precompiled`: made by
    /// this build, for this machine's CPU; serve falls back to compiling
    /// when it does not fit.
    Precompile {
        wasm: PathBuf,
        #[arg(short, long)]
        output: PathBuf,
    },
    /// Embed policy metadata in the wasm, as `kwctl annotate` does.
    Annotate {
        /// The policy wasm to annotate.
        wasm: PathBuf,
        #[arg(short, long, default_value = "policy-metadata.yml")]
        metadata: PathBuf,
        /// A usage text to embed (`io.kubewarden.policy.usage`), e.g. README.md.
        #[arg(short, long)]
        usage: Option<PathBuf>,
        #[arg(short, long)]
        output: PathBuf,
    },
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
                let engine = Arc::new(Engine::load(&policy_path(self.policy.clone())?)?);
                let (result, sim) = replay::run_to_end(engine, path)?;
                if let Some(failure) = result.failure() {
                    eprintln!("config-snapshot: the scenario did not pass ({failure}); showing the cluster it left");
                }
                let namespace = self.namespace.clone().unwrap_or_else(|| "default".into());
                history::history(&sim, &target, &namespace, sim.now())
            }
            None => runtime()?.block_on(async {
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

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("config-snapshot: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn run(cli: Cli) -> Result<ExitCode> {
    match cli.command {
        Command::Replay {
            scenarios,
            policy,
            json,
        } => {
            let engine = Arc::new(Engine::load(&policy_path(policy)?)?);
            let mut results = Vec::new();
            for path in &scenarios {
                let result = replay::run(engine.clone(), path)?;
                if !json {
                    replay::print_timeline(&result);
                }
                results.push(result);
            }
            let failed: Vec<String> = results
                .iter()
                .filter_map(|r| r.failure().map(|f| format!("{}: {f}", r.file)))
                .collect();
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(
                        &serde_json::json!({"results": results, "passed": failed.is_empty()})
                    )?
                );
            } else {
                println!("{} passed, {} failed", results.len() - failed.len(), failed.len());
            }
            for f in &failed {
                eprintln!("FAILED {f}");
            }
            Ok(if failed.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        Command::Review {
            reviews,
            policy,
            objects,
            settings_json,
            replay_host_capabilities_interactions: replay_from,
            record_host_capabilities_interactions: record_to,
        } => {
            let settings: Value = serde_json::from_str(&settings_json).context("--settings-json is not JSON")?;
            let engine = Arc::new(Engine::load(&policy_path(policy)?)?);
            if let Err(message) = engine.validate_settings(&settings)? {
                return Err(anyhow!("invalid settings: {message}"));
            }
            if let Some(file) = replay_from {
                let replayer = Arc::new(interactions::Replayer::new(interactions::read(&file)?));
                for path in &reviews {
                    let request = review::read_request(path)?;
                    let response = review::on_host(&engine, &settings, &request, replayer.clone())?;
                    println!("{}", serde_json::to_string(&response)?);
                }
                if replayer.leftovers() > 0 {
                    eprintln!(
                        "config-snapshot: {} recorded exchanges were not replayed",
                        replayer.leftovers()
                    );
                }
                return Ok(ExitCode::SUCCESS);
            }
            let sim = Simulator::new(
                engine.clone(),
                settings.clone(),
                config_snapshot_policy::duration::unix_now(),
            );
            if let Some(path) = objects {
                for object in review::read_objects(&path)? {
                    sim.load(object)?;
                }
            }
            let mut recorded = Vec::new();
            for path in &reviews {
                let request = review::read_request(path)?;
                let response = match &record_to {
                    Some(_) => {
                        let recorder = Arc::new(interactions::Recorder::new(review::cluster_host(&sim, &request)));
                        let response = review::on_host(&engine, &settings, &request, recorder.clone())?;
                        recorded.extend(recorder.exchanges());
                        response
                    }
                    None => {
                        let (admission, mutated) = sim.review_only(&request)?;
                        review::response(&request, &admission.response, mutated.as_ref())?
                    }
                };
                println!("{}", serde_json::to_string(&response)?);
            }
            if let Some(file) = record_to {
                interactions::write(&file, &recorded)?;
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Push {
            wasm,
            reference,
            sign_key,
            registry,
        } => {
            let module = std::fs::read(&wasm).with_context(|| format!("reading {}", wasm.display()))?;
            let target = config_snapshot::registry::reference(&reference)?;
            let runtime = runtime()?;
            let digest = runtime.block_on(config_snapshot::registry::push(&registry, &module, &target))?;
            if let Some(key) = sign_key {
                let pem = std::fs::read(&key).with_context(|| format!("reading {}", key.display()))?;
                let password = std::env::var("COSIGN_PASSWORD").unwrap_or_default();
                runtime.block_on(config_snapshot::registry::sign(
                    &registry,
                    &target,
                    &digest,
                    &pem,
                    password.as_bytes(),
                ))?;
            }
            println!("{target}@{digest}");
            Ok(ExitCode::SUCCESS)
        }
        Command::Pull {
            reference,
            output,
            digest,
            registry,
        } => {
            let source = config_snapshot::registry::reference(&reference)?;
            let module = runtime()?.block_on(config_snapshot::registry::pull(&registry, &source, digest.as_deref()))?;
            std::fs::write(&output, &module.bytes).with_context(|| format!("writing {}", output.display()))?;
            println!("{source}@{}", module.digest);
            Ok(ExitCode::SUCCESS)
        }
        Command::History { workload, cluster } => {
            let history = cluster.history(&workload)?;
            if cluster.json() {
                println!("{}", serde_json::to_string_pretty(&history)?);
            } else {
                print!("{}", history::render_history(&history, history::Style::for_stdout()));
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Diff {
            workload,
            from,
            to,
            cluster,
        } => {
            let history = cluster.history(&workload)?;
            let diff = history::diff(&history, from, to)?;
            if cluster.json() {
                println!("{}", serde_json::to_string_pretty(&diff)?);
            } else {
                print!("{}", history::render_diff(&diff, history::Style::for_stdout()));
            }
            Ok(if diff.differs() {
                ExitCode::from(1)
            } else {
                ExitCode::SUCCESS
            })
        }
        Command::Serve(options) => {
            serve::init_logging(&options.log_format);
            runtime()?.block_on(serve::run(options))?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Precompile { wasm, output } => {
            let module = std::fs::read(&wasm).with_context(|| format!("reading {}", wasm.display()))?;
            std::fs::write(&output, Engine::precompile_for(&module)?)
                .with_context(|| format!("writing {}", output.display()))?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Annotate {
            wasm,
            metadata,
            usage,
            output,
        } => {
            let bytes = std::fs::read(&wasm).with_context(|| format!("reading {}", wasm.display()))?;
            let yaml = std::fs::read_to_string(&metadata).with_context(|| format!("reading {}", metadata.display()))?;
            let usage = usage
                .map(std::fs::read_to_string)
                .transpose()
                .context("reading the usage file")?;
            let json = annotate::metadata_json(&yaml, &bytes, usage.as_deref())?;
            std::fs::write(&output, annotate::embed(&bytes, &json)?)
                .with_context(|| format!("writing {}", output.display()))?;
            eprintln!("annotated {} -> {}", wasm.display(), output.display());
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// `--policy`, else `$CONFIG_SNAPSHOT_POLICY`, else the workspace's build.
fn policy_path(explicit: Option<PathBuf>) -> Result<PathBuf> {
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

fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
}
