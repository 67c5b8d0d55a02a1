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

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{ConfigMap, Node, ObjectReference, Pod};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::WatchStreamExt as _;
use kube::runtime::watcher;
use serde_json::json;
use tensile_core::deschedule::{
    self, ExclusionsCleanup, Handling, Move, MoveHow, MoveStep, Policy,
};
use tensile_core::keys::{
    ANNOTATION_UNSCHEDULABLE_NODE, EVENT_RESCHEDULED, LABEL_NODE_TYPE, VALUE_NODE_TYPE_VIRTUAL,
};
use tensile_runtime::cache::CompactCache;
use tensile_runtime::clients::{TokenBucket, already_exists, delete_exact};
use tensile_runtime::events::{EventSink, PodEvent};
use tensile_runtime::metrics::Readiness;
use tensile_runtime::queue::{Action, Queue, Receiver};
use tokio::sync::mpsc;
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
/// When a failed step is tried again.
const RETRY: Duration = Duration::from_secs(5);
/// When a step that lost a race (a conflict, a pod still leaving) looks again.
const RECHECK: Duration = Duration::from_secs(1);
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

/// Namespace and name of a pod.
type PodKey = (String, String);

/// What a key of the work queue is: a pod that may become due, a move intent to carry on, or an
/// exclusions record to clean up.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Key {
    Pod(PodKey),
    Move(String),
    Exclusions(String),
}

/// A change seen on a watch.
enum Touched {
    /// A pod, with its controller's UID.
    Pod(PodKey, Option<String>),
    /// A move intent (by ConfigMap name).
    Move(String),
    /// An exclusions record (by ConfigMap name).
    Exclusions(String),
}

struct Limits {
    global: TokenBucket,
    per_node: HashMap<String, Vec<Instant>>,
}

/// The cached Pending pods of each controller, so that a move finds its replacement without
/// decoding every pod.
#[derive(Default)]
struct ByController {
    pods: HashMap<String, HashSet<PodKey>>,
    controller_of: HashMap<PodKey, String>,
}

impl ByController {
    fn set(&mut self, key: PodKey, controller: Option<String>) {
        if let Some(old) = self.controller_of.remove(&key)
            && let Some(set) = self.pods.get_mut(&old)
        {
            set.remove(&key);
            if set.is_empty() {
                self.pods.remove(&old);
            }
        }
        if let Some(c) = controller {
            self.pods.entry(c.clone()).or_default().insert(key.clone());
            self.controller_of.insert(key, c);
        }
    }
}

struct Shared {
    config: DeschedulerConfig,
    client: kube::Client,
    pods: CompactCache<Pod>,
    nodes: CompactCache<Node>,
    moves: CompactCache<ConfigMap>,
    by_controller: Mutex<ByController>,
    events: EventSink,
    limits: Mutex<Limits>,
    /// Pods told once why they are left alone (by UID), so a stuck pod is not an event storm.
    told: Mutex<HashSet<String>>,
}

