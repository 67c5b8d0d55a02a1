//! A dynamic volume provisioner for real control planes, doing what the simulator's volume
//! controller does for any provisioner but `kubernetes.io/no-provisioner`: an ordinary cluster
//! runs one (local-path-provisioner, a CSI driver's external-provisioner), a bare control plane
//! has none, and claims of a class with a provisioner would wait forever.
//!
//! It follows the external-provisioner protocol: once kube-scheduler has chosen a node for a
//! `WaitForFirstConsumer` claim (`volume.kubernetes.io/selected-node`) and the PV controller
//! has named the provisioner (`volume.kubernetes.io/storage-provisioner`), it creates a local
//! volume on that node, pre-bound to the claim (`claimRef`) and marked
//! `pv.kubernetes.io/provisioned-by`; the PV controller binds the pair. A `Released` volume it
//! made with reclaim policy `Delete` is deleted.

use futures::StreamExt;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, DeleteParams, PostParams};
use kube::runtime::watcher;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::apiserver::controllers::NO_PROVISIONER;

const ANN_SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";
const ANN_STORAGE_PROVISIONER: &str = "volume.kubernetes.io/storage-provisioner";
const ANN_BETA_STORAGE_PROVISIONER: &str = "volume.beta.kubernetes.io/storage-provisioner";
const ANN_PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";

/// Runs until `stop`.
pub fn start(client: kube::Client, stop: CancellationToken) {
    let claims: Api<PersistentVolumeClaim> = Api::all(client.clone());
    let volumes: Api<PersistentVolume> = Api::all(client.clone());
    let classes: Api<StorageClass> = Api::all(client);
    let on_claims = {
        let (volumes, stop) = (volumes.clone(), stop.clone());
        async move {
            let mut events = std::pin::pin!(watcher::watcher(claims, watcher::Config::default()));
            loop {
                let event = tokio::select! {
                    () = stop.cancelled() => return,
                    e = events.next() => e,
                };
                match event {
                    Some(Ok(watcher::Event::Apply(c) | watcher::Event::InitApply(c))) => {
                        if let Err(e) = provision(&volumes, &classes, &c).await {
                            tracing::warn!(error = %e, "test provisioner");
                        }
                    }
                    Some(_) => {}
                    None => return,
                }
            }
        }
    };
    let on_volumes = async move {
        let mut events = std::pin::pin!(watcher::watcher(
            volumes.clone(),
            watcher::Config::default()
        ));
        loop {
            let event = tokio::select! {
                () = stop.cancelled() => return,
                e = events.next() => e,
            };
            match event {
                Some(Ok(watcher::Event::Apply(v) | watcher::Event::InitApply(v))) => {
                    reclaim(&volumes, &v).await;
                }
                Some(_) => {}
                None => return,
            }
        }
    };
    tokio::spawn(on_claims);
    tokio::spawn(on_volumes);
}

async fn provision(
    volumes: &Api<PersistentVolume>,
    classes: &Api<StorageClass>,
    claim: &PersistentVolumeClaim,
) -> Result<(), kube::Error> {
    let spec = claim.spec.clone().unwrap_or_default();
    let pending = claim.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Pending");
    if spec.volume_name.is_some() || !pending {
        return Ok(());
    }
    let annotations = claim.metadata.annotations.clone().unwrap_or_default();
    let Some(provisioner) = annotations
        .get(ANN_STORAGE_PROVISIONER)
        .or_else(|| annotations.get(ANN_BETA_STORAGE_PROVISIONER))
    else {
        return Ok(());
    };
    let Some(node) = annotations.get(ANN_SELECTED_NODE) else {
        return Ok(());
    };
    if provisioner == NO_PROVISIONER {
        return Ok(());
    }
    let class = match &spec.storage_class_name {
        Some(name) => classes.get_opt(name).await?,
        None => None,
    };
    let policy = class
        .and_then(|c| c.reclaim_policy)
        .unwrap_or_else(|| "Delete".into());
    let uid = claim.metadata.uid.clone().unwrap_or_default();
    let name = format!("pvc-{uid}");
    let pv: PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": name, "annotations": {ANN_PROVISIONED_BY: provisioner}},
        "spec": {
            "capacity": spec.resources.as_ref().and_then(|r| r.requests.clone()).unwrap_or_default(),
            "accessModes": spec.access_modes.clone().unwrap_or_default(),
            "persistentVolumeReclaimPolicy": policy,
            "storageClassName": spec.storage_class_name.clone().unwrap_or_default(),
            "volumeMode": spec.volume_mode.clone().unwrap_or_else(|| "Filesystem".into()),
            "local": {"path": format!("/var/lib/tensile-test/volumes/{name}")},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}]}},
            "claimRef": {"kind": "PersistentVolumeClaim", "apiVersion": "v1",
                "namespace": claim.metadata.namespace, "name": claim.metadata.name, "uid": uid},
        },
    }))
    .map_err(kube::Error::SerdeError)?;
    match volumes.create(&PostParams::default(), &pv).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(e),
    }
}

async fn reclaim(volumes: &Api<PersistentVolume>, volume: &PersistentVolume) {
    let ours = volume
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANN_PROVISIONED_BY))
        .is_some_and(|p| p != NO_PROVISIONER);
    let released = volume.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Released");
    let delete = volume
        .spec
        .as_ref()
        .and_then(|s| s.persistent_volume_reclaim_policy.as_deref())
        == Some("Delete");
    if !(ours && released && delete) {
        return;
    }
    let (Some(name), Some(uid)) = (&volume.metadata.name, &volume.metadata.uid) else {
        return;
    };
    let params = DeleteParams::default().preconditions(kube::api::Preconditions {
        uid: Some(uid.clone()),
        resource_version: None,
    });
    if let Err(e) = volumes.delete(name, &params).await {
        tracing::debug!(error = %e, volume = %name, "test provisioner: deleting a released volume");
    }
}
