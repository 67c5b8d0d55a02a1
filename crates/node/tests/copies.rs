//! The ConfigMap and Secret controller end to end on simulated clusters: our lower copies
//! follow their upper originals, go when they go, and copies left without an original are
//! collected at start; lower objects that are not ours are never touched.

use std::time::Instant;

use crate::common;
use crate::common::{
    NodeOptions, clusters, eventually, gone, phase, pod, run_pod_spec, spawn, spawn_node,
};
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use kube::api::{Api, AttachParams, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use std::io::Write as _;
use tensile_core::keys::{ANNOTATION_GLOBAL, LABEL_OWNER, owner_label_value};
use tokio::io::AsyncReadExt;

fn config_map(name: &str, value: &str, labels: serde_json::Value) -> ConfigMap {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": labels},
        "data": {"k": value}
    }))
    .unwrap()
}

async fn data(api: &Api<ConfigMap>, name: &str) -> Option<String> {
    api.get_opt(name).await.ok()??.data?.get("k").cloned()
}

/// Upper: ConfigMap `cfg` and Secret `sec`, used by pod `web` on `vk-lower`; `theirs`, an
/// upper ConfigMap whose lower namesake was made by someone else, used by pod `blocked` (which
/// therefore waits). Returns once `web` runs.
async fn offloaded_with_dependencies(upper: &kube::Client, lower: &kube::Client) {
    let pp = PostParams::default();
    let up_cms: Api<ConfigMap> = Api::namespaced(upper.clone(), "default");
    up_cms
        .create(&pp, &config_map("cfg", "v1", json!({})))
        .await
        .unwrap();
    up_cms
        .create(&pp, &config_map("theirs", "upper", json!({})))
        .await
        .unwrap();
    Api::<ConfigMap>::namespaced(lower.clone(), "default")
        .create(&pp, &config_map("theirs", "lower", json!({})))
        .await
        .unwrap();
    Api::<Secret>::namespaced(upper.clone(), "default")
        .create(
            &pp,
            &serde_json::from_value(
                json!({"metadata": {"name": "sec"}, "stringData": {"k": "s1"}}),
            )
            .unwrap(),
        )
        .await
        .unwrap();
    // `theirs` is needed by a pod too, which therefore waits (a lower object that is not ours
    // is never used): the copy controller sees it needed and must still leave it.
    Api::<Pod>::namespaced(upper.clone(), "default")
        .create(
            &pp,
            &pod(
                "blocked",
                "vk-lower",
                json!({"spec": {"volumes": [{"name": "t", "configMap": {"name": "theirs"}}]}}),
            ),
        )
        .await
        .unwrap();
    run_pod(
        upper,
        "web",
        json!([
            {"name": "c", "configMap": {"name": "cfg"}},
            {"name": "s", "secret": {"secretName": "sec"}}
        ]),
    )
    .await;
    assert!(
        Api::<Pod>::namespaced(lower.clone(), "default")
            .get_opt("blocked")
            .await
            .unwrap()
            .is_none(),
        "a pod needing a lower object that is not ours is not created downstairs"
    );
}

/// Creates pod `name` with `volumes` on `vk-lower` and waits until it runs.
async fn run_pod(upper: &kube::Client, name: &str, volumes: serde_json::Value) {
    run_pod_spec(upper, name, json!({"volumes": volumes})).await;
}

