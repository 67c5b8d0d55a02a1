//! `tensile bench fragmentation`: lower clusters whose free room is fragmented (plenty in sum,
//! little per node), and a burst of Deployments and a Job with pods of mixed sizes. The same
//! burst runs once per placement mode on a fresh sandbox each: no placement help, descheduler
//! only, extender only, both. Reports the share of pods Running after the window, the time to
//! the last one, the pods stranded (bound to a virtual node whose lower cluster could not place
//! them), lower nodes over-committed, the upper scheduler's binding rate, the extender's own
//! latencies and the descheduler's moves; the last line is one JSON object per run.
//!
//! Two shapes. Without `--nodes-per-cluster`: three clusters (or `--lower-clusters` of them,
//! cycling) of 2, 3 and 6 CPU nodes sized by `--pods`, where upstairs the first looks at least
//! as roomy as any other and no 2.5-CPU pod fits any of its nodes. With it: a fleet of
//! `--lower-clusters` clusters of that many nodes each, of 2, 4, 8 and 16 CPU, which
//! `--running-pods` pods created downstairs fill so that each node keeps 0.25 to 2 CPU free.

#![allow(clippy::print_stdout)] // the report is what the command prints

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures::StreamExt as _;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams, PostParams};
use kube::runtime::watcher;
use serde_json::json;
use tensile_core::quantity::parse_quantity;
use tensile_placement::descheduler::DeschedulerConfig;
use tensile_placement::metrics::DeschedulerMetrics;
use tensile_simkubelet::SimNode;

use crate::sandbox::{ExtenderRun, Sandbox, SandboxSpec, VirtualNodeRun};
use crate::support::{cpu_seconds, memory_mib};

/// Flags of `tensile bench fragmentation`.
#[derive(Debug, clap::Args)]
pub struct FragmentationArgs {
    /// Seconds after the burst at which Running pods are counted.
    #[arg(long, default_value_t = 60)]
    window: u64,
    /// Pods in the burst: 500m, 1 and 2500m CPU in the ratio 6:3:1 (two Deployments and a
    /// Job).
    #[arg(long, default_value_t = 500)]
    pods: usize,
    /// Lower clusters.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..=200))]
    lower_clusters: u16,
    /// Nodes per lower cluster, of 2, 4, 8 and 16 CPU in turn (without it: the three-cluster
    /// shape of 2, 3 and 6 CPU nodes, sized by --pods).
    #[arg(long)]
    nodes_per_cluster: Option<usize>,
    /// Pods created downstairs before the burst (not offloaded), spread over the nodes by
    /// their size.
    #[arg(long, default_value_t = 0)]
    running_pods: usize,
    /// How full --running-pods make each node (0 to 1); a node keeps at least 0.25, 0.75,
    /// 1.25 or 2 CPU free in turn, so its free room is a fragment.
    #[arg(long, default_value_t = 0.7)]
    fill: f64,
    /// Placement modes to run, each on a fresh sandbox (none, descheduler, extender, both).
    #[arg(long = "mode", alias = "modes", value_delimiter = ',', default_values_t = ["none".to_owned(), "descheduler".to_owned(), "extender".to_owned(), "both".to_owned()])]
    modes: Vec<String>,
    /// Client rate limit of the upper scheduler (`clientConnection.qps`) and of the
    /// extender, which binds for it (`--kube-api-qps`), bursts twice that. Without it both
    /// keep kube-scheduler's defaults, 50 and 100, which bound the binding rate of every mode
    /// at 50 a second: a tuned run, to see what each mode does past that limit.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    scheduler_qps: Option<u32>,
    /// Write an SVG plot to this file: per mode, the burst's pods Running and bound upstairs
    /// over time (the slope of the second is the binding rate).
    #[arg(long, value_name = "FILE")]
    plot: Option<std::path::PathBuf>,
}

