//! What the pod controller does for one pod, decided from the cached upper and lower pods: the
//! whole decision tree, so the controller only carries it out.

use k8s_openapi::api::core::v1::{Pod, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::deps::is_owned_by;
use crate::status::{LowerAbsent, deletion_from_below, on_lower_absent, upper_status};
use crate::translate::{NotOffloaded, TranslateConfig, offload_decision};
use crate::update::{PodUpdate, UpdateError, is_lower_pod_of, lower_pod_update};

/// The one step to take for a pod.
#[derive(Clone, Debug, PartialEq)]
pub enum PodStep {
    /// Nothing to do.
    Nothing,
    /// Delete the lower pod, with its UID as precondition and this grace period (`None`: the
    /// pod's own).
    DeleteLower {
        /// Grace period in seconds.
        grace: Option<i64>,
        /// The upper pod is being deleted and this carries it down (worth an event upstairs).
        upper_deleting: bool,
    },
    /// Finish the upper pod's deletion (grace 0, UID precondition): nothing is left below.
    FinishUpperDeletion,
    /// The pod is not offloaded: say why on the upper pod.
    NotOffloaded(NotOffloaded),
    /// Create the lower pod, after what it needs.
    Create,
    /// The lower pod vanished without our doing: the upper pod takes this (Failed) status.
    MarkLost(Box<PodStatus>),
    /// The upper pod is being deleted and its lower pod went before a terminal phase came up:
    /// the upper pod takes this (Failed) status, and the next look finishes the deletion.
    Terminate(Box<PodStatus>),
    /// The lower pod is being deleted downstairs: delete the upper pod too (its controller
    /// replaces it), with the lower grace period.
    DeleteUpper {
        /// Grace period in seconds (`None`: the pod's own).
        grace: Option<i64>,
    },
    /// A lower pod that is not ours holds the name: touch nothing, report it.
    Conflict,
    /// Bring the pods in step: patch the lower pod, add ephemeral containers, write the upper
    /// status; each part only when it is `Some`.
    Sync {
        /// What goes down.
        update: PodUpdate,
        /// What goes up.
        status: Option<Box<PodStatus>>,
    },
}

/// The step for the pod whose upper and lower versions (either may be absent) are given.
/// `gone_grace` is the grace period of the upper pod's last state when its deletion was seen
/// (a pod deleted with grace 0 vanishes at once); `lower_cluster` names the lower cluster in
/// statuses. An upper pod that cannot be translated is an error.
pub fn pod_step(
    upper: Option<&Pod>,
    lower: Option<&Pod>,
    cfg: &TranslateConfig,
    lower_cluster: &str,
    gone_grace: Option<i64>,
    now: &Time,
) -> Result<PodStep, UpdateError> {
    let owner = &cfg.owner;
    let Some(u) = upper else {
        // The upper pod is gone: its lower pod goes too (ours only, this exact one), with the
        // grace its last state had, or none when it vanished without one (a forced deletion,
        // or one while we were away), as the original.
        return Ok(match lower {
            Some(l)
                if is_owned_by(&l.metadata, owner) && l.metadata.deletion_timestamp.is_none() =>
            {
                PodStep::DeleteLower {
                    grace: Some(gone_grace.unwrap_or(0)),
                    upper_deleting: false,
                }
            }
            _ => PodStep::Nothing,
        });
    };
    if u.metadata.deletion_timestamp.is_some() {
        // As a kubelet: the containers stop below, their last status and the terminal phase
        // come up, and only a pod whose phase is terminal is let go.
        return Ok(match lower {
            Some(l) if is_lower_pod_of(l, u, owner) => {
                if l.metadata.deletion_timestamp.is_none() {
                    PodStep::DeleteLower {
                        grace: u.metadata.deletion_grace_period_seconds,
                        upper_deleting: true,
                    }
                } else {
                    match upper_status(u, l, now) {
                        Some(status) => PodStep::Sync {
                            update: PodUpdate::default(),
                            status: Some(Box::new(status)),
                        },
                        None => PodStep::Nothing,
                    }
                }
            }
            Some(_) => PodStep::Nothing,
            None => absent_step(u, lower_cluster, now),
        });
    }
    if let Err(why) = offload_decision(u) {
        return Ok(PodStep::NotOffloaded(why));
    }
    let Some(l) = lower else {
        return Ok(absent_step(u, lower_cluster, now));
    };
    if !is_lower_pod_of(l, u, owner) {
        // Ours but for an earlier upper pod of the same name: it goes, then ours is created.
        return Ok(if !is_owned_by(&l.metadata, owner) {
            PodStep::Conflict
        } else if l.metadata.deletion_timestamp.is_none() {
            PodStep::DeleteLower {
                grace: Some(0),
                upper_deleting: false,
            }
        } else {
            PodStep::Nothing
        });
    }
    if let Some(del) = deletion_from_below(u, l) {
        return Ok(PodStep::DeleteUpper {
            grace: del.grace_period_seconds,
        });
    }
    Ok(PodStep::Sync {
        update: lower_pod_update(u, l, cfg)?,
        status: upper_status(u, l, now).map(Box::new),
    })
}

/// The step for an upper pod whose lower pod is absent ([`on_lower_absent`]).
fn absent_step(upper: &Pod, lower_cluster: &str, now: &Time) -> PodStep {
    match on_lower_absent(upper, lower_cluster, now) {
        LowerAbsent::Create => PodStep::Create,
        LowerAbsent::Lost(status) => PodStep::MarkLost(status),
        LowerAbsent::FinishUpperDeletion => PodStep::FinishUpperDeletion,
        LowerAbsent::Terminate(status) => PodStep::Terminate(status),
        LowerAbsent::Nothing => PodStep::Nothing,
    }
}

/// The step for an upper pod whose lower pod has left the lower cache, when the lower pod's last
/// state is known to have been deleted through the API (`last`: its removal carried a deletion
/// timestamp). The upper pod is deleted as the lower one was, as when the marked lower pod is
/// seen before it goes (`pod_step`); `None` when that rule does not apply (the pod is already
/// being deleted or is finished upstairs, or `last` belongs to another upper pod), and
/// [`pod_step`] decides with the lower pod absent.
pub fn deleted_below_step(upper: &Pod, last: &Pod, owner: &str) -> Option<PodStep> {
    if !is_lower_pod_of(last, upper, owner) {
        return None;
    }
    deletion_from_below(upper, last).map(|del| PodStep::DeleteUpper {
        grace: del.grace_period_seconds,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::translate::lower_pod;
    use k8s_openapi::jiff::Timestamp;
    use serde_json::json;

    const OWNER: &str = "vk";

    fn cfg() -> TranslateConfig {
        TranslateConfig {
            owner: OWNER.into(),
            ignore_labels: Vec::new(),
            upper_api: None,
        }
    }

    fn now() -> Time {
        Time(Timestamp::UNIX_EPOCH)
    }

    fn upper_in(namespace: &str, uid: &str, status: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"namespace": namespace, "name": "web", "uid": uid},
            "spec": {"nodeName": "vk", "containers": [{"name": "c", "image": "nginx"}]},
            "status": status
        }))
        .unwrap()
    }

    fn upper() -> Pod {
        upper_in("default", "u1", json!({"phase": "Pending"}))
    }

    fn lower_of(u: &Pod) -> Pod {
        lower_pod(u, &cfg()).unwrap()
    }

    fn deleting(mut p: Pod, grace: i64) -> Pod {
        p.metadata.deletion_timestamp = Some(now());
        p.metadata.deletion_grace_period_seconds = Some(grace);
        p
    }

    fn step(u: Option<&Pod>, l: Option<&Pod>, gone: Option<i64>) -> PodStep {
        pod_step(u, l, &cfg(), "lower", gone, &now()).unwrap()
    }

    #[test]
    fn a_new_pod_is_created_and_an_existing_one_synced() {
        let u = upper();
        assert_eq!(step(Some(&u), None, None), PodStep::Create);
        let l = lower_of(&u);
        assert!(matches!(
            step(Some(&u), Some(&l), None),
            PodStep::Sync { .. }
        ));
        assert_eq!(step(None, None, None), PodStep::Nothing);
    }

    #[test]
    fn an_upper_pod_gone_takes_our_lower_pod_with_its_last_grace_or_none() {
        let u = upper();
        let l = lower_of(&u);
        let delete = |grace| PodStep::DeleteLower {
            grace: Some(grace),
            upper_deleting: false,
        };
        assert_eq!(step(None, Some(&l), Some(30)), delete(30));
        assert_eq!(step(None, Some(&l), None), delete(0));
        assert_eq!(
            step(None, Some(&deleting(l.clone(), 5)), None),
            PodStep::Nothing
        );
        let mut theirs = l;
        theirs.metadata.labels = None;
        assert_eq!(step(None, Some(&theirs), None), PodStep::Nothing);
    }

    #[test]
    fn an_upper_deletion_goes_down_with_its_grace_then_finishes_when_the_lower_pod_is_gone() {
        let u = upper();
        let l = lower_of(&u);
        let gone = deleting(u, 20);
        assert_eq!(
            step(Some(&gone), Some(&l), None),
            PodStep::DeleteLower {
                grace: Some(20),
                upper_deleting: true
            }
        );
        // While the lower pod stops, its status comes up, the terminal phase the lower kubelet
        // writes among it.
        let mut stopped = deleting(l, 20);
        stopped.status = Some(
            serde_json::from_value(json!({"phase": "Failed", "containerStatuses": [{
                "name": "c", "image": "nginx", "imageID": "", "ready": false, "restartCount": 0,
                "state": {"terminated": {"exitCode": 143, "reason": "Error"}}}]}))
            .unwrap(),
        );
        let PodStep::Sync { update, status } = step(Some(&gone), Some(&stopped), None) else {
            panic!("the stopping lower pod's status goes up")
        };
        assert!(update.is_noop(), "nothing goes down to a pod being deleted");
        let status = status.expect("a status");
        assert_eq!(status.phase.as_deref(), Some("Failed"));
        let exit = |s: &PodStatus| {
            s.container_statuses.as_ref().unwrap()[0]
                .state
                .as_ref()
                .unwrap()
                .terminated
                .as_ref()
                .map(|t| t.exit_code)
        };
        assert_eq!(exit(&status), Some(143));
        // Gone below with a terminal phase upstairs: the upper pod is let go.
        let mut failed = gone.clone();
        failed.status = Some(*status);
        assert_eq!(
            step(Some(&failed), None, None),
            PodStep::FinishUpperDeletion
        );
        // Gone below before a terminal phase came up: the upper pod is first made terminal, as
        // a kubelet's TerminatePod, its running container terminated as one not found.
        let mut running = gone;
        running.status = Some(
            serde_json::from_value(json!({"phase": "Running", "containerStatuses": [{
                "name": "c", "image": "nginx", "imageID": "", "ready": true, "restartCount": 0,
                "state": {"running": {}}}]}))
            .unwrap(),
        );
        let PodStep::Terminate(status) = step(Some(&running), None, None) else {
            panic!("a deleted pod is made terminal before it goes")
        };
        assert_eq!(status.phase.as_deref(), Some("Failed"));
        assert_eq!(exit(&status), Some(137));
        assert!(!status.container_statuses.as_ref().unwrap()[0].ready);
    }

    #[test]
    fn kube_system_pods_are_not_offloaded() {
        let u = upper_in("kube-system", "u1", json!({}));
        assert_eq!(
            step(Some(&u), None, None),
            PodStep::NotOffloaded(NotOffloaded::KubeSystem)
        );
    }

    #[test]
    fn a_stale_pod_of_ours_is_replaced_and_a_foreign_one_is_a_conflict() {
        let u = upper();
        let mut stale = lower_of(&upper_in("default", "old", json!({})));
        assert_eq!(
            step(Some(&u), Some(&stale), None),
            PodStep::DeleteLower {
                grace: Some(0),
                upper_deleting: false
            }
        );
        stale.metadata.labels = None;
        assert_eq!(step(Some(&u), Some(&stale), None), PodStep::Conflict);
    }

    #[test]
    fn a_lower_deletion_deletes_the_upper_pod_and_a_lost_pod_is_marked() {
        let u = upper();
        let l = deleting(lower_of(&u), 7);
        assert_eq!(
            step(Some(&u), Some(&l), None),
            PodStep::DeleteUpper { grace: Some(7) }
        );
        let offloaded = upper_in(
            "default",
            "u1",
            json!({"phase": "Running", "conditions": [
                {"type": crate::keys::CONDITION_OFFLOADED, "status": "True"}
            ]}),
        );
        let lost = step(Some(&offloaded), None, None);
        assert!(
            matches!(&lost, PodStep::MarkLost(s) if s.phase.as_deref() == Some("Failed")),
            "{lost:?}"
        );
    }

    #[test]
    fn a_lower_pod_deleted_through_the_api_deletes_its_upper_pod_even_when_only_its_removal_is_seen()
     {
        let u = upper();
        let marked = deleting(lower_of(&u), 0);
        assert_eq!(
            deleted_below_step(&u, &marked, OWNER),
            Some(PodStep::DeleteUpper { grace: Some(0) })
        );
        // Not marked: it was lost, not deleted (pod_step fails the upper pod instead).
        assert_eq!(deleted_below_step(&u, &lower_of(&u), OWNER), None);
        // The upper pod already going: its own deletion finishes (pod_step).
        assert_eq!(
            deleted_below_step(&deleting(u.clone(), 30), &marked, OWNER),
            None
        );
        // The lower pod of an earlier upper pod of the same name says nothing of this one.
        let other = upper_in("default", "u2", json!({"phase": "Pending"}));
        assert_eq!(deleted_below_step(&other, &marked, OWNER), None);
        // Another owner's pod never steers ours.
        assert_eq!(deleted_below_step(&u, &marked, "someone-else"), None);
    }
}
