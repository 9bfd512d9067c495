//! serve's signing keyring (docs/security.md, "The signing key"): the keys
//! its [`Prover`] signs snapshots and keys Secret names with. Read from
//! `--signing-key-file` (a mounted Secret, a test fixture), or kept in a
//! Secret in serve's own namespace, which the first replica to start
//! creates with a random key and every other replica reads.
//!
//! The Secret holds the current key as `key` and earlier ones as
//! `key-<id>`: the current key signs and names, every key verifies. The
//! commands `config-snapshot keys rotate` and `keys restore` change the
//! ring; replicas watch the Secret and use the new ring at once. If the
//! Secret is deleted while serve runs, serve writes it again from the ring
//! it holds: users' work goes on, and no key is lost.
//!
//! A key someone else wrote is not trusted. Whoever can create that Secret
//! before serve does could plant a key they know, and then forge snapshots
//! serve would sweep, adopt and reuse. So the Secret is guarded: a
//! ValidatingAdmissionPolicy (deploy/serve/keyguard.yaml, and the chart)
//! lets only serve's ServiceAccount and the key administrators write it,
//! and serve trusts the Secret only while that guard is in force and only
//! if the Secret was created after the guard was (a Secret older than its
//! guard may have been planted before it). See [`Guard`]. Every later
//! version is judged again while serve runs, by the rule the CA's Secret is
//! judged by too (serve/trust/guarded.rs): one written while the guard was away
//! is not taken, and the door does not move.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, Context as _, Result};
use base64::Engine as _;
use futures::StreamExt;
use k8s_openapi::api::admissionregistration::v1::{ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::ByteString;
use kube::api::{Api, DeleteParams, PostParams};
use kube::runtime::watcher::{self, Event};
use kube::Client;
use prometheus_client::metrics::gauge::Gauge;
use zeroize::Zeroizing;

use crate::cluster::proof::{Keyring, Prover, MIN_KEY_BYTES};
use crate::cluster::ApiError;

/// A failed write of a key Secret as serve says it: its status alone, never
/// the API server's message, which an admission denying the write may have
/// filled with the object, keys and all.
fn without_message(error: kube::Error) -> ApiError {
    ApiError::from(error).without_message()
}

/// The current key within the Secret.
pub(crate) const CURRENT: &str = "key";

/// The prefix of an earlier key's field (`key-<id>`).
const EARLIER: &str = "key-";

/// How long after the guard was made the API server may still let a write
/// through unguarded (its policy informer's lag): a key Secret created
/// sooner is not trusted, and serve waits this long before creating one.
pub(crate) const GUARD_SETTLES: i64 = 5;

/// The key from a file: raw bytes, or their base64 (a file written by
/// hand).
pub(crate) fn from_file(path: &Path) -> Result<Keyring> {
    let bytes = Zeroizing::new(std::fs::read(path).with_context(|| format!("reading {}", path.display()))?);
    let text = std::str::from_utf8(&bytes).ok().map(str::trim);
    let key = match text.and_then(|t| base64::engine::general_purpose::STANDARD.decode(t).ok()) {
        Some(decoded) if decoded.len() >= MIN_KEY_BYTES => Zeroizing::new(decoded),
        _ => bytes.clone(),
    };
    Keyring::new(vec![key]).map_err(|e| anyhow!("--signing-key-file {}: {e}", path.display()))
}

/// The keyring a key Secret holds.
pub fn ring_of(secret: &Secret) -> Result<Keyring> {
    let name = secret.metadata.name.as_deref().unwrap_or_default();
    let data = secret
        .data
        .as_ref()
        .ok_or_else(|| anyhow!("Secret {name} holds no data"))?;
    let current = data
        .get(CURRENT)
        .ok_or_else(|| anyhow!("Secret {name} holds no {CURRENT:?}"))?;
    let mut keys = vec![Zeroizing::new(current.0.clone())];
    // BTreeMap: the earlier keys in a stable order.
    keys.extend(
        data.iter()
            .filter(|(field, _)| field.starts_with(EARLIER))
            .map(|(_, key)| Zeroizing::new(key.0.clone())),
    );
    Keyring::new(keys).map_err(|e| anyhow!("Secret {name}: {e}"))
}

/// The key Secret `namespace/name` that holds `ring`. Not immutable: a
/// rotation or a restore updates it, under the guard.
pub(crate) fn secret_of(ring: &Keyring, namespace: &str, name: &str) -> Secret {
    let mut data = BTreeMap::new();
    let mut keys = ring.keys().iter();
    if let Some(current) = keys.next() {
        data.insert(CURRENT.to_string(), ByteString(current.to_vec()));
    }
    for key in keys {
        data.insert(format!("{EARLIER}{}", Keyring::id(key)), ByteString(key.to_vec()));
    }
    Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(namespace.to_string()),
            labels: Some(
                [
                    ("app.kubernetes.io/name".to_string(), "config-snapshot".to_string()),
                    ("app.kubernetes.io/component".to_string(), "signing-key".to_string()),
                ]
                .into(),
            ),
            ..Default::default()
        },
        data: Some(data),
        ..Default::default()
    }
}

