//! What the cheap checks read of a workload, and nothing more: its
//! annotations and its pod template's, through serde types that skip the
//! rest of the object unparsed. The screen (`crate::admit::screen`), the revision
//! admission (`crate::admit::revision`) and the workload admission's pass-through
//! (`crate::admit::workload`) all decide "ours to look at or not" here, so none of
//! them reaches into another.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::model::keys;
use crate::model::optin::OptIn;
use crate::model::settings::Settings;

/// Just the annotations, for the pass-through check: serde skips the rest of
/// the object without building it.
#[derive(Deserialize, Default)]
#[serde(default)]
pub(crate) struct AnnotationsSkim {
    metadata: AnnotationsOnly,
    spec: TemplateSpecOnly,
}
#[derive(Deserialize, Default)]
#[serde(default)]
struct AnnotationsOnly {
    annotations: Option<BTreeMap<String, String>>,
}
/// A workload's spec: its pod template, or a CronJob's job template, whose
/// spec holds the pod template (the only nesting in the kinds table).
#[derive(Deserialize, Default)]
#[serde(default)]
struct TemplateSpecOnly {
    template: TemplateOnly,
    #[serde(rename = "jobTemplate")]
    job_template: Option<Box<JobTemplateOnly>>,
}
#[derive(Deserialize, Default)]
#[serde(default)]
struct JobTemplateOnly {
    spec: TemplateSpecOnly,
}
#[derive(Deserialize, Default)]
#[serde(default)]
struct TemplateOnly {
    metadata: AnnotationsOnly,
}

impl TemplateSpecOnly {
    fn pod_template(&self) -> &TemplateOnly {
        match &self.job_template {
            Some(job) => job.spec.pod_template(),
            None => &self.template,
        }
    }
}

/// Whether a workload is ours to look at: it opts in (or the settings opt
/// every workload in), or its template carries our marks, which must be
/// kept or cleaned. Anything else passes through untouched, but for the
/// host's records an update would drop (`workload::keep_records`).
pub(crate) fn opts_in(quick: &AnnotationsSkim, settings: &Settings) -> bool {
    let marked = quick
        .spec
        .pod_template()
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.keys().any(|k| keys::is_policy_template_annotation(k)));
    marked || OptIn::any_opt_in(quick.metadata.annotations.as_ref(), settings)
}

/// Only the annotations of the object an UPDATE replaces.
#[derive(Deserialize, Default)]
#[serde(default)]
pub(crate) struct Annotated {
    metadata: AnnotationsOnly,
}

impl Annotated {
    /// The host's records ([`keys::RECORDS`]) the object carries.
    pub(crate) fn into_records(self) -> Records {
        let mut annotations = self.metadata.annotations.unwrap_or_default();
        keys::RECORDS.map(|key| annotations.remove(key))
    }
}

/// Each of [`keys::RECORDS`], if present.
pub(crate) type Records = [Option<String>; 2];

impl AnnotationsSkim {
    /// Whether this object drops or changes a record `old` carried.
    pub(crate) fn loses_records(&self, old: &Records) -> bool {
        let annotations = self.metadata.annotations.as_ref();
        keys::RECORDS
            .iter()
            .zip(old)
            .any(|(key, kept)| kept.is_some() && annotations.and_then(|a| a.get(*key)) != kept.as_ref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::kinds::{Role, KINDS};
    use serde_json::{json, Value};

    /// The skim's serde types spell the template paths out (they parse
    /// without knowing the kind): every kind of the table the skim decides
    /// for must have its template where the skim looks, so that a kind
    /// added with a new path fails here, not in a cluster.
    #[test]
    fn the_skim_finds_the_template_of_every_kind_it_decides_for() {
        let settings = Settings::default();
        for kind in KINDS
            .iter()
            .filter(|k| matches!(k.role, Role::Workload { .. } | Role::Revision { standalone: true }))
        {
            let path = kind.template.expect("a holder has a template");
            let mut object = json!({"metadata": {"annotations": {keys::SNAPSHOTS: "{}"}}});
            for segment in path.rsplit('/').filter(|s| !s.is_empty()) {
                object = json!({ segment: object });
            }
            let skim: AnnotationsSkim = serde_json::from_value::<Value>(object)
                .and_then(serde_json::from_value)
                .unwrap();
            assert!(
                opts_in(&skim, &settings),
                "{}: the skim does not read {path}",
                kind.kind
            );
        }
    }
}
