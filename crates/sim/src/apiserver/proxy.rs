//! The API server's connections to kubelets: `pods/log`, `pods/exec`, `pods/attach`,
//! `pods/portforward` and `nodes/proxy` go to the node's kubelet endpoint (InternalIP and
//! `daemonEndpoints.kubeletEndpoint.Port`) over TLS, presenting the API server's kubelet client
//! certificate. Upgrades (SPDY and WebSocket) are passed through byte for byte, as Kubernetes
//! up to 1.29 does; plain responses (logs, stats) are streamed.
//!
//! Like a real API server started without `--kubelet-certificate-authority`, the kubelet's
//! serving certificate is not verified: kubelets sign their own.

use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use rustls::DigitallySignedStruct;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
use serde_json::Value;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use super::State;
use super::errors::ApiError;
use super::http::{Body, error_response};
use super::pem::{certs, key, provider};
use super::resources::ids;
use super::rest::Query;
use super::store::ObjKey;

/// Accepts any server certificate (a kubelet's, see the module comment; in tests, a listener's
/// that an attacker would not know either); signatures are still checked so the handshake
/// itself is sound.
#[derive(Debug)]
pub struct CertNotVerified(pub Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for CertNotVerified {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

fn kubelet_tls(state: &State) -> Result<TlsConnector, ApiError> {
    let provider = provider();
    let config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| ApiError::internal(e.to_string()))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(CertNotVerified(provider)))
        .with_client_auth_cert(
            certs(
                "kubelet client",
                &state.config.certs.kubelet_client.cert_pem,
            )
            .map_err(ApiError::internal)?,
            key("kubelet client", &state.config.certs.kubelet_client.key_pem)
                .map_err(ApiError::internal)?,
        )
        .map_err(|e| ApiError::internal(e.to_string()))?;
    let mut config = config;
    // Upgrades need HTTP/1.1.
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsConnector::from(Arc::new(config)))
}

/// The kubelet endpoint of a node: (address, port).
fn kubelet_endpoint(state: &State, node: &str) -> Result<(String, u16), ApiError> {
    let n = state
        .store
        .get(*ids::NODES, &ObjKey::new("", node))
        .ok_or_else(|| ApiError::not_found("", "nodes", node))?;
    let addresses = n
        .object
        .pointer("/status/addresses")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let address = ["InternalIP", "Hostname", "ExternalIP"]
        .iter()
        .find_map(|t| {
            addresses
                .iter()
                .find(|a| a.get("type").and_then(Value::as_str) == Some(t))
        })
        .and_then(|a| a.get("address").and_then(Value::as_str))
        .filter(|a| !a.is_empty())
        .ok_or_else(|| {
            ApiError::bad_request(format!("node {node} has no address to reach its kubelet"))
        })?;
    let port = n
        .object
        .pointer("/status/daemonEndpoints/kubeletEndpoint/Port")
        .and_then(Value::as_u64)
        .unwrap_or(10250);
    let port = u16::try_from(port).map_err(|_| {
        ApiError::bad_request(format!("node {node} has an invalid kubelet port {port}"))
    })?;
    Ok((address.to_owned(), port))
}

/// `pods/{log,exec,attach,portforward}`.
pub(super) async fn pod_stream(
    state: Arc<State>,
    req: Request<Incoming>,
    ns: &str,
    name: &str,
    sub: &str,
    q: &Query,
) -> Response<Body> {
    match pod_target(&state, &req, ns, name, sub, q) {
        // Like the real API server: the log of a pod no scheduler placed yet is empty.
        Ok(None) => empty_response(StatusCode::NO_CONTENT),
        // The real API server refuses a stream that is not an upgrade itself, before dialing.
        Ok(Some(_)) if sub != "log" && !is_upgrade_request(&req) => {
            error_response(&ApiError::bad_request("Upgrade request required"))
        }
        Ok(Some((node, path))) => {
            let checked = (sub == "log").then_some(name);
            forward(&state, req, &node, &path, checked).await
        }
        Err(e) => error_response(&e),
    }
}

