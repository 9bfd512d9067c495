//! The host calls the policy makes, named once. The policy calls them by
//! this enum, the host dispatches on it (a `match` the compiler checks for
//! every operation), serve labels its metrics with it, and the metadata's
//! `hostCapabilities` is checked against it (`host/tests/packaging.rs`).
//! See docs/design.md, "Host capability contract".

/// One host call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operation {
    /// Kubewarden's: read one object.
    GetResource,
    /// Kubewarden's: list a kind in a namespace.
    ListResourcesByNamespace,
    /// Kubewarden's: an RBAC check (the policy never needs one; our hosts
    /// answer it so a call cannot fail).
    CanI,
    /// Ours: the host's clock, so replay can drive time.
    Now,
    /// Ours: write a snapshot, or make an existing one outlive the reference.
    CreateSnapshot,
    /// Ours: several `create_snapshot`s in one call, which the host may
    /// carry out concurrently: a workload's snapshots cost about one API
    /// round trip, not one each. A host without it answers `Unsupported`
    /// and the policy calls `create_snapshot` for each.
    CreateSnapshots,
    /// Ours: make a revision an owner of the snapshots it uses.
    Adopt,
    /// Ours: delete an unused snapshot, guarded by uid and version.
    DeleteSnapshot,
    /// Ours: a deferred watch rollout.
    PatchWorkload,
    /// Ours: list only the workloads whose template references a source
    /// (the host's reverse index), so a source update costs its watchers,
    /// not the namespace. Without it the policy lists them all.
    ListReferencing,
    /// Ours: the name a Secret's snapshot gets, keyed by the host so that it
    /// reveals nothing of the Secret's value.
    SnapshotName,
}

/// The most snapshots one `create_snapshots` call carries: the policy
/// splits a longer list, the host refuses one.
pub const SNAPSHOTS_PER_CALL: usize = 32;

/// Kubewarden's binding and namespace for cluster reads.
pub const KUBEWARDEN: (&str, &str) = ("kubewarden", "kubernetes");
/// This project's capability: stock Kubewarden answers `unknown binding`.
pub const CONFIG_SNAPSHOT: (&str, &str) = ("config-snapshot", "v1");

impl Operation {
    pub const ALL: [Operation; 11] = [
        Operation::GetResource,
        Operation::ListResourcesByNamespace,
        Operation::CanI,
        Operation::Now,
        Operation::CreateSnapshot,
        Operation::CreateSnapshots,
        Operation::Adopt,
        Operation::DeleteSnapshot,
        Operation::PatchWorkload,
        Operation::ListReferencing,
        Operation::SnapshotName,
    ];

    /// The name on the wire.
    pub fn name(self) -> &'static str {
        match self {
            Operation::GetResource => "get_resource",
            Operation::ListResourcesByNamespace => "list_resources_by_namespace",
            Operation::CanI => "can_i",
            Operation::Now => "now",
            Operation::CreateSnapshot => "create_snapshot",
            Operation::CreateSnapshots => "create_snapshots",
            Operation::Adopt => "adopt",
            Operation::DeleteSnapshot => "delete_snapshot",
            Operation::PatchWorkload => "patch_workload",
            Operation::ListReferencing => "list_referencing",
            Operation::SnapshotName => "snapshot_name",
        }
    }

    /// The (binding, namespace) the operation is called under.
    pub fn binding(self) -> (&'static str, &'static str) {
        match self {
            Operation::GetResource | Operation::ListResourcesByNamespace | Operation::CanI => KUBEWARDEN,
            Operation::Now
            | Operation::CreateSnapshot
            | Operation::CreateSnapshots
            | Operation::Adopt
            | Operation::DeleteSnapshot
            | Operation::PatchWorkload
            | Operation::ListReferencing
            | Operation::SnapshotName => CONFIG_SNAPSHOT,
        }
    }

    /// The operation a call names, if it is one under that binding.
    pub fn parse(binding: &str, namespace: &str, name: &str) -> Option<Operation> {
        Operation::ALL
            .into_iter()
            .find(|o| o.name() == name && o.binding() == (binding, namespace))
    }

    /// Whether it changes the cluster (refused during a dry run).
    pub fn writes(self) -> bool {
        // A full match, not `matches!`: a new operation must say whether a
        // dry run refuses it.
        match self {
            Operation::CreateSnapshot
            | Operation::CreateSnapshots
            | Operation::Adopt
            | Operation::DeleteSnapshot
            | Operation::PatchWorkload => true,
            Operation::GetResource
            | Operation::ListResourcesByNamespace
            | Operation::CanI
            | Operation::Now
            | Operation::ListReferencing
            | Operation::SnapshotName => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_under_their_binding_only() {
        for op in Operation::ALL {
            let (b, n) = op.binding();
            assert_eq!(Operation::parse(b, n, op.name()), Some(op));
        }
        assert_eq!(Operation::parse("kubewarden", "kubernetes", "adopt"), None);
        assert_eq!(Operation::parse("config-snapshot", "v1", "nope"), None);
    }
}
