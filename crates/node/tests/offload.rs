//! A lower cluster as one node of an upper cluster, end to end on simulated clusters.

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use tensile_testenv::{ClusterSpec, TestEnv};

use crate::common::{eventually, gone, phase, pod, spawn_node, spawn_node_with, start};

#[tokio::test]
async fn a_deployment_upstairs_runs_in_the_lower_cluster_and_reports_back() {
    let (env, stop) = start().await;
    let (upper, lower) = (&env.clusters[0].client, &env.clusters[1].client);
    let nodes: Api<Node> = Api::all(upper.clone());
    let node = eventually(30, "virtual node with capacity", || async {
        let n = nodes.get_opt("vk-lower").await.ok()??;
        let cpu = n.status.as_ref()?.capacity.as_ref()?.get("cpu")?.0.clone();
        (cpu == "8").then_some(n)
    })
    .await;
    assert_eq!(
        node.metadata.labels.as_ref().unwrap()["type"],
        "virtual-kubelet"
    );
    // The virtual node reports the lower cluster's version as its kubelet's.
    assert_eq!(
        node.status.unwrap().node_info.unwrap().kubelet_version,
        lower.apiserver_version().await.unwrap().git_version
    );

    let deployments: Api<Deployment> = Api::namespaced(upper.clone(), "default");
    deployments
        .create(&PostParams::default(), &serde_json::from_value(json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web"}, "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "web", "image": "nginx:1.27",
                "resources": {"requests": {"cpu": "100m"}}}]}}}})).unwrap())
        .await
        .unwrap();
    let upper_pods: Api<Pod> = Api::namespaced(upper.clone(), "default");
    let running = eventually(60, "3 upper pods running with lower IPs", || async {
        let list = upper_pods
            .list(&ListParams::default().labels("app=web"))
            .await
            .ok()?;
        let ok = list
            .items
            .iter()
            .filter(|p| {
                let s = p.status.as_ref();
                s.and_then(|s| s.phase.as_deref()) == Some("Running")
                    && s.and_then(|s| s.pod_ip.as_deref())
                        .is_some_and(|ip| ip.starts_with("10.244."))
            })
            .count();
        (ok == 3).then_some(list.items)
    })
    .await;
    for p in &running {
        assert_eq!(
            p.spec.as_ref().unwrap().node_name.as_deref(),
            Some("vk-lower")
        );
    }
    let lower_pods: Api<Pod> = Api::namespaced(lower.clone(), "default");
    let downstairs = lower_pods
        .list(&ListParams::default().labels("tensile-kube.io/owner=vk-lower"))
        .await
        .unwrap();
    assert_eq!(downstairs.items.len(), 3);
    for p in &downstairs.items {
        assert!(
            p.spec
                .as_ref()
                .unwrap()
                .node_name
                .as_deref()
                .unwrap()
                .starts_with("lower-node-")
        );
    }

    deployments
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    eventually(60, "pods gone in both clusters", || async {
        let u = upper_pods
            .list(&ListParams::default().labels("app=web"))
            .await
            .ok()?;
        let l = lower_pods
            .list(&ListParams::default().labels("tensile-kube.io/owner=vk-lower"))
            .await
            .ok()?;
        (u.items.is_empty() && l.items.is_empty()).then_some(())
    })
    .await;
    stop.cancel();
}

#[tokio::test]
async fn dependencies_go_first_updates_follow_and_kube_system_is_not_offloaded() {
    let (env, stop) = start().await;
    let (upper, lower) = (&env.clusters[0].client, &env.clusters[1].client);
    let cms: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(upper.clone(), "default");
    cms.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "settings"}, "data": {"a": "1"}}))
        .unwrap(),
    )
    .await
    .unwrap();
    let upper_pods: Api<Pod> = Api::namespaced(upper.clone(), "default");
    upper_pods
        .create(
            &PostParams::default(),
            &pod(
                "web",
                "vk-lower",
                json!({"spec": {"containers": [{"name": "c", "image": "nginx:1.27",
        "envFrom": [{"configMapRef": {"name": "settings"}}]}]}}),
            ),
        )
        .await
        .unwrap();
    eventually(30, "running", || async {
        (phase(&upper_pods, "web").await? == "Running").then_some(())
    })
    .await;
    let lower_cm: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(lower.clone(), "default");
    let copy = lower_cm.get("settings").await.unwrap();
    assert_eq!(copy.data.unwrap()["a"], "1");
    assert_eq!(
        copy.metadata.labels.unwrap()["tensile-kube.io/owner"],
        "vk-lower"
    );

    // An image change upstairs reaches the lower pod.
    upper_pods
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Strategic(
                json!({"spec": {"containers": [{"name": "c", "image": "nginx:1.28"}]}}),
            ),
        )
        .await
        .unwrap();
    let lower_pods: Api<Pod> = Api::namespaced(lower.clone(), "default");
    eventually(30, "image updated downstairs", || async {
        let p = lower_pods.get("web").await.ok()?;
        (p.spec?.containers[0].image.as_deref() == Some("nginx:1.28")).then_some(())
    })
    .await;

    let system: Api<Pod> = Api::namespaced(upper.clone(), "kube-system");
    system
        .create(&PostParams::default(), &pod("sys", "vk-lower", json!({})))
        .await
        .unwrap();
    let message = eventually(30, "not-offloaded condition", || {
        tensile_testenv::condition_message(
            &system,
            "sys",
            "tensile-kube.io/Offloaded",
            "NotOffloaded",
        )
    })
    .await;
    assert!(message.contains("kube-system"), "{message}");
    assert!(
        Api::<Pod>::namespaced(lower.clone(), "kube-system")
            .get_opt("sys")
            .await
            .unwrap()
            .is_none()
    );
    stop.cancel();
}

#[tokio::test]
async fn a_lower_pod_removed_without_grace_is_deleted_upstairs_and_one_lost_unseen_fails_the_upper_pod()
 {
    let (env, stop) = start().await;
    let (upper, lower) = (&env.clusters[0].client, &env.clusters[1].client);
    let upper_pods: Api<Pod> = Api::namespaced(upper.clone(), "default");
    let lower_pods: Api<Pod> = Api::namespaced(lower.clone(), "default");
    let graceless = DeleteParams {
        grace_period_seconds: Some(0),
        ..Default::default()
    };
    for name in ["seen", "unseen"] {
        upper_pods
            .create(&PostParams::default(), &pod(name, "vk-lower", json!({})))
            .await
            .unwrap();
        eventually(30, &format!("{name} running"), || async {
            (phase(&upper_pods, name).await? == "Running").then_some(())
        })
        .await;
    }

    // Removed without grace while the node watches: the API server still marks the pod
    // deleted (deletionTimestamp, grace 0) before removing it, so the node carries the
    // deletion upstairs as it does any lower deletion, and the pod's controller replaces it.
    lower_pods.delete("seen", &graceless).await.unwrap();
    gone(&upper_pods, "seen", 30, "the upper pod deleted").await;

    // Removed while the node is down: after its restart it finds the upper pod offloaded and
    // the lower pod gone, and fails the upper pod instead of leaving it Running.
    stop.cancel();
    lower_pods.delete("unseen", &graceless).await.unwrap();
    gone(&lower_pods, "unseen", 30, "the lower pod removed").await;
    let stop = spawn_node(&env, "vk-lower").await;
    let p = eventually(30, "upper pod failed", || async {
        let p = upper_pods.get("unseen").await.ok()?;
        (p.status.as_ref()?.phase.as_deref() == Some("Failed")).then_some(p)
    })
    .await;
    assert_eq!(p.status.unwrap().reason.as_deref(), Some("LowerPodLost"));
    stop.cancel();
}