#[tokio::test]
async fn checklist_73_fix_upper_config_map_and_secret_changes_reach_our_copies_only() {
    let env = clusters().await;
    let _node = spawn_node(&env, "vk-lower").await;
    let (upper, lower) = (&env.clusters[0].client, &env.clusters[1].client);
    offloaded_with_dependencies(upper, lower).await;
    let (up_cms, low_cms): (Api<ConfigMap>, Api<ConfigMap>) = (
        Api::namespaced(upper.clone(), "default"),
        Api::namespaced(lower.clone(), "default"),
    );
    assert_eq!(data(&low_cms, "cfg").await.as_deref(), Some("v1"));

    let merge = |v: serde_json::Value| Patch::Merge(v);
    up_cms
        .patch(
            "theirs",
            &PatchParams::default(),
            &merge(json!({"data": {"k": "changed"}})),
        )
        .await
        .unwrap();
    let changed = Instant::now();
    up_cms
        .patch(
            "cfg",
            &PatchParams::default(),
            &merge(json!({"data": {"k": "v2"}, "metadata": {"labels": {"tier": "1"}}})),
        )
        .await
        .unwrap();
    let copy = eventually(10, "the lower copy updated", || async {
        let c = low_cms.get("cfg").await.ok()?;
        (c.data.as_ref()?.get("k")? == "v2").then_some(c)
    })
    .await;
    eprintln!(
        "ConfigMap change reached the lower copy after {:?}",
        changed.elapsed()
    );
    let labels = copy.metadata.labels.unwrap();
    assert_eq!(labels.get("tier").map(String::as_str), Some("1"));
    assert_eq!(
        labels.get(LABEL_OWNER),
        Some(&owner_label_value("vk-lower")),
        "still marked ours"
    );
    assert_eq!(
        data(&low_cms, "theirs").await.as_deref(),
        Some("lower"),
        "a lower object that is not ours is never overwritten"
    );

    let (up_secrets, low_secrets): (Api<Secret>, Api<Secret>) = (
        Api::namespaced(upper.clone(), "default"),
        Api::namespaced(lower.clone(), "default"),
    );
    up_secrets
        .patch(
            "sec",
            &PatchParams::default(),
            &merge(json!({"stringData": {"k": "s2"}})),
        )
        .await
        .unwrap();
    eventually(10, "the lower secret updated", || async {
        let s = low_secrets.get("sec").await.ok()?;
        (s.data.as_ref()?.get("k")?.0 == b"s2").then_some(())
    })
    .await;
}

#[tokio::test]
async fn checklist_74_deleting_upper_originals_deletes_our_copies_only() {
    let env = clusters().await;
    let _node = spawn_node(&env, "vk-lower").await;
    let (upper, lower) = (&env.clusters[0].client, &env.clusters[1].client);
    offloaded_with_dependencies(upper, lower).await;
    let dp = DeleteParams::default();
    let up_cms: Api<ConfigMap> = Api::namespaced(upper.clone(), "default");
    up_cms.delete("theirs", &dp).await.unwrap();
    up_cms.delete("cfg", &dp).await.unwrap();
    Api::<Secret>::namespaced(upper.clone(), "default")
        .delete("sec", &dp)
        .await
        .unwrap();
    let low_cms: Api<ConfigMap> = Api::namespaced(lower.clone(), "default");
    let low_secrets: Api<Secret> = Api::namespaced(lower.clone(), "default");
    eventually(10, "both lower copies deleted", || async {
        (low_cms.get_opt("cfg").await.ok()?.is_none()
            && low_secrets.get_opt("sec").await.ok()?.is_none())
        .then_some(())
    })
    .await;
    assert_eq!(
        data(&low_cms, "theirs").await.as_deref(),
        Some("lower"),
        "deleting an upper object never deletes a lower one that is not ours"
    );
}

