//! The environment events of the virtual-kubelet library, which the original's users saw as
//! tensile-kube's: when a container's `env`/`envFrom` names a ConfigMap or Secret (or a key of
//! one) that the upper cluster does not have, or that could not be read, the pod gets a Warning
//! event with the library's reason and message shape. The library resolved the environment
//! itself; the node copies the objects instead, so what it knows is what it found upstairs while
//! creating the pod: [`env_events`] turns that into the events, and the node sends them next to
//! its own (`ProviderCreateFailed` and the condition say the pod waits).
//!
//! What follows for the pod is the node's, not decided here: a missing optional object's
//! reference is dropped (`crate::absent`), a missing mandatory object holds the pod back, a
//! missing key is left to the lower kubelet (the copy has exactly the upper object's keys).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{EnvFromSource, EnvVar, PodSpec};

/// An optional ConfigMap is missing.
pub const OPTIONAL_CONFIG_MAP_NOT_FOUND: &str = "OptionalConfigMapNotFound";
/// An optional key is missing from an existing ConfigMap.
pub const OPTIONAL_CONFIG_MAP_KEY_NOT_FOUND: &str = "OptionalConfigMapKeyNotFound";
/// An optional ConfigMap could not be read.
pub const FAILED_TO_READ_OPTIONAL_CONFIG_MAP: &str = "FailedToReadOptionalConfigMap";
/// An optional Secret is missing.
pub const OPTIONAL_SECRET_NOT_FOUND: &str = "OptionalSecretNotFound";
/// An optional key is missing from an existing Secret.
pub const OPTIONAL_SECRET_KEY_NOT_FOUND: &str = "OptionalSecretKeyNotFound";
/// An optional Secret could not be read.
pub const FAILED_TO_READ_OPTIONAL_SECRET: &str = "FailedToReadOptionalSecret";
/// A mandatory ConfigMap is missing.
pub const MANDATORY_CONFIG_MAP_NOT_FOUND: &str = "MandatoryConfigMapNotFound";
/// A mandatory key is missing from an existing ConfigMap.
pub const MANDATORY_CONFIG_MAP_KEY_NOT_FOUND: &str = "MandatoryConfigMapKeyNotFound";
/// A mandatory ConfigMap could not be read.
pub const FAILED_TO_READ_MANDATORY_CONFIG_MAP: &str = "FailedToReadMandatoryConfigMap";
/// A mandatory Secret is missing.
pub const MANDATORY_SECRET_NOT_FOUND: &str = "MandatorySecretNotFound";
/// A mandatory key is missing from an existing Secret.
pub const MANDATORY_SECRET_KEY_NOT_FOUND: &str = "MandatorySecretKeyNotFound";
/// A mandatory Secret could not be read.
pub const FAILED_TO_READ_MANDATORY_SECRET: &str = "FailedToReadMandatorySecret";
/// Keys of an `envFrom` object that are no environment variable names.
pub const INVALID_ENVIRONMENT_VARIABLE_NAMES: &str = "InvalidEnvironmentVariableNames";

/// What the node found upstairs for one referenced ConfigMap or Secret.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Found {
    /// It exists, with these keys (`data`: what the kubelet reads for the environment).
    Keys(BTreeSet<String>),
    /// The upper cluster does not have it.
    NotFound,
    /// Reading it failed (not a 404).
    Unreadable,
}

/// The referenced objects by name (in the pod's namespace), as found upstairs. A name missing
/// from the maps was not looked at: no event for it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Upstairs {
    /// ConfigMaps.
    pub config_maps: BTreeMap<String, Found>,
    /// Secrets.
    pub secrets: BTreeMap<String, Found>,
}

/// One Warning event on the pod (the library sent them all as Warnings).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EnvEvent {
    /// One of this module's reasons.
    pub reason: &'static str,
    /// The library's message shape.
    pub message: String,
}

/// The ConfigMaps and Secrets that `env`/`envFrom` of any container (init and ephemeral ones
/// included) name: the ones to look up for [`env_events`].
pub fn env_references(spec: &PodSpec) -> (BTreeSet<String>, BTreeSet<String>) {
    let (mut config_maps, mut secrets) = (BTreeSet::new(), BTreeSet::new());
    for (env, env_from) in containers(spec) {
        for source in env_from {
            if let Some(r) = &source.config_map_ref {
                config_maps.insert(r.name.clone());
            }
            if let Some(r) = &source.secret_ref {
                secrets.insert(r.name.clone());
            }
        }
        for var in env {
            let Some(from) = &var.value_from else {
                continue;
            };
            if let Some(r) = &from.config_map_key_ref {
                config_maps.insert(r.name.clone());
            }
            if let Some(r) = &from.secret_key_ref {
                secrets.insert(r.name.clone());
            }
        }
    }
    (config_maps, secrets)
}

