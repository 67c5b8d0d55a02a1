//! The virtual node's upper identity by TLS bootstrap, as a kubelet gets its own: a
//! CertificateSigningRequest for the `kubernetes.io/kube-apiserver-client-kubelet` signer,
//! subject `CN=system:node:<name>, O=system:nodes`, usages `digital signature` and
//! `client auth` (an ECDSA key: no key encipherment). kube-controller-manager's csrapproving
//! controller approves exactly that shape when the requester may create
//! `certificatesigningrequests/nodeclient`, and its signer issues the certificate. These are the
//! rules; the requests are `tensile_node::bootstrap`.

use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::jiff::{SignedDuration, Timestamp};

/// The signer of kubelets' client certificates.
pub const SIGNER_KUBELET_CLIENT: &str = "kubernetes.io/kube-apiserver-client-kubelet";
/// The group of node identities.
pub const NODES_GROUP: &str = "system:nodes";
/// The usages the approver accepts for an ECDSA key.
pub const USAGES: [&str; 2] = ["digital signature", "client auth"];
/// The share of a certificate's lifetime after which it is renewed (the kubelet renews
/// between 70 % and 90 %, jittered; one process per node needs no jitter).
pub const RENEW_PERCENT: i64 = 80;

/// The user of node `name`: `system:node:<name>`.
pub fn node_user(name: &str) -> String {
    format!("system:node:{name}")
}

/// When a certificate valid from `not_before` to `not_after`, received at `now`, is renewed:
/// its life counted from when it was received, as signers backdate `not_before` (by five
/// minutes: a short certificate would otherwise be renewed at once, again and again).
pub fn renewal_time(not_before: Timestamp, not_after: Timestamp, now: Timestamp) -> Timestamp {
    let not_before = not_before.max(now);
    let lifetime = not_after.duration_since(not_before);
    let nanos = lifetime.as_nanos() / 100 * i128::from(RENEW_PERCENT);
    let after = SignedDuration::try_from_nanos_i128(nanos).unwrap_or(lifetime);
    not_before.checked_add(after).unwrap_or(not_before)
}

/// Where a request stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CsrState {
    /// Neither issued nor refused yet.
    Pending,
    /// Issued: the certificate (PEM).
    Issued(String),
    /// Denied or failed: the condition's type, reason and message.
    Refused(String),
}

/// What `csr`'s status says.
pub fn csr_state(csr: &CertificateSigningRequest) -> CsrState {
    let Some(status) = csr.status.as_ref() else {
        return CsrState::Pending;
    };
    for c in status.conditions.iter().flatten() {
        if matches!(c.type_.as_str(), "Denied" | "Failed") && c.status != "False" {
            return CsrState::Refused(format!(
                "{} ({}): {}",
                c.type_,
                c.reason.as_deref().unwrap_or_default(),
                c.message.as_deref().unwrap_or_default()
            ));
        }
    }
    match status.certificate.as_ref() {
        Some(cert) if !cert.0.is_empty() => {
            CsrState::Issued(String::from_utf8_lossy(&cert.0).into_owned())
        }
        _ => CsrState::Pending,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // test code
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_certificate_is_renewed_at_four_fifths_of_its_life() {
        let from: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        let to: Timestamp = "2026-01-11T00:00:00Z".parse().unwrap();
        let at: Timestamp = "2026-01-09T00:00:00Z".parse().unwrap();
        assert_eq!(renewal_time(from, to, from), at);
        // Backdated: counted from its receipt.
        let received: Timestamp = "2026-01-06T00:00:00Z".parse().unwrap();
        let later: Timestamp = "2026-01-10T00:00:00Z".parse().unwrap();
        assert_eq!(renewal_time(from, to, received), later);
        assert_eq!(node_user("vk-1"), "system:node:vk-1");
    }

    #[test]
    fn a_request_is_pending_until_issued_or_refused() {
        let csr = |status: serde_json::Value| -> CertificateSigningRequest {
            serde_json::from_value(json!({"metadata": {"name": "x"}, "spec": {
                "request": "", "signerName": SIGNER_KUBELET_CLIENT}, "status": status}))
            .unwrap()
        };
        assert_eq!(csr_state(&csr(json!({}))), CsrState::Pending);
        let approved = json!({"conditions": [{"type": "Approved", "status": "True"}]});
        assert_eq!(csr_state(&csr(approved)), CsrState::Pending);
        // "PEM" base64-encoded, as the API carries bytes.
        let issued =
            json!({"conditions": [{"type": "Approved", "status": "True"}], "certificate": "UEVN"});
        assert_eq!(csr_state(&csr(issued)), CsrState::Issued("PEM".into()));
        let denied = json!({"conditions": [{"type": "Denied", "status": "True",
            "reason": "AutoDenied", "message": "no"}]});
        assert_eq!(
            csr_state(&csr(denied)),
            CsrState::Refused("Denied (AutoDenied): no".into())
        );
    }
}
