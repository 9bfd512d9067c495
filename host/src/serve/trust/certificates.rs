//! serve's own webhook certificate (docs/security.md, "Certificates"): a CA
//! and a serving certificate it makes, keeps in a Secret of its namespace,
//! and renews, so that an install needs no cert-manager, and a renewal never
//! opens a window in which the API server's handshakes fail (and its writes
//! are let through unpinned).
//!
//! Why the CA is serve's and lives long: the webhook configuration's
//! `caBundle` names it, and changing what the API server trusts takes a
//! write the API server reads asynchronously. So the serving certificate,
//! short-lived, is renewed under the same CA (nothing the API server trusts
//! changes), and a CA is replaced in three steps, each a while after the
//! one before: the new CA joins the bundle beside the old; once the API
//! server has had the bundle for [`SETTLE_SECS`], the serving certificate is
//! renewed under the new CA; once every replica has had that one as long,
//! the old CA leaves the bundle. At every moment the API server trusts the
//! CA of every certificate a replica presents.
//!
//! What this module decides is plain data ([`next_step`], [`Material`]): the
//! Secret's keeping and serve's TLS are `serve::tls`.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::ByteString;
use rcgen::{BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use zeroize::Zeroizing;

/// The Secret, in serve's namespace, that keeps the CA and the serving
/// certificate.
pub const SECRET: &str = "config-snapshot-webhook-ca";

/// How long after a step the next may follow: long enough for the API
/// server to read a new `caBundle`, and every replica a new certificate
/// (they watch the Secret; this covers a slow one). Short lifetimes (tests)
/// settle faster: see [`Lifetimes::settle_secs`].
pub(crate) const SETTLE_SECS: i64 = 60;

/// The shortest lifetimes serve accepts: a CA must outlive its two settles
/// three times over, a certificate the time to renew it.
pub(crate) const MIN_CA_SECS: i64 = 120;
pub(crate) const MIN_LEAF_SECS: i64 = 60;
/// How far past its lifetime a certificate may reach before it is renewed
/// as too long-lived: more than clocks drift, less than any lifetime.
const LIFETIME_SLACK_SECS: i64 = 30;
/// The longest: past a century, a time no longer fits a certificate.
pub(crate) const MAX_SECS: i64 = 100 * 365 * 86_400;

/// Why the material cannot be made or read.
#[derive(Debug, thiserror::Error)]
pub enum CertificateError {
    #[error("the Secret {SECRET} lacks {0}")]
    Missing(&'static str),
    #[error("the Secret {SECRET}: {0} is not {1}")]
    Malformed(&'static str, &'static str),
    #[error("making a certificate: {0}")]
    Make(#[from] rcgen::Error),
}

/// How long a CA and a serving certificate are valid. A certificate is
/// renewed when less than a third of its life is left.
#[derive(Debug, Clone, Copy)]
pub struct Lifetimes {
    pub ca_secs: i64,
    pub leaf_secs: i64,
}

impl Lifetimes {
    /// Lifetimes in range: a CA of [`MIN_CA_SECS`] to [`MAX_SECS`], a
    /// certificate of [`MIN_LEAF_SECS`] up to its CA's.
    pub fn bounded(ca_secs: u64, leaf_secs: u64) -> Lifetimes {
        let clamp = |secs: u64, min: i64, max: i64| i64::try_from(secs).unwrap_or(max).clamp(min, max);
        let ca_secs = clamp(ca_secs, MIN_CA_SECS, MAX_SECS);
        Lifetimes {
            ca_secs,
            leaf_secs: clamp(leaf_secs, MIN_LEAF_SECS, ca_secs),
        }
    }

    /// How long a step settles: [`SETTLE_SECS`], or less for a CA so short
    /// that its replacement (two settles) must fit well inside the third of
    /// its life left when it starts.
    pub(crate) fn settle_secs(&self) -> i64 {
        SETTLE_SECS.min(self.ca_secs / 12)
    }
}

impl Default for Lifetimes {
    fn default() -> Lifetimes {
        Lifetimes {
            ca_secs: 10 * 365 * 86_400,
            leaf_secs: 90 * 86_400,
        }
    }
}

/// The CA and serving certificate serve keeps, with what it needs to know
/// of them to decide the next step (written by serve alone, under the
/// Secret's guard).
#[derive(Clone)]
pub struct Material {
    /// The CAs the webhook must trust, PEM, the newest last.
    pub bundle: String,
    /// The newest CA's key (PEM) and id.
    pub ca_key: Zeroizing<String>,
    pub ca_id: String,
    pub ca_not_after: i64,
    /// When the bundle last changed.
    pub bundle_at: i64,
    /// The serving certificate (PEM) and key, the CA that signed it, when.
    pub leaf: String,
    pub leaf_key: Zeroizing<String>,
    pub leaf_ca: String,
    pub leaf_at: i64,
    pub leaf_not_after: i64,
    /// The names the serving certificate was made for.
    pub names: Vec<String>,
    /// The CAs (PEM) a rotation took out of the bundle: the webhook
    /// configuration is made to drop these, and only these, so that a CA
    /// someone else put there (yours, cert-manager's, during a change of
    /// mode) stays trusted. The last two.
    pub retired: Vec<String>,
}

/// What the material needs next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// There is none: a CA and a serving certificate.
    Create,
    /// A serving certificate from the newest CA.
    NewLeaf,
    /// A new CA, beside the old one in the bundle.
    NewCa,
    /// The older CAs leave the bundle.
    DropOld,
}

/// What serve's own certificate asks of the webhook configuration
/// (serve/trust/registration.rs keeps it there).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Trust {
    /// The CAs the webhook must trust (PEM), exactly.
    pub bundle: String,
    /// The CA of the certificate served (PEM): the webhook must trust it
    /// for a replica to be ready.
    pub serving_ca: String,
    /// The CAs serve retired (PEM): the webhook drops them.
    pub retired: Vec<String>,
}

impl Material {
    /// How many CAs the bundle holds.
    pub fn cas(&self) -> usize {
        self.bundle.matches(BEGIN).count()
    }

    /// The bundle's CA certificates (PEM), the oldest first.
    fn ca_pems(&self) -> Vec<&str> {
        pem_blocks(&self.bundle)
    }

    /// What the webhook configuration must hold for this material.
    pub(crate) fn trust(&self) -> Trust {
        let pems = self.ca_pems();
        // The certificate is signed by the newest CA (the last) once it has
        // been renewed under it, by the one before until then.
        let serving = if self.leaf_ca == self.ca_id || pems.len() < 2 {
            pems.last()
        } else {
            pems.get(pems.len() - 2)
        };
        Trust {
            bundle: self.bundle.clone(),
            serving_ca: serving.map(|p| p.trim().to_string()).unwrap_or_default(),
            retired: self.retired.clone(),
        }
    }
}

const BEGIN: &str = "-----BEGIN CERTIFICATE-----";

/// The certificates (PEM) of a bundle, in order, each trimmed.
pub(crate) fn pem_blocks(bundle: &str) -> Vec<&str> {
    let starts: Vec<usize> = bundle.match_indices(BEGIN).map(|(at, _)| at).collect();
    let ends = starts.iter().skip(1).copied().chain([bundle.len()]);
    starts
        .iter()
        .zip(ends)
        .map(|(&from, to)| bundle[from..to].trim())
        .collect()
}

/// The `caBundle` the webhook configuration should hold, given what it
/// holds: serve's CAs added, the CAs serve retired taken out, anything
/// else kept (yours, cert-manager's, while a change of mode rolls out).
/// `None` when it holds that already.
pub(crate) fn wanted_bundle(held: &str, trust: &Trust) -> Option<String> {
    let mut wanted: Vec<&str> = pem_blocks(held)
        .into_iter()
        .filter(|pem| !trust.retired.iter().any(|r| r.trim() == *pem))
        .collect();
    for pem in pem_blocks(&trust.bundle) {
        if !wanted.contains(&pem) {
            wanted.push(pem);
        }
    }
    let text: String = wanted.iter().map(|p| format!("{p}\n")).collect();
    (pem_blocks(held) != wanted).then_some(text)
}

/// The step `material` needs at `now`, for a serving certificate naming
/// `names`, if any. A clock behind the material's last step (a leader whose
/// clock lags another's) steps nothing: it would judge lifetimes wrong.
pub(crate) fn next_step(
    material: Option<&Material>,
    now: i64,
    lifetimes: &Lifetimes,
    names: &[String],
) -> Option<Step> {
    let Some(m) = material else {
        return Some(Step::Create);
    };
    if now < m.bundle_at.max(m.leaf_at) {
        return None;
    }
    let settled = |since: i64| now >= since.saturating_add(lifetimes.settle_secs());
    if m.cas() > 1 {
        // A rotation under way: the new CA is trusted, then serves, then alone.
        return if m.leaf_ca != m.ca_id {
            settled(m.bundle_at).then_some(Step::NewLeaf)
        } else {
            settled(m.leaf_at).then_some(Step::DropOld)
        };
    }
    // Renewed with a third of its life left, or at once when it would
    // outlive a lifetime since shortened (`--ca-lifetime`,
    // `--certificate-lifetime`).
    let due = |left: i64, life: i64| left < life / 3 || left > life.saturating_add(LIFETIME_SLACK_SECS);
    if due(m.ca_not_after.saturating_sub(now), lifetimes.ca_secs) {
        return Some(Step::NewCa);
    }
    let leaf_life = lifetimes.leaf_secs.min(m.ca_not_after.saturating_sub(m.leaf_at));
    if m.leaf_ca != m.ca_id || m.names != names || due(m.leaf_not_after.saturating_sub(now), leaf_life) {
        return Some(Step::NewLeaf);
    }
    None
}

/// A timestamp as rcgen takes it.
fn at(unix: i64) -> Result<time::OffsetDateTime, CertificateError> {
    time::OffsetDateTime::from_unix_timestamp(unix).map_err(|_| CertificateError::Malformed("a time", "in range"))
}

/// The parameters of CA `id`: its name is all a certificate it signs
/// carries of it, so they are made again from the id to sign with it.
fn ca_params(id: &str, not_before: i64, not_after: i64) -> Result<CertificateParams, CertificateError> {
    let mut params = CertificateParams::default();
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, format!("config-snapshot webhook CA {id}"));
    params.distinguished_name = name;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    params.not_before = at(not_before)?;
    params.not_after = at(not_after)?;
    Ok(params)
}

