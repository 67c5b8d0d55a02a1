//! The virtual Node: registered in the upper cluster, its status (capacity from the live model,
//! health of the lower cluster) patched when it changes, its Lease in `kube-node-lease` renewed
//! like a kubelet's (every 10 s, 40 s duration, owned by the Node).

use std::time::Duration;

use futures::{Stream, StreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use serde_json::json;
use std::collections::BTreeSet;
use std::sync::atomic::AtomicU64;
use tensile_core::capacity::CapacityModel;
use tensile_core::node::{LowerHealth, NodeIdentity, merged_taints, node_health, virtual_node};
use tensile_core::resources::ResourceVector;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::reach::LowerReach;
use k8s_openapi::api::core::v1::ObjectReference;
use tensile_core::reach::{REASON_ERRORS, errors_message, health_event, unreachable_message};
use tensile_runtime::cache::{Key, ListedKeys};
use tensile_runtime::events::{EventSink, PodEvent};
use tensile_runtime::leader::locate;

/// Settings of the node loop.
#[derive(Clone, Debug)]
pub struct NodeLoop {
    /// Identity, labels, taint, addresses.
    pub identity: NodeIdentity,
    /// Owner id: lower pods with this owner are not subtracted from capacity.
    pub owner: String,
    /// Report NotReady after the lower cluster has been unreachable this long (None: never).
    pub not_ready_after: Option<Duration>,
    /// Lease renewal period.
    pub lease_renew: Duration,
    /// Node status heartbeat when nothing changes.
    pub heartbeat: Duration,
    /// This process's `holderIdentity` on the node's Lease ([`holder_identity`]): another
    /// process holding a fresh lease makes this one wait or refuse to start ([`check_lease`]).
    pub holder_identity: String,
    /// Started by `--leader-elect` after winning the election lease: then the node lease is
    /// taken over whoever holds it, instead of refusing to start.
    pub leader_elected: bool,
    /// The API-call counters of the node's clients: the lower cluster's error answers (429,
    /// 5xx) between two looks make the node say it answers with errors.
    pub api_calls: tensile_runtime::clients::ApiCalls,
}

/// The cluster name the lower clients are counted under.
pub const LOWER: &str = "lower";

/// Another process holds the node's Lease: this one must not run the node too.
#[derive(Debug, thiserror::Error)]
#[error(
    "virtual node {node} is already run by another process: its lease kube-node-lease/{node} is held by {holder} ({place}), last renewed at {renewed}; a second process with the same --nodename would overwrite its kubelet endpoint and pods. Stop the other one, or give this one another --nodename"
)]
pub struct LeaseHeld {
    /// The node.
    pub node: String,
    /// The other process's `holderIdentity`.
    pub holder: String,
    /// Where it runs, as far as this process can tell.
    pub place: String,
    /// Its last renewal.
    pub renewed: Timestamp,
    /// When its hold expires without another renewal.
    pub until: Timestamp,
}

