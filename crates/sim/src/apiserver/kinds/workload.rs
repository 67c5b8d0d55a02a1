//! Workloads: the apps/v1 and batch/v1 defaults of Deployments, ReplicaSets, StatefulSets,
//! DaemonSets, Jobs (with the generated selector) and CronJobs, their pod templates'
//! defaults, a new workload's empty status, and what their validation checks (a
//! Deployment's selector, a CronJob's schedule and time zone). All track the generation.

use serde_json::{Value, json};

use super::pod::default_pod_spec;
use super::set_default;
use crate::apiserver::State;
use crate::apiserver::errors::ApiError;
use crate::apiserver::meta;
use crate::apiserver::strategy::{Causes, Strategy};

/// Which workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Workload {
    /// apps/v1 Deployment.
    Deployment,
    /// apps/v1 ReplicaSet.
    ReplicaSet,
    /// apps/v1 StatefulSet.
    StatefulSet,
    /// apps/v1 DaemonSet.
    DaemonSet,
    /// batch/v1 Job.
    Job,
    /// batch/v1 CronJob.
    CronJob,
}

/// Why a HorizontalPodAutoscaler of the simulator never scales: it runs no autoscaler.
pub(crate) const NO_AUTOSCALER: &str = "the simulated control plane of the sandbox runs no \
    horizontal pod autoscaler: nothing reads this HPA's metrics or scales its target, and its \
    replica counts stay 0. On real control planes (`tensile up --k8s-bin DIR`), \
    kube-controller-manager's autoscaler scales from the metrics `kubectl top` shows";

/// autoscaling/v2 HorizontalPodAutoscaler: stored, never acted on. A new one's status says so
/// (`kubectl describe hpa` shows the condition) instead of staying empty forever.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Autoscaler;

impl Strategy for Autoscaler {
    fn prepare_create(&self, _state: &State, obj: &mut Value) -> Result<(), ApiError> {
        obj["status"] = json!({
            "desiredReplicas": 0,
            "conditions": [{
                "type": "ScalingActive",
                "status": "False",
                "reason": "NoAutoscaler",
                "message": NO_AUTOSCALER,
                "lastTransitionTime": meta::now(),
            }],
        });
        Ok(())
    }
}

impl Strategy for Workload {
    fn prepare_create(&self, _state: &State, obj: &mut Value) -> Result<(), ApiError> {
        let template = match self {
            Self::Deployment => {
                default_deployment(obj);
                None
            }
            Self::ReplicaSet | Self::StatefulSet => {
                set_default(&mut obj["spec"], "replicas", json!(1));
                if *self == Self::StatefulSet {
                    default_statefulset(&mut obj["spec"]);
                }
                Some("/spec/template/spec")
            }
            Self::DaemonSet => {
                default_daemonset(&mut obj["spec"]);
                Some("/spec/template/spec")
            }
            Self::Job => {
                default_job(obj);
                Some("/spec/template/spec")
            }
            Self::CronJob => {
                for (k, v) in [
                    ("concurrencyPolicy", json!("Allow")),
                    ("suspend", json!(false)),
                    ("successfulJobsHistoryLimit", json!(3)),
                    ("failedJobsHistoryLimit", json!(1)),
                ] {
                    set_default(&mut obj["spec"], k, v);
                }
                Some("/spec/jobTemplate/spec/template/spec")
            }
        };
        if let Some(t) = template.and_then(|p| obj.pointer_mut(p)) {
            default_pod_spec(t);
        }
        obj["status"] = json!({});
        Ok(())
    }

    fn validate(&self, obj: &Value, _old: Option<&Value>) -> Causes {
        match self {
            Self::Deployment if obj.pointer("/spec/selector").is_none() => {
                vec![("spec.selector".into(), "Required value".into())]
            }
            Self::CronJob => cronjob_causes(obj),
            _ => Vec::new(),
        }
    }

    fn tracks_generation(&self) -> bool {
        true
    }
}

