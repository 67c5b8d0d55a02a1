//! The sandbox in one process: an upper cluster, lower clusters with simulated nodes, a virtual
//! node per lower cluster (labelled `clusterID=<lower cluster>`), and the placement components
//! wired in: the webhook registered in the upper cluster from the shipped configuration, the
//! descheduler, the scheduler extender called by the upper scheduler. `tensile up` and the
//! benchmarks start it here; its clusters are [`tensile_testenv::Backend`]s, as the tests' are.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use base64::Engine as _;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};
use tensile_core::keys::{OWNER_SCHEDULER, OWNER_WEBHOOK};
use tensile_placement::descheduler::DeschedulerConfig;
use tensile_placement::extender::{
    DEFAULT_RESERVATION_TTL, ExtenderConfig, KUBE_SCHEDULER_USER, LowerClusterClient,
};
use tensile_placement::serve::{ClientAuth, LiveCert, Server, tls_config_live};
use tensile_placement::tls_secret::TlsSecretConfig;
use tensile_placement::webhook::{Webhook, WebhookConfig};
use tensile_sim::apiserver::controllers::SchedulerExtender;
use tensile_sim::apiserver::{ApiServerConfig, KubeconfigEntry};
use tensile_simkubelet::{SimKubelet, SimKubeletConfig, SimNode};
use tensile_testenv::real::RealOptions;
use tensile_testenv::{Backend, BackendSpec};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::support::{free_port, listening, poll_until, spawn};

/// The shipped MutatingWebhookConfiguration, registered as is but for where to call.
pub(crate) const WEBHOOK_CONFIGURATION: &str =
    include_str!("../../../deploy/webhook/mutating-webhook-configuration.yaml");

/// The shipped KubeSchedulerConfiguration snippet, which the upper scheduler follows but for
/// where to call and which CA to trust.
const SCHEDULER_CONFIGURATION: &str =
    include_str!("../../../deploy/scheduler/kube-scheduler-config.yaml");

/// The shipped extender entries, pointed at `url_prefix` with `ca_pem` trusted, presenting
/// `client` (the scheduler's client certificate).
pub(crate) fn shipped_extenders(
    url_prefix: &str,
    ca_pem: &str,
    client: &tensile_testenv::certs::Issued,
) -> anyhow::Result<Vec<SchedulerExtender>> {
    let config: Value = serde_saphyr::from_str(SCHEDULER_CONFIGURATION)
        .context("the shipped kube-scheduler configuration")?;
    let mut extenders = SchedulerExtender::from_scheduler_config(&config)
        .map_err(|e| anyhow::anyhow!("the shipped kube-scheduler configuration: {e}"))?;
    for e in &mut extenders {
        e.url_prefix = url_prefix.to_owned();
        e.ca_pem = Some(ca_pem.to_owned());
        e.client_cert_pem = Some(client.cert_pem.clone());
        e.client_key_pem = Some(client.key_pem.clone());
    }
    Ok(extenders)
}

/// What to start.
#[derive(Debug, Clone)]
pub struct SandboxSpec {
    /// Address every server listens on.
    pub address: IpAddr,
    /// Port of the upper API server, lower cluster i on PORT+i; 0: free ports.
    pub port: u16,
    /// The nodes of each lower cluster.
    pub lowers: Vec<Vec<SimNode>>,
    /// Register the webhook in the upper cluster.
    pub webhook: bool,
    /// Run the descheduler with this configuration.
    pub descheduler: Option<DeschedulerConfig>,
    /// Run the scheduler extender, so, and have the upper scheduler call it (filter,
    /// prioritize, bind).
    pub extender: Option<ExtenderRun>,
    /// Real control planes (etcd, kube-apiserver, kube-controller-manager, kube-scheduler)
    /// from the binaries in this folder instead of simulated API servers; the nodes stay
    /// simulated.
    pub k8s_bin: Option<PathBuf>,
    /// How the virtual nodes run.
    pub virtual_nodes: VirtualNodeRun,
    /// The upper scheduler's client rate limit (`clientConnection.qps`, burst twice that), and
    /// the extender's (`--kube-api-qps`) when it runs as its own process ([`ExtenderRun::Process`],
    /// the benchmarks'), which binds for it; None: their defaults, 50 and 100.
    pub scheduler_qps: Option<u32>,
    /// With `k8s_bin`: each lower cluster has one real node (kubelet, containerd, runc,
    /// kube-proxy; CoreDNS as its cluster DNS) instead of the simulated `lowers`, and its API
    /// server listens on the test host's address, which the node's network namespace reaches.
    pub real_nodes: bool,
}

