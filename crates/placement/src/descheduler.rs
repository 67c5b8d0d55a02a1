//! `tensile descheduler`: moves pods that their virtual node's lower cluster cannot place.
//!
//! Event driven: one watch of Pending upper pods, one of virtual nodes and one of our move
//! intents (ConfigMaps labelled `tensile-kube.io/move=true` in `--namespace`). Each pod event
//! computes when the pod becomes due (`tensile_core::deschedule::due`: Unschedulable in the
//! lower cluster for the threshold, or the original's age rule) and puts the pod on the work
//! queue for that moment (`tensile_runtime::queue`, delayed requeue); then the pod is checked
//! again from the cache and, if still due, moved. Moves and exclusion records are keys of the
//! same queue, each step saying when to look again.
//!
//! Split as an index and a writer: the index (`index.rs`) applies the watch events, says which
//! keys to look at when, and decides what to do for a key as effect values (start a move,
//! evict, re-create, hand the count over, an event, look again after a while); this module
//! runs the watches and the workers and executes the effects. The rules of the loop are tested
//! on the index, without clusters; `tests/descheduler.rs` keeps the wiring.
//!
//! A move is first written down as an intent (`tensile_core::deschedule::Move`), then carried
//! out step by step (`move_step`) from the caches, each step idempotent, until it is complete:
//! - a controller's pod is marked `unschedulable-node=<node>` (the webhook records it
//!   synchronously, so the replacement avoids the node) and deleted with a UID precondition;
//!   its controller creates the replacement, and the intent hands the pod's attempt count over
//!   to it (`sigs.k8s.io/deschedule-count`). Nothing is created twice and nothing is lost.
//! - a bare pod that opted in is deleted, then its replacement is created under its name.
//!
//! A step that fails is tried again 5 s later, and every intent is taken up again at start (it
//! is in the watch's first list), so a refused or failed create is retried until the pod is
//! back, with or without a restart. Intents are removed once complete.
//!
//! Why the count lives on the pods and the intents, not on the controller: the replacement of a
//! controller's pod is a new pod from the controller's template, which the webhook only sees
//! for `virtual-pod=true` pods. Writing the count on the owner instead would need write access
//! to every workload kind (ReplicaSets, StatefulSets, Jobs, custom resources) and would be one
//! count for all the replicas; the intent is ours, in our namespace, and the count follows the
//! pod's slot in its workload, across the delete and across restarts.
//!
//! Moves are rate limited (a global token bucket and a per-node limit per minute), a pod moved
//! `max_attempts` times is left alone with a Warning event, and `dry_run` writes nothing.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Node, ObjectReference, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::watcher;
use serde_json::json;
use tensile_core::deschedule::{self, Move, MoveHow, Policy};
use tensile_core::keys::{
    ANNOTATION_UNSCHEDULABLE_NODE, EVENT_RESCHEDULED, LABEL_NODE_TYPE, VALUE_NODE_TYPE_VIRTUAL,
};
use tensile_runtime::clients::{already_exists, delete_exact};
use tensile_runtime::controller::{self, OnFailure, Reconciler, Workers};
use tensile_runtime::events::{EventSink, PodEvent};
use tensile_runtime::lock::lock;
use tensile_runtime::metrics::Readiness;
use tensile_runtime::queue::{Action, Queue};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::metrics::DeschedulerMetrics;

/// Label of the descheduler's ConfigMaps: `true` on a move in progress (its intent),
/// [`VALUE_EXCLUSIONS`] on the record of the nodes a controller is kept off.
pub const LABEL_MOVE: &str = "tensile-kube.io/move";
/// [`LABEL_MOVE`] of an exclusions record (`tensile_core::deschedule::exclusions_name`).
pub const VALUE_EXCLUSIONS: &str = "exclusions";
/// Default of `--exclusion-window`: how long a workload stays off a virtual node one of its
/// pods was moved away from (the original's freeze window was 3 minutes).
pub const DEFAULT_EXCLUSION_WINDOW: Duration = Duration::from_secs(180);
/// Key of the intent's JSON in such a ConfigMap.
const MOVE_KEY: &str = "move.json";
/// Moves and steps in flight at once.
const CONCURRENT_MOVES: usize = 8;
/// Event reason of a step that failed and will be tried again.
const EVENT_DESCHEDULING_FAILED: &str = "DeschedulingFailed";