/// A Job's defaults and generated selector (`batch/v1` defaults and the job strategy's
/// `generateSelector`): the pods of a Job carry its uid and name as labels and the selector
/// matches the uid, unless `manualSelector`.
fn default_job(obj: &mut Value) {
    let uid = meta::meta_str(obj, "uid").unwrap_or_default().to_owned();
    let name = meta::name(obj).unwrap_or_default().to_owned();
    // The Job's own labels default to its template's, before the generated ones are added.
    let template_labels = obj.pointer("/spec/template/metadata/labels").cloned();
    if let Some(labels) = template_labels.filter(|l| l.as_object().is_some_and(|m| !m.is_empty()))
        && meta::labels(obj).is_empty()
    {
        meta::meta_mut(obj).insert("labels".into(), labels);
    }
    let spec = &mut obj["spec"];
    if spec.get("manualSelector").and_then(Value::as_bool) != Some(true) {
        let generated = [
            ("batch.kubernetes.io/controller-uid", uid.clone()),
            ("batch.kubernetes.io/job-name", name.clone()),
            ("controller-uid", uid.clone()),
            ("job-name", name),
        ];
        let labels = &mut spec["template"]["metadata"]["labels"];
        if !labels.is_object() {
            *labels = json!({});
        }
        for (k, v) in generated {
            labels[k] = json!(v);
        }
        spec["selector"] = json!({"matchLabels": {"batch.kubernetes.io/controller-uid": uid}});
    }
    let completions = spec.get("completions").is_some_and(|c| !c.is_null());
    let parallelism = spec.get("parallelism").is_some_and(|c| !c.is_null());
    if !completions && !parallelism {
        spec["completions"] = json!(1);
    }
    for (k, v) in [
        ("parallelism", json!(1)),
        ("backoffLimit", json!(6)),
        ("completionMode", json!("NonIndexed")),
        ("suspend", json!(false)),
        ("podReplacementPolicy", json!("TerminatingOrFailed")),
    ] {
        if spec.get(k).is_none_or(Value::is_null) {
            spec[k] = v;
        }
    }
}

/// `SetDefaults_StatefulSet` (apps/v1), including its claim templates' claim defaults.
fn default_statefulset(spec: &mut Value) {
    set_default(spec, "podManagementPolicy", json!("OrderedReady"));
    set_default(
        spec,
        "updateStrategy",
        json!({"type": "RollingUpdate", "rollingUpdate": {"partition": 0}}),
    );
    if spec.pointer("/updateStrategy/type") == Some(&json!("RollingUpdate")) {
        set_default(&mut spec["updateStrategy"], "rollingUpdate", json!({}));
        set_default(
            &mut spec["updateStrategy"]["rollingUpdate"],
            "partition",
            json!(0),
        );
    }
    set_default(spec, "revisionHistoryLimit", json!(10));
    set_default(
        spec,
        "persistentVolumeClaimRetentionPolicy",
        json!({"whenDeleted": "Retain", "whenScaled": "Retain"}),
    );
    if let Some(templates) = spec
        .get_mut("volumeClaimTemplates")
        .and_then(Value::as_array_mut)
    {
        for t in templates {
            set_default(t, "apiVersion", json!("v1"));
            set_default(t, "kind", json!("PersistentVolumeClaim"));
            set_default(&mut t["spec"], "volumeMode", json!("Filesystem"));
            set_default(t, "status", json!({"phase": "Pending"}));
        }
    }
}

/// `SetDefaults_DaemonSet` (apps/v1).
fn default_daemonset(spec: &mut Value) {
    set_default(
        spec,
        "updateStrategy",
        json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}}),
    );
    if spec.pointer("/updateStrategy/type") == Some(&json!("RollingUpdate")) {
        set_default(&mut spec["updateStrategy"], "rollingUpdate", json!({}));
        let r = &mut spec["updateStrategy"]["rollingUpdate"];
        set_default(r, "maxUnavailable", json!(1));
        set_default(r, "maxSurge", json!(0));
    }
    set_default(spec, "revisionHistoryLimit", json!(10));
}

/// `SetDefaults_Deployment` (apps/v1).
fn default_deployment(obj: &mut Value) {
    let spec = &mut obj["spec"];
    if spec.get("replicas").is_none() {
        spec["replicas"] = json!(1);
    }
    if spec.get("strategy").is_none() {
        spec["strategy"] = json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "25%", "maxSurge": "25%"}});
    }
    for (k, v) in [
        ("revisionHistoryLimit", 10),
        ("progressDeadlineSeconds", 600),
    ] {
        if spec.get(k).is_none() {
            spec[k] = json!(v);
        }
    }
    if let Some(t) = spec.pointer_mut("/template/spec") {
        default_pod_spec(t);
    }
}

