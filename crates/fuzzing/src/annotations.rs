//! Annotations and other small texts written by tenants (upstairs) or found on objects of a
//! lower cluster, and the rules that read them.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde_json::json;
use tensile_core::cluster_selector::ClusterSelector;
use tensile_core::keys;
use tensile_core::translate::{self, TranslateConfig};
use tensile_core::{deschedule, inject, lease, lower_token};

/// A pod `ns/p` with one container and `annotations`; labelled a virtual pod.
fn pod_with(annotations: BTreeMap<String, String>) -> Option<Pod> {
    serde_json::from_value(json!({
        "metadata": {"name": "p", "namespace": "ns", "uid": "u1",
            "labels": {"virtual-pod": "true"}, "annotations": annotations},
        "spec": {"containers": [{"name": "c", "image": "i"}],
            "nodeSelector": {"zone": "z1"}, "tolerations": [{"key": "k", "operator": "Exists"}]}
    }))
    .ok()
}

/// The `clusterSelector` annotation (UTF-8, as every annotation value). What decodes encodes
/// to text that decodes to the same encoding (the Go-compatible form is stable), and a pod
/// carrying it is mutated by the webhook and translated for its lower cluster without a
/// panic, the translation taking the selector's constraints.
pub fn cluster_selector(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let decoded = ClusterSelector::decode(text);
    if let Ok(selector) = &decoded {
        let encoded = selector.encode();
        match ClusterSelector::decode(&encoded) {
            Ok(again) => assert_eq!(
                again.encode(),
                encoded,
                "the encoding of {text:?} is not stable"
            ),
            Err(e) => panic_text(&format!("{encoded:?}, our encoding, does not decode: {e}")),
        }
    }
    let annotations = BTreeMap::from([(
        keys::ANNOTATION_CLUSTER_SELECTOR.to_owned(),
        text.to_owned(),
    )]);
    let Some(pod) = pod_with(annotations) else {
        return;
    };
    let mutated = inject::mutate(&pod, &inject::Mutation::default());
    assert_eq!(
        mutated.is_ok(),
        decoded.is_ok(),
        "the webhook and the codec disagree on {text:?}"
    );
    let lower = translate::lower_pod(&pod, &TranslateConfig::new("vk"));
    assert_eq!(
        lower.is_ok(),
        decoded.is_ok(),
        "the translation and the codec disagree on {text:?}"
    );
    if let (Ok(lower), Ok(selector)) = (lower, decoded) {
        let spec = lower.spec.unwrap_or_default();
        if !selector.node_selector.is_empty() {
            assert_eq!(
                spec.node_selector.as_ref(),
                Some(&selector.node_selector),
                "the lower pod lost the selector's nodeSelector"
            );
        }
    }
}

#[allow(
    clippy::panic,
    reason = "a fuzz target reports a failed property by panicking"
)]
fn panic_text(what: &str) -> ! {
    panic!("{what}")
}

/// The other texts from outside the product reads, each by the rule that reads it; the first
/// byte picks which, the rest (UTF-8) is the value:
///
/// 0. `tripped-labels` of a lower pod (JSON map), recovered as upper labels;
/// 1. `tensile-kube.io/synced-annotations` of a lower pod (comma-separated keys);
/// 2. `sigs.k8s.io/deschedule-count` of an upper pod;
/// 3. `tensile-kube.io/excluded-nodes` of an upper pod, through the webhook's mutation;
/// 4. an exclusions record of the descheduler (`node=until` lines), as the webhook and the
///    descheduler read it;
/// 5. a Lease's `holderIdentity` (another process's);
/// 6. a lower token's JWT payload (its claims);
/// 7. a move intent of the descheduler (JSON `Move`).
pub fn others(data: &[u8]) {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    let annotated = |key: &str| pod_with(BTreeMap::from([(key.to_owned(), text.to_owned())]));
    match which % 8 {
        0 => {
            let meta = ObjectMeta {
                labels: Some(BTreeMap::from([
                    ("app".to_owned(), "a".to_owned()),
                    (keys::LABEL_OWNER.to_owned(), "vk".to_owned()),
                ])),
                annotations: Some(BTreeMap::from([(
                    keys::ANNOTATION_TRIPPED_LABELS.to_owned(),
                    text.to_owned(),
                )])),
                ..ObjectMeta::default()
            };
            if let Ok(labels) = translate::recovered_labels(&meta) {
                assert!(labels.contains_key("app") || text.contains("app"));
            }
        }
        1 => {
            let meta = ObjectMeta {
                annotations: Some(BTreeMap::from([(
                    keys::ANNOTATION_SYNCED_ANNOTATIONS.to_owned(),
                    text.to_owned(),
                )])),
                ..ObjectMeta::default()
            };
            let synced = translate::synced_annotation_keys(&meta);
            assert!(synced.iter().all(|k| !k.is_empty() && !k.contains(',')));
        }
        2 => {
            if let Some(pod) = annotated(keys::ANNOTATION_DESCHEDULE_COUNT) {
                let attempts = deschedule::attempts(&pod);
                if let Ok(n) = text.trim().parse::<u32>() {
                    assert_eq!(attempts, n, "count {text:?} read as {attempts}");
                }
            }
        }
        3 => {
            if let Some(pod) = annotated(keys::ANNOTATION_EXCLUDED_NODES) {
                let excluded = inject::excluded_nodes(&pod);
                assert!(excluded.iter().all(|n| !n.is_empty() && n.trim() == n));
                let _ = inject::mutate(&pod, &inject::Mutation::default());
            }
        }
        4 => {
            let record: BTreeMap<String, String> = text
                .lines()
                .filter_map(|l| l.split_once('='))
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect();
            let now = Timestamp::UNIX_EPOCH + SignedDuration::from_hours(500_000);
            let excluded = deschedule::excluded_now(&record, now);
            assert!(excluded.iter().all(|n| record.contains_key(n)));
            let _ = deschedule::exclusions_cleanup(&record, now);
            let until = deschedule::exclusion_until(
                record.values().next().map(String::as_str),
                now,
                SignedDuration::from_mins(10),
            );
            assert!(until >= now, "an exclusion ends before it starts");
        }
        5 => {
            if let Some(holder) = lease::parse_holder(text) {
                assert!(!holder.name.is_empty() && !holder.host.is_empty());
                assert!(!holder.name.contains('_'));
            }
        }
        6 => {
            if let Some(claims) = lower_token::claims_of_payload(rest) {
                assert!(claims.expires > claims.issued);
                let life = lower_token::requested_seconds(&claims);
                assert!(life > 0, "a token's life read as {life} s");
                let at = lower_token::renewal_time(&claims, None);
                assert!(
                    (claims.issued..=claims.expires).contains(&at),
                    "renewal at {at}, outside the token's life"
                );
            }
        }
        _ => {
            if let Ok(m) = serde_json::from_str::<deschedule::Move>(text) {
                let again = serde_json::to_string(&m).ok();
                let back = again.and_then(|t| serde_json::from_str::<deschedule::Move>(&t).ok());
                assert_eq!(back.as_ref(), Some(&m), "a move does not round-trip");
            }
        }
    }
}
