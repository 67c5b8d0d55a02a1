//! `tensile bench chaos`: a randomized fault run. An upper cluster, two lower clusters, a
//! virtual node for each run as two `--leader-elect` replicas, the webhook, the scheduler
//! extender and the descheduler as their own processes; churn the whole time (Deployments
//! scaled up and down, Jobs, pods deleted upstairs and downstairs, ConfigMaps and Secrets
//! updated, Services changed); and a nemesis that injects the faults of a plan computed from
//! the seed (`chaos_plan`), overlapping. A checker (`chaos_check`) reads both clusters through
//! watches of its own, straight to the API servers (not through the fault proxies), and judges
//! the invariants while the run goes and at its end. Each violation is printed with the object,
//! the time and the faults around it; the last line is one JSON object; a violation is an error
//! (exit status 1).

#![allow(clippy::print_stdout)] // the report is what the command prints

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use base64::Engine as _;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Event, Namespace, Node, Pod, Secret, Service};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use serde_json::{Value, json};
use tensile_simkubelet::{SimKubeletConfig, SimNode};
use tensile_testenv::errors::ErrorProxy;
use tensile_testenv::faults::{FaultProxy, Way as ProxyWay};
use tensile_testenv::{ClusterSpec, TestEnv};
use tokio::sync::Mutex as AsyncMutex;

use crate::chaos_check::{Action, Checker, Kind, Obj, Secs, Seen, Violation};
use crate::chaos_plan::{Fault, FaultKind, PlanSpec, Way, plan};
use crate::support::{free_port, holder_pid, poll_until, spawn_watch, with};

/// Flags of `tensile bench chaos`.
#[derive(Debug, clap::Args)]
pub struct ChaosArgs {
    /// How long the faults and the churn go on; the run then waits 60 s after the last fault
    /// and checks that everything settled.
    #[arg(long, default_value = "10m", value_parser = tensile_core::duration::parse_duration)]
    duration: Duration,
    /// The seed of the fault schedule and of the churn's choices: one seed, one schedule
    /// (default: from the clock, printed).
    #[arg(long)]
    seed: Option<u64>,
    /// The faults to draw from (comma-separated or repeated; default: every one the backend
    /// has).
    #[arg(long, value_enum, value_delimiter = ',')]
    fault: Vec<FaultKind>,
    /// Print the fault schedule and exit, starting nothing.
    #[arg(long)]
    dry_run: bool,
    /// Deployments of the churn, each scaled between 0 and `--max-replicas`.
    #[arg(long, default_value_t = 4)]
    deployments: usize,
    /// Most replicas of a churn Deployment.
    #[arg(long, default_value_t = 6)]
    max_replicas: usize,
    /// Time between two changes of the churn.
    #[arg(long, default_value = "2s", value_parser = tensile_core::duration::parse_duration)]
    churn_every: Duration,
    /// Where the processes' logs go, kept (default: a folder removed after a run without
    /// violations).
    #[arg(long)]
    log_dir: Option<PathBuf>,
}

/// The churn's namespace, upstairs (and, made by the virtual nodes, downstairs).
const NS: &str = "chaos";
/// Virtual node `i` (1, 2) is `vk-<i>` for lower cluster `lower-<i>`.
const LOWERS: usize = 2;
/// A share of requests answered with errors (lower-errors) or 429 (upper-throttle).
const ERROR_SHARE: f64 = 0.3;

fn node_name(lower: usize) -> String {
    format!("vk-{}", lower + 1)
}

/// A process of the run that a fault may kill and start again as it was.
struct Proc {
    name: String,
    args: Vec<String>,
    env: Vec<(String, String)>,
    log: PathBuf,
    child: Option<tokio::process::Child>,
    /// Killed on purpose (by a fault), until started again.
    down: bool,
}

impl Proc {
    fn new(name: &str, args: Vec<String>, env: Vec<(String, String)>, logs: &Path) -> Self {
        Self {
            name: name.to_owned(),
            args,
            env,
            log: logs.join(format!("{name}.log")),
            child: None,
            down: false,
        }
    }

    /// Starts it (again), its log continued.
    fn start(&mut self) -> anyhow::Result<()> {
        let exe = std::env::current_exe().context("finding the tensile binary")?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .with_context(|| format!("opening {}", self.log.display()))?;
        let child = tokio::process::Command::new(exe)
            .args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .env_remove("POD_NAMESPACE")
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", self.name))?;
        self.child = Some(child);
        self.down = false;
        Ok(())
    }

    /// SIGKILL, reaped.
    async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill().await;
        }
        self.down = true;
    }

    fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(tokio::process::Child::id)
    }

    /// Whether it exited by itself, and how.
    fn exited(&mut self) -> Option<String> {
        if self.down {
            return None;
        }
        let status = self.child.as_mut()?.try_wait().ok()??;
        Some(status.to_string())
    }
}

type Shared<T> = Arc<AsyncMutex<T>>;

/// What the faults act on.
struct Rig {
    /// Per lower cluster, its virtual node's two replicas.
    replicas: Vec<[Shared<Proc>; 2]>,
    /// Per lower cluster and replica: the TCP proxies on the replica's way to the upper and to
    /// its lower API server.
    paths: Vec<[(FaultProxy, FaultProxy); 2]>,
    upper_errors: ErrorProxy,
    lower_errors: Vec<ErrorProxy>,
    extender: Shared<Proc>,
    webhook: Shared<Proc>,
    /// Kept running, never a fault's target.
    _descheduler: Shared<Proc>,
}

impl Rig {
    fn processes(&self) -> Vec<Shared<Proc>> {
        let mut all: Vec<Shared<Proc>> = self.replicas.iter().flatten().cloned().collect();
        all.push(self.extender.clone());
        all.push(self.webhook.clone());
        all.push(self._descheduler.clone());
        all
    }
}

