//! Deciding, from the request alone, how a streaming request will be served: SPDY or WebSocket,
//! which subprotocol, and the `101 Switching Protocols` response, or a typed 400 error. The HTTP
//! layer sends the response, awaits `hyper::upgrade::on`, and hands the connection to
//! [`crate::remotecommand::serve_exec`] / [`crate::portforward::serve_portforward`].

use http::header::{self, HeaderMap, HeaderValue};
use http::{Response, StatusCode};

use crate::backend::StreamOptions;

/// `X-Stream-Protocol-Version`: SPDY subprotocol offers and the answer.
pub const STREAM_PROTOCOL_VERSION: &str = "x-stream-protocol-version";
/// `X-Accepted-Stream-Protocol-Versions`: what we support, sent when negotiation fails.
pub const ACCEPTED_STREAM_PROTOCOL_VERSIONS: &str = "x-accepted-stream-protocol-versions";
/// The SPDY upgrade token.
pub const SPDY_31: &str = "SPDY/3.1";

/// Remote command (exec/attach) subprotocol versions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum RemoteCommandVersion {
    /// `channel.k8s.io`: the original.
    V1,
    /// `v2.channel.k8s.io`.
    V2,
    /// `v3.channel.k8s.io`: adds terminal resize.
    V3,
    /// `v4.channel.k8s.io`: the final status is a JSON `metav1.Status` with the exit code.
    V4,
    /// `v5.channel.k8s.io`: adds the CLOSE signal (stdin EOF over WebSockets).
    V5,
}

impl RemoteCommandVersion {
    /// Server preference over SPDY, newest first (the client's order decides, though).
    pub const SPDY_SUPPORTED: [Self; 5] = [Self::V5, Self::V4, Self::V3, Self::V2, Self::V1];

    /// The SPDY subprotocol name.
    pub fn name(self) -> &'static str {
        match self {
            Self::V1 => "channel.k8s.io",
            Self::V2 => "v2.channel.k8s.io",
            Self::V3 => "v3.channel.k8s.io",
            Self::V4 => "v4.channel.k8s.io",
            Self::V5 => "v5.channel.k8s.io",
        }
    }

    fn from_name(name: &str) -> Option<Self> {
        Self::SPDY_SUPPORTED.into_iter().find(|v| v.name() == name)
    }

    /// The final status is JSON (v4 and later) rather than plain text.
    pub fn json_status(self) -> bool {
        self >= Self::V4
    }

    /// A resize stream/channel exists with a terminal (v3 and later).
    pub fn resize(self) -> bool {
        self >= Self::V3
    }
}

/// How channel bytes travel in WebSocket messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WsEncoding {
    /// Binary messages: channel byte, then payload.
    Binary,
    /// Text messages: ASCII digit channel, then base64 payload.
    Base64,
}

/// WebSocket subprotocols for exec/attach, as `(name, version, encoding)`. The kubelet and the
/// API server's translator together accept these; the empty name means no subprotocol offered.
const WS_REMOTE_COMMAND: [(&str, RemoteCommandVersion, WsEncoding); 5] = [
    (
        "v5.channel.k8s.io",
        RemoteCommandVersion::V5,
        WsEncoding::Binary,
    ),
    (
        "v4.channel.k8s.io",
        RemoteCommandVersion::V4,
        WsEncoding::Binary,
    ),
    (
        "v4.base64.channel.k8s.io",
        RemoteCommandVersion::V4,
        WsEncoding::Base64,
    ),
    (
        "channel.k8s.io",
        RemoteCommandVersion::V1,
        WsEncoding::Binary,
    ),
    (
        "base64.channel.k8s.io",
        RemoteCommandVersion::V1,
        WsEncoding::Base64,
    ),
];

/// The SPDY port-forward subprotocol.
pub const PORT_FORWARD_V1: &str = "portforward.k8s.io";
/// WebSocket subprotocols that tunnel SPDY port-forward: the one kubectl 1.31+ offers, and the
/// newer name.
const WS_TUNNEL: [&str; 2] = ["SPDY/3.1+portforward.k8s.io", "v2.portforward.k8s.io"];
/// WebSocket channel port-forward subprotocols (two channels per port).
const WS_PORT_FORWARD: [(&str, WsEncoding); 2] = [
    ("v4.channel.k8s.io", WsEncoding::Binary),
    ("v4.base64.channel.k8s.io", WsEncoding::Base64),
];

