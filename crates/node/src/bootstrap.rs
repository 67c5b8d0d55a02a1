//! TLS bootstrap of the virtual node's upper identity (`--tls-bootstrap`), as a kubelet's: with
//! a bootstrap credential that may only ask for it, a CertificateSigningRequest for a client
//! certificate `system:node:<name>` in `system:nodes` (the rules are
//! `tensile_core::bootstrap`), approved and signed by kube-controller-manager. The key never
//! leaves the process. The caller builds its upper clients on the certificate and asks again
//! before it expires.

use std::time::Duration;

use base64::Engine as _;
use k8s_openapi::ByteString;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use tensile_core::bootstrap::{CsrState, NODES_GROUP, SIGNER_KUBELET_CLIENT, USAGES, csr_state};
use tokio_util::sync::CancellationToken;

/// How long the controller manager is given to approve and sign.
pub const SIGN_TIMEOUT: Duration = Duration::from_secs(300);

/// A client certificate of the node and its key.
#[derive(Clone)]
pub struct NodeCertificate {
    /// The certificate (PEM).
    pub cert_pem: String,
    /// Its private key (PEM, PKCS#8).
    pub key_pem: String,
    /// Valid from.
    pub not_before: Timestamp,
    /// Valid until.
    pub not_after: Timestamp,
}

impl std::fmt::Debug for NodeCertificate {
    // The key is a credential: never printed.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeCertificate")
            .field("not_before", &self.not_before)
            .field("not_after", &self.not_after)
            .finish_non_exhaustive()
    }
}

impl NodeCertificate {
    /// `config` with this certificate as its only credential (a bootstrap token or client
    /// certificate it had is dropped).
    pub fn credentials_of(&self, mut config: kube::Config) -> kube::Config {
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        config.auth_info = kube::config::AuthInfo {
            client_certificate_data: Some(b64(&self.cert_pem)),
            client_key_data: Some(b64(&self.key_pem).into()),
            ..kube::config::AuthInfo::default()
        };
        config
    }
}

/// Why no certificate came.
#[derive(Debug, thiserror::Error)]
pub enum BootstrapError {
    /// The key or the request could not be made.
    #[error("making the certificate request of node {node}: {reason}")]
    Request {
        /// The node.
        node: String,
        /// Why.
        reason: String,
    },
    /// The upper cluster refused the request or failed while it was watched.
    #[error(
        "certificate request of node {node} in the upper cluster: {source} (the bootstrap credential needs ClusterRole system:node-bootstrapper, deploy/virtual-node/rbac)"
    )]
    Api {
        /// The node.
        node: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// Denied or failed.
    #[error("certificate request {csr} of node {node} was refused: {why}")]
    Refused {
        /// The node.
        node: String,
        /// The request's name.
        csr: String,
        /// Its condition.
        why: String,
    },
    /// Not signed in time.
    #[error(
        "certificate request {csr} of node {node} not signed within {seconds} s: is the bootstrap credential bound to ClusterRole system:certificates.k8s.io:certificatesigningrequests:nodeclient (auto-approval), and does kube-controller-manager sign (--cluster-signing-cert-file/--cluster-signing-key-file)? An administrator may approve it by hand: kubectl certificate approve {csr}"
    )]
    Timeout {
        /// The node.
        node: String,
        /// The request's name.
        csr: String,
        /// How long it was given.
        seconds: u64,
    },
    /// The certificate issued is not one for this node.
    #[error("the certificate issued for node {node} by request {csr}: {reason}")]
    Invalid {
        /// The node.
        node: String,
        /// The request's name.
        csr: String,
        /// What is wrong.
        reason: String,
    },
    /// Stopped while waiting.
    #[error("stopped while waiting for the certificate of node {0}")]
    Stopped(String),
}

