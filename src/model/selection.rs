//! The source lists in workload annotations and settings:
//! `*`, or a comma list of `configmap/NAME`, `secret/NAME`, bare `NAME`,
//! or a whole kind, `configmap/*` or `secret/*`.

use crate::model::source::{SourceId, SourceKind};

/// One entry of a source list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pattern {
    /// `*`: every source.
    All,
    /// `configmap/*` or `secret/*`: every source of that kind (Reloader's
    /// `configmap.reloader.stakater.com/auto`, its `ignoreSecrets`).
    Kind(SourceKind),
    /// `configmap/NAME` or `secret/NAME`.
    Exact(SourceId),
    /// Bare `NAME`: a ConfigMap or a Secret of that name.
    Named(String),
}

impl Pattern {
    pub(crate) fn matches(&self, id: &SourceId) -> bool {
        match self {
            Pattern::All => true,
            Pattern::Kind(kind) => *kind == id.kind,
            Pattern::Exact(exact) => exact == id,
            Pattern::Named(name) => *name == id.name,
        }
    }

    /// Whether this entry names `id` itself, by its name: a word about
    /// that one source, where `*` and a whole kind are words about all of
    /// them (docs/design.md, "The source decides": a source's own word
    /// overrides the general ones, never a name).
    fn names(&self, id: &SourceId) -> bool {
        matches!(self, Pattern::Exact(_) | Pattern::Named(_)) && self.matches(id)
    }
}

/// Why a source list was refused: each names the annotation or setting
/// and quotes the offending token, so users can find it in a long list.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ListError {
    #[error("{what}: empty source list {value:?}")]
    Empty { what: String, value: String },
    #[error("{what}: \"*\" is not allowed here")]
    Wildcard { what: String },
    #[error("{what}: bad token {token:?}: kind must be \"configmap\" or \"secret\"")]
    Kind { what: String, token: String },
    #[error("{what}: bad token {token:?}: {name:?} is not a valid object name")]
    Name { what: String, token: String, name: String },
}

/// A parsed source list.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SourceList(pub Vec<Pattern>);

impl SourceList {
    pub(crate) fn all() -> Self {
        SourceList(vec![Pattern::All])
    }

    pub(crate) fn matches(&self, id: &SourceId) -> bool {
        self.0.iter().any(|p| p.matches(id))
    }

