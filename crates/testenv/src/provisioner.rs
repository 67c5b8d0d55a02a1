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
use kube::runtime::{WatchStreamExt as _, watcher};
use tokio_util::sync::CancellationToken;

use tensile_sim::apiserver::controllers::{NO_PROVISIONER, provisioned_volume};

const ANN_SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";
const ANN_STORAGE_PROVISIONER: &str = "volume.kubernetes.io/storage-provisioner";
const ANN_BETA_STORAGE_PROVISIONER: &str = "volume.beta.kubernetes.io/storage-provisioner";
const ANN_PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";

/// Runs until `stop`.
pub fn start(client: kube::Client, stop: CancellationToken) {
    let claims: Api<PersistentVolumeClaim> = Api::all(client.clone());
    let volumes: Api<PersistentVolume> = Api::all(client.clone());
    let classes: Api<StorageClass> = Api::all(client);
    let made = volumes.clone();
    tokio::spawn(each_applied(claims, stop.clone(), move |claim| {
        let (volumes, classes) = (made.clone(), classes.clone());
        async move {
            if let Err(e) = provision(&volumes, &classes, &claim).await {
                tracing::warn!(error = %e, "test provisioner");
            }
        }
    }));
    tokio::spawn(each_applied(volumes.clone(), stop, move |volume| {
        let volumes = volumes.clone();
        async move { reclaim(&volumes, &volume).await }
    }));
}

/// Calls `f` with every object of `api` as it is listed, created or changed, until `stop`.
async fn each_applied<K, F, Fut>(api: Api<K>, stop: CancellationToken, f: F)
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
    F: Fn(K) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    // With back-off: without it a watch whose server is gone (a cluster stopping, an API
    // server killed by a fault test) retries at once, hundreds of failed connects a second.
    let mut events =
        std::pin::pin!(watcher::watcher(api, watcher::Config::default()).default_backoff());
    loop {
        let event = tokio::select! {
            () = stop.cancelled() => return,
            e = events.next() => e,
        };
        match event {
            Some(Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o))) => f(o).await,
            Some(_) => {}
            None => return,
        }
    }
}

async fn provision(
    volumes: &Api<PersistentVolume>,
    classes: &Api<StorageClass>,
    claim: &PersistentVolumeClaim,
) -> Result<(), kube::Error> {
    let spec = claim.spec.as_ref();
    let pending = claim.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Pending");
    if spec.and_then(|s| s.volume_name.as_ref()).is_some() || !pending {
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
    let class = match spec.and_then(|s| s.storage_class_name.as_ref()) {
        Some(name) => classes.get_opt(name).await?,
        None => None,
    };
    let policy = class
        .and_then(|c| c.reclaim_policy)
        .unwrap_or_else(|| "Delete".into());
    let pv: PersistentVolume =
        serde_json::from_value(provisioned_volume(claim, provisioner, node, &policy))
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
