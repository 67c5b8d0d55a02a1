//! The live capacity model of one lower cluster: what the virtual node publishes as its
//! capacity (= allocatable), fed incrementally by node and pod watch events in any order and
//! never re-listed.
//!
//! Rules (and the original's bugs they fix, see `docs/differences.md`):
//! - a node counts when it is Ready (condition `Ready` is `True`) and not cordoned, with its
//!   **allocatable** (capacity only if allocatable is absent; the original used capacity);
//! - a pod occupies its node when it is bound (`spec.nodeName`) and not terminal (phase neither
//!   `Succeeded` nor `Failed`: a Pending bound pod counts, as for kube-scheduler). It takes its
//!   effective requests plus one pod slot, rounded like kube-scheduler rounds them (cpu to
//!   millicores, the rest to units); terminal pods give everything back (the original leaked
//!   pods that went Pending -> Failed);
//! - [`CapacityModel::total`], the published capacity, does not subtract the pods this virtual
//!   node created (label [`LABEL_OWNER`] equal to our owner value): the upper scheduler already
//!   counts them against the virtual node, and subtracting them again is the original's double
//!   count after a restart. Pods of other owners (another virtual node, another upper cluster)
//!   and ordinary pods are subtracted;
//! - the per-node views ([`CapacityModel::node_free`], [`CapacityModel::nodes`],
//!   [`CapacityModel::largest_fit`]) subtract every pod, ours included, since ours take real room
//!   on the lower node that a new pod cannot use;
//! - each node's free amount is clamped at zero per resource. Static pods or a shrunk
//!   allocatable can over-commit a node; letting its deficit go negative would hide free room on
//!   the other nodes from the upper scheduler, whereas nothing can be placed on the
//!   over-committed node anyway. The total is thus the sum of what is really free.
//!
//! Every event costs O(r log n) for r resources on the node and n nodes: per node the model
//! keeps the sums of its pods (ours apart) and its two clamped free vectors, globally the sum of
//! the published free vectors of counted nodes and, per resource, a multiset of per-node room
//! for [`CapacityModel::largest_fit`].

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Pod, Taint};

use crate::fit::NodeView;
use crate::keys::LABEL_OWNER;
use crate::resources::{
    POD_SLOT, RESOURCE_PODS, ResourceError, ResourceVector, pod_key, pod_requests,
};

/// A problem found while applying an event. The event is still applied as far as possible;
/// the error says what was left out.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CapacityError {
    /// The object has no name; it was ignored.
    #[error("{kind} without a name ignored")]
    MissingName {
        /// `node` or `pod`.
        kind: &'static str,
    },
    /// Some allocatable quantities of a node could not be read; the node counts without them.
    #[error("node {node}: unreadable allocatable resources ignored: {}", Joined(.errors))]
    NodeQuantities {
        /// The node name.
        node: String,
        /// One error per unreadable resource.
        errors: Vec<ResourceError>,
    },
    /// A pod's requests could not be read; it counts only its pod slot until it changes.
    #[error("pod {pod}: counting only its pod slot: {reason}")]
    PodRequests {
        /// `namespace/name` of the pod.
        pod: String,
        /// Why its requests could not be read.
        reason: ResourceError,
    },
}

/// Prints a list of errors separated by `; `.
struct Joined<'a>(&'a [ResourceError]);

impl fmt::Display for Joined<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, error) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{error}")?;
        }
        Ok(())
    }
}

/// What the model keeps of a node object.
#[derive(Debug, Clone)]
struct NodeState {
    labels: BTreeMap<String, String>,
    taints: Vec<Taint>,
    unschedulable: bool,
    ready: bool,
    /// Scheduler-rounded allocatable.
    allocatable: ResourceVector,
}

impl NodeState {
    fn counts(&self) -> bool {
        self.ready && !self.unschedulable
    }
}

/// A node name's bookkeeping; exists while the node or a pod bound to it is known.
#[derive(Debug, Clone, Default)]
struct NodeEntry {
    /// `None` until the node is seen (pods may come first) and after it is deleted.
    state: Option<NodeState>,
    /// Sum of the usage of the other owners' and ordinary pods bound to it.
    used: ResourceVector,
    /// Sum of the usage of our own pods bound to it.
    used_ours: ResourceVector,
    /// Number of pods bound to it (ours included).
    pods: usize,
    /// Clamped free resources, `Some` exactly when the node counts.
    free: Option<NodeFree>,
    /// Clamped room of a Ready node, cordoned or not (what a scheduler filters).
    ready_room: Option<ResourceVector>,
}

/// A counted node's free resources, each clamped at zero per resource.
#[derive(Debug, Clone)]
struct NodeFree {
    /// `allocatable - used`: its share of the published total.
    capacity: ResourceVector,
    /// `allocatable - used - used_ours`: the room left for one more pod.
    room: ResourceVector,
}

/// A counted node with its room, for the fit predicates.
fn counted_view<'a>(name: &'a str, entry: &'a NodeEntry) -> Option<NodeView<'a>> {
    Some(view(
        name,
        entry.state.as_ref()?,
        &entry.free.as_ref()?.room,
    ))
}

/// A node with the given free room, for the fit predicates.
fn view<'a>(name: &'a str, state: &'a NodeState, free: &'a ResourceVector) -> NodeView<'a> {
    NodeView {
        name,
        labels: &state.labels,
        taints: &state.taints,
        unschedulable: state.unschedulable,
        free,
    }
}

/// What a bound pod takes from its node. One per pod of the lower cluster, so kept small: the
/// node's name is the model's key of it, shared, and the requests are a boxed slice whose
/// resource names are shared by every pod ([`CapacityModel::resource_names`]). A pod's
/// `ResourceVector` was a B-tree node and a `String` per resource (about 600 bytes with
/// three resources); this is a tenth of that.
#[derive(Debug, Clone)]
struct PodEntry {
    node: Arc<str>,
    ours: bool,
    usage: Box<[(Arc<str>, i128)]>,
}

impl PodEntry {
    fn usage(&self) -> ResourceVector {
        let mut v = ResourceVector::new();
        for (name, nanos) in &self.usage {
            v.set(name.as_ref(), *nanos);
        }
        v
    }
}

/// Namespace and name of a pod.
type PodId = (String, String);