/// Every container's `env` and `envFrom`, in the library's order: init containers, containers,
/// ephemeral containers.
fn containers(spec: &PodSpec) -> Vec<(&[EnvVar], &[EnvFromSource])> {
    fn of<T>(list: &Option<Vec<T>>) -> &[T] {
        list.as_deref().unwrap_or_default()
    }
    spec.init_containers
        .iter()
        .flatten()
        .chain(&spec.containers)
        .map(|c| (of(&c.env), of(&c.env_from)))
        .chain(
            spec.ephemeral_containers
                .iter()
                .flatten()
                .map(|c| (of(&c.env), of(&c.env_from))),
        )
        .collect()
}

/// The two kinds an environment reads, with the words of their messages and reasons.
#[derive(Clone, Copy)]
enum Kind {
    ConfigMap,
    Secret,
}

impl Kind {
    fn word(self) -> &'static str {
        match self {
            Kind::ConfigMap => "configmap",
            Kind::Secret => "secret",
        }
    }

    /// The reason for `found` (not found / key not found / unreadable) and `optional`.
    fn reason(self, optional: bool, what: Missing) -> &'static str {
        use Missing::{Key, Object, Read};
        match (self, optional, what) {
            (Kind::ConfigMap, true, Object) => OPTIONAL_CONFIG_MAP_NOT_FOUND,
            (Kind::ConfigMap, true, Key) => OPTIONAL_CONFIG_MAP_KEY_NOT_FOUND,
            (Kind::ConfigMap, true, Read) => FAILED_TO_READ_OPTIONAL_CONFIG_MAP,
            (Kind::ConfigMap, false, Object) => MANDATORY_CONFIG_MAP_NOT_FOUND,
            (Kind::ConfigMap, false, Key) => MANDATORY_CONFIG_MAP_KEY_NOT_FOUND,
            (Kind::ConfigMap, false, Read) => FAILED_TO_READ_MANDATORY_CONFIG_MAP,
            (Kind::Secret, true, Object) => OPTIONAL_SECRET_NOT_FOUND,
            (Kind::Secret, true, Key) => OPTIONAL_SECRET_KEY_NOT_FOUND,
            (Kind::Secret, true, Read) => FAILED_TO_READ_OPTIONAL_SECRET,
            (Kind::Secret, false, Object) => MANDATORY_SECRET_NOT_FOUND,
            (Kind::Secret, false, Key) => MANDATORY_SECRET_KEY_NOT_FOUND,
            (Kind::Secret, false, Read) => FAILED_TO_READ_MANDATORY_SECRET,
        }
    }
}

#[derive(Clone, Copy)]
enum Missing {
    Object,
    Key,
    Read,
}

/// The events for the pod's environment in `namespace`, given what was found upstairs: each
/// distinct event once, in the order the library would have sent them (containers in order,
/// each one's `envFrom` then `env`). Unlike the library, which stopped at the first missing
/// mandatory reference, every one is named: the pod waits for all of them.
pub fn env_events(spec: &PodSpec, namespace: &str, upstairs: &Upstairs) -> Vec<EnvEvent> {
    let mut out: Vec<EnvEvent> = Vec::new();
    let mut push = |reason: &'static str, message: String| {
        let e = EnvEvent { reason, message };
        if !out.contains(&e) {
            out.push(e);
        }
    };
    let lookup = |kind: Kind, name: &str| match kind {
        Kind::ConfigMap => upstairs.config_maps.get(name),
        Kind::Secret => upstairs.secrets.get(name),
    };
    for (env, env_from) in containers(spec) {
        for source in env_from {
            let (kind, name, optional) = match (&source.config_map_ref, &source.secret_ref) {
                (Some(r), _) => (Kind::ConfigMap, &r.name, r.optional == Some(true)),
                (None, Some(r)) => (Kind::Secret, &r.name, r.optional == Some(true)),
                (None, None) => continue,
            };
            let word = kind.word();
            match lookup(kind, name) {
                None => {}
                Some(Found::NotFound) => push(
                    kind.reason(optional, Missing::Object),
                    format!("{word} {name:?} not found"),
                ),
                Some(Found::Unreadable) => push(
                    kind.reason(optional, Missing::Read),
                    format!("failed to read {word} {name:?}"),
                ),
                Some(Found::Keys(keys)) => {
                    let prefix = source.prefix.as_deref().unwrap_or_default();
                    let invalid: BTreeSet<String> = keys
                        .iter()
                        .map(|k| format!("{prefix}{k}"))
                        .filter(|k| !is_env_var_name(k))
                        .collect();
                    if !invalid.is_empty() {
                        let list: Vec<&str> = invalid.iter().map(String::as_str).collect();
                        push(
                            INVALID_ENVIRONMENT_VARIABLE_NAMES,
                            format!(
                                "keys [{}] from {word} {namespace}/{name} were skipped since \
                                 they are invalid as environment variable names",
                                list.join(", ")
                            ),
                        );
                    }
                }
            }
        }
        for var in env {
            let Some(from) = &var.value_from else {
                continue;
            };
            let (kind, name, key, optional) = match (&from.config_map_key_ref, &from.secret_key_ref)
            {
                (Some(r), _) => (Kind::ConfigMap, &r.name, &r.key, r.optional == Some(true)),
                (None, Some(r)) => (Kind::Secret, &r.name, &r.key, r.optional == Some(true)),
                (None, None) => continue,
            };
            let word = kind.word();
            let var = &var.name;
            // An optional variable's messages say it is skipped; a mandatory one's only what
            // is missing (the library's shapes).
            let skipping = |what: String| {
                if optional {
                    format!("skipping optional envvar {var:?}: {what}")
                } else {
                    what
                }
            };
            match lookup(kind, name) {
                None => {}
                Some(Found::NotFound) => push(
                    kind.reason(optional, Missing::Object),
                    skipping(format!("{word} {name:?} not found")),
                ),
                Some(Found::Unreadable) => push(
                    kind.reason(optional, Missing::Read),
                    skipping(format!("failed to read {word} {name:?}")),
                ),
                Some(Found::Keys(keys)) if !keys.contains(key) => push(
                    kind.reason(optional, Missing::Key),
                    skipping(format!("key {key:?} does not exist in {word} {name:?}")),
                ),
                Some(Found::Keys(_)) => {}
            }
        }
    }
    out
}

