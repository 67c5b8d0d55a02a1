//! The volume controller (`PVControllers`): mirrors lower PersistentVolumes bound to our claims
//! upstairs, reflects the lower binding on the upper claims, and follows deletions both ways.
//! The rules are `tensile_core::volumes`; this is the loop around them, keyed by volume name:
//! one watch of the volumes of each cluster (the claims' watches are the claim copy
//! controller's, `crate::copies`, which hands changes over through [`ClaimEvents`]).

use std::sync::Arc;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::ResourceExt as _;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use serde_json::Value;
use tensile_core::deps::is_owned_by;
use tensile_core::volumes::{Claims as ClaimPair, VolumeAction, upper_claim_patch, volume_action};
use tokio_util::sync::CancellationToken;

use tensile_runtime::cache::CompactCache;
use tensile_runtime::clients::{already_exists, delete_exact};
use tensile_runtime::queue::{Queue, Receiver};

use crate::sync_error::{classify, failing_for, log_failure, quiet_level};

/// Settings of the volume controller.
#[derive(Clone)]
pub struct VolumeSync {
    /// Upper cluster client.
    pub upper: kube::Client,
    /// Lower cluster client.
    pub lower: kube::Client,
    /// Our owner id.
    pub owner: String,
    /// The virtual node's name: upper volumes are pinned to it.
    pub node_name: String,
    /// Each volume sync is timed here (stage `volume`).
    pub metrics: crate::pods::SyncMetrics,
}

impl std::fmt::Debug for VolumeSync {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VolumeSync")
            .field("owner", &self.owner)
            .field("node_name", &self.node_name)
            .finish_non_exhaustive()
    }
}

/// A write of the volume controller failed; the volume is retried with backoff.
#[derive(Debug, thiserror::Error)]
#[error("{what} {kind} {name} in the {cluster} cluster: {source}")]
pub struct VolumeError {
    what: &'static str,
    kind: &'static str,
    name: String,
    cluster: &'static str,
    #[source]
    source: kube::Error,
}

/// The claims as the claim copy controller's watches see them: every upper claim, our lower
/// copies.
#[derive(Clone, Debug, Default)]
pub struct Claims {
    /// Upper claims.
    pub upper: CompactCache<PersistentVolumeClaim>,
    /// Our lower claims.
    pub lower: CompactCache<PersistentVolumeClaim>,
}

/// Where the claim watches report changes: the volume a changed claim is bound to is looked at
/// again.
#[derive(Clone, Debug)]
pub struct ClaimEvents {
    queue: Queue<String>,
    lower: CompactCache<PersistentVolumeClaim>,
}

fn volume_of(pvc: &PersistentVolumeClaim) -> Option<String> {
    pvc.spec
        .as_ref()?
        .volume_name
        .clone()
        .filter(|v| !v.is_empty())
}

impl ClaimEvents {
    /// Claim `pvc` of the upper (`upper`) or lower cluster changed or went.
    pub fn claim_changed(&self, upper: bool, pvc: &PersistentVolumeClaim) {
        let volume = if upper {
            self.lower
                .get(&pvc.namespace().unwrap_or_default(), &pvc.name_any())
                .as_ref()
                .and_then(volume_of)
        } else {
            volume_of(pvc)
        };
        if let Some(v) = volume {
            self.queue.add(v);
        }
    }
}

/// The controller before it runs: its queue already takes claim changes.
#[derive(Debug)]
pub struct VolumeController {
    cfg: VolumeSync,
    claims: Claims,
    queue: Queue<String>,
    rx: Receiver<String>,
}

impl VolumeController {
    /// A controller over `claims` (filled by the claim copy controller).
    pub fn new(cfg: VolumeSync, claims: Claims) -> Self {
        let (queue, rx) = Queue::new();
        Self {
            cfg,
            claims,
            queue,
            rx,
        }
    }

    /// Where the claim watches report.
    pub fn claim_events(&self) -> ClaimEvents {
        ClaimEvents {
            queue: self.queue.clone(),
            lower: self.claims.lower.clone(),
        }
    }

