//! Benchmark of the embedded API server (a program, not a test): creates nodes and pods with
//! concurrent kube-rs clients while watchers follow the pods, and reports create throughput,
//! watch fan-out latency (create acknowledged -> event received) and resident memory.
//!
//! `cargo run --release -p tensile-sim --example bench_apiserver -- [pods] [nodes] [watchers]`
//! (defaults 10000, 500, 20). Results go to docs/benchmarks.md.
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
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, PostParams};
use serde_json::json;
use tensile_sim::apiserver::ApiServerConfig;
use tensile_sim::apiserver::controllers::Controllers;

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

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

#[tokio::main]
async fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let pods_n = args.first().copied().unwrap_or(10_000);
    let nodes_n = args.get(1).copied().unwrap_or(500);
    let watchers_n = args.get(2).copied().unwrap_or(20);
    let concurrency = 32;

    let config = ApiServerConfig {
        controllers: Controllers::none(),
        ..ApiServerConfig::default()
    };
    let server = tensile_testenv::start_apiserver(config).await.unwrap().0;
    let client = server.client().await.unwrap();
    println!(
        "tensile-sim API server benchmark: {pods_n} pods, {nodes_n} nodes, {watchers_n} watchers, {concurrency} concurrent writers"
    );
    println!("rss at start: {:.1} MiB", rss_mib());

    let nodes: Api<Node> = Api::all(client.clone());
    let start = Instant::now();
    futures::stream::iter(0..nodes_n)
        .for_each_concurrent(concurrency, |i| {
            let nodes = nodes.clone();
            async move {
                let node: Node = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Node",
                    "metadata": {"name": format!("node-{i}"), "labels": {"kubernetes.io/hostname": format!("node-{i}")}},
                    "status": {"capacity": {"cpu": "32", "memory": "128Gi", "pods": "110"}, "allocatable": {"cpu": "32", "memory": "128Gi", "pods": "110"}}}))
                .unwrap();
                nodes.create(&PostParams::default(), &node).await.unwrap();
            }
        })
        .await;
    println!("nodes: {nodes_n} created in {:.2?}", start.elapsed());

    // name -> instant the create was acknowledged
    let acked: Arc<Mutex<HashMap<String, Instant>>> =
        Arc::new(Mutex::new(HashMap::with_capacity(pods_n)));
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let rv = server.state().store.current_rv().to_string();
    // Watchers read the raw stream and only find the pod name in each line, so what is
    // measured is the server's fan-out, not client-side decoding (which would compete for the
    // same two cores as the server in this one process).
    let mut watchers = Vec::new();
    for _ in 0..watchers_n {
        let client = client.clone();
        let acked = acked.clone();
        let rv = rv.clone();
        watchers.push(tokio::spawn(async move {
            use futures::AsyncBufReadExt;
            let req = http::Request::get(format!(
                "/api/v1/pods?watch=1&resourceVersion={rv}&timeoutSeconds=290"
            ))
            .body(Vec::new())
            .unwrap();
            let stream = client.request_stream(req).await.unwrap();
            futures::pin_mut!(stream);
            let mut lines = stream.lines();
            let mut latencies = Vec::with_capacity(pods_n);
            let mut pending: Vec<(String, Instant)> = Vec::new();
            while latencies.len() + pending.len() < pods_n {
                let Some(line) = lines.next().await else {
                    break;
                };
                let line = line.unwrap();
                let got = Instant::now();
                if !line.starts_with("{\"type\":\"ADDED\"") {
                    continue;
                }
                let Some(at) = line.find("\"name\":\"pod-") else {
                    continue;
                };
                let rest = &line[at + 8..];
                let name = rest[..rest.find('"').unwrap()].to_owned();
                pending.push((name, got));
                let map = acked.lock().unwrap();
                pending.retain(|(name, got)| match map.get(name) {
                    Some(at) => {
                        latencies.push(got.saturating_duration_since(*at));
                        false
                    }
                    None => true,
                });
            }
            // Events that arrived before their create was acknowledged: zero latency.
            latencies.extend(pending.iter().map(|_| Duration::ZERO));
            latencies
        }));
    }

    let start = Instant::now();
    futures::stream::iter(0..pods_n)
        .for_each_concurrent(concurrency, |i| {
            let pods = pods.clone();
            let acked = acked.clone();
            async move {
                let name = format!("pod-{i}");
                let pod: Pod = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": name, "labels": {"app": format!("app-{}", i % 50)}},
                    "spec": {"nodeName": format!("node-{}", i % nodes_n.max(1)),
                        "containers": [{"name": "c", "image": "nginx:1.27", "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}}}]}}))
                .unwrap();
                pods.create(&PostParams::default(), &pod).await.unwrap();
                acked.lock().unwrap().insert(name, Instant::now());
            }
        })
        .await;
    let elapsed = start.elapsed();
    println!(
        "pods: {pods_n} created in {elapsed:.2?} = {:.0} creates/s",
        pods_n as f64 / elapsed.as_secs_f64()
    );

    let mut all = Vec::new();
    for w in watchers {
        all.extend(
            tokio::time::timeout(Duration::from_secs(300), w)
                .await
                .unwrap()
                .unwrap(),
        );
    }
    all.sort();
    println!(
        "watch fan-out over {} events: p50 {:.2?}, p99 {:.2?}, max {:.2?}",
        all.len(),
        percentile(&all, 0.5),
        percentile(&all, 0.99),
        all.last().copied().unwrap_or_default()
    );
    println!(
        "rss at end (server and clients in one process): {:.1} MiB",
        rss_mib()
    );
}
