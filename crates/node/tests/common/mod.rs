//! Helpers of the virtual-node end-to-end tests: simulated clusters, a virtual node on them,
//! and waiting on conditions with deadlines.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::net::SocketAddr;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use serde_json::json;
use tensile_core::node::NodeIdentity;
use tensile_core::translate::TranslateConfig;
use tensile_node::node::NodeLoop;
use tensile_node::pods::PodSettings;
use tensile_node::{KubeletApi, Metrics, VirtualNode};
use tensile_runtime::clients::{ApiCalls, KubeconfigSource, build_client};
use tensile_testenv::{ClusterSpec, TestEnv};
use tokio_util::sync::CancellationToken;

pub use tensile_testenv::eventually;

/// An upper cluster and a lower cluster of two nodes (8 CPUs), with virtual node `vk-lower`.
pub async fn start() -> (TestEnv, CancellationToken) {
    let env = clusters().await;
    let stop = spawn_node(&env, "vk-lower").await;
    (env, stop)
}

/// The two clusters of [`start`], without a virtual node.
pub async fn clusters() -> TestEnv {
    TestEnv::start_with(vec![
        ClusterSpec::new("upper", 0),
        ClusterSpec::new("lower", 2),
    ])
    .await
    .unwrap()
}

/// Starts a virtual node `name` for the env's lower cluster.
pub async fn spawn_node(env: &TestEnv, name: &str) -> CancellationToken {
    spawn(env, NodeOptions::new(name)).await.stop
}

/// Starts a virtual node `name` that talks to the lower cluster through `lower`.
pub async fn spawn_node_with(env: &TestEnv, name: &str, lower: kube::Client) -> CancellationToken {
    spawn(env, NodeOptions::new(name).lower(lower)).await.stop
}

/// How a test's virtual node differs from the default.
pub struct NodeOptions {
    pub name: String,
    pub lower: Option<kube::Client>,
    pub service_accounts: bool,
    pub metrics: bool,
    pub heartbeat: Duration,
    pub lease_renew: Duration,
    /// Mirror Services and Endpoints (`ServiceControllers`, default filter).
    pub services: bool,
    /// Mirror volumes and claim bindings (`PVControllers`).
    pub volumes: bool,
    /// The lease's holder identity (default: `<name>_test`, the same at each restart).
    pub holder: Option<String>,
    /// The kubelet API's client CA (default: the upper cluster's CA).
    pub client_ca: Option<tensile_node::ClientCa>,
    /// `--pod-identity upper` (the default) or `lower`.
    pub upper_identity: bool,
    /// `--kube-api-qps` (and burst: twice it) of the upper clients (default 500).
    pub upper_qps: f32,
    /// `--authentication-token-webhook` (default true).
    pub token_reviews: bool,
    /// When a failed pod sync is tried again (default: the node's).
    pub retry: tensile_node::Retry,
    /// The upper kubeconfig (default: the administrator's).
    pub upper_kubeconfig: Option<String>,
}

impl NodeOptions {
    pub fn new(name: &str) -> Self {
        Self {
            name: name.into(),
            lower: None,
            service_accounts: true,
            metrics: false,
            heartbeat: Duration::from_secs(60),
            lease_renew: Duration::from_millis(500),
            services: false,
            volumes: false,
            holder: None,
            client_ca: None,
            upper_identity: true,
            upper_qps: 500.0,
            token_reviews: true,
            retry: Default::default(),
            upper_kubeconfig: None,
        }
    }

    pub fn lower(mut self, lower: kube::Client) -> Self {
        self.lower = Some(lower);
        self
    }
}

/// A started virtual node.
pub struct Spawned {
    pub stop: CancellationToken,
    pub kubelet: SocketAddr,
    pub metrics: Option<SocketAddr>,
    /// The API calls its clients made.
    pub calls: ApiCalls,
}

/// Starts a virtual node as `opts` say (kubelet API on a free port, authn/authz on, the upper
/// cluster's CA for client certificates).
pub async fn spawn(env: &TestEnv, opts: NodeOptions) -> Spawned {
    try_spawn(env, opts).await.unwrap()
}