/// Go's `httpstream.IsUpgradeRequest`: a `Connection` header naming `upgrade`.
fn is_upgrade_request<B>(req: &Request<B>) -> bool {
    req.headers()
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
}

fn empty_response(status: StatusCode) -> Response<Body> {
    let mut res = Response::new(super::http::full(Bytes::new()));
    *res.status_mut() = status;
    res
}

fn pod_target(
    state: &State,
    req: &Request<Incoming>,
    ns: &str,
    name: &str,
    sub: &str,
    q: &Query,
) -> Result<Option<(String, String)>, ApiError> {
    let pod = state
        .store
        .get(*ids::PODS, &ObjKey::new(ns, name))
        .ok_or_else(|| ApiError::not_found("", "pods", name))?;
    let node = pod
        .object
        .pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .map(str::to_owned);
    let host_assigned = || {
        node.clone().ok_or_else(|| {
            ApiError::bad_request(format!("pod {name} does not have a host assigned"))
        })
    };
    let containers: Vec<String> = [
        "/spec/containers",
        "/spec/initContainers",
        "/spec/ephemeralContainers",
    ]
    .iter()
    .flat_map(|p| {
        pod.object
            .pointer(p)
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    })
    .filter_map(|c| c.get("name").and_then(Value::as_str).map(str::to_owned))
    .collect();
    let container = || -> Result<String, ApiError> {
        match q.get("container").filter(|c| !c.is_empty()) {
            Some(c) if containers.iter().any(|x| x == c) => Ok(c.to_owned()),
            Some(c) => Err(ApiError::bad_request(format!(
                "container {c} is not valid for pod {name}"
            ))),
            None => {
                let main: Vec<String> = pod
                    .object
                    .pointer("/spec/containers")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .filter_map(|c| c.get("name").and_then(Value::as_str).map(str::to_owned))
                    .collect();
                match main.as_slice() {
                    [one] => Ok(one.clone()),
                    _ => Err(ApiError::bad_request(format!(
                        "a container name must be specified for pod {name}, choose one of: [{}]",
                        main.join(" ")
                    ))),
                }
            }
        }
    };
    let mut params = form_urlencoded::Serializer::new(String::new());
    let path = match sub {
        "log" => {
            for k in [
                "follow",
                "previous",
                "sinceSeconds",
                "sinceTime",
                "timestamps",
                "tailLines",
                "limitBytes",
            ] {
                if let Some(v) = q.get(k) {
                    params.append_pair(k, v);
                }
            }
            let container = container()?;
            if node.is_none() {
                return Ok(None);
            }
            format!("/containerLogs/{ns}/{name}/{container}")
        }
        "exec" | "attach" => {
            for (api, kubelet) in [
                ("stdin", "input"),
                ("stdout", "output"),
                ("stderr", "error"),
                ("tty", "tty"),
            ] {
                if q.flag(api) {
                    params.append_pair(kubelet, "1");
                }
            }
            if sub == "exec" {
                let command = q.all("command");
                if command.is_empty() {
                    return Err(ApiError::bad_request("you must specify at least 1 command"));
                }
                for c in command {
                    params.append_pair("command", c);
                }
            }
            format!("/{sub}/{ns}/{name}/{}", container()?)
        }
        "portforward" => {
            for p in q.all("ports") {
                params.append_pair("port", p);
            }
            format!("/portForward/{ns}/{name}")
        }
        other => {
            return Err(ApiError::method_not_allowed(format!(
                "{} pods/{other} is not supported",
                req.method()
            )));
        }
    };
    let node = host_assigned()?;
    let query = params.finish();
    Ok(Some((
        node,
        if query.is_empty() {
            path
        } else {
            format!("{path}?{query}")
        },
    )))
}

