//! The virtual node's clients: its four upper clients, and lower clients that carry the
//! renewed lower token. Building, rate limits and counting are `tensile_runtime::clients`.

use kube::Client;
use tensile_runtime::clients::{
    ApiCalls, ClientError, KubeconfigSource, client_from_config, client_with_layer, load_config,
    override_server,
};

/// [`client_from_config`] that sends `token` (the lower cluster's, renewed in place by
/// [`crate::lower_token::run`]) on every request when given: every clone of the client, and so
/// every watch and controller, reads the one current token.
pub fn client_with_token(
    config: kube::Config,
    token: Option<&crate::lower_token::LowerToken>,
    qps: f32,
    burst: u32,
    cluster: &'static str,
    calls: &ApiCalls,
) -> Result<Client, ClientError> {
    match token {
        Some(t) => client_with_layer(config, &t.layer(), qps, burst, cluster, calls),
        None => client_from_config(config, qps, burst, cluster, calls),
    }
}

/// A virtual node's clients of the upper cluster: the same identity, QPS and burst, each with
/// its own token bucket, so one kind of traffic never waits behind another. A kubelet renews
/// its lease on a client of its own for the same reason: before, a flood of bogus bearer tokens
/// on the kubelet port (one TokenReview each) queued in front of the lease and made the node
/// NotReady.
#[derive(Clone)]
#[allow(missing_debug_implementations)] // kube clients: nothing to show
pub struct UpperClients {
    /// Pod sync, dependency copies and everything else.
    pub work: Client,
    /// Events (never wait for pods or delay them).
    pub events: Client,
    /// The node's Lease and status.
    pub heartbeat: Client,
    /// The kubelet port's TokenReviews and SubjectAccessReviews.
    pub reviews: Client,
}

impl UpperClients {
    /// Four clients of `source` (its server replaced by `server` when given), each limited to
    /// `qps` and `burst` as [`build_client`] says.
    pub async fn build(
        source: &KubeconfigSource,
        server: Option<&str>,
        qps: f32,
        burst: u32,
        calls: &ApiCalls,
    ) -> Result<Self, ClientError> {
        let mut config = load_config(source).await?;
        if let Some(url) = server.filter(|url| !url.trim().is_empty()) {
            override_server(&mut config, url)?;
        }
        let client = || client_from_config(config.clone(), qps, burst, "upper", calls);
        Ok(Self {
            work: client()?,
            events: client()?,
            heartbeat: client()?,
            reviews: client()?,
        })
    }
}
