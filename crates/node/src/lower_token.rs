//! The virtual node's own lower credential, renewed before it expires.
//!
//! `tensile join` stores a TokenRequest token of the lower ServiceAccount, with an expiry. The
//! node takes that token out of its lower configuration into a [`LowerToken`], which
//! [`BearerLayer`] puts on every request of every lower client (they are clones of one
//! client, so the watches, the pod controller, the kubelet API's streams and the capacity
//! tracker all read the same credential). [`run`] asks the lower cluster for a new token of
//! the same account at four fifths of the old one's life (`tensile_core::lower_token`),
//! swaps it in (the next request of every client carries it; a watch already streaming goes
//! on until it reconnects, as authentication is checked when a request starts), and writes
//! the kubeconfig with the new token back into its Secret upstairs, so a restarted node starts
//! with a valid one. A renewal that fails is logged and a Warning event on the Node, retried
//! with back-off; the old token keeps working until it expires.
//!
//! Not kube's own refreshable credential (`tokenFile`, re-read by each client at most once a
//! minute): that needs a writable file in a pod whose root is read-only and leaves each
//! client on its own copy for up to a minute; one value in memory switches every client at
//! once.

use std::fmt;
use std::sync::{Arc, PoisonError, RwLock};
use std::task::{Context, Poll};
use std::time::Duration;

use base64::Engine as _;
use http::header::AUTHORIZATION;
use http::{HeaderValue, Request};
use k8s_openapi::ByteString;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Node, ObjectReference, Secret, ServiceAccount};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use secrecy::ExposeSecret as _;
use tensile_core::join::{ANNOTATION_TOKEN_EXPIRES, ANNOTATION_TOKEN_ISSUED};
use tensile_core::lower_token::{
    TokenClaims, claims_of_payload, renewal_time, requested_seconds, retry_delay, with_token,
};
use tokio_util::sync::CancellationToken;
use tower::{Layer, Service};

use tensile_runtime::events::{EventSink, PodEvent};

/// Reason of the Warning event on the Node when a renewal fails.
pub const REASON_RENEWAL_FAILED: &str = "LowerTokenRenewalFailed";
/// Reason of the Normal event on the Node when the token was renewed.
pub const REASON_RENEWED: &str = "LowerTokenRenewed";
/// The key of the kubeconfig in its Secret (what the Deployment mounts).
pub const SECRET_KEY: &str = "kubeconfig";

/// The claims of a JWT, read without verifying it (they only schedule the renewal).
pub fn claims_of(token: &str) -> Option<TokenClaims> {
    let payload = token.split('.').nth(1)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    claims_of_payload(&bytes)
}

struct Current {
    header: HeaderValue,
    claims: TokenClaims,
    /// Whether the Secret upstairs holds this token (false after a renewal whose write failed).
    stored: bool,
    renewals: u64,
}

/// The lower token every lower client sends; cheap to clone, never printed.
#[derive(Clone)]
pub struct LowerToken(Arc<RwLock<Current>>);

impl fmt::Debug for LowerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let claims = self.claims();
        f.debug_struct("LowerToken")
            .field(
                "account",
                &format!("{}/{}", claims.namespace, claims.account),
            )
            .field("expires", &claims.expires)
            .finish_non_exhaustive()
    }
}

fn bearer(token: &str) -> Option<HeaderValue> {
    let mut value = HeaderValue::from_str(&format!("Bearer {token}")).ok()?;
    value.set_sensitive(true);
    Some(value)
}

impl LowerToken {
    /// The renewable token of a loaded lower configuration, taken out of it (the layer sends it
    /// instead). `None`, and `config` unchanged, unless its credential is an inline
    /// ServiceAccount token with an expiry: a client certificate, a legacy token, a token file
    /// or an exec plugin is kube's to use as it is.
    pub fn take_from(config: &mut kube::Config) -> Option<Self> {
        let token = config.auth_info.token.as_ref()?.expose_secret().to_owned();
        let claims = claims_of(&token)?;
        let header = bearer(&token)?;
        config.auth_info.token = None;
        Some(Self(Arc::new(RwLock::new(Current {
            header,
            claims,
            stored: true,
            renewals: 0,
        }))))
    }