/// The guard that makes the key Secret trustworthy: a
/// ValidatingAdmissionPolicy named [`SIGNING_KEY_GUARD`](crate::serve::answer::options::SIGNING_KEY_GUARD) with failure policy `Fail`,
/// whose validation names serve's ServiceAccount and the Secret, bound
/// with `Deny`. Since when it has been in force, and which objects it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Guard {
    pub since: i64,
    /// The uids of its binding and its policy: a guard deleted and made
    /// anew is another guard, even within the second its creation time
    /// counts in ([`super::guarded`]).
    pub(crate) uids: (String, String),
}

/// Returns once a Secret created now is trusted under `guard`.
pub(crate) async fn settle(guard: Option<&Guard>) {
    if let Some(guard) = guard {
        let wait = guard.since + GUARD_SETTLES + 1 - config_snapshot_policy::model::duration::unix_now();
        if wait > 0 {
            tokio::time::sleep(Duration::from_secs(wait as u64)).await;
        }
    }
}

/// What serve checks before it trusts, or creates, its key Secret.
pub struct KeySecret {
    pub client: Client,
    pub namespace: String,
    pub name: String,
    /// serve's ServiceAccount, which the guard must name.
    pub service_account: String,
    /// The guard's ValidatingAdmissionPolicy and binding.
    pub guard: String,
    /// Trust the Secret without the guard (`--trust-unguarded-signing-key`):
    /// whoever can write Secrets in serve's namespace can then plant a key.
    pub trust_unguarded: bool,
}

fn unix(time: Option<&Time>) -> Option<i64> {
    time.map(|t| t.0.as_second())
}

/// Whether `secret` was made once `guard` was in force (its informer's lag
/// past, [`GUARD_SETTLES`]): then every version of it was written under the
/// guard, by serve or a key administrator.
pub(crate) fn made_under(secret: &Secret, guard: &Guard) -> bool {
    unix(secret.metadata.creation_timestamp.as_ref()).is_some_and(|created| created >= guard.since + GUARD_SETTLES)
}

impl KeySecret {
    /// The guard in force, or why it is not.
    pub async fn guard(&self) -> Result<Guard> {
        let guard = self.guard.as_str();
        let bindings: Api<ValidatingAdmissionPolicyBinding> = Api::all(self.client.clone());
        let policies: Api<ValidatingAdmissionPolicy> = Api::all(self.client.clone());
        let missing = |what: &str| {
            anyhow!(
                "the signing key's guard is not in force: {what} (install deploy/serve/keyguard.yaml, or the chart, which ships it)"
            )
        };
        let binding = bindings
            .get_opt(guard)
            .await
            .context("reading the signing key's guard")?
            .ok_or_else(|| missing(&format!("no ValidatingAdmissionPolicyBinding {guard}")))?;
        let spec = binding.spec.as_ref();
        if spec.and_then(|s| s.policy_name.as_deref()) != Some(guard) {
            return Err(missing(&format!("binding {guard} does not bind policy {guard}")));
        }
        if !spec
            .and_then(|s| s.validation_actions.as_ref())
            .is_some_and(|a| a.iter().any(|a| a == "Deny"))
        {
            return Err(missing(&format!("binding {guard} does not Deny")));
        }
        let policy = policies
            .get_opt(guard)
            .await
            .context("reading the signing key's guard")?
            .ok_or_else(|| missing(&format!("no ValidatingAdmissionPolicy {guard}")))?;
        let spec = policy.spec.as_ref();
        if spec
            .and_then(|s| s.failure_policy.as_deref())
            .is_some_and(|f| f != "Fail")
        {
            return Err(missing(&format!("policy {guard} does not fail closed")));
        }
        let account = format!("system:serviceaccount:{}:{}", self.namespace, self.service_account);
        let text = serde_json::to_string(&spec).unwrap_or_default();
        if !text.contains(&account) || !text.contains(&self.name) {
            return Err(missing(&format!(
                "policy {guard} does not name {account} and Secret {}",
                self.name
            )));
        }
        let since = unix(binding.metadata.creation_timestamp.as_ref())
            .max(unix(policy.metadata.creation_timestamp.as_ref()))
            .ok_or_else(|| missing("the guard has no creation time"))?;
        let uid = |meta: &kube::api::ObjectMeta| meta.uid.clone().unwrap_or_default();
        Ok(Guard {
            since,
            uids: (uid(&binding.metadata), uid(&policy.metadata)),
        })
    }

