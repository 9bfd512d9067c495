//! Kubewarden's side of the host: the policy module (pulled and verified
//! from a registry, annotated, compiled and run by the engine), and
//! Kubewarden's own interfaces the host speaks: AdmissionReview answers,
//! the webhook rules of the metadata, field masks, the host-capability
//! gate and kwctl's recorded interactions.

pub mod admission_review;
pub mod annotate;
pub mod engine;
pub mod gate;
pub mod interactions;
pub(crate) mod masks;
pub mod registry;
pub mod rules;
