//! kube-scheduler's pool of unschedulable pods (1.34, queueing hints on): a pod that did not
//! fit waits there until a cluster change that could make it fit, not only for its back-off.
//! What could is decided by the plugins that rejected it, each by its own hint; a pod some
//! extender refused carries the `Extender` pseudo-plugin, which any change brings back
//! (kube-scheduler's `ExtenderName`: extenders have no hints). A pod whose attempt failed with
//! no plugin named (an extender's error, a failed bind) is not parked: it waits out its
//! back-off only. Parked pods come back anyway after five minutes
//! (`podMaxInUnschedulablePodsDuration`).
//!
//! Without this the simulated scheduler retried every refused pod each time its back-off ran
//! out, in a quiet cluster too: it asked the extender 10 times per pod where kube-scheduler
//! asked 2-4 (docs/benchmarks.md, "The simulated scheduler's queue, as kube-scheduler's").

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::PodSpec;
use serde_json::Value;

use super::fit::{self, NodeFacts, Reason, Requests};

/// kube-scheduler's `podMaxInUnschedulablePodsDuration`.
pub(super) const MAX_PARKED: Duration = Duration::from_secs(5 * 60);

/// A filter plugin of kube-scheduler's default profile that rejected a pod, or the extenders.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) enum Plugin {
    NodeUnschedulable,
    TaintToleration,
    NodeAffinity,
    NodeResourcesFit,
    VolumeBinding,
    /// Some node was filtered out by an extender.
    Extender,
}

impl Plugin {
    /// The plugin whose filter gives `reason`.
    pub(super) fn of(reason: &Reason) -> Self {
        match reason {
            Reason::Unschedulable => Self::NodeUnschedulable,
            Reason::Taint { .. } => Self::TaintToleration,
            Reason::Affinity => Self::NodeAffinity,
            Reason::Insufficient(_) => Self::NodeResourcesFit,
            Reason::VolumeConflict | Reason::NoVolume => Self::VolumeBinding,
        }
    }
}

/// What a parked pod's hints read of it.
#[derive(Debug)]
pub(super) struct Parked {
    /// The plugins that rejected it (never empty).
    pub plugins: BTreeSet<Plugin>,
    pub spec: PodSpec,
    /// Its requests as the scheduler counts them (without the extenders' resources).
    pub requests: Requests,
}

/// A cluster change, as the scheduler's event handlers tell them to its queue.
#[derive(Debug)]
pub(super) enum Change {
    /// A node appeared, or became Ready (the simulated scheduler leaves out nodes that are not;
    /// kube-scheduler sees their not-ready taint go).
    NodeAdded(NodeFacts),
    /// A node's scheduling properties changed (`NodeSchedulingPropertiesChange`).
    NodeChanged { old: NodeFacts, new: NodeFacts },
    /// A node went away or stopped being Ready.
    NodeGone,
    /// A pod was bound to a node.
    AssignedPodAdded,
    /// A bound pod changed; `freed`: the resources whose request it lowered.
    AssignedPodUpdated { freed: BTreeSet<String> },
    /// A bound pod was deleted or ended (kube-scheduler's informer of bound pods leaves out
    /// pods that are Succeeded or Failed: one that ends is deleted from its view).
    AssignedPodDeleted,
    /// A persistent volume, claim or storage class appeared, changed or went away.
    Storage,
}

/// Whether `change` can make parked pod `p` schedulable: whether one of the plugins that
/// rejected it says so (its queueing hint).
pub(super) fn worth_requeuing(p: &Parked, change: &Change) -> bool {
    p.plugins.iter().any(|plugin| hint(*plugin, p, change))
}

