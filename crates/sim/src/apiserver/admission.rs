//! Mutating admission webhooks, called as the real API server calls them: configurations in
//! name order, rules (operations, groups, versions, resources, scope), namespace and object
//! selectors, an HTTPS call verified against the webhook's `caBundle`, its JSONPatch applied,
//! `failurePolicy` honoured (Fail by default), denials reported with the webhook's name.

use std::collections::BTreeMap;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use serde_json::{Value, json};

use super::errors::ApiError;
use super::meta;
use super::resources::{ResourceType, ids};
use super::selectors::LabelSelector;
use super::store::ObjKey;
use super::{State, UserInfo};

/// Runs every matching mutating webhook on `obj` (`old` set for updates).
pub(super) async fn mutate(
    state: &State,
    rt: &ResourceType,
    mut obj: Value,
    old: Option<&Value>,
    user: &UserInfo,
) -> Result<Value, ApiError> {
    let (configs, _, _) = state
        .store
        .list(*ids::MUTATING_WEBHOOKS, None, None, None, |_| true);
    if configs.is_empty() {
        return Ok(obj);
    }
    let operation = if old.is_some() { "UPDATE" } else { "CREATE" };
    let namespace_labels = match meta::namespace(&obj) {
        Some(ns) if rt.namespaced => state
            .store
            .get(*ids::NAMESPACES, &ObjKey::new("", ns))
            .map(|n| meta::labels(&n.object))
            .unwrap_or_default(),
        _ => meta::labels(&obj),
    };
    for config in configs {
        for hook in config
            .object
            .get("webhooks")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if !rules_match(hook, rt, operation) {
                continue;
            }
            if (rt.namespaced || rt.plural == "namespaces")
                && !selector_matches(hook.get("namespaceSelector"), &namespace_labels)
            {
                continue;
            }
            let object_match = selector_matches(hook.get("objectSelector"), &meta::labels(&obj))
                || old.is_some_and(|o| {
                    selector_matches(hook.get("objectSelector"), &meta::labels(o))
                });
            if !object_match {
                continue;
            }
            let name = hook
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned();
            let fail_closed = hook.get("failurePolicy").and_then(Value::as_str) != Some("Ignore");
            match call(state, hook, rt, operation, &obj, old, user).await {
                Ok(response) => obj = apply_response(&name, rt, obj, &response)?,
                Err(e) if fail_closed => {
                    return Err(ApiError::internal(format!(
                        "failed calling webhook \"{name}\": {e}"
                    )));
                }
                Err(e) => {
                    tracing::warn!(webhook = %name, error = %e, "webhook failed, ignored by its failurePolicy")
                }
            }
        }
    }
    Ok(obj)
}

fn listed(list: Option<&Value>, want: &str) -> bool {
    list.and_then(Value::as_array)
        .is_some_and(|l| l.iter().any(|v| v == "*" || v == want))
}

fn rules_match(hook: &Value, rt: &ResourceType, operation: &str) -> bool {
    hook.get("rules")
        .and_then(Value::as_array)
        .is_some_and(|rules| {
            rules.iter().any(|r| {
                let scope = r.get("scope").and_then(Value::as_str).unwrap_or("*");
                let scope_ok = match scope {
                    "Namespaced" => rt.namespaced,
                    "Cluster" => !rt.namespaced,
                    _ => true,
                };
                scope_ok
                    && listed(r.get("operations"), operation)
                    && listed(r.get("apiGroups"), rt.group)
                    && listed(r.get("apiVersions"), rt.version)
                    && listed(r.get("resources"), rt.plural)
            })
        })
}

/// A `metav1.LabelSelector`; absent matches all. A selector that does not parse matches
/// nothing (the configuration is wrong; better to skip the webhook than to call it for all).
fn selector_matches(selector: Option<&Value>, labels: &BTreeMap<String, String>) -> bool {
    let Some(sel) = selector.filter(|s| !s.is_null()) else {
        return true;
    };
    LabelSelector::from_label_selector(sel).is_ok_and(|s| s.matches(labels))
}

async fn call(
    state: &State,
    hook: &Value,
    rt: &ResourceType,
    operation: &str,
    obj: &Value,
    old: Option<&Value>,
    user: &UserInfo,
) -> Result<Value, String> {
    let uid = meta::new_uid();
    let kind = json!({"group": rt.group, "version": rt.version, "kind": rt.kind});
    let resource = json!({"group": rt.group, "version": rt.version, "resource": rt.plural});
    let review = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": uid, "kind": kind, "resource": resource, "requestKind": kind, "requestResource": resource,
        "name": meta::name(obj), "namespace": meta::namespace(obj), "operation": operation,
        "userInfo": {"username": user.username, "uid": user.uid, "groups": user.groups},
        "object": obj, "oldObject": old, "dryRun": false,
        "options": {"apiVersion": "meta.k8s.io/v1", "kind": if old.is_some() { "UpdateOptions" } else { "CreateOptions" }}
    }});
    let client = hook
        .get("clientConfig")
        .ok_or("webhook has no clientConfig")?;
    let (url, server_name) = target(state, client)?;
    let ca = client
        .get("caBundle")
        .and_then(Value::as_str)
        .map(|b| {
            B64.decode(b)
                .map_err(|e| format!("caBundle is not base64: {e}"))
        })
        .transpose()?
        .map(|b| String::from_utf8_lossy(&b).into_owned());
    let timeout = hook
        .get("timeoutSeconds")
        .and_then(Value::as_u64)
        .unwrap_or(10)
        .clamp(1, 30);
    let body = serde_json::to_vec(&review).map_err(|e| e.to_string())?;
    let reply = tokio::time::timeout(
        Duration::from_secs(timeout),
        state
            .webhook_connections
            .post_json(&url, &server_name, ca.as_deref(), None, body, false),
    )
    .await
    .map_err(|_| format!("Post \"{url}\": context deadline exceeded"))??;
    let reply: Value = serde_json::from_slice(&reply)
        .map_err(|e| format!("the webhook's answer is not JSON: {e}"))?;
    let response = reply
        .get("response")
        .cloned()
        .ok_or("the webhook's answer has no response")?;
    if response.get("uid").and_then(Value::as_str) != Some(uid.as_str()) {
        return Err(format!(
            "expected response.uid=\"{uid}\", got {:?}",
            response.get("uid")
        ));
    }
    Ok(response)
}

