//! The three patch formats of the Kubernetes API server, over `serde_json::Value`.
//!
//! * [`json_merge_patch`] is RFC 7386 exactly; [`apply_merge_patch`] is what the API server does
//!   for `application/merge-patch+json` (it uses `evanphx/json-patch` v4, which rejects a
//!   non-object body and prunes nulls a little more than the RFC).
//! * [`json_patch`] is RFC 6902 for `application/json-patch+json`, applied by the `json-patch`
//!   crate: strict RFC semantics, without the departures of the API server's
//!   `evanphx/json-patch` v4 (see [`json_patch`]); [`json_patch_ops`] takes the crate's typed
//!   patch (what kube-rs and admission webhooks send).
//! * [`strategic_merge_patch`] is `k8s.io/apimachinery/pkg/util/strategicpatch`
//!   (`StrategicMergeMapPatch`, as the server calls it) with the merge keys of the built-in types
//!   held in a table ([`BUILTIN_FIELDS`], [`BUILTIN_KINDS`]): adding a type is adding rows.
//!
//! Every function leaves the target untouched when it returns an error. [`PatchError::http_status`]
//! gives the status code the API server answers with, and the `Display` text is its message.

#![forbid(unsafe_code)]

use std::fmt::Write as _;

use serde_json::{Map, Value};

/// The most operations a JSON patch may have (the API server answers 413 beyond).
pub const MAX_JSON_PATCH_OPERATIONS: usize = 10_000;

/// Why a patch could not be applied. `Display` is the message the API server returns.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatchError {
    /// The JSON patch body is not a list of operation objects.
    #[error("{0}")]
    InvalidJsonPatch(String),
    /// The JSON patch has more than [`MAX_JSON_PATCH_OPERATIONS`] operations.
    #[error("The allowed maximum operations in a JSON patch is {max}, got {count}")]
    TooManyOperations {
        /// The limit.
        max: usize,
        /// The operations in the patch.
        count: usize,
    },
    /// One operation of a JSON patch failed.
    #[error("{message}")]
    OperationFailed {
        /// Index of the operation in the patch.
        index: usize,
        /// Why.
        message: String,
    },
    /// The merge patch body is neither an object nor an array.
    #[error("Invalid JSON Patch")]
    InvalidMergePatch,
    /// The document to patch is not an object (or array, for JSON patch).
    #[error("{0}")]
    InvalidDocument(String),
    /// The strategic merge patch body is not a JSON object.
    #[error("json: cannot unmarshal {found} into Go value of type map[string]interface {{}}")]
    PatchNotAnObject {
        /// The JSON type found instead.
        found: &'static str,
    },
    /// A `$deleteFromPrimitiveList/<field>` key is malformed.
    #[error("invalid patch format of primitive list")]
    BadPrimitiveList {
        /// Where in the document.
        path: String,
    },
    /// A `$retainKeys` directive is not a list, or the patch sets a key it does not retain.
    #[error("invalid patch format of retainKeys")]
    BadRetainKeys {
        /// Where in the document.
        path: String,
    },
    /// A `$setElementOrder/<field>` key is malformed.
    #[error("invalid patch format of setElementOrder list")]
    BadSetElementOrder {
        /// Where in the document.
        path: String,
    },
    /// A list holds lists, which strategic merge cannot merge.
    #[error("lists of lists are not supported")]
    ListOfLists {
        /// Where in the document.
        path: String,
    },
    /// Any other strategic merge failure (a missing merge key, an unknown `$patch`, mixed list
    /// element types, an order list that contradicts the patch list...).
    #[error("{message}")]
    Strategic {
        /// Where in the document.
        path: String,
        /// The upstream error text.
        message: String,
    },
}

impl PatchError {
    /// The HTTP status the API server answers this error with.
    pub fn http_status(&self) -> u16 {
        match self {
            Self::InvalidJsonPatch(_)
            | Self::InvalidMergePatch
            | Self::PatchNotAnObject { .. }
            | Self::BadPrimitiveList { .. }
            | Self::BadRetainKeys { .. }
            | Self::BadSetElementOrder { .. } => 400,
            Self::TooManyOperations { .. } => 413,
            Self::OperationFailed { .. } | Self::ListOfLists { .. } => 422,
            // Upstream returns these as plain errors, which become 500 Internal Error.
            Self::InvalidDocument(_) | Self::Strategic { .. } => 500,
        }
    }
}

// =============================================================================================
// JSON merge patch
// =============================================================================================

/// Applies an RFC 7386 JSON merge patch: `null` deletes, objects merge recursively, anything else
/// (including a non-object patch) replaces.
pub fn json_merge_patch(target: &mut Value, patch: &Value) {
    json_patch::merge(target, patch);
}

/// Applies a merge patch as the API server does (`evanphx/json-patch` v4 `MergePatch`).
///
/// Differences from [`json_merge_patch`]: a patch that is `null` or a scalar is rejected
/// ([`PatchError::InvalidMergePatch`], 400); an array patch replaces the document; a value the
/// patch sets where the document had nothing, `null` or a non-object has its nested object
/// members that are `null` removed, even inside arrays.
pub fn apply_merge_patch(target: &mut Value, patch: &Value) -> Result<(), PatchError> {
    match patch {
        Value::Object(patch) => match target {
            Value::Object(doc) => {
                merge_docs(doc, patch);
                Ok(())
            }
            Value::Null => Err(PatchError::InvalidDocument(
                "Invalid JSON Document".to_owned(),
            )),
            other => {
                let mut value = Value::Object(patch.clone());
                prune_nulls(&mut value);
                *other = value;
                Ok(())
            }
        },
        Value::Array(_) => {
            let mut value = patch.clone();
            prune_nulls(&mut value);
            *target = value;
            Ok(())
        }
        _ => Err(PatchError::InvalidMergePatch),
    }
}

fn merge_docs(doc: &mut Map<String, Value>, patch: &Map<String, Value>) {
    for (key, value) in patch {
        if value.is_null() {
            doc.remove(key);
            continue;
        }
        match doc.get_mut(key) {
            Some(current) if !current.is_null() => merge_value(current, value),
            _ => {
                let mut value = value.clone();
                prune_nulls(&mut value);
                doc.insert(key.clone(), value);
            }
        }
    }
}

fn merge_value(current: &mut Value, patch: &Value) {
    match (current, patch) {
        (Value::Object(current), Value::Object(patch)) => merge_docs(current, patch),
        // The current value is an object, the patch is not: the patch replaces it as it is.
        (current @ Value::Object(_), patch) => *current = patch.clone(),
        (current, patch) => {
            let mut value = patch.clone();
            prune_nulls(&mut value);
            *current = value;
        }
    }
}

// Removes null members of objects, recursively, also inside arrays (null elements stay).
fn prune_nulls(value: &mut Value) {
    match value {
        Value::Object(map) => {
            map.retain(|_, v| !v.is_null());
            map.values_mut().for_each(prune_nulls);
        }
        Value::Array(items) => items.iter_mut().for_each(prune_nulls),
        _ => {}
    }
}

// =============================================================================================
// JSON patch (RFC 6902)
// =============================================================================================

/// Applies a JSON patch (a JSON array of operations) with RFC 6902's semantics, as the
/// `json-patch` crate implements them. kube-apiserver applies evanphx/json-patch v4, which
/// departs from the RFC in corners (negative array indices, `replace` of a missing member adds
/// it, `test` of a missing member against `null` passes) that neither the sandbox's clients nor
/// tensile-kube rely on: a patch that does fails here (422) and is tested on real control
/// planes.
///
/// A body that is not a list of operations is [`PatchError::InvalidJsonPatch`] (400), too many
/// operations [`PatchError::TooManyOperations`] (413), a failing operation
/// [`PatchError::OperationFailed`] (422).
pub fn json_patch(target: &mut Value, patch: &Value) -> Result<(), PatchError> {
    let ops: json_patch::Patch = match patch {
        // Go decodes `null` into an empty patch.
        Value::Null => json_patch::Patch(Vec::new()),
        other => serde_json::from_value(other.clone())
            .map_err(|e| PatchError::InvalidJsonPatch(e.to_string()))?,
    };
    json_patch_ops(target, &ops)
}

/// Applies a typed JSON patch of the `json-patch` crate (what kube-rs and webhooks send).
pub fn json_patch_ops(target: &mut Value, patch: &json_patch::Patch) -> Result<(), PatchError> {
    if patch.0.len() > MAX_JSON_PATCH_OPERATIONS {
        return Err(PatchError::TooManyOperations {
            max: MAX_JSON_PATCH_OPERATIONS,
            count: patch.0.len(),
        });
    }
    // Work on a copy so that a failing operation leaves the target as it was.
    let mut doc = target.clone();
    json_patch::patch_unsafe(&mut doc, &patch.0).map_err(|e| PatchError::OperationFailed {
        index: e.operation,
        message: e.to_string(),
    })?;
    *target = doc;
    Ok(())
}

// =============================================================================================
// Strategic merge patch: the merge-key table
// =============================================================================================

/// How a field is patched: upstream's `patchStrategy` and `patchMergeKey` struct tags.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Strategy {
    /// No tag: objects merge member by member, lists are replaced whole.
    Default,
    /// `patchStrategy:"replace"`: the patch value replaces the field, objects included.
    Replace,
    /// `patchStrategy:"merge"` with `patchMergeKey`: list items (objects) merge by that member.
    MergeByKey(&'static str),
    /// `patchStrategy:"merge"` without a merge key: lists of scalars merge as ordered sets.
    MergePrimitives,
}

impl Strategy {
    // Upstream `GetPatchMergeKey()`.
    fn merge_key(self) -> &'static str {
        match self {
            Self::MergeByKey(key) => key,
            _ => "",
        }
    }

    fn merges_lists(self) -> bool {
        matches!(self, Self::MergeByKey(_) | Self::MergePrimitives)
    }
}

/// One row of a merge-key table: field `field` of type `owner` is patched with `strategy`, and
/// its value (or, for a list, each item) is of type `ty` (`None`: a type without tagged fields).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FieldRow {
    /// The type the field belongs to (a name local to the table).
    pub owner: &'static str,
    /// The JSON name of the field.
    pub field: &'static str,
    /// How it is patched.
    pub strategy: Strategy,
    /// The type of the value or of list items, when it has tagged fields itself.
    pub ty: Option<&'static str>,
}

impl FieldRow {
    /// A field of type `ty`, without a patch strategy (objects merge, lists are replaced).
    pub const fn nested(owner: &'static str, field: &'static str, ty: &'static str) -> Self {
        Self {
            owner,
            field,
            strategy: Strategy::Default,
            ty: Some(ty),
        }
    }

    /// A list merged by `key`, its items of type `ty` if they have tagged fields.
    pub const fn merge_by(
        owner: &'static str,
        field: &'static str,
        key: &'static str,
        ty: Option<&'static str>,
    ) -> Self {
        Self {
            owner,
            field,
            strategy: Strategy::MergeByKey(key),
            ty,
        }
    }

    /// A list of scalars merged as an ordered set (`finalizers`).
    pub const fn merge_set(owner: &'static str, field: &'static str) -> Self {
        Self {
            owner,
            field,
            strategy: Strategy::MergePrimitives,
            ty: None,
        }
    }

    /// A field the patch replaces whole (`patchStrategy:"replace"`).
    pub const fn replace(owner: &'static str, field: &'static str) -> Self {
        Self {
            owner,
            field,
            strategy: Strategy::Replace,
            ty: None,
        }
    }

    /// Any combination (used for test schemas whose fields carry both a strategy and a type).
    pub const fn new(
        owner: &'static str,
        field: &'static str,
        strategy: Strategy,
        ty: Option<&'static str>,
    ) -> Self {
        Self {
            owner,
            field,
            strategy,
            ty,
        }
    }
}

/// Kinds served with strategic merge and the root type of each in [`BUILTIN_FIELDS`]. Kinds are
/// unique across the groups the simulated server serves (an `Event` is the same in `v1` and
/// `events.k8s.io/v1` for patching: metadata only).
pub static BUILTIN_KINDS: &[(&str, &str)] = &[
    // core/v1
    ("Pod", "Pod"),
    ("PodTemplate", "PodTemplate"),
    ("ReplicationController", "Workload"),
    ("Node", "Node"),
    ("Service", "Service"),
    ("ServiceAccount", "ServiceAccount"),
    ("Namespace", "WithConditions"),
    ("PersistentVolumeClaim", "WithConditions"),
    ("ComponentStatus", "ComponentStatus"),
    ("ConfigMap", "Object"),
    ("Secret", "Object"),
    ("Endpoints", "Object"),
    ("Event", "Object"),
    ("LimitRange", "Object"),
    ("ResourceQuota", "Object"),
    ("PersistentVolume", "Object"),
    ("Binding", "Object"),
    // apps/v1
    ("Deployment", "Workload"),
    ("ReplicaSet", "Workload"),
    ("StatefulSet", "Workload"),
    ("DaemonSet", "Workload"),
    ("ControllerRevision", "Object"),
    // batch/v1
    ("Job", "Workload"),
    ("CronJob", "CronJob"),
    // policy/v1
    ("PodDisruptionBudget", "PodDisruptionBudget"),
    // storage.k8s.io/v1
    ("CSINode", "CSINode"),
    ("StorageClass", "Object"),
    ("CSIDriver", "Object"),
    ("VolumeAttachment", "Object"),
    // networking.k8s.io/v1
    ("ServiceCIDR", "WithConditions"),
    ("Ingress", "Object"),
    ("IngressClass", "Object"),
    ("NetworkPolicy", "Object"),
    // discovery.k8s.io/v1, coordination.k8s.io/v1, scheduling, node, rbac
    ("EndpointSlice", "Object"),
    ("Lease", "Object"),
    ("PriorityClass", "Object"),
    ("RuntimeClass", "Object"),
    ("Role", "Object"),
    ("RoleBinding", "Object"),
    ("ClusterRole", "Object"),
    ("ClusterRoleBinding", "Object"),
];

/// The tagged fields of the built-in types (Kubernetes 1.33 `patchStrategy`/`patchMergeKey`
/// tags), plus the untagged fields that lead to them. Type names are local to this table; several
/// upstream types that patch alike share one (`Workload` is every controller with a pod template,
/// `Conditions` every status whose only tagged field is `conditions`).
pub static BUILTIN_FIELDS: &[FieldRow] = &[
    // meta/v1 ObjectMeta, under every kind.
    FieldRow::nested("Object", "metadata", "ObjectMeta"),
    FieldRow::merge_by("ObjectMeta", "ownerReferences", "uid", None),
    FieldRow::merge_set("ObjectMeta", "finalizers"),
    // core/v1 Pod, PodTemplateSpec, PodSpec, Container (EphemeralContainer has the same tags).
    FieldRow::nested("Pod", "metadata", "ObjectMeta"),
    FieldRow::nested("Pod", "spec", "PodSpec"),
    FieldRow::nested("Pod", "status", "PodStatus"),
    FieldRow::nested("PodTemplate", "metadata", "ObjectMeta"),
    FieldRow::nested("PodTemplate", "template", "PodTemplateSpec"),
    FieldRow::nested("PodTemplateSpec", "metadata", "ObjectMeta"),
    FieldRow::nested("PodTemplateSpec", "spec", "PodSpec"),
    FieldRow::merge_by("PodSpec", "volumes", "name", None),
    FieldRow::merge_by("PodSpec", "initContainers", "name", Some("Container")),
    FieldRow::merge_by("PodSpec", "containers", "name", Some("Container")),
    FieldRow::merge_by("PodSpec", "ephemeralContainers", "name", Some("Container")),
    FieldRow::merge_by("PodSpec", "imagePullSecrets", "name", None),
    FieldRow::merge_by("PodSpec", "hostAliases", "ip", None),
    FieldRow::merge_by("PodSpec", "topologySpreadConstraints", "topologyKey", None),
    FieldRow::merge_by("PodSpec", "schedulingGates", "name", None),
    FieldRow::merge_by("PodSpec", "resourceClaims", "name", None),
    FieldRow::merge_by("Container", "ports", "containerPort", None),
    FieldRow::merge_by("Container", "env", "name", None),
    FieldRow::merge_by("Container", "volumeMounts", "mountPath", None),
    FieldRow::merge_by("Container", "volumeDevices", "devicePath", None),
    FieldRow::merge_by("PodStatus", "conditions", "type", None),
    FieldRow::merge_by("PodStatus", "hostIPs", "ip", None),
    FieldRow::merge_by("PodStatus", "podIPs", "ip", None),
    FieldRow::merge_by("PodStatus", "resourceClaimStatuses", "name", None),
    // Controllers with a pod template: ReplicationController, Deployment, ReplicaSet,
    // StatefulSet, DaemonSet, Job. Their statuses only tag `conditions`.
    FieldRow::nested("Workload", "metadata", "ObjectMeta"),
    FieldRow::nested("Workload", "spec", "WorkloadSpec"),
    FieldRow::nested("Workload", "status", "Conditions"),
    FieldRow::nested("WorkloadSpec", "template", "PodTemplateSpec"),
    FieldRow::merge_by("Conditions", "conditions", "type", None),
    FieldRow::nested("CronJob", "metadata", "ObjectMeta"),
    FieldRow::nested("CronJob", "spec", "CronJobSpec"),
    FieldRow::nested("CronJobSpec", "jobTemplate", "JobTemplateSpec"),
    FieldRow::nested("JobTemplateSpec", "metadata", "ObjectMeta"),
    FieldRow::nested("JobTemplateSpec", "spec", "WorkloadSpec"),
    // Namespace, PersistentVolumeClaim, ServiceCIDR: status.conditions by type.
    FieldRow::nested("WithConditions", "metadata", "ObjectMeta"),
    FieldRow::nested("WithConditions", "status", "Conditions"),
    // Node: spec.taints has no tag (replaced); podCIDRs merge as a set.
    FieldRow::nested("Node", "metadata", "ObjectMeta"),
    FieldRow::nested("Node", "spec", "NodeSpec"),
    FieldRow::nested("Node", "status", "NodeStatus"),
    FieldRow::merge_set("NodeSpec", "podCIDRs"),
    FieldRow::merge_by("NodeStatus", "conditions", "type", None),
    FieldRow::merge_by("NodeStatus", "addresses", "type", None),
    // Service: spec.ports by port.
    FieldRow::nested("Service", "metadata", "ObjectMeta"),
    FieldRow::nested("Service", "spec", "ServiceSpec"),
    FieldRow::nested("Service", "status", "Conditions"),
    FieldRow::merge_by("ServiceSpec", "ports", "port", None),
    FieldRow::nested("ServiceAccount", "metadata", "ObjectMeta"),
    FieldRow::merge_by("ServiceAccount", "secrets", "name", None),
    FieldRow::nested("ComponentStatus", "metadata", "ObjectMeta"),
    FieldRow::merge_by("ComponentStatus", "conditions", "type", None),
    // policy/v1 PodDisruptionBudget: the selector is replaced whole.
    FieldRow::nested("PodDisruptionBudget", "metadata", "ObjectMeta"),
    FieldRow::nested("PodDisruptionBudget", "spec", "PodDisruptionBudgetSpec"),
    FieldRow::nested("PodDisruptionBudget", "status", "Conditions"),
    FieldRow::replace("PodDisruptionBudgetSpec", "selector"),
    // storage.k8s.io/v1 CSINode.
    FieldRow::nested("CSINode", "metadata", "ObjectMeta"),
    FieldRow::nested("CSINode", "spec", "CSINodeSpec"),
    FieldRow::merge_by("CSINodeSpec", "drivers", "name", None),
];

