//! The webhook rules of `policy-metadata.yml`: the one list of kinds and
//! operations the policy handles, shared by replay and the packaging.

use config_snapshot_policy::model::kinds::marked;
use config_snapshot_policy::model::object::ObjectExt;
use config_snapshot_policy::model::settings::Settings;
use serde::Deserialize;
use serde_json::Value;

pub(crate) const METADATA: &str = include_str!("../../../policy-metadata.yml");

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Rule {
    pub api_groups: Vec<String>,
    pub api_versions: Vec<String>,
    pub resources: Vec<String>,
    pub operations: Vec<String>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct WebhookRules {
    pub rules: Vec<Rule>,
}

impl WebhookRules {
    pub fn embedded() -> WebhookRules {
        serde_yaml_ng::from_str(METADATA).expect("policy-metadata.yml is valid (checked by tests)")
    }

    /// Whether a write of `resource` (plural) in `api_version` goes to the policy.
    pub fn matches(&self, api_version: &str, resource: &str, operation: &str) -> bool {
        let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
        self.rules.iter().any(|r| {
            any(&r.api_groups, group)
                && any(&r.api_versions, version)
                && any(&r.resources, resource)
                && any(&r.operations, operation)
        })
    }
}

/// The name of the webhook's matchCondition that holds
/// [`config_snapshot_policy::model::kinds::marked_condition`].
pub const MARKED: &str = "config-snapshot-marked";

/// Whether kube-apiserver calls the webhook for a write its rules match,
/// as the shipped matchConditions decide (deploy/serve/webhook.yaml, the
/// chart): never for a Pod a controller made; otherwise only when the
/// object or the object it replaces carries config-snapshot's annotations
/// ([`marked`]), unless the settings opt every workload in (then the
/// condition is left out: deploy/components/by-default, and the chart from
/// its settings). The simulator decides by it, as the real API server does.
pub fn called_for(object: &Value, old: Option<&Value>, settings: &Settings) -> bool {
    if object["kind"] == "Pod" && object.controller().is_some() {
        return false;
    }
    settings.snapshot_by_default || settings.watch_by_default || marked(object) || old.is_some_and(marked)
}

fn any(list: &[String], value: &str) -> bool {
    list.iter().any(|v| v == "*" || v == value)
}
