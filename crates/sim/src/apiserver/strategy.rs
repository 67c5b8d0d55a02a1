//! Resource-specific behaviour, looked up from the resource table: defaults and admission on
//! create, what an update may change, how deletion proceeds, field selectors, and the
//! subresources with verbs of their own (binding, eviction, token, finalize).

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::sync::Arc;

use http::{Request, Response};
use hyper::body::Incoming;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde_json::{Value, json};

use super::errors::ApiError;
use super::http::{Body, error_response, value_response};
use super::meta::{self, meta_mut};
use super::request::ResourceRoute;
use super::resources::{self, ResId, ResourceType, ids};
use super::rest::{self, DeleteOptions, Query};
use super::store::{Entry, ObjKey};
use super::{State, UserInfo};

/// Which part of an object a write addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Subresource {
    /// The object (its status is kept).
    Main,
    /// The `status` subresource (only the status changes).
    Status,
    /// A pod's `ephemeralcontainers` subresource (only `spec.ephemeralContainers` changes).
    EphemeralContainers,
}

/// Patch content types.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum PatchKind {
    /// RFC 6902.
    Json,
    /// RFC 7386.
    Merge,
    /// Kubernetes strategic merge patch.
    Strategic,
    /// Server-side apply (simplified: a strategic merge of the applied configuration).
    Apply,
}

impl PatchKind {
    pub(super) fn from_mime(mime: &str) -> Option<Self> {
        match mime {
            "application/json-patch+json" => Some(Self::Json),
            "application/merge-patch+json" => Some(Self::Merge),
            "application/strategic-merge-patch+json" => Some(Self::Strategic),
            "application/apply-patch+yaml" | "application/apply-patch+cbor" => Some(Self::Apply),
            _ => None,
        }
    }
}

pub(super) fn apply_patch(
    rt: &ResourceType,
    kind: PatchKind,
    target: &mut Value,
    patch: &Value,
) -> Result<(), ApiError> {
    let result = match kind {
        PatchKind::Json => super::patch::json_patch(target, patch),
        PatchKind::Merge => super::patch::apply_merge_patch(target, patch),
        PatchKind::Strategic | PatchKind::Apply => {
            let schema =
                super::patch::Schema::for_kind(rt.kind).unwrap_or(super::patch::Schema::object());
            super::patch::strategic_merge_patch(target, patch, schema)
        }
    };
    match result {
        Ok(()) => {
            super::patch::normalize_after_patch(target);
            Ok(())
        }
        Err(e) => {
            let code = e.http_status();
            let name = meta::name(target).unwrap_or_default().to_owned();
            Err(match code {
                // The real server answers a failed JSON patch operation with a generic 422 and
                // drops the operation's error (apimachinery's NewGenericServerResponse).
                422 if kind == PatchKind::Json => ApiError::generic_invalid(),
                422 => {
                    ApiError::invalid(rt.group, rt.kind, &name, &[(String::new(), e.to_string())])
                }
                413 => ApiError::too_large(e.to_string()),
                400 => ApiError::bad_request(e.to_string()),
                _ => ApiError::internal(e.to_string()),
            })
        }
    }
}

/// The objects every cluster starts with.
pub(super) fn bootstrap(state: &State) {
    for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
        let mut obj = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
        init_meta(&mut obj);
        prepare_namespace(&mut obj);
        if let Ok(entry) = state
            .store
            .create(*ids::NAMESPACES, ObjKey::new("", ns), obj)
        {
            after_create(state, *ids::NAMESPACES, &entry);
        }
    }
    let (base, _) = state.config.service_cidr;
    let first = Ipv4Addr::from(u32::from(base) + 1).to_string();
    let mut svc = json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "kubernetes", "namespace": "default", "labels": {"component": "apiserver", "provider": "kubernetes"}},
        "spec": {"type": "ClusterIP", "clusterIP": first, "clusterIPs": [first], "sessionAffinity": "None",
            "ipFamilies": ["IPv4"], "ipFamilyPolicy": "SingleStack", "internalTrafficPolicy": "Cluster",
            "ports": [{"name": "https", "port": 443, "protocol": "TCP", "targetPort": 443}]},
        "status": {"loadBalancer": {}}});
    init_meta(&mut svc);
    let _ = state
        .store
        .create(*ids::SERVICES, ObjKey::new("default", "kubernetes"), svc);
    for (res, mut obj) in super::rbac_strategy::bootstrap_policy() {
        init_meta(&mut obj);
        let name = meta::name(&obj).unwrap_or_default().to_owned();
        let _ = state.store.create(res, ObjKey::new("", name), obj);
    }
}

fn init_meta(obj: &mut Value) {
    let m = meta_mut(obj);
    m.insert("uid".into(), json!(meta::new_uid()));
    m.insert("creationTimestamp".into(), json!(meta::now()));
}

/// Names: DNS labels for namespaces and services, path segments for roles and bindings, DNS
/// subdomains for the rest.
pub(super) fn validate_name(rt: &ResourceType, name: &str) -> Result<(), ApiError> {
    if super::rbac_strategy::is_rbac(rt) {
        // Roles and bindings only need names that are path segments (`system:discovery`).
        return match super::rbac_strategy::invalid_name(name) {
            Some(why) => Err(ApiError::invalid(
                rt.group,
                rt.kind,
                name,
                &[(
                    "metadata.name".into(),
                    format!("Invalid value: {name:?}: {why}"),
                )],
            )),
            None => Ok(()),
        };
    }
    let label_only = matches!(rt.plural, "namespaces" | "services");
    let ok = if label_only {
        is_dns_label(name)
    } else {
        is_dns_subdomain(name)
    };
    if ok {
        return Ok(());
    }
    let what = if label_only {
        "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character"
    } else {
        "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character"
    };
    Err(ApiError::invalid(
        rt.group,
        rt.kind,
        name,
        &[(
            "metadata.name".into(),
            format!("Invalid value: {name:?}: {what}"),
        )],
    ))
}

fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_dns_label)
}

/// Namespace lifecycle admission: new objects need an existing, active namespace.
pub(super) fn namespace_admission(
    state: &State,
    rt: &ResourceType,
    namespace: Option<&str>,
) -> Result<(), ApiError> {
    if !rt.namespaced {
        return Ok(());
    }
    let ns = namespace.unwrap_or_default();
    let entry = state
        .store
        .get(*ids::NAMESPACES, &ObjKey::new("", ns))
        .ok_or_else(|| ApiError::not_found("", "namespaces", ns))?;
    if meta::deleting(&entry.object) && rt.plural != "events" {
        return Err(ApiError::forbidden(format!(
            "{} \"{}\" is forbidden: unable to create new content in namespace {ns} because it is being terminated",
            rt.plural, ""
        )));
    }
    Ok(())
}

fn prepare_namespace(obj: &mut Value) {
    let name = meta::name(obj).unwrap_or_default().to_owned();
    let m = meta_mut(obj);
    let labels = m.entry("labels").or_insert_with(|| json!({}));
    if let Some(l) = labels.as_object_mut() {
        l.insert("kubernetes.io/metadata.name".into(), json!(name));
    }
    obj["spec"] = json!({"finalizers": ["kubernetes"]});
    obj["status"] = json!({"phase": "Active"});
}

/// Defaults and admission for a new object.
pub(super) fn prepare_create(
    state: &State,
    rt: &ResourceType,
    obj: &mut Value,
    _user: &UserInfo,
) -> Result<(), ApiError> {
    super::rbac_strategy::set_defaults(rt, obj);
    match (rt.group, rt.plural) {
        ("", "namespaces") => prepare_namespace(obj),
        ("", "pods") => prepare_pod(state, obj)?,
        ("", "services") => prepare_service(state, obj)?,
        ("", "persistentvolumeclaims") => {
            default_storage_class(state, obj);
            super::volume_strategy::prepare_create(rt, obj);
        }
        ("", "secrets") => {
            set_default(obj, "type", json!("Opaque"));
            fold_string_data(obj);
        }
        ("", "persistentvolumes") => super::volume_strategy::prepare_create(rt, obj),
        ("", "endpoints" | "events") => set_decode_defaults(rt, obj),
        ("", "nodes") => {
            set_decode_defaults(rt, obj);
            taint_new_node_not_ready(obj);
        }
        ("apps", "deployments") => {
            default_deployment(obj);
            obj["status"] = json!({});
        }
        ("apps", "replicasets" | "statefulsets" | "daemonsets") => {
            if obj["spec"].get("replicas").is_none() && rt.plural != "daemonsets" {
                obj["spec"]["replicas"] = json!(1);
            }
            match rt.plural {
                "statefulsets" => default_statefulset(&mut obj["spec"]),
                "daemonsets" => default_daemonset(&mut obj["spec"]),
                _ => {}
            }
            if let Some(t) = obj.pointer_mut("/spec/template/spec") {
                default_pod_spec(t);
            }
            obj["status"] = json!({});
        }
        ("batch", "cronjobs") => {
            for (k, v) in [
                ("concurrencyPolicy", json!("Allow")),
                ("suspend", json!(false)),
                ("successfulJobsHistoryLimit", json!(3)),
                ("failedJobsHistoryLimit", json!(1)),
            ] {
                set_default(&mut obj["spec"], k, v);
            }
            if let Some(t) = obj.pointer_mut("/spec/jobTemplate/spec/template/spec") {
                default_pod_spec(t);
            }
            obj["status"] = json!({});
        }
        ("batch", "jobs") => {
            default_job(obj);
            if let Some(t) = obj.pointer_mut("/spec/template/spec") {
                default_pod_spec(t);
            }
            obj["status"] = json!({});
        }
        _ => {}
    }
    Ok(())
}

