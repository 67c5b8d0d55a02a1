//! The scheduler extender on simulated clusters: an upper cluster whose "virtual nodes" are plain
//! Node objects labelled `type=virtual-kubelet` and `clusterID`, lower clusters of small nodes,
//! and the extender between them — called directly with kube-scheduler's wire format, and by the
//! upper cluster's scheduler (filter, prioritize and bind).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};
use serde_json::{Value, json};
use tensile_core::keys::RESOURCE_VIRTUAL_POD;
use tensile_placement::extender::{self, ExtenderConfig, LowerClusterClient, Running};
use tensile_placement::metrics::ExtenderMetrics;
use tensile_placement::serve::{ClientAuth, LiveCert, ServingCert};
use tensile_runtime::metrics::{Readiness, serve_probes};
use tensile_simkubelet::{SimKubeletConfig, SimNode};
use tensile_testenv::certs::{Ca, Issued};
use tensile_testenv::{ClusterSpec, TestEnv, eventually, http_get, metric_value};
use tokio_util::sync::CancellationToken;

/// Lower clusters by id, each with nodes of the given cpu counts (8Gi each).
type Lowers<'a> = &'a [(&'a str, &'a [&'a str])];

struct Setup {
    env: TestEnv,
    ext: Running,
    /// Who the extender lets in: certificates of a CA of the test's, for system:kube-scheduler.
    client_auth: ClientAuth,
    /// The upper scheduler's client certificate (and the tests').
    scheduler: Issued,
    /// Its `/metrics`.
    metrics: SocketAddr,
    _stop: tokio_util::sync::DropGuard,
}

impl Setup {
    fn upper(&self) -> kube::Client {
        self.env.clusters[0].client.clone()
    }

    /// The client of lower cluster `id`.
    fn lower(&self, id: &str) -> kube::Client {
        self.env
            .clusters
            .iter()
            .find(|c| c.name == id)
            .unwrap()
            .client
            .clone()
    }

    /// Lets the upper cluster's scheduler use the extender, once the extender has seen the
    /// upper nodes (when it is sent node names only, it reads their labels from its watch).
    async fn wire(&self, node_cache_capable: bool) {
        let nodes: Api<Node> = Api::all(self.upper());
        let ext = self.ext.extender.clone();
        for node in nodes.list(&ListParams::default()).await.unwrap().items {
            let name = node.metadata.name.unwrap();
            eventually(30, &format!("the extender knows {name}"), || async {
                ext.knows_upper_node(&name).then_some(())
            })
            .await;
        }
        // The upper kube-scheduler runs with the shipped KubeSchedulerConfiguration, pointed
        // at this extender: its address, its CA (the test's certificate names 127.0.0.1, so
        // the shipped serverName goes), and how much of the nodes it is sent.
        use base64::Engine as _;
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../deploy/scheduler/kube-scheduler-config.yaml"
        );
        let mut config: Value =
            serde_saphyr::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let entry = &mut config["extenders"][0];
        entry["urlPrefix"] = format!("https://{}", self.ext.addr).into();
        entry["nodeCacheCapable"] = node_cache_capable.into();
        let b64 = |pem: &str| base64::engine::general_purpose::STANDARD.encode(pem);
        entry["tlsConfig"] = json!({
            "caData": b64(&self.ext.ca_pem),
            "certData": b64(&self.scheduler.cert_pem),
            "keyData": b64(&self.scheduler.key_pem),
        });
        self.env.clusters[0]
            .set_scheduler_config(&config)
            .await
            .unwrap();
    }

    /// POSTs `body` to the extender; status and body.
    async fn post(&self, path: &str, body: &[u8]) -> (u16, Value) {
        let (status, bytes) = post(
            self.ext.addr,
            &self.ext.ca_pem,
            &self.scheduler,
            path,
            body.to_vec(),
        )
        .await;
        let value = serde_json::from_slice(&bytes)
            .unwrap_or(Value::String(String::from_utf8_lossy(&bytes).into()));
        (status, value)
    }
}

/// An upper cluster (no nodes of its own), the lower clusters, and the extender, synced.
async fn setup(lowers: Lowers<'_>, ttl: Duration) -> Setup {
    let mut specs = vec![ClusterSpec::new("upper", 0)];
    for (id, cpus) in lowers {
        let mut spec = ClusterSpec::new(*id, 0);
        spec.kubelet = Some(SimKubeletConfig {
            nodes: cpus
                .iter()
                .enumerate()
                .map(|(i, cpu)| SimNode::new(format!("{id}-node-{}", i + 1), cpu, "8Gi"))
                .collect(),
            kubelet_api: false,
            ..SimKubeletConfig::default()
        });
        specs.push(spec);
    }
    let env = TestEnv::start_with(specs).await.unwrap();
    let clients = Ca::new("scheduler-clients").unwrap();
    let scheduler = clients
        .issue_client(extender::KUBE_SCHEDULER_USER, None)
        .unwrap();
    let client_auth = ClientAuth {
        ca_pem: clients.cert_pem().to_owned(),
        allowed_names: vec![extender::KUBE_SCHEDULER_USER.to_owned()],
    };
    let stop = CancellationToken::new();
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = ExtenderMetrics::new(&mut registry);
    let metrics_addr = serve_probes(
        "127.0.0.1:0".parse().unwrap(),
        Arc::new(registry),
        Readiness::ready(),
        stop.clone(),
    )
    .await
    .unwrap();
    let ext = extender::start(
        ExtenderConfig {
            upper: env.clusters[0].client.clone(),
            clusters: env.clusters[1..]
                .iter()
                .map(|c| LowerClusterClient {
                    id: c.name.clone(),
                    client: c.client.clone(),
                })
                .collect(),
            reservation_ttl: ttl,
            listen: "127.0.0.1:0".parse().unwrap(),
            cert: LiveCert::new(
                ServingCert::generate("tensile-scheduler", &["127.0.0.1".to_owned()]).unwrap(),
            )
            .unwrap(),
            client_auth: Some(client_auth.clone()),
            insecure_without_client_auth: false,
            metrics,
        },
        stop.clone(),
    )
    .await
    .unwrap();
    let setup = Setup {
        env,
        ext,
        client_auth,
        scheduler,
        metrics: metrics_addr,
        _stop: stop.drop_guard(),
    };
    // The lower nodes registered, then the extender listed them.
    for (id, cpus) in lowers {
        let nodes: Api<Node> = Api::all(setup.lower(id));
        eventually(30, "lower nodes registered", || async {
            (nodes.list(&ListParams::default()).await.ok()?.items.len() == cpus.len()).then_some(())
        })
        .await;
    }
    let ext = setup.ext.extender.clone();
    eventually(30, "the extender synced", || async {
        ext.synced().then_some(())
    })
    .await;
    setup
}

/// Creates an upper node: a fake virtual node when `labels` say so, with room for anything.
async fn upper_node(upper: &kube::Client, name: &str, labels: Value) -> Node {
    let node: Node = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "status": {
            "capacity": {"cpu": "1000", "memory": "4Ti", "pods": "1000"},
            "allocatable": {"cpu": "1000", "memory": "4Ti", "pods": "1000"},
            "conditions": [{"type": "Ready", "status": "True"}]
        }
    }))
    .unwrap();
    Api::<Node>::all(upper.clone())
        .create(&PostParams::default(), &node)
        .await
        .unwrap()
}

