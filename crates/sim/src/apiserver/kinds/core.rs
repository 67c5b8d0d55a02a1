//! The core kinds with small behaviour of their own: Secrets (`stringData` folded into
//! `data`), Endpoints (port defaults), core Events (reporter defaults, `legacyValidateEvent`,
//! created even in a terminating namespace), ServiceAccounts (the `token` subresource),
//! Leases (no unconditional update) and EndpointSlices (a generation without a spec).

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde_json::{Value, json};

use super::set_default;
use crate::apiserver::State;
use crate::apiserver::errors::ApiError;
use crate::apiserver::meta;
use crate::apiserver::resources::ids;
use crate::apiserver::store::ObjKey;
use crate::apiserver::strategy::{Causes, Strategy, SubresourceCall};

/// The strategy of secrets.
#[derive(Debug)]
pub(crate) struct Secrets;

impl Strategy for Secrets {
    fn prepare_create(&self, _state: &State, obj: &mut Value) -> Result<(), ApiError> {
        set_default(obj, "type", json!("Opaque"));
        fold_string_data(obj);
        Ok(())
    }

    fn prepare_update(&self, new: &mut Value, _old: &Value) {
        fold_string_data(new);
    }
}

/// The strategy of endpoints: ports are TCP unless said (on every decode).
#[derive(Debug)]
pub(crate) struct Endpoints;

impl Strategy for Endpoints {
    fn defaults(&self, obj: &mut Value) {
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
}

/// The strategy of core (`v1`) events.
#[derive(Debug)]
pub(crate) struct Events;

impl Strategy for Events {
    fn created_in_terminating_namespace(&self) -> bool {
        true
    }

    /// A core Event always has its (possibly empty) reporter.
    fn defaults(&self, obj: &mut Value) {
        set_default(obj, "reportingComponent", json!(""));
        set_default(obj, "reportingInstance", json!(""));
    }

    fn validate(&self, obj: &Value, _old: Option<&Value>) -> Causes {
        event_causes(obj)
    }

    fn field_value(&self, obj: &Value, field: &str) -> String {
        let field = if field == "source" {
            "source.component"
        } else {
            field
        };
        meta::path_str(obj, field).unwrap_or_default()
    }
}

/// The strategy of `events.k8s.io` events: created even in a terminating namespace.
#[derive(Debug)]
pub(crate) struct EventsV1;

impl Strategy for EventsV1 {
    fn created_in_terminating_namespace(&self) -> bool {
        true
    }
}

/// The strategy of service accounts: the `token` subresource.
#[derive(Debug)]
pub(crate) struct ServiceAccounts;

impl Strategy for ServiceAccounts {
    fn subresource(
        &self,
        state: &State,
        call: &SubresourceCall<'_>,
        body: Value,
    ) -> Option<Result<(u16, Value), ApiError>> {
        (call.sub == "token" && call.method == http::Method::POST)
            .then(|| token_request(state, call.namespace, call.name, body))
    }
}

/// The strategy of leases: an update must name the resourceVersion (the real server's
/// `AllowUnconditionalUpdate` is false for them), so a lease is only taken knowingly.
#[derive(Debug)]
pub(crate) struct Leases;

impl Strategy for Leases {
    fn unconditional_update(&self) -> bool {
        false
    }
}

/// The strategy of endpoint slices: a generation that moves with the endpoints, ports or
/// address type (they have no spec).
#[derive(Debug)]
pub(crate) struct EndpointSlices;

impl Strategy for EndpointSlices {
    fn tracks_generation(&self) -> bool {
        true
    }