#[tokio::test]
async fn a_restart_adopts_what_exists_and_two_nodes_share_a_lower_cluster() {
    let (env, first) = start().await;
    let upper = env.clusters[0].client.clone();
    let lower = env.clusters[1].client.clone();
    let upper_pods: Api<Pod> = Api::namespaced(upper.clone(), "default");
    // Pods of both nodes mount one ConfigMap: the second node uses the first one's copy of it
    // (the same upper object), which is not its own.
    let shared: serde_json::Value = serde_json::from_str(
        r#"{"spec": {"volumes": [{"name": "s", "configMap": {"name": "shared"}}],
            "containers": [{"name": "c", "image": "nginx:1.27",
                "volumeMounts": [{"name": "s", "mountPath": "/etc/shared"}]}]}}"#,
    )
    .unwrap();
    Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(upper.clone(), "default")
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "shared"}, "data": {"k": "v"}}))
                .unwrap(),
        )
        .await
        .unwrap();
    for i in 0..5 {
        upper_pods
            .create(
                &PostParams::default(),
                &pod(&format!("p{i}"), "vk-lower", shared.clone()),
            )
            .await
            .unwrap();
    }
    let lower_pods: Api<Pod> = Api::namespaced(lower.clone(), "default");
    let before = eventually(30, "5 lower pods", || async {
        let l = lower_pods
            .list(&ListParams::default().labels("tensile-kube.io/owner=vk-lower"))
            .await
            .ok()?;
        (l.items.len() == 5).then_some(l.items)
    })
    .await;
    // A second virtual node on the same lower cluster, and a restart of the first.
    let second = spawn_node(&env, "vk-other").await;
    upper_pods
        .create(&PostParams::default(), &pod("q0", "vk-other", shared))
        .await
        .unwrap();
    first.cancel();
    let again = spawn_node(&env, "vk-lower").await;
    eventually(30, "q0 offloaded by the second node", || async {
        (phase(&upper_pods, "q0").await? == "Running").then_some(())
    })
    .await;
    for i in 0..5 {
        eventually(30, "pods still running", || async {
            (phase(&upper_pods, &format!("p{i}")).await? == "Running").then_some(())
        })
        .await;
    }
    let after = lower_pods
        .list(&ListParams::default().labels("tensile-kube.io/owner=vk-lower"))
        .await
        .unwrap()
        .items;
    let uids = |v: &[Pod]| {
        let mut u: Vec<_> = v.iter().map(|p| p.metadata.uid.clone().unwrap()).collect();
        u.sort();
        u
    };
    assert_eq!(
        uids(&before),
        uids(&after),
        "no lower pod was deleted or duplicated by the restart"
    );
    let theirs = lower_pods
        .list(&ListParams::default().labels("tensile-kube.io/owner=vk-other"))
        .await
        .unwrap()
        .items;
    assert_eq!(theirs.len(), 1, "the other node's pod is untouched");
    second.cancel();
    again.cancel();
}

#[tokio::test]
async fn logs_and_exec_upstairs_reach_the_lower_pod() {
    use kube::api::{AttachParams, LogParams};
    let (env, stop) = start().await;
    let upper = &env.clusters[0].client;
    let upper_pods: Api<Pod> = Api::namespaced(upper.clone(), "default");
    running_web(&upper_pods, "echo hello from below; sleep 100000").await;
    let logs = upper_pods.logs("web", &LogParams::default()).await.unwrap();
    assert!(logs.contains("hello from below"), "{logs}");
    let mut exec = upper_pods
        .exec(
            "web",
            ["echo", "up", "and", "down"],
            &AttachParams::default().stderr(false),
        )
        .await
        .unwrap();
    let out = stdout_of(&mut exec).await;
    assert_eq!(out, "up and down\n");
    let status = exec.take_status().unwrap().await.unwrap();
    assert_eq!(status.status.as_deref(), Some("Success"));
    stop.cancel();
}

/// Pod `web` upstairs, bound to the virtual node, running `sh -c script`; once Running.
async fn running_web(upper_pods: &Api<Pod>, script: &str) {
    upper_pods
        .create(
            &PostParams::default(),
            &pod(
                "web",
                "vk-lower",
                json!({"spec": {"containers": [{"name": "c", "image": "nginx:1.27",
                    "command": ["sh", "-c", script]}]}}),
            ),
        )
        .await
        .unwrap();
    eventually(30, "running", || async {
        (phase(upper_pods, "web").await? == "Running").then_some(())
    })
    .await;
}

/// All an exec wrote on stdout.
async fn stdout_of(exec: &mut kube::api::AttachedProcess) -> String {
    use tokio::io::AsyncReadExt;
    let mut out = String::new();
    exec.stdout()
        .unwrap()
        .read_to_string(&mut out)
        .await
        .unwrap();
    out
}

/// `kubectl debug` upstairs: the ephemeral container added to the upper pod (through its
/// `ephemeralcontainers` subresource) is added to the lower pod, runs there, its status comes
/// back up, and its logs and exec go through the virtual node to it.
#[tokio::test]
async fn an_ephemeral_container_added_upstairs_runs_in_the_lower_pod_and_reports_back() {
    use kube::api::{AttachParams, LogParams};
    let (env, stop) = start().await;
    let (upper, lower) = (&env.clusters[0].client, &env.clusters[1].client);
    let upper_pods: Api<Pod> = Api::namespaced(upper.clone(), "default");
    let lower_pods: Api<Pod> = Api::namespaced(lower.clone(), "default");
    running_web(&upper_pods, "echo app; sleep 100000").await;
    upper_pods
        .patch_subresource(
            "ephemeralcontainers",
            "web",
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {"ephemeralContainers": [{
                "name": "dbg", "image": "busybox:1.36", "targetContainerName": "c",
                "command": ["sh", "-c", "echo hi from debug; sleep 100000"]}]}})),
        )
        .await
        .unwrap();
    let below = eventually(30, "the ephemeral container in the lower pod", || async {
        let p = lower_pods.get_opt("web").await.ok()??;
        let e = p.spec?.ephemeral_containers?;
        (e.len() == 1).then(|| e[0].clone())
    })
    .await;
    assert_eq!(below.name, "dbg");
    assert_eq!(below.image.as_deref(), Some("busybox:1.36"));
    assert_eq!(below.target_container_name.as_deref(), Some("c"));
    let status = eventually(30, "the ephemeral container's status upstairs", || async {
        let s = upper_pods.get_opt("web").await.ok()??.status?;
        let e = s.ephemeral_container_statuses?.into_iter().next()?;
        e.state.as_ref()?.running.as_ref()?;
        Some(e)
    })
    .await;
    assert_eq!(status.name, "dbg");
    assert_eq!(status.restart_count, 0);
    let logs = upper_pods
        .logs(
            "web",
            &LogParams {
                container: Some("dbg".into()),
                ..LogParams::default()
            },
        )
        .await
        .unwrap();
    assert!(logs.contains("hi from debug\n"), "{logs}");
    let mut exec = upper_pods
        .exec(
            "web",
            ["echo", "in", "the", "debugger"],
            &AttachParams::default().container("dbg").stderr(false),
        )
        .await
        .unwrap();
    let out = stdout_of(&mut exec).await;
    assert_eq!(out, "in the debugger\n");

    // A second one is added next to the first, which stays as it was.
    upper_pods
        .patch_subresource(
            "ephemeralcontainers",
            "web",
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {"ephemeralContainers": [{
                "name": "dbg2", "image": "busybox:1.36"}]}})),
        )
        .await
        .unwrap();
    eventually(
        30,
        "both ephemeral containers reported upstairs",
        || async {
            let s = upper_pods.get_opt("web").await.ok()??.status?;
            let mut names: Vec<String> = s
                .ephemeral_container_statuses?
                .into_iter()
                .map(|e| e.name)
                .collect();
            names.sort();
            (names == ["dbg", "dbg2"]).then_some(())
        },
    )
    .await;
    let lower_names: Vec<String> = lower_pods
        .get("web")
        .await
        .unwrap()
        .spec
        .unwrap()
        .ephemeral_containers
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(lower_names, ["dbg", "dbg2"]);
    stop.cancel();
}

