//! Lower pod -> upper pod: what the upper pod's status becomes, and what happens upstairs when
//! the lower pod is being deleted or is gone. Unlike the original, a lower pod removed without
//! grace fails the upper pod, and a restart reconciles the statuses (`docs/differences.md`).
//!
//! Everything here is a function of the current objects, not of the events that led to them,
//! so the same decision comes out after a restart as during normal operation.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateTerminated, ContainerStatus, Pod, PodCondition, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::keys::{CONDITION_OFFLOADED, REASON_LOWER_POD_LOST, REASON_OFFLOADED};

/// Phase of a pod that ended successfully.
pub const PHASE_SUCCEEDED: &str = "Succeeded";
/// Phase of a pod that ended in failure.
pub const PHASE_FAILED: &str = "Failed";

/// Whether a pod has reached a terminal phase; such an upper pod is no longer synced (the API
/// server refuses moving it back, and its controller has already reacted).
pub fn is_terminal(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some(PHASE_SUCCEEDED | PHASE_FAILED)
    )
}

/// Whether writing `status` upstairs may wait a moment for a newer one. A pod still Pending
/// downstairs (just scheduled, its containers being created) usually gets its next status
/// right away, and only the last one needs writing: under a burst that saves one upper write
/// per pod. Running and finished pods, the ones users and controllers wait for, are written at
/// once.
pub fn may_coalesce(status: &PodStatus) -> bool {
    status.phase.as_deref() == Some("Pending")
}

/// The status the upper pod should have given its lower pod, or `None` when it already has it
/// (no write) or is terminal.
///
/// The lower status is taken verbatim (phase, conditions including the lower scheduler's
/// `PodScheduled=False/Unschedulable`, pod and host IPs, container statuses, start time),
/// except: `qosClass` stays the upper one (immutable upstairs), `nominatedNodeName` names a
/// lower node and is dropped, conditions the upper cluster set and the lower pod does not have
/// (readiness gates, `DisruptionTarget`) are kept, and our [`CONDITION_OFFLOADED`] is added.
pub fn upper_status(upper: &Pod, lower: &Pod, now: &Time) -> Option<PodStatus> {
    if is_terminal(upper) {
        return None;
    }
    let current = upper.status.clone().unwrap_or_default();
    let mut status = match &lower.status {
        Some(s) => s.clone(),
        None => current.clone(),
    };
    status.qos_class.clone_from(&current.qos_class);
    status.nominated_node_name = None;

    let mut conditions = status.conditions.take().unwrap_or_default();
    // Readiness-gate conditions are set upstairs (the lower pod has copies of them, perhaps
    // older ones): the upper pod keeps its own.
    let gates = crate::update::readiness_gate_types(upper);
    conditions.retain(|c| !gates.contains(c.type_.as_str()));
    let lower_types: BTreeSet<String> = conditions.iter().map(|c| c.type_.clone()).collect();
    conditions.extend(
        current
            .conditions
            .iter()
            .flatten()
            .filter(|c| !lower_types.contains(&c.type_) && c.type_ != CONDITION_OFFLOADED)
            .cloned(),
    );
    let message = format!(
        "created in the lower cluster as pod {}/{} (uid {})",
        lower.metadata.namespace.as_deref().unwrap_or_default(),
        lower.metadata.name.as_deref().unwrap_or_default(),
        lower.metadata.uid.as_deref().unwrap_or("unknown"),
    );
    conditions.push(condition(&current, "True", REASON_OFFLOADED, message, now));
    status.conditions = Some(conditions);

    (status != current).then_some(status)
}

/// The upper pod's conditions with our [`CONDITION_OFFLOADED`] set to False for `reason`
/// (the pod is not, or not yet, in the lower cluster), or `None` when it already says exactly
/// that (no write). The other conditions are kept as they are.
pub fn not_offloaded_conditions(
    upper: &Pod,
    reason: &str,
    message: &str,
    now: &Time,
) -> Option<Vec<PodCondition>> {
    let current = upper.status.clone().unwrap_or_default();
    let unchanged = current.conditions.iter().flatten().any(|c| {
        c.type_ == CONDITION_OFFLOADED
            && c.status == "False"
            && c.reason.as_deref() == Some(reason)
            && c.message.as_deref() == Some(message)
    });
    if unchanged {
        return None;
    }
    let mut conditions: Vec<PodCondition> = current
        .conditions
        .iter()
        .flatten()
        .filter(|c| c.type_ != CONDITION_OFFLOADED)
        .cloned()
        .collect();
    conditions.push(condition(
        &current,
        "False",
        reason,
        message.to_owned(),
        now,
    ));
    Some(conditions)
}

