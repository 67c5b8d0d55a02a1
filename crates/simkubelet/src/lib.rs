//! Simulated nodes: a kubelet for N nodes that only talks to the Kubernetes API (kube-rs), so
//! it works the same against the embedded server and a real control plane. It registers the
//! nodes, renews their leases, runs the pods bound to them (Running with an IP from a per-node
//! range, conditions, container statuses, init containers, restart policy) and finishes their
//! graceful deletion.
//!
//! Each node serves the kubelet API (`tensile-kubelet`, see [`api`]) on its own loopback
//! address, authenticated and authorized like a kubelet's: the API server's client certificate
//! (checked against the cluster CA from `kube-root-ca.crt`) or a bearer token (TokenReview),
//! then a SubjectAccessReview.
//!
//! Containers run a tiny deterministic program read from their command and args: `sleep N`
//! ends after N seconds with exit code 0, `exit N` ends at once with code N; anything else runs
//! until the pod is deleted. Restarts follow the restart policy with the kubelet's back-off
//! ([`containers`]); the environment is resolved as the kubelet resolves it ([`env`]).
#![forbid(unsafe_code)]

mod api;
mod containers;
mod env;
mod shell;

use std::collections::{BTreeMap, HashMap};
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Container, Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};
use tokio::sync::{Mutex, watch};
use tokio_util::sync::CancellationToken;

/// A timestamp as Kubernetes writes it (RFC 3339, whole seconds, UTC).
fn time_string(t: Timestamp) -> String {
    match serde_json::to_value(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(t)) {
        Ok(Value::String(s)) => s,
        _ => t.to_string(),
    }
}

/// One simulated node.
#[derive(Clone, Debug)]
pub struct SimNode {
    /// Node name.
    pub name: String,
    /// Allocatable (and capacity) resources, e.g. `cpu: "4"`, `memory: "8Gi"`, `pods: "110"`.
    pub resources: BTreeMap<String, String>,
    /// Extra labels.
    pub labels: BTreeMap<String, String>,
    /// Taints, as JSON objects (`{"key":..,"value":..,"effect":..}`).
    pub taints: Vec<Value>,
}

impl SimNode {
    /// A node with `cpu` cores, `memory` and 110 pods.
    pub fn new(name: impl Into<String>, cpu: &str, memory: &str) -> Self {
        Self {
            name: name.into(),
            resources: BTreeMap::from([
                ("cpu".to_owned(), cpu.to_owned()),
                ("memory".to_owned(), memory.to_owned()),
                ("pods".to_owned(), "110".to_owned()),
                ("ephemeral-storage".to_owned(), "100Gi".to_owned()),
            ]),
            labels: BTreeMap::new(),
            taints: Vec::new(),
        }
    }
}

/// How the simulated kubelet behaves.
#[derive(Clone, Debug)]
pub struct SimKubeletConfig {
    /// The nodes it runs.
    pub nodes: Vec<SimNode>,
    /// Lease renewal period (a real kubelet renews every 10 s).
    pub lease_renew: Duration,
    /// Lease duration written on the lease.
    pub lease_duration_seconds: i32,
    /// The second octet of pod IPs: node `i` gives pods `10.<octet>.<i>.<n>`.
    pub pod_network_octet: u8,
    /// Kubelet version reported on the nodes.
    pub kubelet_version: String,
    /// Serve the kubelet API on each node (logs, exec, attach, port-forward, stats).
    pub kubelet_api: bool,
    /// The address every node listens on and reports as its InternalIP (ports differ). None:
    /// each node gets its own loopback address, which API servers refuse to `nodes/proxy` to
    /// unless told otherwise (see `env::testhost`).
    pub address: Option<Ipv4Addr>,
}

impl Default for SimKubeletConfig {
    fn default() -> Self {
        Self {
            nodes: vec![SimNode::new("sim-node-1", "4", "8Gi")],
            lease_renew: Duration::from_secs(10),
            lease_duration_seconds: 40,
            pod_network_octet: 244,
            kubelet_version: "v1.33.4-sim".to_owned(),
            kubelet_api: true,
            address: None,
        }
    }
}

