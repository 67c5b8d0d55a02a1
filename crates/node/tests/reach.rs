//! What a user sees when the lower cluster is unreachable, and a second process for the same
//! node: both on the simulator and on real control planes.

use crate::common;
use crate::common::{NodeOptions, clusters, eventually, phase, pod, start, try_spawn};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Endpoints, Event, Node, Pod, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, ListParams, LogParams, PostParams};
use serde_json::json;
use tensile_runtime::clients::{ApiCalls, KubeconfigSource, build_client};
use tensile_runtime::leader::holder_identity;

fn reachable_condition(n: &Node) -> Option<(String, String)> {
    n.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "tensile-kube.io/LowerClusterReachable")
        .map(|c| (c.status.clone(), c.message.clone().unwrap_or_default()))
}

/// Whether `web`'s address is among the ready ones of Endpoints `web` (`Some(false)`: among the
/// not-ready ones; `None`: in neither yet).
async fn web_endpoint_ready(endpoints: &Api<Endpoints>) -> Option<bool> {
    let e = endpoints.get_opt("web").await.ok()??;
    let subsets = e.subsets.unwrap_or_default();
    let has = |ready: bool| {
        subsets.iter().any(|s| {
            let list = if ready {
                &s.addresses
            } else {
                &s.not_ready_addresses
            };
            list.iter()
                .flatten()
                .any(|a| a.target_ref.as_ref().and_then(|r| r.name.as_deref()) == Some("web"))
        })
    };
    if has(true) {
        Some(true)
    } else if has(false) {
        Some(false)
    } else {
        None
    }
}

/// The lower API server stops answering: the node's condition and a Warning event name the
/// lower cluster (by its kubeconfig context, `lower`) and the cause, and the kubelet API
/// answers logs with 503 instead of 404 (which said the pod was gone). Its pods become not
/// Ready upstairs (their Service's Endpoints drop them), are neither evicted nor deleted, and
/// are Ready again when it answers again.
#[tokio::test]
async fn an_outage_is_a_warning_event_a_named_condition_and_503_from_the_kubelet_api() {
    let (env, stop) = start().await;
    let upper = &env.clusters[0].client;
    let pods: Api<Pod> = Api::namespaced(upper.clone(), "default");
    pods.create(&PostParams::default(), &pod("web", "vk-lower", json!({})))
        .await
        .unwrap();
    let service: Service = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80}]}
    }))
    .unwrap();
    Api::<Service>::namespaced(upper.clone(), "default")
        .create(&PostParams::default(), &service)
        .await
        .unwrap();
    let endpoints: Api<Endpoints> = Api::namespaced(upper.clone(), "default");
    eventually(30, "web Running", || async {
        (phase(&pods, "web").await? == "Running").then_some(())
    })
    .await;
    eventually(60, "web a ready endpoint of its Service", || async {
        web_endpoint_ready(&endpoints).await?.then_some(())
    })
    .await;
    let uid = pods.get("web").await.unwrap().metadata.uid;
    assert!(pods.logs("web", &LogParams::default()).await.is_ok());

    env.clusters[1].set_available(false);
    let nodes: Api<Node> = Api::all(upper.clone());
    let message = eventually(
        30,
        "the node says the lower cluster is unreachable",
        || async {
            let (status, message) = reachable_condition(&nodes.get("vk-lower").await.ok()?)?;
            (status == "False").then_some(message)
        },
    )
    .await;
    assert!(
        message.starts_with("lower cluster lower unreachable: "),
        "{message}"
    );
    let events: Api<Event> = Api::namespaced(upper.clone(), "default");
    let warning = eventually(30, "a Warning event on the node", || async {
        let list = events
            .list(&ListParams::default().fields("involvedObject.name=vk-lower"))
            .await
            .ok()?;
        list.items.into_iter().find(|e| {
            e.type_.as_deref() == Some("Warning")
                && e.reason.as_deref() == Some("LowerClusterUnreachable")
        })
    })
    .await;
    assert_eq!(warning.involved_object.kind.as_deref(), Some("Node"));
    assert!(
        warning
            .message
            .as_deref()
            .unwrap_or_default()
            .starts_with("lower cluster lower unreachable: "),
        "{warning:?}"
    );
    // The API server relays the kubelet's 503 (a real one keeps the status, not the text).
    // kube-rs retries a 503 for minutes by default; kubectl does not: ask as kubectl does.
    let text = std::fs::read_to_string(&env.clusters[0].kubeconfig).unwrap();
    let mut config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::from_yaml(&text).unwrap(),
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .unwrap();
    config.default_retry = false;
    let once: Api<Pod> = Api::namespaced(kube::Client::try_from(config).unwrap(), "default");
    match once.logs("web", &LogParams::default()).await {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 503, "{s:?}"),
        other => panic!("logs during the outage: {other:?}"),
    }
    let ready = eventually(30, "web not Ready upstairs", || async {
        let p = pods.get_opt("web").await.ok()??;
        let ready = p
            .status?
            .conditions?
            .into_iter()
            .find(|c| c.type_ == "Ready")?;
        (ready.status == "False").then_some(ready)
    })
    .await;
    assert_eq!(ready.reason.as_deref(), Some("LowerClusterUnreachable"));
    assert!(
        ready
            .message
            .as_deref()
            .unwrap_or_default()
            .starts_with("lower cluster lower unreachable: "),
        "{ready:?}"
    );
    eventually(60, "web a not-ready endpoint", || async {
        (!web_endpoint_ready(&endpoints).await?).then_some(())
    })
    .await;
    let during = pods.get("web").await.unwrap();
    assert_eq!(during.metadata.uid, uid, "the pod is the same one");
    assert!(during.metadata.deletion_timestamp.is_none(), "not deleted");

    env.clusters[1].set_available(true);
    eventually(60, "web Ready and a ready endpoint again", || async {
        web_endpoint_ready(&endpoints).await?.then_some(())
    })
    .await;
    assert_eq!(pods.get("web").await.unwrap().metadata.uid, uid);
    eventually(60, "logs again", || async {
        pods.logs("web", &LogParams::default()).await.ok()
    })
    .await;
    eventually(30, "a Normal event: it answers again", || async {
        let list = events
            .list(&ListParams::default().fields("involvedObject.name=vk-lower"))
            .await
            .ok()?;
        list.items
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("LowerClusterReachable"))
    })
    .await;
    stop.cancel();
}

