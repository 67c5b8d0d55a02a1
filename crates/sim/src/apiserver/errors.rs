//! API errors as the real API server reports them: a `metav1.Status` body with the reason and
//! code clients switch on (kube-rs `ErrorResponse`, client-go `StatusError`, kubectl output).

use serde_json::{Value, json};

/// An error answered as a `Status` object.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{code} {reason}: {message}")]
pub struct ApiError {
    /// HTTP status code.
    pub code: u16,
    /// `StatusReason` (`NotFound`, `AlreadyExists`, `Conflict`, `Invalid`, ...).
    pub reason: &'static str,
    /// Human-readable message, worded like the real server's.
    pub message: String,
    /// `details` (name, group, kind, causes), when the real server gives them.
    pub details: Option<Value>,
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    fn with_details(mut self, group: &str, kind: &str, name: &str) -> Self {
        let mut d = json!({"kind": kind});
        if !name.is_empty() {
            d["name"] = json!(name);
        }
        if !group.is_empty() {
            d["group"] = json!(group);
        }
        self.details = Some(d);
        self
    }

    /// `resource "name" not found`.
    pub fn not_found(group: &str, plural: &str, name: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", qualified(group, plural)),
        )
        .with_details(group, plural, name)
    }

    /// `resource "name" already exists`.
    pub fn already_exists(group: &str, plural: &str, name: &str) -> Self {
        Self::new(
            409,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", qualified(group, plural)),
        )
        .with_details(group, plural, name)
    }

    /// An optimistic-concurrency conflict.
    pub fn conflict(group: &str, plural: &str, name: &str, why: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": {why}",
                qualified(group, plural)
            ),
        )
        .with_details(group, plural, name)
    }

    /// A validation failure with field causes (`Kind "name" is invalid: field: reason`).
    pub fn invalid(group: &str, kind: &str, name: &str, causes: &[(String, String)]) -> Self {
        let text: Vec<String> = causes.iter().map(|(f, m)| format!("{f}: {m}")).collect();
        let causes: Vec<Value> = causes
            .iter()
            .map(|(f, m)| json!({"reason": cause_reason(m), "message": m, "field": f}))
            .collect();
        let mut e = Self::new(
            422,
            "Invalid",
            // Several causes are listed in brackets, as apimachinery's aggregate prints them.
            format!(
                "{kind}{} \"{name}\" is invalid: {}",
                group_suffix(group),
                match text.as_slice() {
                    [one] => one.clone(),
                    many => format!("[{}]", many.join(", ")),
                }
            ),
        )
        .with_details(group, kind, name);
        if let Some(d) = e.details.as_mut() {
            d["causes"] = Value::Array(causes);
        }
        e
    }

    /// A 422 without details, as the real server answers a failed JSON patch.
    pub fn generic_invalid() -> Self {
        Self::new(
            422,
            "Invalid",
            "the server rejected our request due to an error in our request",
        )
    }

    /// A request the server cannot decode or accept.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    /// Watch or list from a resourceVersion the server no longer has.
    pub fn expired(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    /// Authentication failed.
    pub fn unauthorized() -> Self {
        Self::new(401, "Unauthorized", "Unauthorized")
    }

    /// Authorization or admission refused the request.
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(403, "Forbidden", message)
    }

    /// The authorizer refused a request: `resource "name" is forbidden: <why>` (`forbidden:
    /// <why>` for a non-resource path), with the details the real server gives (`kind` is the
    /// resource).
    pub fn forbidden_request(group: &str, resource: &str, name: &str, why: &str) -> Self {
        let message = match (resource, name) {
            ("", _) => format!("forbidden: {why}"),
            (_, "") => format!("{} is forbidden: {why}", qualified(group, resource)),
            _ => format!(
                "{} {name:?} is forbidden: {why}",
                qualified(group, resource)
            ),
        };
        let mut e = Self::new(403, "Forbidden", message);
        let mut d = serde_json::Map::new();
        if !name.is_empty() {
            d.insert("name".into(), json!(name));
        }
        if !group.is_empty() {
            d.insert("group".into(), json!(group));
        }
        if !resource.is_empty() {
            d.insert("kind".into(), json!(resource));
        }
        e.details = Some(Value::Object(d));
        e
    }

    /// The verb is not served on this resource.
    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        Self::new(405, "MethodNotAllowed", message)
    }

    /// An eviction the pod's disruption budget does not allow now (429, with the budget's
    /// reason as a `DisruptionBudget` cause, as the real eviction REST handler answers).
    pub fn disruption_budget(cause: impl Into<String>) -> Self {
        let mut e = Self::new(
            429,
            "TooManyRequests",
            "Cannot evict pod as it would violate the pod's disruption budget.",
        );
        e.details =
            Some(json!({"causes": [{"reason": "DisruptionBudget", "message": cause.into()}]}));
        e
    }

    /// The body is over the limit.
    pub fn too_large(message: impl Into<String>) -> Self {
        Self::new(413, "RequestEntityTooLarge", message)
    }

    /// Unsupported content type.
    pub fn unsupported_media_type(content_type: &str) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/json, application/yaml, application/vnd.kubernetes.protobuf; got {content_type:?}"
            ),
        )
    }

    /// The server cannot do it right now.
    pub fn service_unavailable(message: impl Into<String>) -> Self {
        Self::new(503, "ServiceUnavailable", message)
    }

    /// Something went wrong inside.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(
            500,
            "InternalError",
            format!("Internal error occurred: {}", message.into()),
        )
    }

    /// A kubelet's error answer to `pods/log`, as the API server's response checker turns it
    /// into a Status (`GenericHttpResponseChecker`): a 400 keeps the kubelet's text as its
    /// message, a 500 is an internal error with it, anything else is apimachinery's
    /// `NewGenericServerResponse`, whose message is generic.
    pub fn from_kubelet_log(code: u16, body: &str, pod: &str) -> Self {
        match code {
            400 => return Self::bad_request(body),
            500 => return Self::internal(body),
            _ => {}
        }
        let (reason, message) = match code {
            404 => (
                "NotFound",
                "the server could not find the requested resource".to_owned(),
            ),
            401 => (
                "Unauthorized",
                "the server has asked for the client to provide credentials".to_owned(),
            ),
            403 => (
                "Forbidden",
                "the server does not allow access to the requested resource".to_owned(),
            ),
            503 => (
                "ServiceUnavailable",
                "the server is currently unable to handle the request".to_owned(),
            ),
            c if c >= 500 => (
                "InternalError",
                format!(
                    "an error on the server ({body:?}) has prevented the request from succeeding"
                ),
            ),
            c => (
                "",
                format!(
                    "the server responded with the status code {c} but did not return more information"
                ),
            ),
        };
        let mut e = Self::new(code, reason, format!("{message} ( pods/log {pod})"));
        e.details = Some(json!({"name": pod, "kind": "pods/log"}));
        e
    }

    /// A route with no resource behind it.
    pub fn no_route() -> Self {
        Self::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )
    }

    /// The `Status` object of this error.
    pub fn to_status(&self) -> Value {
        let mut s = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(d) = &self.details {
            s["details"] = d.clone();
        }
        s
    }
}