/// The library's rule for an environment variable name (a C identifier that may also hold
/// `-` and `.`): `[-._a-zA-Z][-._a-zA-Z0-9]*`.
fn is_env_var_name(name: &str) -> bool {
    let mut chars = name.chars();
    let word = |c: char| c.is_ascii_alphabetic() || matches!(c, '-' | '.' | '_');
    chars.next().is_some_and(word) && chars.all(|c| word(c) || c.is_ascii_digit())
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use serde_json::{Value, json};

    fn spec(spec: Value) -> PodSpec {
        serde_json::from_value(spec).unwrap()
    }

    fn keys(keys: &[&str]) -> Found {
        Found::Keys(keys.iter().map(|k| (*k).to_owned()).collect())
    }

    fn events(spec: &PodSpec, upstairs: &Upstairs) -> Vec<(&'static str, String)> {
        env_events(spec, "ns", upstairs)
            .into_iter()
            .map(|e| (e.reason, e.message))
            .collect()
    }

    fn upstairs(cms: &[(&str, Found)], secrets: &[(&str, Found)]) -> Upstairs {
        Upstairs {
            config_maps: cms
                .iter()
                .map(|(n, f)| ((*n).to_owned(), f.clone()))
                .collect(),
            secrets: secrets
                .iter()
                .map(|(n, f)| ((*n).to_owned(), f.clone()))
                .collect(),
        }
    }

    #[test]
    fn missing_objects_give_the_optional_or_mandatory_reason_per_reference() {
        let s = spec(json!({
            "initContainers": [{"name": "i", "envFrom": [
                {"configMapRef": {"name": "cm-gone", "optional": true}},
            ]}],
            "containers": [{"name": "c",
                "envFrom": [{"secretRef": {"name": "s-gone"}}],
                "env": [
                    {"name": "A", "valueFrom": {"configMapKeyRef": {"name": "cm-gone", "key": "k", "optional": true}}},
                    {"name": "B", "valueFrom": {"secretKeyRef": {"name": "s-opt", "key": "k", "optional": true}}},
                    {"name": "C", "valueFrom": {"configMapKeyRef": {"name": "cm-must", "key": "k"}}},
                    {"name": "D", "value": "plain"},
                ]}],
        }));
        let up = upstairs(
            &[("cm-gone", Found::NotFound), ("cm-must", Found::NotFound)],
            &[("s-gone", Found::NotFound), ("s-opt", Found::NotFound)],
        );
        assert_eq!(
            events(&s, &up),
            vec![
                (
                    OPTIONAL_CONFIG_MAP_NOT_FOUND,
                    "configmap \"cm-gone\" not found".to_owned()
                ),
                (
                    MANDATORY_SECRET_NOT_FOUND,
                    "secret \"s-gone\" not found".to_owned()
                ),
                (
                    OPTIONAL_CONFIG_MAP_NOT_FOUND,
                    "skipping optional envvar \"A\": configmap \"cm-gone\" not found".to_owned()
                ),
                (
                    OPTIONAL_SECRET_NOT_FOUND,
                    "skipping optional envvar \"B\": secret \"s-opt\" not found".to_owned()
                ),
                (
                    MANDATORY_CONFIG_MAP_NOT_FOUND,
                    "configmap \"cm-must\" not found".to_owned()
                ),
            ]
        );
    }

    #[test]
    fn keys_missing_from_existing_objects_and_unreadable_objects() {
        let s = spec(json!({"containers": [{"name": "c", "env": [
            {"name": "A", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "gone", "optional": true}}},
            {"name": "B", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "gone"}}},
            {"name": "C", "valueFrom": {"secretKeyRef": {"name": "s", "key": "gone", "optional": true}}},
            {"name": "D", "valueFrom": {"secretKeyRef": {"name": "s", "key": "gone"}}},
            {"name": "E", "valueFrom": {"secretKeyRef": {"name": "s", "key": "here"}}},
            {"name": "F", "valueFrom": {"secretKeyRef": {"name": "broken", "key": "k", "optional": true}}},
            {"name": "G", "valueFrom": {"configMapKeyRef": {"name": "broken", "key": "k"}}},
        ]}]}));
        let up = upstairs(
            &[("cm", keys(&["here"])), ("broken", Found::Unreadable)],
            &[("s", keys(&["here"])), ("broken", Found::Unreadable)],
        );
        let got = events(&s, &up);
        let reasons: Vec<&str> = got.iter().map(|(r, _)| *r).collect();
        assert_eq!(
            reasons,
            vec![
                OPTIONAL_CONFIG_MAP_KEY_NOT_FOUND,
                MANDATORY_CONFIG_MAP_KEY_NOT_FOUND,
                OPTIONAL_SECRET_KEY_NOT_FOUND,
                MANDATORY_SECRET_KEY_NOT_FOUND,
                FAILED_TO_READ_OPTIONAL_SECRET,
                FAILED_TO_READ_MANDATORY_CONFIG_MAP,
            ]
        );
        assert_eq!(
            got[0].1,
            "skipping optional envvar \"A\": key \"gone\" does not exist in configmap \"cm\""
        );
        assert_eq!(got[3].1, "key \"gone\" does not exist in secret \"s\"");
        assert_eq!(
            got[4].1,
            "skipping optional envvar \"F\": failed to read secret \"broken\""
        );
        assert_eq!(got[5].1, "failed to read configmap \"broken\"");
    }

    #[test]
    fn env_from_keys_that_are_no_variable_names_are_reported_once_sorted() {
        let s = spec(json!({"containers": [
            {"name": "a", "envFrom": [{"configMapRef": {"name": "cm"}}]},
            {"name": "b", "envFrom": [{"configMapRef": {"name": "cm"}}]},
            {"name": "c", "envFrom": [{"secretRef": {"name": "s"}, "prefix": "P_"}]},
        ]}));
        let up = upstairs(
            &[("cm", keys(&["ok", "2x", "1y", "_fine.too-"]))],
            &[("s", keys(&["2x"]))],
        );
        assert_eq!(
            events(&s, &up),
            vec![(
                INVALID_ENVIRONMENT_VARIABLE_NAMES,
                "keys [1y, 2x] from configmap ns/cm were skipped since they are invalid as \
                 environment variable names"
                    .to_owned()
            )],
            "the same event once; a prefix makes `2x` a name"
        );
    }

    #[test]
    fn nothing_missing_or_nothing_looked_up_gives_no_event() {
        let s = spec(json!({"containers": [{"name": "c",
            "envFrom": [{"configMapRef": {"name": "cm"}}],
            "env": [{"name": "A", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]}]}));
        assert_eq!(events(&s, &Upstairs::default()), vec![]);
        let up = upstairs(&[("cm", keys(&["a"]))], &[("s", keys(&["k"]))]);
        assert_eq!(events(&s, &up), vec![]);
    }

    #[test]
    fn references_of_every_container_kind_are_listed() {
        let s = spec(json!({
            "initContainers": [{"name": "i", "envFrom": [{"secretRef": {"name": "s1"}}]}],
            "containers": [{"name": "c", "env": [
                {"name": "A", "valueFrom": {"configMapKeyRef": {"name": "cm1", "key": "k"}}}]}],
            "ephemeralContainers": [{"name": "e", "envFrom": [{"configMapRef": {"name": "cm2"}}],
                "env": [{"name": "B", "valueFrom": {"secretKeyRef": {"name": "s2", "key": "k"}}}]}],
        }));
        let (cms, secrets) = env_references(&s);
        assert_eq!(cms.into_iter().collect::<Vec<_>>(), vec!["cm1", "cm2"]);
        assert_eq!(secrets.into_iter().collect::<Vec<_>>(), vec!["s1", "s2"]);
    }
}
