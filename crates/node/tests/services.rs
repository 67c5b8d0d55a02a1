//! The Service controller end to end on simulated clusters: upper Services and their Endpoints
//! are mirrored to every lower cluster as selector-less Services whose Endpoints (and, through
//! the lower mirroring controller, EndpointSlices) list every backend, wherever it runs;
//! changes and deletions follow; lower objects that are not ours are never touched.

use std::collections::BTreeSet;

use crate::common::{NodeOptions, eventually, gone, pod, spawn};
use k8s_openapi::api::core::v1::{Endpoints, Namespace, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::ResourceExt as _;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tensile_core::deps::is_owned_by;
use tensile_core::keys::{
    ANNOTATION_GLOBAL, ANNOTATION_LABEL_SELECTOR, LABEL_OWNER, owner_label_value,
};
use tensile_testenv::{ClusterSpec, TestEnv};
use tokio_util::sync::CancellationToken;

/// An upper cluster and `lowers` lower clusters of two nodes, each with its own pod network, and
/// a virtual node `vk-<i>` with the Service controller for lower cluster `i` (1-based).
async fn start(lowers: usize) -> (TestEnv, Vec<CancellationToken>) {
    let env = clusters(lowers).await;
    let mut stops = Vec::new();
    for i in 1..=lowers {
        stops.push(spawn_vk(&env, i).await);
    }
    (env, stops)
}

async fn clusters(lowers: usize) -> TestEnv {
    let mut specs = vec![ClusterSpec::new("upper", 0)];
    for i in 1..=lowers {
        let mut spec = ClusterSpec::new(format!("lower-{i}"), 2);
        if let Some(k) = spec.kubelet.as_mut() {
            k.pod_network_octet = 243 + u8::try_from(i).unwrap();
        }
        specs.push(spec);
    }
    TestEnv::start_with(specs).await.unwrap()
}

async fn spawn_vk(env: &TestEnv, i: usize) -> CancellationToken {
    let mut opts = NodeOptions::new(&format!("vk-{i}")).lower(env.clusters[i].client.clone());
    opts.services = true;
    spawn(env, opts).await.stop
}

fn service(namespace: &str, name: &str, spec: Value) -> Service {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": namespace, "labels": {"tier": "front"}},
        "spec": spec,
    }))
    .unwrap()
}

fn web_spec() -> Value {
    json!({
        "type": "NodePort",
        "selector": {"app": "web"},
        "ports": [
            {"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"},
            {"name": "metrics", "port": 9090, "protocol": "TCP"},
        ],
    })
}

async fn create_namespace(client: &kube::Client, name: &str) {
    Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": name}})).unwrap(),
        )
        .await
        .unwrap();
}

fn port_numbers(svc: &Service) -> Vec<i32> {
    svc.spec
        .iter()
        .flat_map(|s| s.ports.iter().flatten())
        .map(|p| p.port)
        .collect()
}

/// The lower cluster's EndpointSlices of Service `namespace/name`.
async fn slices_of(lower: &kube::Client, namespace: &str, name: &str) -> Vec<EndpointSlice> {
    let slices: Api<EndpointSlice> = Api::namespaced(lower.clone(), namespace);
    slices
        .list(&ListParams::default().labels(&format!("kubernetes.io/service-name={name}")))
        .await
        .unwrap()
        .items
}

/// The IPs the lower cluster's EndpointSlices of Service `namespace/name` list.
async fn slice_ips(lower: &kube::Client, namespace: &str, name: &str) -> BTreeSet<String> {
    slices_of(lower, namespace, name)
        .await
        .iter()
        .flat_map(|s| s.endpoints.iter())
        .flat_map(|e| e.addresses.iter().cloned())
        .collect()
}

/// The names of the lower cluster's EndpointSlices of Service `namespace/name`.
async fn slice_names(lower: &kube::Client, namespace: &str, name: &str) -> BTreeSet<String> {
    slices_of(lower, namespace, name)
        .await
        .iter()
        .map(|s| s.name_any())
        .collect()
}

