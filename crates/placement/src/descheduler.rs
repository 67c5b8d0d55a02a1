//! `tensile descheduler`: moves pods that their virtual node's lower cluster cannot place.
//!
//! Event driven: one watch of Pending upper pods and one of virtual nodes. Each pod event
//! computes when the pod becomes due (`tensile_core::deschedule::due`: Unschedulable in the
//! lower cluster for the threshold, or the original's age rule) and arms a timer for that
//! moment; when it fires the pod is checked again from the cache and, if still due, moved:
//! - a controller's pod is marked `unschedulable-node=<node>` (the webhook records it
//!   synchronously, so the replacement avoids the node) and deleted with a UID precondition;
//!   its controller creates the replacement. Nothing is created twice and nothing is lost.
//! - a bare pod that opted in is re-created under its name. The replacement is first written
//!   to a ConfigMap (the intent), then the old pod is deleted, then the replacement created,
//!   then the intent removed; on start every intent left by a crash is completed. So the pod
//!   survives a crash at any step.
//!
//! Moves are rate limited (a global token bucket and a per-node limit per minute), a pod moved
//! `max_attempts` times is left alone with a Warning event, and `dry_run` writes nothing.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::TryStreamExt as _;
use k8s_openapi::api::core::v1::{ConfigMap, Node, ObjectReference, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::WatchStreamExt as _;
use kube::runtime::watcher;
use serde_json::json;
use tensile_core::deschedule::{self, Handling, Policy, Trigger};
use tensile_core::keys::{
    ANNOTATION_UNSCHEDULABLE_NODE, EVENT_RESCHEDULED, LABEL_NODE_TYPE, VALUE_NODE_TYPE_VIRTUAL,
};
use tensile_node::cache::CompactCache;
use tensile_node::clients::{TokenBucket, already_exists, delete_exact};
use tensile_node::events::{EventSink, PodEvent};
use tokio::sync::{Semaphore, mpsc};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Label of the ConfigMaps holding a re-creation in progress.
pub const LABEL_RECREATE: &str = "tensile-kube.io/recreate";
/// Key of the replacement pod's JSON in such a ConfigMap.
const INTENT_KEY: &str = "pod.json";
/// Moves in flight at once.
const CONCURRENT_MOVES: usize = 8;
/// How long a re-creation waits for the old pod to be gone.
const GONE_DEADLINE: Duration = Duration::from_secs(120);

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
    /// Namespace of the re-creation intents (the descheduler's own).
    pub namespace: String,
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
    /// The old pod did not go away in time; the intent stays and is completed later.
    #[error("pod {namespace}/{name} was not gone after {GONE_DEADLINE:?}")]
    NotGone {
        /// Pod namespace.
        namespace: String,
        /// Pod name.
        name: String,
    },
    /// An intent could not be encoded or decoded.
    #[error("re-creation intent {0}: {1}")]
    Intent(String, String),
}

type Key = (String, String);

struct Limits {
    global: TokenBucket,
    per_node: HashMap<String, Vec<Instant>>,
}

struct Shared {
    config: DeschedulerConfig,
    client: kube::Client,
    pods: CompactCache<Pod>,
    nodes: CompactCache<Node>,
    events: EventSink,
    limits: Mutex<Limits>,
    /// Pods told once why they are left alone (by UID), so a stuck pod is not an event storm.
    told: Mutex<HashSet<String>>,
    /// Bumped on every pod event, for waiters.
    changed: tokio::sync::watch::Sender<u64>,
}

