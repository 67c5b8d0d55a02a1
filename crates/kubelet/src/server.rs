//! The kubelet HTTPS server: TLS (given or self-signed), authentication and authorization of
//! every request (see [`crate::auth`]), and the routes the API server and metrics-server use.
//! Streams go to [`crate::remotecommand`] and [`crate::portforward`]; everything else asks the
//! backend.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use futures::Stream;
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::Pod;
use rustls_pki_types::CertificateDer;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::auth::{Auth, ClientCert, User, attributes};
use crate::backend::{
    AttachRequest, BackendError, ExecRequest, PodRef, StreamBackend, StreamOptions,
};
use crate::logs::LogOptions;
use crate::stats::{Summary, resource_metrics};
use crate::tls::ClientCertChecker;
use crate::upgrade::{
    PortForwardUpgrade, RemoteCommandUpgrade, command_from_query, ports_from_query,
};
use crate::{StreamingConfig, portforward, remotecommand};

/// A stream of log bytes.
pub type LogStream = Pin<Box<dyn Stream<Item = std::io::Result<Bytes>> + Send>>;

/// Everything the kubelet API needs from whoever runs the pods.
pub trait KubeletBackend: StreamBackend {
    /// A container's log, as `options` ask (follow streams until the client leaves).
    fn logs(
        &self,
        pod: PodRef,
        container: String,
        options: LogOptions,
    ) -> impl Future<Output = Result<LogStream, BackendError>> + Send;
    /// The pods bound to this node.
    fn pods(&self) -> impl Future<Output = Result<Vec<Pod>, BackendError>> + Send;
    /// Resource usage of the node and its pods.
    fn stats(&self) -> impl Future<Output = Result<Summary, BackendError>> + Send;
}

/// Where the serving certificate comes from.
#[derive(Debug, Clone)]
pub enum ServingCert {
    /// PEM certificate chain and key (`APISERVER_CERT_LOCATION`/`APISERVER_KEY_LOCATION`).
    Pem {
        /// Certificate chain.
        cert: String,
        /// Private key.
        key: String,
    },
    /// A self-signed certificate for these names and addresses (the API server does not verify
    /// kubelet certificates unless configured to).
    SelfSigned {
        /// DNS names and IP addresses.
        sans: Vec<String>,
    },
}

/// Configuration of a kubelet API server.
#[derive(Debug)]
pub struct KubeletServerConfig {
    /// Listen address (the kubelet's is `:10250`).
    pub listen: SocketAddr,
    /// The serving certificate.
    pub cert: ServingCert,
    /// CA for client certificates (the API server presents one signed by the cluster CA); None:
    /// every client certificate is refused (tokens still work).
    pub client_ca_pem: Option<String>,
    /// Authentication and authorization.
    pub auth: Auth,
    /// Streaming limits and timeouts.
    pub streaming: StreamingConfig,
}

/// Starting the server failed.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The listen address could not be bound.
    #[error("kubelet API cannot listen on {addr}: {source}")]
    Bind {
        /// Address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The certificate or CA could not be used.
    #[error("kubelet API TLS: {0}")]
    Tls(String),
}

/// A running kubelet API server; stops when dropped.
#[derive(Debug)]
pub struct KubeletServer {
    addr: SocketAddr,
    stop: CancellationToken,
}

impl Drop for KubeletServer {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

type Body = UnsyncBoxBody<Bytes, std::io::Error>;

fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into())
        .map_err(|never: Infallible| match never {})
        .boxed_unsync()
}

