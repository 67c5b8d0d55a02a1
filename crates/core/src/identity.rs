//! Upper identity of offloaded pods: the Kubernetes API a pod reaches from inside is the upper
//! cluster's, as the pod it is.
//!
//! Upstairs, a pod's service-account token volumes (the projected `kube-api-access-*` volume
//! the API server adds, explicit `serviceAccountToken` projections, legacy token Secret
//! volumes) would be filled by the upper kubelet with tokens the upper cluster issued for the
//! pod. Downstairs the lower kubelet would fill them from the lower cluster. So each such
//! volume is rewritten to read one Secret of ours per pod ([`token_secret_name`]): a token per
//! distinct (audience, expiry) the pod asks for, requested from the upper cluster with
//! TokenRequest bound to the upper pod, the upper cluster's CA (`ca.crt`, from its
//! `kube-root-ca.crt`) and the namespace. The virtual node requests them before the lower pod
//! is created and again when the kubelet would ([`refresh_at`]). The containers get
//! `KUBERNETES_SERVICE_HOST`/`PORT` of the upper API server, which in-cluster configuration
//! reads ([`service_env`]).
//!
//! Everything here is a function of values; the requests and writes are the virtual node's.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{
    Container, EnvVar, KeyToPath, Pod, PodSpec, ProjectedVolumeSource, Secret, SecretProjection,
    Volume, VolumeProjection,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::jiff::{SignedDuration, Timestamp};

use crate::deps::is_service_account_token_volume;
use crate::keys::{
    self, ANNOTATION_TOKEN_POD, ANNOTATION_TOKEN_REFRESH_AT, ANNOTATION_UPPER_UID, LABEL_OWNER,
    LABEL_TOKEN_OF, owner_label_value,
};

/// Where offloaded pods reach the upper API server: `KUBERNETES_SERVICE_HOST` and
/// `KUBERNETES_SERVICE_PORT` of their containers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UpperApi {
    /// Host name or IP address.
    pub host: String,
    /// TCP port.
    pub port: u16,
}

/// Why an `--upper-api-address` cannot be used.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "upper API address {text:?}: {why} (expected host:port, [IPv6]:port, host, or an https:// URL)"
)]
pub struct UpperApiError {
    /// The text given.
    pub text: String,
    /// What is wrong with it.
    pub why: &'static str,
}

impl UpperApi {
    /// Reads `host:port`, `[IPv6]:port`, a bare host (port 443) or an `https://host[:port][/]`
    /// URL (an API server URL, as in a kubeconfig).
    pub fn parse(text: &str) -> Result<Self, UpperApiError> {
        let fail = |why| UpperApiError {
            text: text.to_owned(),
            why,
        };
        let trimmed = text.trim();
        let rest = match trimmed.split_once("://") {
            Some(("https", rest)) => rest,
            Some(_) => return Err(fail("only https reaches an API server from a pod")),
            None => trimmed,
        };
        let authority = rest.split('/').next().unwrap_or_default();
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let (host, after) = v6.split_once(']').ok_or_else(|| fail("unclosed '['"))?;
            match after {
                "" => (host, None),
                _ => (
                    host,
                    Some(
                        after
                            .strip_prefix(':')
                            .ok_or_else(|| fail("junk after ']'"))?,
                    ),
                ),
            }
        } else {
            match authority.rsplit_once(':') {
                Some((host, _)) if host.contains(':') => {
                    return Err(fail("an IPv6 address needs brackets: [addr]:port"));
                }
                Some((host, port)) => (host, Some(port)),
                None => (authority, None),
            }
        };
        if host.is_empty() {
            return Err(fail("no host"));
        }
        let port = match port {
            None => 443,
            Some(p) => p
                .parse::<u16>()
                .ok()
                .filter(|p| *p != 0)
                .ok_or_else(|| fail("the port is not a number from 1 to 65535"))?,
        };
        Ok(UpperApi {
            host: host.to_owned(),
            port,
        })
    }
}

