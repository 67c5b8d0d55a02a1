//! The descheduler against an upper cluster whose virtual node's lower cluster keeps refusing
//! pods: the "virtual node" is a plain Node labelled `type=virtual-kubelet`, and the test plays
//! its lower cluster (every pod bound to it is marked `PodScheduled=False/Unschedulable`, as the
//! virtual node mirrors the lower scheduler's condition) and its kubelet (a pod being deleted is
//! finished at once).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::collections::BTreeSet;
use std::sync::Arc;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use futures::TryStreamExt as _;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::{ConfigMap, Event, Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use serde_json::json;
use tensile_core::deschedule::Policy;
use tensile_placement::descheduler::{self, DeschedulerConfig, LABEL_MOVE, VALUE_EXCLUSIONS};
use tensile_placement::metrics::DeschedulerMetrics;
use tensile_placement::webhook::{Webhook, WebhookConfig};
use tensile_runtime::metrics::{Readiness, serve_probes};
use tensile_testenv::{ClusterSpec, TestEnv, eventually, http_get, metric_value};
use tokio_util::sync::CancellationToken;

const NODE: &str = "vk-refusing";

/// An upper cluster with the virtual node [`NODE`], whose lower cluster refuses every pod.
async fn refusing_cluster() -> (TestEnv, CancellationToken) {
    let env = TestEnv::start_with(vec![ClusterSpec::new("upper", 0)])
        .await
        .unwrap();
    let client = env.clusters[0].client.clone();
    let node: Node = serde_json::from_value(json!({"metadata": {"name": NODE,
        "labels": {"type": "virtual-kubelet", "kubernetes.io/hostname": NODE}}}))
    .unwrap();
    Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &node)
        .await
        .unwrap();
    let stop = CancellationToken::new();
    tokio::spawn(refuse_everything(client, stop.clone()));
    (env, stop)
}

/// The lower cluster and kubelet of [`NODE`]: every pod bound to it is Unschedulable, every pod
/// being deleted is gone at once.
async fn refuse_everything(client: kube::Client, stop: CancellationToken) {
    let pods: Api<Pod> = Api::all(client.clone());
    let events = watcher(
        pods,
        watcher::Config::default().fields(&format!("spec.nodeName={NODE}")),
    );
    let mut events = std::pin::pin!(events);
    loop {
        let event = tokio::select! {
            () = stop.cancelled() => return,
            e = events.try_next() => e,
        };
        let pod = match event {
            Ok(Some(watcher::Event::Apply(p) | watcher::Event::InitApply(p))) => p,
            Ok(Some(_)) => continue,
            Ok(None) => return,
            Err(_) => continue,
        };
        let ns = pod.metadata.namespace.clone().unwrap();
        let name = pod.metadata.name.clone().unwrap();
        let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
        if pod.metadata.deletion_timestamp.is_some() {
            let params = DeleteParams {
                grace_period_seconds: Some(0),
                preconditions: Some(kube::api::Preconditions {
                    uid: pod.metadata.uid.clone(),
                    resource_version: None,
                }),
                ..DeleteParams::default()
            };
            let _ = api.delete(&name, &params).await;
            continue;
        }
        let refused = pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| {
                c.iter()
                    .any(|c| c.reason.as_deref() == Some("Unschedulable"))
            });
        if !refused {
            let status = json!({"status": {"phase": "Pending", "conditions": [{
                "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                "message": "0/2 nodes are available: 2 Insufficient cpu.",
                "lastTransitionTime": k8s_openapi::jiff::Timestamp::now().to_string()}]}});
            let _ = api
                .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
                .await;
        }
    }
}

/// Starts a descheduler that moves pods Unschedulable for a second, at most `max_attempts`
/// times each.
fn start_descheduler(client: &kube::Client, max_attempts: u32) -> CancellationToken {
    start_counted(client, max_attempts, DeschedulerMetrics::default(), None)
}

