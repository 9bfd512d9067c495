//! Kubewarden's host-capability gate, as policy-server applies it since
//! 1.35 (`kwctl run --allowed-host-capabilities`, a PolicyServer's
//! allow-list, a policy's `hostCapabilities` metadata): a policy may call
//! only the capabilities it was granted, and read only the Kubernetes
//! resources it declared. In front of another host, this one refuses what
//! that gate refuses, in its words, so the policy can be run here as it
//! runs there.
//!
//! Its rules, read from the Kubewarden monorepo (`kubewarden/adm-controller`,
//! `crates/policy-evaluator/src/host_capabilities.rs` and
//! `src/runtimes/callback.rs`, at 9efeab7), written here anew:
//! - a capability is `namespace/operation` (`kubernetes/get_resource`,
//!   `oci/v1/verify`); a pattern is an exact capability, a known prefix
//!   followed by `/*` (`oci/*`, `oci/v1/*`), or `*`; any other pattern,
//!   or one naming no known capability, is refused when the list is read;
//! - a call of a binding other than `kubewarden` is refused before the
//!   gate (`unknown binding`), and `tracing` is never gated;
//! - a Kubernetes read of a resource outside the declared ones is refused.

use std::collections::BTreeSet;
use std::sync::Mutex;

use serde_json::Value;
use thiserror::Error;

use crate::kubewarden::engine::{CallFailure, CallHandler};

/// Every capability Kubewarden's host serves, as `namespace/operation`.
pub const KUBEWARDEN_CAPABILITIES: [&str; 13] = [
    "cache/get",
    "cache/set",
    "crypto/v1/is_certificate_trusted",
    "kubernetes/can_i",
    "kubernetes/get_resource",
    "kubernetes/list_resources_all",
    "kubernetes/list_resources_by_namespace",
    "net/v1/dns_lookup_host",
    "oci/v1/manifest_digest",
    "oci/v1/oci_manifest",
    "oci/v1/oci_manifest_config",
    "oci/v1/verify",
    "oci/v2/verify",
];

/// Why a pattern is refused.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum PatternError {
    #[error("empty host capability pattern")]
    Empty,
    #[error("{0:?}: a wildcard must be a whole last segment after a '/', or '*' alone")]
    Wildcard(String),
    #[error("{0:?} names no capability Kubewarden serves")]
    Unknown(String),
    #[error("{0:?} stops short of a capability: did you mean {0}/*?")]
    Incomplete(String),
}

/// A list of host-capability patterns, checked against
/// [`KUBEWARDEN_CAPABILITIES`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Allowed {
    All,
    Patterns {
        exact: BTreeSet<String>,
        prefixes: BTreeSet<String>,
    },
}

impl Allowed {
    pub fn parse<I: IntoIterator<Item = S>, S: AsRef<str>>(patterns: I) -> Result<Allowed, PatternError> {
        let mut exact = BTreeSet::new();
        let mut prefixes = BTreeSet::new();
        for pattern in patterns {
            let pattern = pattern.as_ref().trim();
            if pattern.is_empty() {
                return Err(PatternError::Empty);
            }
            if pattern == "*" {
                return Ok(Allowed::All);
            }
            match pattern.strip_suffix("/*") {
                Some(prefix) if !prefix.contains('*') => {
                    let with_slash = format!("{prefix}/");
                    if !KUBEWARDEN_CAPABILITIES.iter().any(|c| c.starts_with(&with_slash)) {
                        return Err(PatternError::Unknown(pattern.to_string()));
                    }
                    prefixes.insert(with_slash);
                }
                _ if pattern.contains('*') => return Err(PatternError::Wildcard(pattern.to_string())),
                _ if KUBEWARDEN_CAPABILITIES.contains(&pattern) => {
                    exact.insert(pattern.to_string());
                }
                _ if KUBEWARDEN_CAPABILITIES
                    .iter()
                    .any(|c| c.starts_with(&format!("{pattern}/"))) =>
                {
                    return Err(PatternError::Incomplete(pattern.to_string()))
                }
                _ => return Err(PatternError::Unknown(pattern.to_string())),
            }
        }
        Ok(Allowed::Patterns { exact, prefixes })
    }