/// A position in a merge-key table: the type whose fields are being patched (`None`: a value
/// without tagged fields, where objects merge and lists are replaced).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Schema {
    rows: &'static [FieldRow],
    ty: Option<&'static str>,
}

impl Schema {
    /// Type `root` of the table `rows`.
    pub const fn new(rows: &'static [FieldRow], root: &'static str) -> Self {
        Self {
            rows,
            ty: Some(root),
        }
    }

    /// The schema of a built-in kind, or `None` for a kind the table does not know (upstream
    /// refuses strategic merge for custom resources with 415).
    pub fn for_kind(kind: &str) -> Option<Self> {
        BUILTIN_KINDS
            .iter()
            .find(|(k, _)| *k == kind)
            .map(|(_, root)| Self::new(BUILTIN_FIELDS, root))
    }

    /// A type with only `metadata` tagged (a built-in kind without other merge keys).
    pub const fn object() -> Self {
        Self::new(BUILTIN_FIELDS, "Object")
    }

    /// No tagged fields anywhere: objects merge, lists are replaced.
    pub const fn untyped() -> Self {
        Self {
            rows: BUILTIN_FIELDS,
            ty: None,
        }
    }

    /// The type this schema stands at.
    pub fn type_name(&self) -> Option<&'static str> {
        self.ty
    }

    /// The strategy of field `name` and the schema of its value (or list items).
    pub fn field(&self, name: &str) -> (Strategy, Schema) {
        let row = self.ty.and_then(|ty| {
            self.rows
                .iter()
                .find(|row| row.owner == ty && row.field == name)
        });
        match row {
            Some(row) => (
                row.strategy,
                Schema {
                    rows: self.rows,
                    ty: row.ty,
                },
            ),
            None => (
                Strategy::Default,
                Schema {
                    rows: self.rows,
                    ty: None,
                },
            ),
        }
    }
}

/// The strategy of the field at `path` (JSON member names from the object root; list items add
/// no segment) in built-in kind `kind`: `None` when the kind is unknown or the field has no tag.
///
/// ```text
/// field_strategy("Pod", &["spec", "containers", "ports"]) == Some(MergeByKey("containerPort"))
/// ```
pub fn field_strategy(kind: &str, path: &[&str]) -> Option<Strategy> {
    let (last, parents) = path.split_last()?;
    let mut schema = Schema::for_kind(kind)?;
    for seg in parents {
        schema = schema.field(seg).1;
    }
    match schema.field(last).0 {
        Strategy::Default => None,
        other => Some(other),
    }
}

// =============================================================================================
// Strategic merge patch: the algorithm (upstream `mergeMap` and friends, server-side options)
// =============================================================================================

const DIRECTIVE: &str = "$patch";
const DELETE_FROM_PRIMITIVE_LIST: &str = "$deleteFromPrimitiveList";
const RETAIN_KEYS: &str = "$retainKeys";
const SET_ELEMENT_ORDER: &str = "$setElementOrder";

/// Applies a Kubernetes strategic merge patch as the API server does
/// (`StrategicMergeMapPatch`, merging parallel lists, ignoring unmatched nulls).
///
/// Supported: `null` deletes a member; objects merge unless their field is `Replace`; lists
/// merge by their merge key, as ordered sets of scalars, or are replaced, as the schema says;
/// `$patch: replace|delete` in objects and list items, `$retainKeys`,
/// `$deleteFromPrimitiveList/<field>` and `$setElementOrder/<field>` with upstream's ordering
/// rules. A `null` patch changes nothing. The result is the upstream map before its typed
/// decode; [`normalize_after_patch`] drops what that decode would drop.
pub fn strategic_merge_patch(
    target: &mut Value,
    patch: &Value,
    schema: Schema,
) -> Result<(), PatchError> {
    let patch = match patch {
        Value::Null => return Ok(()),
        Value::Object(patch) => patch.clone(),
        other => {
            return Err(PatchError::PatchNotAnObject {
                found: go_json_kind(other),
            });
        }
    };
    let original = match target {
        Value::Object(map) => map.clone(),
        Value::Null => Map::new(),
        other => {
            return Err(PatchError::InvalidDocument(format!(
                "cannot strategically merge into a {}",
                go_json_kind(other)
            )));
        }
    };
    let merged = merge_map(original, patch, schema, "")?;
    *target = Value::Object(merged);
    Ok(())
}

/// Removes what the API server's typed decode drops after a patch: object members that are
/// `null` and leftover strategic-merge directive keys (`$patch`, `$retainKeys`,
/// `$setElementOrder/…`, `$deleteFromPrimitiveList/…`), at any depth.
pub fn normalize_after_patch(value: &mut Value) {
    match value {
        Value::Object(map) => {
            map.retain(|k, v| !v.is_null() && !is_directive_key(k));
            map.values_mut().for_each(normalize_after_patch);
        }
        Value::Array(items) => items.iter_mut().for_each(normalize_after_patch),
        _ => {}
    }
}

fn is_directive_key(key: &str) -> bool {
    key == DIRECTIVE
        || key == RETAIN_KEYS
        || key
            .strip_prefix(SET_ELEMENT_ORDER)
            .is_some_and(|rest| rest.starts_with('/'))
        || key
            .strip_prefix(DELETE_FROM_PRIMITIVE_LIST)
            .is_some_and(|rest| rest.starts_with('/'))
}

fn child_path(path: &str, key: &str) -> String {
    format!("{path}/{key}")
}

fn strategic(path: &str, message: impl Into<String>) -> PatchError {
    PatchError::Strategic {
        path: path.to_owned(),
        message: message.into(),
    }
}

type JsonMap = Map<String, Value>;

fn merge_map(
    mut original: JsonMap,
    mut patch: JsonMap,
    schema: Schema,
    path: &str,
) -> Result<JsonMap, PatchError> {
    if let Some(directive) = patch.get(DIRECTIVE) {
        return match directive.as_str() {
            Some("replace") => {
                patch.remove(DIRECTIVE);
                Ok(patch)
            }
            Some("delete") => Ok(Map::new()),
            // `merge` is not allowed in an object either: upstream answers "unknown patch type".
            _ => Err(bad_patch_type(path, directive, &patch)),
        };
    }
    apply_retain_keys(&mut original, &mut patch, path)?;
    merge_element_order_lists(&mut original, &mut patch, schema, path)?;

    // Upstream visits members in Go map order, which mostly follows the order of the patch
    // document (sorted, as clients marshal maps): `$deleteFromPrimitiveList/x` is then applied
    // before `x` is merged, which is what key order gives here too.
    for (key, patch_value) in patch {
        let (key, is_delete_list) = if key.starts_with(DELETE_FROM_PRIMITIVE_LIST) {
            (extract_key(&key, DELETE_FROM_PRIMITIVE_LIST, path)?, true)
        } else {
            (key, false)
        };
        if patch_value.is_null() {
            original.remove(&key);
            continue;
        }
        let Some(slot) = original.get_mut(&key) else {
            if !is_delete_list {
                insert_patch_value(&mut original, key, patch_value);
            }
            continue;
        };
        if go_type(slot) != go_type(&patch_value) {
            if !is_delete_list {
                insert_patch_value(&mut original, key, patch_value);
            }
            continue;
        }
        let sub_path = child_path(path, &key);
        let current = std::mem::take(slot);
        let merged = match (current, patch_value) {
            (Value::Object(current), Value::Object(patch_map)) => {
                let (strategy, sub) = schema.field(&key);
                if strategy == Strategy::Replace {
                    Value::Object(patch_map)
                } else {
                    Value::Object(merge_map(current, patch_map, sub, &sub_path)?)
                }
            }
            (Value::Array(current), Value::Array(patch_list)) => {
                let (strategy, sub) = schema.field(&key);
                Value::Array(merge_list_field(
                    current,
                    patch_list,
                    sub,
                    strategy,
                    is_delete_list,
                    &sub_path,
                )?)
            }
            (_, scalar) => match remove_directives(scalar) {
                Some(v) => v,
                None => {
                    original.remove(&key);
                    continue;
                }
            },
        };
        original.insert(key, merged);
    }
    Ok(original)
}

// A patch value for a member the original lacks (or has with another type): nulls and
// `$patch`-marked objects go away, everything else is taken as is.
fn insert_patch_value(original: &mut JsonMap, key: String, mut value: Value) {
    discard_nulls(&mut value);
    match remove_directives(value) {
        Some(v) => {
            original.insert(key, v);
        }
        None => {
            original.remove(&key);
        }
    }
}

fn discard_nulls(value: &mut Value) {
    match value {
        Value::Object(map) => {
            map.retain(|_, v| !v.is_null());
            map.values_mut().for_each(discard_nulls);
        }
        Value::Array(items) => items.iter_mut().for_each(discard_nulls),
        _ => {}
    }
}

// Drops every object carrying `$patch` (and the member or item holding it). Other directive keys
// stay, as upstream leaves them to the typed decode.
fn remove_directives(value: Value) -> Option<Value> {
    match value {
        Value::Object(map) => {
            if map.contains_key(DIRECTIVE) {
                return None;
            }
            let kept = map
                .into_iter()
                .filter_map(|(k, v)| remove_directives(v).map(|v| (k, v)))
                .collect();
            Some(Value::Object(kept))
        }
        Value::Array(items) => Some(Value::Array(
            items.into_iter().filter_map(remove_directives).collect(),
        )),
        other => Some(other),
    }
}

// `$deleteFromPrimitiveList/name` -> `name`.
fn extract_key(key: &str, prefix: &str, path: &str) -> Result<String, PatchError> {
    match key.split_once('/') {
        Some((head, field)) if head == prefix => Ok(field.to_owned()),
        _ if prefix == DELETE_FROM_PRIMITIVE_LIST => Err(PatchError::BadPrimitiveList {
            path: path.to_owned(),
        }),
        _ => Err(PatchError::BadSetElementOrder {
            path: path.to_owned(),
        }),
    }
}

fn apply_retain_keys(
    original: &mut JsonMap,
    patch: &mut JsonMap,
    path: &str,
) -> Result<(), PatchError> {
    let Some(retain) = patch.remove(RETAIN_KEYS) else {
        return Ok(());
    };
    let Value::Array(retain) = retain else {
        return Err(PatchError::BadRetainKeys {
            path: path.to_owned(),
        });
    };
    let retained = |k: &str| retain.iter().any(|v| v.as_str() == Some(k));
    for (k, v) in patch.iter() {
        if v.is_null()
            || k.starts_with(DELETE_FROM_PRIMITIVE_LIST)
            || k.starts_with(SET_ELEMENT_ORDER)
        {
            continue;
        }
        if !retained(k) {
            return Err(PatchError::BadRetainKeys {
                path: path.to_owned(),
            });
        }
    }
    original.retain(|k, _| retained(k));
    Ok(())
}

// Upstream `mergePatchIntoOriginal`: every `$setElementOrder/<field>` merges its list now and
// orders the result: the order list first, then the patch list, then the live list.
fn merge_element_order_lists(
    original: &mut JsonMap,
    patch: &mut JsonMap,
    schema: Schema,
    path: &str,
) -> Result<(), PatchError> {
    let keys: Vec<String> = patch
        .keys()
        .filter(|k| k.starts_with(SET_ELEMENT_ORDER))
        .cloned()
        .collect();
    for key in keys {
        let Some(order) = patch.remove(&key) else {
            continue;
        };
        let Value::Array(order) = order else {
            return Err(bad_arg_type(path, "[]interface {}", &order));
        };
        let field = extract_key(&key, SET_ELEMENT_ORDER, path)?;
        let sub_path = child_path(path, &field);
        let original_list = match original.get(&field) {
            None => None,
            Some(Value::Array(items)) => Some(items.clone()),
            Some(other) => return Err(bad_arg_type(&sub_path, "[]interface {}", other)),
        };
        let patch_list = match patch.get(&field) {
            None => None,
            Some(Value::Array(items)) => Some(items.clone()),
            Some(other) => return Err(bad_arg_type(&sub_path, "[]interface {}", other)),
        };
        let (strategy, sub) = schema.field(&field);
        let merge_key = strategy.merge_key();
        validate_order_list(
            patch_list.as_deref().unwrap_or(&[]),
            &order,
            merge_key,
            &sub_path,
        )?;

        let merged = match (&original_list, &patch_list) {
            (Some(current), None) => current.clone(),
            (None, Some(items)) => match remove_directives(Value::Array(items.clone())) {
                Some(Value::Array(items)) => items,
                _ => continue,
            },
            (Some(current), Some(items)) => merge_list_field(
                current.clone(),
                items.clone(),
                sub,
                strategy,
                false,
                &sub_path,
            )?,
            (None, None) => continue,
        };
        let (patch_items, server_only) = if merge_key.is_empty() {
            partition_scalars(merged, &order)
        } else {
            partition_maps(merged, &order, merge_key, &sub_path)?
        };
        let mut live = original_list.unwrap_or_default();
        if let Some(items) = &patch_list
            && strategy.merges_lists()
            && !merge_key.is_empty()
        {
            live = go_aliased_live_list(live, items, merge_key);
        }
        let kind = element_type(&[&live, patch_list.as_deref().unwrap_or(&[])], &sub_path)?;
        let ordered = normalize_element_order(
            patch_items,
            server_only,
            &order,
            &live,
            merge_key,
            kind,
            &sub_path,
        )?;
        original.insert(field.clone(), Value::Array(ordered));
        patch.remove(&field);
    }
    Ok(())
}

// The live list as upstream sees it after merging into it: its merge deletes items by shifting
// the rest left inside the same Go backing array and appends new items into the room that
// frees, so the "live order" it then sorts by is that mutated array. Reproducing this keeps the
// resulting order identical to a real API server's.
fn go_aliased_live_list(mut view: Vec<Value>, patch: &[Value], merge_key: &str) -> Vec<Value> {
    let key_of = |v: &Value| v.as_object().and_then(|m| m.get(merge_key)).cloned();
    let cap = view.len();
    let mut len = cap;
    let mut replace = false;
    for item in patch {
        let Some(map) = item.as_object() else {
            continue;
        };
        match map.get(DIRECTIVE).and_then(Value::as_str) {
            Some("delete") => {
                let wanted = map.get(merge_key).cloned();
                while let Some(k) = view
                    .get(..len)
                    .and_then(|live| live.iter().position(|v| key_of(v) == wanted))
                {
                    for i in k..len.saturating_sub(1) {
                        if let Some(next) = view.get(i + 1).cloned()
                            && let Some(slot) = view.get_mut(i)
                        {
                            *slot = next;
                        }
                    }
                    len -= 1;
                }
            }
            Some("replace") => replace = true,
            _ => {}
        }
    }
    if replace {
        return view;
    }
    let mut current: Vec<Option<Value>> = view.iter().take(len).map(key_of).collect();
    for item in patch {
        let Some(map) = item.as_object() else {
            continue;
        };
        if map.contains_key(DIRECTIVE) {
            continue;
        }
        let key = map.get(merge_key).cloned();
        if current.contains(&key) {
            continue;
        }
        if let Some(slot) = view.get_mut(len) {
            *slot = item.clone();
        }
        len += 1;
        current.push(key);
    }
    view
}