fn hint(plugin: Plugin, p: &Parked, change: &Change) -> bool {
    use Change as C;
    use Plugin as P;
    let tolerations = p.spec.tolerations.as_deref().unwrap_or_default();
    let tolerated = |n: &NodeFacts| fit::untolerated(&n.taints, tolerations).is_empty();
    match (plugin, change) {
        (P::Extender, _) => true,
        (P::NodeResourcesFit, C::NodeAdded(n)) => fits_allocatable(&p.requests, n),
        (P::NodeResourcesFit, C::NodeChanged { old, new }) => {
            fits_allocatable(&p.requests, new) && increased(&p.requests, old, new)
        }
        (P::NodeResourcesFit, C::AssignedPodDeleted) => true,
        (P::NodeResourcesFit, C::AssignedPodUpdated { freed }) => {
            freed.iter().any(|r| p.requests.amounts.contains_key(r))
        }
        (P::NodeUnschedulable, C::NodeAdded(n)) => !n.unschedulable,
        (P::NodeUnschedulable, C::NodeChanged { old, new }) => {
            old.unschedulable && !new.unschedulable
        }
        (P::TaintToleration, C::NodeAdded(n)) => tolerated(n),
        (P::TaintToleration, C::NodeChanged { old, new }) => !tolerated(old) && tolerated(new),
        (P::NodeAffinity, C::NodeAdded(n)) => fit::affinity_admits(&p.spec, n),
        (P::NodeAffinity, C::NodeChanged { old, new }) => {
            !fit::affinity_admits(&p.spec, old) && fit::affinity_admits(&p.spec, new)
        }
        (P::VolumeBinding, C::Storage | C::NodeAdded(_) | C::NodeChanged { .. }) => true,
        _ => false,
    }
}

/// NodeResourcesFit's `isFit`: the pod's requests within the node's allocatable, whatever
/// runs there.
fn fits_allocatable(req: &Requests, node: &NodeFacts) -> bool {
    req.amounts
        .iter()
        .all(|(r, want)| *want <= node.allocatable.get(r).copied().unwrap_or(0))
}

/// NodeResourcesFit's `haveAnyRequestedResourcesIncreased`: more pods allowed, or more of a
/// resource the pod asks for.
fn increased(req: &Requests, old: &NodeFacts, new: &NodeFacts) -> bool {
    let of = |n: &NodeFacts, r: &str| n.allocatable.get(r).copied().unwrap_or(0);
    of(new, fit::PODS) > of(old, fit::PODS)
        || req
            .amounts
            .iter()
            .any(|(r, want)| r != fit::PODS && *want > 0 && of(new, r) > of(old, r))
}

/// Whether a node update changes what kube-scheduler's queue looks at
/// (`NodeSchedulingPropertiesChange`): it becoming schedulable, its allocatable, labels,
/// taints, annotations, or the status of a condition (heartbeats apart).
pub(super) fn node_properties_changed(old: &Value, new: &Value) -> bool {
    let cordoned = |n: &Value| {
        n.pointer("/spec/unschedulable")
            .and_then(Value::as_bool)
            .unwrap_or(false)
    };
    let conditions = |n: &Value| -> BTreeMap<String, String> {
        n.pointer("/status/conditions")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|c| {
                Some((
                    c.get("type")?.as_str()?.to_owned(),
                    c.get("status")?.as_str()?.to_owned(),
                ))
            })
            .collect()
    };
    let differs = |path: &str| old.pointer(path) != new.pointer(path);
    (cordoned(old) && !cordoned(new))
        || differs("/status/allocatable")
        || differs("/metadata/labels")
        || differs("/spec/taints")
        || differs("/metadata/annotations")
        || conditions(old) != conditions(new)
}

/// What a pod event is to the parked pods.
// A value returned and matched at once, never stored: its size costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub(super) enum PodEvent {
    /// A change of the pods bound to nodes, as kube-scheduler's informer of them shows it.
    Change(Change),
    /// An update of an unscheduled pod (see [`own_update_requeues`]).
    Own,
    /// Nothing to them (an unscheduled pod created or deleted).
    Nothing,
}

