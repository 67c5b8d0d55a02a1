//! Events of the lower cluster about our pods, mirrored onto the upper pods so `kubectl
//! describe pod` upstairs shows what really happened downstairs (scheduling failures, image
//! pulls, probes, OOM kills). Not in the original (reference 10.3).
//!
//! The mirror of a lower event is a core/v1 Event of the same name in the upper pod's namespace,
//! about the upper pod, marked ours: creating it twice is harmless and a repeat downstairs
//! (a higher count) becomes a patch of the same upper event, never a second one.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::{Value, json};

use crate::keys;

/// The upper mirror of `lower`, an event about our lower copy of `upper_pod` in lower cluster
/// `lower_cluster`, made by node `owner`. None when the upper pod has no name, namespace or uid
/// (nothing to point at).
pub fn mirrored_event(
    lower: &Event,
    upper_pod: &Pod,
    owner: &str,
    lower_cluster: &str,
) -> Option<Event> {
    let namespace = upper_pod.metadata.namespace.clone()?;
    let involved = ObjectReference {
        api_version: Some("v1".to_owned()),
        kind: Some("Pod".to_owned()),
        namespace: Some(namespace.clone()),
        name: Some(upper_pod.metadata.name.clone()?),
        uid: Some(upper_pod.metadata.uid.clone()?),
        // The container the event is about, such as `spec.containers{app}`: the same upstairs.
        field_path: lower.involved_object.field_path.clone(),
        resource_version: None,
    };
    Some(Event {
        metadata: ObjectMeta {
            name: lower.metadata.name.clone(),
            namespace: Some(namespace),
            labels: Some([(keys::LABEL_OWNER.to_owned(), keys::owner_label_value(owner))].into()),
            ..ObjectMeta::default()
        },
        involved_object: involved,
        // Everything that says what happened, where and how often is kept: the source host is
        // the real lower node, which is what a user debugging the pod wants to see.
        reason: lower.reason.clone(),
        message: lower.message.clone(),
        type_: lower.type_.clone(),
        source: Some(source_in(lower, lower_cluster)),
        count: lower.count,
        first_timestamp: lower.first_timestamp.clone(),
        last_timestamp: lower.last_timestamp.clone(),
        event_time: lower.event_time.clone(),
        series: lower.series.clone(),
        action: lower.action.clone(),
        reporting_component: lower.reporting_component.clone(),
        reporting_instance: lower.reporting_instance.clone(),
        // A lower object the upper cluster does not know.
        related: None,
    })
}

/// The source of a mirror: the lower component, named as `<lower cluster>/<component>` so
/// `kubectl describe pod` upstairs tells the lower scheduler's `Scheduled` from the upper
/// one's (both are `default-scheduler`). Only `source` carries the cluster: the
/// `reportingComponent` of an event with an `eventTime` must stay a qualified name, which a
/// kubeconfig context such as `admin@prod` is not.
fn source_in(lower: &Event, lower_cluster: &str) -> EventSource {
    let component = lower
        .source
        .as_ref()
        .and_then(|s| s.component.as_deref())
        .or(lower.reporting_component.as_deref())
        .filter(|c| !c.is_empty());
    let host = lower.source.as_ref().and_then(|s| s.host.clone());
    EventSource {
        component: Some(match component {
            Some(c) => format!("{lower_cluster}/{c}"),
            None => lower_cluster.to_owned(),
        }),
        host,
    }
}

/// What to write upstairs for one lower event.
#[derive(Clone, Debug, PartialEq)]
pub enum EventAction {
    /// The mirror is up to date.
    Nothing,
    /// Create the mirror.
    Create(Box<Event>),
    /// Merge-patch the existing mirror with this (a repeat downstairs).
    Patch(Value),
}

/// [`EventAction`] given the `desired` mirror ([`mirrored_event`]) and the existing upper one.
pub fn event_action(desired: Event, existing: Option<&Event>) -> EventAction {
    let Some(existing) = existing else {
        return EventAction::Create(Box::new(desired));
    };
    if existing.count == desired.count
        && existing.last_timestamp == desired.last_timestamp
        && existing.message == desired.message
        && existing.series == desired.series
    {
        return EventAction::Nothing;
    }
    EventAction::Patch(json!({
        "count": desired.count,
        "lastTimestamp": desired.last_timestamp,
        "message": desired.message,
        "series": desired.series,
    }))
}

