//! The strategies of the kinds with behaviour of their own, one per kind (or family of
//! kinds), each named by its row in `resources::RESOURCES`. Kinds without behaviour use
//! `strategy::Plain` and have no code here.

pub(crate) mod core;
pub(crate) mod namespace;
pub(crate) mod node;
pub(crate) mod pod;
pub(crate) mod rbac;
pub(crate) mod review;
pub(crate) mod service;
pub(crate) mod volume;
pub(crate) mod workload;

use serde_json::Value;

/// Sets `key` of an object to `value` when absent or null (Go's zero-value defaulting).
pub(crate) fn set_default(map: &mut Value, key: &str, value: Value) {
    if let Some(m) = map.as_object_mut()
        && m.get(key).is_none_or(Value::is_null)
    {
        m.insert(key.to_owned(), value);
    }
}
