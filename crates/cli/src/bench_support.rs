//! What the benchmarks share: their clusters, watches, percentiles and the Prometheus text
//! they read from the node and the API servers.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context as _, bail};
use futures::StreamExt;
use kube::api::Api;
use kube::runtime::watcher;
use tensile_simkubelet::{SimKubeletConfig, SimNode};
use tensile_testenv::{ClusterSpec, TestEnv};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

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

/// A quantile of a Prometheus histogram (linear within the bucket, as `histogram_quantile`),
/// over the series whose labels include `labels` (their buckets summed).
pub(crate) fn histogram_quantile(
    samples: &Samples,
    name: &str,
    labels: &[(&str, &str)],
    q: f64,
) -> Option<f64> {
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
