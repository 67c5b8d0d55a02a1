//! The ConfigMap and Secret controller (always on): our lower copies follow their upper
//! originals (data, binaryData, labels, type) and go when the originals go; at start, copies
//! whose original is gone are deleted once both caches have synced. Creating copies is the pod
//! controller's job. The rules are `tensile_core::deps::{config_map_action, secret_action}`;
//! this is the thin loop around them: one watch of the upper objects, one of our lower copies
//! (label selector on our owner mark), a keyed queue, a few workers.

use std::fmt::Debug;
use std::sync::Arc;

use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, PostParams};
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Resource, ResourceExt as _};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tensile_core::deps::{CopyAction, config_map_action, secret_action};
use tensile_core::keys::{LABEL_OWNER, owner_label_value};
use tokio_util::sync::CancellationToken;

use crate::cache::{CompactCache, Key};
use crate::clients::delete_exact;
use crate::queue::Queue;

/// Settings of the ConfigMap and Secret controller.
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
}

impl Debug for CopySync {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CopySync")
            .field("owner", &self.owner)
            .finish_non_exhaustive()
    }
}

/// A lower write failed; the key is retried with backoff.
#[derive(Debug, thiserror::Error)]
#[error("{what} {kind} {namespace}/{name} in the lower cluster: {source}")]
pub struct CopyError {
    what: &'static str,
    kind: &'static str,
    namespace: String,
    name: String,
    #[source]
    source: kube::Error,
}

/// The upper ConfigMaps and Secrets as this controller's watches see them; the pod controller
/// reads a pod's dependencies here rather than asking the API server for each.
#[derive(Clone, Debug, Default)]
pub struct UpperObjects {
    /// Every upper ConfigMap.
    pub config_maps: CompactCache<ConfigMap>,
    /// Every upper Secret.
    pub secrets: CompactCache<Secret>,
}

/// Runs both kinds until `stop`, filling `upper`.
pub async fn run(cfg: CopySync, upper: UpperObjects, stop: CancellationToken) {
    tokio::join!(
        run_kind(
            cfg.clone(),
            "configmap",
            config_map_action,
            upper.config_maps,
            stop.clone()
        ),
        run_kind(cfg, "secret", secret_action, upper.secrets, stop),
    );
}

type Action<K> = fn(Option<&K>, &K, &str) -> CopyAction<K>;

async fn run_kind<K>(
    cfg: CopySync,
    kind: &'static str,
    action: Action<K>,
    upper_cache: CompactCache<K>,
    stop: CancellationToken,
) where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + Clone
        + Debug
        + Serialize
        + DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let lower_cache = CompactCache::<K>::new();
    let watch = |api: Api<K>, config: watcher::Config, cache: CompactCache<K>| {
        crate::backoff::watch(api, config)
            .inspect_ok(move |e| cache.apply(e))
            .touched_objects()
            .boxed()
    };
    let ours = format!("{LABEL_OWNER}={}", owner_label_value(&cfg.owner));
    let upper_events = watch(
        Api::all(cfg.upper.clone()),
        watcher::Config::default(),
        upper_cache.clone(),
    );
    let lower_events = watch(
        Api::all(cfg.lower.clone()),
        watcher::Config::default().labels(&ours),
        lower_cache.clone(),
    );
    let (queue, rx) = Queue::<Key>::new();
    {
        let queue = queue.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut merged = futures::stream::select(upper_events, lower_events);
            loop {
                tokio::select! {
                    () = stop.cancelled() => return,
                    next = merged.try_next() => match next {
                        Ok(Some(o)) => queue.add((o.namespace().unwrap_or_default(), o.name_any())),
                        Ok(None) => return,
                        Err(e) => tracing::warn!(kind, error = %e, "watch error"),
                    }
                }
            }
        });
    }
    // Nothing is decided before both caches are complete: an absent original must mean absent.
    tokio::select! {
        () = stop.cancelled() => return,
        _ = futures::future::join(upper_cache.wait_until_ready(), lower_cache.wait_until_ready()) => {}
    }
    // Start-up garbage collection: every copy is checked against its original.
    for key in lower_cache.keys() {
        queue.add(key);
    }
    let ctx = Arc::new((cfg, upper_cache, lower_cache));
    let mut workers = Vec::new();
    for _ in 0..ctx.0.workers.max(1) {
        let (ctx, queue, rx, stop) = (ctx.clone(), queue.clone(), rx.clone(), stop.clone());
        workers.push(tokio::spawn(async move {
            while let Some((key, _)) = queue.next(&rx, &stop).await {
                let (cfg, upper, lower) = &*ctx;
                let result = sync(cfg, kind, action, upper, lower, &key).await;
                if let Err(e) = &result {
                    tracing::warn!(error = %e, "copy sync failed");
                }
                queue.done(key, result.is_ok());
            }
        }));
    }
    for w in workers {
        let _ = w.await;
    }
}

async fn sync<K>(
    cfg: &CopySync,
    kind: &'static str,
    action: Action<K>,
    upper: &CompactCache<K>,
    lower: &CompactCache<K>,
    (ns, name): &Key,
) -> Result<(), CopyError>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + Clone
        + Debug
        + Serialize
        + DeserializeOwned,
{
    let Some(copy) = lower.get(ns, name) else {
        return Ok(());
    };
    let api: Api<K> = Api::namespaced(cfg.lower.clone(), ns);
    let err = |what: &'static str| {
        move |source| CopyError {
            what,
            kind,
            namespace: ns.clone(),
            name: name.clone(),
            source,
        }
    };
    let delete = || async {
        delete_exact(&api, name, copy.meta().uid.clone(), None)
            .await
            .map_err(err("deleting"))
    };
    match action(upper.get(ns, name).as_ref(), &copy, &cfg.owner) {
        CopyAction::Nothing => Ok(()),
        CopyAction::Update(desired) => api
            .replace(name, &PostParams::default(), &desired)
            .await
            .map(drop)
            .map_err(err("updating")),
        CopyAction::Replace(desired) => {
            delete().await?;
            api.create(&PostParams::default(), &desired)
                .await
                .map(drop)
                .map_err(err("re-creating"))
        }
        CopyAction::Delete => delete().await,
    }
}
