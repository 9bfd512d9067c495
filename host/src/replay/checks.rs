//! What a scenario checks: `expect` about the last admission, and
//! `assert` about the cluster, judged the same over replay's cluster and
//! over objects read from a real API server ([`View`]).

use config_snapshot_policy::model::object::ObjectExt;
use std::collections::BTreeMap;

use base64::Engine as _;
use config_snapshot_policy::model::content::{Content, ContentError};
use config_snapshot_policy::model::source::{SourceId, SourceKind};
use config_snapshot_policy::model::template;
use serde_json::{json, Value};

use crate::cluster::selector::Selector;
use crate::replay::invariants;
use crate::replay::scenario::{Check, EffectiveConfig, Expect, Invariant};
use crate::replay::simulator::Admission;
use crate::replay::view::View;

/// One check of a step, as the result reports it.
#[derive(Debug, serde::Serialize)]
pub struct CheckResult {
    pub check: String,
    pub ok: bool,
    pub detail: String,
}

/// Evaluates an `expect` step against the last admission.
pub fn expect(last: Option<&Admission>, e: &Expect, checks: &mut Vec<CheckResult>) {
    let Some(a) = last else {
        checks.push(CheckResult {
            check: "expect".into(),
            ok: false,
            detail: "the previous step made no admission request".into(),
        });
        return;
    };
    if let Some(allowed) = e.allowed {
        checks.push(CheckResult {
            check: format!("allowed == {allowed}"),
            ok: a.allowed == allowed,
            detail: format!(
                "allowed was {} (message: {})",
                a.allowed,
                a.message.as_deref().unwrap_or("none")
            ),
        });
    }
    if let Some(warnings) = &e.warnings {
        if warnings.is_empty() {
            checks.push(CheckResult {
                check: "no warnings".into(),
                ok: a.warnings.is_empty(),
                detail: format!("warnings: {:?}", a.warnings),
            });
        }
        for w in warnings {
            checks.push(CheckResult {
                check: format!("warning contains {w:?}"),
                ok: a.warnings.iter().any(|x| x.contains(w.as_str())),
                detail: format!("warnings: {:?}", a.warnings),
            });
        }
    }
    if let Some(m) = &e.message_contains {
        checks.push(CheckResult {
            check: format!("message contains {m:?}"),
            ok: a.message.as_deref().is_some_and(|x| x.contains(m.as_str())),
            detail: format!("message: {:?}", a.message),
        });
    }
}

/// Evaluates one check against a view of a cluster.
#[expect(clippy::too_many_lines, reason = "a table: one arm per scenario check kind")]
pub fn assert(sim: &dyn View, check: &Check) -> CheckResult {
    match check {
        Check::EffectiveConfig(ec) => {
            let name = format!("effectiveConfig {}/{} {}", ec.kind, ec.name, ec.source);
            let secret = ec.source.starts_with("secret/");
            match effective_config(sim, ec) {
                Ok((object, data)) => {
                    let want: BTreeMap<String, String> = serde_json::from_value(ec.data.clone()).unwrap_or_default();
                    let ok = data == want;
                    let detail = if ok {
                        format!("reads {object}")
                    } else if secret {
                        // Never print Secret values, even in a failing test.
                        format!(
                            "reads {object} with keys {:?}, which differ from the expected keys {:?} or values",
                            data.keys().collect::<Vec<_>>(),
                            want.keys().collect::<Vec<_>>()
                        )
                    } else {
                        format!("reads {object} = {}, expected {}", json!(data), json!(want))
                    };
                    CheckResult {
                        check: name,
                        ok,
                        detail,
                    }
                }
                Err(e) => CheckResult {
                    check: name,
                    ok: false,
                    detail: e.to_string(),
                },
            }
        }
        Check::Exists(r) | Check::Absent(r) => {
            let want = matches!(check, Check::Exists(_));
            let found = sim.get(&r.kind, &r.namespace, &r.name).is_some();
            CheckResult {
                check: format!("{} {}/{}", if want { "exists" } else { "absent" }, r.kind, r.name),
                ok: found == want,
                detail: if found {
                    "it exists".into()
                } else {
                    "it does not exist".into()
                },
            }
        }
        Check::Count(c) => {
            let check = format!(
                "count {} {} == {}",
                c.kind,
                c.selector.as_deref().unwrap_or(""),
                c.equals
            );
            match Selector::parse(c.selector.as_deref().unwrap_or("")) {
                Ok(sel) => {
                    let found: Vec<String> = sim
                        .objects()
                        .iter()
                        .filter(|o| {
                            o["kind"] == c.kind.as_str()
                                && o.namespace() == Some(c.namespace.as_str())
                                && sel.matches(o)
                        })
                        .map(|o| o.name().to_string())
                        .collect();
                    CheckResult {
                        ok: found.len() == c.equals,
                        detail: format!("found {}: {found:?}", found.len()),
                        check,
                    }
                }
                Err(e) => CheckResult {
                    check,
                    ok: false,
                    detail: e.to_string(),
                },
            }
        }
        Check::Invariants(list) => {
            let objects = sim.objects();
            let mut broken = Vec::new();
            for invariant in list {
                broken.extend(match invariant {
                    Invariant::NothingDangles => invariants::nothing_dangles(&objects),
                    Invariant::GarbageBounded => invariants::garbage_bounded(&objects, &sim.awaited()),
                });
            }
            CheckResult {
                check: format!("invariants {list:?}"),
                ok: broken.is_empty(),
                detail: if broken.is_empty() {
                    "hold".into()
                } else {
                    broken.join("; ")
                },
            }
        }
        Check::JsonPath(j) => {
            let name = match &j.snapshot_of {
                None => j.name.clone(),
                Some(of) => {
                    let ec = EffectiveConfig {
                        kind: of.kind.clone(),
                        name: of.name.clone(),
                        namespace: j.namespace.clone(),
                        source: of.source.clone(),
                        data: Value::Null,
                    };
                    match effective_config(sim, &ec) {
                        // `Kind/name` of the object read.
                        Ok((read, _)) => read.rsplit('/').next().unwrap_or_default().to_string(),
                        Err(e) => {
                            return CheckResult {
                                check: format!("jsonPath snapshot of {} in {}/{}", of.source, of.kind, of.name),
                                ok: false,
                                detail: e.to_string(),
                            }
                        }
                    }
                }
            };
            let check = format!("jsonPath {}/{} {} == {}", j.kind, name, j.path, j.equals);
            let Some(object) = sim.get(&j.kind, &j.namespace, &name) else {
                return CheckResult {
                    check,
                    ok: false,
                    detail: "the object does not exist".into(),
                };
            };
            let path = if j.path.starts_with('$') {
                j.path.clone()
            } else if j.path.starts_with('.') || j.path.starts_with('[') {
                format!("${}", j.path)
            } else {
                format!("$.{}", j.path)
            };
            match serde_json_path::JsonPath::parse(&path) {
                Ok(p) => {
                    let found: Vec<&Value> = p.query(&object).all();
                    let got = match found.as_slice() {
                        [one] => (*one).clone(),
                        [] => Value::Null,
                        many => json!(many),
                    };
                    let secret_data =
                        j.kind == "Secret" && (path.contains("data") || path.contains('*') || path.contains(".."));
                    let detail = if got == j.equals || !secret_data {
                        format!("got {got}")
                    } else {
                        "got a different value (Secret data is not printed)".into()
                    };
                    CheckResult {
                        ok: got == j.equals,
                        detail,
                        check,
                    }
                }
                Err(e) => CheckResult {
                    check,
                    ok: false,
                    detail: format!("bad JSONPath: {e}"),
                },
            }
        }
    }
}

