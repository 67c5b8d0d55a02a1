//! Client certificates as Kubernetes servers take them (see [`ClientCertChecker`]). The rest of
//! the TLS server plumbing (configurations, the accept loop, connection limits) is
//! `tensile_runtime::tls`, shared with the placement servers.

use std::sync::Arc;

use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, SignatureScheme};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, UnixTime};
use tensile_runtime::tls::{ca_roots, server_config_with};

fn err(what: &str, e: impl std::fmt::Display) -> String {
    format!("{what}: {e}")
}

/// A server configuration like [`server_config`] that asks for client certificates and leaves
/// their verification to `checker` after the handshake (see [`ClientCertChecker`]).
pub fn server_config_checked_later(
    cert_pem: &str,
    key_pem: &str,
    checker: Arc<ClientCertChecker>,
    alpn: &[&[u8]],
) -> Result<Arc<rustls::ServerConfig>, String> {
    let provider = checker.provider.clone();
    server_config_with(cert_pem, key_pem, provider, Some(checker), alpn)
}

/// A client certificate that does not verify against the trusted CA, described for people.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "client certificate {subject} (issuer {issuer}) {}: {error}",
    if trusted.is_empty() {
        "cannot be verified: no client CA is configured".to_owned()
    } else {
        format!("is not accepted by the trusted client CA ({trusted})")
    }
)]
pub struct CertRefusal {
    /// The certificate's subject (`CN=...`).
    pub subject: String,
    /// Its issuer.
    pub issuer: String,
    /// The subjects of the trusted CA certificates; empty when none is configured.
    pub trusted: String,
    /// Why, as the verifier says (`UnknownIssuer`, `Expired`, ...).
    pub error: String,
    /// Signed by a CA we do not trust (or none is configured), rather than invalid otherwise
    /// (expired, wrong usage).
    pub unknown_ca: bool,
}

/// Client certificates as Kubernetes servers take them (the kubelet's and the API server's
/// authenticators): asked for without naming a CA, so a client sends the certificate it has;
/// any whose handshake signature is valid (the client holds its key) is let through the
/// handshake; and its chain is verified against the CA afterwards with [`Self::check`]. A
/// certificate of another CA then gets a 401 that can be counted and explained, not a
/// handshake failure nobody sees.
#[derive(Debug)]
pub struct ClientCertChecker {
    /// The CA's verifier; None when no CA is configured (every certificate is refused).
    verifier: Option<Arc<dyn ClientCertVerifier>>,
    /// The CA certificates' subjects, for messages.
    trusted: String,
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl ClientCertChecker {
    /// Checks against the CA certificates of `ca_pem` (none: every certificate is refused).
    pub fn new(ca_pem: Option<&str>) -> Result<Self, String> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let (verifier, trusted) = match ca_pem {
            Some(ca) => {
                let verifier = WebPkiClientVerifier::builder_with_provider(
                    Arc::new(ca_roots(ca)?),
                    provider.clone(),
                )
                .allow_unauthenticated()
                .build()
                .map_err(|e| err("client CA", e))?;
                let subjects: Vec<String> = CertificateDer::pem_slice_iter(ca.as_bytes())
                    .filter_map(Result::ok)
                    .map(|c| subject_and_issuer(&c).0)
                    .collect();
                (Some(verifier), subjects.join("; "))
            }
            None => (None, String::new()),
        };
        Ok(Self {
            verifier,
            trusted,
            provider,
        })
    }

    /// Verifies a client's chain (end entity first) against the CA.
    pub fn check(&self, chain: &[CertificateDer<'_>]) -> Result<(), CertRefusal> {
        let Some((end_entity, intermediates)) = chain.split_first() else {
            return Ok(());
        };
        let error = match &self.verifier {
            Some(v) => match v.verify_client_cert(end_entity, intermediates, UnixTime::now()) {
                Ok(_) => return Ok(()),
                Err(e) => e,
            },
            None => rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer),
        };
        let (subject, issuer) = subject_and_issuer(end_entity);
        Err(CertRefusal {
            subject,
            issuer,
            trusted: self.trusted.clone(),
            unknown_ca: matches!(
                error,
                rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer)
            ),
            error: error.to_string(),
        })
    }
}

/// A certificate's subject and issuer as `CN=...` strings (`?` if it does not parse).
fn subject_and_issuer(cert: &CertificateDer<'_>) -> (String, String) {
    match x509_parser::parse_x509_certificate(cert.as_ref()) {
        Ok((_, c)) => (c.subject().to_string(), c.issuer().to_string()),
        Err(_) => ("?".to_owned(), "?".to_owned()),
    }
}

impl ClientCertVerifier for ClientCertChecker {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        // No hint: a Go client (the API server) sends no certificate when its issuer is not
        // among the hints, and the refusal could not say whose certificate it was.
        &[]
    }

    fn verify_client_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        // Checked after the handshake, by `check`.
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}
