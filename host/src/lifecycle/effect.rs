//! Deferred effects: writes an admission asks for that run after it, once
//! it is allowed and persisted (docs/design.md, "Deferred effects").

use config_snapshot_policy::model::object::ObjectExt;
use std::collections::BTreeSet;

use config_snapshot_policy::host::contract::PatchWorkload;
use config_snapshot_policy::model::kinds::WorkloadKind;
use config_snapshot_policy::model::source::SourceId;
use serde_json::Value;

use config_snapshot_policy::host::contract::SnapshotRef;

use crate::cluster::Key;

/// A deferred write: run after the admission, once its preconditions hold.
#[derive(Debug, Clone, PartialEq)]
pub enum Effect {
    /// A revision becomes an owner of the snapshots its template names.
    Adopt {
        namespace: String,
        owner_kind: String,
        owner_name: String,
        snapshots: Vec<SnapshotRef>,
        /// The object the admission that asked for it reviewed: only the
        /// one the API server stored for that request is adopted (`None`:
        /// the periodic pass's, derived from the live object itself).
        stored_as: Option<StoredAs>,
    },
    /// A watch rollout: the `patch_workload` request the policy made, as
    /// the host checked it.
    Patch(PatchIntent),
    /// After a new snapshot of `source`: its older versions that nothing
    /// owns, uses or references go (docs/design.md, "Garbage collection",
    /// The sweep). The host's own, off the admission's latency; `keep` is
    /// the snapshot just made.
    Sweep {
        namespace: String,
        source: SourceId,
        keep: String,
    },
}

impl Effect {
    /// The snapshot a watch patch will make its workload reference: it must
    /// not be swept while the patch waits.
    pub fn target(&self) -> Option<Key> {
        match self {
            Effect::Patch(intent) => Some(intent.target()),
            Effect::Adopt { .. } | Effect::Sweep { .. } => None,
        }
    }

    /// Every [`Effect::label`]: serve's metrics start each at zero, so that
    /// an alert on the first failure sees a counter move from 0 to 1.
    pub(crate) const LABELS: [&'static str; 3] = ["adopt", "patch_workload", "sweep"];

    pub fn label(&self) -> &'static str {
        match self {
            Effect::Adopt { .. } => "adopt",
            Effect::Patch { .. } => "patch_workload",
            Effect::Sweep { .. } => "sweep",
        }
    }

    pub fn namespace(&self) -> &str {
        match self {
            Effect::Adopt { namespace, .. } | Effect::Sweep { namespace, .. } => namespace,
            Effect::Patch(intent) => &intent.namespace,
        }
    }

    /// Whether running `self` after `other` could change nothing `other`
    /// will not: the same adoption, a patch of the same workload to the
    /// same snapshot for the same content of its source, or a sweep of the
    /// same source. Two such patches differ at most in the source version
    /// they wait to see persisted, and a resync derives one only from a
    /// source already persisted with that content, so the one already on
    /// its way sees it too. The content counts, not only the snapshot: an
    /// edit of keys the workload does not read leaves the snapshot's name
    /// as it was, and supersedes a patch still waiting (for the storm
    /// guard or a rollout window) for the content before it; the newer
    /// patch must then stay, or the rollout would be lost until a resync.
    pub(crate) fn same_work(&self, other: &Effect) -> bool {
        match (self, other) {
            (Effect::Patch(a), Effect::Patch(b)) => {
                a.namespace == b.namespace
                    && a.kind == b.kind
                    && a.name == b.name
                    && a.snapshot == b.snapshot
                    && a.content_hash == b.content_hash
            }
            // One sweep of a source at a time: the one on its way judges
            // every version by its age, whichever snapshot asked for it.
            (
                Effect::Sweep { namespace, source, .. },
                Effect::Sweep {
                    namespace: ns,
                    source: s,
                    ..
                },
            ) => namespace == ns && source == s,
            _ => self == other,
        }
    }

    pub fn describe(&self) -> String {
        match self {
            Effect::Adopt {
                owner_kind, owner_name, ..
            } => format!("adoption by {owner_kind}/{owner_name}"),
            Effect::Patch(intent) => format!("patch of {}", intent.who()),
            Effect::Sweep { source, .. } => format!("sweep of {source}'s snapshots"),
        }
    }

