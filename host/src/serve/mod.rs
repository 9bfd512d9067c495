//! `config-snapshot serve`: the policy as a mutating admission webhook with
//! the full `config-snapshot`/`v1` capability, against a real API server.
//!
//! Stateless apart from watch caches and the effect queue, so it runs as
//! several replicas: two replicas racing to create one snapshot create the
//! same content-addressed object, and the loser reads it back.

pub mod admission;
pub mod apiserver;
pub mod cache;
pub mod certificates;
pub mod door;
pub mod events;
mod http;
pub mod leader;
pub mod listener;
pub mod metrics;
pub mod own_certificate;
pub mod prefetch;
pub mod queue;
pub mod registration;
mod report;
pub mod resync;
pub mod scope;
pub mod signing;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, Context as _, Result};
use config_snapshot_policy::duration::parse_go_duration;
use config_snapshot_policy::settings::Settings;
use kube::Client;
use serde_json::Value;

pub use admission::{admit, review, Answer, Failure};
use apiserver::KubeCluster;
use cache::Cache;
use metrics::Metrics;
use queue::{Queue, QueueSettings, WorkerContext};
use report::Report;

use crate::capability::Budget;
use crate::engine::Engine;
use crate::lifecycle::Rules;
use crate::proof::{Keyring, Prover};

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
    pub registry: crate::registry::Access,
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
    /// Past it, a new one takes an idle one's place, or is closed if none
    /// is idle.
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
    /// allowed; never less than one body of 8 MiB). A body takes its
    /// declared size of it before a byte is read; past it, a request waits
    /// for its deadline, then is answered 503.
    #[arg(long, default_value = "32Mi", value_parser = crate::capability::parse_bytes)]
    pub body_bytes_in_flight: std::num::NonZeroU32,
    /// Requests in flight at once from one address, on all its
    /// connections; past it, a request is answered 503 at once.
    #[arg(long, default_value = "64")]
    pub max_requests_per_peer: usize,
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
    pub source_reads: prefetch::SourceReads,
    /// Adoptions and sweeps on their way at most, a quarter of them for one
    /// namespace (beyond: dropped, the resync and the sweep recover). Watch
    /// rollouts are never dropped for a full queue.
    #[arg(long, default_value = "1024")]
    pub queue_capacity: usize,
    /// The policy's deadline per request (Go duration).
    #[arg(long, default_value = "2s", value_parser = go_duration)]
    pub policy_timeout: Duration,
    /// Policy instances alive at once: admissions evaluated together (one
    /// is kept for the resync). Each takes up to --policy-memory-mib, so
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
    #[arg(long, default_value = signing::GUARD)]
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
    #[arg(long, default_value = "8Mi", value_parser = crate::capability::parse_bytes)]
    pub snapshot_bytes_rate: std::num::NonZeroU32,
    /// Bytes of snapshots the whole cluster may have made per minute, which
    /// bounds what serve adds to etcd's history between two compactions
    /// (docs/security.md, "Sizing the budget").
    #[arg(long, default_value = "32Mi", value_parser = crate::capability::parse_bytes)]
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

    /// The webhook listener's bounds from the flags.
    pub fn listener_limits(&self) -> Result<listener::Limits> {
        if self.max_connections_per_peer == 0 || self.max_connections == 0 || self.max_requests_per_peer == 0 {
            return Err(anyhow!(
                "--max-connections, --max-connections-per-peer and --max-requests-per-peer: at least 1"
            ));
        }
        Ok(listener::Limits {
            connections: self.max_connections,
            per_peer: self.max_connections_per_peer.min(self.max_connections),
            first_byte_timeout: at_least_a_second(self.first_byte_timeout),
            idle_timeout: at_least_a_second(self.idle_timeout),
            header_read_timeout: at_least_a_second(self.header_read_timeout),
            requests_per_peer: self.max_requests_per_peer,
            ..listener::Limits::default()
        })
    }

    /// The engine's limits from `--policy-instances` and
    /// `--policy-memory-mib`.
    pub fn engine_limits(&self) -> Result<crate::engine::Limits> {
        if self.policy_instances < 2 {
            return Err(anyhow!("--policy-instances: at least 2 (one is kept for the resync)"));
        }
        let memory_bytes = self
            .policy_memory_mib
            .checked_mul(1 << 20)
            .filter(|b| *b >= 4 << 20)
            .ok_or_else(|| anyhow!("--policy-memory-mib: at least 4"))?;
        Ok(crate::engine::Limits {
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

/// Shared by the HTTP handlers, the effect worker and the resync.
pub struct State {
    pub engine: Arc<Engine>,
    /// The settings as JSON text, spliced into every validate payload
    /// (parsed, they are the rules' own: `queue.carry().rules.settings`).
    pub settings_json: String,
    pub cluster: Arc<KubeCluster>,
    pub queue: Queue,
    pub metrics: Arc<Metrics>,
    pub shutting_down: AtomicBool,
    /// Whether this replica runs the periodic pass (see `leader`).
    pub leadership: Arc<leader::Leadership>,
    /// Admissions evaluating at once. The wasm pool has a fixed number of
    /// instance slots; past it a request would fail, so it waits here
    /// instead. One slot stays free for the resync.
    pub evaluations: tokio::sync::Semaphore,
    /// Snapshot creations per namespace per minute.
    pub budget: Arc<Budget>,
    /// Whether the webhook configuration calls the door's path (or serve
    /// was told to leave it alone, or there is none to call it).
    pub registered: AtomicBool,
    ids: AtomicU64,
}

impl State {
    pub fn ready(&self) -> bool {
        self.cluster.cache.synced()
            && self.registered.load(Ordering::SeqCst)
            && !self.shutting_down.load(Ordering::SeqCst)
    }

    pub(crate) fn next_id(&self) -> u64 {
        self.ids.fetch_add(1, Ordering::Relaxed)
    }
}

/// A flag's Go duration (`90s`, `5m`), read when the command line is
/// parsed: a bad one is refused before the module is pulled, the caches
/// started or leader election begun.
fn go_duration(text: &str) -> Result<Duration, config_snapshot_policy::duration::DurationError> {
    parse_go_duration(text).map(Duration::from_secs)
}

/// A duration no shorter than a second: a timer of zero would fire at once.
fn at_least_a_second(d: Duration) -> Duration {
    d.max(Duration::from_secs(1))
}

/// Everything `serve` needs that does not involve sockets, for the module
/// `--policy` named (already read or pulled).
pub fn build(options: &Options, client: Client, module: &[u8], prover: Prover) -> Result<(Arc<State>, queue::Worker)> {
    let precompiled = match &options.precompiled {
        Some(path) => Some(std::fs::read(path).with_context(|| format!("reading {}", path.display()))?),
        None => None,
    };
    let started = std::time::Instant::now();
    let (engine, how) = Engine::load_prepared(
        module,
        precompiled.as_deref(),
        options.policy_timeout,
        options.engine_limits()?,
    )?;
    tracing::info!(how = %how, millis = started.elapsed().as_millis() as u64, "policy ready");
    build_with_engine(options, client, Arc::new(engine), prover)
}

/// The key Secret serve keeps its keyring in, and what it checks of it.
pub fn key_secret(options: &Options, client: Client) -> signing::KeySecret {
    signing::KeySecret {
        client,
        namespace: options.own_namespace.clone(),
        name: options.signing_key_secret.clone(),
        service_account: options.service_account.clone(),
        guard: options.signing_key_guard.clone(),
        trust_unguarded: options.trust_unguarded_signing_key,
    }
}

/// The signing keyring, from `--signing-key-file` or the key Secret.
pub async fn keyring(options: &Options, client: Client) -> Result<Keyring> {
    match &options.signing_key_file {
        Some(path) => signing::from_file(path),
        None => key_secret(options, client).load().await,
    }
}

/// [`build`] with an engine already compiled (`--policy` is not read).
pub fn build_with_engine(
    options: &Options,
    client: Client,
    engine: Arc<Engine>,
    prover: Prover,
) -> Result<(Arc<State>, queue::Worker)> {
    let engine_instances = engine.limits().instances as usize;
    let settings: Value = serde_json::from_str(&options.settings_json).context("--settings-json is not JSON")?;
    if let Err(message) = engine.validate_settings(&settings)? {
        return Err(anyhow!("invalid settings: {message}"));
    }
    let settings_json = settings.to_string();
    let parsed = Settings::from_json(settings_json.as_bytes()).map_err(|e| anyhow!("invalid settings: {e}"))?;
    let metrics = Arc::new(Metrics::default());
    let only_namespaces = options.only_namespaces()?;
    let prover = Arc::new(prover);
    let cache = Arc::new(
        match &only_namespaces {
            Some(namespaces) => Cache::within(namespaces.clone()),
            None => Cache::excluding(options.excluded_namespaces()),
        }
        .digesting(prover.clone())
        .counting(metrics.cache_objects.clone()),
    );
    let runtime = tokio::runtime::Handle::try_current().context("serve needs a tokio runtime")?;
    let report = Arc::new(Report {
        events: events::Events::new(client.clone(), runtime.clone()),
        metrics: metrics.clone(),
    });
    let cluster =
        Arc::new(KubeCluster::new(client, cache.clone(), runtime, metrics.clone()).reading(options.source_reads));
    let budget = Arc::new(Budget::new(crate::capability::Limits {
        count: options.snapshot_rate,
        namespace_bytes: options.snapshot_bytes_rate,
        total_bytes: options.snapshot_bytes_rate_total,
    }));
    let carry = Arc::new(WorkerContext {
        cluster: cluster.clone(),
        rules: Arc::new(Rules {
            settings: parsed,
            watch_min_interval: options.watch_min_interval.as_secs() as i64,
            prover,
            excluded_namespaces: options.excluded_namespaces(),
            only_namespaces,
        }),
        in_flight: Arc::default(),
        report,
        budget: budget.clone(),
    });
    let (queue, worker) = Queue::new(
        carry,
        QueueSettings {
            capacity: options.queue_capacity.max(1),
            wait_for: options.effect_wait,
            ..QueueSettings::default()
        },
    );
    let waker = queue.clone();
    cache.on_workload_change(move |workload| waker.wake(workload));
    let leadership = Arc::new(if options.leader_elect {
        leader::Leadership::contender(metrics.clone())
    } else {
        leader::Leadership::alone(metrics.clone())
    });
    let state = Arc::new(State {
        leadership,
        engine,
        settings_json,
        cluster,
        queue,
        metrics,
        shutting_down: AtomicBool::new(false),
        evaluations: tokio::sync::Semaphore::new(engine_instances.saturating_sub(1).max(1)),
        budget,
        registered: AtomicBool::new(true),
        ids: AtomicU64::new(0),
    });
    Ok((state, worker))
}

/// Runs the webhook until SIGTERM or Ctrl-C.
pub async fn run(options: Options) -> Result<()> {
    crate::use_ring_for_tls();
    // The module first: a refused digest must stop serve before it joins
    // the cluster.
    let (module, origin) =
        crate::registry::load(&options.registry, &options.policy, options.policy_digest.as_deref()).await?;
    tracing::info!(policy = %origin, "policy loaded");
    let client = Client::try_default()
        .await
        .context("connecting to the API server (in-cluster config or KUBECONFIG)")?;
    let ring = keyring(&options, client.clone()).await?;
    tracing::info!(keys = ?ring.ids(), "signing keyring ready");
    let door = Arc::new(door::Door::new(&ring));
    let (state, worker) = build(&options, client.clone(), &module, Prover::with(&ring))?;
    let (tls, bundle) = webhook_tls(&options, client.clone(), &state).await?;
    if !options.webhook_configuration.is_empty() {
        state.registered.store(false, Ordering::SeqCst);
        let registration = registration::Registration {
            client: client.clone(),
            name: options.webhook_configuration.clone(),
            door: door.clone(),
            state: state.clone(),
            bundle,
        };
        tokio::spawn(registration.keep());
    }
    if options.signing_key_file.is_none() {
        let prover = state.queue.carry().rules.prover.clone();
        let cache = state.cluster.cache.clone();
        let rekeyed = door.clone();
        tokio::spawn(key_secret(&options, client.clone()).keep(ring, prover, move |ring| {
            cache.keyring_changed();
            rekeyed.rekey(ring);
        }));
    }
    state.cluster.cache.start(client.clone());
    tokio::spawn(worker.run());
    let interval = options.resync_interval;
    if options.leader_elect {
        let election = leader::Election {
            namespace: options.own_namespace.clone(),
            lease: options.lease_name.clone(),
            holder: leader::default_holder(),
            duration: at_least_a_second(options.lease_duration),
        };
        tracing::info!(lease = %election.lease, namespace = %election.namespace, holder = %election.holder, "leader election on");
        tokio::spawn(leader::compete(client.clone(), election, state.leadership.clone()));
    }
    tokio::spawn(resync_loop(state.clone(), interval));
    http::serve(state, door, tls, &options).await
}

/// The TLS serve answers with: `--tls-cert` and `--tls-key` (cert-manager's,
/// or yours), reloaded when they change; or serve's own, kept in its Secret
/// and renewed, with the CA bundle the webhook configuration must name.
async fn webhook_tls(
    options: &Options,
    client: Client,
    state: &Arc<State>,
) -> Result<(
    listener::Tls,
    Option<tokio::sync::watch::Receiver<Option<certificates::Trust>>>,
)> {
    if let (Some(cert), Some(key)) = (&options.tls_cert, &options.tls_key) {
        let tls = listener::Tls::new(listener::server_config(cert, key, options.client_ca.as_deref())?);
        tokio::spawn(http::reload_certificates(
            tls.clone(),
            cert.clone(),
            key.clone(),
            options.client_ca.clone(),
        ));
        return Ok((tls, None));
    }
    let ns = &options.own_namespace;
    let (trust, published) = tokio::sync::watch::channel(None);
    let mut names = vec![
        format!("{}.{ns}.svc", options.service),
        format!("{}.{ns}.svc.cluster.local", options.service),
    ];
    if !options.webhook_configuration.is_empty() {
        names.extend(registration::called_host(&client, &options.webhook_configuration).await);
    }
    let own = own_certificate::OwnCertificate {
        client: client.clone(),
        namespace: ns.clone(),
        names,
        webhook_configuration: options.webhook_configuration.clone(),
        lifetimes: certificates::Lifetimes::bounded(
            options.ca_lifetime.as_secs(),
            options.certificate_lifetime.as_secs(),
        ),
        guard: signing::KeySecret {
            name: certificates::SECRET.to_string(),
            ..key_secret(options, client)
        },
        client_ca: options.client_ca.clone(),
        trust,
    };
    let (material, guard) = own.load().await?;
    let tls = listener::Tls::new(own.tls_config(&material)?);
    tracing::info!(secret = certificates::SECRET, "serving serve's own certificate");
    tokio::spawn(own.keep(tls.clone(), material, guard, state.leadership.clone()));
    Ok((tls, Some(published)))
}

async fn resync_loop(state: Arc<State>, interval: Duration) {
    while !state.cluster.cache.synced() {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    loop {
        if state.leadership.leading() {
            resync::once(&state).await;
            state.metrics.resync_passes.inc();
        }
        tokio::time::sleep(interval.max(Duration::from_secs(1))).await;
    }
}

/// Sets up `tracing`: text or JSON lines on stderr, `RUST_LOG` honoured.
pub fn init_logging(format: &str) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = if format == "json" {
        builder.json().flatten_event(true).try_init()
    } else {
        builder.try_init()
    };
}

#[cfg(test)]
mod options_tests {
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
