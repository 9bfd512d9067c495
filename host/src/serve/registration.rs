//! Keeps the webhook configuration calling the door's path (serve/door.rs).
//!
//! The install ships the MutatingWebhookConfiguration without a path: the
//! path carries a secret that only serve knows, so serve writes it, and
//! writes it again when the key rotates or someone's write took it away.
//! Because the shipped manifests never name the path, `kubectl apply`,
//! `helm upgrade` and a GitOps sync leave serve's path alone (they change
//! only fields their manifests hold).
//!
//! serve needs `get` and `patch` on that one configuration, by name. It
//! changes nothing else in it: the path of its one webhook ([`WEBHOOK`]),
//! in `service.path` or in the `url`. The leader (or serve alone without
//! `--leader-elect`) moves it from one door's path to the next (a new key,
//! a new hour), so that two replicas whose rings differ for a moment never
//! write it back and forth; any replica puts it on a door's path when it is
//! on none. Every replica is ready only while the configuration calls a
//! path its own door opens: a replica that has not seen a rotated key yet
//! takes no calls it would refuse, and an install that cannot write the
//! configuration (missing rights) shows it at once. The token never appears
//! in a log line.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use k8s_openapi::api::admissionregistration::v1::{MutatingWebhook, MutatingWebhookConfiguration};
use kube::api::{Api, Patch, PatchParams};
use kube::Client;
use serde_json::{json, Value};

use super::certificates::Trust;
use super::door::{self, Door};
use super::State;

/// How often serve reads the configuration again when nothing told it to:
/// a write that took the path away is repaired within this.
const RECHECK: Duration = Duration::from_secs(5);

/// How long after the key changed serve moves the configuration to the new
/// path: every replica watches the key Secret and opens the new path within
/// milliseconds; this is the margin for a slow one.
const AFTER_REKEY: Duration = Duration::from_secs(5);

/// The name of serve's webhook in its configuration, as every shipped
/// manifest names it: serve writes the path of this one alone, so that a
/// webhook someone else added to the configuration never learns the token.
pub const WEBHOOK: &str = "config-snapshot.config-snapshot.io";

pub struct Registration {
    pub client: Client,
    /// The MutatingWebhookConfiguration's name (`--webhook-configuration`).
    pub name: String,
    pub door: Arc<Door>,
    pub state: Arc<State>,
    /// With serve's own certificate: the CA bundle the webhook must name
    /// (serve/own_certificate.rs). `None`: the install keeps `caBundle`
    /// (cert-manager's injector, or you).
    pub bundle: Option<tokio::sync::watch::Receiver<Option<Trust>>>,
}

/// What serve found of the configuration.
#[derive(Debug, PartialEq, Eq)]
pub enum Found {
    /// Its webhook calls a path the door opens (now, or after serve's
    /// patch).
    Open,
    /// Its webhook calls a path the door does not open, and this replica
    /// may not move it (the leader moves it between keys' paths).
    Shut,
    /// There is no such configuration, or no webhook of serve's in it:
    /// nothing calls serve.
    Absent,
}

/// Why the configuration could not be kept. Only the API server's status
/// code and reason are kept, never its message: a refusal of a patch
/// repeats the value refused, and that value is the door's path.
#[derive(Debug, thiserror::Error)]
pub enum RegistrationError {
    #[error("reading MutatingWebhookConfiguration {name}: {why}")]
    Read { name: String, why: String },
    #[error(
        "moving MutatingWebhookConfiguration {name} to the door's path: {why} (serve needs get and patch on it, by name: deploy/serve/rbac.yaml)"
    )]
    Patch { name: String, why: String },
    #[error("MutatingWebhookConfiguration {name}: webhook {WEBHOOK} names neither a service nor an https URL")]
    NoClient { name: String },
}

/// A kube-rs error without the API server's message: its code and reason.
fn without_message(error: &kube::Error) -> String {
    match error {
        kube::Error::Api(status) => format!("{} {}", status.code, status.reason),
        _ => "the API server could not be reached".to_string(),
    }
}

/// The patch that makes `webhook` call `path` (`service.path`, or the path
/// of its `url`, scheme, host and port kept) and, with `bundle`, trust
/// those CAs, if it does not already.
pub(crate) fn moved(webhook: &MutatingWebhook, path: &str, bundle: Option<&str>) -> Result<Option<Value>, ()> {
    let client = &webhook.client_config;
    let mut config = serde_json::Map::new();
    if let Some(service) = &client.service {
        if service.path.as_deref() != Some(path) {
            config.insert("service".into(), json!({"path": path}));
        }
    } else if let Some(url) = &client.url {
        let wanted = with_path(url, path).ok_or(())?;
        if *url != wanted {
            config.insert("url".into(), json!(wanted));
        }
    } else {
        return Err(());
    }
    if let Some(bundle) = bundle {
        if !trusts(webhook, bundle) {
            config.insert(
                "caBundle".into(),
                json!(base64::engine::general_purpose::STANDARD.encode(bundle)),
            );
        }
    }
    Ok((!config.is_empty()).then(|| json!({"name": webhook.name, "clientConfig": config})))
}

