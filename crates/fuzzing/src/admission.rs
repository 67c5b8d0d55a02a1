//! The mutating webhook's AdmissionReview decoding, and what it does with the pod it decodes.

use std::sync::OnceLock;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use k8s_openapi::api::core::v1::Pod;
use serde_json::Value;
use tensile_core::inject::{self, Mutation};
use tensile_placement::webhook::{Webhook, WebhookConfig};

fn webhook() -> &'static Webhook {
    static WEBHOOK: OnceLock<Webhook> = OnceLock::new();
    WEBHOOK.get_or_init(|| Webhook::new(WebhookConfig::default()))
}

/// A review body as the API server would POST it. Whatever the webhook answers: a review
/// answered carries the request's uid; a patch applies to the pod as sent and turns it into
/// exactly the pod `inject::mutate` makes of it; a pod allowed without a patch is one the
/// webhook skips or one the mutation leaves as it is.
pub fn review(data: &[u8]) {
    let Ok(answer) = webhook().review(data) else {
        return;
    };
    let response = &answer["response"];
    // The webhook read a review, so the body is JSON; members it skips are not checked for
    // UTF-8 (the API server writes valid UTF-8 anyway), so they are read here as it would.
    let Ok(sent) = serde_json::from_str::<Value>(&String::from_utf8_lossy(data)) else {
        crate::fail("the webhook answered a body that is not JSON");
    };
    let request = &sent["request"];
    assert_eq!(
        response["uid"], request["uid"],
        "the answer is for another request"
    );
    if response["allowed"] != Value::Bool(true) {
        return;
    }
    let Ok(pod) = serde_json::from_value::<Pod>(request["object"].clone()) else {
        // Allowed without reading the pod: only an operation other than CREATE is.
        return assert!(
            request["operation"] != "CREATE" || response.get("patch").is_none(),
            "a pod that does not decode was patched"
        );
    };
    if request["operation"] != "CREATE" {
        return assert!(response.get("patch").is_none(), "only CREATEs are mutated");
    }
    let namespace = request["namespace"]
        .as_str()
        .filter(|n| !n.is_empty())
        .or(pod.metadata.namespace.as_deref())
        .unwrap_or("default");
    let skipped = inject::skip(&pod, namespace).is_some();
    let mutation = Mutation {
        ignore_keys: WebhookConfig::default().ignore_keys,
        selected_node: None,
        excluded_nodes: &[],
    };
    let expected = if skipped {
        pod.clone()
    } else {
        match inject::mutate(&pod, &mutation) {
            Ok(p) => p,
            Err(e) => crate::fail(&format!("allowed, but the mutation fails: {e}")),
        }
    };
    let Some(patch) = response["patch"].as_str() else {
        return assert_eq!(
            pod, expected,
            "allowed without a patch, but the pod changes"
        );
    };
    assert!(!skipped, "a pod the webhook skips was patched");
    let patch = BASE64
        .decode(patch)
        .ok()
        .and_then(|p| serde_json::from_slice::<json_patch::Patch>(&p).ok());
    let Some(patch) = patch else {
        crate::fail("the patch is not a base64 JSONPatch");
    };
    let mut patched = request["object"].clone();
    if let Err(e) = json_patch::patch(&mut patched, &patch) {
        crate::fail(&format!("the patch does not apply to the pod sent: {e}"));
    }
    match serde_json::from_value::<Pod>(patched) {
        Ok(p) => assert_eq!(p, expected, "the patched pod is not the mutated pod"),
        Err(e) => crate::fail(&format!("the patched pod is not a pod: {e}")),
    }
}
