//! The pod controller: upper pods bound to the virtual node and lower pods we created (field
//! selector `spec.nodeName=<node>` upstairs; downstairs our pods, taken from the one shared
//! watch of all lower pods that the capacity tracker reads too). Every change is applied to the
//! [`PodIndex`] and puts the pod's key on a work queue; a worker takes the key, asks the index
//! for the plan (the effects, decided without I/O), and this module's writer carries the
//! effects out against the API servers, mapping failures to [`SyncError`]s.

use std::collections::BTreeSet;
use std::sync::Arc;

use futures::SinkExt as _;
use futures::channel::mpsc::{Receiver as EventReceiver, channel};
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::{EphemeralContainer, Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::Resource;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use serde_json::json;
use tensile_core::absent::{Absent, drop_absent, optional_missing_is_absent};
use tensile_core::deps::{CopyKind, lower_secret, lower_service_account, pod_dependencies};
use tensile_core::env_events::{Found, Upstairs, env_events, env_references};
use tensile_core::keys::ANNOTATION_UPPER_UID;
use tensile_core::plan::{
    Existing, LowerKind, Step, creation_plan, on_existing, pod_creation_plan,
};
use tensile_core::translate::{TranslateConfig, lower_pod};
use tokio_util::sync::CancellationToken;

use crate::copies::{Dependencies, Shared};
use crate::copy_index::CopyState;
use crate::namespaces::LowerNamespaces;
use crate::needs::Side;
use crate::pod_index::{Effect, Now, Plan, PodIndex, StatusWhy};
use crate::reach::LowerReach;
use crate::sync_error::{Call, Cluster, Failure, Level, Op, SyncError, Then, failing_for, policy};
use crate::sync_metrics::SyncMetrics;
use crate::tokens::{PodHead, PodTokens, TokenWiring};
use tensile_runtime::cache::CompactCache;
use tensile_runtime::clients::{already_exists, delete_exact};
use tensile_runtime::events::{EventSink, PodEvent};
use tensile_runtime::queue::{Queue, Receiver};

/// A pod key: (namespace, name), the same in both clusters.
pub type Key = crate::pod_index::Key;

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

impl std::fmt::Debug for PodSync {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PodSync")
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

/// What the writer and the workers share.
struct Ctx {
    cfg: PodSync,
    /// The decisions' state: both pod caches and the marks.
    index: Arc<PodIndex>,
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

/// What the pod controller is wired to, besides its settings.
pub struct PodWiring {
    /// The upper pods bound to the node (shared with the kubelet API's `/pods`).
    pub upper_pods: CompactCache<Pod>,
    /// Our lower pods (shared with the kubelet API's stats).
    pub lower_pods: CompactCache<Pod>,
    /// What the copy controllers share: upper objects, their watches, our copies, the lower
    /// namespaces, what pods need.
    pub shared: Shared,
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
    ctx: Arc<Ctx>,
    rx: Receiver<Key>,
    /// The pod watches into the index and the queue.
    feed: BoxFuture<'static, ()>,
    /// The token Secrets' watch (nothing without upper identity).
    token_feed: BoxFuture<'static, ()>,
    stop: CancellationToken,
}

impl std::fmt::Debug for PodController {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PodController")
            .field("node", &self.ctx.cfg.node)
            .finish_non_exhaustive()
    }
}

impl PodController {
    /// Wires the controller (no task is started, nothing is read yet): the upper pod watch and
    /// `wiring.lower_events` feed the index and the queue, a change of an upper ConfigMap or
    /// Secret brings back the pods that wait for it, and the tokens' watch is made.
    pub fn new(cfg: PodSync, wiring: PodWiring, stop: CancellationToken) -> Self {
        let PodWiring {
            upper_pods,
            lower_pods,
            shared,
            lower_events,
            metrics,
            reach,
        } = wiring;
        let Shared {
            upper: upper_objects,
            watches,
            copies,
            namespaces,
            needs,
        } = shared;
        let index = Arc::new(PodIndex::new(
            cfg.translate.clone(),
            cfg.lower_name.clone(),
            (upper_pods, lower_pods),
            reach,
        ));
        let upper_stream = {
            let (index, needs) = (index.clone(), needs.clone());
            tensile_runtime::backoff::watch(
                Api::<Pod>::all(cfg.upper.clone()),
                watcher::Config::default().fields(&format!("spec.nodeName={}", cfg.node)),
            )
            .map_ok(move |e| {
                needs.observe(Side::Upper, &e);
                let keys = index.apply_upper(&e);
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
                .filter_map(move |e| futures::future::ready(keep.ours(e)))
                .flat_map(move |e| {
                    needs.observe(Side::Lower, &e);
                    // What the lower cluster reports goes first (urgent): mostly a status to
                    // write up, one request, which should not wait behind a burst of
                    // creations.
                    let keys = index.apply_lower(&e);
                    futures::stream::iter(
                        keys.into_iter().map(|k| Ok::<_, watcher::Error>((k, true))),
                    )
                })
                .boxed()
        };
        let (queue, rx) = Queue::<Key>::with_retry(cfg.retry);
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
                let (needs, queue, index) = (needs.clone(), queue.clone(), index.clone());
                Arc::new(move |key: &Key| {
                    for pod in needs.upper_pods_referencing(kind, key) {
                        if !index.lower_pods().contains(&pod.0, &pod.1) {
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
                upper: cfg.upper.clone(),
                lower: cfg.lower.clone(),
                translate: cfg.translate.clone(),
                lower_name: cfg.lower_name.clone(),
                upper_config_maps: upper_objects.config_maps.clone(),
                metrics: metrics.clone(),
            },
            queue.clone(),
            stop.clone(),
        );
        let recorder = EventSink::start(cfg.upper_events.clone(), "tensile-kube", &cfg.node);
        let ctx = Arc::new(Ctx {
            cfg,
            index,
            upper_objects,
            copies,
            recorder,
            metrics,
            namespaces,
            queue,
            tokens,
        });
        PodController {
            ctx,
            rx,
            feed,
            token_feed,
            stop,
        }
    }

    /// Runs until the stop token: the feeds, and once the caches are complete, the workers
    /// and the reachability follower.
    pub async fn run(self) {
        let PodController {
            ctx,
            rx,
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
                    ctx.index.upper_pods().wait_until_ready(),
                    ctx.index.lower_pods().wait_until_ready(),
                    ctx.tokens.ready(),
                ) => {}
            }
            for k in ctx
                .index
                .upper_pods()
                .keys()
                .into_iter()
                .chain(ctx.index.lower_pods().keys())
            {
                ctx.queue.add(k);
            }
            let workers: Vec<_> = (0..ctx.cfg.workers.max(1))
                .map(|_| tokio::spawn(worker(ctx.clone(), rx.clone(), stop.clone())))
                .collect();
            // Every pod's Ready follows the lower cluster's reachability.
            let mut changes = ctx.index.reach().subscribe();
            loop {
                tokio::select! {
                    () = stop.cancelled() => break,
                    changed = changes.changed() => if changed.is_err() { break },
                }
                for k in ctx.index.upper_pods().keys() {
                    ctx.queue.add(k);
                }
            }
            for w in workers {
                let _ = w.await;
            }
        };
        futures::join!(feed, token_feed, work);
    }
}

/// How many creations one worker carries at once. A creation is up to three writes in series
/// with upper identity (TokenRequest upstairs, identity Secret downstairs, the pod: the order is
/// `PodTokens::write`'s), every other reconcile mostly one; a worker carrying a creation still
/// takes what the lower cluster reports ([`Takes::Urgent`]), so a status to write up never
/// waits for the creations' round trips. One, measured (docs/benchmarks.md, "Where queue_wait
/// comes from"): with two per worker the creations' queue left the node but reappeared in the
/// API servers on two shared cores (their own p50 doubled, lower Running -> upper Running got
/// slower, the node's peak RSS grew by 5-9 MiB), and past ~100 streams towards one API server
/// the requests racing for a second HTTP/2 connection each opened their own (112 sockets in a
/// run with four).
pub const CREATIONS_PER_WORKER: usize = 1;

/// What a worker has in flight: reconciles that create a lower pod (up to
/// [`CREATIONS_PER_WORKER`]) and at most one other.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct InFlight {
    creations: usize,
    others: usize,
}

/// Which keys a worker takes next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Takes {
    /// None: it has another reconcile in flight.
    Nothing,
    /// Those of the urgent lane only: it is full of creations, but what the lower cluster
    /// reported (mostly a status to write up, one request) does not wait for them.
    Urgent,
    /// Any (the key's plan is only known once it is taken).
    Any,
}

impl InFlight {
    /// Which keys the worker takes now.
    pub(crate) fn takes(self) -> Takes {
        if self.others > 0 {
            Takes::Nothing
        } else if self.creations < CREATIONS_PER_WORKER {
            Takes::Any
        } else {
            Takes::Urgent
        }
    }

    fn add(&mut self, creates: bool, by: isize) {
        let n = if creates {
            &mut self.creations
        } else {
            &mut self.others
        };
        *n = n.saturating_add_signed(by);
    }
}

/// The `op` label of a failure of part `op` (`tensile_pod_sync_failures_total`).
fn op_label(op: Op) -> &'static str {
    match op {
        Op::Create => "create",
        Op::Update => "update",
        Op::Delete => "delete",
        Op::Other => "other",
    }
}

/// Whether `plan` creates the lower pod (the reconcile of a creation).
fn creates(plan: &Result<Plan, Failure>) -> bool {
    plan.as_ref()
        .is_ok_and(|p| p.effects.iter().any(|e| matches!(e, Effect::CreateLower)))
}

/// Takes keys, plans, carries the plans out; the queue learns how each went. A worker has one
/// reconcile in flight, or up to [`CREATIONS_PER_WORKER`] creations and at most one other
/// ([`InFlight`]): the writes of a creation are serial, a status write of another pod need not
/// wait for them.
async fn worker(ctx: Arc<Ctx>, rx: Receiver<Key>, stop: CancellationToken) {
    let queue = ctx.queue.clone();
    let mut running = futures::stream::FuturesUnordered::new();
    let mut in_flight = InFlight::default();
    let finish =
        |(key, creates, result, t0): (Key, bool, Result<(), Failure>, std::time::Instant),
         in_flight: &mut InFlight| {
            ctx.metrics.observe("reconcile", t0.elapsed());
            ctx.metrics
                .reconciled(&key, result.as_ref().err().map(|f| op_label(f.op)));
            in_flight.add(creates, -1);
            let ok = match &result {
                Ok(()) => true,
                Err(failure) => ctx.failed(&queue, &key, failure),
            };
            queue.done(key, ok);
        };
    loop {
        tokio::select! {
            biased;
            Some(done) = running.next() => finish(done, &mut in_flight),
            next = async {
                match in_flight.takes() {
                    Takes::Urgent => queue.next_urgent(&rx, &stop).await,
                    _ => queue.next(&rx, &stop).await,
                }
            }, if in_flight.takes() != Takes::Nothing => {
                let Some((key, waited)) = next else { break };
                ctx.metrics.observe("queue_wait", waited);
                let t0 = std::time::Instant::now();
                let plan = Box::new(ctx.index.plan(&key, &Now::system()));
                let creates = creates(&plan);
                in_flight.add(creates, 1);
                let ctx = ctx.clone();
                running.push(async move {
                    let result = reconcile(&ctx, &key, plan).await;
                    (key, creates, result, t0)
                });
            }
        }
    }
    // Stopping: what is in flight finishes (a creation cut between its Secret and its pod
    // would leave the Secret to the next start's collection).
    while let Some(done) = running.next().await {
        finish(done, &mut in_flight);
    }
}

impl Ctx {
    /// Carries out what follows from `failure` of pod `key` ([`policy`]): the Warning event
    /// and the log line; whether the queue takes it as done (else it backs off).
    fn failed(&self, queue: &Queue<Key>, key: &Key, failure: &Failure) -> bool {
        let then = policy(failure, failing_for(queue, key));
        if let Some(reason) = then.event
            && let Some(u) = self.index.upper_pods().get(&key.0, &key.1)
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
async fn reconcile(ctx: &Ctx, key: &Key, plan: Box<Result<Plan, Failure>>) -> Result<(), Failure> {
    let result = match *plan {
        Ok(plan) => Box::pin(execute(ctx, key, plan)).await,
        Err(failure) => Err(failure),
    };
    Box::pin(collect_tokens(ctx, key)).await?;
    result
}

/// Deletes the token Secrets of pod `key` that no pod needs, from the caches as they are now:
/// a lower pod the plan just deleted still holds its Secret until its delete event brings the
/// key back. Only the few fields that decide it are decoded ([`PodHead`]).
async fn collect_tokens(ctx: &Ctx, key: &Key) -> Result<(), SyncError> {
    if !ctx.tokens.has_secrets(key) {
        return Ok(());
    }
    let (ns, name) = key;
    let head = |cache: &CompactCache<Pod>| cache.get_as::<PodHead>(ns, name).map(PodHead::into_pod);
    let (upper, lower) = (head(ctx.index.upper_pods()), head(ctx.index.lower_pods()));
    ctx.tokens
        .collect(key, upper.as_ref(), lower.as_ref())
        .await
}

/// The writer: carries the effects of `plan` out in order; the first failure ends it.
async fn execute(ctx: &Ctx, key: &Key, plan: Plan) -> Result<(), Failure> {
    let (ns, name) = (key.0.as_str(), key.1.as_str());
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
                Box::pin(delete_lower(ctx, (ns, name), uid, grace))
                    .await
                    .map_err(|e| Failure::new(op, e))?
            }
            Effect::ForceDeleteUpper => Box::pin(force_delete_upper(ctx, upper()?)).await?,
            Effect::DeleteUpper { grace } => Box::pin(delete_upper(ctx, (ns, name), grace)).await?,
            Effect::CreateLower => {
                let u = upper()?;
                if let Err(e) = Box::pin(create_lower(ctx, u)).await {
                    // The status says it whatever the kind (`kubectl get` shows
                    // ProviderFailed), but a moment's wait for a copy; the event follows from
                    // the kind (the worker's `policy`).
                    let now = Time(Timestamp::now());
                    if !e.is_quiet_wait()
                        && let Some(patch) = Effect::failed_create_patch(u, &e.to_string(), &now)
                    {
                        let _ = Box::pin(ctx.patch_upper_status(ns, name, patch)).await;
                    }
                    return Err(Failure::new(Op::Create, e));
                }
            }
            Effect::PatchLower(patch) => {
                let api = ctx.lower_api(ns);
                Box::pin(api.patch(name, &PatchParams::default(), &Patch::Strategic(patch)))
                    .await
                    .map_err(|e| update_failed(ctx, "updating", key, e))?;
            }
            Effect::AddEphemeralContainers(all) => {
                let u = upper()?;
                // A container added with `kubectl debug` gets its environment events too (the
                // library's since v1.6); those of the pod's own containers were sent already.
                Box::pin(send_env_events(ctx, u, ns, name)).await;
                let ephemeral = Box::pin(ephemeral_dependencies(ctx, ns, lower.as_ref(), &all))
                    .await
                    .map_err(|e| Failure::new(Op::Update, e))?;
                let patch = json!({"spec": {"ephemeralContainers": ephemeral}});
                let api = ctx.lower_api(ns);
                Box::pin(api.patch_subresource(
                    "ephemeralcontainers",
                    name,
                    &PatchParams::default(),
                    &Patch::Strategic(patch),
                ))
                .await
                .map_err(|e| update_failed(ctx, "adding ephemeral containers to", key, e))?;
            }
            Effect::SetLowerConditions(conditions) => {
                let api = ctx.lower_api(ns);
                let patch = Patch::Strategic(json!({"status": {"conditions": conditions}}));
                Box::pin(api.patch_status(name, &PatchParams::default(), &patch))
                    .await
                    .map_err(|e| {
                        let doing = "setting readiness-gate conditions of";
                        SyncError::api(ctx.lower_call(doing, "Pod", ns, name), e)
                    })?;
            }
            Effect::PatchUpperStatus { patch, why } => {
                let t0 = std::time::Instant::now();
                let written = Box::pin(ctx.patch_upper_status(ns, name, patch)).await;
                if why == StatusWhy::Mirror {
                    ctx.metrics.observe("upper_status", t0.elapsed());
                }
                if let Ok(Some(version)) = written
                    .as_ref()
                    .map(|p| p.metadata.resource_version.clone())
                {
                    ctx.index.status_written(key.clone(), why, version);
                }
                written?;
            }
            Effect::SyncTokens => Box::pin(ctx.tokens.write(upper()?)).await?,
            Effect::Event { reason, note } => ctx.event(upper()?, false, reason, note),
            Effect::RequeueAfter(after) => ctx.queue.add_after(key.clone(), after),
        }
    }
    Ok(())
}

