//! Kubernetes clients for the upper and the lower cluster.
//!
//! [`build_client`] turns a [`KubeconfigSource`] into a [`kube::Client`] with kube's default stack
//! (auth, rustls TLS, retries of 429/503/504) plus two layers of ours:
//!
//! - [`RateLimitLayer`]: client-go's client-side throttling, a token bucket with a QPS and a burst.
//!   A request waits until a token is available. A watch is one request, so it costs one token
//!   when it starts, however long it then streams.
//! - [`ApiCallLayer`]: counts every request by cluster, verb and resource in [`ApiCalls`], which
//!   feeds a Prometheus counter and a programmatic snapshot for tests and benchmarks.
//!
//! Unlike the original, a kubeconfig file that cannot be read or parsed is an error naming the
//! file; in-cluster configuration is used only when asked for ([`KubeconfigSource::InCluster`]).

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use http::{Method, Request};
use kube::config::{KubeConfigOptions, Kubeconfig, KubeconfigError};
use kube::{Client, Config};
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use tokio::time::{Instant, Sleep, sleep_until};
use tower::{Layer, Service};

/// The default QPS of the virtual node's clients, upper and lower. Not client-go's 5 (a 2015
/// default from before API Priority and Fairness): the API servers queue and shed load
/// themselves, and at 5 a burst of pods drained at about four status writes a second.
pub const DEFAULT_QPS: f32 = 500.0;
/// The default burst that goes with [`DEFAULT_QPS`].
pub const DEFAULT_BURST: u32 = 1000;

/// The longest wait between two tokens (a QPS below 1/day is treated as 1/day).
const MAX_INTERVAL: Duration = Duration::from_secs(24 * 60 * 60);
/// Waits longer than this are logged, as client-go does ("client-side throttling").
const LOG_WAIT_OVER: Duration = Duration::from_secs(1);

// ---------------------------------------------------------------------------------------------
// Errors and configuration sources

pub use crate::client_error::ClientError;

/// Where a client's configuration comes from.
#[derive(Clone)]
pub enum KubeconfigSource {
    /// A kubeconfig file, which must exist and parse (its current context is used).
    Path(PathBuf),
    /// The service account of the pod this process runs in. Only when explicitly chosen.
    InCluster,
    /// Kubeconfig YAML text (tests, `tensile up`).
    Text(String),
    /// A configuration already loaded (the upper one with a TLS-bootstrapped certificate).
    Loaded(Box<Config>),
}

impl fmt::Debug for KubeconfigSource {
    // The text may hold credentials: never print it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Path(path) => f.debug_tuple("Path").field(path).finish(),
            Self::InCluster => f.write_str("InCluster"),
            Self::Text(text) => write!(f, "Text(<{} bytes>)", text.len()),
            Self::Loaded(config) => write!(f, "Loaded({})", config.cluster_url),
        }
    }
}

impl fmt::Display for KubeconfigSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Path(path) => write!(f, "kubeconfig {}", path.display()),
            Self::InCluster => f.write_str("in-cluster configuration"),
            Self::Text(_) => f.write_str("inline kubeconfig"),
            Self::Loaded(_) => f.write_str("bootstrapped configuration"),
        }
    }
}

/// Whether the API server refused a creation because the object exists (409 AlreadyExists).
pub fn already_exists(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

/// Deletes `name` only while it is still the object with `uid` (a UID precondition: a namesake
/// created meanwhile is never touched), with `grace` seconds if given. Already gone is done.
pub async fn delete_exact<K>(
    api: &kube::Api<K>,
    name: &str,
    uid: Option<String>,
    grace: Option<u32>,
) -> Result<(), kube::Error>
where
    K: kube::Resource + Clone + fmt::Debug + serde::de::DeserializeOwned,
{
    let params = kube::api::DeleteParams {
        grace_period_seconds: grace,
        preconditions: Some(kube::api::Preconditions {
            uid,
            resource_version: None,
        }),
        ..kube::api::DeleteParams::default()
    };
    match api.delete(name, &params).await {
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        r => r.map(drop),
    }
}

/// Loads a client configuration. A file is read synchronously (it is small and read once).
pub async fn load_config(source: &KubeconfigSource) -> Result<Config, ClientError> {
    let options = KubeConfigOptions::default();
    match source {
        KubeconfigSource::Path(path) => {
            let invalid = |source| ClientError::InvalidKubeconfigFile {
                path: path.clone(),
                source,
            };
            // `read_from` also makes relative certificate and token paths relative to the file.
            let kubeconfig = Kubeconfig::read_from(path).map_err(|err| match err {
                KubeconfigError::ReadConfig(source, _) => ClientError::ReadKubeconfig {
                    path: path.clone(),
                    source,
                },
                other => invalid(other),
            })?;
            Config::from_custom_kubeconfig(kubeconfig, &options)
                .await
                .map_err(invalid)
        }
        KubeconfigSource::InCluster => Config::incluster().map_err(ClientError::InCluster),
        KubeconfigSource::Loaded(config) => Ok((**config).clone()),
        KubeconfigSource::Text(text) => {
            let kubeconfig =
                Kubeconfig::from_yaml(text).map_err(ClientError::InvalidKubeconfigText)?;
            Config::from_custom_kubeconfig(kubeconfig, &options)
                .await
                .map_err(ClientError::InvalidKubeconfigText)
        }
    }
}

/// Points a configuration at another API server URL (the original's `MASTER_URI`), keeping its
/// credentials. As in client-go, a URL without a scheme (`host:port`) means HTTPS.
pub fn override_server(config: &mut Config, url: &str) -> Result<(), ClientError> {
    let refuse = |reason: &str| ClientError::InvalidServerUrl {
        url: url.to_owned(),
        reason: reason.to_owned(),
    };
    let trimmed = url.trim();
    if trimmed.is_empty() {
        return Err(refuse("it is empty"));
    }
    let full = if trimmed.contains("://") {
        trimmed.to_owned()
    } else {
        format!("https://{trimmed}")
    };
    let uri: http::Uri = full
        .parse()
        .map_err(|err: http::uri::InvalidUri| refuse(&err.to_string()))?;
    if !matches!(uri.scheme_str(), Some("https" | "http")) {
        return Err(refuse("the scheme must be https or http"));
    }
    if uri.authority().is_none() {
        return Err(refuse("it has no host"));
    }
    config.cluster_url = uri;
    Ok(())
}

/// Builds a client from a loaded configuration: kube's default stack, then API-call counting,
/// then the token bucket (outermost). Must be called inside a Tokio runtime.
pub fn client_from_config(
    config: Config,
    qps: f32,
    burst: u32,
    cluster: &'static str,
    calls: &ApiCalls,
) -> Result<Client, ClientError> {
    client_with_layer(
        config,
        &tower::layer::util::Identity::new(),
        qps,
        burst,
        cluster,
        calls,
    )
}

pub use crate::transport::KubeStack;

/// The service stack of [`client_from_config`], which [`client_with_layer`] wraps.
pub type Counted = RateLimit<CountCalls<CountErrorAnswers<KubeStack>>>;

/// [`client_from_config`] with `outer` around the whole stack (a credential renewed in place,
/// which every clone of the client reads on every request).
pub fn client_with_layer<L, B>(
    mut config: Config,
    outer: &L,
    qps: f32,
    burst: u32,
    cluster: &'static str,
    calls: &ApiCalls,
) -> Result<Client, ClientError>
where
    L: Layer<Counted>,
    L::Service: Service<Request<kube::client::Body>, Response = http::Response<B>> + Send + 'static,
    <L::Service as Service<Request<kube::client::Body>>>::Future: Send + 'static,
    <L::Service as Service<Request<kube::client::Body>>>::Error:
        Into<Box<dyn std::error::Error + Send + Sync>>,
    B: hyper::body::Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    // kube retries 429/503/504 inside the call, up to 15 times over minutes: a worker would
    // hang on an unavailable cluster with nothing said on the pod. Our work queue retries with
    // backoff and reports each failure instead; watches back off by themselves.
    config.default_retry = false;
    let builder = crate::transport::client_builder(&config, cluster)?;
    let limits = RateLimitLayer::new(qps, burst);
    tracing::debug!(
        cluster,
        qps = limits.qps(),
        burst = limits.burst(),
        "building client"
    );
    Ok(builder
        .with_layer(&ErrorAnswerLayer::new(cluster, calls.clone()))
        .with_layer(&ApiCallLayer::new(cluster, calls.clone()))
        .with_layer(&limits)
        .with_layer(outer)
        .build())
}