/// The IPs the Endpoints `namespace/name` list (ready or not).
async fn endpoint_ips(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> Option<BTreeSet<String>> {
    let ep = Api::<Endpoints>::namespaced(client.clone(), namespace)
        .get_opt(name)
        .await
        .ok()??;
    Some(
        ep.subsets
            .iter()
            .flatten()
            .flat_map(|s| {
                s.addresses
                    .iter()
                    .flatten()
                    .chain(s.not_ready_addresses.iter().flatten())
            })
            .map(|a| a.ip.clone())
            .collect(),
    )
}

#[tokio::test]
async fn checklist_68_69_a_new_upper_service_is_mirrored_selector_less_into_a_new_lower_namespace()
{
    let (env, _stops) = start(1).await;
    let (upper, lower) = (&env.clusters[0].client, &env.clusters[1].client);
    let pp = PostParams::default();
    create_namespace(upper, "shop").await;
    // Kept upstairs: kube-system, and the API server's own Service.
    Api::<Service>::namespaced(upper.clone(), "kube-system")
        .create(
            &pp,
            &service(
                "kube-system",
                "dns",
                json!({"selector": {"k8s-app": "dns"}, "ports": [{"port": 53}]}),
            ),
        )
        .await
        .unwrap();
    let up_svcs: Api<Service> = Api::namespaced(upper.clone(), "shop");
    up_svcs
        .create(&pp, &service("shop", "web", web_spec()))
        .await
        .unwrap();
    up_svcs
        .create(
            &pp,
            &service(
                "shop",
                "db",
                json!({"clusterIP": "None", "selector": {"app": "db"}, "ports": [{"port": 5432}]}),
            ),
        )
        .await
        .unwrap();

    let low_svcs: Api<Service> = Api::namespaced(lower.clone(), "shop");
    let web = eventually(20, "lower shop/web", || async {
        low_svcs.get_opt("web").await.ok()?
    })
    .await;
    let ns = Api::<Namespace>::all(lower.clone())
        .get("shop")
        .await
        .unwrap();
    assert!(
        is_owned_by(&ns.metadata, "vk-1"),
        "the lower namespace is created, marked ours"
    );
    assert!(is_owned_by(&web.metadata, "vk-1"));
    let annotations = web.metadata.annotations.clone().unwrap();
    assert_eq!(
        annotations.get(ANNOTATION_GLOBAL).map(String::as_str),
        Some("true")
    );
    assert_eq!(
        annotations
            .get(ANNOTATION_LABEL_SELECTOR)
            .map(String::as_str),
        Some(r#"{"app":"web"}"#)
    );
    let spec = web.spec.clone().unwrap();
    assert_eq!(
        spec.selector, None,
        "no selector: the lower endpoints controllers leave it alone"
    );
    assert_eq!(
        spec.type_.as_deref(),
        Some("ClusterIP"),
        "node ports stay upstairs"
    );
    assert!(spec.ports.iter().flatten().all(|p| p.node_port.is_none()));
    let lower_ip = spec.cluster_ip.clone().unwrap();
    assert!(
        !lower_ip.is_empty() && lower_ip != "None",
        "a lower cluster IP is allocated"
    );
    assert_eq!(port_numbers(&web), vec![80, 9090]);
    let names: Vec<_> = spec
        .ports
        .iter()
        .flatten()
        .map(|p| p.name.clone().unwrap())
        .collect();
    assert_eq!(names, ["http", "metrics"]);
    let db = eventually(20, "lower shop/db", || async {
        low_svcs.get_opt("db").await.ok()?
    })
    .await;
    assert_eq!(
        db.spec.unwrap().cluster_ip.as_deref(),
        Some("None"),
        "headless stays headless"
    );

    // An update follows, keeping the lower cluster IP.
    let mut changed = web_spec();
    changed["ports"][1]["port"] = json!(9191);
    up_svcs
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"ports": changed["ports"]}})),
        )
        .await
        .unwrap();
    let web = eventually(20, "port change downstairs", || async {
        let s = low_svcs.get_opt("web").await.ok()??;
        (port_numbers(&s) == [80, 9191]).then_some(s)
    })
    .await;
    assert_eq!(web.spec.unwrap().cluster_ip, Some(lower_ip));

    // By now the kube-system Service's events have long been handled: it was never copied, and
    // the lower cluster's own `kubernetes` Service is not ours.
    assert!(
        Api::<Service>::namespaced(lower.clone(), "kube-system")
            .get_opt("dns")
            .await
            .unwrap()
            .is_none()
    );
    let kubernetes = Api::<Service>::namespaced(lower.clone(), "default")
        .get("kubernetes")
        .await
        .unwrap();
    assert!(!is_owned_by(&kubernetes.metadata, "vk-1"));
}

