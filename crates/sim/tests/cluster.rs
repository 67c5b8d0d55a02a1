//! The simulated cluster as a whole: control loops and simulated nodes, through kube-rs.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::{eventually, from};

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::{Endpoints, Namespace, Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::json;
use tensile_sim::apiserver::controllers::Controllers;
use tensile_testenv::{ClusterSpec, TestEnv};

fn deployment(name: &str, replicas: i32, cpu: &str) -> Deployment {
    from(
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "c", "image": "nginx:1.27", "ports": [{"containerPort": 80, "name": "http"}],
                    "resources": {"requests": {"cpu": cpu}}}]}}}}),
    )
}

#[tokio::test]
async fn a_deployment_runs_on_simulated_nodes_and_its_service_gets_endpoints() {
    let env = TestEnv::start(1).await.unwrap();
    let c = &env.clusters[0];
    // Its kubeconfig holds administrator credentials: owner-only.
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(&c.kubeconfig).unwrap().permissions(),
    );
    assert_eq!(mode & 0o777, 0o600, "{}", c.kubeconfig.display());
    let deployments: Api<Deployment> = Api::namespaced(c.client.clone(), "default");
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), "default");
    deployments
        .create(&PostParams::default(), &deployment("web", 3, "100m"))
        .await
        .unwrap();
    let services: Api<Service> = Api::namespaced(c.client.clone(), "default");
    services
        .create(
            &PostParams::default(),
            &from(
                json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 8080, "targetPort": "http"}]}}),
            ),
        )
        .await
        .unwrap();
    eventually(30, "3 available replicas", || async {
        let d = deployments.get("web").await.ok()?;
        (d.status?.available_replicas? == 3).then_some(())
    })
    .await;
    let list = pods
        .list(&ListParams::default().labels("app=web"))
        .await
        .unwrap();
    assert_eq!(list.items.len(), 3);
    for p in &list.items {
        let status = p.status.as_ref().unwrap();
        assert_eq!(status.phase.as_deref(), Some("Running"));
        assert!(status.pod_ip.as_deref().unwrap().starts_with("10.244."));
        assert!(
            p.spec
                .as_ref()
                .unwrap()
                .node_name
                .as_deref()
                .unwrap()
                .starts_with("c1-node-")
        );
    }
    let endpoints: Api<Endpoints> = Api::namespaced(c.client.clone(), "default");
    let ep = eventually(30, "3 endpoint addresses", || async {
        let ep = endpoints.get("web").await.ok()?;
        let subset = ep.subsets.as_ref()?.first()?.clone();
        (subset.addresses.as_ref()?.len() == 3).then_some(subset)
    })
    .await;
    assert_eq!(
        ep.ports.unwrap()[0].port,
        80,
        "named targetPort resolved to the container port"
    );
    // The EndpointSlice controller is another loop: its slice may lag the Endpoints.
    let slices: Api<EndpointSlice> = Api::namespaced(c.client.clone(), "default");
    eventually(30, "one slice with 3 endpoints", || async {
        let s = slices
            .list(&ListParams::default().labels("kubernetes.io/service-name=web"))
            .await
            .ok()?;
        (s.items.len() == 1 && s.items[0].endpoints.len() == 3).then_some(())
    })
    .await;

    // Deleting the Deployment removes its ReplicaSet and pods (garbage collector, kubelet).
    deployments
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    let replicasets: Api<ReplicaSet> = Api::namespaced(c.client.clone(), "default");
    eventually(30, "replicaset and pods gone", || async {
        let rs = replicasets.list(&ListParams::default()).await.ok()?;
        let p = pods
            .list(&ListParams::default().labels("app=web"))
            .await
            .ok()?;
        (rs.items.is_empty() && p.items.is_empty()).then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_pod_that_fits_nowhere_is_marked_unschedulable_with_the_schedulers_reasons() {
    let env = TestEnv::start(1).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(env.clusters[0].client.clone(), "default");
    pods.create(&PostParams::default(), &from(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "huge"},
        "spec": {"containers": [{"name": "c", "image": "i", "resources": {"requests": {"cpu": "64"}}}]}}))).await.unwrap();
    let message = eventually(30, "Unschedulable condition", || async {
        let p = pods.get("huge").await.ok()?;
        let c = p
            .status?
            .conditions?
            .into_iter()
            .find(|c| c.type_ == "PodScheduled")?;
        (c.status == "False" && c.reason.as_deref() == Some("Unschedulable"))
            .then(|| c.message.unwrap_or_default())
    })
    .await;
    // kube-scheduler may go on about preemption after the filters' verdict.
    assert!(
        message.starts_with("0/2 nodes are available: 2 Insufficient cpu."),
        "{message}"
    );
    // Like kube-scheduler, a FailedScheduling warning with the same message, once per change of
    // reason (the pod is retried on every cluster change, the event is not repeated).
    let events: Api<k8s_openapi::api::core::v1::Event> =
        Api::namespaced(env.clusters[0].client.clone(), "default");
    let failed = eventually(30, "FailedScheduling event", || async {
        let list = events
            .list(&ListParams::default().fields("involvedObject.name=huge"))
            .await
            .ok()?;
        list.items
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("FailedScheduling"))
    })
    .await;
    assert_eq!(failed.type_.as_deref(), Some("Warning"));
    assert_eq!(failed.message.as_deref(), Some(message.as_str()));
    assert_eq!(
        failed.reporting_component.as_deref(),
        Some("default-scheduler")
    );
    assert!(failed.event_time.is_some());
    pods.create(
        &PostParams::default(),
        &from(
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "small"},
        "spec": {"containers": [{"name": "c", "image": "i"}]}}),
        ),
    )
    .await
    .unwrap();
    let scheduled = eventually(30, "Scheduled event", || async {
        let list = events
            .list(&ListParams::default().fields("involvedObject.name=small"))
            .await
            .ok()?;
        list.items
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("Scheduled"))
    })
    .await;
    assert!(
        scheduled
            .message
            .unwrap()
            .starts_with("Successfully assigned default/small to ")
    );
    let list = events
        .list(&ListParams::default().fields("involvedObject.name=huge"))
        .await
        .unwrap();
    assert_eq!(
        list.items.len(),
        1,
        "the retry after the new pod changed nothing"
    );
}

