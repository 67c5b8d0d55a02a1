//! The scheduler: binds pending pods to nodes where they fit, by its own simple rules
//! ([`super::fit`], not `crates/core`'s, which the extender uses) over a live count of each
//! node's room (never a re-list), preferring the least allocated node; pods that fit nowhere get `PodScheduled=False/Unschedulable` with
//! kube-scheduler's message and are retried when the cluster changes. Like kube-scheduler it
//! records a `Scheduled` event on binding and a `FailedScheduling` warning when the reason a
//! pod cannot be placed changes. A pod that could not be placed waits out kube-scheduler's
//! back-off (1 s, doubling per attempt, at most 10 s) before it is tried again, so a large
//! backlog of pods that fit nowhere does not cost every later change a pass over all of them
//! (nor each extender a call per pod per change). Extender calls reuse one kept-alive
//! connection per extender, as kube-scheduler's HTTP client does.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::super::State;
use super::super::client::Connections;
use super::super::meta;
use super::super::resources::ids;
use super::super::store::{Event, EventType, ObjKey};
use super::fit::{self, Reason, Requests, Room};
use super::volumes::{self, PodVolumes};
use super::{Reconciler, create, modify, run_loop};

pub(super) async fn run(state: Arc<State>, stop: CancellationToken) {
    // Ticks often enough that a pod whose back-off ran out is retried without waiting for
    // the next change; a tick costs nothing while every pending pod is backing off.
    run_loop(state, stop, Duration::from_secs(1), Scheduler::new()).await;
}

/// kube-scheduler's defaults: `podInitialBackoffSeconds` and `podMaxBackoffSeconds`.
const INITIAL_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(10);

/// The back-off after `attempts` failed attempts: 1 s doubling, at most 10 s.
fn backoff(attempts: u32) -> Duration {
    INITIAL_BACKOFF
        .saturating_mul(1_u32 << attempts.saturating_sub(1).min(8))
        .min(MAX_BACKOFF)
}

/// The outcome of the built-in filters for a pod.
struct Feasible {
    /// Nodes that fit, with a 0..=100 score.
    candidates: Vec<(String, i128)>,
    /// Nodes looked at.
    total: usize,
    /// Why the others do not fit.
    failures: Vec<Vec<Reason>>,
}

struct Scheduler {
    model: Room,
    pending: BTreeSet<ObjKey>,
    /// Pods that failed to be placed: failed attempts and when the back-off ends.
    backing_off: HashMap<ObjKey, (u32, Instant)>,
    /// Kept-alive connections to the extenders.
    connections: Connections,
}

impl Scheduler {
    fn new() -> Self {
        Self {
            model: Room::default(),
            pending: BTreeSet::new(),
            backing_off: HashMap::new(),
            connections: Connections::default(),
        }
    }

    /// Stops tracking a pod that no longer waits to be scheduled.
    fn forget(&mut self, key: &ObjKey) {
        self.pending.remove(key);
        self.backing_off.remove(key);
    }

    /// Records a failed attempt: the pod is not tried again before its back-off ends.
    fn failed(&mut self, key: &ObjKey) {
        let attempts = self.backing_off.get(key).map_or(0, |(a, _)| *a) + 1;
        self.backing_off
            .insert(key.clone(), (attempts, Instant::now() + backoff(attempts)));
    }

    fn observe(&mut self, res: usize, key: &ObjKey, obj: Option<&Value>) {
        if res == *ids::NODES {
            match obj.and_then(|o| serde_json::from_value::<Node>(o.clone()).ok()) {
                Some(node) => self.model.apply_node(&node),
                None => self.model.remove_node(&key.name),
            }
        } else if res == *ids::PODS {
            match obj {
                Some(o) => {
                    if let Ok(pod) = serde_json::from_value::<Pod>(o.clone()) {
                        self.model.apply_pod(&pod);
                    }
                    if wants_scheduling(o) {
                        self.pending.insert(key.clone());
                    } else {
                        self.forget(key);
                    }
                }
                None => {
                    self.model.remove_pod(&key.namespace, &key.name);
                    self.forget(key);
                }
            }
        }
    }

