//! Events of the lower cluster about our pods, mirrored onto the upper pods (the rule is
//! `tensile_core::events`). One watch of lower pod events (field selector on the involved
//! kind), one of our upper mirrors (label selector on our owner mark) so a repeat or a replay
//! after a restart writes only what changed; a keyed queue; a per-pod budget.

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
use tensile_runtime::queue::Queue;

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
    pub metrics: crate::pods::SyncMetrics,
}

impl std::fmt::Debug for EventMirror {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventMirror")
            .field("owner", &self.owner)
            .field("lower_cluster", &self.lower_cluster)
            .finish_non_exhaustive()
    }
}

/// A lower event waiting to be mirrored, and how often its pod was not found.
struct Pending {
    event: Event,
    attempts: u8,
}

struct Ctx {
    cfg: EventMirror,
    upper_pods: CompactCache<Pod>,
    lower_pods: CompactCache<Pod>,
    mirrors: CompactCache<Event>,
    pending: Mutex<HashMap<Key, Pending>>,
    budget: Mutex<EventBudget>,
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
    let mirrors = CompactCache::<Event>::new();
    let ours = format!("{LABEL_OWNER}={}", owner_label_value(&cfg.owner));
    let mirror_cache = mirrors.clone();
    let mut mirror_events = tensile_runtime::backoff::watch(
        Api::<Event>::all(cfg.upper.clone()),
        watcher::Config::default().labels(&ours),
    )
    .inspect_ok(move |e| mirror_cache.apply(e))
    .boxed();
    let mut lower_events = tensile_runtime::backoff::watch(
        Api::<Event>::all(cfg.lower.clone()),
        watcher::Config::default().fields("involvedObject.kind=Pod"),
    )
    .boxed();
    let ctx = Arc::new(Ctx {
        cfg,
        upper_pods,
        lower_pods,
        mirrors,
        pending: Mutex::default(),
        budget: Mutex::new(EventBudget::new(BURST, REFILL)),
    });
    let (queue, rx) = Queue::<Key>::new();
    {
        let (ctx, queue, stop) = (ctx.clone(), queue.clone(), stop.clone());
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = stop.cancelled() => return,
                    next = mirror_events.try_next() => if let Ok(None) = next { return },
                    next = lower_events.try_next() => match next {
                        Ok(Some(watcher::Event::Apply(ev) | watcher::Event::InitApply(ev))) => {
                            if let Some(key) = ctx.admit(ev) {
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
        () = ctx.mirrors.wait_until_ready() => {}
    }
    let mut tasks = Vec::new();
    for _ in 0..WORKERS {
        let (ctx, queue, rx, stop) = (ctx.clone(), queue.clone(), rx.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            while let Some((key, _)) = queue.next(&rx, &stop).await {
                let t0 = std::time::Instant::now();
                let result = ctx.sync(&key).await;
                ctx.cfg.metrics.observe("event_mirror", t0.elapsed());
                if let Err(e) = &result {
                    tracing::debug!(error = %e, "event mirror");
                }
                queue.done(key, result.is_ok());
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
}

impl Ctx {
    /// Keeps `event` for mirroring unless it is about a lower pod that is known not to be ours
    /// (another tenant's pod, or an older pod of the same name); the key to work on.
    fn admit(&self, event: Event) -> Option<Key> {
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
        let key = (namespace, event.metadata.name.clone()?);
        let mut pending = self
            .pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        pending.insert(key.clone(), Pending { event, attempts: 0 });
        Some(key)
    }

    async fn sync(&self, key: &Key) -> Result<(), MirrorError> {
        let Some(event) = self.pending_event(key) else {
            return Ok(());
        };
        let (namespace, name) = key;
        let involved = &event.involved_object;
        let pod_name = involved.name.as_deref().unwrap_or_default();
        let lower_pod = self.lower_pods.get(namespace, pod_name);
        let upper_pod = self.upper_pods.get(namespace, pod_name);
        let (Some(lower_pod), Some(upper_pod)) = (lower_pod, upper_pod) else {
            return self.not_yet_seen(key);
        };
        // The lower pod cache holds ours only; the UID tells whether the event is about this
        // very pod and not an earlier one of the same name.
        if lower_pod.metadata.uid != involved.uid {
            return self.finish(key, &event);
        }
        let Some(desired) =
            mirrored_event(&event, &upper_pod, &self.cfg.owner, &self.cfg.lower_cluster)
        else {
            return self.finish(key, &event);
        };
        let action = event_action(desired, self.mirrors.get(namespace, name).as_ref());
        if action == EventAction::Nothing {
            return self.finish(key, &event);
        }
        let upper_uid = upper_pod.metadata.uid.clone().unwrap_or_default();
        let allowed = {
            let mut budget = self
                .budget
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            budget.allow(&upper_uid, Instant::now())
        };
        if !allowed {
            tracing::debug!(namespace = %namespace, event = %name, "event not mirrored: the pod's event budget is spent");
            return self.finish(key, &event);
        }
        let api: Api<Event> = Api::namespaced(self.cfg.upper.clone(), namespace);
        let written = match action {
            EventAction::Create(mirror) => {
                match api.create(&PostParams::default(), &*mirror).await {
                    Err(e) if already_exists(&e) => Ok(()),
                    other => other.map(drop),
                }
            }
            EventAction::Patch(patch) => api
                .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map(drop),
            EventAction::Nothing => Ok(()),
        };
        written.map_err(|source| MirrorError::Write {
            namespace: namespace.clone(),
            name: name.clone(),
            source,
        })?;
        self.finish(key, &event)
    }

    fn pending_event(&self, key: &Key) -> Option<Event> {
        let pending = self
            .pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        pending.get(key).map(|p| p.event.clone())
    }

    /// Forgets the pending event if it is still the version just handled (a newer one stays
    /// for the next round, which the queue has already scheduled).
    fn finish(&self, key: &Key, handled: &Event) -> Result<(), MirrorError> {
        let mut pending = self
            .pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if pending
            .get(key)
            .is_some_and(|p| p.event.metadata.resource_version == handled.metadata.resource_version)
        {
            pending.remove(key);
        }
        Ok(())
    }

    /// The event's pod is not in the caches: try again shortly, a few times, then drop it.
    fn not_yet_seen(&self, key: &Key) -> Result<(), MirrorError> {
        let mut pending = self
            .pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let Some(p) = pending.get_mut(key) else {
            return Ok(());
        };
        p.attempts += 1;
        if p.attempts >= ATTEMPTS {
            pending.remove(key);
            return Ok(());
        }
        Err(MirrorError::PodNotYetSeen(key.0.clone(), key.1.clone()))
    }
}