    pub fn allows(&self, capability: &str) -> bool {
        match self {
            Allowed::All => true,
            Allowed::Patterns { exact, prefixes } => {
                exact.contains(capability) || prefixes.iter().any(|p| capability.starts_with(p.as_str()))
            }
        }
    }
}

/// The gate in front of `inner`: what it refuses, in policy-evaluator's
/// words; what it lets through, and which capabilities and resources the
/// policy asked for, recorded.
pub struct Gate {
    inner: std::sync::Arc<dyn CallHandler>,
    allowed: Allowed,
    /// `apiVersion/kind` of the resources a Kubernetes read may name.
    resources: BTreeSet<String>,
    asked: Mutex<Asked>,
}

/// What a policy asked of the gate.
#[derive(Debug, Default, Clone)]
pub struct Asked {
    /// Capabilities called, `namespace/operation` (bindings other than
    /// Kubewarden's as `binding:namespace/operation`).
    pub capabilities: BTreeSet<String>,
    /// Resources read, `apiVersion/kind`.
    pub resources: BTreeSet<String>,
    /// The calls refused, as the policy was told.
    pub refused: Vec<String>,
    /// Every call, in order: `binding:namespace/operation`.
    pub calls: Vec<String>,
}

/// The Kubernetes reads that name a resource kind.
const READS: [&str; 3] = ["get_resource", "list_resources_by_namespace", "list_resources_all"];

impl Gate {
    pub fn new(inner: std::sync::Arc<dyn CallHandler>, allowed: Allowed, resources: BTreeSet<String>) -> Gate {
        Gate {
            inner,
            allowed,
            resources,
            asked: Mutex::default(),
        }
    }

    pub fn asked(&self) -> Asked {
        self.record().clone()
    }

    /// What the guest asked so far, to add to.
    fn record(&self) -> std::sync::MutexGuard<'_, Asked> {
        self.asked.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn refuse(&self, text: String) -> CallFailure {
        self.record().refused.push(text.clone());
        CallFailure::Foreign(text)
    }
}

impl CallHandler for Gate {
    fn call(&self, binding: &str, namespace: &str, operation: &str, payload: &[u8]) -> Result<Vec<u8>, CallFailure> {
        let capability = format!("{namespace}/{operation}");
        self.record().calls.push(format!(
            "{binding}:{capability} {}",
            String::from_utf8_lossy(payload).chars().take(200).collect::<String>()
        ));
        if binding != "kubewarden" {
            self.record().capabilities.insert(format!("{binding}:{capability}"));
            return Err(self.refuse(format!("unknown binding: {binding}")));
        }
        if namespace != "tracing" {
            self.record().capabilities.insert(capability.clone());
            if !self.allowed.allows(&capability) {
                return Err(self.refuse(format!(
                    "Policy has not been granted access to the '{capability}' host capability. The violation has been reported."
                )));
            }
        }
        if namespace == "kubernetes" && READS.contains(&operation) {
            let body: Value = serde_json::from_slice(payload).unwrap_or_default();
            let resource = format!(
                "{}/{}",
                body["api_version"].as_str().unwrap_or_default(),
                body["kind"].as_str().unwrap_or_default()
            );
            self.record().resources.insert(resource.clone());
            if !self.resources.contains(&resource) {
                return Err(self.refuse(format!(
                    "Policy has not been granted access to Kubernetes {resource} resources. The violation has been reported."
                )));
            }
        }
        self.inner.call(binding, namespace, operation, payload)
    }
}

