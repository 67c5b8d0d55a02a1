//! StatefulSets keep pods `<name>-0` .. `<name>-(replicas-1)`, each with its own claims from
//! `volumeClaimTemplates`: kube-controller-manager's statefulset controller, for what users
//! see. `OrderedReady` creates one pod at a time, in order, each once the one before is Running
//! and Ready, and removes them from the highest ordinal down; `Parallel` does both at once.
//! A changed template rolls out from the highest ordinal down, one pod at a time, above
//! `partition`; `OnDelete` waits for the user. Claims are kept (the default `Retain` policy).
//! Each template is a ControllerRevision, so `kubectl rollout history` and `undo` work.

use std::collections::BTreeMap;
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
use super::{create, delete, modify, run_loop};

pub(super) async fn run(state: Arc<State>, stop: CancellationToken) {
    run_loop(state, stop, Duration::from_secs(10), StatefulSets).await;
}

struct StatefulSets;

/// What the controller knows of the pod at one ordinal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Member {
    ready: bool,
    terminating: bool,
    /// Succeeded or Failed: it is replaced.
    finished: bool,
    /// Made from the update revision.
    updated: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Action {
    Create(usize),
    Delete(usize),
}

/// How a set is managed, from its spec.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Policy {
    replicas: usize,
    parallel: bool,
    /// `Some(partition)` for `RollingUpdate`, `None` for `OnDelete`.
    rolling: Option<usize>,
}

impl Policy {
    fn of(spec: &Value) -> Self {
        let int = |p: &str| spec.pointer(p).and_then(Value::as_i64).unwrap_or(0).max(0) as usize;
        Self {
            replicas: spec
                .get("replicas")
                .and_then(Value::as_i64)
                .unwrap_or(1)
                .max(0) as usize,
            parallel: spec.get("podManagementPolicy").and_then(Value::as_str) == Some("Parallel"),
            rolling: (spec.pointer("/updateStrategy/type").and_then(Value::as_str)
                != Some("OnDelete"))
            .then(|| int("/updateStrategy/rollingUpdate/partition")),
        }
    }
}

/// The next steps for a set whose pods, by ordinal, are `members`.
fn plan(policy: Policy, members: &BTreeMap<usize, Member>) -> Vec<Action> {
    let ordered = !policy.parallel;
    let mut actions = Vec::new();
    // Missing or finished pods first, in order; an ordered set waits on the first that is not
    // Running and Ready.
    for i in 0..policy.replicas {
        match members.get(&i) {
            None => actions.push(Action::Create(i)),
            Some(m) if m.finished && !m.terminating => actions.push(Action::Delete(i)),
            Some(m) if m.ready && !m.terminating => continue,
            Some(_) => {}
        }
        if ordered {
            return actions;
        }
    }
    // Then the pods beyond `replicas`, highest first; an ordered set removes one at a time,
    // once every pod it keeps is Running and Ready.
    let condemned: Vec<(usize, Member)> = members
        .range(policy.replicas..)
        .rev()
        .map(|(i, m)| (*i, *m))
        .collect();
    for (i, m) in &condemned {
        if m.terminating {
            if ordered {
                return actions;
            }
            continue;
        }
        actions.push(Action::Delete(*i));
        if ordered {
            return actions;
        }
    }
    if !actions.is_empty() {
        return actions;
    }
    // Then the rollout: the highest outdated pod at or above the partition, when every pod is
    // Running and Ready (one unavailable at a time).
    if let Some(partition) = policy.rolling {
        let healthy = (0..policy.replicas)
            .all(|i| members.get(&i).is_some_and(|m| m.ready && !m.terminating));
        if healthy
            && let Some(i) = (partition..policy.replicas)
                .rev()
                .find(|i| members.get(i).is_some_and(|m| !m.updated))
        {
            actions.push(Action::Delete(i));
        }
    }
    actions
}

/// The ordinal of `pod` in set `set`, if it is named as one of its pods.
fn ordinal(set: &str, pod: &str) -> Option<usize> {
    let n = pod.strip_prefix(set)?.strip_prefix('-')?;
    // `web-01` is not ordinal 1.
    (n == "0" || !n.starts_with('0'))
        .then(|| n.parse().ok())
        .flatten()
}

