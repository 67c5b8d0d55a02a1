//! Pods: the defaults of `SetDefaults_Pod(Spec)` and the admission plugins a pod passes
//! (ServiceAccount, DefaultTolerationSeconds, Priority), QoS class, validation of create,
//! update and the `ephemeralcontainers` subresource, graceful deletion, field selectors, and
//! the subresources binding, eviction, log, exec, attach and portforward.

use std::collections::BTreeSet;

use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};

use super::set_default;
use crate::apiserver::State;
use crate::apiserver::errors::ApiError;
use crate::apiserver::meta::{self, meta_mut};
use crate::apiserver::resources::{self, ResourceType, ids};
use crate::apiserver::rest::DeleteOptions;
use crate::apiserver::store::ObjKey;
use crate::apiserver::strategy::{
    Causes, Strategy, Stream, SubresourceCall, mark_for_deletion, success,
};

/// The strategy of pods.
#[derive(Debug)]
pub(crate) struct Pods;

impl Strategy for Pods {
    fn prepare_create(&self, state: &State, obj: &mut Value) -> Result<(), ApiError> {
        prepare_pod(state, obj)
    }

    fn validate(&self, obj: &Value, old: Option<&Value>) -> Causes {
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
        causes
    }

    /// Since Kubernetes 1.34 (pod generation tracking).
    fn tracks_generation(&self) -> bool {
        true
    }

    /// Graceful deletion: a bound, running pod is marked for its grace period (the request's,
    /// else its spec's, else 30 s); an ongoing graceful deletion is only ever shortened.
    fn deletion(&self, obj: &Value, opts: &DeleteOptions) -> Option<Value> {
        let bound = obj
            .pointer("/spec/nodeName")
            .and_then(Value::as_str)
            .is_some_and(|n| !n.is_empty());
        let mut grace = opts
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
        if let Some(current) = obj
            .pointer("/metadata/deletionGracePeriodSeconds")
            .and_then(Value::as_i64)
        {
            grace = grace.min(current);
        }
        mark_for_deletion(obj, opts, grace)
    }

    /// A pod deleted without grace is first written with `deletionTimestamp` and
    /// `deletionGracePeriodSeconds: 0`, then removed, as kube-apiserver's graceful pod
    /// strategy does (watchers see MODIFIED, then DELETED); not when already marked so (the
    /// real server then removes it at once).
    fn last_mark(&self, obj: &Value) -> Option<Value> {
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

    /// A deleting pod goes once its grace is over, or at once if it never ran on a node.
    fn may_finish_deletion(&self, obj: &Value) -> bool {
        let grace = obj
            .pointer("/metadata/deletionGracePeriodSeconds")
            .and_then(Value::as_i64)
            .unwrap_or(0);
        grace == 0 || obj.pointer("/spec/nodeName").is_none()
    }

    fn field_value(&self, obj: &Value, field: &str) -> String {
        match field {
            "spec.hostNetwork" => meta::path_str(obj, field).unwrap_or_else(|| "false".into()),
            _ => meta::path_str(obj, field).unwrap_or_default(),
        }
    }

    fn subresource(
        &self,
        state: &State,
        call: &SubresourceCall<'_>,
        body: Value,
    ) -> Option<Result<(u16, Value), ApiError>> {
        if call.method != http::Method::POST {
            return None;
        }
        match call.sub {
            "binding" => Some(bind_pod(state, call.namespace, call.name, &body).map(|v| (201, v))),
            "eviction" => Some(
                DeleteOptions::from(call.query, body.get("deleteOptions").cloned())
                    .and_then(|opts| {
                        crate::apiserver::controllers::evict(
                            state,
                            call.namespace,
                            call.name,
                            &opts,
                        )
                    })
                    .map(|()| (201, success(201))),
            ),
            _ => None,
        }
    }

    fn stream(&self, sub: &str) -> Option<Stream> {
        matches!(sub, "log" | "exec" | "attach" | "portforward").then_some(Stream::Pod)
    }
}

/// The strategy of `bindings` (create only): binds the pod it names.
#[derive(Debug)]
pub(crate) struct Bindings;

impl Strategy for Bindings {
    fn create(
        &self,
        state: &State,
        namespace: Option<&str>,
        body: Value,
        _user: &crate::apiserver::UserInfo,
    ) -> Result<(u16, Value), ApiError> {
        let pod = meta::name(&body).unwrap_or_default().to_owned();
        bind_pod(state, namespace.unwrap_or_default(), &pod, &body).map(|v| (201, v))
    }
}

/// Validation of the `ephemeralcontainers` subresource's update: the pod, and the change of
/// its ephemeral containers (`ValidatePodEphemeralContainersUpdate`); none for static pods.
pub(crate) fn validate_ephemeral_update(
    rt: &ResourceType,
    new: &Value,
    old: &Value,
) -> Result<(), ApiError> {
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
    causes.extend(ephemeral_change_causes(old, new));
    if causes.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid(rt.group, rt.kind, name, &causes))
    }
}

