//! Which changes of an upper pod are applied to its lower pod.
//!
//! A pod is mostly immutable. A real API server accepts, on an existing pod: labels and
//! annotations; container and init-container images; `activeDeadlineSeconds` set when unset
//! or lowered (never raised or removed); tolerations added (existing ones may only change their
//! `tolerationSeconds`); and ephemeral containers through the `ephemeralcontainers`
//! subresource. [`lower_pod_update`] produces exactly those changes as a strategic merge patch,
//! nothing when nothing changed, and names every difference it cannot apply so the caller can
//! tell the user instead of sending a write the server would refuse.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{
    Container, EnvVar, EphemeralContainer, Pod, PodCondition, PodSpec, Toleration,
};
use serde_json::{Map, Value, json};

use crate::cluster_selector::ClusterSelector;
use crate::deps::is_owned_by;
use crate::identity::with_service_env;
use crate::keys::{
    ANNOTATION_CLUSTER_SELECTOR, ANNOTATION_UPPER_UID, LABEL_OWNER, owner_label_value,
};
use crate::translate::{
    TranslateConfig, TranslateError, drop_mounts, lower_pod, pin_downward_env, pod_key,
    synced_annotation_keys, token_volume_names,
};

/// What to do to a lower pod so it follows its upper pod.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PodUpdate {
    /// A strategic merge patch for the pod, or `None` when nothing it may change differs.
    pub patch: Option<Value>,
    /// Ephemeral containers to add through the `ephemeralcontainers` subresource: the full
    /// list the lower pod should have (the subresource takes the whole list), or `None`.
    pub ephemeral_containers: Option<Vec<EphemeralContainer>>,
    /// Differences a running pod cannot take (e.g. `spec.containers[web].resources`); the pod
    /// would have to be re-created for them. For the user, not for the API server.
    pub not_applicable: Vec<String>,
    /// Readiness-gate conditions set upstairs that the lower pod lacks or has otherwise, for a
    /// strategic merge into its status: the lower kubelet counts them into `Ready`.
    pub gate_conditions: Option<Vec<PodCondition>>,
}

impl PodUpdate {
    /// Whether no write is needed.
    pub fn is_noop(&self) -> bool {
        self.patch.is_none()
            && self.ephemeral_containers.is_none()
            && self.gate_conditions.is_none()
    }
}

/// The types of the pod's readiness gates.
pub fn readiness_gate_types(pod: &Pod) -> BTreeSet<&str> {
    pod.spec
        .iter()
        .flat_map(|s| s.readiness_gates.iter().flatten())
        .map(|g| g.condition_type.as_str())
        .collect()
}

/// The upper pod's readiness-gate conditions that the lower pod does not have with the same
/// status, reason and message; `None` when it has them all (or there are no gates).
fn gate_conditions(upper: &Pod, lower: &Pod) -> Option<Vec<PodCondition>> {
    let gates = readiness_gate_types(upper);
    let conditions = |p: &Pod| {
        p.status
            .iter()
            .flat_map(|s| s.conditions.iter().flatten())
            .filter(|c| gates.contains(c.type_.as_str()))
            .cloned()
            .collect::<Vec<_>>()
    };
    let have = conditions(lower);
    let differ: Vec<PodCondition> = conditions(upper)
        .into_iter()
        .filter(|u| {
            !have.iter().any(|l| {
                l.type_ == u.type_
                    && l.status == u.status
                    && l.reason == u.reason
                    && l.message == u.message
            })
        })
        .collect();
    (!differ.is_empty()).then_some(differ)
}

/// Why an update cannot be computed.
#[derive(Debug, thiserror::Error)]
pub enum UpdateError {
    /// The upper pod does not translate (e.g. a malformed `clusterSelector`).
    #[error(transparent)]
    Translate(#[from] TranslateError),
    /// The lower pod is not one we created for this upper pod: never touch it.
    #[error(transparent)]
    NotOurs(Box<ForeignPod>),
}

/// A lower pod with the name of an upper pod that was not created for it by this owner.
#[derive(Debug, thiserror::Error)]
#[error(
    "lower pod {namespace}/{name} is not ours (owner {found_owner:?}, upper uid {found_uid:?}; expected owner {owner:?}, upper uid {uid:?})"
)]
pub struct ForeignPod {
    /// Pod namespace.
    pub namespace: String,
    /// Pod name.
    pub name: String,
    /// Our owner label value.
    pub owner: String,
    /// The upper pod's UID.
    pub uid: String,
    /// The owner label found on the lower pod.
    pub found_owner: Option<String>,
    /// The upper UID recorded on the lower pod.
    pub found_uid: Option<String>,
}

