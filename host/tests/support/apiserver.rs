//! An in-process stand-in for the Kubernetes API server, speaking the few
//! endpoints `serve` uses: cluster-wide list and watch (for the caches),
//! get, create, delete with a uid precondition, and JSON/merge patch with the
//! resourceVersion precondition. Objects get uids, resourceVersions and
//! creation timestamps; immutable ConfigMaps and Secrets refuse data edits,
//! as the real one does. Tests write to it directly (`put`) the way a user or
//! a controller would, and read back what `serve` did.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use serde_json::{json, Value};
use tokio::sync::broadcast;

use config_snapshot_policy::kinds::KINDS;

type Key = (String, String, String); // plural, namespace, name

#[derive(Clone)]
struct WatchEvent {
    plural: String,
    rv: u64,
    line: Bytes,
}

#[derive(Default)]
struct Store {
    objects: BTreeMap<Key, Value>,
    rv: u64,
    history: Vec<WatchEvent>,
    log: Vec<String>,
    /// (method, plural) pairs answered 403, as RBAC without that verb would.
    forbidden: Vec<(Method, String)>,
    /// How many GETs of one object were in flight at once: at most, and now.
    gets_in_flight: usize,
    peak_gets_in_flight: usize,
    /// The clock creations are stamped with (`fix_clock`); 0 is the wall clock.
    clock: i64,
    /// How long every request but a watch takes (`latency`).
    latency: std::time::Duration,
}

pub struct ApiServer {
    pub addr: SocketAddr,
    inner: Arc<Inner>,
}

struct Inner {
    store: Mutex<Store>,
    events: broadcast::Sender<WatchEvent>,
}

fn plural_of(kind: &str) -> String {
    config_snapshot_policy::kinds::find(kind)
        .map(|k| k.plural.to_string())
        .or_else(|| {
            SERVE_KINDS
                .iter()
                .find(|(_, _, k)| *k == kind)
                .map(|(p, _, _)| p.to_string())
        })
        .unwrap_or_else(|| panic!("stand-in does not serve {kind}"))
}

/// Kinds serve uses beyond the policy's table: its Lease and its Events.
const SERVE_KINDS: [(&str, &str, &str); 2] = [
    ("leases", "coordination.k8s.io/v1", "Lease"),
    ("events", "events.k8s.io/v1", "Event"),
];

fn type_of(plural: &str) -> Option<(&'static str, &'static str)> {
    KINDS
        .iter()
        .find(|k| k.plural == plural)
        .map(|k| (k.api_version, k.kind))
        .or_else(|| {
            SERVE_KINDS
                .iter()
                .find(|(p, _, _)| *p == plural)
                .map(|(_, api_version, kind)| (*api_version, *kind))
        })
}

fn status(code: u16, reason: &str, message: String) -> Response {
    let body = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                      "message": message, "reason": reason, "code": code});
    (StatusCode::from_u16(code).unwrap(), axum::Json(body)).into_response()
}

