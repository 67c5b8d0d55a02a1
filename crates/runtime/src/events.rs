//! Events about upper pods (core/v1, which `kubectl describe` reads and every API server
//! serves), sent in the background so a reconcile never waits for one, deduplicated (a repeat
//! within ten minutes raises the first one's count instead of creating another), and dropped
//! rather than queued without bound when the upper API server cannot keep up, as client-go's
//! broadcaster does.
//!
//! Not kube's `Recorder`: it scans its whole cache under a write lock on every event, so a
//! burst of 10,000 pods (10,000 distinct events) serialised every pod sync behind an O(n) scan.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio::sync::mpsc;

/// How long a repeat counts as the same event.
const SERIES_WINDOW: Duration = Duration::from_secs(600);
/// Events waiting to be sent; beyond this they are dropped (and logged).
const QUEUE: usize = 4096;
/// Event writes in flight at once.
const IN_FLIGHT: usize = 8;

/// One event to send.
#[derive(Debug, Clone)]
pub struct PodEvent {
    /// The pod it is about.
    pub regarding: ObjectReference,
    /// Warning (true) or Normal.
    pub warning: bool,
    /// Reason (CamelCase) and action.
    pub reason: String,
    /// What happened, for people.
    pub note: String,
}

/// Sends [`PodEvent`]s; cheap to clone.
#[derive(Debug, Clone)]
pub struct EventSink {
    tx: mpsc::Sender<PodEvent>,
}

impl EventSink {
    /// Starts the sender for `controller`/`instance` (the virtual node's name).
    pub fn start(client: kube::Client, controller: &str, instance: &str) -> Self {
        let (tx, rx) = mpsc::channel(QUEUE);
        tokio::spawn(send_all(
            client,
            controller.to_owned(),
            instance.to_owned(),
            rx,
        ));
        Self { tx }
    }

    /// Queues `event`; never waits.
    pub fn publish(&self, event: PodEvent) {
        if let Err(e) = self.tx.try_send(event) {
            tracing::debug!(error = %e, "event dropped: the upper cluster is not keeping up");
        }
    }
}

/// What identifies repeats: the object, the reason and the note.
type SeriesKey = (String, String, String);

struct Sent {
    name: String,
    count: i32,
    last: Instant,
}

async fn send_all(
    client: kube::Client,
    controller: String,
    instance: String,
    mut rx: mpsc::Receiver<PodEvent>,
) {
    let mut sent: HashMap<SeriesKey, Sent> = HashMap::new();
    let in_flight = std::sync::Arc::new(tokio::sync::Semaphore::new(IN_FLIGHT));
    let mut since_prune = 0usize;
    while let Some(ev) = rx.recv().await {
        // Forget old series now and then: amortised O(1) per event.
        since_prune += 1;
        if since_prune >= 1024 {
            since_prune = 0;
            sent.retain(|_, s| s.last.elapsed() < SERIES_WINDOW);
        }
        // Events about cluster-scoped objects (the virtual Node) go to `default`, as the
        // kubelet's do.
        let namespace = ev
            .regarding
            .namespace
            .clone()
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| "default".to_owned());
        let key = (
            ev.regarding.uid.clone().unwrap_or_default(),
            ev.reason.clone(),
            ev.note.clone(),
        );
        let api: Api<Event> = Api::namespaced(client.clone(), &namespace);
        let now = Time(Timestamp::now());
        let Ok(permit) = in_flight.clone().acquire_owned().await else {
            return;
        };
        if let Some(s) = sent
            .get_mut(&key)
            .filter(|s| s.last.elapsed() < SERIES_WINDOW)
        {
            s.count = s.count.saturating_add(1);
            s.last = Instant::now();
            let name = s.name.clone();
            let patch = json!({"count": s.count, "lastTimestamp": now});
            tokio::spawn(async move {
                if let Err(e) = api
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                {
                    tracing::debug!(event = %name, namespace = %namespace, error = %e, "updating an event series");
                }
                drop(permit);
            });
            continue;
        }
        let name = format!(
            "{}.{:x}",
            ev.regarding.name.as_deref().unwrap_or("pod"),
            Timestamp::now().as_nanosecond()
        );
        // Remembered before it exists: a repeat arriving meanwhile patches it (or fails
        // harmlessly if the creation fails).
        sent.insert(
            key,
            Sent {
                name: name.clone(),
                count: 1,
                last: Instant::now(),
            },
        );
        let event = Event {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(namespace.clone()),
                ..ObjectMeta::default()
            },
            reason: Some(ev.reason),
            message: Some(ev.note),
            type_: Some(if ev.warning { "Warning" } else { "Normal" }.to_owned()),
            involved_object: ev.regarding,
            source: Some(EventSource {
                component: Some(controller.clone()),
                host: Some(instance.clone()),
            }),
            count: Some(1),
            first_timestamp: Some(now.clone()),
            last_timestamp: Some(now),
            reporting_component: Some(controller.clone()),
            reporting_instance: Some(instance.clone()),
            ..Event::default()
        };
        tokio::spawn(async move {
            if let Err(e) = api.create(&PostParams::default(), &event).await {
                tracing::debug!(event = %name, namespace = %namespace, error = %e, "creating an event");
            }
            drop(permit);
        });
    }
}
