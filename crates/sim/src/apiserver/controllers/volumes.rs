//! Persistent volumes, as kube-controller-manager's PV controller and kube-scheduler's
//! VolumeBinding plugin handle them, to the extent tests and the sandbox need:
//! - the controller binds claims to volumes: pre-bound pairs (`spec.volumeName` or
//!   `spec.claimRef`), and `Immediate` claims to the smallest matching Available volume; it
//!   marks a claim whose bound volume vanished `Lost`, and releases volumes whose claim is gone
//!   (`Retain`: phase Released; `Delete`: the volume is deleted);
//! - the scheduler (when `Controllers.volume_binding` is on) filters nodes by the node
//!   affinity of bound volumes and by where a `WaitForFirstConsumer` claim can get a volume,
//!   then binds such claims before it binds the pod: to a matching static volume, or to one
//!   it provisions on that node when the claim's class names a provisioner (any but
//!   `kubernetes.io/no-provisioner`), with `volume.kubernetes.io/selected-node` set as
//!   kube-scheduler sets it for provisioning.
//!
//! Binding is written as the PV controller writes it: the volume's `claimRef` (uid and
//! resourceVersion of the claim) and phase Bound; the claim's `volumeName`, the annotations
//! `pv.kubernetes.io/bind-completed` and, when the controller chose the pair,
//! `pv.kubernetes.io/bound-by-controller`, and status Bound with the volume's capacity.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use super::fit::{NodeFacts, Reason, term_matches};
use k8s_openapi::api::core::v1::{NodeSelectorTerm, PersistentVolume, PersistentVolumeClaim};
use serde_json::{Value, json};
use tensile_core::volumes::storage_request;
use tokio_util::sync::CancellationToken;

use super::super::State;
use super::super::kinds::volume::set_volume_phase;
use super::super::meta;
use super::super::resources::ids;
use super::super::rest::DeleteOptions;
use super::super::selectors::LabelSelector;
use super::super::store::{Event, ObjKey};
use super::{Reconciler, create, delete, modify, run_loop};

/// The provisioner name of classes whose volumes are created by hand (static local volumes).
pub const NO_PROVISIONER: &str = "kubernetes.io/no-provisioner";
const ANN_BIND_COMPLETED: &str = "pv.kubernetes.io/bind-completed";
const ANN_BOUND_BY_CONTROLLER: &str = "pv.kubernetes.io/bound-by-controller";
const ANN_SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";
const ANN_STORAGE_PROVISIONER: &str = "volume.kubernetes.io/storage-provisioner";
const ANN_PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";
const YES: &str = "yes";

pub(super) async fn run(state: Arc<State>, stop: CancellationToken) {
    run_loop(state, stop, Duration::from_secs(5), VolumeController).await;
}

struct VolumeController;

impl Reconciler for VolumeController {
    async fn resync(&mut self, state: &State) {
        sync_all(state);
    }

    async fn changed(&mut self, state: &State, events: Option<&[Arc<Event>]>) {
        let relevant = events.is_none_or(|events| {
            events.iter().any(|e| {
                e.res == *ids::PERSISTENT_VOLUMES
                    || e.res == *ids::PERSISTENT_VOLUME_CLAIMS
                    || e.res == *ids::STORAGE_CLASSES
            })
        });
        if relevant {
            sync_all(state);
        }
    }
}

fn all<T: serde::de::DeserializeOwned>(state: &State, res: usize) -> Vec<T> {
    let (items, _, _) = state.store.list(res, None, None, None, |_| true);
    items
        .iter()
        .filter_map(|e| serde_json::from_value((*e.object).clone()).ok())
        .collect()
}

fn claim_key(pvc: &PersistentVolumeClaim) -> ObjKey {
    ObjKey::new(
        pvc.metadata.namespace.clone().unwrap_or_default(),
        pvc.metadata.name.clone().unwrap_or_default(),
    )
}

fn annotation<'a>(
    m: &'a k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    key: &str,
) -> Option<&'a str> {
    m.annotations.as_ref()?.get(key).map(String::as_str)
}