/// Whether `webhook`'s `caBundle` is exactly `bundle`.
fn trusts(webhook: &MutatingWebhook, bundle: &str) -> bool {
    webhook
        .client_config
        .ca_bundle
        .as_ref()
        .is_some_and(|b| b.0 == bundle.as_bytes())
}

/// Whether `webhook`'s `caBundle` holds the CA certificate `ca` (PEM).
fn includes(webhook: &MutatingWebhook, ca: &str) -> bool {
    let held = webhook
        .client_config
        .ca_bundle
        .as_ref()
        .map(|b| String::from_utf8_lossy(&b.0).into_owned());
    held.is_some_and(|held| !ca.is_empty() && held.contains(ca.trim()))
}

/// The path `webhook` calls: its service's, or its URL's.
fn called(webhook: &MutatingWebhook) -> Option<String> {
    let client = &webhook.client_config;
    if let Some(service) = &client.service {
        return Some(service.path.clone().unwrap_or_default());
    }
    let rest = client.url.as_deref()?.strip_prefix("https://")?;
    Some(rest.find('/').map_or(String::new(), |at| rest[at..].to_string()))
}

/// `url` with its path replaced by `path`: `https://host:port` kept.
fn with_path(url: &str, path: &str) -> Option<String> {
    let rest = url.strip_prefix("https://")?;
    let authority = rest.split(['/', '?', '#']).next()?;
    if authority.is_empty() {
        return None;
    }
    Some(format!("https://{authority}{path}"))
}

impl Registration {
    fn api(&self) -> Api<MutatingWebhookConfiguration> {
        Api::all(self.client.clone())
    }

