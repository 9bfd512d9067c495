//! What the host needs from a cluster, and nothing more: the simulator
//! behind `replay`, or the API server behind `serve`. The capability's
//! invariants (`crate::capability`) and the lifecycle's driver
//! (`crate::lifecycle::driver`) are written once over this trait, so both
//! hosts run the same checks and the same orchestration.
//!
//! The wing holds what every cluster shares behind the trait: the proof
//! that an object is the host's own (`proof`), the reverse index of
//! references (`referrers`), label selectors (`selector`) and the count
//! of a JSON tree's values that bounds what a host holds (`count`). The
//! simulator is `replay`'s, the API server's client `serve`'s.

use config_snapshot_policy::host::host_error::Code;
use config_snapshot_policy::model::object::ObjectExt;
use config_snapshot_policy::model::source::SourceId;
use serde_json::{json, Value};

pub(crate) mod count;
pub mod proof;
pub(crate) mod referrers;
pub mod revoked;
pub mod selector;

pub use crate::cluster::selector::Selector;

/// Why a cluster call failed, recognised by the API server's status code
/// and reason, never by its text. The text is the API server's message,
/// for logs and for the guest.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    AlreadyExists(String),
    /// A precondition failed: the object changed since it was read.
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    Forbidden(String),
    /// The API server did not accept the host's own credentials (401):
    /// its token expired, or names a ServiceAccount deleted since.
    #[error("{0}")]
    Unauthorized(String),
    #[error("{0}")]
    Timeout(String),
    /// Refused as invalid, or denied by an admission webhook (400, 422).
    #[error("{0}")]
    Invalid(String),
    /// The server failed or could not be reached (5xx, transport).
    #[error("{0}")]
    Unavailable(String),
}

impl ApiError {
    /// The code the guest sees (`config_snapshot_policy::host::host_error`).
    pub fn code(&self) -> Code {
        match self {
            ApiError::NotFound(_) => Code::NotFound,
            ApiError::AlreadyExists(_) => Code::AlreadyExists,
            ApiError::Conflict(_) => Code::Conflict,
            ApiError::Forbidden(_) => Code::Forbidden,
            ApiError::Timeout(_) => Code::Timeout,
            ApiError::Invalid(_) => Code::Invalid,
            ApiError::Unavailable(_) | ApiError::Unauthorized(_) => Code::Unavailable,
        }
    }

    /// Its HTTP code and status reason, as the API server answers it.
    fn code_and_reason(&self) -> (u16, &'static str) {
        match self {
            ApiError::NotFound(_) => (404, "NotFound"),
            ApiError::AlreadyExists(_) => (409, "AlreadyExists"),
            ApiError::Conflict(_) => (409, "Conflict"),
            ApiError::Forbidden(_) => (403, "Forbidden"),
            ApiError::Unauthorized(_) => (401, "Unauthorized"),
            ApiError::Timeout(_) => (504, "Timeout"),
            ApiError::Invalid(_) => (422, "Invalid"),
            ApiError::Unavailable(_) => (503, "ServiceUnavailable"),
        }
    }

