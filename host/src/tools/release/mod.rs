//! Leaving config-snapshot: `config-snapshot release` points workloads
//! back at their sources and deletes the snapshots nothing names, with the
//! user's kubeconfig once serve is uninstalled (docs/install.md,
//! "Uninstall"). [`plan`] decides from the objects alone; [`run`] reads the
//! cluster and carries the plan out.

pub mod decide;
pub mod run;
