//! config-snapshot: a Kubewarden policy that snapshots the ConfigMaps and
//! Secrets a workload uses into immutable, content-addressed copies and
//! points the pod template at them, so config rolls forward and back with
//! the workload's revisions.
//!
//! The decisions live in plain modules that compile and test natively; the
//! waPC glue at the bottom is the only wasm-specific code.

// The folders say what they hold (docs/architecture.md): `model/` the
// vocabulary, `host/` the interface to the host, `plan/` the decisions,
// `admit/` what each admission does with them. Every path names its
// folder, inside the crate and out; outside it, only the vocabulary, the
// host interface and the two faces below are public.
pub(crate) mod admit;
pub mod host;
pub mod model;
pub(crate) mod plan;

pub mod snapshot {
    pub use crate::admit::revision::used_snapshots;
    pub use crate::admit::sweep::{
        add_references, anchor_reference, anchored, holder_masks, is_orphan, must_mark_reuse, only_owners_collect,
        owned, reusable_as_cached, REUSE_MARGIN_SECS,
    };
}

/// What the host shares with the policy about rolling a workload: where a
/// record lives in the template, which sources a workload will read, who
/// watches a source, and the patch that points a workload at a snapshot.
/// The host's rollouts and the policy's admissions must write the same
/// patch (docs/design.md, "Watch").
pub mod rollout {
    pub use crate::admit::checksum::checksum_key;
    pub use crate::admit::watch::{retarget_ops, watcher, Watcher};
    pub use crate::plan::reads_ahead;
    pub use crate::plan::rewrite::annotation_path;
}

use admit::context::Context;
use admit::{revision, screen, watch, workload};
use host::{Host, HostApi};
use model::keys;
use model::kinds::{self, Role};
use model::request::{Outcome, Payload, SAY};
use model::settings::Settings;

/// Evaluates one validate payload (`{"request": …, "settings": …}`) and
/// returns the Kubewarden response. Never panics on bad input: every parse
/// failure becomes a rejection with a message.
pub fn validate(payload: &[u8], host: &dyn Host) -> Vec<u8> {
    let outcome = evaluate(payload, host);
    serde_json::to_vec(&outcome.into_response()).unwrap_or_else(|_| {
        br#"{"accepted":false,"message":"config-snapshot: could not encode the response"}"#.to_vec()
    })
}

pub fn evaluate(payload: &[u8], host: &dyn Host) -> Outcome {
    screen::pass_through(payload).unwrap_or_else(|| decide(payload, host))
}

/// Every request, whatever the screen would have said of it.
pub(crate) fn decide(payload: &[u8], host: &dyn Host) -> Outcome {
    let payload: Payload = match serde_json::from_slice(payload) {
        Ok(p) => p,
        Err(e) => return Outcome::reject(format!("{SAY}invalid admission request: {e}"), 400),
    };
    let settings = match payload.settings {
        Some(raw) => match Settings::from_json(raw.get().as_bytes()) {
            Ok(s) => s,
            Err(e) => return Outcome::reject(format!("{SAY}{e}"), 400),
        },
        None => Settings::default(),
    };
    let req = &payload.request;
    let Some(object) = req.object else {
        return Outcome::accept();
    };
    let ctx = Context {
        host: HostApi::new(host),
        settings: &settings,
        namespace: &req.namespace,
        dry_run: req.dry_run,
    };
    let (group, kind, op) = (req.kind.group.as_str(), req.kind.kind.as_str(), req.operation.as_str());
    if !kinds::handles(group, kind, op) {
        return Outcome::accept();
    }
    let Some(row) = kinds::find(kind) else {
        return Outcome::accept();
    };
    match row.role {
        Role::Workload { .. } => match kinds::WorkloadKind::from_kind(kind) {
            Some(w) => workload::admit(&ctx, w, op, object, req.old_object),
            None => Outcome::accept(),
        },
        Role::Source(k) => watch::admit(&ctx, k, op, object, req.old_object),
        Role::Revision { standalone: true } | Role::Run if revision::standalone(object, &settings) => {
            match kinds::WorkloadKind::standalone(row) {
                Some(w) => workload::admit(&ctx, w, op, object, None),
                None => Outcome::accept(),
            }
        }
        Role::Revision { .. } => revision::admit(&ctx, row, object),
        // A controller's Pod: its revision owns its config.
        Role::Run if !object.get().contains(keys::SNAPSHOTS) => Outcome::accept(),
        Role::Run => match serde_json::from_str::<serde_json::Value>(object.get()) {
            Ok(pod) if row.owns(&pod) => revision::admit(&ctx, row, object),
            _ => Outcome::accept(),
        },
    }
}

/// `validate_settings`: the answer Kubewarden expects.
pub fn validate_settings(payload: &[u8]) -> Vec<u8> {
    let response = match Settings::from_json(payload) {
        Ok(_) => kubewarden_policy_sdk::settings::SettingsValidationResponse {
            valid: true,
            message: None,
        },
        Err(e) => kubewarden_policy_sdk::settings::SettingsValidationResponse {
            valid: false,
            message: Some(e.to_string()),
        },
    };
    serde_json::to_vec(&response).unwrap_or_default()
}

#[cfg(target_arch = "wasm32")]
mod guest {
    use wapc_guest::{register_function, CallResult};

    /// The waPC host, as the policy sees it when running in wasm.
    struct WapcHost;

    /// What wapc-guest puts before the bytes a host wrote for a failed
    /// call (its `Display`); the bytes are the host's.
    const HOST_ERROR: &str = "Host error: ";

    impl crate::host::Host for WapcHost {
        fn call(
            &self,
            binding: &str,
            namespace: &str,
            operation: &str,
            payload: &[u8],
        ) -> Result<Vec<u8>, crate::host::CallError> {
            wapc_guest::host_call(binding, namespace, operation, payload).map_err(|e| {
                let text = e.to_string();
                crate::host::CallError::from_host(text.strip_prefix(HOST_ERROR).unwrap_or(&text).as_bytes())
            })
        }
    }

    #[no_mangle]
    pub extern "C" fn wapc_init() {
        register_function("validate", validate);
        register_function("validate_settings", validate_settings);
        register_function("protocol_version", kubewarden_policy_sdk::protocol_version_guest);
    }

    fn validate(payload: &[u8]) -> CallResult {
        Ok(crate::validate(payload, &WapcHost))
    }

    fn validate_settings(payload: &[u8]) -> CallResult {
        Ok(crate::validate_settings(payload))
    }
}

#[cfg(test)]
mod properties_tests;

#[cfg(test)]
mod layering_tests;
