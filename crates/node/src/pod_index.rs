//! The pod controller's index: the state the pod decisions read, fed by the watch events of
//! upper and lower pods, and answering for a pod key the [`Effect`]s to carry out, without any
//! I/O. The writer (`pods.rs`) executes them against the API servers.
//!
//! What the index holds besides the two pod caches: the grace period of upper pods whose
//! deletion was seen (a pod deleted with grace 0 is gone from the cache at once), the lower pods
//! we created that the watch has not shown yet, the Pending statuses held back for a newer one,
//! the environment events already sent, and whether the lower cluster answers. The rule of what
//! a pod needs is `tensile_core::sync::pod_step`; the index adds what follows from the marks.

use std::collections::HashMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{EphemeralContainer, Pod, PodCondition};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::watcher;
use serde_json::json;
use tensile_core::deps::is_owned_by;
use tensile_core::env_events::EnvEvent;
use tensile_core::keys::{
    EVENT_PROVIDER_CREATE_SUCCESS, EVENT_PROVIDER_DELETE_SUCCESS, EVENT_PROVIDER_UPDATE_SUCCESS,
    REASON_NOT_OFFLOADED, REASON_PROVIDER_FAILED,
};
use tensile_core::status::{
    may_coalesce, not_offloaded_conditions, provider_failed_patch, status_merge_patch,
    unreachable_conditions,
};
use tensile_core::sync::{PodStep, deleted_below_step, pod_step};
use tensile_core::translate::TranslateConfig;
use tensile_core::update::UpdateError;
use tensile_runtime::cache::CompactCache;
use tensile_runtime::maps::shrink_after_removal;
use tensile_runtime::marks::{Expected, Hold, Holds};

use crate::reach::LowerReach;
use crate::sync_error::{Cluster, Failure, Op, SyncError};

/// A pod key: namespace and name, the same in both clusters.
pub use tensile_runtime::cache::Key;

/// How long a lower pod we created may be missing from the lower watch before a plan believes
/// the cache again and creates it anew (idempotent: AlreadyExists of ours is fine).
pub const CREATED_EXPECTED: Duration = Duration::from_secs(30);

/// How long a Pending status may wait upstairs for a newer one (`may_coalesce`): short next to
/// a container start, long next to the lower cluster's own scheduling of a burst.
pub const STATUS_COALESCE: Duration = Duration::from_secs(1);

/// The clocks a plan reads: the monotonic one (marks and holds) and the wall clock (the times
/// written into conditions and statuses).
#[derive(Clone, Debug)]
pub struct Now {
    /// Monotonic.
    pub instant: std::time::Instant,
    /// Wall clock.
    pub time: Time,
}

impl Now {
    /// The system's clocks.
    pub fn system() -> Self {
        Now {
            instant: std::time::Instant::now(),
            time: Time(Timestamp::now()),
        }
    }
}

/// Why the upper pod's status is written (the writer measures the mirrored status only).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatusWhy {
    /// The pod is not offloaded: our condition says why.
    NotOffloaded,
    /// The lower pod vanished without our doing: Failed.
    Lost,
    /// The lower cluster does not answer: not Ready.
    Unreachable,
    /// The lower pod's status, carried up.
    Mirror,
    /// The upper pod is being deleted and its lower pod is gone: Failed, so its deletion can
    /// be finished.
    Terminated,
}

/// One thing the writer does for a pod. A plan's effects run in order; the first that fails
/// ends the plan (so an event placed after a write is sent only when the write succeeded).
#[derive(Clone, Debug, PartialEq)]
pub enum Effect {
    /// Delete the lower pod of the key, with its UID as precondition and this grace period
    /// (`None`: its own). A failure counts as part `op`.
    DeleteLower {
        /// The lower pod's UID.
        uid: Option<String>,
        /// Grace period in seconds.
        grace: Option<i64>,
        /// Which part a failure is.
        op: Op,
    },
    /// Finish the upper pod's deletion (grace 0, UID precondition): nothing is left below.
    ForceDeleteUpper,
    /// Delete the upper pod (its lower pod is being deleted downstairs) with this grace period.
    DeleteUpper {
        /// Grace period in seconds (`None`: the pod's own).
        grace: Option<i64>,
    },
    /// Create what the pod needs downstairs, then the pod; a failure is also written on the
    /// upper pod ([`Effect::failed_create_patch`]).
    CreateLower,
    /// Patch the lower pod (strategic merge).
    PatchLower(serde_json::Value),
    /// Give the lower pod these ephemeral containers (those it has, then the new ones).
    AddEphemeralContainers(Vec<EphemeralContainer>),
    /// Set readiness-gate conditions on the lower pod's status.
    SetLowerConditions(Vec<PodCondition>),
    /// Merge-patch the upper pod's status.
    PatchUpperStatus {
        /// The patch.
        patch: serde_json::Value,
        /// Why.
        why: StatusWhy,
    },
    /// Keep the pod's upper tokens current downstairs (with upper identity).
    SyncTokens,
    /// A Normal event on the upper pod.
    Event {
        /// Reason.
        reason: &'static str,
        /// Message.
        note: String,
    },
    /// Look at the key again after this long (a held status).
    RequeueAfter(Duration),
}

impl Effect {
    /// The status patch that says on upper pod `u` that its creation failed with `message`
    /// (`kubectl get` shows ProviderFailed), if it does not say so already.
    pub fn failed_create_patch(u: &Pod, message: &str, now: &Time) -> Option<serde_json::Value> {
        let conditions = not_offloaded_conditions(u, REASON_PROVIDER_FAILED, message, now)?;
        Some(provider_failed_patch(&conditions, message))
    }
}

