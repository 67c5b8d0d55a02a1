//! The pod controller: upper pods bound to the virtual node and lower pods we created (field
//! selector `spec.nodeName=<node>` upstairs; downstairs our pods, taken from the one shared
//! watch of all lower pods that the capacity tracker reads too);
//! every change puts the pod's key on a work queue; a reconcile reads both caches, asks
//! `tensile-core` what should be, and writes only the difference.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use futures::SinkExt as _;
use futures::channel::mpsc::{Receiver as EventReceiver, channel};
use futures::{Stream, StreamExt, TryStreamExt};
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::{EphemeralContainer, Pod, PodSpec, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::Resource;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use serde_json::json;
use tensile_core::absent::{Absent, drop_absent};
use tensile_core::deps::{
    CopyKind, is_owned_by, lower_secret, lower_service_account, pod_dependencies,
};
use tensile_core::env_events::{EnvEvent, Found, Upstairs, env_events, env_references};
use tensile_core::keys::{
    ANNOTATION_UPPER_UID, EVENT_PROVIDER_CREATE_SUCCESS, EVENT_PROVIDER_DELETE_SUCCESS,
    EVENT_PROVIDER_UPDATE_SUCCESS, REASON_NOT_OFFLOADED, REASON_PROVIDER_FAILED,
};
use tensile_core::plan::{
    Existing, LowerKind, Step, creation_plan, on_existing, pod_creation_plan,
};
use tensile_core::status::{
    may_coalesce, not_offloaded_conditions, provider_failed_patch, status_merge_patch,
    unreachable_conditions,
};
use tensile_core::sync::{PodStep, pod_step};
use tensile_core::translate::{TranslateConfig, lower_pod};
use tensile_core::update::{PodUpdate, UpdateError};
use tokio_util::sync::CancellationToken;

use crate::copies::{Dependencies, Shared};
use crate::copy_index::CopyState;
use crate::namespaces::LowerNamespaces;
use crate::needs::Side;
use crate::reach::LowerReach;
use crate::sync_error::{Call, Cluster, Failure, Level, Op, SyncError, Then, failing_for, policy};
use crate::tokens::IdentitySecrets;
use tensile_runtime::cache::CompactCache;
use tensile_runtime::clients::{already_exists, delete_exact};
use tensile_runtime::events::{EventSink, PodEvent};
use tensile_runtime::queue::{Expected, Hold, Holds, Queue, Receiver};

/// Where a pod sync spends its time: the Prometheus histogram `tensile_pod_sync_seconds`
/// with `stage` `queue_wait` (a changed pod waiting for a worker), `reconcile` (one whole
/// reconcile, API calls included), `lower_pod_create` (the lower API server's answer to the
/// pod create alone), `upper_tokens` (a pod's tokens from the upper cluster), `upper_status`
/// (the upper API server's answer to the status written up), and the syncs of what pods need:
/// `copy` (one ConfigMap, Secret, Service, Endpoints or claim copy), `event_mirror` (one lower
/// event mirrored up) and `volume` (one volume). Clones share the histograms.
#[derive(Clone, Debug)]
pub struct SyncMetrics {
    family: Family<StageLabel, Histogram, fn() -> Histogram>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StageLabel {
    stage: &'static str,
}

impl Default for SyncMetrics {
    fn default() -> Self {
        // 0.5 ms to ~16 s.
        Self {
            family: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.0005, 2.0, 16))
            }),
        }
    }
}

impl SyncMetrics {
    /// Histograms registered in `registry`.
    pub fn new(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "tensile_pod_sync_seconds",
            "Time a pod sync spends per stage: queue_wait, reconcile, lower_pod_create, upper_tokens, upper_status, copy, event_mirror, volume",
            m.family.clone(),
        );
        m
    }

    pub(crate) fn observe(&self, stage: &'static str, d: std::time::Duration) {
        self.family
            .get_or_create(&StageLabel { stage })
            .observe(d.as_secs_f64());
    }
}

/// A pod key: (namespace, name), the same in both clusters.
pub type Key = (String, String);

fn not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

/// What the controller needs.
pub struct PodSync {
    /// Upper cluster.
    pub upper: kube::Client,
    /// Upper cluster, for events only: a client with its own rate limit, so that an event
    /// (best effort) never takes a token a pod's status write needs.
    pub upper_events: kube::Client,
    /// Lower cluster.
    pub lower: kube::Client,
    /// Virtual node name.
    pub node: String,
    /// A name for the lower cluster in messages.
    pub lower_name: String,
    /// Translation settings (owner id, ignore-labels).
    pub translate: TranslateConfig,
    /// Parallel reconciles.
    pub workers: usize,
    /// Create the ServiceAccounts pods use in the lower cluster (`--enable-serviceaccount`);
    /// when false a pod of a missing lower ServiceAccount waits for the operator to create it.
    pub service_accounts: bool,
    /// When a pod whose sync failed is tried again ([`crate::Retry::default`]: 5 ms doubling to
    /// 10 s). A pod waiting for an upper object is also tried again as soon as the object
    /// appears, whatever this says.
    pub retry: crate::Retry,
}

