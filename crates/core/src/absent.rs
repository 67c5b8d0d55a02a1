//! An optional reference whose object is missing upstairs must never read a lower object that
//! is not ours.
//!
//! Such a reference stays in the lower pod when the lower cluster has no object of that name, or
//! only ours (a copy on its way out): the kubelet downstairs then treats it as the kubelet
//! upstairs would (env var not set, empty volume), and when the object appears upstairs our copy
//! appears downstairs and the lower kubelet fills the volume, as a kubelet fills an optional
//! volume once its object exists ([`optional_missing_is_absent`]).
//!
//! When the lower cluster holds an object of that name that is not a copy of ours (an unrelated
//! Secret of the lower cluster, say), a kept reference would read it: the reference is taken
//! out of the lower pod instead, as the kubelet treats it upstairs:
//! - an optional `configMapKeyRef`/`secretKeyRef` env var: not set (dropped);
//! - an optional `envFrom` source: dropped;
//! - an optional `configMap`/`secret` volume: the kubelet mounts an empty directory, so the
//!   lower volume becomes `emptyDir: {}` under the same name (the mounts are unchanged);
//! - an optional projected source: dropped from `sources` (a projection left without sources
//!   becomes `emptyDir: {}`, the empty directory the kubelet would mount);
//! - an `imagePullSecrets` entry: dropped (the kubelet pulls without it).
//!
//! The node collects the set: those optional references, and the Secrets that hold an upper
//! service-account token (never copied, so missing downstairs by design). A mandatory reference
//! to such an object holds the pod back instead (never here).
//!
//! An optional key missing from an object that exists needs nothing: the copy has the same keys.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{
    EmptyDirVolumeSource, EnvFromSource, EnvVar, LocalObjectReference, PodSpec, Volume,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::deps::is_owned_by;

/// The ConfigMaps and Secrets (by name, in the pod's namespace) that are absent for the pod.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Absent {
    /// ConfigMaps missing upstairs.
    pub config_maps: BTreeSet<String>,
    /// Secrets missing upstairs, or not copyable (service-account tokens).
    pub secrets: BTreeSet<String>,
}

impl Absent {
    /// Nothing is absent.
    pub fn is_empty(&self) -> bool {
        self.config_maps.is_empty() && self.secrets.is_empty()
    }
}

/// Whether an optional reference whose object is missing upstairs must leave the lower pod,
/// given the lower object of that name (`lower`, if any): only when that one is not ours. With
/// none, or ours, the reference stays, so the object reaches the pod when it appears upstairs.
pub fn optional_missing_is_absent(lower: Option<&ObjectMeta>, owner: &str) -> bool {
    lower.is_some_and(|meta| !is_owned_by(meta, owner))
}

/// Removes from the lower pod `spec` every reference to an object of `absent` (see the module
/// documentation for what each kind of reference becomes). Containers, init containers and
/// ephemeral containers alike.
pub fn drop_absent(spec: &mut PodSpec, absent: &Absent) {
    if absent.is_empty() {
        return;
    }
    let env = |env: &mut Option<Vec<EnvVar>>, env_from: &mut Option<Vec<EnvFromSource>>| {
        retain(env, |v| !env_var_absent(v, absent));
        retain(env_from, |s| !env_from_absent(s, absent));
    };
    for c in spec
        .containers
        .iter_mut()
        .chain(spec.init_containers.iter_mut().flatten())
    {
        env(&mut c.env, &mut c.env_from);
    }
    for c in spec.ephemeral_containers.iter_mut().flatten() {
        env(&mut c.env, &mut c.env_from);
    }
    for volume in spec.volumes.iter_mut().flatten() {
        drop_absent_from_volume(volume, absent);
    }
    retain(&mut spec.image_pull_secrets, |r: &LocalObjectReference| {
        !absent.secrets.contains(&r.name)
    });
}

/// Keeps the items `keep` says; an emptied list is no list (as the API server stores it).
fn retain<T>(list: &mut Option<Vec<T>>, keep: impl FnMut(&T) -> bool) {
    if let Some(items) = list.as_mut() {
        items.retain(keep);
        if items.is_empty() {
            *list = None;
        }
    }
}

fn env_var_absent(var: &EnvVar, absent: &Absent) -> bool {
    let Some(from) = &var.value_from else {
        return false;
    };
    from.config_map_key_ref
        .as_ref()
        .is_some_and(|r| absent.config_maps.contains(&r.name))
        || from
            .secret_key_ref
            .as_ref()
            .is_some_and(|r| absent.secrets.contains(&r.name))
}

fn env_from_absent(source: &EnvFromSource, absent: &Absent) -> bool {
    source
        .config_map_ref
        .as_ref()
        .is_some_and(|r| absent.config_maps.contains(&r.name))
        || source
            .secret_ref
            .as_ref()
            .is_some_and(|r| absent.secrets.contains(&r.name))
}

