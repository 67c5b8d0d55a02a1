//! The TLS server plumbing every HTTPS endpoint of the project shares (the kubelet API, the
//! placement webhook and scheduler extender, the plain metrics listeners): a rustls configuration from PEM with optional or
//! required client certificates, an accept loop that bounds handshakes and stops with a token,
//! and the HTTP connection builder that bounds how long a client may take to send a request's
//! headers, so a slowloris connection cannot hold a task forever.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use rustls::RootCertStore;
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::ClientCertVerifier;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tensile_core::guard::{WarnLimiter, accept_backoff};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_util::sync::CancellationToken;

/// How long a client may take before its request is read: connections that stall longer are
/// closed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// The TLS handshake (default 10 s).
    pub handshake_timeout: Duration,
    /// The headers of a request, counted from when the connection is ready for one; so also how
    /// long an idle keep-alive connection stays open (default 30 s). On HTTP/2, a peer that
    /// does not answer a ping within this is dropped.
    pub header_read_timeout: Duration,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self {
            handshake_timeout: Duration::from_secs(10),
            header_read_timeout: Duration::from_secs(30),
        }
    }
}

/// Serves HTTP on an accepted TLS connection within `limits`: HTTP/2 when ALPN chose it, else
/// HTTP/1.1 (with upgrades). Not hyper-util's `auto` builder: it sniffs for the HTTP/2 preface
/// without a timeout, so a client that sends nothing after the handshake held a task forever.
pub async fn serve_connection<S, B>(
    tls: TlsStream<TcpStream>,
    limits: &ConnectionLimits,
    service: S,
) where
    S: hyper::service::Service<http::Request<hyper::body::Incoming>, Response = http::Response<B>>
        + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2".as_slice());
    if h2 {
        // hyper's HTTP/2 has no header timeout: the client's preface must come in time, and a
        // peer that stops answering pings is dropped.
        let io = FirstBytes::new(tls, H2_PREFACE_LEN, limits.header_read_timeout);
        let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
            .timer(TokioTimer::new())
            .keep_alive_interval(limits.header_read_timeout)
            .keep_alive_timeout(limits.header_read_timeout)
            .serve_connection(TokioIo::new(io), service)
            .await;
    } else {
        // The header timeout also closes idle keep-alive connections; hyper ignores it unless
        // given a timer.
        let _ = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(limits.header_read_timeout)
            .serve_connection(TokioIo::new(tls), service)
            .with_upgrades()
            .await;
    }
}

/// Serves HTTP/1.1 on a plain connection within `limits.header_read_timeout` (the plain
/// listeners: metrics and probes). A client that does not send a request's headers in time, or
/// an idle keep-alive connection, is closed.
pub async fn serve_plain_connection<I, S, B>(io: I, limits: &ConnectionLimits, service: S)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    S: hyper::service::Service<http::Request<hyper::body::Incoming>, Response = http::Response<B>>
        + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let _ = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .serve_connection(TokioIo::new(io), service)
        .await;
}

/// The errors of an accept loop so far: how long to back off, and when to warn again.
#[derive(Debug)]
pub struct AcceptErrors {
    /// Which listener, for the warning.
    what: &'static str,
    consecutive: u32,
    warn: WarnLimiter,
}

/// At most one warning about failed accepts per this period.
const ACCEPT_WARN_EVERY: Duration = Duration::from_secs(10);

impl AcceptErrors {
    /// For the listener named `what` (in warnings).
    pub fn new(what: &'static str) -> Self {
        Self {
            what,
            consecutive: 0,
            warn: WarnLimiter::new(ACCEPT_WARN_EVERY),
        }
    }
}

