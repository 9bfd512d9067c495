//! The one door between a guest and its host: what answers the guest's
//! calls, and what a failed call hands back. The engine and the waPC
//! protocol both speak it; neither owns it.

use config_snapshot_policy::host::host_error::HostError;

/// Answers the guest's host calls for one request.
pub trait CallHandler: Send + Sync {
    fn call(&self, binding: &str, namespace: &str, operation: &str, payload: &[u8]) -> Result<Vec<u8>, CallFailure>;
}

/// What a failed host call hands the guest.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallFailure {
    /// Our hosts' answer: a code and a message, as JSON.
    #[error("{0}")]
    Ours(#[from] HostError),
    /// Another host's text, as it writes it: stock Kubewarden, which
    /// `interactions` plays.
    #[error("{0}")]
    Foreign(String),
}

/// A failure on its way to the guest: the bytes of `__host_error`. Ours
/// is the JSON the guest reads its code from.
impl CallFailure {
    pub fn to_bytes(&self) -> Vec<u8> {
        match self {
            CallFailure::Ours(e) => e.to_bytes(),
            CallFailure::Foreign(text) => text.clone().into_bytes(),
        }
    }
}
