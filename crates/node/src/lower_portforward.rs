//! Port-forward to a lower pod over SPDY (`portforward.k8s.io`), as kubectl does without
//! WebSockets; every API server serves it.
//!
//! Not kube-rs' `Api::portforward`: its WebSocket channel protocol cannot half-close a
//! connection, and kube-rs ends the whole port as soon as the client stops sending, so a pod's
//! reply to `echo hello | nc -q1 localhost PORT` was dropped. On SPDY the data stream is
//! half-closed with FIN, which the lower kubelet passes on to the pod as the end of its input,
//! while the reply keeps flowing back until the pod's side ends.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use http_body_util::BodyExt as _;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Status;
use tensile_kubelet::spdy::{
    Headers, OpenError, Session, SessionConfig, SpdyRecvStream, SpdySendStream,
};
use tensile_kubelet::{ErrorFuture, PortForwardStream};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, ReadBuf};

/// How long a forwarded port's connection to the lower cluster may linger after the kubelet side
/// dropped it (it normally closes at once) before it is cut.
const GRACE: Duration = Duration::from_secs(30);

/// How long the lower side may take to accept the streams of a forwarded port (kubectl waits
/// 30 s too).
const STREAM_TIMEOUT: Duration = Duration::from_secs(30);

/// The SPDY port-forward protocol, and the header that negotiates it.
const PROTOCOL: &str = "portforward.k8s.io";
const PROTOCOL_HEADER: &str = "x-stream-protocol-version";

/// The most of an error response or error stream read from the lower cluster.
const MAX_ERROR_TEXT: usize = 64 * 1024;

/// Why a port could not be forwarded.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PortForwardError {
    /// The request did not reach the lower API server, or it answered with an error.
    #[error(transparent)]
    Api(#[from] kube::Error),
    /// The lower API server refused the upgrade.
    #[error("{0}")]
    Refused(String),
    /// The upgraded connection failed.
    #[error("{context}: {source}")]
    Connection {
        context: &'static str,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The lower side did not accept the port's streams.
    #[error("opening the port's streams: {0}")]
    Streams(#[from] OpenError),
    #[error("timed out waiting for the lower side to accept the port's streams")]
    Timeout,
}

/// Forwards `port` of pod `namespace/name` through the lower API server `client`. The names
/// must have been checked to be object names: they go into the URL path.
pub(crate) async fn forward(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    port: u16,
) -> Result<PortForwardStream, PortForwardError> {
    let session = upgrade(client, namespace, name).await?;
    // One connection per forwarded connection, so one request id; the error stream first and
    // closed for writing, as kubectl does.
    let headers = |kind: &str| {
        Headers::new()
            .with("streamType", kind)
            .with("port", port.to_string())
            .with("requestID", "0")
    };
    let streams = async {
        let error = session.open(headers("error")).await?;
        let data = session.open(headers("data")).await?;
        Ok::<_, OpenError>((error, data))
    };
    let (error, data) = tokio::time::timeout(STREAM_TIMEOUT, streams)
        .await
        .map_err(|_| PortForwardError::Timeout)??;
    let (error, error_send) = error.into_split();
    drop(error_send);
    let (recv, send) = data.into_split();
    Ok(PortForwardStream {
        io: Box::new(ForwardedPort {
            recv,
            send,
            session: Some(session),
        }),
        error: Some(Box::pin(error_text(error)) as ErrorFuture),
    })
}

/// Upgrades a `pods/portforward` request to SPDY.
async fn upgrade(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> Result<Session, PortForwardError> {
    let connection = |context, source: Box<dyn std::error::Error + Send + Sync>| {
        PortForwardError::Connection { context, source }
    };
    let uri = format!("/api/v1/namespaces/{namespace}/pods/{name}/portforward");
    let request = http::Request::post(uri)
        .header(http::header::CONNECTION, "Upgrade")
        .header(http::header::UPGRADE, "SPDY/3.1")
        .header(PROTOCOL_HEADER, PROTOCOL)
        .body(kube::client::Body::empty())
        .map_err(|e| connection("building the request", e.into()))?;
    let response = client.send(request).await?;
    if response.status() != http::StatusCode::SWITCHING_PROTOCOLS {
        return Err(PortForwardError::Refused(refusal_text(response).await));
    }
    // An old server may not name the protocol (kubectl accepts that too); another one is wrong.
    let protocol = response
        .headers()
        .get(PROTOCOL_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or(PROTOCOL);
    if protocol != PROTOCOL {
        return Err(PortForwardError::Refused(format!(
            "the server chose protocol {protocol:?}"
        )));
    }
    let upgraded = hyper::upgrade::on(response)
        .await
        .map_err(|e| connection("upgrading the connection", e.into()))?;
    Session::client(
        hyper_util::rt::TokioIo::new(upgraded),
        SessionConfig::default(),
    )
    .map_err(|e| connection("starting SPDY", e.into()))
}

/// What an API server said when it refused an upgrade: the `Status` message when there is one.
async fn refusal_text(response: http::Response<kube::client::Body>) -> String {
    let status = response.status();
    let body = http_body_util::Limited::new(response.into_body(), MAX_ERROR_TEXT)
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    match serde_json::from_slice::<Status>(&body)
        .ok()
        .and_then(|s| s.message)
        .filter(|m| !m.is_empty())
    {
        Some(message) => format!("{message} ({})", status.as_u16()),
        None => {
            let text: String = String::from_utf8_lossy(&body)
                .trim()
                .chars()
                .take(512)
                .collect();
            format!("{status}: {text}")
        }
    }
}

/// What the lower kubelet writes on a port's error stream: nothing when all went well.
async fn error_text(error: SpdyRecvStream) -> Option<String> {
    let mut text = Vec::new();
    let limit = u64::try_from(MAX_ERROR_TEXT).unwrap_or(u64::MAX);
    // A reset or broken error stream says nothing more than the data stream will.
    let _ = error.take(limit).read_to_end(&mut text).await;
    (!text.is_empty()).then(|| String::from_utf8_lossy(&text).into_owned())
}

/// The kubelet side's end of one forwarded connection: the data stream. Shutting down its write
/// side half-closes the stream (FIN); reading goes on until the pod's side ends.
struct ForwardedPort {
    recv: SpdyRecvStream,
    send: SpdySendStream,
    session: Option<Session>,
}

impl Drop for ForwardedPort {
    fn drop(&mut self) {
        let Some(session) = self.session.take() else {
            return;
        };
        // The data stream ends when its halves drop (right after this); the connection then
        // closes gracefully, or is cut after a grace period if the lower side never answers.
        // Without a runtime, dropping the session aborts it.
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(session.shutdown(GRACE));
        }
    }
}

impl AsyncRead for ForwardedPort {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().recv).poll_read(cx, buf)
    }
}

impl AsyncWrite for ForwardedPort {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().send).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().send).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().send).poll_shutdown(cx)
    }
}
