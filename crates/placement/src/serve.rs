//! The HTTPS server the webhook and the scheduler extender share: TLS with a given certificate,
//! one issued by a CA generated at start, or one kept in a Secret and replaced while serving
//! ([`LiveCert`], `crate::tls_secret`) (its CA is what a `MutatingWebhookConfiguration`'s
//! `caBundle` or an extender's `tlsConfig.caData` needs),
//! optional required client certificates, `/healthz`, and JSON POST handlers. TLS, the accept
//! loop and the connection limits (TLS handshake, request headers) are `tensile_runtime::tls`,
//! shared with the kubelet API. Bodies are bounded in size (413) and in time (408), requests in
//! progress are bounded in number (a few wait, more get 503), and a handler error is an HTTP
//! error with a reason; none of them stops the server. Client certificates ([`ClientAuth`]) can
//! be required and limited to given common names.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use tensile_runtime::tls::ConnectionLimits;
use tokio::net::TcpListener;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

/// Largest request body a [`Handler`] accepts unless it says otherwise.
pub const DEFAULT_MAX_BODY: usize = 4 << 20;

/// Requests a [`Handler`] works on at once unless it says otherwise: each holds its body (up to
/// [`Handler::max_body`]) and what is decoded from it, so this times that is the memory a
/// flood of large bodies can take.
pub const DEFAULT_MAX_CONCURRENT: usize = 4;

/// Requests that mostly wait on another server ([`Handler::waits_on_io`]) handled at once.
/// Each holds a small body and little decoded from it, and kube-scheduler binds many pods at
/// once (a goroutine each): held to the `max_concurrent` places, a bind's API round trip made
/// every other call wait for it (one at a time, 50 binds a second at a 20 ms write).
pub const MAX_IO_BOUND: usize = 256;

/// Requests that wait for one in progress to finish, beyond which a request is answered 503 at
/// once. A waiting request holds its body (read within [`SMALL_POOL`] or a large-body place),
/// nothing decoded from it. An API
/// server sends a webhook one review per pod created at once (a burst of hundreds); they take
/// well under a millisecond each, so they wait rather than fail.
pub const MAX_WAITING: usize = 512;

/// Bodies up to this size are read against one shared pool of bytes ([`SMALL_POOL`]), taken
/// frame by frame as the bytes arrive, so a client that sends slowly holds only what it sent.
/// A body that grows past it needs one of the handler's large-body places
/// ([`Handler::large_bodies`]) to go on. Reviews and extender calls are a few KiB.
pub const SMALL_BODY: usize = 64 << 10;

/// What the small bodies being read may hold together: 64 of the largest.
pub const SMALL_POOL: usize = 64 * SMALL_BODY;

/// How long a request waits to be let in before it is answered 503: well within the 10 s an API
/// server gives a webhook and kube-scheduler an extender (as shipped), so they see the reason.
pub const MAX_WAIT: Duration = Duration::from_secs(5);

/// How long a client may take to send a request: its TLS handshake and headers
/// ([`ConnectionLimits`]), then its body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServerLimits {
    /// TLS handshake and request headers.
    pub connection: ConnectionLimits,
    /// The whole body, once the headers are in (default 30 s): slower is 408.
    pub body_timeout: Duration,
}

impl Default for ServerLimits {
    fn default() -> Self {
        Self {
            connection: ConnectionLimits::default(),
            body_timeout: Duration::from_secs(30),
        }
    }
}

/// Errors starting a server.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The listen address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// Address asked for.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The certificate, key or client CA could not be used.
    #[error("TLS: {0}")]
    Tls(String),
    /// It would serve clients it cannot tell apart where it must not.
    #[error("{0}")]
    Unauthenticated(String),
}

fn tls_error(what: &str, e: impl std::fmt::Display) -> ServeError {
    ServeError::Tls(format!("{what}: {e}"))
}

/// A serving certificate and key (PEM), and the CA that clients verify it with.
#[derive(Clone)]
pub struct ServingCert {
    /// Certificate chain.
    pub cert_pem: String,
    /// Private key.
    pub key_pem: String,
    /// What clients trust: the generated CA, or the given certificate itself when unknown.
    pub ca_pem: String,
}

impl std::fmt::Debug for ServingCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServingCert").finish_non_exhaustive()
    }
}

