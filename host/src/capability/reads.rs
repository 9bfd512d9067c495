//! Kubewarden's reads (`get_resource`, `list_resources_by_namespace`) with
//! the SDK's payloads, and our `list_referencing`, answered from the
//! cluster's reads (serve: its caches; `disable_cache`: the API server).

use config_snapshot_policy::host::contract::{GetResourceRequest, ListReferencing, ListResourcesByNamespaceRequest};
use config_snapshot_policy::host::host_error::{Code, HostError};
use config_snapshot_policy::model::kinds;
use config_snapshot_policy::model::object::ObjectExt;
use config_snapshot_policy::model::selection::is_dns_subdomain;
use config_snapshot_policy::model::source::{SourceId, SourceKind};
use serde_json::{json, Value};

use super::{failed, same_namespace, Capability, Reply};
use crate::cluster::Cluster;
use crate::cluster::{self, Selector};
use crate::kubewarden::masks;

/// A list answer (`{"apiVersion", "kind": "…List", "items"}`) of what
/// `list` visits, each item pruned to `masks`. Written by hand around the
/// items so each is serialised straight from the store, pruned on the fly.
fn masked_list(
    api_version: &str,
    kind: &str,
    masks: Option<Vec<String>>,
    list: impl FnOnce(&mut dyn FnMut(&Value)) -> cluster::Result<()>,
) -> Result<Reply, HostError> {
    let masks = masks.unwrap_or_default();
    let split: Vec<Vec<&str>> = masks.iter().map(|m| m.split('.').collect()).collect();
    let mut out = format!(
        r#"{{"apiVersion":{},"kind":"{kind}List","metadata":{{}},"items":["#,
        json!(api_version)
    )
    .into_bytes();
    let mut first = true;
    let mut failed_item = None;
    list(&mut |object| {
        if !first {
            out.push(b',');
        }
        first = false;
        if let Err(e) = serde_json::to_writer(&mut out, &masks::Masked::new(object, &split)) {
            failed_item = Some(e);
        }
    })
    .map_err(failed)?;
    if let Some(e) = failed_item {
        return Err(HostError::new(Code::Unavailable, e.to_string()));
    }
    out.extend_from_slice(b"]}");
    Ok(Reply::Raw(out))
}

/// Refused unless `kind` is one of the table's, at its own apiVersion: the
/// host serves nothing else.
fn check_api_version(api_version: &str, kind: &str) -> Result<(), HostError> {
    match kinds::find(kind) {
        Some(k) if k.api_version == api_version => Ok(()),
        _ => Err(HostError::new(
            Code::BadRequest,
            format!("this host does not serve {api_version} {kind}"),
        )),
    }
}

/// Refused unless `name` is an object's name (DNS-1123 subdomain): only a
/// forged review's template carries anything else, and nothing is read
/// for it.
fn a_name(name: &str) -> Result<(), HostError> {
    if is_dns_subdomain(name) {
        Ok(())
    } else {
        Err(HostError::new(
            Code::BadRequest,
            format!("{} is not an object's name", crate::cluster::shown(name)),
        ))
    }
}

/// A `metadata.name=NAME` field selector, the one form the policy sends.
fn name_selector(field_selector: Option<&str>) -> Result<Option<&str>, HostError> {
    match field_selector {
        None | Some("") => Ok(None),
        Some(s) => s
            .strip_prefix("metadata.name=")
            .map(Some)
            .ok_or_else(|| HostError::new(Code::BadRequest, format!("unsupported field selector {s:?}"))),
    }
}

impl Capability {
    pub(super) fn get_resource(&self, req: GetResourceRequest) -> Result<Reply, HostError> {
        check_api_version(&req.api_version, &req.kind)?;
        let ns = req.namespace.unwrap_or_default();
        same_namespace(&self.caller, &ns)?;
        a_name(&req.name)?;
        let object = if req.disable_cache {
            self.cluster.get_fresh(&req.kind, &ns, &req.name)
        } else {
            self.cluster.get(&req.kind, &ns, &req.name)
        }
        .map_err(failed)?
        .ok_or_else(|| {
            HostError::new(
                Code::NotFound,
                format!(
                    "{} {:?} not found",
                    kinds::find(&req.kind).map_or("", |k| k.plural),
                    req.name
                ),
            )
        })?;
        let masks: Vec<String> = req.field_masks.unwrap_or_default().into_iter().collect();
        let reply = masks::prune(&object, &masks);
        // A source read fresh is kept, moved and not copied, for the
        // snapshots made of it.
        if let Some(kind) = SourceKind::from_kind(&req.kind).filter(|_| req.disable_cache) {
            self.remember(kind, object)?;
        }
        Ok(Reply::Json(reply))
    }

    pub(super) fn list_resources(&self, req: ListResourcesByNamespaceRequest) -> Result<Reply, HostError> {
        check_api_version(&req.api_version, &req.kind)?;
        same_namespace(&self.caller, &req.namespace)?;
        let selector = Selector::parse(req.label_selector.as_deref().unwrap_or(""))
            .map_err(|e| HostError::new(Code::BadRequest, e.to_string()))?;
        let name = name_selector(req.field_selector.as_deref())?;
        let masks = req.field_masks.map(|m| m.into_iter().collect());
        masked_list(&req.api_version, &req.kind, masks, |visit| {
            self.cluster.list(&req.kind, Some(&req.namespace), &selector, &mut |o| {
                if name.is_none_or(|n| o.meta_str("name") == Some(n)) {
                    visit(o)
                }
            })
        })
    }

    /// The workloads referencing a source, from the cluster's index, in the
    /// shape of a list answer (docs/design.md, "Host capability contract").
    pub(super) fn list_referencing(&self, req: ListReferencing) -> Result<Reply, HostError> {
        let (kind, source_kind) = (req.kind, req.source_kind);
        same_namespace(&self.caller, &req.namespace)?;
        a_name(&req.source_name)?;
        let source = SourceId::new(source_kind, &req.source_name);
        masked_list(kind.api_version(), kind.kind(), req.field_masks, |visit| {
            self.cluster
                .list_referencing(kind.kind(), &req.namespace, &source, visit)
        })
    }
}
