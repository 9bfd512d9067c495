//! The webhook's listener, bounded (docs/security.md, "serve's port"):
//! TLS with an optional client-certificate check (mTLS), and limits that
//! hold whoever connects, since most installs cannot turn mTLS on and any
//! pod may then reach the port.
//!
//! - A connection takes a place only once its TLS handshake is done: a
//!   handshake in progress holds a slot of its own, a few per peer and a
//!   bounded number overall, for at most the handshake timeout. When every
//!   slot is taken, a new handshake takes the slot of the oldest one of the
//!   peer holding the most (a handshake the API server makes takes
//!   milliseconds; a silent one is what an attacker holds).
//! - At most `--max-connections` connections are open, and at most
//!   `--max-connections-per-peer` from one address.
//! - A connection is *proven* once one of its requests has passed the door
//!   (the webhook marks it, serve/intake/entry.rs): it called the path only the
//!   webhook configuration names. A pod cannot tell itself apart from the
//!   API server by its address, but it cannot prove a connection.
//! - When every place is taken, a new connection takes the place of an
//!   unproven one with no request in flight: of the peer holding the most
//!   unproven places, the one made longest ago. A proven connection is
//!   never taken for a new one, which has proven nothing yet; when every
//!   place is proven or busy, the new one is refused. So connections made
//!   and dropped as fast as a pod likes take only each other's places and
//!   those of pods that idle, never the API server's, and an API server
//!   reconnecting takes the place of a pod's (its own connections prove
//!   themselves with their first request, milliseconds after the
//!   handshake, and it holds few unproven ones at a time).
//! - A connection that sends no request within `--first-byte-timeout` of
//!   its handshake, or none for `--idle-timeout` after its last answer, is
//!   closed, on HTTP/1 and HTTP/2 alike (HTTP/2 gets a GOAWAY).
//! - HTTP/1 request headers must arrive within `--header-read-timeout`; an
//!   HTTP/2 connection carries at most [`STREAMS`] requests at once.
//! - What a request may do before it is answered (the door's path, its
//!   body's size, deadline and budget, its namespace's share) is the
//!   webhook's (serve/intake/entry.rs). The listener counts nothing per address
//!   past the connection: the API server is one address carrying every
//!   namespace's reviews, so a bound per address on requests would let one
//!   namespace's load refuse the others'.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context as _, Result};
use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;
use tokio::sync::{watch, Notify};
use tower::ServiceExt as _;

use crate::serve::answer::options::Options;
use crate::serve::tell::metrics::ConnectionMetrics;

/// The TLS configuration for `cert` and `key`; with `client_ca`, a client
/// must present a certificate that CA signed, or the handshake fails.
pub(crate) fn server_config(cert: &Path, key: &Path, client_ca: Option<&Path>) -> Result<Arc<ServerConfig>> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .and_then(|certs| certs.collect())
        .with_context(|| format!("reading {}", cert.display()))?;
    let key = PrivateKeyDer::from_pem_file(key).with_context(|| format!("reading {}", key.display()))?;
    server_config_of(chain, key, client_ca)
}

/// [`server_config`] for a chain and key in PEM text (serve's own
/// certificate, kept in a Secret).
pub(crate) fn server_config_pem(cert: &str, key: &str, client_ca: Option<&Path>) -> Result<Arc<ServerConfig>> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert.as_bytes())
        .collect::<Result<_, _>>()
        .context("reading serve's certificate")?;
    let key = PrivateKeyDer::from_pem_slice(key.as_bytes()).context("reading serve's certificate's key")?;
    server_config_of(chain, key, client_ca)
}