/// The claims of pod `ordinal`: (volume name, claim) from each `volumeClaimTemplates` entry.
fn claims(set: &Value, set_name: &str, ordinal: usize) -> Vec<(String, Value)> {
    let selector_labels = set
        .pointer("/spec/selector/matchLabels")
        .cloned()
        .unwrap_or_else(|| json!({}));
    set.pointer("/spec/volumeClaimTemplates")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|t| {
            let volume = meta::name(t)?.to_owned();
            let mut claim = json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": t.get("metadata").cloned().unwrap_or_else(|| json!({})),
                "spec": t.get("spec").cloned().unwrap_or_else(|| json!({}))});
            let m = meta::meta_mut(&mut claim);
            m.insert(
                "name".into(),
                json!(format!("{volume}-{set_name}-{ordinal}")),
            );
            let labels = m.entry("labels").or_insert_with(|| json!({}));
            if let (Some(l), Some(s)) = (labels.as_object_mut(), selector_labels.as_object()) {
                for (k, v) in s {
                    l.insert(k.clone(), v.clone());
                }
            }
            Some((volume, claim))
        })
        .collect()
}

/// Pod `ordinal` of set `key` from its template at `revision`.
fn member_pod(set: &Value, key: &ObjKey, uid: &str, ordinal: usize, revision: &str) -> Value {
    let template = set
        .pointer("/spec/template")
        .cloned()
        .unwrap_or_else(|| json!({}));
    let name = format!("{}-{ordinal}", key.name);
    let mut pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": template.get("metadata").cloned().unwrap_or_else(|| json!({})),
        "spec": template.get("spec").cloned().unwrap_or_else(|| json!({}))});
    let m = meta::meta_mut(&mut pod);
    m.remove("generateName");
    m.insert("name".into(), json!(name));
    m.insert("namespace".into(), json!(key.namespace));
    m.insert(
        "ownerReferences".into(),
        json!([{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": key.name, "uid": uid,
            "controller": true, "blockOwnerDeletion": true}]),
    );
    let labels = m.entry("labels").or_insert_with(|| json!({}));
    if !labels.is_object() {
        *labels = json!({});
    }
    labels["controller-revision-hash"] = json!(revision);
    labels["statefulset.kubernetes.io/pod-name"] = json!(name);
    labels["apps.kubernetes.io/pod-index"] = json!(ordinal.to_string());
    let spec = &mut pod["spec"];
    spec["hostname"] = json!(name);
    if let Some(service) = set.pointer("/spec/serviceName").and_then(Value::as_str)
        && !service.is_empty()
    {
        spec["subdomain"] = json!(service);
    }
    let mut volumes: Vec<Value> = spec
        .get("volumes")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    for (volume, claim) in claims(set, &key.name, ordinal) {
        let entry = json!({"name": volume,
            "persistentVolumeClaim": {"claimName": meta::name(&claim).unwrap_or_default()}});
        match volumes.iter_mut().find(|v| v["name"] == volume.as_str()) {
            Some(v) => *v = entry,
            None => volumes.push(entry),
        }
    }
    if !volumes.is_empty() {
        spec["volumes"] = Value::Array(volumes);
    }
    pod
}

