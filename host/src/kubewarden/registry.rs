//! The policy in an OCI registry, laid out as Kubewarden lays it out, so
//! `kwctl pull` fetches what `config-snapshot push` pushed and the other way
//! round: one layer `application/vnd.wasm.content.layer.v1+wasm` holding
//! the module, and the config `{}` as `application/vnd.wasm.config.v1+json`.
//!
//! A module is named `registry://HOST/REPO:TAG` or `…@sha256:…`. Pulling by
//! digest checks the manifest against it (oci-client verifies the digests
//! of what it fetches); `serve` also pins the digest it got and logs it, so
//! every replica can be held to one module.
//!
//! Signatures are cosign's, keyed: `push --sign-key` stores one under the
//! `sha256-<digest>.sig` tag as cosign does, and a `--verify-key` makes
//! pull and serve refuse a module no signature by that key covers. The
//! signature is checked against the digest actually pulled, so a tag moved
//! in between cannot slip another module past it.

use std::path::Path;

use anyhow::{anyhow, bail, Context as _, Result};
use oci_client::client::{ClientConfig, ClientProtocol, Config, ImageLayer};
use oci_client::manifest::{OciImageManifest, WASM_CONFIG_MEDIA_TYPE, WASM_LAYER_MEDIA_TYPE};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use sigstore::cosign::constraint::PrivateKeySigner;
use sigstore::cosign::verification_constraint::{PublicKeyVerifier, VerificationConstraintVec};
use sigstore::cosign::{Constraint, CosignCapabilities, SignatureLayer};
use sigstore::crypto::SigningScheme;
use sigstore::registry::OciReference;
use zeroize::Zeroizing;

/// The scheme Kubewarden uses for a policy in a registry.
pub(crate) const SCHEME: &str = "registry://";

/// Where a policy module comes from: a file, or a registry.
#[derive(Debug, Clone, PartialEq)]
pub enum Source {
    File(std::path::PathBuf),
    Registry(Reference),
}

impl Source {
    pub fn parse(text: &str) -> Result<Source> {
        match text.strip_prefix(SCHEME) {
            Some(rest) => Ok(Source::Registry(reference(rest)?)),
            None => Ok(Source::File(text.into())),
        }
    }
}

/// A reference, with or without `registry://`.
pub fn reference(text: &str) -> Result<Reference> {
    let bare = text.strip_prefix(SCHEME).unwrap_or(text);
    bare.parse::<Reference>()
        .map_err(|e| anyhow!("{text:?} is not an OCI reference (HOST/REPO:TAG or HOST/REPO@sha256:…): {e}"))
}

/// How to reach registries: which speak plain HTTP, and the credentials.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct Access {
    /// A registry (HOST[:PORT]) reached over plain HTTP, e.g. one on
    /// loopback for tests. Repeatable.
    #[arg(long = "insecure-registry", value_name = "HOST")]
    pub insecure: Vec<String>,
    /// Registry user; the password comes from CONFIG_SNAPSHOT_REGISTRY_PASSWORD.
    #[arg(long = "registry-username", env = "CONFIG_SNAPSHOT_REGISTRY_USERNAME")]
    pub username: Option<String>,
    /// A cosign public key (PEM): a module without a valid signature by it
    /// is refused.
    #[arg(long, value_name = "FILE")]
    pub verify_key: Option<std::path::PathBuf>,
}

impl Access {
    fn client(&self) -> Client {
        // reqwest is built without a crypto provider of its own.
        crate::use_ring_for_tls();
        Client::new(ClientConfig {
            protocol: ClientProtocol::HttpsExcept(self.insecure.clone()),
            ..Default::default()
        })
    }

    fn cosign(&self) -> Result<sigstore::cosign::Client> {
        crate::use_ring_for_tls();
        sigstore::cosign::ClientBuilder::default()
            .with_oci_client_config(sigstore::registry::ClientConfig {
                protocol: sigstore::registry::ClientProtocol::HttpsExcept(self.insecure.clone()),
                ..Default::default()
            })
            .build()
            .map_err(|e| anyhow!("setting up signature checks: {e}"))
    }

    fn auth(&self) -> RegistryAuth {
        match (&self.username, std::env::var("CONFIG_SNAPSHOT_REGISTRY_PASSWORD")) {
            (Some(user), Ok(password)) => RegistryAuth::Basic(user.clone(), password),
            _ => RegistryAuth::Anonymous,
        }
    }
}

/// A module and the manifest digest it was fetched or pushed under.
pub struct Module {
    pub bytes: Vec<u8>,
    pub digest: String,
}

/// Pushes a module; answers the manifest digest the registry holds.
pub async fn push(access: &Access, module: &[u8], target: &Reference) -> Result<String> {
    let layers = vec![ImageLayer::new(
        module.to_vec(),
        WASM_LAYER_MEDIA_TYPE.to_string(),
        None,
    )];
    let config = Config {
        data: b"{}".to_vec().into(),
        media_type: WASM_CONFIG_MEDIA_TYPE.to_string(),
        annotations: None,
    };
    let manifest = OciImageManifest::build(&layers, &config, None);
    let client = access.client();
    let auth = access.auth();
    client
        .push(target, &layers, config, &auth, Some(manifest))
        .await
        .with_context(|| format!("pushing to {target}"))?;
    client
        .fetch_manifest_digest(target, &auth)
        .await
        .with_context(|| format!("reading back the digest of {target}"))
}