/// How the sandbox runs the scheduler extender.
#[derive(Debug, Clone)]
pub enum ExtenderRun {
    /// In this process, counting into these metrics (`tensile up`: one process).
    InProcess(tensile_placement::metrics::ExtenderMetrics),
    /// As its own `tensile scheduler` process of this binary, with the shipped flags, so a
    /// benchmark reads its memory, CPU and metrics apart from the clusters'.
    Process {
        /// The `tensile` binary.
        binary: PathBuf,
    },
}

/// How the sandbox runs its virtual nodes.
#[derive(Debug, Clone)]
pub enum VirtualNodeRun {
    /// In this process (`tensile up`: one process), started by the binary.
    InProcess(StartVirtualNode),
    /// Each as its own `tensile virtual-node` process of this binary (the README's flags), so
    /// a benchmark reads their memory and CPU apart from the clusters'.
    Process {
        /// The `tensile` binary.
        binary: PathBuf,
    },
}

/// Starts a virtual node in this process, as `tensile virtual-node` with the sandbox's flags
/// (the README's, `--disable-taint`) would, until `stop`; answers the task that ends when it has
/// stopped. The binary's own wiring of the virtual node, which it hands in: a library cannot
/// reach into the binary.
pub type StartVirtualNode =
    fn(
        InProcessNode,
        CancellationToken,
    ) -> futures::future::BoxFuture<'static, anyhow::Result<JoinHandle<()>>>;

/// A virtual node the sandbox runs in this process.
#[derive(Debug, Clone)]
pub struct InProcessNode {
    /// The node's name upstairs (`--nodename`).
    pub name: String,
    /// Its lower cluster, the node's `clusterID` label (`VKUBELET_NODE_LABEL`).
    pub cluster_id: String,
    /// Where its kubelet API listens, port chosen at start, and the address it publishes
    /// (`VKUBELET_POD_IP`).
    pub kubelet_ip: IpAddr,
    /// The upper cluster's kubeconfig, administrator credentials.
    pub upper_kubeconfig: String,
    /// The lower cluster's kubeconfig, administrator credentials.
    pub lower_kubeconfig: String,
}

/// A child `tensile` process of the sandbox; killed when dropped.
#[derive(Debug)]
pub struct ChildProcess {
    child: tokio::process::Child,
    /// Its process id.
    pub pid: u32,
    /// Its kubeconfigs and log; removed on stop.
    dir: PathBuf,
}

/// The scheduler extender running as its own process ([`ExtenderRun::Process`]).
#[derive(Debug)]
pub struct ExtenderProcess {
    /// Killed when dropped.
    child: tokio::process::Child,
    /// Its process id.
    pub pid: u32,
    /// Its plain-HTTP `/metrics` listener.
    pub metrics_addr: SocketAddr,
    /// Its kubeconfigs, CA files and log; removed on stop unless it failed.
    dir: PathBuf,
}

/// One cluster of the sandbox: a simulated API server or a real control plane, and its
/// simulated nodes.
#[derive(Debug)]
pub struct Cluster {
    /// Its name (and kubeconfig context).
    pub name: String,
    /// Administrator credentials.
    entry: KubeconfigEntry,
    // Fields drop in order: what talks to the API server goes before it.
    /// Stops the volume provisioner a real cluster with nodes needs (the simulator provisions
    /// by itself).
    _provisioner: Option<tokio_util::sync::DropGuard>,
    kubelet: Option<SimKubelet>,
    /// Real nodes ([`SandboxSpec::real_nodes`]), stopped and cleaned up when dropped.
    real_nodes: Vec<tensile_testenv::real_node::RealNode>,
    /// A real control plane's processes are killed and its files removed when dropped.
    backend: Backend,
}

impl Cluster {
    /// Where its API server serves.
    pub fn url(&self) -> &str {
        &self.entry.server
    }

    /// Whether a real control plane serves it.
    pub fn is_real(&self) -> bool {
        self.backend.is_real()
    }

    /// The cluster as one kubeconfig context, administrator credentials.
    pub fn kubeconfig_entry(&self, context: &str) -> KubeconfigEntry {
        KubeconfigEntry {
            context: context.to_owned(),
            ..self.entry.clone()
        }
    }

    /// A kubeconfig of the cluster with one context, administrator credentials.
    pub fn kubeconfig(&self, context: &str) -> String {
        tensile_sim::apiserver::kubeconfig(&[self.kubeconfig_entry(context)])
    }

    /// An administrator client.
    pub async fn client(&self) -> Result<kube::Client, kube::Error> {
        tensile_sim::apiserver::client_from_kubeconfig(&self.kubeconfig(&self.name)).await
    }