/// A Job's defaults and generated selector (`batch/v1` defaults and the job strategy's
/// `generateSelector`): the pods of a Job carry its uid and name as labels and the selector
/// matches the uid, unless `manualSelector`.
fn default_job(obj: &mut Value) {
    let uid = meta::meta_str(obj, "uid").unwrap_or_default().to_owned();
    let name = meta::name(obj).unwrap_or_default().to_owned();
    // The Job's own labels default to its template's, before the generated ones are added.
    let template_labels = obj.pointer("/spec/template/metadata/labels").cloned();
    if let Some(labels) = template_labels.filter(|l| l.as_object().is_some_and(|m| !m.is_empty()))
        && meta::labels(obj).is_empty()
    {
        meta::meta_mut(obj).insert("labels".into(), labels);
    }
    let spec = &mut obj["spec"];
    if spec.get("manualSelector").and_then(Value::as_bool) != Some(true) {
        let generated = [
            ("batch.kubernetes.io/controller-uid", uid.clone()),
            ("batch.kubernetes.io/job-name", name.clone()),
            ("controller-uid", uid.clone()),
            ("job-name", name),
        ];
        let labels = &mut spec["template"]["metadata"]["labels"];
        if !labels.is_object() {
            *labels = json!({});
        }
        for (k, v) in generated {
            labels[k] = json!(v);
        }
        spec["selector"] = json!({"matchLabels": {"batch.kubernetes.io/controller-uid": uid}});
    }
    let completions = spec.get("completions").is_some_and(|c| !c.is_null());
    let parallelism = spec.get("parallelism").is_some_and(|c| !c.is_null());
    if !completions && !parallelism {
        spec["completions"] = json!(1);
    }
    for (k, v) in [
        ("parallelism", json!(1)),
        ("backoffLimit", json!(6)),
        ("completionMode", json!("NonIndexed")),
        ("suspend", json!(false)),
        ("podReplacementPolicy", json!("TerminatingOrFailed")),
    ] {
        if spec.get(k).is_none_or(Value::is_null) {
            spec[k] = v;
        }
    }
}

/// `SetDefaults_StatefulSet` (apps/v1), including its claim templates' claim defaults.
fn default_statefulset(spec: &mut Value) {
    set_default(spec, "podManagementPolicy", json!("OrderedReady"));
    set_default(
        spec,
        "updateStrategy",
        json!({"type": "RollingUpdate", "rollingUpdate": {"partition": 0}}),
    );
    if spec.pointer("/updateStrategy/type") == Some(&json!("RollingUpdate")) {
        set_default(&mut spec["updateStrategy"], "rollingUpdate", json!({}));
        set_default(
            &mut spec["updateStrategy"]["rollingUpdate"],
            "partition",
            json!(0),
        );
    }
    set_default(spec, "revisionHistoryLimit", json!(10));
    set_default(
        spec,
        "persistentVolumeClaimRetentionPolicy",
        json!({"whenDeleted": "Retain", "whenScaled": "Retain"}),
    );
    if let Some(templates) = spec
        .get_mut("volumeClaimTemplates")
        .and_then(Value::as_array_mut)
    {
        for t in templates {
            set_default(t, "apiVersion", json!("v1"));
            set_default(t, "kind", json!("PersistentVolumeClaim"));
            set_default(&mut t["spec"], "volumeMode", json!("Filesystem"));
            set_default(t, "status", json!({"phase": "Pending"}));
        }
    }
}

/// `SetDefaults_DaemonSet` (apps/v1).
fn default_daemonset(spec: &mut Value) {
    set_default(
        spec,
        "updateStrategy",
        json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}}),
    );
    if spec.pointer("/updateStrategy/type") == Some(&json!("RollingUpdate")) {
        set_default(&mut spec["updateStrategy"], "rollingUpdate", json!({}));
        let r = &mut spec["updateStrategy"]["rollingUpdate"];
        set_default(r, "maxUnavailable", json!(1));
        set_default(r, "maxSurge", json!(0));
    }
    set_default(spec, "revisionHistoryLimit", json!(10));
}

fn default_deployment(obj: &mut Value) {
    let spec = &mut obj["spec"];
    if spec.get("replicas").is_none() {
        spec["replicas"] = json!(1);
    }
    if spec.get("strategy").is_none() {
        spec["strategy"] = json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "25%", "maxSurge": "25%"}});
    }
    for (k, v) in [
        ("revisionHistoryLimit", 10),
        ("progressDeadlineSeconds", 600),
    ] {
        if spec.get(k).is_none() {
            spec[k] = json!(v);
        }
    }
    if let Some(t) = spec.pointer_mut("/template/spec") {
        default_pod_spec(t);
    }
}

/// The DefaultStorageClass admission plugin: a claim that names no class (the field absent, not
/// `""`) gets the class annotated as the default, if exactly one is.
fn default_storage_class(state: &State, obj: &mut Value) {
    if obj
        .pointer("/spec/storageClassName")
        .is_some_and(|c| !c.is_null())
    {
        return;
    }
    let (defaults, _, _) = state
        .store
        .list(*ids::STORAGE_CLASSES, None, None, None, |e| {
            e.object
                .pointer("/metadata/annotations/storageclass.kubernetes.io~1is-default-class")
                .and_then(Value::as_str)
                == Some("true")
        });
    if let [only] = defaults.as_slice()
        && let Some(name) = meta::name(&only.object)
        && let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut)
    {
        spec.insert("storageClassName".into(), json!(name));
    }
}

fn set_default(map: &mut Value, key: &str, value: Value) {
    if let Some(m) = map.as_object_mut()
        && m.get(key).is_none_or(Value::is_null)
    {
        m.insert(key.to_owned(), value);
    }
}

/// `SetDefaults_PodSpec` and `SetDefaults_Container`, the parts clients see (of pods and of
/// pod templates alike; [`default_pod_only`] has the rest).
fn default_pod_spec(spec: &mut Value) {
    set_default(spec, "restartPolicy", json!("Always"));
    set_default(spec, "dnsPolicy", json!("ClusterFirst"));
    set_default(spec, "terminationGracePeriodSeconds", json!(30));
    set_default(spec, "securityContext", json!({}));
    set_default(spec, "schedulerName", json!("default-scheduler"));
    for list in ["containers", "initContainers", "ephemeralContainers"] {
        if let Some(cs) = spec.get_mut(list).and_then(Value::as_array_mut) {
            for c in cs {
                default_container(c);
            }
        }
    }
    if let Some(vols) = spec.get_mut("volumes").and_then(Value::as_array_mut) {
        for v in vols {
            for kind in ["secret", "configMap", "projected", "downwardAPI"] {
                if let Some(src) = v.get_mut(kind) {
                    set_default(src, "defaultMode", json!(420));
                }
            }
        }
    }
}

/// `SetDefaults_Pod`: what Pods get and pod templates (of Deployments, Jobs, ...) do not:
/// `enableServiceLinks`, requests from limits, and host ports on the host network.
fn default_pod_only(spec: &mut Value) {
    set_default(spec, "enableServiceLinks", json!(true));
    let host_network = spec
        .get("hostNetwork")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    for list in ["containers", "initContainers"] {
        for c in spec
            .get_mut(list)
            .and_then(Value::as_array_mut)
            .into_iter()
            .flatten()
        {
            if host_network {
                for p in c
                    .get_mut("ports")
                    .and_then(Value::as_array_mut)
                    .into_iter()
                    .flatten()
                {
                    if let Some(port) = p.get("containerPort").cloned() {
                        set_default(p, "hostPort", port);
                    }
                }
            }
            let Some(res) = c.get_mut("resources") else {
                continue;
            };
            let limits = res
                .get("limits")
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default();
            if !limits.is_empty() {
                let requests = res
                    .as_object_mut()
                    .map(|r| r.entry("requests").or_insert_with(|| json!({})));
                if let Some(Value::Object(requests)) = requests {
                    for (k, v) in limits {
                        requests.entry(k).or_insert(v);
                    }
                }
            }
        }
    }
}

