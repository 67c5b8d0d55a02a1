//! The embedded API server: one simulated cluster's control plane.
//!
//! It serves the Kubernetes REST API over HTTP/1.1 (TLS by default) from an in-memory store,
//! with the semantics clients depend on (see `store`, `rest`, `watch`), to kube-rs and to the
//! real `kubectl`. What it simplifies is listed in `docs/sim.md`.

mod admission;
mod client;
pub mod controllers;
pub mod discovery;
pub mod errors;
mod http;
pub mod meta;
mod metrics;
pub mod patch;
mod proto_schema;
pub mod protobuf;
mod proxy;
pub mod request;
pub mod resources;
mod rest;
pub mod selectors;
pub mod store;
mod strategy;
pub mod table;
mod watch;

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::certs::{Ca, CertError, Issued};
use store::Store;

/// Configuration of one API server.
#[derive(Clone, Debug)]
pub struct ApiServerConfig {
    /// Cluster name (kubeconfig cluster and context names, the CA's name).
    pub name: String,
    /// Where to listen; port 0 picks a free one.
    pub listen: SocketAddr,
    /// Serve HTTPS (default) or plain HTTP.
    pub tls: bool,
    /// Service ClusterIP range: base address and prefix length.
    pub service_cidr: (Ipv4Addr, u8),
    /// How many changes the watch history keeps (older resourceVersions get 410).
    pub watch_history: usize,
    /// The largest request body accepted (the real server's limit is 3 MiB).
    pub max_body_bytes: usize,
    /// The Kubernetes version reported by `/version` and on nodes.
    pub git_version: String,
    /// Which built-in control loops run.
    pub controllers: controllers::Controllers,
}

impl Default for ApiServerConfig {
    fn default() -> Self {
        Self {
            name: "sim".to_owned(),
            listen: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0),
            tls: true,
            service_cidr: (Ipv4Addr::new(10, 96, 0, 0), 16),
            watch_history: 200_000,
            max_body_bytes: 3 * 1024 * 1024,
            git_version: "v1.33.4-sim".to_owned(),
            controllers: controllers::Controllers::default(),
        }
    }
}

/// Starting the API server failed.
#[derive(Debug, thiserror::Error)]
pub enum ApiServerError {
    /// The listen address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Certificates could not be made.
    #[error(transparent)]
    Cert(#[from] CertError),
}

/// Who made a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UserInfo {
    /// User name.
    pub username: String,
    /// UID, if any.
    pub uid: String,
    /// Groups (always including `system:authenticated`).
    pub groups: Vec<String>,
}

/// Shared state of a running API server.
#[derive(Debug)]
pub struct State {
    /// Its configuration.
    pub config: ApiServerConfig,
    /// Its objects.
    pub store: Store,
    /// The cluster CA.
    pub ca: Ca,
    /// The client certificate it presents to kubelets (`system:masters`, like kubeadm's
    /// `apiserver-kubelet-client`).
    pub kubelet_client: Issued,
    /// The address clients reach it at.
    pub url: String,
    tokens: Mutex<HashMap<String, UserInfo>>,
    metrics: metrics::MetricsCache,
    extenders: Mutex<Vec<controllers::SchedulerExtender>>,
    /// False during a simulated outage: every request gets 503 and watches end.
    available: tokio::sync::watch::Sender<bool>,
}

impl State {
    /// The user a bearer token belongs to.
    pub fn user_for_token(&self, token: &str) -> Option<UserInfo> {
        self.tokens.lock().ok()?.get(token).cloned()
    }

    /// Whether the server answers (false during a simulated outage).
    pub fn available(&self) -> bool {
        *self.available.borrow()
    }

    /// Resolves when a simulated outage begins.
    pub(crate) async fn outage(&self) {
        let mut rx = self.available.subscribe();
        let _ = rx.wait_for(|up| !*up).await;
    }

    /// The scheduler extenders in use.
    pub fn scheduler_extenders(&self) -> Vec<controllers::SchedulerExtender> {
        self.extenders.lock().map(|e| e.clone()).unwrap_or_default()
    }

    /// Issues a new bearer token for a user (TokenRequest, test users).
    pub fn issue_token(&self, user: UserInfo) -> String {
        let token = format!(
            "{}.{}",
            meta::new_uid().replace('-', ""),
            meta::random_suffix(16)
        );
        if let Ok(mut tokens) = self.tokens.lock() {
            tokens.insert(token.clone(), user);
        }
        token
    }
}

/// A running API server. Dropping it stops it.
#[derive(Debug)]
pub struct ApiServer {
    state: Arc<State>,
    addr: SocketAddr,
    admin_token: String,
    admin_cert: Issued,
    stop: CancellationToken,
}

