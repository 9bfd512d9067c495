//! What a history is: the workload it is asked of, and for each kept
//! revision which config each of its sources runs.

use anyhow::{anyhow, bail, Result};
use config_snapshot_policy::model::kinds::{self, WorkloadKind};
use serde::Serialize;
use serde_json::Value;

use super::values::{KeyChanges, Values};

/// A workload named the way kubectl takes it: `deploy/web`,
/// `statefulset/db`, `daemonsets/agent`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub kind: WorkloadKind,
    pub name: String,
}

impl Target {
    pub fn parse(text: &str) -> Result<Target> {
        let (kind, name) = text
            .split_once('/')
            .filter(|(_, n)| !n.is_empty())
            .ok_or_else(|| anyhow!("{text:?}: name a workload as KIND/NAME, e.g. deploy/web"))?;
        let Some(kind) = kinds::named(kind).and_then(|k| WorkloadKind::from_kind(k.kind)) else {
            bail!("{kind}: only workloads (Deployments, StatefulSets, DaemonSets, CronJobs) keep revisions");
        };
        Ok(Target {
            kind,
            name: name.to_string(),
        })
    }

    /// The kind that holds this workload's revisions.
    pub(crate) fn revision_kind(&self) -> &'static str {
        self.kind.revisions().kind
    }

    pub(super) fn template_path(&self) -> &'static str {
        self.kind.revisions().template.unwrap_or_default()
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.kind.kind().to_ascii_lowercase(), self.name)
    }
}

/// How a revision gets a source's config.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase", tag = "state")]
pub enum State {
    /// Pinned to an immutable snapshot.
    Snapshot { snapshot: String },
    /// It named a snapshot that no longer exists.
    Collected { snapshot: String },
    /// It names a snapshot `config-snapshot revoke` deleted: it can never
    /// run again (docs/design.md, "Revocation").
    Revoked { snapshot: String, at: String, by: String },
    /// Checksum mode (a host without the write capability): the live
    /// source, with a hash that rolls the workload out when it changes.
    Checksum,
    /// The live source, not opted in.
    Live,
    /// Optional and absent when the revision was made.
    OptionalMissing,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SourceConfig {
    /// `configmap/app-config`.
    pub source: String,
    #[serde(flatten)]
    pub state: State,
    /// Since the previous revision kept, when both have the values.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub keys: Option<KeyChanges>,
    #[serde(skip)]
    pub(super) values: Option<Values>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Revision {
    pub revision: i64,
    /// The ReplicaSet or ControllerRevision.
    pub name: String,
    pub age_seconds: Option<i64>,
    pub current: bool,
    /// The revisions this one was before a rollback made it current again.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub rollback_of: Vec<i64>,
    pub images: Vec<String>,
    pub sources: Vec<SourceConfig>,
    #[serde(skip)]
    pub(super) template: Value,
}

#[derive(Debug, Clone, Serialize)]
pub struct History {
    pub workload: String,
    pub namespace: String,
    pub revisions: Vec<Revision>,
}

/// Said the way `history` and `diff` print it.
impl std::fmt::Display for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            State::Snapshot { snapshot } => write!(f, "snapshot {snapshot}"),
            State::Collected { snapshot } => write!(f, "snapshot {snapshot} no longer exists (collected or deleted)"),
            State::Revoked { snapshot, at, by } => {
                write!(f, "snapshot {snapshot} revoked at {at} by {by}: cannot run again")
            }
            State::Checksum => f.write_str("checksum mode, no snapshot (the live source)"),
            State::Live => f.write_str("not snapshotted (the live source)"),
            State::OptionalMissing => f.write_str("optional, and missing"),
        }
    }
}