fn server_config_of(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    client_ca: Option<&Path>,
) -> Result<Arc<ServerConfig>> {
    let builder = ServerConfig::builder();
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            for certificate in CertificateDer::pem_file_iter(ca).with_context(|| format!("reading {}", ca.display()))? {
                roots.add(certificate.with_context(|| format!("reading {}", ca.display()))?)?;
            }
            if roots.is_empty() {
                return Err(anyhow!("--client-ca {}: no certificate in it", ca.display()));
            }
            let verifier = WebPkiClientVerifier::builder(Arc::new(roots))
                .build()
                .map_err(|e| anyhow!("--client-ca {}: {e}", ca.display()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .context("the webhook's certificate and key")?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The TLS configuration in use, swapped when the certificate is renewed.
#[derive(Clone)]
pub struct Tls(Arc<RwLock<Arc<ServerConfig>>>);

impl Tls {
    pub fn new(config: Arc<ServerConfig>) -> Tls {
        Tls(Arc::new(RwLock::new(config)))
    }

    pub(crate) fn reload(&self, config: Arc<ServerConfig>) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = config;
    }

    fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(self.0.read().unwrap_or_else(|e| e.into_inner()).clone())
    }
}

/// Bytes a connection takes in before its request's handler reads them:
/// hyper's HTTP/1 read buffer and HTTP/2 flow-control windows. Also the
/// most one read of a body brings (serve/intake/entry.rs).
pub(crate) const WINDOW: u32 = 64 << 10;

/// Requests one HTTP/2 connection carries at once. The API server's HTTP/2
/// client opens another connection when a server's limit is reached, so a
/// low one costs it nothing, and a peer gets no more requests in flight per
/// connection place than this.
pub(crate) const STREAMS: u32 = 8;

/// The listener's bounds.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Connections open at once, their handshakes done.
    pub connections: usize,
    /// Of those, from one address.
    pub per_peer: usize,
    /// TLS handshakes in progress at once, and from one address.
    pub handshakes: usize,
    pub handshakes_per_peer: usize,
    pub handshake_timeout: Duration,
    /// From the handshake to the first request.
    pub first_byte_timeout: Duration,
    /// From the last answer to the next request.
    pub idle_timeout: Duration,
    /// For an HTTP/1 request's headers.
    pub header_read_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            connections: 256,
            per_peer: 64,
            handshakes: 64,
            handshakes_per_peer: 16,
            handshake_timeout: Duration::from_secs(10),
            first_byte_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(120),
            header_read_timeout: Duration::from_secs(5),
        }
    }
}

/// What the listener knows of one open connection.
struct Open {
    peer: IpAddr,
    activity: Arc<Activity>,
    close: Arc<Notify>,
}

/// Whether a connection has a request in flight, and when it last had.
struct Activity {
    in_flight: AtomicUsize,
    /// Milliseconds since the listener started.
    last: AtomicU64,
    /// Whether a request has come at all.
    served: AtomicUsize,
    /// When the connection took its place (milliseconds since the listener
    /// started): of the unproven, the oldest gives way first.
    made: u64,
    /// Whether a request on it has passed the door; set by the webhook.
    proven: Arc<AtomicBool>,
}

impl Activity {
    fn idle_for(&self, now: u64) -> Option<u64> {
        (self.in_flight.load(Ordering::SeqCst) == 0).then(|| now.saturating_sub(self.last.load(Ordering::SeqCst)))
    }
}

/// A request in flight on a connection: counted on it until it ends,
/// however.
struct Busy {
    activity: Arc<Activity>,
    table: Arc<Table>,
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.activity.last.store(self.table.now(), Ordering::SeqCst);
        self.activity.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

fn millis_since(start: Instant) -> u64 {
    u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX)
}

#[derive(Default)]
struct Places {
    open: HashMap<u64, Open>,
    per_peer: HashMap<IpAddr, usize>,
    handshakes: HashMap<IpAddr, usize>,
    handshaking: usize,
    /// The handshakes in progress: whose, since when, and how to stop it.
    shaking: HashMap<u64, (IpAddr, Instant, Arc<Notify>)>,
    next: u64,
}

/// The places connections take, shared by the accept loop and the
/// connections.
pub struct Table {
    limits: Limits,
    places: Mutex<Places>,
    started: Instant,
    metrics: ConnectionMetrics,
}

/// Why a connection got no place.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    Handshakes,
    Peer,
    Full,
}