    /// The object an effect is about, for the Event that reports it: the
    /// workload a patch moves, the revision an adoption waits for.
    /// Whether this is a watch rollout of `workload` (kind, namespace,
    /// name): what a write of that workload wakes, if held.
    pub fn rolls(&self, workload: &Key) -> bool {
        let (kind, ns, name) = workload;
        match self {
            // Borrowed, not `subject()`: asked of every held job at every
            // stored workload change serve's watch sees.
            Effect::Patch(intent) => intent.namespace == *ns && intent.kind.kind() == kind && intent.name == *name,
            Effect::Adopt { .. } | Effect::Sweep { .. } => false,
        }
    }

    pub fn subject(&self) -> Key {
        match self {
            Effect::Patch(intent) => (
                intent.kind.kind().to_string(),
                intent.namespace.clone(),
                intent.name.clone(),
            ),
            Effect::Adopt {
                namespace,
                owner_kind,
                owner_name,
                ..
            } => (owner_kind.clone(), namespace.clone(), owner_name.clone()),
            Effect::Sweep { namespace, source, .. } => {
                (source.kind.kind().to_string(), namespace.clone(), source.name.clone())
            }
        }
    }
}

/// What identifies the object an admission reviewed once it is stored.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct StoredAs {
    /// Its uid, if the review carried one (an UPDATE's).
    pub uid: Option<String>,
    /// Its controller's uid, if it has one (a revision's workload).
    pub controller_uid: Option<String>,
    /// When it was reviewed (unix seconds): a CREATE's object is created
    /// after that, less the clocks' skew ([`StoredAs::SKEW`]).
    pub reviewed_at: i64,
}

impl StoredAs {
    /// How far the API server's clock may be behind the host's.
    pub(crate) const SKEW: i64 = 60;

    /// Why the live `object` is not the one reviewed, if it is not.
    pub(crate) fn mismatch(&self, object: &Value) -> Option<String> {
        if let Some(uid) = &self.uid {
            if object.uid() != Some(uid) {
                return Some(format!("its uid is not {uid}, the reviewed object's"));
            }
        }
        if let Some(uid) = &self.controller_uid {
            let controller = object.controller().and_then(|r| r["uid"].as_str());
            if controller != Some(uid) {
                return Some(format!("its controller is not {uid}, the reviewed object's"));
            }
        }
        let created = object
            .creation_timestamp()
            .and_then(config_snapshot_policy::model::duration::parse_rfc3339);
        match created {
            Some(created) if self.uid.is_some() || created >= self.reviewed_at - StoredAs::SKEW => None,
            Some(_) => Some("it was created before the request was reviewed".into()),
            None => Some("it has no creation time".into()),
        }
    }
}

/// A `patch_workload` request, as the policy decided it.
#[derive(Debug, Clone, PartialEq)]
pub struct PatchIntent {
    pub kind: WorkloadKind,
    pub namespace: String,
    pub name: String,
    pub source: SourceId,
    /// sha256 of the source content the patch was made for.
    pub content_hash: String,
    /// The source's resourceVersion before the admitted change ("" for a
    /// source created by it).
    pub source_version: String,
    pub snapshot: String,
    /// The keys of the source the snapshot holds (`None`: all).
    pub keys: Option<BTreeSet<String>>,
    /// How many rollbacks the workload had had when the patch was decided.
    pub rollbacks: u64,
}

impl PatchIntent {
    /// The intent of a `patch_workload` request of `namespace`, which the
    /// capability has checked. The JSON Patch the policy sent is not kept:
    /// the host recomputes it on the workload as it is when the patch runs
    /// (`verdict::decide_patch`).
    pub fn new(namespace: &str, request: PatchWorkload) -> PatchIntent {
        PatchIntent {
            kind: request.kind,
            namespace: namespace.to_string(),
            name: request.name,
            source: SourceId::new(request.source.kind, request.source.name),
            content_hash: request.source.content_hash,
            source_version: request.source.resource_version,
            snapshot: request.snapshot,
            keys: request.keys.map(|keys| keys.into_iter().collect()),
            rollbacks: request.rollbacks,
        }
    }

