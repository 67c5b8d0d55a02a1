//! Nodes: the TaintNodesByCondition admission plugin (a new node is `not-ready`), the v1
//! conversion of the pod CIDR fields, field selectors, and the `proxy` subresource.

use serde_json::{Value, json};

use crate::apiserver::State;
use crate::apiserver::errors::ApiError;
use crate::apiserver::meta;
use crate::apiserver::strategy::{Strategy, Stream};

/// The strategy of nodes.
#[derive(Debug)]
pub(crate) struct Nodes;

impl Strategy for Nodes {
    /// The v1 conversion keeps the single and the list form of a node's pod CIDR in step.
    fn defaults(&self, obj: &mut Value) {
        let Some(spec) = obj.get_mut("spec").filter(|s| s.is_object()) else {
            return;
        };
        let single = spec
            .get("podCIDR")
            .and_then(Value::as_str)
            .filter(|c| !c.is_empty())
            .map(str::to_owned);
        let first = spec
            .pointer("/podCIDRs/0")
            .and_then(Value::as_str)
            .map(str::to_owned);
        match (single, first) {
            (Some(c), None) => spec["podCIDRs"] = json!([c]),
            (None, Some(c)) => spec["podCIDR"] = json!(c),
            _ => {}
        }
    }

    fn prepare_create(&self, _state: &State, obj: &mut Value) -> Result<(), ApiError> {
        taint_new_node_not_ready(obj);
        Ok(())
    }

    fn field_value(&self, obj: &Value, field: &str) -> String {
        match field {
            "spec.unschedulable" => meta::path_str(obj, field).unwrap_or_else(|| "false".into()),
            _ => meta::path_str(obj, field).unwrap_or_default(),
        }
    }

    fn stream(&self, sub: &str) -> Option<Stream> {
        (sub == "proxy").then_some(Stream::Node)
    }
}

/// The TaintNodesByCondition admission plugin: a node is created `not-ready` (NoSchedule)
/// until the node lifecycle controller sees its kubelet report Ready.
fn taint_new_node_not_ready(obj: &mut Value) {
    if let Some(taints) = node_taints_mut(obj)
        && !has_taint(taints, NOT_READY_TAINT, "NoSchedule")
    {
        taints.push(json!({"key": NOT_READY_TAINT, "effect": "NoSchedule"}));
    }
}

/// A node's `spec.taints`, made (empty) where missing.
pub(crate) fn node_taints_mut(node: &mut Value) -> Option<&mut Vec<Value>> {
    if !node.get("spec").is_some_and(Value::is_object) {
        node["spec"] = json!({});
    }
    match node["spec"]
        .as_object_mut()?
        .entry("taints")
        .or_insert_with(|| json!([]))
    {
        Value::Array(taints) => Some(taints),
        _ => None,
    }
}

/// Whether `taints` has one of `key` with `effect`.
pub(crate) fn has_taint(taints: &[Value], key: &str, effect: &str) -> bool {
    taints.iter().any(|t| {
        t.get("key").and_then(Value::as_str) == Some(key)
            && t.get("effect").and_then(Value::as_str) == Some(effect)
    })
}

/// The taint of a node whose kubelet is not (yet) Ready.
pub(crate) const NOT_READY_TAINT: &str = "node.kubernetes.io/not-ready";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_node_is_not_ready_and_keeps_its_pod_cidrs_in_step() {
        let state = State::for_tests();
        let mut node = json!({"metadata": {"name": "n"}, "spec": {"podCIDR": "10.0.1.0/24"}});
        Nodes.defaults(&mut node);
        assert_eq!(node["spec"]["podCIDRs"], json!(["10.0.1.0/24"]));
        Nodes.prepare_create(&state, &mut node).unwrap();
        assert!(has_taint(
            node["spec"]["taints"].as_array().unwrap(),
            NOT_READY_TAINT,
            "NoSchedule"
        ));
        Nodes.prepare_create(&state, &mut node).unwrap();
        assert_eq!(
            node["spec"]["taints"].as_array().unwrap().len(),
            1,
            "tainted once"
        );
        assert_eq!(Nodes.field_value(&node, "spec.unschedulable"), "false");
        assert_eq!(Nodes.stream("proxy"), Some(Stream::Node));
    }
}
