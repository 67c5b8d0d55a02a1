//! Upper service-account tokens of offloaded pods (the rules are `tensile_core::identity`): for
//! each pod that mounts a token, one Secret of ours in the lower cluster, holding tokens the
//! upper cluster issued for the upper pod (TokenRequest bound to it), the upper CA and the
//! namespace. The pod controller writes it before the lower pod, and again when a token is due
//! (the kubelet's rule) or the Secret went missing, and deletes it once neither the lower pod
//! that mounts it nor a running upper pod needs it (`identity_secret_needed`). Deleting it
//! ourselves rather than through an owner reference to the lower pod saves a lower write per
//! pod: the reference can only be added after the pod exists.
//!
//! One watch of our token Secrets downstairs (label selector) fills the cache the decisions
//! read, and an index of them by pod name (so orphans are found after a restart); a change of
//! one puts its pod back on the pod controller's queue.
//!
//! The pod controller sees one interface, [`PodTokens`]: ready, write a pod's Secret (before
//! its creation, and when the index says `SyncTokens`), collect what no pod needs. Without
//! upper identity each of them does nothing.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use futures::TryStreamExt as _;
use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Pod, PodStatus, Secret, ServiceAccount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::watcher;
use tensile_core::deps::is_owned_by;
use tensile_core::identity::{
    DownwardPin, IdentityStep, IssuedToken, KEY_CA, TokenNeed, Tokens, downward_pins,
    identity_secret, identity_secret_name, identity_secret_needed, identity_step, token_needs,
    without_token_values,
};
use tensile_core::keys::{
    ANNOTATION_TOKEN_POD, CONFIG_MAP_KUBE_ROOT_CA, LABEL_IDENTITY_OF, LABEL_OWNER,
    SERVICE_ACCOUNT_DEFAULT, owner_label_value,
};
use tokio_util::sync::CancellationToken;

use futures::future::BoxFuture;
use tensile_core::translate::TranslateConfig;
use tensile_runtime::cache::{CompactCache, Key};
use tensile_runtime::clients::already_exists;
use tensile_runtime::queue::Queue;

use crate::sync_error::{Call, Cluster, SyncError};
use crate::sync_metrics::SyncMetrics;
use tensile_runtime::api_error::classify;

/// What the pod controller's tokens are made of.
pub struct TokenWiring {
    /// Upper cluster (TokenRequests).
    pub upper: kube::Client,
    /// Lower cluster (our Secrets).
    pub lower: kube::Client,
    /// Owner id, `--ignore-labels`, and whether pods have upper identity (`upper_api`).
    pub translate: TranslateConfig,
    /// A name for the lower cluster in messages.
    pub lower_name: String,
    /// Every upper ConfigMap (the copy controller's cache): each namespace's root CA.
    pub upper_config_maps: CompactCache<ConfigMap>,
    /// Where the time of a pod's tokens is measured (`upper_tokens`).
    pub metrics: SyncMetrics,
}

impl std::fmt::Debug for TokenWiring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenWiring")
            .field("lower_name", &self.lower_name)
            .finish_non_exhaustive()
    }
}

/// The token side of the pod controller, behind one interface; off (each method does
/// nothing) when pods do not have upper identity.
pub struct PodTokens {
    secrets: Option<IdentitySecrets>,
    lower_name: String,
    metrics: SyncMetrics,
}

impl std::fmt::Debug for PodTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PodTokens")
            .field("on", &self.secrets.is_some())
            .finish_non_exhaustive()
    }
}

impl PodTokens {
    /// The tokens of the pods of `queue`, and the feed that keeps their cache (the watch of
    /// our token Secrets; a change puts its pod on `queue`) for the controller to run until
    /// `stop`.
    pub fn new(
        wiring: TokenWiring,
        queue: Queue<Key>,
        stop: CancellationToken,
    ) -> (Self, BoxFuture<'static, ()>) {
        let TokenWiring {
            upper,
            lower,
            translate,
            lower_name,
            upper_config_maps,
            metrics,
        } = wiring;
        let (secrets, feed) = if translate.upper_api.is_some() {
            let (secrets, feed) = IdentitySecrets::start(
                upper,
                lower,
                translate,
                lower_name.clone(),
                upper_config_maps,
                queue,
                stop,
            );
            (Some(secrets), feed)
        } else {
            let feed: BoxFuture<'static, ()> = Box::pin(async {});
            (None, feed)
        };
        let tokens = PodTokens {
            secrets,
            lower_name,
            metrics,
        };
        (tokens, feed)
    }

