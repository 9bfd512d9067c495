//! The requests and answers of this project's capability
//! (`config-snapshot`/`v1`), each defined once: the policy serialises them,
//! the host deserialises them once and checks its invariants on the typed
//! fields (docs/design.md, "Host capability contract"). A field added here
//! is one change on both sides, which the compiler checks.
//!
//! Kinds are typed ([`SourceKind`], [`WorkloadKind`]): a payload naming a
//! kind the operation cannot take does not deserialise, and the host
//! answers `BadRequest` before it looks at anything else. The wire names
//! are the contract's, mixed as it grew (`contentHash`, `source_kind`).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::host::host_error::HostError;

use crate::model::kinds::WorkloadKind;
use crate::model::object::ObjectExt;
use crate::model::source::SourceKind;
/// Kubewarden's reads, as its SDK defines them: `get_resource` and
/// `list_resources_by_namespace` take these, on Kubewarden and on our hosts.
pub use kubewarden_policy_sdk::host_capabilities::kubernetes::{GetResourceRequest, ListResourcesByNamespaceRequest};

/// The object that will own or reference snapshots: a workload for
/// `create_snapshot` (its uid, once it has one), a revision for `adopt`.
/// The kind is text: the two operations take different kinds, and each
/// host check says which.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Owner {
    #[serde(rename = "apiVersion", default)]
    pub api_version: String,
    pub kind: String,
    pub name: String,
    /// `None` (or empty) for an object being created: the API server gives
    /// it a uid only after the webhooks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
}

impl Owner {
    /// A workload as the owner of a snapshot it names: kind, name, and uid
    /// when it exists already (on CREATE it has none yet).
    pub fn workload(kind: WorkloadKind, workload: &Value) -> Owner {
        let text = |field: &str| workload.meta_str(field).map(str::to_string);
        Owner {
            api_version: kind.api_version().to_string(),
            kind: kind.kind().to_string(),
            name: text("name").unwrap_or_default(),
            uid: text("uid").filter(|uid| !uid.is_empty()),
        }
    }
}

/// A snapshot named by kind and name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct SnapshotRef {
    pub kind: SourceKind,
    pub name: String,
}

/// `create_snapshot`: make the snapshot the guest proposes, or keep an
/// identical one alive for `owner`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CreateSnapshot {
    /// The proposed ConfigMap or Secret. The host takes its kind, name,
    /// content, source and the source's version, and nothing else.
    pub object: Value,
    /// The workload that will reference it; `None` for a standalone
    /// revision (a bare Job), which adopts it later.
    #[serde(default)]
    pub owner: Option<Owner>,
}

/// `create_snapshot`'s answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Created {
    /// A new snapshot (`false`: an identical one existed).
    pub created: bool,
    /// The host sweeps the source's older versions after the admission.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub sweeps: bool,
}

impl Created {
    /// Whether the answer leaves the sweep to the policy: the snapshot was
    /// created, and the host does not sweep after it.
    pub fn sweep_due(self) -> bool {
        self.created && !self.sweeps
    }
}

/// `create_snapshots`: several `create_snapshot`s in one call, at most
/// [`crate::host::operation::SNAPSHOTS_PER_CALL`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CreateSnapshots {
    pub items: Vec<CreateSnapshot>,
}

/// One item's answer in `create_snapshots`: `create_snapshot`'s answer, or
/// `{"error": <host error>}`. A struct, not an untagged enum: serde's
/// untagged enums buffer every answer, and cost the module kilobytes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ItemAnswer {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<HostError>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub created: bool,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub sweeps: bool,
}

impl ItemAnswer {
    pub fn done(created: Created) -> ItemAnswer {
        ItemAnswer {
            error: None,
            created: created.created,
            sweeps: created.sweeps,
        }
    }

    pub fn failed(error: HostError) -> ItemAnswer {
        ItemAnswer {
            error: Some(error),
            created: false,
            sweeps: false,
        }
    }

    /// The item's outcome.
    pub fn outcome(self) -> Result<Created, HostError> {
        match self.error {
            Some(error) => Err(error),
            None => Ok(Created {
                created: self.created,
                sweeps: self.sweeps,
            }),
        }
    }
}

