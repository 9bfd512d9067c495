//! serve's command line: every flag, and what it is read into. Read once,
//! when serve starts; nothing here touches the cluster.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{anyhow, Result};
use config_snapshot_policy::model::duration::parse_go_duration;

use crate::serve::view::source_reads;

/// The ValidatingAdmissionPolicy that guards the signing key's Secret
/// (deploy/serve/keyguard.yaml): `--signing-key-guard`'s default.
pub(crate) const SIGNING_KEY_GUARD: &str = "config-snapshot-signing-key";

#[derive(Debug, Clone, clap::Args)]
pub struct Options {
    /// The policy wasm: a file, or `registry://HOST/REPO:TAG` (or
    /// `@sha256:…`), pulled at start.
    #[arg(long, env = "CONFIG_SNAPSHOT_POLICY")]
    pub policy: String,
    /// A precompiled module (`config-snapshot precompile`) to start from
    /// without compiling; used only if made from this very policy by this
    /// build, else serve compiles as usual.
    #[arg(long, env = "CONFIG_SNAPSHOT_PRECOMPILED")]
    pub precompiled: Option<PathBuf>,
    /// The manifest digest the registry module must have (`sha256:…`);
    /// any other is refused and serve does not start.
    #[arg(long, env = "CONFIG_SNAPSHOT_POLICY_DIGEST")]
    pub policy_digest: Option<String>,
    #[command(flatten)]
    pub registry: crate::kubewarden::registry::Access,
    /// Policy settings as JSON (see policy-metadata.yml).
    #[arg(long, default_value = "{}", env = "CONFIG_SNAPSHOT_SETTINGS")]
    pub settings_json: String,
    /// PEM certificate chain for the webhook (reloaded when it changes), as
    /// cert-manager or you make it. Without it (and `--tls-key`), serve
    /// makes its own CA and certificate, keeps them in the Secret
    /// `config-snapshot-webhook-ca` of its namespace, renews them, and keeps
    /// the webhook configuration's `caBundle` on its CA.
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key for the webhook.
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// The Service the API server calls serve through, in serve's
    /// namespace: serve's own certificate names `SERVICE.NAMESPACE.svc`.
    #[arg(long, default_value = "config-snapshot")]
    pub service: String,
    /// How long serve's own CA is valid; it is replaced, with both trusted
    /// meanwhile, when a third is left (Go duration).
    #[arg(long, default_value = "87600h", value_parser = go_duration)]
    pub ca_lifetime: Duration,
    /// How long serve's own serving certificate is valid; it is renewed
    /// under the same CA when a third is left (Go duration).
    #[arg(long, default_value = "2160h", value_parser = go_duration)]
    pub certificate_lifetime: Duration,
    /// PEM CA certificate(s): when set, the webhook answers only callers
    /// that present a client certificate signed by one (mTLS). Give it the
    /// CA of the client certificate the API server's AdmissionConfiguration
    /// names for this webhook (deploy/components/mtls).
    #[arg(long, env = "CONFIG_SNAPSHOT_CLIENT_CA")]
    pub client_ca: Option<PathBuf>,
    /// Connections to the webhook open at once (their TLS handshakes done).
    /// Past it, a new one takes the place of an idle one that has not
    /// passed the door yet, or is closed if there is none: a connection
    /// that has (the API server's) keeps its place.
    #[arg(long, default_value = "256")]
    pub max_connections: usize,
    /// Of those, from one address: the API server's own are never crowded
    /// out by one pod's.
    #[arg(long, default_value = "64")]
    pub max_connections_per_peer: usize,
    /// How long a connection may go from its TLS handshake to its first
    /// request (Go duration).
    #[arg(long, default_value = "10s", value_parser = go_duration)]
    pub first_byte_timeout: Duration,
    /// How long a connection may stay open with no request, HTTP/1 or
    /// HTTP/2 (Go duration).
    #[arg(long, default_value = "2m", value_parser = go_duration)]
    pub idle_timeout: Duration,
    /// How long a client may take to send a request's headers (Go duration).
    #[arg(long, default_value = "5s", value_parser = go_duration)]
    pub header_read_timeout: Duration,
    /// How long a request may take from its headers to the last byte of
    /// its body, however it trickles (Go duration).
    #[arg(long, default_value = "10s", value_parser = go_duration)]
    pub body_read_timeout: Duration,
    /// Bytes of request bodies read or evaluated at once (`Ki`, `Mi`
    /// allowed; never less than four bodies of 8 MiB). A body takes its
    /// declared size of it before more than its first bytes are read, and
    /// one namespace holds at most a quarter of it; past the whole, a
    /// request waits for its deadline, then is answered 503.
    #[arg(long, default_value = "32Mi", value_parser = crate::lifecycle::parse_bytes)]
    pub body_bytes_in_flight: std::num::NonZeroU32,
    /// Reviews of one namespace in flight at once (read, waiting or
    /// evaluated), whoever sends them; past it, a review is answered 503
    /// at once. Counted by namespace, not address: the API server is one
    /// address carrying every namespace's reviews.
    #[arg(long, default_value = "64")]
    pub max_requests_per_namespace: u32,
    /// The MutatingWebhookConfiguration that calls serve: serve keeps its
    /// webhooks calling the door's path (`/mutate/<token>`, the token
    /// derived from the signing key), and is not ready while it cannot.
    /// Empty: serve leaves it alone, and whoever manages it must set the
    /// path (docs/security.md, "The door").
    #[arg(
        long,
        default_value = "config-snapshot",
        env = "CONFIG_SNAPSHOT_WEBHOOK_CONFIGURATION"
    )]
    pub webhook_configuration: String,
    /// The webhook's HTTPS address.
    #[arg(long, default_value = "0.0.0.0:8443")]
    pub listen: SocketAddr,
    /// Plain-HTTP address for /healthz, /readyz and /metrics.
    #[arg(long, default_value = "0.0.0.0:8080")]
    pub metrics_listen: SocketAddr,
    /// Log format: text or json.
    #[arg(long, default_value = "text", value_parser = ["text", "json"])]
    pub log_format: String,
    /// How often to re-admit renew-duration workloads and re-derive watch
    /// rollouts (Go duration).
    #[arg(long, default_value = "5m", value_parser = go_duration)]
    pub resync_interval: Duration,
    /// Storm guard: at most one watch rollout per workload per interval.
    #[arg(long, default_value = "30s", value_parser = go_duration)]
    pub watch_min_interval: Duration,
    /// How long a deferred effect waits for its precondition (the source
    /// change persisted, the owner created) before it is dropped.
    #[arg(long, default_value = "30s", value_parser = go_duration)]
    pub effect_wait: Duration,
    /// How an opted-in workload's fresh source reads are made, ahead of
    /// the policy: `parallel` GETs, `sequential` GETs on one connection,
    /// one consistent `list` per kind where the namespace is small, or
    /// `none` (docs/BENCHMARKS.md, "Fresh reads").
    #[arg(long, default_value = "parallel", value_enum)]
    pub source_reads: source_reads::SourceReads,
    /// Adoptions and sweeps on their way at most, a quarter of them for one
    /// namespace (beyond: dropped, the resync and the sweep recover). Watch
    /// rollouts are never dropped for a full queue.
    #[arg(long, default_value = "1024")]
    pub queue_capacity: usize,
    /// The policy's deadline per request (Go duration).
    #[arg(long, default_value = "2s", value_parser = go_duration)]
    pub policy_timeout: Duration,
    /// Policy instances alive at once: admissions evaluated together (one
    /// is kept for the resync; the API server's reviews and the judges of
    /// changed sources share the rest, and wait for one past them). Each
    /// takes up to --policy-memory-mib, so
    /// their product must fit the container's memory limit beside the
    /// caches (deploy/serve: 8 × 48 MiB of a 512 MiB limit).
    #[arg(long, default_value = "8")]
    pub policy_instances: u32,
    /// One policy instance's memory limit, in MiB: an instance that needs
    /// more is stopped and its admission answered with an error.
    #[arg(long, default_value = "48")]
    pub policy_memory_mib: usize,
    /// Compete for a Lease so that one replica runs the resync and the
    /// sweep; every replica serves admissions either way.
    #[arg(long)]
    pub leader_elect: bool,
    /// The Lease's name.
    #[arg(long, default_value = "config-snapshot")]
    pub lease_name: String,
    /// serve's own namespace (the pod's, from the downward API): its
    /// Lease and its signing key live there, and its webhook never reviews
    /// it.
    #[arg(
        long = "namespace",
        alias = "lease-namespace",
        env = "POD_NAMESPACE",
        default_value = "config-snapshot"
    )]
    pub own_namespace: String,
    /// The key that signs snapshots and keys Secret snapshots' names, as a
    /// file (raw, or base64). Without it, serve keeps the key in the
    /// Secret --signing-key-secret of its own namespace, made on first
    /// start (docs/security.md).
    #[arg(long, env = "CONFIG_SNAPSHOT_SIGNING_KEY_FILE")]
    pub signing_key_file: Option<PathBuf>,
    /// The Secret, in serve's own namespace, that keeps the signing
    /// keyring.
    #[arg(long, default_value = "config-snapshot-signing-key")]
    pub signing_key_secret: String,
    /// serve's ServiceAccount (the pod's, from the downward API): the
    /// signing key's guard must let it, and only it and the key
    /// administrators, write the key Secret.
    #[arg(long, env = "POD_SERVICE_ACCOUNT", default_value = "config-snapshot")]
    pub service_account: String,
    /// The name of the signing key's guard: a ValidatingAdmissionPolicy and
    /// its binding (deploy/serve/keyguard.yaml, the chart).
    #[arg(long, default_value = SIGNING_KEY_GUARD)]
    pub signing_key_guard: String,
    /// Trust the key Secret, and serve's own CA Secret, without their guard
    /// (the ValidatingAdmissionPolicy of deploy/serve/keyguard.yaml).
    /// Whoever can then write Secrets in serve's namespace can plant a key
    /// and forge snapshots, or a CA and answer for serve: for clusters
    /// where that is only serve and its administrators.
    #[arg(long)]
    pub trust_unguarded_signing_key: bool,
    /// Namespaces serve never acts in, as its webhook's namespaceSelector
    /// excludes them (deploy/serve/webhook.yaml; checked by a test): a
    /// review for one is answered untouched, the periodic pass does not
    /// look in them. serve's own namespace is always one.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "kube-system,kube-public,kube-node-lease"
    )]
    pub exclude_namespaces: Vec<String>,
    /// A namespaced install: serve watches, reviews and acts in these
    /// namespaces only, with Roles there instead of a ClusterRole
    /// (deploy/components/namespaced). Unset: the whole cluster but the
    /// excluded namespaces.
    #[arg(long, value_delimiter = ',')]
    pub namespaces: Vec<String>,
    /// Snapshots one namespace may have made per minute (a burst of that
    /// many at once): past it, creation fails as for any failed snapshot
    /// (`onSnapshotFailure`).
    #[arg(long, default_value = "600")]
    pub snapshot_rate: std::num::NonZeroU32,
    /// Bytes of snapshots one namespace may have made per minute (`Ki`,
    /// `Mi`, `Gi` allowed): past it, as past `--snapshot-rate`.
    #[arg(long, default_value = "8Mi", value_parser = crate::lifecycle::parse_bytes)]
    pub snapshot_bytes_rate: std::num::NonZeroU32,
    /// Bytes of snapshots the whole cluster may have made per minute, which
    /// bounds what serve adds to etcd's history between two compactions
    /// (docs/security.md, "Sizing the budget").
    #[arg(long, default_value = "32Mi", value_parser = crate::lifecycle::parse_bytes)]
    pub snapshot_bytes_rate_total: std::num::NonZeroU32,
    /// How long a Lease unrenewed stays held: the longest failover (Go duration).
    #[arg(long, default_value = "15s", value_parser = go_duration)]
    pub lease_duration: Duration,
    /// Grace period for in-flight requests on shutdown (Go duration).
    #[arg(long, default_value = "20s", value_parser = go_duration)]
    pub shutdown_grace: Duration,
}

