//! Fit predicates with kube-scheduler's semantics, shared by the scheduler extender, the
//! descheduler and the capacity model: node resources (`NodeResourcesFit`), nodeSelector and
//! required node affinity (`NodeAffinity`), taints and tolerations (`TaintToleration`) and
//! cordoned nodes (`NodeUnschedulable`).
//!
//! Inputs are plain values: a [`NodeView`] of a node and the pod's [`PodConstraints`] and
//! requests, so callers can check constraints restored from the `clusterSelector` annotation as
//! well as those of a live pod.

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::api::core::v1::{
    Affinity, NodeSelectorRequirement, NodeSelectorTerm, Pod, PodSpec, Taint, Toleration,
};

use crate::keys::{EFFECT_NO_EXECUTE, EFFECT_NO_SCHEDULE, TAINT_UNSCHEDULABLE, is_label_value};
use crate::names::is_qualified_name;
use crate::resources::{
    POD_SLOT, RESOURCE_CPU, RESOURCE_EPHEMERAL_STORAGE, RESOURCE_MEMORY, RESOURCE_PODS,
    ResourceError, ResourceVector, is_scalar_resource_name, pod_requests,
};

/// The only node field a `matchFields` requirement can name.
const FIELD_NODE_NAME: &str = "metadata.name";

/// What the predicates look at on a node.
#[derive(Debug, Clone, Copy)]
pub struct NodeView<'a> {
    /// Node name (`metadata.name`), matched by `matchFields`.
    pub name: &'a str,
    /// Node labels.
    pub labels: &'a BTreeMap<String, String>,
    /// Node taints.
    pub taints: &'a [Taint],
    /// `spec.unschedulable` (cordoned).
    pub unschedulable: bool,
    /// Free resources (allocatable minus the requests of the pods on it), including `pods`.
    pub free: &'a ResourceVector,
}

/// A pod's placement constraints, from a pod or from explicit values (e.g. restored from the
/// `clusterSelector` annotation).
#[derive(Debug, Clone, Copy, Default)]
pub struct PodConstraints<'a> {
    /// `spec.nodeSelector`.
    pub node_selector: Option<&'a BTreeMap<String, String>>,
    /// `spec.affinity`; only its required node affinity is a predicate.
    pub affinity: Option<&'a Affinity>,
    /// `spec.tolerations`.
    pub tolerations: &'a [Toleration],
}

/// A pod's constraints and effective requests, ready to be checked against nodes.
#[derive(Debug, Clone)]
pub struct PodRequirements<'a> {
    /// Placement constraints.
    pub constraints: PodConstraints<'a>,
    /// Effective requests without the pod slot (see [`crate::resources::pod_requests`]).
    pub requests: ResourceVector,
}

/// One reason a pod does not fit a node. `Display` gives kube-scheduler's wording.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unfit {
    /// Not enough of a resource; `pods` means the node is full ("Too many pods").
    InsufficientResource {
        /// The resource name.
        resource: String,
        /// The pod's request, in nano-units, rounded like the scheduler does.
        requested: i128,
        /// The node's free amount, in nano-units.
        free: i128,
    },
    /// `spec.nodeSelector` does not match the node's labels.
    NodeSelectorMismatch,
    /// The required node affinity does not match the node.
    NodeAffinityMismatch,
    /// A `NoSchedule` or `NoExecute` taint is not tolerated.
    UntoleratedTaint {
        /// Taint key.
        key: String,
        /// Taint value (empty if none).
        value: String,
        /// Taint effect.
        effect: String,
    },
    /// The node is cordoned and the pod does not tolerate `node.kubernetes.io/unschedulable`.
    Unschedulable,
    /// A volume the pod's bound claim uses cannot be reached from the node (its node affinity).
    VolumeNodeAffinityConflict,
    /// No volume that can be bound to one of the pod's waiting claims is reachable from the node.
    NoVolumeToBind,
}

impl fmt::Display for Unfit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::InsufficientResource { resource, .. } if resource == RESOURCE_PODS => {
                f.write_str("Too many pods")
            }
            Self::InsufficientResource { resource, .. } => write!(f, "Insufficient {resource}"),
            Self::NodeSelectorMismatch | Self::NodeAffinityMismatch => {
                f.write_str("node(s) didn't match Pod's node affinity/selector")
            }
            Self::UntoleratedTaint { key, value, .. } => {
                write!(f, "node(s) had untolerated taint {{{key}: {value}}}")
            }
            Self::Unschedulable => f.write_str("node(s) were unschedulable"),
            Self::VolumeNodeAffinityConflict => {
                f.write_str("node(s) had volume node affinity conflict")
            }
            Self::NoVolumeToBind => {
                f.write_str("node(s) didn't find available persistent volumes to bind")
            }
        }
    }
}

/// The kube-scheduler filter plugin a reason comes from, in the order the default profile runs
/// them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Plugin {
    NodeUnschedulable,
    TaintToleration,
    NodeAffinity,
    NodeResourcesFit,
    VolumeBinding,
}