/// What to do for one pod: the pods as the plan saw them, and the effects.
#[derive(Clone, Debug, Default)]
pub struct Plan {
    /// The upper pod.
    pub upper: Option<Pod>,
    /// Our lower pod.
    pub lower: Option<Pod>,
    /// What to do, in order.
    pub effects: Vec<Effect>,
}

/// The pod controller's state (see the module's documentation): plain values, changed through
/// `&mut self`. The controller keeps it behind one lock; the two caches are shared handles
/// (the kubelet API reads them too).
pub struct PodIndex {
    upper: CompactCache<Pod>,
    lower: CompactCache<Pod>,
    translate: TranslateConfig,
    lower_name: String,
    /// The grace period of upper pods whose deletion we saw, until their key is planned.
    gone_grace: HashMap<Key, i64>,
    /// The last state (metadata) of our lower pods whose removal shows they were deleted
    /// through the API, until their upper pod is gone or a lower pod is back (see
    /// [`Self::apply_lower`]). Boxed, so that the table a mass deletion grew stays small
    /// (a `Pod` is kilobytes of fields inline); given back when emptied.
    lower_deleted: HashMap<Key, Box<Pod>>,
    /// Pods whose Pending status is held back (see [`STATUS_COALESCE`]).
    held_statuses: Holds<Key>,
    /// Lower pods we created that the lower watch has not shown yet (by upper UID): a plan of
    /// such a key in between (its Secret's or upper pod's event came first) creates nothing.
    created: Expected<Key>,
    /// The environment events last sent for each pod (with its upper UID): a retry that finds
    /// the same sends none. Forgotten with the pod.
    env_sent: HashMap<Key, (String, Vec<EnvEvent>)>,
    /// Whether the lower cluster answers (the node loop's health check).
    reach: LowerReach,
    /// The resourceVersion each upper pod got from the lower status we last mirrored up, until
    /// the upper watch shows a version of the pod ([`Self::mirrored`]).
    mirrored: HashMap<Key, String>,
}

impl std::fmt::Debug for PodIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PodIndex")
            .field("lower_name", &self.lower_name)
            .finish_non_exhaustive()
    }
}

fn key_of(p: &Pod) -> Option<Key> {
    Some(Key::new(
        p.metadata.namespace.clone()?,
        p.metadata.name.clone()?,
    ))
}

impl PodIndex {
    /// An index over the given caches (shared with the kubelet API and the event mirror).
    pub fn new(
        translate: TranslateConfig,
        lower_name: String,
        (upper, lower): (CompactCache<Pod>, CompactCache<Pod>),
        reach: LowerReach,
    ) -> Self {
        PodIndex {
            upper,
            lower,
            translate,
            lower_name,
            gone_grace: HashMap::new(),
            lower_deleted: HashMap::new(),
            held_statuses: Holds::new(STATUS_COALESCE),
            created: Expected::new(CREATED_EXPECTED),
            env_sent: HashMap::new(),
            reach,
            mirrored: HashMap::new(),
        }
    }

    /// The upper pods bound to the node.
    pub fn upper_pods(&self) -> &CompactCache<Pod> {
        &self.upper
    }

    /// Our lower pods.
    pub fn lower_pods(&self) -> &CompactCache<Pod> {
        &self.lower
    }

    /// Whether the lower cluster answers.
    pub fn reach(&self) -> &LowerReach {
        &self.reach
    }

    /// Applies an event of the upper pod watch; answers the keys to plan once the cache shows
    /// them (a re-list's when it is complete: see `CompactCache::apply_keys`).
    pub fn apply_upper(&mut self, event: &watcher::Event<Pod>) -> Vec<Key> {
        // A pod deleted with grace 0 vanishes at once; its last state still says so, and the
        // lower pod goes the same way.
        if let watcher::Event::Delete(p) = event
            && let (Some(k), Some(g)) = (key_of(p), p.metadata.deletion_grace_period_seconds)
        {
            self.gone_grace.insert(k, g);
        }
        let mut keys = self.upper.apply_keys(event);
        // The event of our own mirrored status (the version our patch got) changes nothing a
        // plan reads: the lower pod it came from is unchanged, and what else reads the upper
        // pod's phase (the token Secret's collection) waits for the lower pod anyway while it
        // exists. Not planned again: a reconcile fewer per status written. Any other version
        // (a change by someone else, before or after ours) is planned as always.
        // Any event of the pod uses up its mark (a deleted or re-listed pod keeps none).
        let (watcher::Event::Apply(p) | watcher::Event::InitApply(p) | watcher::Event::Delete(p)) =
            event
        else {
            return keys;
        };
        let Some(k) = key_of(p) else {
            return keys;
        };
        let ours = self.mirrored.remove(&k);
        if matches!(event, watcher::Event::Apply(_))
            && ours.is_some()
            && p.metadata.resource_version == ours
        {
            keys.retain(|shown| *shown != k);
        }
        keys
    }

    /// A status of pod `key` was written up for `why`; the upper pod is now at
    /// `resource_version`. Only a mirrored status marks the version (see
    /// [`Self::apply_upper`]): every other kind changes what the next plan decides (a
    /// terminated pod's deletion is finished once its Failed phase shows).
    pub fn status_written(&mut self, key: Key, why: StatusWhy, resource_version: String) {
        if why == StatusWhy::Mirror {
            self.mirrored(key, resource_version);
        }
    }

    /// The lower status of pod `key` was mirrored up; the upper pod is now at
    /// `resource_version` (see [`Self::apply_upper`]).
    fn mirrored(&mut self, key: Key, resource_version: String) {
        self.mirrored.insert(key, resource_version);
    }