/// An outage shorter than the lease tick shows on the node: a lower request or watch that gets
/// no answer makes the node ask at once whether the lower cluster answers, instead of at its
/// next lease renewal. Here the ticks are 30 s apart and the outage begins right after the
/// first: the condition and the Warning event must come long before the next.
#[tokio::test]
async fn an_outage_between_two_lease_ticks_shows_at_once() {
    let env = clusters().await;
    let mut opts = NodeOptions::new("vk-lower");
    opts.lease_renew = std::time::Duration::from_secs(30);
    let stop = try_spawn(&env, opts).await.unwrap().stop;
    let upper = &env.clusters[0].client;
    let nodes: Api<Node> = Api::all(upper.clone());
    let condition = || async { reachable_condition(&nodes.get("vk-lower").await.ok()?) };
    eventually(
        30,
        "the node registered, its lower cluster reachable",
        || async { (condition().await?.0 == "True").then_some(()) },
    )
    .await;
    // Its watches lose their connections and cannot connect again: nothing else asks.
    env.clusters[1].set_available(false);
    eventually(
        10,
        "the node says the lower cluster is unreachable",
        || async { (condition().await?.0 == "False").then_some(()) },
    )
    .await;
    let events: Api<Event> = Api::namespaced(upper.clone(), "default");
    eventually(10, "a Warning event on the node", || async {
        let list = events
            .list(&ListParams::default().fields("involvedObject.name=vk-lower"))
            .await
            .ok()?;
        list.items
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("LowerClusterUnreachable"))
    })
    .await;
    env.clusters[1].set_available(true);
    eventually(10, "the node says it answers again", || async {
        (condition().await?.0 == "True").then_some(())
    })
    .await;
    stop.cancel();
}

/// A lower cluster whose CA is not the one in the kubeconfig (re-created with a new CA): the
/// error names the certificate problem instead of `client error (Connect)`.
#[tokio::test]
async fn a_lower_cluster_with_another_ca_is_named_a_certificate_error() {
    let env = common::clusters().await;
    let text = std::fs::read_to_string(&env.clusters[1].kubeconfig).unwrap();
    let mut kubeconfig =
        serde_json::to_value(kube::config::Kubeconfig::from_yaml(&text).unwrap()).unwrap();
    let other = tensile_testenv::certs::Ca::new("another-ca").unwrap();
    let ca_file = env.dir().join("another-ca.pem");
    std::fs::write(&ca_file, other.cert_pem()).unwrap();
    for c in kubeconfig["clusters"].as_array_mut().unwrap() {
        let cluster = c["cluster"].as_object_mut().unwrap();
        cluster.remove("certificate-authority-data");
        cluster.insert(
            "certificate-authority".into(),
            json!(ca_file.display().to_string()),
        );
    }
    let calls = ApiCalls::new(&mut prometheus_client::registry::Registry::default());
    let lower = build_client(
        KubeconfigSource::Text(serde_json::to_string(&kubeconfig).unwrap()),
        500.0,
        1000,
        "lower",
        &calls,
    )
    .await
    .unwrap();
    let e = lower.apiserver_version().await.unwrap_err();
    let (cause, message) = tensile_node::reach::describe(&e);
    assert_eq!(
        cause,
        tensile_core::reach::Cause::Certificate,
        "{message} from {e:?}"
    );
    assert!(
        message.starts_with("certificate verify failed: UnknownIssuer"),
        "{message}"
    );
}