/// Classifies a pod event (`deleted`, or the pod before, if any, and after). kube-scheduler
/// watches bound pods that have not ended: one that ends leaves its view, as a deletion.
pub(super) fn pod_event(deleted: bool, prev: Option<&Value>, new: &Value) -> PodEvent {
    let visible = |v: &Value| {
        v.pointer("/spec/nodeName")
            .and_then(Value::as_str)
            .is_some_and(|n| !n.is_empty())
            && !matches!(
                v.pointer("/status/phase").and_then(Value::as_str),
                Some("Succeeded" | "Failed")
            )
    };
    if deleted {
        return if visible(new) {
            PodEvent::Change(Change::AssignedPodDeleted)
        } else {
            PodEvent::Nothing
        };
    }
    match (prev, prev.is_some_and(visible), visible(new)) {
        (_, false, true) => PodEvent::Change(Change::AssignedPodAdded),
        (_, true, false) => PodEvent::Change(Change::AssignedPodDeleted),
        (Some(old), true, true) => {
            // Requests only change with the spec: most updates are status.
            let freed = if old.get("spec") == new.get("spec") {
                BTreeSet::new()
            } else {
                let requests = |v: &Value| {
                    v.get("spec")
                        .and_then(|s| serde_json::from_value::<PodSpec>(s.clone()).ok())
                        .map(|s| Requests::of(&s, &[]))
                        .unwrap_or_default()
                };
                freed(&requests(old), &requests(new))
            };
            PodEvent::Change(Change::AssignedPodUpdated { freed })
        }
        (Some(_), false, false) => PodEvent::Own,
        (None, ..) => PodEvent::Nothing,
    }
}

/// The resources whose request a bound pod's update lowered (or dropped).
pub(super) fn freed(old: &Requests, new: &Requests) -> BTreeSet<String> {
    old.amounts
        .iter()
        .filter(|(r, before)| new.amounts.get(*r).is_none_or(|after| after < *before))
        .map(|(r, _)| r.clone())
        .collect()
}