/// Why a streaming request cannot be upgraded. All are client errors (400): send
/// [`UpgradeError::response`] and do not upgrade.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UpgradeError {
    /// `tty` together with `stderr`: a terminal merges stderr into stdout.
    #[error("tty and stderr cannot both be true")]
    TtyWithStderr,
    /// None of stdin, stdout, stderr.
    #[error("you must specify at least 1 of stdin, stdout, stderr")]
    NoStreams,
    /// An exec without a command.
    #[error("you must specify at least one command for the container")]
    NoCommand,
    /// Not a SPDY nor a WebSocket upgrade.
    #[error("unable to upgrade: missing upgrade headers in request")]
    NotAnUpgrade,
    /// A SPDY upgrade without `X-Stream-Protocol-Version`.
    #[error("unable to upgrade: X-Stream-Protocol-Version is required")]
    MissingProtocol,
    /// No offered subprotocol is supported. (Kubernetes answers this one with 403; 400 is what
    /// it means, and no client treats the two differently.)
    #[error(
        "unable to upgrade: unable to negotiate protocol: client supports {offered:?}, \
         server accepts {supported:?}"
    )]
    UnsupportedProtocol {
        /// What the client offered.
        offered: Vec<String>,
        /// What we accept.
        supported: Vec<&'static str>,
    },
    /// A malformed WebSocket handshake.
    #[error("bad WebSocket handshake: {0}")]
    BadWebSocket(&'static str),
    /// A query parameter has a value we cannot use.
    #[error("invalid query parameter {name:?}: {reason}")]
    BadQuery {
        /// The parameter.
        name: &'static str,
        /// Why.
        reason: String,
    },
    /// A WebSocket port-forward without `?port=`.
    #[error("query parameter \"port\" is required")]
    MissingPorts,
}

impl UpgradeError {
    /// The HTTP status to answer with.
    pub fn status(&self) -> StatusCode {
        StatusCode::BAD_REQUEST
    }

    /// A complete plain-text error response.
    pub fn response(&self) -> Response<String> {
        let mut resp = Response::new(format!("{self}\n"));
        *resp.status_mut() = self.status();
        let headers = resp.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        if let Self::UnsupportedProtocol { supported, .. } = self {
            for p in supported {
                headers.append(
                    ACCEPTED_STREAM_PROTOCOL_VERSIONS,
                    HeaderValue::from_static(p),
                );
            }
        }
        resp
    }
}

impl StreamOptions {
    /// Validates a combination of streams.
    pub fn new(stdin: bool, stdout: bool, stderr: bool, tty: bool) -> Result<Self, UpgradeError> {
        if tty && stderr {
            return Err(UpgradeError::TtyWithStderr);
        }
        if !stdin && !stdout && !stderr {
            return Err(UpgradeError::NoStreams);
        }
        Ok(Self {
            stdin,
            stdout,
            stderr,
            tty,
        })
    }

    /// Reads the options from a query string. Both spellings are accepted: the kubelet's
    /// (`input`, `output`, `error`, `tty` = `1`, what the API server sends) and the API's
    /// (`stdin`, `stdout`, `stderr`, `tty` = `true`, what clients send the API server).
    pub fn from_query(query: &str) -> Result<Self, UpgradeError> {
        let (mut stdin, mut stdout, mut stderr, mut tty) = (false, false, false, false);
        for (k, v) in form_urlencoded::parse(query.as_bytes()) {
            let slot = match k.as_ref() {
                "input" | "stdin" => &mut stdin,
                "output" | "stdout" => &mut stdout,
                "error" | "stderr" => &mut stderr,
                "tty" => &mut tty,
                _ => continue,
            };
            *slot = parse_flag(&k, &v)?;
        }
        Self::new(stdin, stdout, stderr, tty)
    }
}

