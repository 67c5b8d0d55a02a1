//! Upper identity of offloaded pods: the Kubernetes API a pod reaches from inside is the upper
//! cluster's, as the pod it is.
//!
//! Upstairs, a pod's service-account token volumes (the projected `kube-api-access-*` volume
//! the API server adds, explicit `serviceAccountToken` projections, legacy token Secret
//! volumes) would be filled by the upper kubelet with tokens the upper cluster issued for the
//! pod. Downstairs the lower kubelet would fill them from the lower cluster. So each such
//! volume is rewritten to read one Secret of ours per pod ([`identity_secret_name`]): a token per
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
    Container, DownwardAPIProjection, DownwardAPIVolumeSource, EnvVar, KeyToPath, Pod, PodSpec,
    ProjectedVolumeSource, Secret, SecretProjection, Volume, VolumeProjection,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::{SignedDuration, Timestamp};

use crate::deps::is_service_account_token_volume;
use crate::keys::{
    self, ANNOTATION_TOKEN_POD, ANNOTATION_TOKEN_REFRESH_AT, ANNOTATION_UPPER_UID,
    LABEL_IDENTITY_OF, LABEL_OWNER, owner_label_value,
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
/// The shortest `expirationSeconds` kube-apiserver's validation lets a pod's projected token ask
/// for (10 minutes); a pod asking for less is refused.
pub const MIN_EXPIRATION_SECONDS: i64 = 600;
/// The kubelet replaces a token older than this, whatever its expiry (`maxTTL` of its token
/// manager), and so do we.
pub const MAX_TOKEN_AGE: SignedDuration = SignedDuration::from_hours(24);
/// Keys of the tokens in [`identity_secret_name`]: `token-0`, `token-1`, ...
pub const TOKEN_KEY_PREFIX: &str = "token-";
/// Keys of [`identity_secret_name`] besides the tokens.
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
pub fn identity_secret_name(upper_uid: &str) -> String {
    format!("tensile-identity-{upper_uid}")
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
            key: format!("{TOKEN_KEY_PREFIX}{i}"),
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

/// When a pod's token is replaced: at the pod's own slot, at most a fiftieth of an interval
/// after [`refresh_at`].
///
/// At the kubelet's time alone, the pods created in one burst come due together again every
/// refresh interval, forever: a herd of TokenRequests upstairs and Secret writes downstairs that
/// repeats the burst. So each pod has slots one refresh interval apart (80% of the token's life
/// rounded to the minute, or a day), phased by its UID, and a token is replaced at the last
/// slot before the kubelet's time. A new pod's first refresh comes somewhere in its first
/// interval, each later one an interval after the previous: the refreshes of all pods spread
/// evenly over time whenever the pods were made, and a restart, which reads the time from our
/// Secret, moves none of them. When the slot would come before the token was issued (a server
/// that cut the life short), the kubelet's time stands.
///
/// The life is measured from our clock before the request to the server's expiry, which it
/// writes in whole seconds: a 600 s token seems to live a little under or over 600 s, by a
/// different amount each time. Hence the rounding (an interval of 479 s one time and 480 s the
/// next moved the phase, and tokens were replaced at random within the interval, twice as often
/// as due) and the slack past the kubelet's time (a token asked for at its slot would otherwise
/// often be due a moment before the next slot, and be replaced at the slot before it).
pub fn refresh_slot(
    uid: &str,
    issued: Timestamp,
    expires: Timestamp,
    expiration_seconds: i64,
) -> Timestamp {
    let latest = refresh_at(issued, expires, expiration_seconds);
    let minutes = (expires.duration_since(issued).as_secs() + 30) / 60;
    let life = SignedDuration::from_mins(minutes);
    let interval = (life * 4 / 5).min(MAX_TOKEN_AGE).as_millis();
    let Ok(interval) = i64::try_from(interval) else {
        return latest;
    };
    if interval <= 0 {
        return latest;
    }
    let phase = i64::try_from(crate::keys::stable_hash(uid.as_bytes()) % interval.unsigned_abs())
        .unwrap_or_default();
    let end = latest.as_millisecond() + interval / 50;
    let slot = end - (end - phase).rem_euclid(interval);
    match Timestamp::from_millisecond(slot) {
        Ok(slot) if slot > issued => slot,
        _ => latest,
    }
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

/// Whether our identity Secret `secret` is still needed: the lower pod that mounts it exists
/// (even while it terminates), or its upper pod exists, is not finished and is not being
/// deleted (its lower pod is about to be made, or made again).
///
/// The virtual node deletes the Secret itself once this is false. An owner reference to the
/// lower pod would let the lower garbage collector do it, but costs a third lower write per
/// pod (the Secret is made before the pod, so the reference is only known after).
pub fn identity_secret_needed(secret: &Secret, upper: Option<&Pod>, lower: Option<&Pod>) -> bool {
    let Some(of) = secret
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(LABEL_IDENTITY_OF))
    else {
        return false;
    };
    let mounted = lower.is_some_and(|l| {
        l.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ANNOTATION_UPPER_UID))
            == Some(of)
    });
    let wanted = upper.is_some_and(|u| {
        u.metadata.uid.as_ref() == Some(of)
            && u.metadata.deletion_timestamp.is_none()
            && !matches!(
                u.status.as_ref().and_then(|s| s.phase.as_deref()),
                Some("Succeeded" | "Failed")
            )
    });
    mounted || wanted
}

