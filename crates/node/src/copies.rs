//! The controllers that keep lower copies of upper objects, and the only writers of them:
//! - ConfigMaps, Secrets and PersistentVolumeClaims that pods need (always on): our copies exist
//!   exactly while one of our pods needs them (`crate::needs`), created when a pod first needs
//!   one, following their originals, deleted when no pod needs them any more or their original
//!   is gone (claims: see below). The pod controller never writes a copy: it waits until what a
//!   pod needs is there (`crate::copy_index::CopyState`), and is woken when that changes;
//! - with `ServiceControllers`, Services, Endpoints and the EndpointSlices users write (not
//!   Kubernetes' own, which come from the Endpoints): every upper Service outside the filter
//!   is mirrored, created, updated and deleted; the same watches feed the node ports
//!   (`crate::node_ports`);
//! - with `PVControllers`, our lower claims also follow the deletion and expansion of the upper
//!   ones (`tensile_core::volumes::claim_action`), and their changes feed the volume controller
//!   (`crate::volumes`); without it a claim copy is only ever created.
//!
//! Nothing is decided before the caches involved have synced, so at start copies whose original
//! is gone (or that nothing needs) are collected, and nothing else.
//!
//! The decisions are `crate::copy_index` (over `tensile_core::deps::dependency_action` and
//! `tensile_core::services::{service_action, endpoints_action}`); this is the thin writer
//! around it, one per kind: the upper objects (for ConfigMaps and Secrets, one watch per object
//! a pod bound to the node references, `crate::watches`, as the Node authorizer allows a node;
//! for the others one watch of all), one watch of our lower copies (label selector on our
//! owner mark), a keyed queue, a few workers.

use std::fmt::Debug;
use std::sync::Arc;

use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::{ConfigMap, Endpoints, PersistentVolumeClaim, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, PostParams};
use kube::runtime::watcher;
use kube::{Resource, ResourceExt as _};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tensile_core::deps::{CopyAction, CopyKind, DependencyCopy, dependency_action, lower_pvc};
use tensile_core::keys::{LABEL_IDENTITY_OF, LABEL_OWNER, owner_label_value};
use tensile_core::plan::{Existing, LowerKind};
use tensile_core::services::{
    ServiceFilter, cluster_ip_refused, endpoint_slice_action, endpoints_action,
    lower_slices_selector, mirrored_slices_selector, service_action, without_cluster_ip,
};
use tensile_core::volumes::claim_action;
use tokio_util::sync::CancellationToken;

use crate::copy_index::{
    CopyEffect, CopyIndex, CopyMarks, CopyRule, CopyState, OriginalListed, copy_state,
};
use crate::namespaces::{LowerNamespaces, NamespaceError};
use crate::needs::Needs;
use crate::watches::ObjectWatches;
use tensile_runtime::api_error::{ApiClass, classify, failing_for, log_failure, quiet_level};
use tensile_runtime::cache::{CompactCache, Key};
use tensile_runtime::clients::{already_exists, delete_exact};
use tensile_runtime::controller::{self, OnFailure, Reconciler, Stage, Workers};
use tensile_runtime::queue::{Action, Queue};
use tokio::time::Instant;

/// Settings of the copy controllers.
#[derive(Clone)]
pub struct CopySync {
    /// Upper cluster client.
    pub upper: kube::Client,
    /// Lower cluster client.
    pub lower: kube::Client,
    /// Our owner id (the lower copies' owner mark).
    pub owner: String,
    /// Parallel syncs per kind.
    pub workers: usize,
    /// Mirror Services and Endpoints (`ServiceControllers`), with this filter.
    pub services: Option<ServiceFilter>,
    /// Mirror volumes and claim bindings (`PVControllers`) for the virtual node of this name.
    pub volumes: Option<String>,
    /// With `services`: serve the node ports of the virtual node of this name on this address
    /// (`crate::node_ports`), from the same watches.
    pub node_ports: Option<(String, std::net::IpAddr)>,
    /// Each copy sync is timed here (stage `copy`), each volume sync too (`volume`).
    pub metrics: crate::sync_metrics::SyncMetrics,
}

