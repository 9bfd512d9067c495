//! Revoking a leaked Secret (or a ConfigMap's content): `config-snapshot
//! revoke secret/NAME` deletes the snapshots of that source's earlier
//! contents, records what it deleted, when and on whose word, and from then
//! on the policy refuses to put back a revision that names one and the
//! host to make one again (docs/design.md, "Revocation"). [`decide`] plans
//! from the objects alone; [`run`] reads the cluster with the user's
//! kubeconfig and carries the plan out.

pub mod decide;
pub mod run;
