//! Fidelity of the embedded API server, through kube-rs, for the semantics controllers rely
//! on. Written against the Kubernetes API only, so the same checks hold for a real server.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::autoscaling::v1::{Scale, ScaleSpec};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::core::Status;
use serde_json::json;
use tensile_sim::apiserver::{ApiServer, ApiServerConfig};
use tensile_testenv::{ClusterSpec, TestEnv, eventually};

/// A cluster without nodes: simulated, or real with TENSILE_K8S_BIN.
async fn cluster() -> (TestEnv, kube::Client) {
    let env = TestEnv::start_with(vec![ClusterSpec::new("c1", 0)])
        .await
        .unwrap();
    let client = env.clusters[0].client.clone();
    (env, client)
}

/// The simulator itself, for what only it offers (an administrator token, a tiny watch
/// history).
async fn simulator() -> (ApiServer, kube::Client) {
    let server = tensile_testenv::start_apiserver(ApiServerConfig::default())
        .await
        .unwrap()
        .0;
    let client = server.client().await.unwrap();
    (server, client)
}

fn pod(name: &str) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "web"}},
        // No scheduler serves this name, so nothing but the test writes the pod (on a real
        // control plane too).
        "spec": {"schedulerName": "fidelity-no-scheduler",
            "containers": [{"name": "c", "image": "nginx:1.27", "ports": [{"containerPort": 80}]}]}
    }))
    .unwrap()
}

fn api_error(e: kube::Error) -> Status {
    match e {
        kube::Error::Api(s) => *s,
        other => panic!("expected an API error, got {other:?}"),
    }
}

#[tokio::test]
async fn discovery_and_default_namespaces() {
    let (_env, client) = cluster().await;
    let version = client.apiserver_version().await.unwrap();
    assert_eq!(version.major, "1");
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let names: Vec<String> = namespaces
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .collect();
    for want in ["default", "kube-system", "kube-public", "kube-node-lease"] {
        assert!(names.contains(&want.to_owned()), "{names:?}");
    }
    let discovery = kube::Discovery::new(client).run().await.unwrap();
    assert!(discovery.has_group("apps"));
}

#[tokio::test]
async fn pod_create_applies_admission_defaults() {
    let (_env, client) = cluster().await;
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let p = pods
        .create(&PostParams::default(), &pod("web"))
        .await
        .unwrap();
    let spec = p.spec.as_ref().unwrap();
    assert!(
        p.metadata.uid.is_some()
            && p.metadata.resource_version.is_some()
            && p.metadata.creation_timestamp.is_some()
    );
    assert_eq!(spec.service_account_name.as_deref(), Some("default"));
    let volumes = spec.volumes.as_ref().unwrap();
    assert!(
        volumes[0].name.starts_with("kube-api-access-"),
        "{volumes:?}"
    );
    let mounts = spec.containers[0].volume_mounts.as_ref().unwrap();
    assert_eq!(
        mounts[0].mount_path,
        "/var/run/secrets/kubernetes.io/serviceaccount"
    );
    let tolerations = spec.tolerations.as_ref().unwrap();
    assert_eq!(tolerations.len(), 2);
    assert_eq!(tolerations[0].toleration_seconds, Some(300));
    assert_eq!(
        spec.containers[0].image_pull_policy.as_deref(),
        Some("IfNotPresent")
    );
    assert_eq!(
        spec.containers[0].ports.as_ref().unwrap()[0]
            .protocol
            .as_deref(),
        Some("TCP")
    );
    assert_eq!(p.status.as_ref().unwrap().phase.as_deref(), Some("Pending"));
    assert_eq!(
        p.status.as_ref().unwrap().qos_class.as_deref(),
        Some("BestEffort")
    );
}