/// A new CA: its PEM, its key's PEM, its id.
fn new_ca(now: i64, lifetimes: &Lifetimes) -> Result<(String, Zeroizing<String>, String), CertificateError> {
    let key = KeyPair::generate()?;
    let id = hex::encode(ring_random::<6>());
    let params = ca_params(&id, now - 300, now + lifetimes.ca_secs)?;
    let cert = params.self_signed(&key)?;
    Ok((cert.pem(), Zeroizing::new(key.serialize_pem()), id))
}

fn ring_random<const N: usize>() -> [u8; N] {
    use ring::rand::SecureRandom;
    let mut bytes = [0u8; N];
    // The system's randomness does not fail on Linux; if it did, a fixed id
    // only names the CA, it secures nothing.
    let _ = ring::rand::SystemRandom::new().fill(&mut bytes);
    bytes
}

/// A serving certificate for `names` from the material's newest CA, valid
/// no longer than that CA.
fn new_leaf(m: &Material, names: &[String], now: i64, lifetimes: &Lifetimes) -> Result<Material, CertificateError> {
    let ca_key = KeyPair::from_pem(&m.ca_key)?;
    let issuer = Issuer::new(ca_params(&m.ca_id, now, m.ca_not_after)?, ca_key);
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(names.to_vec())?;
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, names.first().cloned().unwrap_or_default());
    params.distinguished_name = name;
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    let not_after = (now + lifetimes.leaf_secs).min(m.ca_not_after);
    params.not_before = at(now - 300)?;
    params.not_after = at(not_after)?;
    let cert = params.signed_by(&key, &issuer)?;
    Ok(Material {
        leaf: cert.pem(),
        leaf_key: Zeroizing::new(key.serialize_pem()),
        leaf_ca: m.ca_id.clone(),
        leaf_at: now,
        leaf_not_after: not_after,
        names: names.to_vec(),
        ..m.clone()
    })
}

