//! The invariant checker of `tensile bench chaos`: an index that applies what the benchmark's
//! own watches of both clusters saw (never the product's metrics) and what the churn did, and
//! answers the violations. Times are seconds from the start of the run, as the watch saw
//! them. A pure module: the runner feeds it; its rules are unit tests on made-up histories.
//!
//! What it checks (docs/benchmarks.md, "bench chaos"):
//! - every upper pod bound to a virtual node has exactly one lower pod, eventually (a finished
//!   one at most one), and never one in two lower clusters;
//! - no lower pod of ours is deleted unless its upper pod was deleted (or the churn deleted it
//!   downstairs);
//! - no upper pod is failed, evicted or deleted but by its user or controller, or as
//!   documented (its lower pod deleted downstairs, or lost: `LowerPodLost`);
//! - statuses upstairs converge to the lower ones within 30 s of the last fault;
//! - no copy of ours (ConfigMap, Secret, Service) outlives what needs it by 60 s after the
//!   last fault;
//! - no lower object that is not ours is changed or deleted.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use tensile_core::keys::{
    ANNOTATION_UNSCHEDULABLE_NODE, ANNOTATION_UPPER_UID, LABEL_IDENTITY_OF, LABEL_OWNER,
    REASON_LOWER_POD_LOST,
};

/// Seconds from the start of the run.
pub(crate) type Secs = f64;

/// How long a deletion or failure waits for what explains it (the other cluster's watch may
/// lag) before it is judged.
pub(crate) const GRACE: Secs = 30.0;
/// Statuses must have converged this long after the last fault.
pub(crate) const CONVERGE_WITHIN: Secs = 30.0;
/// Copies no pod needs must be gone this long after the last fault.
pub(crate) const ORPHANS_GONE_WITHIN: Secs = 60.0;
/// A scale-down explains the deletion of its pods this long after it.
const SCALE_DOWN_WINDOW: Secs = 120.0;

/// The kinds the checker follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Kind {
    Pod,
    ConfigMap,
    Secret,
    Service,
}

/// An object as a watch saw it; `cluster` 0 is the upper one, `i` lower cluster `i`.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Obj {
    pub cluster: usize,
    pub kind: Kind,
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub resource_version: String,
    /// Our owner label.
    pub owner: Option<String>,
    /// Our upper-uid annotation.
    pub upper_uid: Option<String>,
    /// Of a pod's identity Secret: the upper pod's uid (its identity-of label).
    pub identity_of: Option<String>,
    pub deleting: bool,
    pub pod: Option<PodFacts>,
}

/// What the checker reads of a pod.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct PodFacts {
    /// `spec.nodeName`.
    pub node: Option<String>,
    pub phase: String,
    /// `status.reason`.
    pub reason: Option<String>,
    /// Its Ready condition is True.
    pub ready: bool,
    /// Its `app` label: the churn's workload.
    pub app: Option<String>,
    /// The descheduler moved it (its `unschedulable-node` annotation).
    pub descheduled: bool,
    /// The ConfigMaps and Secrets it needs (core's rule).
    pub needs: BTreeSet<(Kind, String)>,
}

impl Obj {
    /// A pod of `cluster`.
    pub(crate) fn pod(cluster: usize, pod: &Pod) -> Self {
        let status = pod.status.as_ref();
        let meta = &pod.metadata;
        let deps = tensile_core::deps::pod_dependencies(pod);
        let needs = deps
            .config_maps
            .into_keys()
            .map(|n| (Kind::ConfigMap, n))
            .chain(deps.secrets.into_keys().map(|n| (Kind::Secret, n)))
            .collect();
        let facts = PodFacts {
            node: pod.spec.as_ref().and_then(|s| s.node_name.clone()),
            phase: status
                .and_then(|s| s.phase.clone())
                .unwrap_or_else(|| "Pending".into()),
            reason: status.and_then(|s| s.reason.clone()),
            ready: status
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True")),
            app: label(meta, "app"),
            descheduled: meta
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key(ANNOTATION_UNSCHEDULABLE_NODE)),
            needs,
        };
        Self {
            pod: Some(facts),
            ..Self::meta(cluster, Kind::Pod, meta)
        }
    }

    /// An object of another kind, by its metadata.
    pub(crate) fn meta(cluster: usize, kind: Kind, meta: &ObjectMeta) -> Self {
        Self {
            cluster,
            kind,
            namespace: meta.namespace.clone().unwrap_or_default(),
            name: meta.name.clone().unwrap_or_default(),
            uid: meta.uid.clone().unwrap_or_default(),
            resource_version: meta.resource_version.clone().unwrap_or_default(),
            owner: label(meta, LABEL_OWNER),
            upper_uid: meta
                .annotations
                .as_ref()
                .and_then(|a| a.get(ANNOTATION_UPPER_UID).cloned()),
            identity_of: label(meta, LABEL_IDENTITY_OF),
            deleting: meta.deletion_timestamp.is_some(),
            pod: None,
        }
    }

    fn key(&self) -> ObjKey {
        (
            self.cluster,
            self.kind,
            self.namespace.clone(),
            self.name.clone(),
        )
    }

    fn status(&self) -> Option<(&str, bool)> {
        self.pod.as_ref().map(|p| (p.phase.as_str(), p.ready))
    }

    /// How it reads in a violation: `lower-1 pod chaos/web-abc (uid 1234)`.
    fn describe(&self) -> String {
        describe(
            self.cluster,
            self.kind,
            &self.namespace,
            &self.name,
            &self.uid,
        )
    }
}

fn label(meta: &ObjectMeta, key: &str) -> Option<String> {
    meta.labels.as_ref().and_then(|l| l.get(key).cloned())
}

