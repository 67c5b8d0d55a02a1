//! `--tls-secret`: the CA and serving certificate kept in a Secret of the upper cluster, on a
//! cluster from `TestEnv` (simulated, or real control planes with `TENSILE_K8S_BIN`). Replicas
//! and restarts serve one certificate; a renewal that falls due is written once and served
//! without a restart; a CA near its end is replaced with an overlap; a Secret that is not ours
//! is refused and left alone; a deleted one is written back.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::jiff::SignedDuration;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;
use serde_json::json;
use tensile_core::certs::Policy;
use tensile_placement::serve::{Handler, Reply, Server, tls_config_live};
use tensile_placement::tls_secret::{self, SecretName, TlsSecret, TlsSecretConfig, TlsSecretError};
use tensile_testenv::{ClusterSpec, TestEnv, eventually};
use tokio_util::sync::CancellationToken;

const NAMESPACE: &str = "kube-system";

struct Ok200;

impl Handler for Ok200 {
    fn handle(&self, _: &str, _: Bytes) -> Pin<Box<dyn Future<Output = Reply> + Send + '_>> {
        Box::pin(async { Reply::json(&json!({})) })
    }
}

fn config(name: &str, policy: Policy) -> TlsSecretConfig {
    TlsSecretConfig {
        secret: SecretName {
            namespace: NAMESPACE.into(),
            name: name.into(),
        },
        owner: "tensile-webhook".into(),
        names: vec!["localhost".into(), "127.0.0.1".into()],
        policy,
    }
}

