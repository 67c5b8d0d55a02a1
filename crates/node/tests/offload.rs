//! A lower cluster as one node of an upper cluster, end to end on simulated clusters.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::json;
use tensile_core::node::NodeIdentity;
use tensile_core::translate::TranslateConfig;
use tensile_node::VirtualNode;
use tensile_node::node::NodeLoop;
use tensile_node::pods::PodSync;
use tensile_sim::env::{ClusterSpec, TestEnv};
use tokio_util::sync::CancellationToken;

async fn eventually<T, F, Fut>(secs: u64, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn start() -> (TestEnv, CancellationToken) {
    let env = TestEnv::start_with(vec![
        ClusterSpec::new("upper", 0),
        ClusterSpec::new("lower", 2),
    ])
    .await
    .unwrap();
    let (upper, lower) = (
        env.clusters[0].client.clone(),
        env.clusters[1].client.clone(),
    );
    let version = lower.apiserver_version().await.unwrap().git_version;
    let vn = VirtualNode {
        node: NodeLoop {
            identity: NodeIdentity {
                name: "vk-lower".into(),
                extra_label: Some(("clusterID".into(), "lower".into())),
                taint: None,
                internal_ip: "127.0.0.1".into(),
                external_ip: None,
                kubelet_port: 10250,
                lower_version: version,
            },
            owner: "vk-lower".into(),
            not_ready_after: None,
            lease_renew: Duration::from_millis(500),
            heartbeat: Duration::from_secs(60),
        },
        pods: PodSync {
            upper,
            lower,
            node: "vk-lower".into(),
            lower_name: "lower".into(),
            translate: TranslateConfig::new("vk-lower"),
            workers: 8,
        },
    };
    let stop = CancellationToken::new();
    tokio::spawn(vn.run(stop.clone()));
    (env, stop)
}

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
    assert_eq!(
        node.status.unwrap().node_info.unwrap().kubelet_version,
        "v1.33.4-sim"
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
