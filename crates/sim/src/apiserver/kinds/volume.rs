//! PersistentVolumes and PersistentVolumeClaims: the defaults of
//! `SetDefaults_PersistentVolume(Claim)` and `SetDefaults_HostPathVolumeSource`, the
//! StorageObjectInUseProtection admission plugin (the protection finalizers), the
//! DefaultStorageClass admission plugin, the claim validation clients run into, and
//! `status.lastPhaseTransitionTime` as the PV status strategy keeps it.

use serde_json::{Value, json};

use super::set_default;
use crate::apiserver::State;
use crate::apiserver::errors::ApiError;
use crate::apiserver::meta::{self, meta_mut};
use crate::apiserver::resources::ids;
use crate::apiserver::strategy::{Causes, Strategy};

/// The finalizer of claims, removed by the pvc-protection controller once no pod uses them.
pub(crate) const PVC_PROTECTION: &str = "kubernetes.io/pvc-protection";
/// The finalizer of volumes, removed by the pv-protection controller once they are not Bound.
pub(crate) const PV_PROTECTION: &str = "kubernetes.io/pv-protection";

/// The strategy of persistent volumes.
#[derive(Debug)]
pub(crate) struct PersistentVolumes;

impl Strategy for PersistentVolumes {
    fn defaults(&self, obj: &mut Value) {
        let spec = spec_defaults(obj);
        set_default(spec, "persistentVolumeReclaimPolicy", json!("Retain"));
        // `HostPathUnset`, written as the empty string.
        if let Some(host_path) = spec.get_mut("hostPath").filter(|h| h.is_object()) {
            set_default(host_path, "type", json!(""));
        }
    }

    /// The protection finalizer; a volume starts Pending, with its phase's transition time
    /// (the PV controller makes it Available).
    fn prepare_create(&self, _state: &State, obj: &mut Value) -> Result<(), ApiError> {
        add_finalizer(obj, PV_PROTECTION);
        obj["status"] = json!({"phase": "Pending", "lastPhaseTransitionTime": meta::now()});
        Ok(())
    }

    /// An unchanged phase keeps its transition time unless the writer sets one, a changed
    /// phase gets `now` unless the writer set a new one. A missing phase is Pending.
    fn prepare_status_update(&self, new: &mut Value, old: &Value) {
        default_phase(new);
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
}

/// The strategy of persistent volume claims.
#[derive(Debug)]
pub(crate) struct PersistentVolumeClaims;

impl Strategy for PersistentVolumeClaims {
    fn defaults(&self, obj: &mut Value) {
        spec_defaults(obj);
    }

    /// The default storage class, the protection finalizer; a claim starts Pending.
    fn prepare_create(&self, state: &State, obj: &mut Value) -> Result<(), ApiError> {
        default_storage_class(state, obj);
        add_finalizer(obj, PVC_PROTECTION);
        obj["status"] = json!({"phase": "Pending"});
        Ok(())
    }

    fn prepare_status_update(&self, new: &mut Value, _old: &Value) {
        default_phase(new);
    }