impl Debug for CopySync {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CopySync")
            .field("owner", &self.owner)
            .field("services", &self.services)
            .field("volumes", &self.volumes)
            .field("node_ports", &self.node_ports)
            .finish_non_exhaustive()
    }
}

/// A lower write failed; the key is retried with backoff.
#[derive(Debug, thiserror::Error)]
pub enum CopyError {
    /// A write to the lower cluster.
    #[error("{what} {kind} {namespace}/{name} in the lower cluster: {source}")]
    Write {
        /// What was being done.
        what: &'static str,
        /// The kind of the copy.
        kind: &'static str,
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// The API server's answer.
        #[source]
        source: kube::Error,
    },
    /// The copy's namespace could not be made to exist downstairs.
    #[error("{kind} {namespace}/{name}: {source}")]
    Namespace {
        /// The kind of the copy.
        kind: &'static str,
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// Why.
        #[source]
        source: NamespaceError,
    },
    /// A lower object that is not ours holds the copy's name: never touched.
    #[error(
        "a {kind} {namespace}/{name} that is not ours exists in the lower cluster: it is left alone"
    )]
    NotOurs {
        /// The kind of the copy.
        kind: &'static str,
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
    },
}

impl CopyError {
    /// How the failed call classifies ([`tensile_runtime::api_error::classify`]).
    fn class(&self) -> ApiClass {
        match self {
            CopyError::Write { source, .. }
            | CopyError::Namespace {
                source: NamespaceError::Upper { source, .. } | NamespaceError::Lower { source, .. },
                ..
            } => classify(source),
            // The pods that need it say so (a Warning event each); here it is no news.
            CopyError::NotOurs { .. } => ApiClass::Conflict,
        }
    }
}

/// ConfigMaps, Secrets and claims as this controller's watches see them: upstairs the
/// ConfigMaps and Secrets our pods reference (and, with `PVControllers`, every claim),
/// downstairs our copies. The pod controller reads a pod's dependencies here rather than asking
/// the API server for each, and whether their copies are there ([`Self::copy_state`]).
#[derive(Clone, Debug, Default)]
pub struct Dependencies {
    /// ConfigMaps.
    pub config_maps: CompactCache<ConfigMap>,
    /// Secrets.
    pub secrets: CompactCache<Secret>,
    /// PersistentVolumeClaims (upstairs filled only with `PVControllers`).
    pub claims: CompactCache<PersistentVolumeClaim>,
    /// For the copies: what the copy writers learned that the lower watch cannot show.
    pub marks: Arc<CopyMarks>,
}

impl Dependencies {
    /// Whether the ConfigMap, Secret or claim (by `kind`) `namespace/name` is in the cache.
    pub fn contains(&self, kind: LowerKind, namespace: &str, name: &str) -> bool {
        match kind {
            LowerKind::ConfigMap => self.config_maps.contains(namespace, name),
            LowerKind::Secret => self.secrets.contains(namespace, name),
            LowerKind::PersistentVolumeClaim => self.claims.contains(namespace, name),
            _ => false,
        }
    }

    /// Of the copies: whether our copy of the ConfigMap, Secret or claim (by `kind`)
    /// `namespace/name` of the upper object of `upper_uid` is there ([`CopyState`]).
    pub fn copy_state(
        &self,
        kind: LowerKind,
        namespace: &str,
        name: &str,
        upper_uid: Option<&str>,
    ) -> CopyState {
        let key = Key::new(namespace, name);
        let marks = &self.marks;
        match kind {
            LowerKind::ConfigMap => copy_state(
                &self.config_maps,
                marks,
                CopyKind::ConfigMap,
                &key,
                upper_uid,
            ),
            LowerKind::Secret => {
                copy_state(&self.secrets, marks, CopyKind::Secret, &key, upper_uid)
            }
            LowerKind::PersistentVolumeClaim => copy_state(
                &self.claims,
                marks,
                CopyKind::PersistentVolumeClaim,
                &key,
                upper_uid,
            ),
            _ => CopyState::Ready,
        }
    }
}

