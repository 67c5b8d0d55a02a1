//! kube-controller-manager's pvc-protection and pv-protection controllers: a claim being
//! deleted keeps `kubernetes.io/pvc-protection` while a scheduled pod refers to it, a volume
//! being deleted keeps `kubernetes.io/pv-protection` while it is Bound; then the finalizer
//! goes (and with it the object, when it was the last). Objects not being deleted that lack
//! their finalizer get it back, as the real controllers do for objects made before the
//! admission plugin.
//!
//! As in Kubernetes 1.34, a pod counts as using a claim named in
//! `spec.volumes[].persistentVolumeClaim` once it is scheduled, whatever its phase, until it
//! is removed; a generic ephemeral volume's claim (`<pod>-<volume>`, controlled by the pod)
//! stops counting once the pod is shut down (deletionTimestamp with a zero grace period).

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::super::State;
use super::super::kinds::volume::{PV_PROTECTION, PVC_PROTECTION};
use super::super::meta::{self, meta_mut};
use super::super::resources::{self, ResId, ids};
use super::super::store::{Event, ObjKey, StoreError};
use super::super::strategy;
use super::{Reconciler, controller_of, run_loop};

pub(super) async fn run(state: Arc<State>, stop: CancellationToken) {
    run_loop(state, stop, Duration::from_secs(5), Protection).await;
}

struct Protection;

impl Reconciler for Protection {
    async fn resync(&mut self, state: &State) {
        sync(state);
    }

    async fn changed(&mut self, state: &State, events: Option<&[Arc<Event>]>) {
        let relevant = events.is_none_or(|events| {
            events.iter().any(|e| {
                e.res == *ids::PERSISTENT_VOLUME_CLAIMS
                    || e.res == *ids::PERSISTENT_VOLUMES
                    || e.res == *ids::PODS
            })
        });
        if relevant {
            sync(state);
        }
    }
}

fn has(obj: &Value, finalizer: &str) -> bool {
    meta::finalizers(obj).iter().any(|f| f == finalizer)
}

fn key_of(obj: &Value) -> ObjKey {
    ObjKey::new(
        meta::namespace(obj).unwrap_or_default(),
        meta::name(obj).unwrap_or_default(),
    )
}

fn sync(state: &State) {
    // Only what may need a change: live objects without their finalizer, deleting ones with it.
    let (claims, _, _) = state
        .store
        .list(*ids::PERSISTENT_VOLUME_CLAIMS, None, None, None, |e| {
            meta::deleting(&e.object) == has(&e.object, PVC_PROTECTION)
        });
    for claim in claims {
        let obj = &claim.object;
        let present = has(obj, PVC_PROTECTION);
        let want = !meta::deleting(obj) || (present && claim_in_use(state, obj));
        if want != present {
            set_finalizer(
                state,
                *ids::PERSISTENT_VOLUME_CLAIMS,
                &key_of(obj),
                PVC_PROTECTION,
                want,
            );
        }
    }
    let (volumes, _, _) = state
        .store
        .list(*ids::PERSISTENT_VOLUMES, None, None, None, |e| {
            meta::deleting(&e.object) == has(&e.object, PV_PROTECTION)
        });
    for volume in volumes {
        let obj = &volume.object;
        let present = has(obj, PV_PROTECTION);
        let bound = obj.pointer("/status/phase").and_then(Value::as_str) == Some("Bound");
        let want = !meta::deleting(obj) || (present && bound);
        if want != present {
            set_finalizer(
                state,
                *ids::PERSISTENT_VOLUMES,
                &key_of(obj),
                PV_PROTECTION,
                want,
            );
        }
    }
}

