//! Deployments own one ReplicaSet per pod template (named after a hash of the template, as
//! the real controller does). Rollouts are simplified: the current ReplicaSet is scaled to the
//! full count at once and older ones to zero (documented in docs/sim.md).

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;

use super::super::State;
use super::super::meta;
use super::super::resources::ids;
use super::super::store::{Event, ObjKey};
use super::{
    Reconciler, all_keys, changed_owners, controller_of, create, modify, run_loop, template_hash,
};

pub(super) async fn run(state: Arc<State>, stop: CancellationToken) {
    run_loop(state, stop, Duration::from_secs(10), Deployments).await;
}

struct Deployments;

const REVISION: &str = "deployment.kubernetes.io/revision";
const REVISION_HISTORY: &str = "deployment.kubernetes.io/revision-history";
const DESIRED_REPLICAS: &str = "deployment.kubernetes.io/desired-replicas";
/// What the real controller never copies from a Deployment to its ReplicaSets.
const NOT_COPIED: &[&str] = &[
    "kubectl.kubernetes.io/last-applied-configuration",
    REVISION,
    REVISION_HISTORY,
    DESIRED_REPLICAS,
    "deployment.kubernetes.io/max-replicas",
    "deprecated.deployment.rollback.to",
];
/// Upstream's `maxRevHistoryLengthInChars`.
const MAX_REVISION_HISTORY_CHARS: usize = 2000;