/// `apiVersion/kind` of each of a policy metadata's `contextAwareResources`.
pub fn declared_resources(metadata: &Value) -> BTreeSet<String> {
    metadata["contextAwareResources"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            format!(
                "{}/{}",
                r["apiVersion"].as_str().unwrap_or_default(),
                r["kind"].as_str().unwrap_or_default()
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_are_read_as_the_monorepo_reads_them() {
        let ok = |p: &[&str]| Allowed::parse(p).unwrap();
        assert_eq!(ok(&["*"]), Allowed::All);
        assert_eq!(ok(&["oci/*", "*"]), Allowed::All, "* anywhere allows all");
        let some = ok(&["kubernetes/get_resource", "oci/v1/*"]);
        assert!(some.allows("kubernetes/get_resource"));
        assert!(some.allows("oci/v1/verify"));
        assert!(!some.allows("oci/v2/verify"));
        assert!(!some.allows("kubernetes/list_resources_all"));
        assert!(
            !ok(&[]).allows("kubernetes/get_resource"),
            "an empty list allows nothing"
        );
        for (bad, error) in [
            ("", PatternError::Empty),
            ("oci*", PatternError::Wildcard("oci*".into())),
            ("oci/v1/oci_*", PatternError::Wildcard("oci/v1/oci_*".into())),
            ("*/oci", PatternError::Wildcard("*/oci".into())),
            ("oci/v9/*", PatternError::Unknown("oci/v9/*".into())),
            (
                "kubernetes/create_resource",
                PatternError::Unknown("kubernetes/create_resource".into()),
            ),
            (
                "config-snapshot/v1/create_snapshot",
                PatternError::Unknown("config-snapshot/v1/create_snapshot".into()),
            ),
            ("oci/v1", PatternError::Incomplete("oci/v1".into())),
            ("kubernetes", PatternError::Incomplete("kubernetes".into())),
        ] {
            assert_eq!(Allowed::parse([bad]), Err(error), "{bad:?}");
        }
    }

    struct Echo;
    impl CallHandler for Echo {
        fn call(&self, _: &str, _: &str, _: &str, _: &[u8]) -> Result<Vec<u8>, CallFailure> {
            Ok(b"{}".to_vec())
        }
    }

    fn text(e: CallFailure) -> String {
        match e {
            CallFailure::Foreign(t) => t,
            CallFailure::Ours(e) => panic!("the gate words its refusals: {e:?}"),
        }
    }

    #[test]
    fn the_gate_refuses_in_policy_evaluators_words() {
        let gate = Gate::new(
            std::sync::Arc::new(Echo),
            Allowed::parse(["kubernetes/get_resource"]).unwrap(),
            ["v1/ConfigMap".to_string()].into(),
        );
        let read = |kind: &str| format!(r#"{{"api_version":"v1","kind":"{kind}","name":"x","namespace":"y"}}"#);
        assert!(gate
            .call("kubewarden", "kubernetes", "get_resource", read("ConfigMap").as_bytes())
            .is_ok());
        let secret = text(
            gate.call("kubewarden", "kubernetes", "get_resource", read("Secret").as_bytes())
                .unwrap_err(),
        );
        assert_eq!(
            secret,
            "Policy has not been granted access to Kubernetes v1/Secret resources. The violation has been reported."
        );
        let list = text(
            gate.call(
                "kubewarden",
                "kubernetes",
                "list_resources_by_namespace",
                read("ConfigMap").as_bytes(),
            )
            .unwrap_err(),
        );
        assert!(
            list.contains("'kubernetes/list_resources_by_namespace' host capability"),
            "{list}"
        );
        let ours = text(
            gate.call("config-snapshot", "v1", "create_snapshot", b"{}")
                .unwrap_err(),
        );
        assert_eq!(ours, "unknown binding: config-snapshot");
        assert!(
            gate.call("kubewarden", "tracing", "log", b"{}").is_ok(),
            "tracing is never gated"
        );
        let asked = gate.asked();
        assert_eq!(asked.refused.len(), 3);
        assert!(asked.capabilities.contains("config-snapshot:v1/create_snapshot"));
        assert_eq!(
            asked.resources,
            ["v1/ConfigMap".to_string(), "v1/Secret".to_string()].into()
        );
    }
}
