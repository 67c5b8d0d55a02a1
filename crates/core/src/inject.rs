//! The mutating webhook's rules (see `docs/placement.md`) as functions of values: which pods it
//! leaves alone, how it moves scheduling constraints into the `clusterSelector` annotation, and
//! how it pins a pod to the virtual node its volume is on or keeps it off virtual nodes it
//! failed on.
//!
//! Differences from the original, each a fix: a pod without labels is left alone; matchFields
//! are removed by their own index; a second pass over the output changes nothing (an existing
//! annotation is extended, never replaced by a poorer one); the exclusion of failed virtual
//! nodes stays in the upper pod, where the upper scheduler sees it, instead of being moved into
//! the annotation where it was inert.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{
    Affinity, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, Pod,
    Toleration,
};

use crate::cluster_selector::{ClusterSelector, ClusterSelectorError};
use crate::keys::{
    ANNOTATION_CLUSTER_SELECTOR, ANNOTATION_EXCLUDED_NODES, EFFECT_NO_EXECUTE,
    LABEL_CREATE_BY_DESCHEDULER, LABEL_HOSTNAME, LABEL_VIRTUAL_POD, NAMESPACE_KUBE_SYSTEM,
    RESOURCE_VIRTUAL_POD, TAINT_NOT_READY, TAINT_UNREACHABLE, VALUE_TRUE,
};

/// Default of `--ignore-selector-keys`: selector keys that stay in the upper pod.
pub const DEFAULT_IGNORE_SELECTOR_KEYS: &str = "clusterID";

/// Why the webhook leaves a pod alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Skip {
    /// The pod is in `kube-system`.
    KubeSystem,
    /// The pod is not labelled `virtual-pod=true`.
    NotVirtualPod,
    /// The descheduler re-created it; its spec is already what the webhook made of it.
    CreatedByDescheduler,
}

impl std::fmt::Display for Skip {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::KubeSystem => "pods in kube-system are not offloaded",
            Self::NotVirtualPod => "the pod is not labelled virtual-pod=true",
            Self::CreatedByDescheduler => "the pod was re-created by the descheduler",
        })
    }
}

/// Whether the webhook leaves `pod`, created in `namespace`, untouched (fix: a pod without
/// labels is not a virtual pod).
pub fn skip(pod: &Pod, namespace: &str) -> Option<Skip> {
    let label = |k: &str| {
        pod.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(k))
            .map(String::as_str)
    };
    if namespace == NAMESPACE_KUBE_SYSTEM {
        Some(Skip::KubeSystem)
    } else if label(LABEL_CREATE_BY_DESCHEDULER) == Some(VALUE_TRUE) {
        Some(Skip::CreatedByDescheduler)
    } else if label(LABEL_VIRTUAL_POD) != Some(VALUE_TRUE) {
        Some(Skip::NotVirtualPod)
    } else {
        None
    }
}

/// The selector keys that stay in the upper pod, from `--ignore-selector-keys`.
pub fn parse_ignore_keys(flag: &str) -> BTreeSet<String> {
    flag.split(',')
        .map(str::trim)
        .filter(|k| !k.is_empty())
        .map(str::to_owned)
        .collect()
}

/// What the webhook does to a pod it does not skip.
#[derive(Debug, Default)]
pub struct Mutation<'a> {
    /// Selector keys that stay in the upper pod.
    pub ignore_keys: BTreeSet<String>,
    /// The virtual node a claim of the pod is bound on (`selected-node` of the upper claim).
    pub selected_node: Option<&'a str>,
    /// Virtual nodes the pod's owner recently failed on.
    pub excluded_nodes: &'a [String],
}

/// The mutated pod; `Err` when its existing `clusterSelector` annotation cannot be read (the
/// request is refused with that reason rather than the annotation being overwritten).
pub fn mutate(pod: &Pod, mutation: &Mutation<'_>) -> Result<Pod, ClusterSelectorError> {
    mutate_owned(pod.clone(), mutation)
}

