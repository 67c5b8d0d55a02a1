//! The simulated scheduler's own placement rules, deliberately simple and written apart from
//! `tensile_core::fit` and `tensile_core::capacity`: the scheduler extender decides with
//! those, so on the simulator it is checked against a second opinion, as kube-scheduler is on
//! real control planes. The filters are kube-scheduler's default ones that a simulated cluster
//! needs (NodeUnschedulable, TaintToleration, NodeAffinity, NodeResourcesFit), with its
//! messages; the score is NodeResourcesFit's default, LeastAllocated over CPU and memory.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use k8s_openapi::api::core::v1::{Node, NodeSelectorTerm, Pod, PodSpec, Taint, Toleration};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use tensile_core::quantity::parse_quantity;

/// Resource amounts in milli-units (`cpu` in millicores, `memory` in thousandths of a byte),
/// by resource name.
pub(crate) type Amounts = BTreeMap<String, i128>;

const CPU: &str = "cpu";
const MEMORY: &str = "memory";
pub(crate) const PODS: &str = "pods";
/// What LeastAllocated counts for a container without a CPU or memory request.
const DEFAULT_CPU_MILLI: i128 = 100;
const DEFAULT_MEMORY_MILLI: i128 = 200 * 1024 * 1024 * 1000;

fn milli(q: &Quantity) -> i128 {
    // An unparsable quantity never passed the API server's validation; counted as nothing.
    parse_quantity(&q.0).map_or(0, |p| p.milli_value())
}

/// What the scheduler knows of a node.
#[derive(Clone, Debug, Default)]
pub(crate) struct NodeFacts {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub taints: Vec<Taint>,
    pub unschedulable: bool,
    pub ready: bool,
    pub allocatable: Amounts,
}

impl NodeFacts {
    pub(crate) fn of(node: &Node) -> Self {
        let spec = node.spec.as_ref();
        let status = node.status.as_ref();
        Self {
            name: node.metadata.name.clone().unwrap_or_default(),
            labels: node.metadata.labels.clone().unwrap_or_default(),
            taints: spec.and_then(|s| s.taints.clone()).unwrap_or_default(),
            unschedulable: spec.and_then(|s| s.unschedulable).unwrap_or(false),
            ready: status
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True")),
            allocatable: status
                .and_then(|s| s.allocatable.as_ref())
                .map(|a| a.iter().map(|(k, q)| (k.clone(), milli(q))).collect())
                .unwrap_or_default(),
        }
    }
}

/// A pod's requests as the scheduler counts them: the larger of its containers' sum (with
/// sidecars) and its largest ordinary init container, plus its overhead and one pod;
/// `nonzero` is the same for CPU and memory with LeastAllocated's defaults for containers
/// that ask for none.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Requests {
    pub amounts: Amounts,
    nonzero: (i128, i128),
}

impl Requests {
    /// `ignored`: resources the scheduler leaves to an extender (`ignoredByScheduler`).
    pub(crate) fn of(spec: &PodSpec, ignored: &[String]) -> Self {
        let container = |c: &k8s_openapi::api::core::v1::Container| -> Amounts {
            let res = c.resources.as_ref();
            let mut out: Amounts = res
                .and_then(|r| r.limits.as_ref())
                .map(|l| l.iter().map(|(k, q)| (k.clone(), milli(q))).collect())
                .unwrap_or_default();
            // A request defaults to its limit.
            for (k, q) in res.and_then(|r| r.requests.as_ref()).into_iter().flatten() {
                out.insert(k.clone(), milli(q));
            }
            out
        };
        let add = |into: &mut Amounts, from: &Amounts| {
            for (k, v) in from {
                *into.entry(k.clone()).or_default() += v;
            }
        };
        let nonzero = |a: &Amounts| {
            (
                a.get(CPU)
                    .copied()
                    .filter(|v| *v > 0)
                    .unwrap_or(DEFAULT_CPU_MILLI),
                a.get(MEMORY)
                    .copied()
                    .filter(|v| *v > 0)
                    .unwrap_or(DEFAULT_MEMORY_MILLI),
            )
        };
        let mut sum = Amounts::new();
        let mut sum_nonzero = (0, 0);
        let sidecars = spec
            .init_containers
            .iter()
            .flatten()
            .filter(|c| c.restart_policy.as_deref() == Some("Always"));
        for c in spec.containers.iter().chain(sidecars) {
            let a = container(c);
            let (cpu, mem) = nonzero(&a);
            sum_nonzero = (sum_nonzero.0 + cpu, sum_nonzero.1 + mem);
            add(&mut sum, &a);
        }
        for c in spec.init_containers.iter().flatten() {
            if c.restart_policy.as_deref() == Some("Always") {
                continue;
            }
            for (k, v) in container(c) {
                let slot = sum.entry(k).or_default();
                *slot = (*slot).max(v);
            }
        }
        if let Some(overhead) = &spec.overhead {
            let o: Amounts = overhead
                .iter()
                .map(|(k, q)| (k.clone(), milli(q)))
                .collect();
            add(&mut sum, &o);
        }
        sum.retain(|k, v| *v > 0 && !ignored.contains(k));
        sum.insert(PODS.into(), 1000);
        Self {
            amounts: sum,
            nonzero: sum_nonzero,
        }
    }
}

