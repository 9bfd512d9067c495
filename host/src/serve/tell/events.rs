//! Kubernetes Events on the workloads serve changes, so that `kubectl
//! describe deployment web` tells what happened to its config: a watch
//! rollout, a renewal, a rollout dropped because a rollback came first,
//! an effect given up. Published with kube-rs's recorder (repeats become
//! one Event with a count), off the caller's path: an Event that cannot be
//! written is logged and forgotten, never a reason to fail the work.
//!
//! Bounded, whatever is in the cluster: at most [`WRITING`] Events are
//! written at once and [`WAITING`] wait (past that they are dropped and
//! counted), and the same warning about the same object is told once an
//! hour, not at every pass (a thousand planted look-alikes make a thousand
//! Events an hour, not a thousand per resync).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use config_snapshot_policy::model::object::ObjectExt;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use serde_json::Value;

use crate::lifecycle::Reason;

/// The controller name on every Event (`reportingController`).
pub(crate) const REPORTER: &str = "config-snapshot.io/serve";

/// Events written at once.
const WRITING: usize = 4;

/// Events waiting to be written, at most.
const WAITING: usize = 512;

/// How long the same reason about the same object is not told again.
const QUIET: Duration = Duration::from_secs(3600);

/// Objects remembered as told, at most.
const REMEMBERED: usize = 10_000;

pub struct Events {
    recorder: Recorder,
    runtime: tokio::runtime::Handle,
    writing: Arc<tokio::sync::Semaphore>,
    waiting: Arc<AtomicUsize>,
    told: Told,
}

/// The warnings told lately, by object and reason.
#[derive(Default)]
struct Told(Mutex<HashMap<(String, &'static str), Instant>>);

impl Told {
    /// Whether `reason` about the object of `uid` was told within
    /// [`QUIET`] of `now`; records it as told now if not. Only warnings
    /// repeat unchanged at every pass; the others tell of one change each.
    fn repeated(&self, uid: &str, reason: Reason, now: Instant) -> bool {
        if !reason.warning() || uid.is_empty() {
            return false;
        }
        let mut told = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if told.len() >= REMEMBERED {
            told.retain(|_, at| now.duration_since(*at) < QUIET);
        }
        let key = (uid.to_string(), reason.name());
        if told.get(&key).is_some_and(|at| now.duration_since(*at) < QUIET) {
            return true;
        }
        if told.len() < REMEMBERED {
            told.insert(key, now);
        }
        false
    }
}

impl Events {
    pub fn new(client: kube::Client, runtime: tokio::runtime::Handle) -> Events {
        let reporter = Reporter {
            controller: REPORTER.into(),
            instance: std::env::var("POD_NAME").ok(),
        };
        Events {
            recorder: Recorder::new(client, reporter),
            runtime,
            writing: Arc::new(tokio::sync::Semaphore::new(WRITING)),
            waiting: Arc::default(),
            told: Told::default(),
        }
    }

    /// Publishes an Event about `object` (a workload as JSON). Returns at
    /// once; the write happens in the background.
    pub fn publish(&self, object: &Value, reason: Reason, note: String) {
        let Some(reference) = reference_to(object) else {
            return;
        };
        if self
            .told
            .repeated(reference.uid.as_deref().unwrap_or_default(), reason, Instant::now())
        {
            return;
        }
        if self.waiting.fetch_add(1, Ordering::SeqCst) >= WAITING {
            self.waiting.fetch_sub(1, Ordering::SeqCst);
            tracing::debug!(reason = reason.name(), "too many Events waiting; this one is dropped");
            return;
        }
        let event = Event {
            type_: if reason.warning() {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: reason.name().into(),
            // The API server caps a note at 1 kB.
            note: Some(note.chars().take(1000).collect()),
            action: reason.action().into(),
            secondary: None,
        };
        let recorder = self.recorder.clone();
        let (writing, waiting) = (self.writing.clone(), self.waiting.clone());
        self.runtime.spawn(async move {
            let permit = writing.acquire_owned().await;
            waiting.fetch_sub(1, Ordering::SeqCst);
            if permit.is_ok() {
                if let Err(e) = recorder.publish(&event, &reference).await {
                    tracing::debug!(error = %e, "could not publish an Event");
                }
            }
        });
    }
}

fn reference_to(object: &Value) -> Option<ObjectReference> {
    Some(ObjectReference {
        api_version: object["apiVersion"].as_str().map(str::to_string),
        kind: Some(object["kind"].as_str()?.to_string()),
        name: Some(object.meta_str("name")?.to_string()),
        namespace: object.namespace().map(str::to_string),
        uid: object.uid().map(str::to_string),
        resource_version: object.meta_str("resourceVersion").map(str::to_string),
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Round 3, lower finding: a planted look-alike is warned about once an
    /// hour, not at every pass; other objects and other reasons are told.
    #[test]
    fn the_same_warning_about_the_same_object_is_told_once_an_hour() {
        let told = Told::default();
        let start = Instant::now();
        assert!(!told.repeated("u1", Reason::Unproven, start));
        for pass in 1..=12u64 {
            let now = start + Duration::from_secs(pass * 5 * 60 - 1);
            assert!(told.repeated("u1", Reason::Unproven, now), "pass {pass}");
        }
        assert!(!told.repeated("u2", Reason::Unproven, start), "another object");
        assert!(!told.repeated("u1", Reason::EffectFailed, start), "another warning");
        assert!(!told.repeated("u1", Reason::Unproven, start + QUIET), "an hour later");
        // What is not a warning tells of a change each time.
        assert!(!told.repeated("u1", Reason::ConfigRolledOut, start));
        assert!(!told.repeated("u1", Reason::ConfigRolledOut, start));
    }

    #[test]
    fn what_it_remembers_is_bounded() {
        let told = Told::default();
        let start = Instant::now();
        for i in 0..REMEMBERED + 100 {
            told.repeated(&format!("u{i}"), Reason::Unproven, start);
        }
        assert!(told.0.lock().unwrap().len() <= REMEMBERED);
    }
}
