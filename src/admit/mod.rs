//! What each admission does: the screen, then a workload's CREATE or
//! UPDATE, a source's change (watch), a revision's CREATE, the sweep, and
//! the checksum fallback. Above `plan`, `host` and `model`.

pub mod checksum;
pub(crate) mod context;
pub mod revision;
pub(crate) mod screen;
pub(crate) mod skim;
pub mod sweep;
pub mod watch;
pub(crate) mod workload;
