//! What `tensile up` and `tensile status` show: per node, its allocatable resources, what the
//! pods bound to it request and how many they are; per cluster, pods by phase. Pure functions of
//! cached objects.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, Pod};

use crate::keys::{LABEL_NODE_TYPE, VALUE_NODE_TYPE_VIRTUAL};
use crate::node::{CONDITION_LOWER_REACHABLE, REASON_LOWER_ERRORS};
use crate::resources::{ResourceVector, pod_requests};
use crate::status::is_terminal;

/// One node as the status table shows it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeSummary {
    /// Node name.
    pub name: String,
    /// Its `Ready` condition is `True`.
    pub ready: bool,
    /// Cordoned (`spec.unschedulable`).
    pub cordoned: bool,
    /// Labelled `type=virtual-kubelet`.
    pub virtual_node: bool,
    /// A virtual node whose lower cluster does not answer: the message of its
    /// `tensile-kube.io/LowerClusterReachable=False` condition (which names the cluster and the
    /// cause).
    pub lower_unreachable: Option<String>,
    /// A virtual node whose lower cluster answers some requests with errors: the message of
    /// its lower-reachable condition with reason `LowerClusterErrors`.
    pub lower_errors: Option<String>,
    /// `status.allocatable` (unparsable quantities left out).
    pub allocatable: ResourceVector,
    /// Sum of the requests of the non-terminal pods bound to it.
    pub requested: ResourceVector,
    /// Pods bound to it, by phase.
    pub pods: PodCounts,
}

/// Pods by phase.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PodCounts {
    /// Not yet bound to a node.
    pub unscheduled: usize,
    /// Bound, phase Pending (or none yet).
    pub pending: usize,
    /// Phase Running.
    pub running: usize,
    /// Phase Succeeded.
    pub succeeded: usize,
    /// Phase Failed.
    pub failed: usize,
    /// Phase Unknown (or one this code does not know).
    pub unknown: usize,
}

impl PodCounts {
    /// Every pod counted.
    pub fn total(&self) -> usize {
        self.unscheduled + self.pending + self.running + self.succeeded + self.failed + self.unknown
    }

    /// Counts `pod` once, in its phase.
    pub fn add(&mut self, pod: &Pod) {
        let bound = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .is_some_and(|n| !n.is_empty());
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        let slot = match phase {
            Some("Running") => &mut self.running,
            Some("Succeeded") => &mut self.succeeded,
            Some("Failed") => &mut self.failed,
            Some("Pending") | None if !bound => &mut self.unscheduled,
            Some("Pending") | None => &mut self.pending,
            Some(_) => &mut self.unknown,
        };
        *slot += 1;
    }
}

impl std::ops::AddAssign for PodCounts {
    fn add_assign(&mut self, other: Self) {
        self.unscheduled += other.unscheduled;
        self.pending += other.pending;
        self.running += other.running;
        self.succeeded += other.succeeded;
        self.failed += other.failed;
        self.unknown += other.unknown;
    }
}

/// Counts of `pods` by phase.
pub fn pod_counts<'a>(pods: impl IntoIterator<Item = &'a Pod>) -> PodCounts {
    let mut counts = PodCounts::default();
    for pod in pods {
        counts.add(pod);
    }
    counts
}

/// Every node of `nodes` (sorted by name) with the pods of `pods` bound to it. Pods bound to a
/// node that is not in `nodes` are left out; a pod whose requests cannot be parsed is counted
/// but requests nothing.
pub fn node_summaries<'a>(
    nodes: impl IntoIterator<Item = &'a Node>,
    pods: impl IntoIterator<Item = &'a Pod>,
) -> Vec<NodeSummary> {
    let mut by_name: BTreeMap<String, NodeSummary> = nodes
        .into_iter()
        .filter_map(|n| {
            let name = n.metadata.name.clone()?;
            let status = n.status.as_ref();
            let conditions = status.and_then(|s| s.conditions.as_ref());
            let ready = conditions
                .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
                .is_some_and(|c| c.status == "True");
            let lower_unreachable = conditions
                .and_then(|cs| cs.iter().find(|c| c.type_ == CONDITION_LOWER_REACHABLE))
                .filter(|c| c.status == "False")
                .map(|c| {
                    c.message
                        .clone()
                        .filter(|m| !m.is_empty())
                        .unwrap_or_else(|| "the lower cluster does not answer".to_owned())
                });
            let lower_errors = conditions
                .and_then(|cs| cs.iter().find(|c| c.type_ == CONDITION_LOWER_REACHABLE))
                .filter(|c| c.status == "True" && c.reason.as_deref() == Some(REASON_LOWER_ERRORS))
                .map(|c| c.message.clone().unwrap_or_default());
            let allocatable = status
                .and_then(|s| s.allocatable.as_ref())
                .map(|a| ResourceVector::from_quantities_lenient(a).0)
                .unwrap_or_default();
            let summary = NodeSummary {
                name: name.clone(),
                ready,
                cordoned: n
                    .spec
                    .as_ref()
                    .and_then(|s| s.unschedulable)
                    .unwrap_or(false),
                virtual_node: n
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(LABEL_NODE_TYPE))
                    .is_some_and(|v| v == VALUE_NODE_TYPE_VIRTUAL),
                allocatable,
                lower_unreachable,
                lower_errors,
                ..NodeSummary::default()
            };
            Some((name, summary))
        })
        .collect();
    for pod in pods {
        let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) else {
            continue;
        };
        let Some(summary) = by_name.get_mut(node) else {
            continue;
        };
        summary.pods.add(pod);
        if !is_terminal(pod)
            && let Ok(requests) = pod_requests(pod)
        {
            summary.requested.saturating_add_assign(&requests);
        }
    }
    by_name.into_values().collect()
}