/// What the API server sets a projected token's `expirationSeconds` to when the pod names none.
pub const DEFAULT_EXPIRATION_SECONDS: i64 = 3600;
/// What the ServiceAccount admission asks for in `kube-api-access-*` volumes, and what we ask
/// for a legacy token Secret volume.
pub const KUBE_API_ACCESS_EXPIRATION_SECONDS: i64 = 3607;
/// The kubelet replaces a token older than this, whatever its expiry (`maxTTL` of its token
/// manager), and so do we.
pub const MAX_TOKEN_AGE: SignedDuration = SignedDuration::from_hours(24);
/// Keys of [`token_secret_name`] besides the tokens.
pub const KEY_CA: &str = "ca.crt";
/// The namespace file of a legacy token Secret.
pub const KEY_NAMESPACE: &str = "namespace";

/// One token a pod needs: the TokenRequest to make and the key of our Secret that holds it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct TokenNeed {
    /// The audience asked for; `None` is the API server's own.
    pub audience: Option<String>,
    /// `expirationSeconds` asked for.
    pub expiration_seconds: i64,
    /// Key in our Secret (`token-0`, `token-1`, ... in the order of this list).
    pub key: String,
}

/// The name of our lower Secret holding the upper credentials of the pod with `upper_uid`.
pub fn token_secret_name(upper_uid: &str) -> String {
    format!("tensile-token-{upper_uid}")
}

fn is_kube_api_access(volume: &Volume) -> bool {
    volume.projected.is_some() && volume.name.starts_with(keys::VOLUME_PREFIX_KUBE_API_ACCESS)
}

/// The (audience, expiry) of every token the volumes of `spec` carry, in volume order.
fn token_requests(spec: &PodSpec) -> Vec<(Option<String>, i64)> {
    let mut out = Vec::new();
    for volume in spec.volumes.iter().flatten() {
        if let Some(projected) = &volume.projected {
            for token in projected
                .sources
                .iter()
                .flatten()
                .filter_map(|s| s.service_account_token.as_ref())
            {
                out.push((
                    token.audience.clone().filter(|a| !a.is_empty()),
                    token
                        .expiration_seconds
                        .unwrap_or(DEFAULT_EXPIRATION_SECONDS),
                ));
            }
        } else if volume.secret.is_some() && is_service_account_token_volume(volume, spec) {
            out.push((None, KUBE_API_ACCESS_EXPIRATION_SECONDS));
        }
    }
    out
}

/// The tokens the lower copy of a pod with `spec` needs: one per distinct (audience, expiry),
/// sorted; empty when the pod mounts no service-account token.
pub fn token_needs(spec: &PodSpec) -> Vec<TokenNeed> {
    let distinct: BTreeSet<(Option<String>, i64)> = token_requests(spec).into_iter().collect();
    distinct
        .into_iter()
        .enumerate()
        .map(|(i, (audience, expiration_seconds))| TokenNeed {
            audience,
            expiration_seconds,
            key: format!("token-{i}"),
        })
        .collect()
}

fn key_of<'a>(needs: &'a [TokenNeed], audience: Option<&str>, seconds: i64) -> Option<&'a str> {
    needs
        .iter()
        .find(|n| n.audience.as_deref() == audience && n.expiration_seconds == seconds)
        .map(|n| n.key.as_str())
}

