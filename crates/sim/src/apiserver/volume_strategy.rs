//! PersistentVolume and PersistentVolumeClaim specifics of the API server: the defaults of
//! `SetDefaults_PersistentVolume(Claim)` and `SetDefaults_HostPathVolumeSource`, the
//! StorageObjectInUseProtection admission plugin (the protection finalizers), the claim
//! validation clients run into, and `status.lastPhaseTransitionTime` as the PV status strategy
//! keeps it.

use serde_json::{Value, json};

use super::meta::{self, meta_mut};
use super::resources::ResourceType;

/// The finalizer of claims, removed by the pvc-protection controller once no pod uses them.
pub(super) const PVC_PROTECTION: &str = "kubernetes.io/pvc-protection";
/// The finalizer of volumes, removed by the pv-protection controller once they are not Bound.
pub(super) const PV_PROTECTION: &str = "kubernetes.io/pv-protection";

fn is_pv(rt: &ResourceType) -> bool {
    rt.group.is_empty() && rt.plural == "persistentvolumes"
}

fn is_pvc(rt: &ResourceType) -> bool {
    rt.group.is_empty() && rt.plural == "persistentvolumeclaims"
}

/// The protection finalizer of a resource, if it has one.
pub(super) fn protection_finalizer(rt: &ResourceType) -> Option<&'static str> {
    if is_pv(rt) {
        Some(PV_PROTECTION)
    } else if is_pvc(rt) {
        Some(PVC_PROTECTION)
    } else {
        None
    }
}

fn set_default(map: &mut Value, key: &str, value: Value) {
    if let Some(m) = map.as_object_mut()
        && m.get(key).is_none_or(Value::is_null)
    {
        m.insert(key.to_owned(), value);
    }
}

/// Spec defaults, applied to every write of the object (the real server defaults on decode).
pub(super) fn set_defaults(rt: &ResourceType, obj: &mut Value) {
    if !(is_pv(rt) || is_pvc(rt)) {
        return;
    }
    if !obj.get("spec").is_some_and(Value::is_object) {
        obj["spec"] = json!({});
    }
    let spec = &mut obj["spec"];
    set_default(spec, "volumeMode", json!("Filesystem"));
    if is_pv(rt) {
        set_default(spec, "persistentVolumeReclaimPolicy", json!("Retain"));
        // `HostPathUnset`, written as the empty string.
        if let Some(host_path) = spec.get_mut("hostPath").filter(|h| h.is_object()) {
            set_default(host_path, "type", json!(""));
        }
    }
}

/// Create: defaults, the protection finalizer (StorageObjectInUseProtection admission) and the
/// initial status (a volume starts Pending, with its phase's transition time; the PV
/// controller makes it Available).
pub(super) fn prepare_create(rt: &ResourceType, obj: &mut Value) {
    let Some(finalizer) = protection_finalizer(rt) else {
        return;
    };
    set_defaults(rt, obj);
    let m = meta_mut(obj);
    let finalizers = m.entry("finalizers").or_insert_with(|| json!([]));
    if !finalizers.is_array() {
        *finalizers = json!([]);
    }
    if let Some(list) = finalizers.as_array_mut()
        && !list.iter().any(|f| f == finalizer)
    {
        list.push(json!(finalizer));
    }
    obj["status"] = if is_pv(rt) {
        json!({"phase": "Pending", "lastPhaseTransitionTime": meta::now()})
    } else {
        json!({"phase": "Pending"})
    };
}

/// A status write of a volume, as the PV status strategy takes it: an unchanged phase keeps
/// its transition time unless the writer sets one, a changed phase gets `now` unless the
/// writer set a new one. A missing phase is defaulted to Pending.
pub(super) fn prepare_status_update(rt: &ResourceType, new: &mut Value, old: &Value) {
    if !(is_pv(rt) || is_pvc(rt)) {
        return;
    }
    if !new.get("status").is_some_and(Value::is_object) {
        new["status"] = json!({});
    }
    set_default(&mut new["status"], "phase", json!("Pending"));
    if !is_pv(rt) {
        return;
    }
    let text = |v: &Value, p: &str| v.pointer(p).and_then(Value::as_str).map(str::to_owned);
    let old_phase = text(old, "/status/phase");
    let new_phase = text(new, "/status/phase");
    let old_time = text(old, "/status/lastPhaseTransitionTime");
    let new_time = text(new, "/status/lastPhaseTransitionTime");
    let time = if old_phase == new_phase {
        new_time.or(old_time)
    } else if new_time.is_none() || new_time == old_time {
        Some(meta::now())
    } else {
        new_time
    };
    if let (Some(t), Some(status)) = (time, new["status"].as_object_mut()) {
        status.insert("lastPhaseTransitionTime".into(), json!(t));
    }
}

