//! Whether the upper API server can use the node's kubelet API (`kubectl logs/exec/top`): it
//! presents its kubelet client certificate, which must chain to the CA the node trusts (given
//! with `--client-verify-ca`, else read from the upper `kube-system/kube-root-ca.crt`). When it
//! does not, every such request is a 401 and, without this module, nothing said why.
//!
//! - Every refusal of the kubelet API is counted by reason
//!   (`tensile_kubelet_auth_refusals_total{reason}`).
//! - A refused client certificate is an error in the log and a Warning event
//!   `KubeletClientRefused` on the Node, at most once a minute.
//! - At start: a CA that could not be read is an error and a Warning event
//!   `KubeletClientCAUnavailable`; then, once the Node is registered and if the node's identity
//!   may `get nodes/proxy`, the node asks the upper API server for its own `/healthz` through
//!   `nodes/proxy`, which makes the API server present its certificate now rather than at the
//!   first `kubectl logs`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::{Node, ObjectReference};
use kube::api::{Api, PostParams};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use tensile_kubelet::{Refusal, RefusalHook, RefusalReason};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use tensile_runtime::events::{EventSink, PodEvent};

/// Reason of the event about a refused client certificate.
pub const REASON_REFUSED: &str = "KubeletClientRefused";
/// Reason of the event about a client CA that could not be read.
pub const REASON_CA_UNAVAILABLE: &str = "KubeletClientCAUnavailable";

/// At most one warning (log and event) about refused certificates per this period.
const WARN_EVERY: Duration = Duration::from_secs(60);

/// What `kubectl` stops doing, in every message.
const CONSEQUENCE: &str = "kubectl logs, exec, attach, port-forward and top through this node answer 401 Unauthorized while the upper API server presents it";
/// The fix, in every message.
const FIX: &str = "give the virtual node the CA that signs the upper API server's --kubelet-client-certificate with --client-verify-ca (APISERVER_CA_CERT_LOCATION) and restart it";

/// The warning about a refused client certificate, or, for a refusal that is not about one,
/// None. `node` is the virtual node.
pub fn refused_message(node: &str, refusal: &Refusal) -> Option<String> {
    match (refusal.reason, &refusal.certificate, &refusal.user) {
        (RefusalReason::UnknownCa, Some(cert), _) => Some(format!(
            "the kubelet API of node {node} refused a {cert}. If it is the upper API server's, {CONSEQUENCE}: {FIX}"
        )),
        (RefusalReason::BadCertificate, Some(cert), _) => Some(format!(
            "the kubelet API of node {node} refused a {cert}. If it is the upper API server's, {CONSEQUENCE}: renew its --kubelet-client-certificate (it must be valid now and for client authentication)"
        )),
        (RefusalReason::Forbidden, _, Some((user, true))) => Some(format!(
            "the kubelet API of node {node} refused user {user} (authenticated by client certificate): the upper cluster's RBAC does not allow it nodes/proxy on this node. If it is the upper API server's, kubectl logs, exec, attach, port-forward and top through this node answer 403 Forbidden: bind the ClusterRole system:kubelet-api-admin to it"
        )),
        _ => None,
    }
}

/// The error about a client CA that could not be read (`cause`, e.g. "reading
/// kube-system/kube-root-ca.crt: forbidden ...").
pub fn ca_unavailable_message(node: &str, cause: &str) -> String {
    format!(
        "the kubelet API of node {node} cannot verify the upper API server's client certificate: {cause}. Every client certificate is refused (bearer tokens still work), so {CONSEQUENCE}: {FIX}, or let its identity get configmaps in kube-system"
    )
}

