//! Label selectors, in the equality-based forms `kubectl -l` users write
//! most (`a=b,c!=d,e,!f`). Set-based forms are refused, not ignored: a
//! selector read as something else would select other objects.

use config_snapshot_policy::model::keys;
use config_snapshot_policy::model::object::ObjectExt;
use serde_json::Value;

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Selector(Vec<(String, Requirement)>);

#[derive(Debug, Clone, PartialEq)]
enum Requirement {
    Equals(String),
    NotEquals(String),
    Exists,
    NotExists,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unsupported label selector {0:?}: only equality-based selectors")]
pub struct SelectorError(String);

impl Selector {
    pub fn parse(text: &str) -> Result<Selector, SelectorError> {
        let mut out = Vec::new();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            if part.contains(" in ") || part.contains(" notin ") || part.contains('(') {
                return Err(SelectorError(part.to_string()));
            }
            let req = if let Some((k, v)) = part.split_once("!=") {
                (k.trim().to_string(), Requirement::NotEquals(v.trim().to_string()))
            } else if let Some((k, v)) = part.split_once("==").or_else(|| part.split_once('=')) {
                (k.trim().to_string(), Requirement::Equals(v.trim().to_string()))
            } else if let Some(k) = part.strip_prefix('!') {
                (k.trim().to_string(), Requirement::NotExists)
            } else {
                (part.to_string(), Requirement::Exists)
            };
            out.push(req);
        }
        Ok(Selector(out))
    }

    /// Objects carrying config-snapshot's label: the candidates for being
    /// snapshots, which the lifecycle then checks one by one.
    pub fn managed() -> Selector {
        Selector(vec![(
            keys::MANAGED_BY.to_string(),
            Requirement::Equals(keys::MANAGED_BY_VALUE.to_string()),
        )])
    }

    /// Whether a requirement is on label `key`.
    pub fn mentions(&self, key: &str) -> bool {
        self.0.iter().any(|(k, _)| k == key)
    }

    /// The selector without its requirements on `key`: selects a superset.
    pub fn without(&self, key: &str) -> Selector {
        Selector(self.0.iter().filter(|(k, _)| k != key).cloned().collect())
    }

    pub fn matches(&self, object: &Value) -> bool {
        self.0.iter().all(|(k, req)| {
            let v = object.label(k);
            match req {
                Requirement::Equals(want) => v == Some(want.as_str()),
                Requirement::NotEquals(want) => v != Some(want.as_str()),
                Requirement::Exists => v.is_some(),
                Requirement::NotExists => v.is_none(),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn selectors() {
        let obj = json!({"metadata": {"labels": {"app": "web", "tier": "fe"}}});
        for (sel, want) in [
            ("app=web", true),
            ("app==web,tier", true),
            ("app!=web", false),
            ("!tier", false),
            ("", true),
            ("x", false),
        ] {
            assert_eq!(Selector::parse(sel).unwrap().matches(&obj), want, "{sel}");
        }
        assert!(Selector::parse("app in (a,b)").is_err());
    }
}