/// A kubeconfig like `text` but for its server, now `https://<addr>` (the same certificate
/// names: every proxy is on loopback).
fn kubeconfig_via(text: &str, addr: SocketAddr) -> anyhow::Result<String> {
    let mut config = kube::config::Kubeconfig::from_yaml(text).context("reading a kubeconfig")?;
    for named in &mut config.clusters {
        if let Some(cluster) = named.cluster.as_mut() {
            cluster.server = Some(format!("https://{addr}"));
        }
    }
    // JSON is YAML: every kubeconfig reader takes it.
    serde_json::to_string(&config).context("writing a kubeconfig")
}

fn write_secret(path: &Path, text: &str) -> anyhow::Result<()> {
    tensile_testenv::secret_file::write_secret(path, text)
        .with_context(|| format!("writing {}", path.display()))
}

/// The upper cluster without nodes, two lower ones with two large simulated nodes each.
async fn clusters() -> anyhow::Result<TestEnv> {
    let lower = |i: usize| {
        let name = format!("lower-{i}");
        let mut spec = ClusterSpec::new(&name, 0);
        spec.kubelet = Some(SimKubeletConfig {
            nodes: (1..=2)
                .map(|n| SimNode::new(format!("{name}-node-{n}"), "64", "256Gi"))
                .collect(),
            kubelet_api: false,
            ..Default::default()
        });
        spec
    };
    TestEnv::start_with(vec![ClusterSpec::new("upper", 0), lower(1), lower(2)])
        .await
        .context("starting the clusters")
}

/// Starts the virtual nodes, the webhook, the extender and the descheduler, each replica of a
/// node behind proxies of its own, and waits until they serve.
async fn start_rig(env: &TestEnv, logs: &Path) -> anyhow::Result<Rig> {
    let dir = env.dir();
    let upper_errors = env.clusters[0]
        .error_proxy(&dir.join("upper-errors.kubeconfig"))
        .await
        .context("the upper error proxy")?;
    let upper_text = std::fs::read_to_string(upper_errors.kubeconfig())?;
    let mut lower_errors = Vec::new();
    let (mut replicas, mut paths) = (Vec::new(), Vec::new());
    for i in 0..LOWERS {
        let errors = env.clusters[i + 1]
            .error_proxy(&dir.join(format!("lower-{}-errors.kubeconfig", i + 1)))
            .await
            .context("a lower error proxy")?;
        let lower_text = std::fs::read_to_string(errors.kubeconfig())?;
        let node = node_name(i);
        let mut pair = Vec::new();
        let mut node_paths = Vec::new();
        for r in 0..2 {
            let to_upper = FaultProxy::start(upper_errors.addr()).await?;
            let to_lower = FaultProxy::start(errors.addr()).await?;
            let upper_file = dir.join(format!("{node}-{r}-upper.kubeconfig"));
            let lower_file = dir.join(format!("{node}-{r}-lower.kubeconfig"));
            write_secret(&upper_file, &kubeconfig_via(&upper_text, to_upper.addr())?)?;
            write_secret(&lower_file, &kubeconfig_via(&lower_text, to_lower.addr())?)?;
            let kubelet_port = free_port()?;
            let mut proc = Proc::new(
                &format!("{node}-{r}"),
                vec![
                    "virtual-node".into(),
                    "--nodename".into(),
                    node.clone(),
                    "--leader-elect".into(),
                    format!("--kubeconfig={}", upper_file.display()),
                    format!("--client-kubeconfig={}", lower_file.display()),
                    "--kubelet-address=127.0.0.1".into(),
                    format!("--metrics-addr=127.0.0.1:{}", free_port()?),
                ],
                vec![
                    ("KUBELET_PORT".into(), kubelet_port.to_string()),
                    ("VKUBELET_POD_IP".into(), "127.0.0.1".into()),
                    ("POD_NAME".into(), format!("{node}-{r}")),
                    (
                        "VKUBELET_NODE_LABEL".into(),
                        format!("clusterID: lower-{}", i + 1),
                    ),
                    ("RUST_LOG".into(), "info".into()),
                ],
                logs,
            );
            proc.start()?;
            pair.push(Arc::new(AsyncMutex::new(proc)));
            node_paths.push((to_upper, to_lower));
        }
        lower_errors.push(errors);
        let [a, b]: [Shared<Proc>; 2] = pair
            .try_into()
            .map_err(|_| anyhow::anyhow!("two replicas"))?;
        replicas.push([a, b]);
        let [a, b]: [(FaultProxy, FaultProxy); 2] = node_paths
            .try_into()
            .map_err(|_| anyhow::anyhow!("two paths"))?;
        paths.push([a, b]);
    }
    let webhook = start_webhook(env, logs).await?;
    let extender = start_extender(env, logs).await?;
    let upper_file = env.clusters[0].kubeconfig.display().to_string();
    let mut descheduler = Proc::new(
        "descheduler",
        vec!["descheduler".into(), format!("--kubeconfig={upper_file}")],
        vec![("RUST_LOG".into(), "info".into())],
        logs,
    );
    descheduler.start()?;
    Ok(Rig {
        replicas,
        paths,
        upper_errors,
        lower_errors,
        extender: Arc::new(AsyncMutex::new(extender)),
        webhook: Arc::new(AsyncMutex::new(webhook)),
        _descheduler: Arc::new(AsyncMutex::new(descheduler)),
    })
}