    fn read<T>(&self, f: impl FnOnce(&Current) -> T) -> T {
        f(&self.0.read().unwrap_or_else(PoisonError::into_inner))
    }

    fn write<T>(&self, f: impl FnOnce(&mut Current) -> T) -> T {
        f(&mut self.0.write().unwrap_or_else(PoisonError::into_inner))
    }

    /// The current token's claims.
    pub fn claims(&self) -> TokenClaims {
        self.read(|c| c.claims.clone())
    }

    /// How many times the token was renewed by this process.
    pub fn renewals(&self) -> u64 {
        self.read(|c| c.renewals)
    }

    /// The layer that puts this token on every request of a client.
    pub fn layer(&self) -> BearerLayer {
        BearerLayer(self.clone())
    }

    /// Takes `token` when it is a later token of the same account (one its kubeconfig file got
    /// since it was read). Returns whether it did.
    pub fn offer(&self, token: &str) -> bool {
        let (Some(claims), Some(header)) = (claims_of(token), bearer(token)) else {
            return false;
        };
        self.write(|c| {
            let later = claims.namespace == c.claims.namespace
                && claims.account == c.claims.account
                && claims.expires > c.claims.expires;
            if later {
                c.header = header;
                c.claims = claims;
            }
            later
        })
    }
}

/// The token of the current context's user of the kubeconfig at `path`, if it has one inline.
fn token_in_file(path: &std::path::Path) -> Option<String> {
    let kubeconfig = kube::config::Kubeconfig::read_from(path).ok()?;
    let context = kubeconfig.current_context.as_deref()?;
    let user = kubeconfig
        .contexts
        .iter()
        .find(|c| c.name == context)?
        .context
        .as_ref()?
        .user
        .clone()?;
    let auth = kubeconfig
        .auth_infos
        .iter()
        .find(|a| a.name == user)?
        .auth_info
        .as_ref()?;
    Some(auth.token.as_ref()?.expose_secret().to_owned())
}

/// For a component that reads the lower kubeconfig but does not renew it (the scheduler
/// extender, which mounts the Secret the virtual node writes back): re-reads the file every
/// `every`, as kube re-reads a token file, and a later token of the same account found there
/// replaces the current one, until `stop`. The kubelet rewrites a mounted Secret's files
/// within about a minute of the Secret's change.
pub async fn follow_file(
    token: LowerToken,
    path: std::path::PathBuf,
    every: Duration,
    stop: CancellationToken,
) {
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(every) => {}
        }
        if let Some(t) = token_in_file(&path)
            && token.offer(&t)
        {
            tracing::info!(file = %path.display(), "a renewed lower token was read from the kubeconfig");
        }
    }
}

/// Sets `Authorization: Bearer <the current lower token>` on every request.
#[derive(Clone, Debug)]
pub struct BearerLayer(LowerToken);

impl<S> Layer<S> for BearerLayer {
    type Service = Bearer<S>;

    fn layer(&self, inner: S) -> Bearer<S> {
        Bearer {
            inner,
            token: self.0.clone(),
        }
    }
}

/// The service made by [`BearerLayer`].
#[derive(Clone, Debug)]
pub struct Bearer<S> {
    inner: S,
    token: LowerToken,
}

impl<S, B> Service<Request<B>> for Bearer<S>
where
    S: Service<Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> S::Future {
        let header = self.token.read(|c| c.header.clone());
        req.headers_mut().insert(AUTHORIZATION, header);
        self.inner.call(req)
    }
}