fn parse_flag(name: &str, value: &str) -> Result<bool, UpgradeError> {
    let name = match name {
        "input" => "input",
        "stdin" => "stdin",
        "output" => "output",
        "stdout" => "stdout",
        "error" => "error",
        "stderr" => "stderr",
        _ => "tty",
    };
    match value {
        "1" | "true" | "True" | "TRUE" => Ok(true),
        "0" | "false" | "False" | "FALSE" | "" => Ok(false),
        other => Err(UpgradeError::BadQuery {
            name,
            reason: format!("{other:?} is not a boolean"),
        }),
    }
}

/// The `command` parameters of an exec query, in order; an empty list is an error.
pub fn command_from_query(query: &str) -> Result<Vec<String>, UpgradeError> {
    let command: Vec<String> = form_urlencoded::parse(query.as_bytes())
        .filter(|(k, _)| k == "command")
        .map(|(_, v)| v.into_owned())
        .collect();
    if command.is_empty() {
        return Err(UpgradeError::NoCommand);
    }
    Ok(command)
}

/// The `port` parameters of a port-forward query (repeated and/or comma-separated).
pub fn ports_from_query(query: &str) -> Result<Vec<u16>, UpgradeError> {
    let mut ports = Vec::new();
    for (k, v) in form_urlencoded::parse(query.as_bytes()) {
        if k != "port" {
            continue;
        }
        for p in v.split(',') {
            let port = p
                .trim()
                .parse::<u16>()
                .ok()
                .filter(|p| *p > 0)
                .ok_or_else(|| UpgradeError::BadQuery {
                    name: "port",
                    reason: format!("{p:?} is not a port"),
                })?;
            ports.push(port);
        }
    }
    Ok(ports)
}

/// The two ways a streaming connection is carried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// `Upgrade: SPDY/3.1`.
    Spdy,
    /// `Upgrade: websocket`.
    WebSocket,
}

fn header_tokens<'a>(headers: &'a HeaderMap, name: &str) -> impl Iterator<Item = &'a str> {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|t| !t.is_empty())
}

/// Tells a SPDY upgrade from a WebSocket upgrade.
pub fn detect_transport(headers: &HeaderMap) -> Result<Transport, UpgradeError> {
    let connection_upgrade =
        header_tokens(headers, "connection").any(|t| t.eq_ignore_ascii_case("upgrade"));
    if !connection_upgrade {
        return Err(UpgradeError::NotAnUpgrade);
    }
    if header_tokens(headers, "upgrade").any(|t| t.eq_ignore_ascii_case("websocket")) {
        return Ok(Transport::WebSocket);
    }
    if header_tokens(headers, "upgrade").any(|t| t.eq_ignore_ascii_case(SPDY_31)) {
        return Ok(Transport::Spdy);
    }
    Err(UpgradeError::NotAnUpgrade)
}

fn ws_accept_key(headers: &HeaderMap) -> Result<String, UpgradeError> {
    let version = headers
        .get("sec-websocket-version")
        .and_then(|v| v.to_str().ok());
    if version.map(str::trim) != Some("13") {
        return Err(UpgradeError::BadWebSocket(
            "Sec-WebSocket-Version must be 13",
        ));
    }
    let key = headers
        .get("sec-websocket-key")
        .ok_or(UpgradeError::BadWebSocket("Sec-WebSocket-Key is missing"))?;
    Ok(tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes()))
}

/// Subprotocols offered over SPDY, in the client's order.
fn spdy_offers(headers: &HeaderMap) -> Vec<String> {
    header_tokens(headers, STREAM_PROTOCOL_VERSION)
        .map(str::to_string)
        .collect()
}

/// Subprotocols offered over WebSocket, in the client's order.
fn ws_offers(headers: &HeaderMap) -> Vec<String> {
    header_tokens(headers, "sec-websocket-protocol")
        .map(str::to_string)
        .collect()
}