    /// Reads the configuration and, where this replica may, moves serve's
    /// webhook to the door's current path, in one strategic merge patch
    /// keyed by webhook name (so that nothing else in it is written).
    ///
    /// Who may move it: the leader (`leading`), between one key's or hour's
    /// path and the next, once a new key has had [`AFTER_REKEY`] to reach
    /// every replica; and any replica, when the path is not a door's at all
    /// (a fresh install, an upgrade from a version without the door, an
    /// apply that took it away): no replica's door opens such a path, so
    /// waiting for a leader (which an older version may hold) would leave
    /// every call refused.
    pub async fn once(&self, leading: bool) -> Result<Found, RegistrationError> {
        let name = &self.name;
        let Some(configuration) = self.api().get_opt(name).await.map_err(|e| RegistrationError::Read {
            name: name.clone(),
            why: without_message(&e),
        })?
        else {
            return Ok(Found::Absent);
        };
        let Some(webhook) = configuration
            .webhooks
            .unwrap_or_default()
            .into_iter()
            .find(|w| w.name == WEBHOOK)
        else {
            return Ok(Found::Absent);
        };
        let now = config_snapshot_policy::duration::unix_now();
        let calling = called(&webhook).ok_or_else(|| RegistrationError::NoClient { name: name.clone() })?;
        let own = self.bundle.as_ref().and_then(|b| b.borrow().clone());
        let bundle = own.as_ref().map(|o| o.bundle.as_str());
        // The API server must trust what this replica serves; the leader
        // keeps the bundle exactly serve's (a CA added or dropped), any
        // replica adds its own CA when it is missing.
        let distrusted = own.as_ref().is_some_and(|o| !includes(&webhook, &o.serving_ca));
        let moves = (leading && self.door.settled(AFTER_REKEY)) || !door::shaped(&calling) || distrusted;
        if !moves {
            return Ok(if self.door.opens(&calling, now) {
                Found::Open
            } else {
                Found::Shut
            });
        }
        let path = self.door.path(now);
        let Some(patch) =
            moved(&webhook, &path, bundle).map_err(|()| RegistrationError::NoClient { name: name.clone() })?
        else {
            return Ok(Found::Open);
        };
        self.api()
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Strategic(json!({"webhooks": [patch]})),
            )
            .await
            .map_err(|e| RegistrationError::Patch {
                name: name.clone(),
                why: without_message(&e),
            })?;
        tracing::info!(configuration = %name, "the webhook configuration now calls the door's path");
        Ok(Found::Open)
    }

    /// Keeps the configuration on the door's path while serve runs: at
    /// start, when the key changes (after [`AFTER_REKEY`]), and every
    /// [`RECHECK`] (a new hour's path, a write that took it away). Ready
    /// while it holds; not ready while it calls a path this replica's door
    /// does not open. A failed read keeps what was last found: a moment of
    /// API errors must not take every replica out of the Service at once.
    pub async fn keep(self) {
        // What was last found, so that a state is logged when it begins,
        // not at every look.
        let mut last = String::new();
        loop {
            let rekeyed = self.door.changed.notified();
            tokio::pin!(rekeyed);
            rekeyed.as_mut().enable();
            let found = self.once(self.state.leadership.leading()).await;
            let now = format!("{found:?}");
            let changed = now != last;
            match found {
                Ok(Found::Open) => self.state.registered.store(true, Ordering::SeqCst),
                Ok(Found::Shut) => {
                    if changed {
                        tracing::warn!(configuration = %self.name, "the webhook configuration calls a path this replica's door does not open (the leader moves it to the current key's): not ready until it does");
                    }
                    self.state.registered.store(false, Ordering::SeqCst);
                }
                Ok(Found::Absent) => {
                    if changed {
                        tracing::warn!(configuration = %self.name, webhook = WEBHOOK, "no such MutatingWebhookConfiguration, or no such webhook in it: nothing calls serve until there is (--webhook-configuration)");
                    }
                    self.state.registered.store(true, Ordering::SeqCst);
                }
                Err(e @ RegistrationError::Read { .. }) => {
                    if changed {
                        tracing::warn!("{e}; keeping what was last found");
                    }
                }
                Err(e) => {
                    if changed {
                        tracing::error!("{e}; not ready until it is");
                    }
                    self.state.registered.store(false, Ordering::SeqCst);
                }
            }
            last = now;
            // A new CA bundle is written at once (serve/certificates.rs
            // counts on it within its settle).
            let mut bundle = self.bundle.clone();
            let trust_changed = async {
                match bundle.as_mut() {
                    Some(b) => drop(b.changed().await),
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = rekeyed => tokio::time::sleep(AFTER_REKEY).await,
                _ = trust_changed => {}
                _ = tokio::time::sleep(RECHECK) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::admissionregistration::v1::{ServiceReference, WebhookClientConfig};

    fn webhook(client: WebhookClientConfig) -> MutatingWebhook {
        MutatingWebhook {
            name: "config-snapshot.config-snapshot.io".to_string(),
            client_config: client,
            ..MutatingWebhook::default()
        }
    }

    #[test]
    fn a_service_webhook_gets_the_path_and_nothing_else() {
        let service = |path: Option<&str>| WebhookClientConfig {
            service: Some(ServiceReference {
                name: "config-snapshot".to_string(),
                namespace: "config-snapshot".to_string(),
                path: path.map(str::to_string),
                port: Some(443),
            }),
            ..WebhookClientConfig::default()
        };
        let patch = moved(&webhook(service(None)), "/mutate/abc", None).unwrap().unwrap();
        assert_eq!(
            patch,
            json!({"name": "config-snapshot.config-snapshot.io", "clientConfig": {"service": {"path": "/mutate/abc"}}})
        );
        assert_eq!(
            moved(&webhook(service(Some("/mutate"))), "/mutate/abc", None).unwrap(),
            Some(patch)
        );
        assert_eq!(
            moved(&webhook(service(Some("/mutate/abc"))), "/mutate/abc", None).unwrap(),
            None
        );
    }

    /// With serve's own certificate, the webhook is made to trust its CA
    /// bundle, in the same patch as the path, and only when it does not.
    #[test]
    fn serves_own_ca_bundle_goes_with_the_path() {
        let config = |bundle: Option<&[u8]>| WebhookClientConfig {
            service: Some(ServiceReference {
                name: "config-snapshot".to_string(),
                namespace: "config-snapshot".to_string(),
                path: Some("/mutate/abc".to_string()),
                port: Some(443),
            }),
            ca_bundle: bundle.map(|b| k8s_openapi::ByteString(b.to_vec())),
            ..WebhookClientConfig::default()
        };
        let pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
        let patch = moved(&webhook(config(None)), "/mutate/abc", Some(pem))
            .unwrap()
            .unwrap();
        assert_eq!(
            patch["clientConfig"],
            json!({"caBundle": base64::engine::general_purpose::STANDARD.encode(pem)})
        );
        assert_eq!(
            moved(&webhook(config(Some(pem.as_bytes()))), "/mutate/abc", Some(pem)).unwrap(),
            None
        );
        assert!(moved(&webhook(config(Some(b"another"))), "/mutate/abc", Some(pem))
            .unwrap()
            .is_some());
        assert_eq!(
            moved(&webhook(config(Some(b"another"))), "/mutate/abc", None).unwrap(),
            None,
            "cert-manager keeps it"
        );
    }

    #[test]
    fn a_url_webhook_keeps_its_host_and_gets_the_path() {
        let url = |u: &str| WebhookClientConfig {
            url: Some(u.to_string()),
            ..WebhookClientConfig::default()
        };
        for given in [
            "https://127.0.0.1:8443/mutate",
            "https://127.0.0.1:8443",
            "https://127.0.0.1:8443/mutate/old",
        ] {
            let patch = moved(&webhook(url(given)), "/mutate/abc", None).unwrap().unwrap();
            assert_eq!(
                patch["clientConfig"]["url"], "https://127.0.0.1:8443/mutate/abc",
                "{given}"
            );
        }
        assert_eq!(
            moved(&webhook(url("https://h:1/mutate/abc")), "/mutate/abc", None).unwrap(),
            None
        );
        assert!(moved(&webhook(url("http://h/mutate")), "/mutate/abc", None).is_err());
        assert!(moved(&webhook(WebhookClientConfig::default()), "/mutate/abc", None).is_err());
    }
}
