//! DaemonSets run one pod on every node their pods may run on: kube-controller-manager's
//! daemonset controller, for what users see. Whether a node should run the pod is the real
//! controller's rule: its node selector and required affinity match, and every `NoSchedule`
//! and `NoExecute` taint is tolerated by the template's tolerations plus those every daemon
//! pod gets (not-ready, unreachable, pressure, unschedulable); resources do not count. So a
//! cordoned node keeps its daemon pod, and a tainted node (the virtual node of tensile-kube)
//! gets none unless the template tolerates the taint. Pods are pinned to their node by
//! required node affinity on `metadata.name` and bound by the scheduler, as on a real
//! cluster. A changed template replaces pods `maxUnavailable` at a time.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, PodSpec, Taint};
use serde_json::{Value, json};
use tensile_core::keys::{
    EFFECT_NO_EXECUTE, TAINT_NOT_READY, TAINT_UNREACHABLE, TAINT_UNSCHEDULABLE,
};
use tokio_util::sync::CancellationToken;

use super::super::State;
use super::super::meta;
use super::super::resources::ids;
use super::super::rest::DeleteOptions;
use super::super::store::{Event, ObjKey};
use super::fit;
use super::replicaset::{is_ready, owned_pods};
use super::{
    Reconciler, all_keys, changed_owners, create, delete, modify, pod_from_template, run_loop,
};

pub(super) async fn run(state: Arc<State>, stop: CancellationToken) {
    run_loop(state, stop, Duration::from_secs(10), DaemonSets).await;
}

struct DaemonSets;

/// The tolerations every daemon pod gets (`AddOrUpdateDaemonPodTolerations`).
fn daemon_tolerations(host_network: bool) -> Vec<Value> {
    let mut t = vec![
        (TAINT_NOT_READY, EFFECT_NO_EXECUTE),
        (TAINT_UNREACHABLE, EFFECT_NO_EXECUTE),
        ("node.kubernetes.io/disk-pressure", "NoSchedule"),
        ("node.kubernetes.io/memory-pressure", "NoSchedule"),
        ("node.kubernetes.io/pid-pressure", "NoSchedule"),
        (TAINT_UNSCHEDULABLE, "NoSchedule"),
    ];
    if host_network {
        t.push(("node.kubernetes.io/network-unavailable", "NoSchedule"));
    }
    t.into_iter()
        .map(|(key, effect)| json!({"key": key, "operator": "Exists", "effect": effect}))
        .collect()
}

/// The template's tolerations with the daemon ones added (those already there kept).
fn with_daemon_tolerations(spec: &Value) -> Vec<Value> {
    let mut all: Vec<Value> = spec
        .get("tolerations")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let host_network = spec.get("hostNetwork").and_then(Value::as_bool) == Some(true);
    for t in daemon_tolerations(host_network) {
        if !all
            .iter()
            .any(|x| x.get("key") == t.get("key") && x.get("effect") == t.get("effect"))
        {
            all.push(t);
        }
    }
    all
}

/// Whether a node should run a daemon pod of `spec` (the pod template's spec, daemon
/// tolerations added), and whether one already there may keep running (only `NoExecute`
/// taints evict): the real controller's `NodeShouldRunDaemonPod`.
fn should_run(spec: &PodSpec, node: &Node) -> (bool, bool) {
    let taints: &[Taint] = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_deref())
        .unwrap_or_default();
    // Daemon pods tolerate cordoned nodes, and need no room.
    let placement_fits = fit::affinity_admits(spec, &fit::NodeFacts::of(node));
    let tolerations = spec.tolerations.as_deref().unwrap_or_default();
    let untolerated = fit::untolerated(taints, tolerations);
    let run = placement_fits && untolerated.is_empty();
    let keep = placement_fits && !untolerated.iter().any(|t| t.effect == EFFECT_NO_EXECUTE);
    (run, keep)
}

