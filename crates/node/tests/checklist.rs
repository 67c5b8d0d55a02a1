//! Behaviours that need a virtual node between two clusters: what the node advertises and
//! renews, a pod waiting for what it needs, creation failures, deletions (grace, UID
//! preconditions, orphans at start), and the kubelet API's certificates, logs, exec and stats.
//! The rules that need no cluster are tested in `tensile-core`; where they differ from the
//! original, `docs/differences.md` says why.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::SinkExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod, ServiceAccount};
use kube::api::{Api, AttachParams, DeleteParams, ListParams, PostParams, TerminalSize};
use serde_json::json;
use tokio::io::AsyncReadExt;

use crate::common;
use crate::common::{NodeOptions, clusters, eventually, gone, phase, pod, spawn, start};

fn get(path: &str) -> http::Request<Vec<u8>> {
    http::Request::get(path).body(Vec::new()).unwrap()
}

/// The upper pod's `tensile-kube.io/Offloaded` condition: (reason, message).
async fn offloaded(api: &Api<Pod>, name: &str) -> Option<(String, String)> {
    let c = tensile_testenv::pod_condition(api, name, "tensile-kube.io/Offloaded").await?;
    Some((c.reason.unwrap_or_default(), c.message.unwrap_or_default()))
}

/// Creates pod `name` with `spec` (its volume `v` mounted) whose volume source is missing
/// upstairs, and waits for the reason on the pod: ProviderFailed with `message` in it.
async fn missing_volume_is_reported(
    pods: &Api<Pod>,
    name: &str,
    mut spec: serde_json::Value,
    message: &str,
) {
    spec["containers"] = json!([{"name": "c", "image": "nginx", "volumeMounts": [{"name": "v", "mountPath": "/v"}]}]);
    pods.create(
        &PostParams::default(),
        &pod(name, "vk-lower", json!({"spec": spec})),
    )
    .await
    .unwrap();
    let (reason, got) = eventually(30, "the missing volume source reported", || async {
        offloaded(pods, name).await
    })
    .await;
    assert_eq!(reason, "ProviderFailed");
    assert!(got.contains(message), "{got}");
}

async fn running(api: &Api<Pod>, name: &str) {
    eventually(60, &format!("{name} running"), || async {
        (phase(api, name).await? == "Running").then_some(())
    })
    .await;
}

#[tokio::test]
async fn checklist_04_05_the_node_advertises_its_kubelet_port_and_the_lower_version() {
    let env = clusters().await;
    let node = spawn(&env, NodeOptions::new("vk-lower")).await;
    let nodes: Api<Node> = Api::all(env.clusters[0].client.clone());
    let n = eventually(30, "node registered", || async {
        nodes.get_opt("vk-lower").await.ok()?
    })
    .await;
    let status = n.status.unwrap();
    assert_eq!(
        status
            .daemon_endpoints
            .unwrap()
            .kubelet_endpoint
            .unwrap()
            .port,
        i32::from(node.kubelet.port()),
        "the port the kubelet API really listens on"
    );
    let lower_version = env.clusters[1]
        .client
        .apiserver_version()
        .await
        .unwrap()
        .git_version;
    assert_eq!(status.node_info.unwrap().kubelet_version, lower_version);
    node.stop.cancel();
}

