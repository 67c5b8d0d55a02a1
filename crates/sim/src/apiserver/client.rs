//! Outgoing JSON calls of the API server: admission webhooks and scheduler extenders.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Request, header};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::RootCertStore;
use rustls_pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use super::pem::{certs, key, provider};

/// Kept-alive connections per server (and the credentials it is reached with), as Go's HTTP
/// client keeps them for the scheduler's extender calls and the admission webhook calls, which
/// would otherwise each pay a TCP and TLS handshake on both sides. Over TLS it offers HTTP/2,
/// as Kubernetes' transports do (`SetTransportDefaults`): a server that takes it gets one
/// connection carrying every concurrent call; HTTP/1.1 servers get idle connections kept (at
/// most [`MAX_IDLE`] per server, Go's `MaxIdleConnsPerHost`).
#[derive(Debug, Default)]
pub(super) struct Connections {
    idle: Mutex<HashMap<String, Vec<http1::SendRequest<Full<Bytes>>>>>,
    shared: Mutex<HashMap<String, http2::SendRequest<Full<Bytes>>>>,
}

/// A connection to send one request on.
enum Sender {
    H1(http1::SendRequest<Full<Bytes>>),
    H2(http2::SendRequest<Full<Bytes>>),
}

impl Sender {
    fn is_closed(&self) -> bool {
        match self {
            Sender::H1(s) => s.is_closed(),
            Sender::H2(s) => s.is_closed(),
        }
    }
}

/// Go's `DefaultMaxIdleConnsPerHost`.
const MAX_IDLE: usize = 2;

impl Connections {
    /// POSTs JSON and returns the answer's body, over an idle connection to the same server
    /// when there is one. `https` URLs are verified against `ca_pem` as `server_name`,
    /// presenting the client certificate and key `identity` (PEM) when given; plain `http`
    /// only when `allow_http` (kube-scheduler allows it for extenders; webhooks must use TLS).
    /// A request is sent again on a new connection only when the idle one was found closed
    /// before the request went out (never a request the server may have seen).
    pub(super) async fn post_json(
        &self,
        url: &str,
        server_name: &str,
        ca_pem: Option<&str>,
        identity: Option<(&str, &str)>,
        body: Vec<u8>,
        allow_http: bool,
    ) -> Result<Vec<u8>, String> {
        let target = Target::of(url, allow_http)?;
        let key = format!(
            "{}|{server_name}|{}|{}",
            target.origin(),
            ca_pem.unwrap_or_default(),
            identity.map(|(c, _)| c).unwrap_or_default()
        );
        let mut sender = match self.kept(&key).await {
            Some(kept) => kept,
            None => connect(&target, url, server_name, ca_pem, identity).await?,
        };
        let (status, answer) = match send_on(&mut sender, &target, url, body.clone()).await {
            Err(e) if e.is_canceled() => {
                // The kept connection closed before the request was written.
                sender = connect(&target, url, server_name, ca_pem, identity).await?;
                send_on(&mut sender, &target, url, body)
                    .await
                    .map_err(|e| format!("Post \"{url}\": {e}"))?
            }
            other => other.map_err(|e| format!("Post \"{url}\": {e}"))?,
        };
        self.keep(key, sender);
        if !status.is_success() {
            return Err(format!("Post \"{url}\": the server answered {status}"));
        }
        Ok(answer)
    }

    /// A kept connection to the server `key` names: its shared HTTP/2 one, or an idle
    /// HTTP/1.1 one found still open.
    async fn kept(&self, key: &str) -> Option<Sender> {
        let shared = self
            .shared
            .lock()
            .ok()
            .and_then(|m| m.get(key).filter(|s| !s.is_closed()).cloned());
        if let Some(s) = shared {
            return Some(Sender::H2(s));
        }
        let mut idle = self
            .idle
            .lock()
            .ok()
            .and_then(|mut m| m.get_mut(key).and_then(Vec::pop))?;
        if idle.is_closed() || idle.ready().await.is_err() {
            return None;
        }
        Some(Sender::H1(idle))
    }

    /// Keeps a connection that is still open for the next call to the same server.
    fn keep(&self, key: String, sender: Sender) {
        if sender.is_closed() {
            return;
        }
        match sender {
            Sender::H2(s) => {
                if let Ok(mut m) = self.shared.lock() {
                    m.insert(key, s);
                }
            }
            Sender::H1(s) => {
                if let Ok(mut m) = self.idle.lock() {
                    let kept = m.entry(key).or_default();
                    if kept.len() < MAX_IDLE {
                        kept.push(s);
                    }
                }
            }
        }
    }
}

