//! The HTTPS server the webhook and the scheduler extender share, against hostile or broken
//! clients: oversized and slow bodies, slow handshakes and headers, garbage; after each, the
//! server still serves a valid request.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};
use tensile_placement::serve::{
    DEFAULT_MAX_BODY, Handler, Reply, SMALL_BODY, Server, ServerLimits, ServingCert, tls_config,
};
use tensile_placement::webhook::{MAX_ADMISSION_REVIEW, Webhook, WebhookConfig};
use tensile_runtime::tls::ConnectionLimits;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Answers `{"bytes": N}` for a body of N bytes.
struct Count;

impl Handler for Count {
    fn handle(&self, _: &str, body: Bytes) -> Pin<Box<dyn Future<Output = Reply> + Send + '_>> {
        Box::pin(async move { Reply::json(&serde_json::json!({"bytes": body.len()})) })
    }
}

async fn serve(handler: Arc<dyn Handler>, limits: ServerLimits) -> (Server, ServingCert) {
    let cert = ServingCert::generate("tensile-test", &["localhost".into()]).unwrap();
    let server = Server::start_with(
        "127.0.0.1:0".parse().unwrap(),
        tls_config(&cert, None).unwrap(),
        handler,
        limits,
    )
    .await
    .unwrap();
    (server, cert)
}

async fn tls_connect(addr: SocketAddr, ca_pem: &str) -> tokio_rustls::client::TlsStream<TcpStream> {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let tcp = TcpStream::connect(addr).await.unwrap();
    tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap()
}

/// Everything the server sends until it closes the connection.
async fn until_closed(mut io: impl AsyncRead + Unpin) -> String {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match io.read(&mut buf).await {
            Ok(0) | Err(_) => return String::from_utf8_lossy(&got).into_owned(),
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
}

async fn within<T>(secs: u64, what: &str, fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(secs), fut)
        .await
        .unwrap_or_else(|_| panic!("timed out after {secs}s waiting for {what}"))
}

/// One request written by hand (`Connection: close`), and the raw answer.
async fn raw_request(addr: SocketAddr, ca_pem: &str, head: &str, body: &[u8]) -> String {
    let mut tls = tls_connect(addr, ca_pem).await;
    tls.write_all(head.as_bytes()).await.unwrap();
    // The server may answer (and close) before taking the whole body.
    let _ = tls.write_all(body).await;
    within(20, "the answer", until_closed(tls)).await
}

fn post(path: &str, len: usize) -> String {
    format!(
        "POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
         Content-Length: {len}\r\nConnection: close\r\n\r\n"
    )
}