impl std::fmt::Debug for PodSync {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PodSync")
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

struct Ctx {
    cfg: PodSync,
    upper_pods: CompactCache<Pod>,
    lower_pods: CompactCache<Pod>,
    /// Upper ConfigMaps and Secrets (the ConfigMap and Secret controller's watches).
    upper_objects: Dependencies,
    /// Our lower copies of them (the same controller's watches).
    copies: Dependencies,
    recorder: EventSink,
    metrics: SyncMetrics,
    /// The grace period of upper pods whose deletion we saw, until their key is reconciled.
    gone_grace: Arc<Mutex<HashMap<Key, i64>>>,
    /// Lower namespaces known to exist (shared with the Service controller). Forgotten on any
    /// failed creation (the namespace may have gone).
    namespaces: Arc<LowerNamespaces>,
    /// Pods whose Pending status is held back (see [`STATUS_COALESCE`]).
    held_statuses: Holds<Key>,
    /// Lower pods we created that the lower watch has not shown yet (by upper UID): a
    /// reconcile of such a key in between (its Secret's or upper pod's event came first)
    /// creates nothing (see [`Expected`]).
    created: Arc<Expected<Key>>,
    queue: Queue<Key>,
    /// Upper service-account tokens, with upper identity (`TranslateConfig::upper_api`).
    tokens: Option<IdentitySecrets>,
    /// Whether the lower cluster answers (the node loop's health check).
    reach: LowerReach,
    /// The environment events last sent for each pod (by upper UID): a retry that finds the
    /// same sends none, so a pod waiting for a ConfigMap gets one event per change, not one per
    /// retry. Forgotten with the pod.
    env_sent: Mutex<HashMap<Key, (String, Vec<EnvEvent>)>>,
}

/// How long a lower pod we created may be missing from the lower watch before a reconcile
/// believes the cache again and creates it anew (idempotent: AlreadyExists of ours is fine).
const CREATED_EXPECTED: std::time::Duration = std::time::Duration::from_secs(30);

/// How long a Pending status may wait upstairs for a newer one (`may_coalesce`): short next
/// to a container start, long next to the lower cluster's own scheduling of a burst.
const STATUS_COALESCE: std::time::Duration = std::time::Duration::from_secs(1);

fn key_of(p: &Pod) -> Option<Key> {
    Some((p.metadata.namespace.clone()?, p.metadata.name.clone()?))
}

/// How many lower pod events may wait for a consumer of [`lower_pod_events`]. Bounded: with
/// unbounded channels a consumer starved of CPU in a 10,000-pod burst on real control planes let
/// typed pods pile up to 800 MiB; bounded, a slow consumer slows the watch instead (the API
/// server keeps the events, and a dropped watch resumes from its resourceVersion).
const LOWER_EVENT_BUFFER: usize = 256;

/// One watch of every lower pod, fanned out to `CONSUMERS` streams (the capacity model needs
/// all of them, the pod controller ours; one watch serves both instead of two that deliver
/// our pods twice). The watcher retries with backoff by itself, at once when `down` says the
/// lower cluster answers again ([`tensile_runtime::backoff::watch_waking`]); it ends at `stop`.
pub fn lower_pod_events<const CONSUMERS: usize>(
    lower: kube::Client,
    down: tokio::sync::watch::Receiver<bool>,
    stop: CancellationToken,
) -> [EventReceiver<watcher::Event<Pod>>; CONSUMERS] {
    let mut senders = Vec::with_capacity(CONSUMERS);
    let receivers = std::array::from_fn(|_| {
        let (tx, rx) = channel(LOWER_EVENT_BUFFER);
        senders.push(tx);
        rx
    });
    tokio::spawn(async move {
        let mut events = tensile_runtime::backoff::watch_waking(
            Api::<Pod>::all(lower),
            watcher::Config::default(),
            down,
        )
        .boxed();
        loop {
            let next = tokio::select! {
                () = stop.cancelled() => return,
                next = events.next() => next,
            };
            match next {
                Some(Ok(event)) => {
                    // A consumer that has stopped no longer needs events. The last one gets the
                    // event itself: one pod copy fewer per event.
                    if let Some((last, others)) = senders.split_last_mut() {
                        for tx in others {
                            let _ = tx.send(event.clone()).await;
                        }
                        let _ = last.send(event).await;
                    }
                }
                Some(Err(e)) => tracing::warn!(error = %e, "lower pod watch error"),
                None => return,
            }
        }
    });
    receivers
}

/// Keeps of a stream of every lower pod what the pod controller's cache holds: the pods with
/// our owner label. A pod that loses the label leaves the cache as a deletion, as it would from
/// a label-selector watch.
fn ours_only<S: Stream<Item = watcher::Event<Pod>>>(
    events: S,
    owner: &str,
    cache: CompactCache<Pod>,
) -> impl Stream<Item = watcher::Event<Pod>> + use<S> {
    let owner = owner.to_owned();
    let is_ours = move |p: &Pod| is_owned_by(&p.metadata, &owner);
    events.filter_map(move |e| {
        let cached = |p: &Pod| key_of(p).is_some_and(|(ns, name)| cache.contains(&ns, &name));
        let kept = match e {
            watcher::Event::Apply(p) if is_ours(&p) => Some(watcher::Event::Apply(p)),
            watcher::Event::Apply(p) | watcher::Event::Delete(p) if cached(&p) => {
                Some(watcher::Event::Delete(p))
            }
            watcher::Event::InitApply(p) if is_ours(&p) => Some(watcher::Event::InitApply(p)),
            watcher::Event::Apply(_) | watcher::Event::Delete(_) | watcher::Event::InitApply(_) => {
                None
            }
            watcher::Event::Init => Some(watcher::Event::Init),
            watcher::Event::InitDone => Some(watcher::Event::InitDone),
        };
        futures::future::ready(kept)
    })
}

/// Runs until `stop`: fills the given upper pod store (shared with the kubelet API's `/pods`)
/// and lower pod store (ours only, shared with its stats) from `lower_events` (see
/// [`lower_pod_events`]).
pub async fn run_with_store(
    cfg: PodSync,
    upper_pods: CompactCache<Pod>,
    lower_pods: CompactCache<Pod>,
    shared: Shared,
    lower_events: impl Stream<Item = watcher::Event<Pod>> + Send + 'static,
    (metrics, reach): (SyncMetrics, LowerReach),
    stop: CancellationToken,
) {
    let Shared {
        upper: upper_objects,
        watches,
        copies,
        namespaces,
        needs,
    } = shared;
    let referencing = needs.clone();
    let upper_needs = needs.clone();
    let upper_api: Api<Pod> = Api::all(cfg.upper.clone());
    let gone_grace: Arc<Mutex<HashMap<Key, i64>>> = Arc::default();
    let record_gone = gone_grace.clone();
    let upper_stream = tensile_runtime::backoff::watch(
        upper_api,
        watcher::Config::default().fields(&format!("spec.nodeName={}", cfg.node)),
    )
    .inspect_ok(move |e| {
        // A pod deleted with grace 0 vanishes at once; its last state still says so, and the
        // lower pod goes the same way.
        if let watcher::Event::Delete(p) = e
            && let (Some(k), Some(g)) = (key_of(p), p.metadata.deletion_grace_period_seconds)
            && let Ok(mut m) = record_gone.lock()
        {
            m.insert(k, g);
        }
    });
    // The keys to reconcile once the cache shows what changed (a re-list's when it is
    // complete: see `CompactCache::apply_keys`).
    let upper_stream = upper_pods
        .keys_shown(upper_stream, move |e| upper_needs.observe(Side::Upper, e))
        .map_ok(|k| (k, false))
        .boxed();
    let created = Arc::new(Expected::new(CREATED_EXPECTED));
    let lower_stream = lower_pods
        .keys_shown(
            ours_only(lower_events, &cfg.translate.owner, lower_pods.clone())
                .map(Ok::<_, watcher::Error>),
            move |e| needs.observe(Side::Lower, e),
        )
        // The watch (through the cache) shows these pods now: a create of ours is no longer
        // in flight.
        .inspect_ok({
            let created = created.clone();
            move |k| created.seen(k)
        })
        // What the lower cluster reports goes first (urgent): mostly a status to write up, one
        // request, which should not wait behind a burst of creations.
        .map_ok(|k| (k, true))
        .boxed();
    let (queue, rx) = Queue::<Key>::with_retry(cfg.retry);
    let feed = {
        let queue = queue.clone();
        let stop = stop.clone();
        async move {
            let merged = futures::stream::select(upper_stream, lower_stream);
            tensile_runtime::backoff::drain(merged, &stop, "pods", |(k, urgent)| {
                if urgent {
                    queue.add_urgent(k);
                } else {
                    queue.add(k);
                }
            })
            .await;
        }
    };
    tokio::spawn(feed);
    // A pod that waits for an upper ConfigMap or Secret (not created downstairs yet) is tried
    // again as soon as the object's watch sees it change (appear, above all), not at its next
    // retry.
    {
        let observer = |kind: CopyKind| -> crate::watches::Observer {
            let (needs, queue, lower_pods) =
                (referencing.clone(), queue.clone(), lower_pods.clone());
            Arc::new(move |key: &Key| {
                for pod in needs.upper_pods_referencing(kind, key) {
                    if !lower_pods.contains(&pod.0, &pod.1) {
                        queue.add(pod);
                    }
                }
            })
        };
        watches.config_maps.observe(observer(CopyKind::ConfigMap));
        watches.secrets.observe(observer(CopyKind::Secret));
        // And as soon as the copy controller has made (or failed to make) a copy it waits for.
        referencing.wake_pods(queue.clone());
    }
    let tokens = cfg.translate.upper_api.is_some().then(|| {
        IdentitySecrets::start(
            cfg.upper.clone(),
            cfg.lower.clone(),
            (
                cfg.translate.owner.clone(),
                cfg.translate.ignore_labels.clone(),
            ),
            cfg.lower_name.clone(),
            upper_objects.config_maps.clone(),
            queue.clone(),
            stop.clone(),
        )
    });
    // Nothing is decided before the caches are complete: an absent lower pod must mean absent.
    let tokens_ready = async {
        if let Some(t) = &tokens {
            t.wait_until_ready().await;
        }
    };
    tokio::select! {
        () = stop.cancelled() => return,
        _ = futures::future::join3(
            upper_pods.wait_until_ready(),
            lower_pods.wait_until_ready(),
            tokens_ready,
        ) => {}
    }
    tokio::spawn(crate::mirror_events::run(
        crate::mirror_events::EventMirror {
            upper: cfg.upper_events.clone(),
            lower: cfg.lower.clone(),
            owner: cfg.translate.owner.clone(),
            lower_cluster: cfg.lower_name.clone(),
            metrics: metrics.clone(),
        },
        upper_pods.clone(),
        lower_pods.clone(),
        stop.clone(),
    ));
    let recorder = EventSink::start(cfg.upper_events.clone(), "tensile-kube", &cfg.node);
    let workers = cfg.workers.max(1);
    let ctx = Arc::new(Ctx {
        cfg,
        upper_pods,
        lower_pods,
        upper_objects,
        copies,
        recorder,
        metrics,
        gone_grace,
        namespaces,
        held_statuses: Holds::new(STATUS_COALESCE),
        created,
        queue: queue.clone(),
        tokens,
        reach: reach.clone(),
        env_sent: Mutex::default(),
    });
    // Every pod's Ready follows the lower cluster's reachability.
    {
        let (ctx, mut changes, stop) = (ctx.clone(), reach.subscribe(), stop.clone());
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = stop.cancelled() => return,
                    changed = changes.changed() => if changed.is_err() { return },
                }
                for k in ctx.upper_pods.keys() {
                    ctx.queue.add(k);
                }
            }
        });
    }
    for k in ctx
        .upper_pods
        .keys()
        .into_iter()
        .chain(ctx.lower_pods.keys())
    {
        queue.add(k);
    }
    let mut tasks = Vec::new();
    for _ in 0..workers {
        tasks.push(tokio::spawn(worker(
            ctx.clone(),
            queue.clone(),
            rx.clone(),
            stop.clone(),
        )));
    }
    for t in tasks {
        let _ = t.await;
    }
}

