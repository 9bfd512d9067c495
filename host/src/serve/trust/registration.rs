//! Keeps the webhook configuration calling the door's path (serve/intake/door.rs).
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
//! configuration (missing rights) shows it at once. What each replica sees
//! the configuration call also closes the door to earlier keys' paths once
//! it calls the current key's (`Door::configured`). The token never appears
//! in a log line.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use k8s_openapi::api::admissionregistration::v1::{MutatingWebhook, MutatingWebhookConfiguration};
use kube::api::{Api, Patch, PatchParams};
use kube::Client;
use serde_json::{json, Value};

use super::certificates::{pem_blocks, wanted_bundle, Trust};
use crate::serve::answer::state::State;
use crate::serve::intake::door::{self, Door};

/// How often serve reads the configuration again when nothing told it to:
/// a write that took the path away is repaired within this.
const RECHECK: Duration = Duration::from_secs(5);

/// How long after the key changed serve moves the configuration to the new
/// path: every replica watches the key Secret and opens the new path within
/// milliseconds; this is the margin for a slow one.
const AFTER_REKEY: Duration = Duration::from_secs(5);

/// How long a pass waits after the trust changed, so that what changes
/// together (a bundle and the certificate served) is written once.
const TRUST_BATCH: Duration = Duration::from_millis(200);

/// The name of serve's webhook in its configuration, as every shipped
/// manifest names it: serve writes the path of this one alone, so that a
/// webhook someone else added to the configuration never learns the token.
pub const WEBHOOK: &str = "config-snapshot.config-snapshot.io";