/// Whether `pv.spec.claimRef` names `pvc` (by namespace and name, and uid when it has one).
fn refers_to(pv: &PersistentVolume, pvc: &PersistentVolumeClaim) -> bool {
    let Some(r) = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref()) else {
        return false;
    };
    r.namespace == pvc.metadata.namespace
        && r.name == pvc.metadata.name
        && r.uid
            .as_deref()
            .filter(|u| !u.is_empty())
            .is_none_or(|u| Some(u) == pvc.metadata.uid.as_deref())
}

/// One pass of the PV controller over every claim and volume.
fn sync_all(state: &State) {
    make_available(state);
    let claims: Vec<PersistentVolumeClaim> = all(state, *ids::PERSISTENT_VOLUME_CLAIMS);
    let volumes: Vec<PersistentVolume> = all(state, *ids::PERSISTENT_VOLUMES);
    let by_name: BTreeMap<&str, &PersistentVolume> = volumes
        .iter()
        .filter_map(|v| Some((v.metadata.name.as_deref()?, v)))
        .collect();
    for pvc in &claims {
        if pvc.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let volume_name = pvc
            .spec
            .as_ref()
            .and_then(|s| s.volume_name.as_deref())
            .filter(|n| !n.is_empty());
        match volume_name {
            Some(name) => match by_name.get(name) {
                Some(pv)
                    if pv
                        .spec
                        .as_ref()
                        .and_then(|s| s.claim_ref.as_ref())
                        .is_none()
                        || refers_to(pv, pvc) =>
                {
                    bind(state, name, &claim_key(pvc));
                }
                // Bound elsewhere: the claim waits.
                Some(_) => {}
                None if annotation(&pvc.metadata, ANN_BIND_COMPLETED).is_some() => {
                    set_claim_phase(state, &claim_key(pvc), "Lost");
                }
                None => {}
            },
            None => {
                let pre_bound = volumes.iter().find(|pv| refers_to(pv, pvc));
                let chosen = pre_bound.or_else(|| {
                    (binding_mode(state, pvc) == BindingMode::Immediate)
                        .then(|| best_match(&volumes, pvc, None))
                        .flatten()
                });
                if let Some(name) = chosen.and_then(|pv| pv.metadata.name.as_deref()) {
                    bind(state, name, &claim_key(pvc));
                }
            }
        }
    }
    let provisioners: Vec<String> = all::<Value>(state, *ids::STORAGE_CLASSES)
        .iter()
        .filter_map(|c| c.get("provisioner")?.as_str().map(str::to_owned))
        .filter(|p| p != NO_PROVISIONER)
        .collect();
    let live: BTreeMap<ObjKey, Option<&str>> = claims
        .iter()
        .map(|c| (claim_key(c), c.metadata.uid.as_deref()))
        .collect();
    for pv in &volumes {
        let Some(r) = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref()) else {
            continue;
        };
        let Some(uid) = r.uid.as_deref().filter(|u| !u.is_empty()) else {
            continue;
        };
        let key = ObjKey::new(
            r.namespace.clone().unwrap_or_default(),
            r.name.clone().unwrap_or_default(),
        );
        if live.get(&key).is_some_and(|u| *u == Some(uid)) {
            continue;
        }
        let phase = pv.status.as_ref().and_then(|s| s.phase.as_deref());
        // A volume deleted while Bound is still released (pv-protection waits for that).
        let deleting = pv.metadata.deletion_timestamp.is_some();
        let key = ObjKey::new("", pv.metadata.name.clone().unwrap_or_default());
        let policy = pv
            .spec
            .as_ref()
            .and_then(|s| s.persistent_volume_reclaim_policy.as_deref())
            .unwrap_or("Retain");
        // Only a provisioner serving this cluster deletes a volume; one provisioned elsewhere
        // (a mirrored volume) stays Released, waiting for a deleter that is not here, and a
        // hand-made one cannot be deleted at all (kube: Failed).
        let deleter_here = annotation(&pv.metadata, ANN_PROVISIONED_BY)
            .is_some_and(|p| provisioners.iter().any(|c| c == p));
        let phase = match (policy, deleter_here) {
            ("Delete", true) => {
                // Released first, as kube's controller reclaims only released volumes (and
                // pv-protection holds a deleted volume while it is Bound).
                let _ = modify(state, *ids::PERSISTENT_VOLUMES, &key, |v| {
                    set_volume_phase(v, "Released");
                    true
                });
                if !deleting {
                    let _ = delete(
                        state,
                        *ids::PERSISTENT_VOLUMES,
                        &key,
                        &DeleteOptions::default(),
                    );
                }
                continue;
            }
            _ if matches!(phase, Some("Released" | "Failed")) => continue,
            ("Delete", false) if annotation(&pv.metadata, ANN_PROVISIONED_BY).is_none() => "Failed",
            _ => "Released",
        };
        let _ = modify(state, *ids::PERSISTENT_VOLUMES, &key, |v| {
            set_volume_phase(v, phase);
            true
        });
    }
}