/// The per-object watches of the upper ConfigMaps and Secrets our pods reference.
#[derive(Clone, Debug)]
pub struct UpperWatches {
    /// ConfigMaps.
    pub config_maps: Arc<ObjectWatches<ConfigMap>>,
    /// Secrets.
    pub secrets: Arc<ObjectWatches<Secret>>,
}

/// What the copy controllers and the pod controller of one virtual node share.
#[derive(Clone, Debug)]
pub struct SharedDependencies {
    /// The upper ConfigMaps and Secrets our pods reference (filled by their per-object watches)
    /// and, with `PVControllers`, every upper claim (the claim controller's watch).
    pub upper: Dependencies,
    /// The watches filling `upper`'s ConfigMaps and Secrets.
    pub watches: UpperWatches,
    /// Our lower copies of them (filled by the copy controllers).
    pub copies: Dependencies,
    /// Lower namespaces known to exist.
    pub namespaces: Arc<LowerNamespaces>,
    /// Which copies our pods need (filled from the pod controller's watches).
    pub needs: Arc<Needs>,
}

impl SharedDependencies {
    /// Empty caches for the clusters of `upper` and `lower`, our marks `owner`, until `stop`.
    /// The watches of upper ConfigMaps and Secrets start and stop as `needs` says.
    pub fn new(
        upper: kube::Client,
        lower: kube::Client,
        owner: String,
        stop: &CancellationToken,
    ) -> Self {
        let watches = UpperWatches {
            config_maps: Arc::new(ObjectWatches::new(upper.clone(), "configmap", stop)),
            secrets: Arc::new(ObjectWatches::new(upper.clone(), "secret", stop)),
        };
        let needs: Arc<Needs> = Arc::default();
        let follow = |kind, w: Arc<dyn Fn(Key, bool) + Send + Sync>| needs.watch_upper(kind, w);
        let cms = watches.config_maps.clone();
        follow(
            CopyKind::ConfigMap,
            Arc::new(move |key, start| {
                if start {
                    cms.start(key)
                } else {
                    cms.stop(&key)
                }
            }),
        );
        let secrets = watches.secrets.clone();
        follow(
            CopyKind::Secret,
            Arc::new(move |key, start| {
                if start {
                    secrets.start(key)
                } else {
                    secrets.stop(&key)
                }
            }),
        );
        SharedDependencies {
            upper: Dependencies {
                config_maps: watches.config_maps.cache(),
                secrets: watches.secrets.cache(),
                claims: CompactCache::default(),
                marks: Arc::default(),
            },
            watches,
            copies: Dependencies::default(),
            namespaces: Arc::new(LowerNamespaces::new(upper, lower, owner)),
            needs,
        }
    }
}

/// A pod dependency's rule: follow the original, and exist exactly while a pod needs it.
fn dependency<K: DependencyCopy + 'static>(owner: String) -> CopyRule<K> {
    Arc::new(move |u, l, needed| dependency_action(u, l, &owner, needed))
}