/// A running simulated kubelet. Dropping it (or [`SimKubelet::stop`]) stops every node: leases
/// are no longer renewed and the kubelet APIs close, as when a real node goes away.
#[derive(Debug)]
pub struct SimKubelet {
    stop: CancellationToken,
    _servers: Vec<tensile_kubelet::KubeletServer>,
}

impl Drop for SimKubelet {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Registering the nodes failed.
#[derive(Debug, thiserror::Error)]
pub enum SimKubeletError {
    /// The API refused the node.
    #[error("registering simulated node {node}: {source}")]
    Register {
        /// Which node.
        node: String,
        /// Why.
        #[source]
        source: kube::Error,
    },
    /// The kubelet API could not start.
    #[error("kubelet API of simulated node {node}: {message}")]
    KubeletApi {
        /// Which node.
        node: String,
        /// Why.
        message: String,
    },
}

struct Shared {
    client: kube::Client,
    config: SimKubeletConfig,
    /// node name -> (index, next host number)
    ips: Mutex<HashMap<String, (usize, u32)>>,
    /// pod uid -> the program task running its containers
    running: Mutex<HashMap<String, Running>>,
    /// (namespace, name) -> the pods bound to our nodes, for the kubelet API
    pods: std::sync::Mutex<HashMap<(String, String), Pod>>,
    /// (pod uid, container) -> the files of the container that `exec` sees
    files: std::sync::Mutex<shell::Files>,
}

/// The task running one pod's containers.
struct Running {
    stop: CancellationToken,
    /// The pod's ephemeral containers as last seen, for the task to start the new ones.
    ephemeral: watch::Sender<Vec<Container>>,
    /// The pod's readiness gates as last seen ([`gate_states`]).
    gates: watch::Sender<GateStates>,
}

/// Each readiness gate's condition type and that condition's status (`None`: not set yet).
type GateStates = Vec<(String, Option<String>)>;

/// Each readiness gate of the pod with the status of its condition (`None`: no such condition
/// yet). Others set these conditions; the kubelet only reads them into `Ready`.
fn gate_states(pod: &Pod) -> GateStates {
    let conditions = pod.status.as_ref().and_then(|s| s.conditions.as_ref());
    pod.spec
        .iter()
        .flat_map(|s| s.readiness_gates.iter().flatten())
        .map(|g| {
            let status = conditions
                .into_iter()
                .flatten()
                .find(|c| c.type_ == g.condition_type)
                .map(|c| c.status.clone());
            (g.condition_type.clone(), status)
        })
        .collect()
}

/// Why the readiness gates keep the pod from being Ready, as the kubelet says it; `None` when
/// they all hold.
fn gates_unmet(gates: &[(String, Option<String>)]) -> Option<String> {
    gates
        .iter()
        .find_map(|(gate, status)| match status.as_deref() {
            Some("True") => None,
            Some(other) => Some(format!(
                "the status of pod readiness gate \"{gate}\" is not \"True\", but {other}"
            )),
            None => Some(format!(
                "corresponding condition of pod readiness gate \"{gate}\" does not exist."
            )),
        })
}

/// A pod's ephemeral containers, as the containers they are run as (`kubectl debug`).
fn ephemeral_containers(pod: &Pod) -> Vec<Container> {
    pod.spec
        .iter()
        .flat_map(|s| s.ephemeral_containers.iter().flatten())
        .filter_map(|e| {
            serde_json::to_value(e)
                .and_then(serde_json::from_value::<Container>)
                .ok()
        })
        .collect()
}

impl Shared {
    /// The file system of container `container` of `pod`, made at first use.
    fn files_of(&self, pod: &Pod, container: &str) -> Arc<std::sync::Mutex<shell::Fs>> {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let mut files = self
            .files
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        files
            .entry((uid, container.to_owned()))
            .or_insert_with(|| Arc::new(std::sync::Mutex::new(shell::Fs::new(pod))))
            .clone()
    }