/// A field error's `reason`, from the words its message starts with (apimachinery's
/// `field.ErrorType` strings).
fn cause_reason(message: &str) -> &'static str {
    [
        ("Required value", "FieldValueRequired"),
        ("Unsupported value", "FieldValueNotSupported"),
        ("Forbidden", "FieldValueForbidden"),
        ("Duplicate value", "FieldValueDuplicate"),
        ("Too long", "FieldValueTooLong"),
        ("Too many", "FieldValueTooMany"),
        ("Not found", "FieldValueNotFound"),
    ]
    .iter()
    .find(|(prefix, _)| message.starts_with(prefix))
    .map_or("FieldValueInvalid", |(_, reason)| reason)
}

fn qualified(group: &str, plural: &str) -> String {
    if group.is_empty() {
        plural.to_owned()
    } else {
        format!("{plural}.{group}")
    }
}

fn group_suffix(group: &str) -> String {
    if group.is_empty() {
        String::new()
    } else {
        format!(".{group}")
    }
}

/// The `Status` of a successful delete where the server answers with a Status.
pub fn success_status(details: Value) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
        "details": details})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_match_the_real_server() {
        assert_eq!(
            ApiError::not_found("", "pods", "a").message,
            "pods \"a\" not found"
        );
        assert_eq!(
            ApiError::already_exists("apps", "deployments", "d").message,
            "deployments.apps \"d\" already exists"
        );
        let c = ApiError::conflict(
            "",
            "pods",
            "a",
            "the object has been modified; please apply your changes to the latest version and try again",
        );
        assert!(
            c.message
                .starts_with("Operation cannot be fulfilled on pods \"a\"")
        );
        let s = ApiError::invalid("", "Pod", "a", &[("spec".into(), "Forbidden: x".into())])
            .to_status();
        assert_eq!(s["code"], 422);
        assert_eq!(s["details"]["causes"][0]["field"], "spec");
    }
}