#[tokio::test]
async fn deleting_a_namespace_deletes_its_contents_then_itself() {
    let env = TestEnv::start(1).await.unwrap();
    let c = &env.clusters[0];
    let namespaces: Api<Namespace> = Api::all(c.client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &from(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "shop"}})),
        )
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), "shop");
    // A finalizer holds the namespace in Terminating until the test lets it go.
    pods.create(
        &PostParams::default(),
        &from(json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web", "finalizers": ["example.com/hold"]},
        "spec": {"containers": [{"name": "c", "image": "nginx"}]}})),
    )
    .await
    .unwrap();
    eventually(30, "running", || async {
        (pods.get("web").await.ok()?.status?.phase? == "Running").then_some(())
    })
    .await;
    namespaces
        .delete("shop", &DeleteParams::default())
        .await
        .unwrap();
    let ns = namespaces.get("shop").await.unwrap();
    assert_eq!(ns.status.unwrap().phase.as_deref(), Some("Terminating"));
    let e = pods
        .create(
            &PostParams::default(),
            &from(
                json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "late"},
        "spec": {"containers": [{"name": "c", "image": "nginx"}]}}),
            ),
        )
        .await
        .unwrap_err();
    assert!(matches!(e, kube::Error::Api(s) if s.code == 403));
    eventually(30, "pod terminating", || async {
        pods.get("web")
            .await
            .ok()?
            .metadata
            .deletion_timestamp
            .map(|_| ())
    })
    .await;
    pods.patch(
        "web",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    eventually(30, "namespace gone", || async {
        namespaces
            .get_opt("shop")
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_node_whose_lease_expires_goes_unknown_and_is_tainted_unreachable() {
    let mut spec = ClusterSpec::new("c1", 1);
    spec.apiserver.controllers = Controllers {
        node_grace: Duration::from_secs(2),
        ..Controllers::default()
    };
    if let Some(k) = spec.kubelet.as_mut() {
        k.lease_renew = Duration::from_millis(300);
    }
    let mut env = TestEnv::start_with(vec![spec]).await.unwrap();
    let nodes: Api<Node> = Api::all(env.clusters[0].client.clone());
    eventually(10, "lease renewed", || async {
        let n = nodes.get("c1-node-1").await.ok()?;
        let ready = n
            .status?
            .conditions?
            .into_iter()
            .find(|c| c.type_ == "Ready")?;
        (ready.status == "True").then_some(())
    })
    .await;
    env.clusters[0].stop_nodes();
    let node = eventually(30, "node Unknown", || async {
        let n = nodes.get("c1-node-1").await.ok()?;
        let ready = n
            .status
            .clone()?
            .conditions?
            .into_iter()
            .find(|c| c.type_ == "Ready")?;
        (ready.status == "Unknown").then_some(n)
    })
    .await;
    drop(node);
    let taints = eventually(30, "the unreachable NoSchedule taint", || async {
        let n = nodes.get("c1-node-1").await.ok()?;
        let effects: Vec<String> = n
            .spec?
            .taints?
            .into_iter()
            .filter(|t| t.key == "node.kubernetes.io/unreachable")
            .map(|t| t.effect)
            .collect();
        effects.iter().any(|e| e == "NoSchedule").then_some(effects)
    })
    .await;
    // Its only node gone, the cluster is fully disrupted: Kubernetes assumes the fault is its
    // own and puts no NoExecute taint on (it would evict every pod).
    assert_eq!(taints, ["NoSchedule"]);
}

/// What the test extender saw: connections accepted and requests answered.
#[derive(Default)]
struct ExtenderSeen {
    connections: AtomicUsize,
    requests: AtomicUsize,
    /// Filter calls for pods it refuses everywhere.
    refusals: AtomicUsize,
}

/// Serves JSON on `listener`, HTTP/1.1 or h2c: each request's path and decoded body go to
/// `answer`, whose value is the response; `accepted` runs once per connection.
fn serve_json<F, Fut>(
    listener: tokio::net::TcpListener,
    accepted: impl Fn() + Send + 'static,
    answer: F,
) where
    F: Fn(String, serde_json::Value) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = serde_json::Value> + Send + 'static,
{
    use http_body_util::BodyExt;
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            accepted();
            let answer = answer.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(
                    move |req: hyper::Request<hyper::body::Incoming>| {
                        let answer = answer.clone();
                        async move {
                            let path = req.uri().path().to_owned();
                            let args: serde_json::Value = serde_json::from_slice(
                                &req.into_body().collect().await.unwrap().to_bytes(),
                            )
                            .unwrap();
                            let out = answer(path, args).await;
                            Ok::<_, std::convert::Infallible>(hyper::Response::new(
                                http_body_util::Full::new(bytes::Bytes::from(
                                    serde_json::to_vec(&out).unwrap(),
                                )),
                            ))
                        }
                    },
                );
                let _ = hyper_util::server::conn::auto::Builder::new(
                    hyper_util::rt::TokioExecutor::new(),
                )
                .serve_connection(hyper_util::rt::TokioIo::new(tcp), svc)
                .await;
            });
        }
    });
}

