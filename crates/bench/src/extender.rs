//! `tensile bench extender`: the scheduler extender's decisions alone, in this process, on a
//! fleet of the shape `tensile bench fragmentation` builds (the same nodes, pods running
//! downstairs and burst), with no API server and no HTTP. It drives the extender's index
//! (`tensile_placement::extender::index`) as the extender does: the lists of every lower
//! cluster, then per pod of the burst a `filter` over every virtual node, a `prioritize` over
//! the nodes that passed and a `bind` to the best, and the lower pod of each bound pod showing
//! up (pending) `--in-flight` binds later (in an order shuffled within `--out-of-order`) and
//! bound downstairs after as many again (then reported Running), as the virtual nodes, lower
//! schedulers and kubelets would make them. It reports each decision's latency, the
//! CPU the burst took, the pods no cluster could take and any lower node over-committed.
//!
//! What it leaves out: reading and writing the HTTP bodies, the Binding call to the upper API
//! server, and the watch streams; `tensile bench fragmentation --mode extender` measures the
//! extender whole.

#![allow(clippy::print_stdout)] // the report is what the command prints

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::runtime::watcher::Event;
use serde_json::json;
use tensile_core::extender::Verdict;
use tensile_core::keys::ANNOTATION_UPPER_UID;
use tensile_core::quantity::parse_quantity;
use tensile_placement::extender::DEFAULT_RESERVATION_TTL;
use tensile_placement::extender::index::{BindTarget, Index, Reserved};

use crate::fragmentation::{fleet_of, node_millis, running_pods, workloads};
use crate::support::{cpu_seconds, memory_mib};

/// Flags of `tensile bench extender`.
#[derive(Debug, clap::Args)]
pub struct ExtenderBenchArgs {
    /// Lower clusters.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u16).range(1..=200))]
    lower_clusters: u16,
    /// Nodes per lower cluster, of 2, 4, 8 and 16 CPU in turn.
    #[arg(long, default_value_t = 250)]
    nodes_per_cluster: usize,
    /// Pods running downstairs before the burst, spread over the nodes by their size.
    #[arg(long, default_value_t = 50_000)]
    running_pods: usize,
    /// How full --running-pods make each node (0 to 1); each keeps 0.25 to 2 CPU free.
    #[arg(long, default_value_t = 0.7)]
    fill: f64,
    /// Pods in the burst: 500m, 1 and 2500m CPU in the ratio 6:3:1.
    #[arg(long, default_value_t = 10_000)]
    pods: usize,
    /// Binds whose lower pod has not shown up yet: each bound pod's lower pod appears this
    /// many binds later (pending), and is bound downstairs as many binds after that.
    #[arg(long, default_value_t = 200)]
    in_flight: usize,
    /// Lower pods show up in an order shuffled within windows of this many (1: in the order
    /// bound): a virtual node's workers (50 by default) create lower pods side by side, so
    /// they reach the extender's watch out of the binds' order. The lower scheduler binds
    /// them in the order they showed up.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..))]
    out_of_order: u32,
}

/// Latencies of one kind of decision.
#[derive(Default)]
struct Timings(Vec<Duration>);

impl Timings {
    fn time<T>(&mut self, f: impl FnOnce() -> T) -> T {
        let start = Instant::now();
        let out = f();
        self.0.push(start.elapsed());
        out
    }

    /// The `q` quantile in milliseconds (NaN when empty).
    fn ms(&mut self, q: f64) -> f64 {
        if self.0.is_empty() {
            return f64::NAN;
        }
        self.0.sort_unstable();
        let i = ((self.0.len() - 1) as f64 * q).round() as usize;
        self.0[i.min(self.0.len() - 1)].as_secs_f64() * 1000.0
    }

    fn total_s(&self) -> f64 {
        self.0.iter().map(Duration::as_secs_f64).sum()
    }
}

