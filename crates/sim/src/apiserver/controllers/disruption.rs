//! PodDisruptionBudgets: kube-controller-manager's disruption controller writes how many of a
//! budget's pods may go now (`status.disruptionsAllowed`), and the eviction subresource
//! refuses, with a 429, to evict a pod whose budget allows none (so `kubectl drain` waits).
//! The expected count is the number of matching pods (the real controller asks their
//! controllers' scale for percentages and `maxUnavailable`; it is the same once every pod
//! exists).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::super::State;
use super::super::errors::ApiError;
use super::super::meta;
use super::super::resources::ids;
use super::super::rest::DeleteOptions;
use super::super::selectors::LabelSelector;
use super::super::store::{Event, ObjKey};
use super::replicaset::is_ready;
use super::{Reconciler, delete, modify, run_loop};

pub(super) async fn run(state: Arc<State>, stop: CancellationToken) {
    run_loop(state, stop, Duration::from_secs(10), Budgets).await;
}

struct Budgets;

/// `n` or `n%` of `total`, rounded up (`GetScaledValueFromIntOrPercent`).
fn scaled(v: &Value, total: i64) -> Option<i64> {
    match v {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => {
            let pct: i64 = s.strip_suffix('%')?.parse().ok()?;
            Some((pct * total + 99) / 100)
        }
        _ => None,
    }
}

/// (desired healthy, disruptions allowed) of a budget with `spec`, given how many pods it
/// covers and how many of them are healthy.
fn allowance(spec: &Value, expected: i64, healthy: i64) -> (i64, i64) {
    let desired = if let Some(max) = spec.get("maxUnavailable").and_then(|v| scaled(v, expected)) {
        (expected - max).max(0)
    } else {
        // Neither set: nothing has to stay.
        spec.get("minAvailable")
            .and_then(|v| scaled(v, expected))
            .unwrap_or_default()
    };
    (desired, (healthy - desired).max(0))
}

/// The live pods of namespace `ns` a budget's selector matches.
fn covered(state: &State, ns: &str, pdb: &Value) -> Vec<Arc<Value>> {
    let selector = pdb
        .pointer("/spec/selector")
        .map(LabelSelector::from_label_selector)
        .and_then(Result::ok)
        .unwrap_or_else(LabelSelector::nothing);
    let (pods, _, _) = state.store.list(*ids::PODS, Some(ns), None, None, |e| {
        selector.matches_object(&e.object)
            && !meta::deleting(&e.object)
            && !matches!(
                e.object.pointer("/status/phase").and_then(Value::as_str),
                Some("Succeeded" | "Failed")
            )
    });
    pods.into_iter().map(|e| e.object).collect()
}

fn reconcile(state: &State, key: &ObjKey) {
    let Some(pdb) = state.store.get(*ids::POD_DISRUPTION_BUDGETS, key) else {
        return;
    };
    let pdb = pdb.object;
    let pods = covered(state, &key.namespace, &pdb);
    let expected = pods.len() as i64;
    let healthy = pods.iter().filter(|p| is_ready(p)).count() as i64;
    let spec = pdb.get("spec").cloned().unwrap_or_else(|| json!({}));
    let (desired, allowed) = allowance(&spec, expected, healthy);
    let generation = pdb
        .pointer("/metadata/generation")
        .and_then(Value::as_i64)
        .unwrap_or(1);
    let now = meta::now();
    let _ = modify(state, *ids::POD_DISRUPTION_BUDGETS, key, |o| {
        let (status, reason) = if allowed > 0 {
            ("True", "SufficientPods")
        } else {
            ("False", "InsufficientPods")
        };
        let since = o
            .pointer("/status/conditions/0")
            .filter(|c| c["status"] == status)
            .and_then(|c| c.get("lastTransitionTime").cloned())
            .unwrap_or_else(|| json!(now));
        let mut new = json!({
            "observedGeneration": generation,
            "disruptionsAllowed": allowed,
            "currentHealthy": healthy,
            "desiredHealthy": desired,
            "expectedPods": expected,
            "conditions": [{"type": "DisruptionAllowed", "status": status, "reason": reason,
                "message": "", "observedGeneration": generation, "lastTransitionTime": since}],
        });
        // Evicted pods stay listed until they are gone (the eviction counted them already).
        if let Some(disrupted) = o
            .pointer("/status/disruptedPods")
            .and_then(Value::as_object)
        {
            let left: serde_json::Map<String, Value> = disrupted
                .iter()
                .filter(|(name, _)| {
                    state
                        .store
                        .get(*ids::PODS, &ObjKey::new(&key.namespace, name.as_str()))
                        .is_some()
                })
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            if !left.is_empty() {
                new["disruptedPods"] = Value::Object(left);
            }
        }
        o["status"] = new;
        true
    });
}