/// A second virtual node with the same name refuses to start while the first, a live process on
/// this host (here: this very process), renews the node's lease (it would overwrite the first
/// one's kubelet endpoint); once the first stops (releasing the lease), or when the lease has
/// expired, a new one starts. A fresh lease of a process on another host is waited out, not
/// refused: the node starts once it lapses.
#[tokio::test]
async fn a_second_process_for_the_same_node_refuses_to_start_while_the_lease_is_held() {
    let env = clusters().await;
    let first_holder = holder_identity("vk-lower");
    let mut first = NodeOptions::new("vk-lower");
    first.holder = Some(first_holder.clone());
    let first = try_spawn(&env, first).await.unwrap().stop;
    let upper = &env.clusters[0].client;
    let leases: Api<Lease> = Api::namespaced(upper.clone(), "kube-node-lease");
    let holder = |l: &Lease| l.spec.as_ref().and_then(|s| s.holder_identity.clone());
    eventually(30, "the first node holds its lease", || async {
        (holder(&leases.get_opt("vk-lower").await.ok()??)? == first_holder).then_some(())
    })
    .await;
    let nodes: Api<Node> = Api::all(upper.clone());
    let port = |n: &Node| {
        n.status
            .as_ref()
            .and_then(|s| s.daemon_endpoints.as_ref())
            .and_then(|d| d.kubelet_endpoint.as_ref())
            .map(|e| e.port)
    };
    let before = port(&nodes.get("vk-lower").await.unwrap());

    let mut second = NodeOptions::new("vk-lower");
    second.holder = Some(holder_identity("vk-lower"));
    let refused = match try_spawn(&env, second).await {
        Ok(_) => panic!("a second process for vk-lower started"),
        Err(e) => e.to_string(),
    };
    assert!(
        refused.contains("already run by another process") && refused.contains(&first_holder),
        "{refused}"
    );
    assert_eq!(
        port(&nodes.get("vk-lower").await.unwrap()),
        before,
        "the first node's kubelet endpoint is untouched"
    );

    // Stopped, the first releases the lease; a replacement starts at once.
    first.cancel();
    eventually(30, "the lease released", || async {
        holder(&leases.get_opt("vk-lower").await.ok()??)
            .is_none()
            .then_some(())
    })
    .await;
    let mut replacement = NodeOptions::new("vk-lower");
    replacement.holder = Some("vk-lower_elsewhere".into());
    let replacement = try_spawn(&env, replacement).await.unwrap();
    eventually(30, "the replacement holds the lease", || async {
        (holder(&leases.get_opt("vk-lower").await.ok()??)? == "vk-lower_elsewhere").then_some(())
    })
    .await;
    replacement.stop.cancel();

    // An expired lease of another holder (a process that crashed) is taken over.
    let stale = Timestamp::now() - SignedDuration::from_secs(120);
    let lease: Lease = serde_json::from_value(json!({
        "metadata": {"name": "vk-crashed", "namespace": "kube-node-lease"},
        "spec": {"holderIdentity": "vk-crashed_gone", "leaseDurationSeconds": 40,
            "renewTime": MicroTime(stale)}
    }))
    .unwrap();
    leases.create(&PostParams::default(), &lease).await.unwrap();
    let taker = try_spawn(&env, NodeOptions::new("vk-crashed"))
        .await
        .unwrap();
    eventually(30, "the expired lease taken over", || async {
        (holder(&leases.get_opt("vk-crashed").await.ok()??)? == "vk-crashed_test").then_some(())
    })
    .await;
    taker.stop.cancel();

    // A process on another host renewed its lease just now and then stopped renewing (its
    // host is cut off, say): this one cannot tell whether it still runs, so it waits, and
    // starts (no error) once the lease has lapsed.
    let renewed = Timestamp::now();
    let until = renewed + SignedDuration::from_secs(3);
    let away: Lease = serde_json::from_value(json!({
        "metadata": {"name": "vk-away", "namespace": "kube-node-lease"},
        "spec": {"holderIdentity": "vk-away_otherhost_pod_1_abcdef", "leaseDurationSeconds": 3,
            "renewTime": MicroTime(renewed)}
    }))
    .unwrap();
    leases.create(&PostParams::default(), &away).await.unwrap();
    let waiter_holder = holder_identity("vk-away");
    let mut waiter = NodeOptions::new("vk-away");
    waiter.holder = Some(waiter_holder.clone());
    let waiter = try_spawn(&env, waiter).await.unwrap();
    assert!(
        Timestamp::now() >= until,
        "started before the other host's lease lapsed at {until}"
    );
    eventually(30, "the lapsed lease taken over", || async {
        (holder(&leases.get_opt("vk-away").await.ok()??)? == waiter_holder).then_some(())
    })
    .await;
    waiter.stop.cancel();
}