    /// Sets up the upper cluster's scheduler as docs/virtual-node.md asks, calling these
    /// extenders: the simulated scheduler takes them at once (it never binds claims upstairs);
    /// a real kube-scheduler is restarted with its `VolumeBinding` plugin off (claims are bound
    /// downstairs) and the extenders, and waited for.
    ///
    /// `qps`: a real kube-scheduler's `clientConnection.qps` (burst twice that); the simulated
    /// scheduler took its limit when it started.
    async fn set_upper_scheduler(
        &self,
        extenders: Vec<SchedulerExtender>,
        qps: Option<u32>,
    ) -> anyhow::Result<()> {
        let entries: Vec<Value> = extenders
            .iter()
            .map(SchedulerExtender::to_scheduler_config)
            .collect();
        let mut config = json!({
            "profiles": [{"schedulerName": "default-scheduler",
                "plugins": {"multiPoint": {"disabled": [{"name": "VolumeBinding"}]}}}],
            "extenders": entries,
        });
        if let Some(qps) = qps {
            config["clientConnection"] = json!({"qps": qps, "burst": qps.saturating_mul(2)});
        }
        self.backend
            .set_scheduler_config(&config)
            .await
            .with_context(|| {
                if self.is_real() {
                    format!("restarting kube-scheduler of {}", self.name)
                } else {
                    format!("the scheduler extenders of {}", self.name)
                }
            })?;
        Ok(())
    }

    /// Stops its nodes and API server (a real control plane ends when the cluster is dropped).
    fn stop(&self) {
        if let Some(k) = &self.kubelet {
            k.stop();
        }
        self.backend.stop();
    }
}

/// Where real control planes come from and keep their files.
struct RealPlanes {
    bin: PathBuf,
    dir: PathBuf,
    /// The address simulated nodes listen on: kube-apiserver refuses `nodes/proxy` (node
    /// stats) to loopback, so a non-loopback one when this machine has it.
    node_address: Option<std::net::Ipv4Addr>,
    /// Each lower cluster has one real node instead of its simulated ones.
    real_nodes: bool,
}

/// Stops the control planes a `tensile up --k8s-bin` left behind when it was killed
/// (SIGKILL gives it no chance to stop its child processes): processes whose command line
/// names the `tensile-up-<pid>` folder of a process that is gone. They would hold the
/// sandbox's ports. Their folder is removed too.
fn stop_leftovers(progress: &dyn Fn(&str)) {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix("tensile-up-")
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        // A zombie (killed, not yet reaped) is gone too.
        let alive = std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
            stat.rsplit_once(')').is_some_and(|(_, rest)| {
                !matches!(rest.trim_start().chars().next(), Some('Z' | 'X'))
            })
        });
        if alive {
            continue;
        }
        let dir = entry.path();
        let needle = format!("{}/", dir.display());
        let mut stopped = 0;
        for process in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Some(other) = process.file_name().to_str().map(str::to_owned) else {
                continue;
            };
            let Ok(cmdline) = std::fs::read(process.path().join("cmdline")) else {
                continue;
            };
            if other.chars().all(|c| c.is_ascii_digit())
                && String::from_utf8_lossy(&cmdline).contains(&needle)
                && std::process::Command::new("kill")
                    .args(["-KILL", &other])
                    .status()
                    .is_ok_and(|s| s.success())
            {
                stopped += 1;
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
        progress(&format!(
            "stopped {stopped} control-plane processes that a killed `tensile up` (pid {pid}) \
             left, and removed {}",
            dir.display()
        ));
    }
}

