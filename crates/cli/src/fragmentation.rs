//! `tensile bench fragmentation`: three lower clusters whose free room is fragmented (plenty in
//! sum, little per node), and a burst of Deployments with pods of mixed sizes. The same burst
//! runs four times on a fresh sandbox each: no placement help, descheduler only, extender
//! only, both. Reports the share of pods Running after the window, the time to the last one,
//! and how many pods were bound to a virtual node whose lower cluster could not place them
//! (over-commit: they wait on a cluster where they cannot fit).

#![allow(clippy::print_stdout)] // the report is what the command prints

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures::StreamExt as _;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use kube::runtime::{WatchStreamExt as _, watcher};
use serde_json::json;
use tensile_placement::descheduler::DeschedulerConfig;
use tensile_sim::kubelet::SimNode;

use crate::sandbox::{Sandbox, SandboxSpec};

/// Flags of `tensile bench fragmentation`.
#[derive(Debug, clap::Args)]
pub struct FragmentationArgs {
    /// Seconds after the burst at which Running pods are counted.
    #[arg(long, default_value_t = 60)]
    window: u64,
    /// Scale of the burst: pods of 500m, 1 and 2500m CPU, in the ratio 6:3:1.
    #[arg(long, default_value_t = 500)]
    pods: usize,
    /// Only these modes (none, descheduler, extender, both).
    #[arg(long, value_delimiter = ',', default_values_t = ["none".to_owned(), "descheduler".to_owned(), "extender".to_owned(), "both".to_owned()])]
    modes: Vec<String>,
}

/// One lower cluster: `count` nodes of `cpu` each (their free room; memory is plentiful).
fn cluster(prefix: &str, count: usize, cpu: &str) -> Vec<SimNode> {
    (1..=count)
        .map(|i| SimNode::new(format!("{prefix}-{i}"), cpu, "64Gi"))
        .collect()
}

/// The three clusters: 180, 120 and 180 CPU in sum, in nodes of 2, 3 and 6 CPU. Upstairs the
/// first looks at least as roomy as any other (and wins ties by name), yet a 2.5-CPU pod fits
/// none of its nodes: the upper scheduler, which sees sums, sends big pods there.
fn clusters(scale: usize) -> Vec<Vec<SimNode>> {
    let n = |base: usize| (base * scale).div_ceil(500).max(1);
    vec![
        cluster("a", n(90), "2"),
        cluster("b", n(40), "3"),
        cluster("c", n(30), "6"),
    ]
}

/// The Deployments: (name, CPU request, replicas).
fn workloads(pods: usize) -> Vec<(&'static str, &'static str, usize)> {
    let small = pods * 6 / 10;
    let medium = pods * 3 / 10;
    vec![
        ("small", "500m", small),
        ("medium", "1", medium),
        ("large", "2500m", pods - small - medium),
    ]
}

#[derive(Debug, Default)]
struct Observed {
    running: HashMap<String, Instant>,
    /// Pods seen bound to a virtual node while Unschedulable there.
    stranded: HashSet<String>,
}

struct Outcome {
    mode: String,
    running_in_window: usize,
    last_running: Option<Duration>,
    stranded: usize,
    total: usize,
}

fn watch_pods(client: kube::Client, seen: Arc<Mutex<Observed>>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut stream = watcher(
            Api::<Pod>::namespaced(client, "default"),
            watcher::Config::default(),
        )
        .applied_objects()
        .boxed();
        while let Some(Ok(pod)) = stream.next().await {
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

async fn run_mode(mode: &str, args: &FragmentationArgs) -> anyhow::Result<Outcome> {
    let (descheduler, extender) = match mode {
        "none" => (false, false),
        "descheduler" => (true, false),
        "extender" => (false, true),
        "both" => (true, true),
        other => anyhow::bail!("unknown mode {other:?}: none, descheduler, extender or both"),
    };
    let sandbox = Sandbox::start(
        SandboxSpec {
            address: "127.0.0.1".parse()?,
            port: 0,
            lowers: clusters(args.pods),
            webhook: true,
            descheduler: descheduler.then(DeschedulerConfig::default),
            extender,
        },
        &|_| {},
    )
    .await?;
    sandbox.wait_ready(Duration::from_secs(60)).await?;
    let client = sandbox.upper.client().await?;
    let seen = Arc::new(Mutex::new(Observed::default()));
    let watch = watch_pods(client.clone(), seen.clone());
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "default");
    let total: usize = workloads(args.pods).iter().map(|w| w.2).sum();
    let started = Instant::now();
    for (name, cpu, replicas) in workloads(args.pods) {
        let d: Deployment = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                "template": {"metadata": {"labels": {"app": name, "virtual-pod": "true"}},
                    "spec": {"containers": [{"name": "c", "image": "nginx",
                        "resources": {"requests": {"cpu": cpu, "memory": "128Mi"}}}]}}}
        }))?;
        deployments
            .create(&PostParams::default(), &d)
            .await
            .with_context(|| format!("creating Deployment {name}"))?;
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
    let outcome = {
        let seen = seen
            .lock()
            .map_err(|_| anyhow::anyhow!("observer poisoned"))?;
        let last_running = (seen.running.len() >= total)
            .then(|| {
                seen.running
                    .values()
                    .max()
                    .map(|l| l.duration_since(started))
            })
            .flatten();
        Outcome {
            mode: mode.to_owned(),
            running_in_window: seen
                .running
                .values()
                .filter(|t| t.duration_since(started) <= window)
                .count(),
            last_running,
            stranded: seen.stranded.len(),
            total,
        }
    };
    sandbox.stop().await;
    Ok(outcome)
}

pub async fn run(args: FragmentationArgs) -> anyhow::Result<()> {
    let nodes: Vec<usize> = clusters(args.pods).iter().map(Vec::len).collect();
    println!(
        "fragmentation: {} pods (500m/1/2500m CPU, 6:3:1) as 3 Deployments; lower clusters of {} x 2 CPU, {} x 3 CPU, {} x 6 CPU; window {} s",
        workloads(args.pods).iter().map(|w| w.2).sum::<usize>(),
        nodes[0],
        nodes[1],
        nodes[2],
        args.window
    );
    println!();
    println!(
        "| placement help | Running after {} s | time to last Running | pods stranded on a cluster that cannot fit them |",
        args.window
    );
    println!("|---|---|---|---|");
    for mode in &args.modes {
        let o = run_mode(mode, &args).await?;
        let last = o.last_running.map_or_else(
            || format!("not all within {} s", args.window * 2),
            |d| format!("{:.1} s", d.as_secs_f64()),
        );
        println!(
            "| {} | {}/{} ({:.0} %) | {} | {} |",
            o.mode,
            o.running_in_window,
            o.total,
            100.0 * o.running_in_window as f64 / o.total.max(1) as f64,
            last,
            o.stranded
        );
    }
    Ok(())
}
