//! CronJobs make a Job at each time their schedule names: kube-controller-manager's cronjob
//! controller (v2), for what users see. A Job is named `<cronjob>-<minutes since the epoch>`
//! after its scheduled time, carries the template's labels and annotations and the
//! `batch.kubernetes.io/cronjob-scheduled-timestamp` annotation; only the latest missed time
//! runs (within `startingDeadlineSeconds`); `concurrencyPolicy` Forbid skips a run while one is
//! active and Replace deletes it; finished Jobs beyond the history limits are deleted;
//! `status.active`, `lastScheduleTime` and `lastSuccessfulTime` are kept; events
//! `SuccessfulCreate`, `SawCompletedJob`, `SuccessfulDelete`, `JobAlreadyActive`.

use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use jiff::tz::TimeZone;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::super::State;
use super::super::meta;
use super::super::resources::ids;
use super::super::rest::DeleteOptions;
use super::super::store::ObjKey;
use super::cron::Schedule;
use super::{controller_of, create, delete, modify, run_loop};

/// Runs are due on the minute: a one-second tick is as close as the real controller's
/// requeue at the next scheduled time.
pub(super) async fn run(state: Arc<State>, stop: CancellationToken) {
    run_loop(state, stop, Duration::from_secs(1), CronJobs).await;
}

struct CronJobs;

const COMPONENT: &str = "cronjob-controller";
const ANN_SCHEDULED: &str = "batch.kubernetes.io/cronjob-scheduled-timestamp";

/// The time zone of a CronJob: `spec.timeZone`, or the controller's own (UTC here).
pub(in crate::apiserver) fn time_zone(spec: &Value) -> Result<TimeZone, String> {
    match spec.get("timeZone").and_then(Value::as_str) {
        None => Ok(TimeZone::UTC),
        Some(name) => TimeZone::get(name).map_err(|_| format!("unknown time zone {name}")),
    }
}

fn job_finished(job: &Value) -> Option<&'static str> {
    job.pointer("/status/conditions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .find_map(|c| {
            if c["status"] != "True" {
                return None;
            }
            match c["type"].as_str() {
                Some("Complete") => Some("Complete"),
                Some("Failed") => Some("Failed"),
                _ => None,
            }
        })
}

fn reference(job: &Value) -> Value {
    json!({"apiVersion": "batch/v1", "kind": "Job", "namespace": meta::namespace(job),
        "name": meta::name(job), "uid": meta::meta_str(job, "uid"),
        "resourceVersion": meta::meta_str(job, "resourceVersion")})
}

/// The Job for the run at `scheduled`.
fn job_for(cj: &Value, key: &ObjKey, scheduled: Timestamp, tz: &TimeZone) -> Value {
    let template = cj
        .pointer("/spec/jobTemplate")
        .cloned()
        .unwrap_or_else(|| json!({}));
    let mut metadata = template
        .get("metadata")
        .cloned()
        .filter(Value::is_object)
        .unwrap_or_else(|| json!({}));
    metadata["name"] = json!(format!("{}-{}", key.name, scheduled.as_second() / 60));
    metadata["namespace"] = json!(key.namespace);
    if !metadata["annotations"].is_object() {
        metadata["annotations"] = json!({});
    }
    metadata["annotations"][ANN_SCHEDULED] = json!(
        scheduled
            .to_zoned(tz.clone())
            .strftime("%Y-%m-%dT%H:%M:%S%:z")
            .to_string()
            .replace("+00:00", "Z")
    );
    metadata["ownerReferences"] = json!([{"apiVersion": "batch/v1", "kind": "CronJob",
        "name": key.name, "uid": meta::meta_str(cj, "uid"), "controller": true,
        "blockOwnerDeletion": true}]);
    json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": metadata,
        "spec": template.get("spec").cloned().unwrap_or_else(|| json!({}))})
}