/// `create_snapshots`' answer: one per item, in order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CreatedEach {
    pub results: Vec<ItemAnswer>,
}

/// `adopt`: make `owner`, a revision being created, an owner of
/// `snapshots` once it is stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Adopt {
    pub owner: Owner,
    pub snapshots: Vec<SnapshotRef>,
}

/// The answer of a deferred effect (`adopt`, `patch_workload`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Queued {
    /// `false`: there was nothing to do (no snapshot named exists).
    pub queued: bool,
}

/// `delete_snapshot`: delete it only if it is still that object, at that
/// version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeleteSnapshot {
    pub kind: SourceKind,
    pub name: String,
    pub uid: String,
    #[serde(rename = "resourceVersion", default, skip_serializing_if = "Option::is_none")]
    pub resource_version: Option<String>,
}

/// `delete_snapshot`'s answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Deleted {
    pub deleted: bool,
}

/// The content of a source a watch rollout was decided for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SourceContent {
    pub kind: SourceKind,
    pub name: String,
    /// sha256 of the content, hex.
    pub content_hash: String,
    /// The source's resourceVersion before the admitted change (`""` for
    /// a source the change creates).
    #[serde(default)]
    pub resource_version: String,
}

/// `patch_workload`: a watch rollout, deferred until the source as stored
/// holds `source.contentHash` (docs/design.md, "Deferred effects").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PatchWorkload {
    pub api_version: String,
    pub kind: WorkloadKind,
    pub name: String,
    #[serde(default)]
    pub resource_version: String,
    /// The rollbacks the workload had when this was decided: one more
    /// voids it.
    #[serde(default)]
    pub rollbacks: u64,
    /// JSON Patch operations inside the pod template.
    pub patch: Vec<Value>,
    pub source: SourceContent,
    /// The snapshot the workload will reference.
    pub snapshot: String,
    /// The keys the snapshot holds (`None`: all of them). A list, not a
    /// set, on the wire: the host bounds its length before anything
    /// collapses duplicates.
    #[serde(default)]
    pub keys: Option<Vec<String>>,
}

/// A source named by kind and name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NamedSource {
    pub kind: SourceKind,
    pub name: String,
}

/// `snapshot_name`: the name a snapshot of this content gets.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotName {
    pub source: NamedSource,
    pub content_hash: String,
    /// Snapshots a workload runs now, named among the aliases if they hold
    /// this content.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub current: Vec<String>,
}

/// `snapshot_name`'s answer: the name, and the names snapshots of the same
/// content already carry in the namespace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Names {
    pub name: String,
    #[serde(default)]
    pub aliases: Vec<String>,
    /// Set when a name this content has had in the namespace, under any
    /// key or scheme of the installation, is in its revocation record: no
    /// snapshot of it is made again (docs/design.md, "Revocation").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoked: Option<Revoked>,
}

/// The revocation of a content, as `snapshot_name` answers it: the
/// record's words, which a message repeats. Read through `Value`, which
/// the policy parses anyway: a derived deserializer costs the module
/// kilobytes, for an answer a workload meets once in a leak's life.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "Value")]
pub struct Revoked {
    /// The revoked snapshot's name (the one the record holds).
    pub snapshot: String,
    /// When (unix seconds) and by whom, as recorded.
    pub at: i64,
    pub by: String,
}

impl TryFrom<Value> for Revoked {
    type Error = &'static str;

    fn try_from(value: Value) -> Result<Revoked, &'static str> {
        let text = |field: &str| value[field].as_str().map(str::to_string);
        Ok(Revoked {
            snapshot: text("snapshot").ok_or("a revocation names its snapshot")?,
            at: value["at"].as_i64().ok_or("a revocation says when")?,
            by: text("by").ok_or("a revocation says by whom")?,
        })
    }
}

impl Revoked {
    pub fn of(snapshot: &str, revocation: &crate::model::revocation::Revocation) -> Revoked {
        Revoked {
            snapshot: snapshot.to_string(),
            at: revocation.at,
            by: revocation.by.clone(),
        }
    }
}