/// The capacity of one lower cluster, maintained incrementally.
#[derive(Debug, Clone)]
pub struct CapacityModel {
    owner: String,
    nodes: BTreeMap<Arc<str>, NodeEntry>,
    pods: BTreeMap<PodId, PodEntry>,
    /// The resource names pods request, each kept once for every [`PodEntry`].
    resource_names: BTreeSet<Arc<str>>,
    invalid_pods: BTreeMap<PodId, ResourceError>,
    /// Sum of the `capacity` free vectors of counted nodes; a resource is present while a
    /// counted node has it in allocatable.
    total: ResourceVector,
    /// Per resource, how many counted nodes have each `room` amount.
    room_index: BTreeMap<String, BTreeMap<i128, usize>>,
    /// What our bound pods take, over every node.
    ours: ResourceVector,
}

impl CapacityModel {
    /// An empty model. `owner` is the [`LABEL_OWNER`] value this virtual node puts on the lower
    /// pods it creates (see [`crate::keys::owner_label_value`]); those pods are not subtracted
    /// from [`Self::total`].
    pub fn new(owner: impl Into<String>) -> Self {
        Self {
            owner: owner.into(),
            nodes: BTreeMap::new(),
            pods: BTreeMap::new(),
            resource_names: BTreeSet::new(),
            invalid_pods: BTreeMap::new(),
            total: ResourceVector::new(),
            room_index: BTreeMap::new(),
            ours: ResourceVector::new(),
        }
    }

    /// The owner label value given at construction.
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// Applies an added or updated node. Unreadable allocatable quantities are left out and
    /// reported; the rest of the node counts.
    pub fn apply_node(&mut self, node: &Node) -> Result<(), CapacityError> {
        let Some(name) = node.metadata.name.as_deref().filter(|n| !n.is_empty()) else {
            return Err(CapacityError::MissingName { kind: "node" });
        };
        let status = node.status.as_ref();
        let resources = status
            .and_then(|s| s.allocatable.as_ref())
            .filter(|a| !a.is_empty())
            .or_else(|| status.and_then(|s| s.capacity.as_ref()));
        let (allocatable, errors) = match resources {
            Some(map) => ResourceVector::from_quantities_lenient(map),
            None => (ResourceVector::new(), Vec::new()),
        };
        let ready = status
            .and_then(|s| s.conditions.as_ref())
            .and_then(|conditions| conditions.iter().find(|c| c.type_ == "Ready"))
            .is_some_and(|c| c.status == "True");
        let spec = node.spec.as_ref();
        let state = NodeState {
            labels: node.metadata.labels.clone().unwrap_or_default(),
            taints: spec.and_then(|s| s.taints.clone()).unwrap_or_default(),
            unschedulable: spec.and_then(|s| s.unschedulable).unwrap_or(false),
            ready,
            allocatable: allocatable.scheduler_rounded(),
        };
        self.update_node(name, |entry| entry.state = Some(state));
        if errors.is_empty() {
            Ok(())
        } else {
            Err(CapacityError::NodeQuantities {
                node: name.to_owned(),
                errors,
            })
        }
    }

    /// Applies a node deletion. Its pods stay known: they count again if the node comes back.
    pub fn remove_node(&mut self, name: &str) {
        if self.nodes.contains_key(name) {
            self.update_node(name, |entry| entry.state = None);
        }
    }

    /// Applies an added or updated pod. If its requests cannot be read it counts only its pod
    /// slot, the error is returned and kept in [`Self::invalid_pods`] until the pod changes.
    pub fn apply_pod(&mut self, pod: &Pod) -> Result<(), CapacityError> {
        let Some(name) = pod.metadata.name.as_deref().filter(|n| !n.is_empty()) else {
            return Err(CapacityError::MissingName { kind: "pod" });
        };
        let id = (
            pod.metadata.namespace.clone().unwrap_or_default(),
            name.to_owned(),
        );
        self.forget_pod(&id);
        let Some((node, ours)) = self.bound_node(pod) else {
            return Ok(());
        };
        let (usage, error) = match pod_requests(pod) {
            Ok(requests) => (requests.scheduler_rounded(), None),
            Err(error) => (ResourceVector::new(), Some(error)),
        };
        let mut usage = usage;
        usage.set(RESOURCE_PODS, POD_SLOT);
        self.update_node(node, |entry| {
            let used = if ours {
                &mut entry.used_ours
            } else {
                &mut entry.used
            };
            used.saturating_add_assign(&usage);
            entry.pods += 1;
        });
        if ours {
            self.ours.saturating_add_assign(&usage);
        }
        // `update_node` made the node's entry: its key is the pod's.
        let node = self
            .nodes
            .get_key_value(node)
            .map_or_else(|| Arc::from(node), |(name, _)| name.clone());
        let usage = usage
            .iter()
            .map(|(name, nanos)| (self.resource_name(name), nanos))
            .collect();
        self.pods.insert(id.clone(), PodEntry { node, ours, usage });
        match error {
            None => Ok(()),
            Some(reason) => {
                self.invalid_pods.insert(id, reason.clone());
                Err(CapacityError::PodRequests {
                    pod: pod_key(pod),
                    reason,
                })
            }
        }
    }

    /// Applies a pod deletion.
    pub fn remove_pod(&mut self, namespace: &str, name: &str) {
        self.forget_pod(&(namespace.to_owned(), name.to_owned()));
    }

    /// The node the pod (namespace, name) takes room on as last applied; `None` when it takes
    /// none (unknown, unbound or terminal).
    pub fn node_of_pod(&self, pod: &(String, String)) -> Option<&str> {
        self.pods.get(pod).map(|p| p.node.as_ref())
    }