/// `tensile webhook` with the shipped manifest's flags, registered by URL from the shipped
/// configuration (it writes its CA bundle there), ready.
async fn start_webhook(env: &TestEnv, logs: &Path) -> anyhow::Result<Proc> {
    let upper = &env.clusters[0];
    let (port, metrics) = (free_port()?, free_port()?);
    let mut config: Value = serde_saphyr::from_str(crate::sandbox::WEBHOOK_CONFIGURATION)
        .context("the shipped webhook configuration")?;
    for hook in config["webhooks"].as_array_mut().into_iter().flatten() {
        hook["clientConfig"] = json!({"url": format!("https://127.0.0.1:{port}/mutate")});
    }
    let config: MutatingWebhookConfiguration =
        serde_json::from_value(config).context("the shipped webhook configuration")?;
    let name = config.metadata.name.clone().unwrap_or_default();
    let configs = Api::<MutatingWebhookConfiguration>::all(upper.direct.clone());
    configs
        .create(&PostParams::default(), &config)
        .await
        .context("registering the webhook")?;
    let mut proc = Proc::new(
        "webhook",
        vec![
            "webhook".into(),
            format!("--kubeconfig={}", upper.kubeconfig.display()),
            "--address=127.0.0.1".into(),
            format!("--port={port}"),
            "--tls-secret=kube-system/tensile-webhook-tls".into(),
            "--tls-san=127.0.0.1".into(),
            format!("--webhook-configuration={name}"),
            format!("--metrics-addr=127.0.0.1:{metrics}"),
        ],
        vec![("RUST_LOG".into(), "info".into())],
        logs,
    );
    proc.start()?;
    let metrics = SocketAddr::from(([127, 0, 0, 1], metrics));
    let log = proc.log.clone();
    poll_until(
        "the webhook ready, its CA bundle registered",
        &log,
        Duration::from_secs(120),
        || {
            let configs = configs.clone();
            let name = name.clone();
            async move {
                let ready = matches!(
                    tensile_testenv::http_get(metrics, "/readyz").await,
                    Ok((200, _))
                );
                let bundle = configs
                    .get_opt(&name)
                    .await
                    .ok()
                    .flatten()
                    .is_some_and(|c| {
                        c.webhooks
                            .unwrap_or_default()
                            .iter()
                            .all(|w| w.client_config.ca_bundle.is_some())
                    });
                ready && bundle
            }
        },
    )
    .await?;
    Ok(proc)
}

/// `tensile scheduler` with the shipped flags for both lower clusters, and the upper
/// kube-scheduler calling it as the shipped configuration says (its `VolumeBinding` off).
async fn start_extender(env: &TestEnv, logs: &Path) -> anyhow::Result<Proc> {
    use tensile_placement::extender::KUBE_SCHEDULER_USER;
    let dir = env.dir();
    let clients = tensile_testenv::certs::Ca::new("tensile-scheduler-clients")
        .context("the scheduler's client CA")?;
    let scheduler_cert = clients
        .issue_client(KUBE_SCHEDULER_USER, None)
        .context("the scheduler's client certificate")?;
    let client_ca = dir.join("scheduler-client-ca.crt");
    write_secret(&client_ca, clients.cert_pem())?;
    let ca_file = dir.join("extender-ca.crt");
    let (port, metrics) = (free_port()?, free_port()?);
    let mut args = vec![
        "scheduler".to_owned(),
        format!("--kubeconfig={}", env.clusters[0].kubeconfig.display()),
        "--address=127.0.0.1".into(),
        format!("--port={port}"),
        "--tls-secret=kube-system/tensile-scheduler-tls".into(),
        "--tls-san=127.0.0.1".into(),
        format!("--write-ca={}", ca_file.display()),
        format!("--client-ca-file={}", client_ca.display()),
        format!("--metrics-addr=127.0.0.1:{metrics}"),
    ];
    for lower in &env.clusters[1..] {
        args.push(format!(
            "--cluster={}={}",
            lower.name,
            lower.kubeconfig.display()
        ));
    }
    let mut proc = Proc::new(
        "extender",
        args,
        vec![("RUST_LOG".into(), "info".into())],
        logs,
    );
    proc.start()?;
    let metrics = SocketAddr::from(([127, 0, 0, 1], metrics));
    poll_until(
        "the scheduler extender's /readyz",
        &proc.log.clone(),
        Duration::from_secs(120),
        || async {
            matches!(
                tensile_testenv::http_get(metrics, "/readyz").await,
                Ok((200, _))
            )
        },
    )
    .await?;
    let ca_pem = std::fs::read_to_string(&ca_file).context("the extender's CA")?;
    let extenders = crate::sandbox::shipped_extenders(
        &format!("https://127.0.0.1:{port}"),
        &ca_pem,
        &scheduler_cert,
    )?;
    let entries: Vec<Value> = extenders
        .iter()
        .map(tensile_sim::apiserver::controllers::SchedulerExtender::to_scheduler_config)
        .collect();
    env.clusters[0]
        .set_scheduler_config(&json!({
            "profiles": [{"schedulerName": "default-scheduler",
                "plugins": {"multiPoint": {"disabled": [{"name": "VolumeBinding"}]}}}],
            "extenders": entries,
        }))
        .await
        .context("the upper scheduler calling the extender")?;
    Ok(proc)
}

/// Creates `object` (JSON) in `NS` of the cluster of `client`.
async fn create<K>(client: &kube::Client, object: Value) -> anyhow::Result<()>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + std::fmt::Debug
        + serde::Serialize
        + serde::de::DeserializeOwned,
    K::DynamicType: Default,
{
    let what = object["metadata"]["name"].clone();
    let object: K = serde_json::from_value(object)?;
    Api::<K>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &object)
        .await
        .with_context(|| format!("creating {what}"))?;
    Ok(())
}

