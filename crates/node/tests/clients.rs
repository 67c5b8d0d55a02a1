#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Clients against a simulated API server: throttling, counting, and kubeconfig errors.

use std::time::{Duration, Instant};

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use kube::api::{ListParams, WatchParams};
use tensile_runtime::clients::{
    ApiCalls, ClientError, KubeconfigSource, Verb, build_client, build_client_with_server,
};
use tensile_sim::apiserver::{ApiServer, ApiServerConfig};

#[tokio::test]
async fn requests_are_throttled_and_counted() {
    let server = ApiServer::start(ApiServerConfig::default()).await.unwrap();
    let calls = ApiCalls::default();
    let client = build_client(
        KubeconfigSource::Text(server.kubeconfig("c")),
        20.0,
        5,
        "lower",
        &calls,
    )
    .await
    .unwrap();
    let namespaces: Api<Namespace> = Api::all(client);

    let start = Instant::now();
    for _ in 0..30 {
        namespaces.get("default").await.unwrap();
    }
    let took = start.elapsed();
    // 5 at once, then 25 more at 20 a second: at least 1.25 s, whatever the machine's speed.
    assert!(took >= Duration::from_millis(1250), "30 GETs took {took:?}");

    let list = namespaces.list(&ListParams::default()).await.unwrap();
    let version = list.metadata.resource_version.clone().unwrap();
    let mut events = namespaces
        .watch(&WatchParams::default().timeout(2), &version)
        .await
        .unwrap()
        .boxed();
    // Drain the watch: however long it streams, it was one request.
    while let Some(event) = events.next().await {
        event.unwrap();
    }

    assert_eq!(calls.count("lower", Verb::Get, "namespaces"), 30);
    assert_eq!(calls.count("lower", Verb::List, "namespaces"), 1);
    assert_eq!(calls.count("lower", Verb::Watch, "namespaces"), 1);
    assert_eq!(calls.total("lower", Verb::Watch), 1);
    assert_eq!(calls.total("upper", Verb::Get), 0);
    assert_eq!(calls.snapshot().values().sum::<u64>(), 32);
}

#[tokio::test]
async fn a_missing_kubeconfig_is_an_error_naming_it() {
    let calls = ApiCalls::default();
    let path = std::env::temp_dir().join("tensile-no-such-dir/kubeconfig");
    let err = build_client(
        KubeconfigSource::Path(path.clone()),
        0.0,
        0,
        "lower",
        &calls,
    )
    .await
    .err()
    .expect("an error");
    assert!(matches!(err, ClientError::ReadKubeconfig { .. }), "{err:?}");
    assert!(
        err.to_string().contains(&path.display().to_string()),
        "{err}"
    );
}

#[tokio::test]
async fn an_invalid_kubeconfig_file_is_an_error_naming_it() {
    let dir = std::env::temp_dir().join(format!("tensile-clients-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("kubeconfig");
    std::fs::write(&path, "clusters: [this is: not\n  a kubeconfig").unwrap();
    let calls = ApiCalls::default();
    let err = build_client(
        KubeconfigSource::Path(path.clone()),
        0.0,
        0,
        "upper",
        &calls,
    )
    .await
    .err()
    .expect("an error");
    assert!(
        matches!(err, ClientError::InvalidKubeconfigFile { .. }),
        "{err:?}"
    );
    assert!(
        err.to_string().contains(&path.display().to_string()),
        "{err}"
    );

    // Parses, but has no current context: still an error, not a fall-back.
    std::fs::write(&path, "apiVersion: v1\nkind: Config\n").unwrap();
    let err = build_client(
        KubeconfigSource::Path(path.clone()),
        0.0,
        0,
        "upper",
        &calls,
    )
    .await
    .err()
    .expect("an error");
    assert!(
        matches!(err, ClientError::InvalidKubeconfigFile { .. }),
        "{err:?}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn a_kubeconfig_file_works_and_the_server_can_be_overridden() {
    let server = ApiServer::start(ApiServerConfig::default()).await.unwrap();
    let dir = std::env::temp_dir().join(format!("tensile-clients-ok-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("kubeconfig");
    // The file names a server that does not exist; the override points at the real one.
    let kubeconfig = server
        .kubeconfig("c")
        .replace(server.url(), "https://127.0.0.1:1");
    std::fs::write(&path, kubeconfig).unwrap();
    let calls = ApiCalls::default();
    let client = build_client_with_server(
        KubeconfigSource::Path(path),
        Some(server.url()),
        0.0,
        0,
        "upper",
        &calls,
    )
    .await
    .unwrap();
    Api::<Namespace>::all(client).get("default").await.unwrap();
    assert_eq!(calls.count("upper", Verb::Get, "namespaces"), 1);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn in_cluster_config_is_used_only_when_chosen_and_fails_clearly_outside_a_pod() {
    // Outside a pod there is no service account: a clear error, never some other cluster.
    if std::env::var_os("KUBERNETES_SERVICE_HOST").is_some() {
        return;
    }
    let calls = ApiCalls::default();
    let err = build_client(KubeconfigSource::InCluster, 0.0, 0, "lower", &calls)
        .await
        .err()
        .expect("an error");
    assert!(matches!(err, ClientError::InCluster(_)), "{err:?}");
}

#[tokio::test]
async fn an_invalid_server_override_is_refused() {
    let server = ApiServer::start(ApiServerConfig::default()).await.unwrap();
    let calls = ApiCalls::default();
    let err = build_client_with_server(
        KubeconfigSource::Text(server.kubeconfig("c")),
        Some("ftp://example.test"),
        0.0,
        0,
        "upper",
        &calls,
    )
    .await
    .err()
    .expect("an error");
    assert!(
        matches!(err, ClientError::InvalidServerUrl { .. }),
        "{err:?}"
    );
}