#[tokio::test]
async fn checklist_75_at_start_copies_without_an_original_or_a_pod_needing_them_are_collected_and_nothing_else()
 {
    let env = clusters().await;
    let (upper, lower) = (&env.clusters[0].client, &env.clusters[1].client);
    let pp = PostParams::default();
    let low_cms: Api<ConfigMap> = Api::namespaced(lower.clone(), "default");
    let up_cms: Api<ConfigMap> = Api::namespaced(upper.clone(), "default");
    let ours = json!({LABEL_OWNER: owner_label_value("vk-lower")});
    let mut orphan = config_map("orphan", "left", ours.clone());
    orphan.metadata.annotations = Some([(ANNOTATION_GLOBAL.to_owned(), "true".to_owned())].into());
    low_cms.create(&pp, &orphan).await.unwrap();
    // Both have originals; only `kept` is mounted by a pod of the node.
    for name in ["kept", "unneeded"] {
        low_cms
            .create(&pp, &config_map(name, name, ours.clone()))
            .await
            .unwrap();
        up_cms
            .create(&pp, &config_map(name, name, json!({})))
            .await
            .unwrap();
    }
    let pods: Api<Pod> = Api::namespaced(upper.clone(), "default");
    pods.create(
        &pp,
        &pod(
            "user",
            "vk-lower",
            json!({"spec": {"volumes": [{"name": "v", "configMap": {"name": "kept"}}]}}),
        ),
    )
    .await
    .unwrap();
    low_cms
        .create(&pp, &config_map("stranger", "x", json!({})))
        .await
        .unwrap();
    let other_node = json!({LABEL_OWNER: owner_label_value("vk-other")});
    low_cms
        .create(&pp, &config_map("other-nodes", "x", other_node))
        .await
        .unwrap();

    let _node = spawn_node(&env, "vk-lower").await;
    eventually(10, "the orphan and unneeded copies collected", || async {
        (low_cms.get_opt("orphan").await.ok()?.is_none()
            && low_cms.get_opt("unneeded").await.ok()?.is_none())
        .then_some(())
    })
    .await;
    eventually(30, "user Running", || async {
        (phase(&pods, "user").await? == "Running").then_some(())
    })
    .await;
    for name in ["kept", "stranger", "other-nodes"] {
        assert!(
            low_cms.get_opt(name).await.unwrap().is_some(),
            "{name} must stay"
        );
    }
}

#[tokio::test]
async fn a_copy_goes_when_its_last_pod_goes_and_comes_back_when_needed_again() {
    let env = clusters().await;
    let (upper, lower) = (&env.clusters[0].client, &env.clusters[1].client);
    let mut opts = NodeOptions::new("vk-lower");
    opts.metrics = true;
    let node = spawn(&env, opts).await;
    Api::<ConfigMap>::namespaced(upper.clone(), "default")
        .create(&PostParams::default(), &config_map("cfg", "v1", json!({})))
        .await
        .unwrap();
    let volumes = json!([{"name": "c", "configMap": {"name": "cfg"}}]);
    run_pod(upper, "a", volumes.clone()).await;
    run_pod(upper, "b", volumes.clone()).await;
    let low_cms: Api<ConfigMap> = Api::namespaced(lower.clone(), "default");
    let pods: Api<Pod> = Api::namespaced(upper.clone(), "default");
    let low_pods: Api<Pod> = Api::namespaced(lower.clone(), "default");
    pods.delete("a", &DeleteParams::default()).await.unwrap();
    gone(&low_pods, "a", 30, "lower pod a gone").await;
    assert!(
        low_cms.get_opt("cfg").await.unwrap().is_some(),
        "b still needs it"
    );
    pods.delete("b", &DeleteParams::default()).await.unwrap();
    gone(
        &low_cms,
        "cfg",
        30,
        "the copy goes with the last pod that needs it",
    )
    .await;
    run_pod(upper, "c", volumes).await;
    assert_eq!(data(&low_cms, "cfg").await.as_deref(), Some("v1"));
    // Every copy sync is timed: created, kept, deleted, created again.
    let (status, metrics) = tensile_testenv::http_get(node.metrics.unwrap(), "/metrics")
        .await
        .unwrap();
    assert_eq!(status, 200);
    let series = r#"tensile_pod_sync_seconds_count{stage="copy"}"#;
    assert!(
        tensile_testenv::metric_value(&metrics, series).is_some_and(|n| n >= 3.0),
        "{series} in\n{metrics}"
    );
    node.stop.cancel();
}

