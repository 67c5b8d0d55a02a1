//! The scheduler extender's rules: does an upper pod fit on a single node of a lower cluster,
//! and how tightly (behaviour spec §8 and checklist 100-101, done as a kube-scheduler extender
//! instead of the original's multi-cluster scheduler plugin).
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
//! would put it, the fitting node with the most free room ([`spread_score`], what the simulated
//! scheduler does); one that fits nowhere is skipped, as it will stay Pending. Only then is the
//! candidate checked ([`LowerCluster::evaluate`]).
//!
//! The score (0..=10, kube-scheduler's extender range) says how tightly the pod fits its
//! best-fitting node: the mean, over the resources it requests, of the share of that node's
//! remaining room it takes. 10 means the pod fills what is left (best fit, no fragmentation);
//! near 0 a small pod on a large, empty node.

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use k8s_openapi::api::core::v1::{Affinity, Node, Pod, Toleration};

use crate::capacity::{CapacityError, CapacityModel};
use crate::fit::{NodeView, PodConstraints, PodRequirements, Unfit, summarize};
use crate::keys::ANNOTATION_UPPER_UID;
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

/// How much free room a node has, the way the simulated scheduler ranks nodes to spread pods:
/// free millicores, plus free memory (in nano-bytes over 2^20), plus 300 per free pod slot.
/// The lower scheduler puts a pod on the fitting node with the highest score.
pub fn spread_score(free: &ResourceVector) -> i128 {
    free.get(RESOURCE_CPU) / 1_000_000
        + free.get(RESOURCE_MEMORY) / (1 << 20)
        + free.get(RESOURCE_PODS) / 1_000_000_000 * 300
}

/// Of `(name, raw score)` candidates, the one a scheduler picks when it normalizes the scores
/// to 0..=100 against the largest: the highest normalized score, the first name among equals.
pub fn pick_most_free<'n>(
    candidates: impl IntoIterator<Item = (&'n str, i128)>,
) -> Option<&'n str> {
    let candidates: Vec<(&str, i128)> = candidates.into_iter().collect();
    let max = candidates.iter().map(|(_, s)| *s).max().unwrap_or(0).max(1);
    candidates
        .iter()
        .map(|(n, s)| (*n, s * 100 / max))
        .max_by(|a, b| a.1.cmp(&b.1).then_with(|| b.0.cmp(a.0)))
        .map(|(n, _)| n)
}

/// A simulated copy of a lower cluster's free room: what simulated placements took from the
/// counted nodes of a [`CapacityModel`]. It holds only the nodes something was placed on, so it
/// is cheap to keep and to extend while the model does not change (see
/// [`LowerCluster::generation`]).
#[derive(Debug, Clone, Default)]
pub struct Room {
    /// Free room of the nodes something was placed on.
    taken: BTreeMap<String, ResourceVector>,
    /// How many demands were placed.
    placed: usize,
}

impl Room {
    /// Nothing placed yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// The model's counted nodes with their simulated free room.
    pub fn nodes<'a>(
        &'a self,
        model: &'a CapacityModel,
    ) -> impl Iterator<Item = NodeView<'a>> + 'a {
        model.nodes().map(|view| match self.taken.get(view.name) {
            Some(free) => NodeView { free, ..view },
            None => view,
        })
    }

    /// How many demands were placed.
    pub fn placed(&self) -> usize {
        self.placed
    }

    /// Places `demand` where the lower scheduler would (see [`spread_score`]) and takes its
    /// usage from that node, which it returns; `None`, and nothing taken, when it fits nowhere.
    pub fn place(&mut self, model: &CapacityModel, demand: &Demand) -> Option<String> {
        let requirements = demand.requirements();
        let (chosen, free) = {
            let fitting: Vec<(&str, i128)> = self
                .nodes(model)
                .filter(|view| requirements.check(view).is_ok())
                .map(|view| (view.name, spread_score(view.free)))
                .collect();
            let chosen = pick_most_free(fitting)?.to_owned();
            let free = self
                .nodes(model)
                .find(|v| v.name == chosen)
                .map(|v| v.free.clone())?;
            (chosen, free)
        };
        let usage = demand.usage();
        let free = free
            .iter()
            .map(|(resource, amount)| {
                (
                    resource.to_owned(),
                    amount.saturating_sub(usage.get(resource)).max(0),
                )
            })
            .collect();
        self.taken.insert(chosen.clone(), free);
        self.placed += 1;
        Some(chosen)
    }
}