/// A namespace flag's values, trimmed, empty ones dropped.
fn namespace_list(values: &[String]) -> Vec<String> {
    values
        .iter()
        .map(|n| n.trim().to_string())
        .filter(|n| !n.is_empty())
        .collect()
}

impl Options {
    /// The namespaces serve never acts in: `--exclude-namespaces` and its
    /// own.
    pub fn excluded_namespaces(&self) -> Vec<String> {
        let mut out = namespace_list(&self.exclude_namespaces);
        if !out.contains(&self.own_namespace) {
            out.push(self.own_namespace.clone());
        }
        out
    }

    /// A namespaced install's namespaces (`--namespaces`), without the
    /// excluded ones; `None`: cluster-wide.
    pub fn only_namespaces(&self) -> Result<Option<Vec<String>>> {
        let excluded = self.excluded_namespaces();
        let mut only = namespace_list(&self.namespaces);
        if only.is_empty() {
            return Ok(None);
        }
        only.sort();
        only.dedup();
        if let Some(n) = only.iter().find(|n| excluded.contains(n)) {
            return Err(anyhow!(
                "--namespaces names {n}, which serve never acts in (--exclude-namespaces or its own)"
            ));
        }
        Ok(Some(only))
    }

    /// The engine's limits from `--policy-instances` and
    /// `--policy-memory-mib`.
    pub(crate) fn engine_limits(&self) -> Result<crate::kubewarden::engine::Limits> {
        if self.policy_instances < 2 {
            return Err(anyhow!("--policy-instances: at least 2 (one is kept for the resync)"));
        }
        let memory_bytes = self
            .policy_memory_mib
            .checked_mul(1 << 20)
            .filter(|b| *b >= 4 << 20)
            .ok_or_else(|| anyhow!("--policy-memory-mib: at least 4"))?;
        Ok(crate::kubewarden::engine::Limits {
            instances: self.policy_instances,
            memory_bytes,
        })
    }

