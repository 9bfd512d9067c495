//! One AdmissionReview in, one out. The request stays raw JSON on its way
//! into the policy: only the few header fields the host needs are parsed,
//! and the object only when the policy mutated it (to compute the patch).

use std::sync::Arc;
use std::time::Instant;

use config_snapshot_policy::host::host_error::{Code, HostError};
use config_snapshot_policy::host::operation::Operation;
use config_snapshot_policy::model::selection::{is_dns_label, is_dns_subdomain};
use config_snapshot_policy::model::source::SourceKind;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};

use super::state::State;
use crate::capability::{Caller, Capability, Subject};
use crate::cluster::shown;
use crate::kubewarden::engine::{CallFailure, CallHandler, Lane};
use crate::serve::tell::metrics::{self, OperationLabels, RequestLabels};
use crate::serve::view::prefetch::{self, ObjectOnly};
use crate::serve::view::scope::RequestScope;
use config_snapshot_policy::model::settings::Settings;

/// Request uids of the host's own admissions (the resync's) start with
/// this, for whoever reads a debug log. It decides nothing: a review's uid
/// is whatever its sender wrote.
pub(crate) const UID_PREFIX: &str = "resync-";

/// Who asked for an admission: the API server (over the webhook), the
/// host's own periodic pass, or its judges of the sources its watch saw
/// change. Its log level and the engine's lane it evaluates in follow from
/// it, never from the request's fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Origin {
    ApiServer,
    Resync,
    Watch,
}

impl Origin {
    /// The engine's instances its evaluation takes one of (docs/serve.md,
    /// "The wasm pool"): the pass's is the kept one, which nothing else
    /// takes, so a pass never waits behind the API server's load or the
    /// judges'; the API server's reviews (already held to their share,
    /// serve/intake/evaluations.rs) and the judges' re-admissions share the
    /// rest, each waiting for one rather than failing.
    fn lane(self) -> Lane {
        match self {
            Origin::Resync => Lane::Kept,
            Origin::ApiServer | Origin::Watch => Lane::Shared,
        }
    }
}

#[derive(Deserialize)]
struct Review<'a> {
    #[serde(borrow)]
    request: Option<&'a RawValue>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RequestHeader {
    uid: String,
    #[serde(default)]
    kind: Gvk,
    #[serde(default)]
    operation: String,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    dry_run: Option<bool>,
    #[serde(default)]
    object: Option<HeadObject>,
}

/// Of the request's object, only what identifies it. Any JSON is taken:
/// an object that is not one is the policy's to refuse, not the header's.
#[derive(Default)]
struct HeadObject {
    metadata: Option<HeadMeta>,
}

impl<'de> Deserialize<'de> for HeadObject {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Lenient;
        impl<'de> serde::de::Visitor<'de> for Lenient {
            type Value = HeadObject;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("any JSON")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<HeadObject, A::Error> {
                let mut metadata = None;
                while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                    if key == "metadata" {
                        metadata = map.next_value::<Option<HeadMeta>>().ok().flatten();
                    } else {
                        map.next_value::<serde::de::IgnoredAny>()?;
                    }
                }
                Ok(HeadObject { metadata })
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<HeadObject, A::Error> {
                while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
                Ok(HeadObject::default())
            }
            fn visit_str<E>(self, _: &str) -> Result<HeadObject, E> {
                Ok(HeadObject::default())
            }
            fn visit_bool<E>(self, _: bool) -> Result<HeadObject, E> {
                Ok(HeadObject::default())
            }
            fn visit_i64<E>(self, _: i64) -> Result<HeadObject, E> {
                Ok(HeadObject::default())
            }
            fn visit_u64<E>(self, _: u64) -> Result<HeadObject, E> {
                Ok(HeadObject::default())
            }
            fn visit_f64<E>(self, _: f64) -> Result<HeadObject, E> {
                Ok(HeadObject::default())
            }
            fn visit_unit<E>(self) -> Result<HeadObject, E> {
                Ok(HeadObject::default())
            }
        }
        deserializer.deserialize_any(Lenient)
    }
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct HeadMeta {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    uid: Option<String>,
    #[serde(default)]
    owner_references: Option<Vec<HeadOwner>>,
}