async fn worker(ctx: Arc<Ctx>, queue: Queue<Key>, rx: Receiver<Key>, stop: CancellationToken) {
    while let Some((key, waited)) = queue.next(&rx, &stop).await {
        ctx.metrics.observe("queue_wait", waited);
        let t0 = std::time::Instant::now();
        let result = reconcile(&ctx, &key).await;
        ctx.metrics.observe("reconcile", t0.elapsed());
        let ok = match &result {
            Ok(()) => true,
            Err(failure) => ctx.failed(&queue, &key, failure),
        };
        queue.done(key, ok);
    }
}

impl Ctx {
    /// Carries out what follows from `failure` of pod `key` ([`policy`]): the Warning event
    /// and the log line; whether the queue takes it as done (else it backs off).
    fn failed(&self, queue: &Queue<Key>, key: &Key, failure: &Failure) -> bool {
        let then = policy(failure, failing_for(queue, key));
        if let Some(reason) = then.event
            && let Some(u) = self.upper_pods.get(&key.0, &key.1)
        {
            self.event(&u, true, reason, failure.to_string());
        }
        let (ns, pod, kind) = (&key.0, &key.1, failure.error.kind());
        match then.level {
            Level::Debug => {
                tracing::debug!(namespace = %ns, pod = %pod, kind, error = %failure, "pod sync failed")
            }
            Level::Info => {
                tracing::info!(namespace = %ns, pod = %pod, kind, error = %failure, "pod sync failed")
            }
            Level::Warn => {
                tracing::warn!(namespace = %ns, pod = %pod, kind, error = %failure, "pod sync failed")
            }
        }
        then.then == Then::Done
    }

