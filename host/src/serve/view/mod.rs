//! The cluster as serve sees it: the kube-rs client behind the `Cluster`
//! trait (`apiserver`), the watch caches and the reverse index
//! (`cache`), and one admission's reads of its sources, read ahead and
//! as fresh as the request (`source_reads`, `prefetch`, `scope`).
//!
//! Uses `tell` (metrics); nothing above it. Open this wing to change how
//! serve reads, caches or watches the cluster, or how it learns of a
//! source's change (the cache tells it).

pub mod apiserver;
pub mod cache;
pub(crate) mod ledger;
pub mod prefetch;
pub mod scope;
pub(crate) mod source_reads;