/// The lower API server stops answering for 60 s: the virtual node stays Ready (so the upper
/// cluster evicts nothing), keeps its lease, says the lower cluster is unreachable and takes no
/// new pods (NoSchedule taint); afterwards it recovers by itself and offloading resumes.
#[tokio::test]
async fn checklist_19_fix_a_60_s_lower_cluster_outage_keeps_pods_and_the_lease_and_taints_the_node_until_it_is_back()
 {
    use k8s_openapi::api::coordination::v1::Lease;
    let (env, stop) = start().await;
    let upper = &env.clusters[0].client;
    let upper_pods: Api<Pod> = Api::namespaced(upper.clone(), "default");
    upper_pods
        .create(&PostParams::default(), &pod("web", "vk-lower", json!({})))
        .await
        .unwrap();
    eventually(30, "running", || async {
        (phase(&upper_pods, "web").await? == "Running").then_some(())
    })
    .await;
    let nodes: Api<Node> = Api::all(upper.clone());
    let leases: Api<Lease> = Api::namespaced(upper.clone(), "kube-node-lease");
    let condition = |n: &Node, type_: &str| {
        n.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == type_))
            .map(|c| c.status.clone())
    };
    let tainted = |n: &Node| {
        n.spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .is_some_and(|t| {
                t.iter()
                    .any(|t| t.key == "tensile-kube.io/lower-cluster-unreachable")
            })
    };
    let renewed = || async {
        leases
            .get("vk-lower")
            .await
            .ok()
            .and_then(|l| l.spec?.renew_time)
            .map(|t| t.0)
    };

    // An operator's taint (what `kubectl taint` writes: the whole list, ours included) must
    // outlive every taint change the node makes on its own.
    let mut taints = nodes
        .get("vk-lower")
        .await
        .unwrap()
        .spec
        .and_then(|s| s.taints)
        .unwrap_or_default();
    taints.push(k8s_openapi::api::core::v1::Taint {
        key: "dedicated".into(),
        value: Some("ops".into()),
        effect: "NoSchedule".into(),
        time_added: None,
    });
    nodes
        .patch(
            "vk-lower",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"taints": taints}})),
        )
        .await
        .unwrap();
    let operators = |n: &Node| {
        n.spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .is_some_and(|t| t.iter().any(|t| t.key == "dedicated"))
    };

    env.clusters[1].set_available(false);
    let outage = tokio::time::Instant::now();
    eventually(30, "node says the lower cluster is unreachable", || async {
        let n = nodes.get("vk-lower").await.ok()?;
        (condition(&n, "tensile-kube.io/LowerClusterReachable").as_deref() == Some("False")
            && tainted(&n))
        .then_some(())
    })
    .await;
    // Throughout the outage: Ready, tainted, the lease renewed, the pod Running upstairs.
    let mut last_renewal = renewed().await;
    let mut renewals = 0;
    while outage.elapsed() < Duration::from_secs(60) {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let n = nodes.get("vk-lower").await.unwrap();
        assert_eq!(
            condition(&n, "Ready").as_deref(),
            Some("True"),
            "the node stays Ready so the upper cluster evicts nothing ({:?} into the outage)",
            outage.elapsed()
        );
        assert!(
            tainted(&n),
            "the taint stays while the lower cluster is away"
        );
        assert_eq!(phase(&upper_pods, "web").await.as_deref(), Some("Running"));
        let now = renewed().await;
        if now != last_renewal {
            renewals += 1;
            last_renewal = now;
        }
    }
    assert!(
        renewals >= 5,
        "the lease is renewed during the outage ({renewals} renewals seen in 60 s)"
    );

    env.clusters[1].set_available(true);
    eventually(60, "node recovered", || async {
        let n = nodes.get("vk-lower").await.ok()?;
        (condition(&n, "tensile-kube.io/LowerClusterReachable").as_deref() == Some("True")
            && !tainted(&n))
        .then_some(())
    })
    .await;
    assert!(
        operators(&nodes.get("vk-lower").await.unwrap()),
        "the operator's taint survived the node's own taint changes"
    );
    upper_pods
        .create(&PostParams::default(), &pod("after", "vk-lower", json!({})))
        .await
        .unwrap();
    // Offloading resumes at once; the lower cluster's own scheduler and kubelets (simulated,
    // watching with client back-off like real ones) may take up to half a minute more.
    let lower_pods: Api<Pod> = Api::namespaced(env.clusters[1].client.clone(), "default");
    eventually(30, "the new pod created downstairs", || async {
        lower_pods.get_opt("after").await.ok()?.map(|_| ())
    })
    .await;
    eventually(120, "new pod runs after the outage", || async {
        (phase(&upper_pods, "after").await? == "Running").then_some(())
    })
    .await;
    assert_eq!(phase(&upper_pods, "web").await.as_deref(), Some("Running"));
    stop.cancel();
}

#[tokio::test]
async fn failures_are_reported_and_deletion_is_graceful_both_ways() {
    let (env, stop) = start().await;
    let (upper, lower) = (&env.clusters[0].client, &env.clusters[1].client);
    let upper_pods: Api<Pod> = Api::namespaced(upper.clone(), "default");
    // A mandatory Secret that does not exist: reported on the pod, retried, then fixed.
    upper_pods.create(&PostParams::default(), &pod("needs", "vk-lower", json!({"spec": {"volumes": [{"name": "s", "secret": {"secretName": "missing"}}],
        "containers": [{"name": "c", "image": "nginx", "volumeMounts": [{"name": "s", "mountPath": "/s"}]}]}}))).await.unwrap();
    let message = eventually(30, "ProviderFailed condition", || {
        tensile_testenv::condition_message(
            &upper_pods,
            "needs",
            "tensile-kube.io/Offloaded",
            "ProviderFailed",
        )
    })
    .await;
    assert!(
        message.contains("secret default/missing not found"),
        "{message}"
    );
    let secrets: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(upper.clone(), "default");
    secrets
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "missing"}, "stringData": {"k": "v"}}))
            .unwrap(),
        )
        .await
        .unwrap();
    eventually(60, "pod runs once the secret exists", || async {
        (phase(&upper_pods, "needs").await? == "Running").then_some(())
    })
    .await;

    // Unschedulable downstairs shows upstairs.
    upper_pods
        .create(
            &PostParams::default(),
            &pod(
                "huge",
                "vk-lower",
                json!({"spec": {"containers": [{"name": "c", "image": "nginx",
        "resources": {"requests": {"cpu": "64"}}}]}}),
            ),
        )
        .await
        .unwrap();
    eventually(30, "Unschedulable mirrored", || async {
        let c = upper_pods
            .get("huge")
            .await
            .ok()?
            .status?
            .conditions?
            .into_iter()
            .find(|c| c.type_ == "PodScheduled")?;
        (c.reason.as_deref() == Some("Unschedulable")).then_some(())
    })
    .await;

    // Deleting upstairs deletes downstairs and finishes.
    upper_pods
        .delete("needs", &DeleteParams::default())
        .await
        .unwrap();
    let lower_pods: Api<Pod> = Api::namespaced(lower.clone(), "default");
    eventually(60, "deleted in both clusters", || async {
        (upper_pods.get_opt("needs").await.ok()?.is_none()
            && lower_pods.get_opt("needs").await.ok()?.is_none())
        .then_some(())
    })
    .await;
    stop.cancel();
}

#[tokio::test]
async fn a_pod_deleted_upstairs_shows_a_terminal_phase_before_it_goes() {
    // What a Job with a pod failure policy waits for: its finalizer stays on a deleted pod
    // until the pod is Succeeded or Failed, as a kubelet makes it once the containers stop.
    let (env, stop) = start().await;
    let (upper, lower) = (&env.clusters[0].client, &env.clusters[1].client);
    let upper_pods: Api<Pod> = Api::namespaced(upper.clone(), "default");
    let lower_pods: Api<Pod> = Api::namespaced(lower.clone(), "default");
    let mut kept = pod(
        "kept",
        "vk-lower",
        json!({"spec": {"containers": [{"name": "c", "image": "nginx"}]}}),
    );
    kept.metadata.finalizers = Some(vec!["example.com/keep".into()]);
    upper_pods
        .create(&PostParams::default(), &kept)
        .await
        .unwrap();
    eventually(60, "kept Running", || async {
        (phase(&upper_pods, "kept").await? == "Running").then_some(())
    })
    .await;
    upper_pods
        .delete("kept", &DeleteParams::default().grace_period(1))
        .await
        .unwrap();
    let last = eventually(90, "lower pod gone, upper pod terminal", || async {
        let p = upper_pods.get_opt("kept").await.ok()??;
        let terminal = matches!(
            p.status.as_ref()?.phase.as_deref(),
            Some("Failed" | "Succeeded")
        );
        (terminal && lower_pods.get_opt("kept").await.ok()?.is_none()).then_some(p)
    })
    .await;
    let containers = last.status.unwrap().container_statuses.unwrap_or_default();
    assert!(
        containers
            .iter()
            .all(|c| !c.ready && c.state.as_ref().is_some_and(|s| s.terminated.is_some())),
        "every container terminated: {containers:?}"
    );
    // Its controller lets it go: the pod is gone.
    upper_pods
        .patch(
            "kept",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
    gone(
        &upper_pods,
        "kept",
        30,
        "kept gone once its finalizer is removed",
    )
    .await;
    stop.cancel();
}

#[tokio::test]
async fn a_restart_in_the_middle_of_a_200_pod_burst_loses_duplicates_and_deletes_nothing() {
    use futures::StreamExt;
    use kube::runtime::{WatchStreamExt, watcher};
    let (env, first) = start().await;
    let (upper, lower) = (
        env.clusters[0].client.clone(),
        env.clusters[1].client.clone(),
    );
    // Record every lower pod deletion for the whole test.
    let deleted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let watch = {
        let deleted = deleted.clone();
        let api: Api<Pod> = Api::namespaced(lower.clone(), "default");
        tokio::spawn(async move {
            let mut s = watcher(api, watcher::Config::default())
                .default_backoff()
                .boxed();
            while let Some(Ok(e)) = s.next().await {
                if matches!(e, watcher::Event::Delete(_)) {
                    deleted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }
            }
        })
    };
    let upper_pods: Api<Pod> = Api::namespaced(upper.clone(), "default");
    let creates = futures::stream::iter(0..200).for_each_concurrent(16, |i| {
        let api = upper_pods.clone();
        async move {
            api.create(
                &PostParams::default(),
                &pod(&format!("burst-{i}"), "vk-lower", json!({})),
            )
            .await
            .unwrap();
        }
    });
    let lower_pods: Api<Pod> = Api::namespaced(lower.clone(), "default");
    let restart = async {
        eventually(60, "the burst under way downstairs", || async {
            let n = lower_pods
                .list(&ListParams::default().labels("tensile-kube.io/owner=vk-lower"))
                .await
                .ok()?
                .items
                .len();
            (n >= 20).then_some(())
        })
        .await;
        first.cancel();
        spawn_node(&env, "vk-lower").await
    };
    let ((), second) = tokio::join!(creates, restart);
    eventually(120, "all 200 running upstairs", || async {
        let list = upper_pods.list(&ListParams::default()).await.ok()?;
        let running = list
            .items
            .iter()
            .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
            .count();
        (running == 200).then_some(())
    })
    .await;
    let lower_list = lower_pods
        .list(&ListParams::default().labels("tensile-kube.io/owner=vk-lower"))
        .await
        .unwrap()
        .items;
    assert_eq!(lower_list.len(), 200);
    let upper_uids: std::collections::BTreeSet<String> = upper_pods
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|p| p.metadata.uid)
        .collect();
    let recorded: std::collections::BTreeSet<String> = lower_list
        .iter()
        .filter_map(|p| {
            p.metadata
                .annotations
                .as_ref()?
                .get("tensile-kube.io/upper-uid")
                .cloned()
        })
        .collect();
    assert_eq!(
        recorded, upper_uids,
        "one lower pod per upper pod, each for the right upper pod"
    );
    assert_eq!(
        deleted.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "no lower pod was deleted"
    );
    watch.abort();
    second.cancel();
}