#[tokio::test]
async fn a_service_with_3_backends_in_2_lower_clusters_resolves_to_all_3_ips_in_each_lower_cluster()
{
    let (env, _stops) = start(2).await;
    let upper = &env.clusters[0].client;
    let pp = PostParams::default();
    Api::<Service>::namespaced(upper.clone(), "default")
        .create(&pp, &service("default", "web", web_spec()))
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(upper.clone(), "default");
    let backend = |name: &str, node: &str| {
        let mut p = pod(
            name,
            node,
            json!({"spec": {"containers": [{"name": "c", "image": "nginx", "ports": [{"containerPort": 8080}]}]}}),
        );
        p.metadata.labels = Some([("app".to_owned(), "web".to_owned())].into());
        p
    };
    for (name, node) in [("web-1", "vk-1"), ("web-2", "vk-1"), ("web-3", "vk-2")] {
        pods.create(&pp, &backend(name, node)).await.unwrap();
    }
    let mut ips = BTreeSet::new();
    for name in ["web-1", "web-2", "web-3"] {
        let ip = eventually(30, &format!("{name} Running with an IP"), || async {
            let p = pods.get_opt(name).await.ok()??;
            let status = p.status?;
            (status.phase.as_deref() == Some("Running")).then_some(())?;
            status.pod_ip
        })
        .await;
        ips.insert(ip);
    }
    assert_eq!(
        ips.len(),
        3,
        "the two lower clusters have distinct pod networks"
    );
    let mut names = Vec::new();
    for i in [1, 2] {
        let lower = &env.clusters[i].client;
        eventually(
            30,
            &format!("lower-{i} EndpointSlices list all 3 backends"),
            || async { (slice_ips(lower, "default", "web").await == ips).then_some(()) },
        )
        .await;
        names.push(slice_names(lower, "default", "web").await);
        let ep = Api::<Endpoints>::namespaced(lower.clone(), "default")
            .get("web")
            .await
            .unwrap();
        assert!(is_owned_by(&ep.metadata, &format!("vk-{i}")));
        assert_eq!(
            ep.metadata
                .annotations
                .unwrap()
                .get(ANNOTATION_GLOBAL)
                .map(String::as_str),
            Some("true")
        );
    }

    // A later address change reaches every lower cluster without any annotation on the upper
    // objects (the original needed `global: "true"` on them).
    let gone = pods
        .get("web-3")
        .await
        .unwrap()
        .status
        .unwrap()
        .pod_ip
        .unwrap();
    pods.delete("web-3", &DeleteParams::default())
        .await
        .unwrap();
    ips.remove(&gone);
    for i in [1, 2] {
        let lower = &env.clusters[i].client;
        eventually(
            30,
            &format!("lower-{i} follows the removed backend"),
            || async {
                (endpoint_ips(lower, "default", "web").await? == ips
                    && slice_ips(lower, "default", "web").await == ips)
                    .then_some(())
            },
        )
        .await;
        // The lower cluster's own slices were updated in place, never taken for copies of
        // ours (they carry the copied Service's labels, our owner label among them) and
        // deleted: a slice recreated has a new generated name.
        assert_eq!(
            slice_names(lower, "default", "web").await,
            names[i - 1],
            "lower-{i}'s EndpointSlices of web were replaced"
        );
    }
}

#[tokio::test]
async fn checklist_71_deleting_an_upper_service_removes_only_our_lower_copy() {
    let env = clusters(1).await;
    let (upper, lower) = (&env.clusters[0].client, &env.clusters[1].client);
    let pp = PostParams::default();
    // A lower Service that was there before us, with the name of an upper one.
    let low_svcs: Api<Service> = Api::namespaced(lower.clone(), "default");
    low_svcs
        .create(
            &pp,
            &service(
                "default",
                "legacy",
                json!({"selector": {"app": "legacy"}, "ports": [{"port": 81}]}),
            ),
        )
        .await
        .unwrap();
    let _stop = spawn_vk(&env, 1).await;
    let up_svcs: Api<Service> = Api::namespaced(upper.clone(), "default");
    for name in ["legacy", "web"] {
        up_svcs
            .create(&pp, &service("default", name, web_spec()))
            .await
            .unwrap();
    }
    eventually(20, "lower web", || async {
        low_svcs.get_opt("web").await.ok()?
    })
    .await;
    let legacy = low_svcs.get("legacy").await.unwrap();
    assert!(!is_owned_by(&legacy.metadata, "vk-1"), "never overwritten");
    assert_eq!(port_numbers(&legacy), vec![81]);

    for name in ["legacy", "web"] {
        up_svcs
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
    }
    gone(&low_svcs, "web", 20, "our copy deleted").await;
    let after = low_svcs.get("legacy").await.unwrap();
    assert_eq!(
        after.metadata.uid, legacy.metadata.uid,
        "not ours: still there, untouched"
    );
    assert_eq!(after.spec.unwrap().selector, legacy.spec.unwrap().selector);
}

