//! The controllers that keep lower copies of upper objects:
//! - ConfigMaps and Secrets (always on): our copies follow their originals, and exist exactly
//!   while one of our pods needs them (`crate::needs`): a copy no pod needs any more, or whose
//!   original is gone, is deleted; a needed one that went missing is created again. The pod
//!   controller creates them first, before the pod that needs them;
//! - with `ServiceControllers`, Services and Endpoints: every upper Service outside the filter
//!   is mirrored, created, updated and deleted;
//! - with `PVControllers`, PersistentVolumeClaims: our lower claims follow the deletion and
//!   expansion of the upper ones (`tensile_core::volumes::claim_action`), and their changes feed
//!   the volume controller (`crate::volumes`).
//!
//! Nothing is decided before the caches involved have synced, so at start copies whose original
//! is gone (or that nothing needs) are collected, and nothing else.
//!
//! The rules are `tensile_core::deps::dependency_action` and
//! `tensile_core::services::{service_action, endpoints_action}`; this is the thin loop around
//! them, one per kind: the upper objects (for ConfigMaps and Secrets, one watch per object a
//! pod bound to the node references, `crate::watches`, as the Node authorizer allows a node;
//! for the others one watch of all), one watch of our lower copies (label selector on our
//! owner mark), a keyed queue, a few workers.

use std::fmt::Debug;
use std::sync::Arc;

use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::{ConfigMap, Endpoints, PersistentVolumeClaim, Secret, Service};
use kube::api::{Api, PostParams};
use kube::runtime::watcher;
use kube::{Resource, ResourceExt as _};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tensile_core::deps::{CopyAction, CopyKind, DependencyCopy, dependency_action};
use tensile_core::keys::{LABEL_IDENTITY_OF, LABEL_OWNER, owner_label_value};
use tensile_core::plan::LowerKind;
use tensile_core::services::{ServiceFilter, endpoints_action, service_action};
use tensile_core::volumes::claim_action;
use tokio_util::sync::CancellationToken;

use crate::namespaces::{LowerNamespaces, NamespaceError};
use crate::needs::Needs;
use crate::sync_error::{ApiClass, classify, failing_for, log_failure, quiet_level};
use crate::watches::ObjectWatches;
use tensile_runtime::cache::{CompactCache, Key};
use tensile_runtime::clients::{already_exists, delete_exact};
use tensile_runtime::queue::Queue;

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
    /// Each copy sync is timed here (stage `copy`), each volume sync too (`volume`).
    pub metrics: crate::pods::SyncMetrics,
}

impl Debug for CopySync {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CopySync")
            .field("owner", &self.owner)
            .field("services", &self.services)
            .field("volumes", &self.volumes)
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
}

impl CopyError {
    /// How the failed call classifies ([`crate::sync_error::classify`]).
    fn class(&self) -> ApiClass {
        match self {
            CopyError::Write { source, .. }
            | CopyError::Namespace {
                source: NamespaceError::Upper { source, .. } | NamespaceError::Lower { source, .. },
                ..
            } => classify(source),
        }
    }
}

/// ConfigMaps, Secrets and (with `PVControllers`) claims as this controller's watches see them:
/// upstairs the ConfigMaps and Secrets our pods reference (and every claim), downstairs our
/// copies. The pod controller reads a pod's dependencies here
/// rather than asking the API server for each, and creates only the copies that are not there
/// yet.
#[derive(Clone, Debug, Default)]
pub struct Dependencies {
    /// ConfigMaps.
    pub config_maps: CompactCache<ConfigMap>,
    /// Secrets.
    pub secrets: CompactCache<Secret>,
    /// PersistentVolumeClaims (filled only with `PVControllers`).
    pub claims: CompactCache<PersistentVolumeClaim>,
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
pub struct Shared {
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

impl Shared {
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
        Shared {
            upper: Dependencies {
                config_maps: watches.config_maps.cache(),
                secrets: watches.secrets.cache(),
                claims: CompactCache::default(),
            },
            watches,
            copies: Dependencies::default(),
            namespaces: Arc::new(LowerNamespaces::new(upper, lower, owner)),
            needs,
        }
    }
}

/// What to do with `namespace/name` given the upper object and our lower copy, either possibly
/// absent.
type Decide<K> = Arc<dyn Fn(&Key, Option<&K>, Option<&K>) -> CopyAction<K> + Send + Sync>;

/// A pod dependency's rule: follow the original, and exist exactly while a pod needs it.
fn dependency<K: DependencyCopy + 'static>(
    kind: CopyKind,
    owner: String,
    needs: Arc<Needs>,
) -> Decide<K> {
    Arc::new(move |(ns, name), u, l| dependency_action(u, l, &owner, needs.needed(kind, ns, name)))
}

