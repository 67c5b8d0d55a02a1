//! `tensile webhook`: fixture AdmissionReviews in process, the HTTPS server, and the shipped
//! MutatingWebhookConfiguration called for real by a `sim` API server on pod create.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::sync::Arc;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::{ConfigMap, Endpoints, PersistentVolumeClaim, Pod, Service};
use kube::api::{Api, PostParams};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde_json::{Value, json};
use tensile_placement::metrics::WebhookMetrics;
use tensile_placement::serve::{Server, ServingCert, tls_config};
use tensile_placement::webhook::{Webhook, WebhookConfig};
use tensile_runtime::metrics::{Readiness, serve_probes};
use tensile_sim::apiserver::ApiServerConfig;
use tensile_testenv::{http_get, metric_value};
use tokio_util::sync::CancellationToken;

fn review(operation: &str, object: Value) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "req-1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "shop", "operation": operation, "object": object}
    }))
    .unwrap()
}

fn virtual_pod(spec: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web", "labels": {"virtual-pod": "true"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web",
                "uid": "rs-1", "controller": true}]},
        "spec": spec})
}

/// The response, and the object with its patch applied.
fn answer(webhook: &Webhook, body: &[u8], object: &Value) -> (Value, Value) {
    let reply = webhook.review(body).unwrap();
    assert_eq!(reply["kind"], "AdmissionReview");
    let response = reply["response"].clone();
    let mut patched = object.clone();
    if let Some(patch) = response.get("patch").and_then(Value::as_str) {
        assert_eq!(response["patchType"], "JSONPatch");
        let patch: json_patch::Patch = serde_json::from_slice(&B64.decode(patch).unwrap()).unwrap();
        json_patch::patch(&mut patched, &patch).unwrap();
    }
    (response, patched)
}

#[test]
fn checklist_81_83_85_a_virtual_pod_gets_a_json_patch_moving_its_constraints() {
    let webhook = Webhook::new(WebhookConfig::default());
    let pod = virtual_pod(json!({"containers": [{"name": "c", "image": "nginx"}],
        "nodeSelector": {"clusterID": "c1", "disk": "ssd"},
        "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists",
                         "effect": "NoExecute", "tolerationSeconds": 300}]}));
    let (response, patched) = answer(&webhook, &review("CREATE", pod.clone()), &pod);
    assert_eq!(response["uid"], "req-1");
    assert_eq!(response["allowed"], true);
    assert_eq!(patched["spec"]["nodeSelector"], json!({"clusterID": "c1"}));
    assert_eq!(
        patched["metadata"]["annotations"]["clusterSelector"],
        r#"{"nodeSelector":{"disk":"ssd"},"tolerations":[{"key":"node.kubernetes.io/not-ready","operator":"Exists","effect":"NoExecute","tolerationSeconds":300}]}"#
    );
    assert_eq!(
        patched["spec"]["tolerations"],
        json!([
            {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
            {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"}
        ])
    );
    // The marker that makes kube-scheduler call the extender for this pod, and nothing else.
    assert_eq!(
        patched["spec"]["containers"],
        json!([{"name": "c", "image": "nginx", "resources": {
            "requests": {"tensile-kube.io/virtual-pod": "1"},
            "limits": {"tensile-kube.io/virtual-pod": "1"}}}]),
        "everything else untouched"
    );
    // Idempotent: the mutated pod passes through with no patch.
    let (again, _) = answer(&webhook, &review("CREATE", patched.clone()), &patched);
    assert_eq!(again["allowed"], true);
    assert_eq!(again.get("patch"), None, "{again}");
}

#[test]
fn checklist_82_86_pods_left_alone_get_no_patch() {
    let webhook = Webhook::new(WebhookConfig::default());
    let with_selector = |labels: Value| {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "labels": labels},
            "spec": {"nodeSelector": {"disk": "ssd"}, "containers": []}})
    };
    for pod in [
        with_selector(json!({"app": "x"})),
        with_selector(Value::Null),
        with_selector(json!({"virtual-pod": "true", "create-by-descheduler": "true"})),
        // Nothing to move, so no patch.
        virtual_pod(json!({"containers": []})),
    ] {
        let (response, patched) = answer(&webhook, &review("CREATE", pod.clone()), &pod);
        assert_eq!(response["allowed"], true);
        assert_eq!(response.get("patch"), None, "{pod}");
        assert_eq!(patched, pod);
    }
    let mut in_kube_system: Value = serde_json::from_slice(&review(
        "CREATE",
        virtual_pod(json!({"nodeSelector": {"a": "b"}})),
    ))
    .unwrap();
    in_kube_system["request"]["namespace"] = json!("kube-system");
    let reply = webhook
        .review(&serde_json::to_vec(&in_kube_system).unwrap())
        .unwrap();
    assert_eq!(reply["response"].get("patch"), None);
}

