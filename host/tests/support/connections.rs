//! Connections held to serve's webhook, from loopback addresses of their
//! own (peers, as serve counts them): TLS done on HTTP/1.1, or an HTTP/2
//! preface with no request. The attacks on serve's port use them, against
//! the stand-in and on the real control plane.

#![allow(dead_code)]

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::net::{TcpSocket, TcpStream};
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

use super::process::ServeProcess;

pub fn loopback(last: u8) -> IpAddr {
    IpAddr::from([127, 0, 0, last])
}

pub fn connector(serve: &ServeProcess, alpn: &[u8]) -> TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(serve.cert_pem.as_bytes()).unwrap())
        .unwrap();
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![alpn.to_vec()];
    TlsConnector::from(Arc::new(config))
}

/// A TCP connection to `to` from loopback address `from`.
pub async fn tcp(from: IpAddr, to: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(from, 0))?;
    socket.connect(to).await
}

/// A TLS connection from `from`, its handshake done, offering `alpn`.
pub async fn tls(serve: &ServeProcess, from: IpAddr, alpn: &[u8]) -> std::io::Result<TlsStream<TcpStream>> {
    let stream = tcp(from, serve.webhook).await?;
    connector(serve, alpn)
        .connect(ServerName::try_from("127.0.0.1").unwrap(), stream)
        .await
}

/// An HTTP/2 connection from `from`: preface and settings exchanged, then
/// not a single request. Its sender keeps it open; its driver ends when
/// serve closes it.
pub async fn h2_idle(
    serve: &ServeProcess,
    from: IpAddr,
) -> Result<
    (
        hyper::client::conn::http2::SendRequest<String>,
        tokio::task::JoinHandle<()>,
    ),
    String,
> {
    let stream = tls(serve, from, b"h2").await.map_err(|e| e.to_string())?;
    let (sender, connection) = hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
        .await
        .map_err(|e| e.to_string())?;
    let driver = tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok((sender, driver))
}

/// Holds `count` connections from `peer`, a few handshakes at a time (a
/// peer gets a few at once), retrying what serve turned away.
pub async fn hold_tls(serve: &ServeProcess, peer: IpAddr, count: usize) -> Vec<TlsStream<TcpStream>> {
    let mut held = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while held.len() < count {
        let wave = (count - held.len()).min(8);
        let attempts: Vec<_> = (0..wave).map(|_| tls(serve, peer, b"http/1.1")).collect();
        held.extend(futures::future::join_all(attempts).await.into_iter().flatten());
        assert!(
            Instant::now() < deadline,
            "could not open {count} connections from {peer}"
        );
    }
    held
}

pub async fn hold_h2(
    serve: &ServeProcess,
    peer: IpAddr,
    count: usize,
) -> Vec<(
    hyper::client::conn::http2::SendRequest<String>,
    tokio::task::JoinHandle<()>,
)> {
    let mut held = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while held.len() < count {
        let wave = (count - held.len()).min(8);
        let attempts: Vec<_> = (0..wave).map(|_| h2_idle(serve, peer)).collect();
        held.extend(futures::future::join_all(attempts).await.into_iter().flatten());
        assert!(
            Instant::now() < deadline,
            "could not open {count} HTTP/2 connections from {peer}"
        );
    }
    held
}

/// Writes the head of a POST of `path` declaring a body of `length` bytes,
/// then `sent` bytes of that body, as fast as the peer takes them: a write
/// that waits half a second ends it (a body serve does not read fills the
/// socket). Whether the head was written.
pub async fn post_declaring<S: tokio::io::AsyncWrite + Unpin>(
    stream: &mut S,
    path: &str,
    length: usize,
    sent: usize,
) -> bool {
    use tokio::io::AsyncWriteExt;
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
    );
    if stream.write_all(head.as_bytes()).await.is_err() {
        return false;
    }
    let chunk = vec![b' '; 64 << 10];
    let mut left = sent;
    while left > 0 {
        let n = left.min(chunk.len());
        match tokio::time::timeout(Duration::from_millis(500), stream.write_all(&chunk[..n])).await {
            Ok(Ok(())) => left -= n,
            _ => break,
        }
    }
    let _ = stream.flush().await;
    true
}

/// The first bytes of a review of `namespace`, as the API server writes
/// them (its field order: the namespace before the object), opening a
/// string the padding of [`post_review_declaring`] goes into.
pub fn review_head(namespace: &str) -> String {
    format!(
        concat!(
            r#"{{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","request":{{"uid":"held","#,
            r#""kind":{{"group":"apps","version":"v1","kind":"Deployment"}},"#,
            r#""resource":{{"group":"apps","version":"v1","resource":"deployments"}},"#,
            r#""name":"big","namespace":"{}","operation":"CREATE","userInfo":{{"username":"tenant"}},"#,
            r#""object":{{"metadata":{{"annotations":{{"big":""#
        ),
        namespace
    )
}

/// As [`post_declaring`], the body beginning with a review of `namespace`
/// ([`review_head`]): what serve charges it to.
pub async fn post_review_declaring<S: tokio::io::AsyncWrite + Unpin>(
    stream: &mut S,
    path: &str,
    namespace: &str,
    length: usize,
    sent: usize,
) -> bool {
    use tokio::io::AsyncWriteExt;
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {length}\r\n\r\n{}",
        review_head(namespace)
    );
    if stream.write_all(head.as_bytes()).await.is_err() {
        return false;
    }
    let chunk = vec![b' '; 64 << 10];
    let mut left = sent.saturating_sub(review_head(namespace).len());
    while left > 0 {
        let n = left.min(chunk.len());
        match tokio::time::timeout(Duration::from_millis(500), stream.write_all(&chunk[..n])).await {
            Ok(Ok(())) => left -= n,
            _ => break,
        }
    }
    let _ = stream.flush().await;
    true
}