/// The upper pod's conditions with `Ready` False because its lower cluster does not answer
/// (`message` says which and why), as Kubernetes' node lifecycle controller marks the pods of
/// an unreachable node: Services stop sending it traffic, nothing is evicted or deleted.
/// `None` when it already says so, or the pod is terminal or has no status yet.
pub fn unreachable_conditions(upper: &Pod, message: &str, now: &Time) -> Option<Vec<PodCondition>> {
    if is_terminal(upper) {
        return None;
    }
    let current = upper
        .status
        .as_ref()?
        .conditions
        .clone()
        .unwrap_or_default();
    let ready = current.iter().find(|c| c.type_ == "Ready");
    if ready.is_some_and(|c| {
        c.status == "False"
            && c.reason.as_deref() == Some(crate::reach::REASON_UNREACHABLE)
            && c.message.as_deref() == Some(message)
    }) {
        return None;
    }
    let last_transition_time = match ready {
        Some(c) if c.status == "False" => c.last_transition_time.clone(),
        _ => Some(now.clone()),
    };
    let mut conditions: Vec<PodCondition> = current
        .iter()
        .filter(|c| c.type_ != "Ready")
        .cloned()
        .collect();
    conditions.push(PodCondition {
        type_: "Ready".to_owned(),
        status: "False".to_owned(),
        reason: Some(crate::reach::REASON_UNREACHABLE.to_owned()),
        message: Some(message.to_owned()),
        last_transition_time,
        ..PodCondition::default()
    });
    Some(conditions)
}

/// Our condition, keeping its transition time when its status did not change.
fn condition(
    current: &PodStatus,
    status: &str,
    reason: &str,
    message: String,
    now: &Time,
) -> PodCondition {
    let previous = current
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == CONDITION_OFFLOADED);
    let last_transition_time = match previous {
        Some(p) if p.status == status => p.last_transition_time.clone(),
        _ => Some(now.clone()),
    };
    PodCondition {
        type_: CONDITION_OFFLOADED.to_owned(),
        status: status.to_owned(),
        reason: Some(reason.to_owned()),
        message: Some(message),
        last_transition_time,
        ..PodCondition::default()
    }
}

/// Whether the upper pod records that its lower pod was created (see [`CONDITION_OFFLOADED`]).
pub fn was_offloaded(upper: &Pod) -> bool {
    upper
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| {
            c.iter()
                .any(|c| c.type_ == CONDITION_OFFLOADED && c.status == "True")
        })
}

/// The upper pod is to be deleted because its lower pod is being deleted by someone in the
/// lower cluster (a drain, an eviction, `kubectl delete` downstairs), so its controller
/// upstairs replaces it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeleteUpper {
    /// The lower pod's grace period; `None` leaves the pod's own default.
    pub grace_period_seconds: Option<i64>,
}

/// Whether the lower pod's deletion must be carried upstairs: the lower pod is being deleted,
/// the upper pod is neither deleting nor terminal.
pub fn deletion_from_below(upper: &Pod, lower: &Pod) -> Option<DeleteUpper> {
    let lower_deleting = lower.metadata.deletion_timestamp.is_some();
    let upper_deleting = upper.metadata.deletion_timestamp.is_some();
    (lower_deleting && !upper_deleting && !is_terminal(upper)).then_some(DeleteUpper {
        grace_period_seconds: lower.metadata.deletion_grace_period_seconds,
    })
}

