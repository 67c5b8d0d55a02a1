//! Events of the lower cluster about our pods, mirrored onto the upper pods (the rule is
//! `tensile_core::events`). [`MirrorIndex`] takes the lower events and our upper mirrors and
//! answers, for an event's key, the effect ([`MirrorEffect`]), without I/O; the writer here
//! carries it out. One watch of lower pod events (field selector on the involved kind), one of
//! our upper mirrors (label selector on our owner mark) so a repeat or a replay after a restart
//! writes only what changed; a keyed queue; a per-pod budget.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use tensile_core::events::{EventAction, EventBudget, event_action, mirrored_event};
use tensile_core::keys::{LABEL_OWNER, owner_label_value};
use tokio_util::sync::CancellationToken;

use tensile_runtime::cache::{CompactCache, Key};
use tensile_runtime::clients::already_exists;
use tensile_runtime::controller::{self, OnFailure, Reconciler, Stage, Workers};
use tensile_runtime::lock::lock;
use tensile_runtime::maps::shrink_after_removal;
use tensile_runtime::queue::{Action, Queue};

/// Mirrored events per pod at once, then one more every [`REFILL`].
const BURST: u32 = 25;
const REFILL: Duration = Duration::from_secs(10);
/// Tries to find an event's pod in the caches (the pod watch may lag the event watch by a
/// moment) before the event is dropped; with the queue's backoff that is about 2.5 s.
const ATTEMPTS: u8 = 8;
/// Parallel writes.
const WORKERS: usize = 2;

/// Settings of the event mirror.
#[derive(Clone)]
pub struct EventMirror {
    /// Upper cluster client.
    pub upper: kube::Client,
    /// Lower cluster client.
    pub lower: kube::Client,
    /// Our owner id.
    pub owner: String,
    /// The lower cluster's name, shown as the mirrors' source.
    pub lower_cluster: String,
    /// Each mirroring is timed here (stage `event_mirror`).
    pub metrics: crate::sync_metrics::SyncMetrics,
}

impl std::fmt::Debug for EventMirror {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventMirror")
            .field("owner", &self.owner)
            .field("lower_cluster", &self.lower_cluster)
            .finish_non_exhaustive()
    }
}

/// A lower event waiting to be mirrored, and how often its pod was not found. Boxed, so that
/// the table a burst of events grew stays small; given back when emptied.
struct Pending {
    event: Box<Event>,
    attempts: u8,
}

/// What the writer does for a lower event's key.
#[derive(Clone, Debug, PartialEq)]
pub enum MirrorEffect {
    /// Nothing to write: in step, about a pod that is not ours (or an earlier pod of the name),
    /// not mirrored by the rule, over the pod's budget, or no event waits under the key.
    Nothing,
    /// The event's pod is not in the caches yet: look again shortly.
    PodNotYetSeen,
    /// Create this mirror upstairs.
    CreateMirror(Box<Event>),
    /// Merge-patch the existing mirror with this (a repeat downstairs).
    PatchMirror(serde_json::Value),
}

/// The event mirror's state: the pod controller's pod caches, our upper mirrors, the lower
/// events waiting, each pod's budget. Share it in an `Arc`.
pub struct MirrorIndex {
    owner: String,
    lower_cluster: String,
    upper_pods: CompactCache<Pod>,
    lower_pods: CompactCache<Pod>,
    mirrors: CompactCache<Event>,
    pending: Mutex<HashMap<Key, Pending>>,
    budget: Mutex<EventBudget>,
}

impl std::fmt::Debug for MirrorIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MirrorIndex")
            .field("owner", &self.owner)
            .finish_non_exhaustive()
    }
}

/// A write of a mirror failed; the event is retried with backoff.
#[derive(Debug, thiserror::Error)]
enum MirrorError {
    #[error("mirroring lower event {namespace}/{name} onto the upper pod: {source}")]
    Write {
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("the pod of lower event {0}/{1} is not in the caches yet")]
    PodNotYetSeen(String, String),
}