/// [`start_descheduler`], counting in `metrics` and setting `readiness` once it has listed.
fn start_counted(
    client: &kube::Client,
    max_attempts: u32,
    metrics: DeschedulerMetrics,
    readiness: Option<Readiness>,
) -> CancellationToken {
    start_with(
        client,
        DeschedulerConfig {
            metrics,
            readiness,
            ..config(max_attempts)
        },
    )
}

/// The configuration of [`start_descheduler`].
fn config(max_attempts: u32) -> DeschedulerConfig {
    DeschedulerConfig {
        policy: Policy {
            unschedulable_for: k8s_openapi::jiff::SignedDuration::from_secs(1),
            max_attempts,
            ..Policy::default()
        },
        ..DeschedulerConfig::default()
    }
}

/// Runs a descheduler with `config` until the returned token is cancelled.
fn start_with(client: &kube::Client, config: DeschedulerConfig) -> CancellationToken {
    let stop = CancellationToken::new();
    let (client, token) = (client.clone(), stop.clone());
    tokio::spawn(async move { descheduler::run(config, client, token).await });
    stop
}

/// The Events with `reason` about pods whose name starts with `prefix`, by pod name.
async fn events(client: &kube::Client, reason: &str, prefix: &str) -> BTreeSet<String> {
    Api::<Event>::namespaced(client.clone(), "default")
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .filter_map(|e| e.involved_object.name)
        .filter(|n| n.starts_with(prefix))
        .collect()
}

fn count(pod: &Pod) -> Option<&str> {
    pod.metadata
        .annotations
        .as_ref()?
        .get("sigs.k8s.io/deschedule-count")
        .map(String::as_str)
}

/// A controller's pod without `virtual-pod=true` (so the webhook never counts its moves) used
/// to be deleted about every 30 s for ever. Its moves are counted across its replacements and
/// across a restart of the descheduler, and it stays after `max_attempts`.
#[tokio::test]
async fn a_controllers_pod_the_lower_cluster_keeps_refusing_moves_at_most_max_attempts_times() {
    let (env, lower) = refusing_cluster().await;
    let client = env.clusters[0].client.clone();
    let rs: ReplicaSet = serde_json::from_value(json!({"metadata": {"name": "stuck"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "stuck"}},
            "template": {"metadata": {"labels": {"app": "stuck"}},
                "spec": {"nodeName": NODE, "containers": [{"name": "c", "image": "nginx:1.27"}]}}}}))
    .unwrap();
    Api::<ReplicaSet>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &rs)
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let live = || async {
        let list = pods
            .list(&ListParams::default().labels("app=stuck"))
            .await
            .unwrap();
        list.items
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .collect::<Vec<_>>()
    };

    // Both runs count in one registry, served as `--metrics-addr` serves it.
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = DeschedulerMetrics::new(&mut registry);
    let readiness = Readiness::not_ready("starting");
    let probes = CancellationToken::new();
    let addr = serve_probes(
        "127.0.0.1:0".parse().unwrap(),
        Arc::new(registry),
        readiness.clone(),
        probes.clone(),
    )
    .await
    .unwrap();
    assert_eq!(http_get(addr, "/readyz").await.unwrap().0, 503);
    let first = start_counted(&client, 2, metrics.clone(), Some(readiness.clone()));
    eventually(30, "ready once listed", || async {
        (http_get(addr, "/readyz").await.ok()? == (200, "ok".to_owned())).then_some(())
    })
    .await;
    eventually(60, "the first replacement carries one move", || async {
        live()
            .await
            .iter()
            .any(|p| count(p) == Some("1"))
            .then_some(())
    })
    .await;
    // A restart forgets nothing: the count is on the pod.
    first.cancel();
    let second = start_counted(&client, 2, metrics, Some(readiness));
    let gave_up = eventually(60, "the descheduler gives up on the pod", || async {
        let told = events(&client, "DeschedulingGaveUp", "stuck-").await;
        (!told.is_empty()).then_some(told)
    })
    .await;
    // The count may reach the last pod a moment after the descheduler counted it as owed.
    let stays = eventually(30, "one pod left, its two moves counted", || async {
        let stays = live().await;
        (stays.len() == 1 && count(&stays[0]) == Some("2")).then_some(stays)
    })
    .await;
    assert!(gave_up.contains(stays[0].metadata.name.as_deref().unwrap()));
    eventually(30, "two moves recorded, on two pods", || async {
        (events(&client, "Rescheduled", "stuck-").await.len() == 2).then_some(())
    })
    .await;
    let (status, text) = http_get(addr, "/metrics").await.unwrap();
    assert_eq!(status, 200);
    assert_eq!(
        metric_value(&text, r#"tensile_descheduler_moves_total{via="owner"}"#),
        Some(2.0),
        "{text}"
    );
    assert_eq!(
        metric_value(&text, "tensile_descheduler_give_ups_total"),
        Some(1.0),
        "{text}"
    );
    probes.cancel();
    second.cancel();
    lower.cancel();
}

