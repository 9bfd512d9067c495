//! What serve tells the people who run it: its Prometheus metrics, the
//! Events it writes on the objects it acts on, and the two together as the
//! report the effects and the pass make (`report`).
//!
//! The lowest wing: it uses no other wing of serve, and every other wing
//! may use it.

pub mod events;
pub mod metrics;
pub(crate) mod report;