    /// Waits for the first list of our token Secrets: nothing is decided before.
    pub async fn ready(&self) {
        if let Some(s) = &self.secrets {
            s.wait_until_ready().await;
        }
    }

    /// Brings the token Secret of upper pod `u` up to date: written when missing or due, and
    /// looked at again when its earliest token is due.
    ///
    /// Before a lower pod is created the writes are serial, on purpose: TokenRequest upstairs,
    /// then our Secret downstairs, then the pod.
    /// - The token goes into the Secret, so it is requested first.
    /// - The Secret must exist, and be ours, before the pod is created. A lower kubelet mounts
    ///   whatever Secret of that name it finds: one that anybody able to write Secrets in the
    ///   namespace made first, or while our create was in flight, would give the pod a token
    ///   that is not the upper one (a kubelet would wait for a Secret that is missing, but not
    ///   for one that is there and not ours). Only our create's answer proves the Secret is
    ///   ours; a pod created at the same time could already run with the other.
    ///
    ///
    /// So no write of one pod is made at the same time as another of its writes. The
    /// alternatives looked at, and why not:
    /// - An empty Secret first, beside the TokenRequest, then the tokens patched in beside the
    ///   pod create: the lower kubelet would find the Secret without the token key its volume
    ///   names and fail the mount, retrying with back-off (the pod starts later, not sooner),
    ///   and it is a fourth write.
    /// - The pod created with a scheduling gate beside the Secret, the gate lifted once the
    ///   Secret is ours: lifting it is a third write in series again, so nothing is saved, and
    ///   a pod that shows "created" but cannot run only moves the wait out of the measurement.
    ///
    /// What goes side by side is the writes of different pods (one creation per worker,
    /// `pods::CREATIONS_PER_WORKER` says why not more, and a status write beside it) and a
    /// pod's TokenRequests among themselves (one per audience and expiry). What saves round trips is not writing twice (a Secret
    /// already in the cache is not created again, a pod just created is not created again:
    /// `Expected`).
    pub async fn write(&self, u: &Pod) -> Result<(), SyncError> {
        let Some(secrets) = &self.secrets else {
            return Ok(());
        };
        let t0 = std::time::Instant::now();
        let written = secrets.sync(u).await;
        self.metrics.observe("upper_tokens", t0.elapsed());
        written.map_err(|e| {
            self.error(
                e,
                u.metadata.namespace.as_deref(),
                u.metadata.name.as_deref(),
            )
        })
    }

    /// Deletes the token Secrets of pod `key` that neither its lower pod nor its upper pod
    /// needs any more.
    pub async fn collect(
        &self,
        key: &Key,
        upper: Option<&Pod>,
        lower: Option<&Pod>,
    ) -> Result<(), SyncError> {
        let Some(secrets) = &self.secrets else {
            return Ok(());
        };
        secrets
            .collect(key, upper, lower)
            .await
            .map_err(|e| self.error(e, Some(&key.namespace), Some(&key.name)))
    }

    /// Whether pod `key` has token Secrets of ours (then [`Self::collect`] has something to
    /// judge).
    pub fn has_secrets(&self, key: &Key) -> bool {
        self.secrets.as_ref().is_some_and(|s| {
            s.by_pod
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .contains_key(key)
        })
    }

    fn error(&self, e: TokenError, ns: Option<&str>, pod: Option<&str>) -> SyncError {
        e.into_sync_error(
            ns.unwrap_or_default(),
            pod.unwrap_or_default(),
            &self.lower_name,
        )
    }
}

/// The fields of a pod that [`identity_secret_needed`] reads, decoded alone from a cache (the
/// rest of the pod is skipped): the collection runs after every reconcile.
#[derive(Debug, serde::Deserialize)]
pub struct PodHead {
    metadata: ObjectMeta,
    #[serde(default)]
    status: Option<PhaseOnly>,
}

#[derive(Debug, serde::Deserialize)]
struct PhaseOnly {
    #[serde(default)]
    phase: Option<String>,
}

impl PodHead {
    /// A pod of these fields only.
    pub fn into_pod(self) -> Pod {
        Pod {
            metadata: self.metadata,
            status: self.status.map(|s| PodStatus {
                phase: s.phase,
                ..PodStatus::default()
            }),
            ..Pod::default()
        }
    }
}

