//! Kubernetes Events on the workloads serve changes, so that `kubectl
//! describe deployment web` tells what happened to its config: a watch
//! rollout, a renewal, a rollout dropped because a rollback came first,
//! an effect given up. Published with kube-rs's recorder (repeats become
//! one Event with a count), off the caller's path: an Event that cannot be
//! written is logged and forgotten, never a reason to fail the work.

use config_snapshot_policy::object::ObjectExt;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use serde_json::Value;

use crate::lifecycle::Reason;

/// The controller name on every Event (`reportingController`).
pub(crate) const REPORTER: &str = "config-snapshot.io/serve";

pub struct Events {
    recorder: Recorder,
    runtime: tokio::runtime::Handle,
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
        }
    }

    /// Publishes an Event about `object` (a workload as JSON). Returns at
    /// once; the write happens in the background.
    pub fn publish(&self, object: &Value, reason: Reason, note: String) {
        let Some(reference) = reference_to(object) else {
            return;
        };
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
        self.runtime.spawn(async move {
            if let Err(e) = recorder.publish(&event, &reference).await {
                tracing::debug!(error = %e, "could not publish an Event");
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