#[tokio::test]
async fn checklist_17_18_status_heartbeat_and_lease_are_renewed_and_the_lease_is_owned_by_the_node()
{
    let env = clusters().await;
    let mut opts = NodeOptions::new("vk-lower");
    opts.heartbeat = Duration::from_secs(1);
    let node = spawn(&env, opts).await;
    let upper = env.clusters[0].client.clone();
    let nodes: Api<Node> = Api::all(upper.clone());
    let leases: Api<Lease> = Api::namespaced(upper, "kube-node-lease");
    let heartbeat = || async {
        nodes
            .get_opt("vk-lower")
            .await
            .ok()??
            .status?
            .conditions?
            .into_iter()
            .find(|c| c.type_ == "Ready")?
            .last_heartbeat_time
            .map(|t| t.0)
    };
    let first = eventually(30, "a Ready heartbeat", heartbeat).await;
    eventually(30, "the heartbeat renewed with nothing changed", || async {
        (heartbeat().await? > first).then_some(())
    })
    .await;

    let lease = eventually(30, "the lease", || async {
        leases.get_opt("vk-lower").await.ok()?
    })
    .await;
    let spec = lease.spec.clone().unwrap();
    assert_eq!(spec.lease_duration_seconds, Some(40));
    // The holder names the process (the test helper's fixed identity for the node), so that a
    // second process for the same node can see the lease is taken.
    assert_eq!(spec.holder_identity.as_deref(), Some("vk-lower_test"));
    let owner = &lease.metadata.owner_references.unwrap()[0];
    let node_uid = nodes.get("vk-lower").await.unwrap().metadata.uid.unwrap();
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str(), &owner.uid),
        ("Node", "vk-lower", &node_uid)
    );
    let renewed = spec.renew_time.unwrap().0;
    eventually(30, "the lease renewed", || async {
        let t = leases.get("vk-lower").await.ok()?.spec?.renew_time?.0;
        (t > renewed).then_some(())
    })
    .await;
    node.stop.cancel();
}

#[tokio::test]
async fn checklist_31_a_config_map_created_after_the_pod_is_copied_and_the_pod_starts() {
    let (env, stop) = start().await;
    let (upper, lower) = (&env.clusters[0].client, &env.clusters[1].client);
    let pods: Api<Pod> = Api::namespaced(upper.clone(), "default");
    let pod_spec = json!({"volumes": [{"name": "v", "configMap": {"name": "late"}}]});
    missing_volume_is_reported(&pods, "web", pod_spec, "configmap default/late not found").await;
    Api::<ConfigMap>::namespaced(upper.clone(), "default")
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "late"}, "data": {"k": "v"}}))
            .unwrap(),
        )
        .await
        .unwrap();
    running(&pods, "web").await;
    let copy = Api::<ConfigMap>::namespaced(lower.clone(), "default")
        .get("late")
        .await
        .unwrap();
    assert_eq!(copy.data.unwrap()["k"], "v");
    stop.cancel();
}

#[tokio::test]
async fn checklist_34_fix_a_missing_secret_keeps_the_pod_pending_with_the_reason_even_with_restart_policy_never()
 {
    let (env, stop) = start().await;
    let pods: Api<Pod> = Api::namespaced(env.clusters[0].client.clone(), "default");
    let pod_spec = json!({"restartPolicy": "Never", "volumes": [{"name": "v", "secret": {"secretName": "absent"}}]});
    missing_volume_is_reported(&pods, "once", pod_spec, "secret default/absent not found").await;
    // Like a kubelet waiting for a volume: Pending and retried, not Failed (the original failed
    // a restartPolicy=Never pod, so a Secret created a second late lost the Job's pod).
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(phase(&pods, "once").await.as_deref(), Some("Pending"));
    let events = Api::<k8s_openapi::api::core::v1::Event>::namespaced(
        env.clusters[0].client.clone(),
        "default",
    );
    let warned = eventually(30, "a Warning event on the pod", || async {
        let list = events.list(&ListParams::default()).await.ok()?;
        list.items.into_iter().find(|e| {
            e.involved_object.name.as_deref() == Some("once")
                && e.type_.as_deref() == Some("Warning")
        })
    })
    .await;
    assert!(
        warned.message.unwrap_or_default().contains("absent"),
        "the event names the Secret"
    );
    stop.cancel();
}

