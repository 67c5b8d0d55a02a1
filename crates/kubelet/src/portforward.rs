//! The kubelet side of port-forward.
//!
//! `portforward.k8s.io` over SPDY: every forwarded connection is a pair of streams, `error` and
//! `data`, carrying `port` and `requestid` headers; they are paired by request id, in either
//! order, and a pair not completed within the creation timeout is reset. Many pairs run at
//! once on one session. The same session can arrive tunnelled in WebSocket binary messages
//! (kubectl 1.31+). The older WebSocket variant instead carries one connection per port on two
//! channels (data `2i`, error `2i+1`), each starting with the port as little-endian u16.

use std::collections::HashMap;
use std::io;
use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::backend::{PodRef, PortForwardRequest, PortForwardStream, StreamBackend};
use crate::config::StreamingConfig;
use crate::error::StreamError;
use crate::spdy::{RstStatus, Session, SpdyStream};
use crate::upgrade::{PortForwardMode, PortForwardUpgrade, WsEncoding};
use crate::websocket::{ChannelMux, WsByteStream};

/// Serves a port-forward on an upgraded connection, as negotiated by `upgrade`. `ports` are the
/// query's ports (used by the WebSocket channel variant only).
pub async fn serve_portforward<B, T>(
    upgrade: &PortForwardUpgrade,
    io: T,
    pod: PodRef,
    ports: Vec<u16>,
    backend: Arc<B>,
    config: &StreamingConfig,
) -> Result<(), StreamError>
where
    B: StreamBackend,
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    match upgrade.mode() {
        PortForwardMode::Spdy => serve_portforward_spdy(io, pod, backend, config).await,
        PortForwardMode::WebSocketTunnel => {
            serve_portforward_tunnel(io, pod, backend, config).await
        }
        PortForwardMode::WebSocketChannels(encoding) => {
            serve_portforward_websocket(io, encoding, pod, ports, backend, config).await
        }
    }
}

/// Serves `portforward.k8s.io` over SPDY until the client closes the connection.
pub async fn serve_portforward_spdy<B, T>(
    io: T,
    pod: PodRef,
    backend: Arc<B>,
    config: &StreamingConfig,
) -> Result<(), StreamError>
where
    B: StreamBackend,
    T: AsyncRead + AsyncWrite + Send + 'static,
{
    let mut session = Session::server(io, config.session.clone())?;
    let mut pairs: HashMap<String, Pending> = HashMap::new();
    let mut forwards = JoinSet::new();
    loop {
        let next_expiry = pairs.values().map(|p| p.deadline).min();
        tokio::select! {
            incoming = session.accept() => {
                let Some(incoming) = incoming else { break };
                let Some(kind) = classify(incoming.headers()) else {
                    incoming.reject(RstStatus::PROTOCOL_ERROR);
                    continue;
                };
                let request_id = request_id(incoming.headers(), incoming.id(), kind.data);
                let Some(stream) = incoming.accept() else { continue };
                let deadline = Instant::now() + config.stream_creation_timeout;
                let pair = pairs.entry(request_id.clone()).or_insert_with(|| Pending {
                    data: None,
                    error: None,
                    port: 0,
                    deadline,
                });
                if let Some(duplicate) = pair.add(kind, stream) {
                    let what = if kind.data { "data" } else { "error" };
                    let msg = format!(
                        "error processing stream for request {request_id}: \
                         {what} stream already assigned"
                    );
                    tracing::debug!(%msg);
                    pair.print_error(&msg).await;
                    duplicate.reset();
                    continue;
                }
                if let Some((data, error, port)) = pair.complete() {
                    pairs.remove(&request_id);
                    let request = PortForwardRequest { pod: pod.clone(), port };
                    forwards.spawn(forward_pair(Arc::clone(&backend), request, data, error));
                }
            }
            () = sleep_until(next_expiry), if next_expiry.is_some() => {
                let now = Instant::now();
                let expired: Vec<String> = pairs
                    .iter()
                    .filter(|(_, p)| p.deadline <= now)
                    .map(|(k, _)| k.clone())
                    .collect();
                for id in expired {
                    if let Some(mut p) = pairs.remove(&id) {
                        let msg = format!("timed out waiting for streams of request {id}");
                        tracing::debug!(%msg);
                        p.print_error(&msg).await;
                        p.reset();
                    }
                }
            }
            Some(_) = forwards.join_next(), if !forwards.is_empty() => {}
        }
    }
    // No new streams (the client closed or said GOAWAY): let running forwards end.
    while forwards.join_next().await.is_some() {}
    session.shutdown(config.close_grace).await;
    Ok(())
}

