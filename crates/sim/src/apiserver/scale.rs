//! The `scale` subresource of deployments, replicasets and statefulsets: an `autoscaling/v1`
//! Scale made from the parent (its identity, `spec.replicas`, `status.replicas` and its selector
//! as a string), read with GET and changed with PUT or PATCH, which write only the parent's
//! `spec.replicas`. As the real ScaleREST: the Scale's resourceVersion is the parent's (a
//! non-empty one is a precondition), a Scale's uid, when given, must be the parent's, and the
//! write goes through the parent's update rules (generation, validation). Mutating webhooks are
//! not called for it (the simulator's webhooks match resources, not subresources).

use http::{Method, Request, Response, header};
use hyper::body::Incoming;
use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};

use super::errors::ApiError;
use super::http::{Body, error_response, value_response};
use super::meta;
use super::request::ResourceRoute;
use super::resources::{self, ResourceType};
use super::rest::{self, Query};
use super::selectors::LabelSelector;
use super::store::{ObjKey, StoreError};
use super::strategy::{self, PatchKind, Subresource};
use super::{State, table};

const API_VERSION: &str = "autoscaling/v1";

/// How many times a write that lost a race to another writer is retried.
const RETRIES: usize = 16;

/// What a write does to the current Scale.
enum Change {
    /// PUT: this Scale replaces it.
    Replace(Value),
    /// PATCH: this patch is applied to it.
    Patch(PatchKind, Value),
}

/// Serves `{deployments,replicasets,statefulsets}/{name}/scale`.
pub(super) async fn serve(
    state: &State,
    req: Request<Incoming>,
    r: &ResourceRoute,
    name: &str,
    q: &Query,
) -> Response<Body> {
    let header = |h: header::HeaderName| {
        req.headers()
            .get(h)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let as_table = table::wants_table(header(header::ACCEPT).as_deref());
    let content_type = header(header::CONTENT_TYPE).unwrap_or_else(|| "application/json".into());
    let result = match req.method().clone() {
        Method::GET => get(state, r, name).map(|scale| {
            if as_table {
                scale_table(&scale, state.store.current_rv(), q.get("includeObject"))
            } else {
                scale
            }
        }),
        Method::PUT => match rest::read_object(state, req).await {
            Ok(body) => update(state, r, name, q, &Change::Replace(body)),
            Err(e) => Err(e),
        },
        Method::PATCH => match rest::read_bytes(state, req).await {
            Ok(body) => parse_patch(&content_type, &body, q)
                .and_then(|change| update(state, r, name, q, &change)),
            Err(e) => Err(e),
        },
        _ => Err(ApiError::method_not_allowed(
            "the server does not allow this method on the requested resource",
        )),
    };
    match result {
        Ok(v) => value_response(200, &v),
        Err(e) => error_response(&e),
    }
}

fn get(state: &State, r: &ResourceRoute, name: &str) -> Result<Value, ApiError> {
    let rt = resources::get(r.res);
    let k = ObjKey::new(r.namespace.as_deref().unwrap_or_default(), name);
    match state.store.get(r.res, &k) {
        Some(e) => scale_of(&e.object),
        None => Err(ApiError::not_found(rt.group, rt.plural, name)),
    }
}

/// The Scale of a parent object (upstream `scaleFromDeployment` and its twins).
fn scale_of(parent: &Value) -> Result<Value, ApiError> {
    let selector = parent
        .pointer("/spec/selector")
        .map_or(
            Ok(LabelSelector::nothing()),
            LabelSelector::from_label_selector,
        )
        .map_err(|e| ApiError::bad_request(e.to_string()))?
        .to_string();
    let mut metadata = serde_json::Map::new();
    for k in [
        "name",
        "namespace",
        "uid",
        "resourceVersion",
        "creationTimestamp",
    ] {
        if let Some(v) = parent.pointer(&format!("/metadata/{k}")) {
            metadata.insert(k.into(), v.clone());
        }
    }
    // Go's omitempty: `spec.replicas` and `status.selector` go when zero, `status.replicas` stays.
    let mut spec = json!({});
    if let Some(n) = parent
        .pointer("/spec/replicas")
        .and_then(Value::as_i64)
        .filter(|n| *n != 0)
    {
        spec["replicas"] = json!(n);
    }
    let mut status = json!({"replicas": parent.pointer("/status/replicas").and_then(Value::as_i64).unwrap_or(0)});
    if !selector.is_empty() {
        status["selector"] = json!(selector);
    }
    Ok(
        json!({"kind": "Scale", "apiVersion": API_VERSION, "metadata": metadata,
        "spec": spec, "status": status}),
    )
}

/// A PATCH body, checked as the real patch handler checks it before reading the object.
fn parse_patch(content_type: &str, body: &[u8], q: &Query) -> Result<Change, ApiError> {
    let mime = content_type.split(';').next().unwrap_or_default().trim();
    let kind = PatchKind::from_mime(mime).ok_or_else(|| ApiError::unsupported_media_type(mime))?;
    let doc = match kind {
        PatchKind::Apply => {
            rest::apply_field_manager(q)?;
            rest::decode("application/apply-patch+yaml", body)?
        }
        _ => serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("error decoding the patch as JSON: {e}")))?,
    };
    Ok(Change::Patch(kind, doc))
}