#[derive(Deserialize)]
struct HeadOwner {
    #[serde(default)]
    uid: String,
    #[serde(default)]
    controller: Option<bool>,
}

impl RequestHeader {
    /// What the request writes, reviewed `now` (see [`Subject::of`]).
    fn subject(&self, now: i64) -> Subject {
        let meta = self.object.as_ref().and_then(|o| o.metadata.as_ref());
        let some = |s: Option<&String>| s.filter(|s| !s.is_empty()).cloned();
        Subject {
            kind: self.kind.kind.clone(),
            name: some(self.name.as_ref())
                .or_else(|| some(meta.and_then(|m| m.name.as_ref())))
                .unwrap_or_default(),
            operation: self.operation.clone(),
            uid: some(meta.and_then(|m| m.uid.as_ref())),
            controller_uid: meta
                .and_then(|m| m.owner_references.as_ref())
                .and_then(|refs| refs.iter().find(|r| r.controller == Some(true)))
                .and_then(|r| some(Some(&r.uid))),
            reviewed_at: now,
        }
    }

    /// Why the request's namespace or name is not one, if it is not: the
    /// API server validates both (DNS-1123) before any webhook sees them,
    /// so a request that carries anything else did not come from it, and
    /// nothing is read or written for it. Both become segments of API
    /// paths. An empty name is a `generateName` CREATE's.
    fn unnamed(&self) -> Option<String> {
        let namespace = self.namespace.as_deref().unwrap_or_default();
        if !namespace.is_empty() && !is_dns_label(namespace) {
            return Some(format!("namespace {} is not a namespace's name", shown(namespace)));
        }
        let object_name = self
            .object
            .as_ref()
            .and_then(|o| o.metadata.as_ref())
            .and_then(|m| m.name.as_deref());
        for name in [self.name.as_deref(), object_name].into_iter().flatten() {
            if !name.is_empty() && !is_dns_subdomain(name) {
                return Some(format!("{} is not an object's name", shown(name)));
            }
        }
        None
    }
}

#[derive(Deserialize, Default)]
struct Gvk {
    #[serde(default)]
    kind: String,
}

/// Why a body got no AdmissionReview answer: the webhook replies with an
/// HTTP error and the API server applies the webhook's failurePolicy.
#[derive(Debug)]
pub enum Failure {
    /// Not an AdmissionReview (HTTP 400).
    BadRequest(String),
    /// The policy could not be evaluated (HTTP 500).
    Policy(String),
}

/// The outcome of one admission, for the HTTP layer and the resync.
pub struct Answer {
    /// The AdmissionReview response document.
    pub review: Value,
    pub allowed: bool,
    /// The mutated object, when the policy changed it.
    pub mutated: Option<Value>,
}

/// Answers one AdmissionReview body. Blocking: run it off the async workers.
pub fn review(state: &State, body: &[u8]) -> Result<Answer, Failure> {
    admit(state, request_of(body)?)
}

/// The request of an AdmissionReview body, still raw.
fn request_of(body: &[u8]) -> Result<&RawValue, Failure> {
    let review: Review =
        serde_json::from_slice(body).map_err(|e| Failure::BadRequest(format!("not an AdmissionReview: {e}")))?;
    review
        .request
        .ok_or_else(|| Failure::BadRequest("the AdmissionReview has no request".into()))
}

fn head_of(request: &RawValue) -> Result<RequestHeader, Failure> {
    let head: RequestHeader = serde_json::from_str(request.get())
        .map_err(|e| Failure::BadRequest(format!("invalid AdmissionRequest: {e}")))?;
    // The API server's uids are UUIDs; the uid is echoed and logged.
    if head.uid.len() > MAX_UID {
        return Err(Failure::BadRequest(format!(
            "invalid AdmissionRequest: a uid of {} bytes",
            head.uid.len()
        )));
    }
    Ok(head)
}