/// Builds a rate-limited, counted client for `cluster` (`upper` or `lower`).
///
/// `qps <= 0` means no client-side limit; `burst == 0` means twice the QPS.
pub async fn build_client(
    source: KubeconfigSource,
    qps: f32,
    burst: u32,
    cluster: &'static str,
    calls: &ApiCalls,
) -> Result<Client, ClientError> {
    build_client_with_server(source, None, qps, burst, cluster, calls).await
}

/// [`build_client`] with an optional API server URL override (the original's `MASTER_URI`; we
/// apply it to every upper client, the original only to node-cli's). `None` or an empty string
/// means no override.
pub async fn build_client_with_server(
    source: KubeconfigSource,
    server: Option<&str>,
    qps: f32,
    burst: u32,
    cluster: &'static str,
    calls: &ApiCalls,
) -> Result<Client, ClientError> {
    let mut config = load_config(&source).await?;
    if let Some(url) = server.filter(|url| !url.trim().is_empty()) {
        override_server(&mut config, url)?;
    }
    client_from_config(config, qps, burst, cluster, calls)
}

// ---------------------------------------------------------------------------------------------
// Token bucket

/// The QPS and burst actually used for a configured pair: a QPS of 0 or less (or NaN) means no
/// client-side limit (infinite QPS; API Priority and Fairness on the server is the limit); a
/// burst of 0 is twice the QPS (at least 1).
pub fn effective_limits(qps: f32, burst: u32) -> (f64, u32) {
    if qps.is_nan() || qps <= 0.0 {
        return (f64::INFINITY, burst.max(1));
    }
    let qps = f64::from(qps);
    let burst = if burst == 0 {
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let twice = (qps * 2.0).ceil().min(f64::from(u32::MAX)) as u32;
        twice.max(1)
    } else {
        burst
    };
    (qps, burst)
}

/// A token bucket of `burst` tokens refilled at `qps` tokens a second, starting full.
///
/// Kept as its "theoretical arrival time" (GCRA), which is the same bucket in integer time: the
/// bucket is full when `tat <= now`, and a token is free while `tat - now <= (burst-1)/qps`.
#[derive(Clone, Debug)]
pub struct TokenBucket {
    interval: Duration,
    tolerance: Duration,
    tat: Instant,
}

impl TokenBucket {
    /// A full bucket at `now`. `qps` must be positive (infinite means no limit); `burst` at
    /// least 1 (0 is taken as 1).
    pub fn new(qps: f64, burst: u32, now: Instant) -> Self {
        let interval = Duration::try_from_secs_f64(1.0 / qps)
            .unwrap_or(MAX_INTERVAL)
            .min(MAX_INTERVAL);
        Self {
            interval,
            tolerance: interval.saturating_mul(burst.max(1) - 1),
            tat: now,
        }
    }

    /// Takes a token at `now`, or says when one will be available.
    pub fn try_acquire(&mut self, now: Instant) -> Result<(), Instant> {
        let tat = self.tat.max(now);
        let ahead = tat.saturating_duration_since(now);
        if ahead > self.tolerance {
            return Err(tat.checked_sub(self.tolerance).unwrap_or(now));
        }
        self.tat = tat.checked_add(self.interval).unwrap_or(tat);
        Ok(())
    }
}