/// Whether a lower pod was created by this owner for this upper pod (same upper UID).
pub fn is_lower_pod_of(lower: &Pod, upper: &Pod, owner: &str) -> bool {
    is_owned_by(&lower.metadata, owner)
        && lower
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ANNOTATION_UPPER_UID))
            == upper.metadata.uid.as_ref()
}

/// The changes to apply to `lower` so it follows `upper`.
pub fn lower_pod_update(
    upper: &Pod,
    lower: &Pod,
    cfg: &TranslateConfig,
) -> Result<PodUpdate, UpdateError> {
    let (namespace, name) = pod_key(upper)?;
    if !is_lower_pod_of(lower, upper, &cfg.owner) {
        return Err(UpdateError::NotOurs(Box::new(ForeignPod {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            owner: owner_label_value(&cfg.owner),
            uid: upper.metadata.uid.clone().unwrap_or_default(),
            found_owner: lower
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(LABEL_OWNER))
                .cloned(),
            found_uid: lower
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(ANNOTATION_UPPER_UID))
                .cloned(),
        })));
    }
    let desired = lower_pod(upper, cfg)?;
    let empty = PodSpec::default();
    let want = desired.spec.as_ref().unwrap_or(&empty);
    let have = lower.spec.as_ref().unwrap_or(&empty);
    let mut update = PodUpdate::default();

    let mut metadata = Map::new();
    if let Some(labels) = map_patch(
        lower.metadata.labels.as_ref(),
        desired.metadata.labels.as_ref(),
        |_| true,
    ) {
        metadata.insert("labels".into(), labels);
    }
    // Remove only annotation keys we copied before; the lower cluster may have written others.
    let synced = synced_annotation_keys(&lower.metadata);
    let desired_annotations = desired.metadata.annotations.as_ref();
    if let Some(annotations) = map_patch(
        lower.metadata.annotations.as_ref(),
        desired_annotations,
        |k| synced.contains(k),
    ) {
        metadata.insert("annotations".into(), annotations);
    }

    let mut spec = Map::new();
    let upper_spec = upper.spec.as_ref().unwrap_or(&empty);
    for (field, want_list, have_list, upper_list) in [
        (
            "containers",
            Some(&want.containers),
            Some(&have.containers),
            Some(&upper_spec.containers),
        ),
        (
            "initContainers",
            want.init_containers.as_ref(),
            have.init_containers.as_ref(),
            upper_spec.init_containers.as_ref(),
        ),
    ] {
        let pinned = field_ref_env_names(upper_list);
        let changes = image_changes(
            field,
            want_list,
            have_list,
            &pinned,
            &mut update.not_applicable,
        );
        if !changes.is_empty() {
            spec.insert(field.into(), Value::Array(changes));
        }
    }

    match (want.active_deadline_seconds, have.active_deadline_seconds) {
        (Some(w), None) => {
            spec.insert("activeDeadlineSeconds".into(), json!(w));
        }
        (Some(w), Some(h)) if w < h => {
            spec.insert("activeDeadlineSeconds".into(), json!(w));
        }
        (Some(w), Some(h)) if w > h => {
            update
                .not_applicable
                .push("spec.activeDeadlineSeconds (may only be lowered)".into());
        }
        (None, Some(_)) => {
            update
                .not_applicable
                .push("spec.activeDeadlineSeconds (may not be removed)".into());
        }
        _ => {}
    }

    if selector_text(upper) != selector_text(lower) {
        // The selector changed upstairs: its tolerations are added to the lower pod (a pod
        // may gain tolerations, never lose them); node selector and affinity are immutable.
        if let Ok(Some(cs)) = ClusterSelector::from_annotations(upper.metadata.annotations.as_ref())
        {
            let current = have.tolerations.clone().unwrap_or_default();
            let merged = added_tolerations(&current, &cs.tolerations);
            if merged != current {
                spec.insert("tolerations".into(), json!(merged));
            }
        }
        if want.node_selector != have.node_selector {
            update.not_applicable.push("spec.nodeSelector".into());
        }
        let required = |s: &PodSpec| {
            s.affinity
                .as_ref()
                .and_then(|a| a.node_affinity.as_ref())
                .and_then(|n| {
                    n.required_during_scheduling_ignored_during_execution
                        .clone()
                })
        };
        if required(want) != required(have) {
            update
                .not_applicable
                .push("spec.affinity.nodeAffinity".into());
        }
    }

    update.ephemeral_containers = ephemeral_additions(upper, lower, cfg);
    update.gate_conditions = gate_conditions(upper, lower);

    let mut patch = Map::new();
    if !metadata.is_empty() {
        patch.insert("metadata".into(), Value::Object(metadata));
    }
    if !spec.is_empty() {
        patch.insert("spec".into(), Value::Object(spec));
    }
    update.patch = (!patch.is_empty()).then_some(Value::Object(patch));
    Ok(update)
}

