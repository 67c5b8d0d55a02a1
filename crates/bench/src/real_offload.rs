//! `tensile bench real-offload`: what the virtual node adds on real containers. The same pods
//! (busybox, `sleep`) are created directly in a lower cluster whose node is a real kubelet, then
//! upstairs, bound to the virtual node in front of it; each side's time from create to Running
//! (the API's create call to the first watch event with phase `Running`, on that side), p50
//! and p99, and the difference. Real control planes and real nodes (`TENSILE_K8S_BIN`, root).
//!
//! Through the node the path is also timed by leg, as the lower cluster's watch shows it (upper
//! create -> lower pod, lower pod -> lower Running, lower Running -> upper Running), beside the
//! node's own stage histograms and the CPU the machine spent on each side: a burst saturates a
//! small machine, and then every CPU-second the upper cluster and the node spend is latency the
//! real kubelet sees. `--one-at-a-time` times the path alone.

#![allow(clippy::print_stdout)] // the report is what the command prints

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::runtime::watcher;
use serde_json::json;
use tensile_testenv::{ClusterSpec, TestEnv};

#[derive(Debug, clap::Args)]
pub struct RealOffloadArgs {
    /// Pods on each side (a real node runs at most 110).
    #[arg(long, default_value_t = 100)]
    pods: usize,
    /// Concurrent creations.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// Create each pod only once the one before it runs (no concurrency): what the path
    /// itself takes, on a machine the burst does not saturate.
    #[arg(long)]
    one_at_a_time: bool,
}

type Times = Arc<Mutex<HashMap<String, Instant>>>;

/// How a side's pods are created.
#[derive(Clone, Copy, Debug)]
enum Pace {
    /// This many creations at once, none waiting for a pod to run.
    Concurrent(usize),
    /// Each pod once the one before it runs.
    OneAtATime,
}

/// Watches `api` and notes, per pod name, when it was first seen (into `seen`, if any) and when
/// it first showed phase `Running` (into `running`).
fn note_times(api: Api<Pod>, seen: Option<Times>, running: Times) -> tokio::task::JoinHandle<()> {
    crate::support::spawn_watch(api, move |event: watcher::Event<Pod>| {
        let now = Instant::now();
        let pods = match event {
            watcher::Event::Apply(p) | watcher::Event::InitApply(p) => vec![p],
            _ => Vec::new(),
        };
        for p in pods {
            let Some(name) = p.metadata.name.clone() else {
                continue;
            };
            if let Some(seen) = &seen
                && let Ok(mut t) = seen.lock()
            {
                t.entry(name.clone()).or_insert(now);
            }
            if p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                && let Ok(mut t) = running.lock()
            {
                t.entry(name).or_insert(now);
            }
        }
    })
}

fn snapshot(t: &Times) -> anyhow::Result<HashMap<String, Instant>> {
    Ok(t.lock().map_err(|_| anyhow::anyhow!("poisoned"))?.clone())
}

/// What one burst measured, per pod: create to Running on the side it was created on, and
/// through the virtual node, the three legs of that path as the lower cluster shows them.
#[derive(Default)]
struct Measured {
    total: Vec<Duration>,
    /// Upper create to the lower pod's first watch event (the virtual node's work).
    to_lower: Vec<Duration>,
    /// The lower pod's first event to its Running (the real kubelet's work).
    lower_running: Vec<Duration>,
    /// Lower Running to upper Running (the status written up).
    status_up: Vec<Duration>,
}

fn pod(name: &str, node: Option<&str>) -> anyhow::Result<Pod> {
    let mut spec = json!({
        "terminationGracePeriodSeconds": 1,
        "containers": [{
            "name": "c",
            "image": "registry.k8s.io/e2e-test-images/busybox:1.37.0-1",
            "command": ["sleep", "3600"],
        }],
    });
    if let Some(node) = node {
        spec["nodeName"] = json!(node);
    }
    serde_json::from_value(
        json!({"metadata": {"name": name, "labels": {"bench": "real-offload"}}, "spec": spec}),
    )
    .context("the benchmark's pod")
}