    /// What the index keeps of an event of the watch of every lower pod: those with our owner
    /// label. A pod that loses the label leaves as a deletion, as it would from a
    /// label-selector watch. Apply what it keeps with [`Self::apply_lower`].
    pub fn ours(&self, event: watcher::Event<Pod>) -> Option<watcher::Event<Pod>> {
        let owner = &self.translate.owner;
        let is_ours = |p: &Pod| is_owned_by(&p.metadata, owner);
        let cached = |p: &Pod| {
            key_of(p).is_some_and(
                |Key {
                     namespace: ns,
                     name,
                 }| self.lower.contains(&ns, &name),
            )
        };
        match event {
            watcher::Event::Apply(p) if is_ours(&p) => Some(watcher::Event::Apply(p)),
            watcher::Event::Apply(p) | watcher::Event::Delete(p) if cached(&p) => {
                Some(watcher::Event::Delete(p))
            }
            watcher::Event::InitApply(p) if is_ours(&p) => Some(watcher::Event::InitApply(p)),
            watcher::Event::Apply(_) | watcher::Event::Delete(_) | watcher::Event::InitApply(_) => {
                None
            }
            watcher::Event::Init => Some(watcher::Event::Init),
            watcher::Event::InitDone => Some(watcher::Event::InitDone),
        }
    }

    /// Applies an event of our lower pods (kept by [`Self::ours`]); answers the keys to plan.
    pub fn apply_lower(&mut self, event: &watcher::Event<Pod>) -> Vec<Key> {
        // A pod deleted through the API is marked before it goes, and its removal still shows
        // the mark. Both may reach the cache before the key is planned: without its last state
        // the plan would see only a vanished pod and fail the upper pod as lost. A pod that
        // vanished unmarked (a re-list after an outage) is lost indeed.
        if let watcher::Event::Delete(p) = event
            && p.metadata.deletion_timestamp.is_some()
            && let Some(k) = key_of(p)
        {
            let last = Box::new(Pod {
                metadata: p.metadata.clone(),
                ..Pod::default()
            });
            self.lower_deleted.insert(k, last);
        }
        let keys = self.lower.apply_keys(event);
        // The cache shows these pods now: a create of ours is no longer in flight.
        for k in &keys {
            self.created.seen(k);
        }
        keys
    }

    /// The lower pod of `key` was created (or found ours) for upper UID `uid` at `now`.
    pub fn created(&mut self, key: Key, uid: &str, now: std::time::Instant) {
        self.created.written(key, uid, now);
    }

    /// Of the environment events `events` that hold for pod `key` (upper UID `uid`), those to
    /// send: each one once while it holds, whatever the retries (one that stopped holding and
    /// holds again is sent again).
    pub fn env_events_to_send(
        &mut self,
        key: &Key,
        uid: &str,
        events: Vec<EnvEvent>,
    ) -> Vec<EnvEvent> {
        let sent = &mut self.env_sent;
        if events.is_empty() {
            sent.remove(key);
            return Vec::new();
        }
        let before: &[EnvEvent] = match sent.get(key) {
            Some((sent_uid, before)) if sent_uid == uid => before,
            _ => &[],
        };
        let new = events
            .iter()
            .filter(|e| !before.contains(e))
            .cloned()
            .collect();
        sent.insert(key.clone(), (uid.to_owned(), events));
        new
    }

    fn lower_cluster(&self) -> Cluster {
        Cluster::Lower(self.lower_name.clone())
    }

    /// What to do for pod `key` now (see [`pod_step`]). Consumes the marks it reads once (the
    /// grace of a deletion seen; a held status whose window is over).
    pub fn plan(&mut self, key: &Key, now: &Now) -> Result<Plan, Failure> {
        let Key {
            namespace: ns,
            name,
        } = key;
        let upper = self.upper.get(ns, name);
        let lower = self.lower.get(ns, name);
        let gone_grace = self.gone_grace.remove(key);
        let deleted_below = match (&upper, &lower) {
            (Some(u), None) => self
                .lower_deleted
                .get(key)
                .and_then(|last| deleted_below_step(u, last, &self.translate.owner)),
            _ => {
                if self.lower_deleted.remove(key).is_some() {
                    shrink_after_removal(&mut self.lower_deleted);
                }
                None
            }
        };
        let step = match deleted_below {
            Some(step) => Ok(step),
            None => pod_step(
                upper.as_ref(),
                lower.as_ref(),
                &self.translate,
                &self.lower_name,
                gone_grace,
                &now.time,
            ),
        }
        .map_err(|e| {
            // Only a pod with a lower copy is compared: what fails is carrying its change down.
            let error = match e {
                UpdateError::Translate(e) => SyncError::Invalid(Box::new(e)),
                UpdateError::NotOurs(foreign) => SyncError::Ownership {
                    kind: "Pod",
                    namespace: foreign.namespace,
                    name: foreign.name,
                    cluster: self.lower_cluster(),
                },
            };
            Failure::new(Op::Update, error)
        })?;
        if !matches!(&step, PodStep::Sync { status: Some(s), .. } if may_coalesce(s)) {
            self.held_statuses.release(key);
        }
        if upper.is_none() {
            self.env_sent.remove(key);
        }
        let effects = self.effects(key, step, (upper.as_ref(), lower.as_ref()), now)?;
        Ok(Plan {
            upper,
            lower,
            effects,
        })
    }

