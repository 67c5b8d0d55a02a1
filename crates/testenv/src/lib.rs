//! `TestEnv`: N clusters for a test, a benchmark or the sandbox. Simulated in-process by
//! default: an embedded API server with its control loops and simulated nodes. With
//! `TENSILE_K8S_BIN` set, real control planes from binaries instead (see [`real`]); the
//! simulated nodes are the same either way, and tests cannot tell the difference.

#![forbid(unsafe_code)]

mod backend;
pub mod certs;
pub mod errors;
pub mod faults;
pub mod kubectl;
pub mod provisioner;
pub mod real;
pub mod real_node;
pub mod registry;
pub mod secret_file;
pub mod testhost;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

pub use backend::{Backend, BackendSpec};
use tensile_sim::apiserver::{ApiServer, ApiServerConfig, ApiServerError};
use tensile_simkubelet::{SimKubelet, SimKubeletConfig, SimKubeletError, SimNode};

/// Starting a test environment failed.
#[derive(Debug, thiserror::Error)]
pub enum TestEnvError {
    /// An API server did not start.
    #[error("starting cluster {cluster}: {source}")]
    ApiServer {
        /// Which cluster.
        cluster: String,
        /// Why.
        #[source]
        source: ApiServerError,
    },
    /// The certificates of an API server could not be issued.
    #[error("certificates of cluster {cluster}: {source}")]
    Certs {
        /// Which cluster.
        cluster: String,
        /// Why.
        #[source]
        source: certs::CertError,
    },
    /// A client could not be built.
    #[error("client for cluster {cluster}: {source}")]
    Client {
        /// Which cluster.
        cluster: String,
        /// Why.
        #[source]
        source: kube::Error,
    },
    /// The simulated nodes could not register.
    #[error("nodes of cluster {cluster}: {source}")]
    Nodes {
        /// Which cluster.
        cluster: String,
        /// Why.
        #[source]
        source: SimKubeletError,
    },
    /// No non-loopback address for the simulated kubelets.
    #[error(transparent)]
    TestHost(#[from] testhost::TestHostError),
    /// The simulated nodes of a real cluster did not become schedulable.
    #[error("nodes of cluster {cluster} not schedulable after {seconds} s: {detail}")]
    NodesNotReady {
        /// Which cluster.
        cluster: String,
        /// How long they were given.
        seconds: u64,
        /// What was last seen.
        detail: String,
    },
    /// A real control plane did not start.
    #[error("real control plane of {cluster}: {source}")]
    Real {
        /// Which cluster.
        cluster: String,
        /// Why.
        #[source]
        source: real::RealError,
    },
    /// Real nodes were asked of a simulated cluster.
    #[error(
        "cluster {cluster}: real nodes need real control planes (set TENSILE_K8S_BIN to the folder scripts/k8s-bin prints)"
    )]
    RealNodesNeedRealControlPlanes {
        /// Which cluster.
        cluster: String,
    },
    /// A real node did not start.
    #[error("cluster {cluster}: {source}")]
    RealNode {
        /// Which cluster.
        cluster: String,
        /// Why.
        #[source]
        source: real_node::RealNodeError,
    },
    /// Cluster DNS could not be installed.
    #[error("cluster {cluster}: installing CoreDNS: {source}")]
    ClusterDns {
        /// Which cluster.
        cluster: String,
        /// Why.
        #[source]
        source: kube::Error,
    },
    /// A kubeconfig could not be read or written.
    #[error("writing kubeconfig {path}: {source}")]
    Kubeconfig {
        /// Where.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// A fault could not be injected, or the cluster did not come back from it.
#[derive(Debug, thiserror::Error)]
pub enum FaultError {
    /// The simulator has no such part (it keeps its objects in memory: there is no etcd).
    #[error("cluster {cluster}: {what} exists only on real control planes (TENSILE_K8S_BIN)")]
    NotSimulated {
        /// Which cluster.
        cluster: String,
        /// The fault asked for.
        what: &'static str,
    },
    /// A process of the real control plane could not be signalled or started again.
    #[error("cluster {cluster}: {source}")]
    Real {
        /// Which cluster.
        cluster: String,
        /// Why.
        #[source]
        source: real::RealError,
    },
}

/// A scheduler configuration was not taken.
#[derive(Debug, thiserror::Error)]
pub enum SchedulerConfigError {
    /// The simulator cannot read it.
    #[error("scheduler configuration: {0}")]
    Invalid(String),
    /// The real kube-scheduler did not come back with it.
    #[error(transparent)]
    Real(#[from] real::RealError),
}

/// Shape of one cluster.
#[derive(Clone, Debug)]
pub struct ClusterSpec {
    /// Name (kubeconfig context).
    pub name: String,
    /// API server settings.
    pub apiserver: ApiServerConfig,
    /// Simulated nodes (none: a control plane only).
    pub kubelet: Option<SimKubeletConfig>,
    /// The life of the certificates a real kube-controller-manager signs for certificate
    /// requests (its default, a year, when unset); the simulator signs none.
    pub certificate_duration: Option<std::time::Duration>,
    /// Real nodes (kubelet, containerd, runc, kube-proxy; see [`real_node`]) besides the
    /// simulated ones, named `<cluster>-real-<i>`, with CoreDNS installed as cluster DNS. Real
    /// control planes only: on the simulator, asking for one is an error
    /// ([`TestEnvError::RealNodesNeedRealControlPlanes`]).
    pub real_nodes: usize,
}

impl ClusterSpec {
    /// A cluster with `nodes` nodes of 4 CPU and 8 GiB.
    pub fn new(name: impl Into<String>, nodes: usize) -> Self {
        let name = name.into();
        let kubelet = (nodes > 0).then(|| SimKubeletConfig {
            nodes: (1..=nodes)
                .map(|i| SimNode::new(format!("{name}-node-{i}"), "4", "8Gi"))
                .collect(),
            ..SimKubeletConfig::default()
        });
        Self {
            apiserver: ApiServerConfig {
                name: name.clone(),
                ..ApiServerConfig::default()
            },
            kubelet,
            name,
            certificate_duration: None,
            real_nodes: 0,
        }
    }

    /// A cluster whose only nodes are `n` real ones (see [`ClusterSpec::real_nodes`]).
    pub fn with_real_nodes(name: impl Into<String>, n: usize) -> Self {
        Self {
            real_nodes: n,
            ..Self::new(name, 0)
        }
    }
}

/// One cluster of a test environment.
pub struct TestCluster {
    /// Its name.
    pub name: String,
    /// An administrator client.
    pub client: kube::Client,
    /// An administrator client that reaches the API server directly, not through the fault
    /// proxy: an observer unaffected by the proxy's outages (a benchmark's own watches).
    pub direct: kube::Client,
    /// The kubeconfig file (context = name).
    pub kubeconfig: PathBuf,
    /// The same as one kubeconfig entry (through the TCP fault proxy).
    entry: tensile_sim::apiserver::KubeconfigEntry,
    // Fields drop in this order: what talks to the API server (the simulated nodes, the
    // real ones, the provisioner) stops before the server does.
    kubelet: Option<SimKubelet>,
    real_nodes: Vec<real_node::RealNode>,
    /// Stops the harness's volume provisioner of a real cluster when dropped.
    _provisioner: Option<tokio_util::sync::DropGuard>,
    faults: faults::FaultProxy,
    backend: Backend,
}

impl std::fmt::Debug for TestCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestCluster")
            .field("name", &self.name)
            .field("kubeconfig", &self.kubeconfig)
            .finish_non_exhaustive()
    }
}

