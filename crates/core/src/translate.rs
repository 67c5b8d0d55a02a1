//! Upper pod -> lower pod: what we create in the lower cluster for a pod bound to the virtual
//! node (where this differs from the original, and why: `docs/differences.md`).
//!
//! Kept from the upper pod: name and namespace (identity mapping), labels and annotations,
//! and the whole spec except what only makes sense in the upper cluster:
//! - the node binding, status and the server-owned metadata (uid, resourceVersion,
//!   ownerReferences, finalizers, managedFields, timestamps);
//! - scheduling constraints written for the upper scheduler: nodeSelector, tolerations and
//!   required node affinity come from the `clusterSelector` annotation instead;
//! - without upper identity (`--pod-identity lower`), the upper cluster's service-account
//!   credentials (legacy `default-token-*` secret volumes, the projected `kube-api-access-*`
//!   volume) and their mounts: the lower cluster's own ServiceAccount admission injects its
//!   own. With it (the default) they stay, reading our Secret of upper tokens instead
//!   ([`crate::identity`]), and containers get the upper API server's `KUBERNETES_SERVICE_*`;
//! - fields lower admission computes and refuses when they disagree with its own objects
//!   (`priority` and `preemptionPolicy` from the PriorityClass, `overhead` from the
//!   RuntimeClass): the class names are kept, the computed values are left to the lower side;
//! - ephemeral containers, which a create may not carry (they are added through the
//!   `ephemeralcontainers` subresource, see [`crate::update`]);
//! - `schedulerName`: the upper pod's names a scheduler of the upper cluster (a custom one
//!   placed it on the virtual node); the lower pod is scheduled by the lower cluster's
//!   `default-scheduler`, or by the one the pod names in `tensile-kube.io/lower-scheduler-name`.
//!   Copied verbatim (as the original did), a pod of a custom scheduler would wait downstairs
//!   for ever, with no Unschedulable condition for the descheduler to act on.
//!
//! Changed on the way down: container env entries whose downward API `fieldRef` the lower
//! kubelet would resolve to a value different from the upper pod's (the UID, `spec.nodeName`,
//! labels and annotations that carry our marks or were tripped) become literal values of the
//! upper pod, see [`pin_downward_env`].

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Affinity, Container, EnvVar, Pod, PodSpec, Volume, VolumeMount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::cluster_selector::{ClusterSelector, ClusterSelectorError};
use crate::deps::is_service_account_token_volume;
use crate::downward::downward_field_value;
use crate::identity::{
    UpperApi, add_service_env, identity_secret_name, rewrite_downward_volumes,
    rewrite_token_volumes, token_needs,
};
use crate::keys::{
    ANNOTATION_CONFIG_MIRROR, ANNOTATION_LOWER_SCHEDULER_NAME, ANNOTATION_SYNCED_ANNOTATIONS,
    ANNOTATION_TRIPPED_LABELS, ANNOTATION_UPPER_UID, DEFAULT_SCHEDULER, LABEL_OWNER,
    LABEL_VIRTUAL_POD, NAMESPACE_KUBE_SYSTEM, VALUE_TRUE, owner_label_value,
};

/// What the translation needs to know about the virtual node doing it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TranslateConfig {
    /// Owner id written into [`LABEL_OWNER`] (by default the virtual node's name).
    pub owner: String,
    /// `--ignore-labels`: pod label keys removed from lower pods and recorded in
    /// `tripped-labels`.
    pub ignore_labels: Vec<String>,
    /// Upper identity ([`crate::identity`]): where pods reach the upper API server. `None`
    /// keeps the original behaviour: token volumes are dropped and the lower cluster's own
    /// ServiceAccount admission mounts lower tokens.
    pub upper_api: Option<UpperApi>,
}

impl TranslateConfig {
    /// A config with the original's default ignore-labels.
    pub fn new(owner: impl Into<String>) -> Self {
        Self {
            owner: owner.into(),
            ignore_labels: vec![crate::keys::DEFAULT_IGNORE_LABELS.to_owned()],
            upper_api: None,
        }
    }
}

/// Why a pod cannot be translated; each names the pod.
#[derive(Debug, thiserror::Error)]
pub enum TranslateError {
    /// The pod has no name or namespace (never the case for a pod read from an API server).
    #[error("pod has no {what}")]
    MissingMetadata {
        /// `name` or `namespace`.
        what: &'static str,
    },
    /// A pod must have at least one container.
    #[error("pod {namespace}/{name} has no containers")]
    NoContainers {
        /// Pod namespace.
        namespace: String,
        /// Pod name.
        name: String,
    },
    /// The `clusterSelector` annotation is malformed.
    #[error("pod {namespace}/{name}: {source}")]
    ClusterSelector {
        /// Pod namespace.
        namespace: String,
        /// Pod name.
        name: String,
        /// What is wrong with it.
        #[source]
        source: ClusterSelectorError,
    },
}

/// Why a pod bound to the virtual node is not offloaded; the message is what the user reads on
/// the upper pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NotOffloaded {
    /// Pods in `kube-system` belong to the upper cluster's own machinery.
    #[error("pods in namespace kube-system are not offloaded to lower clusters")]
    KubeSystem,
    /// A DaemonSet wants one pod per real node; a virtual node is not one.
    #[error("DaemonSet pods are not offloaded to lower clusters")]
    DaemonSet,
    /// Static (mirror) pods are run by a node's own kubelet.
    #[error("mirror pods of static pods are not offloaded to lower clusters")]
    MirrorPod,
}