    /// The API server's answer for this error: a `Status` body and its
    /// HTTP code, as a stand-in server writes it.
    pub fn status(&self) -> (u16, Value) {
        let (code, reason) = self.code_and_reason();
        let body = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                          "message": self.to_string(), "reason": reason, "code": code});
        (code, body)
    }

    /// The same failure with its status alone in place of its message
    /// (`403 Forbidden`): what an Event may say of it, and all that is kept
    /// of a failed write of a Secret (docs/security.md). The API server's
    /// message is its own words or an admission's: another webhook, or a
    /// ValidatingAdmissionPolicy's `messageExpression`, may quote the
    /// object it denied, a Secret's data among it.
    pub fn without_message(&self) -> ApiError {
        let (code, reason) = self.code_and_reason();
        let status = format!("{code} {reason}");
        match self {
            ApiError::NotFound(_) => ApiError::NotFound(status),
            ApiError::AlreadyExists(_) => ApiError::AlreadyExists(status),
            ApiError::Conflict(_) => ApiError::Conflict(status),
            ApiError::Forbidden(_) => ApiError::Forbidden(status),
            ApiError::Unauthorized(_) => ApiError::Unauthorized(status),
            ApiError::Timeout(_) => ApiError::Timeout(status),
            ApiError::Invalid(_) => ApiError::Invalid(status),
            ApiError::Unavailable(_) => ApiError::Unavailable(status),
        }
    }

    /// Reads an API server's failure by its status: the code, and for a
    /// 409 the reason that tells an existing name from a lost race.
    pub(crate) fn from_status(code: u16, reason: &str, message: String) -> ApiError {
        match (code, reason) {
            (404, _) => ApiError::NotFound(message),
            (409, "AlreadyExists") => ApiError::AlreadyExists(message),
            (409, _) => ApiError::Conflict(message),
            (401, _) => ApiError::Unauthorized(message),
            (403, _) => ApiError::Forbidden(message),
            (408 | 504, _) | (_, "Timeout") => ApiError::Timeout(message),
            (400 | 422, _) => ApiError::Invalid(message),
            _ => ApiError::Unavailable(message),
        }
    }
}

impl From<kube::Error> for ApiError {
    fn from(error: kube::Error) -> Self {
        match error {
            kube::Error::Api(status) => ApiError::from_status(status.code, &status.reason, status.message),
            other => ApiError::Unavailable(other.to_string()),
        }
    }
}

pub type Result<T> = std::result::Result<T, ApiError>;

/// The object and version a delete must still find, or it fails with
/// [`ApiError::Conflict`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Preconditions {
    pub uid: String,
    pub resource_version: Option<String>,
}

/// A cluster, as both hosts' orchestration sees it. Kinds are the policy's
/// table's (`config_snapshot_policy::model::kinds`); objects are JSON.
pub trait Cluster: Send + Sync {
    /// One object, from a cache where the host keeps one.
    fn get(&self, kind: &str, namespace: &str, name: &str) -> Result<Option<Value>>;
    /// One object as fresh as the request, never from a cache: what a
    /// snapshot copies, what a reuse decides on, what an effect is judged
    /// against.
    fn get_fresh(&self, kind: &str, namespace: &str, name: &str) -> Result<Option<Value>> {
        self.get(kind, namespace, name)
    }
    /// Whether [`Cluster::get`] of `kind` in `namespace` follows the API
    /// server with a bounded lag, so that a cached copy may decide a reuse
    /// (`reusable_as_cached`). A host without a cache says yes; serve says
    /// no while the watch that holds it is failing or listing again. No
    /// default: a wrapper that forgot to ask what it wraps would vouch for
    /// a cache it cannot see.
    fn following(&self, kind: &str, namespace: &str) -> bool;
    /// Calls `visit` with each object of `kind` in `namespace` (every
    /// namespace: `None`) that `selector` matches, by reference: listing is
    /// the hot path of watch and sweep.
    fn list(
        &self,
        kind: &str,
        namespace: Option<&str>,
        selector: &Selector,
        visit: &mut dyn FnMut(&Value),
    ) -> Result<()>;
    /// The `kind` workloads of `namespace` whose pod template references
    /// `source`: a superset of its watchers (see [`crate::cluster::referrers`]). A
    /// host without an index visits every workload of the kind, which gives
    /// the same answer, slower.
    fn list_referencing(
        &self,
        kind: &str,
        namespace: &str,
        _source: &SourceId,
        visit: &mut dyn FnMut(&Value),
    ) -> Result<()> {
        self.list(kind, Some(namespace), &Selector::default(), visit)
    }
    /// Creates an object that is believed not to exist.
    fn create(&self, object: Value) -> Result<()>;
    /// Whether writes may be made from several threads at once and gain
    /// by it (an API server across a network). The simulator says
    /// no: one at a time keeps replay's histories the same on every run.
    fn concurrent_writes(&self) -> bool {
        false
    }
    /// Applies a JSON Patch to the object if it is still at
    /// `resource_version`, else fails with [`ApiError::Conflict`].
    fn patch(&self, kind: &str, namespace: &str, name: &str, resource_version: &str, ops: Vec<Value>) -> Result<()>;
    /// Deletes an object if it still matches `preconditions`.
    fn delete(&self, kind: &str, namespace: &str, name: &str, preconditions: &Preconditions) -> Result<()>;
    /// The cluster's clock, unix seconds (replay's is the scenario's).
    fn now(&self) -> i64;
    /// The uid of the Namespace `namespace`, which anchors its shared
    /// snapshots (docs/design.md, "Garbage collection", Anchors), read as
    /// fresh as the request: never a cache, which could hold a namespace
    /// deleted and made again under the same name. `None`: there is none.
    fn namespace_uid(&self, namespace: &str) -> Result<Option<String>>;
}