#[tokio::test]
async fn checklist_72_at_start_our_lower_services_and_endpoints_without_an_upper_original_are_collected()
 {
    let env = clusters(1).await;
    let lower = &env.clusters[1].client;
    let pp = PostParams::default();
    let ours = json!({LABEL_OWNER: owner_label_value("vk-1")});
    let low_svcs: Api<Service> = Api::namespaced(lower.clone(), "default");
    let low_eps: Api<Endpoints> = Api::namespaced(lower.clone(), "default");
    let mut stale = service("default", "stale", json!({"ports": [{"port": 80}]}));
    stale.metadata.labels = serde_json::from_value(ours.clone()).unwrap();
    low_svcs.create(&pp, &stale).await.unwrap();
    low_eps
        .create(
            &pp,
            &serde_json::from_value(json!({
                "metadata": {"name": "stale", "labels": ours},
                "subsets": [{"addresses": [{"ip": "10.9.9.9"}], "ports": [{"port": 80}]}],
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    low_svcs
        .create(
            &pp,
            &service("default", "keep", json!({"ports": [{"port": 80}]})),
        )
        .await
        .unwrap();
    let _stop = spawn_vk(&env, 1).await;
    eventually(20, "stale Service and Endpoints collected", || async {
        (low_svcs.get_opt("stale").await.ok()?.is_none()
            && low_eps.get_opt("stale").await.ok()?.is_none())
        .then_some(())
    })
    .await;
    assert!(
        low_svcs.get_opt("keep").await.unwrap().is_some(),
        "not ours: kept"
    );
}

/// A TCP server answering every connection with `reply`, on an address of the test host that
/// is not the virtual node's (a node's own address is never a node port's backend).
async fn tcp_backend(reply: &'static str) -> std::net::SocketAddr {
    let ip = tensile_testenv::testhost::extra_address(100).unwrap();
    assert_ne!(
        Some(ip),
        tensile_testenv::testhost::address().ok(),
        "the backend needs an address of its own (TENSILE_TEST_HOST_ADDRESS gives one for all)"
    );
    let listener = tokio::net::TcpListener::bind((ip, 0)).await.unwrap();
    let at = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let _ = tokio::io::AsyncWriteExt::write_all(&mut s, reply.as_bytes()).await;
        }
    });
    at
}

/// What a connection to `at` reads until the peer closes; `None` when it cannot connect or
/// is reset.
async fn answer(at: std::net::SocketAddr) -> Option<String> {
    let mut s = tokio::net::TcpStream::connect(at).await.ok()?;
    let mut out = String::new();
    tokio::io::AsyncReadExt::read_to_string(&mut s, &mut out)
        .await
        .ok()?;
    Some(out)
}

#[tokio::test]
async fn a_node_port_of_the_virtual_node_reaches_the_services_backends_while_it_has_any() {
    let (env, _stops) = start(1).await;
    let upper = &env.clusters[0].client;
    let pp = PostParams::default();
    create_namespace(upper, "edge").await;
    let token = "backend edge/web";
    let backend = tcp_backend(token).await;
    // A node port free on this host (other tests' virtual nodes share the address).
    let node_ip = tensile_testenv::testhost::address().unwrap();
    let node_port = (30000..32767u16)
        .rev()
        .find(|p| std::net::TcpListener::bind((node_ip, *p)).is_ok())
        .unwrap();
    Api::<Service>::namespaced(upper.clone(), "edge")
        .create(
            &pp,
            &service(
                "edge",
                "web",
                json!({"type": "NodePort", "ports": [{"name": "http", "port": 80, "nodePort": node_port}]}),
            ),
        )
        .await
        .unwrap();
    let endpoints: Endpoints = serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": "edge"},
        "subsets": [{
            "addresses": [{"ip": backend.ip().to_string()}],
            "ports": [{"name": "http", "port": backend.port()}],
        }],
    }))
    .unwrap();
    let eps: Api<Endpoints> = Api::namespaced(upper.clone(), "edge");
    eps.create(&pp, &endpoints).await.unwrap();
    // The node's InternalIP, as a client of the node port finds it.
    let node = Api::<k8s_openapi::api::core::v1::Node>::all(upper.clone())
        .get("vk-1")
        .await
        .unwrap();
    let internal_ip = node
        .status
        .and_then(|s| s.addresses)
        .into_iter()
        .flatten()
        .find(|a| a.type_ == "InternalIP")
        .unwrap()
        .address;
    let at = std::net::SocketAddr::new(internal_ip.parse().unwrap(), node_port);
    eventually(30, "the node port answers from the backend", || async {
        (answer(at).await? == token).then_some(())
    })
    .await;
    // No ready backend: nothing listens, as kube-proxy refuses.
    eps.delete("web", &DeleteParams::default()).await.unwrap();
    eventually(30, "the node port refuses", || async {
        tokio::net::TcpStream::connect(at)
            .await
            .is_err()
            .then_some(())
    })
    .await;
}