#[tokio::test]
async fn a_pods_config_maps_and_secrets_are_read_from_the_shared_watch_cache_not_fetched() {
    let env = clusters().await;
    let node = common::spawn(&env, common::NodeOptions::new("vk-lower")).await;
    let (upper, lower) = (&env.clusters[0].client, &env.clusters[1].client);
    offloaded_with_dependencies(upper, lower).await;
    // `blocked` retries its create while the lower `theirs` is in its way: it goes, so that
    // the lower creates counted below are the pods' of this test.
    let upper_pods: Api<Pod> = Api::namespaced(upper.clone(), "default");
    upper_pods
        .delete("blocked", &DeleteParams::default())
        .await
        .unwrap();
    gone(&upper_pods, "blocked", 30, "blocked deleted").await;
    // Changing the originals and seeing the copies follow proves the controller's upper
    // caches hold them (the copies are written from those caches).
    let merge = |v: serde_json::Value| Patch::Merge(v);
    Api::<ConfigMap>::namespaced(upper.clone(), "default")
        .patch(
            "cfg",
            &PatchParams::default(),
            &merge(json!({"data": {"k": "v2"}})),
        )
        .await
        .unwrap();
    Api::<Secret>::namespaced(upper.clone(), "default")
        .patch(
            "sec",
            &PatchParams::default(),
            &merge(json!({"stringData": {"k": "s2"}})),
        )
        .await
        .unwrap();
    let (low_cms, low_secrets): (Api<ConfigMap>, Api<Secret>) = (
        Api::namespaced(lower.clone(), "default"),
        Api::namespaced(lower.clone(), "default"),
    );
    eventually(10, "both copies updated", || async {
        let cm = data(&low_cms, "cfg").await? == "v2";
        let s = low_secrets.get("sec").await.ok()?.data?.get("k")?.0 == b"s2";
        (cm && s).then_some(())
    })
    .await;
    let gets = |resource: &str| {
        node.calls
            .count("upper", tensile_runtime::clients::Verb::Get, resource)
    };
    let before = (gets("configmaps"), gets("secrets"));
    run_pod(
        upper,
        "second",
        json!([
            {"name": "c", "configMap": {"name": "cfg"}},
            {"name": "s", "secret": {"secretName": "sec"}}
        ]),
    )
    .await;
    assert_eq!(
        (gets("configmaps"), gets("secrets")),
        before,
        "no upper GET for dependencies the watch cache holds"
    );
    // A dependency new downstairs is created once, by the first pod's plan: the second pod finds
    // our copy in the watch cache, and the copy controller does not race with a create of its own.
    let creates = || {
        node.calls.count(
            "lower",
            tensile_runtime::clients::Verb::Create,
            "configmaps",
        )
    };
    Api::<ConfigMap>::namespaced(upper.clone(), "default")
        .create(&PostParams::default(), &config_map("fresh", "f", json!({})))
        .await
        .unwrap();
    let before = creates();
    for name in ["third", "fourth"] {
        run_pod(
            upper,
            name,
            json!([{"name": "f", "configMap": {"name": "fresh"}}]),
        )
        .await;
    }
    assert_eq!(creates() - before, 1, "one create for two pods");
}

/// What `cat <path>` prints in pod `name`'s container, run through the upper cluster and the
/// virtual node's kubelet API in the lower pod.
async fn cat(pods: &Api<Pod>, name: &str, path: &str) -> Option<String> {
    let mut exec = pods
        .exec(name, ["cat", path], &AttachParams::default().stderr(false))
        .await
        .ok()?;
    let mut out = String::new();
    exec.stdout()?.read_to_string(&mut out).await.ok()?;
    Some(out)
}

#[tokio::test]
async fn a_config_map_update_reaches_the_lower_copy_and_the_pod_mounting_it_sees_the_new_data() {
    let env = clusters().await;
    let (upper, lower) = (&env.clusters[0].client, &env.clusters[1].client);
    let _node = spawn_node(&env, "vk-lower").await;
    let up_cms: Api<ConfigMap> = Api::namespaced(upper.clone(), "default");
    up_cms
        .create(&PostParams::default(), &config_map("cfg", "v1", json!({})))
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(upper.clone(), "default");
    run_pod_spec(
        upper,
        "reader",
        json!({
            "volumes": [{"name": "cfg", "configMap": {"name": "cfg"}}],
            "containers": [{"name": "c", "image": "nginx", "volumeMounts": [{"name": "cfg", "mountPath": "/etc/cfg"}]}],
        }),
    )
    .await;
    assert_eq!(
        cat(&pods, "reader", "/etc/cfg/k").await.as_deref(),
        Some("v1")
    );

    up_cms
        .patch(
            "cfg",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"k": "v2"}})),
        )
        .await
        .unwrap();
    let changed = Instant::now();
    let low_cms: Api<ConfigMap> = Api::namespaced(lower.clone(), "default");
    eventually(10, "the lower copy updated", || async {
        (data(&low_cms, "cfg").await? == "v2").then_some(())
    })
    .await;
    let copied = changed.elapsed();
    eventually(10, "the pod reads the new data", || async {
        (cat(&pods, "reader", "/etc/cfg/k").await? == "v2").then_some(())
    })
    .await;
    // Reported, not asserted (timing belongs to benchmarks): see with --no-capture.
    let _ = writeln!(std::io::stderr(), "upper update -> lower copy: {copied:?}");
    // A key that is not in the ConfigMap is no file: cat fails and says so.
    let missing = cat(&pods, "reader", "/etc/cfg/nope").await;
    assert_eq!(
        missing.as_deref(),
        Some("cat: /etc/cfg/nope: No such file or directory\n")
    );
}