/// Where to call: a `url`, or a Service resolved through its Endpoints (this simulated
/// cluster has no service network), verified as `<service>.<namespace>.svc`.
fn target(state: &State, client: &Value) -> Result<(String, String), String> {
    if let Some(url) = client.get("url").and_then(Value::as_str) {
        let uri: http::Uri = url
            .parse()
            .map_err(|e| format!("invalid webhook url {url:?}: {e}"))?;
        let host = uri
            .host()
            .ok_or("webhook url has no host")?
            .trim_matches(['[', ']'])
            .to_owned();
        return Ok((url.to_owned(), host));
    }
    let svc = client
        .get("service")
        .ok_or("webhook clientConfig has neither url nor service")?;
    let ns = svc
        .get("namespace")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let name = svc.get("name").and_then(Value::as_str).unwrap_or_default();
    let port = svc.get("port").and_then(Value::as_i64).unwrap_or(443);
    let path = svc.get("path").and_then(Value::as_str).unwrap_or("/");
    let service = state
        .store
        .get(*ids::SERVICES, &ObjKey::new(ns, name))
        .ok_or_else(|| format!("service \"{ns}/{name}\" not found"))?;
    let target_port = service
        .object
        .pointer("/spec/ports")
        .and_then(Value::as_array)
        .and_then(|ports| {
            ports
                .iter()
                .find(|p| p.get("port").and_then(Value::as_i64) == Some(port))
        })
        .and_then(|p| p.get("targetPort").and_then(Value::as_i64))
        .unwrap_or(port);
    let endpoints = state
        .store
        .get(*ids::ENDPOINTS, &ObjKey::new(ns, name))
        .ok_or_else(|| format!("service \"{ns}/{name}\" has no endpoints"))?;
    let ip = endpoints
        .object
        .pointer("/subsets/0/addresses/0/ip")
        .and_then(Value::as_str)
        .ok_or_else(|| format!("service \"{ns}/{name}\" has no ready endpoints"))?;
    let ep_port = endpoints
        .object
        .pointer("/subsets/0/ports/0/port")
        .and_then(Value::as_i64)
        .unwrap_or(target_port);
    Ok((
        format!("https://{ip}:{ep_port}{path}"),
        format!("{name}.{ns}.svc"),
    ))
}

fn apply_response(
    name: &str,
    rt: &ResourceType,
    obj: Value,
    response: &Value,
) -> Result<Value, ApiError> {
    if response.get("allowed").and_then(Value::as_bool) != Some(true) {
        let status = response.get("status");
        let message = status
            .and_then(|s| s.get("message"))
            .and_then(Value::as_str)
            .unwrap_or("without explanation");
        let code = status
            .and_then(|s| s.get("code"))
            .and_then(Value::as_u64)
            .and_then(|c| u16::try_from(c).ok())
            .filter(|c| *c >= 400)
            .unwrap_or(400);
        let mut e = ApiError::bad_request(format!(
            "admission webhook \"{name}\" denied the request: {message}"
        ));
        e.code = code;
        if code == 403 {
            e.reason = "Forbidden";
        }
        return Err(e);
    }
    let Some(patch) = response.get("patch").and_then(Value::as_str) else {
        return Ok(obj);
    };
    if response
        .get("patchType")
        .and_then(Value::as_str)
        .is_some_and(|t| t != "JSONPatch")
    {
        return Err(ApiError::internal(format!(
            "webhook \"{name}\" returned an unsupported patchType"
        )));
    }
    let raw = B64.decode(patch).map_err(|e| {
        ApiError::internal(format!(
            "webhook \"{name}\" returned a patch that is not base64: {e}"
        ))
    })?;
    let ops: json_patch::Patch = serde_json::from_slice(&raw).map_err(|e| {
        ApiError::internal(format!(
            "webhook \"{name}\" returned an invalid JSONPatch: {e}"
        ))
    })?;
    let mut patched = obj;
    super::patch::json_patch_ops(&mut patched, &ops).map_err(|e| {
        ApiError::internal(format!(
            "webhook \"{name}\" returned a patch that does not apply: {e}"
        ))
    })?;
    (rt.normalize)(patched).map_err(|e| {
        ApiError::internal(format!(
            "webhook \"{name}\" produced an invalid {}: {e}",
            rt.kind
        ))
    })
}
