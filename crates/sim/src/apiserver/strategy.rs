//! What the REST verbs do beyond storing, per kind: the [`Strategy`] trait (the simulator's
//! `rest.RESTCreateStrategy`, `RESTUpdateStrategy`, `RESTGracefulDeleteStrategy` and status
//! strategy in one, every hook a no-op by default), the generic create/update/delete flow that
//! calls it, and the dispatch of create-only kinds and subresources with verbs of their own. A
//! kind's strategy is named by its row in `resources::RESOURCES`; the strategies of the kinds
//! with behaviour live in `kinds`.

use std::fmt;
use std::net::Ipv4Addr;
use std::sync::Arc;

use http::{Method, Request, Response};
use hyper::body::Incoming;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde_json::{Value, json};

use super::errors::ApiError;
use super::http::{Body, error_response, value_response};
use super::kinds;
use super::meta::{self, meta_mut};
use super::request::ResourceRoute;
use super::resources::{self, ResourceType, ids};
use super::rest::{self, DeleteOptions, Query};
use super::store::ObjKey;
use super::{State, UserInfo};

/// Validation causes: (field path, message), as `field.ErrorList` prints them.
pub(crate) type Causes = Vec<(String, String)>;

/// How a kind's object names are checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum NameRule {
    /// A DNS subdomain (most kinds).
    Subdomain,
    /// A DNS label (namespaces, services).
    Label,
    /// A path segment (roles and bindings: `system:discovery`).
    PathSegment,
}

/// Subresources that hand the connection over (logs, exec, proxies) rather than take a body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stream {
    /// A pod's `log`, `exec`, `attach` or `portforward`, through its node's kubelet.
    Pod,
    /// A node's `proxy`, to its kubelet.
    Node,
}

/// The behaviour of one kind. Every hook has the default of a kind with none (stored as sent,
/// metadata kept by the generic flow), so a kind without behaviour is [`Plain`].
pub(crate) trait Strategy: Sync + fmt::Debug {
    /// How names are checked.
    fn name_rule(&self) -> NameRule {
        NameRule::Subdomain
    }

    /// Whether objects may still be created in a namespace being deleted (events).
    fn created_in_terminating_namespace(&self) -> bool {
        false
    }

    /// Defaults the real server applies whenever it decodes the object (create and update).
    fn defaults(&self, _obj: &mut Value) {}

    /// `PrepareForCreate` and the admission plugins of the kind: defaults that depend on
    /// other objects, the initial status. Runs after [`Strategy::defaults`].
    fn prepare_create(&self, _state: &State, _obj: &mut Value) -> Result<(), ApiError> {
        Ok(())
    }

    /// What a created object brings along (a namespace's ServiceAccount and CA ConfigMap).
    fn after_create(&self, _state: &State, _obj: &Value) {}

    /// `PrepareForUpdate` of the object, after [`Strategy::defaults`] and after the generic
    /// flow kept the server-owned metadata and the status.
    fn prepare_update(&self, _new: &mut Value, _old: &Value) {}

    /// The status strategy's `PrepareForUpdate`: `new` is the stored object with the written
    /// status.
    fn prepare_status_update(&self, _new: &mut Value, _old: &Value) {}

    /// `Validate` (`old` is `None`) and `ValidateUpdate`.
    fn validate(&self, _obj: &Value, _old: Option<&Value>) -> Causes {
        Vec::new()
    }

    /// `AllowUnconditionalUpdate`: whether an update may omit the resourceVersion.
    fn unconditional_update(&self) -> bool {
        true
    }

    /// Whether objects carry `metadata.generation`.
    fn tracks_generation(&self) -> bool {
        false
    }

    /// Whether an update moves the generation: a changed spec.
    fn generation_moves(&self, new: &Value, old: &Value) -> bool {
        new.get("spec") != old.get("spec")
    }

    /// How a delete proceeds: `Some(marked)` keeps the object marked for deletion
    /// (finalizers, a grace period); `None` removes it now.
    fn deletion(&self, obj: &Value, opts: &DeleteOptions) -> Option<Value> {
        mark_for_deletion(obj, opts, 0)
    }