/// `nodes/{name}/proxy/{path}`: the kubelet's own API (stats, metrics, pods).
pub(super) async fn node_proxy(
    state: Arc<State>,
    req: Request<Incoming>,
    node: &str,
    rest: &str,
) -> Response<Body> {
    let query = req
        .uri()
        .query()
        .map(|q| format!("?{q}"))
        .unwrap_or_default();
    let path = format!("/{rest}{query}");
    if !state.config.proxy_to_loopback
        && let Err(e) = proxyable(&state, node).await
    {
        return error_response(&e);
    }
    forward(&state, req, node, &path, None).await
}

/// Whether `nodes/proxy` may reach the node's kubelet: like the real API server, only when every
/// address its kubelet host resolves to is global unicast (no loopback, link-local, multicast or
/// unspecified address), so the proxy cannot be turned on the API server's own host.
async fn proxyable(state: &State, node: &str) -> Result<(), ApiError> {
    let (host, _) = kubelet_endpoint(state, node)?;
    let ips: Vec<std::net::IpAddr> = match host.parse() {
        Ok(ip) => vec![ip],
        Err(_) => tokio::net::lookup_host((host.as_str(), 0))
            .await
            .map_err(|e| ApiError::bad_request(e.to_string()))?
            .map(|a| a.ip())
            .collect(),
    };
    if ips.is_empty() {
        return Err(ApiError::bad_request("no addresses for hostname"));
    }
    if ips.iter().any(|ip| !global_unicast(*ip)) {
        return Err(ApiError::bad_request("address not allowed"));
    }
    Ok(())
}

/// Go's `net.IP.IsGlobalUnicast`, which the real API server's check uses.
fn global_unicast(ip: std::net::IpAddr) -> bool {
    match ip {
        std::net::IpAddr::V4(v4) => {
            !(v4.is_loopback()
                || v4.is_link_local()
                || v4.is_multicast()
                || v4.is_unspecified()
                || v4.is_broadcast())
        }
        std::net::IpAddr::V6(v6) => {
            !(v6.is_loopback()
                || v6.is_unicast_link_local()
                || v6.is_multicast()
                || v6.is_unspecified())
        }
    }
}

/// Sends `req` to the node's kubelet at `path`; splices upgraded connections, streams bodies.
/// `log_of`: the pod whose log this is, whose kubelet errors become Statuses as the API
/// server's `pods/log` does (other streams and `nodes/proxy` pass the kubelet's answer on).
async fn forward(
    state: &State,
    req: Request<Incoming>,
    node: &str,
    path: &str,
    log_of: Option<&str>,
) -> Response<Body> {
    match forward_inner(state, req, node, path, log_of).await {
        Ok(r) => r,
        Err(e) => error_response(&e),
    }
}

