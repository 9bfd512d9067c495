//! `config-snapshot review`: AdmissionReview files in, AdmissionReview
//! responses out, with the JSON Patch base64-encoded as the API server
//! expects it (like `kwctl run`).

use std::path::Path;
use std::sync::Arc;

use anyhow::{anyhow, Context as _, Result};
use base64::Engine as _;
use serde_json::{json, Value};

use crate::kubewarden::engine::{CallHandler, Engine};

/// Evaluates one request with `host` answering the policy's calls, as
/// stock Kubewarden would (see `super::interactions`): nothing is
/// persisted and no effect is queued.
pub fn on_host(engine: &Engine, settings: &Value, request: &Value, host: Arc<dyn CallHandler>) -> Result<Value> {
    let validation = engine.validate(request, settings, host)?;
    let mutated = validation.get("mutated_object").filter(|v| !v.is_null());
    response(request, &validation, mutated)
}

/// Reads an AdmissionReview v1 file, or a bare AdmissionRequest as kwctl
/// takes them, in JSON or YAML.
pub fn read_request(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let doc: Value = serde_yaml_ng::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    let request = match doc.get("request") {
        Some(r) if doc["kind"] == "AdmissionReview" || doc.get("apiVersion").is_some() => r.clone(),
        _ => doc,
    };
    if request.get("uid").is_none() || request.get("kind").is_none() {
        return Err(anyhow!(
            "{} is neither an AdmissionReview nor an AdmissionRequest (needs uid and kind)",
            path.display()
        ));
    }
    Ok(request)
}

/// The AdmissionReview response for a Kubewarden ValidationResponse.
pub fn response(request: &Value, validation: &Value, mutated: Option<&Value>) -> Result<Value> {
    let allowed = validation["accepted"].as_bool().unwrap_or(false);
    let mut response = json!({"uid": request["uid"], "allowed": allowed});
    if !allowed {
        response["status"] = json!({
            "message": validation["message"],
            "code": validation["code"].as_u64().unwrap_or(400),
        });
    }
    if let (true, Some(m)) = (allowed, mutated) {
        let patch = json_patch::diff(&request["object"], m);
        if !patch.0.is_empty() {
            let bytes = serde_json::to_vec(&patch)?;
            response["patchType"] = json!("JSONPatch");
            response["patch"] = json!(base64::engine::general_purpose::STANDARD.encode(bytes));
        }
    }
    if let Some(w) = validation["warnings"].as_array().filter(|w| !w.is_empty()) {
        response["warnings"] = json!(w);
    }
    Ok(json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}))
}

/// Splits a multi-document YAML stream, as kubectl reads `-f`.
pub fn read_objects(path: &Path) -> Result<Vec<Value>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut out = Vec::new();
    for doc in serde_yaml_ng::Deserializer::from_str(&text) {
        let v: Value = serde::Deserialize::deserialize(doc).with_context(|| format!("parsing {}", path.display()))?;
        match v {
            Value::Null => {}
            Value::Object(ref o) if o.get("kind").and_then(Value::as_str) == Some("List") => {
                out.extend(o.get("items").and_then(Value::as_array).cloned().unwrap_or_default());
            }
            other => out.push(other),
        }
    }
    Ok(out)
}
