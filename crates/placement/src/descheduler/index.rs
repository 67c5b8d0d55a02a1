//! The descheduler's state as an index: it applies the watch events of Pending upper pods,
//! virtual nodes and our ConfigMaps (move intents and exclusion records), says which keys to
//! look at and when, and decides what to do for a key as [`Effect`] values. It makes no calls:
//! the writer (`super`) executes the effects and tells it what failed. So every rule of the
//! loop (when a pod is due, what is never moved, the rate limits, a move already in flight,
//! each step of a move) is tested here by applying events and reading effects.
//!
//! Time is a value too ([`Now`]): the wall clock the API server's times are on (conditions,
//! intents, exclusion records), and the monotonic one of the rate limits.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::runtime::watcher;
use tensile_core::deschedule::{self, ExclusionsCleanup, Handling, Move, MoveHow, MoveStep};
use tensile_core::keys::EVENT_RESCHEDULED;
use tensile_runtime::cache::CompactCache;
use tensile_runtime::clients::TokenBucket;
use tensile_runtime::marks::Expected;
use tokio::time::Instant;

use super::{DeschedulerConfig, LABEL_MOVE, MOVE_KEY, VALUE_EXCLUSIONS};

/// When a step that must wait for the moved pod to go looks again (and a failed one is retried).
pub(super) const RETRY: Duration = Duration::from_secs(5);
/// When a step that lost a race (a conflict, a pod still leaving) looks again.
pub(super) const RECHECK: Duration = Duration::from_secs(1);
/// How long an intent written is taken as there before its watch shows it.
const INTENT_SHOWN_WITHIN: Duration = Duration::from_secs(30);
/// Pods remembered as told why they stay; beyond, the memory starts again (a pod may be told
/// twice, never an event storm).
const TOLD_MAX: usize = 100_000;

/// Namespace and name of a pod.
pub(super) use tensile_runtime::cache::Key as PodKey;

/// What a key of the work queue is: a pod that may become due, a move intent to carry on, or an
/// exclusions record to clean up.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) enum Key {
    Pod(PodKey),
    Move(String),
    Exclusions(String),
}

/// A moment on both clocks.
#[derive(Clone, Copy, Debug)]
pub(super) struct Now {
    /// The wall clock: the API server's times (conditions, intents, records) are on it.
    pub wall: Timestamp,
    /// The monotonic clock of the rate limits.
    pub mono: Instant,
}

impl Now {
    pub fn current() -> Self {
        Self {
            wall: Timestamp::now(),
            mono: Instant::now(),
        }
    }

    /// How long from now until `at` (nothing when it is past).
    fn until(&self, at: Timestamp) -> Duration {
        Duration::try_from(at.duration_since(self.wall)).unwrap_or(Duration::ZERO)
    }
}

/// An event about a pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Event {
    /// Namespace, name and UID of the pod.
    pub pod: (String, String, String),
    pub warning: bool,
    pub reason: &'static str,
    pub note: String,
}

/// A move intent, by name, and the UID of its ConfigMap (its removal's precondition).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Intent {
    pub name: String,
    pub uid: Option<String>,
}

/// That a controller stays off a node until a time, in its exclusions record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Exclusion {
    pub controller: String,
    pub node: String,
    pub record: String,
    pub until: Timestamp,
}

/// What to do for a key.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Effect {
    /// Look at the key again after this long (sooner if it is touched meanwhile).
    Requeue(Duration),
    /// Tell a pod something.
    Event(Event),
    /// A pod is left alone for good (counted).
    GaveUp,
    /// Write the intent of a move; once written, carry it on (its key).
    StartMove { intent: String, m: Move },
    /// Evict the moved pod: record the exclusion (a controller's pod), mark the pod with its
    /// node and delete it (UID preconditions); then the event, if any.
    Evict {
        intent: Intent,
        m: Move,
        exclusion: Option<Exclusion>,
        event: Option<Event>,
    },
    /// Create the replacement of a re-created pod once a read confirms the moved pod is gone,
    /// then remove the intent; the note is the replacement's `Rescheduled` event.
    Recreate {
        intent: Intent,
        m: Move,
        note: String,
    },
    /// Hand the move's count over to the controller's new pod, then remove the intent.
    HandOver {
        intent: Intent,
        m: Move,
        pod: Box<Pod>,
    },
    /// The move is complete (or nothing is left to do): remove the intent.
    Complete(Intent),
    /// Every node of an exclusions record lapsed: remove it, only as it was read.
    RemoveRecord {
        name: String,
        uid: Option<String>,
        resource_version: Option<String>,
    },
    /// Drop the lapsed nodes of a record (as read); look again after `next`.
    DropLapsed {
        name: String,
        resource_version: Option<String>,
        nodes: Vec<String>,
        next: Duration,
    },
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

struct Limits {
    global: TokenBucket,
    per_node: HashMap<String, Vec<Instant>>,
}

/// The descheduler's state.
pub(super) struct Index {
    config: DeschedulerConfig,
    pods: CompactCache<Pod>,
    nodes: CompactCache<Node>,
    moves: CompactCache<ConfigMap>,
    by_controller: ByController,
    /// Intents by name: the pod each waits on, and its controller.
    intents: HashMap<String, (PodKey, Option<String>)>,
    /// Virtual nodes seen at least once.
    seen_nodes: HashSet<String>,
    /// Intents written whose watch event has not come yet, by name (version: the pod's UID).
    started: Expected<String>,
    limits: Limits,
    /// Pods told once why they are left alone (by UID), so a stuck pod is not an event storm.
    told: HashSet<String>,
}