/// A scheduler extender on loopback: filters out `*-node-1`, and every node for pods labelled
/// `reject=all`; prefers `*-node-3`.
async fn extender() -> (String, Arc<ExtenderSeen>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(ExtenderSeen::default());
    let (connections, requests, refusals) = (seen.clone(), seen.clone(), seen.clone());
    serve_json(
        listener,
        move || {
            connections.connections.fetch_add(1, Ordering::SeqCst);
        },
        move |path, args| {
            requests.requests.fetch_add(1, Ordering::SeqCst);
            let refusals = refusals.clone();
            async move {
                let names: Vec<String> = args["NodeNames"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|n| n.as_str().unwrap().to_owned())
                    .collect();
                let reject_all = args["Pod"]["metadata"]["labels"]["reject"] == "all";
                if path.ends_with("/filter") {
                    if reject_all {
                        refusals.refusals.fetch_add(1, Ordering::SeqCst);
                    }
                    let (kept, failed): (Vec<String>, Vec<String>) = names
                        .into_iter()
                        .partition(|n| !reject_all && !n.ends_with("-node-1"));
                    let failed: serde_json::Map<String, serde_json::Value> = failed
                        .into_iter()
                        .map(|n| (n, json!("node(s) are too busy")))
                        .collect();
                    json!({"nodenames": kept, "failedNodes": failed, "error": ""})
                } else {
                    json!(names.iter().map(|n| json!({"host": n, "score": if n.ends_with("-node-3") { 10 } else { 0 }})).collect::<Vec<_>>())
                }
            }
        },
    );
    (format!("http://{addr}/scheduler"), seen)
}