    /// Forgets the files of a pod that is gone.
    fn forget_files(&self, uid: &str) {
        let mut files = self
            .files
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        files.retain(|(u, _), _| u != uid);
    }
}

impl SimKubelet {
    /// Registers the nodes and starts running their pods.
    pub async fn start(
        client: kube::Client,
        config: SimKubeletConfig,
    ) -> Result<Self, SimKubeletError> {
        let shared = Arc::new(Shared {
            client: client.clone(),
            ips: Mutex::new(
                config
                    .nodes
                    .iter()
                    .enumerate()
                    .map(|(i, n)| (n.name.clone(), (i, 2)))
                    .collect(),
            ),
            config: config.clone(),
            running: Mutex::new(HashMap::new()),
            pods: std::sync::Mutex::new(HashMap::new()),
            files: std::sync::Mutex::new(HashMap::new()),
        });
        let mut servers = Vec::new();
        let mut ports = Vec::new();
        if config.kubelet_api {
            let client_ca = wait_for_client_ca(&client).await;
            for (i, n) in config.nodes.iter().enumerate() {
                let server = serve_kubelet_api(&shared, &client, n, i, client_ca.clone())
                    .await
                    .map_err(|message| SimKubeletError::KubeletApi {
                        node: n.name.clone(),
                        message,
                    })?;
                ports.push(i32::from(server.addr().port()));
                servers.push(server);
            }
        }
        let nodes: Api<Node> = Api::all(client.clone());
        for (i, n) in config.nodes.iter().enumerate() {
            let port = ports.get(i).copied().unwrap_or(10250);
            register(&nodes, n, i, &config, port)
                .await
                .map_err(|source| SimKubeletError::Register {
                    node: n.name.clone(),
                    source,
                })?;
        }
        let stop = CancellationToken::new();
        tokio::spawn(leases(shared.clone(), stop.clone()));
        tokio::spawn(pods(shared, stop.clone()));
        Ok(Self {
            stop,
            _servers: servers,
        })
    }