fn describe(cluster: usize, kind: Kind, namespace: &str, name: &str, uid: &str) -> String {
    let cluster = if cluster == 0 {
        "upper".to_owned()
    } else {
        format!("lower-{cluster}")
    };
    format!("{cluster} {kind:?} {namespace}/{name} (uid {uid})")
}

type ObjKey = (usize, Kind, String, String);

/// What a watch saw.
#[derive(Clone, Debug)]
pub(crate) enum Seen {
    /// Created or changed (or listed).
    Applied(Obj),
    /// Deleted, as last seen.
    Deleted(Obj),
    /// A watch listed again: of its cluster and kind, only these (namespace, name) are left;
    /// any other it had is gone.
    Relisted {
        cluster: usize,
        kind: Kind,
        present: BTreeSet<(String, String)>,
    },
    /// An upper Event saying a pod was evicted.
    Evicted { namespace: String, name: String },
}

/// What the churn did, told before its call is made.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Action {
    /// An upper pod deleted by its user.
    DeletedUpper { namespace: String, name: String },
    /// A lower pod deleted by someone of the lower cluster.
    DeletedLower {
        cluster: usize,
        namespace: String,
        name: String,
    },
    /// A Deployment (its pods labelled `app`) scaled down.
    ScaledDown { namespace: String, app: String },
    /// A workload (a Job) deleted, its pods with it.
    DeletedWorkload { namespace: String, app: String },
}

/// An invariant broken.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub(crate) struct Violation {
    /// When it was seen (or judged).
    pub at: Secs,
    /// The object.
    pub object: String,
    /// What is wrong.
    pub what: String,
}

/// One upper pod's life.
#[derive(Debug)]
struct UpperPod {
    last: Obj,
    deleting_at: Option<Secs>,
    gone_at: Option<Secs>,
    failed_at: Option<Secs>,
    /// Since when its status differs from its lower pod's (while both exist).
    differs_since: Option<Secs>,
}

/// One lower pod of ours.
#[derive(Debug)]
struct LowerPod {
    last: Obj,
    deleting_at: Option<Secs>,
    gone_at: Option<Secs>,
    ever_failed: bool,
}

/// Something to judge once its grace is over.
#[derive(Debug, Clone)]
enum Pending {
    LowerDeleted {
        lower_key: ObjKey,
        lower_uid: String,
    },
    UpperDeleted {
        uid: String,
    },
    UpperFailed {
        uid: String,
    },
}

/// The checker's index.
#[derive(Debug, Default)]
pub(crate) struct Checker {
    /// Virtual node name -> its lower cluster.
    nodes: BTreeMap<String, usize>,
    /// The owner label values that are ours.
    owners: BTreeSet<String>,
    /// Every object as last seen, by cluster, kind, namespace and name.
    objects: BTreeMap<ObjKey, Obj>,
    upper_pods: BTreeMap<String, UpperPod>,
    /// Lower pods of ours by their own (cluster, uid).
    lower_pods: BTreeMap<(usize, String), LowerPod>,
    /// The same, by the upper pod's uid they name.
    lower_by_upper: BTreeMap<String, BTreeSet<(usize, String)>>,
    /// Lower objects that are not ours, as first seen: (uid, resourceVersion).
    foreign: BTreeMap<ObjKey, (String, String)>,
    actions: Vec<(Secs, Action)>,
    pending: Vec<(Secs, Pending)>,
    violations: Vec<Violation>,
    /// Status convergences: (statuses began to differ, agreed again).
    convergences: Vec<(Secs, Secs)>,
    /// Upper pods failed with `LowerPodLost` (documented), judged.
    pub(crate) lower_pod_lost: usize,
    /// Upper pods created (seen for the first time).
    pub(crate) upper_pods_seen: usize,
}

impl Checker {
    /// A checker for these virtual nodes: (node name, its lower cluster, its owner label).
    pub(crate) fn new(nodes: &[(String, usize, String)]) -> Self {
        Self {
            nodes: nodes.iter().map(|(n, c, _)| (n.clone(), *c)).collect(),
            owners: nodes.iter().map(|(_, _, o)| o.clone()).collect(),
            ..Self::default()
        }
    }

    /// The churn is about to do `action`.
    pub(crate) fn act(&mut self, at: Secs, action: Action) {
        self.actions.push((at, action));
    }

    /// Applies what a watch saw; judges what waited out its grace.
    pub(crate) fn apply(&mut self, at: Secs, seen: Seen) {
        match seen {
            Seen::Applied(obj) => self.applied(at, obj),
            Seen::Deleted(obj) => self.deleted(at, obj),
            Seen::Relisted {
                cluster,
                kind,
                present,
            } => {
                let gone: Vec<Obj> = self
                    .objects
                    .values()
                    .filter(|o| {
                        o.cluster == cluster
                            && o.kind == kind
                            && !present.contains(&(o.namespace.clone(), o.name.clone()))
                    })
                    .cloned()
                    .collect();
                for obj in gone {
                    self.deleted(at, obj);
                }
            }
            Seen::Evicted { namespace, name } => {
                let descheduled = self
                    .objects
                    .get(&(0, Kind::Pod, namespace.clone(), name.clone()))
                    .and_then(|o| o.pod.as_ref())
                    .is_some_and(|p| p.descheduled);
                if !descheduled {
                    self.violations.push(Violation {
                        at,
                        object: describe(0, Kind::Pod, &namespace, &name, "-"),
                        what: "an upper pod was evicted".into(),
                    });
                }
            }
        }
        self.judge(at);
    }

    fn ours(&self, obj: &Obj) -> bool {
        obj.owner.as_ref().is_some_and(|o| self.owners.contains(o))
    }