/// The churn's objects at the start: the namespace, per Deployment a ConfigMap and a Secret it
/// needs; downstairs, objects that are not ours under names the upper cluster also has (they
/// must never be written).
async fn seed_objects(env: &TestEnv, deployments: usize) -> anyhow::Result<()> {
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": NS}}))?;
    for (i, cluster) in env.clusters.iter().enumerate() {
        let c = &cluster.direct;
        // Downstairs too: the foreign objects live there before any pod does.
        Api::<Namespace>::all(c.clone())
            .create(&PostParams::default(), &ns)
            .await?;
        // Upstairs under the same names (the Service is mirrored, and would overwrite the
        // lower one if the node did not check whose it is).
        let (labels, value, port) = if i == 0 {
            (json!({}), "ours", 80)
        } else {
            (json!({"owner": "someone-else"}), "theirs", 81)
        };
        let meta = json!({"name": "foreign", "labels": labels});
        create::<ConfigMap>(c, json!({"metadata": meta, "data": {"k": value}})).await?;
        create::<Secret>(c, json!({"metadata": meta, "stringData": {"k": value}})).await?;
        create::<Service>(
            c,
            json!({"metadata": meta, "spec": {"ports": [{"port": port}]}}),
        )
        .await?;
    }
    let upper = &env.clusters[0].direct;
    for i in 0..deployments {
        let data = json!({"k": "0"});
        create::<ConfigMap>(
            upper,
            json!({"metadata": {"name": format!("conf-{i}")}, "data": data}),
        )
        .await?;
        create::<Secret>(
            upper,
            json!({"metadata": {"name": format!("secret-{i}")}, "stringData": data}),
        )
        .await?;
    }
    Ok(())
}

/// A pod template of the churn: a virtual pod (through the webhook) needing a ConfigMap and a
/// Secret, labelled `app`.
fn pod_template(app: &str, conf: &str, secret: &str, command: Option<&str>) -> Value {
    let mut container = json!({"name": "c", "image": "nginx:1.27",
        "resources": {"requests": {"cpu": "10m"}},
        "env": [{"name": "S", "valueFrom": {"secretKeyRef": {"name": secret, "key": "k"}}}],
        "volumeMounts": [{"name": "conf", "mountPath": "/conf"}]});
    if let Some(command) = command {
        container["command"] = json!(["sh", "-c", command]);
    }
    json!({"metadata": {"labels": {"app": app, tensile_core::keys::LABEL_VIRTUAL_POD: "true"}},
        "spec": {"terminationGracePeriodSeconds": 5,
            "tolerations": [{"key": tensile_core::keys::TAINT_VIRTUAL_KUBELET, "operator": "Exists"}],
            "containers": [container],
            "volumes": [{"name": "conf", "configMap": {"name": conf}}]}})
}

fn deployment(i: usize, replicas: usize) -> Value {
    let app = format!("web-{i}");
    json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": app},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": app}},
            "template": pod_template(&app, &format!("conf-{i}"), &format!("secret-{i}"), None)}})
}

/// The checker, its watches' clock, and what the run records beside it.
struct Run {
    checker: Arc<Mutex<Checker>>,
    origin: Instant,
    /// Faults as they happened: kind, from, to (seconds from `origin`).
    windows: Arc<Mutex<Vec<(String, Secs, Secs)>>>,
    /// Processes that exited by themselves, each a violation.
    crashes: Arc<Mutex<Vec<Violation>>>,
    /// Replicas that exited having lost their leadership (documented: a Deployment restarts
    /// them), by name.
    lost_leadership: Arc<Mutex<BTreeMap<String, usize>>>,
}

impl Run {
    fn now(&self) -> Secs {
        self.origin.elapsed().as_secs_f64()
    }

    fn act(&self, action: Action) {
        let at = self.now();
        let _ = with(&self.checker, |c| c.act(at, action));
    }
}

/// A watch of `api` into the checker, re-lists included.
fn watch_kind<K>(
    api: Api<K>,
    (cluster, kind): (usize, Kind),
    run: &Run,
    obj: fn(usize, &K) -> Obj,
) -> tokio::task::JoinHandle<()>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
{
    let (checker, origin) = (run.checker.clone(), run.origin);
    let mut present = BTreeSet::new();
    spawn_watch(api, move |event| {
        let at = origin.elapsed().as_secs_f64();
        let seen = match event {
            watcher::Event::Init => {
                present.clear();
                return;
            }
            watcher::Event::InitApply(o) => {
                let o = obj(cluster, &o);
                present.insert((o.namespace.clone(), o.name.clone()));
                Seen::Applied(o)
            }
            watcher::Event::InitDone => Seen::Relisted {
                cluster,
                kind,
                present: std::mem::take(&mut present),
            },
            watcher::Event::Apply(o) => Seen::Applied(obj(cluster, &o)),
            watcher::Event::Delete(o) => Seen::Deleted(obj(cluster, &o)),
        };
        let _ = with(&checker, |c| c.apply(at, seen));
    })
}