/// The longest request uid taken (a UUID has 36 characters).
const MAX_UID: usize = 128;

/// What serve makes of a body before the policy runs, with no cluster and
/// no engine: the fuzz target `admission_request` (host/fuzz) drives
/// serve's request parsing, screening and read-ahead through it.
#[derive(Debug)]
pub struct Preview {
    /// `policy` (evaluated), or what answers it untouched before the
    /// policy: `unnamed`, `source` (a ConfigMap's or Secret's review).
    pub decision: &'static str,
    /// Sources serve would read ahead for the policy.
    pub read_ahead: usize,
}

pub fn preview(body: &[u8], settings: &Settings) -> Result<Preview, Failure> {
    let request = request_of(body)?;
    let head = head_of(request)?;
    let decision = if head.unnamed().is_some() {
        "unnamed"
    } else if reviews_no_source(&head, Origin::ApiServer) {
        "source"
    } else {
        "policy"
    };
    Ok(Preview {
        decision,
        read_ahead: match decision {
            "policy" => prefetch::wanted(&head.kind.kind, &head.operation, request, settings).len(),
            _ => 0,
        },
    })
}

/// Whether the request is a ConfigMap's or Secret's review from outside
/// serve: answered untouched, nothing of it parsed but its header. serve
/// learns of a source's changes from its watch of what the API server
/// stored (docs/design.md, "Watch"), so the webhook does not ask for these
/// reviews, and one that comes anyway (a door-holder's, a configuration
/// edited by hand) decides nothing and costs nothing: no tree of its
/// object is built, however large it is. The host's own re-admissions
/// of a source, read fresh, are the policy's.
fn reviews_no_source(head: &RequestHeader, origin: Origin) -> bool {
    origin == Origin::ApiServer && SourceKind::from_kind(&head.kind.kind).is_some()
}

/// The answer that allows a request untouched, without the policy.
fn untouched(state: &State, uid: &str, decision: &'static str, warning: Option<String>) -> Answer {
    state.metrics.decided(decision);
    let mut response = json!({"uid": uid, "allowed": true});
    if let Some(w) = warning {
        response["warnings"] = json!([w]);
    }
    Answer {
        review: json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}),
        allowed: true,
        mutated: None,
    }
}

/// Evaluates one AdmissionRequest (raw JSON) and releases its deferred
/// effects if it was allowed: header → gate → capability → policy →
/// response → effects. Every answer after the header is timed.
pub fn admit(state: &State, request: &RawValue) -> Result<Answer, Failure> {
    admit_from(state, request, Origin::ApiServer)
}

/// [`admit`], for a request from `origin`.
pub(crate) fn admit_from(state: &State, request: &RawValue, origin: Origin) -> Result<Answer, Failure> {
    let started = Instant::now();
    let head = head_of(request)?;
    let labels = RequestLabels {
        kind: metrics::kind_label(&head.kind.kind),
        operation: metrics::operation_label(&head.operation),
    };
    let _timed = state.metrics.time_admission(labels.clone(), started);
    // Every log line of this admission, down to its host calls, carries it.
    let _span = tracing::info_span!(
        "admission",
        uid = %head.uid,
        kind = labels.kind,
        operation = labels.operation,
        namespace = head.namespace.as_deref().unwrap_or_default()
    )
    .entered();
    if let Err(answer) = triage(state, &head, origin) {
        return Ok(*answer);
    }
    if let Err(values) = within_values(request) {
        return Ok(too_many_values(state, &head, values));
    }
    let handler = capability(state, &head, request);
    let mut validation = evaluate(state, &head, request, origin.lane(), handler.clone())?;
    let answer = respond(&head, request, &mut validation)?;
    release(state, &handler, &answer);
    log_admission(origin, &head, &labels, &answer, &validation);
    Ok(answer)
}

