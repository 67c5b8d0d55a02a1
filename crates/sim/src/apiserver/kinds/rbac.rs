//! The behaviour of RBAC objects (roles, bindings) and of SubjectAccessReviews: the bootstrap
//! policy every cluster starts with, defaulting, validation as the real server's, and the
//! answers to reviews (decided by `rbac`).

use serde_json::{Value, json};

use crate::apiserver::rbac::{self, Action, GROUP, ResourceAttributes};
use crate::apiserver::resources::{ResId, ids};
use crate::apiserver::strategy::{Causes, NameRule, Strategy};
use crate::apiserver::{State, UserInfo};

/// The strategy of the four RBAC kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Rbac {
    /// Role (namespaced).
    Role,
    /// ClusterRole.
    ClusterRole,
    /// RoleBinding (namespaced).
    RoleBinding,
    /// ClusterRoleBinding.
    ClusterRoleBinding,
}

impl Rbac {
    fn is_binding(self) -> bool {
        matches!(self, Self::RoleBinding | Self::ClusterRoleBinding)
    }

    fn namespaced(self) -> bool {
        matches!(self, Self::Role | Self::RoleBinding)
    }
}

impl Strategy for Rbac {
    /// Roles and bindings only need names that are path segments (`system:discovery`).
    fn name_rule(&self) -> NameRule {
        NameRule::PathSegment
    }

    fn defaults(&self, obj: &mut Value) {
        if self.is_binding() {
            set_binding_defaults(obj);
        }
    }

    fn validate(&self, obj: &Value, old: Option<&Value>) -> Causes {
        if self.is_binding() {
            validate_binding(obj, old, self.namespaced())
        } else {
            validate_role(obj, self.namespaced())
        }
    }
}

/// The part of Kubernetes' bootstrap policy the sim keeps: `cluster-admin` (bound to
/// `system:masters`), and what every authenticated user may do: discovery and health URLs
/// (`system:discovery`, `system:public-info-viewer`) and reviews of itself
/// (`system:basic-user`). As (resource, object) pairs.
pub(crate) fn bootstrap_policy() -> Vec<(ResId, Value)> {
    let meta = |name: &str| {
        json!({"name": name, "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"},
            "annotations": {"rbac.authorization.kubernetes.io/autoupdate": "true"}})
    };
    let role = |name: &str, rules: Value| {
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": meta(name), "rules": rules})
    };
    let binding = |name: &str, groups: &[&str]| {
        let subjects: Vec<Value> = groups
            .iter()
            .map(|g| json!({"apiGroup": GROUP, "kind": "Group", "name": g}))
            .collect();
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": meta(name),
            "roleRef": {"apiGroup": GROUP, "kind": "ClusterRole", "name": name},
            "subjects": subjects})
    };
    let authenticated = "system:authenticated";
    vec![
        (
            *ids::CLUSTER_ROLES,
            role(
                "cluster-admin",
                json!([{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]},
                       {"nonResourceURLs": ["*"], "verbs": ["*"]}]),
            ),
        ),
        (
            *ids::CLUSTER_ROLE_BINDINGS,
            binding("cluster-admin", &[rbac::MASTERS]),
        ),
        (
            *ids::CLUSTER_ROLES,
            role(
                "system:discovery",
                json!([{"nonResourceURLs": ["/api", "/api/*", "/apis", "/apis/*", "/healthz",
                    "/livez", "/openapi", "/openapi/*", "/readyz", "/version", "/version/"],
                    "verbs": ["get"]}]),
            ),
        ),
        (
            *ids::CLUSTER_ROLE_BINDINGS,
            binding("system:discovery", &[authenticated]),
        ),
        (
            *ids::CLUSTER_ROLES,
            role(
                "system:public-info-viewer",
                json!([{"nonResourceURLs": ["/healthz", "/livez", "/readyz", "/version",
                    "/version/"], "verbs": ["get"]}]),
            ),
        ),
        (
            *ids::CLUSTER_ROLE_BINDINGS,
            binding(
                "system:public-info-viewer",
                &[authenticated, "system:unauthenticated"],
            ),
        ),
        (
            *ids::CLUSTER_ROLES,
            role(
                "system:basic-user",
                json!([{"apiGroups": ["authorization.k8s.io"],
                        "resources": ["selfsubjectaccessreviews", "selfsubjectrulesreviews"],
                        "verbs": ["create"]},
                       {"apiGroups": ["authentication.k8s.io"],
                        "resources": ["selfsubjectreviews"], "verbs": ["create"]}]),
            ),
        ),
        (
            *ids::CLUSTER_ROLE_BINDINGS,
            binding("system:basic-user", &[authenticated]),
        ),
    ]
}

