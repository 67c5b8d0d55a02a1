//! The built-in control loops of the simulated cluster, each optional: what kube-scheduler and
//! kube-controller-manager do for a real cluster, to the extent tensile-kube's tests and the
//! sandbox need it. They run in-process on the store and write through the same code paths as
//! REST clients (admission, validation, defaults).

/// The `Reconciler` of a controller `$loop` whose `$res` objects own `$owned` ones (their
/// controller reference names kind `$kind`): every object on a full pass and on each tick, the
/// changed objects and the owners of changed owned objects on a batch of changes. The module
/// has `async fn reconcile(state: &State, key: &ObjKey)`.
macro_rules! owner_reconciler {
    ($loop:ident, $res:expr, $owned:expr, $kind:literal) => {
        owner_reconciler!($loop, $res, $owned, $kind, super::OWNER_SETTLE);
    };
    ($loop:ident, $res:expr, $owned:expr, $kind:literal, $settle:expr) => {
        impl super::Reconciler for $loop {
            const SETTLE: std::time::Duration = $settle;

            async fn resync(&mut self, state: &State) {
                for key in super::all_keys(state, $res) {
                    reconcile(state, &key).await;
                }
            }

            async fn changed(
                &mut self,
                state: &State,
                events: Option<&[std::sync::Arc<super::super::store::Event>]>,
            ) {
                let Some(events) = events else {
                    return self.resync(state).await;
                };
                for key in super::changed_owners(events, $res, $owned, $kind) {
                    reconcile(state, &key).await;
                }
            }
        }
    };
}

mod cron;
mod cronjob;
mod daemonset;
mod deployment;
mod disruption;
mod endpoints;
mod fit;
mod gc;
mod job;
mod namespace;
mod nodelifecycle;
mod protection;
mod replicaset;
mod requeue;
mod revisions;
mod scheduler;
mod statefulset;
mod volumes;

pub(super) use cron::Schedule;
pub(super) use cronjob::time_zone as cronjob_time_zone;
pub(super) use disruption::evict;
pub use volumes::{NO_PROVISIONER, provisioned_volume};

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::errors::ApiError;
use super::request::ResourceRoute;
use super::resources::ResId;
use super::rest::{self, DeleteOptions, Query};
use super::store::{Event, ObjKey, StoreError};
use super::{State, UserInfo};

/// Which control loops run.
#[derive(Clone, Debug)]
pub struct Controllers {
    /// Bind pending pods to nodes where they fit (`crates/core` fit predicates).
    pub scheduler: bool,
    /// Mark nodes whose lease expired Unknown and taint them unreachable.
    pub node_lifecycle: bool,
    /// How long a node lease may go unrenewed before the node is Unknown.
    pub node_grace: Duration,
    /// Endpoints and EndpointSlices from ready pods behind Services.
    pub endpoints: bool,
    /// Deployments -> ReplicaSets -> Pods, StatefulSets, DaemonSets, CronJobs ->
    /// Jobs -> Pods, and
    /// PodDisruptionBudgets.
    pub workloads: bool,
    /// Delete dependents of deleted owners, and pods of deleted nodes.
    pub garbage_collector: bool,
    /// Empty and remove terminating namespaces.
    pub namespaces: bool,
    /// The PV controller: bind claims and volumes, release volumes of deleted claims; and the
    /// pvc-protection and pv-protection controllers (finalizers of claims and volumes in use).
    pub persistent_volumes: bool,
    /// The scheduler checks and binds pods' volumes (kube-scheduler's VolumeBinding plugin).
    /// The upper cluster of tensile-kube runs without it: its claims are bound downstairs.
    pub volume_binding: bool,
    /// Scheduler extenders called after the built-in filters (kube-scheduler's HTTP extender
    /// protocol); can also be set while running, `ApiServer::set_scheduler_extenders`.
    pub scheduler_extenders: Vec<SchedulerExtender>,
    /// The scheduler's client-side rate limit (`clientConnection.qps` and `.burst`; defaults
    /// kube-scheduler's, 50 and 100): its Binding writes and pod status patches wait for a
    /// token, as kube-scheduler's do. Extender calls and events do not (kube-scheduler sends
    /// them through other clients).
    pub scheduler_client_qps: f64,
    pub scheduler_client_burst: u32,
}

