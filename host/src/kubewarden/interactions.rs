//! Stock Kubewarden's host, as `kwctl` plays it from a file: the host calls
//! a policy made, recorded as kwctl records them
//! (`--record-host-capabilities-interactions`) and answered from that
//! record (`--replay-host-capabilities-interactions`). One fixture then runs
//! under kwctl and under `config-snapshot review` and must get the same
//! answer (docs/design.md, "Running on stock Kubewarden").
//!
//! The file is a YAML list of exchanges. Each request is policy-evaluator's
//! `CallbackRequestType` as serde_yaml writes an externally tagged enum (a
//! `!Variant` tag, snake_case fields), itself stored as a string. Replay
//! consumes the exchanges in order and compares requests structurally, so a
//! request that differs from the next recorded one is an error, as is a
//! request past the end.
//!
//! Only what stock Kubewarden has exists here: this project's write
//! capability answers `unknown binding`, exactly as policy-evaluator does,
//! so the policy takes its checksum fallback on both.

use std::collections::VecDeque;
use std::path::Path;
use std::sync::{Arc, Mutex};

use anyhow::{Context as _, Result};
use config_snapshot_policy::host::operation::KUBEWARDEN;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::kubewarden::engine::{CallFailure, CallHandler};

/// policy-evaluator's `CallbackRequestType`, the variants a Kubernetes
/// policy can cause. Field names and order are policy-evaluator's, so the
/// YAML and the `Debug` text in a mismatch error read the same as kwctl's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Request {
    KubernetesListResourceNamespace {
        api_version: String,
        kind: String,
        namespace: String,
        label_selector: Option<String>,
        field_selector: Option<String>,
    },
    KubernetesListResourceAll {
        api_version: String,
        kind: String,
        label_selector: Option<String>,
        field_selector: Option<String>,
    },
    KubernetesGetResource {
        api_version: String,
        kind: String,
        name: String,
        namespace: Option<String>,
        disable_cache: bool,
    },
    KubernetesCanI {
        request: Value,
        disable_cache: bool,
    },
}

/// How the host answered: kwctl's `Response`, tagged by `type`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub enum Response {
    Success { payload: String },
    Error { message: String },
}

/// One host call and its answer. `request` is [`Request`] as YAML text,
/// which is how kwctl stores it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub struct Exchange {
    pub request: String,
    pub response: Response,
}

/// The text policy-evaluator puts before a callback's error. The guest sees
/// it (behind the engine's `Host error: `), so it is part of the contract.
const CALLBACK_FAILURE: &str = "Callback evaluation failure: ";

/// An answer stock Kubewarden gives in words only: what the guest sees of
/// a foreign host's failure.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub(crate) struct EvaluatorText(pub String);

fn says(text: impl Into<String>) -> EvaluatorText {
    EvaluatorText(text.into())
}

impl Request {
    /// The request policy-evaluator builds for a waPC call, or the error it
    /// answers without consulting the callback handler, in its words.
    pub(crate) fn from_call(
        binding: &str,
        namespace: &str,
        operation: &str,
        payload: &[u8],
    ) -> Result<Request, CallFailure> {
        Request::parse_call(binding, namespace, operation, payload).map_err(|e| CallFailure::Foreign(e.0))
    }

    fn parse_call(binding: &str, namespace: &str, operation: &str, payload: &[u8]) -> Result<Request, EvaluatorText> {
        if binding != KUBEWARDEN.0 {
            return Err(says(format!("unknown binding: {binding}")));
        }
        if namespace != KUBEWARDEN.1 {
            // policy-evaluator also serves oci, net and crypto here; no
            // Kubernetes policy of ours asks for them, and their answers
            // could not be recorded by this host.
            return Err(says(format!("unknown namespace: {namespace}")));
        }
        let body: Value = serde_json::from_slice(payload).map_err(|e| says(e.to_string()))?;
        let text = |field: &str| body[field].as_str().map(str::to_string);
        let required = |field: &str| text(field).ok_or_else(|| says(format!("missing field `{field}`")));
        let disable_cache = body["disable_cache"].as_bool().unwrap_or(false);
        match operation {
            "get_resource" => Ok(Request::KubernetesGetResource {
                api_version: required("api_version")?,
                kind: required("kind")?,
                name: required("name")?,
                namespace: text("namespace"),
                disable_cache,
            }),
            "list_resources_by_namespace" => Ok(Request::KubernetesListResourceNamespace {
                api_version: required("api_version")?,
                kind: required("kind")?,
                namespace: required("namespace")?,
                label_selector: text("label_selector"),
                field_selector: text("field_selector"),
            }),
            "list_resources_all" => Ok(Request::KubernetesListResourceAll {
                api_version: required("api_version")?,
                kind: required("kind")?,
                label_selector: text("label_selector"),
                field_selector: text("field_selector"),
            }),
            "can_i" => Ok(Request::KubernetesCanI {
                request: body["subject_access_review"].clone(),
                disable_cache,
            }),
            other => Err(says(format!("unknown operation: {other}"))),
        }
    }

