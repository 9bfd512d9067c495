//! `review`: AdmissionReview files evaluated like `kwctl run`, over a
//! cluster read from YAML, or as stock Kubewarden from kwctl's recorded host
//! interactions (replayed or recorded).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{anyhow, Context as _, Result};
use config_snapshot::kubewarden::engine::Engine;
use config_snapshot::kubewarden::{admission_review, interactions};
use config_snapshot::replay::simulator::Simulator;
use serde_json::Value;

#[derive(Debug, clap::Args)]
pub struct Args {
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
}

pub fn run(args: Args) -> Result<ExitCode> {
    let settings: Value = serde_json::from_str(&args.settings_json).context("--settings-json is not JSON")?;
    let engine = Arc::new(Engine::load(&super::policy_path(args.policy)?)?);
    if let Err(message) = engine.validate_settings(&settings)? {
        return Err(anyhow!("invalid settings: {message}"));
    }
    if let Some(file) = args.replay_host_capabilities_interactions {
        let replayer = Arc::new(interactions::Replayer::new(interactions::read(&file)?));
        for path in &args.reviews {
            let request = admission_review::read_request(path)?;
            let response = admission_review::on_host(&engine, &settings, &request, replayer.clone())?;
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
        config_snapshot_policy::model::duration::unix_now(),
    );
    if let Some(path) = args.objects {
        for object in admission_review::read_objects(&path)? {
            sim.load(object)?;
        }
    }
    let mut recorded = Vec::new();
    for path in &args.reviews {
        let request = admission_review::read_request(path)?;
        let response = match &args.record_host_capabilities_interactions {
            Some(_) => {
                let recorder = Arc::new(interactions::Recorder::new(sim.dry_run_host(&request)));
                let response = admission_review::on_host(&engine, &settings, &request, recorder.clone())?;
                recorded.extend(recorder.exchanges());
                response
            }
            None => {
                let (admission, mutated) = sim.review_only(&request)?;
                admission_review::response(&request, &admission.response, mutated.as_ref())?
            }
        };
        println!("{}", serde_json::to_string(&response)?);
    }
    if let Some(file) = args.record_host_capabilities_interactions {
        interactions::write(&file, &recorded)?;
    }
    Ok(ExitCode::SUCCESS)
}