/// Starts one cluster: its API server on `listen` (simulated, or a real control plane with
/// `real`), its `nodes` (pod IPs `10.<pod_network_octet>.<node>.<n>`), the default
/// StorageClass.
async fn start_cluster(
    name: &str,
    listen: SocketAddr,
    nodes: Vec<SimNode>,
    pod_network_octet: u8,
    real: Option<&RealPlanes>,
    scheduler_qps: Option<u32>,
) -> anyhow::Result<Cluster> {
    let spec = match real {
        None => BackendSpec::Sim(Box::new(simulated(
            name,
            listen,
            true,
            !nodes.is_empty(),
            scheduler_qps,
        ))),
        Some(real) => {
            // kube-apiserver would only say so in its log, after the wait for it ran out.
            if listen.port() != 0 {
                drop(std::net::TcpListener::bind(listen).with_context(|| {
                    format!(
                        "cluster {name}: {listen} is taken (is another `tensile up` running? \
                         choose other ports with --port)"
                    )
                })?);
            }
            BackendSpec::Real {
                bin: &real.bin,
                dir: &real.dir,
                options: RealOptions {
                    api_listen: Some(listen),
                    ..RealOptions::default()
                },
            }
        }
    };
    let backend = Backend::start(name, spec)
        .await
        .with_context(|| match real {
            None => format!("starting the API server of cluster {name} on {listen}"),
            Some(_) => format!("starting the control plane of cluster {name} on {listen}"),
        })?;
    let entry = backend.entry(name);
    let client = tensile_sim::apiserver::client_from_kubeconfig(
        &tensile_sim::apiserver::kubeconfig(std::slice::from_ref(&entry)),
    )
    .await
    .with_context(|| format!("building a client for cluster {name}"))?;
    default_storage_class(&client)
        .await
        .with_context(|| format!("creating the default StorageClass of cluster {name}"))?;
    let real_nodes_wanted = real.is_some_and(|r| r.real_nodes);
    let mut real_nodes = Vec::new();
    if let (Some(real), Backend::Real(cluster)) = (real, &backend)
        && real_nodes_wanted
        && !nodes.is_empty()
    {
        let node = format!("{name}-node-1");
        real_nodes.push(
            tensile_testenv::real_node::start(tensile_testenv::real_node::NodeConfig {
                bin: &real.bin,
                parent: &real.dir,
                name: &node,
                api: cluster.api_addr,
                ca: cluster.ca(),
            })
            .await
            .with_context(|| format!("starting the real node {node} of cluster {name}"))?,
        );
        tensile_testenv::schedulable(&client, name, std::slice::from_ref(&node))
            .await
            .with_context(|| format!("waiting for the real node {node} of cluster {name}"))?;
        tensile_testenv::real_node::install_cluster_dns(&client)
            .await
            .with_context(|| format!("installing CoreDNS in cluster {name}"))?;
    }
    let kubelet = if nodes.is_empty() || real_nodes_wanted {
        None
    } else {
        let names: Vec<String> = nodes.iter().map(|n| n.name.clone()).collect();
        let config = SimKubeletConfig {
            nodes,
            pod_network_octet,
            address: real.and_then(|r| r.node_address),
            ..SimKubeletConfig::default()
        };
        let kubelet = SimKubelet::start(client.clone(), config)
            .await
            .with_context(|| format!("registering the simulated nodes of cluster {name}"))?;
        // A real node lifecycle controller trusts new nodes only once it has seen them Ready.
        if backend.is_real() {
            tensile_testenv::schedulable(&client, name, &names)
                .await
                .with_context(|| format!("waiting for the nodes of cluster {name}"))?;
        }
        Some(kubelet)
    };
    // A real cluster with nodes gets the provisioner an ordinary cluster has (the simulator
    // provisions by itself).
    let provisioner =
        (backend.is_real() && (kubelet.is_some() || !real_nodes.is_empty())).then(|| {
            let stop = CancellationToken::new();
            tensile_testenv::provisioner::start(client, stop.clone());
            stop.drop_guard()
        });
    Ok(Cluster {
        name: name.to_owned(),
        entry,
        backend,
        kubelet,
        real_nodes,
        _provisioner: provisioner,
    })
}

/// A simulated cluster's API server on `listen` (`tensile sim`'s and the sandbox's); `nodes`:
/// whether it has nodes of its own; `scheduler_qps`: its scheduler's client rate limit
/// (burst twice that).
pub fn simulated(
    name: &str,
    listen: SocketAddr,
    tls: bool,
    nodes: bool,
    scheduler_qps: Option<u32>,
) -> ApiServerConfig {
    let mut config = ApiServerConfig {
        name: name.to_owned(),
        listen,
        tls,
        // Its simulated nodes live on loopback addresses (no root needed to run it), so the
        // stats the virtual node reads through nodes/proxy must be let through.
        proxy_to_loopback: true,
        ..ApiServerConfig::default()
    };
    // A cluster without nodes of its own is an upper cluster: its claims are bound downstairs,
    // and its scheduler must not wait for volumes it cannot bind (reference 4.3).
    config.controllers.volume_binding = nodes;
    if let Some(qps) = scheduler_qps {
        config.controllers.scheduler_client_qps = f64::from(qps);
        config.controllers.scheduler_client_burst = qps.saturating_mul(2);
    }
    config
}

