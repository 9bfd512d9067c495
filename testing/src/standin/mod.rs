//! The stand-in API server: the endpoints serve uses (cluster-wide and
//! namespaced list and watch, get, create, JSON and merge patch with the
//! resourceVersion precondition, delete with uid and resourceVersion
//! preconditions), over the simulator's store ([`Shared`]).
//!
//! Strategic merge patches are taken as merge patches whose lists of named
//! objects merge by `name` (the merge key of every list serve patches so:
//! a webhook configuration's `webhooks`).
//!
//! - [`ApiServer::start`]: a plain API server. Writes persist as the
//!   registry stores them; tests write to it directly (`put`) the way a
//!   user or a controller would, and read back what serve did.
//! - [`ApiServer::simulating`]: the simulator behind `replay` served over
//!   HTTP. Writes of snapshots (serve's own, which the webhook's
//!   objectSelector skips) persist as they are; any other write takes the
//!   simulator's write path: admission (serve's webhook), persistence,
//!   controllers. One history then runs under both hosts.
//!
//! Served kinds: the policy's table, and serve's Lease and Events.

//!
//! This module keeps the state and the writes; [`http`] speaks the API.

mod http;

use config_snapshot_policy::model::object::ObjectExt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::http::Method;
use axum::Router;
use config_snapshot::cluster::{ApiError, Cluster, Preconditions};
use config_snapshot::replay::simulator::{Shared, Simulator};
use config_snapshot_policy::model::duration::unix_now;
use config_snapshot_policy::model::keys;
use config_snapshot_policy::model::kinds::KINDS;
use serde_json::{json, Value};

/// Kinds serve uses beyond the policy's table: its Lease, its Events, its
/// signing key's guard and its webhook configuration (cluster-scoped).
const SERVE_KINDS: [(&str, &str, &str); 5] = [
    ("leases", "coordination.k8s.io/v1", "Lease"),
    ("events", "events.k8s.io/v1", "Event"),
    (
        "validatingadmissionpolicies",
        "admissionregistration.k8s.io/v1",
        "ValidatingAdmissionPolicy",
    ),
    (
        "validatingadmissionpolicybindings",
        "admissionregistration.k8s.io/v1",
        "ValidatingAdmissionPolicyBinding",
    ),
    (
        "mutatingwebhookconfigurations",
        "admissionregistration.k8s.io/v1",
        "MutatingWebhookConfiguration",
    ),
];

/// (apiVersion, kind) served under a plural.
fn type_of(plural: &str) -> Option<(&'static str, &'static str)> {
    KINDS
        .iter()
        .find(|k| k.plural == plural)
        .map(|k| (k.api_version, k.kind))
        .or_else(|| {
            SERVE_KINDS
                .iter()
                .find(|(p, _, _)| *p == plural)
                .map(|(_, v, k)| (*v, *k))
        })
}

fn plural_of(kind: &str) -> &'static str {
    KINDS
        .iter()
        .find(|k| k.kind == kind)
        .map(|k| k.plural)
        .or_else(|| SERVE_KINDS.iter().find(|(_, _, k)| *k == kind).map(|(p, _, _)| *p))
        .unwrap_or("objects")
}

/// What the server does besides storing: injected behaviour and what it
/// saw.
#[derive(Default)]
struct Conduct {
    /// (method, plural) pairs answered 403, as RBAC without that verb.
    forbidden: Vec<(Method, String)>,
    /// Whether every request but a watch already open is answered 401,
    /// as to a token whose ServiceAccount was deleted.
    unauthenticated: bool,
    /// How long every request but a watch takes.
    latency: Duration,
    /// The clock creations are stamped with; `None`: the wall clock.
    clock: Option<i64>,
    /// GETs of one object in flight: now, and at most.
    gets_in_flight: usize,
    peak_gets_in_flight: usize,
    /// ConfigMap creations in flight: now, and at most.
    creates_in_flight: usize,
    peak_creates_in_flight: usize,
    /// Every request, as "METHOD path".
    log: Vec<String>,
}

struct Inner {
    shared: Arc<Shared>,
    /// The simulator whose write path non-snapshot writes take.
    sim: Option<Arc<Simulator>>,
    /// One simulated write at a time: the write path runs controllers and
    /// effects, as one API server's handlers would serialise on etcd.
    writing: Mutex<()>,
    conduct: Mutex<Conduct>,
}

