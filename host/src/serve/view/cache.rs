//! Watch-backed caches of the kinds the policy reads, indexed by namespace:
//! the policy lists within one namespace, and a cluster-wide store would make
//! every such list cost the size of the cluster.
//!
//! Objects are kept as JSON without `managedFields` and `status` (the policy
//! reads neither), so a get or a masked list serialises straight from here.
//! A ConfigMap or Secret is kept without its data and with only the metadata
//! its readers use (cluster/proof/cached.rs); anything else without the
//! manifest a client-side apply leaves in it (`Cache::kept`).

use config_snapshot_policy::model::object::ObjectExt;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

use futures::StreamExt;
use kube::api::{Api, DynamicObject};
use kube::core::{ApiResource, GroupVersionKind};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::Client;
use serde_json::Value;
use tokio::task::JoinHandle;

use config_snapshot_policy::model::keys;
use config_snapshot_policy::model::kinds::{self, WorkloadKind};
use config_snapshot_policy::model::source::{SourceId, SourceKind};

use crate::cluster::count;
use crate::cluster::proof::{Prover, DIGESTED};
use crate::cluster::referrers::Referrers;
use crate::cluster::{self, ApiError, Selector};
use crate::serve::tell::metrics::KindLabels;
use crate::serve::view::ledger::{Charged, Costs, Ledger};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

/// Every kind the policy reads, from the policy's one table.
pub use config_snapshot_policy::model::kinds::KINDS;

pub fn api_resource(kind: &str) -> Option<ApiResource> {
    kinds::find(kind)
        .map(|k| ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(k.group(), k.version(), k.kind), k.plural))
}

type Objects = HashMap<String, BTreeMap<String, Value>>;

/// One kind's objects by namespace, and (for workloads) which of them
/// reference which source, kept together under one lock.
#[derive(Default)]
struct Indexed {
    objects: Objects,
    referrers: Referrers,
}

impl Indexed {
    fn of(objects: Objects) -> Indexed {
        let mut referrers = Referrers::default();
        objects
            .values()
            .flat_map(BTreeMap::values)
            .for_each(|o| referrers.observe(o));
        Indexed { objects, referrers }
    }

    fn insert(&mut self, object: Value) {
        if let Some(kept) = insert(&mut self.objects, object) {
            self.referrers.observe(kept);
        }
    }

    /// Replaces what one namespace holds with a fresh listing of it (a
    /// namespaced watcher's relist), leaving the other namespaces as they are.
    fn replace_namespace(&mut self, kind: &str, namespace: &str, objects: Objects) {
        if let Some(old) = self.objects.remove(namespace) {
            for name in old.keys() {
                self.referrers.forget(kind, namespace, name);
            }
        }
        for object in objects.into_values().flat_map(BTreeMap::into_values) {
            self.insert(object);
        }
    }

    fn remove(&mut self, kind: &str, namespace: &str, name: &str) {
        if let Some(names) = self.objects.get_mut(namespace) {
            names.remove(name);
        }
        self.referrers.forget(kind, namespace, name);
    }

    /// Drops every object of `namespace`.
    fn remove_namespace(&mut self, kind: &str, namespace: &str) {
        if let Some(old) = self.objects.remove(namespace) {
            for name in old.keys() {
                self.referrers.forget(kind, namespace, name);
            }
        }
    }
}

/// A (re)list on its way: what it brought, and what each object cost. A
/// namespace whose objects of this kind alone pass the budget is dropped
/// from it as they come, costs kept: a relist never holds more of one
/// namespace than the cache would.
#[derive(Default)]
struct Listing {
    objects: Objects,
    costs: Costs,
    totals: HashMap<String, usize>,
}

impl Listing {
    fn add(&mut self, object: Value, cost: usize, limit: usize) {
        let ns = object.namespace().unwrap_or_default().to_string();
        let total = self.totals.entry(ns.clone()).or_default();
        let old = self
            .costs
            .entry(ns.clone())
            .or_default()
            .insert(object.name().to_string(), cost)
            .unwrap_or(0);
        *total = *total - old + cost;
        if *total > limit {
            self.objects.remove(&ns);
        } else {
            insert(&mut self.objects, object);
        }
    }
}

#[derive(Default)]
struct KindCache {
    objects: RwLock<Indexed>,
    /// Watchers of this kind that have listed once (one per namespace
    /// watched, or one for the cluster).
    synced: AtomicUsize,
    /// An optional kind (a CRD's) the API server does not serve: there are
    /// none of its objects to wait for. Its watcher keeps retrying with
    /// backoff, so installing the CRD later starts the cache.
    absent: AtomicBool,
    /// The scopes (a namespace, or `None` for the cluster) whose watcher
    /// of this kind is not following the API server: its last word was an
    /// error, it is listing again, or it has ended. What they hold may lag
    /// without bound, so no decision that rests on a bounded lag is made on
    /// it there ([`Cache::following`]).
    failing: std::sync::Mutex<std::collections::HashSet<Option<String>>>,
    /// Bumped to have this kind's watchers list again: a namespace back
    /// within its budget lacks what the cache dropped ([`Cache::refill`]).
    relist: tokio::sync::watch::Sender<u64>,
}

/// Whether one watcher follows the API server, kept in its kind's
/// [`KindCache::failing`] for its scope.
struct Following<'a> {
    failing: &'a std::sync::Mutex<std::collections::HashSet<Option<String>>>,
    scope: Option<String>,
    now: bool,
}

impl Following<'_> {
    /// After `event`: following once a listing has ended or a change has
    /// come, not after an error or while listing again (kube-runtime's
    /// watcher starts a relist with `Init` before it has asked anything).
    fn heard(&mut self, event: &watcher::Result<Event<DynamicObject>>) {
        self.set(matches!(
            event,
            Ok(Event::InitDone | Event::Apply(_) | Event::Delete(_))
        ));
    }

    fn set(&mut self, following: bool) {
        if following != self.now {
            self.now = following;
            let mut failing = self.failing.lock().unwrap_or_else(|e| e.into_inner());
            if following {
                failing.remove(&self.scope);
            } else {
                failing.insert(self.scope.clone());
            }
        }
    }
}

/// However a watcher ends (its stream over, its task panicked or
/// aborted), what its scope holds hears nothing more.
impl Drop for Following<'_> {
    fn drop(&mut self) {
        self.set(false);
    }
}

