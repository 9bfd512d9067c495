//! serve's own certificate at work (serve/trust/certificates.rs decides): loaded
//! from its Secret at start (made there when there is none, made anew when
//! the Secret is older than its guard, as after a reinstall), served by
//! every replica and reloaded the moment the Secret changes, and renewed by
//! the leader, one step at a time. What the webhook configuration must
//! trust is published for the registration (serve/trust/registration.rs), which
//! keeps it there.
//!
//! The Secret is guarded as the signing key is (deploy/serve/keyguard.yaml
//! names both): only serve's ServiceAccount and the key administrators write
//! it, so a CA someone else planted is never served or trusted. Every
//! version of it is judged against the guard, not only the first, by the
//! signing key's rule (serve/trust/guarded.rs): while the guard is not in force,
//! or for a Secret older than a guard made anew, serve keeps what it serves
//! and says why.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, Result};
use futures::StreamExt;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher::{self, Event};
use kube::Client;
use tokio::sync::watch;

use super::certificates::{apply, next_step, pem_blocks, Lifetimes, Material, Step, Trust, SECRET};
use super::guarded::Untaken;
use super::registration::{without_message, WEBHOOK};
use super::signing::{settle, Guard, KeySecret};
use crate::serve::intake::listener::{server_config_pem, Tls};
use crate::serve::work::leader::Leadership;

/// How often the leader looks whether the certificate needs a step: a
/// third of a settle, at most 20 s.
fn look_every(lifetimes: &Lifetimes) -> Duration {
    Duration::from_secs(u64::try_from(lifetimes.settle_secs() / 3).unwrap_or(1).clamp(1, 20))
}

/// An API error as serve logs it: its code and reason, never its message
/// (which may quote what was sent, and this Secret holds keys).
fn api_error(context: &str, error: &kube::Error) -> anyhow::Error {
    anyhow!("{context}: {}", without_message(error))
}

pub(crate) struct OwnCertificate {
    pub client: Client,
    pub namespace: String,
    /// The names the serving certificate names: the Service's, and the
    /// host of the webhook's URL when it calls one.
    pub names: Vec<String>,
    pub lifetimes: Lifetimes,
    /// The guard's checks, for this Secret (`KeySecret` named [`SECRET`]).
    pub guard: KeySecret,
    pub client_ca: Option<PathBuf>,
    /// serve's webhook configuration, whose `caBundle` a rotation waits
    /// for (empty: none).
    pub webhook_configuration: String,
    /// What the webhook configuration must trust.
    pub trust: watch::Sender<Option<Trust>>,
    /// 1 while the Secret holds a version serve does not serve
    /// (`untrusted_secret_version{secret="webhook-ca"}`).
    pub untrusted: prometheus_client::metrics::gauge::Gauge,
}

/// What the leader knows between its looks.
#[derive(Default)]
struct Looks {
    /// Since when the webhook configuration has been seen trusting the
    /// newest CA of a rotation under way.
    new_ca_trusted_since: Option<i64>,
}

impl OwnCertificate {
    fn api(&self) -> Api<Secret> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// The guard in force, unless serve was told to trust the Secret
    /// without one (`--trust-unguarded-signing-key`, which covers this
    /// Secret too).
    async fn guard(&self) -> Result<Option<Guard>> {
        if self.guard.trust_unguarded {
            Ok(self.guard.guard().await.ok())
        } else {
            Ok(Some(self.guard.guard().await?))
        }
    }

    /// The material, as serve may serve it: the Secret's if it is trusted,
    /// else made now (and the untrusted one replaced); with the guard it
    /// was judged under.
    pub async fn load(&self) -> Result<(Material, Option<Guard>)> {
        let guard = self.guard().await?;
        for _ in 0..3 {
            let found = self
                .api()
                .get_opt(SECRET)
                .await
                .map_err(|e| api_error("reading serve's certificate Secret", &e))?;
            match found {
                Some(secret) if self.guard.trusted(&secret, guard.as_ref()).is_ok() => {
                    if let Ok(m) = Material::from_secret(&secret) {
                        return Ok((m, guard));
                    }
                    tracing::warn!(
                        secret = SECRET,
                        "serve's certificate Secret cannot be read: making it anew"
                    );
                    self.delete(&secret).await?;
                }
                Some(secret) => {
                    tracing::warn!(
                        secret = SECRET,
                        "serve's certificate Secret is older than its guard: making it anew"
                    );
                    self.delete(&secret).await?;
                }
                None => {}
            }
            // Made once the guard has settled, so that it is trusted at
            // the next start too.
            settle(guard.as_ref()).await;
            let now = config_snapshot_policy::model::duration::unix_now();
            let made = apply(Step::Create, None, &self.names, now, &self.lifetimes)?;
            match self
                .api()
                .create(&PostParams::default(), &made.to_secret(&self.namespace))
                .await
            {
                Ok(_) => {
                    tracing::info!(secret = SECRET, "made serve's webhook CA and certificate");
                    return Ok((made, guard));
                }
                // Another replica made it first: read theirs.
                Err(kube::Error::Api(status)) if status.code == 409 => continue,
                Err(e) => return Err(api_error("creating serve's certificate Secret", &e)),
            }
        }
        Err(anyhow!("serve's certificate Secret kept appearing and going"))
    }

