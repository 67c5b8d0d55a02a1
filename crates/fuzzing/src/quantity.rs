//! Resource quantities as tenants write them in pod specs (and lower clusters report them in
//! node status), and the resource arithmetic the extender, the capacity model and the node
//! status are built on.

use k8s_openapi::api::core::v1::Pod;
use serde_json::json;
use tensile_core::quantity::{QuantityError, parse_quantity};
use tensile_core::resources;

/// One quantity text (UTF-8). A quantity that parses prints a canonical form that parses to the
/// same value and prints the same again; a pod asking for it in every way a container can is
/// summed without a panic, and a request that fits in the sum is counted in it.
pub fn quantity(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let parsed = parse_quantity(text);
    if let Ok(q) = &parsed {
        let canonical = q.canonical();
        match parse_quantity(&canonical) {
            Ok(again) => {
                assert_eq!(
                    again.nanos, q.nanos,
                    "{text:?} -> {canonical:?} changed value"
                );
                // Stable from the second print on: a BinarySI value that is not a whole number
                // of its unit prints without a suffix, which reads back as DecimalSI and prints
                // with one ("1111312.5Ki" -> "1137984000" -> "1137984k"), as upstream's does.
                let twice = again.canonical();
                match parse_quantity(&twice) {
                    Ok(third) => assert_eq!(third.canonical(), twice, "{twice:?} is not canonical"),
                    Err(e) => panic_text(&format!(
                        "{canonical:?} printed as {twice:?}, which does not parse: {e}"
                    )),
                }
            }
            Err(e) => panic_text(&format!(
                "{text:?} printed as {canonical:?}, which does not parse: {e}"
            )),
        }
        let _ = (q.value(), q.milli_value(), q.to_quantity());
    }
    let pod: Option<Pod> = serde_json::from_value(json!({
        "metadata": {"name": "p", "namespace": "ns"},
        "spec": {
            "containers": [
                {"name": "a", "image": "i", "resources": {
                    "requests": {"cpu": text, "memory": "1Gi"},
                    "limits": {"example.com/gpu": text}}},
                {"name": "b", "image": "i", "resources": {"requests": {"cpu": text, "memory": text}}}
            ],
            "initContainers": [
                {"name": "s", "image": "i", "restartPolicy": "Always",
                    "resources": {"requests": {"cpu": text}}},
                {"name": "i", "image": "i", "resources": {"requests": {"memory": text}}}
            ],
            "overhead": {"cpu": text}
        }
    }))
    .ok();
    let Some(pod) = pod else {
        return;
    };
    // A quantity in an object is read as Go's `Quantity.UnmarshalJSON` reads it: trimmed.
    match (
        resources::pod_requests_with_pod(&pod),
        parse_quantity(text.trim()),
    ) {
        (Ok(_), Ok(_)) | (Err(resources::ResourceError::Overflow { .. }), Ok(_)) => {}
        // A pod's quantities have a narrower range than quantities in general.
        (Err(resources::ResourceError::InvalidPodQuantity { reason, .. }), Ok(_))
            if matches!(*reason, QuantityError::OutOfRange { .. }) => {}
        (Err(_), Err(_)) => {}
        (requests, parsed) => panic_text(&format!(
            "the pod's requests ({requests:?}) and the quantity ({parsed:?}) disagree on {text:?}"
        )),
    }
}

#[allow(
    clippy::panic,
    reason = "a fuzz target reports a failed property by panicking"
)]
fn panic_text(what: &str) -> ! {
    panic!("{what}")
}