/// Waits for a token of a shared `bucket`: [`RateLimit`]'s wait, for a client that is not a
/// tower service (the simulated scheduler's writes).
pub async fn acquire_token(bucket: &Mutex<TokenBucket>) {
    loop {
        let acquired = bucket
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .try_acquire(Instant::now());
        match acquired {
            Ok(()) => return,
            Err(at) => sleep_until(at).await,
        }
    }
}

/// A [`Layer`] throttling requests with a [`TokenBucket`], like client-go's client-side QPS and
/// burst. Each service it makes gets its own full bucket; clones of that service share it.
#[derive(Clone, Copy, Debug)]
pub struct RateLimitLayer {
    qps: f64,
    burst: u32,
}

impl RateLimitLayer {
    /// A layer for the configured QPS and burst (defaults as in [`effective_limits`]).
    pub fn new(qps: f32, burst: u32) -> Self {
        let (qps, burst) = effective_limits(qps, burst);
        Self { qps, burst }
    }

    /// The QPS in effect.
    pub fn qps(&self) -> f64 {
        self.qps
    }

    /// The burst in effect.
    pub fn burst(&self) -> u32 {
        self.burst
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;

    fn layer(&self, inner: S) -> RateLimit<S> {
        RateLimit {
            inner,
            bucket: Arc::new(Mutex::new(TokenBucket::new(
                self.qps,
                self.burst,
                Instant::now(),
            ))),
            permit: false,
            sleep: None,
        }
    }
}

/// The service made by [`RateLimitLayer`]: `poll_ready` waits for a token, `call` spends it.
#[derive(Debug)]
pub struct RateLimit<S> {
    inner: S,
    bucket: Arc<Mutex<TokenBucket>>,
    permit: bool,
    sleep: Option<Pin<Box<Sleep>>>,
}

impl<S: Clone> Clone for RateLimit<S> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            bucket: Arc::clone(&self.bucket),
            permit: false,
            sleep: None,
        }
    }
}

impl<S, R> Service<R> for RateLimit<S>
where
    S: Service<R>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        while !self.permit {
            let now = Instant::now();
            let acquired = self
                .bucket
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .try_acquire(now);
            match acquired {
                Ok(()) => {
                    self.permit = true;
                    self.sleep = None;
                }
                Err(at) => {
                    let sleep = match &mut self.sleep {
                        Some(sleep) => {
                            if sleep.deadline() != at {
                                sleep.as_mut().reset(at);
                            }
                            sleep
                        }
                        None => {
                            let wait = at.saturating_duration_since(now);
                            if wait > LOG_WAIT_OVER {
                                tracing::debug!(?wait, "client-side throttling");
                            }
                            self.sleep.insert(Box::pin(sleep_until(at)))
                        }
                    };
                    ready!(sleep.as_mut().poll(cx));
                }
            }
        }
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: R) -> S::Future {
        self.permit = false;
        self.inner.call(req)
    }
}

// ---------------------------------------------------------------------------------------------
// Request classification

/// A request's verb, as Kubernetes names it (audit logs, RBAC, `apiserver_request_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Verb {
    /// GET of one object (or of a subresource, including WebSocket exec/attach/log).
    Get,
    /// GET of a collection.
    List,
    /// GET of a collection with `watch` set (or under the legacy `/watch/` prefix).
    Watch,
    /// POST.
    Create,
    /// PUT.
    Update,
    /// PATCH.
    Patch,
    /// DELETE of one object.
    Delete,
    /// DELETE of a collection.
    DeleteCollection,
    /// A request under the legacy `/proxy/` prefix.
    Proxy,
    /// Any other method.
    Other,
}

impl Verb {
    /// The Kubernetes name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Get => "get",
            Self::List => "list",
            Self::Watch => "watch",
            Self::Create => "create",
            Self::Update => "update",
            Self::Patch => "patch",
            Self::Delete => "delete",
            Self::DeleteCollection => "deletecollection",
            Self::Proxy => "proxy",
            Self::Other => "other",
        }
    }
}

impl fmt::Display for Verb {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl EncodeLabelValue for Verb {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> Result<(), fmt::Error> {
        fmt::Write::write_str(encoder, self.as_str())
    }
}

/// What a request does: its verb and resource.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RequestKind {
    /// The verb.
    pub verb: Verb,
    /// The resource's plural, with the subresource if any (`pods`, `pods/status`,
    /// `nodes/proxy`); empty for non-resource paths (`/version`, discovery, `/healthz`).
    pub resource: String,
}

/// Classifies a request the way the API server's `RequestInfoFactory` does, from its method,
/// path and query.
pub fn classify(method: &Method, path: &str, query: Option<&str>) -> RequestKind {
    let parts: Vec<&str> = path.split('/').filter(|part| !part.is_empty()).collect();
    let (group, rest): (&str, &[&str]) = match parts.as_slice() {
        ["api", _version, rest @ ..] => ("", rest),
        ["apis", group, _version, rest @ ..] => (group, rest),
        _ => ("", &[]),
    };
    let (special, rest) = match rest {
        ["watch", tail @ ..] => (Some(Verb::Watch), tail),
        ["proxy", tail @ ..] => (Some(Verb::Proxy), tail),
        _ => (None, rest),
    };
    let method_verb = match *method {
        Method::GET | Method::HEAD => Verb::Get,
        Method::POST => Verb::Create,
        Method::PUT => Verb::Update,
        Method::PATCH => Verb::Patch,
        Method::DELETE => Verb::Delete,
        _ => Verb::Other,
    };
    if rest.is_empty() {
        return RequestKind {
            verb: method_verb,
            resource: String::new(),
        };
    }
    // `/namespaces/{ns}/{resource}/...`, except the namespace's own subresources.
    let rest = match rest {
        ["namespaces", _namespace, tail @ ..]
            if !tail.is_empty() && !matches!(tail[0], "status" | "finalize") =>
        {
            tail
        }
        _ => rest,
    };
    // As in the API server, the legacy proxy verb has no subresource.
    // Named groups qualify the plural as kubectl does (`pods.metrics.k8s.io`, not `pods`).
    let qualified = |resource: &str| {
        if group.is_empty() {
            resource.to_owned()
        } else {
            format!("{resource}.{group}")
        }
    };
    let resource = match rest {
        [resource, _name, subresource, ..] if special != Some(Verb::Proxy) => {
            format!("{}/{subresource}", qualified(resource))
        }
        [resource, ..] => qualified(resource),
        [] => String::new(),
    };
    let named = rest.len() > 1;
    let verb = match (special, method_verb) {
        (Some(verb), _) => verb,
        (None, Verb::Get) if !named => {
            if watch_requested(query) {
                Verb::Watch
            } else {
                Verb::List
            }
        }
        (None, Verb::Delete) if !named => Verb::DeleteCollection,
        (None, verb) => verb,
    };
    RequestKind { verb, resource }
}

