//! Which ConfigMaps, Secrets, PVCs and ServiceAccount a pod needs in the lower cluster, and what
//! the lower copies we create of them look like.
//!
//! Everything a pod refers to by name is looked up in the pod's own namespace, so the lower pod
//! only starts once those objects exist downstairs (reference 2.5 step 4 and 3, with its gaps
//! closed: projected sources, env references, `envFrom`, every volume plugin's secret and
//! ephemeral containers are collected too).
//!
//! Never collected:
//! - the ConfigMap `kube-root-ca.crt`: every namespace of every cluster has its own, and the upper
//!   one is the upper cluster's CA, meaningless (and misleading) downstairs;
//! - service-account token material (see [`is_service_account_token_volume`]): the pod
//!   translation strips those volumes and the lower cluster mounts its own token;
//! - generic `ephemeral` volumes: their PVC is created by the lower cluster's ephemeral-volume
//!   controller from the template in the pod, so there is nothing to copy.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    ConfigMap, EnvFromSource, EnvVar, LocalObjectReference, Namespace, PersistentVolumeClaim, Pod,
    PodSpec, Secret, ServiceAccount, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Serialize;

use crate::keys;

/// PVC annotations written by the upper cluster's PV controller and scheduler: they describe
/// the upper binding and would mislead the lower controllers.
pub const PVC_BINDING_ANNOTATIONS: &[&str] = &[
    "pv.kubernetes.io/bind-completed",
    "pv.kubernetes.io/bound-by-controller",
    keys::ANNOTATION_SELECTED_NODE,
    "volume.beta.kubernetes.io/storage-provisioner",
    "volume.kubernetes.io/storage-provisioner",
    // Set by the PV controller from its own CSI-migration config, which need not match downstairs.
    "pv.kubernetes.io/migrated-to",
];

/// Errors of the lower-copy builders.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DepsError {
    /// The secret holds an upper-cluster service-account token.
    #[error(
        "secret {namespace}/{name} is of type {type_}: it holds a token of the upper cluster and \
         is never copied; the lower ServiceAccount gets its own tokens from the lower cluster",
        type_ = keys::SECRET_TYPE_SERVICE_ACCOUNT_TOKEN
    )]
    ServiceAccountTokenSecret {
        /// Namespace of the upper secret.
        namespace: String,
        /// Name of the upper secret.
        name: String,
    },
}

/// How strongly a pod needs one object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct Need {
    /// True when every reference to the object is optional: the pod can start without it, so
    /// its absence upstairs is not an error (copy it if it exists).
    pub optional: bool,
}

impl Need {
    /// At least one reference requires the object.
    pub const MANDATORY: Need = Need { optional: false };
    /// Every reference tolerates the object's absence.
    pub const OPTIONAL: Need = Need { optional: true };

    /// The need of a reference with Kubernetes' `optional` field (absent means mandatory).
    pub fn from_optional(optional: Option<bool>) -> Need {
        Need {
            optional: optional.unwrap_or(false),
        }
    }

    /// Two references to the same object: optional only if both are.
    #[must_use]
    pub fn and(self, other: Need) -> Need {
        Need {
            optional: self.optional && other.optional,
        }
    }
}

/// The objects a pod needs, by name, in the pod's namespace. Maps are ordered so the result,
/// and anything derived from it (create order, logs, snapshots), is deterministic.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PodDependencies {
    /// ConfigMaps (never `kube-root-ca.crt`).
    pub config_maps: BTreeMap<String, Need>,
    /// Secrets (never service-account token volumes).
    pub secrets: BTreeMap<String, Need>,
    /// PersistentVolumeClaims of `persistentVolumeClaim` volumes (always mandatory).
    pub pvcs: BTreeMap<String, Need>,
    /// The pod's ServiceAccount: the lower admission rejects a pod whose ServiceAccount does not
    /// exist, whatever `automountServiceAccountToken` says, so there is always one.
    pub service_account: String,
}

impl PodDependencies {
    fn new(service_account: String) -> Self {
        PodDependencies {
            config_maps: BTreeMap::new(),
            secrets: BTreeMap::new(),
            pvcs: BTreeMap::new(),
            service_account,
        }
    }

    fn add_config_map(&mut self, name: &str, need: Need) {
        if name != keys::CONFIG_MAP_KUBE_ROOT_CA {
            add(&mut self.config_maps, name, need);
        }
    }

    fn add_secret(&mut self, name: &str, need: Need) {
        add(&mut self.secrets, name, need);
    }

    fn add_volume(&mut self, volume: &Volume) {
        if let Some(source) = &volume.config_map {
            self.add_config_map(&source.name, Need::from_optional(source.optional));
        }
        if let Some(source) = &volume.secret
            && let Some(name) = &source.secret_name
        {
            self.add_secret(name, Need::from_optional(source.optional));
        }
        for projection in volume
            .projected
            .iter()
            .flat_map(|p| p.sources.iter().flatten())
        {
            if let Some(source) = &projection.config_map {
                self.add_config_map(&source.name, Need::from_optional(source.optional));
            }
            if let Some(source) = &projection.secret {
                self.add_secret(&source.name, Need::from_optional(source.optional));
            }
        }
        if let Some(source) = &volume.persistent_volume_claim {
            add(&mut self.pvcs, &source.claim_name, Need::MANDATORY);
        }
        // Plugin credentials are mandatory: the mount fails without them. A missing reference
        // is simply no dependency (the original dereferenced it and panicked).
        let secret_refs: [Option<&LocalObjectReference>; 8] = [
            volume.cephfs.as_ref().and_then(|v| v.secret_ref.as_ref()),
            volume.cinder.as_ref().and_then(|v| v.secret_ref.as_ref()),
            volume.rbd.as_ref().and_then(|v| v.secret_ref.as_ref()),
            volume
                .flex_volume
                .as_ref()
                .and_then(|v| v.secret_ref.as_ref()),
            volume.iscsi.as_ref().and_then(|v| v.secret_ref.as_ref()),
            volume
                .storageos
                .as_ref()
                .and_then(|v| v.secret_ref.as_ref()),
            volume.scale_io.as_ref().map(|v| &v.secret_ref),
            volume
                .csi
                .as_ref()
                .and_then(|v| v.node_publish_secret_ref.as_ref()),
        ];
        for reference in secret_refs.into_iter().flatten() {
            self.add_secret(&reference.name, Need::MANDATORY);
        }
        if let Some(source) = &volume.azure_file {
            self.add_secret(&source.secret_name, Need::MANDATORY);
        }
        // `ephemeral` volumes are deliberately absent: see the module documentation.
    }

    fn add_env(&mut self, env: Option<&[EnvVar]>, env_from: Option<&[EnvFromSource]>) {
        for source in env
            .into_iter()
            .flatten()
            .filter_map(|e| e.value_from.as_ref())
        {
            if let Some(selector) = &source.config_map_key_ref {
                self.add_config_map(&selector.name, Need::from_optional(selector.optional));
            }
            if let Some(selector) = &source.secret_key_ref {
                self.add_secret(&selector.name, Need::from_optional(selector.optional));
            }
        }
        for source in env_from.into_iter().flatten() {
            if let Some(reference) = &source.config_map_ref {
                self.add_config_map(&reference.name, Need::from_optional(reference.optional));
            }
            if let Some(reference) = &source.secret_ref {
                self.add_secret(&reference.name, Need::from_optional(reference.optional));
            }
        }
    }
}

fn add(map: &mut BTreeMap<String, Need>, name: &str, need: Need) {
    if name.is_empty() {
        return;
    }
    map.entry(name.to_owned())
        .and_modify(|n| *n = n.and(need))
        .or_insert(need);
}

/// The ConfigMaps, Secrets, PVCs and ServiceAccount `pod` needs, in its namespace, from its
/// volumes, its containers', init containers' and ephemeral containers' `env` and `envFrom`, and
/// its `imagePullSecrets`.
///
/// `imagePullSecrets` are optional: the kubelet pulls without a missing pull secret (and only
/// warns), so a missing one must not hold the pod back either.
pub fn pod_dependencies(pod: &Pod) -> PodDependencies {
    let Some(spec) = pod.spec.as_ref() else {
        return PodDependencies::new(keys::SERVICE_ACCOUNT_DEFAULT.to_owned());
    };
    let mut deps = PodDependencies::new(pod_service_account(spec).to_owned());
    for volume in spec.volumes.iter().flatten() {
        if !is_service_account_token_volume(volume, spec) {
            deps.add_volume(volume);
        }
    }
    for container in spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
    {
        deps.add_env(container.env.as_deref(), container.env_from.as_deref());
    }
    for container in spec.ephemeral_containers.iter().flatten() {
        deps.add_env(container.env.as_deref(), container.env_from.as_deref());
    }
    for reference in spec.image_pull_secrets.iter().flatten() {
        deps.add_secret(&reference.name, Need::OPTIONAL);
    }
    deps
}

/// The pod's ServiceAccount: `serviceAccountName`, else the deprecated `serviceAccount`, else
/// `default` (what the API server's admission does; empty strings count as unset).
pub fn pod_service_account(spec: &PodSpec) -> &str {
    [&spec.service_account_name, &spec.service_account]
        .into_iter()
        .flatten()
        .map(String::as_str)
        .find(|name| !name.is_empty())
        .unwrap_or(keys::SERVICE_ACCOUNT_DEFAULT)
}

