//! The HTTP transport under every client: HTTP/2 to the API server where it offers it, as
//! client-go does, and HTTP/1.1 for the requests that upgrade the connection.
//!
//! kube's own builder (`ClientBuilder::try_from(Config)`) speaks HTTP/1.1 only, so every request
//! in flight holds a TCP connection and a TLS session of its own. A virtual node with its
//! watches and a burst of pod writes kept about 150 of them open, each with its buffers, on both
//! sides. Over HTTP/2 a client keeps one connection per API server and multiplexes its requests
//! and watches as streams on it.
//!
//! Exec, attach and port-forward upgrade an HTTP/1.1 connection to a WebSocket, which HTTP/2 has
//! no `Upgrade` for, so [`Transport`] sends requests that carry an `Upgrade` header on a second,
//! HTTP/1.1-only pool of the same configuration.
//!
//! The rest of kube's stack is kept as kube builds it: the base URI, the credential (tokens,
//! exec plugins, refresh) and the configured extra headers. Not kept: kube's tracing layer,
//! which logs every 5xx at ERROR (our clients count error answers and the callers report them
//! with context), and its read/write timeouts, which kube leaves off for reads by default; a dead
//! HTTP/2 connection is found by keep-alive pings instead, as client-go's `ReadIdleTimeout` does.

use std::task::{Context, Poll};
use std::time::Duration;

use http::Request;
use hyper_rustls::{FixedServerNameResolver, HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::{Client as HyperClient, ResponseFuture};
use hyper_util::rt::{TokioExecutor, TokioTimer};
use kube::Config;
use kube::client::{Body, ClientBuilder, ConfigExt as _};
use tower::{BoxError, Service, ServiceBuilder, ServiceExt as _};

use crate::clients::{ClientError, KubeStack};

/// How often an idle HTTP/2 connection is pinged (client-go's `ReadIdleTimeout`).
const H2_PING_INTERVAL: Duration = Duration::from_secs(30);
/// How long a ping may go unanswered before the connection is closed (client-go's
/// `PingTimeout`); its requests and watches fail and are retried on a new one.
const H2_PING_TIMEOUT: Duration = Duration::from_secs(15);
/// How much of one stream's answer the server may send before we read it (client-go's 4 MiB):
/// a large LIST arrives without waiting for window updates.
const H2_STREAM_WINDOW: u32 = 4 << 20;
/// How much of all streams' answers may be unread at once (client-go: 1 GiB). HTTP/2's default,
/// 64 KiB, is shared by every stream of the connection: one watch whose events wait for their
/// consumer would stop every other request and watch on it. Each stream stays bounded by
/// [`H2_STREAM_WINDOW`].
const H2_CONNECTION_WINDOW: u32 = 1 << 30;
/// TCP keep-alive of every connection (client-go's dialer).
const TCP_KEEPALIVE: Duration = Duration::from_secs(30);
/// Idle HTTP/1.1 connections (upgrades end theirs) are closed after this long.
const POOL_IDLE: Duration = Duration::from_secs(90);

type Pool = HyperClient<HttpsConnector<HttpConnector>, Body>;

/// Sends a request on the HTTP/2-capable pool, or on the HTTP/1.1 pool when it asks to upgrade
/// the connection.
#[derive(Clone)]
#[allow(missing_debug_implementations)] // hyper pools: nothing to show
pub struct Transport {
    multiplexed: Pool,
    upgrades: Pool,
}

impl Transport {
    /// The two pools for `config`'s server, TLS material and timeouts. HTTP/2 is not offered
    /// when the environment sets `DISABLE_HTTP2`, as client-go does.
    pub fn new(config: &Config, cluster: &'static str) -> Result<Self, ClientError> {
        let http2 = std::env::var_os("DISABLE_HTTP2").is_none_or(|v| v.is_empty());
        let build = |http2: bool| -> Result<Pool, ClientError> {
            let tls = config
                .rustls_client_config()
                .map_err(|source| ClientError::Build { cluster, source })?;
            let builder = HttpsConnectorBuilder::new()
                .with_tls_config(tls)
                .https_or_http();
            let builder = match &config.tls_server_name {
                Some(name) => builder.with_server_name_resolver(FixedServerNameResolver::new(
                    name.clone()
                        .try_into()
                        .map_err(|_| ClientError::InvalidServerName {
                            cluster,
                            name: name.clone(),
                        })?,
                )),
                None => builder,
            };
            let mut http = HttpConnector::new();
            http.enforce_http(false);
            http.set_nodelay(true);
            http.set_keepalive(Some(TCP_KEEPALIVE));
            http.set_connect_timeout(config.connect_timeout);
            let mut pool = HyperClient::builder(TokioExecutor::new());
            pool.timer(TokioTimer::new())
                .pool_timer(TokioTimer::new())
                .pool_idle_timeout(POOL_IDLE);
            let connector = if http2 {
                pool.http2_keep_alive_interval(H2_PING_INTERVAL)
                    .http2_keep_alive_timeout(H2_PING_TIMEOUT)
                    .http2_keep_alive_while_idle(true)
                    .http2_initial_stream_window_size(H2_STREAM_WINDOW)
                    .http2_initial_connection_window_size(H2_CONNECTION_WINDOW);
                builder.enable_http1().enable_http2().wrap_connector(http)
            } else {
                builder.enable_http1().wrap_connector(http)
            };
            Ok(pool.build(connector))
        };
        Ok(Self {
            multiplexed: build(http2)?,
            upgrades: build(false)?,
        })
    }
}

/// Whether `request` asks to upgrade its connection (a WebSocket for exec, attach, port-forward).
fn upgrades<B>(request: &Request<B>) -> bool {
    request.headers().contains_key(http::header::UPGRADE)
}

impl Service<Request<Body>> for Transport {
    type Response = http::Response<hyper::body::Incoming>;
    type Error = hyper_util::client::legacy::Error;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // hyper's pool takes every request at once (it queues for a connection itself).
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        if upgrades(&request) {
            self.upgrades.request(request)
        } else {
            self.multiplexed.request(request)
        }
    }
}

