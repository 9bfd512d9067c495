//! The webhook's way in (docs/security.md, "serve's port"): what a request
//! passes before it is evaluated, each step before the next costs anything.
//!
//! 1. The door: a POST to the door's path (serve/intake/door.rs), else a bare 404
//!    and its connection closed before a byte of its body is read. A
//!    request that passes proves its connection (serve/intake/listener.rs).
//! 2. Its declared size: at most [`MAX_BODY`].
//! 3. Its first bytes: [`FIRST_UNITS`] of the budget of bodies, then the
//!    body's first [`review_namespace::WITHIN`] bytes, which name the
//!    review's namespace (serve/intake/review_namespace.rs).
//! 4. Its namespace's shares (serve/intake/shares.rs): one of the namespace's
//!    `--max-requests-per-namespace` requests in flight, and its declared
//!    size of the namespace's quarter of the budget; refused at once past
//!    either.
//! 5. The rest of its declared size from the budget, waited for until the
//!    request's deadline; then the rest of its body by the same deadline.
//! 6. A slot to evaluate in (serve/intake/evaluations.rs), by namespace as well;
//!    then one of the engine's instances (kubewarden/engine/instances.rs),
//!    which the judges of changed sources take too: waited for, never
//!    refused.
//!
//! Nothing here is counted by address. The API server is one address that
//! carries every namespace's reviews: a share per address (eff3694 gave one
//! address half of the budget) let one tenant's large reviews, escaped and
//! sent in a loop, fill the API server's share, and every other
//! namespace's review was refused and let through unmutated. What protects
//! against pods, which never pass the door, is the listener's, per
//! connection.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State as Extract};
use axum::http::{header, Method, StatusCode, Version};
use axum::response::{IntoResponse, Response};
use axum::Router;
use futures::StreamExt as _;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{timeout_at, Instant};

use super::door::Door;
use super::evaluations::Evaluations;
use super::listener::WINDOW;
use super::refusal::{refusal, Connection, Refusal};
use super::review_namespace;
use super::shares::{ChargedTo, Share, Shares};
use crate::serve::answer::admission;
use crate::serve::answer::state::State;
use crate::serve::tell::metrics::RefusedLabels;

/// An AdmissionReview carries the object and the old object; the API
/// server caps each at about 3 MiB.
pub(crate) const MAX_BODY: usize = 8 << 20;

/// The budget of request bodies is counted in KiB.
const BUDGET_UNIT: usize = 1024;

/// A body larger than this is large: large ones take their part of the
/// budget from a pool of their own, half of it.
const LARGE: usize = 1 << 20;

/// What a body takes of the budget before its namespace is known: the most
/// reading its first bytes can bring in, those bytes and the one read that
/// completes them (at most a connection's window: hyper's HTTP/1 buffer,
/// or an HTTP/2 frame, smaller).
const FIRST_UNITS: u32 = (review_namespace::WITHIN + WINDOW as usize).div_ceil(BUDGET_UNIT) as u32;

/// What the webhook's one route needs.
#[derive(Clone)]
pub(crate) struct Webhook {
    pub state: Arc<State>,
    pub door: Arc<Door>,
    /// Admissions evaluating at once, shared between namespaces
    /// ([`Evaluations`]).
    evaluations: Arc<Evaluations>,
    /// The budget of request bodies being read or evaluated at once, in
    /// [`BUDGET_UNIT`]s, in two pools: bodies up to [`LARGE`] and larger
    /// ones, half each. Apart, a large body waiting never holds up the API
    /// server's usual reviews (a few KiB to a few hundred) queued behind
    /// it.
    small: Arc<Semaphore>,
    large: Arc<Semaphore>,
    /// Of the budget, what each namespace holds: a quarter at most, so
    /// that one namespace's reviews leave three quarters to the others.
    bodies: Arc<Shares>,
    /// Requests in flight, per namespace.
    requests: Arc<Shares>,
    /// From a request's headers to its whole body: one deadline, not one
    /// per frame, so that a body trickled a byte at a time is cut off.
    pub body_deadline: Duration,
}

/// What a request holds from its first bytes to the end of its evaluation,
/// whether or not its caller waits for the answer.
struct Holds {
    _first: OwnedSemaphorePermit,
    _rest: Option<OwnedSemaphorePermit>,
    _bodies: Share,
    _request: Share,
}

