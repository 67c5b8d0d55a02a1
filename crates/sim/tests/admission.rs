//! Mutating admission webhooks called by the embedded API server.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::convert::Infallible;
use std::net::SocketAddr;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};
use tensile_sim::apiserver::ApiServerConfig;
use tensile_testenv::certs::{Ca, server_config};
use tokio::net::TcpListener;

/// A webhook on loopback that labels pods, or denies pods named `forbidden`.
async fn webhook(ca: &Ca) -> SocketAddr {
    let cert = ca.issue_server("webhook", &["127.0.0.1".into()]).unwrap();
    let tls = tokio_rustls::TlsAcceptor::from(server_config(&cert, ca.cert_pem()).unwrap());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let tls = tls.clone();
            tokio::spawn(async move {
                let Ok(stream) = tls.accept(tcp).await else {
                    return;
                };
                let svc = service_fn(|req: hyper::Request<hyper::body::Incoming>| async move {
                    let body = req.into_body().collect().await.unwrap().to_bytes();
                    let review: Value = serde_json::from_slice(&body).unwrap();
                    let uid = review["request"]["uid"].clone();
                    let name = review["request"]["name"].as_str().unwrap_or_default();
                    let response = if name == "forbidden" {
                        json!({"uid": uid, "allowed": false, "status": {"code": 403, "message": "not this name"}})
                    } else {
                        let patch = json!([{"op": "add", "path": "/metadata/labels/mutated", "value": "yes"}]);
                        json!({"uid": uid, "allowed": true, "patchType": "JSONPatch",
                            "patch": B64.encode(serde_json::to_vec(&patch).unwrap())})
                    };
                    let out = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response});
                    Ok::<_, Infallible>(hyper::Response::new(Full::new(Bytes::from(
                        serde_json::to_vec(&out).unwrap(),
                    ))))
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    addr
}

fn config(name: &str, url: &str, ca_pem: &str, policy: &str) -> MutatingWebhookConfiguration {
    serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [{"name": format!("{name}.example.com"), "admissionReviewVersions": ["v1"], "sideEffects": "None",
            "failurePolicy": policy,
            "clientConfig": {"url": url, "caBundle": B64.encode(ca_pem)},
            "objectSelector": {"matchLabels": {"virtual-pod": "true"}},
            "namespaceSelector": {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system"]}]},
            "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}]}]
    }))
    .unwrap()
}

/// Registers the webhook at `addr` as `name` (failure policy `Fail`); the default namespace's
/// pods.
async fn register(client: &kube::Client, name: &str, addr: SocketAddr, ca: &Ca) -> Api<Pod> {
    let hooks: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    hooks
        .create(
            &PostParams::default(),
            &config(
                name,
                &format!("https://{addr}/mutate"),
                ca.cert_pem(),
                "Fail",
            ),
        )
        .await
        .unwrap();
    Api::namespaced(client.clone(), "default")
}

fn pod(name: &str, labelled: bool) -> Pod {
    let labels = if labelled {
        json!({"virtual-pod": "true"})
    } else {
        json!({})
    };
    serde_json::from_value(
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels},
        "spec": {"containers": [{"name": "c", "image": "i"}]}}),
    )
    .unwrap()
}

