//! Clients against a simulated API server: throttling, counting, and kubeconfig errors.

use std::time::{Duration, Instant};

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use kube::api::{ListParams, WatchParams};
use tensile_runtime::clients::{
    ApiCalls, ClientError, KubeconfigSource, Verb, build_client, build_client_with_server,
};
use tensile_sim::apiserver::ApiServerConfig;

#[tokio::test]
async fn requests_are_throttled_and_counted() {
    let server = tensile_testenv::start_apiserver(ApiServerConfig::default())
        .await
        .unwrap()
        .0;
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
    let server = tensile_testenv::start_apiserver(ApiServerConfig::default())
        .await
        .unwrap()
        .0;
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
    let server = tensile_testenv::start_apiserver(ApiServerConfig::default())
        .await
        .unwrap()
        .0;
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

/// A TLS server offering HTTP/2 (at most `max_streams` streams per connection) and HTTP/1.1, as
/// kube-apiserver does, that records each request's HTTP version and counts connections.
/// `/watch` answers with headers and a body that never ends.
async fn version_recorder(
    max_streams: u32,
) -> (
    kube::Config,
    std::sync::Arc<std::sync::Mutex<Vec<http::Version>>>,
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};
    use tensile_testenv::certs::{Ca, certs_from_pem, server_config};
    let ca = Ca::new("h2-ca").unwrap();
    let cert = ca.issue_server("h2", &["127.0.0.1".into()]).unwrap();
    let tls = tokio_rustls::TlsAcceptor::from(server_config(&cert, ca.cert_pem()).unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let versions: Arc<Mutex<Vec<http::Version>>> = Arc::default();
    let connections = Arc::new(AtomicUsize::new(0));
    let (seen, count) = (versions.clone(), connections.clone());
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            let (tls, seen) = (tls.clone(), seen.clone());
            tokio::spawn(async move {
                let Ok(stream) = tls.accept(tcp).await else {
                    return;
                };
                let svc =
                    hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                        seen.lock().unwrap().push(req.version());
                        let body = if req.uri().path() == "/watch" {
                            http_body_util::BodyExt::boxed(http_body_util::StreamBody::new(
                                futures::stream::pending::<
                                    Result<
                                        hyper::body::Frame<bytes::Bytes>,
                                        std::convert::Infallible,
                                    >,
                                >(),
                            ))
                        } else {
                            http_body_util::BodyExt::boxed(http_body_util::Full::new(
                                bytes::Bytes::from_static(b"{}"),
                            ))
                        };
                        async { Ok::<_, std::convert::Infallible>(http::Response::new(body)) }
                    });
                let mut server = hyper_util::server::conn::auto::Builder::new(
                    hyper_util::rt::TokioExecutor::new(),
                );
                server.http2().max_concurrent_streams(max_streams);
                let _ = server
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    let mut config = kube::Config::new(format!("https://{addr}").parse().unwrap());
    config.root_cert = Some(
        certs_from_pem("CA", ca.cert_pem())
            .unwrap()
            .into_iter()
            .map(|c| c.to_vec())
            .collect(),
    );
    (config, versions, connections)
}

#[tokio::test]
async fn requests_share_one_http2_connection_and_upgrades_go_over_http1() {
    use std::sync::atomic::Ordering;
    let (config, versions, connections) = version_recorder(100).await;
    let calls = ApiCalls::default();
    let client =
        tensile_runtime::clients::client_from_config(config, 0.0, 0, "lower", &calls).unwrap();
    let burst = || {
        futures::future::join_all((0..20).map(|_| {
            let client = client.clone();
            async move {
                client
                    .request_text(http::Request::get("/version").body(Vec::new()).unwrap())
                    .await
                    .unwrap()
            }
        }))
    };
    // The first burst does not race the first handshake (hyper's pool would open a connection
    // per request before ALPN says HTTP/2): the lane's first request goes alone.
    burst().await;
    let opened = connections.load(Ordering::SeqCst);
    assert_eq!(opened, 1, "one connection for a burst on a new client");
    burst().await;
    assert_eq!(versions.lock().unwrap().len(), 40);
    assert!(
        versions
            .lock()
            .unwrap()
            .iter()
            .all(|v| *v == http::Version::HTTP_2),
        "{:?}",
        versions.lock().unwrap()
    );
    assert_eq!(
        connections.load(Ordering::SeqCst),
        opened,
        "the second burst rides the connection the first left"
    );

    // A WebSocket upgrade (exec, attach, port-forward) cannot ride HTTP/2: it gets HTTP/1.1.
    let upgrade = http::Request::get("/api/v1/namespaces/a/pods/p/exec")
        .header(http::header::CONNECTION, "Upgrade")
        .header(http::header::UPGRADE, "websocket")
        .body(kube::client::Body::empty())
        .unwrap();
    client.send(upgrade).await.unwrap();
    assert_eq!(
        versions.lock().unwrap().last(),
        Some(&http::Version::HTTP_11)
    );
    assert_eq!(connections.load(Ordering::SeqCst), opened + 1);
}

#[tokio::test]
async fn watches_beyond_a_connections_stream_limit_open_another_connection_instead_of_blocking() {
    use std::sync::atomic::Ordering;
    use tensile_runtime::transport::MAX_STREAMS_PER_CONNECTION;
    // The server allows exactly as many streams per connection as the client uses at most.
    let (config, _versions, connections) =
        version_recorder(u32::try_from(MAX_STREAMS_PER_CONNECTION).unwrap()).await;
    let calls = ApiCalls::default();
    let client =
        tensile_runtime::clients::client_from_config(config, 0.0, 0, "upper", &calls).unwrap();
    let opened = connections.load(Ordering::SeqCst);
    let watches = 2 * MAX_STREAMS_PER_CONNECTION + 10;
    let watch = || {
        let watch = http::Request::get("/watch")
            .body(kube::client::Body::empty())
            .unwrap();
        client.send(watch)
    };
    // Every watch holds its stream; a request after them is still answered. Without more
    // connections the 101st waits for one of them to end, which is never: the deadline is a
    // hang's, not a speed's.
    // All at once on a new client: a connection per lane, not per watch.
    let mut open = tokio::time::timeout(Duration::from_secs(60), async {
        let open: Vec<_> = futures::future::join_all((0..watches).map(|_| watch()))
            .await
            .into_iter()
            .map(Result::unwrap)
            .collect();
        client
            .request_text(http::Request::get("/version").body(Vec::new()).unwrap())
            .await
            .unwrap();
        open
    })
    .await
    .expect("requests behind a full connection's watches were never sent");
    assert_eq!(connections.load(Ordering::SeqCst), opened + 3);
    // Watches that end give their places back: the next ones take no new connection.
    open.truncate(MAX_STREAMS_PER_CONNECTION);
    for _ in 0..50 {
        open.push(watch().await.unwrap());
    }
    assert_eq!(connections.load(Ordering::SeqCst), opened + 3);
}