/// One scheduler extender, as in `KubeSchedulerConfiguration.extenders`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SchedulerExtender {
    /// Base URL (`http://` or `https://`).
    pub url_prefix: String,
    /// Verb of the filter call, if it filters.
    pub filter_verb: Option<String>,
    /// Verb of the prioritize call, if it scores.
    pub prioritize_verb: Option<String>,
    /// Verb of the bind call, if it binds: the scheduler then asks it to bind instead of
    /// binding itself; an error answer leaves the pod pending (`PodScheduled=False`, reason
    /// `SchedulerError`, a `FailedScheduling` event with the extender's message) and it is
    /// retried later, as kube-scheduler does.
    pub bind_verb: Option<String>,
    /// Weight of its scores.
    pub weight: i64,
    /// Send node names only (the extender keeps its own node cache).
    pub node_cache_capable: bool,
    /// Scheduling goes on without it when it fails.
    pub ignorable: bool,
    /// CA of an `https` extender.
    pub ca_pem: Option<String>,
    /// Client certificate presented to it (`tlsConfig.certData`, PEM).
    pub client_cert_pem: Option<String>,
    /// Its key (`tlsConfig.keyData`, PEM).
    pub client_key_pem: Option<String>,
    /// `managedResources` names: when any is given, only pods whose containers (or init
    /// containers) request or limit one of them are sent to it, as kube-scheduler's
    /// `IsInterested`. Written back with `ignoredByScheduler: true`; the simulated fit never
    /// counts tensile's marker (`tensile_core::resources::pod_requests` leaves it out), which is
    /// what that setting does for it in kube-scheduler.
    pub managed_resources: Vec<String>,
}

impl SchedulerExtender {
    /// Whether the scheduler calls this extender for `pod` (JSON): it manages no resource,
    /// or a container of the pod asks for one it manages.
    pub fn is_interested(&self, pod: &serde_json::Value) -> bool {
        if self.managed_resources.is_empty() {
            return true;
        }
        ["/spec/containers", "/spec/initContainers"]
            .into_iter()
            .filter_map(|p| pod.pointer(p).and_then(serde_json::Value::as_array))
            .flatten()
            .flat_map(|c| ["/resources/requests", "/resources/limits"].map(|f| c.pointer(f)))
            .flatten()
            .filter_map(serde_json::Value::as_object)
            .any(|m| self.managed_resources.iter().any(|r| m.contains_key(r)))
    }

    /// This extender as an entry of a KubeSchedulerConfiguration's `extenders` (JSON), the
    /// inverse of [`SchedulerExtender::from_scheduler_config`].
    pub fn to_scheduler_config(&self) -> serde_json::Value {
        use base64::Engine as _;
        let mut e = serde_json::json!({
            "urlPrefix": self.url_prefix,
            "weight": self.weight,
            "nodeCacheCapable": self.node_cache_capable,
            "ignorable": self.ignorable,
        });
        for (key, verb) in [
            ("filterVerb", &self.filter_verb),
            ("prioritizeVerb", &self.prioritize_verb),
            ("bindVerb", &self.bind_verb),
        ] {
            if let Some(v) = verb {
                e[key] = v.clone().into();
            }
        }
        let b64 = |pem: &str| base64::engine::general_purpose::STANDARD.encode(pem);
        let mut tls = serde_json::Map::new();
        for (key, pem) in [
            ("caData", &self.ca_pem),
            ("certData", &self.client_cert_pem),
            ("keyData", &self.client_key_pem),
        ] {
            if let Some(pem) = pem {
                tls.insert(key.into(), b64(pem).into());
            }
        }
        if !tls.is_empty() {
            e["tlsConfig"] = tls.into();
        }
        if !self.managed_resources.is_empty() {
            e["managedResources"] = self
                .managed_resources
                .iter()
                .map(|name| serde_json::json!({"name": name, "ignoredByScheduler": true}))
                .collect();
        }
        e
    }

