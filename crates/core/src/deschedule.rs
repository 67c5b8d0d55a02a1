//! The descheduler's rules (see `docs/placement.md`) as functions of values: when a pod on a
//! virtual node counts as stuck, which pods may be moved and how, and the replacement pod.
//!
//! A pod is moved one of two ways:
//! - through its controller (ReplicaSet, StatefulSet, Job, ...): the pod is marked
//!   `unschedulable-node=<node>` and deleted; the controller creates its replacement, and the
//!   webhook, which saw the mark, keeps the replacement off that node. Re-creating such a pod
//!   ourselves would race its controller (a ReplicaSet deletes the surplus pod, often ours; a
//!   StatefulSet re-creates the same name first), so the controller does it.
//! - re-created by the descheduler: only pods without a controller that opt in with
//!   `descheduler.alpha.kubernetes.io/evict`; nobody else would ever re-create them.
//!
//! Every move is first written down as a [`Move`] (an intent, kept by the descheduler in a
//! ConfigMap), then carried out step by step by [`move_step`] from what the caches show, so a
//! step that fails (a refused create, a restart between the delete and the create) is done again
//! until the move is complete. The intent is also how attempts are counted for every pod: a
//! re-created pod carries `sigs.k8s.io/deschedule-count` itself, and for a controller's pod the
//! intent hands the count over to the controller's next new pod (its replacement).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::{SignedDuration, Timestamp};

use crate::inject::{exclude_nodes, excluded_nodes};
use crate::keys::{
    ANNOTATION_CONFIG_MIRROR, ANNOTATION_CONFIG_SOURCE, ANNOTATION_DESCHEDULE_COUNT,
    ANNOTATION_DESCHEDULER_EVICT, LABEL_CREATE_BY_DESCHEDULER, VALUE_TRUE,
};
use serde::{Deserialize, Serialize};

/// Priority from which a pod is critical (`system-cluster-critical` and above).
pub const CRITICAL_PRIORITY: i32 = 2_000_000_000;

/// When pods count as stuck and which may move.
#[derive(Clone, Debug)]
pub struct Policy {
    /// How long a pod may be Unschedulable in its lower cluster before it moves.
    pub unschedulable_for: SignedDuration,
    /// The original's `PodLifeTime` rule: a pod Pending longer than this moves (off when
    /// `None`).
    pub max_pending_age: Option<SignedDuration>,
    /// Pods with `emptyDir` or `hostPath` volumes may move (their data is lost).
    pub evict_local_storage: bool,
    /// Moves of one pod (or workload) after which the descheduler gives up.
    pub max_attempts: u32,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            unschedulable_for: SignedDuration::from_secs(30),
            max_pending_age: None,
            evict_local_storage: false,
            max_attempts: 3,
        }
    }
}

/// Why a pod is due to move.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Trigger {
    /// The lower scheduler cannot place it (its `PodScheduled` reason), with its message.
    Unschedulable {
        /// `Unschedulable` or `SchedulerError`.
        reason: String,
        /// The lower scheduler's message.
        message: String,
    },
    /// Pending longer than the policy's maximum age.
    TooOld,
}

impl std::fmt::Display for Trigger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Unschedulable { reason, message } => write!(f, "{reason}: {message}"),
            Self::TooOld => f.write_str("Pending longer than the maximum pod life time"),
        }
    }
}

/// When the pod, bound to a virtual node, becomes due to move and why; `None` when no rule
/// applies (running, finished, being deleted, not bound).
pub fn due(pod: &Pod, policy: &Policy) -> Option<(Timestamp, Trigger)> {
    let spec = pod.spec.as_ref()?;
    if spec.node_name.as_deref().is_none_or(str::is_empty)
        || pod.metadata.deletion_timestamp.is_some()
    {
        return None;
    }
    let status = pod.status.as_ref();
    if !matches!(
        status.and_then(|s| s.phase.as_deref()),
        None | Some("Pending")
    ) {
        return None;
    }
    let created = pod.metadata.creation_timestamp.as_ref().map(|t| t.0);
    let unschedulable = status
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .find(|c| {
            c.type_ == "PodScheduled"
                && c.status != "True"
                && matches!(
                    c.reason.as_deref(),
                    Some("Unschedulable" | "SchedulerError")
                )
        })
        .map(|c| {
            let since = c
                .last_transition_time
                .as_ref()
                .map(|t| t.0)
                .or(created)
                .unwrap_or(Timestamp::UNIX_EPOCH);
            (
                since
                    .saturating_add(policy.unschedulable_for)
                    .unwrap_or(since),
                Trigger::Unschedulable {
                    reason: c.reason.clone().unwrap_or_default(),
                    message: c.message.clone().unwrap_or_default(),
                },
            )
        });
    let too_old = policy.max_pending_age.zip(created).map(|(age, created)| {
        (
            created.saturating_add(age).unwrap_or(created),
            Trigger::TooOld,
        )
    });
    match (unschedulable, too_old) {
        (Some(a), Some(b)) => Some(if b.0 < a.0 { b } else { a }),
        (a, b) => a.or(b),
    }
}

