//! `config-snapshot annotate`: embeds `policy-metadata.yml` in the wasm as
//! Kubewarden's `io.kubewarden.metadata` custom section, the way
//! `kwctl annotate` does, for machines without kwctl.

use std::sync::Arc;

use anyhow::{anyhow, Context as _, Result};
use serde_json::{json, Value};
use wasm_encoder::{CustomSection, RawSection, Section};
use wasmparser::{Parser, Payload};

use config_snapshot_policy::host::host_error::{Code, HostError};

use crate::kubewarden::engine::{CallFailure, CallHandler, Engine};

pub(crate) const METADATA_SECTION: &str = "io.kubewarden.metadata";
pub(crate) const USAGE_ANNOTATION: &str = "io.kubewarden.policy.usage";

/// The metadata JSON to embed: the YAML, plus `protocolVersion` asked of
/// the module itself, plus the usage text.
pub fn metadata_json(metadata_yaml: &str, wasm: &[u8], usage: Option<&str>) -> Result<Value> {
    let mut metadata: Value = serde_yaml_ng::from_str(metadata_yaml).context("parsing the metadata")?;
    if !metadata.is_object() {
        return Err(anyhow!("the metadata must be a YAML map"));
    }
    // As kwctl annotate does since 1.35: a list of patterns the monorepo's
    // capability tree knows.
    if let Some(capabilities) = metadata.get("hostCapabilities") {
        let patterns: Vec<String> = serde_json::from_value(capabilities.clone())
            .context("hostCapabilities must be a list of capability patterns (kubernetes/get_resource, oci/*)")?;
        crate::kubewarden::gate::Allowed::parse(&patterns).context("hostCapabilities")?;
    }
    let engine = Engine::from_bytes(wasm, Engine::DEFAULT_TIMEOUT)?;
    let version = engine.call("protocol_version", b"", Arc::new(NoHost))?;
    let version: Value = serde_json::from_slice(&version).context("protocol_version answered invalid JSON")?;
    metadata["protocolVersion"] = version;
    if let Some(usage) = usage {
        if !metadata["annotations"].is_object() {
            metadata["annotations"] = json!({});
        }
        metadata["annotations"][USAGE_ANNOTATION] = json!(usage);
    }
    Ok(metadata)
}

/// Returns `wasm` with its metadata section replaced by `metadata`.
pub fn embed(wasm: &[u8], metadata: &Value) -> Result<Vec<u8>> {
    if wasm.len() < 8 {
        return Err(anyhow!("not a wasm module"));
    }
    let mut out = wasm[..8].to_vec();
    for payload in Parser::new(0).parse_all(wasm) {
        let payload = payload.context("parsing the wasm module")?;
        if let Payload::CustomSection(reader) = &payload {
            if reader.name() == METADATA_SECTION {
                continue;
            }
        }
        if let Some((id, range)) = payload.as_section() {
            let data = &wasm[range.start as usize..range.end as usize];
            RawSection { id, data }.append_to(&mut out);
        }
    }
    let data = serde_json::to_vec(metadata)?;
    CustomSection {
        name: METADATA_SECTION.into(),
        data: data.into(),
    }
    .append_to(&mut out);
    Ok(out)
}

/// Reads the embedded metadata back, as Kubewarden does.
pub fn read(wasm: &[u8]) -> Result<Option<Value>> {
    for payload in Parser::new(0).parse_all(wasm) {
        if let Payload::CustomSection(reader) = payload? {
            if reader.name() == METADATA_SECTION {
                return Ok(Some(serde_json::from_slice(reader.data())?));
            }
        }
    }
    Ok(None)
}

/// The module imports, as `module.name`; Kubewarden runs only modules that
/// import waPC and WASI.
pub fn imports(wasm: &[u8]) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for payload in Parser::new(0).parse_all(wasm) {
        if let Payload::ImportSection(reader) = payload? {
            for import in reader.into_imports() {
                let import = import?;
                out.push(format!("{}.{}", import.module, import.name));
            }
        }
    }
    Ok(out)
}

struct NoHost;
impl CallHandler for NoHost {
    fn call(&self, _: &str, _: &str, op: &str, _: &[u8]) -> Result<Vec<u8>, CallFailure> {
        Err(CallFailure::Ours(HostError::new(
            Code::Unsupported,
            format!("no host calls while annotating ({op})"),
        )))
    }
}