/// The next connection of `listener`. After a failed accept (EMFILE when the process is out of
/// file descriptors, ...) it waits ([`accept_backoff`]: 5 ms doubling to 1 s) before trying
/// again, and warns at most once per 10 s with the number of failures held back: a loop that
/// retried at once spun a core and wrote millions of warnings. Cancel-safe.
pub async fn accept_backing_off(
    listener: &TcpListener,
    errors: &mut AcceptErrors,
) -> (TcpStream, std::net::SocketAddr) {
    loop {
        match listener.accept().await {
            Ok(accepted) => {
                errors.consecutive = 0;
                return accepted;
            }
            Err(e) => {
                errors.consecutive = errors.consecutive.saturating_add(1);
                if let Some(held_back) = errors.warn.allow(std::time::Instant::now()) {
                    tracing::warn!(
                        listener = errors.what,
                        error = %e,
                        held_back,
                        "accepting a connection failed; backing off (held_back: failures not logged since the last warning)"
                    );
                }
                tokio::time::sleep(accept_backoff(errors.consecutive)).await;
            }
        }
    }
}

/// Length of the HTTP/2 client connection preface.
const H2_PREFACE_LEN: usize = 24;

/// A connection whose first `remaining` bytes must arrive before a deadline; reads fail with
/// `TimedOut` after it.
struct FirstBytes<T> {
    io: T,
    remaining: usize,
    deadline: Pin<Box<tokio::time::Sleep>>,
}

impl<T> FirstBytes<T> {
    fn new(io: T, remaining: usize, within: Duration) -> Self {
        Self {
            io,
            remaining,
            deadline: Box::pin(tokio::time::sleep(within)),
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for FirstBytes<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let this = &mut *self;
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Ready(r) => {
                let n = buf.filled().len().saturating_sub(before);
                this.remaining = this.remaining.saturating_sub(n);
                Poll::Ready(r)
            }
            Poll::Pending if this.remaining > 0 && this.deadline.as_mut().poll(cx).is_ready() => {
                Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the client sent no request in time",
                )))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for FirstBytes<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

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
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = match client_ca {
        Some((ca, mode)) => {
            let verifier = WebPkiClientVerifier::builder_with_provider(
                Arc::new(ca_roots(ca)?),
                provider.clone(),
            );
            let verifier = match mode {
                ClientCerts::Optional => verifier.allow_unauthenticated(),
                ClientCerts::Required => verifier,
            };
            Some(verifier.build().map_err(|e| err("client CA", e))?)
        }
        None => None,
    };
    server_config_with(cert_pem, key_pem, provider, verifier, alpn)
}

/// The CA certificates of `ca_pem`, to verify client certificates against.
pub fn ca_roots(ca_pem: &str) -> Result<RootCertStore, String> {
    let mut roots = RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots
            .add(c.map_err(|e| err("client CA", e))?)
            .map_err(|e| err("client CA", e))?;
    }
    Ok(roots)
}

/// A server configuration presenting `cert_pem`/`key_pem` with `provider`, verifying client
/// certificates with `verifier` (none: not asked for), offering `alpn` protocols.
pub fn server_config_with(
    cert_pem: &str,
    key_pem: &str,
    provider: Arc<rustls::crypto::CryptoProvider>,
    verifier: Option<Arc<dyn ClientCertVerifier>>,
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
    let builder = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| err("TLS versions", e))?;
    let builder = match verifier {
        Some(v) => builder.with_client_cert_verifier(v),
        None => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .map_err(|e| err("serving certificate and key", e))?;
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(config))
}

/// Accepts connections on `listener` until `stop` (backing off after accept errors, see
/// [`accept_backing_off`]), completes each TLS handshake (within `limits.handshake_timeout`)
/// and hands the stream to `serve` in its own task; a connection still open at `stop` is
/// dropped.
pub fn accept_loop<F, Fut>(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    limits: ConnectionLimits,
    stop: CancellationToken,
    serve: F,
) where
    F: Fn(TlsStream<TcpStream>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let acceptor = TlsAcceptor::from(tls);
    tokio::spawn(async move {
        let mut errors = AcceptErrors::new("https");
        loop {
            let (tcp, _) = tokio::select! {
                () = stop.cancelled() => return,
                a = accept_backing_off(&listener, &mut errors) => a,
            };
            let _ = tcp.set_nodelay(true);
            let (acceptor, serve, stop) = (acceptor.clone(), serve.clone(), stop.clone());
            tokio::spawn(async move {
                let Ok(Ok(tls)) =
                    tokio::time::timeout(limits.handshake_timeout, acceptor.accept(tcp)).await
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
