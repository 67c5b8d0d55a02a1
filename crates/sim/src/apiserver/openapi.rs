//! The OpenAPI documents, generated from the resource table: `/openapi/v3` lists a document
//! per group-version; each (`/openapi/v3/api/v1`, `/openapi/v3/apis/{group}/{version}`)
//! holds the operations of its resources and, in `components.schemas`, the JSON schema of
//! each of its kinds and of everything they refer to, from k8s-openapi's types. `/openapi/v2`
//! is a Swagger document without definitions.
//!
//! What kubectl reads in them:
//!
//! - `kubectl explain` (OpenAPI v3) finds a resource's kind by the
//!   `x-kubernetes-group-version-kind` of its operations, then the schema carrying the same
//!   group, version and kind in the same extension (a list, as kube-apiserver writes it), and
//!   follows `#/components/schemas/...` references from there. A `$ref` with a description
//!   beside it is written as kube-openapi writes it, `allOf: [{$ref}]` beside the description,
//!   so a field's own description is shown along with its type's.
//! - Validation (`kubectl apply|create`, `--validate=strict` by default) asks whether the
//!   server validates fields itself: a PATCH operation of the kind with a `fieldValidation`
//!   parameter says so, and kubectl sends `fieldValidation=Strict` rather than validating
//!   client-side against a schema.
//! - `kubectl apply` computes a strategic merge patch from the v3 schema of a kind whose
//!   PATCH operation has a request body accepting `application/strategic-merge-patch+json`.
//!   Ours have no request body: k8s-openapi's schemas carry no `x-kubernetes-patch-strategy`
//!   or `x-kubernetes-patch-merge-key`, so lists would be replaced where they are merged by
//!   key. kubectl then uses the patch metadata of its own compiled-in types, as before.
//!
//! A document is built the first time it is asked for, once per process (the API servers of
//! one `tensile up` share it), and kept serialized: the sandbox pays nothing for documents no
//! one reads, and a document read again costs a copy of a reference.

use std::sync::{LazyLock, OnceLock};
use std::time::Instant;

use bytes::Bytes;
use http::{HeaderMap, Response, header};
use k8s_openapi::schemars::generate::SchemaSettings;
use serde_json::{Map, Value, json};

use super::errors::ApiError;
use super::http::{Body, error_response, json_response, value_response};
use super::resources::{RESOURCES, ResourceType};

/// The version the documents' `info` gives.
const INFO_VERSION: &str = "v1.33.4-sim";

/// Where the schemas are, as a `$ref` names them.
const SCHEMAS: &str = "#/components/schemas/";

/// Every served group-version, in the table's order, core first.
fn group_versions() -> Vec<(&'static str, &'static str)> {
    let mut out: Vec<(&str, &str)> = Vec::new();
    for r in RESOURCES {
        if !out.contains(&(r.group, r.version)) {
            out.push((r.group, r.version));
        }
    }
    out
}