/// The tokens an identity Secret is written with.
#[derive(Clone, Copy, Debug)]
pub enum Tokens<'a> {
    /// Newly issued ones, with the upper CA bundle.
    Fresh(&'a [IssuedToken], &'a str),
    /// Those of the current Secret, still good: only its refresh time is written again; the
    /// tokens and CA are left out, and the merge patch that writes a Secret of this kind leaves
    /// them as they are downstairs (so the cache need not hold them: [`without_token_values`]).
    Kept(&'a Secret),
    /// The pod mounts no token.
    None,
}

/// Our lower Secret for `upper`: its `tokens` (with the CA and the namespace) and the values of
/// its pinned downward API items (`downward`, see [`downward_pins`]); owned by `owner`,
/// labelled with the pod's UID, annotated with its name and when the earliest token is due for
/// refresh. It is made before the lower pod, so the pod's volumes are there when the kubelet
/// mounts them, and deleted when [`identity_secret_needed`] says so.
pub fn identity_secret(
    upper: &Pod,
    owner: &str,
    tokens: Tokens<'_>,
    downward: &[DownwardPin],
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
    let mut data: BTreeMap<String, ByteString> = BTreeMap::new();
    let mut annotations = BTreeMap::from([
        (ANNOTATION_TOKEN_POD.to_owned(), name.to_owned()),
        (ANNOTATION_UPPER_UID.to_owned(), uid.to_owned()),
    ]);
    let mut refresh = None;
    match tokens {
        Tokens::Fresh(issued, ca_crt) => {
            refresh = issued
                .iter()
                .map(|t| refresh_slot(uid, t.issued, t.expires, t.expiration_seconds))
                .min()
                .map(|t| t.to_string());
            data.extend(
                issued
                    .iter()
                    .map(|t| (t.key.clone(), ByteString(t.token.clone().into_bytes()))),
            );
            data.insert(KEY_CA.to_owned(), ByteString(ca_crt.as_bytes().to_vec()));
        }
        Tokens::Kept(current) => {
            refresh = current
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(ANNOTATION_TOKEN_REFRESH_AT))
                .cloned();
        }
        Tokens::None => {}
    }
    if let Some(at) = refresh {
        annotations.insert(ANNOTATION_TOKEN_REFRESH_AT.to_owned(), at);
    }
    data.insert(
        KEY_NAMESPACE.to_owned(),
        ByteString(namespace.as_bytes().to_vec()),
    );
    data.extend(
        downward
            .iter()
            .map(|p| (p.key.clone(), ByteString(p.value.clone().into_bytes()))),
    );
    Ok(Secret {
        metadata: ObjectMeta {
            name: Some(identity_secret_name(uid)),
            namespace: Some(namespace.to_owned()),
            labels: Some(BTreeMap::from([
                (LABEL_OWNER.to_owned(), owner_label_value(owner)),
                (LABEL_IDENTITY_OF.to_owned(), uid.to_owned()),
            ])),
            annotations: Some(annotations),
            ..ObjectMeta::default()
        },
        type_: Some("Opaque".to_owned()),
        data: Some(data),
        ..Secret::default()
    })
}