    fn effects(
        &mut self,
        key: &Key,
        step: PodStep,
        (upper, lower): (Option<&Pod>, Option<&Pod>),
        now: &Now,
    ) -> Result<Vec<Effect>, Failure> {
        let delete_lower = |l: &Pod, grace, op| Effect::DeleteLower {
            uid: l.metadata.uid.clone(),
            grace,
            op,
        };
        // Each step that needs a pod has it: `pod_step` only returns them when it is there.
        let Some(u) = upper else {
            return Ok(match (step, lower) {
                (PodStep::DeleteLower { grace, .. }, Some(l)) => {
                    vec![delete_lower(l, grace, Op::Other)]
                }
                _ => Vec::new(),
            });
        };
        let status = |patch, why| Effect::PatchUpperStatus { patch, why };
        Ok(match step {
            PodStep::Nothing => Vec::new(),
            PodStep::DeleteLower {
                grace,
                upper_deleting,
            } => {
                let Some(l) = lower else {
                    return Ok(Vec::new());
                };
                // As virtual-kubelet: a failure is on the upper pod, where its owner looks.
                let mut effects = vec![delete_lower(l, grace, Op::Delete)];
                if upper_deleting {
                    effects.push(Effect::Event {
                        reason: EVENT_PROVIDER_DELETE_SUCCESS,
                        note: format!("deleting the pod in lower cluster {}", self.lower_name),
                    });
                }
                effects
            }
            PodStep::FinishUpperDeletion => vec![Effect::ForceDeleteUpper],
            PodStep::NotOffloaded(why) => {
                not_offloaded_conditions(u, REASON_NOT_OFFLOADED, &why.to_string(), &now.time)
                    .map(|conditions| {
                        let patch = json!({"status": {"conditions": conditions}});
                        status(patch, StatusWhy::NotOffloaded)
                    })
                    .into_iter()
                    .collect()
            }
            // Created already; the lower watch will bring the key back when it shows the pod.
            PodStep::Create
                if self.created.pending(
                    key,
                    u.metadata.uid.as_deref().unwrap_or_default(),
                    now.instant,
                ) =>
            {
                Vec::new()
            }
            PodStep::Create => vec![
                Effect::CreateLower,
                Effect::Event {
                    reason: EVENT_PROVIDER_CREATE_SUCCESS,
                    note: format!("created in lower cluster {}", self.lower_name),
                },
            ],
            PodStep::MarkLost(lost) => vec![status(json!({"status": lost}), StatusWhy::Lost)],
            PodStep::Terminate(last) => {
                vec![status(status_merge_patch(u, &last), StatusWhy::Terminated)]
            }
            PodStep::DeleteUpper { grace } => vec![Effect::DeleteUpper { grace }],
            PodStep::Conflict => {
                return Err(Failure::new(
                    Op::Create,
                    SyncError::Ownership {
                        kind: "Pod",
                        namespace: key.namespace.clone(),
                        name: key.name.clone(),
                        cluster: self.lower_cluster(),
                    },
                ));
            }
            // The lower pod's state is unknown: the upper pod is not Ready (nothing else
            // changes).
            PodStep::Sync { .. } if let Some(message) = self.reach.message() => {
                unreachable_conditions(u, &message, &now.time)
                    .map(|conditions| {
                        let patch = json!({"status": {"conditions": conditions}});
                        status(patch, StatusWhy::Unreachable)
                    })
                    .into_iter()
                    .collect()
            }
            PodStep::Sync {
                update,
                status: lower_status,
            } => {
                let mut effects = Vec::new();
                if let Some(patch) = update.patch {
                    effects.push(Effect::PatchLower(patch));
                    effects.push(Effect::Event {
                        reason: EVENT_PROVIDER_UPDATE_SUCCESS,
                        note: "updated the lower pod".into(),
                    });
                }
                if let Some(ephemeral) = update.ephemeral_containers {
                    effects.push(Effect::AddEphemeralContainers(ephemeral));
                }
                if let Some(conditions) = update.gate_conditions {
                    // The lower kubelet counts them into the lower pod's Ready, which then
                    // comes back up.
                    effects.push(Effect::SetLowerConditions(conditions));
                }
                match lower_status {
                    // A Pending status waits a moment for a newer one; the key comes back
                    // when the window is over (asked again at every look: a look in between,
                    // which the queue runs at once, takes the key out of its wait).
                    Some(s) if may_coalesce(&s) => {
                        match self.held_statuses.hold(key, now.instant) {
                            // First: the key comes back whatever the writes before it do.
                            Hold::Newly(left) | Hold::Still(left) => {
                                effects.insert(0, Effect::RequeueAfter(left));
                            }
                            Hold::Over => {
                                effects.push(status(status_merge_patch(u, &s), StatusWhy::Mirror))
                            }
                        }
                    }
                    Some(s) => effects.push(status(status_merge_patch(u, &s), StatusWhy::Mirror)),
                    None => {}
                }
                let deleting = u.metadata.deletion_timestamp.is_some()
                    || lower.is_some_and(|l| l.metadata.deletion_timestamp.is_some());
                if self.translate.upper_api.is_some() && lower.is_some() && !deleting {
                    effects.push(Effect::SyncTokens);
                }
                effects
            }
        })
    }
}

#[cfg(test)]
mod tests {
    //! The pod controller's rules, by applying watch events and asserting the effects: no
    //! cluster, no API server.
    #![allow(clippy::unwrap_used)]
    use super::*;
    use k8s_openapi::api::core::v1::PodStatus;
    use tensile_core::identity::UpperApi;
    use tensile_core::keys::{CONDITION_OFFLOADED, LABEL_OWNER, owner_label_value};
    use tensile_core::status::upper_status;
    use tensile_core::translate::lower_pod;

    const OWNER: &str = "vk";

    fn translate(upper_identity: bool) -> TranslateConfig {
        TranslateConfig {
            owner: OWNER.into(),
            ignore_labels: Vec::new(),
            upper_api: upper_identity.then(|| UpperApi {
                host: "upper.example".into(),
                port: 443,
            }),
        }
    }