fn default_container(c: &mut Value) {
    let image = c
        .get("image")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let tag_latest = !image.contains('@') && {
        let last = image.rsplit('/').next().unwrap_or_default();
        !last.contains(':') || last.ends_with(":latest")
    };
    set_default(
        c,
        "imagePullPolicy",
        json!(if tag_latest { "Always" } else { "IfNotPresent" }),
    );
    set_default(c, "terminationMessagePath", json!("/dev/termination-log"));
    set_default(c, "terminationMessagePolicy", json!("File"));
    if let Some(ports) = c.get_mut("ports").and_then(Value::as_array_mut) {
        for p in ports {
            set_default(p, "protocol", json!("TCP"));
        }
    }
    for probe in ["livenessProbe", "readinessProbe", "startupProbe"] {
        if let Some(p) = c.get_mut(probe) {
            set_default(p, "timeoutSeconds", json!(1));
            set_default(p, "periodSeconds", json!(10));
            set_default(p, "successThreshold", json!(1));
            set_default(p, "failureThreshold", json!(3));
            if let Some(h) = p.get_mut("httpGet") {
                set_default(h, "scheme", json!("HTTP"));
            }
        }
    }
    if let Some(env) = c.get_mut("env").and_then(Value::as_array_mut) {
        for e in env {
            if let Some(f) = e.pointer_mut("/valueFrom/fieldRef") {
                set_default(f, "apiVersion", json!("v1"));
            }
        }
    }
}

const SA_MOUNT: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

