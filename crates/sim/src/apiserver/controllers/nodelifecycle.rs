//! Node lifecycle: a node whose lease (`kube-node-lease/<node>`) has not been renewed within
//! the grace period is marked Unknown and tainted unreachable (`NoSchedule`); once its kubelet
//! reports Ready again, the taints go. As in kube-controller-manager, the `NoExecute` taint
//! that evicts pods is only put on while some node is still Ready: when every node is
//! unreachable (a fully disrupted zone; zones are not simulated, the cluster is one), the
//! controller assumes its own connectivity is at fault and takes `NoExecute` taints off.
//! (Eviction rate limits and the eviction of pods are not simulated.)

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::super::State;
use super::super::meta;
use super::super::resources::ids;
use super::super::store::{Event, EventType, ObjKey};
use super::{Reconciler, modify, run_loop};

const UNREACHABLE: &str = "node.kubernetes.io/unreachable";
use super::super::kinds::node::{NOT_READY_TAINT, has_taint, node_taints_mut};

/// kube-controller-manager's default `--node-monitor-period`: how often every node's lease
/// is looked at (a node's own updates are handled as they come). A shorter grace shortens it,
/// as the test harness does for real control planes, so that the grace is what decides.
const NODE_MONITOR_PERIOD: Duration = Duration::from_secs(5);

pub(super) async fn run(state: Arc<State>, stop: CancellationToken) {
    let grace = state.config.controllers.node_grace;
    let period = NODE_MONITOR_PERIOD.min((grace / 4).max(Duration::from_millis(500)));
    run_loop(state, stop, period, NodeLifecycle { grace }).await;
}

struct NodeLifecycle {
    grace: Duration,
}

fn ready_status(node: &Value) -> Option<&str> {
    node.pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| c.get("type").and_then(Value::as_str) == Some("Ready"))?
        .get("status")?
        .as_str()
}

fn has_unreachable_taint(node: &Value) -> bool {
    node.pointer("/spec/taints")
        .and_then(Value::as_array)
        .is_some_and(|t| {
            t.iter()
                .any(|t| t.get("key").and_then(Value::as_str) == Some(UNREACHABLE))
        })
}

impl NodeLifecycle {
    /// Every node, then the `NoExecute` pass: kube-controller-manager's periodic health check.
    fn check(&self, state: &State) {
        let now = Timestamp::now();
        let (nodes, _, _) = state.store.list(*ids::NODES, None, None, None, |_| true);
        for node in &nodes {
            self.check_node(state, &node.object, now);
        }
        self.no_execute(state, now);
    }

    /// One node: its not-ready taint, and Unknown when its lease has run out (or back once it
    /// is Ready and renewed).
    fn check_node(&self, state: &State, node: &Value, now: Timestamp) {
        let grace = SignedDuration::try_from(self.grace).unwrap_or(SignedDuration::from_secs(40));
        let name = meta::name(node).unwrap_or_default().to_owned();
        let key = ObjKey::new("", &name);
        // kube-controller-manager's NoSchedule tainting pass: `not-ready` while the kubelet
        // reports Ready False (or has not reported yet), gone once it reports True.
        let ready = ready_status(node);
        let want_not_ready = ready.is_none_or(|r| r == "False");
        if has_not_ready_taint(node) != want_not_ready {
            let _ = modify(state, *ids::NODES, &key, |n| {
                set_not_ready_taint(n, want_not_ready)
            });
        }
        let lease = state
            .store
            .get(*ids::LEASES, &ObjKey::new("kube-node-lease", &name));
        let renewed = lease.as_ref().and_then(|l| {
            l.object
                .pointer("/spec/renewTime")
                .and_then(Value::as_str)
                .and_then(meta::parse_time)
        });
        let Some(renewed) = renewed else { return };
        let expired = now.duration_since(renewed) > grace;
        if expired && ready != Some("Unknown") {
            let _ = modify(state, *ids::NODES, &key, |n| mark_unknown(n, now));
        } else if !expired && ready == Some("True") && has_unreachable_taint(node) {
            let _ = modify(state, *ids::NODES, &key, |n| {
                if let Some(t) = n.pointer_mut("/spec/taints").and_then(Value::as_array_mut) {
                    t.retain(|t| t.get("key").and_then(Value::as_str) != Some(UNREACHABLE));
                }
                true
            });
        }
    }