impl Unfit {
    fn plugin(&self) -> Plugin {
        match self {
            Self::Unschedulable => Plugin::NodeUnschedulable,
            Self::UntoleratedTaint { .. } => Plugin::TaintToleration,
            Self::NodeSelectorMismatch | Self::NodeAffinityMismatch => Plugin::NodeAffinity,
            Self::InsufficientResource { .. } => Plugin::NodeResourcesFit,
            Self::VolumeNodeAffinityConflict | Self::NoVolumeToBind => Plugin::VolumeBinding,
        }
    }
}

impl<'a> PodConstraints<'a> {
    /// Constraints from explicit values.
    pub fn new(
        node_selector: Option<&'a BTreeMap<String, String>>,
        affinity: Option<&'a Affinity>,
        tolerations: &'a [Toleration],
    ) -> Self {
        Self {
            node_selector,
            affinity,
            tolerations,
        }
    }

    /// The constraints of a pod spec.
    pub fn from_spec(spec: &'a PodSpec) -> Self {
        Self {
            node_selector: spec.node_selector.as_ref(),
            affinity: spec.affinity.as_ref(),
            tolerations: spec.tolerations.as_deref().unwrap_or_default(),
        }
    }

    /// The constraints of a pod (none if it has no spec).
    pub fn from_pod(pod: &'a Pod) -> Self {
        pod.spec.as_ref().map(Self::from_spec).unwrap_or_default()
    }

    /// Every non-resource reason the pod cannot go to the node, in kube-scheduler's plugin
    /// order: unschedulable, each untolerated taint, nodeSelector, node affinity.
    pub fn check(&self, node: &NodeView<'_>) -> Vec<Unfit> {
        let mut unfit = Vec::new();
        if node.unschedulable && !tolerates_unschedulable(self.tolerations) {
            unfit.push(Unfit::Unschedulable);
        }
        for taint in untolerated_taints(node.taints, self.tolerations) {
            unfit.push(Unfit::UntoleratedTaint {
                key: taint.key.clone(),
                value: taint.value.clone().unwrap_or_default(),
                effect: taint.effect.clone(),
            });
        }
        if let Some(selector) = self.node_selector
            && !matches_node_selector(selector, node.labels)
        {
            unfit.push(Unfit::NodeSelectorMismatch);
        }
        if !matches_required_node_affinity(self.affinity, node.name, node.labels) {
            unfit.push(Unfit::NodeAffinityMismatch);
        }
        unfit
    }
}

impl<'a> PodRequirements<'a> {
    /// The constraints and effective requests of a pod.
    pub fn from_pod(pod: &'a Pod) -> Result<Self, ResourceError> {
        Ok(Self {
            constraints: PodConstraints::from_pod(pod),
            requests: pod_requests(pod)?,
        })
    }

    /// `Ok` if the pod fits the node, else every reason it does not (constraints first, then
    /// resources; see [`kube_scheduler_reasons`] for the subset kube-scheduler reports).
    pub fn check(&self, node: &NodeView<'_>) -> Result<(), Vec<Unfit>> {
        let mut unfit = self.constraints.check(node);
        unfit.extend(check_resources(&self.requests, node.free));
        if unfit.is_empty() { Ok(()) } else { Err(unfit) }
    }

    /// Whether the pod fits at least one of the nodes.
    pub fn fits_any<'n>(&self, nodes: impl IntoIterator<Item = NodeView<'n>>) -> bool {
        nodes.into_iter().any(|node| self.check(&node).is_ok())
    }
}

/// The resources the pod lacks on a node with `free` resources, like `NodeResourcesFit`: one pod
/// slot must be free; cpu, memory, ephemeral-storage and scalar resources (extended, huge pages,
/// ...) must fit when requested; zero requests always fit. Requests are rounded first the way
/// the scheduler rounds them (cpu to millicores, the rest to units); other resource names are
/// ignored, as the scheduler ignores them.
pub fn check_resources(requests: &ResourceVector, free: &ResourceVector) -> Vec<Unfit> {
    let requests = requests.scheduler_rounded();
    let mut unfit = Vec::new();
    let mut insufficient = |resource: &str, requested: i128| {
        let available = free.get(resource);
        if requested > available {
            unfit.push(Unfit::InsufficientResource {
                resource: resource.to_owned(),
                requested,
                free: available,
            });
        }
    };
    insufficient(RESOURCE_PODS, POD_SLOT);
    for name in [RESOURCE_CPU, RESOURCE_MEMORY, RESOURCE_EPHEMERAL_STORAGE] {
        let requested = requests.get(name);
        if requested > 0 {
            insufficient(name, requested);
        }
    }
    for (name, requested) in requests.iter() {
        if requested != 0 && is_scalar_resource_name(name) {
            insufficient(name, requested);
        }
    }
    unfit
}

/// Whether the requests (plus one pod slot) fit in `free`.
pub fn fits_resources(requests: &ResourceVector, free: &ResourceVector) -> bool {
    check_resources(requests, free).is_empty()
}

/// Whether the requests (plus one pod slot) fit on at least one single node.
pub fn any_node_fits_resources<'n>(
    requests: &ResourceVector,
    nodes: impl IntoIterator<Item = NodeView<'n>>,
) -> bool {
    nodes
        .into_iter()
        .any(|node| fits_resources(requests, node.free))
}

/// Whether every `nodeSelector` pair is a label of the node.
pub fn matches_node_selector(
    selector: &BTreeMap<String, String>,
    labels: &BTreeMap<String, String>,
) -> bool {
    selector
        .iter()
        .all(|(key, value)| labels.get(key) == Some(value))
}

