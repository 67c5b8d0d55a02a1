//! `tensile bench node-scale`: one virtual node carrying a whole lower cluster's pods, through
//! the phases of its life: the burst to all Running, a steady stretch in which nothing changes
//! but token refreshes, `kill -9` of the node and its restart, a rolling change of a share of the
//! pods, and the deletion of everything. The clusters run in this process (simulated, or real
//! control planes with `TENSILE_K8S_BIN`); the virtual node runs as its own process with the
//! README's flags, so its memory and CPU are its own.
//!
//! The pods are made by Deployments of mixed sizes whose template names the node
//! (`spec.nodeName`): they are created bound, so the upper scheduler's pace is not what is
//! measured. Every pod mounts a projected service-account token (upper identity, the default);
//! every second Deployment a ConfigMap and every third a Secret of its own.
//!
//! Time is compressed through the tokens' life: the pods ask for `--token-seconds` (600 s, the
//! shortest an API server issues) instead of the 3607 s of `kube-api-access` volumes, so each
//! token is refreshed about six times as often as by default: a steady stretch of 10 minutes
//! carries the refreshes of an hour.
//!
//! Per phase: the node's peak and final RSS, CPU, requests per second by cluster, verb and
//! resource (its own `tensile_api_calls_total`), open sockets, watch requests, and its stage
//! latencies (`tensile_pod_sync_seconds`). The last line is one JSON object.

#![allow(clippy::print_stdout)] // the report is what the command prints

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod, Secret, ServiceAccount};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use serde_json::json;
use tensile_core::identity::MIN_EXPIRATION_SECONDS;
use tensile_core::keys::{ANNOTATION_UPPER_UID, LABEL_OWNER, TAINT_VIRTUAL_KUBELET};
use tensile_testenv::TestEnv;

use crate::plot;
use crate::support::{
    NODE, Samples, apiserver_metrics, burst_clusters, cpu_seconds, delta, free_port,
    histogram_quantile, holder_pid, http_get, memory_mib, ms_json, parse_metrics, sockets,
    spawn_watch, with,
};

/// Flags of `tensile bench node-scale`.
#[derive(Debug, clap::Args)]
pub struct NodeScaleArgs {
    /// Pods on the virtual node.
    #[arg(long, default_value_t = 1000)]
    pods: usize,
    /// How long the steady phase lasts (nothing changes but token refreshes).
    #[arg(long, default_value = "600s", value_parser = tensile_core::duration::parse_duration)]
    steady: Duration,
    /// `expirationSeconds` of the pods' projected service-account tokens: at least 600, as
    /// kube-apiserver's pod validation demands (10 minutes).
    #[arg(
        long,
        default_value_t = MIN_EXPIRATION_SECONDS,
        value_parser = clap::value_parser!(i64).range(MIN_EXPIRATION_SECONDS..)
    )]
    token_seconds: i64,
    /// Share of the pods the rolling change replaces, in percent.
    #[arg(long, default_value_t = 1.0)]
    rolling_percent: f64,
    /// Concurrent creations and deletions of the benchmark's own objects.
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// How long each phase may take before the benchmark gives up.
    #[arg(long, default_value = "1200s", value_parser = tensile_core::duration::parse_duration)]
    phase_timeout: Duration,
    /// A file whose last line is the JSON line of a 1,000-pod run: its `reconcile_p99_ms` is
    /// reported as `reconcile_p99_ms_at_1000`.
    #[arg(long, value_name = "FILE")]
    baseline: Option<PathBuf>,
    /// The `tensile` binary the virtual node runs (default: this binary).
    #[arg(long)]
    node_binary: Option<PathBuf>,
}

/// Deployment sizes, in turn: mixed shapes, about 10 pods each on average, so that at 150,000
/// pods the node mirrors about 12,500 distinct ConfigMaps and Secrets.
const SIZES: [usize; 5] = [1, 3, 8, 15, 23];

/// The annotation of the pod template the rolling change sets.
const REVISION: &str = "bench.tensile-kube.io/revision";

/// One Deployment of the workload.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Workload {
    namespace: String,
    name: String,
    replicas: usize,
    /// Mounts a ConfigMap of its own (`<name>-config`).
    config_map: bool,
    /// Mounts a Secret of its own (`<name>-secret`).
    secret: bool,
    /// A second container.
    sidecar: bool,
}

/// The Deployments that make `pods` pods, in namespaces of at most about 5,000 pods.
fn plan(pods: usize) -> Vec<Workload> {
    let namespaces = (pods / 5000).clamp(1, 30);
    let mut out = Vec::new();
    let mut left = pods;
    let mut i = 0;
    while left > 0 {
        let replicas = SIZES[i % SIZES.len()].min(left);
        out.push(Workload {
            namespace: format!("scale-{}", i % namespaces),
            name: format!("d-{i}"),
            replicas,
            config_map: i % 2 == 0,
            secret: i % 3 == 0,
            sidecar: i % 4 == 1,
        });
        left -= replicas;
        i += 1;
    }
    out
}

