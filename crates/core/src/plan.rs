//! The order in which a pod's lower objects are created, and what to do when one of them
//! already exists. Dependencies come before the pod (the original created ConfigMaps and PVCs
//! asynchronously, after the pod), and an existing object decides by ownership whether it is
//! ours to keep in sync, a namespace to use as it is, or a conflict to report: a lower
//! ConfigMap, Secret, ServiceAccount or claim that is not ours is never used for an upper pod
//! (its content is the lower cluster's, not the pod's; see docs/security.md).

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::deps::{Need, PodDependencies, is_owned_by};
use crate::keys::{ANNOTATION_UPPER_UID, LABEL_OWNER, SERVICE_ACCOUNT_DEFAULT};

/// The kinds of lower objects created for a pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LowerKind {
    /// The pod's namespace.
    Namespace,
    /// A ServiceAccount other than `default` (every namespace has that one).
    ServiceAccount,
    /// A ConfigMap the pod references.
    ConfigMap,
    /// A Secret the pod references.
    Secret,
    /// A PersistentVolumeClaim the pod mounts.
    PersistentVolumeClaim,
    /// The pod itself, always last.
    Pod,
}

/// One step of a creation plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    /// What to create.
    pub kind: LowerKind,
    /// Its name (the namespace's name for [`LowerKind::Namespace`]).
    pub name: String,
    /// Whether the pod can start without it (an optional reference): a missing upper object
    /// is then left out of the lower pod ([`crate::absent`]) instead of holding the pod back.
    pub optional: bool,
}

/// Everything to create in the lower cluster for a pod, dependencies first, the pod last.
pub fn creation_plan(namespace: &str, pod_name: &str, deps: &PodDependencies) -> Vec<Step> {
    let step = |kind, name: &str, need: Need| Step {
        kind,
        name: name.to_owned(),
        optional: need.optional,
    };
    let mut plan = vec![step(LowerKind::Namespace, namespace, Need::MANDATORY)];
    if deps.service_account != SERVICE_ACCOUNT_DEFAULT {
        plan.push(step(
            LowerKind::ServiceAccount,
            &deps.service_account,
            Need::MANDATORY,
        ));
    }
    for (kind, set) in [
        (LowerKind::ConfigMap, &deps.config_maps),
        (LowerKind::Secret, &deps.secrets),
        (LowerKind::PersistentVolumeClaim, &deps.pvcs),
    ] {
        plan.extend(set.iter().map(|(name, need)| step(kind, name, *need)));
    }
    plan.push(step(LowerKind::Pod, pod_name, Need::MANDATORY));
    plan
}

/// What to do when a lower object we were about to create already exists.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Existing {
    /// Ours, for this upper object: adopt it (after a restart, or a create that raced).
    Ours,
    /// A namespace that is not ours: used as it is (a namespace holds objects, it is no data
    /// a pod reads), never changed.
    UseAsIs,
    /// A pod of ours left from an earlier upper pod of the same name (another UID): delete it
    /// with a UID precondition, then create ours.
    Stale,
    /// Another virtual node's copy of the very same upper object (its recorded upper UID is the
    /// one we copy): two virtual nodes on one lower cluster share it. Used as it is, never
    /// changed; its owner keeps it in sync.
    Sibling,
    /// An object that is not ours holds the name: never used and never overwritten; the pod
    /// is not created and waits, the conflict reported on it.
    Conflict,
}

/// The decision for an existing lower object of `kind` when creating for the upper object
/// with `upper_uid` (empty when the copy mirrors no upper object, as a ServiceAccount).
/// AlreadyExists is never an error by itself (the original failed on an existing namespace).
///
/// A copy carrying another virtual node's owner mark and our upper object's UID is that
/// object's copy: UIDs are unique, so it holds what the pod would read upstairs (a node of
/// another upper cluster sharing the lower cluster never has that UID).
pub fn on_existing(
    kind: LowerKind,
    existing: &ObjectMeta,
    owner: &str,
    upper_uid: &str,
) -> Existing {
    let ours = is_owned_by(existing, owner);
    let recorded_uid = existing
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_UPPER_UID));
    match kind {
        LowerKind::Pod if !ours => Existing::Conflict,
        LowerKind::Pod if recorded_uid.map(String::as_str) == Some(upper_uid) => Existing::Ours,
        LowerKind::Pod => Existing::Stale,
        _ if ours => Existing::Ours,
        LowerKind::Namespace => Existing::UseAsIs,
        LowerKind::ConfigMap | LowerKind::Secret | LowerKind::PersistentVolumeClaim
            if !upper_uid.is_empty()
                && recorded_uid.map(String::as_str) == Some(upper_uid)
                && existing
                    .labels
                    .as_ref()
                    .is_some_and(|l| l.contains_key(LABEL_OWNER)) =>
        {
            Existing::Sibling
        }
        LowerKind::ServiceAccount
        | LowerKind::ConfigMap
        | LowerKind::Secret
        | LowerKind::PersistentVolumeClaim => Existing::Conflict,
    }
}