/// Why a pod's upper tokens could not be delivered; each names the pod and what failed.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// The upper cluster refused or failed the TokenRequest.
    #[error(
        "requesting a token of serviceaccount {namespace}/{service_account} for pod {pod} from the upper cluster: {source}"
    )]
    Request {
        /// Namespace.
        namespace: String,
        /// The pod's ServiceAccount.
        service_account: String,
        /// Pod name.
        pod: String,
        /// The API error (boxed: it would make every `Result` of this module large).
        #[source]
        source: Box<kube::Error>,
    },
    /// The upper answer had no token or expiry.
    #[error(
        "the upper cluster's TokenRequest for pod {namespace}/{pod} returned no token or no expiry"
    )]
    EmptyAnswer {
        /// Namespace.
        namespace: String,
        /// Pod name.
        pod: String,
    },
    /// The upper namespace has no root CA ConfigMap yet (its controller manager publishes it).
    #[error(
        "configmap {namespace}/kube-root-ca.crt (the upper cluster's CA, published by its controller manager) has no ca.crt yet"
    )]
    NoCa {
        /// Namespace.
        namespace: String,
    },
    /// The pod lacks metadata a Secret needs.
    #[error("pod {namespace}/{pod}: {source}")]
    Secret {
        /// Namespace.
        namespace: String,
        /// Pod name.
        pod: String,
        /// What is missing.
        #[source]
        source: tensile_core::identity::TokenSecretError,
    },
    /// Writing our Secret downstairs failed.
    #[error("writing secret {namespace}/{secret} in lower cluster {cluster}: {source}")]
    Write {
        /// Namespace.
        namespace: String,
        /// Secret name.
        secret: String,
        /// Lower cluster.
        cluster: String,
        /// The API error (boxed: it would make every `Result` of this module large).
        #[source]
        source: Box<kube::Error>,
    },
    /// A Secret of the name exists downstairs and is not ours.
    #[error("a secret {namespace}/{secret} that is not ours exists in lower cluster {cluster}")]
    NotOurs {
        /// Namespace.
        namespace: String,
        /// Secret name.
        secret: String,
        /// Lower cluster.
        cluster: String,
    },
}

impl TokenError {
    /// As the pod controller's error: the failure to deliver the upper tokens of pod `ns/pod`
    /// (to the lower cluster `lower`).
    pub fn into_sync_error(self, ns: &str, pod: &str, lower: &str) -> SyncError {
        let e = self;
        let call = |cluster| Call::new("delivering the upper tokens of", "Pod", ns, pod, cluster);
        let lower = || Cluster::Lower(lower.to_owned());
        match e {
            // The ServiceAccount is not there upstairs (yet, or any more).
            TokenError::Request {
                namespace,
                service_account,
                source,
                ..
            } if matches!(source.as_ref(), kube::Error::Api(s) if s.code == 404) => {
                SyncError::MissingDependency {
                    kind: "serviceaccount",
                    namespace,
                    name: service_account,
                    why: "not found in the upper cluster",
                }
            }
            TokenError::Request { ref source, .. } => {
                let class = classify(source);
                SyncError::classified(call(Cluster::Upper), class, Box::new(e))
            }
            TokenError::Write { ref source, .. } => {
                let class = classify(source);
                SyncError::classified(call(lower()), class, Box::new(e))
            }
            TokenError::EmptyAnswer { .. } => SyncError::Transient {
                call: call(Cluster::Upper),
                source: Box::new(e),
            },
            TokenError::NoCa { namespace } => SyncError::MissingDependency {
                kind: "configmap",
                namespace,
                name: tensile_core::keys::CONFIG_MAP_KUBE_ROOT_CA.to_owned(),
                why: "(the upper cluster's CA, published by its controller manager) has no ca.crt yet",
            },
            TokenError::Secret { .. } => SyncError::Invalid(Box::new(e)),
            TokenError::NotOurs {
                namespace,
                secret,
                cluster,
            } => SyncError::Ownership {
                kind: "Secret",
                namespace,
                name: secret,
                cluster: Cluster::Lower(cluster),
            },
        }
    }
}