/// v1 defaulting: a binding's `roleRef.apiGroup`, and the `apiGroup` of User and Group
/// subjects, default to `rbac.authorization.k8s.io`.
fn set_binding_defaults(obj: &mut Value) {
    if let Some(role_ref) = obj.get_mut("roleRef").and_then(Value::as_object_mut)
        && role_ref
            .get("apiGroup")
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
    {
        role_ref.insert("apiGroup".into(), json!(GROUP));
    }
    for s in obj
        .get_mut("subjects")
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
    {
        let kind = s.get("kind").and_then(Value::as_str).unwrap_or_default();
        let missing = s
            .get("apiGroup")
            .and_then(Value::as_str)
            .is_none_or(str::is_empty);
        if missing
            && matches!(kind, "User" | "Group")
            && let Some(m) = s.as_object_mut()
        {
            m.insert("apiGroup".into(), json!(GROUP));
        }
    }
}

/// Why a name cannot be an RBAC object's (`path.IsValidPathSegmentName`), if it cannot.
pub(crate) fn invalid_name(name: &str) -> Option<&'static str> {
    match name {
        "." => Some("may not be '.'"),
        ".." => Some("may not be '..'"),
        _ if name.contains('/') => Some("may not contain '/'"),
        _ if name.contains('%') => Some("may not contain '%'"),
        _ => None,
    }
}

fn strings(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|s| s.as_str().map(str::to_owned))
        .collect()
}

fn go_strings(values: &[String]) -> String {
    let quoted: Vec<String> = values.iter().map(|v| format!("{v:?}")).collect();
    format!("[]string{{{}}}", quoted.join(", "))
}

fn s<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or_default()
}

/// The validation causes (field, message) of an RBAC object, as the real server's
/// `ValidateRole`, `ValidateClusterRole`, `ValidateRoleBinding`, `ValidateClusterRoleBinding`
/// and their update variants (a binding's `roleRef` cannot change) report them.
fn validate_role(obj: &Value, namespaced: bool) -> Causes {
    let mut causes = Vec::new();
    for (i, rule) in obj
        .get("rules")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        let at = |f: &str| format!("rules[{i}].{f}");
        if strings(rule.get("verbs")).is_empty() {
            causes.push((
                at("verbs"),
                "Required value: verbs must contain at least one value".to_owned(),
            ));
        }
        let urls = strings(rule.get("nonResourceURLs"));
        let groups = strings(rule.get("apiGroups"));
        let resources = strings(rule.get("resources"));
        let names = strings(rule.get("resourceNames"));
        if !urls.is_empty() {
            if namespaced {
                causes.push((
                    at("nonResourceURLs"),
                    format!(
                        "Invalid value: {}: namespaced rules cannot apply to non-resource URLs",
                        go_strings(&urls)
                    ),
                ));
            }
            if !groups.is_empty() || !resources.is_empty() || !names.is_empty() {
                causes.push((
                    at("nonResourceURLs"),
                    format!(
                        "Invalid value: {}: rules cannot apply to both regular resources and non-resource URLs",
                        go_strings(&urls)
                    ),
                ));
            }
            continue;
        }
        if groups.is_empty() {
            causes.push((
                at("apiGroups"),
                "Required value: resource rules must supply at least one api group".to_owned(),
            ));
        }
        if resources.is_empty() {
            causes.push((
                at("resources"),
                "Required value: resource rules must supply at least one resource".to_owned(),
            ));
        }
        if !names.is_empty() && resources.len() > 1 {
            causes.push((
                at("resourceNames"),
                "Required value: resource names cannot apply to multiple resources".to_owned(),
            ));
        }
    }
    causes
}

/// `ValidateRoleBinding`, `ValidateClusterRoleBinding` and their update rule.
fn validate_binding(obj: &Value, old: Option<&Value>, namespaced: bool) -> Causes {
    let mut causes = Vec::new();
    let role_ref = obj.get("roleRef").cloned().unwrap_or_default();
    let api_group = s(&role_ref, "apiGroup");
    if api_group != GROUP {
        causes.push((
            "roleRef.apiGroup".to_owned(),
            format!("Unsupported value: {api_group:?}: supported values: \"{GROUP}\""),
        ));
    }
    let kind = s(&role_ref, "kind");
    match (kind, namespaced) {
        ("Role" | "ClusterRole", true) | ("ClusterRole", false) => {}
        (_, true) => causes.push((
            "roleRef.kind".to_owned(),
            format!("Unsupported value: {kind:?}: supported values: \"Role\", \"ClusterRole\""),
        )),
        (_, false) => causes.push((
            "roleRef.kind".to_owned(),
            format!("Unsupported value: {kind:?}: supported values: \"ClusterRole\""),
        )),
    }
    let name = s(&role_ref, "name");
    if name.is_empty() {
        causes.push(("roleRef.name".to_owned(), "Required value".to_owned()));
    } else if let Some(why) = invalid_name(name) {
        causes.push((
            "roleRef.name".to_owned(),
            format!("Invalid value: {name:?}: {why}"),
        ));
    }
    for (i, subject) in obj
        .get("subjects")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        let at = |f: &str| format!("subjects[{i}].{f}");
        let name = s(subject, "name");
        let group = s(subject, "apiGroup");
        if name.is_empty() {
            causes.push((at("name"), "Required value".to_owned()));
        }
        match s(subject, "kind") {
            "ServiceAccount" => {
                if !group.is_empty() {
                    causes.push((
                        at("apiGroup"),
                        format!("Unsupported value: {group:?}: supported values: \"\""),
                    ));
                }
                if !namespaced && s(subject, "namespace").is_empty() {
                    causes.push((at("namespace"), "Required value".to_owned()));
                }
            }
            "User" | "Group" => {
                if group != GROUP {
                    causes.push((
                        at("apiGroup"),
                        format!("Unsupported value: {group:?}: supported values: \"{GROUP}\""),
                    ));
                }
            }
            other => causes.push((
                at("kind"),
                format!(
                    "Unsupported value: {other:?}: supported values: \"ServiceAccount\", \"User\", \"Group\""
                ),
            )),
        }
    }
    if let Some(old) = old
        && old.get("roleRef") != obj.get("roleRef")
    {
        causes.push((
            "roleRef".to_owned(),
            format!(
                "Invalid value: {}: cannot change roleRef",
                serde_json::to_string(&role_ref).unwrap_or_default()
            ),
        ));
    }
    causes
}

