//! Jobs run pods from their template until `completions` succeed (or, without `completions`,
//! until one succeeds and none runs), at most `parallelism` at a time, and fail once more than
//! `backoffLimit` pods failed: kube-controller-manager's job controller for `NonIndexed`
//! Jobs, counting the pods that exist (without its tracking finalizers).

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::super::State;
use super::super::meta;
use super::super::resources::ids;
use super::super::rest::DeleteOptions;
use super::super::store::ObjKey;
use super::replicaset::{is_ready, owned_pods};
use super::{create, delete, modify, pod_from_template, run_loop};

pub(super) async fn run(state: Arc<State>, stop: CancellationToken) {
    run_loop(state, stop, Duration::from_secs(10), Jobs).await;
}

struct Jobs;

fn phase(pod: &Value) -> &str {
    pod.pointer("/status/phase")
        .and_then(Value::as_str)
        .unwrap_or("Pending")
}

fn has_condition(job: &Value, kind: &str) -> bool {
    job.pointer("/status/conditions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .any(|c| c["type"] == kind && c["status"] == "True")
}

/// What a Job's pods say it should do next.
#[derive(Debug, PartialEq)]
enum Next {
    /// Create this many pods.
    Create(usize),
    /// Succeeded.
    Complete,
    /// Failed: more pods failed than `backoffLimit`.
    Fail,
    Wait,
}

/// The rule, from the spec and the counts of its pods.
fn next(spec: &Value, active: usize, succeeded: usize, failed: usize) -> Next {
    let int = |k: &str| spec.get(k).and_then(Value::as_i64);
    let backoff_limit = int("backoffLimit").unwrap_or(6).max(0) as usize;
    if failed > backoff_limit {
        return Next::Fail;
    }
    let parallelism = int("parallelism").unwrap_or(1).max(0) as usize;
    let suspended = spec.get("suspend").and_then(Value::as_bool) == Some(true);
    match int("completions").map(|c| c.max(0) as usize) {
        Some(completions) if succeeded >= completions => Next::Complete,
        Some(completions) => {
            let want = parallelism.min(completions - succeeded);
            if suspended || active >= want {
                Next::Wait
            } else {
                Next::Create(want - active)
            }
        }
        // A work queue: done when one succeeded and none runs any more.
        None if succeeded > 0 => {
            if active == 0 {
                Next::Complete
            } else {
                Next::Wait
            }
        }
        None if suspended || active >= parallelism => Next::Wait,
        None => Next::Create(parallelism - active),
    }
}

async fn reconcile(state: &State, key: &ObjKey) {
    let Some(job) = state.store.get(*ids::JOBS, key) else {
        return;
    };
    let job = job.object;
    if meta::deleting(&job) || has_condition(&job, "Complete") || has_condition(&job, "Failed") {
        return;
    }
    let uid = meta::meta_str(&job, "uid").unwrap_or_default().to_owned();
    let spec = job.get("spec").cloned().unwrap_or_else(|| json!({}));
    let pods = owned_pods(state, &key.namespace, &uid);
    let count = |p: &str| pods.iter().filter(|x| phase(x) == p).count();
    let (succeeded, failed) = (count("Succeeded"), count("Failed"));
    let active: Vec<&Arc<Value>> = pods
        .iter()
        .filter(|p| !meta::deleting(p) && !matches!(phase(p), "Succeeded" | "Failed"))
        .collect();
    let decision = next(&spec, active.len(), succeeded, failed);
    let mut created = 0;
    match &decision {
        Next::Create(n) => {
            let template = spec.get("template").cloned().unwrap_or_else(|| json!({}));
            for _ in 0..*n {
                let pod = pod_from_template(&template, key, "batch/v1", "Job", &uid);
                if create(
                    state,
                    *ids::PODS,
                    Some(&key.namespace),
                    pod,
                    "job-controller",
                )
                .await
                .is_err()
                {
                    break;
                }
                created += 1;
            }
        }
        Next::Fail => {
            for p in &active {
                let k = ObjKey::new(&key.namespace, meta::name(p).unwrap_or_default());
                let _ = delete(state, *ids::PODS, &k, &DeleteOptions::default());
            }
        }
        Next::Complete | Next::Wait => {}
    }
    let now = meta::now();
    let ready = active.iter().filter(|p| is_ready(p)).count();
    let active_now = match decision {
        Next::Fail | Next::Complete => 0,
        _ => active.len() + created,
    };
    let _ = modify(state, *ids::JOBS, key, |o| {
        let status = &mut o["status"];
        if !status.is_object() {
            *status = json!({});
        }
        if status.get("startTime").is_none() && spec["suspend"] != json!(true) {
            status["startTime"] = json!(now);
        }
        for (field, n) in [
            ("active", active_now),
            ("succeeded", succeeded),
            ("failed", failed),
        ] {
            // `omitempty` in Go.
            if n == 0 {
                if let Some(m) = status.as_object_mut() {
                    m.remove(field);
                }
            } else {
                status[field] = json!(n);
            }
        }
        status["ready"] = json!(ready);
        status["terminating"] = json!(0);
        status["uncountedTerminatedPods"] = json!({});
        let conditions = match decision {
            Next::Complete => Some((
                ["SuccessCriteriaMet", "Complete"],
                "CompletionsReached",
                "Reached expected number of succeeded pods",
            )),
            Next::Fail => Some((
                ["FailureTarget", "Failed"],
                "BackoffLimitExceeded",
                "Job has reached the specified backoff limit",
            )),
            _ => None,
        };
        if let Some((kinds, reason, message)) = conditions {
            let list: Vec<Value> = kinds
                .iter()
                .map(|k| {
                    json!({"type": k, "status": "True", "reason": reason, "message": message,
                        "lastProbeTime": now, "lastTransitionTime": now})
                })
                .collect();
            status["conditions"] = Value::Array(list);
            if matches!(decision, Next::Complete) {
                status["completionTime"] = json!(now);
            }
        }
        true
    });
}

/// kube-controller-manager's job controller gathers its pods' updates for a second before a
/// sync (`syncJobBatchPeriod`): a sync reads every pod of the Job, so a Job of thousands of
/// pods recounted them for each few pod changes.
const JOB_BATCH_PERIOD: std::time::Duration = std::time::Duration::from_secs(1);

owner_reconciler!(Jobs, *ids::JOBS, *ids::PODS, "Job", JOB_BATCH_PERIOD);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pods_are_created_up_to_parallelism_until_completions_succeed() {
        let spec = json!({"completions": 3, "parallelism": 2, "backoffLimit": 1});
        assert_eq!(next(&spec, 0, 0, 0), Next::Create(2));
        assert_eq!(next(&spec, 1, 1, 0), Next::Create(1));
        assert_eq!(
            next(&spec, 1, 2, 0),
            Next::Wait,
            "one more to go, and it runs"
        );
        assert_eq!(next(&spec, 0, 3, 0), Next::Complete);
        assert_eq!(
            next(&spec, 1, 0, 1),
            Next::Create(1),
            "one failure is within the limit"
        );
        assert_eq!(next(&spec, 1, 0, 2), Next::Fail);
    }

    #[test]
    fn a_work_queue_completes_when_one_succeeded_and_none_runs() {
        let spec = json!({"parallelism": 3, "backoffLimit": 6});
        assert_eq!(next(&spec, 0, 0, 0), Next::Create(3));
        assert_eq!(next(&spec, 2, 1, 0), Next::Wait);
        assert_eq!(next(&spec, 0, 1, 0), Next::Complete);
    }

    #[test]
    fn a_suspended_job_creates_nothing() {
        let spec = json!({"completions": 1, "parallelism": 1, "suspend": true});
        assert_eq!(next(&spec, 0, 0, 0), Next::Wait);
    }
}
