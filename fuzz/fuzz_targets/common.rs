//! A small cluster shared by the validate targets.

use config_snapshot_policy::host::fake::FakeHost;
use serde_json::json;

pub fn host() -> FakeHost {
    FakeHost::with(vec![
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "app", "namespace": "default", "resourceVersion": "1"}, "data": {"a": "1", "b": "2"}}),
        json!({"apiVersion": "v1", "kind": "Secret", "type": "Opaque", "metadata": {"name": "creds", "namespace": "default", "resourceVersion": "2"}, "data": {"p": "cA=="}}),
        json!({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/service-account-token", "metadata": {"name": "tok", "namespace": "default"}, "data": {"t": "dA=="}}),
    ])
}

/// Every answer is well-formed: a refusal says who refused.
pub fn check(out: &config_snapshot_policy::model::request::Outcome) {
    if !out.accepted {
        let message = out.message.as_deref().unwrap_or_default();
        assert!(message.starts_with("config-snapshot: "), "unclear refusal: {message}");
    }
}