/// The upper Secret the lower kubeconfig is kept in, and the client allowed to rewrite it (the
/// pod's ServiceAccount: a node identity may not write Secrets).
#[derive(Clone)]
#[allow(missing_debug_implementations)] // a kube client: nothing to show
pub struct StoredKubeconfig {
    /// A client of the upper cluster with get and update on that Secret.
    pub client: kube::Client,
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
}

/// A renewal that failed, with what failed where.
#[derive(Debug, thiserror::Error)]
pub enum RenewError {
    /// The lower cluster refused or did not answer the TokenRequest.
    #[error(
        "requesting a new token of serviceaccount {account} in lower cluster {cluster}: {source}"
    )]
    Request {
        /// `namespace/name` of the account.
        account: String,
        /// The lower cluster.
        cluster: String,
        /// Its answer.
        #[source]
        source: kube::Error,
    },
    /// The answer held no usable token.
    #[error(
        "the TokenRequest of serviceaccount {account} in lower cluster {cluster} came back without a usable token"
    )]
    NoToken {
        /// `namespace/name` of the account.
        account: String,
        /// The lower cluster.
        cluster: String,
    },
    /// The Secret upstairs could not be read or written.
    #[error("{action} secret {secret} in the upper cluster: {source}")]
    Secret {
        /// Reading or writing.
        action: &'static str,
        /// `namespace/name`.
        secret: String,
        /// The upper API server's answer.
        #[source]
        source: kube::Error,
    },
    /// The Secret upstairs holds no kubeconfig the token can be put in.
    #[error("secret {secret} in the upper cluster: {reason}")]
    Kubeconfig {
        /// `namespace/name`.
        secret: String,
        /// What is wrong with it.
        reason: String,
    },
}

/// What [`run`] needs.
#[allow(missing_debug_implementations)] // kube clients
pub struct Renewal {
    /// The shared token.
    pub token: LowerToken,
    /// A lower client (it authenticates with [`Renewal::token`] itself).
    pub lower: kube::Client,
    /// The lower cluster's name, for messages.
    pub lower_name: String,
    /// The virtual node (events are about it).
    pub node: String,
    /// An upper client that may create events (the node's).
    pub upper_events: kube::Client,
    /// Where the kubeconfig is kept upstairs; `None`: renewed in memory only.
    pub secret: Option<StoredKubeconfig>,
    /// Renew this long after the token was issued, when sooner than four fifths of its life.
    pub renew_after: Option<Duration>,
    /// What [`run`] reports.
    pub metrics: TokenMetrics,
}

/// The renewal's Prometheus gauges: `tensile_lower_token_renewal_failures` (renewals that
/// failed in a row: 0 after a success; an alert on it staying above 0 says the node will lose
/// the lower cluster when the token expires) and `tensile_lower_token_expiry_timestamp_seconds`
/// (when the current token expires, Unix time). Clones share the values.
#[derive(Clone, Debug, Default)]
pub struct TokenMetrics {
    failures: prometheus_client::metrics::gauge::Gauge,
    expiry: prometheus_client::metrics::gauge::Gauge,
}

impl TokenMetrics {
    /// The gauges, registered in `registry`.
    pub fn new(registry: &mut prometheus_client::registry::Registry) -> Self {
        let m = Self::default();
        registry.register(
            "tensile_lower_token_renewal_failures",
            "Renewals of the lower token that failed in a row (0 after a success)",
            m.failures.clone(),
        );
        registry.register(
            "tensile_lower_token_expiry_timestamp_seconds",
            "When the current lower token expires, in seconds since the Unix epoch",
            m.expiry.clone(),
        );
        m
    }

    /// Failures in a row so far.
    pub fn failures(&self) -> i64 {
        self.failures.get()
    }

    fn set(&self, failures: u32, token: &LowerToken) {
        self.failures.set(i64::from(failures));
        self.expiry.set(token.claims().expires);
    }
}

