//! Serve's periodic pass, timed: every `--resync-interval` on the leader,
//! [`crate::lifecycle::resync`], the pass replay's `advanceTime` runs too, over serve's cluster, with its admissions made
//! through the webhook's own path (the same wasm engine, in the instance
//! it keeps for the pass) and its effects handed to the queue; and the
//! judges' re-admissions of changed sources, the same way but in the
//! engine's shared instances.

use config_snapshot_policy::model::object::ObjectExt;
use std::sync::Arc;
use std::time::Duration;

use serde_json::value::RawValue;
use serde_json::{json, Value};

use super::admission::{self, UID_PREFIX};
use super::state::State;
use crate::lifecycle::effect::Effect;
use crate::lifecycle::resync::{Pass, PassHost, ReadmitError};

const RESYNC_USER: &str = "system:serviceaccount:config-snapshot:resync";

/// Runs the pass every `interval` (at least a second) while this replica
/// leads, once its cache has synced: a pass over a cache still filling
/// would take the unseen for the absent.
pub(crate) async fn every(state: Arc<State>, interval: Duration) {
    while !state.cluster.cache.synced() {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    loop {
        if state.leadership.leading() {
            once(&state).await;
            state.metrics.resync_passes.inc();
        }
        tokio::select! {
            () = tokio::time::sleep(interval.max(Duration::from_secs(1))) => {}
            () = state.leadership.acquired() => {}
        }
    }
}

/// Runs one pass. Blocking: every API call waits on the runtime, so it
/// runs on a blocking thread.
pub async fn once(state: &Arc<State>) -> Pass {
    let passing = state.clone();
    let pass = tokio::task::spawn_blocking(move || {
        let carry = passing.context.clone();
        carry.driver().resync(passing.as_ref())
    })
    .await
    .unwrap_or_else(|e| {
        tracing::error!("the resync pass panicked: {e}");
        Pass::default()
    });
    state.metrics.unproven.set(pass.unproven as i64);
    tracing::info!(
        adoptions = pass.adoptions,
        unproven = pass.unproven,
        renewed = pass.renewed,
        sources = pass.sources_checked,
        swept = pass.swept,
        "resync pass"
    );
    pass
}

impl PassHost for State {
    fn readmit(&self, operation: &str, object: &Value, old: Option<&Value>) -> Result<Option<Value>, ReadmitError> {
        readmit_from(self, admission::Origin::Resync, operation, object, old)
    }

    fn submit(&self, effect: Effect) {
        self.queue.submit(effect);
    }
}

/// serve's state as the judges of changed sources re-admit through it: as
/// the pass does, but evaluated in the engine's shared lane, never in the
/// instance kept for the pass ([`admission::Origin::lane`]).
struct Watched<'a>(&'a State);

impl PassHost for Watched<'_> {
    fn readmit(&self, operation: &str, object: &Value, old: Option<&Value>) -> Result<Option<Value>, ReadmitError> {
        readmit_from(self.0, admission::Origin::Watch, operation, object, old)
    }

    fn submit(&self, effect: Effect) {
        self.0.queue.submit(effect);
    }
}

/// A changed source is judged as the periodic pass judges a watched one:
/// re-admitted through the webhook's own path.
impl crate::serve::work::source_changes::Judge for State {
    fn source_changed(&self, key: &crate::cluster::Key) {
        self.context.driver().source_changed(&Watched(self), key);
    }
}

/// The host's own admission of `object`, for `origin` (the pass or a
/// judge): the mutated object when the policy allowed and changed it.
fn readmit_from(
    state: &State,
    origin: admission::Origin,
    operation: &str,
    object: &Value,
    old: Option<&Value>,
) -> Result<Option<Value>, ReadmitError> {
    let kind = object["kind"].as_str().unwrap_or_default();
    let failed = |reason: String| ReadmitError {
        what: format!("{kind}/{}", object.name()),
        reason,
    };
    let api_version = object["apiVersion"].as_str().unwrap_or("v1");
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let gvk = json!({"group": group, "version": version, "kind": kind});
    let plural = config_snapshot_policy::model::kinds::find(kind).map_or("", |k| k.plural);
    let request = json!({
        "uid": format!("{UID_PREFIX}{}", state.next_id()),
        "kind": gvk, "requestKind": gvk,
        "resource": {"group": group, "version": version, "resource": plural},
        "name": object.meta("name"),
        "namespace": object.meta("namespace"),
        "operation": operation,
        "userInfo": {"username": RESYNC_USER},
        "object": object,
        "oldObject": old,
        "dryRun": false,
        "options": {},
    });
    let raw = RawValue::from_string(request.to_string()).map_err(|e| failed(e.to_string()))?;
    let answer = admission::admit_from(state, &raw, origin).map_err(|e| failed(format!("{e:?}")))?;
    // Nobody reads a warning of the host's own admission: what it says
    // (a watcher not rolled, a list that failed) goes to the log.
    for warning in answer.review["response"]["warnings"].as_array().into_iter().flatten() {
        tracing::warn!(kind, name = object.name(), "{}", warning.as_str().unwrap_or_default());
    }
    Ok(answer.mutated.filter(|_| answer.allowed))
}
