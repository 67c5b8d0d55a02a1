//! `tensile webhook`: the mutating admission webhook (AdmissionReview `admission.k8s.io/v1`,
//! `v1beta1` also read). The rules are `tensile_core::inject`; this module decodes reviews,
//! remembers which virtual nodes a workload recently failed on, reads upper claims from one
//! watch, and answers with an RFC 6902 JSONPatch.
//!
//! Answers: a CREATE of a pod it mutates gets `allowed: true` and a patch (none when nothing
//! changed); a request that is not a pod, or a pod that does not decode, or whose
//! `clusterSelector` annotation is malformed, gets `allowed: false` with the reason, which the
//! API server shows to the user; a body that is not an AdmissionReview gets HTTP 400.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use bytes::Bytes;
use futures::TryStreamExt as _;
use http::StatusCode;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::Api;
use kube::runtime::watcher;
use serde_json::{Value, json};
use tensile_core::inject::{self, Mutation};
use tensile_core::keys::{ANNOTATION_SELECTED_NODE, ANNOTATION_UNSCHEDULABLE_NODE};
use tensile_node::cache::CompactCache;
use tokio_util::sync::CancellationToken;

use crate::metrics::{self, WebhookMetrics};
use crate::serve::{Handler, Reply};

/// Default of `--exclusion-window`: how long a workload stays off a virtual node its pod
/// could not be placed on (the original's freeze window was 3 minutes).
pub const DEFAULT_EXCLUSION_WINDOW: Duration = Duration::from_secs(180);

/// How the webhook mutates pods.
#[derive(Debug, Clone)]
pub struct WebhookConfig {
    /// Selector keys that stay in the upper pod (`--ignore-selector-keys`).
    pub ignore_keys: BTreeSet<String>,
    /// How long an owner stays excluded from a virtual node after the descheduler marked one
    /// of its pods `unschedulable-node` there.
    pub exclusion_window: Duration,
}

impl Default for WebhookConfig {
    fn default() -> Self {
        Self {
            ignore_keys: inject::parse_ignore_keys(inject::DEFAULT_IGNORE_SELECTOR_KEYS),
            exclusion_window: DEFAULT_EXCLUSION_WINDOW,
        }
    }
}

/// The webhook's state: configuration, recent exclusions per owner, the upper claims.
#[derive(Debug)]
pub struct Webhook {
    config: WebhookConfig,
    exclusions: Mutex<HashMap<String, BTreeMap<String, Instant>>>,
    claims: Option<CompactCache<PersistentVolumeClaim>>,
    metrics: WebhookMetrics,
}

impl Webhook {
    /// A webhook without a cluster connection: it never pins pods to a claim's node.
    pub fn new(config: WebhookConfig) -> Self {
        Self {
            config,
            exclusions: Mutex::default(),
            claims: None,
            metrics: WebhookMetrics::default(),
        }
    }

    /// A webhook that reads upper claims from one watch of `client`'s cluster; resolves once
    /// the watch has listed (so no pod is admitted with a claim the webhook has not seen).
    pub async fn with_claims(
        config: WebhookConfig,
        client: kube::Client,
        stop: &CancellationToken,
    ) -> Self {
        let cache: CompactCache<PersistentVolumeClaim> = CompactCache::new();
        let events = tensile_node::backoff::watch(
            Api::<PersistentVolumeClaim>::all(client),
            watcher::Config::default(),
        );
        let (filler, stop) = (cache.clone(), stop.clone());
        tokio::spawn(async move {
            let events = events.inspect_ok(move |e| filler.apply(e));
            tensile_node::backoff::drain(Box::pin(events), &stop, "persistentvolumeclaims", |_| {})
                .await;
        });
        cache.wait_until_ready().await;
        Self {
            config,
            exclusions: Mutex::default(),
            claims: Some(cache),
            metrics: WebhookMetrics::default(),
        }
    }

