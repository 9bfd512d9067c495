//! The commands a person runs beside serve, over a cluster or a replay:
//! `status` and `approve` (what a workload's changes wait for), `plan`
//! (what applying a source would roll), `history` and `diff` (which config
//! each kept revision runs), `release` (leaving config-snapshot) and
//! `revoke` (a leaked Secret's snapshots gone for good); what they print of
//! the cluster goes through `printable`.

pub mod history;
pub mod impact;
pub mod printable;
pub mod release;
pub mod revoke;
pub mod status;

pub use printable::{printable, printable_lines};