/// A token bucket per upper pod: `burst` mirrored events at once, then one per `refill`, so a
/// crash-looping pod cannot flood the upper cluster's events (client-go's spam filter does the
/// same for a kubelet's own events).
#[derive(Debug)]
pub struct EventBudget {
    burst: u32,
    refill: Duration,
    buckets: HashMap<String, (u32, Instant)>,
    /// Calls since full buckets were last forgotten (done every [`PRUNE_EVERY`] calls, so
    /// the cost per call stays constant however many pods there are).
    since_prune: u32,
}

const PRUNE_EVERY: u32 = 1024;

impl EventBudget {
    /// A budget of `burst` events per pod, one more every `refill`.
    pub fn new(burst: u32, refill: Duration) -> Self {
        EventBudget {
            burst,
            refill,
            buckets: HashMap::new(),
            since_prune: 0,
        }
    }

    /// Whether one more event about pod `uid` may be written at `now` (and takes its token).
    pub fn allow(&mut self, uid: &str, now: Instant) -> bool {
        self.since_prune += 1;
        if self.since_prune >= PRUNE_EVERY {
            self.since_prune = 0;
            self.prune(now);
        }
        let (burst, refill) = (self.burst, self.refill);
        let (tokens, since) = self.buckets.entry(uid.to_owned()).or_insert((burst, now));
        let earned = if refill.is_zero() {
            burst
        } else {
            u32::try_from(now.saturating_duration_since(*since).as_nanos() / refill.as_nanos())
                .unwrap_or(u32::MAX)
        };
        if earned > 0 {
            *tokens = tokens.saturating_add(earned).min(burst);
            *since = now;
        }
        if *tokens == 0 {
            return false;
        }
        *tokens -= 1;
        true
    }