/// Whether the query sets `watch`: as the API server decodes a bool parameter, any first value
/// other than `0` or `false` (any case), even an empty one, is true.
fn watch_requested(query: Option<&str>) -> bool {
    let Some(query) = query else {
        return false;
    };
    query
        .split('&')
        .map(|pair| pair.split_once('=').unwrap_or((pair, "")))
        .find(|(key, _)| *key == "watch")
        .is_some_and(|(_, value)| value != "0" && !value.eq_ignore_ascii_case("false"))
}

// ---------------------------------------------------------------------------------------------
// API-call counters

/// The labels of one API-call counter.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, EncodeLabelSet)]
pub struct ApiCallLabels {
    /// `upper` or `lower`.
    pub cluster: &'static str,
    /// The verb.
    pub verb: Verb,
    /// The resource (see [`RequestKind::resource`]).
    pub resource: String,
}

/// API calls per cluster, verb and resource: the Prometheus counter `tensile_api_calls_total`
/// and a snapshot for tests and benchmarks. Clones share the counts.
#[derive(Clone, Debug, Default)]
pub struct ApiCalls {
    inner: Arc<ApiCallsInner>,
}

#[derive(Debug, Default)]
struct ApiCallsInner {
    family: Family<ApiCallLabels, Counter>,
    // The same counters as `family` (a counter's clones share its value), so we can read them.
    counters: RwLock<HashMap<ApiCallLabels, Counter>>,
    /// Answers that were errors of the server (5xx) or throttling (429), by cluster and code.
    errors: Family<ErrorAnswerLabels, Counter>,
    error_counters: RwLock<HashMap<ErrorAnswerLabels, Counter>>,
    /// Requests that got no answer at all (refused, reset, timed out), by cluster.
    unanswered: Unanswered,
}

/// Requests without an answer, by cluster; a change wakes the subscribers, so that the node
/// asks at once whether the cluster still answers instead of at its next lease tick.
#[derive(Debug)]
struct Unanswered(tokio::sync::watch::Sender<HashMap<&'static str, u64>>);

impl Default for Unanswered {
    fn default() -> Self {
        Self(tokio::sync::watch::Sender::new(HashMap::new()))
    }
}

/// The labels of one error-answer counter.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, EncodeLabelSet)]
pub struct ErrorAnswerLabels {
    /// `upper` or `lower`.
    pub cluster: &'static str,
    /// The status code: 429 or 5xx.
    pub code: u16,
}

/// Error answers of one cluster so far: throttled (429) and server errors (5xx).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ErrorAnswers {
    /// 429 Too Many Requests.
    pub throttled: u64,
    /// 500 and above.
    pub server: u64,
}

impl ApiCalls {
    /// Counters registered in `registry` as `tensile_api_calls`.
    pub fn new(registry: &mut Registry) -> Self {
        let calls = Self::default();
        registry.register(
            "tensile_api_calls",
            "Requests sent to Kubernetes API servers, by cluster, verb and resource",
            calls.inner.family.clone(),
        );
        registry.register(
            "tensile_api_error_answers",
            "Answers of Kubernetes API servers that were server errors (5xx) or throttling (429), by cluster and status code",
            calls.inner.errors.clone(),
        );
        calls
    }

    /// Counts one answer of `cluster` with status `code` when it is a 429 or a 5xx.
    pub fn record_answer(&self, cluster: &'static str, code: u16) {
        if code != 429 && code < 500 {
            return;
        }
        let labels = ErrorAnswerLabels { cluster, code };
        let mut counters = self
            .inner
            .error_counters
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        let counter = self.inner.errors.get_or_create_owned(&labels);
        counters.entry(labels).or_insert(counter).inc();
    }

    /// Counts one request of `cluster` that got no answer (the connection refused, reset or
    /// timed out) and wakes the subscribers of [`Self::subscribe_unanswered`].
    pub fn record_unanswered(&self, cluster: &'static str) {
        self.inner.unanswered.0.send_modify(|m| {
            *m.entry(cluster).or_default() += 1;
        });
    }

    /// Requests of `cluster` that got no answer so far.
    pub fn unanswered(&self, cluster: &str) -> u64 {
        self.inner
            .unanswered
            .0
            .borrow()
            .get(cluster)
            .copied()
            .unwrap_or_default()
    }

