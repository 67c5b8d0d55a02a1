//! Authentication and authorization of kubelet API requests, as the kubelet does them:
//! client certificates verified against a CA (the TLS layer checks the chain; the user is the
//! subject's CN, its groups the O values), bearer tokens through a `TokenReview`, and every
//! request authorized by a `SubjectAccessReview` on `nodes/<node>` with the subresource the
//! path maps to. Decisions are cached as the kubelet caches them (tokens 2 min, authenticated or
//! not; allowed 5 min, denied 30 s; bounded), and at most [`MAX_REVIEWS_IN_FLIGHT`] reviews of
//! each kind are asked at once: more get 429 with `Retry-After`, so a flood of bogus tokens
//! costs the API server a bounded rate. Anonymous requests get 401 and denied ones 403, unless
//! the operator turned authentication off.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};
use tensile_core::guard::{ReviewTtls, TtlCache};
use tokio::sync::Semaphore;

pub use crate::tls::CertRefusal;

/// An authenticated user.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct User {
    /// User name.
    pub name: String,
    /// UID, if known.
    pub uid: Option<String>,
    /// Groups.
    pub groups: Vec<String>,
}

/// The authorization attributes of a request.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Attributes {
    /// Verb from the HTTP method.
    pub verb: &'static str,
    /// Subresources of `nodes` to try in order (the first allowed wins): the fine-grained one
    /// of KubeletFineGrainedAuthz, then `proxy`.
    pub subresources: Vec<&'static str>,
}

/// The kubelet's mapping of a request to authorization attributes.
pub fn attributes(method: &http::Method, path: &str) -> Attributes {
    let verb = match *method {
        http::Method::POST => "create",
        http::Method::PUT => "update",
        http::Method::PATCH => "patch",
        http::Method::DELETE => "delete",
        _ => "get",
    };
    let first = path
        .trim_start_matches('/')
        .split('/')
        .next()
        .unwrap_or_default();
    let subresources = match first {
        "stats" => vec!["stats"],
        "metrics" => vec!["metrics"],
        "logs" => vec!["log"],
        "pods" | "runningpods" => vec!["pods", "proxy"],
        "healthz" => vec!["healthz", "proxy"],
        "configz" => vec!["configz", "proxy"],
        _ => vec!["proxy"],
    };
    Attributes { verb, subresources }
}

/// Why a request is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// No (valid) credentials: 401.
    #[error("Unauthorized")]
    Unauthenticated,
    /// Authenticated but not allowed: 403.
    #[error("Forbidden (user={user}, verb={verb}, resource=nodes, subresource({subresource}))")]
    Forbidden {
        /// Who.
        user: String,
        /// Verb.
        verb: &'static str,
        /// The subresource asked.
        subresource: &'static str,
    },
    /// The API server could not be asked: 500.
    #[error("{0}")]
    Review(String),
    /// Too many reviews in flight already: 429, to be retried after
    /// [`RETRY_AFTER_SECONDS`].
    #[error("too many requests are being authenticated or authorized: retry later")]
    TooManyReviews,
}

impl AuthError {
    /// HTTP status.
    pub fn status(&self) -> u16 {
        match self {
            Self::Unauthenticated => 401,
            Self::Forbidden { .. } => 403,
            Self::Review(_) => 500,
            Self::TooManyReviews => 429,
        }
    }
}

/// Entries of each review cache: a flood of unique tokens cannot grow memory past this, and
/// negative answers never push out positive ones (they are kept apart).
const CACHE_ENTRIES: usize = 4096;

/// Reviews of each kind (TokenReview, SubjectAccessReview) in flight at once; a request that
/// would need one more is answered 429 at once rather than queued behind the rate limit.
pub const MAX_REVIEWS_IN_FLIGHT: usize = 16;

/// What a 429 asks the client to wait, in seconds.
pub const RETRY_AFTER_SECONDS: u64 = 1;

/// A cache of review answers, shared by requests.
struct Cache<K, V>(Mutex<TtlCache<K, V>>);