#[test]
fn checklist_88_unexpected_requests_are_refused_with_a_reason() {
    let webhook = Webhook::new(WebhookConfig::default());
    let mut not_a_pod: Value = serde_json::from_slice(&review("CREATE", json!({}))).unwrap();
    not_a_pod["request"]["kind"] = json!({"group": "apps", "version": "v1", "kind": "Deployment"});
    let reply = webhook
        .review(&serde_json::to_vec(&not_a_pod).unwrap())
        .unwrap();
    assert_eq!(reply["response"]["allowed"], false);
    assert_eq!(reply["response"]["uid"], "req-1");
    assert!(
        reply["response"]["status"]["message"]
            .as_str()
            .unwrap()
            .contains("mutates pods only")
    );

    let broken = virtual_pod(json!({"containers": "not a list"}));
    let reply = webhook.review(&review("CREATE", broken)).unwrap();
    assert_eq!(reply["response"]["allowed"], false);
    assert!(
        reply["response"]["status"]["message"]
            .as_str()
            .unwrap()
            .starts_with("the pod cannot be decoded")
    );

    let bad_annotation = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "labels": {"virtual-pod": "true"}, "annotations": {"clusterSelector": "{"}},
        "spec": {"nodeSelector": {"disk": "ssd"}, "containers": []}});
    let reply = webhook.review(&review("CREATE", bad_annotation)).unwrap();
    assert_eq!(reply["response"]["allowed"], false);
    assert!(
        reply["response"]["status"]["message"]
            .as_str()
            .unwrap()
            .contains("clusterSelector")
    );

    for body in [
        &b"not json"[..],
        br#"{"apiVersion":"v1","kind":"Pod"}"#,
        br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#,
        br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"kind":{"kind":"Pod"}}}"#,
    ] {
        assert!(webhook.review(body).is_err(), "{}", String::from_utf8_lossy(body));
    }
}

#[test]
fn the_descheduler_mark_alone_excludes_nothing_and_an_update_is_never_mutated() {
    // Exclusions come from the descheduler's records (a watch), not from what one replica
    // happened to see: the mark on an UPDATE changes nothing.
    let webhook = Webhook::new(WebhookConfig::default());
    let mut marked = virtual_pod(json!({"nodeName": "vk-a", "containers": []}));
    marked["metadata"]["annotations"] = json!({"unschedulable-node": "vk-a"});
    let (update, _) = answer(&webhook, &review("UPDATE", marked.clone()), &marked);
    assert_eq!(update["allowed"], true);
    assert_eq!(update.get("patch"), None, "an UPDATE is never mutated");
    let next = virtual_pod(json!({"containers": []}));
    let (_, patched) = answer(&webhook, &review("CREATE", next.clone()), &next);
    assert_eq!(patched["spec"].get("affinity"), None);
    assert!(webhook.excluded_for("rs-1").is_empty());
}