/// Runs every enabled kind until `stop`, filling `shared.upper`.
pub async fn run(cfg: CopySync, shared: Shared, stop: CancellationToken) {
    let Shared {
        upper,
        watches,
        copies,
        namespaces,
        needs,
    } = shared;
    let config_maps =
        dependency::<ConfigMap>(CopyKind::ConfigMap, cfg.owner.clone(), needs.clone());
    let secrets = dependency::<Secret>(CopyKind::Secret, cfg.owner.clone(), needs.clone());
    let services = cfg.services.clone().map(|filter| {
        let (owner, endpoints_owner) = (cfg.owner.clone(), cfg.owner.clone());
        let endpoints_filter = filter.clone();
        let services: Decide<Service> =
            Arc::new(move |_, u, l| service_action(u, l, &owner, &filter));
        let endpoints: Decide<Endpoints> =
            Arc::new(move |_, u, l| endpoints_action(u, l, &endpoints_owner, &endpoints_filter));
        (services, endpoints)
    });
    let mirror_services = async {
        if let Some((services, endpoints)) = services {
            tokio::join!(
                run_kind(
                    Kind::new(&cfg, "service", Default::default(), &namespaces),
                    services,
                    stop.clone()
                ),
                run_kind(
                    Kind::new(&cfg, "endpoints", Default::default(), &namespaces),
                    endpoints,
                    stop.clone()
                ),
            );
        }
    };
    let mirror_volumes = async {
        if let Some(node_name) = cfg.volumes.clone() {
            let claims = crate::volumes::Claims {
                upper: upper.claims.clone(),
                lower: copies.claims.clone(),
            };
            let controller = crate::volumes::VolumeController::new(
                crate::volumes::VolumeSync {
                    upper: cfg.upper.clone(),
                    lower: cfg.lower.clone(),
                    owner: cfg.owner.clone(),
                    node_name,
                    metrics: cfg.metrics.clone(),
                },
                claims.clone(),
            );
            let events = controller.claim_events();
            let (owner, claim_needs) = (cfg.owner.clone(), needs.clone());
            let decide: Decide<PersistentVolumeClaim> = Arc::new(move |(ns, name), u, l| {
                let needed = claim_needs.needed(CopyKind::PersistentVolumeClaim, ns, name);
                claim_action(u, l, &owner, needed)
            });
            let mut kind = Kind::new(
                &cfg,
                "persistentvolumeclaim",
                (claims.upper, claims.lower),
                &namespaces,
            )
            .needed_by_pods(CopyKind::PersistentVolumeClaim, &needs);
            kind.observer = Some(Arc::new(move |upper, pvc| events.claim_changed(upper, pvc)));
            tokio::join!(
                run_kind(kind, decide, stop.clone()),
                controller.run(stop.clone())
            );
        }
    };
    tokio::join!(
        run_kind(
            Kind::new(
                &cfg,
                "configmap",
                (upper.config_maps, copies.config_maps),
                &namespaces
            )
            .needed_by_pods(CopyKind::ConfigMap, &needs)
            .per_object(&watches.config_maps),
            config_maps,
            stop.clone()
        ),
        run_kind(
            Kind::new(&cfg, "secret", (upper.secrets, copies.secrets), &namespaces)
                .needed_by_pods(CopyKind::Secret, &needs)
                .per_object(&watches.secrets),
            secrets,
            stop.clone()
        ),
        mirror_services,
        mirror_volumes,
    );
}