    /// The node a pod occupies, or `None` if it is unbound or terminal.
    pub fn bound_node_of<'p>(&self, pod: &'p Pod) -> Option<&'p str> {
        self.bound_node(pod).map(|(node, _)| node)
    }

    /// The node a pod occupies and whether the pod is ours, or `None` if it is unbound or
    /// terminal.
    fn bound_node<'p>(&self, pod: &'p Pod) -> Option<(&'p str, bool)> {
        let ours = pod
            .metadata
            .labels
            .as_ref()
            .and_then(|labels| labels.get(LABEL_OWNER))
            .is_some_and(|owner| *owner == self.owner);
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        let terminal = matches!(phase, Some("Succeeded" | "Failed"));
        let node = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .filter(|n| !n.is_empty());
        if terminal {
            None
        } else {
            node.map(|n| (n, ours))
        }
    }

    fn forget_pod(&mut self, id: &PodId) {
        self.invalid_pods.remove(id);
        if let Some(pod) = self.pods.remove(id) {
            let usage = pod.usage();
            self.update_node(&pod.node, |entry| {
                let used = if pod.ours {
                    &mut entry.used_ours
                } else {
                    &mut entry.used
                };
                used.saturating_sub_assign(&usage);
                entry.pods = entry.pods.saturating_sub(1);
            });
            if pod.ours {
                self.ours.saturating_sub_assign(&usage);
            }
        }
    }

    /// `name`, shared with every pod that requests it.
    fn resource_name(&mut self, name: &str) -> Arc<str> {
        if let Some(shared) = self.resource_names.get(name) {
            return shared.clone();
        }
        let shared: Arc<str> = Arc::from(name);
        self.resource_names.insert(shared.clone());
        shared
    }

    /// Changes one node's entry, keeping the totals in step: its old free vector is taken out,
    /// the change applied, and the new one put in.
    fn update_node(&mut self, name: &str, change: impl FnOnce(&mut NodeEntry)) {
        if !self.nodes.contains_key(name) {
            self.nodes.insert(Arc::from(name), NodeEntry::default());
        }
        let Some(entry) = self.nodes.get_mut(name) else {
            return;
        };
        if let Some(free) = entry.free.take() {
            self.total.saturating_sub_assign(&free.capacity);
            for (resource, amount) in free.room.iter() {
                remove_from_index(&mut self.room_index, &mut self.total, resource, amount);
            }
        }
        change(entry);
        if entry.pods == 0 {
            // No pod left: drop the zero entries the last ones left behind.
            entry.used = ResourceVector::new();
            entry.used_ours = ResourceVector::new();
        }
        if let Some(state) = entry.state.as_ref().filter(|s| s.counts()) {
            let capacity = clamped_free(&state.allocatable, &entry.used, None);
            let room = clamped_free(&state.allocatable, &entry.used, Some(&entry.used_ours));
            self.total.saturating_add_assign(&capacity);
            for (resource, amount) in room.iter() {
                let counts = self.room_index.entry(resource.to_owned()).or_default();
                *counts.entry(amount).or_insert(0) += 1;
            }
            entry.free = Some(NodeFree { capacity, room });
        }
        entry.ready_room = entry
            .state
            .as_ref()
            .filter(|s| s.ready)
            .map(|s| clamped_free(&s.allocatable, &entry.used, Some(&entry.used_ours)));
        if entry.state.is_none() && entry.pods == 0 {
            self.nodes.remove(name);
        }
    }

    /// The capacity to publish: over the counted nodes, allocatable minus the requests of the
    /// pods that are not ours, each node clamped at zero per resource. Every resource some
    /// counted node has in its allocatable is present, possibly at zero.
    pub fn total(&self) -> ResourceVector {
        self.total.clone()
    }

    /// What the bound, non-terminal pods this virtual node created request, over every node
    /// (their pod slots included): beside [`Self::total`], how much of the published capacity
    /// is in use.
    pub fn requested_ours(&self) -> ResourceVector {
        self.ours.clone()
    }

    /// Per resource, the largest room (free after every pod, ours included) on any single
    /// counted node: the largest request of that resource one pod could get.
    pub fn largest_fit(&self) -> ResourceVector {
        self.room_index
            .iter()
            .filter_map(|(resource, counts)| {
                counts
                    .keys()
                    .next_back()
                    .map(|amount| (resource.clone(), *amount))
            })
            .collect()
    }

    /// The room left on a counted node (allocatable minus every pod on it, ours included,
    /// clamped at zero), `None` if the node is unknown, not Ready or cordoned.
    pub fn node_free(&self, name: &str) -> Option<&ResourceVector> {
        self.nodes
            .get(name)
            .and_then(|entry| entry.free.as_ref())
            .map(|free| &free.room)
    }

    /// The counted nodes (Ready and schedulable) with their room, for running the fit
    /// predicates.
    pub fn nodes(&self) -> impl Iterator<Item = NodeView<'_>> + '_ {
        self.nodes
            .iter()
            .filter_map(|(name, entry)| counted_view(name, entry))
    }

    /// One counted node, as [`Self::nodes`] gives it; `None` if it is unknown or not counted.
    pub fn node(&self, name: &str) -> Option<NodeView<'_>> {
        let (name, entry) = self.nodes.get_key_value(name)?;
        counted_view(name, entry)
    }

    /// A counted node's allocatable, rounded as the scheduler rounds it; `None` if the node is
    /// unknown or not counted.
    pub fn allocatable(&self, name: &str) -> Option<&ResourceVector> {
        let entry = self.nodes.get(name)?;
        entry.free.as_ref()?;
        entry.state.as_ref().map(|s| &s.allocatable)
    }

    /// Every Ready node, cordoned ones included, with its room: what a scheduler runs its
    /// filters on (its `NodeUnschedulable` filter lets pods that tolerate
    /// `node.kubernetes.io/unschedulable`, daemon pods, onto cordoned nodes).
    pub fn ready_nodes(&self) -> impl Iterator<Item = NodeView<'_>> + '_ {
        self.nodes.iter().filter_map(|(name, entry)| {
            Some(view(
                name,
                entry.state.as_ref()?,
                entry.ready_room.as_ref()?,
            ))
        })
    }

    /// Bound pods whose requests could not be read: namespace, name and why.
    pub fn invalid_pods(&self) -> impl Iterator<Item = (&str, &str, &ResourceError)> + '_ {
        self.invalid_pods
            .iter()
            .map(|((ns, name), error)| (ns.as_str(), name.as_str(), error))
    }

    /// Number of nodes currently counted.
    pub fn counted_nodes(&self) -> usize {
        self.nodes
            .values()
            .filter(|entry| entry.free.is_some())
            .count()
    }

    /// Number of bound, non-terminal pods known (ours included, on any node).
    pub fn bound_pods(&self) -> usize {
        self.pods.len()
    }

    /// Whether the model knows no node and counts no pod.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
            && self.pods.is_empty()
            && self.invalid_pods.is_empty()
            && self.total.is_empty()
            && self.room_index.is_empty()
    }
}

/// `allocatable - used - also` per allocatable resource, at least zero.
fn clamped_free(
    allocatable: &ResourceVector,
    used: &ResourceVector,
    also: Option<&ResourceVector>,
) -> ResourceVector {
    allocatable
        .iter()
        .map(|(resource, amount)| {
            let taken = used
                .get(resource)
                .saturating_add(also.map_or(0, |v| v.get(resource)));
            (resource.to_owned(), amount.saturating_sub(taken).max(0))
        })
        .collect()
}