/// Why a pod does not fit a node, in kube-scheduler's words.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Reason {
    // In the order of the default profile's filter plugins.
    Unschedulable,
    Taint { key: String, value: String },
    Affinity,
    Insufficient(String),
    VolumeConflict,
    NoVolume,
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unschedulable => f.write_str("node(s) were unschedulable"),
            Self::Taint { key, value } => {
                write!(f, "node(s) had untolerated taint {{{key}: {value}}}")
            }
            Self::Affinity => f.write_str("node(s) didn't match Pod's node affinity/selector"),
            Self::Insufficient(r) if r == PODS => f.write_str("Too many pods"),
            Self::Insufficient(r) => write!(f, "Insufficient {r}"),
            Self::VolumeConflict => f.write_str("node(s) had volume node affinity conflict"),
            Self::NoVolume => {
                f.write_str("node(s) didn't find available persistent volumes to bind")
            }
        }
    }
}

/// Whether a toleration tolerates a taint.
pub(crate) fn tolerates(t: &Toleration, taint: &Taint) -> bool {
    let effect_ok = t
        .effect
        .as_deref()
        .is_none_or(|e| e.is_empty() || e == taint.effect);
    let key = t.key.as_deref().unwrap_or_default();
    match t.operator.as_deref().unwrap_or("Equal") {
        "Exists" => effect_ok && (key.is_empty() || key == taint.key),
        "Equal" => {
            effect_ok
                && key == taint.key
                && t.value.as_deref().unwrap_or_default()
                    == taint.value.as_deref().unwrap_or_default()
        }
        _ => false,
    }
}

/// The `NoSchedule` and `NoExecute` taints of `taints` no toleration tolerates.
pub(crate) fn untolerated<'t>(taints: &'t [Taint], tolerations: &[Toleration]) -> Vec<&'t Taint> {
    taints
        .iter()
        .filter(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
        .filter(|t| !tolerations.iter().any(|tol| tolerates(tol, t)))
        .collect()
}

/// Whether a node selector term (its expressions and fields ANDed) matches a node.
pub(crate) fn term_matches(
    term: &NodeSelectorTerm,
    name: &str,
    labels: &BTreeMap<String, String>,
) -> bool {
    let exprs = term.match_expressions.as_deref().unwrap_or_default();
    let fields = term.match_fields.as_deref().unwrap_or_default();
    if exprs.is_empty() && fields.is_empty() {
        return false;
    }
    let one = |value: Option<&str>, op: &str, values: &[String]| -> bool {
        let int = |s: &str| s.parse::<i64>().ok();
        match op {
            "In" => value.is_some_and(|v| values.iter().any(|x| x == v)),
            "NotIn" => value.is_none_or(|v| !values.iter().any(|x| x == v)),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            "Gt" | "Lt" => {
                let (Some(v), Some(bound)) =
                    (value.and_then(int), values.first().and_then(|b| int(b)))
                else {
                    return false;
                };
                if op == "Gt" { v > bound } else { v < bound }
            }
            _ => false,
        }
    };
    exprs.iter().all(|e| {
        one(
            labels.get(&e.key).map(String::as_str),
            &e.operator,
            e.values.as_deref().unwrap_or_default(),
        )
    }) && fields.iter().all(|f| {
        let value = (f.key == "metadata.name").then_some(name);
        one(value, &f.operator, f.values.as_deref().unwrap_or_default())
    })
}

