//! The namespace a review names, read from its first bytes before the rest
//! of its body is: what the body and its evaluation are charged to
//! (serve/intake/shares.rs), so that one namespace's large reviews fill its own
//! share and not the API server's.
//!
//! The API server writes an AdmissionReview with Go's encoding/json
//! (apimachinery's JSON serializer, which the webhook client uses), and
//! that keeps the order of the type's fields: `kind`, `apiVersion`,
//! `request`, and in the request `uid`, `kind`, `resource`, `subResource`,
//! `requestKind`, `requestResource`, `requestSubResource`, `name`,
//! `namespace`, and only then `operation`, `userInfo`, `object`,
//! `oldObject`, `dryRun`, `options` (k8s.io/api, admission/v1/types.go).
//! What precedes `namespace` is bounded whatever the object: a uid, group,
//! version, kind and resource names, and an object's name (253 characters
//! at most), well under a KiB. So [`WITHIN`] bytes hold it.
//! `host/tests/real_cluster/intake.rs` counts, on a real kube-apiserver,
//! that no review it sends lacks it (`webhook_reviews_unsorted_total`).
//!
//! The bytes are parsed as JSON (serde_json), never searched: a key is the
//! request's `namespace` only where a JSON reader finds it, so a
//! `"namespace"` inside a string value, inside the object, before
//! `request` or spelt with escapes is what it is to every other reader.
//! The parse stops at the request's first `namespace`. A review naming it
//! twice is refused whole afterwards (admission.rs reads the request with
//! serde's derive, which refuses a duplicate field), so the first is the
//! only one an evaluated review has.

use std::borrow::Cow;
use std::cell::Cell;
use std::fmt;

use config_snapshot_policy::model::selection::is_dns_label;
use serde::de::{DeserializeSeed, IgnoredAny, MapAccess, Visitor};

/// How many of a body's first bytes are read for its namespace.
pub(crate) const WITHIN: usize = 4096;

/// The namespace the review whose body begins with `bytes` names, read
/// from its first [`WITHIN`] bytes; `None` when they name none (it comes
/// later, or not at all, or the bytes are not a review), or name
/// something that is not a namespace's name.
pub(crate) fn within(bytes: &[u8]) -> Option<String> {
    let bytes = &bytes[..bytes.len().min(WITHIN)];
    let found = Cell::new(None);
    let mut parser = serde_json::Deserializer::from_slice(bytes);
    // The bytes end mid-review, so the parse ends in an error, after the
    // namespace or before it; only what it found counts.
    let _ = Review(&found).deserialize(&mut parser);
    found.into_inner().filter(|n: &String| is_dns_label(n))
}

/// The review: its `request`, every other field skipped as JSON.
struct Review<'a>(&'a Cell<Option<String>>);

/// The review's `request`: its `namespace`, every other field skipped.
struct Request<'a>(&'a Cell<Option<String>>);

impl<'de> DeserializeSeed<'de> for Review<'_> {
    type Value = ();
    fn deserialize<D: serde::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for Review<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an AdmissionReview")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
            if key == "request" {
                return map.next_value_seed(Request(self.0));
            }
            map.next_value::<IgnoredAny>()?;
        }
        Ok(())
    }
}

