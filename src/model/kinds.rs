//! The one table of the Kubernetes kinds config-snapshot knows: what each
//! is to the policy (a source, a workload, a revision, a holder of
//! references), where it keeps a pod template, and for a workload which
//! kind its revisions are and whether watch applies. Everything else
//! derives from it: the policy's dispatch, the sweep's reference holders,
//! the host's caches, API resources, RBAC checks, metrics labels and the
//! tests. Adding a kind is one row; `policy-metadata.yml`'s rules are
//! checked against it (`host/tests/packaging.rs`).

use crate::model::keys;
use crate::model::object::ObjectExt;
use crate::model::source::SourceKind;

/// What objects of a kind are to config-snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// A ConfigMap or a Secret: its writes are watched, and it is copied
    /// into snapshots.
    Source(SourceKind),
    /// Its pod template's sources are snapshotted on CREATE and UPDATE.
    /// `revisions`: the kind its controller copies the template into, which
    /// owns the snapshots. `watch`: a source change may roll it out.
    /// `rolls`: a template change makes a revision at once (a rollout);
    /// otherwise revisions are made later from the template as it is then
    /// (a CronJob's Jobs, on schedule), so the template itself is what runs
    /// next.
    Workload {
        revisions: &'static str,
        watch: bool,
        rolls: bool,
    },
    /// Made by a workload's controller with a copy of its template: on
    /// CREATE it adopts the snapshots the template names. `standalone`:
    /// users make objects of this kind directly too (a Job), and its
    /// template can never change: one made without a controller and opted
    /// in has its sources snapshotted at CREATE, and owns the snapshots, so
    /// deleting it (by hand or `ttlSecondsAfterFinished`) collects them.
    /// Watch cannot apply to it.
    Revision { standalone: bool },
    /// Runs its own template, made once (a Pod): one made directly and
    /// opted in is snapshotted at CREATE and owns its snapshots, as a
    /// standalone revision does; one a controller made (a ReplicaSet's
    /// Pod) is left alone, its controller's revision owns its config.
    Run,
}

/// One kind, as the API serves it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Kind {
    /// `apps/v1` or `v1`.
    pub api_version: &'static str,
    pub kind: &'static str,
    /// The resource name in URLs.
    pub plural: &'static str,
    /// kubectl's short names (`deploy`), which the CLI takes too.
    pub short: &'static [&'static str],
    /// Where the pod template sits (a JSON pointer), if objects of this
    /// kind can name a snapshot; `""`: the object is its own template (a
    /// Pod's metadata and spec).
    pub template: Option<&'static str>,
    pub role: Role,
    /// Served only where a CRD is installed (Argo Rollouts): the product
    /// runs without it, and starts using it once the API serves it.
    pub optional: bool,
}

const WRITES: &[&str] = &["CREATE", "UPDATE"];
const CREATES: &[&str] = &["CREATE"];

impl Kind {
    /// The API group (`""` for the core group).
    pub fn group(&self) -> &'static str {
        self.api_version.rsplit_once('/').map_or("", |(group, _)| group)
    }

    /// The version within the group.
    pub fn version(&self) -> &'static str {
        self.api_version.rsplit_once('/').map_or(self.api_version, |(_, v)| v)
    }

    /// The admission operations the policy acts on; empty: only read.
    pub fn handled(&self) -> &'static [&'static str] {
        match self.role {
            Role::Source(_) | Role::Workload { .. } => WRITES,
            Role::Revision { .. } | Role::Run => CREATES,
        }
    }

    /// The admissions the webhook asks for (policy-metadata.yml's rules):
    /// what the policy handles, but a source's writes. The host learns of
    /// those from its watch of what the API server stored, and re-admits a
    /// changed source itself (docs/design.md, "Watch"): no ConfigMap or
    /// Secret write in the cluster waits on the webhook.
    pub fn reviewed(&self) -> &'static [&'static str] {
        match self.role {
            Role::Source(_) => &[],
            _ => self.handled(),
        }
    }

    /// Whether objects of this kind are a workload's revisions.
    pub fn is_revision(&self) -> bool {
        matches!(self.role, Role::Revision { .. })
    }

    /// Whether an object of this kind may own the snapshots its template
    /// names: a revision, or (made without a controller) a Pod.
    pub fn owns(&self, object: &serde_json::Value) -> bool {
        match self.role {
            Role::Revision { .. } => true,
            Role::Run => !controlled(object),
            _ => false,
        }
    }

    /// The object's pod template, if it has one.
    pub fn template_of<'a>(&self, object: &'a serde_json::Value) -> Option<&'a serde_json::Value> {
        match self.template? {
            "" => Some(object),
            path => object.pointer(path),
        }
    }
}