impl TestCluster {
    /// The embedded API server, when simulated.
    pub fn server(&self) -> Option<&ApiServer> {
        match &self.backend {
            Backend::Sim(s, _) => Some(s),
            Backend::Real(_) => None,
        }
    }

    /// Whether this cluster runs real control-plane binaries.
    pub fn is_real(&self) -> bool {
        self.backend.is_real()
    }

    /// The cluster CA certificate (PEM): what signs its API server's serving certificate and
    /// the client certificate it presents to kubelets, whichever backend serves it.
    pub fn ca_pem(&self) -> &str {
        self.backend.ca_pem()
    }

    /// `false` begins an outage of the cluster as its clients see it: every connection through
    /// [`TestCluster::kubeconfig`] and [`TestCluster::client`] is closed and new ones are closed
    /// at once, while the cluster itself (controllers, nodes) keeps running. `true` ends it.
    pub fn set_available(&self, available: bool) {
        self.faults.set_available(available);
    }

    /// Closes every client connection once, as an API server restart does (watches end and
    /// are re-established by their clients).
    pub fn reset_connections(&self) {
        self.faults.reset_connections();
    }

    fn real(&self, what: &'static str) -> Result<&real::RealCluster, FaultError> {
        match &self.backend {
            Backend::Real(r) => Ok(r),
            Backend::Sim(..) => Err(FaultError::NotSimulated {
                cluster: self.name.clone(),
                what,
            }),
        }
    }