/// Asks the upper cluster of `client` (the bootstrap credential) for a client certificate of
/// node `node` and waits until it is issued (at most `timeout`), or `stop`.
pub async fn request_certificate(
    client: &kube::Client,
    node: &str,
    timeout: Duration,
    stop: &CancellationToken,
) -> Result<NodeCertificate, BootstrapError> {
    let request_error = |reason: String| BootstrapError::Request {
        node: node.to_owned(),
        reason,
    };
    let user = tensile_core::bootstrap::node_user(node);
    let key = rcgen::KeyPair::generate().map_err(|e| request_error(e.to_string()))?;
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new())
        .map_err(|e| request_error(e.to_string()))?;
    let mut subject = rcgen::DistinguishedName::new();
    subject.push(rcgen::DnType::OrganizationName, NODES_GROUP);
    subject.push(rcgen::DnType::CommonName, user.as_str());
    params.distinguished_name = subject;
    let request = params
        .serialize_request(&key)
        .and_then(|r| r.pem())
        .map_err(|e| request_error(e.to_string()))?;
    let api: Api<CertificateSigningRequest> = Api::all(client.clone());
    let csr = CertificateSigningRequest {
        metadata: ObjectMeta {
            generate_name: Some(format!("tensile-{node}-")),
            ..ObjectMeta::default()
        },
        spec: CertificateSigningRequestSpec {
            request: ByteString(request.into_bytes()),
            signer_name: SIGNER_KUBELET_CLIENT.to_owned(),
            usages: Some(USAGES.iter().map(|u| (*u).to_owned()).collect()),
            ..CertificateSigningRequestSpec::default()
        },
        status: None,
    };
    let api_error = |source| BootstrapError::Api {
        node: node.to_owned(),
        source,
    };
    let created = api
        .create(&PostParams::default(), &csr)
        .await
        .map_err(api_error)?;
    let name = created.metadata.name.unwrap_or_default();
    tracing::info!(node, csr = %name, "certificate requested from the upper cluster");
    let issued = kube::runtime::wait::await_condition(
        api,
        &name,
        |csr: Option<&CertificateSigningRequest>| {
            csr.is_some_and(|c| csr_state(c) != CsrState::Pending)
        },
    );
    let found = tokio::select! {
        () = stop.cancelled() => return Err(BootstrapError::Stopped(node.to_owned())),
        () = tokio::time::sleep(timeout) => return Err(BootstrapError::Timeout {
            node: node.to_owned(),
            csr: name,
            seconds: timeout.as_secs(),
        }),
        found = issued => found,
    };
    let found = found.map_err(|e| BootstrapError::Request {
        node: node.to_owned(),
        reason: format!("watching certificate request {name}: {e}"),
    })?;
    let cert_pem = match found.as_ref().map(csr_state) {
        Some(CsrState::Issued(pem)) => pem,
        Some(CsrState::Refused(why)) => {
            return Err(BootstrapError::Refused {
                node: node.to_owned(),
                csr: name,
                why,
            });
        }
        _ => {
            return Err(BootstrapError::Refused {
                node: node.to_owned(),
                csr: name,
                why: "deleted before it was signed".into(),
            });
        }
    };
    let invalid = |reason: String| BootstrapError::Invalid {
        node: node.to_owned(),
        csr: name.clone(),
        reason,
    };
    let (not_before, not_after, common_name) =
        validity(&cert_pem).map_err(|e| invalid(e.clone()))?;
    if common_name != user {
        return Err(invalid(format!(
            "its common name is {common_name:?}, not {user:?}"
        )));
    }
    tracing::info!(node, csr = %name, %not_after, "client certificate issued");
    Ok(NodeCertificate {
        cert_pem,
        key_pem: key.serialize_pem(),
        not_before,
        not_after,
    })
}

/// The first certificate of `pem`: its validity and common name.
fn validity(pem: &str) -> Result<(Timestamp, Timestamp, String), String> {
    let (_, pem) =
        x509_parser::pem::parse_x509_pem(pem.as_bytes()).map_err(|e| format!("not PEM: {e}"))?;
    let cert = pem
        .parse_x509()
        .map_err(|e| format!("not a certificate: {e}"))?;
    let time = |t: x509_parser::time::ASN1Time| {
        Timestamp::from_second(t.timestamp()).map_err(|e| format!("validity: {e}"))
    };
    let v = cert.validity();
    let common_name = cert
        .subject()
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .unwrap_or_default()
        .to_owned();
    Ok((time(v.not_before)?, time(v.not_after)?, common_name))
}
