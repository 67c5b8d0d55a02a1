//! The kubelet's resource statistics: the `/stats/summary` document (stats API `v1alpha1`,
//! the CPU and memory parts that `kubectl top`, metrics-server and autoscalers read; not in
//! k8s-openapi, so defined here) and the Prometheus text of `/metrics/resource` that
//! metrics-server 0.6+ scrapes.

use std::collections::HashMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

/// `/stats/summary`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    /// The node's totals.
    pub node: NodeStats,
    /// One entry per pod.
    #[serde(default)]
    pub pods: Vec<PodStats>,
}

/// Node statistics.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeStats {
    /// Node name.
    pub node_name: String,
    /// When the node (kubelet) started, RFC 3339.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_time: Option<String>,
    /// CPU.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuStats>,
    /// Memory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStats>,
}

/// A pod reference in the stats API.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodReference {
    /// Pod name.
    pub name: String,
    /// Namespace.
    pub namespace: String,
    /// UID.
    #[serde(default)]
    pub uid: String,
}

/// Pod statistics.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodStats {
    /// The pod.
    pub pod_ref: PodReference,
    /// Start time, RFC 3339.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_time: Option<String>,
    /// Containers.
    #[serde(default)]
    pub containers: Vec<ContainerStats>,
    /// Pod CPU (sum of containers).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuStats>,
    /// Pod memory (sum of containers).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStats>,
}

/// Container statistics.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerStats {
    /// Container name.
    pub name: String,
    /// Start time, RFC 3339.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_time: Option<String>,
    /// CPU.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuStats>,
    /// Memory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStats>,
}

/// CPU usage.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CpuStats {
    /// Sample time, RFC 3339.
    pub time: String,
    /// Current usage in nano-cores.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage_nano_cores: Option<u64>,
    /// Cumulative usage in core-nanoseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage_core_nano_seconds: Option<u64>,
}

/// Memory usage.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MemoryStats {
    /// Sample time, RFC 3339.
    pub time: String,
    /// Working set in bytes (what eviction and metrics-server use).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub working_set_bytes: Option<u64>,
    /// Total usage in bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage_bytes: Option<u64>,
}

/// Milliseconds since the epoch of an RFC 3339 time (Prometheus sample timestamps).
fn millis(time: &str) -> Option<i64> {
    time.parse::<k8s_openapi::jiff::Timestamp>()
        .ok()
        .map(|t| t.as_millisecond())
}

fn seconds(time: &str) -> Option<f64> {
    time.parse::<k8s_openapi::jiff::Timestamp>()
        .ok()
        .map(|t| t.as_millisecond() as f64 / 1000.0)
}

