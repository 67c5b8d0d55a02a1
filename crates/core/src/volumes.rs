//! PersistentVolumes and claims of offloaded pods (`PVControllers`; its fixes of the original
//! are in `docs/differences.md`): the lower cluster binds (or provisions) the volume of a claim
//! our pod uses, and the upper cluster is made to reflect it, so the user sees the claim Bound
//! to a volume pinned to the virtual node.
//!
//! - Lower claims are our copies of upper ones ([`crate::deps::lower_pvc`]); they follow the
//!   upper claim's deletion and storage expansion ([`claim_action`]).
//! - A lower volume bound to one of our claims gets a mirror upstairs, same name
//!   ([`upper_volume`]): hostname node affinity rewritten to the virtual node, claimRef to the
//!   upper claim. Then the lower volume is marked ours (owner label, `global`, the upper
//!   volume's UID), which is how a later deletion of the upper volume is told apart from one not
//!   made yet ([`volume_action`]).
//! - Once the upper volume exists, the upper claim gets the lower binding: `volumeName`, the
//!   binding annotations, `global`, `selected-node` = the virtual node ([`upper_claim_patch`]).
//!   Not before: a claim marked bind-completed whose volume is missing is marked Lost by the
//!   upper PV controller.
//!
//! We never delete a volume or a claim on our own initiative: deletions follow the user's
//! deletions of the upper objects, and a lower volume's own deletion. What happens to the data
//! is the lower reclaim policy's business.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    ObjectReference, PersistentVolume, PersistentVolumeClaim, PersistentVolumeSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::{Map, Value, json};

use crate::deps::{CopyAction, is_owned_by};
use crate::keys;
use crate::quantity::from_quantity;

/// PVC annotations that describe the lower binding and are reflected upstairs.
const REFLECTED_CLAIM_ANNOTATIONS: &[&str] = &[
    "pv.kubernetes.io/bind-completed",
    "pv.kubernetes.io/bound-by-controller",
    "volume.kubernetes.io/storage-provisioner",
    "volume.beta.kubernetes.io/storage-provisioner",
];

/// PV annotation the lower PV controller sets when it chose the claim; upstairs the pair is
/// pre-bound by us, and with it the upper PV controller would unbind instead of release.
const ANNOTATION_BOUND_BY_CONTROLLER: &str = "pv.kubernetes.io/bound-by-controller";

fn annotation<'a>(meta: &'a ObjectMeta, key: &str) -> Option<&'a str> {
    meta.annotations.as_ref()?.get(key).map(String::as_str)
}

/// The `storage` entry of a requests or capacity map, in nano-units.
pub fn storage_request(requests: Option<&BTreeMap<String, Quantity>>) -> Option<i128> {
    requests?
        .get("storage")
        .and_then(|q| from_quantity(q).ok())
        .map(|q| q.nanos)
}

/// What to do with our lower claim given its upper original: create it when a pod of ours
/// `needed` it and it is missing (the copy controller is the only writer of copies); delete it when the original is
/// being deleted, replaced by a new claim of the same name, or gone and no pod of ours `needed`
/// it any more (a claim absent from the upper cache while a pod uses it may only be one the
/// cache has not caught up with: the pod controller read it a moment ago); follow a storage
/// expansion (never a shrink, which no API server accepts). Claims that are not ours are never
/// touched.
pub fn claim_action(
    upper: Option<&PersistentVolumeClaim>,
    lower: Option<&PersistentVolumeClaim>,
    owner: &str,
    needed: bool,
) -> CopyAction<PersistentVolumeClaim> {
    let Some(lower) = lower else {
        return match upper.filter(|u| u.metadata.deletion_timestamp.is_none()) {
            Some(upper) if needed => CopyAction::Create(crate::deps::lower_pvc(upper, owner)),
            _ => CopyAction::Nothing,
        };
    };
    if !is_owned_by(&lower.metadata, owner) {
        return CopyAction::Nothing;
    }
    if lower.metadata.deletion_timestamp.is_some() {
        return CopyAction::Nothing;
    }
    let Some(upper) = upper else {
        return if needed {
            CopyAction::Nothing
        } else {
            CopyAction::Delete
        };
    };
    if upper.metadata.deletion_timestamp.is_some() {
        return CopyAction::Delete;
    }
    if upper.metadata.uid.as_deref() != annotation(&lower.metadata, keys::ANNOTATION_UPPER_UID) {
        return CopyAction::Delete;
    }
    let requests = |c: &PersistentVolumeClaim| {
        c.spec
            .as_ref()
            .and_then(|s| s.resources.as_ref())
            .and_then(|r| r.requests.as_ref())
            .cloned()
    };
    let (wanted, has) = (requests(upper), requests(lower));
    match (
        storage_request(wanted.as_ref()),
        storage_request(has.as_ref()),
    ) {
        (Some(w), Some(h)) if w > h => {
            let mut grown = lower.clone();
            if let Some(r) = grown.spec.as_mut().and_then(|s| s.resources.as_mut()) {
                let mut requests = has.unwrap_or_default();
                if let Some(q) = wanted.as_ref().and_then(|w| w.get("storage")) {
                    requests.insert("storage".into(), q.clone());
                }
                r.requests = Some(requests);
            }
            CopyAction::Update(grown)
        }
        _ => CopyAction::Nothing,
    }
}