impl ApiServer {
    /// Starts an API server with the default namespaces and the `kubernetes` Service.
    pub async fn start(config: ApiServerConfig) -> Result<Self, ApiServerError> {
        let listener =
            TcpListener::bind(config.listen)
                .await
                .map_err(|source| ApiServerError::Bind {
                    addr: config.listen,
                    source,
                })?;
        let addr = listener
            .local_addr()
            .map_err(|source| ApiServerError::Bind {
                addr: config.listen,
                source,
            })?;
        let ca = Ca::new(&format!("{}-ca", config.name))?;
        let mut sans = vec![
            "localhost".to_owned(),
            "127.0.0.1".to_owned(),
            "kubernetes".to_owned(),
            "kubernetes.default.svc".to_owned(),
        ];
        if !addr.ip().is_loopback() && !addr.ip().is_unspecified() {
            sans.push(addr.ip().to_string());
        }
        let serving = ca.issue_server("kube-apiserver", &sans)?;
        let tls = if config.tls {
            Some(crate::certs::server_config(&serving, ca.cert_pem())?)
        } else {
            None
        };
        let kubelet_client =
            ca.issue_client("kube-apiserver-kubelet-client", Some("system:masters"))?;
        let admin_cert = ca.issue_client("kubernetes-admin", Some("system:masters"))?;
        let host = if addr.ip().is_unspecified() {
            IpAddr::V4(Ipv4Addr::LOCALHOST)
        } else {
            addr.ip()
        };
        let scheme = if config.tls { "https" } else { "http" };
        let url = format!("{scheme}://{}", SocketAddr::new(host, addr.port()));
        let extenders = config.controllers.scheduler_extenders.clone();
        let state = Arc::new(State {
            store: Store::new(resources::RESOURCES.len(), config.watch_history),
            config,
            ca,
            kubelet_client,
            url,
            tokens: Mutex::new(HashMap::new()),
            metrics: metrics::MetricsCache::default(),
            extenders: Mutex::new(extenders),
            available: tokio::sync::watch::Sender::new(true),
        });
        let admin_token = state.issue_token(UserInfo {
            username: "kubernetes-admin".into(),
            uid: String::new(),
            groups: vec!["system:masters".into(), "system:authenticated".into()],
        });
        strategy::bootstrap(&state);
        let stop = CancellationToken::new();
        controllers::start(&state, &stop);
        tokio::spawn(http::serve(listener, tls, state.clone(), stop.clone()));
        Ok(Self {
            state,
            addr,
            admin_token,
            admin_cert,
            stop,
        })
    }

    /// Replaces the scheduler extenders (e.g. once an extender started by the caller listens).
    pub fn set_scheduler_extenders(&self, extenders: Vec<controllers::SchedulerExtender>) {
        if let Ok(mut e) = self.state.extenders.lock() {
            *e = extenders;
        }
    }

    /// Simulates an outage (`false`): every request is answered 503 and open watches end,
    /// until set back to `true`. The built-in control loops keep running.
    pub fn set_available(&self, available: bool) {
        self.state.available.send_replace(available);
    }

    /// The base URL (`https://127.0.0.1:PORT`).
    pub fn url(&self) -> &str {
        &self.state.url
    }

    /// The listening address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Shared state, for in-process controllers.
    pub fn state(&self) -> &Arc<State> {
        &self.state
    }

    /// A bearer token of a cluster administrator (`system:masters`).
    pub fn admin_token(&self) -> &str {
        &self.admin_token
    }

    /// A kubeconfig for this cluster: context `context` (current), user with the admin
    /// client certificate, and a second user `<context>-token` with the admin bearer token.
    pub fn kubeconfig(&self, context: &str) -> String {
        kubeconfig(&[self.kubeconfig_entry(context)])
    }

    /// This server as one context of a kubeconfig (see [`kubeconfig`]), administrator
    /// credentials.
    pub fn kubeconfig_entry(&self, context: &str) -> KubeconfigEntry {
        KubeconfigEntry {
            context: context.to_owned(),
            server: self.url().to_owned(),
            ca_pem: self.state.ca.cert_pem().to_owned(),
            client: Some(self.admin_cert.clone()),
            token: Some(self.admin_token.clone()),
        }
    }

    /// A kube client authenticated as the administrator.
    pub async fn client(&self) -> Result<kube::Client, kube::Error> {
        client_from_kubeconfig(&self.kubeconfig("admin")).await
    }

    /// Stops serving.
    pub fn stop(&self) {
        self.stop.cancel();
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// A client from kubeconfig text (its current context).
pub async fn client_from_kubeconfig(kubeconfig: &str) -> Result<kube::Client, kube::Error> {
    let parsed =
        kube::config::Kubeconfig::from_yaml(kubeconfig).map_err(kube::Error::InferKubeconfig)?;
    let config = kube::Config::from_custom_kubeconfig(parsed, &Default::default())
        .await
        .map_err(kube::Error::InferKubeconfig)?;
    kube::Client::try_from(config)
}

/// One cluster of a kubeconfig.
#[derive(Clone, Debug)]
pub struct KubeconfigEntry {
    /// Context (and cluster) name.
    pub context: String,
    /// Server URL.
    pub server: String,
    /// CA certificate.
    pub ca_pem: String,
    /// Client certificate of the context's user.
    pub client: Option<Issued>,
    /// Bearer token, as a second user `<context>-token` (or the only one without a cert).
    pub token: Option<String>,
}

/// A kubeconfig (YAML) with one context per entry; the first is current.
pub fn kubeconfig(entries: &[KubeconfigEntry]) -> String {
    let mut clusters = String::new();
    let mut contexts = String::new();
    let mut users = String::new();
    for e in entries {
        let c = &e.context;
        clusters += &format!(
            "- name: {c}\n  cluster:\n    server: {}\n    certificate-authority-data: {}\n",
            e.server,
            B64.encode(&e.ca_pem)
        );
        let main_user = if e.client.is_some() {
            c.clone()
        } else {
            format!("{c}-token")
        };
        contexts += &format!("- name: {c}\n  context:\n    cluster: {c}\n    user: {main_user}\n");
        if let Some(cert) = &e.client {
            users += &format!(
                "- name: {c}\n  user:\n    client-certificate-data: {}\n    client-key-data: {}\n",
                B64.encode(&cert.cert_pem),
                B64.encode(&cert.key_pem)
            );
        }
        if let Some(token) = &e.token {
            users += &format!("- name: {c}-token\n  user:\n    token: {token}\n");
        }
    }
    let current = entries
        .first()
        .map(|e| e.context.as_str())
        .unwrap_or_default();
    format!(
        "apiVersion: v1\nkind: Config\npreferences: {{}}\ncurrent-context: {current}\nclusters:\n{clusters}contexts:\n{contexts}users:\n{users}"
    )
}
