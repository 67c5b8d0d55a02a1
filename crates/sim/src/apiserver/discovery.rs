//! `/version`, discovery (legacy and aggregated v2, which `kubectl` 1.30+ asks for first) and
//! the OpenAPI endpoints, all generated from the resource table.

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

/// `/openapi/v3` and `/openapi/v3/{api/v1, apis/{group}/{version}}`: the operations of each
/// resource with their `x-kubernetes-group-version-kind` and query parameters. kubectl reads
/// them to learn that the server validates fields itself (`fieldValidation` on PATCH), so it
/// sends `fieldValidation=Strict` instead of validating against a downloaded schema. The
/// documents carry no component schemas (documented simplification): `kubectl explain` has
/// nothing to show. `/openapi/v2` is served without definitions (see [`openapi_v2`]).
pub fn openapi(path: &str, headers: &HeaderMap) -> Response<Body> {
    if path.trim_end_matches('/') == "/openapi/v2" {
        return openapi_v2(headers);
    }
    let Some(rest) = path.strip_prefix("/openapi/v3") else {
        return error_response(&ApiError::no_route());
    };
    let rest = rest.trim_start_matches('/');
    if rest.is_empty() {
        let mut paths = serde_json::Map::new();
        paths.insert(
            "api/v1".into(),
            json!({"serverRelativeURL": "/openapi/v3/api/v1?hash=SIM"}),
        );
        for (group, versions) in group_versions() {
            for v in versions {
                let key = format!("apis/{group}/{v}");
                paths.insert(
                    key.clone(),
                    json!({"serverRelativeURL": format!("/openapi/v3/{key}?hash=SIM")}),
                );
            }
        }
        return value_response(200, &json!({"paths": paths}));
    }
    let (group, version) = match rest.split('/').collect::<Vec<_>>().as_slice() {
        ["api", v] => (String::new(), (*v).to_owned()),
        ["apis", g, v] => ((*g).to_owned(), (*v).to_owned()),
        _ => return error_response(&ApiError::no_route()),
    };
    let mut paths = serde_json::Map::new();
    for r in in_group_version(&group, &version) {
        let gvk = json!({"group": r.group, "version": r.version, "kind": r.kind});
        let prefix = if r.group.is_empty() {
            format!("/api/{}", r.version)
        } else {
            format!("/apis/{}/{}", r.group, r.version)
        };
        let scope = if r.namespaced {
            "/namespaces/{namespace}"
        } else {
            ""
        };
        let op = |verb: &str, params: &[&str]| {
            let parameters: Vec<Value> = params
                .iter()
                .map(|p| json!({"name": p, "in": "query", "schema": {"type": "string", "uniqueItems": true}}))
                .collect();
            json!({"operationId": format!("{verb}{}", r.kind), "x-kubernetes-action": verb,
                "x-kubernetes-group-version-kind": gvk, "parameters": parameters,
                "responses": {"200": {"description": "OK"}}})
        };
        let write = ["dryRun", "fieldManager", "fieldValidation"];
        if r.create_only {
            paths.insert(
                format!("{prefix}/{}", r.plural),
                json!({"post": op("create", &write)}),
            );
            continue;
        }
        paths.insert(
            format!("{prefix}{scope}/{}", r.plural),
            json!({"get": op("list", &["labelSelector", "fieldSelector", "limit", "continue", "watch", "resourceVersion", "timeoutSeconds"]),
                   "post": op("post", &write)}),
        );
        paths.insert(
            format!("{prefix}{scope}/{}/{{name}}", r.plural),
            json!({"get": op("get", &[]), "put": op("put", &write),
                   "patch": op("patch", &["dryRun", "fieldManager", "fieldValidation", "force"]),
                   "delete": op("delete", &["dryRun", "gracePeriodSeconds", "propagationPolicy"])}),
        );
    }
    if paths.is_empty() {
        return error_response(&ApiError::no_route());
    }
    value_response(
        200,
        &json!({"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": "v1.33.4-sim"}, "paths": paths}),
    )
}

/// `/openapi/v2`: a Swagger 2.0 document with no definitions. kubectl falls back to it to
/// validate kinds whose v3 document has no PATCH operation (reviews, which are create-only);
/// a kind it finds no definition for is left to the server, which decodes every body into
/// its typed object. Without it `kubectl create -f` of a review failed with "failed to
/// download openapi". client-go asks for the protobuf encoding (gnostic's `Document`:
/// `swagger` = 1, `info` = 2 with `title` = 1 and `version` = 2, `paths` = 8).
fn openapi_v2(headers: &HeaderMap) -> Response<Body> {
    const TITLE: &str = "Kubernetes";
    const VERSION: &str = "v1.33.4-sim";
    let wants_protobuf = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("protobuf"));
    if !wants_protobuf {
        return value_response(
            200,
            &json!({"swagger": "2.0", "info": {"title": TITLE, "version": VERSION}, "paths": {}}),
        );
    }
    let field = |tag: u8, bytes: &[u8]| {
        // Every field here is far shorter than 128 bytes: a one-byte length.
        let mut out = vec![tag, u8::try_from(bytes.len()).unwrap_or(0)];
        out.extend_from_slice(bytes);
        out
    };
    let info = [
        field(0x0a, TITLE.as_bytes()),
        field(0x12, VERSION.as_bytes()),
    ]
    .concat();
    let document = [field(0x0a, b"2.0"), field(0x12, &info), field(0x42, &[])].concat();
    let mut response = Response::new(super::http::full(document));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(
            "application/com.github.proto-openapi.spec.v2.v1.0+protobuf",
        ),
    );
    response
}