/// How the descheduler runs.
#[derive(Debug, Clone)]
pub struct DeschedulerConfig {
    /// When pods are due and which may move.
    pub policy: Policy,
    /// Log what would move; write nothing (fix: the original ignored it).
    pub dry_run: bool,
    /// Label selector of the virtual nodes whose pods may move.
    pub node_selector: String,
    /// Moves per virtual node per minute; 0 is unlimited.
    pub max_per_node_per_minute: u32,
    /// Moves per second over all nodes, and their burst.
    pub moves_per_second: f64,
    /// Burst of `moves_per_second`.
    pub burst: u32,
    /// Namespace of the move intents and exclusion records (the descheduler's own).
    pub namespace: String,
    /// How long a controller stays off a node one of its pods was moved away from.
    pub exclusion_window: Duration,
    /// Moves and give-ups are counted here.
    pub metrics: DeschedulerMetrics,
    /// Set ready once the watches have listed (`/readyz` of `--metrics-addr`).
    pub readiness: Option<Readiness>,
}

impl Default for DeschedulerConfig {
    fn default() -> Self {
        Self {
            policy: Policy::default(),
            dry_run: false,
            node_selector: format!("{LABEL_NODE_TYPE}={VALUE_NODE_TYPE_VIRTUAL}"),
            max_per_node_per_minute: 0,
            moves_per_second: 10.0,
            burst: 20,
            namespace: "kube-system".into(),
            exclusion_window: DEFAULT_EXCLUSION_WINDOW,
            metrics: DeschedulerMetrics::default(),
            readiness: None,
        }
    }
}

/// Errors of a move, with the pod they concern.
#[derive(Debug, thiserror::Error)]
pub enum MoveError {
    /// An API call failed.
    #[error("{action} pod {namespace}/{name}: {source}")]
    Api {
        /// What was being done.
        action: &'static str,
        /// Pod namespace.
        namespace: String,
        /// Pod name.
        name: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// An intent could not be encoded.
    #[error("move intent {0}: {1}")]
    Intent(String, String),
    /// The exclusions record of a controller could not be written.
    #[error(
        "recording that controller {controller} stays off {node} (ConfigMap {record}): {source}"
    )]
    Exclusion {
        /// UID of the controller.
        controller: String,
        /// The node it stays off.
        node: String,
        /// Name of the record.
        record: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
}

mod index;

use index::{Effect, Event, Exclusion, Index, Intent, Key, Now, RECHECK, RETRY};

struct Descheduler {
    config: DeschedulerConfig,
    client: kube::Client,
    index: Mutex<Index>,
    events: EventSink,
    /// The keys to look at (a started move is looked at again at once).
    queue: Queue<Key>,
}

impl Descheduler {
    fn index(&self) -> MutexGuard<'_, Index> {
        lock(&self.index, "the descheduler index")
    }

    fn intent_api(&self) -> Api<ConfigMap> {
        Api::namespaced(self.client.clone(), &self.config.namespace)
    }

    fn publish(&self, event: Event) {
        let (namespace, name, uid) = event.pod;
        self.events.publish(PodEvent {
            regarding: reference(namespace, name, uid),
            warning: event.warning,
            reason: event.reason.to_owned(),
            note: event.note,
        });
    }
}

