//! The two listeners: the webhook over HTTPS, and health and metrics over
//! plain HTTP for the kubelet and Prometheus (which should not need the
//! webhook's CA).

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use anyhow::{Context as _, Result};
use axum::body::Bytes;
use axum::extract::{Request, State as Extract};
use axum::http::{header, Method, StatusCode, Version};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use tokio::sync::Semaphore;
use tokio::time::{timeout_at, Instant};

use super::admission;
use super::door::Door;
use super::listener::{self, server_config, Table, Tls};
use super::metrics::RefusedLabels;
use super::options::Options;
use super::refusal::{refusal, Connection, Peer, Refusal};
use super::state::State;

/// An AdmissionReview carries the object and the old object; the API
/// server caps each at about 3 MiB.
pub(crate) const MAX_BODY: usize = 8 << 20;

/// The budget of request bodies is counted in KiB.
const BUDGET_UNIT: usize = 1024;

/// A body larger than this is large: large ones take their part of the
/// budget from a pool of their own, half of it.
const LARGE: usize = 1 << 20;

/// What the webhook's one route needs.
#[derive(Clone)]
pub(crate) struct Webhook {
    pub state: Arc<State>,
    pub door: Arc<Door>,
    /// The budget of request bodies being read or evaluated at once, in
    /// [`BUDGET_UNIT`]s, in two pools: bodies up to [`LARGE`] and larger
    /// ones, half each. A body takes its declared size (or [`MAX_BODY`] when
    /// it declares none) from its pool before a byte of it is read. Apart,
    /// a large body waiting never holds up the API server's usual reviews
    /// (a few KiB to a few hundred) queued behind it.
    small: Arc<Semaphore>,
    large: Arc<Semaphore>,
    /// Of the budget, what each peer holds: one peer may hold half of it at
    /// most, so that one address cannot take it all.
    shares: Arc<Mutex<HashMap<IpAddr, u32>>>,
    share: u32,
    /// From a request's headers to its whole body: one deadline, not one
    /// per frame, so that a body trickled a byte at a time is cut off.
    pub body_deadline: Duration,
}

/// A peer's part of the budget, given back when the request ends.
struct Share {
    shares: Arc<Mutex<HashMap<IpAddr, u32>>>,
    peer: IpAddr,
    units: u32,
}

impl Drop for Share {
    fn drop(&mut self) {
        let mut shares = self.shares.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(held) = shares.get_mut(&self.peer) {
            *held = held.saturating_sub(self.units);
            if *held == 0 {
                shares.remove(&self.peer);
            }
        }
    }
}

impl Webhook {
    /// `budget_bytes` of bodies at once, never less than two bodies at
    /// most (so that each pool, and one peer's half, holds one).
    pub fn new(state: Arc<State>, door: Arc<Door>, budget_bytes: usize, body_deadline: Duration) -> Webhook {
        let units = u32::try_from(budget_bytes.max(2 * MAX_BODY) / BUDGET_UNIT).unwrap_or(u32::MAX >> 4);
        Webhook {
            state,
            door,
            small: Arc::new(Semaphore::new((units / 2) as usize)),
            large: Arc::new(Semaphore::new((units / 2) as usize)),
            shares: Arc::default(),
            share: units / 2,
            body_deadline,
        }
    }

    /// `units` of the peer's share, if it has them left.
    fn share(&self, peer: IpAddr, units: u32) -> Option<Share> {
        let mut shares = self.shares.lock().unwrap_or_else(|e| e.into_inner());
        let held = shares.entry(peer).or_default();
        if held.saturating_add(units) > self.share {
            return None;
        }
        *held += units;
        Some(Share {
            shares: self.shares.clone(),
            peer,
            units,
        })
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
}

/// The webhook: one handler for every method and path, so that what is
/// not the door's path is refused the same way, before its body is read.
pub(crate) fn webhook_router(webhook: Webhook) -> Router {
    Router::new().fallback(intake).with_state(webhook)
}

/// Lets a request in, or not: the door's path first, then its body's size
/// against the budget, then the body itself by the deadline. Only then is
/// it evaluated. A request refused at the door also closes its connection
/// (a GOAWAY on HTTP/2): whoever does not know the path keeps no place.
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
    let units = u32::try_from(limit.div_ceil(BUDGET_UNIT).max(1)).unwrap_or(u32::MAX);
    let peer = request
        .extensions()
        .get::<Peer>()
        .map_or(IpAddr::from([0, 0, 0, 0]), |p| p.0);
    let Some(share) = hook.share(peer, units) else {
        return hook.refuse(version, Refusal::Budget);
    };
    let pool = if limit > LARGE { &hook.large } else { &hook.small };
    let Ok(Ok(held)) = timeout_at(deadline, pool.clone().acquire_many_owned(units)).await else {
        return hook.refuse(version, Refusal::Budget);
    };
    let body = match timeout_at(deadline, axum::body::to_bytes(request.into_body(), limit)).await {
        Ok(Ok(body)) => body,
        Ok(Err(_)) => return hook.refuse(version, Refusal::TooLarge),
        Err(_) => return hook.refuse(version, Refusal::Deadline),
    };
    // Everything the request holds goes with its evaluation, which runs to
    // its end even if the caller goes: a caller that resets its stream
    // after sending the body frees nothing the evaluation still uses.
    let holds = (held, share, connection.map(|c| c.in_flight));
    evaluate(hook.state, body, holds).await
}

