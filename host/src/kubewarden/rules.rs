//! The webhook rules of `policy-metadata.yml`: the one list of kinds and
//! operations the policy handles, shared by replay and the packaging.

use serde::Deserialize;

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

fn any(list: &[String], value: &str) -> bool {
    list.iter().any(|v| v == "*" || v == value)
}
