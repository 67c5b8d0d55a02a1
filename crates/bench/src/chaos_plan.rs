//! The nemesis of `tensile bench chaos`: which faults, when and for how long, computed before
//! the run from the seed alone (no clock, no cluster), so one seed replays one schedule. Faults
//! come at random intervals and last random times, so they overlap; two faults never hit the
//! same part at once (an API server is not killed while it is stopped), since what that would
//! do is not a fault of ours but of the harness.

use std::collections::BTreeMap;
use std::time::Duration;

/// A fault the nemesis injects.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, clap::ValueEnum, serde::Serialize,
)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum FaultKind {
    /// A lower kube-apiserver killed (SIGKILL) and started again after a while.
    LowerApiserverKill,
    /// A lower kube-apiserver stopped (SIGSTOP), then continued.
    LowerApiserverStop,
    /// A lower etcd killed (SIGKILL) and started again (real control planes only).
    LowerEtcdKill,
    /// The upper kube-apiserver killed (SIGKILL) and started again.
    UpperApiserverKill,
    /// Every client connection to a lower cluster cut, new ones refused.
    LowerNetworkCut,
    /// A share of the virtual node's requests to its lower cluster answered 429 or 500.
    LowerErrors,
    /// The virtual node's replica that leads killed (SIGKILL), started again after a while.
    NodeLeaderKill,
    /// The standby replica killed (SIGKILL), started again after a while.
    NodeFollowerKill,
    /// One replica's bytes one way (to an API server, or from it) held: requests that arrive
    /// and answers that do not, or the reverse.
    OneWayPartition,
    /// etcd compacted to its current revision and the API server restarted: every watch
    /// resumes from a revision that is gone (410 Gone) and lists again (real control planes
    /// only).
    EtcdCompaction,
    /// A share of the virtual nodes' requests to the upper API server answered 429.
    UpperThrottle,
    /// The scheduler extender killed (SIGKILL), started again after a while.
    ExtenderKill,
    /// The webhook killed (SIGKILL), started again after a while.
    WebhookKill,
}

impl FaultKind {
    /// Every kind, in a fixed order (the plan draws from the kinds given, in this order).
    pub(crate) const ALL: [FaultKind; 13] = [
        Self::LowerApiserverKill,
        Self::LowerApiserverStop,
        Self::LowerEtcdKill,
        Self::UpperApiserverKill,
        Self::LowerNetworkCut,
        Self::LowerErrors,
        Self::NodeLeaderKill,
        Self::NodeFollowerKill,
        Self::OneWayPartition,
        Self::EtcdCompaction,
        Self::UpperThrottle,
        Self::ExtenderKill,
        Self::WebhookKill,
    ];

    /// Its name on the command line and in the report.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::LowerApiserverKill => "lower-apiserver-kill",
            Self::LowerApiserverStop => "lower-apiserver-stop",
            Self::LowerEtcdKill => "lower-etcd-kill",
            Self::UpperApiserverKill => "upper-apiserver-kill",
            Self::LowerNetworkCut => "lower-network-cut",
            Self::LowerErrors => "lower-errors",
            Self::NodeLeaderKill => "node-leader-kill",
            Self::NodeFollowerKill => "node-follower-kill",
            Self::OneWayPartition => "one-way-partition",
            Self::EtcdCompaction => "etcd-compaction",
            Self::UpperThrottle => "upper-throttle",
            Self::ExtenderKill => "extender-kill",
            Self::WebhookKill => "webhook-kill",
        }
    }

    /// Whether it needs real control planes (the simulator has no etcd).
    pub(crate) fn needs_real(self) -> bool {
        matches!(self, Self::LowerEtcdKill | Self::EtcdCompaction)
    }
}

/// Which way a one-way partition holds bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Way {
    /// From the replica to the API server: its requests do not arrive.
    ToServer,
    /// From the API server to the replica: its requests arrive, their answers do not.
    FromServer,
}

/// One fault of the plan.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub(crate) struct Fault {
    pub kind: FaultKind,
    /// When it begins, from the start of the faults.
    #[serde(serialize_with = "seconds")]
    pub at: Duration,
    /// How long it lasts: an outage, a stop, a partition, errors; how long a killed process
    /// stays down (a control plane's is then started again and waited for).
    #[serde(serialize_with = "seconds")]
    pub lasts: Duration,
    /// The lower cluster (index): of a fault of a lower cluster, or of its virtual node's
    /// replicas (a node kill, a partition).
    pub lower: usize,
    /// A partition's replica (0 or 1) and API server (the upper one, else the node's lower
    /// one) and way; the cluster of a compaction (the upper one, else `lower`).
    pub replica: usize,
    pub upper: bool,
    pub way: Way,
}