    /// Forgets pods whose buckets are full again (they would start full anyway).
    pub fn prune(&mut self, now: Instant) {
        let full_after = self.refill.saturating_mul(self.burst);
        self.buckets
            .retain(|_, (_, since)| now.saturating_duration_since(*since) < full_after);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn lower_event(count: i32, last: &str) -> Event {
        serde_json::from_value(json!({
            "metadata": {"name": "web-0.18a2b3c4d5e6f708", "namespace": "shop", "uid": "lower-ev-uid", "resourceVersion": "77"},
            "involvedObject": {
                "apiVersion": "v1", "kind": "Pod", "namespace": "shop", "name": "web-0",
                "uid": "lower-pod-uid", "resourceVersion": "12", "fieldPath": "spec.containers{app}",
            },
            "reason": "BackOff",
            "message": "Back-off pulling image \"nginx:nope\"",
            "type": "Warning",
            "source": {"component": "kubelet", "host": "lower-node-1"},
            "count": count,
            "firstTimestamp": "2026-11-22T10:00:00Z",
            "lastTimestamp": last,
            "related": {"kind": "Node", "name": "lower-node-1"},
        }))
        .unwrap()
    }

    fn upper_pod() -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "web-0", "namespace": "shop", "uid": "upper-pod-uid"},
            "spec": {"nodeName": "vk-a", "containers": [{"name": "app", "image": "nginx:nope"}]},
        }))
        .unwrap()
    }

    #[test]
    fn the_mirror_is_about_the_upper_pod_keeps_what_happened_and_is_marked_ours() {
        let mirror = mirrored_event(
            &lower_event(3, "2026-11-22T10:01:00Z"),
            &upper_pod(),
            "vk-a",
            "lower-a",
        )
        .unwrap();
        assert_eq!(
            serde_json::to_value(&mirror).unwrap(),
            json!({
                "apiVersion": "v1", "kind": "Event",
                "metadata": {
                    "name": "web-0.18a2b3c4d5e6f708", "namespace": "shop",
                    "labels": {keys::LABEL_OWNER: "vk-a"},
                },
                "involvedObject": {
                    "apiVersion": "v1", "kind": "Pod", "namespace": "shop", "name": "web-0",
                    "uid": "upper-pod-uid", "fieldPath": "spec.containers{app}",
                },
                "reason": "BackOff",
                "message": "Back-off pulling image \"nginx:nope\"",
                "type": "Warning",
                "source": {"component": "lower-a/kubelet", "host": "lower-node-1"},
                "count": 3,
                "firstTimestamp": "2026-11-22T10:00:00Z",
                "lastTimestamp": "2026-11-22T10:01:00Z",
            })
        );
    }

    #[test]
    fn the_lower_schedulers_event_names_the_lower_cluster_and_keeps_its_reporting_component() {
        // As the scheduler writes it (events.k8s.io), read through core/v1: no source.
        let scheduled: Event = serde_json::from_value(json!({
            "metadata": {"name": "web-0.18a2b3c4d5e6f709", "namespace": "shop"},
            "involvedObject": {"kind": "Pod", "namespace": "shop", "name": "web-0", "uid": "lower-pod-uid"},
            "reason": "Scheduled", "type": "Normal", "action": "Binding",
            "message": "Successfully assigned shop/web-0 to lower-node-1",
            "eventTime": "2026-11-22T10:00:00.000000Z",
            "reportingComponent": "default-scheduler", "reportingInstance": "default-scheduler-host",
        }))
        .unwrap();
        let mirror = mirrored_event(&scheduled, &upper_pod(), "vk-a", "admin@lower-a").unwrap();
        let source = mirror.source.unwrap();
        assert_eq!(
            source.component.as_deref(),
            Some("admin@lower-a/default-scheduler")
        );
        assert_eq!(source.host, None);
        assert_eq!(
            mirror.reporting_component.as_deref(),
            Some("default-scheduler")
        );
        let mut anonymous = scheduled;
        anonymous.reporting_component = None;
        let mirror = mirrored_event(&anonymous, &upper_pod(), "vk-a", "lower-a").unwrap();
        assert_eq!(
            mirror.source.and_then(|s| s.component).as_deref(),
            Some("lower-a")
        );
    }

    #[test]
    fn a_pod_without_uid_gets_no_mirror() {
        let mut pod = upper_pod();
        pod.metadata.uid = None;
        assert_eq!(
            mirrored_event(
                &lower_event(1, "2026-11-22T10:00:00Z"),
                &pod,
                "vk-a",
                "lower-a"
            ),
            None
        );
    }

    #[test]
    fn created_once_then_patched_only_when_it_repeats() {
        let first = mirrored_event(
            &lower_event(1, "2026-11-22T10:00:00Z"),
            &upper_pod(),
            "vk-a",
            "lower-a",
        )
        .unwrap();
        let EventAction::Create(created) = event_action(first.clone(), None) else {
            panic!("expected Create");
        };
        assert_eq!(event_action(first, Some(&created)), EventAction::Nothing);
        let again = mirrored_event(
            &lower_event(2, "2026-11-22T10:00:30Z"),
            &upper_pod(),
            "vk-a",
            "lower-a",
        )
        .unwrap();
        assert_eq!(
            event_action(again, Some(&created)),
            EventAction::Patch(json!({
                "count": 2,
                "lastTimestamp": "2026-11-22T10:00:30Z",
                "message": "Back-off pulling image \"nginx:nope\"",
                "series": null,
            }))
        );
    }

    #[test]
    fn the_budget_allows_a_burst_per_pod_then_one_per_refill() {
        let mut budget = EventBudget::new(3, Duration::from_secs(10));
        let t0 = Instant::now();
        assert!((0..3).all(|_| budget.allow("a", t0)));
        assert!(!budget.allow("a", t0), "burst spent");
        assert!(budget.allow("b", t0), "another pod has its own bucket");
        assert!(!budget.allow("a", t0 + Duration::from_secs(9)));
        assert!(budget.allow("a", t0 + Duration::from_secs(10)));
        assert!(!budget.allow("a", t0 + Duration::from_secs(11)));
        budget.prune(t0 + Duration::from_secs(100));
        assert!(budget.buckets.is_empty(), "full buckets are forgotten");
    }
}
