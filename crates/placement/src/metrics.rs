//! Prometheus metrics of the webhook, the descheduler and the scheduler extender, registered in
//! the registry that their `--metrics-addr` listener serves (`tensile_runtime::metrics`). Each set
//! is cheap to clone and clones share the values; `Default` gives an unregistered set (counted,
//! never served), for callers that serve no metrics.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// 0.1 ms to ~6.5 s: admission and extender answers are in-memory decisions, plus a Binding
/// POST for `bind`; the API server gives a webhook 10 s at most.
fn latency() -> Histogram {
    Histogram::new(exponential_buckets(0.0001, 2.0, 17))
}

type Latencies<L> = Family<L, Histogram, fn() -> Histogram>;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DecisionLabel {
    decision: &'static str,
}

/// What the webhook answered an AdmissionReview with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Allowed unchanged (not a pod it mutates, or nothing to hide).
    Allowed,
    /// Allowed with a patch.
    Patched,
    /// Refused (a malformed `clusterSelector`, an unreadable pod).
    Denied,
    /// Not an AdmissionReview at all (HTTP 400).
    Invalid,
}

impl Decision {
    fn label(self) -> &'static str {
        match self {
            Self::Allowed => "allowed",
            Self::Patched => "patched",
            Self::Denied => "denied",
            Self::Invalid => "invalid",
        }
    }
}

/// `tensile_webhook_admission_seconds` (histogram: time to answer one AdmissionReview) and
/// `tensile_webhook_decisions_total{decision}`.
#[derive(Clone, Debug)]
pub struct WebhookMetrics {
    admission: Histogram,
    decisions: Family<DecisionLabel, Counter>,
}

impl Default for WebhookMetrics {
    fn default() -> Self {
        Self {
            admission: latency(),
            decisions: Family::default(),
        }
    }
}

impl WebhookMetrics {
    /// The webhook's metrics, registered in `registry`.
    pub fn new(registry: &mut Registry) -> Self {
        let m = Self::default();
        // Every decision from the start, so a rate is defined before the first of each.
        for d in [
            Decision::Allowed,
            Decision::Patched,
            Decision::Denied,
            Decision::Invalid,
        ] {
            drop(m.decisions.get_or_create(&DecisionLabel {
                decision: d.label(),
            }));
        }
        registry.register(
            "tensile_webhook_admission_seconds",
            "Time to answer one AdmissionReview",
            m.admission.clone(),
        );
        registry.register(
            "tensile_webhook_decisions",
            "AdmissionReviews answered, by decision: allowed, patched, denied, invalid",
            m.decisions.clone(),
        );
        m
    }

