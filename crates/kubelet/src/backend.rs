//! What the streaming endpoints need from whoever runs the containers.
//!
//! The shapes are small and stream-shaped on purpose: the kubelet side handles SPDY and
//! WebSockets, channels, status encoding and timeouts; a backend only moves bytes. The full
//! `KubeletBackend` (logs, stats, pods) extends [`StreamBackend`].
//!
//! The trait uses `impl Future + Send` return types rather than boxed futures: implementations
//! write plain `async fn`s, the server is generic over the backend (held in an `Arc`), and
//! nothing is allocated per call. The price is that it is not object-safe; a caller that needs
//! `dyn` can wrap one in a generic adapter.

use std::fmt;
use std::future::Future;
use std::pin::Pin;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Status, StatusCause, StatusDetails};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;

/// The pod a request is for. `uid`, when given (the `/exec/{ns}/{pod}/{uid}/{container}`
/// routes), must match the pod's UID; the backend checks it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodRef {
    /// Namespace.
    pub namespace: String,
    /// Pod name.
    pub name: String,
    /// Expected pod UID.
    pub uid: Option<String>,
}

/// Which standard streams a remote command wants. Build it with [`StreamOptions::new`], which
/// rejects the combinations the kubelet answers with 400.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StreamOptions {
    /// The client sends stdin.
    pub stdin: bool,
    /// The client wants stdout.
    pub stdout: bool,
    /// The client wants stderr (never together with `tty`).
    pub stderr: bool,
    /// Allocate a terminal; stderr is merged into stdout.
    pub tty: bool,
}

/// A command to run in a container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecRequest {
    /// The pod.
    pub pod: PodRef,
    /// The container.
    pub container: String,
    /// argv; never empty.
    pub command: Vec<String>,
    /// Streams and terminal.
    pub options: StreamOptions,
}

/// Attach to a container's main process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttachRequest {
    /// The pod.
    pub pod: PodRef,
    /// The container.
    pub container: String,
    /// Streams and terminal.
    pub options: StreamOptions,
}

/// One forwarded connection to a port of a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortForwardRequest {
    /// The pod.
    pub pod: PodRef,
    /// The port in the pod's network namespace.
    pub port: u16,
}

/// A terminal size, in characters, as the clients send it (`{"Width":80,"Height":24}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TerminalSize {
    /// Columns.
    #[serde(rename = "Width")]
    pub width: u16,
    /// Rows.
    #[serde(rename = "Height")]
    pub height: u16,
}

/// A readable stream handed to a backend.
pub type BoxReader = Box<dyn AsyncRead + Send + Unpin>;
/// A writable stream handed to a backend. `shutdown` (or dropping it) ends the client's stream.
pub type BoxWriter = Box<dyn AsyncWrite + Send + Unpin>;

/// Both directions of a forwarded connection.
pub trait AsyncDuplex: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> AsyncDuplex for T {}

/// The streams of one exec or attach. Each is present exactly when the client asked for it.
///
/// The backend must be done with them when its future completes: the final status is written
/// right after, and anything written later is lost.
pub struct ExecIo {
    /// The client's stdin; EOF when the client closes it.
    pub stdin: Option<BoxReader>,
    /// To the client's stdout.
    pub stdout: Option<BoxWriter>,
    /// To the client's stderr.
    pub stderr: Option<BoxWriter>,
    /// A terminal was requested.
    pub tty: bool,
    /// Terminal size changes, with `tty` (SPDY from protocol v3 on, every WebSocket version).
    pub resize: Option<mpsc::Receiver<TerminalSize>>,
}

impl fmt::Debug for ExecIo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExecIo")
            .field("stdin", &self.stdin.is_some())
            .field("stdout", &self.stdout.is_some())
            .field("stderr", &self.stderr.is_some())
            .field("tty", &self.tty)
            .field("resize", &self.resize.is_some())
            .finish()
    }
}

/// How a command ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExitStatus {
    /// Exit code 0.
    Success,
    /// A non-zero exit code.
    ExitCode(i32),
    /// The command could not be run (or attached to); the message reaches the user.
    Error(String),
}

impl ExitStatus {
    /// The `metav1.Status` the kubelet writes on the error stream (protocol v4 and later).
    pub fn to_status(&self) -> Status {
        match self {
            Self::Success => Status {
                status: Some("Success".into()),
                ..Status::default()
            },
            Self::ExitCode(code) => Status {
                status: Some("Failure".into()),
                reason: Some("NonZeroExitCode".into()),
                message: Some(format!(
                    "command terminated with non-zero exit code: exit status {code}"
                )),
                details: Some(StatusDetails {
                    causes: Some(vec![StatusCause {
                        reason: Some("ExitCode".into()),
                        message: Some(code.to_string()),
                        field: None,
                    }]),
                    ..StatusDetails::default()
                }),
                ..Status::default()
            },
            Self::Error(message) => Status {
                status: Some("Failure".into()),
                code: Some(500),
                reason: Some("InternalError".into()),
                message: Some(format!(
                    "Internal error occurred: error executing command in container: {message}"
                )),
                details: Some(StatusDetails {
                    causes: Some(vec![StatusCause {
                        message: Some(format!("error executing command in container: {message}")),
                        field: None,
                        reason: None,
                    }]),
                    ..StatusDetails::default()
                }),
                ..Status::default()
            },
        }
    }