fn seconds<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64((d.as_secs_f64() * 10.0).round() / 10.0)
}

impl Fault {
    /// When it ends (a kill: when the process is started again).
    pub(crate) fn end(&self) -> Duration {
        self.at + self.lasts
    }

    /// What it hits, one line: `lower-apiserver-stop of lower-2 for 23.1 s`.
    pub(crate) fn describe(&self) -> String {
        let lower = format!("lower-{}", self.lower + 1);
        let target = match self.kind {
            FaultKind::UpperApiserverKill | FaultKind::UpperThrottle => "upper".to_owned(),
            FaultKind::ExtenderKill => "the extender".to_owned(),
            FaultKind::WebhookKill => "the webhook".to_owned(),
            FaultKind::NodeLeaderKill | FaultKind::NodeFollowerKill => {
                format!("the virtual node of {lower}")
            }
            FaultKind::OneWayPartition => format!(
                "replica {} of the virtual node of {lower} {} the {} API server",
                self.replica,
                match self.way {
                    Way::ToServer => "cut off to",
                    Way::FromServer => "cut off from",
                },
                if self.upper { "upper" } else { "lower" }
            ),
            FaultKind::EtcdCompaction if self.upper => "upper".to_owned(),
            _ => lower,
        };
        format!(
            "{} of {target} for {:.1} s",
            self.kind.name(),
            self.lasts.as_secs_f64()
        )
    }

    /// The part it hits: two faults of one part never overlap.
    fn part(&self) -> Part {
        let plane = |upper: bool| Part::ControlPlane(if upper { 0 } else { self.lower + 1 });
        match self.kind {
            FaultKind::LowerApiserverKill
            | FaultKind::LowerApiserverStop
            | FaultKind::LowerEtcdKill => plane(false),
            FaultKind::UpperApiserverKill => plane(true),
            FaultKind::EtcdCompaction => plane(self.upper),
            FaultKind::LowerNetworkCut => Part::Network(self.lower),
            FaultKind::LowerErrors => Part::Errors(self.lower + 1),
            FaultKind::UpperThrottle => Part::Errors(0),
            FaultKind::NodeLeaderKill | FaultKind::NodeFollowerKill => Part::Node(self.lower),
            FaultKind::OneWayPartition => Part::Replica(self.lower, self.replica),
            FaultKind::ExtenderKill => Part::Extender,
            FaultKind::WebhookKill => Part::Webhook,
        }
    }
}

/// What a fault hits; a cluster is 0 (upper) or 1.. (lower), a lower cluster or node an index.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Part {
    ControlPlane(usize),
    Network(usize),
    Errors(usize),
    Node(usize),
    Replica(usize, usize),
    Extender,
    Webhook,
}

/// The shape of a plan.
#[derive(Clone, Debug)]
pub(crate) struct PlanSpec {
    pub seed: u64,
    /// Faults begin in `[warmup, duration)` and end by `duration`.
    pub duration: Duration,
    pub warmup: Duration,
    /// The kinds to draw from (each equally likely).
    pub kinds: Vec<FaultKind>,
    /// Lower clusters (each with its virtual node of two replicas).
    pub lowers: usize,
    /// Time between two faults' starts: drawn from this range.
    pub gap: (Duration, Duration),
    /// How long a fault that lasts (a stop, a cut, errors, a partition) lasts: this range.
    pub outage: (Duration, Duration),
    /// How long a killed process stays down before it is started again: this range.
    pub down: (Duration, Duration),
}

impl PlanSpec {
    /// The benchmark's defaults for `seed` and `duration`, every kind in `kinds`.
    pub(crate) fn new(seed: u64, duration: Duration, kinds: Vec<FaultKind>) -> Self {
        Self {
            seed,
            duration,
            warmup: Duration::from_secs(10),
            kinds,
            lowers: 2,
            gap: (Duration::from_secs(3), Duration::from_secs(30)),
            outage: (Duration::from_secs(5), Duration::from_secs(40)),
            down: (Duration::from_secs(0), Duration::from_secs(10)),
        }
    }
}

/// How long a part stays busy after a kill of a control plane "ends" (it is started again
/// then, and serves some seconds later): no second fault hits it meanwhile.
const RESTART_ROOM: Duration = Duration::from_secs(30);