/// Runs the descheduler until `stop`.
pub async fn run(
    config: DeschedulerConfig,
    client: kube::Client,
    stop: CancellationToken,
) -> Result<(), MoveError> {
    let index = Index::new(config.clone(), Instant::now());
    let (pods, nodes, moves) = index.caches();
    let (queue, rx) = Queue::<Key>::new();
    let shared = Arc::new(Descheduler {
        events: EventSink::start(client.clone(), "tensile-descheduler", "tensile-descheduler"),
        client: client.clone(),
        index: Mutex::new(index),
        config,
        queue: queue.clone(),
    });
    // The watches put the keys they touch on the queue at once; the workers start once every
    // cache has listed, so no key is decided on a partial picture.
    watch(
        &shared,
        &queue,
        &stop,
        Api::<Node>::all(client.clone()),
        watcher::Config::default().labels(&shared.config.node_selector),
        "nodes",
        Index::apply_node,
    );
    watch(
        &shared,
        &queue,
        &stop,
        Api::<Pod>::all(client.clone()),
        watcher::Config::default().fields("status.phase=Pending"),
        "pods",
        Index::apply_pod,
    );
    watch(
        &shared,
        &queue,
        &stop,
        Api::<ConfigMap>::namespaced(client, &shared.config.namespace),
        // One watch for both kinds of our ConfigMaps.
        watcher::Config::default().labels(&format!("{LABEL_MOVE} in (true,{VALUE_EXCLUSIONS})")),
        "move intents",
        |index, event, _| index.apply_move(event),
    );
    tokio::select! {
        () = stop.cancelled() => return Ok(()),
        () = async {
            pods.wait_until_ready().await;
            nodes.wait_until_ready().await;
            moves.wait_until_ready().await;
        } => {}
    }
    if let Some(readiness) = &shared.config.readiness {
        readiness.set_ready();
    }
    // A key is worked on by one worker at a time; one touched meanwhile is looked at again
    // once it is done (the queue's rules). Back at once on stop: a worker in the middle of an
    // API call does not hold up shutdown.
    let workers = Workers {
        count: CONCURRENT_MOVES,
        long_per_worker: 0,
        drain: Duration::ZERO,
    };
    controller::run(shared, queue, rx, workers, stop).await;
    Ok(())
}

/// One watch applied to the index; the keys it touches go on the queue.
fn watch<K>(
    shared: &Arc<Descheduler>,
    queue: &Queue<Key>,
    stop: &CancellationToken,
    api: Api<K>,
    config: watcher::Config,
    what: &'static str,
    apply: impl Fn(&mut Index, &watcher::Event<K>, Now) -> Vec<(Key, Duration)> + Send + Sync + 'static,
) where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
{
    let events = tensile_runtime::backoff::watch(api, config);
    let (shared, queue, stop) = (shared.clone(), queue.clone(), stop.clone());
    tokio::spawn(async move {
        tensile_runtime::backoff::drain(Box::pin(events), &stop, what, |event| {
            let wakes = apply(&mut shared.index(), &event, Now::current());
            for (key, after) in wakes {
                queue.add_after(key, after);
            }
        })
        .await;
    });
}

impl Reconciler for Descheduler {
    type Key = Key;
    type Plan = Vec<Effect>;
    /// A failed step is retried by the index's own schedule ([`Effect::Requeue`]).
    type Error = std::convert::Infallible;

    fn plan(&self, key: &Key) -> Vec<Effect> {
        self.index().decide(key, Now::current())
    }

    /// Executes what the index decided, and comes back to the key when that says.
    async fn execute(self: Arc<Self>, _: Key, effects: Vec<Effect>) -> Result<Action, Self::Error> {
        let mut again: Option<Duration> = None;
        for effect in effects {
            if let Some(after) = execute(&self, &self.queue, effect).await {
                again = Some(again.map_or(after, |a| a.min(after)));
            }
        }
        Ok(again.map_or(Action::Done, Action::RequeueAfter))
    }

    fn failed(&self, _: &Key, e: &Self::Error, _: Option<tokio::time::Instant>) -> OnFailure {
        match *e {}
    }
}

/// Executes one effect; when to look at its key again.
async fn execute(shared: &Descheduler, queue: &Queue<Key>, effect: Effect) -> Option<Duration> {
    match effect {
        Effect::Requeue(after) => Some(after),
        Effect::Event(event) => {
            shared.publish(event);
            None
        }
        Effect::GaveUp => {
            shared.config.metrics.gave_up();
            None
        }
        Effect::StartMove { intent, m } => match write_intent(shared, &intent, &m).await {
            Ok(()) => {
                let through_owner = matches!(m.how, MoveHow::ThroughOwner { .. });
                shared.config.metrics.moved(through_owner);
                queue.add(Key::Move(intent));
                None
            }
            Err(e) => {
                tracing::warn!(error = %e, "move not started; retried");
                shared.index().start_failed(&intent);
                Some(RETRY)
            }
        },
        Effect::Evict {
            intent,
            m,
            exclusion,
            event,
        } => {
            let result = evict(shared, &m, exclusion.as_ref()).await.map(|()| {
                if let Some(event) = event {
                    tracing::info!(pod = ?(&m.namespace, &m.name), node = m.node, why = m.why, "moved through its controller");
                    shared.publish(event);
                }
                // The pod is leaving: the next step is seen once it is gone.
                Some(RETRY)
            });
            step_done(shared, &intent, &m, result).await
        }
        Effect::Recreate { intent, m, note } => {
            let result = create_replacement(shared, &m, note).await;
            step_done(shared, &intent, &m, result).await
        }
        Effect::HandOver { intent, m, pod } => {
            let result = hand_over(shared, &m, &pod).await;
            step_done(shared, &intent, &m, result).await
        }
        Effect::Complete(intent) => remove_intent(shared, &intent).await,
        Effect::RemoveRecord {
            name,
            uid,
            resource_version,
        } => {
            // Only the version read: a node recorded meanwhile keeps the record.
            let params = DeleteParams {
                preconditions: Some(Preconditions {
                    uid,
                    resource_version,
                }),
                ..DeleteParams::default()
            };
            let result = shared
                .intent_api()
                .delete(&name, &params)
                .await
                .map(|_| None);
            record_cleaned(&name, result)
        }
        Effect::DropLapsed {
            name,
            resource_version,
            nodes,
            next,
        } => {
            let data: serde_json::Map<String, serde_json::Value> = nodes
                .into_iter()
                .map(|n| (n, serde_json::Value::Null))
                .collect();
            let patch = json!({"metadata": {"resourceVersion": resource_version}, "data": data});
            let result = shared
                .intent_api()
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map(|_| Some(next));
            record_cleaned(&name, result)
        }
    }
}

