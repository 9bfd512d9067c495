//! The two listeners: the webhook over HTTPS, and health and metrics over
//! plain HTTP for the kubelet and Prometheus (which should not need the
//! webhook's CA).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::{Context as _, Result};
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State as Extract};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;

use super::listener::{self, server_config, Table, Tls};
use super::{admission, Options, State};

/// An AdmissionReview carries the object and the old object; the API
/// server caps each at about 3 MiB.
const MAX_BODY: usize = 8 << 20;

/// The webhook's routes. `body_timeout`: how long a request's body may
/// take to arrive (a client that trickles it holds a connection).
pub(crate) fn webhook_router(state: Arc<State>, body_timeout: Duration) -> Router {
    Router::new()
        .route("/mutate", post(mutate))
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .layer(tower_http::timeout::RequestBodyTimeoutLayer::new(body_timeout))
        .with_state(state)
}

pub(crate) fn ops_router(state: Arc<State>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(state)
}

async fn mutate(Extract(state): Extract<Arc<State>>, body: Bytes) -> Response {
    let Ok(permit) = state.evaluations.acquire().await else {
        return (StatusCode::SERVICE_UNAVAILABLE, "config-snapshot: shutting down").into_response();
    };
    let evaluating = state.clone();
    let task = tokio::task::spawn_blocking(move || admission::review(&evaluating, &body));
    let result = task.await;
    drop(permit);
    match result {
        Ok(Ok(answer)) => axum::Json(answer.review).into_response(),
        Ok(Err(admission::Failure::BadRequest(m))) => (StatusCode::BAD_REQUEST, m).into_response(),
        Ok(Err(admission::Failure::Policy(m))) => (StatusCode::INTERNAL_SERVER_ERROR, m).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("config-snapshot: {e}")).into_response(),
    }
}

async fn readyz(Extract(state): Extract<Arc<State>>) -> Response {
    if state.ready() {
        "ready".into_response()
    } else if state.shutting_down.load(Ordering::SeqCst) {
        (StatusCode::SERVICE_UNAVAILABLE, "shutting down").into_response()
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

pub async fn serve(state: Arc<State>, options: &Options) -> Result<()> {
    let tls = Tls::new(tls_config(options)?);
    if options.client_ca.is_some() {
        tracing::info!("the webhook answers only callers with a client certificate from --client-ca");
    }
    tokio::spawn(reload_certificates(tls.clone(), options.clone()));
    let limits = options.listener_limits()?;
    let body_timeout = options.body_read_timeout.max(Duration::from_secs(1));
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
        webhook_router(state, body_timeout),
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

fn tls_config(options: &Options) -> Result<Arc<rustls::ServerConfig>> {
    server_config(&options.tls_cert, &options.tls_key, options.client_ca.as_deref())
}

/// cert-manager rotates the certificate in place: pick it up without a
/// restart.
async fn reload_certificates(tls: Tls, options: Options) {
    let modified = |p: &std::path::Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let mut seen: Option<SystemTime> = modified(&options.tls_cert);
    loop {
        tokio::time::sleep(Duration::from_secs(30)).await;
        let now = modified(&options.tls_cert);
        if now != seen {
            match tls_config(&options) {
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