/// Serves `SPDY/3.1+portforward.k8s.io` / `v2.portforward.k8s.io`: SPDY inside WebSocket
/// binary messages.
pub async fn serve_portforward_tunnel<B, T>(
    io: T,
    pod: PodRef,
    backend: Arc<B>,
    config: &StreamingConfig,
) -> Result<(), StreamError>
where
    B: StreamBackend,
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let ws = crate::websocket::accept(io, config).await;
    serve_portforward_spdy(WsByteStream::new(ws), pod, backend, config).await
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

#[derive(Clone, Copy)]
struct Kind {
    data: bool,
    port: u16,
}

/// Validates the headers a kubelet requires; `None` refuses the stream.
fn classify(headers: &crate::spdy::Headers) -> Option<Kind> {
    let port = headers
        .get("port")?
        .trim()
        .parse::<u16>()
        .ok()
        .filter(|p| *p > 0)?;
    let data = match headers.get("streamtype")? {
        "data" => true,
        "error" => false,
        _ => return None,
    };
    Some(Kind { data, port })
}

/// The pairing key. Clients too old to send `requestID` open error then data back to back, so
/// the kubelet derives one from the stream id; we do the same.
fn request_id(headers: &crate::spdy::Headers, stream_id: u32, data: bool) -> String {
    match headers.get("requestid") {
        Some(id) if !id.is_empty() => id.to_string(),
        _ if data => stream_id.saturating_sub(2).to_string(),
        _ => stream_id.to_string(),
    }
}

struct Pending {
    data: Option<SpdyStream>,
    error: Option<SpdyStream>,
    /// The data stream's port: that is where bytes go, whatever the error stream said.
    port: u16,
    deadline: Instant,
}

impl Pending {
    /// Adds a stream; a second stream of the same type is handed back.
    fn add(&mut self, kind: Kind, stream: SpdyStream) -> Option<SpdyStream> {
        let slot = if kind.data {
            &mut self.data
        } else {
            &mut self.error
        };
        if slot.is_some() {
            return Some(stream);
        }
        *slot = Some(stream);
        if kind.data {
            self.port = kind.port;
        }
        None
    }

    fn complete(&mut self) -> Option<(SpdyStream, SpdyStream, u16)> {
        if self.data.is_some() && self.error.is_some() {
            let (data, error) = self.data.take().zip(self.error.take())?;
            return Some((data, error, self.port));
        }
        None
    }

    async fn print_error(&mut self, msg: &str) {
        if let Some(e) = self.error.as_mut() {
            let _ = e.write_all(msg.as_bytes()).await;
        }
    }

    fn reset(self) {
        if let Some(d) = self.data {
            d.reset();
        }
        if let Some(e) = self.error {
            e.reset();
        }
    }
}

async fn forward_pair<B: StreamBackend>(
    backend: Arc<B>,
    request: PortForwardRequest,
    data: SpdyStream,
    error: SpdyStream,
) {
    let (_, mut error) = error.into_split();
    let (data_in, data_out) = data.into_split();
    forward(&*backend, request, data_in, data_out, &mut error).await;
    // Dropping the halves sends FIN on data and error: the client's cue that this connection
    // is over.
}