#[tokio::test]
async fn errors_carry_the_real_reasons_and_codes() {
    let (_env, client) = cluster().await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let e = api_error(pods.get("nope").await.unwrap_err());
    assert_eq!(
        (e.code, e.reason.as_str(), e.message.as_str()),
        (404, "NotFound", "pods \"nope\" not found")
    );
    pods.create(&PostParams::default(), &pod("a"))
        .await
        .unwrap();
    let e = api_error(
        pods.create(&PostParams::default(), &pod("a"))
            .await
            .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (409, "AlreadyExists"));
    let mut bad = pod("b");
    bad.spec.as_mut().unwrap().containers.clear();
    let e = api_error(pods.create(&PostParams::default(), &bad).await.unwrap_err());
    assert_eq!((e.code, e.reason.as_str()), (422, "Invalid"));
    let missing: Api<Pod> = Api::namespaced(client, "no-such-ns");
    let e = api_error(
        missing
            .create(&PostParams::default(), &pod("c"))
            .await
            .unwrap_err(),
    );
    assert_eq!(
        (e.code, e.message.as_str()),
        (404, "namespaces \"no-such-ns\" not found")
    );
}

#[tokio::test]
async fn optimistic_concurrency_and_no_op_updates() {
    let (_env, client) = cluster().await;
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let p = pods
        .create(&PostParams::default(), &pod("web"))
        .await
        .unwrap();
    let mut changed = p.clone();
    changed
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .insert("tier".into(), "front".into());
    let updated = pods
        .replace("web", &PostParams::default(), &changed)
        .await
        .unwrap();
    assert_ne!(
        updated.metadata.resource_version,
        p.metadata.resource_version
    );
    let e = api_error(
        pods.replace("web", &PostParams::default(), &changed)
            .await
            .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (409, "Conflict"));
    let same = pods
        .replace("web", &PostParams::default(), &updated)
        .await
        .unwrap();
    assert_eq!(
        same.metadata.resource_version, updated.metadata.resource_version,
        "a no-op update is not a write"
    );
}

#[tokio::test]
async fn pod_spec_is_immutable_except_images() {
    let (_env, client) = cluster().await;
    let pods: Api<Pod> = Api::namespaced(client, "default");
    pods.create(&PostParams::default(), &pod("web"))
        .await
        .unwrap();
    let ok = pods
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"activeDeadlineSeconds": 60}})),
        )
        .await
        .unwrap();
    assert_eq!(ok.spec.unwrap().active_deadline_seconds, Some(60));
    let e = api_error(
        pods.patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"restartPolicy": "Never"}})),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(e.code, 422);
    assert!(
        e.message.contains("pod updates may not change fields"),
        "{}",
        e.message
    );
}

#[tokio::test]
async fn list_selectors_and_pagination() {
    let (_env, client) = cluster().await;
    let pods: Api<Pod> = Api::namespaced(client, "default");
    for i in 0..5 {
        let mut p = pod(&format!("p{i}"));
        p.metadata
            .labels
            .as_mut()
            .unwrap()
            .insert("n".into(), (i % 2).to_string());
        pods.create(&PostParams::default(), &p).await.unwrap();
    }
    let odd = pods
        .list(&ListParams::default().labels("n=1"))
        .await
        .unwrap();
    assert_eq!(odd.items.len(), 2);
    let first = pods.list(&ListParams::default().limit(2)).await.unwrap();
    assert_eq!(first.items.len(), 2);
    let token = first.metadata.continue_.clone().unwrap();
    let second = pods
        .list(&ListParams::default().limit(10).continue_token(&token))
        .await
        .unwrap();
    assert_eq!(second.items.len(), 3);
    assert!(second.metadata.continue_.is_none());
    let unbound = pods
        .list(&ListParams::default().fields("spec.nodeName="))
        .await
        .unwrap();
    assert_eq!(unbound.items.len(), 5);
    let e = api_error(
        pods.list(&ListParams::default().fields("spec.bogus=1"))
            .await
            .unwrap_err(),
    );
    assert_eq!(
        (e.code, e.message.as_str()),
        (400, "field label not supported: spec.bogus")
    );
}