/// Runs every enabled kind until `stop`, filling `shared.upper`.
pub async fn run(cfg: CopySync, shared: SharedDependencies, stop: CancellationToken) {
    let SharedDependencies {
        upper,
        watches,
        copies,
        namespaces,
        needs,
    } = shared;
    let owner = cfg.owner.clone();
    let services = cfg.services.clone().map(|filter| {
        let (owner, endpoints_owner, slices_owner) = (owner.clone(), owner.clone(), owner.clone());
        let (endpoints_filter, slices_filter) = (filter.clone(), filter.clone());
        let services: CopyRule<Service> =
            Arc::new(move |u, l, _| service_action(u, l, &owner, &filter));
        let endpoints: CopyRule<Endpoints> =
            Arc::new(move |u, l, _| endpoints_action(u, l, &endpoints_owner, &endpoints_filter));
        let slices: CopyRule<EndpointSlice> =
            Arc::new(move |u, l, _| endpoint_slice_action(u, l, &slices_owner, &slices_filter));
        (services, endpoints, slices)
    });
    let mirror_services = async {
        if let Some((services, endpoints, slices)) = services {
            // Slices users write (a Service without selector, no Endpoints): the ones
            // Kubernetes makes come from the Endpoints copied above.
            let mut slices = Kind::new(
                &cfg,
                "endpointslice",
                CopyIndex::new(owner.clone(), Default::default(), slices),
                &namespaces,
            );
            slices.upper_labels = Some(mirrored_slices_selector());
            slices.lower_labels = Some(lower_slices_selector());
            let (upper_services, upper_endpoints) = (CompactCache::new(), CompactCache::new());
            let mut services = Kind {
                instead: Some(service_without_refused_ip),
                ..Kind::new(
                    &cfg,
                    "service",
                    CopyIndex::new(
                        owner.clone(),
                        (upper_services.clone(), CompactCache::new()),
                        services,
                    ),
                    &namespaces,
                )
            };
            let mut endpoints = Kind::new(
                &cfg,
                "endpoints",
                CopyIndex::new(
                    owner.clone(),
                    (upper_endpoints.clone(), CompactCache::new()),
                    endpoints,
                ),
                &namespaces,
            );
            if let Some((node, address)) = cfg.node_ports.clone() {
                let ports = crate::node_ports::NodePorts::new(
                    node,
                    address,
                    upper_services,
                    upper_endpoints,
                    stop.clone(),
                );
                let for_endpoints = ports.clone();
                services.observer = Some(Arc::new(move |upper, o: &Service| {
                    if upper {
                        ports.changed(&Key::new(o.namespace().unwrap_or_default(), o.name_any()));
                    }
                }));
                endpoints.observer = Some(Arc::new(move |upper, o: &Endpoints| {
                    if upper {
                        for_endpoints
                            .changed(&Key::new(o.namespace().unwrap_or_default(), o.name_any()));
                    }
                }));
            }
            tokio::join!(
                run_kind(services, stop.clone()),
                run_kind(endpoints, stop.clone()),
                run_kind(slices, stop.clone()),
            );
        }
    };
    // Claims are copied whether or not `PVControllers` is on; with it, one watch of the upper
    // claims, and our copies follow deletions and expansions and feed the volume controller.
    // Without it the node may only read the claims its pods use (the Node authorizer): each is
    // read when its copy is to be made, and a copy is only ever created.
    let mirror_claims = async {
        let claim_needs = (
            CopyKind::PersistentVolumeClaim,
            needs.clone(),
            copies.marks.clone(),
        );
        if let Some(node_name) = cfg.volumes.clone() {
            let claims = crate::volumes::Claims {
                upper: upper.claims.clone(),
                lower: copies.claims.clone(),
            };
            let controller = crate::volumes::VolumeController::new(
                crate::volumes::VolumeSync {
                    upper: cfg.upper.clone(),
                    lower: cfg.lower.clone(),
                    owner: owner.clone(),
                    node_name,
                    metrics: cfg.metrics.clone(),
                },
                claims.clone(),
            );
            let events = controller.claim_events();
            let claim_owner = owner.clone();
            let decide: CopyRule<PersistentVolumeClaim> =
                Arc::new(move |u, l, needed| claim_action(u, l, &claim_owner, needed));
            let index = CopyIndex::new(owner.clone(), (claims.upper, claims.lower), decide)
                .needed_by_pods(claim_needs.0, claim_needs.1, claim_needs.2);
            let mut kind = Kind::new(&cfg, "persistentvolumeclaim", index, &namespaces);
            kind.observer = Some(Arc::new(move |upper, pvc| events.claim_changed(upper, pvc)));
            tokio::join!(run_kind(kind, stop.clone()), controller.run(stop.clone()));
        } else {
            let claim_owner = owner.clone();
            let decide: CopyRule<PersistentVolumeClaim> = Arc::new(move |u, l, needed| {
                match (u.filter(|u| u.metadata.deletion_timestamp.is_none()), l) {
                    (Some(u), None) if needed => CopyAction::Create(lower_pvc(u, &claim_owner)),
                    _ => CopyAction::Nothing,
                }
            });
            // Filled by the writer's reads, one claim at a time: complete as far as it goes.
            let read: CompactCache<PersistentVolumeClaim> = CompactCache::new();
            read.apply(&watcher::Event::Init);
            read.apply(&watcher::Event::InitDone);
            let index = CopyIndex::new(owner.clone(), (read, copies.claims.clone()), decide)
                .needed_by_pods(claim_needs.0, claim_needs.1, claim_needs.2);
            let mut kind = Kind::new(&cfg, "persistentvolumeclaim", index, &namespaces);
            kind.read_upper = true;
            run_kind(kind, stop.clone()).await;
        }
    };
    let config_maps = CopyIndex::new(
        owner.clone(),
        (upper.config_maps, copies.config_maps.clone()),
        dependency::<ConfigMap>(owner.clone()),
    )
    .needed_by_pods(CopyKind::ConfigMap, needs.clone(), copies.marks.clone())
    .per_object(known(&watches.config_maps));
    let secrets = CopyIndex::new(
        owner.clone(),
        (upper.secrets, copies.secrets.clone()),
        dependency::<Secret>(owner.clone()),
    )
    .needed_by_pods(CopyKind::Secret, needs.clone(), copies.marks.clone())
    .per_object(known(&watches.secrets));
    let mut config_maps = Kind::new(&cfg, "configmap", config_maps, &namespaces);
    config_maps.per_object = Some(watches.config_maps.clone());
    let mut secrets = Kind::new(&cfg, "secret", secrets, &namespaces);
    secrets.per_object = Some(watches.secrets.clone());
    tokio::join!(
        run_kind(config_maps, stop.clone()),
        run_kind(secrets, stop.clone()),
        mirror_services,
        mirror_claims,
    );
}