impl Index {
    pub fn new(config: DeschedulerConfig, now: Instant) -> Self {
        Self {
            limits: Limits {
                global: TokenBucket::new(config.moves_per_second, config.burst, now),
                per_node: HashMap::new(),
            },
            config,
            pods: CompactCache::new(),
            nodes: CompactCache::new(),
            moves: CompactCache::new(),
            by_controller: ByController::default(),
            intents: HashMap::new(),
            seen_nodes: HashSet::new(),
            started: Expected::new(INTENT_SHOWN_WITHIN),
            told: HashSet::new(),
        }
    }

    /// The three caches, to wait until they have listed.
    pub fn caches(
        &self,
    ) -> (
        CompactCache<Pod>,
        CompactCache<Node>,
        CompactCache<ConfigMap>,
    ) {
        (self.pods.clone(), self.nodes.clone(), self.moves.clone())
    }

    /// Applies an event of the Pending upper pods; the keys to look at, and after how long.
    pub fn apply_pod(&mut self, event: &watcher::Event<Pod>, now: Now) -> Vec<(Key, Duration)> {
        match event {
            watcher::Event::Init => {
                // A re-list: the controllers' pods are rebuilt from what it lists.
                self.by_controller = ByController::default();
                self.pods.apply(event);
                Vec::new()
            }
            watcher::Event::InitApply(p) => {
                self.by_controller
                    .set(key_of(p), deschedule::controller_uid(p).map(str::to_owned));
                self.pods.apply(event);
                Vec::new()
            }
            watcher::Event::InitDone => {
                // What the list shows (and what it dropped) is looked at once it is the cache.
                let keys = self.pods.apply_keys(event);
                let mut wakes = Vec::new();
                for key in keys {
                    let controller = self.by_controller.controller_of.get(&key).cloned();
                    wakes.extend(self.touch_pod(key, controller.as_deref(), now));
                }
                wakes
            }
            watcher::Event::Apply(p) | watcher::Event::Delete(p) => {
                let gone = matches!(event, watcher::Event::Delete(_));
                let key = key_of(p);
                let controller = deschedule::controller_uid(p);
                self.by_controller
                    .set(key.clone(), controller.filter(|_| !gone).map(str::to_owned));
                self.pods.apply(event);
                self.touch_pod(key, controller, now)
            }
        }
    }

    /// The pod `key` changed: it is looked at when it becomes due, and a move waiting for it
    /// (or for its controller's next pod) at once.
    fn touch_pod(&self, key: PodKey, controller: Option<&str>, now: Now) -> Vec<(Key, Duration)> {
        let mut wakes = Vec::new();
        if let Some((when, _)) = self
            .pods
            .get(&key.namespace, &key.name)
            .and_then(|pod| deschedule::due(&pod, &self.config.policy))
        {
            wakes.push((Key::Pod(key.clone()), now.until(when)));
        }
        if !self.config.dry_run {
            for (name, (pod, owner)) in &self.intents {
                if *pod == key || (owner.is_some() && owner.as_deref() == controller) {
                    wakes.push((Key::Move(name.clone()), Duration::ZERO));
                }
            }
        }
        wakes
    }

    /// Applies an event of the virtual nodes: a node seen for the first time brings its pods
    /// back (their time may have come while it was not virtual). Status updates of known nodes
    /// change nothing here, and would decode every pod each.
    pub fn apply_node(&mut self, event: &watcher::Event<Node>, now: Now) -> Vec<(Key, Duration)> {
        self.nodes.apply(event);
        let (watcher::Event::Apply(node) | watcher::Event::InitApply(node)) = event else {
            return Vec::new();
        };
        let name = node.metadata.name.clone().unwrap_or_default();
        if !self.seen_nodes.insert(name.clone()) {
            return Vec::new();
        }
        let mut wakes = Vec::new();
        for pod in self.pods.state() {
            if pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(&name) {
                let controller = deschedule::controller_uid(&pod).map(str::to_owned);
                wakes.extend(self.touch_pod(key_of(&pod), controller.as_deref(), now));
            }
        }
        wakes
    }

    /// Applies an event of our ConfigMaps: an intent is carried on, a record cleaned up.
    pub fn apply_move(&mut self, event: &watcher::Event<ConfigMap>) -> Vec<(Key, Duration)> {
        let mut wakes = Vec::new();
        for tensile_runtime::cache::Key { name, .. } in self.moves.apply_keys(event) {
            self.started.seen(&name);
            let cm = self.moves.get(&self.config.namespace, &name);
            if cm.as_ref().is_some_and(is_exclusions) {
                self.intents.remove(&name);
                if !self.config.dry_run {
                    wakes.push((Key::Exclusions(name), Duration::ZERO));
                }
                continue;
            }
            // An intent that is gone needs nothing: if it was due, its step finds it gone.
            match cm.as_ref().and_then(decode_move) {
                Some((m, _)) => {
                    let controller = match &m.how {
                        MoveHow::ThroughOwner { controller } => Some(controller.clone()),
                        MoveHow::Recreate { .. } => None,
                    };
                    self.intents
                        .insert(name.clone(), (PodKey::new(m.namespace, m.name), controller));
                    if !self.config.dry_run {
                        wakes.push((Key::Move(name), Duration::ZERO));
                    }
                }
                None => {
                    self.intents.remove(&name);
                }
            }
        }
        wakes
    }

    /// Writing the intent `name` failed: it is not on its way.
    pub fn start_failed(&mut self, name: &str) {
        self.started.seen(&name.to_owned());
    }

    /// What to do for `key` now.
    pub fn decide(&mut self, key: &Key, now: Now) -> Vec<Effect> {
        match key {
            Key::Pod(pod) => self.consider(pod, now),
            Key::Move(name) => self.carry_on(name, now),
            Key::Exclusions(name) => self.clean_exclusions(name, now),
        }
    }

