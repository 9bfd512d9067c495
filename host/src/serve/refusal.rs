//! How a request is refused before any work, and what the listener hands
//! the webhook with each request: the listener refuses a peer over its
//! share, the webhook everything else, with the same answers and labels.

use std::net::IpAddr;
use std::sync::Arc;

use axum::http::{header, HeaderValue, StatusCode, Version};
use axum::response::{IntoResponse, Response};

/// Why a request was answered with an error before any work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// Not a POST to the door's path: not the API server.
    Door,
    /// The peer already has its share of requests in flight.
    Peer,
    /// A body declared, or found, larger than the most a review may be
    /// (`http::MAX_BODY`).
    TooLarge,
    /// The bodies being read already hold the whole budget until the
    /// request's deadline, or this peer's half of it.
    Budget,
    /// The body did not arrive, whole, by the deadline.
    Deadline,
}

impl Refusal {
    pub(crate) const LABELS: [&'static str; 5] = ["door", "peer", "too_large", "budget", "deadline"];

    pub(crate) fn label(self) -> &'static str {
        match self {
            Refusal::Door => "door",
            Refusal::Peer => "peer",
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
            Refusal::Peer => (
                StatusCode::SERVICE_UNAVAILABLE,
                "too many requests in flight from this address",
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

/// The address a request came from, as the listener saw it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Peer(pub IpAddr);

/// Given to the webhook by the listener with each request: the request's
/// place among its peer's requests in flight, held until its evaluation is
/// over (not only until its caller goes), and the means to close its
/// connection.
#[derive(Clone)]
pub(crate) struct Connection {
    pub in_flight: Arc<dyn std::any::Any + Send + Sync>,
    pub close: Arc<tokio::sync::Notify>,
}