/// A pod that waits for a mandatory ConfigMap or Secret missing upstairs runs as soon as it
/// appears, because the object's own watch (one per referenced object) sees it. Failed syncs
/// are retried only after an hour here, so neither pod can run by a retry within the test's
/// deadlines: only the appearance can start it.
#[tokio::test]
async fn a_pod_waiting_for_a_missing_config_map_or_secret_runs_as_soon_as_it_appears() {
    use k8s_openapi::api::core::v1::Event;
    use kube::api::ListParams;
    let env = clusters().await;
    let hour = std::time::Duration::from_secs(3600);
    let mut opts = NodeOptions::new("vk-lower");
    opts.retry = tensile_node::Retry {
        first: hour,
        max: hour,
    };
    let node = spawn(&env, opts).await;
    let upper = &env.clusters[0].client;
    let pods: Api<Pod> = Api::namespaced(upper.clone(), "default");
    let pp = PostParams::default();
    let on_volume = json!({"spec": {"volumes": [{"name": "v", "configMap": {"name": "late-cfg"}}],
        "containers": [{"name": "c", "image": "nginx:1.27", "volumeMounts": [{"name": "v", "mountPath": "/cfg"}]}]}});
    let on_env = json!({"spec": {"containers": [{"name": "c", "image": "nginx:1.27",
        "envFrom": [{"secretRef": {"name": "late-sec"}}]}]}});
    for (name, extra) in [("wants-cfg", on_volume), ("wants-sec", on_env)] {
        pods.create(&pp, &pod(name, "vk-lower", extra))
            .await
            .unwrap();
    }
    // Both tried and failed (the failure's event, and its status upstairs): the next retry is
    // an hour away.
    let events: Api<Event> = Api::namespaced(upper.clone(), "default");
    for name in ["wants-cfg", "wants-sec"] {
        eventually(30, &format!("{name} waiting"), || async {
            let failed = events
                .list(&ListParams::default())
                .await
                .ok()?
                .items
                .iter()
                .any(|e| {
                    e.involved_object.name.as_deref() == Some(name)
                        && e.reason.as_deref() == Some("ProviderCreateFailed")
                });
            let status = pods.get(name).await.ok()?.status?;
            (failed && status.reason.as_deref() == Some("ProviderFailed")).then_some(())
        })
        .await;
    }
    Api::<ConfigMap>::namespaced(upper.clone(), "default")
        .create(&pp, &config_map("late-cfg", "v", json!({})))
        .await
        .unwrap();
    eventually(
        60,
        "wants-cfg Running once its ConfigMap exists",
        || async { (phase(&pods, "wants-cfg").await? == "Running").then_some(()) },
    )
    .await;
    assert_eq!(phase(&pods, "wants-sec").await.as_deref(), Some("Pending"));
    let secret: Secret =
        serde_json::from_value(json!({"metadata": {"name": "late-sec"}, "stringData": {"k": "v"}}))
            .unwrap();
    Api::<Secret>::namespaced(upper.clone(), "default")
        .create(&pp, &secret)
        .await
        .unwrap();
    eventually(60, "wants-sec Running once its Secret exists", || async {
        (phase(&pods, "wants-sec").await? == "Running").then_some(())
    })
    .await;
    node.stop.cancel();
}