    /// `Kind/name` of the workload, for messages.
    pub fn who(&self) -> String {
        format!("{}/{}", self.kind.kind(), self.name)
    }

    /// The snapshot it points the workload at.
    pub fn target(&self) -> Key {
        (
            self.source.kind.kind().to_string(),
            self.namespace.clone(),
            self.snapshot.clone(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use config_snapshot_policy::model::source::SourceKind;
    use serde_json::json;

    #[test]
    fn a_patch_to_the_same_snapshot_is_the_same_work_whatever_source_version_it_waits_for() {
        let patch = |name: &str, snapshot: &str, source_version: &str| {
            Effect::Patch(intent(
                json!({"apiVersion": "apps/v1", "kind": "Deployment", "name": name,
                "snapshot": snapshot, "patch": [],
                "source": {"kind": "ConfigMap", "name": "app", "contentHash": "ab", "resourceVersion": source_version}}),
            ))
        };
        let admitted = patch("web", "app-green", "7");
        assert!(patch("web", "app-green", "8").same_work(&admitted));
        assert!(!patch("web", "app-blue", "7").same_work(&admitted));
        assert!(!patch("api", "app-green", "7").same_work(&admitted));
        let adopt = |owner: &str| Effect::Adopt {
            namespace: "ns".into(),
            owner_kind: "ReplicaSet".into(),
            owner_name: owner.into(),
            snapshots: vec![SnapshotRef {
                kind: SourceKind::ConfigMap,
                name: "app-green".into(),
            }],
            stored_as: None,
        };
        assert!(adopt("web-1").same_work(&adopt("web-1")));
        assert!(!adopt("web-2").same_work(&adopt("web-1")));
        assert!(!adopt("web-1").same_work(&admitted));
    }

    #[test]
    fn only_the_object_a_review_was_for_is_the_one_stored() {
        let reviewed = StoredAs {
            uid: None,
            controller_uid: Some("deploy-1".into()),
            reviewed_at: 1_800_000_000,
        };
        let object = |created: &str, controller: &str| {
            json!({"metadata": {"uid": "rs-1", "creationTimestamp": created,
                "ownerReferences": [{"uid": controller, "controller": true}]}})
        };
        assert_eq!(reviewed.mismatch(&object("2027-01-15T08:00:01Z", "deploy-1")), None);
        assert!(
            reviewed.mismatch(&object("2027-01-15T07:00:00Z", "deploy-1")).is_some(),
            "made an hour before the review: another request's"
        );
        assert!(reviewed.mismatch(&object("2027-01-15T08:00:01Z", "deploy-2")).is_some());
        let update = StoredAs {
            uid: Some("rs-1".into()),
            controller_uid: None,
            reviewed_at: 1_800_000_000,
        };
        assert_eq!(update.mismatch(&object("2020-01-01T00:00:00Z", "x")), None);
        assert!(update.mismatch(&json!({"metadata": {"uid": "rs-2"}})).is_some());
    }

    /// The intent of a `patch_workload` request in namespace `ns`.
    fn intent(request: Value) -> PatchIntent {
        PatchIntent::new("ns", serde_json::from_value(request).unwrap())
    }

    /// An intent is the checked request, typed: a Pod, a source that is
    /// not one, or keys that are not names never get this far.
    #[test]
    fn an_intent_names_a_workload_kind_a_source_and_a_snapshot() {
        let ok = json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "db", "snapshot": "app-1",
            "patch": [], "source": {"kind": "Secret", "name": "app", "contentHash": "ab"},
            "rollbacks": 2, "keys": ["pw"]});
        let patch = intent(ok.clone());
        assert_eq!((patch.kind.kind(), patch.rollbacks), ("StatefulSet", 2));
        assert_eq!(patch.keys, Some(BTreeSet::from(["pw".to_string()])));
        assert_eq!(patch.target(), ("Secret".into(), "ns".into(), "app-1".into()));
        assert_eq!(patch.source_version, "", "a source the change creates");
        for (field, bad) in [("keys", json!([1])), ("kind", json!("Pod")), ("source", json!({}))] {
            let mut request = ok.clone();
            request[field] = bad;
            let parsed = serde_json::from_value::<PatchWorkload>(request);
            assert!(parsed.is_err(), "{field}: {parsed:?}");
        }
    }
}