    /// Stops every node (leases expire, pods are no longer looked after).
    pub fn stop(&self) {
        self.stop.cancel();
    }
}

fn node_ip(config: &SimKubeletConfig, index: usize) -> String {
    if let Some(ip) = config.address {
        return ip.to_string();
    }
    // 127.0.0.0/8 is all loopback: each node gets its own address, all reachable here.
    Ipv4Addr::new(127, 0, 10 + (index / 250) as u8, (index % 250) as u8 + 1).to_string()
}

fn conditions(now: &str) -> Value {
    json!([
        {"type": "MemoryPressure", "status": "False", "reason": "KubeletHasSufficientMemory", "message": "kubelet has sufficient memory available", "lastHeartbeatTime": now, "lastTransitionTime": now},
        {"type": "DiskPressure", "status": "False", "reason": "KubeletHasNoDiskPressure", "message": "kubelet has no disk pressure", "lastHeartbeatTime": now, "lastTransitionTime": now},
        {"type": "PIDPressure", "status": "False", "reason": "KubeletHasSufficientPID", "message": "kubelet has sufficient PID available", "lastHeartbeatTime": now, "lastTransitionTime": now},
        {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status", "lastHeartbeatTime": now, "lastTransitionTime": now}
    ])
}

async fn serve_kubelet_api(
    shared: &Arc<Shared>,
    client: &kube::Client,
    n: &SimNode,
    index: usize,
    client_ca: Option<String>,
) -> Result<tensile_kubelet::KubeletServer, String> {
    let ip = node_ip(&shared.config, index);
    let listen: std::net::SocketAddr = format!("{ip}:0").parse().map_err(|e| format!("{e}"))?;
    let config = tensile_kubelet::KubeletServerConfig {
        listen,
        cert: tensile_kubelet::ServingCert::SelfSigned {
            sans: vec![ip, n.name.clone()],
        },
        client_ca_pem: client_ca,
        auth: tensile_kubelet::Auth::Webhook(Box::new(tensile_kubelet::WebhookAuth::new(
            client.clone(),
            n.name.clone(),
        ))),
        streaming: tensile_kubelet::StreamingConfig::default(),
    };
    let backend = Arc::new(api::SimBackend {
        node: n.name.clone(),
        shared: shared.clone(),
        started: time_string(Timestamp::now()),
        cpu: std::sync::Mutex::new(tensile_kubelet::stats::CpuIntegrator::default()),
    });
    tensile_kubelet::KubeletServer::start(config, backend)
        .await
        .map_err(|e| e.to_string())
}

async fn register(
    nodes: &Api<Node>,
    n: &SimNode,
    index: usize,
    config: &SimKubeletConfig,
    kubelet_port: i32,
) -> Result<(), kube::Error> {
    let mut labels = BTreeMap::from([
        ("kubernetes.io/hostname".to_owned(), n.name.clone()),
        ("kubernetes.io/os".to_owned(), "linux".to_owned()),
        ("kubernetes.io/arch".to_owned(), "amd64".to_owned()),
        ("beta.kubernetes.io/os".to_owned(), "linux".to_owned()),
        ("beta.kubernetes.io/arch".to_owned(), "amd64".to_owned()),
    ]);
    labels.extend(n.labels.clone());
    let node: Node = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": n.name, "labels": labels},
        "spec": {"taints": n.taints, "podCIDR": format!("10.{}.{index}.0/24", config.pod_network_octet)},
    }))
    .map_err(kube::Error::SerdeError)?;
    match nodes.create(&PostParams::default(), &node).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => return Err(e),
    }
    let now = time_string(Timestamp::now());
    let status = json!({"status": {
        "capacity": n.resources, "allocatable": n.resources,
        "conditions": conditions(&now),
        "addresses": [{"type": "InternalIP", "address": node_ip(config, index)}, {"type": "Hostname", "address": n.name}],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": kubelet_port}},
        "nodeInfo": {"machineID": format!("sim-{index}"), "systemUUID": format!("sim-{index}"), "bootID": format!("sim-{index}"),
            "kernelVersion": "6.1.0-sim", "osImage": "tensile-sim", "containerRuntimeVersion": "sim://1.0",
            "kubeletVersion": config.kubelet_version, "kubeProxyVersion": config.kubelet_version,
            "operatingSystem": "linux", "architecture": "amd64"}
    }});
    nodes
        .patch_status(&n.name, &PatchParams::default(), &Patch::Merge(status))
        .await?;
    Ok(())
}

async fn leases(shared: Arc<Shared>, stop: CancellationToken) {
    let leases: Api<Lease> = Api::namespaced(shared.client.clone(), "kube-node-lease");
    let nodes: Api<Node> = Api::all(shared.client.clone());
    let mut ticker = tokio::time::interval(shared.config.lease_renew);
    // The lease each node last wrote: renewed by one update, as the kubelet's lease controller
    // does, read back only when that update fails (a conflict, the lease gone).
    let mut latest: HashMap<String, Lease> = HashMap::new();
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = ticker.tick() => {}
        }
        for n in &shared.config.nodes {
            renew(&leases, &nodes, n, &shared.config, &mut latest).await;
        }
    }
}

async fn renew(
    leases: &Api<Lease>,
    nodes: &Api<Node>,
    n: &SimNode,
    config: &SimKubeletConfig,
    latest: &mut HashMap<String, Lease>,
) {
    let now = MicroTime(Timestamp::now());
    let Ok(node) = nodes.get(&n.name).await else {
        return;
    };
    let uid = node.metadata.uid.clone().unwrap_or_default();
    let lease: Result<Lease, _> = serde_json::from_value(json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": n.name, "namespace": "kube-node-lease",
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": n.name, "uid": uid}]},
        "spec": {"holderIdentity": n.name, "leaseDurationSeconds": config.lease_duration_seconds, "renewTime": now},
    }));
    let Ok(lease) = lease else { return };
    let renewed = match latest.remove(&n.name) {
        Some(mut known) => {
            known.spec = lease.spec.clone();
            leases
                .replace(&n.name, &PostParams::default(), &known)
                .await
                .ok()
        }
        None => None,
    };
    let renewed = match renewed {
        Some(l) => Some(l),
        None => match leases.get_opt(&n.name).await {
            Ok(Some(mut existing)) => {
                existing.spec = lease.spec;
                leases
                    .replace(&n.name, &PostParams::default(), &existing)
                    .await
                    .ok()
            }
            Ok(None) => leases.create(&PostParams::default(), &lease).await.ok(),
            Err(_) => return,
        },
    };
    if let Some(l) = renewed {
        latest.insert(n.name.clone(), l);
    }
    // Back from an outage: report Ready again, as a kubelet does on its next status update.
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    if !ready {
        let stamp = time_string(Timestamp::now());
        let _ = nodes
            .patch_status(
                &n.name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"conditions": conditions(&stamp)}})),
            )
            .await;
    }
}

