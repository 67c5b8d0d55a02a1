//! The volume controller (`PVControllers`) end to end on simulated clusters: a lower volume
//! bound to our claim is mirrored upstairs and binds the upper claim, deletions follow both
//! ways, and lower claims whose upper claim is gone are collected at start. The lower cluster
//! binds claims as kube does (static local volumes with `WaitForFirstConsumer`, or a
//! provisioner); the upper cluster's PV controller completes the upper binding from what the
//! virtual node writes.

use crate::common::{NodeOptions, clusters, eventually, gone, run_pod_spec, spawn};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tensile_core::keys::{ANNOTATION_GLOBAL, ANNOTATION_SELECTED_NODE};
use tensile_testenv::TestEnv;
use tokio_util::sync::CancellationToken;

fn from<T: serde::de::DeserializeOwned>(v: Value) -> T {
    serde_json::from_value(v).unwrap()
}

fn annotation<'a>(m: &'a ObjectMeta, key: &str) -> Option<&'a str> {
    m.annotations.as_ref()?.get(key).map(String::as_str)
}

/// How the lower cluster gets volumes.
#[derive(Clone, Copy)]
enum Storage {
    /// A hand-made local volume `pv-local` on `lower-node-1`, reclaim policy Retain.
    StaticLocal,
    /// A provisioner that makes a local volume on the pod's node, reclaim policy Delete.
    Provisioned,
}

struct Fixture {
    env: TestEnv,
    node: CancellationToken,
    /// The API calls of the virtual node's clients.
    calls: tensile_runtime::clients::ApiCalls,
    /// The upper claim as created.
    claim: PersistentVolumeClaim,
    /// The name of the volume the lower cluster bound.
    volume: String,
}

impl Fixture {
    fn upper(&self) -> &kube::Client {
        &self.env.clusters[0].client
    }
    fn lower(&self) -> &kube::Client {
        &self.env.clusters[1].client
    }
    fn volumes(&self, upper: bool) -> Api<PersistentVolume> {
        Api::all(if upper { self.upper() } else { self.lower() }.clone())
    }
    fn claims(&self, upper: bool) -> Api<PersistentVolumeClaim> {
        Api::namespaced(
            if upper { self.upper() } else { self.lower() }.clone(),
            "default",
        )
    }
}

async fn storage_class(client: &kube::Client, provisioner: &str) {
    Api::<StorageClass>::all(client.clone())
        .create(
            &PostParams::default(),
            &from(
                json!({"metadata": {"name": "local"}, "provisioner": provisioner,
                "volumeBindingMode": "WaitForFirstConsumer", "reclaimPolicy": "Delete"}),
            ),
        )
        .await
        .unwrap();
}