/// Before, when creating the replacement of a re-created pod failed after the delete, nothing
/// tried again until a restart. Here the create is refused (a webhook that fails closed) until
/// the refusal is lifted; the replacement then appears, with the same descheduler running.
#[tokio::test]
async fn a_refused_replacement_is_created_once_the_refusal_ends_without_a_restart() {
    let (env, lower) = refusing_cluster().await;
    let client = env.clusters[0].client.clone();
    // Fails every create of a descheduler's replacement: nothing listens at its address.
    let refuse: MutatingWebhookConfiguration = serde_json::from_value(json!({
        "metadata": {"name": "refuse-replacements"},
        "webhooks": [{"name": "refuse.tensile.test", "admissionReviewVersions": ["v1"],
            "sideEffects": "None", "failurePolicy": "Fail", "timeoutSeconds": 2,
            "clientConfig": {"url": "https://127.0.0.1:1/refuse"},
            "objectSelector": {"matchLabels": {"create-by-descheduler": "true"}},
            "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                "resources": ["pods"]}]}]}))
    .unwrap();
    let hooks: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    hooks.create(&PostParams::default(), &refuse).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let bare: Pod = serde_json::from_value(json!({"metadata": {"name": "lonely",
        "annotations": {"descheduler.alpha.kubernetes.io/evict": "true"}},
        "spec": {"nodeName": NODE, "containers": [{"name": "c", "image": "nginx:1.27"}]}}))
    .unwrap();
    let old = pods.create(&PostParams::default(), &bare).await.unwrap();

    let running = start_descheduler(&client, 3);
    eventually(60, "the replacement refused", || async {
        let failed = events(&client, "DeschedulingFailed", "lonely").await;
        let gone = pods
            .get_opt("lonely")
            .await
            .unwrap()
            .is_none_or(|p| p.metadata.uid != old.metadata.uid);
        (gone && !failed.is_empty()).then_some(())
    })
    .await;
    assert_eq!(pods.get_opt("lonely").await.unwrap(), None);
    let intents: Api<ConfigMap> = Api::namespaced(client.clone(), "kube-system");
    let selector = ListParams::default().labels(&format!("{LABEL_MOVE}=true"));
    assert_eq!(intents.list(&selector).await.unwrap().items.len(), 1);

    hooks
        .delete("refuse-replacements", &DeleteParams::default())
        .await
        .unwrap();
    let back = eventually(60, "the replacement created", || async {
        pods.get_opt("lonely").await.unwrap()
    })
    .await;
    assert_ne!(back.metadata.uid, old.metadata.uid);
    assert_eq!(count(&back), Some("1"));
    let ann = back.metadata.annotations.as_ref().unwrap();
    assert_eq!(ann["tensile-kube.io/excluded-nodes"], NODE);
    assert_eq!(
        back.metadata.labels.as_ref().unwrap()["create-by-descheduler"],
        "true"
    );
    eventually(30, "the intent removed", || async {
        intents
            .list(&selector)
            .await
            .unwrap()
            .items
            .is_empty()
            .then_some(())
    })
    .await;
    running.cancel();
    lower.cancel();
}

/// The webhook keeps no state, so it runs as many replicas as wanted. Before it deletes a moved
/// pod, the descheduler records in a ConfigMap that the pod's controller stays off the node; a
/// webhook started after the move keeps the controller's next pod off it, and the record goes
/// once the window has passed.
#[tokio::test]
async fn a_moved_workload_is_kept_off_the_node_by_a_webhook_started_after_the_move() {
    let (env, lower) = refusing_cluster().await;
    let client = env.clusters[0].client.clone();
    let rs: ReplicaSet = serde_json::from_value(json!({"metadata": {"name": "away"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "away"}},
            "template": {"metadata": {"labels": {"app": "away"}},
                "spec": {"nodeName": NODE, "containers": [{"name": "c", "image": "nginx:1.27"}]}}}}))
    .unwrap();
    let rs = Api::<ReplicaSet>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &rs)
        .await
        .unwrap();
    let rs_uid = rs.metadata.uid.unwrap();
    let window = std::time::Duration::from_secs(15);
    let moved_at = k8s_openapi::jiff::Timestamp::now();
    let running = start_with(
        &client,
        DeschedulerConfig {
            exclusion_window: window,
            ..config(1)
        },
    );
    let records: Api<ConfigMap> = Api::namespaced(client.clone(), "kube-system");
    let name = format!("tensile-exclusions-{rs_uid}");
    let record = eventually(60, "the exclusion recorded", || async {
        records
            .get_opt(&name)
            .await
            .unwrap()
            .filter(|cm| cm.data.as_ref().is_some_and(|d| d.contains_key(NODE)))
    })
    .await;
    assert_eq!(
        record.metadata.labels.as_ref().unwrap()[LABEL_MOVE],
        VALUE_EXCLUSIONS
    );
    let until: k8s_openapi::jiff::Timestamp = record.data.as_ref().unwrap()[NODE].parse().unwrap();
    assert!(
        until >= moved_at + k8s_openapi::jiff::SignedDuration::from_secs(15),
        "excluded until {until}, the window from the move"
    );

    // A webhook replica that never saw the move.
    let stop = CancellationToken::new();
    let webhook = Webhook::connected(WebhookConfig::default(), client.clone(), &stop).await;
    assert_eq!(webhook.excluded_for(&rs_uid), [NODE]);
    let next = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "away-next", "labels": {"virtual-pod": "true"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "away",
                "uid": rs_uid, "controller": true}]},
        "spec": {"containers": [{"name": "c", "image": "nginx:1.27"}]}});
    let review = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "r1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "namespace": "default", "operation": "CREATE", "object": next}});
    let answer = webhook
        .review(&serde_json::to_vec(&review).unwrap())
        .unwrap();
    let patch = answer["response"]["patch"].as_str().unwrap();
    let patch = String::from_utf8(B64.decode(patch).unwrap()).unwrap();
    assert!(
        patch.contains("NotIn") && patch.contains(NODE),
        "the next pod is kept off {NODE}: {patch}"
    );

    // The window passes: the record goes, and nothing is excluded any more.
    eventually(60, "the record removed after its window", || async {
        records
            .get_opt(&name)
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    assert!(
        k8s_openapi::jiff::Timestamp::now() >= until,
        "removed only once lapsed"
    );
    eventually(30, "the webhook forgets the exclusion", || async {
        webhook.excluded_for(&rs_uid).is_empty().then_some(())
    })
    .await;
    stop.cancel();
    running.cancel();
    lower.cancel();
}