/// A failed write of the lower pod's change.
fn update_failed(ctx: &Ctx, doing: &'static str, (ns, name): &Key, e: kube::Error) -> Failure {
    let call = ctx.lower_call(doing, "Pod", ns, name);
    Failure::new(Op::Update, SyncError::api(call, e))
}

/// Deletes upper pod `ns/name` (its lower pod was deleted downstairs); one already gone is
/// fine.
async fn delete_upper(
    ctx: &Ctx,
    (ns, name): (&str, &str),
    grace: Option<i64>,
) -> Result<(), SyncError> {
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
            Err(SyncError::api(call, e))
        }
    }
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

/// Deletes lower pod `ns/name` of UID `uid` (precondition: only the pod judged).
async fn delete_lower(
    ctx: &Ctx,
    (ns, name): (&str, &str),
    uid: Option<String>,
    grace: Option<i64>,
) -> Result<(), SyncError> {
    let grace = grace.and_then(|g| u32::try_from(g.max(0)).ok());
    delete_exact(&ctx.lower_api(ns), name, uid, grace)
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
    let result = Box::pin(create_lower_steps(ctx, u)).await;
    if result.is_err()
        && let Some(ns) = &u.metadata.namespace
    {
        ctx.namespaces.forget(ns);
    }
    result
}