fn watch_all(env: &TestEnv, run: &Run) -> Vec<tokio::task::JoinHandle<()>> {
    let mut tasks = Vec::new();
    for (i, cluster) in env.clusters.iter().enumerate() {
        let c = cluster.direct.clone();
        tasks.push(watch_kind(
            Api::<Pod>::namespaced(c.clone(), NS),
            (i, Kind::Pod),
            run,
            Obj::pod,
        ));
        tasks.push(watch_kind(
            Api::<Service>::namespaced(c.clone(), NS),
            (i, Kind::Service),
            run,
            |i, o| Obj::meta(i, Kind::Service, &o.metadata),
        ));
        if i > 0 {
            tasks.push(watch_kind(
                Api::<ConfigMap>::namespaced(c.clone(), NS),
                (i, Kind::ConfigMap),
                run,
                |i, o| Obj::meta(i, Kind::ConfigMap, &o.metadata),
            ));
            tasks.push(watch_kind(
                Api::<Secret>::namespaced(c, NS),
                (i, Kind::Secret),
                run,
                |i, o| Obj::meta(i, Kind::Secret, &o.metadata),
            ));
        }
    }
    let (checker, origin) = (run.checker.clone(), run.origin);
    // An event listed again after a watch restart is the same eviction.
    let mut evictions = BTreeSet::new();
    tasks.push(spawn_watch(
        Api::<Event>::namespaced(env.clusters[0].direct.clone(), NS),
        move |event| {
            let (watcher::Event::Apply(e) | watcher::Event::InitApply(e)) = event else {
                return;
            };
            let reason = e.reason.as_deref().unwrap_or_default();
            if e.involved_object.kind.as_deref() == Some("Pod")
                && (reason == "Evicted" || reason == "TaintManagerEviction")
                && evictions.insert(e.metadata.uid.clone().unwrap_or_default())
            {
                let at = origin.elapsed().as_secs_f64();
                let seen = Seen::Evicted {
                    namespace: e.involved_object.namespace.clone().unwrap_or_default(),
                    name: e.involved_object.name.clone().unwrap_or_default(),
                };
                let _ = with(&checker, |c| c.apply(at, seen));
            }
        },
    ));
    tasks
}

/// What the churn did, by kind, and its calls that failed (a fault was on).
#[derive(Debug, Default, serde::Serialize)]
struct ChurnCounts {
    done: BTreeMap<&'static str, usize>,
    failed: usize,
}

/// Changes the upper cluster (and deletes lower pods) every `every` until `until`.
async fn churn(
    env: &TestEnv,
    run: &Run,
    (seed, every, until): (u64, Duration, Instant),
    (deployments, max_replicas): (usize, usize),
) -> ChurnCounts {
    let mut rng = fastrand::Rng::with_seed(seed ^ 0x00c4_a05c_4a05);
    let upper = env.clusters[0].client.clone();
    let deploy: Api<Deployment> = Api::namespaced(upper.clone(), NS);
    let jobs: Api<Job> = Api::namespaced(upper.clone(), NS);
    // Each Deployment's replicas as last set; `None` after a scale whose answer was lost
    // (it may or may not have been applied).
    let mut replicas = vec![Some(2usize); deployments];
    let mut services = [false; 3];
    let mut live_jobs: std::collections::VecDeque<String> = Default::default();
    let mut job_serial = 0;
    let mut counts = ChurnCounts::default();
    let pp = PostParams::default();
    let merge = |v: Value| Patch::Merge(v);
    while Instant::now() < until {
        tokio::time::sleep(every).await;
        let roll = rng.u32(..100);
        let d = rng.usize(..deployments.max(1));
        let version = rng.u32(..1_000_000).to_string();
        let (what, result): (&'static str, Result<(), kube::Error>) = match roll {
            0..30 => {
                let n = rng.usize(..=max_replicas);
                if replicas[d].is_none_or(|was| n < was) {
                    run.act(Action::ScaledDown {
                        namespace: NS.into(),
                        app: format!("web-{d}"),
                    });
                }
                let r = deploy
                    .patch(
                        &format!("web-{d}"),
                        &PatchParams::default(),
                        &merge(json!({"spec": {"replicas": n}})),
                    )
                    .await
                    .map(drop);
                replicas[d] = r.is_ok().then_some(n);
                ("scale", r)
            }
            30..40 => {
                let r = Api::<ConfigMap>::namespaced(upper.clone(), NS)
                    .patch(
                        &format!("conf-{d}"),
                        &PatchParams::default(),
                        &merge(json!({"data": {"k": version}})),
                    )
                    .await
                    .map(drop);
                ("configmap-update", r)
            }
            40..50 => {
                let data = base64::engine::general_purpose::STANDARD.encode(&version);
                let r = Api::<Secret>::namespaced(upper.clone(), NS)
                    .patch(
                        &format!("secret-{d}"),
                        &PatchParams::default(),
                        &merge(json!({"data": {"k": data}})),
                    )
                    .await
                    .map(drop);
                ("secret-update", r)
            }
            50..65 => {
                let s = rng.usize(..services.len());
                let api = Api::<Service>::namespaced(upper.clone(), NS);
                let name = format!("svc-{s}");
                let r = if !services[s] {
                    let svc = json!({"metadata": {"name": name},
                        "spec": {"selector": {"app": format!("web-{d}")}, "ports": [{"port": 80}]}});
                    services[s] = true;
                    match serde_json::from_value::<Service>(svc) {
                        Ok(svc) => api.create(&pp, &svc).await.map(drop),
                        Err(e) => Err(kube::Error::SerdeError(e)),
                    }
                } else if rng.bool() {
                    api.patch(
                        &name,
                        &PatchParams::default(),
                        &merge(json!({"metadata": {"labels": {"v": version}},
                            "spec": {"selector": {"app": format!("web-{d}")}}})),
                    )
                    .await
                    .map(drop)
                } else {
                    services[s] = false;
                    api.delete(&name, &DeleteParams::default()).await.map(drop)
                };
                ("service-change", r)
            }
            65..75 => {
                job_serial += 1;
                let name = format!("job-{job_serial}");
                let mut template = pod_template(
                    &name,
                    &format!("conf-{d}"),
                    &format!("secret-{d}"),
                    Some("sleep 5"),
                );
                template["spec"]["restartPolicy"] = "Never".into();
                let job = json!({"metadata": {"name": name},
                    "spec": {"backoffLimit": 0, "template": template}});
                let r = match serde_json::from_value::<Job>(job) {
                    Ok(job) => jobs.create(&pp, &job).await.map(drop),
                    Err(e) => Err(kube::Error::SerdeError(e)),
                };
                live_jobs.push_back(name);
                // At most three Jobs at a time: the oldest goes, its pods with it.
                let r = match (r, live_jobs.len() > 3) {
                    (Ok(()), true) => {
                        let old = live_jobs.pop_front().unwrap_or_default();
                        run.act(Action::DeletedWorkload {
                            namespace: NS.into(),
                            app: old.clone(),
                        });
                        jobs.delete(&old, &DeleteParams::background())
                            .await
                            .map(drop)
                    }
                    (r, _) => r,
                };
                ("job", r)
            }
            75..88 => {
                let pods = with(&run.checker, |c| c.live_pods(0)).unwrap_or_default();
                let web: Vec<_> = pods.iter().filter(|(_, n)| n.starts_with("web-")).collect();
                if web.is_empty() {
                    continue;
                }
                let (namespace, name) = web[rng.usize(..web.len())].clone();
                run.act(Action::DeletedUpper {
                    namespace: namespace.clone(),
                    name: name.clone(),
                });
                let r = Api::<Pod>::namespaced(upper.clone(), &namespace)
                    .delete(&name, &DeleteParams::default())
                    .await
                    .map(drop);
                ("upper-pod-delete", r)
            }
            _ => {
                let lower = rng.usize(1..=LOWERS);
                let pods = with(&run.checker, |c| c.live_pods(lower)).unwrap_or_default();
                if pods.is_empty() {
                    continue;
                }
                let (namespace, name) = pods[rng.usize(..pods.len())].clone();
                run.act(Action::DeletedLower {
                    cluster: lower,
                    namespace: namespace.clone(),
                    name: name.clone(),
                });
                // Someone of the lower cluster: straight to its API server.
                let r = Api::<Pod>::namespaced(env.clusters[lower].direct.clone(), &namespace)
                    .delete(&name, &DeleteParams::default())
                    .await
                    .map(drop);
                ("lower-pod-delete", r)
            }
        };
        match result {
            Ok(()) => *counts.done.entry(what).or_default() += 1,
            Err(e) => {
                counts.failed += 1;
                tracing::debug!(what, error = %e, "a churn call failed");
            }
        }
    }
    counts
}