#[derive(Debug, serde::Serialize)]
struct Report {
    lower_clusters: u16,
    nodes: usize,
    running_pods: usize,
    pods: usize,
    in_flight: usize,
    out_of_order: u32,
    list_s: f64,
    filter_p50_ms: f64,
    filter_p99_ms: f64,
    filter_max_ms: f64,
    prioritize_p50_ms: f64,
    prioritize_p99_ms: f64,
    bind_p50_ms: f64,
    bind_p99_ms: f64,
    bind_max_ms: f64,
    lower_event_p99_ms: f64,
    /// Time in the index's calls during the burst, and this process's CPU time for it.
    decisions_s: f64,
    burst_cpu_s: f64,
    /// Rooms of lower clusters simulated from scratch during the burst, over its pods.
    rooms_built_per_pod: f64,
    bound: usize,
    /// Pods no lower cluster could take when their turn came.
    unplaceable: usize,
    /// Binds the index refused (the room went between filter and bind).
    bind_refused: usize,
    /// Lower pods of bound pods that no node of their cluster could take when the lower
    /// scheduler's turn came (each waits downstairs, stranded).
    stranded: usize,
    /// Lower nodes whose pods request more CPU than they have (0 unless the bench is wrong).
    overcommitted: usize,
    peak_rss_mib: f64,
}

fn millis(quantity: &str) -> anyhow::Result<i64> {
    let q = parse_quantity(quantity).with_context(|| format!("quantity {quantity}"))?;
    i64::try_from(q.milli_value()).with_context(|| format!("quantity {quantity}"))
}

fn node(name: &str, cpu: &str) -> anyhow::Result<Node> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "status": {
            "allocatable": {"cpu": cpu, "memory": "256Gi", "pods": "110", "ephemeral-storage": "100Gi"},
            "capacity": {"cpu": cpu, "memory": "256Gi", "pods": "110", "ephemeral-storage": "100Gi"},
            "conditions": [{"type": "Ready", "status": "True"}]
        }
    }))?)
}

fn pod(
    namespace: &str,
    name: &str,
    uid: &str,
    cpu: &str,
    node: Option<&str>,
    upper_uid: Option<&str>,
) -> anyhow::Result<Pod> {
    let mut pod = json!({
        "metadata": {"name": name, "namespace": namespace, "uid": uid, "resourceVersion": "1"},
        "spec": {"containers": [{"name": "c", "image": "app",
            "resources": {"requests": {"cpu": cpu, "memory": "128Mi"}}}]},
        "status": {"phase": if node.is_some() { "Running" } else { "Pending" }}
    });
    if let Some(node) = node {
        pod["spec"]["nodeName"] = json!(node);
    }
    if let Some(upper) = upper_uid {
        pod["metadata"]["annotations"] = json!({ ANNOTATION_UPPER_UID: upper });
    }
    Ok(serde_json::from_value(pod)?)
}

/// A bound pod on its way downstairs.
struct InFlight {
    cluster: String,
    lower: Pod,
    /// Its CPU request in millicores.
    cpu: i64,
}

/// The lower clusters' schedulers, as kube-scheduler's `LeastAllocated` places a pod (the
/// simulated scheduler does the same): on the node with room where the mean over CPU and memory
/// of the share left free is highest, the first name among equals. Every pod asks 128Mi.
#[derive(Default)]
struct LowerSchedulers {
    /// Per cluster, per node: allocatable millicores, millicores asked, pods.
    nodes: HashMap<String, BTreeMap<String, (i64, i64, i64)>>,
    /// Lower pods no node could take.
    stranded: usize,
}

/// Each node's memory and each pod's, in MiB.
const NODE_MEMORY_MIB: i64 = 256 * 1024;
const POD_MEMORY_MIB: i64 = 128;

impl LowerSchedulers {
    fn add_node(&mut self, cluster: &str, node: &str, cpu: i64) {
        self.nodes
            .entry(cluster.to_owned())
            .or_default()
            .insert(node.to_owned(), (cpu, 0, 0));
    }