/// Sets a volume's phase as the PV controller's status writes do (through the status
/// strategy): the transition time moves only when the phase changes.
pub(super) fn set_volume_phase(pv: &mut Value, phase: &str) {
    if !pv.get("status").is_some_and(Value::is_object) {
        pv["status"] = json!({});
    }
    let status = &mut pv["status"];
    if status.get("phase").and_then(Value::as_str) == Some(phase) {
        return;
    }
    status["phase"] = json!(phase);
    status["lastPhaseTransitionTime"] = json!(meta::now());
}

/// The causes a claim is refused for (`ValidatePersistentVolumeClaimSpec`, the parts that
/// clients run into).
pub(super) fn validate(rt: &ResourceType, obj: &Value) -> Vec<(String, String)> {
    let mut causes = Vec::new();
    if is_pvc(rt)
        && obj
            .pointer("/spec/accessModes")
            .and_then(Value::as_array)
            .is_none_or(Vec::is_empty)
    {
        causes.push((
            "spec.accessModes".to_owned(),
            "Required value: at least 1 access mode is required".to_owned(),
        ));
    }
    causes
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::resources::{self, ids};

    #[test]
    fn a_new_volume_is_pending_with_its_finalizer_and_defaults() {
        let rt = resources::get(*ids::PERSISTENT_VOLUMES);
        let mut pv = json!({"metadata": {"name": "v", "finalizers": ["a/b"]},
            "spec": {"hostPath": {"path": "/x"}}, "status": {"phase": "Bound"}});
        prepare_create(rt, &mut pv);
        assert_eq!(pv["metadata"]["finalizers"], json!(["a/b", PV_PROTECTION]));
        assert_eq!(pv["spec"]["volumeMode"], "Filesystem");
        assert_eq!(pv["spec"]["persistentVolumeReclaimPolicy"], "Retain");
        assert_eq!(pv["spec"]["hostPath"]["type"], "");
        assert_eq!(pv["status"]["phase"], "Pending");
        assert!(pv["status"]["lastPhaseTransitionTime"].is_string());
    }

    #[test]
    fn the_transition_time_moves_with_the_phase_only() {
        let rt = resources::get(*ids::PERSISTENT_VOLUMES);
        let old = json!({"status": {"phase": "Bound", "lastPhaseTransitionTime": "2020-01-01T00:00:00Z"}});
        let mut same = json!({"status": {"phase": "Bound"}});
        prepare_status_update(rt, &mut same, &old);
        assert_eq!(
            same["status"]["lastPhaseTransitionTime"],
            "2020-01-01T00:00:00Z"
        );
        let mut changed = old.clone();
        changed["status"]["phase"] = json!("Released");
        prepare_status_update(rt, &mut changed, &old);
        assert_ne!(
            changed["status"]["lastPhaseTransitionTime"],
            "2020-01-01T00:00:00Z"
        );
        let mut given = json!({"status": {"phase": "Released", "lastPhaseTransitionTime": "2021-01-01T00:00:00Z"}});
        prepare_status_update(rt, &mut given, &old);
        assert_eq!(
            given["status"]["lastPhaseTransitionTime"],
            "2021-01-01T00:00:00Z"
        );
    }

    #[test]
    fn a_claim_needs_an_access_mode() {
        let rt = resources::get(*ids::PERSISTENT_VOLUME_CLAIMS);
        let causes = validate(rt, &json!({"spec": {"accessModes": []}}));
        assert_eq!(causes.len(), 1);
        assert!(validate(rt, &json!({"spec": {"accessModes": ["ReadWriteOnce"]}})).is_empty());
    }
}