pub const KINDS: [Kind; 11] = [
    Kind {
        api_version: "apps/v1",
        kind: "Deployment",
        plural: "deployments",
        short: &["deploy"],
        template: Some("/spec/template"),
        role: Role::Workload {
            revisions: "ReplicaSet",
            watch: true,
            rolls: true,
        },
        optional: false,
    },
    Kind {
        api_version: "apps/v1",
        kind: "StatefulSet",
        plural: "statefulsets",
        short: &["sts"],
        template: Some("/spec/template"),
        role: Role::Workload {
            revisions: "ControllerRevision",
            watch: true,
            rolls: true,
        },
        optional: false,
    },
    Kind {
        api_version: "apps/v1",
        kind: "DaemonSet",
        plural: "daemonsets",
        short: &["ds"],
        template: Some("/spec/template"),
        role: Role::Workload {
            revisions: "ControllerRevision",
            watch: true,
            rolls: true,
        },
        optional: false,
    },
    Kind {
        api_version: "v1",
        kind: "ConfigMap",
        plural: "configmaps",
        short: &["cm"],
        template: None,
        role: Role::Source(SourceKind::ConfigMap),
        optional: false,
    },
    Kind {
        api_version: "v1",
        kind: "Secret",
        plural: "secrets",
        short: &[],
        template: None,
        role: Role::Source(SourceKind::Secret),
        optional: false,
    },
    Kind {
        api_version: "apps/v1",
        kind: "ReplicaSet",
        plural: "replicasets",
        short: &["rs"],
        template: Some("/spec/template"),
        role: Role::Revision { standalone: false },
        optional: false,
    },
    Kind {
        api_version: "apps/v1",
        kind: "ControllerRevision",
        plural: "controllerrevisions",
        short: &[],
        template: Some("/data/spec/template"),
        role: Role::Revision { standalone: false },
        optional: false,
    },
    Kind {
        api_version: "v1",
        kind: "Pod",
        plural: "pods",
        short: &["po"],
        template: Some(""),
        role: Role::Run,
        optional: false,
    },
    // A CronJob's revisions are the Jobs it runs: each carries a copy of
    // its job template, so a Job keeps running the config it started with
    // while the next ones run the new config, and the history limits that
    // prune Jobs collect their snapshots.
    Kind {
        api_version: "batch/v1",
        kind: "CronJob",
        plural: "cronjobs",
        short: &["cj"],
        template: Some("/spec/jobTemplate/spec/template"),
        role: Role::Workload {
            revisions: "Job",
            watch: true,
            rolls: false,
        },
        optional: false,
    },
    Kind {
        api_version: "batch/v1",
        kind: "Job",
        plural: "jobs",
        short: &[],
        template: Some("/spec/template"),
        role: Role::Revision { standalone: true },
        optional: false,
    },
    // Argo Rollouts: a workload like a Deployment whose ReplicaSets its
    // controller makes and owns (`kubectl argo rollouts undo` puts an older
    // ReplicaSet's template back, as `rollout undo` does).
    Kind {
        api_version: "argoproj.io/v1alpha1",
        kind: "Rollout",
        plural: "rollouts",
        short: &["ro"],
        template: Some("/spec/template"),
        role: Role::Workload {
            revisions: "ReplicaSet",
            watch: true,
            rolls: true,
        },
        optional: true,
    },
];

/// Whether a controller made `object` (an ownerReference with
/// `controller: true`).
pub(crate) fn controlled(object: &serde_json::Value) -> bool {
    object.controller().is_some()
}