async fn reconcile(state: &State, key: &ObjKey) {
    let Some(cj) = state.store.get(*ids::CRONJOBS, key) else {
        return;
    };
    let cj = cj.object;
    if meta::deleting(&cj) {
        return;
    }
    let uid = meta::meta_str(&cj, "uid").unwrap_or_default().to_owned();
    let spec = cj.get("spec").cloned().unwrap_or_else(|| json!({}));
    let (jobs, _, _) = state
        .store
        .list(*ids::JOBS, Some(&key.namespace), None, None, |e| {
            controller_of(&e.object).is_some_and(|(_, _, u)| u == uid)
        });
    let jobs: Vec<Arc<Value>> = jobs.into_iter().map(|e| e.object).collect();
    let time = |p: &Value, path: &str| {
        p.pointer(path)
            .and_then(Value::as_str)
            .and_then(meta::parse_time)
    };

    // Finished Jobs: seen once (an event), the latest success noted, old ones deleted.
    let mut active: Vec<&Arc<Value>> = Vec::new();
    let mut succeeded: Vec<&Arc<Value>> = Vec::new();
    let mut failed: Vec<&Arc<Value>> = Vec::new();
    for job in &jobs {
        match job_finished(job) {
            Some("Complete") => succeeded.push(job),
            Some(_) => failed.push(job),
            None if !meta::deleting(job) => active.push(job),
            None => {}
        }
    }
    let was_active: Vec<String> = cj
        .pointer("/status/active")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|r| r.get("uid").and_then(Value::as_str).map(str::to_owned))
        .collect();
    for job in succeeded.iter().chain(&failed) {
        if was_active
            .iter()
            .any(|u| Some(u.as_str()) == meta::meta_str(job, "uid"))
        {
            let condition = job_finished(job).unwrap_or_default();
            let message = format!(
                "Saw completed job: {}, condition: {condition}",
                meta::name(job).unwrap_or_default()
            );
            super::record_event(state, &cj, COMPONENT, "Normal", "SawCompletedJob", &message).await;
        }
    }
    let last_success = succeeded
        .iter()
        .filter_map(|j| time(j, "/status/completionTime"))
        .max();
    for (list, limit_key, default) in [
        (&mut succeeded, "successfulJobsHistoryLimit", 3),
        (&mut failed, "failedJobsHistoryLimit", 1),
    ] {
        let limit = spec
            .get(limit_key)
            .and_then(Value::as_i64)
            .unwrap_or(default)
            .max(0) as usize;
        list.sort_by_key(|j| {
            time(j, "/status/startTime").or_else(|| time(j, "/metadata/creationTimestamp"))
        });
        let extra = list.len().saturating_sub(limit);
        for job in list.iter().take(extra) {
            remove_job(state, &cj, key, job).await;
        }
    }

    // The run that is due, if any.
    let mut created = None;
    let mut scheduled_at = time(&cj, "/status/lastScheduleTime");
    let suspended = spec.get("suspend").and_then(Value::as_bool) == Some(true);
    let schedule = spec
        .get("schedule")
        .and_then(Value::as_str)
        .map(Schedule::parse);
    if let (false, Some(Ok(schedule)), Ok(tz)) = (suspended, schedule, time_zone(&spec)) {
        let now = Timestamp::now();
        let mut earliest = scheduled_at
            .or_else(|| time(&cj, "/metadata/creationTimestamp"))
            .unwrap_or(now);
        if let Some(deadline) = spec.get("startingDeadlineSeconds").and_then(Value::as_i64) {
            let floor = now
                .checked_sub(jiff::Span::new().seconds(deadline))
                .unwrap_or(now);
            earliest = earliest.max(floor);
        }
        let (due, missed) = schedule.latest(earliest, now, &tz);
        if missed > 100 {
            super::record_event(
                state,
                &cj,
                COMPONENT,
                "Warning",
                "TooManyMissedTimes",
                "too many missed start times. Set or decrease .spec.startingDeadlineSeconds or check clock skew",
            )
            .await;
        }
        if let Some(due) = due {
            let policy = spec
                .get("concurrencyPolicy")
                .and_then(Value::as_str)
                .unwrap_or("Allow");
            let go = match policy {
                "Forbid" if !active.is_empty() => {
                    super::record_event(
                        state,
                        &cj,
                        COMPONENT,
                        "Normal",
                        "JobAlreadyActive",
                        "Not starting job because prior execution is running and concurrency policy is Forbid",
                    )
                    .await;
                    false
                }
                "Replace" => {
                    for job in active.drain(..) {
                        remove_job(state, &cj, key, job).await;
                    }
                    true
                }
                _ => true,
            };
            if go {
                let job = job_for(&cj, key, due, &tz);
                match create(state, *ids::JOBS, Some(&key.namespace), job, COMPONENT).await {
                    Ok(job) => {
                        let message =
                            format!("Created job {}", meta::name(&job).unwrap_or_default());
                        super::record_event(
                            state,
                            &cj,
                            COMPONENT,
                            "Normal",
                            "SuccessfulCreate",
                            &message,
                        )
                        .await;
                        created = Some(job);
                        scheduled_at = Some(due);
                    }
                    // Made by an earlier pass: the time is taken.
                    Err(e) if e.code == 409 => scheduled_at = Some(due),
                    Err(e) => {
                        super::record_event(
                            state,
                            &cj,
                            COMPONENT,
                            "Warning",
                            "FailedCreate",
                            &format!("Error creating job: {}", e.message),
                        )
                        .await;
                    }
                }
            }
        }
    }
    let mut active_refs: Vec<Value> = active.iter().map(|j| reference(j)).collect();
    if let Some(job) = &created {
        active_refs.push(reference(job));
    }
    let _ = modify(state, *ids::CRONJOBS, key, |o| {
        let status = &mut o["status"];
        if !status.is_object() {
            *status = json!({});
        }
        let Some(m) = status.as_object_mut() else {
            return false;
        };
        if active_refs.is_empty() {
            m.remove("active");
        } else {
            m.insert("active".into(), Value::Array(active_refs.clone()));
        }
        if let Some(t) = scheduled_at {
            m.insert("lastScheduleTime".into(), json!(meta::time_string(t)));
        }
        if let Some(t) = last_success {
            m.insert("lastSuccessfulTime".into(), json!(meta::time_string(t)));
        }
        true
    });
}

