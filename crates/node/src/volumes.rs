//! The volume controller (`PVControllers`): mirrors lower PersistentVolumes bound to our claims
//! upstairs, reflects the lower binding on the upper claims, and follows deletions both ways.
//! The rules are `tensile_core::volumes`; [`VolumeIndex`] applies the watch events and answers
//! the effects for a volume name ([`VolumeEffect`]), without I/O; the writer here carries them
//! out, keyed by volume name: one watch of the volumes of each cluster (the claims' watches are
//! the claim copy controller's, `crate::copies`, which hands changes over through
//! [`ClaimEvents`]).

use std::sync::Arc;

use futures::StreamExt as _;

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
use tensile_runtime::controller::{self, OnFailure, Reconciler, Stage, Workers};
use tensile_runtime::queue::{Action, Queue, Receiver};
use tokio::time::Instant;

use tensile_runtime::api_error::{classify, failing_for, log_failure, quiet_level};

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
    pub metrics: crate::sync_metrics::SyncMetrics,
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

/// What the volume writer does for one volume name.
#[derive(Clone, Debug, PartialEq)]
pub enum VolumeEffect {
    /// Create the upper mirror of the lower volume.
    CreateUpperVolume(Box<PersistentVolume>),
    /// Merge-patch the upper volume (the lower one grew, or its policy changed).
    PatchUpperVolume(Value),
    /// Merge-patch the lower volume with our marks, once its upper mirror exists.
    MarkLowerVolume(Value),
    /// Delete the upper volume of this UID: its lower volume is gone or going.
    DeleteUpperVolume(String),
    /// Delete the lower volume of this UID: the user deleted its upper mirror.
    DeleteLowerVolume(String),
    /// An upper volume of the name exists and is not ours: nothing is written; reported.
    UpperNotOurs,
    /// Reflect the lower binding on the upper claim `namespace/name` with this merge patch.
    PatchUpperClaim {
        /// The claim's namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// The patch.
        patch: Value,
    },
}

/// The volume controller's state: the claims (the claim copy controller's caches) and the
/// volumes of both clusters, and what follows for a volume name. Clones share it.
#[derive(Clone, Debug)]
pub struct VolumeIndex {
    claims: Claims,
    upper: CompactCache<PersistentVolume>,
    lower: CompactCache<PersistentVolume>,
    node_name: String,
    owner: String,
}

impl VolumeIndex {
    /// An index over `claims`, for node `owner` presented as virtual node `node_name`.
    pub fn new(claims: Claims, node_name: String, owner: String) -> Self {
        VolumeIndex {
            claims,
            upper: CompactCache::new(),
            lower: CompactCache::new(),
            node_name,
            owner,
        }
    }

    /// Applies a watch event of the volumes of the upper (`upper`) or lower cluster; the
    /// volume names it touched.
    pub fn apply_volume(
        &self,
        upper: bool,
        event: &watcher::Event<PersistentVolume>,
    ) -> Vec<String> {
        let cache = if upper { &self.upper } else { &self.lower };
        cache
            .apply_keys(event)
            .into_iter()
            .map(|key| key.name)
            .collect()
    }

    /// The volume to look at again when claim `pvc` of the upper (`upper`) or lower cluster
    /// changed or went: the one our lower claim of that name is bound to.
    pub fn volume_of_claim(&self, upper: bool, pvc: &PersistentVolumeClaim) -> Option<String> {
        if upper {
            self.claims
                .lower
                .get(&pvc.namespace().unwrap_or_default(), &pvc.name_any())
                .as_ref()
                .and_then(volume_of)
        } else {
            volume_of(pvc)
        }
    }