/// Takes one node's free amount of a resource out of the index; when no counted node has the
/// resource any more it leaves the total too.
fn remove_from_index(
    index: &mut BTreeMap<String, BTreeMap<i128, usize>>,
    total: &mut ResourceVector,
    resource: &str,
    amount: i128,
) {
    let Some(counts) = index.get_mut(resource) else {
        return;
    };
    if let Some(count) = counts.get_mut(&amount) {
        *count = count.saturating_sub(1);
        if *count == 0 {
            counts.remove(&amount);
        }
    }
    if counts.is_empty() {
        index.remove(resource);
        total.remove(resource);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fit::PodRequirements;
    use crate::quantity::{NANOS_PER_MILLI, NANOS_PER_UNIT};
    use k8s_openapi::api::core::v1::{
        Container, NodeCondition, NodeSpec, NodeStatus, PodSpec, PodStatus, ResourceRequirements,
    };
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use pretty_assertions::assert_eq;
    use proptest::prelude::*;

    const U: i128 = NANOS_PER_UNIT;
    const M: i128 = NANOS_PER_MILLI;
    const GI: i128 = (1 << 30) * NANOS_PER_UNIT;
    const OWNER: &str = "vk-a";

    fn list(pairs: &[(&str, String)]) -> BTreeMap<String, Quantity> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), Quantity(v.clone())))
            .collect()
    }

    fn vector(pairs: &[(&str, i128)]) -> ResourceVector {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect()
    }

    /// A node; `ready` is the status of its Ready condition (`None`: no condition).
    fn node(name: &str, ready: Option<&str>, cordoned: bool, allocatable: &[(&str, &str)]) -> Node {
        let allocatable: Vec<(&str, String)> = allocatable
            .iter()
            .map(|(k, v)| (*k, (*v).to_owned()))
            .collect();
        Node {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                unschedulable: cordoned.then_some(true),
                ..Default::default()
            }),
            status: Some(NodeStatus {
                // Capacity is larger than allocatable: reserved resources must not count.
                capacity: Some(list(&[
                    ("cpu", "64".to_owned()),
                    ("memory", "256Gi".to_owned()),
                ])),
                allocatable: Some(list(&allocatable)),
                conditions: ready.map(|status| {
                    vec![NodeCondition {
                        type_: "Ready".to_owned(),
                        status: status.to_owned(),
                        ..Default::default()
                    }]
                }),
                ..Default::default()
            }),
        }
    }

    fn ready_node(name: &str, allocatable: &[(&str, &str)]) -> Node {
        node(name, Some("True"), false, allocatable)
    }

    fn pod(name: &str, node_name: Option<&str>, phase: &str, requests: &[(&str, &str)]) -> Pod {
        let requests: Vec<(&str, String)> = requests
            .iter()
            .map(|(k, v)| (*k, (*v).to_owned()))
            .collect();
        Pod {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                namespace: Some("ns".to_owned()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                node_name: node_name.map(str::to_owned),
                containers: vec![Container {
                    name: "app".to_owned(),
                    resources: Some(ResourceRequirements {
                        requests: Some(list(&requests)),
                        ..Default::default()
                    }),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            status: Some(PodStatus {
                phase: Some(phase.to_owned()),
                ..Default::default()
            }),
        }
    }

    fn owned_by(mut p: Pod, owner: &str) -> Pod {
        p.metadata.labels = Some([(LABEL_OWNER.to_owned(), owner.to_owned())].into());
        p
    }

    fn model() -> CapacityModel {
        CapacityModel::new(OWNER)
    }

    #[test]
    fn checklist_08_capacity_is_allocatable_of_ready_schedulable_nodes_minus_bound_pods() {
        let mut m = model();
        m.apply_node(&ready_node(
            "n1",
            &[("cpu", "4"), ("memory", "8Gi"), ("pods", "110")],
        ))
        .unwrap();
        m.apply_node(&ready_node(
            "n2",
            &[("cpu", "8"), ("memory", "16Gi"), ("pods", "110")],
        ))
        .unwrap();
        m.apply_node(&node(
            "n3",
            Some("False"),
            false,
            &[("cpu", "8"), ("pods", "110")],
        ))
        .unwrap();
        m.apply_pod(&pod(
            "running",
            Some("n1"),
            "Running",
            &[("cpu", "1"), ("memory", "1Gi")],
        ))
        .unwrap();
        m.apply_pod(&pod(
            "bound-pending",
            Some("n2"),
            "Pending",
            &[("cpu", "500m")],
        ))
        .unwrap();
        m.apply_pod(&pod("unbound", None, "Pending", &[("cpu", "2")]))
            .unwrap();
        m.apply_pod(&pod("on-not-ready", Some("n3"), "Running", &[("cpu", "2")]))
            .unwrap();
        assert_eq!(
            m.total(),
            vector(&[("cpu", 10_500 * M), ("memory", 23 * GI), ("pods", 218 * U)])
        );
        assert_eq!(
            m.node_free("n1"),
            Some(&vector(&[
                ("cpu", 3 * U),
                ("memory", 7 * GI),
                ("pods", 109 * U)
            ]))
        );
        assert_eq!(m.node_free("n3"), None);
        assert_eq!(m.counted_nodes(), 2);
        assert_eq!(m.bound_pods(), 3);
    }

    #[test]
    fn checklist_09_not_ready_and_cordoned_nodes_contribute_nothing() {
        let mut m = model();
        let alloc = [("cpu", "4"), ("pods", "10")];
        m.apply_node(&node("false", Some("False"), false, &alloc))
            .unwrap();
        m.apply_node(&node("unknown", Some("Unknown"), false, &alloc))
            .unwrap();
        m.apply_node(&node("no-condition", None, false, &alloc))
            .unwrap();
        m.apply_node(&node("cordoned", Some("True"), true, &alloc))
            .unwrap();
        m.apply_node(&node("both", Some("False"), true, &alloc))
            .unwrap();
        assert_eq!(m.total(), ResourceVector::new());
        assert!(m.total().is_empty());
        assert_eq!(m.largest_fit(), ResourceVector::new());
        assert_eq!(m.nodes().count(), 0);
        assert_eq!(m.counted_nodes(), 0);
        let ready: Vec<(&str, bool)> = m.ready_nodes().map(|n| (n.name, n.unschedulable)).collect();
        assert_eq!(
            ready,
            [("cordoned", true)],
            "a scheduler still filters the cordoned node"
        );
    }

    #[test]
    fn checklist_12_non_virtual_pod_reduces_capacity_and_its_deletion_restores_it() {
        let mut m = model();
        m.apply_node(&ready_node(
            "n1",
            &[("cpu", "4"), ("memory", "8Gi"), ("pods", "110")],
        ))
        .unwrap();
        let before = m.total();
        m.apply_pod(&pod(
            "web",
            Some("n1"),
            "Running",
            &[("cpu", "1500m"), ("memory", "2Gi")],
        ))
        .unwrap();
        assert_eq!(
            before.checked_sub(&m.total()).unwrap(),
            vector(&[("cpu", 1_500 * M), ("memory", 2 * GI), ("pods", U)])
        );
        m.remove_pod("ns", "web");
        assert_eq!(m.total(), before);
        // Removing an unknown pod changes nothing.
        m.remove_pod("ns", "web");
        assert_eq!(m.total(), before);
    }

    #[test]
    fn checklist_13_node_not_ready_or_cordoned_removes_capacity_and_reverse_restores() {
        let mut m = model();
        let alloc = [("cpu", "4"), ("pods", "110")];
        m.apply_node(&ready_node("n1", &alloc)).unwrap();
        m.apply_node(&ready_node("n2", &alloc)).unwrap();
        m.apply_pod(&pod("p", Some("n1"), "Running", &[("cpu", "1")]))
            .unwrap();
        let all = m.total();
        assert_eq!(all, vector(&[("cpu", 7 * U), ("pods", 219 * U)]));
        let n2_only = vector(&[("cpu", 4 * U), ("pods", 110 * U)]);

        m.apply_node(&node("n1", Some("False"), false, &alloc))
            .unwrap();
        assert_eq!(
            m.total(),
            n2_only,
            "its capacity goes and its pods are added back"
        );
        m.apply_node(&ready_node("n1", &alloc)).unwrap();
        assert_eq!(m.total(), all);

        m.apply_node(&node("n1", Some("True"), true, &alloc))
            .unwrap();
        assert_eq!(m.total(), n2_only);
        m.apply_node(&node("n1", Some("False"), true, &alloc))
            .unwrap();
        assert_eq!(
            m.total(),
            n2_only,
            "cordoned and NotReady is not subtracted twice"
        );
        m.apply_node(&node("n1", Some("True"), true, &alloc))
            .unwrap();
        m.apply_node(&ready_node("n1", &alloc)).unwrap();
        assert_eq!(m.total(), all);
    }

    #[test]
    fn checklist_14_node_capacity_change_changes_total_by_difference() {
        let mut m = model();
        m.apply_node(&ready_node(
            "n1",
            &[("cpu", "4"), ("memory", "8Gi"), ("pods", "110")],
        ))
        .unwrap();
        m.apply_node(&ready_node(
            "n2",
            &[("cpu", "2"), ("memory", "4Gi"), ("pods", "110")],
        ))
        .unwrap();
        m.apply_pod(&pod("p", Some("n1"), "Running", &[("cpu", "1")]))
            .unwrap();
        let before = m.total();
        m.apply_node(&ready_node(
            "n1",
            &[("cpu", "6"), ("memory", "7Gi"), ("pods", "110")],
        ))
        .unwrap();
        assert_eq!(
            m.total().checked_sub(&before).unwrap(),
            vector(&[("cpu", 2 * U), ("memory", -GI)])
        );
        // Same node, same values: nothing moves.
        let again = m.total();
        m.apply_node(&ready_node(
            "n1",
            &[("cpu", "6"), ("memory", "7Gi"), ("pods", "110")],
        ))
        .unwrap();
        assert_eq!(m.total(), again);
    }

    #[test]
    fn checklist_15_our_virtual_pods_never_change_capacity() {
        let mut m = model();
        m.apply_node(&ready_node("n1", &[("cpu", "4"), ("pods", "110")]))
            .unwrap();
        let before = m.total();
        for phase in ["Pending", "Running", "Succeeded", "Failed", "Unknown"] {
            m.apply_pod(&owned_by(
                pod("ours", Some("n1"), phase, &[("cpu", "3")]),
                OWNER,
            ))
            .unwrap();
            assert_eq!(m.total(), before, "{phase}");
        }
        // Ours still take room on their node: a new pod cannot use it.
        m.apply_pod(&owned_by(
            pod("ours", Some("n1"), "Running", &[("cpu", "3")]),
            OWNER,
        ))
        .unwrap();
        assert_eq!(m.total(), before);
        let room = vector(&[("cpu", U), ("pods", 109 * U)]);
        assert_eq!(m.node_free("n1"), Some(&room));
        assert_eq!(m.largest_fit(), room);
        m.remove_pod("ns", "ours");
        assert_eq!(m.total(), before);
        assert_eq!(m.largest_fit(), before);
        // A pod of another virtual node (or upper cluster) sharing this cluster does count.
        m.apply_pod(&owned_by(
            pod("theirs", Some("n1"), "Running", &[("cpu", "3")]),
            "vk-b",
        ))
        .unwrap();
        assert_eq!(m.total(), vector(&[("cpu", U), ("pods", 109 * U)]));
        // An ordinary pod relabelled as ours stops counting.
        m.apply_pod(&owned_by(
            pod("theirs", Some("n1"), "Running", &[("cpu", "3")]),
            OWNER,
        ))
        .unwrap();
        assert_eq!(m.total(), before);
    }

    #[test]
    fn what_our_pods_request_is_summed_over_nodes_and_given_back_when_they_end() {
        let mut m = model();
        m.apply_node(&ready_node("n1", &[("cpu", "4"), ("pods", "110")]))
            .unwrap();
        m.apply_pod(&owned_by(
            pod("a", Some("n1"), "Running", &[("cpu", "1")]),
            OWNER,
        ))
        .unwrap();
        // On a node the model does not count (not seen yet): still requested.
        m.apply_pod(&owned_by(
            pod("b", Some("n2"), "Pending", &[("cpu", "500m")]),
            OWNER,
        ))
        .unwrap();
        m.apply_pod(&pod("other", Some("n1"), "Running", &[("cpu", "2")]))
            .unwrap();
        m.apply_pod(&owned_by(
            pod("unbound", None, "Pending", &[("cpu", "1")]),
            OWNER,
        ))
        .unwrap();
        assert_eq!(
            m.requested_ours(),
            vector(&[("cpu", 1_500 * M), ("pods", 2 * U)])
        );
        m.apply_pod(&owned_by(
            pod("a", Some("n1"), "Succeeded", &[("cpu", "1")]),
            OWNER,
        ))
        .unwrap();
        m.remove_pod("ns", "b");
        assert_eq!(m.requested_ours(), vector(&[("cpu", 0), ("pods", 0)]));
    }

    #[test]
    fn checklist_16_fix_restart_does_not_subtract_our_own_pods() {
        // After a restart the watch replays everything, pods possibly before their nodes.
        let mut m = model();
        m.apply_pod(&owned_by(
            pod("ours-1", Some("n1"), "Running", &[("cpu", "2")]),
            OWNER,
        ))
        .unwrap();
        m.apply_pod(&owned_by(
            pod("ours-2", Some("n1"), "Pending", &[("cpu", "1")]),
            OWNER,
        ))
        .unwrap();
        m.apply_pod(&pod("other", Some("n1"), "Running", &[("cpu", "500m")]))
            .unwrap();
        m.apply_node(&ready_node("n1", &[("cpu", "4"), ("pods", "110")]))
            .unwrap();
        assert_eq!(m.total(), vector(&[("cpu", 3_500 * M), ("pods", 109 * U)]));
    }

    #[test]
    fn terminal_pods_give_their_resources_back() {
        let mut m = model();
        m.apply_node(&ready_node("n1", &[("cpu", "4"), ("pods", "110")]))
            .unwrap();
        let before = m.total();
        let mut failed = pod("job", Some("n1"), "Pending", &[("cpu", "2")]);
        if let Some(spec) = failed.spec.as_mut() {
            spec.restart_policy = Some("Never".to_owned());
        }
        m.apply_pod(&failed).unwrap();
        assert_eq!(m.total(), vector(&[("cpu", 2 * U), ("pods", 109 * U)]));
        // Pending -> Failed without ever running: the original leaked this.
        if let Some(status) = failed.status.as_mut() {
            status.phase = Some("Failed".to_owned());
        }
        m.apply_pod(&failed).unwrap();
        assert_eq!(m.total(), before);
        // Deleting a terminal pod changes nothing more.
        m.remove_pod("ns", "job");
        assert_eq!(m.total(), before);
    }

    #[test]
    fn pod_moving_pending_running_succeeded() {
        let mut m = model();
        m.apply_node(&ready_node("n1", &[("cpu", "4"), ("pods", "110")]))
            .unwrap();
        let before = m.total();
        let taken = vector(&[("cpu", 3 * U), ("pods", 109 * U)]);
        m.apply_pod(&pod("p", None, "Pending", &[("cpu", "1")]))
            .unwrap();
        assert_eq!(m.total(), before, "not bound yet");
        m.apply_pod(&pod("p", Some("n1"), "Pending", &[("cpu", "1")]))
            .unwrap();
        assert_eq!(m.total(), taken);
        m.apply_pod(&pod("p", Some("n1"), "Running", &[("cpu", "1")]))
            .unwrap();
        assert_eq!(m.total(), taken, "not subtracted twice");
        m.apply_pod(&pod("p", Some("n1"), "Succeeded", &[("cpu", "1")]))
            .unwrap();
        assert_eq!(m.total(), before);
        assert_eq!(m.bound_pods(), 0);
    }

    #[test]
    fn node_delete_then_re_add() {
        let mut m = model();
        let alloc = [("cpu", "4"), ("pods", "110")];
        m.apply_node(&ready_node("n1", &alloc)).unwrap();
        m.apply_pod(&pod("p", Some("n1"), "Running", &[("cpu", "1")]))
            .unwrap();
        let with_node = m.total();
        m.remove_node("n1");
        assert_eq!(m.total(), ResourceVector::new());
        assert!(m.total().is_empty(), "no stale resource keys");
        assert_eq!(m.node_free("n1"), None);
        m.apply_node(&ready_node("n1", &alloc)).unwrap();
        assert_eq!(m.total(), with_node, "its pods count again");
        m.remove_node("n1");
        m.remove_pod("ns", "p");
        assert!(m.is_empty());
        m.remove_node("never-seen");
        assert!(m.is_empty());
    }

    #[test]
    fn extended_resources_are_included() {
        let mut m = model();
        m.apply_node(&ready_node(
            "gpu-1",
            &[("cpu", "8"), ("nvidia.com/gpu", "4"), ("pods", "110")],
        ))
        .unwrap();
        m.apply_node(&ready_node(
            "gpu-2",
            &[("cpu", "8"), ("nvidia.com/gpu", "2"), ("pods", "110")],
        ))
        .unwrap();
        m.apply_pod(&pod(
            "train",
            Some("gpu-1"),
            "Running",
            &[("nvidia.com/gpu", "3")],
        ))
        .unwrap();
        assert_eq!(m.total().get("nvidia.com/gpu"), 3 * U);
        assert_eq!(m.largest_fit().get("nvidia.com/gpu"), 2 * U);
        assert_eq!(
            m.total().to_quantities().get("nvidia.com/gpu"),
            Some(&Quantity("3".to_owned()))
        );
    }

    #[test]
    fn largest_fit_is_the_best_single_node_per_resource() {
        let mut m = model();
        m.apply_node(&ready_node(
            "a",
            &[("cpu", "8"), ("memory", "4Gi"), ("pods", "110")],
        ))
        .unwrap();
        m.apply_node(&ready_node(
            "b",
            &[("cpu", "4"), ("memory", "16Gi"), ("pods", "110")],
        ))
        .unwrap();
        m.apply_pod(&pod("p", Some("a"), "Running", &[("cpu", "6")]))
            .unwrap();
        assert_eq!(
            m.largest_fit(),
            vector(&[("cpu", 4 * U), ("memory", 16 * GI), ("pods", 110 * U)])
        );
        m.remove_node("b");
        assert_eq!(
            m.largest_fit(),
            vector(&[("cpu", 2 * U), ("memory", 4 * GI), ("pods", 109 * U)])
        );
    }

    #[test]
    fn over_committed_node_is_clamped_at_zero() {
        let mut m = model();
        m.apply_node(&ready_node("small", &[("cpu", "1"), ("pods", "110")]))
            .unwrap();
        m.apply_node(&ready_node("big", &[("cpu", "4"), ("pods", "110")]))
            .unwrap();
        // A static pod over-commits "small" by a core.
        m.apply_pod(&pod("static", Some("small"), "Running", &[("cpu", "2")]))
            .unwrap();
        assert_eq!(
            m.node_free("small"),
            Some(&vector(&[("cpu", 0), ("pods", 109 * U)]))
        );
        assert_eq!(m.total(), vector(&[("cpu", 4 * U), ("pods", 219 * U)]));
        m.remove_pod("ns", "static");
        assert_eq!(m.total(), vector(&[("cpu", 5 * U), ("pods", 220 * U)]));
    }

    #[test]
    fn allocatable_falls_back_to_capacity() {
        let mut m = model();
        let mut n = ready_node("n1", &[]);
        if let Some(status) = n.status.as_mut() {
            status.allocatable = None;
        }
        m.apply_node(&n).unwrap();
        assert_eq!(m.total(), vector(&[("cpu", 64 * U), ("memory", 256 * GI)]));
    }

    #[test]
    fn unreadable_pod_requests_count_only_the_pod_slot_and_are_reported() {
        let mut m = model();
        m.apply_node(&ready_node("n1", &[("cpu", "4"), ("pods", "110")]))
            .unwrap();
        let err = m
            .apply_pod(&pod("bad", Some("n1"), "Running", &[("cpu", "1 core")]))
            .unwrap_err();
        assert!(
            matches!(&err, CapacityError::PodRequests { pod, reason: ResourceError::InvalidPodQuantity { resource, reason: q, .. } }
                if pod == "ns/bad" && resource == "cpu" && q.input() == "1 core"),
            "{err:?}"
        );
        assert_eq!(m.total(), vector(&[("cpu", 4 * U), ("pods", 109 * U)]));
        assert_eq!(
            m.invalid_pods()
                .map(|(ns, n, _)| (ns, n))
                .collect::<Vec<_>>(),
            vec![("ns", "bad")]
        );
        // Fixed pod: counted in full, error cleared.
        m.apply_pod(&pod("bad", Some("n1"), "Running", &[("cpu", "1")]))
            .unwrap();
        assert_eq!(m.total(), vector(&[("cpu", 3 * U), ("pods", 109 * U)]));
        assert_eq!(m.invalid_pods().count(), 0);
        // A pod without containers has no readable requests either.
        let mut empty = pod("empty", Some("n1"), "Running", &[]);
        if let Some(spec) = empty.spec.as_mut() {
            spec.containers.clear();
        }
        assert!(matches!(
            m.apply_pod(&empty),
            Err(CapacityError::PodRequests {
                reason: ResourceError::NoContainers { .. },
                ..
            })
        ));
        assert_eq!(m.total().get(RESOURCE_PODS), 108 * U);
    }

    #[test]
    fn unreadable_node_quantity_is_left_out_and_reported() {
        let mut m = model();
        let err = m
            .apply_node(&ready_node(
                "n1",
                &[("cpu", "4"), ("example.com/x", "lots"), ("pods", "110")],
            ))
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "node n1: unreadable allocatable resources ignored: resource \"example.com/x\": \
             quantity \"lots\" is malformed: no digits"
        );
        assert_eq!(m.total(), vector(&[("cpu", 4 * U), ("pods", 110 * U)]));
    }

    #[test]
    fn nameless_objects_are_rejected_without_changes() {
        let mut m = model();
        let mut n = ready_node("x", &[("cpu", "1")]);
        n.metadata.name = None;
        assert_eq!(
            m.apply_node(&n),
            Err(CapacityError::MissingName { kind: "node" })
        );
        let mut p = pod("x", Some("n"), "Running", &[]);
        p.metadata.name = Some(String::new());
        assert_eq!(
            m.apply_pod(&p),
            Err(CapacityError::MissingName { kind: "pod" })
        );
        assert!(m.is_empty());
    }

    #[test]
    fn nodes_expose_what_the_fit_predicates_need() {
        let mut m = model();
        let mut n = ready_node("n1", &[("cpu", "4"), ("pods", "110")]);
        n.metadata.labels = Some([("zone".to_owned(), "a".to_owned())].into());
        if let Some(spec) = n.spec.as_mut() {
            spec.taints = Some(vec![Taint {
                key: "dedicated".to_owned(),
                effect: "NoSchedule".to_owned(),
                ..Default::default()
            }]);
        }
        m.apply_node(&n).unwrap();
        m.apply_node(&ready_node("n2", &[("cpu", "1"), ("pods", "110")]))
            .unwrap();
        m.apply_node(&node(
            "n3",
            Some("True"),
            true,
            &[("cpu", "64"), ("pods", "110")],
        ))
        .unwrap();
        let names: Vec<&str> = m.nodes().map(|v| v.name).collect();
        assert_eq!(names, vec!["n1", "n2"]);
        let p = pod("p", None, "Pending", &[("cpu", "2")]);
        let requirements = PodRequirements::from_pod(&p).unwrap();
        // n1 has room but a taint; n2 lacks cpu; n3 is cordoned and not offered.
        assert!(!requirements.fits_any(m.nodes()));
        let unfit: Vec<Vec<_>> = m
            .nodes()
            .filter_map(|v| requirements.check(&v).err())
            .collect();
        assert_eq!(
            crate::fit::summarize(2, unfit.iter().map(Vec::as_slice)),
            "0/2 nodes are available: 1 Insufficient cpu, 1 node(s) had untolerated taint \
             {dedicated: }."
        );
    }

    // ---- property tests ----

    #[derive(Debug, Clone)]
    struct NodeSpecT {
        idx: usize,
        ready: bool,
        cordoned: bool,
        cpu_milli: u32,
        pods: u32,
        gpus: Option<u32>,
    }

    #[derive(Debug, Clone)]
    struct PodSpecT {
        idx: usize,
        node: Option<usize>,
        phase: &'static str,
        owner: Option<&'static str>,
        cpu_micro: u32,
        gpus: u32,
        broken: bool,
    }

    #[derive(Debug, Clone)]
    enum Event {
        Node(NodeSpecT),
        RemoveNode(usize),
        Pod(PodSpecT),
        RemovePod(usize),
    }

    const NODES: usize = 4;
    const PODS: usize = 8;

    fn node_name(idx: usize) -> String {
        format!("n{idx}")
    }

    fn pod_name(idx: usize) -> String {
        format!("p{idx}")
    }

    fn build_node(s: &NodeSpecT) -> Node {
        let cpu = format!("{}m", s.cpu_milli);
        let pods = s.pods.to_string();
        let gpus = s.gpus.map(|g| g.to_string());
        let mut alloc = vec![("cpu", cpu.as_str()), ("pods", pods.as_str())];
        if let Some(g) = gpus.as_deref() {
            alloc.push(("nvidia.com/gpu", g));
        }
        node(
            &node_name(s.idx),
            Some(if s.ready { "True" } else { "False" }),
            s.cordoned,
            &alloc,
        )
    }

    fn build_pod(s: &PodSpecT) -> Pod {
        // Micro-cpu requests exercise the scheduler's millicore rounding.
        let cpu = if s.broken {
            "x".to_owned()
        } else {
            format!("{}u", s.cpu_micro)
        };
        let gpus = s.gpus.to_string();
        let node = s.node.map(node_name);
        let p = pod(
            &pod_name(s.idx),
            node.as_deref(),
            s.phase,
            &[("cpu", cpu.as_str()), ("nvidia.com/gpu", gpus.as_str())],
        );
        match s.owner {
            Some(owner) => owned_by(p, owner),
            None => p,
        }
    }

    fn node_strategy() -> impl Strategy<Value = NodeSpecT> {
        (
            0..NODES,
            any::<bool>(),
            prop::bool::weighted(0.2),
            0u32..16_000,
            0u32..20,
            prop::option::of(0u32..8),
        )
            .prop_map(|(idx, ready, cordoned, cpu_milli, pods, gpus)| NodeSpecT {
                idx,
                ready,
                cordoned,
                cpu_milli,
                pods,
                gpus,
            })
    }

    fn pod_strategy() -> impl Strategy<Value = PodSpecT> {
        (
            0..PODS,
            prop::option::of(0..NODES),
            prop::sample::select(vec!["Pending", "Running", "Succeeded", "Failed", "Unknown"]),
            prop::sample::select(vec![None, Some(OWNER), Some("vk-b")]),
            0u32..5_000_000,
            0u32..3,
            prop::bool::weighted(0.1),
        )
            .prop_map(
                |(idx, node, phase, owner, cpu_micro, gpus, broken)| PodSpecT {
                    idx,
                    node,
                    phase,
                    owner,
                    cpu_micro,
                    gpus,
                    broken,
                },
            )
    }

    fn event_strategy() -> impl Strategy<Value = Event> {
        prop_oneof![
            3 => node_strategy().prop_map(Event::Node),
            1 => (0..NODES).prop_map(Event::RemoveNode),
            5 => pod_strategy().prop_map(Event::Pod),
            2 => (0..PODS).prop_map(Event::RemovePod),
        ]
    }

    fn apply(m: &mut CapacityModel, event: &Event) {
        match event {
            Event::Node(s) => {
                let _ = m.apply_node(&build_node(s));
            }
            Event::RemoveNode(idx) => m.remove_node(&node_name(*idx)),
            Event::Pod(s) => {
                let _ = m.apply_pod(&build_pod(s));
            }
            Event::RemovePod(idx) => m.remove_pod("ns", &pod_name(*idx)),
        }
    }

    /// The current objects, as a watch cache would hold them.
    #[derive(Debug, Default)]
    struct World {
        nodes: BTreeMap<usize, NodeSpecT>,
        pods: BTreeMap<usize, PodSpecT>,
    }

    impl World {
        fn apply(&mut self, event: &Event) {
            match event {
                Event::Node(s) => {
                    self.nodes.insert(s.idx, s.clone());
                }
                Event::RemoveNode(idx) => {
                    self.nodes.remove(idx);
                }
                Event::Pod(s) => {
                    self.pods.insert(s.idx, s.clone());
                }
                Event::RemovePod(idx) => {
                    self.pods.remove(idx);
                }
            }
        }
    }

    /// From-scratch reference: (total, largest fit) over the current objects, in whole
    /// millicores / units, written without the model's machinery.
    fn naive(world: &World) -> (ResourceVector, ResourceVector) {
        /// Free cpu, pods and gpus of a node after the pods `include` selects.
        fn free(
            s: &NodeSpecT,
            world: &World,
            include: impl Fn(&PodSpecT) -> bool,
        ) -> Vec<(&'static str, i128)> {
            let mut cpu = i128::from(s.cpu_milli) * M;
            let mut pods = i128::from(s.pods) * U;
            let mut gpus = s.gpus.map(|g| i128::from(g) * U);
            for p in world.pods.values() {
                let bound = p.node == Some(s.idx) && !matches!(p.phase, "Succeeded" | "Failed");
                if !bound || !include(p) {
                    continue;
                }
                pods -= U;
                if !p.broken {
                    // Ceil to a whole millicore.
                    cpu -= i128::from(p.cpu_micro.div_ceil(1000)) * M;
                    if let Some(g) = gpus.as_mut() {
                        *g -= i128::from(p.gpus) * U;
                    }
                }
            }
            let mut free = vec![("cpu", cpu.max(0)), ("pods", pods.max(0))];
            if let Some(g) = gpus {
                free.push(("nvidia.com/gpu", g.max(0)));
            }
            free
        }

        let mut total = ResourceVector::new();
        let mut largest = ResourceVector::new();
        for s in world.nodes.values() {
            if !s.ready || s.cordoned {
                continue;
            }
            for (name, amount) in free(s, world, |p| p.owner != Some(OWNER)) {
                total.set(name, total.get(name) + amount);
            }
            for (name, amount) in free(s, world, |_| true) {
                if !largest.contains(name) || largest.get(name) < amount {
                    largest.set(name, amount);
                }
            }
        }
        (total, largest)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        #[test]
        fn removing_everything_returns_to_empty(events in prop::collection::vec(event_strategy(), 0..60)) {
            let mut m = model();
            for event in &events {
                apply(&mut m, event);
            }
            for idx in 0..PODS {
                m.remove_pod("ns", &pod_name(idx));
            }
            for idx in 0..NODES {
                m.remove_node(&node_name(idx));
            }
            prop_assert!(m.is_empty(), "{:?}", m);
            prop_assert_eq!(m.total(), ResourceVector::new());
            prop_assert_eq!(m.largest_fit(), ResourceVector::new());
        }

        #[test]
        fn incremental_totals_equal_a_recomputation(events in prop::collection::vec(event_strategy(), 0..60)) {
            let mut m = model();
            let mut world = World::default();
            for event in &events {
                apply(&mut m, event);
                world.apply(event);
                let (total, largest) = naive(&world);
                prop_assert_eq!(m.total(), total, "after {:?}", event);
                prop_assert_eq!(m.largest_fit(), largest, "after {:?}", event);
            }
        }

        #[test]
        fn final_state_does_not_depend_on_event_order(
            (first, second) in (
                prop::collection::btree_map(0..NODES, node_strategy(), 0..=NODES),
                prop::collection::btree_map(0..PODS, pod_strategy(), 0..=PODS),
            )
                .prop_flat_map(|(nodes, pods)| {
                    let events: Vec<Event> = nodes
                        .into_iter()
                        .map(|(idx, s)| Event::Node(NodeSpecT { idx, ..s }))
                        .chain(pods.into_iter().map(|(idx, s)| Event::Pod(PodSpecT { idx, ..s })))
                        .collect();
                    (Just(events.clone()).prop_shuffle(), Just(events).prop_shuffle())
                })
        ) {
            let mut a = model();
            let mut b = model();
            for event in &first {
                apply(&mut a, event);
            }
            for event in &second {
                apply(&mut b, event);
            }
            prop_assert_eq!(a.total(), b.total());
            prop_assert_eq!(a.largest_fit(), b.largest_fit());
            prop_assert_eq!(a.bound_pods(), b.bound_pods());
            let mut world = World::default();
            for event in &first {
                world.apply(event);
            }
            prop_assert_eq!(a.total(), naive(&world).0);
        }
    }
}
