//! The two kinds of configuration source, and a source named by kind and
//! name (the key of the mapping annotation).

use std::fmt;

/// The type of a Secret that holds a service account's token. Such a
/// Secret is never snapshotted: a copy would be a second, unmanaged
/// credential that outlives the token controller's rotation.
pub const SA_TOKEN: &str = "kubernetes.io/service-account-token";

/// Secret types the API server mints credentials into when one is created
/// (a ServiceAccount's token, a bootstrap token): never a snapshot's. The
/// host refuses to make one, and the identity guard
/// (deploy/serve/identityguard.yaml, `tokenTypes`) refuses serve's account
/// any Secret of these types; host/tests/deploy.rs keeps the two lists equal.
pub const TOKEN_TYPES: [&str; 2] = [SA_TOKEN, "bootstrap.kubernetes.io/token"];

/// On the wire (the host capability's payloads) by its Kubernetes kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
pub enum SourceKind {
    ConfigMap,
    Secret,
}

impl SourceKind {
    /// The lowercase form used in annotations and in the mapping (`configmap/app`).
    pub fn tag(self) -> &'static str {
        match self {
            SourceKind::ConfigMap => "configmap",
            SourceKind::Secret => "secret",
        }
    }

    /// The Kubernetes kind, as used by host calls.
    pub fn kind(self) -> &'static str {
        match self {
            SourceKind::ConfigMap => "ConfigMap",
            SourceKind::Secret => "Secret",
        }
    }

    pub fn from_tag(tag: &str) -> Option<Self> {
        match tag {
            "configmap" => Some(SourceKind::ConfigMap),
            "secret" => Some(SourceKind::Secret),
            _ => None,
        }
    }

    pub fn from_kind(kind: &str) -> Option<Self> {
        match kind {
            "ConfigMap" => Some(SourceKind::ConfigMap),
            "Secret" => Some(SourceKind::Secret),
            _ => None,
        }
    }
}

/// A source identified by kind and name: the key of the mapping annotation.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SourceId {
    pub kind: SourceKind,
    pub name: String,
}

impl SourceId {
    pub fn new(kind: SourceKind, name: impl Into<String>) -> Self {
        SourceId {
            kind,
            name: name.into(),
        }
    }

    /// The mapping's (and the records') form, `configmap/app`: what
    /// [`SourceId`]'s `Display` writes.
    pub fn parse(text: &str) -> Option<SourceId> {
        let (tag, name) = text.split_once('/')?;
        Some(SourceId::new(SourceKind::from_tag(tag)?, name))
    }
}

impl fmt::Display for SourceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.kind.tag(), self.name)
    }
}