    /// The keyring: the Secret's, if it is trusted, else a new one written
    /// to it; with the guard it was judged under, which every later version
    /// is judged against ([`KeySecret::keep`]). Waits for the guard to be in
    /// force (an install may create serve before it), unless trusting
    /// without it.
    pub async fn load(&self) -> Result<(Keyring, Option<Guard>)> {
        let guard = loop {
            match self.guard().await {
                Ok(guard) => break Some(guard),
                Err(e) if self.trust_unguarded => {
                    tracing::warn!("{e:#}; trusting the key Secret anyway (--trust-unguarded-signing-key)");
                    break None;
                }
                Err(e) => {
                    tracing::warn!("{e:#}; waiting for it before reading or creating the key");
                    tokio::time::sleep(Duration::from_secs(5)).await;
                }
            }
        };
        let api: Api<Secret> = Api::namespaced(self.client.clone(), &self.namespace);
        let (namespace, name) = (&self.namespace, &self.name);
        for _ in 0..3 {
            if let Some(secret) = api
                .get_opt(name)
                .await
                .with_context(|| format!("reading Secret {namespace}/{name}"))?
            {
                self.trusted(&secret, guard.as_ref())?;
                return Ok((ring_of(&secret)?, guard));
            }
            settle(guard.as_ref()).await;
            let ring = Keyring::new(vec![Keyring::generate_key()]).map_err(|e| anyhow!("{e}"))?;
            match api
                .create(&PostParams::default(), &secret_of(&ring, namespace, name))
                .await
            {
                Ok(_) => {
                    tracing::info!(secret = %name, namespace = %namespace, key = %ring.ids()[0], "created the signing key");
                    return Ok((ring, guard));
                }
                // Another replica made it first: read theirs.
                Err(kube::Error::Api(status)) if status.code == 409 => continue,
                // Its code and reason only: a denial's message may quote the
                // object, and this one holds the key.
                Err(e) => return Err(anyhow!("creating Secret {namespace}/{name}: {}", without_message(e))),
            }
        }
        Err(anyhow!(
            "the signing key Secret {namespace}/{name} kept appearing and going"
        ))
    }

    /// `Ok` if `secret` can be trusted under `guard`: created after the
    /// guard was in force, so only serve or a key administrator wrote it.
    pub fn trusted(&self, secret: &Secret, guard: Option<&Guard>) -> Result<()> {
        let Some(guard) = guard else {
            return Ok(());
        };
        if made_under(secret, guard) {
            return Ok(());
        }
        Err(anyhow!(
            "Secret {}/{} was created before its guard was in force, so someone other than config-snapshot may have \
             written it: not trusted. If it is yours (a restore, or a reinstall made the guard anew), back it up \
             (kubectl get secret -o yaml) and run `config-snapshot keys restore -f` with it, which writes it \
             again under the guard; else delete it, and serve makes a new key",
            self.namespace,
            self.name
        ))
    }

