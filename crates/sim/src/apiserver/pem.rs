//! The PEM certificates and keys the server is given, read for rustls.

use std::sync::Arc;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// The certificates of a PEM bundle; the error names `what` was read.
pub(crate) fn certs(what: &str, pem: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("reading {what} PEM: {e}"))
}

/// The private key of a PEM block.
pub(crate) fn key(what: &str, pem: &str) -> Result<PrivateKeyDer<'static>, String> {
    PrivateKeyDer::from_pem_slice(pem.as_bytes()).map_err(|e| format!("reading {what} PEM: {e}"))
}

/// The ring crypto provider: the whole project uses it, never aws-lc.
pub(crate) fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}