/// One watcher's state, which outlives a keyring relist (it lists again in
/// the same scope): whether it has listed once, whether its next list is
/// for a new keyring, and whether it follows the API server (its `Drop`
/// marks a watcher that ended).
struct Watcher<'a> {
    kind: &'static str,
    listed: bool,
    rekeyed: bool,
    following: Following<'a>,
}

/// Why a watch ended ([`Cache::watch`]).
#[derive(Debug, PartialEq)]
enum Again {
    /// For good: its stream ended.
    No,
    /// To list again for a new keyring.
    Rekeyed,
    /// To list again for a namespace back within its budget.
    Refill,
}

/// What [`Cache::on_workload_change`] tells of a stored workload change,
/// and [`Cache::on_source_change`] of a stored change of a source's content.
type Changed = Box<dyn Fn(&crate::cluster::Key) + Send + Sync>;

#[derive(Default)]
pub struct Cache {
    kinds: HashMap<&'static str, KindCache>,
    /// Sources are kept digested by it ([`Prover::digested`]): metadata and
    /// a keyed digest, never their data. `None`: kept whole (tests).
    prover: Option<Arc<Prover>>,
    /// Bumped when the keyring changes: the sources' watchers list again,
    /// so that their digests and proofs are made with the new ring.
    keyring: tokio::sync::watch::Sender<u64>,
    /// How many objects each kind holds, for metrics.
    counts: Option<Family<KindLabels, Gauge>>,
    /// The namespaces watched; `None`: the whole cluster. A namespaced
    /// install watches only its own, with the Roles it has there: it holds
    /// no other namespace's Secrets, and could not list them.
    within: Option<Vec<String>>,
    /// Namespaces a cluster-wide watch leaves out, by field selector: the
    /// API server never sends their objects (kube-system's Secrets among
    /// them), so serve never holds them.
    excluded: Vec<String>,
    /// Told of every stored change of a workload (kind, namespace, name),
    /// as the watch brings it: the effect queue wakes the rollouts held
    /// for what its users write.
    on_workload: std::sync::OnceLock<Changed>,
    /// Told of every stored change of a source's content (not of its
    /// metadata alone, not of a snapshot of ours), as the watch brings it
    /// or a relist finds it: the watchers' rollouts start there
    /// (docs/design.md, "Watch").
    on_source: std::sync::OnceLock<Changed>,
    /// What each namespace's objects cost, against
    /// `--cache-values-per-namespace` (unbounded unless
    /// [`Cache::budgeted`]): whether the cache holds it.
    ledger: std::sync::Mutex<Ledger>,
    /// How many namespaces the cache does not hold for their budget.
    over_budget: Option<Gauge>,
}

impl Cache {
    /// A cache of the whole cluster.
    pub fn new() -> Cache {
        Cache {
            kinds: KINDS.iter().map(|k| (k.kind, KindCache::default())).collect(),
            ..Cache::default()
        }
    }

    /// Tells `tell` of every stored change of a workload (once; later
    /// calls are ignored).
    pub(crate) fn on_workload_change(&self, tell: impl Fn(&crate::cluster::Key) + Send + Sync + 'static) {
        let _ = self.on_workload.set(Box::new(tell));
    }

    /// Tells `tell` of every stored change of a source's content (once;
    /// later calls are ignored).
    pub(crate) fn on_source_change(&self, tell: impl Fn(&crate::cluster::Key) + Send + Sync + 'static) {
        let _ = self.on_source.set(Box::new(tell));
    }

    /// The same cache, keeping sources digested by `prover`.
    pub fn digesting(self, prover: Arc<Prover>) -> Cache {
        Cache {
            prover: Some(prover),
            ..self
        }
    }

    /// The prover its sources are digested by, which also names Secret
    /// snapshots (`None` in tests that keep sources whole).
    pub fn prover(&self) -> Option<&Prover> {
        self.prover.as_deref()
    }

    /// The same cache, counting its objects into `gauges`.
    pub fn counting(self, gauges: Family<KindLabels, Gauge>) -> Cache {
        Cache {
            counts: Some(gauges),
            ..self
        }
    }

    /// The same cache, holding at most `values` JSON values of one
    /// namespace's objects (every kind together), and counting the
    /// namespaces it does not hold into `gauge`.
    pub fn budgeted(self, values: usize, gauge: Option<Gauge>) -> Cache {
        Cache {
            ledger: std::sync::Mutex::new(Ledger::new(values)),
            over_budget: gauge,
            ..self
        }
    }

    fn ledger(&self) -> std::sync::MutexGuard<'_, Ledger> {
        self.ledger.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the cache holds `namespace` whole: not past its budget, nor
    /// back within it but short of what it dropped (docs/serve.md, "The
    /// cache").
    pub(crate) fn holds(&self, namespace: &str) -> bool {
        self.ledger().holds(namespace)
    }

    /// Fails unless the cache holds `namespace`: no read of part of one.
    fn held(&self, namespace: &str) -> cluster::Result<()> {
        if self.holds(namespace) {
            Ok(())
        } else {
            Err(ApiError::Unavailable(format!(
                "serve's cache does not hold namespace {namespace}: its objects pass --cache-values-per-namespace"
            )))
        }
    }

    /// Stores one object of `kind` as the watch or one of serve's writes
    /// brought it, charged to its namespace; when the namespace went over
    /// its budget with it, drops what the cache held of it, kind by kind
    /// (one lock at a time). Answers what `changed` says of it beside
    /// what the cache held of it, if it is held (else `false`).
    fn store(&self, kind: &'static str, object: Value, changed: impl FnOnce(Option<&Value>, &Value) -> bool) -> bool {
        let cost = count::of(&object);
        let ns = object.namespace().unwrap_or_default().to_string();
        let name = object.name().to_string();
        let (charged, changed) = {
            let mut indexed = self.kinds[kind].objects.write().unwrap_or_else(|e| e.into_inner());
            let charged = self.ledger().charge(kind, &ns, &name, cost);
            let changed = match charged {
                Charged::Hold => {
                    let changed = changed(indexed.objects.get(&ns).and_then(|n| n.get(&name)), &object);
                    indexed.insert(object);
                    changed
                }
                Charged::Drop | Charged::WentOver => {
                    indexed.remove(kind, &ns, &name);
                    false
                }
            };
            self.count(kind, &indexed);
            (charged, changed)
        };
        if charged == Charged::WentOver {
            self.went_over(&ns);
        }
        changed
    }