/// Whether the per-object watch of `watches` has listed a key.
fn known<K: Send + Sync + 'static>(watches: &Arc<ObjectWatches<K>>) -> OriginalListed {
    let watches = watches.clone();
    Arc::new(
        move |Key {
                  namespace: ns,
                  name,
              }: &Key| watches.known(ns, name),
    )
}

/// One kind's loop: its settings and its index.
struct Kind<K> {
    cfg: CopySync,
    name: &'static str,
    index: CopyIndex<K>,
    namespaces: Arc<LowerNamespaces>,
    /// Told of every change the watches see (`true`: upper), after the caches took it.
    observer: Option<Observer<K>>,
    /// The upper objects are read one by one (`crate::watches`), not from a watch of all.
    per_object: Option<Arc<ObjectWatches<K>>>,
    /// The upper object is read when a copy is to be made (no watch of them is allowed).
    read_upper: bool,
    /// Only the upper objects of this label selector are watched (and copied).
    upper_labels: Option<String>,
    /// Only the lower objects of ours that also match this label selector are watched.
    lower_labels: Option<String>,
    /// The copy to create instead when the lower API server refused one (a Service's cluster
    /// IP taken or out of range downstairs).
    instead: Option<Instead<K>>,
}

/// See [`Kind::instead`].
type Instead<K> = fn(&K, &kube::Error) -> Option<K>;