/// One lower cluster: `count` nodes of `cpu` each (their free room; memory is plentiful).
fn cluster(prefix: &str, count: usize, cpu: &str) -> Vec<SimNode> {
    (1..=count)
        .map(|i| SimNode::new(format!("{prefix}-{i}"), cpu, "256Gi"))
        .collect()
}

/// The lower clusters' nodes.
fn fleet(args: &FragmentationArgs) -> Vec<Vec<SimNode>> {
    fleet_of(args.lower_clusters, args.nodes_per_cluster, args.pods)
}

/// `clusters` lower clusters of `nodes_per_cluster` nodes each (see [`FragmentationArgs`]),
/// or the three-cluster shape sized for `pods`.
pub(crate) fn fleet_of(
    clusters: u16,
    nodes_per_cluster: Option<usize>,
    pods: usize,
) -> Vec<Vec<SimNode>> {
    let clusters = usize::from(clusters);
    match nodes_per_cluster {
        // 180, 120 and 180 CPU in sum, in nodes of 2, 3 and 6 CPU (per 500 pods). Upstairs the
        // first looks at least as roomy as any other (and wins ties by name), yet a 2.5-CPU pod
        // fits none of its nodes: the upper scheduler, which sees sums, sends big pods there.
        None => {
            let n = |base: usize| (base * pods).div_ceil(500).max(1);
            let shapes = [(n(90), "2"), (n(40), "3"), (n(30), "6")];
            (0..clusters)
                .map(|i| {
                    let (count, cpu) = shapes[i % shapes.len()];
                    cluster(&format!("c{}", i + 1), count, cpu)
                })
                .collect()
        }
        Some(per) => (0..clusters)
            .map(|i| {
                (0..per)
                    .map(|j| {
                        let cpu = ["2", "4", "8", "16"][(i + j) % 4];
                        SimNode::new(format!("c{}-{}", i + 1, j + 1), cpu, "256Gi")
                    })
                    .collect()
            })
            .collect(),
    }
}

/// A simulated node's CPU in millicores.
pub(crate) fn node_millis(node: &SimNode) -> i64 {
    node.resources
        .get("cpu")
        .and_then(|q| parse_quantity(q).ok())
        .and_then(|q| i64::try_from(q.milli_value()).ok())
        .unwrap_or(0)
}

/// The pods to create downstairs before the burst: (node, CPU request in millicores), spread
/// over the nodes by their size, filling each to `fill` of its CPU but leaving at least 0.25,
/// 0.75, 1.25 or 2 CPU free in turn.
pub(crate) fn running_pods(
    fleet: &[Vec<SimNode>],
    total: usize,
    fill: f64,
) -> Vec<Vec<(String, i64)>> {
    let all: i64 = fleet.iter().flatten().map(node_millis).sum::<i64>().max(1);
    let mut index = 0_usize;
    fleet
        .iter()
        .map(|nodes| {
            let mut pods = Vec::new();
            for node in nodes {
                let cpu = node_millis(node);
                let keep = [250, 750, 1250, 2000][index % 4].min(cpu);
                index += 1;
                let count = usize::try_from(
                    (i64::try_from(total).unwrap_or(i64::MAX)).saturating_mul(cpu) / all,
                )
                .unwrap_or(0);
                if count == 0 {
                    continue;
                }
                let used = ((cpu as f64 * fill.clamp(0.0, 1.0)) as i64).min(cpu - keep);
                let each = used / i64::try_from(count).unwrap_or(1);
                if each <= 0 {
                    continue;
                }
                pods.extend((0..count).map(|_| (node.name.clone(), each)));
            }
            pods
        })
        .collect()
}

/// The burst: (name, CPU request, pods, as a Job).
pub(crate) fn workloads(pods: usize) -> Vec<(&'static str, &'static str, usize, bool)> {
    let small = pods * 6 / 10;
    let medium = pods * 3 / 10;
    vec![
        ("small", "500m", small, false),
        ("medium", "1", medium, false),
        ("large", "2500m", pods - small - medium, true),
    ]
}