/// What a serving certificate for `names` says, whoever signs it (a generated CA, or the CA of
/// `--tls-secret`): server authentication, and the issuer's key identifier.
pub(crate) fn serving_params(
    common_name: &str,
    names: Vec<String>,
) -> Result<CertificateParams, rcgen::Error> {
    let mut params = CertificateParams::new(names)?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    params.distinguished_name = dn;
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.use_authority_key_identifier_extension = true;
    Ok(params)
}

impl ServingCert {
    /// A fresh CA and a certificate it issues for `sans` (DNS names or IP addresses).
    pub fn generate(common_name: &str, sans: &[String]) -> Result<Self, ServeError> {
        let mut ca_params = CertificateParams::new(Vec::<String>::new())
            .map_err(|e| tls_error("generating a CA", e))?;
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, format!("{common_name}-ca"));
        ca_params.distinguished_name = dn;
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca_key = KeyPair::generate().map_err(|e| tls_error("generating a CA key", e))?;
        let ca = CertifiedIssuer::self_signed(ca_params, ca_key)
            .map_err(|e| tls_error("signing the CA", e))?;
        let params = serving_params(common_name, sans.to_vec())
            .map_err(|e| tls_error("serving certificate names", e))?;
        let key = KeyPair::generate().map_err(|e| tls_error("generating a key", e))?;
        let cert = params
            .signed_by(&key, &ca)
            .map_err(|e| tls_error("signing the serving certificate", e))?;
        Ok(Self {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            ca_pem: ca.pem(),
        })
    }

    /// Reads a certificate and key from files; the certificate is also what clients trust.
    pub fn from_files(cert: &std::path::Path, key: &std::path::Path) -> Result<Self, ServeError> {
        let read = |p: &std::path::Path| {
            std::fs::read_to_string(p)
                .map_err(|e| tls_error(&format!("reading {}", p.display()), e))
        };
        let cert_pem = read(cert)?;
        Ok(Self {
            key_pem: read(key)?,
            ca_pem: cert_pem.clone(),
            cert_pem,
        })
    }
}

/// The certificate a server presents, replaceable while it serves (a certificate renewed in its
/// Secret): new handshakes get the new one, open connections keep theirs. Clones share it.
#[derive(Clone)]
pub struct LiveCert {
    inner: Arc<RwLock<(ServingCert, Arc<CertifiedKey>)>>,
}

impl std::fmt::Debug for LiveCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiveCert").finish_non_exhaustive()
    }
}

fn certified_key(cert: &ServingCert) -> Result<Arc<CertifiedKey>, ServeError> {
    let chain = CertificateDer::pem_slice_iter(cert.cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| tls_error("serving certificate", e))?;
    if chain.is_empty() {
        return Err(ServeError::Tls(
            "serving certificate: no certificate in the PEM".into(),
        ));
    }
    let key = PrivateKeyDer::from_pem_slice(cert.key_pem.as_bytes())
        .map_err(|e| tls_error("serving key", e))?;
    CertifiedKey::from_der(chain, key, &rustls::crypto::ring::default_provider())
        .map(Arc::new)
        .map_err(|e| tls_error("serving certificate and key", e))
}

impl LiveCert {
    /// Presents `cert` until replaced.
    pub fn new(cert: ServingCert) -> Result<Self, ServeError> {
        let key = certified_key(&cert)?;
        Ok(Self {
            inner: Arc::new(RwLock::new((cert, key))),
        })
    }

    /// What is presented now.
    pub fn current(&self) -> ServingCert {
        self.inner
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .0
            .clone()
    }

    /// Presents `cert` from the next handshake on; one that cannot be used is refused and the
    /// current one stays.
    pub fn replace(&self, cert: ServingCert) -> Result<(), ServeError> {
        let key = certified_key(&cert)?;
        *self
            .inner
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = (cert, key);
        Ok(())
    }
}

impl std::fmt::Debug for Resolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Resolver")
    }
}

/// Hands rustls the [`LiveCert`]'s certificate at each handshake.
struct Resolver(LiveCert);

impl ResolvesServerCert for Resolver {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(
            self.0
                .inner
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .1
                .clone(),
        )
    }
}

/// [`tls_config`] presenting whatever `cert` holds at each handshake.
pub fn tls_config_live(
    cert: &LiveCert,
    client_ca: Option<&str>,
) -> Result<Arc<rustls::ServerConfig>, ServeError> {
    let mut config = Arc::unwrap_or_clone(tls_config(&cert.current(), client_ca)?);
    config.cert_resolver = Arc::new(Resolver(cert.clone()));
    Ok(Arc::new(config))
}