/// Whether the pod's nodeSelector and required node affinity admit the node.
pub(crate) fn affinity_admits(spec: &PodSpec, node: &NodeFacts) -> bool {
    let selector_ok = spec
        .node_selector
        .iter()
        .flatten()
        .all(|(k, v)| node.labels.get(k) == Some(v));
    let required = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|a| {
            a.required_during_scheduling_ignored_during_execution
                .as_ref()
        });
    selector_ok
        && required.is_none_or(|r| {
            r.node_selector_terms
                .iter()
                .any(|t| term_matches(t, &node.name, &node.labels))
        })
}

/// The reasons kube-scheduler gives for a node: those of the first filter that fails (every
/// short resource; one taint).
pub(crate) fn filter(
    spec: &PodSpec,
    req: &Requests,
    node: &NodeFacts,
    used: &Amounts,
) -> Vec<Reason> {
    let tolerations = spec.tolerations.as_deref().unwrap_or_default();
    if node.unschedulable {
        let cordon = Taint {
            key: "node.kubernetes.io/unschedulable".into(),
            effect: "NoSchedule".into(),
            ..Taint::default()
        };
        if !tolerations.iter().any(|t| tolerates(t, &cordon)) {
            return vec![Reason::Unschedulable];
        }
    }
    if let Some(t) = untolerated(&node.taints, tolerations).first() {
        return vec![Reason::Taint {
            key: t.key.clone(),
            value: t.value.clone().unwrap_or_default(),
        }];
    }
    if !affinity_admits(spec, node) {
        return vec![Reason::Affinity];
    }
    req.amounts
        .iter()
        .filter(|(r, want)| {
            let have = node.allocatable.get(*r).copied().unwrap_or(0);
            let taken = used.get(*r).copied().unwrap_or(0);
            **want > have - taken
        })
        .map(|(r, _)| Reason::Insufficient(r.clone()))
        .collect()
}

/// LeastAllocated: the mean over CPU and memory of the share left free once the pod is
/// placed, 0..=100.
pub(crate) fn score(req: &Requests, node: &NodeFacts, used_nonzero: (i128, i128)) -> i128 {
    let share = |resource: &str, used: i128, want: i128| {
        let have = node.allocatable.get(resource).copied().unwrap_or(0);
        if have <= 0 || used + want > have {
            0
        } else {
            (have - used - want) * 100 / have
        }
    };
    (share(CPU, used_nonzero.0, req.nonzero.0) + share(MEMORY, used_nonzero.1, req.nonzero.1)) / 2
}

/// kube-scheduler's message for a pod no node takes: `0/3 nodes are available: 1 Insufficient
/// cpu, 2 node(s) were unschedulable.` (each reason counted, sorted as text).
pub(crate) fn message<'r>(
    total: usize,
    per_node: impl IntoIterator<Item = &'r [Reason]>,
) -> String {
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for reasons in per_node {
        for r in reasons {
            *counts.entry(r.to_string()).or_default() += 1;
        }
    }
    let mut parts: Vec<String> = counts.iter().map(|(r, n)| format!("{n} {r}")).collect();
    parts.sort();
    if parts.is_empty() {
        format!("0/{total} nodes are available:")
    } else {
        format!("0/{total} nodes are available: {}.", parts.join(", "))
    }
}

/// What the pods on each node take: kept from the scheduler's watch of nodes and pods.
#[derive(Debug, Default)]
pub(crate) struct Room {
    nodes: BTreeMap<String, NodeFacts>,
    used: HashMap<String, (Amounts, (i128, i128))>,
    /// Each counted pod's node and requests, by namespace and name.
    placed: HashMap<(String, String), (String, Requests)>,
}

impl Room {
    pub(crate) fn apply_node(&mut self, node: &Node) {
        let facts = NodeFacts::of(node);
        // Every known node has its count, empty until a pod is bound there.
        self.used.entry(facts.name.clone()).or_default();
        self.nodes.insert(facts.name.clone(), facts);
    }

    pub(crate) fn remove_node(&mut self, name: &str) {
        self.nodes.remove(name);
    }