/// The claim a volume is bound to: `(namespace, name, uid)` of its claimRef, when its phase is
/// Bound.
pub fn bound_claim(pv: &PersistentVolume) -> Option<(&str, &str, &str)> {
    if pv.status.as_ref()?.phase.as_deref() != Some("Bound") {
        return None;
    }
    let r = pv.spec.as_ref()?.claim_ref.as_ref()?;
    Some((
        r.namespace.as_deref()?,
        r.name.as_deref()?,
        r.uid.as_deref()?,
    ))
}

/// The upper mirror of lower volume `lower`, bound to upper claim `claim`, on virtual node
/// `node_name`, made by node `owner`: the lower spec with every `kubernetes.io/hostname` (and
/// beta) requirement of its required node affinity pointing at the virtual node, and a claimRef
/// naming the upper claim (its UID and resourceVersion). Status is the upper PV controller's.
pub fn upper_volume(
    lower: &PersistentVolume,
    claim: &PersistentVolumeClaim,
    node_name: &str,
    owner: &str,
) -> PersistentVolume {
    let mut labels = lower.metadata.labels.clone().unwrap_or_default();
    labels.insert(keys::LABEL_OWNER.to_owned(), keys::owner_label_value(owner));
    let mut annotations = lower.metadata.annotations.clone().unwrap_or_default();
    annotations.remove(keys::ANNOTATION_UPPER_UID);
    annotations.remove(ANNOTATION_BOUND_BY_CONTROLLER);
    annotations.insert(
        keys::ANNOTATION_GLOBAL.to_owned(),
        keys::VALUE_TRUE.to_owned(),
    );
    let mut spec = lower.spec.clone().unwrap_or_default();
    pin_to_node(&mut spec, node_name);
    spec.claim_ref = Some(ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("PersistentVolumeClaim".into()),
        namespace: claim.metadata.namespace.clone(),
        name: claim.metadata.name.clone(),
        uid: claim.metadata.uid.clone(),
        resource_version: claim.metadata.resource_version.clone(),
        ..ObjectReference::default()
    });
    PersistentVolume {
        metadata: ObjectMeta {
            name: lower.metadata.name.clone(),
            labels: Some(labels),
            annotations: Some(annotations),
            ..ObjectMeta::default()
        },
        spec: Some(spec),
        status: None,
    }
}

/// Rewrites the hostname requirements of a volume's required node affinity to `node_name`.
fn pin_to_node(spec: &mut PersistentVolumeSpec, node_name: &str) {
    let terms = spec
        .node_affinity
        .as_mut()
        .and_then(|a| a.required.as_mut())
        .map(|r| r.node_selector_terms.iter_mut());
    for term in terms.into_iter().flatten() {
        let requirements = term
            .match_expressions
            .iter_mut()
            .flatten()
            .chain(term.match_fields.iter_mut().flatten());
        for r in requirements {
            if r.key == keys::LABEL_HOSTNAME || r.key == keys::LABEL_HOSTNAME_BETA {
                r.values = Some(vec![node_name.to_owned()]);
            }
        }
    }
}