/// Who may connect: clients presenting a certificate that chains to `ca_pem`, and, unless
/// `allowed_names` is empty, whose subject common name is one of them (as kube-apiserver's
/// `--requestheader-allowed-names`): a cluster CA also signs kubelets' and users' certificates,
/// and none of them is kube-scheduler.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientAuth {
    /// The CA bundle (PEM) client certificates must chain to.
    pub ca_pem: String,
    /// Common names accepted; empty: any certificate of the CA.
    pub allowed_names: Vec<String>,
}

/// The user a client certificate names: its subject's common name, the last one when there are
/// several (Go's `pkix.Name` keeps the last, and Kubernetes reads that).
pub fn common_name(cert: &CertificateDer<'_>) -> Option<String> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
    parsed
        .subject()
        .iter_common_name()
        .last()
        .and_then(|cn| cn.as_str().ok())
        .map(str::to_owned)
}

/// Verifies as WebPKI does, then refuses a certificate whose common name is not allowed.
#[derive(Debug)]
struct NamedClients {
    inner: Arc<dyn ClientCertVerifier>,
    allowed: Vec<String>,
}

impl ClientCertVerifier for NamedClients {
    fn root_hint_subjects(&self) -> &[rustls::DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: rustls::pki_types::UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self
            .inner
            .verify_client_cert(end_entity, intermediates, now)?;
        if self.allowed.is_empty() {
            return Ok(verified);
        }
        let name = common_name(end_entity).unwrap_or_default();
        if self.allowed.contains(&name) {
            return Ok(verified);
        }
        // Debug only: whoever reaches the port can make this line, as often as they like.
        tracing::debug!(
            common_name = %truncated(&name, 128),
            "refused a client certificate whose common name is not allowed"
        );
        Err(rustls::Error::InvalidCertificate(
            rustls::CertificateError::ApplicationVerificationFailure,
        ))
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// At most `max` characters of `text` (an ellipsis and the full length when cut): what comes
/// from a request is logged through this, so a client cannot write megabytes of log per request.
pub fn truncated(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        None => text.to_owned(),
        Some((at, _)) => format!("{}... ({} bytes)", &text[..at], text.len()),
    }
}

/// [`tls_config_live`] requiring client certificates as `auth` says (none when `None`).
pub fn tls_config_clients(
    cert: &LiveCert,
    auth: Option<&ClientAuth>,
) -> Result<Arc<rustls::ServerConfig>, ServeError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| tls_error("TLS versions", e))?;
    let builder = match auth {
        None => builder.with_no_client_auth(),
        Some(auth) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in CertificateDer::pem_slice_iter(auth.ca_pem.as_bytes()) {
                roots
                    .add(c.map_err(|e| tls_error("client CA", e))?)
                    .map_err(|e| tls_error("client CA", e))?;
            }
            let inner = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| tls_error("client CA", e))?;
            builder.with_client_cert_verifier(Arc::new(NamedClients {
                inner,
                allowed: auth.allowed_names.clone(),
            }))
        }
    };
    let mut config = builder.with_cert_resolver(Arc::new(Resolver(cert.clone())));
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Builds the rustls configuration: `client_ca` set means client certificates are required and
/// verified against it.
pub fn tls_config(
    cert: &ServingCert,
    client_ca: Option<&str>,
) -> Result<Arc<rustls::ServerConfig>, ServeError> {
    tensile_runtime::tls::server_config(
        &cert.cert_pem,
        &cert.key_pem,
        client_ca.map(|ca| (ca, tensile_runtime::tls::ClientCerts::Required)),
        &[b"h2", b"http/1.1"],
    )
    .map_err(ServeError::Tls)
}

/// What a handler answers: a status and a JSON body.
#[derive(Debug)]
pub struct Reply {
    /// HTTP status.
    pub status: StatusCode,
    /// JSON body.
    pub body: Vec<u8>,
}

impl Reply {
    /// 200 with `value` as JSON.
    pub fn json(value: &impl serde::Serialize) -> Self {
        Self::json_sized(value, 1 << 10)
    }

    /// [`Reply::json`] written into a buffer of `capacity` bytes to start with (a large answer
    /// grown by doubling would be held twice while copied).
    pub fn json_sized(value: &impl serde::Serialize, capacity: usize) -> Self {
        let mut body = Vec::with_capacity(capacity);
        match serde_json::to_writer(&mut body, value) {
            Ok(()) => Self {
                status: StatusCode::OK,
                body,
            },
            Err(e) => Self::error(
                StatusCode::INTERNAL_SERVER_ERROR,
                &format!("encoding the answer: {e}"),
            ),
        }
    }