/// Whether the node satisfies the pod's required node affinity (true when there is none).
/// Terms are ORed; an empty term list matches nothing.
pub fn matches_required_node_affinity(
    affinity: Option<&Affinity>,
    node_name: &str,
    labels: &BTreeMap<String, String>,
) -> bool {
    let required = affinity
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|na| {
            na.required_during_scheduling_ignored_during_execution
                .as_ref()
        });
    match required {
        None => true,
        Some(selector) => selector
            .node_selector_terms
            .iter()
            .any(|term| node_selector_term_matches(term, node_name, labels)),
    }
}

/// Whether one node selector term matches: its `matchExpressions` and `matchFields` are ANDed.
/// A term with neither matches nothing, and so does a term with an invalid requirement (bad
/// key, operator, value count, value or integer), as upstream skips terms that fail to parse.
pub fn node_selector_term_matches(
    term: &NodeSelectorTerm,
    node_name: &str,
    labels: &BTreeMap<String, String>,
) -> bool {
    let expressions = term.match_expressions.as_deref().unwrap_or_default();
    let fields = term.match_fields.as_deref().unwrap_or_default();
    if expressions.is_empty() && fields.is_empty() {
        return false;
    }
    if !expressions.iter().all(is_valid_label_requirement)
        || !fields.iter().all(is_valid_field_requirement)
    {
        return false;
    }
    // Upstream only evaluates fields against a node that has a name.
    expressions
        .iter()
        .all(|r| label_requirement_matches(r, labels))
        && (node_name.is_empty()
            || fields
                .iter()
                .all(|r| field_requirement_matches(r, node_name)))
}

/// `labels.NewRequirement`'s validation of a `matchExpressions` entry.
fn is_valid_label_requirement(requirement: &NodeSelectorRequirement) -> bool {
    let values = requirement.values.as_deref().unwrap_or_default();
    let count_ok = match requirement.operator.as_str() {
        "In" | "NotIn" => !values.is_empty(),
        "Exists" | "DoesNotExist" => values.is_empty(),
        "Gt" | "Lt" => values.len() == 1 && values.iter().all(|v| v.parse::<i64>().is_ok()),
        _ => false,
    };
    count_ok && is_qualified_name(&requirement.key) && values.iter().all(|v| is_label_value(v))
}

/// A `matchFields` entry must be `In` or `NotIn` with exactly one value.
fn is_valid_field_requirement(requirement: &NodeSelectorRequirement) -> bool {
    matches!(requirement.operator.as_str(), "In" | "NotIn")
        && requirement.values.as_ref().is_some_and(|v| v.len() == 1)
}

/// Whether a valid `matchExpressions` requirement matches the labels.
fn label_requirement_matches(
    requirement: &NodeSelectorRequirement,
    labels: &BTreeMap<String, String>,
) -> bool {
    let values = requirement.values.as_deref().unwrap_or_default();
    let label = labels.get(&requirement.key);
    match requirement.operator.as_str() {
        "In" => label.is_some_and(|l| values.contains(l)),
        "NotIn" => label.is_none_or(|l| !values.contains(l)),
        "Exists" => label.is_some(),
        "DoesNotExist" => label.is_none(),
        op @ ("Gt" | "Lt") => {
            let Some(Ok(have)) = label.map(|l| l.parse::<i64>()) else {
                return false;
            };
            let Some(Ok(bound)) = values.first().map(|v| v.parse::<i64>()) else {
                return false;
            };
            if op == "Gt" {
                have > bound
            } else {
                have < bound
            }
        }
        _ => false,
    }
}

/// Whether a valid `matchFields` requirement matches; fields other than `metadata.name` read
/// as empty, as upstream's field set only holds the name.
fn field_requirement_matches(requirement: &NodeSelectorRequirement, node_name: &str) -> bool {
    let field = if requirement.key == FIELD_NODE_NAME {
        node_name
    } else {
        ""
    };
    let expected = requirement.values.as_deref().and_then(<[String]>::first);
    match requirement.operator.as_str() {
        "In" => expected.is_some_and(|v| v == field),
        "NotIn" => expected.is_some_and(|v| v != field),
        _ => false,
    }
}

/// Whether a toleration tolerates a taint (`Toleration.ToleratesTaint`): an empty effect matches
/// every effect, an empty key every key; operator `Exists` matches any value, `Equal` or unset
/// compares values; any other operator tolerates nothing.
pub fn toleration_tolerates_taint(toleration: &Toleration, taint: &Taint) -> bool {
    let effect = toleration.effect.as_deref().unwrap_or_default();
    if !effect.is_empty() && effect != taint.effect {
        return false;
    }
    let key = toleration.key.as_deref().unwrap_or_default();
    if !key.is_empty() && key != taint.key {
        return false;
    }
    match toleration.operator.as_deref().unwrap_or_default() {
        "" | "Equal" => {
            toleration.value.as_deref().unwrap_or_default()
                == taint.value.as_deref().unwrap_or_default()
        }
        "Exists" => true,
        _ => false,
    }
}

