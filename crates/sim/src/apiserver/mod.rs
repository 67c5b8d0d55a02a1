//! The embedded API server: one simulated cluster's control plane.
//!
//! It serves the Kubernetes REST API over HTTP/1.1 (TLS by default) from an in-memory store,
//! with the semantics clients depend on (see `store`, `rest`, `watch`), to kube-rs and to the
//! real `kubectl`. What it simplifies is listed in `docs/sim.md`.

mod admission;
mod apply;
mod client;
pub mod controllers;
pub mod discovery;
pub mod errors;
mod http;
mod kinds;
pub mod meta;
mod metrics;
mod openapi;
pub mod patch;
mod pem;
mod proto_schema;
pub mod protobuf;
pub(crate) mod proxy;
pub use proxy::CertNotVerified;
pub mod rbac;
pub mod request;
pub mod resources;
mod rest;
mod scale;
mod schemas;
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
use k8s_openapi::jiff::Timestamp;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

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
    /// The most changes the watch history keeps; it keeps those of the last 75 s (at least
    /// 100), as kube-apiserver's watch cache does. Older resourceVersions get 410.
    pub watch_history: usize,
    /// The largest request body accepted (the real server's limit is 3 MiB).
    pub max_body_bytes: usize,
    /// The Kubernetes version reported by `/version` and on nodes.
    pub git_version: String,
    /// Which built-in control loops run.
    pub controllers: controllers::Controllers,
    /// Let `nodes/proxy` reach kubelets on loopback addresses, which a real API server refuses
    /// (`400 address not allowed`). Only for a sandbox whose nodes all live on loopback.
    pub proxy_to_loopback: bool,
    /// Its certificates; the server makes none (see [`ServerCerts`]).
    pub certs: ServerCerts,
}

/// A certificate and its private key, PEM encoded.
#[derive(Clone, Debug, Default)]
pub struct Issued {
    /// The certificate.
    pub cert_pem: String,
    /// Its private key (PKCS#8).
    pub key_pem: String,
}