/// Runs the descheduler until `stop`.
pub async fn run(
    config: DeschedulerConfig,
    client: kube::Client,
    stop: CancellationToken,
) -> Result<(), MoveError> {
    let shared = Arc::new(Shared {
        events: EventSink::start(client.clone(), "tensile-descheduler", "tensile-descheduler"),
        limits: Mutex::new(Limits {
            global: TokenBucket::new(config.moves_per_second, config.burst, Instant::now()),
            per_node: HashMap::new(),
        }),
        told: Mutex::default(),
        client: client.clone(),
        pods: CompactCache::new(),
        nodes: CompactCache::new(),
        moves: CompactCache::new(),
        by_controller: Mutex::default(),
        config,
    });
    let (touched_tx, mut touched_rx) = mpsc::unbounded_channel::<Touched>();
    watch_nodes(&shared, &stop, touched_tx.clone());
    watch_pods(&shared, &stop, touched_tx.clone());
    watch_moves(&shared, &stop, touched_tx);
    shared.pods.wait_until_ready().await;
    shared.nodes.wait_until_ready().await;
    shared.moves.wait_until_ready().await;
    if let Some(readiness) = &shared.config.readiness {
        readiness.set_ready();
    }

    let (queue, rx) = Queue::<Key>::new();
    // Everything listed at start is looked at once; intents left by an earlier run (or by a
    // step that failed) are carried on.
    for pod in shared.pods.state() {
        arm_pod(&shared, &queue, &key_of(&pod));
    }
    let mut intents: HashMap<String, (PodKey, Option<String>)> = HashMap::new();
    for cm in shared.moves.state() {
        let name = cm.metadata.name.clone().unwrap_or_default();
        if is_exclusions(&cm) {
            if !shared.config.dry_run {
                queue.add(Key::Exclusions(name));
            }
            continue;
        }
        note_intent(&shared, &name, &mut intents);
        if !shared.config.dry_run {
            queue.add(Key::Move(name));
        }
    }
    // A key is worked on by one worker at a time; one touched meanwhile is looked at again
    // once it is done (the queue's rules).
    for _ in 0..CONCURRENT_MOVES {
        tokio::spawn(work(
            shared.clone(),
            queue.clone(),
            rx.clone(),
            stop.clone(),
        ));
    }
    loop {
        let touched = tokio::select! {
            () = stop.cancelled() => return Ok(()),
            Some(touched) = touched_rx.recv() => touched,
        };
        match touched {
            Touched::Pod(key, controller) => {
                arm_pod(&shared, &queue, &key);
                if shared.config.dry_run {
                    continue;
                }
                // A move waiting for this pod to go, or for its controller's next pod.
                for (name, (pod, owner)) in &intents {
                    if *pod == key || (owner.is_some() && *owner == controller) {
                        queue.add(Key::Move(name.clone()));
                    }
                }
            }
            Touched::Exclusions(name) => {
                if !shared.config.dry_run {
                    queue.add(Key::Exclusions(name));
                }
            }
            Touched::Move(name) => {
                note_intent(&shared, &name, &mut intents);
                // An intent that is gone needs nothing: if it was due, its step finds it gone.
                if intents.contains_key(&name) && !shared.config.dry_run {
                    queue.add(Key::Move(name));
                }
            }
        }
    }
}

/// A worker: takes the due keys one at a time and comes back to each when its step says.
async fn work(shared: Arc<Shared>, queue: Queue<Key>, rx: Receiver<Key>, stop: CancellationToken) {
    while let Some((key, _)) = queue.next(&rx, &stop).await {
        let again = match &key {
            Key::Pod(pod) => {
                let (again, drive) = consider(&shared, pod).await;
                if let Some(name) = drive {
                    queue.add(Key::Move(name));
                }
                again
            }
            Key::Move(name) => carry_on(&shared, name).await,
            Key::Exclusions(name) => clean_exclusions(&shared, name).await,
        };
        let action = again.map_or(Action::Done, Action::requeue_at);
        queue.finish(key, &Ok::<_, std::convert::Infallible>(action));
    }
}

fn watch_nodes(shared: &Arc<Shared>, stop: &CancellationToken, tx: mpsc::UnboundedSender<Touched>) {
    let events = tensile_runtime::backoff::watch(
        Api::<Node>::all(shared.client.clone()),
        watcher::Config::default().labels(&shared.config.node_selector),
    );
    let (shared, stop) = (shared.clone(), stop.clone());
    tokio::spawn(async move {
        let nodes = shared.nodes.clone();
        let events = events.inspect(move |e| {
            if let Ok(e) = e {
                nodes.apply(e);
            }
        });
        let mut seen = HashSet::new();
        tensile_runtime::backoff::drain(
            Box::pin(events.touched_objects()),
            &stop,
            "nodes",
            |node: Node| {
                // A node that becomes virtual after its pods' timers fired re-arms them. Only
                // a first sighting does: status updates of known nodes change nothing here,
                // and the pods would all be decoded for each.
                let name = node.metadata.name.unwrap_or_default();
                if !seen.insert(name.clone()) {
                    return;
                }
                for pod in shared.pods.state() {
                    if pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(&name) {
                        let controller = deschedule::controller_uid(&pod).map(str::to_owned);
                        let _ = tx.send(Touched::Pod(key_of(&pod), controller));
                    }
                }
            },
        )
        .await;
    });
}