/// A new volume is created Pending; the controller makes it Available when no claim is bound
/// to it yet (no `claimRef`, or one without a uid: pre-bound, waiting for its claim).
fn make_available(state: &State) {
    let (pending, _, _) = state
        .store
        .list(*ids::PERSISTENT_VOLUMES, None, None, None, |e| {
            let o = &e.object;
            !meta::deleting(o)
                && o.pointer("/status/phase")
                    .and_then(Value::as_str)
                    .is_none_or(|p| p.is_empty() || p == "Pending")
                && o.pointer("/spec/claimRef/uid")
                    .and_then(Value::as_str)
                    .is_none_or(str::is_empty)
        });
    for pv in pending {
        let key = ObjKey::new("", meta::name(&pv.object).unwrap_or_default());
        let _ = modify(state, *ids::PERSISTENT_VOLUMES, &key, |v| {
            set_volume_phase(v, "Available");
            true
        });
    }
}

fn set_claim_phase(state: &State, key: &ObjKey, phase: &str) {
    let _ = modify(state, *ids::PERSISTENT_VOLUME_CLAIMS, key, |c| {
        c["status"]["phase"] = json!(phase);
        true
    });
}

/// Binds volume `pv` and claim `key` both ways; idempotent.
fn bind(state: &State, pv: &str, key: &ObjKey) {
    let Some(claim) = state.store.get(*ids::PERSISTENT_VOLUME_CLAIMS, key) else {
        return;
    };
    let claim_uid = meta::meta_str(&claim.object, "uid")
        .unwrap_or_default()
        .to_owned();
    let pv_key = ObjKey::new("", pv);
    let mut volume = None;
    let _ = modify(state, *ids::PERSISTENT_VOLUMES, &pv_key, |v| {
        if v.pointer("/spec/claimRef").is_none_or(Value::is_null) {
            meta::meta_mut(v)
                .entry("annotations")
                .or_insert_with(|| json!({}))[ANN_BOUND_BY_CONTROLLER] = json!(YES);
        }
        // Written once, as kube does: a later change of the claim does not touch the volume.
        let has_uid = v
            .pointer("/spec/claimRef/uid")
            .and_then(Value::as_str)
            .is_some_and(|u| !u.is_empty());
        if !has_uid {
            v["spec"]["claimRef"] = json!({"kind": "PersistentVolumeClaim", "apiVersion": "v1",
                "namespace": key.namespace, "name": key.name, "uid": claim_uid,
                "resourceVersion": claim.rv.to_string()});
        }
        set_volume_phase(v, "Bound");
        volume = Some(v.clone());
        true
    });
    let Some(volume) = volume.or_else(|| {
        state
            .store
            .get(*ids::PERSISTENT_VOLUMES, &pv_key)
            .map(|e| (*e.object).clone())
    }) else {
        return;
    };
    let _ = modify(state, *ids::PERSISTENT_VOLUME_CLAIMS, key, |c| {
        let chosen_here = c
            .pointer("/spec/volumeName")
            .and_then(Value::as_str)
            .is_none_or(str::is_empty);
        let annotations = meta::meta_mut(c)
            .entry("annotations")
            .or_insert_with(|| json!({}));
        annotations[ANN_BIND_COMPLETED] = json!(YES);
        if chosen_here {
            annotations[ANN_BOUND_BY_CONTROLLER] = json!(YES);
        }
        c["spec"]["volumeName"] = json!(pv);
        c["status"] = json!({"phase": "Bound",
            "accessModes": volume.pointer("/spec/accessModes").cloned().unwrap_or(json!([])),
            "capacity": volume.pointer("/spec/capacity").cloned().unwrap_or(json!({}))});
        true
    });
}