/// What is answered without the policy: a request whose names are not
/// names, one in a namespace the webhook excludes, a ConfigMap's or
/// Secret's review ([`reviews_no_source`]).
fn triage(state: &State, head: &RequestHeader, origin: Origin) -> Result<(), Box<Answer>> {
    if let Some(why) = head.unnamed() {
        tracing::warn!(uid = %head.uid, "not reviewed: {why}");
        let warning = format!("config-snapshot: not reviewed: {why}");
        return Err(untouched(state, &head.uid, "unnamed", Some(warning)).into());
    }
    let rules = &state.context.rules;
    let namespace = head.namespace.as_deref().unwrap_or_default();
    // A namespace the webhook excludes (or, namespaced, does not select)
    // never gets here from the API server: whoever sent it, nothing is
    // written and nothing changed. The host checks the same again for every
    // write the policy asks for (capability): deliberately twice, so that
    // neither check alone is all that stands in the way.
    if rules.excludes(namespace) {
        let warning = format!("config-snapshot does not act in namespace {namespace}");
        return Err(untouched(state, &head.uid, "excluded", Some(warning)).into());
    }
    if reviews_no_source(head, origin) {
        return Err(untouched(state, &head.uid, "source", None).into());
    }
    Ok(())
}

/// The host capability this request's policy run calls, its reads begun
/// ahead of the policy.
fn capability(state: &State, head: &RequestHeader, request: &RawValue) -> Arc<MeteredCapability> {
    let carry = &state.context;
    let scope = Arc::new(RequestScope::new(
        state.cluster.clone(),
        head.namespace.as_deref().unwrap_or_default(),
        MAX_HELD_VALUES,
    ));
    scope.prefetch(
        prefetch::wanted(&head.kind.kind, &head.operation, request, &carry.rules.settings),
        carry.rules.settings.orphan_grace_period_secs,
    );
    Arc::new(MeteredCapability {
        inner: Capability::new(
            scope,
            Caller {
                uid: head.uid.clone(),
                namespace: head.namespace.clone().unwrap_or_default(),
                dry_run: head.dry_run.unwrap_or(false),
                subject: head.subject(state.cluster.now()),
            },
            carry.rules.clone(),
            carry.in_flight.clone(),
            carry.report.clone(),
        )
        .with_budget(state.budget.clone())
        .holding_at_most(MAX_HELD_VALUES),
        metrics: state.metrics.clone(),
    })
}