/// What the volume controller does for one volume name.
#[derive(Clone, Debug, PartialEq)]
pub enum VolumeAction {
    /// In step, or none of ours.
    Nothing,
    /// Create the upper mirror.
    CreateUpper(Box<PersistentVolume>),
    /// Merge-patch the upper volume with this (the lower one grew, or its policy changed).
    PatchUpper(Value),
    /// Merge-patch the lower volume with this: our marks, once its upper mirror exists.
    MarkLower(Value),
    /// Delete the upper volume, this UID as precondition: its lower volume is gone or going.
    DeleteUpper(String),
    /// Delete the lower volume, this UID as precondition: the user deleted its upper mirror.
    DeleteLower(String),
    /// An upper volume of that name exists and is not ours: nothing is written.
    Conflict,
}

/// The claims a lower volume is bound to, as the caches hold them.
#[derive(Clone, Copy, Debug, Default)]
pub struct Claims<'a> {
    /// Our lower claim the lower volume's claimRef names (namespace and name).
    pub lower: Option<&'a PersistentVolumeClaim>,
    /// The upper claim of the same namespace and name.
    pub upper: Option<&'a PersistentVolumeClaim>,
}

/// [`VolumeAction`] for the volume present as `lower` and `upper` (either possibly absent) in
/// the two clusters, for node `owner` presented as virtual node `node_name`.
pub fn volume_action(
    lower: Option<&PersistentVolume>,
    upper: Option<&PersistentVolume>,
    claims: Claims<'_>,
    node_name: &str,
    owner: &str,
) -> VolumeAction {
    let upper_ours = upper.filter(|u| is_owned_by(&u.metadata, owner));
    let delete_upper = || match upper_ours {
        Some(u) if u.metadata.deletion_timestamp.is_none() => {
            VolumeAction::DeleteUpper(u.metadata.uid.clone().unwrap_or_default())
        }
        _ => VolumeAction::Nothing,
    };
    let Some(lower) = lower.filter(|l| l.metadata.deletion_timestamp.is_none()) else {
        return delete_upper();
    };
    let lower_uid = lower.metadata.uid.clone().unwrap_or_default();
    if is_owned_by(&lower.metadata, owner) {
        // Mirrored before: the upper volume is the one whose UID we recorded, or it was deleted.
        let recorded = annotation(&lower.metadata, keys::ANNOTATION_UPPER_UID);
        return match upper {
            Some(u)
                if u.metadata.uid.as_deref() == recorded
                    && u.metadata.deletion_timestamp.is_none() =>
            {
                upper_volume_patch(lower, u).map_or(VolumeAction::Nothing, VolumeAction::PatchUpper)
            }
            _ => VolumeAction::DeleteLower(lower_uid),
        };
    }
    let claimed = match (bound_claim(lower), claims.lower) {
        (Some((ns, name, uid)), Some(c)) => {
            is_owned_by(&c.metadata, owner)
                && c.metadata.namespace.as_deref() == Some(ns)
                && c.metadata.name.as_deref() == Some(name)
                && c.metadata.uid.as_deref() == Some(uid)
        }
        _ => false,
    };
    if !claimed {
        return VolumeAction::Nothing;
    }
    match upper {
        None => {
            // The upper claim our lower claim copies, not one re-created under the same name.
            let upper_claim = claims.upper.filter(|u| {
                u.metadata.deletion_timestamp.is_none()
                    && claims.lower.is_some_and(|l| {
                        annotation(&l.metadata, keys::ANNOTATION_UPPER_UID)
                            == u.metadata.uid.as_deref()
                    })
            });
            upper_claim.map_or(VolumeAction::Nothing, |c| {
                VolumeAction::CreateUpper(Box::new(upper_volume(lower, c, node_name, owner)))
            })
        }
        // Ours but being deleted before it was recorded: wait for it to go, then mirror anew.
        Some(u) if upper_ours.is_some() && u.metadata.deletion_timestamp.is_some() => {
            VolumeAction::Nothing
        }
        Some(u) if upper_ours.is_some() => VolumeAction::MarkLower(json!({"metadata": {
            "labels": {(keys::LABEL_OWNER): keys::owner_label_value(owner)},
            "annotations": {
                (keys::ANNOTATION_GLOBAL): keys::VALUE_TRUE,
                (keys::ANNOTATION_UPPER_UID): u.metadata.uid.clone().unwrap_or_default(),
            },
        }})),
        Some(_) => VolumeAction::Conflict,
    }
}