async fn create_lower_steps(ctx: &Ctx, u: &Pod) -> Result<(), SyncError> {
    let (ns, name) = key_of(u).ok_or_else(unnamed)?;
    Box::pin(send_env_events(ctx, u, &ns, &name)).await;
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
                Box::pin(create_ours(ctx, step.kind, &ns, &account)).await?;
            }
            LowerKind::ConfigMap | LowerKind::Secret | LowerKind::PersistentVolumeClaim => {
                Box::pin(dependency(ctx, &ns, &step, &mut absent)).await?;
            }
            LowerKind::Pod => {
                // With upper identity: the pod's token Secret first, ours, then the pod
                // (`PodTokens::write` says why the writes are serial).
                Box::pin(ctx.tokens.write(u)).await?;
                let mut pod = lower_pod(u, &ctx.cfg.translate)
                    .map_err(|e| SyncError::Invalid(Box::new(e)))?;
                if let Some(spec) = pod.spec.as_mut() {
                    drop_absent(spec, &absent);
                }
                let t0 = std::time::Instant::now();
                let created = Box::pin(ctx.lower_api(&ns).create(&pp, &pod)).await;
                ctx.metrics.observe("lower_pod_create", t0.elapsed());
                let uid = u.metadata.uid.as_deref().unwrap_or_default();
                match created {
                    Ok(_) => ctx.index.created(
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
                            Existing::Ours => ctx.index.created(
                                (ns.clone(), name.clone()),
                                uid,
                                std::time::Instant::now(),
                            ),
                            // Ours, of an earlier upper pod of the name: gone now, and its
                            // deletion brings the key back (the cache was behind).
                            Existing::Stale => {
                                delete_lower(
                                    ctx,
                                    (&ns, &name),
                                    existing.metadata.uid.clone(),
                                    Some(0),
                                )
                                .await?;
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
    let uid = u.metadata.uid.as_deref().unwrap_or_default();
    let key = (ns.to_owned(), name.to_owned());
    let new = ctx.index.env_events_to_send(&key, uid, events);
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
                if not_ours_downstairs(ctx, &ctx.copies.config_maps, "ConfigMap", ns, &step.name)
                    .await?
                {
                    absent.config_maps.insert(step.name.clone());
                }
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
                if not_ours_downstairs(ctx, &ctx.copies.secrets, "Secret", ns, &step.name).await? {
                    absent.secrets.insert(step.name.clone());
                }
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
    ctx: &Ctx,
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
    let lower = Api::<K>::namespaced(ctx.cfg.lower.clone(), ns)
        .get_metadata_opt(name)
        .await
        .map_err(|e| SyncError::api(ctx.lower_call("reading", kind, ns, name), e))?;
    Ok(optional_missing_is_absent(
        lower.as_ref().map(|o| &o.metadata),
        &ctx.cfg.translate.owner,
    ))
}

/// Creates our lower `object` of `kind` in `ns`. One of that name that exists already is used
/// only when it is ours (a restart, or a create that raced); one that is not ours
/// is never used nor touched: the pod waits until it is gone (docs/security.md).
async fn create_ours<K>(ctx: &Ctx, kind: LowerKind, ns: &str, object: &K) -> Result<(), SyncError>
where
    K: LowerObject,
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
    use super::*;

    #[test]
    fn a_worker_takes_keys_while_its_creations_wait_and_urgent_ones_when_full_of_them() {
        let mut in_flight = InFlight::default();
        assert_eq!(in_flight.takes(), Takes::Any);
        // Creations, up to the bound.
        for _ in 0..CREATIONS_PER_WORKER {
            assert_eq!(in_flight.takes(), Takes::Any);
            in_flight.add(true, 1);
        }
        // Full: only what the lower cluster reported (urgent) is taken beside them.
        assert_eq!(in_flight.takes(), Takes::Urgent);
        in_flight.add(false, 1);
        assert_eq!(in_flight.takes(), Takes::Nothing);
        in_flight.add(false, -1);
        in_flight.add(true, -1);
        assert_eq!(in_flight.takes(), Takes::Any);
        // Any other reconcile (a status write, a deletion) is one at a time: the worker takes
        // no key until it is done, whatever creations it has.
        in_flight.add(false, 1);
        assert_eq!(in_flight.takes(), Takes::Nothing);
        in_flight.add(false, -1);
        assert_eq!(in_flight.takes(), Takes::Any);
    }

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