#[tokio::test]
async fn a_burst_in_one_namespace_creates_it_once_and_a_deleted_lower_namespace_comes_back() {
    use k8s_openapi::api::core::v1::Namespace;
    use tensile_runtime::clients::{ApiCallLabels, ApiCalls, KubeconfigSource, Verb, build_client};
    let env = TestEnv::start_with(vec![
        ClusterSpec::new("upper", 0),
        ClusterSpec::new("lower", 2),
    ])
    .await
    .unwrap();
    let mut registry = prometheus_client::registry::Registry::default();
    let calls = ApiCalls::new(&mut registry);
    // The node reaches the lower cluster through a proxy that fails a share of the requests
    // during the burst (429 and 500 in turn): failed pod creations must not make the node
    // create the namespace again.
    let errors = env.clusters[1]
        .error_proxy(&env.dir().join("lower-errors.kubeconfig"))
        .await
        .unwrap();
    let text = std::fs::read_to_string(errors.kubeconfig()).unwrap();
    let lower_counted = build_client(KubeconfigSource::Text(text), 1000.0, 1000, "lower", &calls)
        .await
        .unwrap();
    let stop = spawn_node_with(&env, "vk-lower", lower_counted).await;
    let (upper, lower) = (
        env.clusters[0].client.clone(),
        env.clusters[1].client.clone(),
    );
    let ns: Namespace = serde_json::from_value(
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}}),
    )
    .unwrap();
    Api::<Namespace>::all(upper.clone())
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    let upper_pods: Api<Pod> = Api::namespaced(upper.clone(), "team-a");
    let lower_pods: Api<Pod> = Api::namespaced(lower.clone(), "team-a");
    errors.set_error_share(0.2);
    for i in 0..40 {
        upper_pods
            .create(
                &PostParams::default(),
                &pod(&format!("p-{i}"), "vk-lower", json!({})),
            )
            .await
            .unwrap();
    }
    eventually(120, "40 lower pods", || async {
        let n = lower_pods
            .list(&ListParams::default())
            .await
            .ok()?
            .items
            .len();
        (n == 40).then_some(())
    })
    .await;
    errors.set_error_share(0.0);
    let failed = errors.counts();
    assert!(
        failed.too_many + failed.internal >= 5,
        "the proxy failed too few requests to tell: {failed:?}"
    );
    let namespace_creates = calls
        .snapshot()
        .into_iter()
        .filter(|(l, _): &(ApiCallLabels, u64)| {
            l.verb == Verb::Create && l.resource == "namespaces"
        })
        .map(|(_, c)| c)
        .sum::<u64>();
    // One, and one more per creation of it that failed; never one per failed pod.
    assert!(
        (1..=8).contains(&namespace_creates),
        "{namespace_creates} namespace creations for 40 pods"
    );
    // One watch of lower pods, shared by the pod controller and the capacity tracker.
    let pod_lists = calls
        .snapshot()
        .into_iter()
        .filter(|(l, _)| l.verb == Verb::List && l.resource == "pods")
        .map(|(_, c)| c)
        .sum::<u64>();
    assert_eq!(
        pod_lists, 1,
        "lower pods listed once, by the one shared watch"
    );

    // The lower namespace goes away (someone deleted it downstairs); the next pod brings it back.
    upper_pods
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await
        .unwrap();
    eventually(120, "the lower pods gone", || async {
        lower_pods
            .list(&ListParams::default())
            .await
            .ok()?
            .items
            .is_empty()
            .then_some(())
    })
    .await;
    let lower_ns: Api<Namespace> = Api::all(lower.clone());
    lower_ns
        .delete("team-a", &DeleteParams::default())
        .await
        .unwrap();
    gone(&lower_ns, "team-a", 60, "the lower namespace gone").await;
    upper_pods
        .create(&PostParams::default(), &pod("after", "vk-lower", json!({})))
        .await
        .unwrap();
    eventually(
        120,
        "the pod running after its lower namespace was recreated",
        || async {
            (phase(&upper_pods, "after").await.as_deref() == Some("Running")).then_some(())
        },
    )
    .await;
    stop.cancel();
}

/// A pod placed upstairs by a scheduler the lower cluster does not run is scheduled downstairs
/// by the lower cluster's default scheduler; a pod may name another.
#[tokio::test]
async fn a_pod_of_a_custom_upper_scheduler_runs_through_the_lower_default_scheduler() {
    let (env, stop) = start().await;
    let (upper, lower) = (&env.clusters[0].client, &env.clusters[1].client);
    let upper_pods: Api<Pod> = Api::namespaced(upper.clone(), "default");
    let lower_pods: Api<Pod> = Api::namespaced(lower.clone(), "default");
    // Nothing upstairs runs "my-scheduler", so the pod is bound here as that scheduler would.
    upper_pods
        .create(
            &PostParams::default(),
            &pod(
                "custom",
                "vk-lower",
                json!({"spec": {"schedulerName": "my-scheduler"}}),
            ),
        )
        .await
        .unwrap();
    eventually(60, "custom Running upstairs", || async {
        (phase(&upper_pods, "custom").await? == "Running").then_some(())
    })
    .await;
    let below = lower_pods.get("custom").await.unwrap();
    let spec = below.spec.unwrap();
    assert_eq!(spec.scheduler_name.as_deref(), Some("default-scheduler"));
    assert!(
        spec.node_name
            .as_deref()
            .is_some_and(|n| n.starts_with("lower-node-")),
        "{:?}",
        spec.node_name
    );
    let upper_spec = upper_pods.get("custom").await.unwrap().spec.unwrap();
    assert_eq!(upper_spec.scheduler_name.as_deref(), Some("my-scheduler"));

    // The opt-in annotation names the lower scheduler (none runs by that name here: the lower
    // pod waits for it, as any pod of that scheduler would in that cluster).
    upper_pods
        .create(
            &PostParams::default(),
            &pod(
                "named",
                "vk-lower",
                json!({"metadata": {"annotations": {
                    "tensile-kube.io/lower-scheduler-name": "lower-batch-scheduler"}},
                    "spec": {"schedulerName": "my-scheduler"}}),
            ),
        )
        .await
        .unwrap();
    let below = eventually(60, "named created downstairs", || async {
        lower_pods.get_opt("named").await.ok()?
    })
    .await;
    let spec = below.spec.unwrap();
    assert_eq!(
        spec.scheduler_name.as_deref(),
        Some("lower-batch-scheduler")
    );
    assert_eq!(spec.node_name, None);
    stop.cancel();
}