#[tokio::test]
async fn watch_sees_a_pod_bound_to_a_node_through_a_field_selector() {
    let (_env, client) = cluster().await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let created = pods
        .create(&PostParams::default(), &pod("web"))
        .await
        .unwrap();
    let rv = created.metadata.resource_version.clone().unwrap();
    let mut stream = pods
        .watch(&WatchParams::default().fields("spec.nodeName=node-1"), &rv)
        .await
        .unwrap()
        .boxed();
    let binding = json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "web"}, "target": {"apiVersion": "v1", "kind": "Node", "name": "node-1"}});
    let req = http::Request::post("/api/v1/namespaces/default/pods/web/binding")
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&binding).unwrap())
        .unwrap();
    client.request_text(req).await.unwrap();
    let ev = tokio::time::timeout(Duration::from_secs(10), stream.try_next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    match ev {
        WatchEvent::Added(p) => assert_eq!(p.spec.unwrap().node_name.as_deref(), Some("node-1")),
        other => panic!("expected ADDED, got {other:?}"),
    }
    // A bound pod is deleted gracefully; the kubelet's grace-0 delete finishes it.
    let marked = pods.delete("web", &DeleteParams::default()).await.unwrap();
    let marked = marked.left().expect("graceful deletion returns the object");
    assert!(marked.metadata.deletion_timestamp.is_some());
    assert_eq!(marked.metadata.deletion_grace_period_seconds, Some(30));
    let ev = tokio::time::timeout(Duration::from_secs(10), stream.try_next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(matches!(ev, WatchEvent::Modified(_)), "{ev:?}");
    let uid = marked.metadata.uid.clone().unwrap();
    pods.delete(
        "web",
        &DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(kube::api::Preconditions {
                uid: Some(uid),
                resource_version: None,
            }),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    // As kube-apiserver does: the shortened grace (0) is written first, then the pod removed.
    let mut next = async || {
        tokio::time::timeout(Duration::from_secs(10), stream.try_next())
            .await
            .unwrap()
            .unwrap()
            .unwrap()
    };
    match next().await {
        WatchEvent::Modified(p) => assert_eq!(p.metadata.deletion_grace_period_seconds, Some(0)),
        other => panic!("expected MODIFIED with grace 0, got {other:?}"),
    }
    let ev = next().await;
    assert!(matches!(ev, WatchEvent::Deleted(_)), "{ev:?}");
    assert_eq!(api_error(pods.get("web").await.unwrap_err()).code, 404);
}

#[tokio::test]
async fn watch_from_a_too_old_resource_version_is_expired() {
    let config = ApiServerConfig {
        watch_history: 4,
        ..Default::default()
    };
    let server = tensile_testenv::start_apiserver(config).await.unwrap().0;
    let client = server.client().await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let first = pods
        .create(&PostParams::default(), &pod("p0"))
        .await
        .unwrap();
    for i in 1..8 {
        pods.create(&PostParams::default(), &pod(&format!("p{i}")))
            .await
            .unwrap();
    }
    let rv = first.metadata.resource_version.unwrap();
    let mut stream = pods
        .watch(&WatchParams::default(), &rv)
        .await
        .unwrap()
        .boxed();
    let ev = tokio::time::timeout(Duration::from_secs(10), stream.try_next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    match ev {
        WatchEvent::Error(e) => assert_eq!((e.code, e.reason.as_str()), (410, "Expired")),
        other => panic!("expected a 410 error event, got {other:?}"),
    }
}

#[tokio::test]
async fn kube_runtime_reflector_tracks_the_server() {
    use kube::runtime::{WatchStreamExt, reflector, watcher};
    let (_env, client) = cluster().await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let (store, writer) = reflector::store();
    let stream = watcher(pods.clone(), watcher::Config::default())
        .reflect(writer)
        .applied_objects();
    let task = tokio::spawn(async move { stream.for_each(|_| async {}).await });
    store.wait_until_ready().await.unwrap();
    for i in 0..3 {
        pods.create(&PostParams::default(), &pod(&format!("p{i}")))
            .await
            .unwrap();
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while store.len() < 3 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "reflector saw {} pods",
            store.len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    task.abort();
}

#[tokio::test]
async fn anonymous_requests_are_refused_and_tokens_work() {
    let (s, _client) = simulator().await;
    let mut config = kube::Config::new(s.url().parse().unwrap());
    config.accept_invalid_certs = true;
    let anonymous = kube::Client::try_from(config.clone()).unwrap();
    let e = api_error(
        Api::<Pod>::namespaced(anonymous, "default")
            .list(&ListParams::default())
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 401);
    config.auth_info.token = Some(s.admin_token().to_owned().into());
    let with_token = kube::Client::try_from(config).unwrap();
    Api::<Pod>::namespaced(with_token, "default")
        .list(&ListParams::default())
        .await
        .unwrap();
}

async fn raw(
    client: &kube::Client,
    method: &str,
    path: &str,
    content_type: &str,
    body: Vec<u8>,
) -> Result<String, Status> {
    let req = http::Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", content_type)
        .body(body)
        .unwrap();
    client.request_text(req).await.map_err(api_error)
}

#[tokio::test]
async fn bad_input_gets_the_right_status_and_the_server_keeps_serving() {
    let (_env, client) = cluster().await;
    let e = raw(
        &client,
        "POST",
        "/api/v1/namespaces/default/pods",
        "application/json",
        b"{not json".to_vec(),
    )
    .await
    .unwrap_err();
    assert_eq!((e.code, e.reason.as_str()), (400, "BadRequest"));
    let e = raw(
        &client,
        "POST",
        "/api/v1/namespaces/default/pods",
        "application/json",
        b"[1,2]".to_vec(),
    )
    .await
    .unwrap_err();
    assert_eq!(e.code, 400);
    let e = raw(
        &client,
        "POST",
        "/api/v1/namespaces/default/pods",
        "application/json",
        br#"{"spec":{"containers":"x"}}"#.to_vec(),
    )
    .await
    .unwrap_err();
    assert_eq!(e.code, 400, "{}", e.message);
    let e = raw(
        &client,
        "POST",
        "/api/v1/namespaces/default/pods",
        "text/plain",
        b"hello".to_vec(),
    )
    .await
    .unwrap_err();
    assert_eq!((e.code, e.reason.as_str()), (415, "UnsupportedMediaType"));
    let big = format!(
        r#"{{"metadata":{{"name":"big"}},"data":{{"k":"{}"}}}}"#,
        "x".repeat(4 * 1024 * 1024)
    );
    let e = raw(
        &client,
        "POST",
        "/api/v1/namespaces/default/configmaps",
        "application/json",
        big.into_bytes(),
    )
    .await
    .unwrap_err();
    assert_eq!((e.code, e.reason.as_str()), (413, "RequestEntityTooLarge"));
    let e = raw(
        &client,
        "GET",
        "/api/v1/widgets",
        "application/json",
        Vec::new(),
    )
    .await
    .unwrap_err();
    assert_eq!((e.code, e.reason.as_str()), (404, "NotFound"));
    let e = raw(
        &client,
        "GET",
        "/apis/nope.example.com/v1/things",
        "application/json",
        Vec::new(),
    )
    .await
    .unwrap_err();
    assert_eq!(e.code, 404);
    let e = raw(
        &client,
        "PUT",
        "/api/v1/namespaces/default/pods",
        "application/json",
        b"{}".to_vec(),
    )
    .await
    .unwrap_err();
    assert_eq!((e.code, e.reason.as_str()), (405, "MethodNotAllowed"));
    let yaml =
        b"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: from-yaml\ndata:\n  a: b\n".to_vec();
    raw(
        &client,
        "POST",
        "/api/v1/namespaces/default/configmaps",
        "application/yaml",
        yaml,
    )
    .await
    .unwrap();
    let e = raw(
        &client,
        "POST",
        "/api/v1/namespaces/default/configmaps",
        "application/yaml",
        b"a: [unclosed".to_vec(),
    )
    .await
    .unwrap_err();
    assert_eq!(e.code, 400);
    let mismatched =
        br#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"x","namespace":"other"}}"#
            .to_vec();
    let e = raw(
        &client,
        "POST",
        "/api/v1/namespaces/default/configmaps",
        "application/json",
        mismatched,
    )
    .await
    .unwrap_err();
    assert_eq!(e.code, 400);
    assert!(
        e.message.contains("does not match the namespace"),
        "{}",
        e.message
    );
    // Still serving.
    Api::<Pod>::namespaced(client, "default")
        .list(&ListParams::default())
        .await
        .unwrap();
}

#[tokio::test]
async fn patches_merge_json_and_strategic() {
    let (_env, client) = cluster().await;
    let pods: Api<Pod> = Api::namespaced(client, "default");
    pods.create(&PostParams::default(), &pod("web"))
        .await
        .unwrap();
    let p = pods
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"a": "1", "app": null}}})),
        )
        .await
        .unwrap();
    let labels = p.metadata.labels.unwrap();
    assert_eq!(
        (
            labels.get("a").map(String::as_str),
            labels.contains_key("app")
        ),
        (Some("1"), false)
    );
    let p = pods
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::<()>::Json(
                serde_json::from_value(json!([
                    {"op": "add", "path": "/metadata/annotations", "value": {"x": "y"}},
                    {"op": "replace", "path": "/spec/containers/0/image", "value": "nginx:1.28"}
                ]))
                .unwrap(),
            ),
        )
        .await
        .unwrap();
    assert_eq!(
        p.spec.unwrap().containers[0].image.as_deref(),
        Some("nginx:1.28")
    );
    let p = pods
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Strategic(
                json!({"spec": {"containers": [{"name": "c", "image": "nginx:1.29"}]}}),
            ),
        )
        .await
        .unwrap();
    let spec = p.spec.unwrap();
    assert_eq!(spec.containers.len(), 1);
    assert_eq!(spec.containers[0].image.as_deref(), Some("nginx:1.29"));
    assert_eq!(
        spec.containers[0].ports.as_ref().map(Vec::len),
        Some(1),
        "strategic merge keeps the other fields of the container"
    );
    let e = pods
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::<()>::Json(
                serde_json::from_value(json!([
        {"op": "test", "path": "/metadata/name", "value": "other"}]))
                .unwrap(),
            ),
        )
        .await
        .unwrap_err();
    assert_eq!(api_error(e).code, 422);
}