/// What to do when an upper pod bound to the virtual node has no lower pod (the lower cache
/// has synced and does not hold it).
#[derive(Clone, Debug, PartialEq)]
pub enum LowerAbsent {
    /// Never created (or the create has not landed yet): create it.
    Create,
    /// The upper pod is being deleted, the lower pod is gone and the upper phase is terminal:
    /// finish the upper deletion (grace 0, UID precondition).
    FinishUpperDeletion,
    /// The upper pod is being deleted and the lower pod went before a terminal phase came up:
    /// the upper pod takes this (Failed) status first, see [`terminated_status`].
    Terminate(Box<PodStatus>),
    /// The lower pod existed and vanished without a deletion from upstairs: the upper pod
    /// becomes Failed with this status, so its controller replaces it.
    Lost(Box<PodStatus>),
    /// The upper pod is terminal: nothing to do.
    Nothing,
}

/// The decision for an upper pod whose lower pod is absent.
pub fn on_lower_absent(upper: &Pod, lower_cluster: &str, now: &Time) -> LowerAbsent {
    if upper.metadata.deletion_timestamp.is_some() {
        if is_terminal(upper) {
            LowerAbsent::FinishUpperDeletion
        } else {
            LowerAbsent::Terminate(Box::new(terminated_status(upper, now)))
        }
    } else if is_terminal(upper) {
        LowerAbsent::Nothing
    } else if was_offloaded(upper) {
        LowerAbsent::Lost(Box::new(lost_status(upper, lower_cluster, now)))
    } else {
        LowerAbsent::Create
    }
}

/// The status of an upper pod whose lower pod vanished: Failed, not ready, every unfinished
/// container terminated as the kubelet reports containers it cannot find.
pub fn lost_status(upper: &Pod, lower_cluster: &str, now: &Time) -> PodStatus {
    let message = format!(
        "the pod disappeared from lower cluster {lower_cluster} without being deleted from the upper cluster"
    );
    let mut status = terminated_status(upper, now);
    status.reason = Some(REASON_LOWER_POD_LOST.to_owned());
    status.message = Some(message.clone());
    let mut conditions: Vec<PodCondition> = status
        .conditions
        .take()
        .unwrap_or_default()
        .into_iter()
        .filter(|c| c.type_ != CONDITION_OFFLOADED)
        .collect();
    conditions.push(condition(
        &PodStatus::default(),
        "False",
        REASON_LOWER_POD_LOST,
        message,
        now,
    ));
    status.conditions = Some(conditions);
    status
}

/// The status of an upper pod being deleted whose lower pod is gone, when its last status was
/// not terminal: what a kubelet writes before it lets a deleted pod go (its status manager's
/// `TerminatePod`): phase Failed, not ready, every unfinished container terminated as one it
/// cannot find. Controllers wait for that phase: a Job with a pod failure policy keeps its
/// finalizer on a deleted pod until the pod is Succeeded or Failed.
pub fn terminated_status(upper: &Pod, now: &Time) -> PodStatus {
    let mut status = upper.status.clone().unwrap_or_default();
    status.phase = Some(PHASE_FAILED.to_owned());
    for c in status.conditions.iter_mut().flatten() {
        if matches!(c.type_.as_str(), "Ready" | "ContainersReady") && c.status != "False" {
            c.status = "False".to_owned();
            c.reason = Some("PodFailed".to_owned());
            c.last_transition_time = Some(now.clone());
        }
    }
    for statuses in [
        &mut status.container_statuses,
        &mut status.init_container_statuses,
        &mut status.ephemeral_container_statuses,
    ] {
        for cs in statuses.iter_mut().flatten() {
            terminate_unknown(cs, now);
        }
    }
    status
}

fn terminate_unknown(cs: &mut ContainerStatus, now: &Time) {
    if cs.state.as_ref().is_some_and(|s| s.terminated.is_some()) {
        return;
    }
    cs.last_state = cs.state.take();
    cs.state = Some(ContainerState {
        terminated: Some(ContainerStateTerminated {
            exit_code: 137,
            reason: Some("ContainerStatusUnknown".to_owned()),
            message: Some(
                "The container could not be located when the pod was terminated".to_owned(),
            ),
            finished_at: Some(now.clone()),
            ..ContainerStateTerminated::default()
        }),
        ..ContainerState::default()
    });
    cs.ready = false;
    cs.started = Some(false);
}