/// Runs the descheduler until `stop`.
pub async fn run(
    config: DeschedulerConfig,
    client: kube::Client,
    stop: CancellationToken,
) -> Result<(), MoveError> {
    let pods: CompactCache<Pod> = CompactCache::new();
    let nodes: CompactCache<Node> = CompactCache::new();
    let (changed, _) = tokio::sync::watch::channel(0u64);
    let shared = Arc::new(Shared {
        events: EventSink::start(client.clone(), "tensile-descheduler", "tensile-descheduler"),
        limits: Mutex::new(Limits {
            global: TokenBucket::new(config.moves_per_second, config.burst, Instant::now()),
            per_node: HashMap::new(),
        }),
        told: Mutex::default(),
        config,
        client: client.clone(),
        pods: pods.clone(),
        nodes: nodes.clone(),
        changed,
    });

    let node_events = tensile_node::backoff::watch(
        Api::<Node>::all(client.clone()),
        watcher::Config::default().labels(&shared.config.node_selector),
    );
    let (touched_tx, mut touched_rx) = mpsc::unbounded_channel::<Key>();
    {
        let (nodes, stop, tx, pods) = (
            nodes.clone(),
            stop.clone(),
            touched_tx.clone(),
            pods.clone(),
        );
        tokio::spawn(async move {
            let events = node_events
                .inspect_ok(move |e| nodes.apply(e))
                .touched_objects();
            let mut seen = HashSet::new();
            tensile_node::backoff::drain(Box::pin(events), &stop, "nodes", |node: Node| {
                // A node that becomes virtual after its pods' timers fired re-arms them. Only
                // a first sighting does: status updates of known nodes change nothing here,
                // and the pods would all be decoded for each.
                let name = node.metadata.name.unwrap_or_default();
                if !seen.insert(name.clone()) {
                    return;
                }
                for pod in pods.state() {
                    if pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(&name) {
                        let _ = tx.send(key_of(&pod));
                    }
                }
            })
            .await;
        });
    }
    let pod_events = tensile_node::backoff::watch(
        Api::<Pod>::all(client.clone()),
        watcher::Config::default().fields("status.phase=Pending"),
    );
    {
        let (pods, stop, shared) = (pods.clone(), stop.clone(), shared.clone());
        tokio::spawn(async move {
            let events = pod_events
                .inspect_ok(move |e| pods.apply(e))
                .touched_objects();
            tensile_node::backoff::drain(Box::pin(events), &stop, "pods", |pod: Pod| {
                shared.changed.send_modify(|n| *n = n.wrapping_add(1));
                let _ = touched_tx.send(key_of(&pod));
            })
            .await;
        });
    }
    pods.wait_until_ready().await;
    nodes.wait_until_ready().await;
    if !shared.config.dry_run {
        complete_intents(&shared).await;
    }
    // Everything listed at start is looked at once.
    let mut timers: BTreeMap<(Instant, Key), ()> = BTreeMap::new();
    let mut armed: HashMap<Key, Instant> = HashMap::new();
    for pod in pods.state() {
        arm(&shared, &key_of(&pod), &mut timers, &mut armed);
    }
    let moves = Arc::new(Semaphore::new(CONCURRENT_MOVES));
    let mut in_flight: HashSet<Key> = HashSet::new();
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<(Key, Option<Instant>)>();
    loop {
        let next = timers.keys().next().map(|(at, _)| *at);
        let sleep = async {
            match next {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = stop.cancelled() => return Ok(()),
            Some(key) = touched_rx.recv() => arm(&shared, &key, &mut timers, &mut armed),
            Some((key, retry)) = done_rx.recv() => {
                in_flight.remove(&key);
                if let Some(at) = retry {
                    set_timer(&key, at, &mut timers, &mut armed);
                }
            }
            () = sleep => {
                let now = Instant::now();
                let due: Vec<Key> = timers
                    .range(..=(now, (String::new(), String::new())))
                    .map(|((_, k), ())| k.clone())
                    .collect();
                for key in due {
                    if let Some(at) = armed.remove(&key) {
                        timers.remove(&(at, key.clone()));
                    }
                    if !in_flight.insert(key.clone()) {
                        continue;
                    }
                    let (shared, moves, done) = (shared.clone(), moves.clone(), done_tx.clone());
                    tokio::spawn(async move {
                        let _permit = moves.acquire().await;
                        let retry = consider(&shared, &key).await;
                        let _ = done.send((key, retry));
                    });
                }
            }
        }
    }
}

fn key_of(pod: &Pod) -> Key {
    (
        pod.metadata.namespace.clone().unwrap_or_default(),
        pod.metadata.name.clone().unwrap_or_default(),
    )
}

fn set_timer(
    key: &Key,
    at: Instant,
    timers: &mut BTreeMap<(Instant, Key), ()>,
    armed: &mut HashMap<Key, Instant>,
) {
    if let Some(old) = armed.insert(key.clone(), at) {
        timers.remove(&(old, key.clone()));
    }
    timers.insert((at, key.clone()), ());
}

/// Arms (or disarms) the pod's timer from its current state.
fn arm(
    shared: &Shared,
    key: &Key,
    timers: &mut BTreeMap<(Instant, Key), ()>,
    armed: &mut HashMap<Key, Instant>,
) {
    let due = shared
        .pods
        .get(&key.0, &key.1)
        .and_then(|pod| deschedule::due(&pod, &shared.config.policy));
    match due {
        Some((when, _)) => set_timer(key, instant_of(when), timers, armed),
        None => {
            if let Some(old) = armed.remove(key) {
                timers.remove(&(old, key.clone()));
            }
        }
    }
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
    fn tell_once(&self, pod: &Pod, reason: &str, note: String) {
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
}

/// Looks at a pod whose timer fired; moves it if it is still due. Returns when to look again.
async fn consider(shared: &Shared, key: &Key) -> Option<Instant> {
    let pod = shared.pods.get(&key.0, &key.1)?;
    let (when, trigger) = deschedule::due(&pod, &shared.config.policy)?;
    if instant_of(when) > Instant::now() {
        return Some(instant_of(when));
    }
    let node = pod.spec.as_ref()?.node_name.clone()?;
    if !shared.nodes.contains("", &node) {
        return None;
    }
    let handling = match deschedule::handling(&pod, &shared.config.policy) {
        Ok(h) => h,
        Err(keep) => {
            shared.tell_once(
                &pod,
                "NotDescheduled",
                format!("{trigger} on virtual node {node}, but the descheduler leaves it: {keep}"),
            );
            return None;
        }
    };
    let attempts = deschedule::attempts(&pod);
    if attempts >= shared.config.policy.max_attempts {
        shared.tell_once(
            &pod,
            "DeschedulingGaveUp",
            format!(
                "{trigger} on virtual node {node}; moved {attempts} times already, the descheduler gives up"
            ),
        );
        return None;
    }
    if let Err(at) = shared.take_move(&node) {
        return Some(at);
    }
    if shared.config.dry_run {
        tracing::info!(pod = ?key, node, %trigger, ?handling, "dry run: would move");
        return None;
    }
    let result = match handling {
        Handling::ThroughOwner(_) => through_owner(shared, &pod, &node, &trigger).await,
        Handling::Recreate => recreate(shared, &pod, &node, &trigger).await,
    };
    match result {
        Ok(()) => None,
        Err(e) => {
            tracing::warn!(error = %e, "move failed; retried");
            Some(Instant::now() + Duration::from_secs(5))
        }
    }
}

fn api_error<'a>(action: &'static str, pod: &'a Pod) -> impl FnOnce(kube::Error) -> MoveError + 'a {
    move |source| MoveError::Api {
        action,
        namespace: pod.metadata.namespace.clone().unwrap_or_default(),
        name: pod.metadata.name.clone().unwrap_or_default(),
        source,
    }
}

/// Marks the pod with the node it failed on: the webhook records it for the pod's owner.
async fn mark(shared: &Shared, pod: &Pod, node: &str) -> Result<(), MoveError> {
    let (ns, name) = key_of(pod);
    let api: Api<Pod> = Api::namespaced(shared.client.clone(), &ns);
    let patch = json!({"metadata": {"uid": pod.metadata.uid,
        "annotations": {ANNOTATION_UNSCHEDULABLE_NODE: node}}});
    match api
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        r => r.map(drop).map_err(api_error("marking", pod)),
    }
}

async fn through_owner(
    shared: &Shared,
    pod: &Pod,
    node: &str,
    trigger: &Trigger,
) -> Result<(), MoveError> {
    let (ns, name) = key_of(pod);
    mark(shared, pod, node).await?;
    let api: Api<Pod> = Api::namespaced(shared.client.clone(), &ns);
    delete_exact(&api, &name, pod.metadata.uid.clone(), None)
        .await
        .map_err(api_error("deleting", pod))?;
    tracing::info!(pod = ?(&ns, &name), node, %trigger, "moved through its controller");
    shared.event(
        pod,
        false,
        EVENT_RESCHEDULED,
        format!(
            "{trigger} on virtual node {node}: deleted so that its controller re-creates it on another node"
        ),
    );
    Ok(())
}

fn intent_name(pod: &Pod) -> String {
    format!(
        "tensile-recreate-{}",
        pod.metadata.uid.as_deref().unwrap_or("unknown")
    )
}

async fn recreate(
    shared: &Shared,
    pod: &Pod,
    node: &str,
    trigger: &Trigger,
) -> Result<(), MoveError> {
    let (ns, name) = key_of(pod);
    let replacement = deschedule::replacement(pod, node);
    let intents: Api<ConfigMap> = Api::namespaced(shared.client.clone(), &shared.config.namespace);
    let intent_name = intent_name(pod);
    let body = serde_json::to_string(&replacement)
        .map_err(|e| MoveError::Intent(intent_name.clone(), e.to_string()))?;
    let intent: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": intent_name, "labels": {LABEL_RECREATE: "true"}},
        "data": {INTENT_KEY: body}
    }))
    .map_err(|e| MoveError::Intent(intent_name.clone(), e.to_string()))?;
    match intents.create(&PostParams::default(), &intent).await {
        Err(e) if !already_exists(&e) => {
            return Err(api_error("recording the re-creation of", pod)(e));
        }
        _ => {}
    }
    mark(shared, pod, node).await?;
    let api: Api<Pod> = Api::namespaced(shared.client.clone(), &ns);
    delete_exact(&api, &name, pod.metadata.uid.clone(), None)
        .await
        .map_err(api_error("deleting", pod))?;
    wait_gone(shared, pod).await?;
    create_replacement(shared, &replacement).await?;
    let _ = intents.delete(&intent_name, &Default::default()).await;
    tracing::info!(pod = ?(&ns, &name), node, %trigger, "re-created");
    shared.event(
        &replacement,
        false,
        EVENT_RESCHEDULED,
        format!("{trigger} on virtual node {node}: re-created to be placed on another node"),
    );
    Ok(())
}

