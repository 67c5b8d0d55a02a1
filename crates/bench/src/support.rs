//! What the benchmarks (and the sandbox) share: their clusters, pods and watches; the child
//! `tensile` processes they start and what `/proc` says about a process (Linux only: elsewhere
//! the figures are NaN); percentiles and the Prometheus text they read from the node and the
//! API servers.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::runtime::watcher;
use serde_json::json;
use tensile_simkubelet::{SimKubeletConfig, SimNode};
use tensile_testenv::{ClusterSpec, TestEnv};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The virtual node of the burst benchmarks (offload, failover, faults).
pub(crate) const NODE: &str = "vk";

/// An upper cluster without nodes and a lower one with a large simulated node per 100 pods
/// (at least two), for a burst of `pods` through one virtual node.
pub(crate) async fn burst_clusters(pods: usize) -> anyhow::Result<TestEnv> {
    let mut lower_spec = ClusterSpec::new("lower", 0);
    lower_spec.kubelet = Some(SimKubeletConfig {
        nodes: (1..=pods.div_ceil(100).max(2))
            .map(|i| SimNode::new(format!("lower-node-{i}"), "64", "256Gi"))
            .collect(),
        kubelet_api: false,
        ..Default::default()
    });
    TestEnv::start_with(vec![ClusterSpec::new("upper", 0), lower_spec])
        .await
        .context("starting the clusters")
}

/// A pod of a burst, placed by the upper scheduler as a user's pod is: the virtual node is
/// the only node upstairs, and the pod tolerates its taint; with `volumes`, these.
pub(crate) fn burst_pod(
    name: &str,
    volumes: Option<serde_json::Value>,
) -> Result<Pod, serde_json::Error> {
    let mut pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"tolerations": [{"key": tensile_core::keys::TAINT_VIRTUAL_KUBELET,
            "operator": "Exists"}],
            "containers": [{"name": "c", "image": "nginx:1.27",
            "resources": {"requests": {"cpu": "10m"}}}]}});
    if let Some(volumes) = volumes {
        pod["spec"]["volumes"] = volumes;
    }
    serde_json::from_value(pod)
}

/// `f` on what a benchmark's watches record; an error once a watch task panicked holding it.
pub(crate) fn with<S, T>(seen: &Mutex<S>, f: impl FnOnce(&mut S) -> T) -> anyhow::Result<T> {
    let mut s = seen
        .lock()
        .map_err(|_| anyhow::anyhow!("a watch task panicked"))?;
    Ok(f(&mut s))
}

/// A watch of `api` for a benchmark, every event handed to `on_event` until the task is
/// aborted (errors are retried with the node's watch back-off, 250 ms doubling to 4 s, and not
/// shown). Not kube's default back-off: after a 60 s outage it waited up to 38 s before its
/// next try, and the faults benchmark counted lower pods its own watch had not seen yet.
pub(crate) fn spawn_watch<K>(
    api: Api<K>,
    mut on_event: impl FnMut(watcher::Event<K>) + Send + 'static,
) -> tokio::task::JoinHandle<()>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
{
    tokio::spawn(async move {
        let mut events = tensile_runtime::backoff::watch(api, watcher::Config::default()).boxed();
        while let Some(event) = events.next().await {
            if let Ok(event) = event {
                on_event(event);
            }
        }
    })
}

/// One replica: `tensile virtual-node` with the README's flags; with `--leader-elect` when
/// `pod` names the Deployment's pod it stands for (`POD_NAME`: two pods are two places, and
/// the standby waits for the lease duration). Without, a process on this host.
pub(crate) fn replica(
    env: &TestEnv,
    lower: &Path,
    log: &Path,
    kubelet_port: u16,
    metrics_port: u16,
    pod: Option<&str>,
) -> anyhow::Result<tokio::process::Child> {
    let exe = std::env::current_exe().context("finding the tensile binary")?;
    let mut cmd = tokio::process::Command::new(exe);
    cmd.args(["virtual-node", "--nodename", NODE]);
    match pod {
        Some(pod) => cmd.arg("--leader-elect").env("POD_NAME", pod),
        None => cmd.env_remove("POD_NAME"),
    };
    cmd.arg("--kubeconfig")
        .arg(&env.clusters[0].kubeconfig)
        .arg("--client-kubeconfig")
        .arg(lower)
        .args(["--kubelet-address", "127.0.0.1"])
        .arg(format!("--metrics-addr=127.0.0.1:{metrics_port}"))
        .env("KUBELET_PORT", kubelet_port.to_string())
        .env("VKUBELET_POD_IP", "127.0.0.1")
        .env_remove("POD_NAMESPACE")
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?)
        .kill_on_drop(true)
        .spawn()
        .context("starting tensile virtual-node")
}

