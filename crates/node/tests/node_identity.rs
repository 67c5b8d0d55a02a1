//! The virtual node upstairs as a kubelet's identity (docs/security.md), `system:node:<name>`
//! in `system:nodes`, on an API server with the Node authorizer and NodeRestriction (as kubeadm
//! sets them up, and as the real control planes of the tests run). Its certificate comes by TLS
//! bootstrap with the shipped RBAC (the ServiceAccount asks, kube-controller-manager approves
//! and signs). Every request the node makes through a pod's life is allowed with nothing more
//! than the shipped extra ClusterRole, and the identity reads nothing of a pod bound to another
//! node.
//!
//! Real control planes only (.config/nextest.toml says why): the simulator has no Node
//! authorizer, so a node identity there may do nothing.

use crate::common::{NodeOptions, clusters, eventually, gone, phase, pod, spawn};
use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{
    ConfigMap, PersistentVolumeClaim, Pod, Secret, Service, ServiceAccount,
};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;

fn from<K: serde::de::DeserializeOwned>(v: serde_json::Value) -> K {
    serde_json::from_value(v).unwrap()
}

/// Applies the shipped RBAC of virtual nodes (deploy/virtual-node/rbac/rbac.yaml).
async fn apply_shipped_rbac(client: &kube::Client) {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../deploy/virtual-node/rbac/rbac.yaml"
    );
    let text = std::fs::read_to_string(path).unwrap();
    let pp = PostParams::default();
    for doc in text.split("\n---\n") {
        let o = serde_saphyr::from_str::<serde_json::Value>(doc).unwrap();
        let ns = o["metadata"]["namespace"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        match o["kind"].as_str().unwrap() {
            "ServiceAccount" => drop(
                Api::<ServiceAccount>::namespaced(client.clone(), &ns)
                    .create(&pp, &from(o))
                    .await
                    .unwrap(),
            ),
            "ClusterRole" => drop(
                Api::<ClusterRole>::all(client.clone())
                    .create(&pp, &from(o))
                    .await
                    .unwrap(),
            ),
            "ClusterRoleBinding" => drop(
                Api::<ClusterRoleBinding>::all(client.clone())
                    .create(&pp, &from(o))
                    .await
                    .unwrap(),
            ),
            "Role" => drop(
                Api::<Role>::namespaced(client.clone(), &ns)
                    .create(&pp, &from(o))
                    .await
                    .unwrap(),
            ),
            "RoleBinding" => drop(
                Api::<RoleBinding>::namespaced(client.clone(), &ns)
                    .create(&pp, &from(o))
                    .await
                    .unwrap(),
            ),
            other => panic!("{other} in the shipped RBAC"),
        }
    }
}

/// Whether `result` is the API server's 403.
fn forbidden<T: std::fmt::Debug>(result: &Result<T, kube::Error>) -> bool {
    matches!(result, Err(kube::Error::Api(e)) if e.code == 403)
}