/// [`spawn`], returning why the node refused to start.
pub async fn try_spawn(
    env: &TestEnv,
    opts: NodeOptions,
) -> Result<Spawned, tensile_node::StartError> {
    // The node's warnings (or what TENSILE_TEST_LOG asks for) go with a failed test's output.
    let filter = tracing_subscriber::EnvFilter::try_from_env("TENSILE_TEST_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_env_filter(filter)
        .try_init();
    // Clients as the binary builds them (rate limits, counting, no hidden retries).
    let mut registry = prometheus_client::registry::Registry::default();
    let calls = ApiCalls::new(&mut registry);
    let client = |i: usize, cluster: &'static str| {
        let text = std::fs::read_to_string(&env.clusters[i].kubeconfig).unwrap();
        let calls = calls.clone();
        async move {
            build_client(KubeconfigSource::Text(text), 500.0, 1000, cluster, &calls)
                .await
                .unwrap()
        }
    };
    // The upper clients as the binary builds them: one bucket each at the same limits.
    let upper_text = opts
        .upper_kubeconfig
        .clone()
        .unwrap_or_else(|| std::fs::read_to_string(&env.clusters[0].kubeconfig).unwrap());
    let uppers = tensile_node::clients::UpperClients::build(
        &KubeconfigSource::Text(upper_text),
        None,
        opts.upper_qps,
        0,
        &calls,
    )
    .await
    .unwrap();
    let upper = uppers.work.clone();
    // As the binary's default: pods reach the upper API server where the node does.
    let upper_server = kube::config::Kubeconfig::read_from(&env.clusters[0].kubeconfig)
        .ok()
        .and_then(|k| k.clusters.first()?.cluster.as_ref()?.server.clone())
        .unwrap();
    let upper_api = tensile_core::identity::UpperApi::parse(&upper_server).unwrap();
    let lower = match opts.lower.clone() {
        Some(l) => l,
        None => client(1, "lower").await,
    };
    let version = lower.apiserver_version().await.unwrap().git_version;
    let name = opts.name.as_str();
    // Not loopback: API servers refuse nodes/proxy to loopback kubelets.
    let address = tensile_testenv::testhost::address().unwrap().to_string();
    let vn = VirtualNode {
        heartbeat: uppers.heartbeat,
        node: NodeLoop {
            identity: NodeIdentity {
                name: name.into(),
                extra_label: Some(("clusterID".into(), "lower".into())),
                taint: None,
                internal_ip: address.clone(),
                external_ip: None,
                kubelet_port: 10250,
                lower_version: version,
            },
            owner: name.into(),
            not_ready_after: None,
            lease_renew: opts.lease_renew,
            heartbeat: opts.heartbeat,
            // One identity per node name: a test's restart is this process again.
            holder_identity: opts
                .holder
                .clone()
                .unwrap_or_else(|| format!("{name}_test")),
            leader_elected: false,
            api_calls: calls.clone(),
        },
        pods: PodSettings {
            upper_events: uppers.events,
            upper,
            lower,
            node: name.into(),
            lower_name: "lower".into(),
            translate: TranslateConfig {
                upper_api: opts.upper_identity.then(|| upper_api.clone()),
                ..TranslateConfig::new(name)
            },
            workers: 8,
            service_accounts: opts.service_accounts,
            retry: opts.retry,
        },
        kubelet: Some(KubeletApi {
            listen: format!("{address}:0").parse().unwrap(),
            cert: tensile_kubelet::ServingCert::SelfSigned {
                sans: vec![address.clone()],
            },
            client_ca: opts.client_ca.clone().unwrap_or_else(|| {
                tensile_node::ClientCa::Pem(env.clusters[0].ca_pem().to_owned())
            }),
            auth_disabled: false,
            token_reviews: opts.token_reviews,
            review_ttls: Default::default(),
            reviews: uppers.reviews,
        }),
        metrics: Metrics {
            registry,
            listen: opts.metrics.then(|| "127.0.0.1:0".parse().unwrap()),
        },
        services: opts
            .services
            .then(tensile_core::services::ServiceFilter::default),
        volumes: opts.volumes,
        node_ports: opts.services,
    };
    let stop = CancellationToken::new();
    let running = vn.start(stop.clone()).await?;
    Ok(Spawned {
        stop,
        kubelet: running.kubelet_addr.unwrap(),
        metrics: running.metrics_addr,
        calls,
    })
}

/// A pod named `name` (label `app=<name>`) bound to `node`, merged with `extra`.
pub fn pod(name: &str, node: &str, extra: serde_json::Value) -> Pod {
    let mut p = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"app": name}},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "nginx:1.27"}]}});
    json_patch::merge(&mut p, &extra);
    serde_json::from_value(p).unwrap()
}

/// Creates pod `name` on `vk-lower` with `spec` merged into the default one and waits until
/// it runs.
pub async fn run_pod_spec(upper: &kube::Client, name: &str, spec: serde_json::Value) {
    let pods: Api<Pod> = Api::namespaced(upper.clone(), "default");
    pods.create(
        &kube::api::PostParams::default(),
        &pod(name, "vk-lower", json!({ "spec": spec })),
    )
    .await
    .unwrap();
    eventually(30, &format!("{name} Running"), || async {
        (phase(&pods, name).await? == "Running").then_some(())
    })
    .await;
}

/// Waits until `name` is gone from `api` (failing after `secs`).
pub async fn gone<K>(api: &Api<K>, name: &str, secs: u64, what: &str)
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned,
{
    eventually(secs, what, || async {
        api.get_opt(name).await.ok()?.is_none().then_some(())
    })
    .await;
}

/// The pod's phase, if it exists and has one.
pub async fn phase(api: &Api<Pod>, name: &str) -> Option<String> {
    api.get_opt(name).await.ok()??.status?.phase
}