/// The StorageClass every sandbox cluster has, like kind's `standard`: volumes provisioned on
/// the pod's node when it is scheduled (`WaitForFirstConsumer`), deleted with their claim.
pub async fn default_storage_class(client: &kube::Client) -> Result<(), kube::Error> {
    let class: k8s_openapi::api::storage::v1::StorageClass = serde_json::from_value(json!({
        "metadata": {"name": STORAGE_CLASS,
            "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}},
        "provisioner": "tensile.io/local-path",
        "volumeBindingMode": "WaitForFirstConsumer",
        "reclaimPolicy": "Delete",
    }))
    .map_err(kube::Error::SerdeError)?;
    Api::all(client.clone())
        .create(&PostParams::default(), &class)
        .await
        .map(drop)
}

/// The name of the sandbox's default StorageClass.
const STORAGE_CLASS: &str = "standard";

/// A running sandbox; [`Sandbox::stop`] shuts it down.
#[derive(Debug)]
pub struct Sandbox {
    /// The upper cluster.
    pub upper: Cluster,
    /// The lower clusters, `lower-1`, `lower-2`, ...
    pub lowers: Vec<Cluster>,
    /// The virtual nodes, one per lower cluster, in order.
    pub virtual_nodes: Vec<String>,
    /// Where real control planes keep their files and logs.
    pub real_dir: Option<PathBuf>,
    /// The scheduler extender, when it runs as its own process.
    pub extender_process: Option<ExtenderProcess>,
    /// The virtual nodes' processes, when they run as their own ([`SandboxSpec::virtual_node_binary`]).
    pub virtual_node_processes: Vec<ChildProcess>,
    stop: CancellationToken,
    handles: Vec<JoinHandle<()>>,
    _webhook: Option<Server>,
}

/// The port of cluster `index` (0 is the upper one).
fn port_of(base: u16, index: usize) -> anyhow::Result<u16> {
    if base == 0 {
        return Ok(0);
    }
    u16::try_from(index)
        .ok()
        .and_then(|i| base.checked_add(i))
        .with_context(|| format!("--port {base} leaves no room for {index} lower clusters"))
}

impl Sandbox {
    /// Starts everything, telling `progress` each step.
    pub async fn start(spec: SandboxSpec, progress: &dyn Fn(&str)) -> anyhow::Result<Self> {
        let real = match &spec.k8s_bin {
            None => None,
            Some(bin) => {
                stop_leftovers(progress);
                let dir = std::env::temp_dir().join(format!("tensile-up-{}", std::process::id()));
                std::fs::create_dir_all(&dir)
                    .with_context(|| format!("creating {}", dir.display()))?;
                let node_address = match tensile_testenv::testhost::address() {
                    Ok(a) => Some(a),
                    Err(e) => {
                        progress(&format!(
                            "simulated nodes on loopback, so node stats are not available: {e}"
                        ));
                        None
                    }
                };
                progress(&format!(
                    "real control planes from {}, files and logs in {}",
                    bin.display(),
                    dir.display()
                ));
                if spec.real_nodes {
                    tensile_testenv::real_node::preflight(bin)
                        .context("--real-nodes: this machine cannot run real nodes")?;
                }
                Some(RealPlanes {
                    real_nodes: spec.real_nodes,
                    bin: bin.clone(),
                    dir,
                    node_address,
                })
            }
        };
        // With real nodes every API server listens where their network namespaces reach the
        // host: the lower ones for their nodes, the upper one for the offloaded pods, whose
        // `KUBERNETES_SERVICE_HOST` is the upper API server (upper identity).
        let node_reachable = |address: IpAddr| match (&real, spec.real_nodes) {
            (Some(_), true) => IpAddr::V4(tensile_testenv::testhost::ADDRESS),
            _ => address,
        };
        let listen = SocketAddr::new(node_reachable(spec.address), port_of(spec.port, 0)?);
        let upper = start_cluster(
            "upper",
            listen,
            Vec::new(),
            244,
            real.as_ref(),
            spec.scheduler_qps,
        )
        .await?;
        progress(&format!("upper cluster on {}", upper.url()));
        let mut lowers = Vec::new();
        for (i, nodes) in spec.lowers.iter().enumerate() {
            let name = format!("lower-{}", i + 1);
            let listen = SocketAddr::new(node_reachable(spec.address), port_of(spec.port, i + 1)?);
            let octet = u8::try_from(i + 1)
                .map(|i| 243_u8.wrapping_add(i))
                .unwrap_or(243);
            let cluster =
                start_cluster(&name, listen, nodes.clone(), octet, real.as_ref(), None).await?;
            if cluster.real_nodes.is_empty() {
                progress(&format!(
                    "{name} on {} with {} nodes",
                    cluster.url(),
                    nodes.len()
                ));
            } else {
                let names: Vec<&str> = cluster.real_nodes.iter().map(|n| n.name.as_str()).collect();
                progress(&format!(
                    "{name} on {} with real node {} (files and logs in {})",
                    cluster.url(),
                    names.join(", "),
                    cluster.real_nodes[0].dir.display()
                ));
            }
            lowers.push(cluster);
        }

        // A real upper API server refuses `nodes/proxy` (the virtual nodes' stats) to
        // loopback: the virtual nodes serve where the simulated nodes do.
        let kubelet_ip = real
            .as_ref()
            .and_then(|r| r.node_address)
            .map_or(spec.address, IpAddr::V4);
        let stop = CancellationToken::new();
        let upper_text = upper.kubeconfig("upper");
        let mut handles = Vec::new();
        let mut virtual_nodes = Vec::new();
        let mut virtual_node_processes = Vec::new();
        for (index, lower) in lowers.iter().enumerate() {
            let name = &lower.name;
            let node_name = format!("vk-{name}");
            // Each virtual node at an address of its own, as each runs in a pod of its own: what
            // it serves there (node ports, their session affinity) is its own.
            let kubelet_ip = match kubelet_ip {
                IpAddr::V4(ip) if ip == tensile_testenv::testhost::ADDRESS => {
                    let n = u8::try_from(index).unwrap_or(u8::MAX);
                    IpAddr::V4(
                        tensile_testenv::testhost::extra_address(n)
                            .with_context(|| format!("an address for virtual node {node_name}"))?,
                    )
                }
                other => other,
            };
            match &spec.virtual_nodes {
                VirtualNodeRun::Process { binary } => virtual_node_processes.push(
                    start_virtual_node_process(binary, &node_name, kubelet_ip, &upper, lower)
                        .await?,
                ),
                VirtualNodeRun::InProcess(start) => handles.push(
                    start(
                        InProcessNode {
                            name: node_name.clone(),
                            cluster_id: name.clone(),
                            kubelet_ip,
                            upper_kubeconfig: upper_text.clone(),
                            lower_kubeconfig: lower.kubeconfig(name),
                        },
                        stop.clone(),
                    )
                    .await?,
                ),
            }
            virtual_nodes.push(node_name);
        }
        progress(&format!("virtual nodes {}", virtual_nodes.join(", ")));

        let client = upper.client().await.context("upper cluster client")?;
        let webhook = if spec.webhook {
            let server = start_webhook(&client, spec.address, &stop).await?;
            progress(&format!("webhook on {}", server.addr()));
            Some(server)
        } else {
            None
        };
        let mut extender_process = None;
        if let Some(run) = &spec.extender {
            // The upper scheduler authenticates as kube-scheduler does as shipped: a client
            // certificate for system:kube-scheduler, here from a CA of the sandbox's own.
            let clients = tensile_testenv::certs::Ca::new("tensile-scheduler-clients")
                .context("the scheduler's client CA")?;
            let scheduler_cert = clients
                .issue_client(KUBE_SCHEDULER_USER, None)
                .context("the scheduler's client certificate")?;
            let (addr, ca_pem) = match run {
                ExtenderRun::InProcess(metrics) => {
                    let mut clusters = Vec::new();
                    for lower in &lowers {
                        clusters.push(LowerClusterClient {
                            id: lower.name.clone(),
                            client: lower
                                .client()
                                .await
                                .with_context(|| format!("{} client", lower.name))?,
                        });
                    }
                    let running = tensile_placement::extender::start(
                        ExtenderConfig {
                            upper: client.clone(),
                            clusters,
                            reservation_ttl: DEFAULT_RESERVATION_TTL,
                            listen: SocketAddr::new(spec.address, 0),
                            cert: serve_from_secret(
                                &client,
                                SCHEDULER_SECRET,
                                OWNER_SCHEDULER,
                                spec.address,
                                &stop,
                            )
                            .await?
                            .0,
                            client_auth: Some(ClientAuth {
                                ca_pem: clients.cert_pem().to_owned(),
                                allowed_names: vec![KUBE_SCHEDULER_USER.to_owned()],
                            }),
                            insecure_without_client_auth: false,
                            metrics: metrics.clone(),
                        },
                        stop.clone(),
                    )
                    .await
                    .context("starting the scheduler extender")?;
                    handles.push(running.handle);
                    (running.addr, running.ca_pem)
                }
                ExtenderRun::Process { binary } => {
                    let (process, addr, ca_pem) = start_extender_process(
                        binary,
                        spec.address,
                        &upper,
                        &lowers,
                        clients.cert_pem(),
                        spec.scheduler_qps,
                    )
                    .await?;
                    extender_process = Some(process);
                    (addr, ca_pem)
                }
            };
            upper
                .set_upper_scheduler(
                    shipped_extenders(&format!("https://{addr}"), &ca_pem, &scheduler_cert)?,
                    spec.scheduler_qps,
                )
                .await?;
            progress(&format!("scheduler extender on {addr}"));
        } else if upper.is_real() {
            upper
                .set_upper_scheduler(Vec::new(), spec.scheduler_qps)
                .await?;
        }
        if let Some(config) = spec.descheduler {
            let (client, stop) = (client.clone(), stop.clone());
            handles.push(tokio::spawn(async move {
                if let Err(e) = tensile_placement::descheduler::run(config, client, stop).await {
                    tracing::error!(error = %e, "descheduler stopped");
                }
            }));
            progress("descheduler running");
        }
        Ok(Self {
            upper,
            lowers,
            virtual_nodes,
            real_dir: real.map(|r| r.dir),
            extender_process,
            virtual_node_processes,
            stop,
            handles,
            _webhook: webhook,
        })
    }

    /// Waits (on a watch) until every virtual node is Ready upstairs.
    pub async fn wait_ready(&self, within: Duration) -> anyhow::Result<()> {
        let client = self.upper.client().await?;
        let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client);
        let ready = |n: Option<&k8s_openapi::api::core::v1::Node>| {
            n.and_then(|n| n.status.as_ref())
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        };
        for name in &self.virtual_nodes {
            tokio::time::timeout(
                within,
                kube::runtime::wait::await_condition(nodes.clone(), name, ready),
            )
            .await
            .with_context(|| format!("virtual node {name} was not Ready within {within:?}"))?
            .with_context(|| format!("watching virtual node {name}"))?;
        }
        Ok(())
    }

    /// The stop token every component watches.
    pub fn stop_token(&self) -> &CancellationToken {
        &self.stop
    }

    /// Stops every component and cluster.
    pub async fn stop(self) {
        self.stop.cancel();
        for mut p in self.virtual_node_processes {
            let _ = p.child.kill().await;
            let _ = std::fs::remove_dir_all(&p.dir);
        }
        for h in self.handles {
            let _ = tokio::time::timeout(Duration::from_secs(5), h).await;
        }
        for lower in &self.lowers {
            lower.stop();
        }
        self.upper.stop();
        if let Some(mut extender) = self.extender_process {
            let _ = extender.child.kill().await;
            let _ = std::fs::remove_dir_all(&extender.dir);
        }
        // Real control planes are killed, and their files removed, here.
        drop(self.lowers);
        drop(self.upper);
        if let Some(dir) = &self.real_dir {
            // Only when empty: a control plane that failed keeps its logs there.
            let _ = std::fs::remove_dir(dir);
        }
    }
}