#[derive(Debug, PartialEq, Eq)]
enum BindingMode {
    Immediate,
    WaitForFirstConsumer,
}

/// The claim's StorageClass, if it names one that exists.
fn storage_class(state: &State, pvc: &PersistentVolumeClaim) -> Option<Value> {
    let class = pvc
        .spec
        .as_ref()
        .and_then(|s| s.storage_class_name.as_deref())
        .filter(|c| !c.is_empty())?;
    state
        .store
        .get(*ids::STORAGE_CLASSES, &ObjKey::new("", class))
        .map(|e| (*e.object).clone())
}

fn binding_mode(state: &State, pvc: &PersistentVolumeClaim) -> BindingMode {
    match storage_class(state, pvc)
        .as_ref()
        .and_then(|c| c.get("volumeBindingMode"))
        .and_then(Value::as_str)
    {
        Some("WaitForFirstConsumer") => BindingMode::WaitForFirstConsumer,
        _ => BindingMode::Immediate,
    }
}

fn storage_of(
    map: Option<&BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>,
) -> i128 {
    storage_request(map).unwrap_or(0)
}

/// Whether volume `pv` can serve claim `pvc` (on node `node`, when given): Available and not
/// promised to another claim, same class and volume mode, every requested access mode, enough
/// storage, the claim's label selector, and node affinity.
fn satisfies(pv: &PersistentVolume, pvc: &PersistentVolumeClaim, node: Option<&NodeFacts>) -> bool {
    let (Some(spec), Some(want)) = (pv.spec.as_ref(), pvc.spec.as_ref()) else {
        return false;
    };
    let available = pv.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Available")
        && pv.metadata.deletion_timestamp.is_none();
    let free = spec.claim_ref.is_none() || refers_to(pv, pvc);
    let class = |c: Option<&String>| c.cloned().unwrap_or_default();
    let mode = |m: Option<&String>| m.cloned().unwrap_or_else(|| "Filesystem".into());
    let modes = spec.access_modes.clone().unwrap_or_default();
    // The API server's own label-selector matching (an invalid selector matches nothing).
    let selector_ok = want.selector.as_ref().is_none_or(|sel| {
        serde_json::to_value(sel)
            .ok()
            .and_then(|v| LabelSelector::from_label_selector(&v).ok())
            .is_some_and(|s| s.matches(&pv.metadata.labels.clone().unwrap_or_default()))
    });
    available
        && free
        && class(spec.storage_class_name.as_ref()) == class(want.storage_class_name.as_ref())
        && mode(spec.volume_mode.as_ref()) == mode(want.volume_mode.as_ref())
        && want
            .access_modes
            .iter()
            .flatten()
            .all(|m| modes.contains(m))
        && storage_of(spec.capacity.as_ref())
            >= storage_of(want.resources.as_ref().and_then(|r| r.requests.as_ref()))
        && selector_ok
        && node.is_none_or(|n| affinity_allows(pv, n))
}

/// Whether a volume's required node affinity admits node `n` (true without one).
fn affinity_allows(pv: &PersistentVolume, n: &NodeFacts) -> bool {
    let terms: &[NodeSelectorTerm] = pv
        .spec
        .as_ref()
        .and_then(|s| s.node_affinity.as_ref())
        .and_then(|a| a.required.as_ref())
        .map_or(&[], |r| r.node_selector_terms.as_slice());
    terms.is_empty() || terms.iter().any(|t| term_matches(t, &n.name, &n.labels))
}

