//! Role-based access control, decided like Kubernetes' RBAC authorizer.
//!
//! Pure functions of values: what a request asks ([`request_attributes`], the API server's
//! `RequestInfo`), the stored roles and bindings ([`Policy`]) and the user; no store, no I/O.
//!
//! The rules, as the real authorizer applies them:
//!
//! - members of `system:masters` may do everything (the privileged-group authorizer that runs
//!   before RBAC), whatever the policy says;
//! - a ClusterRoleBinding grants its ClusterRole's rules everywhere; a RoleBinding grants the
//!   rules of a Role of its own namespace, or of a ClusterRole, in its namespace only;
//! - subjects: `User` (the user name), `Group` (one of the user's groups), `ServiceAccount`
//!   (user `system:serviceaccount:<namespace>:<name>`, the namespace defaulting to the
//!   RoleBinding's own; a ClusterRoleBinding's must name one);
//! - a rule allows a request when verb, API group, resource (`pods`, `pods/log`, `*`,
//!   `*/scale`) and resource name all match; a rule naming `resourceNames` allows only requests
//!   that carry one of those names (so never `create`, or a `list` without a
//!   `metadata.name=` field selector); non-resource URLs match exactly or by a trailing `*`;
//! - a binding whose role does not exist grants nothing; the denial's reason says so.
//!
//! Aggregated ClusterRoles are not aggregated: their `aggregationRule` is ignored and only
//! their own `rules` count.

use std::collections::HashMap;
use std::fmt;

use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject,
};

use super::selectors::FieldSelector;

/// The group whose members are always allowed.
pub const MASTERS: &str = "system:masters";

/// The API group of RBAC objects.
pub const GROUP: &str = "rbac.authorization.k8s.io";

/// What a request asks to do: the attributes an authorizer decides on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// A request on an API resource (or subresource).
    Resource(ResourceAttributes),
    /// Any other path (`/api`, `/healthz`, `/openapi/v3`, ...).
    NonResource {
        /// The lowercase HTTP method (`get`, `post`, ...).
        verb: String,
        /// The URL path.
        path: String,
    },
}

/// The attributes of a resource request; empty strings where a request has none.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResourceAttributes {
    /// `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`, `deletecollection`, or a
    /// special verb (`proxy`).
    pub verb: String,
    /// API group, empty for the core group.
    pub group: String,
    /// API version.
    pub version: String,
    /// Resource (plural).
    pub resource: String,
    /// Subresource (`status`, `log`, `exec`, ...).
    pub subresource: String,
    /// Namespace; for a Namespace object, its own name.
    pub namespace: String,
    /// Object name: from the path, or from a `metadata.name=` field selector of a list or
    /// watch.
    pub name: String,
}

impl ResourceAttributes {
    /// `resource` or `resource/subresource`, as RBAC rules name them.
    pub fn combined_resource(&self) -> String {
        if self.subresource.is_empty() {
            self.resource.clone()
        } else {
            format!("{}/{}", self.resource, self.subresource)
        }
    }
}

impl Action {
    /// The verb.
    pub fn verb(&self) -> &str {
        match self {
            Self::Resource(r) => &r.verb,
            Self::NonResource { verb, .. } => verb,
        }
    }

    /// The namespace the request is in (empty for cluster-scoped and non-resource requests).
    pub fn namespace(&self) -> &str {
        match self {
            Self::Resource(r) => &r.namespace,
            Self::NonResource { .. } => "",
        }
    }
}

/// Whether a name may be a path segment (`path.IsValidPathSegmentName`).
pub fn is_valid_path_segment_name(name: &str) -> bool {
    name != "." && name != ".." && !name.contains('/') && !name.contains('%')
}