/// The pid in a leader election holder identity `<node>_<host>_<scope>_<pid>_<process>`.
pub(crate) fn holder_pid(holder: &str) -> Option<u32> {
    holder.rsplit('_').nth(1)?.parse().ok()
}

/// Waits, up to `secs`, until `check` says yes; the replicas' logs are the error's detail.
pub(crate) async fn wait_for(
    what: &str,
    secs: u64,
    logs: &[impl AsRef<Path>],
    mut check: impl FnMut() -> anyhow::Result<bool>,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if check()? {
            return Ok(());
        }
        if Instant::now() > deadline {
            let tails: Vec<String> = logs
                .iter()
                .map(|l| {
                    let l = l.as_ref();
                    let text = std::fs::read_to_string(l).unwrap_or_default();
                    let lines: Vec<&str> = text.lines().collect();
                    format!(
                        "--- {}\n{}",
                        l.display(),
                        lines[lines.len().saturating_sub(15)..].join("\n")
                    )
                })
                .collect();
            bail!(
                "timed out after {secs} s waiting for {what}\n{}",
                tails.join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A free TCP port on loopback for a child to listen on (see [`tensile_testenv::free_port`]).
pub(crate) fn free_port() -> anyhow::Result<u16> {
    Ok(tensile_testenv::free_port()?)
}

/// Starts `binary <args>` (a `tensile` binary), quiet but for warnings, its log in `log`;
/// killed when dropped.
pub(crate) fn spawn(
    binary: &Path,
    args: &[String],
    log: &Path,
) -> anyhow::Result<tokio::process::Child> {
    tokio::process::Command::new(binary)
        .args(args)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {} {}", binary.display(), args.join(" ")))
}

/// Polls `check` every 100 ms until it says yes; after `within`, an error saying what was
/// waited for, with the log of the process waited on.
pub(crate) async fn poll_until<F, Fut>(
    what: &str,
    log: &Path,
    within: Duration,
    mut check: F,
) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    while !check().await {
        if Instant::now() > deadline {
            bail!(
                "{what}: not within {within:?}; its log:\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// Waits until `addr` accepts connections (the server listens once ready), up to `within`.
pub(crate) async fn listening(
    addr: SocketAddr,
    log: &Path,
    within: Duration,
) -> anyhow::Result<()> {
    poll_until(&format!("{addr} listening"), log, within, || async move {
        tokio::net::TcpStream::connect(addr).await.is_ok()
    })
    .await
}

/// A process's memory from `/proc/<pid>/status`: (current RSS, peak RSS `VmHWM`) in MiB.
pub(crate) fn memory_mib(pid: u32) -> (f64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
            .map_or(f64::NAN, |kib| kib / 1024.0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// CPU time (user + system, all threads) a process has used, in seconds, from
/// `/proc/<pid>/stat` (Linux counts it in USER_HZ ticks, 100 per second on every architecture
/// Rust's std supports there).
pub(crate) fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The command name may hold spaces: fields are counted after its closing parenthesis.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or(Vec::new(), |(_, rest)| rest.split_whitespace().collect());
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok());
    match (ticks(11), ticks(12)) {
        (Some(user), Some(system)) => (user + system) / 100.0,
        _ => f64::NAN,
    }
}

/// CPU time the whole machine has spent busy (every state but idle and iowait, all cores), in
/// seconds, from `/proc/stat`.
pub(crate) fn machine_busy_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(cpu) = stat.lines().find(|l| l.starts_with("cpu ")) else {
        return f64::NAN;
    };
    // user nice system idle iowait irq softirq steal (guest time is inside user already).
    let ticks: Vec<f64> = cpu
        .split_whitespace()
        .skip(1)
        .take(8)
        .filter_map(|t| t.parse().ok())
        .collect();
    if ticks.len() < 8 {
        return f64::NAN;
    }
    (ticks.iter().sum::<f64>() - ticks[3] - ticks[4]) / 100.0
}

/// The `p` quantile of `v` (nearest rank; sorts `v`).
pub(crate) fn pct(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    if v.is_empty() {
        return Duration::ZERO;
    }
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let i = (((v.len() - 1) as f64) * p).round() as usize;
    v[i.min(v.len() - 1)]
}

/// GET over plain HTTP/1.1 (the node's metrics listener), body as text.
pub(crate) async fn http_get(addr: &str, path: &str) -> anyhow::Result<String> {
    let mut tcp = tokio::net::TcpStream::connect(addr).await?;
    tcp.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await?;
    let mut raw = Vec::new();
    tcp.read_to_end(&mut raw).await?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .context("a reply without headers")?;
    if !head.starts_with("HTTP/1.1 200") {
        bail!("GET {path}: {}", head.lines().next().unwrap_or_default());
    }
    Ok(body.to_owned())
}

/// Samples of the Prometheus text format: (name, labels) -> value.
pub(crate) type Samples = BTreeMap<(String, BTreeMap<String, String>), f64>;

pub(crate) fn parse_metrics(text: &str) -> Samples {
    let mut out = Samples::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(value) = value.parse::<f64>() else {
            continue;
        };
        let (name, labels) = match series.split_once('{') {
            Some((n, rest)) => (n, rest.trim_end_matches('}')),
            None => (series, ""),
        };
        let labels = labels
            .split(',')
            .filter_map(|kv| {
                let (k, v) = kv.split_once('=')?;
                Some((k.to_owned(), v.trim_matches('"').to_owned()))
            })
            .collect();
        out.insert((name.to_owned(), labels), value);
    }
    out
}

/// The buckets of a Prometheus histogram over the series whose labels include `labels` (their
/// buckets summed): (upper bound, count at or below), ascending, `+Inf` last as infinity.
pub(crate) fn histogram_buckets(
    samples: &Samples,
    name: &str,
    labels: &[(&str, &str)],
) -> Vec<(f64, f64)> {
    let mut by_le: BTreeMap<String, (f64, f64)> = BTreeMap::new();
    for ((n, l), v) in samples {
        if n != &format!("{name}_bucket")
            || !labels
                .iter()
                .all(|(k, want)| l.get(*k).map(String::as_str) == Some(*want))
        {
            continue;
        }
        let Some(le) = l.get("le") else { continue };
        let bound = if le == "+Inf" {
            f64::INFINITY
        } else if let Ok(b) = le.parse() {
            b
        } else {
            continue;
        };
        by_le.entry(le.clone()).or_insert((bound, 0.0)).1 += *v;
    }
    let mut buckets: Vec<(f64, f64)> = by_le.into_values().collect();
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    buckets
}

/// A quantile of a Prometheus histogram (linear within the bucket, as `histogram_quantile`),
/// over the series whose labels include `labels` (their buckets summed).
pub(crate) fn histogram_quantile(
    samples: &Samples,
    name: &str,
    labels: &[(&str, &str)],
    q: f64,
) -> Option<f64> {
    let buckets = histogram_buckets(samples, name, labels);
    let total = buckets.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let rank = q * total;
    let mut prev = (0.0, 0.0);
    for (le, count) in buckets {
        if count >= rank {
            if le.is_infinite() {
                return Some(prev.0);
            }
            let width = count - prev.1;
            let frac = if width > 0.0 {
                (rank - prev.1) / width
            } else {
                1.0
            };
            return Some(prev.0 + (le - prev.0) * frac);
        }
        prev = (le, count);
    }
    None
}

/// How many sockets a process has open (its connections to the API servers, mostly).
pub(crate) fn sockets(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |dir| {
        dir.filter_map(Result::ok)
            .filter(|e| {
                std::fs::read_link(e.path())
                    .is_ok_and(|l| l.to_string_lossy().starts_with("socket:"))
            })
            .count()
    })
}

/// What changed in counters between two scrapes.
pub(crate) fn delta(after: &Samples, before: &Samples) -> Samples {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0)))
        .collect()
}