async fn request(r: &Renewal, claims: &TokenClaims) -> Result<(String, TokenClaims), RenewError> {
    let account = format!("{}/{}", claims.namespace, claims.account);
    let asked = TokenRequest {
        spec: TokenRequestSpec {
            expiration_seconds: Some(requested_seconds(claims)),
            ..TokenRequestSpec::default()
        },
        ..TokenRequest::default()
    };
    let answer = Api::<ServiceAccount>::namespaced(r.lower.clone(), &claims.namespace)
        .create_token_request(&claims.account, &PostParams::default(), &asked)
        .await
        .map_err(|source| RenewError::Request {
            account: account.clone(),
            cluster: r.lower_name.clone(),
            source,
        })?;
    let no_token = || RenewError::NoToken {
        account: account.clone(),
        cluster: r.lower_name.clone(),
    };
    let status = answer.status.ok_or_else(no_token)?;
    // The server may shorten the life asked for: the token's own claims count.
    let new = claims_of(&status.token).ok_or_else(no_token)?;
    if bearer(&status.token).is_none() {
        return Err(no_token());
    }
    Ok((status.token, new))
}

/// Writes `token` into the kubeconfig of the Secret upstairs (read, then replaced under its
/// resourceVersion: a join that rewrote it meanwhile makes this try fail and the next one
/// start from what join wrote).
async fn store(s: &StoredKubeconfig, token: &str, claims: &TokenClaims) -> Result<(), RenewError> {
    let secret = format!("{}/{}", s.namespace, s.name);
    let api = Api::<Secret>::namespaced(s.client.clone(), &s.namespace);
    let mut current = api
        .get(&s.name)
        .await
        .map_err(|source| RenewError::Secret {
            action: "reading",
            secret: secret.clone(),
            source,
        })?;
    let bad = |reason: String| RenewError::Kubeconfig {
        secret: secret.clone(),
        reason,
    };
    let text = current
        .data
        .as_ref()
        .and_then(|d| d.get(SECRET_KEY))
        .map(|b| String::from_utf8_lossy(&b.0).into_owned())
        .ok_or_else(|| bad(format!("it has no key {SECRET_KEY}")))?;
    let parsed = kube::config::Kubeconfig::from_yaml(&text)
        .map_err(|e| bad(format!("its kubeconfig does not parse: {e}")))?;
    let value = serde_json::to_value(&parsed).map_err(|e| bad(e.to_string()))?;
    let renewed = with_token(&value, token).map_err(|e| bad(e.to_string()))?;
    // JSON is YAML: kubectl and every client read it.
    let out = serde_json::to_string_pretty(&renewed).map_err(|e| bad(e.to_string()))?;
    current
        .data
        .get_or_insert_with(Default::default)
        .insert(SECRET_KEY.to_owned(), ByteString(out.into_bytes()));
    let annotations = current
        .metadata
        .annotations
        .get_or_insert_with(Default::default);
    for (key, at) in [
        (ANNOTATION_TOKEN_ISSUED, claims.issued),
        (ANNOTATION_TOKEN_EXPIRES, claims.expires),
    ] {
        if let Ok(t) = Timestamp::from_second(at) {
            annotations.insert(key.to_owned(), t.to_string());
        }
    }
    current.metadata.managed_fields = None;
    api.replace(&s.name, &PostParams::default(), &current)
        .await
        .map_err(|source| RenewError::Secret {
            action: "writing the renewed kubeconfig to",
            secret,
            source,
        })?;
    Ok(())
}