fn status_of(answer: &str) -> u16 {
    answer
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP answer: {answer:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_bodies_get_413_with_a_reason_and_the_server_goes_on() {
    let (server, cert) = serve(Arc::new(Count), ServerLimits::default()).await;
    let (addr, ca) = (server.addr(), cert.ca_pem.as_str());
    // Announced too large: refused before it is read.
    let answer = raw_request(addr, ca, &post("/filter", DEFAULT_MAX_BODY + 1), b"{}").await;
    assert_eq!(status_of(&answer), 413, "{answer}");
    assert!(answer.contains("larger than"), "{answer}");
    // Chunked, so no length is announced: refused once the limit is passed.
    let chunk = vec![b' '; 1 << 20];
    let mut body = Vec::new();
    for _ in 0..(DEFAULT_MAX_BODY / chunk.len() + 1) {
        body.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
        body.extend_from_slice(&chunk);
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(b"0\r\n\r\n");
    let head = "POST /filter HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\
                Connection: close\r\n\r\n";
    let answer = raw_request(addr, ca, head, &body).await;
    assert_eq!(status_of(&answer), 413, "{answer}");
    // At the limit: served.
    let answer = raw_request(
        addr,
        ca,
        &post("/filter", DEFAULT_MAX_BODY),
        &vec![b' '; DEFAULT_MAX_BODY],
    )
    .await;
    assert_eq!(status_of(&answer), 200, "{answer}");
    assert!(answer.contains(&format!("{{\"bytes\":{DEFAULT_MAX_BODY}}}")));

    // The webhook takes AdmissionReviews up to its own limit.
    let webhook = Arc::new(Webhook::new(WebhookConfig::default()));
    let (server, cert) = serve(webhook, ServerLimits::default()).await;
    let answer = raw_request(
        server.addr(),
        &cert.ca_pem,
        &post("/mutate", MAX_ADMISSION_REVIEW + 1),
        b"{}",
    )
    .await;
    assert_eq!(status_of(&answer), 413, "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_handshakes_headers_and_bodies_are_cut_off() {
    let limits = ServerLimits {
        connection: ConnectionLimits {
            handshake_timeout: Duration::from_secs(1),
            header_read_timeout: Duration::from_secs(1),
        },
        body_timeout: Duration::from_secs(1),
    };
    let (server, cert) = serve(Arc::new(Count), limits).await;
    let (addr, ca) = (server.addr(), cert.ca_pem.as_str());
    // TCP only, no ClientHello.
    let tcp = TcpStream::connect(addr).await.unwrap();
    within(
        20,
        "a silent TCP connection to be closed",
        until_closed(tcp),
    )
    .await;
    // Handshake done, nothing sent.
    let tls = tls_connect(addr, ca).await;
    within(
        20,
        "a silent TLS connection to be closed",
        until_closed(tls),
    )
    .await;
    // Headers never finished.
    let mut tls = tls_connect(addr, ca).await;
    tls.write_all(b"POST /filter HTTP/1.1\r\nHost: localhost\r\n")
        .await
        .unwrap();
    within(20, "half-sent headers to be cut off", until_closed(tls)).await;
    // A body that never comes: 408 with a reason.
    let mut tls = tls_connect(addr, ca).await;
    tls.write_all(post("/filter", 100).as_bytes())
        .await
        .unwrap();
    tls.write_all(b"{\"partial\":").await.unwrap();
    let answer = within(20, "a stalled body to be refused", until_closed(tls)).await;
    assert_eq!(status_of(&answer), 408, "{answer}");
    assert!(answer.contains("did not arrive"), "{answer}");
    // Still serving.
    let answer = raw_request(addr, ca, &post("/filter", 2), b"{}").await;
    assert_eq!(status_of(&answer), 200, "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_gets_a_4xx_with_a_reason_and_the_server_goes_on() {
    let webhook = Arc::new(Webhook::new(WebhookConfig::default()));
    let (server, cert) = serve(webhook, ServerLimits::default()).await;
    let (addr, ca) = (server.addr(), cert.ca_pem.as_str());
    for junk in [
        &b"\x16\x03\x01garbage\r\n\r\n"[..],
        b"POST /mutate HTTP/1.1\r\nBad Header\r\n\r\n",
    ] {
        let mut tls = tls_connect(addr, ca).await;
        tls.write_all(junk).await.unwrap();
        let answer = within(20, "an answer to garbage", until_closed(tls)).await;
        assert_eq!(status_of(&answer), 400, "{junk:?}: {answer}");
    }
    for (body, reason) in [
        (&b"\xff\xfe not json"[..], "not JSON"),
        (b"[1, 2]", "AdmissionReview"),
        (
            b"{\"kind\": \"AdmissionReview\", \"apiVersion\": \"admission.k8s.io/v1\"}",
            "no request",
        ),
    ] {
        let answer = raw_request(addr, ca, &post("/mutate", body.len()), body).await;
        assert_eq!(status_of(&answer), 400, "{answer}");
        assert!(answer.contains(reason), "{reason}: {answer}");
    }
    let review = serde_json::json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "u1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "operation": "DELETE", "namespace": "default"}});
    let body = serde_json::to_vec(&review).unwrap();
    let answer = raw_request(addr, ca, &post("/mutate", body.len()), &body).await;
    assert_eq!(status_of(&answer), 200, "{answer}");
    assert!(answer.contains("\"allowed\":true"), "{answer}");
}

/// Holds every request until told to answer: how many are in progress at once shows.
struct Held {
    release: tokio::sync::Semaphore,
    inside: std::sync::atomic::AtomicUsize,
}

impl Handler for Held {
    fn handle(&self, _: &str, _: Bytes) -> Pin<Box<dyn Future<Output = Reply> + Send + '_>> {
        Box::pin(async move {
            self.inside
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let _ = self.release.acquire().await.map(|p| p.forget());
            Reply::json(&serde_json::json!({}))
        })
    }

    fn max_concurrent(&self) -> usize {
        1
    }

    fn max_waiting(&self) -> usize {
        1
    }
}

/// Requests in progress are bounded (each holds its body and what is decoded from it): past
/// those in progress and those allowed to wait, a request gets 503 with the reason at once, and
/// the server goes on once they finish.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_past_the_cap_get_503_with_a_reason_and_the_server_goes_on() {
    let held = Arc::new(Held {
        release: tokio::sync::Semaphore::new(0),
        inside: std::sync::atomic::AtomicUsize::new(0),
    });
    let (server, cert) = serve(held.clone(), ServerLimits::default()).await;
    let (addr, ca) = (server.addr(), cert.ca_pem.clone());
    let spawn_post = || {
        let ca = ca.clone();
        tokio::spawn(async move { raw_request(addr, &ca, &post("/filter", 2), b"{}").await })
    };
    let first = spawn_post();
    within(20, "the first request inside", async {
        while held.inside.load(std::sync::atomic::Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    // Two more: one waits in the one waiting place, the other is refused at once.
    let (mut second, mut third) = (spawn_post(), spawn_post());
    let (waiting, answer) = tokio::select! {
        a = &mut second => (third, a.unwrap()),
        a = &mut third => (second, a.unwrap()),
    };
    assert_eq!(status_of(&answer), 503, "{answer}");
    assert!(
        answer.contains("busy: 1 requests in progress and 1 waiting"),
        "{answer}"
    );
    assert!(
        answer.to_ascii_lowercase().contains("retry-after: 1"),
        "{answer}"
    );
    assert_eq!(held.inside.load(std::sync::atomic::Ordering::SeqCst), 1);
    held.release.add_permits(2);
    for h in [first, waiting] {
        let answer = within(20, "the held requests answered", h).await.unwrap();
        assert_eq!(status_of(&answer), 200, "{answer}");
    }
    held.release.add_permits(1);
    let answer = raw_request(addr, &ca, &post("/filter", 2), b"{}").await;
    assert_eq!(status_of(&answer), 200, "{answer}");
}

/// Counts like [`Count`], one request in progress at a time, one large body read at a time.
struct OneAtATime;

impl Handler for OneAtATime {
    fn handle(&self, _: &str, body: Bytes) -> Pin<Box<dyn Future<Output = Reply> + Send + '_>> {
        Box::pin(async move { Reply::json(&serde_json::json!({"bytes": body.len()})) })
    }

    fn max_concurrent(&self) -> usize {
        1
    }

    fn large_bodies(&self) -> usize {
        1
    }
}

/// A client that sends its body slowly holds the bytes it sent, never the place in progress:
/// requests behind it are answered (with the place taken before the body was read, one slow
/// client stalled the only place and the others got 503 after waiting). A slow large body holds
/// a large-body place: small ones still pass, another large one gets 503 with the reason, and
/// is served once the slow one is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_body_holds_its_bytes_not_the_place_of_others() {
    let (server, cert) = serve(Arc::new(OneAtATime), ServerLimits::default()).await;
    let (addr, ca) = (server.addr(), cert.ca_pem.clone());
    let large = SMALL_BODY + 1000;
    // Past the small size, then nothing: read for as long as the body timeout allows.
    let mut slow = tls_connect(addr, &ca).await;
    slow.write_all(post("/filter", 2 * large).as_bytes())
        .await
        .unwrap();
    slow.write_all(&vec![b' '; large]).await.unwrap();
    slow.flush().await.unwrap();
    // Once the server has read past the small size of the slow body, it holds the one
    // large-body place: another large body gets 503 with the reason.
    let body = vec![b' '; large];
    let answer = within(40, "a second large body refused", async {
        loop {
            let a = raw_request(addr, &ca, &post("/f", large), &body).await;
            if status_of(&a) == 503 {
                return a;
            }
        }
    })
    .await;
    assert!(
        answer.contains(&format!(
            "1 request bodies over {SMALL_BODY} bytes are being read"
        )),
        "{answer}"
    );
    // Small bodies still pass, and the place in progress is free.
    for _ in 0..3 {
        let answer = within(
            20,
            "a small request",
            raw_request(addr, &ca, &post("/f", 2), b"{}"),
        )
        .await;
        assert_eq!(status_of(&answer), 200, "{answer}");
    }
    drop(slow);
    let answer = within(20, "the large body once the slow one is gone", async {
        loop {
            let a = raw_request(addr, &ca, &post("/f", large), &body).await;
            if status_of(&a) != 503 {
                return a;
            }
        }
    })
    .await;
    assert_eq!(status_of(&answer), 200, "{answer}");
}

/// Holds its binds (requests that wait on another server) until told to answer; answers the
/// rest at once, one at a time, none waiting.
struct HeldBinds {
    release: tokio::sync::Semaphore,
    binding: std::sync::atomic::AtomicUsize,
}

impl Handler for HeldBinds {
    fn handle(&self, path: &str, _: Bytes) -> Pin<Box<dyn Future<Output = Reply> + Send + '_>> {
        let bind = path.ends_with("/bind");
        Box::pin(async move {
            if bind {
                self.binding
                    .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let _ = self.release.acquire().await.map(|p| p.forget());
            }
            Reply::json(&serde_json::json!({}))
        })
    }

    fn max_concurrent(&self) -> usize {
        1
    }

    fn max_waiting(&self) -> usize {
        0
    }

    fn waits_on_io(&self, path: &str) -> bool {
        path.ends_with("/bind")
    }
}

/// kube-scheduler binds many pods at once while it filters the next: binds waiting on the API
/// server hold places of their own, never the one place of the decisions (held there, each
/// bind's round trip made filter calls wait or fail), and send only small bodies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binds_waiting_on_the_api_server_never_hold_the_place_of_decisions() {
    let held = Arc::new(HeldBinds {
        release: tokio::sync::Semaphore::new(0),
        binding: std::sync::atomic::AtomicUsize::new(0),
    });
    let (server, cert) = serve(held.clone(), ServerLimits::default()).await;
    let (addr, ca) = (server.addr(), cert.ca_pem.clone());
    let binds: Vec<_> = (0..3)
        .map(|_| {
            let ca = ca.clone();
            tokio::spawn(async move { raw_request(addr, &ca, &post("/x/bind", 2), b"{}").await })
        })
        .collect();
    within(20, "three binds in progress at once", async {
        while held.binding.load(std::sync::atomic::Ordering::SeqCst) < 3 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    for _ in 0..3 {
        let answer = raw_request(addr, &ca, &post("/x/filter", 2), b"{}").await;
        assert_eq!(status_of(&answer), 200, "{answer}");
    }
    let body = vec![b' '; SMALL_BODY + 1];
    let answer = raw_request(addr, &ca, &post("/x/bind", body.len()), &body).await;
    assert_eq!(status_of(&answer), 413, "{answer}");
    held.release.add_permits(3);
    for b in binds {
        let answer = within(20, "the binds answered", b).await.unwrap();
        assert_eq!(status_of(&answer), 200, "{answer}");
    }
}