#[tokio::test]
async fn server_side_apply_creates_then_merges() {
    let (_env, client) = cluster().await;
    let cms: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(client, "default");
    let pp = PatchParams::apply("fidelity").force();
    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "applied"}, "data": {"a": "1"}});
    let created = cms.patch("applied", &pp, &Patch::Apply(&cm)).await.unwrap();
    assert_eq!(created.data.unwrap()["a"], "1");
    let more = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "applied"}, "data": {"b": "2"}});
    let merged = cms
        .patch("applied", &pp, &Patch::Apply(&more))
        .await
        .unwrap();
    // The manager applied `a` before and leaves it out now: it is removed (field ownership).
    let data = merged.data.unwrap();
    assert_eq!(
        (
            data.get("a").map(String::as_str),
            data.get("b").map(String::as_str)
        ),
        (None, Some("2"))
    );
    let managers: Vec<String> = merged
        .metadata
        .managed_fields
        .unwrap_or_default()
        .into_iter()
        .filter(|m| m.operation.as_deref() == Some("Apply"))
        .filter_map(|m| m.manager)
        .collect();
    assert_eq!(managers, ["fidelity"]);
}

#[tokio::test]
async fn send_initial_events_ends_with_a_bookmark() {
    let (_env, client) = cluster().await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    pods.create(&PostParams::default(), &pod("a"))
        .await
        .unwrap();
    let req = http::Request::get("/api/v1/namespaces/default/pods?watch=1&sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan")
        .body(Vec::new())
        .unwrap();
    let mut events = client.request_events::<Pod>(req).await.unwrap().boxed();
    let first = tokio::time::timeout(Duration::from_secs(10), events.try_next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(matches!(first, WatchEvent::Added(p) if p.metadata.name.as_deref() == Some("a")));
    let second = tokio::time::timeout(Duration::from_secs(10), events.try_next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    match second {
        WatchEvent::Bookmark(b) => assert_eq!(
            b.metadata
                .annotations
                .get("k8s.io/initial-events-end")
                .map(String::as_str),
            Some("true")
        ),
        other => panic!("expected the initial-events bookmark, got {other:?}"),
    }
}

#[tokio::test]
async fn secret_string_data_is_folded_into_data_and_never_stored() {
    let (_env, client) = cluster().await;
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(client, "default");
    let created = secrets
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "s"},
                "data": {"a": "eA==", "b": "eA=="}, "stringData": {"b": "two"}}))
            .unwrap(),
        )
        .await
        .unwrap();
    assert!(created.string_data.is_none());
    let data = created.data.unwrap();
    assert_eq!(
        (data["a"].0.as_slice(), data["b"].0.as_slice()),
        (&b"x"[..], &b"two"[..])
    );
    assert_eq!(created.type_.as_deref(), Some("Opaque"));
    let patched = secrets
        .patch(
            "s",
            &PatchParams::default(),
            &Patch::Merge(json!({"stringData": {"a": "one"}})),
        )
        .await
        .unwrap();
    assert!(patched.string_data.is_none());
    assert_eq!(patched.data.unwrap()["a"].0, b"one");
}