/// The attributes of an HTTP request, as the API server's `RequestInfo` resolver derives them:
/// paths under `/api/{version}` and `/apis/{group}/{version}` with at least a resource are
/// resource requests, everything else is a non-resource request with the lowercase method as
/// verb. Verbs follow the method (POST create, GET/HEAD get, PUT update, PATCH patch, DELETE
/// delete) for objects and subresources alike; GET without a name is `list`, or `watch` with
/// `watch=true` (any value but `false`, `0` or empty); DELETE without a name is
/// `deletecollection`; the `/watch/` and `/proxy/` path prefixes are verbs of their own.
pub fn request_attributes(method: &str, path: &str, query: Option<&str>) -> Action {
    let non_resource = || Action::NonResource {
        verb: method.to_ascii_lowercase(),
        path: path.to_owned(),
    };
    let trimmed = path.trim_matches('/');
    let parts: Vec<&str> = if trimmed.is_empty() {
        Vec::new()
    } else {
        trimmed.split('/').collect()
    };
    if parts.len() < 3 {
        return non_resource();
    }
    let (group, rest) = match parts.as_slice() {
        ["api", rest @ ..] => ("", rest),
        ["apis", group, rest @ ..] if rest.len() >= 2 => (*group, rest),
        _ => return non_resource(),
    };
    let [version, rest @ ..] = rest else {
        return non_resource();
    };
    let mut attrs = ResourceAttributes {
        group: group.to_owned(),
        version: (*version).to_owned(),
        ..ResourceAttributes::default()
    };
    let mut rest: &[&str] = rest;
    match rest {
        [special @ ("proxy" | "watch"), tail @ ..] => {
            attrs.verb = (*special).to_owned();
            rest = tail;
        }
        _ => {
            attrs.verb = match method.to_ascii_uppercase().as_str() {
                "POST" => "create",
                "GET" | "HEAD" => "get",
                "PUT" => "update",
                "PATCH" => "patch",
                "DELETE" => "delete",
                _ => "",
            }
            .to_owned();
        }
    }
    if let ["namespaces", ns, tail @ ..] = rest {
        attrs.namespace = (*ns).to_owned();
        // `namespaces/{ns}/status|finalize` are the Namespace's own subresources.
        if !tail.is_empty() && !matches!(tail[0], "status" | "finalize") {
            rest = tail;
        }
    }
    if let Some(resource) = rest.first() {
        attrs.resource = (*resource).to_owned();
    }
    if let Some(name) = rest.get(1) {
        attrs.name = (*name).to_owned();
    }
    if let Some(sub) = rest.get(2)
        && attrs.verb != "proxy"
    {
        attrs.subresource = (*sub).to_owned();
    }
    if attrs.name.is_empty() && attrs.verb == "get" {
        let query: Vec<(String, String)> =
            form_urlencoded::parse(query.unwrap_or_default().as_bytes())
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect();
        let first = |key: &str| {
            query
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.as_str())
        };
        let watch = first("watch")
            .is_some_and(|v| !(v.is_empty() || v == "0" || v.eq_ignore_ascii_case("false")));
        attrs.verb = if watch { "watch" } else { "list" }.to_owned();
        if let Some(selector) = first("fieldSelector")
            && let Ok(selector) = FieldSelector::parse(selector)
            && let Some(name) = selector.requires_exact_match("metadata.name")
            && is_valid_path_segment_name(name)
        {
            attrs.name = name.to_owned();
        }
    }
    if attrs.name.is_empty() && attrs.verb == "delete" {
        attrs.verb = "deletecollection".to_owned();
    }
    Action::Resource(attrs)
}

/// The user name of a service account.
pub fn service_account_username(namespace: &str, name: &str) -> String {
    format!("system:serviceaccount:{namespace}:{name}")
}

/// Whether the groups include `system:masters`.
pub fn is_privileged(groups: &[String]) -> bool {
    groups.iter().any(|g| g == MASTERS)
}

/// An authorization decision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    /// Allowed or not.
    pub allowed: bool,
    /// Why, worded like the real authorizer (`RBAC: allowed by ClusterRoleBinding "x" of
    /// ClusterRole "y" to User "u"`); for a denial, the roles that bindings name but that do not
    /// exist, if any, else empty.
    pub reason: String,
}

/// The stored roles and bindings, indexed for evaluation.
#[derive(Clone, Debug, Default)]
pub struct Policy {
    cluster_roles: HashMap<String, Vec<PolicyRule>>,
    roles: HashMap<(String, String), Vec<PolicyRule>>,
    cluster_role_bindings: Vec<ClusterRoleBinding>,
    role_bindings: HashMap<String, Vec<RoleBinding>>,
}