/// Starting was refused or could not check the lease.
#[derive(Debug, thiserror::Error)]
pub enum LeaseCheckError {
    /// Another process holds it.
    #[error(transparent)]
    Held(#[from] LeaseHeld),
    /// The lease could not be read.
    #[error("reading the node lease kube-node-lease/{node}: {source}")]
    Read {
        /// The node.
        node: String,
        /// Why.
        #[source]
        source: kube::Error,
    },
    /// Stopped while waiting for another holder's lease to lapse.
    #[error("stopped while waiting for the lease kube-node-lease/{node} held by {holder}")]
    Stopped {
        /// The node.
        node: String,
        /// Who held it.
        holder: String,
    },
}

/// How often a lease held elsewhere is read again while waiting for it to lapse: a holder
/// that stops cleanly releases it, and the wait then ends at once.
const LEASE_RECHECK: Duration = Duration::from_secs(2);

/// Before anything of the node starts: returns when this process may run the node. A missing,
/// released, expired or own lease is taken; so is one of a dead predecessor on this host or in
/// this pod (a crash, `kill -9`, a container restart), at once. A live other process here is
/// refused (an error). A holder this process cannot look at (another host or pod) is waited
/// out, re-reading the lease, until it lapses or is released.
pub async fn check_lease(
    upper: &kube::Client,
    cfg: &NodeLoop,
    stop: &CancellationToken,
) -> Result<(), LeaseCheckError> {
    use tensile_core::lease::HolderIs;
    let leases: Api<Lease> = Api::namespaced(upper.clone(), "kube-node-lease");
    let name = &cfg.identity.name;
    let mut waiting_for: Option<String> = None;
    loop {
        let lease = leases
            .get_opt(name)
            .await
            .map_err(|source| LeaseCheckError::Read {
                node: name.clone(),
                source,
            })?;
        let Some(held) = tensile_core::lease::held_by_other(
            lease.as_ref().map(|l| &l.spec).and_then(Option::as_ref),
            &cfg.holder_identity,
            Timestamp::now(),
        ) else {
            if let Some(holder) = waiting_for {
                tracing::info!(node = %name, %holder, "the other holder's node lease lapsed or was released: starting");
            }
            return Ok(());
        };
        let refuse = |place: String| LeaseHeld {
            node: name.clone(),
            holder: held.holder.clone(),
            place,
            renewed: held.renewed,
            until: held.until,
        };
        match locate(&held.holder, &cfg.holder_identity) {
            HolderIs::ThisProcess => return Err(refuse("in this process".to_owned()).into()),
            HolderIs::LiveHere => {
                let pid = tensile_core::lease::parse_holder(&held.holder).map_or(0, |h| h.pid);
                return Err(refuse(format!("process {pid} on this host, running")).into());
            }
            HolderIs::DeadHere => {
                tracing::info!(node = %name, holder = %held.holder, renewed = %held.renewed,
                    "the previous process of this node is gone (same host or pod, its process no longer runs): taking its lease over at once");
                return Ok(());
            }
            HolderIs::Elsewhere => {
                if waiting_for.as_deref() != Some(held.holder.as_str()) {
                    tracing::warn!(node = %name, holder = %held.holder, renewed = %held.renewed, until = %held.until,
                        "the node lease is held by a process on another host or pod (or of another version): waiting until it lapses or is released before starting; if that process still runs, stop it or give this one another --nodename");
                    waiting_for = Some(held.holder.clone());
                }
                let left = Timestamp::now().duration_until(held.until);
                let pause = Duration::try_from(left)
                    .unwrap_or(Duration::ZERO)
                    .min(LEASE_RECHECK)
                    .max(Duration::from_millis(100));
                tokio::select! {
                    () = stop.cancelled() => {
                        return Err(LeaseCheckError::Stopped { node: name.clone(), holder: held.holder });
                    }
                    () = tokio::time::sleep(pause) => {}
                }
            }
        }
    }
}

/// The least time between two capacity-driven status patches (a burst of lower pod events
/// becomes one patch, not one per event).
const MIN_STATUS_INTERVAL: Duration = Duration::from_secs(1);

/// How often an unreachable lower cluster is asked again whether it answers.
const UNREACHABLE_RECHECK: Duration = Duration::from_secs(1);

/// Capacity published by the tracker: (total, largest fit on one node).
pub type Capacity = (ResourceVector, ResourceVector);

/// The capacity model's Prometheus gauges, per resource (`cpu` in cores, `memory` and
/// `ephemeral-storage` in bytes, `pods` and extended resources in units):
/// `tensile_node_capacity{resource}` (what the node publishes as capacity and allocatable) and
/// `tensile_node_requested{resource}` (what the pods it created downstairs request, their pod
/// slots included): capacity used is their ratio. Clones share the values.
#[derive(Clone, Debug, Default)]
pub struct CapacityMetrics {
    capacity: Family<ResourceLabel, Gauge<f64, AtomicU64>>,
    requested: Family<ResourceLabel, Gauge<f64, AtomicU64>>,
    /// The resources this clone reported in each, to zero those that go.
    reported: (BTreeSet<String>, BTreeSet<String>),
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResourceLabel {
    resource: String,
}

impl CapacityMetrics {
    /// The gauges, registered in `registry`.
    pub fn new(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "tensile_node_capacity",
            "Capacity the virtual node publishes, per resource (cpu in cores, memory in bytes, pods in pods)",
            m.capacity.clone(),
        );
        registry.register(
            "tensile_node_requested",
            "What the pods the virtual node created in its lower cluster request, per resource (units of tensile_node_capacity)",
            m.requested.clone(),
        );
        m
    }