    fn real_error(&self) -> impl Fn(real::RealError) -> FaultError + '_ {
        |source| FaultError::Real {
            cluster: self.name.clone(),
            source,
        }
    }

    /// Kills the API server (SIGKILL) until [`TestCluster::start_apiserver_again`]. On the
    /// simulator, whose objects live in its API server, as its clients see it: every client
    /// connection closed and new ones refused (its controllers and nodes keep running).
    pub fn kill_apiserver(&self) -> Result<(), FaultError> {
        match &self.backend {
            Backend::Real(r) => r
                .kill(real::Component::ApiServer)
                .map_err(self.real_error()),
            Backend::Sim(..) => {
                self.faults.set_available(false);
                Ok(())
            }
        }
    }

    /// Starts the API server killed by [`TestCluster::kill_apiserver`] again (same flags,
    /// port and etcd) and waits until it serves.
    pub async fn start_apiserver_again(&self) -> Result<(), FaultError> {
        match &self.backend {
            Backend::Real(r) => {
                r.start_again(real::Component::ApiServer)
                    .map_err(self.real_error())?;
                r.wait_serving().await.map_err(self.real_error())
            }
            Backend::Sim(..) => {
                self.faults.set_available(true);
                Ok(())
            }
        }
    }

    /// Stops (SIGSTOP, `true`) or continues (SIGCONT) the API server: it hangs, connections
    /// open and unanswered. On the simulator the same through the fault proxy: every client
    /// connection frozen.
    pub fn set_apiserver_stopped(&self, stopped: bool) -> Result<(), FaultError> {
        match &self.backend {
            Backend::Real(r) => r
                .set_stopped(real::Component::ApiServer, stopped)
                .map_err(self.real_error()),
            Backend::Sim(..) => {
                self.faults.set_frozen(stopped);
                Ok(())
            }
        }
    }

    /// Kills etcd (SIGKILL), real control planes only.
    pub fn kill_etcd(&self) -> Result<(), FaultError> {
        self.real("an etcd kill")?
            .kill(real::Component::Etcd)
            .map_err(self.real_error())
    }

    /// Starts etcd again on its data directory and port, and waits until the API server
    /// serves again (its `/readyz` checks etcd).
    pub async fn start_etcd_again(&self) -> Result<(), FaultError> {
        let r = self.real("an etcd restart")?;
        r.start_again(real::Component::Etcd)
            .map_err(self.real_error())?;
        r.wait_serving().await.map_err(self.real_error())
    }

    /// Compacts etcd to its current revision (real control planes only), so a watch that
    /// resumes from an older revision is answered 410 Gone once the API server's own watch
    /// cache no longer has it (after a restart of the API server at once). Answers the
    /// revision.
    pub async fn compact_etcd(&self) -> Result<i64, FaultError> {
        self.real("an etcd compaction")?
            .compact_etcd()
            .await
            .map_err(self.real_error())
    }

    /// An HTTPS proxy in front of this cluster that answers a share of the requests with
    /// 429 or 500 (see [`errors`]); its kubeconfig is written to `kubeconfig`. It reaches the
    /// cluster through the TCP fault proxy, so outages apply to it too.
    pub async fn error_proxy(
        &self,
        kubeconfig: &Path,
    ) -> Result<errors::ErrorProxy, errors::ErrorProxyError> {
        errors::ErrorProxy::start(self.client.clone(), &self.entry, kubeconfig).await
    }

    /// Makes the cluster's scheduler call these extenders: the simulated scheduler takes them
    /// at once; a real kube-scheduler is restarted with a KubeSchedulerConfiguration listing
    /// them and waited for.
    pub async fn set_scheduler_extenders(
        &self,
        extenders: Vec<tensile_sim::apiserver::controllers::SchedulerExtender>,
    ) -> Result<(), SchedulerConfigError> {
        let entries: Vec<serde_json::Value> = extenders
            .iter()
            .map(tensile_sim::apiserver::controllers::SchedulerExtender::to_scheduler_config)
            .collect();
        self.set_scheduler_config(&serde_json::json!({ "extenders": entries }))
            .await
    }

    /// Runs the cluster's scheduler with a KubeSchedulerConfiguration (as JSON, e.g. a file of
    /// `deploy/` read as YAML): a real kube-scheduler is restarted with it as it is (the
    /// harness sets only its client connection and leader election); the simulated scheduler
    /// takes its `extenders`, read as kube-scheduler reads them.
    pub async fn set_scheduler_config(
        &self,
        config: &serde_json::Value,
    ) -> Result<(), SchedulerConfigError> {
        self.backend.set_scheduler_config(config).await
    }

    /// A kubeconfig of this cluster (through the same proxy as [`TestCluster::kubeconfig`])
    /// whose only user is a client certificate for `user` in `group`, signed by the cluster CA
    /// as an administrator issues one (a kubelet's: `system:node:<name>` in `system:nodes`).
    pub fn kubeconfig_as(
        &self,
        user: &str,
        group: Option<&str>,
    ) -> Result<String, crate::certs::CertError> {
        let issued = match &self.backend {
            Backend::Sim(_, ca) => ca.issue_client(user, group)?,
            Backend::Real(r) => r.ca.issue_client(user, group)?,
        };
        Ok(self.kubeconfig_with(Some(issued), None))
    }

    /// A kubeconfig of this cluster (through the same proxy as [`TestCluster::kubeconfig`])
    /// whose user is this client certificate, or this bearer token.
    pub fn kubeconfig_with(
        &self,
        client: Option<crate::certs::Issued>,
        token: Option<String>,
    ) -> String {
        kubeconfig_text(&tensile_sim::apiserver::KubeconfigEntry {
            client,
            token,
            ..self.entry.clone()
        })
    }

    /// The requests of node identities (group `system:nodes`) this cluster refused: the
    /// simulator's record, or a real API server's audit log.
    pub fn refused_node_requests(&self) -> Vec<String> {
        match &self.backend {
            Backend::Sim(s, _) => s
                .forbidden()
                .into_iter()
                .filter(|d| d.groups.iter().any(|g| g == "system:nodes"))
                .map(|d| d.to_string())
                .collect(),
            Backend::Real(r) => r.refused_node_requests(),
        }
    }

    /// The real nodes of this cluster ([`ClusterSpec::real_nodes`]).
    pub fn real_nodes(&self) -> &[real_node::RealNode] {
        &self.real_nodes
    }

    /// Stops the simulated nodes (their leases expire; nothing looks after their pods).
    pub fn stop_nodes(&mut self) {
        if let Some(k) = self.kubelet.take() {
            k.stop();
        }
    }
}

