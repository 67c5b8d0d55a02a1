//! The TLS server plumbing every HTTPS endpoint of the project shares (the kubelet API, the
//! placement webhook and scheduler extender): a rustls configuration from PEM with optional or
//! required client certificates, and an accept loop that bounds handshakes and stops with a
//! token.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use rustls::RootCertStore;
use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_util::sync::CancellationToken;

/// A handshake that never completes must not hold a task forever.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Whether clients must present a certificate of the client CA.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClientCerts {
    /// Asked for, not required (bearer-token clients have none).
    Optional,
    /// Required: a client without a valid certificate is refused in the handshake.
    Required,
}

fn err(what: &str, e: impl std::fmt::Display) -> String {
    format!("{what}: {e}")
}

/// A server configuration presenting `cert_pem`/`key_pem`, verifying client certificates
/// against `client_ca` as `mode` says, offering `alpn` protocols. The error says which part
/// could not be used.
pub fn server_config(
    cert_pem: &str,
    key_pem: &str,
    client_ca: Option<(&str, ClientCerts)>,
    alpn: &[&[u8]],
) -> Result<Arc<rustls::ServerConfig>, String> {
    let chain = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| err("serving certificate", e))?;
    if chain.is_empty() {
        return Err("serving certificate: no certificate in the PEM".into());
    }
    let key =
        PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).map_err(|e| err("serving key", e))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| err("TLS versions", e))?;
    let builder = match client_ca {
        Some((ca, mode)) => {
            let mut roots = RootCertStore::empty();
            for c in CertificateDer::pem_slice_iter(ca.as_bytes()) {
                roots
                    .add(c.map_err(|e| err("client CA", e))?)
                    .map_err(|e| err("client CA", e))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
            let verifier = match mode {
                ClientCerts::Optional => verifier.allow_unauthenticated(),
                ClientCerts::Required => verifier,
            };
            builder.with_client_cert_verifier(verifier.build().map_err(|e| err("client CA", e))?)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .map_err(|e| err("serving certificate and key", e))?;
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(config))
}

/// Accepts connections on `listener` until `stop`, completes each TLS handshake (within a
/// bound) and hands the stream to `serve` in its own task; a connection still open at `stop`
/// is dropped.
pub fn accept_loop<F, Fut>(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    stop: CancellationToken,
    serve: F,
) where
    F: Fn(TlsStream<TcpStream>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let acceptor = TlsAcceptor::from(tls);
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                () = stop.cancelled() => return,
                a = listener.accept() => a,
            };
            let Ok((tcp, _)) = accepted else { continue };
            let _ = tcp.set_nodelay(true);
            let (acceptor, serve, stop) = (acceptor.clone(), serve.clone(), stop.clone());
            tokio::spawn(async move {
                let Ok(Ok(tls)) =
                    tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await
                else {
                    return;
                };
                tokio::select! {
                    () = serve(tls) => {}
                    () = stop.cancelled() => {}
                }
            });
        }
    });
}