/// One step: renew when due, then store what is not stored yet.
async fn step(r: &Renewal) -> Result<(), RenewError> {
    let claims = r.token.claims();
    if Timestamp::now().as_second() >= renewal_time(&claims, r.renew_after) {
        let (token, new) = request(r, &claims).await?;
        let header = bearer(&token).ok_or_else(|| RenewError::NoToken {
            account: format!("{}/{}", claims.namespace, claims.account),
            cluster: r.lower_name.clone(),
        })?;
        r.token.write(|c| {
            c.header = header;
            c.claims = new.clone();
            c.stored = false;
            c.renewals += 1;
        });
        let expires = Timestamp::from_second(new.expires).map(|t| t.to_string());
        tracing::info!(node = %r.node, cluster = %r.lower_name, expires = ?expires.as_deref().unwrap_or_default(), "lower token renewed");
        stored_token(r, token).await
    } else if !r.token.read(|c| c.stored) {
        // A renewal whose write failed: the token in memory is what must be stored. It is not
        // kept in clear anywhere but the header; take it back from there.
        let token = r.token.read(|c| {
            c.header
                .to_str()
                .ok()
                .and_then(|h| h.strip_prefix("Bearer "))
                .map(str::to_owned)
        });
        match token {
            Some(t) => stored_token(r, t).await,
            None => Ok(()),
        }
    } else {
        Ok(())
    }
}

async fn stored_token(r: &Renewal, token: String) -> Result<(), RenewError> {
    let Some(s) = &r.secret else {
        r.token.write(|c| c.stored = true);
        return Ok(());
    };
    let claims = r.token.claims();
    store(s, &token, &claims).await?;
    // Only if no newer token came meanwhile (one task renews: none can).
    r.token.write(|c| c.stored = true);
    tracing::info!(node = %r.node, secret = %format!("{}/{}", s.namespace, s.name), "renewed lower kubeconfig stored upstairs");
    Ok(())
}

async fn node_event(r: &Renewal, events: &EventSink, warning: bool, reason: &str, note: String) {
    // `kubectl describe node` matches events by the Node's uid.
    let uid = Api::<Node>::all(r.upper_events.clone())
        .get_opt(&r.node)
        .await
        .ok()
        .flatten()
        .and_then(|n| n.metadata.uid);
    events.publish(PodEvent {
        regarding: ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(r.node.clone()),
            uid,
            ..ObjectReference::default()
        },
        warning,
        reason: reason.to_owned(),
        note,
    });
}