fn virtual_labels(cluster: &str) -> Value {
    json!({"type": "virtual-kubelet", "clusterID": cluster})
}

/// A pod requesting `cpu` (and 64Mi), merged with `extra`, marked as the webhook marks virtual
/// pods: kube-scheduler calls the extender for it (managedResources).
fn pod(name: &str, cpu: &str, extra: Value) -> Pod {
    let mut p = serde_json::to_value(ordinary_pod(name, cpu, extra)).unwrap();
    let marker = json!({"spec": {"containers": [{"name": "c", "image": "i", "resources": {
        "requests": {"cpu": cpu, "memory": "64Mi", RESOURCE_VIRTUAL_POD: "1"},
        "limits": {RESOURCE_VIRTUAL_POD: "1"}}}]}});
    json_patch::merge(&mut p, &marker);
    serde_json::from_value(p).unwrap()
}

/// [`pod`] without the webhook's mark: the extender is never asked about it.
fn ordinary_pod(name: &str, cpu: &str, extra: Value) -> Pod {
    let mut p = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"containers": [{"name": "c", "image": "i",
            "resources": {"requests": {"cpu": cpu, "memory": "64Mi"}}}]}});
    json_patch::merge(&mut p, &extra);
    serde_json::from_value(p).unwrap()
}

/// kube-scheduler's `ExtenderArgs` as Go marshals it (field names as keys), with full nodes.
fn args_with_nodes(pod: &Pod, nodes: &[Node]) -> Vec<u8> {
    serde_json::to_vec(
        &json!({"Pod": pod, "Nodes": {"metadata": {}, "items": nodes}, "NodeNames": null}),
    )
    .unwrap()
}

/// Names of the nodes a filter answer kept (full-node form).
fn kept(answer: &Value) -> Vec<String> {
    answer["nodes"]["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["metadata"]["name"].as_str().unwrap().to_owned())
        .collect()
}

fn failed(answer: &Value) -> BTreeMap<String, String> {
    let mut all = BTreeMap::new();
    for key in ["failedNodes", "failedAndUnresolvableNodes"] {
        for (n, r) in answer[key].as_object().unwrap() {
            all.insert(n.clone(), r.as_str().unwrap().to_owned());
        }
    }
    all
}

/// The node a pod is bound to, once it is.
async fn bound_to(pods: &Api<Pod>, name: &str) -> String {
    eventually(30, &format!("{name} bound"), || async {
        pods.get(name).await.ok()?.spec?.node_name
    })
    .await
}

/// The `PodScheduled=False` message of a pod, once it has one.
async fn not_scheduled(pods: &Api<Pod>, name: &str) -> String {
    eventually(30, &format!("{name} not scheduled"), || async {
        tensile_testenv::pod_condition(pods, name, "PodScheduled")
            .await
            .filter(|c| c.status == "False")?
            .message
    })
    .await
}

#[tokio::test]
async fn checklist_100_a_virtual_node_passes_only_if_one_lower_node_fits_the_pod() {
    // c1: 4 cores in total but 2 per node; c2: one node of 8.
    let s = setup(
        &[("c1", &["2", "2"]), ("c2", &["8"])],
        extender::DEFAULT_RESERVATION_TTL,
    )
    .await;
    let upper = s.upper();
    let small = upper_node(&upper, "vk-c1", virtual_labels("c1")).await;
    let big = upper_node(&upper, "vk-c2", virtual_labels("c2")).await;

    let (status, answer) = s
        .post(
            "/filter",
            &args_with_nodes(&pod("web", "3", json!({})), &[small.clone(), big.clone()]),
        )
        .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(kept(&answer), ["vk-c2"]);
    assert_eq!(
        answer["failedNodes"]["vk-c1"],
        "lower cluster c1: 0/2 nodes are available: 2 Insufficient cpu."
    );
    assert_eq!(answer["error"], "");

    // The constraints the lower pod will carry come from clusterSelector: the one node of c2
    // has no such label, c1's nodes neither.
    let selective = pod(
        "picky",
        "1",
        json!({"metadata": {"annotations": {"clusterSelector": "{\"nodeSelector\":{\"disk\":\"ssd\"}}"}}}),
    );
    let (_, answer) = s
        .post("/filter", &args_with_nodes(&selective, &[small, big]))
        .await;
    assert!(kept(&answer).is_empty());
    assert_eq!(
        answer["failedAndUnresolvableNodes"]["vk-c2"],
        "lower cluster c2: 0/1 nodes are available: 1 node(s) didn't match Pod's node \
         affinity/selector."
    );

    // The same through the upper scheduler (full nodes): the 3-core pod goes to vk-c2 although
    // the scheduler alone would pick vk-c1 (equal nodes, first name); a 16-core pod goes nowhere.
    s.wire(false).await;
    let pods: Api<Pod> = Api::namespaced(upper.clone(), "default");
    pods.create(&PostParams::default(), &pod("web", "3", json!({})))
        .await
        .unwrap();
    assert_eq!(bound_to(&pods, "web").await, "vk-c2");
    pods.create(&PostParams::default(), &pod("huge", "16", json!({})))
        .await
        .unwrap();
    let message = not_scheduled(&pods, "huge").await;
    assert!(
        message.starts_with("0/2 nodes are available: ")
            && message.contains("1 lower cluster c1: 0/2 nodes are available: 2 Insufficient cpu.")
            && message.contains("1 lower cluster c2: 0/1 nodes are available: 1 Insufficient cpu."),
        "{message}"
    );
}

#[tokio::test]
async fn checklist_101_other_nodes_pass_unchanged() {
    let s = setup(&[("c1", &["1"])], extender::DEFAULT_RESERVATION_TTL).await;
    let upper = s.upper();
    let nodes = vec![
        upper_node(
            &upper,
            "worker",
            json!({"kubernetes.io/hostname": "worker"}),
        )
        .await,
        upper_node(&upper, "vk-no-id", json!({"type": "virtual-kubelet"})).await,
        upper_node(&upper, "vk-unknown", virtual_labels("elsewhere")).await,
        upper_node(&upper, "not-virtual", json!({"clusterID": "c1"})).await,
        upper_node(&upper, "vk-c1", virtual_labels("c1")).await,
    ];
    let too_big = pod("big", "64", json!({}));
    let (status, answer) = s.post("/filter", &args_with_nodes(&too_big, &nodes)).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        kept(&answer),
        ["worker", "vk-no-id", "vk-unknown", "not-virtual"]
    );
    assert_eq!(failed(&answer).keys().collect::<Vec<_>>(), ["vk-c1"]);
    // Kept nodes come back as they were sent.
    assert_eq!(
        answer["nodes"]["items"][0],
        serde_json::to_value(&nodes[0]).unwrap()
    );

    // Names only (nodeCacheCapable): the extender reads the labels from its upper node watch.
    let names = json!({"Pod": too_big, "Nodes": null,
        "NodeNames": ["worker", "vk-no-id", "vk-unknown", "not-virtual", "vk-c1", "ghost"]});
    let body = serde_json::to_vec(&names).unwrap();
    let answer = eventually(30, "upper nodes watched", || async {
        let (_, answer) = s.post("/filter", &body).await;
        (answer["nodenames"].as_array()?.len() == 4).then_some(answer)
    })
    .await;
    assert_eq!(
        answer["nodenames"],
        json!(["worker", "vk-no-id", "vk-unknown", "not-virtual"])
    );
    assert_eq!(answer["nodes"], Value::Null);
    assert_eq!(
        answer["failedNodes"]["ghost"],
        "upper node ghost is not known to the tensile extender yet"
    );
    assert!(
        answer["failedNodes"]["vk-c1"]
            .as_str()
            .unwrap()
            .starts_with("lower cluster c1: ")
    );
}