/// `SetDefaults_PodSpec` and `SetDefaults_Container`, the parts clients see (of pods and of
/// pod templates alike; [`default_pod_only`] has the rest).
pub(crate) fn default_pod_spec(spec: &mut Value) {
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

pub(crate) fn default_container(c: &mut Value) {
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

/// The `ephemeralcontainers` subresource's update: the stored pod with only its
/// `spec.ephemeralContainers` from the request (defaulted as containers are), its generation
/// moved when that changed the spec (`dropNonEphemeralContainerUpdates`, `updatePodGeneration`).
pub(crate) fn prepare_ephemeral_update(new: &mut Value, old: &Value) {
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

fn is_terminal(obj: &Value) -> bool {
    matches!(
        obj.pointer("/status/phase").and_then(Value::as_str),
        Some("Succeeded" | "Failed")
    )
}

/// Binds a pod to a node (`pods/binding`, `bindings`).
pub(crate) fn bind_pod(
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
            Ok(_) => return Ok(success(201)),
            Err(crate::apiserver::store::StoreError::Conflict) => continue,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(spec: Value) -> Value {
        json!({"metadata": {"name": "p", "namespace": "default"}, "spec": spec})
    }

    #[test]
    fn a_new_pod_gets_defaults_admission_and_a_pending_status() {
        let state = State::for_tests();
        let mut p = pod(json!({"containers": [{"name": "c", "image": "nginx",
            "resources": {"limits": {"cpu": "1"}}}]}));
        Pods.prepare_create(&state, &mut p).unwrap();
        let spec = &p["spec"];
        assert_eq!(spec["restartPolicy"], "Always");
        assert_eq!(spec["serviceAccountName"], "default");
        assert_eq!(spec["enableServiceLinks"], true);
        assert_eq!(spec["priority"], 0);
        let c = &spec["containers"][0];
        assert_eq!(c["imagePullPolicy"], "Always", "untagged image: latest");
        assert_eq!(
            c["resources"]["requests"]["cpu"], "1",
            "requests from limits"
        );
        assert_eq!(c["volumeMounts"][0]["mountPath"], SA_MOUNT);
        assert_eq!(spec["tolerations"].as_array().unwrap().len(), 2);
        assert_eq!(
            p["status"],
            json!({"phase": "Pending", "qosClass": "Burstable"})
        );
    }

    #[test]
    fn admission_refuses_a_missing_service_account_or_priority_class() {
        let state = State::for_tests();
        let mut p =
            pod(json!({"serviceAccountName": "nope", "containers": [{"name": "c", "image": "i"}]}));
        let e = Pods.prepare_create(&state, &mut p).unwrap_err();
        assert_eq!(e.code, 403);
        let mut p =
            pod(json!({"priorityClassName": "high", "containers": [{"name": "c", "image": "i"}]}));
        assert_eq!(Pods.prepare_create(&state, &mut p).unwrap_err().code, 403);
    }

    #[test]
    fn validation_needs_named_containers_and_keeps_the_spec_on_update() {
        assert_eq!(Pods.validate(&pod(json!({})), None).len(), 1);
        let old = pod(json!({"containers": [{"name": "c", "image": "a"}]}));
        let image = pod(json!({"containers": [{"name": "c", "image": "b"}]}));
        assert!(Pods.validate(&image, Some(&old)).is_empty());
        let other = pod(json!({"containers": [{"name": "c", "image": "a"}], "hostNetwork": true}));
        let causes = Pods.validate(&other, Some(&old));
        assert!(
            causes[0].1.starts_with("Forbidden: pod updates"),
            "{causes:?}"
        );
        let ephemeral = pod(json!({"containers": [{"name": "c", "image": "a"}],
            "ephemeralContainers": [{"name": "d", "image": "busybox"}]}));
        assert_eq!(
            Pods.validate(&ephemeral, None)[0].0,
            "spec.ephemeralContainers"
        );
    }

    #[test]
    fn a_bound_pod_is_deleted_gracefully_an_unbound_one_at_once() {
        let opts = DeleteOptions::default();
        let unbound = pod(json!({"containers": []}));
        assert_eq!(Pods.deletion(&unbound, &opts), None);
        assert!(Pods.last_mark(&unbound).is_some());
        let bound = pod(json!({"nodeName": "n", "terminationGracePeriodSeconds": 20}));
        let marked = Pods.deletion(&bound, &opts).unwrap();
        assert_eq!(marked["metadata"]["deletionGracePeriodSeconds"], 20);
        assert!(!Pods.may_finish_deletion(&marked));
        // An ongoing graceful deletion is only shortened.
        let longer = DeleteOptions {
            grace_period_seconds: Some(60),
            ..DeleteOptions::default()
        };
        let again = Pods.deletion(&marked, &longer).unwrap();
        assert_eq!(again["metadata"]["deletionGracePeriodSeconds"], 20);
    }

    #[test]
    fn field_selectors_and_streams() {
        assert_eq!(
            Pods.field_value(&pod(json!({})), "spec.hostNetwork"),
            "false"
        );
        assert_eq!(Pods.stream("log"), Some(Stream::Pod));
        assert_eq!(Pods.stream("binding"), None);
    }
}