    async fn schedule_pending(&mut self, state: &State) {
        let now = Instant::now();
        let keys: Vec<ObjKey> = self
            .pending
            .iter()
            .filter(|k| {
                self.backing_off
                    .get(*k)
                    .is_none_or(|(_, until)| *until <= now)
            })
            .cloned()
            .collect();
        for key in keys {
            let Some(entry) = state.store.get(*ids::PODS, &key) else {
                self.forget(&key);
                continue;
            };
            if !wants_scheduling(&entry.object) {
                self.forget(&key);
                continue;
            }
            let Ok(pod) = serde_json::from_value::<Pod>((*entry.object).clone()) else {
                self.forget(&key);
                continue;
            };
            match self.place(state, &pod, &entry.object).await {
                Ok(node) => {
                    let message = format!(
                        "Successfully assigned {}/{} to {node}",
                        key.namespace, key.name
                    );
                    let bound =
                        match bind(state, &self.connections, &key, &entry.object, &node).await {
                            Ok(()) => true,
                            Err(Some(error)) => {
                                if mark_not_scheduled(state, &key, "SchedulerError", &error) {
                                    record_event(
                                        state,
                                        &entry.object,
                                        "Warning",
                                        "FailedScheduling",
                                        &error,
                                    )
                                    .await;
                                }
                                false
                            }
                            Err(None) => false,
                        };
                    if bound {
                        let mut bound = pod;
                        if let Some(spec) = bound.spec.as_mut() {
                            spec.node_name = Some(node);
                        }
                        // Reserve now; the binding's own event arrives later.
                        self.model.apply_pod(&bound);
                        self.forget(&key);
                        record_event(state, &entry.object, "Normal", "Scheduled", &message).await;
                    } else {
                        self.failed(&key);
                    }
                }
                Err(message) => {
                    self.failed(&key);
                    if mark_not_scheduled(state, &key, "Unschedulable", &message) {
                        record_event(
                            state,
                            &entry.object,
                            "Warning",
                            "FailedScheduling",
                            &message,
                        )
                        .await;
                    }
                }
            }
        }
    }

    /// The nodes that pass the built-in filters, with their 0..=100 LeastAllocated score;
    /// `ignored`: the resources extenders manage (`ignoredByScheduler`).
    fn feasible(&self, pod: &Pod, vols: Option<&PodVolumes>, ignored: &[String]) -> Feasible {
        let default_spec = k8s_openapi::api::core::v1::PodSpec::default();
        let spec = pod.spec.as_ref().unwrap_or(&default_spec);
        let req = Requests::of(spec, ignored);
        let mut failures: Vec<Vec<Reason>> = Vec::new();
        let mut candidates = Vec::new();
        let mut total = 0;
        for (node, used, used_nonzero) in self.model.ready_nodes() {
            total += 1;
            let mut reasons = fit::filter(spec, &req, node, used);
            if reasons.is_empty()
                && let Some(reason) = vols.and_then(|v| volumes::filter(v, node))
            {
                reasons.push(reason);
            }
            if reasons.is_empty() {
                candidates.push((node.name.clone(), fit::score(&req, node, used_nonzero)));
            } else {
                failures.push(reasons);
            }
        }
        Feasible {
            candidates,
            total,
            failures,
        }
    }