/// A cluster of 3 nodes whose scheduler calls [`extender`] to filter, and to prioritize with
/// `prioritize`; its pods in `default`.
async fn cluster_with_extender(prioritize: bool) -> (TestEnv, Arc<ExtenderSeen>, Api<Pod>) {
    use tensile_sim::apiserver::controllers::SchedulerExtender;
    let env = TestEnv::start_with(vec![ClusterSpec::new("c1", 3)])
        .await
        .unwrap();
    let (url_prefix, seen) = extender().await;
    env.clusters[0]
        .set_scheduler_extenders(vec![SchedulerExtender {
            url_prefix,
            filter_verb: Some("filter".into()),
            prioritize_verb: prioritize.then(|| "prioritize".into()),
            weight: 5,
            node_cache_capable: true,
            ..SchedulerExtender::default()
        }])
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(env.clusters[0].client.clone(), "default");
    (env, seen, pods)
}

#[tokio::test]
async fn the_scheduler_calls_extenders_to_filter_and_prioritize() {
    let (_env, seen, pods) = cluster_with_extender(true).await;
    for (name, labels) in [
        ("chosen", json!({})),
        ("rejected", json!({"reject": "all"})),
    ] {
        pods.create(&PostParams::default(), &from(json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": labels}, "spec": {"containers": [{"name": "c", "image": "i"}]}}))).await.unwrap();
    }
    let node = eventually(30, "bound", || async {
        pods.get("chosen").await.ok()?.spec?.node_name
    })
    .await;
    assert_eq!(node, "c1-node-3");
    let message = eventually(30, "unschedulable", || {
        tensile_testenv::condition_message(&pods, "rejected", "PodScheduled", "Unschedulable")
    })
    .await;
    // kube-scheduler goes on about preemption after this; the filter's verdict comes first.
    assert!(
        message.starts_with("0/3 nodes are available: 3 node(s) are too busy."),
        "{message}"
    );
    // Filter and prioritize for one pod, filter for the other, over one kept-alive connection
    // (kube-scheduler's HTTP client reuses it; a handshake per call costs both sides).
    assert!(seen.requests.load(Ordering::SeqCst) >= 3);
    assert_eq!(seen.connections.load(Ordering::SeqCst), 1);
}

/// Counts, from now on, the changes that bring back a pod an extender refused: a node's
/// scheduling properties changing (taints, allocatable, labels, annotations, condition
/// statuses, cordon: heartbeats apart), a node going, a bound pod changing or going.
async fn scheduling_changes(client: kube::Client) -> Arc<AtomicUsize> {
    use futures::StreamExt;
    use kube::runtime::watcher::{self, Event};
    let changes = Arc::new(AtomicUsize::new(0));
    let fingerprint = |n: &Node| {
        let conditions: Vec<(String, String)> = n
            .status
            .iter()
            .flat_map(|s| s.conditions.iter().flatten())
            .map(|c| (c.type_.clone(), c.status.clone()))
            .collect();
        serde_json::to_string(&(
            &n.metadata.labels,
            &n.metadata.annotations,
            n.spec.as_ref().map(|s| (&s.taints, s.unschedulable)),
            n.status.as_ref().map(|s| &s.allocatable),
            conditions,
        ))
        .unwrap()
    };
    let (listed_tx, mut listed) = tokio::sync::mpsc::channel::<()>(2);
    let nodes = watcher::watcher(Api::<Node>::all(client.clone()), watcher::Config::default());
    let (count, ready) = (changes.clone(), listed_tx.clone());
    tokio::spawn(async move {
        let mut seen = std::collections::HashMap::new();
        let mut nodes = nodes.boxed();
        while let Some(Ok(e)) = nodes.next().await {
            match e {
                Event::InitApply(n) => {
                    seen.insert(n.metadata.name.clone(), fingerprint(&n));
                }
                Event::InitDone => {
                    let _ = ready.send(()).await;
                }
                Event::Apply(n) => {
                    let now = fingerprint(&n);
                    if seen.insert(n.metadata.name.clone(), now.clone()) != Some(now) {
                        count.fetch_add(1, Ordering::SeqCst);
                    }
                }
                Event::Delete(_) => {
                    count.fetch_add(1, Ordering::SeqCst);
                }
                Event::Init => {}
            }
        }
    });
    let pods = watcher::watcher(Api::<Pod>::all(client), watcher::Config::default());
    let count = changes.clone();
    tokio::spawn(async move {
        let mut pods = pods.boxed();
        while let Some(Ok(e)) = pods.next().await {
            match e {
                Event::InitDone => {
                    let _ = listed_tx.send(()).await;
                }
                Event::Apply(p) | Event::Delete(p)
                    if p.spec.as_ref().is_some_and(|s| s.node_name.is_some()) =>
                {
                    count.fetch_add(1, Ordering::SeqCst);
                }
                _ => {}
            }
        }
    });
    for _ in 0..2 {
        listed.recv().await.unwrap();
    }
    changes
}

#[tokio::test]
async fn a_pod_an_extender_refused_waits_for_a_cluster_change_as_kube_scheduler_does() {
    let (env, seen, pods) = cluster_with_extender(false).await;
    let changes = scheduling_changes(env.clusters[0].client.clone()).await;
    let pod = |name: &str, labels: serde_json::Value| {
        from(
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels},
            "spec": {"containers": [{"name": "c", "image": "i"}]}}),
        )
    };
    pods.create(
        &PostParams::default(),
        &pod("rejected", json!({"reject": "all"})),
    )
    .await
    .unwrap();
    eventually(30, "unschedulable", || {
        tensile_testenv::condition_message(&pods, "rejected", "PodScheduled", "Unschedulable")
    })
    .await;
    // An extender has no queueing hints: any change brings the pod back, and the first is
    // the scheduler's own `PodScheduled` write to it (kube-scheduler 1.34 asks twice so).
    eventually(
        30,
        "asked again after its own condition was written",
        || async { (seen.refusals.load(Ordering::SeqCst) >= 2).then_some(()) },
    )
    .await;
    // The condition is the same now, not written again: while nothing else changes,
    // kube-scheduler keeps the pod among its unschedulable ones. A scheduler that retried on
    // its back-off alone (2 s now) asks again within about 3 s. (On a loaded machine a node
    // can change meanwhile, e.g. a late lease: then another call is right, and proves
    // nothing.)
    let quiet = std::time::Instant::now();
    while quiet.elapsed() < Duration::from_secs(5) {
        let refusals = seen.refusals.load(Ordering::SeqCst);
        assert!(
            refusals == 2 || changes.load(Ordering::SeqCst) > 0,
            "asked again ({refusals} calls) with nothing changed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Another pod bound: a change, so the refused pod is tried again once its back-off is over.
    pods.create(&PostParams::default(), &pod("other", json!({})))
        .await
        .unwrap();
    eventually(30, "bound", || async {
        pods.get("other").await.ok()?.spec?.node_name
    })
    .await;
    eventually(30, "asked again after the change", || async {
        (seen.refusals.load(Ordering::SeqCst) >= 3).then_some(())
    })
    .await;
}

/// A scheduler extender with only a bind verb, on loopback: binds through the API server as
/// kube-scheduler's extenders do, except that a bind for a pod named in `held` waits for a
/// permit of `gate` first, and the first bind for a pod named in `refused` then answers an
/// error.
struct BindExtender {
    /// The pods it was asked to bind, in order.
    calls: std::sync::Mutex<Vec<String>>,
    gate: tokio::sync::Semaphore,
    held: Vec<&'static str>,
    refused: Vec<&'static str>,
}

impl BindExtender {
    fn calls_for(&self, pod: &str) -> usize {
        self.calls
            .lock()
            .unwrap()
            .iter()
            .filter(|p| *p == pod)
            .count()
    }
}

async fn bind_extender(
    cluster: &tensile_testenv::TestCluster,
    held: Vec<&'static str>,
    refused: Vec<&'static str>,
) -> Arc<BindExtender> {
    use tensile_sim::apiserver::controllers::SchedulerExtender;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let ext = Arc::new(BindExtender {
        calls: std::sync::Mutex::default(),
        gate: tokio::sync::Semaphore::new(0),
        held,
        refused,
    });
    let shared = ext.clone();
    let client = cluster.client.clone();
    serve_json(
        listener,
        || {},
        move |_, args| {
            let (ext, client) = (shared.clone(), client.clone());
            async move {
                let name = args["PodName"].as_str().unwrap().to_owned();
                let node = args["Node"].as_str().unwrap().to_owned();
                let first = {
                    let mut calls = ext.calls.lock().unwrap();
                    calls.push(name.clone());
                    calls.iter().filter(|p| **p == name).count() == 1
                };
                if ext.held.contains(&name.as_str()) && first {
                    ext.gate.acquire().await.unwrap().forget();
                }
                if ext.refused.contains(&name.as_str()) && first {
                    return json!({"error": "bind refused"});
                }
                let pods: Api<Pod> =
                    Api::namespaced(client, args["PodNamespace"].as_str().unwrap());
                let binding = json!({"apiVersion": "v1", "kind": "Binding",
                    "metadata": {"name": name},
                    "target": {"apiVersion": "v1", "kind": "Node", "name": node}});
                match pods
                    .create_subresource::<serde_json::Value, serde_json::Value>(
                        "binding",
                        &name,
                        &PostParams::default(),
                        &binding,
                    )
                    .await
                {
                    Ok(_) => json!({}),
                    Err(e) => json!({"error": e.to_string()}),
                }
            }
        },
    );
    cluster
        .set_scheduler_extenders(vec![SchedulerExtender {
            url_prefix: format!("http://{addr}/scheduler"),
            bind_verb: Some("bind".into()),
            weight: 1,
            node_cache_capable: true,
            ..SchedulerExtender::default()
        }])
        .await
        .unwrap();
    ext
}

fn pod_asking(name: &str, cpu: &str) -> Pod {
    from(
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"containers": [{"name": "c", "image": "i", "resources": {"requests": {"cpu": cpu}}}]}}),
    )
}