fn selector_text(pod: &Pod) -> Option<&String> {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_CLUSTER_SELECTOR))
}

/// A merge-patch map turning `have` into `want`: changed and new keys set, keys absent from
/// `want` set to null when `removable` says we own them.
fn map_patch(
    have: Option<&BTreeMap<String, String>>,
    want: Option<&BTreeMap<String, String>>,
    removable: impl Fn(&str) -> bool,
) -> Option<Value> {
    let empty = BTreeMap::new();
    let (have, want) = (have.unwrap_or(&empty), want.unwrap_or(&empty));
    let mut patch = Map::new();
    for (k, v) in want {
        if have.get(k) != Some(v) {
            patch.insert(k.clone(), Value::String(v.clone()));
        }
    }
    for k in have.keys() {
        if !want.contains_key(k) && removable(k) {
            patch.insert(k.clone(), Value::Null);
        }
    }
    (!patch.is_empty()).then_some(Value::Object(patch))
}

/// Strategic-merge entries (merge key `name`) for containers whose image changed; other
/// container differences are recorded as not applicable.
fn image_changes(
    field: &str,
    want: Option<&Vec<Container>>,
    have: Option<&Vec<Container>>,
    pinned: &BTreeMap<String, BTreeSet<String>>,
    not_applicable: &mut Vec<String>,
) -> Vec<Value> {
    let have: BTreeMap<&str, &Container> = have
        .into_iter()
        .flatten()
        .map(|c| (c.name.as_str(), c))
        .collect();
    let mut changes = Vec::new();
    for w in want.into_iter().flatten() {
        let Some(h) = have.get(w.name.as_str()) else {
            not_applicable.push(format!(
                "spec.{field}[{}] (containers cannot be added)",
                w.name
            ));
            continue;
        };
        if w.image != h.image {
            changes.push(json!({"name": w.name, "image": w.image}));
        }
        if w.resources != h.resources {
            not_applicable.push(format!("spec.{field}[{}].resources", w.name));
        }
        let names = pinned.get(&w.name);
        if comparable_env(w.env.as_deref(), names) != comparable_env(h.env.as_deref(), names)
            || w.env_from != h.env_from
        {
            not_applicable.push(format!("spec.{field}[{}].env", w.name));
        }
    }
    changes
}

/// Per container, the names of its upper env entries that read a `fieldRef`: the lower pod
/// has them either as `fieldRef`s or as values pinned when it was created (see
/// [`pin_downward_env`]), and a pinned value following a label changed since is no change
/// of the pod's spec (the upper env cannot change).
fn field_ref_env_names(upper: Option<&Vec<Container>>) -> BTreeMap<String, BTreeSet<String>> {
    upper
        .into_iter()
        .flatten()
        .map(|c| {
            let names = c
                .env
                .iter()
                .flatten()
                .filter(|v| v.value_from.as_ref().is_some_and(|f| f.field_ref.is_some()))
                .map(|v| v.name.clone())
                .collect();
            (c.name.clone(), names)
        })
        .collect()
}

