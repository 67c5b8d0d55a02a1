//! `tensile bench offload`: a burst of pods through one virtual node between two simulated
//! clusters. The clusters run in this process; the virtual node runs as its own process
//! (`tensile virtual-node`, as deployed) so its memory is its own. Reports, per stage, the
//! latency seen from outside and the time inside the node (from its `/metrics`), the API
//! calls it made per cluster, verb and resource, and its memory.

#![allow(clippy::print_stdout)] // the report is what the command prints

use std::collections::{BTreeMap, HashMap};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;

use crate::plot;
use crate::support::{
    NODE, Samples, apiserver_metrics, burst_clusters, burst_pod, cpu_seconds, free_port,
    histogram_buckets, histogram_quantile, http_get, memory_mib, ms_json, parse_metrics, pct,
    server_quantile, sockets,
};

/// Flags of `tensile bench offload`.
#[derive(Debug, clap::Args)]
pub struct OffloadArgs {
    /// Pods to create at once.
    #[arg(long, default_value_t = 1000)]
    pods: usize,
    /// Concurrent creations upstairs.
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// Pod-sync workers of the virtual node (default: its own default, as the README runs it).
    #[arg(long)]
    workers: Option<usize>,
    /// Client QPS of the virtual node, both clusters (its token buckets; the burst is twice).
    /// Default: none given, so the node runs with the flags the README shows.
    #[arg(long)]
    qps: Option<u32>,
    /// Run the virtual node under this program, e.g. `heaptrack` to profile its memory (the
    /// reported RSS is then the wrapper's process).
    #[arg(long)]
    node_wrapper: Option<String>,
    /// The `tensile` binary the virtual node runs, e.g. the image's build (`cargo build
    /// --release --no-default-features --features jemalloc`, without the sandbox), to measure
    /// what a cluster runs; default: this binary.
    #[arg(long)]
    node_binary: Option<std::path::PathBuf>,
    /// `--pod-identity` of the virtual node (default: none given, so `upper`, the default).
    #[arg(long)]
    pod_identity: Option<String>,
    /// Each pod mounts a ConfigMap of its own, created upstairs just before it: every pod then
    /// waits for a lower copy, which measures what copies add to a pod's creation.
    #[arg(long)]
    config_maps: bool,
    /// Write an SVG plot of each stage's latency distribution to this file: the two stages
    /// seen from outside (one sample per pod) and the node's own stages (its histograms).
    #[arg(long, value_name = "FILE")]
    plot: Option<std::path::PathBuf>,
}

type Times = Arc<Mutex<HashMap<String, Instant>>>;

#[derive(Clone, Copy, Debug)]
enum Side {
    Upper,
    Lower,
}

/// When each pod was first seen in each state, by the benchmark's own watches.
#[derive(Clone, Default)]
struct Seen {
    acked: Times,
    upper_bound: Times,
    upper_running: Times,
    upper_gone: Times,
    lower_created: Times,
    lower_running: Times,
    lower_gone: Times,
}

impl Seen {
    fn record(&self, times: &Times, name: String, now: Instant) {
        if let Ok(mut t) = times.lock() {
            t.entry(name).or_insert(now);
        }
    }

    fn count(&self, times: &Times) -> usize {
        times.lock().map_or(0, |t| t.len())
    }

    fn gone(&self, side: Side) -> Times {
        match side {
            Side::Upper => self.upper_gone.clone(),
            Side::Lower => self.lower_gone.clone(),
        }
    }

    fn applied(&self, side: Side, p: &Pod, now: Instant) {
        let name = p.metadata.name.clone().unwrap_or_default();
        let running = p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
        match side {
            Side::Upper => {
                if p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(NODE) {
                    self.record(&self.upper_bound, name.clone(), now);
                }
                if running {
                    self.record(&self.upper_running, name, now);
                }
            }
            Side::Lower => {
                self.record(&self.lower_created, name.clone(), now);
                if running {
                    self.record(&self.lower_running, name, now);
                }
            }
        }
    }
}

