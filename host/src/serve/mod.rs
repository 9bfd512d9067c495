//! `config-snapshot serve`: the policy as a mutating admission webhook with
//! the full `config-snapshot`/`v1` capability, against a real API server.
//!
//! Stateless apart from watch caches and the effect queue, so it runs as
//! several replicas: two replicas racing to create one snapshot create the
//! same content-addressed object, and the loser reads it back.

pub mod answer;
pub mod intake;
#[cfg(test)]
mod layering_tests;
pub mod tell;
pub mod trust;
pub mod view;
pub mod work;

use std::sync::atomic::Ordering;
use std::sync::Arc;

use anyhow::{Context as _, Result};
use kube::Client;

pub use answer::admission::{admit, review, Answer, Failure};
use answer::options::at_least_a_second;
pub use answer::options::Options;
pub use answer::state::{build, build_with_engine, State};

use crate::cluster::proof::{Keyring, Prover};

/// The key Secret serve keeps its keyring in, and what it checks of it.
pub fn key_secret(options: &Options, client: Client) -> trust::signing::KeySecret {
    trust::signing::KeySecret {
        client,
        namespace: options.own_namespace.clone(),
        name: options.signing_key_secret.clone(),
        service_account: options.service_account.clone(),
        guard: options.signing_key_guard.clone(),
        trust_unguarded: options.trust_unguarded_signing_key,
    }
}

/// The signing keyring, from `--signing-key-file` or the key Secret; with
/// the guard the Secret was judged under (none for a file), which its later
/// versions are judged against.
pub async fn keyring(options: &Options, client: Client) -> Result<(Keyring, Option<trust::signing::Guard>)> {
    match &options.signing_key_file {
        Some(path) => Ok((trust::signing::from_file(path)?, None)),
        None => key_secret(options, client).load().await,
    }
}
/// Runs the webhook until SIGTERM or Ctrl-C.
pub async fn run(options: Options) -> Result<()> {
    crate::use_ring_for_tls();
    // The module first: a refused digest must stop serve before it joins
    // the cluster.
    let (module, origin) =
        crate::kubewarden::registry::load(&options.registry, &options.policy, options.policy_digest.as_deref()).await?;
    tracing::info!(policy = %origin, "policy loaded");
    let client = Client::try_default()
        .await
        .context("connecting to the API server (in-cluster config or KUBECONFIG)")?;
    let (ring, guard) = keyring(&options, client.clone()).await?;
    tracing::info!(keys = ?ring.ids(), "signing keyring ready");
    let door = Arc::new(intake::door::Door::new(&ring));
    let (state, worker) = build(&options, client.clone(), &module, Prover::with(&ring))?;
    let (tls, bundle) = webhook_tls(&options, client.clone(), &state).await?;
    if !options.webhook_configuration.is_empty() {
        state.registered.store(false, Ordering::SeqCst);
        let registration = trust::registration::Registration {
            client: client.clone(),
            name: options.webhook_configuration.clone(),
            door: door.clone(),
            state: state.clone(),
            bundle,
        };
        tokio::spawn(registration.keep());
    }
    if options.signing_key_file.is_none() {
        let prover = state.context.rules.prover.clone();
        let cache = state.cluster.cache.clone();
        let rekeyed = door.clone();
        let untrusted = state.metrics.untrusted(tell::metrics::SIGNING_KEY);
        tokio::spawn(
            key_secret(&options, client.clone()).keep((ring, guard), prover, untrusted, move |ring| {
                cache.keyring_changed();
                rekeyed.rekey(ring);
            }),
        );
    }
    state.cluster.cache.start(client.clone());
    tokio::spawn(worker.run());
    let interval = options.resync_interval;
    if options.leader_elect {
        let election = work::leader::Election {
            namespace: options.own_namespace.clone(),
            lease: options.lease_name.clone(),
            holder: work::leader::default_holder(),
            duration: at_least_a_second(options.lease_duration),
        };
        tracing::info!(lease = %election.lease, namespace = %election.namespace, holder = %election.holder, "leader election on");
        tokio::spawn(work::leader::compete(
            client.clone(),
            election,
            state.leadership.clone(),
        ));
    }
    tokio::spawn(answer::resync_timer::every(state.clone(), interval));
    intake::http::serve(state, door, tls, &options).await
}

/// The TLS serve answers with: `--tls-cert` and `--tls-key` (cert-manager's,
/// or yours), reloaded when they change; or serve's own, kept in its Secret
/// and renewed, with the CA bundle the webhook configuration must name.
async fn webhook_tls(
    options: &Options,
    client: Client,
    state: &Arc<State>,
) -> Result<(
    intake::listener::Tls,
    Option<tokio::sync::watch::Receiver<Option<trust::certificates::Trust>>>,
)> {
    if let (Some(cert), Some(key)) = (&options.tls_cert, &options.tls_key) {
        let tls = intake::listener::Tls::new(intake::listener::server_config(
            cert,
            key,
            options.client_ca.as_deref(),
        )?);
        tokio::spawn(intake::http::reload_certificates(
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
        names.extend(trust::registration::called_host(&client, &options.webhook_configuration).await);
    }
    let own = trust::own_certificate::OwnCertificate {
        client: client.clone(),
        namespace: ns.clone(),
        names,
        webhook_configuration: options.webhook_configuration.clone(),
        lifetimes: trust::certificates::Lifetimes::bounded(
            options.ca_lifetime.as_secs(),
            options.certificate_lifetime.as_secs(),
        ),
        guard: trust::signing::KeySecret {
            name: trust::certificates::SECRET.to_string(),
            ..key_secret(options, client)
        },
        client_ca: options.client_ca.clone(),
        trust,
        untrusted: state.metrics.untrusted(tell::metrics::WEBHOOK_CA),
    };
    let (material, guard) = own.load().await?;
    let tls = intake::listener::Tls::new(own.tls_config(&material)?);
    tracing::info!(secret = trust::certificates::SECRET, "serving serve's own certificate");
    tokio::spawn(own.keep(tls.clone(), material, guard, state.leadership.clone()));
    Ok((tls, Some(published)))
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