async fn pods(shared: Arc<Shared>, stop: CancellationToken) {
    let api: Api<Pod> = Api::all(shared.client.clone());
    let stream = watcher(api, watcher::Config::default()).default_backoff();
    futures::pin_mut!(stream);
    loop {
        let event = tokio::select! {
            () = stop.cancelled() => return,
            e = stream.next() => e,
        };
        let Some(Ok(event)) = event else { continue };
        match event {
            watcher::Event::Apply(pod) | watcher::Event::InitApply(pod) => {
                remember(&shared, &pod);
                handle(&shared, &stop, pod).await
            }
            watcher::Event::Delete(pod) => {
                if let (Some(ns), Some(name), Ok(mut pods)) = (
                    pod.metadata.namespace.clone(),
                    pod.metadata.name.clone(),
                    shared.pods.lock(),
                ) {
                    pods.remove(&(ns, name));
                }
                if let Some(uid) = pod.metadata.uid {
                    shared.forget_files(&uid);
                    if let Some(r) = shared.running.lock().await.remove(&uid) {
                        r.stop.cancel();
                    }
                }
            }
            watcher::Event::Init | watcher::Event::InitDone => {}
        }
    }
}

/// Keeps the pods bound to our nodes for the kubelet API; nothing without it (a benchmark's
/// nodes: a typed copy of each of their pods was most of what the simulated kubelet held).
fn remember(shared: &Shared, pod: &Pod) {
    if !shared.config.kubelet_api {
        return;
    }
    let ours = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.as_ref())
        .is_some_and(|n| shared.config.nodes.iter().any(|x| &x.name == n));
    let (Some(ns), Some(name)) = (pod.metadata.namespace.clone(), pod.metadata.name.clone()) else {
        return;
    };
    if let Ok(mut pods) = shared.pods.lock() {
        if ours {
            pods.insert((ns, name), pod.clone());
        } else {
            pods.remove(&(ns, name));
        }
    }
}

