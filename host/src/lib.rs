//! The host for the config-snapshot policy: it evaluates the policy wasm
//! and implements the `config-snapshot`/`v1` write capability over the
//! simulator (`replay`, `review`) and against a real API server
//! (`serve`).

pub mod annotate;
pub mod capability;
pub mod cluster;
pub mod engine;
#[cfg(feature = "fuzz")]
pub mod fuzz;
pub mod gate;
pub mod history;
pub mod impact;
pub mod interactions;
pub mod lifecycle;
pub mod masks;
pub mod proof;
pub mod referrers;
pub mod registry;
pub mod release;
pub mod replay;
pub mod review;
pub mod rules;
pub mod selector;
pub mod serve;
pub mod simulator;
pub mod status;
pub mod view;

/// Chooses rustls's crypto provider for the process: ring, the one kube-rs
/// uses, rather than whatever feature unification left enabled (sigstore
/// brings aws-lc-rs too). Every path that opens TLS calls it first; only
/// the first call takes effect.
pub fn use_ring_for_tls() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}
