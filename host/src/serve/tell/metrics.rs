//! Prometheus metrics. Labels come from small fixed sets (never object
//! names or request fields verbatim), so a hostile request cannot blow up
//! the series count, and no label can carry Secret data.

use std::time::Instant;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub kind: &'static str,
    pub operation: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DecisionLabels {
    /// One of [`DECISIONS`].
    pub decision: &'static str,
}

/// Every admission decision serve counts.
pub(crate) const DECISIONS: [&str; 7] = [
    "allowed", "mutated", "denied", "error", "excluded", "snapshot", "unnamed",
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OperationLabels {
    pub operation: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    pub kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VerbLabels {
    /// One of [`VERBS`].
    pub verb: &'static str,
}

/// The verbs of serve's own API requests outside its watches.
pub(crate) const VERBS: [&str; 5] = ["get", "list", "create", "patch", "delete"];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HeldLabels {
    /// What holds the rollout: `storm_guard` or `rollout_window`.
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EffectLabels {
    /// adopt or patch_workload.
    pub effect: &'static str,
    /// done, dropped, failed or retried.
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefusedLabels {
    /// Why a request was refused before any work (the intake's `Refusal`
    /// labels, each started at zero by the intake).
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SecretLabels {
    /// One of [`GUARDED_SECRETS`].
    pub secret: &'static str,
}

/// The signing key's Secret, as a label.
pub(crate) const SIGNING_KEY: &str = "signing-key";
/// serve's own webhook CA's Secret, as a label.
pub(crate) const WEBHOOK_CA: &str = "webhook-ca";
/// The Secrets the key's guard guards (serve/trust/guarded.rs).
pub(crate) const GUARDED_SECRETS: [&str; 2] = [SIGNING_KEY, WEBHOOK_CA];

type HistogramFamily = Family<RequestLabels, Histogram, fn() -> Histogram>;

/// The webhook listener's connections (serve/intake/listener.rs).
#[derive(Clone, Default)]
pub struct ConnectionMetrics {
    /// Open now, their TLS handshakes done.
    pub open: Gauge,
    /// Refused: no handshake slot, the peer's share taken, or every place
    /// busy.
    pub refused: Counter,
    /// Closed while idle, never having passed the door, to give their
    /// place to a new connection.
    pub evicted: Counter,
    /// Requests answered with an error before any work: not at the door's
    /// path, the namespace's share taken, the body too large, over the
    /// budget of bodies, or too slow.
    pub requests_refused: Family<RefusedLabels, Counter>,
    /// Reviews whose first bytes named no namespace, charged to the share
    /// such reviews have together (serve/intake/shares.rs): never the API
    /// server's, which name it first.
    pub unsorted: Counter,
}

pub struct Metrics {
    registry: Registry,
    pub latency: HistogramFamily,
    pub decisions: Family<DecisionLabels, Counter>,
    pub snapshots_created: Counter,
    pub adoptions: Counter,
    pub deletions: Counter,
    pub rollouts: Counter,
    pub host_call_errors: Family<OperationLabels, Counter>,
    /// Where an admission's time goes: each host call the policy makes,
    /// by operation (its API round trips, cache reads and waits for reads
    /// made ahead). An admission's time less its calls' is the policy's.
    pub host_call_duration: Family<OperationLabels, Histogram, fn() -> Histogram>,
    pub effects: Family<EffectLabels, Counter>,
    pub queue_depth: Gauge,
    /// Seconds from a deferred effect's enqueue to its end.
    pub effect_wait: Histogram,
    /// 1 while this replica holds the Lease (or leads alone), else 0.
    pub leader: Gauge,
    /// Periodic passes this replica ran (only the leader runs them).
    pub resync_passes: Counter,
    /// Objects that carry config-snapshot's label but no valid signature,
    /// as the last pass found them: left alone, and worth a look.
    pub unproven: Gauge,
    pub connections: ConnectionMetrics,
    /// Objects in the watch caches, by kind (sources are kept without
    /// their data: docs/security.md).
    pub cache_objects: Family<KindLabels, Gauge>,
    /// Watch rollouts held now, by what holds them.
    pub held: Family<HeldLabels, Gauge>,
    /// How long the rollout held longest has waited, in seconds: a
    /// rollout the storm guard holds far beyond its interval cannot go
    /// (the ConfigSnapshotRolloutHeldTooLong alert).
    pub oldest_held: Family<HeldLabels, Gauge>,
    /// serve's own requests to the API server outside its watches (reads
    /// as fresh as a request, and every write), by verb: what one
    /// admission costs the API server, apart from what others do.
    pub api_requests: Family<VerbLabels, Counter>,
    /// 1 while a guarded Secret holds a version serve did not take (written
    /// while its guard was not in force): serve keeps what it holds.
    pub untrusted_secrets: Family<SecretLabels, Gauge>,
}

fn host_call_buckets() -> Histogram {
    // 50 µs .. ~1 s: a cache read is microseconds, an API round trip
    // milliseconds.
    Histogram::new([
        0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
    ])
}

fn latency_buckets() -> Histogram {
    // 0.5 ms .. ~1 s: an admission is a few hundred µs; the webhook
    // timeout is the upper bound that matters.
    Histogram::new([
        0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    ])
}

impl Default for Metrics {
    #[expect(
        clippy::too_many_lines,
        reason = "a table: each metric registered with its help text"
    )]
    fn default() -> Self {
        let mut registry = Registry::with_prefix("config_snapshot");
        let latency: HistogramFamily = Family::new_with_constructor(latency_buckets);
        let decisions = Family::<DecisionLabels, Counter>::default();
        let snapshots_created = Counter::default();
        let adoptions = Counter::default();
        let deletions = Counter::default();
        let rollouts = Counter::default();
        let host_call_errors = Family::<OperationLabels, Counter>::default();
        let host_call_duration: Family<OperationLabels, Histogram, fn() -> Histogram> =
            Family::new_with_constructor(host_call_buckets);
        registry.register(
            "host_call_duration_seconds",
            "Time the policy's host calls took, by operation",
            host_call_duration.clone(),
        );
        let effects = Family::<EffectLabels, Counter>::default();
        let queue_depth = Gauge::default();
        let leader = Gauge::default();
        // 10 ms .. ~5 min: a rollout may wait out the storm guard.
        let effect_wait = Histogram::new([0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0, 60.0, 120.0, 300.0]);
        registry.register(
            "effect_wait_seconds",
            "Time from a deferred effect's enqueue to its end (done, dropped or given up)",
            effect_wait.clone(),
        );
        let resync_passes = Counter::default();
        let unproven = Gauge::default();
        registry.register(
            "unproven_snapshots",
            "Objects labelled as config-snapshot's without a valid signature, as the last pass found them (never swept, adopted or reused)",
            unproven.clone(),
        );
        registry.register(
            "leader",
            "1 while this replica runs the resync and the sweep",
            leader.clone(),
        );
        registry.register(
            "resync_passes",
            "Periodic passes run by this replica",
            resync_passes.clone(),
        );
        registry.register(
            "admission_duration_seconds",
            "Time to answer one AdmissionReview",
            latency.clone(),
        );
        registry.register("admission_decisions", "AdmissionReview answers", decisions.clone());
        registry.register("snapshots_created", "Snapshots created", snapshots_created.clone());
        registry.register(
            "snapshot_adoptions",
            "Snapshots given a revision as owner",
            adoptions.clone(),
        );
        registry.register("snapshot_deletions", "Orphaned snapshots deleted", deletions.clone());
        registry.register(
            "watch_rollouts",
            "Workloads patched to a new snapshot after a source change",
            rollouts.clone(),
        );
        registry.register(
            "host_call_errors",
            "Host calls from the policy that failed",
            host_call_errors.clone(),
        );
        registry.register("deferred_effects", "Deferred effects by outcome", effects.clone());
        // Counted from zero: `increase()` of a series born at 1 is 0, so
        // the first failure would never alert, and a dashboard would show
        // nothing rather than zero.
        for effect in crate::lifecycle::Effect::LABELS {
            let _ = effects.get_or_create(&EffectLabels {
                effect,
                outcome: "failed",
            });
        }
        for decision in DECISIONS {
            let _ = decisions.get_or_create(&DecisionLabels { decision });
        }
        for operation in config_snapshot_policy::host::operation::Operation::ALL {
            let _ = host_call_errors.get_or_create(&OperationLabels {
                operation: operation.name(),
            });
        }
        let cache_objects = Family::<KindLabels, Gauge>::default();
        registry.register(
            "cache_objects",
            "Objects in serve's watch caches, by kind",
            cache_objects.clone(),
        );
        let held = Family::<HeldLabels, Gauge>::default();
        registry.register(
            "rollouts_held",
            "Watch rollouts held now, by what holds them",
            held.clone(),
        );
        let oldest_held = Family::<HeldLabels, Gauge>::default();
        for reason in crate::lifecycle::Hold::LABELS {
            let label = HeldLabels { reason };
            let _ = held.get_or_create(&label);
            let _ = oldest_held.get_or_create(&label);
        }
        registry.register(
            "oldest_held_rollout_seconds",
            "How long the rollout held longest has waited, by what holds it",
            oldest_held.clone(),
        );
        let api_requests = Family::<VerbLabels, Counter>::default();
        for verb in VERBS {
            let _ = api_requests.get_or_create(&VerbLabels { verb });
        }
        registry.register(
            "api_requests",
            "Requests serve made to the API server outside its watches, by verb",
            api_requests.clone(),
        );
        let untrusted_secrets = Family::<SecretLabels, Gauge>::default();
        for secret in GUARDED_SECRETS {
            let _ = untrusted_secrets.get_or_create(&SecretLabels { secret });
        }
        registry.register(
            "untrusted_secret_version",
            "1 while a guarded Secret (the signing key's, the webhook CA's) holds a version written while its guard was not in force, which serve did not take",
            untrusted_secrets.clone(),
        );
        let connections = ConnectionMetrics::default();
        registry.register(
            "webhook_connections",
            "Connections to the webhook open now (TLS done)",
            connections.open.clone(),
        );
        registry.register(
            "webhook_connections_refused",
            "Connections to the webhook refused: no handshake slot, the peer's share taken, or none unproven and idle to give way",
            connections.refused.clone(),
        );
        registry.register(
            "webhook_connections_evicted",
            "Idle connections to the webhook that had not passed the door, closed to give their place to a new one",
            connections.evicted.clone(),
        );
        registry.register(
            "webhook_requests_refused",
            "Requests to the webhook answered with an error before any work, by why",
            connections.requests_refused.clone(),
        );
        registry.register(
            "webhook_reviews_unsorted",
            "Reviews whose first 4 KiB named no namespace, charged to one share together",
            connections.unsorted.clone(),
        );
        registry.register(
            "deferred_effects_queued",
            "Deferred effects waiting to run",
            queue_depth.clone(),
        );
        Metrics {
            registry,
            latency,
            decisions,
            snapshots_created,
            adoptions,
            deletions,
            rollouts,
            host_call_errors,
            host_call_duration,
            effects,
            queue_depth,
            effect_wait,
            leader,
            resync_passes,
            unproven,
            connections,
            cache_objects,
            held,
            oldest_held,
            api_requests,
            untrusted_secrets,
        }
    }
}

impl Metrics {
    /// Counts one AdmissionReview answer.
    pub fn decided(&self, decision: &'static str) {
        self.decisions.get_or_create(&DecisionLabels { decision }).inc();
    }

    /// Times one admission from `started` until the guard drops, whichever
    /// way it ends.
    pub(crate) fn time_admission(&self, labels: RequestLabels, started: Instant) -> AdmissionTimer<'_> {
        AdmissionTimer {
            metrics: self,
            labels,
            started,
        }
    }

    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    pub fn effect(&self, effect: &'static str, outcome: &'static str) {
        self.effects.get_or_create(&EffectLabels { effect, outcome }).inc();
    }

    /// The gauge that says whether guarded Secret `secret` (one of
    /// [`GUARDED_SECRETS`]) holds a version serve did not take.
    pub(crate) fn untrusted(&self, secret: &'static str) -> Gauge {
        self.untrusted_secrets.get_or_create(&SecretLabels { secret }).clone()
    }
}

/// A request's kind as a label: one of the kinds the webhook handles.
pub(crate) fn kind_label(kind: &str) -> &'static str {
    config_snapshot_policy::model::kinds::KINDS
        .iter()
        .find(|k| k.kind == kind && !k.handled().is_empty())
        .map_or("other", |k| k.kind)
}

pub(crate) fn operation_label(operation: &str) -> &'static str {
    ["CREATE", "UPDATE", "DELETE", "CONNECT"]
        .into_iter()
        .find(|o| *o == operation)
        .unwrap_or("other")
}