    /// An index whose caches have listed nothing yet, as after a start.
    fn index_with(upper_identity: bool) -> PodIndex {
        let mut index = PodIndex::new(
            translate(upper_identity),
            "lower".into(),
            (CompactCache::new(), CompactCache::new()),
            LowerReach::new("lower"),
        );
        for e in [watcher::Event::Init, watcher::Event::InitDone] {
            index.apply_upper(&e);
            index.apply_lower(&e);
        }
        index
    }

    fn index() -> PodIndex {
        index_with(false)
    }

    fn key() -> Key {
        Key::new("default", "web")
    }

    fn now() -> Now {
        Now::system()
    }

    fn upper_pod(uid: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"namespace": "default", "name": "web", "uid": uid},
            "spec": {"nodeName": "vk", "containers": [{"name": "c", "image": "nginx"}]},
            "status": {"phase": "Pending"}
        }))
        .unwrap()
    }

    fn upper() -> Pod {
        upper_pod("u1")
    }

    /// Our lower pod of `u`, as the lower API server shows it.
    fn lower_of(u: &Pod, phase: &str) -> Pod {
        let mut l = lower_pod(u, &translate(false)).unwrap();
        l.metadata.uid = Some("l1".into());
        l.status = Some(PodStatus {
            phase: Some(phase.into()),
            ..PodStatus::default()
        });
        l
    }

    /// `u` as it is once the status of `l` was written up (it records the offload).
    fn offloaded(u: &Pod, l: &Pod) -> Pod {
        let mut u = u.clone();
        u.status = upper_status(&u, l, &now().time);
        u
    }

    fn deleting(mut p: Pod, grace: i64) -> Pod {
        p.metadata.deletion_timestamp = Some(now().time);
        p.metadata.deletion_grace_period_seconds = Some(grace);
        p
    }

    fn apply(p: Pod) -> watcher::Event<Pod> {
        watcher::Event::Apply(p)
    }

    /// Feeds an event of the watch of every lower pod, as the controller does.
    fn lower_event(index: &mut PodIndex, e: watcher::Event<Pod>) -> Vec<Key> {
        index
            .ours(e)
            .map(|e| index.apply_lower(&e))
            .unwrap_or_default()
    }

    fn effects(index: &mut PodIndex, now: &Now) -> Vec<Effect> {
        index.plan(&key(), now).unwrap().effects
    }

    fn statuses(effects: &[Effect]) -> Vec<(StatusWhy, serde_json::Value)> {
        effects
            .iter()
            .filter_map(|e| match e {
                Effect::PatchUpperStatus { patch, why } => Some((*why, patch.clone())),
                _ => None,
            })
            .collect()
    }

    fn event(reason: &'static str, note: &str) -> Effect {
        Effect::Event {
            reason,
            note: note.into(),
        }
    }

    /// The upper watch's event of the status we mirrored (the version our patch got) is not
    /// planned again, and after it, planning it would change nothing; any other version is.
    #[test]
    fn the_event_of_our_own_mirrored_status_is_not_planned_again() {
        let mut index = index();
        let at = |p: &Pod, version: &str| {
            let mut p = p.clone();
            p.metadata.resource_version = Some(version.into());
            p
        };
        let u = upper();
        index.apply_upper(&apply(at(&u, "1")));
        let l = lower_of(&u, "Running");
        lower_event(&mut index, apply(l.clone()));
        let written = statuses(&effects(&mut index, &now()));
        assert_eq!(written.len(), 1);
        assert_eq!(written[0].0, StatusWhy::Mirror);
        // Our patch left the pod at version 2; the watch shows it.
        index.status_written(key(), StatusWhy::Mirror, "2".into());
        let echoed = offloaded(&at(&u, "2"), &l);
        assert_eq!(index.apply_upper(&apply(echoed.clone())), Vec::<Key>::new());
        // Planned anyway, it would write nothing (what makes skipping it safe).
        assert!(statuses(&effects(&mut index, &now())).is_empty());
        // The mark is used once: the next version, whoever wrote it, is planned.
        assert_eq!(index.apply_upper(&apply(at(&echoed, "3"))), [key()]);
        // A version that is not ours (someone else wrote in between) is planned too.
        index.status_written(key(), StatusWhy::Mirror, "5".into());
        assert_eq!(index.apply_upper(&apply(at(&echoed, "4"))), [key()]);
        assert_eq!(index.apply_upper(&apply(at(&echoed, "5"))), [key()]);
        // A pod deleted after our write keeps no mark.
        index.status_written(key(), StatusWhy::Mirror, "6".into());
        index.apply_upper(&watcher::Event::Delete(at(&echoed, "6")));
        assert!(index.mirrored.is_empty());
    }

    #[test]
    fn an_upper_pod_bound_to_the_node_is_created_downstairs_then_told() {
        let mut index = index();
        assert_eq!(index.apply_upper(&apply(upper())), [key()]);
        assert_eq!(
            effects(&mut index, &now()),
            [
                Effect::CreateLower,
                event(
                    EVENT_PROVIDER_CREATE_SUCCESS,
                    "created in lower cluster lower"
                ),
            ]
        );
        // Nothing bound here, nothing to do.
        let other = index.plan(&Key::new("default", "other"), &now());
        assert!(other.unwrap().effects.is_empty());
    }

    #[test]
    fn a_created_pod_the_watch_has_not_shown_is_not_created_twice() {
        let mut index = index();
        let u = upper();
        index.apply_upper(&apply(u.clone()));
        let t0 = now();
        index.created(key(), "u1", t0.instant);
        // Another change of the pod (its Secret's event) comes before the lower watch's.
        assert!(effects(&mut index, &t0).is_empty());
        // A new upper pod of the name is another pod: created.
        index.apply_upper(&apply(upper_pod("u2")));
        assert_eq!(effects(&mut index, &t0)[0], Effect::CreateLower);
        index.apply_upper(&apply(u.clone()));
        // A watch that never shows it holds the pod back only for a while.
        let late = Now {
            instant: t0.instant + CREATED_EXPECTED,
            time: t0.time.clone(),
        };
        assert_eq!(effects(&mut index, &late)[0], Effect::CreateLower);
        // Once the lower watch shows it, the cache is believed: synced, not created.
        index.created(key(), "u1", t0.instant);
        assert_eq!(
            lower_event(&mut index, apply(lower_of(&u, "Running"))),
            [key()]
        );
        let after = effects(&mut index, &t0);
        assert!(!after.contains(&Effect::CreateLower), "{after:?}");
    }

    #[test]
    fn a_running_lower_pod_is_written_up_at_once() {
        let mut index = index();
        let u = upper();
        index.apply_upper(&apply(u.clone()));
        lower_event(&mut index, apply(lower_of(&u, "Running")));
        let effects = effects(&mut index, &now());
        assert!(!effects.iter().any(|e| matches!(e, Effect::RequeueAfter(_))));
        let written = statuses(&effects);
        assert_eq!(written.len(), 1, "{effects:?}");
        assert_eq!(written[0].0, StatusWhy::Mirror);
        assert_eq!(written[0].1["status"]["phase"], "Running");
    }

    #[test]
    fn a_pending_status_waits_its_window_for_a_newer_one() {
        let mut index = index();
        let u = upper();
        index.apply_upper(&apply(u.clone()));
        lower_event(&mut index, apply(lower_of(&u, "Pending")));
        let t0 = now();
        let at = |d: Duration| Now {
            instant: t0.instant + d,
            time: t0.time.clone(),
        };
        // Held: the key comes back when the window is over, nothing is written.
        let first = effects(&mut index, &t0);
        assert_eq!(first, [Effect::RequeueAfter(STATUS_COALESCE)]);
        let again = effects(&mut index, &at(STATUS_COALESCE / 2));
        assert_eq!(again, [Effect::RequeueAfter(STATUS_COALESCE / 2)]);
        // Over: written.
        let over = effects(&mut index, &at(STATUS_COALESCE));
        let written = statuses(&over);
        assert_eq!(written.len(), 1, "{over:?}");
        assert_eq!(written[0].1["status"]["phase"], "Pending");
        // A newer status that is not Pending goes at once, and ends the hold.
        effects(&mut index, &at(STATUS_COALESCE * 2));
        lower_event(&mut index, apply(lower_of(&u, "Running")));
        let running = effects(&mut index, &at(STATUS_COALESCE * 2));
        assert_eq!(statuses(&running)[0].1["status"]["phase"], "Running");
        lower_event(&mut index, apply(lower_of(&u, "Pending")));
        assert_eq!(
            effects(&mut index, &at(STATUS_COALESCE * 2)),
            [Effect::RequeueAfter(STATUS_COALESCE)]
        );
    }

    #[test]
    fn an_upper_pod_being_deleted_takes_its_lower_pod_with_its_grace() {
        let mut index = index();
        let u = upper();
        let l = lower_of(&u, "Running");
        index.apply_upper(&apply(deleting(offloaded(&u, &l), 30)));
        lower_event(&mut index, apply(l.clone()));
        assert_eq!(
            effects(&mut index, &now()),
            [
                Effect::DeleteLower {
                    uid: Some("l1".into()),
                    grace: Some(30),
                    op: Op::Delete,
                },
                event(
                    EVENT_PROVIDER_DELETE_SUCCESS,
                    "deleting the pod in lower cluster lower"
                ),
            ]
        );
        // Being deleted downstairs: wait for it to go.
        lower_event(&mut index, apply(deleting(l.clone(), 30)));
        assert!(effects(&mut index, &now()).is_empty());
        // Gone downstairs before its terminal phase came up: the upper pod is made Failed
        // first, as a kubelet does, then its deletion is finished.
        lower_event(&mut index, watcher::Event::Delete(deleting(l.clone(), 30)));
        let written = statuses(&effects(&mut index, &now()));
        assert_eq!(written.len(), 1, "{written:?}");
        assert_eq!(written[0].0, StatusWhy::Terminated);
        assert_eq!(written[0].1["status"]["phase"], "Failed");
        // The event of that write is planned again (it is not a mirrored status, whose event
        // changes nothing), and finishes the deletion.
        index.status_written(key(), written[0].0, "9".into());
        let mut failed = deleting(offloaded(&u, &l), 30);
        failed.status.as_mut().unwrap().phase = Some("Failed".into());
        failed.metadata.resource_version = Some("9".into());
        assert_eq!(index.apply_upper(&apply(failed)), [key()]);
        assert_eq!(effects(&mut index, &now()), [Effect::ForceDeleteUpper]);
    }

    #[test]
    fn an_upper_pod_gone_at_once_takes_its_lower_pod_with_the_grace_its_last_state_had() {
        let mut index = index();
        let u = upper();
        let l = lower_of(&u, "Running");
        index.apply_upper(&apply(u.clone()));
        lower_event(&mut index, apply(l));
        assert_eq!(
            index.apply_upper(&watcher::Event::Delete(deleting(u, 7))),
            [key()]
        );
        let delete = |grace| Effect::DeleteLower {
            uid: Some("l1".into()),
            grace: Some(grace),
            op: Op::Other,
        };
        assert_eq!(effects(&mut index, &now()), [delete(7)]);
        // The mark is read once: gone without a grace (a forced deletion) is at once.
        assert_eq!(effects(&mut index, &now()), [delete(0)]);
    }

    #[test]
    fn a_lower_pod_that_vanishes_while_its_upper_pod_lives_fails_the_upper_pod() {
        let mut index = index();
        let u = upper();
        let l = lower_of(&u, "Running");
        index.apply_upper(&apply(offloaded(&u, &l)));
        lower_event(&mut index, apply(l.clone()));
        lower_event(&mut index, watcher::Event::Delete(l));
        let effects = effects(&mut index, &now());
        let written = statuses(&effects);
        assert_eq!(written.len(), 1, "{effects:?}");
        assert_eq!(written[0].0, StatusWhy::Lost);
        assert_eq!(written[0].1["status"]["phase"], "Failed");
        // Never created again: its controller replaces it.
        assert!(!effects.contains(&Effect::CreateLower));
    }

    #[test]
    fn a_lower_pod_deleted_downstairs_deletes_the_upper_pod_with_its_grace() {
        let mut index = index();
        let u = upper();
        let l = lower_of(&u, "Running");
        index.apply_upper(&apply(offloaded(&u, &l)));
        lower_event(&mut index, apply(deleting(l, 15)));
        assert_eq!(
            effects(&mut index, &now()),
            [Effect::DeleteUpper { grace: Some(15) }]
        );
    }

    #[test]
    fn a_lower_pod_deleted_downstairs_and_gone_before_the_plan_still_deletes_the_upper_pod() {
        let mut index = index();
        let u = upper();
        let l = lower_of(&u, "Running");
        index.apply_upper(&apply(offloaded(&u, &l)));
        lower_event(&mut index, apply(l.clone()));
        // Marked and removed before the key is planned (one read of the watch brings both).
        let marked = deleting(l, 0);
        lower_event(&mut index, apply(marked.clone()));
        lower_event(&mut index, watcher::Event::Delete(marked));
        assert_eq!(
            effects(&mut index, &now()),
            [Effect::DeleteUpper { grace: Some(0) }]
        );
    }

    /// A mass deletion: every upper pod deleted, each lower pod's removal seen before its key
    /// is planned. The last states kept meanwhile are forgotten as the keys are planned, and
    /// the table they grew is given back (it held a whole `Pod` a bucket: 4.5 MB retained for
    /// good after 1,000 pods, docs/benchmarks.md).
    #[test]
    fn the_last_states_of_a_mass_deletion_are_forgotten_and_their_table_given_back() {
        let mut index = index();
        let named = |i: usize| {
            let mut u = upper_pod(&format!("u{i}"));
            u.metadata.name = Some(format!("web-{i}"));
            u
        };
        for i in 0..1_000 {
            let u = named(i);
            let l = lower_of(&u, "Running");
            index.apply_upper(&apply(offloaded(&u, &l)));
            lower_event(&mut index, apply(l));
        }
        for i in 0..1_000 {
            let u = named(i);
            let l = deleting(lower_of(&u, "Running"), 0);
            index.apply_upper(&watcher::Event::Delete(u));
            lower_event(&mut index, apply(l.clone()));
            lower_event(&mut index, watcher::Event::Delete(l));
        }
        assert_eq!(index.lower_deleted.len(), 1_000);
        for i in 0..1_000 {
            index
                .plan(&Key::new("default", format!("web-{i}")), &now())
                .unwrap();
        }
        assert!(index.lower_deleted.is_empty());
        assert!(
            index.lower_deleted.capacity() <= 128,
            "{}",
            index.lower_deleted.capacity()
        );
    }

    #[test]
    fn a_lower_pod_not_ours_is_never_used_for_an_upper_pod() {
        let mut index = index();
        let u = upper();
        index.apply_upper(&apply(u.clone()));
        let mut foreign = lower_of(&u, "Running");
        foreign.metadata.labels = None;
        // Not ours: the index never holds it, and the pod is to be created (the create then
        // finds the name taken and reports it: never uses it). Nor another node's, listed or
        // changed.
        assert!(lower_event(&mut index, apply(foreign.clone())).is_empty());
        let mut other_node = lower_of(&u, "Running");
        other_node.metadata.labels =
            Some([(LABEL_OWNER.to_owned(), owner_label_value("vk-2"))].into());
        for e in [
            watcher::Event::Init,
            watcher::Event::InitApply(other_node.clone()),
            watcher::Event::InitApply(foreign.clone()),
            watcher::Event::InitDone,
            apply(other_node),
        ] {
            lower_event(&mut index, e);
        }
        assert!(!index.lower_pods().contains("default", "web"));
        assert_eq!(effects(&mut index, &now())[0], Effect::CreateLower);
        // Ours losing our label leaves as a deletion.
        let l = lower_of(&u, "Running");
        lower_event(&mut index, apply(l));
        assert!(index.lower_pods().contains("default", "web"));
        let gone = lower_event(&mut index, apply(foreign.clone()));
        assert_eq!(gone, [key()]);
        assert!(!index.lower_pods().contains("default", "web"));
        // Should one reach the index anyway, it is a conflict, never a sync.
        index.apply_lower(&apply(foreign));
        let failure = index.plan(&key(), &now()).unwrap_err();
        assert_eq!(failure.op, Op::Create);
        assert_eq!(failure.error.kind(), "ownership");
    }

    #[test]
    fn our_lower_pod_of_an_earlier_upper_pod_of_the_name_goes_at_once() {
        let mut index = index();
        let earlier = upper_pod("u0");
        index.apply_upper(&apply(upper_pod("u1")));
        lower_event(&mut index, apply(lower_of(&earlier, "Running")));
        assert_eq!(
            effects(&mut index, &now()),
            [Effect::DeleteLower {
                uid: Some("l1".into()),
                grace: Some(0),
                op: Op::Delete,
            }]
        );
    }

    #[test]
    fn an_unreachable_lower_cluster_makes_its_pods_not_ready_and_nothing_else() {
        let mut index = index();
        let u = upper();
        let l = lower_of(&u, "Running");
        index.apply_upper(&apply(offloaded(&u, &l)));
        lower_event(&mut index, apply(l.clone()));
        index.reach.set(Some("connection refused".into()));
        let effects_down = effects(&mut index, &now());
        let written = statuses(&effects_down);
        assert_eq!(written.len(), 1, "{effects_down:?}");
        assert_eq!(written[0].0, StatusWhy::Unreachable);
        let conditions = written[0].1["status"]["conditions"].as_array().unwrap();
        let ready = conditions.iter().find(|c| c["type"] == "Ready").unwrap();
        assert_eq!(ready["status"], "False");
        assert!(
            ready["message"]
                .as_str()
                .unwrap()
                .contains("lower cluster lower unreachable: connection refused")
        );
        // Back: the lower status is what counts again.
        index.reach.set(None);
        let back = effects(&mut index, &now());
        assert!(
            statuses(&back)
                .iter()
                .all(|(why, _)| *why == StatusWhy::Mirror),
            "{back:?}"
        );
    }

    #[test]
    fn a_pod_that_is_not_offloaded_says_why_once() {
        let mut index = index();
        let mut u = upper();
        u.metadata.namespace = Some("kube-system".into());
        index.apply_upper(&apply(u.clone()));
        let kube_system: Key = Key::new("kube-system", "web");
        let plan = index.plan(&kube_system, &now()).unwrap();
        let written = statuses(&plan.effects);
        assert_eq!(written.len(), 1, "{:?}", plan.effects);
        assert_eq!(written[0].0, StatusWhy::NotOffloaded);
        let condition = &written[0].1["status"]["conditions"][0];
        assert_eq!(condition["type"], CONDITION_OFFLOADED);
        assert_eq!(condition["reason"], REASON_NOT_OFFLOADED);
        // Once it says so, nothing more.
        u.status = serde_json::from_value(written[0].1["status"].clone()).unwrap();
        index.apply_upper(&apply(u));
        assert!(index.plan(&kube_system, &now()).unwrap().effects.is_empty());
    }

    #[test]
    fn a_change_of_the_upper_pod_goes_down_before_its_event() {
        let mut index = index();
        let u = upper();
        let l = lower_of(&u, "Running");
        let mut changed = offloaded(&u, &l);
        changed.metadata.labels = Some([("tier".into(), "web".into())].into());
        index.apply_upper(&apply(changed));
        lower_event(&mut index, apply(l));
        let effects = effects(&mut index, &now());
        let patch = effects.iter().position(
            |e| matches!(e, Effect::PatchLower(p) if p["metadata"]["labels"]["tier"] == "web"),
        );
        let told = effects
            .iter()
            .position(|e| *e == event(EVENT_PROVIDER_UPDATE_SUCCESS, "updated the lower pod"));
        assert!(
            matches!((patch, told), (Some(p), Some(t)) if p < t),
            "{effects:?}"
        );
        // The owner label stays ours: the patch never touches it.
        let Some(Effect::PatchLower(p)) = patch.map(|i| &effects[i]) else {
            unreachable!()
        };
        assert!(p["metadata"]["labels"].get(LABEL_OWNER).is_none());
    }

    #[test]
    fn tokens_are_kept_current_only_with_upper_identity_and_not_while_deleting() {
        let has_tokens = |upper_identity: bool, lower: Pod| {
            let mut index = index_with(upper_identity);
            let u = upper();
            index.apply_upper(&apply(offloaded(&u, &lower_of(&u, "Running"))));
            lower_event(&mut index, apply(lower));
            effects(&mut index, &now()).contains(&Effect::SyncTokens)
        };
        let u = upper();
        assert!(has_tokens(true, lower_of(&u, "Running")));
        assert!(!has_tokens(false, lower_of(&u, "Running")));
        // Being deleted downstairs: the upper pod is deleted, no token is written.
        assert!(!has_tokens(true, deleting(lower_of(&u, "Running"), 30)));
        // A new pod's tokens are written by its creation, not by this effect.
        let mut index = index_with(true);
        index.apply_upper(&apply(u));
        assert!(!effects(&mut index, &now()).contains(&Effect::SyncTokens));
    }

    #[test]
    fn an_environment_event_is_sent_once_per_change_not_per_retry() {
        let mut index = index();
        let missing = |what: &str| EnvEvent {
            reason: "ConfigMapNotFound",
            message: what.into(),
        };
        let k = key();
        assert_eq!(
            index.env_events_to_send(&k, "u1", vec![missing("a")]),
            [missing("a")]
        );
        // The retry finds the same: nothing; a new one: only it.
        assert!(
            index
                .env_events_to_send(&k, "u1", vec![missing("a")])
                .is_empty()
        );
        assert_eq!(
            index.env_events_to_send(&k, "u1", vec![missing("a"), missing("b")]),
            [missing("b")]
        );
        // A new pod of the name is told again.
        assert_eq!(
            index.env_events_to_send(&k, "u2", vec![missing("a")]),
            [missing("a")]
        );
        // Resolved, then missing again: told again.
        assert!(index.env_events_to_send(&k, "u2", Vec::new()).is_empty());
        assert_eq!(
            index.env_events_to_send(&k, "u2", vec![missing("a")]),
            [missing("a")]
        );
        // The upper pod gone: forgotten with it.
        index.plan(&k, &now()).unwrap();
        assert_eq!(
            index.env_events_to_send(&k, "u2", vec![missing("a")]),
            [missing("a")]
        );
    }
}
