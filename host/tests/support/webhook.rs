//! The API server's side of the webhook: AdmissionReviews over HTTPS to a
//! serve process, trusting its throwaway certificate.

#![allow(dead_code)]

use std::sync::Arc;

use axum::body::Bytes;
use base64::Engine as _;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};

use super::process::ServeProcess;

pub struct Webhook {
    address: std::net::SocketAddr,
    /// The door's path: what the API server calls.
    path: String,
    client: Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>,
    /// Every AdmissionReview response body, for canary checks.
    pub responses: Vec<String>,
}

impl Webhook {
    pub fn to(process: &ServeProcess) -> Webhook {
        let mut roots = rustls::RootCertStore::empty();
        use rustls::pki_types::pem::PemObject;
        let cert = rustls::pki_types::CertificateDer::from_pem_slice(process.cert_pem.as_bytes()).unwrap();
        roots.add(cert).unwrap();
        let tls = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_only()
            .enable_http1()
            .build();
        Webhook {
            address: process.webhook,
            path: process.door_path(),
            client: Client::builder(TokioExecutor::new()).build(https),
            responses: Vec::new(),
        }
    }

    pub async fn post(&mut self, body: Vec<u8>) -> (u16, String) {
        let request = axum::http::Request::post(format!("https://{}{}", self.address, self.path))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body)))
            .unwrap();
        let response = self.client.request(request).await.expect("HTTPS request");
        let code = response.status().as_u16();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        let text = String::from_utf8_lossy(&body).to_string();
        self.responses.push(text.clone());
        (code, text)
    }

    /// Sends an AdmissionRequest for an object in `namespace`; returns the
    /// response and the object as the API server would persist it (with
    /// the JSON Patch applied). Panics unless the webhook answered 200.
    pub async fn admit(
        &mut self,
        namespace: &str,
        uid: &str,
        operation: &str,
        object: &Value,
        old: Option<&Value>,
        dry_run: bool,
    ) -> Result<(Value, Value), String> {
        let kind = object["kind"].as_str().unwrap();
        let api_version = object["apiVersion"].as_str().unwrap();
        let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
        let review = json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {
                "uid": uid,
                "kind": {"group": group, "version": version, "kind": kind},
                "resource": {"group": group, "version": version, "resource": format!("{}s", kind.to_lowercase())},
                "name": object["metadata"]["name"], "namespace": namespace, "operation": operation,
                "userInfo": {"username": "alice"}, "object": object, "oldObject": old,
                "dryRun": dry_run, "options": {}
            }
        });
        let (code, text) = self.post(serde_json::to_vec(&review).unwrap()).await;
        if code != 200 {
            return Err(format!("{code}: {text}"));
        }
        let answer: Value = serde_json::from_str(&text).unwrap();
        let response = answer["response"].clone();
        assert_eq!(response["uid"], uid);
        let mut persisted = object.clone();
        if let Some(patch) = response["patch"].as_str() {
            assert_eq!(response["patchType"], "JSONPatch");
            let bytes = base64::engine::general_purpose::STANDARD.decode(patch).unwrap();
            let patch: json_patch::Patch = serde_json::from_slice(&bytes).unwrap();
            json_patch::patch(&mut persisted, &patch).unwrap();
        }
        Ok((response, persisted))
    }
}