/// Our token Secrets downstairs, and how they are written.
struct IdentitySecrets {
    upper: kube::Client,
    lower: kube::Client,
    owner: String,
    /// `--ignore-labels`: labels the lower copy lacks, pinned in downward API files.
    ignore_labels: Vec<String>,
    lower_name: String,
    /// Our token Secrets downstairs.
    secrets: CompactCache<Secret>,
    /// Their names by the (namespace, name) of their pod.
    by_pod: Arc<Mutex<SecretsByPod>>,
    /// Every upper ConfigMap (the copy controller's cache): each namespace's root CA.
    upper_config_maps: CompactCache<ConfigMap>,
    /// The pod controller's queue: a pod's tokens are looked at again when they are due.
    queue: Queue<Key>,
    /// The resourceVersion of each Secret as our last write left it, until the watch shows a
    /// version of it: the event of our own write does not bring its pod back (see `start`).
    written: Arc<Mutex<HashMap<Key, String>>>,
}

impl std::fmt::Debug for IdentitySecrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdentitySecrets")
            .field("owner", &self.owner)
            .finish_non_exhaustive()
    }
}

impl IdentitySecrets {
    /// The watch of our token Secrets (the feed, to run until `stop`); their changes, and
    /// refresh times, go to `queue`.
    fn start(
        upper: kube::Client,
        lower: kube::Client,
        translate: TranslateConfig,
        lower_name: String,
        upper_config_maps: CompactCache<ConfigMap>,
        queue: Queue<Key>,
        stop: CancellationToken,
    ) -> (Self, BoxFuture<'static, ()>) {
        let TranslateConfig {
            owner,
            ignore_labels,
            ..
        } = translate;
        let secrets = CompactCache::new();
        let by_pod: Arc<Mutex<SecretsByPod>> = Arc::default();
        let selector = format!(
            "{LABEL_OWNER}={},{LABEL_IDENTITY_OF}",
            owner_label_value(&owner)
        );
        let events = tensile_runtime::backoff::watch(
            Api::<Secret>::all(lower.clone()),
            watcher::Config::default().labels(&selector),
        )
        // Kept without the tokens' and CA's values (`without_token_values`): nothing here
        // reads them, and they were most of what the cache held per pod.
        .map_ok(|e| e.modify(|s| *s = without_token_values(std::mem::take(s))));
        // The Secrets once the cache shows them (a re-list's when complete).
        let index = by_pod.clone();
        let events = secrets.objects_shown(events, move |e| index_secrets(&index, e));
        let feed = queue.clone();
        let written: Arc<Mutex<HashMap<Key, String>>> = Arc::default();
        let (ours, cache) = (written.clone(), secrets.clone());
        let feed = Box::pin(async move {
            tensile_runtime::backoff::drain(events, &stop, "token secrets", |s: Secret| {
                if own_write(&ours, &cache, &s) {
                    return;
                }
                let pod = s
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(ANNOTATION_TOKEN_POD));
                if let (Some(ns), Some(pod)) = (s.metadata.namespace.clone(), pod) {
                    feed.add(Key::new(ns, pod.clone()));
                }
            })
            .await;
        });
        let secrets = IdentitySecrets {
            upper,
            lower,
            owner,
            ignore_labels,
            lower_name,
            secrets,
            by_pod,
            upper_config_maps,
            queue,
            written,
        };
        (secrets, feed)
    }

    /// Deletes the identity Secrets of pod `key` that neither its lower pod nor its upper pod
    /// needs any more (UID precondition: only the Secret judged).
    async fn collect(
        &self,
        key: &Key,
        upper: Option<&Pod>,
        lower: Option<&Pod>,
    ) -> Result<(), TokenError> {
        let names: Vec<String> = self
            .by_pod
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(key)
            .map(|n| n.to_vec())
            .unwrap_or_default();
        let Key {
            namespace: ns,
            name: _,
        } = key;
        for name in names {
            let Some(secret) = self.secrets.get(ns, &name) else {
                continue;
            };
            if identity_secret_needed(&secret, upper, lower) {
                continue;
            }
            let params = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: secret.metadata.uid.clone(),
                    resource_version: None,
                }),
                ..DeleteParams::default()
            };
            match self.secrets_api(ns).delete(&name, &params).await {
                Ok(_) => {
                    tracing::debug!(namespace = %ns, secret = %name, "identity secret deleted")
                }
                Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
                Err(source) => return Err(self.write_error(ns, &name, source)),
            }
        }
        Ok(())
    }

    /// Waits for the first list of our token Secrets.
    async fn wait_until_ready(&self) {
        self.secrets.wait_until_ready().await;
    }

    /// Brings the token Secret of upper pod `u` up to date: written when missing or due, and
    /// looked at again when its earliest token is due.
    async fn sync(&self, u: &Pod) -> Result<(), TokenError> {
        let (Some(ns), Some(name), Some(uid)) = (
            u.metadata.namespace.as_deref(),
            u.metadata.name.as_deref(),
            u.metadata.uid.as_deref(),
        ) else {
            return Ok(());
        };
        let secret_name = identity_secret_name(uid);
        let current = self.secrets.get(ns, &secret_name);
        let pins = downward_pins(u, &self.ignore_labels);
        let due = match identity_step(u, &pins, current.as_ref(), Timestamp::now()) {
            IdentityStep::None => return Ok(()),
            IdentityStep::RecheckAt(at) => at,
            IdentityStep::Write { tokens } => {
                let secret = if tokens {
                    let (issued, ca) = self.fresh_tokens(u, ns, name).await?;
                    self.secret(u, Tokens::Fresh(&issued, &ca), &pins)?
                } else {
                    let kept = current.as_ref().map_or(Tokens::None, Tokens::Kept);
                    self.secret(u, kept, &pins)?
                };
                self.write(ns, &secret_name, &secret, current.is_some())
                    .await?;
                identity_step(u, &pins, Some(&secret), Timestamp::now()).recheck_time()
            }
        };
        if let Some(at) = due {
            self.queue
                .add_at(Key::new(ns.to_owned(), name.to_owned()), instant_at(at));
        }
        Ok(())
    }

    /// Our Secret for `u`.
    fn secret(
        &self,
        u: &Pod,
        tokens: Tokens<'_>,
        pins: &[DownwardPin],
    ) -> Result<Secret, TokenError> {
        identity_secret(u, &self.owner, tokens, pins).map_err(|source| TokenError::Secret {
            namespace: u.metadata.namespace.clone().unwrap_or_default(),
            pod: u.metadata.name.clone().unwrap_or_default(),
            source,
        })
    }

    /// Newly requested tokens for `u`, and the upper CA.
    async fn fresh_tokens(
        &self,
        u: &Pod,
        ns: &str,
        name: &str,
    ) -> Result<(Vec<IssuedToken>, String), TokenError> {
        let ca = self
            .upper_config_maps
            .get(ns, CONFIG_MAP_KUBE_ROOT_CA)
            .and_then(|cm| cm.data?.remove(KEY_CA))
            .ok_or_else(|| TokenError::NoCa {
                namespace: ns.to_owned(),
            })?;
        let needs = u.spec.as_ref().map(token_needs).unwrap_or_default();
        // One request per audience and expiry, all at once: they do not depend on each other.
        let tokens =
            futures::future::try_join_all(needs.iter().map(|need| self.request(u, ns, name, need)))
                .await?;
        Ok((tokens, ca))
    }

    /// One TokenRequest to the upper cluster, bound to the upper pod.
    async fn request(
        &self,
        u: &Pod,
        ns: &str,
        name: &str,
        need: &TokenNeed,
    ) -> Result<IssuedToken, TokenError> {
        let service_account = u
            .spec
            .as_ref()
            .and_then(|s| s.service_account_name.as_deref())
            .filter(|s| !s.is_empty())
            .unwrap_or(SERVICE_ACCOUNT_DEFAULT);
        let request = TokenRequest {
            spec: TokenRequestSpec {
                audiences: need.audience.iter().cloned().collect(),
                expiration_seconds: Some(need.expiration_seconds),
                bound_object_ref: Some(BoundObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Pod".into()),
                    name: Some(name.to_owned()),
                    uid: u.metadata.uid.clone(),
                }),
            },
            ..TokenRequest::default()
        };
        let issued = Timestamp::now();
        let answer: TokenRequest = Api::<ServiceAccount>::namespaced(self.upper.clone(), ns)
            .create_subresource("token", service_account, &PostParams::default(), &request)
            .await
            .map_err(|source| TokenError::Request {
                namespace: ns.to_owned(),
                service_account: service_account.to_owned(),
                pod: name.to_owned(),
                source: Box::new(source),
            })?;
        let status = answer
            .status
            .filter(|s| !s.token.is_empty())
            .ok_or_else(|| TokenError::EmptyAnswer {
                namespace: ns.to_owned(),
                pod: name.to_owned(),
            })?;
        Ok(IssuedToken {
            key: need.key.clone(),
            token: status.token,
            issued,
            expires: status.expiration_timestamp.0,
            expiration_seconds: need.expiration_seconds,
        })
    }

    /// Creates or replaces our Secret (`known`: the cache has it).
    async fn write(
        &self,
        ns: &str,
        secret_name: &str,
        secret: &Secret,
        known: bool,
    ) -> Result<(), TokenError> {
        let api = self.secrets_api(ns);
        if !known {
            match api.create(&PostParams::default(), secret).await {
                Ok(created) => {
                    self.wrote(ns, secret_name, &created);
                    return Ok(());
                }
                Err(e) if already_exists(&e) => {
                    let existing = api
                        .get(secret_name)
                        .await
                        .map_err(|source| self.write_error(ns, secret_name, source))?;
                    if !is_owned_by(&existing.metadata, &self.owner) {
                        return Err(TokenError::NotOurs {
                            namespace: ns.to_owned(),
                            secret: secret_name.to_owned(),
                            cluster: self.lower_name.clone(),
                        });
                    }
                }
                Err(source) => return Err(self.write_error(ns, secret_name, source)),
            }
        }
        // Every key we write is ours: a merge patch of the whole object replaces them all.
        let patched = api
            .patch(secret_name, &PatchParams::default(), &Patch::Merge(secret))
            .await
            .map_err(|source| self.write_error(ns, secret_name, source))?;
        self.wrote(ns, secret_name, &patched);
        Ok(())
    }

    /// Our write left Secret `ns/name` as `written`.
    fn wrote(&self, ns: &str, name: &str, written: &Secret) {
        if let Some(version) = written.metadata.resource_version.clone() {
            self.written
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(Key::new(ns.to_owned(), name.to_owned()), version);
        }
    }

    fn secrets_api(&self, ns: &str) -> Api<Secret> {
        Api::namespaced(self.lower.clone(), ns)
    }

    fn write_error(&self, ns: &str, secret: &str, source: kube::Error) -> TokenError {
        TokenError::Write {
            namespace: ns.to_owned(),
            secret: secret.to_owned(),
            cluster: self.lower_name.clone(),
            source: Box::new(source),
        }
    }
}

