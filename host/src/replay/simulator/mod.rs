//! The simulator behind `replay`: just enough Kubernetes to watch
//! config roll forward and back. Every write a step or a simulated
//! controller makes is first an admission request to the policy, when the
//! metadata's rules say the policy handles it.
//!
//! - [`store`]: objects, versions, generations, the clock;
//! - [`shared`]: what the policy's host calls reach (a plain cluster for
//!   the capability), replay's faults and its timeline;
//! - this module: the cluster's state and what replay's steps ask of it;
//! - [`write`]: the API server's write path (defaulting, immutability,
//!   admission, persistence);
//! - [`cluster`]: the simulator as a [`crate::cluster::Cluster`], whose
//!   writes take that path, for the lifecycle's driver;
//! - [`controllers`]: the Deployment, StatefulSet and DaemonSet controllers
//!   and the garbage collector;
//! - [`kubectl`]: the user's verbs (`rollout undo`, `rollout restart`, …);
//! - [`scheduler`]: replay's scheduling of the deferred effects and the
//!   periodic pass, which `crate::lifecycle` carries out as for serve.

pub(crate) mod as_cluster;
pub mod controllers;
mod defaulting;
pub mod kubectl;
pub(crate) mod scheduler;
pub mod shared;
pub mod store;
pub mod timeline;
mod write;

use config_snapshot_policy::model::object::ObjectExt;
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::Result;
use config_snapshot_policy::model::settings::Settings;
use serde_json::{json, Value};

use crate::cluster::proof::Prover;
use crate::cluster::Key;
use crate::kubewarden::engine::Engine;
use crate::kubewarden::rules::WebhookRules;
use crate::lifecycle::{Effect, InFlight, Rules, Slot};
pub(crate) use defaulting::{fold_string_data, prepare};
use shared::lock;
pub use shared::{Fault, Rollout, Shared};

/// One admission as replay evaluated it, with the cluster it saw: lets a
/// test put another host (serve's, against an API server) in the same
/// state and check it answers the same.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub request: Value,
    pub settings: Value,
    pub now: i64,
    pub before: Vec<Value>,
    pub after: Vec<Value>,
    /// The Kubewarden ValidationResponse.
    pub response: Value,
    /// An injected fault was armed: the answer depends on it.
    pub faulted: bool,
}

/// What admission said about one write.
#[derive(Debug, Clone, Default)]
pub struct Admission {
    pub allowed: bool,
    pub message: Option<String>,
    pub warnings: Vec<String>,
    /// The policy's ValidationResponse.
    pub response: Value,
}

const ROOT_CA: &str = "kube-root-ca.crt";

/// The service account the host's own writes (watch rollouts, renewals)
/// are made as.
pub const HOST_USER: &str = "system:serviceaccount:config-snapshot:config-snapshot";

/// An admission webhook other than the in-process policy: takes an
/// AdmissionRequest, answers the policy's ValidationResponse. Serve's
/// admission path plugs in here, so the same cluster runs both.
pub type Webhook = Arc<dyn Fn(&Value) -> Result<Value> + Send + Sync>;

/// A deferred effect on its way, with its schedule.
#[derive(Debug, Clone)]
pub struct Job {
    /// What it works on: the effect it runs is its slot's newest
    /// ([`crate::lifecycle::InFlight::take`]).
    pub slot: Slot,
    /// The effect it ran last: another one taken is a newer effect of the
    /// slot, whose attempts count afresh.
    pub ran: Option<Effect>,
    pub attempts: u32,
    /// Held back (storm guard) until this time.
    pub not_before: i64,
    /// Held for what its workload's users write: a stored write of that
    /// workload wakes it ([`crate::lifecycle::Hold::pends`]).
    pub pends: bool,
    /// Its place in the order effects were queued: of a workload's held
    /// rollouts due at one moment, the one held first goes first (as in
    /// serve's queue), however often the others were woken meanwhile.
    pub seq: u64,
}

