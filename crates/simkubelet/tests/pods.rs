//! The simulated kubelet running pods, through kube-rs, on whichever backend TestEnv runs.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;
use tensile_testenv::{TestEnv, eventually};

fn from<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
    serde_json::from_value(v).unwrap()
}

#[tokio::test]
async fn container_programs_and_restart_policy_decide_the_phase() {
    let env = TestEnv::start(1).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(env.clusters[0].client.clone(), "default");
    for (name, cmd) in [("ok", "sleep 0"), ("bad", "exit 3")] {
        pods.create(&PostParams::default(), &from(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox", "command": ["sh", "-c", cmd]}]}}))).await.unwrap();
    }
    for (name, phase, code) in [("ok", "Succeeded", 0), ("bad", "Failed", 3)] {
        let p = eventually(30, phase, || async {
            let p = pods.get(name).await.ok()?;
            (p.status.as_ref()?.phase.as_deref() == Some(phase)).then_some(p)
        })
        .await;
        let state = p.status.unwrap().container_statuses.unwrap()[0]
            .state
            .clone()
            .unwrap();
        assert_eq!(state.terminated.unwrap().exit_code, code);
    }
}

#[tokio::test]
async fn a_running_pod_is_deleted_gracefully_and_the_kubelet_finishes_it() {
    let env = TestEnv::start(1).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(env.clusters[0].client.clone(), "default");
    pods.create(
        &PostParams::default(),
        &from(
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web"},
        "spec": {"containers": [{"name": "c", "image": "nginx"}]}}),
        ),
    )
    .await
    .unwrap();
    eventually(30, "running", || async {
        (pods.get("web").await.ok()?.status?.phase? == "Running").then_some(())
    })
    .await;
    pods.delete("web", &DeleteParams::default()).await.unwrap();
    eventually(30, "pod gone", || async {
        pods.get_opt("web").await.ok()?.is_none().then_some(())
    })
    .await;
}