/// The merge patch that brings the upper mirror `upper` in line with lower volume `lower`
/// (capacity, reclaim policy, mount options, the lower annotations), if anything differs.
fn upper_volume_patch(lower: &PersistentVolume, upper: &PersistentVolume) -> Option<Value> {
    let (l, u) = (lower.spec.as_ref()?, upper.spec.as_ref()?);
    let mut spec = Map::new();
    if l.capacity != u.capacity {
        spec.insert("capacity".into(), json!(l.capacity));
    }
    if l.persistent_volume_reclaim_policy != u.persistent_volume_reclaim_policy {
        spec.insert(
            "persistentVolumeReclaimPolicy".into(),
            json!(l.persistent_volume_reclaim_policy),
        );
    }
    if l.mount_options != u.mount_options {
        spec.insert("mountOptions".into(), json!(l.mount_options));
    }
    let current = upper.metadata.annotations.clone().unwrap_or_default();
    let annotations: Map<String, Value> = lower
        .metadata
        .annotations
        .iter()
        .flatten()
        .filter(|(k, _)| *k != keys::ANNOTATION_UPPER_UID && *k != ANNOTATION_BOUND_BY_CONTROLLER)
        .filter(|(k, v)| current.get(*k) != Some(*v))
        .map(|(k, v)| (k.clone(), json!(v)))
        .collect();
    let mut patch = Map::new();
    if !spec.is_empty() {
        patch.insert("spec".into(), Value::Object(spec));
    }
    if !annotations.is_empty() {
        patch.insert("metadata".into(), json!({"annotations": annotations}));
    }
    (!patch.is_empty()).then_some(Value::Object(patch))
}