/// The certificates an API server is given, as kubeadm gives kube-apiserver its files: the
/// cluster CA that client certificates are verified against (`--client-ca-file`), the serving
/// certificate (`--tls-cert-file`), the client certificate presented to kubelets
/// (`--kubelet-client-certificate`, `system:masters`) and an administrator's, which
/// [`ApiServer::kubeconfig`] carries. The test PKI that issues them is
/// `tensile_testenv::certs`, which issues those of real control planes too.
#[derive(Clone, Debug, Default)]
pub struct ServerCerts {
    /// The cluster CA certificate (also `kube-root-ca.crt` in every namespace).
    pub ca_pem: String,
    /// The serving certificate: valid for `localhost`, `127.0.0.1`, `kubernetes`,
    /// `kubernetes.default.svc` and a non-loopback listen address.
    pub serving: Issued,
    /// The client certificate presented to kubelets.
    pub kubelet_client: Issued,
    /// An administrator's client certificate (`system:masters`).
    pub admin: Issued,
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
            proxy_to_loopback: false,
            certs: ServerCerts::default(),
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
    /// The TLS configuration could not be made of the certificates given.
    #[error("TLS configuration: {0}")]
    Tls(String),
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

/// The identity of a ServiceAccount's tokens.
pub fn service_account_user(namespace: &str, name: &str, uid: String) -> UserInfo {
    UserInfo {
        username: rbac::service_account_username(namespace, name),
        uid,
        groups: vec![
            "system:serviceaccounts".into(),
            format!("system:serviceaccounts:{namespace}"),
            "system:authenticated".into(),
        ],
    }
}

/// Shared state of a running API server.
#[derive(Debug)]
pub struct State {
    /// Its configuration.
    pub config: ApiServerConfig,
    /// Its objects.
    pub store: Store,
    /// The address clients reach it at.
    pub url: String,
    tokens: Mutex<HashMap<String, Token>>,
    metrics: metrics::MetricsCache,
    extenders: Mutex<Vec<controllers::SchedulerExtender>>,
    /// Kept-alive connections to admission webhooks.
    webhook_connections: client::Connections,
    /// False during a simulated outage: every request gets 503 and watches end.
    available: tokio::sync::watch::Sender<bool>,
    /// The RBAC policy, with the store's last change of RBAC objects it was built at.
    policy: Mutex<Option<(u64, Arc<rbac::Policy>)>>,
    /// Every request the authorizer refused, oldest first.
    denials: Mutex<Vec<rbac::Denial>>,
}

/// The audience of tokens made for the API server itself (its `--api-audiences`, which default
/// to its `--service-account-issuer`).
pub const API_AUDIENCE: &str = "https://kubernetes.default.svc";

/// What a bearer token stands for.
#[derive(Clone, Debug)]
struct Token {
    user: UserInfo,
    audiences: Vec<String>,
    /// `None`: never expires (test users, the administrator).
    expires: Option<Timestamp>,
    /// The pod it is bound to (namespace, name, uid): it is valid only while that pod exists.
    bound_pod: Option<(String, String, String)>,
}

/// An authenticated token: who, for which of the audiences asked, and the bound pod's name and
/// uid when it is bound to one.
#[derive(Clone, Debug)]
pub struct Authenticated {
    /// The user.
    pub user: UserInfo,
    /// The audiences asked for that the token carries.
    pub audiences: Vec<String>,
    /// The bound pod (name, uid).
    pub pod: Option<(String, String)>,
}

impl State {
    /// A state with the objects every cluster starts with and nothing serving it: strategies
    /// are unit tested against it.
    #[cfg(test)]
    pub(crate) fn for_tests() -> Self {
        let config = ApiServerConfig::default();
        let state = Self {
            store: Store::new(resources::RESOURCES.len(), config.watch_history),
            config,
            url: String::new(),
            tokens: Mutex::new(HashMap::new()),
            metrics: metrics::MetricsCache::default(),
            extenders: Mutex::new(Vec::new()),
            webhook_connections: client::Connections::default(),
            available: tokio::sync::watch::Sender::new(true),
            policy: Mutex::new(None),
            denials: Mutex::new(Vec::new()),
        };
        strategy::bootstrap(&state);
        state
    }

    /// The user a bearer token of the API server's audience belongs to.
    pub fn user_for_token(&self, token: &str) -> Option<UserInfo> {
        self.authenticate(token, &[]).ok().map(|a| a.user)
    }