#[tokio::test]
async fn the_tightest_fitting_cluster_scores_highest() {
    // A node of 2 cores in "tight", one of 8 in "roomy".
    let s = setup(
        &[("tight", &["2"]), ("roomy", &["8"])],
        extender::DEFAULT_RESERVATION_TTL,
    )
    .await;
    let upper = s.upper();
    // The scheduler alone would take vk-a-roomy among equals (first name).
    let roomy = upper_node(&upper, "vk-a-roomy", virtual_labels("roomy")).await;
    let tight = upper_node(&upper, "vk-b-tight", virtual_labels("tight")).await;
    let cpu_only = |name: &str| {
        let mut p = pod(name, "1", json!({}));
        p.spec.as_mut().unwrap().containers[0].resources = Some(
            serde_json::from_value(json!({"requests": {"cpu": "1", RESOURCE_VIRTUAL_POD: "1"},
                "limits": {RESOURCE_VIRTUAL_POD: "1"}}))
            .unwrap(),
        );
        p
    };
    let (status, scores) = s
        .post(
            "/prioritize",
            &args_with_nodes(&cpu_only("p"), &[roomy, tight]),
        )
        .await;
    assert_eq!(status, 200, "{scores}");
    assert_eq!(
        scores,
        json!([{"host": "vk-a-roomy", "score": 1}, {"host": "vk-b-tight", "score": 5}]),
        "1 of 8 free cores vs 1 of 2"
    );
    s.wire(true).await;
    let pods: Api<Pod> = Api::namespaced(upper, "default");
    pods.create(&PostParams::default(), &cpu_only("first"))
        .await
        .unwrap();
    assert_eq!(bound_to(&pods, "first").await, "vk-b-tight");
    // Its reservation now fills "tight" to the last core: the next one fills it exactly.
    assert_eq!(s.ext.extender.reservations("tight"), 1);
    let (_, scores) = s
        .post(
            "/prioritize",
            &serde_json::to_vec(
                &json!({"Pod": cpu_only("second"), "NodeNames": ["vk-a-roomy", "vk-b-tight"]}),
            )
            .unwrap(),
        )
        .await;
    assert_eq!(scores[1], json!({"host": "vk-b-tight", "score": 10}));
}

#[tokio::test]
async fn malformed_requests_get_400_with_a_reason() {
    let s = setup(&[("c1", &["1"])], extender::DEFAULT_RESERVATION_TTL).await;
    for (path, body, reason) in [
        (
            "/filter",
            &b"{\"Pod\": "[..],
            "malformed ExtenderArgs: not JSON",
        ),
        (
            "/prioritize",
            b"[1, 2]",
            "malformed ExtenderArgs: expected a JSON object",
        ),
        (
            "/filter",
            br#"{"Pod": {"metadata": 7}, "NodeNames": []}"#,
            "malformed ExtenderArgs: Pod:",
        ),
        (
            "/filter",
            br#"{"Pod": {}, "Nodes": null, "NodeNames": null}"#,
            "malformed ExtenderArgs: neither Nodes nor NodeNames",
        ),
        (
            "/bind",
            br#"{"PodName": 3, "Node": "vk"}"#,
            "malformed ExtenderBindingArgs: PodName is not a string",
        ),
        ("/bind", b"", "malformed ExtenderBindingArgs: not JSON"),
    ] {
        let (status, answer) = s.post(path, body).await;
        assert_eq!(status, 400, "{path} {answer}");
        assert!(
            answer.as_str().unwrap().starts_with(reason),
            "{path}: {answer}"
        );
    }
    let (status, answer) = s.post("/preempt", b"{}").await;
    assert_eq!(status, 404, "{answer}");
}

/// Creates the lower pod of an upper pod in its lower cluster, as the virtual node would.
async fn lower_copy(lower: &kube::Client, upper_pod: &Pod) {
    let uid = upper_pod.metadata.uid.clone().unwrap();
    let name = upper_pod.metadata.name.clone().unwrap();
    let cpu = upper_pod.spec.as_ref().unwrap().containers[0]
        .resources
        .as_ref()
        .unwrap()
        .requests
        .as_ref()
        .unwrap()["cpu"]
        .0
        .clone();
    // Without the extender's marker, as the virtual node's translation leaves it upstairs.
    let copy = ordinary_pod(
        &name,
        &cpu,
        json!({"metadata": {"annotations": {"tensile-kube.io/upper-uid": uid}}}),
    );
    Api::<Pod>::namespaced(lower.clone(), "default")
        .create(&PostParams::default(), &copy)
        .await
        .unwrap();
}

/// Cluster c1 with one 4-CPU node, its virtual node `vk-c1`, and two 3-CPU pods `a` and `b`
/// that the test binds through the extender (they are not for the upper scheduler): room for
/// one of them.
async fn two_pods_for_one_room() -> (Setup, Api<Pod>, Pod, Pod) {
    let s = setup(&[("c1", &["4"])], extender::DEFAULT_RESERVATION_TTL).await;
    let upper = s.upper();
    upper_node(&upper, "vk-c1", virtual_labels("c1")).await;
    let pods: Api<Pod> = Api::namespaced(upper, "default");
    let manual = json!({"spec": {"schedulerName": "manual"}});
    let a = pods
        .create(&PostParams::default(), &pod("a", "3", manual.clone()))
        .await
        .unwrap();
    let b = pods
        .create(&PostParams::default(), &pod("b", "3", manual))
        .await
        .unwrap();
    (s, pods, a, b)
}

