//! The pod controller: upper pods bound to the virtual node and lower pods we created (field
//! selector `spec.nodeName=<node>` upstairs; downstairs our pods, taken from the one shared
//! watch of all lower pods that the capacity tracker reads too). Every change is applied to the
//! [`PodIndex`] and puts the pod's key on a work queue; a worker takes the key, asks the index
//! for the plan (the effects, decided without I/O), and this module's writer carries the
//! effects out against the API servers, mapping failures to [`SyncError`]s.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, MutexGuard};

use futures::SinkExt as _;
use futures::channel::mpsc::{Receiver as EventReceiver, channel};
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::{EphemeralContainer, Pod, PodSpec, ServiceAccount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::Resource;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use serde_json::json;
use tensile_core::absent::{Absent, drop_absent, optional_missing_is_absent};
use tensile_core::deps::{CopyKind, lower_secret};
use tensile_core::env_events::{Found, Upstairs, env_events, env_references};
use tensile_core::plan::LowerKind;
use tensile_core::translate::TranslateConfig;
use tokio_util::sync::CancellationToken;

use crate::copies::{Dependencies, SharedDependencies};
use crate::creation::{Answer, Ask, Creation, Object, UpperObject, kind_name};
use crate::namespaces::LowerNamespaces;
use crate::needs::Side;
use crate::pod_index::{Effect, Now, Plan, PodIndex, StatusWhy};
use crate::reach::LowerReach;
use crate::sync_error::{Call, Cluster, Failure, Op, SyncError, policy};
use crate::sync_metrics::SyncMetrics;
use crate::tokens::{PodHead, PodTokens, TokenWiring};
use tensile_runtime::api_error::{Level, failing_for};
use tensile_runtime::cache::CompactCache;
use tensile_runtime::clients::{already_exists, delete_exact};
use tensile_runtime::controller::{self, OnFailure, Reconciler, Stage, Workers};
use tensile_runtime::events::{EventSink, PodEvent};
use tensile_runtime::lock::lock;
use tensile_runtime::queue::{Action, Queue, Receiver};
use tokio::time::Instant;

/// A pod key: (namespace, name), the same in both clusters.
pub type Key = crate::pod_index::Key;

fn not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

/// What the controller needs.
pub struct PodSettings {
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
    /// Workers: each carries one reconcile at a time, or up to [`CREATIONS_PER_WORKER`]
    /// creations.
    pub workers: usize,
    /// Create the ServiceAccounts pods use in the lower cluster (`--enable-serviceaccount`);
    /// when false a pod of a missing lower ServiceAccount waits for the operator to create it.
    pub service_accounts: bool,
    /// When a pod whose sync failed is tried again ([`crate::Retry::default`]: 5 ms doubling to
    /// 10 s). A pod waiting for an upper object is also tried again as soon as the object
    /// appears, whatever this says.
    pub retry: crate::Retry,
}

impl std::fmt::Debug for PodSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PodSettings")
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

/// The pod controller's reconciler: the index that decides (behind its one lock) and the
/// writer that carries its plans out against the API servers.
struct PodWriter {
    settings: PodSettings,
    /// The decisions' state: both pod caches and the marks.
    index: Arc<Mutex<PodIndex>>,
    /// The index's caches, for what reads them without deciding (the token collection, the
    /// start-up and reachability sweeps).
    upper_pods: CompactCache<Pod>,
    lower_pods: CompactCache<Pod>,
    /// Upper ConfigMaps and Secrets (the ConfigMap and Secret controller's watches).
    upper_objects: Dependencies,
    /// Our lower copies of them (the same controller's watches).
    copies: Dependencies,
    recorder: EventSink,
    metrics: SyncMetrics,
    /// Lower namespaces known to exist (shared with the Service controller). Forgotten on any
    /// failed creation (the namespace may have gone).
    namespaces: Arc<LowerNamespaces>,
    queue: Queue<Key>,
    /// Upper service-account tokens, with upper identity (`TranslateConfig::upper_api`).
    tokens: PodTokens,
}

fn key_of(p: &Pod) -> Option<Key> {
    Some(Key::new(
        p.metadata.namespace.clone()?,
        p.metadata.name.clone()?,
    ))
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

/// What the pod controller is wired to, besides its settings.
pub struct PodWiring {
    /// The upper pods bound to the node (shared with the kubelet API's `/pods`).
    pub upper_pods: CompactCache<Pod>,
    /// Our lower pods (shared with the kubelet API's stats).
    pub lower_pods: CompactCache<Pod>,
    /// What the copy controllers share: upper objects, their watches, our copies, the lower
    /// namespaces, what pods need.
    pub shared: SharedDependencies,
    /// Every lower pod's events (one consumer of [`lower_pod_events`]).
    pub lower_events: BoxStream<'static, watcher::Event<Pod>>,
    /// Sync stage histograms.
    pub metrics: SyncMetrics,
    /// Whether the lower cluster answers (the node loop's health check).
    pub reach: LowerReach,
}

impl std::fmt::Debug for PodWiring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PodWiring").finish_non_exhaustive()
    }
}