    fn applied(&mut self, at: Secs, obj: Obj) {
        let key = obj.key();
        // A new object under a known name: the old one went unseen.
        if let Some(old) = self.objects.get(&key)
            && old.uid != obj.uid
        {
            let old = old.clone();
            self.deleted(at, old);
        }
        if obj.cluster > 0 && !self.ours(&obj) {
            self.foreign_written(at, &obj);
        }
        self.objects.insert(key, obj.clone());
        if obj.kind != Kind::Pod {
            return;
        }
        if obj.cluster == 0 {
            self.upper_pod(at, obj);
        } else if self.ours(&obj) {
            self.lower_pod(at, obj);
        }
    }

    /// A lower object that is not ours: its first sight is its baseline; a change is a
    /// violation.
    fn foreign_written(&mut self, at: Secs, obj: &Obj) {
        let key = obj.key();
        match self.foreign.get(&key) {
            None => {
                self.foreign
                    .insert(key, (obj.uid.clone(), obj.resource_version.clone()));
            }
            Some((uid, rv)) if *uid == obj.uid && *rv != obj.resource_version => {
                self.violations.push(Violation {
                    at,
                    object: obj.describe(),
                    what: "a lower object that is not ours was changed".into(),
                });
                self.foreign
                    .insert(key, (obj.uid.clone(), obj.resource_version.clone()));
            }
            Some(_) => {
                self.foreign
                    .insert(key, (obj.uid.clone(), obj.resource_version.clone()));
            }
        }
    }

    fn upper_pod(&mut self, at: Secs, obj: Obj) {
        let uid = obj.uid.clone();
        let first = !self.upper_pods.contains_key(&uid);
        if first {
            self.upper_pods_seen += 1;
        }
        let record = self.upper_pods.entry(uid.clone()).or_insert(UpperPod {
            last: obj.clone(),
            deleting_at: None,
            gone_at: None,
            failed_at: None,
            differs_since: None,
        });
        record.last = obj.clone();
        if obj.deleting && record.deleting_at.is_none() {
            record.deleting_at = Some(at);
            self.pending
                .push((at, Pending::UpperDeleted { uid: uid.clone() }));
        }
        let failed = obj.pod.as_ref().is_some_and(|p| p.phase == "Failed");
        let record = self.upper_pods.get_mut(&uid);
        if let Some(record) = record
            && failed
            && record.failed_at.is_none()
        {
            record.failed_at = Some(at);
            self.pending
                .push((at, Pending::UpperFailed { uid: uid.clone() }));
        }
        self.converge(at, &uid);
    }

    fn lower_pod(&mut self, at: Secs, obj: Obj) {
        let id = (obj.cluster, obj.uid.clone());
        if let Some(upper_uid) = &obj.upper_uid {
            self.lower_by_upper
                .entry(upper_uid.clone())
                .or_default()
                .insert(id.clone());
        }
        let record = self.lower_pods.entry(id).or_insert(LowerPod {
            last: obj.clone(),
            deleting_at: None,
            gone_at: None,
            ever_failed: false,
        });
        record.last = obj.clone();
        record.ever_failed |= obj.pod.as_ref().is_some_and(|p| p.phase == "Failed");
        if obj.deleting && record.deleting_at.is_none() {
            record.deleting_at = Some(at);
            self.pending.push((
                at,
                Pending::LowerDeleted {
                    lower_key: obj.key(),
                    lower_uid: obj.uid.clone(),
                },
            ));
        }
        // Two live lower pods of one upper pod, in two lower clusters.
        if let Some(upper_uid) = &obj.upper_uid {
            let live: BTreeSet<usize> = self
                .lowers_of(upper_uid)
                .iter()
                .map(|l| l.last.cluster)
                .collect();
            if live.len() > 1 {
                self.violations.push(Violation {
                    at,
                    object: obj.describe(),
                    what: format!("one upper pod has lower pods in lower clusters {live:?}"),
                });
            }
            let upper_uid = upper_uid.clone();
            self.converge(at, &upper_uid);
        }
    }

    fn deleted(&mut self, at: Secs, obj: Obj) {
        let key = obj.key();
        if self.objects.get(&key).is_some_and(|o| o.uid == obj.uid) {
            self.objects.remove(&key);
        }
        if obj.cluster > 0 && !self.ours(&obj) {
            self.violations.push(Violation {
                at,
                object: obj.describe(),
                what: "a lower object that is not ours was deleted".into(),
            });
            self.foreign.remove(&key);
            return;
        }
        if obj.kind != Kind::Pod {
            return;
        }
        if obj.cluster == 0 {
            if let Some(record) = self.upper_pods.get_mut(&obj.uid)
                && record.gone_at.is_none()
            {
                record.gone_at = Some(at);
                record.differs_since = None;
                if record.deleting_at.is_none() {
                    record.deleting_at = Some(at);
                    self.pending.push((
                        at,
                        Pending::UpperDeleted {
                            uid: obj.uid.clone(),
                        },
                    ));
                }
            }
        } else if let Some(record) = self.lower_pods.get_mut(&(obj.cluster, obj.uid.clone()))
            && record.gone_at.is_none()
        {
            record.gone_at = Some(at);
            if record.deleting_at.is_none() {
                record.deleting_at = Some(at);
                self.pending.push((
                    at,
                    Pending::LowerDeleted {
                        lower_key: key,
                        lower_uid: obj.uid.clone(),
                    },
                ));
            }
            if let Some(upper) = obj
                .upper_uid
                .as_ref()
                .and_then(|u| self.upper_pods.get_mut(u))
            {
                upper.differs_since = None;
            }
        }
    }