/// A CronJob's schedule and time zone, as `ValidateCronJobSpec` checks them.
fn cronjob_causes(obj: &Value) -> Vec<(String, String)> {
    let spec = obj.get("spec").cloned().unwrap_or_default();
    let mut causes = Vec::new();
    match spec.get("schedule").and_then(Value::as_str) {
        None | Some("") => causes.push(("spec.schedule".into(), "Required value".into())),
        Some(text) => {
            if let Err(why) = crate::apiserver::controllers::Schedule::parse(text) {
                causes.push((
                    "spec.schedule".into(),
                    format!("Invalid value: {text:?}: {why}"),
                ));
            }
        }
    }
    if let (Some(zone), Err(why)) = (
        spec.get("timeZone").and_then(Value::as_str),
        crate::apiserver::controllers::cronjob_time_zone(&spec),
    ) {
        causes.push((
            "spec.timeZone".into(),
            format!("Invalid value: {zone:?}: {why}"),
        ));
    }
    causes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn created(kind: Workload, obj: Value) -> Value {
        let mut obj = obj;
        kind.prepare_create(&State::for_tests(), &mut obj).unwrap();
        obj
    }

    #[test]
    fn workloads_get_the_apps_v1_defaults_and_an_empty_status() {
        let template = json!({"spec": {"containers": [{"name": "c", "image": "i:1"}]}});
        let d = created(
            Workload::Deployment,
            json!({"spec": {"template": template}}),
        );
        assert_eq!(d["spec"]["replicas"], 1);
        assert_eq!(d["spec"]["strategy"]["rollingUpdate"]["maxSurge"], "25%");
        assert_eq!(
            d["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"],
            "IfNotPresent"
        );
        assert_eq!(d["status"], json!({}));
        let s = created(
            Workload::StatefulSet,
            json!({"spec": {"template": template,
            "volumeClaimTemplates": [{"metadata": {"name": "data"}, "spec": {}}]}}),
        );
        assert_eq!(s["spec"]["podManagementPolicy"], "OrderedReady");
        assert_eq!(
            s["spec"]["volumeClaimTemplates"][0]["spec"]["volumeMode"],
            "Filesystem"
        );
        let ds = created(Workload::DaemonSet, json!({"spec": {"template": template}}));
        assert!(ds["spec"].get("replicas").is_none());
        assert_eq!(
            ds["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"],
            1
        );
        let cj = created(
            Workload::CronJob,
            json!({"spec": {"schedule": "* * * * *"}}),
        );
        assert_eq!(cj["spec"]["concurrencyPolicy"], "Allow");
        assert!(Workload::ReplicaSet.tracks_generation());
    }

    #[test]
    fn a_job_selects_its_pods_by_its_uid() {
        let job = created(
            Workload::Job,
            json!({"metadata": {"name": "j", "uid": "u1"},
            "spec": {"template": {"metadata": {"labels": {"app": "x"}}, "spec": {}}}}),
        );
        assert_eq!(
            job["spec"]["selector"]["matchLabels"]["batch.kubernetes.io/controller-uid"],
            "u1"
        );
        assert_eq!(
            job["spec"]["template"]["metadata"]["labels"]["job-name"],
            "j"
        );
        assert_eq!(job["metadata"]["labels"], json!({"app": "x"}));
        assert_eq!(
            (
                job["spec"]["completions"].clone(),
                job["spec"]["backoffLimit"].clone()
            ),
            (json!(1), json!(6))
        );
    }

    #[test]
    fn deployments_need_a_selector_and_cron_jobs_a_schedule() {
        assert_eq!(
            Workload::Deployment.validate(&json!({"spec": {}}), None)[0].0,
            "spec.selector"
        );
        assert!(
            Workload::Deployment
                .validate(&json!({"spec": {"selector": {}}}), None)
                .is_empty()
        );
        let bad = json!({"spec": {"schedule": "every day", "timeZone": "Mars/Base"}});
        let fields: Vec<String> = Workload::CronJob
            .validate(&bad, None)
            .into_iter()
            .map(|c| c.0)
            .collect();
        assert_eq!(fields, ["spec.schedule", "spec.timeZone"]);
    }
}