/// The node a pod is bound to.
async fn bound_node(pods: &Api<Pod>, name: &str) -> Option<String> {
    pods.get(name).await.ok()?.spec?.node_name
}

#[tokio::test]
async fn a_pod_is_bound_while_another_pods_bind_is_still_in_flight() {
    let env = TestEnv::start_with(vec![ClusterSpec::new("c1", 2)])
        .await
        .unwrap();
    let c = &env.clusters[0];
    let ext = bind_extender(c, vec!["slow"], vec![]).await;
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), "default");
    pods.create(&PostParams::default(), &pod_asking("slow", "100m"))
        .await
        .unwrap();
    eventually(30, "the bind of slow asked", || async {
        (ext.calls_for("slow") == 1).then_some(())
    })
    .await;
    // kube-scheduler binds in the background: the next pod does not wait for that answer
    // (which an inline bind would, until the extender call times out after 30 s).
    pods.create(&PostParams::default(), &pod_asking("fast", "100m"))
        .await
        .unwrap();
    eventually(20, "fast bound", || bound_node(&pods, "fast")).await;
    assert_eq!(bound_node(&pods, "slow").await, None);
    ext.gate.add_permits(1);
    eventually(30, "slow bound", || bound_node(&pods, "slow")).await;
    let events: Api<k8s_openapi::api::core::v1::Event> =
        Api::namespaced(c.client.clone(), "default");
    eventually(30, "a Scheduled event for each", || async {
        let list = events.list(&ListParams::default()).await.ok()?;
        let scheduled = |pod: &str| {
            list.items.iter().any(|e| {
                e.reason.as_deref() == Some("Scheduled")
                    && e.involved_object.name.as_deref() == Some(pod)
            })
        };
        (scheduled("slow") && scheduled("fast")).then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_pod_whose_bind_fails_gives_its_room_back_and_is_tried_again() {
    let env = TestEnv::start_with(vec![ClusterSpec::new("c1", 1)])
        .await
        .unwrap();
    let c = &env.clusters[0];
    let nodes: Api<Node> = Api::all(c.client.clone());
    let node = nodes.get("c1-node-1").await.unwrap();
    let cpu = node.status.unwrap().allocatable.unwrap()["cpu"].0.clone();
    let ext = bind_extender(c, vec!["first"], vec!["first"]).await;
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), "default");
    // Each takes the whole node.
    pods.create(&PostParams::default(), &pod_asking("first", &cpu))
        .await
        .unwrap();
    eventually(30, "the bind of first asked", || async {
        (ext.calls_for("first") == 1).then_some(())
    })
    .await;
    // While that bind is in flight, the node's room is taken (kube-scheduler's assumed pod).
    pods.create(&PostParams::default(), &pod_asking("second", &cpu))
        .await
        .unwrap();
    let message = eventually(20, "second unschedulable", || {
        tensile_testenv::condition_message(&pods, "second", "PodScheduled", "Unschedulable")
    })
    .await;
    assert!(message.contains("Insufficient cpu"), "{message}");
    pods.delete("second", &DeleteParams::default())
        .await
        .unwrap();
    eventually(30, "second gone", || async {
        pods.get_opt("second")
            .await
            .ok()
            .and_then(|p| p.is_none().then_some(()))
    })
    .await;
    // The bind fails: reported on the pod, its room given back, the pod tried again.
    ext.gate.add_permits(1);
    let events: Api<k8s_openapi::api::core::v1::Event> =
        Api::namespaced(c.client.clone(), "default");
    eventually(
        30,
        "a FailedScheduling event with the extender's error",
        || async {
            let list = events.list(&ListParams::default()).await.ok()?;
            list.items
                .iter()
                .any(|e| {
                    e.reason.as_deref() == Some("FailedScheduling")
                        && e.involved_object.name.as_deref() == Some("first")
                        && e.message.as_deref() == Some("bind refused")
                })
                .then_some(())
        },
    )
    .await;
    let bound = eventually(30, "first bound", || bound_node(&pods, "first")).await;
    assert_eq!(bound, "c1-node-1");
    assert_eq!(ext.calls_for("first"), 2);
}