/// Where the sandbox keeps the webhook's CA and serving certificate, as the shipped manifests
/// do (`--tls-secret`): `tensile up` exercises the Secret, its watch and the caBundle it keeps.
const WEBHOOK_SECRET: &str = "kube-system/tensile-webhook-tls";
/// The same for the scheduler extender.
const SCHEDULER_SECRET: &str = "kube-system/tensile-scheduler-tls";

/// A serving certificate for `address`, kept in `secret` of the upper cluster (as the
/// components' `--tls-secret` does): what to present, and the CA bundle to trust, kept current.
async fn serve_from_secret(
    client: &kube::Client,
    secret: &str,
    owner: &str,
    address: IpAddr,
    stop: &CancellationToken,
) -> anyhow::Result<(LiveCert, tokio::sync::watch::Receiver<String>)> {
    let secret = secret.parse().map_err(anyhow::Error::msg)?;
    let kept = tensile_placement::tls_secret::start(
        client.clone(),
        TlsSecretConfig {
            secret,
            owner: owner.to_owned(),
            names: vec![address.to_string()],
            policy: tensile_core::certs::Policy::default(),
        },
        stop.clone(),
    )
    .await
    .with_context(|| format!("the serving certificate of {owner}"))?;
    Ok((kept.cert, kept.bundle))
}

