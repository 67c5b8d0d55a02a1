//! `--metrics-addr`: a plain-HTTP listener with the Prometheus metrics of the virtual node
//! (`/metrics`: API calls per cluster and verb, pod sync stage durations) and, as the original
//! served there, the stats summary JSON (`/stats/summary`, the same as the kubelet port's).
//! Plain HTTP because Prometheus scrapes it from inside the cluster, like the kubelet's
//! read-only port; it carries no pod data beyond usage numbers.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

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

/// Binds `addr` and serves until `stop`; returns the bound address.
pub async fn serve<B: KubeletBackend + 'static>(
    addr: SocketAddr,
    registry: Arc<Registry>,
    backend: Arc<B>,
    stop: CancellationToken,
) -> Result<SocketAddr, MetricsError> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| MetricsError { addr, source })?;
    let bound = listener
        .local_addr()
        .map_err(|source| MetricsError { addr, source })?;
    tokio::spawn(async move {
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
            let (registry, backend) = (registry.clone(), backend.clone());
            let svc = service_fn(move |req| {
                let (registry, backend) = (registry.clone(), backend.clone());
                async move { Ok::<_, Infallible>(route(req, &registry, &*backend).await) }
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
    Ok(bound)
}

fn reply(status: StatusCode, content_type: &str, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    if let Ok(v) = header::HeaderValue::from_str(content_type) {
        r.headers_mut().insert(header::CONTENT_TYPE, v);
    }
    r
}

async fn route<B: KubeletBackend>(
    req: Request<Incoming>,
    registry: &Registry,
    backend: &B,
) -> Response<Full<Bytes>> {
    const TEXT: &str = "text/plain; charset=utf-8";
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
        "/stats/summary" | "/stats/summary/" => match backend.stats().await {
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
        },
        "/healthz" => reply(StatusCode::OK, TEXT, "ok"),
        other => reply(
            StatusCode::NOT_FOUND,
            TEXT,
            format!(
                "{other} not found: this listener serves /metrics, /stats/summary and /healthz\n"
            ),
        ),
    }
}