/// Label values escaped as the Prometheus text format wants.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The Prometheus text of `/metrics/resource`, from a summary.
pub fn resource_metrics(summary: &Summary) -> String {
    let mut out = String::new();
    let mut family =
        |name: &str, help: &str, kind: &str, samples: Vec<(String, f64, Option<i64>)>| {
            let _ = writeln!(out, "# HELP {name} [STABLE] {help}");
            let _ = writeln!(out, "# TYPE {name} {kind}");
            for (labels, value, ts) in samples {
                let _ = match ts {
                    Some(ts) => writeln!(out, "{name}{labels} {value} {ts}"),
                    None => writeln!(out, "{name}{labels} {value}"),
                };
            }
        };
    let cpu_seconds = |c: &CpuStats| {
        c.usage_core_nano_seconds
            .map(|n| (n as f64 / 1e9, millis(&c.time)))
    };
    let mem = |m: &MemoryStats| m.working_set_bytes.map(|b| (b as f64, millis(&m.time)));
    let container = |p: &PodStats, c: &ContainerStats| {
        format!(
            "{{container=\"{}\",namespace=\"{}\",pod=\"{}\"}}",
            escape(&c.name),
            escape(&p.pod_ref.namespace),
            escape(&p.pod_ref.name)
        )
    };
    let pod = |p: &PodStats| {
        format!(
            "{{namespace=\"{}\",pod=\"{}\"}}",
            escape(&p.pod_ref.namespace),
            escape(&p.pod_ref.name)
        )
    };
    let containers = || {
        summary
            .pods
            .iter()
            .flat_map(|p| p.containers.iter().map(move |c| (p, c)))
    };
    family(
        "container_cpu_usage_seconds_total",
        "Cumulative cpu time consumed by the container in core-seconds",
        "counter",
        containers()
            .filter_map(|(p, c)| {
                c.cpu
                    .as_ref()
                    .and_then(cpu_seconds)
                    .map(|(v, t)| (container(p, c), v, t))
            })
            .collect(),
    );
    family(
        "container_memory_working_set_bytes",
        "Current working set of the container in bytes",
        "gauge",
        containers()
            .filter_map(|(p, c)| {
                c.memory
                    .as_ref()
                    .and_then(mem)
                    .map(|(v, t)| (container(p, c), v, t))
            })
            .collect(),
    );
    family(
        "container_start_time_seconds",
        "Start time of the container since unix epoch in seconds",
        "gauge",
        containers()
            .filter_map(|(p, c)| {
                c.start_time
                    .as_deref()
                    .and_then(seconds)
                    .map(|v| (container(p, c), v, None))
            })
            .collect(),
    );
    family(
        "node_cpu_usage_seconds_total",
        "Cumulative cpu time consumed by the node in core-seconds",
        "counter",
        summary
            .node
            .cpu
            .as_ref()
            .and_then(cpu_seconds)
            .map(|(v, t)| (String::new(), v, t))
            .into_iter()
            .collect(),
    );
    family(
        "node_memory_working_set_bytes",
        "Current working set of the node in bytes",
        "gauge",
        summary
            .node
            .memory
            .as_ref()
            .and_then(mem)
            .map(|(v, t)| (String::new(), v, t))
            .into_iter()
            .collect(),
    );
    family(
        "pod_cpu_usage_seconds_total",
        "Cumulative cpu time consumed by the pod in core-seconds",
        "counter",
        summary
            .pods
            .iter()
            .filter_map(|p| {
                p.cpu
                    .as_ref()
                    .and_then(cpu_seconds)
                    .map(|(v, t)| (pod(p), v, t))
            })
            .collect(),
    );
    family(
        "pod_memory_working_set_bytes",
        "Current working set of the pod in bytes",
        "gauge",
        summary
            .pods
            .iter()
            .filter_map(|p| p.memory.as_ref().and_then(mem).map(|(v, t)| (pod(p), v, t)))
            .collect(),
    );
    family(
        "resource_scrape_error",
        "1 if there was an error while getting container metrics, 0 otherwise",
        "gauge",
        vec![(String::new(), 0.0, None)],
    );
    out
}

/// Turns instantaneous CPU usage samples (what the metrics API gives) into the cumulative
/// core-nanoseconds counters the stats API and metrics-server need: each sample adds
/// usage x elapsed time since the previous one.
///
/// A counter starts at [`CpuIntegrator::ORIGIN`], not at zero: a real kubelet's counter of a
/// container that ran is never zero (starting a process costs CPU), and metrics-server reads a
/// zero counter as a missing metric (`CumulativeCPUUsed == 0`) and drops the container, so an
/// idle container (0 cores in the lower metrics API) would never show in `kubectl top`
/// upstairs. Only the counter's growth means anything to its readers (a rate); its origin is
/// when the integration began.
#[derive(Debug, Default)]
pub struct CpuIntegrator {
    last: HashMap<String, (i64, u128)>,
}

impl CpuIntegrator {
    /// Where every counter starts, in core-nanoseconds.
    pub const ORIGIN: u64 = 1;

    /// Records `nano_cores` for `key` at `at_millis`; returns the running total.
    ///
    /// The total advances in whole seconds: the stats API's timestamps have whole-second
    /// precision, and a consumer such as metrics-server divides the counter's growth by the
    /// growth of that timestamp, so a counter that also counted the milliseconds would read
    /// up to a tenth too high or low over a 10 s scrape.
    pub fn sample(&mut self, key: &str, nano_cores: u64, at_millis: i64) -> u64 {
        let at_millis = at_millis.div_euclid(1000) * 1000;
        let entry = self
            .last
            .entry(key.to_owned())
            .or_insert((at_millis, u128::from(Self::ORIGIN)));
        let elapsed_ms = u128::try_from(at_millis.saturating_sub(entry.0)).unwrap_or(0);
        entry.1 = entry
            .1
            .saturating_add(u128::from(nano_cores) * elapsed_ms / 1000);
        entry.0 = entry.0.max(at_millis);
        u64::try_from(entry.1).unwrap_or(u64::MAX)
    }