fn watch_pods(shared: &Arc<Shared>, stop: &CancellationToken, tx: mpsc::UnboundedSender<Touched>) {
    let events = tensile_runtime::backoff::watch(
        Api::<Pod>::all(shared.client.clone()),
        watcher::Config::default().fields("status.phase=Pending"),
    );
    let (shared, stop) = (shared.clone(), stop.clone());
    tokio::spawn(async move {
        tensile_runtime::backoff::drain(Box::pin(events), &stop, "pods", |event| {
            shared.pods.apply(&event);
            let (pod, gone) = match event {
                watcher::Event::Init => {
                    // A re-list: the index is rebuilt from what it lists.
                    if let Ok(mut index) = shared.by_controller.lock() {
                        *index = ByController::default();
                    }
                    return;
                }
                watcher::Event::InitDone => return,
                watcher::Event::Apply(p) | watcher::Event::InitApply(p) => (p, false),
                watcher::Event::Delete(p) => (p, true),
            };
            let key = key_of(&pod);
            let controller = deschedule::controller_uid(&pod).map(str::to_owned);
            if let Ok(mut index) = shared.by_controller.lock() {
                index.set(key.clone(), controller.clone().filter(|_| !gone));
            }
            let _ = tx.send(Touched::Pod(key, controller));
        })
        .await;
    });
}

fn watch_moves(shared: &Arc<Shared>, stop: &CancellationToken, tx: mpsc::UnboundedSender<Touched>) {
    let events = tensile_runtime::backoff::watch(
        Api::<ConfigMap>::namespaced(shared.client.clone(), &shared.config.namespace),
        // One watch for both kinds of our ConfigMaps.
        watcher::Config::default().labels(&format!("{LABEL_MOVE} in (true,{VALUE_EXCLUSIONS})")),
    );
    let (shared, stop) = (shared.clone(), stop.clone());
    tokio::spawn(async move {
        let moves = shared.moves.clone();
        let events = events.inspect(move |e| {
            if let Ok(e) = e {
                moves.apply(e);
            }
        });
        tensile_runtime::backoff::drain(
            Box::pin(events.touched_objects()),
            &stop,
            "move intents",
            |cm: ConfigMap| {
                let exclusions = is_exclusions(&cm);
                let name = cm.metadata.name.unwrap_or_default();
                let _ = tx.send(if exclusions {
                    Touched::Exclusions(name)
                } else {
                    Touched::Move(name)
                });
            },
        )
        .await;
    });
}

/// Records which pod and which controller the intent `name` waits on (forgets it when gone).
fn note_intent(
    shared: &Shared,
    name: &str,
    intents: &mut HashMap<String, (PodKey, Option<String>)>,
) {
    match shared
        .moves
        .get(&shared.config.namespace, name)
        .and_then(|cm| decode_move(&cm))
    {
        Some((m, _)) => {
            let controller = match &m.how {
                MoveHow::ThroughOwner { controller } => Some(controller.clone()),
                MoveHow::Recreate { .. } => None,
            };
            intents.insert(name.to_owned(), ((m.namespace, m.name), controller));
        }
        None => {
            intents.remove(name);
        }
    }
}

/// Whether `cm` is an exclusions record rather than a move intent.
fn is_exclusions(cm: &ConfigMap) -> bool {
    cm.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(LABEL_MOVE))
        .is_some_and(|v| v == VALUE_EXCLUSIONS)
}

/// The move an intent holds and when it was written (the API server's time).
fn decode_move(cm: &ConfigMap) -> Option<(Move, Timestamp)> {
    let m = serde_json::from_str(cm.data.as_ref()?.get(MOVE_KEY)?).ok()?;
    let since = cm
        .metadata
        .creation_timestamp
        .as_ref()
        .map_or_else(Timestamp::now, |t| t.0);
    Some((m, since))
}

/// Puts the pod on the queue for when it becomes due, from its current state (a pod that is
/// not due needs nothing: if it was to come, its look finds it not due).
fn arm_pod(shared: &Shared, queue: &Queue<Key>, key: &PodKey) {
    let due = shared
        .pods
        .get(&key.0, &key.1)
        .and_then(|pod| deschedule::due(&pod, &shared.config.policy));
    if let Some((when, _)) = due {
        queue.add_at(Key::Pod(key.clone()), instant_of(when));
    }
}

fn key_of(pod: &Pod) -> PodKey {
    (
        pod.metadata.namespace.clone().unwrap_or_default(),
        pod.metadata.name.clone().unwrap_or_default(),
    )
}