/// After a step of a move: `Ok(None)` completes it (the intent goes), `Ok(Some(after))` looks
/// again then, a failure is told on the pod and tried again.
async fn step_done(
    shared: &Descheduler,
    intent: &Intent,
    m: &Move,
    result: Result<Option<Duration>, MoveError>,
) -> Option<Duration> {
    match result {
        Ok(None) => remove_intent(shared, intent).await,
        Ok(Some(after)) => Some(after),
        Err(e) => {
            tracing::warn!(error = %e, intent = intent.name, "move step failed; retried");
            shared.publish(Event {
                pod: (m.namespace.clone(), m.name.clone(), m.uid.clone()),
                warning: true,
                reason: EVENT_DESCHEDULING_FAILED,
                note: format!("{e}; tried again in {RETRY:?}"),
            });
            Some(RETRY)
        }
    }
}

async fn remove_intent(shared: &Descheduler, intent: &Intent) -> Option<Duration> {
    match delete_exact(&shared.intent_api(), &intent.name, intent.uid.clone(), None).await {
        Ok(()) => None,
        Err(e) => {
            tracing::warn!(error = %e, intent = intent.name, "cannot remove a complete move intent");
            Some(RETRY)
        }
    }
}

fn record_cleaned(name: &str, result: Result<Option<Duration>, kube::Error>) -> Option<Duration> {
    match result {
        Ok(next) => next,
        // Changed or gone meanwhile: its watch event looks again.
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => None,
        Err(e) => {
            tracing::warn!(error = %e, record = name, "cannot clean up an exclusions record; retried");
            Some(RETRY)
        }
    }
}

/// Writes the intent of a move (done when it exists already: same pod, same move).
async fn write_intent(shared: &Descheduler, name: &str, m: &Move) -> Result<(), MoveError> {
    let body =
        serde_json::to_string(m).map_err(|e| MoveError::Intent(name.to_owned(), e.to_string()))?;
    let intent: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {LABEL_MOVE: "true"}},
        "data": {MOVE_KEY: body}
    }))
    .map_err(|e| MoveError::Intent(name.to_owned(), e.to_string()))?;
    match shared
        .intent_api()
        .create(&PostParams::default(), &intent)
        .await
    {
        Err(e) if !already_exists(&e) => Err(api_error("recording the move of", m)(e)),
        _ => Ok(()),
    }
}

fn api_error<'a>(action: &'static str, m: &'a Move) -> impl FnOnce(kube::Error) -> MoveError + 'a {
    move |source| MoveError::Api {
        action,
        namespace: m.namespace.clone(),
        name: m.name.clone(),
        source,
    }
}