/// The pod controller, built; [`PodController::run`] runs it until its stop token.
pub struct PodController {
    writer: Arc<PodWriter>,
    rx: Receiver<Key>,
    reach: LowerReach,
    /// The pod watches into the index and the queue.
    feed: BoxFuture<'static, ()>,
    /// The token Secrets' watch (nothing without upper identity).
    token_feed: BoxFuture<'static, ()>,
    stop: CancellationToken,
}

impl std::fmt::Debug for PodController {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PodController")
            .field("node", &self.writer.settings.node)
            .finish_non_exhaustive()
    }
}

impl PodController {
    /// Wires the controller (no task is started, nothing is read yet): the upper pod watch and
    /// `wiring.lower_events` feed the index and the queue, a change of an upper ConfigMap or
    /// Secret brings back the pods that wait for it, and the tokens' watch is made.
    pub fn new(settings: PodSettings, wiring: PodWiring, stop: CancellationToken) -> Self {
        let PodWiring {
            upper_pods,
            lower_pods,
            shared,
            lower_events,
            metrics,
            reach,
        } = wiring;
        let SharedDependencies {
            upper: upper_objects,
            watches,
            copies,
            namespaces,
            needs,
        } = shared;
        let index = Arc::new(Mutex::new(PodIndex::new(
            settings.translate.clone(),
            settings.lower_name.clone(),
            (upper_pods.clone(), lower_pods.clone()),
            reach.clone(),
        )));
        let upper_stream = {
            let (index, needs) = (index.clone(), needs.clone());
            tensile_runtime::backoff::watch(
                Api::<Pod>::all(settings.upper.clone()),
                watcher::Config::default().fields(&format!("spec.nodeName={}", settings.node)),
            )
            .map_ok(move |e| {
                needs.observe(Side::Upper, &e);
                let keys = lock(&index, "the pod index").apply_upper(&e);
                futures::stream::iter(
                    keys.into_iter()
                        .map(|k| Ok::<_, watcher::Error>((k, false))),
                )
            })
            .try_flatten()
            .boxed()
        };
        let lower_stream = {
            let (index, keep, needs) = (index.clone(), index.clone(), needs.clone());
            lower_events
                .filter_map(move |e| futures::future::ready(lock(&keep, "the pod index").ours(e)))
                .flat_map(move |e| {
                    needs.observe(Side::Lower, &e);
                    // What the lower cluster reports goes first (urgent): mostly a status to
                    // write up, one request, which should not wait behind a burst of
                    // creations.
                    let keys = lock(&index, "the pod index").apply_lower(&e);
                    futures::stream::iter(
                        keys.into_iter().map(|k| Ok::<_, watcher::Error>((k, true))),
                    )
                })
                .boxed()
        };
        let (queue, rx) = Queue::<Key>::with_retry(settings.retry);
        let feed = {
            let (queue, stop) = (queue.clone(), stop.clone());
            Box::pin(async move {
                let merged = futures::stream::select(upper_stream, lower_stream);
                tensile_runtime::backoff::drain(
                    merged,
                    &stop,
                    "pods",
                    |(k, urgent): (Key, bool)| {
                        if urgent {
                            queue.add_urgent(k);
                        } else {
                            queue.add(k);
                        }
                    },
                )
                .await;
            })
        };
        // A pod that waits for an upper ConfigMap or Secret (not created downstairs yet) is
        // tried again as soon as the object's watch sees it change (appear, above all), not at
        // its next retry.
        {
            let observer = |kind: CopyKind| -> crate::watches::Observer {
                let (needs, queue, lower_pods) = (needs.clone(), queue.clone(), lower_pods.clone());
                Arc::new(move |key: &Key| {
                    for pod in needs.upper_pods_referencing(kind, key) {
                        if !lower_pods.contains(&pod.namespace, &pod.name) {
                            queue.add(pod);
                        }
                    }
                })
            };
            watches.config_maps.observe(observer(CopyKind::ConfigMap));
            watches.secrets.observe(observer(CopyKind::Secret));
            // And as soon as the copy controller has made (or failed to make) a copy it waits
            // for.
            needs.wake_pods(queue.clone());
        }
        let (tokens, token_feed) = PodTokens::new(
            TokenWiring {
                upper: settings.upper.clone(),
                lower: settings.lower.clone(),
                translate: settings.translate.clone(),
                lower_name: settings.lower_name.clone(),
                upper_config_maps: upper_objects.config_maps.clone(),
                metrics: metrics.clone(),
            },
            queue.clone(),
            stop.clone(),
        );
        let recorder = EventSink::start(
            settings.upper_events.clone(),
            "tensile-kube",
            &settings.node,
        );
        let writer = Arc::new(PodWriter {
            settings,
            index,
            upper_pods,
            lower_pods,
            upper_objects,
            copies,
            recorder,
            metrics,
            namespaces,
            queue,
            tokens,
        });
        PodController {
            writer,
            rx,
            reach,
            feed,
            token_feed,
            stop,
        }
    }

