//! An HTTPS server on loopback that plays the API server for kubectl (pod lookup, discovery,
//! the exec/attach/portforward subresources) and the kubelet for kube-rs' `kubelet-debug`
//! client, and hands every upgrade to the crate's serve functions.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tensile_kubelet::{
    AttachRequest, ExecRequest, PodRef, PortForwardUpgrade, RemoteCommandUpgrade, StreamOptions,
    StreamingConfig, command_from_query, ports_from_query, serve_attach, serve_exec,
    serve_portforward,
};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use super::backend::FakeBackend;

/// One served streaming request: route kind and the subprotocol answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Served {
    pub kind: String,
    pub transport: String,
    pub protocol: Option<String>,
}

pub struct Front {
    pub addr: SocketAddr,
    pub backend: Arc<FakeBackend>,
    pub served: Arc<Mutex<Vec<Served>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Front {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Front {
    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    pub fn served(&self) -> Vec<Served> {
        self.served.lock().unwrap().clone()
    }

    pub async fn start() -> Self {
        Self::start_with(StreamingConfig::default()).await
    }

    pub async fn start_with(config: StreamingConfig) -> Self {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let cert = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into(), "localhost".into()])
            .unwrap();
        let key = rustls_pki_types::PrivateKeyDer::Pkcs8(cert.signing_key.serialize_der().into());
        let mut tls = rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(vec![cert.cert.der().clone()], key)
            .unwrap();
        // Upgrades need HTTP/1.1; clients must not pick h2.
        tls.alpn_protocols = vec![b"http/1.1".to_vec()];
        let acceptor = TlsAcceptor::from(Arc::new(tls));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let backend = FakeBackend::new();
        let served = Arc::new(Mutex::new(Vec::new()));
        let ctx = Arc::new(Ctx {
            backend: Arc::clone(&backend),
            served: Arc::clone(&served),
            config,
        });
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                let acceptor = acceptor.clone();
                let ctx = Arc::clone(&ctx);
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let svc = service_fn(move |req| {
                        let ctx = Arc::clone(&ctx);
                        async move { Ok::<_, Infallible>(ctx.handle(req)) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tls), svc)
                        .with_upgrades()
                        .await;
                });
            }
        });
        Self {
            addr,
            backend,
            served,
            task,
        }
    }
}

struct Ctx {
    backend: Arc<FakeBackend>,
    served: Arc<Mutex<Vec<Served>>>,
    config: StreamingConfig,
}

fn text(status: StatusCode, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    r
}

fn json(body: serde_json::Value) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body.to_string())));
    r.headers_mut()
        .insert("content-type", "application/json".parse().unwrap());
    r
}

fn pod_json(ns: &str, name: &str) -> serde_json::Value {
    serde_json::json!({
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {"name": name, "namespace": ns, "uid": "0d5c6b5e-1111-2222-3333-444455556666"},
        "spec": {"containers": [{"name": "main", "image": "busybox"}], "nodeName": "virtual"},
        "status": {"phase": "Running", "containerStatuses": [{
            "name": "main", "ready": true, "restartCount": 0, "image": "busybox", "imageID": "",
            "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}
        }]}
    })
}

/// The stream request a path names, API-server style or kubelet style.
enum Target {
    Exec {
        pod: PodRef,
        container: Option<String>,
    },
    Attach {
        pod: PodRef,
        container: Option<String>,
    },
    PortForward {
        pod: PodRef,
    },
}

fn parse_target(path: &str) -> Option<Target> {
    let p: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let pod = |ns: &str, name: &str, uid: Option<&str>| PodRef {
        namespace: ns.to_string(),
        name: name.to_string(),
        uid: uid.map(str::to_string),
    };
    match p.as_slice() {
        ["api", "v1", "namespaces", ns, "pods", name, "exec"] => Some(Target::Exec {
            pod: pod(ns, name, None),
            container: None,
        }),
        ["api", "v1", "namespaces", ns, "pods", name, "attach"] => Some(Target::Attach {
            pod: pod(ns, name, None),
            container: None,
        }),
        ["api", "v1", "namespaces", ns, "pods", name, "portforward"] => Some(Target::PortForward {
            pod: pod(ns, name, None),
        }),
        ["exec", ns, name, container] => Some(Target::Exec {
            pod: pod(ns, name, None),
            container: Some(container.to_string()),
        }),
        ["exec", ns, name, uid, container] => Some(Target::Exec {
            pod: pod(ns, name, Some(uid)),
            container: Some(container.to_string()),
        }),
        ["attach", ns, name, container] => Some(Target::Attach {
            pod: pod(ns, name, None),
            container: Some(container.to_string()),
        }),
        ["portForward", ns, name] => Some(Target::PortForward {
            pod: pod(ns, name, None),
        }),
        ["portForward", ns, name, uid] => Some(Target::PortForward {
            pod: pod(ns, name, Some(uid)),
        }),
        _ => None,
    }
}