/// The JSON Patch operation that pins a patch to a version: the API
/// server answers 409 Conflict when the object has moved on.
pub fn pin(resource_version: &str) -> Value {
    json!({"op": "replace", "path": "/metadata/resourceVersion", "value": resource_version})
}

/// (kind, namespace, name) of an object.
pub(crate) type Key = (String, String, String);

pub fn key(object: &Value) -> Key {
    let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
    (
        text(&object["kind"]),
        object.namespace().unwrap_or_default().to_string(),
        object.name().to_string(),
    )
}

/// A name that was refused, for a message: quoted, and cut short (it
/// may come from a forged review).
pub fn shown(name: &str) -> String {
    let cut: String = name.chars().take(64).collect();
    if cut.len() < name.len() {
        format!("{cut:?}…")
    } else {
        format!("{cut:?}")
    }
}

/// What a judgement of an object, as last read, asks of
/// [`patch_judged`].
pub(crate) enum Judged<T> {
    /// Nothing (more) to write: the answer.
    Done(T),
    /// Write `ops` if the object is still at `version`; `then` is the
    /// answer once written.
    Patch { ops: Vec<Value>, version: String, then: T },
}

/// How many times [`patch_judged`] judges an object that keeps changing.
const JUDGEMENTS: usize = 3;