    /// An error with a plain-text reason.
    pub fn error(status: StatusCode, reason: &str) -> Self {
        Self {
            status,
            body: reason.as_bytes().to_vec(),
        }
    }
}

/// A JSON POST handler: `(path, body)` to a reply.
pub trait Handler: Send + Sync + 'static {
    /// Answers one POST.
    fn handle(&self, path: &str, body: Bytes) -> Pin<Box<dyn Future<Output = Reply> + Send + '_>>;

    /// The largest body accepted; a larger one is refused with 413 before it is read.
    fn max_body(&self) -> usize {
        DEFAULT_MAX_BODY
    }

    /// How many requests it works on at once (see [`DEFAULT_MAX_CONCURRENT`]).
    fn max_concurrent(&self) -> usize {
        DEFAULT_MAX_CONCURRENT
    }

    /// How many more may wait for one of those to finish (see [`MAX_WAITING`]).
    fn max_waiting(&self) -> usize {
        MAX_WAITING
    }

    /// Whether a request to `path` is mostly a wait on another server with little decoded from
    /// a small body (the extender's bind: one API write). Such a request may send at most
    /// [`SMALL_BODY`] and takes one of [`MAX_IO_BOUND`] places of its own, so the
    /// `max_concurrent` ones are never held across a round trip.
    fn waits_on_io(&self, _path: &str) -> bool {
        false
    }

    /// How many bodies larger than [`SMALL_BODY`] are read at once (each up to
    /// [`Handler::max_body`]): with [`SMALL_POOL`], what bodies being read can hold.
    fn large_bodies(&self) -> usize {
        2
    }
}

/// Bounds what requests hold. A body is read against [`SMALL_POOL`], frame by frame as its
/// bytes arrive (a slow sender holds only what it sent), and past [`SMALL_BODY`] in one of
/// `large` places, so large bodies never share out the pool among themselves and stall each
/// other; a request whose bytes find no room within [`MAX_WAIT`] is answered 503. Once read, at
/// most `max_concurrent` requests are handled at once (each holds what is decoded from its
/// body), `max_waiting` more wait up to [`MAX_WAIT`], and the rest are answered 503 with the
/// reason.
struct Gate {
    permits: Arc<Semaphore>,
    /// The places of requests that wait on another server ([`MAX_IO_BOUND`]).
    io_bound: Arc<Semaphore>,
    max_concurrent: usize,
    max_waiting: usize,
    waiting: AtomicUsize,
    small: Arc<Semaphore>,
    large: Arc<Semaphore>,
    large_bodies: usize,
}

/// What a body being read holds: its bytes in the small pool, or a large-body place.
struct BodyHold {
    _small: Option<OwnedSemaphorePermit>,
    _large: Option<OwnedSemaphorePermit>,
}

fn busy(why: String) -> Response<Full<Bytes>> {
    let mut r = plain(StatusCode::SERVICE_UNAVAILABLE, why);
    r.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    r
}

impl Gate {
    fn new(max_concurrent: usize, max_waiting: usize, large_bodies: usize) -> Self {
        let max_concurrent = max_concurrent.max(1);
        let large_bodies = large_bodies.max(1);
        Self {
            permits: Arc::new(Semaphore::new(max_concurrent)),
            io_bound: Arc::new(Semaphore::new(MAX_IO_BOUND)),
            max_concurrent,
            max_waiting,
            waiting: AtomicUsize::new(0),
            small: Arc::new(Semaphore::new(SMALL_POOL)),
            large: Arc::new(Semaphore::new(large_bodies)),
            large_bodies,
        }
    }

    /// `n` bytes of the small pool (`n` at most [`SMALL_BODY`]), or None when they are not free
    /// within [`MAX_WAIT`].
    async fn take_small(&self, n: usize) -> Option<OwnedSemaphorePermit> {
        let n = u32::try_from(n.min(SMALL_BODY)).ok()?;
        tokio::time::timeout(MAX_WAIT, self.small.clone().acquire_many_owned(n))
            .await
            .ok()?
            .ok()
    }