    fn lower_cluster(&self) -> Cluster {
        Cluster::Lower(self.cfg.lower_name.clone())
    }

    /// `doing` the lower `kind` `ns/name`.
    fn lower_call(&self, doing: &'static str, kind: &str, ns: &str, name: &str) -> Call {
        Call::new(doing, kind, ns, name, self.lower_cluster())
    }

    /// Whether to hold a Pending status back for now ([`Holds`]); while held, the key comes
    /// back once the window is over (asked again at every look: a look in between, which the
    /// queue runs at once, takes the key out of its wait).
    fn hold_status(&self, key: &Key) -> bool {
        match self.held_statuses.hold(key, std::time::Instant::now()) {
            Hold::Newly(left) | Hold::Still(left) => {
                self.queue.add_after(key.clone(), left);
                true
            }
            Hold::Over => false,
        }
    }

    fn release_status(&self, key: &Key) {
        self.held_statuses.release(key);
    }

    fn upper_api(&self, ns: &str) -> Api<Pod> {
        Api::namespaced(self.cfg.upper.clone(), ns)
    }

    fn lower_api(&self, ns: &str) -> Api<Pod> {
        Api::namespaced(self.cfg.lower.clone(), ns)
    }

    /// Queues an event about `pod` (sent in the background; a reconcile never waits for it).
    fn event(&self, pod: &Pod, warning: bool, reason: &str, note: String) {
        self.recorder.publish(PodEvent {
            regarding: pod.object_ref(&()),
            warning,
            reason: reason.to_owned(),
            note,
        });
    }

    /// Sets our condition on the upper pod to False for `reason` (no write when it already
    /// says so; `tensile-core` decides).
    async fn upper_condition(
        &self,
        pod: &Pod,
        reason: &str,
        message: &str,
    ) -> Result<(), SyncError> {
        let now = Time(Timestamp::now());
        let Some(conditions) = not_offloaded_conditions(pod, reason, message, &now) else {
            return Ok(());
        };
        let (ns, name) = key_of(pod).ok_or_else(unnamed)?;
        let patch = if reason == REASON_PROVIDER_FAILED {
            provider_failed_patch(&conditions, message)
        } else {
            json!({"status": {"conditions": conditions}})
        };
        self.upper_api(&ns)
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .map_err(|e| SyncError::api(upper_status(&ns, &name), e))?;
        Ok(())
    }
}

/// A pod without a name or namespace (never so for one read from an API server).
fn unnamed() -> SyncError {
    SyncError::Invalid("pod without name".into())
}

/// Writing the status of upper pod `ns/name`.
fn upper_status(ns: &str, name: &str) -> Call {
    Call::new("writing the status of", "Pod", ns, name, Cluster::Upper)
}

async fn reconcile(ctx: &Ctx, key: &Key) -> Result<(), Failure> {
    let result = reconcile_pod(ctx, key).await;
    if let Some(tokens) = &ctx.tokens {
        // From the caches as they are now: a lower pod the step just deleted still holds its
        // Secret until its delete event brings the key back.
        let (ns, name) = key;
        let (upper, lower) = (ctx.upper_pods.get(ns, name), ctx.lower_pods.get(ns, name));
        tokens
            .collect(key, upper.as_ref(), lower.as_ref())
            .await
            .map_err(|e| SyncError::tokens(e, ns, name, &ctx.cfg.lower_name))?;
    }
    result
}

