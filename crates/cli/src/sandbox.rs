//! The sandbox in one process: an upper cluster, lower clusters with simulated nodes, a virtual
//! node per lower cluster (labelled `clusterID=<lower cluster>`), and the placement components
//! wired in: the webhook registered in the upper cluster from the shipped configuration, the
//! descheduler, the scheduler extender called by the upper scheduler. `tensile up`, the benchmarks and the end-to-end tests all start it here.

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
use tensile_placement::serve::{ClientAuth, Server, tls_config_live};
use tensile_placement::webhook::{Webhook, WebhookConfig};
use tensile_runtime::clients::KubeconfigSource;
use tensile_sim::apiserver::controllers::SchedulerExtender;
use tensile_sim::apiserver::{ApiServer, KubeconfigEntry};
use tensile_simkubelet::{SimKubelet, SimKubeletConfig, SimNode};
use tensile_testenv::real::{RealCluster, RealOptions};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// The shipped MutatingWebhookConfiguration, registered as is but for where to call.
const WEBHOOK_CONFIGURATION: &str =
    include_str!("../../../deploy/webhook/mutating-webhook-configuration.yaml");

/// The shipped KubeSchedulerConfiguration snippet, which the upper scheduler follows but for
/// where to call and which CA to trust.
const SCHEDULER_CONFIGURATION: &str =
    include_str!("../../../deploy/scheduler/kube-scheduler-config.yaml");

/// The shipped extender entries, pointed at `url_prefix` with `ca_pem` trusted, presenting
/// `client` (the scheduler's client certificate).
fn shipped_extenders(
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
    /// Run each virtual node as its own `tensile virtual-node` process of this binary (the
    /// README's flags), so a benchmark reads their memory and CPU apart from the clusters';
    /// None: in this process.
    pub virtual_node_binary: Option<PathBuf>,
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

/// A child `tensile` process of the sandbox; killed when dropped.
pub struct ChildProcess {
    child: tokio::process::Child,
    /// Its process id.
    pub pid: u32,
    /// Its kubeconfigs and log; removed on stop.
    dir: PathBuf,
}

/// The scheduler extender running as its own process ([`ExtenderRun::Process`]).
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

/// What serves a sandbox cluster's API.
enum Backend {
    Sim(ApiServer),
    /// Its processes are killed and its files removed when dropped.
    Real(Box<RealCluster>),
}

/// One cluster of the sandbox: a simulated API server or a real control plane, and its
/// simulated nodes.
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
    backend: Backend,
}

impl Cluster {
    /// Where its API server serves.
    pub fn url(&self) -> &str {
        &self.entry.server
    }