/// The smallest volume (then first by name) that satisfies the claim.
fn best_match<'v>(
    volumes: &'v [PersistentVolume],
    pvc: &PersistentVolumeClaim,
    node: Option<&NodeFacts>,
) -> Option<&'v PersistentVolume> {
    volumes
        .iter()
        .filter(|pv| satisfies(pv, pvc, node))
        .min_by_key(|pv| {
            (
                storage_of(pv.spec.as_ref().and_then(|s| s.capacity.as_ref())),
                pv.metadata.name.clone(),
            )
        })
}

/// A pod's claims as the scheduler sees them once they all exist.
pub(super) struct PodVolumes {
    /// Volumes of the bound claims.
    bound: Vec<PersistentVolume>,
    /// Unbound `WaitForFirstConsumer` claims, with their class's provisioner.
    delayed: Vec<(PersistentVolumeClaim, String)>,
    /// Every volume, for matching the delayed claims.
    volumes: Vec<PersistentVolume>,
}

/// kube-scheduler's VolumeBinding PreFilter: every claim exists and is usable, and which need
/// binding. The error is the reason the pod is unschedulable on every node.
pub(super) fn prefilter(state: &State, pod: &Value) -> Result<Option<PodVolumes>, String> {
    let namespace = meta::namespace(pod).unwrap_or_default();
    let names: Vec<&str> = pod
        .pointer("/spec/volumes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|v| v.pointer("/persistentVolumeClaim/claimName")?.as_str())
        .collect();
    if names.is_empty() {
        return Ok(None);
    }
    let volumes: Vec<PersistentVolume> = all(state, *ids::PERSISTENT_VOLUMES);
    let mut out = PodVolumes {
        bound: Vec::new(),
        delayed: Vec::new(),
        volumes: Vec::new(),
    };
    for name in names {
        let Some(pvc) = state
            .store
            .get(
                *ids::PERSISTENT_VOLUME_CLAIMS,
                &ObjKey::new(namespace, name),
            )
            .and_then(|e| {
                serde_json::from_value::<PersistentVolumeClaim>((*e.object).clone()).ok()
            })
        else {
            return Err(format!("persistentvolumeclaim \"{name}\" not found"));
        };
        if pvc.metadata.deletion_timestamp.is_some() {
            return Err(format!("persistentvolumeclaim \"{name}\" is being deleted"));
        }
        match pvc
            .spec
            .as_ref()
            .and_then(|s| s.volume_name.as_deref())
            .filter(|v| !v.is_empty())
        {
            Some(volume) => match volumes
                .iter()
                .find(|v| v.metadata.name.as_deref() == Some(volume))
            {
                Some(pv) => out.bound.push(pv.clone()),
                None => {
                    return Err(format!(
                        "pvc {namespace}/{name} is bound to non-existent pv {volume}"
                    ));
                }
            },
            None => {
                let class = storage_class(state, &pvc);
                let class_name = pvc
                    .spec
                    .as_ref()
                    .and_then(|s| s.storage_class_name.clone())
                    .unwrap_or_default();
                if class.is_none() && !class_name.is_empty() {
                    return Err(format!(
                        "storageclass.storage.k8s.io \"{class_name}\" not found"
                    ));
                }
                if binding_mode(state, &pvc) == BindingMode::Immediate {
                    return Err("pod has unbound immediate PersistentVolumeClaims".into());
                }
                let provisioner = class
                    .as_ref()
                    .and_then(|c| c.get("provisioner"))
                    .and_then(Value::as_str)
                    .unwrap_or(NO_PROVISIONER)
                    .to_owned();
                out.delayed.push((pvc, provisioner));
            }
        }
    }
    out.volumes = volumes;
    Ok(Some(out))
}

/// kube-scheduler's VolumeBinding Filter for one node.
pub(super) fn filter(vols: &PodVolumes, node: &NodeFacts) -> Option<Reason> {
    if vols.bound.iter().any(|pv| !affinity_allows(pv, node)) {
        return Some(Reason::VolumeConflict);
    }
    let unserved = vols.delayed.iter().any(|(pvc, provisioner)| {
        provisioner == NO_PROVISIONER && best_match(&vols.volumes, pvc, Some(node)).is_none()
    });
    unserved.then_some(Reason::NoVolume)
}

/// kube-scheduler's VolumeBinding PreBind, done at once: binds each delayed claim to a matching
/// volume on `node`, or provisions one there.
pub(super) async fn bind_for_node(
    state: &State,
    vols: &PodVolumes,
    node: &NodeFacts,
) -> Result<(), String> {
    for (pvc, provisioner) in &vols.delayed {
        let key = claim_key(pvc);
        let volumes: Vec<PersistentVolume> = all(state, *ids::PERSISTENT_VOLUMES);
        if let Some(name) =
            best_match(&volumes, pvc, Some(node)).and_then(|pv| pv.metadata.name.clone())
        {
            bind(state, &name, &key);
            continue;
        }
        if provisioner == NO_PROVISIONER {
            return Err(format!(
                "no volume left for claim {}/{}",
                key.namespace, key.name
            ));
        }
        provision(state, pvc, provisioner, &node.name).await?;
    }
    Ok(())
}

/// The local volume a provisioner makes on `node` for `pvc` (named `pvc-<claim uid>`,
/// pre-bound to the claim, marked with the provisioner's name).
pub fn provisioned_volume(
    pvc: &PersistentVolumeClaim,
    provisioner: &str,
    node: &str,
    reclaim_policy: &str,
) -> Value {
    let spec = pvc.spec.clone().unwrap_or_default();
    let uid = pvc.metadata.uid.clone().unwrap_or_default();
    let name = format!("pvc-{uid}");
    json!({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": name, "annotations": {ANN_PROVISIONED_BY: provisioner}},
        "spec": {
            "capacity": spec.resources.as_ref().and_then(|r| r.requests.as_ref()).map(|r| json!(r)).unwrap_or(json!({})),
            "accessModes": spec.access_modes.clone().unwrap_or_default(),
            "persistentVolumeReclaimPolicy": reclaim_policy,
            "storageClassName": spec.storage_class_name.clone().unwrap_or_default(),
            "volumeMode": spec.volume_mode.clone().unwrap_or_else(|| "Filesystem".into()),
            "local": {"path": format!("/var/lib/tensile-sim/volumes/{name}")},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}]}},
            "claimRef": {"kind": "PersistentVolumeClaim", "apiVersion": "v1",
                "namespace": pvc.metadata.namespace, "name": pvc.metadata.name, "uid": uid},
        },
    })
}

