//! The scheduler extender's rules: does an upper pod fit on a single node of a lower cluster,
//! and how tightly (done as a kube-scheduler extender instead of the original's multi-cluster
//! scheduler plugin; see `docs/scheduler-extender.md`).
//!
//! A lower cluster is seen as [`LowerCluster`]: its nodes and their bound pods in a
//! [`CapacityModel`] (owner `""`, so every pod takes room), plus the lower pods that do not have
//! a node yet. An upper pod is judged by what its lower pod will really carry
//! ([`Demand::of_upper_pod`]: [`lower_pod`] restores nodeSelector, affinity and tolerations from
//! the `clusterSelector` annotation), with [`crate::fit`]'s predicates.
//!
//! Room already promised is taken first, in a simulated copy of the free room ([`Room`]): the
//! pending lower pods (they will be placed before ours), then the [`Reservations`] (upper pods the
//! extender admitted whose lower pod does not exist yet). Each goes where the lower scheduler
//! would put it, the fitting node kube-scheduler's `LeastAllocated` scores highest (what the
//! simulated scheduler does too); one that fits nowhere is skipped, as it will stay Pending.
//! Only then is the candidate checked ([`LowerCluster::evaluate`]). A [`RoomMemo`] keeps a
//! cluster's room and verdicts from one request to the next while they hold, so a burst
//! places only what changed.
//!
//! The score (0..=10, kube-scheduler's extender range) says how tightly the pod fits its
//! best-fitting node: the mean, over the resources it requests, of the share of that node's
//! remaining room it takes. 10 means the pod fills what is left (best fit, no fragmentation);
//! near 0 a small pod on a large, empty node.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::core::v1::{Affinity, Node, Pod, Toleration};

use crate::capacity::{CapacityError, CapacityModel};
use crate::fit::{NodeView, PodConstraints, PodRequirements, Unfit, summarize};
use crate::keys::ANNOTATION_UPPER_UID;
use crate::quantity::NANOS_PER_UNIT;
use crate::resources::{
    POD_SLOT, RESOURCE_CPU, RESOURCE_EPHEMERAL_STORAGE, RESOURCE_MEMORY, RESOURCE_PODS,
    ResourceError, ResourceVector, is_scalar_resource_name, pod_requests,
};
use crate::translate::{TranslateConfig, TranslateError, lower_pod};

/// Why an upper pod's demand cannot be computed.
#[derive(Debug, thiserror::Error)]
pub enum DemandError {
    /// The lower pod cannot be built (no name, no containers, a malformed `clusterSelector`).
    #[error(transparent)]
    Translate(#[from] TranslateError),
    /// Its requests cannot be read.
    #[error(transparent)]
    Resources(#[from] ResourceError),
}

/// What a pod asks of a lower node: its constraints and effective requests, owned so that it
/// can be kept (pending lower pods, reservations) after the pod object is gone.
#[derive(Debug, Clone, PartialEq)]
pub struct Demand {
    node_selector: Option<BTreeMap<String, String>>,
    affinity: Option<Affinity>,
    tolerations: Vec<Toleration>,
    /// Effective requests without the pod slot.
    requests: ResourceVector,
}

impl Demand {
    /// The demand of a lower pod, from its own spec.
    pub fn of_lower_pod(pod: &Pod) -> Result<Self, ResourceError> {
        let requests = pod_requests(pod)?;
        let spec = pod.spec.as_ref();
        Ok(Self {
            node_selector: spec.and_then(|s| s.node_selector.clone()),
            affinity: spec.and_then(|s| s.affinity.clone()),
            tolerations: spec.and_then(|s| s.tolerations.clone()).unwrap_or_default(),
            requests,
        })
    }

    /// The demand of the lower pod an upper pod will become ([`lower_pod`]): constraints from
    /// the `clusterSelector` annotation, none of the upper scheduler's.
    pub fn of_upper_pod(pod: &Pod) -> Result<Self, DemandError> {
        let lower = lower_pod(pod, &TranslateConfig::new(""))?;
        Ok(Self::of_lower_pod(&lower)?)
    }

    /// Effective requests, without the pod slot.
    pub fn requests(&self) -> &ResourceVector {
        &self.requests
    }

    /// Ready to be checked with [`crate::fit`].
    pub fn requirements(&self) -> PodRequirements<'_> {
        PodRequirements {
            constraints: PodConstraints::new(
                self.node_selector.as_ref(),
                self.affinity.as_ref(),
                &self.tolerations,
            ),
            requests: self.requests.clone(),
        }
    }

    /// What placing it takes from a node: requests rounded as the scheduler rounds them, plus
    /// one pod slot.
    fn usage(&self) -> ResourceVector {
        let mut usage = self.requests.scheduler_rounded();
        usage.set(RESOURCE_PODS, POD_SLOT);
        usage
    }
}

/// LeastAllocated's requests for a pod that asks for no CPU or no memory (kube-scheduler's
/// `DefaultMilliCPURequest` and `DefaultMemoryRequest`), in nano-units.
const DEFAULT_CPU_REQUEST: i128 = 100 * NANOS_PER_UNIT / 1000;
const DEFAULT_MEMORY_REQUEST: i128 = 200 * (1 << 20) * NANOS_PER_UNIT;

/// The resources every fit checks, held in fixed fields of a [`Slot`].
const BASIC: [&str; 4] = [
    RESOURCE_PODS,
    RESOURCE_CPU,
    RESOURCE_MEMORY,
    RESOURCE_EPHEMERAL_STORAGE,
];
const PODS: usize = 0;
const CPU: usize = 1;
const MEMORY: usize = 2;

/// CPU (`CPU`) in millicores, memory (`MEMORY`) in bytes, from nano-units: the units the
/// scheduler rounds them to, so the division is exact and LeastAllocated's shares are the same.
fn scored(resource: usize, nanos: i128) -> i64 {
    let unit = if resource == CPU {
        NANOS_PER_UNIT / 1000
    } else {
        NANOS_PER_UNIT
    };
    i64::try_from(nanos / unit).unwrap_or(i64::MAX)
}

/// A resource of a [`Slot`]: one of [`BASIC`] by position, or another by name.
#[derive(Debug, Clone, PartialEq)]
enum Res {
    Basic(usize),
    Other(String),
}

impl Res {
    fn name(&self) -> &str {
        match self {
            Self::Basic(i) => BASIC[*i],
            Self::Other(name) => name,
        }
    }

    fn of(name: &str) -> Self {
        match BASIC.iter().position(|b| *b == name) {
            Some(i) => Self::Basic(i),
            None => Self::Other(name.to_owned()),
        }
    }
}

/// One counted node of a [`Room`]: its free room in fixed fields, so that placing a pod or
/// judging one scans a cluster's nodes with arithmetic, not string-keyed lookups (a fleet has
/// thousands of nodes, and a burst asks for each pod).
#[derive(Debug, Clone, PartialEq)]
struct Slot {
    /// Shared: a room copies every slot of its cluster.
    name: Arc<str>,
    /// Free room of the [`BASIC`] resources, in nano-units.
    free: [i128; 4],
    /// Free room of the node's other resources (extended resources, huge pages).
    other: Vec<(String, i128)>,
    /// Allocatable and free CPU (millicores) and memory (bytes), LeastAllocated's shares:
    /// scanned for every placement, so in `i64` (`i128` division is a library call).
    allocatable: [i64; 2],
    scored_free: [i64; 2],
    /// Cordoned or tainted: its constraints are checked in full.
    constrained: bool,
}

impl Slot {
    fn of(view: &NodeView<'_>, allocatable: Option<&ResourceVector>) -> Self {
        let mut free = [0; 4];
        let mut other = Vec::new();
        for (name, amount) in view.free.iter() {
            match Res::of(name) {
                Res::Basic(i) => free[i] = amount,
                Res::Other(name) => other.push((name, amount)),
            }
        }
        let allocatable = |name| allocatable.map_or(0, |a| a.get(name));
        Self {
            name: Arc::from(view.name),
            free,
            other,
            allocatable: [
                scored(CPU, allocatable(RESOURCE_CPU)),
                scored(MEMORY, allocatable(RESOURCE_MEMORY)),
            ],
            scored_free: [scored(CPU, free[CPU]), scored(MEMORY, free[MEMORY])],
            constrained: view.unschedulable || !view.taints.is_empty(),
        }
    }

    fn get(&self, res: &Res) -> i128 {
        match res {
            Res::Basic(i) => self.free[*i],
            Res::Other(name) => self
                .other
                .iter()
                .find(|(n, _)| n == name)
                .map_or(0, |(_, a)| *a),
        }
    }

    /// Takes `usage` from the resources the node has, down to zero at most.
    fn take(&mut self, usage: &[(Res, i128)]) {
        self.change(usage, |free, amount| free.saturating_sub(amount).max(0));
    }

    /// Gives back `usage` that [`Slot::take`] took whole (see [`Asks::exact`]).
    fn give(&mut self, usage: &[(Res, i128)]) {
        self.change(usage, i128::saturating_add);
    }

    /// Sets each resource of `usage` the node has to `to(free, amount)`.
    fn change(&mut self, usage: &[(Res, i128)], to: impl Fn(i128, i128) -> i128) {
        for (res, amount) in usage {
            let free = match res {
                Res::Basic(i) => &mut self.free[*i],
                Res::Other(name) => match self.other.iter_mut().find(|(n, _)| n == name) {
                    Some((_, free)) => free,
                    None => continue,
                },
            };
            *free = to(*free, *amount);
        }
        self.scored_free = [
            scored(CPU, self.free[CPU]),
            scored(MEMORY, self.free[MEMORY]),
        ];
    }

    /// The free room as a vector, for [`PodRequirements::check`]'s reasons.
    fn free_vector(&self) -> ResourceVector {
        BASIC
            .iter()
            .zip(self.free)
            .map(|(name, amount)| ((*name).to_owned(), amount))
            .chain(self.other.iter().cloned())
            .collect()
    }
}

/// A simulated copy of a lower cluster's free room: its counted nodes, with what simulated
/// placements took from them. Built from the [`CapacityModel`] at one generation (see
/// [`LowerCluster::generation`]) and valid while it holds.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Room {
    /// The counted nodes, by name.
    slots: Vec<Slot>,
    /// How many demands were placed.
    placed: usize,
}

impl Room {
    /// The model's counted nodes, nothing placed yet: what the slots a [`LowerCluster`] keeps
    /// node by node must equal.
    #[cfg(test)]
    fn of(model: &CapacityModel) -> Self {
        Self {
            slots: model
                .nodes()
                .map(|view| Slot::of(&view, model.allocatable(view.name)))
                .collect(),
            placed: 0,
        }
    }

    /// How many demands were placed.
    pub fn placed(&self) -> usize {
        self.placed
    }

    /// Places `demand` where the lower scheduler would, kube-scheduler's `LeastAllocated`
    /// (what the simulated scheduler does too): the fitting node where the mean share of CPU
    /// and memory left free after it is highest, the first name among equals. Takes its usage
    /// from that node and returns it; `None`, and nothing taken, when it fits nowhere.
    pub fn place(&mut self, model: &CapacityModel, demand: &Demand) -> Option<String> {
        let slot = self.place_slot(model, demand)?;
        self.slots.get(slot).map(|s| s.name.to_string())
    }