fn name_of(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> String {
    meta.name.clone().unwrap_or_default()
}

fn namespace_of(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> String {
    meta.namespace.clone().unwrap_or_default()
}

impl Policy {
    /// A policy of these objects (bindings are visited in the order given).
    pub fn new(
        roles: impl IntoIterator<Item = Role>,
        cluster_roles: impl IntoIterator<Item = ClusterRole>,
        role_bindings: impl IntoIterator<Item = RoleBinding>,
        cluster_role_bindings: impl IntoIterator<Item = ClusterRoleBinding>,
    ) -> Self {
        let mut policy = Self {
            cluster_roles: cluster_roles
                .into_iter()
                .map(|r| (name_of(&r.metadata), r.rules.unwrap_or_default()))
                .collect(),
            roles: roles
                .into_iter()
                .map(|r| {
                    (
                        (namespace_of(&r.metadata), name_of(&r.metadata)),
                        r.rules.unwrap_or_default(),
                    )
                })
                .collect(),
            cluster_role_bindings: cluster_role_bindings.into_iter().collect(),
            role_bindings: HashMap::new(),
        };
        for b in role_bindings {
            policy
                .role_bindings
                .entry(namespace_of(&b.metadata))
                .or_default()
                .push(b);
        }
        policy
    }

    /// The rules a binding's role reference stands for (`namespace` is the RoleBinding's, empty
    /// for a ClusterRoleBinding), or the real authorizer's error text.
    fn role_rules(&self, role_ref: &RoleRef, namespace: &str) -> Result<&[PolicyRule], String> {
        match role_ref.kind.as_str() {
            "Role" if !namespace.is_empty() => self
                .roles
                .get(&(namespace.to_owned(), role_ref.name.clone()))
                .map(Vec::as_slice)
                .ok_or_else(|| format!("role.{GROUP} {:?} not found", role_ref.name)),
            "Role" => Err("must provide namespace when getting role".to_owned()),
            "ClusterRole" => self
                .cluster_roles
                .get(&role_ref.name)
                .map(Vec::as_slice)
                .ok_or_else(|| format!("clusterrole.{GROUP} {:?} not found", role_ref.name)),
            other => Err(format!("unsupported role reference kind: {other:?}")),
        }
    }

    /// Decides a request of a user (name and groups), like the privileged-group and RBAC
    /// authorizers of a real API server together.
    pub fn authorize(&self, user: &str, groups: &[String], action: &Action) -> Decision {
        if is_privileged(groups) {
            return Decision {
                allowed: true,
                reason: String::new(),
            };
        }
        let mut errors: Vec<String> = Vec::new();
        for b in &self.cluster_role_bindings {
            let Some(subject) = applies_to(user, groups, b.subjects.as_deref(), "") else {
                continue;
            };
            match self.role_rules(&b.role_ref, "") {
                Ok(rules) => {
                    if rules.iter().any(|r| rule_allows(action, r)) {
                        return Decision {
                            allowed: true,
                            reason: format!(
                                "RBAC: allowed by ClusterRoleBinding {:?} of {} {:?} to {}",
                                name_of(&b.metadata),
                                b.role_ref.kind,
                                b.role_ref.name,
                                describe_subject(subject, "")
                            ),
                        };
                    }
                }
                Err(e) => errors.push(e),
            }
        }
        let namespace = action.namespace();
        if !namespace.is_empty() {
            for b in self.role_bindings.get(namespace).into_iter().flatten() {
                let Some(subject) = applies_to(user, groups, b.subjects.as_deref(), namespace)
                else {
                    continue;
                };
                match self.role_rules(&b.role_ref, namespace) {
                    Ok(rules) => {
                        if rules.iter().any(|r| rule_allows(action, r)) {
                            return Decision {
                                allowed: true,
                                reason: format!(
                                    "RBAC: allowed by RoleBinding {:?} of {} {:?} to {}",
                                    format!("{}/{namespace}", name_of(&b.metadata)),
                                    b.role_ref.kind,
                                    b.role_ref.name,
                                    describe_subject(subject, namespace)
                                ),
                            };
                        }
                    }
                    Err(e) => errors.push(e),
                }
            }
        }
        let mut distinct: Vec<String> = Vec::new();
        for e in errors {
            if !distinct.contains(&e) {
                distinct.push(e);
            }
        }
        let reason = match distinct.as_slice() {
            [] => String::new(),
            [one] => format!("RBAC: {one}"),
            many => format!("RBAC: [{}]", many.join(", ")),
        };
        Decision {
            allowed: false,
            reason,
        }
    }
}

fn describe_subject(s: &Subject, binding_namespace: &str) -> String {
    match s.kind.as_str() {
        "ServiceAccount" => {
            let ns = s
                .namespace
                .as_deref()
                .filter(|n| !n.is_empty())
                .unwrap_or(binding_namespace);
            format!("{} {:?}", s.kind, format!("{}/{ns}", s.name))
        }
        _ => format!("{} {:?}", s.kind, s.name),
    }
}

/// The first subject of a binding that is this user; `namespace` is the RoleBinding's (the
/// default namespace of ServiceAccount subjects), empty for a ClusterRoleBinding.
fn applies_to<'a>(
    user: &str,
    groups: &[String],
    subjects: Option<&'a [Subject]>,
    namespace: &str,
) -> Option<&'a Subject> {
    subjects?
        .iter()
        .find(|s| subject_matches(user, groups, s, namespace))
}

fn subject_matches(user: &str, groups: &[String], subject: &Subject, namespace: &str) -> bool {
    match subject.kind.as_str() {
        "User" => subject.name == user,
        "Group" => groups.contains(&subject.name),
        "ServiceAccount" => {
            let ns = subject
                .namespace
                .as_deref()
                .filter(|n| !n.is_empty())
                .unwrap_or(namespace);
            !ns.is_empty() && user == service_account_username(ns, &subject.name)
        }
        _ => false,
    }
}

/// Whether one rule allows the request.
pub fn rule_allows(action: &Action, rule: &PolicyRule) -> bool {
    if !verb_matches(rule, action.verb()) {
        return false;
    }
    match action {
        Action::Resource(r) => {
            api_group_matches(rule, &r.group)
                && resource_matches(rule, &r.combined_resource(), &r.subresource)
                && resource_name_matches(rule, &r.name)
        }
        Action::NonResource { path, .. } => non_resource_url_matches(rule, path),
    }
}

fn verb_matches(rule: &PolicyRule, verb: &str) -> bool {
    rule.verbs.iter().any(|v| v == "*" || v == verb)
}

fn api_group_matches(rule: &PolicyRule, group: &str) -> bool {
    rule.api_groups
        .iter()
        .flatten()
        .any(|g| g == "*" || g == group)
}

fn resource_matches(rule: &PolicyRule, combined: &str, subresource: &str) -> bool {
    rule.resources.iter().flatten().any(|r| {
        r == "*"
            || r == combined
            || (!subresource.is_empty() && r.strip_prefix("*/") == Some(subresource))
    })
}

fn resource_name_matches(rule: &PolicyRule, name: &str) -> bool {
    match rule.resource_names.as_deref() {
        None | Some([]) => true,
        Some(names) => names.iter().any(|n| n == name),
    }
}