/// One step of the pod `key` (see [`pod_step`]).
async fn reconcile_pod(ctx: &Ctx, key: &Key) -> Result<(), Failure> {
    let (ns, name) = key;
    let upper = ctx.upper_pods.get(ns, name);
    let lower = ctx.lower_pods.get(ns, name);
    let now = Time(Timestamp::now());
    let gone_grace = ctx.gone_grace.lock().ok().and_then(|mut m| m.remove(key));
    let step = pod_step(
        upper.as_ref(),
        lower.as_ref(),
        &ctx.cfg.translate,
        &ctx.cfg.lower_name,
        gone_grace,
        &now,
    )
    .map_err(|e| {
        // Only a pod with a lower copy is compared: what fails is carrying its change down.
        let error = match e {
            UpdateError::Translate(e) => SyncError::Invalid(Box::new(e)),
            UpdateError::NotOurs(foreign) => SyncError::Ownership {
                kind: "Pod",
                namespace: foreign.namespace,
                name: foreign.name,
                cluster: ctx.lower_cluster(),
            },
        };
        Failure::new(Op::Update, error)
    })?;
    if !matches!(&step, PodStep::Sync { status: Some(s), .. } if may_coalesce(s)) {
        ctx.release_status(key);
    }
    if upper.is_none()
        && let Ok(mut sent) = ctx.env_sent.lock()
    {
        sent.remove(key);
    }
    // Each step that needs a pod has it: `pod_step` only returns them when it is there.
    let (Some(u), l) = (upper.as_ref(), lower.as_ref()) else {
        return match (step, lower.as_ref()) {
            (PodStep::DeleteLower { grace, .. }, Some(l)) => Ok(delete_lower(ctx, l, grace).await?),
            _ => Ok(()),
        };
    };
    match step {
        PodStep::Nothing => Ok(()),
        PodStep::DeleteLower {
            grace,
            upper_deleting,
        } => {
            let Some(l) = l else { return Ok(()) };
            // As virtual-kubelet: a failure is on the upper pod, where its owner looks.
            delete_lower(ctx, l, grace)
                .await
                .map_err(|e| Failure::new(Op::Delete, e))?;
            if upper_deleting {
                ctx.event(
                    u,
                    false,
                    EVENT_PROVIDER_DELETE_SUCCESS,
                    format!("deleting the pod in lower cluster {}", ctx.cfg.lower_name),
                );
            }
            Ok(())
        }
        PodStep::FinishUpperDeletion => Ok(force_delete_upper(ctx, u).await?),
        PodStep::NotOffloaded(why) => Ok(ctx
            .upper_condition(u, REASON_NOT_OFFLOADED, &why.to_string())
            .await?),
        // Created already; the lower watch will bring the key back when it shows the pod.
        PodStep::Create
            if ctx.created.pending(
                key,
                u.metadata.uid.as_deref().unwrap_or_default(),
                std::time::Instant::now(),
            ) =>
        {
            Ok(())
        }
        PodStep::Create => match create_lower(ctx, u).await {
            Ok(()) => {
                ctx.event(
                    u,
                    false,
                    EVENT_PROVIDER_CREATE_SUCCESS,
                    format!("created in lower cluster {}", ctx.cfg.lower_name),
                );
                Ok(())
            }
            Err(e) => {
                // The status says it whatever the kind (`kubectl get` shows ProviderFailed),
                // but a moment's wait for a copy; the event follows from the kind (the
                // worker's `policy`).
                if !e.is_quiet_wait() {
                    let _ = ctx
                        .upper_condition(u, REASON_PROVIDER_FAILED, &e.to_string())
                        .await;
                }
                Err(Failure::new(Op::Create, e))
            }
        },
        PodStep::MarkLost(status) => {
            ctx.upper_api(ns)
                .patch_status(
                    name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"status": status})),
                )
                .await
                .map_err(|e| SyncError::api(upper_status(ns, name), e))?;
            Ok(())
        }
        PodStep::DeleteUpper { grace } => {
            let dp = DeleteParams {
                grace_period_seconds: grace.and_then(|g| u32::try_from(g).ok()),
                ..DeleteParams::default()
            };
            match ctx.upper_api(ns).delete(name, &dp).await {
                Ok(_) => Ok(()),
                Err(e) if not_found(&e) => Ok(()),
                Err(e) => {
                    let call = Call::new(
                        "deleting (its lower pod was deleted)",
                        "Pod",
                        ns,
                        name,
                        Cluster::Upper,
                    );
                    Err(SyncError::api(call, e).into())
                }
            }
        }
        PodStep::Conflict => Err(Failure::new(
            Op::Create,
            SyncError::Ownership {
                kind: "Pod",
                namespace: ns.clone(),
                name: name.clone(),
                cluster: ctx.lower_cluster(),
            },
        )),
        // The lower pod's state is unknown: the upper pod is not Ready (nothing else changes).
        PodStep::Sync { .. } if let Some(message) = ctx.reach.message() => {
            let Some(conditions) = unreachable_conditions(u, &message, &Time(Timestamp::now()))
            else {
                return Ok(());
            };
            ctx.upper_api(ns)
                .patch_status(
                    name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"status": {"conditions": conditions}})),
                )
                .await
                .map_err(|e| SyncError::api(upper_status(ns, name), e))?;
            Ok(())
        }
        PodStep::Sync { update, status } => {
            let status = status.filter(|s| !(may_coalesce(s) && ctx.hold_status(key)));
            sync_existing(ctx, (u, l), &update, status).await?;
            Ok(sync_tokens(ctx, u, l).await?)
        }
    }
}

/// Keeps the upper tokens of a pod whose lower copy exists current (with upper identity).
async fn sync_tokens(ctx: &Ctx, u: &Pod, l: Option<&Pod>) -> Result<(), SyncError> {
    let (Some(tokens), Some(l)) = (&ctx.tokens, l) else {
        return Ok(());
    };
    if u.metadata.deletion_timestamp.is_some() || l.metadata.deletion_timestamp.is_some() {
        return Ok(());
    }
    let (ns, name) = key_of(u).ok_or_else(unnamed)?;
    let t0 = std::time::Instant::now();
    let result = tokens.sync(u).await;
    ctx.metrics.observe("upper_tokens", t0.elapsed());
    result.map_err(|e| SyncError::tokens(e, &ns, &name, &ctx.cfg.lower_name))
}

/// Carries a [`PodStep::Sync`] out: the lower patch, ephemeral containers, the upper status.
async fn sync_existing(
    ctx: &Ctx,
    (u, l): (&Pod, Option<&Pod>),
    update: &PodUpdate,
    status: Option<Box<PodStatus>>,
) -> Result<(), Failure> {
    let (ns, name) = key_of(u).ok_or_else(unnamed)?;
    let (ns_ref, name_ref) = (ns.as_str(), name.as_str());
    let update_failed = |doing| {
        move |e| {
            let call = ctx.lower_call(doing, "Pod", ns_ref, name_ref);
            Failure::new(Op::Update, SyncError::api(call, e))
        }
    };
    if let Some(patch) = &update.patch {
        ctx.lower_api(&ns)
            .patch(&name, &PatchParams::default(), &Patch::Strategic(patch))
            .await
            .map_err(update_failed("updating"))?;
        ctx.event(
            u,
            false,
            EVENT_PROVIDER_UPDATE_SUCCESS,
            "updated the lower pod".into(),
        );
    }
    if let Some(ephemeral) = &update.ephemeral_containers {
        // A container added with `kubectl debug` gets its environment events too (the
        // library's since v1.6); those of the pod's own containers were sent already.
        send_env_events(ctx, u, &ns, &name).await;
        let ephemeral = ephemeral_dependencies(ctx, &ns, l, ephemeral)
            .await
            .map_err(|e| Failure::new(Op::Update, e))?;
        let patch = json!({"spec": {"ephemeralContainers": ephemeral}});
        ctx.lower_api(&ns)
            .patch_subresource(
                "ephemeralcontainers",
                &name,
                &PatchParams::default(),
                &Patch::Strategic(patch),
            )
            .await
            .map_err(update_failed("adding ephemeral containers to"))?;
    }
    if let Some(conditions) = &update.gate_conditions {
        // The lower kubelet counts them into the lower pod's Ready, which then comes back up.
        ctx.lower_api(&ns)
            .patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Strategic(json!({"status": {"conditions": conditions}})),
            )
            .await
            .map_err(|e| {
                let call =
                    ctx.lower_call("setting readiness-gate conditions of", "Pod", &ns, &name);
                SyncError::api(call, e)
            })?;
    }
    if let Some(status) = status {
        let t0 = std::time::Instant::now();
        let written = ctx
            .upper_api(&ns)
            .patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Merge(status_merge_patch(u, &status)),
            )
            .await;
        ctx.metrics.observe("upper_status", t0.elapsed());
        written.map_err(|e| SyncError::api(upper_status(&ns, &name), e))?;
    }
    Ok(())
}