/// The empty directory the kubelet mounts for an optional volume whose object is missing.
fn empty_dir(volume: &Volume) -> Volume {
    Volume {
        name: volume.name.clone(),
        empty_dir: Some(EmptyDirVolumeSource::default()),
        ..Volume::default()
    }
}

fn drop_absent_from_volume(volume: &mut Volume, absent: &Absent) {
    let config_map = volume
        .config_map
        .as_ref()
        .is_some_and(|s| absent.config_maps.contains(&s.name));
    let secret = volume
        .secret
        .as_ref()
        .and_then(|s| s.secret_name.as_ref())
        .is_some_and(|name| absent.secrets.contains(name));
    if config_map || secret {
        *volume = empty_dir(volume);
        return;
    }
    let Some(sources) = volume.projected.as_mut().and_then(|p| p.sources.as_mut()) else {
        return;
    };
    let before = sources.len();
    sources.retain(|s| {
        !(s.config_map
            .as_ref()
            .is_some_and(|r| absent.config_maps.contains(&r.name))
            || s.secret
                .as_ref()
                .is_some_and(|r| absent.secrets.contains(&r.name)))
    });
    if sources.is_empty() && before > 0 {
        *volume = empty_dir(volume);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::translate::tests::pod;
    use pretty_assertions::assert_eq;
    use serde_json::{Value, json};

    #[test]
    fn an_optional_reference_leaves_only_for_a_lower_object_not_ours() {
        let owner = "vk-a";
        let meta = |label: (&str, String)| ObjectMeta {
            name: Some("cm".to_owned()),
            labels: Some([(label.0.to_owned(), label.1)].into()),
            ..ObjectMeta::default()
        };
        let ours = meta((
            crate::keys::LABEL_OWNER,
            crate::keys::owner_label_value(owner),
        ));
        let foreign = meta(("app", "x".to_owned()));
        let other_node = meta((
            crate::keys::LABEL_OWNER,
            crate::keys::owner_label_value("vk-b"),
        ));
        assert!(
            !optional_missing_is_absent(None, owner),
            "nothing downstairs: kept"
        );
        assert!(
            !optional_missing_is_absent(Some(&ours), owner),
            "ours: kept"
        );
        assert!(optional_missing_is_absent(Some(&foreign), owner));
        assert!(optional_missing_is_absent(Some(&other_node), owner));
    }

    fn absent(config_maps: &[&str], secrets: &[&str]) -> Absent {
        Absent {
            config_maps: config_maps.iter().map(|s| (*s).to_owned()).collect(),
            secrets: secrets.iter().map(|s| (*s).to_owned()).collect(),
        }
    }

    fn spec(spec: Value) -> PodSpec {
        pod(json!({"metadata": {"name": "p", "namespace": "n"}, "spec": spec}))
            .spec
            .unwrap()
    }

    fn dropped(before: Value, absent: &Absent) -> Value {
        let mut s = spec(before);
        drop_absent(&mut s, absent);
        serde_json::to_value(s).unwrap()
    }

    #[test]
    fn an_optional_key_ref_env_var_of_a_missing_object_is_not_set() {
        let env = json!([
            {"name": "A", "valueFrom": {"secretKeyRef": {"name": "gone", "key": "k", "optional": true}}},
            {"name": "B", "valueFrom": {"configMapKeyRef": {"name": "gone-cm", "key": "k", "optional": true}}},
            {"name": "C", "valueFrom": {"secretKeyRef": {"name": "here", "key": "k"}}},
            {"name": "D", "value": "plain"},
        ]);
        let out = dropped(
            json!({"containers": [{"name": "c", "image": "i", "env": env}],
                   "initContainers": [{"name": "i", "image": "i", "env": [env[0].clone()]}],
                   "ephemeralContainers": [{"name": "e", "image": "i", "env": [env[1].clone()]}]}),
            &absent(&["gone-cm"], &["gone"]),
        );
        assert_eq!(
            out["containers"][0]["env"],
            json!([env[2].clone(), env[3].clone()])
        );
        assert_eq!(
            out["initContainers"][0].get("env"),
            None,
            "emptied: no list"
        );
        assert_eq!(out["ephemeralContainers"][0].get("env"), None);
    }

    #[test]
    fn an_optional_env_from_source_of_a_missing_object_is_dropped() {
        let out = dropped(
            json!({"containers": [{"name": "c", "image": "i", "envFrom": [
                {"secretRef": {"name": "gone", "optional": true}},
                {"configMapRef": {"name": "gone", "optional": true}, "prefix": "X_"},
                {"configMapRef": {"name": "here"}},
            ]}]}),
            &absent(&[], &["gone"]),
        );
        // Only the Secret is absent: the ConfigMap of the same name stays.
        assert_eq!(
            out["containers"][0]["envFrom"],
            json!([
                {"configMapRef": {"name": "gone", "optional": true}, "prefix": "X_"},
                {"configMapRef": {"name": "here"}},
            ])
        );
    }

    #[test]
    fn an_optional_volume_of_a_missing_object_is_an_empty_dir_of_the_same_name() {
        let mounts = json!([{"name": "s", "mountPath": "/s"}, {"name": "c", "mountPath": "/c"}]);
        let out = dropped(
            json!({"containers": [{"name": "c", "image": "i", "volumeMounts": mounts}],
            "volumes": [
                {"name": "s", "secret": {"secretName": "gone", "optional": true, "defaultMode": 256}},
                {"name": "c", "configMap": {"name": "gone-cm", "optional": true}},
                {"name": "k", "configMap": {"name": "here"}},
            ]}),
            &absent(&["gone-cm"], &["gone"]),
        );
        assert_eq!(
            out["volumes"],
            json!([
                {"name": "s", "emptyDir": {}},
                {"name": "c", "emptyDir": {}},
                {"name": "k", "configMap": {"name": "here"}},
            ])
        );
        assert_eq!(
            out["containers"][0]["volumeMounts"], mounts,
            "mounts unchanged"
        );
    }

    #[test]
    fn an_optional_projected_source_of_a_missing_object_is_dropped() {
        let out = dropped(
            json!({"containers": [{"name": "c", "image": "i"}],
            "volumes": [
                {"name": "mixed", "projected": {"sources": [
                    {"secret": {"name": "gone", "optional": true}},
                    {"configMap": {"name": "here"}},
                    {"downwardAPI": {"items": [{"path": "n", "fieldRef": {"fieldPath": "metadata.name"}}]}},
                ]}},
                {"name": "only", "projected": {"sources": [
                    {"configMap": {"name": "gone-cm", "optional": true}},
                ]}},
            ]}),
            &absent(&["gone-cm"], &["gone"]),
        );
        assert_eq!(
            out["volumes"],
            json!([
                {"name": "mixed", "projected": {"sources": [
                    {"configMap": {"name": "here"}},
                    {"downwardAPI": {"items": [{"path": "n", "fieldRef": {"fieldPath": "metadata.name"}}]}},
                ]}},
                {"name": "only", "emptyDir": {}},
            ])
        );
    }

    #[test]
    fn an_image_pull_secret_missing_upstairs_is_dropped() {
        let out = dropped(
            json!({"containers": [{"name": "c", "image": "i"}],
                   "imagePullSecrets": [{"name": "gone"}, {"name": "here"}]}),
            &absent(&[], &["gone"]),
        );
        assert_eq!(out["imagePullSecrets"], json!([{"name": "here"}]));
        let out = dropped(
            json!({"containers": [{"name": "c", "image": "i"}],
                   "imagePullSecrets": [{"name": "gone"}]}),
            &absent(&[], &["gone"]),
        );
        assert_eq!(out.get("imagePullSecrets"), None);
    }

    #[test]
    fn nothing_absent_changes_nothing() {
        let before = json!({"containers": [{"name": "c", "image": "i", "envFrom": [
                {"secretRef": {"name": "s", "optional": true}}]}],
            "volumes": [{"name": "v", "secret": {"secretName": "s", "optional": true}}],
            "imagePullSecrets": [{"name": "s"}]});
        assert_eq!(
            dropped(before.clone(), &Absent::default()),
            serde_json::to_value(spec(before)).unwrap()
        );
    }

    /// An optional key missing from an object that exists stays in the lower pod: the copy has
    /// exactly the keys of the upper object, so the lower kubelet resolves it as the upper one
    /// would (not set, or not projected).
    #[test]
    fn an_optional_key_missing_from_an_existing_object_is_left_to_the_copy() {
        use crate::deps::lower_secret;
        use k8s_openapi::api::core::v1::Secret;
        let upper: Secret = serde_json::from_value(json!({
            "metadata": {"name": "here", "namespace": "n", "uid": "u"},
            "data": {"present": "dg=="}
        }))
        .unwrap();
        let copy = lower_secret(&upper, "vk-1").unwrap();
        assert_eq!(copy.data, upper.data, "the copy has the same keys, no more");
        let before = json!({"containers": [{"name": "c", "image": "i", "env": [
            {"name": "K", "valueFrom": {"secretKeyRef": {"name": "here", "key": "missing", "optional": true}}}]}]});
        assert_eq!(
            dropped(before.clone(), &absent(&[], &["gone"])),
            serde_json::to_value(spec(before)).unwrap()
        );
    }
}