impl<K: std::hash::Hash + Eq + Clone, V: Clone> Cache<K, V> {
    fn new() -> Self {
        Self(Mutex::new(TtlCache::new(CACHE_ENTRIES)))
    }

    fn get(&self, k: &K) -> Option<V> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(k, Instant::now())
    }

    fn put(&self, k: K, v: V, ttl: Duration) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(k, v, ttl, Instant::now());
    }
}

/// The cache key of a bearer token: its SHA-256, so the caches hold 32 bytes per token whatever
/// a client sends, and no token in memory longer than its request. None (never expected) if no
/// SHA-256 is at hand: then nothing is cached rather than tokens sharing a key.
fn token_key(token: &str) -> Option<[u8; 32]> {
    let suite = rustls::crypto::ring::cipher_suite::TLS13_AES_128_GCM_SHA256.tls13()?;
    let digest = suite.common.hash_provider.hash(token.as_bytes());
    digest.as_ref().try_into().ok()
}

/// How the kubelet API checks requests.
pub enum Auth {
    /// Everyone may do everything. Only when the operator asks for it.
    Disabled,
    /// TokenReview and SubjectAccessReview through this API server client.
    Webhook(Box<WebhookAuth>),
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Disabled => f.write_str("Auth::Disabled"),
            Self::Webhook(w) => write!(f, "Auth::Webhook(node={})", w.node),
        }
    }
}

/// Why the client CA could not be read from the upper cluster's `kube-root-ca.crt`.
#[derive(Debug, thiserror::Error)]
pub enum ClientCaError {
    /// The ConfigMap could not be read (forbidden, not found, unreachable).
    #[error("reading kube-system/kube-root-ca.crt: {}", describe_read(.0))]
    Read(#[source] kube::Error),
    /// It has no `ca.crt`.
    #[error("kube-system/kube-root-ca.crt has no ca.crt")]
    NoCaCrt,
    /// Its `ca.crt` holds no certificate.
    #[error("ca.crt of kube-system/kube-root-ca.crt is not a PEM certificate{}", .0.as_deref().map(|e| format!(": {e}")).unwrap_or_default())]
    NotPem(Option<String>),
}

fn describe_read(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) if s.code == 403 => format!(
            "forbidden: the virtual node's identity may not get configmaps in kube-system ({})",
            s.message
        ),
        kube::Error::Api(s) if s.code == 404 => "not found".to_owned(),
        kube::Error::Api(s) => format!("{} ({})", s.message, s.code),
        other => other.to_string(),
    }
}

/// The CA a cluster's API server signs its kubelet client certificates with, as kubeadm and
/// the embedded API server set clusters up: `ca.crt` of `kube-system/kube-root-ca.crt`. When
/// it cannot be read, client certificates cannot be accepted (tokens still are): the error
/// says why, for the operator.
pub async fn cluster_client_ca(client: &kube::Client) -> Result<String, ClientCaError> {
    let config_maps: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(client.clone(), "kube-system");
    let pem = config_maps
        .get("kube-root-ca.crt")
        .await
        .map_err(ClientCaError::Read)?
        .data
        .and_then(|mut d| d.remove("ca.crt"))
        .ok_or(ClientCaError::NoCaCrt)?;
    check_ca_pem(&pem)?;
    Ok(pem)
}

/// Whether `pem` holds at least one certificate, all of them readable.
pub fn check_ca_pem(pem: &str) -> Result<(), ClientCaError> {
    use rustls_pki_types::pem::PemObject;
    let certs = rustls_pki_types::CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| ClientCaError::NotPem(Some(e.to_string())))?;
    if certs.is_empty() {
        return Err(ClientCaError::NotPem(None));
    }
    Ok(())
}

/// The client certificate of a connection, checked against the client CA.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum ClientCert {
    /// None presented.
    #[default]
    None,
    /// Verified: its user.
    Verified(User),
    /// Presented but not accepted.
    Refused(CertRefusal),
}

