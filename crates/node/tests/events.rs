//! Events of the lower cluster about our pods show up on the upper pods, so `kubectl describe
//! pod` upstairs tells what happened downstairs; events of pods that are not ours do not.

use crate::common;
use crate::common::{eventually, pod, start};
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

/// A lower delete that fails is a Warning `ProviderDeleteFailed` on the upper pod, as
/// virtual-kubelet sends it; the delete is retried and completes once the lower cluster allows
/// it. The failure is an identity downstairs that may do everything the node does but delete
/// pods (an operator's RBAC mistake, on both backends).
#[tokio::test]
async fn a_lower_delete_that_fails_is_a_provider_delete_failed_warning_and_is_retried() {
    use k8s_openapi::api::authentication::v1::TokenRequest;
    use k8s_openapi::api::core::v1::ServiceAccount;
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
    use kube::api::{DeleteParams, Patch, PatchParams};

    let env = common::clusters().await;
    let (upper, lower) = (&env.clusters[0].client, &env.clusters[1].client);
    let pp = PostParams::default();
    let accounts: Api<ServiceAccount> = Api::namespaced(lower.clone(), "kube-system");
    accounts
        .create(
            &pp,
            &serde_json::from_value(json!({"metadata": {"name": "no-pod-delete"}})).unwrap(),
        )
        .await
        .unwrap();
    let all_but_delete = ["get", "list", "watch", "create", "update", "patch"];
    let core = [
        "namespaces",
        "configmaps",
        "secrets",
        "serviceaccounts",
        "serviceaccounts/token",
        "persistentvolumeclaims",
        "persistentvolumes",
        "services",
        "endpoints",
        "nodes",
        "events",
        "pods/status",
        "pods/log",
        "pods/exec",
        "pods/attach",
        "pods/portforward",
        "pods/ephemeralcontainers",
    ];
    let roles: Api<ClusterRole> = Api::all(lower.clone());
    roles
        .create(
            &pp,
            &serde_json::from_value(json!({
                "metadata": {"name": "no-pod-delete"},
                "rules": [
                    {"apiGroups": ["*"], "resources": ["*"], "verbs": ["get", "list", "watch"]},
                    {"apiGroups": [""], "resources": core, "verbs": ["*"]},
                    {"apiGroups": [""], "resources": ["pods"], "verbs": all_but_delete},
                ],
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    Api::<ClusterRoleBinding>::all(lower.clone())
        .create(
            &pp,
            &serde_json::from_value(json!({
                "metadata": {"name": "no-pod-delete"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "no-pod-delete"},
                "subjects": [{"kind": "ServiceAccount", "name": "no-pod-delete", "namespace": "kube-system"}],
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    let request: TokenRequest =
        serde_json::from_value(json!({"spec": {"audiences": [], "expirationSeconds": 3600}}))
            .unwrap();
    let token = accounts
        .create_token_request("no-pod-delete", &pp, &request)
        .await
        .unwrap()
        .status
        .unwrap()
        .token;
    let mut kubeconfig = kube::config::Kubeconfig::read_from(&env.clusters[1].kubeconfig).unwrap();
    for named in &mut kubeconfig.auth_infos {
        named.auth_info = Some(kube::config::AuthInfo {
            token: Some(token.clone().into()),
            ..Default::default()
        });
    }
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap();
    let stop =
        common::spawn_node_with(&env, "vk-lower", kube::Client::try_from(config).unwrap()).await;

    let pods: Api<Pod> = Api::namespaced(upper.clone(), "default");
    let lower_pods: Api<Pod> = Api::namespaced(lower.clone(), "default");
    let web = pods
        .create(&pp, &pod("web", "vk-lower", json!({})))
        .await
        .unwrap();
    eventually(60, "web Running", || async {
        (common::phase(&pods, "web").await.as_deref() == Some("Running")).then_some(())
    })
    .await;
    pods.delete("web", &DeleteParams::default()).await.unwrap();
    let events: Api<Event> = Api::namespaced(upper.clone(), "default");
    let failed = eventually(60, "ProviderDeleteFailed on the upper pod", || async {
        events_of(&events, web.metadata.uid.as_deref()?)
            .await
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("ProviderDeleteFailed"))
    })
    .await;
    assert_eq!(failed.type_.as_deref(), Some("Warning"));
    let message = failed.message.unwrap_or_default();
    assert!(
        message.contains("deleting the pod in lower cluster lower") && message.contains("403"),
        "{message}"
    );
    // Nothing is lost while the delete is refused: both pods are still there.
    assert!(lower_pods.get_opt("web").await.unwrap().is_some());
    assert!(pods.get_opt("web").await.unwrap().is_some());

    // Allowed again: the retried delete goes through and the upper pod's deletion finishes.
    roles
        .patch(
            "no-pod-delete",
            &PatchParams::default(),
            &Patch::Merge(json!({"rules": [
                {"apiGroups": ["*"], "resources": ["*"], "verbs": ["get", "list", "watch"]},
                {"apiGroups": [""], "resources": core, "verbs": ["*"]},
                {"apiGroups": [""], "resources": ["pods"], "verbs": ["*"]},
            ]})),
        )
        .await
        .unwrap();
    common::gone(&lower_pods, "web", 90, "the lower pod deleted once allowed").await;
    common::gone(&pods, "web", 60, "the upper pod's deletion finished").await;
    stop.cancel();
}