    /// The same webhook, counting its answers in `metrics`.
    #[must_use]
    pub fn with_metrics(mut self, metrics: WebhookMetrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// The virtual nodes `owner` is currently excluded from.
    pub fn excluded_for(&self, owner: &str) -> Vec<String> {
        let Ok(mut all) = self.exclusions.lock() else {
            return Vec::new();
        };
        let window = self.config.exclusion_window;
        let now = Instant::now();
        // Expired entries go whenever the map is read, so it cannot grow without bound.
        all.retain(|_, nodes| {
            nodes.retain(|_, at| now.duration_since(*at) < window);
            !nodes.is_empty()
        });
        all.get(owner)
            .map(|n| n.keys().cloned().collect())
            .unwrap_or_default()
    }

    fn exclude(&self, owner: &str, node: &str) {
        if let Ok(mut all) = self.exclusions.lock() {
            all.entry(owner.to_owned())
                .or_default()
                .insert(node.to_owned(), Instant::now());
        }
    }

    /// The virtual node the first claim of `pod` with a `selected-node` is on.
    fn selected_node(&self, pod: &Pod, namespace: &str) -> Option<String> {
        let claims = self.claims.as_ref()?;
        pod.spec
            .as_ref()?
            .volumes
            .iter()
            .flatten()
            .filter_map(|v| v.persistent_volume_claim.as_ref())
            .find_map(|c| {
                claims
                    .get(namespace, &c.claim_name)?
                    .metadata
                    .annotations?
                    .get(ANNOTATION_SELECTED_NODE)
                    .filter(|n| !n.is_empty())
                    .cloned()
            })
    }

    /// Answers one AdmissionReview body: `Err` (HTTP 400) when it is not one.
    pub fn review(&self, body: &[u8]) -> Result<Value, String> {
        let started = Instant::now();
        let (answer, decision) = match self.answer(body) {
            Ok((answer, decision)) => (Ok(answer), decision),
            Err(e) => (Err(e), metrics::Decision::Invalid),
        };
        self.metrics.observe(decision, started.elapsed());
        answer
    }

    fn answer(&self, body: &[u8]) -> Result<(Value, metrics::Decision), String> {
        let review: Value =
            serde_json::from_slice(body).map_err(|e| format!("the body is not JSON: {e}"))?;
        let api_version = review
            .get("apiVersion")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if !matches!(
            api_version,
            "admission.k8s.io/v1" | "admission.k8s.io/v1beta1"
        ) || review.get("kind").and_then(Value::as_str) != Some("AdmissionReview")
        {
            return Err(format!(
                "expected an AdmissionReview of admission.k8s.io/v1, got kind {:?} of {api_version:?}",
                review
                    .get("kind")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
            ));
        }
        let request = review
            .get("request")
            .filter(|r| r.is_object())
            .ok_or("the AdmissionReview has no request")?;
        let uid = request
            .get("uid")
            .and_then(Value::as_str)
            .filter(|u| !u.is_empty())
            .ok_or("the AdmissionReview request has no uid")?;
        let decision = self.decide(request);
        let counted = match &decision {
            Ok(Decision::Allow) => metrics::Decision::Allowed,
            Ok(Decision::Patch(_)) => metrics::Decision::Patched,
            Err(_) => metrics::Decision::Denied,
        };
        let response = match decision {
            Ok(Decision::Allow) => json!({"uid": uid, "allowed": true}),
            Ok(Decision::Patch(patch)) => json!({"uid": uid, "allowed": true,
                "patchType": "JSONPatch", "patch": BASE64.encode(serde_json::to_vec(&patch).unwrap_or_default())}),
            Err(reason) => json!({"uid": uid, "allowed": false,
                "status": {"status": "Failure", "message": reason, "reason": "BadRequest", "code": 400}}),
        };
        Ok((
            json!({"apiVersion": api_version, "kind": "AdmissionReview", "response": response}),
            counted,
        ))
    }

    fn decide(&self, request: &Value) -> Result<Decision, String> {
        let kind = request
            .pointer("/kind/kind")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let group = request
            .pointer("/kind/group")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if kind != "Pod" || !group.is_empty() {
            return Err(format!(
                "this webhook mutates pods only, got a {kind:?} of group {group:?}: check the rules of its MutatingWebhookConfiguration"
            ));
        }
        let operation = request
            .get("operation")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if !matches!(operation, "CREATE" | "UPDATE") {
            return Ok(Decision::Allow);
        }
        let raw = request
            .get("object")
            .filter(|o| o.is_object())
            .ok_or_else(|| format!("the {operation} request carries no pod"))?;
        let pod: Pod = serde_json::from_value(raw.clone())
            .map_err(|e| format!("the pod cannot be decoded: {e}"))?;
        let namespace = request
            .get("namespace")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
            .or(pod.metadata.namespace.as_deref())
            .unwrap_or("default");
        if let Some(why) = inject::skip(&pod, namespace) {
            tracing::debug!(pod = ?pod.metadata.name, namespace, reason = %why, "not mutated");
            return Ok(Decision::Allow);
        }
        let owner = tensile_core::deschedule::controller_uid(&pod);
        if operation == "UPDATE" {
            // The descheduler marks a pod it is about to delete; its owner's replacement must
            // not go back to that node.
            let node = pod
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(ANNOTATION_UNSCHEDULABLE_NODE))
                .filter(|n| !n.is_empty());
            if let (Some(owner), Some(node)) = (owner, node) {
                tracing::info!(owner, node = %node, "owner excluded from virtual node");
                self.exclude(owner, node);
            }
            return Ok(Decision::Allow);
        }
        let excluded = owner.map(|o| self.excluded_for(o)).unwrap_or_default();
        let selected = self.selected_node(&pod, namespace);
        let mutated = inject::mutate(
            &pod,
            &Mutation {
                ignore_keys: self.config.ignore_keys.clone(),
                selected_node: selected.as_deref(),
                excluded_nodes: &excluded,
            },
        )
        .map_err(|e| e.to_string())?;
        let before = serde_json::to_value(&pod).map_err(|e| e.to_string())?;
        let after = serde_json::to_value(&mutated).map_err(|e| e.to_string())?;
        let patch = json_patch::diff(&before, &after);
        if patch.0.is_empty() {
            return Ok(Decision::Allow);
        }
        tracing::debug!(pod = ?pod.metadata.name, namespace, operations = patch.0.len(), "mutated");
        Ok(Decision::Patch(patch))
    }
}