    /// Forgets keys not in `keep` (pods that are gone).
    pub fn retain(&mut self, keep: impl Fn(&str) -> bool) {
        self.last.retain(|k, _| keep(k));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary() -> Summary {
        let t = "2026-11-22T10:00:00Z".to_owned();
        let cpu = |n| {
            Some(CpuStats {
                time: t.clone(),
                usage_nano_cores: Some(n),
                usage_core_nano_seconds: Some(n * 10),
            })
        };
        let mem = |b| {
            Some(MemoryStats {
                time: t.clone(),
                working_set_bytes: Some(b),
                usage_bytes: Some(b),
            })
        };
        Summary {
            node: NodeStats {
                node_name: "n1".into(),
                start_time: Some(t.clone()),
                cpu: cpu(300_000_000),
                memory: mem(3 << 20),
            },
            pods: vec![PodStats {
                pod_ref: PodReference {
                    name: "web".into(),
                    namespace: "shop".into(),
                    uid: "u".into(),
                },
                start_time: Some(t.clone()),
                containers: vec![ContainerStats {
                    name: "c".into(),
                    start_time: Some(t.clone()),
                    cpu: cpu(100_000_000),
                    memory: mem(1 << 20),
                }],
                cpu: cpu(100_000_000),
                memory: mem(1 << 20),
            }],
        }
    }

    #[test]
    fn summary_json_has_the_kubelet_field_names() {
        let v = serde_json::to_value(summary()).unwrap();
        assert_eq!(v["node"]["nodeName"], "n1");
        assert_eq!(v["pods"][0]["podRef"]["namespace"], "shop");
        assert_eq!(
            v["pods"][0]["containers"][0]["cpu"]["usageNanoCores"],
            100_000_000
        );
        assert_eq!(v["pods"][0]["memory"]["workingSetBytes"], 1 << 20);
    }

    #[test]
    fn resource_metrics_are_the_text_metrics_server_parses() {
        let text = resource_metrics(&summary());
        assert!(
            text.contains("# TYPE container_cpu_usage_seconds_total counter\n"),
            "{text}"
        );
        assert!(text.contains("container_cpu_usage_seconds_total{container=\"c\",namespace=\"shop\",pod=\"web\"} 1 1795341600000\n"), "{text}");
        assert!(text.contains("pod_memory_working_set_bytes{namespace=\"shop\",pod=\"web\"} 1048576 1795341600000\n"), "{text}");
        assert!(
            text.contains("node_memory_working_set_bytes 3145728 1795341600000\n"),
            "{text}"
        );
        assert!(text.contains("resource_scrape_error 0\n"));
    }

    #[test]
    fn cpu_integration_accumulates_usage_times_time() {
        let mut i = CpuIntegrator::default();
        let o = CpuIntegrator::ORIGIN;
        assert_eq!(i.sample("a", 500_000_000, 1_000), o);
        assert_eq!(
            i.sample("a", 500_000_000, 3_000),
            o + 1_000_000_000,
            "half a core for 2 s"
        );
        assert_eq!(
            i.sample("a", 1_000_000_000, 3_000),
            o + 1_000_000_000,
            "no time, no usage"
        );
        assert_eq!(
            i.sample("a", 1_000_000_000, 4_900),
            o + 2_000_000_000,
            "counted to the whole second the timestamp shows"
        );
        assert_eq!(i.sample("a", 1_000_000_000, 5_100), o + 3_000_000_000);
        i.retain(|k| k != "a");
        assert_eq!(i.sample("a", 1, 10_000), o, "forgotten");
    }

    /// metrics-server drops a container whose counter is zero (`CumulativeCPUUsed == 0`): an
    /// idle container (0 cores, as real idle containers are in the metrics API) keeps a
    /// counter above zero, so it still shows, at 0 cores.
    #[test]
    fn an_idle_containers_counter_is_never_zero() {
        let mut i = CpuIntegrator::default();
        for t in [1_000, 11_000, 21_000] {
            assert!(i.sample("idle", 0, t) > 0);
        }
    }
}