pub struct Simulator {
    pub shared: Arc<Shared>,
    engine: Arc<Engine>,
    /// When set, admissions go here instead of the in-process policy, and
    /// the webhook's host runs the deferred effects.
    webhook: std::sync::RwLock<Option<Webhook>>,
    settings: Value,
    webhook_rules: WebhookRules,
    pub effect_rules: Rules,
    requests: AtomicU64,
    /// While set, deferred effects wait: models writes that land before the
    /// host gets to their effects (replay's `together` step).
    hold_effects: AtomicBool,
    /// When set, every admission is recorded here.
    recorder: Mutex<Option<Vec<Recorded>>>,
    /// The effects on their way, as serve keeps them.
    pub in_flight: Arc<InFlight>,
    /// Replay's effect scheduler (see [`scheduler`]).
    jobs: Mutex<Vec<Job>>,
    /// How many effects were ever queued: each job's `seq`.
    queued: std::sync::atomic::AtomicU64,
    /// Effects an admission asked for, until its write is persisted.
    staged: Mutex<Vec<(String, Effect)>>,
    settling: AtomicBool,
}

impl Simulator {
    pub fn new(engine: Arc<Engine>, settings: Value, now: i64) -> Simulator {
        let shared = Arc::new(Shared::default());
        shared.store().now = now;
        let parsed = Settings::from_json(settings.to_string().as_bytes()).unwrap_or_default();
        Simulator {
            shared,
            engine,
            webhook: Default::default(),
            settings,
            webhook_rules: WebhookRules::embedded(),
            effect_rules: Rules {
                watch_min_interval: 30,
                ..Rules::new(parsed, Arc::new(Prover::replay()))
            },
            requests: AtomicU64::new(0),
            hold_effects: AtomicBool::new(false),
            recorder: Mutex::new(None),
            in_flight: Arc::default(),
            jobs: Mutex::default(),
            queued: Default::default(),
            staged: Mutex::default(),
            settling: AtomicBool::new(false),
        }
    }

    /// Sends every admission to `webhook` from now on (serve's admission
    /// path), whose host then runs the deferred effects.
    pub fn set_webhook(&self, webhook: Webhook) {
        *self.webhook.write().unwrap_or_else(|e| e.into_inner()) = Some(webhook);
    }

    pub fn note(&self, event: impl Into<String>) {
        crate::lifecycle::Observer::note(self.shared.as_ref(), event.into());
    }

    pub(crate) fn take_events(&self) -> Vec<String> {
        self.shared.take_events()
    }

    pub fn now(&self) -> i64 {
        self.shared.store().now
    }

    pub fn get(&self, kind: &str, namespace: &str, name: &str) -> Option<Value> {
        self.shared.store().get(kind, namespace, name).cloned()
    }

    pub fn objects(&self) -> Vec<Value> {
        self.shared.store().all().cloned().collect()
    }

    pub(crate) fn add_fault(&self, fault: Fault) {
        self.shared.add_fault(fault);
    }

    /// Starts (`true`) or stops recording every admission.
    pub fn record(&self, on: bool) {
        *lock(&self.recorder) = on.then(Vec::new);
    }

    pub(crate) fn take_recorded(&self) -> Vec<Recorded> {
        lock(&self.recorder).take().unwrap_or_default()
    }

    /// Holds deferred effects back (`true`), or lets them run again.
    pub(crate) fn hold_effects(&self, hold: bool) {
        self.hold_effects.store(hold, Ordering::SeqCst);
    }

    /// Snapshots nothing may delete: the targets of effects on their way.
    pub fn awaited_snapshots(&self) -> HashSet<Key> {
        self.in_flight.targets()
    }

    /// What Kubernetes puts in every namespace: the root-CA publisher's
    /// `kube-root-ca.crt` ConfigMap (which `excludedSources` skips by
    /// default).
    fn populate_namespace(&self, namespace: &str) {
        let mut store = self.shared.store();
        if store.list("ConfigMap", namespace).next().is_none() && store.get("ConfigMap", namespace, ROOT_CA).is_none() {
            store.persist(json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": ROOT_CA, "namespace": namespace},
                "data": {"ca.crt": "-----BEGIN CERTIFICATE-----\nreplay\n-----END CERTIFICATE-----\n"},
            }));
        }
    }

    /// Loads an initial object as-is (it predates the policy), then lets the
    /// controllers catch up.
    pub fn load(&self, object: Value) -> Result<()> {
        let object = prepare(object, None)?;
        self.populate_namespace(object.namespace().unwrap_or("default"));
        let stored = self.shared.store().persist(object);
        self.reconcile(&stored)?;
        self.settle()
    }
}
