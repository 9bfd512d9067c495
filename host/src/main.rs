//! `config-snapshot`: the host for the config-snapshot policy. This file
//! parses the command line and dispatches; each command is in `cli/`.

mod cli;

use std::process::ExitCode;

use anyhow::Result;
use clap::{Parser, Subcommand};

use config_snapshot::serve;

/// mimalloc, not the C library's allocator: serve parses each watched
/// object whole before keeping only its metadata and digest, and after a
/// burst of watch events glibc and musl keep the memory it needed, per
/// thread arena. mimalloc returns freed pages to the kernel after a short
/// delay, so serve's resident memory follows its cache, not its busiest
/// moment (docs/BENCHMARKS.md, "Memory at scale").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

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
    /// Replay scenarios over the simulator and print a timeline.
    Replay(cli::replay::Args),
    /// Evaluate AdmissionReview files and print AdmissionReview responses.
    Review(cli::review::Args),
    /// Push a policy module to an OCI registry in Kubewarden's layout (what
    /// `kwctl pull` fetches); prints the reference with its digest.
    Push(cli::oci::PushArgs),
    /// Pull a policy module from an OCI registry (by tag, or by digest,
    /// which is then verified); prints the reference with its digest.
    Pull(cli::oci::PullArgs),
    /// Which config each revision of a workload runs: every revision its
    /// controller keeps, oldest first, with its images and, per source, the
    /// snapshot it pins and the keys changed since the revision before.
    History(cli::history::HistoryArgs),
    /// A unified diff of two revisions' config (Secrets by key name only)
    /// and pod templates; exits 1 when they differ, as diff does.
    Diff(cli::history::DiffArgs),
    /// What applying a ConfigMap or Secret would roll: each workload that
    /// references it, whether it would roll and why not, and the key-level
    /// diff (Secrets by key name only). Reads; never writes.
    Plan(cli::plan::Args),
    /// What a workload's watched changes wait for: its watch mode, rollout
    /// window, pending and approved changes, last rollout and rollback.
    Status(cli::approve::StatusArgs),
    /// Approve a workload's pending watch rollout (watch mode `approve`);
    /// refused when its source changed again since.
    Approve(cli::approve::ApproveArgs),
    /// Run the mutating admission webhook against the cluster (HTTPS).
    Serve(serve::Options),
    /// Compile the policy ahead of time for `serve --precompiled`: made by
    /// this build, for this machine's CPU; serve falls back to compiling
    /// when it does not fit.
    Precompile(cli::module::PrecompileArgs),
    /// Embed policy metadata in the wasm, as `kwctl annotate` does.
    Annotate(cli::module::AnnotateArgs),
    /// The signing keyring: list, rotate, restore from a backup, and sign
    /// the snapshots of a version that did not sign (docs/security.md).
    Keys(cli::keyring::Args),
    /// Leave config-snapshot: after uninstalling serve, point workloads back
    /// at their sources and delete the snapshots nothing names
    /// (docs/install.md, "Uninstall").
    Release(cli::release::Args),
    /// Revoke a leaked Secret's (or a ConfigMap's) earlier contents: delete
    /// their snapshots, record it, and refuse from then on a rollback to a
    /// revision that names one (docs/security.md).
    Revoke(cli::revoke::Args),
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(code) => code,
        Err(e) => {
            // An error may quote the cluster (an API server's message, an
            // annotation): escaped as everything the commands print.
            eprintln!(
                "config-snapshot: {}",
                config_snapshot::tools::printable(&format!("{e:#}"))
            );
            ExitCode::from(2)
        }
    }
}

fn run(cli: Cli) -> Result<ExitCode> {
    match cli.command {
        Command::Replay(args) => cli::replay::run(args),
        Command::Review(args) => cli::review::run(args),
        Command::Push(args) => cli::oci::push(args),
        Command::Pull(args) => cli::oci::pull(args),
        Command::History(args) => cli::history::history(args),
        Command::Diff(args) => cli::history::diff(args),
        Command::Plan(args) => cli::plan::run(args),
        Command::Status(args) => cli::approve::status_command(args),
        Command::Approve(args) => cli::approve::approve_command(args),
        Command::Serve(options) => {
            serve::init_logging(&options.log_format);
            let runtime = cli::runtime()?;
            let served = runtime.block_on(serve::run(options));
            // The HTTP server has had its grace. Effects still running (a
            // sweep, an API call that cannot finish now) must not hold the
            // exit: dropping the runtime would wait for them without end.
            // What they leave undone, a replica's resync re-derives.
            runtime.shutdown_timeout(std::time::Duration::from_secs(5));
            served?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Precompile(args) => cli::module::precompile(args),
        Command::Annotate(args) => cli::module::annotate(args),
        Command::Keys(args) => cli::keyring::run(args),
        Command::Release(args) => cli::release::run(args),
        Command::Revoke(args) => cli::revoke::run(args),
    }
}
