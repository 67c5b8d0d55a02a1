//! Plain-HTTP listeners for Prometheus and probes, shared by every component's
//! `--metrics-addr`: `/metrics` (OpenMetrics text of a registry), `/healthz` (the process
//! answers) and `/readyz` (it can do its job: see [`Readiness`]). The virtual node's adds, as the
//! original served there, the stats summary JSON (`/stats/summary`, the same as the kubelet
//! port's). Plain HTTP because Prometheus scrapes it from inside the cluster, like the kubelet's
//! read-only port; it carries no pod data beyond usage numbers.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, RwLock};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use prometheus_client::registry::Registry;
use tensile_kubelet::KubeletBackend;
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
type StatsFn = Arc<dyn Fn() -> Pin<Box<dyn Future<Output = Reply> + Send>> + Send + Sync>;

/// Binds `addr` and serves `/metrics` of `registry`, `/healthz` and `/readyz` of `readiness`
/// until `stop`; returns the bound address.
pub async fn serve_probes(
    addr: SocketAddr,
    registry: Arc<Registry>,
    readiness: Readiness,
    stop: CancellationToken,
) -> Result<SocketAddr, MetricsError> {
    Ok(serve_routes(addr, registry, readiness, None, stop).await?.0)
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
    serve_routes(addr, registry, readiness, None, stop).await
}

/// The virtual node's listener: [`serve_probes`] plus `/stats/summary` of `backend`.
pub async fn serve<B: KubeletBackend + 'static>(
    addr: SocketAddr,
    registry: Arc<Registry>,
    readiness: Readiness,
    backend: Arc<B>,
    stop: CancellationToken,
) -> Result<SocketAddr, MetricsError> {
    let stats: StatsFn = Arc::new(move || {
        let backend = backend.clone();
        Box::pin(async move { stats_summary(&*backend).await })
    });
    Ok(serve_routes(addr, registry, readiness, Some(stats), stop)
        .await?
        .0)
}

async fn serve_routes(
    addr: SocketAddr,
    registry: Arc<Registry>,
    readiness: Readiness,
    stats: Option<StatsFn>,
    stop: CancellationToken,
) -> Result<(SocketAddr, tokio::task::JoinHandle<()>), MetricsError> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| MetricsError { addr, source })?;
    let bound = listener
        .local_addr()
        .map_err(|source| MetricsError { addr, source })?;
    let task = tokio::spawn(async move {
        loop {
            let (tcp, _) = tokio::select! {
                () = stop.cancelled() => return,
                a = listener.accept() => match a {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::warn!(error = %e, "metrics listener accept");
                        continue;
                    }
                },
            };
            let (registry, readiness, stats) = (registry.clone(), readiness.clone(), stats.clone());
            let svc = service_fn(move |req| {
                let (registry, readiness, stats) =
                    (registry.clone(), readiness.clone(), stats.clone());
                async move {
                    Ok::<_, Infallible>(route(req, &registry, &readiness, stats.as_ref()).await)
                }
            });
            let stop = stop.clone();
            tokio::spawn(async move {
                let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                let conn = builder.serve_connection(TokioIo::new(tcp), svc);
                tokio::select! {
                    () = stop.cancelled() => {}
                    r = conn => if let Err(e) = r {
                        tracing::debug!(error = %e, "metrics connection");
                    },
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

async fn stats_summary<B: KubeletBackend>(backend: &B) -> Reply {
    match backend.stats().await {
        Ok(summary) => match serde_json::to_vec(&summary) {
            Ok(body) => reply(StatusCode::OK, "application/json", body),
            Err(e) => reply(
                StatusCode::INTERNAL_SERVER_ERROR,
                TEXT,
                format!("encoding the stats summary: {e}\n"),
            ),
        },
        Err(e) => reply(
            StatusCode::INTERNAL_SERVER_ERROR,
            TEXT,
            format!("stats summary from the lower cluster: {e}\n"),
        ),
    }
}

async fn route(
    req: Request<Incoming>,
    registry: &Registry,
    readiness: &Readiness,
    stats: Option<&StatsFn>,
) -> Reply {
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
        "/stats/summary" | "/stats/summary/" if stats.is_some() => match stats {
            Some(stats) => stats().await,
            None => reply(StatusCode::NOT_FOUND, TEXT, "no stats here\n"),
        },
        "/healthz" => reply(StatusCode::OK, TEXT, "ok"),
        "/readyz" => match readiness.check() {
            Ok(()) => reply(StatusCode::OK, TEXT, "ok"),
            Err(reason) => reply(StatusCode::SERVICE_UNAVAILABLE, TEXT, reason),
        },
        other => reply(
            StatusCode::NOT_FOUND,
            TEXT,
            format!(
                "{other} not found: this listener serves /metrics, {}/healthz and /readyz\n",
                if stats.is_some() {
                    "/stats/summary, "
                } else {
                    ""
                }
            ),
        ),
    }
}
