//! Records real traffic for the fuzz targets' seed corpora (docs/security.md, "Fuzzing").
//!
//! One TLS server (a self-signed certificate, written to `<dir>/cert.pem`) that plays:
//! - a kubelet: `/exec`, `/attach`, `/portForward`, `/containerLogs`, `/stats/summary`, ...
//!   served by the product's own `tensile_kubelet::server::handle` (authentication off) with a
//!   backend that echoes; a Node whose address and kubelet port are this server's sends it the
//!   API server's requests;
//! - enough of an API server for kubectl to exec, attach and port-forward straight to it (the
//!   WebSocket protocols, which a real API server translates to SPDY towards a kubelet);
//! - a mutating webhook (`/mutate`, allows everything) and a scheduler extender (`/filter`,
//!   `/prioritize`, `/bind`, keeps every node).
//!
//! Every connection's bytes from the client are written to `<dir>/conn-<n>.bin` when it
//! closes; webhook and extender bodies also to `<dir>/<kind>-<n>.json`.
//!
//! `cargo run -p tensile-fuzzing --example capture -- <dir> <address:port>`
#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "a command-line tool"
)]

use std::convert::Infallible;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, Uri};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tensile_fuzzing::backend::Echo;
use tensile_kubelet::server::{Context as KubeletContext, handle};
use tensile_kubelet::{Auth, ClientCert, StreamingConfig};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

type Body = UnsyncBoxBody<Bytes, io::Error>;

/// A stream that keeps a copy of every byte read from it, written to a file when dropped.
struct Recorder<T> {
    inner: T,
    seen: Vec<u8>,
    path: PathBuf,
}