/// Rewrites the token volumes of a lower pod spec to read Secret `secret` (holding `needs`): in
/// projected volumes, each `serviceAccountToken` source becomes that Secret's token at the same
/// path, and in `kube-api-access-*` volumes the `kube-root-ca.crt` ConfigMap (the lower
/// cluster's CA downstairs) becomes its `ca.crt`; a legacy token Secret volume reads our Secret
/// instead, with its own items and mode. Volume names and mounts stay as they are, so the lower
/// ServiceAccount admission sees a token volume in place and adds none of its own.
pub(crate) fn rewrite_token_volumes(spec: &mut PodSpec, secret: &str, needs: &[TokenNeed]) {
    let legacy: BTreeSet<String> = spec
        .volumes
        .iter()
        .flatten()
        .filter(|v| v.secret.is_some() && is_service_account_token_volume(v, spec))
        .map(|v| v.name.clone())
        .collect();
    for volume in spec.volumes.iter_mut().flatten() {
        if legacy.contains(&volume.name) {
            if let Some(source) = volume.secret.as_mut() {
                source.secret_name = Some(secret.to_owned());
            }
            continue;
        }
        let api_access = is_kube_api_access(volume);
        let Some(projected) = volume.projected.as_mut() else {
            continue;
        };
        rewrite_projection(projected, api_access, secret, needs);
    }
}

fn rewrite_projection(
    projected: &mut ProjectedVolumeSource,
    api_access: bool,
    secret: &str,
    needs: &[TokenNeed],
) {
    for source in projected.sources.iter_mut().flatten() {
        let items = if let Some(token) = &source.service_account_token {
            let seconds = token
                .expiration_seconds
                .unwrap_or(DEFAULT_EXPIRATION_SECONDS);
            let audience = token.audience.as_deref().filter(|a| !a.is_empty());
            let Some(key) = key_of(needs, audience, seconds) else {
                continue;
            };
            vec![KeyToPath {
                key: key.to_owned(),
                path: token.path.clone(),
                mode: None,
            }]
        } else if let Some(cm) = source
            .config_map
            .as_ref()
            .filter(|cm| api_access && cm.name == keys::CONFIG_MAP_KUBE_ROOT_CA)
        {
            match &cm.items {
                Some(items) => items.iter().filter(|i| i.key == KEY_CA).cloned().collect(),
                None => vec![KeyToPath {
                    key: KEY_CA.to_owned(),
                    path: KEY_CA.to_owned(),
                    mode: None,
                }],
            }
        } else {
            continue;
        };
        *source = VolumeProjection {
            secret: Some(SecretProjection {
                name: secret.to_owned(),
                items: Some(items),
                optional: None,
            }),
            ..VolumeProjection::default()
        };
    }
}

/// The names of the environment variables [`service_env`] sets.
pub const SERVICE_ENV_NAMES: [&str; 4] = [
    "KUBERNETES_SERVICE_HOST",
    "KUBERNETES_SERVICE_PORT",
    "KUBERNETES_SERVICE_PORT_HTTPS",
    "KUBERNETES_PORT",
];

/// The `kubernetes` Service variables of the upper API server at `api`, as a kubelet makes
/// them for a Service named `kubernetes` with port `https`.
pub fn service_env(api: &UpperApi) -> Vec<EnvVar> {
    let host = if api.host.contains(':') {
        format!("[{}]", api.host)
    } else {
        api.host.clone()
    };
    let values = [
        api.host.clone(),
        api.port.to_string(),
        api.port.to_string(),
        format!("tcp://{host}:{}", api.port),
    ];
    SERVICE_ENV_NAMES
        .iter()
        .zip(values)
        .map(|(name, value)| EnvVar {
            name: (*name).to_owned(),
            value: Some(value),
            value_from: None,
        })
        .collect()
}

/// A container env with [`service_env`] in front (the kubelet puts its Service variables before
/// the container's own, which may refer to them and win over them): entries the container sets
/// itself are left to it.
pub(crate) fn with_service_env(env: Option<Vec<EnvVar>>, api: &UpperApi) -> Option<Vec<EnvVar>> {
    let own = env.unwrap_or_default();
    let mut out: Vec<EnvVar> = service_env(api)
        .into_iter()
        .filter(|v| !own.iter().any(|o| o.name == v.name))
        .collect();
    out.extend(own);
    Some(out)
}