/// How a pod moves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Handling {
    /// Its controller (this UID) re-creates it after the deletion.
    ThroughOwner(String),
    /// The descheduler re-creates it under the same name.
    Recreate,
}

/// Why a pod never moves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Keep {
    /// Nobody would re-create it, and it did not opt in.
    NoController,
    /// A DaemonSet pod belongs on its node.
    DaemonSet,
    /// A static or mirror pod.
    Static,
    /// Priority at or above `system-cluster-critical`.
    Critical,
    /// `emptyDir` or `hostPath` data would be lost.
    LocalStorage,
}

impl std::fmt::Display for Keep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::NoController => {
                "it has no controller to re-create it (annotate it descheduler.alpha.kubernetes.io/evict to let the descheduler re-create it)"
            }
            Self::DaemonSet => "it belongs to a DaemonSet",
            Self::Static => "it is a static or mirror pod",
            Self::Critical => "it is a critical pod",
            Self::LocalStorage => "it has emptyDir or hostPath volumes",
        })
    }
}

/// The UID of the pod's controller (the ownerReference with `controller: true`): the identity
/// the descheduler moves a pod through and the webhook keeps exclusions under (the original
/// used the first owner in one and the last in the other).
pub fn controller_uid(pod: &Pod) -> Option<&str> {
    pod.metadata
        .owner_references
        .as_deref()?
        .iter()
        .find(|r| r.controller == Some(true))
        .map(|r| r.uid.as_str())
        .filter(|u| !u.is_empty())
}

/// Whether and how the pod may move (descheduler v0.18's evictability, which the original
/// used, with the owner decision above).
pub fn handling(pod: &Pod, policy: &Policy) -> Result<Handling, Keep> {
    let annotations = pod.metadata.annotations.as_ref();
    let has = |k: &str| annotations.is_some_and(|a| a.contains_key(k));
    let forced = has(ANNOTATION_DESCHEDULER_EVICT);
    let refs = pod.metadata.owner_references.as_deref().unwrap_or_default();
    if refs.iter().any(|r| r.kind == "DaemonSet") {
        return Err(Keep::DaemonSet);
    }
    if !forced {
        if has(ANNOTATION_CONFIG_MIRROR)
            || annotations
                .and_then(|a| a.get(ANNOTATION_CONFIG_SOURCE))
                .is_some_and(|s| s != "api")
        {
            return Err(Keep::Static);
        }
        let spec = pod.spec.as_ref();
        if spec
            .and_then(|s| s.priority)
            .is_some_and(|p| p >= CRITICAL_PRIORITY)
        {
            return Err(Keep::Critical);
        }
        let local = spec
            .and_then(|s| s.volumes.as_ref())
            .into_iter()
            .flatten()
            .any(|v| v.empty_dir.is_some() || v.host_path.is_some());
        if local && !policy.evict_local_storage {
            return Err(Keep::LocalStorage);
        }
    }
    match controller_uid(pod) {
        Some(uid) => Ok(Handling::ThroughOwner(uid.to_owned())),
        None if forced => Ok(Handling::Recreate),
        None => Err(Keep::NoController),
    }
}

/// How many times the pod (or, for a controller's pod, its workload within the webhook's
/// window) was moved: the larger of its deschedule count and its excluded nodes.
pub fn attempts(pod: &Pod) -> u32 {
    let count = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_DESCHEDULE_COUNT))
        .and_then(|c| c.trim().parse::<u32>().ok())
        .unwrap_or(0);
    let excluded = u32::try_from(excluded_nodes(pod).len()).unwrap_or(u32::MAX);
    count.max(excluded)
}

/// The pod the descheduler creates for `pod`, which failed on `node`: same name, spec and
/// annotations (fix: the original kept only the count from the second time on), no node, no
/// status, labelled `create-by-descheduler=true`, kept off `node` and the nodes it already
/// failed on, its count one higher.
pub fn replacement(pod: &Pod, node: &str) -> Pod {
    let mut new = Pod {
        metadata: pod.metadata.clone(),
        spec: pod.spec.clone(),
        status: None,
    };
    let meta = &mut new.metadata;
    meta.uid = None;
    meta.resource_version = None;
    meta.creation_timestamp = None;
    meta.deletion_timestamp = None;
    meta.deletion_grace_period_seconds = None;
    meta.generation = None;
    meta.managed_fields = None;
    meta.self_link = None;
    meta.labels.get_or_insert_with(BTreeMap::new).insert(
        LABEL_CREATE_BY_DESCHEDULER.to_owned(),
        VALUE_TRUE.to_owned(),
    );
    if let Some(spec) = new.spec.as_mut() {
        spec.node_name = None;
    }
    let count = attempts(pod).saturating_add(1);
    exclude_nodes(&mut new, &[node.to_owned()]);
    new.metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(ANNOTATION_DESCHEDULE_COUNT.to_owned(), count.to_string());
    new
}

