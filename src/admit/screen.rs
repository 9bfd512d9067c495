//! The pass-through screen: most requests the webhook sees are workloads
//! that do not opt in, and they are answered from one scan of the payload.
//!
//! The full path ([`crate::model::request::Payload`]) keeps the object raw and
//! then reads its annotations in a second scan, so a pass-through paid for
//! reading its object twice, most of its time in the policy
//! (docs/BENCHMARKS.md, "Where pass-through time goes"). The screen reads
//! the annotations while it reads the payload, and gives up, leaving the
//! request to the full path, as soon as it cannot answer exactly as that
//! path would: another kind, a field it did not expect where it expected
//! it, anything malformed, an opt-in. It only ever accepts.

use std::fmt;

use serde::de::{self, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::admit::skim::{self, Annotated, AnnotationsSkim, Records};
use crate::model::kinds::WorkloadKind;
use crate::model::request::{Gvk, Outcome};
use crate::model::settings::Settings;

/// The answer for a workload that neither opts in nor carries our marks:
/// `None` when the full path must decide.
pub(crate) fn pass_through(payload: &[u8]) -> Option<Outcome> {
    let head: PayloadHeader = serde_json::from_slice(payload).ok()?;
    let settings = match head.settings {
        Some(raw) => Settings::from_json(raw.get().as_bytes()).ok()?,
        None => Settings::default(),
    };
    let object = head.request.object?;
    (!skim::opts_in(&object, &settings)).then(Outcome::accept)
}

#[derive(Deserialize)]
struct PayloadHeader<'a> {
    request: Screened,
    #[serde(borrow, default)]
    settings: Option<&'a RawValue>,
}

/// An AdmissionRequest whose object is a handled workload, read for its
/// annotations; any other request fails to deserialise.
struct Screened {
    object: Option<AnnotationsSkim>,
}

/// Why the screen stepped aside; never shown, the full path answers.
const NOT_SCREENED: &str = "not screened";

impl<'de> Deserialize<'de> for Screened {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(ScreenedVisitor)
    }
}

struct ScreenedVisitor;