    /// [`Room::place`], answering the slot taken.
    fn place_slot(&mut self, model: &CapacityModel, demand: &Demand) -> Option<usize> {
        self.place_asks(model, &Asks::new(demand))
    }

    /// Takes back a placement of `asks` on `slot` (one [`Asks::exact`] placed).
    fn unplace(&mut self, slot: usize, asks: &Asks<'_>) {
        if let Some(s) = self.slots.get_mut(slot) {
            s.give(&asks.usage);
            self.placed = self.placed.saturating_sub(1);
        }
    }

    /// [`Room::place_slot`] of what `asks` were worked out for.
    fn place_asks(&mut self, model: &CapacityModel, asks: &Asks<'_>) -> Option<usize> {
        let mut best: Option<(i64, usize)> = None;
        for (i, slot) in self.slots.iter().enumerate() {
            if asks.fits(slot, model) {
                let score = asks.least_allocated(slot);
                if best.is_none_or(|(b, _)| score > b) {
                    best = Some((score, i));
                }
            }
        }
        let index = best?.1;
        let slot = self.slots.get_mut(index)?;
        slot.take(&asks.usage);
        self.placed += 1;
        Some(index)
    }
}

/// The [`Asks`] of the demands a room places, worked out once per demand: the pods of a burst
/// ask the same few things, and a room places every pending pod and reservation of its cluster.
#[derive(Default)]
struct AsksOf<'d> {
    known: Vec<(&'d Demand, Asks<'d>)>,
}

impl<'d> AsksOf<'d> {
    /// Demands told apart, at most: past it the oldest is worked out again when it comes back.
    const MAX: usize = 16;

    fn of(&mut self, demand: &'d Demand) -> &Asks<'d> {
        let at = match self.known.iter().position(|(d, _)| *d == demand) {
            Some(at) => at,
            None => {
                if self.known.len() >= Self::MAX {
                    self.known.remove(0);
                }
                self.known.push((demand, Asks::new(demand)));
                self.known.len() - 1
            }
        };
        &self.known[at].1
    }
}

/// What a demand asks of a node, worked out once per scan instead of once per node. Its
/// [`Asks::fits`] answers what [`PodRequirements::check`] would, without building reasons.
struct Asks<'d> {
    requirements: PodRequirements<'d>,
    /// No nodeSelector and no required node affinity: only a node's cordon or taints can
    /// refuse it for something other than room.
    unconstrained: bool,
    /// The amounts [`crate::fit::check_resources`] compares: one pod slot; cpu, memory and
    /// ephemeral-storage when requested; scalar resources when not zero; rounded as the
    /// scheduler rounds them.
    fit: Vec<(Res, i128)>,
    /// The amounts [`tightness`] averages over.
    tight: Vec<(Res, i128)>,
    /// What placing it takes from a node: its rounded requests and a pod slot.
    usage: Vec<(Res, i128)>,
    /// CPU (millicores) and memory (bytes) as LeastAllocated counts them (defaults for none).
    nonzero: [i64; 2],
    /// Every resource `usage` takes is one `fit` checks: a node it fits has all of it free,
    /// so taking it clamps nothing and giving it back restores the node exactly.
    exact: bool,
}

impl<'d> Asks<'d> {
    fn new(demand: &'d Demand) -> Self {
        let requirements = demand.requirements();
        let rounded = requirements.requests.scheduler_rounded();
        let mut fit = vec![(Res::Basic(PODS), POD_SLOT)];
        for name in [RESOURCE_CPU, RESOURCE_MEMORY, RESOURCE_EPHEMERAL_STORAGE] {
            let amount = rounded.get(name);
            if amount > 0 {
                fit.push((Res::of(name), amount));
            }
        }
        fit.extend(
            rounded
                .iter()
                .filter(|(name, amount)| *amount != 0 && is_scalar_resource_name(name))
                .map(|(name, amount)| (Res::of(name), amount)),
        );
        let constraints = &requirements.constraints;
        let unconstrained = constraints.node_selector.is_none_or(BTreeMap::is_empty)
            && constraints
                .affinity
                .and_then(|a| a.node_affinity.as_ref())
                .and_then(|n| {
                    n.required_during_scheduling_ignored_during_execution
                        .as_ref()
                })
                .is_none();
        let nonzero = |name, default| {
            Some(rounded.get(name))
                .filter(|a| *a > 0)
                .unwrap_or(default)
        };
        let usage: Vec<(Res, i128)> = demand
            .usage()
            .iter()
            .map(|(name, amount)| (Res::of(name), amount))
            .collect();
        let exact = usage.iter().all(|(res, amount)| {
            *amount <= 0 || fit.iter().any(|(r, checked)| r == res && checked == amount)
        });
        Self {
            unconstrained,
            fit,
            tight: tight_amounts(&rounded)
                .into_iter()
                .map(|(name, amount)| (Res::of(&name), amount))
                .collect(),
            usage,
            exact,
            nonzero: [
                scored(CPU, nonzero(RESOURCE_CPU, DEFAULT_CPU_REQUEST)),
                scored(MEMORY, nonzero(RESOURCE_MEMORY, DEFAULT_MEMORY_REQUEST)),
            ],
            requirements,
        }
    }

    /// Whether the demand fits the node.
    fn fits(&self, slot: &Slot, model: &CapacityModel) -> bool {
        if (slot.constrained || !self.unconstrained)
            && !model
                .node(&slot.name)
                .is_some_and(|view| self.requirements.constraints.check(&view).is_empty())
        {
            return false;
        }
        self.fit
            .iter()
            .all(|(res, amount)| *amount <= slot.get(res))
    }

    /// [`tightness`] on the node.
    fn tightness(&self, slot: &Slot) -> f64 {
        mean_share(&self.tight, |res| slot.get(res))
    }

    /// kube-scheduler's `LeastAllocated` score of the node for it, 0..=100: per CPU and
    /// memory, the share of allocatable left free once it is placed, averaged.
    fn least_allocated(&self, slot: &Slot) -> i64 {
        let left = |i: usize| {
            let (allocatable, want, free) = (
                slot.allocatable[i - CPU],
                self.nonzero[i - CPU],
                slot.scored_free[i - CPU],
            );
            if allocatable <= 0 || want > free {
                0
            } else {
                (free - want).saturating_mul(100) / allocatable
            }
        };
        (left(CPU) + left(MEMORY)) / 2
    }
}

/// Of scheduler-rounded requests, those [`tightness`] averages over: cpu, memory,
/// ephemeral-storage and scalar resources, when requested.
fn tight_amounts(rounded: &ResourceVector) -> Vec<(String, i128)> {
    rounded
        .iter()
        .filter(|(name, amount)| {
            *amount > 0
                && (matches!(
                    *name,
                    RESOURCE_CPU | RESOURCE_MEMORY | RESOURCE_EPHEMERAL_STORAGE
                ) || is_scalar_resource_name(name))
        })
        .map(|(name, amount)| (name.to_owned(), amount))
        .collect()
}

/// How tightly a pod with `requests` fits a node with `free` room (it must fit): the mean share
/// of the remaining room it takes, over the resources it requests (cpu, memory,
/// ephemeral-storage and scalar resources; its pod slot when it requests none of them).
/// 1.0 fills the node.
pub fn tightness(requests: &ResourceVector, free: &ResourceVector) -> f64 {
    let tight: Vec<(Res, i128)> = tight_amounts(&requests.scheduler_rounded())
        .into_iter()
        .map(|(name, amount)| (Res::of(&name), amount))
        .collect();
    mean_share(&tight, |res| free.get(res.name()))
}

/// The mean share of the free room of each resource that its amount takes (`free` of a
/// resource); the pod slot's share when there is none.
fn mean_share(tight: &[(Res, i128)], free: impl Fn(&Res) -> i128) -> f64 {
    if tight.is_empty() {
        return share(POD_SLOT, free(&Res::Basic(PODS)));
    }
    let sum: f64 = tight
        .iter()
        .map(|(res, amount)| share(*amount, free(res)))
        .sum();
    sum / tight.len() as f64
}

fn share(used: i128, free: i128) -> f64 {
    if free <= 0 {
        1.0
    } else {
        (used as f64 / free as f64).clamp(0.0, 1.0)
    }
}

/// The extender score (0..=10) of a fit of the given [`tightness`].
pub fn score(tightness: f64) -> i64 {
    (tightness * 10.0).round().clamp(0.0, 10.0) as i64
}

/// Whether a lower cluster can take a pod.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// It fits on `node`, with this score (0..=10, 10 the tightest fit).
    Fits {
        /// The best-fitting lower node.
        node: String,
        /// The extender score.
        score: i64,
    },
    /// No single node can take it.
    Fails {
        /// kube-scheduler-like, naming the cluster: `lower cluster c1: 0/3 nodes are
        /// available: 3 Insufficient cpu.`
        reason: String,
        /// No node would take it even empty of pods (every node fails a constraint: selector,
        /// affinity, taint, cordon), so preempting pods cannot help.
        unresolvable: bool,
    },
    /// It cannot be judged now: the lower cluster is not listed yet or unreachable, or the
    /// upper node is not known yet. Refused, and the pod should be asked about again soon:
    /// what would change the answer happens outside the upper cluster, where kube-scheduler
    /// does not look for a reason to retry.
    Unsure {
        /// Naming the cluster (or node), and saying the pod is retried.
        reason: String,
    },
}

impl Verdict {
    /// Whether it fits.
    pub fn fits(&self) -> bool {
        matches!(self, Self::Fits { .. })
    }

    /// A refusal's reason, and whether it is unresolvable; `None` when it fits.
    pub fn refusal(&self) -> Option<(&str, bool)> {
        match self {
            Self::Fits { .. } => None,
            Self::Fails {
                reason,
                unresolvable,
            } => Some((reason, *unresolvable)),
            Self::Unsure { reason } => Some((reason, false)),
        }
    }
}

/// The longest error [`retry_error`] writes (kube-scheduler puts it in the pod's condition).
const RETRY_ERROR_MAX: usize = 1024;

/// The error `/filter` answers instead of its lists when no candidate node passes and some of
/// them could not be judged ([`Verdict::Unsure`]); `None` otherwise (`kept`: how many pass).
///
/// kube-scheduler parks a pod that every node refused until something changes in the upper
/// cluster (an extender that filters nodes out brings a pod back on any change there). What
/// would change an unsure answer happens in a lower cluster or in the extender itself (a
/// cluster listed, reachable again), so the pod could wait up to its five-minute flush in a
/// quiet cluster. An error is retried on the pod's back-off (1 s doubling to 10 s) instead.
/// It names each refused node with its reason, up to [`RETRY_ERROR_MAX`] bytes.
pub fn retry_error<'a>(
    kept: usize,
    refused: impl IntoIterator<Item = (&'a str, &'a Verdict)>,
) -> Option<String> {
    if kept > 0 {
        return None;
    }
    let mut unsure = false;
    let mut parts = Vec::new();
    for (node, verdict) in refused {
        let reason = match verdict {
            Verdict::Fits { .. } => return None,
            Verdict::Fails { reason, .. } => reason,
            Verdict::Unsure { reason } => {
                unsure = true;
                reason
            }
        };
        parts.push(format!("{node}: {reason}"));
    }
    if !unsure {
        return None;
    }
    let mut out =
        String::from("no virtual node can take the pod now, and some cannot be judged yet: ");
    let total = parts.len();
    for (i, part) in parts.iter().enumerate() {
        if i > 0 && out.len() + part.len() + 2 > RETRY_ERROR_MAX {
            out.push_str(&format!("; and {} more", total - i));
            break;
        }
        if i > 0 {
            out.push_str("; ");
        }
        out.push_str(part);
    }
    Some(out)
}