/// A replica: the Secret kept, and a server presenting its certificate.
struct Replica {
    secret: TlsSecret,
    server: Server,
    stop: CancellationToken,
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn replica(client: kube::Client, config: TlsSecretConfig) -> Result<Replica, TlsSecretError> {
    let stop = CancellationToken::new();
    let secret = tls_secret::start(client, config, stop.clone()).await?;
    let server = Server::start(
        "127.0.0.1:0".parse().unwrap(),
        tls_config_live(&secret.cert, None).unwrap(),
        Arc::new(Ok200),
    )
    .await
    .unwrap();
    Ok(Replica {
        secret,
        server,
        stop,
    })
}

/// The leaf certificate `addr` presents in a handshake that verifies it against `trusted` (PEM),
/// or why the handshake failed.
async fn presented(addr: SocketAddr, trusted: &str) -> Result<Vec<u8>, String> {
    tensile_testenv::presented_certificate(addr, "localhost", trusted).await
}

fn pem_der(pem: &str) -> Vec<u8> {
    CertificateDer::from_pem_slice(pem.as_bytes())
        .unwrap()
        .to_vec()
}

fn text(secret: &Secret, key: &str) -> String {
    String::from_utf8(secret.data.as_ref().unwrap()[key].0.clone()).unwrap()
}

async fn upper() -> TestEnv {
    TestEnv::start_with(vec![ClusterSpec::new("upper", 0)])
        .await
        .unwrap()
}

/// A component started while the upper cluster does not answer waits for it (it used to
/// return the error, and the process exited: a crash loop of every restart that met the outage,
/// found by `tensile bench chaos`), then serves the Secret's certificate.
#[tokio::test]
async fn a_start_while_the_upper_cluster_is_away_waits_for_it() {
    let env = upper().await;
    let cluster = &env.clusters[0];
    cluster.set_available(false);
    let stop = CancellationToken::new();
    let mut start = tokio::spawn(tls_secret::start(
        cluster.client.clone(),
        config("away-at-start", Policy::default()),
        stop.clone(),
    ));
    // Still waiting while the cluster is away (it returned an error at once before).
    assert!(
        tokio::time::timeout(std::time::Duration::from_secs(3), &mut start)
            .await
            .is_err(),
        "the start ended while the upper cluster was away"
    );
    cluster.set_available(true);
    let kept = tokio::time::timeout(std::time::Duration::from_secs(60), start)
        .await
        .expect("the start ends once the upper cluster answers")
        .unwrap();
    assert!(kept.is_ok(), "{:?}", kept.err());
    stop.cancel();
}

/// Two replicas started together (one creates the Secret, the other reads it) present the same
/// certificate, trusted through `ca.crt`; a restart presents it again and writes nothing.
#[tokio::test]
async fn replicas_and_restarts_serve_one_certificate_from_one_ca() {
    let env = upper().await;
    let client = env.clusters[0].client.clone();
    let (a, b) = tokio::join!(
        replica(client.clone(), config("tls-shared", Policy::default())),
        replica(client.clone(), config("tls-shared", Policy::default())),
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NAMESPACE);
    let stored = secrets.get("tls-shared").await.unwrap();
    assert_eq!(stored.type_.as_deref(), Some("kubernetes.io/tls"));
    assert_eq!(
        stored.metadata.labels.as_ref().unwrap()["tensile-kube.io/owner"],
        "tensile-webhook"
    );
    let ca = text(&stored, "ca.crt");
    let leaf = pem_der(&text(&stored, "tls.crt"));
    assert_eq!(*a.secret.bundle.borrow(), ca);
    assert_eq!(*b.secret.bundle.borrow(), ca);
    assert_eq!(presented(a.server.addr(), &ca).await.unwrap(), leaf);
    assert_eq!(presented(b.server.addr(), &ca).await.unwrap(), leaf);
    let writes = a.secret.state.borrow().writes + b.secret.state.borrow().writes;
    assert_eq!(
        writes, 1,
        "one replica created the Secret, the other read it"
    );

    drop((a, b));
    let again = replica(client.clone(), config("tls-shared", Policy::default()))
        .await
        .unwrap();
    assert_eq!(presented(again.server.addr(), &ca).await.unwrap(), leaf);
    assert_eq!(again.secret.state.borrow().writes, 0);
    assert_eq!(
        secrets
            .get("tls-shared")
            .await
            .unwrap()
            .metadata
            .resource_version,
        stored.metadata.resource_version,
        "a restart writes nothing"
    );
}

/// A serving certificate of 10 s is renewed once less than a quarter of it is left (at 8 s):
/// by one of the two replicas, once, with the same CA, and both present the new one without a
/// restart.
#[tokio::test]
async fn a_due_renewal_is_written_once_and_served_without_a_restart() {
    let env = upper().await;
    let client = env.clusters[0].client.clone();
    let policy = Policy {
        ca_lifetime: SignedDuration::from_hours(24),
        leaf_lifetime: SignedDuration::from_secs(10),
        backdate: SignedDuration::ZERO,
    };
    let a = replica(client.clone(), config("tls-renew", policy))
        .await
        .unwrap();
    let b = replica(client.clone(), config("tls-renew", policy))
        .await
        .unwrap();
    let ca = a.secret.bundle.borrow().clone();
    let first = presented(a.server.addr(), &ca).await.unwrap();
    assert_eq!(presented(b.server.addr(), &ca).await.unwrap(), first);

    for r in [&a, &b] {
        eventually(30, "the renewed certificate presented", || async {
            let now = presented(r.server.addr(), &ca).await.ok()?;
            (now != first).then_some(())
        })
        .await;
    }
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NAMESPACE);
    let stored = secrets.get("tls-renew").await.unwrap();
    let rv = stored.metadata.resource_version.clone().unwrap();
    // Both have settled on the stored Secret: the loser of the race read it and wrote nothing.
    eventually(10, "both replicas on the renewed Secret", || async {
        (a.secret.state.borrow().resource_version == rv
            && b.secret.state.borrow().resource_version == rv)
            .then_some(())
    })
    .await;
    let writes = a.secret.state.borrow().writes + b.secret.state.borrow().writes;
    assert_eq!(writes, 2, "the creation, then one renewal");
    assert_eq!(text(&stored, "ca.crt"), ca, "renewed by the same CA");
    let renewed = pem_der(&text(&stored, "tls.crt"));
    assert_eq!(presented(a.server.addr(), &ca).await.unwrap(), renewed);
    assert_eq!(presented(b.server.addr(), &ca).await.unwrap(), renewed);
}

