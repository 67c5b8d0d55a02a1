//! Events of the lower cluster about our pods show up on the upper pods, so `kubectl describe
//! pod` upstairs tells what happened downstairs; events of pods that are not ours do not.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

mod common;

use common::{eventually, pod, start};
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;
use tensile_core::keys::{LABEL_OWNER, owner_label_value};

/// The upper events about the pod with `uid`.
async fn events_of(api: &Api<Event>, uid: &str) -> Vec<Event> {
    api.list(&ListParams::default().fields(&format!("involvedObject.uid={uid}")))
        .await
        .map(|l| l.items)
        .unwrap_or_default()
}

#[tokio::test]
async fn events_of_a_lower_pod_that_cannot_be_scheduled_show_up_on_the_upper_pod() {
    let (env, _stop) = start().await;
    let (upper, lower) = (&env.clusters[0].client, &env.clusters[1].client);
    let pp = PostParams::default();
    let pods: Api<Pod> = Api::namespaced(upper.clone(), "default");
    // A lower pod that is not ours, which cannot be scheduled either.
    let mut stranger = pod(
        "stranger",
        "",
        json!({"spec": {"containers": [{"name": "c", "image": "x", "resources": {"requests": {"cpu": "100"}}}]}}),
    );
    stranger.spec.as_mut().unwrap().node_name = None;
    Api::<Pod>::namespaced(lower.clone(), "default")
        .create(&pp, &stranger)
        .await
        .unwrap();

    let huge = pods
        .create(&pp, &pod("huge", "vk-lower", json!({"spec": {"containers": [{"name": "c", "image": "x", "resources": {"requests": {"cpu": "100"}}}]}})))
        .await
        .unwrap();
    let fits = pods
        .create(&pp, &pod("fits", "vk-lower", json!({})))
        .await
        .unwrap();
    let events: Api<Event> = Api::namespaced(upper.clone(), "default");
    let failed = eventually(30, "FailedScheduling on the upper pod", || async {
        events_of(&events, huge.metadata.uid.as_deref()?)
            .await
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("FailedScheduling"))
    })
    .await;
    assert_eq!(failed.type_.as_deref(), Some("Warning"));
    assert!(
        failed
            .message
            .as_deref()
            .unwrap()
            .contains("Insufficient cpu"),
        "{failed:?}"
    );
    assert_eq!(failed.involved_object.name.as_deref(), Some("huge"));
    assert_eq!(
        failed.reporting_component.as_deref(),
        Some("default-scheduler")
    );
    // `kubectl describe pod` shows the source: the lower cluster's scheduler, not the upper's.
    assert_eq!(
        failed.source.as_ref().and_then(|s| s.component.as_deref()),
        Some("lower/default-scheduler"),
        "{failed:?}"
    );
    assert_eq!(
        failed.metadata.labels.unwrap().get(LABEL_OWNER),
        Some(&owner_label_value("vk-lower"))
    );
    let scheduled = eventually(30, "Scheduled on the upper pod", || async {
        events_of(&events, fits.metadata.uid.as_deref()?)
            .await
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("Scheduled"))
    })
    .await;
    assert!(
        scheduled
            .message
            .as_deref()
            .unwrap()
            .starts_with("Successfully assigned default/fits to lower-node-"),
        "the real lower node is named: {scheduled:?}"
    );

    // Exactly one mirror per lower event, and none for the pod that is not ours (its event was
    // written before ours, so it has been seen by now).
    let all = events.list(&ListParams::default()).await.unwrap().items;
    assert!(
        all.iter()
            .all(|e| e.involved_object.name.as_deref() != Some("stranger"))
    );
    let huge_failures = all
        .iter()
        .filter(|e| {
            e.involved_object.uid == huge.metadata.uid
                && e.reason.as_deref() == Some("FailedScheduling")
        })
        .count();
    assert_eq!(huge_failures, 1);
}