    /// serve's own defaults (the flags' defaults, read by clap) for the
    /// module at `policy`: tests and benches that build serve in process
    /// change only what they need.
    pub fn defaults(policy: &str) -> Options {
        #[derive(clap::Parser)]
        struct Line {
            #[command(flatten)]
            options: Options,
        }
        let argv = [
            "serve",
            "--policy",
            policy,
            "--tls-cert",
            "unused",
            "--tls-key",
            "unused",
        ];
        <Line as clap::Parser>::try_parse_from(argv)
            .expect("the defaults parse")
            .options
    }
}

/// A flag's Go duration (`90s`, `5m`), read when the command line is
/// parsed: a bad one is refused before the module is pulled, the caches
/// started or leader election begun.
fn go_duration(text: &str) -> Result<Duration, config_snapshot_policy::model::duration::DurationError> {
    parse_go_duration(text).map(Duration::from_secs)
}

/// A duration no shorter than a second: a timer of zero would fire at once.
pub(crate) fn at_least_a_second(d: Duration) -> Duration {
    d.max(Duration::from_secs(1))
}

#[cfg(test)]
mod tests {
    use super::Options;
    use clap::Parser as _;
    use std::time::Duration;

    #[derive(clap::Parser)]
    struct Serve {
        #[command(flatten)]
        options: Options,
    }

    /// A bad duration is refused when the command line is read, before
    /// anything starts, and names its flag.
    fn parse(extra: &[&str]) -> Result<Serve, clap::Error> {
        let base = [
            "serve",
            "--policy",
            "p.wasm",
            "--tls-cert",
            "c.pem",
            "--tls-key",
            "k.pem",
        ];
        Serve::try_parse_from(base.iter().chain(extra))
    }

    #[test]
    fn durations_are_read_with_the_command_line() {
        let parsed = parse(&["--shutdown-grace", "90s"]).unwrap();
        assert_eq!(parsed.options.shutdown_grace, Duration::from_secs(90));
        assert_eq!(
            parsed.options.resync_interval,
            Duration::from_secs(300),
            "the default, read as a duration"
        );
        for flag in [
            "--shutdown-grace",
            "--watch-min-interval",
            "--lease-duration",
            "--idle-timeout",
        ] {
            let refused = parse(&[flag, "soon"])
                .err()
                .unwrap_or_else(|| panic!("{flag} soon was accepted"));
            assert_eq!(refused.kind(), clap::error::ErrorKind::ValueValidation);
            assert!(refused.to_string().contains(flag), "{refused}");
        }
    }
}