    /// `namespace` went over its budget: what the cache holds of it goes.
    /// Logged once per time, without any object's content.
    fn went_over(&self, namespace: &str) {
        tracing::warn!(
            namespace,
            values = self.ledger().limit(),
            "the namespace's objects pass --cache-values-per-namespace: serve's cache holds none of them, and reads them fresh"
        );
        for (kind, cache) in &self.kinds {
            let mut indexed = cache.objects.write().unwrap_or_else(|e| e.into_inner());
            indexed.remove_namespace(kind, namespace);
            self.count(kind, &indexed);
        }
        self.gauge_over_budget();
    }

    fn gauge_over_budget(&self) {
        if let Some(gauge) = &self.over_budget {
            gauge.set(self.ledger().unheld() as i64);
        }
    }

    /// Lists again every kind a namespace back within its budget is short
    /// of, so that the cache holds it again. Called once per periodic
    /// pass, after it: a tenant that grows and shrinks costs at most one
    /// relist per `--resync-interval`.
    pub(crate) fn refill(&self) {
        let short = self.ledger().short();
        for kind in short {
            if let Some(cache) = self.kinds.get(kind) {
                tracing::info!(kind, "listing again: a namespace is back within its cache budget");
                cache.relist.send_modify(|generation| *generation += 1);
            }
        }
    }

    /// Sets `kind`'s object count from what it holds now.
    fn count(&self, kind: &'static str, indexed: &Indexed) {
        if let Some(gauges) = &self.counts {
            let n: usize = indexed.objects.values().map(BTreeMap::len).sum();
            gauges.get_or_create(&KindLabels { kind }).set(n as i64);
        }
    }

    /// The keyring changed: list the sources again, to digest and prove
    /// them with it.
    pub(crate) fn keyring_changed(&self) {
        self.keyring.send_modify(|generation| *generation += 1);
    }

    /// An object as the cache keeps it: a source digested (its data and
    /// every annotation but config-snapshot's own gone, by allow-list:
    /// `Prover::digested`); anything else without the manifest a
    /// client-side apply left in it ([`keys::LAST_APPLIED`]). A workload's
    /// annotations are the policy's input (its opt-in, the controllers'
    /// revision numbers, its records), so only that one goes: it holds no
    /// Secret data (a workload names its Secrets), but it is the workload
    /// over again, which would double what the cache holds of every
    /// workload applied client-side, and no reader of the cache reads it.
    fn kept(&self, mut object: Value) -> Value {
        match &self.prover {
            Some(prover) if object["kind"].as_str().and_then(SourceKind::from_kind).is_some() => {
                prover.digested(&object)
            }
            _ => {
                if object.has_annotation(keys::LAST_APPLIED) {
                    if let Some(annotations) = object.annotations_mut() {
                        annotations.remove(keys::LAST_APPLIED);
                    }
                }
                object
            }
        }
    }