    fn take(&mut self, cluster: &str, node: &str, cpu: i64) {
        if let Some(n) = self.nodes.get_mut(cluster).and_then(|c| c.get_mut(node)) {
            n.1 += cpu;
            n.2 += 1;
        }
    }

    /// Binds a pod of `cpu` millicores in `cluster`; its node, or `None` (stranded).
    fn bind(&mut self, cluster: &str, cpu: i64) -> Option<String> {
        let nodes = self.nodes.get(cluster)?;
        let mut best: Option<(i64, &String)> = None;
        for (name, (have, asked, pods)) in nodes {
            if have - asked < cpu || *have <= 0 {
                continue;
            }
            let memory_left = NODE_MEMORY_MIB - (pods + 1) * POD_MEMORY_MIB;
            let score =
                ((have - asked - cpu) * 100 / have + memory_left * 100 / NODE_MEMORY_MIB) / 2;
            if best.is_none_or(|(b, _)| score > b) {
                best = Some((score, name));
            }
        }
        let Some((_, name)) = best else {
            self.stranded += 1;
            return None;
        };
        let name = name.clone();
        self.take(cluster, &name, cpu);
        Some(name)
    }

    /// Nodes whose pods ask for more CPU than they have.
    fn overcommitted(&self) -> usize {
        self.nodes
            .values()
            .flat_map(BTreeMap::values)
            .filter(|(have, asked, _)| asked > have)
            .count()
    }
}

/// What happens downstairs after a bind: the lower pod shows up pending once more than
/// `--in-flight` binds wait for theirs, and the lower scheduler binds it once more than as many
/// wait for that.
struct Downstairs {
    schedulers: LowerSchedulers,
    created: VecDeque<InFlight>,
    pending: VecDeque<InFlight>,
    /// The index's time on each lower pod event.
    events: Timings,
    /// Which of the first `window` in line goes next.
    order: Shuffle,
}

/// Picks one of the first `window` of a queue, pseudo-randomly (fixed seed: every run sees the
/// same order).
struct Shuffle {
    window: usize,
    rng: fastrand::Rng,
}

impl Shuffle {
    fn take<T>(&mut self, queue: &mut VecDeque<T>) -> Option<T> {
        let span = queue.len().min(self.window).max(1);
        queue.remove(self.rng.usize(..span))
    }
}

impl Downstairs {
    fn advance(&mut self, index: &mut Index, keep: usize) {
        while self.created.len() > keep {
            let Some(p) = self.order.take(&mut self.created) else {
                break;
            };
            self.events
                .time(|| index.apply_lower_pod(&p.cluster, &Event::Apply(p.lower.clone())));
            self.pending.push_back(p);
        }
        while self.pending.len() > keep {
            // The lower scheduler takes them in the order they arrived.
            let Some(mut p) = self.pending.pop_front() else {
                break;
            };
            // A lower pod no node takes stays pending: the extender keeps counting it.
            if let Some(node) = self.schedulers.bind(&p.cluster, p.cpu) {
                p.lower.spec.get_or_insert_with(Default::default).node_name = Some(node);
                self.events
                    .time(|| index.apply_lower_pod(&p.cluster, &Event::Apply(p.lower.clone())));
                // Its kubelet reports it Running.
                p.lower.status.get_or_insert_with(Default::default).phase = Some("Running".into());
                self.events
                    .time(|| index.apply_lower_pod(&p.cluster, &Event::Apply(p.lower)));
            }
        }
    }
}