/// The eviction subresource: deletes pod `ns/name` unless its disruption budget allows no
/// disruption now; counts the disruption on the budget first, as the real handler does, so
/// two evictions cannot both take the last one. The eviction's `deleteOptions` (grace period,
/// preconditions, dry run) apply to the deletion.
pub(in crate::apiserver) fn evict(
    state: &State,
    ns: &str,
    name: &str,
    opts: &DeleteOptions,
) -> Result<(), ApiError> {
    let key = ObjKey::new(ns, name);
    let pod = state
        .store
        .get(*ids::PODS, &key)
        .ok_or_else(|| ApiError::not_found("", "pods", name))?
        .object;
    let terminal = matches!(
        pod.pointer("/status/phase").and_then(Value::as_str),
        Some("Succeeded" | "Failed")
    );
    if !(meta::deleting(&pod) || terminal) {
        let (budgets, _, _) =
            state
                .store
                .list(*ids::POD_DISRUPTION_BUDGETS, Some(ns), None, None, |e| {
                    e.object
                        .pointer("/spec/selector")
                        .map(LabelSelector::from_label_selector)
                        .and_then(Result::ok)
                        .is_some_and(|s| s.matches_object(&pod))
                });
        if budgets.len() > 1 {
            return Err(ApiError::internal(
                "This pod has more than one PodDisruptionBudget, which the eviction subresource \
                 does not support.",
            ));
        }
        if let Some(budget) = budgets.first() {
            let pdb_name = meta::name(&budget.object).unwrap_or_default().to_owned();
            let pdb_key = ObjKey::new(ns, &pdb_name);
            let mut refusal = None;
            let now = meta::now();
            let _ = modify(state, *ids::POD_DISRUPTION_BUDGETS, &pdb_key, |o| {
                let int = |p: &str| o.pointer(p).and_then(Value::as_i64).unwrap_or(0);
                if int("/status/observedGeneration") < int("/metadata/generation") {
                    refusal = Some(format!(
                        "The disruption budget {pdb_name} is still being processed by the server."
                    ));
                    return false;
                }
                let allowed = int("/status/disruptionsAllowed");
                if allowed <= 0 {
                    refusal = Some(format!(
                        "The disruption budget {pdb_name} needs {} healthy pods and has {} currently",
                        int("/status/desiredHealthy"),
                        int("/status/currentHealthy")
                    ));
                    return false;
                }
                refusal = None;
                if opts.dry_run {
                    return false;
                }
                o["status"]["disruptionsAllowed"] = json!(allowed - 1);
                o["status"]["disruptedPods"][name] = json!(now);
                true
            });
            if let Some(cause) = refusal {
                return Err(ApiError::disruption_budget(cause));
            }
        }
    }
    delete(state, *ids::PODS, &key, opts).map(drop)
}

impl Reconciler for Budgets {
    async fn resync(&mut self, state: &State) {
        let (items, _, _) =
            state
                .store
                .list(*ids::POD_DISRUPTION_BUDGETS, None, None, None, |_| true);
        for e in items {
            let key = ObjKey::new(
                meta::namespace(&e.object).unwrap_or_default(),
                meta::name(&e.object).unwrap_or_default(),
            );
            reconcile(state, &key);
        }
    }

    async fn changed(&mut self, state: &State, events: Option<&[Arc<Event>]>) {
        let Some(events) = events else {
            return self.resync(state).await;
        };
        let mut dirty = BTreeSet::new();
        let mut namespaces = BTreeSet::new();
        for e in events {
            if e.res == *ids::POD_DISRUPTION_BUDGETS {
                dirty.insert(e.key.clone());
            } else if e.res == *ids::PODS {
                namespaces.insert(e.key.namespace.clone());
            }
        }
        for ns in namespaces {
            let (items, _, _) =
                state
                    .store
                    .list(*ids::POD_DISRUPTION_BUDGETS, Some(&ns), None, None, |_| {
                        true
                    });
            for e in items {
                dirty.insert(ObjKey::new(&ns, meta::name(&e.object).unwrap_or_default()));
            }
        }
        for key in dirty {
            reconcile(state, &key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_allowance_follows_min_available_or_max_unavailable() {
        assert_eq!(allowance(&json!({"minAvailable": 2}), 3, 3), (2, 1));
        assert_eq!(allowance(&json!({"minAvailable": 2}), 3, 2), (2, 0));
        assert_eq!(allowance(&json!({"minAvailable": "50%"}), 3, 3), (2, 1));
        assert_eq!(allowance(&json!({"maxUnavailable": 1}), 4, 4), (3, 1));
        assert_eq!(allowance(&json!({"maxUnavailable": "25%"}), 4, 3), (3, 0));
        assert_eq!(allowance(&json!({}), 2, 2), (0, 2));
    }
}
