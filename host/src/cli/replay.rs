//! `replay`: scenarios over the simulator, as a timeline or JSON.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Result;
use config_snapshot::kubewarden::engine::Engine;
use config_snapshot::replay;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Scenario files (YAML).
    #[arg(required = true)]
    scenarios: Vec<PathBuf>,
    /// The policy wasm; defaults to the project's freshly built one.
    #[arg(long)]
    policy: Option<PathBuf>,
    /// Print machine-readable results instead of the timeline.
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args) -> Result<ExitCode> {
    let engine = Arc::new(Engine::load(&super::policy_path(args.policy)?)?);
    let mut results = Vec::new();
    for path in &args.scenarios {
        let result = replay::run(engine.clone(), path)?;
        if !args.json {
            replay::print_timeline(&result);
        }
        results.push(result);
    }
    let failed: Vec<String> = results
        .iter()
        .filter_map(|r| r.failure().map(|f| format!("{}: {f}", r.file)))
        .collect();
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({"results": results, "passed": failed.is_empty()}))?
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