#[derive(Debug, Default)]
struct Observed {
    running: HashMap<String, Instant>,
    bound: HashMap<String, Instant>,
    /// Pods seen bound to a virtual node while Unschedulable there.
    stranded: HashSet<String>,
}

#[derive(Debug, serde::Serialize)]
struct Outcome {
    mode: String,
    total: usize,
    running_in_window: usize,
    /// Seconds from the first create to the last pod Running, when all were.
    all_running_s: Option<f64>,
    /// Pods bound by the upper scheduler per second, from the first create to the last
    /// binding.
    bound_per_s: f64,
    stranded: usize,
    /// Lower nodes whose pods request more CPU than they have.
    overcommitted: usize,
    extender_filter_p50_ms: Option<f64>,
    extender_filter_p99_ms: Option<f64>,
    extender_bind_p99_ms: Option<f64>,
    /// The extender's `filter` calls over the pods of the burst: retries of pods it refused
    /// show here.
    extender_filter_calls_per_pod: Option<f64>,
    /// Rooms of lower clusters the extender simulated from scratch, over the pods of the
    /// burst (`tensile_extender_rooms_built_total`): the rest of its verdicts came from a
    /// kept room.
    extender_rooms_built_per_pod: Option<f64>,
    descheduler_moves: u64,
    /// The extender's own process (`tensile scheduler`, the shipped flags): peak RSS (from its
    /// start, so with its initial lists of the fleet) and CPU time during the burst.
    extender_peak_rss_mib: Option<f64>,
    extender_cpu_s: Option<f64>,
    /// This process: the sandbox's clusters (API servers, controllers, simulated kubelets),
    /// webhook and descheduler.
    process_peak_rss_mib: Option<f64>,
    /// The virtual nodes, each its own `tensile virtual-node` process: the sum of their peak
    /// RSS, the largest, and their CPU time during the burst.
    virtual_nodes_peak_rss_mib: f64,
    virtual_node_max_peak_rss_mib: f64,
    virtual_nodes_burst_cpu_s: f64,
    /// This process's CPU time during the burst (from its start to the end of the run).
    process_burst_cpu_s: f64,
    /// Seconds to create the pods downstairs, and until they all ran.
    fill_created_s: f64,
    fill_running_s: f64,
    /// Seconds from the first create at which each pod was first seen Running, and bound
    /// (for the plot).
    #[serde(skip)]
    running_at_s: Vec<f64>,
    #[serde(skip)]
    bound_at_s: Vec<f64>,
}

fn watch_pods(client: kube::Client, seen: Arc<Mutex<Observed>>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut stream = watcher(
            Api::<Pod>::namespaced(client, "default"),
            watcher::Config::default(),
        )
        .boxed();
        while let Some(event) = stream.next().await {
            let pod = match event {
                Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) => p,
                _ => continue,
            };
            let Some(uid) = pod.metadata.uid.clone() else {
                continue;
            };
            let status = pod.status.as_ref();
            let on_node = pod
                .spec
                .as_ref()
                .and_then(|s| s.node_name.as_deref())
                .is_some_and(|n| !n.is_empty());
            let Ok(mut seen) = seen.lock() else { return };
            if on_node {
                seen.bound.entry(uid.clone()).or_insert_with(Instant::now);
            }
            if status.and_then(|s| s.phase.as_deref()) == Some("Running") {
                seen.running.entry(uid.clone()).or_insert_with(Instant::now);
            }
            let unschedulable = status.and_then(|s| s.conditions.as_ref()).is_some_and(|c| {
                c.iter().any(|c| {
                    c.type_ == "PodScheduled" && c.reason.as_deref() == Some("Unschedulable")
                })
            });
            if on_node && unschedulable {
                seen.stranded.insert(uid);
            }
        }
    })
}

