//! Outgoing JSON calls of the API server: admission webhooks and scheduler extenders.

use std::sync::Arc;

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

/// POSTs JSON over HTTPS, verified against `ca_pem` as `server_name` (webhooks).
pub(super) async fn post_json(
    url: &str,
    server_name: &str,
    ca_pem: Option<&str>,
    body: Vec<u8>,
) -> Result<Vec<u8>, String> {
    post_json_with(url, server_name, ca_pem, None, body, false).await
}

/// POSTs JSON and returns the answer's body. `https` URLs are verified against `ca_pem` as
/// `server_name`, presenting the client certificate and key `identity` (PEM) when given; plain
/// `http` only when `allow_http` (kube-scheduler allows it for extenders; webhooks must use
/// TLS).
pub(super) async fn post_json_with(
    url: &str,
    server_name: &str,
    ca_pem: Option<&str>,
    identity: Option<(&str, &str)>,
    body: Vec<u8>,
    allow_http: bool,
) -> Result<Vec<u8>, String> {
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
    let tcp = TcpStream::connect((host.as_str(), port))
        .await
        .map_err(|e| format!("Post \"{url}\": dial tcp {host}:{port}: {e}"))?;
    if !https {
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        return send(sender, url, &host, port, &path, body).await;
    }
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
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    send(sender, url, &host, port, &path, body).await
}

async fn send(
    mut sender: SendRequest<Full<Bytes>>,
    url: &str,
    host: &str,
    port: u16,
    path: &str,
    body: Vec<u8>,
) -> Result<Vec<u8>, String> {
    let req = Request::post(path)
        .header(header::HOST, format!("{host}:{port}"))
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::ACCEPT, "application/json")
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| e.to_string())?;
    let resp = sender
        .send_request(req)
        .await
        .map_err(|e| format!("Post \"{url}\": {e}"))?;
    let status = resp.status();
    let bytes = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    if !status.is_success() {
        return Err(format!("Post \"{url}\": the server answered {status}"));
    }
    Ok(bytes.to_vec())
}