    /// The live lower pods of upper pod `uid`.
    fn lowers_of(&self, uid: &str) -> Vec<&LowerPod> {
        self.all_lowers_of(uid)
            .into_iter()
            .filter(|l| l.gone_at.is_none())
            .collect()
    }

    /// Every lower pod of upper pod `uid`, gone or not.
    fn all_lowers_of(&self, uid: &str) -> Vec<&LowerPod> {
        self.lower_by_upper
            .get(uid)
            .into_iter()
            .flatten()
            .filter_map(|id| self.lower_pods.get(id))
            .collect()
    }

    /// Follows whether upper pod `uid`'s status agrees with its lower pod's.
    fn converge(&mut self, at: Secs, uid: &str) {
        let lower_status = {
            let lowers = self.lowers_of(uid);
            match lowers.as_slice() {
                [one] if !one.last.deleting => one.last.status().map(|(p, r)| (p.to_owned(), r)),
                _ => None,
            }
        };
        let Some(upper) = self.upper_pods.get_mut(uid) else {
            return;
        };
        let measured = upper.gone_at.is_none() && !upper.last.deleting;
        match (lower_status, measured) {
            (Some(lower), true) => {
                let agrees = upper
                    .last
                    .status()
                    .is_some_and(|(p, r)| p == lower.0 && r == lower.1);
                match (agrees, upper.differs_since) {
                    (true, Some(since)) => {
                        self.convergences.push((since, at));
                        upper.differs_since = None;
                    }
                    (false, None) => upper.differs_since = Some(at),
                    _ => {}
                }
            }
            _ => upper.differs_since = None,
        }
    }

    /// Judges what has waited out its grace by `now`.
    fn judge(&mut self, now: Secs) {
        let (due, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut self.pending)
            .into_iter()
            .partition(|(at, _)| now - at >= GRACE);
        self.pending = waiting;
        for (at, p) in due {
            if let Some(v) = self.verdict(at, &p) {
                self.violations.push(v);
            }
        }
    }

    /// Whether the churn did `action` at or before `at`.
    fn did(&self, at: Secs, action: impl Fn(&Action) -> bool) -> bool {
        self.actions
            .iter()
            .any(|(t, a)| *t <= at + 1.0 && action(a))
    }

    fn verdict(&mut self, at: Secs, pending: &Pending) -> Option<Violation> {
        match pending {
            Pending::LowerDeleted {
                lower_key,
                lower_uid,
            } => {
                let (cluster, _, namespace, name) = lower_key;
                if self.did(at, |a| {
                    matches!(a, Action::DeletedLower { cluster: c, namespace: n, name: m }
                        if c == cluster && n == namespace && m == name)
                }) {
                    return None;
                }
                let record = self.lower_pods.get(&(*cluster, lower_uid.clone()))?;
                let upper_uid = record.last.upper_uid.clone()?;
                let upper_went = self
                    .upper_pods
                    .get(&upper_uid)
                    .is_none_or(|u| u.deleting_at.is_some() || u.gone_at.is_some());
                (!upper_went).then(|| Violation {
                    at,
                    object: record.last.describe(),
                    what: "a lower pod of ours was deleted while its upper pod was not".into(),
                })
            }
            Pending::UpperDeleted { uid } => {
                let upper = self.upper_pods.get(uid)?;
                let obj = &upper.last;
                let facts = obj.pod.clone().unwrap_or_default();
                let (namespace, name) = (&obj.namespace, &obj.name);
                let app = facts.app.as_deref();
                let by_user = self.did(at, |a| match a {
                    Action::DeletedUpper {
                        namespace: n,
                        name: m,
                    } => n == namespace && m == name,
                    Action::DeletedLower {
                        namespace: n,
                        name: m,
                        ..
                    } => n == namespace && m == name,
                    Action::DeletedWorkload {
                        namespace: n,
                        app: w,
                    } => n == namespace && Some(w.as_str()) == app,
                    Action::ScaledDown { .. } => false,
                });
                let scaled_down = self.actions.iter().any(|(t, a)| {
                    matches!(a, Action::ScaledDown { namespace: n, app: w }
                        if n == namespace && Some(w.as_str()) == app)
                        && *t <= at + 1.0
                        && at - t <= SCALE_DOWN_WINDOW
                });
                // Its lower pod went first: deleted downstairs or lost (documented; a
                // deletion of ours that should not have been is the lower pod's violation).
                let lower_went_first = self
                    .all_lowers_of(uid)
                    .iter()
                    .any(|l| l.deleting_at.is_some_and(|t| t <= at));
                let ok = by_user || scaled_down || facts.descheduled || lower_went_first;
                (!ok).then(|| Violation {
                    at,
                    object: obj.describe(),
                    what: "an upper pod was deleted, not by its user or controller".into(),
                })
            }
            Pending::UpperFailed { uid } => {
                let upper = self.upper_pods.get(uid)?;
                let obj = upper.last.clone();
                let deleting_first = upper.deleting_at.is_some_and(|t| t <= at);
                let lost = obj
                    .pod
                    .as_ref()
                    .is_some_and(|p| p.reason.as_deref() == Some(REASON_LOWER_POD_LOST));
                let lowers = self.all_lowers_of(uid);
                let lower_failed = lowers.iter().any(|l| l.ever_failed);
                let lower_live = lowers.iter().any(|l| l.gone_at.is_none());
                if deleting_first || lower_failed {
                    return None;
                }
                if lost && !lower_live {
                    self.lower_pod_lost += 1;
                    return None;
                }
                Some(Violation {
                    at,
                    object: obj.describe(),
                    what: if lost {
                        "an upper pod was failed LowerPodLost while its lower pod exists".into()
                    } else {
                        "an upper pod was failed while its lower pod had not failed".into()
                    },
                })
            }
        }
    }

