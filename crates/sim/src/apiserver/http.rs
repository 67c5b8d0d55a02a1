//! Connections: TLS, HTTP/1.1 with upgrades, authentication, authorization (RBAC), and dispatch
//! by route.

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response, StatusCode, header};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use super::errors::ApiError;
use super::rbac::{self, Action, Denial};
use super::request::{Route, route};
use super::{State, UserInfo, discovery, openapi, rest};

/// Response bodies: whole JSON documents or streams (watches, logs, proxied upgrades).
pub type Body = UnsyncBoxBody<Bytes, std::io::Error>;

/// A whole body.
pub fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into())
        .map_err(|never: Infallible| match never {})
        .boxed_unsync()
}

/// A JSON response.
pub fn json_response(code: u16, bytes: impl Into<Bytes>) -> Response<Body> {
    let mut resp = Response::new(full(bytes));
    *resp.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::OK);
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    resp
}

/// A JSON response of a value.
pub fn value_response(code: u16, value: &serde_json::Value) -> Response<Body> {
    json_response(code, serde_json::to_vec(value).unwrap_or_default())
}

/// The Status response of an error.
pub fn error_response(err: &ApiError) -> Response<Body> {
    value_response(err.code, &err.to_status())
}

pub(super) async fn serve(
    listener: TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    state: Arc<State>,
    stop: CancellationToken,
) {
    let acceptor = tls.map(TlsAcceptor::from);
    let mut errors = tensile_runtime::tls::AcceptErrors::new("sim api server");
    loop {
        // Backs off after accept errors (out of file descriptors) rather than spinning.
        let (tcp, _peer) = tokio::select! {
            () = stop.cancelled() => return,
            accepted = tensile_runtime::tls::accept_backing_off(&listener, &mut errors) => accepted,
        };
        let _ = tcp.set_nodelay(true);
        let state = state.clone();
        let acceptor = acceptor.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            match acceptor {
                Some(acceptor) => {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let identity = tls
                        .get_ref()
                        .1
                        .peer_certificates()
                        .and_then(|c| c.first())
                        // As a real API server reads it (of several CNs the last), the
                        // same rule as the kubelet's.
                        .and_then(tensile_kubelet::server::certificate_user)
                        .map(|u| user(u.name, u.groups));
                    connection(tls, state, identity, stop).await;
                }
                None => connection(tcp, state, None, stop).await,
            }
        });
    }
}

fn user(username: String, mut groups: Vec<String>) -> UserInfo {
    groups.push("system:authenticated".into());
    UserInfo {
        username,
        uid: String::new(),
        groups,
    }
}

async fn connection<IO>(
    io: IO,
    state: Arc<State>,
    identity: Option<UserInfo>,
    stop: CancellationToken,
) where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = service_fn(move |req| {
        let state = state.clone();
        let identity = identity.clone();
        async move { Ok::<_, Infallible>(handle(state, req, identity).await) }
    });
    let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    let conn = builder.serve_connection_with_upgrades(TokioIo::new(io), service);
    tokio::select! {
        _ = conn => {}
        () = stop.cancelled() => {}
    }
}

async fn handle(
    state: Arc<State>,
    req: Request<Incoming>,
    identity: Option<UserInfo>,
) -> Response<Body> {
    let user = identity.or_else(|| {
        let auth = req.headers().get(header::AUTHORIZATION)?.to_str().ok()?;
        let token = auth.strip_prefix("Bearer ")?.trim();
        state.user_for_token(token)
    });
    let Some(user) = user else {
        return error_response(&ApiError::unauthorized());
    };
    if !state.available() {
        return error_response(&ApiError::service_unavailable(
            "the server is currently unable to handle the request",
        ));
    }
    if let Some(refused) = authorize(&state, &req, &user) {
        return refused;
    }
    let path = req.uri().path().to_owned();
    match route(&path) {
        Route::Version => value_response(200, &discovery::version(&state)),
        Route::Health => {
            let mut r = Response::new(full("ok"));
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                header::HeaderValue::from_static("text/plain"),
            );
            r
        }
        Route::CoreVersions => discovery::core_versions(&state, req.headers()),
        Route::Groups => discovery::groups(req.headers()),
        Route::Group(group) => discovery::group(&group),
        Route::ResourceList { group, version } => discovery::resource_list(&group, &version),
        Route::OpenApi(path) => openapi::openapi(&path, req.headers()),
        Route::Resource(r) => rest::dispatch(state, req, r, user).await,
        Route::NotFound => error_response(&ApiError::no_route()),
    }
}

/// Authorizes a request before anything else looks at it, as the real server's filter chain
/// does (so a refused request gets 403 whether or not what it names exists). `system:masters`
/// passes without a policy lookup. A refusal is recorded and answered with the real Status.
fn authorize(state: &State, req: &Request<Incoming>, user: &UserInfo) -> Option<Response<Body>> {
    if rbac::is_privileged(&user.groups) {
        return None;
    }
    let path = req.uri().path();
    let action = rbac::request_attributes(req.method().as_str(), path, req.uri().query());
    let decision = state.authorize(user, &action);
    if decision.allowed {
        return None;
    }
    let mut why = rbac::forbidden_message(&user.username, &action);
    if !decision.reason.is_empty() {
        why = format!("{why}: {}", decision.reason);
    }
    let err = match &action {
        Action::Resource(r) => ApiError::forbidden_request(&r.group, &r.resource, &r.name, &why),
        Action::NonResource { .. } => ApiError::forbidden_request("", "", "", &why),
    };
    state.record_denial(Denial::new(
        &user.username,
        &user.groups,
        &action,
        path,
        &decision.reason,
    ));
    Some(error_response(&err))
}