/// Connects `request.port` and copies both ways; failures go to `error` as text.
async fn forward<B, R, W, E>(
    backend: &B,
    request: PortForwardRequest,
    from: R,
    to: W,
    error: &mut E,
) where
    B: StreamBackend,
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
    E: AsyncWrite + Unpin,
{
    let port = request.port;
    let pod = request.pod.clone();
    let failure = |e: &dyn std::fmt::Display| {
        format!(
            "error forwarding port {port} to pod {}, uid {}: {e}",
            pod.name,
            pod.uid.as_deref().unwrap_or("")
        )
    };
    let msg = match backend.port_forward(request).await {
        Err(e) => Some(failure(&e)),
        Ok(stream) => match pump(from, to, stream, error).await {
            Ok(()) => None,
            // The client went away; nobody is left to tell.
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => None,
            Err(e) => Some(failure(&e)),
        },
    };
    if let Some(msg) = msg {
        tracing::debug!(%msg);
        let _ = error.write_all(msg.as_bytes()).await;
    }
    let _ = error.shutdown().await;
}

/// Copies client → pod and pod → client. The client's EOF half-closes the pod side; the pod's
/// EOF ends the connection (as the kubelet does). Out-of-band errors go to `error`.
async fn pump<R, W, E>(
    mut from: R,
    mut to: W,
    stream: PortForwardStream,
    error: &mut E,
) -> io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
    E: AsyncWrite + Unpin,
{
    let PortForwardStream { io, error: mut oob } = stream;
    let (mut pod_r, mut pod_w) = tokio::io::split(io);
    let up = async {
        tokio::io::copy(&mut from, &mut pod_w).await?;
        pod_w.shutdown().await
    };
    let down = async {
        tokio::io::copy(&mut pod_r, &mut to).await?;
        to.shutdown().await
    };
    tokio::pin!(up, down);
    let mut up_done = false;
    loop {
        tokio::select! {
            r = &mut down => return r,
            r = &mut up, if !up_done => {
                up_done = true;
                r?;
            }
            msg = async { oob.as_mut()?.await }, if oob.is_some() => {
                oob = None;
                if let Some(msg) = msg {
                    let _ = error.write_all(msg.as_bytes()).await;
                }
            }
        }
    }
}

/// Serves the WebSocket channel port-forward: one connection per port in `ports`.
pub async fn serve_portforward_websocket<B, T>(
    io: T,
    encoding: WsEncoding,
    pod: PodRef,
    ports: Vec<u16>,
    backend: Arc<B>,
    config: &StreamingConfig,
) -> Result<(), StreamError>
where
    B: StreamBackend,
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    // Two channels per port and one byte per channel number: at most 128 ports.
    let ports: Vec<u16> = ports.into_iter().take(128).collect();
    let readable: Vec<u8> = (0..ports.len())
        .filter_map(|i| u8::try_from(i * 2).ok())
        .collect();
    let mut mux = ChannelMux::start(io, encoding, false, &readable, config).await;
    let mut forwards = JoinSet::new();
    for (i, port) in ports.iter().enumerate() {
        let (Ok(data_ch), Ok(error_ch)) = (u8::try_from(i * 2), u8::try_from(i * 2 + 1)) else {
            break;
        };
        let Some(from) = mux.take_reader(data_ch) else {
            continue;
        };
        let mut to = mux.writer(data_ch);
        let mut error = mux.writer(error_ch);
        // Each channel opens with its port, little endian.
        let prefix = port.to_le_bytes();
        if to.write_all(&prefix).await.is_err() || error.write_all(&prefix).await.is_err() {
            break;
        }
        let backend = Arc::clone(&backend);
        let request = PortForwardRequest {
            pod: pod.clone(),
            port: *port,
        };
        forwards.spawn(async move {
            forward(&*backend, request, from, to, &mut error).await;
        });
    }
    let gone = mux.closed_token();
    tokio::select! {
        () = async { while forwards.join_next().await.is_some() {} } => {}
        () = gone.cancelled() => forwards.abort_all(),
    }
    mux.finish(config.close_grace).await;
    Ok(())
}
