//! Benchmark of offloading (a program, not a test): N pods bound at once to a virtual node
//! between two simulated clusters; reports per stage the latency of our work (upper pod
//! created -> lower pod created; lower pod Running -> upper pod Running), the API calls per
//! cluster and verb (writes per pod, LISTs after start-up) and memory.
//!
//! `cargo run --release -p tensile-node --example bench_offload -- [pods]` (default 1000).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    clippy::print_stderr
)] // a program

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use prometheus_client::registry::Registry;
use serde_json::json;
use tensile_core::node::NodeIdentity;
use tensile_core::translate::TranslateConfig;
use tensile_node::VirtualNode;
use tensile_node::clients::{ApiCalls, KubeconfigSource, Verb, build_client};
use tensile_node::node::NodeLoop;
use tensile_node::pods::PodSync;
use tensile_sim::env::{ClusterSpec, TestEnv};
use tensile_sim::kubelet::SimNode;
use tokio_util::sync::CancellationToken;

fn rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map_or(0.0, |kib| kib / 1024.0)
}

fn pct(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    if v.is_empty() {
        return Duration::ZERO;
    }
    v[(((v.len() - 1) as f64) * p).round() as usize]
}

type Times = Arc<Mutex<HashMap<String, Instant>>>;

#[tokio::main]
async fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1000);
    let mut lower_spec = ClusterSpec::new("lower", 0);
    let nodes = n.div_ceil(100).max(2);
    lower_spec.kubelet = Some(tensile_sim::kubelet::SimKubeletConfig {
        nodes: (1..=nodes)
            .map(|i| SimNode::new(format!("lower-node-{i}"), "64", "256Gi"))
            .collect(),
        kubelet_api: false,
        ..Default::default()
    });
    let env = TestEnv::start_with(vec![ClusterSpec::new("upper", 0), lower_spec])
        .await
        .unwrap();
    let mut registry = Registry::default();
    let calls = ApiCalls::new(&mut registry);
    let upper_text = std::fs::read_to_string(&env.clusters[0].kubeconfig).unwrap();
    let lower_text = std::fs::read_to_string(&env.clusters[1].kubeconfig).unwrap();
    let upper = build_client(
        KubeconfigSource::Text(upper_text),
        500.0,
        1000,
        "upper",
        &calls,
    )
    .await
    .unwrap();
    let lower = build_client(
        KubeconfigSource::Text(lower_text),
        500.0,
        1000,
        "lower",
        &calls,
    )
    .await
    .unwrap();
    let version = lower.apiserver_version().await.unwrap().git_version;
    let rss_before = rss_mib();
    let vn = VirtualNode {
        node: NodeLoop {
            identity: NodeIdentity {
                name: "vk".into(),
                extra_label: None,
                taint: None,
                internal_ip: "127.0.0.1".into(),
                external_ip: None,
                kubelet_port: 10250,
                lower_version: version,
            },
            owner: "vk".into(),
            not_ready_after: None,
            lease_renew: Duration::from_secs(10),
            heartbeat: Duration::from_secs(60),
        },
        pods: PodSync {
            upper: upper.clone(),
            lower: lower.clone(),
            node: "vk".into(),
            lower_name: "lower".into(),
            translate: TranslateConfig::new("vk"),
            workers: 50,
        },
        kubelet: None,
    };
    let stop = CancellationToken::new();
    let handle = vn.start(stop.clone()).await.unwrap();
    // Let start-up (initial lists) finish before counting.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let lists_at_start = (
        calls.total("upper", Verb::List),
        calls.total("lower", Verb::List),
    );
    let writes = |c: &ApiCalls, cluster: &str| {
        [Verb::Create, Verb::Update, Verb::Patch, Verb::Delete]
            .iter()
            .map(|v| c.total(cluster, *v))
            .sum::<u64>()
    };
    let writes_at_start = (writes(&calls, "upper"), writes(&calls, "lower"));

    // Observers with their own clients: creation acks, lower created, lower Running, upper Running.
    let (acked, lower_created, lower_running, upper_running): (Times, Times, Times, Times) =
        Default::default();
    let watch = |client: kube::Client, created: Option<Times>, running: Times| {
        tokio::spawn(async move {
            let api: Api<Pod> = Api::namespaced(client, "default");
            let mut s = watcher(api, watcher::Config::default())
                .default_backoff()
                .applied_objects()
                .boxed();
            while let Some(Ok(p)) = s.next().await {
                let now = Instant::now();
                let name = p.metadata.name.clone().unwrap_or_default();
                if let Some(c) = &created {
                    c.lock().unwrap().entry(name.clone()).or_insert(now);
                }
                if p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running") {
                    running.lock().unwrap().entry(name).or_insert(now);
                }
            }
        })
    };
    let w1 = watch(
        env.clusters[1].client.clone(),
        Some(lower_created.clone()),
        lower_running.clone(),
    );
    let w2 = watch(env.clusters[0].client.clone(), None, upper_running.clone());
    let creator: Api<Pod> = Api::namespaced(env.clusters[0].client.clone(), "default");
    let start = Instant::now();
    futures::stream::iter(0..n)
        .for_each_concurrent(32, |i| {
            let api = creator.clone();
            let acked = acked.clone();
            async move {
                let name = format!("p-{i}");
                let pod: Pod = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
                    "spec": {"nodeName": "vk", "containers": [{"name": "c", "image": "nginx:1.27", "resources": {"requests": {"cpu": "10m"}}}]}})).unwrap();
                api.create(&PostParams::default(), &pod).await.unwrap();
                acked.lock().unwrap().insert(name, Instant::now());
            }
        })
        .await;
    let deadline = Instant::now() + Duration::from_secs(600);
    while upper_running.lock().unwrap().len() < n && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let total = start.elapsed();
    let (a, lc, lr, ur) = (
        acked.lock().unwrap().clone(),
        lower_created.lock().unwrap().clone(),
        lower_running.lock().unwrap().clone(),
        upper_running.lock().unwrap().clone(),
    );
    let mut down: Vec<Duration> = a
        .iter()
        .filter_map(|(k, t)| lc.get(k).map(|c| c.saturating_duration_since(*t)))
        .collect();
    let mut up: Vec<Duration> = lr
        .iter()
        .filter_map(|(k, t)| ur.get(k).map(|u| u.saturating_duration_since(*t)))
        .collect();
    println!(
        "offload benchmark: {n} pods bound at once to one virtual node; {nodes} lower nodes; release build, everything in one process on 2 cores"
    );
    println!("all {} upper pods Running after {total:.2?}", ur.len());
    println!(
        "upper pod created -> lower pod created: p50 {:.1?}, p99 {:.1?} (includes queueing behind the burst)",
        pct(&mut down, 0.5),
        pct(&mut down, 0.99)
    );
    println!(
        "lower pod Running -> upper pod Running:  p50 {:.1?}, p99 {:.1?}",
        pct(&mut up, 0.5),
        pct(&mut up, 0.99)
    );
    let lists = (
        calls.total("upper", Verb::List) - lists_at_start.0,
        calls.total("lower", Verb::List) - lists_at_start.1,
    );
    println!(
        "LIST requests after start-up: upper {}, lower {}",
        lists.0, lists.1
    );
    let w = (
        writes(&calls, "upper") - writes_at_start.0,
        writes(&calls, "lower") - writes_at_start.1,
    );
    println!(
        "writes per pod: upper {:.2}, lower {:.2}",
        w.0 as f64 / n as f64,
        w.1 as f64 / n as f64
    );
    for ((cluster, verb, resource), count) in calls.snapshot().into_iter().map(|(l, c)| {
        (
            (
                l.cluster.to_string(),
                format!("{:?}", l.verb),
                l.resource.clone(),
            ),
            c,
        )
    }) {
        println!("  {cluster:5} {verb:8} {resource:24} {count}");
    }
    println!(
        "process RSS grew by {:.1} MiB during the burst (both simulated clusters and the virtual node share the process)",
        rss_mib() - rss_before
    );
    stop.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(5), handle).await;
    w1.abort();
    w2.abort();
}