/// The sum of the nodes' allocatable and requested resources and pod counts (one lower
/// cluster's line of the table).
pub fn cluster_total(nodes: &[NodeSummary]) -> NodeSummary {
    let mut total = NodeSummary {
        ready: nodes.iter().all(|n| n.ready),
        ..NodeSummary::default()
    };
    for n in nodes {
        total.allocatable.saturating_add_assign(&n.allocatable);
        total.requested.saturating_add_assign(&n.requested);
        total.pods += n.pods;
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(name: &str, ready: &str, cpu: &str, labels: serde_json::Value) -> Node {
        serde_json::from_value(json!({
            "metadata": {"name": name, "labels": labels},
            "status": {
                "allocatable": {"cpu": cpu, "memory": "8Gi", "pods": "110"},
                "conditions": [{"type": "Ready", "status": ready}]
            }
        }))
        .unwrap()
    }

    fn pod(name: &str, node: Option<&str>, phase: Option<&str>, cpu: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "default"},
            "spec": {
                "nodeName": node,
                "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]
            },
            "status": {"phase": phase}
        }))
        .unwrap()
    }

    #[test]
    fn a_virtual_node_whose_lower_cluster_answers_with_errors_says_so() {
        let mut n = node("vk", "True", "4", json!({"type": "virtual-kubelet"}));
        if let Some(c) = n.status.as_mut().and_then(|s| s.conditions.as_mut()) {
            c.push(
                serde_json::from_value(json!({"type": CONDITION_LOWER_REACHABLE,
                    "status": "True", "reason": REASON_LOWER_ERRORS, "message": "3 of 9 failed"}))
                .unwrap(),
            );
        }
        let s = node_summaries([&n], std::iter::empty::<&Pod>());
        assert_eq!(s[0].lower_errors.as_deref(), Some("3 of 9 failed"));
        assert_eq!(s[0].lower_unreachable, None);
    }

    #[test]
    fn a_virtual_node_whose_lower_cluster_is_unreachable_says_so() {
        let mut down = node("vk", "True", "4", json!({"type": "virtual-kubelet"}));
        if let Some(c) = down.status.as_mut().and_then(|s| s.conditions.as_mut()) {
            c.push(
                serde_json::from_value(json!({"type": CONDITION_LOWER_REACHABLE,
                    "status": "False", "message": "lower cluster l unreachable: timed out"}))
                .unwrap(),
            );
        }
        let up = node("ok", "True", "4", json!({"type": "virtual-kubelet"}));
        let s = node_summaries([&down, &up], std::iter::empty::<&Pod>());
        assert_eq!(
            s[1].lower_unreachable.as_deref(),
            Some("lower cluster l unreachable: timed out")
        );
        assert!(s[1].ready, "still Ready: nothing is evicted");
        assert_eq!(s[0].lower_unreachable, None);
    }

    #[test]
    fn requests_of_live_pods_are_summed_per_node() {
        let nodes = [
            node("b", "True", "4", json!({})),
            node("a", "False", "2", json!({"type": "virtual-kubelet"})),
        ];
        let pods = [
            pod("p1", Some("b"), Some("Running"), "500m"),
            pod("p2", Some("b"), Some("Pending"), "1"),
            pod("p3", Some("b"), Some("Succeeded"), "2"),
            pod("p4", None, Some("Pending"), "3"),
            pod("p5", Some("gone"), Some("Running"), "1"),
            pod("p6", Some("a"), Some("Failed"), "1"),
        ];
        let s = node_summaries(&nodes, &pods);
        assert_eq!(
            s.iter().map(|n| n.name.as_str()).collect::<Vec<_>>(),
            ["a", "b"]
        );
        let (a, b) = (&s[0], &s[1]);
        assert!(a.virtual_node && !a.ready);
        assert!(!b.virtual_node && b.ready);
        assert_eq!(b.requested.get("cpu"), 1_500_000_000);
        assert_eq!(b.allocatable.get("cpu"), 4_000_000_000);
        assert_eq!(
            (b.pods.running, b.pods.pending, b.pods.succeeded),
            (1, 1, 1)
        );
        assert_eq!(
            a.requested.get("cpu"),
            0,
            "a failed pod gives its requests back"
        );
        assert_eq!(a.pods.failed, 1);

        let total = cluster_total(&s);
        assert_eq!(total.allocatable.get("cpu"), 6_000_000_000);
        assert_eq!(total.pods.total(), 4);
        assert!(!total.ready);
    }

    #[test]
    fn pods_are_counted_once_by_phase() {
        let pods = [
            pod("u", None, None, "1"),
            pod("b", Some("n"), None, "1"),
            pod("r", Some("n"), Some("Running"), "1"),
            pod("x", Some("n"), Some("Weird"), "1"),
        ];
        let c = pod_counts(&pods);
        assert_eq!(
            c,
            PodCounts {
                unscheduled: 1,
                pending: 1,
                running: 1,
                unknown: 1,
                ..PodCounts::default()
            }
        );
        assert_eq!(c.total(), 4);
    }
}
