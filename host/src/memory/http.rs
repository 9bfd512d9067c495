//! The in-memory cluster served as a Kubernetes API server on loopback, so
//! that `serve` (its kube-rs caches, its admission path, its effect queue
//! and its resync) runs against the very cluster, controllers and write path
//! `replay` uses. Tests feed one history to both and compare what is left.
//!
//! It speaks what serve uses: cluster-wide and namespaced list and watch,
//! get, create, JSON and merge patch with the resourceVersion precondition,
//! and delete with uid and resourceVersion preconditions. Writes of
//! snapshots (serve's own, which its webhook's objectSelector skips) go
//! straight to the store; any other write goes through the simulator's
//! write path: admission (serve's webhook), persistence, controllers.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use config_snapshot_policy::keys;
use serde_json::{json, Value};

use super::{Shared, Simulator, HOST_USER};
use crate::backend::{Backend, BackendError};
use crate::lifecycle::effects::apply_ops;
use crate::serve::cache::KINDS;

/// The API server in front of a simulator.
pub struct ApiServer {
    pub addr: SocketAddr,
}

#[derive(Clone)]
struct Served {
    shared: Arc<Shared>,
    sim: Arc<Mutex<Simulator>>,
}

impl ApiServer {
    /// Serves `sim` on 127.0.0.1 (a free port) until the runtime stops.
    pub async fn start(sim: Arc<Mutex<Simulator>>) -> std::io::Result<ApiServer> {
        let shared = sim.lock().unwrap_or_else(|e| e.into_inner()).shared.clone();
        shared.store().keep_log();
        let app = Router::new().fallback(handle).with_state(Served { shared, sim });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        tokio::spawn(async move { axum::serve(listener, app).await });
        Ok(ApiServer { addr })
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

fn status(code: u16, reason: &str, message: String) -> Response {
    let body = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                      "message": message, "reason": reason, "code": code});
    (
        StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        axum::Json(body),
    )
        .into_response()
}

fn from_error(e: BackendError) -> Response {
    let (code, reason) = match &e {
        BackendError::NotFound(_) => (404, "NotFound"),
        BackendError::AlreadyExists(_) => (409, "AlreadyExists"),
        BackendError::Conflict(_) => (409, "Conflict"),
        BackendError::Forbidden(_) => (403, "Forbidden"),
        BackendError::Timeout(_) => (504, "Timeout"),
        BackendError::Refused(_) => (422, "Invalid"),
    };
    status(code, reason, e.message().to_string())
}

struct Path {
    api_version: String,
    kind: &'static str,
    namespace: Option<String>,
    name: Option<String>,
}

fn parse_path(path: &str) -> Option<Path> {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (api_version, rest) = match parts.as_slice() {
        ["api", "v1", rest @ ..] => ("v1".to_string(), rest),
        ["apis", group, version, rest @ ..] => (format!("{group}/{version}"), rest),
        _ => return None,
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, rest @ ..] => (Some(ns.to_string()), rest),
        rest => (None, rest),
    };
    let (plural, name) = match rest {
        [plural] => (*plural, None),
        [plural, name] => (*plural, Some(name.to_string())),
        _ => return None,
    };
    let found = KINDS.iter().find(|k| k.plural == plural)?;
    let (g, v, kind) = (found.group(), found.version(), &found.kind);
    let expected = if g.is_empty() {
        v.to_string()
    } else {
        format!("{g}/{v}")
    };
    (expected == api_version).then_some(Path {
        api_version,
        kind,
        namespace,
        name,
    })
}