/// Sets [`with_service_env`] on every container, init container included.
pub(crate) fn add_service_env(spec: &mut PodSpec, api: &UpperApi) {
    let containers = spec
        .containers
        .iter_mut()
        .chain(spec.init_containers.iter_mut().flatten());
    for c in containers {
        add_container_service_env(c, api);
    }
}

/// [`with_service_env`] for one container.
pub(crate) fn add_container_service_env(c: &mut Container, api: &UpperApi) {
    c.env = with_service_env(c.env.take(), api);
}

/// When a token issued at `issued`, expiring at `expires`, asked for `expiration_seconds`, is to
/// be replaced: as the kubelet does, 20% of the lifetime asked for before it expires, or once it
/// is a day old, whichever comes first. (An API server may extend a `kube-api-access` token to a
/// year; it is still replaced daily.)
pub fn refresh_at(issued: Timestamp, expires: Timestamp, expiration_seconds: i64) -> Timestamp {
    let asked = SignedDuration::from_secs(expiration_seconds.max(0));
    let by_age = issued.checked_add(MAX_TOKEN_AGE).unwrap_or(expires);
    let by_lifetime = expires
        .checked_sub(asked / 5)
        .unwrap_or(Timestamp::UNIX_EPOCH);
    by_age.min(by_lifetime)
}

/// A token the upper cluster issued for one [`TokenNeed`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IssuedToken {
    /// Its key in our Secret.
    pub key: String,
    /// The token.
    pub token: String,
    /// When it was obtained.
    pub issued: Timestamp,
    /// `status.expirationTimestamp` of the TokenRequest.
    pub expires: Timestamp,
    /// `expirationSeconds` asked for.
    pub expiration_seconds: i64,
}

/// Why our token Secret cannot be made for a pod.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum TokenSecretError {
    /// The upper pod has no UID, name or namespace (never so for a pod read from an API server).
    #[error("pod has no {0}")]
    MissingMetadata(&'static str),
}

/// The lower pod a token Secret belongs to: the Secret is garbage-collected with it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LowerPodRef<'a> {
    /// Its name (the upper pod's).
    pub name: &'a str,
    /// Its UID in the lower cluster.
    pub uid: &'a str,
}

impl LowerPodRef<'_> {
    /// The owner reference naming it.
    pub fn owner_reference(&self) -> OwnerReference {
        OwnerReference {
            api_version: "v1".to_owned(),
            kind: "Pod".to_owned(),
            name: self.name.to_owned(),
            uid: self.uid.to_owned(),
            ..OwnerReference::default()
        }
    }
}

/// Whether `secret` names `pod` among its owners.
fn owned_by_pod(secret: &Secret, pod: LowerPodRef<'_>) -> bool {
    secret
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|r| r.kind == "Pod" && r.uid == pod.uid)
}