/// [`mutate`] of a pod the caller no longer needs (the webhook: a pod as large as a review
/// allows is not held twice).
pub fn mutate_owned(mut out: Pod, mutation: &Mutation<'_>) -> Result<Pod, ClusterSelectorError> {
    if let (Some(node), Some(spec)) = (mutation.selected_node, out.spec.as_mut())
        && spec.node_name.as_deref().is_none_or(str::is_empty)
    {
        spec.node_name = Some(node.to_owned());
    }
    let unbound = out
        .spec
        .as_ref()
        .is_some_and(|s| s.node_name.as_deref().is_none_or(str::is_empty));
    // Before `inject`, which recognises the exclusion as ours and leaves it in the pod.
    if unbound && !mutation.excluded_nodes.is_empty() {
        exclude_nodes(&mut out, mutation.excluded_nodes);
    }
    inject(&mut out, &mutation.ignore_keys)?;
    mark_for_extender(&mut out);
    Ok(out)
}

/// Adds [`RESOURCE_VIRTUAL_POD`] (request and limit 1) to the first container, unless a
/// container already asks for it: the scheduler extender is then called for this pod.
pub fn mark_for_extender(pod: &mut Pod) {
    let Some(spec) = pod.spec.as_mut() else {
        return;
    };
    let asks = spec.containers.iter().any(|c| {
        c.resources.as_ref().is_some_and(|r| {
            [r.requests.as_ref(), r.limits.as_ref()]
                .into_iter()
                .flatten()
                .any(|m| m.contains_key(RESOURCE_VIRTUAL_POD))
        })
    });
    let Some(first) = spec.containers.first_mut().filter(|_| !asks) else {
        return;
    };
    let resources = first.resources.get_or_insert_with(Default::default);
    // An extended resource must have its limit equal to its request.
    for map in [&mut resources.requests, &mut resources.limits] {
        map.get_or_insert_with(BTreeMap::new).insert(
            RESOURCE_VIRTUAL_POD.to_owned(),
            k8s_openapi::apimachinery::pkg::api::resource::Quantity("1".to_owned()),
        );
    }
}

/// Moves nodeSelector entries and required node-affinity expressions whose keys are not
/// `ignore_keys` into the `clusterSelector` annotation, records the original tolerations there,
/// and makes the pod tolerate not-ready and unreachable virtual nodes forever (reference 6.2).
pub fn inject(pod: &mut Pod, ignore_keys: &BTreeSet<String>) -> Result<(), ClusterSelectorError> {
    let existing = ClusterSelector::from_annotations(pod.metadata.annotations.as_ref())?;
    let ours = excluded_nodes(pod);
    let Some(spec) = pod.spec.as_mut() else {
        return Ok(());
    };
    let no_selector = spec.node_selector.as_ref().is_none_or(BTreeMap::is_empty);
    if no_selector && spec.affinity.is_none() && spec.tolerations.is_none() {
        return Ok(());
    }

    let mut moved_selector = BTreeMap::new();
    if let Some(selector) = spec.node_selector.as_mut() {
        selector.retain(|k, v| {
            let keep = ignore_keys.contains(k);
            if !keep {
                moved_selector.insert(k.clone(), v.clone());
            }
            keep
        });
        if selector.is_empty() {
            spec.node_selector = None;
        }
    }

    let keep_expression =
        |r: &NodeSelectorRequirement| ignore_keys.contains(&r.key) || is_our_exclusion(r, &ours);
    let mut moved_terms = Vec::new();
    if let Some(node_affinity) = spec
        .affinity
        .as_mut()
        .and_then(|a| a.node_affinity.as_mut())
        && let Some(required) = node_affinity
            .required_during_scheduling_ignored_during_execution
            .as_mut()
    {
        let mut kept_terms = Vec::new();
        for term in std::mem::take(&mut required.node_selector_terms) {
            let (kept_exprs, moved_exprs) =
                split(term.match_expressions.unwrap_or_default(), keep_expression);
            let (kept_fields, moved_fields) = split(term.match_fields.unwrap_or_default(), |r| {
                ignore_keys.contains(&r.key)
            });
            let kept = term_of(kept_exprs, kept_fields);
            let moved = term_of(moved_exprs, moved_fields);
            kept_terms.extend(kept);
            moved_terms.extend(moved);
        }
        if kept_terms.is_empty() {
            node_affinity.required_during_scheduling_ignored_during_execution = None;
        } else {
            required.node_selector_terms = kept_terms;
        }
    }

    let original = spec.tolerations.clone().unwrap_or_default();
    spec.tolerations = Some(tolerate_lost_nodes_forever(&original));

    let selector = match existing {
        None => ClusterSelector {
            node_selector: moved_selector,
            affinity: affinity_of(moved_terms),
            tolerations: original,
        },
        Some(existing) => extend(existing, moved_selector, moved_terms, &original),
    };
    pod.metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(ANNOTATION_CLUSTER_SELECTOR.to_owned(), selector.encode());
    Ok(())
}