/// Runs the policy's `validate` on the request and the settings, on an
/// instance of `lane` (waited for, never refused).
fn evaluate(
    state: &State,
    head: &RequestHeader,
    request: &RawValue,
    lane: Lane,
    handler: Arc<MeteredCapability>,
) -> Result<Value, Failure> {
    let mut payload = Vec::with_capacity(request.get().len() + state.settings_json.len() + 32);
    payload.extend_from_slice(br#"{"request":"#);
    payload.extend_from_slice(request.get().as_bytes());
    payload.extend_from_slice(br#","settings":"#);
    payload.extend_from_slice(state.settings_json.as_bytes());
    payload.push(b'}');
    state
        .engine
        .call_in(lane, "validate", &payload, handler)
        .map_err(anyhow::Error::from)
        .and_then(|bytes| Ok(serde_json::from_slice(&bytes)?))
        .map_err(|e| {
            state.metrics.decided("error");
            tracing::error!(uid = %head.uid, kind = metrics::kind_label(&head.kind.kind), "policy evaluation failed: {e:#}");
            Failure::Policy(format!("config-snapshot: policy evaluation failed: {e:#}"))
        })
}

/// The AdmissionReview answer to the policy's validation: a mutation
/// becomes a JSON Patch against the request's object. The mutated object
/// is taken out of the validation, not copied: with the request's object,
/// the two trees serve holds of a review.
fn respond(head: &RequestHeader, request: &RawValue, validation: &mut Value) -> Result<Answer, Failure> {
    let allowed = validation["accepted"].as_bool().unwrap_or(false);
    let mutated = validation
        .as_object_mut()
        .and_then(|v| v.remove("mutated_object"))
        .filter(|v| !v.is_null());
    let original = match (&mutated, allowed) {
        (Some(_), true) => serde_json::from_str::<ObjectOnly>(request.get())
            .map(|o| o.object)
            .unwrap_or(Value::Null),
        _ => Value::Null,
    };
    let review = crate::kubewarden::admission_review::response(
        &json!({"uid": head.uid, "object": original}),
        validation,
        mutated.as_ref(),
    )
    .map_err(|e| Failure::Policy(format!("config-snapshot: encoding the response: {e}")))?;
    Ok(Answer {
        review,
        allowed,
        mutated,
    })
}

/// The most JSON values (objects, arrays, strings, numbers and the rest)
/// serve takes in a request's object. Its trees of a review (the object and
/// the mutated one, and the policy's own within its memory limit) grow with
/// the count of values, not with the bytes: 120,000 keys of a few bytes
/// each are 1.2 MiB on the wire and ten times that as a tree. A Deployment
/// holds a few thousand; one of more than this is refused with a message,
/// never half done, whatever its bytes.
pub(crate) const MAX_VALUES: usize = 100_000;

/// The most JSON values of other objects one admission holds: what it
/// reads ahead (`RequestScope`), and apart from that the sources its policy
/// read fresh (`Capability`), each at most this many. A template may name
/// 64 sources of up to 1 MiB each; parsed, those would cost serve many times
/// the review's own body, times the admissions at once. As many as a review
/// may hold itself: a source past the reads ahead is read when the policy
/// asks, and one past the sources held is refused with a message.
pub(crate) const MAX_HELD_VALUES: usize = MAX_VALUES;

/// `Ok` when the request's object holds at most [`MAX_VALUES`] values,
/// counted in one pass that builds nothing; else how many it holds. A
/// request that does not parse is the policy's to refuse.
fn within_values(request: &RawValue) -> Result<(), usize> {
    #[derive(Deserialize)]
    struct Counting {
        #[serde(default)]
        object: Option<crate::cluster::count::Values>,
    }
    match serde_json::from_str::<Counting>(request.get()) {
        Ok(Counting { object: Some(values) }) if values.0 > MAX_VALUES => Err(values.0),
        _ => Ok(()),
    }
}

/// The answer to an object of more values than serve takes.
fn too_many_values(state: &State, head: &RequestHeader, values: usize) -> Answer {
    state.metrics.decided("denied");
    let message = format!(
        "config-snapshot: this {} holds {values} JSON values, more than the {MAX_VALUES} config-snapshot reviews: take its config-snapshot.io/ annotations off, or make it smaller",
        head.kind.kind
    );
    tracing::warn!(uid = %head.uid, values, "refused: {}", message);
    Answer {
        review: json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "response": {"uid": head.uid, "allowed": false, "status": {"code": 413, "message": message}}}),
        allowed: false,
        mutated: None,
    }
}

/// The request's effects wait for the webhook's answer: a refused request
/// leaves none behind.
fn release(state: &State, handler: &MeteredCapability, answer: &Answer) {
    let staged = handler.inner.take_staged();
    if !answer.allowed {
        state.metrics.decided("denied");
        return;
    }
    for effect in staged {
        state.queue.submit(effect);
    }
    state
        .metrics
        .decided(if answer.mutated.is_some() { "mutated" } else { "allowed" });
}

/// One line per admission. The resync re-admits every watched source each
/// pass, and the judges each changed one: at info level that would drown
/// the admissions users make, so the host's own are logged at debug; every
/// review that came over the webhook is logged at info, whatever its uid
/// says.
fn log_admission(origin: Origin, head: &RequestHeader, labels: &RequestLabels, answer: &Answer, validation: &Value) {
    let warnings = validation["warnings"].as_array().map_or(0, Vec::len);
    // `tracing::event!` takes its level as a constant.
    macro_rules! at {
        ($level:expr) => {
            tracing::event!(
                $level,
                uid = %head.uid,
                kind = labels.kind,
                operation = labels.operation,
                namespace = head.namespace.as_deref().unwrap_or(""),
                allowed = answer.allowed,
                mutated = answer.mutated.is_some(),
                warnings,
                "admission"
            )
        };
    }
    if origin != Origin::ApiServer {
        at!(tracing::Level::DEBUG);
    } else {
        at!(tracing::Level::INFO);
    }
}