/// Namespace and name of a pod.
type PodKey = (String, String);

/// A lower pod waiting for a node.
#[derive(Debug, Clone)]
struct Waiting {
    /// `spec.priority`: the lower scheduler takes higher ones first.
    priority: i32,
    /// When it was first seen, among the cluster's pending pods.
    arrival: u64,
    demand: Demand,
}

/// What the extender knows of one lower cluster: nodes and bound pods (in a [`CapacityModel`]
/// where every pod counts), lower pods without a node, and which upper pods (by UID) have a
/// lower pod already.
#[derive(Debug, Clone)]
pub struct LowerCluster {
    model: CapacityModel,
    /// Lower pods without a node, with their place in the lower scheduler's queue.
    pending: BTreeMap<PodKey, Waiting>,
    /// Counts the pending pods seen, for their order of arrival.
    arrivals: u64,
    /// Lower pods carrying [`ANNOTATION_UPPER_UID`], by pod and by UID.
    uid_of: HashMap<PodKey, String>,
    by_uid: HashMap<String, PodKey>,
    /// A hash of what the rules read of each node and pod, to tell a change that matters from
    /// a heartbeat or a status update.
    node_marks: HashMap<String, u64>,
    pod_marks: HashMap<PodKey, u64>,
    generation: u64,
    /// The counted nodes as [`Slot`]s, in name order, kept in step with the model node by
    /// node: a room starts from a copy of them instead of reading every node's resources.
    slots: BTreeMap<String, Slot>,
    /// Rooms built from scratch (by [`Self::verdict`]).
    rooms_built: u64,
}

impl Default for LowerCluster {
    fn default() -> Self {
        Self::new()
    }
}

impl LowerCluster {
    /// An empty cluster.
    pub fn new() -> Self {
        Self {
            model: CapacityModel::new(String::new()),
            pending: BTreeMap::new(),
            arrivals: 0,
            uid_of: HashMap::new(),
            by_uid: HashMap::new(),
            node_marks: HashMap::new(),
            pod_marks: HashMap::new(),
            generation: 0,
            slots: BTreeMap::new(),
            rooms_built: 0,
        }
    }

    /// How many rooms [`Self::verdict`] built from scratch: the rest of its answers came
    /// from a kept [`RoomMemo`].
    pub fn rooms_built(&self) -> u64 {
        self.rooms_built
    }

    /// Brings node `name`'s slot in step with the model.
    fn refresh_slot(&mut self, name: &str) {
        let slot = self
            .model
            .node(name)
            .map(|view| Slot::of(&view, self.model.allocatable(name)));
        match slot {
            Some(slot) => {
                self.slots.insert(name.to_owned(), slot);
            }
            None => {
                self.slots.remove(name);
            }
        }
    }

    /// Changes whenever something the rules read changes (a node's labels, taints,
    /// schedulability, readiness or allocatable; a pod's spec, binding, phase being terminal,
    /// deletion or upper UID), and only then: a [`Room`] computed at one generation stays valid
    /// while it holds.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Records the mark of an object; bumps the generation when it differs.
    fn mark<K: std::hash::Hash + Eq>(
        marks: &mut HashMap<K, u64>,
        generation: &mut u64,
        key: K,
        mark: Option<u64>,
    ) {
        let changed = match mark {
            Some(m) => marks.insert(key, m) != Some(m),
            None => marks.remove(&key).is_some(),
        };
        if changed {
            *generation += 1;
        }
    }

    /// The capacity model (every pod counts).
    pub fn model(&self) -> &CapacityModel {
        &self.model
    }

    /// Applies an added or changed lower node.
    pub fn apply_node(&mut self, node: &Node) -> Result<(), CapacityError> {
        let result = self.model.apply_node(node);
        if let Some(name) = node.metadata.name.clone() {
            self.refresh_slot(&name);
            let status = node.status.as_ref();
            let ready = status
                .and_then(|s| s.conditions.as_ref())
                .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
                .map(|c| c.status.as_str());
            let mark = hash_json(&(
                &node.metadata.labels,
                &node.spec,
                status.map(|s| (&s.allocatable, &s.capacity)),
                ready,
            ));
            Self::mark(&mut self.node_marks, &mut self.generation, name, Some(mark));
        }
        result
    }

    /// Applies a lower node deletion.
    pub fn remove_node(&mut self, name: &str) {
        self.model.remove_node(name);
        self.refresh_slot(name);
        Self::mark(
            &mut self.node_marks,
            &mut self.generation,
            name.to_owned(),
            None,
        );
    }

