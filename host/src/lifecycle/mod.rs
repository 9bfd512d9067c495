//! The rules where features meet, decided without I/O, so that `replay`
//! and `serve` run the same decisions (docs/design.md, "Where features
//! meet"):
//! - [`effects`]: what a deferred effect (adopt, watch patch) does now,
//!   from the objects as they are and a clock: apply, wait, hold back for
//!   the storm guard, or drop;
//! - [`resync`]: what a periodic pass does: repair adoptions, renew, re-admit
//!   watched sources, and sweep the snapshots nothing owns or uses.
//!
//! The drivers (`memory::effects` and `serve::effects`, `memory::resync` and
//! `serve::resync`) only fetch objects, act, and retry.

pub mod effects;
pub mod resync;

pub use effects::{Effect, PatchIntent, Verdict};
