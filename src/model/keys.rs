//! The annotation and label names that form the policy's public interface.
//!
//! They live in one place because the host, the docs and the tests all key off
//! the exact strings; a typo here is a silent behaviour change.

use crate::model::object::ObjectExt;
pub const PREFIX: &str = "config-snapshot.io/";

// Workload annotations (user input).
pub(crate) const SNAPSHOT: &str = "config-snapshot.io/snapshot";
pub const WATCH: &str = "config-snapshot.io/watch";
pub(crate) const EXCLUDE: &str = "config-snapshot.io/exclude";
pub const RENEW_DURATION: &str = "config-snapshot.io/renew-duration";
pub const ROLLOUT_WINDOW: &str = "config-snapshot.io/rollout-window";
pub const ROLLOUT_WINDOW_ZONE: &str = "config-snapshot.io/rollout-window-zone";
pub const WATCH_MODE: &str = "config-snapshot.io/watch-mode";
/// How long a workload's watched sources must be quiet before it rolls.
pub const SETTLE: &str = "config-snapshot.io/settle";
/// A user's approval of pending watch rollouts (`approval`).
pub const APPROVE: &str = "config-snapshot.io/approve";

/// The workload annotations users write and serve's own writes never
/// change: its opt-in and how its watch rolls. The identity guard holds
/// serve's account to that (deploy/serve/identityguard.yaml, `userSet`;
/// host/tests/deploy.rs checks the list is this one), so that a stolen
/// token can neither opt a workload in or out nor loosen its rollouts (a
/// `watch-mode: approve` made `roll`, a window widened). [`APPROVE`] is the
/// user's too, but serve takes an approval off once it rolled it: the
/// guard lets serve's account only take entries off it.
pub const USER_SET: [&str; 8] = [
    SNAPSHOT,
    WATCH,
    EXCLUDE,
    RENEW_DURATION,
    ROLLOUT_WINDOW,
    ROLLOUT_WINDOW_ZONE,
    WATCH_MODE,
    SETTLE,
];

// Source annotations (user input, on a ConfigMap or Secret): what its edits
// do to the workloads that read it (`readers`).
pub const READERS: &str = "config-snapshot.io/readers";

// Pod template annotations (policy output).
pub const SNAPSHOTS: &str = "config-snapshot.io/snapshots";
pub(crate) const RENEWED_AT: &str = "config-snapshot.io/renewed-at";
pub const CHECKSUM_PREFIX: &str = "config-snapshot.io/checksum-";

// Workload metadata written by config-snapshot itself (see `records`): kept
// out of the pod template, so writing them never rolls pods.
pub const ROLLBACK: &str = "config-snapshot.io/rollback";
pub const WATCH_ROLLOUT: &str = "config-snapshot.io/watch-rollout";
/// What waits for an approval (or, in notify mode, was announced): the
/// host writes it, as it finds a held change (`approval`).
pub const PENDING: &str = "config-snapshot.io/pending";
/// When a settling workload's changes may roll (unix seconds): the host
/// moves it on with every change it records as pending.
pub const SETTLE_UNTIL: &str = "config-snapshot.io/settle-until";
/// Both, the host's bookkeeping on a workload: no user write changes them.
pub const RECORDS: [&str; 2] = [ROLLBACK, WATCH_ROLLOUT];

// Snapshot metadata.
pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
pub const MANAGED_BY_VALUE: &str = "config-snapshot";
pub(crate) const SOURCE_LABEL: &str = "config-snapshot.io/source";
pub const SOURCE_NAME: &str = "config-snapshot.io/source-name";
pub const CONTENT_HASH: &str = "config-snapshot.io/content-hash";
pub const SOURCE_RESOURCE_VERSION: &str = "config-snapshot.io/source-resource-version";
/// Set by the host when an admission reuses an existing, unowned snapshot:
/// the sweep counts a snapshot's age from its last use, not its creation.
pub const LAST_USED_AT: &str = "config-snapshot.io/last-used-at";

// The revocation record (`revocation`): one ConfigMap per namespace,
// written by `config-snapshot revoke`, read by the policy and the host.
/// The label that makes a ConfigMap named `revocation::RECORD` the record:
/// an unlabelled one of that name is a user's, and means nothing.
pub const RECORD_LABEL: &str = "config-snapshot.io/record";
pub const RECORD_LABEL_VALUE: &str = "revocations";
/// The record's entries: an annotation, not `data`, so that serve's cache
/// of ConfigMaps (which keeps config-snapshot's annotations and no data)
/// answers the reads of it.
pub const REVOCATIONS: &str = "config-snapshot.io/revocations";

/// Where a client-side `kubectl apply` (and Argo CD's default sync) keeps
/// the whole manifest it applied: a Secret's `stringData` in plain text
/// among it. Not config-snapshot's; named here because the host keeps it
/// out of serve's cache, and controllers do not copy it.
pub const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Added by the Deployment controller to ReplicaSet templates; never part of
/// what the user wrote, so it is ignored when comparing templates.
pub(crate) const POD_TEMPLATE_HASH: &str = "pod-template-hash";

/// Added by controllers to the pod templates they copy, besides
/// `pod-template-hash`: Argo Rollouts' hash on its ReplicaSets, and the Job
/// controller's labels on a Job's template (a CronJob's Jobs included).
/// Ignored when comparing templates.
pub(crate) const CONTROLLER_TEMPLATE_LABELS: [&str; 5] = [
    "rollouts-pod-template-hash",
    "batch.kubernetes.io/controller-uid",
    "batch.kubernetes.io/job-name",
    "controller-uid",
    "job-name",
];

/// Whether an object (as JSON) carries the snapshot label. The host's
/// invariants, the sweep, adoption and the resync all decide "ours or not"
/// by this one test.
pub fn is_snapshot(object: &serde_json::Value) -> bool {
    object.label(MANAGED_BY) == Some(MANAGED_BY_VALUE)
}

/// The source a snapshot was taken from, if `object` is one: recognised by
/// what it is (our label and the source-name annotation), not by whether a
/// template's mapping happens to name it.
pub fn snapshot_source(object: &serde_json::Value) -> Option<&str> {
    if !is_snapshot(object) {
        return None;
    }
    object.annotation(SOURCE_NAME).filter(|s| !s.is_empty())
}

/// Whether a pod template annotation is one the policy writes (and so must be
/// dropped before comparing templates).
pub fn is_policy_template_annotation(key: &str) -> bool {
    key == SNAPSHOTS || key == RENEWED_AT || key.starts_with(CHECKSUM_PREFIX)
}