/// `api/v1` or `apis/{group}/{version}`: a document's path under `/openapi/v3`.
fn document_path(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

/// A group-version and its serialized document, built when first asked for.
type Document = ((&'static str, &'static str), OnceLock<Bytes>);

/// The documents.
static DOCUMENTS: LazyLock<Vec<Document>> = LazyLock::new(|| {
    group_versions()
        .into_iter()
        .map(|gv| (gv, OnceLock::new()))
        .collect()
});

/// A group-version's document, serialized; `None` for a group-version not served.
fn cached(group: &str, version: &str) -> Option<Bytes> {
    let (_, cell) = DOCUMENTS
        .iter()
        .find(|((g, v), _)| *g == group && *v == version)?;
    let bytes = cell.get_or_init(|| {
        let started = Instant::now();
        let bytes = build(group, version)
            .and_then(|doc| serde_json::to_vec(&doc).ok())
            .unwrap_or_default();
        tracing::debug!(
            document = %document_path(group, version),
            bytes = bytes.len(),
            took_ms = started.elapsed().as_secs_f64() * 1000.0,
            "OpenAPI v3 document built"
        );
        Bytes::from(bytes)
    });
    (!bytes.is_empty()).then(|| bytes.clone())
}

/// `/openapi/v2`, `/openapi/v3` and `/openapi/v3/{api/v1, apis/{group}/{version}}`.
pub fn openapi(path: &str, headers: &HeaderMap) -> Response<Body> {
    if path.trim_end_matches('/') == "/openapi/v2" {
        return openapi_v2(headers);
    }
    let Some(rest) = path.strip_prefix("/openapi/v3") else {
        return error_response(&ApiError::no_route());
    };
    let rest = rest.trim_start_matches('/');
    if rest.is_empty() {
        let paths: Map<String, Value> = group_versions()
            .into_iter()
            .map(|(g, v)| {
                let key = document_path(g, v);
                let url = json!({"serverRelativeURL": format!("/openapi/v3/{key}?hash=SIM")});
                (key, url)
            })
            .collect();
        return value_response(200, &json!({"paths": paths}));
    }
    let (group, version) = match rest.split('/').collect::<Vec<_>>().as_slice() {
        ["api", v] => ("", *v),
        ["apis", g, v] => (*g, *v),
        _ => return error_response(&ApiError::no_route()),
    };
    match cached(group, version) {
        Some(bytes) => json_response(200, bytes),
        None => error_response(&ApiError::no_route()),
    }
}

/// The `x-kubernetes-group-version-kind` of a kind: on its operations an object, on its
/// schema a list of them.
fn gvk(r: &ResourceType) -> Value {
    json!({"group": r.group, "version": r.version, "kind": r.kind})
}

/// A group-version's document: the operations of its resources and its kinds' schemas.
pub(crate) fn build(group: &str, version: &str) -> Option<Value> {
    let rows: Vec<&ResourceType> = RESOURCES
        .iter()
        .filter(|r| r.group == group && r.version == version)
        .collect();
    if rows.is_empty() {
        return None;
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": INFO_VERSION},
        "paths": operations(&rows),
        "components": {"schemas": schemas(&rows)},
    }))
}