    /// The object written once, marked, before an immediate removal (pods: watchers see
    /// MODIFIED, then DELETED). `None`: removed without a last write.
    fn last_mark(&self, _obj: &Value) -> Option<Value> {
        None
    }

    /// Whether a deleting object without finalizers may go (beyond the generic rule).
    fn may_finish_deletion(&self, _obj: &Value) -> bool {
        true
    }

    /// The value of a field-selector label on an object.
    fn field_value(&self, obj: &Value, field: &str) -> String {
        meta::path_str(obj, field).unwrap_or_default()
    }

    /// The answer of a create-only kind (reviews, bindings): nothing is stored.
    fn create(
        &self,
        _state: &State,
        _namespace: Option<&str>,
        _body: Value,
        _user: &UserInfo,
    ) -> Result<(u16, Value), ApiError> {
        Err(ApiError::method_not_allowed("create is not supported"))
    }

    /// A subresource with a verb of its own that takes a body (binding, eviction, token,
    /// finalize); `None` when the kind has no such `sub` for `method`.
    fn subresource(
        &self,
        _state: &State,
        _call: &SubresourceCall<'_>,
        _body: Value,
    ) -> Option<Result<(u16, Value), ApiError>> {
        None
    }

    /// A subresource that streams (logs, exec, proxies), if `sub` is one.
    fn stream(&self, _sub: &str) -> Option<Stream> {
        None
    }
}

/// A request to a subresource of one object.
#[derive(Debug)]
pub(crate) struct SubresourceCall<'a> {
    /// The object's namespace (empty for cluster-scoped kinds).
    pub namespace: &'a str,
    /// The object's name.
    pub name: &'a str,
    /// The subresource.
    pub sub: &'a str,
    /// The method.
    pub method: &'a Method,
    /// The query.
    pub query: &'a Query,
}

/// A kind without behaviour of its own: stored, watched and listed as sent.
#[derive(Debug)]
pub(crate) struct Plain;

impl Strategy for Plain {}

/// A kind without behaviour that tracks `metadata.generation` (controller revisions).
#[derive(Debug)]
pub(crate) struct Generational;

impl Strategy for Generational {
    fn tracks_generation(&self) -> bool {
        true
    }
}

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
    let namespaces = resources::get(*ids::NAMESPACES);
    for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
        let mut obj = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
        init_meta(&mut obj);
        if namespaces.strategy.prepare_create(state, &mut obj).is_ok()
            && let Ok(entry) = state
                .store
                .create(*ids::NAMESPACES, ObjKey::new("", ns), obj)
        {
            namespaces.strategy.after_create(state, &entry.object);
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
    for (res, mut obj) in kinds::rbac::bootstrap_policy() {
        init_meta(&mut obj);
        let name = meta::name(&obj).unwrap_or_default().to_owned();
        let _ = state.store.create(res, ObjKey::new("", name), obj);
    }
}

/// The uid and creation time of an object the server makes itself.
pub(super) fn init_meta(obj: &mut Value) {
    let m = meta_mut(obj);
    m.insert("uid".into(), json!(meta::new_uid()));
    m.insert("creationTimestamp".into(), json!(meta::now()));
}

/// Names: DNS labels, DNS subdomains or path segments, as the kind's strategy says.
pub(super) fn validate_name(rt: &ResourceType, name: &str) -> Result<(), ApiError> {
    let why = match rt.strategy.name_rule() {
        NameRule::PathSegment => kinds::rbac::invalid_name(name),
        NameRule::Label => (!is_dns_label(name)).then_some(
            "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character",
        ),
        NameRule::Subdomain => (!is_dns_subdomain(name)).then_some(
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character",
        ),
    };
    match why {
        None => Ok(()),
        Some(why) => Err(ApiError::invalid(
            rt.group,
            rt.kind,
            name,
            &[(
                "metadata.name".into(),
                format!("Invalid value: {name:?}: {why}"),
            )],
        )),
    }
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
    if meta::deleting(&entry.object) && !rt.strategy.created_in_terminating_namespace() {
        return Err(ApiError::forbidden(format!(
            "{} \"{}\" is forbidden: unable to create new content in namespace {ns} because it is being terminated",
            rt.plural, ""
        )));
    }
    Ok(())
}