impl<'de> DeserializeSeed<'de> for Request<'_> {
    type Value = ();
    fn deserialize<D: serde::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for Request<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an AdmissionRequest")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
            if key == "namespace" {
                self.0.set(map.next_value::<Option<String>>()?);
                return Ok(());
            }
            map.next_value::<IgnoredAny>()?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A review as kube-apiserver writes it: Go's field order, `<` and `>`
    /// escaped as encoding/json escapes them, the object last.
    fn as_the_api_server_writes_it(namespace: &str, name: &str, value: &str) -> Vec<u8> {
        let escaped = value.replace('<', "\\u003c").replace('>', "\\u003e");
        format!(
            concat!(
                r#"{{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","request":{{"#,
                r#""uid":"0f2c7b7e-6d0b-4c61-9a51-5d2b2f9c1a11","#,
                r#""kind":{{"group":"apps","version":"v1","kind":"Deployment"}},"#,
                r#""resource":{{"group":"apps","version":"v1","resource":"deployments"}},"#,
                r#""requestKind":{{"group":"apps","version":"v1","kind":"Deployment"}},"#,
                r#""requestResource":{{"group":"apps","version":"v1","resource":"deployments"}},"#,
                r#""name":"{name}","namespace":"{namespace}","operation":"CREATE","#,
                r#""userInfo":{{"username":"tenant","uid":"u","groups":["system:authenticated"]}},"#,
                r#""object":{{"apiVersion":"apps/v1","kind":"Deployment","metadata":{{"name":"{name}","#,
                r#""namespace":"{namespace}","annotations":{{"big":"{escaped}"}}}}}},"#,
                r#""oldObject":null,"dryRun":true,"options":{{"kind":"CreateOptions","apiVersion":"meta.k8s.io/v1"}}}}}}"#,
            ),
            name = name,
            namespace = namespace,
            escaped = escaped,
        )
        .into_bytes()
    }

    /// Finding 3: the namespace of the API server's review is in its first
    /// bytes, however large its object, and however long its name.
    #[test]
    fn the_api_servers_review_names_its_namespace_within_the_first_bytes() {
        let long_name = "n".repeat(253);
        let body = as_the_api_server_writes_it("tenant-a", &long_name, &"<".repeat(1 << 20));
        assert!(body.len() > 6 << 20, "an escaped MiB of '<' is six");
        let at = body.windows(11).position(|w| w == b"\"namespace\"").unwrap();
        assert!(at < 1024, "the namespace at byte {at}");
        assert_eq!(within(&body).as_deref(), Some("tenant-a"));
        assert_eq!(
            within(&body[..at + 30]).as_deref(),
            Some("tenant-a"),
            "no more is needed"
        );
        let serde_reads: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(serde_reads["request"]["namespace"], "tenant-a");
    }

    /// The bytes are parsed, not searched: what a substring search would
    /// take for the namespace is not it, and what a JSON reader takes for
    /// it is, escapes and all.
    #[test]
    fn a_crafted_review_is_charged_to_what_a_json_reader_reads() {
        for (body, expected) in [
            // In a string value before it.
            (
                r#"{"request":{"uid":"\"namespace\":\"victim\"","namespace":"tenant"}}"#,
                Some("tenant"),
            ),
            // In a field other than the request.
            (
                r#"{"response":{"namespace":"victim"},"request":{"namespace":"tenant"}}"#,
                Some("tenant"),
            ),
            // In the object, before the request's own.
            (
                r#"{"request":{"object":{"metadata":{"namespace":"victim"}},"namespace":"tenant"}}"#,
                Some("tenant"),
            ),
            // In the object, and the request names none.
            (r#"{"request":{"object":{"metadata":{"namespace":"victim"}}}}"#, None),
            // The key and the value spelt with escapes.
            (r#"{"request":{"n\u0061mespace":"t\u0065nant"}}"#, Some("tenant")),
            // Named twice: the first (serde refuses the review whole).
            (
                r#"{"request":{"namespace":"tenant","namespace":"victim"}}"#,
                Some("tenant"),
            ),
            // Not a namespace's name, not a string, none at all.
            (r#"{"request":{"namespace":"Victim/../x"}}"#, None),
            (r#"{"request":{"namespace":7}}"#, None),
            (r#"{"request":{"namespace":null}}"#, None),
            (r#"{"request":{}}"#, None),
            (r#"["request",{"namespace":"victim"}]"#, None),
            (r#"{"request":"{\"namespace\":\"victim\"}"}"#, None),
            ("not json", None),
            ("", None),
        ] {
            assert_eq!(within(body.as_bytes()).as_deref(), expected, "{body}");
        }
    }

    /// Past the first bytes nothing is read: a review whose namespace
    /// comes after a large field, or is cut at the edge, names none here.
    #[test]
    fn a_namespace_past_the_first_bytes_is_not_read() {
        let late = format!(
            r#"{{"request":{{"object":{{"data":"{}"}},"namespace":"tenant"}}}}"#,
            "x".repeat(WITHIN)
        );
        assert_eq!(within(late.as_bytes()), None);
        let edge = format!(
            r#"{{"request":{{"uid":"{}","namespace":"tenant"}}}}"#,
            "u".repeat(WITHIN - 40)
        );
        let at = edge.find("tenant").unwrap();
        assert!(at < WITHIN && at + "tenant".len() > WITHIN - 5, "cut inside the name");
        assert_eq!(
            within(edge.as_bytes()),
            None,
            "a name cut short is not read as a shorter one"
        );
    }
}