/// A Service copy without the upper cluster IP, when the lower API server refused it.
fn service_without_refused_ip(copy: &Service, e: &kube::Error) -> Option<Service> {
    match e {
        kube::Error::Api(s) if cluster_ip_refused(s.code, &s.message) => without_cluster_ip(copy),
        _ => None,
    }
}

/// See [`Kind::observer`].
type Observer<K> = Arc<dyn Fn(bool, &K) + Send + Sync>;

impl<K> Kind<K> {
    fn new(
        cfg: &CopySync,
        name: &'static str,
        index: CopyIndex<K>,
        namespaces: &Arc<LowerNamespaces>,
    ) -> Self {
        Kind {
            cfg: cfg.clone(),
            name,
            index,
            namespaces: namespaces.clone(),
            observer: None,
            per_object: None,
            read_upper: false,
            upper_labels: None,
            lower_labels: None,
            instead: None,
        }
    }
}

/// What a copied kind is (ConfigMap, Secret, claim): a namespaced object we read and write.
trait Copied:
    Resource<Scope = NamespaceResourceScope, DynamicType = ()>
    + Clone
    + Debug
    + Serialize
    + DeserializeOwned
{
}

impl<K> Copied for K where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + Clone
        + Debug
        + Serialize
        + DeserializeOwned
{
}

/// A failed write of `what` for the copy `key` of `kind`.
fn write_error<K>(
    kind: &Kind<K>,
    key: &Key,
    what: &'static str,
) -> impl FnOnce(kube::Error) -> CopyError {
    let Key { namespace, name } = key.clone();
    let kind = kind.name;
    move |source| CopyError::Write {
        what,
        kind,
        namespace,
        name,
        source,
    }
}

async fn run_kind<K>(kind: Kind<K>, stop: CancellationToken)
where
    K: Copied + Send + Sync + 'static,
{
    let cfg = &kind.cfg;
    let index = kind.index.clone();
    let watch = |api: Api<K>, config: watcher::Config, cache: &CompactCache<K>| {
        // The objects once the cache shows them (a re-list's when complete).
        cache.objects_shown(tensile_runtime::backoff::watch(api, config), |_| {})
    };
    // Our token Secrets (`crate::tokens`) are not copies of anything: the pod controller keeps them.
    let mut ours = format!(
        "{LABEL_OWNER}={},!{LABEL_IDENTITY_OF}",
        owner_label_value(&cfg.owner)
    );
    if let Some(selector) = &kind.lower_labels {
        ours = format!("{ours},{selector}");
    }
    let upper_events = if kind.per_object.is_some() || kind.read_upper {
        futures::stream::empty().boxed()
    } else {
        let config = match &kind.upper_labels {
            Some(selector) => watcher::Config::default().labels(selector),
            None => watcher::Config::default(),
        };
        watch(Api::all(cfg.upper.clone()), config, index.upper())
            .map_ok(|o| (true, o))
            .boxed()
    };
    let lower_events = watch(
        Api::all(cfg.lower.clone()),
        watcher::Config::default().labels(&ours),
        index.lower(),
    )
    .map_ok(|o| (false, o));
    let (queue, rx) = Queue::<Key>::new();
    if let Some((copy_kind, needs)) = index.pod_dependency() {
        // A copy a pod needs now, or no pod any more.
        needs.subscribe(copy_kind, queue.clone());
    }
    if let Some(watches) = &kind.per_object {
        // The original changed, or its watch has listed it (a copy waiting for it can be made).
        let queue = queue.clone();
        watches.observe(Arc::new(move |key: &Key| queue.add(key.clone())));
    }
    {
        let queue = queue.clone();
        let stop = stop.clone();
        let name = kind.name;
        let observer = kind.observer.clone();
        let index = index.clone();
        tokio::spawn(async move {
            let merged = futures::stream::select(upper_events, lower_events);
            tensile_runtime::backoff::drain(merged, &stop, name, |(upper, o)| {
                let key = Key::new(o.namespace().unwrap_or_default(), o.name_any());
                // A pod waiting for this copy looks again (unless our create's answer told it).
                if !upper
                    && index.lower_shown(&key)
                    && let Some((copy_kind, needs)) = index.pod_dependency()
                {
                    needs.copy_changed(copy_kind, &key);
                }
                queue.add(key);
                if let Some(observe) = &observer {
                    observe(upper, &o);
                }
            })
            .await;
        });
    }
    // Nothing is decided before both caches (and the pods, for what they need) are complete:
    // an absent original must mean absent, an unneeded copy unneeded.
    let pods_listed = async {
        if let Some((_, needs)) = index.pod_dependency() {
            needs.wait_until_listed().await;
        }
    };
    tokio::select! {
        () = stop.cancelled() => return,
        _ = futures::future::join3(index.upper().wait_until_ready(), index.lower().wait_until_ready(), pods_listed) => {}
    }
    // Start-up garbage collection: every copy is checked against its original; and every copy
    // a pod needs is made.
    for key in index.lower().keys() {
        queue.add(key);
    }
    if let Some((copy_kind, needs)) = index.pod_dependency() {
        for key in needs.needed_keys(copy_kind) {
            queue.add(key);
        }
    }
    let workers = Workers::one_at_a_time(cfg.workers);
    controller::run(Arc::new(kind), queue, rx, workers, stop).await;
}

