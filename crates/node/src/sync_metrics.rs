//! The node's sync metrics, shared by its controllers (pods, copies, tokens, volumes, events).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Where a pod sync spends its time: the Prometheus histogram `tensile_pod_sync_seconds`
/// with `stage` `queue_wait` (a changed pod waiting for a worker), `reconcile` (one whole
/// reconcile, API calls included), `lower_pod_create` (the lower API server's answer to the
/// pod create alone), `upper_tokens` (a pod's tokens from the upper cluster), `upper_status`
/// (the upper API server's answer to the status written up), and the syncs of what pods need:
/// `copy` (one ConfigMap, Secret, Service, Endpoints or claim copy), `event_mirror` (one lower
/// event mirrored up) and `volume` (one volume). Clones share the histograms.
#[derive(Clone, Debug)]
pub struct SyncMetrics {
    family: Family<StageLabel, Histogram, fn() -> Histogram>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StageLabel {
    stage: &'static str,
}

impl Default for SyncMetrics {
    fn default() -> Self {
        // 0.5 ms to ~16 s.
        Self {
            family: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.0005, 2.0, 16))
            }),
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
        m
    }

    pub(crate) fn observe(&self, stage: &'static str, d: std::time::Duration) {
        self.family
            .get_or_create(&StageLabel { stage })
            .observe(d.as_secs_f64());
    }
}