/// Whether any of the tolerations tolerates the taint.
pub fn tolerations_tolerate_taint(tolerations: &[Toleration], taint: &Taint) -> bool {
    tolerations
        .iter()
        .any(|t| toleration_tolerates_taint(t, taint))
}

/// The node's `NoSchedule` and `NoExecute` taints that no toleration tolerates, in node order
/// (`PreferNoSchedule` never blocks scheduling).
pub fn untolerated_taints<'t>(taints: &'t [Taint], tolerations: &[Toleration]) -> Vec<&'t Taint> {
    taints
        .iter()
        .filter(|t| t.effect == EFFECT_NO_SCHEDULE || t.effect == EFFECT_NO_EXECUTE)
        .filter(|t| !tolerations_tolerate_taint(tolerations, t))
        .collect()
}

/// Whether the tolerations let a pod onto a cordoned node: they must tolerate
/// `node.kubernetes.io/unschedulable:NoSchedule` (`NodeUnschedulable`).
pub fn tolerates_unschedulable(tolerations: &[Toleration]) -> bool {
    let taint = Taint {
        key: TAINT_UNSCHEDULABLE.to_owned(),
        effect: EFFECT_NO_SCHEDULE.to_owned(),
        ..Default::default()
    };
    tolerations_tolerate_taint(tolerations, &taint)
}

/// The reasons kube-scheduler itself would report for a node: it stops at the first failing
/// plugin, reports only the first untolerated taint and one affinity/selector reason, but every
/// insufficient resource.
pub fn kube_scheduler_reasons(unfit: &[Unfit]) -> Vec<&Unfit> {
    let Some(first) = unfit.iter().min_by_key(|u| u.plugin()) else {
        return Vec::new();
    };
    match first.plugin() {
        Plugin::NodeResourcesFit => unfit
            .iter()
            .filter(|u| u.plugin() == Plugin::NodeResourcesFit)
            .collect(),
        _ => vec![first],
    }
}