    fn generation_moves(&self, new: &Value, old: &Value) -> bool {
        ["endpoints", "ports", "addressType"]
            .iter()
            .any(|k| new.get(*k) != old.get(*k))
    }
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

/// `spec.audiences` of a TokenRequest or TokenReview (absent: none).
pub(crate) fn spec_audiences(body: &Value) -> Vec<String> {
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
        audiences.push(crate::apiserver::API_AUDIENCE.to_owned());
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
    let lifetime = if bound_pod.is_some()
        && seconds == EXTENDED_FROM
        && audiences == [crate::apiserver::API_AUDIENCE]
    {
        EXTENDED_TO
    } else {
        seconds
    };
    let expires = Timestamp::now()
        .checked_add(SignedDuration::from_secs(lifetime))
        .unwrap_or_else(|_| Timestamp::now());
    let token = state.issue_bound_token(
        crate::apiserver::service_account_user(ns, sa, uid),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secrets_string_data_is_folded_into_data() {
        let state = State::for_tests();
        let mut secret = json!({"metadata": {"name": "s"}, "data": {"a": "eA=="},
            "stringData": {"b": "hi"}});
        Secrets.prepare_create(&state, &mut secret).unwrap();
        assert_eq!(
            secret,
            json!({"metadata": {"name": "s"}, "type": "Opaque",
            "data": {"a": "eA==", "b": "aGk="}})
        );
        let mut update = json!({"stringData": {"a": "y"}});
        Secrets.prepare_update(&mut update, &secret);
        assert_eq!(update, json!({"data": {"a": "eQ=="}}));
    }

    #[test]
    fn endpoint_ports_default_to_tcp() {
        let mut ep =
            json!({"subsets": [{"ports": [{"port": 80}, {"port": 53, "protocol": "UDP"}]}]});
        Endpoints.defaults(&mut ep);
        assert_eq!(ep["subsets"][0]["ports"][0]["protocol"], "TCP");
        assert_eq!(ep["subsets"][0]["ports"][1]["protocol"], "UDP");
    }

    #[test]
    fn events_name_their_reporter_and_agree_on_the_namespace() {
        let mut ev = json!({"metadata": {"name": "e", "namespace": "a"},
            "involvedObject": {"namespace": "b"}, "source": {"component": "kubelet"}});
        Events.defaults(&mut ev);
        assert_eq!(ev["reportingComponent"], "");
        assert_eq!(Events.validate(&ev, None)[0].0, "involvedObject.namespace");
        ev["eventTime"] = json!("2026-01-01T00:00:00.000000Z");
        ev["involvedObject"]["namespace"] = json!("a");
        let fields: Vec<String> = Events
            .validate(&ev, None)
            .into_iter()
            .map(|c| c.0)
            .collect();
        assert_eq!(
            fields,
            ["reportingComponent", "reportingInstance", "action", "type"]
        );
        assert_eq!(Events.field_value(&ev, "source"), "kubelet");
        assert!(Events.created_in_terminating_namespace());
        assert!(EventsV1.created_in_terminating_namespace());
    }

    #[test]
    fn leases_need_a_resource_version_and_slices_count_generations() {
        assert!(!Leases.unconditional_update());
        assert!(EndpointSlices.tracks_generation());
        let old = json!({"endpoints": [], "metadata": {"labels": {"a": "b"}}});
        assert!(!EndpointSlices.generation_moves(&json!({"endpoints": []}), &old));
        assert!(EndpointSlices.generation_moves(&json!({"endpoints": [{}]}), &old));
    }

    #[test]
    fn a_token_request_is_refused_below_ten_minutes_and_for_unknown_accounts() {
        let state = State::for_tests();
        let short = json!({"spec": {"expirationSeconds": 60}});
        assert_eq!(
            token_request(&state, "default", "default", short)
                .unwrap_err()
                .code,
            422
        );
        let e = token_request(&state, "default", "nobody", json!({"spec": {}})).unwrap_err();
        assert_eq!(e.code, 404);
        let (code, answer) =
            token_request(&state, "default", "default", json!({"spec": {}})).unwrap();
        assert_eq!(code, 201);
        let token = answer["status"]["token"].as_str().unwrap();
        let user = state.user_for_token(token).unwrap();
        assert_eq!(user.username, "system:serviceaccount:default:default");
    }
}