async fn forward_inner(
    state: &State,
    mut req: Request<Incoming>,
    node: &str,
    path: &str,
    log_of: Option<&str>,
) -> Result<Response<Body>, ApiError> {
    let (host, port) = kubelet_endpoint(state, node)?;
    let unavailable = |e: &dyn std::fmt::Display| {
        ApiError::service_unavailable(format!(
            "error trying to reach service: dial tcp {host}:{port}: {e}"
        ))
    };
    let tcp = TcpStream::connect((host.as_str(), port))
        .await
        .map_err(|e| unavailable(&e))?;
    let _ = tcp.set_nodelay(true);
    let name = ServerName::try_from(host.clone()).map_err(|e| unavailable(&e))?;
    let tls = kubelet_tls(state)?
        .connect(name, tcp)
        .await
        .map_err(|e| unavailable(&e))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .map_err(|e| unavailable(&e))?;
    tokio::spawn(conn.with_upgrades());

    let upgrading = req.headers().contains_key(header::UPGRADE);
    let mut out = Request::builder().method(req.method().clone()).uri(path);
    for (k, v) in req.headers() {
        // Our identity goes in the TLS handshake; the user's credentials stay here.
        if k != header::AUTHORIZATION && k != header::HOST {
            out = out.header(k, v);
        }
    }
    out = out.header(header::HOST, format!("{host}:{port}"));
    let client_upgrade = if upgrading {
        Some(hyper::upgrade::on(&mut req))
    } else {
        None
    };
    let body = if req.method() == Method::GET || upgrading {
        Empty::<Bytes>::new()
            .map_err(|never| match never {})
            .boxed_unsync()
    } else {
        req.into_body()
            .map_err(std::io::Error::other)
            .boxed_unsync()
    };
    let out = out
        .body(body)
        .map_err(|e| ApiError::internal(e.to_string()))?;
    let mut resp = sender
        .send_request(out)
        .await
        .map_err(|e| unavailable(&e))?;

    if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
        let Some(client_upgrade) = client_upgrade else {
            return Err(ApiError::internal(
                "the kubelet switched protocols on a plain request",
            ));
        };
        let kubelet_upgrade = hyper::upgrade::on(&mut resp);
        let mut reply = Response::builder().status(StatusCode::SWITCHING_PROTOCOLS);
        for (k, v) in resp.headers() {
            reply = reply.header(k, v);
        }
        tokio::spawn(async move {
            let (Ok(client), Ok(kubelet)) = (client_upgrade.await, kubelet_upgrade.await) else {
                return;
            };
            let _ = tokio::io::copy_bidirectional(
                &mut TokioIo::new(client),
                &mut TokioIo::new(kubelet),
            )
            .await;
        });
        return reply
            .body(super::http::full(Bytes::new()))
            .map_err(|e| ApiError::internal(e.to_string()));
    }
    let code = resp.status().as_u16();
    if let Some(pod) = log_of
        && !(200..=206).contains(&code)
    {
        // As `GenericHttpResponseChecker`: at most 50,000 bytes of the body are read.
        let mut text = Vec::new();
        let mut body = resp.into_body();
        while let Some(Ok(frame)) = body.frame().await {
            if let Ok(data) = frame.into_data() {
                text.extend_from_slice(&data);
            }
            if text.len() >= 50_000 {
                text.truncate(50_000);
                break;
            }
        }
        return Err(ApiError::from_kubelet_log(
            code,
            &String::from_utf8_lossy(&text),
            pod,
        ));
    }
    let (parts, body) = resp.into_parts();
    Ok(Response::from_parts(
        parts,
        body.map_err(std::io::Error::other).boxed_unsync(),
    ))
}

/// GETs a kubelet path of a node and returns the whole body (metrics scraping).
pub(super) async fn kubelet_get(state: &State, node: &str, path: &str) -> Result<Bytes, ApiError> {
    let (host, port) = kubelet_endpoint(state, node)?;
    let unavailable = |e: &dyn std::fmt::Display| {
        ApiError::service_unavailable(format!("unable to fetch metrics from node {node}: {e}"))
    };
    let tcp = TcpStream::connect((host.as_str(), port))
        .await
        .map_err(|e| unavailable(&e))?;
    let name = ServerName::try_from(host.clone()).map_err(|e| unavailable(&e))?;
    let tls = kubelet_tls(state)?
        .connect(name, tcp)
        .await
        .map_err(|e| unavailable(&e))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .map_err(|e| unavailable(&e))?;
    tokio::spawn(conn);
    let req = Request::get(path)
        .header(header::HOST, format!("{host}:{port}"))
        .body(Empty::<Bytes>::new())
        .map_err(|e| ApiError::internal(e.to_string()))?;
    let resp = sender
        .send_request(req)
        .await
        .map_err(|e| unavailable(&e))?;
    let status = resp.status();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| unavailable(&e))?
        .to_bytes();
    if !status.is_success() {
        return Err(unavailable(&format!("the kubelet answered {status}")));
    }
    Ok(body)
}