/// A handshake's slot, given back when dropped; `stop` is told when a new
/// handshake takes the slot.
pub struct Handshaking {
    table: Arc<Table>,
    id: u64,
    pub stop: Arc<Notify>,
}

impl Drop for Handshaking {
    fn drop(&mut self) {
        let mut places = self.table.places();
        Table::end_handshake(&mut places, self.id);
    }
}

/// An open connection's place, given back when dropped.
pub struct Place {
    table: Arc<Table>,
    id: u64,
    activity: Arc<Activity>,
    close: Arc<Notify>,
}

impl Drop for Place {
    fn drop(&mut self) {
        self.table.release(self.id);
    }
}

impl Table {
    pub fn new(limits: Limits, metrics: ConnectionMetrics) -> Arc<Table> {
        Arc::new(Table {
            limits,
            places: Mutex::default(),
            started: Instant::now(),
            metrics,
        })
    }

    fn places(&self) -> std::sync::MutexGuard<'_, Places> {
        self.places.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn now(&self) -> u64 {
        millis_since(self.started)
    }

    fn end_handshake(places: &mut Places, id: u64) -> Option<Arc<Notify>> {
        let (peer, _, stop) = places.shaking.remove(&id)?;
        places.handshaking = places.handshaking.saturating_sub(1);
        if let Some(n) = places.handshakes.get_mut(&peer) {
            *n -= 1;
            if *n == 0 {
                places.handshakes.remove(&peer);
            }
        }
        Some(stop)
    }

    /// A slot for `peer`'s TLS handshake: a free one, or, when none is
    /// free, the slot of the oldest handshake of the peer holding the most
    /// (never `peer`'s own), which is told to stop. Refused past the
    /// peer's own share.
    pub fn handshake(self: &Arc<Self>, peer: IpAddr) -> Result<Handshaking, Refused> {
        let mut places = self.places();
        let mine = places.handshakes.get(&peer).copied().unwrap_or(0);
        if mine >= self.limits.handshakes_per_peer {
            self.metrics.refused.inc();
            return Err(Refused::Handshakes);
        }
        if places.handshaking >= self.limits.handshakes {
            let victim = places
                .shaking
                .iter()
                .filter(|(_, (p, _, _))| *p != peer)
                .max_by_key(|(_, (p, since, _))| {
                    (
                        places.handshakes.get(p).copied().unwrap_or(0),
                        std::cmp::Reverse(*since),
                    )
                })
                .map(|(id, _)| *id);
            let Some(victim) = victim else {
                self.metrics.refused.inc();
                return Err(Refused::Handshakes);
            };
            if let Some(stop) = Table::end_handshake(&mut places, victim) {
                stop.notify_one();
                self.metrics.evicted.inc();
            }
        }
        let id = places.next;
        places.next += 1;
        let stop = Arc::new(Notify::new());
        places.shaking.insert(id, (peer, Instant::now(), stop.clone()));
        places.handshaking += 1;
        *places.handshakes.entry(peer).or_default() += 1;
        Ok(Handshaking {
            table: self.clone(),
            id,
            stop,
        })
    }

    /// A place for a connection from `peer` whose handshake is done:
    /// free, or an unproven connection's ([`Table::victim`]), which is told
    /// to close.
    pub fn admit(self: &Arc<Self>, peer: IpAddr) -> Result<Place, Refused> {
        let now = self.now();
        let mut places = self.places();
        if places.per_peer.get(&peer).copied().unwrap_or(0) >= self.limits.per_peer {
            self.metrics.refused.inc();
            return Err(Refused::Peer);
        }
        if places.open.len() >= self.limits.connections {
            let Some(victim) = Table::victim(&places) else {
                self.metrics.refused.inc();
                return Err(Refused::Full);
            };
            if let Some(gone) = Table::forget(&mut places, victim) {
                gone.close.notify_one();
                self.metrics.evicted.inc();
            }
        }
        let id = places.next;
        places.next += 1;
        let activity = Arc::new(Activity {
            in_flight: AtomicUsize::new(0),
            last: AtomicU64::new(now),
            served: AtomicUsize::new(0),
            made: now,
            proven: Arc::default(),
        });
        let close = Arc::new(Notify::new());
        places.open.insert(
            id,
            Open {
                peer,
                activity: activity.clone(),
                close: close.clone(),
            },
        );
        *places.per_peer.entry(peer).or_default() += 1;
        self.metrics.open.set(places.open.len() as i64);
        Ok(Place {
            table: self.clone(),
            id,
            activity,
            close,
        })
    }