/// Clusters, a virtual node with `PVControllers`, and pod `app` offloaded with claim `data`,
/// Running downstairs; returns once the lower claim is bound.
async fn offloaded_with_claim(storage: Storage) -> Fixture {
    let env = clusters().await;
    let mut opts = NodeOptions::new("vk-lower");
    opts.volumes = true;
    let spawned = spawn(&env, opts).await;
    let (node, calls) = (spawned.stop, spawned.calls);
    let (upper, lower) = (&env.clusters[0].client, &env.clusters[1].client);
    let provisioner = match storage {
        Storage::StaticLocal => "kubernetes.io/no-provisioner",
        Storage::Provisioned => "rancher.io/local-path",
    };
    storage_class(lower, provisioner).await;
    // Upstairs the class exists too, as users create claims against it; nothing binds there.
    storage_class(upper, provisioner).await;
    if let Storage::StaticLocal = storage {
        Api::<PersistentVolume>::all(lower.clone())
            .create(
                &PostParams::default(),
                &from(json!({"metadata": {"name": "pv-local"}, "spec": {
                    "capacity": {"storage": "2Gi"}, "accessModes": ["ReadWriteOnce"],
                    "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "local",
                    "local": {"path": "/mnt/disks/pv-local"},
                    "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                        {"key": "kubernetes.io/hostname", "operator": "In",
                         "values": ["lower-node-1"]}]}]}}}})),
            )
            .await
            .unwrap();
    }
    let claim = Api::<PersistentVolumeClaim>::namespaced(upper.clone(), "default")
        .create(
            &PostParams::default(),
            &from(
                json!({"metadata": {"name": "data"}, "spec": {"accessModes": ["ReadWriteOnce"],
                "storageClassName": "local", "resources": {"requests": {"storage": "1Gi"}}}}),
            ),
        )
        .await
        .unwrap();
    run_pod_spec(
        upper,
        "app",
        json!({"volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]}),
    )
    .await;
    let lower_claims: Api<PersistentVolumeClaim> = Api::namespaced(lower.clone(), "default");
    let volume = eventually(30, "the lower claim to be bound", || async {
        lower_claims.get("data").await.ok()?.spec?.volume_name
    })
    .await;
    Fixture {
        env,
        node,
        calls,
        claim,
        volume,
    }
}

/// Deletes the upper pod `app` (at once) and the upper claim `data`.
async fn delete_pod_and_claim(f: &Fixture) {
    Api::<Pod>::namespaced(f.upper().clone(), "default")
        .delete("app", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    f.claims(true)
        .delete("data", &DeleteParams::default())
        .await
        .unwrap();
}

/// The upper volume of the lower one, once it exists.
async fn upper_volume(f: &Fixture) -> PersistentVolume {
    let upper = f.volumes(true);
    eventually(30, "the upper volume", || async {
        upper.get_opt(&f.volume).await.unwrap()
    })
    .await
}

#[tokio::test]
async fn checklist_76_a_lower_pv_bound_to_our_claim_gets_global_true() {
    let f = offloaded_with_claim(Storage::StaticLocal).await;
    assert_eq!(f.volume, "pv-local");
    let lower = f.volumes(false);
    eventually(30, "global=true on the lower volume", || async {
        let pv = lower.get("pv-local").await.ok()?;
        (annotation(&pv.metadata, ANNOTATION_GLOBAL) == Some("true")).then_some(())
    })
    .await;
}

#[tokio::test]
async fn checklist_77_the_upper_pv_is_pinned_to_the_virtual_node_and_claims_the_upper_pvc() {
    let f = offloaded_with_claim(Storage::StaticLocal).await;
    let pv = upper_volume(&f).await;
    let spec = pv.spec.unwrap();
    let terms = spec
        .node_affinity
        .unwrap()
        .required
        .unwrap()
        .node_selector_terms;
    let expression = &terms[0].match_expressions.as_ref().unwrap()[0];
    assert_eq!(expression.key, "kubernetes.io/hostname");
    assert_eq!(expression.values, Some(vec!["vk-lower".to_owned()]));
    let claim_ref = spec.claim_ref.unwrap();
    assert_eq!(claim_ref.uid, f.claim.metadata.uid, "the upper claim's uid");
    assert_eq!(claim_ref.name.as_deref(), Some("data"));
    assert!(claim_ref.resource_version.is_some());
    assert_eq!(
        spec.persistent_volume_reclaim_policy.as_deref(),
        Some("Retain")
    );
    // The upper PV controller completes the binding upstairs.
    let upper = f.volumes(true);
    eventually(30, "the upper volume Bound", || async {
        let pv = upper.get("pv-local").await.ok()?;
        (pv.status?.phase.as_deref() == Some("Bound")).then_some(())
    })
    .await;
}

#[tokio::test]
async fn checklist_78_the_upper_pvc_gets_the_volume_name_binding_annotations_global_and_the_virtual_node()
 {
    let f = offloaded_with_claim(Storage::Provisioned).await;
    assert!(f.volume.starts_with("pvc-"), "{}", f.volume);
    let claims = f.claims(true);
    let bound = eventually(30, "the upper claim Bound", || async {
        let c = claims.get("data").await.ok()?;
        (c.status.as_ref()?.phase.as_deref() == Some("Bound")).then_some(c)
    })
    .await;
    assert_eq!(
        bound.spec.as_ref().unwrap().volume_name.as_deref(),
        Some(f.volume.as_str())
    );
    let m = &bound.metadata;
    assert_eq!(
        annotation(m, "pv.kubernetes.io/bind-completed"),
        Some("yes")
    );
    assert_eq!(
        annotation(m, "pv.kubernetes.io/bound-by-controller"),
        Some("yes")
    );
    assert_eq!(annotation(m, ANNOTATION_GLOBAL), Some("true"));
    assert_eq!(annotation(m, ANNOTATION_SELECTED_NODE), Some("vk-lower"));
    assert_eq!(
        annotation(m, "volume.kubernetes.io/storage-provisioner"),
        Some("rancher.io/local-path")
    );
}

#[tokio::test]
async fn checklist_79_deleting_the_upper_pvc_or_pv_deletes_the_lower_one() {
    let f = offloaded_with_claim(Storage::StaticLocal).await;
    upper_volume(&f).await;
    // Wait for the lower volume to be marked ours: only then is an upper deletion a deletion.
    let lower = f.volumes(false);
    eventually(30, "the lower volume marked", || async {
        let pv = lower.get("pv-local").await.ok()?;
        (annotation(&pv.metadata, ANNOTATION_GLOBAL) == Some("true")).then_some(())
    })
    .await;
    delete_pod_and_claim(&f).await;
    let lower_claims = f.claims(false);
    gone(&lower_claims, "data", 30, "the lower claim deleted").await;
    // Retain: the lower volume stays, Released, and so does its mirror.
    eventually(30, "the lower volume Released", || async {
        let pv = lower.get("pv-local").await.ok()?;
        (pv.status?.phase.as_deref() == Some("Released")).then_some(())
    })
    .await;
    assert!(f.volumes(true).get_opt("pv-local").await.unwrap().is_some());
    f.volumes(true)
        .delete("pv-local", &DeleteParams::default())
        .await
        .unwrap();
    gone(&lower, "pv-local", 30, "the lower volume deleted").await;
}

#[tokio::test]
async fn checklist_80_a_lower_pv_being_deleted_deletes_the_upper_pv() {
    let f = offloaded_with_claim(Storage::Provisioned).await;
    let upper_pv = upper_volume(&f).await;
    let lower = f.volumes(false);
    // A finalizer holds the lower volume in deletion, as pv-protection does on a real cluster.
    lower
        .patch(
            &f.volume,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": ["example.com/hold"]}})),
        )
        .await
        .unwrap();
    lower
        .delete(&f.volume, &DeleteParams::default())
        .await
        .unwrap();
    let upper = f.volumes(true);
    // Deleted: gone, or held by kubernetes.io/pv-protection while the upper claim still uses it
    // (a real API server adds that finalizer to every volume).
    eventually(30, "the upper volume deleted", || async {
        match upper.get_opt(&f.volume).await.unwrap() {
            None => Some(()),
            Some(pv) if pv.metadata.uid != upper_pv.metadata.uid => Some(()),
            Some(pv) if pv.metadata.deletion_timestamp.is_some() => Some(()),
            Some(_) => None,
        }
    })
    .await;
    let held = lower.get(&f.volume).await.unwrap();
    assert!(
        held.metadata.deletion_timestamp.is_some(),
        "the lower volume was still being deleted"
    );
}

#[tokio::test]
async fn checklist_75_lower_pvcs_whose_upper_claim_is_gone_are_collected_at_start_and_no_other() {
    let f = offloaded_with_claim(Storage::StaticLocal).await;
    upper_volume(&f).await;
    // A lower claim that is not ours, under a name the upper cluster does not have.
    f.claims(false)
        .create(
            &PostParams::default(),
            &from(
                json!({"metadata": {"name": "theirs", "annotations": {"global": "true"}},
                "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "local",
                    "resources": {"requests": {"storage": "1Gi"}}}}),
            ),
        )
        .await
        .unwrap();
    // The virtual node stops; the upper pod and claim are deleted while it is down.
    f.node.cancel();
    delete_pod_and_claim(&f).await;
    // Still there: nobody was watching.
    assert!(f.claims(false).get_opt("data").await.unwrap().is_some());
    let mut opts = NodeOptions::new("vk-lower");
    opts.volumes = true;
    let _node = spawn(&f.env, opts).await;
    let lower_claims = f.claims(false);
    gone(
        &lower_claims,
        "data",
        30,
        "our orphaned lower claim collected",
    )
    .await;
    assert!(lower_claims.get_opt("theirs").await.unwrap().is_some());
}

#[tokio::test]
async fn a_claim_two_pods_use_is_read_from_the_watch_cache_and_copied_once() {
    let f = offloaded_with_claim(Storage::StaticLocal).await;
    upper_volume(&f).await;
    let count = |cluster: &str, verb, resource: &str| f.calls.count(cluster, verb, resource);
    use tensile_runtime::clients::Verb;
    let before = (
        count("upper", Verb::Get, "persistentvolumeclaims"),
        count("lower", Verb::Create, "persistentvolumeclaims"),
    );
    run_pod_spec(
        f.upper(),
        "second",
        json!({"volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]}),
    )
    .await;
    assert_eq!(
        (
            count("upper", Verb::Get, "persistentvolumeclaims"),
            count("lower", Verb::Create, "persistentvolumeclaims"),
        ),
        before,
        "no upper GET and no second lower create for a claim both watch caches hold"
    );
}
