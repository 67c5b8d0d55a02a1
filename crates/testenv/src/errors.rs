//! An HTTPS proxy in front of a cluster's API that answers a share of the requests with
//! `429 Too Many Requests` or `500 Internal Server Error` instead of passing them on: an
//! overloaded or failing API server (priority and fairness rejecting, etcd timing out), on
//! either backend. Unlike the TCP proxy of [`super::faults`] it ends TLS: it presents its own
//! certificate (its kubeconfig trusts its own CA) and sends each request on with the
//! cluster's administrator client, so it sees requests one by one.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt as _, Full, combinators::UnsyncBoxBody};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::certs::{Ca, CertError};
use tensile_sim::apiserver::KubeconfigEntry;

/// Starting an error proxy failed.
#[derive(Debug, thiserror::Error)]
pub enum ErrorProxyError {
    /// Its certificates could not be made.
    #[error("error proxy certificates: {0}")]
    Cert(#[from] CertError),
    /// Its port or kubeconfig could not be had.
    #[error("error proxy {what}: {source}")]
    Io {
        /// What failed.
        what: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// What the proxy answered so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ErrorCounts {
    /// Requests passed on to the API server.
    pub passed: u64,
    /// Requests answered `429`.
    pub too_many: u64,
    /// Requests answered `500`.
    pub internal: u64,
}

#[derive(Debug, Default)]
struct Shared {
    /// The share of requests answered with an error, in millionths.
    share_ppm: AtomicU64,
    /// Every error a 429 (throttling), not 429 and 500 taking turns.
    throttle_only: std::sync::atomic::AtomicBool,
    requests: AtomicU64,
    injected: AtomicU64,
    passed: AtomicU64,
    too_many: AtomicU64,
    internal: AtomicU64,
}

/// A running error proxy; it stops when dropped.
#[derive(Debug)]
pub struct ErrorProxy {
    addr: SocketAddr,
    kubeconfig: PathBuf,
    shared: Arc<Shared>,
    stop: CancellationToken,
}

impl Drop for ErrorProxy {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl ErrorProxy {
    /// Listens on a free loopback port, sending requests on through `upstream` (a client of
    /// the cluster, the administrator's), and writes a kubeconfig reaching the cluster
    /// through the proxy to `kubeconfig` (context `entry.context`; any client may use it). No errors until [`ErrorProxy::set_error_share`].
    pub async fn start(
        upstream: kube::Client,
        entry: &KubeconfigEntry,
        kubeconfig: &Path,
    ) -> Result<Self, ErrorProxyError> {
        let io = |what: &str| {
            let what = what.to_owned();
            move |source| ErrorProxyError::Io { what, source }
        };
        let listener = TcpListener::bind(("127.0.0.1", 0))
            .await
            .map_err(io("listening"))?;
        let addr = listener.local_addr().map_err(io("listening"))?;
        let ca = Ca::new("error-proxy-ca")?;
        let serving = ca.issue_server("error-proxy", &["127.0.0.1".into()])?;
        let tls = crate::certs::server_config(&serving, ca.cert_pem())?;
        let mut through = entry.clone();
        through.server = format!("https://{addr}");
        through.ca_pem = ca.cert_pem().to_owned();
        // The proxy asks for client certificates of its own CA (and checks none further).
        through.client = Some(ca.issue_client("error-proxy-client", None)?);
        through.token = None;
        crate::secret_file::write_secret(
            kubeconfig,
            tensile_sim::apiserver::kubeconfig(std::slice::from_ref(&through)),
        )
        .map_err(io("kubeconfig"))?;
        let shared = Arc::new(Shared::default());
        let stop = CancellationToken::new();
        tokio::spawn(accept(
            listener,
            tokio_rustls::TlsAcceptor::from(tls),
            upstream,
            shared.clone(),
            stop.clone(),
        ));
        Ok(Self {
            addr,
            kubeconfig: kubeconfig.to_owned(),
            shared,
            stop,
        })
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The kubeconfig reaching the cluster through the proxy.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// Answers `share` (0.0 to 1.0) of the requests from now on with an error, 429 and 500
    /// taking turns; 0.0 passes every request on.
    pub fn set_error_share(&self, share: f64) {
        // A share in millionths: the float rounded into the range.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let ppm = (share.clamp(0.0, 1.0) * 1_000_000.0).round() as u64;
        self.shared.throttle_only.store(false, Ordering::Relaxed);
        self.shared.share_ppm.store(ppm, Ordering::Relaxed);
    }

    /// Answers `share` (0.0 to 1.0) of the requests from now on with `429 Too Many Requests`
    /// alone (`Retry-After: 1`): an API server throttling its clients (priority and
    /// fairness); 0.0 passes every request on.
    pub fn set_throttle_share(&self, share: f64) {
        self.set_error_share(share);
        self.shared.throttle_only.store(true, Ordering::Relaxed);
    }

    /// What it answered so far.
    pub fn counts(&self) -> ErrorCounts {
        ErrorCounts {
            passed: self.shared.passed.load(Ordering::Relaxed),
            too_many: self.shared.too_many.load(Ordering::Relaxed),
            internal: self.shared.internal.load(Ordering::Relaxed),
        }
    }
}

async fn accept(
    listener: TcpListener,
    tls: tokio_rustls::TlsAcceptor,
    upstream: kube::Client,
    shared: Arc<Shared>,
    stop: CancellationToken,
) {
    let mut errors = tensile_runtime::tls::AcceptErrors::new("error proxy");
    loop {
        let (tcp, _) = tokio::select! {
            () = stop.cancelled() => return,
            c = tensile_runtime::tls::accept_backing_off(&listener, &mut errors) => c,
        };
        let (tls, upstream, shared, stop) =
            (tls.clone(), upstream.clone(), shared.clone(), stop.clone());
        tokio::spawn(async move {
            let Ok(io) = tls.accept(tcp).await else {
                return;
            };
            let service = hyper::service::service_fn(move |req| {
                let (upstream, shared) = (upstream.clone(), shared.clone());
                async move { forward(&upstream, &shared, req).await }
            });
            let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            let conn = builder.serve_connection(TokioIo::new(io), service);
            tokio::select! {
                _ = conn => {}
                () = stop.cancelled() => {}
            }
        });
    }
}

type ProxyBody = UnsyncBoxBody<Bytes, Box<dyn std::error::Error + Send + Sync>>;

fn full(status: StatusCode, body: String) -> Response<ProxyBody> {
    let mut res = Response::new(
        Full::new(Bytes::from(body))
            .map_err(|never| match never {})
            .boxed_unsync(),
    );
    *res.status_mut() = status;
    res.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    res
}

/// A Kubernetes `Status` for an injected error.
fn status_body(code: u16, reason: &str, message: &str) -> String {
    serde_json::json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": message, "reason": reason, "code": code})
    .to_string()
}

/// Whether request `n` is answered with an error at `ppm` millionths: every n-th request in a
/// million decides, spread evenly (reproducible, no random source).
fn fails(n: u64, ppm: u64) -> bool {
    ppm > 0 && (n.wrapping_mul(ppm) % 1_000_000) < ppm
}

/// Answers `req` with an injected error, or with the API server's answer. When the API server
/// cannot be reached, the client's connection is closed (an error of the service), as a TCP
/// proxy in front of a dead server would do, not answered with a gateway error.
async fn forward(
    upstream: &kube::Client,
    shared: &Shared,
    req: Request<Incoming>,
) -> Result<Response<ProxyBody>, kube::Error> {
    let n = shared.requests.fetch_add(1, Ordering::Relaxed);
    let ppm = shared.share_ppm.load(Ordering::Relaxed);
    if fails(n, ppm) {
        let injected = shared.injected.fetch_add(1, Ordering::Relaxed);
        if injected.is_multiple_of(2) || shared.throttle_only.load(Ordering::Relaxed) {
            shared.too_many.fetch_add(1, Ordering::Relaxed);
            let mut res = full(
                StatusCode::TOO_MANY_REQUESTS,
                status_body(429, "TooManyRequests", "injected: too many requests"),
            );
            res.headers_mut().insert(
                http::header::RETRY_AFTER,
                http::HeaderValue::from_static("1"),
            );
            return Ok(res);
        }
        shared.internal.fetch_add(1, Ordering::Relaxed);
        return Ok(full(
            StatusCode::INTERNAL_SERVER_ERROR,
            status_body(500, "InternalError", "injected: internal error"),
        ));
    }
    shared.passed.fetch_add(1, Ordering::Relaxed);
    let (mut parts, body) = req.into_parts();
    let body = match body.collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            return Ok(full(
                StatusCode::BAD_REQUEST,
                status_body(400, "BadRequest", &format!("reading the body: {e}")),
            ));
        }
    };
    // The upstream client sets its own host, credentials and length.
    for h in [
        http::header::HOST,
        http::header::AUTHORIZATION,
        http::header::CONTENT_LENGTH,
        http::header::CONNECTION,
        http::header::TRANSFER_ENCODING,
    ] {
        parts.headers.remove(h);
    }
    if let Some(pq) = parts.uri.path_and_query().cloned()
        && let Ok(uri) = http::Uri::builder().path_and_query(pq).build()
    {
        parts.uri = uri;
    }
    // The protocol is per hop: a request that came over HTTP/2 goes on as the upstream
    // client speaks.
    parts.version = http::Version::default();
    let req = Request::from_parts(parts, kube::client::Body::from(body));
    let (parts, body) = upstream.send(req).await?.into_parts();
    Ok(Response::from_parts(
        parts,
        body.map_err(|e| Box::new(e) as Box<dyn std::error::Error + Send + Sync>)
            .boxed_unsync(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_share_of_requests_failed_is_spread_evenly() {
        let failed = |ppm| (0..1000).filter(|n| fails(*n, ppm)).count();
        assert_eq!(failed(0), 0);
        assert_eq!(failed(300_000), 300);
        assert_eq!(failed(1_000_000), 1000);
        // No long run of failures at 30 %.
        assert!(
            (0..1000)
                .collect::<Vec<u64>>()
                .windows(3)
                .all(|w| !w.iter().all(|n| fails(*n, 300_000)))
        );
    }
}