/// The material after `step` at `now`, for a serving certificate naming
/// `names` (the Service's DNS names).
pub fn apply(
    step: Step,
    material: Option<&Material>,
    names: &[String],
    now: i64,
    lifetimes: &Lifetimes,
) -> Result<Material, CertificateError> {
    match (step, material) {
        (Step::Create, _) | (_, None) => {
            let (ca, ca_key, ca_id) = new_ca(now, lifetimes)?;
            let fresh = Material {
                bundle: ca,
                ca_key,
                ca_id,
                ca_not_after: now + lifetimes.ca_secs,
                bundle_at: now,
                leaf: String::new(),
                leaf_key: Zeroizing::new(String::new()),
                leaf_ca: String::new(),
                leaf_at: now,
                leaf_not_after: now,
                names: Vec::new(),
                retired: Vec::new(),
            };
            new_leaf(&fresh, names, now, lifetimes)
        }
        (Step::NewLeaf, Some(m)) => new_leaf(m, names, now, lifetimes),
        (Step::NewCa, Some(m)) => {
            let (ca, ca_key, ca_id) = new_ca(now, lifetimes)?;
            Ok(Material {
                bundle: format!("{}\n{}\n", m.bundle.trim_end(), ca.trim()),
                ca_key,
                ca_id,
                ca_not_after: now + lifetimes.ca_secs,
                bundle_at: now,
                ..m.clone()
            })
        }
        (Step::DropOld, Some(m)) => {
            let pems = m.ca_pems();
            let (older, newest) = pems.split_at(pems.len().saturating_sub(1));
            let mut retired: Vec<String> = m
                .retired
                .iter()
                .cloned()
                .chain(older.iter().map(|p| p.trim().to_string()))
                .collect();
            retired.drain(..retired.len().saturating_sub(2));
            Ok(Material {
                bundle: newest.iter().map(|p| format!("{p}\n")).collect(),
                bundle_at: now,
                retired,
                ..m.clone()
            })
        }
    }
}

