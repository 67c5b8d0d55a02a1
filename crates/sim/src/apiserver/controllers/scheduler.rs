//! The scheduler: binds pending pods to nodes where they fit, by its own simple rules
//! ([`super::fit`], not `crates/core`'s, which the extender uses) over a live count of each
//! node's room (never a re-list), preferring the least allocated node; pods that fit nowhere get `PodScheduled=False/Unschedulable` with
//! kube-scheduler's message. Like kube-scheduler it records a `Scheduled` event on binding and
//! a `FailedScheduling` warning when the reason a pod cannot be placed changes. A pod that
//! could not be placed is tried again as kube-scheduler's queue does it: not before a cluster
//! change that could make it fit, as the filters that rejected it tell ([`super::requeue`]),
//! and not before its back-off is over (1 s, doubling per attempt, at most 10 s), so a
//! backlog of pods that fit nowhere costs neither a quiet cluster nor each extender a call
//! per pod per change. Extender calls reuse one kept-alive connection per extender, as
//! kube-scheduler's HTTP client does.
//!
//! As kube-scheduler's binding cycle, binding runs in the background: a placed pod is
//! assumed on its node in the model at once (the next pod sees the room taken) and the
//! scheduler goes on to the next pod while it is bound (through an extender's bind verb or a
//! Binding); a bind that fails gives the room back and the pod waits out its back-off.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::{Value, json};
use tensile_runtime::clients::{TokenBucket, acquire_token};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::super::State;
use super::super::client::Connections;
use super::super::meta;
use super::super::resources::ids;
use super::super::store::{Event, EventType, ObjKey};
use super::fit::{self, Reason, Requests, Room};
use super::requeue::{self, Change, Parked, Plugin};
use super::volumes::{self, PodVolumes};
use super::{Reconciler, create, modify};

pub(super) async fn run(state: Arc<State>, stop: CancellationToken) {
    // `run_loop`'s loop, also waiting for the binds running in the background.
    let mut scheduler = Scheduler::new(state.clone());
    'outer: loop {
        let start = state.store.current_rv();
        scheduler.resync(&state).await;
        let Ok(mut cursor) = state.store.watch_from(start) else {
            continue;
        };
        // Ticks often enough that a pod whose back-off ran out is retried without waiting
        // for the next change; a tick costs nothing while every pending pod is backing off.
        let mut ticker = tokio::time::interval(Duration::from_secs(1));
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                batch = cursor.next_batch() => match batch {
                    Ok(batch) => scheduler.changed(&state, Some(&batch)).await,
                    Err(_) => continue 'outer,
                },
                Some(done) = scheduler.binds.join_next_with_id() => {
                    // What a failed bind gave back can place a waiting pod.
                    if scheduler.bound(&state, done).await && !scheduler.pending.is_empty() {
                        scheduler.schedule_pending(&state).await;
                    }
                }
                _ = ticker.tick() => scheduler.changed(&state, None).await,
            }
        }
    }
}

/// How many binds may be in flight at once; the scheduling cycle waits for one to finish
/// when this many are. kube-scheduler has no limit; this keeps memory bounded.
const MAX_BINDS_IN_FLIGHT: usize = 256;

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

/// A pod assumed on a node while its bind runs in the background.
struct Assumed {
    /// The pod as it was scheduled, with the node in `spec.nodeName`.
    pod: Pod,
    /// The pod as read from the store when it was scheduled, for its events.
    object: Arc<Value>,
}

/// What a background bind ends with: the pod, and `bind`'s outcome.
type BindDone = (ObjKey, Result<(), Option<String>>);