impl ApiServer {
    pub async fn start() -> ApiServer {
        let (events, _) = broadcast::channel(4096);
        let inner = Arc::new(Inner {
            store: Mutex::new(Store::default()),
            events,
        });
        let app = Router::new().fallback(handle).with_state(inner.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        ApiServer { addr, inner }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A kubeconfig for this server, written to a fresh file.
    pub fn kubeconfig(&self) -> std::path::PathBuf {
        let path = std::env::temp_dir().join(format!(
            "config-snapshot-standin-{}-{}.kubeconfig",
            std::process::id(),
            self.addr.port()
        ));
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters: [{{name: standin, cluster: {{server: \"{}\"}}}}]\n\
             users: [{{name: test, user: {{}}}}]\n\
             contexts: [{{name: standin, context: {{cluster: standin, user: test}}}}]\ncurrent-context: standin\n",
            self.url()
        );
        std::fs::write(&path, text).unwrap();
        path
    }

    /// Creates or replaces an object, as a user's `kubectl apply` lands.
    pub fn put(&self, object: Value) -> Value {
        self.inner.write(object, "MODIFIED")
    }

    /// Replaces the whole store with `objects`, kept exactly as given
    /// (uids, resourceVersions): the state another cluster was in.
    /// Kinds the stand-in does not serve are skipped.
    pub fn reset(&self, objects: &[Value]) {
        let mut store = self.inner.store.lock().unwrap();
        store.objects.clear();
        let mut rv = 0;
        for object in objects {
            let Some(plural) = object["kind"]
                .as_str()
                .and_then(config_snapshot_policy::kinds::find)
                .map(|k| k.plural.to_string())
            else {
                continue;
            };
            let ns = object["metadata"]["namespace"]
                .as_str()
                .unwrap_or("default")
                .to_string();
            let name = object["metadata"]["name"].as_str().unwrap_or_default().to_string();
            rv = rv.max(
                object["metadata"]["resourceVersion"]
                    .as_str()
                    .and_then(|r| r.parse().ok())
                    .unwrap_or(0),
            );
            store.objects.insert((plural, ns, name), object.clone());
        }
        store.rv = store.rv.max(rv);
    }

    /// Every object, as (kind, namespace, name).
    pub fn keys(&self) -> Vec<(String, String, String)> {
        let store = self.inner.store.lock().unwrap();
        store
            .objects
            .keys()
            .map(|(plural, ns, name)| (type_of(plural).unwrap().1.to_string(), ns.clone(), name.clone()))
            .collect()
    }

    pub fn get(&self, kind: &str, ns: &str, name: &str) -> Option<Value> {
        let store = self.inner.store.lock().unwrap();
        store.objects.get(&(plural_of(kind), ns.into(), name.into())).cloned()
    }

    pub fn list(&self, kind: &str) -> Vec<Value> {
        let plural = plural_of(kind);
        let store = self.inner.store.lock().unwrap();
        store
            .objects
            .iter()
            .filter(|(k, _)| k.0 == plural)
            .map(|(_, v)| v.clone())
            .collect()
    }

    /// Every version `kind` `ns`/`name` has had, oldest first, as its watch
    /// events carried them: what a controller watching it saw, including
    /// writes by processes that have since died.
    pub fn versions(&self, kind: &str, ns: &str, name: &str) -> Vec<Value> {
        let plural = plural_of(kind);
        let store = self.inner.store.lock().unwrap();
        store
            .history
            .iter()
            .filter(|e| e.plural == plural)
            .filter_map(|e| serde_json::from_slice::<Value>(&e.line).ok())
            .filter(|e| e["type"] != "DELETED")
            .map(|e| e["object"].clone())
            .filter(|o| o["metadata"]["namespace"] == ns && o["metadata"]["name"] == name)
            .collect()
    }

    /// The requests `serve` made, as "METHOD path".
    /// Refuses `method` on `kind` from now on with 403 Forbidden: the
    /// ClusterRole without that verb.
    pub fn forbid(&self, method: Method, kind: &str) {
        self.inner
            .store
            .lock()
            .unwrap()
            .forbidden
            .push((method, plural_of(kind)));
    }

    /// Makes every request but a watch take `latency` before it is
    /// answered, as a network and a real API server's storage would: slow
    /// enough, overlapping reads show (`peak_gets_in_flight`). A nonzero
    /// sleep takes at least one timer tick (about 1 ms).
    pub fn latency(&self, latency: std::time::Duration) {
        self.inner.store.lock().unwrap().latency = latency;
    }

    /// Stamps creations with `unix` from now on, as a server whose clock
    /// reads that would.
    pub fn fix_clock(&self, unix: i64) {
        self.inner.store.lock().unwrap().clock = unix;
    }

    /// The most GETs of one object that were in flight at the same time.
    pub fn peak_gets_in_flight(&self) -> usize {
        self.inner.store.lock().unwrap().peak_gets_in_flight
    }

    pub fn log(&self) -> Vec<String> {
        self.inner.store.lock().unwrap().log.clone()
    }
}

impl Inner {
    fn write(&self, mut object: Value, event: &str) -> Value {
        let plural = plural_of(object["kind"].as_str().unwrap());
        let ns = object["metadata"]["namespace"]
            .as_str()
            .unwrap_or("default")
            .to_string();
        let name = object["metadata"]["name"].as_str().unwrap().to_string();
        let mut store = self.store.lock().unwrap();
        store.rv += 1;
        let rv = store.rv;
        let key = (plural.clone(), ns.clone(), name);
        let existing = store.objects.get(&key).cloned();
        let meta = object["metadata"].as_object_mut().unwrap();
        meta.insert("namespace".into(), json!(ns));
        meta.insert("resourceVersion".into(), json!(rv.to_string()));
        let uid = existing
            .as_ref()
            .map(|e| e["metadata"]["uid"].clone())
            .unwrap_or_else(|| json!(format!("uid-{rv}")));
        meta.insert("uid".into(), uid);
        meta.entry("creationTimestamp").or_insert(json!("2026-11-22T08:00:00Z"));
        // As the real registry does for objects with a spec: 1 at creation,
        // one more for each write that changes the spec; what a client
        // sends is ignored.
        if object.get("spec").is_some() {
            let generation = match &existing {
                Some(e) => {
                    let before = e["metadata"]["generation"].as_i64().unwrap_or(1);
                    before + i64::from(e["spec"] != object["spec"])
                }
                None => 1,
            };
            object["metadata"]["generation"] = json!(generation);
        }
        let kind = if existing.is_some() { event } else { "ADDED" };
        store.objects.insert(key, object.clone());
        self.emit(&mut store, &plural, rv, kind, &object);
        object
    }

    fn emit(&self, store: &mut Store, plural: &str, rv: u64, kind: &str, object: &Value) {
        let mut line = serde_json::to_vec(&json!({"type": kind, "object": object})).unwrap();
        line.push(b'\n');
        let event = WatchEvent {
            plural: plural.to_string(),
            rv,
            line: Bytes::from(line),
        };
        store.history.push(event.clone());
        let _ = self.events.send(event);
    }
}

struct Path {
    api_version: String,
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
    match rest {
        [plural] => Some(Path {
            api_version,
            plural: plural.to_string(),
            namespace,
            name: None,
        }),
        [plural, name] => Some(Path {
            api_version,
            plural: plural.to_string(),
            namespace,
            name: Some(name.to_string()),
        }),
        _ => None,
    }
}

async fn handle(State(inner): State<Arc<Inner>>, request: Request) -> Response {
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
    inner.store.lock().unwrap().log.push(format!(
        "{method}{} {}",
        if watching { " (watch)" } else { "" },
        uri.path()
    ));
    let Some(path) = parse_path(uri.path()) else {
        return status(
            404,
            "NotFound",
            format!("the server could not find the requested resource {}", uri.path()),
        );
    };
    let Some((api_version, kind)) = type_of(&path.plural).filter(|(v, _)| *v == path.api_version) else {
        return status(
            404,
            "NotFound",
            format!("the server could not find the requested resource {}", path.plural),
        );
    };
    if inner
        .store
        .lock()
        .unwrap()
        .forbidden
        .iter()
        .any(|(m, p)| *m == method && *p == path.plural)
    {
        let verb = match method {
            Method::POST => "create",
            Method::DELETE => "delete",
            Method::PATCH => "patch",
            _ => "get",
        };
        return status(
            403,
            "Forbidden",
            format!(
                "{} is forbidden: User \"system:serviceaccount:config-snapshot:config-snapshot\" cannot {verb} resource \"{}\" in API group \"{}\" in the namespace \"{}\"",
                path.plural,
                path.plural,
                api_version.split_once('/').map_or("", |(group, _)| group),
                path.namespace.clone().unwrap_or_default()
            ),
        );
    }
    let one_get = method == Method::GET && path.name.is_some();
    let latency = {
        let mut store = inner.store.lock().unwrap();
        if one_get {
            store.gets_in_flight += 1;
            store.peak_gets_in_flight = store.peak_gets_in_flight.max(store.gets_in_flight);
        }
        store.latency
    };
    // A zero sleep still waits for the timer's next tick (about 1 ms).
    if !watching && !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
    if one_get {
        inner.store.lock().unwrap().gets_in_flight -= 1;
    }
    let body: Value = if body.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&body).unwrap_or(Value::Null)
    };
    match (method, path.name) {
        (Method::GET, None) if watching => {
            let since: u64 = query.get("resourceVersion").and_then(|r| r.parse().ok()).unwrap_or(0);
            watch(inner, path.plural, since)
        }
        (Method::GET, None) => {
            let store = inner.store.lock().unwrap();
            let items: Vec<&Value> = store
                .objects
                .iter()
                .filter(|(k, _)| k.0 == path.plural && path.namespace.as_ref().is_none_or(|ns| *ns == k.1))
                .map(|(_, v)| v)
                .collect();
            axum::Json(json!({"apiVersion": api_version, "kind": format!("{kind}List"),
                              "metadata": {"resourceVersion": store.rv.to_string()}, "items": items}))
            .into_response()
        }
        (Method::POST, None) => {
            let ns = path.namespace.unwrap_or_default();
            let name = body["metadata"]["name"].as_str().unwrap_or_default().to_string();
            let key = (path.plural.clone(), ns.clone(), name.clone());
            if inner.store.lock().unwrap().objects.contains_key(&key) {
                return status(409, "AlreadyExists", format!("{} {name:?} already exists", path.plural));
            }
            let mut object = body;
            // The registry stamps a creation itself, whatever the client sent.
            let clock = match inner.store.lock().unwrap().clock {
                0 => config_snapshot_policy::duration::unix_now(),
                fixed => fixed,
            };
            object["metadata"]["creationTimestamp"] = json!(config_snapshot_policy::duration::format_rfc3339(clock));
            object["metadata"]["namespace"] = json!(ns);
            object["apiVersion"] = json!(api_version);
            object["kind"] = json!(kind);
            (StatusCode::CREATED, axum::Json(inner.write(object, "ADDED"))).into_response()
        }
        (method, Some(name)) => {
            let ns = path.namespace.unwrap_or_default();
            let key = (path.plural.clone(), ns.clone(), name.clone());
            let Some(existing) = inner.store.lock().unwrap().objects.get(&key).cloned() else {
                return status(404, "NotFound", format!("{} {name:?} not found", path.plural));
            };
            match method {
                Method::GET => axum::Json(existing).into_response(),
                Method::DELETE => {
                    let want = &body["preconditions"]["uid"];
                    if !want.is_null() && *want != existing["metadata"]["uid"] {
                        return status(
                            409,
                            "Conflict",
                            format!(
                                "Precondition failed: UID in precondition: {want}, UID in object meta: {}",
                                existing["metadata"]["uid"]
                            ),
                        );
                    }
                    let mut store = inner.store.lock().unwrap();
                    store.objects.remove(&key);
                    store.rv += 1;
                    let rv = store.rv;
                    inner.emit(&mut store, &path.plural, rv, "DELETED", &existing);
                    axum::Json(json!({"kind": "Status", "apiVersion": "v1", "status": "Success", "details": {"name": name, "uid": existing["metadata"]["uid"]}}))
                        .into_response()
                }
                Method::PATCH => {
                    let mut patched = existing.clone();
                    if content_type.starts_with("application/json-patch+json") {
                        let Ok(patch) = serde_json::from_value::<json_patch::Patch>(body) else {
                            return status(400, "BadRequest", "invalid JSON Patch".into());
                        };
                        if let Err(e) = json_patch::patch(&mut patched, &patch) {
                            return status(422, "Invalid", format!("the patch could not be applied: {e}"));
                        }
                    } else if content_type.starts_with("application/merge-patch+json") {
                        json_patch::merge(&mut patched, &body);
                    } else {
                        return status(
                            415,
                            "UnsupportedMediaType",
                            format!("unsupported patch type {content_type}"),
                        );
                    }
                    update(&inner, existing, patched)
                }
                Method::PUT => update(&inner, existing, body),
                _ => status(405, "MethodNotAllowed", "method not allowed".into()),
            }
        }
        _ => status(405, "MethodNotAllowed", "method not allowed".into()),
    }
}

/// The API server's optimistic concurrency and immutability checks.
fn update(inner: &Inner, existing: Value, updated: Value) -> Response {
    let rv = &updated["metadata"]["resourceVersion"];
    if !rv.is_null() && *rv != existing["metadata"]["resourceVersion"] {
        return status(
            409,
            "Conflict",
            "Operation cannot be fulfilled: the object has been modified; please apply your changes to the latest version and try again".into(),
        );
    }
    if existing["immutable"] == true
        && (existing["data"] != updated["data"] || existing["binaryData"] != updated["binaryData"])
    {
        return status(422, "Invalid", "field is immutable when `immutable` is set".into());
    }
    axum::Json(inner.write(updated, "MODIFIED")).into_response()
}

fn watch(inner: Arc<Inner>, plural: String, since: u64) -> Response {
    // Subscribe before reading the history, so nothing falls in between.
    let receiver = inner.events.subscribe();
    let backlog: Vec<WatchEvent> = inner
        .store
        .lock()
        .unwrap()
        .history
        .iter()
        .filter(|e| e.plural == plural && e.rv > since)
        .cloned()
        .collect();
    let last = backlog.last().map_or(since, |e| e.rv);
    let head = futures::stream::iter(backlog.into_iter().map(|e| Ok::<_, Infallible>(e.line)));
    let tail = futures::stream::unfold((receiver, plural, last), |(mut rx, plural, last)| async move {
        loop {
            match rx.recv().await {
                Ok(e) if e.plural == plural && e.rv > last => {
                    let rv = e.rv;
                    return Some((Ok::<_, Infallible>(e.line), (rx, plural, rv)));
                }
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => continue,
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    });
    use futures::StreamExt;
    Response::builder()
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from_stream(head.chain(tail)))
        .unwrap()
}