    /// Runs until the stop token: the feeds, and once the caches are complete, the workers
    /// and the reachability follower.
    pub async fn run(self) {
        let PodController {
            writer,
            rx,
            reach,
            feed,
            token_feed,
            stop,
        } = self;
        let work = async {
            // Nothing is decided before the caches are complete: an absent lower pod must mean
            // absent.
            tokio::select! {
                () = stop.cancelled() => return,
                _ = futures::future::join3(
                    writer.upper_pods.wait_until_ready(),
                    writer.lower_pods.wait_until_ready(),
                    writer.tokens.ready(),
                ) => {}
            }
            for k in writer
                .upper_pods
                .keys()
                .into_iter()
                .chain(writer.lower_pods.keys())
            {
                writer.queue.add(k);
            }
            let workers = Workers {
                count: writer.settings.workers,
                long_per_worker: CREATIONS_PER_WORKER,
                drain: DRAIN,
            };
            let queue = writer.queue.clone();
            let controller = controller::run(writer.clone(), queue, rx, workers, stop.clone());
            // Every pod's Ready follows the lower cluster's reachability.
            let follow = async {
                let mut changes = reach.subscribe();
                loop {
                    tokio::select! {
                        () = stop.cancelled() => break,
                        changed = changes.changed() => if changed.is_err() { break },
                    }
                    for k in writer.upper_pods.keys() {
                        writer.queue.add(k);
                    }
                }
            };
            futures::join!(controller, follow);
        };
        futures::join!(feed, token_feed, work);
    }
}

/// How many creations one worker carries at once. A creation is up to three writes in series
/// with upper identity (TokenRequest upstairs, identity Secret downstairs, the pod: the order is
/// `PodTokens::write`'s), every other reconcile mostly one; a worker carrying a creation still
/// takes what the lower cluster reports (the urgent lane), so a status to write up never waits
/// for the creations' round trips. One, measured (docs/benchmarks.md, "Where queue_wait comes
/// from"): with two per worker the creations' queue left the node but reappeared in the API
/// servers on two shared cores (their own p50 doubled, lower Running -> upper Running got
/// slower, the node's peak RSS grew by 5-9 MiB), and past ~100 streams towards one API server
/// the requests racing for a second HTTP/2 connection each opened their own (112 sockets in a
/// run with four).
pub const CREATIONS_PER_WORKER: usize = 1;

/// How long the reconciles in flight at a stop may take to finish: a creation cut between its
/// Secret and its pod would leave the Secret to the next start's collection.
const DRAIN: std::time::Duration = std::time::Duration::from_secs(30);

/// The `op` label of a failure of part `op` (`tensile_pod_sync_failures_total`).
fn op_label(op: Op) -> &'static str {
    match op {
        Op::Create => "create",
        Op::Update => "update",
        Op::Delete => "delete",
        Op::Other => "other",
    }
}

