//! Outgoing JSON calls of the API server: admission webhooks and scheduler extenders.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Request, header};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use rustls::RootCertStore;
use rustls_pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use crate::certs::{certs_from_pem, key_from_pem, provider};

/// Kept-alive connections per server (and the credentials it is reached with), as Go's HTTP
/// client keeps idle ones (at most [`MAX_IDLE`] per server, its `MaxIdleConnsPerHost`): the
/// scheduler's extender calls and the admission webhook calls, which would otherwise each pay
/// a TCP and TLS handshake on both sides.
#[derive(Debug, Default)]
pub(super) struct Connections {
    idle: Mutex<HashMap<String, Vec<SendRequest<Full<Bytes>>>>>,
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
        let mut idle = self
            .idle
            .lock()
            .ok()
            .and_then(|mut m| m.get_mut(&key).and_then(Vec::pop));
        if let Some(s) = idle.as_mut()
            && (s.is_closed() || s.ready().await.is_err())
        {
            idle = None;
        }
        let mut sender = match idle {
            Some(s) => s,
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
        if !sender.is_closed()
            && let Ok(mut m) = self.idle.lock()
        {
            let kept = m.entry(key).or_default();
            if kept.len() < MAX_IDLE {
                kept.push(sender);
            }
        }
        if !status.is_success() {
            return Err(format!("Post \"{url}\": the server answered {status}"));
        }
        Ok(answer)
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

/// A new connection to `target`, TLS-verified as in [`Connections::post_json`].
async fn connect(
    target: &Target,
    url: &str,
    server_name: &str,
    ca_pem: Option<&str>,
    identity: Option<(&str, &str)>,
) -> Result<SendRequest<Full<Bytes>>, String> {
    let (host, port) = (target.host.as_str(), target.port);
    let tcp = TcpStream::connect((host, port))
        .await
        .map_err(|e| format!("Post \"{url}\": dial tcp {host}:{port}: {e}"))?;
    if !target.https {
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        return Ok(sender);
    }
    let tls = tls_connect(tcp, url, server_name, ca_pem, identity).await?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    Ok(sender)
}

/// Sends one POST and reads the whole answer.
async fn send_on(
    sender: &mut SendRequest<Full<Bytes>>,
    target: &Target,
    url: &str,
    body: Vec<u8>,
) -> Result<(http::StatusCode, Vec<u8>), hyper::Error> {
    let req = Request::post(target.path.as_str())
        .header(header::HOST, format!("{}:{}", target.host, target.port))
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::ACCEPT, "application/json")
        .body(Full::new(Bytes::from(body)));
    let Ok(req) = req else {
        // Only an invalid path or host could fail here; Target::of parsed both from a Uri.
        tracing::warn!(url, "building a request failed");
        return Ok((http::StatusCode::BAD_REQUEST, Vec::new()));
    };
    let resp = sender.send_request(req).await?;
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
    for cert in certs_from_pem("caBundle", ca_pem).map_err(|e| e.to_string())? {
        roots.add(cert).map_err(|e| e.to_string())?;
    }
    let config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots);
    let config = match identity {
        None => config.with_no_client_auth(),
        Some((cert, key)) => config
            .with_client_auth_cert(
                certs_from_pem("client certificate", cert).map_err(|e| e.to_string())?,
                key_from_pem("client key", key).map_err(|e| e.to_string())?,
            )
            .map_err(|e| format!("client certificate: {e}"))?,
    };
    let name = ServerName::try_from(server_name.to_owned()).map_err(|e| e.to_string())?;
    let tls = TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .map_err(|e| format!("Post \"{url}\": tls: {e}"))?;
    Ok(tls)
}