    /// What to do for volume `name` now: the volume's effect, then the upper claim's.
    pub fn effects(&self, name: &str) -> Vec<VolumeEffect> {
        let lower = self.lower.get("", name);
        let upper = self.upper.get("", name);
        let claim_key = lower
            .as_ref()
            .and_then(|l| l.spec.as_ref()?.claim_ref.as_ref())
            .and_then(|r| Some((r.namespace.clone()?, r.name.clone()?)));
        let (lower_claim, upper_claim) = match &claim_key {
            Some((ns, n)) => (self.claims.lower.get(ns, n), self.claims.upper.get(ns, n)),
            None => (None, None),
        };
        let pair = ClaimPair {
            lower: lower_claim.as_ref(),
            upper: upper_claim.as_ref(),
        };
        let mut effects = Vec::new();
        let (node, owner) = (&self.node_name, &self.owner);
        match volume_action(lower.as_ref(), upper.as_ref(), pair, node, owner) {
            VolumeAction::Nothing => {}
            VolumeAction::CreateUpper(pv) => effects.push(VolumeEffect::CreateUpperVolume(pv)),
            VolumeAction::PatchUpper(p) => effects.push(VolumeEffect::PatchUpperVolume(p)),
            VolumeAction::MarkLower(p) => effects.push(VolumeEffect::MarkLowerVolume(p)),
            VolumeAction::DeleteUpper(uid) => effects.push(VolumeEffect::DeleteUpperVolume(uid)),
            VolumeAction::DeleteLower(uid) => effects.push(VolumeEffect::DeleteLowerVolume(uid)),
            VolumeAction::Conflict => effects.push(VolumeEffect::UpperNotOurs),
        }
        // The upper claim reflects the lower binding once its volume is mirrored (core checks
        // the mirror is of the volume the lower claim is bound to).
        if let (Some(lc), Some(uc), Some((namespace, name))) =
            (&lower_claim, &upper_claim, claim_key)
            && let Some(patch) = upper_claim_patch(uc, lc, upper.as_ref(), node, owner)
        {
            effects.push(VolumeEffect::PatchUpperClaim {
                namespace,
                name,
                patch,
            });
        }
        effects
    }
}

/// Where the claim watches report changes: the volume a changed claim is bound to is looked at
/// again.
#[derive(Clone, Debug)]
pub struct ClaimEvents {
    queue: Queue<String>,
    index: VolumeIndex,
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
        if let Some(v) = self.index.volume_of_claim(upper, pvc) {
            self.queue.add(v);
        }
    }
}

/// The controller before it runs: its queue already takes claim changes.
#[derive(Debug)]
pub struct VolumeController {
    cfg: VolumeSync,
    claims: Claims,
    index: VolumeIndex,
    queue: Queue<String>,
    rx: Receiver<String>,
}

impl VolumeController {
    /// A controller over `claims` (filled by the claim copy controller).
    pub fn new(cfg: VolumeSync, claims: Claims) -> Self {
        let (queue, rx) = Queue::new();
        let index = VolumeIndex::new(claims.clone(), cfg.node_name.clone(), cfg.owner.clone());
        Self {
            cfg,
            claims,
            index,
            queue,
            rx,
        }
    }

    /// Where the claim watches report.
    pub fn claim_events(&self) -> ClaimEvents {
        ClaimEvents {
            queue: self.queue.clone(),
            index: self.index.clone(),
        }
    }

