//! The kubelet HTTPS API (port 10250) as a library: routing, TLS, authentication and
//! authorization, container logs, exec/attach/port-forward over SPDY/3.1 and the WebSocket
//! channel protocols, stats summary and resource metrics, generic over a backend trait.
//!
//! - [`server`]: the HTTPS server and routes (`/containerLogs`, `/exec`, `/attach`,
//!   `/portForward` and their `{uid}` variants, `/pods`, `/runningpods/`, `/stats/summary`,
//!   `/metrics/resource`, `/healthz`), generic over a [`KubeletBackend`];
//! - [`auth`]: client certificates, TokenReview and SubjectAccessReview, cached;
//! - [`logs`] and [`stats`]: log options, the stats summary and resource metrics.
//!
//! The streaming core:
//! - [`spdy`]: a SPDY/3.1 server session (codec, header compression, stream multiplexing);
//! - [`upgrade`]: from request headers to SPDY or WebSocket, the subprotocol, the 101 response
//!   or a typed 400;
//! - [`remotecommand`]: exec and attach (`channel.k8s.io` v1 to v5, SPDY and WebSocket);
//! - [`portforward`]: `portforward.k8s.io` over SPDY, tunnelled in WebSocket, and the WebSocket
//!   channel variant;
//! - [`backend`]: the stream-shaped trait a container runtime implements.
//!
//! The HTTP layer uses them like this:
//!
//! ```text
//! let upgrade = RemoteCommandUpgrade::negotiate(req.headers())?; // or answer err.response()
//! let options = StreamOptions::from_query(query)?;
//! let command = command_from_query(query)?;
//! let response = upgrade.response(); // send the 101
//! tokio::spawn(async move {
//!     let io = TokioIo::new(hyper::upgrade::on(req).await?);
//!     let request = ExecRequest { pod, container, command, options };
//!     serve_exec(&upgrade, io, request, backend, &config).await
//! });
//! ```
#![forbid(unsafe_code)]

pub mod auth;
pub mod backend;
mod config;
mod error;
pub mod logs;
mod pipe;
pub mod portforward;
pub mod remotecommand;
pub mod running;
pub mod server;
pub mod spdy;
pub mod stats;
pub mod tls;
pub mod upgrade;
pub mod websocket;

pub use auth::{
    Attributes, Auth, AuthError, ClientCert, Refusal, RefusalHook, RefusalReason, User, WebhookAuth,
};
pub use backend::{
    AsyncDuplex, AttachRequest, BackendError, BoxReader, BoxWriter, ErrorFuture, ExecIo,
    ExecRequest, ExitStatus, PodRef, PortForwardRequest, PortForwardStream, StreamBackend,
    StreamOptions, TerminalSize,
};
pub use config::StreamingConfig;
pub use error::StreamError;
pub use logs::{LogOptions, LogOptionsError};
pub use portforward::{
    serve_portforward, serve_portforward_spdy, serve_portforward_tunnel,
    serve_portforward_websocket,
};
pub use remotecommand::{
    serve_attach, serve_attach_spdy, serve_attach_websocket, serve_exec, serve_exec_spdy,
    serve_exec_websocket,
};
pub use server::{
    KubeletBackend, KubeletServer, KubeletServerConfig, LogStream, ServerError, ServingCert,
};
pub use upgrade::{
    PortForwardMode, PortForwardUpgrade, RemoteCommandUpgrade, RemoteCommandVersion, Transport,
    UpgradeError, WsEncoding, command_from_query, detect_transport, ports_from_query,
};