/// The body of a `/bind` of `p` to `vk-c1`.
fn bind_body(p: &Pod) -> Vec<u8> {
    serde_json::to_vec(
        &json!({"PodName": p.metadata.name, "PodNamespace": "default",
        "PodUID": p.metadata.uid, "Node": "vk-c1"}),
    )
    .unwrap()
}

#[tokio::test]
async fn bind_rechecks_the_fit_and_reserves_until_the_lower_pod_exists() {
    let (s, pods, a, b) = two_pods_for_one_room().await;
    // No filter call came first: the extender reads the pod itself.
    let (status, answer) = s.post("/bind", &bind_body(&a)).await;
    assert_eq!((status, &answer), (200, &json!({"error": ""})));
    assert_eq!(bound_to(&pods, "a").await, "vk-c1");
    assert_eq!(s.ext.extender.reservations("c1"), 1);

    let refused = "lower cluster c1: 0/1 nodes are available: 1 Insufficient cpu.";
    let (_, answer) = s.post("/bind", &bind_body(&b)).await;
    assert_eq!(
        answer["error"],
        format!("{refused} (1 pod(s) not yet on a lower node counted first)")
    );
    assert_eq!(pods.get("b").await.unwrap().spec.unwrap().node_name, None);

    // The lower pod appears: the reservation goes, the lower pod itself counts.
    lower_copy(&s.lower("c1"), &pods.get("a").await.unwrap()).await;
    let ext = s.ext.extender.clone();
    eventually(30, "reservation released", || async {
        (ext.reservations("c1") == 0).then_some(())
    })
    .await;
    let lower_pods: Api<Pod> = Api::namespaced(s.lower("c1"), "default");
    bound_to(&lower_pods, "a").await;
    let (_, answer) = s.post("/bind", &bind_body(&b)).await;
    assert_eq!(answer["error"], refused);

    // Room freed downstairs: b binds.
    lower_pods
        .delete("a", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    eventually(30, "b bound once the lower pod is gone", || async {
        let (_, answer) = s.post("/bind", &bind_body(&b)).await;
        (answer["error"] == "").then_some(())
    })
    .await;
    assert_eq!(bound_to(&pods, "b").await, "vk-c1");

    // A pod that was replaced under the same name is refused.
    let (_, answer) = s
        .post(
            "/bind",
            &serde_json::to_vec(&json!({"PodName": "a", "PodNamespace": "default", "PodUID": "stale", "Node": "vk-c1"}))
                .unwrap(),
        )
        .await;
    assert!(
        answer["error"]
            .as_str()
            .unwrap()
            .contains("it was replaced"),
        "{answer}"
    );
}

/// A new leader (or a restarted extender) counts the pods its predecessor bound whose lower
/// pods have not appeared yet, from the bound Pending upper pods; without that it would promise
/// their room again. A bound pod deleted upstairs frees its room at once.
#[tokio::test]
async fn a_new_extender_counts_the_pods_its_predecessor_bound() {
    let (s, pods, a, b) = two_pods_for_one_room().await;
    let upper = s.upper();
    let (_, answer) = s.post("/bind", &bind_body(&a)).await;
    assert_eq!(answer, json!({"error": ""}));
    assert_eq!(bound_to(&pods, "a").await, "vk-c1");

    // The leader is gone; a new one starts from the clusters alone.
    let stop = CancellationToken::new();
    let next = extender::start(c1_only(upper.clone(), s.lower("c1"), &s), stop.clone())
        .await
        .unwrap();
    let ext = next.extender.clone();
    eventually(30, "the new extender counts a", || async {
        (ext.synced() && ext.reservations("c1") == 1).then_some(())
    })
    .await;
    let (_, answer) = post(
        next.addr,
        &next.ca_pem,
        &s.scheduler,
        "/bind",
        bind_body(&b),
    )
    .await;
    let answer: Value = serde_json::from_slice(&answer).unwrap();
    assert_eq!(
        answer["error"],
        "lower cluster c1: 0/1 nodes are available: 1 Insufficient cpu. \
         (1 pod(s) not yet on a lower node counted first)"
    );
    assert_eq!(pods.get("b").await.unwrap().spec.unwrap().node_name, None);

    // a is deleted before its lower pod appeared: its room is free again.
    pods.delete("a", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    eventually(30, "b bound once a is gone", || async {
        let (_, answer) = post(
            next.addr,
            &next.ca_pem,
            &s.scheduler,
            "/bind",
            bind_body(&b),
        )
        .await;
        let answer: Value = serde_json::from_slice(&answer).ok()?;
        (answer["error"] == "").then_some(())
    })
    .await;
    assert_eq!(bound_to(&pods, "b").await, "vk-c1");
    // b's lower pod appears: nothing stays reserved.
    lower_copy(&s.lower("c1"), &pods.get("b").await.unwrap()).await;
    eventually(30, "no reservation left", || async {
        (ext.reservations("c1") == 0).then_some(())
    })
    .await;
    stop.cancel();
}

/// `--metrics-addr` of the extender: each call is timed by verb, and the reservations gauge
/// follows a bind until its lower pod appears.
#[tokio::test]
async fn calls_and_reservations_show_in_the_metrics() {
    let s = setup(&[("c1", &["4"])], extender::DEFAULT_RESERVATION_TTL).await;
    let scrape = || async {
        let (status, text) = http_get(s.metrics, "/metrics").await.unwrap();
        assert_eq!(status, 200);
        text
    };
    let upper = s.upper();
    let node = upper_node(&upper, "vk-c1", virtual_labels("c1")).await;
    let pods: Api<Pod> = Api::namespaced(upper.clone(), "default");
    let a = pods
        .create(
            &PostParams::default(),
            &pod("a", "3", json!({"spec": {"schedulerName": "manual"}})),
        )
        .await
        .unwrap();
    let (status, answer) = s
        .post("/filter", &args_with_nodes(&a, std::slice::from_ref(&node)))
        .await;
    assert_eq!((status, kept(&answer)), (200, vec!["vk-c1".to_owned()]));
    let (status, _) = s.post("/prioritize", &args_with_nodes(&a, &[node])).await;
    assert_eq!(status, 200);
    let bind = json!({"PodName": "a", "PodNamespace": "default", "PodUID": a.metadata.uid,
        "Node": "vk-c1"});
    let (_, answer) = s.post("/bind", &serde_json::to_vec(&bind).unwrap()).await;
    assert_eq!(answer, json!({"error": ""}));

    let text = scrape().await;
    for (series, want) in [
        (
            r#"tensile_extender_request_seconds_count{verb="filter"}"#,
            1.0,
        ),
        (
            r#"tensile_extender_request_seconds_count{verb="prioritize"}"#,
            1.0,
        ),
        (
            r#"tensile_extender_request_seconds_count{verb="bind"}"#,
            1.0,
        ),
        (r#"tensile_extender_reservations{cluster="c1"}"#, 1.0),
        // The filter built the room; prioritize and bind judged on the one it kept.
        (r#"tensile_extender_rooms_built_total{cluster="c1"}"#, 1.0),
    ] {
        assert_eq!(
            metric_value(&text, series),
            Some(want),
            "{series} in\n{text}"
        );
    }
    lower_copy(&s.lower("c1"), &pods.get("a").await.unwrap()).await;
    eventually(30, "the reservations gauge back to 0", || async {
        (metric_value(
            &scrape().await,
            r#"tensile_extender_reservations{cluster="c1"}"#,
        ) == Some(0.0))
        .then_some(())
    })
    .await;
    assert_eq!(
        http_get(s.metrics, "/healthz").await.unwrap(),
        (200, "ok".into())
    );
}

#[tokio::test]
async fn a_reservation_lapses_after_its_ttl() {
    let s = setup(&[("c1", &["4"])], Duration::from_secs(1)).await;
    let upper = s.upper();
    upper_node(&upper, "vk-c1", virtual_labels("c1")).await;
    let pods: Api<Pod> = Api::namespaced(upper.clone(), "default");
    let manual = json!({"spec": {"schedulerName": "manual"}});
    let mut bodies = Vec::new();
    for name in ["a", "b"] {
        let p = pods
            .create(&PostParams::default(), &pod(name, "3", manual.clone()))
            .await
            .unwrap();
        bodies.push(
            serde_json::to_vec(&json!({"PodName": name, "PodNamespace": "default",
                "PodUID": p.metadata.uid, "Node": "vk-c1"}))
            .unwrap(),
        );
    }
    assert_eq!(s.post("/bind", &bodies[0]).await.1["error"], "");
    assert_ne!(s.post("/bind", &bodies[1]).await.1["error"], "");
    // No lower pod ever shows up for a: after a second its room is given back.
    eventually(10, "b bound after the TTL", || async {
        (s.post("/bind", &bodies[1]).await.1["error"] == "").then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_lower_cluster_not_listed_yet_is_an_error_the_scheduler_retries_on_its_back_off() {
    let s = setup(&[("c1", &["4"])], extender::DEFAULT_RESERVATION_TTL).await;
    let upper = s.upper();
    let vk = upper_node(&upper, "vk-c1", virtual_labels("c1")).await;
    // A second extender started while c1 is unreachable cannot list it.
    let c1 = &s.env.clusters[1];
    c1.set_available(false);
    let stop = CancellationToken::new();
    let _guard = stop.clone().drop_guard();
    let blind = extender::start(c1_only(upper.clone(), s.lower("c1"), &s), stop)
        .await
        .unwrap();
    let body = args_with_nodes(&pod("p", "1", json!({})), &[vk]);
    let (status, answer) = post(
        blind.addr,
        &blind.ca_pem,
        &s.scheduler,
        "/filter",
        body.clone(),
    )
    .await;
    assert_eq!(status, 200);
    let answer: Value = serde_json::from_slice(&answer).unwrap();
    // No node passes and one cannot be judged yet: an error, which kube-scheduler retries on
    // the pod's back-off (a refusal would park the pod until the upper cluster changes).
    assert_eq!(
        answer["error"],
        "no virtual node can take the pod now, and some cannot be judged yet: vk-c1: lower \
         cluster c1: not synced yet (its nodes and pods are still being listed); the pod is \
         retried"
    );
    assert_eq!(answer["failedNodes"], json!({}));
    c1.set_available(true);
    eventually(30, "c1 listed", || async {
        let (_, answer) = post(
            blind.addr,
            &blind.ca_pem,
            &s.scheduler,
            "/filter",
            body.clone(),
        )
        .await;
        let answer: Value = serde_json::from_slice(&answer).ok()?;
        (answer["nodes"]["items"].as_array()?.len() == 1).then_some(())
    })
    .await;
}

/// An extender on loopback for the lower cluster `c1` alone, letting in the clients `s`'s
/// does.
fn c1_only(upper: kube::Client, c1: kube::Client, s: &Setup) -> ExtenderConfig {
    ExtenderConfig {
        upper,
        clusters: vec![LowerClusterClient {
            id: "c1".into(),
            client: c1,
        }],
        reservation_ttl: extender::DEFAULT_RESERVATION_TTL,
        listen: "127.0.0.1:0".parse().unwrap(),
        cert: LiveCert::new(
            ServingCert::generate("tensile-scheduler", &["127.0.0.1".to_owned()]).unwrap(),
        )
        .unwrap(),
        client_auth: Some(s.client_auth.clone()),
        insecure_without_client_auth: false,
        metrics: Default::default(),
    }
}

/// `/bind` binds with the extender's own `pods/binding` right, skipping the pod's selectors;
/// whoever reaches the port unauthenticated used to have any pod bound. Only kube-scheduler's
/// client certificate (of the client CA, for system:kube-scheduler) is served; anyone else is
/// refused at the handshake and the pod stays unbound. And the extender does not start off
/// loopback without client certificates unless told to.
#[tokio::test]
async fn an_anonymous_bind_is_refused_and_the_pod_stays_unbound() {
    let s = setup(&[("c1", &["4"])], extender::DEFAULT_RESERVATION_TTL).await;
    let upper = s.upper();
    let vk = upper_node(&upper, "vk-c1", virtual_labels("c1")).await;
    let pods: Api<Pod> = Api::namespaced(upper.clone(), "default");
    // Its nodeSelector matches no node: the upper scheduler leaves it Pending.
    let stray = pods
        .create(
            &PostParams::default(),
            &pod(
                "stray",
                "1",
                json!({"spec": {"nodeSelector": {"no": "such-node"}}}),
            ),
        )
        .await
        .unwrap();
    let bind = bind_body(&stray);
    let filter = args_with_nodes(&stray, &[vk]);
    let stranger = Ca::new("strangers")
        .unwrap()
        .issue_client(extender::KUBE_SCHEDULER_USER, None)
        .unwrap();
    // The client CA of the extender, as a cluster CA, signs others than kube-scheduler too.
    let clients = Ca::new("scheduler-clients").unwrap();
    let mut other = s.client_auth.clone();
    other.ca_pem = clients.cert_pem().to_owned();
    let stop = CancellationToken::new();
    let _guard = stop.clone().drop_guard();
    let mut config = c1_only(upper.clone(), s.lower("c1"), &s);
    config.client_auth = Some(other);
    let second = extender::start(config, stop.clone()).await.unwrap();
    let node_user = clients
        .issue_client("system:node:vk-c1", Some("system:nodes"))
        .unwrap();
    for (addr, ca, identity) in [
        (s.ext.addr, &s.ext.ca_pem, None),
        (s.ext.addr, &s.ext.ca_pem, Some(&stranger)),
        (second.addr, &second.ca_pem, None),
        (second.addr, &second.ca_pem, Some(&node_user)),
    ] {
        for (path, body) in [("/bind", &bind), ("/filter", &filter)] {
            let refused = try_post(addr, ca, identity, path, body).await;
            assert!(refused.is_err(), "{path} served: {refused:?}");
        }
    }
    assert_eq!(
        pods.get("stray").await.unwrap().spec.unwrap().node_name,
        None
    );
    // kube-scheduler's certificate is served (and would have bound it: what was refused).
    let second_scheduler = clients
        .issue_client(extender::KUBE_SCHEDULER_USER, None)
        .unwrap();
    let served = try_post(
        second.addr,
        &second.ca_pem,
        Some(&second_scheduler),
        "/filter",
        &filter,
    )
    .await;
    assert_eq!(served, Ok(200));
    let (status, answer) = s.post("/bind", &bind).await;
    assert_eq!((status, &answer), (200, &json!({"error": ""})));
    assert_eq!(bound_to(&pods, "stray").await, "vk-c1");

    // Off loopback without client certificates: no start, with the flag that allows it named.
    let mut open = c1_only(upper.clone(), s.lower("c1"), &s);
    open.client_auth = None;
    open.listen = "0.0.0.0:0".parse().unwrap();
    let err = extender::start(open, stop.clone())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("--client-ca-file") && err.contains("--insecure-serve-without-client-auth"),
        "{err}"
    );
    let mut open = c1_only(upper.clone(), s.lower("c1"), &s);
    open.client_auth = None;
    open.listen = "0.0.0.0:0".parse().unwrap();
    open.insecure_without_client_auth = true;
    extender::start(open, stop).await.unwrap();
}

/// A POST with an optional client certificate: the status, or why the exchange failed.
async fn try_post(
    addr: SocketAddr,
    ca_pem: &str,
    identity: Option<&Issued>,
    path: &str,
    body: &[u8],
) -> Result<u16, String> {
    let config = client_config(ca_pem, identity);
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("127.0.0.1").unwrap(), tcp)
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
            .await
            .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let request = http::Request::post(path)
        .header("host", addr.to_string())
        .header("content-type", "application/json")
        .body(Full::new(Bytes::copy_from_slice(body)))
        .unwrap();
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| format!("request: {e}"))?;
    Ok(response.status().as_u16())
}

/// A TLS client trusting `ca_pem`, presenting `identity` when given.
fn client_config(ca_pem: &str, identity: Option<&Issued>) -> rustls::ClientConfig {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots);
    match identity {
        Some(id) => builder
            .with_client_auth_cert(
                CertificateDer::pem_slice_iter(id.cert_pem.as_bytes())
                    .collect::<Result<Vec<_>, _>>()
                    .unwrap(),
                rustls_pki_types::PrivateKeyDer::from_pem_slice(id.key_pem.as_bytes()).unwrap(),
            )
            .unwrap(),
        None => builder.with_no_client_auth(),
    }
}

/// The burst: 30 one-core pods at once on two virtual nodes whose lower clusters hold 4 each
/// (two nodes of 2 cores; one node of 4 cores). The upper scheduler, with the extender, binds
/// exactly 8 while no lower pod exists yet; without reservations it would bind all 30, since
/// the lower clusters still look empty.
#[tokio::test]
async fn a_burst_never_over_commits_a_lower_cluster() {
    let s = setup(
        &[("c1", &["2", "2"]), ("c2", &["4"])],
        Duration::from_secs(600),
    )
    .await;
    let upper = s.upper();
    upper_node(&upper, "vk-1", virtual_labels("c1")).await;
    upper_node(&upper, "vk-2", virtual_labels("c2")).await;
    s.wire(true).await;
    let pods: Api<Pod> = Api::namespaced(upper.clone(), "default");
    let creates = (0..30).map(|i| {
        let pods = pods.clone();
        async move {
            pods.create(
                &PostParams::default(),
                &pod(&format!("burst-{i:02}"), "1", json!({})),
            )
            .await
            .unwrap()
        }
    });
    futures::future::join_all(creates).await;

    let placement = || async {
        let mut bound: BTreeMap<String, Vec<Pod>> = BTreeMap::new();
        let mut waiting = Vec::new();
        for p in pods.list(&ListParams::default()).await.unwrap().items {
            match p.spec.as_ref().and_then(|s| s.node_name.clone()) {
                Some(node) => bound.entry(node).or_default().push(p),
                None => waiting.push(p),
            }
        }
        (bound, waiting)
    };
    // Every pod was judged: bound, or refused with the extender's reasons.
    let (bound, _) = eventually(30, "the burst judged", || async {
        let (bound, waiting) = placement().await;
        let judged = waiting.iter().all(|p| {
            p.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| {
                    c.iter()
                        .any(|c| c.type_ == "PodScheduled" && c.status == "False")
                })
        });
        (judged && waiting.len() + bound.values().map(Vec::len).sum::<usize>() == 30)
            .then_some((bound, waiting))
    })
    .await;
    let count =
        |bound: &BTreeMap<String, Vec<Pod>>, node: &str| bound.get(node).map_or(0, Vec::len);
    assert_eq!(
        (count(&bound, "vk-1"), count(&bound, "vk-2")),
        (4, 4),
        "{:?}",
        bound.keys()
    );
    assert_eq!(s.ext.extender.reservations("c1"), 4);
    assert_eq!(s.ext.extender.reservations("c2"), 4);

    // The virtual nodes create the lower pods: reservations go, the lower pods count instead,
    // and every one of them finds a lower node.
    for (node, cluster) in [("vk-1", "c1"), ("vk-2", "c2")] {
        for p in &bound[node] {
            lower_copy(&s.lower(cluster), p).await;
        }
    }
    let ext = s.ext.extender.clone();
    eventually(30, "reservations released", || async {
        (ext.reservations("c1") + ext.reservations("c2") == 0).then_some(())
    })
    .await;
    for cluster in ["c1", "c2"] {
        let lower: Api<Pod> = Api::namespaced(s.lower(cluster), "default");
        eventually(
            30,
            &format!("every lower pod of {cluster} on a node"),
            || async {
                let items = lower.list(&ListParams::default()).await.ok()?.items;
                (items.len() == 4
                    && items
                        .iter()
                        .all(|p| p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some()))
                .then_some(())
            },
        )
        .await;
    }
    // A retry after the release (its reason no longer counts pods not yet on a lower node)
    // still binds nothing more. kube-scheduler retries pods an extender refused when the
    // cluster changes, so the test changes a virtual node's labels until one has happened.
    let nodes: Api<Node> = Api::all(upper.clone());
    let touches = std::sync::atomic::AtomicU32::new(0);
    eventually(30, "a retry after the release", || async {
        let touch = touches.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let label = json!({"metadata": {"labels": {"test.tensile.io/touch": touch.to_string()}}});
        nodes
            .patch("vk-1", &PatchParams::default(), &Patch::Merge(&label))
            .await
            .ok()?;
        let (_, waiting) = placement().await;
        waiting
            .iter()
            .any(|p| {
                p.status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|c| {
                        c.iter().any(|c| {
                            c.type_ == "PodScheduled"
                                && c.message.as_deref().is_some_and(|m| {
                                    m.contains("lower cluster c1")
                                        && !m.contains("not yet on a lower node")
                                })
                        })
                    })
            })
            .then_some(())
    })
    .await;
    let (bound, waiting) = placement().await;
    assert_eq!(
        (count(&bound, "vk-1"), count(&bound, "vk-2"), waiting.len()),
        (4, 4, 22)
    );
}

/// POSTs to the extender over TLS, trusting `ca_pem`, presenting `identity`.
async fn post(
    addr: SocketAddr,
    ca_pem: &str,
    identity: &Issued,
    path: &str,
    body: Vec<u8>,
) -> (u16, Vec<u8>) {
    let config = client_config(ca_pem, Some(identity));
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("127.0.0.1").unwrap(), tcp)
        .await
        .unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
            .await
            .unwrap();
    tokio::spawn(conn);
    let request = http::Request::post(path)
        .header("host", addr.to_string())
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    let status = response.status().as_u16();
    let body = response
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes()
        .to_vec();
    (status, body)
}