/// Whether a pod bound to the virtual node is offloaded at all.
pub fn offload_decision(pod: &Pod) -> Result<(), NotOffloaded> {
    if pod.metadata.namespace.as_deref() == Some(NAMESPACE_KUBE_SYSTEM) {
        return Err(NotOffloaded::KubeSystem);
    }
    let owned_by_daemon_set = pod.metadata.owner_references.iter().flatten().any(|r| {
        r.controller == Some(true) && r.kind == "DaemonSet" && r.api_version.starts_with("apps/")
    });
    if owned_by_daemon_set {
        return Err(NotOffloaded::DaemonSet);
    }
    if pod
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(ANNOTATION_CONFIG_MIRROR))
    {
        return Err(NotOffloaded::MirrorPod);
    }
    Ok(())
}

/// Name and namespace of a pod, or the error naming what is missing.
pub(crate) fn pod_key(pod: &Pod) -> Result<(&str, &str), TranslateError> {
    let namespace = pod
        .metadata
        .namespace
        .as_deref()
        .ok_or(TranslateError::MissingMetadata { what: "namespace" })?;
    let name = pod
        .metadata
        .name
        .as_deref()
        .ok_or(TranslateError::MissingMetadata { what: "name" })?;
    Ok((namespace, name))
}

/// The lower pod for an upper pod.
pub fn lower_pod(upper: &Pod, cfg: &TranslateConfig) -> Result<Pod, TranslateError> {
    let (namespace, name) = pod_key(upper)?;
    let spec = upper
        .spec
        .as_ref()
        .filter(|s| !s.containers.is_empty())
        .ok_or_else(|| TranslateError::NoContainers {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        })?;
    let selector = ClusterSelector::from_annotations(upper.metadata.annotations.as_ref()).map_err(
        |source| TranslateError::ClusterSelector {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            source,
        },
    )?;

    let (labels, tripped) = lower_labels(upper.metadata.labels.as_ref(), cfg);
    let metadata = ObjectMeta {
        name: Some(name.to_owned()),
        namespace: Some(namespace.to_owned()),
        labels: Some(labels),
        annotations: Some(lower_annotations(upper, &tripped)),
        ..ObjectMeta::default()
    };
    // With upper identity, token volumes read our per-pod Secret instead of being dropped.
    let tokens = cfg
        .upper_api
        .as_ref()
        .and(upper.metadata.uid.as_deref())
        .map(identity_secret_name);
    let mut spec = lower_spec(spec, selector.as_ref(), tokens.as_deref());
    if let Some(secret) = &tokens {
        // Downward API files that would show the copy read the upper pod's values from it too.
        rewrite_downward_volumes(&mut spec, secret, &cfg.ignore_labels);
    }
    spec.scheduler_name = Some(lower_scheduler_name(upper).to_owned());
    let mut lower = Pod {
        metadata,
        spec: Some(spec),
        status: None,
    };
    let pinned = lower.spec.as_ref().map(|s| {
        let pin = |env: &Option<Vec<EnvVar>>| pin_downward_env(env.as_deref(), upper, &lower);
        (
            s.containers.iter().map(|c| pin(&c.env)).collect::<Vec<_>>(),
            s.init_containers
                .iter()
                .flatten()
                .map(|c| pin(&c.env))
                .collect::<Vec<_>>(),
        )
    });
    if let (Some(spec), Some((containers, inits))) = (lower.spec.as_mut(), pinned) {
        for (c, env) in spec.containers.iter_mut().zip(containers) {
            c.env = env;
        }
        for (c, env) in spec.init_containers.iter_mut().flatten().zip(inits) {
            c.env = env;
        }
    }
    if let (Some(api), Some(spec)) = (cfg.upper_api.as_ref(), lower.spec.as_mut()) {
        add_service_env(spec, api);
    }
    Ok(lower)
}

/// A literal env value that the kubelet reads back as `text`: its `$(VAR)` expansion turns
/// `$$` into `$`, so every `$` is doubled.
fn env_literal(text: &str) -> String {
    text.replace('$', "$$")
}

/// A container's env for the lower pod: every entry whose `valueFrom.fieldRef` resolves to
/// a different value on `lower` than on `upper` becomes the upper value, written literally
/// (`value:`). The kubelet resolves env when a container starts, so a value taken when the
/// pod is copied down is what the upper pod's kubelet would have given: the UID and the node
/// name never change, and label and annotation values are those the pod had when copied.
/// Entries whose lower value is the truth keep their `fieldRef` (the pod's IPs, its host's,
/// name, namespace and ServiceAccount, which the copy keeps, and labels the copy carries).
pub fn pin_downward_env(env: Option<&[EnvVar]>, upper: &Pod, lower: &Pod) -> Option<Vec<EnvVar>> {
    let env = env?;
    Some(
        env.iter()
            .map(|var| {
                let path = var
                    .value_from
                    .as_ref()
                    .and_then(|from| from.field_ref.as_ref())
                    .map(|r| r.field_path.as_str());
                let upper_value = path.and_then(|p| downward_field_value(upper, p));
                let lower_value = path.and_then(|p| downward_field_value(lower, p));
                match upper_value {
                    Some(value) if lower_value.as_ref() != Some(&value) => EnvVar {
                        name: var.name.clone(),
                        value: Some(env_literal(&value)),
                        value_from: None,
                    },
                    _ => var.clone(),
                }
            })
            .collect(),
    )
}

/// The scheduler of the lower pod: the one named by [`ANNOTATION_LOWER_SCHEDULER_NAME`] (blank
/// counts as unset), else the lower cluster's default. Never the upper pod's `schedulerName`.
pub fn lower_scheduler_name(upper: &Pod) -> &str {
    upper
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_LOWER_SCHEDULER_NAME))
        .map(|s| s.trim())
        .filter(|s| !s.is_empty())
        .unwrap_or(DEFAULT_SCHEDULER)
}