/// Whether a scheduled pod of the claim's namespace uses it (`podUsesPVC`).
fn claim_in_use(state: &State, claim: &Value) -> bool {
    let namespace = meta::namespace(claim).unwrap_or_default();
    let name = meta::name(claim).unwrap_or_default();
    let controller_uid = controller_of(claim).map(|(_, _, uid)| uid);
    let (users, _, _) = state
        .store
        .list(*ids::PODS, Some(namespace), None, None, |e| {
            pod_uses(&e.object, name, controller_uid)
        });
    !users.is_empty()
}

fn pod_uses(pod: &Value, claim: &str, claim_controller: Option<&str>) -> bool {
    // The kubelet sees pods only once scheduled, and refuses to start one whose claim is
    // being deleted: an unscheduled pod holds nothing.
    if pod
        .pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .is_none_or(str::is_empty)
    {
        return false;
    }
    let pod_name = meta::name(pod).unwrap_or_default();
    let pod_uid = meta::meta_str(pod, "uid");
    let shut_down = meta::deleting(pod)
        && pod
            .pointer("/metadata/deletionGracePeriodSeconds")
            .and_then(Value::as_i64)
            == Some(0);
    pod.pointer("/spec/volumes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .any(|v| {
            let named = v
                .pointer("/persistentVolumeClaim/claimName")
                .and_then(Value::as_str)
                == Some(claim);
            let ephemeral = v.get("ephemeral").is_some_and(|e| !e.is_null())
                && !shut_down
                && v.get("name")
                    .and_then(Value::as_str)
                    .is_some_and(|vol| format!("{pod_name}-{vol}") == claim)
                && claim_controller.is_some()
                && claim_controller == pod_uid;
            named || ephemeral
        })
}

/// Adds or removes a finalizer in one write; an object being deleted that loses its last
/// finalizer is removed at once, as the API server does on such an update.
fn set_finalizer(state: &State, res: ResId, key: &ObjKey, finalizer: &str, present: bool) {
    let rt = resources::get(res);
    for _ in 0..16 {
        let Some(current) = state.store.get(res, key) else {
            return;
        };
        let mut list = meta::finalizers(&current.object);
        if list.iter().any(|f| f == finalizer) == present {
            return;
        }
        if present {
            list.push(finalizer.to_owned());
        } else {
            list.retain(|f| f != finalizer);
        }
        let mut new = (*current.object).clone();
        let m = meta_mut(&mut new);
        if list.is_empty() {
            m.remove("finalizers");
        } else {
            m.insert("finalizers".into(), json!(list));
        }
        let written = if strategy::may_finish_deletion(rt, &new) {
            state.store.remove(res, key, Some(current.rv))
        } else {
            state.store.replace(res, key.clone(), new, Some(current.rv))
        };
        match written {
            Err(StoreError::Conflict) => continue,
            _ => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::pod_uses;
    use serde_json::json;

    #[test]
    fn only_scheduled_pods_hold_their_claims() {
        let pod = |node: Option<&str>| {
            json!({"metadata": {"name": "p", "uid": "u1"},
                "spec": {"nodeName": node, "volumes": [
                    {"name": "data", "persistentVolumeClaim": {"claimName": "c"}},
                    {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {}}}]},
                "status": {"phase": "Succeeded"}})
        };
        assert!(pod_uses(&pod(Some("n1")), "c", None));
        assert!(!pod_uses(&pod(None), "c", None));
        assert!(!pod_uses(&pod(Some("n1")), "other", None));
        // An ephemeral volume's claim counts only when the pod controls it.
        assert!(pod_uses(&pod(Some("n1")), "p-scratch", Some("u1")));
        assert!(!pod_uses(&pod(Some("n1")), "p-scratch", Some("u2")));
        let mut shut_down = pod(Some("n1"));
        shut_down["metadata"]["deletionTimestamp"] = json!("2020-01-01T00:00:00Z");
        shut_down["metadata"]["deletionGracePeriodSeconds"] = json!(0);
        assert!(!pod_uses(&shut_down, "p-scratch", Some("u1")));
        assert!(pod_uses(&shut_down, "c", None));
    }
}