/// Creates `n` pods in `api` (`concurrency` at a time) and waits for each to run; each one's
/// time from its create call to Running.
async fn burst(
    api: Api<Pod>,
    n: usize,
    pace: Pace,
    node: Option<&str>,
    lower: Option<Api<Pod>>,
) -> anyhow::Result<Measured> {
    // One at a time: one task, which waits for each pod to run before the next.
    let (concurrency, one_at_a_time) = match pace {
        Pace::Concurrent(c) => (c, false),
        Pace::OneAtATime => (1, true),
    };
    let running: Times = Arc::default();
    let watch = note_times(api.clone(), None, running.clone());
    let (lower_seen, lower_running): (Times, Times) = (Arc::default(), Arc::default());
    let lower_watch = lower.map(|l| note_times(l, Some(lower_seen.clone()), lower_running.clone()));
    let created: Times = Arc::default();
    let names: Vec<String> = (0..n).map(|i| format!("bench-{i}")).collect();
    let chunks: Vec<Vec<String>> = names
        .chunks(n.div_ceil(concurrency.max(1)).max(1))
        .map(<[String]>::to_vec)
        .collect();
    let mut tasks = Vec::new();
    for chunk in chunks {
        let (api, created, node) = (api.clone(), created.clone(), node.map(str::to_owned));
        let running = running.clone();
        tasks.push(tokio::spawn(async move {
            for name in chunk {
                let p = pod(&name, node.as_deref())?;
                let at = Instant::now();
                api.create(&PostParams::default(), &p)
                    .await
                    .with_context(|| format!("creating {name}"))?;
                if let Ok(mut c) = created.lock() {
                    c.insert(name.clone(), at);
                }
                let deadline = at + Duration::from_secs(120);
                while one_at_a_time && !running.lock().is_ok_and(|r| r.contains_key(&name)) {
                    if Instant::now() > deadline {
                        bail!("{name} not Running 120 s after its creation");
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
            Ok::<_, anyhow::Error>(())
        }));
    }
    for t in tasks {
        t.await.context("a creating task")??;
    }
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let done = running.lock().map_or(0, |r| r.len());
        if done >= n {
            break;
        }
        if Instant::now() > deadline {
            bail!("{done} of {n} pods Running after 600 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    watch.abort();
    if let Some(w) = lower_watch {
        w.abort();
    }
    let (created, running) = (snapshot(&created)?, snapshot(&running)?);
    let (lower_seen, lower_running) = (snapshot(&lower_seen)?, snapshot(&lower_running)?);
    let leg = |from: &HashMap<String, Instant>, to: &HashMap<String, Instant>| -> Vec<Duration> {
        names
            .iter()
            .filter_map(|n| Some(to.get(n)?.saturating_duration_since(*from.get(n)?)))
            .collect()
    };
    Ok(Measured {
        total: leg(&created, &running),
        to_lower: leg(&created, &lower_seen),
        lower_running: leg(&lower_seen, &lower_running),
        status_up: leg(&lower_running, &running),
    })
}

async fn delete_all(api: &Api<Pod>) -> anyhow::Result<()> {
    let lp = ListParams::default().labels("bench=real-offload");
    api.delete_collection(&DeleteParams::default(), &lp)
        .await
        .context("deleting the benchmark's pods")?;
    let deadline = Instant::now() + Duration::from_secs(300);
    while !api
        .list(&lp)
        .await
        .context("listing pods")?
        .items
        .is_empty()
    {
        if Instant::now() > deadline {
            bail!("pods still there 300 s after their deletion");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Ok(())
}

/// A percentile in milliseconds (`bench`'s nearest-rank percentile).
fn pct(v: &mut [Duration], p: f64) -> f64 {
    crate::support::pct(v, p).as_secs_f64() * 1000.0
}

pub async fn run(args: RealOffloadArgs) -> anyhow::Result<()> {
    if tensile_testenv::real::bin_dir().is_none() {
        bail!("real nodes need real control planes: set TENSILE_K8S_BIN (scripts/k8s-bin)");
    }
    let env = TestEnv::start_with(vec![
        ClusterSpec::new("upper", 0),
        ClusterSpec::with_real_nodes("lower", 1),
    ])
    .await
    .context("starting the clusters")?;
    let (upper, lower) = (
        env.clusters[0].client.clone(),
        env.clusters[1].client.clone(),
    );
    let address = tensile_testenv::testhost::address()?;
    let port = std::net::TcpListener::bind((address, 0))?
        .local_addr()?
        .port();
    let metrics_addr = format!("127.0.0.1:{}", crate::support::free_port()?);
    // The README's command line; what the benchmark adds only says where to listen.
    let mut node = tokio::process::Command::new(std::env::current_exe()?)
        .args(["virtual-node", "--nodename", "vk", "--disable-taint"])
        .arg("--kubeconfig")
        .arg(&env.clusters[0].kubeconfig)
        .arg("--client-kubeconfig")
        .arg(&env.clusters[1].kubeconfig)
        .arg(format!("--kubelet-address={address}"))
        .args(["--metrics-addr", &metrics_addr])
        .env("KUBELET_PORT", port.to_string())
        .env("VKUBELET_POD_IP", address.to_string())
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .context("starting tensile virtual-node")?;
    let nodes: Api<Node> = Api::all(upper.clone());
    let deadline = Instant::now() + Duration::from_secs(120);
    while nodes.get_opt("vk").await.ok().flatten().is_none() {
        if let Some(status) = node.try_wait()? {
            bail!("the virtual node exited: {status}");
        }
        if Instant::now() > deadline {
            bail!("the virtual node did not register within 120 s");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": "bench-direct"}}))?;
    Api::<Namespace>::all(lower.clone())
        .create(&PostParams::default(), &ns)
        .await
        .context("creating namespace bench-direct downstairs")?;
    let (n, c) = (
        args.pods,
        if args.one_at_a_time {
            Pace::OneAtATime
        } else {
            Pace::Concurrent(args.concurrency)
        },
    );
    let pid = node.id().context("the virtual node exited")?;
    println!("direct: {n} pods in the lower cluster");
    let direct_api: Api<Pod> = Api::namespaced(lower.clone(), "bench-direct");
    let busy = crate::support::machine_busy_seconds();
    let direct = burst(direct_api.clone(), n, c, None, None).await?;
    let direct_busy = crate::support::machine_busy_seconds() - busy;
    delete_all(&direct_api).await?;
    println!("through the virtual node: {n} pods upstairs, bound to vk");
    let upper_api: Api<Pod> = Api::namespaced(upper.clone(), "default");
    let lower_api: Api<Pod> = Api::namespaced(lower.clone(), "default");
    let (busy, node_cpu) = (
        crate::support::machine_busy_seconds(),
        crate::support::cpu_seconds(pid),
    );
    let mut through = burst(upper_api.clone(), n, c, Some("vk"), Some(lower_api)).await?;
    let (through_busy, node_cpu) = (
        crate::support::machine_busy_seconds() - busy,
        crate::support::cpu_seconds(pid) - node_cpu,
    );
    let stages = crate::support::parse_metrics(
        &crate::support::http_get(&metrics_addr, "/metrics")
            .await
            .context("the virtual node's /metrics")?,
    );
    delete_all(&upper_api).await?;
    let mut direct_total = direct.total;
    let (d50, d99) = (pct(&mut direct_total, 0.5), pct(&mut direct_total, 0.99));
    let (t50, t99) = (pct(&mut through.total, 0.5), pct(&mut through.total, 0.99));
    println!("create to Running (ms)   p50      p99");
    println!("directly downstairs    {d50:7.0}  {d99:7.0}");
    println!("through the node       {t50:7.0}  {t99:7.0}");
    println!(
        "added                  {:7.0}  {:7.0}",
        t50 - d50,
        t99 - d99
    );
    println!(
        "machine CPU busy (s)   direct {direct_busy:.1}, through the node {through_busy:.1} (the node itself {node_cpu:.1})"
    );
    println!("through the node, by leg (ms)");
    for (leg, v) in [
        ("upper create -> lower pod", &mut through.to_lower),
        ("lower pod -> lower Running", &mut through.lower_running),
        ("lower Running -> upper Running", &mut through.status_up),
    ] {
        println!("  {leg:32} {:7.0}  {:7.0}", pct(v, 0.5), pct(v, 0.99));
    }
    println!("inside the node (tensile_pod_sync_seconds, ms)");
    for stage in [
        "queue_wait",
        "reconcile",
        "upper_tokens",
        "lower_pod_create",
        "upper_status",
    ] {
        let q = |q| {
            crate::support::histogram_quantile(
                &stages,
                "tensile_pod_sync_seconds",
                &[("stage", stage)],
                q,
            )
            .map_or(f64::NAN, |s| s * 1000.0)
        };
        println!("  {stage:32} {:7.1}  {:7.1}", q(0.5), q(0.99));
    }
    println!(
        "{}",
        json!({
            "pods": n,
            "one_at_a_time": args.one_at_a_time,
            "direct_p50_ms": d50.round(),
            "direct_p99_ms": d99.round(),
            "virtual_p50_ms": t50.round(),
            "virtual_p99_ms": t99.round(),
            "added_p50_ms": (t50 - d50).round(),
            "added_p99_ms": (t99 - d99).round(),
            "direct_cpu_s": (direct_busy * 10.0).round() / 10.0,
            "virtual_cpu_s": (through_busy * 10.0).round() / 10.0,
            "node_cpu_s": (node_cpu * 10.0).round() / 10.0,
        })
    );
    drop(node);
    drop(env);
    Ok(())
}