/// How long a controller's move waits for the controller's new pod to take over its count.
/// A replacement appears within seconds; one that never comes (the controller was scaled down
/// or deleted, or rolled out a new ReplicaSet) must not keep the intent for ever.
pub const HANDOVER_WINDOW: SignedDuration = SignedDuration::from_secs(600);

/// A move, written down before the pod is deleted, with what it takes to finish it after a
/// failure or a restart.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Move {
    /// Namespace of the moved pod.
    pub namespace: String,
    /// Name of the moved pod.
    pub name: String,
    /// UID of the moved pod: only that pod is ever deleted.
    pub uid: String,
    /// The virtual node it could not be placed through.
    pub node: String,
    /// Moves of the pod (or its slot in its controller) including this one.
    pub attempts: u32,
    /// Why it moves, for the event.
    pub why: String,
    /// Who creates the replacement.
    pub how: MoveHow,
}

/// Who creates the replacement of a moved pod.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum MoveHow {
    /// The pod's controller (this UID); its next new pod takes over [`Move::attempts`].
    #[serde(rename_all = "camelCase")]
    ThroughOwner {
        /// UID of the controller.
        controller: String,
    },
    /// The descheduler, with this pod.
    Recreate {
        /// The replacement ([`replacement`]).
        replacement: Box<Pod>,
    },
}

/// The name of the record of the virtual nodes the controller with this UID is kept off.
///
/// The record is a ConfigMap in the descheduler's namespace whose data maps each node to the
/// time (RFC 3339) until which it stays excluded. It is written before the moved pod is
/// deleted and read by every webhook replica from a watch, so the replacement is kept off the
/// node whichever replica admits it, and whenever that replica started.
pub fn exclusions_name(controller_uid: &str) -> String {
    format!("tensile-exclusions-{controller_uid}")
}

/// Until when `node` stays excluded after a move at `now`: `window` from now, or the later
/// time already recorded (`recorded`, unparsable values ignored).
pub fn exclusion_until(
    recorded: Option<&str>,
    now: Timestamp,
    window: SignedDuration,
) -> Timestamp {
    let fresh = now.saturating_add(window).unwrap_or(now);
    recorded
        .and_then(|r| r.parse::<Timestamp>().ok())
        .map_or(fresh, |r| r.max(fresh))
}

/// The nodes of a record (node -> until) that are still excluded at `now`.
pub fn excluded_now(record: &BTreeMap<String, String>, now: Timestamp) -> Vec<String> {
    record
        .iter()
        .filter(|(_, until)| until.parse::<Timestamp>().is_ok_and(|u| u > now))
        .map(|(node, _)| node.clone())
        .collect()
}

/// What to do with a record (node -> until) at `now`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExclusionsCleanup {
    /// Nothing has lapsed; look again at this time.
    Keep(Timestamp),
    /// These nodes lapsed (or hold no time); the rest lapse at the given time.
    Drop(Vec<String>, Timestamp),
    /// Every node lapsed: the record goes.
    Delete,
}

/// What lapsed in a record at `now`, and when the next node does.
pub fn exclusions_cleanup(record: &BTreeMap<String, String>, now: Timestamp) -> ExclusionsCleanup {
    let mut lapsed = Vec::new();
    let mut next: Option<Timestamp> = None;
    for (node, until) in record {
        match until.parse::<Timestamp>() {
            Ok(u) if u > now => next = Some(next.map_or(u, |n| n.min(u))),
            _ => lapsed.push(node.clone()),
        }
    }
    match (next, lapsed.is_empty()) {
        (None, _) => ExclusionsCleanup::Delete,
        (Some(at), true) => ExclusionsCleanup::Keep(at),
        (Some(at), false) => ExclusionsCleanup::Drop(lapsed, at),
    }
}

/// The name of the intent of a move of the pod with this UID (one move per pod at a time).
pub fn move_name(uid: &str) -> String {
    format!("tensile-move-{uid}")
}

/// The move of `pod`, stuck on `node` because of `why`, with `attempts` moves behind it (see
/// [`attempts_owed`]); `None` when the pod has no UID to delete it by.
pub fn plan_move(
    pod: &Pod,
    node: &str,
    handling: &Handling,
    attempts: u32,
    why: &str,
) -> Option<Move> {
    let uid = pod.metadata.uid.clone().filter(|u| !u.is_empty())?;
    let how = match handling {
        Handling::ThroughOwner(controller) => MoveHow::ThroughOwner {
            controller: controller.clone(),
        },
        Handling::Recreate => MoveHow::Recreate {
            replacement: Box::new(replacement(pod, node)),
        },
    };
    Some(Move {
        namespace: pod.metadata.namespace.clone().unwrap_or_default(),
        name: pod.metadata.name.clone().unwrap_or_default(),
        uid,
        node: node.to_owned(),
        attempts: attempts.saturating_add(1),
        why: why.to_owned(),
        how,
    })
}