/// Builds the 101 response.
fn switching(
    transport: Transport,
    protocol: Option<&'static str>,
    accept: Option<&str>,
) -> Response<()> {
    let mut resp = Response::new(());
    *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = resp.headers_mut();
    h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    match transport {
        Transport::Spdy => {
            h.insert(header::UPGRADE, HeaderValue::from_static(SPDY_31));
            if let Some(p) = protocol {
                h.insert(STREAM_PROTOCOL_VERSION, HeaderValue::from_static(p));
            }
        }
        Transport::WebSocket => {
            h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
            if let Some(Ok(v)) = accept.map(HeaderValue::from_str) {
                h.insert(header::SEC_WEBSOCKET_ACCEPT, v);
            }
            if let Some(p) = protocol.filter(|p| !p.is_empty()) {
                h.insert(header::SEC_WEBSOCKET_PROTOCOL, HeaderValue::from_static(p));
            }
        }
    }
    resp
}

/// How an exec or attach will be served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteCommandUpgrade {
    transport: Transport,
    version: RemoteCommandVersion,
    encoding: WsEncoding,
    protocol: Option<&'static str>,
    ws_accept: Option<String>,
}

impl RemoteCommandUpgrade {
    /// Chooses transport and subprotocol: the first subprotocol in the client's list that we
    /// support, like Kubernetes.
    pub fn negotiate(headers: &HeaderMap) -> Result<Self, UpgradeError> {
        match detect_transport(headers)? {
            Transport::Spdy => {
                let offered = spdy_offers(headers);
                if offered.is_empty() {
                    return Err(UpgradeError::MissingProtocol);
                }
                let version = offered
                    .iter()
                    .find_map(|o| RemoteCommandVersion::from_name(o))
                    .ok_or_else(|| UpgradeError::UnsupportedProtocol {
                        offered: offered.clone(),
                        supported: RemoteCommandVersion::SPDY_SUPPORTED
                            .map(|v| v.name())
                            .to_vec(),
                    })?;
                Ok(Self {
                    transport: Transport::Spdy,
                    version,
                    encoding: WsEncoding::Binary,
                    protocol: Some(version.name()),
                    ws_accept: None,
                })
            }
            Transport::WebSocket => {
                let accept = ws_accept_key(headers)?;
                let offered = ws_offers(headers);
                let chosen = if offered.is_empty() {
                    // No subprotocol: the original binary channel protocol.
                    Some(("", RemoteCommandVersion::V1, WsEncoding::Binary))
                } else {
                    offered
                        .iter()
                        .find_map(|o| WS_REMOTE_COMMAND.into_iter().find(|w| w.0 == o))
                };
                let (name, version, encoding) =
                    chosen.ok_or_else(|| UpgradeError::UnsupportedProtocol {
                        offered: offered.clone(),
                        supported: WS_REMOTE_COMMAND.map(|w| w.0).to_vec(),
                    })?;
                Ok(Self {
                    transport: Transport::WebSocket,
                    version,
                    encoding,
                    protocol: (!name.is_empty()).then_some(name),
                    ws_accept: Some(accept),
                })
            }
        }
    }

    /// SPDY or WebSocket.
    pub fn transport(&self) -> Transport {
        self.transport
    }

    /// The protocol version (decides status format, resize, CLOSE).
    pub fn version(&self) -> RemoteCommandVersion {
        self.version
    }

    /// Binary or base64 channels (WebSocket only).
    pub fn encoding(&self) -> WsEncoding {
        self.encoding
    }

    /// The subprotocol answered, if any.
    pub fn protocol(&self) -> Option<&'static str> {
        self.protocol
    }

    /// The `101 Switching Protocols` response to send before upgrading.
    pub fn response(&self) -> Response<()> {
        switching(self.transport, self.protocol, self.ws_accept.as_deref())
    }
}

/// The port-forward variants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortForwardMode {
    /// `portforward.k8s.io` over SPDY: a data/error stream pair per connection.
    Spdy,
    /// The same SPDY session tunnelled in WebSocket binary messages (kubectl 1.31+).
    WebSocketTunnel,
    /// WebSocket channels: two per port, one connection per port, ports from the query.
    WebSocketChannels(WsEncoding),
}

