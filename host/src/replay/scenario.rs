//! The replay scenario format (docs/design.md, "Scenario format").

use config_snapshot_policy::host::host_error::Code;
use serde::Deserialize;
use serde_json::Value;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub settings: Value,
    #[serde(default)]
    pub objects: Vec<Value>,
    /// RFC 3339 start time of the scenario clock.
    #[serde(default)]
    pub now: Option<String>,
    /// Storm guard for watch rollouts (Go duration); the host default is 30s.
    #[serde(default, rename = "watchMinInterval")]
    pub watch_min_interval: Option<String>,
    pub steps: Vec<Step>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub enum Step {
    Apply(Value),
    /// `apply` with `dryRun: All`.
    DryRunApply(Value),
    Edit(Edit),
    Delete(Deletion),
    RolloutUndo(Undo),
    RolloutRestart(Ref),
    /// `kubectl create job NAME --from=cronjob/FROM`.
    CreateJob(CreateJob),
    AdvanceTime(String),
    Review(String),
    Fault(FaultSpec),
    Expect(Expect),
    Assert(Vec<Check>),
    /// Runs its steps with deferred host effects held until all have
    /// landed: concurrent changes, as a busy host sees them.
    Together(Vec<Value>),
    /// Runs `steps` `times` times; `{{i}}` in any string becomes 1, 2, ….
    Repeat(Repeat),
    /// The host restarts: every effect it had queued is lost (`null`).
    RestartHost(Option<Value>),
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Repeat {
    pub times: u32,
    pub steps: Vec<Value>,
}

/// `delete: {kind, name}`, or `{kind, selector}` for every object of the
/// kind that matches (for objects whose names a controller makes up).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Deletion {
    pub kind: String,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub selector: Option<String>,
    #[serde(default = "default_ns")]
    pub namespace: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateJob {
    /// The CronJob.
    pub from: String,
    pub name: String,
    #[serde(default = "default_ns")]
    pub namespace: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Ref {
    pub kind: String,
    pub name: String,
    #[serde(default = "default_ns")]
    pub namespace: String,
}

fn default_ns() -> String {
    "default".into()
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Edit {
    pub kind: String,
    pub name: String,
    #[serde(default = "default_ns")]
    pub namespace: String,
    pub set: Value,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Undo {
    pub kind: String,
    pub name: String,
    #[serde(default = "default_ns")]
    pub namespace: String,
    #[serde(default)]
    pub to_revision: Option<i64>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultSpec {
    pub operation: String,
    pub error: String,
    /// What kind of failure the host reports to the guest
    /// (`config_snapshot_policy::host::host_error::Code`); by default an outage
    /// (`Unavailable`). `Unsupported` plays a host without the capability.
    #[serde(default = "outage")]
    pub code: Code,
    /// How many calls fail; absent means every call from now on.
    #[serde(default)]
    pub times: Option<u32>,
    /// How many calls succeed before the first failure.
    #[serde(default)]
    pub after: u32,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Expect {
    #[serde(default)]
    pub allowed: Option<bool>,
    /// Each entry must be a substring of some warning; `[]` means none.
    #[serde(default)]
    pub warnings: Option<Vec<String>>,
    #[serde(default)]
    pub message_contains: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub enum Check {
    EffectiveConfig(EffectiveConfig),
    Exists(Ref),
    Absent(Ref),
    Count(Count),
    JsonPath(JsonPathCheck),
    /// The lifecycle's invariants over the whole cluster.
    Invariants(Vec<Invariant>),
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum Invariant {
    /// No template names a snapshot that does not exist.
    NothingDangles,
    /// Every snapshot is owned, referenced or awaited.
    GarbageBounded,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EffectiveConfig {
    pub kind: String,
    pub name: String,
    #[serde(default = "default_ns")]
    pub namespace: String,
    /// `configmap/NAME` or `secret/NAME`.
    pub source: String,
    /// The expected key → value map; Secret values are given decoded.
    pub data: Value,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Count {
    pub kind: String,
    #[serde(default)]
    pub selector: Option<String>,
    #[serde(default = "default_ns")]
    pub namespace: String,
    pub equals: usize,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JsonPathCheck {
    pub kind: String,
    /// The object; or, with `snapshotOf`, none.
    #[serde(default)]
    pub name: String,
    /// Instead of `name`: the object a workload's pods read `source` from
    /// (its snapshot), as `effectiveConfig` finds it. A Secret snapshot's
    /// name depends on the namespace and the key (docs/hash-spec.md), so a
    /// scenario that runs in any namespace names it this way.
    #[serde(default, rename = "snapshotOf")]
    pub snapshot_of: Option<SnapshotOf>,
    #[serde(default = "default_ns")]
    pub namespace: String,
    /// RFC 9535 JSONPath; a leading `$` is optional (`.spec.replicas`).
    pub path: String,
    pub equals: Value,
}

/// A workload and one of its sources: `snapshotOf` in a `jsonPath` check.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotOf {
    pub kind: String,
    pub name: String,
    /// `configmap/NAME` or `secret/NAME`.
    pub source: String,
}

fn outage() -> Code {
    Code::Unavailable
}