/// The ephemeral containers for the lower pod (`all`: those it has, then the new ones), once
/// the ConfigMaps and Secrets the new ones reference have our copies downstairs, and with their
/// optional references to objects missing upstairs dropped, as for the pod's own containers: a
/// container added with `kubectl debug` reads no lower object that is not ours either.
async fn ephemeral_dependencies(
    ctx: &Ctx,
    ns: &str,
    lower: Option<&Pod>,
    all: &[EphemeralContainer],
) -> Result<Vec<EphemeralContainer>, SyncError> {
    let present: BTreeSet<&str> = lower
        .and_then(|l| l.spec.as_ref())
        .into_iter()
        .flat_map(|s| s.ephemeral_containers.iter().flatten())
        .map(|c| c.name.as_str())
        .collect();
    let (mut kept, new): (Vec<_>, Vec<_>) = all
        .iter()
        .cloned()
        .partition(|c| present.contains(c.name.as_str()));
    let mut spec = PodSpec {
        ephemeral_containers: Some(new),
        ..PodSpec::default()
    };
    let probe = Pod {
        spec: Some(spec.clone()),
        ..Pod::default()
    };
    let mut absent = Absent::default();
    for step in creation_plan(ns, "", &pod_dependencies(&probe)) {
        if matches!(step.kind, LowerKind::ConfigMap | LowerKind::Secret) {
            dependency(ctx, ns, &step, &mut absent).await?;
        }
    }
    drop_absent(&mut spec, &absent);
    kept.extend(spec.ephemeral_containers.unwrap_or_default());
    Ok(kept)
}

async fn delete_lower(ctx: &Ctx, l: &Pod, grace: Option<i64>) -> Result<(), SyncError> {
    let (ns, name) = key_of(l).ok_or_else(unnamed)?;
    let grace = grace.and_then(|g| u32::try_from(g.max(0)).ok());
    delete_exact(&ctx.lower_api(&ns), &name, l.metadata.uid.clone(), grace)
        .await
        .map_err(|e| {
            // The event is on the pod itself: "deleting the pod in lower cluster X", as before.
            let call = Call {
                doing: "deleting",
                object: "the pod".to_owned(),
                cluster: ctx.lower_cluster(),
            };
            SyncError::api(call, e)
        })
}

async fn force_delete_upper(ctx: &Ctx, u: &Pod) -> Result<(), SyncError> {
    let (ns, name) = key_of(u).ok_or_else(unnamed)?;
    delete_exact(&ctx.upper_api(&ns), &name, u.metadata.uid.clone(), Some(0))
        .await
        .map_err(|e| {
            let call = Call::new(
                "finishing the deletion of",
                "Pod",
                &ns,
                &name,
                Cluster::Upper,
            );
            SyncError::api(call, e)
        })
}

/// Creates what the pod needs in the lower cluster, then the pod, in the plan's order.
async fn create_lower(ctx: &Ctx, u: &Pod) -> Result<(), SyncError> {
    let result = create_lower_steps(ctx, u).await;
    if result.is_err()
        && let Some(ns) = &u.metadata.namespace
    {
        ctx.namespaces.forget(ns);
    }
    result
}

async fn create_lower_steps(ctx: &Ctx, u: &Pod) -> Result<(), SyncError> {
    let (ns, name) = key_of(u).ok_or_else(unnamed)?;
    send_env_events(ctx, u, &ns, &name).await;
    let owner = ctx.cfg.translate.owner.clone();
    let deps = pod_dependencies(u);
    let plan = pod_creation_plan(u, &deps).ok_or_else(unnamed)?;
    let pp = PostParams::default();
    // Optional references whose object the upper cluster does not have (or never lets go):
    // left out of the lower pod, so a lower object of the same name is never read.
    let mut absent = Absent::default();
    for step in plan {
        match step.kind {
            LowerKind::Namespace => ctx
                .namespaces
                .ensure(&ns)
                .await
                .map_err(|e| SyncError::namespace(e, "Pod", &name, &ctx.cfg.lower_name))?,
            // The operator creates lower ServiceAccounts by hand: theirs is the one to use.
            LowerKind::ServiceAccount if !ctx.cfg.service_accounts => {}
            LowerKind::ServiceAccount => {
                let account = lower_service_account(&step.name, &ns, &owner);
                create_ours(ctx, step.kind, &ns, &account).await?;
            }
            LowerKind::ConfigMap | LowerKind::Secret | LowerKind::PersistentVolumeClaim => {
                dependency(ctx, &ns, &step, &mut absent).await?;
            }
            LowerKind::Pod => {
                if let Some(tokens) = &ctx.tokens {
                    // With upper identity the three writes are serial, on purpose:
                    // TokenRequest upstairs, then our Secret downstairs, then the pod.
                    // - The token goes into the Secret, so it is requested first.
                    // - The Secret must exist, and be ours, before the pod is created. A lower
                    //   kubelet mounts whatever Secret of that name it finds: one that anybody
                    //   able to write Secrets in the namespace made first, or while our create
                    //   was in flight, would give the pod a token that is not the upper one (a
                    //   kubelet would wait for a Secret that is missing, but not for one that
                    //   is there and not ours). Only our create's answer proves the Secret is
                    //   ours; a pod created at the same time could already run with the other.
                    // So no write is made at the same time as another; what saves round trips
                    // is not writing twice (a Secret already in the cache is not created
                    // again, a pod just created is not created again: `Expected`).
                    let t0 = std::time::Instant::now();
                    let written = tokens.sync(u).await;
                    ctx.metrics.observe("upper_tokens", t0.elapsed());
                    written.map_err(|e| SyncError::tokens(e, &ns, &name, &ctx.cfg.lower_name))?;
                }
                let mut pod = lower_pod(u, &ctx.cfg.translate)
                    .map_err(|e| SyncError::Invalid(Box::new(e)))?;
                if let Some(spec) = pod.spec.as_mut() {
                    drop_absent(spec, &absent);
                }
                let t0 = std::time::Instant::now();
                let created = ctx.lower_api(&ns).create(&pp, &pod).await;
                ctx.metrics.observe("lower_pod_create", t0.elapsed());
                let uid = u.metadata.uid.as_deref().unwrap_or_default();
                match created {
                    Ok(_) => ctx.created.written(
                        (ns.clone(), name.clone()),
                        uid,
                        std::time::Instant::now(),
                    ),
                    Err(e) if already_exists(&e) => {
                        let existing = ctx.lower_api(&ns).get(&name).await.map_err(|e| {
                            let call = ctx.lower_call("reading the existing", "Pod", &ns, &name);
                            SyncError::api(call, e)
                        })?;
                        match on_existing(LowerKind::Pod, &existing.metadata, &owner, uid) {
                            Existing::Ours => ctx.created.written(
                                (ns.clone(), name.clone()),
                                uid,
                                std::time::Instant::now(),
                            ),
                            // Ours, of an earlier upper pod of the name: gone now, and its
                            // deletion brings the key back (the cache was behind).
                            Existing::Stale => {
                                delete_lower(ctx, &existing, Some(0)).await?;
                                return Err(SyncError::Conflict {
                                    call: ctx.lower_call("creating", "Pod", &ns, &name),
                                    source: "the lower pod of an earlier upper pod of the name \
                                             is being replaced"
                                        .into(),
                                });
                            }
                            _ => {
                                return Err(SyncError::Ownership {
                                    kind: "Pod",
                                    namespace: ns.clone(),
                                    name: name.clone(),
                                    cluster: ctx.lower_cluster(),
                                });
                            }
                        }
                    }
                    Err(e) => {
                        let call = ctx.lower_call("creating", "Pod", &ns, &name);
                        return Err(SyncError::api(call, e));
                    }
                }
            }
        }
    }
    Ok(())
}