    /// Watches the volumes of both clusters and reconciles until `stop`.
    pub async fn run(self, stop: CancellationToken) {
        let VolumeController {
            cfg,
            claims,
            queue,
            rx,
        } = self;
        let (upper_volumes, lower_volumes) = (
            CompactCache::<PersistentVolume>::new(),
            CompactCache::<PersistentVolume>::new(),
        );
        for (client, cache) in [
            (cfg.upper.clone(), upper_volumes.clone()),
            (cfg.lower.clone(), lower_volumes.clone()),
        ] {
            let events = tensile_runtime::backoff::watch(
                Api::<PersistentVolume>::all(client),
                watcher::Config::default(),
            );
            // Keys once the cache shows them (a re-list's when complete).
            let events = cache.keys_shown(events, |_| {});
            let (queue, stop) = (queue.clone(), stop.clone());
            tokio::spawn(async move {
                tensile_runtime::backoff::drain(events, &stop, "persistentvolumes", |(_, name)| {
                    queue.add(name);
                })
                .await;
            });
        }
        // Nothing is decided before every cache is complete: an absent volume must mean absent.
        tokio::select! {
            () = stop.cancelled() => return,
            _ = futures::future::join4(
                claims.upper.wait_until_ready(),
                claims.lower.wait_until_ready(),
                upper_volumes.wait_until_ready(),
                lower_volumes.wait_until_ready(),
            ) => {}
        }
        for (_, name) in lower_volumes.keys() {
            queue.add(name);
        }
        for pv in upper_volumes.state() {
            if is_owned_by(&pv.metadata, &cfg.owner) {
                queue.add(pv.name_any());
            }
        }
        let ctx = Arc::new((cfg, claims, upper_volumes, lower_volumes));
        while let Some((name, _)) = queue.next(&rx, &stop).await {
            let (cfg, claims, upper, lower) = &*ctx;
            let t0 = std::time::Instant::now();
            let result = sync(cfg, claims, upper, lower, &name).await;
            cfg.metrics.observe("volume", t0.elapsed());
            if let Err(e) = &result {
                let level = quiet_level(classify(&e.source), failing_for(&queue, &name));
                log_failure(level, e, "volume sync failed");
            }
            queue.done(name, result.is_ok());
        }
    }
}

async fn sync(
    cfg: &VolumeSync,
    claims: &Claims,
    upper_volumes: &CompactCache<PersistentVolume>,
    lower_volumes: &CompactCache<PersistentVolume>,
    name: &str,
) -> Result<(), VolumeError> {
    let err = |what: &'static str, kind: &'static str, cluster: &'static str, name: &str| {
        let name = name.to_owned();
        move |source| VolumeError {
            what,
            kind,
            name,
            cluster,
            source,
        }
    };
    let lower = lower_volumes.get("", name);
    let upper = upper_volumes.get("", name);
    let claim_key = lower
        .as_ref()
        .and_then(|l| l.spec.as_ref()?.claim_ref.as_ref())
        .and_then(|r| Some((r.namespace.clone()?, r.name.clone()?)));
    let (lower_claim, upper_claim) = match &claim_key {
        Some((ns, n)) => (claims.lower.get(ns, n), claims.upper.get(ns, n)),
        None => (None, None),
    };
    let pair = ClaimPair {
        lower: lower_claim.as_ref(),
        upper: upper_claim.as_ref(),
    };
    let upper_api = Api::<PersistentVolume>::all(cfg.upper.clone());
    let lower_api = Api::<PersistentVolume>::all(cfg.lower.clone());
    let merge = |patch: &Value| Patch::Merge(patch.clone());
    let pp = PatchParams::default();
    match volume_action(
        lower.as_ref(),
        upper.as_ref(),
        pair,
        &cfg.node_name,
        &cfg.owner,
    ) {
        VolumeAction::Nothing => {}
        VolumeAction::CreateUpper(pv) => {
            match upper_api.create(&PostParams::default(), &pv).await {
                // Someone's arrives through the watch, and is then seen for what it is.
                Err(e) if already_exists(&e) => {}
                r => {
                    r.map_err(err("creating", "persistentvolume", "upper", name))?;
                }
            }
        }
        VolumeAction::PatchUpper(patch) => {
            upper_api
                .patch(name, &pp, &merge(&patch))
                .await
                .map_err(err("updating", "persistentvolume", "upper", name))?;
        }
        VolumeAction::MarkLower(patch) => {
            lower_api
                .patch(name, &pp, &merge(&patch))
                .await
                .map_err(err("marking", "persistentvolume", "lower", name))?;
        }
        VolumeAction::DeleteUpper(uid) => {
            delete_exact(&upper_api, name, Some(uid), None)
                .await
                .map_err(err("deleting", "persistentvolume", "upper", name))?;
        }
        VolumeAction::DeleteLower(uid) => {
            delete_exact(&lower_api, name, Some(uid), None)
                .await
                .map_err(err("deleting", "persistentvolume", "lower", name))?;
        }
        VolumeAction::Conflict => {
            tracing::warn!(
                volume = name,
                "a PersistentVolume of that name that is not ours exists in the upper cluster; the lower volume is not mirrored"
            );
        }
    }
    // The upper claim reflects the lower binding once its volume is mirrored (core checks the
    // mirror is of the volume the lower claim is bound to).
    if let (Some(lc), Some(uc), Some((ns, n))) = (&lower_claim, &upper_claim, &claim_key)
        && let Some(patch) = upper_claim_patch(uc, lc, upper.as_ref(), &cfg.node_name, &cfg.owner)
    {
        Api::<PersistentVolumeClaim>::namespaced(cfg.upper.clone(), ns)
            .patch(n, &pp, &merge(&patch))
            .await
            .map_err(err(
                "reflecting the binding on",
                "persistentvolumeclaim",
                "upper",
                n,
            ))?;
    }
    Ok(())
}