/// A Deployment whose pods no scheduler takes (so they stay Pending on both backends).
fn deployment(name: &str, app: &str, replicas: i32) -> Deployment {
    serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": app}},
            "template": {"metadata": {"labels": {"app": app}},
                "spec": {"schedulerName": "fidelity-no-scheduler",
                    "containers": [{"name": "c", "image": "nginx:1.27",
                        "resources": {"limits": {"cpu": "100m"}}}]}}}
    }))
    .unwrap()
}

#[tokio::test]
async fn scale_subresource_reads_and_writes_the_replicas() {
    let (_env, client) = cluster().await;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "default");
    let d = deployments
        .create(&PostParams::default(), &deployment("web", "web-s", 2))
        .await
        .unwrap();
    let scale = deployments.get_scale("web").await.unwrap();
    assert_eq!(scale.metadata.name.as_deref(), Some("web"));
    assert_eq!(scale.metadata.namespace.as_deref(), Some("default"));
    assert_eq!(scale.metadata.uid, d.metadata.uid);
    assert_eq!(
        scale.metadata.creation_timestamp,
        d.metadata.creation_timestamp
    );
    assert!(scale.metadata.resource_version.is_some());
    assert_eq!(scale.spec.unwrap().replicas, Some(2));
    assert_eq!(scale.status.unwrap().selector.as_deref(), Some("app=web-s"));

    let replicas = |s: Scale| s.spec.and_then(|s| s.replicas);
    let pp = PatchParams::default();
    let merged = deployments
        .patch_scale("web", &pp, &Patch::Merge(json!({"spec": {"replicas": 3}})))
        .await
        .unwrap();
    assert_eq!(replicas(merged), Some(3));
    let d = deployments.get("web").await.unwrap();
    assert_eq!(d.spec.as_ref().unwrap().replicas, Some(3));
    assert_eq!(d.metadata.generation, Some(2), "a scale is a spec change");
    let json_patched = deployments
        .patch_scale(
            "web",
            &pp,
            &Patch::<()>::Json(
                serde_json::from_value(
                    json!([{"op": "replace", "path": "/spec/replicas", "value": 4}]),
                )
                .unwrap(),
            ),
        )
        .await
        .unwrap();
    assert_eq!(replicas(json_patched), Some(4));
    let strategic = deployments
        .patch_scale(
            "web",
            &pp,
            &Patch::Strategic(json!({"spec": {"replicas": 1}})),
        )
        .await
        .unwrap();
    assert_eq!(replicas(strategic), Some(1));

    // PUT: the current Scale with another count (the controller writes the Deployment's
    // status meanwhile, so a lost race is retried with a fresh read).
    let put = eventually(30, "a PUT of the scale", || {
        let deployments = deployments.clone();
        async move {
            let mut s = deployments.get_scale("web").await.ok()?;
            s.spec = Some(ScaleSpec { replicas: Some(2) });
            deployments
                .replace_scale("web", &PostParams::default(), &s)
                .await
                .ok()
        }
    })
    .await;
    assert_eq!(put.spec.as_ref().and_then(|s| s.replicas), Some(2));
    // A stale resourceVersion is a conflict, and nothing changes.
    let mut stale = put.clone();
    stale.metadata.resource_version = d.metadata.resource_version.clone();
    stale.spec = Some(ScaleSpec { replicas: Some(5) });
    let e = deployments
        .replace_scale("web", &PostParams::default(), &stale)
        .await
        .unwrap_err();
    assert_eq!((api_error(e).code, "Conflict"), (409, "Conflict"));
    let e = deployments
        .patch_scale("web", &pp, &Patch::Merge(json!({"spec": {"replicas": -1}})))
        .await
        .unwrap_err();
    let e = api_error(e);
    assert_eq!((e.code, e.reason.as_str()), (422, "Invalid"));
    let d = deployments.get("web").await.unwrap();
    assert_eq!(d.spec.unwrap().replicas, Some(2));

    // A missing parent, and the methods a scale does not take.
    let e = api_error(deployments.get_scale("missing").await.unwrap_err());
    assert_eq!(
        (e.code, e.message.as_str()),
        (404, "deployments.apps \"missing\" not found")
    );
    let e = deployments
        .patch_scale(
            "missing",
            &pp,
            &Patch::Merge(json!({"spec": {"replicas": 1}})),
        )
        .await
        .unwrap_err();
    assert_eq!(api_error(e).code, 404);
    let e = raw(
        &client,
        "DELETE",
        "/apis/apps/v1/namespaces/default/deployments/web/scale",
        "application/json",
        Vec::new(),
    )
    .await
    .unwrap_err();
    assert_eq!((e.code, e.reason.as_str()), (405, "MethodNotAllowed"));
}