/// Convenience: the plan for a pod (name and namespace from its metadata).
pub fn pod_creation_plan(pod: &Pod, deps: &PodDependencies) -> Option<Vec<Step>> {
    Some(creation_plan(
        pod.metadata.namespace.as_deref()?,
        pod.metadata.name.as_deref()?,
        deps,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::deps::pod_dependencies;
    use crate::keys::owner_label_value;
    use crate::translate::tests::pod;
    use serde_json::json;
    use std::collections::BTreeMap;

    fn needy_pod() -> Pod {
        pod(json!({
            "metadata": {"name": "app", "namespace": "shop", "uid": "u1"},
            "spec": {
                "serviceAccountName": "builder",
                "containers": [{"name": "c", "image": "i",
                    "envFrom": [{"configMapRef": {"name": "opt", "optional": true}}]}],
                "volumes": [
                    {"name": "cfg", "configMap": {"name": "settings"}},
                    {"name": "s", "secret": {"secretName": "creds"}},
                    {"name": "d", "persistentVolumeClaim": {"claimName": "data"}}]
            }
        }))
    }

    fn meta(owner: Option<&str>, uid: Option<&str>) -> ObjectMeta {
        ObjectMeta {
            labels: owner.map(|o| BTreeMap::from([(LABEL_OWNER.to_owned(), owner_label_value(o))])),
            annotations: uid
                .map(|u| BTreeMap::from([(ANNOTATION_UPPER_UID.to_owned(), u.to_owned())])),
            ..ObjectMeta::default()
        }
    }

    #[test]
    fn checklist_22_the_namespace_is_created_first_and_the_pod_last() {
        let p = needy_pod();
        let plan = pod_creation_plan(&p, &pod_dependencies(&p)).unwrap();
        let kinds: Vec<_> = plan
            .iter()
            .map(|s| (s.kind, s.name.as_str(), s.optional))
            .collect();
        assert_eq!(
            kinds,
            [
                (LowerKind::Namespace, "shop", false),
                (LowerKind::ServiceAccount, "builder", false),
                (LowerKind::ConfigMap, "opt", true),
                (LowerKind::ConfigMap, "settings", false),
                (LowerKind::Secret, "creds", false),
                (LowerKind::PersistentVolumeClaim, "data", false),
                (LowerKind::Pod, "app", false),
            ]
        );
    }

    #[test]
    fn checklist_22_fix_an_existing_namespace_is_not_an_error() {
        assert_eq!(
            on_existing(LowerKind::Namespace, &meta(None, None), "vk-1", "u1"),
            Existing::UseAsIs
        );
    }

    #[test]
    fn checklist_30_fix_dependencies_come_before_the_pod() {
        let p = needy_pod();
        let plan = pod_creation_plan(&p, &pod_dependencies(&p)).unwrap();
        let pod_at = plan.iter().position(|s| s.kind == LowerKind::Pod).unwrap();
        assert_eq!(pod_at, plan.len() - 1);
        assert!(
            plan[..pod_at]
                .iter()
                .any(|s| s.kind == LowerKind::ConfigMap)
        );
    }

    #[test]
    fn default_service_account_is_not_created() {
        let mut p = needy_pod();
        p.spec.as_mut().unwrap().service_account_name = None;
        let plan = pod_creation_plan(&p, &pod_dependencies(&p)).unwrap();
        assert!(plan.iter().all(|s| s.kind != LowerKind::ServiceAccount));
    }

    /// The original used existing lower objects as they are and never overwrote them; never
    /// overwritten still holds, but one that is not ours (no owner mark, or another node's) is
    /// no longer used either: the pod waits on a conflict.
    #[test]
    fn checklist_33_existing_lower_objects_that_are_not_ours_are_never_used() {
        for kind in [
            LowerKind::ConfigMap,
            LowerKind::Secret,
            LowerKind::ServiceAccount,
            LowerKind::PersistentVolumeClaim,
        ] {
            assert_eq!(
                on_existing(kind, &meta(None, None), "vk-1", "u1"),
                Existing::Conflict
            );
            // Another node's copy of another upper object, or an object with a forged UID
            // but no owner mark: not the object the pod reads upstairs.
            assert_eq!(
                on_existing(kind, &meta(Some("vk-2"), Some("u0")), "vk-1", "u1"),
                Existing::Conflict
            );
            assert_eq!(
                on_existing(kind, &meta(None, Some("u1")), "vk-1", "u1"),
                Existing::Conflict
            );
            assert_eq!(
                on_existing(kind, &meta(Some("vk-1"), Some("u0")), "vk-1", "u1"),
                Existing::Ours
            );
        }
    }

    #[test]
    fn another_nodes_copy_of_the_same_upper_object_is_shared_and_nothing_else_is() {
        for kind in [
            LowerKind::ConfigMap,
            LowerKind::Secret,
            LowerKind::PersistentVolumeClaim,
        ] {
            assert_eq!(
                on_existing(kind, &meta(Some("vk-2"), Some("u1")), "vk-1", "u1"),
                Existing::Sibling
            );
            // A copy that mirrors no upper object never matches an empty UID.
            assert_eq!(
                on_existing(kind, &meta(Some("vk-2"), Some("")), "vk-1", ""),
                Existing::Conflict
            );
        }
        // ServiceAccounts mirror no upper object: another node's is not ours to use.
        assert_eq!(
            on_existing(
                LowerKind::ServiceAccount,
                &meta(Some("vk-2"), Some("u1")),
                "vk-1",
                "u1"
            ),
            Existing::Conflict
        );
    }

    #[test]
    fn existing_pod_is_adopted_replaced_or_a_conflict_by_ownership() {
        let pod_kind = LowerKind::Pod;
        assert_eq!(
            on_existing(pod_kind, &meta(Some("vk-1"), Some("u1")), "vk-1", "u1"),
            Existing::Ours
        );
        assert_eq!(
            on_existing(pod_kind, &meta(Some("vk-1"), Some("u0")), "vk-1", "u1"),
            Existing::Stale
        );
        assert_eq!(
            on_existing(pod_kind, &meta(Some("vk-2"), Some("u1")), "vk-1", "u1"),
            Existing::Conflict
        );
        assert_eq!(
            on_existing(pod_kind, &meta(None, None), "vk-1", "u1"),
            Existing::Conflict
        );
    }
}