/// Records that the moved pod's controller stays off the node, marks the pod with the node it
/// failed on (the original's annotation), then deletes it, both only while it is the pod with
/// the move's UID.
async fn evict(
    shared: &Descheduler,
    m: &Move,
    exclusion: Option<&Exclusion>,
) -> Result<(), MoveError> {
    if let Some(exclusion) = exclusion {
        record_exclusion(shared, exclusion).await?;
    }
    let api: Api<Pod> = Api::namespaced(shared.client.clone(), &m.namespace);
    let patch = json!({"metadata": {"uid": m.uid,
        "annotations": {ANNOTATION_UNSCHEDULABLE_NODE: m.node}}});
    match api
        .patch(&m.name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => return Ok(()),
        r => r.map(drop).map_err(api_error("marking", m))?,
    }
    delete_exact(&api, &m.name, Some(m.uid.clone()), None)
        .await
        .map_err(api_error("deleting", m))
}

/// Writes into the controller's exclusions record that it stays off the node until the time
/// decided (a merge patch of one key, so no read is needed; created when missing).
async fn record_exclusion(shared: &Descheduler, exclusion: &Exclusion) -> Result<(), MoveError> {
    let Exclusion {
        controller,
        node,
        record: name,
        until,
    } = exclusion;
    let record = json!({"metadata": {"name": name, "labels": {LABEL_MOVE: VALUE_EXCLUSIONS}},
        "data": {node: until.to_string()}});
    let fail = |source| MoveError::Exclusion {
        controller: controller.clone(),
        node: node.clone(),
        record: name.clone(),
        source,
    };
    let api = shared.intent_api();
    for _ in 0..2 {
        match api
            .patch(name, &PatchParams::default(), &Patch::Merge(&record))
            .await
        {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(fail(e)),
        }
        let cm: ConfigMap = serde_json::from_value(record.clone())
            .map_err(|e| MoveError::Intent(name.clone(), e.to_string()))?;
        match api.create(&PostParams::default(), &cm).await {
            Ok(_) => return Ok(()),
            // Created meanwhile (a previous attempt): patch it.
            Err(e) if already_exists(&e) => {}
            Err(e) => return Err(fail(e)),
        }
    }
    Ok(())
}

/// Creates the replacement of a re-created pod once the moved pod is gone. `None` when done.
async fn create_replacement(
    shared: &Descheduler,
    m: &Move,
    note: String,
) -> Result<Option<Duration>, MoveError> {
    let MoveHow::Recreate { replacement } = &m.how else {
        return Ok(None);
    };
    let api: Api<Pod> = Api::namespaced(shared.client.clone(), &m.namespace);
    // The watch holds Pending pods only: the moved pod may still be there, in another phase.
    match api.get_opt(&m.name).await {
        Ok(Some(p)) if p.metadata.uid.as_deref() == Some(m.uid.as_str()) => {
            return Ok(Some(RECHECK));
        }
        // Someone (a restarted descheduler, the user) created it already: it is not lost.
        Ok(Some(_)) => return Ok(None),
        Ok(None) => {}
        Err(e) => return Err(api_error("looking for", m)(e)),
    }
    match api.create(&PostParams::default(), replacement).await {
        Ok(created) => {
            tracing::info!(pod = ?(&m.namespace, &m.name), node = m.node, why = m.why, "re-created");
            shared.publish(Event {
                pod: (
                    m.namespace.clone(),
                    m.name.clone(),
                    created.metadata.uid.unwrap_or_default(),
                ),
                warning: false,
                reason: EVENT_RESCHEDULED,
                note,
            });
            Ok(None)
        }
        Err(e) if already_exists(&e) => Ok(None),
        Err(e) => Err(api_error("creating the replacement of", m)(e)),
    }
}

/// Hands the move's count over to the controller's new pod. `None` when done.
async fn hand_over(
    shared: &Descheduler,
    m: &Move,
    pod: &Pod,
) -> Result<Option<Duration>, MoveError> {
    let tensile_runtime::cache::Key {
        namespace: ns,
        name,
    } = index::key_of(pod);
    let api: Api<Pod> = Api::namespaced(shared.client.clone(), &ns);
    let patch = deschedule::handover_patch(m, pod);
    match api
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => {
            tracing::debug!(pod = ?(&ns, &name), attempts = m.attempts, "count handed over");
            Ok(None)
        }
        // It changed or went meanwhile: decide again from the cache.
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(Some(RECHECK)),
        Err(e) => Err(MoveError::Api {
            action: "counting the move on",
            namespace: ns,
            name,
            source: e,
        }),
    }
}

fn reference(namespace: String, name: String, uid: String) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        namespace: Some(namespace),
        name: Some(name),
        uid: Some(uid).filter(|u| !u.is_empty()),
        ..ObjectReference::default()
    }
}