    /// Keeps `prover` on the Secret's ring while serve runs: a rotated or
    /// restored ring is used at once, if that version of the Secret was
    /// written under the guard (`started_under`: the one [`KeySecret::load`]
    /// judged; the rule is the CA Secret's too, [`KeySecret::may_take`]).
    /// One written while the guard was not in force would let its writer
    /// forge snapshots and open the door: serve keeps the ring it holds, and
    /// so the door's path, says why and sets `untrusted` to 1 until the
    /// Secret holds a version it takes. A deleted Secret is written again
    /// from the ring held, so that no key is lost while serve runs.
    pub async fn keep(
        self,
        (ring, started_under): (Keyring, Option<Guard>),
        prover: Arc<Prover>,
        untrusted: Gauge,
        changed: impl Fn(&Keyring) + Send + 'static,
    ) {
        let api: Api<Secret> = Api::namespaced(self.client.clone(), &self.namespace);
        let config = watcher::Config::default().fields(&format!("metadata.name={}", self.name));
        let mut events = watcher::watcher(api.clone(), config).boxed();
        let mut held = ring;
        while let Some(event) = events.next().await {
            match event {
                Ok(Event::Apply(secret) | Event::InitApply(secret))
                    if secret.metadata.name.as_deref() == Some(self.name.as_str()) =>
                {
                    match ring_of(&secret) {
                        Ok(ring) if ring.ids() == held.ids() => {
                            untrusted.set(0);
                        }
                        Ok(ring) => match self.may_take(&secret, started_under.as_ref()).await {
                            Ok(()) => {
                                tracing::info!(keys = ?ring.ids(), "the signing keyring changed; using it");
                                prover.replace(&ring);
                                changed(&ring);
                                held = ring;
                                untrusted.set(0);
                            }
                            Err(why) => {
                                tracing::error!(
                                    secret = %self.name,
                                    "the signing key Secret changed, and its new version is not trusted: {why}; keeping the keyring held (and the webhook's path)"
                                );
                                untrusted.set(1);
                            }
                        },
                        Err(e) => tracing::error!("keeping the signing keyring held: {e:#}"),
                    }
                }
                Ok(Event::Delete(_)) => {
                    tracing::warn!("the signing key Secret was deleted; writing it again from the keyring held");
                    match api
                        .create(&PostParams::default(), &secret_of(&held, &self.namespace, &self.name))
                        .await
                    {
                        Ok(_) => {
                            untrusted.set(0);
                        }
                        Err(kube::Error::Api(status)) if status.code == 409 => {}
                        Err(e) => tracing::error!("writing the signing key Secret again: {}", without_message(e)),
                    }
                }
                Ok(Event::Apply(_) | Event::InitApply(_) | Event::Init | Event::InitDone) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "watching the signing key Secret failed; retrying");
                    tokio::time::sleep(Duration::from_secs(5)).await;
                }
            }
        }
    }

    /// Writes `ring` to the Secret: creates it if absent, updates it if
    /// serve would trust it, else (immutable, written by an earlier
    /// version; or created before the guard now in force, as after a
    /// reinstall) deletes and creates it, under the guard, so that serve
    /// trusts it on its next start.
    pub async fn write(&self, ring: &Keyring) -> Result<()> {
        let api: Api<Secret> = Api::namespaced(self.client.clone(), &self.namespace);
        let (namespace, name) = (&self.namespace, &self.name);
        // Without a guard (none named, or none installed) serve decides
        // trust by its own flags; nothing to wait for.
        let guard = if self.guard.is_empty() {
            None
        } else {
            self.guard().await.ok()
        };
        settle(guard.as_ref()).await;
        for _ in 0..5 {
            let mut wanted = secret_of(ring, namespace, name);
            let result = match api.get_opt(name).await? {
                None => api.create(&PostParams::default(), &wanted).await.map(|_| ()),
                Some(live) if live.immutable == Some(true) || self.trusted(&live, guard.as_ref()).is_err() => {
                    let uid = live.metadata.uid.clone();
                    let params = DeleteParams {
                        preconditions: Some(kube::api::Preconditions {
                            uid,
                            resource_version: live.metadata.resource_version.clone(),
                        }),
                        ..DeleteParams::default()
                    };
                    match api.delete(name, &params).await {
                        Ok(_) => api.create(&PostParams::default(), &wanted).await.map(|_| ()),
                        Err(e) => Err(e),
                    }
                }
                Some(live) => {
                    wanted.metadata.resource_version = live.metadata.resource_version.clone();
                    api.replace(name, &PostParams::default(), &wanted).await.map(|_| ())
                }
            };
            match result {
                Ok(()) => return Ok(()),
                // Moved meanwhile (a replica wrote it again): once more.
                Err(kube::Error::Api(status)) if matches!(status.code, 404 | 409) => continue,
                Err(e) => return Err(anyhow!("writing Secret {namespace}/{name}: {}", without_message(e))),
            }
        }
        Err(anyhow!("Secret {namespace}/{name} kept changing while it was written"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_file_is_raw_or_base64_and_never_short() {
        let dir = std::env::temp_dir().join(format!("cs-signing-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let raw = dir.join("raw");
        std::fs::write(&raw, [7u8; 32]).unwrap();
        let encoded = dir.join("b64");
        std::fs::write(
            &encoded,
            base64::engine::general_purpose::STANDARD.encode([7u8; 32]) + "\n",
        )
        .unwrap();
        let (a, b) = (from_file(&raw).unwrap(), from_file(&encoded).unwrap());
        assert_eq!(a.ids(), b.ids(), "the same key either way");
        let short = dir.join("short");
        std::fs::write(&short, b"too short").unwrap();
        assert!(from_file(&short).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A ring written to a Secret reads back the same, current key first;
    /// a Secret of an earlier version (one `key`) is a ring of one.
    #[test]
    fn a_ring_round_trips_through_its_secret() {
        let one = Keyring::of(&[1u8; 32]).unwrap();
        let ring = one.rotated(Zeroizing::new(vec![2u8; 32])).unwrap();
        let secret = secret_of(&ring, "config-snapshot", "config-snapshot-signing-key");
        assert_eq!(ring_of(&secret).unwrap().ids(), ring.ids());
        assert_eq!(secret.immutable, None, "a rotation updates it");
        let earlier = Secret {
            immutable: Some(true),
            data: Some([(CURRENT.to_string(), ByteString(vec![1u8; 32]))].into()),
            ..Default::default()
        };
        assert_eq!(ring_of(&earlier).unwrap().ids(), one.ids());
        let empty = Secret::default();
        assert!(ring_of(&empty).is_err());
    }
}