/// Defaults and admission for a new object.
pub(super) fn prepare_create(
    state: &State,
    rt: &ResourceType,
    obj: &mut Value,
) -> Result<(), ApiError> {
    rt.strategy.defaults(obj);
    rt.strategy.prepare_create(state, obj)
}

/// Validation of a created or updated object.
pub(super) fn validate(
    rt: &ResourceType,
    obj: &Value,
    old: Option<&Value>,
) -> Result<(), ApiError> {
    let causes = rt.strategy.validate(obj, old);
    if causes.is_empty() {
        return Ok(());
    }
    Err(ApiError::invalid(
        rt.group,
        rt.kind,
        meta::name(obj).unwrap_or_default(),
        &causes,
    ))
}

/// Validation of an update through a subresource: the `ephemeralcontainers` one (pods only)
/// validates the change of the ephemeral containers, the others as [`validate`].
pub(super) fn validate_update(
    rt: &ResourceType,
    new: &Value,
    old: &Value,
    sub: Subresource,
) -> Result<(), ApiError> {
    if sub != Subresource::EphemeralContainers {
        return validate(rt, new, Some(old));
    }
    kinds::pod::validate_ephemeral_update(rt, new, old)
}

/// What an update keeps from the stored object: the server-owned metadata, the status (a
/// write of the object) or all but the status (a write of `status`), then the kind's hooks.
pub(super) fn prepare_update(rt: &ResourceType, new: &mut Value, old: &Value, sub: Subresource) {
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
        rt.strategy.prepare_status_update(new, old);
        return;
    }
    if sub == Subresource::EphemeralContainers {
        kinds::pod::prepare_ephemeral_update(new, old);
        return;
    }
    rt.strategy.defaults(new);
    let old_meta = old
        .get("metadata")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let spec_changed = rt.strategy.generation_moves(new, old);
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
    if rt.strategy.tracks_generation() && spec_changed {
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
    rt.strategy.prepare_update(new, old);
}

/// Whether an update leaves an object that is to be removed now (deleting, no finalizers
/// left, and whatever else the kind waits for).
pub(super) fn may_finish_deletion(rt: &ResourceType, obj: &Value) -> bool {
    meta::deleting(obj) && meta::finalizers(obj).is_empty() && rt.strategy.may_finish_deletion(obj)
}