    /// Changes when a request of any cluster gets no answer.
    pub fn subscribe_unanswered(&self) -> tokio::sync::watch::Receiver<HashMap<&'static str, u64>> {
        self.inner.unanswered.0.subscribe()
    }

    /// The error answers of `cluster` so far.
    pub fn error_answers(&self, cluster: &str) -> ErrorAnswers {
        let counters = self
            .inner
            .error_counters
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        let mut answers = ErrorAnswers::default();
        for (labels, counter) in counters.iter().filter(|(l, _)| l.cluster == cluster) {
            if labels.code == 429 {
                answers.throttled += counter.get();
            } else {
                answers.server += counter.get();
            }
        }
        answers
    }

    /// Requests of `cluster` so far, of every verb and resource.
    pub fn cluster_total(&self, cluster: &str) -> u64 {
        self.sum(|labels| labels.cluster == cluster)
    }

    /// Counts one request.
    pub fn record(&self, cluster: &'static str, kind: RequestKind) {
        let labels = ApiCallLabels {
            cluster,
            verb: kind.verb,
            resource: kind.resource,
        };
        {
            let counters = self
                .inner
                .counters
                .read()
                .unwrap_or_else(PoisonError::into_inner);
            if let Some(counter) = counters.get(&labels) {
                counter.inc();
                return;
            }
        }
        let mut counters = self
            .inner
            .counters
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        let counter = self.inner.family.get_or_create_owned(&labels);
        counters.entry(labels).or_insert(counter).inc();
    }

    /// Requests of `cluster` with `verb` on `resource` so far.
    pub fn count(&self, cluster: &str, verb: Verb, resource: &str) -> u64 {
        self.sum(|labels| {
            labels.cluster == cluster && labels.verb == verb && labels.resource == resource
        })
    }

    /// Requests of `cluster` with `verb`, on any resource, so far.
    pub fn total(&self, cluster: &str, verb: Verb) -> u64 {
        self.sum(|labels| labels.cluster == cluster && labels.verb == verb)
    }

    /// Every counter so far.
    pub fn snapshot(&self) -> BTreeMap<ApiCallLabels, u64> {
        let counters = self
            .inner
            .counters
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        counters
            .iter()
            .map(|(labels, counter)| (labels.clone(), counter.get()))
            .collect()
    }

    fn sum(&self, wanted: impl Fn(&ApiCallLabels) -> bool) -> u64 {
        let counters = self
            .inner
            .counters
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        counters
            .iter()
            .filter(|(labels, _)| wanted(labels))
            .map(|(_, counter)| counter.get())
            .sum()
    }
}

/// A [`Layer`] counting every request in [`ApiCalls`] under one cluster name.
#[derive(Clone, Debug)]
pub struct ApiCallLayer {
    cluster: &'static str,
    calls: ApiCalls,
}

impl ApiCallLayer {
    /// Counts under `cluster` in `calls`.
    pub fn new(cluster: &'static str, calls: ApiCalls) -> Self {
        Self { cluster, calls }
    }
}

impl<S> Layer<S> for ApiCallLayer {
    type Service = CountCalls<S>;

    fn layer(&self, inner: S) -> CountCalls<S> {
        CountCalls {
            inner,
            cluster: self.cluster,
            calls: self.calls.clone(),
        }
    }
}

/// The service made by [`ApiCallLayer`].
#[derive(Clone, Debug)]
pub struct CountCalls<S> {
    inner: S,
    cluster: &'static str,
    calls: ApiCalls,
}

impl<S, B> Service<Request<B>> for CountCalls<S>
where
    S: Service<Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> S::Future {
        let uri = req.uri();
        self.calls.record(
            self.cluster,
            classify(req.method(), uri.path(), uri.query()),
        );
        self.inner.call(req)
    }
}

/// A [`Layer`] counting the answers that are errors of the server (5xx) or throttling (429)
/// in [`ApiCalls`] under one cluster name: requests that reached the API server and failed
/// there, which a check of whether it answers at all does not see. Requests that got no
/// answer at all are counted too ([`ApiCalls::record_unanswered`]).
#[derive(Clone, Debug)]
pub struct ErrorAnswerLayer {
    cluster: &'static str,
    calls: ApiCalls,
}

impl ErrorAnswerLayer {
    /// Counts under `cluster` in `calls`.
    pub fn new(cluster: &'static str, calls: ApiCalls) -> Self {
        Self { cluster, calls }
    }
}

impl<S> Layer<S> for ErrorAnswerLayer {
    type Service = CountErrorAnswers<S>;

    fn layer(&self, inner: S) -> CountErrorAnswers<S> {
        CountErrorAnswers {
            inner,
            cluster: self.cluster,
            calls: self.calls.clone(),
        }
    }
}

/// The service made by [`ErrorAnswerLayer`].
#[derive(Clone, Debug)]
pub struct CountErrorAnswers<S> {
    inner: S,
    cluster: &'static str,
    calls: ApiCalls,
}

