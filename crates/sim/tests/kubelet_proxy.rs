//! The API server's connections to a node's kubelet: logs streamed, upgrades passed through
//! byte for byte, the API server's client certificate presented. The kubelet here is a fake
//! that records what it was asked.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, LogParams, Patch, PatchParams, PostParams};
use serde_json::json;
use tensile_sim::apiserver::{ApiServer, ApiServerConfig};
use tensile_testenv::certs::{Ca, certs_from_pem, provider, server_config};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A kubelet that answers logs with the query it got and echoes upgraded connections; it
/// refuses clients without a certificate from `client_ca`.
async fn fake_kubelet(client_ca: &str) -> SocketAddr {
    let ca = Ca::new("kubelet-self-signed").unwrap();
    let cert = ca.issue_server("kubelet", &["127.0.0.1".into()]).unwrap();
    let tls = tokio_rustls::TlsAcceptor::from(server_config(&cert, client_ca).unwrap());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let tls = tls.clone();
            tokio::spawn(async move {
                let Ok(stream) = tls.accept(tcp).await else {
                    return;
                };
                let who = stream
                    .get_ref()
                    .1
                    .peer_certificates()
                    .and_then(|c| c.first())
                    .and_then(tensile_kubelet::server::certificate_user);
                let svc = service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
                    let who = who.clone();
                    async move {
                        if who.is_none() {
                            let mut r =
                                hyper::Response::new(Full::new(Bytes::from("Unauthorized")));
                            *r.status_mut() = hyper::StatusCode::UNAUTHORIZED;
                            return Ok::<_, Infallible>(r);
                        }
                        if req.headers().contains_key("upgrade") {
                            let protocol = req.headers().get("x-stream-protocol-version").cloned();
                            let path = req.uri().to_string();
                            let on = hyper::upgrade::on(&mut req);
                            tokio::spawn(async move {
                                let mut io = TokioIo::new(on.await.unwrap());
                                io.write_all(format!("{path}\n").as_bytes()).await.unwrap();
                                let mut buf = [0u8; 64];
                                loop {
                                    let n = io.read(&mut buf).await.unwrap_or(0);
                                    if n == 0 || io.write_all(&buf[..n]).await.is_err() {
                                        return;
                                    }
                                }
                            });
                            let mut r = hyper::Response::builder()
                                .status(101)
                                .header("connection", "Upgrade")
                                .header("upgrade", "SPDY/3.1");
                            if let Some(p) = protocol {
                                r = r.header("x-stream-protocol-version", p);
                            }
                            return Ok(r.body(Full::new(Bytes::new())).unwrap());
                        }
                        let text = format!(
                            "{} by {}\nline2\n",
                            req.uri(),
                            who.map(|w| w.name).unwrap_or_default()
                        );
                        Ok(hyper::Response::new(Full::new(Bytes::from(text))))
                    }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection_with_upgrades(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    addr
}

async fn setup() -> (ApiServer, kube::Client) {
    let server = tensile_testenv::start_apiserver(ApiServerConfig::default())
        .await
        .unwrap()
        .0;
    let client = server.client().await.unwrap();
    let kubelet = fake_kubelet(&server.state().config.certs.ca_pem).await;
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .create(
            &PostParams::default(),
            &serde_json::from_value(
                json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}}),
            )
            .unwrap(),
        )
        .await
        .unwrap();
    nodes
        .patch_status(
            "n1",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {
        "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": kubelet.port()}}}})),
        )
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    pods.create(&PostParams::default(), &serde_json::from_value(json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web"}, "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "i"}, {"name": "d", "image": "i"}]}})).unwrap())
        .await
        .unwrap();
    (server, client)
}

#[tokio::test]
async fn logs_are_fetched_from_the_kubelet_with_the_apiservers_client_certificate() {
    let (_server, client) = setup().await;
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let logs = pods
        .logs(
            "web",
            &LogParams {
                container: Some("d".into()),
                tail_lines: Some(2),
                since_seconds: Some(30),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(
        logs,
        "/containerLogs/default/web/d?sinceSeconds=30&tailLines=2 by kube-apiserver-kubelet-client\nline2\n"
    );
    let e = pods.logs("web", &LogParams::default()).await.unwrap_err();
    let kube::Error::Api(s) = e else {
        panic!("{e:?}")
    };
    assert_eq!(
        (s.code, s.message.as_str()),
        (
            400,
            "a container name must be specified for pod web, choose one of: [c d]"
        )
    );
}

#[tokio::test]
async fn upgraded_streams_pass_through_byte_for_byte() {
    let (server, _client) = setup().await;
    let mut roots = rustls::RootCertStore::empty();
    for c in certs_from_pem("ca", &server.state().config.certs.ca_pem).unwrap() {
        roots.add(c).unwrap();
    }
    let config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tcp = TcpStream::connect(server.addr()).await.unwrap();
    let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(
            rustls_pki_types::ServerName::try_from("127.0.0.1").unwrap(),
            tcp,
        )
        .await
        .unwrap();
    let request = format!(
        "POST /api/v1/namespaces/default/pods/web/exec?command=ls&command=-l&container=c&stdout=true&stderr=true HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: v4.channel.k8s.io\r\nContent-Length: 0\r\n\r\n",
        server.admin_token()
    );
    tls.write_all(request.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    let read = async {
        let mut buf = [0u8; 512];
        loop {
            let n = tls.read(&mut buf).await.unwrap();
            got.extend_from_slice(&buf[..n]);
            if String::from_utf8_lossy(&got).contains("command=-l\n") {
                break;
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(10), read)
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&got).to_lowercase();
    assert!(text.starts_with("http/1.1 101"), "{text}");
    assert!(
        text.contains("x-stream-protocol-version: v4.channel.k8s.io"),
        "{text}"
    );
    assert!(
        text.contains("/exec/default/web/c?output=1&error=1&command=ls&command=-l\n"),
        "{text}"
    );
    tls.write_all(b"\x80\x03\x00\x06binary").await.unwrap();
    let mut echo = [0u8; 10];
    tokio::time::timeout(Duration::from_secs(10), tls.read_exact(&mut echo))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&echo, b"\x80\x03\x00\x06binary");
}