pub struct ApiServer {
    pub addr: SocketAddr,
    inner: Arc<Inner>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl ApiServer {
    /// A plain API server on 127.0.0.1 (a free port), until the runtime
    /// stops.
    pub async fn start() -> ApiServer {
        ApiServer::serve(Arc::new(Shared::default()), None).await
    }

    /// `sim` served as an API server.
    pub async fn simulating(sim: Arc<Simulator>) -> ApiServer {
        ApiServer::serve(sim.shared.clone(), Some(sim)).await
    }

    async fn serve(shared: Arc<Shared>, sim: Option<Arc<Simulator>>) -> ApiServer {
        shared.store().keep_log();
        let inner = Arc::new(Inner {
            shared,
            sim,
            writing: Mutex::new(()),
            conduct: Mutex::default(),
        });
        let app = Router::new().fallback(http::handle).with_state(inner.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a loopback port");
        let addr = listener.local_addr().expect("a bound address");
        tokio::spawn(async move { axum::serve(listener, app).await });
        ApiServer { addr, inner }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A kubeconfig for this server, written to a fresh file.
    pub fn kubeconfig(&self) -> PathBuf {
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
        std::fs::write(&path, text).expect("a writable temp dir");
        path
    }

    /// Creates or replaces an object, as a user's `kubectl apply` lands,
    /// without admission.
    pub fn put(&self, object: Value) -> Value {
        self.inner.stamp_clock();
        self.inner.shared.store().persist(object)
    }

    /// Deletes `kind` `namespace`/`name` (`""`: cluster-scoped) as a user
    /// would, whatever its version: `false` if there was none.
    pub fn remove(&self, kind: &str, namespace: &str, name: &str) -> bool {
        let Ok(Some(current)) = self.inner.shared.get(kind, namespace, name) else {
            return false;
        };
        let pre = Preconditions {
            uid: current.uid().unwrap_or_default().to_string(),
            resource_version: None,
        };
        self.inner.delete(&current, &pre).is_ok()
    }

    /// Puts the signing key's guard as deploy/serve/keyguard.yaml ships it
    /// (`manifest`, its text), for serve in namespace `namespace`. The
    /// stand-in stores it; it does not enforce it.
    pub fn guard_signing_key(&self, manifest: &str, namespace: &str) {
        let text = manifest.replace(
            "config-snapshot:config-snapshot",
            &format!("{namespace}:config-snapshot"),
        );
        for document in text.split("\n---") {
            let mut object: Value = serde_yaml_ng::from_str(document).expect("the guard's manifest is YAML");
            if !object.is_null() {
                // Cluster-scoped: served without a namespace.
                object["metadata"]["namespace"] = json!("");
                self.put(object);
            }
        }
    }

    /// Replaces the whole store with `objects`, kept exactly as given
    /// (uids, resourceVersions): the state another cluster was in.
    pub fn reset(&self, objects: &[Value]) {
        self.inner.shared.store().reset(objects);
    }

    /// Every object, as (kind, namespace, name).
    pub fn keys(&self) -> Vec<(String, String, String)> {
        self.inner
            .shared
            .store()
            .all()
            .map(config_snapshot::cluster::key)
            .collect()
    }

    pub fn get(&self, kind: &str, ns: &str, name: &str) -> Option<Value> {
        self.inner.shared.store().get(kind, ns, name).cloned()
    }

    pub fn list(&self, kind: &str) -> Vec<Value> {
        self.inner
            .shared
            .store()
            .all()
            .filter(|o| o["kind"] == kind)
            .cloned()
            .collect()
    }

    /// Every version `kind` `ns`/`name` has had, oldest first, as its watch
    /// events carried them: what a controller watching it saw, including
    /// writes by processes that have since died.
    pub fn versions(&self, kind: &str, ns: &str, name: &str) -> Vec<Value> {
        self.inner
            .shared
            .store()
            .changes_since(0)
            .into_iter()
            .filter(|c| c.kind != "DELETED")
            .map(|c| c.object)
            .filter(|o| o["kind"] == kind && o["metadata"]["namespace"] == ns && o["metadata"]["name"] == name)
            .collect()
    }

    /// Refuses `method` on `kind` from now on with 403 Forbidden: the
    /// ClusterRole without that verb.
    pub fn forbid(&self, method: Method, kind: &str) {
        lock(&self.inner.conduct)
            .forbidden
            .push((method, plural_of(kind).to_string()));
    }

    /// Answers every request but a watch 401 while `refused`, as a real
    /// API server answers a token whose ServiceAccount was deleted since.
    pub fn refuse_credentials(&self, refused: bool) {
        lock(&self.inner.conduct).unauthenticated = refused;
    }

    /// Makes every request but a watch take `latency` before it is
    /// answered, as a network and a real API server's storage would: slow
    /// enough, overlapping reads show (`peak_gets_in_flight`). A nonzero
    /// sleep takes at least one timer tick (about 1 ms).
    pub fn latency(&self, latency: Duration) {
        lock(&self.inner.conduct).latency = latency;
    }

    /// Stamps creations with `unix` from now on, as a server whose clock
    /// reads that would.
    pub fn fix_clock(&self, unix: i64) {
        lock(&self.inner.conduct).clock = Some(unix);
    }

    /// The most GETs of one object that were in flight at the same time.
    pub fn peak_gets_in_flight(&self) -> usize {
        lock(&self.inner.conduct).peak_gets_in_flight
    }

    /// The most ConfigMap creations (POSTs) that were in flight at the
    /// same time.
    pub fn peak_creates_in_flight(&self) -> usize {
        lock(&self.inner.conduct).peak_creates_in_flight
    }

    /// The requests answered, as "METHOD path".
    pub fn log(&self) -> Vec<String> {
        lock(&self.inner.conduct).log.clone()
    }
}

impl Inner {
    /// A plain server stamps creations with its own clock.
    fn stamp_clock(&self) {
        if self.sim.is_none() {
            let clock = lock(&self.conduct).clock.unwrap_or_else(unix_now);
            self.shared.store().now = clock;
        }
    }

    /// Creates an object: a snapshot, or anything on a plain server, as
    /// the registry stores it; anything else through the write path.
    fn create(&self, object: Value) -> Result<Value, ApiError> {
        let (kind, ns, name) = config_snapshot::cluster::key(&object);
        match (&self.sim, keys::is_snapshot(&object)) {
            (Some(sim), false) => {
                let _one = lock(&self.writing);
                Cluster::create(sim.as_ref(), object)?;
            }
            _ => {
                self.stamp_clock();
                self.shared.create(object)?;
            }
        }
        self.stored(&kind, &ns, &name)
    }

    fn stored(&self, kind: &str, ns: &str, name: &str) -> Result<Value, ApiError> {
        self.shared
            .get(kind, ns, name)?
            .ok_or_else(|| ApiError::NotFound(format!("{} {name:?} not found", plural_of(kind))))
    }

    /// Replaces an object with `updated`, pinned to the resourceVersion it
    /// carries, if any.
    fn update(&self, current: &Value, updated: Value) -> Result<Value, ApiError> {
        let (kind, ns, name) = config_snapshot::cluster::key(current);
        let rv = current.resource_version().to_string();
        // Optimistic concurrency: an update that names another version
        // conflicts.
        if updated.meta_str("resourceVersion").is_some_and(|v| v != rv) {
            return Err(ApiError::Conflict(
                "Operation cannot be fulfilled: the object has been modified; please apply your changes to the latest version and try again".into(),
            ));
        }
        // The whole object, as one JSON Patch: the registry's other checks
        // (immutability) are the cluster's.
        let mut whole = updated;
        whole["metadata"]["resourceVersion"] = json!(rv);
        let ops = vec![json!({"op": "replace", "path": "", "value": whole})];
        match &self.sim {
            Some(sim) if !keys::is_snapshot(current) => {
                let _one = lock(&self.writing);
                Cluster::patch(sim.as_ref(), &kind, &ns, &name, &rv, ops)?;
            }
            _ => self.shared.patch(&kind, &ns, &name, &rv, ops)?,
        }
        self.stored(&kind, &ns, &name)
    }

    fn delete(&self, current: &Value, pre: &Preconditions) -> Result<(), ApiError> {
        let (kind, ns, name) = config_snapshot::cluster::key(current);
        match &self.sim {
            Some(sim) if !keys::is_snapshot(current) => {
                let _one = lock(&self.writing);
                Cluster::delete(sim.as_ref(), &kind, &ns, &name, pre)
            }
            _ => self.shared.delete(&kind, &ns, &name, pre),
        }
    }
}