    /// The `extenders` of a KubeSchedulerConfiguration (as JSON), read as kube-scheduler
    /// reads them: `urlPrefix`, the three verbs, `weight`, `nodeCacheCapable`, `ignorable`,
    /// `managedResources` names, and `tlsConfig.caData`, `certData` and `keyData` (base64 of
    /// PEM). An entry without `urlPrefix` is an error.
    pub fn from_scheduler_config(config: &serde_json::Value) -> Result<Vec<Self>, String> {
        use base64::Engine as _;
        let text = |e: &serde_json::Value, key: &str| {
            e.get(key)
                .and_then(serde_json::Value::as_str)
                .map(str::to_owned)
        };
        let flag = |e: &serde_json::Value, key: &str| {
            e.get(key)
                .and_then(serde_json::Value::as_bool)
                .unwrap_or(false)
        };
        let entries = config
            .get("extenders")
            .and_then(serde_json::Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default();
        entries
            .iter()
            .enumerate()
            .map(|(i, e)| {
                let pem = |key: &str| match e
                    .pointer(&format!("/tlsConfig/{key}"))
                    .and_then(|v| v.as_str())
                {
                    None => Ok(None),
                    Some(data) => base64::engine::general_purpose::STANDARD
                        .decode(data)
                        .ok()
                        .and_then(|b| String::from_utf8(b).ok())
                        .map(Some)
                        .ok_or_else(|| {
                            format!("extenders[{i}].tlsConfig.{key} is not base64 of PEM")
                        }),
                };
                let ca_pem = pem("caData")?;
                let client_cert_pem = pem("certData")?;
                let client_key_pem = pem("keyData")?;
                Ok(Self {
                    url_prefix: text(e, "urlPrefix")
                        .ok_or_else(|| format!("extenders[{i}] has no urlPrefix"))?,
                    filter_verb: text(e, "filterVerb"),
                    prioritize_verb: text(e, "prioritizeVerb"),
                    bind_verb: text(e, "bindVerb"),
                    weight: e
                        .get("weight")
                        .and_then(serde_json::Value::as_i64)
                        .unwrap_or(1),
                    node_cache_capable: flag(e, "nodeCacheCapable"),
                    ignorable: flag(e, "ignorable"),
                    ca_pem,
                    client_cert_pem,
                    client_key_pem,
                    managed_resources: e
                        .get("managedResources")
                        .and_then(serde_json::Value::as_array)
                        .into_iter()
                        .flatten()
                        .filter_map(|r| r.get("name").and_then(serde_json::Value::as_str))
                        .map(str::to_owned)
                        .collect(),
                })
            })
            .collect()
    }
}

impl Default for Controllers {
    fn default() -> Self {
        Self {
            scheduler: true,
            node_lifecycle: true,
            node_grace: Duration::from_secs(40),
            endpoints: true,
            workloads: true,
            garbage_collector: true,
            namespaces: true,
            persistent_volumes: true,
            volume_binding: true,
            scheduler_extenders: Vec::new(),
            scheduler_client_qps: 50.0,
            scheduler_client_burst: 100,
        }
    }
}

impl Controllers {
    /// No control loop at all (a bare API server).
    pub fn none() -> Self {
        Self {
            scheduler: false,
            node_lifecycle: false,
            endpoints: false,
            workloads: false,
            garbage_collector: false,
            namespaces: false,
            persistent_volumes: false,
            volume_binding: false,
            ..Self::default()
        }
    }
}

pub(super) fn start(state: &Arc<State>, stop: &CancellationToken) {
    let c = state.config.controllers.clone();
    let spawn =
        |enabled: bool,
         f: fn(Arc<State>, CancellationToken) -> futures::future::BoxFuture<'static, ()>| {
            if enabled {
                tokio::spawn(f(state.clone(), stop.clone()));
            }
        };
    spawn(c.namespaces, |s, t| Box::pin(namespace::run(s, t)));
    spawn(c.garbage_collector, |s, t| Box::pin(gc::run(s, t)));
    spawn(c.scheduler, |s, t| Box::pin(scheduler::run(s, t)));
    spawn(c.workloads, |s, t| Box::pin(replicaset::run(s, t)));
    spawn(c.workloads, |s, t| Box::pin(deployment::run(s, t)));
    spawn(c.workloads, |s, t| Box::pin(job::run(s, t)));
    spawn(c.workloads, |s, t| Box::pin(statefulset::run(s, t)));
    spawn(c.workloads, |s, t| Box::pin(daemonset::run(s, t)));
    spawn(c.workloads, |s, t| Box::pin(cronjob::run(s, t)));
    spawn(c.workloads, |s, t| Box::pin(disruption::run(s, t)));
    spawn(c.endpoints, |s, t| Box::pin(endpoints::run(s, t)));
    spawn(c.node_lifecycle, |s, t| Box::pin(nodelifecycle::run(s, t)));
    spawn(c.persistent_volumes, |s, t| Box::pin(volumes::run(s, t)));
    spawn(c.persistent_volumes, |s, t| Box::pin(protection::run(s, t)));
}