/// Runs until `stop`. `upper_pods` and `lower_pods` are the pod controller's caches (ours only
/// are mirrored: the lower pod must be ours and the very one the event is about).
pub async fn run(
    cfg: EventMirror,
    upper_pods: CompactCache<Pod>,
    lower_pods: CompactCache<Pod>,
    stop: CancellationToken,
) {
    let index = Arc::new(MirrorIndex::new(
        &cfg.owner,
        &cfg.lower_cluster,
        upper_pods,
        lower_pods,
    ));
    let ours = format!("{LABEL_OWNER}={}", owner_label_value(&cfg.owner));
    let mirror_index = index.clone();
    let mut mirror_events = tensile_runtime::backoff::watch(
        Api::<Event>::all(cfg.upper.clone()),
        watcher::Config::default().labels(&ours),
    )
    .inspect_ok(move |e| mirror_index.apply_mirror(e))
    .boxed();
    let mut lower_events = tensile_runtime::backoff::watch(
        Api::<Event>::all(cfg.lower.clone()),
        watcher::Config::default().fields("involvedObject.kind=Pod"),
    )
    .boxed();
    let (queue, rx) = Queue::<Key>::new();
    {
        let (index, queue, stop) = (index.clone(), queue.clone(), stop.clone());
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = stop.cancelled() => return,
                    next = mirror_events.try_next() => if let Ok(None) = next { return },
                    next = lower_events.try_next() => match next {
                        Ok(Some(watcher::Event::Apply(ev) | watcher::Event::InitApply(ev))) => {
                            if let Some(key) = index.admit(ev) {
                                queue.add(key);
                            }
                        }
                        Ok(Some(_)) => {}
                        Ok(None) => return,
                        Err(e) => tracing::warn!(error = %e, "lower event watch error"),
                    }
                }
            }
        });
    }
    // Whether a mirror exists is only known once our mirrors are listed.
    tokio::select! {
        () = stop.cancelled() => return,
        () = index.mirrors.wait_until_ready() => {}
    }
    let writer = Arc::new(MirrorWriter { cfg, index });
    controller::run(writer, queue, rx, Workers::one_at_a_time(WORKERS), stop).await;
}

/// The event mirror's reconciler: the index's effect for a lower event, carried out.
struct MirrorWriter {
    cfg: EventMirror,
    index: Arc<MirrorIndex>,
}

impl Reconciler for MirrorWriter {
    type Key = Key;
    /// The lower event waiting to be mirrored, and what to do with it.
    type Plan = Option<(Event, MirrorEffect)>;
    type Error = MirrorError;

    fn plan(&self, key: &Key) -> Self::Plan {
        let event = self.index.pending_event(key)?;
        let effect = self.index.effect(key, &event, Instant::now());
        Some((event, effect))
    }

    async fn execute(self: Arc<Self>, key: Key, plan: Self::Plan) -> Result<Action, MirrorError> {
        if let Some((event, effect)) = plan {
            sync(&self.cfg, &self.index, &key, event, effect).await?;
        }
        Ok(Action::Done)
    }

    fn failed(&self, _: &Key, e: &MirrorError, _: Option<tokio::time::Instant>) -> OnFailure {
        tracing::debug!(error = %e, "event mirror");
        OnFailure::Retry
    }

    fn observe(&self, stage: Stage, took: Duration) {
        if stage == Stage::Reconcile {
            self.cfg.metrics.observe("event_mirror", took);
        }
    }
}

/// Carries out the index's `effect` for the lower event `key`.
async fn sync(
    cfg: &EventMirror,
    index: &MirrorIndex,
    key: &Key,
    event: Event,
    effect: MirrorEffect,
) -> Result<(), MirrorError> {
    let Key { namespace, name } = key;
    let api: Api<Event> = Api::namespaced(cfg.upper.clone(), namespace);
    let written = match effect {
        MirrorEffect::Nothing => Ok(()),
        MirrorEffect::PodNotYetSeen => {
            return if index.not_yet_seen(key) {
                Err(MirrorError::PodNotYetSeen(namespace.clone(), name.clone()))
            } else {
                Ok(())
            };
        }
        MirrorEffect::CreateMirror(mirror) => {
            match api.create(&PostParams::default(), &*mirror).await {
                Err(e) if already_exists(&e) => Ok(()),
                other => other.map(drop),
            }
        }
        MirrorEffect::PatchMirror(patch) => api
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map(drop),
    };
    written.map_err(|source| MirrorError::Write {
        namespace: namespace.clone(),
        name: name.clone(),
        source,
    })?;
    index.finish(key, &event);
    Ok(())
}

