//! Helpers shared by the simulated-cluster tests.
#![allow(dead_code, clippy::unwrap_used)] // test code

#[allow(unused_imports)] // not every test binary waits this way
pub use tensile_testenv::eventually;

/// A typed object from JSON.
pub fn from<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
    serde_json::from_value(v).unwrap()
}
