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

use std::collections::{BTreeMap, BTreeSet};
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
use tensile_runtime::cache::CompactCache;
use tokio_util::sync::CancellationToken;

use crate::bounded::{self, Keys};
use crate::descheduler::{LABEL_MOVE, VALUE_EXCLUSIONS};
use crate::metrics::{self, WebhookMetrics};
use crate::serve::{Handler, Reply, truncated};

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
///
/// Its state is two watch caches (the descheduler's exclusion records and the upper claims);
/// what it does with a pod is decided from them and the time alone ([`Webhook::admit`]), so
/// its rules are tested by filling the caches with watch events, without a cluster.
#[derive(Debug)]
pub struct Webhook {
    config: WebhookConfig,
    /// The descheduler's exclusion records.
    exclusions: CompactCache<ConfigMap>,
    claims: CompactCache<PersistentVolumeClaim>,
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
    let events = tensile_runtime::backoff::watch(api, config);
    let (filler, stop) = (cache.clone(), stop.clone());
    tokio::spawn(async move {
        let events = events.inspect_ok(move |e| filler.apply(e));
        tensile_runtime::backoff::drain(Box::pin(events), &stop, what, |_| {}).await;
    });
    cache
}

impl Webhook {
    /// A webhook without a cluster connection: it never pins pods to a claim's node and
    /// knows no exclusions.
    pub fn new(config: WebhookConfig) -> Self {
        Self {
            config,
            exclusions: CompactCache::new(),
            claims: CompactCache::new(),
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
            exclusions,
            claims,
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
        self.excluded_at(owner, Timestamp::now())
    }

    /// The virtual nodes the controller with UID `owner` is kept off at `now`.
    fn excluded_at(&self, owner: &str, now: Timestamp) -> Vec<String> {
        self.exclusions
            .get(
                &self.config.exclusions_namespace,
                &deschedule::exclusions_name(owner),
            )
            .and_then(|cm| cm.data)
            .map(|record| deschedule::excluded_now(&record, now))
            .unwrap_or_default()
    }

    /// The virtual node the first claim of `pod` with a `selected-node` is on.
    fn selected_node(&self, pod: &Pod, namespace: &str) -> Option<String> {
        let claims = &self.claims;
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
        // The envelope, typed: the pod is walked (bounded) and decoded on its own below, and
        // nothing else of the body is kept.
        let review: Review = serde_json::from_slice(body).map_err(|e| {
            if e.is_syntax() || e.is_eof() {
                format!("the body is not JSON: {e}")
            } else {
                format!("the body is not an AdmissionReview: {e}")
            }
        })?;
        let api_version = review.api_version.as_str();
        if !matches!(
            api_version,
            "admission.k8s.io/v1" | "admission.k8s.io/v1beta1"
        ) || review.kind != "AdmissionReview"
        {
            return Err(format!(
                "expected an AdmissionReview of admission.k8s.io/v1, got kind {:?} of {:?}",
                truncated(&review.kind, 64),
                truncated(api_version, 64),
            ));
        }
        let request = review
            .request
            .as_ref()
            .ok_or("the AdmissionReview has no request")?;
        let uid = Some(request.uid.as_str())
            .filter(|u| !u.is_empty())
            .ok_or("the AdmissionReview request has no uid")?;
        let decision = self.decide(request, body);
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

    fn decide(&self, request: &ReviewRequest, body: &[u8]) -> Result<Decision, String> {
        let (kind, group) = (&request.kind.kind, &request.kind.group);
        if kind != "Pod" || !group.is_empty() {
            return Err(format!(
                "this webhook mutates pods only, got a {:?} of group {:?}: check the rules of its MutatingWebhookConfiguration",
                truncated(kind, 64),
                truncated(group, 64),
            ));
        }
        let operation = request.operation.as_str();
        // An UPDATE is never mutated (older configurations registered it for the
        // descheduler's mark, which the exclusion records replace).
        if operation != "CREATE" {
            return Ok(Decision::Allow);
        }
        if request.object.is_none() {
            return Err(format!("the {operation} request carries no pod"));
        }
        // Walked before it is decoded: a pod is bounded in size by the body limit, but not
        // what decoding it takes (`{}` read as a container is over a kilobyte).
        let path = ["request", "object"];
        bounded::check_at(body, &path, Keys::Exact, bounded::POD_SHAPE)
            .map_err(|e| format!("the pod cannot be decoded: {e}"))?;
        let pod: Pod = bounded::at(body, &path, Keys::Exact)
            .map_err(|e| format!("the pod cannot be decoded: {e}"))?
            .ok_or_else(|| format!("the {operation} request carries no pod"))?;
        let namespace = Some(request.namespace.as_str())
            .filter(|n| !n.is_empty())
            .or(pod.metadata.namespace.as_deref())
            .unwrap_or("default")
            .to_owned();
        self.admit(pod, &namespace, Timestamp::now())
    }

    /// What the webhook does with `pod`, created in `namespace`, at `now`: left alone (not a
    /// virtual pod, `kube-system`, a descheduler's replacement), or the patch that moves its
    /// constraints into `clusterSelector`, pins it to its claim's node and keeps it off the
    /// nodes its controller is excluded from; `Err` with the reason it is refused.
    fn admit(&self, pod: Pod, namespace: &str, now: Timestamp) -> Result<Decision, String> {
        let name = truncated(pod.metadata.name.as_deref().unwrap_or_default(), 253);
        let namespace_shown = truncated(namespace, 63);
        if let Some(why) = inject::skip(&pod, namespace) {
            tracing::debug!(pod = %name, namespace = %namespace_shown, reason = %why, "not mutated");
            return Ok(Decision::Allow);
        }
        let owner = deschedule::controller_uid(&pod);
        let excluded = owner.map(|o| self.excluded_at(o, now)).unwrap_or_default();
        let selected = self.selected_node(&pod, namespace);
        // The touched fields as sent, then the pod is mutated in place (not held twice).
        let before = Touched::of(&pod).map_err(|e| e.to_string())?;
        let mutated = inject::mutate_owned(
            pod,
            &Mutation {
                ignore_keys: self.config.ignore_keys.clone(),
                selected_node: selected.as_deref(),
                excluded_nodes: &excluded,
            },
        )
        .map_err(|e| e.to_string())?;
        let patch = before.patch_to(&mutated).map_err(|e| e.to_string())?;
        if patch.0.is_empty() {
            return Ok(Decision::Allow);
        }
        tracing::debug!(pod = %name, namespace = %namespace_shown, operations = patch.0.len(), "mutated");
        Ok(Decision::Patch(patch))
    }
}

/// The AdmissionReview members the webhook reads; the rest of the body is skipped.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct Review {
    api_version: String,
    kind: String,
    request: Option<ReviewRequest>,
}

#[derive(Debug, Default, serde::Deserialize)]
#[serde(default)]
struct ReviewRequest {
    uid: String,
    kind: GroupVersionKind,
    operation: String,
    namespace: String,
    /// Whether there is one: it is walked and decoded on its own (`bounded`).
    object: Option<serde::de::IgnoredAny>,
}

#[derive(Debug, Default, serde::Deserialize)]
#[serde(default)]
struct GroupVersionKind {
    group: String,
    kind: String,
}

/// What `inject::mutate` may change, at the same paths as in the pod: the patch is computed
/// from these alone (not from the whole pod serialized twice) and applies to the pod the API
/// server sent, since each subtree here is whole and every container keeps its index. The
/// annotations are compared key by key (a pod may carry many; they are not copied into JSON).
struct Touched {
    annotations: Option<BTreeMap<String, String>>,
    spec: Value,
}

impl Touched {
    fn of(pod: &Pod) -> Result<Self, serde_json::Error> {
        Ok(Self {
            annotations: pod.metadata.annotations.clone(),
            spec: touched_spec(pod)?,
        })
    }