/// Whether `volume` of the pod `spec` carries upper-cluster service-account credentials: a
/// legacy token volume (name starting with `default-token`, or a `secret` volume mounted at
/// the service-account path in any container, init container or ephemeral container) or the
/// projected `kube-api-access-*` volume injected by the upper API server.
///
/// Such volumes are stripped from the lower pod with their mounts (the lower admission then
/// mounts a token of the lower cluster), and are never dependencies.
pub fn is_service_account_token_volume(volume: &Volume, spec: &PodSpec) -> bool {
    if volume.name.starts_with(keys::VOLUME_PREFIX_DEFAULT_TOKEN) {
        return true;
    }
    if volume.projected.is_some() && volume.name.starts_with(keys::VOLUME_PREFIX_KUBE_API_ACCESS) {
        return true;
    }
    volume.secret.is_some()
        && pod_volume_mounts(spec).any(|mount| {
            mount.name == volume.name
                && mount.mount_path.trim_end_matches('/') == keys::SERVICE_ACCOUNT_MOUNT_PATH
        })
}

fn pod_volume_mounts(spec: &PodSpec) -> impl Iterator<Item = &VolumeMount> {
    let containers = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .flat_map(|c| c.volume_mounts.iter().flatten());
    let ephemeral = spec
        .ephemeral_containers
        .iter()
        .flatten()
        .flat_map(|c| c.volume_mounts.iter().flatten());
    containers.chain(ephemeral)
}

/// Metadata of a lower copy: name, namespace, labels and annotations of the upper object and
/// nothing else (uid, resourceVersion, ownerReferences, finalizers, timestamps... belong to the
/// upper object), plus `global: "true"` and our ownership marks.
pub(crate) fn lower_meta(upper: &ObjectMeta, owner: &str) -> ObjectMeta {
    let mut annotations = upper.annotations.clone().unwrap_or_default();
    annotations.insert(
        keys::ANNOTATION_GLOBAL.to_owned(),
        keys::VALUE_TRUE.to_owned(),
    );
    match upper.uid.as_deref().filter(|uid| !uid.is_empty()) {
        Some(uid) => {
            annotations.insert(keys::ANNOTATION_UPPER_UID.to_owned(), uid.to_owned());
        }
        // Never let a stale value (copied from the upper object's own annotations) pose as ours.
        None => {
            annotations.remove(keys::ANNOTATION_UPPER_UID);
        }
    }
    let mut labels = upper.labels.clone().unwrap_or_default();
    labels.insert(keys::LABEL_OWNER.to_owned(), keys::owner_label_value(owner));
    ObjectMeta {
        name: upper.name.clone(),
        namespace: upper.namespace.clone(),
        labels: Some(labels),
        annotations: Some(annotations),
        ..ObjectMeta::default()
    }
}

/// Metadata of a lower object that mirrors no upper object: a name and our marks.
fn marked_meta(name: &str, namespace: Option<&str>, owner: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        namespace: namespace.map(str::to_owned),
        labels: Some(BTreeMap::from([(
            keys::LABEL_OWNER.to_owned(),
            keys::owner_label_value(owner),
        )])),
        annotations: Some(BTreeMap::from([(
            keys::ANNOTATION_GLOBAL.to_owned(),
            keys::VALUE_TRUE.to_owned(),
        )])),
        ..ObjectMeta::default()
    }
}

/// The lower copy of an upper ConfigMap, created by node `owner`: same namespace, name, data,
/// binaryData, immutable, labels and annotations; trimmed metadata; global and ownership marks.
pub fn lower_config_map(upper: &ConfigMap, owner: &str) -> ConfigMap {
    ConfigMap {
        metadata: lower_meta(&upper.metadata, owner),
        data: upper.data.clone(),
        binary_data: upper.binary_data.clone(),
        immutable: upper.immutable,
    }
}

/// The lower copy of an upper Secret, as [`lower_config_map`] plus `type` and `stringData`.
///
/// Refuses service-account-token secrets: their token authenticates against the upper cluster
/// and must never leave it (the original copied them, see reference 3.1). The pod gets the lower
/// ServiceAccount instead ([`lower_service_account`]), and the lower cluster issues its tokens.
pub fn lower_secret(upper: &Secret, owner: &str) -> Result<Secret, DepsError> {
    if upper.type_.as_deref() == Some(keys::SECRET_TYPE_SERVICE_ACCOUNT_TOKEN) {
        return Err(DepsError::ServiceAccountTokenSecret {
            namespace: upper.metadata.namespace.clone().unwrap_or_default(),
            name: upper.metadata.name.clone().unwrap_or_default(),
        });
    }
    Ok(Secret {
        metadata: lower_meta(&upper.metadata, owner),
        data: upper.data.clone(),
        string_data: upper.string_data.clone(),
        type_: upper.type_.clone(),
        immutable: upper.immutable,
    })
}

/// The lower ServiceAccount `namespace/name` created by node `owner`: only a name and our marks.
/// The lower token controller (or TokenRequest through the lower kubelet) gives it its own
/// tokens. Callers treat AlreadyExists as success: `default` always exists, and is not ours.
pub fn lower_service_account(name: &str, namespace: &str, owner: &str) -> ServiceAccount {
    ServiceAccount {
        metadata: marked_meta(name, Some(namespace), owner),
        ..ServiceAccount::default()
    }
}

/// The lower copy of an upper PVC, created by node `owner`.
///
/// The spec is copied (accessModes, resources, storageClassName, volumeMode, dataSource,
/// dataSourceRef, volumeAttributesClassName) except `volumeName`: an upper PV name means nothing
/// downstairs, and the lower cluster binds or provisions its own volume. `selector` is kept: it
/// is the user's constraint on which volume may be bound, and dropping it could bind any volume
/// silently; a lower cluster without matching PVs leaves the claim Pending, which is visible.
/// Status and the upper binding annotations ([`PVC_BINDING_ANNOTATIONS`]) are dropped.
pub fn lower_pvc(upper: &PersistentVolumeClaim, owner: &str) -> PersistentVolumeClaim {
    let mut metadata = lower_meta(&upper.metadata, owner);
    if let Some(annotations) = metadata.annotations.as_mut() {
        for key in PVC_BINDING_ANNOTATIONS {
            annotations.remove(*key);
        }
    }
    let spec = upper.spec.clone().map(|mut spec| {
        spec.volume_name = None;
        spec
    });
    PersistentVolumeClaim {
        metadata,
        spec,
        status: None,
    }
}

/// The lower Namespace `name` created by node `owner`, marked so we know we created it (we still
/// never delete namespaces: other tenants' objects may live there).
pub fn lower_namespace(name: &str, owner: &str) -> Namespace {
    Namespace {
        metadata: marked_meta(name, None, owner),
        ..Namespace::default()
    }
}

/// The label prefix of Pod Security admission (`enforce`, `audit`, `warn` and their
/// `-version`s): a lower namespace carries the upper namespace's, so the lower cluster admits
/// offloaded pods at the same level as the upper one did.
pub const POD_SECURITY_LABEL_PREFIX: &str = "pod-security.kubernetes.io/";

/// [`lower_namespace`] for the upper namespace `upper` (when it could be read): with its
/// `pod-security.kubernetes.io/*` labels, and nothing else of it.
pub fn lower_namespace_of(name: &str, owner: &str, upper: Option<&Namespace>) -> Namespace {
    let mut ns = lower_namespace(name, owner);
    let pod_security = upper
        .and_then(|u| u.metadata.labels.as_ref())
        .into_iter()
        .flatten()
        .filter(|(k, _)| k.starts_with(POD_SECURITY_LABEL_PREFIX));
    if let Some(labels) = ns.metadata.labels.as_mut() {
        labels.extend(pod_security.map(|(k, v)| (k.clone(), v.clone())));
    }
    ns
}

/// `timeoutSeconds` of the watch of one object pods reference (`kind`, `namespace`, `name`):
/// from 5 to 10 minutes, as the kubelet's reflectors ask (client-go draws it at random for each
/// watch), phased by the object. A client's default (kube's 290 s for every watch) ends the
/// watches started together (a restart starts thousands at once) together again every 290 s, a
/// herd of watch requests upstairs each time; with a period of its own per object they drift
/// apart, and each object costs a watch request every 7.5 minutes on average.
pub fn object_watch_timeout(kind: &str, namespace: &str, name: &str) -> u32 {
    const SHORTEST: u64 = 300;
    const SPREAD: u64 = 300;
    let key = format!("{kind}/{namespace}/{name}");
    let seconds = SHORTEST + keys::stable_hash(key.as_bytes()) % SPREAD;
    u32::try_from(seconds).unwrap_or(u32::MAX)
}

/// Whether a creation in a namespace failed because that namespace is missing or being deleted,
/// from the API server's answer: its code, the kind its details name, the types of its causes
/// and its message. Only then may the namespace have to be created again; after any other
/// failure (a timeout, a conflict, a missing ConfigMap, a quota) it is still there, and
/// creating it again costs two requests and changes nothing. Creating in a missing namespace is
/// `404 namespaces "x" not found`; in one being deleted, `403 ... because it is being
/// terminated` with the cause `NamespaceTerminating`.
pub fn namespace_gone(code: u16, details_kind: &str, causes: &[&str], message: &str) -> bool {
    match code {
        404 => details_kind == "namespaces",
        403 => {
            causes.contains(&"NamespaceTerminating")
                || message.contains("because it is being terminated")
        }
        _ => false,
    }
}