/// Sends the virtual-kubelet library's environment events for the upper pod (what its env and
/// envFrom name that the upper cluster lacks): each one once while it holds, whatever the
/// retries (an event that stopped holding and holds again is sent again).
async fn send_env_events(ctx: &Ctx, u: &Pod, ns: &str, name: &str) {
    let Some(spec) = u.spec.as_ref() else { return };
    let (config_maps, secrets) = env_references(spec);
    let found = |read: Result<Option<BTreeSet<String>>, kube::Error>| match read {
        Ok(Some(keys)) => Found::Keys(keys),
        Ok(None) => Found::NotFound,
        Err(_) => Found::Unreadable,
    };
    let mut upstairs = Upstairs::default();
    let upper = &ctx.cfg.upper;
    for cm in config_maps {
        let read = ctx
            .upper_objects
            .config_maps
            .get_or_fetch(&Api::namespaced(upper.clone(), ns), ns, &cm)
            .await
            .map(|o| o.map(|o| o.data.unwrap_or_default().into_keys().collect()));
        upstairs.config_maps.insert(cm, found(read));
    }
    for secret in secrets {
        let read = ctx
            .upper_objects
            .secrets
            .get_or_fetch(&Api::namespaced(upper.clone(), ns), ns, &secret)
            .await
            .map(|o| o.map(|o| o.data.unwrap_or_default().into_keys().collect()));
        upstairs.secrets.insert(secret, found(read));
    }
    let events = env_events(spec, ns, &upstairs);
    let uid = u.metadata.uid.clone().unwrap_or_default();
    // Only the events the last attempt for this pod did not send.
    let new: Vec<EnvEvent> = {
        let Ok(mut sent) = ctx.env_sent.lock() else {
            return;
        };
        let key = (ns.to_owned(), name.to_owned());
        if events.is_empty() {
            sent.remove(&key);
            return;
        }
        let before: &[EnvEvent] = match sent.get(&key) {
            Some((sent_uid, before)) if *sent_uid == uid => before,
            _ => &[],
        };
        let new = events
            .iter()
            .filter(|e| !before.contains(e))
            .cloned()
            .collect();
        sent.insert(key, (uid, events));
        new
    };
    for e in new {
        ctx.event(u, true, e.reason, e.message);
    }
}

/// Checks that our copy of the ConfigMap, Secret or claim of `step` is in the lower cluster
/// (the copy controller makes it, `crate::copies`, and wakes the pod when it is there), or
/// records in `absent` an optional ConfigMap or Secret that the upper cluster does not have (or
/// never lets go: service-account tokens), so the lower pod is built without it.
async fn dependency(
    ctx: &Ctx,
    ns: &str,
    step: &Step,
    absent: &mut Absent,
) -> Result<(), SyncError> {
    let upper = &ctx.cfg.upper;
    let missing = |kind: &'static str| SyncError::MissingDependency {
        kind,
        namespace: ns.to_owned(),
        name: step.name.clone(),
        why: "not found in the upper cluster",
    };
    let unreadable = |kind: &'static str| {
        move |e| {
            SyncError::api(
                Call::new("reading", kind, ns, &step.name, Cluster::Upper),
                e,
            )
        }
    };
    // The copy of the upper object of `uid`: there, or the pod waits for it.
    let copied = |uid: Option<String>| {
        let what = kind_name(step.kind);
        match ctx
            .copies
            .copy_state(step.kind, ns, &step.name, uid.as_deref())
        {
            CopyState::Ready => Ok(()),
            CopyState::Pending(failed) => Err(SyncError::CopyPending {
                kind: what,
                namespace: ns.to_owned(),
                name: step.name.clone(),
                cluster: ctx.lower_cluster(),
                failed,
            }),
            CopyState::NotOurs => Err(SyncError::Ownership {
                kind: what,
                namespace: ns.to_owned(),
                name: step.name.clone(),
                cluster: ctx.lower_cluster(),
            }),
        }
    };
    match step.kind {
        LowerKind::ConfigMap => match ctx
            .upper_objects
            .config_maps
            .get_or_fetch(&Api::namespaced(upper.clone(), ns), ns, &step.name)
            .await
        {
            Ok(Some(cm)) => copied(cm.metadata.uid)?,
            Ok(None) if step.optional => {
                absent.config_maps.insert(step.name.clone());
            }
            Ok(None) => return Err(missing("configmap")),
            Err(e) => return Err(unreadable("ConfigMap")(e)),
        },
        LowerKind::Secret => match ctx
            .upper_objects
            .secrets
            .get_or_fetch(&Api::namespaced(upper.clone(), ns), ns, &step.name)
            .await
        {
            Ok(Some(s)) => match lower_secret(&s, &ctx.cfg.translate.owner) {
                Ok(_) => copied(s.metadata.uid)?,
                // Service-account tokens belong to the upper cluster: never copied, so
                // missing downstairs by design.
                Err(_) if step.optional => {
                    absent.secrets.insert(step.name.clone());
                }
                // Never copied, so retrying changes nothing: the Secret's (or the pod's) next
                // change brings the pod back.
                Err(e) => return Err(SyncError::Invalid(Box::new(e))),
            },
            Ok(None) if step.optional => {
                absent.secrets.insert(step.name.clone());
            }
            Ok(None) => return Err(missing("secret")),
            Err(e) => return Err(unreadable("Secret")(e)),
        },
        LowerKind::PersistentVolumeClaim => {
            match ctx
                .upper_objects
                .claims
                .get_or_fetch(&Api::namespaced(upper.clone(), ns), ns, &step.name)
                .await
            {
                Ok(Some(pvc)) => copied(pvc.metadata.uid)?,
                // As a kubelet waits for a claim (the original skipped it, and the lower pod
                // mounted a lower claim of that name).
                Ok(None) => return Err(missing("persistentvolumeclaim")),
                Err(e) => return Err(unreadable("PersistentVolumeClaim")(e)),
            }
        }
        LowerKind::Namespace | LowerKind::ServiceAccount | LowerKind::Pod => {}
    }
    Ok(())
}