/// Whether an update of parked pod `p` itself brings it back. Its spec or labels changing may
/// make it fit. Any other update, its status included, is kube-scheduler's generic Pod
/// update: only the `Extender` pseudo-plugin (registered for every event) takes that, so a
/// pod an extender refused comes back once after the scheduler's own `PodScheduled` write.
pub(super) fn own_update_requeues(p: &Parked, old: &Value, new: &Value) -> bool {
    p.plugins.contains(&Plugin::Extender)
        || old.get("spec") != new.get("spec")
        || old.pointer("/metadata/labels") != new.pointer("/metadata/labels")
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Node;
    use serde_json::json;

    fn node(v: Value) -> NodeFacts {
        let mut base = json!({"metadata": {"name": "n1", "labels": {"zone": "a"}},
            "status": {"allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"},
                "conditions": [{"type": "Ready", "status": "True"}]}});
        merge(&mut base, v);
        NodeFacts::of(&serde_json::from_value::<Node>(base).unwrap())
    }

    fn merge(into: &mut Value, from: Value) {
        match (into, from) {
            (Value::Object(a), Value::Object(b)) => {
                for (k, v) in b {
                    merge(a.entry(k).or_insert(Value::Null), v);
                }
            }
            (slot, v) => *slot = v,
        }
    }

    fn parked(plugins: &[Plugin], spec: Value) -> Parked {
        let spec: PodSpec = serde_json::from_value(spec).unwrap();
        Parked {
            plugins: plugins.iter().copied().collect(),
            requests: Requests::of(&spec, &[]),
            spec,
        }
    }

    fn asking(cpu: &str) -> Value {
        json!({"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]})
    }

    fn changed(old: Value, new: Value) -> Change {
        Change::NodeChanged {
            old: node(old),
            new: node(new),
        }
    }

    #[test]
    fn a_pod_an_extender_refused_comes_back_on_any_change() {
        let p = parked(&[Plugin::Extender], asking("1"));
        for change in [
            Change::AssignedPodAdded,
            Change::AssignedPodUpdated {
                freed: BTreeSet::new(),
            },
            Change::AssignedPodDeleted,
            Change::NodeGone,
            Change::Storage,
            changed(json!({}), json!({"metadata": {"labels": {"zone": "b"}}})),
        ] {
            assert!(worth_requeuing(&p, &change), "{change:?}");
        }
    }

    #[test]
    fn a_pod_short_of_room_comes_back_when_room_may_have_been_freed_for_it() {
        let p = parked(&[Plugin::NodeResourcesFit], asking("2"));
        let yes = [
            Change::AssignedPodDeleted,
            Change::AssignedPodUpdated {
                freed: ["cpu".to_owned()].into(),
            },
            Change::NodeAdded(node(json!({}))),
            changed(
                json!({"status": {"allocatable": {"cpu": "1"}}}),
                json!({"status": {"allocatable": {"cpu": "3"}}}),
            ),
        ];
        let no = [
            // Another pod bound, or one that gave back what this one does not ask for.
            Change::AssignedPodAdded,
            Change::AssignedPodUpdated {
                freed: ["memory".to_owned()].into(),
            },
            Change::NodeGone,
            Change::Storage,
            // A node too small for it, even empty.
            Change::NodeAdded(node(json!({"status": {"allocatable": {"cpu": "1"}}}))),
            // More room, but still too little; the same room; only labels.
            changed(
                json!({"status": {"allocatable": {"cpu": "1"}}}),
                json!({"status": {"allocatable": {"cpu": "1500m"}}}),
            ),
            changed(json!({}), json!({})),
            changed(json!({}), json!({"metadata": {"labels": {"zone": "b"}}})),
        ];
        for change in &yes {
            assert!(worth_requeuing(&p, change), "{change:?}");
        }
        for change in &no {
            assert!(!worth_requeuing(&p, change), "{change:?}");
        }
    }

    #[test]
    fn node_properties_bring_back_the_pods_their_plugin_rejected() {
        let cordon = parked(&[Plugin::NodeUnschedulable], asking("1"));
        assert!(worth_requeuing(
            &cordon,
            &changed(json!({"spec": {"unschedulable": true}}), json!({}))
        ));
        assert!(!worth_requeuing(
            &cordon,
            &changed(json!({}), json!({"spec": {"unschedulable": true}}))
        ));
        let taint = json!({"spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]}});
        let tolerant = parked(&[Plugin::TaintToleration], asking("1"));
        assert!(worth_requeuing(
            &tolerant,
            &changed(taint.clone(), json!({}))
        ));
        assert!(!worth_requeuing(&tolerant, &changed(json!({}), taint)));
        let picky = parked(
            &[Plugin::NodeAffinity],
            json!({"nodeSelector": {"zone": "b"}, "containers": [{"name": "c"}]}),
        );
        assert!(worth_requeuing(
            &picky,
            &changed(json!({}), json!({"metadata": {"labels": {"zone": "b"}}}))
        ));
        assert!(!worth_requeuing(
            &picky,
            &changed(json!({}), json!({"metadata": {"labels": {"rack": "1"}}}))
        ));
        assert!(!worth_requeuing(
            &picky,
            &Change::NodeAdded(node(json!({})))
        ));
        let volumes = parked(&[Plugin::VolumeBinding], asking("1"));
        assert!(worth_requeuing(&volumes, &Change::Storage));
        assert!(!worth_requeuing(&volumes, &Change::AssignedPodDeleted));
        // Two plugins: either one's hint is enough.
        let both = parked(
            &[Plugin::NodeAffinity, Plugin::NodeResourcesFit],
            asking("1"),
        );
        assert!(worth_requeuing(&both, &Change::AssignedPodDeleted));
    }

    #[test]
    fn pod_events_are_told_as_kube_schedulers_informer_of_bound_pods_shows_them() {
        let pod = |node: &str, phase: &str, cpu: &str| {
            json!({"spec": {"nodeName": node, "containers": [{"name": "c",
                "resources": {"requests": {"cpu": cpu}}}]}, "status": {"phase": phase}})
        };
        let pending = pod("", "Pending", "1");
        let bound = pod("n1", "Pending", "1");
        let running = pod("n1", "Running", "1");
        let is = |e: PodEvent| format!("{e:?}");
        assert_eq!(is(pod_event(false, None, &pending)), "Nothing");
        assert_eq!(is(pod_event(false, Some(&pending), &pending)), "Own");
        assert_eq!(is(pod_event(true, None, &pending)), "Nothing");
        assert_eq!(
            is(pod_event(false, Some(&pending), &bound)),
            "Change(AssignedPodAdded)"
        );
        assert_eq!(
            is(pod_event(false, Some(&bound), &running)),
            "Change(AssignedPodUpdated { freed: {} })"
        );
        assert_eq!(
            is(pod_event(
                false,
                Some(&running),
                &pod("n1", "Running", "500m")
            )),
            "Change(AssignedPodUpdated { freed: {\"cpu\"} })"
        );
        // Ending leaves the informer's view: a deletion.
        assert_eq!(
            is(pod_event(
                false,
                Some(&running),
                &pod("n1", "Succeeded", "1")
            )),
            "Change(AssignedPodDeleted)"
        );
        assert_eq!(
            is(pod_event(true, None, &running)),
            "Change(AssignedPodDeleted)"
        );
    }

    #[test]
    fn a_heartbeat_is_no_change_of_scheduling_properties() {
        let at = |t: &str, ready: &str| {
            json!({"metadata": {"labels": {"a": "1"}}, "spec": {},
                "status": {"allocatable": {"cpu": "4"},
                    "conditions": [{"type": "Ready", "status": ready, "lastHeartbeatTime": t}]}})
        };
        assert!(!node_properties_changed(
            &at("2026-01-01T00:00:00Z", "True"),
            &at("2026-01-01T00:00:10Z", "True")
        ));
        assert!(node_properties_changed(
            &at("2026-01-01T00:00:00Z", "False"),
            &at("2026-01-01T00:00:10Z", "True")
        ));
        let mut more = at("2026-01-01T00:00:00Z", "True");
        more["status"]["allocatable"]["cpu"] = json!("5");
        assert!(node_properties_changed(
            &at("2026-01-01T00:00:00Z", "True"),
            &more
        ));
        // Cordoning makes nothing schedulable; uncordoning may.
        let mut cordoned = at("2026-01-01T00:00:00Z", "True");
        cordoned["spec"]["unschedulable"] = json!(true);
        let plain = at("2026-01-01T00:00:00Z", "True");
        assert!(!node_properties_changed(&plain, &cordoned));
        assert!(node_properties_changed(&cordoned, &plain));
    }

    #[test]
    fn what_a_pod_update_frees_and_which_updates_of_a_parked_pod_bring_it_back() {
        let req = |spec: Value| Requests::of(&serde_json::from_value(spec).unwrap(), &[]);
        let before = req(json!({"containers": [{"name": "c",
            "resources": {"requests": {"cpu": "2", "memory": "1Gi"}}}]}));
        let after = req(json!({"containers": [{"name": "c",
            "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}]}));
        assert_eq!(freed(&before, &after), ["cpu".to_owned()].into());
        assert!(freed(&before, &before).is_empty());
        let pod = json!({"metadata": {"labels": {"a": "1"}}, "spec": {"containers": []},
            "status": {"phase": "Pending"}});
        let mut status_only = pod.clone();
        status_only["status"]["conditions"] = json!([{"type": "PodScheduled"}]);
        let mut relabelled = pod.clone();
        relabelled["metadata"]["labels"]["a"] = json!("2");
        let short = parked(&[Plugin::NodeResourcesFit], asking("1"));
        assert!(!own_update_requeues(&short, &pod, &status_only));
        assert!(own_update_requeues(&short, &pod, &relabelled));
        let refused = parked(&[Plugin::Extender], asking("1"));
        assert!(own_update_requeues(&refused, &pod, &status_only));
    }
}