/// The API server's own `/metrics` (a real kube-apiserver's; the simulator serves none).
pub(crate) async fn apiserver_metrics(client: &kube::Client) -> Option<Samples> {
    let req = http::Request::get("/metrics").body(Vec::new()).ok()?;
    let text = client.request_text(req).await.ok()?;
    Some(parse_metrics(&text))
}

/// A quantile, in seconds, of an API server's own request latency for the requests whose labels
/// include `labels` (verb, resource, subresource), between two scrapes of its `/metrics`, to
/// tell its time from ours. None when either scrape is missing (the simulator serves none) or
/// no such request was served in between.
pub(crate) fn server_quantile(
    before: Option<&Samples>,
    after: Option<&Samples>,
    labels: &[(&str, &str)],
    q: f64,
) -> Option<f64> {
    let d = delta(after?, before?);
    histogram_quantile(&d, "apiserver_request_duration_seconds", labels, q)
}

/// Milliseconds for the JSON line: a number, or null when not measured.
pub(crate) fn ms_json(seconds: Option<f64>) -> serde_json::Value {
    seconds.map_or(serde_json::Value::Null, |s| json!((s * 1e4).round() / 10.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_memory_and_cpu_time() {
        let (rss, peak) = memory_mib(std::process::id());
        assert!(rss > 0.0 && peak >= rss, "rss {rss} peak {peak}");
        assert!(cpu_seconds(std::process::id()) >= 0.0);
        assert!(machine_busy_seconds() > 0.0);
        assert!(memory_mib(u32::MAX).0.is_nan());
        assert!(cpu_seconds(u32::MAX).is_nan());
    }
}