impl Webhook {
    /// `budget_bytes` of bodies at once, never less than four bodies at
    /// most (so that a namespace's quarter holds one), and
    /// `requests_per_namespace` requests in flight per namespace.
    pub fn new(
        state: Arc<State>,
        door: Arc<Door>,
        budget_bytes: usize,
        requests_per_namespace: u32,
        body_deadline: Duration,
    ) -> Webhook {
        let units = u32::try_from(budget_bytes.max(4 * MAX_BODY) / BUDGET_UNIT).unwrap_or(u32::MAX >> 4);
        // The API server's reviews share the engine's shared lane: all its
        // instances but the one kept for the pass. The engine counts them
        // itself, so a review that finds the judges of changed sources in
        // them waits for one rather than fails; these slots only share
        // what the reviews take of it between namespaces.
        let instances = state.engine.limits().instances as usize;
        // Every refusal's counter starts at zero, so that an alert on the
        // first sees a counter move from 0 to 1.
        for reason in Refusal::LABELS {
            let _ = state
                .metrics
                .connections
                .requests_refused
                .get_or_create(&RefusedLabels { reason });
        }
        Webhook {
            evaluations: Evaluations::new(instances.saturating_sub(1)),
            state,
            door,
            small: Arc::new(Semaphore::new((units / 2) as usize)),
            large: Arc::new(Semaphore::new((units / 2) as usize)),
            bodies: Shares::new(units / 4),
            requests: Shares::new(requests_per_namespace.max(1)),
            body_deadline,
        }
    }

    fn refuse(&self, version: Version, why: Refusal) -> Response {
        self.state
            .metrics
            .connections
            .requests_refused
            .get_or_create(&RefusedLabels { reason: why.label() })
            .inc();
        refusal(version, why)
    }

    /// Takes `body`, of at most `limit` bytes, in by `deadline` (steps 3 to
    /// 5): what it is charged to, the body, and what it holds.
    async fn take_in(&self, body: Body, limit: usize, deadline: Instant) -> Result<(ChargedTo, Bytes, Holds), Refusal> {
        let units = u32::try_from(limit.div_ceil(BUDGET_UNIT).max(1)).unwrap_or(u32::MAX);
        let pool = if limit > LARGE { &self.large } else { &self.small };
        let first_units = units.min(FIRST_UNITS);
        let first = from_pool(pool, first_units, deadline).await?;
        let mut reading = Reading::new(body, limit);
        reading.fill(review_namespace::WITHIN, deadline).await?;
        let to = ChargedTo::of(review_namespace::within(&reading.first(review_namespace::WITHIN)));
        if to == ChargedTo::Unsorted {
            self.state.metrics.connections.unsorted.inc();
        }
        let request = self.requests.take(&to, 1).ok_or(Refusal::Namespace)?;
        let bodies = self.bodies.take(&to, units).ok_or(Refusal::Namespace)?;
        let rest = match units - first_units {
            0 => None,
            more => Some(from_pool(pool, more, deadline).await?),
        };
        reading.fill(usize::MAX, deadline).await?;
        let holds = Holds {
            _first: first,
            _rest: rest,
            _bodies: bodies,
            _request: request,
        };
        Ok((to, reading.into_bytes(), holds))
    }
}

/// `units` of `pool`, waited for until `deadline`.
async fn from_pool(pool: &Arc<Semaphore>, units: u32, deadline: Instant) -> Result<OwnedSemaphorePermit, Refusal> {
    match timeout_at(deadline, pool.clone().acquire_many_owned(units)).await {
        Ok(Ok(permit)) => Ok(permit),
        _ => Err(Refusal::Budget),
    }
}

/// A body read as it comes, never past its limit.
struct Reading {
    frames: axum::body::BodyDataStream,
    chunks: Vec<Bytes>,
    read: usize,
    limit: usize,
    ended: bool,
}

impl Reading {
    fn new(body: Body, limit: usize) -> Reading {
        Reading {
            frames: body.into_data_stream(),
            chunks: Vec::new(),
            read: 0,
            limit,
            ended: false,
        }
    }