impl<T> Drop for Recorder<T> {
    fn drop(&mut self) {
        if !self.seen.is_empty() {
            let _ = std::fs::write(&self.path, &self.seen);
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Recorder<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = &polled {
            let new = buf.filled().get(before..).unwrap_or_default().to_vec();
            self.seen.extend_from_slice(&new);
        }
        polled
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Recorder<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

struct Shared {
    dir: PathBuf,
    count: AtomicUsize,
    kubelet: KubeletContext,
    log: Mutex<()>,
}

impl Shared {
    fn next(&self) -> usize {
        self.count.fetch_add(1, Ordering::SeqCst)
    }

    fn save(&self, kind: &str, body: &[u8]) {
        let n = self.next();
        let _ = std::fs::write(self.dir.join(format!("{kind}-{n}.json")), body);
    }
}

fn full(body: impl Into<Bytes>) -> Body {
    Full::new(body.into())
        .map_err(|e| match e {})
        .boxed_unsync()
}

fn json_response(value: &Value) -> Response<Body> {
    let mut r = Response::new(full(value.to_string()));
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    r
}

fn pod(ns: &str, name: &str) -> Value {
    json!({
        "kind": "Pod", "apiVersion": "v1",
        "metadata": {"name": name, "namespace": ns, "uid": "00000000-0000-0000-0000-000000000001"},
        "spec": {"nodeName": "capture", "containers": [{"name": "c", "image": "busybox"}]},
        "status": {"phase": "Running", "containerStatuses": [{"name": "c", "ready": true,
            "restartCount": 0, "image": "busybox", "imageID": "", "state": {"running": {}}}]}
    })
}

/// The kubelet path of an API server's pod subresource (`/api/v1/namespaces/ns/pods/p/exec`
/// with `?container=c` is `/exec/ns/p/c`).
fn kubelet_uri(uri: &Uri) -> Option<Uri> {
    let parts: Vec<&str> = uri.path().trim_start_matches('/').split('/').collect();
    let ["api", "v1", "namespaces", ns, "pods", name, sub] = parts.as_slice() else {
        return None;
    };
    let query = uri.query().unwrap_or_default();
    let container = form_container(query);
    let path = match *sub {
        "exec" => format!("/exec/{ns}/{name}/{container}"),
        "attach" => format!("/attach/{ns}/{name}/{container}"),
        "portforward" => format!("/portForward/{ns}/{name}"),
        "log" => format!("/containerLogs/{ns}/{name}/{container}"),
        _ => return None,
    };
    format!("{path}?{query}").parse().ok()
}

fn form_container(query: &str) -> String {
    query
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == "container")
        .map_or_else(|| "c".to_owned(), |(_, v)| v.to_owned())
}

async fn serve(shared: Arc<Shared>, mut req: Request<Incoming>) -> Response<Body> {
    let path = req.uri().path().to_owned();
    {
        let _guard = shared.log.lock();
        println!("{} {}", req.method(), req.uri());
    }
    match (req.method().clone(), path.as_str()) {
        (Method::POST, "/mutate") => {
            let body = req.into_body().collect().await.map(|b| b.to_bytes());
            let body = body.unwrap_or_default();
            shared.save("admission", &body);
            let sent: Value = serde_json::from_slice(&body).unwrap_or_default();
            json_response(&json!({
                "apiVersion": sent["apiVersion"], "kind": "AdmissionReview",
                "response": {"uid": sent["request"]["uid"], "allowed": true}
            }))
        }
        (Method::POST, "/filter" | "/prioritize" | "/bind") => {
            let verb = path.trim_start_matches('/').to_owned();
            let body = req.into_body().collect().await.map(|b| b.to_bytes());
            let body = body.unwrap_or_default();
            shared.save(&format!("extender-{verb}"), &body);
            let sent: Value = serde_json::from_slice(&body).unwrap_or_default();
            let answer = match verb.as_str() {
                "filter" => json!({"Nodes": sent["Nodes"], "NodeNames": sent["NodeNames"],
                    "FailedNodes": {}, "Error": ""}),
                "prioritize" => json!([]),
                _ => json!({"Error": "the capture server binds nothing"}),
            };
            json_response(&answer)
        }
        (Method::GET, "/api") => json_response(&json!({
            "kind": "APIVersions", "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]
        })),
        (Method::GET, "/apis") => {
            json_response(&json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": []}))
        }
        (Method::GET, "/version") => json_response(&json!({
            "major": "1", "minor": "34", "gitVersion": "v1.34.4", "platform": "linux/amd64"
        })),
        (Method::GET, "/api/v1") => json_response(&json!({
            "kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "v1",
            "resources": [
                {"name": "pods", "singularName": "pod", "namespaced": true, "kind": "Pod",
                 "verbs": ["get", "list"], "shortNames": ["po"]},
                {"name": "pods/attach", "singularName": "", "namespaced": true,
                 "kind": "PodAttachOptions", "verbs": ["create", "get"]},
                {"name": "pods/exec", "singularName": "", "namespaced": true,
                 "kind": "PodExecOptions", "verbs": ["create", "get"]},
                {"name": "pods/log", "singularName": "", "namespaced": true,
                 "kind": "Pod", "verbs": ["get"]},
                {"name": "pods/portforward", "singularName": "", "namespaced": true,
                 "kind": "PodPortForwardOptions", "verbs": ["create", "get"]}
            ]
        })),
        _ => {
            if let Some(uri) = kubelet_uri(req.uri()) {
                *req.uri_mut() = uri;
            } else {
                let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
                if let ["api", "v1", "namespaces", ns, "pods", name] = parts.as_slice() {
                    return json_response(&pod(ns, name));
                }
            }
            let response = handle(&shared.kubelet, Arc::new(Echo), ClientCert::None, req).await;
            if response.status() == StatusCode::NOT_FOUND {
                eprintln!("404: {path}");
            }
            response
        }
    }
}

fn tls(dir: &Path, names: Vec<String>) -> Result<TlsAcceptor, Box<dyn std::error::Error>> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cert = rcgen::generate_simple_self_signed(names)?;
    std::fs::write(dir.join("cert.pem"), cert.cert.pem())?;
    let key = rustls_pki_types::PrivateKeyDer::Pkcs8(cert.signing_key.serialize_der().into());
    let mut config = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(vec![cert.cert.der().clone()], key)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let dir = PathBuf::from(args.next().ok_or("usage: capture <dir> <address:port>")?);
    let addr = args.next().ok_or("usage: capture <dir> <address:port>")?;
    std::fs::create_dir_all(&dir)?;
    let ip = addr
        .rsplit_once(':')
        .map_or(addr.as_str(), |(h, _)| h)
        .to_owned();
    let acceptor = tls(&dir, vec![ip, "127.0.0.1".into(), "localhost".into()])?;
    let listener = TcpListener::bind(&addr).await?;
    println!("listening on {}", listener.local_addr()?);
    let shared = Arc::new(Shared {
        dir,
        count: AtomicUsize::new(0),
        kubelet: KubeletContext {
            auth: Auth::Disabled,
            streaming: StreamingConfig::default(),
        },
        log: Mutex::new(()),
    });
    loop {
        let (tcp, _) = listener.accept().await?;
        let (acceptor, shared) = (acceptor.clone(), Arc::clone(&shared));
        tokio::spawn(async move {
            let Ok(tls) = acceptor.accept(tcp).await else {
                return;
            };
            let path = shared.dir.join(format!("conn-{}.bin", shared.next()));
            let recorded = Recorder {
                inner: tls,
                seen: Vec::new(),
                path,
            };
            let svc = service_fn(move |req| {
                let shared = Arc::clone(&shared);
                async move { Ok::<_, Infallible>(serve(shared, req).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(recorded), svc)
                .with_upgrades()
                .await;
        });
    }
}