    /// One review answered with `decision` in `took`.
    pub fn observe(&self, decision: Decision, took: Duration) {
        self.admission.observe(took.as_secs_f64());
        self.decisions
            .get_or_create(&DecisionLabel {
                decision: decision.label(),
            })
            .inc();
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ViaLabel {
    via: &'static str,
}

/// `tensile_descheduler_moves_total{via}` (moves started: their intent written; `via` is
/// `owner` when the pod's controller re-creates it, `recreate` when the descheduler does) and
/// `tensile_descheduler_give_ups_total` (pods left where they are after `max_attempts` moves).
#[derive(Clone, Debug, Default)]
pub struct DeschedulerMetrics {
    moves: Family<ViaLabel, Counter>,
    give_ups: Counter,
}

impl DeschedulerMetrics {
    /// The descheduler's metrics, registered in `registry`.
    pub fn new(registry: &mut Registry) -> Self {
        let m = Self::default();
        for via in ["owner", "recreate"] {
            drop(m.moves.get_or_create(&ViaLabel { via }));
        }
        registry.register(
            "tensile_descheduler_moves",
            "Moves started (intent written), by who re-creates the pod: owner, recreate",
            m.moves.clone(),
        );
        registry.register(
            "tensile_descheduler_give_ups",
            "Pods the descheduler gave up on after their maximum number of moves",
            m.give_ups.clone(),
        );
        m
    }

    /// A move started; `through_owner` when the pod's controller makes the replacement.
    pub fn moved(&self, through_owner: bool) {
        let via = if through_owner { "owner" } else { "recreate" };
        self.moves.get_or_create(&ViaLabel { via }).inc();
    }

    /// A pod given up on.
    pub fn gave_up(&self) {
        self.give_ups.inc();
    }

    /// Moves started so far, over both ways.
    pub fn moves(&self) -> u64 {
        ["owner", "recreate"]
            .into_iter()
            .map(|via| self.moves.get_or_create(&ViaLabel { via }).get())
            .sum()
    }

    /// Pods given up on so far.
    pub fn give_ups(&self) -> u64 {
        self.give_ups.get()
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VerbLabel {
    verb: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClusterLabel {
    cluster: String,
}

/// `tensile_extender_request_seconds{verb="filter"|"prioritize"|"bind"}` (histogram: time to
/// answer one kube-scheduler call, the Binding POST included for `bind`) and
/// `tensile_extender_reservations{cluster}` (gauge: room promised by `bind` whose lower pod has
/// not appeared yet) and `tensile_extender_rooms_built_total{cluster}` (counter: a cluster's
/// free room simulated from scratch, its pending lower pods and reservations placed again,
/// because something a kept room counted on changed) and
/// `tensile_extender_filter_answers_total{outcome}` (filter calls by what they answered: `some`
/// nodes kept, `none` kept, every node refused, or `retry`, an error asking kube-scheduler to
/// try the pod again because a lower cluster it would need is not known yet or unreachable).
#[derive(Clone, Debug)]
pub struct ExtenderMetrics {
    requests: Latencies<VerbLabel>,
    reservations: Family<ClusterLabel, Gauge>,
    rooms_built: Family<ClusterLabel, Counter>,
    filter_answers: Family<OutcomeLabel, Counter>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: &'static str,
}

/// What a filter call answered (`tensile_extender_filter_answers_total{outcome}`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FilterOutcome {
    /// At least one node kept.
    Some,
    /// Every node refused.
    None,
    /// An error asking kube-scheduler to try again.
    Retry,
}

impl FilterOutcome {
    const ALL: [Self; 3] = [Self::Some, Self::None, Self::Retry];

    fn label(self) -> &'static str {
        match self {
            Self::Some => "some",
            Self::None => "none",
            Self::Retry => "retry",
        }
    }
}

impl Default for ExtenderMetrics {
    fn default() -> Self {
        Self {
            requests: Family::new_with_constructor(latency),
            reservations: Family::default(),
            rooms_built: Family::default(),
            filter_answers: Family::default(),
        }
    }
}

impl ExtenderMetrics {
    /// The extender's metrics, registered in `registry`.
    pub fn new(registry: &mut Registry) -> Self {
        let m = Self::default();
        // Every verb and outcome from the start, so a rate is defined before the first call.
        for verb in ["filter", "prioritize", "bind"] {
            drop(m.requests.get_or_create(&VerbLabel { verb }));
        }
        for outcome in FilterOutcome::ALL {
            drop(m.filter_answers.get_or_create(&OutcomeLabel {
                outcome: outcome.label(),
            }));
        }
        registry.register(
            "tensile_extender_request_seconds",
            "Time to answer one kube-scheduler call, by verb: filter, prioritize, bind",
            m.requests.clone(),
        );
        registry.register(
            "tensile_extender_reservations",
            "Reservations of room by bind whose lower pod has not appeared yet, per lower cluster",
            m.reservations.clone(),
        );
        registry.register(
            "tensile_extender_rooms_built",
            "Rooms of a lower cluster simulated from scratch, its pending lower pods and reservations placed again",
            m.rooms_built.clone(),
        );
        registry.register(
            "tensile_extender_filter_answers",
            "Filter calls by what they answered: some (nodes kept), none (every node refused), retry (an error asking to try again)",
            m.filter_answers.clone(),
        );
        m
    }

    /// One filter call answered so.
    pub(crate) fn filtered(&self, outcome: FilterOutcome) {
        self.filter_answers
            .get_or_create(&OutcomeLabel {
                outcome: outcome.label(),
            })
            .inc();
    }

    /// One call of `verb` answered in `took`.
    pub(crate) fn observe(&self, verb: &'static str, took: Duration) {
        self.requests
            .get_or_create(&VerbLabel { verb })
            .observe(took.as_secs_f64());
    }

    /// `cluster` holds `count` reservations now.
    pub(crate) fn set_reservations(&self, cluster: &str, count: usize) {
        self.reservations
            .get_or_create(&ClusterLabel {
                cluster: cluster.to_owned(),
            })
            .set(i64::try_from(count).unwrap_or(i64::MAX));
    }

    /// `cluster` has built `total` rooms since the extender started.
    pub(crate) fn set_rooms_built(&self, cluster: &str, total: u64) {
        let counter = self.rooms_built.get_or_create(&ClusterLabel {
            cluster: cluster.to_owned(),
        });
        // Only this sets it, under the index's lock: the difference is what was built since.
        counter.inc_by(total.saturating_sub(counter.get()));
    }
}
