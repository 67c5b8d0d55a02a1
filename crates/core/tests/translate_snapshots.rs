//! Snapshots of what we send to the lower cluster for realistic upper pods, as a real API
//! server stores them (admission defaults, projected token volumes, owner references...).
//! A change in any of these objects is a change in what lower clusters receive: review it.

#![allow(clippy::unwrap_used, clippy::panic)] // test helpers: failing loudly is the point
use k8s_openapi::api::core::v1::Pod;
use serde_json::json;
use tensile_core::deps::pod_dependencies;
use tensile_core::translate::{TranslateConfig, lower_pod};

fn fixture(name: &str) -> Pod {
    let path = format!(
        "{}/tests/fixtures/upper-pods/{name}.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn snapshot(name: &str) {
    let upper = fixture(name);
    let cfg = TranslateConfig::new("vk-lower-1");
    let lower = lower_pod(&upper, &cfg).unwrap();
    insta::assert_json_snapshot!(
        name,
        json!({"lower_pod": lower, "dependencies": pod_dependencies(&upper)})
    );
}

macro_rules! snapshots {
    ($($test:ident => $fixture:literal,)*) => {
        $(#[test] fn $test() { snapshot($fixture); })*
    };
}

snapshots! {
    deployment_pod_with_projected_token => "01-deployment-pod-projected-token",
    pod_with_configmap_secret_and_pvc_volumes => "02-configmap-secret-pvc-volumes",
    pod_with_init_containers => "03-init-containers",
    pod_with_gpu_requests_and_ignore_label => "04-gpu-requests",
    webhook_annotated_pod => "05-webhook-annotated",
    pod_with_legacy_default_token => "06-legacy-default-token",
    pod_with_custom_service_account_legacy_token => "07-custom-service-account-legacy-token",
    job_pod_with_restart_never_and_env_from => "08-job-pod-restart-never",
    pod_with_priority_runtime_class_and_overhead => "09-priority-runtimeclass-overhead",
    pod_with_ephemeral_debug_container => "10-ephemeral-debug-container",
    pod_with_sidecar_projected_volume_and_pull_secrets => "11-sidecar-projected-and-image-pull-secrets",
    pod_with_storage_plugin_secret_refs_and_csi => "12-storage-plugin-secret-refs-and-csi",
    pod_of_a_custom_upper_scheduler => "13-custom-scheduler",
    pod_naming_its_lower_scheduler => "14-custom-scheduler-lower-scheduler-annotation",
}
