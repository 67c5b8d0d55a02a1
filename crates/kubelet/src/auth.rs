//! Authentication and authorization of kubelet API requests, as the kubelet does them:
//! client certificates verified against a CA (the TLS layer checks the chain; the user is the
//! subject's CN, its groups the O values), bearer tokens through a `TokenReview`, and every
//! request authorized by a `SubjectAccessReview` on `nodes/<node>` with the subresource the
//! path maps to. Decisions are cached (tokens 2 min; allowed 5 min, denied 30 s). Anonymous
//! requests get 401 and denied ones 403, unless the operator turned authentication off.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};

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
}

impl AuthError {
    /// HTTP status.
    pub fn status(&self) -> u16 {
        match self {
            Self::Unauthenticated => 401,
            Self::Forbidden { .. } => 403,
            Self::Review(_) => 500,
        }
    }
}

struct Cache<K, V> {
    entries: Mutex<HashMap<K, (V, Instant)>>,
}

impl<K: std::hash::Hash + Eq, V: Clone> Cache<K, V> {
    fn new() -> Self {
        Self {
            entries: Mutex::new(HashMap::new()),
        }
    }

    fn get(&self, k: &K) -> Option<V> {
        let mut entries = self.entries.lock().ok()?;
        match entries.get(k) {
            Some((v, until)) if *until > Instant::now() => Some(v.clone()),
            Some(_) => {
                entries.remove(k);
                None
            }
            None => None,
        }
    }

    fn put(&self, k: K, v: V, ttl: Duration) {
        if let Ok(mut entries) = self.entries.lock() {
            // Bounded: forget everything rather than grow without limit under a token flood.
            if entries.len() > 10_000 {
                entries.clear();
            }
            entries.insert(k, (v, Instant::now() + ttl));
        }
    }
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

/// The CA a cluster's API server signs its kubelet client certificates with, as kubeadm and
/// the embedded API server set clusters up: `ca.crt` of `kube-system/kube-root-ca.crt`. None
/// when it cannot be read (then client certificates are not accepted; tokens still are).
pub async fn cluster_client_ca(client: &kube::Client) -> Option<String> {
    let config_maps: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(client.clone(), "kube-system");
    config_maps
        .get_opt("kube-root-ca.crt")
        .await
        .ok()
        .flatten()?
        .data?
        .remove("ca.crt")
}

/// TokenReview/SubjectAccessReview against an API server, cached.
#[allow(missing_debug_implementations)] // holds a client and token caches: nothing to show
pub struct WebhookAuth {
    client: kube::Client,
    node: String,
    tokens: Cache<String, Option<User>>,
    decisions: Cache<(User, &'static str, &'static str), bool>,
}

impl WebhookAuth {
    /// Reviews against the API server of `client`, for node `node`.
    pub fn new(client: kube::Client, node: impl Into<String>) -> Self {
        Self {
            client,
            node: node.into(),
            tokens: Cache::new(),
            decisions: Cache::new(),
        }
    }

    async fn token_user(&self, token: &str) -> Result<Option<User>, AuthError> {
        if let Some(cached) = self.tokens.get(&token.to_owned()) {
            return Ok(cached);
        }
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
        self.tokens
            .put(token.to_owned(), user.clone(), Duration::from_secs(120));
        Ok(user)
    }

    async fn allowed(
        &self,
        user: &User,
        verb: &'static str,
        subresource: &'static str,
    ) -> Result<bool, AuthError> {
        let key = (user.clone(), verb, subresource);
        if let Some(d) = self.decisions.get(&key) {
            return Ok(d);
        }
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
        let ttl = if allowed {
            Duration::from_secs(300)
        } else {
            Duration::from_secs(30)
        };
        self.decisions.put(key, allowed, ttl);
        Ok(allowed)
    }
}

impl Auth {
    /// Authenticates (certificate user, else bearer token) and authorizes a request.
    pub async fn check(
        &self,
        cert_user: Option<User>,
        bearer: Option<&str>,
        attrs: &Attributes,
    ) -> Result<Option<User>, AuthError> {
        let Self::Webhook(w) = self else {
            return Ok(None);
        };
        let user = match (cert_user, bearer) {
            (Some(u), _) => u,
            (None, Some(token)) => w
                .token_user(token)
                .await?
                .ok_or(AuthError::Unauthenticated)?,
            (None, None) => return Err(AuthError::Unauthenticated),
        };
        for sub in &attrs.subresources {
            if w.allowed(&user, attrs.verb, sub).await? {
                return Ok(Some(user));
            }
        }
        Err(AuthError::Forbidden {
            user: user.name,
            verb: attrs.verb,
            subresource: attrs.subresources.first().copied().unwrap_or("proxy"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