/// One kind's loop: its settings and its upper cache.
struct Kind<K> {
    cfg: CopySync,
    name: &'static str,
    upper: CompactCache<K>,
    /// Our lower copies.
    lower: CompactCache<K>,
    namespaces: Arc<LowerNamespaces>,
    /// For pod dependencies: which ones pods need.
    needs: Option<(CopyKind, Arc<Needs>)>,
    /// Told of every change the watches see (`true`: upper), after the caches took it.
    observer: Option<Observer<K>>,
    /// The upper objects are read one by one (`crate::watches`), not from a watch of all.
    per_object: Option<Arc<ObjectWatches<K>>>,
    /// Keys left alone because their original was not known yet: worked on once it is.
    deferred: Arc<std::sync::Mutex<std::collections::HashSet<Key>>>,
}

/// See [`Kind::observer`].
type Observer<K> = Arc<dyn Fn(bool, &K) + Send + Sync>;

impl<K> Kind<K> {
    /// Kind `name`, whose upper objects and lower copies fill `caches` (which others may read).
    fn new(
        cfg: &CopySync,
        name: &'static str,
        (upper, lower): (CompactCache<K>, CompactCache<K>),
        namespaces: &Arc<LowerNamespaces>,
    ) -> Self {
        Kind {
            cfg: cfg.clone(),
            name,
            upper,
            lower,
            namespaces: namespaces.clone(),
            needs: None,
            observer: None,
            per_object: None,
            deferred: Arc::default(),
        }
    }

    /// The upper objects are those of `watches`, which the pods' references start.
    fn per_object(self, watches: &Arc<ObjectWatches<K>>) -> Self {
        Kind {
            per_object: Some(watches.clone()),
            ..self
        }
    }

    /// Copies of this kind exist exactly while a pod needs them: a change of need is work.
    fn needed_by_pods(self, kind: CopyKind, needs: &Arc<Needs>) -> Self {
        Kind {
            needs: Some((kind, needs.clone())),
            ..self
        }
    }
}