/// Whether `pod` is one the controller of `m` may have created to replace the moved pod, and
/// has not taken its count yet: the same controller and namespace, created at or after the
/// intent (`since`, the intent's creation time, on the API server's clock as the pod's is),
/// not being deleted, with fewer attempts. Several moves of one controller may hand their
/// counts to each other's replacements: each count lands on some pod of the workload, which is
/// what bounds the workload's moves.
pub fn takes_over(m: &Move, since: Timestamp, pod: &Pod) -> bool {
    let MoveHow::ThroughOwner { controller } = &m.how else {
        return false;
    };
    let meta = &pod.metadata;
    meta.namespace.as_deref() == Some(m.namespace.as_str())
        && controller_uid(pod) == Some(controller.as_str())
        && meta.uid.as_deref() != Some(m.uid.as_str())
        && meta.deletion_timestamp.is_none()
        && meta
            .creation_timestamp
            .as_ref()
            .is_some_and(|t| t.0 >= since)
        && attempts(pod) < m.attempts
}

/// Whether `pod` is a new pod of the controller of `m` that the webhook kept off the node `m`
/// moved away from, and whose exclusions count the move already.
fn counted_by_webhook(m: &Move, since: Timestamp, pod: &Pod) -> bool {
    let MoveHow::ThroughOwner { controller } = &m.how else {
        return false;
    };
    let meta = &pod.metadata;
    meta.namespace.as_deref() == Some(m.namespace.as_str())
        && controller_uid(pod) == Some(controller.as_str())
        && meta.uid.as_deref() != Some(m.uid.as_str())
        && meta
            .creation_timestamp
            .as_ref()
            .is_some_and(|t| t.0 >= since)
        && excluded_nodes(pod).contains(&m.node)
        && attempts(pod) >= m.attempts
}

/// The attempts of `pod` counting the moves whose count it is due to take over (its own
/// [`attempts`] otherwise): a replacement that becomes stuck before it was handed its count
/// must not start again from zero.
pub fn attempts_owed(pod: &Pod, moves: &[(Move, Timestamp)]) -> u32 {
    moves
        .iter()
        .filter(|(m, since)| takes_over(m, *since, pod))
        .map(|(m, _)| m.attempts)
        .fold(attempts(pod), u32::max)
}

/// The next step of a move, from the cached pod under the moved pod's name (`current`) and
/// the cached pods of its namespace that may be the controller's replacement (`candidates`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MoveStep {
    /// Mark the moved pod `unschedulable-node` and delete it (UID precondition).
    Delete,
    /// The moved pod is being deleted; look again when it changes.
    WaitGone,
    /// Create the replacement, once a read confirms the moved pod is gone (the caller's cache
    /// may not hold a pod that is no longer Pending).
    Create,
    /// Hand the count over to this pod of the controller (a patch with the pod's UID and
    /// resourceVersion as preconditions, see [`handover_patch`]).
    Hand {
        /// Its name.
        name: String,
    },
    /// No replacement yet; look again when a pod of the controller appears, or at this time.
    WaitReplacement(Timestamp),
    /// Done (or nothing left to do): remove the intent.
    Forget,
}

/// The next step of the move `m` whose intent was written at `since`.
pub fn move_step(
    m: &Move,
    since: Timestamp,
    current: Option<&Pod>,
    candidates: &[Pod],
    now: Timestamp,
) -> MoveStep {
    let moved = current.filter(|p| p.metadata.uid.as_deref() == Some(m.uid.as_str()));
    if let Some(p) = moved
        && p.metadata.deletion_timestamp.is_none()
    {
        return MoveStep::Delete;
    }
    match &m.how {
        MoveHow::Recreate { .. } => match (moved, current) {
            (Some(_), _) => MoveStep::WaitGone,
            // Someone created a pod under the name (our replacement, a restarted run's).
            (None, Some(_)) => MoveStep::Forget,
            (None, None) => MoveStep::Create,
        },
        // A controller creates the replacement once the pod is being deleted (a ReplicaSet)
        // or gone (a StatefulSet): look for it either way.
        MoveHow::ThroughOwner { .. } => {
            let next = candidates
                .iter()
                .filter(|p| takes_over(m, since, p))
                .min_by_key(|p| {
                    (
                        p.metadata.creation_timestamp.as_ref().map(|t| t.0),
                        p.metadata.name.clone(),
                    )
                });
            if let Some(p) = next {
                return MoveStep::Hand {
                    name: p.metadata.name.clone().unwrap_or_default(),
                };
            }
            // A `virtual-pod=true` replacement is counted by the webhook already: it keeps the
            // node off the controller's new pods, and those exclusions are attempts.
            if candidates.iter().any(|p| counted_by_webhook(m, since, p)) {
                return MoveStep::Forget;
            }
            let until = since.saturating_add(HANDOVER_WINDOW).unwrap_or(since);
            if now >= until {
                MoveStep::Forget
            } else {
                MoveStep::WaitReplacement(until)
            }
        }
    }
}

