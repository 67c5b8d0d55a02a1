//! The kubelet API refusing the upper API server's client certificate is said, not silent, and
//! a flood of bogus tokens on it does not starve the node's lease: on the simulator and on real
//! control planes.

use crate::common::{NodeOptions, clusters, eventually, spawn};
use k8s_openapi::api::core::v1::Event;
use kube::api::{Api, ListParams};
use tensile_node::ClientCa;

/// The Warning event `reason` on node `node`, once it exists.
async fn warning(upper: &kube::Client, node: &str, reason: &str) -> Event {
    let events: Api<Event> = Api::namespaced(upper.clone(), "default");
    eventually(60, &format!("a Warning {reason} on {node}"), || async {
        events
            .list(&ListParams::default().fields(&format!("involvedObject.name={node}")))
            .await
            .ok()?
            .items
            .into_iter()
            .find(|e| e.type_.as_deref() == Some("Warning") && e.reason.as_deref() == Some(reason))
    })
    .await
}

/// The node's `/metrics` text.
async fn metrics(addr: std::net::SocketAddr) -> String {
    let config = kube::Config::new(format!("http://{addr}").parse::<http::Uri>().unwrap());
    kube::Client::try_from(config)
        .unwrap()
        .request_text(http::Request::get("/metrics").body(Vec::new()).unwrap())
        .await
        .unwrap()
}

/// The value of `tensile_kubelet_auth_refusals_total{reason="<reason>"}`.
fn refusals(text: &str, reason: &str) -> f64 {
    let prefix = format!("tensile_kubelet_auth_refusals_total{{reason=\"{reason}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {prefix} in {text}"))
}

/// A node trusting another CA than the one signing the API server's kubelet client
/// certificate: at start it asks for its own /healthz through the API server, refuses the
/// certificate, and says so with a Warning event naming both CAs and the flag; the refusal is
/// counted.
#[tokio::test]
async fn a_client_certificate_of_another_ca_is_a_warning_event_and_a_counted_refusal() {
    let env = clusters().await;
    let foreign = tensile_testenv::certs::Ca::new("foreign-ca").unwrap();
    let mut opts = NodeOptions::new("vk-lower");
    opts.metrics = true;
    opts.client_ca = Some(ClientCa::Pem(foreign.cert_pem().to_owned()));
    let node = spawn(&env, opts).await;
    let upper = &env.clusters[0].client;
    let event = warning(upper, "vk-lower", "KubeletClientRefused").await;
    let message = event.message.unwrap_or_default();
    assert!(
        message.contains("CN=foreign-ca")
            && message.contains("401 Unauthorized")
            && message.contains("--client-verify-ca"),
        "{message}"
    );
    assert_eq!(event.involved_object.kind.as_deref(), Some("Node"));
    assert!(refusals(&metrics(node.metrics.unwrap()).await, "unknown_ca") >= 1.0);
    // What a user sees meanwhile: the API server relays the 401.
    let e = upper
        .request_text(
            http::Request::get("/api/v1/nodes/vk-lower/proxy/healthz")
                .body(Vec::new())
                .unwrap(),
        )
        .await
        .unwrap_err();
    assert!(matches!(&e, kube::Error::Api(s) if s.code == 401), "{e:?}");
    node.stop.cancel();
}

/// No client CA could be read: a Warning event says why, what breaks and which flag to pass;
/// the API server's certificate is then refused and reported too.
#[tokio::test]
async fn an_unreadable_client_ca_is_a_warning_event() {
    let env = clusters().await;
    let mut opts = NodeOptions::new("vk-lower");
    opts.metrics = true;
    opts.client_ca = Some(ClientCa::Unavailable(
        "reading kube-system/kube-root-ca.crt: not found".into(),
    ));
    let node = spawn(&env, opts).await;
    let upper = &env.clusters[0].client;
    let event = warning(upper, "vk-lower", "KubeletClientCAUnavailable").await;
    let message = event.message.unwrap_or_default();
    assert!(
        message.contains("kube-root-ca.crt: not found") && message.contains("--client-verify-ca"),
        "{message}"
    );
    let refused = warning(upper, "vk-lower", "KubeletClientRefused").await;
    assert!(
        refused
            .message
            .unwrap_or_default()
            .contains("no client CA is configured")
    );
    assert!(refusals(&metrics(node.metrics.unwrap()).await, "unknown_ca") >= 1.0);
    node.stop.cancel();
}