/// Whether `plan` creates the lower pod (the reconcile of a creation: a long one).
fn creates(plan: &Result<Plan, Failure>) -> bool {
    plan.as_ref()
        .is_ok_and(|p| p.effects.iter().any(|e| matches!(e, Effect::CreateLower)))
}

impl Reconciler for PodWriter {
    type Key = Key;
    type Plan = Result<Plan, Failure>;
    type Error = Failure;

    fn plan(&self, key: &Key) -> Self::Plan {
        self.index().plan(key, &Now::system())
    }

    fn is_long(&self, plan: &Self::Plan) -> bool {
        creates(plan)
    }

    async fn execute(self: Arc<Self>, key: Key, plan: Self::Plan) -> Result<Action, Failure> {
        let result = reconcile(&self, &key, Box::new(plan)).await;
        self.metrics
            .reconciled(&key, result.as_ref().err().map(|f| op_label(f.op)));
        result.map(|()| Action::Done)
    }

    /// What follows from `failure` of pod `key` ([`policy`]): the Warning event and the log
    /// line; whether the queue takes it as done (else it backs off).
    fn failed(&self, key: &Key, failure: &Failure, since: Option<Instant>) -> OnFailure {
        let then = policy(failure, failing_for(since));
        if let Some(reason) = then.event
            && let Some(u) = self.upper_pods.get(&key.namespace, &key.name)
        {
            self.event(&u, true, reason, failure.to_string());
        }
        let (ns, pod, kind) = (&key.namespace, &key.name, failure.error.kind());
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
        then.on_failure
    }

    fn observe(&self, stage: Stage, took: std::time::Duration) {
        self.metrics.observe(stage.name(), took);
    }
}

