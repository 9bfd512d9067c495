//! Answering a review: serve's options (`options`), the state its
//! handlers, workers and pass share (`state`), one AdmissionReview through
//! the policy (`admission`), and the periodic pass, timed and re-admitting
//! through the same path (`resync_timer`).
//!
//! Uses `work`, `view` and `tell`; `intake` brings it the reviews and
//! `trust` keeps what it runs on.

pub mod admission;
pub(crate) mod options;
pub mod resync_timer;
pub(crate) mod state;