/// How tightly a pod with `requests` fits a node with `free` room (it must fit): the mean share
/// of the remaining room it takes, over the resources it requests (cpu, memory,
/// ephemeral-storage and scalar resources; its pod slot when it requests none of them).
/// 1.0 fills the node.
pub fn tightness(requests: &ResourceVector, free: &ResourceVector) -> f64 {
    let rounded = requests.scheduler_rounded();
    let shares: Vec<f64> = rounded
        .iter()
        .filter(|(name, amount)| {
            *amount > 0
                && (matches!(
                    *name,
                    RESOURCE_CPU | RESOURCE_MEMORY | RESOURCE_EPHEMERAL_STORAGE
                ) || is_scalar_resource_name(name))
        })
        .map(|(name, amount)| share(amount, free.get(name)))
        .collect();
    if shares.is_empty() {
        return share(POD_SLOT, free.get(RESOURCE_PODS));
    }
    shares.iter().sum::<f64>() / shares.len() as f64
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
}

impl Verdict {
    /// Whether it fits.
    pub fn fits(&self) -> bool {
        matches!(self, Self::Fits { .. })
    }
}

/// Namespace and name of a pod.
type PodKey = (String, String);

/// What the extender knows of one lower cluster: nodes and bound pods (in a [`CapacityModel`]
/// where every pod counts), lower pods without a node, and which upper pods (by UID) have a
/// lower pod already.
#[derive(Debug, Clone)]
pub struct LowerCluster {
    model: CapacityModel,
    pending: BTreeMap<PodKey, Demand>,
    /// Lower pods carrying [`ANNOTATION_UPPER_UID`], by pod and by UID.
    uid_of: HashMap<PodKey, String>,
    by_uid: HashMap<String, PodKey>,
    /// A hash of what the rules read of each node and pod, to tell a change that matters from
    /// a heartbeat or a status update.
    node_marks: HashMap<String, u64>,
    pod_marks: HashMap<PodKey, u64>,
    generation: u64,
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
            uid_of: HashMap::new(),
            by_uid: HashMap::new(),
            node_marks: HashMap::new(),
            pod_marks: HashMap::new(),
            generation: 0,
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
        let result = self.model.apply_pod(pod);
        if result == Err(CapacityError::MissingName { kind: "pod" }) {
            return (None, result);
        }
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
                self.pending.insert(key.clone(), demand);
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
        self.model.remove_pod(namespace, name);
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
    /// scheduler would put it (those that fit nowhere are skipped).
    pub fn room(&self) -> Room {
        let mut room = Room::new();
        for pending in self.pending.values() {
            room.place(&self.model, pending);
        }
        room
    }

    /// Places `demand` in `room` (a room of this cluster, see [`Self::room`]).
    pub fn place(&self, room: &mut Room, demand: &Demand) -> Option<String> {
        room.place(&self.model, demand)
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
        for promised in reserved {
            room.place(&self.model, promised);
        }
        self.judge(id, &room, demand)
    }