    /// The connection a new one takes the place of: one that has not
    /// passed the door and has no request in flight, of the peer holding
    /// the most such, the one made longest ago. Never a proven one: a
    /// newcomer has proven nothing, and the API server's connections are
    /// proven with their first request. Nor one with a request in flight,
    /// which would be cut off. No time a connection is spared for once
    /// made: a pod dropping and remaking its connections faster than any
    /// such time would keep every one of its places and leave only the
    /// API server's to take.
    fn victim(places: &Places) -> Option<u64> {
        let unproven = |o: &Open| !o.activity.proven.load(Ordering::SeqCst);
        let mut held: HashMap<IpAddr, usize> = HashMap::new();
        for o in places.open.values().filter(|o| unproven(o)) {
            *held.entry(o.peer).or_default() += 1;
        }
        places
            .open
            .iter()
            .filter(|(_, o)| unproven(o) && o.activity.in_flight.load(Ordering::SeqCst) == 0)
            .max_by_key(|(id, o)| {
                (
                    held.get(&o.peer).copied().unwrap_or(0),
                    std::cmp::Reverse((o.activity.made, **id)),
                )
            })
            .map(|(id, _)| *id)
    }

    fn forget(places: &mut Places, id: u64) -> Option<Open> {
        let gone = places.open.remove(&id)?;
        if let Some(n) = places.per_peer.get_mut(&gone.peer) {
            *n -= 1;
            if *n == 0 {
                places.per_peer.remove(&gone.peer);
            }
        }
        Some(gone)
    }

    fn release(&self, id: u64) {
        let mut places = self.places();
        Table::forget(&mut places, id);
        self.metrics.open.set(places.open.len() as i64);
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.places().open.len()
    }
}

impl Place {
    /// Marks a request in flight until the returned guard drops.
    fn busy(&self) -> Busy {
        self.activity.in_flight.fetch_add(1, Ordering::SeqCst);
        self.activity.served.fetch_add(1, Ordering::SeqCst);
        Busy {
            activity: self.activity.clone(),
            table: self.table.clone(),
        }
    }

    /// What the webhook sets when a request on this connection passes the
    /// door.
    fn proof(&self) -> Arc<AtomicBool> {
        self.activity.proven.clone()
    }

    /// Whether this connection has been idle past its limit.
    fn expired(&self) -> bool {
        let limits = &self.table.limits;
        let limit = if self.activity.served.load(Ordering::SeqCst) == 0 {
            limits.first_byte_timeout
        } else {
            limits.idle_timeout
        };
        self.activity
            .idle_for(self.table.now())
            .is_some_and(|idle| idle >= u64::try_from(limit.as_millis()).unwrap_or(u64::MAX))
    }
}

/// Serves `router` on `listener` until `stop` turns true, then gives open
/// connections `grace` to finish their requests.
pub async fn serve(
    listener: TcpListener,
    tls: Tls,
    router: Router,
    table: Arc<Table>,
    mut stop: watch::Receiver<bool>,
    grace: Duration,
) -> io::Result<()> {
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors and the like: wait, go on.
                    tracing::warn!("accepting a connection: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = stop.changed() => break,
        };
        // An answer is written in more than one segment (TLS records, the
        // head before the body): with Nagle's algorithm the last waits for
        // the API server's delayed ACK, up to 40 ms, whenever a connection
        // carries one call at a time. So no Nagle, as hyper and axum advise.
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(%peer, "TCP_NODELAY not set: {e}");
        }
        while connections.try_join_next().is_some() {}
        let Ok(handshaking) = table.handshake(peer.ip()) else {
            tracing::debug!(%peer, "refused a connection: too many handshakes");
            continue;
        };
        let (tls, router, table, stop) = (tls.clone(), router.clone(), table.clone(), stop.clone());
        connections.spawn(connection(tcp, peer, handshaking, tls, router, table, stop));
    }
    // Stopping: every connection finishes what it has in flight.
    let deadline = tokio::time::sleep(grace);
    tokio::pin!(deadline);
    loop {
        tokio::select! {
            next = connections.join_next() => if next.is_none() { break },
            _ = &mut deadline => {
                connections.abort_all();
                break;
            }
        }
    }
    Ok(())
}