impl Ctx {
    fn handle(self: Arc<Self>, mut req: Request<Incoming>) -> Response<Full<Bytes>> {
        let path = req.uri().path().to_string();
        let query = req.uri().query().unwrap_or_default().to_string();
        if let Some(target) = parse_target(&path) {
            return match self.stream(&mut req, target, &query) {
                Ok(r) => r,
                Err(e) => {
                    let r = e.response();
                    let (parts, body) = r.into_parts();
                    Response::from_parts(parts, Full::new(Bytes::from(body)))
                }
            };
        }
        let p: Vec<&str> = path.trim_start_matches('/').split('/').collect();
        match (req.method(), p.as_slice()) {
            (&Method::GET, ["api", "v1", "namespaces", ns, "pods", name]) => {
                json(pod_json(ns, name))
            }
            (&Method::GET, ["api"]) => json(serde_json::json!({
                "kind": "APIVersions", "versions": ["v1"],
                "serverAddressByClientCIDRs": [
                    {"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}
                ]
            })),
            (&Method::GET, ["api", "v1"]) => json(serde_json::json!({
                "kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "v1",
                "resources": [
                    {"name": "pods", "singularName": "pod", "namespaced": true, "kind": "Pod",
                     "verbs": ["get", "list"], "shortNames": ["po"]},
                    {"name": "pods/attach", "singularName": "", "namespaced": true,
                     "kind": "PodAttachOptions", "verbs": ["create", "get"]},
                    {"name": "pods/exec", "singularName": "", "namespaced": true,
                     "kind": "PodExecOptions", "verbs": ["create", "get"]},
                    {"name": "pods/portforward", "singularName": "", "namespaced": true,
                     "kind": "PodPortForwardOptions", "verbs": ["create", "get"]}
                ]
            })),
            (&Method::GET, ["apis"]) => {
                json(serde_json::json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": []}))
            }
            (&Method::GET, ["version"]) => json(serde_json::json!({
                "major": "1", "minor": "32", "gitVersion": "v1.32.4", "platform": "linux/amd64"
            })),
            _ => text(StatusCode::NOT_FOUND, "404 page not found\n"),
        }
    }

    fn record(&self, kind: &str, transport: tensile_kubelet::Transport, protocol: Option<&str>) {
        self.served.lock().unwrap().push(Served {
            kind: kind.into(),
            transport: format!("{transport:?}"),
            protocol: protocol.map(str::to_string),
        });
    }

    fn stream(
        self: &Arc<Self>,
        req: &mut Request<Incoming>,
        target: Target,
        query: &str,
    ) -> Result<Response<Full<Bytes>>, tensile_kubelet::UpgradeError> {
        let container_q = form_urlencoded::parse(query.as_bytes())
            .find(|(k, _)| k == "container")
            .map(|(_, v)| v.into_owned());
        let this = Arc::clone(self);
        let response = match target {
            Target::Exec { pod, container } => {
                let upgrade = RemoteCommandUpgrade::negotiate(req.headers())?;
                let options = StreamOptions::from_query(query)?;
                let command = command_from_query(query)?;
                let container = container.or(container_q).unwrap_or_else(|| "main".into());
                let request = ExecRequest {
                    pod,
                    container,
                    command,
                    options,
                };
                self.record("exec", upgrade.transport(), upgrade.protocol());
                let response = upgrade.response();
                let on_upgrade = hyper::upgrade::on(req);
                tokio::spawn(async move {
                    let Ok(upgraded) = on_upgrade.await else {
                        return;
                    };
                    let io = TokioIo::new(upgraded);
                    let backend = Arc::clone(&this.backend);
                    if let Err(e) = serve_exec(&upgrade, io, request, backend, &this.config).await {
                        eprintln!("exec: {e}");
                    }
                });
                response
            }
            Target::Attach { pod, container } => {
                let upgrade = RemoteCommandUpgrade::negotiate(req.headers())?;
                let options = StreamOptions::from_query(query)?;
                let container = container.or(container_q).unwrap_or_else(|| "main".into());
                let request = AttachRequest {
                    pod,
                    container,
                    options,
                };
                self.record("attach", upgrade.transport(), upgrade.protocol());
                let response = upgrade.response();
                let on_upgrade = hyper::upgrade::on(req);
                tokio::spawn(async move {
                    let Ok(upgraded) = on_upgrade.await else {
                        return;
                    };
                    let io = TokioIo::new(upgraded);
                    let backend = Arc::clone(&this.backend);
                    if let Err(e) = serve_attach(&upgrade, io, request, backend, &this.config).await
                    {
                        eprintln!("attach: {e}");
                    }
                });
                response
            }
            Target::PortForward { pod } => {
                let ports = ports_from_query(query)?;
                let upgrade = PortForwardUpgrade::negotiate(req.headers(), &ports)?;
                self.record("portforward", transport_of(&upgrade), upgrade.protocol());
                let response = upgrade.response();
                let on_upgrade = hyper::upgrade::on(req);
                tokio::spawn(async move {
                    let Ok(upgraded) = on_upgrade.await else {
                        return;
                    };
                    let io = TokioIo::new(upgraded);
                    let backend = Arc::clone(&this.backend);
                    let r =
                        serve_portforward(&upgrade, io, pod, ports, backend, &this.config).await;
                    if let Err(e) = r {
                        eprintln!("portforward: {e}");
                    }
                });
                response
            }
        };
        Ok(response.map(|()| Full::new(Bytes::new())))
    }
}

fn transport_of(u: &PortForwardUpgrade) -> tensile_kubelet::Transport {
    match u.mode() {
        tensile_kubelet::PortForwardMode::Spdy => tensile_kubelet::Transport::Spdy,
        _ => tensile_kubelet::Transport::WebSocket,
    }
}