/// An offloaded pod's containers see the upper pod's identity through env `fieldRef`s (its UID,
/// the virtual node as its node, its labels without our marks), and the truth of where it runs
/// for its IP.
#[tokio::test]
async fn downward_api_env_of_an_offloaded_pod_is_the_upper_pods_identity() {
    use kube::api::AttachParams;
    use std::collections::BTreeMap;
    let (env, stop) = start().await;
    let (upper, lower) = (&env.clusters[0].client, &env.clusters[1].client);
    let upper_pods: Api<Pod> = Api::namespaced(upper.clone(), "default");
    let lower_pods: Api<Pod> = Api::namespaced(lower.clone(), "default");
    let field = |name: &str, path: &str| json!({"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}});
    upper_pods
        .create(
            &PostParams::default(),
            &pod(
                "ident",
                "vk-lower",
                json!({
                    "metadata": {"labels": {"pod-group.scheduling.sigs.k8s.io": "pg-1"}},
                    "spec": {"containers": [{"name": "c", "image": "nginx:1.27", "env": [
                        field("UID", "metadata.uid"),
                        field("NODE", "spec.nodeName"),
                        field("APP", "metadata.labels['app']"),
                        field("GROUP", "metadata.labels['pod-group.scheduling.sigs.k8s.io']"),
                        field("VIRTUAL", "metadata.labels['virtual-pod']"),
                        field("SA", "spec.serviceAccountName"),
                        field("NAME", "metadata.name"),
                        field("NS", "metadata.namespace"),
                        field("IP", "status.podIP"),
                    ]}]}
                }),
            ),
        )
        .await
        .unwrap();
    let running = eventually(30, "ident Running upstairs with its IP", || async {
        let p = upper_pods.get_opt("ident").await.ok()??;
        let status = p.status.as_ref()?;
        (status.phase.as_deref() == Some("Running") && status.pod_ip.is_some()).then_some(p)
    })
    .await;
    let copy = lower_pods.get("ident").await.unwrap();
    assert_ne!(
        copy.metadata.uid, running.metadata.uid,
        "the copy is another object"
    );

    let mut exec = upper_pods
        .exec("ident", ["env"], &AttachParams::default().stderr(false))
        .await
        .unwrap();
    let out = stdout_of(&mut exec).await;
    let status = exec.take_status().unwrap().await.unwrap();
    assert_eq!(status.status.as_deref(), Some("Success"), "{status:?}");
    let seen: BTreeMap<&str, &str> = out.lines().filter_map(|l| l.split_once('=')).collect();
    let spec = running.spec.as_ref().unwrap();
    let want = [
        ("UID", running.metadata.uid.clone().unwrap()),
        ("NODE", "vk-lower".to_owned()),
        ("APP", "ident".to_owned()),
        ("GROUP", "pg-1".to_owned()),
        ("VIRTUAL", String::new()),
        ("SA", spec.service_account_name.clone().unwrap()),
        ("NAME", "ident".to_owned()),
        ("NS", "default".to_owned()),
        // Where the pod really runs: the lower pod's IP, which is also the upper pod's.
        (
            "IP",
            running.status.as_ref().unwrap().pod_ip.clone().unwrap(),
        ),
    ];
    for (name, value) in &want {
        assert_eq!(seen.get(name), Some(&value.as_str()), "{name} in:\n{out}");
    }
    assert_eq!(
        copy.status.as_ref().and_then(|s| s.pod_ip.as_deref()),
        seen.get("IP").copied()
    );
    stop.cancel();
}

/// Creates pod `name` on `vk-lower` (the default pod merged with `extra`) and waits until it
/// is Running upstairs.
async fn create_running(pods: &Api<Pod>, name: &str, extra: serde_json::Value) -> Pod {
    pods.create(&PostParams::default(), &pod(name, "vk-lower", extra))
        .await
        .unwrap();
    eventually(60, &format!("{name} Running upstairs"), || async {
        let p = pods.get_opt(name).await.ok()??;
        (p.status.as_ref()?.phase.as_deref() == Some("Running")).then_some(p)
    })
    .await
}

/// Runs `argv` in upper pod `name` and returns its stdout (the command must succeed).
async fn exec_out(pods: &Api<Pod>, name: &str, argv: &[&str]) -> String {
    let mut exec = pods
        .exec(
            name,
            argv.iter().copied(),
            &kube::api::AttachParams::default().stderr(false),
        )
        .await
        .unwrap();
    let out = stdout_of(&mut exec).await;
    let status = exec.take_status().unwrap().await.unwrap();
    assert_eq!(
        status.status.as_deref(),
        Some("Success"),
        "{argv:?}: {status:?}"
    );
    out
}

/// `status` of a TokenReview of `token` for `audiences` in `cluster`.
async fn token_review(
    cluster: &kube::Client,
    token: &str,
    audiences: &[&str],
) -> serde_json::Value {
    use k8s_openapi::api::authentication::v1::TokenReview;
    let review: TokenReview = serde_json::from_value(json!({
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
        "spec": {"token": token, "audiences": audiences}
    }))
    .unwrap();
    let done = Api::<TokenReview>::all(cluster.clone())
        .create(&PostParams::default(), &review)
        .await
        .unwrap();
    serde_json::to_value(done.status).unwrap()
}

/// An offloaded pod's default token volume holds a token the upper cluster issued for the upper
/// pod (a TokenReview upstairs authenticates it as the pod's ServiceAccount; the lower cluster
/// does not know it), with the upper CA; an explicit projection gets its own audience; the
/// containers' KUBERNETES_SERVICE_* name the upper API server; a due token is replaced; the
/// Secret goes with the pod.
#[tokio::test]
async fn an_offloaded_pods_token_is_the_upper_clusters_for_its_service_account() {
    use k8s_openapi::api::core::v1::{ConfigMap, Secret};
    use tensile_core::keys::ANNOTATION_TOKEN_REFRESH_AT;
    const SA_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
    let (env, stop) = start().await;
    let (upper, lower) = (&env.clusters[0].client, &env.clusters[1].client);
    let upper_pods: Api<Pod> = Api::namespaced(upper.clone(), "default");
    let lower_pods: Api<Pod> = Api::namespaced(lower.clone(), "default");
    let lower_secrets: Api<Secret> = Api::namespaced(lower.clone(), "default");
    let running = create_running(
        &upper_pods,
        "whoami",
        json!({"spec": {
            "containers": [{"name": "c", "image": "nginx:1.27", "volumeMounts": [
                {"name": "vault", "mountPath": "/var/run/secrets/vault", "readOnly": true}]}],
            "volumes": [{"name": "vault", "projected": {"sources": [
                {"serviceAccountToken": {"path": "token", "audience": "vault", "expirationSeconds": 600}}]}}]
        }}),
    )
    .await;
    let upper_uid = running.metadata.uid.clone().unwrap();
    let secret_name = format!("tensile-identity-{upper_uid}");

    // The lower pod mounts our Secret where the upper pod mounts its token volume.
    let copy = lower_pods.get("whoami").await.unwrap();
    let copy_volumes = serde_json::to_string(&copy.spec.as_ref().unwrap().volumes).unwrap();
    assert!(copy_volumes.contains(&secret_name), "{copy_volumes}");
    assert!(
        !copy_volumes.contains("serviceAccountToken"),
        "{copy_volumes}"
    );
    // Made before the pod, without an owner reference: we delete it ourselves.
    let secret = lower_secrets.get(&secret_name).await.unwrap();
    assert_eq!(secret.metadata.owner_references, None);
    assert!(secret.metadata.creation_timestamp <= copy.metadata.creation_timestamp);

    // The default token: the upper cluster's, for the pod's ServiceAccount, bound to the pod.
    let token = exec_out(&upper_pods, "whoami", &["cat", &format!("{SA_DIR}/token")]).await;
    let review = token_review(upper, token.trim(), &[]).await;
    assert_eq!(review["authenticated"], json!(true), "{review}");
    assert_eq!(
        review["user"]["username"],
        json!("system:serviceaccount:default:default"),
        "{review}"
    );
    assert_eq!(
        review["user"]["extra"]["authentication.kubernetes.io/pod-name"],
        json!(["whoami"]),
        "{review}"
    );
    let downstairs = token_review(lower, token.trim(), &[]).await;
    assert_ne!(downstairs["authenticated"], json!(true), "{downstairs}");

    // The upper CA and the namespace beside it.
    let ca = exec_out(&upper_pods, "whoami", &["cat", &format!("{SA_DIR}/ca.crt")]).await;
    let upper_ca = Api::<ConfigMap>::namespaced(upper.clone(), "default")
        .get("kube-root-ca.crt")
        .await
        .unwrap();
    assert_eq!(Some(&ca), upper_ca.data.as_ref().unwrap().get("ca.crt"));
    let ns = exec_out(
        &upper_pods,
        "whoami",
        &["cat", &format!("{SA_DIR}/namespace")],
    )
    .await;
    assert_eq!(ns, "default");

    // The explicit projection: its own audience, and nothing else.
    let vault = exec_out(
        &upper_pods,
        "whoami",
        &["cat", "/var/run/secrets/vault/token"],
    )
    .await;
    assert_ne!(vault, token);
    let for_vault = token_review(upper, vault.trim(), &["vault"]).await;
    assert_eq!(for_vault["authenticated"], json!(true), "{for_vault}");
    let for_api = token_review(upper, vault.trim(), &[]).await;
    assert_ne!(for_api["authenticated"], json!(true), "{for_api}");

    // In-cluster configuration reaches the upper API server.
    let upper_server = kube::config::Kubeconfig::read_from(&env.clusters[0].kubeconfig)
        .unwrap()
        .clusters[0]
        .cluster
        .as_ref()
        .unwrap()
        .server
        .clone()
        .unwrap();
    let env_out = exec_out(&upper_pods, "whoami", &["env"]).await;
    let host = env_out
        .lines()
        .find_map(|l| l.strip_prefix("KUBERNETES_SERVICE_HOST="))
        .unwrap();
    let port = env_out
        .lines()
        .find_map(|l| l.strip_prefix("KUBERNETES_SERVICE_PORT="))
        .unwrap();
    assert!(
        upper_server.contains(&format!("{host}:{port}")),
        "{host}:{port} is not {upper_server}"
    );

    // A due token is replaced (the refresh time is put in the past, as time would).
    lower_secrets
        .patch(
            &secret_name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {ANNOTATION_TOKEN_REFRESH_AT: "2000-01-01T00:00:00Z"}}})),
        )
        .await
        .unwrap();
    let renewed = eventually(30, "a new token after the refresh time", || async {
        let now = exec_out(&upper_pods, "whoami", &["cat", &format!("{SA_DIR}/token")]).await;
        (now != token).then_some(now)
    })
    .await;
    let review = token_review(upper, renewed.trim(), &[]).await;
    assert_eq!(review["authenticated"], json!(true), "{review}");

    // The Secret goes with the pod.
    upper_pods
        .delete("whoami", &DeleteParams::default())
        .await
        .unwrap();
    gone(&lower_secrets, &secret_name, 60, "the token Secret").await;
    gone(&lower_pods, "whoami", 60, "the lower pod").await;

    // One left behind (a virtual node that stopped between the pod's delete and the Secret's)
    // is found by its pod name and deleted; one that is not ours is left alone.
    let mut orphan = secret.clone();
    orphan.metadata = serde_json::from_value(json!({"name": "tensile-identity-gone-uid",
        "labels": secret.metadata.labels.clone().unwrap()
            .into_iter()
            .map(|(k, v)| if k == "tensile-kube.io/identity-of" { (k, "gone-uid".to_owned()) } else { (k, v) })
            .collect::<std::collections::BTreeMap<_, _>>(),
        "annotations": {"tensile-kube.io/pod": "ghost"}}))
    .unwrap();
    lower_secrets
        .create(&PostParams::default(), &orphan)
        .await
        .unwrap();
    let mut foreign = orphan.clone();
    foreign.metadata.name = Some("tensile-identity-not-ours".into());
    foreign.metadata.labels =
        Some([("tensile-kube.io/identity-of".to_owned(), "x".to_owned())].into());
    lower_secrets
        .create(&PostParams::default(), &foreign)
        .await
        .unwrap();
    gone(
        &lower_secrets,
        "tensile-identity-gone-uid",
        60,
        "the orphaned token Secret",
    )
    .await;
    assert!(
        lower_secrets
            .get_opt("tensile-identity-not-ours")
            .await
            .unwrap()
            .is_some()
    );
    stop.cancel();
}