/// The keys of every stored object of `res` (a controller's full pass).
fn all_keys(state: &State, res: ResId) -> Vec<ObjKey> {
    let (items, _, _) = state.store.list(res, None, None, None, |_| true);
    items
        .iter()
        .map(|e| {
            ObjKey::new(
                super::meta::namespace(&e.object).unwrap_or_default(),
                super::meta::name(&e.object).unwrap_or_default(),
            )
        })
        .collect()
}

/// The objects of `res` a batch of changes concerns: those changed, and the `owner_kind`
/// controllers of changed objects of `owned`.
fn changed_owners(
    events: &[Arc<Event>],
    res: ResId,
    owned: ResId,
    owner_kind: &str,
) -> std::collections::BTreeSet<ObjKey> {
    let mut dirty = std::collections::BTreeSet::new();
    for e in events {
        if e.res == res {
            dirty.insert(e.key.clone());
        } else if e.res == owned
            && (owned != *super::resources::ids::PODS || pod_matters_to_owner(e))
            && let Some((kind, name, _)) = controller_of(&e.entry.object)
            && kind == owner_kind
        {
            dirty.insert(ObjKey::new(&e.key.namespace, name));
        }
    }
    dirty
}

/// Whether a pod event can change what its workload controller reads of it: its existence,
/// labels, owner, deletion, node, phase or readiness. A change elsewhere (the scheduler's
/// `PodScheduled` message, container statuses) cannot; a burst of pending pods retried by the
/// scheduler writes those by the thousand, and each made the controller recount its pods.
fn pod_matters_to_owner(e: &Event) -> bool {
    let Some(prev) = e
        .prev
        .as_ref()
        .filter(|_| e.kind == super::store::EventType::Modified)
    else {
        return true;
    };
    let (a, b) = (&*prev.object, &*e.entry.object);
    fn at<'v>(v: &'v Value, outer: &str, field: &str) -> Option<&'v Value> {
        v.get(outer).and_then(|o| o.get(field))
    }
    fn ready(v: &Value) -> Option<&Value> {
        at(v, "status", "conditions")
            .and_then(Value::as_array)
            .and_then(|c| {
                c.iter()
                    .find(|c| c.get("type").and_then(Value::as_str) == Some("Ready"))
            })
    }
    ["deletionTimestamp", "labels", "ownerReferences"]
        .iter()
        .any(|f| at(a, "metadata", f) != at(b, "metadata", f))
        || at(a, "spec", "nodeName") != at(b, "spec", "nodeName")
        || at(a, "status", "phase") != at(b, "status", "phase")
        || ready(a) != ready(b)
}

