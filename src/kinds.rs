//! The one table of the Kubernetes kinds config-snapshot knows: what the
//! policy handles, what it reads, and where each kind keeps a pod template.
//! Everything else derives from it: the policy's dispatch guard and the
//! sweep's reference holders here, the host's caches, its API server
//! emulation, its metrics labels and its tests. Adding a kind is one row;
//! `policy-metadata.yml`'s rules are checked against it
//! (`host/tests/packaging.rs`).

/// One kind, as the API serves it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Kind {
    /// `apps/v1` or `v1`.
    pub api_version: &'static str,
    pub kind: &'static str,
    /// The resource name in URLs.
    pub plural: &'static str,
    /// The admission operations the policy acts on; empty: only read.
    pub handled: &'static [&'static str],
    /// Where the pod template sits, if objects of this kind can name a
    /// snapshot (`""`: a Pod's own spec).
    pub template: Option<&'static str>,
}

impl Kind {
    /// The API group (`""` for the core group).
    pub fn group(&self) -> &'static str {
        self.api_version.rsplit_once('/').map_or("", |(group, _)| group)
    }

    /// The version within the group.
    pub fn version(&self) -> &'static str {
        self.api_version.rsplit_once('/').map_or(self.api_version, |(_, v)| v)
    }
}

const WRITES: &[&str] = &["CREATE", "UPDATE"];
const CREATES: &[&str] = &["CREATE"];

pub const KINDS: [Kind; 8] = [
    Kind {
        api_version: "apps/v1",
        kind: "Deployment",
        plural: "deployments",
        handled: WRITES,
        template: Some("/spec/template"),
    },
    Kind {
        api_version: "apps/v1",
        kind: "StatefulSet",
        plural: "statefulsets",
        handled: WRITES,
        template: Some("/spec/template"),
    },
    Kind {
        api_version: "apps/v1",
        kind: "DaemonSet",
        plural: "daemonsets",
        handled: WRITES,
        template: Some("/spec/template"),
    },
    Kind {
        api_version: "v1",
        kind: "ConfigMap",
        plural: "configmaps",
        handled: WRITES,
        template: None,
    },
    Kind {
        api_version: "v1",
        kind: "Secret",
        plural: "secrets",
        handled: WRITES,
        template: None,
    },
    Kind {
        api_version: "apps/v1",
        kind: "ReplicaSet",
        plural: "replicasets",
        handled: CREATES,
        template: Some("/spec/template"),
    },
    Kind {
        api_version: "apps/v1",
        kind: "ControllerRevision",
        plural: "controllerrevisions",
        handled: CREATES,
        template: Some("/data/spec/template"),
    },
    Kind {
        api_version: "v1",
        kind: "Pod",
        plural: "pods",
        handled: &[],
        template: Some(""),
    },
];

/// The row for a kind name.
pub fn find(kind: &str) -> Option<&'static Kind> {
    KINDS.iter().find(|k| k.kind == kind)
}

/// Whether the policy acts on this (group, kind, operation); anything else
/// is accepted untouched.
pub fn handles(group: &str, kind: &str, operation: &str) -> bool {
    KINDS
        .iter()
        .any(|k| k.group() == group && k.kind == kind && k.handled.contains(&operation))
}

/// The kinds whose objects can name a snapshot, with where the template
/// sits: (apiVersion, kind, template path).
pub fn holders() -> impl Iterator<Item = (&'static str, &'static str, &'static str)> {
    KINDS.iter().filter_map(|k| Some((k.api_version, k.kind, k.template?)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_and_versions_split_the_api_version() {
        let d = find("Deployment").unwrap();
        assert_eq!((d.group(), d.version()), ("apps", "v1"));
        let c = find("ConfigMap").unwrap();
        assert_eq!((c.group(), c.version()), ("", "v1"));
        assert!(handles("apps", "ReplicaSet", "CREATE"));
        assert!(!handles("apps", "ReplicaSet", "UPDATE"));
        assert!(!handles("", "Pod", "CREATE"));
        assert_eq!(holders().count(), 6);
    }
}