/// The Deployment controller follows a count written through the scale subresource: its
/// ReplicaSet is scaled. One scaling only: after the five quick ones above, a real
/// kube-controller-manager sharing two cores with other tests' control planes once took over
/// 90 s, and once over 240 s, to get there (its writes conflict, and its work queue backs off
/// per object, doubling each time), which tests its back-off rather than the scale.
#[tokio::test]
async fn a_deployment_scaled_through_its_subresource_scales_its_replicaset() {
    let (_env, client) = cluster().await;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "default");
    deployments
        .create(&PostParams::default(), &deployment("web", "web-s", 2))
        .await
        .unwrap();
    deployments
        .patch_scale(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 3}})),
        )
        .await
        .unwrap();
    let replicasets: Api<ReplicaSet> = Api::namespaced(client, "default");
    eventually(120, "the ReplicaSet scaled to 3", || {
        let replicasets = replicasets.clone();
        async move {
            let list = replicasets
                .list(&ListParams::default().labels("app=web-s"))
                .await
                .ok()?;
            list.items
                .iter()
                .any(|rs| {
                    rs.spec.as_ref().and_then(|s| s.replicas) == Some(3)
                        && rs.status.as_ref().and_then(|s| s.observed_generation)
                            == rs.metadata.generation
                })
                .then_some(())
        }
    })
    .await;
}