/// The faults of `spec`, by start time. A pure function of `spec`: the same seed gives the
/// same plan on every machine. Every draw is made whatever its outcome (a fault whose part is
/// busy is skipped, not redrawn), so one choice never shifts the rest.
pub(crate) fn plan(spec: &PlanSpec) -> Vec<Fault> {
    let mut rng = fastrand::Rng::with_seed(spec.seed);
    let mut faults = Vec::new();
    if spec.kinds.is_empty() || spec.lowers == 0 {
        return faults;
    }
    let mut busy: BTreeMap<Part, Duration> = BTreeMap::new();
    let mut at = spec.warmup;
    let between = |rng: &mut fastrand::Rng, (lo, hi): (Duration, Duration)| {
        let (lo, hi) = (millis(lo), millis(hi).max(millis(lo)));
        Duration::from_millis(rng.u64(lo..=hi))
    };
    while at < spec.duration {
        let kind = spec.kinds[rng.usize(..spec.kinds.len())];
        let lower = rng.usize(..spec.lowers);
        let replica = rng.usize(..2);
        let upper = rng.bool();
        let way = if rng.bool() {
            Way::ToServer
        } else {
            Way::FromServer
        };
        let outage = between(&mut rng, spec.outage);
        let down = between(&mut rng, spec.down);
        let gap = between(&mut rng, spec.gap);
        let lasts = match kind {
            FaultKind::LowerApiserverStop
            | FaultKind::LowerNetworkCut
            | FaultKind::LowerErrors
            | FaultKind::OneWayPartition
            | FaultKind::UpperThrottle => outage,
            FaultKind::EtcdCompaction => Duration::ZERO,
            _ => down,
        }
        .min(spec.duration.saturating_sub(at));
        let fault = Fault {
            kind,
            at,
            lasts,
            lower,
            replica,
            upper,
            way,
        };
        let part = fault.part();
        let free = busy.get(&part).is_none_or(|until| *until <= at);
        if free {
            let room = match part {
                Part::ControlPlane(_) => RESTART_ROOM,
                _ => Duration::from_secs(2),
            };
            busy.insert(part, fault.end() + room);
            faults.push(fault);
        }
        at += gap;
    }
    faults
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(seed: u64, minutes: u64) -> PlanSpec {
        PlanSpec::new(
            seed,
            Duration::from_secs(minutes * 60),
            FaultKind::ALL.to_vec(),
        )
    }

    #[test]
    fn one_seed_gives_one_schedule_and_another_seed_another() {
        let a = plan(&spec(15, 60));
        assert_eq!(a, plan(&spec(15, 60)));
        assert!(a.len() > 100, "{} faults in an hour", a.len());
        let b = plan(&spec(16, 60));
        assert_ne!(a, b);
        // A shorter run is the start of the longer one but for faults cut at its end.
        let short = plan(&spec(15, 10));
        let cut = Duration::from_secs(600);
        for (s, l) in short.iter().zip(&a) {
            assert_eq!((s.kind, s.at, s.lower), (l.kind, l.at, l.lower));
            assert_eq!(s.lasts, l.lasts.min(cut - l.at));
        }
    }

    #[test]
    fn faults_overlap_at_random_but_never_on_one_part_and_end_with_the_run() {
        let spec = spec(7, 60);
        let faults = plan(&spec);
        let mut overlapping = 0;
        for (i, f) in faults.iter().enumerate() {
            assert!(f.at >= spec.warmup && f.end() <= spec.duration, "{f:?}");
            for g in &faults[i + 1..] {
                if g.at < f.end() {
                    overlapping += 1;
                    assert_ne!(f.part(), g.part(), "{f:?} and {g:?}");
                }
            }
        }
        assert!(overlapping > 10, "{overlapping} overlaps");
        // Every kind is drawn in an hour, and both lower clusters are hit.
        for kind in FaultKind::ALL {
            assert!(
                faults.iter().any(|f| f.kind == kind),
                "{kind:?} never drawn"
            );
        }
        assert!(faults.iter().any(|f| f.lower == 1));
        // Intervals are random: not all equal.
        let gaps: std::collections::BTreeSet<_> =
            faults.windows(2).map(|w| w[1].at - w[0].at).collect();
        assert!(gaps.len() > 20);
    }

    #[test]
    fn only_the_kinds_asked_for_are_drawn() {
        let mut spec = spec(3, 30);
        spec.kinds = vec![FaultKind::WebhookKill, FaultKind::LowerNetworkCut];
        let faults = plan(&spec);
        assert!(!faults.is_empty());
        assert!(faults.iter().all(|f| spec.kinds.contains(&f.kind)));
        spec.kinds.clear();
        assert!(plan(&spec).is_empty());
    }
}
