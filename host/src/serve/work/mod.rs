//! The work behind the answers: the deferred effects' queue with its
//! workers, backoff and held jobs (`queue`), the sources serve's watch saw
//! change, waiting to be judged (`source_changes`), the turns by namespace
//! both take (`fair`), and the leader election that decides which replica
//! runs the pass and judges the changes (`leader`).
//!
//! Uses `view` and `tell`. Open this wing to change how effects are
//! scheduled, coalesced or held.

pub(crate) mod fair;
pub mod leader;
pub mod queue;
pub(crate) mod source_changes;