/// Where an object of a reviewed kind carries annotations that concern
/// config-snapshot: its own, and its pod template's (a revision's, a
/// CronJob's job template's, a ControllerRevision's data), one JSON
/// pointer each.
pub fn marked_annotation_paths() -> Vec<String> {
    let mut paths = vec!["/metadata/annotations".to_string()];
    for kind in KINDS.iter().filter(|k| !k.reviewed().is_empty()) {
        let path = format!("{}/metadata/annotations", kind.template.unwrap_or_default());
        if !paths.contains(&path) {
            paths.push(path);
        }
    }
    paths
}

/// Whether `object` carries an annotation of config-snapshot's
/// ([`keys::PREFIX`]) on itself or its pod template: an opt-in, the records,
/// the mapping, a checksum. With the settings' defaults off, a write whose
/// new and old objects carry none is none of the policy's business, and
/// the webhook is not called for it ([`marked_condition`]): the policy
/// would answer it untouched.
pub fn marked(object: &serde_json::Value) -> bool {
    marked_annotation_paths().iter().any(|path| {
        object
            .pointer(path)
            .and_then(serde_json::Value::as_object)
            .is_some_and(|annotations| annotations.keys().any(|k| k.starts_with(keys::PREFIX)))
    })
}

/// [`marked`] of the CEL value `o` (not null), as a CEL expression: the one
/// text the webhook's condition and the identity guard are built from.
fn marked_cel(o: &str) -> String {
    let one = |path: &str| {
        let fields: String = path
            .trim_start_matches('/')
            .split('/')
            .map(|field| format!(".?{field}"))
            .collect();
        format!("{o}{fields}.orValue({{}}).exists(k, k.startsWith('{}'))", keys::PREFIX)
    };
    let any: Vec<String> = marked_annotation_paths().iter().map(|p| one(p)).collect();
    any.join(" || ")
}

/// [`marked`] of the object or the old object, as a CEL expression for a
/// webhook's `matchConditions`: kube-apiserver evaluates it and calls the
/// webhook only when it holds. The deploy manifests and the chart carry
/// exactly this text (host/tests/deploy.rs, chart.rs).
pub fn marked_condition() -> String {
    format!("[object, oldObject].exists(o, o != null && ({}))", marked_cel("o"))
}

/// [`marked`] of the old object alone, as a CEL expression: the identity
/// guard's `marked` (deploy/serve/identityguard.yaml). serve's own account
/// changes a workload only if it was already marked before the write (an
/// opt-in, or serve's records and mapping), so that a stolen token cannot
/// opt a workload in, nor move the references of one that never opted in.
/// The manifests and the chart carry exactly this text (host/tests/deploy.rs).
pub fn marked_before_condition() -> String {
    format!("oldObject != null && ({})", marked_cel("oldObject"))
}

/// The row for a kind name.
pub fn find(kind: &str) -> Option<&'static Kind> {
    KINDS.iter().find(|k| k.kind == kind)
}

/// The row for a kind as kubectl takes it on the command line: its name,
/// plural or short name in any case, or `plural.group`.
pub fn named(text: &str) -> Option<&'static Kind> {
    let text = text.to_ascii_lowercase();
    KINDS.iter().find(|k| {
        let (plural, group) = (k.plural, k.group());
        text == k.kind.to_ascii_lowercase()
            || text == plural
            || k.short.contains(&text.as_str())
            || (!group.is_empty()
                && (text == format!("{plural}.{group}") || text == format!("{}.{group}", k.kind.to_ascii_lowercase())))
    })
}

/// Whether the policy acts on this (group, kind, operation); anything else
/// is accepted untouched.
pub(crate) fn handles(group: &str, kind: &str, operation: &str) -> bool {
    KINDS
        .iter()
        .any(|k| k.group() == group && k.kind == kind && k.handled().contains(&operation))
}

/// The kinds whose objects can name a snapshot.
pub fn holders() -> impl Iterator<Item = &'static Kind> {
    KINDS.iter().filter(|k| k.template.is_some())
}

/// The pod template of an object of any kind in the table, if it has one.
pub fn template_of(object: &serde_json::Value) -> Option<&serde_json::Value> {
    find(object["kind"].as_str()?)?.template_of(object)
}

/// A kind whose row is a workload: the one type that says what a workload
/// kind is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkloadKind(&'static Kind);

