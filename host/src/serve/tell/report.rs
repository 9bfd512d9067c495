//! What serve does with what the orchestration reports: a log line for
//! each note, a Kubernetes Event for each thing a workload's users should
//! learn, and the counters Prometheus scrapes.

use config_snapshot_policy::model::object::ObjectExt;
use std::sync::Arc;

use serde_json::Value;

use super::events::Events;
use super::metrics::Metrics;
use crate::lifecycle::{Observer, Reason};

pub struct Report {
    pub events: Events,
    pub metrics: Arc<Metrics>,
}

impl Observer for Report {
    fn note(&self, line: String) {
        tracing::info!(target: "config_snapshot::host", "{line}");
    }

    fn tell(&self, object: &Value, reason: Reason, message: String) {
        if reason == Reason::ConfigRolledOut {
            self.metrics.rollouts.inc();
        }
        let (kind, name) = (object["kind"].as_str().unwrap_or_default(), object.name());
        if reason.warning() {
            tracing::warn!(target: "config_snapshot::host", reason = reason.name(), kind, name, "{message}");
        } else {
            tracing::info!(target: "config_snapshot::host", reason = reason.name(), kind, name, "{message}");
        }
        self.events.publish(object, reason, message);
    }

    fn adopted(&self, line: String) {
        self.metrics.adoptions.inc();
        self.note(line);
    }
}
