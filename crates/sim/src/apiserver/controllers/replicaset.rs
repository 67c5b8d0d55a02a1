//! ReplicaSets keep `spec.replicas` active pods from their template.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::super::State;
use super::super::meta;
use super::super::resources::ids;
use super::super::rest::DeleteOptions;
use super::super::store::ObjKey;
use super::{create, delete, modify, pod_from_template, run_loop};

pub(super) async fn run(state: Arc<State>, stop: CancellationToken) {
    run_loop(state, stop, Duration::from_secs(10), ReplicaSets).await;
}

struct ReplicaSets;

// These run over every owned pod on each change of one: plain `get`s, as `pointer` splits and
// unescapes its path on every call (at 6,000 replicas that was most of a burst's CPU).
fn is_active(pod: &Value) -> bool {
    !meta::deleting(pod)
        && !matches!(
            pod.get("status")
                .and_then(|s| s.get("phase"))
                .and_then(Value::as_str),
            Some("Succeeded" | "Failed")
        )
}

pub(super) fn is_ready(pod: &Value) -> bool {
    pod.get("status")
        .and_then(|s| s.get("conditions"))
        .and_then(Value::as_array)
        .is_some_and(|c| {
            c.iter().any(|c| {
                c.get("type").and_then(Value::as_str) == Some("Ready")
                    && c.get("status").and_then(Value::as_str) == Some("True")
            })
        })
}

/// Pods controlled by the object with `uid` in `namespace`.
pub(super) fn owned_pods(state: &State, namespace: &str, uid: &str) -> Vec<Arc<Value>> {
    state
        .store
        .list_controlled(*ids::PODS, namespace, uid)
        .into_iter()
        .map(|e| e.object)
        .collect()
}

async fn reconcile(state: &State, key: &ObjKey) {
    let Some(rs) = state.store.get(*ids::REPLICASETS, key) else {
        return;
    };
    let rs = rs.object;
    if meta::deleting(&rs) {
        return;
    }
    let uid = meta::meta_str(&rs, "uid").unwrap_or_default().to_owned();
    let want = rs
        .pointer("/spec/replicas")
        .and_then(Value::as_i64)
        .unwrap_or(1)
        .max(0) as usize;
    let pods = owned_pods(state, &key.namespace, &uid);
    let mut active: Vec<&Arc<Value>> = pods.iter().filter(|p| is_active(p)).collect();
    let (replicas, ready) = (active.len(), active.iter().filter(|p| is_ready(p)).count());
    if active.len() < want {
        let template = rs
            .pointer("/spec/template")
            .cloned()
            .unwrap_or_else(|| json!({}));
        for _ in active.len()..want {
            let pod = pod_from_template(&template, key, "apps/v1", "ReplicaSet", &uid);
            if create(
                state,
                *ids::PODS,
                Some(&key.namespace),
                pod,
                "replicaset-controller",
            )
            .await
            .is_err()
            {
                break;
            }
        }
    } else if active.len() > want {
        // Delete unscheduled first, then not ready, then the newest.
        active.sort_by_key(|p| {
            let unscheduled = p.pointer("/spec/nodeName").is_none();
            (
                !unscheduled,
                is_ready(p),
                std::cmp::Reverse(
                    meta::meta_str(p, "creationTimestamp")
                        .unwrap_or_default()
                        .to_owned(),
                ),
            )
        });
        for p in active.iter().take(active.len() - want) {
            let k = ObjKey::new(&key.namespace, meta::name(p).unwrap_or_default());
            let _ = delete(state, *ids::PODS, &k, &DeleteOptions::default());
        }
    }
    // The status counts the pods this pass started from, as the real controller's
    // calculateStatus does: the pods created or deleted above count when their own events
    // bring the next pass.
    let observed = rs
        .pointer("/metadata/generation")
        .and_then(Value::as_i64)
        .unwrap_or(1);
    let _ = modify(state, *ids::REPLICASETS, key, |o| {
        // `replicas` is always written; the other counts are `omitempty` in Go, so a zero
        // is left out as the real controller leaves it out.
        let mut status = json!({"replicas": replicas});
        for (field, n) in [
            ("fullyLabeledReplicas", replicas as i64),
            ("readyReplicas", ready as i64),
            ("availableReplicas", ready as i64),
            ("observedGeneration", observed),
        ] {
            if n != 0 {
                status[field] = json!(n);
            }
        }
        o["status"] = status;
        true
    });
}

owner_reconciler!(ReplicaSets, *ids::REPLICASETS, *ids::PODS, "ReplicaSet");