async fn remove_job(state: &State, cj: &Value, key: &ObjKey, job: &Value) {
    let name = meta::name(job).unwrap_or_default();
    let opts = DeleteOptions {
        propagation: Some("Background".into()),
        ..DeleteOptions::default()
    };
    if delete(state, *ids::JOBS, &ObjKey::new(&key.namespace, name), &opts).is_ok() {
        let message = format!("Deleted job {name}");
        super::record_event(state, cj, COMPONENT, "Normal", "SuccessfulDelete", &message).await;
    }
}

owner_reconciler!(CronJobs, *ids::CRONJOBS, *ids::JOBS, "CronJob");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_is_a_job_named_after_its_minute_with_the_templates_metadata() {
        let cj = json!({"metadata": {"name": "backup", "namespace": "ns", "uid": "u"},
            "spec": {"schedule": "* * * * *", "jobTemplate": {
                "metadata": {"labels": {"app": "backup"}},
                "spec": {"template": {"spec": {"containers": [{"name": "c"}]}}}}}});
        let at: Timestamp = "2026-01-01T10:05:00Z".parse().unwrap_or_default();
        let job = job_for(&cj, &ObjKey::new("ns", "backup"), at, &TimeZone::UTC);
        assert_eq!(job["metadata"]["name"], "backup-29454365");
        assert_eq!(job["metadata"]["labels"]["app"], "backup");
        assert_eq!(
            job["metadata"]["annotations"][ANN_SCHEDULED],
            "2026-01-01T10:05:00Z"
        );
        assert_eq!(job["metadata"]["ownerReferences"][0]["kind"], "CronJob");
        assert_eq!(
            job["spec"]["template"]["spec"]["containers"][0]["name"],
            "c"
        );
    }

    #[test]
    fn time_zones_are_read_from_the_system_database() {
        assert!(time_zone(&json!({})).is_ok());
        assert!(time_zone(&json!({"timeZone": "Europe/Paris"})).is_ok());
        assert_eq!(
            time_zone(&json!({"timeZone": "Mars/Olympus"})).err(),
            Some("unknown time zone Mars/Olympus".to_owned())
        );
    }
}