async fn reconcile(state: &State, key: &ObjKey) {
    let Some(set) = state.store.get(*ids::STATEFULSETS, key) else {
        return;
    };
    let set = set.object;
    if meta::deleting(&set) {
        return;
    }
    let uid = meta::meta_str(&set, "uid").unwrap_or_default().to_owned();
    let spec = set.get("spec").cloned().unwrap_or_else(|| json!({}));
    let template = spec.get("template").cloned().unwrap_or_else(|| json!({}));
    let Some(revision) = super::revisions::ensure(
        state,
        key,
        ("apps/v1", "StatefulSet", &uid),
        &template,
        &spec,
    )
    .await
    else {
        return;
    };
    let pods = owned_pods(state, &key.namespace, &uid);
    let by_ordinal: BTreeMap<usize, &Arc<Value>> = pods
        .iter()
        .filter_map(|p| Some((ordinal(&key.name, meta::name(p)?)?, p)))
        .collect();
    let members: BTreeMap<usize, Member> = by_ordinal
        .iter()
        .map(|(i, p)| {
            let phase = p.pointer("/status/phase").and_then(Value::as_str);
            let running = phase == Some("Running");
            (
                *i,
                Member {
                    ready: running && is_ready(p),
                    terminating: meta::deleting(p),
                    finished: matches!(phase, Some("Succeeded" | "Failed")),
                    updated: meta::labels(p).get("controller-revision-hash")
                        == Some(&revision.name),
                },
            )
        })
        .collect();
    for action in plan(Policy::of(&spec), &members) {
        match action {
            Action::Create(i) => {
                for (_, claim) in claims(&set, &key.name, i) {
                    let claim_key =
                        ObjKey::new(&key.namespace, meta::name(&claim).unwrap_or_default());
                    if state
                        .store
                        .get(*ids::PERSISTENT_VOLUME_CLAIMS, &claim_key)
                        .is_none()
                    {
                        let _ = create(
                            state,
                            *ids::PERSISTENT_VOLUME_CLAIMS,
                            Some(&key.namespace),
                            claim,
                            "statefulset-controller",
                        )
                        .await;
                    }
                }
                let pod = member_pod(&set, key, &uid, i, &revision.name);
                if create(
                    state,
                    *ids::PODS,
                    Some(&key.namespace),
                    pod,
                    "statefulset-controller",
                )
                .await
                .is_err()
                {
                    break;
                }
            }
            Action::Delete(i) => {
                let k = ObjKey::new(&key.namespace, format!("{}-{i}", key.name));
                let _ = delete(state, *ids::PODS, &k, &DeleteOptions::default());
            }
        }
    }
    write_status(state, key, &set, &revision);
}

fn write_status(state: &State, key: &ObjKey, set: &Value, revision: &super::revisions::Revision) {
    let uid = meta::meta_str(set, "uid").unwrap_or_default();
    let pods = owned_pods(state, &key.namespace, uid);
    let live: Vec<&Arc<Value>> = pods
        .iter()
        .filter(|p| ordinal(&key.name, meta::name(p).unwrap_or_default()).is_some())
        .collect();
    let hash = |p: &Value| {
        meta::labels(p)
            .get("controller-revision-hash")
            .cloned()
            .unwrap_or_default()
    };
    let ready = live.iter().filter(|p| is_ready(p)).count();
    let updated = live.iter().filter(|p| hash(p) == revision.name).count();
    let replicas = set
        .pointer("/spec/replicas")
        .and_then(Value::as_i64)
        .unwrap_or(1);
    let generation = set
        .pointer("/metadata/generation")
        .and_then(Value::as_i64)
        .unwrap_or(1);
    let previous_current = set
        .pointer("/status/currentRevision")
        .and_then(Value::as_str)
        .map(str::to_owned);
    // The rollout is over once every wanted pod is ready at the update revision.
    let current = match previous_current {
        Some(c) if !(updated as i64 >= replicas && ready as i64 >= replicas) => c,
        _ => revision.name.clone(),
    };
    let at_current = live.iter().filter(|p| hash(p) == current).count();
    let _ = modify(state, *ids::STATEFULSETS, key, |o| {
        let mut status = json!({
            "observedGeneration": generation,
            "replicas": live.len(),
            "availableReplicas": ready,
            "currentRevision": current,
            "updateRevision": revision.name,
            "collisionCount": 0,
        });
        // `omitempty` in Go.
        for (field, n) in [
            ("readyReplicas", ready),
            ("currentReplicas", at_current),
            ("updatedReplicas", updated),
        ] {
            if n != 0 {
                status[field] = json!(n);
            }
        }
        o["status"] = status;
        true
    });
}

owner_reconciler!(StatefulSets, *ids::STATEFULSETS, *ids::PODS, "StatefulSet");

#[cfg(test)]
mod tests {
    use super::*;

    const READY: Member = Member {
        ready: true,
        terminating: false,
        finished: false,
        updated: true,
    };
    const STARTING: Member = Member {
        ready: false,
        ..READY
    };

    fn policy(replicas: usize, parallel: bool) -> Policy {
        Policy {
            replicas,
            parallel,
            rolling: Some(0),
        }
    }

    fn set(members: &[(usize, Member)]) -> BTreeMap<usize, Member> {
        members.iter().copied().collect()
    }

    #[test]
    fn an_ordered_set_creates_one_pod_at_a_time_once_the_one_before_is_ready() {
        assert_eq!(plan(policy(3, false), &set(&[])), [Action::Create(0)]);
        assert_eq!(
            plan(policy(3, false), &set(&[(0, STARTING)])),
            [],
            "pod 0 is not ready yet"
        );
        assert_eq!(
            plan(policy(3, false), &set(&[(0, READY)])),
            [Action::Create(1)]
        );
    }