/// Starts `binary scheduler` with the shipped manifest's flags (its certificate in the
/// `--tls-secret` Secret, kube-scheduler's client certificates required) for `upper` and
/// `lowers`, on `address`, and waits until it is ready. Answers the process, where it serves
/// and the CA of its serving certificate.
/// Starts `tensile virtual-node` for `lower` with the flags the sandbox gives the in-process
/// ones (the README's, `--disable-taint`), its kubeconfigs in a temporary folder; quiet but
/// for warnings, its log beside them.
async fn start_virtual_node_process(
    binary: &std::path::Path,
    node_name: &str,
    kubelet_ip: IpAddr,
    upper: &Cluster,
    lower: &Cluster,
) -> anyhow::Result<ChildProcess> {
    let dir = std::env::temp_dir().join(format!(
        "tensile-{node_name}-{}-{}",
        std::process::id(),
        free_port()?
    ));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let secret = |name: &str, text: &str| -> anyhow::Result<PathBuf> {
        let path = dir.join(name);
        tensile_testenv::secret_file::write_secret(&path, text)
            .with_context(|| format!("writing {}", path.display()))?;
        Ok(path)
    };
    let upper_file = secret("upper.kubeconfig", &upper.kubeconfig("upper"))?;
    let lower_file = secret("lower.kubeconfig", &lower.kubeconfig(&lower.name))?;
    let log = dir.join("virtual-node.log");
    let child = tokio::process::Command::new(binary)
        .args(["virtual-node", "--nodename", node_name, "--disable-taint"])
        .arg("--kubeconfig")
        .arg(&upper_file)
        .arg("--client-kubeconfig")
        .arg(&lower_file)
        .args(["--kubelet-address", &kubelet_ip.to_string()])
        .env("KUBELET_PORT", free_port()?.to_string())
        .env("VKUBELET_POD_IP", kubelet_ip.to_string())
        .env("VKUBELET_NODE_LABEL", format!("clusterID: {}", lower.name))
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting tensile virtual-node {node_name}"))?;
    let pid = child
        .id()
        .with_context(|| format!("virtual node {node_name} exited at once"))?;
    Ok(ChildProcess { child, pid, dir })
}