/// The merge patch that makes upper claim `upper` reflect the binding of our lower copy
/// `lower`, once our upper mirror of its volume exists (`mirror`, the upper volume of that name
/// if any; before it is there, the upper PV controller would mark a claim with bind-completed
/// but no volume Lost). `None` when nothing is to change, when the lower claim is unbound or
/// not a copy of this upper claim, and when the upper claim is already bound to another volume
/// (`volumeName` is set once).
pub fn upper_claim_patch(
    upper: &PersistentVolumeClaim,
    lower: &PersistentVolumeClaim,
    mirror: Option<&PersistentVolume>,
    node_name: &str,
    owner: &str,
) -> Option<Value> {
    let volume = lower
        .spec
        .as_ref()?
        .volume_name
        .as_deref()
        .filter(|v| !v.is_empty())?;
    let mirrored = mirror.is_some_and(|m| {
        m.metadata.name.as_deref() == Some(volume)
            && is_owned_by(&m.metadata, owner)
            && m.metadata.deletion_timestamp.is_none()
    });
    if !mirrored
        || upper.metadata.deletion_timestamp.is_some()
        || upper.metadata.uid.as_deref() != annotation(&lower.metadata, keys::ANNOTATION_UPPER_UID)
    {
        return None;
    }
    let current = upper
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.as_deref())
        .filter(|v| !v.is_empty());
    let mut patch = Map::new();
    match current {
        Some(v) if v != volume => return None,
        Some(_) => {}
        None => {
            patch.insert("spec".into(), json!({"volumeName": volume}));
        }
    }
    let mut wanted: BTreeMap<&str, &str> = REFLECTED_CLAIM_ANNOTATIONS
        .iter()
        .filter_map(|k| Some((*k, annotation(&lower.metadata, k)?)))
        .collect();
    wanted.insert(keys::ANNOTATION_GLOBAL, keys::VALUE_TRUE);
    if annotation(&lower.metadata, keys::ANNOTATION_SELECTED_NODE).is_some_and(|n| !n.is_empty()) {
        wanted.insert(keys::ANNOTATION_SELECTED_NODE, node_name);
    }
    let annotations: Map<String, Value> = wanted
        .into_iter()
        .filter(|(k, v)| annotation(&upper.metadata, k) != Some(*v))
        .map(|(k, v)| (k.to_owned(), json!(v)))
        .collect();
    if !annotations.is_empty() {
        patch.insert("metadata".into(), json!({"annotations": annotations}));
    }
    (!patch.is_empty()).then_some(Value::Object(patch))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const OWNER: &str = "vk-a";

    fn gone() -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Time {
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Default::default())
    }

    fn from<T: serde::de::DeserializeOwned>(v: Value) -> T {
        serde_json::from_value(v).unwrap()
    }

    fn ours() -> Value {
        json!({(keys::LABEL_OWNER): keys::owner_label_value(OWNER)})
    }

    fn upper_claim() -> PersistentVolumeClaim {
        from(
            json!({"metadata": {"name": "data", "namespace": "shop", "uid": "u-claim",
            "resourceVersion": "41"},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "local",
                "resources": {"requests": {"storage": "1Gi"}}}}),
        )
    }

    fn lower_claim(volume: Option<&str>) -> PersistentVolumeClaim {
        from(
            json!({"metadata": {"name": "data", "namespace": "shop", "uid": "l-claim",
            "labels": ours(), "annotations": {(keys::ANNOTATION_UPPER_UID): "u-claim",
                "pv.kubernetes.io/bind-completed": "yes",
                "pv.kubernetes.io/bound-by-controller": "yes",
                (keys::ANNOTATION_SELECTED_NODE): "lower-node-2"}},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "local",
                "volumeName": volume, "resources": {"requests": {"storage": "1Gi"}}}}),
        )
    }

    fn lower_volume() -> PersistentVolume {
        from(json!({"metadata": {"name": "pv-7", "uid": "l-pv",
            "annotations": {"pv.kubernetes.io/provisioned-by": "local-path",
                "pv.kubernetes.io/bound-by-controller": "yes"}},
            "spec": {"capacity": {"storage": "2Gi"}, "accessModes": ["ReadWriteOnce"],
                "persistentVolumeReclaimPolicy": "Delete", "storageClassName": "local",
                "local": {"path": "/mnt/pv-7"},
                "nodeAffinity": {"required": {"nodeSelectorTerms": [
                    {"matchExpressions": [
                        {"key": "kubernetes.io/hostname", "operator": "In", "values": ["lower-node-2"]},
                        {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["z1"]}]},
                    {"matchExpressions": [
                        {"key": "beta.kubernetes.io/hostname", "operator": "In", "values": ["lower-node-3"]}]}]}},
                "claimRef": {"namespace": "shop", "name": "data", "uid": "l-claim", "resourceVersion": "9"}},
            "status": {"phase": "Bound"}}))
    }

    fn claims<'a>(l: &'a PersistentVolumeClaim, u: &'a PersistentVolumeClaim) -> Claims<'a> {
        Claims {
            lower: Some(l),
            upper: Some(u),
        }
    }

    fn created(action: VolumeAction) -> PersistentVolume {
        match action {
            VolumeAction::CreateUpper(pv) => *pv,
            other => panic!("expected CreateUpper, got {other:?}"),
        }
    }

    #[test]
    fn a_lower_volume_bound_to_our_claim_is_mirrored_upstairs_pinned_to_the_virtual_node() {
        let (l, u) = (lower_claim(Some("pv-7")), upper_claim());
        let pv = created(volume_action(
            Some(&lower_volume()),
            None,
            claims(&l, &u),
            "vk-a",
            OWNER,
        ));
        assert_eq!(pv.metadata.name.as_deref(), Some("pv-7"));
        assert!(is_owned_by(&pv.metadata, OWNER));
        assert_eq!(
            annotation(&pv.metadata, keys::ANNOTATION_GLOBAL),
            Some("true")
        );
        assert_eq!(
            annotation(&pv.metadata, "pv.kubernetes.io/provisioned-by"),
            Some("local-path")
        );
        assert_eq!(
            annotation(&pv.metadata, ANNOTATION_BOUND_BY_CONTROLLER),
            None
        );
        let spec = pv.spec.unwrap();
        let terms = spec
            .node_affinity
            .unwrap()
            .required
            .unwrap()
            .node_selector_terms;
        let values = |t: usize, e: usize| {
            terms[t].match_expressions.as_ref().unwrap()[e]
                .values
                .clone()
        };
        assert_eq!(values(0, 0), Some(vec!["vk-a".to_owned()]));
        assert_eq!(
            values(0, 1),
            Some(vec!["z1".to_owned()]),
            "other keys untouched"
        );
        assert_eq!(
            values(1, 0),
            Some(vec!["vk-a".to_owned()]),
            "beta hostname too"
        );
        let claim_ref = spec.claim_ref.unwrap();
        assert_eq!(claim_ref.uid.as_deref(), Some("u-claim"));
        assert_eq!(claim_ref.resource_version.as_deref(), Some("41"));
        assert_eq!(claim_ref.name.as_deref(), Some("data"));
        assert_eq!(
            spec.persistent_volume_reclaim_policy.as_deref(),
            Some("Delete")
        );
        assert!(pv.status.is_none());
    }

    #[test]
    fn a_lower_volume_not_bound_to_one_of_our_claims_is_left_alone() {
        let u = upper_claim();
        let mut theirs = lower_claim(Some("pv-7"));
        theirs.metadata.labels = None;
        let other_uid = {
            let mut c = lower_claim(Some("pv-7"));
            c.metadata.uid = Some("someone-else".into());
            c
        };
        let mut released = lower_volume();
        released.status = None;
        for (pv, l) in [
            (lower_volume(), &theirs),
            (lower_volume(), &other_uid),
            (released, &lower_claim(Some("pv-7"))),
        ] {
            assert_eq!(
                volume_action(Some(&pv), None, claims(l, &u), "vk-a", OWNER),
                VolumeAction::Nothing
            );
        }
        // No upper claim (or a new one under the same name): nothing to bind the mirror to.
        let l = lower_claim(Some("pv-7"));
        let mut recreated = upper_claim();
        recreated.metadata.uid = Some("u-claim-2".into());
        assert_eq!(
            volume_action(
                Some(&lower_volume()),
                None,
                claims(&l, &recreated),
                "vk-a",
                OWNER
            ),
            VolumeAction::Nothing
        );
    }

    #[test]
    fn once_the_upper_mirror_exists_the_lower_volume_gets_global_and_our_marks_in_one_patch() {
        let (l, u) = (lower_claim(Some("pv-7")), upper_claim());
        let mut mirror = created(volume_action(
            Some(&lower_volume()),
            None,
            claims(&l, &u),
            "vk-a",
            OWNER,
        ));
        mirror.metadata.uid = Some("u-pv".into());
        let action = volume_action(
            Some(&lower_volume()),
            Some(&mirror),
            claims(&l, &u),
            "vk-a",
            OWNER,
        );
        let VolumeAction::MarkLower(patch) = action else {
            panic!("expected MarkLower, got {action:?}");
        };
        assert_eq!(
            patch["metadata"]["annotations"][keys::ANNOTATION_GLOBAL],
            "true"
        );
        assert_eq!(
            patch["metadata"]["annotations"][keys::ANNOTATION_UPPER_UID],
            "u-pv"
        );
        assert_eq!(
            patch["metadata"]["labels"][keys::LABEL_OWNER],
            keys::owner_label_value(OWNER).as_str()
        );
        // An upper volume of that name that is not ours is never written.
        let mut foreign = mirror.clone();
        foreign.metadata.labels = None;
        assert_eq!(
            volume_action(
                Some(&lower_volume()),
                Some(&foreign),
                claims(&l, &u),
                "vk-a",
                OWNER
            ),
            VolumeAction::Conflict
        );
    }

    fn marked(upper_uid: &str) -> PersistentVolume {
        let mut pv = lower_volume();
        pv.metadata.labels = Some(from(ours()));
        pv.metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(keys::ANNOTATION_UPPER_UID.into(), upper_uid.into());
        pv
    }

    fn mirror_of(lower: &PersistentVolume, uid: &str) -> PersistentVolume {
        let mut pv = upper_volume(lower, &upper_claim(), "vk-a", OWNER);
        pv.metadata.uid = Some(uid.into());
        pv
    }

    #[test]
    fn deleting_the_upper_mirror_deletes_the_lower_volume_by_uid_and_nothing_else() {
        let (l, u) = (lower_claim(Some("pv-7")), upper_claim());
        let lower = marked("u-pv");
        let mirror = mirror_of(&lower, "u-pv");
        assert_eq!(
            volume_action(Some(&lower), Some(&mirror), claims(&l, &u), "vk-a", OWNER),
            VolumeAction::Nothing,
            "in step"
        );
        assert_eq!(
            volume_action(Some(&lower), None, claims(&l, &u), "vk-a", OWNER),
            VolumeAction::DeleteLower("l-pv".into())
        );
        let mut going = mirror.clone();
        going.metadata.deletion_timestamp = Some(gone());
        assert_eq!(
            volume_action(Some(&lower), Some(&going), claims(&l, &u), "vk-a", OWNER),
            VolumeAction::DeleteLower("l-pv".into())
        );
        // Another node's marks, or none: never ours to delete.
        let unmarked = lower_volume();
        let mut claim_of_other = l.clone();
        claim_of_other.metadata.labels = None;
        assert_eq!(
            volume_action(
                Some(&unmarked),
                None,
                claims(&claim_of_other, &u),
                "vk-a",
                OWNER
            ),
            VolumeAction::Nothing
        );
        assert_eq!(
            volume_action(Some(&lower), None, claims(&l, &u), "vk-a", "vk-b"),
            VolumeAction::Nothing
        );
    }

    #[test]
    fn a_lower_volume_being_deleted_or_gone_deletes_our_upper_mirror_by_uid() {
        let (l, u) = (lower_claim(Some("pv-7")), upper_claim());
        let mut lower = marked("u-pv");
        let mirror = mirror_of(&lower, "u-pv");
        lower.metadata.deletion_timestamp = Some(gone());
        assert_eq!(
            volume_action(Some(&lower), Some(&mirror), claims(&l, &u), "vk-a", OWNER),
            VolumeAction::DeleteUpper("u-pv".into())
        );
        assert_eq!(
            volume_action(None, Some(&mirror), Claims::default(), "vk-a", OWNER),
            VolumeAction::DeleteUpper("u-pv".into())
        );
        let mut going = mirror.clone();
        going.metadata.deletion_timestamp = Some(gone());
        assert_eq!(
            volume_action(None, Some(&going), Claims::default(), "vk-a", OWNER),
            VolumeAction::Nothing
        );
        let mut foreign = mirror;
        foreign.metadata.labels = None;
        assert_eq!(
            volume_action(None, Some(&foreign), Claims::default(), "vk-a", OWNER),
            VolumeAction::Nothing
        );
    }

    #[test]
    fn a_grown_or_re_policied_lower_volume_is_patched_onto_its_mirror() {
        let (l, u) = (lower_claim(Some("pv-7")), upper_claim());
        let mut lower = marked("u-pv");
        let mirror = mirror_of(&lower, "u-pv");
        let spec = lower.spec.as_mut().unwrap();
        spec.capacity = Some(from(json!({"storage": "4Gi"})));
        spec.persistent_volume_reclaim_policy = Some("Retain".into());
        let action = volume_action(Some(&lower), Some(&mirror), claims(&l, &u), "vk-a", OWNER);
        assert_eq!(
            action,
            VolumeAction::PatchUpper(json!({"spec": {"capacity": {"storage": "4Gi"},
                "persistentVolumeReclaimPolicy": "Retain"}}))
        );
    }

    #[test]
    fn the_upper_claim_gets_the_lower_binding_only_once_the_upper_volume_exists() {
        let (l, u) = (lower_claim(Some("pv-7")), upper_claim());
        let mirror = mirror_of(&marked("u-pv"), "u-pv");
        let mut foreign = mirror.clone();
        foreign.metadata.labels = None;
        let mut going = mirror.clone();
        going.metadata.deletion_timestamp = Some(gone());
        for absent in [None, Some(&foreign), Some(&going)] {
            assert_eq!(upper_claim_patch(&u, &l, absent, "vk-a", OWNER), None);
        }
        let mirror = Some(&mirror);
        let patch = upper_claim_patch(&u, &l, mirror, "vk-a", OWNER).unwrap();
        assert_eq!(
            patch,
            json!({"spec": {"volumeName": "pv-7"}, "metadata": {"annotations": {
                "pv.kubernetes.io/bind-completed": "yes",
                "pv.kubernetes.io/bound-by-controller": "yes",
                (keys::ANNOTATION_GLOBAL): "true",
                (keys::ANNOTATION_SELECTED_NODE): "vk-a"}}})
        );
        // Applied: nothing more to do.
        let mut applied = u.clone();
        applied.spec.as_mut().unwrap().volume_name = Some("pv-7".into());
        applied.metadata.annotations = Some(from(patch["metadata"]["annotations"].clone()));
        assert_eq!(upper_claim_patch(&applied, &l, mirror, "vk-a", OWNER), None);
        // Unbound downstairs, bound to another volume upstairs, or a different upper claim.
        assert_eq!(
            upper_claim_patch(&u, &lower_claim(None), mirror, "vk-a", OWNER),
            None
        );
        let mut elsewhere = u.clone();
        elsewhere.spec.as_mut().unwrap().volume_name = Some("pv-other".into());
        assert_eq!(
            upper_claim_patch(&elsewhere, &l, mirror, "vk-a", OWNER),
            None
        );
        let mut recreated = u.clone();
        recreated.metadata.uid = Some("u-claim-2".into());
        assert_eq!(
            upper_claim_patch(&recreated, &l, mirror, "vk-a", OWNER),
            None
        );
    }

    #[test]
    fn our_lower_claim_follows_deletion_replacement_and_expansion_of_the_upper_one() {
        let (l, u) = (lower_claim(None), upper_claim());
        // Missing: created while a pod needs it and its original is there, not otherwise.
        let CopyAction::Create(copy) = claim_action(Some(&u), None, OWNER, true) else {
            panic!("expected a create");
        };
        assert_eq!(copy, crate::deps::lower_pvc(&u, OWNER));
        assert_eq!(
            claim_action(Some(&u), None, OWNER, false),
            CopyAction::Nothing
        );
        let mut deleting = u.clone();
        deleting.metadata.deletion_timestamp = Some(gone());
        assert_eq!(
            claim_action(Some(&deleting), None, OWNER, true),
            CopyAction::Nothing
        );
        assert_eq!(
            claim_action(Some(&u), Some(&l), OWNER, true),
            CopyAction::Nothing
        );
        assert_eq!(
            claim_action(None, Some(&l), OWNER, false),
            CopyAction::Delete
        );
        // Gone from the cache while a pod uses it: maybe not seen yet; kept until no pod does.
        assert_eq!(
            claim_action(None, Some(&l), OWNER, true),
            CopyAction::Nothing
        );
        let mut going = u.clone();
        going.metadata.deletion_timestamp = Some(gone());
        assert_eq!(
            claim_action(Some(&going), Some(&l), OWNER, true),
            CopyAction::Delete
        );
        let mut recreated = u.clone();
        recreated.metadata.uid = Some("u-claim-2".into());
        assert_eq!(
            claim_action(Some(&recreated), Some(&l), OWNER, true),
            CopyAction::Delete
        );
        let mut grown = u.clone();
        grown.spec.as_mut().unwrap().resources =
            Some(from(json!({"requests": {"storage": "5Gi"}})));
        let CopyAction::Update(copy) = claim_action(Some(&grown), Some(&l), OWNER, true) else {
            panic!("expected an update");
        };
        let requests = copy.spec.unwrap().resources.unwrap().requests.unwrap();
        assert_eq!(requests["storage"], Quantity("5Gi".into()));
        let mut shrunk = u.clone();
        shrunk.spec.as_mut().unwrap().resources =
            Some(from(json!({"requests": {"storage": "1Mi"}})));
        assert_eq!(
            claim_action(Some(&shrunk), Some(&l), OWNER, true),
            CopyAction::Nothing
        );
        // Not ours, or already going: never touched.
        let mut theirs = l.clone();
        theirs.metadata.labels = None;
        assert_eq!(
            claim_action(None, Some(&theirs), OWNER, false),
            CopyAction::Nothing
        );
        let mut deleting = l.clone();
        deleting.metadata.deletion_timestamp = Some(gone());
        assert_eq!(
            claim_action(None, Some(&deleting), OWNER, false),
            CopyAction::Nothing
        );
        assert_eq!(claim_action(None, None, OWNER, true), CopyAction::Nothing);
    }
}