/// On the wire by its Kubernetes kind: a payload naming another kind does
/// not deserialise.
impl serde::Serialize for WorkloadKind {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.kind())
    }
}

impl<'de> serde::Deserialize<'de> for WorkloadKind {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let kind = String::deserialize(deserializer)?;
        WorkloadKind::from_kind(&kind)
            .ok_or_else(|| serde::de::Error::custom(format!("{kind:?} is not a workload kind")))
    }
}

impl WorkloadKind {
    pub fn from_kind(kind: &str) -> Option<WorkloadKind> {
        find(kind)
            .filter(|k| matches!(k.role, Role::Workload { .. }))
            .map(WorkloadKind)
    }

    /// Every workload kind, in the table's order.
    pub fn all() -> impl Iterator<Item = WorkloadKind> {
        KINDS
            .iter()
            .filter(|k| matches!(k.role, Role::Workload { .. }))
            .map(WorkloadKind)
    }

    /// A standalone revision kind (a Job) planned as a workload at its
    /// CREATE: its own revision, never watched, never rolled.
    pub(crate) fn standalone(row: &'static Kind) -> Option<WorkloadKind> {
        matches!(row.role, Role::Revision { standalone: true } | Role::Run).then_some(WorkloadKind(row))
    }

    /// Whether this is a standalone kind (see [`Self::standalone`]).
    pub(crate) fn is_standalone(self) -> bool {
        !matches!(self.0.role, Role::Workload { .. })
    }

    pub(crate) fn row(self) -> &'static Kind {
        self.0
    }

    pub fn kind(self) -> &'static str {
        self.0.kind
    }

    pub fn api_version(self) -> &'static str {
        self.0.api_version
    }

    /// Where its pod template sits.
    pub fn template(self) -> &'static str {
        self.0.template.unwrap_or_default()
    }

    /// The kind of its revisions, with their own template path (a
    /// standalone kind is its own).
    pub fn revisions(self) -> &'static Kind {
        match self.0.role {
            Role::Workload { revisions, .. } => find(revisions).expect("a workload's revision kind is in the table"),
            _ => self.0,
        }
    }

    /// Whether a change of a source it watches rolls it out.
    pub fn watches(self) -> bool {
        matches!(self.0.role, Role::Workload { watch: true, .. })
    }

    /// The annotation its controller numbers its revisions with, where the
    /// revision kind has no number of its own (ReplicaSets).
    pub fn revision_annotation(self) -> Option<&'static str> {
        match (self.0.kind, self.revisions().kind) {
            ("Rollout", _) => Some("rollout.argoproj.io/revision"),
            (_, "ReplicaSet") => Some("deployment.kubernetes.io/revision"),
            _ => None,
        }
    }

    /// Whether a template change makes a revision at once (see
    /// [`Role::Workload`]).
    pub fn rolls(self) -> bool {
        matches!(self.0.role, Role::Workload { rolls: true, .. })
    }
}