impl<'de> Visitor<'de> for ScreenedVisitor {
    type Value = Screened;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an AdmissionRequest")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Screened, A::Error> {
        let mut kind: Option<Gvk> = None;
        let mut operation: Option<String> = None;
        let mut object: Option<Option<AnnotationsSkim>> = None;
        let (mut namespace, mut dry_run, mut old_object) = (false, false, false);
        let mut old_records: Records = Default::default();
        // The fields the full path types, typed the same, each once; the
        // rest skipped as it skips them.
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            match key.as_ref() {
                "kind" if kind.is_none() => kind = Some(map.next_value()?),
                "operation" if operation.is_none() => operation = Some(map.next_value()?),
                "namespace" if !namespace => {
                    namespace = true;
                    map.next_value::<String>()?;
                }
                "dryRun" if !dry_run => {
                    dry_run = true;
                    map.next_value::<bool>()?;
                }
                "oldObject" if !old_object => {
                    old_object = true;
                    if let Some(old) = map.next_value::<Option<Annotated>>()? {
                        old_records = old.into_records();
                    }
                }
                // The API server writes kind and operation before the
                // object; only then is it known to be worth reading here.
                "object" if object.is_none() => {
                    let (Some(gvk), Some(op)) = (&kind, &operation) else {
                        return Err(de::Error::custom(NOT_SCREENED));
                    };
                    if WorkloadKind::from_kind(&gvk.kind).is_none()
                        || !crate::model::kinds::handles(&gvk.group, &gvk.kind, op)
                    {
                        return Err(de::Error::custom(NOT_SCREENED));
                    }
                    object = Some(map.next_value()?);
                }
                "kind" | "operation" | "namespace" | "dryRun" | "oldObject" | "object" => {
                    return Err(de::Error::custom(NOT_SCREENED));
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        match object {
            // A record of the host's the write would drop is kept, by the
            // full path (`workload::keep_records`).
            Some(Some(quick)) if quick.loses_records(&old_records) => Err(de::Error::custom(NOT_SCREENED)),
            Some(object) => Ok(Screened { object }),
            None => Err(de::Error::custom(NOT_SCREENED)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::fake::FakeHost;
    use proptest::prelude::*;
    use serde_json::{json, Value};

    fn payload(kind: &str, group: &str, op: &str, object: Value, settings: Value) -> Vec<u8> {
        with_old(kind, group, op, object, Value::Null, settings)
    }

    fn with_old(kind: &str, group: &str, op: &str, object: Value, old: Value, settings: Value) -> Vec<u8> {
        serde_json::to_vec(&json!({
            "request": {"uid": "u", "kind": {"group": group, "version": "v1", "kind": kind},
                        "operation": op, "namespace": "ns", "userInfo": {"username": "u"},
                        "object": object, "oldObject": old, "dryRun": false},
            "settings": settings}))
        .unwrap()
    }

    fn deployment(annotations: Value, template_annotations: Value) -> Value {
        json!({"apiVersion": "apps/v1", "kind": "Deployment",
               "metadata": {"name": "web", "namespace": "ns", "annotations": annotations},
               "spec": {"template": {"metadata": {"annotations": template_annotations},
                        "spec": {"containers": [{"name": "c", "envFrom": [{"configMapRef": {"name": "app"}}]}]}}}})
    }

    /// What the full path answers, as the response the engine sees.
    fn full(payload: &[u8]) -> Value {
        let host = FakeHost::default();
        serde_json::to_value(crate::decide(payload, &host).into_response()).unwrap()
    }

    #[test]
    fn a_workload_that_does_not_opt_in_is_accepted_from_one_scan() {
        let p = payload(
            "Deployment",
            "apps",
            "CREATE",
            deployment(json!({"team": "a"}), json!({})),
            json!({}),
        );
        let screened = pass_through(&p).expect("screened");
        assert!(screened.accepted && screened.mutated.is_none() && screened.warnings.is_empty());
        assert_eq!(serde_json::to_value(screened.into_response()).unwrap(), full(&p));
    }

    /// Each of these the full path must decide: the screen steps aside
    /// rather than answer differently.
    #[expect(clippy::too_many_lines, reason = "a test that lists cases")]
    #[test]
    fn the_screen_steps_aside_for_whatever_it_cannot_answer_exactly() {
        let plain = || deployment(json!({}), json!({}));
        let cases = [
            (
                "opted in",
                payload(
                    "Deployment",
                    "apps",
                    "CREATE",
                    deployment(json!({"config-snapshot.io/snapshot": "*"}), json!({})),
                    json!({}),
                ),
            ),
            (
                "opted in by the settings",
                payload("Deployment", "apps", "CREATE", plain(), json!({"watchByDefault": true})),
            ),
            (
                "carries our template marks",
                payload(
                    "Deployment",
                    "apps",
                    "UPDATE",
                    deployment(json!({}), json!({"config-snapshot.io/snapshots": "{}"})),
                    json!({}),
                ),
            ),
            (
                "drops the watch-rollout record the old object had",
                with_old(
                    "Deployment",
                    "apps",
                    "UPDATE",
                    plain(),
                    deployment(json!({"config-snapshot.io/watch-rollout": "{}"}), json!({})),
                    json!({}),
                ),
            ),
            (
                "drops the rollback record the old object had",
                with_old(
                    "Deployment",
                    "apps",
                    "UPDATE",
                    deployment(json!({"team": "a"}), json!({})),
                    deployment(json!({"config-snapshot.io/rollback": "{}"}), json!({})),
                    json!({}),
                ),
            ),
            (
                "a ConfigMap",
                payload("ConfigMap", "", "UPDATE", json!({"data": {}}), json!({})),
            ),
            (
                "a kind in another group",
                payload("Deployment", "example.com", "CREATE", plain(), json!({})),
            ),
            (
                "an operation not handled",
                payload("Deployment", "apps", "CONNECT", plain(), json!({})),
            ),
            (
                "invalid settings",
                payload(
                    "Deployment",
                    "apps",
                    "CREATE",
                    plain(),
                    json!({"orphanGracePeriod": "soon"}),
                ),
            ),
            (
                "an object that is not an object",
                payload("Deployment", "apps", "CREATE", json!([1]), json!({})),
            ),
            (
                "no object",
                payload("Deployment", "apps", "DELETE", Value::Null, json!({})),
            ),
        ];
        for (why, p) in cases {
            assert!(pass_through(&p).is_none(), "{why}");
        }
        let object_first = br#"{"request": {"object": {"metadata": {}}, "kind": {"group": "apps", "kind": "Deployment"}, "operation": "CREATE"}}"#;
        assert!(pass_through(object_first).is_none(), "object before kind");
        let twice = br#"{"request": {"kind": {"group": "apps", "kind": "Deployment"}, "operation": "CREATE", "dryRun": false, "dryRun": "x", "object": {}}}"#;
        assert!(pass_through(twice).is_none(), "a field twice");
        let mistyped = br#"{"request": {"kind": {"group": "apps", "kind": "Deployment"}, "operation": "CREATE", "dryRun": "yes", "object": {}}}"#;
        assert!(pass_through(mistyped).is_none(), "a mistyped field");
        assert_eq!(full(mistyped)["accepted"], false, "which the full path refuses");
        assert!(pass_through(b"{not json").is_none());
    }

    fn annotations() -> impl Strategy<Value = Value> {
        let key = prop::sample::select(vec![
            "team",
            "config-snapshot.io/snapshot",
            "config-snapshot.io/watch",
            "config-snapshot.io/renew-duration",
            "config-snapshot.io/snapshots",
            "config-snapshot.io/exclude",
            "config-snapshot.io/bogus",
            "config-snapshot.io/watch-rollout",
            "config-snapshot.io/rollback",
        ]);
        let value = prop::sample::select(vec!["", "*", "app", "1h", "{}", "no"]);
        prop::collection::btree_map(key, value, 0..3)
            .prop_map(|m| Value::Object(m.into_iter().map(|(k, v)| (k.to_string(), json!(v))).collect()))
    }

    proptest! {
        /// Over random annotations, settings and operations, the screen
        /// either steps aside or answers exactly what the full path does.
        #[test]
        fn the_screen_never_answers_otherwise_than_the_full_path(
            top in annotations(),
            template in annotations(),
            old in prop::option::of(annotations()),
            watch_by_default in any::<bool>(),
            op in prop::sample::select(vec!["CREATE", "UPDATE"]),
        ) {
            let old = old.map_or(Value::Null, |a| deployment(a, json!({})));
            let settings = json!({"watchByDefault": watch_by_default});
            let p = with_old("Deployment", "apps", op, deployment(top, template), old, settings);
            if let Some(screened) = pass_through(&p) {
                prop_assert_eq!(serde_json::to_value(screened.into_response()).unwrap(), full(&p));
            }
        }
    }
}