    /// The JSONPatch from these fields to `after`'s.
    fn patch_to(&self, after: &Pod) -> Result<json_patch::Patch, serde_json::Error> {
        use json_patch::jsonptr::PointerBuf;
        use json_patch::{AddOperation, PatchOperation, RemoveOperation, ReplaceOperation};
        let mut ops = Vec::new();
        match (&self.annotations, &after.metadata.annotations) {
            (None, Some(a)) => ops.push(PatchOperation::Add(AddOperation {
                path: PointerBuf::from_tokens(["metadata", "annotations"]),
                value: serde_json::to_value(a)?,
            })),
            (Some(_), None) => ops.push(PatchOperation::Remove(RemoveOperation {
                path: PointerBuf::from_tokens(["metadata", "annotations"]),
            })),
            (Some(b), Some(a)) => {
                let at = |k: &str| PointerBuf::from_tokens(["metadata", "annotations", k]);
                for (k, v) in a {
                    match b.get(k) {
                        None => ops.push(PatchOperation::Add(AddOperation {
                            path: at(k),
                            value: Value::String(v.clone()),
                        })),
                        Some(old) if old != v => {
                            ops.push(PatchOperation::Replace(ReplaceOperation {
                                path: at(k),
                                value: Value::String(v.clone()),
                            }))
                        }
                        Some(_) => {}
                    }
                }
                for k in b.keys().filter(|k| !a.contains_key(*k)) {
                    ops.push(PatchOperation::Remove(RemoveOperation { path: at(k) }));
                }
            }
            (None, None) => {}
        }
        ops.extend(json_patch::diff(&self.spec, &touched_spec(after)?).0);
        Ok(json_patch::Patch(ops))
    }
}

/// The spec fields `inject::mutate` may change, at their paths in the pod.
fn touched_spec(pod: &Pod) -> Result<Value, serde_json::Error> {
    let mut out = serde_json::Map::new();
    if let Some(spec) = &pod.spec {
        let mut s = serde_json::Map::new();
        if let Some(v) = &spec.node_name {
            s.insert("nodeName".into(), serde_json::to_value(v)?);
        }
        if let Some(v) = &spec.node_selector {
            s.insert("nodeSelector".into(), serde_json::to_value(v)?);
        }
        if let Some(v) = &spec.affinity {
            s.insert("affinity".into(), serde_json::to_value(v)?);
        }
        if let Some(v) = &spec.tolerations {
            s.insert("tolerations".into(), serde_json::to_value(v)?);
        }
        let containers = spec
            .containers
            .iter()
            .map(|c| {
                let mut m = serde_json::Map::new();
                if let Some(r) = &c.resources {
                    m.insert("resources".into(), serde_json::to_value(r)?);
                }
                Ok(Value::Object(m))
            })
            .collect::<Result<Vec<_>, serde_json::Error>>()?;
        s.insert("containers".into(), Value::Array(containers));
        out.insert("spec".into(), Value::Object(s));
    }
    Ok(Value::Object(out))
}

/// The JSONPatch from `before` to `after`, which differ only where [`Touched`] looks.
#[cfg(test)]
fn patch_of(before: &Pod, after: &Pod) -> Result<json_patch::Patch, serde_json::Error> {
    Touched::of(before)?.patch_to(after)
}

#[derive(Debug)]
enum Decision {
    Allow,
    Patch(json_patch::Patch),
}

/// Largest AdmissionReview accepted. The shipped configuration sends CREATEs only, so a review
/// carries one pod (`oldObject` is null). The API server refuses request bodies over 3 MiB
/// and etcd objects over 1.5 MiB, so the pod in a review is at most the 3 MiB the user sent,
/// plus the defaults the API server filled in (a few KiB) and the review around it (its
/// userInfo, a few KiB): 4 MiB leaves room. A larger review could never be stored anyway.
pub const MAX_ADMISSION_REVIEW: usize = 4 << 20;

/// Reviews worked on at once: each holds at most a 4 MiB body and the pod decoded from it
/// (bounded by `bounded::POD_SHAPE`) twice (as sent and mutated). Reviews take microseconds,
/// so a burst of pod creations waits a moment rather than being refused.
pub const MAX_CONCURRENT_REVIEWS: usize = 2;

impl Handler for Webhook {
    fn max_body(&self) -> usize {
        MAX_ADMISSION_REVIEW
    }