/// The operations of each resource with their `x-kubernetes-group-version-kind` and query
/// parameters.
fn operations(rows: &[&ResourceType]) -> Map<String, Value> {
    let mut paths = Map::new();
    for r in rows {
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
                "x-kubernetes-group-version-kind": gvk(r), "parameters": parameters,
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
    paths
}

/// The schema name a real API server gives a built-in kind:
/// `io.k8s.api.<package>.<version>.<Kind>`, the package being the group's first label
/// (`core` for the core group).
fn served_name(r: &ResourceType) -> String {
    let package = r.group.split('.').next().filter(|p| !p.is_empty());
    format!(
        "io.k8s.api.{}.{}.{}",
        package.unwrap_or("core"),
        r.version,
        r.kind
    )
}

/// The schemas of `rows`' kinds and of what they refer to, each kind's with its
/// `x-kubernetes-group-version-kind`.
fn schemas(rows: &[&ResourceType]) -> Map<String, Value> {
    // kube-openapi's form for OpenAPI 3.0: references under `#/components/schemas/`, and no
    // sibling beside a `$ref` (`allOf: [{$ref}]` beside them instead).
    let mut generator = SchemaSettings::openapi3().into_generator();
    let named: Vec<(Option<String>, &ResourceType)> = rows
        .iter()
        .map(|r| {
            let reference = (r.schema)(&mut generator);
            let name = reference
                .get("$ref")
                .and_then(Value::as_str)
                .and_then(|s| s.strip_prefix(SCHEMAS))
                .map(str::to_owned);
            (name, *r)
        })
        .collect();
    let mut schemas = generator.take_definitions(true);
    for (name, r) in named {
        let Some(mut name) = name else { continue };
        // A kind served at a newer version than its type's (GA in 1.34, decoded as the
        // 1.33 type) goes under the name of the version served.
        let served = served_name(r);
        if name.starts_with("io.k8s.api.")
            && name != served
            && !schemas.contains_key(&served)
            && let Some(schema) = schemas.remove(&name)
        {
            schemas.insert(served.clone(), schema);
            let (from, to) = (format!("{SCHEMAS}{name}"), format!("{SCHEMAS}{served}"));
            for schema in schemas.values_mut() {
                rename_refs(schema, &from, &to);
            }
            name = served;
        }
        if let Some(Value::Object(schema)) = schemas.get_mut(&name) {
            // k8s-openapi's kinds list `metadata` as required (their field is no Option); a
            // real server's schemas do not, so `kubectl explain` does not say `-required-`.
            if let Some(Value::Array(required)) = schema.get_mut("required") {
                required.retain(|f| f != "metadata");
                if required.is_empty() {
                    schema.remove("required");
                }
            }
            let list = schema
                .entry("x-kubernetes-group-version-kind")
                .or_insert_with(|| json!([]));
            if let Value::Array(list) = list {
                list.push(gvk(r));
            }
        }
    }
    schemas
}

/// Every `$ref` to `from` in `value` made a `$ref` to `to`.
fn rename_refs(value: &mut Value, from: &str, to: &str) {
    match value {
        Value::Object(m) => {
            for (k, v) in m.iter_mut() {
                if k == "$ref" && v.as_str() == Some(from) {
                    *v = Value::String(to.to_owned());
                } else {
                    rename_refs(v, from, to);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|v| rename_refs(v, from, to)),
        _ => {}
    }
}

/// `/openapi/v2`: a Swagger 2.0 document with no definitions. kubectl falls back to it to
/// validate kinds whose v3 document has no PATCH operation (reviews, which are create-only);
/// a kind it finds no definition for is left to the server, which decodes every body into
/// its typed object. Without it `kubectl create -f` of a review failed with "failed to
/// download openapi". client-go asks for the protobuf encoding (gnostic's `Document`:
/// `swagger` = 1, `info` = 2 with `title` = 1 and `version` = 2, `paths` = 8).
fn openapi_v2(headers: &HeaderMap) -> Response<Body> {
    const TITLE: &str = "Kubernetes";
    const VERSION: &str = INFO_VERSION;
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Every `$ref` in `value`.
    fn refs<'a>(value: &'a Value, out: &mut Vec<&'a str>) {
        match value {
            Value::Object(m) => {
                if let Some(r) = m.get("$ref").and_then(Value::as_str) {
                    out.push(r);
                }
                m.values().for_each(|v| refs(v, out));
            }
            Value::Array(items) => items.iter().for_each(|v| refs(v, out)),
            _ => {}
        }
    }

    fn documents() -> Vec<((&'static str, &'static str), Value)> {
        group_versions()
            .into_iter()
            .map(|(g, v)| ((g, v), build(g, v).unwrap()))
            .collect()
    }

    #[test]
    fn every_served_kind_has_its_schema_found_by_the_group_version_kind_of_its_operations() {
        for ((g, v), doc) in documents() {
            let schemas = doc["components"]["schemas"].as_object().unwrap();
            for r in RESOURCES.iter().filter(|r| r.group == g && r.version == v) {
                // As `kubectl explain` finds it: the GVK of an operation, then the schema
                // whose GVK list holds exactly that object.
                let op_gvk = doc["paths"]
                    .as_object()
                    .unwrap()
                    .iter()
                    .find(|(p, _)| p.split('/').any(|s| s == r.plural))
                    .and_then(|(_, ops)| ops.as_object()?.values().next())
                    .map(|op| op["x-kubernetes-group-version-kind"].clone())
                    .unwrap_or_else(|| panic!("no operation of {}", r.plural));
                assert_eq!(op_gvk, gvk(r));
                let found: Vec<&String> = schemas
                    .iter()
                    .filter(|(_, s)| {
                        s["x-kubernetes-group-version-kind"]
                            .as_array()
                            .is_some_and(|l| l.contains(&op_gvk))
                    })
                    .map(|(name, _)| name)
                    .collect();
                assert_eq!(found.len(), 1, "{} {op_gvk}: {found:?}", r.plural);
                let schema = &schemas[found[0].as_str()];
                if g != "metrics.k8s.io" {
                    assert_eq!(found[0], &served_name(r));
                }
                assert!(
                    schema["description"]
                        .as_str()
                        .is_some_and(|d| !d.is_empty())
                        && schema["properties"]["metadata"].is_object(),
                    "{}: {schema}",
                    found[0]
                );
                let required = schema["required"].as_array();
                assert!(
                    !required.is_some_and(|r| r.contains(&json!("metadata"))),
                    "{}: metadata is not required on a real server",
                    found[0]
                );
            }
        }
    }

    #[test]
    fn every_reference_resolves_within_its_document_and_stands_alone() {
        for ((g, v), doc) in documents() {
            let schemas = doc["components"]["schemas"].as_object().unwrap();
            let mut all = Vec::new();
            refs(&doc, &mut all);
            assert!(!all.is_empty(), "{g}/{v}");
            for r in all {
                let name = r.strip_prefix(SCHEMAS).unwrap_or_else(|| panic!("{r}"));
                assert!(schemas.contains_key(name), "{g}/{v}: {r} does not resolve");
            }
            // kube-openapi's form: a description beside a reference goes beside an
            // `allOf` holding it, which explain reads as the field's own description.
            fn alone(value: &Value) -> bool {
                match value {
                    Value::Object(m) => {
                        (!m.contains_key("$ref") || m.len() == 1) && m.values().all(alone)
                    }
                    Value::Array(items) => items.iter().all(alone),
                    _ => true,
                }
            }
            assert!(alone(&doc), "{g}/{v}");
        }
    }

    #[test]
    fn a_field_is_documented_with_its_own_description_and_its_types() {
        let doc = build("apps", "v1").unwrap();
        let schemas = &doc["components"]["schemas"];
        let spec = &schemas["io.k8s.api.apps.v1.Deployment"]["properties"]["spec"];
        assert!(
            spec["description"]
                .as_str()
                .unwrap()
                .contains("desired behavior")
        );
        assert_eq!(
            spec["allOf"][0]["$ref"],
            "#/components/schemas/io.k8s.api.apps.v1.DeploymentSpec"
        );
        let template = &schemas["io.k8s.api.apps.v1.DeploymentSpec"]["properties"]["template"];
        assert_eq!(
            template["allOf"][0]["$ref"],
            "#/components/schemas/io.k8s.api.core.v1.PodTemplateSpec"
        );
        assert_eq!(
            schemas["io.k8s.api.core.v1.PodSpec"]["properties"]["containers"]["items"]["$ref"],
            "#/components/schemas/io.k8s.api.core.v1.Container"
        );
        assert!(
            schemas["io.k8s.api.apps.v1.DeploymentSpec"]["required"]
                .as_array()
                .unwrap()
                .contains(&json!("selector"))
        );
        // Only the kinds of the group-version, and what they refer to.
        assert!(schemas.get("io.k8s.api.core.v1.Pod").is_none());
    }

    #[test]
    fn a_kind_newer_than_its_type_is_named_as_the_version_served() {
        let doc = build("storage.k8s.io", "v1").unwrap();
        let schemas = doc["components"]["schemas"].as_object().unwrap();
        assert!(schemas.contains_key("io.k8s.api.storage.v1.VolumeAttributesClass"));
        assert!(!schemas.keys().any(|k| k.contains("v1beta1")));
    }

    #[test]
    fn each_document_is_built_once_and_only_served_group_versions_have_one() {
        let first = cached("batch", "v1").unwrap();
        let again = cached("batch", "v1").unwrap();
        assert_eq!(first.as_ptr(), again.as_ptr());
        assert!(cached("batch", "v2").is_none());
        assert!(cached("", "v1").is_some());
        let listed = openapi("/openapi/v3", &HeaderMap::new());
        assert_eq!(listed.status(), 200);
        assert_eq!(
            openapi("/openapi/v3/apis/batch/v9", &HeaderMap::new()).status(),
            404
        );
    }
}