/// The monotonic instant of a wall-clock time (now when it is in the past).
fn instant_of(at: Timestamp) -> Instant {
    let ahead = at.duration_since(Timestamp::now());
    let now = Instant::now();
    Duration::try_from(ahead)
        .ok()
        .and_then(|d| now.checked_add(d))
        .unwrap_or(now)
}

fn reference(pod: &Pod) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        namespace: pod.metadata.namespace.clone(),
        name: pod.metadata.name.clone(),
        uid: pod.metadata.uid.clone(),
        ..ObjectReference::default()
    }
}

/// The moved pod, for events once it may be gone.
fn moved_pod(m: &Move) -> Pod {
    let mut pod = Pod::default();
    pod.metadata.namespace = Some(m.namespace.clone());
    pod.metadata.name = Some(m.name.clone());
    pod.metadata.uid = Some(m.uid.clone());
    pod
}

impl Shared {
    fn event(&self, pod: &Pod, warning: bool, reason: &str, note: String) {
        if !self.config.dry_run {
            self.events.publish(PodEvent {
                regarding: reference(pod),
                warning,
                reason: reason.to_owned(),
                note,
            });
        }
    }

    /// Tells the pod once why it stays.
    /// Whether this was the first time for the pod.
    fn tell_once(&self, pod: &Pod, reason: &str, note: String) -> bool {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let first = self.told.lock().is_ok_and(|mut t| {
            // Bounded: forgetting only means telling a pod a second time.
            if t.len() > 100_000 {
                t.clear();
            }
            t.insert(uid)
        });
        if first {
            tracing::info!(pod = ?key_of(pod), reason, note, "not moved");
            self.event(pod, true, reason, note);
        }
        first
    }

    /// A free move for `node` now, or when one will be.
    fn take_move(&self, node: &str) -> Result<(), Instant> {
        let Ok(mut limits) = self.limits.lock() else {
            return Ok(());
        };
        let now = Instant::now();
        let max = self.config.max_per_node_per_minute as usize;
        if max > 0 {
            let recent = limits.per_node.entry(node.to_owned()).or_default();
            recent.retain(|t| now.duration_since(*t) < Duration::from_secs(60));
            if recent.len() >= max {
                return Err(recent[0] + Duration::from_secs(60));
            }
        }
        limits.global.try_acquire(now)?;
        if max > 0 {
            limits
                .per_node
                .entry(node.to_owned())
                .or_default()
                .push(now);
        }
        Ok(())
    }

    /// Every move intent with when it was written.
    fn intents(&self) -> Vec<(Move, Timestamp)> {
        self.moves
            .state()
            .iter()
            .filter(|cm| !is_exclusions(cm))
            .filter_map(decode_move)
            .collect()
    }

    fn intent_api(&self) -> Api<ConfigMap> {
        Api::namespaced(self.client.clone(), &self.config.namespace)
    }
}

/// Looks at a pod whose timer fired; if it is still due, writes its move down. Returns when to
/// look again, and the intent to carry on.
async fn consider(shared: &Shared, key: &PodKey) -> (Option<Instant>, Option<String>) {
    let Some(pod) = shared.pods.get(&key.0, &key.1) else {
        return (None, None);
    };
    let Some((when, trigger)) = deschedule::due(&pod, &shared.config.policy) else {
        return (None, None);
    };
    if instant_of(when) > Instant::now() {
        return (Some(instant_of(when)), None);
    }
    let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) else {
        return (None, None);
    };
    if !shared.nodes.contains("", &node) {
        return (None, None);
    }
    let handling = match deschedule::handling(&pod, &shared.config.policy) {
        Ok(h) => h,
        Err(keep) => {
            shared.tell_once(
                &pod,
                "NotDescheduled",
                format!("{trigger} on virtual node {node}, but the descheduler leaves it: {keep}"),
            );
            return (None, None);
        }
    };
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let name = deschedule::move_name(&uid);
    if shared.moves.contains(&shared.config.namespace, &name) {
        // Already on its way: the intent carries it on.
        return (None, None);
    }
    // A controller's replacement that has not been handed its count yet is owed it.
    let intents = match handling {
        Handling::ThroughOwner(_) => shared.intents(),
        Handling::Recreate => Vec::new(),
    };
    let attempts = deschedule::attempts_owed(&pod, &intents);
    if attempts >= shared.config.policy.max_attempts {
        // Counted once per pod, as the event is told once.
        if shared.tell_once(
            &pod,
            "DeschedulingGaveUp",
            format!(
                "{trigger} on virtual node {node}; moved {attempts} times already, the descheduler gives up"
            ),
        ) {
            shared.config.metrics.gave_up();
        }
        return (None, None);
    }
    if let Err(at) = shared.take_move(&node) {
        return (Some(at), None);
    }
    if shared.config.dry_run {
        tracing::info!(pod = ?key, node, %trigger, ?handling, "dry run: would move");
        return (None, None);
    }
    let Some(m) = deschedule::plan_move(&pod, &node, &handling, attempts, &trigger.to_string())
    else {
        return (None, None);
    };
    match write_intent(shared, &name, &m).await {
        Ok(()) => {
            shared
                .config
                .metrics
                .moved(matches!(handling, Handling::ThroughOwner(_)));
            (None, Some(name))
        }
        Err(e) => {
            tracing::warn!(error = %e, "move not started; retried");
            (Some(Instant::now() + RETRY), None)
        }
    }
}