/// One of our stages next to the API server's own latency of the write it waits for: the
/// stage's p99 over the server's p99 (how far the node is from what the server allows).
fn ratio(stage_p99: Duration, server_p99: Option<f64>) -> Option<f64> {
    server_p99
        .filter(|s| *s > 0.0)
        .map(|s| stage_p99.as_secs_f64() / s)
}

/// The plot of `--plot`: each stage's latency distribution, the two seen from outside from
/// their samples, the node's own from its `tensile_pod_sync_seconds` buckets.
fn stages_plot(
    n: usize,
    down: &[Duration],
    up: &[Duration],
    node: &Samples,
) -> anyhow::Result<String> {
    let mut lines = vec![
        plot::Line::new(
            "upper pod bound -> lower pod created (outside, per pod)",
            plot::cdf(down),
        ),
        plot::Line::new(
            "lower pod Running -> upper pod Running (outside, per pod)",
            plot::cdf(up),
        ),
    ];
    for stage in [
        "queue_wait",
        "reconcile",
        "upper_tokens",
        "lower_pod_create",
        "upper_status",
    ] {
        let buckets = histogram_buckets(node, "tensile_pod_sync_seconds", &[("stage", stage)]);
        let total = buckets.last().map_or(0.0, |b| b.1);
        lines.push(plot::Line::new(
            format!("{stage} (inside the node)"),
            plot::cdf_of_buckets(&buckets, total),
        ));
    }
    let backend = if tensile_testenv::real::bin_dir().is_some() {
        "real control planes"
    } else {
        "simulated clusters"
    };
    plot::latency_cdf(
        &format!(
            "tensile bench offload: {n} pods through one virtual node ({backend}, {} build)",
            plot::build()
        ),
        &lines,
    )
}

