//! serve's signing key (docs/security.md): the key its [`Prover`] signs
//! snapshots and keys Secret names with. Read from `--signing-key-file`
//! (a mounted Secret, a test fixture), or kept in a Secret in serve's own
//! namespace, which the first replica to start creates with a random key
//! and every other replica reads. Only serve's ServiceAccount may read it
//! (deploy/serve/rbac.yaml names it): who holds it can forge snapshots.

use std::path::Path;
use std::time::UNIX_EPOCH;

use anyhow::{anyhow, Context as _, Result};
use base64::Engine as _;
use config_snapshot_policy::duration::parse_rfc3339;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::ByteString;
use kube::api::{Api, PostParams};
use kube::Client;

use crate::proof::{Prover, KEY_BYTES};

/// The key within the Secret.
const FIELD: &str = "key";

/// The least key length accepted: below, a key could be guessed.
const MIN_KEY_BYTES: usize = 16;

/// The key from a file: raw bytes, or their base64 (a file written by
/// hand). Snapshots created before the file's modification time are
/// legacy.
pub fn from_file(path: &Path) -> Result<Prover> {
    let bytes = zeroize::Zeroizing::new(std::fs::read(path).with_context(|| format!("reading {}", path.display()))?);
    let text = std::str::from_utf8(&bytes).ok().map(str::trim);
    let key = match text.and_then(|t| base64::engine::general_purpose::STANDARD.decode(t).ok()) {
        Some(decoded) if decoded.len() >= MIN_KEY_BYTES => zeroize::Zeroizing::new(decoded),
        _ => bytes.clone(),
    };
    if key.len() < MIN_KEY_BYTES {
        return Err(anyhow!("--signing-key-file: a key has at least {MIN_KEY_BYTES} bytes"));
    }
    let since = std::fs::metadata(path)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(i64::MIN, |d| d.as_secs() as i64);
    Ok(Prover::new(&key, since))
}

/// The key from Secret `name` in `namespace`, created if absent. Snapshots
/// created before the Secret are legacy.
pub async fn from_secret(client: Client, namespace: &str, name: &str) -> Result<Prover> {
    let api: Api<Secret> = Api::namespaced(client, namespace);
    for _ in 0..3 {
        if let Some(secret) = api
            .get_opt(name)
            .await
            .with_context(|| format!("reading Secret {namespace}/{name}"))?
        {
            return prover_of(&secret, namespace, name);
        }
        let key = Prover::generate_key();
        let secret = Secret {
            metadata: kube::api::ObjectMeta {
                name: Some(name.to_string()),
                namespace: Some(namespace.to_string()),
                labels: Some([("app.kubernetes.io/name".to_string(), "config-snapshot".to_string())].into()),
                ..Default::default()
            },
            immutable: Some(true),
            data: Some([(FIELD.to_string(), ByteString(key.to_vec()))].into()),
            ..Default::default()
        };
        match api.create(&PostParams::default(), &secret).await {
            Ok(created) => {
                tracing::info!(secret = name, namespace, "created the signing key");
                return prover_of(&created, namespace, name);
            }
            // Another replica made it first: read theirs.
            Err(kube::Error::Api(status)) if status.code == 409 => continue,
            Err(e) => return Err(anyhow!(e).context(format!("creating Secret {namespace}/{name}"))),
        }
    }
    Err(anyhow!(
        "the signing key Secret {namespace}/{name} kept appearing and going"
    ))
}

fn prover_of(secret: &Secret, namespace: &str, name: &str) -> Result<Prover> {
    let key = secret
        .data
        .as_ref()
        .and_then(|d| d.get(FIELD))
        .map(|b| zeroize::Zeroizing::new(b.0.clone()))
        .filter(|k| k.len() >= MIN_KEY_BYTES)
        .ok_or_else(|| anyhow!("Secret {namespace}/{name} holds no {FIELD:?} of at least {MIN_KEY_BYTES} bytes"))?;
    let since = secret
        .metadata
        .creation_timestamp
        .as_ref()
        .and_then(|t| parse_rfc3339(&t.0.to_string()))
        .unwrap_or(i64::MIN);
    const { assert!(KEY_BYTES >= MIN_KEY_BYTES) };
    Ok(Prover::new(&key, since))
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
        assert_eq!(
            a.secret_digest("s", "h"),
            b.secret_digest("s", "h"),
            "the same key either way"
        );
        let short = dir.join("short");
        std::fs::write(&short, b"too short").unwrap();
        assert!(from_file(&short).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