/// Writes the intent of a move (done when it exists already: same pod, same move).
async fn write_intent(shared: &Shared, name: &str, m: &Move) -> Result<(), MoveError> {
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

/// Takes the move of intent `name` one step further. Returns when to look again (`None`: when
/// something changes, or never once it is complete).
async fn carry_on(shared: &Shared, name: &str) -> Option<Instant> {
    if shared.config.dry_run {
        return None;
    }
    let cm = shared.moves.get(&shared.config.namespace, name)?;
    let Some((m, since)) = decode_move(&cm) else {
        tracing::warn!(
            intent = name,
            "move intent without a move; left for inspection"
        );
        return None;
    };
    let current = shared.pods.get(&m.namespace, &m.name);
    let candidates: Vec<Pod> = match &m.how {
        MoveHow::ThroughOwner { controller } => {
            let keys: Vec<PodKey> = shared
                .by_controller
                .lock()
                .map(|i| {
                    i.pods
                        .get(controller)
                        .into_iter()
                        .flatten()
                        .cloned()
                        .collect()
                })
                .unwrap_or_default();
            keys.iter()
                .filter_map(|(ns, n)| shared.pods.get(ns, n))
                .collect()
        }
        MoveHow::Recreate { .. } => Vec::new(),
    };
    let step = deschedule::move_step(&m, since, current.as_ref(), &candidates, Timestamp::now());
    let result = match &step {
        MoveStep::Delete => delete_moved(shared, &m).await.map(|()| Some(RETRY)),
        MoveStep::WaitGone => Ok(Some(RETRY)),
        MoveStep::Create => create_replacement(shared, &m).await,
        MoveStep::Hand { name: pod } => match candidates
            .iter()
            .find(|p| p.metadata.name.as_deref() == Some(pod.as_str()))
        {
            Some(p) => hand_over(shared, &m, p).await,
            None => Ok(Some(RECHECK)),
        },
        MoveStep::WaitReplacement(until) => {
            return Some(instant_of(*until));
        }
        MoveStep::Forget => Ok(None),
    };
    match result {
        // Complete: the intent goes.
        Ok(None) => {
            let uid = cm.metadata.uid.clone();
            match delete_exact(&shared.intent_api(), name, uid, None).await {
                Ok(()) => None,
                Err(e) => {
                    tracing::warn!(error = %e, intent = name, "cannot remove a complete move intent");
                    Some(Instant::now() + RETRY)
                }
            }
        }
        Ok(Some(after)) => Some(Instant::now() + after),
        Err(e) => {
            tracing::warn!(error = %e, ?step, "move step failed; retried");
            shared.event(
                &moved_pod(&m),
                true,
                EVENT_DESCHEDULING_FAILED,
                format!("{e}; tried again in {RETRY:?}"),
            );
            Some(Instant::now() + RETRY)
        }
    }
}

/// Records that the moved pod's controller stays off the node, marks the pod with the node it
/// failed on (the original's annotation), then deletes it, both only while it is the pod with
/// the move's UID.
async fn delete_moved(shared: &Shared, m: &Move) -> Result<(), MoveError> {
    if let MoveHow::ThroughOwner { controller } = &m.how {
        record_exclusion(shared, controller, &m.node).await?;
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
        .map_err(api_error("deleting", m))?;
    if let MoveHow::ThroughOwner { .. } = m.how {
        tracing::info!(pod = ?(&m.namespace, &m.name), node = m.node, why = m.why, "moved through its controller");
        shared.event(
            &moved_pod(m),
            false,
            EVENT_RESCHEDULED,
            format!(
                "{} on virtual node {}: deleted so that its controller re-creates it on another node",
                m.why, m.node
            ),
        );
    }
    Ok(())
}

/// Writes into the controller's exclusions record that it stays off `node` for the window
/// (a merge patch of one key, so no read is needed; created when missing).
async fn record_exclusion(shared: &Shared, controller: &str, node: &str) -> Result<(), MoveError> {
    let name = deschedule::exclusions_name(controller);
    let recorded = shared
        .moves
        .get(&shared.config.namespace, &name)
        .and_then(|cm| cm.data?.get(node).cloned());
    let window = SignedDuration::try_from(shared.config.exclusion_window)
        .unwrap_or(SignedDuration::from_secs(180));
    let until = deschedule::exclusion_until(recorded.as_deref(), Timestamp::now(), window);
    let record = json!({"metadata": {"name": name, "labels": {LABEL_MOVE: VALUE_EXCLUSIONS}},
        "data": {node: until.to_string()}});
    let fail = |source| MoveError::Exclusion {
        controller: controller.to_owned(),
        node: node.to_owned(),
        record: name.clone(),
        source,
    };
    let api = shared.intent_api();
    for _ in 0..2 {
        match api
            .patch(&name, &PatchParams::default(), &Patch::Merge(&record))
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

/// Drops the lapsed nodes of an exclusions record, or the record once all have lapsed
/// (preconditions: the record read). Returns when to look again.
async fn clean_exclusions(shared: &Shared, name: &str) -> Option<Instant> {
    if shared.config.dry_run {
        return None;
    }
    let cm = shared.moves.get(&shared.config.namespace, name)?;
    let record = cm.data.clone().unwrap_or_default();
    let now = Timestamp::now();
    let api = shared.intent_api();
    let result = match deschedule::exclusions_cleanup(&record, now) {
        ExclusionsCleanup::Keep(at) => return Some(instant_of(at)),
        ExclusionsCleanup::Delete => {
            // Only the version read: a node recorded meanwhile keeps the record.
            let params = kube::api::DeleteParams {
                preconditions: Some(kube::api::Preconditions {
                    uid: cm.metadata.uid.clone(),
                    resource_version: cm.metadata.resource_version.clone(),
                }),
                ..kube::api::DeleteParams::default()
            };
            api.delete(name, &params).await.map(|_| None)
        }
        ExclusionsCleanup::Drop(lapsed, at) => {
            let data: serde_json::Map<String, serde_json::Value> = lapsed
                .into_iter()
                .map(|n| (n, serde_json::Value::Null))
                .collect();
            let patch = json!({"metadata": {"resourceVersion": cm.metadata.resource_version},
                "data": data});
            api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map(|_| Some(instant_of(at)))
        }
    };
    match result {
        Ok(next) => next,
        // Changed or gone meanwhile: its watch event looks again.
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => None,
        Err(e) => {
            tracing::warn!(error = %e, record = name, "cannot clean up an exclusions record; retried");
            Some(Instant::now() + RETRY)
        }
    }
}

/// Creates the replacement of a re-created pod once the moved pod is gone. `None` when done.
async fn create_replacement(shared: &Shared, m: &Move) -> Result<Option<Duration>, MoveError> {
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
            shared.event(
                &created,
                false,
                EVENT_RESCHEDULED,
                format!(
                    "{} on virtual node {}: re-created to be placed on another node",
                    m.why, m.node
                ),
            );
            Ok(None)
        }
        Err(e) if already_exists(&e) => Ok(None),
        Err(e) => Err(api_error("creating the replacement of", m)(e)),
    }
}

/// Hands the move's count over to the controller's new pod. `None` when done.
async fn hand_over(shared: &Shared, m: &Move, pod: &Pod) -> Result<Option<Duration>, MoveError> {
    let (ns, name) = key_of(pod);
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