/// Where a URL points.
struct Target {
    https: bool,
    host: String,
    port: u16,
    path: String,
}

impl Target {
    fn of(url: &str, allow_http: bool) -> Result<Self, String> {
        let uri: http::Uri = url
            .parse()
            .map_err(|e| format!("invalid url {url:?}: {e}"))?;
        let https = match uri.scheme_str() {
            Some("https") => true,
            Some("http") if allow_http => false,
            _ => return Err(format!("url {url:?} must use https")),
        };
        let host = uri
            .host()
            .ok_or("url has no host")?
            .trim_matches(['[', ']'])
            .to_owned();
        let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
        let path = uri
            .path_and_query()
            .map(|p| p.as_str().to_owned())
            .unwrap_or_else(|| "/".into());
        Ok(Self {
            https,
            host,
            port,
            path,
        })
    }

    fn origin(&self) -> String {
        let scheme = if self.https { "https" } else { "http" };
        format!("{scheme}://{}:{}", self.host, self.port)
    }
}

/// A new connection to `target`, TLS-verified as in [`Connections::post_json`]: HTTP/2 when
/// the server chose it in the TLS handshake.
async fn connect(
    target: &Target,
    url: &str,
    server_name: &str,
    ca_pem: Option<&str>,
    identity: Option<(&str, &str)>,
) -> Result<Sender, String> {
    let (host, port) = (target.host.as_str(), target.port);
    let tcp = TcpStream::connect((host, port))
        .await
        .map_err(|e| format!("Post \"{url}\": dial tcp {host}:{port}: {e}"))?;
    // As Go's dialer does: an HTTP/2 request is a HEADERS and a DATA frame, and Nagle would
    // hold the second until the first is acknowledged (a delayed ACK: 40 ms a call).
    let _ = tcp.set_nodelay(true);
    if !target.https {
        let (sender, conn) = http1::handshake(TokioIo::new(tcp))
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        return Ok(Sender::H1(sender));
    }
    let tls = tls_connect(tcp, url, server_name, ca_pem, identity).await?;
    if tls.get_ref().1.alpn_protocol() == Some(b"h2".as_slice()) {
        let (sender, conn) = http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        return Ok(Sender::H2(sender));
    }
    let (sender, conn) = http1::handshake(TokioIo::new(tls))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    Ok(Sender::H1(sender))
}

/// Sends one POST and reads the whole answer.
async fn send_on(
    sender: &mut Sender,
    target: &Target,
    url: &str,
    body: Vec<u8>,
) -> Result<(http::StatusCode, Vec<u8>), hyper::Error> {
    let mut req = Request::post(target.path.as_str())
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::ACCEPT, "application/json");
    // HTTP/2 names the server in the request's `:authority`, taken from a full URI.
    req = match sender {
        Sender::H1(_) => req.header(header::HOST, format!("{}:{}", target.host, target.port)),
        Sender::H2(_) => req.uri(url),
    };
    let Ok(req) = req.body(Full::new(Bytes::from(body))) else {
        // Only an invalid path or host could fail here; Target::of parsed both from a Uri.
        tracing::warn!(url, "building a request failed");
        return Ok((http::StatusCode::BAD_REQUEST, Vec::new()));
    };
    let resp = match sender {
        Sender::H1(s) => s.send_request(req).await?,
        Sender::H2(s) => s.send_request(req).await?,
    };
    let status = resp.status();
    let bytes = resp.into_body().collect().await?.to_bytes();
    Ok((status, bytes.to_vec()))
}

/// The TLS handshake over `tcp`, verified against `ca_pem` as `server_name`, presenting
/// `identity` when given.
async fn tls_connect(
    tcp: TcpStream,
    url: &str,
    server_name: &str,
    ca_pem: Option<&str>,
    identity: Option<(&str, &str)>,
) -> Result<tokio_rustls::client::TlsStream<TcpStream>, String> {
    let ca_pem = ca_pem.ok_or("no caBundle to verify the server with")?;
    let mut roots = RootCertStore::empty();
    for cert in certs("caBundle", ca_pem)? {
        roots.add(cert).map_err(|e| e.to_string())?;
    }
    let config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots);
    let config = match identity {
        None => config.with_no_client_auth(),
        Some((cert, key_pem)) => config
            .with_client_auth_cert(
                certs("client certificate", cert)?,
                key("client key", key_pem)?,
            )
            .map_err(|e| format!("client certificate: {e}"))?,
    };
    let mut config = config;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let name = ServerName::try_from(server_name.to_owned()).map_err(|e| e.to_string())?;
    let tls = TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .map_err(|e| format!("Post \"{url}\": tls: {e}"))?;
    Ok(tls)
}