/// The status of a SubjectAccessReview: the same decision a request of that user would get
/// (`system:masters` allowed, everyone else by RBAC).
pub(crate) fn review_status(state: &State, body: &Value) -> Value {
    let spec = body.get("spec").cloned().unwrap_or_default();
    let user = UserInfo {
        username: s(&spec, "user").to_owned(),
        uid: s(&spec, "uid").to_owned(),
        groups: strings(spec.get("groups")),
    };
    if user.username.is_empty() && user.groups.is_empty() {
        return json!({"allowed": false, "reason": "no user or group in the review"});
    }
    let action = match (
        spec.get("resourceAttributes"),
        spec.get("nonResourceAttributes"),
    ) {
        (Some(r), None) => Action::Resource(ResourceAttributes {
            verb: s(r, "verb").to_owned(),
            group: s(r, "group").to_owned(),
            version: s(r, "version").to_owned(),
            resource: s(r, "resource").to_owned(),
            subresource: s(r, "subresource").to_owned(),
            namespace: s(r, "namespace").to_owned(),
            name: s(r, "name").to_owned(),
        }),
        (None, Some(n)) => Action::NonResource {
            verb: s(n, "verb").to_owned(),
            path: s(n, "path").to_owned(),
        },
        _ => {
            return json!({"allowed": false,
                "reason": "exactly one of nonResourceAttributes or resourceAttributes must be specified"});
        }
    };
    let decision = state.authorize(&user, &action);
    let mut status = json!({"allowed": decision.allowed});
    if !decision.reason.is_empty() {
        status["reason"] = json!(decision.reason);
    }
    status
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bindings_default_their_groups_and_keep_their_role() {
        let mut b = json!({"roleRef": {"kind": "ClusterRole", "name": "view"},
            "subjects": [{"kind": "User", "name": "u"}, {"kind": "ServiceAccount", "name": "s"}]});
        Rbac::RoleBinding.defaults(&mut b);
        assert_eq!(b["roleRef"]["apiGroup"], GROUP);
        assert_eq!(b["subjects"][0]["apiGroup"], GROUP);
        assert!(b["subjects"][1].get("apiGroup").is_none());
        assert!(Rbac::RoleBinding.validate(&b, None).is_empty());
        // A cluster-wide binding of a ServiceAccount must name its namespace.
        assert_eq!(
            Rbac::ClusterRoleBinding.validate(&b, None)[0].0,
            "subjects[1].namespace"
        );
        let mut other = b.clone();
        other["roleRef"]["name"] = json!("edit");
        assert_eq!(Rbac::RoleBinding.validate(&other, Some(&b))[0].0, "roleRef");
    }

    #[test]
    fn role_rules_are_validated_like_the_real_servers() {
        let role = json!({"rules": [{"verbs": [], "apiGroups": [""], "resources": ["pods"]},
            {"verbs": ["get"], "nonResourceURLs": ["/healthz"]}]});
        let fields: Vec<String> = Rbac::Role
            .validate(&role, None)
            .into_iter()
            .map(|c| c.0)
            .collect();
        assert_eq!(fields, ["rules[0].verbs", "rules[1].nonResourceURLs"]);
        assert_eq!(Rbac::ClusterRole.validate(&role, None).len(), 1);
        assert_eq!(Rbac::Role.name_rule(), NameRule::PathSegment);
        assert_eq!(invalid_name("a/b"), Some("may not contain '/'"));
        assert_eq!(invalid_name("system:discovery"), None);
    }
}