/// Whether `shown`, a Secret the watch just showed, is our own last write of it coming back
/// (the version the write made, still in the cache: not a deletion). That changes nothing for
/// its pod, which wrote it, so the pod is not planned again: in a burst a reconcile fewer per
/// pod, the one that used to find the pod's create still in flight. Any other version brings
/// the pod back. The mark of our write is used up either way.
fn own_write(
    written: &Mutex<HashMap<Key, String>>,
    cache: &CompactCache<Secret>,
    shown: &Secret,
) -> bool {
    let (Some(ns), Some(name)) = (&shown.metadata.namespace, &shown.metadata.name) else {
        return false;
    };
    let last = written
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .remove(&Key::new(ns.clone(), name.clone()));
    last.is_some()
        && last.as_ref() == shown.metadata.resource_version.as_ref()
        && cache.contains(ns, name)
}

/// Keeps the index of our Secrets by their pod's (namespace, name) in step with the watch.
/// Our token Secrets' names by the (namespace, name) of their pod: one name nearly always (it
/// follows from the pod's UID), two only while a pod of the same name but a new UID replaces
/// one. A boxed slice, not a set: one per offloaded pod, and a one-name `BTreeSet` is a
/// B-tree node of eleven slots (about 280 bytes) where the slice takes its one `String`.
type SecretsByPod = HashMap<Key, Box<[String]>>;