/// The merge patch that hands the count of `m` over to `pod`: only while it is the same pod at
/// the same resourceVersion, so two moves never both count on one pod by racing.
pub fn handover_patch(m: &Move, pod: &Pod) -> serde_json::Value {
    serde_json::json!({"metadata": {
        "uid": pod.metadata.uid,
        "resourceVersion": pod.metadata.resource_version,
        "annotations": {ANNOTATION_DESCHEDULE_COUNT: m.attempts.to_string()},
    }})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_exclusion_lasts_its_window_and_never_shortens_a_recorded_one() {
        let now = at("2026-11-22T10:00:00Z");
        let window = SignedDuration::from_secs(180);
        assert_eq!(
            exclusion_until(None, now, window),
            at("2026-11-22T10:03:00Z")
        );
        assert_eq!(
            exclusion_until(Some("2026-11-22T10:01:00Z"), now, window),
            at("2026-11-22T10:03:00Z")
        );
        assert_eq!(
            exclusion_until(Some("2026-11-22T11:00:00Z"), now, window),
            at("2026-11-22T11:00:00Z"),
            "a longer exclusion written by a run with a longer window stays"
        );
        assert_eq!(
            exclusion_until(Some("garbage"), now, window),
            at("2026-11-22T10:03:00Z")
        );
    }

    #[test]
    fn only_unlapsed_nodes_are_excluded_and_lapsed_ones_are_cleaned_up() {
        let record: BTreeMap<String, String> = [
            ("vk-a", "2026-11-22T10:03:00Z"),
            ("vk-b", "2026-11-22T10:01:00Z"),
            ("vk-c", "not a time"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        assert_eq!(
            excluded_now(&record, at("2026-11-22T10:00:00Z")),
            ["vk-a", "vk-b"]
        );
        assert_eq!(excluded_now(&record, at("2026-11-22T10:02:00Z")), ["vk-a"]);
        assert_eq!(
            exclusions_cleanup(&record, at("2026-11-22T10:00:00Z")),
            ExclusionsCleanup::Drop(vec!["vk-c".into()], at("2026-11-22T10:01:00Z"))
        );
        let clean: BTreeMap<String, String> = record
            .iter()
            .filter(|(k, _)| *k != "vk-c")
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        assert_eq!(
            exclusions_cleanup(&clean, at("2026-11-22T10:00:00Z")),
            ExclusionsCleanup::Keep(at("2026-11-22T10:01:00Z"))
        );
        assert_eq!(
            exclusions_cleanup(&clean, at("2026-11-22T10:03:00Z")),
            ExclusionsCleanup::Delete,
            "the record lapses when its last node does"
        );
        assert_eq!(
            exclusions_cleanup(&BTreeMap::new(), at("2026-11-22T10:00:00Z")),
            ExclusionsCleanup::Delete
        );
        assert_eq!(exclusions_name("rs-1"), "tensile-exclusions-rs-1");
    }
    use crate::inject::required_terms;
    use crate::keys::{ANNOTATION_CLUSTER_SELECTOR, ANNOTATION_EXCLUDED_NODES, LABEL_HOSTNAME};
    use pretty_assertions::assert_eq;
    use serde_json::json;

    /// `pod` as it looks once its deletion started at `when`.
    fn being_deleted(pod: &Pod, when: k8s_openapi::jiff::Timestamp) -> Pod {
        let mut p = pod.clone();
        p.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(when));
        p
    }

    fn stuck(extra: serde_json::Value) -> Pod {
        let mut v = json!({
            "metadata": {"name": "web-1", "namespace": "shop", "uid": "u1", "resourceVersion": "7",
                "creationTimestamp": "2026-11-22T10:00:00Z",
                "labels": {"app": "web", "virtual-pod": "true"},
                "annotations": {"clusterSelector": "{\"nodeSelector\":{\"disk\":\"ssd\"}}"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web",
                    "uid": "rs-uid", "controller": true}]},
            "spec": {"nodeName": "vk-a", "containers": [{"name": "c", "image": "nginx"}]},
            "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False",
                "reason": "Unschedulable", "message": "0/3 nodes are available: 3 Insufficient cpu.",
                "lastTransitionTime": "2026-11-22T10:00:05Z"}]}
        });
        json_merge(&mut v, extra);
        serde_json::from_value(v).unwrap()
    }

    fn json_merge(a: &mut serde_json::Value, b: serde_json::Value) {
        match (a, b) {
            (serde_json::Value::Object(a), serde_json::Value::Object(b)) => {
                for (k, v) in b {
                    json_merge(a.entry(k).or_insert(serde_json::Value::Null), v);
                }
            }
            (a, b) => *a = b,
        }
    }

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn checklist_90_unschedulable_in_the_lower_cluster_is_due_after_the_threshold() {
        let (when, why) = due(&stuck(json!({})), &Policy::default()).unwrap();
        assert_eq!(when, at("2026-11-22T10:00:35Z"));
        assert!(
            matches!(why, Trigger::Unschedulable { ref reason, .. } if reason == "Unschedulable")
        );
        let error = stuck(
            json!({"status": {"conditions": [{"type": "PodScheduled", "status": "False",
            "reason": "SchedulerError", "lastTransitionTime": "2026-11-22T10:00:05Z"}]}}),
        );
        assert!(due(&error, &Policy::default()).is_some());
    }

    #[test]
    fn running_unbound_deleting_or_scheduled_pods_are_never_due() {
        let p = Policy::default();
        assert_eq!(
            due(&stuck(json!({"status": {"phase": "Running"}})), &p),
            None
        );
        assert_eq!(due(&stuck(json!({"spec": {"nodeName": ""}})), &p), None);
        assert_eq!(
            due(
                &stuck(json!({"metadata": {"deletionTimestamp": "2026-11-22T10:01:00Z"}})),
                &p
            ),
            None
        );
        let scheduled =
            stuck(json!({"status": {"conditions": [{"type": "PodScheduled", "status": "True"}]}}));
        assert_eq!(due(&scheduled, &p), None);
    }

    #[test]
    fn checklist_95_pending_older_than_the_maximum_age_is_due() {
        let scheduled =
            stuck(json!({"status": {"conditions": [{"type": "PodScheduled", "status": "True"}]}}));
        let policy = Policy {
            max_pending_age: Some(SignedDuration::from_secs(180)),
            ..Policy::default()
        };
        assert_eq!(
            due(&scheduled, &policy),
            Some((at("2026-11-22T10:03:00Z"), Trigger::TooOld))
        );
        // Whichever rule fires first.
        assert_eq!(
            due(&stuck(json!({})), &policy).unwrap().0,
            at("2026-11-22T10:00:35Z")
        );
    }

    #[test]
    fn checklist_94_who_may_move() {
        let p = Policy::default();
        assert_eq!(
            handling(&stuck(json!({})), &p),
            Ok(Handling::ThroughOwner("rs-uid".into()))
        );
        let bare = stuck(json!({"metadata": {"ownerReferences": null}}));
        assert_eq!(handling(&bare, &p), Err(Keep::NoController));
        let ds = stuck(
            json!({"metadata": {"ownerReferences": [{"apiVersion": "apps/v1",
            "kind": "DaemonSet", "name": "d", "uid": "d", "controller": true}]}}),
        );
        assert_eq!(handling(&ds, &p), Err(Keep::DaemonSet));
        let mirror =
            stuck(json!({"metadata": {"annotations": {"kubernetes.io/config.mirror": "x"}}}));
        assert_eq!(handling(&mirror, &p), Err(Keep::Static));
        let critical = stuck(json!({"spec": {"priority": 2_000_000_000}}));
        assert_eq!(handling(&critical, &p), Err(Keep::Critical));
        let local = stuck(json!({"spec": {"volumes": [{"name": "v", "emptyDir": {}}]}}));
        assert_eq!(handling(&local, &p), Err(Keep::LocalStorage));
        let allowed = Policy {
            evict_local_storage: true,
            ..Policy::default()
        };
        assert!(handling(&local, &allowed).is_ok());
        // The annotation opts in, and makes a bare pod ours to re-create.
        let forced = stuck(json!({"metadata": {"ownerReferences": null,
            "annotations": {"descheduler.alpha.kubernetes.io/evict": "true"}},
            "spec": {"volumes": [{"name": "v", "hostPath": {"path": "/x"}}]}}));
        assert_eq!(handling(&forced, &p), Ok(Handling::Recreate));
    }

    #[test]
    fn checklist_91_93_the_replacement_keeps_everything_but_node_and_status() {
        let old = stuck(
            json!({"metadata": {"annotations": {"sigs.k8s.io/deschedule-count": "1",
            "team": "a"}}}),
        );
        let new = replacement(&old, "vk-a");
        let meta = &new.metadata;
        assert_eq!(meta.name.as_deref(), Some("web-1"));
        assert_eq!(meta.uid, None);
        assert_eq!(meta.resource_version, None);
        assert_eq!(
            meta.labels.as_ref().unwrap()["create-by-descheduler"],
            "true"
        );
        let ann = meta.annotations.as_ref().unwrap();
        assert_eq!(ann[ANNOTATION_DESCHEDULE_COUNT], "2");
        assert_eq!(
            ann["team"], "a",
            "fix: annotations survive a second deschedule"
        );
        assert_eq!(
            ann[ANNOTATION_CLUSTER_SELECTOR],
            old.metadata.annotations.as_ref().unwrap()[ANNOTATION_CLUSTER_SELECTOR]
        );
        assert_eq!(ann[ANNOTATION_EXCLUDED_NODES], "vk-a");
        assert_eq!(new.status, None);
        let spec = new.spec.as_ref().unwrap();
        assert_eq!(spec.node_name, None);
        let term = &required_terms(spec.affinity.as_ref())[0];
        let r = &term.match_expressions.as_ref().unwrap()[0];
        assert_eq!(
            (
                r.key.as_str(),
                r.operator.as_str(),
                r.values.as_deref().unwrap()
            ),
            (LABEL_HOSTNAME, "NotIn", &["vk-a".to_owned()][..])
        );
    }

    #[test]
    fn checklist_99_a_second_move_excludes_both_nodes_even_with_user_terms() {
        let old = stuck(json!({"spec": {"affinity": {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "clusterID", "operator": "In", "values": ["c1", "c2", "c3"]}]}]}}}}}));
        let first = replacement(&old, "vk-a");
        let mut moved = first.clone();
        moved.spec.as_mut().unwrap().node_name = Some("vk-b".into());
        let second = replacement(&moved, "vk-b");
        assert_eq!(attempts(&second), 2);
        let terms = &required_terms(second.spec.as_ref().unwrap().affinity.as_ref());
        assert_eq!(terms.len(), 1);
        let exprs = terms[0].match_expressions.as_ref().unwrap();
        assert_eq!(exprs[0].key, "clusterID", "the user's term is kept");
        assert_eq!(exprs[1].values.as_deref().unwrap(), ["vk-a", "vk-b"]);
    }

    fn since() -> Timestamp {
        at("2026-11-22T10:01:00Z")
    }

    /// The ReplicaSet's next pod, created at `created`.
    fn sibling(name: &str, created: &str) -> Pod {
        stuck(
            json!({"metadata": {"name": name, "uid": format!("{name}-uid"),
            "creationTimestamp": created, "annotations": null}}),
        )
    }

    fn owner_move(attempts: u32) -> Move {
        let pod = stuck(json!({}));
        let handling = handling(&pod, &Policy::default()).unwrap();
        plan_move(&pod, "vk-a", &handling, attempts, "Unschedulable: full").unwrap()
    }

    #[test]
    fn a_move_is_planned_with_one_more_attempt_and_who_re_creates() {
        let m = owner_move(1);
        assert_eq!(
            (m.namespace.as_str(), m.name.as_str(), m.uid.as_str()),
            ("shop", "web-1", "u1")
        );
        assert_eq!(m.attempts, 2);
        assert_eq!(
            m.how,
            MoveHow::ThroughOwner {
                controller: "rs-uid".into()
            }
        );
        let bare = stuck(json!({"metadata": {"ownerReferences": null,
            "annotations": {"descheduler.alpha.kubernetes.io/evict": "true"}}}));
        let m = plan_move(&bare, "vk-a", &Handling::Recreate, 0, "x").unwrap();
        let MoveHow::Recreate { replacement } = &m.how else {
            panic!("{m:?}")
        };
        assert_eq!(attempts(replacement), m.attempts);
        // It survives the ConfigMap it is kept in.
        let text = serde_json::to_string(&m).unwrap();
        assert_eq!(serde_json::from_str::<Move>(&text).unwrap(), m);
        assert_eq!(move_name("u1"), "tensile-move-u1");
        let mut no_uid = bare;
        no_uid.metadata.uid = None;
        assert_eq!(
            plan_move(&no_uid, "vk-a", &Handling::Recreate, 0, "x"),
            None
        );
    }

    #[test]
    fn the_controllers_next_pod_takes_over_the_count() {
        let m = owner_move(0);
        let next = sibling("web-2", "2026-11-22T10:01:00Z");
        assert!(takes_over(&m, since(), &next), "same second counts");
        assert!(
            !takes_over(&m, since(), &sibling("web-0", "2026-11-22T10:00:59Z")),
            "older than the move"
        );
        assert!(
            !takes_over(
                &m,
                since(),
                &stuck(json!({"metadata": {
            "creationTimestamp": "2026-11-22T10:02:00Z"}}))
            ),
            "the moved pod itself"
        );
        let other = stuck(json!({"metadata": {"name": "x", "uid": "x",
            "creationTimestamp": "2026-11-22T10:02:00Z",
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "o",
                "uid": "other-rs", "controller": true}]}}));
        assert!(!takes_over(&m, since(), &other), "another controller");
        let mut elsewhere = next.clone();
        elsewhere.metadata.namespace = Some("other".into());
        assert!(!takes_over(&m, since(), &elsewhere));
        let deleting = being_deleted(&next, at("2026-11-22T10:03:00Z"));
        assert!(!takes_over(&m, since(), &deleting));
        let counted = stuck(json!({"metadata": {"name": "web-3", "uid": "web-3-uid",
            "creationTimestamp": "2026-11-22T10:02:00Z",
            "annotations": {"sigs.k8s.io/deschedule-count": "1"}}}));
        assert!(!takes_over(&m, since(), &counted), "has the count already");
        // Until it is handed over, the count is owed to it.
        assert_eq!(attempts(&next), 0);
        assert_eq!(attempts_owed(&next, &[(owner_move(2), since())]), 3);
        assert_eq!(attempts_owed(&next, &[]), 0);
        // A bare pod's re-creation carries its count itself.
        let bare = stuck(json!({"metadata": {"ownerReferences": null}}));
        let m = plan_move(&bare, "vk-a", &Handling::Recreate, 0, "x").unwrap();
        assert!(!takes_over(&m, since(), &next));
    }

    #[test]
    fn a_move_through_the_owner_deletes_then_hands_over_then_is_forgotten() {
        let m = owner_move(0);
        let old = stuck(json!({}));
        let now = at("2026-11-22T10:01:01Z");
        assert_eq!(
            move_step(&m, since(), Some(&old), &[], now),
            MoveStep::Delete
        );
        let deleting = being_deleted(&old, now);
        let window = at("2026-11-22T10:11:00Z");
        assert_eq!(
            move_step(
                &m,
                since(),
                Some(&deleting),
                std::slice::from_ref(&deleting),
                now
            ),
            MoveStep::WaitReplacement(window)
        );
        // The oldest new pod of the controller takes it (a ReplicaSet replaces a pod as soon
        // as it is being deleted).
        let pods = [
            deleting.clone(),
            sibling("web-3", "2026-11-22T10:01:02Z"),
            sibling("web-2", "2026-11-22T10:01:01Z"),
        ];
        assert_eq!(
            move_step(&m, since(), Some(&deleting), &pods, now),
            MoveStep::Hand {
                name: "web-2".into()
            }
        );
        assert_eq!(
            move_step(&m, since(), None, &pods[1..], now),
            MoveStep::Hand {
                name: "web-2".into()
            }
        );
        // Nothing came within the window.
        assert_eq!(move_step(&m, since(), None, &[], window), MoveStep::Forget);
        // A virtual-pod=true replacement came through the webhook, which excluded the node:
        // it is counted already.
        let mut excluded = sibling("web-4", "2026-11-22T10:01:02Z");
        exclude_nodes(&mut excluded, &["vk-a".to_owned()]);
        assert_eq!(
            move_step(&m, since(), None, &[excluded.clone()], now),
            MoveStep::Forget
        );
        let mut elsewhere = sibling("web-5", "2026-11-22T10:01:02Z");
        exclude_nodes(&mut elsewhere, &["vk-b".to_owned()]);
        // (A second move, from vk-a after vk-b: the pod's one exclusion is not its count.)
        assert_eq!(
            move_step(&owner_move(1), since(), None, &[elsewhere], now),
            MoveStep::Hand {
                name: "web-5".into()
            },
            "an exclusion of another node does not count this move"
        );
        let patch = handover_patch(&m, &pods[2]);
        assert_eq!(
            patch,
            json!({"metadata": {"uid": "web-2-uid", "resourceVersion": "7",
                "annotations": {"sigs.k8s.io/deschedule-count": "1"}}})
        );
    }

    #[test]
    fn a_re_creation_deletes_waits_creates_and_is_forgotten_once_the_name_is_taken() {
        let bare = stuck(json!({"metadata": {"ownerReferences": null}}));
        let m = plan_move(&bare, "vk-a", &Handling::Recreate, 0, "x").unwrap();
        let now = at("2026-11-22T10:01:01Z");
        assert_eq!(
            move_step(&m, since(), Some(&bare), &[], now),
            MoveStep::Delete
        );
        let deleting = being_deleted(&bare, now);
        assert_eq!(
            move_step(&m, since(), Some(&deleting), &[], now),
            MoveStep::WaitGone
        );
        // Gone: create, and create again after a refusal (nothing under the name yet), however
        // long it takes: a bare pod has nobody else to re-create it.
        let later = at("2026-11-23T10:00:00Z");
        assert_eq!(move_step(&m, since(), None, &[], later), MoveStep::Create);
        let MoveHow::Recreate { replacement } = &m.how else {
            panic!()
        };
        let mut created = (**replacement).clone();
        created.metadata.uid = Some("u2".into());
        assert_eq!(
            move_step(&m, since(), Some(&created), &[], now),
            MoveStep::Forget
        );
    }

    /// A controller's pod that its lower cluster keeps refusing used to be deleted every
    /// 30 s for ever (nothing counted its moves). Through the hand-over each replacement
    /// carries the count, so the pod's slot moves `max_attempts` times and stays.
    #[test]
    fn a_controllers_pod_refused_everywhere_moves_at_most_max_attempts_times() {
        let policy = Policy::default();
        let mut pod = stuck(json!({"metadata": {"annotations": null}}));
        let mut moves = 0;
        for i in 0..10 {
            let Ok(how) = handling(&pod, &policy) else {
                panic!()
            };
            if attempts(&pod) >= policy.max_attempts {
                break;
            }
            let m = plan_move(&pod, "vk-a", &how, attempts(&pod), "x").unwrap();
            moves += 1;
            // The ReplicaSet's replacement, a new pod the webhook never saw.
            let created = format!("2026-11-22T10:0{i}:30Z");
            let since: Timestamp = format!("2026-11-22T10:0{i}:29Z").parse().unwrap();
            let next = sibling(&format!("web-{i}-next"), &created);
            assert_eq!(
                move_step(&m, since, None, std::slice::from_ref(&next), since),
                MoveStep::Hand {
                    name: next.metadata.name.clone().unwrap()
                }
            );
            let patch = handover_patch(&m, &next);
            let mut v = serde_json::to_value(&next).unwrap();
            json_merge(&mut v, patch);
            pod = serde_json::from_value(v).unwrap();
        }
        assert_eq!(moves, policy.max_attempts);
        assert_eq!(attempts(&pod), policy.max_attempts);
    }
}