/// Lower labels: the upper ones minus the ignore-labels, plus `virtual-pod=true` and our owner
/// mark. Returns the removed ignore-labels too.
fn lower_labels(
    upper: Option<&BTreeMap<String, String>>,
    cfg: &TranslateConfig,
) -> (BTreeMap<String, String>, BTreeMap<String, String>) {
    let mut labels = upper.cloned().unwrap_or_default();
    let mut tripped = BTreeMap::new();
    for key in &cfg.ignore_labels {
        // The original removes an ignore-label only when its value is non-empty.
        if labels.get(key).is_some_and(|v| !v.is_empty())
            && let Some(value) = labels.remove(key)
        {
            tripped.insert(key.clone(), value);
        }
    }
    labels.insert(LABEL_VIRTUAL_POD.to_owned(), VALUE_TRUE.to_owned());
    labels.insert(LABEL_OWNER.to_owned(), owner_label_value(&cfg.owner));
    (labels, tripped)
}

/// Lower annotations: every upper annotation, plus `tripped-labels` (always present, `{}`
/// when nothing was removed, as in the original), the upper UID and the list of copied keys.
fn lower_annotations(upper: &Pod, tripped: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    let mut annotations = upper.metadata.annotations.clone().unwrap_or_default();
    // Our own keys are never taken from upstairs: a pod copied from another tensile cluster
    // must not carry its marks into ours.
    for own in [
        ANNOTATION_TRIPPED_LABELS,
        ANNOTATION_UPPER_UID,
        ANNOTATION_SYNCED_ANNOTATIONS,
    ] {
        annotations.remove(own);
    }
    let synced = annotations.keys().cloned().collect::<Vec<_>>().join(",");
    annotations.insert(
        ANNOTATION_TRIPPED_LABELS.to_owned(),
        encode_tripped_labels(tripped),
    );
    annotations.insert(
        ANNOTATION_UPPER_UID.to_owned(),
        upper.metadata.uid.clone().unwrap_or_default(),
    );
    annotations.insert(ANNOTATION_SYNCED_ANNOTATIONS.to_owned(), synced);
    annotations
}

/// Go's `json.Marshal` of a `map[string]string`: sorted keys, compact. Label keys and values
/// cannot contain the characters Go escapes, so serde_json's output is identical.
fn encode_tripped_labels(tripped: &BTreeMap<String, String>) -> String {
    serde_json::to_string(tripped).unwrap_or_else(|_| "{}".to_owned())
}

/// The keys listed in [`ANNOTATION_SYNCED_ANNOTATIONS`] of a lower pod.
pub fn synced_annotation_keys(lower: &ObjectMeta) -> BTreeSet<&str> {
    lower
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_SYNCED_ANNOTATIONS))
        .map(|list| list.split(',').filter(|k| !k.is_empty()).collect())
        .unwrap_or_default()
}

/// The upper labels of a lower pod: its labels with the `tripped-labels` put back (what the
/// original's `RecoverLabels` does), minus our owner mark.
pub fn recovered_labels(lower: &ObjectMeta) -> Result<BTreeMap<String, String>, serde_json::Error> {
    let mut labels = lower.labels.clone().unwrap_or_default();
    labels.remove(LABEL_OWNER);
    if let Some(text) = lower
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_TRIPPED_LABELS))
    {
        let tripped: Option<BTreeMap<String, String>> = serde_json::from_str(text)?;
        labels.extend(tripped.unwrap_or_default());
    }
    Ok(labels)
}

/// The lower spec; `token_secret` names our Secret of upper tokens when the pod keeps its upper
/// identity (its token volumes then read it), `None` drops the token volumes.
fn lower_spec(
    upper: &PodSpec,
    selector: Option<&ClusterSelector>,
    token_secret: Option<&str>,
) -> PodSpec {
    let mut spec = upper.clone();
    spec.node_name = None;
    spec.ephemeral_containers = None;
    spec.priority = None;
    spec.preemption_policy = None;
    spec.overhead = None;
    // The scheduler extender's marker means nothing downstairs, where no node offers it.
    for c in spec
        .containers
        .iter_mut()
        .chain(spec.init_containers.iter_mut().flatten())
    {
        if let Some(r) = c.resources.as_mut() {
            for map in [&mut r.requests, &mut r.limits] {
                if let Some(m) = map.as_mut() {
                    m.remove(crate::keys::RESOURCE_VIRTUAL_POD);
                    if m.is_empty() {
                        *map = None;
                    }
                }
            }
        }
    }

    let dropped = match token_secret {
        Some(secret) => {
            rewrite_token_volumes(&mut spec, secret, &token_needs(upper));
            BTreeSet::new()
        }
        None => token_volume_names(upper),
    };
    if !dropped.is_empty() {
        spec.volumes = non_empty(
            spec.volumes
                .take()
                .unwrap_or_default()
                .into_iter()
                .filter(|v| !dropped.contains(&v.name)),
        );
        for c in spec
            .containers
            .iter_mut()
            .chain(spec.init_containers.iter_mut().flatten())
        {
            drop_mounts(c, &dropped);
        }
    }

    match selector {
        Some(cs) => {
            spec.node_selector = (!cs.node_selector.is_empty()).then(|| cs.node_selector.clone());
            spec.tolerations = (!cs.tolerations.is_empty()).then(|| cs.tolerations.clone());
        }
        None => {
            spec.node_selector = None;
            spec.tolerations = None;
        }
    }
    spec.affinity = lower_affinity(spec.affinity.take(), selector);
    spec
}

