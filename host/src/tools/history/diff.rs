//! Two revisions compared: each source's values and the pod template, as
//! unified diffs, snapshot names not counted.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{anyhow, Result};
use config_snapshot_policy::model::template;
use serde::Serialize;

use super::kept::{History, Revision};

/// What changed between two revisions: each source's values and the
/// template, snapshot names not counted.
#[derive(Debug, Clone, Serialize)]
pub struct Diff {
    pub from: i64,
    pub to: i64,
    /// Unified diffs, by source (`configmap/app-config`), of the ones that differ.
    pub sources: BTreeMap<String, String>,
    /// The unified diff of the pod templates, if they differ.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
    /// Sources whose config cannot be compared (not snapshotted, or collected).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub unknown: BTreeMap<String, String>,
}

impl Diff {
    pub fn differs(&self) -> bool {
        !self.sources.is_empty() || self.template.is_some()
    }
}

pub fn diff(history: &History, from: i64, to: i64) -> Result<Diff> {
    let find = |n: i64| {
        history.revisions.iter().find(|r| r.revision == n).ok_or_else(|| {
            let kept: Vec<String> = history.revisions.iter().map(|r| r.revision.to_string()).collect();
            anyhow!("{} has no revision {n} (kept: {})", history.workload, kept.join(", "))
        })
    };
    let (a, b) = (find(from)?, find(to)?);
    let mut out = Diff {
        from,
        to,
        sources: BTreeMap::new(),
        template: None,
        unknown: BTreeMap::new(),
    };
    let names: BTreeSet<&String> = a.sources.iter().chain(&b.sources).map(|s| &s.source).collect();
    for name in names {
        let va = a.sources.iter().find(|s| &s.source == name);
        let vb = b.sources.iter().find(|s| &s.source == name);
        for (rev, side) in [(a, va), (b, vb)] {
            if let Some(s) = side.filter(|s| s.values.is_none()) {
                out.unknown
                    .insert(name.clone(), format!("revision {}: {}", rev.revision, s.state));
            }
        }
        let left = va.and_then(|s| s.values.as_ref());
        let right = vb.and_then(|s| s.values.as_ref());
        let text_a = left.map(|v| v.render(None)).unwrap_or_default();
        let text_b = right.map(|v| v.render(left)).unwrap_or_default();
        if let Some(d) = unified(&text_a, &text_b, name, from, to) {
            out.sources.insert(name.clone(), d);
        }
    }
    let yaml = |r: &Revision| serde_yaml_ng::to_string(&template::normalise(&r.template)).unwrap_or_default();
    out.template = unified(&yaml(a), &yaml(b), "template", from, to);
    Ok(out)
}

fn unified(a: &str, b: &str, what: &str, from: i64, to: i64) -> Option<String> {
    if a == b {
        return None;
    }
    let diff = similar::TextDiff::from_lines(a, b);
    Some(
        diff.unified_diff()
            .context_radius(3)
            .header(&format!("{what} (revision {from})"), &format!("{what} (revision {to})"))
            .to_string(),
    )
}