#[tokio::test]
async fn an_endpoint_slice_a_user_writes_for_a_service_without_selector_is_copied_and_follows() {
    let (env, _stops) = start(1).await;
    let (upper, lower) = (&env.clusters[0].client, &env.clusters[1].client);
    let pp = PostParams::default();
    create_namespace(upper, "ext").await;
    Api::<Service>::namespaced(upper.clone(), "ext")
        .create(
            &pp,
            &service(
                "ext",
                "custom",
                json!({"ports": [{"name": "port80", "port": 80}]}),
            ),
        )
        .await
        .unwrap();
    let slice = |ip: &str| -> EndpointSlice {
        serde_json::from_value(json!({
            "metadata": {"name": "custom-1", "namespace": "ext", "labels": {
                "kubernetes.io/service-name": "custom",
                "endpointslice.kubernetes.io/managed-by": "someone-else",
            }},
            "addressType": "IPv4",
            "endpoints": [{"addresses": [ip], "conditions": {"ready": true}}],
            "ports": [{"name": "port80", "port": 8090, "protocol": "TCP"}],
        }))
        .unwrap()
    };
    let up_slices: Api<EndpointSlice> = Api::namespaced(upper.clone(), "ext");
    up_slices.create(&pp, &slice("198.18.7.1")).await.unwrap();
    let low_slices: Api<EndpointSlice> = Api::namespaced(lower.clone(), "ext");
    let copy = eventually(20, "the slice copy downstairs", || async {
        low_slices.get_opt("custom-1").await.ok()?
    })
    .await;
    assert!(is_owned_by(&copy.metadata, "vk-1"));
    let labels = copy.metadata.labels.clone().unwrap();
    assert_eq!(labels["kubernetes.io/service-name"], "custom");
    assert_eq!(
        labels["endpointslice.kubernetes.io/managed-by"], "tensile-kube",
        "managed by us: the lower controllers leave it alone"
    );
    assert_eq!(
        slice_ips(lower, "ext", "custom").await,
        BTreeSet::from(["198.18.7.1".to_owned()])
    );
    // Changes follow.
    let mut moved = up_slices.get("custom-1").await.unwrap();
    moved.endpoints[0].addresses = vec!["198.18.7.2".into()];
    up_slices
        .replace("custom-1", &PostParams::default(), &moved)
        .await
        .unwrap();
    eventually(20, "the copy follows the address", || async {
        (slice_ips(lower, "ext", "custom").await == BTreeSet::from(["198.18.7.2".to_owned()]))
            .then_some(())
    })
    .await;
    // Gone upstairs: gone downstairs.
    up_slices
        .delete("custom-1", &DeleteParams::default())
        .await
        .unwrap();
    eventually(20, "the copy is deleted", || async {
        low_slices
            .get_opt("custom-1")
            .await
            .ok()
            .filter(Option::is_none)
            .map(drop)
    })
    .await;
}