/// The failure policy of the shipped configuration: the extender manages the webhook's marker
/// resource and is not ignorable. With the extender gone, a pod without the marker is
/// scheduled as if there were no extender; a marked (virtual) pod waits, Pending with the
/// reason, rather than being placed blind.
#[tokio::test]
async fn while_the_extender_is_down_ordinary_pods_are_still_scheduled() {
    let s = setup(&[("c1", &["4"])], extender::DEFAULT_RESERVATION_TTL).await;
    let upper = s.upper();
    upper_node(&upper, "plain", json!({"role": "plain"})).await;
    upper_node(&upper, "vk-c1", virtual_labels("c1")).await;
    s.wire(false).await;
    let pods: Api<Pod> = Api::namespaced(upper.clone(), "default");
    let on_virtual = json!({"spec": {"nodeSelector": {"type": "virtual-kubelet"}}});
    let on_plain = json!({"spec": {"nodeSelector": {"role": "plain"}}});
    // Both kinds are scheduled while it answers.
    pods.create(
        &PostParams::default(),
        &pod("virtual-1", "1", on_virtual.clone()),
    )
    .await
    .unwrap();
    assert_eq!(bound_to(&pods, "virtual-1").await, "vk-c1");
    pods.create(
        &PostParams::default(),
        &ordinary_pod("ordinary-1", "1", on_plain.clone()),
    )
    .await
    .unwrap();
    assert_eq!(bound_to(&pods, "ordinary-1").await, "plain");

    let Setup {
        env, ext, _stop, ..
    } = s;
    let address = ext.addr.to_string();
    drop(_stop);
    tokio::time::timeout(Duration::from_secs(30), ext.handle)
        .await
        .expect("the extender stops")
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(env.clusters[0].client.clone(), "default");
    pods.create(&PostParams::default(), &pod("virtual-2", "1", on_virtual))
        .await
        .unwrap();
    pods.create(
        &PostParams::default(),
        &ordinary_pod("ordinary-2", "1", on_plain),
    )
    .await
    .unwrap();
    assert_eq!(bound_to(&pods, "ordinary-2").await, "plain");
    // The reason names the extender that did not answer.
    let why = not_scheduled(&pods, "virtual-2").await;
    assert!(why.contains(&address), "{why}");
    assert_eq!(
        pods.get("virtual-2").await.unwrap().spec.unwrap().node_name,
        None
    );
}