/// A new pod from a workload's `template`, named after `owner` (`generateName`), in its
/// namespace, controlled by it (`api_version`, `kind`, `uid`).
fn pod_from_template(
    template: &Value,
    owner: &ObjKey,
    api_version: &str,
    kind: &str,
    uid: &str,
) -> Value {
    let mut pod = serde_json::json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": template.get("metadata").cloned().unwrap_or_else(|| serde_json::json!({})),
        "spec": template.get("spec").cloned().unwrap_or_else(|| serde_json::json!({}))});
    let m = super::meta::meta_mut(&mut pod);
    m.insert(
        "generateName".into(),
        serde_json::json!(format!("{}-", owner.name)),
    );
    m.insert("namespace".into(), serde_json::json!(owner.namespace));
    m.remove("name");
    m.insert(
        "ownerReferences".into(),
        serde_json::json!([{"apiVersion": api_version, "kind": kind, "name": owner.name,
            "uid": uid, "controller": true, "blockOwnerDeletion": true}]),
    );
    pod
}

/// A stable, short hash of a pod template (or any revision's data), in the alphabet the real
/// controllers use (for `pod-template-hash` and `controller-revision-hash`).
pub(super) fn template_hash(template: &Value) -> String {
    let text = serde_json::to_string(template).unwrap_or_default();
    let mut h: u32 = 0x811c_9dc5;
    for b in text.bytes() {
        h = (h ^ u32::from(b)).wrapping_mul(0x0100_0193);
    }
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut out = String::new();
    let mut x = u64::from(h);
    while out.len() < 10 {
        out.push(ALPHABET[(x % ALPHABET.len() as u64) as usize] as char);
        x /= ALPHABET.len() as u64;
        if x == 0 {
            x = u64::from(h.rotate_left(7)) + 1;
        }
    }
    out
}

/// An event about `obj` as a kube-controller-manager loop records it (core/v1, with its
/// component as source, first and last timestamps and a count).
async fn record_event(
    state: &State,
    obj: &Value,
    component: &str,
    type_: &str,
    reason: &str,
    message: &str,
) {
    use super::meta;
    let (Some(namespace), Some(name)) = (meta::namespace(obj), meta::name(obj)) else {
        return;
    };
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let now = meta::now();
    let event = serde_json::json!({
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": format!("{name}.{nanos:x}"), "namespace": namespace},
        "involvedObject": {"apiVersion": obj.get("apiVersion"), "kind": obj.get("kind"),
            "namespace": namespace, "name": name, "uid": meta::meta_str(obj, "uid"),
            "resourceVersion": meta::meta_str(obj, "resourceVersion")},
        "type": type_, "reason": reason, "message": message,
        "source": {"component": component},
        "firstTimestamp": now, "lastTimestamp": now, "count": 1,
        "reportingComponent": component, "reportingInstance": "",
    });
    if let Err(e) = create(
        state,
        *super::resources::ids::EVENTS,
        Some(namespace),
        event,
        component,
    )
    .await
    {
        tracing::debug!(object = %name, error = ?e, "recording a controller event");
    }
}

/// The identity controllers act as.
fn system_user(name: &str) -> UserInfo {
    UserInfo {
        username: format!("system:{name}"),
        uid: String::new(),
        groups: vec!["system:masters".into(), "system:authenticated".into()],
    }
}

fn route(res: ResId, namespace: Option<&str>) -> ResourceRoute {
    ResourceRoute {
        res,
        namespace: namespace.map(str::to_owned),
        name: None,
        subresource: None,
        rest: String::new(),
        watch_prefix: false,
    }
}

/// Creates an object as a client would (defaults, admission, validation).
async fn create(
    state: &State,
    res: ResId,
    namespace: Option<&str>,
    obj: Value,
    who: &str,
) -> Result<Value, ApiError> {
    rest::create(
        state,
        &route(res, namespace),
        obj,
        &Query::default(),
        &system_user(who),
    )
    .await
}

/// Deletes an object as a client would.
fn delete(
    state: &State,
    res: ResId,
    key: &ObjKey,
    opts: &DeleteOptions,
) -> Result<Value, ApiError> {
    rest::delete_object(state, res, key, opts)
}

