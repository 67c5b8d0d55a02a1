//! Persistent volumes in the simulated cluster: the PV controller and the scheduler's volume
//! binding, through kube-rs, as kube-controller-manager and kube-scheduler behave.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

mod common;

use common::{eventually, from};

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;
use tensile_testenv::TestEnv;

async fn class(client: &kube::Client, name: &str, provisioner: &str, mode: &str) {
    Api::<StorageClass>::all(client.clone())
        .create(
            &PostParams::default(),
            &from(
                json!({"metadata": {"name": name}, "provisioner": provisioner,
                "volumeBindingMode": mode, "reclaimPolicy": "Delete"}),
            ),
        )
        .await
        .unwrap();
}

/// A static local volume of `size` on `node`.
async fn local_pv(client: &kube::Client, name: &str, node: &str, size: &str, policy: &str) {
    Api::<PersistentVolume>::all(client.clone())
        .create(
            &PostParams::default(),
            &from(json!({"metadata": {"name": name}, "spec": {
                "capacity": {"storage": size}, "accessModes": ["ReadWriteOnce"],
                "persistentVolumeReclaimPolicy": policy, "storageClassName": "local",
                "local": {"path": format!("/mnt/{name}")},
                "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}]}}}})),
        )
        .await
        .unwrap();
}

async fn claim(
    client: &kube::Client,
    name: &str,
    class: &str,
    size: &str,
) -> PersistentVolumeClaim {
    Api::<PersistentVolumeClaim>::namespaced(client.clone(), "default")
        .create(
            &PostParams::default(),
            &from(
                json!({"metadata": {"name": name}, "spec": {"accessModes": ["ReadWriteOnce"],
                "storageClassName": class, "resources": {"requests": {"storage": size}}}}),
            ),
        )
        .await
        .unwrap()
}

async fn pod_with_claim(client: &kube::Client, name: &str, claim: &str) {
    Api::<Pod>::namespaced(client.clone(), "default")
        .create(
            &PostParams::default(),
            &from(json!({"metadata": {"name": name}, "spec": {
                "containers": [{"name": "c", "image": "busybox"}],
                "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]}})),
        )
        .await
        .unwrap();
}

fn annotation<'a>(
    m: &'a k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    k: &str,
) -> Option<&'a str> {
    m.annotations.as_ref()?.get(k).map(String::as_str)
}

async fn bound_claim(client: &kube::Client, name: &str) -> PersistentVolumeClaim {
    let claims = Api::<PersistentVolumeClaim>::namespaced(client.clone(), "default");
    eventually(20, "the claim to be Bound", || async {
        let c = claims.get(name).await.ok()?;
        (c.status.as_ref()?.phase.as_deref() == Some("Bound")).then_some(c)
    })
    .await
}

#[tokio::test]
async fn a_wait_for_first_consumer_claim_binds_to_the_local_volume_of_the_node_its_pod_goes_to() {
    let env = TestEnv::start(1).await.unwrap();
    let c = &env.clusters[0].client;
    class(
        c,
        "local",
        "kubernetes.io/no-provisioner",
        "WaitForFirstConsumer",
    )
    .await;
    // The bigger volume is on node 1, the smaller on node 2: both fit, the smaller is chosen
    // only where the pod goes, and the pod must go where a volume is.
    local_pv(c, "pv-big", "c1-node-1", "10Gi", "Retain").await;
    local_pv(c, "pv-small", "c1-node-2", "2Gi", "Retain").await;
    let pvc = claim(c, "data", "local", "1Gi").await;
    // Nobody consumes it yet: it waits, and the volume becomes Available (a real PV
    // controller moves it there from Pending on its own time).
    let pvs = Api::<PersistentVolume>::all(c.clone());
    eventually(30, "pv-small Available", || async {
        let phase = pvs.get("pv-small").await.ok()?.status?.phase;
        (phase.as_deref() == Some("Available")).then_some(())
    })
    .await;
    assert!(
        pvs.get("pv-small")
            .await
            .unwrap()
            .spec
            .unwrap()
            .claim_ref
            .is_none(),
        "the claim waits for its first consumer"
    );
    pod_with_claim(c, "app", "data").await;
    let bound = bound_claim(c, "data").await;
    let volume = bound.spec.as_ref().unwrap().volume_name.clone().unwrap();
    let node = bound_node(c, "app").await;
    let expected = if node == "c1-node-1" {
        "pv-big"
    } else {
        "pv-small"
    };
    assert_eq!(volume, expected, "the volume is on the pod's node");
    assert_eq!(
        annotation(&bound.metadata, "pv.kubernetes.io/bind-completed"),
        Some("yes")
    );
    assert_eq!(
        annotation(&bound.metadata, "pv.kubernetes.io/bound-by-controller"),
        Some("yes")
    );
    let pv = eventually(10, "the volume to be Bound", || async {
        let pv = pvs.get(&volume).await.ok()?;
        (pv.status.as_ref()?.phase.as_deref() == Some("Bound")).then_some(pv)
    })
    .await;
    let claim_ref = pv.spec.unwrap().claim_ref.unwrap();
    assert_eq!(claim_ref.uid, pvc.metadata.uid);
    assert_eq!(claim_ref.name.as_deref(), Some("data"));
    // Retain: deleting the claim leaves the volume Released, with its data. The pod goes
    // first: kubernetes.io/pvc-protection holds a claim a pod still uses.
    let pods = Api::<Pod>::namespaced(c.clone(), "default");
    pods.delete("app", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    eventually(30, "app gone", || async {
        pods.get_opt("app").await.ok()?.is_none().then_some(())
    })
    .await;
    Api::<PersistentVolumeClaim>::namespaced(c.clone(), "default")
        .delete("data", &DeleteParams::default())
        .await
        .unwrap();
    eventually(30, "the volume to be Released", || async {
        let pv = pvs.get(&volume).await.ok()?;
        (pv.status?.phase.as_deref() == Some("Released")).then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_pod_whose_claim_has_no_volume_anywhere_is_unschedulable_with_kube_schedulers_reason() {
    let env = TestEnv::start(1).await.unwrap();
    let c = &env.clusters[0].client;
    class(
        c,
        "local",
        "kubernetes.io/no-provisioner",
        "WaitForFirstConsumer",
    )
    .await;
    local_pv(c, "pv-tiny", "c1-node-1", "100Mi", "Retain").await;
    claim(c, "data", "local", "1Gi").await;
    pod_with_claim(c, "app", "data").await;
    pod_with_claim(c, "orphan", "missing").await;
    let pods = Api::<Pod>::namespaced(c.clone(), "default");
    let message = |name: &'static str| {
        let pods = pods.clone();
        async move {
            let p = pods.get(name).await.ok()?;
            p.status?
                .conditions?
                .into_iter()
                .find(|c| c.type_ == "PodScheduled" && c.status == "False")?
                .message
        }
    };
    let m = eventually(20, "app to be unschedulable", || message("app")).await;
    // kube-scheduler may go on about preemption after the filters' verdict.
    assert!(
        m.starts_with(
            "0/2 nodes are available: 2 node(s) didn't find available persistent volumes to bind."
        ),
        "{m}"
    );
    let m = eventually(20, "orphan to be unschedulable", || message("orphan")).await;
    assert!(
        m.starts_with("0/2 nodes are available: persistentvolumeclaim \"missing\" not found."),
        "{m}"
    );
}

#[tokio::test]
async fn a_provisioner_class_gets_a_volume_on_the_pods_node_and_deleting_the_claim_deletes_it() {
    let env = TestEnv::start(1).await.unwrap();
    let c = &env.clusters[0].client;
    class(
        c,
        "local-path",
        "rancher.io/local-path",
        "WaitForFirstConsumer",
    )
    .await;
    let pvc = claim(c, "data", "local-path", "1Gi").await;
    pod_with_claim(c, "app", "data").await;
    let bound = bound_claim(c, "data").await;
    let node = bound_node(c, "app").await;
    assert_eq!(
        annotation(&bound.metadata, "volume.kubernetes.io/selected-node"),
        Some(node.as_str())
    );
    let name = format!("pvc-{}", pvc.metadata.uid.unwrap());
    assert_eq!(
        bound.spec.unwrap().volume_name.as_deref(),
        Some(name.as_str())
    );
    let pvs = Api::<PersistentVolume>::all(c.clone());
    let pv = pvs.get(&name).await.unwrap();
    let terms = pv
        .spec
        .unwrap()
        .node_affinity
        .unwrap()
        .required
        .unwrap()
        .node_selector_terms;
    assert_eq!(
        terms[0].match_expressions.as_ref().unwrap()[0].values,
        Some(vec![node])
    );
    Api::<Pod>::namespaced(c.clone(), "default")
        .delete("app", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    Api::<PersistentVolumeClaim>::namespaced(c.clone(), "default")
        .delete("data", &DeleteParams::default())
        .await
        .unwrap();
    eventually(10, "the provisioned volume to be deleted", || async {
        pvs.get_opt(&name).await.unwrap().is_none().then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_pre_bound_volume_and_claim_bind_without_a_pod_and_an_immediate_claim_binds_at_once() {
    let env = TestEnv::start(1).await.unwrap();
    let c = &env.clusters[0].client;
    class(c, "local", "kubernetes.io/no-provisioner", "Immediate").await;
    local_pv(c, "pv-a", "c1-node-1", "1Gi", "Retain").await;
    let pvc = claim(c, "first", "local", "1Gi").await;
    let bound = bound_claim(c, "first").await;
    assert_eq!(bound.spec.unwrap().volume_name.as_deref(), Some("pv-a"));
    // A volume made for a claim by name and uid (what the virtual node writes upstairs).
    let second = claim(c, "second", "other", "1Gi").await;
    Api::<PersistentVolume>::all(c.clone())
        .create(
            &PostParams::default(),
            &from(json!({"metadata": {"name": "pv-b"}, "spec": {
                "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                "storageClassName": "other", "hostPath": {"path": "/tmp/b"},
                "claimRef": {"namespace": "default", "name": "second", "uid": second.metadata.uid}}})),
        )
        .await
        .unwrap();
    let bound = bound_claim(c, "second").await;
    assert_eq!(bound.spec.unwrap().volume_name.as_deref(), Some("pv-b"));
    assert_ne!(pvc.metadata.uid, second.metadata.uid);
}

#[tokio::test]
async fn a_claims_label_selector_limits_which_volume_it_binds() {
    let env = TestEnv::start(1).await.unwrap();
    let c = &env.clusters[0].client;
    class(c, "local", "kubernetes.io/no-provisioner", "Immediate").await;
    // The unlabelled volume is the smaller one, so only the selector can rule it out.
    local_pv(c, "pv-plain", "c1-node-1", "1Gi", "Retain").await;
    local_pv(c, "pv-fast", "c1-node-1", "5Gi", "Retain").await;
    Api::<PersistentVolume>::all(c.clone())
        .patch(
            "pv-fast",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"metadata": {"labels": {"tier": "fast"}}})),
        )
        .await
        .unwrap();
    Api::<PersistentVolumeClaim>::namespaced(c.clone(), "default")
        .create(
            &PostParams::default(),
            &from(json!({"metadata": {"name": "picky"}, "spec": {
                "accessModes": ["ReadWriteOnce"], "storageClassName": "local",
                "selector": {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["fast"]}]},
                "resources": {"requests": {"storage": "1Gi"}}}})),
        )
        .await
        .unwrap();
    let bound = bound_claim(c, "picky").await;
    assert_eq!(bound.spec.unwrap().volume_name.as_deref(), Some("pv-fast"));
}

/// The node pod `name` is bound to, once it is: kube-scheduler binds a pod's claims first,
/// then the pod.
async fn bound_node(c: &kube::Client, name: &str) -> String {
    let pods = Api::<Pod>::namespaced(c.clone(), "default");
    eventually(30, &format!("{name} bound to a node"), || async {
        pods.get(name).await.ok()?.spec?.node_name
    })
    .await
}

fn finalizers(m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> Vec<String> {
    m.finalizers.clone().unwrap_or_default()
}

#[tokio::test]
async fn a_claim_used_by_a_pod_and_its_bound_volume_are_kept_after_delete_until_the_pod_goes() {
    let env = TestEnv::start(1).await.unwrap();
    let c = &env.clusters[0].client;
    class(c, "local", "kubernetes.io/no-provisioner", "Immediate").await;
    local_pv(c, "pv-held", "c1-node-1", "1Gi", "Retain").await;
    let pvs = Api::<PersistentVolume>::all(c.clone());
    let claims = Api::<PersistentVolumeClaim>::namespaced(c.clone(), "default");
    let pods = Api::<Pod>::namespaced(c.clone(), "default");
    // The StorageObjectInUseProtection admission plugin and the API server's defaults.
    let pv = pvs.get("pv-held").await.unwrap();
    assert_eq!(finalizers(&pv.metadata), ["kubernetes.io/pv-protection"]);
    let spec = pv.spec.unwrap();
    assert_eq!(spec.volume_mode.as_deref(), Some("Filesystem"));
    assert!(pv.status.unwrap().last_phase_transition_time.is_some());
    let pvc = claim(c, "held", "local", "1Gi").await;
    assert_eq!(finalizers(&pvc.metadata), ["kubernetes.io/pvc-protection"]);
    assert_eq!(pvc.spec.unwrap().volume_mode.as_deref(), Some("Filesystem"));
    bound_claim(c, "held").await;
    pod_with_claim(c, "app", "held").await;
    bound_node(c, "app").await;

    // Deleting either only marks it: the pod uses the claim, the claim is bound to the volume.
    let marked = claims
        .delete("held", &DeleteParams::default())
        .await
        .unwrap()
        .left()
        .expect("the claim is kept");
    assert!(marked.metadata.deletion_timestamp.is_some());
    assert_eq!(marked.metadata.deletion_grace_period_seconds, Some(0));
    let marked = pvs
        .delete("pv-held", &DeleteParams::default())
        .await
        .unwrap()
        .left()
        .expect("the volume is kept");
    assert!(marked.metadata.deletion_timestamp.is_some());
    // Give the protection controllers time to (wrongly) let go.
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    let held = claims.get("held").await.unwrap();
    assert_eq!(finalizers(&held.metadata), ["kubernetes.io/pvc-protection"]);
    let held = pvs.get("pv-held").await.unwrap();
    assert_eq!(finalizers(&held.metadata), ["kubernetes.io/pv-protection"]);
    assert_eq!(held.status.unwrap().phase.as_deref(), Some("Bound"));

    // The pod goes, then the claim; the volume is released, then goes too.
    pods.delete("app", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    eventually(30, "the claim gone", || async {
        claims.get_opt("held").await.ok()?.is_none().then_some(())
    })
    .await;
    eventually(30, "the volume gone", || async {
        pvs.get_opt("pv-held").await.ok()?.is_none().then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_claim_without_access_modes_is_refused() {
    let env = TestEnv::start(1).await.unwrap();
    let c = &env.clusters[0].client;
    let err = Api::<PersistentVolumeClaim>::namespaced(c.clone(), "default")
        .create(
            &PostParams::default(),
            &from(json!({"metadata": {"name": "bad"}, "spec": {
                "resources": {"requests": {"storage": "1Gi"}}}})),
        )
        .await
        .unwrap_err();
    let kube::Error::Api(status) = err else {
        panic!("not an API error: {err}");
    };
    assert_eq!(status.code, 422);
    assert_eq!(status.reason, "Invalid");
    assert_eq!(
        status.message,
        "PersistentVolumeClaim \"bad\" is invalid: spec.accessModes: Required value: at least 1 access mode is required"
    );
}