/// Signs what `target` now points at (its manifest `digest`) with a cosign
/// private key, encrypted with `password` as `cosign generate-key-pair`
/// writes it (an empty password: a plain PEM key).
pub async fn sign(access: &Access, target: &Reference, digest: &str, key_pem: &[u8], password: &[u8]) -> Result<()> {
    let signer = PrivateKeySigner::new_with_raw(
        Zeroizing::new(key_pem.to_vec()),
        Zeroizing::new(password.to_vec()),
        &SigningScheme::default(),
    )
    .map_err(|e| anyhow!("reading the signing key: {e}"))?;
    let pinned = pinned_reference(target, digest)?;
    let repository: OciReference = format!("{}/{}", target.registry(), target.repository())
        .parse()
        .map_err(|e| anyhow!("{e}"))?;
    let mut layer = SignatureLayer::new_unsigned(&repository, digest).map_err(|e| anyhow!("{e}"))?;
    signer
        .add_constraint(&mut layer)
        .map_err(|e| anyhow!("signing {target}: {e}"))?;
    let mut cosign = access.cosign()?;
    let auth = (&access.auth()).into();
    let (signature_image, _) = cosign
        .triangulate(&pinned, &auth)
        .await
        .map_err(|e| anyhow!("locating the signature of {target}: {e}"))?;
    cosign
        .push_signature(None, &auth, &signature_image, vec![layer])
        .await
        .map_err(|e| anyhow!("pushing the signature of {target}: {e}"))?;
    Ok(())
}

/// Checks that a signature by `key` covers the module at `digest`.
async fn verify(access: &Access, source: &Reference, digest: &str, key: &Path) -> Result<()> {
    let pem = read(key)?;
    let verifier =
        PublicKeyVerifier::try_from(&pem).map_err(|e| anyhow!("{} is not a cosign public key: {e}", key.display()))?;
    let constraints: VerificationConstraintVec = vec![Box::new(verifier)];
    let pinned = pinned_reference(source, digest)?;
    let mut cosign = access.cosign()?;
    let layers = cosign
        .trusted_signature_layers(&(&access.auth()).into(), &pinned)
        .await
        .map_err(|e| anyhow!("{source}@{digest}: reading its signatures: {e}"))?;
    if layers.is_empty() {
        bail!("{source}@{digest} has no signature, and --verify-key requires one: refusing to run it");
    }
    sigstore::cosign::verify_constraints(&layers, constraints.iter()).map_err(|_| {
        anyhow!(
            "{source}@{digest} is not signed by {}: refusing to run it",
            key.display()
        )
    })
}

fn pinned_reference(source: &Reference, digest: &str) -> Result<OciReference> {
    Ok(OciReference::with_digest(
        source.registry().to_string(),
        source.repository().to_string(),
        digest.to_string(),
    ))
}

/// Pulls a module. With `pinned`, a module under any other digest is
/// refused, whatever the tag now points at.
pub async fn pull(access: &Access, source: &Reference, pinned: Option<&str>) -> Result<Module> {
    let client = access.client();
    let image = client
        .pull(source, &access.auth(), vec![WASM_LAYER_MEDIA_TYPE])
        .await
        .with_context(|| format!("pulling {source}"))?;
    let digest = image
        .digest
        .ok_or_else(|| anyhow!("{source}: the registry named no manifest digest"))?;
    for expected in [pinned, source.digest()].into_iter().flatten() {
        if digest != expected {
            bail!("{source} is {digest}, not the pinned {expected}: refusing a module other than the one pinned");
        }
    }
    if let Some(key) = &access.verify_key {
        verify(access, source, &digest, key).await?;
    }
    let [layer] = <[ImageLayer; 1]>::try_from(image.layers).map_err(|layers| {
        anyhow!(
            "{source}: expected one wasm layer, found {} (not a Kubewarden policy?)",
            layers.len()
        )
    })?;
    Ok(Module {
        bytes: layer.data.to_vec(),
        digest,
    })
}

/// The module `--policy` names, from disk or a registry, with what to log.
pub async fn load(access: &Access, policy: &str, pinned: Option<&str>) -> Result<(Vec<u8>, String)> {
    match Source::parse(policy)? {
        Source::File(path) => {
            if pinned.is_some() {
                bail!("--policy-digest pins a registry module; {policy} is a file");
            }
            let bytes = read(&path)?;
            Ok((bytes, format!("file {}", path.display())))
        }
        Source::Registry(reference) => {
            let module = pull(access, &reference, pinned).await?;
            Ok((module.bytes, format!("{reference}@{}", module.digest)))
        }
    }
}

fn read(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("reading {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_policy_names_a_file_or_a_registry() {
        assert_eq!(
            Source::parse("policy.wasm").unwrap(),
            Source::File("policy.wasm".into())
        );
        let Source::Registry(r) = Source::parse("registry://127.0.0.1:5000/policies/cs:v1").unwrap() else {
            panic!("a registry reference")
        };
        assert_eq!(
            (r.registry(), r.repository(), r.tag()),
            ("127.0.0.1:5000", "policies/cs", Some("v1"))
        );
        let err = Source::parse("registry://Not A Reference").unwrap_err();
        assert!(err.to_string().contains("is not an OCI reference"), "{err}");
    }
}