struct Scheduler {
    model: Room,
    pending: BTreeSet<ObjKey>,
    /// Pods that failed to be placed: failed attempts and when the back-off ends.
    backing_off: HashMap<ObjKey, (u32, Instant)>,
    /// kube-scheduler's unschedulable pods: rejected by a filter, not tried again before a
    /// change that could make them fit ([`requeue`]), whatever their back-off; with when
    /// they were parked.
    parked: HashMap<ObjKey, (Instant, Parked)>,
    /// kube-scheduler's assumed pods: counted in `model` on the node they are being bound to
    /// from when they are placed until their binding is seen (or the bind fails); none of
    /// them is scheduled again meanwhile, whatever events about it arrive.
    assumed: HashMap<ObjKey, Assumed>,
    /// The binds in flight (kube-scheduler's binding cycles), by task.
    binds: JoinSet<BindDone>,
    bind_tasks: HashMap<tokio::task::Id, ObjKey>,
    /// Kept-alive connections to the extenders.
    connections: Arc<Connections>,
    /// kube-scheduler's client-side rate limit, which its Binding writes and status patches
    /// wait on (with its defaults, 50 a second after a burst of 100).
    client: Arc<Mutex<TokenBucket>>,
    state: Arc<State>,
}

impl Scheduler {
    fn new(state: Arc<State>) -> Self {
        Self {
            model: Room::default(),
            pending: BTreeSet::new(),
            backing_off: HashMap::new(),
            parked: HashMap::new(),
            assumed: HashMap::new(),
            binds: JoinSet::new(),
            bind_tasks: HashMap::new(),
            connections: Arc::new(Connections::default()),
            client: Arc::new(Mutex::new(TokenBucket::new(
                state.config.controllers.scheduler_client_qps,
                state.config.controllers.scheduler_client_burst,
                tokio::time::Instant::now(),
            ))),
            state,
        }
    }

    /// Stops tracking a pod that no longer waits to be scheduled.
    fn forget(&mut self, key: &ObjKey) {
        self.pending.remove(key);
        self.backing_off.remove(key);
        self.parked.remove(key);
    }

    /// Brings back the parked pods `change` could make schedulable (they still wait out
    /// their back-off).
    fn requeue(&mut self, change: &Change) {
        self.parked
            .retain(|_, (_, p)| !requeue::worth_requeuing(p, change));
    }

    /// Records a failed attempt: the pod is not tried again before its back-off ends.
    fn failed(&mut self, key: &ObjKey) {
        let attempts = self.backing_off.get(key).map_or(0, |(a, _)| *a) + 1;
        self.backing_off
            .insert(key.clone(), (attempts, Instant::now() + backoff(attempts)));
    }

    /// kube-scheduler's `assume`, then its binding cycle in the background: the pod counts on
    /// `node` at once (the next pod sees the room taken) while it is bound, through an
    /// extender or directly; `Scheduled` is recorded when that succeeded.
    fn start_bind(&mut self, key: ObjKey, mut pod: Pod, object: Arc<Value>, node: String) {
        if let Some(spec) = pod.spec.as_mut() {
            spec.node_name = Some(node.clone());
        }
        self.model.apply_pod(&pod);
        self.forget(&key);
        let state = self.state.clone();
        let (connections, client) = (self.connections.clone(), self.client.clone());
        let task_key = key.clone();
        let task_object = object.clone();
        let task = self.binds.spawn(async move {
            let outcome = bind(
                &state,
                &connections,
                &client,
                &task_key,
                &task_object,
                &node,
            )
            .await;
            if outcome.is_ok() {
                let message = format!(
                    "Successfully assigned {}/{} to {node}",
                    task_key.namespace, task_key.name
                );
                record_event(&state, &task_object, "Normal", "Scheduled", &message).await;
            }
            (task_key, outcome)
        });
        self.bind_tasks.insert(task.id(), key.clone());
        self.assumed.insert(key, Assumed { pod, object });
    }

