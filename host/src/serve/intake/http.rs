//! The two listeners: the webhook over HTTPS, and health and metrics over
//! plain HTTP for the kubelet and Prometheus (which should not need the
//! webhook's CA).

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::{Context as _, Result};
use axum::extract::State as Extract;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use super::door::Door;
use super::entry::{webhook_router, Webhook};
use super::listener::{self, server_config, Table, Tls};
use crate::serve::answer::options::Options;
use crate::serve::answer::state::State;

pub(crate) fn ops_router(state: Arc<State>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(state)
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
    let limits = super::listener::Limits::of(options)?;
    let body_deadline = options.body_read_timeout.max(Duration::from_secs(1));
    let budget = usize::try_from(options.body_bytes_in_flight.get()).unwrap_or(usize::MAX);
    let requests_per_namespace = options.max_requests_per_namespace;
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
        webhook_router(Webhook::new(state, door, budget, requests_per_namespace, body_deadline)),
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