    #[test]
    fn a_parallel_set_creates_and_removes_every_pod_at_once() {
        assert_eq!(
            plan(policy(3, true), &set(&[(1, STARTING)])),
            [Action::Create(0), Action::Create(2)]
        );
        assert_eq!(
            plan(policy(1, true), &set(&[(0, READY), (1, READY), (2, READY)])),
            [Action::Delete(2), Action::Delete(1)]
        );
    }

    #[test]
    fn an_ordered_set_scales_down_from_the_highest_ordinal_one_at_a_time() {
        let three = set(&[(0, READY), (1, READY), (2, READY)]);
        assert_eq!(plan(policy(1, false), &three), [Action::Delete(2)]);
        let leaving = Member {
            terminating: true,
            ..READY
        };
        assert_eq!(
            plan(
                policy(1, false),
                &set(&[(0, READY), (1, READY), (2, leaving)])
            ),
            [],
            "waits for pod 2 to go"
        );
    }

    #[test]
    fn a_finished_pod_is_replaced() {
        let failed = Member {
            finished: true,
            ready: false,
            ..READY
        };
        assert_eq!(
            plan(policy(2, false), &set(&[(0, failed), (1, READY)])),
            [Action::Delete(0)]
        );
    }

    #[test]
    fn a_rollout_replaces_the_highest_outdated_pod_above_the_partition() {
        let old = Member {
            updated: false,
            ..READY
        };
        let all_old = set(&[(0, old), (1, old), (2, old)]);
        assert_eq!(plan(policy(3, false), &all_old), [Action::Delete(2)]);
        let partitioned = Policy {
            rolling: Some(2),
            ..policy(3, false)
        };
        assert_eq!(
            plan(partitioned, &set(&[(0, old), (1, old), (2, READY)])),
            [],
            "ordinals below the partition keep the old revision"
        );
        let on_delete = Policy {
            rolling: None,
            ..policy(3, false)
        };
        assert_eq!(plan(on_delete, &all_old), []);
        assert_eq!(
            plan(policy(3, false), &set(&[(0, old), (1, old), (2, STARTING)])),
            [],
            "one pod unavailable at a time"
        );
    }

    #[test]
    fn ordinals_are_read_from_names_as_the_controller_reads_them() {
        assert_eq!(ordinal("web", "web-0"), Some(0));
        assert_eq!(ordinal("web", "web-12"), Some(12));
        assert_eq!(ordinal("web", "web-01"), None);
        assert_eq!(ordinal("web", "webby-1"), None);
        assert_eq!(ordinal("web", "web-x"), None);
    }

    #[test]
    fn pods_carry_their_identity_and_their_own_claims() {
        let s = json!({"metadata": {"name": "db", "uid": "u"}, "spec": {
            "serviceName": "db", "selector": {"matchLabels": {"app": "db"}},
            "template": {"metadata": {"labels": {"app": "db"}},
                "spec": {"containers": [{"name": "c", "image": "postgres"}]}},
            "volumeClaimTemplates": [{"metadata": {"name": "data"},
                "spec": {"accessModes": ["ReadWriteOnce"],
                    "resources": {"requests": {"storage": "1Gi"}}}}]}});
        let pod = member_pod(&s, &ObjKey::new("ns", "db"), "u", 1, "db-abc");
        assert_eq!(pod["metadata"]["name"], "db-1");
        assert_eq!(
            pod["metadata"]["labels"]["controller-revision-hash"],
            "db-abc"
        );
        assert_eq!(
            pod["metadata"]["labels"]["statefulset.kubernetes.io/pod-name"],
            "db-1"
        );
        assert_eq!(
            pod["metadata"]["labels"]["apps.kubernetes.io/pod-index"],
            "1"
        );
        assert_eq!(
            (&pod["spec"]["hostname"], &pod["spec"]["subdomain"]),
            (&json!("db-1"), &json!("db"))
        );
        assert_eq!(
            pod["spec"]["volumes"],
            json!([{"name": "data", "persistentVolumeClaim": {"claimName": "data-db-1"}}])
        );
        let c = claims(&s, "db", 1);
        assert_eq!(c[0].1["metadata"]["name"], "data-db-1");
        assert_eq!(c[0].1["metadata"]["labels"]["app"], "db");
    }
}
