//! The commands a person runs beside serve, over a cluster or a replay:
//! `status` and `approve` (what a workload's changes wait for), `plan`
//! (what applying a source would roll), `history` and `diff` (which config
//! each kept revision runs), and `release` (leaving config-snapshot).

pub mod history;
pub mod impact;
pub mod release;
pub mod status;