fn prepare_pod(state: &State, obj: &mut Value) -> Result<(), ApiError> {
    let ns = meta::namespace(obj).unwrap_or_default().to_owned();
    if !obj.get("spec").is_some_and(Value::is_object) {
        obj["spec"] = json!({});
    }
    let spec = &mut obj["spec"];
    default_pod_spec(spec);
    default_pod_only(spec);
    // ServiceAccount admission.
    let sa_name = spec
        .get("serviceAccountName")
        .and_then(Value::as_str)
        .or_else(|| spec.get("serviceAccount").and_then(Value::as_str))
        .filter(|s| !s.is_empty())
        .unwrap_or("default")
        .to_owned();
    spec["serviceAccountName"] = json!(sa_name);
    spec["serviceAccount"] = json!(sa_name);
    let sa = state.store.get(*ids::SERVICEACCOUNTS, &ObjKey::new(&ns, &sa_name)).ok_or_else(|| {
        ApiError::forbidden(format!(
            "pods is forbidden: error looking up service account {ns}/{sa_name}: serviceaccount \"{sa_name}\" not found"
        ))
    })?;
    let automount = spec
        .get("automountServiceAccountToken")
        .and_then(Value::as_bool)
        .or_else(|| {
            sa.object
                .get("automountServiceAccountToken")
                .and_then(Value::as_bool)
        })
        .unwrap_or(true);
    if automount {
        inject_token_volume(spec);
    }
    // DefaultTolerationSeconds admission.
    let tolerations = spec
        .as_object_mut()
        .map(|s| s.entry("tolerations").or_insert_with(|| json!([])));
    if let Some(Value::Array(tols)) = tolerations {
        for key in [
            "node.kubernetes.io/not-ready",
            "node.kubernetes.io/unreachable",
        ] {
            let present = tols.iter().any(|t| {
                let k = t.get("key").and_then(Value::as_str);
                let e = t.get("effect").and_then(Value::as_str);
                let op = t.get("operator").and_then(Value::as_str);
                (k == Some(key) || (k.is_none() && op == Some("Exists")))
                    && (e.is_none() || e == Some("NoExecute"))
            });
            if !present {
                tols.push(json!({"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}));
            }
        }
    }
    // Priority admission.
    let class = spec
        .get("priorityClassName")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .map(str::to_owned);
    let (priority, policy) = match &class {
        Some(c) => {
            let pcs =
                resources::find("scheduling.k8s.io", "v1", "priorityclasses").unwrap_or(usize::MAX);
            let pc = state.store.get(pcs, &ObjKey::new("", c)).ok_or_else(|| {
                ApiError::forbidden(format!(
                    "pods \"{}\" is forbidden: no PriorityClass with name {c} was found",
                    meta::name(obj).unwrap_or_default()
                ))
            })?;
            (
                pc.object.get("value").and_then(Value::as_i64).unwrap_or(0),
                pc.object
                    .get("preemptionPolicy")
                    .and_then(Value::as_str)
                    .unwrap_or("PreemptLowerPriority")
                    .to_owned(),
            )
        }
        None => (0, "PreemptLowerPriority".to_owned()),
    };
    let spec = &mut obj["spec"];
    if let Some(given) = spec.get("priority").and_then(Value::as_i64)
        && given != priority
    {
        return Err(ApiError::forbidden(format!(
            "pods \"{}\" is forbidden: the integer value of priority ({given}) must not be provided in pod spec; priority admission controller computed {priority} from the given PriorityClass name",
            meta::name(obj).unwrap_or_default()
        )));
    }
    spec["priority"] = json!(priority);
    set_default(spec, "preemptionPolicy", json!(policy));
    let qos = qos_class(spec);
    obj["status"] = json!({"phase": "Pending", "qosClass": qos});
    Ok(())
}

fn inject_token_volume(spec: &mut Value) {
    let containers_mount_it = ["containers", "initContainers"].iter().any(|list| {
        spec.get(*list).and_then(Value::as_array).is_some_and(|cs| {
            cs.iter().any(|c| {
                c.get("volumeMounts")
                    .and_then(Value::as_array)
                    .is_some_and(|ms| {
                        ms.iter()
                            .any(|m| m.get("mountPath").and_then(Value::as_str) == Some(SA_MOUNT))
                    })
            })
        })
    });
    if containers_mount_it {
        return;
    }
    let name = format!("kube-api-access-{}", meta::random_suffix(5));
    let volume = json!({"name": name, "projected": {"defaultMode": 420, "sources": [
        {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}
    ]}});
    if let Some(Value::Array(vols)) = spec
        .as_object_mut()
        .map(|s| s.entry("volumes").or_insert_with(|| json!([])))
    {
        vols.push(volume);
    }
    for list in ["containers", "initContainers"] {
        if let Some(cs) = spec.get_mut(list).and_then(Value::as_array_mut) {
            for c in cs {
                if let Some(Value::Array(ms)) = c
                    .as_object_mut()
                    .map(|c| c.entry("volumeMounts").or_insert_with(|| json!([])))
                {
                    ms.push(json!({"name": name, "readOnly": true, "mountPath": SA_MOUNT}));
                }
            }
        }
    }
}

/// The pod's QoS class, as `qos.GetPodQOS` computes it from requests and limits.
fn qos_class(spec: &Value) -> &'static str {
    let mut any = false;
    let mut guaranteed = true;
    for list in ["containers", "initContainers"] {
        for c in spec
            .get(list)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let req = c.pointer("/resources/requests").and_then(Value::as_object);
            let lim = c.pointer("/resources/limits").and_then(Value::as_object);
            if req.is_some_and(|r| !r.is_empty()) || lim.is_some_and(|l| !l.is_empty()) {
                any = true;
            }
            for r in ["cpu", "memory"] {
                let l = lim.and_then(|l| l.get(r));
                let q = req.and_then(|q| q.get(r));
                if l.is_none() || q != l {
                    guaranteed = false;
                }
            }
        }
    }
    match (any, guaranteed) {
        (false, _) => "BestEffort",
        (true, true) => "Guaranteed",
        (true, false) => "Burstable",
    }
}

fn prepare_service(state: &State, obj: &mut Value) -> Result<(), ApiError> {
    if !obj.get("spec").is_some_and(Value::is_object) {
        obj["spec"] = json!({});
    }
    let spec = &mut obj["spec"];
    set_default(spec, "type", json!("ClusterIP"));
    set_default(spec, "sessionAffinity", json!("None"));
    set_default(spec, "internalTrafficPolicy", json!("Cluster"));
    if let Some(ports) = spec.get_mut("ports").and_then(Value::as_array_mut) {
        for p in ports {
            set_default(p, "protocol", json!("TCP"));
            if let Some(port) = p.get("port").cloned() {
                set_default(p, "targetPort", port);
            }
        }
    }
    let svc_type = spec
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("ClusterIP")
        .to_owned();
    if svc_type != "ExternalName" {
        let requested = spec
            .get("clusterIP")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let ip = if requested == "None" {
            "None".to_owned()
        } else {
            allocate_cluster_ip(state, &requested).map_err(|m| {
                ApiError::invalid(
                    "",
                    "Service",
                    meta::name(obj).unwrap_or_default(),
                    &[("spec.clusterIPs".into(), m)],
                )
            })?
        };
        let spec = &mut obj["spec"];
        spec["clusterIP"] = json!(ip);
        spec["clusterIPs"] = json!([ip]);
        set_default(spec, "ipFamilies", json!(["IPv4"]));
        set_default(spec, "ipFamilyPolicy", json!("SingleStack"));
    }
    if matches!(svc_type.as_str(), "NodePort" | "LoadBalancer") {
        set_default(&mut obj["spec"], "externalTrafficPolicy", json!("Cluster"));
        let mut used = used_node_ports(state);
        if let Some(ports) = obj["spec"].get_mut("ports").and_then(Value::as_array_mut) {
            for p in ports {
                if p.get("nodePort").and_then(Value::as_u64).is_none()
                    && let Some(port) = (30000..=32767u64).find(|n| !used.contains(n))
                {
                    used.insert(port);
                    p["nodePort"] = json!(port);
                }
            }
        }
    }
    obj["status"] = json!({"loadBalancer": {}});
    Ok(())
}

fn used_node_ports(state: &State) -> BTreeSet<u64> {
    let (services, _, _) = state.store.list(*ids::SERVICES, None, None, None, |_| true);
    services
        .iter()
        .flat_map(|s| {
            s.object
                .pointer("/spec/ports")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default()
        })
        .filter_map(|p| p.get("nodePort").and_then(Value::as_u64))
        .collect()
}

fn allocate_cluster_ip(state: &State, requested: &str) -> Result<String, String> {
    let (base, prefix) = state.config.service_cidr;
    let size = 1u32 << (32 - u32::from(prefix.min(30)));
    let base = u32::from(base);
    let (services, _, _) = state.store.list(*ids::SERVICES, None, None, None, |_| true);
    let used: BTreeSet<String> = services
        .iter()
        .filter_map(|s| {
            s.object
                .pointer("/spec/clusterIP")
                .and_then(Value::as_str)
                .map(str::to_owned)
        })
        .collect();
    if !requested.is_empty() {
        let ip: Ipv4Addr = requested
            .parse()
            .map_err(|_| format!("Invalid value: {requested:?}: must be a valid IP address"))?;
        let n = u32::from(ip);
        if n <= base || n >= base + size - 1 {
            return Err(format!(
                "Invalid value: {requested:?}: provided IP is not in the valid range"
            ));
        }
        if used.contains(requested) {
            return Err(format!(
                "Invalid value: {requested:?}: provided IP is already allocated"
            ));
        }
        return Ok(requested.to_owned());
    }
    (2..size - 1)
        .map(|i| Ipv4Addr::from(base + i).to_string())
        .find(|ip| !used.contains(ip))
        .ok_or_else(|| "Internal error: range is full".to_owned())
}

/// Mutating admission (webhooks).
pub(super) async fn admit(
    state: &State,
    rt: &ResourceType,
    obj: Value,
    old: Option<&Value>,
    user: &UserInfo,
) -> Result<Value, ApiError> {
    super::admission::mutate(state, rt, obj, old, user).await
}

/// A CronJob's schedule and time zone, as `ValidateCronJobSpec` checks them.
fn cronjob_causes(obj: &Value) -> Vec<(String, String)> {
    let spec = obj.get("spec").cloned().unwrap_or_default();
    let mut causes = Vec::new();
    match spec.get("schedule").and_then(Value::as_str) {
        None | Some("") => causes.push(("spec.schedule".into(), "Required value".into())),
        Some(text) => {
            if let Err(why) = super::controllers::Schedule::parse(text) {
                causes.push((
                    "spec.schedule".into(),
                    format!("Invalid value: {text:?}: {why}"),
                ));
            }
        }
    }
    if let (Some(zone), Err(why)) = (
        spec.get("timeZone").and_then(Value::as_str),
        super::controllers::cronjob_time_zone(&spec),
    ) {
        causes.push((
            "spec.timeZone".into(),
            format!("Invalid value: {zone:?}: {why}"),
        ));
    }
    causes
}

/// Validation of a created or updated object.
pub(super) fn validate(
    _state: &State,
    rt: &ResourceType,
    obj: &Value,
    old: Option<&Value>,
) -> Result<(), ApiError> {
    let name = meta::name(obj).unwrap_or_default();
    if rt.plural == "pods" && rt.group.is_empty() {
        let mut causes = pod_spec_causes(obj);
        if old.is_none()
            && obj
                .pointer("/spec/ephemeralContainers")
                .and_then(Value::as_array)
                .is_some_and(|e| !e.is_empty())
        {
            causes.push((
                "spec.ephemeralContainers".into(),
                "Forbidden: cannot be set on create".into(),
            ));
        }
        if let Some(old) = old
            && let Some(cause) = pod_update_forbidden(old, obj)
        {
            causes.push(("spec".into(), cause));
        }
        if !causes.is_empty() {
            return Err(ApiError::invalid(rt.group, rt.kind, name, &causes));
        }
    }
    let mut causes = super::rbac_strategy::validate(rt, obj, old);
    causes.extend(super::volume_strategy::validate(rt, obj));
    if rt.group.is_empty() && rt.plural == "services" {
        causes.extend(service_causes(obj, old));
    }
    if (rt.group, rt.plural) == ("batch", "cronjobs") {
        causes.extend(cronjob_causes(obj));
    }
    if rt.group.is_empty() && rt.plural == "events" {
        causes.extend(event_causes(obj));
    }
    if !causes.is_empty() {
        return Err(ApiError::invalid(rt.group, rt.kind, name, &causes));
    }
    if rt.plural == "deployments" && obj.pointer("/spec/selector").is_none() {
        return Err(ApiError::invalid(
            rt.group,
            rt.kind,
            name,
            &[("spec.selector".into(), "Required value".into())],
        ));
    }
    Ok(())
}

/// `validatePodMetadataAndSpec`, the parts the simulator checks: containers present, named
/// uniquely, with images; and the ephemeral containers' rules.
fn pod_spec_causes(obj: &Value) -> Vec<(String, String)> {
    let mut causes = Vec::new();
    let containers = obj.pointer("/spec/containers").and_then(Value::as_array);
    if containers.is_none_or(Vec::is_empty) {
        causes.push(("spec.containers".to_owned(), "Required value".to_owned()));
    }
    let mut seen = BTreeSet::new();
    for (list, cs) in [
        ("containers", containers),
        (
            "initContainers",
            obj.pointer("/spec/initContainers")
                .and_then(Value::as_array),
        ),
    ] {
        for (i, c) in cs.into_iter().flatten().enumerate() {
            let cname = c.get("name").and_then(Value::as_str).unwrap_or_default();
            if cname.is_empty() {
                causes.push((format!("spec.{list}[{i}].name"), "Required value".into()));
            } else if !seen.insert(cname.to_owned()) {
                causes.push((
                    format!("spec.{list}[{i}].name"),
                    format!("Duplicate value: {cname:?}"),
                ));
            }
            if c.get("image")
                .and_then(Value::as_str)
                .is_none_or(str::is_empty)
            {
                causes.push((format!("spec.{list}[{i}].image"), "Required value".into()));
            }
        }
    }
    causes.extend(ephemeral_container_causes(obj));
    causes
}

/// Validation of an update through a subresource: the `ephemeralcontainers` one validates
/// the pod and the change of its ephemeral containers (`ValidatePodEphemeralContainersUpdate`),
/// the others as [`validate`].
pub(super) fn validate_update(
    state: &State,
    rt: &ResourceType,
    new: &Value,
    old: &Value,
    sub: Subresource,
) -> Result<(), ApiError> {
    if sub != Subresource::EphemeralContainers {
        return validate(state, rt, new, Some(old));
    }
    let name = meta::name(new).unwrap_or_default();
    if meta::string_map(old.pointer("/metadata/annotations")).contains_key(MIRROR_POD_ANNOTATION) {
        return Err(ApiError::invalid(
            rt.group,
            rt.kind,
            name,
            &[(
                String::new(),
                "Forbidden: static pods do not support ephemeral containers".into(),
            )],
        ));
    }
    let mut causes = pod_spec_causes(new);
    causes.extend(super::volume_strategy::validate(rt, new));
    causes.extend(ephemeral_change_causes(old, new));
    if causes.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid(rt.group, rt.kind, name, &causes))
    }
}

/// The annotation of a static (mirror) pod.
const MIRROR_POD_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// The fields of an ephemeral container that kube's `allowedEphemeralContainerFields` leaves
/// out, in the order of the Go struct (the order the causes come in).
const EPHEMERAL_FORBIDDEN_FIELDS: &[&str] = &[
    "ports",
    "resources",
    "resizePolicy",
    "restartPolicy",
    "restartPolicyRules",
    "livenessProbe",
    "readinessProbe",
    "startupProbe",
    "lifecycle",
];

/// Whether a JSON value is what Go decodes to a zero value (an unset field).
fn is_zero(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.values().all(is_zero),
    }
}