    /// A pod whose time came: if it is still due, its move starts.
    fn consider(&mut self, key: &PodKey, now: Now) -> Vec<Effect> {
        let Some(pod) = self.pods.get(&key.namespace, &key.name) else {
            return Vec::new();
        };
        let Some((when, trigger)) = deschedule::due(&pod, &self.config.policy) else {
            return Vec::new();
        };
        if when > now.wall {
            return vec![Effect::Requeue(now.until(when))];
        }
        let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) else {
            return Vec::new();
        };
        if !self.nodes.contains("", &node) {
            return Vec::new();
        }
        let handling = match deschedule::handling(&pod, &self.config.policy) {
            Ok(h) => h,
            Err(keep) => {
                let note = format!(
                    "{trigger} on virtual node {node}, but the descheduler leaves it: {keep}"
                );
                return self
                    .tell_once(&pod, "NotDescheduled", note)
                    .unwrap_or_default();
            }
        };
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let name = deschedule::move_name(&uid);
        if self.moves.contains(&self.config.namespace, &name)
            || self.started.pending(&name, &uid, now.mono.into_std())
        {
            // Already on its way: the intent carries it on.
            return Vec::new();
        }
        // A controller's replacement that has not been handed its count yet is owed it.
        let intents = match handling {
            Handling::ThroughOwner(_) => self.intents_written(),
            Handling::Recreate => Vec::new(),
        };
        let attempts = deschedule::attempts_owed(&pod, &intents);
        if attempts >= self.config.policy.max_attempts {
            let note = format!(
                "{trigger} on virtual node {node}; moved {attempts} times already, the descheduler gives up"
            );
            // Counted once per pod, as the event is told once.
            return match self.tell_once(&pod, "DeschedulingGaveUp", note) {
                Some(mut told) => {
                    told.push(Effect::GaveUp);
                    told
                }
                None => Vec::new(),
            };
        }
        if let Err(at) = self.take_move(&node, now.mono) {
            return vec![Effect::Requeue(at.saturating_duration_since(now.mono))];
        }
        if self.config.dry_run {
            tracing::info!(pod = ?key, node, %trigger, ?handling, "dry run: would move");
            return Vec::new();
        }
        let Some(m) = deschedule::plan_move(&pod, &node, &handling, attempts, &trigger.to_string())
        else {
            return Vec::new();
        };
        self.started
            .written(name.clone(), &uid, now.mono.into_std());
        vec![Effect::StartMove { intent: name, m }]
    }

    /// The next step of the move of intent `name`.
    fn carry_on(&self, name: &str, now: Now) -> Vec<Effect> {
        if self.config.dry_run {
            return Vec::new();
        }
        let Some(cm) = self.moves.get(&self.config.namespace, name) else {
            return Vec::new();
        };
        let Some((m, since)) = decode_move(&cm) else {
            tracing::warn!(
                intent = name,
                "move intent without a move; left for inspection"
            );
            return Vec::new();
        };
        let intent = Intent {
            name: name.to_owned(),
            uid: cm.metadata.uid.clone(),
        };
        let current = self.pods.get(&m.namespace, &m.name);
        let candidates: Vec<Pod> = match &m.how {
            MoveHow::ThroughOwner { controller } => self
                .by_controller
                .pods
                .get(controller)
                .into_iter()
                .flatten()
                .filter_map(
                    |PodKey {
                         namespace: ns,
                         name: n,
                     }| self.pods.get(ns, n),
                )
                .collect(),
            MoveHow::Recreate { .. } => Vec::new(),
        };
        let step = deschedule::move_step(&m, since, current.as_ref(), &candidates, now.wall);
        vec![match step {
            MoveStep::Delete => {
                let (exclusion, event) = match &m.how {
                    MoveHow::ThroughOwner { controller } => (
                        Some(self.exclusion(controller, &m.node, now)),
                        Some(Event {
                            pod: (m.namespace.clone(), m.name.clone(), m.uid.clone()),
                            warning: false,
                            reason: EVENT_RESCHEDULED,
                            note: format!(
                                "{} on virtual node {}: deleted so that its controller re-creates it on another node",
                                m.why, m.node
                            ),
                        }),
                    ),
                    MoveHow::Recreate { .. } => (None, None),
                };
                Effect::Evict {
                    intent,
                    m,
                    exclusion,
                    event,
                }
            }
            MoveStep::WaitGone => Effect::Requeue(RETRY),
            MoveStep::Create => {
                let note = format!(
                    "{} on virtual node {}: re-created to be placed on another node",
                    m.why, m.node
                );
                Effect::Recreate { intent, m, note }
            }
            MoveStep::Hand { name: pod } => {
                match candidates
                    .into_iter()
                    .find(|p| p.metadata.name.as_deref() == Some(pod.as_str()))
                {
                    Some(pod) => Effect::HandOver {
                        intent,
                        m,
                        pod: Box::new(pod),
                    },
                    None => Effect::Requeue(RECHECK),
                }
            }
            MoveStep::WaitReplacement(until) => Effect::Requeue(now.until(until)),
            MoveStep::Forget => Effect::Complete(intent),
        }]
    }

    /// Until when `controller` stays off `node` after a move now (a later time recorded stays).
    fn exclusion(&self, controller: &str, node: &str, now: Now) -> Exclusion {
        let record = deschedule::exclusions_name(controller);
        let recorded = self
            .moves
            .get(&self.config.namespace, &record)
            .and_then(|cm| cm.data?.get(node).cloned());
        let window = SignedDuration::try_from(self.config.exclusion_window)
            .unwrap_or(SignedDuration::from_secs(180));
        Exclusion {
            controller: controller.to_owned(),
            node: node.to_owned(),
            until: deschedule::exclusion_until(recorded.as_deref(), now.wall, window),
            record,
        }
    }

    /// Drops the lapsed nodes of an exclusions record, or the record once all have lapsed.
    fn clean_exclusions(&self, name: &str, now: Now) -> Vec<Effect> {
        if self.config.dry_run {
            return Vec::new();
        }
        let Some(cm) = self.moves.get(&self.config.namespace, name) else {
            return Vec::new();
        };
        let record = cm.data.clone().unwrap_or_default();
        vec![match deschedule::exclusions_cleanup(&record, now.wall) {
            ExclusionsCleanup::Keep(at) => Effect::Requeue(now.until(at)),
            ExclusionsCleanup::Delete => Effect::RemoveRecord {
                name: name.to_owned(),
                uid: cm.metadata.uid,
                resource_version: cm.metadata.resource_version,
            },
            ExclusionsCleanup::Drop(nodes, at) => Effect::DropLapsed {
                name: name.to_owned(),
                resource_version: cm.metadata.resource_version,
                nodes,
                next: now.until(at),
            },
        }]
    }

    /// The event telling `pod` why it stays, the first time only (`None` after); nothing is
    /// written in a dry run, but the pod counts as told.
    fn tell_once(&mut self, pod: &Pod, reason: &'static str, note: String) -> Option<Vec<Effect>> {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        // Bounded: forgetting only means telling a pod a second time.
        if self.told.len() >= TOLD_MAX {
            self.told.clear();
        }
        if !self.told.insert(uid.clone()) {
            return None;
        }
        tracing::info!(pod = ?key_of(pod), reason, note, "not moved");
        if self.config.dry_run {
            return Some(Vec::new());
        }
        let PodKey { namespace, name } = key_of(pod);
        Some(vec![Effect::Event(Event {
            pod: (namespace, name, uid),
            warning: true,
            reason,
            note,
        })])
    }

    /// A free move for `node` now, or when one will be.
    fn take_move(&mut self, node: &str, now: Instant) -> Result<(), Instant> {
        let max = self.config.max_per_node_per_minute as usize;
        if max > 0 {
            let recent = self.limits.per_node.entry(node.to_owned()).or_default();
            recent.retain(|t| now.saturating_duration_since(*t) < Duration::from_secs(60));
            if recent.len() >= max {
                return Err(recent[0] + Duration::from_secs(60));
            }
        }
        self.limits.global.try_acquire(now)?;
        if max > 0 {
            self.limits
                .per_node
                .entry(node.to_owned())
                .or_default()
                .push(now);
        }
        Ok(())
    }

    /// Every move intent with when it was written.
    fn intents_written(&self) -> Vec<(Move, Timestamp)> {
        self.moves
            .state()
            .iter()
            .filter(|cm| !is_exclusions(cm))
            .filter_map(decode_move)
            .collect()
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

pub(super) fn key_of(pod: &Pod) -> PodKey {
    PodKey::new(
        pod.metadata.namespace.clone().unwrap_or_default(),
        pod.metadata.name.clone().unwrap_or_default(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use tensile_core::deschedule::{Policy, move_name};

    const T0: &str = "2026-11-28T00:00:00Z";

    fn t(secs: i64) -> Timestamp {
        T0.parse::<Timestamp>().unwrap() + SignedDuration::from_secs(secs)
    }

    /// The moment `secs` after T0 on both clocks.
    fn at(base: Instant, secs: u64) -> Now {
        Now {
            wall: t(secs as i64),
            mono: base + Duration::from_secs(secs),
        }
    }

    fn config() -> DeschedulerConfig {
        DeschedulerConfig {
            policy: Policy::default(),
            namespace: "tensile".into(),
            ..DeschedulerConfig::default()
        }
    }

    /// An index whose three watches listed `vk-1` and `vk-2` and nothing else.
    fn index_with(config: DeschedulerConfig, base: Instant) -> Index {
        let mut index = Index::new(config, base);
        let now = at(base, 0);
        for node in ["vk-1", "vk-2"] {
            let n: Node = serde_json::from_value(json!({"metadata": {"name": node,
                "labels": {"type": "virtual-kubelet"}}}))
            .unwrap();
            index.apply_node(&watcher::Event::Apply(n), now);
        }
        index.apply_pod(&watcher::Event::InitDone, now);
        index.apply_move(&watcher::Event::InitDone);
        index
    }

    /// A Pending pod on `node` whose lower scheduler has said Unschedulable since `since`
    /// (seconds after T0), owned by the ReplicaSet `rs` when given.
    fn stuck(name: &str, node: &str, since: Option<i64>, rs: Option<&str>) -> Pod {
        let mut pod = json!({
            "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}"),
                "creationTimestamp": t(-100).to_string()},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i"}]},
            "status": {"phase": "Pending"}
        });
        if let Some(since) = since {
            pod["status"]["conditions"] = json!([{"type": "PodScheduled", "status": "False",
                "reason": "Unschedulable", "message": "0/3 nodes are available",
                "lastTransitionTime": t(since).to_string()}]);
        }
        if let Some(rs) = rs {
            pod["metadata"]["ownerReferences"] = json!([{"apiVersion": "apps/v1",
                "kind": "ReplicaSet", "name": "rs", "uid": rs, "controller": true}]);
        }
        serde_json::from_value(pod).unwrap()
    }

    fn key(name: &str) -> Key {
        Key::Pod(PodKey::new("ns", name))
    }

    /// The intent ConfigMap of `m`, written at `secs` after T0, as the watch shows it.
    fn intent_cm(m: &Move, secs: i64) -> ConfigMap {
        serde_json::from_value(json!({
            "metadata": {"name": move_name(&m.uid), "namespace": "tensile", "uid": "cm-uid",
                "labels": {LABEL_MOVE: "true"}, "creationTimestamp": t(secs).to_string()},
            "data": {MOVE_KEY: serde_json::to_string(m).unwrap()}
        }))
        .unwrap()
    }

    fn started(effects: &[Effect]) -> Option<(&str, &Move)> {
        match effects {
            [Effect::StartMove { intent, m }] => Some((intent.as_str(), m)),
            _ => None,
        }
    }

    #[test]
    fn a_pod_unschedulable_longer_than_the_threshold_starts_its_move() {
        let base = Instant::now();
        let mut index = index_with(config(), base);
        let now = at(base, 100);
        // Unschedulable since 40 s, threshold 30 s: due 10 s ago, looked at at once.
        let wakes = index.apply_pod(
            &watcher::Event::Apply(stuck("p", "vk-1", Some(60), Some("rs-1"))),
            now,
        );
        assert_eq!(wakes, [(key("p"), Duration::ZERO)]);
        let effects = index.decide(&key("p"), now);
        let (intent, m) = started(&effects).expect("a move");
        assert_eq!(intent, "tensile-move-uid-p");
        assert_eq!(
            (m.name.as_str(), m.uid.as_str(), m.node.as_str()),
            ("p", "uid-p", "vk-1")
        );
        assert_eq!(m.why, "Unschedulable: 0/3 nodes are available");
        assert_eq!(m.attempts, 1);
        assert_eq!(
            m.how,
            MoveHow::ThroughOwner {
                controller: "rs-1".into()
            }
        );
    }

    #[test]
    fn a_pod_not_due_yet_is_looked_at_again_at_its_deadline_then_moves() {
        let base = Instant::now();
        let mut index = index_with(config(), base);
        // Unschedulable since 90 s (10 s at 100): due at 120.
        let pod = stuck("p", "vk-1", Some(90), Some("rs-1"));
        let wakes = index.apply_pod(&watcher::Event::Apply(pod), at(base, 100));
        assert_eq!(wakes, [(key("p"), Duration::from_secs(20))]);
        // Looked at early (touched by something else): back at the deadline, nothing done.
        assert_eq!(
            index.decide(&key("p"), at(base, 105)),
            [Effect::Requeue(Duration::from_secs(15))]
        );
        assert!(started(&index.decide(&key("p"), at(base, 120))).is_some());
    }

    #[test]
    fn a_pod_that_becomes_schedulable_or_leaves_pending_is_let_go() {
        let base = Instant::now();
        let mut index = index_with(config(), base);
        let now = at(base, 100);
        index.apply_pod(
            &watcher::Event::Apply(stuck("p", "vk-1", Some(90), Some("rs-1"))),
            now,
        );
        // Placed downstairs: no condition any more, nothing armed, nothing done when its old
        // time comes.
        let placed = stuck("p", "vk-1", None, Some("rs-1"));
        assert_eq!(
            index.apply_pod(&watcher::Event::Apply(placed.clone()), now),
            []
        );
        assert_eq!(index.decide(&key("p"), at(base, 200)), []);
        // Stuck again, then Running (out of the Pending watch): gone, nothing done.
        index.apply_pod(
            &watcher::Event::Apply(stuck("p", "vk-1", Some(10), Some("rs-1"))),
            now,
        );
        index.apply_pod(&watcher::Event::Delete(placed), now);
        assert_eq!(index.decide(&key("p"), at(base, 200)), []);
    }

    #[test]
    fn pods_not_on_a_virtual_node_are_never_moved() {
        let base = Instant::now();
        let mut index = index_with(config(), base);
        let now = at(base, 100);
        // A real node (not in the virtual nodes' watch), and a pod not bound at all.
        index.apply_pod(
            &watcher::Event::Apply(stuck("real", "worker-1", Some(0), Some("rs-1"))),
            now,
        );
        assert_eq!(index.decide(&key("real"), now), []);
        let mut unbound = stuck("unbound", "vk-1", Some(0), Some("rs-1"));
        unbound.spec.as_mut().unwrap().node_name = None;
        assert_eq!(
            index.apply_pod(&watcher::Event::Apply(unbound), now),
            [],
            "an unbound pod is never armed"
        );
        assert_eq!(index.decide(&key("unbound"), now), []);
    }

    #[test]
    fn a_node_seen_for_the_first_time_brings_its_due_pods_back() {
        let base = Instant::now();
        let mut index = index_with(config(), base);
        let now = at(base, 100);
        index.apply_pod(
            &watcher::Event::Apply(stuck("p", "vk-3", Some(0), Some("rs-1"))),
            now,
        );
        // Not virtual yet: nothing.
        assert_eq!(index.decide(&key("p"), now), []);
        let node: Node = serde_json::from_value(json!({"metadata": {"name": "vk-3"}})).unwrap();
        let wakes = index.apply_node(&watcher::Event::Apply(node.clone()), now);
        assert_eq!(wakes, [(key("p"), Duration::ZERO)]);
        assert!(started(&index.decide(&key("p"), now)).is_some());
        // A status update of a known node brings nothing back.
        assert_eq!(index.apply_node(&watcher::Event::Apply(node), now), []);
    }

    #[test]
    fn pods_that_are_never_moved_are_told_why_once() {
        let base = Instant::now();
        let mut index = index_with(config(), base);
        let now = at(base, 100);
        let mut daemon = stuck("ds", "vk-1", Some(0), None);
        daemon.metadata.owner_references = Some(vec![
            serde_json::from_value(json!({
            "apiVersion": "apps/v1", "kind": "DaemonSet", "name": "d", "uid": "ds-1",
            "controller": true}))
            .unwrap(),
        ]);
        let bare = stuck("bare", "vk-1", Some(0), None);
        for pod in [daemon, bare] {
            index.apply_pod(&watcher::Event::Apply(pod), now);
        }
        for (name, why) in [
            ("ds", "it belongs to a DaemonSet"),
            ("bare", "it has no controller to re-create it"),
        ] {
            let effects = index.decide(&key(name), now);
            let [Effect::Event(event)] = effects.as_slice() else {
                panic!("{name}: {effects:?}");
            };
            assert_eq!(event.reason, "NotDescheduled");
            assert!(event.warning);
            assert_eq!(event.pod.2, format!("uid-{name}"));
            assert!(
                event.note.contains("on virtual node vk-1") && event.note.contains(why),
                "{}",
                event.note
            );
            // Told once: a stuck pod is not an event storm.
            assert_eq!(index.decide(&key(name), at(base, 200)), []);
        }
    }

    #[test]
    fn a_bare_pod_that_opted_in_is_re_created_with_its_count() {
        let base = Instant::now();
        let mut index = index_with(config(), base);
        let now = at(base, 100);
        let mut pod = stuck("bare", "vk-1", Some(0), None);
        pod.metadata.annotations = Some(
            [(
                "descheduler.alpha.kubernetes.io/evict".to_owned(),
                String::new(),
            )]
            .into(),
        );
        index.apply_pod(&watcher::Event::Apply(pod), now);
        let effects = index.decide(&key("bare"), now);
        let (_, m) = started(&effects).expect("a move");
        let MoveHow::Recreate { replacement } = &m.how else {
            panic!("{:?}", m.how);
        };
        let annotations = replacement.metadata.annotations.as_ref().unwrap();
        assert_eq!(annotations["sigs.k8s.io/deschedule-count"], "1");
        assert_eq!(replacement.spec.as_ref().unwrap().node_name, None);
    }

    #[test]
    fn a_move_in_flight_is_never_started_twice() {
        let base = Instant::now();
        let mut index = index_with(config(), base);
        let now = at(base, 100);
        index.apply_pod(
            &watcher::Event::Apply(stuck("p", "vk-1", Some(0), Some("rs-1"))),
            now,
        );
        let effects = index.decide(&key("p"), now);
        let (_, m) = started(&effects).expect("a move");
        let m = m.clone();
        // Written, not shown by the watch yet: not again.
        assert_eq!(index.decide(&key("p"), at(base, 101)), []);
        // The write failed: it starts again.
        index.start_failed(&move_name("uid-p"));
        assert!(started(&index.decide(&key("p"), at(base, 102))).is_some());
        // Shown by the watch: the intent carries it on, the pod is not moved again.
        let wakes = index.apply_move(&watcher::Event::Apply(intent_cm(&m, 102)));
        assert_eq!(wakes, [(Key::Move(move_name("uid-p")), Duration::ZERO)]);
        assert_eq!(index.decide(&key("p"), at(base, 200)), []);
        // Long after the write, still shown: still not again.
        assert_eq!(index.decide(&key("p"), at(base, 1000)), []);
    }

    #[test]
    fn a_pod_moved_max_attempts_times_is_left_alone_with_one_event() {
        let base = Instant::now();
        let mut index = index_with(config(), base);
        let now = at(base, 100);
        let mut pod = stuck("p", "vk-1", Some(0), Some("rs-1"));
        pod.metadata.annotations =
            Some([("sigs.k8s.io/deschedule-count".to_owned(), "3".to_owned())].into());
        index.apply_pod(&watcher::Event::Apply(pod), now);
        let effects = index.decide(&key("p"), now);
        let [Effect::Event(event), Effect::GaveUp] = effects.as_slice() else {
            panic!("{effects:?}");
        };
        assert_eq!(event.reason, "DeschedulingGaveUp");
        assert!(
            event.note.contains("moved 3 times already"),
            "{}",
            event.note
        );
        assert_eq!(index.decide(&key("p"), at(base, 200)), []);
    }

    #[test]
    fn a_replacement_not_handed_its_count_yet_counts_the_move_it_replaces() {
        let base = Instant::now();
        let mut cfg = config();
        cfg.policy.max_attempts = 2;
        let mut index = index_with(cfg, base);
        // The move of an earlier pod of rs-1 (its second), intent written at 50.
        let earlier = stuck("old", "vk-1", Some(0), Some("rs-1"));
        let m = deschedule::plan_move(
            &earlier,
            "vk-1",
            &Handling::ThroughOwner("rs-1".into()),
            1,
            "why",
        )
        .unwrap();
        index.apply_move(&watcher::Event::Apply(intent_cm(&m, 50)));
        // Its replacement, created after the intent and stuck too: owed 2, gives up.
        let mut replacement = stuck("new", "vk-2", Some(60), Some("rs-1"));
        replacement.metadata.creation_timestamp = serde_json::from_value(json!(t(55))).ok();
        index.apply_pod(&watcher::Event::Apply(replacement), at(base, 100));
        let effects = index.decide(&key("new"), at(base, 100));
        assert!(
            matches!(effects.as_slice(), [Effect::Event(e), Effect::GaveUp] if e.reason == "DeschedulingGaveUp"),
            "{effects:?}"
        );
    }

    #[test]
    fn moves_per_node_per_minute_and_the_global_rate_are_kept() {
        let base = Instant::now();
        let mut cfg = config();
        cfg.max_per_node_per_minute = 1;
        cfg.moves_per_second = 0.5;
        cfg.burst = 2;
        let mut index = index_with(cfg, base);
        let now = at(base, 100);
        let vk3: Node = serde_json::from_value(json!({"metadata": {"name": "vk-3"}})).unwrap();
        index.apply_node(&watcher::Event::Apply(vk3), now);
        for (name, node) in [("a", "vk-1"), ("b", "vk-1"), ("c", "vk-2"), ("d", "vk-3")] {
            index.apply_pod(
                &watcher::Event::Apply(stuck(name, node, Some(0), Some("rs-1"))),
                now,
            );
        }
        assert!(started(&index.decide(&key("a"), now)).is_some());
        // Another node, within the burst.
        assert!(started(&index.decide(&key("c"), now)).is_some());
        // The burst is spent: d waits for the global rate's next token (one per 2 s), though
        // its node's own limit allows it.
        assert_eq!(
            index.decide(&key("d"), now),
            [Effect::Requeue(Duration::from_secs(2))]
        );
        // vk-1 had its move this minute: b waits for the minute to end, whatever tokens there are.
        assert_eq!(
            index.decide(&key("b"), at(base, 130)),
            [Effect::Requeue(Duration::from_secs(30))]
        );
        assert!(started(&index.decide(&key("b"), at(base, 160))).is_some());
    }

    #[test]
    fn a_dry_run_decides_but_writes_nothing() {
        let base = Instant::now();
        let mut cfg = config();
        cfg.dry_run = true;
        let mut index = index_with(cfg, base);
        let now = at(base, 100);
        index.apply_pod(
            &watcher::Event::Apply(stuck("p", "vk-1", Some(0), Some("rs-1"))),
            now,
        );
        index.apply_pod(
            &watcher::Event::Apply(stuck("bare", "vk-1", Some(0), None)),
            now,
        );
        assert_eq!(index.decide(&key("p"), now), []);
        // Not even an event.
        assert_eq!(index.decide(&key("bare"), now), []);
        // An intent left by a real run is not carried on.
        let m = deschedule::plan_move(
            &stuck("q", "vk-1", Some(0), Some("rs-1")),
            "vk-1",
            &Handling::ThroughOwner("rs-1".into()),
            0,
            "why",
        )
        .unwrap();
        assert_eq!(
            index.apply_move(&watcher::Event::Apply(intent_cm(&m, 50))),
            []
        );
        assert_eq!(index.decide(&Key::Move(move_name("uid-q")), now), []);
    }

    #[test]
    fn a_controllers_pod_is_evicted_with_its_exclusion_then_its_replacement_takes_the_count() {
        let base = Instant::now();
        let mut index = index_with(config(), base);
        let now = at(base, 100);
        let pod = stuck("p", "vk-1", Some(0), Some("rs-1"));
        index.apply_pod(&watcher::Event::Apply(pod.clone()), now);
        let effects = index.decide(&key("p"), now);
        let (intent, m) = started(&effects).expect("a move");
        let (intent, m) = (intent.to_owned(), m.clone());
        index.apply_move(&watcher::Event::Apply(intent_cm(&m, 100)));
        let move_key = Key::Move(intent.clone());
        // The pod is still there: evicted, kept off vk-1 for the window, told why.
        let effects = index.decide(&move_key, at(base, 101));
        let [
            Effect::Evict {
                intent: i,
                m: evicted,
                exclusion: Some(exclusion),
                event: Some(event),
            },
        ] = effects.as_slice()
        else {
            panic!("{effects:?}");
        };
        assert_eq!(i.uid.as_deref(), Some("cm-uid"));
        assert_eq!(evicted, &m);
        assert_eq!(exclusion.record, "tensile-exclusions-rs-1");
        assert_eq!((exclusion.node.as_str(), exclusion.until), ("vk-1", t(281)));
        assert_eq!(event.reason, EVENT_RESCHEDULED);
        assert!(!event.warning);
        assert!(
            event
                .note
                .starts_with("Unschedulable: 0/3 nodes are available on virtual node vk-1")
        );
        // Being deleted: wait for it to go.
        let mut leaving = pod.clone();
        leaving.metadata.deletion_timestamp = serde_json::from_value(json!(t(101))).ok();
        let wakes = index.apply_pod(&watcher::Event::Apply(leaving), at(base, 101));
        assert!(
            wakes.contains(&(move_key.clone(), Duration::ZERO)),
            "{wakes:?}"
        );
        assert_eq!(
            index.decide(&move_key, at(base, 102)),
            [Effect::Requeue(Duration::from_secs(600 - 2))]
        );
        // Gone, and no replacement yet: wait for one until the handover window ends.
        index.apply_pod(&watcher::Event::Delete(pod), at(base, 102));
        // The controller's new pod wakes the move, which hands it the count.
        let mut new = stuck("p-2", "", None, Some("rs-1"));
        new.spec.as_mut().unwrap().node_name = None;
        new.metadata.creation_timestamp = serde_json::from_value(json!(t(103))).ok();
        let wakes = index.apply_pod(&watcher::Event::Apply(new.clone()), at(base, 103));
        assert_eq!(wakes, [(move_key.clone(), Duration::ZERO)]);
        let effects = index.decide(&move_key, at(base, 103));
        let [Effect::HandOver { pod: to, .. }] = effects.as_slice() else {
            panic!("{effects:?}");
        };
        assert_eq!(to.metadata.name.as_deref(), Some("p-2"));
        // Never a replacement: the intent goes once the window is over.
        index.apply_pod(&watcher::Event::Delete(new), at(base, 104));
        assert!(matches!(
            index.decide(&move_key, at(base, 700)).as_slice(),
            [Effect::Complete(Intent { name, .. })] if *name == intent
        ));
    }

    #[test]
    fn an_exclusion_recorded_later_than_the_window_is_kept() {
        let base = Instant::now();
        let mut index = index_with(config(), base);
        let record: ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": "tensile-exclusions-rs-1", "namespace": "tensile",
                "labels": {LABEL_MOVE: VALUE_EXCLUSIONS}},
            "data": {"vk-1": t(1000).to_string()}
        }))
        .unwrap();
        index.apply_move(&watcher::Event::Apply(record));
        assert_eq!(
            index.exclusion("rs-1", "vk-1", at(base, 100)).until,
            t(1000)
        );
        assert_eq!(index.exclusion("rs-1", "vk-2", at(base, 100)).until, t(280));
    }

    #[test]
    fn a_re_created_pod_is_created_once_the_moved_one_is_gone() {
        let base = Instant::now();
        let mut index = index_with(config(), base);
        let mut pod = stuck("bare", "vk-1", Some(0), None);
        pod.metadata.annotations = Some(
            [(
                "descheduler.alpha.kubernetes.io/evict".to_owned(),
                String::new(),
            )]
            .into(),
        );
        let m = deschedule::plan_move(&pod, "vk-1", &Handling::Recreate, 0, "why").unwrap();
        index.apply_move(&watcher::Event::Apply(intent_cm(&m, 100)));
        let move_key = Key::Move(move_name("uid-bare"));
        index.apply_pod(&watcher::Event::Apply(pod.clone()), at(base, 100));
        // Still there: evicted, no exclusion record (no controller), no event until the
        // replacement exists.
        assert!(matches!(
            index.decide(&move_key, at(base, 100)).as_slice(),
            [Effect::Evict {
                exclusion: None,
                event: None,
                ..
            }]
        ));
        index.apply_pod(&watcher::Event::Delete(pod.clone()), at(base, 101));
        let effects = index.decide(&move_key, at(base, 101));
        let [Effect::Recreate { note, .. }] = effects.as_slice() else {
            panic!("{effects:?}");
        };
        assert_eq!(
            note,
            "why on virtual node vk-1: re-created to be placed on another node"
        );
        // Someone else's pod under the name (a restarted run's replacement): complete.
        let mut other = pod;
        other.metadata.uid = Some("uid-other".into());
        index.apply_pod(&watcher::Event::Apply(other), at(base, 102));
        assert!(matches!(
            index.decide(&move_key, at(base, 102)).as_slice(),
            [Effect::Complete(_)]
        ));
    }

    #[test]
    fn an_exclusions_record_is_cleaned_as_its_nodes_lapse() {
        let base = Instant::now();
        let mut index = index_with(config(), base);
        let record: ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": "tensile-exclusions-rs-1", "namespace": "tensile",
                "uid": "r-uid", "resourceVersion": "7",
                "labels": {LABEL_MOVE: VALUE_EXCLUSIONS}},
            "data": {"vk-1": t(100).to_string(), "vk-2": t(200).to_string()}
        }))
        .unwrap();
        let name = "tensile-exclusions-rs-1".to_owned();
        let wakes = index.apply_move(&watcher::Event::Apply(record));
        assert_eq!(wakes, [(Key::Exclusions(name.clone()), Duration::ZERO)]);
        let key = Key::Exclusions(name.clone());
        assert_eq!(
            index.decide(&key, at(base, 50)),
            [Effect::Requeue(Duration::from_secs(50))]
        );
        assert_eq!(
            index.decide(&key, at(base, 150)),
            [Effect::DropLapsed {
                name: name.clone(),
                resource_version: Some("7".into()),
                nodes: vec!["vk-1".into()],
                next: Duration::from_secs(50),
            }]
        );
        assert_eq!(
            index.decide(&key, at(base, 250)),
            [Effect::RemoveRecord {
                name,
                uid: Some("r-uid".into()),
                resource_version: Some("7".into()),
            }]
        );
    }

    #[test]
    fn a_re_list_looks_at_every_pod_it_lists_once_it_is_the_cache() {
        let base = Instant::now();
        let mut index = index_with(config(), base);
        let now = at(base, 100);
        assert_eq!(index.apply_pod(&watcher::Event::Init, now), []);
        let listed = watcher::Event::InitApply(stuck("p", "vk-1", Some(0), Some("rs-1")));
        assert_eq!(index.apply_pod(&listed, now), []);
        // Not decided on the previous list's picture: only once the list is complete.
        assert_eq!(index.decide(&key("p"), now), []);
        let wakes = index.apply_pod(&watcher::Event::InitDone, now);
        assert_eq!(wakes, [(key("p"), Duration::ZERO)]);
        assert!(started(&index.decide(&key("p"), now)).is_some());
    }

    #[test]
    fn the_age_rule_moves_a_pod_pending_too_long_without_a_condition() {
        let base = Instant::now();
        let mut cfg = config();
        cfg.policy.max_pending_age = Some(SignedDuration::from_secs(300));
        let mut index = index_with(cfg, base);
        // Created at -100: due at 200.
        let wakes = index.apply_pod(
            &watcher::Event::Apply(stuck("p", "vk-1", None, Some("rs-1"))),
            at(base, 100),
        );
        assert_eq!(wakes, [(key("p"), Duration::from_secs(100))]);
        let effects = index.decide(&key("p"), at(base, 200));
        let (_, m) = started(&effects).expect("a move");
        assert_eq!(m.why, "Pending longer than the maximum pod life time");
    }
}