/// A CA of 20 s: at 16 s (a fifth left) the next CA joins `ca.crt` while the old one still signs,
/// so clients that trust only the old CA keep working; at 18 s the new one signs, and a client
/// that took the bundle of two keeps working; at 20 s the old CA leaves the bundle.
#[tokio::test]
async fn a_ca_near_its_end_is_replaced_with_an_overlap() {
    let env = upper().await;
    let client = env.clusters[0].client.clone();
    let policy = Policy {
        ca_lifetime: SignedDuration::from_secs(20),
        leaf_lifetime: SignedDuration::from_hours(1),
        backdate: SignedDuration::ZERO,
    };
    let r = replica(client.clone(), config("tls-ca", policy))
        .await
        .unwrap();
    let old_ca = r.secret.bundle.borrow().clone();
    let mut bundle = r.secret.bundle.clone();
    let two = tokio::time::timeout(std::time::Duration::from_secs(30), async {
        loop {
            bundle.changed().await.unwrap();
            let b = bundle.borrow_and_update().clone();
            if b.matches("BEGIN CERTIFICATE").count() == 2 {
                return b;
            }
        }
    })
    .await
    .expect("a second CA in the bundle");
    assert!(two.starts_with(&old_ca), "the old CA stays first: {two}");
    assert!(
        presented(r.server.addr(), &old_ca).await.is_ok(),
        "while the next CA is being distributed, the old one still signs"
    );
    let new_ca = two[old_ca.len()..].to_owned();
    eventually(30, "a certificate of the new CA presented", || async {
        presented(r.server.addr(), &new_ca).await.ok()
    })
    .await;
    assert!(presented(r.server.addr(), &two).await.is_ok());
    assert!(presented(r.server.addr(), &old_ca).await.is_err());
    eventually(30, "the old CA gone from the bundle", || async {
        (*r.secret.bundle.borrow() == new_ca).then_some(())
    })
    .await;
    assert!(
        presented(r.server.addr(), &two).await.is_ok(),
        "a client that took the bundle of two still works"
    );
}

/// A Secret of the configured name that is not ours, without our label or with another
/// component's, is refused with an error naming it, and left as it was.
#[tokio::test]
async fn a_secret_that_is_not_ours_is_refused_and_left_alone() {
    let env = upper().await;
    let client = env.clusters[0].client.clone();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NAMESPACE);
    for (name, labels) in [
        ("tls-theirs", json!({})),
        (
            "tls-other",
            json!({"tensile-kube.io/owner": "tensile-scheduler"}),
        ),
    ] {
        let theirs: Secret = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": labels},
            "type": "kubernetes.io/tls",
            "stringData": {"tls.crt": "theirs", "tls.key": "theirs"}
        }))
        .unwrap();
        let created = secrets
            .create(&PostParams::default(), &theirs)
            .await
            .unwrap();
        let err = replica(client.clone(), config(name, Policy::default()))
            .await
            .err()
            .expect("refused");
        let message = err.to_string();
        assert!(
            message.starts_with(&format!("Secret kube-system/{name} is not ours")),
            "{message}"
        );
        assert!(message.contains("refusing to overwrite it"), "{message}");
        assert_eq!(
            secrets.get(name).await.unwrap().metadata.resource_version,
            created.metadata.resource_version
        );
    }
}

/// A deleted Secret is written back by a running replica, with the CA and certificate it
/// serves: the clients' trust survives.
#[tokio::test]
async fn a_deleted_secret_is_written_back_with_the_same_ca() {
    let env = upper().await;
    let client = env.clusters[0].client.clone();
    let r = replica(client.clone(), config("tls-deleted", Policy::default()))
        .await
        .unwrap();
    let ca = r.secret.bundle.borrow().clone();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NAMESPACE);
    let before = secrets.get("tls-deleted").await.unwrap();
    secrets
        .delete("tls-deleted", &DeleteParams::default())
        .await
        .unwrap();
    let back = eventually(30, "the Secret written back", || async {
        secrets
            .get_opt("tls-deleted")
            .await
            .unwrap()
            .filter(|s| s.metadata.uid != before.metadata.uid)
    })
    .await;
    assert_eq!(text(&back, "ca.crt"), ca);
    assert_eq!(text(&back, "tls.crt"), text(&before, "tls.crt"));
    assert!(presented(r.server.addr(), &ca).await.is_ok());
}