/// The generic deletion: `Some(marked)` with the deletion timestamp `grace` seconds ahead and
/// the finalizers the propagation policy adds, when there is a grace period or a finalizer;
/// `None` (remove now) otherwise.
pub(crate) fn mark_for_deletion(obj: &Value, opts: &DeleteOptions, grace: i64) -> Option<Value> {
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
    if grace == 0 && finalizers.is_empty() {
        return None;
    }
    let now = Timestamp::now();
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

/// Subresources with verbs of their own.
pub(super) async fn subresource(
    state: Arc<State>,
    req: Request<Incoming>,
    r: &ResourceRoute,
    name: &str,
    sub: &str,
    q: &Query,
) -> Response<Body> {
    let rt = resources::get(r.res);
    let ns = r.namespace.clone().unwrap_or_default();
    match rt.strategy.stream(sub) {
        Some(Stream::Pod) => return super::proxy::pod_stream(state, req, &ns, name, sub, q).await,
        Some(Stream::Node) => return super::proxy::node_proxy(state, req, name, &r.rest).await,
        None => {}
    }
    let method = req.method().clone();
    let call = SubresourceCall {
        namespace: &ns,
        name,
        sub,
        method: &method,
        query: q,
    };
    let result = match rest::read_object(&state, req).await {
        Ok(body) => rt
            .strategy
            .subresource(&state, &call, body)
            .unwrap_or_else(|| {
                Err(ApiError::method_not_allowed(format!(
                    "{method} is not supported on {}/{sub}",
                    rt.plural
                )))
            }),
        Err(e) => Err(e),
    };
    match result {
        Ok((code, v)) => value_response(code, &v),
        Err(e) => error_response(&e),
    }
}

/// `{"status": "Success"}` with a code, as subresources that store nothing answer.
pub(crate) fn success(code: u16) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": code})
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rt(res: &std::sync::LazyLock<usize>) -> &'static ResourceType {
        resources::get(**res)
    }

    #[test]
    fn an_update_keeps_server_owned_metadata_and_the_status_and_moves_the_generation() {
        let deployments = rt(&ids::DEPLOYMENTS);
        let old = json!({"metadata": {"name": "d", "uid": "u", "generation": 3,
            "creationTimestamp": "2026-01-01T00:00:00Z"}, "spec": {"replicas": 1},
            "status": {"replicas": 1}});
        let mut new = json!({"metadata": {"name": "d", "uid": "other"}, "spec": {"replicas": 2},
            "status": {"replicas": 9}});
        prepare_update(deployments, &mut new, &old, Subresource::Main);
        assert_eq!(new["metadata"]["uid"], "u");
        assert_eq!(new["metadata"]["generation"], 4);
        assert_eq!(new["status"], json!({"replicas": 1}));
        // A ConfigMap has no generation, whatever changes.
        let mut cm = json!({"metadata": {"name": "c"}, "data": {"a": "b"}});
        prepare_update(
            rt(&ids::CONFIGMAPS),
            &mut cm,
            &json!({"metadata": {"name": "c"}}),
            Subresource::Main,
        );
        assert!(cm["metadata"].get("generation").is_none());
    }

    #[test]
    fn a_status_write_changes_only_the_status() {
        let old =
            json!({"metadata": {"name": "d", "resourceVersion": "5"}, "spec": {"replicas": 1}});
        let mut new = json!({"metadata": {"name": "d", "resourceVersion": "5"}, "spec": {"replicas": 7},
            "status": {"readyReplicas": 1}});
        prepare_update(rt(&ids::DEPLOYMENTS), &mut new, &old, Subresource::Status);
        assert_eq!(new["spec"], json!({"replicas": 1}));
        assert_eq!(new["status"], json!({"readyReplicas": 1}));
    }

    #[test]
    fn deletion_waits_for_finalizers_and_the_propagation_policy_adds_its_own() {
        let cm = json!({"metadata": {"name": "c"}});
        assert_eq!(Plain.deletion(&cm, &DeleteOptions::default()), None);
        let foreground = DeleteOptions {
            propagation: Some("Foreground".into()),
            ..DeleteOptions::default()
        };
        let marked = Plain.deletion(&cm, &foreground).unwrap();
        assert_eq!(
            marked["metadata"]["finalizers"],
            json!(["foregroundDeletion"])
        );
        assert!(!may_finish_deletion(rt(&ids::CONFIGMAPS), &marked));
        let mut done = marked;
        done["metadata"]["finalizers"] = json!([]);
        assert!(may_finish_deletion(rt(&ids::CONFIGMAPS), &done));
    }

    #[test]
    fn names_follow_the_kinds_rule() {
        assert!(validate_name(rt(&ids::CONFIGMAPS), "a.b-c").is_ok());
        assert!(validate_name(rt(&ids::SERVICES), "a.b").is_err());
        assert!(validate_name(rt(&ids::CLUSTER_ROLES), "system:discovery").is_ok());
        assert!(validate_name(rt(&ids::CONFIGMAPS), "system:discovery").is_err());
    }

    #[test]
    fn every_kind_of_the_table_has_the_strategy_of_its_behaviour() {
        // Spot checks that rows name the right strategy (a wrong one fails quietly).
        assert!(rt(&ids::PODS).strategy.tracks_generation());
        assert!(rt(&ids::CONTROLLER_REVISIONS).strategy.tracks_generation());
        assert!(!rt(&ids::CONFIGMAPS).strategy.tracks_generation());
        assert!(!rt(&ids::LEASES).strategy.unconditional_update());
        assert_eq!(rt(&ids::NODES).strategy.stream("proxy"), Some(Stream::Node));
        assert_eq!(rt(&ids::NAMESPACES).strategy.name_rule(), NameRule::Label);
    }
}