/// Creates the pods that already run downstairs, bound to their nodes, 64 at a time over all
/// clusters (one cluster after another left the others' API servers idle).
async fn fill_lower_clusters(sandbox: &Sandbox, plan: &[Vec<(String, i64)>]) -> anyhow::Result<()> {
    let mut creates = Vec::new();
    for (lower, pods) in sandbox.lowers.iter().zip(plan) {
        let api: Api<Pod> = Api::namespaced(lower.client().await?, "default");
        for (i, (node, millis)) in pods.iter().enumerate() {
            let (api, name) = (api.clone(), lower.name.clone());
            let pod = json!({
                "metadata": {"name": format!("running-{i}")},
                "spec": {"nodeName": node, "containers": [{"name": "c", "image": "app",
                    "resources": {"requests": {"cpu": format!("{millis}m"), "memory": "64Mi"}}}]}
            });
            creates.push(async move {
                let pod: Pod = serde_json::from_value(pod)?;
                api.create(&PostParams::default(), &pod)
                    .await
                    .with_context(|| format!("creating the pods already running in {name}"))?;
                anyhow::Ok(())
            });
        }
    }
    let results: Vec<_> = futures::stream::iter(creates)
        .buffer_unordered(64)
        .collect()
        .await;
    results.into_iter().collect::<anyhow::Result<Vec<()>>>()?;
    Ok(())
}