/// How a port-forward will be served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortForwardUpgrade {
    mode: PortForwardMode,
    protocol: Option<&'static str>,
    ws_accept: Option<String>,
    transport: Transport,
}

impl PortForwardUpgrade {
    /// Chooses the variant. `ports` are the query's `port` values ([`ports_from_query`]); the
    /// WebSocket channel variant needs at least one.
    pub fn negotiate(headers: &HeaderMap, ports: &[u16]) -> Result<Self, UpgradeError> {
        match detect_transport(headers)? {
            Transport::Spdy => {
                let offered = spdy_offers(headers);
                if offered.is_empty() {
                    return Err(UpgradeError::MissingProtocol);
                }
                if !offered.iter().any(|o| o == PORT_FORWARD_V1) {
                    return Err(UpgradeError::UnsupportedProtocol {
                        offered,
                        supported: vec![PORT_FORWARD_V1],
                    });
                }
                Ok(Self {
                    mode: PortForwardMode::Spdy,
                    protocol: Some(PORT_FORWARD_V1),
                    ws_accept: None,
                    transport: Transport::Spdy,
                })
            }
            Transport::WebSocket => {
                let accept = ws_accept_key(headers)?;
                let offered = ws_offers(headers);
                let mut chosen: Option<(Option<&'static str>, PortForwardMode)> = None;
                if offered.is_empty() {
                    chosen = Some((None, PortForwardMode::WebSocketChannels(WsEncoding::Binary)));
                }
                for o in &offered {
                    if let Some(t) = WS_TUNNEL.into_iter().find(|t| t == o) {
                        chosen = Some((Some(t), PortForwardMode::WebSocketTunnel));
                        break;
                    }
                    if let Some((name, enc)) = WS_PORT_FORWARD.into_iter().find(|w| w.0 == o) {
                        chosen = Some((Some(name), PortForwardMode::WebSocketChannels(enc)));
                        break;
                    }
                }
                let Some((protocol, mode)) = chosen else {
                    let mut supported = WS_TUNNEL.to_vec();
                    supported.extend(WS_PORT_FORWARD.map(|w| w.0));
                    return Err(UpgradeError::UnsupportedProtocol { offered, supported });
                };
                if matches!(mode, PortForwardMode::WebSocketChannels(_)) && ports.is_empty() {
                    return Err(UpgradeError::MissingPorts);
                }
                Ok(Self {
                    mode,
                    protocol,
                    ws_accept: Some(accept),
                    transport: Transport::WebSocket,
                })
            }
        }
    }

    /// The variant.
    pub fn mode(&self) -> PortForwardMode {
        self.mode
    }

    /// The subprotocol answered, if any.
    pub fn protocol(&self) -> Option<&'static str> {
        self.protocol
    }

