//! The test PKI: a cluster's own certificate authority, serving certificates for the API server
//! and kubelets, client certificates for users (kubeconfig) and for the API server's calls to
//! kubelets, all signed by it, the way kubeadm lays a cluster out. It issues the certificates
//! of both backends: the files of real control planes ([`crate::real`]) and the
//! [`ServerCerts`] an embedded API server is given ([`apiserver_certs`]).

use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose,
};
use rustls::RootCertStore;
use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// Certificate generation or TLS configuration failed.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    /// rcgen refused the parameters.
    #[error("generating {what}: {source}")]
    Generate {
        /// Which certificate.
        what: String,
        /// Why.
        #[source]
        source: rcgen::Error,
    },
    /// A PEM block did not parse.
    #[error("reading {what} PEM: {message}")]
    Pem {
        /// Which PEM.
        what: &'static str,
        /// Why.
        message: String,
    },
    /// rustls refused the configuration.
    #[error("TLS configuration: {0}")]
    Tls(#[from] rustls::Error),
    /// The client verifier could not be built.
    #[error("client certificate verifier: {0}")]
    Verifier(String),
}

pub use tensile_sim::apiserver::Issued;
use tensile_sim::apiserver::ServerCerts;

/// A certificate authority.
pub struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
    cert_pem: String,
}

impl std::fmt::Debug for Ca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ca").finish_non_exhaustive()
    }
}

fn generate(what: &str, e: rcgen::Error) -> CertError {
    CertError::Generate {
        what: what.to_owned(),
        source: e,
    }
}

impl Ca {
    /// A new self-signed CA named `common_name`.
    pub fn new(common_name: &str) -> Result<Self, CertError> {
        let what = format!("CA {common_name}");
        let mut params =
            CertificateParams::new(Vec::<String>::new()).map_err(|e| generate(&what, e))?;
        params.distinguished_name = name(common_name, &[]);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let key = KeyPair::generate().map_err(|e| generate(&what, e))?;
        let issuer = CertifiedIssuer::self_signed(params, key).map_err(|e| generate(&what, e))?;
        let cert_pem = issuer.pem();
        Ok(Self { issuer, cert_pem })
    }

    /// The CA certificate.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The CA's private key (a real controller-manager signs with it).
    pub fn key_pem(&self) -> String {
        self.issuer.key().serialize_pem()
    }

    /// A serving certificate for these DNS names and IP addresses.
    pub fn issue_server(&self, common_name: &str, sans: &[String]) -> Result<Issued, CertError> {
        self.issue(common_name, &[], sans, ExtendedKeyUsagePurpose::ServerAuth)
    }

    /// A client certificate for user `common_name` in `group` (the subject's organization;
    /// rcgen writes one value per attribute type, so one group).
    pub fn issue_client(
        &self,
        common_name: &str,
        group: Option<&str>,
    ) -> Result<Issued, CertError> {
        let orgs: Vec<&str> = group.into_iter().collect();
        self.issue(common_name, &orgs, &[], ExtendedKeyUsagePurpose::ClientAuth)
    }

    fn issue(
        &self,
        common_name: &str,
        organizations: &[&str],
        sans: &[String],
        usage: ExtendedKeyUsagePurpose,
    ) -> Result<Issued, CertError> {
        let what = format!("certificate {common_name}");
        let mut params = CertificateParams::new(sans.to_vec()).map_err(|e| generate(&what, e))?;
        params.distinguished_name = name(common_name, organizations);
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![usage];
        params.use_authority_key_identifier_extension = true;
        let key = KeyPair::generate().map_err(|e| generate(&what, e))?;
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(|e| generate(&what, e))?;
        Ok(Issued {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

fn name(common_name: &str, organizations: &[&str]) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    for o in organizations {
        dn.push(DnType::OrganizationName, *o);
    }
    dn.push(DnType::CommonName, common_name);
    dn
}

/// Certificates of a PEM bundle.
pub fn certs_from_pem(
    what: &'static str,
    pem: &str,
) -> Result<Vec<CertificateDer<'static>>, CertError> {
    CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| CertError::Pem {
            what,
            message: e.to_string(),
        })
}

/// The private key of a PEM block.
pub fn key_from_pem(what: &'static str, pem: &str) -> Result<PrivateKeyDer<'static>, CertError> {
    PrivateKeyDer::from_pem_slice(pem.as_bytes()).map_err(|e| CertError::Pem {
        what,
        message: e.to_string(),
    })
}

/// The ring crypto provider: the whole project uses it, never aws-lc.
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A TLS server configuration presenting `serving` and asking (not requiring) client
/// certificates signed by `client_ca`, so bearer-token clients can connect too. HTTP/2 and
/// HTTP/1.1, as kube-apiserver offers them: clients that upgrade the connection (exec, attach,
/// port-forward) ask for HTTP/1.1.
pub fn server_config(
    serving: &Issued,
    client_ca: &str,
) -> Result<Arc<rustls::ServerConfig>, CertError> {
    let mut roots = RootCertStore::empty();
    for cert in certs_from_pem("client CA", client_ca)? {
        roots.add(cert)?;
    }
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
        .allow_unauthenticated()
        .build()
        .map_err(|e| CertError::Verifier(e.to_string()))?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(verifier)
        .with_single_cert(
            certs_from_pem("serving certificate", &serving.cert_pem)?,
            key_from_pem("serving key", &serving.key_pem)?,
        )?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// A new cluster CA and the certificates of an embedded API server named `name` listening on
/// `ip`: serving (for `localhost`, `127.0.0.1`, `kubernetes`, `kubernetes.default.svc`, and
/// `ip` unless it is loopback or unspecified), its kubelet client and an administrator's, the
/// names kubeadm gives them. The CA is returned to issue more (`TestCluster::kubeconfig_as`).
pub fn apiserver_certs(name: &str, ip: std::net::IpAddr) -> Result<(Ca, ServerCerts), CertError> {
    let ca = Ca::new(&format!("{name}-ca"))?;
    let mut sans = vec![
        "localhost".to_owned(),
        "127.0.0.1".to_owned(),
        "kubernetes".to_owned(),
        "kubernetes.default.svc".to_owned(),
    ];
    if !ip.is_loopback() && !ip.is_unspecified() {
        sans.push(ip.to_string());
    }
    let certs = ServerCerts {
        ca_pem: ca.cert_pem().to_owned(),
        serving: ca.issue_server("kube-apiserver", &sans)?,
        kubelet_client: ca.issue_client("kube-apiserver-kubelet-client", Some("system:masters"))?,
        admin: ca.issue_client("kubernetes-admin", Some("system:masters"))?,
    };
    Ok((ca, certs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issued_certificates_chain_to_the_ca_and_carry_the_identity() {
        let ca = Ca::new("test-ca").unwrap();
        let server = ca
            .issue_server("apiserver", &["127.0.0.1".into(), "localhost".into()])
            .unwrap();
        server_config(&server, ca.cert_pem()).unwrap();
        let client = ca.issue_client("alice", Some("system:masters")).unwrap();
        let der = certs_from_pem("client", &client.cert_pem).unwrap();
        let user = tensile_kubelet::server::certificate_user(&der[0]).unwrap();
        assert_eq!(
            (user.name, user.groups),
            ("alice".into(), vec!["system:masters".into()])
        );
    }
}