impl From<Option<User>> for ClientCert {
    fn from(u: Option<User>) -> Self {
        u.map_or(Self::None, Self::Verified)
    }
}

/// Why a request was refused, as counted (`reason` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RefusalReason {
    /// No client certificate and no bearer token: 401.
    NoCredentials,
    /// A client certificate not signed by the trusted CA, or no CA configured (and no token): 401.
    UnknownCa,
    /// A client certificate of the CA but not valid (expired, wrong usage): 401.
    BadCertificate,
    /// A bearer token the API server did not accept: 401.
    BadToken,
    /// Authenticated but not allowed: 403.
    Forbidden,
    /// The reviews could not be made: 500.
    ReviewFailed,
    /// Too many reviews in flight: 429.
    Throttled,
}

impl RefusalReason {
    /// The metric label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NoCredentials => "no_credentials",
            Self::UnknownCa => "unknown_ca",
            Self::BadCertificate => "bad_certificate",
            Self::BadToken => "bad_token",
            Self::Forbidden => "forbidden",
            Self::ReviewFailed => "review_failed",
            Self::Throttled => "throttled",
        }
    }

    /// Every reason.
    pub const ALL: [Self; 7] = [
        Self::NoCredentials,
        Self::UnknownCa,
        Self::BadCertificate,
        Self::BadToken,
        Self::Forbidden,
        Self::ReviewFailed,
        Self::Throttled,
    ];
}

/// A refused request, as told to the [`RefusalHook`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// Why.
    pub reason: RefusalReason,
    /// The client certificate refused, if one was presented and refused.
    pub certificate: Option<CertRefusal>,
    /// The user authenticated (for [`RefusalReason::Forbidden`]) and whether by certificate.
    pub user: Option<(String, bool)>,
}

/// Told of every refused request (to count them and warn); called on the request's task, so
/// it must not block.
pub type RefusalHook = Arc<dyn Fn(&Refusal) + Send + Sync>;

/// TokenReview/SubjectAccessReview against an API server, cached as the kubelet caches them
/// and bounded: at most [`MAX_REVIEWS_IN_FLIGHT`] of each kind at once, the rest answered 429.
#[allow(missing_debug_implementations)] // holds a client and token caches: nothing to show
pub struct WebhookAuth {
    client: kube::Client,
    node: String,
    /// Bearer tokens are reviewed (`--authentication-token-webhook`); when off, a token is no
    /// credential.
    token_reviews: bool,
    ttls: ReviewTtls,
    /// Authenticated tokens, by [`token_key`].
    tokens: Cache<[u8; 32], User>,
    /// Tokens the API server did not authenticate, apart so a flood of them evicts no user.
    bad_tokens: Cache<[u8; 32], ()>,
    allowed: Cache<(User, &'static str, &'static str), ()>,
    denied: Cache<(User, &'static str, &'static str), ()>,
    token_permits: Semaphore,
    access_permits: Semaphore,
    refusals: Option<RefusalHook>,
}

impl WebhookAuth {
    /// Reviews against the API server of `client`, for node `node`. `client` should be one of
    /// its own (its own rate limit): reviews asked for by anyone who reaches the port must not
    /// wait in front of, or delay, the node's lease and status.
    pub fn new(client: kube::Client, node: impl Into<String>) -> Self {
        Self {
            client,
            node: node.into(),
            token_reviews: true,
            ttls: ReviewTtls::default(),
            tokens: Cache::new(),
            bad_tokens: Cache::new(),
            allowed: Cache::new(),
            denied: Cache::new(),
            token_permits: Semaphore::new(MAX_REVIEWS_IN_FLIGHT),
            access_permits: Semaphore::new(MAX_REVIEWS_IN_FLIGHT),
            refusals: None,
        }
    }