/// Waits until the pods created downstairs run (each lower kubelet has started them), so the
/// burst is measured on a settled fleet, not beside 50,000 pods starting. One LIST per cluster
/// every 2 s, of the pods not Running yet only.
async fn wait_filled(sandbox: &Sandbox, within: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + within;
    for lower in &sandbox.lowers {
        let api: Api<Pod> = Api::namespaced(lower.client().await?, "default");
        let params = ListParams::default().fields("status.phase!=Running");
        loop {
            let left = api
                .list(&params)
                .await
                .with_context(|| format!("listing the pods not Running in {}", lower.name))?
                .items
                .len();
            if left == 0 {
                break;
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "{left} pods created in {} were not Running within {within:?}",
                lower.name
            );
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
    }
    Ok(())
}

/// Waits until each virtual node publishes the room the pods created downstairs left: its
/// allocatable CPU at most its cluster's nodes' CPU minus those pods' requests (a virtual node
/// publishes at most once a second), so the burst starts on what the upper scheduler will see.
/// One watch per virtual node.
async fn wait_published(sandbox: &Sandbox, rooms: &[i64], within: Duration) -> anyhow::Result<()> {
    let nodes: Api<Node> = Api::all(sandbox.upper.client().await?);
    let deadline = Instant::now() + within;
    for (name, room) in sandbox.virtual_nodes.iter().zip(rooms) {
        let room = *room;
        let published = move |node: Option<&Node>| {
            node.and_then(|n| n.status.as_ref()?.allocatable.as_ref()?.get("cpu").cloned())
                .and_then(|q| parse_quantity(&q.0).ok())
                .and_then(|q| i64::try_from(q.milli_value()).ok())
                .is_some_and(|cpu| cpu <= room)
        };
        let left = deadline.saturating_duration_since(Instant::now());
        tokio::time::timeout(
            left,
            kube::runtime::wait::await_condition(nodes.clone(), name, published),
        )
        .await
        .with_context(|| {
            format!("virtual node {name} did not publish {room}m CPU or less within {within:?}")
        })?
        .with_context(|| format!("watching virtual node {name}"))?;
    }
    Ok(())
}

/// Lower nodes whose pods (not finished) request more CPU than the node has: one LIST per
/// cluster, once, at the end of a run.
async fn overcommitted(sandbox: &Sandbox) -> anyhow::Result<usize> {
    let mut count = 0;
    for lower in &sandbox.lowers {
        let (name, client) = (&lower.name, lower.client().await?);
        let nodes = Api::<Node>::all(client.clone())
            .list(&ListParams::default())
            .await
            .with_context(|| format!("listing the nodes of {name}"))?;
        let pods = Api::<Pod>::all(client)
            .list(&ListParams::default())
            .await
            .with_context(|| format!("listing the pods of {name}"))?;
        let mut requested: HashMap<String, i128> = HashMap::new();
        for p in &pods.items {
            let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
            if matches!(phase, Some("Succeeded" | "Failed")) {
                continue;
            }
            let Some(node) = p.spec.as_ref().and_then(|s| s.node_name.clone()) else {
                continue;
            };
            let cpu: i128 = p
                .spec
                .iter()
                .flat_map(|s| &s.containers)
                .filter_map(|c| c.resources.as_ref()?.requests.as_ref()?.get("cpu"))
                .filter_map(|q| parse_quantity(&q.0).ok())
                .map(|q| q.milli_value())
                .sum();
            *requested.entry(node).or_default() += cpu;
        }
        for n in &nodes.items {
            let name = n.metadata.name.clone().unwrap_or_default();
            let allocatable = n
                .status
                .as_ref()
                .and_then(|s| s.allocatable.as_ref())
                .and_then(|a| a.get("cpu"))
                .and_then(|q| parse_quantity(&q.0).ok())
                .map_or(0, |q| q.milli_value());
            if requested.get(&name).copied().unwrap_or(0) > allocatable {
                count += 1;
            }
        }
    }
    Ok(count)
}

/// A quantile (0..1) of one verb of `tensile_extender_request_seconds`, in ms, None without
/// calls.
fn extender_quantile(samples: &crate::support::Samples, verb: &str, q: f64) -> Option<f64> {
    crate::support::histogram_quantile(
        samples,
        "tensile_extender_request_seconds",
        &[("verb", verb)],
        q,
    )
    .map(|s| s * 1000.0)
}

async fn run_mode(mode: &str, args: &FragmentationArgs) -> anyhow::Result<Outcome> {
    let (descheduler, extender) = match mode {
        "none" => (false, false),
        "descheduler" => (true, false),
        "extender" => (false, true),
        "both" => (true, true),
        other => anyhow::bail!("unknown mode {other:?}: none, descheduler, extender or both"),
    };
    let binary = std::env::current_exe().context("finding this binary")?;
    let descheduler_metrics = DeschedulerMetrics::default();
    let lowers = fleet(args);
    let plan = running_pods(&lowers, args.running_pods, args.fill);
    // Each cluster's CPU left once those pods run, in millicores.
    let rooms: Vec<i64> = lowers
        .iter()
        .zip(&plan)
        .map(|(nodes, pods)| {
            nodes.iter().map(node_millis).sum::<i64>()
                - pods.iter().map(|(_, cpu)| cpu).sum::<i64>()
        })
        .collect();
    let sandbox = Sandbox::start(
        SandboxSpec {
            address: "127.0.0.1".parse()?,
            port: 0,
            lowers,
            webhook: true,
            descheduler: descheduler.then(|| DeschedulerConfig {
                metrics: descheduler_metrics.clone(),
                ..DeschedulerConfig::default()
            }),
            extender: extender.then_some(ExtenderRun::Process {
                binary: binary.clone(),
            }),
            // On real control planes when the harness's variable names their binaries.
            k8s_bin: tensile_testenv::real::bin_dir(),
            // Their memory and CPU are reported apart from the clusters'.
            virtual_nodes: VirtualNodeRun::Process { binary },
            scheduler_qps: args.scheduler_qps,
            real_nodes: false,
        },
        &|_| {},
    )
    .await?;
    let setup = Instant::now();
    fill_lower_clusters(&sandbox, &plan).await?;
    let filled = setup.elapsed();
    wait_filled(&sandbox, Duration::from_secs(600)).await?;
    sandbox.wait_ready(Duration::from_secs(120)).await?;
    wait_published(&sandbox, &rooms, Duration::from_secs(60)).await?;
    let settled = setup.elapsed();
    tracing::info!(
        mode,
        pods_downstairs = plan.iter().map(Vec::len).sum::<usize>(),
        created_s = filled.as_secs_f64(),
        running_s = settled.as_secs_f64(),
        "the fleet is filled; the burst starts"
    );
    let client = sandbox.upper.client().await?;
    let seen = Arc::new(Mutex::new(Observed::default()));
    let watch = watch_pods(client.clone(), seen.clone());
    let total: usize = workloads(args.pods).iter().map(|w| w.2).sum();
    let started = Instant::now();
    let cpu_at_start = cpu_seconds(std::process::id());
    let extender_cpu_at_start = sandbox
        .extender_process
        .as_ref()
        .map(|p| cpu_seconds(p.pid));
    let node_pids: Vec<u32> = sandbox
        .virtual_node_processes
        .iter()
        .map(|p| p.pid)
        .collect();
    let nodes_cpu_at_start: f64 = node_pids.iter().map(|p| cpu_seconds(*p)).sum();
    for (name, cpu, replicas, job) in workloads(args.pods) {
        let template = json!({"metadata": {"labels": {"app": name, "virtual-pod": "true"}},
            "spec": {"restartPolicy": if job { "Never" } else { "Always" },
                "containers": [{"name": "c", "image": "app",
                    "resources": {"requests": {"cpu": cpu, "memory": "128Mi"}}}]}});
        let created = if job {
            let j: Job = serde_json::from_value(json!({
                "metadata": {"name": name},
                "spec": {"parallelism": replicas, "completions": replicas, "template": template}
            }))?;
            Api::<Job>::namespaced(client.clone(), "default")
                .create(&PostParams::default(), &j)
                .await
                .map(|_| ())
        } else {
            let d: Deployment = serde_json::from_value(json!({
                "metadata": {"name": name},
                "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                    "template": template}
            }))?;
            Api::<Deployment>::namespaced(client.clone(), "default")
                .create(&PostParams::default(), &d)
                .await
                .map(|_| ())
        };
        created.with_context(|| format!("creating workload {name}"))?;
    }
    let window = Duration::from_secs(args.window);
    // Past the window, wait as long again for the last pods, then stop.
    while started.elapsed() < window * 2 {
        let running = seen
            .lock()
            .map_err(|_| anyhow::anyhow!("observer poisoned"))?
            .running
            .len();
        if running >= total {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    watch.abort();
    let (samples, extender_peak_rss_mib, extender_cpu_s) = match &sandbox.extender_process {
        Some(p) => {
            let (status, text) = tensile_testenv::http_get(p.metrics_addr, "/metrics")
                .await
                .context("reading the extender's metrics")?;
            anyhow::ensure!(status == 200, "the extender's /metrics answered {status}");
            (
                crate::support::parse_metrics(&text),
                Some(memory_mib(p.pid).1),
                Some(cpu_seconds(p.pid) - extender_cpu_at_start.unwrap_or(0.0)),
            )
        }
        None => (Default::default(), None, None),
    };
    let overcommitted = overcommitted(&sandbox).await?;
    let outcome = {
        let seen = seen
            .lock()
            .map_err(|_| anyhow::anyhow!("observer poisoned"))?;
        let all_running_s = (seen.running.len() >= total)
            .then(|| seen.running.values().max())
            .flatten()
            .map(|l| l.duration_since(started).as_secs_f64());
        let last_bound = seen
            .bound
            .values()
            .max()
            .map_or(0.0, |l| l.duration_since(started).as_secs_f64());
        Outcome {
            mode: mode.to_owned(),
            total,
            running_in_window: seen
                .running
                .values()
                .filter(|t| t.duration_since(started) <= window)
                .count(),
            all_running_s,
            bound_per_s: seen.bound.len() as f64 / last_bound.max(1e-3),
            stranded: seen.stranded.len(),
            overcommitted,
            extender_filter_p50_ms: extender_quantile(&samples, "filter", 0.5),
            extender_filter_p99_ms: extender_quantile(&samples, "filter", 0.99),
            extender_bind_p99_ms: extender_quantile(&samples, "bind", 0.99),
            extender_filter_calls_per_pod: samples
                .iter()
                .find(|((name, labels), _)| {
                    name == "tensile_extender_request_seconds_count"
                        && labels.get("verb").map(String::as_str) == Some("filter")
                })
                .map(|(_, calls)| calls / total.max(1) as f64),
            extender_rooms_built_per_pod: sandbox.extender_process.as_ref().map(|_| {
                samples
                    .iter()
                    .filter(|((name, _), _)| name == "tensile_extender_rooms_built_total")
                    .map(|(_, built)| built)
                    .sum::<f64>()
                    / total.max(1) as f64
            }),
            descheduler_moves: descheduler_metrics.moves(),
            extender_peak_rss_mib,
            extender_cpu_s,
            process_peak_rss_mib: Some(memory_mib(std::process::id()).1),
            process_burst_cpu_s: cpu_seconds(std::process::id()) - cpu_at_start,
            virtual_nodes_peak_rss_mib: node_pids.iter().map(|p| memory_mib(*p).1).sum(),
            virtual_node_max_peak_rss_mib: node_pids
                .iter()
                .map(|p| memory_mib(*p).1)
                .fold(0.0, f64::max),
            virtual_nodes_burst_cpu_s: node_pids.iter().map(|p| cpu_seconds(*p)).sum::<f64>()
                - nodes_cpu_at_start,
            fill_created_s: filled.as_secs_f64(),
            fill_running_s: settled.as_secs_f64(),
            running_at_s: seen
                .running
                .values()
                .map(|t| t.duration_since(started).as_secs_f64())
                .collect(),
            bound_at_s: seen
                .bound
                .values()
                .map(|t| t.duration_since(started).as_secs_f64())
                .collect(),
        }
    };
    sandbox.stop().await;
    Ok(outcome)
}

pub async fn run(args: FragmentationArgs) -> anyhow::Result<()> {
    let lowers = fleet(&args);
    let nodes: usize = lowers.iter().map(Vec::len).sum();
    let running: usize = running_pods(&lowers, args.running_pods, args.fill)
        .iter()
        .map(Vec::len)
        .sum();
    println!(
        "fragmentation: {} pods (500m/1/2500m CPU, 6:3:1) as 2 Deployments and a Job; {} lower clusters, {nodes} nodes ({}), {running} pods already running downstairs (fill {}); window {} s",
        workloads(args.pods).iter().map(|w| w.2).sum::<usize>(),
        lowers.len(),
        match args.nodes_per_cluster {
            Some(per) => format!("{per} per cluster of 2/4/8/16 CPU"),
            None => "of 2, 3 and 6 CPU by cluster".to_owned(),
        },
        args.fill,
        args.window
    );
    if let Some(qps) = args.scheduler_qps {
        println!(
            "tuned: the upper scheduler's and the extender's clients at {qps} QPS, burst {} (defaults 50, 100)",
            qps.saturating_mul(2)
        );
    }
    println!();
    println!(
        "| placement help | Running after {} s | time to all Running | bound/s | stranded | over-committed nodes | extender filter p50/p99, bind p99 (ms) | extender peak RSS, CPU | descheduler moves | virtual nodes peak RSS (sum, largest), CPU | bench process peak RSS, CPU |",
        args.window
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    let mut outcomes = Vec::new();
    for mode in &args.modes {
        let o = run_mode(mode, &args).await?;
        let ms = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.1}"));
        println!(
            "| {} | {}/{} ({:.0} %) | {} | {:.0} | {} | {} | {} / {} / {} | {} | {} | {:.0} MiB, {:.1} MiB, {:.1} s | {} MiB, {:.1} s |",
            o.mode,
            o.running_in_window,
            o.total,
            100.0 * o.running_in_window as f64 / o.total.max(1) as f64,
            o.all_running_s.map_or_else(
                || format!("not all within {} s", args.window * 2),
                |s| format!("{s:.1} s")
            ),
            o.bound_per_s,
            o.stranded,
            o.overcommitted,
            ms(o.extender_filter_p50_ms),
            ms(o.extender_filter_p99_ms),
            ms(o.extender_bind_p99_ms),
            match (o.extender_peak_rss_mib, o.extender_cpu_s) {
                (Some(rss), Some(cpu)) => format!("{rss:.1} MiB, {cpu:.1} s"),
                _ => "-".to_owned(),
            },
            o.descheduler_moves,
            o.virtual_nodes_peak_rss_mib,
            o.virtual_node_max_peak_rss_mib,
            o.virtual_nodes_burst_cpu_s,
            ms(o.process_peak_rss_mib),
            o.process_burst_cpu_s
        );
        outcomes.push(o);
    }
    if let Some(path) = &args.plot {
        crate::plot::write(path, &modes_plot(&args, nodes, &outcomes)?)?;
        println!("plot of the runs written to {}", path.display());
    }
    println!(
        "{}",
        serde_json::to_string(&json!({"runs": outcomes, "scheduler_qps": args.scheduler_qps}))?
    );
    Ok(())
}

/// The plot of `--plot`: per mode, the burst's pods Running and bound over time.
fn modes_plot(
    args: &FragmentationArgs,
    nodes: usize,
    outcomes: &[Outcome],
) -> anyhow::Result<String> {
    use crate::plot::{Corner, Line, Marker, Panel, Timeline, cumulative};
    let total = outcomes.first().map_or(0, |o| o.total);
    let running = outcomes
        .iter()
        .map(|o| Line::new(o.mode.clone(), cumulative(&o.running_at_s)))
        .collect();
    let bound = outcomes
        .iter()
        .map(|o| {
            Line::new(
                format!("{}: {:.0} bound/s", o.mode, o.bound_per_s),
                cumulative(&o.bound_at_s),
            )
        })
        .collect();
    crate::plot::timeline(&Timeline {
        title: format!(
            "tensile bench fragmentation: {total} pods, {} lower clusters, {nodes} nodes ({}, {} build)",
            args.lower_clusters,
            if tensile_testenv::real::bin_dir().is_some() {
                "real control planes"
            } else {
                "simulated"
            },
            crate::plot::build()
        ),
        x_desc: "seconds since the burst was created".into(),
        panels: vec![
            Panel {
                y_desc: "pods Running".into(),
                lines: running,
                legend: Corner::LowerRight,
            },
            Panel {
                y_desc: "pods bound upstairs".into(),
                lines: bound,
                legend: Corner::LowerRight,
            },
        ],
        spans: Vec::new(),
        markers: vec![Marker {
            label: format!("window ({} s)", args.window),
            at: args.window as f64,
        }],
        alarms: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn running_pods_leave_fragments_on_every_node() {
        let fleet = vec![vec![
            SimNode::new("a", "2", "1Gi"),
            SimNode::new("b", "16", "1Gi"),
        ]];
        let plan = running_pods(&fleet, 18, 1.0);
        let on = |node: &str| -> i64 {
            plan[0]
                .iter()
                .filter(|(n, _)| n == node)
                .map(|(_, m)| m)
                .sum()
        };
        // 2 of 18 CPU: 2 pods on a, 16 on b; a keeps 250m, b 750m (up to rounding down).
        assert_eq!(plan[0].iter().filter(|(n, _)| n == "a").count(), 2);
        assert!((1740..=1750).contains(&on("a")), "{}", on("a"));
        assert!((15240..=15250).contains(&on("b")), "{}", on("b"));
    }
}