    /// Judges what has waited out its grace by `now` (what the watches apply does too).
    pub(crate) fn tick(&mut self, now: Secs) {
        self.judge(now);
    }

    /// The live pods of `cluster` (upstairs every one, downstairs ours), not being deleted:
    /// (namespace, name).
    pub(crate) fn live_pods(&self, cluster: usize) -> Vec<(String, String)> {
        self.objects
            .values()
            .filter(|o| {
                o.cluster == cluster
                    && o.kind == Kind::Pod
                    && !o.deleting
                    && (cluster == 0 || self.ours(o))
            })
            .map(|o| (o.namespace.clone(), o.name.clone()))
            .collect()
    }

    /// Violations found so far (pending ones not judged yet).
    pub(crate) fn violations(&self) -> &[Violation] {
        &self.violations
    }

    /// What is not settled at `now`: upper pods bound to a virtual node without exactly one
    /// lower pod, statuses that differ, copies no pod needs. Empty when the run may end.
    pub(crate) fn unsettled(&self, now: Secs) -> Vec<Violation> {
        let mut out = Vec::new();
        for (uid, upper) in &self.upper_pods {
            let obj = &upper.last;
            let Some(facts) = &obj.pod else { continue };
            let Some(cluster) = facts.node.as_ref().and_then(|n| self.nodes.get(n)) else {
                continue;
            };
            if upper.gone_at.is_some()
                || obj.deleting
                || facts.reason.as_deref() == Some(REASON_LOWER_POD_LOST)
            {
                continue;
            }
            let lowers = self.lowers_of(uid);
            let here = lowers.iter().filter(|l| l.last.cluster == *cluster).count();
            // A finished pod needs nothing below: its lower pod, deleted there, is not made
            // again (what a kubelet does for a finished pod whose containers went).
            let finished = matches!(facts.phase.as_str(), "Succeeded" | "Failed");
            let wanted = if finished { 0..=1 } else { 1..=1 };
            if !wanted.contains(&here) || lowers.len() != here {
                out.push(Violation {
                    at: now,
                    object: obj.describe(),
                    what: format!(
                        "an upper pod bound to {} has {here} lower pods there and {} elsewhere",
                        facts.node.as_deref().unwrap_or_default(),
                        lowers.len() - here
                    ),
                });
            }
            if let Some(since) = upper.differs_since {
                out.push(Violation {
                    at: now,
                    object: obj.describe(),
                    what: format!(
                        "its status upstairs ({:?}) differs from the lower pod's since {since:.1} s",
                        obj.status()
                    ),
                });
            }
        }
        // Copies: ConfigMaps and Secrets a pod of that node needs, Services that exist upstairs.
        for obj in self.objects.values() {
            if obj.cluster == 0 || obj.kind == Kind::Pod || !self.ours(obj) {
                continue;
            }
            let needed = match obj.kind {
                Kind::Service => self.objects.contains_key(&(
                    0,
                    Kind::Service,
                    obj.namespace.clone(),
                    obj.name.clone(),
                )),
                _ => self.needed(obj),
            };
            if !needed {
                out.push(Violation {
                    at: now,
                    object: obj.describe(),
                    what: "a copy of ours that nothing needs".into(),
                });
            }
        }
        out
    }

    /// Whether a pod of `copy`'s lower cluster, upstairs or downstairs, needs it. A pod's
    /// identity Secret (its upper credentials, docs/virtual-node.md): while its lower pod
    /// lives, or its upper pod runs.
    fn needed(&self, copy: &Obj) -> bool {
        if let Some(uid) = &copy.identity_of {
            let running = self.upper_pods.get(uid).is_some_and(|u| {
                u.gone_at.is_none()
                    && !u.last.deleting
                    && u.last
                        .pod
                        .as_ref()
                        .is_none_or(|p| !matches!(p.phase.as_str(), "Succeeded" | "Failed"))
            });
            return running || !self.lowers_of(uid).is_empty();
        }
        let wanted = (copy.kind, copy.name.clone());
        let needs = |o: &Obj| {
            o.namespace == copy.namespace
                && o.pod.as_ref().is_some_and(|p| p.needs.contains(&wanted))
        };
        let upstairs = self.upper_pods.values().any(|u| {
            u.gone_at.is_none()
                && u.last
                    .pod
                    .as_ref()
                    .and_then(|p| p.node.as_ref())
                    .and_then(|n| self.nodes.get(n))
                    == Some(&copy.cluster)
                && needs(&u.last)
        });
        let downstairs = self
            .lower_pods
            .values()
            .any(|l| l.gone_at.is_none() && l.last.cluster == copy.cluster && needs(&l.last));
        upstairs || downstairs
    }

    /// The end of the run at `now`, the last fault having ended at `last_fault_end`: judges
    /// everything pending, then what is not settled; answers every violation.
    pub(crate) fn finish(&mut self, now: Secs, last_fault_end: Secs) -> Vec<Violation> {
        for (at, p) in std::mem::take(&mut self.pending) {
            if let Some(v) = self.verdict(at, &p) {
                self.violations.push(v);
            }
        }
        let mut out = self.violations.clone();
        out.extend(self.unsettled(now));
        for (since, agreed) in &self.convergences {
            if *agreed > last_fault_end + CONVERGE_WITHIN && agreed - since > CONVERGE_WITHIN {
                out.push(Violation {
                    at: *agreed,
                    object: "an upper pod's status".into(),
                    what: format!(
                        "converged {:.1} s after the last fault (differed from {since:.1} s)",
                        agreed - last_fault_end
                    ),
                });
            }
        }
        out.sort_by(|a, b| a.at.total_cmp(&b.at));
        out
    }

