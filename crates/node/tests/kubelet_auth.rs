//! The kubelet API refusing the upper API server's client certificate is said, not silent
//! (issue 19, item 7): on the simulator and on real control planes.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

mod common;

use common::{NodeOptions, clusters, eventually, spawn};
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
    let foreign = tensile_sim::certs::Ca::new("foreign-ca").unwrap();
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