    /// Applies an added or changed lower pod. A bound, non-terminal pod takes room on its node;
    /// an unbound one that is neither terminal nor being deleted waits for a node. Returns the
    /// upper UID the pod carries, if any: the upper pod's reservation can go, its lower pod now
    /// counts by itself. An error says what of the pod could not be read.
    pub fn apply_pod(&mut self, pod: &Pod) -> (Option<String>, Result<(), CapacityError>) {
        let key = (
            pod.metadata.namespace.clone().unwrap_or_default(),
            pod.metadata.name.clone().unwrap_or_default(),
        );
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        let terminal = matches!(phase, Some("Succeeded" | "Failed"));
        let mark = hash_json(&(
            &pod.spec,
            terminal,
            pod.metadata.deletion_timestamp.is_some(),
            pod.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(ANNOTATION_UPPER_UID)),
        ));
        // The same mark (a status update) leaves the pod's node and requests as they were: its
        // node's slot needs no refresh.
        let changed = self.pod_marks.get(&key) != Some(&mark);
        let was_on = changed
            .then(|| self.model.node_of_pod(&key).map(str::to_owned))
            .flatten();
        let result = self.model.apply_pod(pod);
        if result == Err(CapacityError::MissingName { kind: "pod" }) {
            return (None, result);
        }
        if changed {
            let now_on = self.model.node_of_pod(&key).map(str::to_owned);
            for node in was_on.iter().chain(&now_on) {
                self.refresh_slot(node);
            }
        }
        Self::mark(
            &mut self.pod_marks,
            &mut self.generation,
            key.clone(),
            Some(mark),
        );
        let unbound = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .is_none_or(str::is_empty);
        let waiting = unbound && !terminal && pod.metadata.deletion_timestamp.is_none();
        match waiting.then(|| Demand::of_lower_pod(pod).ok()).flatten() {
            Some(demand) => {
                let priority = pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0);
                let arrival = match self.pending.get(&key) {
                    Some(w) => w.arrival,
                    None => {
                        self.arrivals += 1;
                        self.arrivals
                    }
                };
                self.pending.insert(
                    key.clone(),
                    Waiting {
                        priority,
                        arrival,
                        demand,
                    },
                );
            }
            None => {
                self.pending.remove(&key);
            }
        }
        let uid = pod
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ANNOTATION_UPPER_UID))
            .filter(|u| !u.is_empty())
            .cloned();
        self.forget_uid(&key);
        if let Some(uid) = &uid {
            self.uid_of.insert(key.clone(), uid.clone());
            self.by_uid.insert(uid.clone(), key);
        }
        (uid, result)
    }

    /// Applies a lower pod deletion.
    pub fn remove_pod(&mut self, namespace: &str, name: &str) {
        let key = (namespace.to_owned(), name.to_owned());
        let was_on = self.model.node_of_pod(&key).map(str::to_owned);
        self.model.remove_pod(namespace, name);
        if let Some(node) = was_on {
            self.refresh_slot(&node);
        }
        self.pending.remove(&key);
        self.forget_uid(&key);
        Self::mark(&mut self.pod_marks, &mut self.generation, key, None);
    }

    fn forget_uid(&mut self, key: &PodKey) {
        if let Some(uid) = self.uid_of.remove(key)
            && self.by_uid.get(&uid) == Some(key)
        {
            self.by_uid.remove(&uid);
        }
    }

    /// Whether a lower pod of the upper pod with this UID exists.
    pub fn has_upper_uid(&self, uid: &str) -> bool {
        self.by_uid.contains_key(uid)
    }

    /// The lower pods waiting for a node.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// The free room after the pending lower pods took theirs, each placed where the lower
    /// scheduler would put it, in the order its queue takes them: higher priority first, then
    /// first come (those that fit nowhere are skipped).
    pub fn room(&self) -> Room {
        self.room_logged().0
    }

    /// [`Self::room`], with each pending pod in the order placed: its key, priority and the
    /// slot it took.
    fn room_logged(&self) -> (Room, VecDeque<PlacedPending>) {
        let mut room = Room {
            slots: self.slots.values().cloned().collect(),
            placed: 0,
        };
        let mut queue: Vec<(&PodKey, &Waiting)> = self.pending.iter().collect();
        queue.sort_by_key(|(_, w)| (std::cmp::Reverse(w.priority), w.arrival));
        let mut asks = AsksOf::default();
        let log = queue
            .into_iter()
            .map(|(key, waiting)| PlacedPending {
                key: key.clone(),
                priority: waiting.priority,
                slot: room.place_asks(&self.model, asks.of(&waiting.demand)),
            })
            .collect();
        (room, log)
    }

    /// Whether cluster `id` can take the pod with `demand` on a single node, after the pending
    /// lower pods and then the `reserved` demands took their room (see the module docs).
    pub fn evaluate<'d>(
        &self,
        id: &str,
        reserved: impl IntoIterator<Item = &'d Demand>,
        demand: &Demand,
    ) -> Verdict {
        let mut room = self.room();
        let mut asks = AsksOf::default();
        for promised in reserved {
            room.place_asks(&self.model, asks.of(promised));
        }
        self.judge(id, &room, demand)
    }

    /// Whether cluster `id` can take the pod with `demand` on a single node of `room` (a room
    /// of this cluster at its current generation, with what is promised already placed).
    pub fn judge(&self, id: &str, room: &Room, demand: &Demand) -> Verdict {
        let asks = Asks::new(demand);
        let mut best: Option<(f64, &str)> = None;
        for slot in &room.slots {
            if asks.fits(slot, &self.model) {
                let t = asks.tightness(slot);
                // The tightest; the first name among equals.
                if best.is_none_or(|(b, _)| t > b) {
                    best = Some((t, &*slot.name));
                }
            }
        }
        if let Some((t, node)) = best {
            return Verdict::Fits {
                node: node.to_owned(),
                score: score(t),
            };
        }
        let total = room.slots.len();
        if total == 0 {
            return Verdict::Fails {
                reason: format!("lower cluster {id}: no nodes available to schedule pods"),
                unresolvable: false,
            };
        }
        // It fits nowhere: only now are the reasons worked out, node by node, for the message.
        let unfit: Vec<Vec<Unfit>> = room
            .slots
            .iter()
            .filter_map(|slot| self.unfit_on(slot, &asks, true))
            .collect();
        let unresolvable = unfit.iter().all(|reasons| {
            reasons
                .iter()
                .any(|u| !matches!(u, Unfit::InsufficientResource { .. }))
        });
        let mut reason = format!(
            "lower cluster {id}: {}",
            summarize(total, unfit.iter().map(Vec::as_slice))
        );
        let counted = room.placed();
        if counted > 0 && !unresolvable {
            reason.push_str(&format!(
                " ({counted} pod(s) not yet on a lower node counted first)"
            ));
        }
        Verdict::Fails {
            reason,
            unresolvable,
        }
    }

    /// Why the demand of `asks` does not fit `slot`, as [`PodRequirements::check`] says it of
    /// the node with the slot's room; `None` when it fits. With `from_slot`, and neither the
    /// node nor the demand constrained (as [`Asks::fits`] tells them apart), only room can
    /// refuse it, and the reasons come from the slot's fields: a cluster that takes no pod of
    /// a burst's size answers each of them, over every node.
    fn unfit_on(&self, slot: &Slot, asks: &Asks<'_>, from_slot: bool) -> Option<Vec<Unfit>> {
        if from_slot && !slot.constrained && asks.unconstrained {
            let unfit: Vec<Unfit> = asks
                .fit
                .iter()
                .filter(|(res, amount)| *amount > slot.get(res))
                .map(|(res, amount)| Unfit::InsufficientResource {
                    resource: res.name().to_owned(),
                    requested: *amount,
                    free: slot.get(res),
                })
                .collect();
            return (!unfit.is_empty()).then_some(unfit);
        }
        let free = slot.free_vector();
        let view = self.model.node(&slot.name)?;
        asks.requirements
            .check(&NodeView {
                free: &free,
                ..view
            })
            .err()
    }

    /// Whether cluster `id` can take the pod with `demand`, after its pending lower pods and
    /// its [`Reservations`] (except the pod `except`'s own) took their room, using and keeping
    /// up `memo`, the room and verdicts of earlier requests.
    pub fn verdict(
        &mut self,
        id: &str,
        reservations: &Reservations,
        except: Option<&str>,
        demand: &Demand,
        memo: &mut Option<RoomMemo>,
    ) -> Verdict {
        if except.is_some_and(|uid| reservations.holds(uid, id)) {
            // Judged without its own reservation: a room of its own, not kept.
            self.rooms_built += 1;
            return self.evaluate(id, reservations.of_cluster(id, except), demand);
        }
        let (generation, removals) = (self.generation, reservations.removals(id));
        let memo = match memo {
            Some(m) if m.generation == generation && m.removals == removals => m,
            _ => {
                self.rooms_built += 1;
                let (room, pending) = self.room_logged();
                memo.insert(RoomMemo {
                    generation,
                    removals,
                    last: 0,
                    room,
                    pending,
                    reserved: VecDeque::new(),
                    verdicts: Vec::new(),
                })
            }
        };
        let mut placed = false;
        let mut asks = AsksOf::default();
        for (seq, _, reserved) in reservations.after(id, memo.last) {
            let slot = memo.room.place_asks(&self.model, asks.of(reserved));
            memo.reserved.push_back((seq, slot));
            memo.last = seq;
            placed = true;
        }
        if placed {
            memo.verdicts.clear();
        }
        if let Some((_, verdict)) = memo.verdicts.iter().find(|(d, _)| d == demand) {
            return verdict.clone();
        }
        let verdict = self.judge(id, &memo.room, demand);
        if memo.verdicts.len() >= MEMO_VERDICTS {
            memo.verdicts.remove(0);
        }
        memo.verdicts.push((demand.clone(), verdict.clone()));
        verdict
    }

    /// [`Self::apply_pod`], then releases the reservation of the upper pod the lower pod
    /// carries (it now counts by itself), returning it; and keeps `memo` current when the
    /// change only confirms what its room predicted (see [`RoomMemo`]). During a burst these
    /// are most lower pod events: without them every bind would rebuild the cluster's room.
    pub fn apply_pod_keeping(
        &mut self,
        id: &str,
        pod: &Pod,
        reservations: &mut Reservations,
        memo: &mut Option<RoomMemo>,
    ) -> (Option<Reservation>, Result<(), CapacityError>) {
        let key = (
            pod.metadata.namespace.clone().unwrap_or_default(),
            pod.metadata.name.clone().unwrap_or_default(),
        );
        let kept = memo
            .take()
            .filter(|m| m.generation == self.generation && m.removals == reservations.removals(id));
        // Judged before the change: the pod was first in line and is now bound, unchanged
        // otherwise, to the node the room put it on.
        let head_bound = kept.as_ref().is_some_and(|m| {
            m.pending.front().is_some_and(|head| {
                let placed = head.slot.and_then(|i| m.room.slots.get(i));
                head.key == key
                    && placed.is_some_and(|s| Some(&*s.name) == self.model.bound_node_of(pod))
                    && pod.metadata.deletion_timestamp.is_none()
                    && self
                        .pending
                        .get(&key)
                        .is_some_and(|w| Demand::of_lower_pod(pod).is_ok_and(|d| d == w.demand))
            })
        });
        let arrived = !self.pod_marks.contains_key(&key);
        let generation = self.generation;
        let (uid, result) = self.apply_pod(pod);
        let released = uid.as_deref().and_then(|u| reservations.release(u));
        let Some(mut m) = kept else {
            return (released, result);
        };
        let own_released = released.as_ref().is_some_and(|r| r.cluster == id);
        // Nothing the rules read changed (a status update: scheduled, started, ready): the
        // room holds as it is. A lower pod has several of these on its way to Running.
        let confirmed = if self.generation == generation && !own_released {
            true
        } else if head_bound && !own_released {
            m.pending.pop_front();
            // It counts on its node now, no longer among the pods placed ahead (which a
            // failure's reason counts).
            m.room.placed = m.room.placed.saturating_sub(1);
            m.verdicts
                .retain(|(_, v)| matches!(v, Verdict::Fits { .. }));
            true
        } else if arrived && let Some(waiting) = self.pending.get(&key) {
            // A new pod in line: it is placed after every pending one (last in the queue)
            // and before every reservation. Lower pods arrive in the order a virtual node's
            // workers create them, not the order of their binds.
            let last_in_line = m
                .pending
                .back()
                .is_none_or(|p| waiting.priority <= p.priority);
            let own = released.as_ref().filter(|r| r.cluster == id);
            let slot = if last_in_line {
                m.put_ahead_of_reservations(&self.model, reservations, id, own, &waiting.demand)
            } else {
                None
            };
            if let Some(slot) = slot {
                m.pending.push_back(PlacedPending {
                    key,
                    priority: waiting.priority,
                    slot,
                });
            }
            slot.is_some()
        } else {
            false
        };
        if confirmed {
            m.generation = self.generation;
            m.removals = reservations.removals(id);
            *memo = Some(m);
        }
        (released, result)
    }
}

/// A pending lower pod placed in a [`RoomMemo`]'s room.
#[derive(Debug, Clone)]
struct PlacedPending {
    key: PodKey,
    priority: i32,
    /// The slot it took; `None` when it fit nowhere.
    slot: Option<usize>,
}

/// How many verdicts a [`RoomMemo`] keeps.
const MEMO_VERDICTS: usize = 32;

/// A cluster's [`Room`] with its pending lower pods and reservations placed, kept from one
/// request to the next while its generation holds and none of the reservations it placed went
/// away (during a burst a request places only the reservations made since), with the verdicts
/// it gave, by demand: the replicas of a workload ask the same, and `prioritize` asks what
/// `filter` just asked.
///
/// It is also kept across the lower pod events that confirm it
/// ([`LowerCluster::apply_pod_keeping`]): the pod first in line bound where the room put it,
/// and a reservation's lower pod arriving last in line while its reservation was the first
/// placed. Either way a room built from scratch is the same room.
#[derive(Debug, Clone)]
pub struct RoomMemo {
    generation: u64,
    /// [`Reservations::removals`] of the cluster when the room was made.
    removals: u64,
    /// The number of the last reservation placed.
    last: u64,
    room: Room,
    /// The pending lower pods placed, in queue order.
    pending: VecDeque<PlacedPending>,
    /// The reservations placed, in order: number and slot taken.
    reserved: VecDeque<(u64, Option<usize>)>,
    verdicts: Vec<(Demand, Verdict)>,
}

impl RoomMemo {
    /// Keeps the room in step when a pending lower pod of `demand` joins the end of the
    /// line, placed before every reservation, and `gone` (the reservation its arrival
    /// released, when it was this cluster's) leaves: the reservations placed are taken back
    /// from the first whose turn brings another demand than before, and placed again after
    /// it; before that point each demand meets the same room and takes the same slot, so the
    /// room is the one a rebuild would make. Answers the new pod's slot; `None` when a
    /// placement cannot be taken back exactly (the memo is then dropped and rebuilt).
    fn put_ahead_of_reservations(
        &mut self,
        model: &CapacityModel,
        reservations: &Reservations,
        id: &str,
        gone: Option<&Reservation>,
        demand: &Demand,
    ) -> Option<Option<usize>> {
        // The reservations placed, in order, with their demands.
        let mut current = reservations
            .after(id, 0)
            .take_while(|(seq, _, _)| *seq <= self.last)
            .peekable();
        let mut placed: Vec<(u64, &Demand, Option<usize>)> = Vec::new();
        for &(seq, slot) in &self.reserved {
            let d = match gone.filter(|g| g.seq == seq) {
                Some(g) => &g.demand,
                None => {
                    let (at, _, d) = current.next()?;
                    if at != seq {
                        return None;
                    }
                    d
                }
            };
            placed.push((seq, d, slot));
        }
        // The new order: the pod, then the reservations placed but `gone`.
        let order: Vec<(Option<u64>, &Demand)> = std::iter::once((None, demand))
            .chain(
                placed
                    .iter()
                    .filter(|(seq, _, _)| gone.is_none_or(|g| g.seq != *seq))
                    .map(|(seq, d, _)| (Some(*seq), *d)),
            )
            .collect();
        let same = order
            .iter()
            .zip(&placed)
            .take_while(|((_, new), (_, old, _))| new == old)
            .count();
        let mut asks = AsksOf::default();
        for (_, d, slot) in placed[same..].iter().rev() {
            if let Some(slot) = *slot {
                let a = asks.of(d);
                if !a.exact {
                    return None;
                }
                self.room.unplace(slot, a);
            }
        }
        let slots: Vec<Option<usize>> = placed[..same]
            .iter()
            .map(|(_, _, slot)| *slot)
            .chain(
                order[same..]
                    .iter()
                    .map(|(_, d)| self.room.place_asks(model, asks.of(d)))
                    .collect::<Vec<_>>(),
            )
            .collect();
        if same < order.len() {
            self.verdicts.clear();
        }
        self.reserved = order
            .iter()
            .zip(&slots)
            .filter_map(|((seq, _), slot)| Some(((*seq)?, *slot)))
            .collect();
        slots.first().copied()
    }
}

