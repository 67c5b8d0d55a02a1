//! The JSON schema of each served kind, as the OpenAPI v3 documents carry it: k8s-openapi's
//! (its `schemars` feature, generated from the same OpenAPI definitions as its types), and
//! for the two metrics.k8s.io kinds, which k8s-openapi has no type for, the shape
//! metrics-server serves (its names, fields and required fields; our own words).

use std::borrow::Cow;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::schemars::{JsonSchema, Schema, SchemaGenerator};
use serde_json::{Value, json};

/// Adds a kind's schema (and every schema it refers to) to `generator`; answers the `$ref`
/// to it.
pub type SchemaFn = fn(&mut SchemaGenerator) -> Schema;

/// [`SchemaFn`] of a type.
pub fn schema_of<K: JsonSchema>(generator: &mut SchemaGenerator) -> Schema {
    generator.subschema_for::<K>()
}

/// A schema from a JSON object literal.
fn object(value: Value) -> Schema {
    Schema::try_from(value).unwrap_or_default()
}

/// The apiVersion and kind properties every object has, in the API's own words.
fn type_meta() -> Value {
    json!({
        "apiVersion": {"description": "APIVersion defines the versioned schema of this \
            representation of an object.", "type": "string"},
        "kind": {"description": "Kind is a string value representing the REST resource this \
            object represents.", "type": "string"},
    })
}

/// metrics.k8s.io/v1beta1 PodMetrics.
#[derive(Debug)]
pub struct PodMetrics;

/// The usage of one container of a [`PodMetrics`].
#[derive(Debug)]
pub struct ContainerMetrics;

/// metrics.k8s.io/v1beta1 NodeMetrics.
#[derive(Debug)]
pub struct NodeMetrics;

/// A resource usage map (`cpu`, `memory`), as both kinds carry it.
fn usage(generator: &mut SchemaGenerator, what: &str) -> Value {
    json!({"description": format!("The CPU and memory {what} used, as quantities."),
        "type": "object", "additionalProperties": generator.subschema_for::<Quantity>()})
}

/// `metadata`, `timestamp` and `window`, which both kinds have.
fn sample(generator: &mut SchemaGenerator, of: &str) -> serde_json::Map<String, Value> {
    let mut properties = match type_meta() {
        Value::Object(m) => m,
        _ => serde_json::Map::new(),
    };
    let mut metadata = generator.subschema_for::<ObjectMeta>();
    metadata.insert(
        "description".into(),
        json!(format!("The {of}'s name, namespace and labels.")),
    );
    let mut timestamp = generator.subschema_for::<Time>();
    timestamp.insert(
        "description".into(),
        json!("The end of the window the usage was measured over."),
    );
    properties.insert("metadata".into(), metadata.to_value());
    properties.insert("timestamp".into(), timestamp.to_value());
    properties.insert(
        "window".into(),
        json!({"description": "How long the usage was measured over, as a duration \
            (`30s`).", "type": "string"}),
    );
    properties
}

impl JsonSchema for PodMetrics {
    fn schema_name() -> Cow<'static, str> {
        "io.k8s.metrics.pkg.apis.metrics.v1beta1.PodMetrics".into()
    }

    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        let mut properties = sample(generator, "pod");
        properties.insert(
            "containers".into(),
            json!({"description": "The usage of each container of the pod.", "type": "array",
                "items": generator.subschema_for::<ContainerMetrics>()}),
        );
        object(json!({
            "description": "The resource usage of a pod's containers, as the kubelet's \
                summary reports it (what `kubectl top pod` shows).",
            "type": "object",
            "properties": properties,
            "required": ["timestamp", "window", "containers"],
        }))
    }
}

impl JsonSchema for ContainerMetrics {
    fn schema_name() -> Cow<'static, str> {
        "io.k8s.metrics.pkg.apis.metrics.v1beta1.ContainerMetrics".into()
    }

    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        object(json!({
            "description": "The resource usage of one container.",
            "type": "object",
            "properties": {
                "name": {"description": "The container's name.", "type": "string"},
                "usage": usage(generator, "the container"),
            },
            "required": ["name", "usage"],
        }))
    }
}

impl JsonSchema for NodeMetrics {
    fn schema_name() -> Cow<'static, str> {
        "io.k8s.metrics.pkg.apis.metrics.v1beta1.NodeMetrics".into()
    }

    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        let mut properties = sample(generator, "node");
        properties.insert("usage".into(), usage(generator, "the node"));
        object(json!({
            "description": "The resource usage of a node, as its kubelet's summary reports \
                it (what `kubectl top node` shows).",
            "type": "object",
            "properties": properties,
            "required": ["timestamp", "window", "usage"],
        }))
    }
}