pub(crate) struct Registration {
    pub client: Client,
    /// The MutatingWebhookConfiguration's name (`--webhook-configuration`).
    pub name: String,
    pub door: Arc<Door>,
    pub state: Arc<State>,
    /// With serve's own certificate: the CA bundle the webhook must name
    /// (serve/trust/own_certificate.rs). `None`: the install keeps `caBundle`
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
pub(crate) enum RegistrationError {
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
pub(crate) fn without_message(error: &kube::Error) -> String {
    match error {
        kube::Error::Api(status) => format!("{} {}", status.code, status.reason),
        _ => "the API server could not be reached".to_string(),
    }
}

/// The patch that makes `webhook` call `path` (`service.path`, or the path
/// of its `url`, scheme, host and port kept) and trust `bundle` (its
/// `caBundle`), each if given and not so already.
pub(crate) fn moved(webhook: &MutatingWebhook, path: Option<&str>, bundle: Option<&str>) -> Result<Option<Value>, ()> {
    let client = &webhook.client_config;
    let mut config = serde_json::Map::new();
    if let Some(service) = &client.service {
        if path.is_some_and(|p| service.path.as_deref() != Some(p)) {
            config.insert("service".into(), json!({"path": path}));
        }
    } else if let Some(url) = &client.url {
        if let Some(path) = path {
            let wanted = with_path(url, path).ok_or(())?;
            if *url != wanted {
                config.insert("url".into(), json!(wanted));
            }
        }
    } else {
        return Err(());
    }
    if let Some(bundle) = bundle.filter(|b| held_bundle(webhook) != *b) {
        config.insert(
            "caBundle".into(),
            json!(base64::engine::general_purpose::STANDARD.encode(bundle)),
        );
    }
    Ok((!config.is_empty()).then(|| json!({"name": webhook.name, "clientConfig": config})))
}

/// `webhook`'s `caBundle`, as text.
fn held_bundle(webhook: &MutatingWebhook) -> String {
    webhook
        .client_config
        .ca_bundle
        .as_ref()
        .map(|b| String::from_utf8_lossy(&b.0).into_owned())
        .unwrap_or_default()
}

/// The `caBundle` this replica writes, if any: the leader makes it hold
/// serve's CAs (the retired ones out, any other kept: yours or
/// cert-manager's, while a change of mode rolls out); another replica
/// only adds the CA of the certificate it serves, when it is missing, and
/// never takes one out, so that replicas a moment apart never undo each
/// other's trust.
fn trust_write(held: &str, trust: &Trust, leading: bool) -> Option<String> {
    if leading {
        return wanted_bundle(held, trust);
    }
    if pem_blocks(held).contains(&trust.serving_ca.trim()) {
        return None;
    }
    let mut out: String = pem_blocks(held).iter().map(|p| format!("{p}\n")).collect();
    out.push_str(trust.serving_ca.trim());
    out.push('\n');
    Some(out)
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

/// The host `url` calls (`https://HOST:PORT/…`, an IPv6 host without its
/// brackets).
fn url_host(url: &str) -> Option<String> {
    let authority = url.strip_prefix("https://")?.split(['/', '?', '#']).next()?;
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next()?,
        None => authority.rsplit_once(':').map_or(authority, |(host, _)| host),
    };
    (!host.is_empty()).then(|| host.to_string())
}

/// The host serve's webhook calls, when it calls a URL rather than a
/// Service: serve's own certificate must name it too.
pub(crate) async fn called_host(client: &Client, name: &str) -> Option<String> {
    let api: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let configuration = api.get_opt(name).await.ok()??;
    let webhook = configuration.webhooks?.into_iter().find(|w| w.name == WEBHOOK)?;
    url_host(webhook.client_config.url.as_deref()?)
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
        let now = config_snapshot_policy::model::duration::unix_now();
        let calling = called(&webhook).ok_or_else(|| RegistrationError::NoClient { name: name.clone() })?;
        let own = self.bundle.as_ref().and_then(|b| b.borrow().clone());
        let held = held_bundle(&webhook);
        let path =
            ((leading && self.door.settled(AFTER_REKEY)) || !door::shaped(&calling)).then(|| self.door.path(now));
        let bundle = own.as_ref().and_then(|trust| trust_write(&held, trust, leading));
        if let Some(patch) = moved(&webhook, path.as_ref().map(|p| p.as_str()), bundle.as_deref())
            .map_err(|()| RegistrationError::NoClient { name: name.clone() })?
        {
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
            tracing::info!(configuration = %name, "the webhook configuration now calls the door's path and trusts serve's CA");
        }
        // Ready while the API server calls a path the door opens, and
        // trusts the CA of what this replica serves. Once it calls the
        // current key's path, the earlier keys' paths close (finding 8).
        let calls = path.as_ref().map_or(calling.as_str(), |p| p.as_str());
        self.door.configured(calls, now);
        let trusted =
            own.is_none_or(|trust| pem_blocks(bundle.as_deref().unwrap_or(&held)).contains(&trust.serving_ca.trim()));
        Ok(if self.door.opens(calls, now) && trusted {
            Found::Open
        } else {
            Found::Shut
        })
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
        let mut trust = self.bundle.clone();
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
            // A new CA bundle is written at once (serve/trust/certificates.rs
            // counts on it within its settle); one receiver held across
            // passes, so that a change wakes one pass, not every one.
            let trust_changed = async {
                match trust.as_mut() {
                    Some(t) => match t.changed().await {
                        Ok(()) => tokio::time::sleep(TRUST_BATCH).await,
                        Err(_) => std::future::pending().await,
                    },
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
    fn a_urls_host_is_what_the_certificate_must_name() {
        assert_eq!(url_host("https://127.0.0.1:9443/mutate").as_deref(), Some("127.0.0.1"));
        assert_eq!(url_host("https://[::1]:9443/x").as_deref(), Some("::1"));
        assert_eq!(
            url_host("https://serve.example.com/x").as_deref(),
            Some("serve.example.com")
        );
        assert_eq!(url_host("http://plain:80/x"), None);
        assert_eq!(url_host("https://:1/x"), None);
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
        let patch = moved(&webhook(service(None)), Some("/mutate/abc"), None)
            .unwrap()
            .unwrap();
        assert_eq!(
            patch,
            json!({"name": "config-snapshot.config-snapshot.io", "clientConfig": {"service": {"path": "/mutate/abc"}}})
        );
        assert_eq!(
            moved(&webhook(service(Some("/mutate"))), Some("/mutate/abc"), None).unwrap(),
            Some(patch)
        );
        assert_eq!(
            moved(&webhook(service(Some("/mutate/abc"))), Some("/mutate/abc"), None).unwrap(),
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
        let patch = moved(&webhook(config(None)), Some("/mutate/abc"), Some(pem))
            .unwrap()
            .unwrap();
        assert_eq!(
            patch["clientConfig"],
            json!({"caBundle": base64::engine::general_purpose::STANDARD.encode(pem)})
        );
        assert_eq!(
            moved(&webhook(config(Some(pem.as_bytes()))), Some("/mutate/abc"), Some(pem)).unwrap(),
            None
        );
        assert_eq!(
            moved(&webhook(config(Some(b"another"))), None, None).unwrap(),
            None,
            "nothing to write: the path and the bundle kept"
        );
    }

    fn pem(body: &str) -> String {
        format!("-----BEGIN CERTIFICATE-----\n{body}\n-----END CERTIFICATE-----")
    }

    /// Attacker review, round 4 (H2): a replica never takes a CA out of
    /// the webhook's bundle unless it leads and serve retired that CA, so
    /// a CA someone else put there (a change of mode rolling out, yours)
    /// and a replica a moment behind never lose the API server's trust.
    #[test]
    fn only_the_leader_drops_a_ca_and_only_one_serve_retired() {
        let (old, new, theirs) = (pem("OLD"), pem("NEW"), pem("THEIRS"));
        let trust = Trust {
            bundle: format!("{new}\n"),
            serving_ca: new.clone(),
            retired: vec![old.clone()],
        };
        let held = format!("{theirs}\n{old}\n");
        // The leader: its CA in, the retired one out, theirs kept.
        let led = trust_write(&held, &trust, true).unwrap();
        assert_eq!(pem_blocks(&led), [theirs.as_str(), new.as_str()]);
        assert_eq!(trust_write(&led, &trust, true), None, "written once");
        // Another replica: adds the CA it serves, drops nothing.
        let added = trust_write(&held, &trust, false).unwrap();
        assert_eq!(pem_blocks(&added), [theirs.as_str(), old.as_str(), new.as_str()]);
        assert_eq!(trust_write(&added, &trust, false), None);
        // A replica still serving the old CA's certificate adds it back; the
        // leader then takes it out again only because serve retired it.
        let behind = Trust {
            bundle: format!("{old}\n{new}\n"),
            serving_ca: old.clone(),
            retired: vec![],
        };
        let readded = trust_write(&led, &behind, false).unwrap();
        assert!(pem_blocks(&readded).contains(&old.as_str()));
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
            let patch = moved(&webhook(url(given)), Some("/mutate/abc"), None).unwrap().unwrap();
            assert_eq!(
                patch["clientConfig"]["url"], "https://127.0.0.1:8443/mutate/abc",
                "{given}"
            );
        }
        assert_eq!(
            moved(&webhook(url("https://h:1/mutate/abc")), Some("/mutate/abc"), None).unwrap(),
            None
        );
        assert!(moved(&webhook(url("http://h/mutate")), Some("/mutate/abc"), None).is_err());
        assert!(moved(&webhook(WebhookClientConfig::default()), Some("/mutate/abc"), None).is_err());
    }
}
