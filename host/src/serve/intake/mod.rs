//! The way in (docs/serve.md, "The way in"): the TLS listener and its
//! table of connections (`listener`), the door's path (`door`), how a
//! request is refused before any work (`refusal`), the review's namespace
//! read off its first bytes (`review_namespace`), the per-namespace shares
//! of the body budget and of the evaluations (`shares`, `evaluations`),
//! the intake of one request (`entry`), and the two servers (`http`).
//!
//! Uses `answer` (a request let in is answered there) and `tell`. Open this
//! wing to change what a connection or a request may hold, or who is let in.

pub mod door;
pub(crate) mod entry;
pub(crate) mod evaluations;
pub(crate) mod http;
pub mod listener;
pub(crate) mod refusal;
pub(crate) mod review_namespace;
pub(crate) mod shares;