#[tokio::test]
async fn replicasets_and_statefulsets_have_a_scale_too() {
    let (_env, client) = cluster().await;
    let replicasets: Api<ReplicaSet> = Api::namespaced(client.clone(), "default");
    let template = json!({"metadata": {"labels": {"app": "rs-s"}},
        "spec": {"schedulerName": "fidelity-no-scheduler",
            "containers": [{"name": "c", "image": "nginx:1.27"}]}});
    replicasets
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "rs"},
                "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "rs-s"}},
                    "template": template}}))
            .unwrap(),
        )
        .await
        .unwrap();
    let s = replicasets
        .patch_scale(
            "rs",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 0}})),
        )
        .await
        .unwrap();
    // Zero is left out, as Go's omitempty leaves it out.
    assert_eq!(s.spec.and_then(|s| s.replicas), None);
    assert_eq!(s.status.unwrap().selector.as_deref(), Some("app=rs-s"));
    let rs = replicasets.get("rs").await.unwrap();
    assert_eq!(rs.spec.unwrap().replicas, Some(0));

    let statefulsets: Api<StatefulSet> = Api::namespaced(client, "default");
    statefulsets
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "db"},
                "spec": {"replicas": 0, "serviceName": "db",
                    "selector": {"matchLabels": {"app": "db-s"}},
                    "template": {"metadata": {"labels": {"app": "db-s"}},
                        "spec": {"schedulerName": "fidelity-no-scheduler",
                            "containers": [{"name": "c", "image": "nginx:1.27"}]}}}}))
            .unwrap(),
        )
        .await
        .unwrap();
    let s = statefulsets.get_scale("db").await.unwrap();
    assert_eq!(s.spec.and_then(|s| s.replicas), None);
    assert_eq!(s.status.unwrap().selector.as_deref(), Some("app=db-s"));
    let e = statefulsets.get_scale("nope").await.unwrap_err();
    assert_eq!(api_error(e).message, "statefulsets.apps \"nope\" not found");
}