#[tokio::test]
async fn checklist_37_with_service_accounts_off_no_lower_service_account_is_created() {
    let env = clusters().await;
    let mut opts = NodeOptions::new("vk-lower");
    opts.service_accounts = false;
    let node = spawn(&env, opts).await;
    let (upper, lower) = (&env.clusters[0].client, &env.clusters[1].client);
    Api::<ServiceAccount>::namespaced(upper.clone(), "default")
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": "robot"}}))
            .unwrap(),
        )
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(upper.clone(), "default");
    pods.create(
        &PostParams::default(),
        &pod(
            "web",
            "vk-lower",
            json!({"spec": {"serviceAccountName": "robot"}}),
        ),
    )
    .await
    .unwrap();
    // The sync went through (the lower pod exists or its failure is on the upper pod)...
    let lower_pods: Api<Pod> = Api::namespaced(lower.clone(), "default");
    eventually(30, "the pod synced", || async {
        let created = lower_pods.get_opt("web").await.ok()?.is_some();
        (created || offloaded(&pods, "web").await.is_some()).then_some(())
    })
    .await;
    // ...without creating the ServiceAccount downstairs.
    assert!(
        Api::<ServiceAccount>::namespaced(lower.clone(), "default")
            .get_opt("robot")
            .await
            .unwrap()
            .is_none()
    );
    node.stop.cancel();
}

#[tokio::test]
async fn checklist_38_a_lower_creation_failure_is_reported_on_the_upper_pod_and_retried() {
    let (env, stop) = start().await;
    let pods: Api<Pod> = Api::namespaced(env.clusters[0].client.clone(), "default");
    // Let the node start and sync while the lower cluster is up, then take it away.
    pods.create(&PostParams::default(), &pod("first", "vk-lower", json!({})))
        .await
        .unwrap();
    running(&pods, "first").await;
    env.clusters[1].set_available(false);
    pods.create(&PostParams::default(), &pod("web", "vk-lower", json!({})))
        .await
        .unwrap();
    let (reason, message) = eventually(60, "the failure reported", || async {
        offloaded(&pods, "web").await
    })
    .await;
    assert_eq!(reason, "ProviderFailed");
    assert!(message.contains("lower cluster"), "{message}");
    env.clusters[1].set_available(true);
    running(&pods, "web").await;
    stop.cancel();
}

/// The grace period of each pod DELETE the node sent downstairs: (pod name, grace).
fn deletion_graces(seen: &Recorded) -> Vec<(String, Option<i64>)> {
    seen.lock()
        .unwrap()
        .iter()
        .filter(|(m, p, _)| m == "DELETE" && p.contains("/pods/"))
        .map(|(_, path, body)| {
            let body: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
            (
                path.rsplit('/').next().unwrap_or_default().to_owned(),
                body["gracePeriodSeconds"].as_i64(),
            )
        })
        .collect()
}

