//! `push` and `pull`: the policy in an OCI registry, in Kubewarden's layout.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context as _, Result};
use config_snapshot::kubewarden::registry;

/// Push a policy module to an OCI registry in Kubewarden's layout (what
/// `kwctl pull` fetches); prints the reference with its digest.
#[derive(Debug, clap::Args)]
pub struct PushArgs {
    /// The (annotated) policy wasm.
    wasm: PathBuf,
    /// HOST/REPO:TAG, with or without `registry://`.
    reference: String,
    /// Sign the pushed module with this cosign private key (its password
    /// from COSIGN_PASSWORD, as cosign reads it).
    #[arg(long, value_name = "FILE")]
    sign_key: Option<PathBuf>,
    #[command(flatten)]
    registry: registry::Access,
}

/// Pull a policy module from an OCI registry (by tag, or by digest, which
/// is then verified); prints the reference with its digest.
#[derive(Debug, clap::Args)]
pub struct PullArgs {
    /// HOST/REPO:TAG or HOST/REPO@sha256:…, with or without `registry://`.
    reference: String,
    #[arg(short, long)]
    output: PathBuf,
    /// Refuse the module unless its manifest digest is this one.
    #[arg(long)]
    digest: Option<String>,
    #[command(flatten)]
    registry: registry::Access,
}

pub fn push(args: PushArgs) -> Result<ExitCode> {
    let module = std::fs::read(&args.wasm).with_context(|| format!("reading {}", args.wasm.display()))?;
    let target = registry::reference(&args.reference)?;
    let runtime = super::runtime()?;
    let digest = runtime.block_on(registry::push(&args.registry, &module, &target))?;
    if let Some(key) = args.sign_key {
        let pem = std::fs::read(&key).with_context(|| format!("reading {}", key.display()))?;
        let password = std::env::var("COSIGN_PASSWORD").unwrap_or_default();
        runtime.block_on(registry::sign(
            &args.registry,
            &target,
            &digest,
            &pem,
            password.as_bytes(),
        ))?;
    }
    println!("{target}@{digest}");
    Ok(ExitCode::SUCCESS)
}

pub fn pull(args: PullArgs) -> Result<ExitCode> {
    let source = registry::reference(&args.reference)?;
    let module = super::runtime()?.block_on(registry::pull(&args.registry, &source, args.digest.as_deref()))?;
    std::fs::write(&args.output, &module.bytes).with_context(|| format!("writing {}", args.output.display()))?;
    println!("{source}@{}", module.digest);
    Ok(ExitCode::SUCCESS)
}