/// The TLS handshake of a connection from `peer`, within its timeout and
/// unless a newer handshake takes its slot; `None` when it did not finish.
async fn handshake(
    tcp: tokio::net::TcpStream,
    peer: SocketAddr,
    handshaking: &Handshaking,
    tls: &Tls,
    timeout: Duration,
) -> Option<tokio_rustls::server::TlsStream<tokio::net::TcpStream>> {
    let accepted = tokio::select! {
        accepted = tokio::time::timeout(timeout, tls.acceptor().accept(tcp)) => accepted,
        _ = handshaking.stop.notified() => {
            tracing::debug!(%peer, "TLS handshake stopped: its slot was taken");
            return None;
        }
    };
    match accepted {
        Ok(Ok(stream)) => Some(stream),
        Ok(Err(e)) => {
            tracing::debug!(%peer, "TLS handshake failed: {e}");
            None
        }
        Err(_) => {
            tracing::debug!(%peer, "TLS handshake timed out");
            None
        }
    }
}

/// One request of a connection, routed: the webhook keeps it counted until
/// its evaluation ends, may mark the connection proven, and may close it.
async fn answer(
    mut request: hyper::Request<hyper::body::Incoming>,
    busy: Busy,
    router: Router,
    proven: Arc<AtomicBool>,
    close: Arc<Notify>,
) -> Result<axum::response::Response, std::convert::Infallible> {
    let busy = Arc::new(busy);
    request.extensions_mut().insert(super::refusal::Connection {
        in_flight: busy.clone(),
        proven,
        close,
    });
    let answer = router.oneshot(request).await;
    drop(busy);
    answer
}

async fn connection(
    tcp: tokio::net::TcpStream,
    peer: SocketAddr,
    handshaking: Handshaking,
    tls: Tls,
    router: Router,
    table: Arc<Table>,
    mut stop: watch::Receiver<bool>,
) {
    let limits = table.limits;
    let Some(stream) = handshake(tcp, peer, &handshaking, &tls, limits.handshake_timeout).await else {
        return;
    };
    drop(handshaking);
    let place = match table.admit(peer.ip()) {
        Ok(place) => Arc::new(place),
        Err(why) => {
            tracing::warn!(%peer, ?why, "refused a connection: no place for it");
            return;
        }
    };
    let counted = place.clone();
    let service = hyper::service::service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
        answer(
            request,
            counted.busy(),
            router.clone(),
            counted.proof(),
            counted.close.clone(),
        )
    });
    let mut builder = auto::Builder::new(TokioExecutor::new());
    // Small windows and buffers: what a peer sends before its request is
    // let in (the door, the budget) waits in these, so they bound what a
    // connection holds of a body not yet admitted.
    builder
        .http1()
        .timer(TokioTimer::new())
        .max_buf_size(WINDOW as usize)
        .header_read_timeout(limits.header_read_timeout);
    builder
        .http2()
        .timer(TokioTimer::new())
        .initial_stream_window_size(WINDOW)
        .initial_connection_window_size(WINDOW)
        .max_concurrent_streams(STREAMS)
        .keep_alive_interval(Some(Duration::from_secs(30)))
        .keep_alive_timeout(Duration::from_secs(10));
    let conn = builder.serve_connection(TokioIo::new(stream), service);
    tokio::pin!(conn);
    let close = place.close.clone();
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    let mut closing = false;
    loop {
        tokio::select! {
            _ = conn.as_mut() => break,
            _ = close.notified(), if !closing => {
                tracing::debug!(%peer, "closing an idle connection: its place is taken");
                conn.as_mut().graceful_shutdown();
                closing = true;
            }
            _ = stop.changed(), if !closing => {
                conn.as_mut().graceful_shutdown();
                closing = true;
            }
            _ = tick.tick(), if !closing => {
                if place.expired() {
                    tracing::debug!(%peer, "closing an idle connection");
                    conn.as_mut().graceful_shutdown();
                    closing = true;
                }
            }
        }
    }
}