/// Whether node `owner` owns the lower object with metadata `meta`: the check every writer makes
/// before updating or deleting a lower object. Objects without our label are never ours.
pub fn is_owned_by(meta: &ObjectMeta, owner: &str) -> bool {
    meta.labels
        .as_ref()
        .and_then(|labels| labels.get(keys::LABEL_OWNER))
        .is_some_and(|value| *value == keys::owner_label_value(owner))
}

/// Whether the lower ConfigMap differs from the `desired` copy ([`lower_config_map`]) in data,
/// binaryData, labels or the desired annotations (annotations added downstairs are tolerated).
/// An immutable lower copy that differs must be replaced (delete, create), not updated.
pub fn config_map_needs_update(lower: &ConfigMap, desired: &ConfigMap) -> bool {
    non_empty(&lower.data) != non_empty(&desired.data)
        || non_empty(&lower.binary_data) != non_empty(&desired.binary_data)
        || meta_differs(&lower.metadata, &desired.metadata)
}

/// Whether the lower Secret differs from the `desired` copy ([`lower_secret`]) in data, type,
/// labels or the desired annotations. `stringData` is not compared: the API server folds it into
/// `data` and never returns it. A changed type (immutable), or an immutable lower copy that
/// differs, must be replaced (delete, create), not updated.
pub fn secret_needs_update(lower: &Secret, desired: &Secret) -> bool {
    non_empty(&lower.data) != non_empty(&desired.data)
        || secret_type(lower) != secret_type(desired)
        || meta_differs(&lower.metadata, &desired.metadata)
}

/// The API server reports no type as `Opaque`.
fn secret_type(secret: &Secret) -> &str {
    secret
        .type_
        .as_deref()
        .filter(|t| !t.is_empty())
        .unwrap_or("Opaque")
}

/// An absent map and an empty one are the same to the API server.
pub(crate) fn non_empty<V>(map: &Option<BTreeMap<String, V>>) -> Option<&BTreeMap<String, V>> {
    map.as_ref().filter(|m| !m.is_empty())
}

pub(crate) fn meta_differs(lower: &ObjectMeta, desired: &ObjectMeta) -> bool {
    if non_empty(&lower.labels) != non_empty(&desired.labels) {
        return true;
    }
    let lower_annotations = lower.annotations.as_ref();
    desired
        .annotations
        .iter()
        .flatten()
        .any(|(key, value)| lower_annotations.and_then(|a| a.get(key)) != Some(value))
}

/// What to do with a lower ConfigMap or Secret when it or its upper original changed (the
/// ConfigMap and Secret controller; its fixes of the original are in `docs/differences.md`).
#[derive(Clone, Debug, PartialEq)]
pub enum CopyAction<T> {
    /// Nothing: in step, or not ours (never touched).
    Nothing,
    /// Create this: our copy is missing, and its upper object is mirrored (Services and
    /// Endpoints) or a pod of ours needs it (ConfigMaps, Secrets, claims).
    Create(T),
    /// Write this (the lower object's `resourceVersion` set, so a concurrent change conflicts).
    Update(T),
    /// Delete the lower object (with its UID as precondition), then create this: an immutable
    /// copy, or a Secret whose type changed, cannot be updated.
    Replace(T),
    /// Delete the lower object (with its UID as precondition): its original is gone.
    Delete,
}

/// [`CopyAction`] for our lower ConfigMap `lower` given its upper original, if any: this only
/// follows originals of copies that exist ([`dependency_action`] creates missing ones).
pub fn config_map_action(
    upper: Option<&ConfigMap>,
    lower: &ConfigMap,
    owner: &str,
) -> CopyAction<ConfigMap> {
    if !is_owned_by(&lower.metadata, owner) {
        return CopyAction::Nothing;
    }
    let Some(upper) = upper.filter(|u| u.metadata.deletion_timestamp.is_none()) else {
        return CopyAction::Delete;
    };
    let mut desired = lower_config_map(upper, owner);
    if !config_map_needs_update(lower, &desired) {
        return CopyAction::Nothing;
    }
    if lower.immutable == Some(true) {
        return CopyAction::Replace(desired);
    }
    desired.metadata.resource_version = lower.metadata.resource_version.clone();
    CopyAction::Update(desired)
}

/// [`CopyAction`] for our lower Secret `lower` given its upper original, if any.
pub fn secret_action(upper: Option<&Secret>, lower: &Secret, owner: &str) -> CopyAction<Secret> {
    if !is_owned_by(&lower.metadata, owner) {
        return CopyAction::Nothing;
    }
    let Some(upper) = upper.filter(|u| u.metadata.deletion_timestamp.is_none()) else {
        return CopyAction::Delete;
    };
    // A service-account token secret is never copied; a copy of one cannot exist, so none of
    // ours is kept under its name.
    let Ok(mut desired) = lower_secret(upper, owner) else {
        return CopyAction::Delete;
    };
    if !secret_needs_update(lower, &desired) {
        return CopyAction::Nothing;
    }
    if lower.immutable == Some(true) || secret_type(lower) != secret_type(&desired) {
        return CopyAction::Replace(desired);
    }
    desired.metadata.resource_version = lower.metadata.resource_version.clone();
    CopyAction::Update(desired)
}

/// A ConfigMap or Secret as the copy controller handles it: how a copy follows its original,
/// and how a copy is made.
pub trait DependencyCopy: Sized {
    /// [`config_map_action`] or [`secret_action`].
    fn follow(upper: Option<&Self>, lower: &Self, owner: &str) -> CopyAction<Self>;
    /// The lower copy of `upper`, if it may be copied at all.
    fn copy_of(upper: &Self, owner: &str) -> Option<Self>;
    /// Its metadata.
    fn meta(&self) -> &ObjectMeta;
}

impl DependencyCopy for ConfigMap {
    fn follow(upper: Option<&Self>, lower: &Self, owner: &str) -> CopyAction<Self> {
        config_map_action(upper, lower, owner)
    }
    fn copy_of(upper: &Self, owner: &str) -> Option<Self> {
        Some(lower_config_map(upper, owner))
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
}

impl DependencyCopy for Secret {
    fn follow(upper: Option<&Self>, lower: &Self, owner: &str) -> CopyAction<Self> {
        secret_action(upper, lower, owner)
    }
    fn copy_of(upper: &Self, owner: &str) -> Option<Self> {
        lower_secret(upper, owner).ok()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
}

/// [`CopyAction`] for a ConfigMap or Secret `namespace/name` given the upper original, our lower
/// copy (either may be absent) and whether any of our pods (upper pods bound to the node, or
/// lower pods of ours still running or terminating) needs it:
/// - a copy that is not ours: never touched;
/// - our copy of an original that is gone, or that no pod needs any more: deleted (garbage
///   collection of copies no pod needs, which the original never did);
/// - our copy otherwise follows its original ([`config_map_action`], [`secret_action`]);
/// - a needed copy that is missing (deleted by hand, or lost in a race with a deletion) is
///   created again, so a lower pod waiting for its volume is not stuck.
pub fn dependency_action<T: DependencyCopy>(
    upper: Option<&T>,
    lower: Option<&T>,
    owner: &str,
    needed: bool,
) -> CopyAction<T> {
    let upper = upper.filter(|u| u.meta().deletion_timestamp.is_none());
    match lower {
        Some(lower) if !is_owned_by(lower.meta(), owner) => CopyAction::Nothing,
        Some(_) if !needed && upper.is_some() => CopyAction::Delete,
        Some(lower) => T::follow(upper, lower, owner),
        None => match upper.filter(|_| needed).and_then(|u| T::copy_of(u, owner)) {
            Some(copy) => CopyAction::Create(copy),
            None => CopyAction::Nothing,
        },
    }
}

/// The ConfigMaps, Secrets and PVCs of `pod`'s namespace that its lower copy needs, as
/// `(kind, name)`; the dependency index of the copy controller counts them per pod.
pub fn needed_copies(pod: &Pod) -> Vec<(CopyKind, String)> {
    let deps = pod_dependencies(pod);
    let named =
        |kind: CopyKind, map: BTreeMap<String, Need>| map.into_keys().map(move |name| (kind, name));
    named(CopyKind::ConfigMap, deps.config_maps)
        .chain(named(CopyKind::Secret, deps.secrets))
        .chain(named(CopyKind::PersistentVolumeClaim, deps.pvcs))
        .collect()
}

/// The kinds of lower copies a pod may need.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CopyKind {
    /// A ConfigMap.
    ConfigMap,
    /// A Secret.
    Secret,
    /// A PersistentVolumeClaim.
    PersistentVolumeClaim,
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;
    use pretty_assertions::assert_eq;
    use serde_json::{Value, json};

    const OWNER: &str = "vk-lower-a";

    #[test]
    fn object_watches_end_spread_over_five_minutes() {
        let timeouts: Vec<u32> = (0..10_000)
            .map(|i| object_watch_timeout("Secret", "shop", &format!("cfg-{i}")))
            .collect();
        assert!(timeouts.iter().all(|t| (300..600).contains(t)));
        // Watches started at one instant end spread evenly: 30 s buckets of 1,000 on average,
        // none above 1.25 times that.
        let mut buckets = [0_u32; 10];
        for t in &timeouts {
            buckets[usize::try_from((t - 300) / 30).unwrap()] += 1;
        }
        assert!(buckets.iter().all(|n| *n <= 1250), "{buckets:?}");
        // The same object, the same period; another kind of the same name, its own.
        assert_eq!(object_watch_timeout("Secret", "shop", "cfg-1"), timeouts[1]);
        let kinds = (0..100)
            .filter(|i| {
                let name = format!("cfg-{i}");
                object_watch_timeout("ConfigMap", "shop", &name)
                    != object_watch_timeout("Secret", "shop", &name)
            })
            .count();
        assert!(kinds >= 95, "{kinds}");
    }