/// The pod template an object runs next: a revision's or a bare Job's own,
/// a CronJob's job template (its next Job), and for a workload that rolls,
/// its current revision's, which `current_revision` finds.
pub fn running_template(
    object: &serde_json::Value,
    current_revision: impl FnOnce() -> Option<serde_json::Value>,
) -> Option<serde_json::Value> {
    let row = find(object["kind"].as_str()?)?;
    match WorkloadKind::from_kind(row.kind) {
        Some(w) if w.rolls() => current_revision(),
        _ => row.template_of(object).cloned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// What the webhook is sent is what carries config-snapshot's
    /// annotations, on the object or its pod template, in every place a
    /// reviewed kind keeps one; nothing else, whatever its labels say.
    #[test]
    fn only_an_object_marked_for_config_snapshot_is_sent() {
        let with = |path: &str, key: &str| {
            let mut object = json!({"metadata": {"name": "x"}});
            let mut at = json!({key: "1"});
            for segment in path.trim_start_matches('/').rsplit('/') {
                at = json!({ segment: at });
            }
            json_merge(&mut object, at);
            object
        };
        for path in marked_annotation_paths() {
            assert!(marked(&with(&path, "config-snapshot.io/watch")), "{path}");
            assert!(!marked(&with(&path, "reloader.stakater.com/auto")), "{path}");
        }
        for template in [
            "/spec/template",
            "/spec/jobTemplate/spec/template",
            "/data/spec/template",
        ] {
            let path = format!("{template}/metadata/annotations");
            assert!(marked(&with(&path, keys::SNAPSHOTS)), "a revision's mapping at {path}");
        }
        let labelled = json!({"metadata": {"labels": {keys::MANAGED_BY: keys::MANAGED_BY_VALUE}}});
        assert!(!marked(&labelled), "a label is not an annotation of ours");
        assert!(!marked(&json!({"metadata": {"annotations": "not a map"}})));
        let condition = marked_condition();
        for path in marked_annotation_paths() {
            let fields: String = path
                .trim_start_matches('/')
                .split('/')
                .map(|f| format!(".?{f}"))
                .collect();
            assert!(
                condition.contains(&format!("o{fields}.orValue")),
                "{path} in {condition}"
            );
        }
        assert!(condition.starts_with("[object, oldObject].exists(o, o != null && ("));
    }

    fn json_merge(into: &mut serde_json::Value, from: serde_json::Value) {
        match (into, from) {
            (serde_json::Value::Object(a), serde_json::Value::Object(b)) => {
                for (k, v) in b {
                    json_merge(a.entry(k).or_insert(serde_json::Value::Null), v);
                }
            }
            (slot, value) => *slot = value,
        }
    }

    #[test]
    fn groups_and_versions_split_the_api_version() {
        let d = find("Deployment").unwrap();
        assert_eq!((d.group(), d.version()), ("apps", "v1"));
        let c = find("ConfigMap").unwrap();
        assert_eq!((c.group(), c.version()), ("", "v1"));
        assert!(handles("apps", "ReplicaSet", "CREATE"));
        assert!(!handles("apps", "ReplicaSet", "UPDATE"));
        assert!(handles("", "Pod", "CREATE") && !handles("", "Pod", "UPDATE"));
        assert!(handles("batch", "CronJob", "UPDATE"));
        assert!(handles("batch", "Job", "CREATE"));
        assert!(!handles("batch", "Job", "UPDATE"), "a Job's template is immutable");
        assert_eq!(holders().count(), 9);
        let rollout = WorkloadKind::from_kind("Rollout").unwrap();
        assert!(handles("argoproj.io", "Rollout", "UPDATE") && rollout.row().optional);
        assert_eq!(rollout.revisions().kind, "ReplicaSet");
        assert_eq!(rollout.revision_annotation(), Some("rollout.argoproj.io/revision"));
        assert_eq!(
            WorkloadKind::from_kind("Deployment").unwrap().revision_annotation(),
            Some("deployment.kubernetes.io/revision")
        );
        assert_eq!(find("CronJob").unwrap().group(), "batch");
    }

    /// Every workload's revision kind is a revision row with a template.
    #[test]
    fn each_workload_names_a_revision_kind_of_the_table() {
        for w in WorkloadKind::all() {
            let r = w.revisions();
            assert!(r.is_revision(), "{}", w.kind());
            assert!(r.template.is_some_and(|t| !t.is_empty()), "{}", r.kind);
            assert!(w.template().starts_with('/'));
        }
        assert_eq!(WorkloadKind::from_kind("ReplicaSet"), None);
        assert_eq!(
            WorkloadKind::from_kind("StatefulSet").unwrap().revisions().template,
            Some("/data/spec/template")
        );
        let cron = WorkloadKind::from_kind("CronJob").unwrap();
        assert_eq!(
            (cron.template(), cron.revisions().kind),
            ("/spec/jobTemplate/spec/template", "Job")
        );
    }

    #[test]
    fn a_pod_is_its_own_template() {
        let pod = serde_json::json!({"kind": "Pod", "spec": {"containers": []}});
        assert_eq!(template_of(&pod), Some(&pod));
        let rs = serde_json::json!({"kind": "ReplicaSet", "spec": {"template": {"spec": {}}}});
        assert_eq!(template_of(&rs), Some(&rs["spec"]["template"]));
        assert_eq!(template_of(&serde_json::json!({"kind": "ConfigMap"})), None);
    }
}