fn index_secrets(index: &Mutex<SecretsByPod>, event: &watcher::Event<Secret>) {
    let mut index = index.lock().unwrap_or_else(PoisonError::into_inner);
    let entry = |s: &Secret| {
        let pod = s.metadata.annotations.as_ref()?.get(ANNOTATION_TOKEN_POD)?;
        Some((
            Key::new(s.metadata.namespace.clone()?, pod.clone()),
            s.metadata.name.clone()?,
        ))
    };
    match event {
        // A re-list starts over.
        watcher::Event::Init => index.clear(),
        watcher::Event::Apply(s) | watcher::Event::InitApply(s) => {
            if let Some((pod, name)) = entry(s) {
                let names = index.entry(pod).or_default();
                if !names.contains(&name) {
                    let mut more = std::mem::take(names).into_vec();
                    more.push(name);
                    *names = more.into_boxed_slice();
                }
            }
        }
        watcher::Event::Delete(s) => {
            if let Some((pod, name)) = entry(s)
                && let Some(names) = index.get_mut(&pod)
            {
                let left: Box<[String]> = names.iter().filter(|n| **n != name).cloned().collect();
                if left.is_empty() {
                    index.remove(&pod);
                } else {
                    *names = left;
                }
            }
        }
        watcher::Event::InitDone => {}
    }
}