    /// The longest a status took to converge, including those still differing at `now`.
    pub(crate) fn worst_convergence(&self, now: Secs) -> Secs {
        self.spans(now)
            .map(|(since, to)| to - since)
            .fold(0.0, f64::max)
    }

    fn spans(&self, now: Secs) -> impl Iterator<Item = (Secs, Secs)> + '_ {
        self.convergences.iter().copied().chain(
            self.upper_pods
                .values()
                .filter_map(move |u| u.differs_since.map(|s| (s, now))),
        )
    }

    /// The longest convergence overlapping each kind of fault (`windows`: kind, from, to),
    /// and `none` for those overlapping no fault.
    pub(crate) fn slowest_by_fault(
        &self,
        now: Secs,
        windows: &[(String, Secs, Secs)],
    ) -> BTreeMap<String, Secs> {
        let mut out: BTreeMap<String, Secs> = BTreeMap::new();
        for (since, to) in self.spans(now) {
            let mut any = false;
            for (kind, from, until) in windows {
                if *from <= to && since <= *until {
                    any = true;
                    let slot = out.entry(kind.clone()).or_default();
                    *slot = slot.max(to - since);
                }
            }
            if !any {
                let slot = out.entry("none".into()).or_default();
                *slot = slot.max(to - since);
            }
        }
        out
    }

    /// What the churn did to the pod a violation names (or to its workload), one line each:
    /// what a reader of the violation needs beside the faults around it.
    pub(crate) fn churn_about(&self, v: &Violation) -> Vec<String> {
        let Some(pod) = v
            .object
            .split_once('/')
            .and_then(|(_, rest)| rest.split(' ').next())
        else {
            return Vec::new();
        };
        self.actions
            .iter()
            .filter(|(_, a)| match a {
                Action::DeletedUpper { name, .. } | Action::DeletedLower { name, .. } => {
                    name == pod
                }
                Action::ScaledDown { app, .. } | Action::DeletedWorkload { app, .. } => pod
                    .strip_prefix(app.as_str())
                    .is_some_and(|rest| rest.starts_with('-')),
            })
            .map(|(at, a)| format!("{at:.1} s {a:?}"))
            .collect()
    }

    /// Status convergences measured.
    pub(crate) fn convergences(&self) -> usize {
        self.convergences.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NODE: &str = "vk-1";

    fn checker() -> Checker {
        Checker::new(&[
            ("vk-1".into(), 1, "vk-1".into()),
            ("vk-2".into(), 2, "vk-2".into()),
        ])
    }

    fn upper(name: &str, phase: &str, ready: bool) -> Obj {
        Obj {
            cluster: 0,
            kind: Kind::Pod,
            namespace: "chaos".into(),
            name: name.into(),
            uid: format!("u-{name}"),
            resource_version: "1".into(),
            owner: None,
            upper_uid: None,
            identity_of: None,
            deleting: false,
            pod: Some(PodFacts {
                node: Some(NODE.into()),
                phase: phase.into(),
                ready,
                app: Some("web".into()),
                needs: [(Kind::ConfigMap, "conf".into())].into(),
                ..PodFacts::default()
            }),
        }
    }

    fn lower(name: &str, phase: &str, ready: bool) -> Obj {
        Obj {
            cluster: 1,
            uid: format!("l-{name}"),
            owner: Some(NODE.into()),
            upper_uid: Some(format!("u-{name}")),
            ..upper(name, phase, ready)
        }
    }

    fn deleting(mut o: Obj) -> Obj {
        o.deleting = true;
        o
    }

    fn copy(kind: Kind, name: &str) -> Obj {
        Obj {
            cluster: 1,
            kind,
            namespace: "chaos".into(),
            name: name.into(),
            uid: format!("c-{name}"),
            resource_version: "1".into(),
            owner: Some(NODE.into()),
            upper_uid: Some("x".into()),
            identity_of: None,
            deleting: false,
            pod: None,
        }
    }

    /// A pod's whole life, as it should go: created, offloaded, Running, deleted upstairs.
    fn clean_life(c: &mut Checker, name: &str, from: Secs) {
        c.apply(from, Seen::Applied(upper(name, "Pending", false)));
        c.apply(from + 1.0, Seen::Applied(lower(name, "Pending", false)));
        c.apply(from + 2.0, Seen::Applied(lower(name, "Running", true)));
        c.apply(from + 3.0, Seen::Applied(upper(name, "Running", true)));
    }

    fn whats(v: &[Violation]) -> Vec<&str> {
        v.iter().map(|v| v.what.as_str()).collect()
    }

    #[test]
    fn a_clean_history_breaks_nothing_and_measures_its_convergence() {
        let mut c = checker();
        c.apply(0.0, Seen::Applied(copy(Kind::ConfigMap, "conf")));
        clean_life(&mut c, "a", 0.0);
        assert!(c.unsettled(4.0).is_empty(), "{:?}", c.unsettled(4.0));
        assert_eq!(c.convergences(), 1);
        assert!((c.worst_convergence(4.0) - 1.0).abs() < 1e-9);
        // Deleted upstairs by its user, then downstairs by us, then gone.
        c.act(
            9.5,
            Action::DeletedUpper {
                namespace: "chaos".into(),
                name: "a".into(),
            },
        );
        c.apply(10.0, Seen::Applied(deleting(upper("a", "Running", true))));
        c.apply(11.0, Seen::Deleted(deleting(lower("a", "Running", true))));
        c.apply(12.0, Seen::Deleted(deleting(upper("a", "Failed", false))));
        c.apply(12.5, Seen::Deleted(copy(Kind::ConfigMap, "conf")));
        assert_eq!(c.upper_pods_seen, 1);
        assert!(c.finish(100.0, 50.0).is_empty());
    }

    #[test]
    fn an_upper_pod_without_its_lower_pod_or_with_two_is_flagged() {
        let mut c = checker();
        c.apply(0.0, Seen::Applied(upper("a", "Pending", false)));
        assert_eq!(
            whats(&c.finish(100.0, 50.0)),
            ["an upper pod bound to vk-1 has 0 lower pods there and 0 elsewhere"]
        );
        let mut c = checker();
        clean_life(&mut c, "a", 0.0);
        let mut twin = lower("a", "Running", true);
        twin.cluster = 2;
        twin.uid = "l-twin".into();
        twin.owner = Some("vk-2".into());
        c.apply(5.0, Seen::Applied(twin));
        let v = c.finish(100.0, 50.0);
        assert!(
            whats(&v).contains(&"one upper pod has lower pods in lower clusters {1, 2}"),
            "{v:?}"
        );
        // A finished pod whose lower pod was deleted below stays as it is.
        let mut c = checker();
        clean_life(&mut c, "a", 0.0);
        c.apply(5.0, Seen::Applied(lower("a", "Succeeded", false)));
        c.apply(6.0, Seen::Applied(upper("a", "Succeeded", false)));
        c.act(
            7.0,
            Action::DeletedLower {
                cluster: 1,
                namespace: "chaos".into(),
                name: "a".into(),
            },
        );
        c.apply(8.0, Seen::Deleted(lower("a", "Succeeded", false)));
        assert!(c.finish(100.0, 50.0).is_empty());
        assert!(
            whats(&v)
                .contains(&"an upper pod bound to vk-1 has 1 lower pods there and 1 elsewhere")
        );
    }

    #[test]
    fn a_lower_pod_deleted_while_its_upper_pod_lives_is_flagged_unless_the_churn_did_it() {
        let mut c = checker();
        clean_life(&mut c, "a", 0.0);
        c.apply(10.0, Seen::Deleted(lower("a", "Running", true)));
        // Judged once its grace is over, as the other watch may lag.
        assert!(c.violations().is_empty());
        c.apply(10.0 + GRACE, Seen::Applied(upper("a", "Running", true)));
        assert_eq!(
            whats(c.violations()),
            ["a lower pod of ours was deleted while its upper pod was not"]
        );

        let mut c = checker();
        clean_life(&mut c, "a", 0.0);
        c.act(
            9.0,
            Action::DeletedLower {
                cluster: 1,
                namespace: "chaos".into(),
                name: "a".into(),
            },
        );
        c.apply(10.0, Seen::Deleted(lower("a", "Running", true)));
        // Then the node deletes the upper pod, as documented.
        c.apply(11.0, Seen::Deleted(upper("a", "Running", true)));
        assert!(c.finish(100.0, 50.0).is_empty());
    }

    #[test]
    fn an_upper_pod_deleted_or_evicted_by_no_one_allowed_is_flagged() {
        let mut c = checker();
        clean_life(&mut c, "a", 0.0);
        c.apply(10.0, Seen::Applied(deleting(upper("a", "Running", true))));
        c.apply(11.0, Seen::Deleted(deleting(lower("a", "Running", true))));
        c.apply(12.0, Seen::Deleted(deleting(upper("a", "Running", true))));
        assert_eq!(
            whats(&c.finish(100.0, 50.0)),
            ["an upper pod was deleted, not by its user or controller"]
        );
        // A scale-down of its Deployment explains it.
        let mut c = checker();
        clean_life(&mut c, "a", 0.0);
        c.act(
            9.0,
            Action::ScaledDown {
                namespace: "chaos".into(),
                app: "web".into(),
            },
        );
        c.apply(10.0, Seen::Applied(deleting(upper("a", "Running", true))));
        c.apply(11.0, Seen::Deleted(deleting(lower("a", "Running", true))));
        c.apply(12.0, Seen::Deleted(deleting(upper("a", "Running", true))));
        assert!(c.finish(100.0, 50.0).is_empty());
        // An eviction is flagged at once.
        let mut c = checker();
        clean_life(&mut c, "a", 0.0);
        c.apply(
            5.0,
            Seen::Evicted {
                namespace: "chaos".into(),
                name: "a".into(),
            },
        );
        assert_eq!(whats(c.violations()), ["an upper pod was evicted"]);
    }

    #[test]
    fn lower_pod_lost_is_allowed_only_once_the_lower_pod_is_gone() {
        let lost = |c: &mut Checker, at: Secs| {
            let mut o = upper("a", "Failed", false);
            if let Some(p) = o.pod.as_mut() {
                p.reason = Some(REASON_LOWER_POD_LOST.into());
            }
            c.apply(at, Seen::Applied(o));
        };
        let mut c = checker();
        clean_life(&mut c, "a", 0.0);
        lost(&mut c, 10.0);
        assert_eq!(
            whats(&c.finish(100.0, 50.0)),
            ["an upper pod was failed LowerPodLost while its lower pod exists"]
        );
        // Lost, through a re-list that no longer has it: documented.
        let mut c = checker();
        clean_life(&mut c, "a", 0.0);
        c.act(
            8.0,
            Action::DeletedLower {
                cluster: 1,
                namespace: "chaos".into(),
                name: "a".into(),
            },
        );
        c.apply(
            9.0,
            Seen::Relisted {
                cluster: 1,
                kind: Kind::Pod,
                present: BTreeSet::new(),
            },
        );
        lost(&mut c, 10.0);
        assert!(c.finish(100.0, 50.0).is_empty());
        assert_eq!(c.lower_pod_lost, 1);
        // Failed upstairs while the lower pod runs, without a reason: flagged.
        let mut c = checker();
        clean_life(&mut c, "a", 0.0);
        c.apply(10.0, Seen::Applied(upper("a", "Failed", false)));
        let v = c.finish(100.0, 50.0);
        assert!(
            whats(&v).contains(&"an upper pod was failed while its lower pod had not failed"),
            "{v:?}"
        );
    }

    #[test]
    fn a_status_that_converges_late_or_never_is_flagged_and_attributed_to_its_faults() {
        let mut c = checker();
        clean_life(&mut c, "a", 0.0);
        // The lower pod turns unready at 20 s; upstairs follows at 100 s, 50 s after the last
        // fault ended at 50 s.
        c.apply(20.0, Seen::Applied(lower("a", "Running", false)));
        c.apply(100.0, Seen::Applied(upper("a", "Running", false)));
        let windows = vec![("lower-network-cut".to_owned(), 15.0, 50.0)];
        let slowest = c.slowest_by_fault(110.0, &windows);
        assert!(
            (slowest["lower-network-cut"] - 80.0).abs() < 1e-9,
            "{slowest:?}"
        );
        assert!((slowest["none"] - 1.0).abs() < 1e-9);
        assert!((c.worst_convergence(110.0) - 80.0).abs() < 1e-9);
        let v = c.finish(110.0, 50.0);
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(
            v[0].what
                .starts_with("converged 50.0 s after the last fault")
        );
        // Still differing at the end.
        let mut c = checker();
        clean_life(&mut c, "a", 0.0);
        c.apply(20.0, Seen::Applied(lower("a", "Succeeded", false)));
        let v = c.finish(110.0, 50.0);
        assert!(
            v[0].what
                .contains("differs from the lower pod's since 20.0 s"),
            "{v:?}"
        );
        assert!((c.worst_convergence(110.0) - 90.0).abs() < 1e-9);
    }

    #[test]
    fn a_copy_nothing_needs_is_flagged_and_one_a_pod_needs_is_not() {
        let mut c = checker();
        clean_life(&mut c, "a", 0.0);
        c.apply(1.0, Seen::Applied(copy(Kind::ConfigMap, "conf")));
        c.apply(1.0, Seen::Applied(copy(Kind::Secret, "stale")));
        c.apply(1.0, Seen::Applied(copy(Kind::Service, "gone-upstairs")));
        let mut svc = copy(Kind::Service, "web");
        c.apply(1.0, Seen::Applied(svc.clone()));
        svc.cluster = 0;
        svc.owner = None;
        c.apply(1.0, Seen::Applied(svc));
        let v = c.unsettled(5.0);
        let objects: Vec<&str> = v.iter().map(|v| v.object.as_str()).collect();
        assert_eq!(
            objects,
            [
                "lower-1 Secret chaos/stale (uid c-stale)",
                "lower-1 Service chaos/gone-upstairs (uid c-gone-upstairs)"
            ]
        );
        assert!(
            whats(&v)
                .iter()
                .all(|w| *w == "a copy of ours that nothing needs")
        );
    }

    #[test]
    fn a_pods_identity_secret_is_needed_while_its_lower_pod_lives_or_its_upper_pod_runs() {
        let mut c = checker();
        let mut identity = copy(Kind::Secret, "tensile-identity-u-a");
        identity.identity_of = Some("u-a".into());
        c.apply(0.5, Seen::Applied(identity));
        clean_life(&mut c, "a", 0.0);
        assert!(c.unsettled(5.0).is_empty(), "{:?}", c.unsettled(5.0));
        // Finished upstairs, its lower pod still there: needed.
        c.apply(6.0, Seen::Applied(lower("a", "Succeeded", false)));
        c.apply(7.0, Seen::Applied(upper("a", "Succeeded", false)));
        assert!(c.unsettled(8.0).is_empty(), "{:?}", c.unsettled(8.0));
        // Deleted upstairs, its lower pod gone: nothing needs it.
        c.apply(8.5, Seen::Applied(deleting(upper("a", "Succeeded", false))));
        c.apply(9.0, Seen::Deleted(lower("a", "Succeeded", false)));
        assert_eq!(
            whats(&c.unsettled(10.0)),
            ["a copy of ours that nothing needs"]
        );
    }

    #[test]
    fn a_lower_object_that_is_not_ours_changed_or_deleted_is_flagged() {
        let mut c = checker();
        let mut theirs = copy(Kind::ConfigMap, "theirs");
        theirs.owner = None;
        c.apply(1.0, Seen::Applied(theirs.clone()));
        // Listed again as it was: nothing.
        c.apply(2.0, Seen::Applied(theirs.clone()));
        assert!(c.violations().is_empty());
        theirs.resource_version = "2".into();
        c.apply(3.0, Seen::Applied(theirs.clone()));
        c.apply(4.0, Seen::Deleted(theirs));
        assert_eq!(
            whats(c.violations()),
            [
                "a lower object that is not ours was changed",
                "a lower object that is not ours was deleted"
            ]
        );
        // Another virtual node's objects are not ours either.
        let mut c = Checker::new(&[("vk-1".into(), 1, "vk-1".into())]);
        let mut other = copy(Kind::Secret, "s");
        other.owner = Some("vk-2".into());
        c.apply(1.0, Seen::Applied(other.clone()));
        assert!(c.unsettled(2.0).is_empty());
        other.resource_version = "2".into();
        c.apply(3.0, Seen::Applied(other));
        assert_eq!(
            whats(c.violations()),
            ["a lower object that is not ours was changed"]
        );
    }
}