/// One HTTPS request to the server, optionally with a client certificate.
async fn https(
    addr: std::net::SocketAddr,
    ca_pem: &str,
    identity: Option<(&str, &str)>,
    method: &str,
    path: &str,
    body: Vec<u8>,
) -> Result<(u16, Vec<u8>), String> {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let config = match identity {
        Some((cert, key)) => builder
            .with_client_auth_cert(
                CertificateDer::pem_slice_iter(cert.as_bytes())
                    .collect::<Result<Vec<_>, _>>()
                    .unwrap(),
                PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap(),
            )
            .unwrap(),
        None => builder.with_no_client_auth(),
    };
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let req = http::Request::builder()
        .method(method)
        .uri(path)
        .header("host", "localhost")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    let res = sender
        .send_request(req)
        .await
        .map_err(|e| format!("request: {e}"))?;
    let status = res.status().as_u16();
    let body = res.into_body().collect().await.unwrap().to_bytes().to_vec();
    Ok((status, body))
}

async fn serve(client_ca: Option<&str>) -> (Server, ServingCert) {
    let cert = ServingCert::generate("tensile-webhook", &["localhost".into()]).unwrap();
    let server = Server::start(
        "127.0.0.1:0".parse().unwrap(),
        tls_config(&cert, client_ca).unwrap(),
        Arc::new(Webhook::new(WebhookConfig::default())),
    )
    .await
    .unwrap();
    (server, cert)
}

#[tokio::test]
async fn checklist_89_healthz_and_required_client_certificates() {
    let (server, cert) = serve(None).await;
    let (status, body) = https(server.addr(), &cert.ca_pem, None, "GET", "/healthz", vec![])
        .await
        .unwrap();
    assert_eq!((status, body.as_slice()), (200, &b"ok"[..]));
    let (status, body) = https(
        server.addr(),
        &cert.ca_pem,
        None,
        "POST",
        "/mutate",
        b"{".to_vec(),
    )
    .await
    .unwrap();
    assert_eq!(status, 400);
    assert!(String::from_utf8_lossy(&body).contains("not JSON"));

    // With a client CA: a client without a certificate, or with one of another CA, is
    // refused; one with a certificate of that CA is served.
    let clients = tensile_testenv::certs::Ca::new("clients").unwrap();
    let strangers = tensile_testenv::certs::Ca::new("strangers").unwrap();
    let (server, cert) = serve(Some(clients.cert_pem())).await;
    let get = |identity: Option<tensile_testenv::certs::Issued>| {
        let ca = cert.ca_pem.clone();
        let addr = server.addr();
        async move {
            let id = identity
                .as_ref()
                .map(|i| (i.cert_pem.as_str(), i.key_pem.as_str()));
            https(addr, &ca, id, "GET", "/healthz", vec![]).await
        }
    };
    assert!(get(None).await.is_err());
    let stranger = strangers.issue_client("apiserver", None).unwrap();
    assert!(get(Some(stranger)).await.is_err());
    let apiserver = clients.issue_client("apiserver", None).unwrap();
    assert_eq!(get(Some(apiserver)).await.unwrap().0, 200);
}

fn shipped_configuration(ca_pem: &str) -> MutatingWebhookConfiguration {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../deploy/webhook/mutating-webhook-configuration.yaml"
    ))
    .unwrap();
    let mut config: Value = serde_saphyr::from_str(&text).unwrap();
    config["webhooks"][0]["clientConfig"]["caBundle"] = json!(B64.encode(ca_pem));
    serde_json::from_value(config).unwrap()
}