/// The moment of the monotonic clock at wall-clock time `at` (now, if it has passed).
fn instant_at(at: Timestamp) -> tokio::time::Instant {
    let wait = at
        .duration_since(Timestamp::now())
        .try_into()
        .unwrap_or_default();
    tokio::time::Instant::now() + wait
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::sync_error::tests::api_error;
    use serde_json::json;
    use tensile_core::keys::ANNOTATION_UPPER_UID;

    #[test]
    fn token_errors_take_their_kind_from_what_failed() {
        let request = |code| TokenError::Request {
            namespace: "default".into(),
            service_account: "robot".into(),
            pod: "web".into(),
            source: Box::new(api_error(code, "")),
        };
        let kind = |e: TokenError| e.into_sync_error("default", "web", "a").kind();
        assert_eq!(kind(request(403)), "refused-by-upper");
        assert_eq!(kind(request(500)), "transient");
        assert_eq!(kind(request(404)), "missing-dependency");
        let write = TokenError::Write {
            namespace: "default".into(),
            secret: "s".into(),
            cluster: "a".into(),
            source: Box::new(api_error(422, "Invalid")),
        };
        assert_eq!(kind(write), "refused-by-lower");
        let no_ca = TokenError::NoCa {
            namespace: "default".into(),
        }
        .into_sync_error("default", "web", "a");
        assert_eq!(no_ca.kind(), "missing-dependency");
        assert!(
            no_ca.to_string().contains("default/kube-root-ca.crt"),
            "{no_ca}"
        );
        let not_ours = TokenError::NotOurs {
            namespace: "default".into(),
            secret: "s".into(),
            cluster: "a".into(),
        }
        .into_sync_error("default", "web", "a");
        assert_eq!(
            not_ours.to_string(),
            "a Secret default/s that is not ours exists in lower cluster a: it is never used for \
             an upper pod, and the pod waits until it is gone"
        );
    }

    /// The collection decodes only [`PodHead`] of each pod: it must decide as the whole pod
    /// does, in every state that matters (running, deleting, finished, another UID, the lower
    /// pod that mounts it or another's).
    #[test]
    fn the_head_of_a_pod_decides_its_secret_as_the_whole_pod_does() {
        let spec = json!({"containers": [{"name": "c", "image": "nginx",
            "volumeMounts": [{"name": "t", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}]}],
            "volumes": [{"name": "t", "projected": {"sources": [
                {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}}]}}]});
        let upper = |uid: &str, extra: serde_json::Value| -> serde_json::Value {
            let mut p = json!({"metadata": {"name": "web", "namespace": "default", "uid": uid,
                "labels": {"app": "web"}}, "spec": spec.clone(),
                "status": {"phase": "Running", "podIP": "10.0.0.1",
                    "conditions": [{"type": "Ready", "status": "True"}]}});
            json_patch(&mut p, extra);
            p
        };
        let lower = |uid: &str| -> serde_json::Value {
            json!({"metadata": {"name": "web", "namespace": "default", "uid": "l-1",
                "annotations": {ANNOTATION_UPPER_UID: uid}}, "spec": spec.clone(),
                "status": {"phase": "Running"}})
        };
        let full_pod: Pod = serde_json::from_value(upper("u-1", json!({}))).unwrap();
        let secret = tensile_core::identity::identity_secret(
            &full_pod,
            "vk-1",
            tensile_core::identity::Tokens::None,
            &[],
        )
        .unwrap();
        let uppers = [
            None,
            Some(upper("u-1", json!({}))),
            Some(upper("u-2", json!({}))),
            Some(upper("u-1", json!({"status": {"phase": "Succeeded"}}))),
            Some(upper("u-1", json!({"status": {"phase": "Failed"}}))),
            Some(upper("u-1", json!({"status": null}))),
            Some(upper(
                "u-1",
                json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}}),
            )),
        ];
        let lowers = [None, Some(lower("u-1")), Some(lower("u-2"))];
        let (mut kept, mut dropped) = (0, 0);
        for u in &uppers {
            for l in &lowers {
                let full = |v: &Option<serde_json::Value>| {
                    v.clone().map(|v| serde_json::from_value::<Pod>(v).unwrap())
                };
                let head = |v: &Option<serde_json::Value>| {
                    v.clone()
                        .map(|v| serde_json::from_value::<PodHead>(v).unwrap().into_pod())
                };
                let want = identity_secret_needed(&secret, full(u).as_ref(), full(l).as_ref());
                let got = identity_secret_needed(&secret, head(u).as_ref(), head(l).as_ref());
                assert_eq!(got, want, "upper {u:?}, lower {l:?}");
                if want { kept += 1 } else { dropped += 1 }
            }
        }
        // Both answers occur, so the comparison says something.
        assert!(kept > 0 && dropped > 0);
    }

    /// Merges `extra` into `v` (objects key by key, anything else replaced).
    fn json_patch(v: &mut serde_json::Value, extra: serde_json::Value) {
        match (v, extra) {
            (serde_json::Value::Object(a), serde_json::Value::Object(b)) => {
                for (k, e) in b {
                    json_patch(a.entry(k).or_insert(serde_json::Value::Null), e);
                }
            }
            (v, e) => *v = e,
        }
    }

    #[test]
    fn only_our_own_last_write_coming_back_is_not_planned_again() {
        let secret = |version: &str| -> Secret {
            serde_json::from_value(json!({"metadata": {"namespace": "default",
                "name": "tensile-identity-u-1", "resourceVersion": version}}))
            .unwrap()
        };
        let cache = CompactCache::<Secret>::new();
        for e in [watcher::Event::Init, watcher::Event::InitDone] {
            cache.apply_keys(&e);
        }
        let written: Mutex<HashMap<Key, String>> = Mutex::default();
        let key = Key::new("default", "tensile-identity-u-1");
        // Never written by us: planned.
        cache.apply_keys(&watcher::Event::Apply(secret("1")));
        assert!(!own_write(&written, &cache, &secret("1")));
        // Our write made version 2, and the watch shows it: not planned, once.
        written.lock().unwrap().insert(key.clone(), "2".into());
        cache.apply_keys(&watcher::Event::Apply(secret("2")));
        assert!(own_write(&written, &cache, &secret("2")));
        assert!(!own_write(&written, &cache, &secret("2")));
        // Someone else's version in between: planned.
        written.lock().unwrap().insert(key.clone(), "4".into());
        cache.apply_keys(&watcher::Event::Apply(secret("3")));
        assert!(!own_write(&written, &cache, &secret("3")));
        // Deleted (gone from the cache), even at our version: planned.
        written.lock().unwrap().insert(key, "5".into());
        cache.apply_keys(&watcher::Event::Delete(secret("5")));
        assert!(!own_write(&written, &cache, &secret("5")));
    }

    #[test]
    fn token_secrets_are_indexed_by_their_pod_until_deleted_or_relisted() {
        let secret = |uid: &str| -> Secret {
            serde_json::from_value(json!({"metadata": {"namespace": "default",
                "name": format!("tensile-identity-{uid}"),
                "annotations": {ANNOTATION_TOKEN_POD: "web"}}}))
            .unwrap()
        };
        let index: Mutex<SecretsByPod> = Mutex::default();
        let names = |index: &Mutex<SecretsByPod>| -> Option<Vec<String>> {
            let index = index.lock().unwrap();
            index.get(&Key::new("default", "web")).map(|n| n.to_vec())
        };
        index_secrets(&index, &watcher::Event::Apply(secret("u-1")));
        index_secrets(&index, &watcher::Event::Apply(secret("u-1")));
        assert_eq!(names(&index).unwrap(), ["tensile-identity-u-1"]);
        // A new pod of the same name, while the old one's Secret is still there.
        index_secrets(&index, &watcher::Event::InitApply(secret("u-2")));
        assert_eq!(
            names(&index).unwrap(),
            ["tensile-identity-u-1", "tensile-identity-u-2"]
        );
        index_secrets(&index, &watcher::Event::Delete(secret("u-1")));
        assert_eq!(names(&index).unwrap(), ["tensile-identity-u-2"]);
        index_secrets(&index, &watcher::Event::Delete(secret("u-2")));
        assert_eq!(names(&index), None);
        index_secrets(&index, &watcher::Event::Apply(secret("u-3")));
        index_secrets(&index, &watcher::Event::Init);
        assert_eq!(names(&index), None);
    }
}