/// kube-scheduler's `FitError` message, e.g. `0/3 nodes are available: 1 Insufficient cpu, 2
/// node(s) were unschedulable.`: each node contributes its [`kube_scheduler_reasons`], counted
/// per text and sorted as strings.
pub fn summarize<'u>(
    total_nodes: usize,
    per_node: impl IntoIterator<Item = &'u [Unfit]>,
) -> String {
    let mut histogram: BTreeMap<String, usize> = BTreeMap::new();
    for unfit in per_node {
        for reason in kube_scheduler_reasons(unfit) {
            *histogram.entry(reason.to_string()).or_insert(0) += 1;
        }
    }
    let mut entries: Vec<String> = histogram
        .into_iter()
        .map(|(reason, count)| format!("{count} {reason}"))
        .collect();
    entries.sort();
    let mut message = format!("0/{total_nodes} nodes are available:");
    if !entries.is_empty() {
        message.push(' ');
        message.push_str(&entries.join(", "));
        message.push('.');
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quantity::{NANOS_PER_MILLI, NANOS_PER_UNIT};
    use k8s_openapi::api::core::v1::{Container, NodeAffinity, NodeSelector, ResourceRequirements};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use pretty_assertions::assert_eq;
    use proptest::prelude::*;

    const U: i128 = NANOS_PER_UNIT;
    const M: i128 = NANOS_PER_MILLI;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn vector(pairs: &[(&str, i128)]) -> ResourceVector {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect()
    }

    fn req(key: &str, op: &str, values: &[&str]) -> NodeSelectorRequirement {
        NodeSelectorRequirement {
            key: key.to_owned(),
            operator: op.to_owned(),
            values: (!values.is_empty()).then(|| values.iter().map(|v| (*v).to_owned()).collect()),
        }
    }

    fn term(
        exprs: Vec<NodeSelectorRequirement>,
        fields: Vec<NodeSelectorRequirement>,
    ) -> NodeSelectorTerm {
        NodeSelectorTerm {
            match_expressions: (!exprs.is_empty()).then_some(exprs),
            match_fields: (!fields.is_empty()).then_some(fields),
        }
    }

    fn affinity(terms: Vec<NodeSelectorTerm>) -> Affinity {
        Affinity {
            node_affinity: Some(NodeAffinity {
                required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                    node_selector_terms: terms,
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn expr_matches(r: NodeSelectorRequirement, node_labels: &[(&str, &str)]) -> bool {
        node_selector_term_matches(&term(vec![r], vec![]), "node-1", &labels(node_labels))
    }

    fn taint(key: &str, value: Option<&str>, effect: &str) -> Taint {
        Taint {
            key: key.to_owned(),
            value: value.map(str::to_owned),
            effect: effect.to_owned(),
            ..Default::default()
        }
    }

    fn toleration(
        key: Option<&str>,
        op: Option<&str>,
        value: Option<&str>,
        effect: Option<&str>,
    ) -> Toleration {
        Toleration {
            key: key.map(str::to_owned),
            operator: op.map(str::to_owned),
            value: value.map(str::to_owned),
            effect: effect.map(str::to_owned),
            ..Default::default()
        }
    }

    #[test]
    fn operator_in_and_not_in() {
        assert!(expr_matches(
            req("zone", "In", &["a", "b"]),
            &[("zone", "b")]
        ));
        assert!(!expr_matches(
            req("zone", "In", &["a", "b"]),
            &[("zone", "c")]
        ));
        assert!(!expr_matches(req("zone", "In", &["a"]), &[]));
        assert!(expr_matches(req("zone", "NotIn", &["a"]), &[("zone", "b")]));
        assert!(
            expr_matches(req("zone", "NotIn", &["a"]), &[]),
            "absent label is not in the set"
        );
        assert!(!expr_matches(
            req("zone", "NotIn", &["a"]),
            &[("zone", "a")]
        ));
        // In/NotIn without values is a parse error: the term never matches.
        assert!(!expr_matches(req("zone", "NotIn", &[]), &[("zone", "b")]));
        assert!(!expr_matches(req("zone", "In", &[]), &[("zone", "")]));
    }

    #[test]
    fn operator_exists_and_does_not_exist() {
        assert!(expr_matches(req("gpu", "Exists", &[]), &[("gpu", "")]));
        assert!(!expr_matches(req("gpu", "Exists", &[]), &[("cpu", "x")]));
        assert!(expr_matches(req("gpu", "DoesNotExist", &[]), &[]));
        assert!(!expr_matches(
            req("gpu", "DoesNotExist", &[]),
            &[("gpu", "1")]
        ));
        // Values are not allowed with these operators.
        assert!(!expr_matches(req("gpu", "Exists", &["1"]), &[("gpu", "1")]));
        assert!(!expr_matches(req("gpu", "DoesNotExist", &["1"]), &[]));
    }

    #[test]
    fn operator_gt_and_lt_compare_integers() {
        assert!(expr_matches(req("cores", "Gt", &["4"]), &[("cores", "8")]));
        assert!(!expr_matches(req("cores", "Gt", &["8"]), &[("cores", "8")]));
        assert!(expr_matches(req("cores", "Lt", &["8"]), &[("cores", "-3")]));
        assert!(!expr_matches(req("cores", "Lt", &["8"]), &[("cores", "8")]));
        // A negative bound is not a valid label value, so the requirement never parses.
        assert!(!expr_matches(
            req("cores", "Gt", &["-1"]),
            &[("cores", "5")]
        ));
        // Missing or non-integer label: no match.
        assert!(!expr_matches(req("cores", "Gt", &["4"]), &[]));
        assert!(!expr_matches(
            req("cores", "Gt", &["4"]),
            &[("cores", "8.5")]
        ));
        assert!(!expr_matches(
            req("cores", "Gt", &["4"]),
            &[("cores", "99999999999999999999")]
        ));
        // Invalid requirement: not exactly one integer value.
        assert!(!expr_matches(
            req("cores", "Gt", &["four"]),
            &[("cores", "8")]
        ));
        assert!(!expr_matches(
            req("cores", "Lt", &["1", "2"]),
            &[("cores", "0")]
        ));
        assert!(!expr_matches(req("cores", "Lt", &[]), &[("cores", "0")]));
    }

    #[test]
    fn invalid_requirements_make_the_term_unmatchable() {
        assert!(!expr_matches(
            req("zone", "Equals", &["a"]),
            &[("zone", "a")]
        ));
        assert!(!expr_matches(
            req("bad key", "Exists", &[]),
            &[("bad key", "a")]
        ));
        assert!(!expr_matches(
            req("zone", "In", &["not a label value"]),
            &[("zone", "a")]
        ));
        assert!(expr_matches(
            req("example.com/zone", "In", &["a"]),
            &[("example.com/zone", "a")]
        ));
        // One invalid term does not spoil another term.
        let a = affinity(vec![
            term(vec![req("zone", "In", &[])], vec![]),
            term(vec![req("zone", "In", &["a"])], vec![]),
        ]);
        assert!(matches_required_node_affinity(
            Some(&a),
            "n",
            &labels(&[("zone", "a")])
        ));
    }

    #[test]
    fn expressions_within_a_term_are_anded_and_terms_are_ored() {
        let t = term(
            vec![req("zone", "In", &["a"]), req("gpu", "Exists", &[])],
            vec![],
        );
        assert!(node_selector_term_matches(
            &t,
            "n",
            &labels(&[("zone", "a"), ("gpu", "1")])
        ));
        assert!(!node_selector_term_matches(
            &t,
            "n",
            &labels(&[("zone", "a")])
        ));
        let a = affinity(vec![
            term(vec![req("zone", "In", &["a"])], vec![]),
            term(vec![req("zone", "In", &["b"])], vec![]),
        ]);
        assert!(matches_required_node_affinity(
            Some(&a),
            "n",
            &labels(&[("zone", "b")])
        ));
        assert!(!matches_required_node_affinity(
            Some(&a),
            "n",
            &labels(&[("zone", "c")])
        ));
    }

    #[test]
    fn empty_terms_and_empty_term_lists_match_nothing() {
        let node = labels(&[("zone", "a")]);
        assert!(!node_selector_term_matches(
            &term(vec![], vec![]),
            "n",
            &node
        ));
        assert!(!matches_required_node_affinity(
            Some(&affinity(vec![])),
            "n",
            &node
        ));
        let a = affinity(vec![term(vec![], vec![])]);
        assert!(!matches_required_node_affinity(Some(&a), "n", &node));
        // No required affinity at all matches everything.
        assert!(matches_required_node_affinity(None, "n", &node));
        assert!(matches_required_node_affinity(
            Some(&Affinity::default()),
            "n",
            &node
        ));
    }

    #[test]
    fn match_fields_support_metadata_name_with_in_and_not_in() {
        let node = labels(&[]);
        let in_ = term(vec![], vec![req("metadata.name", "In", &["node-1"])]);
        assert!(node_selector_term_matches(&in_, "node-1", &node));
        assert!(!node_selector_term_matches(&in_, "node-2", &node));
        let not_in = term(vec![], vec![req("metadata.name", "NotIn", &["node-1"])]);
        assert!(!node_selector_term_matches(&not_in, "node-1", &node));
        assert!(node_selector_term_matches(&not_in, "node-2", &node));
        // Exactly one value, and only In/NotIn.
        let two = term(
            vec![],
            vec![req("metadata.name", "In", &["node-1", "node-2"])],
        );
        assert!(!node_selector_term_matches(&two, "node-1", &node));
        let exists = term(vec![], vec![req("metadata.name", "Exists", &[])]);
        assert!(!node_selector_term_matches(&exists, "node-1", &node));
        // Fields and expressions are ANDed.
        let both = term(
            vec![req("zone", "In", &["a"])],
            vec![req("metadata.name", "In", &["node-1"])],
        );
        assert!(node_selector_term_matches(
            &both,
            "node-1",
            &labels(&[("zone", "a")])
        ));
        assert!(!node_selector_term_matches(
            &both,
            "node-1",
            &labels(&[("zone", "b")])
        ));
        assert!(!node_selector_term_matches(
            &both,
            "node-2",
            &labels(&[("zone", "a")])
        ));
    }

    #[test]
    fn node_selector_requires_every_pair() {
        let node = labels(&[("zone", "a"), ("disk", "ssd")]);
        assert!(matches_node_selector(&labels(&[]), &node));
        assert!(matches_node_selector(&labels(&[("zone", "a")]), &node));
        assert!(matches_node_selector(
            &labels(&[("zone", "a"), ("disk", "ssd")]),
            &node
        ));
        assert!(!matches_node_selector(
            &labels(&[("zone", "a"), ("disk", "hdd")]),
            &node
        ));
        assert!(!matches_node_selector(&labels(&[("gpu", "")]), &node));
    }

    #[test]
    fn toleration_matching_rules() {
        let t = taint("dedicated", Some("gpu"), "NoSchedule");
        // Equal (explicit or unset operator) compares values.
        assert!(toleration_tolerates_taint(
            &toleration(
                Some("dedicated"),
                Some("Equal"),
                Some("gpu"),
                Some("NoSchedule")
            ),
            &t
        ));
        assert!(toleration_tolerates_taint(
            &toleration(Some("dedicated"), None, Some("gpu"), None),
            &t
        ));
        assert!(!toleration_tolerates_taint(
            &toleration(Some("dedicated"), None, Some("cpu"), None),
            &t
        ));
        assert!(!toleration_tolerates_taint(
            &toleration(Some("dedicated"), None, None, None),
            &t
        ));
        // Exists ignores the value; an empty key with Exists matches every key.
        assert!(toleration_tolerates_taint(
            &toleration(Some("dedicated"), Some("Exists"), None, None),
            &t
        ));
        assert!(toleration_tolerates_taint(
            &toleration(None, Some("Exists"), None, None),
            &t
        ));
        assert!(!toleration_tolerates_taint(
            &toleration(Some("other"), Some("Exists"), None, None),
            &t
        ));
        // Effect must match unless empty.
        assert!(!toleration_tolerates_taint(
            &toleration(None, Some("Exists"), None, Some("NoExecute")),
            &t
        ));
        assert!(toleration_tolerates_taint(
            &toleration(None, Some("Exists"), None, Some("NoSchedule")),
            &t
        ));
        // Unknown operators tolerate nothing.
        assert!(!toleration_tolerates_taint(
            &toleration(Some("dedicated"), Some("Gt"), Some("gpu"), None),
            &t
        ));
        // A taint without value matches an Equal toleration without value.
        let bare = taint("dedicated", None, "NoExecute");
        assert!(toleration_tolerates_taint(
            &toleration(Some("dedicated"), Some("Equal"), None, None),
            &bare
        ));
    }

    #[test]
    fn only_no_schedule_and_no_execute_taints_block() {
        let taints = vec![
            taint("soft", Some("x"), "PreferNoSchedule"),
            taint("hard", Some("y"), "NoSchedule"),
            taint("evict", None, "NoExecute"),
        ];
        let found = untolerated_taints(&taints, &[]);
        assert_eq!(found, vec![&taints[1], &taints[2]]);
        let tolerations = vec![toleration(Some("hard"), Some("Exists"), None, None)];
        assert_eq!(untolerated_taints(&taints, &tolerations), vec![&taints[2]]);
        let all = vec![toleration(None, Some("Exists"), None, None)];
        assert!(untolerated_taints(&taints, &all).is_empty());
    }

    #[test]
    fn cordoned_node_needs_the_unschedulable_toleration() {
        assert!(!tolerates_unschedulable(&[]));
        assert!(tolerates_unschedulable(&[toleration(
            Some(TAINT_UNSCHEDULABLE),
            Some("Exists"),
            None,
            Some("NoSchedule")
        )]));
        assert!(tolerates_unschedulable(&[toleration(
            Some(TAINT_UNSCHEDULABLE),
            None,
            None,
            None
        )]));
        assert!(tolerates_unschedulable(&[toleration(
            None,
            Some("Exists"),
            None,
            None
        )]));
        assert!(!tolerates_unschedulable(&[toleration(
            Some(TAINT_UNSCHEDULABLE),
            Some("Exists"),
            None,
            Some("NoExecute")
        )]));
    }

    #[test]
    fn resources_must_fit_including_one_pod_slot() {
        let free = vector(&[
            ("cpu", 2 * U),
            ("memory", 4 * U),
            ("pods", 3 * U),
            ("nvidia.com/gpu", U),
        ]);
        assert!(fits_resources(
            &vector(&[("cpu", 2 * U), ("memory", 4 * U)]),
            &free
        ));
        assert_eq!(
            check_resources(
                &vector(&[
                    ("cpu", 2 * U + 1),
                    ("nvidia.com/gpu", 2 * U),
                    ("example.com/fpga", U)
                ]),
                &free
            ),
            vec![
                Unfit::InsufficientResource {
                    resource: "cpu".into(),
                    requested: 2 * U + M,
                    free: 2 * U
                },
                Unfit::InsufficientResource {
                    resource: "example.com/fpga".into(),
                    requested: U,
                    free: 0
                },
                Unfit::InsufficientResource {
                    resource: "nvidia.com/gpu".into(),
                    requested: 2 * U,
                    free: U
                },
            ]
        );
        let full = vector(&[("cpu", 8 * U), ("pods", 0)]);
        assert_eq!(
            check_resources(&ResourceVector::new(), &full),
            vec![Unfit::InsufficientResource {
                resource: "pods".into(),
                requested: U,
                free: 0
            }]
        );
    }

    #[test]
    fn zero_requests_always_fit_and_unknown_names_are_ignored() {
        let free = vector(&[("pods", U), ("cpu", -U)]);
        assert!(fits_resources(
            &vector(&[("cpu", 0), ("nvidia.com/gpu", 0)]),
            &free
        ));
        // Not resources the scheduler checks.
        assert!(fits_resources(
            &vector(&[("storage", U), ("pods", 5 * U)]),
            &free
        ));
        // Sub-millicore cpu is rounded up like the scheduler does.
        let tight = vector(&[("pods", U), ("cpu", M)]);
        assert!(fits_resources(&vector(&[("cpu", M / 2)]), &tight));
        assert!(!fits_resources(&vector(&[("cpu", M + 1)]), &tight));
    }

    #[test]
    fn unfit_texts_match_kube_scheduler() {
        let texts: Vec<String> = [
            Unfit::InsufficientResource {
                resource: "cpu".into(),
                requested: 1,
                free: 0,
            },
            Unfit::InsufficientResource {
                resource: "pods".into(),
                requested: 1,
                free: 0,
            },
            Unfit::NodeSelectorMismatch,
            Unfit::NodeAffinityMismatch,
            Unfit::UntoleratedTaint {
                key: "k".into(),
                value: "v".into(),
                effect: "NoSchedule".into(),
            },
            Unfit::Unschedulable,
        ]
        .iter()
        .map(ToString::to_string)
        .collect();
        assert_eq!(
            texts,
            vec![
                "Insufficient cpu",
                "Too many pods",
                "node(s) didn't match Pod's node affinity/selector",
                "node(s) didn't match Pod's node affinity/selector",
                "node(s) had untolerated taint {k: v}",
                "node(s) were unschedulable",
            ]
        );
    }

    fn container_pod(requests: &[(&str, &str)]) -> Pod {
        Pod {
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "app".into(),
                    resources: Some(ResourceRequirements {
                        requests: Some(
                            requests
                                .iter()
                                .map(|(k, v)| ((*k).to_owned(), Quantity((*v).to_owned())))
                                .collect(),
                        ),
                        ..Default::default()
                    }),
                    ..Default::default()
                }],
                node_selector: Some(labels(&[("zone", "a")])),
                tolerations: Some(vec![toleration(
                    Some("dedicated"),
                    Some("Exists"),
                    None,
                    None,
                )]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn pod_check_lists_every_reason_in_plugin_order() {
        let pod = container_pod(&[("cpu", "4"), ("memory", "1Gi")]);
        let requirements = PodRequirements::from_pod(&pod).unwrap();
        let node_labels = labels(&[("zone", "b")]);
        let taints = vec![
            taint("dedicated", Some("x"), "NoSchedule"),
            taint("a", Some("1"), "NoSchedule"),
            taint("b", None, "NoExecute"),
        ];
        let free = vector(&[("cpu", 2 * U), ("memory", (1 << 40) * U), ("pods", 10 * U)]);
        let node = NodeView {
            name: "n1",
            labels: &node_labels,
            taints: &taints,
            unschedulable: true,
            free: &free,
        };
        let unfit = requirements.check(&node).unwrap_err();
        assert_eq!(
            unfit,
            vec![
                Unfit::Unschedulable,
                Unfit::UntoleratedTaint {
                    key: "a".into(),
                    value: "1".into(),
                    effect: "NoSchedule".into()
                },
                Unfit::UntoleratedTaint {
                    key: "b".into(),
                    value: String::new(),
                    effect: "NoExecute".into()
                },
                Unfit::NodeSelectorMismatch,
                Unfit::InsufficientResource {
                    resource: "cpu".into(),
                    requested: 4 * U,
                    free: 2 * U
                },
            ]
        );
        assert_eq!(kube_scheduler_reasons(&unfit), vec![&Unfit::Unschedulable]);
        assert_eq!(kube_scheduler_reasons(&unfit[1..]), vec![&unfit[1]]);
        assert_eq!(kube_scheduler_reasons(&unfit[3..]), vec![&unfit[3]]);

        let good_labels = labels(&[("zone", "a")]);
        let roomy = vector(&[("cpu", 4 * U), ("memory", (1 << 40) * U), ("pods", U)]);
        let fits = NodeView {
            name: "n2",
            labels: &good_labels,
            taints: &taints[..1],
            unschedulable: false,
            free: &roomy,
        };
        assert_eq!(requirements.check(&fits), Ok(()));
        assert!(requirements.fits_any([node, fits]));
        assert!(!requirements.fits_any([node]));
        assert!(any_node_fits_resources(
            &requirements.requests,
            [node, fits]
        ));
        assert!(!any_node_fits_resources(&requirements.requests, [node]));
    }

    #[test]
    fn constraints_from_explicit_values() {
        let selector = labels(&[("zone", "a")]);
        let aff = affinity(vec![term(vec![req("gpu", "Exists", &[])], vec![])]);
        let tolerations = [toleration(None, Some("Exists"), None, None)];
        let constraints = PodConstraints::new(Some(&selector), Some(&aff), &tolerations);
        let free = ResourceVector::new();
        let taints = [taint("x", None, "NoExecute")];
        let node_labels = labels(&[("zone", "a")]);
        let node = NodeView {
            name: "n",
            labels: &node_labels,
            taints: &taints,
            unschedulable: true,
            free: &free,
        };
        assert_eq!(constraints.check(&node), vec![Unfit::NodeAffinityMismatch]);
        let gpu_labels = labels(&[("zone", "a"), ("gpu", "1")]);
        let node = NodeView {
            labels: &gpu_labels,
            ..node
        };
        assert_eq!(constraints.check(&node), vec![]);
        let clean = NodeView {
            taints: &[],
            unschedulable: false,
            ..node
        };
        assert_eq!(
            PodConstraints::from_pod(&Pod::default()).check(&clean),
            vec![]
        );
        assert_eq!(
            PodConstraints::from_pod(&Pod::default()).check(&node).len(),
            2
        );
    }

    #[test]
    fn summary_matches_kube_scheduler_fit_error() {
        let cpu = Unfit::InsufficientResource {
            resource: "cpu".into(),
            requested: 1,
            free: 0,
        };
        let mem = Unfit::InsufficientResource {
            resource: "memory".into(),
            requested: 1,
            free: 0,
        };
        let per_node = [
            vec![cpu.clone(), mem],
            vec![Unfit::Unschedulable, cpu.clone()],
            vec![cpu],
            vec![Unfit::NodeSelectorMismatch, Unfit::NodeAffinityMismatch],
        ];
        assert_eq!(
            summarize(5, per_node.iter().map(Vec::as_slice)),
            "0/5 nodes are available: 1 Insufficient memory, 1 node(s) didn't match Pod's node \
             affinity/selector, 1 node(s) were unschedulable, 2 Insufficient cpu."
        );
        assert_eq!(summarize(0, []), "0/0 nodes are available:");
    }

    proptest! {
        #[test]
        fn exists_toleration_with_empty_key_tolerates_everything(
            key in "[a-z./]{0,12}", value in proptest::option::of("[a-z]{0,5}"),
            effect in prop::sample::select(vec!["NoSchedule", "NoExecute", "PreferNoSchedule"]),
        ) {
            let t = taint(&key, value.as_deref(), effect);
            prop_assert!(toleration_tolerates_taint(&toleration(None, Some("Exists"), None, None), &t));
            prop_assert!(untolerated_taints(std::slice::from_ref(&t), &[toleration(None, Some("Exists"), None, None)]).is_empty());
        }

        #[test]
        fn in_and_not_in_are_complements_when_the_label_exists(
            value in "[a-z]{1,3}", set in prop::collection::vec("[a-z]{1,3}", 1..4),
        ) {
            let set: Vec<&str> = set.iter().map(String::as_str).collect();
            let node = [("k", value.as_str())];
            prop_assert_ne!(expr_matches(req("k", "In", &set), &node), expr_matches(req("k", "NotIn", &set), &node));
        }

        #[test]
        fn fit_is_monotonic_in_free_resources(cpu in 0i128..10_000, free_cpu in 0i128..10_000, extra in 0i128..10_000) {
            let requests = vector(&[("cpu", cpu * M)]);
            let free = vector(&[("cpu", free_cpu * M), ("pods", U)]);
            let more = vector(&[("cpu", (free_cpu + extra) * M), ("pods", U)]);
            prop_assert_eq!(fits_resources(&requests, &free), cpu <= free_cpu);
            if fits_resources(&requests, &free) {
                prop_assert!(fits_resources(&requests, &more));
            }
        }
    }
}