    /// Watches the volumes of both clusters and reconciles until `stop`.
    pub async fn run(self, stop: CancellationToken) {
        let VolumeController {
            cfg,
            claims,
            index,
            queue,
            rx,
        } = self;
        for (upper, client) in [(true, cfg.upper.clone()), (false, cfg.lower.clone())] {
            let events = tensile_runtime::backoff::watch(
                Api::<PersistentVolume>::all(client),
                watcher::Config::default(),
            )
            .boxed();
            let (index, queue, stop) = (index.clone(), queue.clone(), stop.clone());
            tokio::spawn(async move {
                tensile_runtime::backoff::drain(events, &stop, "persistentvolumes", |event| {
                    // Names once the index shows them (a re-list's when complete).
                    for name in index.apply_volume(upper, &event) {
                        queue.add(name);
                    }
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
                index.upper.wait_until_ready(),
                index.lower.wait_until_ready(),
            ) => {}
        }
        for key in index.lower.keys() {
            queue.add(key.name);
        }
        for pv in index.upper.state() {
            if is_owned_by(&pv.metadata, &cfg.owner) {
                queue.add(pv.name_any());
            }
        }
        let writer = Arc::new(VolumeWriter { cfg, index });
        controller::run(writer, queue, rx, Workers::one_at_a_time(1), stop).await;
    }
}

/// The volume controller's reconciler: the index's effects, carried out.
struct VolumeWriter {
    cfg: VolumeSync,
    index: VolumeIndex,
}

impl Reconciler for VolumeWriter {
    type Key = String;
    type Plan = Vec<VolumeEffect>;
    type Error = VolumeError;

    fn plan(&self, name: &String) -> Vec<VolumeEffect> {
        self.index.effects(name)
    }

    async fn execute(
        self: Arc<Self>,
        name: String,
        effects: Vec<VolumeEffect>,
    ) -> Result<Action, VolumeError> {
        sync(&self.cfg, &name, effects).await?;
        Ok(Action::Done)
    }

    fn failed(&self, _: &String, e: &VolumeError, since: Option<Instant>) -> OnFailure {
        let level = quiet_level(classify(&e.source), failing_for(since));
        log_failure(level, e, "volume sync failed");
        OnFailure::Retry
    }

    fn observe(&self, stage: Stage, took: std::time::Duration) {
        if stage == Stage::Reconcile {
            self.cfg.metrics.observe("volume", took);
        }
    }
}

/// Carries out the index's `effects` for volume `name`, in order.
async fn sync(cfg: &VolumeSync, name: &str, effects: Vec<VolumeEffect>) -> Result<(), VolumeError> {
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
    let upper_api = Api::<PersistentVolume>::all(cfg.upper.clone());
    let lower_api = Api::<PersistentVolume>::all(cfg.lower.clone());
    let merge = |patch: &Value| Patch::Merge(patch.clone());
    let pp = PatchParams::default();
    for effect in effects {
        match effect {
            VolumeEffect::CreateUpperVolume(pv) => {
                match upper_api.create(&PostParams::default(), &pv).await {
                    // Someone's arrives through the watch, and is then seen for what it is.
                    Err(e) if already_exists(&e) => {}
                    r => {
                        r.map_err(err("creating", "persistentvolume", "upper", name))?;
                    }
                }
            }
            VolumeEffect::PatchUpperVolume(patch) => {
                upper_api
                    .patch(name, &pp, &merge(&patch))
                    .await
                    .map_err(err("updating", "persistentvolume", "upper", name))?;
            }
            VolumeEffect::MarkLowerVolume(patch) => {
                lower_api
                    .patch(name, &pp, &merge(&patch))
                    .await
                    .map_err(err("marking", "persistentvolume", "lower", name))?;
            }
            VolumeEffect::DeleteUpperVolume(uid) => {
                delete_exact(&upper_api, name, Some(uid), None)
                    .await
                    .map_err(err("deleting", "persistentvolume", "upper", name))?;
            }
            VolumeEffect::DeleteLowerVolume(uid) => {
                delete_exact(&lower_api, name, Some(uid), None)
                    .await
                    .map_err(err("deleting", "persistentvolume", "lower", name))?;
            }
            VolumeEffect::UpperNotOurs => {
                tracing::warn!(
                    volume = name,
                    "a PersistentVolume of that name that is not ours exists in the upper cluster; the lower volume is not mirrored"
                );
            }
            VolumeEffect::PatchUpperClaim {
                namespace,
                name: claim,
                patch,
            } => {
                Api::<PersistentVolumeClaim>::namespaced(cfg.upper.clone(), &namespace)
                    .patch(&claim, &pp, &merge(&patch))
                    .await
                    .map_err(err(
                        "reflecting the binding on",
                        "persistentvolumeclaim",
                        "upper",
                        &claim,
                    ))?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)] // test code
mod tests {
    use super::*;
    use serde_json::json;
    use tensile_core::keys::{ANNOTATION_UPPER_UID, LABEL_OWNER, owner_label_value};
    use watcher::Event::Apply;

    const OWNER: &str = "vk-a";

    fn from<T: serde::de::DeserializeOwned>(v: Value) -> T {
        serde_json::from_value(v).unwrap()
    }

    fn upper_claim() -> PersistentVolumeClaim {
        from(
            json!({"metadata": {"name": "data", "namespace": "shop", "uid": "u-claim"},
            "spec": {"accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "1Gi"}}}}),
        )
    }

    fn lower_claim() -> PersistentVolumeClaim {
        from(
            json!({"metadata": {"name": "data", "namespace": "shop", "uid": "l-claim",
                "labels": {(LABEL_OWNER): owner_label_value(OWNER)},
                "annotations": {(ANNOTATION_UPPER_UID): "u-claim"}},
            "spec": {"accessModes": ["ReadWriteOnce"], "volumeName": "pv-7",
                "resources": {"requests": {"storage": "1Gi"}}}}),
        )
    }

    fn lower_volume() -> PersistentVolume {
        from(json!({"metadata": {"name": "pv-7", "uid": "l-pv"},
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                "hostPath": {"path": "/mnt/pv-7"},
                "claimRef": {"namespace": "shop", "name": "data", "uid": "l-claim"}},
            "status": {"phase": "Bound"}}))
    }

    /// An index whose claim caches hold the upper claim and our lower copy, bound to `pv-7`.
    fn index() -> VolumeIndex {
        let claims = Claims::default();
        claims.upper.apply(&Apply(upper_claim()));
        claims.lower.apply(&Apply(lower_claim()));
        VolumeIndex::new(claims, "vk-a".into(), OWNER.into())
    }

    #[test]
    fn a_lower_volume_bound_to_our_claim_is_mirrored_then_marked_and_the_binding_reflected() {
        let index = index();
        assert_eq!(index.apply_volume(false, &Apply(lower_volume())), ["pv-7"]);
        let effects: [VolumeEffect; 1] = index.effects("pv-7").try_into().unwrap();
        let [VolumeEffect::CreateUpperVolume(mut mirror)] = effects else {
            panic!("expected the upper mirror alone");
        };
        assert_eq!(
            mirror
                .spec
                .as_ref()
                .unwrap()
                .claim_ref
                .as_ref()
                .unwrap()
                .uid
                .as_deref(),
            Some("u-claim"),
            "bound to the upper claim"
        );
        mirror.metadata.uid = Some("u-pv".into());
        index.apply_volume(true, &Apply(*mirror));
        let effects = index.effects("pv-7");
        assert!(
            matches!(&effects[..], [VolumeEffect::MarkLowerVolume(_), VolumeEffect::PatchUpperClaim { namespace, name, .. }]
                if namespace == "shop" && name == "data"),
            "{effects:?}"
        );
    }

    #[test]
    fn an_upper_volume_of_the_name_that_is_not_ours_is_never_written_and_is_reported() {
        let index = index();
        index.apply_volume(false, &Apply(lower_volume()));
        let theirs: PersistentVolume = from(json!({"metadata": {"name": "pv-7", "uid": "x"},
            "spec": {"capacity": {"storage": "5Gi"}, "hostPath": {"path": "/x"}}}));
        index.apply_volume(true, &Apply(theirs));
        assert_eq!(index.effects("pv-7"), [VolumeEffect::UpperNotOurs]);
    }

    #[test]
    fn a_claim_change_on_either_side_brings_back_the_volume_our_lower_claim_is_bound_to() {
        let index = index();
        assert_eq!(
            index.volume_of_claim(true, &upper_claim()).as_deref(),
            Some("pv-7")
        );
        assert_eq!(
            index.volume_of_claim(false, &lower_claim()).as_deref(),
            Some("pv-7")
        );
        let mut unbound = lower_claim();
        unbound.spec.as_mut().unwrap().volume_name = None;
        assert_eq!(index.volume_of_claim(false, &unbound), None);
        // A volume that is not bound to a claim of ours is left alone.
        let mut other = lower_volume();
        other.spec.as_mut().unwrap().claim_ref.as_mut().unwrap().uid = Some("someone".into());
        index.apply_volume(false, &Apply(other));
        assert_eq!(index.effects("pv-7"), []);
    }
}