    /// Reads until `want` bytes are in or the body ends, by `deadline`.
    /// A body past its limit, or one whose connection failed, is refused
    /// as too large, as it always was.
    async fn fill(&mut self, want: usize, deadline: Instant) -> Result<(), Refusal> {
        while self.read < want && !self.ended {
            match timeout_at(deadline, self.frames.next()).await {
                Err(_) => return Err(Refusal::Deadline),
                Ok(None) => self.ended = true,
                Ok(Some(Err(_))) => return Err(Refusal::TooLarge),
                Ok(Some(Ok(data))) => {
                    self.read += data.len();
                    if self.read > self.limit {
                        return Err(Refusal::TooLarge);
                    }
                    self.chunks.push(data);
                }
            }
        }
        Ok(())
    }

    /// The first `n` bytes read (fewer if fewer are in).
    fn first(&self, n: usize) -> std::borrow::Cow<'_, [u8]> {
        match self.chunks.first() {
            Some(one) if one.len() >= n || self.chunks.len() == 1 => {
                std::borrow::Cow::Borrowed(&one[..one.len().min(n)])
            }
            _ => std::borrow::Cow::Owned(self.chunks.iter().flat_map(|c| c.iter().copied()).take(n).collect()),
        }
    }

    fn into_bytes(mut self) -> Bytes {
        if self.chunks.len() == 1 {
            return self.chunks.pop().unwrap_or_default();
        }
        let mut whole = Vec::with_capacity(self.read);
        for chunk in &self.chunks {
            whole.extend_from_slice(chunk);
        }
        Bytes::from(whole)
    }
}

/// The webhook: one handler for every method and path, so that what is
/// not the door's path is refused the same way, before its body is read.
pub(crate) fn webhook_router(webhook: Webhook) -> Router {
    Router::new().fallback(intake).with_state(webhook)
}

/// Lets a request in, or not (the steps above); only then is it
/// evaluated. A request refused at the door also closes its connection (a
/// GOAWAY on HTTP/2): whoever does not know the path keeps no place.
async fn intake(Extract(hook): Extract<Webhook>, request: Request) -> Response {
    let version = request.version();
    let connection = request.extensions().get::<Connection>().cloned();
    let now = config_snapshot_policy::model::duration::unix_now();
    if request.method() != Method::POST || !hook.door.opens(request.uri().path(), now) {
        if let Some(c) = &connection {
            c.close.notify_one();
        }
        return hook.refuse(version, Refusal::Door);
    }
    if let Some(c) = &connection {
        c.proven.store(true, Ordering::SeqCst);
    }
    let deadline = Instant::now() + hook.body_deadline;
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > MAX_BODY) {
        return hook.refuse(version, Refusal::TooLarge);
    }
    let limit = declared.unwrap_or(MAX_BODY);
    match hook.take_in(request.into_body(), limit, deadline).await {
        // Everything the request holds goes with its evaluation, which
        // runs to its end even if the caller goes: a caller that resets
        // its stream after sending the body frees nothing the evaluation
        // still uses.
        Ok((to, body, holds)) => {
            evaluate(
                hook.state,
                hook.evaluations,
                to,
                body,
                (holds, connection.map(|c| c.in_flight)),
            )
            .await
        }
        Err(why) => hook.refuse(version, why),
    }
}

/// Evaluates `body` on a task of its own, in a slot charged to `to`, which
/// keeps `holds` (the request's budget and place) until the evaluation is
/// over, whether or not the caller waits for its answer.
async fn evaluate(
    state: Arc<State>,
    evaluations: Arc<Evaluations>,
    to: ChargedTo,
    body: Bytes,
    holds: impl Send + 'static,
) -> Response {
    let task = tokio::spawn(async move {
        let _holds = holds;
        let Some(slot) = evaluations.take(to).await else {
            return (StatusCode::SERVICE_UNAVAILABLE, "config-snapshot: shutting down").into_response();
        };
        let evaluating = state.clone();
        let result = tokio::task::spawn_blocking(move || admission::review(&evaluating, &body)).await;
        drop(slot);
        match result {
            Ok(Ok(answer)) => axum::Json(answer.review).into_response(),
            Ok(Err(admission::Failure::BadRequest(m))) => (StatusCode::BAD_REQUEST, m).into_response(),
            Ok(Err(admission::Failure::Policy(m))) => (StatusCode::INTERNAL_SERVER_ERROR, m).into_response(),
            Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("config-snapshot: {e}")).into_response(),
        }
    });
    task.await
        .unwrap_or_else(|e| (StatusCode::INTERNAL_SERVER_ERROR, format!("config-snapshot: {e}")).into_response())
}