/// `validateEphemeralContainers`: names present and unique across containers, init containers
/// and ephemeral containers; an image; a target that is an ordinary or init container; none of
/// the fields ephemeral containers may not have (ports, resources, probes, lifecycle, ...); no
/// sub-path mounts.
fn ephemeral_container_causes(pod: &Value) -> Vec<(String, String)> {
    let Some(ephemeral) = pod
        .pointer("/spec/ephemeralContainers")
        .and_then(Value::as_array)
    else {
        return Vec::new();
    };
    let names = |list: &str| -> Vec<String> {
        pod.pointer(&format!("/spec/{list}"))
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|c| c.get("name").and_then(Value::as_str))
            .map(str::to_owned)
            .collect()
    };
    let others: BTreeSet<String> = names("containers")
        .into_iter()
        .chain(names("initContainers"))
        .collect();
    let mut all = others.clone();
    let mut causes = Vec::new();
    for (i, c) in ephemeral.iter().enumerate() {
        let at = format!("spec.ephemeralContainers[{i}]");
        let cname = c.get("name").and_then(Value::as_str).unwrap_or_default();
        if cname.is_empty() {
            causes.push((format!("{at}.name"), "Required value".into()));
        }
        if c.get("image")
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
        {
            causes.push((format!("{at}.image"), "Required value".into()));
        }
        if !cname.is_empty() && !all.insert(cname.to_owned()) {
            causes.push((format!("{at}.name"), format!("Duplicate value: {cname:?}")));
        }
        if let Some(target) = c
            .get("targetContainerName")
            .and_then(Value::as_str)
            .filter(|t| !t.is_empty())
            && !others.contains(target)
        {
            causes.push((
                format!("{at}.targetContainerName"),
                format!("Not found: {target:?}"),
            ));
        }
        for field in EPHEMERAL_FORBIDDEN_FIELDS {
            if c.get(*field).is_some_and(|v| !is_zero(v)) {
                causes.push((
                    format!("{at}.{field}"),
                    "Forbidden: cannot be set for an Ephemeral Container".into(),
                ));
            }
        }
        for (j, m) in c
            .get("volumeMounts")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            for field in ["subPath", "subPathExpr"] {
                if m.get(field).is_some_and(|v| !is_zero(v)) {
                    causes.push((
                        format!("{at}.volumeMounts[{j}].{field}"),
                        "Forbidden: cannot be set for an Ephemeral Container".into(),
                    ));
                }
            }
        }
    }
    causes
}