/// PUT and PATCH: the new Scale from the current one, checked, and the parent's
/// `spec.replicas` set from it; retried when another write wins, unless the Scale named a
/// resourceVersion (then 409).
fn update(
    state: &State,
    r: &ResourceRoute,
    name: &str,
    q: &Query,
    change: &Change,
) -> Result<Value, ApiError> {
    let rt = resources::get(r.res);
    let namespace = r.namespace.as_deref().unwrap_or_default();
    let k = ObjKey::new(namespace, name);
    for _ in 0..RETRIES {
        let current = state
            .store
            .get(r.res, &k)
            .ok_or_else(|| ApiError::not_found(rt.group, rt.plural, name))?;
        let new_scale = match change {
            Change::Replace(body) => {
                let mut body = body.clone();
                check_identity(&mut body, namespace, name)?;
                body
            }
            Change::Patch(kind, doc) => {
                let mut scale = scale_of(&current.object)?;
                strategy::apply_patch(rt, *kind, &mut scale, doc)?;
                scale
            }
        };
        let replicas = replicas_of(&new_scale, name)?;
        let precondition = match meta::meta_str(&new_scale, "resourceVersion") {
            None | Some("") => None,
            Some(v) => Some(
                v.parse::<u64>()
                    .map_err(|_| ApiError::bad_request(format!("invalid resourceVersion {v:?}")))?,
            ),
        };
        if precondition.is_some_and(|p| p != current.rv) {
            return Err(conflict(rt, name));
        }
        let uid = meta::meta_str(&current.object, "uid").unwrap_or_default();
        if let Some(want) = meta::meta_str(&new_scale, "uid").filter(|u| !u.is_empty())
            && want != uid
        {
            return Err(ApiError::conflict(
                rt.group,
                &format!("{}/scale", rt.plural),
                name,
                &format!(
                    "Precondition failed: UID in precondition: {want}, UID in object meta: {uid}"
                ),
            ));
        }
        let mut new = (*current.object).clone();
        new["spec"]["replicas"] = json!(replicas);
        strategy::prepare_update(rt, &mut new, &current.object, Subresource::Main);
        strategy::validate(rt, &new, Some(&current.object))?;
        if new == *current.object {
            // Nothing changes: no write, no new resourceVersion (as for any no-op update).
            return scale_of(&current.object);
        }
        if q.all("dryRun").contains(&"All") {
            return scale_of(&new);
        }
        match state.store.replace(r.res, k.clone(), new, Some(current.rv)) {
            Ok(entry) => return scale_of(&entry.object),
            Err(e) => match rest::write_error(rt, name, e, precondition.is_some()) {
                Some(err) => return Err(err),
                None => continue,
            },
        }
    }
    Err(rest::too_many_writes(rt, name))
}

fn conflict(rt: &ResourceType, name: &str) -> ApiError {
    ApiError::conflict(rt.group, rt.plural, name, &StoreError::Conflict.to_string())
}