/// Read-modify-write of an object without admission (status and controller-owned fields);
/// retried on conflicts; no write when `f` leaves it unchanged. `f` returning false skips it.
fn modify(
    state: &State,
    res: ResId,
    key: &ObjKey,
    mut f: impl FnMut(&mut Value) -> bool,
) -> Result<(), StoreError> {
    for _ in 0..16 {
        let Some(current) = state.store.get(res, key) else {
            return Err(StoreError::NotFound);
        };
        let mut new = (*current.object).clone();
        if !f(&mut new) || new == *current.object {
            return Ok(());
        }
        match state.store.replace(res, key.clone(), new, Some(current.rv)) {
            Ok(_) => return Ok(()),
            Err(StoreError::Conflict) => continue,
            Err(e) => return Err(e),
        }
    }
    Err(StoreError::Conflict)
}

/// A control loop: a full pass over the current objects, and incremental work per batch of
/// changes (or per tick, with no batch, for time-based rules).
trait Reconciler: Send {
    /// How long a batch of changes waits for more before it is handled (none by default).
    const SETTLE: Duration = Duration::ZERO;

    /// Everything, from the current objects (at start and after the history was lost).
    fn resync(&mut self, state: &State) -> impl Future<Output = ()> + Send;
    /// A batch of changes, or `None` on a tick.
    fn changed(
        &mut self,
        state: &State,
        events: Option<&[Arc<Event>]>,
    ) -> impl Future<Output = ()> + Send;
}

/// How long the workload controllers let changes of their pods gather before recounting:
/// a recount reads every pod of the workload, so at thousands of replicas one per pod event
/// was most of a burst's CPU. kube-controller-manager's work queue folds the changes that
/// arrive while a sync waits in the same way.
const OWNER_SETTLE: Duration = Duration::from_millis(50);

/// Runs a reconciler on the store's events until stopped.
async fn run_loop<R: Reconciler>(
    state: Arc<State>,
    stop: CancellationToken,
    every: Duration,
    mut r: R,
) {
    'outer: loop {
        let start = state.store.current_rv();
        r.resync(&state).await;
        let Ok(mut cursor) = state.store.watch_from(start) else {
            continue;
        };
        let mut ticker = tokio::time::interval(every);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                batch = cursor.next_batch() => match batch {
                    Ok(mut batch) => {
                        if !R::SETTLE.is_zero() {
                            tokio::select! {
                                () = stop.cancelled() => return,
                                () = tokio::time::sleep(R::SETTLE) => {}
                            }
                            match cursor.take() {
                                Ok(more) => batch.extend(more),
                                Err(_) => continue 'outer,
                            }
                        }
                        r.changed(&state, Some(&batch)).await
                    }
                    Err(_) => continue 'outer,
                },
                _ = ticker.tick() => r.changed(&state, None).await,
            }
        }
    }
}

/// `metadata.ownerReferences[*].uid` of an object.
fn owner_uids(obj: &Value) -> impl Iterator<Item = &str> {
    obj.pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|r| r.get("uid").and_then(Value::as_str))
}

/// The controller owner reference of an object (kind, name, uid).
fn controller_of(obj: &Value) -> Option<(&str, &str, &str)> {
    obj.pointer("/metadata/ownerReferences")?
        .as_array()?
        .iter()
        .find_map(|r| {
            (r.get("controller").and_then(Value::as_bool) == Some(true)).then(|| {
                (
                    r.get("kind").and_then(Value::as_str).unwrap_or_default(),
                    r.get("name").and_then(Value::as_str).unwrap_or_default(),
                    r.get("uid").and_then(Value::as_str).unwrap_or_default(),
                )
            })
        })
}

#[cfg(test)]
mod tests {
    use super::SchedulerExtender;
    use serde_json::json;

