//! The HTTP transport under every client: HTTP/2 to the API server where it offers it, as
//! client-go does, and HTTP/1.1 for the requests that upgrade the connection.
//!
//! kube's own builder (`ClientBuilder::try_from(Config)`) speaks HTTP/1.1 only, so every request
//! in flight holds a TCP connection and a TLS session of its own. A virtual node with its
//! watches and a burst of pod writes kept about 150 of them open, each with its buffers, on both
//! sides. Over HTTP/2 a client keeps one connection per API server and multiplexes its requests
//! and watches as streams on it.
//!
//! A server limits the streams of one connection (kube-apiserver to 100 unless told otherwise),
//! and hyper's client waits for a free stream rather than open another connection, so requests
//! would queue behind long watches (a virtual node watches each ConfigMap and Secret its pods
//! mount). Requests therefore go on lanes of at most [`MAX_STREAMS_PER_CONNECTION`] streams
//! each, a new connection per lane, as Go's client opens one when a connection is full.
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

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use http::Request;
use hyper_rustls::{FixedServerNameResolver, HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use kube::Config;
use kube::client::{Body, ClientBuilder, ConfigExt as _};
use tower::{BoxError, Service, ServiceBuilder, ServiceExt as _};

use crate::client_error::ClientError;

/// The stack [`client_builder`] starts from: kube's, on HTTP/2.
pub type KubeStack = tower::util::BoxService<
    Request<kube::client::Body>,
    http::Response<Box<kube::client::DynBody>>,
    Box<dyn std::error::Error + Send + Sync>,
>;

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

/// Requests and watches at most in flight on one HTTP/2 connection. Servers limit the streams of
/// a connection (kube-apiserver and Go's default 100 to 250, hyper's 200), and hyper's client
/// waits for a free stream instead of opening another connection: a virtual node watching one
/// object per ConfigMap its pods mount would stop every other request behind its watches. Past
/// this many a new connection is opened, as Go's client does.
pub const MAX_STREAMS_PER_CONNECTION: usize = 100;

/// Sends a request on an HTTP/2-capable lane with a free stream, or on the HTTP/1.1 pool when
/// it asks to upgrade the connection.
#[derive(Clone)]
#[allow(missing_debug_implementations)] // hyper pools: nothing to show
pub struct Transport {
    lanes: Arc<Lanes>,
    upgrades: Pool,
}

/// Pools of one connection each (with HTTP/2; with HTTP/1.1 each pool opens what it needs),
/// with the requests each has in flight, responses' bodies included (a watch holds its stream
/// until its body ends).
struct Lanes {
    builder: hyper_util::client::legacy::Builder,
    connector: HttpsConnector<HttpConnector>,
    lanes: Mutex<Vec<Lane>>,
}

#[derive(Clone)]
struct Lane {
    pool: Pool,
    open: Arc<AtomicUsize>,
    /// Whether the lane's connection is up: until then one request at a time goes out.
    connected: Arc<Connected>,
}

/// Whether a lane has its connection, and the gate its first requests pass one at a time.
///
/// hyper's pool learns that a connection speaks HTTP/2 only once TLS negotiated it, so every
/// request that finds no connection opens one: a burst on a new lane (the node's start, with
/// its watches and first writes, or the return of an API server) opened a connection per
/// request, dozens towards one server, where one carries them all. So until a request on the
/// lane got its answer's head, the others wait for it; a failed connection lets the next one
/// try.
#[derive(Debug, Default)]
struct Connected {
    up: std::sync::atomic::AtomicBool,
    gate: tokio::sync::Mutex<()>,
}

impl Connected {
    /// Sends `request` on `pool`: at once when the lane is connected, else after the requests
    /// before it, alone.
    async fn send(&self, pool: Pool, request: Request<Body>) -> Sent {
        if self.up.load(Ordering::Acquire) {
            return pool.request(request).await;
        }
        let alone = self.gate.lock().await;
        let sent = pool.request(request);
        if self.up.load(Ordering::Acquire) {
            drop(alone);
            return sent.await;
        }
        let answer = sent.await;
        // Any answer, errors of the server included, means a connection: only a failure to
        // connect leaves the lane to the next request alone.
        let connected = match &answer {
            Ok(_) => true,
            Err(e) => !e.is_connect(),
        };
        self.up.store(connected, Ordering::Release);
        answer
    }
}

/// An answer of a lane, before its body is counted.
type Sent = Result<http::Response<hyper::body::Incoming>, hyper_util::client::legacy::Error>;

impl Lanes {
    /// A lane with a free stream, a new one when all are full; the stream is counted as taken.
    fn take(&self) -> (Pool, Open, Arc<Connected>) {
        let mut lanes = self.lanes.lock().unwrap_or_else(PoisonError::into_inner);
        let lane = match lanes
            .iter()
            .find(|l| l.open.load(Ordering::Relaxed) < MAX_STREAMS_PER_CONNECTION)
        {
            Some(lane) => lane.clone(),
            None => {
                let lane = Lane {
                    pool: self.builder.build(self.connector.clone()),
                    open: Arc::default(),
                    connected: Arc::default(),
                };
                lanes.push(lane.clone());
                lane
            }
        };
        lane.open.fetch_add(1, Ordering::Relaxed);
        (lane.pool, Open(Some(lane.open)), lane.connected)
    }
}

/// A stream counted on its lane until dropped.
#[derive(Debug)]
struct Open(Option<Arc<AtomicUsize>>);

impl Drop for Open {
    fn drop(&mut self) {
        if let Some(open) = &self.0 {
            open.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// A response body that keeps its stream counted until it ends or is dropped.
#[derive(Debug)]
pub struct Counted {
    body: hyper::body::Incoming,
    open: Open,
}

impl hyper::body::Body for Counted {
    type Data = bytes::Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        if let Poll::Ready(None | Some(Err(_))) = &polled {
            // The stream is closed: its place is free before the body is dropped.
            if let Some(open) = self.open.0.take() {
                open.fetch_sub(1, Ordering::Relaxed);
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

impl Transport {
    /// The lanes and the upgrade pool for `config`'s server, TLS material and timeouts.
    /// HTTP/2 is not offered when the environment sets `DISABLE_HTTP2`, as client-go does.
    pub fn new(config: &Config, cluster: &'static str) -> Result<Self, ClientError> {
        let http2 = std::env::var_os("DISABLE_HTTP2").is_none_or(|v| v.is_empty());
        let build = |http2: bool| -> Result<_, ClientError> {
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
            Ok((pool, connector))
        };
        let (builder, connector) = build(http2)?;
        let (upgrades, upgrade_connector) = build(false)?;
        Ok(Self {
            lanes: Arc::new(Lanes {
                builder,
                connector,
                lanes: Mutex::default(),
            }),
            upgrades: upgrades.build(upgrade_connector),
        })
    }
}

/// Whether `request` asks to upgrade its connection (a WebSocket for exec, attach, port-forward).
fn upgrades<B>(request: &Request<B>) -> bool {
    request.headers().contains_key(http::header::UPGRADE)
}

type Answer = Result<http::Response<Counted>, hyper_util::client::legacy::Error>;

impl Service<Request<Body>> for Transport {
    type Response = http::Response<Counted>;
    type Error = hyper_util::client::legacy::Error;
    type Future = Pin<Box<dyn Future<Output = Answer> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // hyper's pools take every request at once (they queue for a connection themselves).
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        if upgrades(&request) {
            let sent = self.upgrades.request(request);
            return Box::pin(async move {
                let response = sent.await?;
                Ok(response.map(|body| Counted {
                    body,
                    open: Open(None),
                }))
            });
        }
        let (pool, open, connected) = self.lanes.take();
        Box::pin(async move {
            let response = connected.send(pool, request).await?;
            Ok(response.map(|body| Counted { body, open }))
        })
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
        .map_response(|response: http::Response<Counted>| {
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