/// A PUT body must be an `autoscaling/v1` Scale of this name and namespace (both may be left
/// out).
fn check_identity(body: &mut Value, namespace: &str, name: &str) -> Result<(), ApiError> {
    if !body.is_object() {
        return Err(ApiError::bad_request("the request body is not an object"));
    }
    for (field, want) in [("apiVersion", API_VERSION), ("kind", "Scale")] {
        match body.get(field).and_then(Value::as_str) {
            Some(got) if got != want => {
                let what = if field == "kind" {
                    "kind"
                } else {
                    "API version"
                };
                return Err(ApiError::bad_request(format!(
                    "the {what} in the data ({got}) does not match the expected {what} ({want})"
                )));
            }
            _ => body[field] = json!(want),
        }
    }
    match meta::namespace(body) {
        Some(ns) if ns != namespace => {
            return Err(ApiError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
        _ => {}
    }
    match meta::name(body) {
        Some(n) if n != name => Err(ApiError::bad_request(format!(
            "the name of the object ({n}) does not match the name on the URL ({name})"
        ))),
        _ => Ok(()),
    }
}

/// `spec.replicas` of a Scale (0 when absent, as Go decodes it), validated like
/// `ValidateScale`.
fn replicas_of(scale: &Value, name: &str) -> Result<i64, ApiError> {
    let replicas = match scale.pointer("/spec/replicas") {
        None | Some(Value::Null) => 0,
        Some(v) => v
            .as_i64()
            .filter(|n| i32::try_from(*n).is_ok())
            .ok_or_else(|| {
                ApiError::bad_request(format!(
                    "Scale in version \"v1\" cannot be handled as a Scale: spec.replicas: {v} is not a 32-bit integer"
                ))
            })?,
    };
    if replicas < 0 {
        return Err(ApiError::invalid(
            "autoscaling",
            "Scale",
            name,
            &[(
                "spec.replicas".into(),
                format!("Invalid value: {replicas}: must be greater than or equal to 0"),
            )],
        ));
    }
    Ok(replicas)
}

/// A Scale as a Table, with the columns of the real server's printer (Name, Desired,
/// Available, Age).
fn scale_table(scale: &Value, rv: u64, include: Option<&str>) -> Value {
    let age = meta::meta_str(scale, "creationTimestamp")
        .and_then(meta::parse_time)
        .map(|t| table::human_duration(Timestamp::now(), t))
        .unwrap_or_else(|| "<unknown>".into());
    let object = match include {
        Some("None") => Value::Null,
        Some("Object") => scale.clone(),
        _ => json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
            "metadata": scale.get("metadata")}),
    };
    let column = |name: &str, kind: &str, format: &str| json!({"name": name, "type": kind, "format": format, "description": "", "priority": 0});
    json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": rv.to_string()},
        "columnDefinitions": [column("Name", "string", "name"), column("Desired", "integer", ""),
            column("Available", "integer", ""), column("Age", "string", "")],
        "rows": [{"cells": [scale.pointer("/metadata/name"),
            scale.pointer("/spec/replicas").cloned().unwrap_or(json!(0)),
            scale.pointer("/status/replicas").cloned().unwrap_or(json!(0)), age],
            "object": object}]})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scale_is_made_from_its_parent() {
        let parent = json!({"metadata": {"name": "web", "namespace": "a", "uid": "u",
            "resourceVersion": "7", "creationTimestamp": "2024-01-01T00:00:00Z",
            "labels": {"x": "y"}, "generation": 2},
            "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web", "b": "c"},
                "matchExpressions": [{"key": "tier", "operator": "In", "values": ["z", "a"]}]}},
            "status": {"replicas": 2}});
        assert_eq!(
            scale_of(&parent).unwrap(),
            json!({"kind": "Scale", "apiVersion": "autoscaling/v1",
                "metadata": {"name": "web", "namespace": "a", "uid": "u", "resourceVersion": "7",
                    "creationTimestamp": "2024-01-01T00:00:00Z"},
                "spec": {"replicas": 3},
                "status": {"replicas": 2, "selector": "app=web,b=c,tier in (a,z)"}})
        );
        let zero = json!({"metadata": {"name": "w"}, "spec": {"replicas": 0, "selector": {}}});
        assert_eq!(
            scale_of(&zero).unwrap(),
            json!({"kind": "Scale", "apiVersion": "autoscaling/v1", "metadata": {"name": "w"},
                "spec": {}, "status": {"replicas": 0}})
        );
    }

    #[test]
    fn replicas_are_checked_like_validate_scale() {
        assert_eq!(replicas_of(&json!({"spec": {}}), "w").unwrap(), 0);
        assert_eq!(
            replicas_of(&json!({"spec": {"replicas": 4}}), "w").unwrap(),
            4
        );
        let e = replicas_of(&json!({"spec": {"replicas": -1}}), "w").unwrap_err();
        assert_eq!(e.code, 422);
        assert_eq!(
            e.message,
            "Scale.autoscaling \"w\" is invalid: spec.replicas: Invalid value: -1: must be greater than or equal to 0"
        );
        let e = replicas_of(&json!({"spec": {"replicas": "2"}}), "w").unwrap_err();
        assert_eq!(e.code, 400);
    }

    #[test]
    fn a_put_body_must_be_a_scale_of_the_object() {
        let mut ok = json!({"metadata": {"name": "w"}, "spec": {"replicas": 1}});
        check_identity(&mut ok, "a", "w").unwrap();
        assert_eq!(ok["kind"], "Scale");
        let mut other = json!({"metadata": {"name": "v"}});
        assert_eq!(check_identity(&mut other, "a", "w").unwrap_err().code, 400);
        let mut kind = json!({"kind": "Deployment", "apiVersion": "apps/v1"});
        assert_eq!(check_identity(&mut kind, "a", "w").unwrap_err().code, 400);
    }
}