/// Creates a local volume on `node` for the claim, as a provisioner would, and binds it.
async fn provision(
    state: &State,
    pvc: &PersistentVolumeClaim,
    provisioner: &str,
    node: &str,
) -> Result<(), String> {
    let key = claim_key(pvc);
    let _ = modify(state, *ids::PERSISTENT_VOLUME_CLAIMS, &key, |c| {
        let annotations = meta::meta_mut(c)
            .entry("annotations")
            .or_insert_with(|| json!({}));
        annotations[ANN_SELECTED_NODE] = json!(node);
        annotations[ANN_STORAGE_PROVISIONER] = json!(provisioner);
        true
    });
    let uid = pvc.metadata.uid.clone().unwrap_or_default();
    let name = format!("pvc-{uid}");
    let policy = storage_class(state, pvc)
        .and_then(|c| {
            c.get("reclaimPolicy")
                .and_then(Value::as_str)
                .map(str::to_owned)
        })
        .unwrap_or_else(|| "Delete".into());
    let pv = provisioned_volume(pvc, provisioner, node, &policy);
    match create(
        state,
        *ids::PERSISTENT_VOLUMES,
        None,
        pv,
        "persistentvolume-controller",
    )
    .await
    {
        Ok(_) => {}
        Err(e) if e.code == 409 => {}
        Err(e) => {
            return Err(format!(
                "provisioning a volume for {}/{}: {}",
                key.namespace, key.name, e.message
            ));
        }
    }
    bind(state, &name, &key);
    Ok(())
}