/// Our identity Secret as the virtual node keeps it in memory: the tokens' and the CA's
/// values emptied, their keys kept. Every decision ([`identity_step`],
/// [`identity_secret_needed`]) reads only which keys are there, the annotations and the
/// downward values; a token is a kilobyte or two of signature that compresses to nothing, one
/// per offloaded pod, and the CA is the same kilobyte in every Secret.
pub fn without_token_values(mut secret: Secret) -> Secret {
    for (k, v) in secret.data.iter_mut().flatten() {
        if k.starts_with(TOKEN_KEY_PREFIX) || k == KEY_CA {
            v.0 = Vec::new();
        }
    }
    secret
}

/// What to do about the identity Secret of a pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IdentityStep {
    /// The pod needs none: nothing.
    None,
    /// Write the Secret: missing, a token lacking or due (`tokens`: request new ones), or a
    /// pinned downward API value changed upstairs (labels, annotations).
    Write {
        /// Request new tokens (else the current ones are kept).
        tokens: bool,
    },
    /// All is current; look again at the refresh time, if there is one.
    RecheckAt(Option<Timestamp>),
}

impl IdentityStep {
    /// When to look again, for the steps that leave the tokens as they are.
    pub fn recheck_time(&self) -> Option<Timestamp> {
        match self {
            IdentityStep::RecheckAt(at) => *at,
            IdentityStep::None | IdentityStep::Write { .. } => None,
        }
    }
}

/// The [`IdentityStep`] for `upper` (whose pinned downward items are `downward`) given our
/// current Secret for it (`None`: there is none).
pub fn identity_step(
    upper: &Pod,
    downward: &[DownwardPin],
    secret: Option<&Secret>,
    now: Timestamp,
) -> IdentityStep {
    let needs = upper.spec.as_ref().map(token_needs).unwrap_or_default();
    if needs.is_empty() && downward.is_empty() {
        return IdentityStep::None;
    }
    let Some(secret) = secret else {
        return IdentityStep::Write {
            tokens: !needs.is_empty(),
        };
    };
    let data = secret.data.as_ref();
    let has = |k: &str| data.is_some_and(|d| d.contains_key(k));
    let due = secret
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_TOKEN_REFRESH_AT))
        .and_then(|t| t.parse::<Timestamp>().ok());
    let tokens_good = needs.is_empty()
        || (needs.iter().all(|n| has(&n.key)) && has(KEY_CA) && due.is_some_and(|at| at > now));
    if !tokens_good {
        return IdentityStep::Write { tokens: true };
    }
    let downward_current = downward.iter().all(|p| {
        data.and_then(|d| d.get(&p.key))
            .is_some_and(|v| v.0 == p.value.as_bytes())
    });
    if !downward_current {
        return IdentityStep::Write { tokens: false };
    }
    IdentityStep::RecheckAt(if needs.is_empty() { None } else { due })
}

/// A downward API item of a pod's volumes whose file would read differently on the lower copy
/// (the UID, the whole label and annotation maps, single labels the copy drops or our own
/// keys): our Secret holds the upper pod's value under `key`, projected at the item's path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DownwardPin {
    /// Key in our Secret (`downward-0`, ... in volume and item order).
    pub key: String,
    /// The file's content, as the kubelet writes it for the upper pod.
    pub value: String,
}

/// Whether a downward API `fieldPath` of a volume can read differently on the lower copy: the
/// UID always, the label and annotation maps always (they carry our marks), a single label
/// when it is an ignore-label or ours, a single annotation when it is ours. Decided from the
/// path alone, so a pod's volume layout never changes while it lives.
fn downward_path_differs(path: &str, ignore_labels: &[String]) -> bool {
    let subscript = |prefix: &str| {
        path.strip_prefix(prefix)
            .and_then(|r| r.strip_prefix("['"))
            .and_then(|r| r.strip_suffix("']"))
    };
    if let Some(key) = subscript("metadata.labels") {
        return ignore_labels.iter().any(|l| l == key)
            || [keys::LABEL_VIRTUAL_POD, LABEL_OWNER].contains(&key);
    }
    if let Some(key) = subscript("metadata.annotations") {
        return [
            keys::ANNOTATION_TRIPPED_LABELS,
            ANNOTATION_UPPER_UID,
            keys::ANNOTATION_SYNCED_ANNOTATIONS,
        ]
        .contains(&key);
    }
    matches!(
        path,
        "metadata.uid" | "metadata.labels" | "metadata.annotations"
    )
}