    /// A bind ended; whether it failed, giving its room back. A failed pod is forgotten from
    /// the model (kube-scheduler's `ForgetPod`) and waits out its back-off before it is
    /// tried again.
    async fn bound(
        &mut self,
        state: &State,
        done: Result<(tokio::task::Id, BindDone), tokio::task::JoinError>,
    ) -> bool {
        let (key, outcome) = match done {
            Ok((id, (key, outcome))) => {
                self.bind_tasks.remove(&id);
                (key, outcome)
            }
            Err(e) => {
                tracing::error!(error = %e, "a scheduler bind task failed");
                let Some(key) = self.bind_tasks.remove(&e.id()) else {
                    return false;
                };
                (key, Err(None))
            }
        };
        // On success the binding's own event confirms the pod on its node.
        let Err(error) = outcome else {
            return false;
        };
        // Not assumed any more: already seen bound (or deleted), nothing to give back.
        let Some(assumed) = self.assumed.remove(&key) else {
            return false;
        };
        // Back to what the store holds: unbound (pending again), bound elsewhere, or gone.
        // Forgetting an assumed pod is a bound pod's deletion to kube-scheduler's queue.
        self.model.remove_pod(&key.namespace, &key.name);
        self.requeue(&Change::AssignedPodDeleted);
        let current = state.store.get(*ids::PODS, &key);
        self.observe(*ids::PODS, &key, current.as_ref().map(|e| &*e.object));
        if self.pending.contains(&key) {
            self.failed(&key);
        }
        if let Some(error) = error
            && mark_not_scheduled(state, &self.client, &key, "SchedulerError", &error).await
        {
            record_event(
                state,
                &assumed.object,
                "Warning",
                "FailedScheduling",
                &error,
            )
            .await;
        }
        true
    }