async fn handle(shared: &Arc<Shared>, stop: &CancellationToken, pod: Pod) {
    let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) else {
        return;
    };
    let Some(&(index, _)) = shared.ips.lock().await.get(&node) else {
        return;
    };
    let (Some(ns), Some(name), Some(uid)) = (
        pod.metadata.namespace.clone(),
        pod.metadata.name.clone(),
        pod.metadata.uid.clone(),
    ) else {
        return;
    };
    let api: Api<Pod> = Api::namespaced(shared.client.clone(), &ns);
    if pod.metadata.deletion_timestamp.is_some() {
        if let Some(r) = shared.running.lock().await.remove(&uid) {
            r.stop.cancel();
        }
        // The containers are stopped: finish the graceful deletion.
        let dp = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: Some(uid),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        let _ = api.delete(&name, &dp).await;
        return;
    }
    let phase = pod
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("Pending");
    if matches!(phase, "Succeeded" | "Failed") {
        return;
    }
    if let Some(r) = shared.running.lock().await.get(&uid) {
        // Running already: only ephemeral containers can have been added, and readiness
        // gates set.
        let wanted = ephemeral_containers(&pod);
        r.ephemeral.send_if_modified(|have| {
            let changed = *have != wanted;
            if changed {
                *have = wanted;
            }
            changed
        });
        let gates = gate_states(&pod);
        r.gates.send_if_modified(|have| {
            let changed = *have != gates;
            if changed {
                *have = gates;
            }
            changed
        });
        return;
    }
    let started_before = pod.status.as_ref().and_then(|s| s.pod_ip.clone());
    let ip = match started_before {
        Some(ip) => ip,
        None => {
            let mut ips = shared.ips.lock().await;
            let Some(slot) = ips.get_mut(&node) else {
                return;
            };
            let host = slot.1;
            slot.1 += 1;
            format!(
                "10.{}.{index}.{}",
                shared.config.pod_network_octet,
                host % 254 + 1
            )
        }
    };
    let token = stop.child_token();
    let (ephemeral, ephemeral_rx) = watch::channel(ephemeral_containers(&pod));
    let (gates, gates_rx) = watch::channel(gate_states(&pod));
    shared.running.lock().await.insert(
        uid.clone(),
        Running {
            stop: token.clone(),
            ephemeral,
            gates,
        },
    );
    tokio::spawn(run_pod(
        shared.clone(),
        api,
        pod,
        node,
        node_ip(&shared.config, index),
        ip,
        (token, ephemeral_rx, gates_rx),
    ));
}

/// How soon a status write the API server failed is tried again.
const STATUS_RETRY: Duration = Duration::from_secs(1);

/// How often a container held by a configuration error (a missing ConfigMap key, ...) is
/// tried again.
const CONFIG_RETRY: Duration = Duration::from_secs(2);