/// Waits, on the watch, until the pod with this UID is gone.
async fn wait_gone(shared: &Shared, pod: &Pod) -> Result<(), MoveError> {
    let (ns, name) = key_of(pod);
    let mut changed = shared.changed.subscribe();
    let deadline = tokio::time::Instant::now() + GONE_DEADLINE;
    loop {
        let current = shared.pods.get(&ns, &name);
        if current.is_none_or(|p| p.metadata.uid != pod.metadata.uid) {
            // The Pending-only watch drops a pod that stops being Pending too: ask once.
            let api: Api<Pod> = Api::namespaced(shared.client.clone(), &ns);
            match api.get_opt(&name).await {
                Ok(None) => return Ok(()),
                Ok(Some(p)) if p.metadata.uid != pod.metadata.uid => return Ok(()),
                _ => {}
            }
        }
        if tokio::time::timeout_at(deadline, changed.changed())
            .await
            .is_err()
        {
            return Err(MoveError::NotGone {
                namespace: ns,
                name,
            });
        }
    }
}

async fn create_replacement(shared: &Shared, replacement: &Pod) -> Result<(), MoveError> {
    let (ns, _) = key_of(replacement);
    let api: Api<Pod> = Api::namespaced(shared.client.clone(), &ns);
    match api.create(&PostParams::default(), replacement).await {
        Ok(_) => Ok(()),
        // Someone (a restarted descheduler, the user) created it already: it is not lost.
        Err(e) if already_exists(&e) => Ok(()),
        Err(e) => Err(api_error("creating the replacement", replacement)(e)),
    }
}