fn text(code: StatusCode, body: impl Into<Bytes>) -> Response<Body> {
    let mut r = Response::new(full(body));
    *r.status_mut() = code;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

fn json(value: &impl serde::Serialize) -> Response<Body> {
    let mut r = Response::new(full(serde_json::to_vec(value).unwrap_or_default()));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

fn tls_config(
    config: &KubeletServerConfig,
) -> Result<(Arc<rustls::ServerConfig>, Arc<ClientCertChecker>), ServerError> {
    let (cert, key) = match &config.cert {
        ServingCert::Pem { cert, key } => (cert.clone(), key.clone()),
        ServingCert::SelfSigned { sans } => {
            let c = rcgen::generate_simple_self_signed(sans.clone())
                .map_err(|e| ServerError::Tls(e.to_string()))?;
            (c.cert.pem(), c.signing_key.serialize_pem())
        }
    };
    // Client certificates are asked for, not required (bearer-token clients have none), and
    // verified after the handshake, as the kubelet does: one of another CA is a counted 401,
    // not a handshake failure. Streams upgrade the connection, which HTTP/2 cannot.
    let checker = Arc::new(
        ClientCertChecker::new(config.client_ca_pem.as_deref()).map_err(ServerError::Tls)?,
    );
    let tls = crate::tls::server_config_checked_later(&cert, &key, checker.clone(), &[b"http/1.1"])
        .map_err(ServerError::Tls)?;
    Ok((tls, checker))
}

/// A connection's client certificate, checked against the client CA.
fn client_cert(chain: Option<&[CertificateDer<'_>]>, checker: &ClientCertChecker) -> ClientCert {
    match chain {
        Some(chain @ [end_entity, ..]) => match checker.check(chain) {
            Ok(()) => certificate_user(end_entity).into(),
            Err(refused) => ClientCert::Refused(refused),
        },
        _ => ClientCert::None,
    }
}

/// The user of a verified client certificate as Go's kubelet reads it (k8s.io/apiserver's
/// `x509.CommonNameUserConversion` over crypto/x509's `pkix.Name`): of each RDN only its first
/// attribute counts, attributes that are not strings are skipped, the name is the LAST CN (each
/// one overwrites `CommonName` in `FillFromRDNSequence`) and the groups every O in order. No CN,
/// or an empty one, is no user. Reading another CN than the API server does would authorize a
/// certificate under a name its issuer did not mean.
pub fn certificate_user(cert: &CertificateDer<'_>) -> Option<User> {
    use x509_parser::oid_registry::{OID_X509_COMMON_NAME, OID_X509_ORGANIZATION_NAME};
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
    let mut name = None;
    let mut groups = Vec::new();
    for rdn in parsed.subject().iter() {
        let Some(attribute) = rdn.iter().next() else {
            continue;
        };
        let Ok(value) = attribute.as_str() else {
            continue;
        };
        if *attribute.attr_type() == OID_X509_COMMON_NAME {
            name = Some(value);
        } else if *attribute.attr_type() == OID_X509_ORGANIZATION_NAME {
            groups.push(value.to_owned());
        }
    }
    Some(User {
        name: name.filter(|n| !n.is_empty())?.to_owned(),
        uid: None,
        groups,
    })
}

impl KubeletServer {
    /// Binds and serves until dropped.
    pub async fn start<B: KubeletBackend>(
        config: KubeletServerConfig,
        backend: Arc<B>,
    ) -> Result<Self, ServerError> {
        if matches!(config.auth, Auth::Disabled) {
            tracing::warn!(
                "kubelet API authentication and authorization are OFF: anyone who reaches {} can read logs and run commands in every pod",
                config.listen
            );
        }
        let (tls, checker) = tls_config(&config)?;
        let listener =
            TcpListener::bind(config.listen)
                .await
                .map_err(|source| ServerError::Bind {
                    addr: config.listen,
                    source,
                })?;
        let addr = listener.local_addr().map_err(|source| ServerError::Bind {
            addr: config.listen,
            source,
        })?;
        let stop = CancellationToken::new();
        let limits = config.streaming.connection;
        let ctx = Arc::new(Context {
            auth: config.auth,
            streaming: config.streaming,
        });
        tensile_runtime::tls::accept_loop(listener, tls, limits, stop.clone(), move |tls| {
            let (ctx, backend, checker) = (ctx.clone(), backend.clone(), checker.clone());
            async move {
                // Once per connection: the certificate is the handshake's.
                let cert = client_cert(tls.get_ref().1.peer_certificates(), &checker);
                let svc = service_fn(move |req| {
                    let (ctx, backend, cert) = (ctx.clone(), backend.clone(), cert.clone());
                    async move { Ok::<_, Infallible>(handle(&ctx, backend, cert, req).await) }
                });
                // HTTP/1.1, the only protocol ALPN offers: streams upgrade the connection.
                tensile_runtime::tls::serve_connection(tls, &limits, svc).await;
            }
        });
        Ok(Self { addr, stop })
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops serving.
    pub fn stop(&self) {
        self.stop.cancel();
    }
}

/// Per-server state shared by requests.
#[derive(Debug)]
pub struct Context {
    /// Authentication and authorization.
    pub auth: Auth,
    /// Streaming limits.
    pub streaming: StreamingConfig,
}

/// A route of the kubelet API, read from the request path alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// `/healthz`.
    Healthz,
    /// `/pods`.
    Pods,
    /// `/runningpods/`.
    RunningPods,
    /// `/containerLogs/{namespace}/{pod}/{container}`.
    Logs(PodRef, String),
    /// `/exec/{namespace}/{pod}[/{uid}]/{container}`.
    Exec(PodRef, String),
    /// `/attach/{namespace}/{pod}[/{uid}]/{container}`.
    Attach(PodRef, String),
    /// `/portForward/{namespace}/{pod}[/{uid}]`.
    PortForward(PodRef),
    /// `/stats/summary`.
    StatsSummary,
    /// `/metrics/resource`.
    MetricsResource,
}

/// Why a request has no route: 404, or 405 with the methods its path allows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unrouted {
    /// No route has this path.
    NotFound,
    /// The path's route does not take this method.
    MethodNotAllowed(&'static [Method]),
}

/// What a route reads from the query string and the headers before it is served (each `Err` is
/// answered 400 with the error's text).
#[derive(Debug)]
pub enum Prepared {
    /// The route reads neither.
    Plain,
    /// A container's log: its options.
    Logs(Result<LogOptions, crate::LogOptionsError>),
    /// Exec or attach: the negotiated upgrade, the streams and (exec) the command.
    RemoteCommand(Result<RemoteCommandPlan, crate::UpgradeError>),
    /// Port-forward: the ports and the negotiated upgrade.
    PortForward(Result<(Vec<u16>, PortForwardUpgrade), crate::UpgradeError>),
}

/// An exec or attach request as read from its query string and headers.
#[derive(Debug)]
pub struct RemoteCommandPlan {
    /// The protocol and its 101 response.
    pub upgrade: RemoteCommandUpgrade,
    /// The standard streams asked for.
    pub options: StreamOptions,
    /// The command (empty for attach).
    pub command: Vec<String>,
}

/// The route of `path`, checked against `method`: a function of the two alone, so the router
/// is tested (and fuzzed, `fuzz/`) without a connection.
pub fn route_request(method: &Method, path: &str) -> Result<Route, Unrouted> {
    let (route, methods) = route(path).ok_or(Unrouted::NotFound)?;
    if methods.contains(method) {
        Ok(route)
    } else {
        Err(Unrouted::MethodNotAllowed(methods))
    }
}

impl Route {
    /// Reads what the route needs from `query` and `headers`, as [`handle`] does.
    pub fn prepare(&self, query: &str, headers: &HeaderMap) -> Prepared {
        match self {
            Self::Healthz
            | Self::Pods
            | Self::RunningPods
            | Self::StatsSummary
            | Self::MetricsResource => Prepared::Plain,
            Self::Logs(..) => Prepared::Logs(LogOptions::from_query(Some(query))),
            Self::Exec(..) => Prepared::RemoteCommand(remote_command_plan(headers, query, true)),
            Self::Attach(..) => Prepared::RemoteCommand(remote_command_plan(headers, query, false)),
            Self::PortForward(..) => Prepared::PortForward(port_forward_plan(headers, query)),
        }
    }
}

/// Exec's and attach's upgrade, streams and command, read in the order their errors are
/// answered.
pub fn remote_command_plan(
    headers: &HeaderMap,
    query: &str,
    exec: bool,
) -> Result<RemoteCommandPlan, crate::UpgradeError> {
    let upgrade = RemoteCommandUpgrade::negotiate(headers)?;
    let options = StreamOptions::from_query(query)?;
    let command = if exec {
        command_from_query(query)?
    } else {
        Vec::new()
    };
    Ok(RemoteCommandPlan {
        upgrade,
        options,
        command,
    })
}

/// Port-forward's ports and upgrade, read in the order their errors are answered.
pub fn port_forward_plan(
    headers: &HeaderMap,
    query: &str,
) -> Result<(Vec<u16>, PortForwardUpgrade), crate::UpgradeError> {
    let ports = ports_from_query(query)?;
    let upgrade = PortForwardUpgrade::negotiate(headers, &ports)?;
    Ok((ports, upgrade))
}

/// The routes: (path segments, allowed methods).
fn route(path: &str) -> Option<(Route, &'static [Method])> {
    const GET: &[Method] = &[Method::GET];
    const STREAM: &[Method] = &[Method::GET, Method::POST];
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let pod = |ns: &str, name: &str, uid: Option<&str>| PodRef {
        namespace: ns.to_owned(),
        name: name.to_owned(),
        uid: uid.map(str::to_owned),
    };
    Some(match segments.as_slice() {
        ["healthz"] => (Route::Healthz, GET),
        ["pods"] | ["pods", ""] => (Route::Pods, GET),
        ["runningpods", ..] => (Route::RunningPods, GET),
        ["containerLogs", ns, name, container] => (
            Route::Logs(pod(ns, name, None), (*container).to_owned()),
            GET,
        ),
        ["exec", ns, name, container] => (
            Route::Exec(pod(ns, name, None), (*container).to_owned()),
            STREAM,
        ),
        ["exec", ns, name, uid, container] => (
            Route::Exec(pod(ns, name, Some(uid)), (*container).to_owned()),
            STREAM,
        ),
        ["attach", ns, name, container] => (
            Route::Attach(pod(ns, name, None), (*container).to_owned()),
            STREAM,
        ),
        ["attach", ns, name, uid, container] => (
            Route::Attach(pod(ns, name, Some(uid)), (*container).to_owned()),
            STREAM,
        ),
        ["portForward", ns, name] => (Route::PortForward(pod(ns, name, None)), STREAM),
        ["portForward", ns, name, uid] => (Route::PortForward(pod(ns, name, Some(uid))), STREAM),
        ["stats", "summary"] | ["stats", "summary", ""] => (Route::StatsSummary, GET),
        ["metrics", "resource"] | ["metrics", "resource", ""] => (Route::MetricsResource, GET),
        _ => return None,
    })
}

/// The token of an `Authorization: Bearer <token>` header; the scheme is case-insensitive, as
/// for the kubelet's authenticator (a client sending `bearer` was refused). An empty token is
/// no credential, never sent for review (the API server would answer 400, a 500 here).
pub fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// The bearer token of a request's `Authorization` header, if it carries one.
pub fn request_bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer_token)
}

/// Serves one request (also usable without TLS, e.g. in tests).
pub async fn handle<B: KubeletBackend>(
    ctx: &Context,
    backend: Arc<B>,
    cert: ClientCert,
    req: Request<Incoming>,
) -> Response<Body> {
    let bearer = request_bearer(req.headers()).map(str::to_owned);
    let attrs = attributes(req.method(), req.uri().path());
    if let Err(e) = ctx.auth.check(cert, bearer.as_deref(), &attrs).await {
        let mut r = text(
            StatusCode::from_u16(e.status()).unwrap_or(StatusCode::FORBIDDEN),
            e.to_string(),
        );
        if e == crate::auth::AuthError::TooManyReviews {
            r.headers_mut().insert(
                header::RETRY_AFTER,
                HeaderValue::from(crate::auth::RETRY_AFTER_SECONDS),
            );
        }
        return r;
    }
    let route = match route_request(req.method(), req.uri().path()) {
        Ok(route) => route,
        Err(Unrouted::NotFound) => return text(StatusCode::NOT_FOUND, "404 page not found\n"),
        Err(Unrouted::MethodNotAllowed(methods)) => {
            let mut r = text(StatusCode::METHOD_NOT_ALLOWED, "405: Method Not Allowed\n");
            let allow = methods
                .iter()
                .map(Method::as_str)
                .collect::<Vec<_>>()
                .join(", ");
            if let Ok(v) = HeaderValue::from_str(&allow) {
                r.headers_mut().insert(header::ALLOW, v);
            }
            return r;
        }
    };
    let query = req.uri().query().unwrap_or_default().to_owned();
    // What runs the pods is known to be unreachable: say so (503) before any upgrade.
    if !matches!(route, Route::Healthz | Route::Pods | Route::RunningPods)
        && let Some(e) = backend.unavailable()
    {
        return text(e.status(StatusCode::SERVICE_UNAVAILABLE), e.to_string());
    }
    match route {
        Route::Healthz => text(StatusCode::OK, "ok"),
        Route::Pods | Route::RunningPods => match backend.pods().await {
            Ok(pods) => {
                let pods = if matches!(route, Route::RunningPods) {
                    crate::running::running_pods(&pods)
                } else {
                    pods
                };
                json(
                    &serde_json::json!({"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": pods}),
                )
            }
            Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
        },
        Route::StatsSummary => match backend.stats().await {
            Ok(s) => json(&s),
            Err(e) => text(e.status(StatusCode::INTERNAL_SERVER_ERROR), e.to_string()),
        },
        Route::MetricsResource => match backend.stats().await {
            Ok(s) => {
                let mut r = text(StatusCode::OK, resource_metrics(&s));
                r.headers_mut().insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
                );
                r
            }
            Err(e) => text(e.status(StatusCode::INTERNAL_SERVER_ERROR), e.to_string()),
        },
        Route::Logs(pod, container) => match LogOptions::from_query(Some(&query)) {
            Err(e) => text(StatusCode::BAD_REQUEST, e.to_string()),
            Ok(options) => match backend.logs(pod, container, options).await {
                Ok(stream) => {
                    let body =
                        StreamBody::new(futures::StreamExt::map(log_body(stream), |chunk| {
                            chunk.map(Frame::data)
                        }));
                    let mut r = Response::new(body.boxed_unsync());
                    r.headers_mut()
                        .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
                    r
                }
                Err(e) => text(e.status(StatusCode::NOT_FOUND), e.to_string()),
            },
        },
        Route::Exec(pod, container) => {
            remote_command(ctx, backend, req, &query, pod, container, true)
        }
        Route::Attach(pod, container) => {
            remote_command(ctx, backend, req, &query, pod, container, false)
        }
        Route::PortForward(pod) => port_forward(ctx, backend, req, &query, pod),
    }
}