    /// The best node: built-in filters, then the extenders' filters and scores.
    async fn place(&self, state: &State, pod: &Pod, pod_json: &Value) -> Result<String, String> {
        let vols = if state.config.controllers.volume_binding {
            volumes::prefilter(state, pod_json).map_err(|e| {
                format!(
                    "0/{} nodes are available: {e}.",
                    self.model.ready_nodes().count()
                )
            })?
        } else {
            None
        };
        let all_extenders = state.scheduler_extenders();
        let ignored: Vec<String> = all_extenders
            .iter()
            .flat_map(|e| e.managed_resources.iter().cloned())
            .collect();
        let Feasible {
            mut candidates,
            total,
            failures,
        } = self.feasible(pod, vols.as_ref(), &ignored);
        // kube-scheduler's IsInterested: an extender managing resources sees only the pods
        // that ask for one.
        let extenders: Vec<_> = all_extenders
            .into_iter()
            .filter(|e| e.is_interested(pod_json))
            .collect();
        let mut extender_reasons: BTreeMap<String, usize> = BTreeMap::new();
        for ext in extenders.iter().filter(|e| e.filter_verb.is_some()) {
            if candidates.is_empty() {
                break;
            }
            let names: Vec<String> = candidates.iter().map(|(n, _)| n.clone()).collect();
            match filter(state, &self.connections, ext, pod_json, &names).await {
                Ok((kept, failed)) => {
                    candidates.retain(|(n, _)| kept.contains(n));
                    for reason in failed.values() {
                        *extender_reasons.entry(reason.clone()).or_default() += 1;
                    }
                }
                Err(e) if ext.ignorable => {
                    tracing::warn!(extender = %ext.url_prefix, error = %e, "ignorable scheduler extender failed")
                }
                Err(e) => {
                    return Err(format!(
                        "0/{total} nodes are available: extender {}: {e}",
                        ext.url_prefix
                    ));
                }
            }
        }
        if candidates.is_empty() {
            let mut message = fit::message(total, failures.iter().map(Vec::as_slice));
            if !extender_reasons.is_empty() {
                let extra: Vec<String> = extender_reasons
                    .iter()
                    .map(|(r, n)| format!("{n} {r}"))
                    .collect();
                message = if message.ends_with(':') {
                    format!("{message} {}.", extra.join(", "))
                } else {
                    format!("{}, {}.", message.trim_end_matches('.'), extra.join(", "))
                };
            }
            return Err(message);
        }
        let mut scores: BTreeMap<String, i128> = candidates.iter().cloned().collect();
        for ext in extenders.iter().filter(|e| e.prioritize_verb.is_some()) {
            let names: Vec<String> = scores.keys().cloned().collect();
            match prioritize(state, &self.connections, ext, pod_json, &names).await {
                // Extender scores are 0..=10; kube-scheduler scales them to node scores (x10).
                Ok(list) => {
                    for (host, score) in list {
                        if let Some(s) = scores.get_mut(&host) {
                            *s += i128::from(score) * i128::from(ext.weight) * 10;
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(extender = %ext.url_prefix, error = %e, "scheduler extender prioritize failed")
                }
            }
        }
        // Highest score; the first name among equals, for determinism.
        let best = scores
            .iter()
            .max_by(|a, b| a.1.cmp(b.1).then_with(|| b.0.cmp(a.0)))
            .map(|(n, _)| n.clone());
        let best = best.ok_or_else(|| fit::message(total, failures.iter().map(Vec::as_slice)))?;
        if let Some(vols) = &vols
            && let Some((node, _, _)) = self.model.ready_nodes().find(|(n, _, _)| n.name == best)
        {
            volumes::bind_for_node(state, vols, node).await?;
        }
        Ok(best)
    }
}

/// kube-scheduler's `ExtenderArgs`, as Go's `json.Marshal` writes it: the struct has no JSON
/// tags, so the keys are the Go field names and the list not sent is `null`.
fn extender_args(
    state: &State,
    ext: &super::SchedulerExtender,
    pod: &Value,
    names: &[String],
) -> Value {
    if ext.node_cache_capable {
        json!({"Pod": pod, "Nodes": null, "NodeNames": names})
    } else {
        let nodes: Vec<Value> = names
            .iter()
            .filter_map(|n| {
                state
                    .store
                    .get(*ids::NODES, &ObjKey::new("", n))
                    .map(|e| (*e.object).clone())
            })
            .collect();
        json!({"Pod": pod, "Nodes": {"metadata": {}, "items": nodes}, "NodeNames": null})
    }
}

/// Calls one verb of an extender.
async fn call_extender(
    connections: &Connections,
    ext: &super::SchedulerExtender,
    verb: &str,
    args: &Value,
) -> Result<Value, String> {
    let url = format!("{}/{verb}", ext.url_prefix.trim_end_matches('/'));
    let host = url
        .parse::<http::Uri>()
        .ok()
        .and_then(|u| u.host().map(str::to_owned))
        .unwrap_or_default();
    let body = serde_json::to_vec(args).map_err(|e| e.to_string())?;
    let reply = tokio::time::timeout(
        Duration::from_secs(30),
        connections.post_json(
            &url,
            &host,
            ext.ca_pem.as_deref(),
            ext.client_cert_pem
                .as_deref()
                .zip(ext.client_key_pem.as_deref()),
            body,
            true,
        ),
    )
    .await
    .map_err(|_| format!("Post \"{url}\": timed out"))??;
    serde_json::from_slice(&reply).map_err(|e| format!("invalid answer from {url}: {e}"))
}

async fn filter(
    state: &State,
    connections: &Connections,
    ext: &super::SchedulerExtender,
    pod: &Value,
    names: &[String],
) -> Result<(BTreeSet<String>, BTreeMap<String, String>), String> {
    let verb = ext.filter_verb.as_deref().unwrap_or("filter");
    let result = call_extender(
        connections,
        ext,
        verb,
        &extender_args(state, ext, pod, names),
    )
    .await?;
    if let Some(err) = field(&result, "error")
        .and_then(Value::as_str)
        .filter(|e| !e.is_empty())
    {
        return Err(err.to_owned());
    }
    // As kube-scheduler reads it: names when it sent names and got some, else the nodes.
    let names_back = field(&result, "nodeNames")
        .and_then(Value::as_array)
        .filter(|_| ext.node_cache_capable);
    let kept: BTreeSet<String> = match names_back {
        Some(list) => list
            .iter()
            .filter_map(|n| n.as_str().map(str::to_owned))
            .collect(),
        None => field(&result, "nodes")
            .and_then(|n| field(n, "items"))
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|n| {
                n.pointer("/metadata/name")
                    .and_then(Value::as_str)
                    .map(str::to_owned)
            })
            .collect(),
    };
    let mut failed = BTreeMap::new();
    for key in ["failedNodes", "failedAndUnresolvableNodes"] {
        for (n, r) in field(&result, key)
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
        {
            failed.insert(n.clone(), r.as_str().unwrap_or_default().to_owned());
        }
    }
    Ok((kept, failed))
}

async fn prioritize(
    state: &State,
    connections: &Connections,
    ext: &super::SchedulerExtender,
    pod: &Value,
    names: &[String],
) -> Result<Vec<(String, i64)>, String> {
    let verb = ext.prioritize_verb.as_deref().unwrap_or("prioritize");
    let result = call_extender(
        connections,
        ext,
        verb,
        &extender_args(state, ext, pod, names),
    )
    .await?;
    Ok(result
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|h| {
            Some((
                field(h, "host")?.as_str()?.to_owned(),
                field(h, "score")?.as_i64()?,
            ))
        })
        .collect())
}