/// The node a daemon pod is for: where it is bound, or the node its affinity pins it to.
fn node_of(pod: &Value) -> Option<&str> {
    pod.pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .or_else(|| {
            pod.pointer(
                "/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms/0/matchFields/0/values/0",
            )
            .and_then(Value::as_str)
        })
}

/// A daemon pod for `node`: the template, the daemon tolerations, required affinity to the
/// node by name, and the revision labels.
fn daemon_pod(
    template: &Value,
    key: &ObjKey,
    uid: &str,
    node: &str,
    hash: &str,
    generation: i64,
) -> Value {
    let mut pod = pod_from_template(template, key, "apps/v1", "DaemonSet", uid);
    let labels = &mut pod["metadata"]["labels"];
    if !labels.is_object() {
        *labels = json!({});
    }
    labels["controller-revision-hash"] = json!(hash);
    labels["pod-template-generation"] = json!(generation.to_string());
    let tolerations = with_daemon_tolerations(&pod["spec"]);
    let spec = &mut pod["spec"];
    spec["tolerations"] = Value::Array(tolerations);
    if !spec["affinity"].is_object() {
        spec["affinity"] = json!({});
    }
    if !spec["affinity"]["nodeAffinity"].is_object() {
        spec["affinity"]["nodeAffinity"] = json!({});
    }
    spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] = json!({
        "nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [node]}]}]});
    pod
}

/// `maxUnavailable` of a rolling update, of `desired` nodes (at least 1).
fn max_unavailable(spec: &Value, desired: usize) -> usize {
    let v = spec.pointer("/updateStrategy/rollingUpdate/maxUnavailable");
    let n = match v {
        Some(Value::Number(n)) => n.as_u64().unwrap_or(1) as usize,
        Some(Value::String(s)) => s
            .strip_suffix('%')
            .and_then(|p| p.parse::<usize>().ok())
            .map_or(1, |p| (p * desired).div_ceil(100)),
        _ => 1,
    };
    n.max(1)
}

async fn reconcile(state: &State, key: &ObjKey) {
    let Some(ds) = state.store.get(*ids::DAEMONSETS, key) else {
        return;
    };
    let ds = ds.object;
    if meta::deleting(&ds) {
        return;
    }
    let uid = meta::meta_str(&ds, "uid").unwrap_or_default().to_owned();
    let spec = ds.get("spec").cloned().unwrap_or_else(|| json!({}));
    let template = spec.get("template").cloned().unwrap_or_else(|| json!({}));
    let generation = ds
        .pointer("/metadata/generation")
        .and_then(Value::as_i64)
        .unwrap_or(1);
    let Some(revision) =
        super::revisions::ensure(state, key, ("apps/v1", "DaemonSet", &uid), &template, &spec)
            .await
    else {
        return;
    };
    let mut pod_spec_value = template.get("spec").cloned().unwrap_or_else(|| json!({}));
    pod_spec_value["tolerations"] = Value::Array(with_daemon_tolerations(&pod_spec_value));
    // A template the API server accepted reads as a PodSpec; one that does not runs nowhere.
    let pod_spec: Option<PodSpec> = serde_json::from_value(pod_spec_value).ok();
    let (nodes, _, _) = state.store.list(*ids::NODES, None, None, None, |_| true);
    let nodes: Vec<Node> = nodes
        .iter()
        .filter_map(|e| serde_json::from_value((*e.object).clone()).ok())
        .collect();
    let pods = owned_pods(state, &key.namespace, &uid);
    let mut by_node: BTreeMap<String, Vec<&Arc<Value>>> = BTreeMap::new();
    for p in &pods {
        if let Some(n) = node_of(p) {
            by_node.entry(n.to_owned()).or_default().push(p);
        }
    }
    let hash_of = |p: &Value| meta::labels(p).get("controller-revision-hash").cloned();
    let finished = |p: &Value| {
        matches!(
            p.pointer("/status/phase").and_then(Value::as_str),
            Some("Succeeded" | "Failed")
        )
    };
    let mut to_create = Vec::new();
    let mut to_delete: BTreeSet<String> = BTreeSet::new();
    let mut desired = 0;
    let (mut current, mut misscheduled, mut ready, mut updated) = (0, 0, 0, 0);
    let mut outdated = Vec::new();
    for node in &nodes {
        let name = node.metadata.name.clone().unwrap_or_default();
        let (run, keep) = pod_spec
            .as_ref()
            .map_or((false, false), |s| should_run(s, node));
        let here = by_node.remove(&name).unwrap_or_default();
        let mut live: Vec<&Arc<Value>> = Vec::new();
        for p in here {
            if meta::deleting(p) {
                continue;
            }
            if finished(p) {
                // Replaced: the next pass creates a new one.
                to_delete.insert(meta::name(p).unwrap_or_default().to_owned());
            } else {
                live.push(p);
            }
        }
        live.sort_by_key(|p| meta::meta_str(p, "creationTimestamp").map(str::to_owned));
        if run {
            desired += 1;
            if live.is_empty() {
                to_create.push(name.clone());
            } else {
                current += 1;
                // One pod per node: the oldest stays.
                for extra in &live[1..] {
                    to_delete.insert(meta::name(extra).unwrap_or_default().to_owned());
                }
                let p = live[0];
                if is_ready(p) {
                    ready += 1;
                }
                if hash_of(p).as_deref() == Some(revision.hash.as_str()) {
                    updated += 1;
                } else {
                    outdated.push(p);
                }
            }
        } else if !live.is_empty() {
            misscheduled += 1;
            if !keep {
                for p in &live {
                    to_delete.insert(meta::name(p).unwrap_or_default().to_owned());
                }
            }
        }
    }
    // Pods pinned to nodes that are gone.
    for p in by_node.values().flatten() {
        if !meta::deleting(p) {
            to_delete.insert(meta::name(p).unwrap_or_default().to_owned());
        }
    }
    let rolling = spec.pointer("/updateStrategy/type").and_then(Value::as_str) != Some("OnDelete");
    if rolling {
        // Outdated pods that are not ready go first and cost nothing; then as many ready
        // ones as the budget of unavailable pods allows.
        let unavailable = desired - ready;
        let mut budget = max_unavailable(&spec, desired).saturating_sub(unavailable);
        outdated.sort_by_key(|p| is_ready(p));
        for p in outdated {
            if is_ready(p) {
                if budget == 0 {
                    break;
                }
                budget -= 1;
            }
            to_delete.insert(meta::name(p).unwrap_or_default().to_owned());
        }
    }
    for name in &to_delete {
        let k = ObjKey::new(&key.namespace, name.as_str());
        let _ = delete(state, *ids::PODS, &k, &DeleteOptions::default());
    }
    for node in &to_create {
        let pod = daemon_pod(&template, key, &uid, node, &revision.hash, generation);
        if create(
            state,
            *ids::PODS,
            Some(&key.namespace),
            pod,
            "daemon-set-controller",
        )
        .await
        .is_err()
        {
            break;
        }
    }
    let _ = modify(state, *ids::DAEMONSETS, key, |o| {
        let mut status = json!({
            "currentNumberScheduled": current,
            "desiredNumberScheduled": desired,
            "numberMisscheduled": misscheduled,
            "numberReady": ready,
            "observedGeneration": generation,
        });
        // `omitempty` in Go.
        for (field, n) in [
            ("updatedNumberScheduled", updated),
            ("numberAvailable", ready),
            ("numberUnavailable", desired - ready),
        ] {
            if n != 0 {
                status[field] = json!(n);
            }
        }
        o["status"] = status;
        true
    });
}

impl Reconciler for DaemonSets {
    async fn resync(&mut self, state: &State) {
        for key in all_keys(state, *ids::DAEMONSETS) {
            reconcile(state, &key).await;
        }
    }

    async fn changed(&mut self, state: &State, events: Option<&[Arc<Event>]>) {
        let Some(events) = events else {
            return self.resync(state).await;
        };
        // A node that came, went or changed may change where every set runs.
        if events.iter().any(|e| e.res == *ids::NODES) {
            return self.resync(state).await;
        }
        for key in changed_owners(events, *ids::DAEMONSETS, *ids::PODS, "DaemonSet") {
            reconcile(state, &key).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, labels: Value, taints: Value, unschedulable: bool) -> Node {
        serde_json::from_value(json!({"metadata": {"name": name, "labels": labels},
            "spec": {"taints": taints, "unschedulable": unschedulable}}))
        .unwrap_or_default()
    }

    fn spec(v: Value) -> PodSpec {
        let mut v = v;
        v["containers"] = json!([{"name": "c"}]);
        v["tolerations"] = Value::Array(with_daemon_tolerations(&v));
        serde_json::from_value(v).unwrap_or_default()
    }

    #[test]
    fn a_daemon_pod_runs_on_cordoned_and_not_ready_nodes_but_not_on_tainted_ones() {
        let plain = spec(json!({}));
        let cordoned = node("a", json!({}), json!([]), true);
        assert_eq!(should_run(&plain, &cordoned), (true, true));
        let not_ready = node(
            "b",
            json!({}),
            json!([{"key": TAINT_NOT_READY, "effect": "NoExecute"}]),
            false,
        );
        assert_eq!(should_run(&plain, &not_ready), (true, true));
        let virtual_node = node(
            "vk",
            json!({"type": "virtual-kubelet"}),
            json!([{"key": "virtual-kubelet.io/provider", "value": "k8s", "effect": "NoSchedule"}]),
            false,
        );
        assert_eq!(
            should_run(&plain, &virtual_node),
            (false, true),
            "a NoSchedule taint keeps new pods off but does not evict"
        );
        let tolerant = spec(json!({"tolerations": [
            {"key": "virtual-kubelet.io/provider", "operator": "Exists"}]}));
        assert_eq!(should_run(&tolerant, &virtual_node), (true, true));
        let evicting = node(
            "c",
            json!({}),
            json!([{"key": "maintenance", "effect": "NoExecute"}]),
            false,
        );
        assert_eq!(should_run(&plain, &evicting), (false, false));
    }

    #[test]
    fn the_node_selector_and_required_affinity_choose_the_nodes() {
        let gpu = spec(json!({"nodeSelector": {"gpu": "yes"}}));
        assert!(should_run(&gpu, &node("a", json!({"gpu": "yes"}), json!([]), false)).0);
        assert_eq!(
            should_run(&gpu, &node("b", json!({}), json!([]), false)),
            (false, false)
        );
    }

    #[test]
    fn a_daemon_pod_is_pinned_to_its_node_and_tolerates_what_daemons_tolerate() {
        let template = json!({"metadata": {"labels": {"app": "agent"}},
            "spec": {"containers": [{"name": "c"}], "hostNetwork": true,
                "tolerations": [{"key": TAINT_UNSCHEDULABLE, "operator": "Exists",
                    "effect": "NoSchedule"}]}});
        let pod = daemon_pod(&template, &ObjKey::new("ns", "agent"), "u", "n1", "h", 3);
        assert_eq!(node_of(&pod), Some("n1"));
        assert_eq!(pod["metadata"]["labels"]["controller-revision-hash"], "h");
        assert_eq!(pod["metadata"]["labels"]["pod-template-generation"], "3");
        let tolerations = pod["spec"]["tolerations"].as_array().map_or(0, Vec::len);
        assert_eq!(
            tolerations, 7,
            "six daemon tolerations, network-unavailable, no duplicate"
        );
    }

    #[test]
    fn max_unavailable_is_a_count_or_a_share_of_the_desired_nodes() {
        let s = |v: Value| json!({"updateStrategy": {"rollingUpdate": {"maxUnavailable": v}}});
        assert_eq!(max_unavailable(&s(json!(2)), 10), 2);
        assert_eq!(max_unavailable(&s(json!("25%")), 10), 3);
        assert_eq!(max_unavailable(&s(json!(0)), 10), 1);
        assert_eq!(max_unavailable(&json!({}), 10), 1);
    }
}