impl PodWriter {
    /// The index, locked (see `tensile_runtime::lock`).
    fn index(&self) -> MutexGuard<'_, PodIndex> {
        lock(&self.index, "the pod index")
    }

    fn lower_cluster(&self) -> Cluster {
        Cluster::Lower(self.settings.lower_name.clone())
    }

    /// `doing` the lower `kind` `ns/name`.
    fn lower_call(&self, doing: &'static str, kind: &str, ns: &str, name: &str) -> Call {
        Call::new(doing, kind, ns, name, self.lower_cluster())
    }

    fn upper_api(&self, ns: &str) -> Api<Pod> {
        Api::namespaced(self.settings.upper.clone(), ns)
    }

    fn lower_api(&self, ns: &str) -> Api<Pod> {
        Api::namespaced(self.settings.lower.clone(), ns)
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

    /// Merge-patches the status of upper pod `ns/name`.
    async fn patch_upper_status(
        &self,
        ns: &str,
        name: &str,
        patch: serde_json::Value,
    ) -> Result<Pod, SyncError> {
        self.upper_api(ns)
            .patch_status(name, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .map_err(|e| SyncError::api(upper_status(ns, name), e))
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

/// One look at pod `key`: the index's `plan` for it, carried out; then the token Secrets no
/// pod needs. What each step holds is boxed while it runs, so that a reconcile waiting in a
/// worker costs a few hundred bytes, not the largest step's state (a worker carries several:
/// [`CREATIONS_PER_WORKER`]).
async fn reconcile(
    w: &PodWriter,
    key: &Key,
    plan: Box<Result<Plan, Failure>>,
) -> Result<(), Failure> {
    let result = match *plan {
        Ok(plan) => Box::pin(execute(w, key, plan)).await,
        Err(failure) => Err(failure),
    };
    Box::pin(collect_tokens(w, key)).await?;
    result
}

/// Deletes the token Secrets of pod `key` that no pod needs, from the caches as they are now:
/// a lower pod the plan just deleted still holds its Secret until its delete event brings the
/// key back. Only the few fields that decide it are decoded ([`PodHead`]).
async fn collect_tokens(w: &PodWriter, key: &Key) -> Result<(), SyncError> {
    if !w.tokens.has_secrets(key) {
        return Ok(());
    }
    let Key {
        namespace: ns,
        name,
    } = key;
    let head = |cache: &CompactCache<Pod>| cache.get_as::<PodHead>(ns, name).map(PodHead::into_pod);
    let (upper, lower) = (head(&w.upper_pods), head(&w.lower_pods));
    w.tokens.collect(key, upper.as_ref(), lower.as_ref()).await
}

/// The writer: carries the effects of `plan` out in order; the first failure ends it.
async fn execute(w: &PodWriter, key: &Key, plan: Plan) -> Result<(), Failure> {
    let (ns, name) = (key.namespace.as_str(), key.name.as_str());
    let Plan {
        upper,
        lower,
        effects,
    } = plan;
    // Every effect but a lower pod's deletion is about the upper pod: the index plans them
    // only when it is there.
    let upper = || upper.as_ref().ok_or_else(unnamed);
    for effect in effects {
        match effect {
            Effect::DeleteLower { uid, grace, op } => {
                Box::pin(delete_lower(w, (ns, name), uid, grace))
                    .await
                    .map_err(|e| Failure::new(op, e))?
            }
            Effect::ForceDeleteUpper => Box::pin(force_delete_upper(w, upper()?)).await?,
            Effect::DeleteUpper { grace } => Box::pin(delete_upper(w, (ns, name), grace)).await?,
            Effect::CreateLower => {
                let u = upper()?;
                if let Err(e) = Box::pin(create_lower(w, u)).await {
                    // The status says it whatever the kind (`kubectl get` shows
                    // ProviderFailed), but a moment's wait for a copy; the event follows from
                    // the kind (the worker's `policy`).
                    let now = Time(Timestamp::now());
                    if !e.is_quiet_wait()
                        && let Some(patch) = Effect::failed_create_patch(u, &e.to_string(), &now)
                    {
                        let _ = Box::pin(w.patch_upper_status(ns, name, patch)).await;
                    }
                    return Err(Failure::new(Op::Create, e));
                }
            }
            Effect::PatchLower(patch) => {
                let api = w.lower_api(ns);
                Box::pin(api.patch(name, &PatchParams::default(), &Patch::Strategic(patch)))
                    .await
                    .map_err(|e| update_failed(w, "updating", key, e))?;
            }
            Effect::AddEphemeralContainers(all) => {
                let u = upper()?;
                // A container added with `kubectl debug` gets its environment events too (the
                // library's since v1.6); those of the pod's own containers were sent already.
                Box::pin(send_env_events(w, u, ns, name)).await;
                let ephemeral = Box::pin(ephemeral_dependencies(w, ns, lower.as_ref(), &all))
                    .await
                    .map_err(|e| Failure::new(Op::Update, e))?;
                let patch = json!({"spec": {"ephemeralContainers": ephemeral}});
                let api = w.lower_api(ns);
                Box::pin(api.patch_subresource(
                    "ephemeralcontainers",
                    name,
                    &PatchParams::default(),
                    &Patch::Strategic(patch),
                ))
                .await
                .map_err(|e| update_failed(w, "adding ephemeral containers to", key, e))?;
            }
            Effect::SetLowerConditions(conditions) => {
                let api = w.lower_api(ns);
                let patch = Patch::Strategic(json!({"status": {"conditions": conditions}}));
                Box::pin(api.patch_status(name, &PatchParams::default(), &patch))
                    .await
                    .map_err(|e| {
                        let doing = "setting readiness-gate conditions of";
                        SyncError::api(w.lower_call(doing, "Pod", ns, name), e)
                    })?;
            }
            Effect::PatchUpperStatus { patch, why } => {
                let t0 = std::time::Instant::now();
                let written = Box::pin(w.patch_upper_status(ns, name, patch)).await;
                if why == StatusWhy::Mirror {
                    w.metrics.observe("upper_status", t0.elapsed());
                }
                if let Ok(Some(version)) = written
                    .as_ref()
                    .map(|p| p.metadata.resource_version.clone())
                {
                    w.index().status_written(key.clone(), why, version);
                }
                written?;
            }
            Effect::SyncTokens => Box::pin(w.tokens.write(upper()?)).await?,
            Effect::Event { reason, note } => w.event(upper()?, false, reason, note),
            Effect::RequeueAfter(after) => w.queue.add_after(key.clone(), after),
        }
    }
    Ok(())
}

/// A failed write of the lower pod's change.
fn update_failed(
    w: &PodWriter,
    doing: &'static str,
    Key {
        namespace: ns,
        name,
    }: &Key,
    e: kube::Error,
) -> Failure {
    let call = w.lower_call(doing, "Pod", ns, name);
    Failure::new(Op::Update, SyncError::api(call, e))
}

/// Deletes upper pod `ns/name` (its lower pod was deleted downstairs); one already gone is
/// fine.
async fn delete_upper(
    w: &PodWriter,
    (ns, name): (&str, &str),
    grace: Option<i64>,
) -> Result<(), SyncError> {
    let dp = DeleteParams {
        grace_period_seconds: grace.and_then(|g| u32::try_from(g).ok()),
        ..DeleteParams::default()
    };
    match w.upper_api(ns).delete(name, &dp).await {
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
            Err(SyncError::api(call, e))
        }
    }
}

/// The ephemeral containers for the lower pod (`all`: those it has, then the new ones), once
/// the ConfigMaps and Secrets the new ones reference have our copies downstairs, and with their
/// optional references to objects missing upstairs dropped, as for the pod's own containers: a
/// container added with `kubectl debug` reads no lower object that is not ours either.
async fn ephemeral_dependencies(
    w: &PodWriter,
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
    let settings = &w.settings;
    let mut creation = Creation::dependencies(ns, &spec, &settings.translate, &settings.lower_name);
    let absent = Box::pin(drive(w, &mut creation, Some(ns), None)).await?;
    drop_absent(&mut spec, &absent);
    kept.extend(spec.ephemeral_containers.unwrap_or_default());
    Ok(kept)
}

/// Deletes lower pod `ns/name` of UID `uid` (precondition: only the pod judged).
async fn delete_lower(
    w: &PodWriter,
    (ns, name): (&str, &str),
    uid: Option<String>,
    grace: Option<i64>,
) -> Result<(), SyncError> {
    let grace = grace.and_then(|g| u32::try_from(g.max(0)).ok());
    delete_exact(&w.lower_api(ns), name, uid, grace)
        .await
        .map_err(|e| {
            // The event is on the pod itself: "deleting the pod in lower cluster X", as before.
            let call = Call {
                doing: "deleting",
                object: "the pod".to_owned(),
                cluster: w.lower_cluster(),
            };
            SyncError::api(call, e)
        })
}

async fn force_delete_upper(w: &PodWriter, u: &Pod) -> Result<(), SyncError> {
    let Key {
        namespace: ns,
        name,
    } = key_of(u).ok_or_else(unnamed)?;
    delete_exact(&w.upper_api(&ns), &name, u.metadata.uid.clone(), Some(0))
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

/// Creates what the pod needs in the lower cluster, then the pod: the steps [`Creation`]
/// decides, each carried out by [`answer`].
async fn create_lower(w: &PodWriter, u: &Pod) -> Result<(), SyncError> {
    let settings = &w.settings;
    let mut creation = Creation::pod(
        u,
        &settings.translate,
        &settings.lower_name,
        settings.service_accounts,
    )?;
    let result = Box::pin(drive(
        w,
        &mut creation,
        u.metadata.namespace.as_deref(),
        Some(u),
    ))
    .await;
    if let (Err(e), Some(ns)) = (&result, &u.metadata.namespace) {
        w.namespaces.forget_if_gone(ns, e);
    }
    result.map(drop)
}

/// Runs `creation` (in namespace `ns`, of upper pod `u` if any) to its end; what it left out
/// of the pod as absent.
async fn drive(
    w: &PodWriter,
    creation: &mut Creation,
    ns: Option<&str>,
    u: Option<&Pod>,
) -> Result<Absent, SyncError> {
    let ns = ns.ok_or_else(unnamed)?;
    let mut reply = Answer::Start;
    loop {
        reply = match creation.next(reply)? {
            Ask::Settled(absent) => return Ok(absent),
            Ask::Created => {
                let u = u.ok_or_else(unnamed)?;
                let (key, uid) = (key_of(u).ok_or_else(unnamed)?, u.metadata.uid.as_deref());
                w.index()
                    .created(key, uid.unwrap_or_default(), std::time::Instant::now());
                return Ok(Absent::default());
            }
            ask => Box::pin(answer(w, ns, ask, u)).await?,
        };
    }
}

/// Carries out one step of a creation in namespace `ns` (of upper pod `u`); what it found.
async fn answer(w: &PodWriter, ns: &str, ask: Ask, u: Option<&Pod>) -> Result<Answer, SyncError> {
    let upper = &w.settings.upper;
    let unreadable = |kind: LowerKind, name: &str| {
        let call = Call::new("reading", kind_name(kind), ns, name, Cluster::Upper);
        move |e| SyncError::api(call, e)
    };
    let found = |o: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta>| {
        Answer::Upper(o.map(|m| UpperObject {
            uid: m.uid,
            not_copyable: None,
        }))
    };
    Ok(match ask {
        Ask::EnvEvents => {
            let u = u.ok_or_else(unnamed)?;
            let name = u.metadata.name.as_deref().unwrap_or_default();
            Box::pin(send_env_events(w, u, ns, name)).await;
            Answer::Done
        }
        Ask::EnsureNamespace => {
            let name = u
                .and_then(|u| u.metadata.name.as_deref())
                .unwrap_or_default();
            w.namespaces
                .ensure(ns)
                .await
                .map_err(|e| SyncError::namespace(e, "Pod", name, &w.settings.lower_name))?;
            Answer::Done
        }
        Ask::Create(object) => match object {
            Object::ServiceAccount(account) => {
                Box::pin(create(w, LowerKind::ServiceAccount, ns, &*account)).await?
            }
            Object::Pod(pod) => {
                let t0 = std::time::Instant::now();
                let created = Box::pin(create(w, LowerKind::Pod, ns, &*pod)).await;
                w.metrics.observe("lower_pod_create", t0.elapsed());
                created?
            }
        },
        Ask::ReadExisting(kind, name) => {
            let meta = match kind {
                LowerKind::ServiceAccount => {
                    Api::<ServiceAccount>::namespaced(w.settings.lower.clone(), ns)
                        .get_metadata(&name)
                        .await
                        .map(|m| m.metadata)
                }
                _ => w
                    .lower_api(ns)
                    .get_metadata(&name)
                    .await
                    .map(|m| m.metadata),
            }
            .map_err(|e| {
                let call = w.lower_call("reading the existing", kind_name(kind), ns, &name);
                SyncError::api(call, e)
            })?;
            Answer::Existing(Box::new(meta))
        }
        Ask::ReadUpper(kind, name) => match kind {
            LowerKind::ConfigMap => found(
                w.upper_objects
                    .config_maps
                    .get_or_fetch(&Api::namespaced(upper.clone(), ns), ns, &name)
                    .await
                    .map_err(unreadable(kind, &name))?
                    .map(|o| o.metadata),
            ),
            LowerKind::Secret => {
                let secret = w
                    .upper_objects
                    .secrets
                    .get_or_fetch(&Api::namespaced(upper.clone(), ns), ns, &name)
                    .await
                    .map_err(unreadable(kind, &name))?;
                Answer::Upper(secret.map(|s| {
                    UpperObject {
                        not_copyable: lower_secret(&s, &w.settings.translate.owner)
                            .err()
                            .map(|e| e.to_string()),
                        uid: s.metadata.uid,
                    }
                }))
            }
            _ => found(
                w.upper_objects
                    .claims
                    .get_or_fetch(&Api::namespaced(upper.clone(), ns), ns, &name)
                    .await
                    .map_err(unreadable(kind, &name))?
                    .map(|o| o.metadata),
            ),
        },
        Ask::CopyState(kind, name, uid) => {
            Answer::Copy(w.copies.copy_state(kind, ns, &name, uid.as_deref()))
        }
        Ask::LeaveOut(kind, name) => Answer::LeaveOut(match kind {
            LowerKind::ConfigMap => {
                let cache = &w.copies.config_maps;
                Box::pin(not_ours_downstairs(w, cache, "ConfigMap", ns, &name)).await?
            }
            _ => {
                let cache = &w.copies.secrets;
                Box::pin(not_ours_downstairs(w, cache, "Secret", ns, &name)).await?
            }
        }),
        Ask::WriteTokens => {
            Box::pin(w.tokens.write(u.ok_or_else(unnamed)?)).await?;
            Answer::Done
        }
        Ask::DeleteStalePod(uid) => {
            let name = u
                .and_then(|u| u.metadata.name.as_deref())
                .unwrap_or_default();
            Box::pin(delete_lower(w, (ns, name), uid, Some(0))).await?;
            Answer::Done
        }
        // Ends of a creation: `drive` takes them.
        Ask::Created | Ask::Settled(_) => Answer::Done,
    })
}

/// Creates our lower `object` of `kind` in `ns`: done, or AlreadyExists (whose holder the
/// creation reads and judges).
async fn create<K: LowerObject>(
    w: &PodWriter,
    kind: LowerKind,
    ns: &str,
    object: &K,
) -> Result<Answer, SyncError> {
    let api: Api<K> = Api::namespaced(w.settings.lower.clone(), ns);
    match api.create(&PostParams::default(), object).await {
        Ok(_) => Ok(Answer::Done),
        Err(e) if already_exists(&e) => Ok(Answer::AlreadyExists),
        Err(e) => {
            let name = object.meta().name.as_deref().unwrap_or_default();
            let call = w.lower_call("creating", kind_name(kind), ns, name);
            Err(SyncError::api(call, e))
        }
    }
}

/// Sends the virtual-kubelet library's environment events for the upper pod (what its env and
/// envFrom name that the upper cluster lacks): each one once while it holds, whatever the
/// retries (an event that stopped holding and holds again is sent again).
async fn send_env_events(w: &PodWriter, u: &Pod, ns: &str, name: &str) {
    let Some(spec) = u.spec.as_ref() else { return };
    let (config_maps, secrets) = env_references(spec);
    let found = |read: Result<Option<BTreeSet<String>>, kube::Error>| match read {
        Ok(Some(keys)) => Found::Keys(keys),
        Ok(None) => Found::NotFound,
        Err(_) => Found::Unreadable,
    };
    let mut upstairs = Upstairs::default();
    let upper = &w.settings.upper;
    for cm in config_maps {
        let read = w
            .upper_objects
            .config_maps
            .get_or_fetch(&Api::namespaced(upper.clone(), ns), ns, &cm)
            .await
            .map(|o| o.map(|o| o.data.unwrap_or_default().into_keys().collect()));
        upstairs.config_maps.insert(cm, found(read));
    }
    for secret in secrets {
        let read = w
            .upper_objects
            .secrets
            .get_or_fetch(&Api::namespaced(upper.clone(), ns), ns, &secret)
            .await
            .map(|o| o.map(|o| o.data.unwrap_or_default().into_keys().collect()));
        upstairs.secrets.insert(secret, found(read));
    }
    let events = env_events(spec, ns, &upstairs);
    let uid = u.metadata.uid.as_deref().unwrap_or_default();
    let key = Key::new(ns, name);
    let new = w.index().env_events_to_send(&key, uid, events);
    for e in new {
        w.event(u, true, e.reason, e.message);
    }
}

/// A namespaced object the pod controller reads or writes downstairs.
trait LowerObject:
    Resource<Scope = NamespaceResourceScope, DynamicType = ()>
    + Clone
    + std::fmt::Debug
    + serde::Serialize
    + serde::de::DeserializeOwned
{
}

impl<K> LowerObject for K where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::Serialize
        + serde::de::DeserializeOwned
{
}

/// For an optional reference whose object is missing upstairs: whether the lower cluster holds
/// an object `ns/name` that is not ours (our copies in `cache`, any other's metadata read from
/// the lower API server), so the reference must leave the lower pod (`tensile_core::absent`).
async fn not_ours_downstairs<K>(
    w: &PodWriter,
    cache: &CompactCache<K>,
    kind: &'static str,
    ns: &str,
    name: &str,
) -> Result<bool, SyncError>
where
    K: LowerObject,
{
    // A copy of ours is in the cache; anything else is read as metadata only, so a lower
    // Secret that is not ours never has its data read.
    if cache.contains(ns, name) {
        return Ok(false);
    }
    let lower = Api::<K>::namespaced(w.settings.lower.clone(), ns)
        .get_metadata_opt(name)
        .await
        .map_err(|e| SyncError::api(w.lower_call("reading", kind, ns, name), e))?;
    Ok(optional_missing_is_absent(
        lower.as_ref().map(|o| &o.metadata),
        &w.settings.translate.owner,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_plan_that_creates_the_lower_pod_counts_as_a_creation() {
        let plan = |effects| {
            Ok(Plan {
                effects,
                ..Plan::default()
            })
        };
        assert!(creates(&plan(vec![
            Effect::CreateLower,
            Effect::Event {
                reason: "r",
                note: String::new()
            }
        ])));
        assert!(!creates(&plan(vec![Effect::SyncTokens])));
        assert!(!creates(&plan(Vec::new())));
        let failed: Result<Plan, Failure> =
            Err(Failure::new(Op::Create, SyncError::Invalid("x".into())));
        assert!(!creates(&failed));
    }
}