async fn run_kind<K>(kind: Kind<K>, decide: Decide<K>, stop: CancellationToken)
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + Clone
        + Debug
        + Serialize
        + DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let cfg = &kind.cfg;
    let lower_cache = kind.lower.clone();
    let watch = |api: Api<K>, config: watcher::Config, cache: CompactCache<K>| {
        // The objects once the cache shows them (a re-list's when complete).
        cache.objects_shown(tensile_runtime::backoff::watch(api, config), |_| {})
    };
    // Our token Secrets (`crate::tokens`) are not copies of anything: the pod controller keeps them.
    let ours = format!(
        "{LABEL_OWNER}={},!{LABEL_IDENTITY_OF}",
        owner_label_value(&cfg.owner)
    );
    let upper_events = match &kind.per_object {
        Some(_) => futures::stream::empty().boxed(),
        None => watch(
            Api::all(cfg.upper.clone()),
            watcher::Config::default(),
            kind.upper.clone(),
        )
        .map_ok(|o| (true, o))
        .boxed(),
    };
    let lower_events = watch(
        Api::all(cfg.lower.clone()),
        watcher::Config::default().labels(&ours),
        lower_cache.clone(),
    )
    .map_ok(|o| (false, o));
    let (queue, rx) = Queue::<Key>::new();
    if let Some((copy_kind, needs)) = &kind.needs {
        needs.subscribe(*copy_kind, queue.clone());
    }
    if let Some(watches) = &kind.per_object {
        // A change upstairs is work for an existing copy (or a deferred key). A missing one is
        // made by the pod controller before the pod that needs it (a create from here would
        // race it), or after a deletion downstairs, which the lower watch sees.
        let (queue, lower, deferred) = (queue.clone(), kind.lower.clone(), kind.deferred.clone());
        watches.observe(Arc::new(move |key: &Key| {
            let was_deferred = deferred.lock().is_ok_and(|mut d| d.remove(key));
            if was_deferred || lower.contains(&key.0, &key.1) {
                queue.add(key.clone());
            }
        }));
    }
    {
        let queue = queue.clone();
        let stop = stop.clone();
        let name = kind.name;
        let observer = kind.observer.clone();
        tokio::spawn(async move {
            let merged = futures::stream::select(upper_events, lower_events);
            tensile_runtime::backoff::drain(merged, &stop, name, |(upper, o)| {
                queue.add((o.namespace().unwrap_or_default(), o.name_any()));
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
        if let Some((_, needs)) = &kind.needs {
            needs.wait_until_listed().await;
        }
    };
    tokio::select! {
        () = stop.cancelled() => return,
        _ = futures::future::join3(kind.upper.wait_until_ready(), lower_cache.wait_until_ready(), pods_listed) => {}
    }
    // Start-up garbage collection: every copy is checked against its original.
    for key in lower_cache.keys() {
        queue.add(key);
    }
    let workers = cfg.workers.max(1);
    let ctx = Arc::new((kind, decide, lower_cache));
    let mut tasks = Vec::new();
    for _ in 0..workers {
        let (ctx, queue, rx, stop) = (ctx.clone(), queue.clone(), rx.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            while let Some((key, _)) = queue.next(&rx, &stop).await {
                let (kind, decide, lower) = &*ctx;
                let t0 = std::time::Instant::now();
                let result = sync(kind, decide, lower, &key).await;
                kind.cfg.metrics.observe("copy", t0.elapsed());
                if let Err(e) = &result {
                    let level = quiet_level(e.class(), failing_for(&queue, &key));
                    log_failure(level, e, "copy sync failed");
                }
                queue.done(key, result.is_ok());
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
}

async fn sync<K>(
    kind: &Kind<K>,
    decide: &Decide<K>,
    lower: &CompactCache<K>,
    key: &Key,
) -> Result<(), CopyError>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + Clone
        + Debug
        + Serialize
        + DeserializeOwned,
{
    let (ns, name) = key;
    // A needed copy whose original is not known yet (its watch has not listed it, or only a
    // lower pod still needs it) stays as it is: its watch puts the key back once it knows.
    if let (Some(watches), Some((copy_kind, needs))) = (&kind.per_object, &kind.needs)
        && !watches.known(ns, name)
        && needs.needed(*copy_kind, ns, name)
    {
        if let Ok(mut deferred) = kind.deferred.lock() {
            deferred.insert(key.clone());
        }
        return Ok(());
    }
    let copy = lower.get(ns, name);
    let api: Api<K> = Api::namespaced(kind.cfg.lower.clone(), ns);
    let err = |what: &'static str| {
        move |source| CopyError::Write {
            what,
            kind: kind.name,
            namespace: ns.clone(),
            name: name.clone(),
            source,
        }
    };
    let delete = || async {
        let uid = copy.as_ref().and_then(|c| c.meta().uid.clone());
        delete_exact(&api, name, uid, None)
            .await
            .map_err(err("deleting"))
    };
    let api = &api;
    let create = |desired: K| async move {
        kind.namespaces
            .ensure(ns)
            .await
            .map_err(|source| CopyError::Namespace {
                kind: kind.name,
                namespace: ns.clone(),
                name: name.clone(),
                source,
            })?;
        match api.create(&PostParams::default(), &desired).await {
            // Ours arrives through the watch; anyone else's is never touched.
            Err(e) if already_exists(&e) => Ok(()),
            Err(e) => {
                kind.namespaces.forget(ns);
                Err(err("creating")(e))
            }
            Ok(_) => Ok(()),
        }
    };
    match decide(key, kind.upper.get(ns, name).as_ref(), copy.as_ref()) {
        CopyAction::Nothing => Ok(()),
        CopyAction::Create(desired) => create(desired).await,
        CopyAction::Update(desired) => api
            .replace(name, &PostParams::default(), &desired)
            .await
            .map(drop)
            .map_err(err("updating")),
        CopyAction::Replace(desired) => {
            delete().await?;
            create(desired).await
        }
        CopyAction::Delete => delete().await,
    }
}