    /// A large-body place, or None when none is free within [`MAX_WAIT`].
    async fn take_large(&self) -> Option<OwnedSemaphorePermit> {
        tokio::time::timeout(MAX_WAIT, self.large.clone().acquire_owned())
            .await
            .ok()?
            .ok()
    }

    /// A place among the requests that wait on another server, or 503 when none frees up
    /// within [`MAX_WAIT`].
    async fn enter_io_bound(&self) -> Result<OwnedSemaphorePermit, Response<Full<Bytes>>> {
        match tokio::time::timeout(MAX_WAIT, self.io_bound.clone().acquire_owned()).await {
            Ok(Ok(permit)) => Ok(permit),
            _ => Err(busy(format!(
                "busy: waited {MAX_WAIT:?} behind {MAX_IO_BOUND} requests in progress; retry"
            ))),
        }
    }

    async fn enter(&self) -> Result<OwnedSemaphorePermit, Response<Full<Bytes>>> {
        if let Ok(permit) = self.permits.clone().try_acquire_owned() {
            return Ok(permit);
        }
        if self.waiting.fetch_add(1, Ordering::AcqRel) >= self.max_waiting {
            self.waiting.fetch_sub(1, Ordering::AcqRel);
            return Err(busy(format!(
                "busy: {} requests in progress and {} waiting; retry",
                self.max_concurrent, self.max_waiting
            )));
        }
        let permit = tokio::time::timeout(MAX_WAIT, self.permits.clone().acquire_owned()).await;
        self.waiting.fetch_sub(1, Ordering::AcqRel);
        match permit {
            Ok(Ok(permit)) => Ok(permit),
            _ => Err(busy(format!(
                "busy: waited {MAX_WAIT:?} behind {} requests in progress; retry",
                self.max_concurrent
            ))),
        }
    }
}