/// The `status` and `message` the upper pod shows while its lower pod cannot be created, as the
/// virtual-kubelet library set them: `kubectl get pod` shows `ProviderFailed` in its STATUS
/// column, and `describe` the error. The lower pod's status, once there is one, replaces them
/// ([`status_merge_patch`]).
pub fn provider_failed_patch(conditions: &[PodCondition], message: &str) -> serde_json::Value {
    serde_json::json!({"status": {
        "conditions": conditions,
        "reason": crate::keys::REASON_PROVIDER_FAILED,
        "message": message,
    }})
}

/// The merge patch that makes the upper pod's status `status`: a `reason` or `message` the
/// upper pod has and `status` has not is removed (a merge patch leaves out what it does not
/// name, so `ProviderFailed` would outlive the failure and every sync would write again).
pub fn status_merge_patch(upper: &Pod, status: &PodStatus) -> serde_json::Value {
    let mut patch = serde_json::json!({ "status": status });
    let current = upper.status.as_ref();
    for (field, now, before) in [
        (
            "reason",
            &status.reason,
            current.and_then(|c| c.reason.as_ref()),
        ),
        (
            "message",
            &status.message,
            current.and_then(|c| c.message.as_ref()),
        ),
    ] {
        if now.is_none() && before.is_some() {
            patch["status"][field] = serde_json::Value::Null;
        }
    }
    patch
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn provider_failed_shows_in_the_status_until_the_lower_status_replaces_it() {
        let failing = provider_failed_patch(&[], "secret default/s not found");
        assert_eq!(failing["status"]["reason"], "ProviderFailed");
        assert_eq!(failing["status"]["message"], "secret default/s not found");
        let upper: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "status": {"phase": "Pending", "reason": "ProviderFailed", "message": "m"}
        }))
        .unwrap();
        let running = PodStatus {
            phase: Some("Running".into()),
            ..PodStatus::default()
        };
        let patch = status_merge_patch(&upper, &running);
        assert_eq!(patch["status"]["phase"], "Running");
        assert!(patch["status"]["reason"].is_null() && patch["status"].get("reason").is_some());
        assert!(
            patch["status"]
                .get("message")
                .is_some_and(serde_json::Value::is_null)
        );
        // Nothing to remove: nothing named beyond the status.
        let patch = status_merge_patch(&Pod::default(), &running);
        assert_eq!(patch, serde_json::json!({"status": {"phase": "Running"}}));
    }
    use crate::translate::tests::{bound_pod, pod};
    use crate::translate::{TranslateConfig, lower_pod};
    use pretty_assertions::assert_eq;
    use serde_json::json;

    fn now() -> Time {
        Time("2026-11-22T10:05:00Z".parse().unwrap())
    }

    #[test]
    fn not_offloaded_replaces_only_our_condition_keeps_its_transition_time_and_repeats_nothing() {
        let mut upper = bound_pod();
        upper.status = Some(
            serde_json::from_value(json!({"conditions": [
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-11-22T10:00:00Z"},
                {"type": CONDITION_OFFLOADED, "status": "False", "reason": "ProviderFailed",
                 "message": "secret default/a not found", "lastTransitionTime": "2026-11-22T10:01:00Z"}
            ]}))
            .unwrap(),
        );
        assert_eq!(
            not_offloaded_conditions(
                &upper,
                "ProviderFailed",
                "secret default/a not found",
                &now()
            ),
            None,
            "already says so: no write"
        );
        let next = not_offloaded_conditions(
            &upper,
            "ProviderFailed",
            "secret default/b not found",
            &now(),
        )
        .unwrap();
        assert_eq!(next.len(), 2);
        assert_eq!(next[0].type_, "PodScheduled");
        let ours = &next[1];
        assert_eq!(ours.message.as_deref(), Some("secret default/b not found"));
        assert_eq!(
            ours.last_transition_time,
            Some(Time("2026-11-22T10:01:00Z".parse().unwrap())),
            "still False: the transition time stays"
        );
        let fresh =
            not_offloaded_conditions(&bound_pod(), "NotOffloaded", "kube-system", &now()).unwrap();
        assert_eq!(fresh[0].last_transition_time, Some(now()));
    }

    /// The lower pod Running on a lower node, as the lower API server reports it.
    fn running_lower(upper: &Pod) -> Pod {
        let mut lower = lower_pod(upper, &TranslateConfig::new("vk-1")).unwrap();
        lower.metadata.uid = Some("uid-lower-1".into());
        lower.status = Some(
            serde_json::from_value(json!({
                "phase": "Running",
                "podIP": "10.8.1.7", "podIPs": [{"ip": "10.8.1.7"}],
                "hostIP": "192.168.10.3", "hostIPs": [{"ip": "192.168.10.3"}],
                "startTime": "2026-11-22T10:00:02Z",
                "qosClass": "BestEffort",
                "nominatedNodeName": "lower-node-9",
                "conditions": [
                    {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-11-22T10:00:01Z"},
                    {"type": "Ready", "status": "True", "lastTransitionTime": "2026-11-22T10:00:04Z"}
                ],
                "containerStatuses": [{"name": "web", "image": "nginx:1.27", "imageID": "sha256:aa",
                    "containerID": "containerd://c1", "ready": true, "restartCount": 2, "started": true,
                    "state": {"running": {"startedAt": "2026-11-22T10:00:03Z"}}}]
            }))
            .unwrap(),
        );
        lower
    }

    fn status(p: &Pod) -> &PodStatus {
        p.status.as_ref().unwrap()
    }

    fn cond<'a>(s: &'a PodStatus, t: &str) -> Option<&'a PodCondition> {
        s.conditions.iter().flatten().find(|c| c.type_ == t)
    }

    #[test]
    fn checklist_49_lower_status_appears_verbatim_upstairs() {
        let upper = bound_pod();
        let lower = running_lower(&upper);
        let s = upper_status(&upper, &lower, &now()).unwrap();
        let l = status(&lower);
        assert_eq!(s.phase.as_deref(), Some("Running"));
        assert_eq!((&s.pod_ip, &s.pod_ips), (&l.pod_ip, &l.pod_ips));
        assert_eq!((&s.host_ip, &s.host_ips), (&l.host_ip, &l.host_ips));
        assert_eq!(s.container_statuses, l.container_statuses);
        assert_eq!(s.start_time, l.start_time);
        assert_eq!(cond(&s, "Ready"), cond(l, "Ready"));
        assert_eq!(
            s.nominated_node_name, None,
            "a lower node name means nothing upstairs"
        );
        let ours = cond(&s, CONDITION_OFFLOADED).unwrap();
        assert_eq!(ours.status, "True");
        assert!(
            ours.message
                .as_deref()
                .unwrap()
                .contains("shop/web-7d4b9c-x2x9z")
        );
    }

    #[test]
    fn checklist_50_lower_unschedulable_condition_appears_upstairs() {
        let upper = bound_pod();
        let mut lower = running_lower(&upper);
        lower.status = Some(
            serde_json::from_value(json!({"phase": "Pending", "conditions": [
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                 "message": "0/3 nodes are available: 3 Insufficient cpu."}]}))
            .unwrap(),
        );
        let s = upper_status(&upper, &lower, &now()).unwrap();
        let scheduled = cond(&s, "PodScheduled").unwrap();
        assert_eq!(
            (scheduled.status.as_str(), scheduled.reason.as_deref()),
            ("False", Some("Unschedulable"))
        );
    }

    #[test]
    fn unchanged_status_means_no_write() {
        let upper = bound_pod();
        let lower = running_lower(&upper);
        let mut synced = upper.clone();
        synced.status = upper_status(&upper, &lower, &now());
        let later = Time("2026-11-22T11:00:00Z".parse().unwrap());
        assert_eq!(upper_status(&synced, &lower, &later), None);
    }

    #[test]
    fn upper_only_conditions_and_qos_class_are_kept() {
        let mut upper = bound_pod();
        upper.status = Some(
            serde_json::from_value(json!({"phase": "Pending", "qosClass": "Burstable",
                "conditions": [{"type": "example.com/lb-ready", "status": "True"}]}))
            .unwrap(),
        );
        let s = upper_status(&upper, &running_lower(&upper), &now()).unwrap();
        assert_eq!(s.qos_class.as_deref(), Some("Burstable"));
        assert!(cond(&s, "example.com/lb-ready").is_some());
    }

    #[test]
    fn checklist_51_status_sync_leaves_upper_labels_alone() {
        // The status is a separate value: an upper pod keeps all its labels, including the
        // ignore-labels that the lower pod does not carry (the original had to restore them
        // because it wrote the whole lower object upstairs).
        let upper = bound_pod();
        let lower = running_lower(&upper);
        assert!(
            !lower
                .metadata
                .labels
                .as_ref()
                .unwrap()
                .contains_key("pod-group.scheduling.sigs.k8s.io")
        );
        let mut synced = upper.clone();
        synced.status = upper_status(&upper, &lower, &now());
        assert_eq!(synced.metadata, upper.metadata);
    }

    #[test]
    fn checklist_52_graceful_deletion_downstairs_deletes_the_upper_pod() {
        let upper = bound_pod();
        let mut lower = running_lower(&upper);
        assert_eq!(deletion_from_below(&upper, &lower), None);
        lower.metadata.deletion_timestamp = Some(now());
        lower.metadata.deletion_grace_period_seconds = Some(30);
        assert_eq!(
            deletion_from_below(&upper, &lower),
            Some(DeleteUpper {
                grace_period_seconds: Some(30)
            })
        );
        let mut deleting = upper.clone();
        deleting.metadata.deletion_timestamp = Some(now());
        assert_eq!(
            deletion_from_below(&deleting, &lower),
            None,
            "already going away"
        );
    }

    #[test]
    fn checklist_53_terminal_lower_phase_goes_up_then_the_pod_is_no_longer_synced() {
        let upper = bound_pod();
        let mut lower = running_lower(&upper);
        lower.status.as_mut().unwrap().phase = Some("Failed".into());
        lower.status.as_mut().unwrap().reason = Some("Evicted".into());
        let s = upper_status(&upper, &lower, &now()).unwrap();
        assert_eq!(
            (s.phase.as_deref(), s.reason.as_deref()),
            (Some("Failed"), Some("Evicted"))
        );
        let mut finished = upper.clone();
        finished.status = Some(s);
        lower.status.as_mut().unwrap().phase = Some("Running".into());
        assert_eq!(upper_status(&finished, &lower, &now()), None);
        assert_eq!(
            on_lower_absent(&finished, "lower-1", &now()),
            LowerAbsent::Nothing
        );
        let mut succeeded = bound_pod();
        succeeded.status.as_mut().unwrap().phase = Some("Succeeded".into());
        assert!(is_terminal(&succeeded));
    }

    #[test]
    fn checklist_54_fix_a_lower_pod_removed_without_grace_fails_the_upper_pod() {
        let upper = bound_pod();
        let lower = running_lower(&upper);
        let mut synced = upper.clone();
        synced.status = upper_status(&upper, &lower, &now());
        let LowerAbsent::Lost(s) = on_lower_absent(&synced, "lower-1", &now()) else {
            panic!("expected Lost");
        };
        assert_eq!(s.phase.as_deref(), Some("Failed"));
        assert_eq!(s.reason.as_deref(), Some(REASON_LOWER_POD_LOST));
        assert!(s.message.as_deref().unwrap().contains("lower-1"));
        assert_eq!(cond(&s, "Ready").unwrap().status, "False");
        let ours = cond(&s, CONDITION_OFFLOADED).unwrap();
        assert_eq!(
            (ours.status.as_str(), ours.reason.as_deref()),
            ("False", Some(REASON_LOWER_POD_LOST))
        );
        let terminated = s.container_statuses.as_ref().unwrap()[0]
            .state
            .as_ref()
            .unwrap()
            .terminated
            .as_ref()
            .unwrap();
        assert_eq!(
            (terminated.exit_code, terminated.reason.as_deref()),
            (137, Some("ContainerStatusUnknown"))
        );
    }

    #[test]
    fn a_lost_pods_running_ephemeral_container_is_terminated_too() {
        let upper = bound_pod();
        let mut lower = running_lower(&upper);
        let running = lower.status.as_ref().unwrap().container_statuses.clone();
        lower.status.as_mut().unwrap().ephemeral_container_statuses = running;
        let mut synced = upper.clone();
        synced.status = upper_status(&upper, &lower, &now());
        assert!(
            synced
                .status
                .as_ref()
                .unwrap()
                .ephemeral_container_statuses
                .is_some(),
            "mirrored up with the rest of the status"
        );
        let LowerAbsent::Lost(s) = on_lower_absent(&synced, "lower-1", &now()) else {
            panic!("expected Lost");
        };
        let state = s.ephemeral_container_statuses.as_ref().unwrap()[0]
            .state
            .clone()
            .unwrap();
        assert!(state.running.is_none());
        assert_eq!(
            state.terminated.unwrap().reason.as_deref(),
            Some("ContainerStatusUnknown")
        );
    }

    #[test]
    fn checklist_55_fix_after_a_restart_the_upper_status_is_reconciled_with_the_lower_one() {
        // A stale upper status (the process was down while the lower pod started) is compared
        // with the current lower pod, not with events: the decision is the same as live.
        let upper = bound_pod();
        let mut stale = upper.clone();
        let mut pending = running_lower(&upper);
        pending.status.as_mut().unwrap().phase = Some("Pending".into());
        stale.status = upper_status(&upper, &pending, &now());
        let s = upper_status(&stale, &running_lower(&upper), &now()).unwrap();
        assert_eq!(s.phase.as_deref(), Some("Running"));
    }

    #[test]
    fn absent_lower_pod_is_created_when_never_offloaded_and_deletion_finished_when_deleting() {
        let upper = bound_pod();
        assert_eq!(
            on_lower_absent(&upper, "lower-1", &now()),
            LowerAbsent::Create
        );
        let mut deleting = upper.clone();
        deleting.metadata.deletion_timestamp = Some(now());
        let LowerAbsent::Terminate(s) = on_lower_absent(&deleting, "lower-1", &now()) else {
            panic!("a deleted pod without a terminal phase is made terminal first")
        };
        assert_eq!(s.phase.as_deref(), Some("Failed"));
        deleting.status = Some(*s);
        assert_eq!(
            on_lower_absent(&deleting, "lower-1", &now()),
            LowerAbsent::FinishUpperDeletion
        );
    }

    #[test]
    fn lower_pod_without_status_yet_only_adds_our_condition() {
        let upper = bound_pod();
        let mut lower = running_lower(&upper);
        lower.status = None;
        let s = upper_status(&upper, &lower, &now()).unwrap();
        assert_eq!(s.phase.as_deref(), Some("Pending"));
        assert!(was_offloaded(&pod(json!({"status": s}))));
    }
    #[test]
    fn only_pending_statuses_may_wait_for_a_newer_one() {
        let with = |phase: &str| PodStatus {
            phase: Some(phase.into()),
            ..PodStatus::default()
        };
        assert!(may_coalesce(&with("Pending")));
        for phase in ["Running", "Succeeded", "Failed", "Unknown"] {
            assert!(!may_coalesce(&with(phase)), "{phase}");
        }
        assert!(!may_coalesce(&PodStatus::default()));
    }

    #[test]
    fn an_unreachable_lower_cluster_makes_the_pod_not_ready_once_and_keeps_the_rest() {
        let now = Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "status": {"phase": "Running", "conditions": [
                {"type": "Ready", "status": "True"},
                {"type": "ContainersReady", "status": "True"}
            ]}
        }))
        .unwrap();
        let conditions =
            unreachable_conditions(&pod, "lower cluster x unreachable: refused", &now).unwrap();
        let ready = conditions.iter().find(|c| c.type_ == "Ready").unwrap();
        assert_eq!(ready.status, "False");
        assert_eq!(ready.reason.as_deref(), Some("LowerClusterUnreachable"));
        assert_eq!(ready.last_transition_time, Some(now.clone()));
        assert!(
            conditions
                .iter()
                .any(|c| c.type_ == "ContainersReady" && c.status == "True")
        );
        let mut marked = pod.clone();
        marked.status.as_mut().unwrap().conditions = Some(conditions);
        assert_eq!(
            unreachable_conditions(&marked, "lower cluster x unreachable: refused", &now),
            None
        );
        let mut done = pod;
        done.status.as_mut().unwrap().phase = Some("Succeeded".into());
        assert_eq!(unreachable_conditions(&done, "m", &now), None);
    }
}