    fn observe(&mut self, res: usize, key: &ObjKey, obj: Option<&Value>) {
        if res == *ids::NODES {
            match obj.and_then(|o| serde_json::from_value::<Node>(o.clone()).ok()) {
                Some(node) => self.model.apply_node(&node),
                None => self.model.remove_node(&key.name),
            }
        } else if res == *ids::PODS {
            match obj {
                // Assumed, the pod stays on its node until it is seen bound or its bind fails.
                Some(o) if self.assumed.contains_key(key) && unbound(o) => {}
                Some(o) => {
                    self.assumed.remove(key);
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
                    self.assumed.remove(key);
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
                !self.assumed.contains_key(*k)
                    && !self.parked.contains_key(*k)
                    && self
                        .backing_off
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
                    // A slot for its bind: wait for one in flight to end when all are taken.
                    while self.binds.len() >= MAX_BINDS_IN_FLIGHT {
                        let Some(done) = self.binds.join_next_with_id().await else {
                            break;
                        };
                        self.bound(state, done).await;
                    }
                    self.start_bind(key, pod, entry.object.clone(), node);
                }
                Err(Refusal {
                    message,
                    plugins,
                    error,
                }) => {
                    self.failed(&key);
                    if !plugins.is_empty() {
                        let spec = pod.spec.unwrap_or_default();
                        let requests =
                            Requests::of(&spec, &ignored_resources(&state.scheduler_extenders()));
                        let parked = Parked {
                            plugins,
                            spec,
                            requests,
                        };
                        self.parked.insert(key.clone(), (Instant::now(), parked));
                    }
                    let reason = if error {
                        "SchedulerError"
                    } else {
                        "Unschedulable"
                    };
                    if mark_not_scheduled(state, &self.client, &key, reason, &message).await {
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
    async fn place(&self, state: &State, pod: &Pod, pod_json: &Value) -> Result<String, Refusal> {
        let vols = if state.config.controllers.volume_binding {
            volumes::prefilter(state, pod_json).map_err(|e| Refusal {
                message: format!(
                    "0/{} nodes are available: {e}.",
                    self.model.ready_nodes().count()
                ),
                plugins: [Plugin::VolumeBinding].into(),
                error: false,
            })?
        } else {
            None
        };
        let all_extenders = state.scheduler_extenders();
        let ignored = ignored_resources(&all_extenders);
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
        let mut extender_refused = false;
        for ext in extenders.iter().filter(|e| e.filter_verb.is_some()) {
            if candidates.is_empty() {
                break;
            }
            let names: Vec<String> = candidates.iter().map(|(n, _)| n.clone()).collect();
            match filter(state, &self.connections, ext, pod_json, &names).await {
                Ok((kept, failed)) => {
                    candidates.retain(|(n, _)| kept.contains(n));
                    extender_refused |= candidates.len() < names.len();
                    for reason in failed.values() {
                        *extender_reasons.entry(reason.clone()).or_default() += 1;
                    }
                }
                Err(e) if ext.ignorable => {
                    tracing::warn!(extender = %ext.url_prefix, error = %e, "ignorable scheduler extender failed")
                }
                Err(e) => {
                    return Err(Refusal::error(format!(
                        "0/{total} nodes are available: extender {}: {e}",
                        ext.url_prefix
                    )));
                }
            }
        }
        if candidates.is_empty() {
            let mut plugins: BTreeSet<Plugin> = failures
                .iter()
                .filter_map(|reasons| reasons.first().map(Plugin::of))
                .collect();
            if extender_refused {
                plugins.insert(Plugin::Extender);
            }
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
            return Err(Refusal {
                message,
                plugins,
                error: false,
            });
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
        let best = best.ok_or_else(|| {
            Refusal::error(fit::message(total, failures.iter().map(Vec::as_slice)))
        })?;
        if let Some(vols) = &vols
            && let Some((node, _, _)) = self.model.ready_nodes().find(|(n, _, _)| n.name == best)
        {
            volumes::bind_for_node(state, vols, node)
                .await
                .map_err(Refusal::error)?;
        }
        Ok(best)
    }
}

/// Why a pod was not placed: kube-scheduler's message, and the plugins that rejected it
/// (none: no node to reject it, or an error, such as an extender's: then the pod only waits
/// out its back-off).
struct Refusal {
    message: String,
    plugins: BTreeSet<Plugin>,
    /// An error, not a rejection: `PodScheduled` says `SchedulerError`, not `Unschedulable`.
    error: bool,
}

impl Refusal {
    fn error(message: String) -> Self {
        Self {
            message,
            plugins: BTreeSet::new(),
            error: true,
        }
    }
}

/// The resources `extenders` manage, which the scheduler leaves to them (`ignoredByScheduler`).
fn ignored_resources(extenders: &[super::SchedulerExtender]) -> Vec<String> {
    extenders
        .iter()
        .flat_map(|e| e.managed_resources.iter().cloned())
        .collect()
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
    client: &Mutex<TokenBucket>,
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
    acquire_token(client).await;
    super::super::kinds::pod::bind_pod(state, &key.namespace, &key.name, &binding)
        .map(drop)
        .map_err(|_| None)
}

/// Whether a pod has no node yet.
fn unbound(pod: &Value) -> bool {
    pod.pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .is_none_or(str::is_empty)
}

fn wants_scheduling(pod: &Value) -> bool {
    let unbound = unbound(pod);
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

/// Sets `PodScheduled=False` with `reason` (`Unschedulable`, `SchedulerError`) and `message`
/// through the scheduler's throttled `client`; whether it changed anything. As kube-scheduler
/// (whose patch is empty then) it writes, and waits for a token, only when the condition
/// differs.
async fn mark_not_scheduled(
    state: &State,
    client: &Mutex<TokenBucket>,
    key: &ObjKey,
    reason: &str,
    message: &str,
) -> bool {
    let same = |pod: &Value| {
        pod.get("status")
            .and_then(|s| s.get("conditions"))
            .and_then(Value::as_array)
            .and_then(|list| {
                list.iter()
                    .find(|c| c.get("type").and_then(Value::as_str) == Some("PodScheduled"))
            })
            .is_some_and(|c| {
                c.get("status").and_then(Value::as_str) == Some("False")
                    && c.get("reason").and_then(Value::as_str) == Some(reason)
                    && c.get("message").and_then(Value::as_str) == Some(message)
            })
    };
    match state.store.get(*ids::PODS, key) {
        Some(entry) if !same(&entry.object) => {}
        _ => return false,
    }
    acquire_token(client).await;
    let mut changed = false;
    let _ = modify(state, *ids::PODS, key, |pod| {
        if same(pod) {
            return false;
        }
        let Some(status) = pod.get_mut("status").and_then(Value::as_object_mut) else {
            return false;
        };
        let conditions = status.entry("conditions").or_insert_with(|| json!([]));
        let Some(list) = conditions.as_array_mut() else {
            return false;
        };
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

impl Scheduler {
    /// What node or pod event `e` is to the parked pods, as kube-scheduler's event handlers
    /// tell its queue.
    fn tell_parked(&mut self, e: &Event) {
        let new = &*e.entry.object;
        let prev = e.prev.as_ref().map(|p| &*p.object);
        if e.res == *ids::NODES {
            let facts = |v: &Value| {
                serde_json::from_value::<Node>(v.clone())
                    .ok()
                    .map(|n| fit::NodeFacts::of(&n))
            };
            let change = match (e.kind, prev) {
                (EventType::Deleted, _) => Some(Change::NodeGone),
                (EventType::Modified, Some(old)) => {
                    if requeue::node_properties_changed(old, new) {
                        match (facts(old), facts(new)) {
                            (Some(old), Some(new)) => match (old.ready, new.ready) {
                                (false, true) => Some(Change::NodeAdded(new)),
                                (true, false) => Some(Change::NodeGone),
                                (true, true) => Some(Change::NodeChanged { old, new }),
                                (false, false) => None,
                            },
                            _ => None,
                        }
                    } else {
                        None
                    }
                }
                _ => facts(new).filter(|n| n.ready).map(Change::NodeAdded),
            };
            if let Some(change) = change {
                self.requeue(&change);
            }
            return;
        }
        let change = match requeue::pod_event(e.kind == EventType::Deleted, prev, new) {
            requeue::PodEvent::Change(change) => Some(change),
            requeue::PodEvent::Own => {
                let back = match (self.parked.get(&e.key), prev) {
                    (Some((_, p)), Some(old)) => requeue::own_update_requeues(p, old, new),
                    _ => false,
                };
                if back {
                    self.parked.remove(&e.key);
                }
                None
            }
            requeue::PodEvent::Nothing => None,
        };
        if let Some(change) = change {
            self.requeue(&change);
        }
    }
}

impl Reconciler for Scheduler {
    async fn resync(&mut self, state: &State) {
        // Binds in flight go on: their pods stay assumed over the model rebuilt from the store.
        let binds = std::mem::take(&mut self.binds);
        let bind_tasks = std::mem::take(&mut self.bind_tasks);
        let mut assumed = std::mem::take(&mut self.assumed);
        assumed.retain(|k, _| bind_tasks.values().any(|b| b == k));
        // A relist is no change to kube-scheduler's queue: parked pods stay parked, back-offs
        // run on (pods that no longer wait are forgotten as the list is observed).
        let parked = std::mem::take(&mut self.parked);
        let backing_off = std::mem::take(&mut self.backing_off);
        *self = Scheduler::new(self.state.clone());
        self.parked = parked;
        self.backing_off = backing_off;
        self.binds = binds;
        self.bind_tasks = bind_tasks;
        for a in assumed.values() {
            self.model.apply_pod(&a.pod);
        }
        self.assumed = assumed;
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
        // Pods deleted while the watch was down are not in the list.
        let pending = &self.pending;
        self.parked.retain(|k, _| pending.contains(k));
        self.backing_off.retain(|k, _| pending.contains(k));
        self.schedule_pending(state).await;
    }

    async fn changed(&mut self, state: &State, events: Option<&[Arc<Event>]>) {
        let mut relevant = events.is_none();
        if events.is_none() {
            // kube-scheduler's flush of pods parked too long.
            let now = Instant::now();
            self.parked
                .retain(|_, (since, _)| now.duration_since(*since) < requeue::MAX_PARKED);
        }
        for e in events.into_iter().flatten() {
            if e.res != *ids::NODES && e.res != *ids::PODS {
                // A claim, volume or class appearing can make a waiting pod schedulable.
                let storage = e.res == *ids::PERSISTENT_VOLUME_CLAIMS
                    || e.res == *ids::PERSISTENT_VOLUMES
                    || e.res == *ids::STORAGE_CLASSES;
                if storage {
                    self.requeue(&Change::Storage);
                }
                relevant |= storage;
                continue;
            }
            relevant = true;
            if !self.parked.is_empty() {
                self.tell_parked(e);
            }
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