/// The status of condition `type_` of `pod` (None: it has none).
fn condition_status(pod: &Pod, type_: &str) -> Option<String> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| c.status.clone())
}

/// A pod with a readiness gate is not Ready until the gate's condition is set upstairs; set, it
/// reaches the lower pod, whose kubelet counts it, and the pod becomes Ready upstairs; unset,
/// it goes back.
#[tokio::test]
async fn a_readiness_gate_set_upstairs_makes_the_offloaded_pod_ready() {
    const GATE: &str = "example.com/load-balancer-ready";
    let (env, stop) = start().await;
    let (upper, lower) = (&env.clusters[0].client, &env.clusters[1].client);
    let upper_pods: Api<Pod> = Api::namespaced(upper.clone(), "default");
    let lower_pods: Api<Pod> = Api::namespaced(lower.clone(), "default");
    upper_pods
        .create(
            &PostParams::default(),
            &pod(
                "gated",
                "vk-lower",
                json!({"spec": {"readinessGates": [{"conditionType": GATE}]}}),
            ),
        )
        .await
        .unwrap();
    eventually(
        60,
        "gated Running upstairs, its containers ready",
        || async {
            let p = upper_pods.get_opt("gated").await.ok()??;
            (p.status.as_ref()?.phase.as_deref() == Some("Running")
                && condition_status(&p, "ContainersReady").as_deref() == Some("True"))
            .then_some(())
        },
    )
    .await;
    let p = upper_pods.get("gated").await.unwrap();
    assert_eq!(
        condition_status(&p, "Ready").as_deref(),
        Some("False"),
        "not Ready while the gate is unset: {:?}",
        p.status
    );

    let set_gate = |status: &'static str| {
        let api = upper_pods.clone();
        async move {
            api.patch_status(
                "gated",
                &PatchParams::default(),
                &Patch::Strategic(json!({"status": {"conditions": [
                    {"type": GATE, "status": status, "lastTransitionTime": "2026-01-01T00:00:00Z"}]}})),
            )
            .await
            .unwrap();
        }
    };
    set_gate("True").await;
    eventually(30, "gated Ready upstairs once the gate holds", || async {
        let p = upper_pods.get_opt("gated").await.ok()??;
        (condition_status(&p, "Ready").as_deref() == Some("True")).then_some(())
    })
    .await;
    let copy = lower_pods.get("gated").await.unwrap();
    assert_eq!(condition_status(&copy, GATE).as_deref(), Some("True"));
    let p = upper_pods.get("gated").await.unwrap();
    assert_eq!(condition_status(&p, GATE).as_deref(), Some("True"));

    set_gate("False").await;
    eventually(30, "gated not Ready once the gate fails", || async {
        let p = upper_pods.get_opt("gated").await.ok()??;
        (condition_status(&p, "Ready").as_deref() == Some("False")
            && condition_status(&p, GATE).as_deref() == Some("False"))
        .then_some(())
    })
    .await;
    stop.cancel();
}

/// The files of a pod's downward API volume show the upper pod: its UID, its labels and
/// annotations without our marks, a label the copy drops; a label changed upstairs reaches the
/// file.
#[tokio::test]
async fn downward_api_volumes_of_an_offloaded_pod_show_the_upper_pod() {
    use tensile_core::identity::downward_file;
    let (env, stop) = start().await;
    let upper = &env.clusters[0].client;
    let upper_pods: Api<Pod> = Api::namespaced(upper.clone(), "default");
    let item = |path: &str, field: &str| json!({"path": path, "fieldRef": {"fieldPath": field}});
    let running = create_running(
        &upper_pods,
        "files",
        json!({
            "metadata": {"labels": {"pod-group.scheduling.sigs.k8s.io": "pg-1"},
                         "annotations": {"team": "a"}},
            "spec": {
                "containers": [{"name": "c", "image": "nginx:1.27", "volumeMounts": [
                    {"name": "info", "mountPath": "/etc/info"}]}],
                "volumes": [{"name": "info", "downwardAPI": {"items": [
                    item("uid", "metadata.uid"),
                    item("labels", "metadata.labels"),
                    item("annotations", "metadata.annotations"),
                    item("name", "metadata.name"),
                    item("group", "metadata.labels['pod-group.scheduling.sigs.k8s.io']"),
                ]}}]
            }
        }),
    )
    .await;
    let cat = |file: &'static str| {
        let pods = upper_pods.clone();
        async move { exec_out(&pods, "files", &["cat", &format!("/etc/info/{file}")]).await }
    };
    assert_eq!(cat("uid").await, running.metadata.uid.clone().unwrap());
    let labels = cat("labels").await;
    assert_eq!(
        Some(labels.clone()),
        downward_file(&running, "metadata.labels")
    );
    assert!(!labels.contains("virtual-pod"), "{labels}");
    assert!(
        labels.contains("pod-group.scheduling.sigs.k8s.io=\"pg-1\""),
        "{labels}"
    );
    let annotations = cat("annotations").await;
    assert_eq!(
        Some(annotations.clone()),
        downward_file(&running, "metadata.annotations")
    );
    assert!(!annotations.contains("tensile-kube.io"), "{annotations}");
    assert_eq!(cat("name").await, "files");
    assert_eq!(cat("group").await, "pg-1");

    upper_pods
        .patch(
            "files",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"tier": "web"}}})),
        )
        .await
        .unwrap();
    eventually(60, "the new label in the labels file", || async {
        let now = exec_out(&upper_pods, "files", &["cat", "/etc/info/labels"]).await;
        now.contains("tier=\"web\"").then_some(())
    })
    .await;
    stop.cancel();
}

/// The message of the upper pod's `tensile-kube.io/Offloaded` condition when it is False.
async fn not_offloaded_message(pods: &Api<Pod>, name: &str) -> Option<String> {
    let p = pods.get_opt(name).await.ok()??;
    let c = p
        .status?
        .conditions?
        .into_iter()
        .find(|c| c.type_ == "tensile-kube.io/Offloaded" && c.status == "False")?;
    c.message
}