impl<S, B, RB> Service<Request<B>> for CountErrorAnswers<S>
where
    S: Service<Request<B>, Response = http::Response<RB>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let (cluster, calls) = (self.cluster, self.calls.clone());
        let answer = self.inner.call(req);
        Box::pin(async move {
            let answer = answer.await;
            match &answer {
                Ok(res) => calls.record_answer(cluster, res.status().as_u16()),
                Err(_) => calls.record_unanswered(cluster),
            }
            answer
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::convert::Infallible;

    #[tokio::test]
    async fn error_answers_are_counted_by_kind() {
        use tower::ServiceExt as _;
        let mut registry = Registry::default();
        let calls = ApiCalls::new(&mut registry);
        let inner = tower::service_fn(|req: Request<()>| async move {
            let code: u16 = req.uri().path().trim_start_matches('/').parse().unwrap();
            let mut res = http::Response::new(());
            *res.status_mut() = http::StatusCode::from_u16(code).unwrap();
            Ok::<_, Infallible>(res)
        });
        let mut service = ErrorAnswerLayer::new("lower", calls.clone()).layer(inner);
        for code in [200, 201, 404, 409, 429, 429, 500, 503] {
            let req = Request::get(format!("/{code}")).body(()).unwrap();
            service.ready().await.unwrap().call(req).await.unwrap();
        }
        assert_eq!(
            calls.error_answers("lower"),
            ErrorAnswers {
                throttled: 2,
                server: 2
            }
        );
        assert_eq!(calls.error_answers("upper"), ErrorAnswers::default());
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains(r#"tensile_api_error_answers_total{cluster="lower",code="429"} 2"#),
            "{text}"
        );
    }

    #[tokio::test]
    async fn requests_without_an_answer_are_counted_and_wake_the_subscribers() {
        use tower::ServiceExt as _;
        let calls = ApiCalls::default();
        let mut woken = calls.subscribe_unanswered();
        let inner = tower::service_fn(|req: Request<()>| async move {
            if req.uri().path() == "/refused" {
                return Err(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
            }
            Ok(http::Response::new(()))
        });
        let mut service = ErrorAnswerLayer::new("lower", calls.clone()).layer(inner);
        for path in ["/ok", "/refused", "/ok", "/refused"] {
            let req = Request::get(path).body(()).unwrap();
            let _ = service.ready().await.unwrap().call(req).await;
        }
        assert_eq!(calls.unanswered("lower"), 2);
        assert_eq!(calls.unanswered("upper"), 0);
        assert!(woken.has_changed().unwrap());
        woken.mark_unchanged();
        let req = Request::get("/ok").body(()).unwrap();
        service.ready().await.unwrap().call(req).await.unwrap();
        assert!(!woken.has_changed().unwrap(), "an answer wakes no one");
    }

    fn kind(method: &str, path_and_query: &str) -> (Verb, String) {
        let method = Method::from_bytes(method.as_bytes()).unwrap();
        let (path, query) = match path_and_query.split_once('?') {
            Some((path, query)) => (path, Some(query)),
            None => (path_and_query, None),
        };
        let kind = classify(&method, path, query);
        (kind.verb, kind.resource)
    }

    #[test]
    fn classifies_requests_like_the_api_server() {
        use Verb::*;
        let table: &[(&str, &str, Verb, &str)] = &[
            // core, namespaced
            ("GET", "/api/v1/namespaces/default/pods/p", Get, "pods"),
            ("GET", "/api/v1/namespaces/default/pods", List, "pods"),
            (
                "GET",
                "/api/v1/namespaces/default/pods?watch=true",
                Watch,
                "pods",
            ),
            (
                "GET",
                "/api/v1/namespaces/default/pods?watch=1",
                Watch,
                "pods",
            ),
            (
                "GET",
                "/api/v1/namespaces/default/pods?watch=True&resourceVersion=5",
                Watch,
                "pods",
            ),
            (
                "GET",
                "/api/v1/namespaces/default/pods?labelSelector=a%3Db&watch",
                Watch,
                "pods",
            ),
            (
                "GET",
                "/api/v1/namespaces/default/pods?watch=false",
                List,
                "pods",
            ),
            (
                "GET",
                "/api/v1/namespaces/default/pods?watch=0",
                List,
                "pods",
            ),
            (
                "GET",
                "/api/v1/namespaces/default/pods?watchy=1",
                List,
                "pods",
            ),
            (
                "GET",
                "/api/v1/namespaces/default/pods?limit=500&continue=abc",
                List,
                "pods",
            ),
            ("HEAD", "/api/v1/namespaces/default/pods/p", Get, "pods"),
            ("POST", "/api/v1/namespaces/default/pods", Create, "pods"),
            ("PUT", "/api/v1/namespaces/default/pods/p", Update, "pods"),
            ("PATCH", "/api/v1/namespaces/default/pods/p", Patch, "pods"),
            (
                "DELETE",
                "/api/v1/namespaces/default/pods/p",
                Delete,
                "pods",
            ),
            (
                "DELETE",
                "/api/v1/namespaces/default/pods",
                DeleteCollection,
                "pods",
            ),
            // subresources
            (
                "PATCH",
                "/api/v1/namespaces/default/pods/p/status",
                Patch,
                "pods/status",
            ),
            (
                "PUT",
                "/api/v1/namespaces/default/pods/p/status",
                Update,
                "pods/status",
            ),
            (
                "GET",
                "/api/v1/namespaces/default/pods/p/log?follow=true",
                Get,
                "pods/log",
            ),
            (
                "GET",
                "/api/v1/namespaces/default/pods/p/exec?command=ls",
                Get,
                "pods/exec",
            ),
            (
                "POST",
                "/api/v1/namespaces/default/pods/p/exec?command=ls",
                Create,
                "pods/exec",
            ),
            (
                "POST",
                "/api/v1/namespaces/default/pods/p/eviction",
                Create,
                "pods/eviction",
            ),
            (
                "GET",
                "/api/v1/namespaces/d/pods/p/proxy/some/path",
                Get,
                "pods/proxy",
            ),
            (
                "POST",
                "/api/v1/namespaces/d/serviceaccounts/s/token",
                Create,
                "serviceaccounts/token",
            ),
            // core, cluster-scoped
            ("GET", "/api/v1/nodes", List, "nodes"),
            (
                "GET",
                "/api/v1/nodes?watch=true&fieldSelector=metadata.name%3Dn",
                Watch,
                "nodes",
            ),
            ("GET", "/api/v1/nodes/n", Get, "nodes"),
            ("PATCH", "/api/v1/nodes/n/status", Patch, "nodes/status"),
            (
                "GET",
                "/api/v1/nodes/n/proxy/stats/summary",
                Get,
                "nodes/proxy",
            ),
            ("GET", "/api/v1/nodes/n/proxy", Get, "nodes/proxy"),
            (
                "GET",
                "/api/v1/persistentvolumes/pv",
                Get,
                "persistentvolumes",
            ),
            // namespaces themselves
            ("GET", "/api/v1/namespaces", List, "namespaces"),
            ("GET", "/api/v1/namespaces?watch=1", Watch, "namespaces"),
            ("GET", "/api/v1/namespaces/default", Get, "namespaces"),
            ("POST", "/api/v1/namespaces", Create, "namespaces"),
            ("DELETE", "/api/v1/namespaces/ns", Delete, "namespaces"),
            (
                "PUT",
                "/api/v1/namespaces/ns/status",
                Update,
                "namespaces/status",
            ),
            (
                "PUT",
                "/api/v1/namespaces/ns/finalize",
                Update,
                "namespaces/finalize",
            ),
            // named groups
            (
                "GET",
                "/apis/apps/v1/namespaces/d/deployments",
                List,
                "deployments.apps",
            ),
            (
                "GET",
                "/apis/apps/v1/deployments?watch=true",
                Watch,
                "deployments.apps",
            ),
            (
                "PATCH",
                "/apis/apps/v1/namespaces/d/deployments/x/scale",
                Patch,
                "deployments.apps/scale",
            ),
            (
                "PUT",
                "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/n",
                Update,
                "leases.coordination.k8s.io",
            ),
            (
                "POST",
                "/apis/events.k8s.io/v1/namespaces/d/events",
                Create,
                "events.events.k8s.io",
            ),
            (
                "GET",
                "/apis/storage.k8s.io/v1/storageclasses/standard",
                Get,
                "storageclasses.storage.k8s.io",
            ),
            (
                "POST",
                "/apis/authentication.k8s.io/v1/tokenreviews",
                Create,
                "tokenreviews.authentication.k8s.io",
            ),
            (
                "GET",
                "/apis/metrics.k8s.io/v1beta1/namespaces/d/pods",
                List,
                "pods.metrics.k8s.io",
            ),
            (
                "DELETE",
                "/apis/apps/v1/namespaces/d/replicasets",
                DeleteCollection,
                "replicasets.apps",
            ),
            // legacy prefixes
            ("GET", "/api/v1/watch/namespaces/d/pods", Watch, "pods"),
            ("GET", "/api/v1/watch/namespaces/d/pods/p", Watch, "pods"),
            (
                "GET",
                "/apis/apps/v1/watch/deployments",
                Watch,
                "deployments.apps",
            ),
            ("GET", "/api/v1/proxy/nodes/n/stats", Proxy, "nodes"),
            // a named GET stays a get even with watch set (the API server only turns lists into
            // watches)
            ("GET", "/api/v1/namespaces/d/pods/p?watch=true", Get, "pods"),
            // non-resource paths
            ("GET", "/version", Get, ""),
            ("GET", "/api", Get, ""),
            ("GET", "/api/v1", Get, ""),
            ("GET", "/apis", Get, ""),
            ("GET", "/apis/apps", Get, ""),
            ("GET", "/apis/apps/v1", Get, ""),
            ("GET", "/openapi/v2", Get, ""),
            ("GET", "/healthz", Get, ""),
            ("GET", "/", Get, ""),
            ("OPTIONS", "/api/v1/pods", Other, "pods"),
            // slashes are not significant
            ("GET", "//api/v1//namespaces/d/pods/", List, "pods"),
        ];
        for (method, path, verb, resource) in table {
            assert_eq!(
                kind(method, path),
                (*verb, (*resource).to_owned()),
                "{method} {path}"
            );
        }
    }

    #[test]
    fn verbs_have_kubernetes_names() {
        let names: Vec<&str> = [
            Verb::Get,
            Verb::List,
            Verb::Watch,
            Verb::Create,
            Verb::Update,
            Verb::Patch,
            Verb::Delete,
            Verb::DeleteCollection,
        ]
        .iter()
        .map(|verb| verb.as_str())
        .collect();
        assert_eq!(
            names,
            [
                "get",
                "list",
                "watch",
                "create",
                "update",
                "patch",
                "delete",
                "deletecollection"
            ]
        );
        assert_eq!(Verb::DeleteCollection.to_string(), "deletecollection");
    }

    #[test]
    fn zero_means_no_client_side_limit_not_five_qps() {
        assert_eq!(effective_limits(0.0, 0), (f64::INFINITY, 1));
        assert_eq!(effective_limits(-1.0, 0), (f64::INFINITY, 1));
        assert_eq!(effective_limits(f32::NAN, 0), (f64::INFINITY, 1));
        assert_eq!(effective_limits(500.0, 1000), (500.0, 1000));
        assert_eq!(effective_limits(0.0, 100), (f64::INFINITY, 100));
        assert_eq!(effective_limits(20.0, 0), (20.0, 40));
        assert_eq!(effective_limits(0.2, 0), (f64::from(0.2_f32), 1));
        let layer = RateLimitLayer::new(DEFAULT_QPS, DEFAULT_BURST);
        assert_eq!((layer.qps(), layer.burst()), (500.0, 1000));
        // An unlimited bucket never makes a request wait.
        let t0 = Instant::now();
        let mut bucket = TokenBucket::new(effective_limits(0.0, 0).0, 1, t0);
        assert!((0..10_000).all(|_| bucket.try_acquire(t0).is_ok()));
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn bucket_starts_full_and_refills_at_qps() {
        let t0 = Instant::now();
        let mut bucket = TokenBucket::new(10.0, 3, t0);
        for _ in 0..3 {
            assert_eq!(bucket.try_acquire(t0), Ok(()));
        }
        // Empty: the next token comes one interval (100 ms) later.
        assert_eq!(bucket.try_acquire(t0), Err(t0 + ms(100)));
        assert_eq!(bucket.try_acquire(t0 + ms(99)), Err(t0 + ms(100)));
        assert_eq!(bucket.try_acquire(t0 + ms(100)), Ok(()));
        assert_eq!(bucket.try_acquire(t0 + ms(100)), Err(t0 + ms(200)));
        assert_eq!(bucket.try_acquire(t0 + ms(250)), Ok(()));
        // 50 ms of that wait was already refilled: the next is due at 300 ms.
        assert_eq!(bucket.try_acquire(t0 + ms(250)), Err(t0 + ms(300)));
    }

    #[test]
    fn bucket_never_holds_more_than_burst() {
        let t0 = Instant::now();
        let mut bucket = TokenBucket::new(10.0, 3, t0);
        let later = t0 + Duration::from_secs(3600);
        for _ in 0..3 {
            assert_eq!(bucket.try_acquire(later), Ok(()));
        }
        assert_eq!(bucket.try_acquire(later), Err(later + ms(100)));
    }

    #[test]
    fn bucket_paces_a_steady_stream() {
        // 30 requests, burst 5, 20 QPS: the last one may go at 25 * 50 ms = 1.25 s.
        let t0 = Instant::now();
        let mut bucket = TokenBucket::new(20.0, 5, t0);
        let mut now = t0;
        for _ in 0..30 {
            if let Err(at) = bucket.try_acquire(now) {
                now = at;
                assert_eq!(bucket.try_acquire(now), Ok(()));
            }
        }
        assert_eq!(now - t0, ms(1250));
    }

    #[test]
    fn bucket_edge_rates() {
        let t0 = Instant::now();
        let mut unlimited = TokenBucket::new(f64::INFINITY, 1, t0);
        for _ in 0..10_000 {
            assert_eq!(unlimited.try_acquire(t0), Ok(()));
        }
        let mut slow = TokenBucket::new(1e-30, 0, t0);
        assert_eq!(slow.try_acquire(t0), Ok(()));
        assert_eq!(slow.try_acquire(t0), Err(t0 + MAX_INTERVAL));
    }

    fn echo() -> impl Service<u32, Response = u32, Error = Infallible, Future: Send> + Clone {
        tower::service_fn(|n: u32| async move { Ok::<_, Infallible>(n) })
    }

    #[tokio::test]
    async fn rate_limit_service_waits_for_tokens() {
        use tower::ServiceExt as _;
        // 50 QPS, burst 2: five calls need at least 3 * 20 ms after the first two.
        let mut service = RateLimitLayer::new(50.0, 2).layer(echo());
        let start = std::time::Instant::now();
        for n in 0..5 {
            assert_eq!(service.ready().await.unwrap().call(n).await.unwrap(), n);
        }
        assert!(start.elapsed() >= ms(60), "took {:?}", start.elapsed());
    }

    #[tokio::test]
    async fn rate_limit_clones_share_the_bucket() {
        use tower::ServiceExt as _;
        let mut first = RateLimitLayer::new(10.0, 1).layer(echo());
        let mut second = first.clone();
        let start = std::time::Instant::now();
        first.ready().await.unwrap().call(1).await.unwrap();
        second.ready().await.unwrap().call(2).await.unwrap();
        assert!(start.elapsed() >= ms(100), "took {:?}", start.elapsed());
    }

    #[tokio::test]
    async fn count_calls_classifies_each_request() {
        use tower::ServiceExt as _;
        let calls = ApiCalls::default();
        let inner = tower::service_fn(|_req: Request<()>| async { Ok::<_, Infallible>(()) });
        let mut service = ApiCallLayer::new("lower", calls.clone()).layer(inner);
        for uri in [
            "/api/v1/pods?watch=true",
            "/api/v1/pods",
            "/api/v1/namespaces/a/pods",
            "/api/v1/namespaces/a/pods/p",
        ] {
            let req = Request::get(uri).body(()).unwrap();
            service.ready().await.unwrap().call(req).await.unwrap();
        }
        let req = Request::patch("/api/v1/namespaces/a/pods/p/status")
            .body(())
            .unwrap();
        service.ready().await.unwrap().call(req).await.unwrap();

        assert_eq!(calls.count("lower", Verb::List, "pods"), 2);
        assert_eq!(calls.count("lower", Verb::Watch, "pods"), 1);
        assert_eq!(calls.count("lower", Verb::Get, "pods"), 1);
        assert_eq!(calls.count("lower", Verb::Patch, "pods/status"), 1);
        assert_eq!(calls.count("upper", Verb::List, "pods"), 0);
        assert_eq!(calls.total("lower", Verb::List), 2);
        assert_eq!(calls.snapshot().values().sum::<u64>(), 5);
    }

    #[test]
    fn counters_are_exported_to_prometheus() {
        let mut registry = Registry::default();
        let calls = ApiCalls::new(&mut registry);
        calls.record(
            "upper",
            RequestKind {
                verb: Verb::Patch,
                resource: "nodes/status".to_owned(),
            },
        );
        calls.record(
            "upper",
            RequestKind {
                verb: Verb::Patch,
                resource: "nodes/status".to_owned(),
            },
        );
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains(
                r#"tensile_api_calls_total{cluster="upper",verb="patch",resource="nodes/status"} 2"#
            ),
            "{text}"
        );
        assert_eq!(calls.total("upper", Verb::Patch), 2);
    }

    #[test]
    fn server_override() {
        let mut config = Config::new("https://10.0.0.1:6443".parse().unwrap());
        override_server(&mut config, "https://example.test:8443").unwrap();
        assert_eq!(config.cluster_url.to_string(), "https://example.test:8443/");
        override_server(&mut config, "10.1.2.3:6443").unwrap();
        assert_eq!(config.cluster_url.to_string(), "https://10.1.2.3:6443/");
        override_server(&mut config, "http://localhost:8080").unwrap();
        assert_eq!(config.cluster_url.to_string(), "http://localhost:8080/");
        for bad in ["", "  ", "ftp://x", "https://", "https://bad host"] {
            let err = override_server(&mut config, bad).unwrap_err();
            assert!(
                matches!(err, ClientError::InvalidServerUrl { .. }),
                "{bad}: {err}"
            );
        }
        assert_eq!(config.cluster_url.to_string(), "http://localhost:8080/");
    }

    #[test]
    fn kubeconfig_text_is_never_printed() {
        let source = KubeconfigSource::Text("token: secret".to_owned());
        assert!(!format!("{source:?}").contains("secret"));
        assert_eq!(source.to_string(), "inline kubeconfig");
    }
}
