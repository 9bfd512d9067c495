//! What the host needs from a cluster: the in-memory one behind `replay`,
//! or the API server behind `serve`. The write capability's invariants are
//! enforced above this, in [`crate::capability`], so every backend gets the
//! same checks.

use std::fmt;

use config_snapshot_policy::kind::SourceId;
use serde_json::Value;

use crate::lifecycle::Effect;

/// Why a backend call failed. Recognised by kind, never by the text; the
/// text is what crosses into the guest (`Host error: …`), so it keeps the
/// API server's reason in it for the policy's own classification.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackendError {
    NotFound(String),
    AlreadyExists(String),
    /// A precondition failed: the object changed since it was read.
    Conflict(String),
    Forbidden(String),
    Timeout(String),
    /// Anything else the server refused or could not do.
    Refused(String),
}

impl BackendError {
    pub fn message(&self) -> &str {
        match self {
            BackendError::NotFound(m)
            | BackendError::AlreadyExists(m)
            | BackendError::Conflict(m)
            | BackendError::Forbidden(m)
            | BackendError::Timeout(m)
            | BackendError::Refused(m) => m,
        }
    }

    fn reason(&self) -> &'static str {
        match self {
            BackendError::NotFound(_) => "NotFound",
            BackendError::AlreadyExists(_) => "AlreadyExists",
            BackendError::Conflict(_) => "Conflict",
            BackendError::Forbidden(_) => "Forbidden",
            BackendError::Timeout(_) => "Timeout",
            BackendError::Refused(_) => "Refused",
        }
    }
}

impl fmt::Display for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let message = self.message();
        // Kubewarden's own texts carry the reason; ours say it once.
        if message.contains(self.reason()) {
            write!(f, "{message}")
        } else {
            write!(f, "{message} ({})", self.reason())
        }
    }
}

impl std::error::Error for BackendError {}

impl From<kube::Error> for BackendError {
    fn from(error: kube::Error) -> Self {
        match error {
            kube::Error::Api(status) => {
                let text = format!("{} ({}, {})", status.message, status.reason, status.code);
                if status.is_not_found() {
                    BackendError::NotFound(text)
                } else if status.is_already_exists() {
                    BackendError::AlreadyExists(text)
                } else if status.is_conflict() {
                    BackendError::Conflict(text)
                } else if status.is_forbidden() {
                    BackendError::Forbidden(text)
                } else if status.code == 504 || status.reason == "Timeout" {
                    BackendError::Timeout(text)
                } else {
                    BackendError::Refused(text)
                }
            }
            other => BackendError::Refused(other.to_string()),
        }
    }
}

pub type Result<T> = std::result::Result<T, BackendError>;

pub trait Backend: Send + Sync {
    fn get(&self, kind: &str, namespace: &str, name: &str) -> Result<Option<Value>>;
    /// A read as fresh as the request, bypassing any cache
    /// (`disable_cache`, the re-check after a create lost a race, and a
    /// reuse deciding whether to mark). serve may answer it from a read it
    /// started after the request arrived.
    fn get_fresh(&self, kind: &str, namespace: &str, name: &str) -> Result<Option<Value>> {
        self.get(kind, namespace, name)
    }
    /// Calls `visit` with each matching object, by reference: listing is the
    /// hot path of watch and sweep, so nothing is copied on the way out.
    fn list(&self, kind: &str, namespace: &str, selector: &Selector, visit: &mut dyn FnMut(&Value)) -> Result<()>;
    /// The `kind` workloads of `namespace` whose pod template references
    /// `source`: a superset of its watchers (see [`crate::referrers`]). A
    /// backend without an index visits every workload of the kind, which
    /// gives the policy the same answer, slower.
    fn list_referencing(
        &self,
        kind: &str,
        namespace: &str,
        _source: &SourceId,
        visit: &mut dyn FnMut(&Value),
    ) -> Result<()> {
        self.list(kind, namespace, &Selector::default(), visit)
    }
    /// Creates an object that is believed not to exist.
    fn create(&self, object: Value) -> Result<()>;
    /// Deletes an object if it still has `uid` and, when given, `resource_version`.
    fn delete(&self, kind: &str, namespace: &str, name: &str, uid: &str, resource_version: Option<&str>) -> Result<()>;
    /// Applies a JSON Patch whose first op pins the object's
    /// resourceVersion (`lifecycle::effects::precondition`): it fails with
    /// `Conflict` if the object changed since it was read.
    fn patch(&self, kind: &str, namespace: &str, name: &str, ops: Vec<Value>) -> Result<()>;
    /// Queues a deferred effect for the admission with `admission_uid`.
    fn defer(&self, admission_uid: &str, effect: Effect);
    /// Whether a queued effect will make something reference this snapshot:
    /// it must not be deleted meanwhile.
    fn awaited(&self, _kind: &str, _namespace: &str, _name: &str) -> bool {
        false
    }
    fn now(&self) -> i64;
    /// An injected failure for `operation`, if any (replay's `fault:` step).
    fn fault(&self, _operation: &str) -> Option<String> {
        None
    }
    /// Records what a host call did, for the replay timeline and logs.
    fn note(&self, _event: String) {}
}