/// The Deployment of `w`, its pods bound to the virtual node, their token asking for
/// `token_seconds`; `revision` is the template's [`REVISION`].
fn deployment(w: &Workload, token_seconds: i64, revision: u32) -> serde_json::Value {
    let mut mounts = vec![json!({"name": "kube-api-access-bench",
        "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": true})];
    // The projected volume the ServiceAccount admission would add, with a shorter token.
    let mut volumes = vec![
        json!({"name": "kube-api-access-bench", "projected": {"sources": [
        {"serviceAccountToken": {"path": "token", "expirationSeconds": token_seconds}},
        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        {"downwardAPI": {"items": [{"path": "namespace",
            "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}]}}),
    ];
    if w.config_map {
        mounts.push(json!({"name": "config", "mountPath": "/etc/config"}));
        volumes
            .push(json!({"name": "config", "configMap": {"name": format!("{}-config", w.name)}}));
    }
    if w.secret {
        mounts.push(json!({"name": "secret", "mountPath": "/etc/secret"}));
        volumes.push(
            json!({"name": "secret", "secret": {"secretName": format!("{}-secret", w.name)}}),
        );
    }
    let mut containers = vec![json!({"name": "app", "image": "nginx:1.27",
        "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}, "volumeMounts": mounts})];
    if w.sidecar {
        containers.push(json!({"name": "sidecar", "image": "busybox:1.36",
            "command": ["sleep", "infinity"],
            "resources": {"requests": {"cpu": "5m", "memory": "8Mi"}}}));
    }
    json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": w.name, "namespace": w.namespace},
        "spec": {"replicas": w.replicas, "selector": {"matchLabels": {"app": w.name}},
            "template": {
                "metadata": {"labels": {"app": w.name},
                    "annotations": {REVISION: revision.to_string()}},
                "spec": {"nodeName": NODE, "automountServiceAccountToken": false,
                    "tolerations": [{"key": TAINT_VIRTUAL_KUBELET, "operator": "Exists"}],
                    "containers": containers, "volumes": volumes}}}})
}

/// One upper pod on the node, as the benchmark's watch last saw it.
#[derive(Clone, Debug, Default)]
struct UpperPod {
    uid: String,
    running: bool,
    revision: u32,
}

/// What the benchmark's watches saw.
#[derive(Default)]
struct Seen {
    /// Upper pods on the node by namespace/name.
    upper: HashMap<String, UpperPod>,
    /// Lower pods of ours by namespace/name: the upper UID they stand for.
    lower: HashMap<String, String>,
    /// Lower pods deleted so far (watch DELETED events).
    lower_deleted: usize,
}

impl Seen {
    fn running(&self) -> usize {
        self.upper.values().filter(|p| p.running).count()
    }

    /// Upper UIDs with more than one lower pod.
    fn duplicated(&self) -> usize {
        let mut by_upper: HashMap<&str, usize> = HashMap::new();
        for uid in self.lower.values() {
            *by_upper.entry(uid.as_str()).or_default() += 1;
        }
        by_upper.values().filter(|n| **n > 1).count()
    }

    /// Upper pods not Running, or without a lower pod.
    fn lost(&self) -> usize {
        let lowered: std::collections::HashSet<&str> =
            self.lower.values().map(String::as_str).collect();
        self.upper
            .values()
            .filter(|p| !p.running || !lowered.contains(p.uid.as_str()))
            .count()
    }
}

type Shared = Arc<Mutex<Seen>>;

fn key_of(p: &Pod) -> String {
    format!(
        "{}/{}",
        p.metadata.namespace.as_deref().unwrap_or_default(),
        p.metadata.name.as_deref().unwrap_or_default()
    )
}

fn watch_pods(env: &TestEnv, seen: &Shared) -> Vec<tokio::task::JoinHandle<()>> {
    let s = seen.clone();
    let upper = spawn_watch(Api::<Pod>::all(env.clusters[0].client.clone()), move |e| {
        let Ok(mut s) = s.lock() else { return };
        match e {
            watcher::Event::Apply(p) | watcher::Event::InitApply(p) => {
                if p.spec.as_ref().and_then(|s| s.node_name.as_deref()) != Some(NODE) {
                    return;
                }
                let pod = UpperPod {
                    uid: p.metadata.uid.clone().unwrap_or_default(),
                    running: p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"),
                    revision: p
                        .metadata
                        .annotations
                        .as_ref()
                        .and_then(|a| a.get(REVISION))
                        .and_then(|r| r.parse().ok())
                        .unwrap_or_default(),
                };
                s.upper.insert(key_of(&p), pod);
            }
            watcher::Event::Delete(p) => {
                s.upper.remove(&key_of(&p));
            }
            watcher::Event::Init | watcher::Event::InitDone => {}
        }
    });
    let s = seen.clone();
    let lower = spawn_watch(Api::<Pod>::all(env.clusters[1].client.clone()), move |e| {
        let Ok(mut s) = s.lock() else { return };
        match e {
            watcher::Event::Apply(p) | watcher::Event::InitApply(p) => {
                let ours = p
                    .metadata
                    .labels
                    .as_ref()
                    .is_some_and(|l| l.contains_key(LABEL_OWNER));
                let upper = p
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(ANNOTATION_UPPER_UID));
                if let (true, Some(upper)) = (ours, upper) {
                    s.lower.insert(key_of(&p), upper.clone());
                }
            }
            watcher::Event::Delete(p) => {
                if s.lower.remove(&key_of(&p)).is_some() {
                    s.lower_deleted += 1;
                }
            }
            watcher::Event::Init | watcher::Event::InitDone => {}
        }
    });
    vec![upper, lower]
}

/// The node's process, sampled: peak RSS and sockets since the phase began.
#[derive(Debug, Default)]
struct Sampled {
    pid: u32,
    peak_rss: f64,
    peak_sockets: usize,
}

type Sampler = Arc<Mutex<Sampled>>;

fn start_sampler(sampler: &Sampler) -> tokio::task::JoinHandle<()> {
    let sampler = sampler.clone();
    tokio::spawn(async move {
        loop {
            let pid = sampler.lock().map_or(0, |s| s.pid);
            let (rss, socks) = (memory_mib(pid).0, sockets(pid));
            if let Ok(mut s) = sampler.lock()
                && s.pid == pid
            {
                if rss.is_finite() {
                    s.peak_rss = s.peak_rss.max(rss);
                }
                s.peak_sockets = s.peak_sockets.max(socks);
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    })
}

/// The virtual node's process and where its metrics are served.
struct NodeProcess {
    child: tokio::process::Child,
    pid: u32,
    metrics: String,
}

impl NodeProcess {
    /// `tensile virtual-node` with the README's flags; the benchmark only says where to listen.
    fn start(env: &TestEnv, exe: &std::path::Path, log: &std::path::Path) -> anyhow::Result<Self> {
        let metrics = format!("127.0.0.1:{}", free_port()?);
        let child = tokio::process::Command::new(exe)
            .args(["virtual-node", "--nodename", NODE])
            .arg("--kubeconfig")
            .arg(&env.clusters[0].kubeconfig)
            .arg("--client-kubeconfig")
            .arg(&env.clusters[1].kubeconfig)
            .args(["--metrics-addr", &metrics])
            .args(["--kubelet-address", "127.0.0.1"])
            .env("KUBELET_PORT", free_port()?.to_string())
            .env("VKUBELET_POD_IP", "127.0.0.1")
            .env_remove("POD_NAME")
            .env_remove("POD_NAMESPACE")
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(
                std::fs::File::create(log)
                    .with_context(|| format!("creating {}", log.display()))?,
            )
            .kill_on_drop(true)
            .spawn()
            .context("starting tensile virtual-node")?;
        let pid = child.id().context("the virtual node exited at once")?;
        Ok(Self {
            child,
            pid,
            metrics,
        })
    }

    async fn metrics(&self) -> anyhow::Result<Samples> {
        Ok(parse_metrics(&http_get(&self.metrics, "/metrics").await?))
    }
}

/// Figures of one phase.
struct Phase {
    name: &'static str,
    wall: Duration,
    cpu_s: f64,
    peak_rss: f64,
    end_rss: f64,
    /// The node's live heap at the end (its allocator's `tensile_allocator_allocated_bytes`),
    /// MiB; none from a build without jemalloc.
    end_heap: Option<f64>,
    peak_sockets: usize,
    /// The node's metrics over the phase (the difference of two scrapes).
    metrics: Samples,
    /// The API servers' own metrics over the phase (real control planes only): upper, lower.
    servers: (Option<Samples>, Option<Samples>),
}

/// What a phase starts from.
struct PhaseStart {
    at: Instant,
    cpu: f64,
    metrics: Samples,
    servers: (Option<Samples>, Option<Samples>),
}

async fn servers(env: &TestEnv) -> (Option<Samples>, Option<Samples>) {
    (
        apiserver_metrics(&env.clusters[0].client).await,
        apiserver_metrics(&env.clusters[1].client).await,
    )
}

async fn phase_start(env: &TestEnv, node: &NodeProcess, sampler: &Sampler) -> PhaseStart {
    with(sampler, |s| {
        *s = Sampled {
            pid: node.pid,
            ..Sampled::default()
        };
    })
    .ok();
    PhaseStart {
        at: Instant::now(),
        cpu: cpu_seconds(node.pid),
        metrics: node.metrics().await.unwrap_or_default(),
        servers: servers(env).await,
    }
}

async fn phase_end(
    name: &'static str,
    start: PhaseStart,
    env: &TestEnv,
    node: &NodeProcess,
    sampler: &Sampler,
) -> anyhow::Result<Phase> {
    let metrics = node.metrics().await?;
    let (upper, lower) = servers(env).await;
    let diff = |after: Option<Samples>, before: Option<Samples>| Some(delta(&after?, &before?));
    let end_rss = memory_mib(node.pid).0;
    let (peak_rss, peak_sockets) = with(sampler, |s| (s.peak_rss.max(end_rss), s.peak_sockets))?;
    Ok(Phase {
        name,
        wall: start.at.elapsed(),
        cpu_s: cpu_seconds(node.pid) - start.cpu,
        peak_rss,
        end_rss,
        end_heap: live_heap_mib(&metrics),
        peak_sockets,
        metrics: delta(&metrics, &start.metrics),
        servers: (diff(upper, start.servers.0), diff(lower, start.servers.1)),
    })
}

/// API calls of the node: (cluster, verb, resource) -> count.
fn calls(m: &Samples) -> BTreeMap<(String, String, String), f64> {
    m.iter()
        .filter(|((name, _), v)| name == "tensile_api_calls_total" && **v > 0.0)
        .map(|((_, l), v)| {
            let get = |k: &str| l.get(k).cloned().unwrap_or_default();
            ((get("cluster"), get("verb"), get("resource")), *v)
        })
        .collect()
}

fn is_write(verb: &str) -> bool {
    matches!(
        verb,
        "create" | "update" | "patch" | "delete" | "deletecollection"
    )
}

/// Token refreshes: TokenRequests upstairs.
fn token_requests(m: &Samples) -> f64 {
    calls(m)
        .iter()
        .filter(|(k, _)| k.0 == "upper" && k.1 == "create" && k.2 == "serviceaccounts/token")
        .map(|(_, v)| *v)
        .fold(0.0, |a, b| a + b)
}

/// Writes that change pods, copies or Secrets: every write but the node's own (its Lease and
/// its Node), Events, reviews (requests that store nothing), and token refreshes (a
/// TokenRequest and the patch of its Secret).
fn pod_writes(m: &Samples) -> f64 {
    let c = calls(m);
    let refreshes = token_requests(m);
    let not_pods = |resource: &str| {
        resource.starts_with("leases")
            || resource.starts_with("nodes")
            || resource.starts_with("events")
            || resource.contains("reviews")
            || resource == "serviceaccounts/token"
    };
    let writes: f64 = c
        .iter()
        .filter(|(k, _)| is_write(&k.1) && !not_pods(&k.2))
        .map(|(_, v)| *v)
        .fold(0.0, |a, b| a + b);
    let secret_patches: f64 = c
        .iter()
        .filter(|(k, _)| k.0 == "lower" && k.1 == "patch" && k.2 == "secrets")
        .map(|(_, v)| *v)
        .fold(0.0, |a, b| a + b);
    writes - secret_patches.min(refreshes)
}

fn stage(m: &Samples, s: &str, q: f64) -> Option<f64> {
    histogram_quantile(m, "tensile_pod_sync_seconds", &[("stage", s)], q)
}

/// The live heap a scrape of the node reports, MiB (none from a build without jemalloc).
fn live_heap_mib(metrics: &Samples) -> Option<f64> {
    metrics
        .iter()
        .find(|((name, _), _)| name == "tensile_allocator_allocated_bytes")
        .map(|(_, bytes)| bytes / (1024.0 * 1024.0))
}

const STAGES: [&str; 5] = [
    "queue_wait",
    "reconcile",
    "upper_tokens",
    "lower_pod_create",
    "upper_status",
];

fn fmt_ms(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| format!("{:.1}ms", v * 1000.0))
}

impl Phase {
    fn cpu_percent(&self) -> f64 {
        100.0 * self.cpu_s / self.wall.as_secs_f64().max(1e-9)
    }

    fn print(&self) {
        let wall = self.wall.as_secs_f64().max(1e-9);
        println!(
            "phase {}: {:.1} s; node CPU {:.1} s ({:.1}% of a core), RSS peak {:.1} MiB, at the end {:.1} MiB (live heap {}); at most {} sockets open",
            self.name,
            wall,
            self.cpu_s,
            self.cpu_percent(),
            self.peak_rss,
            self.end_rss,
            self.end_heap
                .map_or_else(|| "unknown".to_owned(), |h| format!("{h:.1} MiB")),
            self.peak_sockets
        );
        for s in STAGES {
            println!(
                "  {s:16} p50 {:>9}  p99 {:>9}",
                fmt_ms(stage(&self.metrics, s, 0.5)),
                fmt_ms(stage(&self.metrics, s, 0.99)),
            );
        }
        let c = calls(&self.metrics);
        let watches: f64 = c
            .iter()
            .filter(|(k, _)| k.1 == "watch")
            .map(|(_, v)| v)
            .sum();
        println!(
            "  requests per second (cluster, verb, resource); {watches} watch requests started:"
        );
        for (k, v) in &c {
            println!(
                "    {:6} {:8} {:28} {:8.2}/s  ({v})",
                k.0,
                k.1,
                k.2,
                v / wall
            );
        }
    }

    fn json(&self) -> serde_json::Value {
        let wall = self.wall.as_secs_f64().max(1e-9);
        let mut stages = serde_json::Map::new();
        for s in STAGES {
            stages.insert(format!("{s}_p50_ms"), ms_json(stage(&self.metrics, s, 0.5)));
            stages.insert(
                format!("{s}_p99_ms"),
                ms_json(stage(&self.metrics, s, 0.99)),
            );
        }
        let rates: serde_json::Map<String, serde_json::Value> = calls(&self.metrics)
            .into_iter()
            .map(|(k, v)| {
                (
                    format!("{} {} {}", k.0, k.1, k.2),
                    json!(round(v / wall, 3)),
                )
            })
            .collect();
        json!({
            "wall_s": round(wall, 2),
            "cpu_s": round(self.cpu_s, 2),
            "cpu_percent": round(self.cpu_percent(), 2),
            "peak_rss_mib": round(self.peak_rss, 1),
            "end_rss_mib": round(self.end_rss, 1),
            "end_heap_mib": self.end_heap.map(|h| round(h, 1)),
            "peak_sockets": self.peak_sockets,
            "stages": stages,
            "requests_per_s": rates,
        })
    }

    /// The API servers' own p99 of pod writes in the phase (real control planes only).
    fn server_writes(&self) -> String {
        let q = |m: &Option<Samples>, verb: &str| {
            fmt_ms(m.as_ref().and_then(|m| {
                histogram_quantile(
                    m,
                    "apiserver_request_duration_seconds",
                    &[("verb", verb), ("resource", "pods"), ("subresource", "")],
                    0.99,
                )
            }))
        };
        format!(
            "the API servers' own p99: upper pod POST {}, DELETE {}; lower pod POST {}, DELETE {}",
            q(&self.servers.0, "POST"),
            q(&self.servers.0, "DELETE"),
            q(&self.servers.1, "POST"),
            q(&self.servers.1, "DELETE"),
        )
    }
}

fn round(v: f64, places: i32) -> serde_json::Value {
    let f = 10f64.powi(places);
    if v.is_finite() {
        json!((v * f).round() / f)
    } else {
        serde_json::Value::Null
    }
}

/// Waits, up to `within`, until `check` holds for what the watches saw.
async fn until(
    what: &str,
    within: Duration,
    seen: &Shared,
    mut check: impl FnMut(&Seen) -> bool,
    mut progress: impl FnMut(&Seen) -> String,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + within;
    loop {
        if with(seen, |s| check(s))? {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "timed out after {within:?} waiting for {what} ({})",
                with(seen, |s| progress(s))?
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Runs `f` on every item, `concurrency` at once; the first error ends it.
async fn each<T, F, Fut>(items: Vec<T>, concurrency: usize, f: F) -> anyhow::Result<()>
where
    F: Fn(T) -> Fut,
    Fut: Future<Output = anyhow::Result<()>>,
{
    let mut results =
        futures::stream::iter(items.into_iter().map(f)).buffer_unordered(concurrency.max(1));
    while let Some(r) = results.next().await {
        r?;
    }
    Ok(())
}

/// Creates `value` in `api` unless it exists.
async fn create<K>(api: Api<K>, value: serde_json::Value) -> anyhow::Result<()>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + serde::Serialize,
{
    let object: K = serde_json::from_value(value)?;
    match api.create(&PostParams::default(), &object).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// The reconcile p99 of the baseline run's JSON line, in milliseconds.
fn baseline_reconcile_p99(path: &std::path::Path) -> anyhow::Result<Option<f64>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let line = text
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'))
        .with_context(|| format!("{}: no JSON line", path.display()))?;
    let v: serde_json::Value =
        serde_json::from_str(line).with_context(|| format!("{}: its JSON line", path.display()))?;
    Ok(v.get("reconcile_p99_ms")
        .and_then(serde_json::Value::as_f64))
}

#[allow(clippy::too_many_lines)] // the phases in order, as they are reported
pub async fn run(args: NodeScaleArgs) -> anyhow::Result<()> {
    let n = args.pods;
    if n == 0 {
        bail!("--pods must be at least 1");
    }
    let baseline = match &args.baseline {
        Some(path) => baseline_reconcile_p99(path)?,
        None => None,
    };
    let backend = if tensile_testenv::real::bin_dir().is_some() {
        "real"
    } else {
        "sim"
    };
    let workloads = plan(n);
    let env = burst_clusters(n).await?;
    let upper = env.clusters[0].client.clone();
    let exe = match &args.node_binary {
        Some(binary) => binary.clone(),
        None => std::env::current_exe().context("finding the tensile binary")?,
    };
    let logs = [
        env.dir().join("node.log"),
        env.dir().join("node-restarted.log"),
    ];
    let mut node = NodeProcess::start(&env, &exe, &logs[0])?;
    let nodes: Api<Node> = Api::all(upper.clone());
    let deadline = Instant::now() + Duration::from_secs(60);
    while nodes.get_opt(NODE).await.ok().flatten().is_none()
        || http_get(&node.metrics, "/healthz").await.is_err()
    {
        if let Some(status) = node.child.try_wait()? {
            bail!("the virtual node exited: {status}");
        }
        if Instant::now() > deadline {
            bail!("the virtual node did not register within 60 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let idle_rss = memory_mib(node.pid).0;
    let idle_heap = node.metrics().await.ok().and_then(|m| live_heap_mib(&m));
    let seen: Shared = Arc::default();
    let mut tasks = watch_pods(&env, &seen);
    let sampler: Sampler = Arc::default();
    tasks.push(start_sampler(&sampler));

    // The namespaces, with their default ServiceAccount (the pods' tokens are its).
    let mut namespaces: Vec<String> = workloads.iter().map(|w| w.namespace.clone()).collect();
    namespaces.sort();
    namespaces.dedup();
    for ns in &namespaces {
        create(
            Api::<Namespace>::all(upper.clone()),
            json!({"metadata": {"name": ns}}),
        )
        .await?;
    }
    for ns in &namespaces {
        let accounts: Api<ServiceAccount> = Api::namespaced(upper.clone(), ns);
        let deadline = Instant::now() + Duration::from_secs(60);
        while accounts.get_opt("default").await?.is_none() {
            if Instant::now() > deadline {
                bail!("namespace {ns} has no default ServiceAccount after 60 s");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    // Phase 1: the burst.
    let start = phase_start(&env, &node, &sampler).await;
    let objects: Vec<(Workload, &'static str)> = workloads
        .iter()
        .flat_map(|w| {
            [
                w.config_map.then(|| (w.clone(), "config")),
                w.secret.then(|| (w.clone(), "secret")),
            ]
        })
        .flatten()
        .collect();
    let distinct = objects.len();
    each(objects, args.concurrency, |(w, kind)| {
        let client = upper.clone();
        async move {
            let name = format!("{}-{kind}", w.name);
            if kind == "config" {
                create(
                    Api::<ConfigMap>::namespaced(client, &w.namespace),
                    json!({"metadata": {"name": name}, "data": {"app.conf": format!("name={}\n", w.name)}}),
                )
                .await
            } else {
                create(
                    Api::<Secret>::namespaced(client, &w.namespace),
                    json!({"metadata": {"name": name}, "stringData": {"password": format!("p-{}", w.name)}}),
                )
                .await
            }
        }
    })
    .await?;
    let token_seconds = args.token_seconds;
    each(workloads.clone(), args.concurrency, |w| {
        let client = upper.clone();
        async move {
            create(
                Api::<Deployment>::namespaced(client, &w.namespace),
                deployment(&w, token_seconds, 1),
            )
            .await
        }
    })
    .await?;
    until(
        "every pod Running upstairs",
        args.phase_timeout,
        &seen,
        |s| s.running() >= n,
        |s| {
            format!(
                "{} of {n} upper pods Running, {} lower pods",
                s.running(),
                s.lower.len()
            )
        },
    )
    .await?;
    let burst = phase_end("burst", start, &env, &node, &sampler).await?;
    burst.print();
    let burst_running_s = burst.wall.as_secs_f64();

    // Phase 2: steady. Nothing changes; the tokens are refreshed as they come due.
    let start = phase_start(&env, &node, &sampler).await;
    let mut per_slice = Vec::new();
    let mut last = token_requests(&start.metrics);
    let slice = Duration::from_secs(10);
    let steady_end = start.at + args.steady;
    while Instant::now() < steady_end {
        tokio::time::sleep(slice.min(steady_end.saturating_duration_since(Instant::now()))).await;
        let now = token_requests(&node.metrics().await?);
        per_slice.push(now - last);
        last = now;
    }
    let steady = phase_end("steady", start, &env, &node, &sampler).await?;
    steady.print();
    // Refreshes per whole minute of the phase (six slices of 10 s).
    let minutes: Vec<f64> = per_slice
        .chunks_exact(6)
        .map(|m| m.iter().sum::<f64>())
        .collect();
    let refreshes = token_requests(&steady.metrics);
    #[allow(clippy::cast_precision_loss)]
    let mean_minute = minutes.iter().sum::<f64>() / minutes.len().max(1) as f64;
    let busiest_minute = minutes.iter().copied().fold(0.0, f64::max);
    let herd = (mean_minute > 0.0).then(|| busiest_minute / mean_minute);
    let deleted_before_restart = with(&seen, |s| s.lower_deleted)?;

    // Phase 3: kill -9 and restart with every pod running.
    let start = phase_start(&env, &node, &sampler).await;
    node.child
        .start_kill()
        .context("killing the virtual node")?;
    node.child.wait().await?;
    let killed = Instant::now();
    node = NodeProcess::start(&env, &exe, &logs[1])?;
    with(&sampler, |s| s.pid = node.pid)?;
    // The new process's counters start from zero.
    let start = PhaseStart {
        metrics: Samples::new(),
        cpu: 0.0,
        ..start
    };
    let leases: Api<Lease> = Api::namespaced(upper.clone(), "kube-node-lease");
    let deadline = killed + args.phase_timeout;
    let ready_s = loop {
        let held = leases
            .get_opt(NODE)
            .await
            .ok()
            .flatten()
            .and_then(|l| l.spec?.holder_identity)
            .and_then(|h| holder_pid(&h))
            == Some(node.pid);
        let ready = nodes
            .get_opt(NODE)
            .await
            .ok()
            .flatten()
            .and_then(|n| n.status?.conditions)
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        if held && ready {
            break killed.elapsed().as_secs_f64();
        }
        if let Some(status) = node.child.try_wait()? {
            bail!("the restarted virtual node exited: {status}");
        }
        if Instant::now() > deadline {
            bail!(
                "the restarted virtual node was not Ready within {:?}",
                args.phase_timeout
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // Caught up: every pod reconciled once by the new process.
    let reconciles = |m: &Samples| {
        m.iter()
            .filter(|((name, l), _)| {
                name == "tensile_pod_sync_seconds_count"
                    && l.get("stage").map(String::as_str) == Some("reconcile")
            })
            .map(|(_, v)| *v)
            .sum::<f64>()
    };
    #[allow(clippy::cast_precision_loss)]
    let caught_up_s = loop {
        if let Ok(m) = node.metrics().await
            && reconciles(&m) >= n as f64
        {
            break killed.elapsed().as_secs_f64();
        }
        if Instant::now() > deadline {
            bail!(
                "the restarted virtual node did not reconcile every pod within {:?}",
                args.phase_timeout
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    // Its writes counted until 5 s after it caught up.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let restart = phase_end("restart", start, &env, &node, &sampler).await?;
    restart.print();
    let restart_writes = pod_writes(&restart.metrics);
    let (lost, duplicated, deleted) = with(&seen, |s| (s.lost(), s.duplicated(), s.lower_deleted))?;

    // Phase 4: a rolling change of a share of the pods.
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let target = ((n as f64 * args.rolling_percent / 100.0).ceil() as usize).max(1);
    let mut rolled = Vec::new();
    let mut rolled_pods = 0;
    for w in &workloads {
        if rolled_pods >= target {
            break;
        }
        rolled_pods += w.replicas;
        rolled.push(w.clone());
    }
    let start = phase_start(&env, &node, &sampler).await;
    each(rolled.clone(), args.concurrency, |w| {
        let client = upper.clone();
        async move {
            Api::<Deployment>::namespaced(client, &w.namespace)
                .patch(
                    &w.name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"template": {"metadata": {"annotations": {REVISION: "2"}}}}})),
                )
                .await?;
            Ok(())
        }
    })
    .await?;
    until(
        "the rolling change",
        args.phase_timeout,
        &seen,
        |s| {
            s.upper
                .values()
                .filter(|p| p.revision == 2 && p.running)
                .count()
                == rolled_pods
                && s.upper.len() == n
                && s.lower.len() == n
                && s.running() == n
        },
        |s| {
            format!(
                "{} of {rolled_pods} changed pods Running, {} upper pods, {} lower",
                s.upper
                    .values()
                    .filter(|p| p.revision == 2 && p.running)
                    .count(),
                s.upper.len(),
                s.lower.len()
            )
        },
    )
    .await?;
    let rolling = phase_end("rolling", start, &env, &node, &sampler).await?;
    rolling.print();
    let duplicated = duplicated.max(with(&seen, |s| s.duplicated())?);

    // Phase 5: everything deleted.
    let start = phase_start(&env, &node, &sampler).await;
    let background = DeleteParams::background();
    each(workloads.clone(), args.concurrency, |w| {
        let client = upper.clone();
        let params = background.clone();
        async move {
            match Api::<Deployment>::namespaced(client.clone(), &w.namespace)
                .delete(&w.name, &params)
                .await
            {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(e.into()),
            }
            let gone = |r: Result<_, kube::Error>| match r {
                Ok(_) => Ok(()),
                Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
                Err(e) => Err(anyhow::Error::from(e)),
            };
            if w.config_map {
                gone(
                    Api::<ConfigMap>::namespaced(client.clone(), &w.namespace)
                        .delete(&format!("{}-config", w.name), &DeleteParams::default())
                        .await
                        .map(|_| ()),
                )?;
            }
            if w.secret {
                gone(
                    Api::<Secret>::namespaced(client, &w.namespace)
                        .delete(&format!("{}-secret", w.name), &DeleteParams::default())
                        .await
                        .map(|_| ()),
                )?;
            }
            Ok(())
        }
    })
    .await?;
    until(
        "every pod gone, upstairs and downstairs",
        args.phase_timeout,
        &seen,
        |s| s.upper.is_empty() && s.lower.is_empty(),
        |s| {
            format!(
                "{} upper pods, {} lower pods left",
                s.upper.len(),
                s.lower.len()
            )
        },
    )
    .await?;
    let deletion = phase_end("delete", start, &env, &node, &sampler).await?;
    deletion.print();
    let (_, hwm) = memory_mib(node.pid);
    for t in &tasks {
        t.abort();
    }
    drop(node);
    let mut env = env;
    for cluster in &mut env.clusters {
        cluster.stop_nodes();
    }

    let phases = [&burst, &steady, &restart, &rolling, &deletion];
    println!(
        "node-scale benchmark on {}, {} build: {n} pods bound to one virtual node by {} Deployments of {SIZES:?} replicas in turn in {} namespaces, {distinct} distinct ConfigMaps and Secrets mounted",
        if backend == "real" {
            "real control planes (TENSILE_K8S_BIN)"
        } else {
            "simulated clusters"
        },
        plot::build(),
        workloads.len(),
        namespaces.len(),
    );
    println!(
        "  the node: its own process, the README's flags; {} simulated lower nodes; RSS {idle_rss:.1} MiB before the burst (live heap {}), VmHWM {hwm:.1} MiB at the end",
        n.div_ceil(100).max(2),
        idle_heap.map_or_else(|| "unknown".to_owned(), |h| format!("{h:.1} MiB")),
    );
    println!(
        "  time compressed: the pods' tokens ask for {token_seconds} s instead of kube-api-access's 3607 s, so they are refreshed about {:.1}x as often; the steady phase of {:.0} s carries the refreshes of {:.0} s with hour-long tokens",
        3607.0 / token_seconds.max(1) as f64,
        args.steady.as_secs_f64(),
        args.steady.as_secs_f64() * 3607.0 / token_seconds.max(1) as f64,
    );
    println!("burst: all {n} upper pods Running after {burst_running_s:.1} s");
    println!(
        "steady: {refreshes} token refreshes ({:.2} a second), per minute {minutes:?}: busiest minute {}",
        refreshes / steady.wall.as_secs_f64().max(1e-9),
        herd.map_or_else(
            || "- (no whole minute with refreshes)".to_owned(),
            |h| format!("{h:.2} x the mean")
        ),
    );
    println!(
        "restart: killed (SIGKILL) and started again at once; Ready (node lease held by the new process, node Ready) {ready_s:.1} s after the kill, every pod reconciled {caught_up_s:.1} s after; {restart_writes} writes that change pods, copies or Secrets (the node's Lease and Node, Events and token refreshes apart: {} refreshes came due meanwhile); {lost} upper pods lost (not Running or without a lower pod), {deleted} lower pods deleted ({deleted_before_restart} before the restart), {duplicated} upper pods with two lower pods",
        token_requests(&restart.metrics)
    );
    println!(
        "rolling: {rolled_pods} pods of {} Deployments replaced in {:.1} s; {}",
        rolled.len(),
        rolling.wall.as_secs_f64(),
        rolling.server_writes()
    );
    println!(
        "delete: every Deployment, ConfigMap and Secret deleted; every pod gone both sides after {:.1} s; {}",
        deletion.wall.as_secs_f64(),
        deletion.server_writes()
    );
    let reconcile_p99 = stage(&rolling.metrics, "reconcile", 0.99);
    let reconcile_p99_ms = reconcile_p99.map(|s| s * 1000.0);
    let at_1000 = baseline.or(if n == 1000 { reconcile_p99_ms } else { None });
    let peak_rss = phases.iter().map(|p| p.peak_rss).fold(0.0, f64::max);
    println!(
        "{}",
        json!({
            "pods": n,
            "backend": backend,
            "build": plot::build(),
            "peak_rss_mib": round(peak_rss, 1),
            "steady_rss_mib": round(steady.end_rss, 1),
            // What the pods' state holds at rest: the live heap after the steady phase over
            // the one before the burst (a jemalloc build only).
            "steady_heap_mib": steady.end_heap.map(|h| round(h, 1)),
            "heap_kib_per_pod_at_rest": steady.end_heap.zip(idle_heap)
                .map(|(h, idle)| round((h - idle) * 1024.0 / n as f64, 2)),
            "idle_cpu_percent": round(steady.cpu_percent(), 2),
            "steady_token_refreshes_per_s": round(refreshes / steady.wall.as_secs_f64().max(1e-9), 3),
            "refresh_busiest_minute_over_mean": herd.map_or(serde_json::Value::Null, |h| round(h, 2)),
            "burst_all_running_s": round(burst_running_s, 2),
            "restart_ready_s": round(ready_s, 2),
            "restart_caught_up_s": round(caught_up_s, 2),
            "restart_writes": restart_writes,
            "lost": lost,
            "deleted": deleted,
            "duplicated": duplicated,
            "rolling_pods": rolled_pods,
            "rolling_s": round(rolling.wall.as_secs_f64(), 2),
            "delete_s": round(deletion.wall.as_secs_f64(), 2),
            "reconcile_p99_ms": reconcile_p99_ms.map_or(serde_json::Value::Null, |v| round(v, 1)),
            "reconcile_p99_ms_at_1000": at_1000.map_or(serde_json::Value::Null, |v| round(v, 1)),
            "distinct_config_maps_and_secrets": distinct,
            "phases": {
                "burst": burst.json(),
                "steady": steady.json(),
                "restart": restart.json(),
                "rolling": rolling.json(),
                "delete": deletion.json(),
            },
        })
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plan_makes_exactly_the_pods_asked_for_in_mixed_shapes() {
        for pods in [1, 7, 1000, 5000, 150_000] {
            let p = plan(pods);
            assert_eq!(p.iter().map(|w| w.replicas).sum::<usize>(), pods);
            assert!(p.iter().all(|w| w.replicas > 0));
        }
        let p = plan(150_000);
        let distinct =
            p.iter().filter(|w| w.config_map).count() + p.iter().filter(|w| w.secret).count();
        assert!((10_000..=15_000).contains(&distinct), "{distinct}");
        let namespaces: std::collections::BTreeSet<&str> =
            p.iter().map(|w| w.namespace.as_str()).collect();
        assert_eq!(namespaces.len(), 30);
    }

    #[test]
    fn a_deployment_reads_as_one_with_its_pods_bound_to_the_node() {
        let w = &plan(100)[0];
        let d: Deployment = serde_json::from_value(deployment(w, 600, 1)).unwrap();
        let spec = d.spec.unwrap().template.spec.unwrap();
        assert_eq!(spec.node_name.as_deref(), Some(NODE));
        assert!(spec.volumes.unwrap().len() >= 2);
    }

    #[test]
    fn refreshes_are_not_counted_as_writes_of_a_restart() {
        let m = parse_metrics(concat!(
            "tensile_api_calls_total{cluster=\"upper\",verb=\"create\",resource=\"serviceaccounts/token\"} 3\n",
            "tensile_api_calls_total{cluster=\"lower\",verb=\"patch\",resource=\"secrets\"} 3\n",
            "tensile_api_calls_total{cluster=\"upper\",verb=\"patch\",resource=\"nodes/status\"} 2\n",
            "tensile_api_calls_total{cluster=\"upper\",verb=\"patch\",resource=\"leases.coordination.k8s.io\"} 2\n",
            "tensile_api_calls_total{cluster=\"upper\",verb=\"create\",resource=\"selfsubjectaccessreviews.authorization.k8s.io\"} 1\n",
            "tensile_api_calls_total{cluster=\"lower\",verb=\"patch\",resource=\"pods\"} 1\n",
        ));
        assert!((pod_writes(&m) - 1.0).abs() < f64::EPSILON);
        assert!((token_requests(&m) - 3.0).abs() < f64::EPSILON);
    }
}
