//! `/version` and discovery (legacy and aggregated v2, which `kubectl` 1.30+ asks for first),
//! generated from the resource table.

use http::{HeaderMap, Response, header};
use serde_json::{Value, json};

use super::State;
use super::errors::ApiError;
use super::http::{Body, error_response, json_response, value_response};
use super::resources::{RESOURCES, ResourceType};

const AGGREGATED: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";

/// `/version`.
pub fn version(state: &State) -> Value {
    let v = &state.config.git_version;
    let (major, minor) = v
        .trim_start_matches('v')
        .split_once('.')
        .map(|(ma, rest)| {
            (
                ma.to_owned(),
                rest.split('.').next().unwrap_or("0").to_owned(),
            )
        })
        .unwrap_or_default();
    // Kubernetes 1.31+ reports the version it emulates and the oldest it stays compatible with
    // (one minor back); the simulator emulates what it claims to be.
    let min_compat_minor = minor
        .parse::<u32>()
        .map(|m| m.saturating_sub(1).to_string())
        .unwrap_or_default();
    json!({
        "major": major, "minor": minor, "emulationMajor": major, "emulationMinor": minor,
        "minCompatibilityMajor": major, "minCompatibilityMinor": min_compat_minor, "gitVersion": v, "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean", "buildDate": "2026-11-01T00:00:00Z", "goVersion": "go1.24 (tensile-sim)",
        "compiler": "rustc", "platform": "linux/amd64"
    })
}

fn wants_aggregated(headers: &HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|a| a.to_str().ok())
        .is_some_and(|a| a.split(',').any(|t| t.replace(' ', "") == AGGREGATED))
}

fn aggregated(items: Vec<Value>) -> Response<Body> {
    let mut resp = json_response(
        200,
        serde_json::to_vec(&json!({"kind": "APIGroupDiscoveryList", "apiVersion": "apidiscovery.k8s.io/v2", "metadata": {}, "items": items}))
            .unwrap_or_default(),
    );
    if let Ok(v) = header::HeaderValue::from_str(AGGREGATED) {
        resp.headers_mut().insert(header::CONTENT_TYPE, v);
    }
    resp
}

/// Groups other than core, in table order, each with its versions.
fn group_versions() -> Vec<(&'static str, Vec<&'static str>)> {
    let mut out: Vec<(&str, Vec<&str>)> = Vec::new();
    for r in RESOURCES.iter().filter(|r| !r.group.is_empty()) {
        match out.iter_mut().find(|(g, _)| *g == r.group) {
            Some((_, versions)) if !versions.contains(&r.version) => versions.push(r.version),
            Some(_) => {}
            None => out.push((r.group, vec![r.version])),
        }
    }
    out
}

/// `/api`.
pub fn core_versions(state: &State, headers: &HeaderMap) -> Response<Body> {
    if wants_aggregated(headers) {
        return aggregated(vec![aggregated_group("", &["v1"])]);
    }
    let host = state.url.split("://").nth(1).unwrap_or_default();
    value_response(
        200,
        &json!({"kind": "APIVersions", "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": host}]}),
    )
}

/// `/apis`.
pub fn groups(headers: &HeaderMap) -> Response<Body> {
    let groups = group_versions();
    if wants_aggregated(headers) {
        return aggregated(groups.iter().map(|(g, v)| aggregated_group(g, v)).collect());
    }
    let groups: Vec<Value> = groups.iter().map(|(g, v)| group_value(g, v)).collect();
    value_response(
        200,
        &json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}),
    )
}

fn group_value(group: &str, versions: &[&str]) -> Value {
    let versions: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": format!("{group}/{v}"), "version": v}))
        .collect();
    json!({"name": group, "versions": versions, "preferredVersion": versions.first()})
}

/// `/apis/{group}`.
pub fn group(group: &str) -> Response<Body> {
    match group_versions().into_iter().find(|(g, _)| *g == group) {
        Some((g, v)) => {
            let mut value = group_value(g, &v);
            value["kind"] = json!("APIGroup");
            value["apiVersion"] = json!("v1");
            value_response(200, &value)
        }
        None => error_response(&ApiError::no_route()),
    }
}

fn in_group_version<'a>(
    group: &'a str,
    version: &'a str,
) -> impl Iterator<Item = &'static ResourceType> + 'a {
    RESOURCES
        .iter()
        .filter(move |r| r.group == group && r.version == version)
}