/// Optimistic concurrency, written once for the host: `judge` decides on
/// the object as last read (`None`: it does not exist), and what it asks
/// is written on the version it judged. When someone wrote the object in
/// between (409), it is read fresh and judged again; when it went (404),
/// it is judged as gone. `Ok(None)` when it kept changing for
/// [`JUDGEMENTS`] judgements; `fail` turns a failed call into the caller's
/// error.
pub(crate) fn patch_judged<C, T, E>(
    cluster: &C,
    (kind, namespace, name): (&str, &str, &str),
    mut current: Option<Value>,
    mut judge: impl FnMut(Option<Value>) -> std::result::Result<Judged<T>, E>,
    fail: impl Fn(ApiError) -> E,
) -> std::result::Result<Option<T>, E>
where
    C: Cluster + ?Sized,
{
    for _ in 0..JUDGEMENTS {
        let (ops, version, then) = match judge(current.take())? {
            Judged::Done(answer) => return Ok(Some(answer)),
            Judged::Patch { ops, version, then } => (ops, version, then),
        };
        match cluster.patch(kind, namespace, name, &version, ops) {
            Ok(()) => return Ok(Some(then)),
            Err(ApiError::NotFound(_)) => current = None,
            Err(ApiError::Conflict(_)) => current = cluster.get_fresh(kind, namespace, name).map_err(&fail)?,
            Err(e) => return Err(fail(e)),
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one_configmap() -> crate::replay::simulator::Shared {
        let cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "app", "namespace": "team-a"}, "data": {"k": "v"}});
        crate::replay::simulator::Shared::holding(&[cm], 1_900_000_000)
    }

    fn annotate(n: usize) -> Vec<Value> {
        vec![json!({"op": "add", "path": "/metadata/annotations", "value": {"n": n.to_string()}})]
    }

    /// A write on a version that moved on is judged again on the object
    /// read fresh, and lands there.
    #[test]
    fn a_conflict_is_judged_again_on_a_fresh_read() {
        let cluster = one_configmap();
        let key = ("ConfigMap", "team-a", "app");
        let stale = json!({"metadata": {"resourceVersion": "0"}});
        let mut seen = Vec::new();
        let answer = patch_judged(
            &cluster,
            key,
            Some(stale),
            |found| {
                let version = found.unwrap()["metadata"]["resourceVersion"]
                    .as_str()
                    .unwrap()
                    .to_string();
                seen.push(version.clone());
                Ok::<_, ApiError>(Judged::Patch {
                    ops: annotate(seen.len()),
                    version,
                    then: "written",
                })
            },
            |e| e,
        );
        assert_eq!(answer, Ok(Some("written")));
        assert_eq!(seen, ["0", "1"], "judged on the stale version, then on the stored one");
        let stored = cluster.get_fresh("ConfigMap", "team-a", "app").unwrap().unwrap();
        assert_eq!(stored["metadata"]["annotations"]["n"], "2");
    }

    /// An object that keeps changing is given up after a few judgements,
    /// and one that went is judged as gone.
    #[test]
    fn an_object_that_keeps_changing_or_went_ends_the_loop() {
        let cluster = one_configmap();
        let key = ("ConfigMap", "team-a", "app");
        let mut judged = 0;
        let answer = patch_judged(
            &cluster,
            key,
            None,
            |found| {
                judged += 1;
                Ok::<_, ApiError>(match found {
                    None => Judged::Done("gone"),
                    Some(_) => Judged::Patch {
                        ops: annotate(0),
                        version: "stale".into(),
                        then: "written",
                    },
                })
            },
            |e| e,
        );
        assert_eq!((answer, judged), (Ok(Some("gone")), 1));
        let current = cluster.get_fresh("ConfigMap", "team-a", "app").unwrap();
        let mut judged = 0;
        let answer = patch_judged(
            &cluster,
            key,
            current,
            |_| {
                judged += 1;
                Ok::<_, ApiError>(Judged::Patch {
                    ops: annotate(0),
                    version: "stale".into(),
                    then: "written",
                })
            },
            |e| e,
        );
        assert_eq!((answer, judged), (Ok(None), JUDGEMENTS));
    }

    #[test]
    fn api_errors_are_recognised_by_their_status() {
        use kube::core::Status;
        let api = |code: u16, reason: &str| {
            ApiError::from(kube::Error::Api(
                Status::failure(&format!("it is {reason}"), reason)
                    .with_code(code)
                    .boxed(),
            ))
        };
        assert!(matches!(api(404, "NotFound"), ApiError::NotFound(_)));
        assert!(matches!(api(409, "AlreadyExists"), ApiError::AlreadyExists(_)));
        assert!(matches!(api(409, "Conflict"), ApiError::Conflict(_)));
        assert!(matches!(api(403, "Forbidden"), ApiError::Forbidden(_)));
        assert!(matches!(api(401, "Unauthorized"), ApiError::Unauthorized(_)));
        assert!(matches!(api(504, "Timeout"), ApiError::Timeout(_)));
        assert!(matches!(api(422, "Invalid"), ApiError::Invalid(_)));
        assert!(matches!(api(500, "InternalError"), ApiError::Unavailable(_)));
        // The message is kept as the server wrote it; the reason decides.
        assert_eq!(api(404, "NotFound").to_string(), "it is NotFound");
        assert!(
            matches!(api(409, "NotFound"), ApiError::Conflict(_)),
            "409 is not a 404"
        );
    }

    #[test]
    fn a_status_round_trips() {
        for e in [
            ApiError::NotFound("a".into()),
            ApiError::AlreadyExists("b".into()),
            ApiError::Conflict("c".into()),
            ApiError::Forbidden("d".into()),
            ApiError::Unauthorized("d2".into()),
            ApiError::Timeout("e".into()),
            ApiError::Invalid("f".into()),
            ApiError::Unavailable("g".into()),
        ] {
            let (code, body) = e.status();
            let back = ApiError::from_status(code, body["reason"].as_str().unwrap(), e.to_string());
            assert_eq!(back, e);
        }
    }
}