async fn start_extender_process(
    binary: &std::path::Path,
    address: IpAddr,
    upper: &Cluster,
    lowers: &[Cluster],
    client_ca_pem: &str,
    qps: Option<u32>,
) -> anyhow::Result<(ExtenderProcess, SocketAddr, String)> {
    let dir = std::env::temp_dir().join(format!(
        "tensile-extender-{}-{}",
        std::process::id(),
        free_port()?
    ));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let secret = |name: &str, text: &str| -> anyhow::Result<String> {
        let path = dir.join(name);
        tensile_testenv::secret_file::write_secret(&path, text)
            .with_context(|| format!("writing {}", path.display()))?;
        Ok(path.display().to_string())
    };
    let (port, metrics_port) = (free_port()?, free_port()?);
    let mut args = vec![
        "scheduler".to_owned(),
        format!(
            "--kubeconfig={}",
            secret("upper.kubeconfig", &upper.kubeconfig("upper"))?
        ),
        format!("--address={address}"),
        format!("--port={port}"),
        format!("--tls-secret={SCHEDULER_SECRET}"),
        format!("--tls-san={address}"),
        format!("--write-ca={}", dir.join("ca.crt").display()),
        format!(
            "--client-ca-file={}",
            secret("client-ca.crt", client_ca_pem)?
        ),
        format!("--metrics-addr=127.0.0.1:{metrics_port}"),
    ];
    if let Some(qps) = qps {
        args.push(format!("--kube-api-qps={qps}"));
        args.push(format!("--kube-api-burst={}", qps.saturating_mul(2)));
    }
    for lower in lowers {
        let file = secret(
            &format!("{}.kubeconfig", lower.name),
            &lower.kubeconfig(&lower.name),
        )?;
        args.push(format!("--cluster={}={file}", lower.name));
    }
    let log = dir.join("scheduler.log");
    let child = spawn(binary, &args, &log)?;
    let pid = child.id().context("the extender exited at once")?;
    let addr = SocketAddr::new(address, port);
    listening(addr, &log, Duration::from_secs(120)).await?;
    // Ready once it has listed every lower cluster's nodes and pods: before, it would fail
    // their virtual nodes.
    let metrics_addr = SocketAddr::from(([127, 0, 0, 1], metrics_port));
    poll_until(
        "the scheduler extender's /readyz",
        &log,
        Duration::from_secs(120),
        || async {
            matches!(
                tensile_testenv::http_get(metrics_addr, "/readyz").await,
                Ok((200, _))
            )
        },
    )
    .await?;
    // Written (from its Secret) before it starts serving.
    let ca_pem = std::fs::read_to_string(dir.join("ca.crt")).context("the extender's CA")?;
    let process = ExtenderProcess {
        child,
        pid,
        metrics_addr,
        dir,
    };
    Ok((process, addr, ca_pem))
}

/// Serves the webhook on loopback and registers the shipped configuration, called by URL (the
/// sandbox has no service network), with the CA bundle of its Secret, kept current.
async fn start_webhook(
    client: &kube::Client,
    address: IpAddr,
    stop: &CancellationToken,
) -> anyhow::Result<Server> {
    let (cert, bundle) =
        serve_from_secret(client, WEBHOOK_SECRET, OWNER_WEBHOOK, address, stop).await?;
    let webhook = Webhook::connected(WebhookConfig::default(), client.clone(), stop).await;
    let server = Server::start(
        SocketAddr::new(address, 0),
        tls_config_live(&cert, None)?,
        Arc::new(webhook),
    )
    .await?;
    let mut config: Value = serde_saphyr::from_str(WEBHOOK_CONFIGURATION)
        .context("the shipped webhook configuration")?;
    let url = format!("https://{}/mutate", server.addr());
    let ca_bundle = bundle.borrow().clone();
    for hook in config["webhooks"].as_array_mut().into_iter().flatten() {
        hook["clientConfig"] = json!({"url": url,
            "caBundle": base64::engine::general_purpose::STANDARD.encode(&ca_bundle)});
    }
    let config: MutatingWebhookConfiguration =
        serde_json::from_value(config).context("the shipped webhook configuration")?;
    let name = config.metadata.name.clone().unwrap_or_default();
    Api::<MutatingWebhookConfiguration>::all(client.clone())
        .create(&PostParams::default(), &config)
        .await
        .context("registering the webhook")?;
    tokio::spawn(tensile_placement::ca_bundle::keep_ca_bundle(
        client.clone(),
        name,
        bundle,
        stop.clone(),
    ));
    Ok(server)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lower_clusters_take_the_ports_after_the_upper_one() {
        assert_eq!(port_of(7443, 0).unwrap(), 7443);
        assert_eq!(port_of(7443, 2).unwrap(), 7445);
        assert_eq!(port_of(0, 2).unwrap(), 0);
        assert!(port_of(65535, 1).is_err());
    }
}