#[tokio::test]
async fn a_job_runs_its_pods_to_completion_and_one_that_keeps_failing_stops_at_its_backoff_limit() {
    use k8s_openapi::api::batch::v1::Job;
    let env = TestEnv::start(1).await.unwrap();
    let client = env.clusters[0].client.clone();
    let jobs: Api<Job> = Api::namespaced(client.clone(), "default");
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let job = |name: &str, spec: serde_json::Value| {
        from::<Job>(
            json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
            "spec": spec}),
        )
    };
    let template = |cmd: &str| {
        json!({"spec": {"restartPolicy": "Never",
            "containers": [{"name": "c", "image": "busybox", "command": ["sh", "-c", cmd]}]}})
    };
    let pi = jobs
        .create(
            &PostParams::default(),
            &job(
                "pi",
                json!({"completions": 3, "parallelism": 2, "template": template("echo 3.14; sleep 1")}),
            ),
        )
        .await
        .unwrap();
    // The API server's defaults: a selector on the Job's uid, labels on the pods.
    let uid = pi.metadata.uid.clone().unwrap();
    let spec = pi.spec.clone().unwrap();
    assert_eq!(
        spec.selector
            .and_then(|s| s.match_labels)
            .and_then(|m| m.get("batch.kubernetes.io/controller-uid").cloned()),
        Some(uid.clone())
    );
    assert_eq!(spec.backoff_limit, Some(6));
    assert_eq!(spec.completion_mode.as_deref(), Some("NonIndexed"));
    let done = eventually(60, "the Job complete", || async {
        let j = jobs.get("pi").await.ok()?;
        let status = j.status.clone()?;
        let complete = status
            .conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == "Complete" && c.status == "True");
        complete.then_some(status)
    })
    .await;
    assert_eq!(done.succeeded, Some(3));
    assert!(done.completion_time.is_some() && done.start_time.is_some());
    let mine = pods
        .list(&ListParams::default().labels("job-name=pi"))
        .await
        .unwrap()
        .items;
    assert_eq!(mine.len(), 3, "one pod per completion, none failed");
    assert!(mine.iter().all(|p| {
        p.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("batch.kubernetes.io/controller-uid"))
            == Some(&uid)
    }));

    jobs.create(
        &PostParams::default(),
        &job(
            "broken",
            json!({"backoffLimit": 1, "template": template("echo no; exit 1")}),
        ),
    )
    .await
    .unwrap();
    let failed = eventually(90, "the Job failed", || async {
        let status = jobs.get("broken").await.ok()?.status?;
        let condition = status
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == "Failed" && c.status == "True")?
            .clone();
        Some((status, condition))
    })
    .await;
    assert_eq!(failed.1.reason.as_deref(), Some("BackoffLimitExceeded"));
    assert_eq!(failed.0.failed, Some(2));
    assert_eq!(failed.0.active, None);
}