fn non_resource_url_matches(rule: &PolicyRule, path: &str) -> bool {
    rule.non_resource_urls.iter().flatten().any(|u| {
        u == "*" || u == path || (u.ends_with('*') && path.starts_with(u.trim_end_matches('*')))
    })
}

/// The text of a denial, as the real API server words it (`User "u" cannot get resource
/// "pods" in API group "" in the namespace "default"`).
pub fn forbidden_message(user: &str, action: &Action) -> String {
    match action {
        Action::NonResource { verb, path } => {
            format!("User {user:?} cannot {verb} path {path:?}")
        }
        Action::Resource(r) if r.namespace.is_empty() => format!(
            "User {user:?} cannot {} resource {:?} in API group {:?} at the cluster scope",
            r.verb,
            r.combined_resource(),
            r.group
        ),
        Action::Resource(r) => format!(
            "User {user:?} cannot {} resource {:?} in API group {:?} in the namespace {:?}",
            r.verb,
            r.combined_resource(),
            r.group,
            r.namespace
        ),
    }
}

/// A request the authorizer refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Denial {
    /// User name.
    pub user: String,
    /// The user's groups.
    pub groups: Vec<String>,
    /// The verb (`get`, `list`, `watch`, `create`, ...; the lowercase method for non-resource
    /// requests).
    pub verb: String,
    /// API group (empty for the core group and non-resource requests).
    pub group: String,
    /// Resource, with the subresource as RBAC names it (`pods/exec`); empty for a
    /// non-resource request.
    pub resource: String,
    /// Namespace, empty at the cluster scope.
    pub namespace: String,
    /// Object name, empty when the request has none.
    pub name: String,
    /// The URL path.
    pub path: String,
    /// The authorizer's reason (missing roles), usually empty.
    pub reason: String,
}

impl Denial {
    /// The denial of an action.
    pub fn new(user: &str, groups: &[String], action: &Action, path: &str, reason: &str) -> Self {
        let (verb, group, resource, namespace, name) = match action {
            Action::Resource(r) => (
                r.verb.clone(),
                r.group.clone(),
                r.combined_resource(),
                r.namespace.clone(),
                r.name.clone(),
            ),
            Action::NonResource { verb, .. } => (
                verb.clone(),
                String::new(),
                String::new(),
                String::new(),
                String::new(),
            ),
        };
        Self {
            user: user.to_owned(),
            groups: groups.to_vec(),
            verb,
            group,
            resource,
            namespace,
            name,
            path: path.to_owned(),
            reason: reason.to_owned(),
        }
    }
}