/// Completes the re-creations a previous run left half done.
async fn complete_intents(shared: &Shared) {
    let intents: Api<ConfigMap> = Api::namespaced(shared.client.clone(), &shared.config.namespace);
    // Once at start: intents exist only between a delete and a create.
    let list = match intents
        .list(&ListParams::default().labels(&format!("{LABEL_RECREATE}=true")))
        .await
    {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read re-creation intents");
            return;
        }
    };
    for cm in list.items {
        let name = cm.metadata.name.clone().unwrap_or_default();
        let Some(pod) = cm
            .data
            .as_ref()
            .and_then(|d| d.get(INTENT_KEY))
            .and_then(|j| serde_json::from_str::<Pod>(j).ok())
        else {
            tracing::warn!(
                intent = name,
                "re-creation intent without a pod; left for inspection"
            );
            continue;
        };
        let (ns, pod_name) = key_of(&pod);
        let api: Api<Pod> = Api::namespaced(shared.client.clone(), &ns);
        let exists = match api.get_opt(&pod_name).await {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(error = %e, intent = name, "cannot check the pod of an intent");
                continue;
            }
        };
        // The old pod still there (its deletion had not happened): nothing was lost; the
        // intent is dropped and the pod is considered afresh.
        let done = match exists {
            Some(_) => Ok(()),
            None => create_replacement(shared, &pod).await,
        };
        match done {
            Ok(()) => {
                tracing::info!(intent = name, pod = ?(&ns, &pod_name), "re-creation completed");
                let _ = intents.delete(&name, &Default::default()).await;
            }
            Err(e) => tracing::warn!(error = %e, intent = name, "re-creation not completed"),
        }
    }
}
