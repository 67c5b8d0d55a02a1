//! `tensile webhook`: the mutating admission webhook (AdmissionReview `admission.k8s.io/v1`,
//! `v1beta1` also read). The rules are `tensile_core::inject`; this module decodes reviews,
//! reads upper claims and the descheduler's exclusion records (which virtual nodes a workload
//! recently failed on) from one watch each, and answers with an RFC 6902 JSONPatch.
//!
//! It keeps no state of its own: every replica answers the same from the same objects, so it
//! runs as many replicas as wanted and a restart loses nothing.
//!
//! Answers: a CREATE of a pod it mutates gets `allowed: true` and a patch (none when nothing
//! changed); a request that is not a pod, or a pod that does not decode, or whose
//! `clusterSelector` annotation is malformed, gets `allowed: false` with the reason, which the
//! API server shows to the user; a body that is not an AdmissionReview gets HTTP 400.

use std::collections::BTreeSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use bytes::Bytes;
use futures::TryStreamExt as _;
use http::StatusCode;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::runtime::watcher;
use serde_json::{Value, json};
use tensile_core::deschedule;
use tensile_core::inject::{self, Mutation};
use tensile_core::keys::ANNOTATION_SELECTED_NODE;
use tensile_node::cache::CompactCache;
use tokio_util::sync::CancellationToken;

use crate::descheduler::{LABEL_MOVE, VALUE_EXCLUSIONS};
use crate::metrics::{self, WebhookMetrics};
use crate::serve::{Handler, Reply};

/// How the webhook mutates pods.
#[derive(Debug, Clone)]
pub struct WebhookConfig {
    /// Selector keys that stay in the upper pod (`--ignore-selector-keys`).
    pub ignore_keys: BTreeSet<String>,
    /// Where the descheduler keeps its exclusion records (its `--namespace`).
    pub exclusions_namespace: String,
}

impl Default for WebhookConfig {
    fn default() -> Self {
        Self {
            ignore_keys: inject::parse_ignore_keys(inject::DEFAULT_IGNORE_SELECTOR_KEYS),
            exclusions_namespace: "kube-system".into(),
        }
    }
}

/// The webhook: configuration and what it reads from the upper cluster.
#[derive(Debug)]
pub struct Webhook {
    config: WebhookConfig,
    /// The descheduler's exclusion records.
    exclusions: Option<CompactCache<ConfigMap>>,
    claims: Option<CompactCache<PersistentVolumeClaim>>,
    metrics: WebhookMetrics,
}

/// A cache filled by one watch until `stop`.
fn watched<K>(
    api: Api<K>,
    config: watcher::Config,
    what: &'static str,
    stop: &CancellationToken,
) -> CompactCache<K>
where
    K: kube::Resource
        + Clone
        + std::fmt::Debug
        + serde::Serialize
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let cache: CompactCache<K> = CompactCache::new();
    let events = tensile_node::backoff::watch(api, config);
    let (filler, stop) = (cache.clone(), stop.clone());
    tokio::spawn(async move {
        let events = events.inspect_ok(move |e| filler.apply(e));
        tensile_node::backoff::drain(Box::pin(events), &stop, what, |_| {}).await;
    });
    cache
}

impl Webhook {
    /// A webhook without a cluster connection: it never pins pods to a claim's node and
    /// knows no exclusions.
    pub fn new(config: WebhookConfig) -> Self {
        Self {
            config,
            exclusions: None,
            claims: None,
            metrics: WebhookMetrics::default(),
        }
    }

    /// A webhook that reads upper claims and the descheduler's exclusion records from one
    /// watch each of `client`'s cluster; resolves once both have listed (so no pod is admitted
    /// with a claim or an exclusion the webhook has not seen).
    pub async fn connected(
        config: WebhookConfig,
        client: kube::Client,
        stop: &CancellationToken,
    ) -> Self {
        let claims = watched(
            Api::<PersistentVolumeClaim>::all(client.clone()),
            watcher::Config::default(),
            "persistentvolumeclaims",
            stop,
        );
        let exclusions = watched(
            Api::<ConfigMap>::namespaced(client, &config.exclusions_namespace),
            watcher::Config::default().labels(&format!("{LABEL_MOVE}={VALUE_EXCLUSIONS}")),
            "exclusion records",
            stop,
        );
        claims.wait_until_ready().await;
        exclusions.wait_until_ready().await;
        Self {
            config,
            exclusions: Some(exclusions),
            claims: Some(claims),
            metrics: WebhookMetrics::default(),
        }
    }

    /// The same webhook, counting its answers in `metrics`.
    #[must_use]
    pub fn with_metrics(mut self, metrics: WebhookMetrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// The virtual nodes the controller with UID `owner` is currently kept off.
    pub fn excluded_for(&self, owner: &str) -> Vec<String> {
        self.exclusions
            .as_ref()
            .and_then(|c| {
                c.get(
                    &self.config.exclusions_namespace,
                    &deschedule::exclusions_name(owner),
                )
            })
            .and_then(|cm| cm.data)
            .map(|record| deschedule::excluded_now(&record, Timestamp::now()))
            .unwrap_or_default()
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
        // An UPDATE is never mutated (older configurations registered it for the
        // descheduler's mark, which the exclusion records replace).
        if operation != "CREATE" {
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
        let owner = deschedule::controller_uid(&pod);
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