#[tokio::test]
async fn the_scheduler_binds_no_faster_than_its_client_rate_limit() {
    // kube-scheduler's Binding writes go through a client of `clientConnection.qps` and
    // `.burst`: at 10 a second after a burst of 1, 21 binds take at least 2 s.
    let mut spec = ClusterSpec::new("c1", 1);
    spec.apiserver.controllers = Controllers {
        scheduler_client_qps: 10.0,
        scheduler_client_burst: 1,
        ..Controllers::default()
    };
    let env = TestEnv::start_with(vec![spec]).await.unwrap();
    let c = &env.clusters[0];
    let deployments: Api<Deployment> = Api::namespaced(c.client.clone(), "default");
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), "default");
    let start = std::time::Instant::now();
    deployments
        .create(&PostParams::default(), &deployment("paced", 21, "10m"))
        .await
        .unwrap();
    eventually(60, "21 pods bound", || async {
        let list = pods.list(&ListParams::default()).await.ok()?;
        let bound = list
            .items
            .iter()
            .filter(|p| p.spec.as_ref().is_some_and(|s| s.node_name.is_some()))
            .count();
        (bound == 21).then_some(())
    })
    .await;
    let took = start.elapsed();
    assert!(took >= Duration::from_secs(2), "21 binds in {took:?}");
}