impl MirrorIndex {
    /// An empty index of node `owner` for the lower cluster named `lower_cluster` over the pod
    /// controller's caches.
    pub fn new(
        owner: &str,
        lower_cluster: &str,
        upper_pods: CompactCache<Pod>,
        lower_pods: CompactCache<Pod>,
    ) -> Self {
        MirrorIndex {
            owner: owner.to_owned(),
            lower_cluster: lower_cluster.to_owned(),
            upper_pods,
            lower_pods,
            mirrors: CompactCache::new(),
            pending: Mutex::default(),
            budget: Mutex::new(EventBudget::new(BURST, REFILL)),
        }
    }

    /// Applies a watch event of our upper mirrors.
    pub fn apply_mirror(&self, event: &watcher::Event<Event>) {
        self.mirrors.apply(event);
    }

    /// Keeps `event` for mirroring unless it is about a lower pod that is known not to be ours
    /// (another tenant's pod, or an older pod of the same name); the key to work on.
    pub fn admit(&self, event: Event) -> Option<Key> {
        let involved = &event.involved_object;
        let namespace = involved.namespace.clone()?;
        let pod_name = involved.name.as_deref()?;
        match self.lower_pods.get(&namespace, pod_name) {
            Some(pod) if pod.metadata.uid != involved.uid => return None,
            Some(_) => {}
            // Not one of ours unless an upper pod of that name is bound to us (then the lower
            // pod watch has not caught up yet).
            None if !self.upper_pods.contains(&namespace, pod_name) => return None,
            None => {}
        }
        let key = Key::new(namespace, event.metadata.name.clone()?);
        let mut pending = lock(&self.pending, "the event mirror index");
        pending.insert(
            key.clone(),
            Pending {
                event: Box::new(event),
                attempts: 0,
            },
        );
        Some(key)
    }

    /// The event waiting under `key`, if any.
    pub fn pending_event(&self, key: &Key) -> Option<Event> {
        let pending = lock(&self.pending, "the event mirror index");
        pending.get(key).map(|p| (*p.event).clone())
    }

    /// What to do for `event` (the one waiting under `key`) at `now`. A mirror to write takes
    /// from its pod's budget; anything but a write or a pod not seen yet is done with the event.
    pub fn effect(&self, key: &Key, event: &Event, now: Instant) -> MirrorEffect {
        let Key { namespace, name } = key;
        let involved = &event.involved_object;
        let pod_name = involved.name.as_deref().unwrap_or_default();
        let lower_pod = self.lower_pods.get(namespace, pod_name);
        let upper_pod = self.upper_pods.get(namespace, pod_name);
        let (Some(lower_pod), Some(upper_pod)) = (lower_pod, upper_pod) else {
            return MirrorEffect::PodNotYetSeen;
        };
        let done = || {
            self.finish(key, event);
            MirrorEffect::Nothing
        };
        // The lower pod cache holds ours only; the UID tells whether the event is about this
        // very pod and not an earlier one of the same name.
        if lower_pod.metadata.uid != involved.uid {
            return done();
        }
        let Some(desired) = mirrored_event(event, &upper_pod, &self.owner, &self.lower_cluster)
        else {
            return done();
        };
        let action = event_action(desired, self.mirrors.get(namespace, name).as_ref());
        if action == EventAction::Nothing {
            return done();
        }
        let upper_uid = upper_pod.metadata.uid.clone().unwrap_or_default();
        let allowed = lock(&self.budget, "the event budget").allow(&upper_uid, now);
        if !allowed {
            tracing::debug!(namespace = %namespace, event = %name, "event not mirrored: the pod's event budget is spent");
            return done();
        }
        match action {
            EventAction::Create(mirror) => MirrorEffect::CreateMirror(mirror),
            EventAction::Patch(patch) => MirrorEffect::PatchMirror(patch),
            EventAction::Nothing => done(),
        }
    }

    /// Forgets the pending event if it is still the version just handled (a newer one stays
    /// for the next round, which the queue has already scheduled).
    pub fn finish(&self, key: &Key, handled: &Event) {
        let mut pending = lock(&self.pending, "the event mirror index");
        if pending
            .get(key)
            .is_some_and(|p| p.event.metadata.resource_version == handled.metadata.resource_version)
        {
            pending.remove(key);
            shrink_after_removal(&mut *pending);
        }
    }