    /// Puts `NoExecute` on unreachable nodes while some node is Ready, takes it off when none
    /// is (full disruption).
    fn no_execute(&self, state: &State, now: Timestamp) {
        let (nodes, _, _) = state.store.list(*ids::NODES, None, None, None, |_| true);
        let some_ready = nodes
            .iter()
            .any(|n| ready_status(&n.object) == Some("True"));
        for node in &nodes {
            if ready_status(&node.object) != Some("Unknown") {
                continue;
            }
            let tainted = has_unreachable(&node.object, "NoExecute");
            if tainted == some_ready {
                continue;
            }
            let name = meta::name(&node.object).unwrap_or_default().to_owned();
            let _ = modify(state, *ids::NODES, &ObjKey::new("", &name), |n| {
                let Some(taints) = n.pointer_mut("/spec/taints").and_then(Value::as_array_mut)
                else {
                    return false;
                };
                if some_ready {
                    taints.push(json!({"key": UNREACHABLE, "effect": "NoExecute",
                        "timeAdded": meta::time_string(now)}));
                } else {
                    taints.retain(|t| {
                        !(t.get("key").and_then(Value::as_str) == Some(UNREACHABLE)
                            && t.get("effect").and_then(Value::as_str) == Some("NoExecute"))
                    });
                }
                true
            });
        }
    }
}

fn has_not_ready_taint(node: &Value) -> bool {
    node.pointer("/spec/taints")
        .and_then(Value::as_array)
        .is_some_and(|t| has_taint(t, NOT_READY_TAINT, "NoSchedule"))
}

fn set_not_ready_taint(node: &mut Value, on: bool) -> bool {
    if has_not_ready_taint(node) == on {
        return false;
    }
    let Some(taints) = node_taints_mut(node) else {
        return false;
    };
    if on {
        taints.push(json!({"key": NOT_READY_TAINT, "effect": "NoSchedule",
            "timeAdded": meta::time_string(Timestamp::now())}));
    } else {
        taints.retain(|t| !has_taint(std::slice::from_ref(t), NOT_READY_TAINT, "NoSchedule"));
    }
    true
}

fn has_unreachable(node: &Value, effect: &str) -> bool {
    node.pointer("/spec/taints")
        .and_then(Value::as_array)
        .is_some_and(|t| has_taint(t, UNREACHABLE, effect))
}

fn mark_unknown(node: &mut Value, now: Timestamp) -> bool {
    let stamp = meta::time_string(now);
    if let Some(conditions) = node
        .pointer_mut("/status/conditions")
        .and_then(Value::as_array_mut)
    {
        for c in conditions.iter_mut() {
            c["status"] = json!("Unknown");
            c["reason"] = json!("NodeStatusUnknown");
            c["message"] = json!("Kubelet stopped posting node status.");
            c["lastTransitionTime"] = json!(stamp);
        }
    }
    if let Some(taints) = node_taints_mut(node)
        && !has_taint(taints, UNREACHABLE, "NoSchedule")
    {
        taints.push(json!({"key": UNREACHABLE, "effect": "NoSchedule", "timeAdded": stamp}));
    }
    true
}

impl Reconciler for NodeLifecycle {
    async fn resync(&mut self, state: &State) {
        self.check(state);
    }

    async fn changed(&mut self, state: &State, events: Option<&[Arc<Event>]>) {
        let Some(events) = events else {
            // The tick: time drives leases running out.
            self.check(state);
            return;
        };
        // A node's own update is checked alone, as kube-controller-manager's taint pass
        // handles a node event: a heartbeat of one node in thousands costs one node's check,
        // not a scan of all of them (the scan is the tick's, every node monitor period).
        let now = Timestamp::now();
        let changed: BTreeSet<&ObjKey> = events
            .iter()
            .filter(|e| e.res == *ids::NODES && e.kind != EventType::Deleted)
            .map(|e| &e.key)
            .collect();
        for key in changed {
            if let Some(node) = state.store.get(*ids::NODES, key) {
                self.check_node(state, &node.object, now);
            }
        }
    }
}
