//! The scheduler: binds pending pods to nodes where they fit, with `crates/core`'s fit
//! predicates over a live capacity model (never a re-list), preferring the node with the most
//! free room; pods that fit nowhere get `PodScheduled=False/Unschedulable` with
//! kube-scheduler's message and are retried when the cluster changes.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::{Value, json};
use tensile_core::capacity::CapacityModel;
use tensile_core::fit::{PodRequirements, Unfit, summarize};
use tokio_util::sync::CancellationToken;

use super::super::State;
use super::super::meta;
use super::super::resources::ids;
use super::super::store::{Event, EventType, ObjKey};
use super::{Reconciler, modify, run_loop};

pub(super) async fn run(state: Arc<State>, stop: CancellationToken) {
    run_loop(state, stop, Duration::from_secs(5), Scheduler::new()).await;
}

struct Scheduler {
    model: CapacityModel,
    pending: BTreeSet<ObjKey>,
}

impl Scheduler {
    fn new() -> Self {
        // No owner: every pod on a node takes room.
        Self {
            model: CapacityModel::new(String::new()),
            pending: BTreeSet::new(),
        }
    }

    fn observe(&mut self, res: usize, key: &ObjKey, obj: Option<&Value>) {
        if res == *ids::NODES {
            match obj.and_then(|o| serde_json::from_value::<Node>(o.clone()).ok()) {
                Some(node) => {
                    let _ = self.model.apply_node(&node);
                }
                None => self.model.remove_node(&key.name),
            }
        } else if res == *ids::PODS {
            match obj {
                Some(o) => {
                    if let Ok(pod) = serde_json::from_value::<Pod>(o.clone()) {
                        let _ = self.model.apply_pod(&pod);
                    }
                    if wants_scheduling(o) {
                        self.pending.insert(key.clone());
                    } else {
                        self.pending.remove(key);
                    }
                }
                None => {
                    self.model.remove_pod(&key.namespace, &key.name);
                    self.pending.remove(key);
                }
            }
        }
    }

    fn schedule_pending(&mut self, state: &State) {
        let keys: Vec<ObjKey> = self.pending.iter().cloned().collect();
        for key in keys {
            let Some(entry) = state.store.get(*ids::PODS, &key) else {
                self.pending.remove(&key);
                continue;
            };
            if !wants_scheduling(&entry.object) {
                self.pending.remove(&key);
                continue;
            }
            let Ok(pod) = serde_json::from_value::<Pod>((*entry.object).clone()) else {
                self.pending.remove(&key);
                continue;
            };
            match self.place(&pod) {
                Ok(node) => {
                    let binding = json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": key.name},
                        "target": {"apiVersion": "v1", "kind": "Node", "name": node}});
                    if super::super::strategy::bind_pod(state, &key.namespace, &key.name, &binding)
                        .is_ok()
                    {
                        let mut bound = pod;
                        if let Some(spec) = bound.spec.as_mut() {
                            spec.node_name = Some(node);
                        }
                        // Reserve now; the binding's own event arrives later.
                        let _ = self.model.apply_pod(&bound);
                        self.pending.remove(&key);
                    }
                }
                Err(message) => mark_unschedulable(state, &key, &message),
            }
        }
    }

    /// The node with the most free CPU and memory (relative) among those that fit.
    fn place(&self, pod: &Pod) -> Result<String, String> {
        let req = PodRequirements::from_pod(pod).map_err(|e| e.to_string())?;
        let mut failures: Vec<Vec<Unfit>> = Vec::new();
        let mut best: Option<(i128, String)> = None;
        let mut total = 0;
        for node in self.model.nodes() {
            total += 1;
            match req.check(&node) {
                Ok(()) => {
                    let score =
                        node.free.get("cpu") / 1_000_000 + node.free.get("memory") / (1 << 20);
                    if best
                        .as_ref()
                        .is_none_or(|(s, n)| score > *s || (score == *s && node.name < n.as_str()))
                    {
                        best = Some((score, node.name.to_owned()));
                    }
                }
                Err(unfit) => failures.push(unfit),
            }
        }
        best.map(|(_, n)| n)
            .ok_or_else(|| summarize(total, failures.iter().map(Vec::as_slice)))
    }
}

fn wants_scheduling(pod: &Value) -> bool {
    let unbound = pod
        .pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .is_none_or(str::is_empty);
    let ours = pod
        .pointer("/spec/schedulerName")
        .and_then(Value::as_str)
        .is_none_or(|s| s == "default-scheduler");
    let gated = pod
        .pointer("/spec/schedulingGates")
        .and_then(Value::as_array)
        .is_some_and(|g| !g.is_empty());
    let phase = pod.pointer("/status/phase").and_then(Value::as_str);
    unbound
        && ours
        && !gated
        && !meta::deleting(pod)
        && !matches!(phase, Some("Succeeded" | "Failed"))
}

fn mark_unschedulable(state: &State, key: &ObjKey, message: &str) {
    let _ = modify(state, *ids::PODS, key, |pod| {
        let Some(status) = pod.get_mut("status").and_then(Value::as_object_mut) else {
            return false;
        };
        let conditions = status.entry("conditions").or_insert_with(|| json!([]));
        let Some(list) = conditions.as_array_mut() else {
            return false;
        };
        let current = list
            .iter()
            .find(|c| c.get("type").and_then(Value::as_str) == Some("PodScheduled"));
        let same = current.is_some_and(|c| {
            c.get("status").and_then(Value::as_str) == Some("False")
                && c.get("message").and_then(Value::as_str) == Some(message)
        });
        if same {
            return false;
        }
        list.retain(|c| c.get("type").and_then(Value::as_str) != Some("PodScheduled"));
        list.push(
            json!({"type": "PodScheduled", "status": "False", "lastProbeTime": null,
            "lastTransitionTime": meta::now(), "reason": "Unschedulable", "message": message}),
        );
        true
    });
}

impl Reconciler for Scheduler {
    async fn resync(&mut self, state: &State) {
        *self = Scheduler::new();
        for res in [*ids::NODES, *ids::PODS] {
            let (items, _, _) = state.store.list(res, None, None, None, |_| true);
            for e in items {
                let key = ObjKey::new(
                    meta::namespace(&e.object).unwrap_or_default(),
                    meta::name(&e.object).unwrap_or_default(),
                );
                self.observe(res, &key, Some(&e.object));
            }
        }
        self.schedule_pending(state);
    }

    async fn changed(&mut self, state: &State, events: Option<&[Arc<Event>]>) {
        let mut relevant = events.is_none();
        for e in events.into_iter().flatten() {
            if e.res != *ids::NODES && e.res != *ids::PODS {
                continue;
            }
            relevant = true;
            let obj = (e.kind != EventType::Deleted).then_some(&*e.entry.object);
            self.observe(e.res, &e.key, obj);
        }
        if relevant && !self.pending.is_empty() {
            self.schedule_pending(state);
        }
    }
}