fn split(
    list: Vec<NodeSelectorRequirement>,
    keep: impl Fn(&NodeSelectorRequirement) -> bool,
) -> (Vec<NodeSelectorRequirement>, Vec<NodeSelectorRequirement>) {
    list.into_iter().partition(|r| keep(r))
}

fn term_of(
    expressions: Vec<NodeSelectorRequirement>,
    fields: Vec<NodeSelectorRequirement>,
) -> Option<NodeSelectorTerm> {
    (!expressions.is_empty() || !fields.is_empty()).then(|| NodeSelectorTerm {
        match_expressions: (!expressions.is_empty()).then_some(expressions),
        match_fields: (!fields.is_empty()).then_some(fields),
    })
}

fn affinity_of(terms: Vec<NodeSelectorTerm>) -> Option<Affinity> {
    (!terms.is_empty()).then(|| Affinity {
        node_affinity: Some(NodeAffinity {
            required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                node_selector_terms: terms,
            }),
            ..NodeAffinity::default()
        }),
        ..Affinity::default()
    })
}

/// The required node-affinity terms of `affinity` (none when it has none).
pub fn required_terms(affinity: Option<&Affinity>) -> Vec<NodeSelectorTerm> {
    affinity
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| {
            n.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
        .map(|r| r.node_selector_terms.clone())
        .unwrap_or_default()
}

/// An annotation that is already there (a pod created from another pod's manifest, or passed
/// through the webhook twice) is extended: newly moved keys are added, newly moved terms are
/// ANDed with its terms, and tolerations it does not have are appended, except the forever
/// not-ready/unreachable ones this webhook itself writes into the pod.
fn extend(
    mut existing: ClusterSelector,
    moved_selector: BTreeMap<String, String>,
    moved_terms: Vec<NodeSelectorTerm>,
    pod_tolerations: &[Toleration],
) -> ClusterSelector {
    existing.node_selector.extend(moved_selector);
    if !moved_terms.is_empty() {
        let old = required_terms(existing.affinity.as_ref());
        let terms = if old.is_empty() {
            moved_terms
        } else {
            // (a ∨ b) ∧ (c ∨ d) = (a∧c) ∨ (a∧d) ∨ (b∧c) ∨ (b∧d).
            old.iter()
                .flat_map(|a| moved_terms.iter().map(move |b| and_terms(a, b)))
                .collect()
        };
        let affinity = existing.affinity.get_or_insert_with(Affinity::default);
        affinity
            .node_affinity
            .get_or_insert_with(NodeAffinity::default)
            .required_during_scheduling_ignored_during_execution = Some(NodeSelector {
            node_selector_terms: terms,
        });
    }
    for t in pod_tolerations {
        let lost_node_key = matches!(t.key.as_deref(), Some(TAINT_NOT_READY | TAINT_UNREACHABLE));
        if !lost_node_key && !existing.tolerations.contains(t) {
            existing.tolerations.push(t.clone());
        }
    }
    existing
}

fn and_terms(a: &NodeSelectorTerm, b: &NodeSelectorTerm) -> NodeSelectorTerm {
    let join = |x: &Option<Vec<NodeSelectorRequirement>>,
                y: &Option<Vec<NodeSelectorRequirement>>| {
        let v: Vec<_> = x.iter().chain(y.iter()).flatten().cloned().collect();
        (!v.is_empty()).then_some(v)
    };
    NodeSelectorTerm {
        match_expressions: join(&a.match_expressions, &b.match_expressions),
        match_fields: join(&a.match_fields, &b.match_fields),
    }
}

fn forever(key: &str) -> Toleration {
    Toleration {
        key: Some(key.to_owned()),
        operator: Some("Exists".to_owned()),
        effect: Some(EFFECT_NO_EXECUTE.to_owned()),
        ..Toleration::default()
    }
}

/// The upper pod's tolerations: not-ready and unreachable tolerated forever (a virtual node
/// that loses its lower cluster must not evict every pod upstairs), added when missing.
pub fn tolerate_lost_nodes_forever(tolerations: &[Toleration]) -> Vec<Toleration> {
    let mut out: Vec<Toleration> = tolerations
        .iter()
        .map(|t| match t.key.as_deref() {
            Some(key @ (TAINT_NOT_READY | TAINT_UNREACHABLE)) => forever(key),
            _ => t.clone(),
        })
        .collect();
    for key in [TAINT_NOT_READY, TAINT_UNREACHABLE] {
        if !tolerations.iter().any(|t| t.key.as_deref() == Some(key)) {
            out.push(forever(key));
        }
    }
    out
}

/// The virtual nodes recorded in the pod's [`ANNOTATION_EXCLUDED_NODES`].
pub fn excluded_nodes(pod: &Pod) -> BTreeSet<String> {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_EXCLUDED_NODES))
        .map(|v| {
            v.split(',')
                .map(str::trim)
                .filter(|n| !n.is_empty())
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

fn is_our_exclusion(r: &NodeSelectorRequirement, ours: &BTreeSet<String>) -> bool {
    r.key == LABEL_HOSTNAME
        && r.operator == "NotIn"
        && r.values
            .as_ref()
            .is_some_and(|v| !v.is_empty() && v.iter().all(|n| ours.contains(n)))
}

/// Keeps the pod off `nodes`: every required node-affinity term gets (or extends) a
/// `kubernetes.io/hostname NotIn` expression, a pod without required terms gets one term with
/// it, and the nodes are recorded in [`ANNOTATION_EXCLUDED_NODES`]. ANDing the exclusion into
/// every term keeps the pod's own terms intact (fix: the original dropped terms without
/// expressions and added nothing to terms without a hostname expression).
pub fn exclude_nodes(pod: &mut Pod, nodes: &[String]) {
    let mut all = excluded_nodes(pod);
    all.extend(nodes.iter().filter(|n| !n.is_empty()).cloned());
    if all.is_empty() {
        return;
    }
    let ours: Vec<String> = all.iter().cloned().collect();
    let Some(spec) = pod.spec.as_mut() else {
        return;
    };
    let required = spec
        .affinity
        .get_or_insert_with(Affinity::default)
        .node_affinity
        .get_or_insert_with(NodeAffinity::default)
        .required_during_scheduling_ignored_during_execution
        .get_or_insert_with(|| NodeSelector {
            node_selector_terms: Vec::new(),
        });
    if required.node_selector_terms.is_empty() {
        required
            .node_selector_terms
            .push(NodeSelectorTerm::default());
    }
    for term in &mut required.node_selector_terms {
        let expressions = term.match_expressions.get_or_insert_with(Vec::new);
        match expressions
            .iter_mut()
            .find(|r| r.key == LABEL_HOSTNAME && r.operator == "NotIn")
        {
            Some(r) => {
                let values = r.values.get_or_insert_with(Vec::new);
                for n in &ours {
                    if !values.contains(n) {
                        values.push(n.clone());
                    }
                }
            }
            None => expressions.push(NodeSelectorRequirement {
                key: LABEL_HOSTNAME.to_owned(),
                operator: "NotIn".to_owned(),
                values: Some(ours.clone()),
            }),
        }
    }
    pod.metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(ANNOTATION_EXCLUDED_NODES.to_owned(), ours.join(","));
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use serde_json::json;

    fn pod(v: serde_json::Value) -> Pod {
        serde_json::from_value(v).unwrap()
    }

    fn keys() -> BTreeSet<String> {
        parse_ignore_keys(DEFAULT_IGNORE_SELECTOR_KEYS)
    }

    fn annotation(p: &Pod) -> Option<&str> {
        p.metadata
            .annotations
            .as_ref()?
            .get(ANNOTATION_CLUSTER_SELECTOR)
            .map(String::as_str)
    }

    fn virtual_pod(spec: serde_json::Value) -> Pod {
        pod(json!({"metadata": {"name": "p", "labels": {"virtual-pod": "true"}}, "spec": spec}))
    }

    fn injected(p: &Pod) -> Pod {
        mutate(
            p,
            &Mutation {
                ignore_keys: keys(),
                ..Mutation::default()
            },
        )
        .unwrap()
    }

    #[test]
    fn checklist_82_skips_kube_system_unlabelled_and_descheduler_pods() {
        let labelled = virtual_pod(json!({"containers": []}));
        assert_eq!(skip(&labelled, "default"), None);
        assert_eq!(skip(&labelled, "kube-system"), Some(Skip::KubeSystem));
        let none = pod(json!({"metadata": {"name": "p"}, "spec": {"containers": []}}));
        assert_eq!(skip(&none, "default"), Some(Skip::NotVirtualPod));
        let other = pod(json!({"metadata": {"name": "p", "labels": {"virtual-pod": "false"}}}));
        assert_eq!(skip(&other, "default"), Some(Skip::NotVirtualPod));
        let recreated = pod(json!({"metadata": {"name": "p",
            "labels": {"virtual-pod": "true", "create-by-descheduler": "true"}}}));
        assert_eq!(
            skip(&recreated, "default"),
            Some(Skip::CreatedByDescheduler)
        );
    }

    #[test]
    fn checklist_83_node_selector_keys_move_except_ignore_keys() {
        let p = injected(&virtual_pod(
            json!({"nodeSelector": {"clusterID": "c1", "disk": "ssd"}}),
        ));
        let spec = p.spec.as_ref().unwrap();
        assert_eq!(
            spec.node_selector,
            Some([("clusterID".to_owned(), "c1".to_owned())].into())
        );
        assert_eq!(annotation(&p), Some(r#"{"nodeSelector":{"disk":"ssd"}}"#));
        // Every key moved: the selector goes away.
        let p = injected(&virtual_pod(json!({"nodeSelector": {"disk": "ssd"}})));
        assert_eq!(p.spec.as_ref().unwrap().node_selector, None);
    }

    #[test]
    fn checklist_84_required_affinity_moves_empty_terms_and_required_go_away() {
        let p = injected(&virtual_pod(json!({"affinity": {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [
                    {"key": "clusterID", "operator": "In", "values": ["c1"]},
                    {"key": "zone", "operator": "In", "values": ["a"]}]},
                {"matchExpressions": [{"key": "disk", "operator": "Exists"}],
                 "matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}
            ]},
            "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "preference": {
                "matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]}}]}}})));
        let na = p
            .spec
            .as_ref()
            .unwrap()
            .affinity
            .as_ref()
            .unwrap()
            .node_affinity
            .as_ref()
            .unwrap();
        let kept = &na
            .required_during_scheduling_ignored_during_execution
            .as_ref()
            .unwrap()
            .node_selector_terms;
        assert_eq!(kept.len(), 1, "the second term was emptied and dropped");
        assert_eq!(
            kept[0].match_expressions.as_ref().unwrap()[0].key,
            "clusterID"
        );
        assert_eq!(
            na.preferred_during_scheduling_ignored_during_execution
                .as_ref()
                .unwrap()
                .len(),
            1,
            "preferred terms stay"
        );
        assert_eq!(
            annotation(&p),
            Some(
                r#"{"affinity":{"nodeAffinity":{"requiredDuringSchedulingIgnoredDuringExecution":{"nodeSelectorTerms":[{"matchExpressions":[{"key":"zone","operator":"In","values":["a"]}]},{"matchExpressions":[{"key":"disk","operator":"Exists"}],"matchFields":[{"key":"metadata.name","operator":"In","values":["n1"]}]}]}}}}"#
            )
        );
        // Only moved keys: required becomes nil.
        let p = injected(&virtual_pod(json!({"affinity": {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}]}}}})));
        let na = p.spec.unwrap().affinity.unwrap().node_affinity.unwrap();
        assert_eq!(na.required_during_scheduling_ignored_during_execution, None);
    }

    #[test]
    fn match_fields_are_removed_by_their_own_index() {
        // The original indexed matchFields with the matchExpressions counter.
        let p = injected(&virtual_pod(json!({"affinity": {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "a", "operator": "Exists"}, {"key": "b", "operator": "Exists"}],
                 "matchFields": [{"key": "clusterID", "operator": "In", "values": ["x"]},
                                 {"key": "metadata.name", "operator": "In", "values": ["n"]}]}]}}}})));
        let terms = required_terms(p.spec.unwrap().affinity.as_ref());
        assert_eq!(terms.len(), 1);
        assert_eq!(terms[0].match_expressions, None);
        assert_eq!(terms[0].match_fields.as_ref().unwrap()[0].key, "clusterID");
    }

    #[test]
    fn checklist_85_tolerations_recorded_and_lost_nodes_tolerated_forever() {
        let p = injected(&virtual_pod(json!({"tolerations": [
            {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
            {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]})));
        assert_eq!(
            annotation(&p),
            Some(
                r#"{"tolerations":[{"key":"node.kubernetes.io/not-ready","operator":"Exists","effect":"NoExecute","tolerationSeconds":300},{"key":"gpu","operator":"Exists","effect":"NoSchedule"}]}"#
            )
        );
        let tolerations = serde_json::to_value(p.spec.unwrap().tolerations).unwrap();
        assert_eq!(
            tolerations,
            json!([
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
                {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"},
                {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"}
            ])
        );
    }

    #[test]
    fn checklist_86_nothing_to_move_means_no_annotation() {
        let p = injected(&virtual_pod(json!({"containers": [{"name": "c"}]})));
        assert_eq!(annotation(&p), None);
        assert_eq!(p.spec.unwrap().tolerations, None);
    }

    #[test]
    fn typical_result_matches_reference_6_3() {
        let p = injected(&virtual_pod(json!({
            "nodeSelector": {"clusterID": "c1", "disk": "ssd"},
            "tolerations": [{"key": "node.kubernetes.io/unreachable", "operator": "Exists",
                             "effect": "NoExecute", "tolerationSeconds": 300}]})));
        assert_eq!(
            annotation(&p),
            Some(
                r#"{"nodeSelector":{"disk":"ssd"},"tolerations":[{"key":"node.kubernetes.io/unreachable","operator":"Exists","effect":"NoExecute","tolerationSeconds":300}]}"#
            )
        );
    }

    #[test]
    fn a_mutated_pod_asks_for_the_extenders_marker_once_and_counts_it_nowhere() {
        let p = pod(
            json!({"metadata": {"name": "p", "labels": {"virtual-pod": "true"}},
            "spec": {"containers": [
                {"name": "a", "image": "i", "resources": {"requests": {"cpu": "1"}}},
                {"name": "b", "image": "i"}]}}),
        );
        let once = mutate(&p, &Mutation::default()).unwrap();
        let spec = once.spec.as_ref().unwrap();
        let r = spec.containers[0].resources.as_ref().unwrap();
        let one = Some(&k8s_openapi::apimachinery::pkg::api::resource::Quantity(
            "1".into(),
        ));
        assert_eq!(r.requests.as_ref().unwrap().get(RESOURCE_VIRTUAL_POD), one);
        assert_eq!(r.limits.as_ref().unwrap().get(RESOURCE_VIRTUAL_POD), one);
        assert!(spec.containers[1].resources.is_none());
        assert_eq!(mutate(&once, &Mutation::default()).unwrap(), once);
        // Not a node resource: a pod's requests are what they were.
        assert_eq!(
            crate::resources::pod_requests(&once).unwrap(),
            crate::resources::pod_requests(&p).unwrap()
        );
    }

    #[test]
    fn a_second_pass_changes_nothing() {
        let fixtures = [
            json!({"nodeSelector": {"clusterID": "c1", "disk": "ssd"}}),
            json!({"tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists",
                                    "effect": "NoExecute", "tolerationSeconds": 300}]}),
            json!({"nodeSelector": {"disk": "ssd"}, "affinity": {"nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]},
                                          {"key": "clusterID", "operator": "In", "values": ["c"]}]}]}}},
                   "tolerations": [{"key": "gpu", "operator": "Exists"}]}),
            json!({"containers": []}),
        ];
        for spec in fixtures {
            let once = injected(&virtual_pod(spec.clone()));
            let twice = injected(&once);
            assert_eq!(twice, once, "{spec}");
            // With an exclusion too.
            let excluded = mutate(
                &virtual_pod(spec.clone()),
                &Mutation {
                    ignore_keys: keys(),
                    excluded_nodes: &["vk-a".to_owned()],
                    ..Mutation::default()
                },
            )
            .unwrap();
            assert_eq!(injected(&excluded), excluded, "{spec}");
        }
    }

    #[test]
    fn constraints_added_to_a_pod_that_has_an_annotation_extend_it() {
        let mut p = injected(&virtual_pod(json!({
            "nodeSelector": {"disk": "ssd"},
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
                                      {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]}]}}}})));
        let spec = p.spec.as_mut().unwrap();
        spec.node_selector = Some([("gpu".to_owned(), "t4".to_owned())].into());
        spec.affinity = Some(
            serde_json::from_value(json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [{"key": "arch", "operator": "In", "values": ["arm64"]}]}]}}}))
            .unwrap(),
        );
        let p = injected(&p);
        let cs = ClusterSelector::decode(annotation(&p).unwrap()).unwrap();
        assert_eq!(
            cs.node_selector,
            [("disk", "ssd"), ("gpu", "t4")]
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .into()
        );
        let terms = required_terms(cs.affinity.as_ref());
        assert_eq!(terms.len(), 2, "(zone=a ∨ zone=b) ∧ arch=arm64");
        for t in &terms {
            let keys: Vec<_> = t
                .match_expressions
                .iter()
                .flatten()
                .map(|r| r.key.as_str())
                .collect();
            assert_eq!(keys, ["zone", "arch"]);
        }
    }

    #[test]
    fn checklist_87_selected_node_pins_the_pod() {
        let p = mutate(
            &virtual_pod(json!({"containers": []})),
            &Mutation {
                ignore_keys: keys(),
                selected_node: Some("vk-1"),
                excluded_nodes: &["vk-2".to_owned()],
            },
        )
        .unwrap();
        let spec = p.spec.unwrap();
        assert_eq!(spec.node_name.as_deref(), Some("vk-1"));
        assert_eq!(spec.affinity, None, "a pinned pod needs no exclusion");
    }

    #[test]
    fn a_malformed_annotation_is_an_error_not_overwritten() {
        let p = pod(
            json!({"metadata": {"name": "p", "annotations": {"clusterSelector": "{"}},
            "spec": {"nodeSelector": {"disk": "ssd"}}}),
        );
        assert!(inject(&mut p.clone(), &keys()).is_err());
    }

    #[test]
    fn exclusion_is_anded_into_every_term_and_stays_upstairs() {
        let p = mutate(
            &virtual_pod(json!({"affinity": {"nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "clusterID", "operator": "In", "values": ["c1", "c2"]}]},
                    {"matchFields": [{"key": "clusterID", "operator": "In", "values": ["x"]}]}]}}}})),
            &Mutation {
                ignore_keys: keys(),
                excluded_nodes: &["vk-b".to_owned(), "vk-a".to_owned()],
                ..Mutation::default()
            },
        )
        .unwrap();
        assert_eq!(
            p.metadata.annotations.as_ref().unwrap()[ANNOTATION_EXCLUDED_NODES],
            "vk-a,vk-b"
        );
        let terms = required_terms(p.spec.as_ref().unwrap().affinity.as_ref());
        assert_eq!(terms.len(), 2, "no term is dropped");
        for t in &terms {
            let r = t
                .match_expressions
                .iter()
                .flatten()
                .find(|r| r.key == LABEL_HOSTNAME)
                .unwrap();
            assert_eq!(r.operator, "NotIn");
            assert_eq!(r.values.as_deref().unwrap(), ["vk-a", "vk-b"]);
        }
        // A second exclusion extends the same expression.
        let mut again = p.clone();
        exclude_nodes(&mut again, &["vk-c".to_owned(), "vk-a".to_owned()]);
        let terms = required_terms(again.spec.as_ref().unwrap().affinity.as_ref());
        let r = terms[0]
            .match_expressions
            .iter()
            .flatten()
            .find(|r| r.key == LABEL_HOSTNAME)
            .unwrap();
        assert_eq!(r.values.as_deref().unwrap(), ["vk-a", "vk-b", "vk-c"]);
    }
}