/// Correctness at scale: a lower cluster that disappears mid-burst gets no more pods. Its
/// virtual node fails with the reason while its watches cannot reach it, the rest of the burst
/// goes to the other cluster, and once it is back it takes pods again. Before, the extender
/// kept judging it by its last known room and bound pods that could only wait there.
#[tokio::test]
async fn a_lower_cluster_that_disappears_mid_burst_gets_no_more_pods() {
    // c1 fits a 1-core pod tighter than c2, so it is preferred while it answers.
    let s = setup(
        &[("c1", &["2", "2"]), ("c2", &["8"])],
        Duration::from_secs(600),
    )
    .await;
    let upper = s.upper();
    let vk1 = upper_node(&upper, "vk-1", virtual_labels("c1")).await;
    upper_node(&upper, "vk-2", virtual_labels("c2")).await;
    s.wire(true).await;
    let pods: Api<Pod> = Api::namespaced(upper.clone(), "default");
    let create = |name: String| {
        let pods = pods.clone();
        async move {
            pods.create(&PostParams::default(), &pod(&name, "1", json!({})))
                .await
                .unwrap();
            name
        }
    };
    let first = create("first".into()).await;
    assert_eq!(bound_to(&pods, &first).await, "vk-1");

    // c1 goes away: its virtual node fails with the reason once the watches notice (the
    // probe asks about it alone: an error, which kube-scheduler retries on the back-off).
    s.env.clusters[1].set_available(false);
    let probe = args_with_nodes(&pod("probe", "1", json!({})), std::slice::from_ref(&vk1));
    let reason = eventually(30, "c1 seen unreachable", || async {
        let (status, answer) = s.post("/filter", &probe).await;
        let error = answer["error"].as_str()?.to_owned();
        (status == 200 && error.contains("unreachable")).then_some(error)
    })
    .await;
    assert!(
        reason.contains("vk-1: lower cluster c1: unreachable (")
            && reason.ends_with("the pod is retried"),
        "{reason}"
    );
    // The rest of the burst: every pod to c2, none to the cluster that is gone.
    let rest = futures::future::join_all((0..5).map(|i| create(format!("rest-{i}")))).await;
    for name in &rest {
        assert_eq!(bound_to(&pods, name).await, "vk-2", "{name}");
    }

    // Back: c1 takes pods again (its watches relist, or their failures stop).
    s.env.clusters[1].set_available(true);
    eventually(30, "c1 judged by its room again", || async {
        let (_, answer) = s.post("/filter", &probe).await;
        (failed(&answer).is_empty() && answer["error"] == "").then_some(())
    })
    .await;
}