async fn reconcile(state: &State, key: &ObjKey) {
    let Some(d) = state.store.get(*ids::DEPLOYMENTS, key) else {
        return;
    };
    let d = d.object;
    if meta::deleting(&d) {
        return;
    }
    let uid = meta::meta_str(&d, "uid").unwrap_or_default().to_owned();
    let replicas = d
        .pointer("/spec/replicas")
        .and_then(Value::as_i64)
        .unwrap_or(1);
    let template = d
        .pointer("/spec/template")
        .cloned()
        .unwrap_or_else(|| json!({}));
    let hash = template_hash(&template);
    let (owned, _, _) =
        state
            .store
            .list(*ids::REPLICASETS, Some(&key.namespace), None, None, |e| {
                controller_of(&e.object).is_some_and(|(_, _, u)| u == uid)
            });
    let is_current = |rs: &Value| {
        rs.pointer("/metadata/labels/pod-template-hash")
            .and_then(Value::as_str)
            == Some(hash.as_str())
    };
    // The current ReplicaSet's revision is one above every older one's (sync.go,
    // getNewReplicaSet): a template rolled back to gets a new number.
    let new_revision = owned
        .iter()
        .filter(|e| !is_current(&e.object))
        .filter_map(|e| revision(&e.object))
        .max()
        .unwrap_or(0)
        + 1;
    let copied = copied_annotations(&d);
    if let Some(rs) = owned.iter().find(|e| is_current(&e.object)) {
        let rs_key = ObjKey::new(&key.namespace, meta::name(&rs.object).unwrap_or_default());
        let _ = modify(state, *ids::REPLICASETS, &rs_key, |o| {
            sync_annotations(o, &copied, new_revision);
            true
        });
    } else {
        let mut labels = template
            .pointer("/metadata/labels")
            .cloned()
            .unwrap_or_else(|| json!({}));
        labels["pod-template-hash"] = json!(hash);
        let mut selector = d
            .pointer("/spec/selector")
            .cloned()
            .unwrap_or_else(|| json!({}));
        selector["matchLabels"]["pod-template-hash"] = json!(hash);
        let mut rs_template = template.clone();
        rs_template["metadata"]["labels"] = labels.clone();
        let mut rs = json!({"apiVersion": "apps/v1", "kind": "ReplicaSet",
            "metadata": {"name": format!("{}-{hash}", key.name), "namespace": key.namespace, "labels": labels,
                "annotations": {DESIRED_REPLICAS: replicas.to_string()},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": key.name, "uid": uid,
                    "controller": true, "blockOwnerDeletion": true}]},
            "spec": {"replicas": replicas, "selector": selector, "template": rs_template}});
        sync_annotations(&mut rs, &copied, new_revision);
        let _ = create(
            state,
            *ids::REPLICASETS,
            Some(&key.namespace),
            rs,
            "deployment-controller",
        )
        .await;
    }
    let (owned, _, _) =
        state
            .store
            .list(*ids::REPLICASETS, Some(&key.namespace), None, None, |e| {
                controller_of(&e.object).is_some_and(|(_, _, u)| u == uid)
            });
    let (mut total, mut updated, mut ready, mut available, mut desired) = (0, 0, 0, 0, 0);
    let mut current_revision = None;
    for rs in &owned {
        let rs_key = ObjKey::new(&key.namespace, meta::name(&rs.object).unwrap_or_default());
        let target = if is_current(&rs.object) { replicas } else { 0 };
        let _ = modify(state, *ids::REPLICASETS, &rs_key, |o| {
            if o.pointer("/spec/replicas").and_then(Value::as_i64) == Some(target) {
                return false;
            }
            o["spec"]["replicas"] = json!(target);
            // A spec change: the API server would raise the generation of this update.
            let generation = o
                .pointer("/metadata/generation")
                .and_then(Value::as_i64)
                .unwrap_or(0);
            o["metadata"]["generation"] = json!(generation + 1);
            // Scaling a ReplicaSet records the Deployment's size on it (scaleReplicaSet).
            o["metadata"]["annotations"][DESIRED_REPLICAS] = json!(replicas.to_string());
            true
        });
        let get = |p: &str| rs.object.pointer(p).and_then(Value::as_i64).unwrap_or(0);
        total += get("/status/replicas");
        ready += get("/status/readyReplicas");
        available += get("/status/availableReplicas");
        desired += target;
        if is_current(&rs.object) {
            updated = get("/status/replicas");
            current_revision = annotation(&rs.object, REVISION).map(str::to_owned);
        }
    }
    let generation = d
        .pointer("/metadata/generation")
        .and_then(Value::as_i64)
        .unwrap_or(1);
    let now = meta::now();
    let done = available >= replicas && updated == replicas && total == replicas;
    let _ = modify(state, *ids::DEPLOYMENTS, key, |o| {
        // The Deployment shows its current ReplicaSet's revision.
        if let Some(rev) = &current_revision {
            o["metadata"]["annotations"][REVISION] = json!(rev);
        }
        // Zero counts are left out, as Go's `omitempty` leaves them out of the real status.
        let mut status = json!({});
        for (field, n) in [
            ("observedGeneration", generation),
            ("replicas", total),
            ("updatedReplicas", updated),
            ("readyReplicas", ready),
            ("availableReplicas", available),
            ("unavailableReplicas", (desired - available).max(0)),
        ] {
            if n != 0 {
                status[field] = json!(n);
            }
        }
        let condition = |t: &str, ok: bool, reason: &str, message: &str| {
            let previous = o
                .pointer("/status/conditions")
                .and_then(Value::as_array)
                .and_then(|c| {
                    c.iter()
                        .find(|c| c.get("type").and_then(Value::as_str) == Some(t))
                        .cloned()
                });
            let status = if ok { "True" } else { "False" };
            let since = previous
                .filter(|p| p.get("status").and_then(Value::as_str) == Some(status))
                .and_then(|p| p.get("lastTransitionTime").cloned())
                .unwrap_or_else(|| json!(now));
            json!({"type": t, "status": status, "reason": reason, "message": message, "lastTransitionTime": since, "lastUpdateTime": since})
        };
        let available_ok = available >= min_available(&d, replicas);
        status["conditions"] = json!([
            condition(
                "Available",
                available_ok,
                if available_ok {
                    "MinimumReplicasAvailable"
                } else {
                    "MinimumReplicasUnavailable"
                },
                if available_ok {
                    "Deployment has minimum availability."
                } else {
                    "Deployment does not have minimum availability."
                }
            ),
            condition(
                "Progressing",
                true,
                if done {
                    "NewReplicaSetAvailable"
                } else {
                    "ReplicaSetUpdated"
                },
                &format!(
                    "ReplicaSet \"{}-{hash}\" {}",
                    key.name,
                    if done {
                        "has successfully progressed."
                    } else {
                        "is progressing."
                    }
                )
            ),
        ]);
        o["status"] = status;
        true
    });
}

/// The revision of a ReplicaSet (`deployment.kubernetes.io/revision`, 0 when absent, `None`
/// when not a number: the real controller skips those).
fn revision(rs: &Value) -> Option<i64> {
    match annotation(rs, REVISION) {
        None => Some(0),
        Some(v) => v.parse().ok(),
    }
}