#[tokio::test]
async fn the_sim_api_server_calls_the_shipped_configuration_on_pod_create() {
    let upper = tensile_testenv::start_apiserver(ApiServerConfig::default())
        .await
        .unwrap()
        .0;
    let client = upper.client().await.unwrap();
    let stop = CancellationToken::new();
    // A claim bound on virtual node vk-b before the webhook starts: its watch must list it.
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "default");
    claims
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "data",
                "annotations": {"volume.kubernetes.io/selected-node": "vk-b"}},
                "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}))
            .unwrap(),
        )
        .await
        .unwrap();
    let webhook =
        Arc::new(Webhook::connected(WebhookConfig::default(), client.clone(), &stop).await);
    let cert = ServingCert::generate(
        "tensile-webhook",
        &["tensile-webhook.kube-system.svc".into()],
    )
    .unwrap();
    let server = Server::start(
        "127.0.0.1:0".parse().unwrap(),
        tls_config(&cert, None).unwrap(),
        webhook.clone(),
    )
    .await
    .unwrap();
    // The shipped configuration names Service kube-system/tensile-webhook; here it has no
    // selector and its Endpoints point at the webhook on loopback.
    Api::<Service>::namespaced(client.clone(), "kube-system")
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "tensile-webhook"},
                "spec": {"ports": [{"port": 443, "targetPort": server.addr().port()}]}}))
            .unwrap(),
        )
        .await
        .unwrap();
    Api::<Endpoints>::namespaced(client.clone(), "kube-system")
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "tensile-webhook"},
                "subsets": [{"addresses": [{"ip": "127.0.0.1"}],
                    "ports": [{"port": server.addr().port()}]}]}))
            .unwrap(),
        )
        .await
        .unwrap();
    Api::<MutatingWebhookConfiguration>::all(client.clone())
        .create(&PostParams::default(), &shipped_configuration(&cert.ca_pem))
        .await
        .unwrap();

    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pod = |name: &str, labels: Value, spec: Value| -> Pod {
        let mut spec = spec;
        spec["containers"] = json!([{"name": "c", "image": "nginx"}]);
        serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}, "spec": spec}))
            .unwrap()
    };
    let created = pods
        .create(
            &PostParams::default(),
            &pod(
                "web",
                json!({"virtual-pod": "true"}),
                json!({"nodeSelector": {"clusterID": "c1", "disk": "ssd"}}),
            ),
        )
        .await
        .unwrap();
    let annotations = created.metadata.annotations.clone().unwrap();
    assert!(
        annotations["clusterSelector"].starts_with(r#"{"nodeSelector":{"disk":"ssd"}"#),
        "{annotations:?}"
    );
    assert_eq!(
        created.spec.as_ref().unwrap().node_selector,
        Some([("clusterID".to_owned(), "c1".to_owned())].into())
    );

    // Not labelled: the objectSelector keeps it away from the webhook.
    let plain = pods
        .create(
            &PostParams::default(),
            &pod("plain", json!({}), json!({"nodeSelector": {"disk": "ssd"}})),
        )
        .await
        .unwrap();
    assert_eq!(plain.metadata.annotations, None);

    // A claim whose selected node is a virtual node pins the pod to that node.
    let pinned = pods
        .create(
            &PostParams::default(),
            &pod(
                "db",
                json!({"virtual-pod": "true"}),
                json!({"volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "data"}}]}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(pinned.spec.unwrap().node_name.as_deref(), Some("vk-b"));

    // kube-system is excluded by the namespaceSelector.
    let system: Api<Pod> = Api::namespaced(client.clone(), "kube-system");
    let p = system
        .create(
            &PostParams::default(),
            &pod(
                "sys",
                json!({"virtual-pod": "true"}),
                json!({"nodeSelector": {"disk": "ssd"}}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(p.metadata.annotations, None);

    // A request the webhook refuses reaches the user with its reason.
    let e = pods
        .create(&PostParams::default(), &{
            let mut p = pod(
                "bad",
                json!({"virtual-pod": "true"}),
                json!({"nodeSelector": {"disk": "ssd"}}),
            );
            p.metadata.annotations = Some([("clusterSelector".to_owned(), "[".to_owned())].into());
            p
        })
        .await
        .unwrap_err();
    let kube::Error::Api(status) = e else {
        panic!("{e:?}")
    };
    assert!(
        status.message.contains("denied the request") && status.message.contains("clusterSelector"),
        "{}",
        status.message
    );

    // The descheduler's exclusion record for a controller (as it writes it before deleting
    // the moved pod): the controller's next pod avoids that node, and other nodes lapse.
    let owned = |name: &str| {
        let mut p = pod(
            name,
            json!({"virtual-pod": "true"}),
            json!({"nodeSelector": {"disk": "ssd"}}),
        );
        p.metadata.owner_references = Some(vec![
            serde_json::from_value(json!({"apiVersion": "apps/v1", "kind": "ReplicaSet",
                "name": "web", "uid": "rs-uid-1", "controller": true}))
            .unwrap(),
        ]);
        p
    };
    let soon =
        k8s_openapi::jiff::Timestamp::now() + k8s_openapi::jiff::SignedDuration::from_secs(600);
    let record: ConfigMap = serde_json::from_value(json!({"metadata": {
            "name": "tensile-exclusions-rs-uid-1", "labels": {"tensile-kube.io/move": "exclusions"}},
        "data": {"vk-a": soon.to_string(), "vk-lapsed": "2020-01-01T00:00:00Z"}}))
    .unwrap();
    Api::<ConfigMap>::namespaced(client.clone(), "kube-system")
        .create(&PostParams::default(), &record)
        .await
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while webhook.excluded_for("rs-uid-1").is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "the record never reached the webhook"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let next = pods
        .create(&PostParams::default(), &owned("web-2"))
        .await
        .unwrap();
    assert_eq!(
        next.metadata.annotations.unwrap()["tensile-kube.io/excluded-nodes"],
        "vk-a"
    );
    stop.cancel();
}

/// `--metrics-addr` of the webhook: every answer is timed and counted by decision, and the
/// probes answer (`/readyz` 503 until the component says it is ready).
#[tokio::test]
async fn admissions_show_in_the_metrics_and_the_probes_answer() {
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = WebhookMetrics::new(&mut registry);
    let webhook = Webhook::new(WebhookConfig::default()).with_metrics(metrics);
    let readiness = Readiness::not_ready("starting");
    let stop = CancellationToken::new();
    let addr = serve_probes(
        "127.0.0.1:0".parse().unwrap(),
        Arc::new(registry),
        readiness.clone(),
        stop.clone(),
    )
    .await
    .unwrap();
    assert_eq!(
        http_get(addr, "/healthz").await.unwrap(),
        (200, "ok".into())
    );
    assert_eq!(
        http_get(addr, "/readyz").await.unwrap(),
        (503, "starting".into())
    );
    readiness.set_ready();
    assert_eq!(http_get(addr, "/readyz").await.unwrap(), (200, "ok".into()));

    let pod = virtual_pod(json!({"containers": [], "nodeSelector": {"disk": "ssd"}}));
    let (response, _) = answer(&webhook, &review("CREATE", pod.clone()), &pod);
    assert!(response.get("patch").is_some());
    let plain = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
        "spec": {"containers": []}});
    answer(&webhook, &review("CREATE", plain.clone()), &plain);
    let bad = virtual_pod(json!({"containers": []}));
    let mut bad_review: Value = serde_json::from_slice(&review("CREATE", bad)).unwrap();
    bad_review["request"]["object"]["metadata"]["annotations"] =
        json!({"clusterSelector": "{not json"});
    let refused = webhook
        .review(&serde_json::to_vec(&bad_review).unwrap())
        .unwrap();
    assert_eq!(refused["response"]["allowed"], false, "{refused}");
    assert!(webhook.review(b"not json").is_err());

    let (status, text) = http_get(addr, "/metrics").await.unwrap();
    assert_eq!(status, 200);
    for (series, want) in [
        (
            r#"tensile_webhook_decisions_total{decision="patched"}"#,
            1.0,
        ),
        (
            r#"tensile_webhook_decisions_total{decision="allowed"}"#,
            1.0,
        ),
        (r#"tensile_webhook_decisions_total{decision="denied"}"#, 1.0),
        (
            r#"tensile_webhook_decisions_total{decision="invalid"}"#,
            1.0,
        ),
        ("tensile_webhook_admission_seconds_count", 4.0),
    ] {
        assert_eq!(
            metric_value(&text, series),
            Some(want),
            "{series} in\n{text}"
        );
    }
    stop.cancel();
}