// Upstream `validatePatchWithSetOrderList`: the patch list (deletions and directives aside)
// must appear in the order list, in the same relative order.
fn validate_order_list(
    patch_list: &[Value],
    order: &[Value],
    merge_key: &str,
    path: &str,
) -> Result<(), PatchError> {
    if order.is_empty() || patch_list.is_empty() {
        return Ok(());
    }
    let non_delete = if merge_key.is_empty() {
        patch_list.to_vec()
    } else {
        split_deletions(patch_list.to_vec(), path)?.0
    };
    let (mut pi, mut oi) = (0, 0);
    while let (Some(item), Some(ordered)) = (non_delete.get(pi), order.get(oi)) {
        if item.as_object().is_some_and(|m| m.contains_key(DIRECTIVE)) {
            pi += 1;
            continue;
        }
        if merge_key_values_equal(item, ordered, merge_key, path)? {
            pi += 1;
        }
        oi += 1;
    }
    if pi < non_delete.len() && oi >= order.len() {
        return Err(strategic(
            path,
            format!(
                "The order in patch list:\n{}\n doesn't match {SET_ELEMENT_ORDER} list:\n{}\n",
                go_v_list(patch_list),
                go_v_list(order)
            ),
        ));
    }
    Ok(())
}

fn merge_key_values_equal(
    left: &Value,
    right: &Value,
    merge_key: &str,
    path: &str,
) -> Result<bool, PatchError> {
    if merge_key.is_empty() {
        return Ok(left == right);
    }
    let (Value::Object(l), Value::Object(r)) = (left, right) else {
        let bad = if left.is_object() { right } else { left };
        return Err(bad_arg_type(path, "map[string]interface {}", bad));
    };
    let lv = l
        .get(merge_key)
        .ok_or_else(|| no_merge_key(path, l, merge_key))?;
    let rv = r
        .get(merge_key)
        .ok_or_else(|| no_merge_key(path, r, merge_key))?;
    Ok(lv == rv)
}

// Upstream `mergeSliceHandler`: merge when the field says so (or for a deletion list), else the
// patch list replaces the live one as it is.
fn merge_list_field(
    original: Vec<Value>,
    patch: Vec<Value>,
    schema: Schema,
    strategy: Strategy,
    is_delete_list: bool,
    path: &str,
) -> Result<Vec<Value>, PatchError> {
    if strategy.merges_lists() || is_delete_list {
        merge_list(
            original,
            patch,
            schema,
            strategy.merge_key(),
            is_delete_list,
            path,
        )
    } else {
        Ok(patch)
    }
}

// Go's dynamic types of decoded JSON (integers and floats differ, as the server decodes with
// preserved integers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GoType {
    Nil,
    Bool,
    Int,
    Float,
    String,
    Slice,
    Map,
}

fn go_type(v: &Value) -> GoType {
    match v {
        Value::Null => GoType::Nil,
        Value::Bool(_) => GoType::Bool,
        Value::Number(n) if n.is_f64() => GoType::Float,
        Value::Number(_) => GoType::Int,
        Value::String(_) => GoType::String,
        Value::Array(_) => GoType::Slice,
        Value::Object(_) => GoType::Map,
    }
}

// Upstream `sliceElementType`: all items of all lists share one type, which is not a list.
fn element_type(lists: &[&[Value]], path: &str) -> Result<GoType, PatchError> {
    let mut found: Option<GoType> = None;
    for item in lists.iter().flat_map(|l| l.iter()) {
        let t = go_type(item);
        match found {
            None if t == GoType::Slice => {
                return Err(PatchError::ListOfLists {
                    path: path.to_owned(),
                });
            }
            None => found = Some(t),
            Some(prev) if prev != t => {
                let shown: Vec<String> = lists.iter().map(|l| go_v_list(l)).collect();
                return Err(strategic(
                    path,
                    format!(
                        "list element types are not identical: [{}]",
                        shown.join(" ")
                    ),
                ));
            }
            Some(_) => {}
        }
    }
    found.ok_or_else(|| strategic(path, "no elements in any of the given slices"))
}

fn merge_list(
    original: Vec<Value>,
    patch: Vec<Value>,
    schema: Schema,
    merge_key: &str,
    is_delete_list: bool,
    path: &str,
) -> Result<Vec<Value>, PatchError> {
    if original.is_empty() && patch.is_empty() {
        return Ok(original);
    }
    let kind = element_type(&[&original, &patch], path)?;
    let (merged, patch, live) = if kind == GoType::Map {
        if merge_key.is_empty() {
            // Upstream names the Go kind of the items; lists of objects are lists of structs.
            return Err(strategic(
                path,
                "cannot merge lists without merge key for struct",
            ));
        }
        let (live, patch) = apply_list_directives(original, patch, merge_key, path)?;
        let merged = merge_items_by_key(live.clone(), &patch, merge_key, schema, path)?;
        (merged, patch, live)
    } else {
        if is_delete_list {
            return Ok(original
                .into_iter()
                .filter(|v| !patch.contains(v))
                .collect());
        }
        let mut merged: Vec<Value> = Vec::with_capacity(original.len() + patch.len());
        for v in original.iter().chain(patch.iter()) {
            if !merged.contains(v) {
                merged.push(v.clone());
            }
        }
        (merged, patch, original)
    };
    let (patch_items, server_only) = if merge_key.is_empty() {
        partition_scalars(merged, &patch)
    } else {
        partition_maps(merged, &patch, merge_key, path)?
    };
    normalize_element_order(
        patch_items,
        server_only,
        &patch,
        &live,
        merge_key,
        kind,
        path,
    )
}

// Upstream `mergeSliceWithSpecialElements`: `$patch: delete` items remove their match from the
// live list, `$patch: replace` makes the rest of the patch the whole list.
fn apply_list_directives(
    mut original: Vec<Value>,
    patch: Vec<Value>,
    merge_key: &str,
    path: &str,
) -> Result<(Vec<Value>, Vec<Value>), PatchError> {
    let mut rest = Vec::with_capacity(patch.len());
    let mut replace = false;
    for item in patch {
        let Some(directive) = item.as_object().and_then(|m| m.get(DIRECTIVE)) else {
            rest.push(item);
            continue;
        };
        let map = item.as_object().cloned().unwrap_or_default();
        match directive.as_str() {
            Some("delete") => {
                let Some(wanted) = map.get(merge_key) else {
                    return Err(no_merge_key(path, &map, merge_key));
                };
                original.retain(|o| o.as_object().and_then(|o| o.get(merge_key)) != Some(wanted));
            }
            // Keep going: later items may still be deletions to drop.
            Some("replace") => replace = true,
            Some("merge") => {
                return Err(strategic(
                    path,
                    "merging lists cannot yet be specified in the patch",
                ));
            }
            _ => return Err(bad_patch_type(path, directive, &map)),
        }
    }
    if replace {
        Ok((rest, Vec::new()))
    } else {
        Ok((original, rest))
    }
}

// Upstream `mergeSliceWithoutSpecialElements`: items with a live match merge into it, the others
// are appended.
fn merge_items_by_key(
    mut original: Vec<Value>,
    patch: &[Value],
    merge_key: &str,
    schema: Schema,
    path: &str,
) -> Result<Vec<Value>, PatchError> {
    for item in patch {
        let Value::Object(item) = item else {
            continue;
        };
        let Some(wanted) = item.get(merge_key) else {
            return Err(no_merge_key(path, item, merge_key));
        };
        let found = original
            .iter()
            .position(|o| o.as_object().and_then(|o| o.get(merge_key)) == Some(wanted));
        match found.and_then(|i| original.get_mut(i)) {
            Some(slot) => {
                let current = match std::mem::take(slot) {
                    Value::Object(m) => m,
                    _ => Map::new(),
                };
                let item_path = child_path(path, &go_v(wanted));
                *slot = Value::Object(merge_map(current, item.clone(), schema, &item_path)?);
            }
            None => original.push(Value::Object(item.clone())),
        }
    }
    Ok(original)
}

fn partition_scalars(merged: Vec<Value>, by: &[Value]) -> (Vec<Value>, Vec<Value>) {
    merged.into_iter().partition(|v| by.contains(v))
}

fn partition_maps(
    merged: Vec<Value>,
    by: &[Value],
    merge_key: &str,
    path: &str,
) -> Result<(Vec<Value>, Vec<Value>), PatchError> {
    let mut in_patch = Vec::with_capacity(merged.len());
    let mut server_only = Vec::with_capacity(merged.len());
    for item in merged {
        let Some(map) = item.as_object() else {
            return Err(bad_arg_type(path, "map[string]interface {}", &item));
        };
        let Some(value) = map.get(merge_key) else {
            return Err(no_merge_key(path, map, merge_key));
        };
        let mut found = false;
        for (i, b) in by.iter().enumerate() {
            let Some(b) = b.as_object() else {
                return Err(strategic(path, format!("value for key {i} is not a map")));
            };
            if b.get(merge_key) == Some(value) {
                found = true;
                break;
            }
        }
        if found {
            in_patch.push(item);
        } else {
            server_only.push(item);
        }
    }
    Ok((in_patch, server_only))
}

// Where `item` sits in `list`: by merge-key value for objects (absent equals absent, as Go's nil
// does), by value otherwise.
fn index_in(list: &[Value], item: &Value, merge_key: &str, kind: GoType) -> Option<usize> {
    if kind == GoType::Map {
        let key_of = |v: &Value| v.as_object().and_then(|m| m.get(merge_key)).cloned();
        let wanted = key_of(item);
        list.iter().position(|v| key_of(v) == wanted)
    } else {
        list.iter().position(|v| v == item)
    }
}

// Upstream `normalizeElementOrder`: patch items in patch order, live-only items in live order,
// then interleaved keeping both orders.
fn normalize_element_order(
    patch_items: Vec<Value>,
    server_only: Vec<Value>,
    patch_order: &[Value],
    server_order: &[Value],
    merge_key: &str,
    kind: GoType,
    path: &str,
) -> Result<Vec<Value>, PatchError> {
    let patch_items = sort_by_order(patch_items, patch_order, merge_key, kind, path)?;
    let server_only = sort_by_order(server_only, server_order, merge_key, kind, path)?;
    Ok(merge_sorted(
        server_only,
        patch_items,
        server_order,
        merge_key,
        kind,
    ))
}

// Upstream `normalizeSliceOrder`. Go's stable sort is an insertion sort for up to 20 items and
// upstream's comparator calls any item missing from `order` smaller; an insertion sort with the
// same comparator gives the same result for those lists.
fn sort_by_order(
    items: Vec<Value>,
    order: &[Value],
    merge_key: &str,
    kind: GoType,
    path: &str,
) -> Result<Vec<Value>, PatchError> {
    let (items, deletions) = if kind == GoType::Map {
        for v in items.iter().chain(order.iter()) {
            let Some(map) = v.as_object() else {
                return Err(bad_arg_type(path, "map[string]interface {}", v));
            };
            if !map.contains_key(merge_key) {
                return Err(no_merge_key(path, map, merge_key));
            }
        }
        split_deletions(items, path)?
    } else {
        (items, Vec::new())
    };
    let mut keyed: Vec<(Option<usize>, Value)> = items
        .into_iter()
        .map(|v| (index_in(order, &v, merge_key, kind), v))
        .collect();
    for i in 1..keyed.len() {
        let mut j = i;
        while j > 0 {
            let less = match (
                keyed.get(j).and_then(|p| p.0),
                keyed.get(j - 1).and_then(|p| p.0),
            ) {
                (Some(a), Some(b)) => a < b,
                _ => true,
            };
            if !less {
                break;
            }
            keyed.swap(j, j - 1);
            j -= 1;
        }
    }
    let mut out: Vec<Value> = keyed.into_iter().map(|(_, v)| v).collect();
    out.extend(deletions);
    Ok(out)
}

// Items marked `$patch: delete` go last.
fn split_deletions(items: Vec<Value>, path: &str) -> Result<(Vec<Value>, Vec<Value>), PatchError> {
    let mut keep = Vec::with_capacity(items.len());
    let mut delete = Vec::new();
    for item in items {
        let Some(map) = item.as_object() else {
            return Err(bad_arg_type(path, "map[string]interface {}", &item));
        };
        if map.get(DIRECTIVE).and_then(Value::as_str) == Some("delete") {
            delete.push(item);
        } else {
            keep.push(item);
        }
    }
    Ok((keep, delete))
}

// Upstream `mergeSortedSlice`: a live-only item goes before a patch item only when both are in
// the live order and it comes first there.
fn merge_sorted(
    left: Vec<Value>,
    right: Vec<Value>,
    server_order: &[Value],
    merge_key: &str,
    kind: GoType,
) -> Vec<Value> {
    let mut out = Vec::with_capacity(left.len() + right.len());
    let mut left = left.into_iter().peekable();
    let mut right = right.into_iter().peekable();
    loop {
        let take_left = match (left.peek(), right.peek()) {
            (None, None) => break,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (Some(l), Some(r)) => {
                let li = index_in(server_order, l, merge_key, kind);
                let ri = index_in(server_order, r, merge_key, kind);
                matches!((li, ri), (Some(li), Some(ri)) if li < ri)
            }
        };
        let next = if take_left { left.next() } else { right.next() };
        out.extend(next);
    }
    out
}

// =============================================================================================
// Go-style error texts
// =============================================================================================

fn no_merge_key(path: &str, map: &JsonMap, key: &str) -> PatchError {
    strategic(
        path,
        format!(
            "map: {} does not contain declared merge key: {key}",
            go_v_map(map)
        ),
    )
}

fn bad_patch_type(path: &str, directive: &Value, map: &JsonMap) -> PatchError {
    strategic(
        path,
        format!(
            "unknown patch type: {} in map: {}",
            go_s(directive),
            go_v_map(map)
        ),
    )
}

fn bad_arg_type(path: &str, expected: &str, actual: &Value) -> PatchError {
    strategic(
        path,
        format!(
            "expected a {expected}, but received a {}",
            go_type_name(actual)
        ),
    )
}

fn go_type_name(v: &Value) -> &'static str {
    match go_type(v) {
        // Go prints a nil reflect.Type with `%s` this way.
        GoType::Nil => "%!s(<nil>)",
        GoType::Bool => "bool",
        GoType::Int => "int64",
        GoType::Float => "float64",
        GoType::String => "string",
        GoType::Slice => "[]interface {}",
        GoType::Map => "map[string]interface {}",
    }
}

// The JSON type name Go's decoder uses in "cannot unmarshal X into ...".
fn go_json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

// Go's `%s` of an interface value: strings as they are, anything else flagged.
fn go_s(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "%!s(<nil>)".to_owned(),
        other => format!("%!s({}={})", go_type_name(other), go_v(other)),
    }
}

// Go's `%v` of decoded JSON: `map[k:v ...]` with sorted keys, `[a b]`, `<nil>`.
fn go_v(v: &Value) -> String {
    match v {
        Value::Null => "<nil>".to_owned(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => i.to_string(),
            (_, Some(u), _) => u.to_string(),
            (_, _, Some(f)) => go_float(f),
            _ => n.to_string(),
        },
        Value::String(s) => s.clone(),
        Value::Array(items) => go_v_list(items),
        Value::Object(map) => go_v_map(map),
    }
}

fn go_v_list(items: &[Value]) -> String {
    let parts: Vec<String> = items.iter().map(go_v).collect();
    format!("[{}]", parts.join(" "))
}

fn go_v_map(map: &JsonMap) -> String {
    let mut entries: Vec<(&String, &Value)> = map.iter().collect();
    entries.sort_by(|a, b| a.0.cmp(b.0));
    let mut out = String::from("map[");
    for (i, (k, v)) in entries.into_iter().enumerate() {
        if i > 0 {
            out.push(' ');
        }
        let _ = write!(out, "{k}:{}", go_v(v));
    }
    out.push(']');
    out
}

// Go's `%v` of a float64 (`strconv.FormatFloat(f, 'g', -1, 64)`): exponent form outside
// 1e-4 <= |f| < 1e6.
fn go_float(f: f64) -> String {
    if f == 0.0 || !f.is_finite() {
        return f.to_string();
    }
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    if (-4..6).contains(&exp) {
        f.to_string()
    } else {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{mantissa}e{sign}{:02}", exp.abs())
    }
}