    async fn delete(&self, secret: &Secret) -> Result<()> {
        let params = DeleteParams {
            preconditions: Some(kube::api::Preconditions {
                uid: secret.metadata.uid.clone(),
                resource_version: secret.metadata.resource_version.clone(),
            }),
            ..DeleteParams::default()
        };
        match self.api().delete(SECRET, &params).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if matches!(status.code, 404 | 409) => Ok(()),
            Err(e) => Err(api_error("replacing serve's certificate Secret", &e)),
        }
    }

    /// The TLS configuration of `material`.
    pub fn tls_config(&self, material: &Material) -> Result<Arc<rustls::ServerConfig>> {
        server_config_pem(&material.leaf, &material.leaf_key, self.client_ca.as_deref())
    }

    /// Whether `secret`, a later version of the Secret, may be served: the
    /// signing key's rule (serve/trust/guarded.rs), under the guard judged at
    /// load; `untrusted` says whether the Secret holds a version it may not.
    async fn may_serve(&self, secret: &Secret, loaded: Option<&Guard>) -> Result<(), Untaken> {
        let judged = self.guard.may_take(secret, loaded).await;
        self.untrusted.set(i64::from(judged.is_err()));
        judged
    }

    /// Serves the Secret's certificate while serve runs: every trusted
    /// change is served at once (and what the webhook must trust
    /// published); the leader renews it.
    pub async fn keep(self, tls: Tls, held: Material, guard: Option<Guard>, leadership: Arc<Leadership>) {
        let mut held = held;
        let mut looks = Looks::default();
        self.trust.send_replace(Some(held.trust()));
        let config = watcher::Config::default().fields(&format!("metadata.name={SECRET}"));
        let mut events = watcher::watcher(self.api(), config).boxed();
        let mut look = tokio::time::interval(look_every(&self.lifetimes));
        loop {
            tokio::select! {
                event = events.next() => match event {
                    Some(Ok(Event::Apply(secret) | Event::InitApply(secret))) => {
                        if secret.metadata.name.as_deref() != Some(SECRET) {
                            continue;
                        }
                        match Material::from_secret(&secret) {
                            Ok(m) if m.leaf == held.leaf && m.bundle == held.bundle => {
                                self.untrusted.set(0);
                                held = m;
                            }
                            Ok(m) => match self.may_serve(&secret, guard.as_ref()).await {
                                Ok(()) => self.serve(&tls, &mut held, m),
                                Err(why) => tracing::error!(secret = SECRET, "serve's certificate Secret changed, and its new version is not trusted: {why}; keeping the certificate served"),
                            },
                            Err(e) => tracing::error!(secret = SECRET, "serve's certificate Secret cannot be read ({e}): keeping the certificate served"),
                        }
                    }
                    Some(Err(e)) => {
                        tracing::warn!(error = %e, "watching serve's certificate Secret failed; retrying");
                        tokio::time::sleep(Duration::from_secs(5)).await;
                    }
                    None => return,
                    _ => {}
                },
                _ = look.tick() => {
                    if leadership.leading() {
                        if let Err(e) = self.step(&tls, &mut held, guard.as_ref(), &mut looks).await {
                            tracing::warn!("renewing serve's certificate: {e:#}");
                        }
                    }
                }
            }
        }
    }

    /// Serves `material` if it is not what is served already.
    fn serve(&self, tls: &Tls, held: &mut Material, material: Material) {
        if material.leaf != held.leaf {
            match self.tls_config(&material) {
                Ok(config) => {
                    tls.reload(config);
                    tracing::info!("serving the renewed certificate");
                }
                Err(e) => {
                    tracing::error!("keeping the certificate served: {e:#}");
                    return;
                }
            }
        }
        self.trust.send_if_modified(|trust| {
            let wanted = Some(material.trust());
            let changed = *trust != wanted;
            *trust = wanted;
            changed
        });
        *held = material;
    }

    /// Whether the webhook configuration trusts `material`'s newest CA.
    async fn webhook_trusts_newest(&self, material: &Material) -> Result<bool> {
        if self.webhook_configuration.is_empty() {
            return Ok(true);
        }
        let api: Api<MutatingWebhookConfiguration> = Api::all(self.client.clone());
        let Some(configuration) = api
            .get_opt(&self.webhook_configuration)
            .await
            .map_err(|e| api_error("reading the webhook configuration", &e))?
        else {
            return Ok(true);
        };
        let newest = pem_blocks(&material.bundle)
            .last()
            .map(|p| p.to_string())
            .unwrap_or_default();
        let held = configuration
            .webhooks
            .unwrap_or_default()
            .into_iter()
            .find(|w| w.name == WEBHOOK)
            .and_then(|w| w.client_config.ca_bundle)
            .map(|b| String::from_utf8_lossy(&b.0).into_owned())
            .unwrap_or_default();
        Ok(pem_blocks(&held).contains(&newest.as_str()))
    }

    /// The step the certificate needs now, written (pinned to the Secret's
    /// version: of two leaders for a moment, one writes), then served; and
    /// the Secret restored from what is served if someone deleted it or
    /// made it unreadable.
    async fn step(&self, tls: &Tls, held: &mut Material, guard: Option<&Guard>, looks: &mut Looks) -> Result<()> {
        let live = self
            .api()
            .get_opt(SECRET)
            .await
            .map_err(|e| api_error("reading serve's certificate Secret", &e))?;
        let Some(live) = live else {
            // Someone deleted it: keep what is served (the API server trusts
            // it) rather than make a CA it does not.
            self.api()
                .create(&PostParams::default(), &held.to_secret(&self.namespace))
                .await
                .map_err(|e| api_error("restoring serve's certificate Secret", &e))?;
            tracing::warn!(secret = SECRET, "serve's certificate Secret was deleted: restored it");
            return Ok(());
        };
        let mut restore = held.to_secret(&self.namespace);
        restore.metadata.resource_version = live.metadata.resource_version.clone();
        let current = Material::from_secret(&live).ok();
        let moved_on = current
            .as_ref()
            .is_some_and(|c| c.leaf != held.leaf || c.bundle != held.bundle);
        if current.is_none() || (moved_on && self.may_serve(&live, guard).await.is_err()) {
            // Unreadable, or written while its guard was not in force: what
            // is served goes back in.
            self.api()
                .patch(SECRET, &PatchParams::default(), &Patch::Merge(&restore))
                .await
                .map_err(|e| api_error("restoring serve's certificate Secret", &e))?;
            tracing::warn!(
                secret = SECRET,
                "serve's certificate Secret could not be trusted or read: restored it"
            );
            return Ok(());
        }
        if moved_on {
            // Another leader moved it on meanwhile (the watch serves it):
            // judge again at the next look.
            return Ok(());
        }
        let now = config_snapshot_policy::model::duration::unix_now();
        let Some(step) = next_step(Some(held), now, &self.lifetimes, &self.names) else {
            return Ok(());
        };
        if step == Step::NewLeaf && held.cas() > 1 {
            // The new CA signs what is served only once the API server has
            // trusted it for a settle: seen in the configuration, not only
            // written to the Secret.
            if !self.webhook_trusts_newest(held).await? {
                looks.new_ca_trusted_since = None;
                return Ok(());
            }
            let since = *looks.new_ca_trusted_since.get_or_insert(now);
            if now < since.saturating_add(self.lifetimes.settle_secs()) {
                return Ok(());
            }
        }
        looks.new_ca_trusted_since = None;
        let next = apply(step, Some(held), &self.names, now, &self.lifetimes)?;
        let mut wanted = next.to_secret(&self.namespace);
        wanted.metadata.resource_version = live.metadata.resource_version.clone();
        self.api()
            .patch(SECRET, &PatchParams::default(), &Patch::Merge(&wanted))
            .await
            .map_err(|e| api_error("writing serve's certificate Secret", &e))?;
        tracing::info!(step = ?step, "serve's webhook certificate moved on");
        self.serve(tls, held, next);
        Ok(())
    }
}