    #[test]
    fn a_namespace_is_gone_only_when_the_answer_says_so() {
        let terminating = "pods \"web\" is forbidden: unable to create new content in \
            namespace shop because it is being terminated";
        assert!(namespace_gone(
            404,
            "namespaces",
            &[],
            "namespaces \"shop\" not found"
        ));
        assert!(namespace_gone(
            403,
            "pods",
            &["NamespaceTerminating"],
            "forbidden"
        ));
        assert!(namespace_gone(403, "pods", &[], terminating));
        // Failures that leave the namespace where it was.
        assert!(!namespace_gone(
            404,
            "configmaps",
            &[],
            "configmaps \"cfg\" not found"
        ));
        assert!(!namespace_gone(
            409,
            "pods",
            &[],
            "pods \"web\" already exists"
        ));
        assert!(!namespace_gone(403, "pods", &[], "exceeded quota: compute"));
        assert!(!namespace_gone(
            500,
            "",
            &[],
            "etcdserver: request timed out"
        ));
        assert!(!namespace_gone(
            504,
            "",
            &[],
            "Timeout: request did not complete"
        ));
    }

    fn pod(spec: Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "web-0", "namespace": "shop", "uid": "pod-uid"},
            "spec": spec,
        }))
        .unwrap()
    }

    fn container(extra: Value) -> Value {
        let mut c = json!({"name": "app", "image": "nginx"});
        if let (Some(c), Some(extra)) = (c.as_object_mut(), extra.as_object()) {
            c.extend(extra.clone());
        }
        c
    }

    fn names(map: &BTreeMap<String, Need>) -> Vec<&str> {
        map.keys().map(String::as_str).collect()
    }

    fn upper_meta() -> Value {
        json!({
            "name": "settings",
            "namespace": "shop",
            "uid": "upper-uid-1",
            "resourceVersion": "42",
            "selfLink": "/api/v1/namespaces/shop/configmaps/settings",
            "generation": 3,
            "generateName": "settings-",
            "creationTimestamp": "2024-01-01T00:00:00Z",
            "deletionTimestamp": "2024-01-02T00:00:00Z",
            "deletionGracePeriodSeconds": 30,
            "finalizers": ["example.com/keep"],
            "ownerReferences": [{
                "apiVersion": "apps/v1", "kind": "Deployment", "name": "web", "uid": "dep-uid"
            }],
            "managedFields": [{"manager": "kubectl", "operation": "Apply"}],
            "labels": {"app": "web"},
            "annotations": {"team": "payments"},
        })
    }

    /// Everything but name, namespace, labels and annotations is gone.
    fn assert_trimmed(meta: &ObjectMeta) {
        let expected = ObjectMeta {
            name: meta.name.clone(),
            namespace: meta.namespace.clone(),
            labels: meta.labels.clone(),
            annotations: meta.annotations.clone(),
            ..ObjectMeta::default()
        };
        assert_eq!(meta, &expected);
    }

    fn label<'a>(meta: &'a ObjectMeta, key: &str) -> Option<&'a str> {
        meta.labels.as_ref()?.get(key).map(String::as_str)
    }

    fn annotation<'a>(meta: &'a ObjectMeta, key: &str) -> Option<&'a str> {
        meta.annotations.as_ref()?.get(key).map(String::as_str)
    }

    #[test]
    fn checklist_30_configmap_volume_is_a_dependency() {
        let deps = pod_dependencies(&pod(json!({
            "containers": [container(json!({}))],
            "volumes": [{"name": "conf", "configMap": {"name": "settings"}}],
        })));
        assert_eq!(
            deps.config_maps,
            BTreeMap::from([("settings".to_owned(), Need::MANDATORY)])
        );
        assert!(deps.secrets.is_empty());
        assert!(deps.pvcs.is_empty());
    }

    #[test]
    fn checklist_30_configmap_copy_has_global_annotation_and_no_uid_or_owner_refs() {
        let upper: ConfigMap = serde_json::from_value(json!({
            "metadata": upper_meta(),
            "data": {"a": "1"},
            "binaryData": {"b": "AAE="},
            "immutable": true,
        }))
        .unwrap();
        let lower = lower_config_map(&upper, OWNER);

        assert_trimmed(&lower.metadata);
        assert_eq!(lower.metadata.name.as_deref(), Some("settings"));
        assert_eq!(lower.metadata.namespace.as_deref(), Some("shop"));
        assert_eq!(lower.metadata.uid, None);
        assert_eq!(lower.metadata.owner_references, None);
        assert_eq!(
            annotation(&lower.metadata, keys::ANNOTATION_GLOBAL),
            Some("true")
        );
        assert_eq!(
            annotation(&lower.metadata, keys::ANNOTATION_UPPER_UID),
            Some("upper-uid-1")
        );
        assert_eq!(annotation(&lower.metadata, "team"), Some("payments"));
        assert_eq!(label(&lower.metadata, "app"), Some("web"));
        assert_eq!(label(&lower.metadata, keys::LABEL_OWNER), Some(OWNER));
        assert_eq!(lower.data, upper.data);
        assert_eq!(
            lower.binary_data,
            Some(BTreeMap::from([("b".into(), ByteString(vec![0, 1]))]))
        );
        assert_eq!(lower.immutable, Some(true));
        assert!(is_owned_by(&lower.metadata, OWNER));
    }

    #[test]
    fn lower_copy_of_an_upper_object_without_uid_has_no_upper_uid_and_our_owner_wins() {
        let upper: ConfigMap = serde_json::from_value(json!({
            "metadata": {
                "name": "c", "namespace": "n",
                "labels": {(keys::LABEL_OWNER): "someone-else"},
                "annotations": {(keys::ANNOTATION_UPPER_UID): "stale"},
            },
        }))
        .unwrap();
        let lower = lower_config_map(&upper, OWNER);
        assert_eq!(
            annotation(&lower.metadata, keys::ANNOTATION_UPPER_UID),
            None
        );
        assert_eq!(label(&lower.metadata, keys::LABEL_OWNER), Some(OWNER));
        assert_eq!(lower.data, None);
    }

    #[test]
    fn checklist_32_secret_volumes_cephfs_cinder_rbd_secret_refs_and_image_pull_secrets_are_dependencies()
     {
        let deps = pod_dependencies(&pod(json!({
            "containers": [container(json!({}))],
            "imagePullSecrets": [{"name": "registry"}],
            "volumes": [
                {"name": "creds", "secret": {"secretName": "db-creds"}},
                {"name": "ceph", "cephfs": {"monitors": ["m:6789"], "secretRef": {"name": "ceph-key"}}},
                {"name": "cinder", "cinder": {"volumeID": "v1", "secretRef": {"name": "cinder-key"}}},
                {"name": "rbd", "rbd": {"monitors": ["m"], "image": "i", "secretRef": {"name": "rbd-key"}}},
            ],
        })));
        assert_eq!(
            names(&deps.secrets),
            ["ceph-key", "cinder-key", "db-creds", "rbd-key", "registry"]
        );
        assert_eq!(deps.secrets["db-creds"], Need::MANDATORY);
        assert_eq!(deps.secrets["ceph-key"], Need::MANDATORY);
        // A missing pull secret only makes the kubelet warn: never blocking.
        assert_eq!(deps.secrets["registry"], Need::OPTIONAL);
        assert!(deps.config_maps.is_empty());
    }

    #[test]
    fn fix_nil_secret_ref_on_cephfs_rbd_cinder_is_no_dependency_and_no_panic() {
        let deps = pod_dependencies(&pod(json!({
            "containers": [container(json!({}))],
            "volumes": [
                {"name": "ceph", "cephfs": {"monitors": ["m:6789"]}},
                {"name": "cinder", "cinder": {"volumeID": "v1"}},
                {"name": "rbd", "rbd": {"monitors": ["m"], "image": "i"}},
                {"name": "flex", "flexVolume": {"driver": "d"}},
                {"name": "iscsi", "iscsi": {"targetPortal": "p", "iqn": "q", "lun": 0}},
                {"name": "sos", "storageos": {}},
                {"name": "csi", "csi": {"driver": "d"}},
                {"name": "nosecret", "secret": {}},
            ],
        })));
        assert!(deps.secrets.is_empty(), "{:?}", deps.secrets);
    }

    #[test]
    fn every_volume_plugin_secret_ref_is_a_mandatory_dependency() {
        let deps = pod_dependencies(&pod(json!({
            "containers": [container(json!({}))],
            "volumes": [
                {"name": "flex", "flexVolume": {"driver": "d", "secretRef": {"name": "flex"}}},
                {"name": "iscsi", "iscsi": {
                    "targetPortal": "p", "iqn": "q", "lun": 0, "secretRef": {"name": "chap"}
                }},
                {"name": "sio", "scaleIO": {
                    "gateway": "g", "system": "s", "secretRef": {"name": "scaleio"}
                }},
                {"name": "sos", "storageos": {"secretRef": {"name": "storageos"}}},
                {"name": "az", "azureFile": {"secretName": "azure", "shareName": "s"}},
                {"name": "csi", "csi": {"driver": "d", "nodePublishSecretRef": {"name": "csi"}}},
            ],
        })));
        assert_eq!(
            names(&deps.secrets),
            ["azure", "chap", "csi", "flex", "scaleio", "storageos"]
        );
        assert!(deps.secrets.values().all(|n| *n == Need::MANDATORY));
    }

    #[test]
    fn projected_config_map_and_secret_sources_are_dependencies_other_sources_are_not() {
        let deps = pod_dependencies(&pod(json!({
            "containers": [container(json!({}))],
            "volumes": [{"name": "bundle", "projected": {"sources": [
                {"configMap": {"name": "proj-cm"}},
                {"secret": {"name": "proj-secret", "optional": true}},
                {"downwardAPI": {"items": [{"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]}},
                {"serviceAccountToken": {"path": "token", "audience": "vault"}},
                {"clusterTrustBundle": {"path": "ca.pem", "signerName": "example.com/s"}},
            ]}}],
        })));
        assert_eq!(
            deps.config_maps,
            BTreeMap::from([("proj-cm".to_owned(), Need::MANDATORY)])
        );
        assert_eq!(
            deps.secrets,
            BTreeMap::from([("proj-secret".to_owned(), Need::OPTIONAL)])
        );
    }

    #[test]
    fn env_key_refs_and_env_from_are_dependencies_in_containers_init_and_ephemeral_containers() {
        let deps = pod_dependencies(&pod(json!({
            "containers": [container(json!({
                "env": [
                    {"name": "PLAIN", "value": "x"},
                    {"name": "FIELD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                    {"name": "A", "valueFrom": {"configMapKeyRef": {"name": "c-env", "key": "k"}}},
                    {"name": "B", "valueFrom": {"secretKeyRef": {"name": "s-env", "key": "k"}}},
                ],
                "envFrom": [{"configMapRef": {"name": "c-from"}}, {"secretRef": {"name": "s-from"}}],
            }))],
            "initContainers": [container(json!({
                "name": "init",
                "envFrom": [{"prefix": "P_", "configMapRef": {"name": "c-init"}}],
            }))],
            "ephemeralContainers": [container(json!({
                "name": "debug",
                "env": [{"name": "C", "valueFrom": {"secretKeyRef": {"name": "s-debug", "key": "k"}}}],
            }))],
        })));
        assert_eq!(names(&deps.config_maps), ["c-env", "c-from", "c-init"]);
        assert_eq!(names(&deps.secrets), ["s-debug", "s-env", "s-from"]);
    }

    #[test]
    fn an_object_is_optional_only_when_every_reference_is_optional() {
        let deps = pod_dependencies(&pod(json!({
            "containers": [container(json!({
                "env": [
                    {"name": "A", "valueFrom": {"configMapKeyRef": {"name": "mixed", "key": "k", "optional": true}}},
                    {"name": "B", "valueFrom": {"secretKeyRef": {"name": "opt", "key": "k", "optional": true}}},
                    {"name": "C", "valueFrom": {"secretKeyRef": {"name": "explicit", "key": "k", "optional": false}}},
                ],
                "envFrom": [{"secretRef": {"name": "opt", "optional": true}}],
            }))],
            "imagePullSecrets": [{"name": "pull"}, {"name": "mounted-too"}],
            "volumes": [
                {"name": "m", "configMap": {"name": "mixed"}},
                {"name": "o", "configMap": {"name": "only-opt", "optional": true}},
                {"name": "s", "secret": {"secretName": "mounted-too"}},
            ],
        })));
        assert_eq!(deps.config_maps["mixed"], Need::MANDATORY);
        assert_eq!(deps.config_maps["only-opt"], Need::OPTIONAL);
        assert_eq!(deps.secrets["opt"], Need::OPTIONAL);
        assert_eq!(deps.secrets["explicit"], Need::MANDATORY);
        assert_eq!(deps.secrets["pull"], Need::OPTIONAL);
        // A pull secret also mounted as a volume is needed by the mount.
        assert_eq!(deps.secrets["mounted-too"], Need::MANDATORY);
    }

    #[test]
    fn need_combination_is_mandatory_unless_both_optional() {
        assert_eq!(Need::OPTIONAL.and(Need::OPTIONAL), Need::OPTIONAL);
        assert_eq!(Need::OPTIONAL.and(Need::MANDATORY), Need::MANDATORY);
        assert_eq!(Need::MANDATORY.and(Need::OPTIONAL), Need::MANDATORY);
        assert_eq!(Need::from_optional(None), Need::MANDATORY);
        assert_eq!(Need::from_optional(Some(true)), Need::OPTIONAL);
    }

    #[test]
    fn kube_root_ca_config_map_is_never_a_dependency() {
        let root = keys::CONFIG_MAP_KUBE_ROOT_CA;
        let deps = pod_dependencies(&pod(json!({
            "containers": [container(json!({
                "env": [{"name": "CA", "valueFrom": {"configMapKeyRef": {"name": root, "key": "ca.crt"}}}],
                "envFrom": [{"configMapRef": {"name": root}}],
            }))],
            "volumes": [
                {"name": "ca", "configMap": {"name": root}},
                {"name": "my-projection", "projected": {"sources": [{"configMap": {"name": root}}]}},
            ],
        })));
        assert!(deps.config_maps.is_empty(), "{:?}", deps.config_maps);
    }

    #[test]
    fn checklist_25_default_token_volumes_are_token_material_and_not_dependencies() {
        let p = pod(json!({
            "containers": [container(json!({
                "volumeMounts": [{"name": "default-token-abcde", "mountPath": "/token"}],
            }))],
            "volumes": [{"name": "default-token-abcde", "secret": {"secretName": "default-token-abcde"}}],
        }));
        let spec = p.spec.as_ref().unwrap();
        let volumes = spec.volumes.as_ref().unwrap();
        assert!(is_service_account_token_volume(&volumes[0], spec));
        assert!(pod_dependencies(&p).secrets.is_empty());
    }

    #[test]
    fn secret_volume_mounted_at_the_service_account_path_in_any_container_is_token_material() {
        let sa_path = keys::SERVICE_ACCOUNT_MOUNT_PATH;
        for (field, path) in [
            ("containers", sa_path.to_owned()),
            ("initContainers", format!("{sa_path}/")),
            ("ephemeralContainers", sa_path.to_owned()),
        ] {
            let mut spec = json!({
                "containers": [container(json!({}))],
                "volumes": [{"name": "builder-token", "secret": {"secretName": "builder-token-x1"}}],
            });
            let mounting = container(json!({
                "name": "mounting",
                "volumeMounts": [{"name": "builder-token", "mountPath": path}],
            }));
            match spec[field].as_array_mut() {
                Some(list) => list.push(mounting),
                None => spec[field] = json!([mounting]),
            }
            let p = pod(spec);
            let spec = p.spec.as_ref().unwrap();
            let volume = &spec.volumes.as_ref().unwrap()[0];
            assert!(is_service_account_token_volume(volume, spec), "{field}");
            assert!(pod_dependencies(&p).secrets.is_empty(), "{field}");
        }
    }

    #[test]
    fn secret_volume_mounted_elsewhere_or_unmounted_is_an_ordinary_dependency() {
        let p = pod(json!({
            "containers": [container(json!({
                "volumeMounts": [
                    {"name": "tls", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount-extra"},
                ],
            }))],
            "volumes": [
                {"name": "tls", "secret": {"secretName": "tls"}},
                {"name": "spare", "secret": {"secretName": "spare"}},
            ],
        }));
        let spec = p.spec.as_ref().unwrap();
        for volume in spec.volumes.as_ref().unwrap() {
            assert!(
                !is_service_account_token_volume(volume, spec),
                "{}",
                volume.name
            );
        }
        assert_eq!(names(&pod_dependencies(&p).secrets), ["spare", "tls"]);
    }

    #[test]
    fn kube_api_access_projected_volume_is_token_material_and_its_sources_are_not_dependencies() {
        let p = pod(json!({
            "containers": [container(json!({
                "volumeMounts": [{
                    "name": "kube-api-access-x7k2p",
                    "mountPath": keys::SERVICE_ACCOUNT_MOUNT_PATH,
                    "readOnly": true,
                }],
            }))],
            "volumes": [
                {"name": "kube-api-access-x7k2p", "projected": {"sources": [
                    {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
                    {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                    {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]}},
                    // Not injected by the API server, but the volume as a whole is token material.
                    {"secret": {"name": "inside-token-volume"}},
                ]}},
                // The prefix only means token material on a projected volume.
                {"name": "kube-api-access-notes", "configMap": {"name": "notes"}},
            ],
        }));
        let spec = p.spec.as_ref().unwrap();
        let volumes = spec.volumes.as_ref().unwrap();
        assert!(is_service_account_token_volume(&volumes[0], spec));
        assert!(!is_service_account_token_volume(&volumes[1], spec));
        let deps = pod_dependencies(&p);
        assert!(deps.secrets.is_empty());
        assert_eq!(names(&deps.config_maps), ["notes"]);
    }

    #[test]
    fn empty_names_are_ignored() {
        let deps = pod_dependencies(&pod(json!({
            "containers": [container(json!({
                "env": [{"name": "A", "valueFrom": {"configMapKeyRef": {"name": "", "key": "k"}}}],
                "envFrom": [{"secretRef": {"name": ""}}],
            }))],
            "imagePullSecrets": [{"name": ""}],
            "volumes": [
                {"name": "a", "configMap": {"name": ""}},
                {"name": "b", "secret": {"secretName": ""}},
                {"name": "c", "persistentVolumeClaim": {"claimName": ""}},
                {"name": "d", "azureFile": {"secretName": "", "shareName": "s"}},
                {"name": "e", "scaleIO": {"gateway": "g", "system": "s", "secretRef": {}}},
            ],
        })));
        assert!(deps.config_maps.is_empty());
        assert!(deps.secrets.is_empty());
        assert!(deps.pvcs.is_empty());
    }

    #[test]
    fn generic_ephemeral_volumes_are_not_dependencies() {
        let deps = pod_dependencies(&pod(json!({
            "containers": [container(json!({}))],
            "volumes": [{"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "1Gi"}},
            }}}}],
        })));
        assert!(deps.pvcs.is_empty());
    }

    #[test]
    fn service_account_is_service_account_name_else_deprecated_field_else_default() {
        let sa = |spec: Value| pod_dependencies(&pod(spec)).service_account;
        let c = [container(json!({}))];
        assert_eq!(
            sa(json!({"containers": c, "serviceAccountName": "a", "serviceAccount": "b"})),
            "a"
        );
        assert_eq!(
            sa(json!({"containers": c, "serviceAccountName": "", "serviceAccount": "b"})),
            "b"
        );
        assert_eq!(sa(json!({"containers": c, "serviceAccount": "b"})), "b");
        assert_eq!(
            sa(json!({"containers": c, "serviceAccount": ""})),
            "default"
        );
        assert_eq!(sa(json!({"containers": c})), "default");
        let no_spec = Pod::default();
        assert_eq!(pod_dependencies(&no_spec).service_account, "default");
        assert!(pod_dependencies(&no_spec).secrets.is_empty());
    }

    #[test]
    fn checklist_35_pvc_volume_is_a_dependency_and_its_copy_is_global() {
        let deps = pod_dependencies(&pod(json!({
            "containers": [container(json!({}))],
            "volumes": [
                {"name": "data", "persistentVolumeClaim": {"claimName": "data-web-0"}},
                {"name": "again", "persistentVolumeClaim": {"claimName": "data-web-0", "readOnly": true}},
            ],
        })));
        assert_eq!(
            deps.pvcs,
            BTreeMap::from([("data-web-0".to_owned(), Need::MANDATORY)])
        );

        let upper: PersistentVolumeClaim = serde_json::from_value(json!({
            "metadata": {"name": "data-web-0", "namespace": "shop", "uid": "pvc-uid"},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
        }))
        .unwrap();
        let lower = lower_pvc(&upper, OWNER);
        assert_eq!(
            annotation(&lower.metadata, keys::ANNOTATION_GLOBAL),
            Some("true")
        );
        assert_eq!(
            annotation(&lower.metadata, keys::ANNOTATION_UPPER_UID),
            Some("pvc-uid")
        );
        assert!(is_owned_by(&lower.metadata, OWNER));
    }

    #[test]
    fn pvc_copy_drops_volume_name_binding_annotations_and_status_and_keeps_the_rest_of_the_spec() {
        let upper: PersistentVolumeClaim = serde_json::from_value(json!({
            "metadata": {
                "name": "data", "namespace": "shop", "uid": "pvc-uid", "resourceVersion": "7",
                "finalizers": ["kubernetes.io/pvc-protection"],
                "annotations": {
                    "pv.kubernetes.io/bind-completed": "yes",
                    "pv.kubernetes.io/bound-by-controller": "yes",
                    "volume.kubernetes.io/selected-node": "vk-lower-a",
                    "volume.beta.kubernetes.io/storage-provisioner": "ebs.csi.aws.com",
                    "volume.kubernetes.io/storage-provisioner": "ebs.csi.aws.com",
                    "pv.kubernetes.io/migrated-to": "ebs.csi.aws.com",
                    "backup": "daily",
                },
            },
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "10Gi"}},
                "storageClassName": "fast",
                "volumeMode": "Filesystem",
                "volumeName": "pvc-0c1d",
                "selector": {"matchLabels": {"tier": "gold"}},
                "dataSource": {"kind": "VolumeSnapshot", "apiGroup": "snapshot.storage.k8s.io", "name": "snap"},
            },
            "status": {"phase": "Bound", "capacity": {"storage": "10Gi"}},
        }))
        .unwrap();
        let lower = lower_pvc(&upper, OWNER);
        assert_trimmed(&lower.metadata);
        let mut expected_spec = upper.spec.clone().unwrap();
        expected_spec.volume_name = None;
        assert_eq!(lower.spec, Some(expected_spec));
        assert!(
            lower.spec.as_ref().unwrap().selector.is_some(),
            "selector is kept"
        );
        assert_eq!(lower.status, None);
        let annotations: Vec<_> = lower
            .metadata
            .annotations
            .iter()
            .flatten()
            .map(|(k, _)| k.as_str())
            .collect();
        assert_eq!(
            annotations,
            [
                "backup",
                keys::ANNOTATION_GLOBAL,
                keys::ANNOTATION_UPPER_UID
            ]
        );
    }

    #[test]
    fn checklist_36_fix_service_account_token_secrets_are_never_copied() {
        let token: Secret = serde_json::from_value(json!({
            "metadata": {
                "name": "builder-token-x1", "namespace": "shop", "uid": "s-uid",
                "annotations": {
                    (keys::ANNOTATION_SERVICE_ACCOUNT_NAME): "builder",
                    (keys::ANNOTATION_SERVICE_ACCOUNT_UID): "sa-uid",
                },
            },
            "type": keys::SECRET_TYPE_SERVICE_ACCOUNT_TOKEN,
            "data": {"token": "dXBwZXI="},
        }))
        .unwrap();
        let err = lower_secret(&token, OWNER).unwrap_err();
        assert_eq!(
            err,
            DepsError::ServiceAccountTokenSecret {
                namespace: "shop".into(),
                name: "builder-token-x1".into()
            }
        );
        let message = err.to_string();
        assert!(message.contains("shop/builder-token-x1"), "{message}");
        assert!(
            message.contains(keys::SECRET_TYPE_SERVICE_ACCOUNT_TOKEN),
            "{message}"
        );

        // Instead the pod's ServiceAccount is created downstairs, with no secrets of its own:
        // the lower cluster issues its tokens.
        let sa = lower_service_account("builder", "shop", OWNER);
        let expected: ServiceAccount = serde_json::from_value(json!({
            "metadata": {
                "name": "builder",
                "namespace": "shop",
                "labels": {(keys::LABEL_OWNER): OWNER},
                "annotations": {(keys::ANNOTATION_GLOBAL): "true"},
            },
        }))
        .unwrap();
        assert_eq!(sa, expected);
        assert!(is_owned_by(&sa.metadata, OWNER));
    }

    #[test]
    fn secret_copy_keeps_type_data_and_string_data_with_trimmed_metadata() {
        let upper: Secret = serde_json::from_value(json!({
            "metadata": upper_meta(),
            "type": "kubernetes.io/tls",
            "data": {"tls.crt": "Y2VydA==", "tls.key": "a2V5"},
            "stringData": {"note": "hi"},
            "immutable": false,
        }))
        .unwrap();
        let lower = lower_secret(&upper, OWNER).unwrap();
        assert_trimmed(&lower.metadata);
        assert_eq!(lower.type_.as_deref(), Some("kubernetes.io/tls"));
        assert_eq!(lower.data, upper.data);
        assert_eq!(lower.string_data, upper.string_data);
        assert_eq!(lower.immutable, Some(false));
        assert_eq!(
            annotation(&lower.metadata, keys::ANNOTATION_GLOBAL),
            Some("true")
        );
        assert_eq!(
            annotation(&lower.metadata, keys::ANNOTATION_UPPER_UID),
            Some("upper-uid-1")
        );
        assert_eq!(label(&lower.metadata, keys::LABEL_OWNER), Some(OWNER));
    }

    #[test]
    fn lower_namespace_is_bare_but_marked() {
        let ns = lower_namespace("shop", OWNER);
        let expected: Namespace = serde_json::from_value(json!({
            "metadata": {
                "name": "shop",
                "labels": {(keys::LABEL_OWNER): OWNER},
                "annotations": {(keys::ANNOTATION_GLOBAL): "true"},
            },
        }))
        .unwrap();
        assert_eq!(ns, expected);
    }

    #[test]
    fn a_lower_namespace_carries_the_upper_namespaces_pod_security_labels_only() {
        let upper: Namespace = serde_json::from_value(json!({
            "metadata": {"name": "shop", "uid": "u", "labels": {
                "pod-security.kubernetes.io/enforce": "restricted",
                "pod-security.kubernetes.io/enforce-version": "v1.34",
                "pod-security.kubernetes.io/warn": "baseline",
                "kubernetes.io/metadata.name": "shop",
                "team": "payments",
            }, "annotations": {"a": "b"}},
        }))
        .unwrap();
        let ns = lower_namespace_of("shop", OWNER, Some(&upper));
        let expected: Namespace = serde_json::from_value(json!({
            "metadata": {
                "name": "shop",
                "labels": {
                    (keys::LABEL_OWNER): OWNER,
                    "pod-security.kubernetes.io/enforce": "restricted",
                    "pod-security.kubernetes.io/enforce-version": "v1.34",
                    "pod-security.kubernetes.io/warn": "baseline",
                },
                "annotations": {(keys::ANNOTATION_GLOBAL): "true"},
            },
        }))
        .unwrap();
        assert_eq!(ns, expected);
        assert_eq!(
            lower_namespace_of("shop", OWNER, None),
            lower_namespace("shop", OWNER)
        );
    }

    #[test]
    fn ownership_is_our_label_with_this_owners_value_only() {
        let long_owner = format!("{}.nodes.example.com", "vk".repeat(40));
        let ours = lower_namespace("n", &long_owner).metadata;
        assert!(is_owned_by(&ours, &long_owner));
        assert!(!is_owned_by(&ours, OWNER));
        assert!(!is_owned_by(
            &lower_namespace("n", OWNER).metadata,
            "vk-lower-b"
        ));
        assert!(!is_owned_by(&ObjectMeta::default(), OWNER));
        let global_only = ObjectMeta {
            annotations: Some(BTreeMap::from([("global".into(), "true".into())])),
            ..ObjectMeta::default()
        };
        assert!(
            !is_owned_by(&global_only, OWNER),
            "global alone is not ownership"
        );
    }

    #[test]
    fn config_map_needs_update_on_data_binary_data_labels_or_our_annotations_only() {
        let upper: ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": "c", "namespace": "n", "uid": "u1", "labels": {"a": "1"}},
            "data": {"k": "v"},
        }))
        .unwrap();
        let desired = lower_config_map(&upper, OWNER);
        let mut lower = desired.clone();
        lower.metadata.uid = Some("lower-uid".into());
        lower.metadata.resource_version = Some("9".into());
        lower.binary_data = Some(BTreeMap::new());
        lower
            .metadata
            .annotations
            .get_or_insert_default()
            .insert("lower-tool".into(), "x".into());
        assert!(
            !config_map_needs_update(&lower, &desired),
            "only lower-side noise"
        );

        let changed = |f: &dyn Fn(&mut ConfigMap)| {
            let mut l = lower.clone();
            f(&mut l);
            config_map_needs_update(&l, &desired)
        };
        assert!(changed(
            &|l| l.data = Some(BTreeMap::from([("k".into(), "w".into())]))
        ));
        assert!(changed(
            &|l| l.binary_data = Some(BTreeMap::from([("b".into(), ByteString(vec![1]))]))
        ));
        assert!(changed(&|l| l.metadata.labels = None));
        assert!(changed(&|l| {
            l.metadata.annotations.get_or_insert_default().insert(
                keys::ANNOTATION_UPPER_UID.into(),
                "recreated-upstairs".into(),
            );
        }));
    }

    #[test]
    fn secret_needs_update_on_data_type_labels_but_not_string_data() {
        let upper: Secret = serde_json::from_value(json!({
            "metadata": {"name": "s", "namespace": "n", "uid": "u1"},
            "data": {"k": "dg=="},
        }))
        .unwrap();
        let desired = lower_secret(&upper, OWNER).unwrap();
        let mut lower = desired.clone();
        lower.type_ = Some("Opaque".into());
        assert!(
            !secret_needs_update(&lower, &desired),
            "absent type is Opaque"
        );

        let mut with_string_data = desired.clone();
        with_string_data.string_data = Some(BTreeMap::from([("x".into(), "y".into())]));
        assert!(!secret_needs_update(&lower, &with_string_data));

        let mut other_data = lower.clone();
        other_data.data = None;
        assert!(secret_needs_update(&other_data, &desired));
        let mut other_type = lower.clone();
        other_type.type_ = Some("kubernetes.io/tls".into());
        assert!(secret_needs_update(&other_type, &desired));
        let mut other_labels = lower.clone();
        other_labels
            .metadata
            .labels
            .get_or_insert_default()
            .insert("new".into(), "1".into());
        assert!(secret_needs_update(&other_labels, &desired));
    }

    #[test]
    fn dependencies_are_ordered_whatever_the_order_of_references() {
        // The original listed volume secrets first and imagePullSecrets after; with ordered maps
        // that order is irrelevant: the same references in any order give the same value.
        let volumes = json!([
            {"name": "z", "secret": {"secretName": "zeta"}},
            {"name": "a", "configMap": {"name": "beta"}},
            {"name": "m", "configMap": {"name": "alpha"}},
            {"name": "p", "persistentVolumeClaim": {"claimName": "pvc-b"}},
            {"name": "q", "persistentVolumeClaim": {"claimName": "pvc-a"}},
        ]);
        let mut reversed = volumes.clone();
        reversed.as_array_mut().unwrap().reverse();
        let one = pod_dependencies(&pod(json!({
            "containers": [container(json!({}))],
            "imagePullSecrets": [{"name": "alpha-pull"}],
            "volumes": volumes,
        })));
        let two = pod_dependencies(&pod(json!({
            "imagePullSecrets": [{"name": "alpha-pull"}],
            "volumes": reversed,
            "containers": [container(json!({}))],
        })));
        assert_eq!(one, two);
        assert_eq!(names(&one.secrets), ["alpha-pull", "zeta"]);
        assert_eq!(names(&one.config_maps), ["alpha", "beta"]);
        assert_eq!(names(&one.pvcs), ["pvc-a", "pvc-b"]);
        assert_eq!(
            serde_json::to_string(&one).unwrap(),
            serde_json::to_string(&two).unwrap()
        );
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        /// A volume or env reference from a small vocabulary, so names collide often.
        fn reference() -> impl Strategy<Value = (u8, String, Option<bool>)> {
            (
                0u8..6,
                prop::sample::select(vec!["a", "b", "", "kube-root-ca.crt", "default-token-x"]),
                prop::option::of(any::<bool>()),
            )
                .prop_map(|(kind, name, optional)| (kind, name.to_owned(), optional))
        }

        fn build(refs: &[(u8, String, Option<bool>)]) -> Pod {
            let mut volumes = Vec::new();
            let mut env = Vec::new();
            for (i, (kind, name, optional)) in refs.iter().enumerate() {
                let v = format!("v{i}");
                match kind {
                    0 => volumes.push(json!({"name": v, "configMap": {"name": name, "optional": optional}})),
                    1 => volumes.push(json!({"name": v, "secret": {"secretName": name, "optional": optional}})),
                    2 => volumes.push(json!({"name": v, "persistentVolumeClaim": {"claimName": name}})),
                    3 => env.push(json!({"name": v, "valueFrom": {"configMapKeyRef": {"name": name, "key": "k", "optional": optional}}})),
                    4 => env.push(json!({"name": v, "valueFrom": {"secretKeyRef": {"name": name, "key": "k", "optional": optional}}})),
                    _ => volumes.push(json!({"name": v, "projected": {"sources": [
                        {"configMap": {"name": name, "optional": optional}},
                        {"secret": {"name": name, "optional": optional}},
                    ]}})),
                }
            }
            pod(json!({"containers": [container(json!({"env": env}))], "volumes": volumes}))
        }

        proptest! {
            #[test]
            fn order_free_no_empty_names_no_root_ca_and_optional_means_all_optional(
                refs in prop::collection::vec(reference(), 0..12),
                seed in any::<u64>(),
            ) {
                let deps = pod_dependencies(&build(&refs));
                let mut shuffled = refs.clone();
                // A deterministic permutation from the seed: rotate then reverse.
                let len = shuffled.len().max(1);
                shuffled.rotate_left(usize::try_from(seed).unwrap_or(0) % len);
                shuffled.reverse();
                prop_assert_eq!(&deps, &pod_dependencies(&build(&shuffled)));

                prop_assert!(!deps.config_maps.contains_key(keys::CONFIG_MAP_KUBE_ROOT_CA));
                for map in [&deps.config_maps, &deps.secrets, &deps.pvcs] {
                    prop_assert!(!map.contains_key(""));
                }
                for (name, need) in &deps.config_maps {
                    let all_optional = refs
                        .iter()
                        .filter(|(k, n, _)| matches!(k, 0 | 3 | 5) && n == name)
                        .all(|(_, _, o)| *o == Some(true));
                    prop_assert_eq!(need.optional, all_optional, "{}", name);
                }
            }
        }
    }

    #[test]
    fn snapshot_of_dependencies_and_lower_copies_of_a_realistic_pod() {
        let web = pod(json!({
            "serviceAccountName": "web",
            "imagePullSecrets": [{"name": "registry-creds"}],
            "initContainers": [container(json!({
                "name": "migrate",
                "envFrom": [{"secretRef": {"name": "db-creds"}}],
            }))],
            "containers": [container(json!({
                "env": [
                    {"name": "LOG_LEVEL", "valueFrom": {"configMapKeyRef": {"name": "web-config", "key": "log_level"}}},
                    {"name": "FEATURE_X", "valueFrom": {"configMapKeyRef": {"name": "features", "key": "x", "optional": true}}},
                    {"name": "DB_PASSWORD", "valueFrom": {"secretKeyRef": {"name": "db-creds", "key": "password"}}},
                ],
                "envFrom": [{"configMapRef": {"name": "web-env"}}],
                "volumeMounts": [
                    {"name": "config", "mountPath": "/etc/web"},
                    {"name": "tls", "mountPath": "/etc/tls"},
                    {"name": "bundle", "mountPath": "/etc/bundle"},
                    {"name": "data", "mountPath": "/data"},
                    {"name": "kube-api-access-9wz4q", "mountPath": keys::SERVICE_ACCOUNT_MOUNT_PATH, "readOnly": true},
                ],
            }))],
            "volumes": [
                {"name": "config", "configMap": {"name": "web-config"}},
                {"name": "tls", "secret": {"secretName": "web-tls", "defaultMode": 0o400}},
                {"name": "bundle", "projected": {"sources": [
                    {"configMap": {"name": "ca-bundle"}},
                    {"secret": {"name": "signing-key", "optional": true}},
                    {"downwardAPI": {"items": [{"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]}},
                ]}},
                {"name": "data", "persistentVolumeClaim": {"claimName": "web-data"}},
                {"name": "kube-api-access-9wz4q", "projected": {"sources": [
                    {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
                    {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                ]}},
            ],
        }));
        let config: ConfigMap = serde_json::from_value(json!({
            "metadata": {
                "name": "web-config", "namespace": "shop", "uid": "cm-uid", "resourceVersion": "11",
                "creationTimestamp": "2024-05-01T10:00:00Z",
                "labels": {"app": "web"},
                "managedFields": [{"manager": "kubectl", "operation": "Apply"}],
            },
            "data": {"log_level": "info"},
        }))
        .unwrap();
        let tls: Secret = serde_json::from_value(json!({
            "metadata": {
                "name": "web-tls", "namespace": "shop", "uid": "secret-uid", "resourceVersion": "12",
                "ownerReferences": [{
                    "apiVersion": "cert-manager.io/v1", "kind": "Certificate", "name": "web", "uid": "cert-uid"
                }],
                "annotations": {"cert-manager.io/issuer-name": "letsencrypt"},
            },
            "type": "kubernetes.io/tls",
            "data": {"tls.crt": "Y2VydA==", "tls.key": "a2V5"},
        }))
        .unwrap();
        let data: PersistentVolumeClaim = serde_json::from_value(json!({
            "metadata": {
                "name": "web-data", "namespace": "shop", "uid": "pvc-uid", "resourceVersion": "13",
                "finalizers": ["kubernetes.io/pvc-protection"],
                "annotations": {
                    "volume.kubernetes.io/selected-node": "vk-lower-a",
                    "volume.kubernetes.io/storage-provisioner": "rancher.io/local-path",
                },
            },
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "5Gi"}},
                "storageClassName": "local-path",
                "volumeMode": "Filesystem",
                "volumeName": "pvc-3f6b",
            },
            "status": {"phase": "Bound"},
        }))
        .unwrap();
        let deps = pod_dependencies(&web);
        insta::assert_json_snapshot!(
            "realistic_pod",
            json!({
                "dependencies": deps,
                "lower_config_map": lower_config_map(&config, OWNER),
                "lower_secret": lower_secret(&tls, OWNER).unwrap(),
                "lower_pvc": lower_pvc(&data, OWNER),
                "lower_service_account": lower_service_account(&deps.service_account, "shop", OWNER),
                "lower_namespace": lower_namespace("shop", OWNER),
            })
        );
    }

    fn config_map(data: &[(&str, &str)], labels: Value) -> ConfigMap {
        serde_json::from_value(json!({
            "metadata": {"namespace": "ns", "name": "cfg", "uid": "u1", "labels": labels},
            "data": data.iter().map(|(k, v)| ((*k).to_owned(), Value::from(*v))).collect::<serde_json::Map<_, _>>(),
        }))
        .unwrap()
    }

    #[test]
    fn checklist_73_fix_an_upper_config_map_change_updates_our_copy_and_never_one_not_ours() {
        let upper = config_map(&[("k", "v1")], json!({"app": "web"}));
        let mut lower = lower_config_map(&upper, OWNER);
        lower.metadata.resource_version = Some("7".into());
        assert_eq!(
            config_map_action(Some(&upper), &lower, OWNER),
            CopyAction::Nothing
        );

        let changed = config_map(&[("k", "v2")], json!({"app": "web", "tier": "1"}));
        let CopyAction::Update(desired) = config_map_action(Some(&changed), &lower, OWNER) else {
            panic!("an update");
        };
        assert_eq!(desired.data, changed.data);
        assert_eq!(desired.metadata.resource_version.as_deref(), Some("7"));
        assert_eq!(desired.metadata.labels.as_ref().unwrap()["tier"], "1");
        assert!(is_owned_by(&desired.metadata, OWNER));

        let theirs = config_map(&[("k", "v1")], json!({}));
        assert_eq!(
            config_map_action(Some(&changed), &theirs, OWNER),
            CopyAction::Nothing
        );
        assert_eq!(config_map_action(None, &theirs, OWNER), CopyAction::Nothing);
        assert_eq!(
            config_map_action(Some(&changed), &lower, "another-node"),
            CopyAction::Nothing,
            "another virtual node's copy"
        );

        lower.immutable = Some(true);
        assert!(matches!(
            config_map_action(Some(&changed), &lower, OWNER),
            CopyAction::Replace(_)
        ));
    }

    #[test]
    fn checklist_74_deleting_the_upper_original_deletes_our_copy() {
        let upper = config_map(&[("k", "v1")], json!({}));
        let lower = lower_config_map(&upper, OWNER);
        assert_eq!(config_map_action(None, &lower, OWNER), CopyAction::Delete);
        let mut deleting = upper.clone();
        deleting.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        assert_eq!(
            config_map_action(Some(&deleting), &lower, OWNER),
            CopyAction::Delete
        );

        let secret: Secret = serde_json::from_value(json!({
            "metadata": {"namespace": "ns", "name": "s", "uid": "u2"},
            "type": "Opaque",
            "data": {"k": "djE="}
        }))
        .unwrap();
        let copy = lower_secret(&secret, OWNER).unwrap();
        assert_eq!(secret_action(None, &copy, OWNER), CopyAction::Delete);
        assert_eq!(
            secret_action(Some(&secret), &copy, OWNER),
            CopyAction::Nothing
        );
    }

    #[test]
    fn a_secret_whose_data_or_type_changed_is_updated_or_replaced() {
        let mut secret: Secret = serde_json::from_value(json!({
            "metadata": {"namespace": "ns", "name": "s", "uid": "u2"},
            "type": "Opaque",
            "data": {"k": "djE="}
        }))
        .unwrap();
        let copy = lower_secret(&secret, OWNER).unwrap();
        secret.data = Some(BTreeMap::from([(
            "k".to_owned(),
            ByteString(b"v2".to_vec()),
        )]));
        assert!(
            matches!(secret_action(Some(&secret), &copy, OWNER), CopyAction::Update(s) if s.data == secret.data)
        );
        secret.type_ = Some("example.com/other".into());
        assert!(matches!(
            secret_action(Some(&secret), &copy, OWNER),
            CopyAction::Replace(_)
        ));
    }

    #[test]
    fn copies_no_pod_needs_are_deleted_and_needed_missing_ones_created_again() {
        let mut upper: ConfigMap =
            serde_json::from_value(json!({"metadata": upper_meta(), "data": {"k": "v"}})).unwrap();
        upper.metadata.deletion_timestamp = None;
        let ours = lower_config_map(&upper, OWNER);
        assert_eq!(
            dependency_action(Some(&upper), Some(&ours), OWNER, true),
            CopyAction::Nothing
        );
        assert_eq!(
            dependency_action(Some(&upper), Some(&ours), OWNER, false),
            CopyAction::Delete
        );
        assert_eq!(
            dependency_action(None, Some(&ours), OWNER, true),
            CopyAction::Delete
        );
        assert_eq!(
            dependency_action(Some(&upper), None, OWNER, true),
            CopyAction::Create(ours.clone())
        );
        assert_eq!(
            dependency_action(Some(&upper), None, OWNER, false),
            CopyAction::Nothing
        );
        assert_eq!(
            dependency_action::<ConfigMap>(None, None, OWNER, true),
            CopyAction::Nothing
        );
        let mut theirs = ours.clone();
        theirs.metadata.labels = None;
        assert_eq!(
            dependency_action(Some(&upper), Some(&theirs), OWNER, false),
            CopyAction::Nothing
        );
        // A service-account token secret is never created, needed or not.
        let token: Secret = serde_json::from_value(
            json!({"metadata": upper_meta(), "type": keys::SECRET_TYPE_SERVICE_ACCOUNT_TOKEN}),
        )
        .unwrap();
        assert_eq!(
            dependency_action(Some(&token), None, OWNER, true),
            CopyAction::Nothing
        );
    }

    #[test]
    fn needed_copies_lists_config_maps_secrets_and_claims_by_kind() {
        let p = pod(json!({
            "volumes": [
                {"name": "a", "configMap": {"name": "cm"}},
                {"name": "b", "secret": {"secretName": "sec"}},
                {"name": "c", "persistentVolumeClaim": {"claimName": "data"}},
            ],
            "containers": [container(json!({"envFrom": [{"configMapRef": {"name": "env"}}]}))],
        }));
        assert_eq!(
            needed_copies(&p),
            vec![
                (CopyKind::ConfigMap, "cm".to_owned()),
                (CopyKind::ConfigMap, "env".to_owned()),
                (CopyKind::Secret, "sec".to_owned()),
                (CopyKind::PersistentVolumeClaim, "data".to_owned()),
            ]
        );
    }
}