impl fmt::Display for Denial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.resource.is_empty() {
            return write!(
                f,
                "User {:?} cannot {} path {:?}",
                self.user, self.verb, self.path
            );
        }
        write!(
            f,
            "User {:?} cannot {} resource {:?} in API group {:?}",
            self.user, self.verb, self.resource, self.group
        )?;
        if self.namespace.is_empty() {
            write!(f, " at the cluster scope")?;
        } else {
            write!(f, " in the namespace {:?}", self.namespace)?;
        }
        if !self.name.is_empty() {
            write!(f, " (name {:?})", self.name)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn rule(groups: &[&str], resources: &[&str], verbs: &[&str]) -> PolicyRule {
        PolicyRule {
            api_groups: Some(groups.iter().map(|s| (*s).to_owned()).collect()),
            resources: Some(resources.iter().map(|s| (*s).to_owned()).collect()),
            verbs: verbs.iter().map(|s| (*s).to_owned()).collect(),
            ..PolicyRule::default()
        }
    }

    fn named(mut r: PolicyRule, names: &[&str]) -> PolicyRule {
        r.resource_names = Some(names.iter().map(|s| (*s).to_owned()).collect());
        r
    }

    fn urls(urls: &[&str], verbs: &[&str]) -> PolicyRule {
        PolicyRule {
            non_resource_urls: Some(urls.iter().map(|s| (*s).to_owned()).collect()),
            verbs: verbs.iter().map(|s| (*s).to_owned()).collect(),
            ..PolicyRule::default()
        }
    }

    fn meta(namespace: &str, name: &str) -> ObjectMeta {
        ObjectMeta {
            name: Some(name.to_owned()),
            namespace: (!namespace.is_empty()).then(|| namespace.to_owned()),
            ..ObjectMeta::default()
        }
    }

    fn cluster_role(name: &str, rules: Vec<PolicyRule>) -> ClusterRole {
        ClusterRole {
            metadata: meta("", name),
            rules: Some(rules),
            ..ClusterRole::default()
        }
    }

    fn role(ns: &str, name: &str, rules: Vec<PolicyRule>) -> Role {
        Role {
            metadata: meta(ns, name),
            rules: Some(rules),
        }
    }

    fn subject(kind: &str, name: &str, ns: Option<&str>) -> Subject {
        Subject {
            kind: kind.to_owned(),
            name: name.to_owned(),
            namespace: ns.map(str::to_owned),
            api_group: None,
        }
    }

    fn role_ref(kind: &str, name: &str) -> RoleRef {
        RoleRef {
            api_group: GROUP.to_owned(),
            kind: kind.to_owned(),
            name: name.to_owned(),
        }
    }

    fn crb(name: &str, role: &str, subjects: Vec<Subject>) -> ClusterRoleBinding {
        ClusterRoleBinding {
            metadata: meta("", name),
            role_ref: role_ref("ClusterRole", role),
            subjects: Some(subjects),
        }
    }

    fn rb(ns: &str, name: &str, kind: &str, role: &str, subjects: Vec<Subject>) -> RoleBinding {
        RoleBinding {
            metadata: meta(ns, name),
            role_ref: role_ref(kind, role),
            subjects: Some(subjects),
        }
    }

    fn res(verb: &str, group: &str, resource: &str, ns: &str, name: &str) -> Action {
        let (resource, subresource) = resource.split_once('/').unwrap_or((resource, ""));
        Action::Resource(ResourceAttributes {
            verb: verb.into(),
            group: group.into(),
            version: "v1".into(),
            resource: resource.into(),
            subresource: subresource.into(),
            namespace: ns.into(),
            name: name.into(),
        })
    }

    const SA: &str = "system:serviceaccount:kube-system:vn";

    fn sa_groups() -> Vec<String> {
        vec![
            "system:serviceaccounts".into(),
            "system:serviceaccounts:kube-system".into(),
            "system:authenticated".into(),
        ]
    }

    fn allowed(p: &Policy, user: &str, groups: &[String], a: &Action) -> bool {
        p.authorize(user, groups, a).allowed
    }

    #[test]
    fn request_attributes_follow_request_info() {
        let r = |m: &str, p: &str, q: Option<&str>| match request_attributes(m, p, q) {
            Action::Resource(r) => r,
            other => panic!("{m} {p}: {other:?}"),
        };
        let a = r("GET", "/api/v1/namespaces/default/pods/web-1", None);
        assert_eq!(
            (a.verb.as_str(), a.resource.as_str(), a.namespace.as_str()),
            ("get", "pods", "default")
        );
        assert_eq!(a.name, "web-1");
        assert_eq!(r("GET", "/api/v1/pods", None).verb, "list");
        assert_eq!(r("GET", "/api/v1/pods", Some("watch=true")).verb, "watch");
        assert_eq!(r("GET", "/api/v1/pods", Some("watch=1")).verb, "watch");
        assert_eq!(r("GET", "/api/v1/pods", Some("watch=false")).verb, "list");
        assert_eq!(r("GET", "/api/v1/pods", Some("watch=0")).verb, "list");
        let w = r("GET", "/api/v1/watch/namespaces/a/pods/p", None);
        assert_eq!((w.verb.as_str(), w.name.as_str()), ("watch", "p"));
        assert_eq!(r("GET", "/api/v1/watch/pods", None).verb, "watch");
        assert_eq!(
            r("POST", "/api/v1/namespaces/a/pods", Some("dryRun=All")).verb,
            "create"
        );
        assert_eq!(r("PUT", "/api/v1/namespaces/a/pods/p", None).verb, "update");
        assert_eq!(
            r("PATCH", "/api/v1/namespaces/a/pods/p", None).verb,
            "patch"
        );
        assert_eq!(
            r("DELETE", "/api/v1/namespaces/a/pods/p", None).verb,
            "delete"
        );
        assert_eq!(
            r("DELETE", "/api/v1/namespaces/a/pods", None).verb,
            "deletecollection"
        );
        assert_eq!(r("HEAD", "/api/v1/namespaces/a/pods/p", None).verb, "get");
        // Subresources take the method's verb.
        let e = r(
            "GET",
            "/api/v1/namespaces/a/pods/p/exec",
            Some("command=ls"),
        );
        assert_eq!(
            (e.verb.as_str(), e.combined_resource().as_str()),
            ("get", "pods/exec")
        );
        let e = r("POST", "/api/v1/namespaces/a/pods/p/exec", None);
        assert_eq!(
            (e.verb.as_str(), e.combined_resource().as_str()),
            ("create", "pods/exec")
        );
        let n = r("GET", "/api/v1/nodes/n1/proxy/stats/summary", None);
        assert_eq!(
            (
                n.verb.as_str(),
                n.combined_resource().as_str(),
                n.namespace.as_str()
            ),
            ("get", "nodes/proxy", "")
        );
        let t = r("POST", "/api/v1/namespaces/a/serviceaccounts/s/token", None);
        assert_eq!(t.combined_resource(), "serviceaccounts/token");
        // A namespace is in its own namespace; its subresources stay its own.
        let ns = r("GET", "/api/v1/namespaces/shop", None);
        assert_eq!(
            (
                ns.resource.as_str(),
                ns.name.as_str(),
                ns.namespace.as_str()
            ),
            ("namespaces", "shop", "shop")
        );
        let f = r("PUT", "/api/v1/namespaces/shop/finalize", None);
        assert_eq!(
            (f.combined_resource().as_str(), f.namespace.as_str()),
            ("namespaces/finalize", "shop")
        );
        let all = r("GET", "/api/v1/namespaces", None);
        assert_eq!((all.verb.as_str(), all.namespace.as_str()), ("list", ""));
        let d = r(
            "GET",
            "/apis/apps/v1/namespaces/a/deployments/d/scale",
            None,
        );
        assert_eq!(
            (d.group.as_str(), d.combined_resource().as_str()),
            ("apps", "deployments/scale")
        );
        // A list or watch for one name carries the name.
        let one = r(
            "GET",
            "/api/v1/namespaces/a/configmaps",
            Some("fieldSelector=metadata.name%3Dcfg&watch=1"),
        );
        assert_eq!((one.verb.as_str(), one.name.as_str()), ("watch", "cfg"));
        let other = r(
            "GET",
            "/api/v1/namespaces/a/configmaps",
            Some("fieldSelector=metadata.name!%3Dcfg"),
        );
        assert_eq!(other.name, "");
        let m = r("GET", "/apis/metrics.k8s.io/v1beta1/nodes", None);
        assert_eq!(
            (m.group.as_str(), m.verb.as_str()),
            ("metrics.k8s.io", "list")
        );
        for (method, path) in [
            ("GET", "/api"),
            ("GET", "/api/v1"),
            ("GET", "/apis"),
            ("GET", "/apis/apps"),
            ("GET", "/apis/apps/v1"),
            ("GET", "/version"),
            ("GET", "/healthz/ping"),
            ("GET", "/openapi/v3/apis/apps/v1"),
            ("POST", "/nope/a/b/c"),
        ] {
            assert_eq!(
                request_attributes(method, path, None),
                Action::NonResource {
                    verb: method.to_ascii_lowercase(),
                    path: path.to_owned()
                },
                "{path}"
            );
        }
    }

    #[test]
    fn cluster_role_bindings_grant_everywhere_role_bindings_in_their_namespace() {
        let p = Policy::new(
            [role(
                "shop",
                "leases",
                vec![rule(&["coordination.k8s.io"], &["leases"], &["get"])],
            )],
            [cluster_role(
                "pods",
                vec![rule(&[""], &["pods"], &["get", "list"])],
            )],
            [
                rb(
                    "shop",
                    "b",
                    "Role",
                    "leases",
                    vec![subject("User", "alice", None)],
                ),
                rb(
                    "shop",
                    "c",
                    "ClusterRole",
                    "pods",
                    vec![subject("User", "bob", None)],
                ),
            ],
            [crb(
                "everyone",
                "pods",
                vec![subject("User", "carol", None)],
            )],
        );
        let g = vec!["system:authenticated".to_owned()];
        let get_pod = |ns: &str| res("get", "", "pods", ns, "p");
        // carol: everywhere, and at the cluster scope.
        assert!(allowed(&p, "carol", &g, &get_pod("shop")));
        assert!(allowed(&p, "carol", &g, &get_pod("other")));
        assert!(allowed(&p, "carol", &g, &res("list", "", "pods", "", "")));
        // bob: a RoleBinding to a ClusterRole grants in the binding's namespace only.
        assert!(allowed(&p, "bob", &g, &get_pod("shop")));
        assert!(!allowed(&p, "bob", &g, &get_pod("other")));
        assert!(!allowed(&p, "bob", &g, &res("list", "", "pods", "", "")));
        // alice: a Role of the binding's namespace.
        let lease = |ns: &str| res("get", "coordination.k8s.io", "leases", ns, "l");
        assert!(allowed(&p, "alice", &g, &lease("shop")));
        assert!(!allowed(&p, "alice", &g, &lease("other")));
        assert!(!allowed(&p, "alice", &g, &get_pod("shop")));
        // The group must match too.
        assert!(!allowed(
            &p,
            "alice",
            &g,
            &res("get", "", "leases", "shop", "l")
        ));
        assert_eq!(
            p.authorize("bob", &g, &get_pod("shop")).reason,
            "RBAC: allowed by RoleBinding \"c/shop\" of ClusterRole \"pods\" to User \"bob\""
        );
    }

    #[test]
    fn a_role_binding_finds_roles_of_its_own_namespace_only() {
        let p = Policy::new(
            [role("other", "r", vec![rule(&["*"], &["*"], &["*"])])],
            [],
            [rb(
                "shop",
                "b",
                "Role",
                "r",
                vec![subject("User", "alice", None)],
            )],
            [],
        );
        let g = Vec::new();
        let d = p.authorize("alice", &g, &res("get", "", "pods", "shop", "p"));
        assert!(!d.allowed);
        assert_eq!(
            d.reason,
            "RBAC: role.rbac.authorization.k8s.io \"r\" not found"
        );
    }

    #[test]
    fn service_account_subjects_default_to_the_binding_namespace() {
        let all = || cluster_role("all", vec![rule(&["*"], &["*"], &["*"])]);
        // Namespace omitted in a RoleBinding: the binding's namespace.
        let p = Policy::new(
            [],
            [all()],
            [
                rb(
                    "kube-system",
                    "b",
                    "ClusterRole",
                    "all",
                    vec![subject("ServiceAccount", "vn", None)],
                ),
                rb(
                    "shop",
                    "b",
                    "ClusterRole",
                    "all",
                    vec![subject("ServiceAccount", "vn", None)],
                ),
            ],
            [],
        );
        let g = sa_groups();
        assert!(allowed(
            &p,
            SA,
            &g,
            &res("get", "", "pods", "kube-system", "p")
        ));
        // In `shop` the subject means shop's `vn`, not kube-system's.
        assert!(!allowed(&p, SA, &g, &res("get", "", "pods", "shop", "p")));
        assert!(allowed(
            &p,
            "system:serviceaccount:shop:vn",
            &g,
            &res("get", "", "pods", "shop", "p")
        ));
        // A ClusterRoleBinding's ServiceAccount subject without a namespace matches nobody.
        let p = Policy::new(
            [],
            [all()],
            [],
            [crb("b", "all", vec![subject("ServiceAccount", "vn", None)])],
        );
        assert!(!allowed(
            &p,
            SA,
            &g,
            &res("get", "", "pods", "kube-system", "p")
        ));
        let p = Policy::new(
            [],
            [all()],
            [],
            [crb(
                "b",
                "all",
                vec![subject("ServiceAccount", "vn", Some("kube-system"))],
            )],
        );
        assert!(allowed(
            &p,
            SA,
            &g,
            &res("get", "", "pods", "anywhere", "p")
        ));
        assert!(!allowed(
            &p,
            "vn",
            &g,
            &res("get", "", "pods", "anywhere", "p")
        ));
        assert_eq!(
            p.authorize(SA, &g, &res("get", "", "pods", "a", "p"))
                .reason,
            "RBAC: allowed by ClusterRoleBinding \"b\" of ClusterRole \"all\" to ServiceAccount \"vn/kube-system\""
        );
    }

    #[test]
    fn group_subjects_and_masters() {
        let p = Policy::new(
            [],
            [cluster_role("read", vec![rule(&[""], &["pods"], &["get"])])],
            [],
            [crb(
                "b",
                "read",
                vec![subject("Group", "system:serviceaccounts:kube-system", None)],
            )],
        );
        assert!(allowed(
            &p,
            SA,
            &sa_groups(),
            &res("get", "", "pods", "a", "p")
        ));
        assert!(!allowed(&p, SA, &[], &res("get", "", "pods", "a", "p")));
        // system:masters needs no binding at all.
        let empty = Policy::default();
        let masters = vec![MASTERS.to_owned()];
        assert!(allowed(
            &empty,
            "admin",
            &masters,
            &res("delete", "", "nodes", "", "n")
        ));
        assert!(!allowed(
            &empty,
            MASTERS,
            &[],
            &res("get", "", "pods", "a", "p")
        ));
    }

    #[test]
    fn resource_names_restrict_only_requests_that_name_an_object() {
        let p = Policy::new(
            [],
            [cluster_role(
                "one",
                vec![named(
                    rule(
                        &[""],
                        &["configmaps"],
                        &["get", "list", "watch", "create", "update"],
                    ),
                    &["cfg"],
                )],
            )],
            [],
            [crb("b", "one", vec![subject("User", "u", None)])],
        );
        let g = Vec::new();
        let cm = |verb: &str, name: &str| res(verb, "", "configmaps", "a", name);
        assert!(allowed(&p, "u", &g, &cm("get", "cfg")));
        assert!(allowed(&p, "u", &g, &cm("update", "cfg")));
        assert!(!allowed(&p, "u", &g, &cm("get", "other")));
        // No name, no match: not a list of everything, not a create.
        assert!(!allowed(&p, "u", &g, &cm("list", "")));
        assert!(!allowed(&p, "u", &g, &cm("watch", "")));
        assert!(!allowed(&p, "u", &g, &cm("create", "")));
        // A list or watch narrowed to the name by a field selector is allowed.
        let Action::Resource(narrowed) = request_attributes(
            "GET",
            "/api/v1/namespaces/a/configmaps",
            Some("watch=true&fieldSelector=metadata.name%3Dcfg"),
        ) else {
            panic!()
        };
        assert!(allowed(&p, "u", &g, &Action::Resource(narrowed)));
    }

    #[test]
    fn subresources_need_rules_of_their_own() {
        let p = Policy::new(
            [],
            [cluster_role(
                "r",
                vec![
                    rule(&[""], &["pods"], &["get", "list", "create"]),
                    rule(&[""], &["pods/log"], &["get"]),
                    rule(&["apps"], &["*/scale"], &["update"]),
                ],
            )],
            [],
            [crb("b", "r", vec![subject("User", "u", None)])],
        );
        let g = Vec::new();
        assert!(allowed(&p, "u", &g, &res("get", "", "pods/log", "a", "p")));
        assert!(!allowed(
            &p,
            "u",
            &g,
            &res("get", "", "pods/status", "a", "p")
        ));
        assert!(!allowed(
            &p,
            "u",
            &g,
            &res("create", "", "pods/exec", "a", "p")
        ));
        assert!(!allowed(
            &p,
            "u",
            &g,
            &res("create", "", "pods/eviction", "a", "p")
        ));
        assert!(allowed(
            &p,
            "u",
            &g,
            &res("update", "apps", "deployments/scale", "a", "d")
        ));
        assert!(allowed(
            &p,
            "u",
            &g,
            &res("update", "apps", "statefulsets/scale", "a", "s")
        ));
        assert!(!allowed(
            &p,
            "u",
            &g,
            &res("update", "apps", "deployments", "a", "d")
        ));
        assert!(!allowed(
            &p,
            "u",
            &g,
            &res("update", "apps", "deployments/status", "a", "d")
        ));
        // `*/scale` is not `scale` of nothing.
        assert!(!allowed(
            &p,
            "u",
            &g,
            &res("update", "apps", "scale", "a", "d")
        ));
    }

    #[test]
    fn wildcards() {
        let p = Policy::new(
            [],
            [
                cluster_role("everything", vec![rule(&["*"], &["*"], &["*"])]),
                cluster_role("apps-get", vec![rule(&["apps"], &["*"], &["get"])]),
            ],
            [],
            [
                crb("a", "everything", vec![subject("User", "root", None)]),
                crb("b", "apps-get", vec![subject("User", "u", None)]),
            ],
        );
        let g = Vec::new();
        assert!(allowed(
            &p,
            "root",
            &g,
            &res("deletecollection", "batch", "jobs", "a", "")
        ));
        assert!(allowed(
            &p,
            "root",
            &g,
            &res("create", "", "pods/exec", "a", "p")
        ));
        // A resource rule is not a non-resource rule.
        let healthz = Action::NonResource {
            verb: "get".into(),
            path: "/healthz".into(),
        };
        assert!(!allowed(&p, "root", &g, &healthz));
        assert!(allowed(
            &p,
            "u",
            &g,
            &res("get", "apps", "deployments/status", "a", "d")
        ));
        assert!(!allowed(
            &p,
            "u",
            &g,
            &res("list", "apps", "deployments", "a", "")
        ));
        assert!(!allowed(&p, "u", &g, &res("get", "", "pods", "a", "p")));
    }

    #[test]
    fn non_resource_urls_match_exactly_or_by_prefix() {
        let p = Policy::new(
            [],
            [cluster_role(
                "urls",
                vec![urls(&["/healthz", "/apis/*", "/metrics"], &["get"])],
            )],
            [],
            [crb("b", "urls", vec![subject("Group", "g", None)])],
        );
        let g = vec!["g".to_owned()];
        let get = |path: &str| Action::NonResource {
            verb: "get".into(),
            path: path.into(),
        };
        assert!(allowed(&p, "u", &g, &get("/healthz")));
        assert!(!allowed(&p, "u", &g, &get("/healthz/ping")));
        assert!(allowed(&p, "u", &g, &get("/apis/apps/v1")));
        assert!(allowed(&p, "u", &g, &get("/apis/")));
        assert!(!allowed(&p, "u", &g, &get("/apis")));
        assert!(!allowed(
            &p,
            "u",
            &g,
            &Action::NonResource {
                verb: "post".into(),
                path: "/healthz".into()
            }
        ));
        // Non-resource rules never grant resources.
        assert!(!allowed(&p, "u", &g, &res("get", "", "pods", "a", "p")));
    }

    #[test]
    fn missing_roles_are_reasons() {
        let p = Policy::new(
            [],
            [],
            [rb(
                "a",
                "x",
                "Role",
                "gone",
                vec![subject("User", "u", None)],
            )],
            [
                crb("y", "missing", vec![subject("User", "u", None)]),
                crb("z", "missing", vec![subject("User", "u", None)]),
            ],
        );
        let d = p.authorize("u", &[], &res("get", "", "pods", "a", "p"));
        assert!(!d.allowed);
        assert_eq!(
            d.reason,
            "RBAC: [clusterrole.rbac.authorization.k8s.io \"missing\" not found, role.rbac.authorization.k8s.io \"gone\" not found]"
        );
        // Bindings of other users do not matter.
        assert_eq!(
            p.authorize("v", &[], &res("get", "", "pods", "a", "p"))
                .reason,
            ""
        );
    }

    #[test]
    fn messages_are_worded_like_the_real_server() {
        assert_eq!(
            forbidden_message(SA, &res("get", "", "pods", "default", "web-1")),
            "User \"system:serviceaccount:kube-system:vn\" cannot get resource \"pods\" in API group \"\" in the namespace \"default\""
        );
        assert_eq!(
            forbidden_message("u", &res("create", "", "pods/exec", "a", "p")),
            "User \"u\" cannot create resource \"pods/exec\" in API group \"\" in the namespace \"a\""
        );
        assert_eq!(
            forbidden_message("u", &res("list", "", "nodes", "", "")),
            "User \"u\" cannot list resource \"nodes\" in API group \"\" at the cluster scope"
        );
        let d = Denial::new(
            "u",
            &[],
            &res("watch", "apps", "deployments", "a", "d"),
            "/apis/apps/v1/watch/namespaces/a/deployments/d",
            "",
        );
        assert_eq!(d.resource, "deployments");
        assert_eq!(
            d.to_string(),
            "User \"u\" cannot watch resource \"deployments\" in API group \"apps\" in the namespace \"a\" (name \"d\")"
        );
        let d = Denial::new(
            "u",
            &[],
            &Action::NonResource {
                verb: "get".into(),
                path: "/metrics".into(),
            },
            "/metrics",
            "",
        );
        assert_eq!(d.to_string(), "User \"u\" cannot get path \"/metrics\"");
    }
}