pub(crate) fn ops_router(state: Arc<State>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(state)
}

/// Evaluates `body` on a task of its own, which keeps `holds` (the
/// request's budget and place) until the evaluation is over, whether or not
/// the caller waits for its answer.
async fn evaluate(state: Arc<State>, body: Bytes, holds: impl Send + 'static) -> Response {
    let task = tokio::spawn(async move {
        let _holds = holds;
        let Ok(permit) = state.evaluations.acquire().await else {
            return (StatusCode::SERVICE_UNAVAILABLE, "config-snapshot: shutting down").into_response();
        };
        let evaluating = state.clone();
        let result = tokio::task::spawn_blocking(move || admission::review(&evaluating, &body)).await;
        drop(permit);
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

async fn readyz(Extract(state): Extract<Arc<State>>) -> Response {
    // Asked apart from this answer: the probe's own timeout (1 s by
    // default) is shorter than an API call's, and a dropped probe must not
    // cancel the read that clears the flag. A later probe sees its answer.
    if state.cluster.credentials_refused() {
        let cluster = state.cluster.clone();
        tokio::spawn(async move { cluster.ask_about_credentials().await });
    }
    if state.ready() {
        "ready".into_response()
    } else if state.shutting_down.load(Ordering::SeqCst) {
        (StatusCode::SERVICE_UNAVAILABLE, "shutting down").into_response()
    } else if state.cluster.credentials_refused() {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "the API server refuses serve's credentials",
        )
            .into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "caches not synced yet").into_response()
    }
}

async fn metrics(Extract(state): Extract<Arc<State>>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.metrics.encode(),
    )
        .into_response()
}

pub async fn serve(state: Arc<State>, door: Arc<Door>, tls: Tls, options: &Options) -> Result<()> {
    if options.client_ca.is_some() {
        tracing::info!("the webhook answers only callers with a client certificate from --client-ca");
    }
    let limits = options.listener_limits()?;
    let body_deadline = options.body_read_timeout.max(Duration::from_secs(1));
    let budget = usize::try_from(options.body_bytes_in_flight.get()).unwrap_or(usize::MAX);
    let grace = options.shutdown_grace;
    let ops = tokio::net::TcpListener::bind(options.metrics_listen)
        .await
        .with_context(|| format!("binding {}", options.metrics_listen))?;
    let webhook = tokio::net::TcpListener::bind(options.listen)
        .await
        .with_context(|| format!("binding {}", options.listen))?;
    tracing::info!(webhook = %webhook.local_addr()?, ops = %ops.local_addr()?, "serving");
    // Health and metrics stay up until the webhook has drained, so the
    // kubelet sees "not ready" rather than a refused connection.
    let (stop_ops, ops_stopped) = tokio::sync::oneshot::channel::<()>();
    let ops_app = ops_router(state.clone());
    let ops_server = tokio::spawn(async move {
        axum::serve(ops, ops_app)
            .with_graceful_shutdown(async move {
                let _ = ops_stopped.await;
            })
            .await
    });
    let (stop, stopping) = tokio::sync::watch::channel(false);
    let signal_state = state.clone();
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!(grace = ?grace, "shutting down: not ready, finishing in-flight requests");
        signal_state.shutting_down.store(true, Ordering::SeqCst);
        let _ = stop.send(true);
    });
    let table = Table::new(limits, state.metrics.connections.clone());
    listener::serve(
        webhook,
        tls,
        webhook_router(Webhook::new(state, door, budget, body_deadline)),
        table,
        stopping,
        grace,
    )
    .await
    .context("webhook server")?;
    let _ = stop_ops.send(());
    let _ = ops_server.await;
    tracing::info!("stopped");
    Ok(())
}

/// cert-manager (or you) rotates the certificate in place: pick it up
/// without a restart.
pub(crate) async fn reload_certificates(tls: Tls, cert: PathBuf, key: PathBuf, client_ca: Option<PathBuf>) {
    let modified = |p: &std::path::Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let mut seen: Option<SystemTime> = modified(&cert);
    loop {
        tokio::time::sleep(Duration::from_secs(30)).await;
        let now = modified(&cert);
        if now != seen {
            match server_config(&cert, &key, client_ca.as_deref()) {
                Ok(config) => {
                    tls.reload(config);
                    tracing::info!("reloaded the TLS certificate")
                }
                Err(e) => tracing::warn!("keeping the old TLS certificate: {e:#}"),
            }
            seen = now;
        }
    }
}

async fn wait_for_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(s) => s,
            Err(_) => return ctrl_c.await.unwrap_or(()),
        };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}