    /// A new watcher of `kind` in `scope` (a namespace, or the cluster).
    fn watcher(&self, kind: &'static str, scope: Option<String>) -> Watcher<'_> {
        Watcher {
            kind,
            listed: false,
            rekeyed: false,
            following: Following {
                failing: &self.kinds[kind].failing,
                scope,
                now: true,
            },
        }
    }

    /// Whether `kept` (a source as the cache keeps it) holds other content
    /// than `held`, what the cache held of it (`None`: new to the cache),
    /// and is not a snapshot of ours. Compared by the keyed digests, both
    /// made with the ring of this listing; a cache that keeps sources
    /// whole (tests) compares their data.
    fn content_changed(&self, held: Option<&Value>, kept: &Value) -> bool {
        if self.prover.as_ref().is_some_and(|p| p.proves(kept)) {
            return false;
        }
        let content = |o: &Value| match o.get(DIGESTED) {
            Some(digested) => digested["digest"].clone(),
            None => serde_json::json!([o.get("data"), o.get("binaryData"), o.get("type")]),
        };
        held.is_none_or(|held| content(held) != content(kept))
    }

    /// A cache of the whole cluster but `namespaces`.
    pub fn excluding(namespaces: Vec<String>) -> Cache {
        Cache {
            excluded: namespaces,
            ..Cache::new()
        }
    }

    /// The field selector of a cluster-wide watch: every excluded
    /// namespace left out.
    fn field_selector(&self) -> Option<String> {
        let parts: Vec<String> = self
            .excluded
            .iter()
            .map(|ns| format!("metadata.namespace!={ns}"))
            .collect();
        (!parts.is_empty()).then(|| parts.join(","))
    }

    /// A cache of `namespaces` only (at least one).
    pub fn within(namespaces: Vec<String>) -> Cache {
        Cache {
            within: Some(namespaces).filter(|n| !n.is_empty()),
            ..Cache::new()
        }
    }

    /// Watchers per kind: one per namespace watched, or one for all.
    fn watchers(&self) -> usize {
        self.within.as_ref().map_or(1, Vec::len)
    }

    /// Starts the watchers: per kind, one for the cluster or one per
    /// namespace. They run until the runtime stops, relisting with backoff
    /// after errors, as kube-runtime's watcher does.
    pub fn start(self: &Arc<Self>, client: Client) -> Vec<JoinHandle<()>> {
        let scopes: Vec<Option<String>> = match &self.within {
            None => vec![None],
            Some(namespaces) => namespaces.iter().cloned().map(Some).collect(),
        };
        KINDS
            .iter()
            .flat_map(|k| scopes.iter().map(move |ns| (k.kind, ns.clone())))
            .map(|(kind, namespace)| {
                let cache = self.clone();
                let client = client.clone();
                tokio::spawn(async move { cache.run(client, kind, namespace).await })
            })
            .collect()
    }

    async fn run(&self, client: Client, kind: &'static str, namespace: Option<String>) {
        let Some(ar) = api_resource(kind) else { return };
        let (api, config): (Api<DynamicObject>, _) = match &namespace {
            Some(ns) => (Api::namespaced_with(client, ns, &ar), watcher::Config::default()),
            None => {
                let config = watcher::Config::default();
                let config = match self.field_selector() {
                    Some(fields) => config.fields(&fields),
                    None => config,
                };
                (Api::all_with(client, &ar), config)
            }
        };
        let source = SourceKind::from_kind(kind).is_some();
        let mut keyring = self.keyring.subscribe();
        let mut relist = self.kinds[kind].relist.subscribe();
        let mut watcher = self.watcher(kind, namespace.clone());
        loop {
            let events = watcher::watcher(api.clone(), config.clone()).default_backoff().boxed();
            let again = self
                .watch(
                    (&ar, &namespace),
                    events,
                    &mut watcher,
                    (source.then_some(&mut keyring), &mut relist),
                )
                .await;
            match again {
                Again::No => return,
                Again::Rekeyed => {
                    tracing::info!(kind, "the keyring changed: listing again");
                    watcher.rekeyed = true;
                }
                Again::Refill => {}
            }
        }
    }

    /// A (re)list has ended: what it brought replaces what the cache held
    /// of its scope, and a watcher's first list counts towards
    /// [`Cache::synced`]. A relist of sources after the first (an error, a 410) tells what
    /// changed while the watch was away, unless it lists again for a new
    /// keyring (`rekeyed`): digests made with another key compare unequal,
    /// and the periodic pass re-admits every watched source anyway.
    fn relisted(&self, namespace: &Option<String>, listing: Option<Listing>, watcher: &mut Watcher<'_>) {
        let kind = watcher.kind;
        let mut changed = Vec::new();
        let mut went_over = Vec::new();
        if let Some(Listing { mut objects, costs, .. }) = listing {
            let mut indexed = self.kinds[kind].objects.write().unwrap_or_else(|e| e.into_inner());
            {
                let mut ledger = self.ledger();
                // A namespace the cache did not hold tells nothing: what it
                // lacked is not new.
                let unheld: std::collections::HashSet<String> =
                    objects.keys().filter(|ns| !ledger.holds(ns)).cloned().collect();
                went_over = ledger.relisted(kind, namespace.as_deref(), costs);
                objects.retain(|ns, _| ledger.stores(ns));
                if watcher.listed && !watcher.rekeyed && SourceKind::from_kind(kind).is_some() {
                    for (ns, names) in objects.iter().filter(|(ns, _)| !unheld.contains(*ns)) {
                        for (name, object) in names {
                            let held = indexed.objects.get(ns).and_then(|n| n.get(name));
                            if self.content_changed(held, object) {
                                changed.push((kind.to_string(), ns.clone(), name.clone()));
                            }
                        }
                    }
                }
            }
            match namespace {
                Some(ns) => indexed.replace_namespace(kind, ns, objects),
                None => *indexed = Indexed::of(objects),
            }
            self.count(kind, &indexed);
        }
        for ns in &went_over {
            self.went_over(ns);
        }
        self.gauge_over_budget();
        watcher.rekeyed = false;
        if let Some(tell) = self.on_source.get() {
            changed.iter().for_each(tell);
        }
        self.kinds[kind].absent.store(false, Ordering::SeqCst);
        if !std::mem::replace(&mut watcher.listed, true) {
            let synced = self.kinds[kind].synced.fetch_add(1, Ordering::SeqCst) + 1;
            if synced == self.watchers() {
                tracing::info!(kind, "cache synced");
            }
        }
    }

    /// Applies one watch's events to the cache until it ends (`false`) or,
    /// for a source kind, the keyring changes (`true`: list again).
    /// `watcher` outlives it (a keyring change lists again in the same
    /// scope); its `Drop` marks a watcher that ended.
    async fn watch(
        &self,
        (ar, namespace): (&ApiResource, &Option<String>),
        mut events: futures::stream::BoxStream<'_, watcher::Result<Event<DynamicObject>>>,
        watcher: &mut Watcher<'_>,
        (mut keyring, relist): (
            Option<&mut tokio::sync::watch::Receiver<u64>>,
            &mut tokio::sync::watch::Receiver<u64>,
        ),
    ) -> Again {
        let kind = watcher.kind;
        let source = SourceKind::from_kind(kind).is_some();
        let mut buffer: Option<Listing> = None;
        let limit = self.ledger().limit();
        loop {
            let rekeyed = async {
                match keyring.as_mut() {
                    Some(keyring) => keyring.changed().await,
                    None => std::future::pending().await,
                }
            };
            let event = tokio::select! {
                event = events.next() => event,
                changed = rekeyed => match changed {
                    Ok(()) => return Again::Rekeyed,
                    Err(_) => return Again::No,
                },
                changed = relist.changed() => match changed {
                    Ok(()) => return Again::Refill,
                    Err(_) => return Again::No,
                },
            };
            let Some(event) = event else { return Again::No };
            watcher.following.heard(&event);
            match event {
                Ok(Event::Init) => buffer = Some(Listing::default()),
                Ok(Event::InitApply(o)) => {
                    let object = self.kept(trim(o, ar));
                    if let Some(buffer) = buffer.as_mut() {
                        let cost = count::of(&object);
                        buffer.add(object, cost, limit);
                    }
                }
                Ok(Event::InitDone) => self.relisted(namespace, buffer.take(), watcher),
                Ok(Event::Apply(o)) => {
                    // What the cache has seen, for tracing a decision made
                    // on a view that lags the API server.
                    tracing::debug!(
                        kind,
                        namespace = o.metadata.namespace.as_deref().unwrap_or_default(),
                        name = o.metadata.name.as_deref().unwrap_or_default(),
                        resource_version = o.metadata.resource_version.as_deref().unwrap_or_default(),
                        "cache applied"
                    );
                    let kept = self.kept(trim(o, ar));
                    let text = |p: &str| kept.pointer(p).and_then(Value::as_str).unwrap_or_default().to_string();
                    let key = (kind.to_string(), text("/metadata/namespace"), text("/metadata/name"));
                    let changed = self.store(kind, kept, |held, kept| source && self.content_changed(held, kept));
                    let tell = if changed {
                        self.on_source.get()
                    } else if WorkloadKind::from_kind(kind).is_some() {
                        self.on_workload.get()
                    } else {
                        None
                    };
                    if let Some(tell) = tell {
                        tell(&key);
                    }
                }
                Ok(Event::Delete(o)) => self.forget(
                    kind,
                    o.metadata.namespace.as_deref().unwrap_or_default(),
                    o.metadata.name.as_deref().unwrap_or_default(),
                ),
                Err(e) if not_served(&e) && kinds::find(kind).is_some_and(|k| k.optional) => {
                    if !self.kinds[kind].absent.swap(true, Ordering::SeqCst) {
                        tracing::info!(
                            kind,
                            "not served by the API server (its CRD is not installed); retrying with backoff"
                        );
                    }
                }
                Err(e) => tracing::warn!(kind, error = %e, "watch failed; retrying with backoff"),
            }
        }
    }

    /// Whether every kind has been listed once: until then reads could miss
    /// objects, so the webhook is not ready.
    pub fn synced(&self) -> bool {
        let watchers = self.watchers();
        self.kinds
            .values()
            .all(|k| k.synced.load(Ordering::SeqCst) >= watchers || k.absent.load(Ordering::SeqCst))
    }

    /// Whether the watcher of `kind` that holds `namespace` follows the API
    /// server: its last word was neither an error nor the start of a
    /// relist, and it has not ended. Until then what it holds may lag
    /// without bound; a reuse decided on a cached copy
    /// (`reusable_as_cached`) is then decided on a fresh read instead. A
    /// namespace's failing watcher (a namespaced install's) says nothing of
    /// the others.
    pub fn following(&self, kind: &str, namespace: &str) -> bool {
        self.holds(namespace)
            && self.kinds.get(kind).is_some_and(|k| {
                let failing = k.failing.lock().unwrap_or_else(|e| e.into_inner());
                !failing
                    .iter()
                    .any(|scope| scope.as_deref().is_none_or(|ns| ns == namespace))
            })
    }

    pub fn get(&self, kind: &str, namespace: &str, name: &str) -> cluster::Result<Option<Value>> {
        self.inspect(kind, namespace, name, Value::clone)
    }

    /// How many objects of `kind` the cache holds in `namespace`.
    pub(crate) fn held_in(&self, kind: &str, namespace: &str) -> Option<usize> {
        let cache = self.kind(kind).ok()?;
        self.held(namespace).ok()?;
        let indexed = cache.objects.read().unwrap_or_else(|e| e.into_inner());
        Some(indexed.objects.get(namespace).map_or(0, BTreeMap::len))
    }

    /// `look` at one cached object in place: a question about a large
    /// object (a snapshot can be 1 MiB) need not copy it.
    pub(crate) fn inspect<T>(
        &self,
        kind: &str,
        namespace: &str,
        name: &str,
        look: impl FnOnce(&Value) -> T,
    ) -> cluster::Result<Option<T>> {
        let cache = self.kind(kind)?;
        let indexed = cache.objects.read().unwrap_or_else(|e| e.into_inner());
        self.held(namespace)?;
        Ok(indexed.objects.get(namespace).and_then(|n| n.get(name)).map(look))
    }

    /// The `kind` workloads of `namespace` whose template references
    /// `source`, from the reverse index.
    pub(crate) fn list_referencing(
        &self,
        kind: &str,
        namespace: &str,
        source: &SourceId,
        visit: &mut dyn FnMut(&Value),
    ) -> cluster::Result<()> {
        let cache = self.kind(kind)?;
        let indexed = cache.objects.read().unwrap_or_else(|e| e.into_inner());
        self.held(namespace)?;
        let Some(names) = indexed.objects.get(namespace) else {
            return Ok(());
        };
        for name in indexed.referrers.names(kind, namespace, source) {
            if let Some(object) = names.get(name) {
                visit(object);
            }
        }
        Ok(())
    }

    /// The objects of `kind` in `namespace` (all namespaces: `None`) that
    /// `selector` matches.
    pub fn list(
        &self,
        kind: &str,
        namespace: Option<&str>,
        selector: &Selector,
        visit: &mut dyn FnMut(&Value),
    ) -> cluster::Result<()> {
        let cache = self.kind(kind)?;
        let indexed = cache.objects.read().unwrap_or_else(|e| e.into_inner());
        // Of every namespace, those the cache holds whole: one it does not
        // is left out as an excluded one is, never listed in part.
        let namespaces: Box<dyn Iterator<Item = &BTreeMap<String, Value>>> = match namespace {
            Some(ns) => {
                self.held(ns)?;
                Box::new(indexed.objects.get(ns).into_iter())
            }
            None => {
                let ledger = self.ledger();
                let held: Vec<&BTreeMap<String, Value>> = indexed
                    .objects
                    .iter()
                    .filter(|(ns, _)| ledger.holds(ns))
                    .map(|(_, names)| names)
                    .collect();
                Box::new(held.into_iter())
            }
        };
        for object in namespaces.flat_map(BTreeMap::values) {
            if selector.matches(object) {
                visit(object);
            }
        }
        Ok(())
    }

    /// Every cached object of `kind` in the namespaces the cache holds.
    pub fn all(&self, kind: &str) -> Vec<Value> {
        let mut out = Vec::new();
        let _ = self.list(kind, None, &Selector::default(), &mut |o| out.push(o.clone()));
        out
    }

    /// Puts an object in the cache directly: a write we just made is visible
    /// to the next admission without waiting for the watch event.
    pub fn observe(&self, object: Value) {
        let object = self.kept(object);
        let kind = object["kind"]
            .as_str()
            .and_then(|k| self.kinds.get_key_value(k))
            .map(|(k, _)| *k);
        if let Some(kind) = kind {
            self.store(kind, object, |_, _| false);
        }
    }

    /// Empties every kind (with `observe`, puts the cache in a known state).
    pub fn clear(&self) {
        for cache in self.kinds.values() {
            *cache.objects.write().unwrap_or_else(|e| e.into_inner()) = Indexed::default();
        }
    }

    pub(crate) fn forget(&self, kind: &str, namespace: &str, name: &str) {
        if let Some((kind, cache)) = self.kinds.get_key_value(kind) {
            let mut indexed = cache.objects.write().unwrap_or_else(|e| e.into_inner());
            self.ledger().discharge(kind, namespace, name);
            indexed.remove(kind, namespace, name);
            self.count(kind, &indexed);
        }
        self.gauge_over_budget();
    }

    fn kind(&self, kind: &str) -> cluster::Result<&KindCache> {
        self.kinds
            .get(kind)
            .ok_or_else(|| ApiError::NotFound(format!("the server could not find the requested resource: {kind}")))
    }
}

/// Stores `object` unless a later version of it is there; returns it as
/// stored, or `None` if it was older.
fn insert(objects: &mut Objects, object: Value) -> Option<&Value> {
    let ns = object.namespace().unwrap_or_default().to_string();
    let name = object.name().to_string();
    let names = objects.entry(ns).or_default();
    // Never step back: an Apply can race with `observe` of our own write.
    if let Some(existing) = names.get(&name) {
        if newer(existing, &object) {
            return None;
        }
    }
    names.insert(name.clone(), object);
    names.get(&name)
}

/// Whether `a` is a later version of the same object than `b`.
fn newer(a: &Value, b: &Value) -> bool {
    let rv = |o: &Value| o.meta_str("resourceVersion").and_then(|r| r.parse::<u64>().ok());
    a.uid() == b.uid() && matches!((rv(a), rv(b)), (Some(x), Some(y)) if x > y)
}

/// The object as the policy sees it: typed, without the fields it never reads.
pub fn trim(object: DynamicObject, ar: &ApiResource) -> Value {
    let mut value = serde_json::to_value(object).unwrap_or(Value::Null);
    if let Some(map) = value.as_object_mut() {
        // List and watch items may omit their type; the policy keys off it.
        map.insert("apiVersion".into(), Value::String(ar.api_version.clone()));
        map.insert("kind".into(), Value::String(ar.kind.clone()));
        map.remove("status");
        if let Some(meta) = map.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.remove("managedFields");
        }
    }
    value
}