#[tokio::test]
async fn a_virtual_node_with_a_kubelets_identity_is_allowed_all_it_does_and_nothing_of_other_nodes()
{
    let env = clusters().await;
    assert!(
        env.clusters[0].is_real(),
        "the simulator has no Node authorizer: this test runs on real control planes only"
    );
    let (upper, lower) = (&env.clusters[0].client, &env.clusters[1].client);
    let pp = PostParams::default();
    // The shipped RBAC, and the extra role bound to this node's user as
    // deploy/virtual-node/lower-1 binds it.
    apply_shipped_rbac(upper).await;
    Api::<ClusterRoleBinding>::all(upper.clone())
        .create(
            &pp,
            &from(json!({"metadata": {"name": "tensile-virtual-node"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "tensile-virtual-node"},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "system:node:vk-lower"}]})),
        )
        .await
        .unwrap();
    // TLS bootstrap: the ServiceAccount's token asks for the node's certificate.
    let token = Api::<ServiceAccount>::namespaced(upper.clone(), "kube-system")
        .create_subresource::<TokenRequest, TokenRequest>(
            "token",
            "tensile-virtual-node",
            &pp,
            &TokenRequest::default(),
        )
        .await
        .unwrap()
        .status
        .unwrap()
        .token;
    let bootstrap = tensile_sim::apiserver::client_from_kubeconfig(
        &env.clusters[0].kubeconfig_with(None, Some(token)),
    )
    .await
    .unwrap();
    let cert = tensile_node::bootstrap::request_certificate(
        &bootstrap,
        "vk-lower",
        std::time::Duration::from_secs(60),
        &tokio_util::sync::CancellationToken::new(),
    )
    .await
    .unwrap();
    // As the binary builds its clients on it (`--tls-bootstrap`).
    let issued = tensile_testenv::certs::Issued {
        cert_pem: cert.cert_pem.clone(),
        key_pem: cert.key_pem.clone(),
    };
    let node_kubeconfig = env.clusters[0].kubeconfig_with(Some(issued), None);
    let mut opts = NodeOptions::new("vk-lower");
    opts.upper_kubeconfig = Some(node_kubeconfig.clone());
    // ServiceControllers on, so that its requests are checked too. Not PVControllers: it binds
    // upper claims, which NodeRestriction refuses any node (docs/security.md).
    opts.services = true;
    let node = spawn(&env, opts).await;
    let as_node = tensile_sim::apiserver::client_from_kubeconfig(&node_kubeconfig)
        .await
        .unwrap();

    for client in [upper, lower] {
        Api::<StorageClass>::all(client.clone())
            .create(
                &pp,
                &from(
                    json!({"metadata": {"name": "local"}, "provisioner": "rancher.io/local-path",
                    "volumeBindingMode": "WaitForFirstConsumer", "reclaimPolicy": "Delete"}),
                ),
            )
            .await
            .unwrap();
    }
    Api::<ConfigMap>::namespaced(upper.clone(), "default")
        .create(
            &pp,
            &from(json!({"metadata": {"name": "app-config"}, "data": {"k": "v"}})),
        )
        .await
        .unwrap();
    for name in ["app-secret", "theirs"] {
        Api::<Secret>::namespaced(upper.clone(), "default")
            .create(
                &pp,
                &from(json!({"metadata": {"name": name}, "stringData": {"k": "s"}})),
            )
            .await
            .unwrap();
    }
    Api::<ServiceAccount>::namespaced(upper.clone(), "default")
        .create(&pp, &from(json!({"metadata": {"name": "app"}})))
        .await
        .unwrap();
    Api::<PersistentVolumeClaim>::namespaced(upper.clone(), "default")
        .create(
            &pp,
            &from(
                json!({"metadata": {"name": "app-data"}, "spec": {"accessModes": ["ReadWriteOnce"],
                "storageClassName": "local", "resources": {"requests": {"storage": "1Gi"}}}}),
            ),
        )
        .await
        .unwrap();
    Api::<Service>::namespaced(upper.clone(), "default")
        .create(
            &pp,
            &from(json!({"metadata": {"name": "app"}, "spec": {"selector": {"app": "app"}, "ports": [{"port": 80}]}})),
        )
        .await
        .unwrap();

    // A pod's life: created with a ConfigMap, a Secret, a token of its ServiceAccount and a
    // claim; its status reported; deleted.
    let pods: Api<Pod> = Api::namespaced(upper.clone(), "default");
    pods.create(
        &pp,
        &pod(
            "app",
            "vk-lower",
            json!({"spec": {"serviceAccountName": "app",
                "volumes": [{"name": "c", "configMap": {"name": "app-config"}},
                            {"name": "d", "persistentVolumeClaim": {"claimName": "app-data"}}],
                "containers": [{"name": "c", "image": "nginx:1.27",
                    "envFrom": [{"secretRef": {"name": "app-secret"}}],
                    "volumeMounts": [{"name": "c", "mountPath": "/cfg"}, {"name": "d", "mountPath": "/data"}]}]}}),
        ),
    )
    .await
    .unwrap();
    eventually(90, "app Running upstairs", || async {
        (phase(&pods, "app").await? == "Running").then_some(())
    })
    .await;
    // A pod bound to another node, with a Secret of its own.
    pods.create(
        &pp,
        &pod(
            "elsewhere",
            "other-node",
            json!({"spec": {"containers": [{"name": "c", "image": "nginx:1.27",
                "envFrom": [{"secretRef": {"name": "theirs"}}]}]}}),
        ),
    )
    .await
    .unwrap();
    let elsewhere_uid = pods.get("elsewhere").await.unwrap().metadata.uid;

    // What the node identity may read: its pod's Secret; what it may not: the other node's
    // pod's Secret, nor a token bound to that pod.
    let node_secrets: Api<Secret> = Api::namespaced(as_node.clone(), "default");
    let ours = node_secrets.get("app-secret").await;
    assert!(ours.is_ok(), "its own pod's Secret: {ours:?}");
    let theirs = node_secrets.get("theirs").await;
    assert!(
        forbidden(&theirs),
        "another node's pod's Secret: {theirs:?}"
    );
    let token = Api::<ServiceAccount>::namespaced(as_node.clone(), "default")
        .create_subresource::<TokenRequest, TokenRequest>(
            "token",
            "default",
            &pp,
            &TokenRequest {
                spec: TokenRequestSpec {
                    audiences: vec![],
                    bound_object_ref: Some(BoundObjectReference {
                        api_version: Some("v1".into()),
                        kind: Some("Pod".into()),
                        name: Some("elsewhere".into()),
                        uid: elsewhere_uid,
                    }),
                    expiration_seconds: Some(3600),
                },
                ..TokenRequest::default()
            },
        )
        .await;
    assert!(
        forbidden(&token),
        "a token for another node's pod: {token:?}"
    );

    pods.delete("app", &DeleteParams::default()).await.unwrap();
    gone(&pods, "app", 60, "app gone upstairs").await;
    // The heartbeat goes on: the lease renewed after all of that.
    let leases: Api<Lease> = Api::namespaced(upper.clone(), "kube-node-lease");
    let renewed = |l: Lease| l.spec.and_then(|s| s.renew_time).map(|t| t.0);
    let before = renewed(leases.get("vk-lower").await.unwrap());
    eventually(30, "the node lease renewed", || async {
        (renewed(leases.get("vk-lower").await.ok()?) > before).then_some(())
    })
    .await;

    let refused = env.clusters[0].refused_node_requests();
    // The probes above were refused, and are in the list: the list is the API server's.
    assert!(
        refused.iter().any(|r| r.contains("/secrets/theirs")),
        "the probe is missing from {refused:#?}"
    );
    let unexpected: Vec<&String> = refused
        .iter()
        .filter(|r| {
            !(r.contains("/secrets/theirs") || r.contains("/serviceaccounts/default/token"))
        })
        .collect();
    assert!(
        unexpected.is_empty(),
        "the node identity was refused:\n{unexpected:#?}"
    );
    node.stop.cancel();
}