    fn to_yaml(&self) -> String {
        serde_yaml_ng::to_string(self).expect("a Request always serialises")
    }
}

/// Reads an interactions file.
pub fn read(path: &Path) -> Result<Vec<Exchange>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let exchanges: Vec<Exchange> =
        serde_yaml_ng::from_str(&text).with_context(|| format!("{} is not a list of exchanges", path.display()))?;
    for (i, exchange) in exchanges.iter().enumerate() {
        serde_yaml_ng::from_str::<Request>(&exchange.request).with_context(|| {
            format!(
                "{}: exchange {} has a request kwctl would not read",
                path.display(),
                i + 1
            )
        })?;
    }
    Ok(exchanges)
}

/// Writes an interactions file kwctl can replay.
pub fn write(path: &Path, exchanges: &[Exchange]) -> Result<()> {
    let text = serde_yaml_ng::to_string(exchanges)?;
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

/// Answers host calls from a recording, in order.
pub struct Replayer {
    exchanges: Mutex<VecDeque<Exchange>>,
}

impl Replayer {
    pub fn new(exchanges: Vec<Exchange>) -> Replayer {
        Replayer {
            exchanges: Mutex::new(exchanges.into()),
        }
    }

    /// Exchanges the policy never asked for (kwctl warns about them too).
    pub fn leftovers(&self) -> usize {
        self.exchanges.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// The next recorded answer, or policy-evaluator's text for why there
    /// is none.
    fn answer(&self, request: &Request) -> Result<Vec<u8>, EvaluatorText> {
        let next = self.exchanges.lock().unwrap_or_else(|e| e.into_inner()).pop_front();
        let Some(exchange) = next else {
            return Err(says("the list of recorded responses is empty"));
        };
        // `read` checked every recorded request parses.
        let expected: Request = serde_yaml_ng::from_str(&exchange.request).map_err(|e| says(e.to_string()))?;
        if &expected != request {
            return Err(says(format!(
                "Replay error: unexpected request. Was expecting {expected:?}, got {request:?} instead"
            )));
        }
        match exchange.response {
            Response::Success { payload } => Ok(payload.into_bytes()),
            Response::Error { message } => Err(says(message)),
        }
    }
}

impl CallHandler for Replayer {
    fn call(&self, binding: &str, namespace: &str, operation: &str, payload: &[u8]) -> Result<Vec<u8>, CallFailure> {
        let request = Request::from_call(binding, namespace, operation, payload)?;
        self.answer(&request)
            .map_err(|e| CallFailure::Foreign(format!("{CALLBACK_FAILURE}{e}")))
    }
}

/// Answers Kubewarden's reads from another host (the simulator)
/// and writes each exchange down; refuses everything stock Kubewarden
/// would not have.
pub struct Recorder {
    host: Arc<dyn CallHandler>,
    exchanges: Mutex<Vec<Exchange>>,
}

impl Recorder {
    pub fn new(host: Arc<dyn CallHandler>) -> Recorder {
        Recorder {
            host,
            exchanges: Mutex::new(Vec::new()),
        }
    }

    pub fn exchanges(&self) -> Vec<Exchange> {
        self.exchanges.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl CallHandler for Recorder {
    fn call(&self, binding: &str, namespace: &str, operation: &str, payload: &[u8]) -> Result<Vec<u8>, CallFailure> {
        let request = Request::from_call(binding, namespace, operation, payload)?;
        // Kubewarden answers in text: what our host coded, it words.
        let answer = self
            .host
            .call(binding, namespace, operation, payload)
            .map_err(|e| match e {
                CallFailure::Ours(e) => e.message,
                CallFailure::Foreign(text) => text,
            });
        let response = match &answer {
            Ok(bytes) => match String::from_utf8(bytes.clone()) {
                Ok(payload) => Response::Success { payload },
                Err(_) => Response::Error {
                    message: "the host answered with bytes that are not UTF-8".to_string(),
                },
            },
            Err(message) => Response::Error {
                message: message.clone(),
            },
        };
        self.exchanges.lock().unwrap_or_else(|e| e.into_inner()).push(Exchange {
            request: request.to_yaml(),
            response,
        });
        answer.map_err(|e| CallFailure::Foreign(format!("{CALLBACK_FAILURE}{e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get(name: &str) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({
            "api_version": "v1", "kind": "ConfigMap", "name": name,
            "namespace": "default", "disable_cache": true,
        }))
        .unwrap()
    }

    fn recorded(name: &str, response: Response) -> Exchange {
        let request = Request::from_call("kubewarden", "kubernetes", "get_resource", &get(name)).unwrap();
        Exchange {
            request: request.to_yaml(),
            response,
        }
    }

    #[test]
    fn reads_the_file_kwctl_wrote() {
        let text = r#"- type: Exchange
  request: |
    !KubernetesGetResource
    api_version: v1
    kind: ConfigMap
    name: app-config
    namespace: default
    disable_cache: true
  response:
    type: Success
    payload: '{"data":{"mode":"blue"}}'
"#;
        let exchanges: Vec<Exchange> = serde_yaml_ng::from_str(text).unwrap();
        let replayer = Replayer::new(exchanges);
        let answer = replayer.call("kubewarden", "kubernetes", "get_resource", &get("app-config"));
        assert_eq!(answer.unwrap(), br#"{"data":{"mode":"blue"}}"#);
        assert_eq!(replayer.leftovers(), 0);
    }

    #[test]
    fn writes_requests_the_way_kwctl_does() {
        let yaml = recorded("app-config", Response::Error { message: "x".into() }).request;
        assert_eq!(
            yaml,
            "!KubernetesGetResource\napi_version: v1\nkind: ConfigMap\nname: app-config\nnamespace: default\ndisable_cache: true\n"
        );
    }

    #[test]
    fn a_request_other_than_the_next_recorded_one_is_an_error() {
        let replayer = Replayer::new(vec![recorded("a", Response::Success { payload: "{}".into() })]);
        let err = replayer
            .call("kubewarden", "kubernetes", "get_resource", &get("b"))
            .unwrap_err();
        let CallFailure::Foreign(err) = err else {
            panic!("Kubewarden answers in text: {err:?}")
        };
        assert!(
            err.starts_with("Callback evaluation failure: Replay error: unexpected request"),
            "{err}"
        );
        assert!(err.contains(r#"name: "a""#) && err.contains(r#"name: "b""#), "{err}");
    }

    #[test]
    fn past_the_end_and_recorded_errors_are_errors() {
        let replayer = Replayer::new(vec![recorded("a", Response::Error { message: "boom".into() })]);
        let err = replayer
            .call("kubewarden", "kubernetes", "get_resource", &get("a"))
            .unwrap_err();
        assert_eq!(err, CallFailure::Foreign("Callback evaluation failure: boom".into()));
        let err = replayer
            .call("kubewarden", "kubernetes", "get_resource", &get("a"))
            .unwrap_err();
        assert_eq!(
            err,
            CallFailure::Foreign("Callback evaluation failure: the list of recorded responses is empty".into())
        );
    }

    #[test]
    fn the_write_capability_does_not_exist_here() {
        let replayer = Replayer::new(vec![]);
        let err = replayer
            .call("config-snapshot", "v1", "create_snapshot", b"{}")
            .unwrap_err();
        assert_eq!(err, CallFailure::Foreign("unknown binding: config-snapshot".into()));
    }

    #[test]
    fn a_recording_replays_to_the_same_answers() {
        struct Cluster;
        impl CallHandler for Cluster {
            fn call(&self, _: &str, _: &str, _: &str, payload: &[u8]) -> Result<Vec<u8>, CallFailure> {
                let body: Value = serde_json::from_slice(payload).unwrap();
                match body["name"].as_str() {
                    Some("here") => Ok(br#"{"data":{"k":"v"}}"#.to_vec()),
                    _ => Err(CallFailure::Foreign("configmaps \"gone\" not found".into())),
                }
            }
        }
        let recorder = Recorder::new(Arc::new(Cluster));
        let first = [
            recorder.call("kubewarden", "kubernetes", "get_resource", &get("here")),
            recorder.call("kubewarden", "kubernetes", "get_resource", &get("gone")),
        ];
        let path = std::env::temp_dir().join(format!("cs-interactions-{}.yml", std::process::id()));
        write(&path, &recorder.exchanges()).unwrap();
        let replayer = Replayer::new(read(&path).unwrap());
        let _ = std::fs::remove_file(&path);
        let second = [
            replayer.call("kubewarden", "kubernetes", "get_resource", &get("here")),
            replayer.call("kubewarden", "kubernetes", "get_resource", &get("gone")),
        ];
        assert_eq!(first, second);
        assert!(first[1].as_ref().unwrap_err().to_string().contains("not found"));
    }
}