    /// Sets every resource of `now` in `family` and zeroes those of `reported` no longer in it
    /// (the last counted node with them went).
    fn set(
        family: &Family<ResourceLabel, Gauge<f64, AtomicU64>>,
        reported: &mut BTreeSet<String>,
        now: &ResourceVector,
    ) {
        for gone in reported.iter().filter(|r| !now.contains(r)) {
            family
                .get_or_create(&ResourceLabel {
                    resource: gone.clone(),
                })
                .set(0.0);
        }
        for (resource, nanos) in now.iter() {
            if !reported.contains(resource) {
                reported.insert(resource.to_owned());
            }
            family
                .get_or_create(&ResourceLabel {
                    resource: resource.to_owned(),
                })
                .set(units(nanos));
        }
    }

    fn update(&mut self, capacity: &ResourceVector, requested: &ResourceVector) {
        Self::set(&self.capacity, &mut self.reported.0, capacity);
        Self::set(&self.requested, &mut self.reported.1, requested);
    }
}

/// Nano-units as units, for a gauge (precision beyond f64's is of no use there).
#[allow(clippy::cast_precision_loss)]
fn units(nanos: i128) -> f64 {
    nanos as f64 / 1e9
}

/// Feeds the capacity model from a watch of lower nodes and the shared stream of lower pod
/// events (never a re-list) and publishes the totals when they change, also to `metrics`.
pub async fn track_capacity(
    lower: kube::Client,
    owner: String,
    pods: impl Stream<Item = watcher::Event<Pod>> + Send + 'static,
    tx: watch::Sender<Capacity>,
    mut metrics: CapacityMetrics,
    stop: CancellationToken,
) {
    let nodes =
        tensile_runtime::backoff::watch(Api::<Node>::all(lower), watcher::Config::default())
            .map(|e| e.map(|e| Either::Node(Box::new(e))));
    let pods = pods.map(|e| Ok(Either::Pod(Box::new(e))));
    let mut events = futures::stream::select(nodes.boxed(), pods.boxed());
    let mut model = CapacityModel::new(owner);
    let (mut listed_nodes, mut listed_pods) = (ListedKeys::default(), ListedKeys::default());
    loop {
        let next = tokio::select! {
            () = stop.cancelled() => return,
            n = events.next() => n,
        };
        let Some(event) = next else { return };
        // The watcher retries by itself, with the backoff of every watch of ours.
        let Ok(event) = event else { continue };
        match event {
            Either::Node(e) => apply_node_event(&mut model, &mut listed_nodes, &e),
            Either::Pod(e) => apply_pod_event(&mut model, &mut listed_pods, &e),
        }
        let now = (model.total(), model.largest_fit());
        metrics.update(&now.0, &model.requested_ours());
        tx.send_if_modified(|cur| {
            if *cur == now {
                false
            } else {
                *cur = now.clone();
                true
            }
        });
    }
}

enum Either {
    Node(Box<watcher::Event<Node>>),
    Pod(Box<watcher::Event<Pod>>),
}

/// Applies a lower node event to the model; a completed re-list also drops the nodes it no
/// longer lists (deleted while the watch was down).
fn apply_node_event(model: &mut CapacityModel, listed: &mut ListedKeys, e: &watcher::Event<Node>) {
    for key in listed.record(e) {
        model.remove_node(&key.name);
    }
    match e {
        watcher::Event::Apply(n) | watcher::Event::InitApply(n) => drop(model.apply_node(n)),
        watcher::Event::Delete(n) => {
            model.remove_node(n.metadata.name.as_deref().unwrap_or_default())
        }
        watcher::Event::Init | watcher::Event::InitDone => {}
    }
}

/// Applies a lower pod event to the model, as [`apply_node_event`] does for nodes.
fn apply_pod_event(model: &mut CapacityModel, listed: &mut ListedKeys, e: &watcher::Event<Pod>) {
    for Key { namespace, name } in listed.record(e) {
        model.remove_pod(&namespace, &name);
    }
    match e {
        watcher::Event::Apply(p) | watcher::Event::InitApply(p) => drop(model.apply_pod(p)),
        watcher::Event::Delete(p) => model.remove_pod(
            p.metadata.namespace.as_deref().unwrap_or_default(),
            p.metadata.name.as_deref().unwrap_or_default(),
        ),
        watcher::Event::Init | watcher::Event::InitDone => {}
    }
}

/// Registers the node and keeps its status and lease current until `stop`; tells `reach` and,
/// with events on the Node, the upper cluster whether the lower cluster answers. At `stop` the
/// lease is released, so a replacement process may start at once.
pub async fn run_node(
    upper: kube::Client,
    lower: kube::Client,
    mut cfg: NodeLoop,
    mut capacity: watch::Receiver<Capacity>,
    reach: LowerReach,
    events: EventSink,
    stop: CancellationToken,
) {
    let nodes: Api<Node> = Api::all(upper.clone());
    let leases: Api<Lease> = Api::namespaced(upper.clone(), "kube-node-lease");
    let name = cfg.identity.name.clone();
    let mut health = LowerHealth::Reachable;
    let mut ticker = tokio::time::interval(cfg.lease_renew);
    let mut last_status = tokio::time::Instant::now() - cfg.heartbeat;
    let mut published: Option<serde_json::Value> = None;
    // Once refused (NodeRestriction), our taints are not written again.
    let mut taints_refused = false;
    let mut pending = false;
    let mut capacity_open = true;
    let mut last_warning: Option<tokio::time::Instant> = None;
    let mut node_uid: Option<String> = None;
    // Set when the wake-up is a recheck of an unreachable lower cluster, or a probe after a
    // lower request went unanswered (not a lease tick).
    let mut recheck = false;
    // The lower cluster's error answers and requests at the last lease tick, and when.
    let mut last_answers = (
        cfg.api_calls.error_answers(LOWER),
        cfg.api_calls.cluster_total(LOWER),
        tokio::time::Instant::now(),
    );
    // A lower request or watch that got no answer (refused, reset) makes the probe ask at
    // once whether the lower cluster still answers: an outage shorter than the lease tick (an
    // API server restart takes seconds) shows on the node too. What it finds waits here until
    // the loop, maybe busy writing upstairs meanwhile, shows it.
    let mut probe = spawn_probe(lower.clone(), cfg.api_calls.clone(), stop.clone());
    let mut probe_open = true;
    let mut observed: Option<String> = None;
    loop {
        // Capacity changes are patched at most once per `MIN_STATUS_INTERVAL`; the changes in
        // between are folded into the next patch.
        let capacity_changed = tokio::select! {
            () = stop.cancelled() => {
                release_lease(&leases, &name, &cfg.holder_identity).await;
                return;
            }
            _ = ticker.tick() => false,
            r = capacity.changed(), if capacity_open => match r {
                Ok(()) => {
                    if last_status.elapsed() < MIN_STATUS_INTERVAL {
                        pending = true;
                        continue;
                    }
                    true
                }
                Err(_) => {
                    capacity_open = false;
                    continue;
                }
            },
            () = tokio::time::sleep_until(last_status + MIN_STATUS_INTERVAL), if pending => true,
            // While the lower cluster does not answer, it is asked again every second, so the
            // node shows it back within a second or two of an outage's end, not at the next
            // lease renewal (up to 10 s later).
            () = tokio::time::sleep(UNREACHABLE_RECHECK), if matches!(health, LowerHealth::Unreachable { .. }) => {
                recheck = true;
                false
            }
            r = probe.changed(), if probe_open => {
                if r.is_err() {
                    probe_open = false;
                    continue;
                }
                observed = probe.borrow_and_update().clone();
                // While it is known away, the rechecks every second look already.
                if observed.is_none() || matches!(health, LowerHealth::Unreachable { .. }) {
                    observed = None;
                    continue;
                }
                recheck = true;
                false
            }
        };
        pending = false;
        // Ping the lower cluster with every tick: its health decides conditions and taints.
        if !capacity_changed {
            let was = reach.cause();
            // What the probe found stands even if the cluster answers again by now: the
            // outage shows, and the next recheck (a second later) ends it.
            let cause = match observed.take() {
                Some(cause) => Some(cause),
                None => ping(&lower).await,
            };
            // Requests that reached the lower API server and failed there (429, 5xx) since the
            // last look: a server shedding load or losing its etcd answers the ping now and
            // then, and would otherwise look healthy.
            let answers = cfg.api_calls.error_answers(LOWER);
            let requests = cfg.api_calls.cluster_total(LOWER);
            let errors = (!recheck)
                .then(|| {
                    errors_message(
                        reach.cluster(),
                        (
                            answers.throttled.saturating_sub(last_answers.0.throttled),
                            answers.server.saturating_sub(last_answers.0.server),
                        ),
                        requests.saturating_sub(last_answers.1),
                        last_answers.2.elapsed(),
                    )
                })
                .flatten();
            if !recheck {
                last_answers = (answers, requests, tokio::time::Instant::now());
            }
            health = match (&cause, errors) {
                // A probe does not count error answers: one that finds the cluster answering
                // leaves them to the next lease tick.
                (None, None) if recheck && matches!(health, LowerHealth::Erroring { .. }) => health,
                (None, None) => LowerHealth::Reachable,
                (None, Some(message)) => {
                    tracing::warn!(node = %name, %message, "the lower cluster answers with errors");
                    events.publish(PodEvent {
                        regarding: ObjectReference {
                            api_version: Some("v1".into()),
                            kind: Some("Node".into()),
                            name: Some(name.clone()),
                            uid: node_uid.clone(),
                            ..ObjectReference::default()
                        },
                        warning: true,
                        reason: REASON_ERRORS.to_owned(),
                        note: message.clone(),
                    });
                    LowerHealth::Erroring { message }
                }
                (Some(c), _) => unreachable_since(&health, unreachable_message(reach.cluster(), c)),
            };
            if cause.is_some() && was.is_none() {
                tracing::warn!(node = %name, cause = ?cause, cluster = %reach.cluster(), "the lower cluster does not answer");
            }
            let since = last_warning.map(|t| t.elapsed());
            if let Some(ev) = health_event(reach.cluster(), was.as_deref(), cause.as_deref(), since)
            {
                if ev.warning {
                    last_warning = Some(tokio::time::Instant::now());
                }
                events.publish(PodEvent {
                    regarding: ObjectReference {
                        api_version: Some("v1".into()),
                        kind: Some("Node".into()),
                        name: Some(name.clone()),
                        uid: node_uid.clone(),
                        ..ObjectReference::default()
                    },
                    warning: ev.warning,
                    reason: ev.reason.to_owned(),
                    note: ev.note,
                });
            }
            let still_unreachable = cause.is_some();
            // A node started while its lower cluster did not answer has no version yet.
            if cause.is_none()
                && cfg.identity.lower_version.is_empty()
                && let Some(version) = lower_version(&lower).await
            {
                cfg.identity.lower_version = version;
            }
            reach.set(cause);
            // A recheck that finds it as it was (still away, or still answering) changes
            // nothing upstairs.
            if recheck && still_unreachable == was.is_some() {
                recheck = false;
                continue;
            }
        }
        let (total, largest) = capacity.borrow().clone();
        let current = nodes.get_opt(&name).await.ok().flatten();
        let previous = current
            .as_ref()
            .and_then(|n| n.status.as_ref())
            .and_then(|s| s.conditions.clone())
            .unwrap_or_default();
        let now = Time(Timestamp::now());
        let (conditions, taints) = node_health(&health, cfg.not_ready_after, &now, &previous);
        let mut desired = virtual_node(&cfg.identity, &total, &largest, conditions, taints);
        // Our taints only: others' (kubectl taint, the lifecycle controller's) are kept.
        let current_taints = current
            .as_ref()
            .and_then(|n| n.spec.as_ref())
            .and_then(|s| s.taints.clone());
        if let Some(spec) = desired.spec.as_mut() {
            spec.taints = merged_taints(
                current_taints.as_deref(),
                &cfg.identity,
                spec.taints.as_deref(),
            );
        }
        node_uid = match &current {
            None => match nodes.create(&PostParams::default(), &desired).await {
                Ok(n) => n.metadata.uid,
                Err(e) => {
                    tracing::warn!(node = %name, error = %e, "registering the virtual node");
                    continue;
                }
            },
            Some(n) => n.metadata.uid.clone(),
        };
        // Status only when something but the heartbeat changed, or the heartbeat is due.
        let fingerprint = json!({"capacity": desired.status.as_ref().map(|s| &s.capacity), "health": format!("{health:?}"),
            "labels": desired.metadata.labels, "annotations": desired.metadata.annotations, "taints": desired.spec.as_ref().map(|s| &s.taints)});
        let due = last_status.elapsed() >= cfg.heartbeat;
        if current.is_some() && (due || published.as_ref() != Some(&fingerprint)) {
            let taints = desired.spec.as_ref().and_then(|s| s.taints.clone());
            let meta = json!({"metadata": {"labels": desired.metadata.labels, "annotations": desired.metadata.annotations}});
            // Taints apart: NodeRestriction refuses a node identity any change of its own
            // taints, and that refusal must not keep the status (the heartbeat) from going out.
            let taints_written = if taints == current_taints || taints_refused {
                true
            } else {
                // A list is replaced whole by a merge patch: written only against the version
                // it was computed from, so a taint added meanwhile is not lost (a conflict
                // retries at the next tick).
                let patch = json!({"spec": {"taints": taints}, "metadata": {"resourceVersion":
                    current.as_ref().and_then(|n| n.metadata.resource_version.clone())}});
                match nodes
                    .patch(&name, &PatchParams::default(), &Patch::Merge(patch))
                    .await
                {
                    Ok(_) => true,
                    Err(kube::Error::Api(e)) if e.code == 403 => {
                        tracing::warn!(node = %name, error = %e.message,
                            "the upper cluster refuses this node a change of its own taints (NodeRestriction): \
                             the lower cluster's reachability shows in the node's conditions only");
                        taints_refused = true;
                        true
                    }
                    Err(_) => false,
                }
            };
            let status = json!({"status": desired.status});
            let meta_written = nodes
                .patch(&name, &PatchParams::default(), &Patch::Merge(meta))
                .await
                .is_ok();
            let ok = nodes
                .patch_status(&name, &PatchParams::default(), &Patch::Merge(status))
                .await
                .is_ok()
                && meta_written
                && taints_written;
            if ok {
                published = Some(fingerprint);
                last_status = tokio::time::Instant::now();
            }
        } else if current.is_none() {
            published = Some(fingerprint);
            last_status = tokio::time::Instant::now();
        }
        if !capacity_changed && !std::mem::take(&mut recheck) {
            renew_lease(&leases, &name, &cfg.holder_identity, node_uid.as_deref()).await;
        }
    }
}

/// Whether the lower cluster answers: `None` if it does (a 429 or 5xx is an answer, counted
/// with the other error answers), else why not.
async fn ping(lower: &kube::Client) -> Option<String> {
    match tokio::time::timeout(Duration::from_secs(5), lower.apiserver_version()).await {
        Ok(Ok(_)) => None,
        Ok(Err(kube::Error::Api(s))) if s.code == 429 || s.code >= 500 => None,
        Ok(Err(e)) => Some(crate::reach::describe(&e).1),
        Err(_) => Some("timed out after 5 s".to_owned()),
    }
}

/// The lower API server's gitVersion, if it answers within 5 s.
async fn lower_version(lower: &kube::Client) -> Option<String> {
    match tokio::time::timeout(Duration::from_secs(5), lower.apiserver_version()).await {
        Ok(Ok(v)) => Some(v.git_version),
        _ => None,
    }
}

/// Pings the lower cluster when a lower request or watch got no answer (at most once per
/// [`UNREACHABLE_RECHECK`]), in a task of its own: the node loop may be busy writing upstairs
/// for longer than a lower API server takes to restart. Each ping that finds no answer is
/// sent on the channel (`Some(cause)`) for the loop to show.
fn spawn_probe(
    lower: kube::Client,
    api_calls: tensile_runtime::clients::ApiCalls,
    stop: CancellationToken,
) -> watch::Receiver<Option<String>> {
    let (found, rx) = watch::channel(None);
    tokio::spawn(async move {
        let mut unanswered = api_calls.subscribe_unanswered();
        let mut seen = api_calls.unanswered(LOWER);
        let mut last = tokio::time::Instant::now() - UNREACHABLE_RECHECK;
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                r = unanswered.changed() => if r.is_err() { return },
            }
            let n = api_calls.unanswered(LOWER);
            if n == seen {
                continue;
            }
            seen = n;
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep_until(last + UNREACHABLE_RECHECK) => {}
            }
            last = tokio::time::Instant::now();
            if let Some(cause) = ping(&lower).await {
                found.send_replace(Some(cause));
            }
        }
    });
    rx
}