/// Whether a watch failed because the API server does not serve the
/// resource at all: a 404 on the list or the watch (the API server answers
/// a path it does not serve with a plain-text 404, not a NotFound Status).
fn not_served(e: &watcher::Error) -> bool {
    match e {
        watcher::Error::InitialListFailed(kube::Error::Api(status))
        | watcher::Error::WatchStartFailed(kube::Error::Api(status)) => status.code == 404,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use config_snapshot_policy::model::content::Content;
    use config_snapshot_policy::model::keys;
    use serde_json::json;

    fn cm(ns: &str, name: &str, rv: &str, label: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"namespace": ns, "name": name, "uid": "u1", "resourceVersion": rv,
                            "labels": {"app": label}}})
    }

    #[test]
    fn lists_stay_within_one_namespace_and_honour_the_selector() {
        let cache = Cache::new();
        cache.observe(cm("a", "one", "1", "x"));
        cache.observe(cm("a", "two", "1", "y"));
        cache.observe(cm("b", "three", "1", "x"));
        let mut seen = Vec::new();
        cache
            .list("ConfigMap", Some("a"), &Selector::parse("app=x").unwrap(), &mut |o| {
                seen.push(o.meta_str("name").unwrap().to_string())
            })
            .unwrap();
        assert_eq!(seen, ["one"]);
        assert!(cache.get("ConfigMap", "b", "one").unwrap().is_none());
        assert!(cache.get("Namespace", "b", "one").is_err());
    }

    #[test]
    fn an_older_version_never_replaces_a_newer_one() {
        let cache = Cache::new();
        cache.observe(cm("a", "one", "7", "new"));
        cache.observe(cm("a", "one", "6", "old"));
        assert_eq!(
            cache.get("ConfigMap", "a", "one").unwrap().unwrap()["metadata"]["labels"]["app"],
            "new"
        );
        cache.forget("ConfigMap", "a", "one");
        assert!(cache.get("ConfigMap", "a", "one").unwrap().is_none());
    }

    #[test]
    fn trimming_drops_status_and_managed_fields_and_restores_the_type() {
        let ar = api_resource("Deployment").unwrap();
        let object: DynamicObject = serde_json::from_value(json!({
            "metadata": {"name": "web", "managedFields": [{"manager": "kubectl"}]},
            "spec": {"replicas": 1}, "status": {"replicas": 1}
        }))
        .unwrap();
        let v = trim(object, &ar);
        assert_eq!(v["apiVersion"], "apps/v1");
        assert_eq!(v["kind"], "Deployment");
        assert!(v.get("status").is_none());
        assert!(v["metadata"].get("managedFields").is_none());
        assert_eq!(v["spec"]["replicas"], 1);
    }

    #[test]
    fn not_synced_until_every_kind_listed() {
        let cache = Cache::new();
        assert!(!cache.synced());
        for k in cache.kinds.values() {
            k.synced.store(1, Ordering::SeqCst);
        }
        assert!(cache.synced());
        // A namespaced cache: every namespace's watcher of every kind.
        let cache = Cache::within(vec!["a".into(), "b".into()]);
        for k in cache.kinds.values() {
            k.synced.store(1, Ordering::SeqCst);
        }
        assert!(!cache.synced());
        for k in cache.kinds.values() {
            k.synced.store(2, Ordering::SeqCst);
        }
        assert!(cache.synced());
    }

    #[test]
    fn a_cluster_wide_watch_leaves_the_excluded_namespaces_out() {
        assert_eq!(Cache::new().field_selector(), None);
        let cache = Cache::excluding(vec!["kube-system".into(), "config-snapshot".into()]);
        assert_eq!(
            cache.field_selector().as_deref(),
            Some("metadata.namespace!=kube-system,metadata.namespace!=config-snapshot")
        );
    }

    /// serve holds no source's data: a Secret (or ConfigMap) in the cache is
    /// its metadata, a keyed digest and the verdict on its proof, which the
    /// host's decisions read instead.
    #[test]
    fn sources_are_kept_without_their_data() {
        let prover = Arc::new(Prover::new(b"the cache tests' key, 32 bytes..."));
        let cache = Cache::new().digesting(prover.clone());
        let secret = json!({"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"namespace": "a", "name": "db", "uid": "u", "resourceVersion": "1"},
            "data": {"password": "aHVudGVyMg=="}});
        cache.observe(secret.clone());
        let kept = cache.get("Secret", "a", "db").unwrap().unwrap();
        assert!(kept.get("data").is_none(), "{kept}");
        assert!(!kept.to_string().contains("aHVudGVyMg=="));
        assert_eq!(kept["type"], "Opaque");
        let content =
            config_snapshot_policy::model::content::Content::from_object(SourceKind::Secret, &secret).unwrap();
        assert!(prover.holds(&kept, &content));
        // Other kinds are kept whole.
        cache.observe(json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"namespace": "a", "name": "web", "uid": "w", "resourceVersion": "1"}, "spec": {"replicas": 2}}));
        assert_eq!(
            cache.get("Deployment", "a", "web").unwrap().unwrap()["spec"]["replicas"],
            2
        );
    }

    /// A client-side apply leaves the manifest it applied in an annotation:
    /// a Secret's `stringData` in plain text, a workload over again. The
    /// cache keeps neither: a source only config-snapshot's own annotations,
    /// a workload every annotation but that one (the policy reads the
    /// others).
    #[test]
    fn a_client_side_apply_leaves_its_manifest_out_of_the_cache() {
        let prover = Arc::new(Prover::new(b"the cache tests' key, 32 bytes..."));
        let cache = Cache::new().digesting(prover);
        let applied = |object: &Value| json!({keys::LAST_APPLIED: object.to_string(), "example.com/team": "shop"});
        let manifest = json!({"apiVersion": "v1", "kind": "Secret", "stringData": {"password": "hunter2"}});
        cache.observe(json!({"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"namespace": "a", "name": "db", "uid": "u", "resourceVersion": "1",
                         "annotations": applied(&manifest)},
            "data": {"password": "aHVudGVyMg=="}}));
        let kept = cache.get("Secret", "a", "db").unwrap().unwrap();
        assert!(!kept.to_string().contains("hunter2"), "{kept}");
        assert!(kept["metadata"].get("annotations").is_none(), "{kept}");
        let web = json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "a", "uid": "w", "resourceVersion": "1"}});
        let mut annotations = applied(&web);
        annotations[keys::WATCH] = json!("app");
        cache.observe(json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"namespace": "a", "name": "web", "uid": "w", "resourceVersion": "1",
                         "annotations": annotations}}));
        let kept = cache.get("Deployment", "a", "web").unwrap().unwrap();
        assert_eq!(
            kept["metadata"]["annotations"],
            json!({"example.com/team": "shop", keys::WATCH: "app"}),
            "only the manifest goes"
        );
    }

    #[test]
    fn a_namespace_relisted_leaves_the_others_alone() {
        let cache = Cache::within(vec!["a".into(), "b".into()]);
        cache.observe(cm("a", "gone", "1", "x"));
        cache.observe(cm("b", "kept", "1", "x"));
        let mut fresh = Objects::new();
        insert(&mut fresh, cm("a", "new", "2", "x"));
        cache.kinds["ConfigMap"]
            .objects
            .write()
            .unwrap()
            .replace_namespace("ConfigMap", "a", fresh);
        assert!(cache.get("ConfigMap", "a", "gone").unwrap().is_none());
        assert!(cache.get("ConfigMap", "a", "new").unwrap().is_some());
        assert!(cache.get("ConfigMap", "b", "kept").unwrap().is_some());
    }

    /// A namespace's watcher whose last word was an error, or the start of
    /// a relist, leaves that namespace not followed (a reuse there is then
    /// decided on a fresh read) until a listing ends or a change comes;
    /// other namespaces and kinds stay followed, and a watcher that ends
    /// is not followed again.
    #[tokio::test]
    async fn a_failing_watch_is_not_followed_until_it_is_heard_again() {
        let cache = Arc::new(Cache::within(vec!["a".into(), "b".into()]));
        let (tx, rx) = futures::channel::mpsc::unbounded();
        let watching = {
            let cache = cache.clone();
            tokio::spawn(async move {
                let ar = api_resource("ConfigMap").unwrap();
                let scope = Some("a".to_string());
                let mut watcher = cache.watcher("ConfigMap", scope.clone());
                cache
                    .watch(
                        (&ar, &scope),
                        rx.boxed(),
                        &mut watcher,
                        (None, &mut cache.kinds["ConfigMap"].relist.subscribe()),
                    )
                    .await
                    != Again::No
            })
        };
        let settled = |want: bool| until_following(&cache, "ConfigMap", "a", want);
        let object = || serde_json::from_value::<DynamicObject>(cm("a", "one", "1", "x")).unwrap();
        let error = || Err(watcher::Error::NoResourceVersion);
        assert!(cache.following("ConfigMap", "a"));
        tx.unbounded_send(error()).unwrap();
        assert!(settled(false).await, "an error: not followed");
        assert!(cache.following("ConfigMap", "b"), "another namespace is");
        assert!(cache.following("Secret", "a"), "another kind is");
        tx.unbounded_send(Ok(Event::Apply(object()))).unwrap();
        assert!(settled(true).await, "a change heard: followed");
        // A relist (after a 410, or a keyring change) starts with Init
        // before anything is asked.
        tx.unbounded_send(Ok(Event::Init)).unwrap();
        assert!(settled(false).await, "listing again: not followed");
        tx.unbounded_send(Ok(Event::InitApply(object()))).unwrap();
        assert!(!settled(true).await, "still listing");
        tx.unbounded_send(Ok(Event::InitDone)).unwrap();
        assert!(settled(true).await, "listed: followed");
        drop(tx);
        assert!(!watching.await.unwrap(), "the watch ended");
        assert!(
            !cache.following("ConfigMap", "a"),
            "an ended watcher hears nothing more"
        );
        assert!(cache.following("ConfigMap", "b"));
    }

    /// serve learns of a source's change from its watch, not from a review
    /// (docs/design.md, "Watch"): each stored change of content is told
    /// once, a change of metadata alone and a snapshot of ours never, and a
    /// relist tells what changed while the watch was away, except the one
    /// a new keyring asks for.
    #[tokio::test]
    async fn a_source_change_is_told_once_per_content_from_the_watch_and_relists() {
        let prover = Arc::new(Prover::replay());
        let cache = Arc::new(Cache::within(vec!["a".into()]).digesting(prover.clone()));
        let told = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
        {
            let told = told.clone();
            cache.on_source_change(move |(_, _, name)| told.lock().unwrap().push(name.clone()));
        }
        let (tx, rx) = futures::channel::mpsc::unbounded();
        let watching = {
            let cache = cache.clone();
            tokio::spawn(async move {
                let ar = api_resource("ConfigMap").unwrap();
                let scope = Some("a".to_string());
                let mut watcher = cache.watcher("ConfigMap", scope.clone());
                let listed = |w: &mut Watcher<'_>| w.listed;
                let watched = cache
                    .watch(
                        (&ar, &scope),
                        rx.boxed(),
                        &mut watcher,
                        (None, &mut cache.kinds["ConfigMap"].relist.subscribe()),
                    )
                    .await
                    != Again::No;
                (watched, listed(&mut watcher))
            })
        };
        let source = |name: &str, rv: &str, data: &str| {
            json!({"apiVersion": "v1", "kind": "ConfigMap",
                   "metadata": {"namespace": "a", "name": name, "uid": "u1", "resourceVersion": rv,
                                "labels": {"rv": rv}},
                   "data": {"k": data}})
        };
        let object =
            |name: &str, rv: &str, data: &str| serde_json::from_value::<DynamicObject>(source(name, rv, data)).unwrap();
        let send = |e: Event<DynamicObject>| tx.unbounded_send(Ok(e)).unwrap();
        send(Event::Init);
        send(Event::InitApply(object("app", "1", "one")));
        send(Event::InitDone);
        send(Event::Apply(object("app", "2", "one")));
        send(Event::Apply(object("app", "3", "two")));
        send(Event::Apply(object("new", "4", "x")));
        let mut ours = source("app", "5", "two");
        let content = Content::from_object(SourceKind::ConfigMap, &ours).unwrap();
        ours["metadata"]["name"] = json!(prover.snapshot_name("a", "app", &content));
        ours["metadata"]["labels"] = json!({keys::MANAGED_BY: keys::MANAGED_BY_VALUE});
        ours["metadata"]["annotations"] = json!({keys::SOURCE_NAME: "app", keys::CONTENT_HASH: content.hash()});
        ours["immutable"] = json!(true);
        prover.sign(&mut ours);
        assert!(prover.proves(&ours));
        send(Event::Apply(serde_json::from_value(ours).unwrap()));
        // The watch was away: a relist brings one change and one new source.
        send(Event::Init);
        send(Event::InitApply(object("app", "7", "three")));
        send(Event::InitApply(object("new", "4", "x")));
        send(Event::InitApply(object("later", "8", "y")));
        send(Event::InitDone);
        drop(tx);
        let (watched, listed) = watching.await.unwrap();
        assert!(!watched && listed);
        assert_eq!(
            *told.lock().unwrap(),
            ["app", "new", "app", "later"],
            "the first list tells nothing (the pass at start re-admits); a metadata change nothing; our snapshot nothing"
        );
    }

    /// Finding "Contained": serve's cache held whatever a tenant created.
    /// Past its budget a namespace is held not at all (not in part: the
    /// ConfigMap held before goes too), its reads fail and its listings
    /// across the cluster leave it out, and it is not followed; another
    /// namespace is held as before. Back within the budget it is held
    /// again only once every kind has been listed again.
    #[test]
    fn a_namespace_past_its_budget_is_held_not_at_all_and_another_is_held() {
        let cache = Cache::new().budgeted(1_000, None);
        let big = |ns: &str, name: &str| {
            let env: Vec<Value> = (0..300)
                .map(|i| json!({"name": format!("V{i}"), "value": "x"}))
                .collect();
            json!({"apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"namespace": ns, "name": name, "uid": name, "resourceVersion": "1"},
                "spec": {"template": {"spec": {"containers": [{"name": "c", "env": env}]}}}})
        };
        cache.observe(cm("tenant", "app", "1", "x"));
        cache.observe(cm("other", "app", "1", "x"));
        cache.observe(big("other", "web"));
        cache.observe(big("tenant", "one"));
        assert!(cache.holds("tenant"), "one of them fits");
        cache.observe(big("tenant", "two"));
        assert!(!cache.holds("tenant") && cache.holds("other"));
        for k in KINDS {
            let indexed = cache.kinds[k.kind].objects.read().unwrap();
            assert!(
                indexed.objects.get("tenant").is_none_or(BTreeMap::is_empty),
                "{} holds tenant's",
                k.kind
            );
        }
        assert!(cache.get("ConfigMap", "tenant", "app").is_err());
        assert!(cache
            .list("Deployment", Some("tenant"), &Selector::default(), &mut |_| {})
            .is_err());
        assert!(cache
            .list_referencing(
                "Deployment",
                "tenant",
                &SourceId::new(SourceKind::ConfigMap, "app"),
                &mut |_| {}
            )
            .is_err());
        assert_eq!(cache.held_in("ConfigMap", "tenant"), None);
        assert!(!cache.following("ConfigMap", "tenant") && cache.following("ConfigMap", "other"));
        let mut seen = Vec::new();
        for kind in ["ConfigMap", "Deployment"] {
            cache
                .list(kind, None, &Selector::default(), &mut |o| seen.push(cluster::key(o)))
                .unwrap();
        }
        assert_eq!(seen.len(), 2, "{seen:?}");
        assert!(seen.iter().all(|(_, ns, _)| ns == "other"));
        assert!(cache.get("Deployment", "other", "web").unwrap().is_some());
        // It shrinks: still not held until every kind is listed again.
        cache.forget("Deployment", "tenant", "two");
        cache.forget("Deployment", "tenant", "one");
        assert!(!cache.holds("tenant"));
        for k in KINDS {
            let mut listing = Listing::default();
            if k.kind == "ConfigMap" {
                listing.add(cm("tenant", "app", "2", "x"), 10, 1_000);
            }
            let mut watcher = cache.watcher(k.kind, None);
            watcher.listed = true;
            watcher.rekeyed = true;
            cache.relisted(&None, Some(listing), &mut watcher);
            watcher.following.now = false;
        }
        assert!(cache.holds("tenant") && cache.following("ConfigMap", "tenant"));
        assert!(cache.get("ConfigMap", "tenant", "app").unwrap().is_some());
    }

    /// Yields to the watcher until `cache` says `want` of `kind` in
    /// `namespace` (at most 100 turns); whether it did.
    async fn until_following(cache: &Cache, kind: &str, namespace: &str, want: bool) -> bool {
        for _ in 0..100 {
            if cache.following(kind, namespace) == want {
                return true;
            }
            tokio::task::yield_now().await;
        }
        false
    }

    /// A cluster-wide watcher (the default install) that is not following
    /// speaks for every namespace, and however it ends (here, its task
    /// aborted) it stays not following.
    #[tokio::test]
    async fn a_cluster_wide_watcher_speaks_for_every_namespace() {
        let cache = Arc::new(Cache::new());
        let (tx, rx) = futures::channel::mpsc::unbounded();
        let watching = {
            let cache = cache.clone();
            tokio::spawn(async move {
                let ar = api_resource("Secret").unwrap();
                let mut watcher = cache.watcher("Secret", None);
                cache
                    .watch(
                        (&ar, &None),
                        rx.boxed(),
                        &mut watcher,
                        (None, &mut cache.kinds["Secret"].relist.subscribe()),
                    )
                    .await
                    != Again::No
            })
        };
        tx.unbounded_send(Ok(Event::Init)).unwrap();
        assert!(until_following(&cache, "Secret", "any", false).await);
        assert!(!cache.following("Secret", "other"));
        tx.unbounded_send(Ok(Event::InitDone)).unwrap();
        assert!(until_following(&cache, "Secret", "any", true).await, "listed");
        watching.abort();
        assert!(watching.await.unwrap_err().is_cancelled());
        assert!(
            !cache.following("Secret", "any"),
            "an aborted watcher hears nothing more"
        );
        drop(tx);
    }
}
