//! What the API server does to an object before admission: defaulting
//! its apiVersion and namespace, and folding a Secret's `stringData`.

use anyhow::{anyhow, bail, Result};
use base64::Engine as _;
use config_snapshot_policy::model::kinds;
use config_snapshot_policy::model::object::ObjectExt;
use serde_json::{json, Value};

/// A Secret's `stringData` folded into base64 `data`, as the API server
/// stores it; a value that is not a string is refused, as it refuses one.
pub(crate) fn fold_string_data(secret: &mut Value) -> Result<()> {
    let Some(Value::Object(string_data)) = secret.as_object_mut().and_then(|o| o.remove("stringData")) else {
        return Ok(());
    };
    if !secret["data"].is_object() {
        secret["data"] = json!({});
    }
    for (k, v) in string_data {
        let text = v.as_str().ok_or_else(|| anyhow!("stringData.{k} is not a string"))?;
        secret["data"][k] = json!(base64::engine::general_purpose::STANDARD.encode(text));
    }
    Ok(())
}

/// What the API server does to an object before admission: fill in the
/// apiVersion and namespace, and fold a Secret's `stringData` into `data`.
pub(crate) fn prepare(mut object: Value, old: Option<&Value>) -> Result<Value> {
    if !object.is_object() || object["kind"].as_str().is_none() || object.meta_str("name").is_none() {
        bail!("an object needs kind and metadata.name");
    }
    if object["apiVersion"].as_str().is_none() {
        if let Some(k) = kinds::find(object["kind"].as_str().unwrap_or_default()) {
            object["apiVersion"] = json!(k.api_version);
        }
    }
    if object.namespace().is_none() {
        object.set_meta("namespace", json!(old.and_then(|o| o.namespace()).unwrap_or("default")));
    }
    if object["kind"] == "Secret" {
        fold_string_data(&mut object)?;
        if object.get("type").is_none() {
            object["type"] = json!("Opaque");
        }
    }
    Ok(object)
}