/// What to do for a copy's key.
enum CopyPlan<K> {
    /// The original is read from the upper cluster first (no watch of them is allowed), then
    /// the index decides.
    ReadOriginal,
    /// The index's decision.
    Effect(CopyEffect<K>),
}

impl<K: Copied + Send + Sync + 'static> Reconciler for Kind<K> {
    type Key = Key;
    type Plan = CopyPlan<K>;
    type Error = CopyError;

    fn plan(&self, key: &Key) -> CopyPlan<K> {
        let index = &self.index;
        if self.read_upper
            && index.needed(key)
            && !index.lower().contains(&key.namespace, &key.name)
        {
            CopyPlan::ReadOriginal
        } else {
            CopyPlan::Effect(index.effect(key))
        }
    }

    async fn execute(self: Arc<Self>, key: Key, plan: CopyPlan<K>) -> Result<Action, CopyError> {
        let effect = match plan {
            CopyPlan::Effect(effect) => effect,
            CopyPlan::ReadOriginal => {
                let Key {
                    namespace: ns,
                    name,
                } = &key;
                let upper: Api<K> = Api::namespaced(self.cfg.upper.clone(), ns);
                let read = upper.get_opt(name).await;
                match read.map_err(write_error(&self, &key, "reading the original of"))? {
                    Some(o) => self.index.upper().apply(&watcher::Event::Apply(o)),
                    None => self.index.upper().remove(ns, name),
                }
                self.index.effect(&key)
            }
        };
        sync(&self, &key, effect).await?;
        Ok(Action::Done)
    }

    fn failed(&self, _: &Key, e: &CopyError, since: Option<Instant>) -> OnFailure {
        log_failure(
            quiet_level(e.class(), failing_for(since)),
            e,
            "copy sync failed",
        );
        OnFailure::Retry
    }

    fn observe(&self, stage: Stage, took: std::time::Duration) {
        if stage == Stage::Reconcile {
            self.cfg.metrics.observe("copy", took);
        }
    }
}