    /// Counts a pod bound to a node until it ends (Succeeded or Failed) or is deleted.
    pub(crate) fn apply_pod(&mut self, pod: &Pod) {
        let key = (
            pod.metadata.namespace.clone().unwrap_or_default(),
            pod.metadata.name.clone().unwrap_or_default(),
        );
        self.forget(&key);
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
        let (Some(spec), Some(node)) = (pod.spec.as_ref(), node.filter(|n| !n.is_empty())) else {
            return;
        };
        if matches!(phase, Some("Succeeded" | "Failed")) {
            return;
        }
        let req = Requests::of(spec, &[]);
        let used = self.used.entry(node.clone()).or_default();
        for (k, v) in &req.amounts {
            *used.0.entry(k.clone()).or_default() += v;
        }
        used.1 = (used.1.0 + req.nonzero.0, used.1.1 + req.nonzero.1);
        self.placed.insert(key, (node, req));
    }

    pub(crate) fn remove_pod(&mut self, namespace: &str, name: &str) {
        self.forget(&(namespace.to_owned(), name.to_owned()));
    }

    fn forget(&mut self, key: &(String, String)) {
        let Some((node, req)) = self.placed.remove(key) else {
            return;
        };
        if let Some(used) = self.used.get_mut(&node) {
            for (k, v) in &req.amounts {
                if let Some(slot) = used.0.get_mut(k) {
                    *slot -= v;
                }
            }
            used.1 = (used.1.0 - req.nonzero.0, used.1.1 - req.nonzero.1);
        }
    }