#[tokio::test]
async fn checklist_45_46_an_upper_deletion_passes_its_grace_down_and_finishes_when_the_lower_pod_is_gone()
 {
    let env = clusters().await;
    let (lower, seen) = recording_client(&env).await;
    let node = spawn(&env, NodeOptions::new("vk-lower").lower(lower)).await;
    let pods: Api<Pod> = Api::namespaced(env.clusters[0].client.clone(), "default");
    let lower_pods: Api<Pod> = Api::namespaced(env.clusters[1].client.clone(), "default");
    for name in ["graceful", "forced"] {
        pods.create(&PostParams::default(), &pod(name, "vk-lower", json!({})))
            .await
            .unwrap();
        running(&pods, name).await;
    }
    pods.delete("graceful", &DeleteParams::default().grace_period(7))
        .await
        .unwrap();
    // The upper pod is finished as soon as the lower one is gone (the simulated container
    // stops at once), not after the 7 s.
    eventually(60, "graceful gone in both clusters", || async {
        (pods.get_opt("graceful").await.ok()?.is_none()
            && lower_pods.get_opt("graceful").await.ok()?.is_none())
        .then_some(())
    })
    .await;
    // A forced deletion upstairs is a forced deletion downstairs.
    pods.delete("forced", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    gone(&lower_pods, "forced", 60, "forced gone downstairs").await;
    let graces = deletion_graces(&seen);
    let first = |name: &str| graces.iter().find(|(n, _)| n == name).map(|(_, g)| *g);
    assert_eq!(first("graceful"), Some(Some(7)), "{graces:?}");
    assert_eq!(first("forced"), Some(Some(0)), "{graces:?}");
    node.stop.cancel();
}

#[tokio::test]
async fn checklist_47_deleting_an_upper_pod_whose_lower_pod_is_already_gone_finishes_it() {
    let (env, stop) = start().await;
    let (upper, lower) = (&env.clusters[0].client, &env.clusters[1].client);
    let pods: Api<Pod> = Api::namespaced(upper.clone(), "default");
    pods.create(&PostParams::default(), &pod("web", "vk-lower", json!({})))
        .await
        .unwrap();
    running(&pods, "web").await;
    // Stop the node, remove the lower pod behind its back, delete upstairs, start it again.
    stop.cancel();
    Api::<Pod>::namespaced(lower.clone(), "default")
        .delete("web", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    pods.delete("web", &DeleteParams::default()).await.unwrap();
    let again = common::spawn_node(&env, "vk-lower").await;
    gone(&pods, "web", 30, "the upper pod finished").await;
    again.cancel();
}

/// Every request to the lower cluster, with its body: (method, path, body).
type Recorded = Arc<Mutex<Vec<(String, String, String)>>>;

/// A client of the lower cluster that records what it sends.
async fn recording_client(env: &tensile_testenv::TestEnv) -> (kube::Client, Recorded) {
    struct Recording<S> {
        inner: S,
        seen: Recorded,
    }
    impl<S> tower::Service<http::Request<kube::client::Body>> for Recording<S>
    where
        S: tower::Service<http::Request<kube::client::Body>>,
    {
        type Response = S::Response;
        type Error = S::Error;
        type Future = S::Future;
        fn poll_ready(
            &mut self,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Result<(), S::Error>> {
            self.inner.poll_ready(cx)
        }
        fn call(&mut self, req: http::Request<kube::client::Body>) -> Self::Future {
            // Request bodies of deletes are complete in memory: collecting a copy never waits.
            let body = req
                .body()
                .try_clone()
                .and_then(|b| futures::executor::block_on(http_body_util::BodyExt::collect(b)).ok())
                .map(|c| String::from_utf8_lossy(&c.to_bytes()).into_owned())
                .unwrap_or_default();
            self.seen.lock().unwrap().push((
                req.method().to_string(),
                req.uri().path().to_owned(),
                body,
            ));
            self.inner.call(req)
        }
    }
    let seen: Recorded = Arc::default();
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(&env.clusters[1].kubeconfig).unwrap(),
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .unwrap();
    let layer_seen = seen.clone();
    let client = kube::client::ClientBuilder::try_from(config)
        .unwrap()
        .with_layer(&tower::layer::layer_fn(move |inner| Recording {
            inner,
            seen: layer_seen.clone(),
        }))
        .build();
    (client, seen)
}

#[tokio::test]
async fn checklist_48_fix_every_lower_pod_deletion_carries_the_uid_precondition() {
    let env = clusters().await;
    let (lower, seen) = recording_client(&env).await;
    let node = spawn(&env, NodeOptions::new("vk-lower").lower(lower)).await;
    let pods: Api<Pod> = Api::namespaced(env.clusters[0].client.clone(), "default");
    let lower_pods: Api<Pod> = Api::namespaced(env.clusters[1].client.clone(), "default");
    for name in ["a", "b"] {
        pods.create(&PostParams::default(), &pod(name, "vk-lower", json!({})))
            .await
            .unwrap();
        running(&pods, name).await;
    }
    let uid_a = lower_pods.get("a").await.unwrap().metadata.uid.unwrap();
    let uid_b = lower_pods.get("b").await.unwrap().metadata.uid.unwrap();
    pods.delete("a", &DeleteParams::default()).await.unwrap();
    pods.delete("b", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    eventually(60, "both gone downstairs", || async {
        (lower_pods.get_opt("a").await.ok()?.is_none()
            && lower_pods.get_opt("b").await.ok()?.is_none())
        .then_some(())
    })
    .await;
    let deletes: Vec<_> = seen
        .lock()
        .unwrap()
        .iter()
        .filter(|(m, p, _)| m == "DELETE" && p.contains("/pods/"))
        .cloned()
        .collect();
    assert!(deletes.len() >= 2, "{deletes:?}");
    for (_, path, body) in &deletes {
        let uid = if path.ends_with("/a") { &uid_a } else { &uid_b };
        let body: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(
            &body["preconditions"]["uid"],
            uid.as_str(),
            "{path}: {body}"
        );
    }
    // The lower API server refuses a deletion whose precondition does not hold.
    pods.create(&PostParams::default(), &pod("c", "vk-lower", json!({})))
        .await
        .unwrap();
    running(&pods, "c").await;
    let refused = lower_pods
        .delete(
            "c",
            &DeleteParams {
                preconditions: Some(kube::api::Preconditions {
                    uid: Some(uid_a),
                    resource_version: None,
                }),
                ..Default::default()
            },
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&refused, kube::Error::Api(s) if s.code == 409),
        "{refused:?}"
    );
    node.stop.cancel();
}

#[tokio::test]
async fn checklist_56_fix_at_start_only_this_nodes_orphans_are_deleted() {
    let env = clusters().await;
    let lower_pods: Api<Pod> = Api::namespaced(env.clusters[1].client.clone(), "default");
    let lower_pod = |name: &str, owner: &str| -> Pod {
        serde_json::from_value(json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {"virtual-pod": "true", "tensile-kube.io/owner": owner},
                "annotations": {"tensile-kube.io/upper-uid": "0d5cbd8e-0000-4000-8000-000000000000"}},
            "spec": {"containers": [{"name": "c", "image": "nginx"}]}}))
        .unwrap()
    };
    for (name, owner) in [("mine", "vk-lower"), ("other", "vk-other")] {
        lower_pods
            .create(&PostParams::default(), &lower_pod(name, owner))
            .await
            .unwrap();
    }
    let mut plain = lower_pod("plain", "x");
    plain.metadata.labels = None;
    plain.metadata.annotations = None;
    lower_pods
        .create(&PostParams::default(), &plain)
        .await
        .unwrap();
    let node = spawn(&env, NodeOptions::new("vk-lower")).await;
    eventually(30, "our orphan deleted", || async {
        let p = lower_pods.get_opt("mine").await.ok()?;
        p.is_none_or(|p| p.metadata.deletion_timestamp.is_some())
            .then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    for name in ["other", "plain"] {
        let p = lower_pods.get(name).await.unwrap();
        assert!(
            p.metadata.deletion_timestamp.is_none(),
            "{name} is not ours and stays"
        );
    }
    node.stop.cancel();
}

/// A running pod upstairs that logs `line 1`..`line 15`, on a node with metrics served.
async fn logging_pod() -> (tensile_testenv::TestEnv, common::Spawned, Api<Pod>) {
    let env = clusters().await;
    let mut opts = NodeOptions::new("vk-lower");
    opts.metrics = true;
    let node = spawn(&env, opts).await;
    let pods: Api<Pod> = Api::namespaced(env.clusters[0].client.clone(), "default");
    let script: String = (1..=15).map(|i| format!("echo line {i}; ")).collect();
    pods.create(
        &PostParams::default(),
        &pod(
            "web",
            "vk-lower",
            json!({"spec": {"containers": [{"name": "c", "image": "nginx",
                "command": ["sh", "-c", format!("{script}sleep 100000")],
                "resources": {"requests": {"cpu": "250m", "memory": "64Mi"}}}]}}),
        ),
    )
    .await
    .unwrap();
    running(&pods, "web").await;
    (env, node, pods)
}

/// A GET on the virtual node's kubelet API through the upper API server's node proxy (the
/// API server's kubelet client certificate, authorized by SubjectAccessReview upstairs).
async fn via_proxy(env: &tensile_testenv::TestEnv, path: &str) -> Result<String, kube::Error> {
    env.clusters[0]
        .client
        .request_text(get(&format!("/api/v1/nodes/vk-lower/proxy{path}")))
        .await
}

#[tokio::test]
async fn checklist_57_58_fix_without_a_certificate_one_is_generated_and_clients_without_one_are_refused()
 {
    let (env, node, _pods) = logging_pod().await;
    // Served over TLS with a generated certificate, reachable by the upper API server...
    let text = via_proxy(&env, "/containerLogs/default/web/c?tailLines=1")
        .await
        .unwrap();
    assert_eq!(text, "line 15\n");
    // ...and refusing a client with neither certificate nor token.
    let mut config = kube::Config::new(
        format!("https://{}", node.kubelet)
            .parse::<http::Uri>()
            .unwrap(),
    );
    config.accept_invalid_certs = true;
    let anonymous = kube::Client::try_from(config).unwrap();
    let refused = anonymous
        .request_text(get("/containerLogs/default/web/c"))
        .await
        .unwrap_err();
    assert!(
        matches!(&refused, kube::Error::Api(s) if s.code == 401),
        "{refused:?}"
    );
    node.stop.cancel();
}

#[tokio::test]
async fn checklist_59_60_61_62_logs_through_the_virtual_node() {
    let (env, node, pods) = logging_pod().await;
    let text = via_proxy(&env, "/containerLogs/default/web/c?tailLines=10")
        .await
        .unwrap();
    let expected: String = (6..=15).map(|i| format!("line {i}\n")).collect();
    assert_eq!(text, expected);
    let stamped = via_proxy(
        &env,
        "/containerLogs/default/web/c?tailLines=1&timestamps=true",
    )
    .await
    .unwrap();
    assert!(stamped.ends_with("Z line 15\n"), "{stamped}");
    let limited = via_proxy(&env, "/containerLogs/default/web/c?limitBytes=4")
        .await
        .unwrap();
    assert_eq!(limited.len(), 4, "{limited}");
    let recent = via_proxy(&env, "/containerLogs/default/web/c?sinceSeconds=3600")
        .await
        .unwrap();
    assert!(recent.ends_with("line 15\n"), "{recent}");
    for bad in [
        "sinceSeconds=10&sinceTime=2026-01-01T00:00:00Z",
        "tailLines=-1",
        "limitBytes=0",
    ] {
        let e = via_proxy(&env, &format!("/containerLogs/default/web/c?{bad}"))
            .await
            .unwrap_err();
        assert!(
            matches!(&e, kube::Error::Api(s) if s.code == 400),
            "{bad}: {e:?}"
        );
    }
    // follow: lines arrive as they are written (the simulated container ticks every second).
    let mut follow = pods
        .log_stream(
            "web",
            &kube::api::LogParams {
                follow: true,
                tail_lines: Some(1),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 256];
    tokio::time::timeout(Duration::from_secs(30), async {
        while !String::from_utf8_lossy(&got).contains("tick") {
            let n = futures::AsyncReadExt::read(&mut follow, &mut buf)
                .await
                .unwrap();
            assert!(n > 0, "the followed log ended");
            got.extend_from_slice(&buf[..n]);
        }
    })
    .await
    .expect("a followed line within 30 s");
    node.stop.cancel();
}

#[tokio::test]
async fn checklist_63_64_exec_through_the_virtual_node_with_terminal_resizes() {
    let (env, node, pods) = logging_pod().await;
    let mut exec = pods
        .exec("web", ["hostname"], &AttachParams::default().stderr(false))
        .await
        .unwrap();
    let mut out = String::new();
    exec.stdout()
        .unwrap()
        .read_to_string(&mut out)
        .await
        .unwrap();
    assert_eq!(out, "web\n", "ran in the lower pod of the same name");
    // With a terminal, the size the client sets reaches the lower container.
    let mut tty = pods
        .exec(
            "web",
            ["stty", "size"],
            &AttachParams::interactive_tty().stdin(false),
        )
        .await
        .unwrap();
    let mut sizes = tty.terminal_size().unwrap();
    sizes
        .send(TerminalSize {
            width: 132,
            height: 43,
        })
        .await
        .unwrap();
    let mut out = String::new();
    tty.stdout()
        .unwrap()
        .read_to_string(&mut out)
        .await
        .unwrap();
    assert_eq!(out.trim(), "43 132");
    // tty with stderr, and exec with no stream at all: 400 from the kubelet API.
    for bad in [
        "/exec/default/web/c?command=hostname&tty=1&stdout=1&stderr=1",
        "/exec/default/web/c?command=hostname",
    ] {
        let e = env.clusters[0]
            .client
            .request_text(
                http::Request::post(format!("/api/v1/nodes/vk-lower/proxy{bad}"))
                    .body(Vec::new())
                    .unwrap(),
            )
            .await
            .unwrap_err();
        assert!(
            matches!(&e, kube::Error::Api(s) if s.code == 400),
            "{bad}: {e:?}"
        );
    }
    node.stop.cancel();
}

#[tokio::test]
async fn checklist_65_66_67_stats_summary_on_the_kubelet_port_only_and_the_other_paths() {
    let (env, node, _pods) = logging_pod().await;
    let summary: serde_json::Value = eventually(60, "stats of the pod", || async {
        let s: serde_json::Value =
            serde_json::from_str(&via_proxy(&env, "/stats/summary").await.ok()?).ok()?;
        let pods = s["pods"].as_array()?;
        pods.iter()
            .any(|p| p["podRef"]["name"] == "web" && p["cpu"]["usageNanoCores"].as_u64() > Some(0))
            .then_some(s)
    })
    .await;
    let pods = summary["pods"].as_array().unwrap();
    let sum = |f: &dyn Fn(&serde_json::Value) -> u64| pods.iter().map(f).sum::<u64>();
    let cpu = sum(&|p| p["cpu"]["usageNanoCores"].as_u64().unwrap_or(0));
    let memory = sum(&|p| p["memory"]["workingSetBytes"].as_u64().unwrap_or(0));
    assert!(cpu > 0 && memory > 0, "{summary}");
    assert_eq!(summary["node"]["cpu"]["usageNanoCores"], cpu);
    assert_eq!(summary["node"]["memory"]["workingSetBytes"], memory);

    // The metrics address: Prometheus metrics and probes, never the stats summary (pod names,
    // namespaces, UIDs without credentials).
    let plain = |path: &'static str| {
        let addr = node.metrics.unwrap();
        async move {
            let mut config =
                kube::Config::new(format!("http://{addr}").parse::<http::Uri>().unwrap());
            config.accept_invalid_certs = true;
            kube::Client::try_from(config)
                .unwrap()
                .request_text(get(path))
                .await
        }
    };
    let lower_pod_lists = || {
        node.calls
            .count("lower", tensile_runtime::clients::Verb::List, "pods")
    };
    let e = plain("/stats/summary").await.unwrap_err();
    assert!(matches!(&e, kube::Error::Api(s) if s.code == 404), "{e:?}");
    let lists_before = lower_pod_lists();
    let second: serde_json::Value =
        serde_json::from_str(&via_proxy(&env, "/stats/summary").await.unwrap()).unwrap();
    assert_eq!(second["node"]["nodeName"], summary["node"]["nodeName"]);
    // Stats come from the pod controller's watch cache: a scrape (metrics-server's, every
    // 10-60 s) LISTs only the metrics API, never the lower pods.
    assert_eq!(
        lower_pod_lists(),
        lists_before,
        "stats listed the lower pods"
    );
    assert_eq!(
        second["pods"].as_array().unwrap().len(),
        pods.len(),
        "{second}"
    );
    let metrics = plain("/metrics").await.unwrap();
    assert!(
        metrics.contains("tensile_pod_sync_seconds_bucket{"),
        "{metrics}"
    );
    // The pod was created downstairs and its status came up: both stages are timed.
    for stage in ["lower_pod_create", "upper_status"] {
        let series = format!("tensile_pod_sync_seconds_count{{stage=\"{stage}\"}}");
        assert!(
            tensile_testenv::metric_value(&metrics, &series).is_some_and(|n| n >= 1.0),
            "{series} in\n{metrics}"
        );
    }
    assert_eq!(plain("/healthz").await.unwrap(), "ok");
    assert_eq!(plain("/readyz").await.unwrap(), "ok");

    // Unknown paths 404; /pods lists the node's pods (the original answered 501).
    let e = via_proxy(&env, "/no/such/path").await.unwrap_err();
    assert!(matches!(&e, kube::Error::Api(s) if s.code == 404), "{e:?}");
    let listed: serde_json::Value =
        serde_json::from_str(&via_proxy(&env, "/pods").await.unwrap()).unwrap();
    assert_eq!(listed["items"][0]["metadata"]["name"], "web");
    node.stop.cancel();
}