impl Limits {
    /// The webhook listener's bounds from serve's flags.
    pub(crate) fn of(options: &Options) -> anyhow::Result<Limits> {
        if options.max_connections_per_peer == 0
            || options.max_connections == 0
            || options.max_requests_per_namespace == 0
        {
            return Err(anyhow::anyhow!(
                "--max-connections, --max-connections-per-peer and --max-requests-per-namespace: at least 1"
            ));
        }
        Ok(Limits {
            connections: options.max_connections,
            per_peer: options.max_connections_per_peer.min(options.max_connections),
            first_byte_timeout: crate::serve::answer::options::at_least_a_second(options.first_byte_timeout),
            idle_timeout: crate::serve::answer::options::at_least_a_second(options.idle_timeout),
            header_read_timeout: crate::serve::answer::options::at_least_a_second(options.header_read_timeout),
            ..Limits::default()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(connections: usize, per_peer: usize) -> Limits {
        Limits {
            connections,
            per_peer,
            handshakes: 2,
            handshakes_per_peer: 1,
            ..Limits::default()
        }
    }

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([127, 0, 0, last])
    }

    #[test]
    fn a_peer_gets_its_share_and_no_more() {
        let table = Table::new(limits(10, 2), ConnectionMetrics::default());
        let _a = table.admit(ip(1)).unwrap();
        let _b = table.admit(ip(1)).unwrap();
        assert_eq!(table.admit(ip(1)).err(), Some(Refused::Peer));
        let _c = table.admit(ip(2)).expect("another peer");
    }

    /// Marks `place` as having passed the door, as the webhook does.
    fn prove(place: &Place) {
        place.proof().store(true, Ordering::SeqCst);
    }

    /// Finding 4: when every place is taken, a new connection takes an
    /// unproven one's place (of the peer holding the most, the oldest),
    /// however young; a connection that passed the door is never taken,
    /// nor one with a request in flight, and past those the new one is
    /// refused. On eff3694 the API server's idle connections were taken
    /// first (its address held the most), and connections younger than
    /// 250 ms never.
    #[test]
    fn a_connection_that_passed_the_door_is_never_taken_for_a_new_one() {
        let table = Table::new(limits(4, 4), ConnectionMetrics::default());
        let apiserver: Vec<Place> = (0..2).map(|_| table.admit(ip(1)).unwrap()).collect();
        apiserver.iter().for_each(prove);
        let pod_old = table.admit(ip(9)).unwrap();
        let pod_new = table.admit(ip(9)).unwrap();
        // A pod's newcomer, at once: the oldest of the pod's two gives way.
        let newcomer = table.admit(ip(8)).expect("an unproven place given up");
        assert_eq!(table.open(), 4);
        assert_eq!(table.metrics.evicted.get(), 1);
        assert!(
            !table.places().open.contains_key(&pod_old.id),
            "the oldest unproven went"
        );
        assert!(table.places().open.contains_key(&pod_new.id));
        // Another: peer 9 and peer 8 hold one unproven each; the older goes.
        let _third = table.admit(ip(7)).unwrap();
        assert!(!table.places().open.contains_key(&pod_new.id));
        assert!(table.places().open.contains_key(&newcomer.id));
        // The API server's two are still there, whatever came.
        for place in &apiserver {
            assert!(table.places().open.contains_key(&place.id));
        }
        // With the unproven ones busy, nothing is taken.
        let _busy = (newcomer.busy(), _third.busy());
        assert_eq!(table.admit(ip(6)).err(), Some(Refused::Full));
        assert_eq!(table.metrics.evicted.get(), 2);
        drop((pod_old, pod_new));
        assert_eq!(table.open(), 4, "the places taken were already given");
    }

    /// Finding 4, the churn: pods that make and drop connections as fast
    /// as they like take only their own places; the API server's idle,
    /// proven connection keeps its place, and the API server reconnecting
    /// gets in, into a pod's place.
    #[test]
    fn churning_connections_take_each_others_places_and_the_api_server_gets_in() {
        let table = Table::new(limits(6, 6), ConnectionMetrics::default());
        let kept = table.admit(ip(1)).unwrap();
        prove(&kept);
        let mut pods: Vec<Place> = (0..5).map(|i| table.admit(ip(2 + i % 2)).unwrap()).collect();
        for round in 0..50 {
            let made = table
                .admit(ip(2 + round % 2))
                .expect("a pod's newcomer takes a pod's place");
            pods.push(made);
            assert_eq!(table.open(), 6);
            assert!(table.places().open.contains_key(&kept.id), "round {round}");
        }
        let reconnect = table.admit(ip(1)).expect("the API server reconnecting gets in");
        prove(&reconnect);
        assert!(table.places().open.contains_key(&kept.id));
        assert!(table.places().open.contains_key(&reconnect.id));
    }

    #[test]
    fn handshakes_are_bounded_per_peer_and_overall() {
        let table = Table::new(limits(10, 10), ConnectionMetrics::default());
        let one = table.handshake(ip(1)).unwrap();
        assert!(table.handshake(ip(1)).is_err(), "one per peer");
        let _two = table.handshake(ip(2)).unwrap();
        assert_eq!(table.places().handshaking, 2, "two overall");
        drop(one);
        table.handshake(ip(1)).expect("given back");
    }

    /// Round 3, finding 1: silent handshakes from a few addresses cannot
    /// hold every slot; a new one takes the slot of the oldest handshake of
    /// the peer holding the most, which is told to stop.
    #[test]
    fn a_new_handshake_takes_the_oldest_slot_of_the_peer_holding_the_most() {
        let table = Table::new(
            Limits {
                handshakes: 3,
                handshakes_per_peer: 2,
                ..limits(10, 10)
            },
            ConnectionMetrics::default(),
        );
        let first = table.handshake(ip(9)).unwrap();
        std::thread::sleep(Duration::from_millis(5));
        let _second = table.handshake(ip(9)).unwrap();
        let _other = table.handshake(ip(8)).unwrap();
        let stopped = first.stop.clone();
        let apiserver = table
            .handshake(ip(1))
            .expect("a slot taken from the peer holding the most");
        assert!(
            futures::FutureExt::now_or_never(stopped.notified()).is_some(),
            "the oldest handshake of peer 9 was told to stop"
        );
        assert_eq!(table.places().handshaking, 3);
        assert_eq!(table.places().handshakes.get(&ip(9)), Some(&1), "its oldest went");
        assert_eq!(table.metrics.evicted.get(), 1);
        // The one stopped was told; its guard's drop gives back nothing twice.
        drop(first);
        assert_eq!(table.places().handshaking, 3);
        drop(apiserver);
        assert_eq!(table.places().handshaking, 2);
    }

    #[test]
    fn a_connection_that_sends_nothing_expires() {
        let table = Table::new(
            Limits {
                first_byte_timeout: Duration::ZERO,
                idle_timeout: Duration::from_secs(3600),
                ..limits(4, 4)
            },
            ConnectionMetrics::default(),
        );
        let silent = table.admit(ip(1)).unwrap();
        assert!(silent.expired(), "no request by its first-byte timeout");
        let working = table.admit(ip(1)).unwrap();
        let busy = working.busy();
        assert!(!working.expired(), "a request in flight");
        drop(busy);
        assert!(!working.expired(), "served, and idle less than the idle timeout");
    }
}