/// N clusters, removed (servers stopped, files deleted) on drop.
#[derive(Debug)]
pub struct TestEnv {
    /// The clusters, in the order asked for.
    pub clusters: Vec<TestCluster>,
    dir: PathBuf,
    keep_files: bool,
}

static ENVS: AtomicUsize = AtomicUsize::new(0);

impl TestEnv {
    /// `n` clusters named `c1..cn`, two simulated nodes each.
    pub async fn start(n: usize) -> Result<Self, TestEnvError> {
        Self::start_with(
            (1..=n)
                .map(|i| ClusterSpec::new(format!("c{i}"), 2))
                .collect(),
        )
        .await
    }

    /// Clusters of the given shapes.
    pub async fn start_with(specs: Vec<ClusterSpec>) -> Result<Self, TestEnvError> {
        let dir = std::env::temp_dir().join(format!(
            "tensile-testenv-{}-{}",
            std::process::id(),
            ENVS.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).map_err(|source| TestEnvError::Kubeconfig {
            path: dir.clone(),
            source,
        })?;
        let mut env = Self {
            clusters: Vec::new(),
            dir,
            keep_files: false,
        };
        match env.add_clusters(specs).await {
            Ok(()) => Ok(env),
            Err(e) => {
                // What failed to start is looked into through its logs.
                env.keep_files = true;
                #[allow(clippy::print_stderr)] // where the reader of a failed test looks
                {
                    eprintln!("test environment files kept in {}", env.dir.display());
                }
                Err(e)
            }
        }
    }

    async fn add_clusters(&mut self, specs: Vec<ClusterSpec>) -> Result<(), TestEnvError> {
        let env = self;
        let bins = real::bin_dir();
        let address = testhost::address()?;
        for mut spec in specs {
            let cluster = spec.name.clone();
            let kubeconfig = env.dir.join(format!("{cluster}.kubeconfig"));
            let backend_spec = match &bins {
                None => BackendSpec::Sim(Box::new(spec.apiserver.clone())),
                Some(bin) => {
                    let default_grace =
                        tensile_sim::apiserver::controllers::Controllers::default().node_grace;
                    let node_grace = spec.apiserver.controllers.node_grace;
                    let c = &spec.apiserver.controllers;
                    let default_client = {
                        let d = tensile_sim::apiserver::controllers::Controllers::default();
                        (d.scheduler_client_qps, d.scheduler_client_burst)
                    };
                    let client = (c.scheduler_client_qps, c.scheduler_client_burst);
                    BackendSpec::Real {
                        bin,
                        dir: &env.dir,
                        options: real::RealOptions {
                            // A grace the test chose is given to the real controller too, and
                            // so is a scheduler client limit.
                            node_grace: (node_grace != default_grace).then_some(node_grace),
                            signing_duration: spec.certificate_duration,
                            // Real nodes live in network namespaces of their own, which reach
                            // the host at the test host's address, not at its loopback.
                            api_listen: (spec.real_nodes > 0)
                                .then(|| std::net::SocketAddr::new(address.into(), 0)),
                            scheduler_client: (client != default_client).then_some(client),
                        },
                    }
                }
            };
            let backend = Backend::start(&cluster, backend_spec).await?;
            let (mut entry, upstream) = (backend.entry(&cluster), backend.addr());
            let client_error = |source| TestEnvError::Client {
                cluster: cluster.clone(),
                source,
            };
            // The cluster's own parts talk to it directly; everyone else through the proxy.
            let direct = tensile_sim::apiserver::client_from_kubeconfig(&kubeconfig_text(&entry))
                .await
                .map_err(client_error)?;
            let faults = faults::FaultProxy::start(upstream)
                .await
                .map_err(|source| TestEnvError::Kubeconfig {
                    path: kubeconfig.clone(),
                    source,
                })?;
            entry.server = format!("https://{}", faults.addr());
            let text = kubeconfig_text(&entry);
            crate::secret_file::write_secret(&kubeconfig, &text).map_err(|source| {
                TestEnvError::Kubeconfig {
                    path: kubeconfig.clone(),
                    source,
                }
            })?;
            let client = tensile_sim::apiserver::client_from_kubeconfig(&text)
                .await
                .map_err(client_error)?;
            let real_nodes = match (&backend, spec.real_nodes) {
                (_, 0) => Vec::new(),
                (Backend::Sim(..), _) => {
                    return Err(TestEnvError::RealNodesNeedRealControlPlanes { cluster });
                }
                (Backend::Real(r), n) => {
                    let bin = bins.as_deref().unwrap_or(Path::new("."));
                    let mut nodes = Vec::with_capacity(n);
                    for i in 1..=n {
                        let name = format!("{cluster}-real-{i}");
                        let node = real_node::start(real_node::NodeConfig {
                            bin,
                            parent: &r.dir,
                            name: &name,
                            api: r.api_addr,
                            ca: &r.ca,
                        })
                        .await
                        .map_err(|source| TestEnvError::RealNode {
                            cluster: cluster.clone(),
                            source,
                        })?;
                        nodes.push(node);
                    }
                    let names: Vec<String> = nodes.iter().map(|n| n.name.clone()).collect();
                    if let Err(e) = schedulable(&direct, &cluster, &names).await {
                        // Their kubelet's and containerd's logs say why.
                        nodes.iter_mut().for_each(real_node::RealNode::keep_files);
                        return Err(e);
                    }
                    real_node::install_cluster_dns(&direct)
                        .await
                        .map_err(|source| TestEnvError::ClusterDns {
                            cluster: cluster.clone(),
                            source,
                        })?;
                    nodes
                }
            };
            let kubelet = match spec.kubelet.take() {
                Some(mut k) => {
                    k.address = Some(address);
                    let names: Vec<String> = k.nodes.iter().map(|n| n.name.clone()).collect();
                    let kubelet = SimKubelet::start(direct.clone(), k)
                        .await
                        .map_err(|source| TestEnvError::Nodes {
                            cluster: cluster.clone(),
                            source,
                        })?;
                    schedulable(&direct, &cluster, &names).await?;
                    Some(kubelet)
                }
                None => None,
            };
            // A real cluster with nodes gets the provisioner an ordinary cluster has (the
            // simulator provisions by itself).
            let provisioner = (matches!(backend, Backend::Real(_))
                && (kubelet.is_some() || !real_nodes.is_empty()))
            .then(|| {
                let stop = tokio_util::sync::CancellationToken::new();
                provisioner::start(direct.clone(), stop.clone());
                stop.drop_guard()
            });
            env.clusters.push(TestCluster {
                name: cluster,
                client,
                direct,
                kubeconfig,
                entry,
                backend,
                kubelet,
                real_nodes,
                faults,
                _provisioner: provisioner,
            });
        }
        Ok(())
    }

    /// The folder holding the kubeconfigs.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for TestEnv {
    fn drop(&mut self) {
        // The clusters first: a real node's folder holds mounts (its containers' root file
        // systems, their volumes) that must be gone before any file under it is removed.
        self.clusters.clear();
        // A failing test keeps the files (a real cluster's logs live here too).
        if !std::thread::panicking() && !self.keep_files {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

fn kubeconfig_text(entry: &tensile_sim::apiserver::KubeconfigEntry) -> String {
    tensile_sim::apiserver::kubeconfig(std::slice::from_ref(entry))
}

/// The taints the node lifecycle controller keeps on a node until it has seen it Ready.
const UNTRUSTED_NODE_TAINTS: [&str; 3] = [
    "node.kubernetes.io/not-ready",
    "node.kubernetes.io/unreachable",
    "node.kubernetes.io/network-unavailable",
];

/// Waits until every node in `names` is Ready and carries none of the taints Kubernetes puts on
/// nodes it does not trust yet (`node.kubernetes.io/not-ready` and friends, which a real node
/// lifecycle controller removes only once it has seen the node Ready).
pub async fn schedulable(
    client: &kube::Client,
    cluster: &str,
    names: &[String],
) -> Result<(), TestEnvError> {
    use k8s_openapi::api::core::v1::Node;
    let seconds = 90;
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(seconds);
    let nodes: kube::Api<Node> = kube::Api::all(client.clone());
    loop {
        let mut waiting = Vec::new();
        for name in names {
            match nodes.get_opt(name).await {
                Ok(Some(n)) => {
                    let taints: Vec<String> = n
                        .spec
                        .and_then(|s| s.taints)
                        .unwrap_or_default()
                        .into_iter()
                        .filter(|t| UNTRUSTED_NODE_TAINTS.contains(&t.key.as_str()))
                        .map(|t| t.key)
                        .collect();
                    let ready = n
                        .status
                        .and_then(|s| s.conditions)
                        .unwrap_or_default()
                        .iter()
                        .any(|c| c.type_ == "Ready" && c.status == "True");
                    if !ready || !taints.is_empty() {
                        waiting.push(format!("{name} (ready: {ready}, taints: {taints:?})"));
                    }
                }
                Ok(None) => waiting.push(format!("{name} (not registered)")),
                Err(e) => waiting.push(format!("{name} ({e})")),
            }
        }
        if waiting.is_empty() {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(TestEnvError::NodesNotReady {
                cluster: cluster.to_owned(),
                seconds,
                detail: waiting.join(", "),
            });
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

/// A loopback port free now, for a process about to listen on it. Chosen below the kernel's
/// ephemeral range (`ip_local_port_range`), never from it: a port the kernel handed out for
/// `:0` can become the local end of some outgoing connection before the process binds it (a
/// fleet benchmark opens thousands of them), and then it cannot listen ("Address already in
/// use"). The kernel's own choice only when no port below the range is free.
pub fn free_port() -> std::io::Result<u16> {
    use std::net::TcpListener;
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32_768);
    const LOWEST: u16 = 10_000;
    if ephemeral_low > LOWEST {
        for _ in 0..256 {
            let port = fastrand::u16(LOWEST..ephemeral_low);
            if TcpListener::bind(("127.0.0.1", port)).is_ok() {
                return Ok(port);
            }
        }
    }
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// A TLS client configuration trusting the certificates of `ca_pem` (a bundle), for tests'
/// HTTPS calls to the components.
#[allow(clippy::unwrap_used, clippy::expect_used)] // a test's set-up
pub fn client_trusting(ca_pem: &str) -> rustls::ClientConfig {
    use rustls_pki_types::pem::PemObject as _;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pki_types::CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots
            .add(cert.expect("a PEM certificate"))
            .expect("a CA certificate");
    }
    rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("the default protocol versions")
    .with_root_certificates(roots)
    .with_no_client_auth()
}

/// Sends `request` (raw HTTP/1.1 bytes, best with `Connection: close`) over a new TLS
/// connection to `addr` without verifying its certificate, and returns what the server sent
/// until it closed the connection: one connection per request, as a flood of clients makes.
pub async fn https_exchange_unverified(
    addr: std::net::SocketAddr,
    request: &[u8],
) -> Result<String, String> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .dangerous()
        .with_custom_certificate_verifier(std::sync::Arc::new(
            tensile_sim::apiserver::CertNotVerified(provider),
        ))
        .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let mut tls = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
        .connect(
            rustls_pki_types::ServerName::IpAddress(addr.ip().into()),
            tcp,
        )
        .await
        .map_err(|e| e.to_string())?;
    tls.write_all(request).await.map_err(|e| e.to_string())?;
    // What rustls could not hand to the socket yet would wait for the next write.
    tls.flush().await.map_err(|e| e.to_string())?;
    let mut response = Vec::new();
    // A server closing without close_notify still sent its answer.
    let _ = tls.read_to_end(&mut response).await;
    Ok(String::from_utf8_lossy(&response).into_owned())
}

/// The leaf certificate (DER) that `addr` presents in a handshake for `server_name` verified
/// against `ca_pem`, or why the handshake failed.
pub async fn presented_certificate(
    addr: std::net::SocketAddr,
    server_name: &str,
    ca_pem: &str,
) -> Result<Vec<u8>, String> {
    let name = rustls_pki_types::ServerName::try_from(server_name.to_owned())
        .map_err(|e| e.to_string())?;
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let tls = tokio_rustls::TlsConnector::from(std::sync::Arc::new(client_trusting(ca_pem)))
        .connect(name, tcp)
        .await
        .map_err(|e| e.to_string())?;
    tls.get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .map(|c| c.to_vec())
        .ok_or_else(|| "no certificate presented".to_owned())
}

/// An embedded API server of `config`, given the certificates of a new cluster CA
/// ([`certs::apiserver_certs`]) as TestEnv's simulated clusters are; the CA issues more.
pub async fn start_apiserver(
    mut config: ApiServerConfig,
) -> Result<(ApiServer, certs::Ca), TestEnvError> {
    let cluster = config.name.clone();
    let (ca, server_certs) =
        certs::apiserver_certs(&cluster, config.listen.ip()).map_err(|source| {
            TestEnvError::Certs {
                cluster: cluster.clone(),
                source,
            }
        })?;
    config.certs = server_certs;
    let server = ApiServer::start(config)
        .await
        .map_err(|source| TestEnvError::ApiServer { cluster, source })?;
    Ok((server, ca))
}

/// Polls `check` every 50 ms until it returns `Some`, and panics naming `what` after `secs`
/// seconds: how tests wait on a condition, with a deadline and never a bare sleep.
#[allow(clippy::panic)] // a test's failure
pub async fn eventually<T, F, Fut>(secs: u64, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(secs);
    loop {
        if let Some(v) = check().await {
            return v;
        }
        if tokio::time::Instant::now() >= deadline {
            panic!("timed out waiting for {what}");
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// GET `path` of a plain-HTTP listener (a component's `--metrics-addr`) over HTTP/1.0, which
/// every server closes after one answer: status and body.
pub async fn http_get(addr: std::net::SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut tcp = tokio::net::TcpStream::connect(addr).await?;
    tcp.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await?;
    let mut raw = Vec::new();
    tcp.read_to_end(&mut raw).await?;
    let raw = String::from_utf8_lossy(&raw);
    let bad = || std::io::Error::new(std::io::ErrorKind::InvalidData, format!("not HTTP: {raw}"));
    let status = raw
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(bad)?;
    let body = raw.split_once("\r\n\r\n").ok_or_else(bad)?.1.to_owned();
    Ok((status, body))
}

/// The value of one series (`name{labels}` exactly as the text exposition writes it) in the
/// text of a `/metrics` answer.
pub fn metric_value(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|line| {
        line.strip_prefix(series)?
            .strip_prefix(' ')?
            .split(' ')
            .next()?
            .parse()
            .ok()
    })
}

/// The local port `kubectl port-forward ... :PORT` chose, read from its stdout ("Forwarding
/// from 127.0.0.1:N -> PORT"). The rest of its output is drained in the background: kubectl
/// keeps writing "Handling connection" lines and dies of a closed pipe otherwise.
pub fn forwarded_port(mut out: impl std::io::Read + Send + 'static) -> Result<u16, String> {
    let mut seen = String::new();
    let mut buf = [0u8; 256];
    loop {
        if let Some(line) = seen
            .lines()
            .find(|l| l.starts_with("Forwarding from 127.0.0.1:"))
        {
            let port = line
                .trim_start_matches("Forwarding from 127.0.0.1:")
                .split(' ')
                .next()
                .and_then(|p| p.parse().ok())
                .ok_or_else(|| format!("no port in {line:?}"))?;
            std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
            return Ok(port);
        }
        let n = out.read(&mut buf).map_err(|e| e.to_string())?;
        if n == 0 {
            return Err(format!("port-forward ended: {seen}"));
        }
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
}

/// Pod `name`'s condition `type_`, if it has one.
pub async fn pod_condition(
    pods: &kube::Api<k8s_openapi::api::core::v1::Pod>,
    name: &str,
    type_: &str,
) -> Option<k8s_openapi::api::core::v1::PodCondition> {
    pods.get(name)
        .await
        .ok()?
        .status?
        .conditions?
        .into_iter()
        .find(|c| c.type_ == type_)
}

/// The message of pod `name`'s condition `type_`, once it has reason `reason`: what tests poll
/// with [`eventually`] to read why a pod is not scheduled or not offloaded.
pub async fn condition_message(
    pods: &kube::Api<k8s_openapi::api::core::v1::Pod>,
    name: &str,
    type_: &str,
    reason: &str,
) -> Option<String> {
    let c = pod_condition(pods, name, type_).await?;
    (c.reason.as_deref() == Some(reason)).then(|| c.message.unwrap_or_default())
}

#[cfg(test)]
mod tests {
    #[test]
    #[cfg(target_os = "linux")]
    fn free_ports_come_from_below_the_ephemeral_range_and_can_be_listened_on() {
        let range = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").unwrap();
        let low: u16 = range.split_whitespace().next().unwrap().parse().unwrap();
        assert!(low > 10_000, "this test wants the usual range, not {range}");
        for _ in 0..50 {
            let port = super::free_port().unwrap();
            assert!((10_000..low).contains(&port), "{port} not below {low}");
            std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
        }
    }
}