#[tokio::test]
async fn deployments_record_revisions_and_leave_zero_counts_out() {
    let (_env, client) = cluster().await;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "default");
    let replicasets: Api<ReplicaSet> = Api::namespaced(client.clone(), "default");
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let created = deployments
        .create(&PostParams::default(), &deployment("rev", "rev-s", 1))
        .await
        .unwrap();
    // Pod defaults (SetDefaults_Pod) are not pod template defaults.
    let template = created.spec.unwrap().template.spec.unwrap();
    assert_eq!(template.enable_service_links, None);
    assert_eq!(
        template.containers[0].resources.as_ref().unwrap().requests,
        None
    );

    let revision = |annotations: Option<&std::collections::BTreeMap<String, String>>| {
        annotations
            .and_then(|a| a.get("deployment.kubernetes.io/revision"))
            .cloned()
    };
    let d = eventually(
        30,
        "the Deployment at revision 1, its pod unavailable",
        || {
            let deployments = deployments.clone();
            async move {
                let d = deployments.get("rev").await.ok()?;
                let status = d.status.as_ref()?;
                (revision(d.metadata.annotations.as_ref()).as_deref() == Some("1")
                    && status.unavailable_replicas == Some(1)
                    && status.replicas == Some(1))
                .then_some(d)
            }
        },
    )
    .await;
    let status = d.status.unwrap();
    assert_eq!(status.observed_generation, Some(1));
    assert_eq!(status.updated_replicas, Some(1));
    assert_eq!(
        (status.ready_replicas, status.available_replicas),
        (None, None),
        "zero counts are left out"
    );

    let rs = eventually(30, "the ReplicaSet's status", || {
        let replicasets = replicasets.clone();
        async move {
            let list = replicasets
                .list(&ListParams::default().labels("app=rev-s"))
                .await
                .ok()?;
            let [rs] = list.items.as_slice() else {
                return None;
            };
            (rs.status.as_ref()?.observed_generation == Some(1)).then(|| rs.clone())
        }
    })
    .await;
    let annotations = rs.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(
        annotations
            .get("deployment.kubernetes.io/revision")
            .map(String::as_str),
        Some("1")
    );
    assert_eq!(
        annotations
            .get("deployment.kubernetes.io/desired-replicas")
            .map(String::as_str),
        Some("1")
    );
    let rs_status = rs.status.unwrap();
    assert_eq!(rs_status.replicas, 1);
    assert_eq!(
        (rs_status.ready_replicas, rs_status.available_replicas),
        (None, None)
    );
    let rs_template = rs.spec.unwrap().template.unwrap().spec.unwrap();
    assert_eq!(rs_template.enable_service_links, None);
    let pod = eventually(30, "the Deployment's pod", || {
        let pods = pods.clone();
        async move {
            pods.list(&ListParams::default().labels("app=rev-s"))
                .await
                .ok()?
                .items
                .into_iter()
                .next()
        }
    })
    .await;
    let pod_spec = pod.spec.unwrap();
    assert_eq!(pod_spec.enable_service_links, Some(true));
    let requests = pod_spec.containers[0]
        .resources
        .as_ref()
        .and_then(|r| r.requests.clone())
        .unwrap_or_default();
    assert_eq!(requests.get("cpu").map(|q| q.0.as_str()), Some("100m"));

    // A new template is revision 2; going back to the first makes its ReplicaSet revision 3,
    // remembering 1.
    let image = |image: &str| {
        Patch::Strategic(json!({"spec": {"template": {"spec": {"containers": [
            {"name": "c", "image": image}]}}}}))
    };
    let pp = PatchParams::default();
    deployments
        .patch("rev", &pp, &image("nginx:1.28"))
        .await
        .unwrap();
    let at_revision = |want: &'static str| {
        let deployments = deployments.clone();
        move || {
            let deployments = deployments.clone();
            async move {
                let d = deployments.get("rev").await.ok()?;
                (revision(d.metadata.annotations.as_ref()).as_deref() == Some(want)).then_some(())
            }
        }
    };
    eventually(30, "the Deployment at revision 2", at_revision("2")).await;
    deployments
        .patch("rev", &pp, &image("nginx:1.27"))
        .await
        .unwrap();
    eventually(30, "the Deployment at revision 3", at_revision("3")).await;
    let first = replicasets
        .get(rs.metadata.name.as_deref().unwrap())
        .await
        .unwrap();
    let annotations = first.metadata.annotations.unwrap_or_default();
    assert_eq!(
        (
            annotations
                .get("deployment.kubernetes.io/revision")
                .map(String::as_str),
            annotations
                .get("deployment.kubernetes.io/revision-history")
                .map(String::as_str)
        ),
        (Some("3"), Some("1"))
    );
}