/// An env list with the entries named in `pinned` reduced to their names.
fn comparable_env(env: Option<&[EnvVar]>, pinned: Option<&BTreeSet<String>>) -> Vec<EnvVar> {
    env.into_iter()
        .flatten()
        .map(|v| match pinned {
            Some(names) if names.contains(&v.name) => EnvVar {
                name: v.name.clone(),
                ..EnvVar::default()
            },
            _ => v.clone(),
        })
        .collect()
}

/// `current` with the tolerations of `wanted` added; a wanted toleration equal to an existing
/// one but for `tolerationSeconds` updates those seconds (the only change the API allows).
fn added_tolerations(current: &[Toleration], wanted: &[Toleration]) -> Vec<Toleration> {
    let mut merged = current.to_vec();
    for w in wanted {
        let same_but_seconds = |t: &Toleration| {
            t.key == w.key && t.operator == w.operator && t.value == w.value && t.effect == w.effect
        };
        match merged.iter_mut().find(|t| same_but_seconds(t)) {
            Some(existing) => existing.toleration_seconds = w.toleration_seconds,
            None => merged.push(w.clone()),
        }
    }
    merged
}

/// The full ephemeral-container list the lower pod should get, when the upper pod has
/// ephemeral containers (`kubectl debug`) the lower pod lacks. Existing ones are never changed.
fn ephemeral_additions(
    upper: &Pod,
    lower: &Pod,
    cfg: &TranslateConfig,
) -> Option<Vec<EphemeralContainer>> {
    let upper_spec = upper.spec.as_ref()?;
    let empty = PodSpec::default();
    let have = lower.spec.as_ref().unwrap_or(&empty);
    let present: BTreeSet<&str> = have
        .ephemeral_containers
        .iter()
        .flatten()
        .map(|c| c.name.as_str())
        .collect();
    // With upper identity the token volumes stay (they read our Secret), and so do their mounts.
    let dropped = match cfg.upper_api {
        Some(_) => BTreeSet::new(),
        None => token_volume_names(upper_spec),
    };
    let new: Vec<EphemeralContainer> = upper_spec
        .ephemeral_containers
        .iter()
        .flatten()
        .filter(|c| !present.contains(c.name.as_str()))
        .map(|c| {
            let mut c = strip_token_mounts(c.clone(), &dropped);
            c.env = pin_downward_env(c.env.as_deref(), upper, lower);
            if let Some(api) = &cfg.upper_api {
                c.env = with_service_env(c.env.take(), api);
            }
            c
        })
        .collect();
    if new.is_empty() {
        return None;
    }
    let mut all = have.ephemeral_containers.clone().unwrap_or_default();
    all.extend(new);
    Some(all)
}