/// A log stream whose end reaches the socket after its last bytes, never in the same write.
///
/// kube-apiserver wraps a WebSocket around the log it reads from the kubelet (`pods/log` with
/// `Upgrade: websocket`), and drops the bytes of a read that also returns end-of-file. When
/// hyper writes the last chunk and the closing zero-length chunk together, Go's chunked reader
/// returns both in one read, so the WebSocket client got an empty log (Kubernetes' conformance
/// test "Pods should support retrieving logs from the container over websockets"). The kubelet
/// flushes every write; one yield before the end has hyper flush what it holds first.
fn log_body(stream: LogStream) -> impl Stream<Item = std::io::Result<Bytes>> + Send {
    let flushed = futures::stream::once(async {
        tokio::task::yield_now().await;
        None
    });
    futures::StreamExt::filter_map(
        futures::StreamExt::chain(futures::StreamExt::map(stream, Some), flushed),
        std::future::ready,
    )
}

fn empty_101(resp: Response<()>) -> Response<Body> {
    let (parts, ()) = resp.into_parts();
    Response::from_parts(parts, full(Bytes::new()))
}

fn bad_request(e: &crate::UpgradeError) -> Response<Body> {
    let (parts, body) = e.response().into_parts();
    Response::from_parts(parts, full(body))
}