/// Carries out the index's `effect` for `key`.
async fn sync<K>(kind: &Kind<K>, key: &Key, effect: CopyEffect<K>) -> Result<(), CopyError>
where
    K: Copied,
{
    let Key {
        namespace: ns,
        name,
    } = key;
    let index = &kind.index;
    let api: Api<K> = Api::namespaced(kind.cfg.lower.clone(), ns);
    let err = |what: &'static str| write_error(kind, key, what);
    let wake = || {
        if let Some((copy_kind, needs)) = index.pod_dependency() {
            needs.copy_changed(copy_kind, key);
        }
    };
    let delete = |uid: Option<String>| {
        let api = &api;
        async move {
            delete_exact(api, name, uid, None)
                .await
                .map_err(err("deleting"))
        }
    };
    let create = |copy: K| {
        let api = &api;
        async move {
            let made = create_copy(kind, api, key, &copy).await;
            // A name held by someone else is marked as such already.
            if let Err(e) = &made
                && !matches!(e, CopyError::NotOurs { .. })
            {
                index.failed(key, e.to_string());
            }
            wake();
            made
        }
    };
    match effect {
        CopyEffect::Nothing => {
            if !index.needed(key) {
                index.forget(key);
            }
            Ok(())
        }
        // The original's watch puts the key back once it has listed it.
        CopyEffect::WaitForOriginal => Ok(()),
        CopyEffect::NotOurs => {
            tracing::debug!(kind = kind.name, namespace = %ns, name = %name, "a lower object that is not ours holds the name: left alone");
            Ok(())
        }
        CopyEffect::CreateCopy(copy) => create(copy).await,
        CopyEffect::UpdateCopy(copy) => api
            .replace(name, &PostParams::default(), &copy)
            .await
            .map(drop)
            .map_err(err("updating")),
        CopyEffect::ReplaceCopy { uid, copy } => {
            delete(uid).await?;
            create(copy).await
        }
        CopyEffect::DeleteCopy { uid } => {
            delete(uid).await?;
            index.forget(key);
            Ok(())
        }
    }
}

/// Creates `copy` under `key`, its namespace first. A pod dependency that exists already is
/// ours (the watch shows it), another virtual node's copy of the same upper object (used as it
/// is), or not ours: never touched, and an error (the queue looks again with back-off: nobody
/// tells us when it goes, and pods wait for it).
async fn create_copy<K>(kind: &Kind<K>, api: &Api<K>, key: &Key, copy: &K) -> Result<(), CopyError>
where
    K: Copied,
{
    let Key {
        namespace: ns,
        name,
    } = key;
    let write = |what: &'static str| write_error(kind, key, what);
    kind.namespaces
        .ensure(ns)
        .await
        .map_err(|source| CopyError::Namespace {
            kind: kind.name,
            namespace: ns.clone(),
            name: name.clone(),
            source,
        })?;
    let mut made = api.create(&PostParams::default(), copy).await;
    let other;
    let mut copy = copy;
    if let (Err(e), Some(instead)) = (&made, kind.instead)
        && let Some(o) = instead(copy, e)
    {
        tracing::info!(kind = kind.name, namespace = %ns, name = %name, error = %e, "the lower cluster refused the copy as it was: made without what it refused");
        other = o;
        copy = &other;
        made = api.create(&PostParams::default(), copy).await;
    }
    match made {
        Ok(_) => {
            kind.index.created(key, copy);
            Ok(())
        }
        // A mirror (Service, Endpoints) of ours arrives through the watch; anyone else's is
        // never touched, and no pod waits for it.
        Err(e) if already_exists(&e) && kind.index.pod_dependency().is_none() => Ok(()),
        Err(e) if already_exists(&e) => {
            let existing = api.get(name).await.map_err(write("reading the existing"))?;
            match kind.index.found(key, copy, existing.meta()) {
                Existing::Ours | Existing::Sibling => Ok(()),
                Existing::UseAsIs | Existing::Stale | Existing::Conflict => {
                    Err(CopyError::NotOurs {
                        kind: kind.name,
                        namespace: ns.clone(),
                        name: name.clone(),
                    })
                }
            }
        }
        Err(e) => {
            kind.namespaces.forget_if_gone(ns, &e);
            Err(write("creating")(e))
        }
    }
}