enum Decision {
    Allow,
    Patch(json_patch::Patch),
}

/// Largest AdmissionReview accepted: a pod and, for an UPDATE, its old version, each at most the
/// API server's 3 MiB request limit, plus the review around them.
pub const MAX_ADMISSION_REVIEW: usize = 8 << 20;

impl Handler for Webhook {
    fn max_body(&self) -> usize {
        MAX_ADMISSION_REVIEW
    }

    fn handle(&self, path: &str, body: Bytes) -> Pin<Box<dyn Future<Output = Reply> + Send + '_>> {
        let path = path.to_owned();
        Box::pin(async move {
            match self.review(&body) {
                Ok(answer) => Reply::json(&answer),
                Err(reason) => {
                    tracing::warn!(
                        path,
                        reason,
                        "refused a request that is not an AdmissionReview"
                    );
                    Reply::error(StatusCode::BAD_REQUEST, &reason)
                }
            }
        })
    }
}

/// Shares one webhook between the server and whoever else holds it (tests, `tensile up`).
impl Handler for Arc<Webhook> {
    fn handle(&self, path: &str, body: Bytes) -> Pin<Box<dyn Future<Output = Reply> + Send + '_>> {
        self.as_ref().handle(path, body)
    }

    fn max_body(&self) -> usize {
        self.as_ref().max_body()
    }
}