    /// Whether bearer tokens are reviewed (`--authentication-token-webhook`, on by default):
    /// when off, only client certificates authenticate, and a request with a token alone is a
    /// 401 without asking the API server.
    #[must_use]
    pub fn with_token_reviews(mut self, on: bool) -> Self {
        self.token_reviews = on;
        self
    }

    /// How long answers are cached (the kubelet's defaults unless the flags say otherwise).
    #[must_use]
    pub fn with_ttls(mut self, ttls: ReviewTtls) -> Self {
        self.ttls = ttls;
        self
    }

    /// Tells `hook` of every refused request.
    #[must_use]
    pub fn with_refusal_hook(mut self, hook: RefusalHook) -> Self {
        self.refusals = Some(hook);
        self
    }

    async fn token_user(&self, token: &str) -> Result<Option<User>, AuthError> {
        let key = token_key(token);
        if let Some(key) = &key {
            if let Some(user) = self.tokens.get(key) {
                return Ok(Some(user));
            }
            if self.bad_tokens.get(key).is_some() {
                return Ok(None);
            }
        }
        let Ok(_permit) = self.token_permits.try_acquire() else {
            return Err(AuthError::TooManyReviews);
        };
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_owned()),
                audiences: None,
            },
            ..TokenReview::default()
        };
        let reviewed = Api::<TokenReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| AuthError::Review(format!("token review failed: {e}")))?;
        let user = reviewed
            .status
            .filter(|s| s.authenticated == Some(true))
            .and_then(|s| s.user)
            .map(|u| User {
                name: u.username.unwrap_or_default(),
                uid: u.uid,
                groups: u.groups.unwrap_or_default(),
            });
        match (key, &user) {
            (Some(key), Some(u)) => self.tokens.put(key, u.clone(), self.ttls.authenticated),
            (Some(key), None) => self.bad_tokens.put(key, (), self.ttls.unauthenticated),
            (None, _) => {}
        }
        Ok(user)
    }

    async fn allowed(
        &self,
        user: &User,
        verb: &'static str,
        subresource: &'static str,
    ) -> Result<bool, AuthError> {
        let key = (user.clone(), verb, subresource);
        if self.allowed.get(&key).is_some() {
            return Ok(true);
        }
        if self.denied.get(&key).is_some() {
            return Ok(false);
        }
        let Ok(_permit) = self.access_permits.try_acquire() else {
            return Err(AuthError::TooManyReviews);
        };
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(user.name.clone()),
                uid: user.uid.clone(),
                groups: Some(user.groups.clone()),
                resource_attributes: Some(ResourceAttributes {
                    verb: Some(verb.to_owned()),
                    resource: Some("nodes".to_owned()),
                    subresource: Some(subresource.to_owned()),
                    name: Some(self.node.clone()),
                    version: Some("v1".to_owned()),
                    ..ResourceAttributes::default()
                }),
                ..SubjectAccessReviewSpec::default()
            },
            ..SubjectAccessReview::default()
        };
        let reviewed = Api::<SubjectAccessReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| AuthError::Review(format!("subject access review failed: {e}")))?;
        let allowed = reviewed.status.is_some_and(|s| s.allowed);
        if allowed {
            self.allowed.put(key, (), self.ttls.allowed);
        } else {
            self.denied.put(key, (), self.ttls.denied);
        }
        Ok(allowed)
    }
}

impl Auth {
    /// Authenticates (a verified certificate's user, else a bearer token) and authorizes a
    /// request; a refusal is told to the refusal hook.
    pub async fn check(
        &self,
        cert: ClientCert,
        bearer: Option<&str>,
        attrs: &Attributes,
    ) -> Result<Option<User>, AuthError> {
        let Self::Webhook(w) = self else {
            return Ok(None);
        };
        let result = w.check(&cert, bearer, attrs).await;
        if let (Err(refused), Some(hook)) = (&result, &w.refusals) {
            let certificate = match cert {
                ClientCert::Refused(r) => Some(r),
                _ => None,
            };
            hook(&Refusal {
                reason: refused.reason,
                certificate,
                user: refused.user.clone(),
            });
        }
        result.map(Some).map_err(|r| match r.reason {
            RefusalReason::Forbidden => AuthError::Forbidden {
                user: r.user.map(|(u, _)| u).unwrap_or_default(),
                verb: attrs.verb,
                subresource: attrs.subresources.first().copied().unwrap_or("proxy"),
            },
            RefusalReason::ReviewFailed => r.review.unwrap_or(AuthError::Unauthenticated),
            RefusalReason::Throttled => AuthError::TooManyReviews,
            _ => AuthError::Unauthenticated,
        })
    }
}