/// The content of a downward API volume file for `path` on `pod`, as the kubelet writes it:
/// label and annotation maps as sorted `key="value"` lines (Go's `%q` quoting).
pub fn downward_file(pod: &Pod, path: &str) -> Option<String> {
    let map = match path {
        "metadata.labels" => pod.metadata.labels.as_ref(),
        "metadata.annotations" => pod.metadata.annotations.as_ref(),
        _ => return crate::downward::downward_field_value(pod, path),
    };
    Some(
        map.into_iter()
            .flatten()
            .map(|(k, v)| format!("{k}={}", go_quote(v)))
            .collect::<Vec<_>>()
            .join("\n"),
    )
}

/// Go's `strconv.Quote` for the text of label and annotation values.
fn go_quote(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\u{b}' => out.push_str("\\v"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The downward API items of `upper`'s volumes (standalone and projected) that read the
/// upper pod's values from our Secret, with those values, in volume and item order.
pub fn downward_pins(upper: &Pod, ignore_labels: &[String]) -> Vec<DownwardPin> {
    downward_items(upper.spec.as_ref(), ignore_labels)
        .into_iter()
        .enumerate()
        .map(|(i, path)| DownwardPin {
            key: format!("downward-{i}"),
            value: downward_file(upper, &path).unwrap_or_default(),
        })
        .collect()
}

/// The field paths of the pinned items, in volume and item order.
fn downward_items(spec: Option<&PodSpec>, ignore_labels: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    for volume in spec.iter().flat_map(|s| s.volumes.iter().flatten()) {
        let items = volume
            .downward_api
            .iter()
            .flat_map(|d| d.items.iter().flatten())
            .chain(
                volume
                    .projected
                    .iter()
                    .flat_map(|p| p.sources.iter().flatten())
                    .filter_map(|s| s.downward_api.as_ref())
                    .flat_map(|d| d.items.iter().flatten()),
            );
        for item in items {
            if let Some(field) = &item.field_ref
                && downward_path_differs(&field.field_path, ignore_labels)
            {
                out.push(field.field_path.clone());
            }
        }
    }
    out
}

/// Rewrites the downward API volumes of a lower spec copied from `upper_spec`: each pinned item
/// ([`downward_items`]) becomes the same file projected from Secret `secret`; a standalone
/// `downwardAPI` volume with pinned items becomes a projected volume of the rest and them.
pub(crate) fn rewrite_downward_volumes(spec: &mut PodSpec, secret: &str, ignore_labels: &[String]) {
    let mut n = 0usize;
    let mut split = |source: &DownwardAPIVolumeSource| -> Vec<VolumeProjection> {
        let mut kept = Vec::new();
        let mut pinned = Vec::new();
        for item in source.items.iter().flatten() {
            let differs = item
                .field_ref
                .as_ref()
                .is_some_and(|f| downward_path_differs(&f.field_path, ignore_labels));
            if differs {
                pinned.push(KeyToPath {
                    key: format!("downward-{n}"),
                    path: item.path.clone(),
                    mode: item.mode,
                });
                n += 1;
            } else {
                kept.push(item.clone());
            }
        }
        let mut out = Vec::new();
        if !kept.is_empty() || pinned.is_empty() {
            out.push(VolumeProjection {
                downward_api: Some(DownwardAPIProjection { items: Some(kept) }),
                ..VolumeProjection::default()
            });
        }
        if !pinned.is_empty() {
            out.push(VolumeProjection {
                secret: Some(SecretProjection {
                    name: secret.to_owned(),
                    items: Some(pinned),
                    optional: None,
                }),
                ..VolumeProjection::default()
            });
        }
        out
    };
    for volume in spec.volumes.iter_mut().flatten() {
        if let Some(source) = volume.downward_api.take() {
            let sources = split(&source);
            let untouched = sources.len() == 1 && sources[0].downward_api.is_some();
            if untouched {
                volume.downward_api = Some(source);
            } else {
                volume.projected = Some(ProjectedVolumeSource {
                    default_mode: source.default_mode,
                    sources: Some(sources),
                });
            }
            continue;
        }
        if let Some(projected) = volume.projected.as_mut() {
            let sources = projected.sources.take().unwrap_or_default();
            let mut out = Vec::with_capacity(sources.len());
            for source in sources {
                match &source.downward_api {
                    Some(d) => {
                        let as_volume = DownwardAPIVolumeSource {
                            items: d.items.clone(),
                            default_mode: None,
                        };
                        out.extend(split(&as_volume));
                    }
                    None => out.push(source),
                }
            }
            projected.sources = Some(out);
        }
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
        rewrite_token_volumes(&mut spec, "tensile-identity-u-1", &needs);
        let volume = serde_json::to_value(&spec.volumes.as_ref().unwrap()[0]).unwrap();
        assert_eq!(
            volume,
            json!({"name": "kube-api-access-x1", "projected": {"defaultMode": 420, "sources": [
                {"secret": {"name": "tensile-identity-u-1", "items": [{"key": "token-0", "path": "token"}]}},
                {"secret": {"name": "tensile-identity-u-1", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
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
        rewrite_token_volumes(&mut spec, "tensile-identity-u-1", &needs);
        let secret = spec.volumes.as_ref().unwrap()[0].secret.as_ref().unwrap();
        assert_eq!(secret.secret_name.as_deref(), Some("tensile-identity-u-1"));
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

    #[test]
    fn refreshes_stay_one_interval_apart_when_the_server_truncates_the_expiry() {
        // As a real exchange goes: the node takes the time before the request, the server adds
        // the life asked to its own clock and answers in whole seconds, so the life the node
        // sees is a little under or over what was asked, by a different amount each time.
        let t0 = ts("2026-01-01T00:00:00.250Z");
        let life = SignedDuration::from_secs(600);
        let whole = |t: Timestamp| Timestamp::from_second(t.as_second()).unwrap();
        for i in 0..200_u32 {
            let uid = format!("7a2d{i:04x}-1b3c-4d5e-8f90-{:012x}", u64::from(i) * 104_729);
            let mut issued = t0 + SignedDuration::from_millis(i64::from(i) * 37);
            let mut slots = Vec::new();
            for k in 0..12_i64 {
                // Up to 2 s for the request and its queue; the server's clock at most 2 s off.
                let latency = SignedDuration::from_millis((k * 613 + i64::from(i) * 71) % 2000);
                let skew = SignedDuration::from_millis((k * 389 + i64::from(i) * 53) % 4000 - 2000);
                let expires = whole(issued + latency + skew + life);
                let slot = refresh_slot(&uid, issued, expires, 600);
                assert!(
                    slot > issued,
                    "{uid}: refresh {k} before its token was issued"
                );
                slots.push(slot);
                // The next token is asked for at the slot, a little late.
                issued = slot + SignedDuration::from_millis((k * 977) % 1500);
            }
            let gaps: Vec<i128> = slots
                .windows(2)
                .map(|w| w[1].duration_since(w[0]).as_millis())
                .collect();
            assert!(gaps.iter().all(|g| *g == 480_000), "{uid}: {gaps:?}");
        }
    }

    #[test]
    fn refreshes_come_at_each_pods_slot_spread_evenly_whenever_the_pods_were_made() {
        let t0 = ts("2026-01-01T00:00:00Z");
        let hour = SignedDuration::from_secs(3600);
        let uids: Vec<String> = (0..6000)
            .map(|i| format!("6f1c{i:04x}-8d2e-4c1a-9b7e-{:012x}", i * 7919))
            .collect();
        // Every pod made at the same moment, with one-hour tokens: their first refreshes.
        let first: Vec<Timestamp> = uids
            .iter()
            .map(|u| refresh_slot(u, t0, t0 + hour, 3600))
            .collect();
        let kubelet = refresh_at(t0, t0 + hour, 3600);
        let slack = SignedDuration::from_millis(2880 * 1000 / 50);
        assert!(first.iter().all(|t| *t > t0 && *t <= kubelet + slack));
        // Spread over the 48 minutes: no minute above twice the mean (125 a minute).
        let mut per_minute = [0_usize; 48];
        for t in &first {
            let minute = usize::try_from(t.duration_since(t0).as_secs() / 60).unwrap();
            per_minute[minute.min(47)] += 1;
        }
        assert!(per_minute.iter().all(|n| *n <= 250), "{per_minute:?}");
        // A pod's later refreshes come one interval (48 minutes) after the previous, issued a
        // little late (the queue, the request), and the same after a restart: the time is a
        // function of the UID and the token alone.
        for (u, at) in uids.iter().zip(&first).take(50) {
            let late = *at + SignedDuration::from_millis(1500);
            let next = refresh_slot(u, late, late + hour, 3600);
            assert_eq!(next, *at + SignedDuration::from_secs(2880), "{u}");
            assert_eq!(refresh_slot(u, late, late + hour, 3600), next);
        }
        // A token the server extended to a year: once a day, at the pod's slot.
        let year = SignedDuration::from_hours(24 * 365);
        let daily = refresh_slot(&uids[0], t0, t0 + year, 3607);
        assert!(daily > t0 && daily <= t0 + MAX_TOKEN_AGE + MAX_TOKEN_AGE / 50);
        let late = daily + SignedDuration::from_secs(3);
        assert_eq!(
            refresh_slot(&uids[0], late, late + year, 3607),
            daily + MAX_TOKEN_AGE
        );
        // A life too short for a slot after the issue: the kubelet's time.
        assert_eq!(
            refresh_slot("u", t0, t0 + SignedDuration::from_millis(900), 3600),
            refresh_at(t0, t0 + SignedDuration::from_millis(900), 3600)
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
        let s = identity_secret(
            &p,
            "vk-1",
            Tokens::Fresh(
                &[
                    issued("token-0", "2026-01-01T01:00:00Z", 3600),
                    issued("token-1", "2026-01-01T00:10:00Z", 600),
                ],
                "PEM",
            ),
            &[],
        )
        .unwrap();
        assert_eq!(s.metadata.name.as_deref(), Some("tensile-identity-u-1"));
        assert!(s.metadata.owner_references.is_none());
        assert_eq!(s.metadata.namespace.as_deref(), Some("shop"));
        let labels = s.metadata.labels.as_ref().unwrap();
        assert_eq!(labels[LABEL_OWNER], owner_label_value("vk-1"));
        assert_eq!(labels[LABEL_IDENTITY_OF], "u-1");
        let annotations = s.metadata.annotations.as_ref().unwrap();
        assert_eq!(annotations[ANNOTATION_TOKEN_POD], "web");
        // The earlier token's slot: at most 80% into its 600 s, within its last 480 s.
        let due: Timestamp = annotations[ANNOTATION_TOKEN_REFRESH_AT].parse().unwrap();
        assert_eq!(
            due,
            refresh_slot(
                "u-1",
                ts("2026-01-01T00:00:00Z"),
                ts("2026-01-01T00:10:00Z"),
                600
            )
        );
        assert!(due > ts("2026-01-01T00:00:00Z") && due <= ts("2026-01-01T00:08:00Z"));
        let data = s.data.as_ref().unwrap();
        assert_eq!(data["token-1"].0, b"jwt-token-1");
        assert_eq!(data["ca.crt"].0, b"PEM");
        assert_eq!(data["namespace"].0, b"shop");
        let mut nameless = p.clone();
        nameless.metadata.uid = None;
        assert_eq!(
            identity_secret(&nameless, "vk-1", Tokens::None, &[]).unwrap_err(),
            TokenSecretError::MissingMetadata("uid")
        );
    }

    #[test]
    fn a_secret_is_written_when_missing_incomplete_or_due_then_rechecked() {
        let p = pod(api_access_spec());
        let now = ts("2026-01-01T00:30:00Z");
        assert_eq!(
            identity_step(&p, &[], None, now),
            IdentityStep::Write { tokens: true }
        );
        let tokens = [issued("token-0", "2026-01-01T01:00:00Z", 3600)];
        let fresh = identity_secret(&p, "vk-1", Tokens::Fresh(&tokens, "PEM"), &[]).unwrap();
        let due = refresh_slot(
            "u-1",
            ts("2026-01-01T00:00:00Z"),
            ts("2026-01-01T01:00:00Z"),
            3600,
        );
        assert!(due <= ts("2026-01-01T00:48:00Z"));
        let now = due - SignedDuration::from_secs(1);
        assert_eq!(
            identity_step(&p, &[], Some(&fresh), now),
            IdentityStep::RecheckAt(Some(due))
        );
        assert_eq!(
            identity_step(&p, &[], Some(&fresh), due),
            IdentityStep::Write { tokens: true }
        );
        let mut incomplete = fresh.clone();
        incomplete.data.as_mut().unwrap().remove("token-0");
        assert_eq!(
            identity_step(&p, &[], Some(&incomplete), now),
            IdentityStep::Write { tokens: true }
        );
        let mut unreadable = fresh;
        unreadable
            .metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(ANNOTATION_TOKEN_REFRESH_AT.into(), "soon".into());
        assert_eq!(
            identity_step(&p, &[], Some(&unreadable), now),
            IdentityStep::Write { tokens: true }
        );
        let no_token = pod(json!({"containers": [{"name": "c"}]}));
        assert_eq!(identity_step(&no_token, &[], None, now), IdentityStep::None);
    }

    #[test]
    fn a_secret_is_kept_while_its_lower_pod_exists_or_its_upper_pod_still_runs() {
        let upper = pod(api_access_spec());
        let secret = identity_secret(&upper, "vk-1", Tokens::None, &[]).unwrap();
        let lower: Pod = serde_json::from_value(json!({"metadata": {"name": "web",
            "annotations": {ANNOTATION_UPPER_UID: "u-1"}}}))
        .unwrap();
        let mut other_lower = lower.clone();
        other_lower
            .metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(ANNOTATION_UPPER_UID.into(), "u-2".into());
        // Before the lower pod is made, and while both exist.
        assert!(identity_secret_needed(&secret, Some(&upper), None));
        assert!(identity_secret_needed(&secret, Some(&upper), Some(&lower)));
        // The upper pod is deleted: kept until its lower pod is gone.
        let mut deleting = upper.clone();
        deleting.metadata.deletion_timestamp = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(ts("2026-01-01T00:00:00Z")),
        );
        assert!(identity_secret_needed(
            &secret,
            Some(&deleting),
            Some(&lower)
        ));
        assert!(identity_secret_needed(&secret, None, Some(&lower)));
        assert!(!identity_secret_needed(&secret, Some(&deleting), None));
        assert!(!identity_secret_needed(&secret, None, None));
        // A finished pod's Secret goes with its lower pod.
        let mut failed = upper.clone();
        failed.status = Some(k8s_openapi::api::core::v1::PodStatus {
            phase: Some("Failed".into()),
            ..Default::default()
        });
        assert!(!identity_secret_needed(&secret, Some(&failed), None));
        // A pod re-created under the same name (another UID) does not keep the old one.
        let mut again = upper.clone();
        again.metadata.uid = Some("u-2".into());
        assert!(!identity_secret_needed(
            &secret,
            Some(&again),
            Some(&other_lower)
        ));
        // Without our label it is not an identity Secret of ours.
        let mut unlabelled = secret.clone();
        unlabelled.metadata.labels = None;
        assert!(!identity_secret_needed(
            &unlabelled,
            Some(&upper),
            Some(&lower)
        ));
    }

    #[test]
    fn downward_items_that_would_show_the_copy_read_our_secret_and_the_rest_stay() {
        let mut p = pod(json!({
            "containers": [{"name": "c"}],
            "volumes": [
                {"name": "info", "downwardAPI": {"defaultMode": 420, "items": [
                    {"path": "uid", "fieldRef": {"fieldPath": "metadata.uid"}},
                    {"path": "name", "fieldRef": {"fieldPath": "metadata.name"}},
                    {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
                    {"path": "app", "fieldRef": {"fieldPath": "metadata.labels['app']"}},
                    {"path": "group", "fieldRef": {"fieldPath": "metadata.labels['pod-group.scheduling.sigs.k8s.io']"}},
                ]}},
                {"name": "only-name", "downwardAPI": {"items": [
                    {"path": "name", "fieldRef": {"fieldPath": "metadata.name"}}]}},
                {"name": "mixed", "projected": {"sources": [
                    {"configMap": {"name": "c"}},
                    {"downwardAPI": {"items": [
                        {"path": "annotations", "fieldRef": {"fieldPath": "metadata.annotations"}}]}}
                ]}}
            ]
        }));
        p.metadata.labels = Some(BTreeMap::from([
            ("app".into(), "web".into()),
            ("pod-group.scheduling.sigs.k8s.io".into(), "pg \"1\"".into()),
        ]));
        p.metadata.annotations = Some(BTreeMap::from([("note".into(), "a\nb".into())]));
        let ignore = vec![keys::DEFAULT_IGNORE_LABELS.to_owned()];
        let pins = downward_pins(&p, &ignore);
        let pairs: Vec<_> = pins
            .iter()
            .map(|p| (p.key.as_str(), p.value.as_str()))
            .collect();
        assert_eq!(
            pairs,
            vec![
                ("downward-0", "u-1"),
                (
                    "downward-1",
                    "app=\"web\"\npod-group.scheduling.sigs.k8s.io=\"pg \\\"1\\\"\""
                ),
                ("downward-2", "pg \"1\""),
                ("downward-3", "note=\"a\\nb\""),
            ]
        );
        let mut spec = p.spec.clone().unwrap();
        rewrite_downward_volumes(&mut spec, "s", &ignore);
        let volumes = serde_json::to_value(&spec.volumes).unwrap();
        assert_eq!(
            volumes,
            json!([
                {"name": "info", "projected": {"defaultMode": 420, "sources": [
                    {"downwardAPI": {"items": [
                        {"path": "name", "fieldRef": {"fieldPath": "metadata.name"}},
                        {"path": "app", "fieldRef": {"fieldPath": "metadata.labels['app']"}}]}},
                    {"secret": {"name": "s", "items": [
                        {"key": "downward-0", "path": "uid"},
                        {"key": "downward-1", "path": "labels"},
                        {"key": "downward-2", "path": "group"}]}}
                ]}},
                {"name": "only-name", "downwardAPI": {"items": [
                    {"path": "name", "fieldRef": {"fieldPath": "metadata.name"}}]}},
                {"name": "mixed", "projected": {"sources": [
                    {"configMap": {"name": "c"}},
                    {"secret": {"name": "s", "items": [{"key": "downward-3", "path": "annotations"}]}}
                ]}}
            ])
        );
    }

    #[test]
    fn a_changed_pinned_value_rewrites_the_secret_without_new_tokens() {
        let mut p = pod(json!({
            "containers": [{"name": "c"}],
            "volumes": [{"name": "info", "downwardAPI": {"items": [
                {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]}}]
        }));
        p.metadata.labels = Some(BTreeMap::from([("app".into(), "web".into())]));
        let now = ts("2026-01-01T00:00:00Z");
        let pins = downward_pins(&p, &[]);
        assert_eq!(
            identity_step(&p, &pins, None, now),
            IdentityStep::Write { tokens: false }
        );
        let secret = identity_secret(&p, "vk-1", Tokens::None, &pins).unwrap();
        assert_eq!(
            identity_step(&p, &pins, Some(&secret), now),
            IdentityStep::RecheckAt(None)
        );
        p.metadata.labels = Some(BTreeMap::from([("app".into(), "api".into())]));
        let changed = downward_pins(&p, &[]);
        assert_eq!(
            identity_step(&p, &changed, Some(&secret), now),
            IdentityStep::Write { tokens: false }
        );
        // Kept tokens are carried over with their refresh time.
        let with_token = pod(api_access_spec());
        let fresh = identity_secret(
            &with_token,
            "vk-1",
            Tokens::Fresh(&[issued("token-0", "2026-01-01T01:00:00Z", 3600)], "PEM"),
            &[],
        )
        .unwrap();
        let kept = identity_secret(&with_token, "vk-1", Tokens::Kept(&fresh), &[]).unwrap();
        assert_eq!(kept.metadata.annotations, fresh.metadata.annotations);
        // ... and their values are not written again (the merge patch leaves them).
        let keys = |s: &Secret| -> Vec<String> {
            s.data.iter().flatten().map(|(k, _)| k.clone()).collect()
        };
        assert_eq!(keys(&kept), ["namespace"]);
    }

    #[test]
    fn a_secret_kept_in_memory_has_no_token_values_and_decides_the_same() {
        let p = pod(api_access_spec());
        // When the token was issued: its refresh slot is always later.
        let now: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        let pins = downward_pins(&p, &[]);
        let full = identity_secret(
            &p,
            "vk-1",
            Tokens::Fresh(&[issued("token-0", "2026-01-01T01:00:00Z", 3600)], "PEM"),
            &pins,
        )
        .unwrap();
        let compact = without_token_values(full.clone());
        let data = compact.data.clone().unwrap();
        assert!(data.get("token-0").is_some_and(|v| v.0.is_empty()));
        assert!(data.get(KEY_CA).is_some_and(|v| v.0.is_empty()));
        assert_eq!(
            data.get(KEY_NAMESPACE),
            full.data.as_ref().and_then(|d| d.get(KEY_NAMESPACE))
        );
        assert_eq!(compact.metadata, full.metadata);
        assert_eq!(
            identity_step(&p, &pins, Some(&compact), now),
            identity_step(&p, &pins, Some(&full), now)
        );
        assert_ne!(
            identity_step(&p, &pins, Some(&compact), now),
            IdentityStep::Write { tokens: true }
        );
        assert_eq!(
            identity_secret_needed(&compact, Some(&p), None),
            identity_secret_needed(&full, Some(&p), None)
        );
    }
}