/// The change rule of the `ephemeralcontainers` subresource: existing ephemeral containers
/// may be neither removed nor changed (compared by name, as a patch may reorder them).
fn ephemeral_change_causes(old: &Value, new: &Value) -> Vec<(String, String)> {
    let list = |pod: &Value| -> Vec<Value> {
        pod.pointer("/spec/ephemeralContainers")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    let name = |c: &Value| {
        c.get("name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    let new_list = list(new);
    let mut causes = Vec::new();
    for before in list(old) {
        let n = name(&before);
        match new_list.iter().find(|c| name(c) == n) {
            None => causes.push((
                "spec.ephemeralContainers".into(),
                format!("Forbidden: existing ephemeral containers {n:?} may not be removed\n"),
            )),
            Some(after) => {
                let diff = field_diff(&before, after);
                if !diff.is_empty() {
                    causes.push((
                        "spec.ephemeralContainers".into(),
                        format!(
                            "Forbidden: existing ephemeral containers {n:?} may not be changed\n{diff}"
                        ),
                    ));
                }
            }
        }
    }
    causes
}

/// The fields two objects differ in, one `-`/`+` pair of lines per field (zero values count as
/// absent, as Go's semantic equality sees them). Empty when equal.
fn field_diff(before: &Value, after: &Value) -> String {
    let empty = serde_json::Map::new();
    let (b, a) = (
        before.as_object().unwrap_or(&empty),
        after.as_object().unwrap_or(&empty),
    );
    let keys: BTreeSet<&String> = b.keys().chain(a.keys()).collect();
    let mut out = String::new();
    for k in keys {
        let (x, y) = (
            b.get(k).unwrap_or(&Value::Null),
            a.get(k).unwrap_or(&Value::Null),
        );
        if x == y || (is_zero(x) && is_zero(y)) {
            continue;
        }
        if !is_zero(x) {
            out.push_str(&format!("- {k}: {x}\n"));
        }
        if !is_zero(y) {
            out.push_str(&format!("+ {k}: {y}\n"));
        }
    }
    out
}

/// What `ValidateService` (and its update rule) says of the fields the simulator keeps: port
/// numbers in range, and cluster IPs that never change once set.
fn service_causes(obj: &Value, old: Option<&Value>) -> Vec<(String, String)> {
    let mut causes = Vec::new();
    let in_range = |n: i64| (1..=65535).contains(&n);
    for (i, p) in obj
        .pointer("/spec/ports")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        for field in ["port", "targetPort", "nodePort"] {
            // A named targetPort is a string; nodePort 0 means "allocate one".
            let Some(n) = p.get(field).and_then(Value::as_i64) else {
                continue;
            };
            if !(in_range(n) || (field == "nodePort" && n == 0)) {
                causes.push((
                    format!("spec.ports[{i}].{field}"),
                    format!("Invalid value: {n}: must be between 1 and 65535, inclusive"),
                ));
            }
        }
    }
    if let Some(old) = old {
        let ips = |v: &Value| {
            v.pointer("/spec/clusterIPs")
                .cloned()
                .unwrap_or(Value::Null)
        };
        let old_ips = ips(old);
        if old_ips.as_array().is_some_and(|a| !a.is_empty()) && ips(obj).get(0) != old_ips.get(0) {
            causes.push((
                "spec.clusterIPs[0]".into(),
                format!("Invalid value: {}: may not change once set", ips(obj)),
            ));
        }
    }
    causes
}

/// `legacyValidateEvent` for core Events: the namespace of the event and of the object it is
/// about agree; an event with an `eventTime` (written by a new-style recorder) names its
/// reporter, action and a Normal or Warning type.
fn event_causes(obj: &Value) -> Vec<(String, String)> {
    let mut causes = Vec::new();
    let ns = meta::namespace(obj).unwrap_or_default();
    let involved_ns = obj
        .pointer("/involvedObject/namespace")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let mismatch = |causes: &mut Vec<(String, String)>| {
        causes.push((
            "involvedObject.namespace".into(),
            format!("Invalid value: {involved_ns:?}: does not match event.namespace"),
        ));
    };
    let new_style = obj.get("eventTime").is_some_and(|t| !t.is_null());
    if !new_style {
        if involved_ns.is_empty() {
            if !ns.is_empty() && ns != "default" {
                mismatch(&mut causes);
            }
        } else if involved_ns != ns {
            mismatch(&mut causes);
        }
        return causes;
    }
    if involved_ns.is_empty() && ns != "default" && ns != "kube-system" {
        mismatch(&mut causes);
    }
    let empty = |k: &str| obj.get(k).and_then(Value::as_str).is_none_or(str::is_empty);
    for field in ["reportingComponent", "reportingInstance", "action"] {
        if empty(field) {
            causes.push((field.into(), "Required value".into()));
        }
    }
    let t = obj.get("type").and_then(Value::as_str).unwrap_or_default();
    if t != "Normal" && t != "Warning" {
        causes.push((
            "type".into(),
            format!("Invalid value: \"\": has invalid value: {t}"),
        ));
    }
    causes
}

/// The pod update rule of `ValidatePodUpdate`: only images, `activeDeadlineSeconds` (set or
/// lowered), added tolerations and removed scheduling gates may change.
fn pod_update_forbidden(old: &Value, new: &Value) -> Option<String> {
    let (Some(o), Some(n)) = (old.get("spec"), new.get("spec")) else {
        return None;
    };
    let mut a = o.clone();
    let mut b = n.clone();
    for list in ["containers", "initContainers"] {
        if let (Some(ca), Some(cb)) = (
            a.get_mut(list).and_then(Value::as_array_mut),
            b.get(list).and_then(Value::as_array),
        ) {
            for (x, y) in ca.iter_mut().zip(cb) {
                if let Some(img) = y.get("image") {
                    x["image"] = img.clone();
                }
            }
        }
    }
    match (
        o.get("activeDeadlineSeconds").and_then(Value::as_i64),
        n.get("activeDeadlineSeconds").and_then(Value::as_i64),
    ) {
        (Some(x), Some(y)) if y > x => {
            return Some(format!(
                "Invalid value: {y}: must be less than or equal to previous value"
            ));
        }
        (Some(_), None) => {
            return Some(
                "Invalid value: \"null\": must not update from a positive integer to nil value"
                    .into(),
            );
        }
        _ => {}
    }
    a["activeDeadlineSeconds"] = n
        .get("activeDeadlineSeconds")
        .cloned()
        .unwrap_or(Value::Null);
    let old_tols = o
        .get("tolerations")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let new_tols = n
        .get("tolerations")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let without_seconds = |t: &Value| {
        let mut t = t.clone();
        if let Some(m) = t.as_object_mut() {
            m.remove("tolerationSeconds");
        }
        t
    };
    let kept = old_tols.iter().all(|t| {
        new_tols
            .iter()
            .any(|u| without_seconds(u) == without_seconds(t))
    });
    if !kept {
        return Some(
            "Forbidden: existing toleration can not be modified except its tolerationSeconds"
                .into(),
        );
    }
    a["tolerations"] = n.get("tolerations").cloned().unwrap_or(Value::Null);
    let gates_removed_only = n
        .get("schedulingGates")
        .and_then(Value::as_array)
        .is_none_or(|g| {
            g.iter().all(|x| {
                o.get("schedulingGates")
                    .and_then(Value::as_array)
                    .is_some_and(|og| og.contains(x))
            })
        });
    if gates_removed_only {
        a["schedulingGates"] = n.get("schedulingGates").cloned().unwrap_or(Value::Null);
    }
    strip_nulls(&mut a);
    strip_nulls(&mut b);
    (a != b).then(|| {
        "Forbidden: pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)".to_owned()
    })
}

fn strip_nulls(v: &mut Value) {
    if let Some(m) = v.as_object_mut() {
        m.retain(|_, x| !x.is_null());
    }
}

/// Resources whose objects carry `metadata.generation`: workloads, and since Kubernetes 1.34
/// (pod generation tracking) pods; EndpointSlices always have.
pub(super) fn has_generation(rt: &ResourceType) -> bool {
    matches!(rt.group, "apps" | "batch" | "policy")
        || (rt.group.is_empty() && rt.plural == "pods")
        || (rt.group == "discovery.k8s.io" && rt.plural == "endpointslices")
}

/// What an update must change for the generation to move: the spec, or for an EndpointSlice
/// (which has none) its endpoints, ports or address type.
fn generation_moves(rt: &ResourceType, new: &Value, old: &Value) -> bool {
    if rt.plural == "endpointslices" {
        return ["endpoints", "ports", "addressType"]
            .iter()
            .any(|k| new.get(*k) != old.get(*k));
    }
    new.get("spec") != old.get("spec")
}

/// What an update keeps from the stored object.
/// As the real API server: a Secret's `stringData` is written into `data` (base64), over the
/// same keys, and never stored.
fn fold_string_data(obj: &mut Value) {
    use base64::Engine as _;
    let Some(Value::Object(strings)) = obj.as_object_mut().and_then(|o| o.remove("stringData"))
    else {
        return;
    };
    if !obj["data"].is_object() {
        obj["data"] = json!({});
    }
    for (key, value) in strings {
        if let Some(text) = value.as_str() {
            obj["data"][key] = json!(base64::engine::general_purpose::STANDARD.encode(text));
        }
    }
}

/// Defaults the real server applies whenever it decodes these objects (create and update):
/// Endpoints ports are TCP unless said; a core Event always has its (possibly empty) reporter.
fn set_decode_defaults(rt: &ResourceType, obj: &mut Value) {
    match (rt.group, rt.plural) {
        ("", "endpoints") => {
            for subset in obj
                .get_mut("subsets")
                .and_then(Value::as_array_mut)
                .into_iter()
                .flatten()
            {
                for p in subset
                    .get_mut("ports")
                    .and_then(Value::as_array_mut)
                    .into_iter()
                    .flatten()
                {
                    set_default(p, "protocol", json!("TCP"));
                }
            }
        }
        ("", "events") => {
            set_default(obj, "reportingComponent", json!(""));
            set_default(obj, "reportingInstance", json!(""));
        }
        // The v1 conversion keeps the single and the list form of a node's pod CIDR in step.
        ("", "nodes") => {
            let Some(spec) = obj.get_mut("spec").filter(|s| s.is_object()) else {
                return;
            };
            let single = spec
                .get("podCIDR")
                .and_then(Value::as_str)
                .filter(|c| !c.is_empty())
                .map(str::to_owned);
            let first = spec
                .pointer("/podCIDRs/0")
                .and_then(Value::as_str)
                .map(str::to_owned);
            match (single, first) {
                (Some(c), None) => spec["podCIDRs"] = json!([c]),
                (None, Some(c)) => spec["podCIDR"] = json!(c),
                _ => {}
            }
        }
        _ => {}
    }
}

/// The TaintNodesByCondition admission plugin: a node is created `not-ready` (NoSchedule)
/// until the node lifecycle controller sees its kubelet report Ready.
fn taint_new_node_not_ready(obj: &mut Value) {
    if let Some(taints) = node_taints_mut(obj)
        && !has_taint(taints, NOT_READY_TAINT, "NoSchedule")
    {
        taints.push(json!({"key": NOT_READY_TAINT, "effect": "NoSchedule"}));
    }
}

/// A node's `spec.taints`, made (empty) where missing.
pub(super) fn node_taints_mut(node: &mut Value) -> Option<&mut Vec<Value>> {
    if !node.get("spec").is_some_and(Value::is_object) {
        node["spec"] = json!({});
    }
    match node["spec"]
        .as_object_mut()?
        .entry("taints")
        .or_insert_with(|| json!([]))
    {
        Value::Array(taints) => Some(taints),
        _ => None,
    }
}

/// Whether `taints` has one of `key` with `effect`.
pub(super) fn has_taint(taints: &[Value], key: &str, effect: &str) -> bool {
    taints.iter().any(|t| {
        t.get("key").and_then(Value::as_str) == Some(key)
            && t.get("effect").and_then(Value::as_str) == Some(effect)
    })
}

/// The taint of a node whose kubelet is not (yet) Ready.
pub(super) const NOT_READY_TAINT: &str = "node.kubernetes.io/not-ready";

pub(super) fn prepare_update(rt: &ResourceType, new: &mut Value, old: &Value, sub: Subresource) {
    if sub == Subresource::Main {
        super::rbac_strategy::set_defaults(rt, new);
        super::volume_strategy::set_defaults(rt, new);
        set_decode_defaults(rt, new);
    }
    if rt.group.is_empty() && rt.plural == "secrets" && sub != Subresource::Status {
        fold_string_data(new);
    }
    if sub == Subresource::Status {
        let status = new.get("status").cloned();
        let rv = meta::meta_str(new, "resourceVersion").map(str::to_owned);
        *new = old.clone();
        match status {
            Some(s) => new["status"] = s,
            None => {
                if let Some(m) = new.as_object_mut() {
                    m.remove("status");
                }
            }
        }
        if let Some(rv) = rv {
            meta_mut(new).insert("resourceVersion".into(), json!(rv));
        }
        super::volume_strategy::prepare_status_update(rt, new, old);
        return;
    }
    if sub == Subresource::EphemeralContainers {
        prepare_ephemeral_update(new, old);
        return;
    }
    let old_meta = old
        .get("metadata")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let spec_changed = generation_moves(rt, new, old);
    let m = meta_mut(new);
    for k in [
        "uid",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "name",
        "namespace",
        "generation",
    ] {
        match old_meta.get(k) {
            Some(v) => {
                m.insert(k.to_owned(), v.clone());
            }
            None => {
                m.remove(k);
            }
        }
    }
    if has_generation(rt) && spec_changed {
        let g = old_meta
            .get("generation")
            .and_then(Value::as_i64)
            .unwrap_or(0)
            + 1;
        m.insert("generation".into(), json!(g));
    }
    if rt.has_status() {
        match old.get("status") {
            Some(s) => new["status"] = s.clone(),
            None => {
                if let Some(o) = new.as_object_mut() {
                    o.remove("status");
                }
            }
        }
    }
}

/// The `ephemeralcontainers` subresource's update: the stored pod with only its
/// `spec.ephemeralContainers` from the request (defaulted as containers are), its generation
/// moved when that changed the spec (`dropNonEphemeralContainerUpdates`, `updatePodGeneration`).
fn prepare_ephemeral_update(new: &mut Value, old: &Value) {
    let mut ephemeral = new
        .pointer("/spec/ephemeralContainers")
        .filter(|v| !v.is_null())
        .cloned();
    for c in ephemeral
        .as_mut()
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
    {
        default_container(c);
    }
    let rv = meta::meta_str(new, "resourceVersion").map(str::to_owned);
    *new = old.clone();
    if !new.get("spec").is_some_and(Value::is_object) {
        new["spec"] = json!({});
    }
    match ephemeral {
        Some(e) => new["spec"]["ephemeralContainers"] = e,
        None => {
            if let Some(spec) = new["spec"].as_object_mut() {
                spec.remove("ephemeralContainers");
            }
        }
    }
    if new.get("spec") != old.get("spec") {
        let g = old
            .pointer("/metadata/generation")
            .and_then(Value::as_i64)
            .unwrap_or(0)
            + 1;
        meta_mut(new).insert("generation".into(), json!(g));
    }
    match rv {
        Some(rv) => {
            meta_mut(new).insert("resourceVersion".into(), json!(rv));
        }
        None => {
            meta_mut(new).remove("resourceVersion");
        }
    }
}

/// Whether an update leaves an object that is to be removed now (deleting, no finalizers
/// left, and for a pod nothing still running: grace over, or never bound).
pub(super) fn may_finish_deletion(rt: &ResourceType, obj: &Value) -> bool {
    if !meta::deleting(obj) || !meta::finalizers(obj).is_empty() {
        return false;
    }
    if rt.plural == "namespaces" && rt.group.is_empty() {
        return obj
            .pointer("/spec/finalizers")
            .and_then(Value::as_array)
            .is_none_or(Vec::is_empty);
    }
    if rt.plural == "pods" && rt.group.is_empty() {
        let grace = obj
            .pointer("/metadata/deletionGracePeriodSeconds")
            .and_then(Value::as_i64)
            .unwrap_or(0);
        return grace == 0 || obj.pointer("/spec/nodeName").is_none();
    }
    true
}

fn is_terminal(obj: &Value) -> bool {
    matches!(
        obj.pointer("/status/phase").and_then(Value::as_str),
        Some("Succeeded" | "Failed")
    )
}

/// How a delete proceeds: `Some(marked)` keeps the object marked for deletion (finalizers,
/// graceful pod deletion, namespaces); `None` removes it now.
pub(super) fn deletion(rt: &ResourceType, obj: &Value, opts: &DeleteOptions) -> Option<Value> {
    let mut marked = obj.clone();
    let mut finalizers = meta::finalizers(obj);
    match opts.propagation.as_deref() {
        Some("Foreground") if !finalizers.iter().any(|f| f == "foregroundDeletion") => {
            finalizers.push("foregroundDeletion".into())
        }
        Some("Orphan") if !finalizers.iter().any(|f| f == "orphan") => {
            finalizers.push("orphan".into())
        }
        _ => {}
    }
    let now = Timestamp::now();
    if rt.plural == "namespaces" && rt.group.is_empty() {
        let m = meta_mut(&mut marked);
        m.entry("deletionTimestamp")
            .or_insert_with(|| json!(meta::time_string(now)));
        m.insert("deletionGracePeriodSeconds".into(), json!(0));
        marked["status"] = json!({"phase": "Terminating"});
        return Some(marked);
    }
    let mut grace = 0;
    if rt.plural == "pods" && rt.group.is_empty() {
        let bound = obj
            .pointer("/spec/nodeName")
            .and_then(Value::as_str)
            .is_some_and(|n| !n.is_empty());
        grace = opts
            .grace_period_seconds
            .or_else(|| {
                obj.pointer("/spec/terminationGracePeriodSeconds")
                    .and_then(Value::as_i64)
            })
            .unwrap_or(30)
            .max(0);
        if !bound || is_terminal(obj) {
            grace = 0;
        }
        // An ongoing graceful deletion is only ever shortened.
        if let Some(current) = obj
            .pointer("/metadata/deletionGracePeriodSeconds")
            .and_then(Value::as_i64)
        {
            grace = grace.min(current);
        }
    }
    if grace == 0 && finalizers.is_empty() {
        return None;
    }
    let m = meta_mut(&mut marked);
    let deadline = now
        .checked_add(SignedDuration::from_secs(grace))
        .unwrap_or(now);
    let keep_earlier = m
        .get("deletionTimestamp")
        .and_then(Value::as_str)
        .and_then(meta::parse_time)
        .is_some_and(|t| t <= deadline);
    if !keep_earlier {
        m.insert(
            "deletionTimestamp".into(),
            json!(meta::time_string(deadline)),
        );
    }
    m.insert("deletionGracePeriodSeconds".into(), json!(grace));
    if !finalizers.is_empty() {
        m.insert("finalizers".into(), json!(finalizers));
    }
    Some(marked)
}

/// A pod deleted without grace is first written with `deletionTimestamp` and
/// `deletionGracePeriodSeconds: 0`, then removed, as kube-apiserver's graceful pod strategy does
/// (watchers see MODIFIED, then DELETED). None for other kinds, and for a pod already marked
/// so (the real server then removes it at once).
pub(super) fn graceless_pod_mark(rt: &ResourceType, obj: &Value) -> Option<Value> {
    if !(rt.plural == "pods" && rt.group.is_empty()) {
        return None;
    }
    if obj
        .pointer("/metadata/deletionGracePeriodSeconds")
        .and_then(Value::as_i64)
        == Some(0)
    {
        return None;
    }
    let mut marked = obj.clone();
    let m = meta_mut(&mut marked);
    m.entry("deletionTimestamp")
        .or_insert_with(|| json!(meta::time_string(Timestamp::now())));
    m.insert("deletionGracePeriodSeconds".into(), json!(0));
    Some(marked)
}

/// Side effects of a create.
pub(super) fn after_create(state: &State, res: ResId, entry: &Entry) {
    if res == *ids::NAMESPACES {
        let ns = meta::name(&entry.object).unwrap_or_default().to_owned();
        let mut sa = json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default", "namespace": ns}});
        init_meta(&mut sa);
        let _ = state
            .store
            .create(*ids::SERVICEACCOUNTS, ObjKey::new(&ns, "default"), sa);
        let mut cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "kube-root-ca.crt", "namespace": ns,
                "annotations": {"kubernetes.io/description": "Contains a CA bundle that can be used to verify the kube-apiserver when using internal endpoints such as the internal service IP or kubernetes.default.svc. No other usage is guaranteed across distributions of Kubernetes clusters."}},
            "data": {"ca.crt": state.ca.cert_pem()}});
        init_meta(&mut cm);
        let _ = state
            .store
            .create(*ids::CONFIGMAPS, ObjKey::new(&ns, "kube-root-ca.crt"), cm);
    }
}

