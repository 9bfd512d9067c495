//! serve's own certificate at work (serve/certificates.rs decides): loaded
//! from its Secret at start (made there when there is none, made anew when
//! the Secret is older than its guard, as after a reinstall), served by
//! every replica and reloaded the moment the Secret changes, and renewed by
//! the leader, one step at a time. The CA bundle it publishes is what the
//! registration (serve/registration.rs) keeps in the webhook configuration.
//!
//! The Secret is guarded as the signing key is (deploy/serve/keyguard.yaml
//! names both): only serve's ServiceAccount and the key administrators write
//! it, so a CA someone else planted is never served or trusted.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, Context as _, Result};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher::{self, Event};
use kube::Client;
use tokio::sync::watch;

use super::certificates::{apply, next_step, Lifetimes, Material, Step, Trust, SECRET};
use super::leader::Leadership;
use super::listener::{server_config_pem, Tls};
use super::signing::KeySecret;

/// How often the leader looks whether the certificate needs a step: a
/// third of a settle, at most 20 s.
fn look_every(lifetimes: &Lifetimes) -> Duration {
    Duration::from_secs(u64::try_from(lifetimes.settle_secs() / 3).unwrap_or(1).clamp(1, 20))
}

pub struct OwnCertificate {
    pub client: Client,
    pub namespace: String,
    /// The Service's DNS names the serving certificate names.
    pub names: Vec<String>,
    pub lifetimes: Lifetimes,
    /// The guard's checks, for this Secret (`KeySecret` named [`SECRET`]).
    pub guard: KeySecret,
    pub client_ca: Option<PathBuf>,
    /// What the webhook configuration must trust.
    pub trust: watch::Sender<Option<Trust>>,
}

impl OwnCertificate {
    fn api(&self) -> Api<Secret> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// The material, as serve may serve it: the Secret's if it is trusted,
    /// else made now (and the untrusted one replaced).
    pub async fn load(&self) -> Result<Material> {
        let guard = if self.guard.trust_unguarded {
            self.guard.guard().await.ok()
        } else {
            Some(self.guard.guard().await?)
        };
        for _ in 0..3 {
            match self
                .api()
                .get_opt(SECRET)
                .await
                .context("reading serve's certificate Secret")?
            {
                Some(secret) if self.guard.trusted(&secret, guard.as_ref()).is_ok() => {
                    if let Ok(m) = Material::from_secret(&secret) {
                        return Ok(m);
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
            let now = config_snapshot_policy::duration::unix_now();
            let made = apply(Step::Create, None, &self.names, now, &self.lifetimes)?;
            match self
                .api()
                .create(&PostParams::default(), &made.to_secret(&self.namespace))
                .await
            {
                Ok(_) => {
                    tracing::info!(secret = SECRET, "made serve's webhook CA and certificate");
                    return Ok(made);
                }
                // Another replica made it first: read theirs.
                Err(kube::Error::Api(status)) if status.code == 409 => continue,
                Err(e) => return Err(anyhow!(e).context("creating serve's certificate Secret")),
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
            Err(e) => Err(anyhow!(e).context("replacing serve's certificate Secret")),
        }
    }

    /// The TLS configuration of `material`.
    pub fn tls_config(&self, material: &Material) -> Result<Arc<rustls::ServerConfig>> {
        server_config_pem(&material.leaf, &material.leaf_key, self.client_ca.as_deref())
    }

    /// Serves the Secret's certificate while serve runs: every change is
    /// served at once (and what the webhook must trust published); the leader renews it.
    pub async fn keep(self, tls: Tls, held: Material, leadership: Arc<Leadership>) {
        let mut held = held;
        self.trust.send_replace(Some(held.trust()));
        let config = watcher::Config::default().fields(&format!("metadata.name={SECRET}"));
        let mut events = watcher::watcher(self.api(), config).boxed();
        let mut look = tokio::time::interval(look_every(&self.lifetimes));
        loop {
            tokio::select! {
                event = events.next() => match event {
                    Some(Ok(Event::Apply(secret) | Event::InitApply(secret))) => {
                        if let Ok(m) = Material::from_secret(&secret) {
                            self.serve(&tls, &mut held, m);
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
                        if let Err(e) = self.step(&tls, &mut held).await {
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

    /// The step the certificate needs now, written (pinned to the Secret's
    /// version: of two leaders for a moment, one writes), then served; and
    /// the Secret restored if someone deleted it.
    async fn step(&self, tls: &Tls, held: &mut Material) -> Result<()> {
        let Some(live) = self
            .api()
            .get_opt(SECRET)
            .await
            .context("reading serve's certificate Secret")?
        else {
            // Someone deleted it: keep what is served (the API server trusts
            // it) rather than make a CA it does not.
            self.api()
                .create(&PostParams::default(), &held.to_secret(&self.namespace))
                .await
                .context("restoring serve's certificate Secret")?;
            tracing::warn!(secret = SECRET, "serve's certificate Secret was deleted: restored it");
            return Ok(());
        };
        let current = Material::from_secret(&live)?;
        if current.leaf != held.leaf || current.bundle != held.bundle {
            // Someone moved it on meanwhile: serve theirs, judge again later.
            self.serve(tls, held, current);
            return Ok(());
        }
        let now = config_snapshot_policy::duration::unix_now();
        let Some(step) = next_step(Some(held), now, &self.lifetimes) else {
            return Ok(());
        };
        let next = apply(step, Some(held), &self.names, now, &self.lifetimes)?;
        let mut wanted = next.to_secret(&self.namespace);
        wanted.metadata.resource_version = live.metadata.resource_version.clone();
        self.api()
            .patch(SECRET, &PatchParams::default(), &Patch::Merge(&wanted))
            .await
            .context("writing serve's certificate Secret")?;
        tracing::info!(step = ?step, "serve's webhook certificate moved on");
        self.serve(tls, held, next);
        Ok(())
    }
}