/// Our lower Secret for `upper` holding `tokens`, `ca_crt` (the upper cluster's CA bundle) and
/// the namespace: owned by `owner`, labelled with the pod's UID, annotated with its name and
/// when the earliest token is due for refresh, and owned by the lower pod once it exists (the
/// Secret is made before it, so the pod's volume is there when the kubelet mounts it).
pub fn token_secret(
    upper: &Pod,
    owner: &str,
    tokens: &[IssuedToken],
    ca_crt: &str,
    lower: Option<LowerPodRef<'_>>,
) -> Result<Secret, TokenSecretError> {
    let meta = &upper.metadata;
    let uid = meta
        .uid
        .as_deref()
        .ok_or(TokenSecretError::MissingMetadata("uid"))?;
    let name = meta
        .name
        .as_deref()
        .ok_or(TokenSecretError::MissingMetadata("name"))?;
    let namespace = meta
        .namespace
        .as_deref()
        .ok_or(TokenSecretError::MissingMetadata("namespace"))?;
    let refresh = tokens
        .iter()
        .map(|t| refresh_at(t.issued, t.expires, t.expiration_seconds))
        .min();
    let mut data: BTreeMap<String, ByteString> = tokens
        .iter()
        .map(|t| (t.key.clone(), ByteString(t.token.clone().into_bytes())))
        .collect();
    data.insert(KEY_CA.to_owned(), ByteString(ca_crt.as_bytes().to_vec()));
    data.insert(
        KEY_NAMESPACE.to_owned(),
        ByteString(namespace.as_bytes().to_vec()),
    );
    let mut annotations = BTreeMap::from([
        (ANNOTATION_TOKEN_POD.to_owned(), name.to_owned()),
        (ANNOTATION_UPPER_UID.to_owned(), uid.to_owned()),
    ]);
    if let Some(at) = refresh {
        annotations.insert(ANNOTATION_TOKEN_REFRESH_AT.to_owned(), at.to_string());
    }
    Ok(Secret {
        metadata: ObjectMeta {
            name: Some(token_secret_name(uid)),
            namespace: Some(namespace.to_owned()),
            labels: Some(BTreeMap::from([
                (LABEL_OWNER.to_owned(), owner_label_value(owner)),
                (LABEL_TOKEN_OF.to_owned(), uid.to_owned()),
            ])),
            annotations: Some(annotations),
            owner_references: lower.map(|l| vec![l.owner_reference()]),
            ..ObjectMeta::default()
        },
        type_: Some("Opaque".to_owned()),
        data: Some(data),
        ..Secret::default()
    })
}

/// What to do about the token Secret of a pod whose lower copy exists.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TokenStep {
    /// The pod mounts no token: nothing.
    None,
    /// Request the tokens and write the Secret (missing, lacking a token, or due).
    Write,
    /// The tokens are current but the Secret is not owned by the lower pod yet: add the owner
    /// reference, then look again at this time.
    Own(Timestamp),
    /// All is current; look again at this time.
    RecheckAt(Timestamp),
}

impl TokenStep {
    /// When to look again, for the steps that leave the tokens as they are.
    pub fn recheck_time(&self) -> Option<Timestamp> {
        match self {
            TokenStep::Own(at) | TokenStep::RecheckAt(at) => Some(*at),
            TokenStep::None | TokenStep::Write => None,
        }
    }
}