fn unreachable_since(previous: &LowerHealth, reason: String) -> LowerHealth {
    match previous {
        LowerHealth::Unreachable { since, .. } => LowerHealth::Unreachable {
            since: since.clone(),
            reason,
        },
        LowerHealth::Reachable | LowerHealth::Erroring { .. } => LowerHealth::Unreachable {
            since: Time(Timestamp::now()),
            reason,
        },
    }
}

/// Gives the lease up (no holder) if it is still ours, best effort and briefly: a process
/// replacing this one then starts at once instead of waiting for the lease to expire. The
/// renewal time stays, so the node does not look dead meanwhile.
async fn release_lease(leases: &Api<Lease>, name: &str, me: &str) {
    // A JSON patch whose test fails leaves a lease another process took alone.
    let patch = json!([
        {"op": "test", "path": "/spec/holderIdentity", "value": me},
        {"op": "remove", "path": "/spec/holderIdentity"},
    ]);
    let Ok(patch) = serde_json::from_value::<json_patch::Patch>(patch) else {
        return;
    };
    let released = tokio::time::timeout(
        Duration::from_secs(2),
        leases.patch(name, &PatchParams::default(), &Patch::<()>::Json(patch)),
    )
    .await;
    if let Ok(Err(e)) = released {
        tracing::debug!(node = %name, error = %e, "releasing the node lease");
    }
}