/// An offloaded pod sees nothing of the lower cluster that is not a copy this node made. A
/// lower object that is not ours is never used: the pod waits (not created downstairs) with a
/// Warning event and a condition naming the object and the lower cluster, and runs once the
/// object is gone. An optional reference whose object is missing upstairs is missing downstairs
/// too, whatever the lower cluster holds under that name. And a lower namespace the node
/// creates carries the upper namespace's Pod Security labels.
#[tokio::test]
async fn lower_objects_that_are_not_ours_never_reach_an_offloaded_pod() {
    use k8s_openapi::api::core::v1::{
        Event, Namespace, PersistentVolumeClaim, Secret, ServiceAccount,
    };
    let (env, stop) = start().await;
    let (upper, lower) = (&env.clusters[0].client, &env.clusters[1].client);
    let pp = PostParams::default();
    let upper_pods: Api<Pod> = Api::namespaced(upper.clone(), "default");
    let lower_pods: Api<Pod> = Api::namespaced(lower.clone(), "default");
    let lower_secrets: Api<Secret> = Api::namespaced(lower.clone(), "default");
    let secret = |name: &str, value: &str| -> Secret {
        serde_json::from_value(json!({"metadata": {"name": name}, "stringData": {"k": value}}))
            .unwrap()
    };
    // The lower cluster's own objects, which no upper tenant may reach: `only-below` exists
    // only there; `s` exists in both clusters with different content; so does `robot`.
    lower_secrets
        .create(&pp, &secret("only-below", "lower-value"))
        .await
        .unwrap();
    lower_secrets
        .create(&pp, &secret("s", "lower-s"))
        .await
        .unwrap();
    Api::<Secret>::namespaced(upper.clone(), "default")
        .create(&pp, &secret("s", "upper-s"))
        .await
        .unwrap();
    let claim: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": "below-only"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}
    }))
    .unwrap();
    Api::<PersistentVolumeClaim>::namespaced(lower.clone(), "default")
        .create(&pp, &claim)
        .await
        .unwrap();
    let account: ServiceAccount =
        serde_json::from_value(json!({"metadata": {"name": "robot"}})).unwrap();
    for cluster in [upper, lower] {
        Api::<ServiceAccount>::namespaced(cluster.clone(), "default")
            .create(&pp, &account)
            .await
            .unwrap();
    }

    // (a) optional references to `only-below`: env var, envFrom, a volume.
    let optional = json!({"spec": {
        "containers": [{"name": "c", "image": "nginx:1.27",
            "envFrom": [{"secretRef": {"name": "only-below", "optional": true}}],
            "env": [{"name": "OPT", "valueFrom": {"secretKeyRef":
                {"name": "only-below", "key": "k", "optional": true}}}],
            "volumeMounts": [{"name": "o", "mountPath": "/o"}]}],
        "volumes": [{"name": "o", "secret": {"secretName": "only-below", "optional": true}}]}});
    // (b) a volume of `s`, (c) a claim that exists only downstairs, (d) `robot`.
    let waiting = [
        (
            "decoy",
            json!({"spec": {"containers": [{"name": "c", "image": "nginx:1.27",
                "volumeMounts": [{"name": "s", "mountPath": "/s"}]}],
                "volumes": [{"name": "s", "secret": {"secretName": "s"}}]}}),
            "Secret default/s that is not ours exists in lower cluster lower",
        ),
        (
            "claim",
            json!({"spec": {"volumes": [{"name": "d",
                "persistentVolumeClaim": {"claimName": "below-only"}}]}}),
            "persistentvolumeclaim default/below-only not found in the upper cluster",
        ),
        (
            "robot",
            json!({"spec": {"serviceAccountName": "robot"}}),
            "ServiceAccount default/robot that is not ours exists in lower cluster lower",
        ),
    ];
    for (name, extra, _) in &waiting {
        upper_pods
            .create(&pp, &pod(name, "vk-lower", extra.clone()))
            .await
            .unwrap();
    }
    // A namespace new downstairs carries the upper one's Pod Security labels.
    let namespaces = |c: &kube::Client| Api::<Namespace>::all(c.clone());
    let psa = json!({"pod-security.kubernetes.io/enforce": "baseline",
        "pod-security.kubernetes.io/warn": "restricted", "team": "a"});
    namespaces(upper)
        .create(
            &pp,
            &serde_json::from_value(json!({"metadata": {"name": "psa", "labels": psa}})).unwrap(),
        )
        .await
        .unwrap();
    let psa_pods: Api<Pod> = Api::namespaced(upper.clone(), "psa");
    // Until the upper ServiceAccount controller has made `default` there.
    eventually(30, "a pod created in namespace psa", || async {
        psa_pods
            .create(&pp, &pod("p", "vk-lower", json!({})))
            .await
            .ok()
    })
    .await;
    create_running(&upper_pods, "optional", optional).await;
    let env_seen = exec_out(&upper_pods, "optional", &["env"]).await;
    assert!(
        !env_seen.contains("lower-value"),
        "the lower Secret reached the pod:\n{env_seen}"
    );
    assert!(!env_seen.contains("OPT="), "{env_seen}");
    let copy = lower_pods.get("optional").await.unwrap();
    let spec = copy.spec.unwrap();
    assert_eq!(spec.containers[0].env_from, None);
    let volume = spec.volumes.unwrap().into_iter().find(|v| v.name == "o");
    assert!(
        volume
            .as_ref()
            .is_some_and(|v| v.empty_dir.is_some() && v.secret.is_none()),
        "{volume:?}"
    );

    // The same for a container added with `kubectl debug`.
    upper_pods
        .patch_subresource(
            "ephemeralcontainers",
            "optional",
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {"ephemeralContainers": [{
                "name": "dbg", "image": "busybox:1.36", "command": ["sleep", "100000"],
                "envFrom": [{"secretRef": {"name": "only-below", "optional": true}}]}]}})),
        )
        .await
        .unwrap();
    let dbg = eventually(30, "the ephemeral container downstairs", || async {
        let p = lower_pods.get_opt("optional").await.ok()??;
        p.spec?
            .ephemeral_containers?
            .into_iter()
            .find(|c| c.name == "dbg")
    })
    .await;
    assert_eq!(dbg.env_from, None, "{dbg:?}");

    let events: Api<Event> = Api::namespaced(upper.clone(), "default");
    for (name, _, why) in &waiting {
        let message = eventually(30, &format!("{name} held back with a reason"), || async {
            not_offloaded_message(&upper_pods, name)
                .await
                .filter(|m| m.contains(why))
        })
        .await;
        eprintln!("{name}: {message}");
        eventually(30, &format!("a Warning event on {name}"), || async {
            let list = events.list(&ListParams::default()).await.ok()?;
            list.items
                .into_iter()
                .find(|e| {
                    e.involved_object.name.as_deref() == Some(*name)
                        && e.type_.as_deref() == Some("Warning")
                        && e.message.as_deref().is_some_and(|m| m.contains(why))
                })
                .map(drop)
        })
        .await;
        assert!(
            lower_pods.get_opt(name).await.unwrap().is_none(),
            "{name} was created downstairs"
        );
    }
    let labels = eventually(30, "namespace psa downstairs", || async {
        namespaces(lower)
            .get_opt("psa")
            .await
            .ok()??
            .metadata
            .labels
    })
    .await;
    assert_eq!(
        labels
            .get("pod-security.kubernetes.io/enforce")
            .map(String::as_str),
        Some("baseline")
    );
    assert_eq!(
        labels
            .get("pod-security.kubernetes.io/warn")
            .map(String::as_str),
        Some("restricted")
    );
    assert_eq!(labels.get("team"), None, "only the Pod Security labels");

    // The lower Secret is the lower cluster's: neither used nor touched.
    let theirs = lower_secrets.get("s").await.unwrap();
    assert_eq!(
        theirs.data.unwrap()["k"].0,
        b"lower-s",
        "the lower Secret was overwritten"
    );
    assert!(
        !theirs
            .metadata
            .labels
            .unwrap_or_default()
            .contains_key("tensile-kube.io/owner")
    );

    // Once the lower administrator deletes theirs, the pod runs with the upper content.
    lower_secrets
        .delete("s", &DeleteParams::default())
        .await
        .unwrap();
    eventually(60, "decoy Running upstairs", || async {
        (phase(&upper_pods, "decoy").await? == "Running").then_some(())
    })
    .await;
    assert_eq!(
        exec_out(&upper_pods, "decoy", &["cat", "/s/k"])
            .await
            .trim(),
        "upper-s"
    );
    stop.cancel();
}