/// Removes the mounts of dropped volumes from a container.
pub(crate) fn drop_mounts(container: &mut Container, dropped: &BTreeSet<String>) {
    if let Some(mounts) = container.volume_mounts.take() {
        container.volume_mounts = non_empty(
            mounts
                .into_iter()
                .filter(|m: &VolumeMount| !dropped.contains(&m.name)),
        );
    }
}

/// The names of the service-account token volumes of a pod spec.
pub(crate) fn token_volume_names(spec: &PodSpec) -> BTreeSet<String> {
    spec.volumes
        .iter()
        .flatten()
        .filter(|v: &&Volume| is_service_account_token_volume(v, spec))
        .map(|v| v.name.clone())
        .collect()
}

fn non_empty<T>(items: impl Iterator<Item = T>) -> Option<Vec<T>> {
    let items: Vec<T> = items.collect();
    (!items.is_empty()).then_some(items)
}

/// The lower affinity: with a `clusterSelector`, the required node affinity comes from it (the
/// pod's preferred part is kept when the annotation has node affinity); without one, the
/// required part is dropped. Pod (anti-)affinity is kept. Empty structures are pruned.
fn lower_affinity(pod: Option<Affinity>, selector: Option<&ClusterSelector>) -> Option<Affinity> {
    let mut affinity = match (pod, selector) {
        (None, Some(cs)) => cs.affinity.clone()?,
        (None, None) => return None,
        (Some(mut a), Some(cs)) => {
            match cs
                .affinity
                .as_ref()
                .and_then(|ca| ca.node_affinity.as_ref())
            {
                Some(from_selector) => match a.node_affinity.as_mut() {
                    Some(node) => {
                        node.required_during_scheduling_ignored_during_execution = from_selector
                            .required_during_scheduling_ignored_during_execution
                            .clone();
                    }
                    None => a.node_affinity = Some(from_selector.clone()),
                },
                None => a.node_affinity = None,
            }
            a
        }
        (Some(mut a), None) => {
            if let Some(node) = a.node_affinity.as_mut() {
                node.required_during_scheduling_ignored_during_execution = None;
            }
            a
        }
    };
    if affinity.node_affinity.as_ref().is_some_and(|n| {
        n.required_during_scheduling_ignored_during_execution
            .is_none()
            && n.preferred_during_scheduling_ignored_during_execution
                .as_ref()
                .is_none_or(Vec::is_empty)
    }) {
        affinity.node_affinity = None;
    }
    (affinity.node_affinity.is_some()
        || affinity.pod_affinity.is_some()
        || affinity.pod_anti_affinity.is_some())
    .then_some(affinity)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Toleration;
    use pretty_assertions::assert_eq;
    use serde_json::json;

    /// A pod from JSON, the way tests write Kubernetes objects most readably.
    pub(crate) fn pod(value: serde_json::Value) -> Pod {
        serde_json::from_value(value).unwrap()
    }

    /// An upper pod as a real API server stores it once bound to the virtual node `vk-1`.
    pub(crate) fn bound_pod() -> Pod {
        pod(json!({
            "metadata": {
                "name": "web-7d4b9c-x2x9z", "namespace": "shop", "uid": "uid-upper-1",
                "generateName": "web-7d4b9c-", "resourceVersion": "4711",
                "creationTimestamp": "2026-11-22T10:00:00Z",
                "labels": {"app": "web", "pod-group.scheduling.sigs.k8s.io": "pg-1"},
                "annotations": {"team": "a"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                    "name": "web-7d4b9c", "uid": "rs-uid", "controller": true}],
                "finalizers": ["example.com/hold"]
            },
            "spec": {
                "nodeName": "vk-1",
                "containers": [{"name": "web", "image": "nginx:1.27",
                    "volumeMounts": [
                        {"name": "kube-api-access-abcde",
                         "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                         "readOnly": true},
                        {"name": "data", "mountPath": "/data"}]}],
                "volumes": [
                    {"name": "kube-api-access-abcde", "projected": {"sources": [
                        {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                        {"configMap": {"name": "kube-root-ca.crt",
                            "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                        {"downwardAPI": {"items": [{"path": "namespace",
                            "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}]}},
                    {"name": "data", "emptyDir": {}}],
                "nodeSelector": {"type": "virtual-kubelet"},
                "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists",
                    "effect": "NoExecute", "tolerationSeconds": 300}],
                "priority": 0, "preemptionPolicy": "PreemptLowerPriority",
                "serviceAccountName": "default", "schedulerName": "default-scheduler"
            },
            "status": {"phase": "Pending", "qosClass": "BestEffort"}
        }))
    }

    fn cfg() -> TranslateConfig {
        TranslateConfig::new("vk-1")
    }

    fn annotate(mut p: Pod, key: &str, value: &str) -> Pod {
        p.metadata
            .annotations
            .get_or_insert_default()
            .insert(key.into(), value.into());
        p
    }

    fn spec(p: &Pod) -> &PodSpec {
        p.spec.as_ref().unwrap()
    }

    #[test]
    fn the_extenders_marker_stays_upstairs() {
        let mut upper = bound_pod();
        crate::inject::mark_for_extender(&mut upper);
        let s = upper.spec.as_mut().unwrap();
        s.containers[0]
            .resources
            .as_mut()
            .unwrap()
            .requests
            .as_mut()
            .unwrap()
            .insert(
                "cpu".into(),
                k8s_openapi::apimachinery::pkg::api::resource::Quantity("1".into()),
            );
        let lower = lower_pod(&upper, &cfg()).unwrap();
        let r = spec(&lower).containers[0].resources.as_ref().unwrap();
        assert_eq!(
            r.requests.as_ref().unwrap().keys().collect::<Vec<_>>(),
            ["cpu"]
        );
        assert_eq!(r.limits, None);
    }

    #[test]
    fn checklist_20_kube_system_pods_are_not_offloaded() {
        let mut p = bound_pod();
        p.metadata.namespace = Some("kube-system".into());
        assert_eq!(offload_decision(&p), Err(NotOffloaded::KubeSystem));
        assert_eq!(offload_decision(&bound_pod()), Ok(()));
    }

    #[test]
    fn daemon_set_and_mirror_pods_are_not_offloaded_and_say_why() {
        let mut p = bound_pod();
        p.metadata.owner_references.as_mut().unwrap()[0].kind = "DaemonSet".into();
        assert_eq!(offload_decision(&p), Err(NotOffloaded::DaemonSet));
        assert!(NotOffloaded::DaemonSet.to_string().contains("DaemonSet"));
        let p = annotate(bound_pod(), ANNOTATION_CONFIG_MIRROR, "x");
        assert_eq!(offload_decision(&p), Err(NotOffloaded::MirrorPod));
    }

    #[test]
    fn checklist_21_lower_pod_has_the_same_namespace_and_name() {
        let lower = lower_pod(&bound_pod(), &cfg()).unwrap();
        assert_eq!(lower.metadata.namespace.as_deref(), Some("shop"));
        assert_eq!(lower.metadata.name.as_deref(), Some("web-7d4b9c-x2x9z"));
    }

    #[test]
    fn checklist_23_lower_pod_is_virtual_unbound_statusless_and_has_no_server_metadata() {
        let lower = lower_pod(&bound_pod(), &cfg()).unwrap();
        let labels = lower.metadata.labels.as_ref().unwrap();
        assert_eq!(labels.get("virtual-pod").map(String::as_str), Some("true"));
        assert_eq!(labels.get(LABEL_OWNER).map(String::as_str), Some("vk-1"));
        assert_eq!(spec(&lower).node_name, None);
        assert!(lower.status.is_none());
        let m = &lower.metadata;
        assert!(m.uid.is_none() && m.resource_version.is_none() && m.owner_references.is_none());
        assert!(m.generate_name.is_none() && m.creation_timestamp.is_none());
        assert!(
            m.finalizers.is_none(),
            "upper finalizers would block lower deletion forever"
        );
        let ann = m.annotations.as_ref().unwrap();
        assert_eq!(
            ann.get(ANNOTATION_UPPER_UID).map(String::as_str),
            Some("uid-upper-1")
        );
    }

    #[test]
    fn checklist_24_ignore_labels_are_removed_and_recorded_in_tripped_labels() {
        let lower = lower_pod(&bound_pod(), &cfg()).unwrap();
        let labels = lower.metadata.labels.as_ref().unwrap();
        assert!(!labels.contains_key("pod-group.scheduling.sigs.k8s.io"));
        assert_eq!(labels.get("app").map(String::as_str), Some("web"));
        let ann = lower.metadata.annotations.as_ref().unwrap();
        assert_eq!(
            ann["tripped-labels"],
            r#"{"pod-group.scheduling.sigs.k8s.io":"pg-1"}"#
        );

        let mut p = bound_pod();
        p.metadata
            .labels
            .as_mut()
            .unwrap()
            .remove("pod-group.scheduling.sigs.k8s.io");
        let lower = lower_pod(&p, &cfg()).unwrap();
        assert_eq!(
            lower.metadata.annotations.as_ref().unwrap()["tripped-labels"],
            "{}"
        );
    }

    #[test]
    fn ignore_label_with_empty_value_stays_like_the_original() {
        let mut p = bound_pod();
        p.metadata
            .labels
            .as_mut()
            .unwrap()
            .insert("pod-group.scheduling.sigs.k8s.io".into(), "".into());
        let lower = lower_pod(&p, &cfg()).unwrap();
        assert!(
            lower
                .metadata
                .labels
                .unwrap()
                .contains_key("pod-group.scheduling.sigs.k8s.io")
        );
    }

    #[test]
    fn checklist_51_recovered_labels_put_the_ignore_labels_back() {
        let lower = lower_pod(&bound_pod(), &cfg()).unwrap();
        let labels = recovered_labels(&lower.metadata).unwrap();
        assert_eq!(
            labels
                .get("pod-group.scheduling.sigs.k8s.io")
                .map(String::as_str),
            Some("pg-1")
        );
        assert!(!labels.contains_key(LABEL_OWNER));
        let broken = annotate(lower, ANNOTATION_TRIPPED_LABELS, "{nope");
        assert!(recovered_labels(&broken.metadata).is_err());
    }

    #[test]
    fn checklist_25_service_account_token_volumes_and_mounts_are_removed() {
        let mut p = bound_pod();
        // A legacy token volume too, mounted in an init container.
        let s = p.spec.as_mut().unwrap();
        s.volumes.as_mut().unwrap().push(
            serde_json::from_value(json!({"name": "default-token-q8x2m",
                "secret": {"secretName": "default-token-q8x2m"}}))
            .unwrap(),
        );
        s.init_containers = Some(vec![
            serde_json::from_value(json!({"name": "init",
            "image": "busybox", "volumeMounts": [{"name": "default-token-q8x2m",
            "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}]}))
            .unwrap(),
        ]);
        let lower = lower_pod(&p, &cfg()).unwrap();
        let s = spec(&lower);
        let volumes: Vec<_> = s
            .volumes
            .iter()
            .flatten()
            .map(|v| v.name.as_str())
            .collect();
        assert_eq!(volumes, ["data"]);
        let mounts: Vec<_> = s.containers[0]
            .volume_mounts
            .iter()
            .flatten()
            .map(|m| m.name.as_str())
            .collect();
        assert_eq!(mounts, ["data"]);
        assert!(
            s.init_containers.as_ref().unwrap()[0]
                .volume_mounts
                .is_none()
        );
    }
    #[test]
    fn with_upper_identity_token_volumes_read_our_secret_and_env_names_the_upper_api() {
        let p = bound_pod();
        let cfg = TranslateConfig {
            upper_api: Some(UpperApi {
                host: "upper.example".into(),
                port: 6443,
            }),
            ..cfg()
        };
        let lower = lower_pod(&p, &cfg).unwrap();
        let s = spec(&lower);
        let access = s
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name.starts_with("kube-api-access-"))
            .unwrap();
        let secrets: Vec<_> = access
            .projected
            .as_ref()
            .unwrap()
            .sources
            .iter()
            .flatten()
            .filter_map(|s| s.secret.as_ref())
            .map(|s| s.name.as_str())
            .collect();
        assert_eq!(secrets, ["tensile-identity-uid-upper-1"; 2]);
        // The mount stays, so the lower ServiceAccount admission adds no token of its own.
        assert!(
            s.containers[0]
                .volume_mounts
                .iter()
                .flatten()
                .any(|m| m.name == access.name)
        );
        let env = s.containers[0].env.as_ref().unwrap();
        assert_eq!(env[0].name, "KUBERNETES_SERVICE_HOST");
        assert_eq!(env[0].value.as_deref(), Some("upper.example"));
    }

    #[test]
    fn checklist_26_cluster_selector_gives_node_selector_tolerations_and_required_affinity() {
        let cs = r#"{"nodeSelector":{"disk":"ssd"},"affinity":{"nodeAffinity":{"requiredDuringSchedulingIgnoredDuringExecution":{"nodeSelectorTerms":[{"matchExpressions":[{"key":"zone","operator":"In","values":["a"]}]}]}}},"tolerations":[{"key":"gpu","operator":"Exists","effect":"NoSchedule"}]}"#;
        let mut p = annotate(bound_pod(), "clusterSelector", cs);
        p.spec.as_mut().unwrap().affinity = Some(
            serde_json::from_value(json!({"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "clusterID", "operator": "In", "values": ["c1"]}]}]},
            "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 10, "preference": {
                "matchExpressions": [{"key": "fast", "operator": "Exists"}]}}]}}))
            .unwrap(),
        );
        let lower = lower_pod(&p, &cfg()).unwrap();
        let s = spec(&lower);
        assert_eq!(
            s.node_selector,
            Some(BTreeMap::from([("disk".into(), "ssd".into())]))
        );
        assert_eq!(
            s.tolerations,
            Some(vec![Toleration {
                key: Some("gpu".into()),
                operator: Some("Exists".into()),
                effect: Some("NoSchedule".into()),
                ..Default::default()
            }])
        );
        let node = s.affinity.as_ref().unwrap().node_affinity.as_ref().unwrap();
        let required = node
            .required_during_scheduling_ignored_during_execution
            .as_ref()
            .unwrap();
        assert_eq!(
            required.node_selector_terms[0]
                .match_expressions
                .as_ref()
                .unwrap()[0]
                .key,
            "zone"
        );
        assert_eq!(
            node.preferred_during_scheduling_ignored_during_execution
                .as_ref()
                .unwrap()[0]
                .weight,
            10
        );
    }

    #[test]
    fn cluster_selector_without_node_affinity_drops_the_pods_node_affinity_like_the_original() {
        let mut p = annotate(
            bound_pod(),
            "clusterSelector",
            r#"{"nodeSelector":{"a":"b"}}"#,
        );
        p.spec.as_mut().unwrap().affinity = Some(
            serde_json::from_value(json!({
            "nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1,
                "preference": {"matchExpressions": [{"key": "k", "operator": "Exists"}]}}]},
            "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                {"topologyKey": "kubernetes.io/hostname",
                 "labelSelector": {"matchLabels": {"app": "web"}}}]}}))
            .unwrap(),
        );
        let lower = lower_pod(&p, &cfg()).unwrap();
        let a = spec(&lower).affinity.as_ref().unwrap();
        assert!(a.node_affinity.is_none());
        assert!(a.pod_anti_affinity.is_some());
    }

    #[test]
    fn cluster_selector_affinity_is_used_whole_when_the_pod_has_none() {
        let cs = r#"{"affinity":{"nodeAffinity":{"requiredDuringSchedulingIgnoredDuringExecution":{"nodeSelectorTerms":[{"matchExpressions":[{"key":"zone","operator":"In","values":["a"]}]}]}}}}"#;
        let lower = lower_pod(&annotate(bound_pod(), "clusterSelector", cs), &cfg()).unwrap();
        assert!(
            spec(&lower)
                .affinity
                .as_ref()
                .unwrap()
                .node_affinity
                .is_some()
        );
        assert!(spec(&lower).tolerations.is_none() && spec(&lower).node_selector.is_none());
    }

    #[test]
    fn checklist_27_without_cluster_selector_no_node_selector_tolerations_or_required_affinity() {
        let mut p = bound_pod();
        p.spec.as_mut().unwrap().affinity = Some(serde_json::from_value(json!({
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "type", "operator": "In", "values": ["virtual-kubelet"]}]}]}},
            "podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 3,
                "podAffinityTerm": {"topologyKey": "zone"}}]}})).unwrap());
        let lower = lower_pod(&p, &cfg()).unwrap();
        let s = spec(&lower);
        assert!(s.node_selector.is_none() && s.tolerations.is_none());
        let a = s.affinity.as_ref().unwrap();
        assert!(
            a.node_affinity.is_none(),
            "required dropped and the empty node affinity pruned"
        );
        assert_eq!(
            a.pod_affinity,
            spec(&p).affinity.as_ref().unwrap().pod_affinity
        );
    }

    #[test]
    fn checklist_28_empty_affinity_structures_are_pruned() {
        let mut p = bound_pod();
        p.spec.as_mut().unwrap().affinity = Some(serde_json::from_value(json!({
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "type", "operator": "In", "values": ["x"]}]}]},
                "preferredDuringSchedulingIgnoredDuringExecution": []}})).unwrap());
        assert!(spec(&lower_pod(&p, &cfg()).unwrap()).affinity.is_none());
    }

    #[test]
    fn checklist_29_env_references_are_kept_for_the_lower_kubelet_to_resolve() {
        // Difference from the original (docs/differences.md): instead of freezing env values
        // from upper objects, the referenced ConfigMaps and Secrets are copied down (see
        // deps) and the lower kubelet resolves env, so fieldRefs such as status.podIP are true.
        let mut p = bound_pod();
        p.spec.as_mut().unwrap().containers[0].env = Some(vec![
            serde_json::from_value(json!({
            "name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "db", "key": "pw"}}}))
            .unwrap(),
        ]);
        p.spec.as_mut().unwrap().containers[0].env_from = Some(vec![
            serde_json::from_value(json!({"configMapRef": {"name": "settings"}})).unwrap(),
        ]);
        let lower = lower_pod(&p, &cfg()).unwrap();
        assert_eq!(spec(&lower).containers[0].env, spec(&p).containers[0].env);
        assert_eq!(
            spec(&lower).containers[0].env_from,
            spec(&p).containers[0].env_from
        );
    }

    /// An env entry reading `path` through the downward API.
    fn field_env(name: &str, path: &str) -> EnvVar {
        serde_json::from_value(json!({"name": name,
            "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": path}}}))
        .unwrap()
    }

    fn literal(name: &str, value: &str) -> EnvVar {
        EnvVar {
            name: name.into(),
            value: Some(value.into()),
            value_from: None,
        }
    }

    #[test]
    fn downward_env_that_would_differ_downstairs_is_the_upper_pods_value() {
        let mut p = annotate(bound_pod(), "team", "a");
        p.spec.as_mut().unwrap().containers[0].env = Some(vec![
            field_env("UID", "metadata.uid"),
            field_env("NODE", "spec.nodeName"),
            // Tripped downstairs (an ignore-label): the upper value.
            field_env(
                "GROUP",
                "metadata.labels['pod-group.scheduling.sigs.k8s.io']",
            ),
            // Our marks exist only downstairs: what the upper pod has (nothing).
            field_env("VIRTUAL", "metadata.labels['virtual-pod']"),
            field_env(
                "OWNER_UID",
                "metadata.annotations['tensile-kube.io/upper-uid']",
            ),
            // The same downstairs: still resolved by the lower kubelet, following changes.
            field_env("APP", "metadata.labels['app']"),
            field_env("TEAM", "metadata.annotations['team']"),
            field_env("NAME", "metadata.name"),
            field_env("NAMESPACE", "metadata.namespace"),
            field_env("SA", "spec.serviceAccountName"),
            field_env("IP", "status.podIP"),
            field_env("IPS", "status.podIPs"),
            field_env("HOST", "status.hostIP"),
            literal("PLAIN", "x"),
        ]);
        let lower = lower_pod(&p, &cfg()).unwrap();
        let env = spec(&lower).containers[0].env.clone().unwrap();
        let want = [
            literal("UID", "uid-upper-1"),
            literal("NODE", "vk-1"),
            literal("GROUP", "pg-1"),
            literal("VIRTUAL", ""),
            literal("OWNER_UID", ""),
        ];
        assert_eq!(env[..5], want[..]);
        assert_eq!(env[5..], spec(&p).containers[0].env.as_ref().unwrap()[5..]);
    }

    #[test]
    fn init_container_downward_env_is_pinned_too() {
        let mut p = bound_pod();
        p.spec.as_mut().unwrap().init_containers = Some(vec![
            serde_json::from_value(json!({"name": "init", "image": "busybox"})).unwrap(),
        ]);
        p.spec.as_mut().unwrap().init_containers.as_mut().unwrap()[0].env =
            Some(vec![field_env("NODE", "spec.nodeName")]);
        let lower = lower_pod(&p, &cfg()).unwrap();
        assert_eq!(
            spec(&lower).init_containers.as_ref().unwrap()[0].env,
            Some(vec![literal("NODE", "vk-1")])
        );
    }

    #[test]
    fn pinned_values_survive_the_kubelets_dollar_expansion() {
        // The kubelet expands `$(VAR)` and reads `$$` as `$` in literal values.
        let mut p = annotate(bound_pod(), ANNOTATION_UPPER_UID, "cost $(HOME) $5");
        p.spec.as_mut().unwrap().containers[0].env = Some(vec![field_env(
            "FORGED",
            "metadata.annotations['tensile-kube.io/upper-uid']",
        )]);
        let lower = lower_pod(&p, &cfg()).unwrap();
        assert_eq!(
            spec(&lower).containers[0].env,
            Some(vec![literal("FORGED", "cost $$(HOME) $$5")])
        );
    }

    #[test]
    fn downward_field_values_read_like_the_kubelet() {
        let p = bound_pod();
        let v = |path| downward_field_value(&p, path);
        assert_eq!(v("metadata.uid").as_deref(), Some("uid-upper-1"));
        assert_eq!(v("spec.nodeName").as_deref(), Some("vk-1"));
        assert_eq!(v("metadata.labels['app']").as_deref(), Some("web"));
        assert_eq!(v("metadata.labels['absent']").as_deref(), Some(""));
        assert_eq!(v("metadata.annotations['team']").as_deref(), Some("a"));
        assert_eq!(v("spec.serviceAccountName").as_deref(), Some("default"));
        assert_eq!(v("status.podIP"), None);
        assert_eq!(v("metadata.labels"), None, "whole maps are volume-only");
        // Without a uid (never the case from an API server) nothing differs: kept.
        let mut p = bound_pod();
        p.metadata.uid = None;
        p.spec.as_mut().unwrap().containers[0].env = Some(vec![field_env("UID", "metadata.uid")]);
        let lower = lower_pod(&p, &cfg()).unwrap();
        assert_eq!(
            spec(&lower).containers[0].env,
            Some(vec![field_env("UID", "metadata.uid")])
        );
    }

    #[test]
    fn admission_computed_fields_are_left_to_the_lower_cluster() {
        let mut p = bound_pod();
        let s = p.spec.as_mut().unwrap();
        s.priority_class_name = Some("high".into());
        s.priority = Some(1000);
        s.runtime_class_name = Some("kata".into());
        s.overhead = Some(BTreeMap::from([(
            "cpu".into(),
            k8s_openapi::apimachinery::pkg::api::resource::Quantity("250m".into()),
        )]));
        let lower = lower_pod(&p, &cfg()).unwrap();
        let s = spec(&lower);
        assert_eq!(s.priority_class_name.as_deref(), Some("high"));
        assert_eq!(s.runtime_class_name.as_deref(), Some("kata"));
        assert!(s.priority.is_none() && s.preemption_policy.is_none() && s.overhead.is_none());
    }

    #[test]
    fn everything_else_in_the_spec_is_kept() {
        let p = bound_pod();
        let lower = lower_pod(&p, &cfg()).unwrap();
        let (u, l) = (spec(&p), spec(&lower));
        assert_eq!(l.containers[0].image, u.containers[0].image);
        assert_eq!(l.service_account_name, u.service_account_name);
        assert_eq!(l.scheduler_name.as_deref(), Some("default-scheduler"));
        let ann = lower.metadata.annotations.as_ref().unwrap();
        assert_eq!(ann.get("team").map(String::as_str), Some("a"));
        assert_eq!(
            ann.get(ANNOTATION_SYNCED_ANNOTATIONS).map(String::as_str),
            Some("team")
        );
    }

    #[test]
    fn the_lower_pod_is_scheduled_by_the_lower_default_scheduler() {
        // Placed upstairs by a custom scheduler the lower cluster does not run.
        let mut p = bound_pod();
        p.spec.as_mut().unwrap().scheduler_name = Some("my-scheduler".into());
        let lower = lower_pod(&p, &cfg()).unwrap();
        assert_eq!(
            spec(&lower).scheduler_name.as_deref(),
            Some("default-scheduler")
        );
        // No schedulerName at all (a pod not yet defaulted) gets the default too.
        p.spec.as_mut().unwrap().scheduler_name = None;
        let lower = lower_pod(&p, &cfg()).unwrap();
        assert_eq!(
            spec(&lower).scheduler_name.as_deref(),
            Some("default-scheduler")
        );
    }

    #[test]
    fn the_pod_may_name_its_lower_scheduler() {
        let mut p = annotate(bound_pod(), ANNOTATION_LOWER_SCHEDULER_NAME, " volcano ");
        p.spec.as_mut().unwrap().scheduler_name = Some("my-scheduler".into());
        let lower = lower_pod(&p, &cfg()).unwrap();
        assert_eq!(spec(&lower).scheduler_name.as_deref(), Some("volcano"));
        let ann = lower.metadata.annotations.as_ref().unwrap();
        assert_eq!(
            ann[ANNOTATION_LOWER_SCHEDULER_NAME], " volcano ",
            "copied like any other"
        );
        // Blank is unset.
        let blank = annotate(bound_pod(), ANNOTATION_LOWER_SCHEDULER_NAME, " ");
        let lower = lower_pod(&blank, &cfg()).unwrap();
        assert_eq!(
            spec(&lower).scheduler_name.as_deref(),
            Some("default-scheduler")
        );
    }

    #[test]
    fn our_marks_are_never_taken_from_the_upper_pod() {
        let p = annotate(bound_pod(), ANNOTATION_UPPER_UID, "forged");
        let lower = lower_pod(&p, &cfg()).unwrap();
        let ann = lower.metadata.annotations.unwrap();
        assert_eq!(ann[ANNOTATION_UPPER_UID], "uid-upper-1");
        assert_eq!(ann[ANNOTATION_SYNCED_ANNOTATIONS], "team");
    }

    #[test]
    fn malformed_inputs_are_typed_errors() {
        let p = annotate(bound_pod(), "clusterSelector", "{not json");
        let err = lower_pod(&p, &cfg()).unwrap_err();
        assert!(matches!(err, TranslateError::ClusterSelector { .. }));
        assert!(err.to_string().contains("shop/web-7d4b9c-x2x9z"), "{err}");

        let mut p = bound_pod();
        p.spec.as_mut().unwrap().containers.clear();
        assert!(matches!(
            lower_pod(&p, &cfg()),
            Err(TranslateError::NoContainers { .. })
        ));
        let mut p = bound_pod();
        p.spec = None;
        assert!(matches!(
            lower_pod(&p, &cfg()),
            Err(TranslateError::NoContainers { .. })
        ));
        let mut p = bound_pod();
        p.metadata.namespace = None;
        assert!(matches!(
            lower_pod(&p, &cfg()),
            Err(TranslateError::MissingMetadata { .. })
        ));
    }

    #[test]
    fn translation_is_idempotent_on_its_inputs() {
        let p = bound_pod();
        assert_eq!(
            lower_pod(&p, &cfg()).unwrap(),
            lower_pod(&p, &cfg()).unwrap()
        );
    }
}