/// Renews the lower token until `stop`: at four fifths of its life (or `renew_after`), and a
/// failed renewal or write again after a back-off (5 s doubling to 5 min), each failure
/// logged and a Warning event on the Node.
pub async fn run(r: Renewal, stop: CancellationToken) {
    let events = EventSink::start(r.upper_events.clone(), "tensile-kube", &r.node);
    let mut failures = 0u32;
    if r.secret.is_none() {
        tracing::warn!(node = %r.node, "the lower token is renewed in memory only (no --lower-kubeconfig-secret): a restarted node reads the old one");
    }
    r.metrics.set(failures, &r.token);
    loop {
        let wait = if failures > 0 {
            retry_delay(failures)
        } else if !r.token.read(|c| c.stored) {
            Duration::ZERO
        } else {
            let due = renewal_time(&r.token.claims(), r.renew_after);
            Duration::from_secs(
                u64::try_from(due.saturating_sub(Timestamp::now().as_second())).unwrap_or(0),
            )
        };
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(wait) => {}
        }
        let before = r.token.renewals();
        match step(&r).await {
            Ok(()) => {
                failures = 0;
                r.metrics.set(failures, &r.token);
                if r.token.renewals() != before {
                    let expires = Timestamp::from_second(r.token.claims().expires)
                        .map(|t| t.to_string())
                        .unwrap_or_default();
                    node_event(
                        &r,
                        &events,
                        false,
                        REASON_RENEWED,
                        format!(
                            "The token of lower cluster {} was renewed; it expires {expires}",
                            r.lower_name
                        ),
                    )
                    .await;
                }
            }
            Err(e) => {
                failures = failures.saturating_add(1);
                r.metrics.set(failures, &r.token);
                let expires = Timestamp::from_second(r.token.claims().expires)
                    .map(|t| t.to_string())
                    .unwrap_or_default();
                let retry = retry_delay(failures);
                tracing::warn!(node = %r.node, cluster = %r.lower_name, error = %e, retry_in = ?retry, %expires, "renewing the lower token failed");
                node_event(
                    &r,
                    &events,
                    true,
                    REASON_RENEWAL_FAILED,
                    format!(
                        "{e}; retried in {} s, the current token expires {expires}",
                        retry.as_secs()
                    ),
                )
                .await;
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // test code
mod tests {
    use super::*;

    fn jwt(payload: &serde_json::Value) -> String {
        let b = |v: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v);
        format!(
            "{}.{}.{}",
            b(br#"{"alg":"RS256"}"#),
            b(payload.to_string().as_bytes()),
            b(b"sig")
        )
    }

    #[test]
    fn an_inline_service_account_token_is_taken_out_of_the_configuration() {
        let token = jwt(
            &serde_json::json!({"sub": "system:serviceaccount:kube-system:tensile", "iat": 10, "exp": 610}),
        );
        let mut config = kube::Config::new("https://127.0.0.1:6443".parse().unwrap());
        config.auth_info.token = Some(token.clone().into());
        let shared = LowerToken::take_from(&mut config).unwrap();
        assert!(config.auth_info.token.is_none());
        assert_eq!(shared.claims().expires, 610);
        assert_eq!(
            shared.read(|c| c.header.clone()),
            format!("Bearer {token}").as_str()
        );
        assert!(!format!("{shared:?}").contains(&token));
        // A later token of the same account is taken; an earlier one or another's is not.
        let later = jwt(
            &serde_json::json!({"sub": "system:serviceaccount:kube-system:tensile", "iat": 500, "exp": 1100}),
        );
        let other = jwt(
            &serde_json::json!({"sub": "system:serviceaccount:kube-system:other", "iat": 900, "exp": 1500}),
        );
        assert!(!shared.offer(&other));
        assert!(shared.offer(&later));
        assert!(!shared.offer(&token));
        assert_eq!(shared.claims().expires, 1100);
        // Anything else is left to kube.
        let mut other = kube::Config::new("https://127.0.0.1:6443".parse().unwrap());
        other.auth_info.token = Some("opaque".to_owned().into());
        assert!(LowerToken::take_from(&mut other).is_none());
        assert!(other.auth_info.token.is_some());
    }

    fn kubeconfig_with(token: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: l\n  cluster: {{server: 'https://127.0.0.1:6443'}}\n\
             contexts:\n- name: l\n  context: {{cluster: l, user: tensile}}\nusers:\n- name: tensile\n  user: {{token: '{token}'}}\n\
             current-context: l\n"
        )
    }

    #[tokio::test]
    async fn a_follower_takes_the_later_token_its_file_gets() {
        let first = jwt(
            &serde_json::json!({"sub": "system:serviceaccount:kube-system:tensile", "iat": 10, "exp": 610}),
        );
        let renewed = jwt(
            &serde_json::json!({"sub": "system:serviceaccount:kube-system:tensile", "iat": 500, "exp": 1100}),
        );
        let dir = std::env::temp_dir().join(format!("tensile-follow-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("kubeconfig");
        std::fs::write(&path, kubeconfig_with(&first)).unwrap();
        let mut config = kube::Config::new("https://127.0.0.1:6443".parse().unwrap());
        config.auth_info.token = Some(first.clone().into());
        let shared = LowerToken::take_from(&mut config).unwrap();
        let stop = CancellationToken::new();
        let task = tokio::spawn(follow_file(
            shared.clone(),
            path.clone(),
            Duration::from_millis(10),
            stop.clone(),
        ));
        // As the kubelet rewrites a mounted Secret: a new file put in place.
        let next = dir.join("kubeconfig.new");
        std::fs::write(&next, kubeconfig_with(&renewed)).unwrap();
        std::fs::rename(&next, &path).unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while shared.claims().expires != 1100 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the renewed token was not taken"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(
            shared.read(|c| c.header.clone()),
            format!("Bearer {renewed}").as_str()
        );
        stop.cancel();
        task.await.unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }
}