/// Renews the lease with one patch; only a missing lease costs a second request (its creation).
async fn renew_lease(leases: &Api<Lease>, name: &str, me: &str, node_uid: Option<&str>) {
    let spec = json!({"holderIdentity": me, "leaseDurationSeconds": 40, "renewTime": MicroTime(Timestamp::now())});
    let renewed = leases
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": spec})),
        )
        .await;
    let missing = match renewed {
        Ok(_) => return,
        Err(kube::Error::Api(s)) if s.code == 404 => true,
        Err(e) => {
            tracing::warn!(node = %name, error = %e, "renewing the node lease");
            false
        }
    };
    if missing {
        let lease: Result<Lease, _> = serde_json::from_value(
            json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": name, "namespace": "kube-node-lease",
                "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": name, "uid": node_uid.unwrap_or_default()}]},
            "spec": spec}),
        );
        if let Ok(lease) = lease
            && let Err(e) = leases.create(&PostParams::default(), &lease).await
        {
            tracing::warn!(node = %name, error = %e, "creating the node lease");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_relist_drops_lower_nodes_and_pods_deleted_while_the_watch_was_down() {
        let node = |name: &str| -> Node {
            serde_json::from_value(json!({"metadata": {"name": name},
                "status": {"allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"},
                    "conditions": [{"type": "Ready", "status": "True"}]}}))
            .unwrap()
        };
        let pod = |name: &str, on: &str| -> Pod {
            serde_json::from_value(json!({"metadata": {"name": name, "namespace": "ns"},
                "spec": {"nodeName": on, "containers": [{"name": "c",
                    "resources": {"requests": {"cpu": "1"}}}]},
                "status": {"phase": "Running"}}))
            .unwrap()
        };
        let mut model = CapacityModel::new(String::new());
        let (mut nodes, mut pods) = (ListedKeys::default(), ListedKeys::default());
        for e in [
            watcher::Event::Init,
            watcher::Event::InitApply(node("a")),
            watcher::Event::InitApply(node("b")),
            watcher::Event::InitDone,
        ] {
            apply_node_event(&mut model, &mut nodes, &e);
        }
        for e in [
            watcher::Event::Init,
            watcher::Event::InitApply(pod("p", "a")),
            watcher::Event::InitDone,
        ] {
            apply_pod_event(&mut model, &mut pods, &e);
        }
        assert_eq!((model.counted_nodes(), model.bound_pods()), (2, 1));
        // The watch restarts; node a and pod p were deleted meanwhile.
        for e in [
            watcher::Event::Init,
            watcher::Event::InitApply(node("b")),
            watcher::Event::InitDone,
        ] {
            apply_node_event(&mut model, &mut nodes, &e);
        }
        for e in [watcher::Event::Init, watcher::Event::InitDone] {
            apply_pod_event(&mut model, &mut pods, &e);
        }
        assert_eq!((model.counted_nodes(), model.bound_pods()), (1, 0));
    }
}