/// A host call's operation as a label.
pub(crate) fn host_operation_label(operation: &str) -> &'static str {
    config_snapshot_policy::host::operation::Operation::ALL
        .into_iter()
        .find(|o| o.name() == operation)
        .map_or("other", |o| o.name())
}

/// Observes an admission's duration when dropped ([`Metrics::time_admission`]).
pub(crate) struct AdmissionTimer<'a> {
    metrics: &'a Metrics,
    labels: RequestLabels,
    started: Instant,
}

impl Drop for AdmissionTimer<'_> {
    fn drop(&mut self) {
        self.metrics
            .latency
            .get_or_create(&self.labels)
            .observe(self.started.elapsed().as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_clamped_to_known_values() {
        assert_eq!(kind_label("Deployment"), "Deployment");
        assert_eq!(kind_label("x".repeat(300).as_str()), "other");
        assert_eq!(operation_label("PATCH"), "other");
        assert_eq!(host_operation_label("create_snapshot"), "create_snapshot");
        assert_eq!(host_operation_label("secret-value"), "other");
    }

    #[test]
    fn counters_show_up_in_the_exposition() {
        let m = Metrics::default();
        m.snapshots_created.inc();
        m.effect("adopt", "done");
        let text = m.encode();
        assert!(text.contains("config_snapshot_snapshots_created_total 1"), "{text}");
        assert!(
            text.contains(r#"config_snapshot_deferred_effects_total{effect="adopt",outcome="done"} 1"#),
            "{text}"
        );
    }
}