/// A member of a JSON object, its key matched case-insensitively: Go's decoder reads extender
/// answers so (`nodeNames`, `NodeNames` and `nodenames` are one field).
fn field<'v>(value: &'v Value, name: &str) -> Option<&'v Value> {
    value
        .as_object()?
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v)
}

/// Binds a pod to `node`: through the first extender with a bind verb, or directly. `Err(Some)`
/// is a failure to report on the pod (the extender's error); `Err(None)` a failed direct write,
/// retried quietly.
async fn bind(
    state: &State,
    connections: &Connections,
    key: &ObjKey,
    pod: &Value,
    node: &str,
) -> Result<(), Option<String>> {
    for ext in state.scheduler_extenders() {
        let Some(verb) = ext.bind_verb.as_deref().filter(|_| ext.is_interested(pod)) else {
            continue;
        };
        // kube-scheduler's ExtenderBindingArgs, Go field names as keys.
        let args = json!({"PodName": key.name, "PodNamespace": key.namespace,
            "PodUID": pod.pointer("/metadata/uid").cloned().unwrap_or(Value::Null), "Node": node});
        let outcome = match call_extender(connections, &ext, verb, &args).await {
            Ok(result) => match field(&result, "error")
                .and_then(Value::as_str)
                .filter(|e| !e.is_empty())
            {
                Some(error) => Err(error.to_owned()),
                None => Ok(()),
            },
            Err(e) => Err(e),
        };
        match outcome {
            Err(e) if ext.ignorable => {
                tracing::warn!(extender = %ext.url_prefix, error = %e, "ignorable scheduler extender failed to bind");
            }
            Ok(()) => return Ok(()),
            Err(e) => return Err(Some(e)),
        }
    }
    let binding = json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": key.name},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node}});
    super::super::kinds::pod::bind_pod(state, &key.namespace, &key.name, &binding)
        .map(drop)
        .map_err(|_| None)
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

/// Sets `PodScheduled=False` with `reason` (`Unschedulable`, `SchedulerError`) and `message`;
/// whether it changed anything.
fn mark_not_scheduled(state: &State, key: &ObjKey, reason: &str, message: &str) -> bool {
    let mut changed = false;
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
                && c.get("reason").and_then(Value::as_str) == Some(reason)
                && c.get("message").and_then(Value::as_str) == Some(message)
        });
        if same {
            return false;
        }
        list.retain(|c| c.get("type").and_then(Value::as_str) != Some("PodScheduled"));
        list.push(
            json!({"type": "PodScheduled", "status": "False", "lastProbeTime": null,
            "lastTransitionTime": meta::now(), "reason": reason, "message": message}),
        );
        changed = true;
        true
    });
    changed
}

