//! The validate payload, parsed lazily: the objects stay raw JSON until a
//! handler needs them, because most requests that reach the policy (every
//! ConfigMap write in the cluster) need only a few fields.

use kubewarden_policy_sdk::response::ValidationResponse;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;

#[derive(Deserialize)]
pub(crate) struct Payload<'a> {
    #[serde(borrow)]
    pub request: Request<'a>,
    #[serde(borrow, default)]
    pub settings: Option<&'a RawValue>,
}

/// The fields of `request.kind` the policy decides on. The version is not
/// one of them: every handled kind has a single served version.
#[derive(Deserialize, Default, Debug)]
#[serde(default)]
pub(crate) struct Gvk {
    pub group: String,
    pub kind: String,
}

/// The fields of an AdmissionRequest the policy reads; the rest (uid, name,
/// userInfo, …) is skipped unparsed.
#[derive(Deserialize, Debug)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Request<'a> {
    #[serde(default)]
    pub kind: Gvk,
    #[serde(default)]
    pub operation: String,
    #[serde(default)]
    pub namespace: String,
    #[serde(default)]
    pub dry_run: bool,
    #[serde(borrow, default)]
    pub object: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub old_object: Option<&'a RawValue>,
}

/// What the policy answers, before it becomes a Kubewarden response.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Outcome {
    pub accepted: bool,
    pub message: Option<String>,
    pub code: Option<u16>,
    pub mutated: Option<Value>,
    pub warnings: Vec<String>,
}

impl Outcome {
    pub(crate) fn accept() -> Self {
        Outcome {
            accepted: true,
            ..Default::default()
        }
    }

    pub(crate) fn accept_with(warnings: Vec<String>) -> Self {
        Outcome {
            accepted: true,
            warnings,
            ..Default::default()
        }
    }

    pub(crate) fn reject(message: impl Into<String>, code: u16) -> Self {
        Outcome {
            accepted: false,
            message: Some(message.into()),
            code: Some(code),
            ..Default::default()
        }
    }

    /// Built by hand rather than with the SDK's `mutate_request`, which
    /// drops warnings.
    pub(crate) fn into_response(self) -> ValidationResponse {
        ValidationResponse {
            accepted: self.accepted,
            message: self.message,
            code: self.code,
            mutated_object: self.mutated,
            audit_annotations: None,
            warnings: (!self.warnings.is_empty()).then_some(self.warnings),
        }
    }
}

/// A refusal decided deep in a handler; small, so `Result`s stay cheap.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Rejection {
    pub message: String,
    pub code: u16,
}

impl Rejection {
    pub(crate) fn new(message: impl Into<String>, code: u16) -> Self {
        Rejection {
            message: message.into(),
            code,
        }
    }
}

impl From<Rejection> for Outcome {
    fn from(r: Rejection) -> Outcome {
        Outcome::reject(r.message, r.code)
    }
}

/// Every message and warning starts with this, so users can tell ours apart
/// from other webhooks' in kubectl output.
pub(crate) const SAY: &str = "config-snapshot: ";