/// Why a workload's effective config cannot be told.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EffectiveError {
    #[error("source must be configmap/NAME or secret/NAME")]
    Source,
    #[error("{kind}/{name} has no current revision")]
    NoRevision { kind: String, name: String },
    #[error("the current revision does not reference {0}")]
    NotReferenced(SourceId),
    #[error("the references to {id} disagree: {names:?}")]
    Disagree { id: SourceId, names: Vec<String> },
    #[error("the current revision references {kind}/{name}, which does not exist")]
    Missing { kind: &'static str, name: String },
    #[error(transparent)]
    Content(#[from] ContentError),
}

/// The data the pods of the workload's current revision read from a source:
/// follows the revision's reference, through a snapshot if it names one.
pub fn effective_config(
    sim: &dyn View,
    ec: &EffectiveConfig,
) -> Result<(String, BTreeMap<String, String>), EffectiveError> {
    let (tag, source_name) = ec.source.split_once('/').ok_or(EffectiveError::Source)?;
    let kind = SourceKind::from_tag(tag).ok_or(EffectiveError::Source)?;
    let id = SourceId::new(kind, source_name);
    let template = sim
        .get(&ec.kind, &ec.namespace, &ec.name)
        .and_then(|object| {
            config_snapshot_policy::model::kinds::running_template(&object, || {
                sim.current_revision_template(&ec.kind, &ec.namespace, &ec.name)
            })
        })
        .ok_or_else(|| EffectiveError::NoRevision {
            kind: ec.kind.clone(),
            name: ec.name.clone(),
        })?;
    let group = template::own_group(&template, &id).ok_or_else(|| EffectiveError::NotReferenced(id.clone()))?;
    let mut names: Vec<&str> = group.refs.iter().map(|r| r.name.as_str()).collect();
    names.dedup();
    if names.len() != 1 {
        return Err(EffectiveError::Disagree {
            id,
            names: names.into_iter().map(str::to_string).collect(),
        });
    }
    let object_name = names[0];
    let Some(object) = sim.get(kind.kind(), &ec.namespace, object_name) else {
        return if group.all_optional() {
            Ok((format!("{} (optional, missing)", object_name), BTreeMap::new()))
        } else {
            Err(EffectiveError::Missing {
                kind: kind.kind(),
                name: object_name.to_string(),
            })
        };
    };
    let content = Content::from_object(kind, &object)?.subset(group.key_subset().as_ref());
    let mut data = BTreeMap::new();
    for (k, v) in content.data.iter().chain(content.binary_data.iter()) {
        let value = if kind == SourceKind::Secret || content.binary_data.contains_key(k) {
            base64::engine::general_purpose::STANDARD
                .decode(v)
                .ok()
                .and_then(|b| String::from_utf8(b).ok())
                .unwrap_or_else(|| v.clone())
        } else {
            v.clone()
        };
        data.insert(k.clone(), value);
    }
    Ok((format!("{}/{object_name}", kind.kind()), data))
}
