//! Deployments own one ReplicaSet per pod template (named after a hash of the template, as
//! the real controller does). Rollouts are simplified: the current ReplicaSet is scaled to the
//! full count at once and older ones to zero (documented in docs/sim.md).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::super::State;
use super::super::meta;
use super::super::resources::ids;
use super::super::store::{Event, ObjKey};
use super::{Reconciler, controller_of, create, modify, run_loop};

pub(super) async fn run(state: Arc<State>, stop: CancellationToken) {
    run_loop(state, stop, Duration::from_secs(10), Deployments).await;
}

struct Deployments;

/// A stable, short hash of the pod template, in the alphabet the real controller uses.
fn template_hash(template: &Value) -> String {
    let text = serde_json::to_string(template).unwrap_or_default();
    let mut h: u32 = 0x811c_9dc5;
    for b in text.bytes() {
        h = (h ^ u32::from(b)).wrapping_mul(0x0100_0193);
    }
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut out = String::new();
    let mut x = u64::from(h);
    while out.len() < 10 {
        out.push(ALPHABET[(x % ALPHABET.len() as u64) as usize] as char);
        x /= ALPHABET.len() as u64;
        if x == 0 {
            x = u64::from(h.rotate_left(7)) + 1;
        }
    }
    out
}

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
    let revision = owned.len() + 1;
    if !owned.iter().any(|e| is_current(&e.object)) {
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
        let rs = json!({"apiVersion": "apps/v1", "kind": "ReplicaSet",
            "metadata": {"name": format!("{}-{hash}", key.name), "namespace": key.namespace, "labels": labels,
                "annotations": {"deployment.kubernetes.io/revision": revision.to_string(),
                    "deployment.kubernetes.io/desired-replicas": replicas.to_string()},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": key.name, "uid": uid,
                    "controller": true, "blockOwnerDeletion": true}]},
            "spec": {"replicas": replicas, "selector": selector, "template": rs_template}});
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
    let (mut total, mut updated, mut ready, mut available) = (0, 0, 0, 0);
    for rs in &owned {
        let rs_key = ObjKey::new(&key.namespace, meta::name(&rs.object).unwrap_or_default());
        let target = if is_current(&rs.object) { replicas } else { 0 };
        let _ = modify(state, *ids::REPLICASETS, &rs_key, |o| {
            if o.pointer("/spec/replicas").and_then(Value::as_i64) == Some(target) {
                return false;
            }
            o["spec"]["replicas"] = json!(target);
            true
        });
        let get = |p: &str| rs.object.pointer(p).and_then(Value::as_i64).unwrap_or(0);
        total += get("/status/replicas");
        ready += get("/status/readyReplicas");
        available += get("/status/availableReplicas");
        if is_current(&rs.object) {
            updated = get("/status/replicas");
        }
    }
    let generation = d
        .pointer("/metadata/generation")
        .cloned()
        .unwrap_or(json!(1));
    let now = meta::now();
    let done = available >= replicas && updated == replicas && total == replicas;
    let _ = modify(state, *ids::DEPLOYMENTS, key, |o| {
        let mut status = json!({"observedGeneration": generation, "replicas": total, "updatedReplicas": updated,
            "readyReplicas": ready, "availableReplicas": available, "unavailableReplicas": (replicas - available).max(0)});
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
        let available_ok = available >= replicas;
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
        if o.get("status") == Some(&status) {
            return false;
        }
        o["status"] = status;
        true
    });
}

impl Reconciler for Deployments {
    async fn resync(&mut self, state: &State) {
        let (items, _, _) = state
            .store
            .list(*ids::DEPLOYMENTS, None, None, None, |_| true);
        for e in items {
            let key = ObjKey::new(
                meta::namespace(&e.object).unwrap_or_default(),
                meta::name(&e.object).unwrap_or_default(),
            );
            reconcile(state, &key).await;
        }
    }

    async fn changed(&mut self, state: &State, events: Option<&[Arc<Event>]>) {
        let Some(events) = events else { return };
        let mut dirty = BTreeSet::new();
        for e in events {
            if e.res == *ids::DEPLOYMENTS {
                dirty.insert(e.key.clone());
            } else if e.res == *ids::REPLICASETS
                && let Some(("Deployment", name, _)) = controller_of(&e.entry.object)
            {
                dirty.insert(ObjKey::new(&e.key.namespace, name));
            }
        }
        for key in dirty {
            reconcile(state, &key).await;
        }
    }
}
