//! Downward API field values as a kubelet resolves them, for the paths whose value can differ
//! between an upper pod and its lower copy (`crate::translate` pins them in env, `crate::identity`
//! reads them for the upper API's env).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;

/// A downward API `fieldRef` path's value on a pod, as a kubelet resolves it, for the paths
/// whose value can differ between an upper pod and its lower copy: `metadata.name`,
/// `metadata.namespace`, `metadata.uid`, `metadata.labels['k']`, `metadata.annotations['k']`,
/// `spec.nodeName` and `spec.serviceAccountName` (a missing one reads as empty, as in the
/// kubelet). `None` for every other path: `status.podIP(s)` and `status.hostIP(s)` are the
/// lower pod's own and true; what Kubernetes does not accept in env is left to it.
pub fn downward_field_value(pod: &Pod, path: &str) -> Option<String> {
    let meta = &pod.metadata;
    let subscript = |prefix: &str| {
        path.strip_prefix(prefix)
            .and_then(|r| r.strip_prefix("['"))
            .and_then(|r| r.strip_suffix("']"))
    };
    let entry = |map: Option<&BTreeMap<String, String>>, key: &str| {
        map.and_then(|m| m.get(key)).cloned().unwrap_or_default()
    };
    if let Some(key) = subscript("metadata.labels") {
        return Some(entry(meta.labels.as_ref(), key));
    }
    if let Some(key) = subscript("metadata.annotations") {
        return Some(entry(meta.annotations.as_ref(), key));
    }
    let spec = pod.spec.as_ref();
    let value = match path {
        "metadata.name" => meta.name.clone(),
        "metadata.namespace" => meta.namespace.clone(),
        "metadata.uid" => meta.uid.clone(),
        "spec.nodeName" => spec.and_then(|s| s.node_name.clone()),
        "spec.serviceAccountName" => spec.and_then(|s| s.service_account_name.clone()),
        _ => return None,
    };
    Some(value.unwrap_or_default())
}