    /// Authenticates `token` for `audiences` (none: the API server's), as a TokenReview does:
    /// it must carry one of them, be unexpired, and its bound pod must still exist.
    pub fn authenticate(&self, token: &str, audiences: &[String]) -> Result<Authenticated, String> {
        let invalid = || "invalid bearer token".to_owned();
        let known = self
            .tokens
            .lock()
            .ok()
            .and_then(|t| t.get(token).cloned())
            .ok_or_else(invalid)?;
        let wanted: Vec<String> = if audiences.is_empty() {
            vec![API_AUDIENCE.to_owned()]
        } else {
            audiences.to_vec()
        };
        let matched: Vec<String> = wanted
            .into_iter()
            .filter(|a| known.audiences.contains(a))
            .collect();
        if matched.is_empty() {
            return Err("token audiences is invalid for the target audiences".to_owned());
        }
        if known.expires.is_some_and(|e| e <= Timestamp::now()) {
            return Err("service account token has expired".to_owned());
        }
        // A service account's token is valid only while that account (the same object, by
        // uid) exists, as kube-apiserver checks: deleting the account revokes its tokens.
        if let Some(rest) = known.user.username.strip_prefix("system:serviceaccount:")
            && !known.user.uid.is_empty()
            && let Some((ns, name)) = rest.split_once(':')
        {
            let live = self
                .store
                .get(
                    *resources::ids::SERVICEACCOUNTS,
                    &store::ObjKey::new(ns, name),
                )
                .is_some_and(|a| meta::meta_str(&a.object, "uid") == Some(known.user.uid.as_str()));
            if !live {
                return Err(format!(
                    "service account {ns}/{name} ({}) the token was issued for no longer exists",
                    known.user.uid
                ));
            }
        }
        let pod = match &known.bound_pod {
            Some((ns, name, uid)) => {
                let live = self
                    .store
                    .get(*resources::ids::PODS, &store::ObjKey::new(ns, name))
                    .is_some_and(|p| meta::meta_str(&p.object, "uid") == Some(uid.as_str()));
                if !live {
                    return Err(format!(
                        "pod {name} ({uid}) the token is bound to no longer exists"
                    ));
                }
                Some((name.clone(), uid.clone()))
            }
            None => None,
        };
        Ok(Authenticated {
            user: known.user,
            audiences: matched,
            pod,
        })
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

    /// The RBAC policy of the stored roles and bindings, rebuilt only after one of them
    /// changed.
    pub fn rbac_policy(&self) -> Arc<rbac::Policy> {
        let ids = [
            *resources::ids::ROLES,
            *resources::ids::CLUSTER_ROLES,
            *resources::ids::ROLE_BINDINGS,
            *resources::ids::CLUSTER_ROLE_BINDINGS,
        ];
        let changed = ids
            .iter()
            .map(|id| self.store.changed_at(*id))
            .max()
            .unwrap_or(0);
        if let Ok(cache) = self.policy.lock()
            && let Some((at, policy)) = cache.as_ref()
            && *at == changed
        {
            return policy.clone();
        }
        // Built from a moment at or after `changed`: a write in between only makes the next
        // call rebuild again.
        fn objects<T: serde::de::DeserializeOwned>(state: &State, id: resources::ResId) -> Vec<T> {
            let (entries, _, _) = state.store.list(id, None, None, None, |_| true);
            entries
                .iter()
                .filter_map(|e| serde_json::from_value((*e.object).clone()).ok())
                .collect()
        }
        let policy = Arc::new(rbac::Policy::new(
            objects(self, ids[0]),
            objects(self, ids[1]),
            objects(self, ids[2]),
            objects(self, ids[3]),
        ));
        if let Ok(mut cache) = self.policy.lock() {
            *cache = Some((changed, policy.clone()));
        }
        policy
    }

    /// Decides a request of a user: `system:masters` without looking at any policy, everyone
    /// else by RBAC.
    pub fn authorize(&self, user: &UserInfo, action: &rbac::Action) -> rbac::Decision {
        if rbac::is_privileged(&user.groups) {
            return rbac::Decision {
                allowed: true,
                reason: String::new(),
            };
        }
        self.rbac_policy()
            .authorize(&user.username, &user.groups, action)
    }

    /// Records a refused request.
    pub(crate) fn record_denial(&self, denial: rbac::Denial) {
        tracing::debug!(%denial, "forbidden");
        if let Ok(mut d) = self.denials.lock() {
            d.push(denial);
        }
    }

    /// Every request refused so far, oldest first.
    pub fn denials(&self) -> Vec<rbac::Denial> {
        self.denials.lock().map(|d| d.clone()).unwrap_or_default()
    }

    /// Issues a new bearer token for a user, of the API server's audience, that does not
    /// expire (test users, the administrator).
    pub fn issue_token(&self, user: UserInfo) -> String {
        self.issue_bound_token(user, vec![API_AUDIENCE.to_owned()], None, None)
    }

    /// Issues a token for `audiences`, valid until `expires` and while `bound_pod` (namespace,
    /// name, uid) exists (TokenRequest).
    pub(crate) fn issue_bound_token(
        &self,
        user: UserInfo,
        audiences: Vec<String>,
        expires: Option<Timestamp>,
        bound_pod: Option<(String, String, String)>,
    ) -> String {
        // A token with an expiry is shaped as kube-apiserver's are, a JWT whose claims say
        // whose it is and when it was issued and expires (clients read them to schedule a
        // renewal); it is checked against this table, never by its signature.
        let token = match expires {
            Some(exp) => {
                let b64 = |v: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v);
                let now = Timestamp::now().as_second();
                let claims = serde_json::json!({
                    "aud": audiences,
                    "exp": exp.as_second(),
                    "iat": now,
                    "nbf": now,
                    "iss": API_AUDIENCE,
                    "jti": meta::new_uid(),
                    "sub": user.username,
                });
                format!(
                    "{}.{}.{}",
                    b64(br#"{"alg":"RS256","kid":"tensile-sim"}"#),
                    b64(claims.to_string().as_bytes()),
                    meta::random_suffix(43)
                )
            }
            None => format!(
                "{}.{}",
                meta::new_uid().replace('-', ""),
                meta::random_suffix(16)
            ),
        };
        if let Ok(mut tokens) = self.tokens.lock() {
            tokens.insert(
                token.clone(),
                Token {
                    user,
                    audiences,
                    expires,
                    bound_pod,
                },
            );
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
        let tls = if config.tls {
            // Client certificates are asked for, not required: bearer-token clients connect
            // too. Clients that upgrade the connection (exec, attach, port-forward) ask for
            // HTTP/1.1.
            let certs = &config.certs;
            Some(
                tensile_runtime::tls::server_config(
                    &certs.serving.cert_pem,
                    &certs.serving.key_pem,
                    Some((&certs.ca_pem, tensile_runtime::tls::ClientCerts::Optional)),
                    &[b"h2", b"http/1.1"],
                )
                .map_err(ApiServerError::Tls)?,
            )
        } else {
            None
        };
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
            url,
            tokens: Mutex::new(HashMap::new()),
            metrics: metrics::MetricsCache::default(),
            extenders: Mutex::new(extenders),
            webhook_connections: client::Connections::default(),
            available: tokio::sync::watch::Sender::new(true),
            policy: Mutex::new(None),
            denials: Mutex::new(Vec::new()),
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

    /// Issues a bearer token for any user; RBAC decides what it may do (unless its groups
    /// include `system:masters`). `system:authenticated` is added to the groups if missing.
    pub fn issue_token(&self, mut user: UserInfo) -> String {
        if !user.groups.iter().any(|g| g == "system:authenticated") {
            user.groups.push("system:authenticated".into());
        }
        self.state.issue_token(user)
    }

    /// Issues a bearer token of a ServiceAccount, as a TokenRequest (`kubectl create token`)
    /// would: user `system:serviceaccount:<namespace>:<name>`, groups
    /// `system:serviceaccounts`, `system:serviceaccounts:<namespace>`, `system:authenticated`.
    /// The ServiceAccount need not exist (its uid is used when it does).
    pub fn service_account_token(&self, namespace: &str, name: &str) -> String {
        let uid = self
            .state
            .store
            .get(
                *resources::ids::SERVICEACCOUNTS,
                &store::ObjKey::new(namespace, name),
            )
            .and_then(|e| meta::meta_str(&e.object, "uid").map(str::to_owned))
            .unwrap_or_default();
        self.state
            .issue_token(service_account_user(namespace, name, uid))
    }

    /// A kubeconfig (context `context`) whose only user authenticates with `token`.
    pub fn kubeconfig_with_token(&self, context: &str, token: &str) -> String {
        kubeconfig(&[KubeconfigEntry {
            context: context.to_owned(),
            server: self.url().to_owned(),
            ca_pem: self.state.config.certs.ca_pem.clone(),
            client: None,
            token: Some(token.to_owned()),
        }])
    }

    /// A kube client authenticated with a bearer token (see [`ApiServer::issue_token`],
    /// [`ApiServer::service_account_token`]).
    pub async fn client_with_token(&self, token: &str) -> Result<kube::Client, kube::Error> {
        client_from_kubeconfig(&self.kubeconfig_with_token("token", token)).await
    }

    /// Every request the RBAC authorizer refused since the server started, oldest first. A
    /// scenario run under least-privilege identities asserts this is empty.
    pub fn forbidden(&self) -> Vec<rbac::Denial> {
        self.state.denials()
    }

    /// Forgets the refused requests recorded so far.
    pub fn clear_forbidden(&self) {
        if let Ok(mut d) = self.state.denials.lock() {
            d.clear();
        }
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
            ca_pem: self.state.config.certs.ca_pem.clone(),
            client: Some(self.state.config.certs.admin.clone()),
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
