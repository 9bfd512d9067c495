//! `precompile` and `annotate`: what is done to the policy's module before
//! it ships.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context as _, Result};
use config_snapshot::kubewarden::annotate;
use config_snapshot::kubewarden::engine::Engine;

/// Compile the policy ahead of time for `serve --precompiled`: made by this
/// build, for this machine's CPU; serve falls back to compiling when it
/// does not fit.
#[derive(Debug, clap::Args)]
pub struct PrecompileArgs {
    wasm: PathBuf,
    #[arg(short, long)]
    output: PathBuf,
}

/// Embed policy metadata in the wasm, as `kwctl annotate` does.
#[derive(Debug, clap::Args)]
pub struct AnnotateArgs {
    /// The policy wasm to annotate.
    wasm: PathBuf,
    #[arg(short, long, default_value = "policy-metadata.yml")]
    metadata: PathBuf,
    /// A usage text to embed (`io.kubewarden.policy.usage`), e.g. README.md.
    #[arg(short, long)]
    usage: Option<PathBuf>,
    #[arg(short, long)]
    output: PathBuf,
}

pub fn precompile(args: PrecompileArgs) -> Result<ExitCode> {
    let module = std::fs::read(&args.wasm).with_context(|| format!("reading {}", args.wasm.display()))?;
    std::fs::write(&args.output, Engine::precompile_for(&module)?)
        .with_context(|| format!("writing {}", args.output.display()))?;
    Ok(ExitCode::SUCCESS)
}

pub fn annotate(args: AnnotateArgs) -> Result<ExitCode> {
    let bytes = std::fs::read(&args.wasm).with_context(|| format!("reading {}", args.wasm.display()))?;
    let yaml =
        std::fs::read_to_string(&args.metadata).with_context(|| format!("reading {}", args.metadata.display()))?;
    let usage = args
        .usage
        .map(std::fs::read_to_string)
        .transpose()
        .context("reading the usage file")?;
    let json = annotate::metadata_json(&yaml, &bytes, usage.as_deref())?;
    std::fs::write(&args.output, annotate::embed(&bytes, &json)?)
        .with_context(|| format!("writing {}", args.output.display()))?;
    eprintln!("annotated {} -> {}", args.wasm.display(), args.output.display());
    Ok(ExitCode::SUCCESS)
}
