//! Faults a `TestEnv` cluster can be given for the chaos benchmark, checked against the API
//! server: throttling through the error proxy (either backend), and etcd compaction, after
//! which a watch resuming from before it is told 410 Gone (real control planes only:
//! .config/nextest.toml).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams, PostParams, WatchEvent, WatchParams};
use tensile_testenv::{ClusterSpec, TestEnv};

fn config_map(name: &str) -> ConfigMap {
    serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).unwrap()
}

#[tokio::test]
async fn a_throttling_error_proxy_answers_429_alone_and_passes_all_once_it_stops() {
    let env = TestEnv::start_with(vec![ClusterSpec::new("c1", 0)])
        .await
        .unwrap();
    let cluster = &env.clusters[0];
    let proxy = cluster
        .error_proxy(&env.dir().join("errors.kubeconfig"))
        .await
        .unwrap();
    let text = std::fs::read_to_string(proxy.kubeconfig()).unwrap();
    let parsed = kube::config::Kubeconfig::from_yaml(&text).unwrap();
    let mut config = kube::Config::from_custom_kubeconfig(parsed, &Default::default())
        .await
        .unwrap();
    // kube's own retry of 429s would hide them: each request is answered once.
    config.default_retry = false;
    let client = kube::Client::try_from(config).unwrap();
    let api: Api<ConfigMap> = Api::namespaced(client, "default");
    proxy.set_throttle_share(1.0);
    for _ in 0..4 {
        match api.list(&ListParams::default()).await {
            Err(kube::Error::Api(e)) => assert_eq!(e.code, 429, "{e:?}"),
            other => panic!("not throttled: {other:?}"),
        }
    }
    let counts = proxy.counts();
    assert_eq!((counts.too_many, counts.internal), (4, 0));
    proxy.set_throttle_share(0.0);
    api.list(&ListParams::default()).await.unwrap();
}

#[tokio::test]
async fn after_a_compaction_and_an_api_server_restart_an_old_watch_is_gone() {
    let env = TestEnv::start_with(vec![ClusterSpec::new("c1", 0)])
        .await
        .unwrap();
    let cluster = &env.clusters[0];
    let api: Api<ConfigMap> = Api::namespaced(cluster.client.clone(), "default");
    let first = api
        .create(&PostParams::default(), &config_map("first"))
        .await
        .unwrap();
    let old = first.metadata.resource_version.unwrap();
    for i in 0..5 {
        api.create(&PostParams::default(), &config_map(&format!("later-{i}")))
            .await
            .unwrap();
    }
    let revision = cluster.compact_etcd().await.unwrap();
    assert!(
        revision > old.parse::<i64>().unwrap(),
        "{revision} after {old}"
    );
    cluster.kill_apiserver().unwrap();
    cluster.start_apiserver_again().await.unwrap();
    // The restarted API server's watch cache begins after the compaction: the old revision
    // is gone for good, and a watch from it is told so (at once, or as its first event).
    let gone = match api.watch(&WatchParams::default(), &old).await {
        Err(kube::Error::Api(e)) => e.code,
        Err(e) => panic!("{e}"),
        Ok(stream) => match Box::pin(stream).next().await {
            Some(Ok(WatchEvent::Error(e))) => e.code,
            Some(Err(kube::Error::Api(e))) => e.code,
            other => panic!("the old watch went on: {other:?}"),
        },
    };
    assert_eq!(gone, 410);
}