    /// Whether an entry names `id` by its name ([`Pattern::names`]).
    pub(crate) fn names(&self, id: &SourceId) -> bool {
        self.0.iter().any(|p| p.names(id))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Parses a list. `what` names the annotation or setting in errors, and the
    /// error quotes the offending token, so users can find it in a long list.
    pub fn parse(what: &str, value: &str, allow_wildcard: bool) -> Result<Self, ListError> {
        let mut patterns = Vec::new();
        for raw in value.split(',') {
            let token = raw.trim();
            if token.is_empty() {
                continue;
            }
            patterns.push(parse_token(what, token, allow_wildcard)?);
        }
        if patterns.is_empty() && !value.trim().is_empty() {
            return Err(ListError::Empty {
                what: what.to_string(),
                value: value.to_string(),
            });
        }
        Ok(SourceList(patterns))
    }
}

fn parse_token(what: &str, token: &str, allow_wildcard: bool) -> Result<Pattern, ListError> {
    if token == "*" {
        return if allow_wildcard {
            Ok(Pattern::All)
        } else {
            Err(ListError::Wildcard { what: what.to_string() })
        };
    }
    let (kind, name) = match token.split_once('/') {
        Some((tag, name)) => {
            let kind = SourceKind::from_tag(tag).ok_or_else(|| ListError::Kind {
                what: what.to_string(),
                token: token.to_string(),
            })?;
            (Some(kind), name)
        }
        None => (None, token),
    };
    // A whole kind is allowed wherever a name is, `*` or not: it is no
    // wildcard over everything (`excludedSources: [secret/*]` keeps every
    // Secret out, as Reloader's ignoreSecrets does).
    if let (Some(kind), "*") = (kind, name) {
        return Ok(Pattern::Kind(kind));
    }
    if !is_dns_subdomain(name) {
        return Err(ListError::Name {
            what: what.to_string(),
            token: token.to_string(),
            name: name.to_string(),
        });
    }
    Ok(match kind {
        Some(kind) => Pattern::Exact(SourceId::new(kind, name)),
        None => Pattern::Named(name.to_string()),
    })
}

/// RFC 1123 label, the rule for namespace names: at most 63 lowercase
/// letters, digits and `-`, starting and ending with a letter or digit.
pub fn is_dns_label(name: &str) -> bool {
    name.len() <= 63 && !name.contains('.') && is_dns_subdomain(name)
}

/// RFC 1123 subdomain, the rule for ConfigMap and Secret names.
pub fn is_dns_subdomain(name: &str) -> bool {
    if name.is_empty() || name.len() > 253 {
        return false;
    }
    name.split('.').all(|label| {
        let b = label.as_bytes();
        !b.is_empty()
            && b.iter()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
            && b[0] != b'-'
            && b[b.len() - 1] != b'-'
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cm(name: &str) -> SourceId {
        SourceId::new(SourceKind::ConfigMap, name)
    }
    fn secret(name: &str) -> SourceId {
        SourceId::new(SourceKind::Secret, name)
    }

    #[test]
    fn names_are_what_kubernetes_accepts() {
        for good in ["a", "kube-system", "x1", &"a".repeat(63)] {
            assert!(is_dns_label(good), "{good}");
        }
        let long = "a".repeat(64);
        for bad in [
            "",
            "-a",
            "a-",
            "A",
            "a.b",
            "a/b",
            "kube-system/configmaps/aws-auth?",
            "a b",
            "%2e",
            &long,
        ] {
            assert!(!is_dns_label(bad), "{bad}");
        }
        for good in ["a.b", "app-config", "x.y-z.0"] {
            assert!(is_dns_subdomain(good), "{good}");
        }
        for bad in ["", "a..b", ".a", "a/b", "..", "a?b", "a%2fb", &"a".repeat(254)] {
            assert!(!is_dns_subdomain(bad), "{bad}");
        }
    }

    #[test]
    fn parses_every_form() {
        let list = SourceList::parse("a", "configmap/app, secret/tls ,db", true).unwrap();
        assert!(list.matches(&cm("app")));
        assert!(!list.matches(&secret("app")));
        assert!(list.matches(&secret("tls")));
        assert!(list.matches(&cm("db")) && list.matches(&secret("db")));
        assert!(!list.matches(&cm("other")));
        assert!(SourceList::parse("a", "*", true).unwrap().matches(&secret("x")));
    }

    /// `configmap/*` and `secret/*` take every source of one kind and no
    /// other, in every list (the exclusions' too, where `*` is refused);
    /// neither names a source, as `*` does not: only a name is a word
    /// about one source.
    #[test]
    fn a_whole_kind_is_every_source_of_it_and_names_none() {
        for allow_wildcard in [true, false] {
            let configmaps = SourceList::parse("a", "configmap/*", allow_wildcard).unwrap();
            assert_eq!(configmaps, SourceList(vec![Pattern::Kind(SourceKind::ConfigMap)]));
            assert!(configmaps.matches(&cm("app")) && configmaps.matches(&cm("kube-root-ca.crt")));
            assert!(!configmaps.matches(&secret("app")));
            let secrets = SourceList::parse("a", " secret/* ", allow_wildcard).unwrap();
            assert!(secrets.matches(&secret("db")) && !secrets.matches(&cm("db")));
            assert!(!configmaps.names(&cm("app")) && !secrets.names(&secret("db")));
        }
        let list = SourceList::parse("a", "*, configmap/app, db", true).unwrap();
        assert!(list.names(&cm("app")) && list.names(&cm("db")) && list.names(&secret("db")));
        assert!(
            !list.names(&secret("app")) && list.matches(&secret("app")),
            "`*` matches, names nothing"
        );
        // Another kind, or a pattern inside a name, is still refused.
        for bad in ["volume/*", "configmap/app*", "configmap/**", "*/app"] {
            assert!(SourceList::parse("a", bad, true).is_err(), "{bad}");
        }
    }

    #[test]
    fn errors_name_the_annotation_and_the_token() {
        let err = SourceList::parse("config-snapshot.io/snapshot", "app,volume/x", true)
            .unwrap_err()
            .to_string();
        assert!(err.contains("config-snapshot.io/snapshot"), "{err}");
        assert!(err.contains("volume/x"), "{err}");
        let err = SourceList::parse("config-snapshot.io/watch", "Bad_Name", true).unwrap_err();
        assert!(
            matches!(&err, ListError::Name { name, .. } if name == "Bad_Name"),
            "{err}"
        );
        let err = SourceList::parse("config-snapshot.io/exclude", "*", false).unwrap_err();
        assert_eq!(
            err,
            ListError::Wildcard {
                what: "config-snapshot.io/exclude".into()
            }
        );
        assert!(SourceList::parse("x", " , ", true).is_err());
        assert!(SourceList::parse("x", &"a".repeat(254), true).is_err());
    }

    #[test]
    fn dns_subdomain_rules() {
        assert!(is_dns_subdomain("a.b-c.d1"));
        assert!(!is_dns_subdomain("-a"));
        assert!(!is_dns_subdomain("a..b"));
        assert!(!is_dns_subdomain("A"));
    }
}