    /// The Ready nodes, with what their pods take (and LeastAllocated's count of it).
    pub(crate) fn ready_nodes(&self) -> impl Iterator<Item = (&NodeFacts, &Amounts, (i128, i128))> {
        self.nodes
            .values()
            .filter(|n| n.ready)
            .filter_map(|n| self.used.get(&n.name).map(|(a, nz)| (n, a, *nz)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(v: serde_json::Value) -> Node {
        let mut base = json!({"metadata": {"name": "n1", "labels": {"zone": "a", "rank": "5"}},
            "status": {"allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"},
                "conditions": [{"type": "Ready", "status": "True"}]}});
        merge(&mut base, v);
        serde_json::from_value(base).unwrap()
    }

    fn merge(into: &mut serde_json::Value, from: serde_json::Value) {
        match (into, from) {
            (serde_json::Value::Object(a), serde_json::Value::Object(b)) => {
                for (k, v) in b {
                    merge(a.entry(k).or_insert(serde_json::Value::Null), v);
                }
            }
            (slot, v) => *slot = v,
        }
    }

    fn spec(v: serde_json::Value) -> PodSpec {
        let mut base = json!({"containers": [{"name": "c"}]});
        merge(&mut base, v);
        serde_json::from_value(base).unwrap()
    }

    fn reasons(pod: serde_json::Value, n: serde_json::Value) -> Vec<String> {
        let s = spec(pod);
        let req = Requests::of(&s, &["example.com/ignored".to_owned()]);
        filter(&s, &req, &NodeFacts::of(&node(n)), &Amounts::new())
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    #[test]
    fn requests_take_the_larger_of_containers_and_init_containers_plus_overhead() {
        let s = spec(json!({
            "containers": [
                {"name": "a", "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}},
                {"name": "b", "resources": {"limits": {"cpu": "250m"}}}],
            "initContainers": [
                {"name": "i", "resources": {"requests": {"cpu": "2", "memory": "1Mi"}}},
                {"name": "s", "restartPolicy": "Always", "resources": {"requests": {"cpu": "100m"}}}],
            "overhead": {"cpu": "50m"}}));
        let r = Requests::of(&s, &[]);
        assert_eq!(r.amounts["cpu"], 2050);
        assert_eq!(r.amounts["memory"], 1024 * 1024 * 1024 * 1000);
        assert_eq!(r.amounts["pods"], 1000);
        // b has no memory request: LeastAllocated counts 200 MiB for it, and for the sidecar.
        assert_eq!(r.nonzero.0, 850);
        assert_eq!(
            r.nonzero.1,
            1024 * 1024 * 1024 * 1000 + 2 * DEFAULT_MEMORY_MILLI
        );
    }

    #[test]
    fn the_first_failing_filter_gives_the_reasons_in_kube_schedulers_words() {
        assert!(reasons(json!({}), json!({})).is_empty());
        assert_eq!(
            reasons(json!({}), json!({"spec": {"unschedulable": true}})),
            ["node(s) were unschedulable"]
        );
        let tainted = json!({"spec": {"unschedulable": true,
            "taints": [{"key": "k", "value": "v", "effect": "NoSchedule"}]}});
        let tolerates_cordon = json!({"tolerations": [
            {"key": "node.kubernetes.io/unschedulable", "operator": "Exists"}]});
        assert_eq!(
            reasons(tolerates_cordon, tainted.clone()),
            ["node(s) had untolerated taint {k: v}"]
        );
        assert!(reasons(json!({"tolerations": [{"operator": "Exists"}]}), tainted).is_empty());
        let prefer = json!({"spec": {"taints": [{"key": "k", "effect": "PreferNoSchedule"}]}});
        assert!(reasons(json!({}), prefer).is_empty());
        assert_eq!(
            reasons(json!({"nodeSelector": {"zone": "b"}}), json!({})),
            ["node(s) didn't match Pod's node affinity/selector"]
        );
        let big = json!({"containers": [{"name": "c", "resources": {"requests":
            {"cpu": "5", "memory": "9Gi", "example.com/gpu": "1", "example.com/ignored": "1"}}}]});
        assert_eq!(
            reasons(big, json!({})),
            [
                "Insufficient cpu",
                "Insufficient example.com/gpu",
                "Insufficient memory"
            ]
        );
        let full = json!({"status": {"allocatable": {"pods": "0"}}});
        assert_eq!(reasons(json!({}), full), ["Too many pods"]);
    }

    #[test]
    fn node_affinity_terms_are_ored_and_their_expressions_anded() {
        let affinity = |terms: serde_json::Value| {
            json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                {"nodeSelectorTerms": terms}}}})
        };
        let fits = |terms| reasons(affinity(terms), json!({})).is_empty();
        assert!(fits(json!([
            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]},
            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]},
                                  {"key": "rank", "operator": "Gt", "values": ["3"]}]}])));
        assert!(!fits(json!([{"matchExpressions": [
            {"key": "zone", "operator": "Exists"}, {"key": "rank", "operator": "Lt", "values": ["3"]}]}])));
        assert!(fits(json!([{"matchExpressions": [
            {"key": "gpu", "operator": "DoesNotExist"}, {"key": "zone", "operator": "NotIn", "values": ["b"]}]}])));
        assert!(fits(json!([{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": ["n1"]}]}])));
        assert!(!fits(json!([{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": ["n2"]}]}])));
        // An empty term matches no node.
        assert!(!fits(json!([{}])));
    }

    #[test]
    fn the_room_counts_bound_pods_until_they_end_and_least_allocated_prefers_free_nodes() {
        let mut room = Room::default();
        room.apply_node(&node(json!({})));
        room.apply_node(&node(json!({"metadata": {"name": "n2"}})));
        let pod = |name: &str, node: &str, phase: &str| -> Pod {
            serde_json::from_value(json!({"metadata": {"name": name, "namespace": "d"},
                "spec": {"nodeName": node, "containers": [{"name": "c",
                    "resources": {"requests": {"cpu": "3", "memory": "1Gi"}}}]},
                "status": {"phase": phase}}))
            .unwrap()
        };
        room.apply_pod(&pod("p", "n1", "Running"));
        let s = spec(json!({"containers": [{"name": "c",
            "resources": {"requests": {"cpu": "2"}}}]}));
        let req = Requests::of(&s, &[]);
        let view: Vec<_> = room.ready_nodes().collect();
        let (n1, used1, nz1) = view[0];
        let (n2, used2, nz2) = view[1];
        assert_eq!(
            filter(&s, &req, n1, used1),
            [Reason::Insufficient("cpu".into())]
        );
        assert!(filter(&s, &req, n2, used2).is_empty());
        assert!(score(&req, n2, nz2) > score(&req, n1, nz1));
        // Ended, then gone: the room is back.
        room.apply_pod(&pod("p", "n1", "Succeeded"));
        let (n1, used1, _) = room.ready_nodes().next().unwrap();
        assert!(filter(&s, &req, n1, used1).is_empty());
        room.apply_pod(&pod("p", "n1", "Running"));
        room.remove_pod("d", "p");
        let (n1, used1, _) = room.ready_nodes().next().unwrap();
        assert!(filter(&s, &req, n1, used1).is_empty());
    }

    #[test]
    fn the_message_counts_each_reason_sorted_as_text() {
        let a = [Reason::Insufficient("cpu".into())];
        let b = [Reason::Unschedulable];
        assert_eq!(
            message(3, [&a[..], &b[..], &a[..]]),
            "0/3 nodes are available: 1 node(s) were unschedulable, 2 Insufficient cpu."
        );
        assert_eq!(message(0, []), "0/0 nodes are available:");
    }
}