async fn handle(State(served): State<Served>, request: Request) -> Response {
    let method = request.method().clone();
    let uri = request.uri().clone();
    let content_type = request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let body = axum::body::to_bytes(request.into_body(), 16 << 20)
        .await
        .unwrap_or_default();
    let query: BTreeMap<String, String> = uri
        .query()
        .unwrap_or("")
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let Some(path) = parse_path(uri.path()) else {
        return status(
            404,
            "NotFound",
            format!("the server could not find the requested resource {}", uri.path()),
        );
    };
    let body: Value = if body.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&body).unwrap_or(Value::Null)
    };
    let watching = query.get("watch").is_some_and(|w| w == "true" || w == "1");
    match (method, path.name.clone()) {
        (Method::GET, None) if watching => {
            let since = query.get("resourceVersion").and_then(|r| r.parse().ok()).unwrap_or(0);
            watch(served.shared, path, since)
        }
        (Method::GET, None) => list(&served.shared, &path),
        (Method::GET, Some(name)) => {
            let ns = path.namespace.unwrap_or_default();
            match served.shared.get(path.kind, &ns, &name) {
                Ok(Some(o)) => axum::Json(o).into_response(),
                Ok(None) => status(404, "NotFound", format!("{} {name:?} not found", plural_of(path.kind))),
                Err(e) => from_error(e),
            }
        }
        (Method::POST, None) => create(served, path, body).await,
        (Method::PATCH, Some(name)) => patch(served, path, name, &content_type, body).await,
        (Method::DELETE, Some(name)) => delete(served, path, name, body).await,
        _ => status(405, "MethodNotAllowed", "method not allowed".into()),
    }
}

fn plural_of(kind: &str) -> &'static str {
    config_snapshot_policy::kinds::find(kind).map_or("", |k| k.plural)
}

fn list(shared: &Shared, path: &Path) -> Response {
    let store = shared.store();
    let items: Vec<&Value> = store
        .all()
        .filter(|o| o["kind"] == path.kind)
        .filter(|o| {
            path.namespace
                .as_ref()
                .is_none_or(|ns| o["metadata"]["namespace"] == ns.as_str())
        })
        .collect();
    axum::Json(json!({
        "apiVersion": path.api_version, "kind": format!("{}List", path.kind),
        "metadata": {"resourceVersion": store.resource_version().to_string()},
        "items": items,
    }))
    .into_response()
}

/// Streams the store's changes of one kind after `since`, polling its log.
fn watch(shared: Arc<Shared>, path: Path, since: u64) -> Response {
    let state = (shared, path, since, Vec::<Bytes>::new());
    let stream = futures::stream::unfold(state, |(shared, path, mut last, mut ready)| async move {
        loop {
            if let Some(line) = ready.pop() {
                return Some((Ok::<_, Infallible>(line), (shared, path, last, ready)));
            }
            let changes = shared.store().changes_since(last);
            for change in changes.into_iter().rev() {
                last = last.max(change.resource_version);
                let o = &change.object;
                let ns_ok = path
                    .namespace
                    .as_ref()
                    .is_none_or(|ns| o["metadata"]["namespace"] == ns.as_str());
                if o["kind"] == path.kind && ns_ok {
                    let mut line = serde_json::to_vec(&json!({"type": change.kind, "object": o})).unwrap_or_default();
                    line.push(b'\n');
                    ready.push(Bytes::from(line));
                }
            }
            if ready.is_empty() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    });
    Response::builder()
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from_stream(stream))
        .unwrap_or_else(|_| status(500, "InternalError", "watch".into()))
}

/// A write the simulator makes through its API server write path, off the
/// async workers: admission blocks on serve's webhook, which calls back.
async fn through_simulator(
    served: &Served,
    write: impl FnOnce(&mut Simulator) -> anyhow::Result<Response> + Send + 'static,
) -> Response {
    let sim = served.sim.clone();
    tokio::task::spawn_blocking(move || {
        let mut sim = sim.lock().unwrap_or_else(|e| e.into_inner());
        write(&mut sim).unwrap_or_else(|e| status(500, "InternalError", format!("{e:#}")))
    })
    .await
    .unwrap_or_else(|e| status(500, "InternalError", e.to_string()))
}

async fn create(served: Served, path: Path, mut object: Value) -> Response {
    let ns = path.namespace.unwrap_or_default();
    object["metadata"]["namespace"] = json!(ns);
    object["apiVersion"] = json!(path.api_version);
    object["kind"] = json!(path.kind);
    let name = object["metadata"]["name"].as_str().unwrap_or_default().to_string();
    if keys::is_snapshot(&object) {
        if let Some(error) = served.shared.fault("create_snapshot") {
            return status(403, "Forbidden", error);
        }
        return match served.shared.create(object) {
            Ok(()) => (
                StatusCode::CREATED,
                axum::Json(served.shared.get(path.kind, &ns, &name).ok().flatten()),
            )
                .into_response(),
            Err(e) => from_error(e),
        };
    }
    let kind = path.kind;
    through_simulator(&served, move |sim| {
        if sim.get(kind, &ns, &name).is_some() {
            return Ok(status(
                409,
                "AlreadyExists",
                format!("{} {name:?} already exists", plural_of(kind)),
            ));
        }
        let admission = sim.write(object, None, false, HOST_USER)?;
        Ok(answer(sim, admission, kind, &ns, &name))
    })
    .await
}

