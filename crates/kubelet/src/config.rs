//! Connection and streaming tunables of the kubelet API: exec, attach and port-forward.

use std::time::Duration;

use crate::spdy::SessionConfig;

/// Limits and timeouts of the kubelet API's connections and streaming endpoints. Defaults follow
/// the kubelet.
#[derive(Debug, Clone)]
pub struct StreamingConfig {
    /// How long a client may take to complete the TLS handshake and to send a request's headers.
    pub connection: tensile_runtime::tls::ConnectionLimits,
    /// How long a client may take to open the streams of an exec/attach, or to complete a
    /// port-forward data/error pair (kubelet: 30 s).
    pub stream_creation_timeout: Duration,
    /// How long to wait at the end for the client to close the connection once it has been
    /// sent everything, before closing it ourselves.
    pub close_grace: Duration,
    /// Largest WebSocket message accepted.
    pub websocket_max_message: usize,
    /// SPDY session limits; `session.idle_timeout` also applies to WebSockets.
    pub session: SessionConfig,
}

impl Default for StreamingConfig {
    fn default() -> Self {
        Self {
            connection: tensile_runtime::tls::ConnectionLimits::default(),
            stream_creation_timeout: Duration::from_secs(30),
            close_grace: Duration::from_secs(15),
            websocket_max_message: 16 << 20,
            session: SessionConfig::default(),
        }
    }
}
