//! The API as serve's kube-rs client speaks it: paths, verbs, patches,
//! lists and watches, and the injected behaviour (forbidden verbs,
//! latency) on the way.

use config_snapshot_policy::model::object::ObjectExt;
use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use config_snapshot::cluster::{ApiError, Cluster, Preconditions};
use config_snapshot::replay::simulator::HOST_USER;
use serde_json::{json, Value};

use super::{lock, type_of, Inner};

fn status(code: u16, reason: &str, message: String) -> Response {
    let body = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                      "message": message, "reason": reason, "code": code});
    (
        StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        axum::Json(body),
    )
        .into_response()
}

fn from_error(e: ApiError) -> Response {
    let (code, body) = e.status();
    (
        StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        axum::Json(body),
    )
        .into_response()
}

struct Path {
    api_version: &'static str,
    kind: &'static str,
    plural: String,
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
    let (served_version, kind) = type_of(plural).filter(|(v, _)| *v == api_version)?;
    Some(Path {
        api_version: served_version,
        kind,
        plural: plural.to_string(),
        namespace,
        name,
    })
}

#[expect(clippy::too_many_lines, reason = "a table: the stand-in API server's routes")]
pub(super) async fn handle(State(inner): State<Arc<Inner>>, request: Request) -> Response {
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
    let watching = query.get("watch").is_some_and(|w| w == "true" || w == "1");
    lock(&inner.conduct).log.push(format!(
        "{method}{} {}",
        if watching { " (watch)" } else { "" },
        uri.path()
    ));
    if !watching && lock(&inner.conduct).unauthenticated {
        return status(401, "Unauthorized", "Unauthorized".into());
    }
    // A Namespace: every one exists, as in the simulator (the host reads
    // one to anchor a shared snapshot).
    if let (&Method::GET, ["api", "v1", "namespaces", ns]) = (
        &method,
        uri.path().trim_matches('/').split('/').collect::<Vec<_>>().as_slice(),
    ) {
        let uid = inner.shared.namespace_uid(ns).ok().flatten().unwrap_or_default();
        return axum::Json(json!({"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": ns, "uid": uid, "resourceVersion": "1"}}))
        .into_response();
    }
    let Some(path) = parse_path(uri.path()) else {
        return status(
            404,
            "NotFound",
            format!("the server could not find the requested resource {}", uri.path()),
        );
    };
    if let Some(refusal) = forbidden(&inner, &method, &path) {
        return refusal;
    }
    let one_get = method == Method::GET && path.name.is_some();
    let config_map_create = method == Method::POST && uri.path().ends_with("/configmaps");
    let latency = {
        let mut conduct = lock(&inner.conduct);
        if one_get {
            conduct.gets_in_flight += 1;
            conduct.peak_gets_in_flight = conduct.peak_gets_in_flight.max(conduct.gets_in_flight);
        }
        if config_map_create {
            conduct.creates_in_flight += 1;
            conduct.peak_creates_in_flight = conduct.peak_creates_in_flight.max(conduct.creates_in_flight);
        }
        conduct.latency
    };
    if !watching && !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
    if one_get {
        lock(&inner.conduct).gets_in_flight -= 1;
    }
    if config_map_create {
        lock(&inner.conduct).creates_in_flight -= 1;
    }
    let body: Value = if body.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&body).unwrap_or(Value::Null)
    };
    match (method, path.name.clone()) {
        (Method::GET, None) if watching => {
            let since = query.get("resourceVersion").and_then(|r| r.parse().ok()).unwrap_or(0);
            watch(inner, path, since)
        }
        (Method::GET, None) => list(&inner, &path),
        (Method::POST, None) => {
            let mut object = body;
            object["metadata"]["namespace"] = json!(path.namespace.clone().unwrap_or_default());
            object["apiVersion"] = json!(path.api_version);
            object["kind"] = json!(path.kind);
            blocking(inner, move |inner| {
                inner.create(object).map(|o| (StatusCode::CREATED, o))
            })
            .await
        }
        (method, Some(name)) => {
            let ns = path.namespace.clone().unwrap_or_default();
            let current = match inner.shared.get(path.kind, &ns, &name) {
                Ok(Some(o)) => o,
                Ok(None) => return status(404, "NotFound", format!("{} {name:?} not found", path.plural)),
                Err(e) => return from_error(e),
            };
            match method {
                Method::GET => axum::Json(current).into_response(),
                Method::DELETE => {
                    let pre = Preconditions {
                        uid: body["preconditions"]["uid"]
                            .as_str()
                            .or(current.uid())
                            .unwrap_or_default()
                            .to_string(),
                        resource_version: body["preconditions"]["resourceVersion"].as_str().map(str::to_string),
                    };
                    let uid = current["metadata"]["uid"].clone();
                    blocking(inner, move |inner| {
                        inner.delete(&current, &pre)?;
                        Ok((
                            StatusCode::OK,
                            json!({"kind": "Status", "apiVersion": "v1", "status": "Success",
                                   "details": {"name": name, "uid": uid}}),
                        ))
                    })
                    .await
                }
                Method::PATCH => {
                    let updated = match patched(&current, &content_type, &body) {
                        Ok(u) => u,
                        Err(e) => return from_error(e),
                    };
                    blocking(inner, move |inner| {
                        inner.update(&current, updated).map(|o| (StatusCode::OK, o))
                    })
                    .await
                }
                Method::PUT => {
                    blocking(inner, move |inner| {
                        inner.update(&current, body).map(|o| (StatusCode::OK, o))
                    })
                    .await
                }
                _ => status(405, "MethodNotAllowed", "method not allowed".into()),
            }
        }
        _ => status(405, "MethodNotAllowed", "method not allowed".into()),
    }
}