/// kube's client builder for `config` on a [`Transport`]: what `ClientBuilder::try_from` builds,
/// with HTTP/2 and without its tracing layer.
pub fn client_builder(
    config: &Config,
    cluster: &'static str,
) -> Result<ClientBuilder<KubeStack>, ClientError> {
    if let Some(proxy) = &config.proxy_url {
        // kube refuses a proxy without its proxy features too; say so before any request.
        return Err(ClientError::Proxy {
            cluster,
            url: proxy.to_string(),
        });
    }
    let build = |source| ClientError::Build { cluster, source };
    let transport = Transport::new(config, cluster)?;
    let stack = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer().map_err(build)?)
        .layer(config.extra_headers_layer().map_err(build)?)
        .map_err(BoxError::from)
        .service(transport)
        .map_response(|response: http::Response<hyper::body::Incoming>| {
            response.map(|body| {
                Box::new(http_body_util::BodyExt::map_err(body, BoxError::from))
                    as Box<kube::client::DynBody>
            })
        });
    Ok(ClientBuilder::new(
        tower::util::BoxService::new(stack),
        config.default_namespace.clone(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_requests_that_ask_for_an_upgrade_leave_the_multiplexed_pool() {
        let plain = Request::get("/api/v1/pods?watch=true").body(()).unwrap();
        let exec = Request::get("/api/v1/namespaces/a/pods/p/exec")
            .header(http::header::CONNECTION, "Upgrade")
            .header(http::header::UPGRADE, "websocket")
            .body(())
            .unwrap();
        assert!(!upgrades(&plain));
        assert!(upgrades(&exec));
    }
}