/// The right CA: the start-up check passes and warns about nothing.
#[tokio::test]
async fn the_api_servers_certificate_of_the_trusted_ca_raises_no_warning() {
    let env = clusters().await;
    let mut opts = NodeOptions::new("vk-lower");
    opts.metrics = true;
    let node = spawn(&env, opts).await;
    let upper = &env.clusters[0].client;
    // The check has run once the API server's request was served: /healthz through the proxy.
    eventually(60, "healthz through nodes/proxy", || async {
        upper
            .request_text(
                http::Request::get("/api/v1/nodes/vk-lower/proxy/healthz")
                    .body(Vec::new())
                    .unwrap(),
            )
            .await
            .ok()
    })
    .await;
    let text = metrics(node.metrics.unwrap()).await;
    assert_eq!(refusals(&text, "unknown_ca"), 0.0, "{text}");
    let events: Api<Event> = Api::namespaced(upper.clone(), "default");
    let list = events
        .list(&ListParams::default().fields("involvedObject.name=vk-lower"))
        .await
        .unwrap();
    assert!(
        !list.items.iter().any(|e| e
            .reason
            .as_deref()
            .is_some_and(|r| r.starts_with("KubeletClient"))),
        "{list:?}"
    );
    node.stop.cancel();
}

/// The status code of `GET /pods` on the kubelet port at `addr` with bearer token `token`, over
/// a connection of its own (0: no answer).
async fn bogus_request(addr: std::net::SocketAddr, token: &str) -> u16 {
    let request = format!(
        "GET /pods HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n"
    );
    tensile_testenv::https_exchange_unverified(addr, request.as_bytes())
        .await
        .ok()
        .and_then(|r| r.strip_prefix("HTTP/1.1 ")?.get(..3)?.parse().ok())
        .unwrap_or(0)
}

/// Waves of 150 parallel requests with unique bogus bearer tokens on the kubelet port (each a
/// TokenReview upstairs), at `--kube-api-qps 5`, do not starve the node: its Lease keeps being
/// renewed within its 40 s duration while they last (before, the reviews queued in front of it
/// on one rate-limited client and the node went NotReady). The reviews beyond the bound are
/// answered 429 at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_bogus_tokens_does_not_starve_the_lease() {
    use k8s_openapi::api::coordination::v1::Lease;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let env = clusters().await;
    let mut opts = NodeOptions::new("vk-lower");
    opts.upper_qps = 5.0;
    opts.lease_renew = std::time::Duration::from_secs(2);
    let node = spawn(&env, opts).await;
    let leases: Api<Lease> = Api::namespaced(env.clusters[0].client.clone(), "kube-node-lease");
    let renewed = || async {
        leases
            .get_opt("vk-lower")
            .await
            .ok()??
            .spec?
            .renew_time
            .map(|t| t.0)
    };
    eventually(60, "the node's lease", renewed).await;

    let kubelet = node.kubelet;
    let flood = tokio_util::sync::CancellationToken::new();
    let (answered, throttled) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let waves = {
        let (flood, answered, throttled) = (flood.clone(), answered.clone(), throttled.clone());
        tokio::spawn(async move {
            let mut wave = 0;
            while !flood.is_cancelled() {
                wave += 1;
                let tokens: Vec<String> = (0..150).map(|i| format!("bogus-{wave}-{i}")).collect();
                let codes =
                    futures::future::join_all(tokens.iter().map(|t| bogus_request(kubelet, t)))
                        .await;
                for code in codes {
                    if matches!(code, 401 | 429) {
                        answered.fetch_add(1, Ordering::SeqCst);
                    }
                    if code == 429 {
                        throttled.fetch_add(1, Ordering::SeqCst);
                    }
                }
            }
        })
    };
    eventually(60, "a first wave of the flood to be answered", || async {
        (answered.load(Ordering::SeqCst) >= 150).then_some(())
    })
    .await;
    // Three renewals in a row, each within the lease's duration, while the flood goes on.
    for round in 1..=3 {
        let before = renewed().await.unwrap();
        eventually(
            40,
            &format!("renewal {round} of the lease during the flood"),
            || async { (renewed().await? > before).then_some(()) },
        )
        .await;
    }
    assert!(!waves.is_finished(), "the flood stopped early");
    assert!(
        throttled.load(Ordering::SeqCst) > 0,
        "no review was refused with 429"
    );
    flood.cancel();
    let _ = waves.await;
    node.stop.cancel();
}
