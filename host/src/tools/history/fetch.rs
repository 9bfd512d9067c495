//! The objects a history needs, read from a real API server with kube-rs.

use std::collections::BTreeSet;

use anyhow::{anyhow, Result};
use config_snapshot_policy::model::references;
use config_snapshot_policy::model::revocation::RECORD;
use config_snapshot_policy::model::source::SourceKind;
use serde_json::Value;

use super::kept::Target;

/// The objects `history` needs, read from the API server with kube-rs: the
/// workload, its revisions, and the ConfigMaps and Secrets they name (each
/// read by name: nothing else in the namespace is fetched), and the
/// namespace's revocation record.
pub async fn fetch(client: kube::Client, target: &Target, namespace: &str) -> Result<crate::replay::view::Objects> {
    use crate::serve::view::cache::{api_resource, trim};
    use kube::api::{Api, DynamicObject, ListParams};
    let api = |kind: &str| -> Api<DynamicObject> {
        let resource = api_resource(kind).expect("a kind of the table");
        Api::namespaced_with(client.clone(), namespace, &resource)
    };
    let as_value = |kind: &str, object: DynamicObject| -> Result<Value> {
        Ok(trim(object, &api_resource(kind).expect("a kind of the table")))
    };
    let workload = api(target.kind.kind())
        .get_opt(&target.name)
        .await
        .map_err(|e| anyhow!("reading {target}: {e}"))?
        .ok_or_else(|| anyhow!("{target} not found in namespace {namespace}"))?;
    let uid = workload.metadata.uid.clone();
    let mut objects = vec![as_value(target.kind.kind(), workload)?];
    let revisions = api(target.revision_kind())
        .list(&ListParams::default())
        .await
        .map_err(|e| anyhow!("listing {}s: {e}", target.revision_kind()))?;
    let mut names: BTreeSet<(SourceKind, String)> = BTreeSet::new();
    for revision in revisions.items {
        let owned = revision
            .metadata
            .owner_references
            .as_ref()
            .is_some_and(|refs| refs.iter().any(|r| Some(&r.uid) == uid.as_ref()));
        if !owned {
            continue;
        }
        let value = as_value(target.revision_kind(), revision)?;
        if let Some(template) = value.pointer(target.template_path()) {
            names.extend(references::collect(template).into_iter().map(|r| (r.kind, r.name)));
        }
        objects.push(value);
    }
    for (kind, name) in names {
        if let Some(object) = api(kind.kind())
            .get_opt(&name)
            .await
            .map_err(|e| anyhow!("reading {}/{name}: {e}", kind.tag()))?
        {
            objects.push(as_value(kind.kind(), object)?);
        }
    }
    // The revocation record: which of the snapshots gone were revoked.
    if let Some(record) = api("ConfigMap")
        .get_opt(RECORD)
        .await
        .map_err(|e| anyhow!("reading configmap/{RECORD}: {e}"))?
    {
        objects.push(as_value("ConfigMap", record)?);
    }
    Ok(crate::replay::view::Objects(objects))
}
