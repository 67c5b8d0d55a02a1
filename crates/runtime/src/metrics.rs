//! Plain-HTTP listeners for Prometheus and probes, shared by every component's
//! `--metrics-addr`: `/metrics` (OpenMetrics text of a registry), `/healthz` (the process
//! answers) and `/readyz` (it can do its job: see [`Readiness`]); nothing else. Plain HTTP
//! without credentials because Prometheus and probes use it, so it carries no pod data: the
//! stats summary (pod names, namespaces, UIDs) is served only on the authenticated kubelet port
//! (the original also served it here). Connections get the kubelet port's limits (a client that
//! does not send its request's headers in time is closed) and the accept loop backs off after
//! errors.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, RwLock};

use crate::tls::{AcceptErrors, ConnectionLimits, accept_backing_off};
use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// The metrics listener could not start.
#[derive(Debug, thiserror::Error)]
#[error("metrics listener cannot listen on {addr}: {source}")]
pub struct MetricsError {
    /// Address asked for.
    pub addr: SocketAddr,
    /// Why.
    #[source]
    pub source: std::io::Error,
}

/// Whether the component can do its job, as `/readyz` answers it: shared between the listener
/// and the component, which flips it as it starts (caches synced, port bound) or stands by.
#[derive(Clone, Debug)]
pub struct Readiness(Arc<RwLock<Option<String>>>);

impl Readiness {
    /// Not ready yet, for `reason` (what `/readyz` answers with 503).
    pub fn not_ready(reason: impl Into<String>) -> Self {
        Self(Arc::new(RwLock::new(Some(reason.into()))))
    }

    /// Ready from the start (components whose work needs nothing to sync first).
    pub fn ready() -> Self {
        Self(Arc::new(RwLock::new(None)))
    }

    /// Now ready.
    pub fn set_ready(&self) {
        self.set(None);
    }

    /// Now not ready, for `reason`.
    pub fn set_not_ready(&self, reason: impl Into<String>) {
        self.set(Some(reason.into()));
    }

    /// `Err(reason)` while not ready.
    pub fn check(&self) -> Result<(), String> {
        // A poisoned lock only means a writer panicked between two plain stores: the value is
        // still one of them.
        match &*self
            .0
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
        {
            None => Ok(()),
            Some(reason) => Err(reason.clone()),
        }
    }

    fn set(&self, value: Option<String>) {
        *self
            .0
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = value;
    }
}

type Reply = Response<Full<Bytes>>;

/// Binds `addr` and serves `/metrics` of `registry`, `/healthz` and `/readyz` of `readiness`
/// until `stop`; returns the bound address.
pub async fn serve_probes(
    addr: SocketAddr,
    registry: Arc<Registry>,
    readiness: Readiness,
    stop: CancellationToken,
) -> Result<SocketAddr, MetricsError> {
    Ok(
        serve_routes(addr, registry, readiness, ConnectionLimits::default(), stop)
            .await?
            .0,
    )
}

/// [`serve_probes`], with the listener's task: it ends, and the port is free again, once `stop`
/// is cancelled. For a process that hands the port over to another listener (a virtual node's
/// standby, once it leads).
pub async fn serve_probes_joinable(
    addr: SocketAddr,
    registry: Arc<Registry>,
    readiness: Readiness,
    stop: CancellationToken,
) -> Result<(SocketAddr, tokio::task::JoinHandle<()>), MetricsError> {
    serve_routes(addr, registry, readiness, ConnectionLimits::default(), stop).await
}

async fn serve_routes(
    addr: SocketAddr,
    registry: Arc<Registry>,
    readiness: Readiness,
    limits: ConnectionLimits,
    stop: CancellationToken,
) -> Result<(SocketAddr, tokio::task::JoinHandle<()>), MetricsError> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| MetricsError { addr, source })?;
    let bound = listener
        .local_addr()
        .map_err(|source| MetricsError { addr, source })?;
    let task = tokio::spawn(async move {
        let mut errors = AcceptErrors::new("metrics");
        loop {
            let (tcp, _) = tokio::select! {
                () = stop.cancelled() => return,
                a = accept_backing_off(&listener, &mut errors) => a,
            };
            let (registry, readiness) = (registry.clone(), readiness.clone());
            let svc = service_fn(move |req| {
                let (registry, readiness) = (registry.clone(), readiness.clone());
                async move { Ok::<_, Infallible>(route(&req, &registry, &readiness)) }
            });
            let stop = stop.clone();
            tokio::spawn(async move {
                // HTTP/1.1 only (Prometheus and probes speak it), with the header timeout.
                tokio::select! {
                    () = stop.cancelled() => {}
                    () = crate::tls::serve_plain_connection(tcp, &limits, svc) => {}
                }
            });
        }
    });
    Ok((bound, task))
}