/// The replica of lower cluster `lower`'s node that leads now: its index.
async fn leader(env: &TestEnv, rig: &Rig, lower: usize) -> Option<usize> {
    let leases: Api<Lease> = Api::namespaced(env.clusters[0].direct.clone(), "kube-system");
    let name = format!("tensile-virtual-node-{}", node_name(lower));
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if let Ok(lease) = leases.get(&name).await {
            let pid = lease
                .spec
                .and_then(|s| s.holder_identity)
                .as_deref()
                .and_then(holder_pid);
            for (i, replica) in rig.replicas[lower].iter().enumerate() {
                if pid.is_some() && replica.lock().await.pid() == pid {
                    return Some(i);
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    None
}

/// A process killed, kept down for `lasts`, started again.
async fn kill_for(proc: &Shared<Proc>, lasts: Duration) -> anyhow::Result<()> {
    proc.lock().await.kill().await;
    tokio::time::sleep(lasts).await;
    proc.lock().await.start()
}

/// Carries out one fault of the plan.
async fn inject(env: &TestEnv, rig: &Rig, fault: &Fault) -> anyhow::Result<()> {
    let lower = &env.clusters[fault.lower + 1];
    let upper = &env.clusters[0];
    let lasts = fault.lasts;
    match fault.kind {
        FaultKind::LowerApiserverKill | FaultKind::UpperApiserverKill => {
            let c = if fault.kind == FaultKind::UpperApiserverKill {
                upper
            } else {
                lower
            };
            c.kill_apiserver()?;
            tokio::time::sleep(lasts).await;
            c.start_apiserver_again().await?;
        }
        FaultKind::LowerApiserverStop => {
            lower.set_apiserver_stopped(true)?;
            tokio::time::sleep(lasts).await;
            lower.set_apiserver_stopped(false)?;
        }
        FaultKind::LowerEtcdKill => {
            lower.kill_etcd()?;
            tokio::time::sleep(lasts).await;
            lower.start_etcd_again().await?;
        }
        FaultKind::LowerNetworkCut => {
            lower.set_available(false);
            tokio::time::sleep(lasts).await;
            lower.set_available(true);
        }
        FaultKind::LowerErrors => {
            let errors = &rig.lower_errors[fault.lower];
            errors.set_error_share(ERROR_SHARE);
            tokio::time::sleep(lasts).await;
            errors.set_error_share(0.0);
        }
        FaultKind::UpperThrottle => {
            rig.upper_errors.set_throttle_share(ERROR_SHARE);
            tokio::time::sleep(lasts).await;
            rig.upper_errors.set_throttle_share(0.0);
        }
        FaultKind::NodeLeaderKill | FaultKind::NodeFollowerKill => {
            let leads = leader(env, rig, fault.lower)
                .await
                .context("no replica holds the election lease")?;
            let victim = if fault.kind == FaultKind::NodeLeaderKill {
                leads
            } else {
                1 - leads
            };
            kill_for(&rig.replicas[fault.lower][victim], lasts).await?;
        }
        FaultKind::OneWayPartition => {
            let (to_upper, to_lower) = &rig.paths[fault.lower][fault.replica];
            let proxy = if fault.upper { to_upper } else { to_lower };
            let way = match fault.way {
                Way::ToServer => ProxyWay::ToServer,
                Way::FromServer => ProxyWay::FromServer,
            };
            proxy.set_held(way, true);
            tokio::time::sleep(lasts).await;
            proxy.set_held(way, false);
        }
        FaultKind::EtcdCompaction => {
            let c = if fault.upper { upper } else { lower };
            c.compact_etcd().await?;
            c.kill_apiserver()?;
            c.start_apiserver_again().await?;
        }
        FaultKind::ExtenderKill => kill_for(&rig.extender, lasts).await?,
        FaultKind::WebhookKill => kill_for(&rig.webhook, lasts).await?,
    }
    Ok(())
}

/// Runs every fault of `faults` at its time, from `run.origin`; answers when the last ended.
async fn nemesis(env: &TestEnv, rig: &Rig, run: &Run, faults: &[Fault]) -> Vec<String> {
    let mut errors = Vec::new();
    let all = faults.iter().map(|fault| async move {
        tokio::time::sleep_until((run.origin + fault.at).into()).await;
        let from = run.now();
        println!("{from:8.1} s  fault begins: {}", fault.describe());
        let result = inject(env, rig, fault).await;
        let to = run.now();
        match result {
            Ok(()) => {
                let _ = with(&run.windows, |w| {
                    w.push((fault.kind.name().to_owned(), from, to));
                });
                println!(
                    "{to:8.1} s  fault ends:   {} ({:.1} s)",
                    fault.kind.name(),
                    to - from
                );
                None
            }
            Err(e) => Some(format!("{}: {e:#}", fault.describe())),
        }
    });
    for e in futures::future::join_all(all).await.into_iter().flatten() {
        println!("  FAULT NOT INJECTED: {e}");
        errors.push(e);
    }
    errors
}

/// Restarts, as a Deployment would, a process that exited by itself. Each exit is a violation
/// but a replica's that lost its leadership (documented: it exits so that its pod restarts).
fn watch_processes(rig: &Rig, run: &Run) -> tokio::task::JoinHandle<()> {
    let (procs, crashes, origin) = (rig.processes(), run.crashes.clone(), run.origin);
    let lost = run.lost_leadership.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            for p in &procs {
                let mut p = p.lock().await;
                if let Some(status) = p.exited() {
                    let at = origin.elapsed().as_secs_f64();
                    let tail = std::fs::read_to_string(&p.log).unwrap_or_default();
                    let last: Vec<&str> = tail.lines().rev().take(3).collect();
                    if last.iter().any(|l| l.contains("lost leadership")) {
                        println!(
                            "{at:8.1} s  {} lost its leadership and exited: restarted",
                            p.name
                        );
                        let _ = with(&lost, |l| *l.entry(p.name.clone()).or_default() += 1);
                        if let Err(e) = p.start() {
                            println!("  restarting {}: {e:#}", p.name);
                        }
                        continue;
                    }
                    println!(
                        "{at:8.1} s  PROCESS EXITED: {} ({status}); its log ends: {last:?}",
                        p.name
                    );
                    let _ = with(&crashes, |c| {
                        c.push(Violation {
                            at,
                            object: format!("process {}", p.name),
                            what: format!(
                                "exited by itself ({status}); its log: {}",
                                p.log.display()
                            ),
                        });
                    });
                    if let Err(e) = p.start() {
                        println!("  restarting {}: {e:#}", p.name);
                    }
                }
            }
        }
    })
}