/// Runs a pod's containers ([`containers::Lifecycle`]) until they end for good or the pod is
/// deleted, writing the pod's status whenever it changes and a `BackOff` event when a
/// container waits before a restart. Ephemeral containers sent on `ephemeral` start when they
/// appear and run once (never restarted, never ready), reported apart.
async fn run_pod(
    shared: Arc<Shared>,
    api: Api<Pod>,
    pod: Pod,
    node: String,
    host_ip: String,
    pod_ip: String,
    (stop, mut ephemeral, mut gates): (
        CancellationToken,
        watch::Receiver<Vec<Container>>,
        watch::Receiver<GateStates>,
    ),
) {
    let Some(spec) = pod.spec.clone() else { return };
    let name = pod.metadata.name.clone().unwrap_or_default();
    let namespace = pod.metadata.namespace.clone().unwrap_or_default();
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let allocatable = shared
        .config
        .nodes
        .iter()
        .find(|n| n.name == node)
        .map(|n| n.resources.clone())
        .unwrap_or_default();
    let start = Timestamp::now();
    let mut errors = Vec::new();
    for c in &spec.containers {
        errors.push(config_error(&shared.client, &pod, c, &allocatable).await);
    }
    let mut life = containers::Lifecycle::start(
        &spec.containers,
        spec.restart_policy.as_deref(),
        &errors,
        start,
    );
    let mut debug = containers::Lifecycle::start(&[], Some("Never"), &[], start);
    let mut debug_specs: Vec<Container> = Vec::new();
    let init_statuses: Vec<Value> = spec.init_containers.iter().flatten().map(|c| json!({
        "name": c.name, "image": c.image, "imageID": format!("sim://{}", c.image.clone().unwrap_or_default()),
        "containerID": containers::container_id(&uid, &c.name, 0), "ready": true, "restartCount": 0, "started": false,
        "state": {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": time_string(start), "finishedAt": time_string(start)}}
    })).collect();
    let start = time_string(start);
    let mut back_offs = BackOffEvents::default();
    let mut ready_since: Option<(bool, String)> = None;
    let mut sent: Option<Value> = None;
    loop {
        let wanted = ephemeral.borrow_and_update().clone();
        for c in wanted {
            if !debug.has(&c.name) {
                let error = config_error(&shared.client, &pod, &c, &allocatable).await;
                debug.add(&c, error, Timestamp::now());
                debug_specs.push(c);
            }
        }
        let now = Timestamp::now();
        debug.advance(now);
        for happening in life.advance(now) {
            let containers::Happening::BackOff { container } = happening;
            back_offs
                .record(&shared.client, &pod, &container, &node)
                .await;
        }
        let unready = life.unready();
        let containers_ready = unready.is_empty();
        let gates_unmet = gates_unmet(&gates.borrow_and_update());
        let ready = containers_ready && gates_unmet.is_none();
        if ready_since.as_ref().is_none_or(|(r, _)| *r != ready) {
            ready_since = Some((ready, time_string(now)));
        }
        let since = ready_since.as_ref().map(|(_, t)| t.clone());
        let (containers_status, reason, message) = if containers_ready {
            ("True", Value::Null, Value::Null)
        } else {
            (
                "False",
                json!("ContainersNotReady"),
                json!(format!(
                    "containers with unready status: [{}]",
                    unready.join(" ")
                )),
            )
        };
        // `Ready` also waits for the readiness gates, as the kubelet's GeneratePodReadyCondition.
        let (ready_status, ready_reason, ready_message) = match (&gates_unmet, containers_ready) {
            (Some(why), true) => ("False", json!("ReadinessGatesNotReady"), json!(why)),
            _ => (containers_status, reason.clone(), message.clone()),
        };
        let phase = life.phase();
        let mut status = json!({"status": {
            "phase": phase, "hostIP": host_ip, "hostIPs": [{"ip": host_ip}], "podIP": pod_ip, "podIPs": [{"ip": pod_ip}],
            "startTime": start,
            "conditions": [
                {"type": "PodReadyToStartContainers", "status": "True", "lastProbeTime": null, "lastTransitionTime": start},
                {"type": "Initialized", "status": "True", "lastProbeTime": null, "lastTransitionTime": start},
                {"type": "Ready", "status": ready_status, "reason": ready_reason, "message": ready_message, "lastProbeTime": null, "lastTransitionTime": since},
                {"type": "ContainersReady", "status": containers_status, "reason": reason, "message": message, "lastProbeTime": null, "lastTransitionTime": since},
                {"type": "PodScheduled", "status": "True", "lastProbeTime": null, "lastTransitionTime": start}
            ],
            "initContainerStatuses": init_statuses,
            "containerStatuses": life.container_statuses(&uid, &name, &namespace),
        }});
        if !debug_specs.is_empty() {
            status["status"]["ephemeralContainerStatuses"] =
                debug.ephemeral_statuses(&uid, &name, &namespace);
        }
        if sent.as_ref() != Some(&status) {
            // A strategic merge keyed by condition type, as the kubelet's status manager does:
            // conditions others own (readiness gates, DisruptionTarget) are left as they are.
            match api
                .patch_status(&name, &PatchParams::default(), &Patch::Strategic(&status))
                .await
            {
                Ok(_) => sent = Some(status),
                // The pod is gone.
                Err(kube::Error::Api(e)) if e.code == 404 => return,
                // The API server failed (its etcd restarting, say): tried again, as a kubelet's
                // status manager does, rather than leaving the pod Pending for good.
                Err(_) => {
                    tokio::select! {
                        () = stop.cancelled() => return,
                        () = tokio::time::sleep(STATUS_RETRY) => continue,
                    }
                }
            }
        }
        if matches!(phase, "Succeeded" | "Failed") {
            return;
        }
        let blocked = life.blocked();
        let debug_blocked = debug.blocked();
        let wake = match (life.next_wake(), debug.next_wake()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let mut wait = wake.map(|at| {
            let d = at.duration_since(Timestamp::now());
            Duration::try_from(d).unwrap_or(Duration::ZERO)
        });
        if !blocked.is_empty() || !debug_blocked.is_empty() {
            wait = Some(wait.map_or(CONFIG_RETRY, |w| w.min(CONFIG_RETRY)));
        }
        // New ephemeral containers wake the loop too (a closed channel never does).
        let added = async {
            if ephemeral.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        };
        let sleep = async {
            match wait {
                Some(wait) => tokio::time::sleep(wait).await,
                None => std::future::pending::<()>().await,
            }
        };
        let gated = async {
            if gates.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        };
        tokio::select! {
            () = stop.cancelled() => return,
            () = sleep => {}
            () = added => {}
            () = gated => {}
        }
        for i in blocked {
            let error = config_error(&shared.client, &pod, &spec.containers[i], &allocatable).await;
            life.set_config_error(i, error, Timestamp::now());
        }
        for i in debug_blocked {
            if let Some(c) = debug_specs.get(i) {
                let error = config_error(&shared.client, &pod, c, &allocatable).await;
                debug.set_config_error(i, error, Timestamp::now());
            }
        }
    }
}

/// Why `container` cannot start (its environment names a missing ConfigMap, Secret or key),
/// as the kubelet says it; None when it can.
async fn config_error(
    client: &kube::Client,
    pod: &Pod,
    container: &k8s_openapi::api::core::v1::Container,
    allocatable: &BTreeMap<String, String>,
) -> Option<String> {
    let objects = env::objects(client, pod, container, false).await;
    env::resolve(pod, container, &objects, allocatable).err()
}

/// The `BackOff` events of one pod, one per container, counted up as a kubelet's event
/// correlator does.
#[derive(Default)]
struct BackOffEvents {
    /// container -> (event name, count, first time)
    written: HashMap<String, (String, i32, String)>,
}

impl BackOffEvents {
    /// Best effort, as a kubelet's events are.
    async fn record(&mut self, client: &kube::Client, pod: &Pod, container: &str, node: &str) {
        let (Some(name), Some(namespace), Some(uid)) = (
            pod.metadata.name.as_deref(),
            pod.metadata.namespace.as_deref(),
            pod.metadata.uid.as_deref(),
        ) else {
            return;
        };
        let now = time_string(Timestamp::now());
        let events: Api<k8s_openapi::api::core::v1::Event> =
            Api::namespaced(client.clone(), namespace);
        let entry = self.written.entry(container.to_owned()).or_insert_with(|| {
            let nanos = Timestamp::now().as_nanosecond();
            (format!("{name}.{nanos:x}"), 0, now.clone())
        });
        entry.1 += 1;
        let (event_name, count, first) = entry.clone();
        if count > 1 {
            let patch = json!({"count": count, "lastTimestamp": now});
            let _ = events
                .patch(&event_name, &PatchParams::default(), &Patch::Merge(&patch))
                .await;
            return;
        }
        let event = json!({
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": event_name, "namespace": namespace},
            "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": name, "namespace": namespace,
                "uid": uid, "fieldPath": format!("spec.containers{{{container}}}")},
            "reason": "BackOff", "type": "Warning",
            "message": format!("Back-off restarting failed container {container} in pod {name}_{namespace}({uid})"),
            "source": {"component": "kubelet", "host": node},
            "reportingComponent": "kubelet", "reportingInstance": node,
            "firstTimestamp": first, "lastTimestamp": now, "count": 1,
        });
        if let Ok(event) = serde_json::from_value(event) {
            let _ = events.create(&PostParams::default(), &event).await;
        }
    }
}

/// How long a kubelet waits for its cluster's CA before serving without it.
const CLIENT_CA_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// The cluster CA from `kube-system/kube-root-ca.crt`, waited for: on a real control plane
/// kube-controller-manager publishes it a moment after start, and a kubelet that started
/// without it refused the API server's client certificate (401 on logs and exec) for good.
async fn wait_for_client_ca(client: &kube::Client) -> Option<String> {
    let deadline = tokio::time::Instant::now() + CLIENT_CA_WAIT;
    loop {
        if let Ok(ca) = tensile_kubelet::auth::cluster_client_ca(client).await {
            return Some(ca);
        }
        if tokio::time::Instant::now() >= deadline {
            tracing::error!(
                "kube-system/kube-root-ca.crt did not appear within {} s: the kubelet API \
                 will refuse the API server's client certificate",
                CLIENT_CA_WAIT.as_secs()
            );
            return None;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}