/// `/api/v1`, `/apis/{group}/{version}`.
pub fn resource_list(group: &str, version: &str) -> Response<Body> {
    let mut resources = Vec::new();
    for r in in_group_version(group, version) {
        let mut entry = json!({
            "name": r.plural, "singularName": r.singular, "namespaced": r.namespaced,
            "kind": r.kind, "verbs": r.verbs(),
        });
        if !r.short_names.is_empty() {
            entry["shortNames"] = json!(r.short_names);
        }
        if !r.categories.is_empty() {
            entry["categories"] = json!(r.categories);
        }
        resources.push(entry);
        for (sub, kind) in r.subresources {
            let kind = if kind.is_empty() { r.kind } else { kind };
            let mut entry = json!({
                "name": format!("{}/{sub}", r.plural), "singularName": "", "namespaced": r.namespaced,
                "kind": kind, "verbs": subresource_verbs(sub),
            });
            if let Some((g, v)) = subresource_group_version(kind) {
                entry["group"] = json!(g);
                entry["version"] = json!(v);
            }
            resources.push(entry);
        }
    }
    if resources.is_empty() {
        return error_response(&ApiError::no_route());
    }
    let gv = if group.is_empty() {
        version.to_owned()
    } else {
        format!("{group}/{version}")
    };
    let mut list = json!({"kind": "APIResourceList", "groupVersion": gv, "resources": resources});
    // The real server writes the list's apiVersion for groups only, not for the core `/api/v1`.
    if !group.is_empty() {
        list["apiVersion"] = json!("v1");
    }
    value_response(200, &list)
}

/// The group and version of a subresource's kind when they are not its resource's own
/// (`deployments/scale` is an `autoscaling/v1` Scale).
fn subresource_group_version(kind: &str) -> Option<(&'static str, &'static str)> {
    match kind {
        "Scale" => Some(("autoscaling", "v1")),
        "Eviction" => Some(("policy", "v1")),
        "TokenRequest" => Some(("authentication.k8s.io", "v1")),
        _ => None,
    }
}

fn subresource_verbs(sub: &str) -> &'static [&'static str] {
    match sub {
        "status" | "scale" => &["get", "patch", "update"],
        "binding" | "eviction" | "token" => &["create"],
        "exec" | "attach" | "portforward" => &["create", "get"],
        "log" => &["get"],
        "ephemeralcontainers" => &["get", "patch", "update"],
        "finalize" => &["update"],
        _ => &["create", "delete", "get", "patch", "update"],
    }
}

fn aggregated_group(group: &str, versions: &[&str]) -> Value {
    let versions: Vec<Value> = versions
        .iter()
        .map(|v| {
            let resources: Vec<Value> = in_group_version(group, v)
                .map(|r| {
                    let kind = |k: &str| json!({"group": r.group, "version": r.version, "kind": k});
                    let subs: Vec<Value> = r
                        .subresources
                        .iter()
                        .map(|(s, k)| {
                            let k = if k.is_empty() { r.kind } else { k };
                            let response_kind = match subresource_group_version(k) {
                                Some((g, v)) => json!({"group": g, "version": v, "kind": k}),
                                None => kind(k),
                            };
                            json!({"subresource": s, "responseKind": response_kind,
                            "verbs": subresource_verbs(s)})
                        })
                        .collect();
                    let mut e = json!({
                        "resource": r.plural, "responseKind": kind(r.kind),
                        "scope": if r.namespaced { "Namespaced" } else { "Cluster" },
                        "singularResource": r.singular, "verbs": r.verbs(),
                    });
                    if !r.short_names.is_empty() {
                        e["shortNames"] = json!(r.short_names);
                    }
                    if !r.categories.is_empty() {
                        e["categories"] = json!(r.categories);
                    }
                    if !subs.is_empty() {
                        e["subresources"] = Value::Array(subs);
                    }
                    e
                })
                .collect();
            json!({"version": v, "resources": resources, "freshness": "Current"})
        })
        .collect();
    let metadata = if group.is_empty() {
        json!({"creationTimestamp": null})
    } else {
        json!({"name": group, "creationTimestamp": null})
    };
    json!({"metadata": metadata, "versions": versions})
}