/// The faults within 30 s of `at`, by kind.
fn around(windows: &[(String, Secs, Secs)], at: Secs) -> Vec<String> {
    windows
        .iter()
        .filter(|(_, from, to)| *from - 30.0 <= at && at <= *to + 30.0)
        .map(|(kind, from, to)| format!("{kind} {from:.0}-{to:.0} s"))
        .collect()
}

pub async fn run(args: ChaosArgs) -> anyhow::Result<()> {
    let real = tensile_testenv::real::bin_dir().is_some();
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_secs())
    });
    let kinds: Vec<FaultKind> = if args.fault.is_empty() {
        FaultKind::ALL
            .into_iter()
            .filter(|k| real || !k.needs_real())
            .collect()
    } else {
        args.fault.clone()
    };
    if let Some(k) = kinds.iter().find(|k| !real && k.needs_real()) {
        bail!(
            "{} needs real control planes (TENSILE_K8S_BIN): the simulator has no etcd",
            k.name()
        );
    }
    let faults = plan(&PlanSpec::new(seed, args.duration, kinds));
    println!(
        "chaos on {}: seed {seed}, {:.0} s of faults and churn, {} faults planned:",
        if real {
            "real control planes (TENSILE_K8S_BIN)"
        } else {
            "simulated clusters"
        },
        args.duration.as_secs_f64(),
        faults.len()
    );
    for f in &faults {
        println!("  at {:7.1} s: {}", f.at.as_secs_f64(), f.describe());
    }
    if args.dry_run {
        return Ok(());
    }
    let logs = args.log_dir.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("tensile-chaos-{}", std::process::id()))
    });
    std::fs::create_dir_all(&logs).with_context(|| format!("creating {}", logs.display()))?;
    let env = clusters().await?;
    seed_objects(&env, args.deployments.max(1)).await?;
    let rig = start_rig(&env, &logs).await?;
    let nodes: Vec<(String, usize, String)> = (0..LOWERS)
        .map(|i| (node_name(i), i + 1, node_name(i)))
        .collect();
    wait_nodes_ready(&env, &nodes, &logs).await?;
    // Once the webhook and the extender serve: every pod goes through them.
    for i in 0..args.deployments.max(1) {
        create::<Deployment>(&env.clusters[0].direct, deployment(i, 2)).await?;
    }
    println!(
        "clusters, virtual nodes, webhook, extender and descheduler up; logs in {}",
        logs.display()
    );

    let run = Run {
        checker: Arc::new(Mutex::new(Checker::new(&nodes))),
        origin: Instant::now(),
        windows: Arc::default(),
        crashes: Arc::default(),
        lost_leadership: Arc::default(),
    };
    let watches = watch_all(&env, &run);
    let monitor = watch_processes(&rig, &run);
    let reporter = {
        let (checker, origin, windows) = (run.checker.clone(), run.origin, run.windows.clone());
        tokio::spawn(async move {
            let mut printed = 0;
            loop {
                tokio::time::sleep(Duration::from_secs(5)).await;
                let at = origin.elapsed().as_secs_f64();
                let new: Vec<Violation> = with(&checker, |c| {
                    c.tick(at);
                    c.violations()[printed..].to_vec()
                })
                .unwrap_or_default();
                printed += new.len();
                let w = with(&windows, |w| w.clone()).unwrap_or_default();
                for v in new {
                    println!(
                        "{:8.1} s  VIOLATION {}: {} (faults around: {:?})",
                        v.at,
                        v.object,
                        v.what,
                        around(&w, v.at)
                    );
                }
            }
        })
    };
    let churn_until = run.origin + args.duration;
    let (counts, fault_errors) = tokio::join!(
        churn(
            &env,
            &run,
            (seed, args.churn_every, churn_until),
            (args.deployments.max(1), args.max_replicas)
        ),
        nemesis(&env, &rig, &run, &faults),
    );
    let windows = with(&run.windows, |w| w.clone())?;
    let last_fault_end = windows.iter().map(|w| w.2).fold(0.0, f64::max);
    let quiet_from = last_fault_end.max(run.now());
    println!(
        "{:8.1} s  faults and churn over (last fault ended at {last_fault_end:.1} s); waiting {:.0} s for everything to settle",
        run.now(),
        crate::chaos_check::ORPHANS_GONE_WITHIN
    );
    tokio::time::sleep_until(
        (run.origin
            + Duration::from_secs_f64(quiet_from + crate::chaos_check::ORPHANS_GONE_WITHIN))
        .into(),
    )
    .await;
    monitor.abort();
    reporter.abort();
    let now = run.now();
    let (mut violations, worst, slowest, convergences, pods, lost) = with(&run.checker, |c| {
        (
            c.finish(now, last_fault_end),
            c.worst_convergence(now),
            c.slowest_by_fault(now, &windows),
            c.convergences(),
            c.upper_pods_seen,
            c.lower_pod_lost,
        )
    })?;
    for w in watches {
        w.abort();
    }
    let churn_about: Vec<Vec<String>> = with(&run.checker, |c| {
        violations.iter().map(|v| c.churn_about(v)).collect()
    })?;
    violations.extend(with(&run.crashes, |c| c.clone())?);
    let lost_leadership = with(&run.lost_leadership, |l| l.clone())?;
    for (i, v) in violations.iter().enumerate() {
        println!(
            "VIOLATION at {:.1} s: {}: {} (faults around: {:?})",
            v.at,
            v.object,
            v.what,
            around(&windows, v.at)
        );
        if let Some(churn) = churn_about.get(i).filter(|c| !c.is_empty()) {
            println!("  the churn's doings about it: {churn:?}");
        }
    }
    let mut by_kind: BTreeMap<&str, usize> = BTreeMap::new();
    for (kind, ..) in &windows {
        *by_kind.entry(kind.as_str()).or_default() += 1;
    }
    println!(
        "{pods} pods created upstairs; {} faults injected ({} not); churn {:?}, {} calls failed; {convergences} status convergences, the slowest {worst:.1} s; {lost} upper pods LowerPodLost (documented); {} violations",
        windows.len(),
        fault_errors.len(),
        counts.done,
        counts.failed,
        violations.len()
    );
    println!("slowest convergence by fault overlapping it: {slowest:?}");
    drop(rig);
    drop(env);
    if violations.is_empty() && args.log_dir.is_none() {
        let _ = std::fs::remove_dir_all(&logs);
    }
    let round = |s: f64| (s * 10.0).round() / 10.0;
    println!(
        "{}",
        json!({"benchmark": "chaos", "backend": if real { "real" } else { "simulated" },
            "seed": seed, "duration_s": args.duration.as_secs_f64(), "pods_created": pods,
            "faults": by_kind, "faults_not_injected": fault_errors.len(),
            "violations": violations.len(), "worst_convergence_s": round(worst),
            "slowest_convergence_s_by_fault": slowest.iter().map(|(k, v)| (k.clone(), round(*v))).collect::<BTreeMap<_, _>>(),
            "lower_pod_lost": lost, "lost_leadership_restarts": lost_leadership,
            "churn": counts})
    );
    if !violations.is_empty() {
        bail!(
            "{} violations (see VIOLATION lines; logs kept in {})",
            violations.len(),
            logs.display()
        );
    }
    Ok(())
}

/// Waits until both virtual nodes are Ready upstairs.
async fn wait_nodes_ready(
    env: &TestEnv,
    nodes: &[(String, usize, String)],
    logs: &Path,
) -> anyhow::Result<()> {
    let api: Api<Node> = Api::all(env.clusters[0].direct.clone());
    for (name, ..) in nodes {
        let name = name.clone();
        poll_until(
            &format!("virtual node {name} Ready"),
            &logs.join(format!("{name}-0.log")),
            Duration::from_secs(180),
            || {
                let (api, name) = (api.clone(), name.clone());
                async move {
                    api.get_opt(&name).await.ok().flatten().is_some_and(|n| {
                        n.status
                            .and_then(|s| s.conditions)
                            .unwrap_or_default()
                            .iter()
                            .any(|c| c.type_ == "Ready" && c.status == "True")
                    })
                }
            },
        )
        .await?;
    }
    Ok(())
}