    /// The `101 Switching Protocols` response to send before upgrading.
    pub fn response(&self) -> Response<()> {
        switching(self.transport, self.protocol, self.ws_accept.as_deref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn spdy_picks_the_clients_first_supported() {
        let h = headers(&[
            ("connection", "Upgrade"),
            ("upgrade", "SPDY/3.1"),
            ("x-stream-protocol-version", "v9.channel.k8s.io"),
            ("x-stream-protocol-version", "v4.channel.k8s.io"),
            ("x-stream-protocol-version", "v3.channel.k8s.io"),
        ]);
        let u = RemoteCommandUpgrade::negotiate(&h).unwrap();
        assert_eq!(u.version(), RemoteCommandVersion::V4);
        let r = u.response();
        assert_eq!(r.status(), 101);
        assert_eq!(
            r.headers()["x-stream-protocol-version"],
            "v4.channel.k8s.io"
        );
        assert_eq!(r.headers()["upgrade"], "SPDY/3.1");
    }

    #[test]
    fn spdy_errors() {
        let no_proto = headers(&[("connection", "upgrade"), ("upgrade", "spdy/3.1")]);
        assert_eq!(
            RemoteCommandUpgrade::negotiate(&no_proto),
            Err(UpgradeError::MissingProtocol)
        );
        let unknown = headers(&[
            ("connection", "upgrade"),
            ("upgrade", "SPDY/3.1"),
            ("x-stream-protocol-version", "v9.channel.k8s.io, nope"),
        ]);
        let err = RemoteCommandUpgrade::negotiate(&unknown).unwrap_err();
        assert!(matches!(err, UpgradeError::UnsupportedProtocol { .. }));
        let resp = err.response();
        assert_eq!(resp.status(), 400);
        assert_eq!(
            resp.headers()
                .get_all(ACCEPTED_STREAM_PROTOCOL_VERSIONS)
                .iter()
                .count(),
            5
        );
        assert_eq!(
            RemoteCommandUpgrade::negotiate(&headers(&[("upgrade", "SPDY/3.1")])),
            Err(UpgradeError::NotAnUpgrade)
        );
    }

    #[test]
    fn websocket_handshake() {
        let h = headers(&[
            ("connection", "keep-alive, Upgrade"),
            ("upgrade", "websocket"),
            ("sec-websocket-version", "13"),
            ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="),
            (
                "sec-websocket-protocol",
                "v5.channel.k8s.io, v4.channel.k8s.io",
            ),
        ]);
        let u = RemoteCommandUpgrade::negotiate(&h).unwrap();
        assert_eq!(u.version(), RemoteCommandVersion::V5);
        let r = u.response();
        // RFC 6455's worked example.
        assert_eq!(
            r.headers()["sec-websocket-accept"],
            "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
        );
        assert_eq!(r.headers()["sec-websocket-protocol"], "v5.channel.k8s.io");
        let b64 = headers(&[
            ("connection", "Upgrade"),
            ("upgrade", "websocket"),
            ("sec-websocket-version", "13"),
            ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="),
            ("sec-websocket-protocol", "v4.base64.channel.k8s.io"),
        ]);
        let u = RemoteCommandUpgrade::negotiate(&b64).unwrap();
        assert_eq!(
            (u.version(), u.encoding()),
            (RemoteCommandVersion::V4, WsEncoding::Base64)
        );
    }

    #[test]
    fn port_forward_variants() {
        let ws = |proto: &'static str| {
            headers(&[
                ("connection", "Upgrade"),
                ("upgrade", "websocket"),
                ("sec-websocket-version", "13"),
                ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="),
                ("sec-websocket-protocol", proto),
            ])
        };
        let t = PortForwardUpgrade::negotiate(&ws("SPDY/3.1+portforward.k8s.io"), &[]).unwrap();
        assert_eq!(t.mode(), PortForwardMode::WebSocketTunnel);
        let kube_rs =
            PortForwardUpgrade::negotiate(&ws("v5.channel.k8s.io, v4.channel.k8s.io"), &[80]);
        assert_eq!(kube_rs.unwrap().protocol(), Some("v4.channel.k8s.io"));
        assert_eq!(
            PortForwardUpgrade::negotiate(&ws("v4.channel.k8s.io"), &[]),
            Err(UpgradeError::MissingPorts)
        );
    }

    #[test]
    fn options_and_queries() {
        assert_eq!(
            StreamOptions::new(false, true, true, true),
            Err(UpgradeError::TtyWithStderr)
        );
        assert_eq!(
            StreamOptions::new(false, false, false, true),
            Err(UpgradeError::NoStreams)
        );
        let o = StreamOptions::from_query("output=1&error=1&command=ls").unwrap();
        assert!(o.stdout && o.stderr && !o.stdin && !o.tty);
        let o = StreamOptions::from_query("stdin=true&stdout=true&tty=true").unwrap();
        assert!(o.stdin && o.stdout && o.tty);
        assert!(StreamOptions::from_query("stdout=maybe").is_err());
        assert_eq!(
            command_from_query("command=echo&command=a%20b").unwrap(),
            ["echo", "a b"]
        );
        assert_eq!(command_from_query("x=1"), Err(UpgradeError::NoCommand));
        assert_eq!(
            ports_from_query("port=80&port=81,82").unwrap(),
            [80, 81, 82]
        );
        assert!(ports_from_query("port=0").is_err());
        assert!(ports_from_query("port=70000").is_err());
    }
}