/// The Secret's fields and annotations.
const BUNDLE: &str = "ca.crt";
const CA_KEY: &str = "ca.key";
const LEAF: &str = "tls.crt";
const LEAF_KEY: &str = "tls.key";
const STATE: &str = "config-snapshot.io/webhook-certificate";
const RETIRED: &str = "retired.crt";

impl Material {
    /// The material a Secret holds.
    pub(crate) fn from_secret(secret: &Secret) -> Result<Material, CertificateError> {
        let data = secret.data.as_ref().ok_or(CertificateError::Missing("data"))?;
        let text = |field: &'static str| -> Result<String, CertificateError> {
            let bytes = data.get(field).ok_or(CertificateError::Missing(field))?;
            String::from_utf8(bytes.0.clone()).map_err(|_| CertificateError::Malformed(field, "PEM"))
        };
        let state = secret
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(STATE))
            .ok_or(CertificateError::Missing(STATE))?;
        let state: BTreeMap<String, serde_json::Value> =
            serde_json::from_str(state).map_err(|_| CertificateError::Malformed(STATE, "JSON"))?;
        let number = |key: &'static str| -> Result<i64, CertificateError> {
            state
                .get(key)
                .and_then(serde_json::Value::as_i64)
                .ok_or(CertificateError::Malformed(STATE, "complete"))
        };
        let words = |key: &'static str| -> Result<Vec<String>, CertificateError> {
            state
                .get(key)
                .and_then(serde_json::Value::as_array)
                .map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_string)).collect())
                .ok_or(CertificateError::Malformed(STATE, "complete"))
        };
        let word = |key: &'static str| -> Result<String, CertificateError> {
            state
                .get(key)
                .and_then(serde_json::Value::as_str)
                .map(str::to_string)
                .ok_or(CertificateError::Malformed(STATE, "complete"))
        };
        Ok(Material {
            bundle: text(BUNDLE)?,
            ca_key: Zeroizing::new(text(CA_KEY)?),
            ca_id: word("caId")?,
            ca_not_after: number("caNotAfter")?,
            bundle_at: number("bundleAt")?,
            leaf: text(LEAF)?,
            leaf_key: Zeroizing::new(text(LEAF_KEY)?),
            leaf_ca: word("leafCa")?,
            leaf_at: number("leafAt")?,
            leaf_not_after: number("leafNotAfter")?,
            names: words("names")?,
            retired: data
                .get(RETIRED)
                .map(|b| String::from_utf8_lossy(&b.0).into_owned())
                .map(|text| pem_blocks(&text).into_iter().map(str::to_string).collect())
                .unwrap_or_default(),
        })
    }

    /// The Secret `namespace/SECRET` holding it.
    pub(crate) fn to_secret(&self, namespace: &str) -> Secret {
        let retired: String = self.retired.iter().map(|p| format!("{p}\n")).collect();
        let data: BTreeMap<String, ByteString> = [
            (BUNDLE, self.bundle.as_bytes()),
            (CA_KEY, self.ca_key.as_bytes()),
            (LEAF, self.leaf.as_bytes()),
            (LEAF_KEY, self.leaf_key.as_bytes()),
            (RETIRED, retired.as_bytes()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), ByteString(v.to_vec())))
        .collect();
        let state = serde_json::json!({
            "caId": self.ca_id, "caNotAfter": self.ca_not_after, "bundleAt": self.bundle_at,
            "leafCa": self.leaf_ca, "leafAt": self.leaf_at, "leafNotAfter": self.leaf_not_after,
            "names": self.names,
        });
        Secret {
            metadata: kube::api::ObjectMeta {
                name: Some(SECRET.to_string()),
                namespace: Some(namespace.to_string()),
                labels: Some(
                    [
                        ("app.kubernetes.io/name".to_string(), "config-snapshot".to_string()),
                        (
                            "app.kubernetes.io/component".to_string(),
                            "webhook-certificate".to_string(),
                        ),
                    ]
                    .into(),
                ),
                annotations: Some([(STATE.to_string(), state.to_string())].into()),
                ..Default::default()
            },
            data: Some(data),
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::CertificateDer;

    const NOW: i64 = 1_795_000_000;

    fn names() -> Vec<String> {
        vec!["config-snapshot.config-snapshot.svc".to_string()]
    }

    /// Whether a client trusting `bundle` accepts `leaf` for the Service's
    /// name at `unix`, as the API server's TLS would.
    fn trusted(bundle: &str, leaf: &str, unix: i64) -> bool {
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(bundle.as_bytes()) {
            roots.add(cert.unwrap()).unwrap();
        }
        let leaf = CertificateDer::from_pem_slice(leaf.as_bytes()).unwrap();
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
            std::sync::Arc::new(roots),
            std::sync::Arc::new(rustls::crypto::ring::default_provider()),
        )
        .build()
        .unwrap();
        let name = rustls_pki_types::ServerName::try_from("config-snapshot.config-snapshot.svc").unwrap();
        let time = rustls_pki_types::UnixTime::since_unix_epoch(std::time::Duration::from_secs(unix as u64));
        rustls::client::danger::ServerCertVerifier::verify_server_cert(verifier.as_ref(), &leaf, &[], &name, &[], time)
            .is_ok()
    }

    #[test]
    fn a_fresh_install_gets_a_ca_and_a_certificate_it_signed() {
        let life = Lifetimes::default();
        assert_eq!(next_step(None, NOW, &life, &names()), Some(Step::Create));
        let m = apply(Step::Create, None, &names(), NOW, &life).unwrap();
        assert_eq!(m.cas(), 1);
        assert!(trusted(&m.bundle, &m.leaf, NOW));
        assert_eq!(next_step(Some(&m), NOW + 86_400, &life, &names()), None);
        // It reads back the same from its Secret.
        let back = Material::from_secret(&m.to_secret("config-snapshot")).unwrap();
        assert_eq!(back.leaf, m.leaf);
        assert_eq!((back.ca_id, back.leaf_not_after), (m.ca_id.clone(), m.leaf_not_after));
    }

    /// The serving certificate is renewed under the same CA: what the API
    /// server trusts does not change, so no handshake fails.
    #[test]
    fn a_certificate_is_renewed_under_the_same_ca() {
        let life = Lifetimes::default();
        let m = apply(Step::Create, None, &names(), NOW, &life).unwrap();
        let later = m.leaf_not_after - life.leaf_secs / 3 + 1;
        assert_eq!(next_step(Some(&m), later, &life, &names()), Some(Step::NewLeaf));
        let renewed = apply(Step::NewLeaf, Some(&m), &names(), later, &life).unwrap();
        assert_eq!(renewed.bundle, m.bundle, "the bundle is unchanged");
        assert_ne!(renewed.leaf, m.leaf);
        assert!(
            trusted(&m.bundle, &renewed.leaf, later),
            "the API server's bundle trusts it"
        );
        assert!(
            trusted(&renewed.bundle, &m.leaf, later),
            "and still the one replicas serve until they reload"
        );
    }

    /// A CA is replaced in three steps, each after the one before settled,
    /// and at every step the bundle the API server may hold (the one before
    /// or the current one) trusts every certificate a replica may serve
    /// (the one before or the current one).
    #[test]
    fn a_ca_is_replaced_with_both_trusted_while_either_serves() {
        let life = Lifetimes::bounded(MIN_CA_SECS as u64, MIN_LEAF_SECS as u64);
        let mut m = apply(Step::Create, None, &names(), NOW, &life).unwrap();
        let mut now = NOW;
        let mut steps = Vec::new();
        while steps.len() < 12 && now < NOW + 3 * life.ca_secs {
            now += 1;
            let Some(step) = next_step(Some(&m), now, &life, &names()) else {
                continue;
            };
            let next = apply(step, Some(&m), &names(), now, &life).unwrap();
            for bundle in [&m.bundle, &next.bundle] {
                for leaf in [&m.leaf, &next.leaf] {
                    assert!(trusted(bundle, leaf, now), "{step:?} at {now}: a handshake would fail");
                }
            }
            // What a replica needs the webhook to trust is what signed it.
            let serving_ca = next.trust().serving_ca;
            assert!(trusted(&serving_ca, &next.leaf, now), "{step:?}: the serving CA");
            assert!(next.bundle.contains(&serving_ca));
            steps.push(step);
            m = next;
        }
        let first_ca = steps
            .iter()
            .position(|s| *s == Step::NewCa)
            .expect("the CA was replaced");
        assert_eq!(
            steps[first_ca..first_ca + 3],
            [Step::NewCa, Step::NewLeaf, Step::DropOld]
        );
        assert_eq!(m.cas(), 1);
    }

    #[test]
    fn a_certificate_never_outlives_its_ca() {
        let life = Lifetimes {
            ca_secs: 1000,
            leaf_secs: 5000,
        };
        let m = apply(Step::Create, None, &names(), NOW, &life).unwrap();
        assert!(m.leaf_not_after <= m.ca_not_after);
    }

    /// A lifetime shortened takes effect at once: the CA is replaced (in
    /// its three steps), the certificate renewed under it.
    #[test]
    fn a_shortened_lifetime_renews_at_once() {
        let long = Lifetimes::default();
        let m = apply(Step::Create, None, &names(), NOW, &long).unwrap();
        let short = Lifetimes::bounded(600, 120);
        assert_eq!(next_step(Some(&m), NOW + 5, &short, &names()), Some(Step::NewCa));
        let mut m = apply(Step::NewCa, Some(&m), &names(), NOW + 5, &short).unwrap();
        let mut now = NOW + 5;
        let mut steps = vec![Step::NewCa];
        while steps.len() < 3 && now < NOW + 5 + 3 * short.settle_secs() {
            now += 1;
            if let Some(step) = next_step(Some(&m), now, &short, &names()) {
                m = apply(step, Some(&m), &names(), now, &short).unwrap();
                steps.push(step);
            }
        }
        assert_eq!(steps, [Step::NewCa, Step::NewLeaf, Step::DropOld]);
        assert_eq!(m.cas(), 1);
        assert!(m.ca_not_after - now <= 600 && m.leaf_not_after - now <= 120);
        // Lengthened again, the short CA has less than a third of the new
        // life left: it is replaced the same way.
        assert_eq!(
            next_step(Some(&m), now, &Lifetimes::default(), &names()),
            Some(Step::NewCa)
        );
    }

    /// Attacker review, round 4 (M3, lows): the certificate follows the
    /// names the webhook calls; a clock behind the last step steps
    /// nothing; times at the ends of the range neither overflow nor panic;
    /// a rotation records the CA it retired, and the Secret keeps it all.
    #[test]
    fn names_clocks_and_extremes() {
        let life = Lifetimes::bounded(600, 120);
        let m = apply(Step::Create, None, &names(), NOW, &life).unwrap();
        let other = vec!["127.0.0.1".to_string()];
        assert_eq!(next_step(Some(&m), NOW + 1, &life, &other), Some(Step::NewLeaf));
        let renamed = apply(Step::NewLeaf, Some(&m), &other, NOW + 1, &life).unwrap();
        assert_eq!(next_step(Some(&renamed), NOW + 2, &life, &other), None);
        assert_eq!(next_step(Some(&m), NOW - 100, &life, &names()), None, "a clock behind");
        let mut extreme = m.clone();
        (
            extreme.bundle_at,
            extreme.leaf_at,
            extreme.ca_not_after,
            extreme.leaf_not_after,
        ) = (i64::MIN, i64::MIN, i64::MAX, i64::MIN);
        let _ = next_step(Some(&extreme), NOW, &life, &names());
        // A whole rotation: the old CA is retired, and read back.
        let mut m = apply(Step::NewCa, Some(&m), &names(), NOW + 1, &life).unwrap();
        for at in [NOW + 100, NOW + 200] {
            let step = next_step(Some(&m), at, &life, &names()).unwrap();
            m = apply(step, Some(&m), &names(), at, &life).unwrap();
        }
        assert_eq!((m.cas(), m.retired.len()), (1, 1));
        let back = Material::from_secret(&m.to_secret("config-snapshot")).unwrap();
        assert_eq!((back.retired, back.names), (m.retired.clone(), names()));
        let held = format!("{}\n{}", m.retired[0], m.bundle);
        assert_eq!(wanted_bundle(&held, &m.trust()).as_deref(), Some(m.bundle.as_str()));
    }

    /// Absurd lifetimes are bounded, not overflowed or refused by the
    /// certificate library mid-run.
    #[test]
    fn lifetimes_are_bounded() {
        let huge = Lifetimes::bounded(u64::MAX, u64::MAX);
        assert_eq!((huge.ca_secs, huge.leaf_secs), (MAX_SECS, MAX_SECS));
        assert!(apply(Step::Create, None, &names(), NOW, &huge).is_ok());
        let tiny = Lifetimes::bounded(0, 0);
        assert_eq!((tiny.ca_secs, tiny.leaf_secs), (MIN_CA_SECS, MIN_LEAF_SECS));
        assert!(
            tiny.settle_secs() * 2 < tiny.ca_secs / 3,
            "a rotation fits in the third left"
        );
        assert_eq!(Lifetimes::default().settle_secs(), SETTLE_SECS);
    }
}