    /// `ValidatePersistentVolumeClaimSpec`, the parts clients run into.
    fn validate(&self, obj: &Value, _old: Option<&Value>) -> Causes {
        let mut causes = Vec::new();
        if obj
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
}

/// The spec (made where missing) with the defaults both kinds share.
fn spec_defaults(obj: &mut Value) -> &mut Value {
    if !obj.get("spec").is_some_and(Value::is_object) {
        obj["spec"] = json!({});
    }
    let spec = &mut obj["spec"];
    set_default(spec, "volumeMode", json!("Filesystem"));
    spec
}

fn add_finalizer(obj: &mut Value, finalizer: &str) {
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
}

fn default_phase(obj: &mut Value) {
    if !obj.get("status").is_some_and(Value::is_object) {
        obj["status"] = json!({});
    }
    set_default(&mut obj["status"], "phase", json!("Pending"));
}

/// Sets a volume's phase as the PV controller's status writes do (through the status
/// strategy): the transition time moves only when the phase changes.
pub(crate) fn set_volume_phase(pv: &mut Value, phase: &str) {
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

/// The DefaultStorageClass admission plugin: a claim that names no class (the field absent, not
/// `""`) gets the class annotated as the default, if exactly one is.
fn default_storage_class(state: &State, obj: &mut Value) {
    if obj
        .pointer("/spec/storageClassName")
        .is_some_and(|c| !c.is_null())
    {
        return;
    }
    let (defaults, _, _) = state
        .store
        .list(*ids::STORAGE_CLASSES, None, None, None, |e| {
            e.object
                .pointer("/metadata/annotations/storageclass.kubernetes.io~1is-default-class")
                .and_then(Value::as_str)
                == Some("true")
        });
    if let [only] = defaults.as_slice()
        && let Some(name) = meta::name(&only.object)
        && let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut)
    {
        spec.insert("storageClassName".into(), json!(name));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_volume_is_pending_with_its_finalizer_and_defaults() {
        let state = State::for_tests();
        let mut pv = json!({"metadata": {"name": "v", "finalizers": ["a/b"]},
            "spec": {"hostPath": {"path": "/x"}}, "status": {"phase": "Bound"}});
        PersistentVolumes.defaults(&mut pv);
        PersistentVolumes.prepare_create(&state, &mut pv).unwrap();
        assert_eq!(pv["metadata"]["finalizers"], json!(["a/b", PV_PROTECTION]));
        assert_eq!(pv["spec"]["volumeMode"], "Filesystem");
        assert_eq!(pv["spec"]["persistentVolumeReclaimPolicy"], "Retain");
        assert_eq!(pv["spec"]["hostPath"]["type"], "");
        assert_eq!(pv["status"]["phase"], "Pending");
        assert!(pv["status"]["lastPhaseTransitionTime"].is_string());
    }

    #[test]
    fn a_new_claim_gets_the_default_class_and_its_finalizer() {
        let state = State::for_tests();
        let class = json!({"metadata": {"name": "fast",
            "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}}});
        state
            .store
            .create(
                *ids::STORAGE_CLASSES,
                crate::apiserver::store::ObjKey::new("", "fast"),
                class,
            )
            .unwrap();
        let mut pvc =
            json!({"metadata": {"name": "c"}, "spec": {"accessModes": ["ReadWriteOnce"]}});
        PersistentVolumeClaims.defaults(&mut pvc);
        PersistentVolumeClaims
            .prepare_create(&state, &mut pvc)
            .unwrap();
        assert_eq!(pvc["spec"]["storageClassName"], "fast");
        assert_eq!(pvc["metadata"]["finalizers"], json!([PVC_PROTECTION]));
        assert_eq!(pvc["status"], json!({"phase": "Pending"}));
        let mut none = json!({"metadata": {"name": "d"}, "spec": {"storageClassName": ""}});
        PersistentVolumeClaims
            .prepare_create(&state, &mut none)
            .unwrap();
        assert_eq!(
            none["spec"]["storageClassName"], "",
            "an explicit empty class stays"
        );
    }

    #[test]
    fn the_transition_time_moves_with_the_phase_only() {
        let old = json!({"status": {"phase": "Bound", "lastPhaseTransitionTime": "2020-01-01T00:00:00Z"}});
        let mut same = json!({"status": {"phase": "Bound"}});
        PersistentVolumes.prepare_status_update(&mut same, &old);
        assert_eq!(
            same["status"]["lastPhaseTransitionTime"],
            "2020-01-01T00:00:00Z"
        );
        let mut changed = old.clone();
        changed["status"]["phase"] = json!("Released");
        PersistentVolumes.prepare_status_update(&mut changed, &old);
        assert_ne!(
            changed["status"]["lastPhaseTransitionTime"],
            "2020-01-01T00:00:00Z"
        );
        let mut given = json!({"status": {"phase": "Released", "lastPhaseTransitionTime": "2021-01-01T00:00:00Z"}});
        PersistentVolumes.prepare_status_update(&mut given, &old);
        assert_eq!(
            given["status"]["lastPhaseTransitionTime"],
            "2021-01-01T00:00:00Z"
        );
        let mut claim = json!({"status": {}});
        PersistentVolumeClaims.prepare_status_update(&mut claim, &old);
        assert_eq!(claim["status"], json!({"phase": "Pending"}));
    }

    #[test]
    fn a_claim_needs_an_access_mode() {
        let causes = PersistentVolumeClaims.validate(&json!({"spec": {"accessModes": []}}), None);
        assert_eq!(causes.len(), 1);
        assert!(
            PersistentVolumeClaims
                .validate(&json!({"spec": {"accessModes": ["ReadWriteOnce"]}}), None)
                .is_empty()
        );
    }
}