    #[test]
    fn a_workload_recounts_only_for_pod_changes_it_reads() {
        use super::super::resources::ids;
        use super::super::store::{Entry, Event, EventType, ObjKey};
        use std::sync::Arc;
        let pod = |phase: &str, message: &str| {
            json!({"metadata": {"name": "p", "namespace": "ns", "ownerReferences": [
                    {"kind": "ReplicaSet", "name": "rs", "uid": "u", "controller": true}]},
                "status": {"phase": phase, "conditions": [
                    {"type": "PodScheduled", "status": "False", "message": message}]}})
        };
        let event = |kind, prev: Option<serde_json::Value>, now: serde_json::Value| {
            let entry = |v: serde_json::Value| Entry {
                object: Arc::new(v),
                json: Default::default(),
                rv: 1,
            };
            Arc::new(Event {
                rv: 2,
                res: *ids::PODS,
                kind,
                key: ObjKey::new("ns", "p"),
                entry: entry(now),
                prev: prev.map(entry),
            })
        };
        let owners = |e| super::changed_owners(&[e], *ids::REPLICASETS, *ids::PODS, "ReplicaSet");
        let rs = std::collections::BTreeSet::from([ObjKey::new("ns", "rs")]);
        let retried = event(
            EventType::Modified,
            Some(pod("Pending", "0/3 nodes")),
            pod("Pending", "0/4 nodes"),
        );
        assert!(owners(retried).is_empty(), "a scheduler message alone");
        let running = event(
            EventType::Modified,
            Some(pod("Pending", "m")),
            pod("Running", "m"),
        );
        assert_eq!(owners(running), rs);
        assert_eq!(
            owners(event(EventType::Added, None, pod("Pending", "m"))),
            rs
        );
        assert_eq!(
            owners(event(EventType::Deleted, None, pod("Pending", "m"))),
            rs
        );
    }

    #[test]
    fn extenders_are_read_as_kube_scheduler_reads_them() {
        let config = json!({"extenders": [
            {"urlPrefix": "https://x:1", "filterVerb": "filter", "bindVerb": "bind",
             "weight": 5, "ignorable": true, "tlsConfig": {"caData": "UEVN"}},
            {"urlPrefix": "http://y"}
        ]});
        let got = SchedulerExtender::from_scheduler_config(&config).unwrap();
        assert_eq!(
            got[0],
            SchedulerExtender {
                url_prefix: "https://x:1".into(),
                filter_verb: Some("filter".into()),
                prioritize_verb: None,
                bind_verb: Some("bind".into()),
                weight: 5,
                node_cache_capable: false,
                ignorable: true,
                ca_pem: Some("PEM".into()),
                client_cert_pem: None,
                client_key_pem: None,
                managed_resources: Vec::new(),
            }
        );
        assert_eq!(got[1].weight, 1);
        assert!(SchedulerExtender::from_scheduler_config(&json!({"extenders": [{}]})).is_err());
        let bad_ca = json!({"extenders": [{"urlPrefix": "u", "tlsConfig": {"caData": "%%"}}]});
        assert!(SchedulerExtender::from_scheduler_config(&bad_ca).is_err());
    }

    #[test]
    fn extenders_written_for_kube_scheduler_read_back_the_same() {
        let config = json!({"extenders": [
            {"urlPrefix": "https://x:1", "filterVerb": "filter", "prioritizeVerb": "p",
             "bindVerb": "bind", "weight": 5, "nodeCacheCapable": true,
             "tlsConfig": {"caData": "UEVN", "certData": "Q0VSVA==", "keyData": "S0VZ"}},
            {"urlPrefix": "http://y", "ignorable": true,
             "managedResources": [{"name": "example.com/r", "ignoredByScheduler": true}]}
        ]});
        let read = SchedulerExtender::from_scheduler_config(&config).unwrap();
        let written: Vec<_> = read
            .iter()
            .map(SchedulerExtender::to_scheduler_config)
            .collect();
        assert_eq!(written[0]["tlsConfig"]["caData"], "UEVN");
        assert_eq!(written[0]["tlsConfig"]["certData"], "Q0VSVA==");
        assert_eq!(read[0].client_key_pem.as_deref(), Some("KEY"));
        assert!(written[1].get("filterVerb").is_none());
        let again =
            SchedulerExtender::from_scheduler_config(&json!({ "extenders": written })).unwrap();
        assert_eq!(again, read);
    }
}