/// A write, off the async workers: the simulator's write path blocks on
/// serve's webhook, which calls back into this server.
async fn blocking(
    inner: Arc<Inner>,
    write: impl FnOnce(&Inner) -> Result<(StatusCode, Value), ApiError> + Send + 'static,
) -> Response {
    match tokio::task::spawn_blocking(move || write(&inner)).await {
        Ok(Ok((code, object))) => (code, axum::Json(object)).into_response(),
        Ok(Err(e)) => from_error(e),
        Err(e) => status(500, "InternalError", e.to_string()),
    }
}

fn forbidden(inner: &Inner, method: &Method, path: &Path) -> Option<Response> {
    let conduct = lock(&inner.conduct);
    if !conduct.forbidden.iter().any(|(m, p)| m == method && *p == path.plural) {
        return None;
    }
    let verb = match *method {
        Method::POST => "create",
        Method::DELETE => "delete",
        Method::PATCH => "patch",
        _ => "get",
    };
    Some(status(
        403,
        "Forbidden",
        format!(
            "{} is forbidden: User \"{HOST_USER}\" cannot {verb} resource \"{}\" in API group \"{}\" in the namespace \"{}\"",
            path.plural,
            path.plural,
            path.api_version.split_once('/').map_or("", |(group, _)| group),
            path.namespace.clone().unwrap_or_default()
        ),
    ))
}

/// `current` with a JSON Patch, a merge patch or a strategic merge patch
/// applied, as sent.
fn patched(current: &Value, content_type: &str, body: &Value) -> Result<Value, ApiError> {
    let mut out = current.clone();
    if content_type.starts_with("application/json-patch+json") {
        let patch: json_patch::Patch =
            serde_json::from_value(body.clone()).map_err(|e| ApiError::Invalid(format!("invalid JSON Patch: {e}")))?;
        json_patch::patch(&mut out, &patch)
            .map_err(|e| ApiError::Invalid(format!("the patch could not be applied: {e}")))?;
    } else if content_type.starts_with("application/merge-patch+json") {
        json_patch::merge(&mut out, body);
    } else if content_type.starts_with("application/strategic-merge-patch+json") {
        strategic_merge(&mut out, body);
    } else {
        return Err(ApiError::Invalid(format!("unsupported patch type {content_type}")));
    }
    Ok(out)
}

/// A strategic merge patch as far as serve sends one: a merge patch, except
/// that a list whose items are objects with a `name` merges item by item,
/// by name, rather than being replaced.
fn strategic_merge(target: &mut Value, patch: &Value) {
    let named = |items: &Vec<Value>| items.iter().all(|i| i.get("name").is_some_and(Value::is_string));
    match (target, patch) {
        (Value::Object(target), Value::Object(patch)) => {
            for (key, value) in patch {
                if value.is_null() {
                    target.remove(key);
                    continue;
                }
                match target.get_mut(key) {
                    Some(existing) => strategic_merge(existing, value),
                    None => {
                        target.insert(key.clone(), value.clone());
                    }
                }
            }
        }
        (Value::Array(target), Value::Array(patch)) if named(target) && named(patch) => {
            for item in patch {
                match target.iter_mut().find(|t| t["name"] == item["name"]) {
                    Some(existing) => strategic_merge(existing, item),
                    None => target.push(item.clone()),
                }
            }
        }
        (target, patch) => *target = patch.clone(),
    }
}

fn list(inner: &Inner, path: &Path) -> Response {
    let store = inner.shared.store();
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

/// Streams the store's changes of one kind after `since`, from its log.
fn watch(inner: Arc<Inner>, path: Path, since: u64) -> Response {
    let state = (inner, path, since, Vec::<Bytes>::new());
    let stream = futures::stream::unfold(state, |(inner, path, mut last, mut ready)| async move {
        loop {
            if let Some(line) = ready.pop() {
                return Some((Ok::<_, Infallible>(line), (inner, path, last, ready)));
            }
            let changes = inner.shared.store().changes_since(last);
            for change in changes.into_iter().rev() {
                last = last.max(change.resource_version);
                let o = &change.object;
                let in_scope = path
                    .namespace
                    .as_ref()
                    .is_none_or(|ns| o["metadata"]["namespace"] == ns.as_str());
                if o["kind"] == path.kind && in_scope {
                    let mut line = serde_json::to_vec(&json!({"type": change.kind, "object": o})).unwrap_or_default();
                    line.push(b'\n');
                    ready.push(Bytes::from(line));
                }
            }
            if ready.is_empty() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    });
    Response::builder()
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from_stream(stream))
        .unwrap_or_else(|_| status(500, "InternalError", "watch".into()))
}
