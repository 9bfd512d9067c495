//! Why a host call failed, as it crosses the waPC boundary.
//!
//! waPC carries only bytes for an error (the guest sees them behind
//! `Host error: `), so our hosts write a small JSON object,
//! `{"code":"NotFound","message":"…"}`, and the policy decides by the code,
//! never by the message. A host that writes anything else does not speak
//! this protocol (stock Kubewarden): the policy treats its errors as
//! foreign text and never interprets them (see [`crate::host`]).

use serde::{Deserialize, Serialize};

/// What kind of failure, as far as a caller must tell them apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Code {
    /// The object does not exist (the API server's 404).
    NotFound,
    /// An object of that name exists already (409 AlreadyExists).
    AlreadyExists,
    /// A precondition failed: the object changed since it was read (409).
    Conflict,
    /// RBAC or an admission webhook said no (403).
    Forbidden,
    /// The API server did not answer in time.
    Timeout,
    /// The API server refused the object as invalid (400, 422).
    Invalid,
    /// The API server could not be reached or failed (5xx, transport).
    Unavailable,
    /// The host's own invariants refused the call (docs/design.md, "Host
    /// capability contract"): another namespace, not a snapshot, a path
    /// outside the pod template, a signature that does not verify.
    Refused,
    /// A write during a dry-run request.
    DryRun,
    /// The host has no such binding or operation.
    Unsupported,
    /// The payload is not what the operation takes.
    BadRequest,
    /// A limit of the host was crossed (payload size, rate).
    TooLarge,
}

/// One failed host call, as our hosts answer it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{message}")]
pub struct HostError {
    pub code: Code,
    pub message: String,
}

impl HostError {
    pub fn new(code: Code, message: impl Into<String>) -> HostError {
        HostError {
            code,
            message: message.into(),
        }
    }

    /// The bytes the host hands the guest.
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_else(|_| br#"{"code":"Unavailable","message":""}"#.to_vec())
    }

    /// Reads what a host answered; `None` if it is not our protocol.
    pub fn from_bytes(bytes: &[u8]) -> Option<HostError> {
        serde_json::from_slice(bytes).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_tells_foreign_text_apart() {
        let e = HostError::new(Code::NotFound, r#"configmaps "app" not found"#);
        assert_eq!(HostError::from_bytes(&e.to_bytes()), Some(e.clone()));
        assert_eq!(e.to_string(), r#"configmaps "app" not found"#);
        for foreign in [
            &b"unknown binding: config-snapshot"[..],
            b"{\"message\":\"no code\"}",
            b"{\"code\":\"Invented\",\"message\":\"x\"}",
        ] {
            assert_eq!(HostError::from_bytes(foreign), None);
        }
    }
}
