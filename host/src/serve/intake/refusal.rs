//! How a request is refused before any work, and what the listener hands
//! the webhook with each request.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use axum::http::{header, HeaderValue, StatusCode, Version};
use axum::response::{IntoResponse, Response};

/// Why a request was answered with an error before any work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// Not a POST to the door's path: not the API server.
    Door,
    /// The review's namespace already holds its share: of requests in
    /// flight (`--max-requests-per-namespace`), or of the budget of bodies
    /// (a quarter).
    Namespace,
    /// A body declared, or found, larger than the most a review may be
    /// (`intake::MAX_BODY`).
    TooLarge,
    /// The bodies being read already hold the whole budget until the
    /// request's deadline.
    Budget,
    /// The body did not arrive, whole, by the deadline.
    Deadline,
}

impl Refusal {
    pub(crate) const LABELS: [&'static str; 5] = ["door", "namespace", "too_large", "budget", "deadline"];

    pub(crate) fn label(self) -> &'static str {
        match self {
            Refusal::Door => "door",
            Refusal::Namespace => "namespace",
            Refusal::TooLarge => "too_large",
            Refusal::Budget => "budget",
            Refusal::Deadline => "deadline",
        }
    }

    fn status(self) -> (StatusCode, &'static str) {
        match self {
            // Nothing here: the same answer as for any unknown path, so
            // that it tells a prober nothing.
            Refusal::Door => (StatusCode::NOT_FOUND, "not found"),
            Refusal::Namespace => (
                StatusCode::SERVICE_UNAVAILABLE,
                "too many requests in flight for this namespace",
            ),
            Refusal::TooLarge => (StatusCode::PAYLOAD_TOO_LARGE, "request body too large"),
            Refusal::Budget => (StatusCode::SERVICE_UNAVAILABLE, "too many request bodies in flight"),
            Refusal::Deadline => (StatusCode::REQUEST_TIMEOUT, "request body too slow"),
        }
    }
}

/// The answer to a refused request. On HTTP/1 it closes the connection: a
/// body left unread is never read, and the caller must connect again (and
/// take a place again) to try once more.
pub(crate) fn refusal(version: Version, why: Refusal) -> Response {
    let (status, text) = why.status();
    let mut response = (status, text).into_response();
    if version < Version::HTTP_2 {
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

/// Given to the webhook by the listener with each request: the request's
/// mark on its connection, held until its evaluation is over (not only
/// until its caller goes); the connection's proof, which the webhook sets
/// once a request has passed the door (the listener never takes a proven
/// connection's place for a new one); and the means to close it.
#[derive(Clone)]
pub(crate) struct Connection {
    pub in_flight: Arc<dyn std::any::Any + Send + Sync>,
    pub proven: Arc<AtomicBool>,
    pub close: Arc<tokio::sync::Notify>,
}