    fn max_concurrent(&self) -> usize {
        MAX_CONCURRENT_REVIEWS
    }

    fn handle(&self, path: &str, body: Bytes) -> Pin<Box<dyn Future<Output = Reply> + Send + '_>> {
        let path = truncated(path, 128);
        Box::pin(async move {
            match self.review(&body) {
                Ok(answer) => Reply::json(&answer),
                Err(reason) => {
                    // What a request says is cut short before it is logged.
                    tracing::warn!(
                        path,
                        reason = %truncated(&reason, 512),
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

    fn max_concurrent(&self) -> usize {
        self.as_ref().max_concurrent()
    }

    fn max_waiting(&self) -> usize {
        self.as_ref().max_waiting()
    }

    fn large_bodies(&self) -> usize {
        self.as_ref().large_bodies()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The patch from the touched fields alone applies to the whole pod the API server sent
    /// and gives the whole mutated pod.
    #[test]
    fn the_patch_of_the_touched_fields_applies_to_the_whole_pod() {
        let with_annotations: Pod = serde_json::from_value(json!({
            "metadata": {"name": "q", "annotations": {"keep": "x", "a/b~c": "y"}},
            "spec": {"nodeSelector": {"disk": "ssd"}, "containers": [{"name": "a"}]}
        }))
        .unwrap();
        let mutated = inject::mutate(&with_annotations, &Mutation::default()).unwrap();
        let patch = patch_of(&with_annotations, &mutated).unwrap();
        let mut sent = serde_json::to_value(&with_annotations).unwrap();
        json_patch::patch(&mut sent, &patch).unwrap();
        assert_eq!(sent, serde_json::to_value(&mutated).unwrap());
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "labels": {"virtual-pod": "true"}},
            "spec": {
                "nodeSelector": {"disk": "ssd", "kubernetes.io/os": "linux"},
                "tolerations": [{"key": "k", "operator": "Exists"}],
                "containers": [
                    {"name": "a", "image": "x", "env": [{"name": "E", "value": "1"}]},
                    {"name": "b", "image": "y", "resources": {"requests": {"cpu": "1"}}}
                ],
                "volumes": [{"name": "v", "emptyDir": {}}]
            }
        }))
        .unwrap();
        let mutated = inject::mutate(
            &pod,
            &Mutation {
                ignore_keys: inject::parse_ignore_keys(inject::DEFAULT_IGNORE_SELECTOR_KEYS),
                selected_node: Some("vk-1"),
                excluded_nodes: &["vk-2".to_owned()],
            },
        )
        .unwrap();
        let patch = patch_of(&pod, &mutated).unwrap();
        assert!(!patch.0.is_empty());
        let mut sent = serde_json::to_value(&pod).unwrap();
        json_patch::patch(&mut sent, &patch).unwrap();
        assert_eq!(sent, serde_json::to_value(&mutated).unwrap());
    }

    const NOW: &str = "2026-11-28T00:00:00Z";

    /// A webhook whose watches showed an exclusion record of controller `rs-1` (vk-1 until
    /// after NOW, vk-0 lapsed), one of `rs-2` (vk-2), and a claim `data` of namespace `ns`
    /// bound on vk-3.
    fn filled() -> Webhook {
        let webhook = Webhook::new(WebhookConfig {
            exclusions_namespace: "tensile".into(),
            ..WebhookConfig::default()
        });
        for (owner, data) in [
            (
                "rs-1",
                json!({"vk-1": "2026-11-28T00:03:00Z", "vk-0": "2026-11-27T23:59:00Z"}),
            ),
            ("rs-2", json!({"vk-2": "2026-11-28T00:03:00Z"})),
        ] {
            let record: ConfigMap = serde_json::from_value(json!({"metadata": {
                "name": deschedule::exclusions_name(owner), "namespace": "tensile",
                "labels": {LABEL_MOVE: VALUE_EXCLUSIONS}}, "data": data}))
            .unwrap();
            webhook.exclusions.apply(&watcher::Event::Apply(record));
        }
        let claim: PersistentVolumeClaim = serde_json::from_value(json!({"metadata": {
            "name": "data", "namespace": "ns",
            "annotations": {ANNOTATION_SELECTED_NODE: "vk-3"}}}))
        .unwrap();
        webhook.claims.apply(&watcher::Event::Apply(claim));
        webhook
    }

    /// A pod labelled `labels`, controlled by `owner` (`controller: true` unless `"~"` is
    /// prefixed), with the claim `data` when `claim`.
    fn pod(labels: Value, owner: Option<&str>, claim: bool) -> Pod {
        let mut pod = json!({
            "metadata": {"name": "p", "labels": labels},
            "spec": {"containers": [{"name": "c", "image": "i"}]}
        });
        if let Some(owner) = owner {
            let (uid, controller) = match owner.strip_prefix('~') {
                Some(uid) => (uid, false),
                None => (owner, true),
            };
            pod["metadata"]["ownerReferences"] = json!([{"apiVersion": "apps/v1",
                "kind": "ReplicaSet", "name": "rs", "uid": uid, "controller": controller}]);
        }
        if claim {
            pod["spec"]["volumes"] =
                json!([{"name": "v", "persistentVolumeClaim": {"claimName": "data"}}]);
        }
        serde_json::from_value(pod).unwrap()
    }

    /// The pod as the webhook's answer leaves it: `None` when it is left alone.
    fn admitted(webhook: &Webhook, pod: &Pod, namespace: &str) -> Result<Option<Value>, String> {
        let now: Timestamp = NOW.parse().unwrap();
        match webhook.admit(pod.clone(), namespace, now)? {
            Decision::Allow => Ok(None),
            Decision::Patch(patch) => {
                let mut sent = serde_json::to_value(pod).unwrap();
                json_patch::patch(&mut sent, &patch).unwrap();
                Ok(Some(sent))
            }
        }
    }

    #[test]
    fn which_pods_are_kept_off_which_nodes() {
        use tensile_core::keys::ANNOTATION_EXCLUDED_NODES;
        let webhook = filled();
        let virtual_pod = json!({"virtual-pod": "true"});
        // (case, namespace, pod, the excluded-nodes annotation expected; None: left alone)
        let rows: [(&str, &str, Pod, Option<Option<&str>>); 8] = [
            (
                "a virtual pod of an excluded controller: its live nodes",
                "ns",
                pod(virtual_pod.clone(), Some("rs-1"), false),
                Some(Some("vk-1")),
            ),
            (
                "another controller's record is not its own",
                "ns",
                pod(virtual_pod.clone(), Some("rs-2"), false),
                Some(Some("vk-2")),
            ),
            (
                "a controller without a record",
                "ns",
                pod(virtual_pod.clone(), Some("rs-3"), false),
                Some(None),
            ),
            (
                "an owner that is not the controller excludes nothing",
                "ns",
                pod(virtual_pod.clone(), Some("~rs-1"), false),
                Some(None),
            ),
            (
                "a bare pod",
                "ns",
                pod(virtual_pod.clone(), None, false),
                Some(None),
            ),
            (
                "not a virtual pod: left alone",
                "ns",
                pod(json!({"app": "x"}), Some("rs-1"), false),
                None,
            ),
            (
                "kube-system: left alone",
                "kube-system",
                pod(virtual_pod.clone(), Some("rs-1"), false),
                None,
            ),
            (
                "the descheduler's replacement: left alone",
                "ns",
                pod(
                    json!({"virtual-pod": "true", "create-by-descheduler": "true"}),
                    Some("rs-1"),
                    false,
                ),
                None,
            ),
        ];
        for (case, namespace, pod, expected) in rows {
            let admitted = admitted(&webhook, &pod, namespace).unwrap();
            match (expected, admitted) {
                (None, None) => {}
                (Some(excluded), Some(after)) => {
                    let annotation =
                        after["metadata"]["annotations"][ANNOTATION_EXCLUDED_NODES].as_str();
                    assert_eq!(annotation, excluded, "{case}: {after}");
                    let affinity = after["spec"]["affinity"].to_string();
                    for node in excluded.into_iter().flat_map(|e| e.split(',')) {
                        assert!(
                            affinity.contains(node),
                            "{case}: kept off {node}: {affinity}"
                        );
                    }
                }
                (expected, admitted) => {
                    panic!("{case}: expected {expected:?}, got {admitted:?}")
                }
            }
        }
    }

    #[test]
    fn a_virtual_pod_is_pinned_to_its_claims_node_and_a_bad_selector_is_refused() {
        let webhook = filled();
        let with_claim = pod(json!({"virtual-pod": "true"}), None, true);
        let after = admitted(&webhook, &with_claim, "ns").unwrap().unwrap();
        assert_eq!(after["spec"]["nodeName"], "vk-3");
        // The claim is looked up in the pod's namespace.
        let after = admitted(&webhook, &with_claim, "other").unwrap().unwrap();
        assert_eq!(after["spec"]["nodeName"], Value::Null);
        let mut bad = pod(json!({"virtual-pod": "true"}), None, false);
        bad.metadata.annotations =
            Some([("clusterSelector".to_owned(), "{not json".to_owned())].into());
        let refused = admitted(&webhook, &bad, "ns").unwrap_err();
        assert!(refused.contains("clusterSelector"), "{refused}");
    }

    #[test]
    fn an_attacker_sized_kind_is_answered_and_logged_short() {
        let webhook = Webhook::new(WebhookConfig::default());
        let kind = "K".repeat(1 << 20);
        let body = serde_json::to_vec(&json!({"apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview", "request": {"uid": "u", "kind": {"kind": kind}}}))
        .unwrap();
        let answer = webhook.review(&body).unwrap();
        let message = answer["response"]["status"]["message"].as_str().unwrap();
        assert!(message.contains("mutates pods only"), "{message}");
        assert!(message.len() < 1024, "{} bytes", message.len());
        let err = webhook
            .review(&serde_json::to_vec(&json!({"apiVersion": "v1", "kind": kind})).unwrap())
            .unwrap_err();
        assert!(err.len() < 1024, "{} bytes", err.len());
    }

    #[test]
    fn a_pod_of_a_million_empty_containers_is_refused_before_it_is_decoded() {
        let webhook = Webhook::new(WebhookConfig::default());
        let containers = vec!["{}"; 1 << 20].join(",");
        let body = format!(
            r#"{{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {{"uid": "u", "kind": {{"kind": "Pod"}}, "operation": "CREATE", "object": {{"spec": {{"containers": [{containers}]}}}}}}}}"#
        );
        let answer = webhook.review(body.as_bytes()).unwrap();
        assert_eq!(answer["response"]["allowed"], false);
        let message = answer["response"]["status"]["message"].as_str().unwrap();
        assert!(
            message.starts_with("the pod cannot be decoded: it holds more than"),
            "{message}"
        );
    }
}