const TEXT: &str = "text/plain; charset=utf-8";

fn reply(status: StatusCode, content_type: &str, body: impl Into<Bytes>) -> Reply {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    if let Ok(v) = header::HeaderValue::from_str(content_type) {
        r.headers_mut().insert(header::CONTENT_TYPE, v);
    }
    r
}

fn route(req: &Request<Incoming>, registry: &Registry, readiness: &Readiness) -> Reply {
    if req.method() != Method::GET {
        let mut r = reply(
            StatusCode::METHOD_NOT_ALLOWED,
            TEXT,
            "only GET is served here\n",
        );
        r.headers_mut()
            .insert(header::ALLOW, header::HeaderValue::from_static("GET"));
        return r;
    }
    match req.uri().path() {
        "/metrics" => {
            let mut text = String::new();
            match prometheus_client::encoding::text::encode(&mut text, registry) {
                Ok(()) => reply(
                    StatusCode::OK,
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    text,
                ),
                Err(e) => reply(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    TEXT,
                    format!("encoding metrics: {e}\n"),
                ),
            }
        }
        "/healthz" => reply(StatusCode::OK, TEXT, "ok"),
        "/readyz" => match readiness.check() {
            Ok(()) => reply(StatusCode::OK, TEXT, "ok"),
            Err(reason) => reply(StatusCode::SERVICE_UNAVAILABLE, TEXT, reason),
        },
        other => reply(
            StatusCode::NOT_FOUND,
            TEXT,
            format!(
                "{other} not found: this listener serves /metrics, /healthz and /readyz (the stats summary is on the kubelet port, with credentials)\n"
            ),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    /// Everything the server sends until it closes the connection.
    async fn until_closed(mut tcp: TcpStream) -> String {
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            match tcp.read(&mut buf).await {
                Ok(0) | Err(_) => return String::from_utf8_lossy(&got).into_owned(),
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    }

    async fn get(addr: SocketAddr, path: &str) -> String {
        let mut tcp = TcpStream::connect(addr).await.unwrap();
        tcp.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: m\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
        until_closed(tcp).await
    }

    async fn listener(limits: ConnectionLimits) -> (SocketAddr, CancellationToken) {
        let stop = CancellationToken::new();
        let (addr, _) = serve_routes(
            "127.0.0.1:0".parse().unwrap(),
            Arc::new(Registry::default()),
            Readiness::ready(),
            limits,
            stop.clone(),
        )
        .await
        .unwrap();
        (addr, stop)
    }

    /// Only the probes and metrics: the stats summary (pod names, namespaces, UIDs) is not
    /// served without credentials.
    #[tokio::test]
    async fn only_metrics_and_probes_are_served() {
        let (addr, stop) = listener(ConnectionLimits::default()).await;
        for path in ["/metrics", "/healthz", "/readyz"] {
            let r = get(addr, path).await;
            assert!(r.starts_with("HTTP/1.1 200"), "{path}: {r}");
        }
        for path in [
            "/stats/summary",
            "/stats/summary/",
            "/pods",
            "/metrics/resource",
        ] {
            let r = get(addr, path).await;
            assert!(r.starts_with("HTTP/1.1 404"), "{path}: {r}");
        }
        stop.cancel();
    }

    /// A client that never finishes its request's headers is closed once the header timeout
    /// passes; the listener goes on serving.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn half_sent_headers_are_cut_off() {
        let limits = ConnectionLimits {
            header_read_timeout: Duration::from_millis(300),
            ..ConnectionLimits::default()
        };
        let (addr, stop) = listener(limits).await;
        let mut tcp = TcpStream::connect(addr).await.unwrap();
        tcp.write_all(b"GET /metrics HTTP/1.1\r\nHost: m\r\n")
            .await
            .unwrap();
        let closed = tokio::time::timeout(Duration::from_secs(20), until_closed(tcp)).await;
        assert!(
            closed.is_ok(),
            "the half-sent request was still open after 20 s"
        );
        // Silent from the start.
        let tcp = TcpStream::connect(addr).await.unwrap();
        let closed = tokio::time::timeout(Duration::from_secs(20), until_closed(tcp)).await;
        assert!(
            closed.is_ok(),
            "a silent connection was still open after 20 s"
        );
        assert!(get(addr, "/healthz").await.starts_with("HTTP/1.1 200"));
        stop.cancel();
    }
}
