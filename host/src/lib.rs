//! The host for the config-snapshot policy: it evaluates the policy wasm
//! and implements the `config-snapshot`/`v1` write capability over the
//! simulator (`replay`, `review`) and against a real API server
//! (`serve`).
//!
//! Its wings, lowest first (docs/architecture.md; `layering_tests.rs`
//! keeps the order): `kubewarden` (the module, its engine and Kubewarden's
//! own interfaces), `cluster` (what the host needs of a cluster: the trait,
//! the proof of what it made, the simulator), `capability` (the host
//! calls the policy makes), `lifecycle` (the effects and the pass, once for
//! both hosts), `replay` and `serve` (the two hosts), `tools` (the
//! commands a person runs beside them: status, plan, history, release).

pub mod capability;
pub mod cluster;
#[cfg(feature = "fuzz")]
pub mod fuzz;
pub mod kubewarden;
#[cfg(test)]
mod layering_tests;
pub mod lifecycle;
pub mod replay;
pub mod serve;
pub mod tools;

/// Chooses rustls's crypto provider for the process: ring, the one kube-rs
/// uses, rather than whatever feature unification left enabled (sigstore
/// brings aws-lc-rs too). Every path that opens TLS calls it first; only
/// the first call takes effect.
pub fn use_ring_for_tls() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}