fn annotation<'a>(obj: &'a Value, key: &str) -> Option<&'a str> {
    obj.get("metadata")?.get("annotations")?.get(key)?.as_str()
}

/// The Deployment's annotations its current ReplicaSet gets, all but the controller's own
/// and kubectl's applied configuration (`annotationsToSkip` upstream).
fn copied_annotations(d: &Value) -> Map<String, Value> {
    let mut copied = d
        .pointer("/metadata/annotations")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    copied.retain(|k, _| !NOT_COPIED.contains(&k.as_str()));
    copied
}

/// Brings the current ReplicaSet's annotations up to date (`SetNewReplicaSetAnnotations`):
/// the Deployment's copied over, the revision raised to `new_revision` when lower, and a
/// replaced revision remembered in the revision history (a rollback), within its length limit.
fn sync_annotations(rs: &mut Value, copied: &Map<String, Value>, new_revision: i64) {
    let meta = meta::meta_mut(rs);
    if !meta.get("annotations").is_some_and(Value::is_object) {
        meta.insert("annotations".into(), json!({}));
    }
    let Some(annotations) = meta.get_mut("annotations").and_then(Value::as_object_mut) else {
        return;
    };
    for (k, v) in copied {
        annotations.insert(k.clone(), v.clone());
    }
    let old = annotations
        .get(REVISION)
        .and_then(Value::as_str)
        .map(str::to_owned);
    let old_number = match old.as_deref().map(str::parse::<i64>) {
        None => 0,
        Some(Ok(n)) => n,
        // Left alone, as the real controller leaves a revision it cannot read.
        Some(Err(_)) => return,
    };
    if old_number >= new_revision {
        return;
    }
    annotations.insert(REVISION.into(), json!(new_revision.to_string()));
    let Some(old) = old else { return };
    let history = annotations
        .get(REVISION_HISTORY)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    if history.is_empty() {
        annotations.insert(REVISION_HISTORY.into(), json!(old));
        return;
    }
    let kept: Vec<&str> = history.split(',').collect();
    let mut total = history.len() + old.len() + 1;
    let mut start = 0;
    while total > MAX_REVISION_HISTORY_CHARS && start < kept.len() {
        total -= kept[start].len() + 1;
        start += 1;
    }
    if total <= MAX_REVISION_HISTORY_CHARS {
        let mut kept = kept[start..].to_vec();
        kept.push(&old);
        annotations.insert(REVISION_HISTORY.into(), json!(kept.join(",")));
    }
}

/// The lowest number of available pods for the Deployment to be Available: its replicas less
/// the rolling update's `maxUnavailable` (upstream `MaxUnavailable`, `ResolveFenceposts`:
/// a percentage rounds down, `maxSurge` rounds up, and both zero means one may be unavailable).
fn min_available(d: &Value, replicas: i64) -> i64 {
    let rolling = d.pointer("/spec/strategy/type").and_then(Value::as_str) != Some("Recreate");
    if !rolling || replicas == 0 {
        return replicas;
    }
    let scaled = |field: &str, round_up: bool| {
        let v = d.pointer(&format!("/spec/strategy/rollingUpdate/{field}"));
        match v {
            Some(Value::Number(n)) => n.as_i64().unwrap_or(0),
            Some(Value::String(s)) => match s.strip_suffix('%').map(str::parse::<i64>) {
                Some(Ok(p)) => {
                    let (q, r) = (p * replicas / 100, p * replicas % 100);
                    if round_up && r > 0 { q + 1 } else { q }
                }
                _ => s.parse().unwrap_or(0),
            },
            // The defaults, 25% each.
            _ if round_up => (25 * replicas + 99) / 100,
            _ => 25 * replicas / 100,
        }
    };
    let surge = scaled("maxSurge", true);
    let mut unavailable = scaled("maxUnavailable", false);
    if surge == 0 && unavailable == 0 {
        unavailable = 1;
    }
    replicas - unavailable.clamp(0, replicas)
}

impl Reconciler for Deployments {
    async fn resync(&mut self, state: &State) {
        for key in all_keys(state, *ids::DEPLOYMENTS) {
            reconcile(state, &key).await;
        }
    }

    async fn changed(&mut self, state: &State, events: Option<&[Arc<Event>]>) {
        let Some(events) = events else { return };
        for key in changed_owners(events, *ids::DEPLOYMENTS, *ids::REPLICASETS, "Deployment") {
            reconcile(state, &key).await;
        }
    }
}