/// A hash of a value's JSON: what changed, cheaply told apart. The JSON is written straight
/// into the hasher (every lower pod event is hashed: no string of it is built).
fn hash_json(value: &impl serde::Serialize) -> u64 {
    use std::hash::Hasher as _;
    struct Hashing(std::collections::hash_map::DefaultHasher);
    impl std::io::Write for Hashing {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.write(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut hashing = Hashing(std::collections::hash_map::DefaultHasher::new());
    // Serializing these types cannot fail; if it did, the part written still tells apart.
    let _ = serde_json::to_writer(&mut hashing, value);
    hashing.0.finish()
}

/// How long a lower cluster counts as unreachable after its watches last failed to reach it.
/// Our watches retry at most every 4 s plus a quarter of jitter (`tensile_runtime::backoff`), so
/// while an outage lasts a failure comes at least this often; once they stop, the cluster is
/// back (a quiet watch that reconnected sends no event to say so).
pub const UNREACHABLE_WINDOW: std::time::Duration = std::time::Duration::from_secs(6);

/// Whether a lower cluster answers, as its watches see it: a failure to reach it (list, watch
/// start or a broken watch) makes it unreachable until an event arrives from it or failures
/// stop for [`UNREACHABLE_WINDOW`]. An error the cluster answered with (410 Gone, say) is not
/// an outage and is not given here.
#[derive(Debug, Default, Clone)]
pub struct Outage {
    last: Option<(Instant, String)>,
}

impl Outage {
    /// A failure to reach the cluster, at `now`.
    pub fn failed(&mut self, now: Instant, error: String) {
        self.last = Some((now, error));
    }

    /// An event from the cluster: it answers.
    pub fn answered(&mut self) {
        self.last = None;
    }

    /// The last failure, while the cluster counts as unreachable at `now`.
    pub fn unreachable(&self, now: Instant) -> Option<&str> {
        self.last
            .as_ref()
            .filter(|(at, _)| now.saturating_duration_since(*at) < UNREACHABLE_WINDOW)
            .map(|(_, e)| e.as_str())
    }
}

/// Which cluster, if any, the extender judges an upper node by: a virtual node (label
/// `type=virtual-kubelet`) with a `clusterID` label. Any other node passes unchanged.
pub fn cluster_of(labels: Option<&BTreeMap<String, String>>) -> Option<&str> {
    let labels = labels?;
    let virtual_node = labels.get(crate::keys::LABEL_NODE_TYPE).map(String::as_str)
        == Some(crate::keys::VALUE_NODE_TYPE_VIRTUAL);
    if !virtual_node {
        return None;
    }
    labels
        .get(crate::keys::LABEL_CLUSTER_ID)
        .map(String::as_str)
        .filter(|id| !id.is_empty())
}

/// One `--cluster ID=PATH` flag value: the cluster id (a `clusterID` label value) and the
/// kubeconfig path.
pub fn parse_cluster_flag(value: &str) -> Result<(String, String), String> {
    let Some((id, path)) = value.split_once('=') else {
        return Err(format!(
            "{value:?}: expected ID=KUBECONFIG (the virtual node's clusterID label value, then \
             the lower cluster's kubeconfig path)"
        ));
    };
    let (id, path) = (id.trim(), path.trim());
    if id.is_empty() || !crate::keys::is_label_value(id) {
        return Err(format!(
            "{value:?}: cluster id {id:?} is not a label value (up to 63 characters of \
             [A-Za-z0-9_.-], alphanumeric at both ends)"
        ));
    }
    if path.is_empty() {
        return Err(format!("{value:?}: the kubeconfig path is empty"));
    }
    Ok((id.to_owned(), path.to_owned()))
}

/// A reservation: an upper pod the extender bound to a virtual node, whose lower pod does not
/// exist yet. Its demand counts against its cluster until the lower pod shows up or it expires.
#[derive(Debug, Clone)]
pub struct Reservation {
    /// The lower cluster.
    pub cluster: String,
    /// What the pod asks for.
    pub demand: Demand,
    /// When it lapses if no lower pod shows up.
    pub expires: Instant,
    /// Order of reservation (earlier ones are placed first).
    seq: u64,
}

/// One cluster's reservations in order, and how many of them went away.
#[derive(Debug, Clone, Default)]
struct ClusterReservations {
    /// Upper pod UIDs by reservation order.
    by_seq: BTreeMap<u64, String>,
    /// Counts releases, lapses and replacements: a room that placed the reservations stays
    /// valid while this holds, and only later ones need placing (see [`RoomMemo`]).
    removals: u64,
}

/// The reservations, by upper pod UID, kept per cluster in order and by expiry, so that no
/// request scans the reservations of the whole fleet.
#[derive(Debug, Clone, Default)]
pub struct Reservations {
    by_uid: HashMap<String, Reservation>,
    /// Never emptied of a cluster, so its removal count only grows.
    clusters: HashMap<String, ClusterReservations>,
    /// UIDs by expiry (then order), to lapse them from the front.
    by_expiry: BTreeMap<(Instant, u64), String>,
    next: u64,
}

impl Reservations {
    /// None yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Reserves room in `cluster` for the upper pod `uid` until `expires` (replacing an earlier
    /// reservation of the same pod).
    pub fn reserve(&mut self, uid: &str, cluster: &str, demand: Demand, expires: Instant) {
        self.release(uid);
        self.next += 1;
        let seq = self.next;
        self.clusters
            .entry(cluster.to_owned())
            .or_default()
            .by_seq
            .insert(seq, uid.to_owned());
        self.by_expiry.insert((expires, seq), uid.to_owned());
        self.by_uid.insert(
            uid.to_owned(),
            Reservation {
                cluster: cluster.to_owned(),
                demand,
                expires,
                seq,
            },
        );
    }

    /// Releases the reservation of `uid`, returning it.
    pub fn release(&mut self, uid: &str) -> Option<Reservation> {
        let reservation = self.by_uid.remove(uid)?;
        if let Some(cluster) = self.clusters.get_mut(&reservation.cluster) {
            cluster.by_seq.remove(&reservation.seq);
            cluster.removals += 1;
        }
        self.by_expiry
            .remove(&(reservation.expires, reservation.seq));
        Some(reservation)
    }

    /// Releases every reservation that lapsed at `now`; returns their UIDs and clusters.
    pub fn expire(&mut self, now: Instant) -> Vec<(String, String)> {
        let mut lapsed = Vec::new();
        while let Some(entry) = self.by_expiry.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let uid = entry.remove();
            if let Some(reservation) = self.release(&uid) {
                lapsed.push((uid, reservation.cluster));
            }
        }
        lapsed
    }

    /// The reservations of `cluster` after the one numbered `after` (0: all of them), in
    /// reservation order, with their numbers and upper pod UIDs.
    pub fn after(&self, cluster: &str, after: u64) -> impl Iterator<Item = (u64, &str, &Demand)> {
        self.clusters
            .get(cluster)
            .into_iter()
            .flat_map(move |c| c.by_seq.range(after.saturating_add(1)..))
            .filter_map(|(seq, uid)| {
                self.by_uid
                    .get(uid)
                    .map(|r| (*seq, uid.as_str(), &r.demand))
            })
    }

    /// How many reservations of `cluster` went away so far (released, lapsed or replaced).
    pub fn removals(&self, cluster: &str) -> u64 {
        self.clusters.get(cluster).map_or(0, |c| c.removals)
    }

    /// The reserved demands of `cluster` in reservation order, leaving out the pod `except`
    /// (the one being judged must not count against itself).
    pub fn of_cluster(&self, cluster: &str, except: Option<&str>) -> Vec<&Demand> {
        self.after(cluster, 0)
            .filter(|(_, uid, _)| Some(*uid) != except)
            .map(|(_, _, d)| d)
            .collect()
    }

    /// Whether `uid` holds a reservation.
    pub fn contains(&self, uid: &str) -> bool {
        self.by_uid.contains_key(uid)
    }

    /// Whether `uid` holds a reservation in `cluster`.
    pub fn holds(&self, uid: &str, cluster: &str) -> bool {
        self.by_uid.get(uid).is_some_and(|r| r.cluster == cluster)
    }

    /// How many reservations `cluster` holds.
    pub fn count(&self, cluster: &str) -> usize {
        self.clusters.get(cluster).map_or(0, |c| c.by_seq.len())
    }

    /// How many reservations there are.
    pub fn len(&self) -> usize {
        self.by_uid.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.by_uid.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use serde_json::json;
    use std::time::Duration;

    fn node(name: &str, cpu: &str, memory: &str, extra: serde_json::Value) -> Node {
        let mut n = json!({
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
            "spec": {},
            "status": {
                "allocatable": {"cpu": cpu, "memory": memory, "pods": "110"},
                "conditions": [{"type": "Ready", "status": "True"}]
            }
        });
        json_merge(&mut n, &extra);
        serde_json::from_value(n).unwrap()
    }

    fn json_merge(a: &mut serde_json::Value, b: &serde_json::Value) {
        match (a, b) {
            (serde_json::Value::Object(a), serde_json::Value::Object(b)) => {
                for (k, v) in b {
                    json_merge(a.entry(k.clone()).or_insert(serde_json::Value::Null), v);
                }
            }
            (a, b) => *a = b.clone(),
        }
    }

    fn pod(name: &str, cpu: &str, memory: &str, extra: serde_json::Value) -> Pod {
        let mut p = json!({
            "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}")},
            "spec": {"containers": [{"name": "c", "image": "i",
                "resources": {"requests": {"cpu": cpu, "memory": memory}}}]},
            "status": {"phase": "Pending"}
        });
        json_merge(&mut p, &extra);
        serde_json::from_value(p).unwrap()
    }

    fn bound(name: &str, node: &str, cpu: &str) -> Pod {
        pod(
            name,
            cpu,
            "0",
            json!({"spec": {"nodeName": node}, "status": {"phase": "Running"}}),
        )
    }

    fn upper(cpu: &str) -> Demand {
        Demand::of_upper_pod(&pod("web", cpu, "1Gi", json!({}))).unwrap()
    }

    fn cluster(nodes: &[(&str, &str)]) -> LowerCluster {
        let mut c = LowerCluster::new();
        for (name, cpu) in nodes {
            c.apply_node(&node(name, cpu, "8Gi", json!({}))).unwrap();
        }
        c
    }

    fn fails(v: Verdict) -> (String, bool) {
        match v {
            Verdict::Fails {
                reason,
                unresolvable,
            } => (reason, unresolvable),
            other => panic!("expected a failure, got {other:?}"),
        }
    }

    #[test]
    fn checklist_100_fits_only_on_a_single_node_with_room() {
        // 3 + 3 free cores in total, but no single node has 4.
        let c = cluster(&[("n1", "3"), ("n2", "3"), ("n3", "2")]);
        let (reason, unresolvable) = fails(c.evaluate("c1", [], &upper("4")));
        assert_eq!(
            reason,
            "lower cluster c1: 0/3 nodes are available: 3 Insufficient cpu."
        );
        assert!(!unresolvable);
        assert_eq!(
            c.evaluate("c1", [], &upper("3")),
            Verdict::Fits {
                node: "n1".into(),
                score: 6
            },
            "3 of 3 cores and 1 of 8Gi: (1 + 0.125) / 2"
        );
    }

    #[test]
    fn checklist_100_constraints_come_from_the_cluster_selector_annotation() {
        let mut c = LowerCluster::new();
        c.apply_node(&node(
            "gpu",
            "8",
            "8Gi",
            json!({"metadata": {"labels": {"accel": "gpu"}},
                "spec": {"taints": [{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}]}}),
        ))
        .unwrap();
        c.apply_node(&node("plain", "8", "8Gi", json!({}))).unwrap();
        // The upper pod's own selector (for the upper scheduler) is not what the lower pod
        // carries: without an annotation it has none, and the untainted node takes it.
        let plain = pod(
            "p",
            "1",
            "0",
            json!({"spec": {"nodeSelector": {"accel": "tpu"}}}),
        );
        let v = c.evaluate("c1", [], &Demand::of_upper_pod(&plain).unwrap());
        assert!(
            matches!(&v, Verdict::Fits { node, .. } if node == "plain"),
            "{v:?}"
        );
        // Restored from clusterSelector: selector and toleration lead to the GPU node.
        let selector = json!({"nodeSelector": {"accel": "gpu"},
            "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}]});
        let gpu = pod(
            "g",
            "1",
            "0",
            json!({"metadata": {"annotations": {"clusterSelector": selector.to_string()}}}),
        );
        let v = c.evaluate("c1", [], &Demand::of_upper_pod(&gpu).unwrap());
        assert!(
            matches!(&v, Verdict::Fits { node, .. } if node == "gpu"),
            "{v:?}"
        );
        // A selector no node matches: every node fails a constraint, unresolvable.
        let none = pod(
            "n",
            "1",
            "0",
            json!({"metadata": {"annotations": {"clusterSelector": "{\"nodeSelector\":{\"accel\":\"tpu\"}}"}}}),
        );
        let (reason, unresolvable) =
            fails(c.evaluate("c2", [], &Demand::of_upper_pod(&none).unwrap()));
        assert_eq!(
            reason,
            "lower cluster c2: 0/2 nodes are available: 1 node(s) didn't match Pod's node \
             affinity/selector, 1 node(s) had untolerated taint {dedicated: gpu}."
        );
        assert!(unresolvable);
    }

    #[test]
    fn a_malformed_cluster_selector_is_an_error_naming_the_pod() {
        let bad = pod(
            "bad",
            "1",
            "0",
            json!({"metadata": {"annotations": {"clusterSelector": "{nope"}}}),
        );
        let err = Demand::of_upper_pod(&bad).unwrap_err();
        assert!(err.to_string().starts_with("pod ns/bad: "), "{err}");
    }

    #[test]
    fn bound_pods_take_room_and_terminal_ones_give_it_back() {
        let mut c = cluster(&[("n1", "4")]);
        c.apply_pod(&bound("a", "n1", "3")).1.unwrap();
        assert!(!c.evaluate("c1", [], &upper("2")).fits());
        let mut done = bound("a", "n1", "3");
        done.status.as_mut().unwrap().phase = Some("Succeeded".into());
        c.apply_pod(&done).1.unwrap();
        assert!(c.evaluate("c1", [], &upper("2")).fits());
        c.apply_pod(&bound("b", "n1", "3")).1.unwrap();
        c.remove_pod("ns", "b");
        assert!(c.evaluate("c1", [], &upper("2")).fits());
    }

    #[test]
    fn pending_lower_pods_are_placed_first_where_the_lower_scheduler_would_put_them() {
        let mut c = cluster(&[("big", "4"), ("small", "2")]);
        // The pending pod goes to the node with the most room (big), leaving 2 + 2.
        c.apply_pod(&pod("waiting", "2", "0", json!({}))).1.unwrap();
        assert_eq!(c.pending(), 1);
        let (reason, _) = fails(c.evaluate("c1", [], &upper("3")));
        assert_eq!(
            reason,
            "lower cluster c1: 0/2 nodes are available: 2 Insufficient cpu. (1 pod(s) not yet \
             on a lower node counted first)"
        );
        assert!(c.evaluate("c1", [], &upper("2")).fits());
        // One that fits nowhere will stay Pending and takes nothing.
        c.apply_pod(&pod("huge", "64", "0", json!({}))).1.unwrap();
        assert!(c.evaluate("c1", [], &upper("2")).fits());
        // Once bound it counts on its node and is no longer pending.
        c.apply_pod(&pod(
            "waiting",
            "2",
            "0",
            json!({"spec": {"nodeName": "small"}}),
        ))
        .1
        .unwrap();
        assert_eq!(c.pending(), 1);
        assert_eq!(
            c.evaluate("c1", [], &upper("4")),
            Verdict::Fits {
                node: "big".into(),
                score: 6
            }
        );
        // Pods being deleted or finished are not waiting.
        c.apply_pod(&pod(
            "huge",
            "64",
            "0",
            json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}}),
        ))
        .1
        .unwrap();
        assert_eq!(c.pending(), 0);
    }

    #[test]
    fn reservations_count_after_pending_pods_and_not_against_their_own_pod() {
        let c = cluster(&[("n1", "4"), ("n2", "4")]);
        let mut r = Reservations::new();
        let later = Instant::now() + Duration::from_secs(60);
        r.reserve("u1", "c1", upper("3"), later);
        r.reserve("u2", "c1", upper("3"), later);
        r.reserve("other", "c2", upper("3"), later);
        assert_eq!(r.count("c1"), 2);
        assert!(
            !c.evaluate("c1", r.of_cluster("c1", None), &upper("2"))
                .fits()
        );
        assert!(
            c.evaluate("c1", r.of_cluster("c1", Some("u2")), &upper("3"))
                .fits(),
            "u2 itself is judged without its own reservation"
        );
        assert!(
            c.evaluate("c1", r.of_cluster("c1", None), &upper("1"))
                .fits()
        );
        assert!(r.release("u1").is_some());
        assert!(
            c.evaluate("c1", r.of_cluster("c1", None), &upper("2"))
                .fits()
        );
    }

    #[test]
    fn reservations_lapse_at_their_expiry_and_keep_their_order() {
        let mut r = Reservations::new();
        let now = Instant::now();
        r.reserve("a", "c1", upper("1"), now + Duration::from_secs(1));
        r.reserve("b", "c1", upper("2"), now + Duration::from_secs(5));
        r.reserve("c", "c1", upper("3"), now + Duration::from_secs(5));
        let order: Vec<&ResourceVector> = r
            .of_cluster("c1", None)
            .iter()
            .map(|d| d.requests())
            .collect();
        assert_eq!(order.len(), 3);
        assert_eq!(order[0], upper("1").requests());
        assert_eq!(order[2], upper("3").requests());
        assert_eq!(
            r.expire(now + Duration::from_secs(1)),
            vec![("a".to_owned(), "c1".to_owned())]
        );
        assert!(!r.contains("a") && r.contains("b"));
        assert_eq!(r.expire(now + Duration::from_secs(2)), vec![]);
        assert_eq!(r.expire(now + Duration::from_secs(9)).len(), 2);
        assert!(r.is_empty());
    }

    #[test]
    fn lower_pods_with_an_upper_uid_are_indexed_until_deleted() {
        let mut c = cluster(&[("n1", "4")]);
        let lower = pod(
            "web",
            "1",
            "0",
            json!({"metadata": {"annotations": {"tensile-kube.io/upper-uid": "u-1"}}}),
        );
        assert_eq!(c.apply_pod(&lower).0.as_deref(), Some("u-1"));
        assert!(c.has_upper_uid("u-1"));
        assert_eq!(c.pending(), 1, "pending, it counts by itself");
        c.remove_pod("ns", "web");
        assert!(!c.has_upper_uid("u-1"));
        assert_eq!(c.pending(), 0);
    }

    #[test]
    fn the_score_is_highest_for_the_tightest_fit() {
        let tight = cluster(&[("n1", "2")]);
        let loose = cluster(&[("n1", "16")]);
        let mut cpu_only = pod("p", "2", "0", json!({}));
        cpu_only.spec.as_mut().unwrap().containers[0].resources =
            Some(serde_json::from_value(json!({"requests": {"cpu": "2"}})).unwrap());
        let d = Demand::of_upper_pod(&cpu_only).unwrap();
        assert_eq!(
            tight.evaluate("a", [], &d),
            Verdict::Fits {
                node: "n1".into(),
                score: 10
            }
        );
        assert_eq!(
            loose.evaluate("b", [], &d),
            Verdict::Fits {
                node: "n1".into(),
                score: 1
            }
        );
        // Within a cluster, the best-fitting node is the tightest one.
        let both = cluster(&[("roomy", "16"), ("snug", "2")]);
        assert!(
            matches!(both.evaluate("c", [], &d), Verdict::Fits { node, score: 10 } if node == "snug")
        );
        // A pod that requests nothing is judged by its pod slot.
        let empty = Demand::of_upper_pod(
            &serde_json::from_value(json!({
            "metadata": {"name": "e", "namespace": "ns"},
            "spec": {"containers": [{"name": "c", "image": "i"}]}}))
            .unwrap(),
        )
        .unwrap();
        assert_eq!(
            tightness(
                empty.requests(),
                &[("pods".to_owned(), 2 * POD_SLOT)].into_iter().collect()
            ),
            0.5
        );
    }

    #[test]
    fn the_generation_moves_only_with_what_the_rules_read() {
        let mut c = cluster(&[("n1", "4")]);
        let g = c.generation();
        // A heartbeat: only the condition's times change.
        let mut n = node("n1", "4", "8Gi", json!({}));
        n.status.as_mut().unwrap().conditions.as_mut().unwrap()[0].last_heartbeat_time =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        c.apply_node(&n).unwrap();
        assert_eq!(c.generation(), g);
        c.apply_node(&node("n1", "8", "8Gi", json!({}))).unwrap();
        assert_eq!(c.generation(), g + 1);
        // A pod: created, then a status update, then bound.
        let p = pod("p", "1", "0", json!({}));
        c.apply_pod(&p).1.unwrap();
        let g = c.generation();
        let mut running = p.clone();
        running.status.as_mut().unwrap().pod_ip = Some("10.0.0.1".into());
        c.apply_pod(&running).1.unwrap();
        assert_eq!(c.generation(), g);
        c.apply_pod(&bound("p", "n1", "1")).1.unwrap();
        assert_eq!(c.generation(), g + 1);
        c.remove_pod("ns", "p");
        assert_eq!(c.generation(), g + 2);
        c.remove_pod("ns", "p");
        assert_eq!(
            c.generation(),
            g + 2,
            "removing an unknown pod changes nothing"
        );
    }

    #[test]
    fn a_room_extended_one_reservation_at_a_time_judges_as_a_fresh_one() {
        let mut c = cluster(&[("n1", "4"), ("n2", "2")]);
        c.apply_pod(&pod("waiting", "1", "0", json!({}))).1.unwrap();
        let reserved: Vec<Demand> = ["1", "2", "1"].into_iter().map(upper).collect();
        let mut room = c.room();
        assert_eq!(room.placed(), 1);
        for d in &reserved {
            room.place(c.model(), d);
        }
        for cpu in ["1", "2", "3"] {
            assert_eq!(
                c.judge("c1", &room, &upper(cpu)),
                c.evaluate("c1", &reserved, &upper(cpu)),
                "{cpu}"
            );
        }
        assert_eq!(room.placed(), 4);
    }

    #[test]
    fn a_cluster_without_nodes_says_so() {
        let c = LowerCluster::new();
        assert_eq!(
            fails(c.evaluate("c9", [], &upper("1"))).0,
            "lower cluster c9: no nodes available to schedule pods"
        );
    }

    #[test]
    fn checklist_101_only_virtual_nodes_with_a_cluster_id_are_judged() {
        let labels = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        };
        assert_eq!(
            cluster_of(Some(&labels(&[
                ("type", "virtual-kubelet"),
                ("clusterID", "c1")
            ]))),
            Some("c1")
        );
        assert_eq!(
            cluster_of(Some(&labels(&[("type", "virtual-kubelet")]))),
            None
        );
        assert_eq!(cluster_of(Some(&labels(&[("clusterID", "c1")]))), None);
        assert_eq!(
            cluster_of(Some(&labels(&[
                ("type", "virtual-kubelet"),
                ("clusterID", "")
            ]))),
            None
        );
        assert_eq!(cluster_of(None), None);
    }

    #[test]
    fn cluster_flags_are_id_equals_path() {
        assert_eq!(
            parse_cluster_flag("c1=/etc/c1.kubeconfig"),
            Ok(("c1".into(), "/etc/c1.kubeconfig".into()))
        );
        assert!(
            parse_cluster_flag("c1")
                .unwrap_err()
                .contains("expected ID=KUBECONFIG")
        );
        assert!(
            parse_cluster_flag("=x")
                .unwrap_err()
                .contains("not a label value")
        );
        assert!(
            parse_cluster_flag("a b=x")
                .unwrap_err()
                .contains("not a label value")
        );
        assert!(
            parse_cluster_flag("c1=")
                .unwrap_err()
                .contains("path is empty")
        );
    }

    #[test]
    fn placements_pick_the_node_with_most_room_first_name_among_equals() {
        let c = cluster(&[("b", "4"), ("a", "4"), ("c", "1")]);
        let cores = |cpu: &str| Demand::of_upper_pod(&pod("web", cpu, "0", json!({}))).unwrap();
        let mut room = c.room();
        let places: Vec<Option<String>> =
            (0..5).map(|_| room.place(c.model(), &cores("1"))).collect();
        let names: Vec<Option<&str>> = places.iter().map(Option::as_deref).collect();
        // a and b tie (a first), then b has more room, then they tie again; c has the least.
        assert_eq!(
            names,
            [Some("a"), Some("b"), Some("a"), Some("b"), Some("a")]
        );
        assert_eq!(
            room.place(c.model(), &cores("3")),
            None,
            "no node has 3 cores left"
        );
        assert_eq!(room.placed(), 5);
    }

    /// The lower scheduler's pick, the slow way: every node checked with the full predicates,
    /// LeastAllocated's score from the free room and allocatable, the first name among equals.
    fn reference_place(
        free: &mut BTreeMap<String, ResourceVector>,
        c: &LowerCluster,
        demand: &Demand,
    ) -> Option<String> {
        let requirements = demand.requirements();
        let rounded = demand.requests().scheduler_rounded();
        let want = |name: &str, default: i128| {
            Some(rounded.get(name))
                .filter(|a| *a > 0)
                .unwrap_or(default)
        };
        let score = |view: &NodeView<'_>| {
            let allocatable = c
                .model()
                .allocatable(view.name)
                .cloned()
                .unwrap_or_default();
            let left = |name: &str, want: i128| {
                let (have, free) = (allocatable.get(name), view.free.get(name));
                if have <= 0 || want > free {
                    0
                } else {
                    (free - want) * 100 / have
                }
            };
            (left(RESOURCE_CPU, want(RESOURCE_CPU, DEFAULT_CPU_REQUEST))
                + left(
                    RESOURCE_MEMORY,
                    want(RESOURCE_MEMORY, DEFAULT_MEMORY_REQUEST),
                ))
                / 2
        };
        let chosen = c
            .model()
            .nodes()
            .map(|view| match free.get(view.name) {
                Some(f) => NodeView { free: f, ..view },
                None => view,
            })
            .filter(|view| requirements.check(view).is_ok())
            .map(|view| (score(&view), view.name.to_owned()))
            .min_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)))?
            .1;
        let current = c.model().node_free(&chosen).cloned().unwrap_or_default();
        let current = free.get(&chosen).cloned().unwrap_or(current);
        let usage = demand.usage();
        let left = current
            .iter()
            .map(|(r, a)| (r.to_owned(), a.saturating_sub(usage.get(r)).max(0)))
            .collect();
        free.insert(chosen.clone(), left);
        Some(chosen)
    }

    /// A demand of `cpu_milli` millicores, `gib` GiB, with or without the `zone=a` selector
    /// and the `dedicated` toleration.
    fn demand_of(cpu_milli: u32, gib: u32, zone_a: bool, tolerates: bool) -> Demand {
        Demand::of_upper_pod(&demand_pod(cpu_milli, gib, zone_a, tolerates)).unwrap()
    }

    /// The lower pod `name` of an upper pod, carrying its upper UID.
    fn lower_of(upper: &Pod, name: &str, uid: &str) -> Pod {
        let mut p = lower_pod(upper, &TranslateConfig::new("")).unwrap();
        p.metadata.name = Some(name.to_owned());
        p.metadata.namespace = Some("ns".into());
        p.metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(ANNOTATION_UPPER_UID.into(), uid.into());
        p
    }

    fn demand_pod(cpu_milli: u32, gib: u32, zone_a: bool, tolerates: bool) -> Pod {
        let mut selector = serde_json::Map::new();
        if zone_a {
            selector.insert("nodeSelector".into(), json!({"zone": "a"}));
        }
        if tolerates {
            selector.insert(
                "tolerations".into(),
                json!([{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}]),
            );
        }
        let extra = if selector.is_empty() {
            json!({})
        } else {
            json!({"metadata": {"annotations": {"clusterSelector": serde_json::Value::Object(selector).to_string()}}})
        };
        pod("x", &format!("{cpu_milli}m"), &format!("{gib}Gi"), extra)
    }

    #[derive(Debug, Clone)]
    enum Op {
        Node {
            idx: u8,
            cpu: u32,
            gib: u32,
            zone_a: bool,
            tainted: bool,
        },
        Cordon(u8),
        RemoveNode(u8),
        Pending {
            idx: u8,
            cpu: u32,
        },
        Bind {
            idx: u8,
            node: u8,
        },
        RemovePod(u8),
        Reserve {
            idx: u8,
            cpu: u32,
            gib: u32,
            zone_a: bool,
        },
        Release(u8),
        /// The lower pod of reservation `u{idx}` arrives, waiting for a node.
        Arrive {
            idx: u8,
            priority: i32,
        },
        /// The pod first in line binds where the kept room put it.
        BindHead,
        Judge {
            cpu: u32,
            gib: u32,
            zone_a: bool,
            tolerates: bool,
            except: Option<u8>,
        },
    }

    fn op_strategy() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        prop_oneof![
            2 => (0u8..6, 0u32..8_000, 0u32..16, any::<bool>(), prop::bool::weighted(0.2))
                .prop_map(|(idx, cpu, gib, zone_a, tainted)| Op::Node { idx, cpu, gib, zone_a, tainted }),
            1 => (0u8..6).prop_map(Op::Cordon),
            1 => (0u8..6).prop_map(Op::RemoveNode),
            2 => (0u8..10, 0u32..3_000).prop_map(|(idx, cpu)| Op::Pending { idx, cpu }),
            2 => (0u8..10, 0u8..6).prop_map(|(idx, node)| Op::Bind { idx, node }),
            1 => (0u8..10).prop_map(Op::RemovePod),
            3 => (0u8..8, 0u32..3_000, 0u32..4, any::<bool>())
                .prop_map(|(idx, cpu, gib, zone_a)| Op::Reserve { idx, cpu, gib, zone_a }),
            1 => (0u8..8).prop_map(Op::Release),
            3 => (0u8..8, prop_oneof![4 => Just(0), 1 => Just(1)])
                .prop_map(|(idx, priority)| Op::Arrive { idx, priority }),
            3 => Just(Op::BindHead),
            6 => (0u32..4_000, 0u32..8, any::<bool>(), any::<bool>(), prop::option::of(0u8..8))
                .prop_map(|(cpu, gib, zone_a, tolerates, except)| Op::Judge { cpu, gib, zone_a, tolerates, except }),
        ]
    }

    #[test]
    fn the_kept_room_survives_the_lower_pod_events_that_confirm_it() {
        let mut c = cluster(&[("n1", "4"), ("n2", "2")]);
        let mut r = Reservations::new();
        let mut memo = None;
        let later = Instant::now() + Duration::from_secs(600);
        r.reserve("u1", "c1", demand_of(1_000, 1, false, false), later);
        r.reserve("u2", "c1", demand_of(1_000, 1, false, false), later);
        let probe = demand_of(500, 0, false, false);
        let kept = |c: &LowerCluster, r: &Reservations, memo: &Option<RoomMemo>| {
            memo.as_ref()
                .is_some_and(|m| m.generation == c.generation() && m.removals == r.removals("c1"))
        };
        c.verdict("c1", &r, None, &probe, &mut memo);
        let placed_on = |memo: &Option<RoomMemo>| {
            let m = memo.as_ref().unwrap();
            let head = m.pending.front().unwrap();
            m.room.slots[head.slot.unwrap()].name.to_string()
        };
        // u1's lower pod arrives while its reservation is the first placed: the same room.
        let a1 = lower_of(&demand_pod(1_000, 1, false, false), "a1", "u1");
        let (released, _) = c.apply_pod_keeping("c1", &a1, &mut r, &mut memo);
        assert!(released.is_some());
        assert!(kept(&c, &r, &memo));
        // The lower scheduler binds it where the room put it: the same room again.
        let mut bound_a1 = a1.clone();
        bound_a1.spec.as_mut().unwrap().node_name = Some(placed_on(&memo));
        c.apply_pod_keeping("c1", &bound_a1, &mut r, &mut memo)
            .1
            .unwrap();
        assert!(kept(&c, &r, &memo));
        // Its kubelet reports it Running: nothing the rules read changed, the room stays.
        let mut running_a1 = bound_a1.clone();
        running_a1.status = Some(
            serde_json::from_value(json!({"phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"}]}))
            .unwrap(),
        );
        c.apply_pod_keeping("c1", &running_a1, &mut r, &mut memo)
            .1
            .unwrap();
        assert!(kept(&c, &r, &memo));
        let fresh = c.evaluate("c1", r.of_cluster("c1", None), &probe);
        assert_eq!(c.verdict("c1", &r, None, &probe, &mut memo), fresh);
        assert_eq!(c.rooms_built(), 1);
        // u2's pod arrives and is bound elsewhere than predicted: the room is built again.
        let a2 = lower_of(&demand_pod(1_000, 1, false, false), "a2", "u2");
        c.apply_pod_keeping("c1", &a2, &mut r, &mut memo).1.unwrap();
        assert!(kept(&c, &r, &memo));
        let elsewhere = if placed_on(&memo) == "n1" { "n2" } else { "n1" };
        let mut bound_a2 = a2.clone();
        bound_a2.spec.as_mut().unwrap().node_name = Some(elsewhere.into());
        c.apply_pod_keeping("c1", &bound_a2, &mut r, &mut memo)
            .1
            .unwrap();
        assert!(memo.is_none());
        let fresh = c.evaluate("c1", r.of_cluster("c1", None), &probe);
        assert_eq!(c.verdict("c1", &r, None, &probe, &mut memo), fresh);
        assert_eq!(c.rooms_built(), 2);
    }

    #[test]
    fn a_lower_pod_arriving_before_earlier_reservations_keeps_the_room() {
        let mut c = cluster(&[("n1", "4"), ("n2", "2")]);
        let mut r = Reservations::new();
        let mut memo = None;
        let later = Instant::now() + Duration::from_secs(600);
        for (uid, cpu) in [("u1", 1_000), ("u2", 1_500), ("u3", 500)] {
            r.reserve(uid, "c1", demand_of(cpu, 1, false, false), later);
        }
        let probe = demand_of(500, 0, false, false);
        c.verdict("c1", &r, None, &probe, &mut memo);
        // u3's lower pod shows up first (workers create lower pods side by side): it now goes
        // before u1 and u2, whose places are taken again; the room is a rebuilt one's.
        let a3 = lower_of(&demand_pod(500, 1, false, false), "a3", "u3");
        let (released, _) = c.apply_pod_keeping("c1", &a3, &mut r, &mut memo);
        assert!(released.is_some());
        assert!(memo.is_some());
        let fresh = c.evaluate("c1", r.of_cluster("c1", None), &probe);
        assert_eq!(c.verdict("c1", &r, None, &probe, &mut memo), fresh);
        assert_eq!(memo.as_ref().unwrap().room, {
            let (mut room, _) = c.room_logged();
            for d in r.of_cluster("c1", None) {
                room.place(c.model(), d);
            }
            room
        });
        assert_eq!(c.rooms_built(), 1);
    }

    proptest::proptest! {
        /// The kept room and verdicts ([`LowerCluster::verdict`]) always answer what a room
        /// built from scratch answers, whatever nodes, lower pods and reservations came and went
        /// in between; and the indexed placement picks the node the slow rule picks.
        #[test]
        fn kept_rooms_and_verdicts_answer_as_a_room_built_from_scratch(
            ops in proptest::collection::vec(op_strategy(), 1..80)
        ) {
            let mut c = LowerCluster::new();
            let mut r = Reservations::new();
            let mut memo = None;
            let later = Instant::now() + Duration::from_secs(600);
            let mut lower: BTreeMap<String, Pod> = BTreeMap::new();
            let mut asked: BTreeMap<u8, (u32, u32, bool)> = BTreeMap::new();
            let mut cordoned = std::collections::BTreeSet::new();
            let mut nodes: BTreeMap<u8, Node> = BTreeMap::new();
            for op in ops {
                match op {
                    Op::Node { idx, cpu, gib, zone_a, tainted } => {
                        let mut extra = json!({"metadata": {"labels": {"zone": if zone_a { "a" } else { "b" }}}});
                        if tainted {
                            extra["spec"] = json!({"taints": [{"key": "dedicated", "effect": "NoSchedule"}]});
                        }
                        if cordoned.contains(&idx) {
                            extra["spec"]["unschedulable"] = json!(true);
                        }
                        let n = node(&format!("n{idx}"), &format!("{cpu}m"), &format!("{gib}Gi"), extra);
                        c.apply_node(&n).unwrap();
                        nodes.insert(idx, n);
                    }
                    Op::Cordon(idx) => {
                        cordoned.insert(idx);
                        if let Some(mut n) = nodes.get(&idx).cloned() {
                            n.spec.get_or_insert_with(Default::default).unschedulable = Some(true);
                            c.apply_node(&n).unwrap();
                        }
                    }
                    Op::RemoveNode(idx) => {
                        nodes.remove(&idx);
                        c.remove_node(&format!("n{idx}"));
                    }
                    Op::Pending { idx, cpu } => {
                        let p = pod(&format!("p{idx}"), &format!("{cpu}m"), "0", json!({}));
                        let _ = c.apply_pod_keeping("c1", &p, &mut r, &mut memo);
                        lower.insert(format!("p{idx}"), p);
                    }
                    Op::Bind { idx, node } => {
                        let p = bound(&format!("p{idx}"), &format!("n{node}"), "500m");
                        let _ = c.apply_pod_keeping("c1", &p, &mut r, &mut memo);
                        lower.insert(format!("p{idx}"), p);
                    }
                    Op::RemovePod(idx) => {
                        lower.remove(&format!("p{idx}"));
                        c.remove_pod("ns", &format!("p{idx}"));
                    }
                    Op::Reserve { idx, cpu, gib, zone_a } => {
                        r.reserve(&format!("u{idx}"), "c1", demand_of(cpu, gib, zone_a, false), later);
                        asked.insert(idx, (cpu, gib, zone_a));
                    }
                    Op::Arrive { idx, priority } => {
                        if let Some(&(cpu, gib, zone_a)) = asked.get(&idx) {
                            let name = format!("a{idx}");
                            let mut p = lower_of(&demand_pod(cpu, gib, zone_a, false), &name, &format!("u{idx}"));
                            p.spec.get_or_insert_with(Default::default).priority = Some(priority);
                            let _ = c.apply_pod_keeping("c1", &p, &mut r, &mut memo);
                            lower.insert(name, p);
                        }
                    }
                    Op::BindHead => {
                        let head = memo.as_ref().and_then(|m| {
                            let head = m.pending.front()?;
                            Some((head.key.1.clone(), m.room.slots.get(head.slot?)?.name.to_string()))
                        });
                        if let Some((name, node)) = head
                            && let Some(mut p) = lower.get(&name).cloned()
                        {
                            p.spec.get_or_insert_with(Default::default).node_name = Some(node);
                            let _ = c.apply_pod_keeping("c1", &p, &mut r, &mut memo);
                            lower.insert(name, p);
                        }
                    }
                    Op::Release(idx) => {
                        r.release(&format!("u{idx}"));
                    }
                    Op::Judge { cpu, gib, zone_a, tolerates, except } => {
                        let demand = demand_of(cpu, gib, zone_a, tolerates);
                        let except = except.map(|i| format!("u{i}"));
                        let kept = c.verdict("c1", &r, except.as_deref(), &demand, &mut memo);
                        let fresh = c.evaluate("c1", r.of_cluster("c1", except.as_deref()), &demand);
                        proptest::prop_assert_eq!(kept, fresh);
                    }
                }
                // The slots kept node by node are the ones the model gives now.
                let kept = Room { slots: c.slots.values().cloned().collect(), placed: 0 };
                proptest::prop_assert_eq!(kept, Room::of(c.model()));
            }
            // The indexed placement against the slow rule, on what the ops left.
            let mut room = c.room();
            let mut free = BTreeMap::new();
            let mut queue: Vec<&Waiting> = c.pending.values().collect();
            queue.sort_by_key(|w| (std::cmp::Reverse(w.priority), w.arrival));
            for w in queue {
                reference_place(&mut free, &c, &w.demand);
            }
            for d in r.of_cluster("c1", None) {
                let fast = room.place(c.model(), d);
                let slow = reference_place(&mut free, &c, d);
                proptest::prop_assert_eq!(fast, slow);
            }
        }
    }

    #[test]
    fn the_fast_fit_and_its_reasons_agree_with_the_full_predicates() {
        let mut c = LowerCluster::new();
        let zone = json!({"metadata": {"labels": {"zone": "a"}}});
        let tainted = json!({"metadata": {"labels": {"zone": "a"}},
            "spec": {"taints": [{"key": "dedicated", "effect": "NoSchedule"}]}});
        let gpu = json!({"metadata": {"labels": {"zone": "b"}},
            "status": {"allocatable": {"nvidia.com/gpu": "1"}}});
        for (name, cpu, extra) in [
            ("plain", "2", &zone),
            ("tainted", "2", &tainted),
            ("gpu", "2", &gpu),
            ("full", "8", &zone),
        ] {
            c.apply_node(&node(name, cpu, "4Gi", extra.clone()))
                .unwrap();
        }
        for i in 0..110 {
            c.apply_pod(&bound(&format!("f{i}"), "full", "10m"))
                .1
                .unwrap();
        }
        let gpu_pod = Demand::of_upper_pod(&pod(
            "g",
            "1",
            "0",
            json!({"spec": {"containers": [{"name": "c", "image": "i",
                "resources": {"requests": {"cpu": "1", "nvidia.com/gpu": "1"}}}]}}),
        ))
        .unwrap();
        let room = c.room();
        let mut checked = 0;
        for slot in &room.slots {
            let free = slot.free_vector();
            let view = NodeView {
                free: &free,
                ..c.model().node(&slot.name).unwrap()
            };
            let mut demands = vec![gpu_pod.clone()];
            for cpu in [0, 1_500, 2_000, 2_001] {
                for (zone_a, tolerates) in [(false, false), (true, true), (false, true)] {
                    demands.push(demand_of(cpu, 1, zone_a, tolerates));
                }
            }
            demands.push(demand_of(2_001, 8, false, false));
            for d in &demands {
                let asks = Asks::new(d);
                assert_eq!(
                    asks.fits(slot, c.model()),
                    d.requirements().check(&view).is_ok(),
                    "{d:?} on {view:?}"
                );
                assert_eq!(
                    c.unfit_on(slot, &asks, true),
                    c.unfit_on(slot, &asks, false),
                    "{d:?} on {view:?}"
                );
                checked += 1;
            }
        }
        assert_eq!(checked, 4 * 14);
    }

    #[test]
    fn a_cluster_is_unreachable_while_failures_keep_coming_and_back_at_its_first_event() {
        let t0 = Instant::now();
        let mut outage = Outage::default();
        assert_eq!(outage.unreachable(t0), None);
        outage.failed(t0, "connection refused".into());
        assert_eq!(outage.unreachable(t0), Some("connection refused"));
        let later = t0 + UNREACHABLE_WINDOW / 2;
        assert_eq!(outage.unreachable(later), Some("connection refused"));
        // Failures stopped: a reconnected quiet watch says nothing, the window says it.
        assert_eq!(outage.unreachable(t0 + UNREACHABLE_WINDOW), None);
        outage.failed(later, "reset".into());
        assert_eq!(outage.unreachable(t0 + UNREACHABLE_WINDOW), Some("reset"));
        outage.answered();
        assert_eq!(outage.unreachable(later), None);
    }

    #[test]
    fn an_error_replaces_the_refusals_only_when_no_node_passes_and_one_is_unsure() {
        let fails = |r: &str| Verdict::Fails {
            reason: r.into(),
            unresolvable: false,
        };
        let unsure = Verdict::Unsure {
            reason: "lower cluster b: not synced yet".into(),
        };
        let full = fails("lower cluster a: 0/1 nodes are available: 1 Insufficient cpu.");
        // Every refusal is a judgement: kube-scheduler waits for a change upstairs.
        assert_eq!(retry_error(0, [("vk-a", &full)]), None);
        // A node passes: the pod goes there.
        assert_eq!(retry_error(1, [("vk-a", &full), ("vk-b", &unsure)]), None);
        assert_eq!(
            retry_error(0, [("vk-a", &full), ("vk-b", &unsure)]).as_deref(),
            Some(
                "no virtual node can take the pod now, and some cannot be judged yet: vk-a: \
                 lower cluster a: 0/1 nodes are available: 1 Insufficient cpu.; vk-b: lower \
                 cluster b: not synced yet"
            )
        );
        // Bounded, whatever the number of nodes.
        let names: Vec<String> = (0..500).map(|i| format!("vk-{i}")).collect();
        let many = retry_error(0, names.iter().map(|n| (n.as_str(), &unsure))).unwrap();
        assert!(many.len() <= RETRY_ERROR_MAX + 20, "{}", many.len());
        assert!(many.ends_with(" more"), "{many}");
    }
}