/// A pod that arrives while the only lower cluster that could take it is unreachable is bound
/// once the cluster is back, though nothing changes upstairs: the extender answers an error,
/// which kube-scheduler retries on the pod's back-off. Refused nodes would have parked the pod
/// until some change in the upper cluster: up to five minutes in a quiet one.
#[tokio::test]
async fn a_pod_that_came_while_its_cluster_was_unreachable_is_bound_when_it_is_back() {
    let s = setup(&[("c1", &["4"])], Duration::from_secs(600)).await;
    let upper = s.upper();
    let vk = upper_node(&upper, "vk-1", virtual_labels("c1")).await;
    s.wire(true).await;
    s.env.clusters[1].set_available(false);
    let probe = args_with_nodes(&pod("probe", "1", json!({})), std::slice::from_ref(&vk));
    eventually(30, "c1 seen unreachable", || async {
        let (_, answer) = s.post("/filter", &probe).await;
        answer["error"]
            .as_str()?
            .contains("unreachable")
            .then_some(())
    })
    .await;
    let pods: Api<Pod> = Api::namespaced(upper.clone(), "default");
    pods.create(&PostParams::default(), &pod("waiting", "1", json!({})))
        .await
        .unwrap();
    let message = eventually(60, "the scheduler's error", || {
        tensile_testenv::condition_message(&pods, "waiting", "PodScheduled", "SchedulerError")
    })
    .await;
    assert!(
        message.contains("lower cluster c1: unreachable"),
        "{message}"
    );
    s.env.clusters[1].set_available(true);
    assert_eq!(bound_to(&pods, "waiting").await, "vk-1");
}