/// The warning when the upper API server presented no client certificate at all.
pub fn no_certificate_message(node: &str) -> String {
    format!(
        "the upper API server presented no client certificate to the kubelet API of node {node}: kubectl logs, exec, attach, port-forward and top through this node answer 401 Unauthorized. Start kube-apiserver with --kubelet-client-certificate and --kubelet-client-key (signed by the CA given to the node with --client-verify-ca)"
    )
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RefusalLabels {
    reason: String,
}

/// The kubelet API's refusals: counted, the certificate ones warned about. Cheap to clone.
#[derive(Clone, Debug)]
pub struct KubeletAuthWatch {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    node: String,
    family: Family<RefusalLabels, Counter>,
    /// Refusals so far, to tell whether the start-up check's request was refused by us.
    seen: AtomicU64,
    last: Mutex<Option<Refusal>>,
    last_warning: Mutex<Option<Instant>>,
    events: EventSink,
    node_uid: OnceLock<Option<String>>,
}

impl KubeletAuthWatch {
    /// Counters registered in `registry` as `tensile_kubelet_auth_refusals`; warnings about
    /// node `node` go to `events`.
    pub fn new(registry: &mut Registry, node: &str, events: EventSink) -> Self {
        let family = Family::<RefusalLabels, Counter>::default();
        // Every reason from the start, so a rate is defined before the first refusal.
        for reason in RefusalReason::ALL {
            drop(family.get_or_create(&RefusalLabels {
                reason: reason.as_str().to_owned(),
            }));
        }
        registry.register(
            "tensile_kubelet_auth_refusals",
            "Requests the kubelet API refused, by reason: no_credentials, unknown_ca (a client certificate not of the trusted CA), bad_certificate, bad_token, forbidden, review_failed, throttled (too many reviews in flight: 429)",
            family.clone(),
        );
        Self {
            inner: Arc::new(Inner {
                node: node.to_owned(),
                family,
                seen: AtomicU64::new(0),
                last: Mutex::new(None),
                last_warning: Mutex::new(None),
                events,
                node_uid: OnceLock::new(),
            }),
        }
    }

    /// The hook to give the kubelet API's authentication.
    pub fn hook(&self) -> RefusalHook {
        let this = self.clone();
        Arc::new(move |r: &Refusal| this.refused(r))
    }

    fn refused(&self, refusal: &Refusal) {
        let inner = &self.inner;
        inner
            .family
            .get_or_create(&RefusalLabels {
                reason: refusal.reason.as_str().to_owned(),
            })
            .inc();
        *inner.last.lock().unwrap_or_else(PoisonError::into_inner) = Some(refusal.clone());
        inner.seen.fetch_add(1, Ordering::SeqCst);
        match refused_message(&inner.node, refusal) {
            Some(message) => {
                let now = Instant::now();
                let mut last = inner
                    .last_warning
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                if last.is_none_or(|t| now.duration_since(t) >= WARN_EVERY) {
                    *last = Some(now);
                    drop(last);
                    self.warn(REASON_REFUSED, message);
                }
            }
            None => tracing::debug!(
                reason = refusal.reason.as_str(),
                "kubelet API request refused"
            ),
        }
    }

    /// Logs `message` as an error and records it as a Warning event on the Node.
    fn warn(&self, reason: &str, message: String) {
        tracing::error!(node = %self.inner.node, reason, "{message}");
        self.inner.events.publish(PodEvent {
            regarding: ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Node".into()),
                name: Some(self.inner.node.clone()),
                uid: self.inner.node_uid.get().cloned().flatten(),
                ..ObjectReference::default()
            },
            warning: true,
            reason: reason.to_owned(),
            note: message,
        });
    }

    /// Refusals counted so far.
    fn seen(&self) -> u64 {
        self.inner.seen.load(Ordering::SeqCst)
    }

    fn last(&self) -> Option<Refusal> {
        self.inner
            .last
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// The start-up check (see the module comment): `ca_problem` is why no client CA could be read,
/// if so (logged at once); the rest waits for the Node `node` to be registered with kubelet
/// port `port`, then runs in the background until done or `stop`.
pub fn check_at_start(
    upper: kube::Client,
    watch: KubeletAuthWatch,
    ca_problem: Option<String>,
    port: i32,
    stop: CancellationToken,
) {
    let node = watch.inner.node.clone();
    let ca_message = ca_problem.map(|cause| ca_unavailable_message(&node, &cause));
    if let Some(m) = &ca_message {
        tracing::error!(node = %node, "{m}");
    }
    tokio::spawn(async move {
        tokio::select! {
            () = stop.cancelled() => {}
            () = check(upper, watch, ca_message, port) => {}
        }
    });
}

async fn check(
    upper: kube::Client,
    watch: KubeletAuthWatch,
    ca_message: Option<String>,
    port: i32,
) {
    let node = watch.inner.node.clone();
    let Some(uid) = registered(&upper, &node, port).await else {
        tracing::info!(node = %node, "not checking the upper API server's kubelet client certificate: the node was not registered within a minute");
        return;
    };
    let _ = watch.inner.node_uid.set(uid);
    if let Some(m) = ca_message {
        watch.inner.events.publish(PodEvent {
            regarding: ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Node".into()),
                name: Some(node.clone()),
                uid: watch.inner.node_uid.get().cloned().flatten(),
                ..ObjectReference::default()
            },
            warning: true,
            reason: REASON_CA_UNAVAILABLE.to_owned(),
            note: m,
        });
    }
    // Only with the permission: asking without it is a refused request in the upper
    // cluster's audit log, and the shipped RBAC does not grant it (nodes/proxy reaches every
    // kubelet). Then the first refused certificate is warned about when it comes.
    if !may_proxy(&upper, &node).await {
        tracing::info!(node = %node, "not checking the upper API server's kubelet client certificate at start: the node's identity may not get nodes/proxy; a refused certificate is reported when the API server first presents it");
        return;
    }
    let before = watch.seen();
    let request =
        http::Request::get(format!("/api/v1/nodes/{node}/proxy/healthz")).body(Vec::new());
    let Ok(request) = request else { return };
    let answer = tokio::time::timeout(Duration::from_secs(15), upper.request_text(request)).await;
    let refused_by_us = watch.seen() > before;
    match answer {
        Ok(Ok(_)) => {
            tracing::info!(node = %node, "the upper API server's kubelet client certificate is accepted")
        }
        Ok(Err(kube::Error::Api(s))) if refused_by_us && matches!(s.code, 401 | 403) => {
            // A refused certificate was warned about by the hook already.
            match watch.last() {
                Some(r) if refused_message(&node, &r).is_some() => {}
                Some(r) if r.reason == RefusalReason::NoCredentials => {
                    watch.warn(REASON_REFUSED, no_certificate_message(&node));
                }
                _ => {
                    tracing::warn!(node = %node, code = s.code, message = %s.message, "the kubelet API refused the upper API server's request for its /healthz")
                }
            }
        }
        // E.g. 400 "address not allowed" (a loopback kubelet address), 403 from the API
        // server, 5xx: the check could not run, which says nothing about the certificate.
        Ok(Err(e)) => {
            tracing::info!(node = %node, error = %e, "could not check the upper API server's kubelet client certificate through nodes/proxy")
        }
        Err(_) => {
            tracing::info!(node = %node, "could not check the upper API server's kubelet client certificate: nodes/proxy did not answer within 15 s")
        }
    }
}

/// Waits (up to a minute) until the Node exists with our kubelet port; its UID.
async fn registered(upper: &kube::Client, node: &str, port: i32) -> Option<Option<String>> {
    let nodes: Api<Node> = Api::all(upper.clone());
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        // One object by name, not a LIST.
        if let Ok(Some(n)) = nodes.get_opt(node).await {
            let advertised = n
                .status
                .as_ref()
                .and_then(|s| s.daemon_endpoints.as_ref())
                .and_then(|d| d.kubelet_endpoint.as_ref())
                .map(|e| e.port);
            if advertised == Some(port) {
                return Some(n.metadata.uid);
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    None
}

/// Whether our identity may `get nodes/<node>/proxy`; false when it cannot be asked.
async fn may_proxy(upper: &kube::Client, node: &str) -> bool {
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                verb: Some("get".into()),
                resource: Some("nodes".into()),
                subresource: Some("proxy".into()),
                name: Some(node.to_owned()),
                version: Some("v1".into()),
                ..ResourceAttributes::default()
            }),
            ..SelfSubjectAccessReviewSpec::default()
        },
        ..SelfSubjectAccessReview::default()
    };
    match Api::<SelfSubjectAccessReview>::all(upper.clone())
        .create(&PostParams::default(), &review)
        .await
    {
        Ok(r) => r.status.is_some_and(|s| s.allowed),
        Err(e) => {
            tracing::debug!(error = %e, "asking whether the node may get nodes/proxy");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tensile_kubelet::auth::CertRefusal;

    fn refusal(reason: RefusalReason, unknown_ca: bool) -> Refusal {
        Refusal {
            reason,
            certificate: Some(CertRefusal {
                subject: "CN=kube-apiserver-kubelet-client, O=system:masters".into(),
                issuer: "CN=kubernetes".into(),
                trusted: "CN=other-ca".into(),
                error: "invalid peer certificate: UnknownIssuer".into(),
                unknown_ca,
            }),
            user: None,
        }
    }

    #[test]
    fn a_certificate_of_another_ca_names_both_cas_the_consequence_and_the_flag() {
        let m = refused_message("vk-1", &refusal(RefusalReason::UnknownCa, true)).unwrap();
        assert_eq!(
            m,
            "the kubelet API of node vk-1 refused a client certificate CN=kube-apiserver-kubelet-client, O=system:masters (issuer CN=kubernetes) is not accepted by the trusted client CA (CN=other-ca): invalid peer certificate: UnknownIssuer. If it is the upper API server's, kubectl logs, exec, attach, port-forward and top through this node answer 401 Unauthorized while the upper API server presents it: give the virtual node the CA that signs the upper API server's --kubelet-client-certificate with --client-verify-ca (APISERVER_CA_CERT_LOCATION) and restart it"
        );
        let mut none = refusal(RefusalReason::UnknownCa, true);
        if let Some(c) = none.certificate.as_mut() {
            c.trusted.clear();
        }
        let m = refused_message("vk-1", &none).unwrap();
        assert!(
            m.contains("cannot be verified: no client CA is configured"),
            "{m}"
        );
    }

    #[test]
    fn only_refusals_of_certificates_are_warned_about() {
        let plain = |reason| Refusal {
            reason,
            certificate: None,
            user: Some(("bob".into(), false)),
        };
        for reason in [
            RefusalReason::NoCredentials,
            RefusalReason::BadToken,
            RefusalReason::Forbidden,
            RefusalReason::ReviewFailed,
        ] {
            assert_eq!(refused_message("vk-1", &plain(reason)), None, "{reason:?}");
        }
        let by_cert = Refusal {
            user: Some(("kube-apiserver-kubelet-client".into(), true)),
            ..plain(RefusalReason::Forbidden)
        };
        assert!(
            refused_message("vk-1", &by_cert)
                .unwrap()
                .contains("system:kubelet-api-admin")
        );
        assert!(
            refused_message("vk-1", &refusal(RefusalReason::BadCertificate, false))
                .unwrap()
                .contains("renew")
        );
    }

    #[test]
    fn an_unreadable_ca_says_why_what_breaks_and_what_to_pass() {
        let m = ca_unavailable_message(
            "vk-1",
            "reading kube-system/kube-root-ca.crt: forbidden: the virtual node's identity may not get configmaps in kube-system (denied)",
        );
        assert!(m.starts_with("the kubelet API of node vk-1 cannot verify the upper API server's client certificate: reading kube-system/kube-root-ca.crt: forbidden"), "{m}");
        assert!(
            m.contains("401 Unauthorized") && m.contains("--client-verify-ca"),
            "{m}"
        );
    }
}