/// Side effects of an update.
pub(super) fn after_update(_state: &State, _res: ResId, _entry: &Entry) {}

/// Side effects of a delete (the entry is the marked object or the last state).
pub(super) fn after_delete(_state: &State, _res: ResId, _entry: &Entry) {}

/// The value of a field-selector label on an object, as the real server's field sets give it.
pub(super) fn field_value(rt: &ResourceType, obj: &Value, field: &str) -> Option<String> {
    match (rt.plural, field) {
        ("events", "source") => meta::path_str(obj, "source.component"),
        (_, "spec.unschedulable" | "spec.hostNetwork") => {
            Some(meta::path_str(obj, field).unwrap_or_else(|| "false".into()))
        }
        _ => Some(meta::path_str(obj, field).unwrap_or_default()),
    }
}

/// Create-only resources: bindings, reviews.
pub(super) async fn create_only(
    state: &State,
    rt: &ResourceType,
    namespace: Option<&str>,
    body: Value,
    user: &UserInfo,
) -> Result<(u16, Value), ApiError> {
    match rt.plural {
        "bindings" => {
            let pod = meta::name(&body).unwrap_or_default().to_owned();
            bind_pod(state, namespace.unwrap_or_default(), &pod, &body).map(|v| (201, v))
        }
        "tokenreviews" => {
            let token = body
                .pointer("/spec/token")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let audiences = spec_audiences(&body);
            let status = match state.authenticate(token, &audiences) {
                Ok(a) => {
                    let mut user = json!({"username": a.user.username, "uid": a.user.uid, "groups": a.user.groups});
                    if let Some((name, uid)) = a.pod {
                        user["extra"] = json!({
                            "authentication.kubernetes.io/pod-name": [name],
                            "authentication.kubernetes.io/pod-uid": [uid],
                        });
                    }
                    json!({"authenticated": true, "user": user, "audiences": a.audiences})
                }
                Err(why) => json!({"authenticated": false, "error": why}),
            };
            let mut out = body;
            out["status"] = status;
            Ok((201, out))
        }
        "selfsubjectaccessreviews" => {
            // The requester's own access, decided as a SubjectAccessReview of that user.
            let mut review = body.clone();
            review["spec"]["user"] = json!(user.username);
            review["spec"]["uid"] = json!(user.uid);
            review["spec"]["groups"] = json!(user.groups);
            let status = super::rbac_strategy::review_status(state, &review);
            let mut out = body;
            out["status"] = status;
            Ok((201, out))
        }
        "subjectaccessreviews" => {
            // Decided like a request of that user would be.
            let status = super::rbac_strategy::review_status(state, &body);
            let mut out = body;
            out["status"] = status;
            Ok((201, out))
        }
        _ => Err(ApiError::method_not_allowed(format!(
            "create is not supported on {}",
            rt.plural
        ))),
    }
}