    /// Whether cluster `id` can take the pod with `demand` on a single node of `room` (a room
    /// of this cluster at its current generation, with what is promised already placed).
    pub fn judge(&self, id: &str, room: &Room, demand: &Demand) -> Verdict {
        let requirements = demand.requirements();
        let mut total = 0usize;
        let mut unfit: Vec<Vec<Unfit>> = Vec::new();
        let mut best: Option<(f64, &str)> = None;
        for view in room.nodes(&self.model) {
            total += 1;
            match requirements.check(&view) {
                Ok(()) => {
                    let t = tightness(&requirements.requests, view.free);
                    // The tightest; the first name among equals.
                    if best.is_none_or(|(b, _)| t > b) {
                        best = Some((t, view.name));
                    }
                }
                Err(reasons) => unfit.push(reasons),
            }
        }
        if let Some((t, node)) = best {
            return Verdict::Fits {
                node: node.to_owned(),
                score: score(t),
            };
        }
        if total == 0 {
            return Verdict::Fails {
                reason: format!("lower cluster {id}: no nodes available to schedule pods"),
                unresolvable: false,
            };
        }
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
}

/// A hash of a value's JSON: what changed, cheaply told apart.
fn hash_json(value: &impl serde::Serialize) -> u64 {
    use std::hash::{Hash as _, Hasher as _};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    serde_json::to_string(value)
        .unwrap_or_default()
        .hash(&mut hasher);
    hasher.finish()
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

/// Which cluster, if any, the extender judges an upper node by (checklist 100-101): a virtual
/// node (label `type=virtual-kubelet`) with a `clusterID` label. Any other node passes
/// unchanged.
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

/// The reservations, by upper pod UID.
#[derive(Debug, Clone, Default)]
pub struct Reservations {
    by_uid: HashMap<String, Reservation>,
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
        self.next += 1;
        self.by_uid.insert(
            uid.to_owned(),
            Reservation {
                cluster: cluster.to_owned(),
                demand,
                expires,
                seq: self.next,
            },
        );
    }

    /// Releases the reservation of `uid`, returning it.
    pub fn release(&mut self, uid: &str) -> Option<Reservation> {
        self.by_uid.remove(uid)
    }

    /// Releases every reservation that lapsed at `now`; returns their UIDs and clusters.
    pub fn expire(&mut self, now: Instant) -> Vec<(String, String)> {
        let lapsed: Vec<String> = self
            .by_uid
            .iter()
            .filter(|(_, r)| r.expires <= now)
            .map(|(uid, _)| uid.clone())
            .collect();
        lapsed
            .into_iter()
            .filter_map(|uid| self.by_uid.remove(&uid).map(|r| (uid, r.cluster)))
            .collect()
    }

    /// The reserved demands of `cluster` in reservation order, leaving out the pod `except`
    /// (the one being judged must not count against itself).
    pub fn of_cluster(&self, cluster: &str, except: Option<&str>) -> Vec<&Demand> {
        let mut list: Vec<(u64, &Demand)> = self
            .by_uid
            .iter()
            .filter(|(uid, r)| r.cluster == cluster && Some(uid.as_str()) != except)
            .map(|(_, r)| (r.seq, &r.demand))
            .collect();
        list.sort_by_key(|(seq, _)| *seq);
        list.into_iter().map(|(_, d)| d).collect()
    }

    /// The reservations of `cluster` in reservation order, with their upper pod UIDs.
    pub fn entries(&self, cluster: &str) -> Vec<(&str, &Demand)> {
        let mut list: Vec<(u64, &str, &Demand)> = self
            .by_uid
            .iter()
            .filter(|(_, r)| r.cluster == cluster)
            .map(|(uid, r)| (r.seq, uid.as_str(), &r.demand))
            .collect();
        list.sort_by_key(|(seq, _, _)| *seq);
        list.into_iter().map(|(_, uid, d)| (uid, d)).collect()
    }

    /// Whether `uid` holds a reservation.
    pub fn contains(&self, uid: &str) -> bool {
        self.by_uid.contains_key(uid)
    }

    /// How many reservations `cluster` holds.
    pub fn count(&self, cluster: &str) -> usize {
        self.by_uid
            .values()
            .filter(|r| r.cluster == cluster)
            .count()
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
            c.place(&mut room, d);
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
        assert_eq!(pick_most_free([("b", 100), ("a", 100)]), Some("a"));
        assert_eq!(pick_most_free([("b", 0), ("a", 0)]), Some("a"));
        assert_eq!(pick_most_free([("a", 50), ("b", 100)]), Some("b"));
        assert_eq!(pick_most_free([]), None);
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
}