/// Creates our lower `object` of `kind` in `ns`. One of that name that exists already is used
/// only when it is ours (a restart, or a create that raced); one that is not ours
/// is never used nor touched: the pod waits until it is gone (docs/security.md).
async fn create_ours<K>(ctx: &Ctx, kind: LowerKind, ns: &str, object: &K) -> Result<(), SyncError>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::Serialize
        + serde::de::DeserializeOwned,
{
    let api: Api<K> = Api::namespaced(ctx.cfg.lower.clone(), ns);
    let name = object.meta().name.clone().unwrap_or_default();
    let what = kind_name(kind);
    match api.create(&PostParams::default(), object).await {
        Ok(_) => Ok(()),
        Err(e) if already_exists(&e) => {
            let existing = api.get(&name).await.map_err(|e| {
                SyncError::api(ctx.lower_call("reading the existing", what, ns, &name), e)
            })?;
            let upper_uid = object
                .meta()
                .annotations
                .as_ref()
                .and_then(|a| a.get(ANNOTATION_UPPER_UID))
                .map_or("", String::as_str);
            match on_existing(kind, existing.meta(), &ctx.cfg.translate.owner, upper_uid) {
                Existing::Ours | Existing::UseAsIs | Existing::Sibling => Ok(()),
                Existing::Stale | Existing::Conflict => Err(SyncError::Ownership {
                    kind: what,
                    namespace: ns.to_owned(),
                    name,
                    cluster: ctx.lower_cluster(),
                }),
            }
        }
        Err(e) => Err(SyncError::api(
            ctx.lower_call("creating", what, ns, &name),
            e,
        )),
    }
}

/// A kind's name in messages, as `kubectl` spells it.
fn kind_name(kind: LowerKind) -> &'static str {
    match kind {
        LowerKind::Namespace => "Namespace",
        LowerKind::ServiceAccount => "ServiceAccount",
        LowerKind::ConfigMap => "ConfigMap",
        LowerKind::Secret => "Secret",
        LowerKind::PersistentVolumeClaim => "PersistentVolumeClaim",
        LowerKind::Pod => "Pod",
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use tensile_core::keys::{LABEL_OWNER, owner_label_value};

    fn lower(name: &str, owner: Option<&str>) -> Pod {
        let mut p = Pod::default();
        p.metadata.namespace = Some("default".into());
        p.metadata.name = Some(name.into());
        p.metadata.labels = owner.map(|o| {
            [(LABEL_OWNER.to_owned(), owner_label_value(o))]
                .into_iter()
                .collect()
        });
        p
    }

    fn names(events: &[watcher::Event<Pod>]) -> Vec<String> {
        events
            .iter()
            .map(|e| match e {
                watcher::Event::Apply(p) => format!("apply {}", p.metadata.name.clone().unwrap()),
                watcher::Event::Delete(p) => format!("delete {}", p.metadata.name.clone().unwrap()),
                watcher::Event::InitApply(p) => {
                    format!("init {}", p.metadata.name.clone().unwrap())
                }
                watcher::Event::Init => "begin".into(),
                watcher::Event::InitDone => "done".into(),
            })
            .collect()
    }

    #[tokio::test]
    async fn only_our_lower_pods_reach_the_cache_and_a_pod_that_loses_our_label_leaves_it() {
        let store = CompactCache::<Pod>::new();
        let run = |events: Vec<watcher::Event<Pod>>, store: CompactCache<Pod>| async move {
            ours_only(futures::stream::iter(events), "vk", store)
                .collect::<Vec<_>>()
                .await
        };
        let listed = run(
            vec![
                watcher::Event::Init,
                watcher::Event::InitApply(lower("mine", Some("vk"))),
                watcher::Event::InitApply(lower("other-node", Some("vk-2"))),
                watcher::Event::InitApply(lower("foreign", None)),
                watcher::Event::InitDone,
            ],
            store.clone(),
        )
        .await;
        assert_eq!(names(&listed), ["begin", "init mine", "done"]);
        for e in &listed {
            store.apply(e);
        }
        let changes = run(
            vec![
                watcher::Event::Apply(lower("foreign", None)),
                watcher::Event::Delete(lower("foreign", None)),
                watcher::Event::Apply(lower("mine", None)),
                watcher::Event::Apply(lower("new", Some("vk"))),
            ],
            store,
        )
        .await;
        assert_eq!(names(&changes), ["delete mine", "apply new"]);
    }
}