pub async fn run(args: OffloadArgs) -> anyhow::Result<()> {
    let n = args.pods;
    let lower_nodes = n.div_ceil(100).max(2);
    let mut env = burst_clusters(n).await?;
    let (upper, lower) = (
        env.clusters[0].client.clone(),
        env.clusters[1].client.clone(),
    );

    let metrics_addr = format!("127.0.0.1:{}", free_port()?);
    let exe = match &args.node_binary {
        Some(binary) => binary.clone(),
        None => std::env::current_exe().context("finding the tensile binary")?,
    };
    let mut command = match &args.node_wrapper {
        Some(wrapper) => {
            let mut c = tokio::process::Command::new(wrapper);
            c.arg(exe);
            c
        }
        None => tokio::process::Command::new(exe),
    };
    // The README's command line; what the benchmark adds only says where to listen.
    command
        .args(["virtual-node", "--nodename", NODE])
        .arg("--kubeconfig")
        .arg(&env.clusters[0].kubeconfig)
        .arg("--client-kubeconfig")
        .arg(&env.clusters[1].kubeconfig)
        .args(["--metrics-addr", &metrics_addr]);
    let mut tuned = Vec::new();
    if let Some(qps) = args.qps {
        let (qps, burst) = (qps.to_string(), qps.saturating_mul(2).to_string());
        for (flag, value) in [
            ("--kube-api-qps", &qps),
            ("--kube-api-burst", &burst),
            ("--client-qps", &qps),
            ("--client-burst", &burst),
        ] {
            tuned.push(format!("{flag} {value}"));
            command.args([flag, value.as_str()]);
        }
    }
    if let Some(workers) = args.workers {
        tuned.push(format!("--pod-sync-workers {workers}"));
        command.args(["--pod-sync-workers", &workers.to_string()]);
    }
    if let Some(identity) = &args.pod_identity {
        tuned.push(format!("--pod-identity {identity}"));
        command.args(["--pod-identity", identity]);
    }
    let mut child = command
        .args(["--kubelet-address", "127.0.0.1"])
        .env("KUBELET_PORT", free_port()?.to_string())
        .env("VKUBELET_POD_IP", "127.0.0.1")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .context("starting tensile virtual-node")?;
    let pid = child.id().context("the virtual node exited at once")?;
    let nodes: Api<Node> = Api::all(upper.clone());
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let ready = nodes.get_opt(NODE).await.ok().flatten().is_some();
        if ready && http_get(&metrics_addr, "/healthz").await.is_ok() {
            break;
        }
        if let Some(status) = child.try_wait()? {
            bail!("the virtual node exited: {status}");
        }
        if Instant::now() > deadline {
            bail!("the virtual node did not register within 60 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Start-up (initial lists, registration) settles before we count.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = parse_metrics(&http_get(&metrics_addr, "/metrics").await?);
    let idle_rss = memory_mib(pid).0;

    let seen = Seen::default();
    let observe = |client: kube::Client, side: Side, seen: Seen| {
        tokio::spawn(async move {
            let api: Api<Pod> = Api::namespaced(client, "default");
            let mut s = watcher(api, watcher::Config::default())
                .default_backoff()
                .boxed();
            while let Some(Ok(event)) = s.next().await {
                let now = Instant::now();
                match event {
                    watcher::Event::Apply(p) | watcher::Event::InitApply(p) => {
                        seen.applied(side, &p, now);
                    }
                    watcher::Event::Delete(p) => {
                        let name = p.metadata.name.clone().unwrap_or_default();
                        seen.record(&seen.gone(side), name, now);
                    }
                    watcher::Event::Init | watcher::Event::InitDone => {}
                }
            }
        })
    };
    let w1 = observe(lower.clone(), Side::Lower, seen.clone());
    let w2 = observe(upper.clone(), Side::Upper, seen.clone());
    let acked = seen.acked.clone();
    let upper_running = seen.upper_running.clone();
    let creator: Api<Pod> = Api::namespaced(upper.clone(), "default");
    let (upper_server_before, lower_server_before) = (
        apiserver_metrics(&upper).await,
        apiserver_metrics(&lower).await,
    );
    let (node_cpu_before, all_cpu_before) = (cpu_seconds(pid), cpu_seconds(std::process::id()));
    let start = Instant::now();
    let failures = futures::stream::iter(0..n)
        .map(|i| {
            let api = creator.clone();
            let acked = acked.clone();
            let config_maps = args.config_maps;
            async move {
                let name = format!("p-{i}");
                let volumes = if config_maps {
                    let cm: k8s_openapi::api::core::v1::ConfigMap = serde_json::from_value(
                        json!({"metadata": {"name": name}, "data": {"k": "v"}}),
                    )?;
                    Api::namespaced(api.clone().into_client(), "default")
                        .create(&PostParams::default(), &cm)
                        .await?;
                    json!([{"name": "c", "configMap": {"name": name}}])
                } else {
                    json!([])
                };
                let pod = burst_pod(&name, Some(volumes))?;
                api.create(&PostParams::default(), &pod).await?;
                if let Ok(mut a) = acked.lock() {
                    a.insert(name, Instant::now());
                }
                anyhow::Ok(())
            }
        })
        .buffer_unordered(args.concurrency.max(1))
        .filter(|r| futures::future::ready(r.is_err()))
        .count()
        .await;
    if failures > 0 {
        bail!("{failures} pod creations failed upstairs");
    }
    let deadline = Instant::now() + Duration::from_secs(600);
    let (mut peak_rss, mut peak_sockets) = (0.0_f64, 0);
    while upper_running.lock().map_or(0, |r| r.len()) < n && Instant::now() < deadline {
        peak_rss = peak_rss.max(memory_mib(pid).0);
        peak_sockets = peak_sockets.max(sockets(pid));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let total = start.elapsed();
    let node_cpu = cpu_seconds(pid) - node_cpu_before;
    let all_cpu = cpu_seconds(std::process::id()) - all_cpu_before;
    let after = parse_metrics(&http_get(&metrics_addr, "/metrics").await?);
    let (upper_server_after, lower_server_after) = (
        apiserver_metrics(&upper).await,
        apiserver_metrics(&lower).await,
    );
    let (rss, _) = memory_mib(pid);
    peak_rss = peak_rss.max(rss);
    // Memory once the burst is over and the node only holds its caches.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let (settled_rss, _) = memory_mib(pid);

    // Then every upper pod is deleted, as `kubectl delete` does (graceful), and the node takes
    // the lower pods down and lets the upper ones go.
    let delete_start = Instant::now();
    let delete_failures = futures::stream::iter(0..n)
        .map(|i| {
            let api = creator.clone();
            async move {
                api.delete(&format!("p-{i}"), &kube::api::DeleteParams::default())
                    .await
                    .map(|_| ())
            }
        })
        .buffer_unordered(args.concurrency.max(1))
        .filter(|r| futures::future::ready(r.is_err()))
        .count()
        .await;
    if delete_failures > 0 {
        bail!("{delete_failures} pod deletions failed upstairs");
    }
    let last_delete_acked = delete_start.elapsed();
    let deadline = Instant::now() + Duration::from_secs(600);
    while seen.count(&seen.upper_gone) < n && Instant::now() < deadline {
        peak_rss = peak_rss.max(memory_mib(pid).0);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let all_gone = delete_start.elapsed();
    let upper_gone = seen.count(&seen.upper_gone);
    let after_delete = parse_metrics(&http_get(&metrics_addr, "/metrics").await?);
    let (_, hwm) = memory_mib(pid);
    // The benchmark ends quietly: everything that talks to the clusters (the node, our
    // watches, the simulated lower nodes) stops before the clusters do, so no request of theirs
    // meets a server that is gone (kube-client logs each such failure as an ERROR).
    w1.abort();
    w2.abort();
    let _ = child.kill().await;
    for cluster in &mut env.clusters {
        cluster.stop_nodes();
    }

    let snapshot = |t: &Times| t.lock().map(|m| m.clone()).unwrap_or_default();
    let (bound, lc, lr, ur) = (
        snapshot(&seen.upper_bound),
        snapshot(&seen.lower_created),
        snapshot(&seen.lower_running),
        snapshot(&upper_running),
    );
    let mut down: Vec<Duration> = bound
        .iter()
        .filter_map(|(k, t)| lc.get(k).map(|c| c.saturating_duration_since(*t)))
        .collect();
    let mut up: Vec<Duration> = lr
        .iter()
        .filter_map(|(k, t)| ur.get(k).map(|u| u.saturating_duration_since(*t)))
        .collect();

    println!(
        "offload benchmark on {}: {n} pods created at once ({} concurrent creates) upstairs, placed by the upper scheduler on one virtual node",
        if tensile_testenv::real::bin_dir().is_some() {
            "real control planes (TENSILE_K8S_BIN)"
        } else {
            "simulated clusters"
        },
        args.concurrency
    );
    println!(
        "  (its own process, flags: {}); {lower_nodes} simulated lower nodes",
        if tuned.is_empty() {
            "the README's, defaults".to_owned()
        } else {
            format!("TUNED {}", tuned.join(" "))
        }
    );
    println!(
        "all {} upper pods Running after {total:.2?} (from the first create)",
        ur.len()
    );
    println!(
        "seen from outside: upper pod bound -> lower pod created  p50 {:.1?}  p99 {:.1?}",
        pct(&mut down, 0.5),
        pct(&mut down, 0.99)
    );
    println!(
        "seen from outside: lower pod Running -> upper pod Running  p50 {:.1?}  p99 {:.1?}",
        pct(&mut up, 0.5),
        pct(&mut up, 0.99)
    );
    println!(
        "delete: {upper_gone} upper pods gone {all_gone:.2?} after the first delete, {:.2?} after the last one was acknowledged",
        all_gone.saturating_sub(last_delete_acked)
    );
    let stage_s = |s: &str, q: f64| {
        histogram_quantile(&after, "tensile_pod_sync_seconds", &[("stage", s)], q)
    };
    let stage = |s: &str, q: f64| {
        stage_s(s, q).map_or_else(|| "-".to_owned(), |v| format!("{:.1}ms", v * 1000.0))
    };
    // How many times each stage ran in the burst, per pod (a reconcile per change of a pod).
    let stage_count = |s: &str| {
        let count = |m: &Samples| {
            m.iter()
                .filter(|((name, l), _)| {
                    name == "tensile_pod_sync_seconds_count"
                        && l.get("stage").map(String::as_str) == Some(s)
                })
                .map(|(_, v)| *v)
                .sum::<f64>()
        };
        #[allow(clippy::cast_precision_loss)]
        let per_pod = (count(&after) - count(&before)) / n as f64;
        per_pod
    };
    for (s, what) in [
        (
            "queue_wait",
            "a changed pod waiting for a worker (the burst's queue)",
        ),
        ("reconcile", "one reconcile, API calls included"),
        (
            "upper_tokens",
            "a pod's upper tokens checked; when due, TokenRequest upstairs and Secret downstairs",
        ),
        (
            "lower_pod_create",
            "the lower API server answering the pod create",
        ),
        (
            "upper_status",
            "the upper API server answering a status patch",
        ),
    ] {
        println!(
            "inside the node: {s:16} p50 {:>8}  p99 {:>8}  {:5.2} per pod  ({what})",
            stage(s, 0.5),
            stage(s, 0.99),
            stage_count(s),
        );
    }
    // The API servers' own latency for the writes our stages wait for (their
    // `apiserver_request_duration_seconds`, the difference of two scrapes around the burst).
    let lower_create = [("verb", "POST"), ("resource", "pods"), ("subresource", "")];
    let upper_status = [
        ("verb", "PATCH"),
        ("resource", "pods"),
        ("subresource", "status"),
    ];
    let lower_secret = [
        ("verb", "POST"),
        ("resource", "secrets"),
        ("subresource", ""),
    ];
    let upper_token = [
        ("verb", "POST"),
        ("resource", "serviceaccounts"),
        ("subresource", "token"),
    ];
    let server = |upper_side: bool, labels: &[(&str, &str)], q: f64| {
        let (before, after) = if upper_side {
            (&upper_server_before, &upper_server_after)
        } else {
            (&lower_server_before, &lower_server_after)
        };
        server_quantile(before.as_ref(), after.as_ref(), labels, q)
    };
    let fmt_ms =
        |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{:.1}ms", v * 1000.0));
    let real = upper_server_after.is_some() && lower_server_after.is_some();
    if real {
        for (what, upper_side, labels) in [
            ("lower API server, pod creates", false, &lower_create[..]),
            ("lower API server, secret creates", false, &lower_secret[..]),
            ("upper API server, token requests", true, &upper_token[..]),
            (
                "upper API server, pod status patches",
                true,
                &upper_status[..],
            ),
        ] {
            println!(
                "the API servers' own latency: {what:38} p50 {:>8}  p99 {:>8}",
                fmt_ms(server(upper_side, labels, 0.5)),
                fmt_ms(server(upper_side, labels, 0.99)),
            );
        }
    } else {
        println!(
            "the API servers' own latency: not available (the simulator serves no API server metrics; run on real control planes with TENSILE_K8S_BIN)"
        );
    }
    let (down_p99, up_p99) = (pct(&mut down, 0.99), pct(&mut up, 0.99));
    let (create_p99, status_p99) = (
        server(false, &lower_create, 0.99),
        server(true, &upper_status, 0.99),
    );
    let (down_ratio, up_ratio) = (ratio(down_p99, create_p99), ratio(up_p99, status_p99));
    // With upper identity a creation makes three writes in series (`PodTokens::write` says why
    // they cannot overlap): the yardstick the stage can be held to is their p99s summed.
    let serial_p99 = match (
        server(true, &upper_token, 0.99),
        server(false, &lower_secret, 0.99),
    ) {
        (Some(token), Some(secret)) => create_p99.map(|c| c + token + secret),
        _ => create_p99,
    };
    let serial_ratio = ratio(down_p99, serial_p99);
    for (what, stage_p99, server_what, server_p99, r) in [
        (
            "upper pod bound -> lower pod created",
            down_p99,
            "the lower API server's pod create",
            create_p99,
            down_ratio,
        ),
        (
            "lower pod Running -> upper pod Running",
            up_p99,
            "the upper API server's status patch",
            status_p99,
            up_ratio,
        ),
    ] {
        match r {
            Some(r) => println!(
                "distance to the API servers: {what}: p99 {stage_p99:.1?} = {r:.2} x {server_what} p99 ({})",
                fmt_ms(server_p99)
            ),
            None => println!(
                "distance to the API servers: {what}: p99 {stage_p99:.1?}; {server_what} p99 not available"
            ),
        }
    }
    if let (Some(r), Some(serial)) = (serial_ratio, serial_p99)
        && serial_p99 != create_p99
    {
        println!(
            "distance to the API servers: upper pod bound -> lower pod created: p99 {down_p99:.1?} = {r:.2} x the sum of the p99s of the writes it makes in series (token request, secret create, pod create: {})",
            fmt_ms(Some(serial))
        );
    }
    let calls = |m: &Samples| -> BTreeMap<(String, String, String), f64> {
        m.iter()
            .filter(|((name, _), _)| name == "tensile_api_calls_total")
            .map(|((_, l), v)| {
                let get = |k: &str| l.get(k).cloned().unwrap_or_default();
                ((get("cluster"), get("verb"), get("resource")), *v)
            })
            .collect()
    };
    let (c0, c1) = (calls(&before), calls(&after));
    // The metrics API cannot be watched: each scrape of the node's stats by metrics-server
    // upstairs reads it once. Those reads are counted apart from LISTs of watched resources.
    let is_metrics = |resource: &str| resource.ends_with(".metrics.k8s.io");
    let lists_with_delete: f64 = calls(&after_delete)
        .iter()
        .filter(|(k, _)| k.1 == "list" && !is_metrics(&k.2))
        .map(|(k, v)| v - c0.get(k).copied().unwrap_or(0.0))
        .sum();
    println!("API calls of the node during the burst (cluster, verb, resource):");
    let mut writes: BTreeMap<String, f64> = BTreeMap::new();
    // Events (ours and the mirrored lower ones) are reported apart: they are not the pod's.
    let mut event_writes: BTreeMap<String, f64> = BTreeMap::new();
    let (mut lists, mut metrics_reads) = (0.0, 0.0);
    for (k, v) in &c1 {
        let d = v - c0.get(k).copied().unwrap_or(0.0);
        if d > 0.0 {
            println!("  {:6} {:8} {:28} {d}", k.0, k.1, k.2);
        }
        if matches!(
            k.1.as_str(),
            "create" | "update" | "patch" | "delete" | "deletecollection"
        ) {
            let sum = if k.2 == "events" {
                &mut event_writes
            } else {
                &mut writes
            };
            *sum.entry(k.0.clone()).or_default() += d;
        }
        if k.1 == "list" {
            if is_metrics(&k.2) {
                metrics_reads += d;
            } else {
                lists += d;
            }
        }
    }
    #[allow(clippy::cast_precision_loss)]
    let per_pod =
        |sums: &BTreeMap<String, f64>, c: &str| sums.get(c).copied().unwrap_or(0.0) / n as f64;
    println!(
        "writes per pod: upper {:.2}, lower {:.2} (events apart: upper {:.2}); LISTs of watched resources after start-up: {lists} in the burst, {lists_with_delete} with the deletion (and {metrics_reads} reads of the metrics API, one per stats scrape)",
        per_pod(&writes, "upper"),
        per_pod(&writes, "lower"),
        per_pod(&event_writes, "upper"),
    );
    #[allow(clippy::cast_precision_loss)]
    let per_pod_ms = node_cpu * 1000.0 / n as f64;
    // On real control planes the API servers are processes of their own, not counted here.
    let harness = if tensile_testenv::real::bin_dir().is_some() {
        "this benchmark"
    } else {
        "the two simulated clusters and this benchmark"
    };
    println!(
        "CPU during the burst: virtual node {node_cpu:.1} s ({per_pod_ms:.2} ms per pod), {harness} {all_cpu:.1} s, in {:.1} s on {} cores",
        total.as_secs_f64(),
        std::thread::available_parallelism().map_or(0, std::num::NonZero::get)
    );
    println!(
        "virtual node memory (RSS): {idle_rss:.1} MiB before, {peak_rss:.1} MiB peak during the burst and deletion (VmHWM {hwm:.1} MiB), {settled_rss:.1} MiB 5 s after the burst; at most {peak_sockets} sockets open during the burst"
    );
    let round = |v: f64, places: i32| {
        let f = 10f64.powi(places);
        if v.is_finite() {
            json!((v * f).round() / f)
        } else {
            serde_json::Value::Null
        }
    };
    let duration_ms = |d: Duration| ms_json(Some(d.as_secs_f64()));
    if let Some(path) = &args.plot {
        plot::write(path, &stages_plot(n, &down, &up, &after)?)?;
        println!("plot of the stages' latency written to {}", path.display());
    }
    // One JSON object, last, for scripts.
    println!(
        "{}",
        json!({
            "pods": n,
            "backend": if tensile_testenv::real::bin_dir().is_some() { "real" } else { "sim" },
            "all_running_s": round(total.as_secs_f64(), 2),
            "bound_to_lower_created_p50_ms": duration_ms(pct(&mut down, 0.5)),
            "bound_to_lower_created_p99_ms": duration_ms(down_p99),
            "lower_running_to_upper_running_p50_ms": duration_ms(pct(&mut up, 0.5)),
            "lower_running_to_upper_running_p99_ms": duration_ms(up_p99),
            "lower_apiserver_pod_create_p99_ms": ms_json(create_p99),
            "upper_apiserver_status_patch_p99_ms": ms_json(status_p99),
            "lower_created_over_apiserver_p99": down_ratio.map_or(serde_json::Value::Null, |r| round(r, 2)),
            "upper_running_over_apiserver_p99": up_ratio.map_or(serde_json::Value::Null, |r| round(r, 2)),
            "serial_writes_p99_ms": ms_json(serial_p99),
            "lower_created_over_serial_writes_p99": serial_ratio.map_or(serde_json::Value::Null, |r| round(r, 2)),
            "queue_wait_p50_ms": ms_json(stage_s("queue_wait", 0.5)),
            "queue_wait_p99_ms": ms_json(stage_s("queue_wait", 0.99)),
            "reconcile_p50_ms": ms_json(stage_s("reconcile", 0.5)),
            "reconcile_p99_ms": ms_json(stage_s("reconcile", 0.99)),
            "reconciles_per_pod": round(stage_count("reconcile"), 2),
            "delete_all_gone_s": round(all_gone.as_secs_f64(), 2),
            "node_cpu_s": round(node_cpu, 2),
            "peak_rss_mib": round(peak_rss, 1),
            "settled_rss_mib": round(settled_rss, 1),
            "peak_sockets": peak_sockets,
        })
    );
    Ok(())
}