/// The capability, with its failures counted and logged. Only the error
/// text is logged, never a payload: payloads carry Secret data.
struct MeteredCapability {
    inner: Capability,
    metrics: Arc<metrics::Metrics>,
}

impl CallHandler for MeteredCapability {
    fn call(&self, binding: &str, namespace: &str, operation: &str, payload: &[u8]) -> Result<Vec<u8>, CallFailure> {
        let start = std::time::Instant::now();
        let result = self.inner.answer(binding, namespace, operation, payload);
        let operation = metrics::host_operation_label(operation);
        self.metrics
            .host_call_duration
            .get_or_create(&OperationLabels { operation })
            .observe(start.elapsed().as_secs_f64());
        match &result {
            Err(e) => {
                // A missing object is an answer, not a failure.
                if !(operation == Operation::GetResource.name() && e.code == Code::NotFound) {
                    self.failed(operation, e);
                }
            }
            // A batch answers each item: a failed item is a failed
            // create_snapshot, counted as one made alone would be.
            Ok(answer) if operation == Operation::CreateSnapshots.name() => {
                for e in item_errors(answer) {
                    self.failed(Operation::CreateSnapshot.name(), &e);
                }
            }
            Ok(_) => {}
        }
        result.map_err(CallFailure::Ours)
    }
}

impl MeteredCapability {
    fn failed(&self, operation: &'static str, e: &HostError) {
        self.metrics
            .host_call_errors
            .get_or_create(&OperationLabels { operation })
            .inc();
        tracing::warn!(operation, "host call failed: {e}");
    }
}

/// The errors among a `create_snapshots` answer's items.
fn item_errors(answer: &[u8]) -> Vec<HostError> {
    #[derive(Deserialize)]
    struct Batch {
        results: Vec<Item>,
    }
    #[derive(Deserialize)]
    struct Item {
        error: Option<HostError>,
    }
    serde_json::from_slice::<Batch>(answer)
        .map(|b| b.results.into_iter().filter_map(|i| i.error).collect())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(object: Value) -> Box<RawValue> {
        serde_json::value::to_raw_value(&json!({"uid": "u", "kind": {"kind": "Deployment"}, "object": object})).unwrap()
    }

    /// A review's trees grow with its values, not its bytes: the count is
    /// made in one pass, and an object past the bound is refused before any
    /// tree of it is built, however few bytes it takes.
    #[test]
    fn an_object_of_too_many_values_is_told_apart_by_counting_alone() {
        let keys = |n: usize| -> Value {
            let map: serde_json::Map<String, Value> = (0..n).map(|i| (format!("k{i}"), json!(""))).collect();
            json!({"metadata": {"name": "web", "annotations": map}})
        };
        // The object, its metadata, the name, the annotations, and each key.
        assert_eq!(within_values(&request(keys(MAX_VALUES - 4))), Ok(()));
        assert_eq!(within_values(&request(keys(MAX_VALUES - 3))), Err(MAX_VALUES + 1));
        let deep = json!({"spec": {"template": {"spec": {"containers": [{"env": [1, 2.5, true, null, "x"]}]}}}});
        assert_eq!(within_values(&request(deep)), Ok(()));
        // Not a document the count can read: the policy's to refuse.
        let broken = RawValue::from_string(r#"{"object": {"a": }"#.to_string());
        assert!(broken.is_err() || within_values(&broken.unwrap()).is_ok());
        let noobject = RawValue::from_string(r#"{"uid": "u"}"#.to_string()).unwrap();
        assert_eq!(within_values(&noobject), Ok(()));
    }
}