#[cfg(test)]
mod tests {
    use super::Strategy;
    use super::*;
    use pretty_assertions::assert_eq;
    use proptest::prelude::{Just, ProptestConfig, any, prop_assert_eq, prop_oneof, proptest};
    use proptest::strategy::Strategy as Gen;
    use serde_json::json;

    // ---------------------------------------------------------------------------------------
    // JSON merge patch
    // ---------------------------------------------------------------------------------------

    // RFC 7386, appendix A.
    #[test]
    fn merge_patch_rfc7386_examples() {
        let cases = [
            (json!({"a": "b"}), json!({"a": "c"}), json!({"a": "c"})),
            (
                json!({"a": "b"}),
                json!({"b": "c"}),
                json!({"a": "b", "b": "c"}),
            ),
            (json!({"a": "b"}), json!({"a": null}), json!({})),
            (
                json!({"a": "b", "b": "c"}),
                json!({"a": null}),
                json!({"b": "c"}),
            ),
            (json!({"a": ["b"]}), json!({"a": "c"}), json!({"a": "c"})),
            (json!({"a": "c"}), json!({"a": ["b"]}), json!({"a": ["b"]})),
            (
                json!({"a": {"b": "c"}}),
                json!({"a": {"b": "d", "c": null}}),
                json!({"a": {"b": "d"}}),
            ),
            (
                json!({"a": [{"b": "c"}]}),
                json!({"a": [1]}),
                json!({"a": [1]}),
            ),
            (json!(["a", "b"]), json!(["c", "d"]), json!(["c", "d"])),
            (json!({"a": "b"}), json!(["c"]), json!(["c"])),
            (json!({"a": "foo"}), json!(null), json!(null)),
            (json!({"a": "foo"}), json!("bar"), json!("bar")),
            (
                json!({"e": null}),
                json!({"a": 1}),
                json!({"e": null, "a": 1}),
            ),
            (
                json!([1, 2]),
                json!({"a": "b", "c": null}),
                json!({"a": "b"}),
            ),
            (
                json!({}),
                json!({"a": {"bb": {"ccc": null}}}),
                json!({"a": {"bb": {}}}),
            ),
        ];
        for (target, patch, want) in cases {
            let mut doc = target.clone();
            json_merge_patch(&mut doc, &patch);
            assert_eq!(doc, want, "{target} + {patch}");
        }
    }

    #[test]
    fn apiserver_merge_patch_matches_rfc_for_objects() {
        let mut doc = json!({"metadata": {"labels": {"a": "1", "b": "2"}}, "spec": {"x": [1]}});
        apply_merge_patch(
            &mut doc,
            &json!({"metadata": {"labels": {"a": null, "c": "3"}}}),
        )
        .unwrap();
        assert_eq!(
            doc,
            json!({"metadata": {"labels": {"b": "2", "c": "3"}}, "spec": {"x": [1]}})
        );
    }

    #[test]
    fn apiserver_merge_patch_quirks() {
        // A null or scalar body is refused with 400.
        for patch in [json!(null), json!("x"), json!(1), json!(true)] {
            let mut doc = json!({"a": 1});
            let err = apply_merge_patch(&mut doc, &patch).unwrap_err();
            assert_eq!(err, PatchError::InvalidMergePatch);
            assert_eq!(err.to_string(), "Invalid JSON Patch");
            assert_eq!(err.http_status(), 400);
            assert_eq!(doc, json!({"a": 1}));
        }
        // An array replaces the document, with nulls pruned inside its objects.
        let mut doc = json!({"a": 1});
        apply_merge_patch(&mut doc, &json!([{"a": null, "b": 1}, null])).unwrap();
        assert_eq!(doc, json!([{"b": 1}, null]));
        // New values lose their nested nulls, even inside arrays (RFC 7386 keeps those).
        let mut doc = json!({"a": 1});
        apply_merge_patch(
            &mut doc,
            &json!({"b": [{"c": null, "d": 1}], "a": [{"e": null}]}),
        )
        .unwrap();
        assert_eq!(doc, json!({"a": [{}], "b": [{"d": 1}]}));
        // An array replacing an object is taken as it is.
        let mut doc = json!({"a": {"x": 1}});
        apply_merge_patch(&mut doc, &json!({"a": [{"c": null}]})).unwrap();
        assert_eq!(doc, json!({"a": [{"c": null}]}));
        // A member that is null in the document counts as absent.
        let mut doc = json!({"a": null});
        apply_merge_patch(&mut doc, &json!({"a": {"b": null, "c": 1}})).unwrap();
        assert_eq!(doc, json!({"a": {"c": 1}}));
        let mut doc = json!(null);
        assert!(matches!(
            apply_merge_patch(&mut doc, &json!({})),
            Err(PatchError::InvalidDocument(_))
        ));
    }

    // ---------------------------------------------------------------------------------------
    // JSON patch
    // ---------------------------------------------------------------------------------------

    #[test]
    fn json_patch_applies_every_operation() {
        let mut doc = json!({"a": {"b": 1}, "l": ["x", "z"]});
        let patch = json!([
            {"op": "add", "path": "/l/1", "value": "y"},
            {"op": "add", "path": "/l/-", "value": "w"},
            {"op": "replace", "path": "/a/b", "value": 2},
            {"op": "copy", "from": "/a", "path": "/c"},
            {"op": "move", "from": "/c/b", "path": "/d"},
            {"op": "test", "path": "/d", "value": 2},
            {"op": "remove", "path": "/c"}
        ]);
        json_patch(&mut doc, &patch).unwrap();
        assert_eq!(
            doc,
            json!({"a": {"b": 2}, "l": ["x", "y", "z", "w"], "d": 2})
        );
        json_patch(&mut doc, &Value::Null).unwrap();
        assert_eq!(doc["d"], 2, "a null patch is an empty one");
    }

    #[test]
    fn json_patch_errors_leave_the_target_untouched() {
        let mut doc = json!({"a": 1, "b": [1, 2]});
        let patch = json!([
            {"op": "add", "path": "/c", "value": 3},
            {"op": "remove", "path": "/b/0"},
            {"op": "remove", "path": "/zz"}
        ]);
        let err = json_patch(&mut doc, &patch).unwrap_err();
        assert!(
            matches!(err, PatchError::OperationFailed { index: 2, .. }),
            "{err:?}"
        );
        assert_eq!(err.http_status(), 422);
        assert_eq!(doc, json!({"a": 1, "b": [1, 2]}));

        let err = json_patch(&mut doc, &json!({"op": "add"})).unwrap_err();
        assert_eq!(err.http_status(), 400);
        let err = json_patch(&mut doc, &json!(["add"])).unwrap_err();
        assert_eq!(err.http_status(), 400);
        let many = Value::Array(vec![
            json!({"op": "test", "path": "/a", "value": 1});
            MAX_JSON_PATCH_OPERATIONS + 1
        ]);
        let err = json_patch(&mut doc, &many).unwrap_err();
        assert_eq!(
            err.to_string(),
            "The allowed maximum operations in a JSON patch is 10000, got 10001"
        );
        assert_eq!(err.http_status(), 413);
    }

    #[test]
    fn json_patch_typed_ops_from_the_crate() {
        let ops: json_patch::Patch = serde_json::from_value(json!([
            {"op": "add", "path": "/metadata/labels/x", "value": "1"},
            {"op": "remove", "path": "/metadata/labels/y"}
        ]))
        .unwrap();
        let mut doc = json!({"metadata": {"labels": {"y": "2"}}});
        json_patch_ops(&mut doc, &ops).unwrap();
        assert_eq!(doc, json!({"metadata": {"labels": {"x": "1"}}}));
    }

    // ---------------------------------------------------------------------------------------
    // Strategic merge patch on built-in kinds
    // ---------------------------------------------------------------------------------------

    fn smp(kind: &str, doc: Value, patch: Value) -> Result<Value, PatchError> {
        let mut doc = doc;
        let schema = Schema::for_kind(kind).unwrap();
        strategic_merge_patch(&mut doc, &patch, schema).map(|()| doc)
    }

    #[test]
    fn table_lookups() {
        use Strategy::*;
        let cases: &[(&str, &[&str], Option<Strategy>)] = &[
            ("Pod", &["spec", "containers"], Some(MergeByKey("name"))),
            ("Pod", &["spec", "initContainers"], Some(MergeByKey("name"))),
            (
                "Pod",
                &["spec", "ephemeralContainers", "env"],
                Some(MergeByKey("name")),
            ),
            (
                "Pod",
                &["spec", "containers", "ports"],
                Some(MergeByKey("containerPort")),
            ),
            (
                "Pod",
                &["spec", "containers", "env"],
                Some(MergeByKey("name")),
            ),
            (
                "Pod",
                &["spec", "containers", "volumeMounts"],
                Some(MergeByKey("mountPath")),
            ),
            (
                "Pod",
                &["spec", "containers", "volumeDevices"],
                Some(MergeByKey("devicePath")),
            ),
            ("Pod", &["spec", "volumes"], Some(MergeByKey("name"))),
            (
                "Pod",
                &["spec", "imagePullSecrets"],
                Some(MergeByKey("name")),
            ),
            ("Pod", &["spec", "hostAliases"], Some(MergeByKey("ip"))),
            (
                "Pod",
                &["spec", "topologySpreadConstraints"],
                Some(MergeByKey("topologyKey")),
            ),
            (
                "Pod",
                &["spec", "schedulingGates"],
                Some(MergeByKey("name")),
            ),
            ("Pod", &["spec", "resourceClaims"], Some(MergeByKey("name"))),
            ("Pod", &["spec", "tolerations"], None),
            ("Pod", &["spec", "containers", "args"], None),
            ("Pod", &["status", "conditions"], Some(MergeByKey("type"))),
            ("Pod", &["status", "podIPs"], Some(MergeByKey("ip"))),
            ("Pod", &["status", "containerStatuses"], None),
            ("Pod", &["metadata", "finalizers"], Some(MergePrimitives)),
            (
                "Pod",
                &["metadata", "ownerReferences"],
                Some(MergeByKey("uid")),
            ),
            (
                "ConfigMap",
                &["metadata", "finalizers"],
                Some(MergePrimitives),
            ),
            ("Node", &["spec", "taints"], None),
            ("Node", &["spec", "podCIDRs"], Some(MergePrimitives)),
            ("Node", &["status", "conditions"], Some(MergeByKey("type"))),
            ("Node", &["status", "addresses"], Some(MergeByKey("type"))),
            ("Node", &["status", "images"], None),
            ("Service", &["spec", "ports"], Some(MergeByKey("port"))),
            ("Endpoints", &["subsets"], None),
            (
                "Deployment",
                &["spec", "template", "spec", "containers", "ports"],
                Some(MergeByKey("containerPort")),
            ),
            (
                "Deployment",
                &["spec", "template", "metadata", "finalizers"],
                Some(MergePrimitives),
            ),
            (
                "Deployment",
                &["status", "conditions"],
                Some(MergeByKey("type")),
            ),
            (
                "ReplicaSet",
                &["spec", "template", "spec", "volumes"],
                Some(MergeByKey("name")),
            ),
            ("StatefulSet", &["spec", "volumeClaimTemplates"], None),
            (
                "CronJob",
                &[
                    "spec",
                    "jobTemplate",
                    "spec",
                    "template",
                    "spec",
                    "containers",
                ],
                Some(MergeByKey("name")),
            ),
            ("PodDisruptionBudget", &["spec", "selector"], Some(Replace)),
            ("ServiceAccount", &["secrets"], Some(MergeByKey("name"))),
            ("CSINode", &["spec", "drivers"], Some(MergeByKey("name"))),
            (
                "Namespace",
                &["status", "conditions"],
                Some(MergeByKey("type")),
            ),
            ("Widget", &["spec"], None),
        ];
        for (kind, path, want) in cases {
            assert_eq!(field_strategy(kind, path), *want, "{kind} {path:?}");
        }
        assert!(Schema::for_kind("Widget").is_none());
        assert_eq!(
            Schema::for_kind("Pod").and_then(|s| s.type_name()),
            Some("Pod")
        );
    }

    #[test]
    fn pod_containers_merge_by_name() {
        let pod = json!({"spec": {"containers": [
            {"name": "a", "image": "a:1", "env": [{"name": "X", "value": "1"}, {"name": "Y", "value": "2"}],
             "ports": [{"containerPort": 80, "protocol": "TCP"}], "args": ["x", "y"]},
            {"name": "b", "image": "b:1"}
        ]}});
        let patch = json!({"spec": {"containers": [
            {"name": "a", "image": "a:2", "env": [{"name": "Y", "value": "3"}, {"name": "Z", "value": "4"}],
             "ports": [{"containerPort": 80, "name": "http"}, {"containerPort": 443}], "args": ["z"]}
        ]}});
        let got = smp("Pod", pod, patch).unwrap();
        assert_eq!(
            got,
            json!({"spec": {"containers": [
                {"name": "a", "image": "a:2",
                 "env": [{"name": "X", "value": "1"}, {"name": "Y", "value": "3"}, {"name": "Z", "value": "4"}],
                 "ports": [{"containerPort": 80, "protocol": "TCP", "name": "http"}, {"containerPort": 443}],
                 "args": ["z"]},
                {"name": "b", "image": "b:1"}
            ]}})
        );
    }

    #[test]
    fn pod_lists_without_merge_key_are_replaced() {
        let pod = json!({"spec": {
            "tolerations": [{"key": "a", "operator": "Exists"}],
            "containers": [{"name": "c", "image": "i"}]
        }});
        let patch = json!({"spec": {"tolerations": [{"key": "b", "operator": "Exists"}]}});
        let got = smp("Pod", pod, patch).unwrap();
        assert_eq!(
            got["spec"]["tolerations"],
            json!([{"key": "b", "operator": "Exists"}])
        );
        assert_eq!(
            got["spec"]["containers"],
            json!([{"name": "c", "image": "i"}])
        );
    }

    #[test]
    fn pod_volumes_mounts_and_other_keyed_lists() {
        let pod = json!({"spec": {
            "volumes": [{"name": "v1", "emptyDir": {}}],
            "imagePullSecrets": [{"name": "s1"}],
            "hostAliases": [{"ip": "10.0.0.1", "hostnames": ["a"]}],
            "schedulingGates": [{"name": "g1"}, {"name": "g2"}],
            "topologySpreadConstraints": [{"topologyKey": "zone", "maxSkew": 1}],
            "containers": [{"name": "c", "volumeMounts": [{"mountPath": "/a", "name": "v1"}]}]
        }});
        let patch = json!({"spec": {
            "volumes": [{"name": "v2", "configMap": {"name": "cm"}}],
            "imagePullSecrets": [{"name": "s2"}],
            "hostAliases": [{"ip": "10.0.0.1", "hostnames": ["b"]}],
            "schedulingGates": [{"name": "g1", "$patch": "delete"}],
            "topologySpreadConstraints": [{"topologyKey": "zone", "maxSkew": 2}],
            "containers": [{"name": "c", "volumeMounts": [{"mountPath": "/b", "name": "v2"}]}]
        }});
        let got = smp("Pod", pod, patch).unwrap();
        // Without `$setElementOrder`, upstream puts items new to the list before the live ones.
        assert_eq!(
            got,
            json!({"spec": {
                "volumes": [{"name": "v2", "configMap": {"name": "cm"}}, {"name": "v1", "emptyDir": {}}],
                "imagePullSecrets": [{"name": "s2"}, {"name": "s1"}],
                "hostAliases": [{"ip": "10.0.0.1", "hostnames": ["b"]}],
                "schedulingGates": [{"name": "g2"}],
                "topologySpreadConstraints": [{"topologyKey": "zone", "maxSkew": 2}],
                "containers": [{"name": "c", "volumeMounts": [{"mountPath": "/b", "name": "v2"}, {"mountPath": "/a", "name": "v1"}]}]
            }})
        );
    }