fn remote_command<B: KubeletBackend>(
    ctx: &Context,
    backend: Arc<B>,
    mut req: Request<Incoming>,
    query: &str,
    pod: PodRef,
    container: String,
    exec: bool,
) -> Response<Body> {
    let RemoteCommandPlan {
        upgrade,
        options,
        command,
    } = match remote_command_plan(req.headers(), query, exec) {
        Ok(plan) => plan,
        Err(e) => return bad_request(&e),
    };
    let response = empty_101(upgrade.response());
    let on = hyper::upgrade::on(&mut req);
    let streaming = ctx.streaming.clone();
    tokio::spawn(async move {
        let Ok(upgraded) = on.await else { return };
        let io = TokioIo::new(upgraded);
        let result = if exec {
            remotecommand::serve_exec(
                &upgrade,
                io,
                ExecRequest {
                    pod,
                    container,
                    command,
                    options,
                },
                backend,
                &streaming,
            )
            .await
        } else {
            remotecommand::serve_attach(
                &upgrade,
                io,
                AttachRequest {
                    pod,
                    container,
                    options,
                },
                backend,
                &streaming,
            )
            .await
        };
        if let Err(e) = result {
            tracing::debug!(error = %e, "remote command stream ended with an error");
        }
    });
    response
}

fn port_forward<B: KubeletBackend>(
    ctx: &Context,
    backend: Arc<B>,
    mut req: Request<Incoming>,
    query: &str,
    pod: PodRef,
) -> Response<Body> {
    let (ports, upgrade) = match port_forward_plan(req.headers(), query) {
        Ok(plan) => plan,
        Err(e) => return bad_request(&e),
    };
    let response = empty_101(upgrade.response());
    let on = hyper::upgrade::on(&mut req);
    let streaming = ctx.streaming.clone();
    tokio::spawn(async move {
        let Ok(upgraded) = on.await else { return };
        if let Err(e) = portforward::serve_portforward(
            &upgrade,
            TokioIo::new(upgraded),
            pod,
            ports,
            backend,
            &streaming,
        )
        .await
        {
            tracing::debug!(error = %e, "port-forward stream ended with an error");
        }
    });
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{CertificateParams, DnType, KeyPair};

    fn cert_with(subject: &[(DnType, &str)]) -> CertificateDer<'static> {
        let mut params = CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        for (ty, value) in subject {
            params.distinguished_name.push(ty.clone(), *value);
        }
        let key = KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap().der().clone()
    }

    /// The CN attribute type again, under another rcgen key: rcgen keeps one value per key.
    fn cn() -> DnType {
        DnType::CustomDnType(vec![2, 5, 4, 3])
    }

    #[test]
    fn of_several_cns_the_last_is_the_user_as_for_gos_kubelet() {
        let cert = cert_with(&[
            (DnType::CommonName, "system:node:first"),
            (DnType::OrganizationName, "group-a"),
            (cn(), "kube-apiserver-kubelet-client"),
            (DnType::CustomDnType(vec![2, 5, 4, 10]), "group-b"),
        ]);
        let user = certificate_user(&cert).unwrap();
        assert_eq!(user.name, "kube-apiserver-kubelet-client");
        assert_eq!(user.groups, ["group-a", "group-b"]);
    }

    #[test]
    fn a_certificate_without_a_cn_or_with_an_empty_one_has_no_user() {
        assert_eq!(
            certificate_user(&cert_with(&[(DnType::OrganizationName, "o")])),
            None
        );
        assert_eq!(
            certificate_user(&cert_with(&[(DnType::CommonName, "")])),
            None
        );
        // An empty last CN wins over an earlier one, as in Go.
        assert_eq!(
            certificate_user(&cert_with(&[(DnType::CommonName, "a"), (cn(), "")])),
            None
        );
    }
}