/// The [`TokenStep`] for `upper` given our current Secret for it (`None`: there is none) and
/// its lower pod, if that exists yet.
pub fn token_step(
    upper: &Pod,
    secret: Option<&Secret>,
    lower: Option<LowerPodRef<'_>>,
    now: Timestamp,
) -> TokenStep {
    let needs = upper.spec.as_ref().map(token_needs).unwrap_or_default();
    if needs.is_empty() {
        return TokenStep::None;
    }
    let Some(secret) = secret else {
        return TokenStep::Write;
    };
    let has_all = needs
        .iter()
        .map(|n| n.key.as_str())
        .chain([KEY_CA])
        .all(|k| secret.data.as_ref().is_some_and(|d| d.contains_key(k)));
    let due = secret
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_TOKEN_REFRESH_AT))
        .and_then(|t| t.parse::<Timestamp>().ok());
    match due {
        Some(at) if has_all && at > now => match lower {
            Some(pod) if !owned_by_pod(secret, pod) => TokenStep::Own(at),
            _ => TokenStep::RecheckAt(at),
        },
        _ => TokenStep::Write,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    fn pod(spec: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "shop", "uid": "u-1"},
            "spec": spec,
        }))
        .unwrap()
    }

    fn api_access_spec() -> serde_json::Value {
        json!({
            "containers": [{"name": "c", "image": "i", "volumeMounts": [
                {"name": "kube-api-access-x1", "mountPath": keys::SERVICE_ACCOUNT_MOUNT_PATH, "readOnly": true}]}],
            "volumes": [{"name": "kube-api-access-x1", "projected": {"defaultMode": 420, "sources": [
                {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}
            ]}}]
        })
    }

    #[test]
    fn the_default_volume_needs_one_token_of_the_api_servers_audience() {
        let p = pod(api_access_spec());
        assert_eq!(
            token_needs(p.spec.as_ref().unwrap()),
            vec![TokenNeed {
                audience: None,
                expiration_seconds: 3607,
                key: "token-0".into()
            }]
        );
    }

    #[test]
    fn distinct_audiences_and_expiries_get_one_key_each_and_repeats_share() {
        let p = pod(json!({
            "containers": [{"name": "c", "image": "i"}],
            "volumes": [
                {"name": "vault", "projected": {"sources": [
                    {"serviceAccountToken": {"path": "vault-token", "audience": "vault"}},
                    {"serviceAccountToken": {"path": "again", "audience": "vault", "expirationSeconds": 3600}},
                    {"serviceAccountToken": {"path": "short", "audience": "vault", "expirationSeconds": 600}},
                ]}},
                {"name": "data", "configMap": {"name": "d"}},
            ]
        }));
        let needs = token_needs(p.spec.as_ref().unwrap());
        let pairs: Vec<_> = needs
            .iter()
            .map(|n| (n.audience.as_deref(), n.expiration_seconds, n.key.as_str()))
            .collect();
        assert_eq!(
            pairs,
            vec![
                (Some("vault"), 600, "token-0"),
                (Some("vault"), 3600, "token-1")
            ]
        );
        assert!(token_needs(&pod(json!({"containers": [{"name": "c"}]})).spec.unwrap()).is_empty());
    }

    #[test]
    fn projected_tokens_and_the_root_ca_read_our_secret_and_the_rest_is_kept() {
        let mut spec = pod(api_access_spec()).spec.unwrap();
        let needs = token_needs(&spec);
        rewrite_token_volumes(&mut spec, "tensile-token-u-1", &needs);
        let volume = serde_json::to_value(&spec.volumes.as_ref().unwrap()[0]).unwrap();
        assert_eq!(
            volume,
            json!({"name": "kube-api-access-x1", "projected": {"defaultMode": 420, "sources": [
                {"secret": {"name": "tensile-token-u-1", "items": [{"key": "token-0", "path": "token"}]}},
                {"secret": {"name": "tensile-token-u-1", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}
            ]}})
        );
        // The mount is untouched: same volume name, same path.
        assert_eq!(
            spec.containers[0].volume_mounts.as_ref().unwrap()[0].name,
            "kube-api-access-x1"
        );
    }

    #[test]
    fn a_users_own_kube_root_ca_projection_outside_the_token_volume_is_kept() {
        let mut spec = pod(json!({
            "containers": [{"name": "c"}],
            "volumes": [{"name": "mine", "projected": {"sources": [
                {"configMap": {"name": "kube-root-ca.crt"}},
                {"serviceAccountToken": {"path": "t", "audience": "a"}}
            ]}}]
        }))
        .spec
        .unwrap();
        let needs = token_needs(&spec);
        rewrite_token_volumes(&mut spec, "s", &needs);
        let sources = serde_json::to_value(
            &spec.volumes.as_ref().unwrap()[0]
                .projected
                .as_ref()
                .unwrap()
                .sources,
        )
        .unwrap();
        assert_eq!(
            sources,
            json!([
                {"configMap": {"name": "kube-root-ca.crt"}},
                {"secret": {"name": "s", "items": [{"key": "token-0", "path": "t"}]}}
            ])
        );
    }

    #[test]
    fn a_legacy_token_secret_volume_reads_our_secret_with_its_own_items() {
        let mut spec = pod(json!({
            "containers": [{"name": "c", "volumeMounts": [{"name": "default-token-abc", "mountPath": keys::SERVICE_ACCOUNT_MOUNT_PATH}]}],
            "volumes": [{"name": "default-token-abc", "secret": {"secretName": "default-token-abc", "defaultMode": 420}}]
        }))
        .spec
        .unwrap();
        let needs = token_needs(&spec);
        assert_eq!(needs[0].expiration_seconds, 3607);
        rewrite_token_volumes(&mut spec, "tensile-token-u-1", &needs);
        let secret = spec.volumes.as_ref().unwrap()[0].secret.as_ref().unwrap();
        assert_eq!(secret.secret_name.as_deref(), Some("tensile-token-u-1"));
        assert_eq!(secret.default_mode, Some(420));
    }

    #[test]
    fn service_env_comes_first_and_the_containers_own_values_win() {
        let api = UpperApi {
            host: "10.0.0.9".into(),
            port: 6443,
        };
        let own = vec![
            EnvVar {
                name: "KUBERNETES_SERVICE_HOST".into(),
                value: Some("custom".into()),
                value_from: None,
            },
            EnvVar {
                name: "URL".into(),
                value: Some("https://$(KUBERNETES_SERVICE_HOST)".into()),
                value_from: None,
            },
        ];
        let env = with_service_env(Some(own), &api).unwrap();
        let pairs: Vec<_> = env
            .iter()
            .map(|v| (v.name.as_str(), v.value.as_deref().unwrap()))
            .collect();
        assert_eq!(
            pairs,
            vec![
                ("KUBERNETES_SERVICE_PORT", "6443"),
                ("KUBERNETES_SERVICE_PORT_HTTPS", "6443"),
                ("KUBERNETES_PORT", "tcp://10.0.0.9:6443"),
                ("KUBERNETES_SERVICE_HOST", "custom"),
                ("URL", "https://$(KUBERNETES_SERVICE_HOST)"),
            ]
        );
        let v6 = service_env(&UpperApi {
            host: "fd00::1".into(),
            port: 443,
        });
        assert_eq!(v6[3].value.as_deref(), Some("tcp://[fd00::1]:443"));
    }

    #[test]
    fn upper_api_addresses_are_read_in_every_usual_form() {
        let ok = |t: &str| {
            let a = UpperApi::parse(t).unwrap();
            (a.host, a.port)
        };
        assert_eq!(ok("10.0.0.1:6443"), ("10.0.0.1".into(), 6443));
        assert_eq!(ok("api.example"), ("api.example".into(), 443));
        assert_eq!(
            ok("https://api.example:8443/"),
            ("api.example".into(), 8443)
        );
        assert_eq!(ok("[fd00::1]:6443"), ("fd00::1".into(), 6443));
        assert_eq!(ok("[fd00::1]"), ("fd00::1".into(), 443));
        for bad in [
            "http://a:80",
            "fd00::1:443",
            "a:0",
            "a:http",
            ":443",
            "[fd00::1",
            "",
        ] {
            assert!(UpperApi::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(
            UpperApi::parse("a:x").unwrap_err().to_string(),
            "upper API address \"a:x\": the port is not a number from 1 to 65535 (expected host:port, [IPv6]:port, host, or an https:// URL)"
        );
    }

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn tokens_are_refreshed_at_80_percent_of_their_life_or_after_a_day() {
        let t0 = ts("2026-01-01T00:00:00Z");
        // One hour asked, one hour given: at 48 minutes.
        assert_eq!(
            refresh_at(t0, ts("2026-01-01T01:00:00Z"), 3600),
            ts("2026-01-01T00:48:00Z")
        );
        // The API server extended a 3607 s request to a year: after a day.
        assert_eq!(
            refresh_at(t0, ts("2027-01-01T00:00:00Z"), 3607),
            ts("2026-01-02T00:00:00Z")
        );
        // Two days asked: the day wins.
        assert_eq!(
            refresh_at(t0, ts("2026-01-03T00:00:00Z"), 2 * 86400),
            ts("2026-01-02T00:00:00Z")
        );
    }

    fn issued(key: &str, expires: &str, seconds: i64) -> IssuedToken {
        IssuedToken {
            key: key.into(),
            token: format!("jwt-{key}"),
            issued: ts("2026-01-01T00:00:00Z"),
            expires: ts(expires),
            expiration_seconds: seconds,
        }
    }

    #[test]
    fn the_secret_carries_our_marks_the_tokens_the_ca_and_the_earliest_refresh() {
        let p = pod(api_access_spec());
        let s = token_secret(
            &p,
            "vk-1",
            &[
                issued("token-0", "2026-01-01T01:00:00Z", 3600),
                issued("token-1", "2026-01-01T00:10:00Z", 600),
            ],
            "PEM",
            None,
        )
        .unwrap();
        assert_eq!(s.metadata.name.as_deref(), Some("tensile-token-u-1"));
        assert!(s.metadata.owner_references.is_none());
        assert_eq!(s.metadata.namespace.as_deref(), Some("shop"));
        let labels = s.metadata.labels.as_ref().unwrap();
        assert_eq!(labels[LABEL_OWNER], owner_label_value("vk-1"));
        assert_eq!(labels[LABEL_TOKEN_OF], "u-1");
        let annotations = s.metadata.annotations.as_ref().unwrap();
        assert_eq!(annotations[ANNOTATION_TOKEN_POD], "web");
        assert_eq!(
            annotations[ANNOTATION_TOKEN_REFRESH_AT],
            "2026-01-01T00:08:00Z"
        );
        let data = s.data.as_ref().unwrap();
        assert_eq!(data["token-1"].0, b"jwt-token-1");
        assert_eq!(data["ca.crt"].0, b"PEM");
        assert_eq!(data["namespace"].0, b"shop");
        let mut nameless = p.clone();
        nameless.metadata.uid = None;
        assert_eq!(
            token_secret(&nameless, "vk-1", &[], "PEM", None).unwrap_err(),
            TokenSecretError::MissingMetadata("uid")
        );
    }

    #[test]
    fn a_secret_is_written_when_missing_incomplete_or_due_owned_then_rechecked() {
        let p = pod(api_access_spec());
        let now = ts("2026-01-01T00:30:00Z");
        let lower = LowerPodRef {
            name: "web",
            uid: "lower-1",
        };
        assert_eq!(token_step(&p, None, None, now), TokenStep::Write);
        let tokens = [issued("token-0", "2026-01-01T01:00:00Z", 3600)];
        let fresh = token_secret(&p, "vk-1", &tokens, "PEM", None).unwrap();
        let due = ts("2026-01-01T00:48:00Z");
        assert_eq!(
            token_step(&p, Some(&fresh), None, now),
            TokenStep::RecheckAt(due)
        );
        assert_eq!(
            token_step(&p, Some(&fresh), Some(lower), now),
            TokenStep::Own(due)
        );
        let owned = token_secret(&p, "vk-1", &tokens, "PEM", Some(lower)).unwrap();
        assert_eq!(
            owned.metadata.owner_references.as_ref().unwrap()[0].uid,
            "lower-1"
        );
        assert_eq!(
            token_step(&p, Some(&owned), Some(lower), now),
            TokenStep::RecheckAt(due)
        );
        assert_eq!(
            token_step(&p, Some(&owned), Some(lower), due),
            TokenStep::Write
        );
        let mut incomplete = owned.clone();
        incomplete.data.as_mut().unwrap().remove("token-0");
        assert_eq!(
            token_step(&p, Some(&incomplete), Some(lower), now),
            TokenStep::Write
        );
        let mut unreadable = owned;
        unreadable
            .metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(ANNOTATION_TOKEN_REFRESH_AT.into(), "soon".into());
        assert_eq!(
            token_step(&p, Some(&unreadable), Some(lower), now),
            TokenStep::Write
        );
        let no_token = pod(json!({"containers": [{"name": "c"}]}));
        assert_eq!(token_step(&no_token, None, None, now), TokenStep::None);
    }
}