/// Why [`WebhookAuth::check`] refused.
struct Refused {
    reason: RefusalReason,
    /// The user, for [`RefusalReason::Forbidden`], and whether a certificate authenticated it.
    user: Option<(String, bool)>,
    /// The error, for [`RefusalReason::ReviewFailed`].
    review: Option<AuthError>,
}

impl Refused {
    fn new(reason: RefusalReason) -> Self {
        Self {
            reason,
            user: None,
            review: None,
        }
    }

    fn review(e: AuthError) -> Self {
        if e == AuthError::TooManyReviews {
            return Self::new(RefusalReason::Throttled);
        }
        Self {
            review: Some(e),
            ..Self::new(RefusalReason::ReviewFailed)
        }
    }
}

impl WebhookAuth {
    async fn check(
        &self,
        cert: &ClientCert,
        bearer: Option<&str>,
        attrs: &Attributes,
    ) -> Result<User, Refused> {
        // A refused certificate is no credential: a token may still authenticate the request,
        // as with the kubelet's authenticators. With token reviews off, a token is none either
        // (the kubelet has no token authenticator then).
        let bearer = bearer.filter(|_| self.token_reviews);
        let (user, by_cert) = match (cert, bearer) {
            (ClientCert::Verified(u), _) => (u.clone(), true),
            (_, Some(token)) => match self.token_user(token).await.map_err(Refused::review)? {
                Some(u) => (u, false),
                None => return Err(Refused::new(RefusalReason::BadToken)),
            },
            (ClientCert::Refused(r), None) if r.unknown_ca => {
                return Err(Refused::new(RefusalReason::UnknownCa));
            }
            (ClientCert::Refused(_), None) => {
                return Err(Refused::new(RefusalReason::BadCertificate));
            }
            (ClientCert::None, None) => return Err(Refused::new(RefusalReason::NoCredentials)),
        };
        for sub in &attrs.subresources {
            if self
                .allowed(&user, attrs.verb, sub)
                .await
                .map_err(Refused::review)?
            {
                return Ok(user);
            }
        }
        Err(Refused {
            user: Some((user.name, by_cert)),
            ..Refused::new(RefusalReason::Forbidden)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_keyed_by_their_sha256() {
        // SHA-256("abc"), FIPS 180-2's example.
        let key = token_key("abc").unwrap();
        assert_eq!(key[..4], [0xba, 0x78, 0x16, 0xbf]);
        assert_eq!(key[28..], [0xf2, 0x00, 0x15, 0xad]);
        assert_ne!(token_key("abd"), token_key("abc"));
    }

    #[test]
    fn paths_map_to_the_kubelets_subresources() {
        let get = http::Method::GET;
        assert_eq!(attributes(&get, "/stats/summary").subresources, ["stats"]);
        assert_eq!(
            attributes(&get, "/metrics/resource").subresources,
            ["metrics"]
        );
        assert_eq!(attributes(&get, "/logs/").subresources, ["log"]);
        assert_eq!(attributes(&get, "/pods").subresources, ["pods", "proxy"]);
        assert_eq!(
            attributes(&get, "/containerLogs/a/b/c").subresources,
            ["proxy"]
        );
        assert_eq!(
            attributes(&http::Method::POST, "/exec/a/b/c").verb,
            "create"
        );
        assert_eq!(attributes(&get, "/exec/a/b/c").verb, "get");
    }
}