    /// Whether a real control plane serves it.
    pub fn is_real(&self) -> bool {
        matches!(self.backend, Backend::Real(_))
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
        match &self.backend {
            Backend::Sim(s) => s.set_scheduler_extenders(extenders),
            Backend::Real(r) => {
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
                    config["clientConnection"] =
                        json!({"qps": qps, "burst": qps.saturating_mul(2)});
                }
                r.restart_scheduler(&config)
                    .await
                    .with_context(|| format!("restarting kube-scheduler of {}", self.name))?;
            }
        }
        Ok(())
    }

    /// Stops its nodes and API server (a real control plane ends when the cluster is dropped).
    fn stop(&self) {
        if let Some(k) = &self.kubelet {
            k.stop();
        }
        if let Backend::Sim(s) = &self.backend {
            s.stop();
        }
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

/// Starts one cluster: its API server on `listen`, its `nodes` (pod IPs
/// `10.<pod_network_octet>.<node>.<n>`), the default StorageClass.
async fn start_cluster(
    name: &str,
    listen: SocketAddr,
    nodes: Vec<SimNode>,
    pod_network_octet: u8,
    real: Option<&RealPlanes>,
    scheduler_qps: Option<u32>,
) -> anyhow::Result<Cluster> {
    let Some(real) = real else {
        let (server, kubelet) =
            crate::sim::start_cluster(name, listen, true, nodes, pod_network_octet, scheduler_qps)
                .await?;
        return Ok(Cluster {
            name: name.to_owned(),
            entry: server.kubeconfig_entry(name),
            backend: Backend::Sim(server),
            kubelet,
            real_nodes: Vec::new(),
            _provisioner: None,
        });
    };
    // kube-apiserver would only say so in its log, after the wait for it ran out.
    if listen.port() != 0 {
        drop(std::net::TcpListener::bind(listen).with_context(|| {
            format!(
                "cluster {name}: {listen} is taken (is another `tensile up` running? choose \
                 other ports with --port)"
            )
        })?);
    }
    let options = RealOptions {
        api_listen: Some(listen),
        ..RealOptions::default()
    };
    let cluster = tensile_testenv::real::start_with(&real.bin, &real.dir, name, &options)
        .await
        .with_context(|| format!("starting the control plane of cluster {name} on {listen}"))?;
    let mut entry = cluster.entry.clone();
    entry.context = name.to_owned();
    let client = tensile_sim::apiserver::client_from_kubeconfig(&cluster.kubeconfig)
        .await
        .with_context(|| format!("building a client for cluster {name}"))?;
    crate::sim::default_storage_class(&client)
        .await
        .with_context(|| format!("creating the default StorageClass of cluster {name}"))?;
    let mut real_nodes = Vec::new();
    if real.real_nodes && !nodes.is_empty() {
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
    let (kubelet, provisioner) = if nodes.is_empty() || real.real_nodes {
        let provisioner = (!real_nodes.is_empty()).then(|| {
            let stop = CancellationToken::new();
            tensile_testenv::provisioner::start(client.clone(), stop.clone());
            stop.drop_guard()
        });
        (None, provisioner)
    } else {
        let names: Vec<String> = nodes.iter().map(|n| n.name.clone()).collect();
        let config = SimKubeletConfig {
            nodes,
            pod_network_octet,
            address: real.node_address,
            ..SimKubeletConfig::default()
        };
        let kubelet = SimKubelet::start(client.clone(), config)
            .await
            .with_context(|| format!("registering the simulated nodes of cluster {name}"))?;
        tensile_testenv::schedulable(&client, name, &names)
            .await
            .with_context(|| format!("waiting for the nodes of cluster {name}"))?;
        let stop = CancellationToken::new();
        tensile_testenv::provisioner::start(client, stop.clone());
        (Some(kubelet), Some(stop.drop_guard()))
    };
    Ok(Cluster {
        name: name.to_owned(),
        entry,
        backend: Backend::Real(Box::new(cluster)),
        kubelet,
        real_nodes,
        _provisioner: provisioner,
    })
}

/// A running sandbox; [`Sandbox::stop`] shuts it down.
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
            if let Some(binary) = &spec.virtual_node_binary {
                virtual_node_processes.push(
                    start_virtual_node_process(binary, &node_name, kubelet_ip, &upper, lower)
                        .await?,
                );
                virtual_nodes.push(node_name);
                continue;
            }
            let vn_args = crate::virtual_node::parse_args([
                "--nodename",
                &node_name,
                // Virtual pods tolerate not-ready and unreachable (the webhook adds that), not
                // the provider taint: the original's manifest disables it too.
                "--disable-taint",
            ])
            .context("virtual node flags")?;
            let address = kubelet_ip.to_string();
            let label = format!("clusterID: {name}");
            let env = move |key: &str| match key {
                "VKUBELET_POD_IP" => Some(address.clone()),
                "VKUBELET_NODE_LABEL" => Some(label.clone()),
                _ => None,
            };
            let vn = crate::virtual_node::assemble(
                &vn_args,
                KubeconfigSource::Text(upper_text.clone()),
                KubeconfigSource::Text(lower.kubeconfig(name)),
                None,
                &env,
                Some(SocketAddr::new(kubelet_ip, 0)),
            )
            .await
            .with_context(|| format!("virtual node {node_name}"))?;
            let running = vn
                .start(stop.clone())
                .await
                .with_context(|| format!("starting virtual node {node_name}"))?;
            handles.push(running.handle);
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
                            .cert,
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

/// A serving certificate for `address`, kept in `secret` of the upper cluster.
async fn serve_from_secret(
    client: &kube::Client,
    secret: &str,
    owner: &str,
    address: IpAddr,
    stop: &CancellationToken,
) -> anyhow::Result<crate::common::Serving> {
    let secret = secret.parse().map_err(anyhow::Error::msg)?;
    crate::common::serve_cert(
        crate::common::CertSource::Secret(secret),
        client,
        owner,
        &[address.to_string()],
        stop,
    )
    .await
    .with_context(|| format!("the serving certificate of {owner}"))
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
    use crate::process::free_port;
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
    use crate::process::{free_port, listening, poll_until, spawn};
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
    let serving = serve_from_secret(client, WEBHOOK_SECRET, OWNER_WEBHOOK, address, stop).await?;
    let webhook = Webhook::connected(WebhookConfig::default(), client.clone(), stop).await;
    let server = Server::start(
        SocketAddr::new(address, 0),
        tls_config_live(&serving.cert, None)?,
        Arc::new(webhook),
    )
    .await?;
    let mut config: Value = serde_saphyr::from_str(WEBHOOK_CONFIGURATION)
        .context("the shipped webhook configuration")?;
    let url = format!("https://{}/mutate", server.addr());
    let bundle = serving.bundle.borrow().clone();
    for hook in config["webhooks"].as_array_mut().into_iter().flatten() {
        hook["clientConfig"] = json!({"url": url,
            "caBundle": base64::engine::general_purpose::STANDARD.encode(&bundle)});
    }
    let config: MutatingWebhookConfiguration =
        serde_json::from_value(config).context("the shipped webhook configuration")?;
    let name = config.metadata.name.clone().unwrap_or_default();
    Api::<MutatingWebhookConfiguration>::all(client.clone())
        .create(&PostParams::default(), &config)
        .await
        .context("registering the webhook")?;
    tokio::spawn(crate::webhook::keep_ca_bundle(
        client.clone(),
        name,
        serving.bundle,
        stop.clone(),
    ));
    Ok(server)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Pod;
    use tensile_testenv::eventually;

    #[test]
    fn lower_clusters_take_the_ports_after_the_upper_one() {
        assert_eq!(port_of(7443, 0).unwrap(), 7443);
        assert_eq!(port_of(7443, 2).unwrap(), 7445);
        assert_eq!(port_of(0, 2).unwrap(), 0);
        assert!(port_of(65535, 1).is_err());
    }

    fn pod_running_on(p: &Pod) -> Option<String> {
        let running = p.status.as_ref()?.phase.as_deref() == Some("Running");
        running
            .then(|| p.spec.as_ref()?.node_name.clone())
            .flatten()
    }

    /// The scenario placement is for (docs/placement.md): a pod that cannot fit in lower
    /// cluster A (its nodes are too small, though their sum is not) ends Running in lower
    /// cluster B, through its controller (a Deployment) and re-created by the descheduler (a
    /// bare pod that opted in).
    #[tokio::test]
    async fn a_pod_that_cannot_fit_in_lower_cluster_a_ends_running_in_b() {
        let node = |name: &str, cpu: &str| SimNode::new(name, cpu, "16Gi");
        let descheduler = DeschedulerConfig {
            policy: tensile_core::deschedule::Policy {
                unschedulable_for: k8s_openapi::jiff::SignedDuration::from_secs(2),
                ..Default::default()
            },
            ..Default::default()
        };
        let sandbox = Sandbox::start(
            SandboxSpec {
                address: "127.0.0.1".parse().unwrap(),
                port: 0,
                // Upstairs lower-1 looks bigger (12 CPU) than lower-2 (9 CPU), so the upper
                // scheduler sends a 4-CPU pod there first; no node of lower-1 can hold it.
                // lower-2 holds two.
                lowers: vec![
                    vec![
                        node("a-1", "3"),
                        node("a-2", "3"),
                        node("a-3", "3"),
                        node("a-4", "3"),
                    ],
                    vec![node("b-1", "9")],
                ],
                webhook: true,
                descheduler: Some(descheduler),
                extender: None,
                k8s_bin: None,
                virtual_node_binary: None,
                scheduler_qps: None,
                real_nodes: false,
            },
            &|_| {},
        )
        .await
        .unwrap();
        sandbox.wait_ready(Duration::from_secs(30)).await.unwrap();
        let client = sandbox.upper.client().await.unwrap();
        let template = json!({"metadata": {"labels": {"app": "big", "virtual-pod": "true"}},
            "spec": {"containers": [{"name": "c", "image": "nginx",
                "resources": {"requests": {"cpu": "4", "memory": "1Gi"}}}]}});
        let deployment: k8s_openapi::api::apps::v1::Deployment = serde_json::from_value(json!({
            "metadata": {"name": "big"},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "big"}}, "template": template}
        }))
        .unwrap();
        Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(client.clone(), "default")
            .create(&PostParams::default(), &deployment)
            .await
            .unwrap();
        let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
        // It went to lower-1 first and was found Unschedulable there.
        eventually(
            60,
            "the Deployment's pod is Unschedulable on vk-lower-1",
            || async {
                pods.list(&Default::default())
                    .await
                    .unwrap()
                    .items
                    .iter()
                    .any(|p| {
                        p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some("vk-lower-1")
                            && p.status
                                .as_ref()
                                .and_then(|s| s.conditions.as_ref())
                                .is_some_and(|c| {
                                    c.iter()
                                        .any(|c| c.reason.as_deref() == Some("Unschedulable"))
                                })
                    })
                    .then_some(())
            },
        )
        .await;
        eventually(90, "the Deployment's pod Running on vk-lower-2", || async {
            let list = pods.list(&Default::default()).await.unwrap().items;
            list.iter()
                .any(|p| pod_running_on(p).as_deref() == Some("vk-lower-2"))
                .then_some(())
        })
        .await;

        // A bare pod that opted in is re-created under its name by the descheduler.
        let mut bare: Pod = serde_json::from_value(template).unwrap();
        bare.metadata.name = Some("bare".into());
        bare.metadata.annotations = Some(
            [(
                "descheduler.alpha.kubernetes.io/evict".to_owned(),
                "true".to_owned(),
            )]
            .into(),
        );
        bare.spec.as_mut().unwrap().node_name = Some("vk-lower-1".into());
        pods.create(&PostParams::default(), &bare).await.unwrap();
        let moved = eventually(90, "the bare pod Running on vk-lower-2", || async {
            let p = pods.get_opt("bare").await.unwrap()?;
            (pod_running_on(&p).as_deref() == Some("vk-lower-2")).then_some(p)
        })
        .await;
        let annotations = moved.metadata.annotations.unwrap();
        assert_eq!(annotations["sigs.k8s.io/deschedule-count"], "1");
        assert_eq!(annotations["tensile-kube.io/excluded-nodes"], "vk-lower-1");
        assert_eq!(annotations["descheduler.alpha.kubernetes.io/evict"], "true");
        sandbox.stop().await;
    }
}