impl std::fmt::Display for Revoked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&crate::model::revocation::said(self.at, &self.by))
    }
}

impl Names {
    /// Whether `snapshot` holds this content.
    pub fn include(&self, snapshot: &str) -> bool {
        self.name == snapshot || self.aliases.iter().any(|a| a == snapshot)
    }
}

/// `list_referencing`: the `kind` workloads of `namespace` whose template
/// references the source, pruned to `field_masks`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListReferencing {
    pub kind: WorkloadKind,
    pub namespace: String,
    pub source_kind: SourceKind,
    pub source_name: String,
    #[serde(default)]
    pub field_masks: Option<Vec<String>>,
}

/// `now`'s answer: the host's clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Clock {
    pub unix: i64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The wire form is the contract docs/design.md spells out: the names
    /// a host of another language reads.
    #[test]
    fn a_watch_rollout_is_written_as_the_contract_names_it() {
        let request = PatchWorkload {
            api_version: "apps/v1".into(),
            kind: WorkloadKind::from_kind("Deployment").unwrap(),
            name: "web".into(),
            resource_version: "7".into(),
            rollbacks: 1,
            patch: vec![json!({"op": "replace", "path": "/spec/template/x", "value": 1})],
            source: SourceContent {
                kind: SourceKind::Secret,
                name: "app".into(),
                content_hash: "ab".into(),
                resource_version: "3".into(),
            },
            snapshot: "app-1".into(),
            keys: None,
        };
        let wire = serde_json::to_value(&request).unwrap();
        assert_eq!(wire["apiVersion"], "apps/v1");
        assert_eq!(wire["kind"], "Deployment");
        assert_eq!(wire["resourceVersion"], "7");
        assert_eq!(
            wire["source"],
            json!({"kind": "Secret", "name": "app", "contentHash": "ab", "resourceVersion": "3"})
        );
        assert_eq!(wire["keys"], Value::Null);
        assert_eq!(serde_json::from_value::<PatchWorkload>(wire).unwrap(), request);
    }

    #[test]
    fn a_kind_the_operation_cannot_take_does_not_deserialise() {
        let mut wire = json!({"apiVersion": "v1", "kind": "Pod", "name": "p", "patch": [],
            "source": {"kind": "ConfigMap", "name": "app", "contentHash": "ab"}, "snapshot": "s"});
        assert!(
            serde_json::from_value::<PatchWorkload>(wire.clone()).is_err(),
            "a Pod is no workload"
        );
        wire["kind"] = json!("StatefulSet");
        wire["source"]["kind"] = json!("Service");
        assert!(
            serde_json::from_value::<PatchWorkload>(wire.clone()).is_err(),
            "a Service is no source"
        );
        wire["source"]["kind"] = json!("ConfigMap");
        assert!(serde_json::from_value::<PatchWorkload>(wire).is_ok());
    }

    #[test]
    fn an_item_answer_is_an_error_or_a_creation() {
        let wire = json!({"results": [{"created": true, "sweeps": true}, {"created": false},
            {"error": {"code": "Conflict", "message": "again"}}]});
        let each: CreatedEach = serde_json::from_value(wire).unwrap();
        let sweeps: Vec<Option<bool>> = each
            .results
            .into_iter()
            .map(|r| r.outcome().ok().map(Created::sweep_due))
            .collect();
        assert_eq!(sweeps, [Some(false), Some(false), None]);
        assert!(Created {
            created: true,
            sweeps: false
        }
        .sweep_due());
        let failed = ItemAnswer::failed(HostError::new(crate::host::host_error::Code::Refused, "no"));
        let failed = serde_json::to_value(failed).unwrap();
        assert_eq!(failed, json!({"error": {"code": "Refused", "message": "no"}}));
        let done = ItemAnswer::done(Created {
            created: true,
            sweeps: true,
        });
        assert_eq!(
            serde_json::to_value(done).unwrap(),
            json!({"created": true, "sweeps": true})
        );
    }
}