    /// The event's pod is not in the caches: whether to try again (a few times, then the event
    /// is dropped).
    pub fn not_yet_seen(&self, key: &Key) -> bool {
        let mut pending = lock(&self.pending, "the event mirror index");
        let Some(p) = pending.get_mut(key) else {
            return false;
        };
        p.attempts += 1;
        if p.attempts >= ATTEMPTS {
            pending.remove(key);
            shrink_after_removal(&mut *pending);
            return false;
        }
        true
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)] // test code
mod tests {
    use super::*;
    use serde_json::json;
    use watcher::Event::Apply;

    fn lower_event(name: &str, count: i32, pod_uid: &str) -> Event {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "shop", "resourceVersion": format!("{count}")},
            "involvedObject": {"apiVersion": "v1", "kind": "Pod", "namespace": "shop",
                "name": "web-0", "uid": pod_uid},
            "reason": "BackOff", "message": "Back-off pulling image", "type": "Warning",
            "source": {"component": "kubelet", "host": "lower-node-1"},
            "count": count,
            "firstTimestamp": "2026-11-22T10:00:00Z", "lastTimestamp": "2026-11-22T10:00:00Z",
        }))
        .unwrap()
    }

    fn pod(uid: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "web-0", "namespace": "shop", "uid": uid},
            "spec": {"nodeName": "vk-a", "containers": [{"name": "app", "image": "nginx"}]},
        }))
        .unwrap()
    }

    /// An index whose caches hold the upper pod and (when `lower`) our lower pod of it.
    fn index(lower: bool) -> MirrorIndex {
        let (upper_pods, lower_pods) = (CompactCache::new(), CompactCache::new());
        upper_pods.apply(&Apply(pod("upper-uid")));
        if lower {
            lower_pods.apply(&Apply(pod("lower-uid")));
        }
        MirrorIndex::new("vk-a", "lower", upper_pods, lower_pods)
    }

    /// Admits `event` and answers its effect.
    fn mirror(index: &MirrorIndex, event: Event) -> MirrorEffect {
        let key = index.admit(event.clone()).unwrap();
        index.effect(&key, &event, Instant::now())
    }

    #[test]
    fn an_event_of_our_pod_is_mirrored_once_and_a_repeat_patches_the_mirror() {
        let index = index(true);
        let MirrorEffect::CreateMirror(created) = mirror(&index, lower_event("e1", 1, "lower-uid"))
        else {
            panic!("expected a mirror");
        };
        assert_eq!(
            created.involved_object.uid.as_deref(),
            Some("upper-uid"),
            "about the upper pod"
        );
        index.apply_mirror(&Apply(*created));
        assert!(matches!(
            mirror(&index, lower_event("e1", 2, "lower-uid")),
            MirrorEffect::PatchMirror(_)
        ));
        // The same version again (a replay after a restart): nothing.
        assert_eq!(
            mirror(&index, lower_event("e1", 1, "lower-uid")),
            MirrorEffect::Nothing
        );
    }

    #[test]
    fn events_of_pods_that_are_not_ours_are_never_mirrored() {
        // An earlier lower pod of the name (another UID) than ours.
        assert_eq!(index(true).admit(lower_event("e1", 1, "other-uid")), None);
        // No pod of that name is ours on either side.
        let none = MirrorIndex::new("vk-a", "lower", CompactCache::new(), CompactCache::new());
        assert_eq!(none.admit(lower_event("e1", 1, "lower-uid")), None);
    }

    #[test]
    fn an_event_whose_pod_the_lower_watch_has_not_shown_waits_a_few_times_then_is_dropped() {
        let index = index(false);
        let event = lower_event("e1", 1, "lower-uid");
        let key = index.admit(event.clone()).unwrap();
        assert_eq!(
            index.effect(&key, &event, Instant::now()),
            MirrorEffect::PodNotYetSeen
        );
        let retries = std::iter::from_fn(|| index.not_yet_seen(&key).then_some(())).count();
        assert_eq!(retries, usize::from(ATTEMPTS) - 1);
        assert_eq!(index.pending_event(&key), None, "dropped");
    }

    #[test]
    fn a_pods_mirrors_stop_at_its_budget() {
        let index = index(true);
        let now = Instant::now();
        let written = (0..BURST + 5)
            .filter(|i| {
                let event = lower_event(&format!("e{i}"), 1, "lower-uid");
                let key = index.admit(event.clone()).unwrap();
                matches!(
                    index.effect(&key, &event, now),
                    MirrorEffect::CreateMirror(_)
                )
            })
            .count();
        assert_eq!(written, BURST as usize);
    }
}