#[tokio::test]
async fn webhooks_mutate_selected_pods_deny_with_reasons_and_honour_failure_policy() {
    let server = tensile_testenv::start_apiserver(ApiServerConfig::default())
        .await
        .unwrap()
        .0;
    let client = server.client().await.unwrap();
    let ca = Ca::new("webhook-ca").unwrap();
    let addr = webhook(&ca).await;
    let pods = register(&client, "label", addr, &ca).await;
    let hooks: Api<MutatingWebhookConfiguration> = Api::all(client.clone());

    let p = pods
        .create(&PostParams::default(), &pod("a", true))
        .await
        .unwrap();
    assert_eq!(
        p.metadata
            .labels
            .unwrap()
            .get("mutated")
            .map(String::as_str),
        Some("yes")
    );
    let p = pods
        .create(&PostParams::default(), &pod("b", false))
        .await
        .unwrap();
    assert!(
        !p.metadata
            .labels
            .unwrap_or_default()
            .contains_key("mutated"),
        "objectSelector excludes it"
    );

    let e = pods
        .create(&PostParams::default(), &pod("forbidden", true))
        .await
        .unwrap_err();
    let kube::Error::Api(s) = e else {
        panic!("{e:?}")
    };
    assert_eq!(s.code, 403);
    assert_eq!(
        s.message,
        "admission webhook \"label.example.com\" denied the request: not this name"
    );

    // A webhook that cannot be reached: Fail refuses the pod, Ignore lets it through.
    let other_ca = Ca::new("wrong-ca").unwrap();
    hooks
        .create(
            &PostParams::default(),
            &config(
                "broken",
                &format!("https://{addr}/mutate"),
                other_ca.cert_pem(),
                "Fail",
            ),
        )
        .await
        .unwrap();
    let e = pods
        .create(&PostParams::default(), &pod("c", true))
        .await
        .unwrap_err();
    let kube::Error::Api(s) = e else {
        panic!("{e:?}")
    };
    assert_eq!(s.code, 500);
    assert!(
        s.message
            .contains("failed calling webhook \"broken.example.com\""),
        "{}",
        s.message
    );
    hooks.delete("broken", &Default::default()).await.unwrap();
    hooks
        .create(
            &PostParams::default(),
            &config(
                "ignored",
                "https://127.0.0.1:1/mutate",
                other_ca.cert_pem(),
                "Ignore",
            ),
        )
        .await
        .unwrap();
    pods.create(&PostParams::default(), &pod("d", true))
        .await
        .unwrap();
}

/// A webhook on loopback offering HTTP/2 that holds each review of a pod named `p*` until
/// `together` are in flight at once, counting the connections it accepted and the reviews that came over HTTP/2.
async fn h2_webhook(
    ca: &Ca,
    together: usize,
) -> (
    SocketAddr,
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
) {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let cert = ca.issue_server("webhook", &["127.0.0.1".into()]).unwrap();
    let mut config = (*server_config(&cert, ca.cert_pem()).unwrap()).clone();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let tls = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (connections, over_h2) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let barrier = Arc::new(tokio::sync::Barrier::new(together));
    let (accepted, h2) = (connections.clone(), over_h2.clone());
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            accepted.fetch_add(1, Ordering::SeqCst);
            let (tls, barrier, h2) = (tls.clone(), barrier.clone(), h2.clone());
            tokio::spawn(async move {
                let Ok(stream) = tls.accept(tcp).await else {
                    return;
                };
                let svc = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let (barrier, h2) = (barrier.clone(), h2.clone());
                    async move {
                        if req.version() == hyper::Version::HTTP_2 {
                            h2.fetch_add(1, Ordering::SeqCst);
                        }
                        let body = req.into_body().collect().await.unwrap().to_bytes();
                        let review: Value = serde_json::from_slice(&body).unwrap();
                        let name = review["request"]["name"].as_str().unwrap_or_default();
                        if name.starts_with('p') {
                            barrier.wait().await;
                        }
                        let out = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                            "response": {"uid": review["request"]["uid"], "allowed": true}});
                        Ok::<_, Infallible>(hyper::Response::new(Full::new(Bytes::from(
                            serde_json::to_vec(&out).unwrap(),
                        ))))
                    }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    (addr, connections, over_h2)
}

#[tokio::test]
async fn concurrent_webhook_calls_share_one_http2_connection() {
    use std::sync::atomic::Ordering;
    let server = tensile_testenv::start_apiserver(ApiServerConfig::default())
        .await
        .unwrap()
        .0;
    let client = server.client().await.unwrap();
    let ca = Ca::new("webhook-ca").unwrap();
    const TOGETHER: usize = 8;
    let (addr, connections, over_h2) = h2_webhook(&ca, TOGETHER).await;
    let pods = register(&client, "hold", addr, &ca).await;
    pods.create(&PostParams::default(), &pod("warm", true))
        .await
        .unwrap();
    // The reviews are answered only when all are in flight together: over HTTP/1.1 that takes
    // a connection each, over HTTP/2 (what Kubernetes' transports use when the server offers
    // it) the one the first review opened carries them all.
    let creates = (0..TOGETHER).map(|i| {
        let pods = pods.clone();
        async move {
            pods.create(&PostParams::default(), &pod(&format!("p{i}"), true))
                .await
        }
    });
    for created in futures::future::join_all(creates).await {
        created.unwrap();
    }
    assert_eq!(over_h2.load(Ordering::SeqCst), TOGETHER + 1);
    assert_eq!(connections.load(Ordering::SeqCst), 1);
}