/// Correctness at scale: two bursts racing for the last room of one lower node through two
/// virtual nodes of the same lower cluster get exactly that room between them, and a lower node
/// cordoned while reservations point at it takes no more pods (its reservations move to the
/// room left elsewhere).
#[tokio::test]
async fn racing_bursts_and_a_cordoned_node_never_over_commit_the_room() {
    let s = setup(
        &[("c1", &["2", "2"]), ("c2", &["1"])],
        Duration::from_secs(600),
    )
    .await;
    let upper = s.upper();
    // Two virtual nodes for c1 (as two tensile nodes on one lower cluster), one for c2.
    upper_node(&upper, "vk-a", virtual_labels("c1")).await;
    upper_node(&upper, "vk-b", virtual_labels("c1")).await;
    upper_node(&upper, "vk-c", virtual_labels("c2")).await;
    s.wire(true).await;
    let pods: Api<Pod> = Api::namespaced(upper.clone(), "default");
    let burst = |prefix: &'static str, count: usize| {
        let pods = pods.clone();
        async move {
            let creates = (0..count).map(|i| {
                let pods = pods.clone();
                async move {
                    pods.create(
                        &PostParams::default(),
                        &pod(&format!("{prefix}-{i}"), "1", json!({})),
                    )
                    .await
                    .unwrap()
                }
            });
            futures::future::join_all(creates).await
        }
    };
    // Two bursts at once: 6 one-core pods each for 5 cores (4 in c1 over two nodes, 1 in c2).
    let (a, b) = tokio::join!(burst("a", 6), burst("b", 6));
    let names: Vec<String> = a
        .iter()
        .chain(&b)
        .map(|p| p.metadata.name.clone().unwrap())
        .collect();
    let judged = |names: Vec<String>| {
        let pods = pods.clone();
        async move {
            eventually(60, "every pod judged", || async {
                let mut on: BTreeMap<String, usize> = BTreeMap::new();
                for name in &names {
                    let p = pods.get(name).await.ok()?;
                    let node = p.spec.as_ref().and_then(|s| s.node_name.clone());
                    let refused = p
                        .status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .is_some_and(|c| {
                            c.iter()
                                .any(|c| c.type_ == "PodScheduled" && c.status == "False")
                        });
                    match node {
                        Some(n) => *on.entry(n).or_default() += 1,
                        None if refused => *on.entry("refused".into()).or_default() += 1,
                        None => return None,
                    }
                }
                Some(on)
            })
            .await
        }
    };
    let on = judged(names).await;
    let count = |on: &BTreeMap<String, usize>, k: &str| on.get(k).copied().unwrap_or(0);
    assert_eq!(count(&on, "vk-a") + count(&on, "vk-b"), 4, "{on:?}");
    assert_eq!(count(&on, "vk-c"), 1, "{on:?}");
    assert_eq!(count(&on, "refused"), 7, "{on:?}");
    assert_eq!(s.ext.extender.reservations("c1"), 4);

    // The four reservations of c1 fill both its nodes. Cordoned downstairs, one node's room
    // is gone: once two of the reserved pods are deleted, the two left hold the other node,
    // and c1 takes nothing new (without the cordon it would take two more).
    let lower_nodes: Api<Node> = Api::all(s.lower("c1"));
    lower_nodes
        .patch(
            "c1-node-1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"unschedulable": true}})),
        )
        .await
        .unwrap();
    // At once: no kubelet upstairs would confirm a graceful delete. The refused pods go too,
    // or the scheduler's retries of them would take what the late ones are asked about.
    let now = DeleteParams {
        grace_period_seconds: Some(0),
        ..DeleteParams::default()
    };
    let mut bound_c1 = Vec::new();
    for p in pods.list(&ListParams::default()).await.unwrap().items {
        let name = p.metadata.name.unwrap();
        match p.spec.and_then(|s| s.node_name).as_deref() {
            Some("vk-a" | "vk-b") => bound_c1.push(name),
            Some(_) => {}
            None => {
                pods.delete(&name, &now).await.unwrap();
            }
        }
    }
    for name in &bound_c1[..2] {
        pods.delete(name, &now).await.unwrap();
    }
    let ext = s.ext.extender.clone();
    eventually(30, "the deleted pods' reservations released", || async {
        (ext.reservations("c1") == 2).then_some(())
    })
    .await;
    // The extender has seen the cordon (its node watch is not the pod watch above).
    let vk_a = Api::<Node>::all(upper.clone()).get("vk-a").await.unwrap();
    let probe = args_with_nodes(&pod("probe", "1", json!({})), &[vk_a]);
    eventually(30, "c1 full for the extender", || async {
        let (_, answer) = s.post("/filter", &probe).await;
        failed(&answer).contains_key("vk-a").then_some(())
    })
    .await;
    let late = burst("late", 3).await;
    let on = judged(
        late.iter()
            .map(|p| p.metadata.name.clone().unwrap())
            .collect(),
    )
    .await;
    assert_eq!(count(&on, "refused"), 3, "{on:?}");
}