/// A running server; stops when dropped.
#[derive(Debug)]
pub struct Server {
    addr: SocketAddr,
    stop: CancellationToken,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl Server {
    /// Binds `listen` and serves `handler` over TLS until dropped, with the default limits.
    pub async fn start(
        listen: SocketAddr,
        tls: Arc<rustls::ServerConfig>,
        handler: Arc<dyn Handler>,
    ) -> Result<Self, ServeError> {
        Self::start_with(listen, tls, handler, ServerLimits::default()).await
    }

    /// [`Server::start`] with the given limits.
    pub async fn start_with(
        listen: SocketAddr,
        tls: Arc<rustls::ServerConfig>,
        handler: Arc<dyn Handler>,
        limits: ServerLimits,
    ) -> Result<Self, ServeError> {
        let listener = TcpListener::bind(listen)
            .await
            .map_err(|source| ServeError::Bind {
                addr: listen,
                source,
            })?;
        let addr = listener.local_addr().map_err(|source| ServeError::Bind {
            addr: listen,
            source,
        })?;
        let stop = CancellationToken::new();
        let connection = limits.connection;
        let gate = Arc::new(Gate::new(
            handler.max_concurrent(),
            handler.max_waiting(),
            handler.large_bodies(),
        ));
        tensile_runtime::tls::accept_loop(listener, tls, connection, stop.clone(), move |tls| {
            let (handler, gate) = (handler.clone(), gate.clone());
            async move {
                let svc = service_fn(move |req| {
                    let (handler, gate) = (handler.clone(), gate.clone());
                    async move {
                        Ok::<_, Infallible>(
                            respond(handler.as_ref(), &gate, req, limits.body_timeout).await,
                        )
                    }
                });
                tensile_runtime::tls::serve_connection(tls, &connection, svc).await;
            }
        });
        Ok(Self { addr, stop })
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

fn response(
    status: StatusCode,
    content_type: &'static str,
    body: Vec<u8>,
) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

fn plain(status: StatusCode, reason: String) -> Response<Full<Bytes>> {
    response(status, "text/plain; charset=utf-8", reason.into_bytes())
}

async fn respond(
    handler: &dyn Handler,
    gate: &Gate,
    req: Request<Incoming>,
    body_timeout: Duration,
) -> Response<Full<Bytes>> {
    let path = req.uri().path().to_owned();
    if path == "/healthz" || path == "/readyz" || path == "/livez" {
        return response(StatusCode::OK, "text/plain; charset=utf-8", b"ok".to_vec());
    }
    if req.method() != Method::POST {
        return response(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain; charset=utf-8",
            format!("{} {path}: only POST is served here", req.method()).into_bytes(),
        );
    }
    let io_bound = handler.waits_on_io(&path);
    let max = if io_bound {
        handler.max_body().min(SMALL_BODY)
    } else {
        handler.max_body()
    };
    let too_large = || {
        plain(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the request body is larger than {max} bytes"),
        )
    };
    // Refused from its announced length, before reading it.
    let announced = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if announced.is_some_and(|n| n > u64::try_from(max).unwrap_or(u64::MAX)) {
        return too_large();
    }
    let expected = announced.and_then(|n| usize::try_from(n).ok());
    let read = tokio::time::timeout(
        body_timeout,
        read_body(Limited::new(req.into_body(), max), expected, max, gate),
    );
    // The body's bytes stay counted until the answer is built.
    let (body, _bytes) = match read.await {
        Ok(Ok(Ok(b))) => b,
        Ok(Err(busy)) => return busy,
        Ok(Ok(Err(e))) if e.is::<http_body_util::LengthLimitError>() => return too_large(),
        Ok(Ok(Err(e))) => {
            return plain(
                StatusCode::BAD_REQUEST,
                format!("reading the request body: {e}"),
            );
        }
        Err(_) => {
            return plain(
                StatusCode::REQUEST_TIMEOUT,
                format!("the request body did not arrive within {body_timeout:?}"),
            );
        }
    };
    // Held until the answer is built: what is decoded from the body counts against it.
    let entered = if io_bound {
        gate.enter_io_bound().await
    } else {
        gate.enter().await
    };
    let _permit = match entered {
        Ok(p) => p,
        Err(busy) => return busy,
    };
    let reply = handler.handle(&path, body).await;
    let content_type = if reply.status.is_success() {
        "application/json"
    } else {
        "text/plain; charset=utf-8"
    };
    response(reply.status, content_type, reply.body)
}

/// The whole body in one buffer: collecting the frames and joining them would hold the body
/// twice, and so would growing a buffer by doubling. It is the announced length, or the limit
/// when none is announced, reserved once the body holds a large-body place (a small body's
/// buffer is small: the allocator keeps freed pages, and 16 waiting bodies each with a
/// buffer of the limit took a debug webhook to 90 MiB). What it holds is taken from
/// `gate` as the bytes arrive (see [`Gate`]) and returned with it. The outer error is the 503
/// for no room.
async fn read_body(
    mut body: Limited<Incoming>,
    expected: Option<usize>,
    max: usize,
    gate: &Gate,
) -> Result<
    Result<(Bytes, BodyHold), Box<dyn std::error::Error + Send + Sync>>,
    Response<Full<Bytes>>,
> {
    let whole = expected.unwrap_or(max).min(max);
    let mut buf = Vec::with_capacity(whole.min(SMALL_BODY));
    let mut small: Option<OwnedSemaphorePermit> = None;
    let mut large: Option<OwnedSemaphorePermit> = None;
    while let Some(frame) = body.frame().await {
        let frame = match frame {
            Ok(f) => f,
            Err(e) => return Ok(Err(e)),
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        if large.is_none() && !data.is_empty() {
            if buf.len() + data.len() <= SMALL_BODY {
                let Some(bytes) = gate.take_small(data.len()).await else {
                    return Err(busy(format!(
                        "busy: request bodies being read hold the {SMALL_POOL} bytes kept for \
                         them; retry"
                    )));
                };
                match &mut small {
                    Some(held) => held.merge(bytes),
                    None => small = Some(bytes),
                }
            } else {
                let Some(place) = gate.take_large().await else {
                    return Err(busy(format!(
                        "busy: {} request bodies over {SMALL_BODY} bytes are being read; retry",
                        gate.large_bodies
                    )));
                };
                large = Some(place);
                // Its bytes are counted by the place from now on.
                small = None;
                buf.reserve_exact(whole.max(buf.len() + data.len()) - buf.len());
            }
        }
        buf.extend_from_slice(&data);
    }
    Ok(Ok((
        Bytes::from(buf),
        BodyHold {
            _small: small,
            _large: large,
        },
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_a_request_says_is_logged_truncated() {
        assert_eq!(truncated("Pod", 8), "Pod");
        let long = "x".repeat(1 << 20);
        let cut = truncated(&long, 8);
        assert_eq!(cut, format!("xxxxxxxx... ({} bytes)", 1 << 20));
        // Cut on a character boundary.
        assert_eq!(truncated("ééé", 2), "éé... (6 bytes)");
    }
}