pub async fn run(args: ExtenderBenchArgs) -> anyhow::Result<()> {
    let fleet = fleet_of(args.lower_clusters, Some(args.nodes_per_cluster), args.pods);
    let plan = running_pods(&fleet, args.running_pods, args.fill);
    let ids: Vec<String> = (1..=fleet.len()).map(|i| format!("c{i}")).collect();
    let mut index = Index::new(ids.clone(), DEFAULT_RESERVATION_TTL);
    let mut downstairs = Downstairs {
        schedulers: LowerSchedulers::default(),
        created: VecDeque::new(),
        pending: VecDeque::new(),
        events: Timings::default(),
        order: Shuffle {
            window: usize::try_from(args.out_of_order).unwrap_or(usize::MAX),
            rng: fastrand::Rng::with_seed(0x9e37_79b9_7f4a_7c15),
        },
    };

    let listing = Instant::now();
    index.apply_upper_node(&Event::Init);
    let virtual_nodes: Vec<String> = ids.iter().map(|id| format!("vk-{id}")).collect();
    for (id, name) in ids.iter().zip(&virtual_nodes) {
        let upper: Node = serde_json::from_value(json!({"metadata": {"name": name,
            "labels": {"type": "virtual-kubelet", "clusterID": id}}}))?;
        index.apply_upper_node(&Event::InitApply(upper));
    }
    index.apply_upper_node(&Event::InitDone);
    let mut running = 0usize;
    for ((id, nodes), pods) in ids.iter().zip(&fleet).zip(&plan) {
        index.apply_lower_node(id, &Event::Init);
        for n in nodes {
            let cpu = n.resources.get("cpu").map_or("0", String::as_str);
            downstairs.schedulers.add_node(id, &n.name, node_millis(n));
            index.apply_lower_node(id, &Event::InitApply(node(&n.name, cpu)?));
        }
        index.apply_lower_node(id, &Event::InitDone);
        index.apply_lower_pod(id, &Event::Init);
        for (i, (node_name, cpu)) in pods.iter().enumerate() {
            downstairs.schedulers.take(id, node_name, *cpu);
            let p = pod(
                "fill",
                &format!("fill-{i}"),
                &format!("{id}-fill-{i}"),
                &format!("{cpu}m"),
                Some(node_name),
                None,
            )?;
            index.apply_lower_pod(id, &Event::InitApply(p));
            running += 1;
        }
        index.apply_lower_pod(id, &Event::InitDone);
    }
    anyhow::ensure!(index.synced(), "the index did not sync from its lists");
    let list_s = listing.elapsed().as_secs_f64();

    // The burst's pods, the workloads interleaved as their controllers create them.
    let mut burst: Vec<(String, &str)> = Vec::new();
    let work = workloads(args.pods);
    let longest = work.iter().map(|w| w.2).max().unwrap_or(0);
    for i in 0..longest {
        for (name, cpu, replicas, _) in &work {
            if i < *replicas {
                burst.push((format!("{name}-{i}"), cpu));
            }
        }
    }

    let (mut filter, mut prioritize, mut bind) =
        (Timings::default(), Timings::default(), Timings::default());
    let (mut bound, mut unplaceable, mut bind_refused) = (0usize, 0usize, 0usize);
    let pid = std::process::id();
    let rooms_before: u64 = index.rooms_built().map(|(_, n)| n).sum();
    let cpu_start = cpu_seconds(pid);
    for (i, (name, cpu)) in burst.iter().enumerate() {
        let uid = format!("burst-{i}");
        let upper = pod("default", name, &uid, cpu, None, None)?;
        let now = Instant::now();
        let verdicts = filter.time(|| {
            index.judge_pod(
                &upper,
                virtual_nodes.iter().map(|n| (n.as_str(), None)),
                now,
            )
        });
        let passed: Vec<&str> = virtual_nodes
            .iter()
            .zip(&verdicts)
            .filter(|(_, v)| v.as_ref().is_none_or(Verdict::fits))
            .map(|(n, _)| n.as_str())
            .collect();
        if passed.is_empty() {
            unplaceable += 1;
            continue;
        }
        let scores =
            prioritize.time(|| index.judge_pod(&upper, passed.iter().map(|n| (*n, None)), now));
        // kube-scheduler binds the highest score (here the first among equals).
        let mut best: Option<(&str, i64)> = None;
        for (n, v) in passed.iter().zip(&scores) {
            let score = match v {
                Some(Verdict::Fits { score, .. }) => score.to_owned(),
                _ => 0,
            };
            if best.is_none_or(|(_, b)| score > b) {
                best = Some((n, score));
            }
        }
        let Some((target, _)) = best else { continue };
        let reserved = bind.time(|| match index.bind_target(target, Some(&uid)) {
            Ok(BindTarget::Cluster {
                id,
                demand: Some(demand),
            }) => index.reserve(&id, &uid, *demand, now).map(|r| (id, r)),
            Ok(other) => Err(format!("{target}: not a known virtual node ({other:?})")),
            Err(e) => Err(e),
        });
        match reserved {
            Ok((id, Reserved::Room { .. })) => {
                bound += 1;
                downstairs.created.push_back(InFlight {
                    lower: pod(
                        "default",
                        &format!("{name}-{id}"),
                        &format!("lower-{uid}"),
                        cpu,
                        None,
                        Some(&uid),
                    )?,
                    cluster: id,
                    cpu: millis(cpu)?,
                });
            }
            Ok((_, Reserved::AlreadyThere)) => bound += 1,
            Err(_) => bind_refused += 1,
        }
        downstairs.advance(&mut index, args.in_flight);
    }
    downstairs.advance(&mut index, 0);
    let burst_cpu_s = cpu_seconds(pid) - cpu_start;
    let rooms_built = index.rooms_built().map(|(_, n)| n).sum::<u64>() - rooms_before;
    let overcommitted = downstairs.schedulers.overcommitted();
    let decisions_s = filter.total_s() + prioritize.total_s() + bind.total_s();
    let report = Report {
        lower_clusters: args.lower_clusters,
        nodes: fleet.iter().map(Vec::len).sum(),
        running_pods: running,
        pods: burst.len(),
        in_flight: args.in_flight,
        out_of_order: args.out_of_order,
        list_s,
        filter_p50_ms: filter.ms(0.5),
        filter_p99_ms: filter.ms(0.99),
        filter_max_ms: filter.ms(1.0),
        prioritize_p50_ms: prioritize.ms(0.5),
        prioritize_p99_ms: prioritize.ms(0.99),
        bind_p50_ms: bind.ms(0.5),
        bind_p99_ms: bind.ms(0.99),
        bind_max_ms: bind.ms(1.0),
        lower_event_p99_ms: downstairs.events.ms(0.99),
        decisions_s,
        burst_cpu_s,
        rooms_built_per_pod: rooms_built as f64 / burst.len().max(1) as f64,
        bound,
        unplaceable,
        bind_refused,
        stranded: downstairs.schedulers.stranded,
        overcommitted,
        peak_rss_mib: memory_mib(pid).1,
    };
    println!(
        "{} lower clusters, {} nodes, {} pods running; a burst of {} ({} bound, {} fit nowhere, {} binds refused), {} in flight, shuffled within {}",
        report.lower_clusters,
        report.nodes,
        report.running_pods,
        report.pods,
        report.bound,
        report.unplaceable,
        report.bind_refused,
        report.in_flight,
        report.out_of_order
    );
    println!(
        "filter p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms; prioritize p50 {:.3} ms, p99 {:.3} ms; bind p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms; lower pod event p99 {:.3} ms",
        report.filter_p50_ms,
        report.filter_p99_ms,
        report.filter_max_ms,
        report.prioritize_p50_ms,
        report.prioritize_p99_ms,
        report.bind_p50_ms,
        report.bind_p99_ms,
        report.bind_max_ms,
        report.lower_event_p99_ms
    );
    println!(
        "decisions {:.2} s, burst CPU {:.2} s, rooms built per pod {:.2}; lists {:.2} s; stranded lower pods {}, over-committed lower nodes {}; peak RSS {:.1} MiB",
        report.decisions_s,
        report.burst_cpu_s,
        report.rooms_built_per_pod,
        report.list_s,
        report.stranded,
        report.overcommitted,
        report.peak_rss_mib
    );
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}
