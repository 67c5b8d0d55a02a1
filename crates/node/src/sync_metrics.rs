//! The node's sync metrics, shared by its controllers (pods, copies, tokens, volumes, events).

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Pod;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tensile_runtime::cache::CompactCache;
use tensile_runtime::cache::Key;
use tensile_runtime::lock::lock;

/// Where a pod sync spends its time: the Prometheus histogram `tensile_pod_sync_seconds`
/// with `stage` `queue_wait` (a changed pod waiting for a worker), `reconcile` (one whole
/// reconcile, API calls included), `lower_pod_create` (the lower API server's answer to the
/// pod create alone), `upper_tokens` (a pod's tokens from the upper cluster), `upper_status`
/// (the upper API server's answer to the status written up), and the syncs of what pods need:
/// `copy` (one ConfigMap, Secret, Service, Endpoints or claim copy), `event_mirror` (one lower
/// event mirrored up) and `volume` (one volume). Also how pod syncs fail:
/// `tensile_pod_sync_failures_total{op}` (`create`, `update`, `delete`, `other`) and
/// `tensile_pods_offload_failing` (pods whose last try to create them downstairs failed).
/// Clones share the values.
#[derive(Clone, Debug)]
pub struct SyncMetrics {
    family: Family<StageLabel, Histogram, fn() -> Histogram>,
    failures: Family<OpLabel, Counter>,
    offload_failing: Gauge,
    /// The pods behind `offload_failing`.
    failing: Arc<Mutex<HashSet<Key>>>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StageLabel {
    stage: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OpLabel {
    op: &'static str,
}

/// The parts of a pod sync whose failures are counted, as their `op` label.
pub const FAILURE_OPS: [&str; 4] = ["create", "update", "delete", "other"];

impl Default for SyncMetrics {
    fn default() -> Self {
        let failures = Family::<OpLabel, Counter>::default();
        // Every part from the start, so a rate is defined before the first failure.
        for op in FAILURE_OPS {
            drop(failures.get_or_create(&OpLabel { op }));
        }
        // 0.5 ms to ~16 s.
        Self {
            family: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.0005, 2.0, 16))
            }),
            failures,
            offload_failing: Gauge::default(),
            failing: Arc::default(),
        }
    }
}

impl SyncMetrics {
    /// Histograms registered in `registry`.
    pub fn new(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "tensile_pod_sync_seconds",
            "Time a pod sync spends per stage: queue_wait, reconcile, lower_pod_create, upper_tokens, upper_status, copy, event_mirror, volume",
            m.family.clone(),
        );
        registry.register(
            "tensile_pod_sync_failures",
            "Failed pod syncs, by the part that failed: create (the lower pod or what it needs), update, delete, other",
            m.failures.clone(),
        );
        registry.register(
            "tensile_pods_offload_failing",
            "Pods whose last try to create them in the lower cluster failed (their Offloaded condition is False, ProviderFailed)",
            m.offload_failing.clone(),
        );
        m
    }

    pub(crate) fn observe(&self, stage: &'static str, d: std::time::Duration) {
        self.family
            .get_or_create(&StageLabel { stage })
            .observe(d.as_secs_f64());
    }

    /// One reconcile of pod `key` ended: in a failure of part `failed` (one of
    /// [`FAILURE_OPS`]), `None` when it succeeded. A failed creation keeps the pod counted
    /// as failing to offload until a reconcile of it succeeds.
    pub(crate) fn reconciled(&self, key: &Key, failed: Option<&'static str>) {
        if let Some(op) = failed {
            self.failures.get_or_create(&OpLabel { op }).inc();
        }
        let mut failing = lock(&self.failing, "the pods failing to offload");
        let changed = if failed == Some("create") {
            failing.insert(key.clone())
        } else if failed.is_none() {
            failing.remove(key)
        } else {
            false
        };
        if changed {
            self.offload_failing
                .set(i64::try_from(failing.len()).unwrap_or(i64::MAX));
        }
    }

    /// Pods counted as failing to offload now.
    pub fn offload_failing(&self) -> i64 {
        self.offload_failing.get()
    }
}

/// `tensile_node_pods{cluster}`, read from the pod controller's caches at each scrape:
/// `upper`, the pods bound to the virtual node upstairs; `lower`, the pods it created in its
/// lower cluster.
#[derive(Debug)]
pub struct PodCounts {
    /// The upper pods bound to the node.
    pub upper: CompactCache<Pod>,
    /// Our lower pods.
    pub lower: CompactCache<Pod>,
}

impl Collector for PodCounts {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let mut family = encoder.encode_descriptor(
            "tensile_node_pods",
            "Pods of the virtual node: upper (bound to it upstairs), lower (created by it downstairs)",
            None,
            prometheus_client::metrics::MetricType::Gauge,
        )?;
        for (cluster, cache) in [("upper", &self.upper), ("lower", &self.lower)] {
            let gauge = ConstGauge::new(i64::try_from(cache.len()).unwrap_or(i64::MAX));
            gauge.encode(family.encode_family(&[("cluster", cluster)])?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // test code
mod tests {
    use super::*;

    fn text(registry: &Registry) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, registry).unwrap();
        out
    }

    #[test]
    fn a_failed_creation_counts_until_the_pod_syncs_and_every_op_starts_at_zero() {
        let mut registry = Registry::default();
        let m = SyncMetrics::new(&mut registry);
        for op in FAILURE_OPS {
            assert!(
                text(&registry)
                    .contains(&format!("tensile_pod_sync_failures_total{{op=\"{op}\"}} 0")),
                "{op}"
            );
        }
        let (a, b) = (Key::new("ns", "a"), Key::new("ns", "b"));
        m.reconciled(&a, Some("create"));
        m.reconciled(&a, Some("create"));
        m.reconciled(&b, Some("create"));
        assert_eq!(m.offload_failing(), 2);
        // A failure of another part says nothing about the creation.
        m.reconciled(&b, Some("update"));
        assert_eq!(m.offload_failing(), 2);
        m.reconciled(&a, None);
        assert_eq!(m.offload_failing(), 1);
        let t = text(&registry);
        assert!(
            t.contains("tensile_pod_sync_failures_total{op=\"create\"} 3"),
            "{t}"
        );
        assert!(
            t.contains("tensile_pod_sync_failures_total{op=\"update\"} 1"),
            "{t}"
        );
        assert!(t.contains("tensile_pods_offload_failing 1"), "{t}");
    }

    #[test]
    fn pods_are_counted_from_the_caches_at_each_scrape() {
        let mut registry = Registry::default();
        let (upper, lower) = (CompactCache::<Pod>::new(), CompactCache::<Pod>::new());
        registry.register_collector(Box::new(PodCounts {
            upper: upper.clone(),
            lower: lower.clone(),
        }));
        let pod = |name: &str| Pod {
            metadata: kube::api::ObjectMeta {
                name: Some(name.to_owned()),
                namespace: Some("ns".to_owned()),
                ..Default::default()
            },
            ..Default::default()
        };
        upper.apply(&kube::runtime::watcher::Event::Apply(pod("a")));
        upper.apply(&kube::runtime::watcher::Event::Apply(pod("b")));
        lower.apply(&kube::runtime::watcher::Event::Apply(pod("a")));
        let t = text(&registry);
        assert!(t.contains("tensile_node_pods{cluster=\"upper\"} 2"), "{t}");
        assert!(t.contains("tensile_node_pods{cluster=\"lower\"} 1"), "{t}");
    }
}