/// An equality-based label selector (`a=b,c!=d,e,!f`), the forms
/// `kubectl -l` users write most; set-based forms are refused, not ignored.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Selector(Vec<(String, Requirement)>);

#[derive(Debug, Clone, PartialEq)]
enum Requirement {
    Equals(String),
    NotEquals(String),
    Exists,
    NotExists,
}

impl Selector {
    pub fn parse(text: &str) -> std::result::Result<Selector, String> {
        let mut out = Vec::new();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            if part.contains(" in ") || part.contains(" notin ") || part.contains('(') {
                return Err(format!(
                    "unsupported label selector {part:?}: only equality-based selectors"
                ));
            }
            let req = if let Some((k, v)) = part.split_once("!=") {
                (k.trim().to_string(), Requirement::NotEquals(v.trim().to_string()))
            } else if let Some((k, v)) = part.split_once("==").or_else(|| part.split_once('=')) {
                (k.trim().to_string(), Requirement::Equals(v.trim().to_string()))
            } else if let Some(k) = part.strip_prefix('!') {
                (k.trim().to_string(), Requirement::NotExists)
            } else {
                (part.to_string(), Requirement::Exists)
            };
            out.push(req);
        }
        Ok(Selector(out))
    }

    pub fn matches(&self, object: &Value) -> bool {
        let labels = &object["metadata"]["labels"];
        self.0.iter().all(|(k, req)| {
            let v = labels.get(k).and_then(Value::as_str);
            match req {
                Requirement::Equals(want) => v == Some(want.as_str()),
                Requirement::NotEquals(want) => v != Some(want.as_str()),
                Requirement::Exists => v.is_some(),
                Requirement::NotExists => v.is_none(),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn selectors() {
        let obj = json!({"metadata": {"labels": {"app": "web", "tier": "fe"}}});
        for (sel, want) in [
            ("app=web", true),
            ("app==web,tier", true),
            ("app!=web", false),
            ("!tier", false),
            ("", true),
            ("x", false),
        ] {
            assert_eq!(Selector::parse(sel).unwrap().matches(&obj), want, "{sel}");
        }
        assert!(Selector::parse("app in (a,b)").is_err());
    }

    #[test]
    fn api_errors_are_recognised_by_their_status() {
        use kube::core::Status;
        let api = |code: u16, reason: &str| {
            BackendError::from(kube::Error::Api(
                Status::failure(&format!("it is {reason}"), reason)
                    .with_code(code)
                    .boxed(),
            ))
        };
        assert!(matches!(api(404, "NotFound"), BackendError::NotFound(_)));
        assert!(matches!(api(409, "AlreadyExists"), BackendError::AlreadyExists(_)));
        assert!(matches!(api(409, "Conflict"), BackendError::Conflict(_)));
        assert!(matches!(api(403, "Forbidden"), BackendError::Forbidden(_)));
        assert!(matches!(api(504, "Timeout"), BackendError::Timeout(_)));
        assert!(matches!(api(422, "Invalid"), BackendError::Refused(_)));
        // The text the guest sees keeps the reason once.
        assert_eq!(api(404, "NotFound").to_string(), "it is NotFound (NotFound, 404)");
        assert_eq!(BackendError::Timeout("slow".into()).to_string(), "slow (Timeout)");
    }
}