fn answer(sim: &Simulator, admission: super::Admission, kind: &str, ns: &str, name: &str) -> Response {
    if !admission.allowed {
        return status(
            400,
            "BadRequest",
            format!(
                "admission webhook denied the request: {}",
                admission.message.unwrap_or_default()
            ),
        );
    }
    axum::Json(sim.get(kind, ns, name)).into_response()
}

fn patched(current: &Value, content_type: &str, body: &Value) -> Result<Value, BackendError> {
    let mut out = current.clone();
    if content_type.starts_with("application/json-patch+json") {
        let ops = body.as_array().cloned().unwrap_or_default();
        apply_ops(&mut out, &ops).map_err(|e| BackendError::Refused(format!("the patch could not be applied: {e}")))?;
    } else if content_type.starts_with("application/merge-patch+json") {
        json_patch::merge(&mut out, body);
    } else {
        return Err(BackendError::Refused(format!("unsupported patch type {content_type}")));
    }
    // Optimistic concurrency: a patch that pins another version conflicts.
    if out["metadata"]["resourceVersion"] != current["metadata"]["resourceVersion"] {
        return Err(BackendError::Conflict(
            "Operation cannot be fulfilled: the object has been modified; please apply your changes to the latest version and try again".into(),
        ));
    }
    Ok(out)
}

async fn patch(served: Served, path: Path, name: String, content_type: &str, body: Value) -> Response {
    let ns = path.namespace.unwrap_or_default();
    let Some(current) = served.shared.get(path.kind, &ns, &name).ok().flatten() else {
        return status(404, "NotFound", format!("{} {name:?} not found", plural_of(path.kind)));
    };
    if keys::is_snapshot(&current) {
        let out = match patched(&current, content_type, &body) {
            Ok(out) => out,
            Err(e) => return from_error(e),
        };
        if current["immutable"] == true
            && (current.get("data") != out.get("data") || current.get("binaryData") != out.get("binaryData"))
        {
            return status(422, "Invalid", "field is immutable when `immutable` is set".into());
        }
        let stored = served.shared.store().persist(out);
        return axum::Json(stored).into_response();
    }
    let kind = path.kind;
    let content_type = content_type.to_string();
    through_simulator(&served, move |sim| {
        let Some(current) = sim.get(kind, &ns, &name) else {
            return Ok(status(
                404,
                "NotFound",
                format!("{} {name:?} not found", plural_of(kind)),
            ));
        };
        let out = match patched(&current, &content_type, &body) {
            Ok(out) => out,
            Err(e) => return Ok(from_error(e)),
        };
        let admission = sim.write(out, Some(current), false, HOST_USER)?;
        Ok(answer(sim, admission, kind, &ns, &name))
    })
    .await
}

async fn delete(served: Served, path: Path, name: String, body: Value) -> Response {
    let ns = path.namespace.unwrap_or_default();
    let Some(current) = served.shared.get(path.kind, &ns, &name).ok().flatten() else {
        return status(404, "NotFound", format!("{} {name:?} not found", plural_of(path.kind)));
    };
    let uid = body["preconditions"]["uid"].as_str().map(str::to_string);
    let rv = body["preconditions"]["resourceVersion"].as_str().map(str::to_string);
    if keys::is_snapshot(&current) {
        if let Some(error) = served.shared.fault("delete_snapshot") {
            return status(403, "Forbidden", error);
        }
        let uid = uid.unwrap_or_else(|| current["metadata"]["uid"].as_str().unwrap_or_default().to_string());
        return match served.shared.delete(path.kind, &ns, &name, &uid, rv.as_deref()) {
            Ok(()) => axum::Json(json!({"kind": "Status", "apiVersion": "v1", "status": "Success"})).into_response(),
            Err(e) => from_error(e),
        };
    }
    let kind = path.kind;
    through_simulator(&served, move |sim| {
        sim.delete(kind, &ns, &name)?;
        Ok(axum::Json(json!({"kind": "Status", "apiVersion": "v1", "status": "Success"})).into_response())
    })
    .await
}