    /// Reads a final status back, e.g. the one kube-rs' `AttachedProcess::take_status` returns
    /// from a lower cluster, so a backend can pass it through.
    pub fn from_status(status: &Status) -> Self {
        if status.status.as_deref() == Some("Success") {
            return Self::Success;
        }
        if status.reason.as_deref() == Some("NonZeroExitCode") {
            let code = status
                .details
                .as_ref()
                .and_then(|d| d.causes.as_ref())
                .and_then(|c| c.iter().find(|c| c.reason.as_deref() == Some("ExitCode")))
                .and_then(|c| c.message.as_deref())
                .and_then(|m| m.parse::<i32>().ok());
            if let Some(code) = code {
                return Self::ExitCode(code);
            }
        }
        Self::Error(
            status
                .message
                .clone()
                .unwrap_or_else(|| "unknown error".into()),
        )
    }

    /// The plain-text error of protocols v1 to v3 (nothing on success).
    pub fn to_text(&self) -> Option<String> {
        match self {
            Self::Success => None,
            other => other.to_status().message,
        }
    }
}

/// A backend failure, shown to the user: its message, and what kind of failure it is (see
/// [`BackendError::unavailable`] and [`BackendError::bad_request`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BackendError(pub String, FailureKind);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FailureKind {
    /// Answered with the route's own status.
    Route,
    Unavailable,
    BadRequest,
}

impl BackendError {
    /// Wraps any error's message.
    pub fn new(message: impl fmt::Display) -> Self {
        Self(message.to_string(), FailureKind::Route)
    }

    /// What runs the containers cannot be reached now (answered with 503 Service Unavailable,
    /// so the client knows to retry rather than that the pod is gone).
    pub fn unavailable(message: impl fmt::Display) -> Self {
        Self(message.to_string(), FailureKind::Unavailable)
    }

    /// The pod and container exist but the request cannot be served, such as the log of a
    /// previous instance that never was: 400, as the kubelet answers. (The API server passes
    /// a 400's message on to the client; a 404's it replaces with its own.)
    pub fn bad_request(message: impl fmt::Display) -> Self {
        Self(message.to_string(), FailureKind::BadRequest)
    }

    /// Made with [`Self::unavailable`].
    pub fn is_unavailable(&self) -> bool {
        self.1 == FailureKind::Unavailable
    }

    /// The HTTP status to answer with: 503 when unavailable, 400 for a bad request, else
    /// `otherwise` (the route's).
    pub fn status(&self, otherwise: http::StatusCode) -> http::StatusCode {
        match self.1 {
            FailureKind::Unavailable => http::StatusCode::SERVICE_UNAVAILABLE,
            FailureKind::BadRequest => http::StatusCode::BAD_REQUEST,
            FailureKind::Route => otherwise,
        }
    }
}

/// A future that may deliver an error message while a forwarded connection runs.
pub type ErrorFuture = Pin<Box<dyn Future<Output = Option<String>> + Send>>;

/// A forwarded connection as the backend provides it.
pub struct PortForwardStream {
    /// Bytes to and from the port. Shutting down its write side tells the pod side the client
    /// finished sending; its EOF ends the forwarded connection.
    pub io: Box<dyn AsyncDuplex>,
    /// Errors reported out of band (kube-rs' `Portforwarder::take_error`); each message is
    /// written to the client's error stream.
    pub error: Option<ErrorFuture>,
}

impl PortForwardStream {
    /// A connection without an out-of-band error channel.
    pub fn new(io: impl AsyncDuplex + 'static) -> Self {
        Self {
            io: Box::new(io),
            error: None,
        }
    }
}

impl fmt::Debug for PortForwardStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PortForwardStream")
            .field("error", &self.error.is_some())
            .finish()
    }
}

/// Runs commands in, attaches to, and connects to ports of containers.
pub trait StreamBackend: Send + Sync + 'static {
    /// Runs `request.command`, copying between its standard streams and `io`, and says how it
    /// ended. Dropping the future (the client went away) should stop the command.
    fn exec(&self, request: ExecRequest, io: ExecIo) -> impl Future<Output = ExitStatus> + Send;

    /// Attaches to the container's main process until it ends or the client leaves.
    fn attach(&self, request: AttachRequest, io: ExecIo)
    -> impl Future<Output = ExitStatus> + Send;

    /// Opens one connection to `request.port`.
    fn port_forward(
        &self,
        request: PortForwardRequest,
    ) -> impl Future<Output = Result<PortForwardStream, BackendError>> + Send;

    /// Why no request can be served now (e.g. what runs the pods is unreachable), checked
    /// before a stream is upgraded, so the client gets a 503 with the reason instead of a
    /// stream that fails. `None` (the default): serve.
    fn unavailable(&self) -> Option<BackendError> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_are_the_kubelets() {
        let ok = serde_json::to_value(ExitStatus::Success.to_status()).unwrap();
        assert_eq!(ok["status"], "Success");
        let three = serde_json::to_value(ExitStatus::ExitCode(3).to_status()).unwrap();
        assert_eq!(three["status"], "Failure");
        assert_eq!(three["reason"], "NonZeroExitCode");
        assert_eq!(three["details"]["causes"][0]["reason"], "ExitCode");
        assert_eq!(three["details"]["causes"][0]["message"], "3");
        for s in [
            ExitStatus::Success,
            ExitStatus::ExitCode(7),
            ExitStatus::Error("boom".into()),
        ] {
            let back = ExitStatus::from_status(&s.to_status());
            match (&s, &back) {
                (ExitStatus::Error(_), ExitStatus::Error(m)) => assert!(m.contains("boom")),
                _ => assert_eq!(back, s),
            }
        }
        assert_eq!(ExitStatus::Success.to_text(), None);
    }

    #[test]
    fn terminal_size_uses_go_field_names() {
        let t: TerminalSize = serde_json::from_str(r#"{"Width":80,"Height":24}"#).unwrap();
        assert_eq!(
            t,
            TerminalSize {
                width: 80,
                height: 24
            }
        );
        assert_eq!(
            serde_json::to_string(&t).unwrap(),
            r#"{"Width":80,"Height":24}"#
        );
    }
}