    #[test]
    fn metadata_finalizers_owner_references_labels() {
        let obj = json!({"metadata": {
            "name": "x",
            "labels": {"a": "1", "b": "2"},
            "finalizers": ["f1", "f2"],
            "ownerReferences": [{"uid": "u1", "kind": "ReplicaSet", "name": "rs1"}]
        }});
        let patch = json!({"metadata": {
            "labels": {"a": null, "c": "3"},
            "finalizers": ["f3", "f1"],
            "ownerReferences": [{"uid": "u1", "controller": true}, {"uid": "u2", "kind": "Job", "name": "j"}]
        }});
        let got = smp("ConfigMap", obj, patch).unwrap();
        assert_eq!(
            got,
            json!({"metadata": {
                "name": "x",
                "labels": {"b": "2", "c": "3"},
                "finalizers": ["f3", "f1", "f2"],
                "ownerReferences": [
                    {"uid": "u1", "kind": "ReplicaSet", "name": "rs1", "controller": true},
                    {"uid": "u2", "kind": "Job", "name": "j"}
                ]
            }})
        );
        // Removing a finalizer takes the parallel deletion list.
        let got = smp(
            "ConfigMap",
            got,
            json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["f1"]}}),
        )
        .unwrap();
        assert_eq!(got["metadata"]["finalizers"], json!(["f3", "f2"]));
        // Or a null.
        let got = smp("ConfigMap", got, json!({"metadata": {"finalizers": null}})).unwrap();
        assert_eq!(got["metadata"].get("finalizers"), None);
    }

    #[test]
    fn status_conditions_merge_by_type() {
        let pod = json!({"status": {"phase": "Pending", "conditions": [
            {"type": "PodScheduled", "status": "True"},
            {"type": "Ready", "status": "False", "reason": "X"}
        ], "containerStatuses": [{"name": "a", "ready": false}, {"name": "b", "ready": false}]}});
        let patch = json!({"status": {"phase": "Running", "conditions": [
            {"type": "Ready", "status": "True", "reason": null}
        ], "containerStatuses": [{"name": "a", "ready": true}]}});
        let got = smp("Pod", pod, patch).unwrap();
        assert_eq!(
            got,
            json!({"status": {"phase": "Running", "conditions": [
            {"type": "PodScheduled", "status": "True"},
            {"type": "Ready", "status": "True"}
        ], "containerStatuses": [{"name": "a", "ready": true}]}})
        );
    }

    #[test]
    fn node_status_and_spec() {
        let node = json!({
            "spec": {"taints": [{"key": "a", "effect": "NoSchedule"}], "podCIDRs": ["10.0.0.0/24"]},
            "status": {
                "conditions": [{"type": "Ready", "status": "False"}, {"type": "MemoryPressure", "status": "False"}],
                "addresses": [{"type": "InternalIP", "address": "1.1.1.1"}],
                "images": [{"names": ["a"]}]
            }
        });
        let patch = json!({
            "spec": {"taints": [{"key": "b", "effect": "NoExecute"}], "podCIDRs": ["fd00::/64"]},
            "status": {
                "conditions": [{"type": "Ready", "status": "True"}],
                "addresses": [{"type": "Hostname", "address": "n1"}],
                "images": [{"names": ["b"]}]
            }
        });
        let got = smp("Node", node, patch).unwrap();
        assert_eq!(
            got,
            json!({
                "spec": {"taints": [{"key": "b", "effect": "NoExecute"}], "podCIDRs": ["fd00::/64", "10.0.0.0/24"]},
                "status": {
                    "conditions": [{"type": "Ready", "status": "True"}, {"type": "MemoryPressure", "status": "False"}],
                    "addresses": [{"type": "Hostname", "address": "n1"}, {"type": "InternalIP", "address": "1.1.1.1"}],
                    "images": [{"names": ["b"]}]
                }
            })
        );
    }

    #[test]
    fn service_ports_deployment_template_pdb_selector() {
        let svc = json!({"spec": {"ports": [{"port": 80, "targetPort": 8080}], "selector": {"app": "a"}}});
        let got = smp("Service", svc, json!({"spec": {"ports": [{"port": 80, "targetPort": 9090}, {"port": 443}], "selector": {"tier": "fe"}}})).unwrap();
        assert_eq!(
            got,
            json!({"spec": {"ports": [{"port": 80, "targetPort": 9090}, {"port": 443}], "selector": {"app": "a", "tier": "fe"}}})
        );

        let deploy = json!({"spec": {"replicas": 1, "template": {"metadata": {"labels": {"app": "a"}}, "spec": {"containers": [
            {"name": "app", "image": "a:1"}, {"name": "side", "image": "s:1"}
        ]}}}});
        let got = smp("Deployment", deploy, json!({"spec": {"replicas": 3, "template": {"spec": {"containers": [{"name": "app", "image": "a:2"}]}}}})).unwrap();
        assert_eq!(
            got,
            json!({"spec": {"replicas": 3, "template": {"metadata": {"labels": {"app": "a"}}, "spec": {"containers": [
                {"name": "app", "image": "a:2"}, {"name": "side", "image": "s:1"}
            ]}}}})
        );

        let pdb = json!({"spec": {"selector": {"matchLabels": {"a": "1"}}, "minAvailable": 1}});
        let got = smp(
            "PodDisruptionBudget",
            pdb,
            json!({"spec": {"selector": {"matchLabels": {"b": "2"}}}}),
        )
        .unwrap();
        assert_eq!(
            got,
            json!({"spec": {"selector": {"matchLabels": {"b": "2"}}, "minAvailable": 1}})
        );
    }

    #[test]
    fn ports_merge_by_container_port_only() {
        // Upstream's merge key is containerPort alone: the same port with another protocol merges.
        let pod = json!({"spec": {"containers": [{"name": "c", "ports": [{"containerPort": 53, "protocol": "TCP"}]}]}});
        let got = smp("Pod", pod, json!({"spec": {"containers": [{"name": "c", "ports": [{"containerPort": 53, "protocol": "UDP"}]}]}})).unwrap();
        assert_eq!(
            got["spec"]["containers"][0]["ports"],
            json!([{"containerPort": 53, "protocol": "UDP"}])
        );
    }

    #[test]
    fn unknown_fields_merge_objects_and_replace_lists() {
        let obj = json!({"spec": {"extra": {"a": 1, "list": [{"name": "x"}]}}});
        let got = smp(
            "Pod",
            obj,
            json!({"spec": {"extra": {"b": 2, "list": [{"name": "y"}]}}}),
        )
        .unwrap();
        assert_eq!(
            got,
            json!({"spec": {"extra": {"a": 1, "b": 2, "list": [{"name": "y"}]}}})
        );
        let mut doc = json!({"a": {"b": [1, 2]}, "c": 1});
        strategic_merge_patch(
            &mut doc,
            &json!({"a": {"b": [3]}, "c": null}),
            Schema::untyped(),
        )
        .unwrap();
        assert_eq!(doc, json!({"a": {"b": [3]}}));
    }

    // ---------------------------------------------------------------------------------------
    // Directives
    // ---------------------------------------------------------------------------------------

    #[test]
    fn directive_patch_replace_and_delete_in_maps() {
        let pod = json!({"metadata": {"labels": {"a": "1", "b": "2"}, "annotations": {"x": "y"}}});
        let got = smp(
            "Pod",
            pod.clone(),
            json!({"metadata": {"labels": {"$patch": "replace", "c": "3"}}}),
        )
        .unwrap();
        assert_eq!(got["metadata"]["labels"], json!({"c": "3"}));
        let got = smp(
            "Pod",
            pod.clone(),
            json!({"metadata": {"annotations": {"$patch": "delete"}}}),
        )
        .unwrap();
        assert_eq!(got["metadata"]["annotations"], json!({}));
        // On a member the document lacks, a directive-marked object is dropped.
        let got = smp(
            "Pod",
            pod.clone(),
            json!({"spec": {"$patch": "replace", "a": 1}}),
        )
        .unwrap();
        assert_eq!(got.get("spec"), None);
        // `merge` is not accepted in an object, as upstream.
        let err = smp(
            "Pod",
            pod,
            json!({"metadata": {"labels": {"$patch": "merge"}}}),
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "unknown patch type: merge in map: map[$patch:merge]"
        );
        assert_eq!(err.http_status(), 500);
    }

    #[test]
    fn directive_patch_in_list_items() {
        let pod = json!({"spec": {"containers": [{"name": "a"}, {"name": "b"}, {"name": "c"}]}});
        let got = smp(
            "Pod",
            pod.clone(),
            json!({"spec": {"containers": [{"name": "b", "$patch": "delete"}]}}),
        )
        .unwrap();
        assert_eq!(
            got["spec"]["containers"],
            json!([{"name": "a"}, {"name": "c"}])
        );
        let got = smp(
            "Pod",
            pod.clone(),
            json!({"spec": {"containers": [{"$patch": "replace"}, {"name": "z"}]}}),
        )
        .unwrap();
        assert_eq!(got["spec"]["containers"], json!([{"name": "z"}]));
        let got = smp(
            "Pod",
            pod.clone(),
            json!({"spec": {"containers": [{"$patch": "replace"}]}}),
        )
        .unwrap();
        assert_eq!(got["spec"]["containers"], json!([]));
        let err = smp(
            "Pod",
            pod.clone(),
            json!({"spec": {"containers": [{"$patch": "merge"}]}}),
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "merging lists cannot yet be specified in the patch"
        );
        let err = smp(
            "Pod",
            pod.clone(),
            json!({"spec": {"containers": [{"$patch": "frob", "name": "a"}]}}),
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "unknown patch type: frob in map: map[$patch:frob name:a]"
        );
        let err = smp(
            "Pod",
            pod,
            json!({"spec": {"containers": [{"$patch": "delete"}]}}),
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "map: map[$patch:delete] does not contain declared merge key: name"
        );
    }

    #[test]
    fn directive_retain_keys() {
        let deploy = json!({"spec": {"strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1}}}});
        let got = smp(
            "Deployment",
            deploy.clone(),
            json!({"spec": {"strategy": {"$retainKeys": ["type"], "type": "Recreate"}}}),
        )
        .unwrap();
        assert_eq!(got, json!({"spec": {"strategy": {"type": "Recreate"}}}));
        let err = smp(
            "Deployment",
            deploy.clone(),
            json!({"spec": {"strategy": {"$retainKeys": ["type"], "rollingUpdate": {}}}}),
        )
        .unwrap_err();
        assert_eq!(err.to_string(), "invalid patch format of retainKeys");
        assert_eq!(err.http_status(), 400);
        let err = smp(
            "Deployment",
            deploy,
            json!({"spec": {"strategy": {"$retainKeys": "type"}}}),
        )
        .unwrap_err();
        assert!(
            matches!(err, PatchError::BadRetainKeys { ref path } if path == "/spec/strategy"),
            "{err:?}"
        );
        // Volumes carry retainKeys too: switching a volume's source.
        let pod = json!({"spec": {"volumes": [{"name": "v", "emptyDir": {}}]}});
        let got = smp("Pod", pod, json!({"spec": {"volumes": [{"name": "v", "$retainKeys": ["name", "configMap"], "configMap": {"name": "c"}}]}})).unwrap();
        assert_eq!(
            got["spec"]["volumes"],
            json!([{"name": "v", "configMap": {"name": "c"}}])
        );
    }

    #[test]
    fn directive_delete_from_primitive_list() {
        let node = json!({"spec": {"podCIDRs": ["a", "b", "c"]}});
        let got = smp(
            "Node",
            node.clone(),
            json!({"spec": {"$deleteFromPrimitiveList/podCIDRs": ["b", "x"]}}),
        )
        .unwrap();
        assert_eq!(got["spec"]["podCIDRs"], json!(["a", "c"]));
        // It also works on lists without the merge strategy, and never creates the list.
        let pod = json!({"spec": {"containers": [{"name": "c", "args": ["1", "2"]}]}});
        let got = smp("Pod", pod, json!({"spec": {"containers": [{"name": "c", "$deleteFromPrimitiveList/args": ["1"], "$deleteFromPrimitiveList/command": ["x"]}]}})).unwrap();
        assert_eq!(
            got["spec"]["containers"],
            json!([{"name": "c", "args": ["2"]}])
        );
        let err = smp(
            "Node",
            node,
            json!({"spec": {"$deleteFromPrimitiveListpodCIDRs": ["b"]}}),
        )
        .unwrap_err();
        assert_eq!(err.to_string(), "invalid patch format of primitive list");
        assert_eq!(err.http_status(), 400);
    }

    #[test]
    fn directive_set_element_order() {
        // kubectl apply reordering containers and adding one.
        let pod = json!({"spec": {"containers": [{"name": "a", "image": "1"}, {"name": "b", "image": "1"}]}});
        let patch = json!({"spec": {
            "$setElementOrder/containers": [{"name": "c"}, {"name": "b"}, {"name": "a"}],
            "containers": [{"name": "c", "image": "1"}]
        }});
        let got = smp("Pod", pod, patch).unwrap();
        assert_eq!(
            got["spec"]["containers"],
            json!([
                {"name": "c", "image": "1"}, {"name": "b", "image": "1"}, {"name": "a", "image": "1"}
            ])
        );
        // A server-only item goes before an ordered item that follows it in the live list.
        let obj = json!({"metadata": {"finalizers": ["a", "server", "b"]}});
        let got = smp(
            "ConfigMap",
            obj,
            json!({"metadata": {"$setElementOrder/finalizers": ["b", "a"]}}),
        )
        .unwrap();
        assert_eq!(got["metadata"]["finalizers"], json!(["server", "b", "a"]));
        let obj = json!({"metadata": {"finalizers": ["a", "b", "server"]}});
        let got = smp(
            "ConfigMap",
            obj,
            json!({"metadata": {"$setElementOrder/finalizers": ["b", "a"]}}),
        )
        .unwrap();
        assert_eq!(got["metadata"]["finalizers"], json!(["b", "a", "server"]));
        // An order list contradicting the patch list is refused.
        let pod = json!({"spec": {"containers": [{"name": "a"}, {"name": "b"}]}});
        let patch = json!({"spec": {
            "$setElementOrder/containers": [{"name": "a"}, {"name": "b"}],
            "containers": [{"name": "b", "image": "x"}, {"name": "a", "image": "y"}]
        }});
        let err = smp("Pod", pod.clone(), patch).unwrap_err();
        assert!(err.to_string().starts_with("The order in patch list:\n[map[image:x name:b] map[image:y name:a]]\n doesn't match $setElementOrder list:\n[map[name:a] map[name:b]]"), "{err}");
        let err = smp(
            "Pod",
            pod.clone(),
            json!({"spec": {"$setElementOrdercontainers": []}}),
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid patch format of setElementOrder list"
        );
        let err = smp(
            "Pod",
            pod,
            json!({"spec": {"$setElementOrder/containers": "a"}}),
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "expected a []interface {}, but received a string"
        );
    }

    #[test]
    fn nulls_and_type_changes() {
        let doc = json!({"a": {"b": 1}, "c": [1], "d": "x"});
        let mut got = doc.clone();
        strategic_merge_patch(&mut got, &json!({"a": null, "c": {"x": null, "y": 1}, "d": [1, null], "e": {"f": null, "g": {"$patch": "delete"}}}), Schema::untyped()).unwrap();
        // A type change takes the patch value, its nested nulls and directive objects dropped.
        assert_eq!(got, json!({"c": {"y": 1}, "d": [1, null], "e": {}}));
        // A null patch changes nothing.
        let mut same = doc.clone();
        strategic_merge_patch(&mut same, &Value::Null, Schema::untyped()).unwrap();
        assert_eq!(same, doc);
    }

    #[test]
    fn strategic_errors() {
        let pod = json!({"spec": {"containers": [{"name": "a"}]}});
        let err = smp(
            "Pod",
            pod.clone(),
            json!({"spec": {"containers": [{"image": "x"}]}}),
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "map: map[image:x] does not contain declared merge key: name"
        );
        assert!(
            matches!(err, PatchError::Strategic { ref path, .. } if path == "/spec/containers"),
            "{err:?}"
        );
        let err = smp("Pod", pod.clone(), json!({"spec": {"containers": [[1]]}})).unwrap_err();
        assert_eq!(
            err.to_string(),
            "list element types are not identical: [[map[name:a]] [[1]]]"
        );
        let obj = json!({"metadata": {"finalizers": [["a"]]}});
        let err = smp("Pod", obj, json!({"metadata": {"finalizers": [["b"]]}})).unwrap_err();
        assert_eq!(err.to_string(), "lists of lists are not supported");
        assert_eq!(err.http_status(), 422);
        let obj = json!({"metadata": {"finalizers": ["a", 1]}});
        let err = smp("Pod", obj, json!({"metadata": {"finalizers": [2.5]}})).unwrap_err();
        assert_eq!(
            err.to_string(),
            "list element types are not identical: [[a 1] [2.5]]"
        );
        let obj = json!({"metadata": {"finalizers": [{"a": 1}]}});
        let err = smp("Pod", obj, json!({"metadata": {"finalizers": [{"b": 1}]}})).unwrap_err();
        assert_eq!(
            err.to_string(),
            "cannot merge lists without merge key for struct"
        );
        let obj = json!({"spec": {"tolerations": [{"key": "a"}]}});
        let err = smp(
            "Pod",
            obj,
            json!({"spec": {"$deleteFromPrimitiveList/tolerations": [{"key": "a"}]}}),
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "cannot merge lists without merge key for struct"
        );
        let err = smp("Pod", pod.clone(), json!([1])).unwrap_err();
        assert_eq!(
            err.to_string(),
            "json: cannot unmarshal array into Go value of type map[string]interface {}"
        );
        assert_eq!(err.http_status(), 400);
        let mut scalar = json!(1);
        assert!(matches!(
            strategic_merge_patch(&mut scalar, &json!({}), Schema::untyped()),
            Err(PatchError::InvalidDocument(_))
        ));
        // A failed patch leaves the document alone.
        let mut doc = pod.clone();
        let schema = Schema::for_kind("Pod").unwrap();
        assert!(
            strategic_merge_patch(
                &mut doc,
                &json!({"metadata": {"a": 1}, "spec": {"containers": [{}]}}),
                schema
            )
            .is_err()
        );
        assert_eq!(doc, pod);
    }

    #[test]
    fn error_texts_use_go_formatting() {
        assert_eq!(
            go_v(&json!({"b": [1, 2.5, null], "a": {"c": true}})),
            "map[a:map[c:true] b:[1 2.5 <nil>]]"
        );
        assert_eq!(go_float(1_000_000.0), "1e+06");
        assert_eq!(go_float(123_456.0), "123456");
        assert_eq!(go_float(0.00001), "1e-05");
        assert_eq!(go_float(0.5), "0.5");
        assert_eq!(go_s(&json!(5)), "%!s(int64=5)");
    }

    #[test]
    fn normalize_drops_what_a_typed_decode_drops() {
        let mut v = json!({"a": null, "b": {"$patch": "replace", "c": 1, "$retainKeys": ["c"]},
            "d": [{"$setElementOrder/x": [], "$deleteFromPrimitiveList/y": [], "e": null, "$other": 1}, null]});
        normalize_after_patch(&mut v);
        assert_eq!(v, json!({"b": {"c": 1}, "d": [{"$other": 1}, null]}));
    }

    // ---------------------------------------------------------------------------------------
    // Upstream test cases (k8s.io/apimachinery strategicpatch patch_test.go), as JSON
    // ---------------------------------------------------------------------------------------

    // The `MergeItem` test type of upstream's tests, as a table.
    static MERGE_ITEM: &[FieldRow] = &[
        FieldRow::merge_by("MergeItem", "mergingList", "name", Some("MergeItem")),
        FieldRow::nested("MergeItem", "nonMergingList", "MergeItem"),
        FieldRow::merge_set("MergeItem", "mergingIntList"),
        FieldRow::new(
            "MergeItem",
            "mergeItemPtr",
            Strategy::MergeByKey("name"),
            Some("MergeItem"),
        ),
        FieldRow::replace("MergeItem", "replacingItem"),
        FieldRow::nested("MergeItem", "retainKeysMap", "RetainKeysMergeItem"),
        FieldRow::merge_by(
            "MergeItem",
            "retainKeysMergingList",
            "name",
            Some("MergeItem"),
        ),
        FieldRow::merge_set("RetainKeysMergeItem", "mergingIntList"),
        FieldRow::merge_by(
            "RetainKeysMergeItem",
            "mergingList",
            "name",
            Some("MergeItem"),
        ),
        FieldRow::nested("RetainKeysMergeItem", "nonMergingList", "MergeItem"),
    ];

    #[test]
    fn upstream_strategic_merge_cases() {
        let cases: Vec<Value> = serde_json::from_str(UPSTREAM_CASES).unwrap();
        let schema = Schema::new(MERGE_ITEM, "MergeItem");
        let mut checked = 0;
        for case in &cases {
            let name = case["description"].as_str().unwrap();
            let two_way_result = case.get("twoWayResult").or_else(|| case.get("modified"));
            let runs = [
                (
                    "twoWay",
                    case.get("original"),
                    two_way_result,
                    case.get("expectedError"),
                ),
                ("threeWay", case.get("current"), case.get("result"), None),
            ];
            for (which, original, want, want_err) in runs {
                let (Some(patch), Some(original)) = (case.get(which), original) else {
                    continue;
                };
                let mut doc = original.clone();
                let res = strategic_merge_patch(&mut doc, patch, schema);
                checked += 1;
                match (res, want_err) {
                    (Err(e), Some(w)) => {
                        assert!(e.to_string().contains(w.as_str().unwrap()), "{name}: {e}")
                    }
                    (Err(e), None) => panic!("{name} ({which}): {e}"),
                    (Ok(()), Some(w)) => panic!("{name} ({which}): expected error {w}"),
                    (Ok(()), None) => assert_eq!(&doc, want.unwrap(), "{name} ({which})"),
                }
            }
        }
        assert!(checked >= 120, "{checked}");
    }

    // ---------------------------------------------------------------------------------------
    // Properties
    // ---------------------------------------------------------------------------------------

    // A JSON value without nulls (merge patches cannot express them).
    fn arb_value() -> impl Gen<Value = Value> {
        let leaf = prop_oneof![
            any::<bool>().prop_map(Value::Bool),
            (-5i64..5).prop_map(Value::from),
            "[a-c]{0,2}".prop_map(Value::String),
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..3).prop_map(Value::Array),
                proptest::collection::btree_map("[a-d]", inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    fn arb_object() -> impl Gen<Value = Value> {
        proptest::collection::btree_map("[a-d]", arb_value(), 0..5)
            .prop_map(|m| Value::Object(m.into_iter().collect()))
    }

    // The RFC 7386 patch that turns `from` into `to`.
    fn diff(from: &Value, to: &Value) -> Value {
        match (from, to) {
            (Value::Object(f), Value::Object(t)) => {
                let mut patch = Map::new();
                for k in f.keys() {
                    if !t.contains_key(k) {
                        patch.insert(k.clone(), Value::Null);
                    }
                }
                for (k, tv) in t {
                    match f.get(k) {
                        Some(fv) if fv == tv => {}
                        Some(fv) if fv.is_object() && tv.is_object() => {
                            patch.insert(k.clone(), diff(fv, tv));
                        }
                        _ => {
                            patch.insert(k.clone(), tv.clone());
                        }
                    }
                }
                Value::Object(patch)
            }
            _ => to.clone(),
        }
    }

    fn arb_op() -> impl Gen<Value = Value> {
        let path =
            proptest::collection::vec(prop_oneof!["[a-c]", "-?[0-3]", Just("-".to_owned())], 0..4)
                .prop_map(|segs| segs.iter().map(|s| format!("/{s}")).collect::<String>());
        let op = prop_oneof![
            Just("add"),
            Just("remove"),
            Just("replace"),
            Just("move"),
            Just("copy"),
            Just("test"),
            Just("x")
        ];
        (op, path.clone(), path, arb_value()).prop_map(
            |(op, path, from, value)| json!({"op": op, "path": path, "from": from, "value": value}),
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn merge_patch_of_a_diff_gives_the_target(from in arb_object(), to in arb_object()) {
            let patch = diff(&from, &to);
            let mut doc = from.clone();
            json_merge_patch(&mut doc, &patch);
            prop_assert_eq!(&doc, &to);
            // The API server's merge patch agrees on null-free documents.
            let mut doc = from.clone();
            apply_merge_patch(&mut doc, &patch).unwrap();
            prop_assert_eq!(&doc, &to);
            // And so does a strategic merge with no tagged fields.
            let mut doc = from.clone();
            strategic_merge_patch(&mut doc, &patch, Schema::untyped()).unwrap();
            prop_assert_eq!(&doc, &to);
            // Applying twice changes nothing more.
            json_merge_patch(&mut doc, &patch);
            prop_assert_eq!(&doc, &to);
        }

        #[test]
        fn json_patch_never_panics_and_is_atomic(doc in arb_object(), ops in proptest::collection::vec(arb_op(), 0..5)) {
            let mut target = doc.clone();
            if json_patch(&mut target, &Value::Array(ops)).is_err() {
                prop_assert_eq!(target, doc);
            }
        }

        #[test]
        fn strategic_patch_never_panics(doc in arb_object(), patch in arb_object(), kind in prop_oneof![Just("Pod"), Just("Node"), Just("Deployment")]) {
            let schema = Schema::for_kind(kind).unwrap();
            let wrap = |v: Value| json!({"metadata": {"finalizers": v.clone()}, "spec": {"containers": [v.clone()], "a": v}});
            let mut target = wrap(doc.clone());
            let before = target.clone();
            if strategic_merge_patch(&mut target, &wrap(patch), schema).is_err() {
                prop_assert_eq!(target, before);
            }
        }

        #[test]
        fn strategic_merge_of_keyed_lists_keeps_every_key(
            live in proptest::collection::btree_set("[a-f]", 0..5),
            patch in proptest::collection::btree_set("[a-h]", 0..5),
        ) {
            let items = |names: &std::collections::BTreeSet<String>| names.iter().map(|n| json!({"name": n})).collect::<Vec<_>>();
            let mut pod = json!({"spec": {"containers": items(&live)}});
            let schema = Schema::for_kind("Pod").unwrap();
            strategic_merge_patch(&mut pod, &json!({"spec": {"containers": items(&patch)}}), schema).unwrap();
            let mut got: Vec<String> = pod["spec"]["containers"].as_array().unwrap().iter().map(|c| c["name"].as_str().unwrap().to_owned()).collect();
            got.sort();
            let mut want: Vec<String> = live.union(&patch).cloned().collect();
            want.sort();
            prop_assert_eq!(got, want);
        }
    }

    // A sample of upstream's `strategicMergePatchRawTestCases`, `customStrategicMergePatch...`
    // and `replaceRawExtensionPatchTestCases`, converted from YAML to JSON: `twoWay` applied to
    // `original` gives `twoWayResult` (else `modified`), `threeWay` applied to `current` gives
    // `result`.
    const UPSTREAM_CASES: &str = r#"[
{"description":"nested patch merge with empty list","original":{"name":"hi"},"twoWay":{"mergingList":[{"name":"hello"},{"$patch":"delete","name":"doesntexist"}]},"twoWayResult":{"name":"hi","mergingList":[{"name":"hello"}]},"current":{"name":"hi","mergingList":[{"name":"hello2"}]},"threeWay":{"$setElementOrder/mergingList":[{"name":"hello"},{"name":"doesntexist"}],"mergingList":[{"name":"hello"}]},"result":{"name":"hi","mergingList":[{"name":"hello"},{"name":"hello2"}]},"group":"raw"},
{"description":"delete items in lists of scalars","original":{"mergingIntList":[1,2,3]},"twoWay":{"$setElementOrder/mergingIntList":[1,2],"$deleteFromPrimitiveList/mergingIntList":[3]},"modified":{"mergingIntList":[1,2]},"current":{"mergingIntList":[1,2,3,4]},"threeWay":{"$setElementOrder/mergingIntList":[1,2],"$deleteFromPrimitiveList/mergingIntList":[3]},"result":{"mergingIntList":[1,2,4]},"group":"raw"},
{"description":"delete all duplicate items in lists of scalars","original":{"mergingIntList":[1,2,3,3]},"twoWay":{"$setElementOrder/mergingIntList":[1,2],"$deleteFromPrimitiveList/mergingIntList":[3]},"modified":{"mergingIntList":[1,2]},"current":{"mergingIntList":[1,2,3,3,4]},"threeWay":{"$setElementOrder/mergingIntList":[1,2],"$deleteFromPrimitiveList/mergingIntList":[3]},"result":{"mergingIntList":[1,2,4]},"group":"raw"},
{"description":"add and delete items in lists of scalars","original":{"mergingIntList":[1,2,3]},"twoWay":{"$setElementOrder/mergingIntList":[1,2,4],"$deleteFromPrimitiveList/mergingIntList":[3],"mergingIntList":[4]},"modified":{"mergingIntList":[1,2,4]},"current":{"mergingIntList":[1,2,3,4]},"threeWay":{"$setElementOrder/mergingIntList":[1,2,4],"$deleteFromPrimitiveList/mergingIntList":[3]},"result":{"mergingIntList":[1,2,4]},"group":"raw"},
{"description":"merge lists of maps","original":{"mergingList":[{"name":1},{"name":2,"value":2}]},"twoWay":{"$setElementOrder/mergingList":[{"name":4},{"name":1},{"name":2},{"name":3}],"mergingList":[{"name":4,"value":4},{"name":3,"value":3}]},"modified":{"mergingList":[{"name":4,"value":4},{"name":1},{"name":2,"value":2},{"name":3,"value":3}]},"current":{"mergingList":[{"name":1,"other":"a"},{"name":2,"value":2,"other":"b"}]},"threeWay":{"$setElementOrder/mergingList":[{"name":4},{"name":1},{"name":2},{"name":3}],"mergingList":[{"name":4,"value":4},{"name":3,"value":3}]},"result":{"mergingList":[{"name":4,"value":4},{"name":1,"other":"a"},{"name":2,"value":2,"other":"b"},{"name":3,"value":3}]},"group":"raw"},
{"description":"replace map field value in merging list","original":{"mergingList":[{"name":1,"value":1},{"name":2,"value":2}]},"twoWay":{"$setElementOrder/mergingList":[{"name":1},{"name":2}],"mergingList":[{"name":1,"value":"a"}]},"modified":{"mergingList":[{"name":1,"value":"a"},{"name":2,"value":2}]},"current":{"mergingList":[{"name":1,"value":1,"other":"a"},{"name":2,"value":2,"other":"b"}]},"threeWay":{"$setElementOrder/mergingList":[{"name":1},{"name":2}],"mergingList":[{"name":1,"value":"a"}]},"result":{"mergingList":[{"name":1,"value":"a","other":"a"},{"name":2,"value":2,"other":"b"}]},"group":"raw"},
{"description":"delete map from merging list","original":{"mergingList":[{"name":1},{"name":2}]},"twoWay":{"$setElementOrder/mergingList":[{"name":2}],"mergingList":[{"name":1,"$patch":"delete"}]},"modified":{"mergingList":[{"name":2}]},"current":{"mergingList":[{"name":1},{"name":2,"other":"b"}]},"threeWay":{"$setElementOrder/mergingList":[{"name":2}],"mergingList":[{"name":1,"$patch":"delete"}]},"result":{"mergingList":[{"name":2,"other":"b"}]},"group":"raw"},
{"description":"add map and delete map from merging list","original":{"mergingList":[{"name":1},{"name":2}]},"twoWay":{"$setElementOrder/mergingList":[{"name":2},{"name":3}],"mergingList":[{"name":3},{"name":1,"$patch":"delete"}]},"modified":{"mergingList":[{"name":2},{"name":3}]},"current":{"mergingList":[{"name":1},{"name":2,"other":"b"},{"name":4,"other":"c"}]},"threeWay":{"$setElementOrder/mergingList":[{"name":2},{"name":3}],"mergingList":[{"name":3},{"name":1,"$patch":"delete"}]},"result":{"mergingList":[{"name":2,"other":"b"},{"name":4,"other":"c"},{"name":3}]},"group":"raw"},
{"description":"delete field from map in merging list","original":{"mergingList":[{"name":1,"value":1},{"name":2,"value":2}]},"twoWay":{"$setElementOrder/mergingList":[{"name":1},{"name":2}],"mergingList":[{"name":1,"value":null}]},"modified":{"mergingList":[{"name":1},{"name":2,"value":2}]},"current":{"mergingList":[{"name":1,"value":1,"other":"a"},{"name":2,"value":2,"other":"b"}]},"threeWay":{"$setElementOrder/mergingList":[{"name":1},{"name":2}],"mergingList":[{"name":1,"value":null}]},"result":{"mergingList":[{"name":1,"other":"a"},{"name":2,"value":2,"other":"b"}]},"group":"raw"},
{"description":"add map to merging list by pointer","original":{"mergeItemPtr":[{"name":1}]},"twoWay":{"$setElementOrder/mergeItemPtr":[{"name":1},{"name":2}],"mergeItemPtr":[{"name":2}]},"modified":{"mergeItemPtr":[{"name":1},{"name":2}]},"current":{"mergeItemPtr":[{"name":1,"other":"a"},{"name":3}]},"threeWay":{"$setElementOrder/mergeItemPtr":[{"name":1},{"name":2}],"mergeItemPtr":[{"name":2}]},"result":{"mergeItemPtr":[{"name":1,"other":"a"},{"name":2},{"name":3}]},"group":"raw"},
{"description":"add field to map in merging list by pointer","original":{"mergeItemPtr":[{"name":1,"mergeItemPtr":[{"name":1},{"name":2,"value":2}]},{"name":2}]},"twoWay":{"$setElementOrder/mergeItemPtr":[{"name":1},{"name":2}],"mergeItemPtr":[{"$setElementOrder/mergeItemPtr":[{"name":1},{"name":2}],"name":1,"mergeItemPtr":[{"name":1,"value":1}]}]},"modified":{"mergeItemPtr":[{"name":1,"mergeItemPtr":[{"name":1,"value":1},{"name":2,"value":2}]},{"name":2}]},"current":{"mergeItemPtr":[{"name":1,"other":"a","mergeItemPtr":[{"name":1,"other":"a"},{"name":2,"value":2,"other":"b"}]},{"name":2,"other":"b"}]},"threeWay":{"$setElementOrder/mergeItemPtr":[{"name":1},{"name":2}],"mergeItemPtr":[{"$setElementOrder/mergeItemPtr":[{"name":1},{"name":2}],"name":1,"mergeItemPtr":[{"name":1,"value":1}]}]},"result":{"mergeItemPtr":[{"name":1,"other":"a","mergeItemPtr":[{"name":1,"value":1,"other":"a"},{"name":2,"value":2,"other":"b"}]},{"name":2,"other":"b"}]},"group":"raw"},
{"description":"merge lists of scalars","original":{"mergingIntList":[1,2]},"twoWay":{"$setElementOrder/mergingIntList":[1,2,3],"mergingIntList":[3]},"modified":{"mergingIntList":[1,2,3]},"current":{"mergingIntList":[1,2,4]},"threeWay":{"$setElementOrder/mergingIntList":[1,2,3],"mergingIntList":[3]},"result":{"mergingIntList":[1,2,3,4]},"group":"raw"},
{"description":"add an item in a list of primitives and preserve order","original":{"mergingIntList":[1,2]},"twoWay":{"$setElementOrder/mergingIntList":[3,1,2],"mergingIntList":[3]},"modified":{"mergingIntList":[3,1,2]},"current":{"mergingIntList":[1,4,2]},"threeWay":{"$setElementOrder/mergingIntList":[3,1,2],"mergingIntList":[3]},"result":{"mergingIntList":[3,1,4,2]},"group":"raw"},
{"description":"delete an item in a list of primitives and preserve order","original":{"mergingIntList":[1,2,3]},"twoWay":{"$setElementOrder/mergingIntList":[2,1],"$deleteFromPrimitiveList/mergingIntList":[3]},"modified":{"mergingIntList":[2,1]},"current":{"mergingIntList":[1,2,3]},"threeWay":{"$setElementOrder/mergingIntList":[2,1],"$deleteFromPrimitiveList/mergingIntList":[3]},"result":{"mergingIntList":[2,1]},"group":"raw"},
{"description":"add an item in a list and preserve order","original":{"mergingList":[{"name":1},{"name":2,"value":2}]},"twoWay":{"$setElementOrder/mergingList":[{"name":3},{"name":1},{"name":2}],"mergingList":[{"name":3,"value":3}]},"modified":{"mergingList":[{"name":3,"value":3},{"name":1},{"name":2,"value":2}]},"current":{"mergingList":[{"name":1,"other":"a"},{"name":2,"value":2,"other":"b"}]},"threeWay":{"$setElementOrder/mergingList":[{"name":3},{"name":1},{"name":2}],"mergingList":[{"name":3,"value":3}]},"result":{"mergingList":[{"name":3,"value":3},{"name":1,"other":"a"},{"name":2,"value":2,"other":"b"}]},"group":"raw"},
{"description":"add multiple items in a list and preserve order","original":{"mergingList":[{"name":1},{"name":2,"value":2}]},"twoWay":{"$setElementOrder/mergingList":[{"name":1},{"name":4},{"name":2},{"name":3}],"mergingList":[{"name":4,"value":4},{"name":3,"value":3}]},"modified":{"mergingList":[{"name":1},{"name":4,"value":4},{"name":2,"value":2},{"name":3,"value":3}]},"current":{"mergingList":[{"name":1,"other":"a"},{"name":2,"value":2,"other":"b"}]},"threeWay":{"$setElementOrder/mergingList":[{"name":1},{"name":4},{"name":2},{"name":3}],"mergingList":[{"name":4,"value":4},{"name":3,"value":3}]},"result":{"mergingList":[{"name":1,"other":"a"},{"name":4,"value":4},{"name":2,"value":2,"other":"b"},{"name":3,"value":3}]},"group":"raw"},
{"description":"delete an item in a list and preserve order","original":{"mergingList":[{"name":1},{"name":3,"value":3},{"name":2,"value":2}]},"twoWay":{"$setElementOrder/mergingList":[{"name":2},{"name":1}],"mergingList":[{"name":3,"$patch":"delete"}]},"modified":{"mergingList":[{"name":2,"value":2},{"name":1}]},"current":{"mergingList":[{"name":1,"other":"a"},{"name":2,"value":2,"other":"b"},{"name":3,"value":3}]},"threeWay":{"$setElementOrder/mergingList":[{"name":2},{"name":1}],"mergingList":[{"name":3,"$patch":"delete"}]},"result":{"mergingList":[{"name":2,"value":2,"other":"b"},{"name":1,"other":"a"}]},"group":"raw"},
{"description":"change an item in a list and preserve order","original":{"mergingList":[{"name":1},{"name":3,"value":3},{"name":2,"value":2}]},"twoWay":{"$setElementOrder/mergingList":[{"name":2},{"name":3},{"name":1}],"mergingList":[{"name":3,"value":"x"}]},"modified":{"mergingList":[{"name":2,"value":2},{"name":3,"value":"x"},{"name":1}]},"current":{"mergingList":[{"name":1,"other":"a"},{"name":2,"value":2,"other":"b"},{"name":3,"value":3}]},"threeWay":{"$setElementOrder/mergingList":[{"name":2},{"name":3},{"name":1}],"mergingList":[{"name":3,"value":"x"}]},"result":{"mergingList":[{"name":2,"value":2,"other":"b"},{"name":3,"value":"x"},{"name":1,"other":"a"}]},"group":"raw"},
{"description":"add and delete an item in a list and preserve order","original":{"mergingList":[{"name":1},{"name":3,"value":3},{"name":2,"value":2}]},"twoWay":{"$setElementOrder/mergingList":[{"name":4},{"name":2},{"name":1}],"mergingList":[{"name":4,"value":4},{"name":3,"$patch":"delete"}]},"modified":{"mergingList":[{"name":4,"value":4},{"name":2,"value":2},{"name":1}]},"current":{"mergingList":[{"name":1,"other":"a"},{"name":2,"value":2,"other":"b"},{"name":3,"value":3}]},"threeWay":{"$setElementOrder/mergingList":[{"name":4},{"name":2},{"name":1}],"mergingList":[{"name":4,"value":4},{"name":3,"$patch":"delete"}]},"result":{"mergingList":[{"name":4,"value":4},{"name":2,"value":2,"other":"b"},{"name":1,"other":"a"}]},"group":"raw"},
{"description":"set elements order in a list","original":{"mergingList":[{"name":1},{"name":3,"value":3},{"name":4,"value":4},{"name":2,"value":2}]},"twoWay":{"$setElementOrder/mergingList":[{"name":4},{"name":2},{"name":3},{"name":1}]},"modified":{"mergingList":[{"name":4,"value":4},{"name":2,"value":2},{"name":3,"value":3},{"name":1}]},"current":{"mergingList":[{"name":1,"other":"a"},{"name":3,"value":3},{"name":4,"value":4},{"name":2,"value":2}]},"threeWay":{"$setElementOrder/mergingList":[{"name":4},{"name":2},{"name":3},{"name":1}]},"result":{"mergingList":[{"name":4,"value":4},{"name":2,"value":2},{"name":3,"value":3},{"name":1,"other":"a"}]},"group":"raw"},
{"description":"set elements order in a list with server-only items","original":{"mergingList":[{"name":1},{"name":3,"value":3},{"name":4,"value":4},{"name":2,"value":2}]},"twoWay":{"$setElementOrder/mergingList":[{"name":4},{"name":2},{"name":3},{"name":1}]},"modified":{"mergingList":[{"name":4,"value":4},{"name":2,"value":2},{"name":3,"value":3},{"name":1}]},"current":{"mergingList":[{"name":1,"other":"a"},{"name":3,"value":3},{"name":4,"value":4},{"name":2,"value":2},{"name":9}]},"threeWay":{"$setElementOrder/mergingList":[{"name":4},{"name":2},{"name":3},{"name":1}]},"result":{"mergingList":[{"name":4,"value":4},{"name":2,"value":2},{"name":3,"value":3},{"name":1,"other":"a"},{"name":9}]},"group":"raw"},
{"description":"set elements order in a list with server-only items 2","original":{"mergingList":[{"name":1},{"name":2,"value":2},{"name":3,"value":3},{"name":4,"value":4}]},"twoWay":{"$setElementOrder/mergingList":[{"name":2},{"name":1},{"name":4},{"name":3}]},"modified":{"mergingList":[{"name":2,"value":2},{"name":1},{"name":4,"value":4},{"name":3,"value":3}]},"current":{"mergingList":[{"name":1,"other":"a"},{"name":2,"value":2},{"name":9},{"name":3,"value":3},{"name":4,"value":4}]},"threeWay":{"$setElementOrder/mergingList":[{"name":2},{"name":1},{"name":4},{"name":3}]},"result":{"mergingList":[{"name":2,"value":2},{"name":1,"other":"a"},{"name":9},{"name":4,"value":4},{"name":3,"value":3}]},"group":"raw"},
{"description":"set elements order in a list with server-only items 3","original":{"mergingList":[{"name":1},{"name":2,"value":2},{"name":3,"value":3},{"name":4,"value":4}]},"twoWay":{"$setElementOrder/mergingList":[{"name":2},{"name":1},{"name":4},{"name":3}]},"modified":{"mergingList":[{"name":2,"value":2},{"name":1},{"name":4,"value":4},{"name":3,"value":3}]},"current":{"mergingList":[{"name":1,"other":"a"},{"name":2,"value":2},{"name":7},{"name":9},{"name":8},{"name":3,"value":3},{"name":4,"value":4}]},"threeWay":{"$setElementOrder/mergingList":[{"name":2},{"name":1},{"name":4},{"name":3}]},"result":{"mergingList":[{"name":2,"value":2},{"name":1,"other":"a"},{"name":7},{"name":9},{"name":8},{"name":4,"value":4},{"name":3,"value":3}]},"group":"raw"},
{"description":"add an item in a int list and preserve order","original":{"mergingIntList":[1,2]},"twoWay":{"$setElementOrder/mergingIntList":[3,1,2],"mergingIntList":[3]},"modified":{"mergingIntList":[3,1,2]},"current":{"mergingIntList":[1,2]},"threeWay":{"$setElementOrder/mergingIntList":[3,1,2],"mergingIntList":[3]},"result":{"mergingIntList":[3,1,2]},"group":"raw"},
{"description":"add multiple items in a int list and preserve order","original":{"mergingIntList":[1,2]},"twoWay":{"$setElementOrder/mergingIntList":[1,4,2,3],"mergingIntList":[4,3]},"modified":{"mergingIntList":[1,4,2,3]},"current":{"mergingIntList":[1,2]},"threeWay":{"$setElementOrder/mergingIntList":[1,4,2,3],"mergingIntList":[4,3]},"result":{"mergingIntList":[1,4,2,3]},"group":"raw"},
{"description":"delete an item in a int list and preserve order","original":{"mergingIntList":[1,3,2]},"twoWay":{"$setElementOrder/mergingIntList":[2,1],"$deleteFromPrimitiveList/mergingIntList":[3]},"modified":{"mergingIntList":[2,1]},"current":{"mergingIntList":[1,2,3]},"threeWay":{"$setElementOrder/mergingIntList":[2,1],"$deleteFromPrimitiveList/mergingIntList":[3]},"result":{"mergingIntList":[2,1]},"group":"raw"},
{"description":"add and delete an item in a int list and preserve order","original":{"mergingIntList":[1,3,2]},"twoWay":{"$setElementOrder/mergingIntList":[4,2,1],"mergingIntList":[4],"$deleteFromPrimitiveList/mergingIntList":[3]},"modified":{"mergingIntList":[4,2,1]},"current":{"mergingIntList":[1,2,3]},"threeWay":{"$setElementOrder/mergingIntList":[4,2,1],"mergingIntList":[4],"$deleteFromPrimitiveList/mergingIntList":[3]},"result":{"mergingIntList":[4,2,1]},"group":"raw"},
{"description":"set elements order in a int list","original":{"mergingIntList":[1,3,4,2]},"twoWay":{"$setElementOrder/mergingIntList":[4,2,3,1]},"modified":{"mergingIntList":[4,2,3,1]},"current":{"mergingIntList":[1,3,4,2]},"threeWay":{"$setElementOrder/mergingIntList":[4,2,3,1]},"result":{"mergingIntList":[4,2,3,1]},"group":"raw"},
{"description":"set elements order in a int list with server-only items","original":{"mergingIntList":[1,3,4,2]},"twoWay":{"$setElementOrder/mergingIntList":[4,2,3,1]},"modified":{"mergingIntList":[4,2,3,1]},"current":{"mergingIntList":[1,3,4,2,9]},"threeWay":{"$setElementOrder/mergingIntList":[4,2,3,1]},"result":{"mergingIntList":[4,2,3,1,9]},"group":"raw"},
{"description":"set elements order in a int list with server-only items 2","original":{"mergingIntList":[1,2,3,4]},"twoWay":{"$setElementOrder/mergingIntList":[2,1,4,3]},"modified":{"mergingIntList":[2,1,4,3]},"current":{"mergingIntList":[1,2,9,3,4]},"threeWay":{"$setElementOrder/mergingIntList":[2,1,4,3]},"result":{"mergingIntList":[2,1,9,4,3]},"group":"raw"},
{"description":"set elements order in a int list with server-only items 3","original":{"mergingIntList":[1,2,3,4]},"twoWay":{"$setElementOrder/mergingIntList":[2,1,4,3]},"modified":{"mergingIntList":[2,1,4,3]},"current":{"mergingIntList":[1,2,7,9,8,3,4]},"threeWay":{"$setElementOrder/mergingIntList":[2,1,4,3]},"result":{"mergingIntList":[2,1,7,9,8,4,3]},"group":"raw"},
{"description":"behavior of set element order for a merging list with duplicate","original":{"mergingList":[{"name":1},{"name":2,"value":"dup1"},{"name":3},{"name":2,"value":"dup2"},{"name":4}]},"twoWay":{"$setElementOrder/mergingList":[{"name":2},{"name":1},{"name":4},{"name":3},{"name":2}]},"twoWayResult":{"mergingList":[{"name":2,"value":"dup1"},{"name":2,"value":"dup2"},{"name":1},{"name":4},{"name":3}]},"current":{"mergingList":[{"name":1},{"name":2,"value":"dup1"},{"name":3},{"name":2,"value":"dup2"},{"name":4}]},"threeWay":{"$setElementOrder/mergingList":[{"name":2},{"name":1},{"name":4},{"name":3},{"name":2}]},"result":{"mergingList":[{"name":2,"value":"dup1"},{"name":2,"value":"dup2"},{"name":1},{"name":4},{"name":3}]},"group":"raw"},
{"description":"behavior of set element order for a merging int list with duplicate","original":{"mergingIntList":[1,2,3,2,4]},"twoWay":{"$setElementOrder/mergingIntList":[2,1,4,3,2]},"twoWayResult":{"mergingIntList":[2,2,1,4,3]},"current":{"mergingIntList":[1,2,3,2,4]},"threeWay":{"$setElementOrder/mergingIntList":[2,1,4,3,2]},"result":{"mergingIntList":[2,2,1,4,3]},"group":"raw"},
{"description":"retainKeys map deletes a field","original":{"retainKeysMap":{"name":"foo","value":"bar"}},"twoWay":{"retainKeysMap":{"$retainKeys":["name"],"value":null}},"modified":{"retainKeysMap":{"name":"foo"}},"current":{"retainKeysMap":{"name":"foo","value":"bar"}},"threeWay":{"retainKeysMap":{"$retainKeys":["name"],"value":null}},"result":{"retainKeysMap":{"name":"foo"}},"group":"raw"},
{"description":"retainKeys map adds a field in a nested map","original":{"retainKeysMap":{"name":"foo","value":"bar","simpleMap":{"key1":"a"}}},"twoWay":{"retainKeysMap":{"$retainKeys":["name","simpleMap","value"],"simpleMap":{"key2":"b"}}},"modified":{"retainKeysMap":{"name":"foo","value":"bar","simpleMap":{"key1":"a","key2":"b"}}},"current":{"retainKeysMap":{"name":"foo","value":"bar","simpleMap":{"key1":"a","key3":"c"}}},"threeWay":{"retainKeysMap":{"$retainKeys":["name","simpleMap","value"],"simpleMap":{"key2":"b"}}},"result":{"retainKeysMap":{"name":"foo","value":"bar","simpleMap":{"key1":"a","key2":"b","key3":"c"}}},"group":"raw"},
{"description":"retainKeys map nested non-merging list with no change","original":{"retainKeysMap":{"name":"foo","nonMergingList":[{"name":"a"},{"name":"b"}]}},"twoWay":{"retainKeysMap":{"$retainKeys":["name","nonMergingList","value"],"value":"bar"}},"modified":{"retainKeysMap":{"name":"foo","value":"bar","nonMergingList":[{"name":"a"},{"name":"b"}]}},"current":{"retainKeysMap":{"name":"foo","nonMergingList":[{"name":"a"},{"name":"b"}]}},"threeWay":{"retainKeysMap":{"$retainKeys":["name","nonMergingList","value"],"value":"bar"}},"result":{"retainKeysMap":{"name":"foo","value":"bar","nonMergingList":[{"name":"a"},{"name":"b"}]}},"group":"raw"},
{"description":"retainKeys map deletes an item in nested merging int list","original":{"retainKeysMap":{"name":"foo","mergingIntList":[1,2,3]}},"twoWay":{"retainKeysMap":{"$retainKeys":["mergingIntList","name"],"$deleteFromPrimitiveList/mergingIntList":[2],"$setElementOrder/mergingIntList":[1,3]}},"modified":{"retainKeysMap":{"name":"foo","mergingIntList":[1,3]}},"current":{"retainKeysMap":{"name":"foo","mergingIntList":[1,2,3,4]}},"threeWay":{"retainKeysMap":{"$retainKeys":["mergingIntList","name"],"$deleteFromPrimitiveList/mergingIntList":[2],"$setElementOrder/mergingIntList":[1,3]}},"result":{"retainKeysMap":{"name":"foo","mergingIntList":[1,3,4]}},"group":"raw"},
{"description":"retainKeys map nested merging list with no change","original":{"retainKeysMap":{"name":"foo","mergingList":[{"name":"a"},{"name":"b"}]}},"twoWay":{"retainKeysMap":{"$retainKeys":["mergingList","name","value"],"value":"bar"}},"modified":{"retainKeysMap":{"name":"foo","value":"bar","mergingList":[{"name":"a"},{"name":"b"}]}},"current":{"retainKeysMap":{"name":"foo","mergingList":[{"name":"a"},{"name":"b"},{"name":"c"}]}},"threeWay":{"retainKeysMap":{"$retainKeys":["mergingList","name","value"],"$setElementOrder/mergingList":[{"name":"a"},{"name":"b"}],"value":"bar"}},"result":{"retainKeysMap":{"name":"foo","value":"bar","mergingList":[{"name":"a"},{"name":"b"},{"name":"c"}]}},"group":"raw"},
{"description":"retainKeys map adds an item in nested merging list","original":{"retainKeysMap":{"name":"foo","mergingList":[{"name":"a"},{"name":"b"}]}},"twoWay":{"retainKeysMap":{"$retainKeys":["mergingList","name"],"$setElementOrder/mergingList":[{"name":"a"},{"name":"b"},{"name":"c"}],"mergingList":[{"name":"c"}]}},"modified":{"retainKeysMap":{"name":"foo","mergingList":[{"name":"a"},{"name":"b"},{"name":"c"}]}},"current":{"retainKeysMap":{"name":"foo","mergingList":[{"name":"a"},{"name":"b"},{"name":"x"}]}},"threeWay":{"retainKeysMap":{"$retainKeys":["mergingList","name"],"$setElementOrder/mergingList":[{"name":"a"},{"name":"b"},{"name":"c"}],"mergingList":[{"name":"c"}]}},"result":{"retainKeysMap":{"name":"foo","mergingList":[{"name":"a"},{"name":"b"},{"name":"c"},{"name":"x"}]}},"group":"raw"},
{"description":"retainKeys map changes an item in nested merging list","original":{"retainKeysMap":{"name":"foo","mergingList":[{"name":"a"},{"name":"b","value":"foo"}]}},"twoWay":{"retainKeysMap":{"$retainKeys":["mergingList","name"],"$setElementOrder/mergingList":[{"name":"a"},{"name":"b"}],"mergingList":[{"name":"b","value":"bar"}]}},"modified":{"retainKeysMap":{"name":"foo","mergingList":[{"name":"a"},{"name":"b","value":"bar"}]}},"current":{"retainKeysMap":{"name":"foo","mergingList":[{"name":"a"},{"name":"b","value":"foo"},{"name":"x"}]}},"threeWay":{"retainKeysMap":{"$retainKeys":["mergingList","name"],"$setElementOrder/mergingList":[{"name":"a"},{"name":"b"}],"mergingList":[{"name":"b","value":"bar"}]}},"result":{"retainKeysMap":{"name":"foo","mergingList":[{"name":"a"},{"name":"b","value":"bar"},{"name":"x"}]}},"group":"raw"},
{"description":"retainKeys map deletes nested merging list","original":{"retainKeysMap":{"name":"foo","mergingList":[{"name":"a"},{"name":"b"}]}},"twoWay":{"retainKeysMap":{"$retainKeys":["name","value"],"value":"bar","mergingList":null}},"modified":{"retainKeysMap":{"name":"foo","value":"bar"}},"current":{"retainKeysMap":{"name":"foo","mergingList":[{"name":"a"},{"name":"b"}]}},"threeWay":{"retainKeysMap":{"$retainKeys":["name","value"],"value":"bar","mergingList":null}},"result":{"retainKeysMap":{"name":"foo","value":"bar"}},"group":"raw"},
{"description":"retainKeys map deletes an item in nested merging list","original":{"retainKeysMap":{"name":"foo","mergingList":[{"name":"a"},{"name":"b"}]}},"twoWay":{"retainKeysMap":{"$retainKeys":["mergingList","name"],"$setElementOrder/mergingList":[{"name":"a"}],"mergingList":[{"name":"b","$patch":"delete"}]}},"modified":{"retainKeysMap":{"name":"foo","mergingList":[{"name":"a"}]}},"current":{"retainKeysMap":{"name":"foo","mergingList":[{"name":"a"},{"name":"b"},{"name":"x"}]}},"threeWay":{"retainKeysMap":{"$retainKeys":["mergingList","name"],"$setElementOrder/mergingList":[{"name":"a"}],"mergingList":[{"name":"b","$patch":"delete"}]}},"result":{"retainKeysMap":{"name":"foo","mergingList":[{"name":"a"},{"name":"x"}]}},"group":"raw"},
{"description":"retainKeys list of maps clears a field","original":{"retainKeysMergingList":[{"name":"bar"},{"name":"foo","value":"a"}]},"twoWay":{},"modified":{"retainKeysMergingList":[{"name":"bar"},{"name":"foo","value":"a"}]},"current":{"retainKeysMergingList":[{"name":"bar"},{"name":"foo","value":"a","other":"x"}]},"threeWay":{"$setElementOrder/retainKeysMergingList":[{"name":"bar"},{"name":"foo"}],"retainKeysMergingList":[{"$retainKeys":["name","value"],"name":"foo"}]},"result":{"retainKeysMergingList":[{"name":"bar"},{"name":"foo","value":"a"}]},"group":"raw"},
{"description":"retainKeys list of maps deletes a field","original":{"retainKeysMergingList":[{"name":"bar"},{"name":"foo","value":"a"}]},"twoWay":{"$setElementOrder/retainKeysMergingList":[{"name":"bar"},{"name":"foo"}],"retainKeysMergingList":[{"$retainKeys":["name"],"name":"foo","value":null}]},"modified":{"retainKeysMergingList":[{"name":"bar"},{"name":"foo"}]},"current":{"retainKeysMergingList":[{"name":"bar"},{"name":"foo","value":"a"}]},"threeWay":{"$setElementOrder/retainKeysMergingList":[{"name":"bar"},{"name":"foo"}],"retainKeysMergingList":[{"$retainKeys":["name"],"name":"foo","value":null}]},"result":{"retainKeysMergingList":[{"name":"bar"},{"name":"foo"}]},"group":"raw"},
{"description":"delete and reorder in one list, reorder in another","original":{"mergingList":[{"name":"a","value":"a"},{"name":"b","value":"b"}],"mergeItemPtr":[{"name":"c","value":"c"},{"name":"d","value":"d"}]},"twoWay":{"$setElementOrder/mergingList":[{"name":"b"}],"$setElementOrder/mergeItemPtr":[{"name":"d"},{"name":"c"}],"mergingList":[{"$patch":"delete","name":"a"}]},"modified":{"mergingList":[{"name":"b","value":"b"}],"mergeItemPtr":[{"name":"d","value":"d"},{"name":"c","value":"c"}]},"current":{"mergingList":[{"name":"a","value":"a"},{"name":"b","value":"b"}],"mergeItemPtr":[{"name":"c","value":"c"},{"name":"d","value":"d"}]},"threeWay":{"$setElementOrder/mergingList":[{"name":"b"}],"$setElementOrder/mergeItemPtr":[{"name":"d"},{"name":"c"}],"mergingList":[{"$patch":"delete","name":"a"}]},"result":{"mergingList":[{"name":"b","value":"b"}],"mergeItemPtr":[{"name":"d","value":"d"},{"name":"c","value":"c"}]},"group":"raw"},
{"description":"$setElementOrder contains item that is not present in the list to be merged","original":{"mergingList":[{"name":1},{"name":3}]},"twoWay":{"$setElementOrder/mergingList":[{"name":3},{"name":2},{"name":1}],"mergingList":[{"name":3,"value":3},{"name":1,"value":1}]},"modified":{"mergingList":[{"name":3,"value":3},{"name":1,"value":1}]},"group":"customRaw"},
{"description":"$setElementOrder contains item that is not present in the int list to be merged","original":{"mergingIntList":[1,3]},"twoWay":{"$setElementOrder/mergingIntList":[3,2,1]},"modified":{"mergingIntList":[3,1]},"group":"customRaw"},
{"description":"should check if order in $setElementOrder and patch list match","original":{"mergingList":[{"name":1},{"name":3},{"name":2}]},"twoWay":{"$setElementOrder/mergingList":[{"name":1},{"name":2},{"name":3}],"mergingList":[{"name":3,"value":3},{"name":1,"value":1}]},"expectedError":"doesn't match","group":"customRaw"},
{"description":"$setElementOrder contains item that is not present in the int list to be merged","original":{"mergingIntList":[1,3,2]},"twoWay":{"$setElementOrder/mergingIntList":[1,2,3],"mergingIntList":[3,1]},"expectedError":"doesn't match","group":"customRaw"},
{"description":"missing merge key should error out","original":{"mergingList":[{"name":1,"value":"a"}]},"twoWay":{"mergingList":[{"value":"b"}]},"expectedError":"does not contain declared merge key","group":"customRaw"},
{"description":"$deleteFromPrimitiveList of nonexistent item in primitive list should not add the item to the list","original":{"mergingIntList":[1,2]},"twoWay":{"$deleteFromPrimitiveList/mergingIntList":[3]},"modified":{"mergingIntList":[1,2]},"group":"customRaw"},
{"description":"$deleteFromPrimitiveList on empty primitive list should not add the item to the list","original":{"mergingIntList":null},"twoWay":{"$deleteFromPrimitiveList/mergingIntList":[3]},"modified":{"mergingIntList":null},"group":"customRaw"},
{"description":"$deleteFromPrimitiveList on nonexistent primitive list should not add the primitive list","original":{"foo":["bar"]},"twoWay":{"$deleteFromPrimitiveList/mergingIntList":[3]},"modified":{"foo":["bar"]},"group":"customRaw"},
{"description":"$deleteFromPrimitiveList should delete item from a list with merge patch strategy","original":{"mergingIntList":[1,2,3]},"twoWay":{"$deleteFromPrimitiveList/mergingIntList":[2]},"modified":{"mergingIntList":[1,3]},"group":"customRaw"},
{"description":"$deleteFromPrimitiveList should delete item from a list without merge patch strategy","original":{"nonMergingIntList":[1,2,3]},"twoWay":{"$deleteFromPrimitiveList/nonMergingIntList":[2]},"modified":{"nonMergingIntList":[1,3]},"group":"customRaw"},
{"description":"replace RawExtension field, rest unchanched","original":{"name":"my-object","value":"some-value","other":"current-other","replacingItem":{"Some":"Generic","Yaml":"Inside","The":"RawExtension","Field":"Period"}},"twoWay":{"mergingList":[{"name":1},{"name":2},{"name":3}],"replacingItem":{"Newly":"Modified","Yaml":"Inside","The":"RawExtension"}},"twoWayResult":{"name":"my-object","value":"some-value","other":"current-other","mergingList":[{"name":1},{"name":2},{"name":3}],"replacingItem":{"Newly":"Modified","Yaml":"Inside","The":"RawExtension"}},"current":{"name":"my-object","value":"some-value","other":"current-other","mergingList":[{"name":1},{"name":2},{"name":3}],"replacingItem":{"Some":"Generic","Yaml":"Inside","The":"RawExtension","Field":"Period"}},"threeWay":{"replacingItem":{"Newly":"Modified","Yaml":"Inside","The":"RawExtension"}},"result":{"name":"my-object","value":"some-value","other":"current-other","mergingList":[{"name":1},{"name":2},{"name":3}],"replacingItem":{"Newly":"Modified","Yaml":"Inside","The":"RawExtension"}},"group":"rawExt"},
{"description":"unique scalars when merging lists","original":{"mergingIntList":[1,2]},"twoWay":{"mergingIntList":[2,3]},"modified":{"mergingIntList":[1,2,3]},"group":"custom"},
{"description":"delete map from nested map","original":{"simpleMap":{"key1":1,"key2":1}},"twoWay":{"simpleMap":{"$patch":"delete"}},"modified":{"simpleMap":{}},"group":"custom"},
{"description":"delete all items from merging list","original":{"mergingList":[{"name":1},{"name":2}]},"twoWay":{"mergingList":[{"$patch":"replace"}]},"modified":{"mergingList":[]},"group":"custom"},
{"description":"merge empty merging lists","original":{"mergingList":[]},"twoWay":{"mergingList":[]},"modified":{"mergingList":[]},"group":"custom"},
{"description":"delete all keys from map","original":{"name":1,"value":1},"twoWay":{"$patch":"replace"},"modified":{},"group":"custom"},
{"description":"add key and delete all keys from map","original":{"name":1,"value":1},"twoWay":{"other":"a","$patch":"replace"},"modified":{"other":"a"},"group":"custom"},
{"description":"delete all duplicate entries in a merging list","original":{"mergingList":[{"name":1},{"name":1},{"name":2,"value":"a"},{"name":3},{"name":3}]},"twoWay":{"mergingList":[{"name":1,"$patch":"delete"},{"name":3,"$patch":"delete"}]},"modified":{"mergingList":[{"name":2,"value":"a"}]},"group":"custom"},
{"description":"retainKeys map can add a field when no retainKeys directive present","original":{"retainKeysMap":{"name":"foo"}},"twoWay":{"retainKeysMap":{"value":"bar"}},"modified":{"retainKeysMap":{"name":"foo","value":"bar"}},"group":"custom"},
{"description":"retainKeys map can change a field when no retainKeys directive present","original":{"retainKeysMap":{"name":"foo","value":"a"}},"twoWay":{"retainKeysMap":{"value":"b"}},"modified":{"retainKeysMap":{"name":"foo","value":"b"}},"group":"custom"},
{"description":"retainKeys map can delete a field when no retainKeys directive present","original":{"retainKeysMap":{"name":"foo","value":"a"}},"twoWay":{"retainKeysMap":{"value":null}},"modified":{"retainKeysMap":{"name":"foo"}},"group":"custom"},
{"description":"retainKeys map merge an empty map","original":{"retainKeysMap":{"name":"foo","value":"a"}},"twoWay":{"retainKeysMap":{}},"modified":{"retainKeysMap":{"name":"foo","value":"a"}},"group":"custom"},
{"description":"retainKeys list can add a field when no retainKeys directive present","original":{"retainKeysMergingList":[{"name":"bar"},{"name":"foo"}]},"twoWay":{"retainKeysMergingList":[{"name":"foo","value":"a"}]},"modified":{"retainKeysMergingList":[{"name":"bar"},{"name":"foo","value":"a"}]},"group":"custom"},
{"description":"retainKeys list can change a field when no retainKeys directive present","original":{"retainKeysMergingList":[{"name":"bar"},{"name":"foo","value":"a"}]},"twoWay":{"retainKeysMergingList":[{"name":"foo","value":"b"}]},"modified":{"retainKeysMergingList":[{"name":"bar"},{"name":"foo","value":"b"}]},"group":"custom"},
{"description":"retainKeys list can delete a field when no retainKeys directive present","original":{"retainKeysMergingList":[{"name":"bar"},{"name":"foo","value":"a"}]},"twoWay":{"retainKeysMergingList":[{"name":"foo","value":null}]},"modified":{"retainKeysMergingList":[{"name":"bar"},{"name":"foo"}]},"group":"custom"},
{"description":"preserve the order from the patch in a merging list","original":{"mergingList":[{"name":1},{"name":2,"value":"b"},{"name":3}]},"twoWay":{"mergingList":[{"name":3,"value":"c"},{"name":1,"value":"a"},{"name":2,"other":"x"}]},"modified":{"mergingList":[{"name":3,"value":"c"},{"name":1,"value":"a"},{"name":2,"value":"b","other":"x"}]},"group":"custom"},
{"description":"preserve the order from the patch in a merging list 2","original":{"mergingList":[{"name":1},{"name":2,"value":"b"},{"name":3}]},"twoWay":{"mergingList":[{"name":3,"value":"c"},{"name":1,"value":"a"}]},"modified":{"mergingList":[{"name":2,"value":"b"},{"name":3,"value":"c"},{"name":1,"value":"a"}]},"group":"custom"},
{"description":"preserve the order from the patch in a merging int list","original":{"mergingIntList":[1,2,3]},"twoWay":{"mergingIntList":[3,1,2]},"modified":{"mergingIntList":[3,1,2]},"group":"custom"},
{"description":"preserve the order from the patch in a merging int list","original":{"mergingIntList":[1,2,3]},"twoWay":{"mergingIntList":[3,1]},"modified":{"mergingIntList":[2,3,1]},"group":"custom"}
]"#;
}