/// Binds a pod to a node (`pods/binding`, `bindings`).
pub(super) fn bind_pod(
    state: &State,
    namespace: &str,
    pod: &str,
    binding: &Value,
) -> Result<Value, ApiError> {
    let target = binding
        .pointer("/target/name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    if target.is_empty() {
        return Err(ApiError::invalid(
            "",
            "Binding",
            pod,
            &[("target.name".into(), "Required value".into())],
        ));
    }
    let k = ObjKey::new(namespace, pod);
    for _ in 0..16 {
        let current = state
            .store
            .get(*ids::PODS, &k)
            .ok_or_else(|| ApiError::not_found("", "pods", pod))?;
        if meta::deleting(&current.object) {
            return Err(ApiError::conflict(
                "",
                "pods",
                pod,
                "pod is being deleted, cannot be assigned to a host",
            ));
        }
        if let Some(n) = current
            .object
            .pointer("/spec/nodeName")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
        {
            return Err(ApiError::conflict(
                "",
                "pods",
                pod,
                &format!("pod {pod} is already assigned to node {n:?}"),
            ));
        }
        let mut new = (*current.object).clone();
        new["spec"]["nodeName"] = json!(target);
        let cond = json!({"type": "PodScheduled", "status": "True", "lastProbeTime": null, "lastTransitionTime": meta::now()});
        let conds = new["status"]
            .as_object_mut()
            .map(|s| s.entry("conditions").or_insert_with(|| json!([])));
        if let Some(Value::Array(c)) = conds {
            c.retain(|x| x.get("type").and_then(Value::as_str) != Some("PodScheduled"));
            c.push(cond);
        }
        match state
            .store
            .replace(*ids::PODS, k.clone(), new, Some(current.rv))
        {
            Ok(_) => return Ok(rest_success()),
            Err(super::store::StoreError::Conflict) => continue,
            Err(e) => return Err(ApiError::internal(e.to_string())),
        }
    }
    Err(ApiError::conflict(
        "",
        "pods",
        pod,
        "too many concurrent writes",
    ))
}

fn rest_success() -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201})
}

/// Subresources with verbs of their own.
pub(super) async fn subresource(
    state: Arc<State>,
    req: Request<Incoming>,
    r: &ResourceRoute,
    name: &str,
    sub: &str,
    q: &Query,
    user: &UserInfo,
) -> Response<Body> {
    let rt = resources::get(r.res);
    let ns = r.namespace.clone().unwrap_or_default();
    let method = req.method().clone();
    match (rt.group, rt.plural, sub) {
        ("", "pods", "log" | "exec" | "attach" | "portforward") => {
            return super::proxy::pod_stream(state, req, &ns, name, sub, q).await;
        }
        ("", "nodes", "proxy") => return super::proxy::node_proxy(state, req, name, &r.rest).await,
        _ => {}
    }
    let result = match (rt.plural, sub, method.as_str()) {
        ("pods", "binding", "POST") => match rest::read_object(&state, req).await {
            Ok(b) => bind_pod(&state, &ns, name, &b).map(|v| (201, v)),
            Err(e) => Err(e),
        },
        ("pods", "eviction", "POST") => match rest::read_object(&state, req).await {
            Ok(body) => rest::DeleteOptions::from(q, body.get("deleteOptions").cloned())
                .and_then(|opts| super::controllers::evict(&state, &ns, name, &opts))
                .map(|()| (201, json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}))),
            Err(e) => Err(e),
        },
        ("serviceaccounts", "token", "POST") => match rest::read_object(&state, req).await {
            Ok(body) => token_request(&state, &ns, name, body),
            Err(e) => Err(e),
        },
        ("namespaces", "finalize", "PUT") => match rest::read_object(&state, req).await {
            Ok(body) => finalize_namespace(&state, name, &body),
            Err(e) => Err(e),
        },
        _ => Err(ApiError::method_not_allowed(format!("{method} is not supported on {}/{sub}", rt.plural))),
    };
    let _ = (q, user);
    match result {
        Ok((code, v)) => value_response(code, &v),
        Err(e) => error_response(&e),
    }
}

/// `spec.audiences` of a TokenRequest or TokenReview (absent: none).
fn spec_audiences(body: &Value) -> Vec<String> {
    body.pointer("/spec/audiences")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

/// `serviceaccounts/token`: a token of the ServiceAccount for the audiences asked (the API
/// server's by default), expiring after `expirationSeconds` (at least 10 minutes), bound to a
/// pod of that ServiceAccount when asked. Like kube-apiserver with its default
/// `--service-account-extend-token-expiration`, a pod-bound token of the API server's audience
/// asked for 3607 s (what `kube-api-access` volumes ask) lives a year.
fn token_request(state: &State, ns: &str, sa: &str, body: Value) -> Result<(u16, Value), ApiError> {
    const MIN_SECONDS: i64 = 600;
    const EXTENDED_FROM: i64 = 3607;
    const EXTENDED_TO: i64 = 365 * 24 * 3600;
    let account = state
        .store
        .get(*ids::SERVICEACCOUNTS, &ObjKey::new(ns, sa))
        .ok_or_else(|| ApiError::not_found("", "serviceaccounts", sa))?;
    let uid = meta::meta_str(&account.object, "uid")
        .unwrap_or_default()
        .to_owned();
    let seconds = body
        .pointer("/spec/expirationSeconds")
        .and_then(Value::as_i64)
        .unwrap_or(3600);
    if seconds < MIN_SECONDS {
        return Err(ApiError::invalid(
            "authentication.k8s.io",
            "TokenRequest",
            sa,
            &[(
                "spec.expirationSeconds".into(),
                format!(
                    "Invalid value: {seconds}: may not specify a duration less than 10 minutes"
                ),
            )],
        ));
    }
    let mut audiences = spec_audiences(&body);
    if audiences.is_empty() {
        audiences.push(super::API_AUDIENCE.to_owned());
    }
    let bound = body
        .pointer("/spec/boundObjectRef")
        .filter(|b| !b.is_null());
    let bound_pod = match bound {
        None => None,
        Some(b) if b.get("kind").and_then(Value::as_str) == Some("Pod") => {
            let name = b.get("name").and_then(Value::as_str).unwrap_or_default();
            let pod = state
                .store
                .get(*ids::PODS, &ObjKey::new(ns, name))
                .ok_or_else(|| ApiError::not_found("", "pods", name))?;
            let pod_uid = meta::meta_str(&pod.object, "uid").unwrap_or_default();
            if let Some(asked) = b.get("uid").and_then(Value::as_str)
                && !asked.is_empty()
                && asked != pod_uid
            {
                return Err(ApiError::conflict(
                    "",
                    "pods",
                    name,
                    &format!(
                        "the UID in the bound object reference ({asked}) does not match the UID in record. The object might have been deleted and then recreated"
                    ),
                ));
            }
            let pod_sa = pod
                .object
                .pointer("/spec/serviceAccountName")
                .and_then(Value::as_str)
                .unwrap_or("default");
            if pod_sa != sa {
                return Err(ApiError::bad_request(format!(
                    "cannot bind token for serviceaccount \"{sa}\" to pod running with different serviceaccount name."
                )));
            }
            Some((ns.to_owned(), name.to_owned(), pod_uid.to_owned()))
        }
        Some(b) => {
            return Err(ApiError::bad_request(format!(
                "cannot bind token to object of type {}",
                b.get("kind").and_then(Value::as_str).unwrap_or_default()
            )));
        }
    };
    let lifetime =
        if bound_pod.is_some() && seconds == EXTENDED_FROM && audiences == [super::API_AUDIENCE] {
            EXTENDED_TO
        } else {
            seconds
        };
    let expires = Timestamp::now()
        .checked_add(SignedDuration::from_secs(lifetime))
        .unwrap_or_else(|_| Timestamp::now());
    let token = state.issue_bound_token(
        super::service_account_user(ns, sa, uid),
        audiences.clone(),
        Some(expires),
        bound_pod,
    );
    let mut out = body;
    out["apiVersion"] = json!("authentication.k8s.io/v1");
    out["kind"] = json!("TokenRequest");
    out["spec"]["audiences"] = json!(audiences);
    out["spec"]["expirationSeconds"] = json!(seconds);
    out["status"] = json!({"token": token, "expirationTimestamp": meta::time_string(expires)});
    Ok((201, out))
}

fn finalize_namespace(state: &State, name: &str, body: &Value) -> Result<(u16, Value), ApiError> {
    let k = ObjKey::new("", name);
    let current = state
        .store
        .get(*ids::NAMESPACES, &k)
        .ok_or_else(|| ApiError::not_found("", "namespaces", name))?;
    let mut new = (*current.object).clone();
    new["spec"]["finalizers"] = body
        .pointer("/spec/finalizers")
        .cloned()
        .unwrap_or(json!([]));
    let rt = resources::get(*ids::NAMESPACES);
    let result = if may_finish_deletion(rt, &new) {
        state.store.remove(*ids::NAMESPACES, &k, Some(current.rv))
    } else {
        state
            .store
            .replace(*ids::NAMESPACES, k, new, Some(current.rv))
    };
    result
        .map(|e| (200, (*e.object).clone()))
        .map_err(|e| ApiError::conflict("", "namespaces", name, &e.to_string()))
}