/// An event about `pod` as kube-scheduler records it (through `events.k8s.io/v1`, read here
/// through core/v1: eventTime, action and reporting component, no legacy source or count).
async fn record_event(state: &State, pod: &Value, type_: &str, reason: &str, message: &str) {
    let field = |name: &str| {
        pod.pointer(&format!("/metadata/{name}"))
            .cloned()
            .unwrap_or(Value::Null)
    };
    let (Some(namespace), Some(name)) = (
        pod.pointer("/metadata/namespace").and_then(Value::as_str),
        pod.pointer("/metadata/name").and_then(Value::as_str),
    ) else {
        return;
    };
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let event = json!({
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": format!("{name}.{nanos:x}"), "namespace": namespace},
        "involvedObject": {"apiVersion": "v1", "kind": "Pod", "namespace": namespace, "name": name,
            "uid": field("uid"), "resourceVersion": field("resourceVersion")},
        "type": type_, "reason": reason, "message": message, "action": "Scheduling",
        "eventTime": meta::now_micro(),
        "reportingComponent": "default-scheduler",
        "reportingInstance": "default-scheduler-sim",
        "source": {},
    });
    if let Err(e) = create(
        state,
        *ids::EVENTS,
        Some(namespace),
        event,
        "system:kube-scheduler",
    )
    .await
    {
        tracing::debug!(pod = %name, error = ?e, "recording a scheduler event");
    }
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
        self.schedule_pending(state).await;
    }

    async fn changed(&mut self, state: &State, events: Option<&[Arc<Event>]>) {
        let mut relevant = events.is_none();
        for e in events.into_iter().flatten() {
            if e.res != *ids::NODES && e.res != *ids::PODS {
                // A claim, volume or class appearing can make a waiting pod schedulable.
                relevant |= e.res == *ids::PERSISTENT_VOLUME_CLAIMS
                    || e.res == *ids::PERSISTENT_VOLUMES
                    || e.res == *ids::STORAGE_CLASSES;
                continue;
            }
            relevant = true;
            let obj = (e.kind != EventType::Deleted).then_some(&*e.entry.object);
            self.observe(e.res, &e.key, obj);
        }
        if relevant && !self.pending.is_empty() {
            self.schedule_pending(state).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pod_that_failed_backs_off_as_kube_scheduler_does() {
        let secs: Vec<u64> = (1..=6).map(|a| backoff(a).as_secs()).collect();
        assert_eq!(secs, [1, 2, 4, 8, 10, 10]);
        assert_eq!(backoff(u32::MAX), MAX_BACKOFF);
    }
}