fn strip_token_mounts(
    mut container: EphemeralContainer,
    dropped: &BTreeSet<String>,
) -> EphemeralContainer {
    // Reuse the container rule through the fields both types share.
    let mut as_container = Container {
        name: String::new(),
        volume_mounts: container.volume_mounts.take(),
        ..Default::default()
    };
    drop_mounts(&mut as_container, dropped);
    container.volume_mounts = as_container.volume_mounts;
    container
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::translate::tests::bound_pod;
    use pretty_assertions::assert_eq;

    fn cfg() -> TranslateConfig {
        TranslateConfig::new("vk-1")
    }

    /// A copy made with upper identity (our token Secret, the upper API in env) is no change of
    /// its pod.
    #[test]
    fn a_copy_with_upper_identity_is_no_change() {
        let p = bound_pod();
        let cfg = TranslateConfig {
            upper_api: Some(crate::identity::UpperApi {
                host: "upper.example".into(),
                port: 6443,
            }),
            ..cfg()
        };
        let mut stored = lower_pod(&p, &cfg).unwrap();
        stored.metadata.uid = Some("uid-lower-1".into());
        stored.spec.as_mut().unwrap().node_name = Some("lower-node-3".into());
        let update = lower_pod_update(&p, &stored, &cfg).unwrap();
        assert!(update.is_noop(), "{update:?}");
    }

    /// The lower pod as the lower API server stores it after our create: our translation plus
    /// what lower admission and the lower kubelet add.
    fn created_lower(upper: &Pod) -> Pod {
        let mut lower = lower_pod(upper, &cfg()).unwrap();
        lower.metadata.uid = Some("uid-lower-1".into());
        lower.metadata.resource_version = Some("99".into());
        lower
            .metadata
            .annotations
            .get_or_insert_default()
            .insert("cni.projectcalico.org/podIP".into(), "10.1.2.3/32".into());
        let spec = lower.spec.get_or_insert_default();
        spec.node_name = Some("lower-node-3".into());
        spec.tolerations = Some(vec![Toleration {
            key: Some("node.kubernetes.io/not-ready".into()),
            operator: Some("Exists".into()),
            effect: Some("NoExecute".into()),
            toleration_seconds: Some(300),
            value: None,
        }]);
        lower
    }

    fn upper_mut(p: &mut Pod) -> &mut PodSpec {
        p.spec.as_mut().unwrap()
    }

    #[test]
    fn checklist_43_nothing_relevant_changed_means_no_write() {
        let upper = bound_pod();
        let update = lower_pod_update(&upper, &created_lower(&upper), &cfg()).unwrap();
        assert!(update.is_noop(), "{update:?}");
        assert!(update.not_applicable.is_empty());
    }

    #[test]
    fn checklist_39_image_change_updates_the_same_container_by_name() {
        let upper = bound_pod();
        let lower = created_lower(&upper);
        let mut upper = upper;
        upper_mut(&mut upper).containers[0].image = Some("nginx:1.28".into());
        let update = lower_pod_update(&upper, &lower, &cfg()).unwrap();
        assert_eq!(
            update.patch,
            Some(json!({"spec": {"containers": [{"name": "web", "image": "nginx:1.28"}]}}))
        );
    }

    #[test]
    fn checklist_40_labels_and_annotations_follow_without_touching_lower_owned_annotations() {
        let upper = bound_pod();
        let lower = created_lower(&upper);
        let mut upper = upper;
        let labels = upper.metadata.labels.as_mut().unwrap();
        labels.insert("tier".into(), "front".into());
        labels.insert("pod-group.scheduling.sigs.k8s.io".into(), "pg-2".into());
        let ann = upper.metadata.annotations.as_mut().unwrap();
        ann.remove("team");
        ann.insert("owner".into(), "b".into());
        let update = lower_pod_update(&upper, &lower, &cfg()).unwrap();
        assert_eq!(
            update.patch,
            Some(json!({"metadata": {
                "labels": {"tier": "front"},
                "annotations": {
                    "owner": "b",
                    "team": null,
                    "tensile-kube.io/synced-annotations": "owner",
                    "tripped-labels": "{\"pod-group.scheduling.sigs.k8s.io\":\"pg-2\"}"
                }
            }}))
        );
    }

    #[test]
    fn removed_upper_label_is_removed_downstairs() {
        let upper = bound_pod();
        let lower = created_lower(&upper);
        let mut upper = upper;
        upper.metadata.labels.as_mut().unwrap().remove("app");
        let update = lower_pod_update(&upper, &lower, &cfg()).unwrap();
        assert_eq!(
            update.patch,
            Some(json!({"metadata": {"labels": {"app": null}}}))
        );
    }

    #[test]
    fn checklist_41_active_deadline_seconds_propagates_when_set_or_lowered() {
        let upper = bound_pod();
        let lower = created_lower(&upper);
        let mut upper = upper;
        upper_mut(&mut upper).active_deadline_seconds = Some(600);
        let update = lower_pod_update(&upper, &lower, &cfg()).unwrap();
        assert_eq!(
            update.patch,
            Some(json!({"spec": {"activeDeadlineSeconds": 600}}))
        );

        let mut lower = lower;
        lower.spec.as_mut().unwrap().active_deadline_seconds = Some(900);
        let update = lower_pod_update(&upper, &lower, &cfg()).unwrap();
        assert_eq!(
            update.patch,
            Some(json!({"spec": {"activeDeadlineSeconds": 600}}))
        );

        lower.spec.as_mut().unwrap().active_deadline_seconds = Some(300);
        let update = lower_pod_update(&upper, &lower, &cfg()).unwrap();
        assert_eq!(update.patch, None, "a real API server refuses raising it");
        assert_eq!(update.not_applicable.len(), 1);
    }

    #[test]
    fn checklist_42_changed_cluster_selector_adds_its_tolerations() {
        let upper = bound_pod();
        let lower = created_lower(&upper);
        let mut upper = upper;
        upper.metadata.annotations.as_mut().unwrap().insert(
            "clusterSelector".into(),
            r#"{"tolerations":[{"key":"gpu","operator":"Exists","effect":"NoSchedule"},{"key":"node.kubernetes.io/not-ready","operator":"Exists","effect":"NoExecute","tolerationSeconds":600}]}"#.into(),
        );
        let update = lower_pod_update(&upper, &lower, &cfg()).unwrap();
        let patch = update.patch.unwrap();
        assert_eq!(
            patch["spec"]["tolerations"],
            json!([
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists",
                 "effect": "NoExecute", "tolerationSeconds": 600},
                {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}
            ])
        );
        assert!(patch["metadata"]["annotations"]["clusterSelector"].is_string());
    }

    #[test]
    fn changed_cluster_selector_node_selector_is_reported_not_applied() {
        let upper = bound_pod();
        let lower = created_lower(&upper);
        let mut upper = upper;
        upper.metadata.annotations.as_mut().unwrap().insert(
            "clusterSelector".into(),
            r#"{"nodeSelector":{"disk":"ssd"}}"#.into(),
        );
        let update = lower_pod_update(&upper, &lower, &cfg()).unwrap();
        assert_eq!(update.not_applicable, ["spec.nodeSelector"]);
        assert!(update.patch.unwrap()["spec"].get("nodeSelector").is_none());
    }

    #[test]
    fn checklist_44_a_lower_pod_that_is_not_ours_is_never_updated() {
        // The original guarded updates with the upper `virtual-pod` label; we use real
        // ownership: the owner label and the upper UID recorded at creation.
        let upper = bound_pod();
        let mut foreign = created_lower(&upper);
        foreign
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .insert(LABEL_OWNER.into(), "vk-2".into());
        assert!(matches!(
            lower_pod_update(&upper, &foreign, &cfg()),
            Err(UpdateError::NotOurs(_))
        ));
        let mut replaced = created_lower(&upper);
        replaced
            .metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(ANNOTATION_UPPER_UID.into(), "old".into());
        let err = lower_pod_update(&upper, &replaced, &cfg()).unwrap_err();
        assert!(err.to_string().contains("shop/web-7d4b9c-x2x9z"), "{err}");
    }

    #[test]
    fn resource_changes_are_reported_as_not_applicable() {
        let upper = bound_pod();
        let lower = created_lower(&upper);
        let mut upper = upper;
        upper_mut(&mut upper).containers[0].resources =
            Some(serde_json::from_value(json!({"requests": {"cpu": "2"}})).unwrap());
        let update = lower_pod_update(&upper, &lower, &cfg()).unwrap();
        assert!(update.patch.is_none());
        assert_eq!(update.not_applicable, ["spec.containers[web].resources"]);
    }

    #[test]
    fn new_ephemeral_containers_go_through_the_subresource() {
        let upper = bound_pod();
        let lower = created_lower(&upper);
        let mut upper = upper;
        upper_mut(&mut upper).ephemeral_containers = Some(vec![serde_json::from_value(json!({
            "name": "debugger-x", "image": "busybox", "targetContainerName": "web",
            "volumeMounts": [{"name": "kube-api-access-abcde", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}]
        }))
        .unwrap()]);
        let update = lower_pod_update(&upper, &lower, &cfg()).unwrap();
        let added = update.ephemeral_containers.unwrap();
        assert_eq!(added.len(), 1);
        assert_eq!(added[0].name, "debugger-x");
        assert!(
            added[0].volume_mounts.is_none(),
            "upper token mount stripped"
        );

        // Once present downstairs nothing more is sent.
        let mut lower = lower;
        lower.spec.as_mut().unwrap().ephemeral_containers = Some(added);
        assert!(
            lower_pod_update(&upper, &lower, &cfg())
                .unwrap()
                .ephemeral_containers
                .is_none()
        );
    }

    fn field_env(name: &str, path: &str) -> EnvVar {
        serde_json::from_value(json!({"name": name,
            "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": path}}}))
        .unwrap()
    }

    #[test]
    fn pinned_downward_env_is_no_spec_change_when_labels_move_or_for_older_copies() {
        let mut upper = bound_pod();
        upper_mut(&mut upper).containers[0].env = Some(vec![
            field_env("UID", "metadata.uid"),
            field_env(
                "GROUP",
                "metadata.labels['pod-group.scheduling.sigs.k8s.io']",
            ),
        ]);
        let lower = created_lower(&upper);
        // The tripped label changes upstairs: the pinned value is what the container started
        // with, as a kubelet would have; only the label record follows.
        let mut moved = upper.clone();
        moved
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .insert("pod-group.scheduling.sigs.k8s.io".into(), "pg-2".into());
        let update = lower_pod_update(&moved, &lower, &cfg()).unwrap();
        assert!(update.not_applicable.is_empty(), "{update:?}");
        assert!(
            update
                .patch
                .as_ref()
                .is_some_and(|p| p.get("spec").is_none())
        );
        // A copy made before values were pinned keeps its fieldRefs without complaint.
        let mut older = lower.clone();
        older.spec.as_mut().unwrap().containers[0].env =
            upper_mut(&mut upper.clone()).containers[0].env.clone();
        let update = lower_pod_update(&upper, &older, &cfg()).unwrap();
        assert!(
            update.is_noop() && update.not_applicable.is_empty(),
            "{update:?}"
        );
        // Any other env difference is still reported.
        let mut other = lower.clone();
        other.spec.as_mut().unwrap().containers[0]
            .env
            .as_mut()
            .unwrap()
            .push(field_env("EXTRA", "status.podIP"));
        let update = lower_pod_update(&upper, &other, &cfg()).unwrap();
        assert_eq!(update.not_applicable, ["spec.containers[web].env"]);
    }

    #[test]
    fn ephemeral_container_downward_env_reads_the_upper_pod() {
        let upper = bound_pod();
        let lower = created_lower(&upper);
        let mut upper = upper;
        upper_mut(&mut upper).ephemeral_containers = Some(vec![
            serde_json::from_value(json!({
                "name": "debugger-y", "image": "busybox",
                "env": [
                    {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                    {"name": "UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
                    {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]
            }))
            .unwrap(),
        ]);
        let added = lower_pod_update(&upper, &lower, &cfg())
            .unwrap()
            .ephemeral_containers
            .unwrap();
        let env = added[0].env.clone().unwrap();
        assert_eq!(env[0].value.as_deref(), Some("vk-1"));
        assert_eq!(env[1].value.as_deref(), Some("uid-upper-1"));
        assert!(
            env[2].value_from.is_some(),
            "the pod's IP is the lower one's"
        );
    }

    #[test]
    fn update_is_idempotent_once_applied() {
        // Applying the patch's effect and asking again yields nothing.
        let upper = bound_pod();
        let mut lower = created_lower(&upper);
        let mut upper = upper;
        upper_mut(&mut upper).containers[0].image = Some("nginx:2".into());
        upper
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .insert("x".into(), "y".into());
        assert!(!lower_pod_update(&upper, &lower, &cfg()).unwrap().is_noop());
        lower.spec.as_mut().unwrap().containers[0].image = Some("nginx:2".into());
        lower
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .insert("x".into(), "y".into());
        assert!(lower_pod_update(&upper, &lower, &cfg()).unwrap().is_noop());
    }

    #[test]
    fn malformed_cluster_selector_is_a_typed_error() {
        let upper = bound_pod();
        let lower = created_lower(&upper);
        let mut upper = upper;
        upper
            .metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert("clusterSelector".into(), "[".into());
        assert!(matches!(
            lower_pod_update(&upper, &lower, &cfg()),
            Err(UpdateError::Translate(
                TranslateError::ClusterSelector { .. }
            ))
        ));
    }
}