/// An optional ConfigMap that exists in neither cluster when the pod starts keeps its reference
/// in the lower pod (nothing of that name downstairs can be read), so once it is created
/// upstairs our copy fills the volume, as a kubelet fills an optional volume (Kubernetes'
/// conformance test "Projected configMap optional updates should be reflected in volume");
/// deleted upstairs, it leaves the volume.
#[tokio::test]
async fn an_optional_config_map_created_after_the_pod_reaches_its_volume() {
    use k8s_openapi::api::core::v1::ConfigMap;
    let (env, stop) = start().await;
    let (upper, lower) = (&env.clusters[0].client, &env.clusters[1].client);
    let upper_pods: Api<Pod> = Api::namespaced(upper.clone(), "default");
    let lower_pods: Api<Pod> = Api::namespaced(lower.clone(), "default");
    let later = json!({"spec": {
    "containers": [{"name": "c", "image": "nginx:1.27",
        "volumeMounts": [{"name": "l", "mountPath": "/later"}, {"name": "p", "mountPath": "/p"}]}],
    "volumes": [
        {"name": "l", "configMap": {"name": "later", "optional": true}},
        {"name": "p", "projected": {"sources": [{"configMap": {"name": "later", "optional": true}}]}},
    ]}});
    create_running(&upper_pods, "later", later).await;
    let copy = lower_pods.get("later").await.unwrap();
    let volumes = copy.spec.unwrap().volumes.unwrap_or_default();
    let kept = |name: &str| {
        let v = volumes.iter().find(|v| v.name == name);
        v.and_then(|v| v.config_map.as_ref().map(|c| c.name.clone()))
            .or_else(|| {
                v.and_then(|v| v.projected.as_ref())
                    .and_then(|p| p.sources.as_ref()?.first()?.config_map.as_ref())
                    .map(|c| c.name.clone())
            })
    };
    assert_eq!(kept("l").as_deref(), Some("later"), "{volumes:?}");
    assert_eq!(kept("p").as_deref(), Some("later"), "{volumes:?}");
    let listed = || async {
        [
            exec_out(&upper_pods, "later", &["ls", "/later"]).await,
            exec_out(&upper_pods, "later", &["ls", "/p"]).await,
        ]
        .map(|out| out.trim().to_owned())
    };
    assert_eq!(
        listed().await,
        ["", ""],
        "files before the ConfigMap exists"
    );

    let configs: Api<ConfigMap> = Api::namespaced(upper.clone(), "default");
    let cm: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "later"}, "data": {"k": "v"}})).unwrap();
    configs.create(&PostParams::default(), &cm).await.unwrap();
    eventually(60, "the optional ConfigMap in both volumes", || async {
        (listed().await == ["k", "k"]).then_some(())
    })
    .await;
    assert_eq!(
        exec_out(&upper_pods, "later", &["cat", "/later/k", "/p/k"]).await,
        "vv"
    );
    configs
        .delete("later", &DeleteParams::default())
        .await
        .unwrap();
    eventually(60, "the deleted ConfigMap out of the volumes", || async {
        (listed().await == ["", ""]).then_some(())
    })
    .await;
    stop.cancel();
}

/// The virtual-kubelet library's environment events. A pod whose optional references miss
/// upstairs runs and gets the Optional... events; one with a mandatory reference to a missing
/// Secret waits with `MandatorySecretNotFound` (one event, however often the creation is
/// retried, next to our `ProviderCreateFailed`) and runs once it appears.
#[tokio::test]
async fn environment_references_missing_upstairs_get_the_virtual_kubelet_events() {
    use k8s_openapi::api::core::v1::{ConfigMap, Event, Secret};
    let (env, stop) = start().await;
    let upper = &env.clusters[0].client;
    let pp = PostParams::default();
    let upper_pods: Api<Pod> = Api::namespaced(upper.clone(), "default");
    let cm: ConfigMap = serde_json::from_value(
        json!({"metadata": {"name": "cm"}, "data": {"here": "v", "1bad": "x"}}),
    )
    .unwrap();
    Api::<ConfigMap>::namespaced(upper.clone(), "default")
        .create(&pp, &cm)
        .await
        .unwrap();
    let container = |env: serde_json::Value, env_from: serde_json::Value| {
        json!({"spec": {"containers": [{"name": "c", "image": "nginx:1.27",
            "env": env, "envFrom": env_from}]}})
    };
    let optional = container(
        json!([
            {"name": "A", "valueFrom": {"configMapKeyRef": {"name": "no-cm", "key": "k", "optional": true}}},
            {"name": "B", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "gone", "optional": true}}},
        ]),
        json!([{"secretRef": {"name": "no-secret", "optional": true}}, {"configMapRef": {"name": "cm"}}]),
    );
    let mandatory = container(
        json!([{"name": "S", "valueFrom": {"secretKeyRef": {"name": "later", "key": "k"}}}]),
        json!([]),
    );
    for (name, extra) in [("optional", &optional), ("mandatory", &mandatory)] {
        upper_pods
            .create(&pp, &pod(name, "vk-lower", extra.clone()))
            .await
            .unwrap();
    }
    let events: Api<Event> = Api::namespaced(upper.clone(), "default");
    let find = |pod: &'static str, reason: &'static str| {
        let events = events.clone();
        async move {
            let list = events.list(&ListParams::default()).await.ok()?;
            list.items.into_iter().find(|e| {
                e.involved_object.name.as_deref() == Some(pod)
                    && e.reason.as_deref() == Some(reason)
                    && e.type_.as_deref() == Some("Warning")
            })
        }
    };
    let want = [
        (
            "optional",
            "OptionalConfigMapNotFound",
            r#"skipping optional envvar "A": configmap "no-cm" not found"#,
        ),
        (
            "optional",
            "OptionalConfigMapKeyNotFound",
            r#"skipping optional envvar "B": key "gone" does not exist in configmap "cm""#,
        ),
        (
            "optional",
            "OptionalSecretNotFound",
            r#"secret "no-secret" not found"#,
        ),
        (
            "optional",
            "InvalidEnvironmentVariableNames",
            "keys [1bad] from configmap default/cm were skipped since they are invalid as \
             environment variable names",
        ),
        (
            "mandatory",
            "MandatorySecretNotFound",
            r#"secret "later" not found"#,
        ),
    ];
    for (pod, reason, message) in want {
        let e = eventually(30, &format!("{reason} on {pod}"), || find(pod, reason)).await;
        assert_eq!(e.message.as_deref(), Some(message), "{reason}");
    }
    eventually(60, "optional Running upstairs", || async {
        (phase(&upper_pods, "optional").await? == "Running").then_some(())
    })
    .await;
    // A debug container added later is checked too, and only its event is new.
    upper_pods
        .patch_subresource(
            "ephemeralcontainers",
            "optional",
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {"ephemeralContainers": [{
                "name": "dbg", "image": "busybox:1.36", "targetContainerName": "c",
                "command": ["sh", "-c", "sleep 100000"],
                "env": [{"name": "E", "valueFrom": {"secretKeyRef":
                    {"name": "no-eph", "key": "k", "optional": true}}}]}]}})),
        )
        .await
        .unwrap();
    let e = eventually(
        30,
        "OptionalSecretNotFound for the debug container",
        || async {
            let list = events.list(&ListParams::default()).await.ok()?;
            list.items.into_iter().find(|e| {
                e.involved_object.name.as_deref() == Some("optional")
                    && e.message.as_deref()
                        == Some(r#"skipping optional envvar "E": secret "no-eph" not found"#)
            })
        },
    )
    .await;
    assert_eq!(e.reason.as_deref(), Some("OptionalSecretNotFound"));
    let again = find("optional", "OptionalConfigMapNotFound").await.unwrap();
    assert_eq!(again.count, Some(1), "sent once: {again:?}");
    // The creation is retried while the Secret is missing; the library's event is not.
    eventually(60, "ProviderCreateFailed on mandatory, retried", || async {
        let e = find("mandatory", "ProviderCreateFailed").await?;
        (e.count.unwrap_or(1) >= 3).then_some(())
    })
    .await;
    let once = find("mandatory", "MandatorySecretNotFound").await.unwrap();
    assert_eq!(once.count, Some(1), "{once:?}");
    // As the library showed it: Pending, `ProviderFailed` in `kubectl get`'s STATUS column.
    let waiting = upper_pods.get("mandatory").await.unwrap().status.unwrap();
    assert_eq!(waiting.phase.as_deref(), Some("Pending"));
    assert_eq!(waiting.reason.as_deref(), Some("ProviderFailed"));
    assert!(
        waiting
            .message
            .as_deref()
            .is_some_and(|m| m.contains("later")),
        "{waiting:?}"
    );
    let secret: Secret =
        serde_json::from_value(json!({"metadata": {"name": "later"}, "stringData": {"k": "v"}}))
            .unwrap();
    Api::<Secret>::namespaced(upper.clone(), "default")
        .create(&pp, &secret)
        .await
        .unwrap();
    eventually(60, "mandatory Running once its Secret exists", || async {
        (phase(&upper_pods, "mandatory").await? == "Running").then_some(())
    })
    .await;
    let running = eventually(30, "ProviderFailed gone from the status", || async {
        let s = upper_pods.get("mandatory").await.ok()?.status?;
        s.reason.is_none().then_some(s)
    })
    .await;
    assert_eq!(running.message, None);
    stop.cancel();
}
