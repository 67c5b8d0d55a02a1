//! The kubelet HTTPS server: authentication (client certificates, TokenReview), authorization
//! (SubjectAccessReview, cached), routes, 404/405, bad query values. The API server answering
//! the reviews is a fake that records what it is asked.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Full};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair,
};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde_json::{Value, json};
use tensile_kubelet::{
    Auth, KubeletServer, KubeletServerConfig, ServingCert, StreamingConfig, WebhookAuth,
};
use tokio::net::{TcpListener, TcpStream};

use crate::common;
use crate::common::backend::FakeBackend;

struct Ca(CertifiedIssuer<'static, KeyPair>);

impl Ca {
    fn new(name: &str) -> Self {
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.distinguished_name.push(DnType::CommonName, name);
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        Self(CertifiedIssuer::self_signed(p, KeyPair::generate().unwrap()).unwrap())
    }

    fn issue(&self, cn: &str, group: Option<&str>, server: bool) -> (String, String) {
        let sans = if server {
            vec!["127.0.0.1".to_owned()]
        } else {
            Vec::new()
        };
        let mut p = CertificateParams::new(sans).unwrap();
        p.distinguished_name.push(DnType::CommonName, cn);
        if let Some(g) = group {
            p.distinguished_name.push(DnType::OrganizationName, g);
        }
        p.extended_key_usages = vec![if server {
            ExtendedKeyUsagePurpose::ServerAuth
        } else {
            ExtendedKeyUsagePurpose::ClientAuth
        }];
        let key = KeyPair::generate().unwrap();
        (
            p.signed_by(&key, &self.0).unwrap().pem(),
            key.serialize_pem(),
        )
    }
}

/// An API server that knows two tokens and allows alice and the API server's identity; it
/// counts SubjectAccessReviews in `reviews` and TokenReviews in `token_reviews`.
async fn fake_apiserver_counting(
    reviews: Arc<AtomicUsize>,
    token_reviews: Arc<AtomicUsize>,
) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let (reviews, token_reviews) = (reviews.clone(), token_reviews.clone());
            tokio::spawn(async move {
                let svc = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let (reviews, token_reviews) = (reviews.clone(), token_reviews.clone());
                    async move {
                        let path = req.uri().path().to_owned();
                        let mut body: Value = serde_json::from_slice(
                            &req.into_body().collect().await.unwrap().to_bytes(),
                        )
                        .unwrap();
                        if path.ends_with("/tokenreviews") {
                            token_reviews.fetch_add(1, Ordering::SeqCst);
                            // As a real API server: a review without a token is a bad request.
                            if body["spec"]["token"]
                                .as_str()
                                .unwrap_or_default()
                                .is_empty()
                            {
                                let mut resp = hyper::Response::new(Full::new(Bytes::from(
                                    r#"{"kind":"Status","apiVersion":"v1","status":"Failure","message":"token is required","reason":"BadRequest","code":400}"#,
                                )));
                                *resp.status_mut() = hyper::StatusCode::BAD_REQUEST;
                                resp.headers_mut()
                                    .insert("content-type", "application/json".parse().unwrap());
                                return Ok::<_, Infallible>(resp);
                            }
                            body["status"] = match body["spec"]["token"].as_str() {
                                Some("alice-token") => {
                                    json!({"authenticated": true, "user": {"username": "alice", "groups": ["dev"]}})
                                }
                                Some("bob-token") => {
                                    json!({"authenticated": true, "user": {"username": "bob"}})
                                }
                                _ => json!({"authenticated": false}),
                            };
                        } else {
                            reviews.fetch_add(1, Ordering::SeqCst);
                            let user = body["spec"]["user"].as_str().unwrap_or_default();
                            let attrs = &body["spec"]["resourceAttributes"];
                            assert_eq!(
                                (attrs["resource"].as_str(), attrs["name"].as_str()),
                                (Some("nodes"), Some("node-1"))
                            );
                            body["status"] = json!({"allowed": matches!(user, "alice" | "kube-apiserver-kubelet-client")});
                        }
                        let mut resp = hyper::Response::new(Full::new(Bytes::from(
                            serde_json::to_vec(&body).unwrap(),
                        )));
                        *resp.status_mut() = hyper::StatusCode::CREATED;
                        resp.headers_mut()
                            .insert("content-type", "application/json".parse().unwrap());
                        Ok::<_, Infallible>(resp)
                    }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tcp), svc)
                    .await;
            });
        }
    });
    format!("http://{addr}")
}

struct Setup {
    addr: SocketAddr,
    ca: Ca,
    reviews: Arc<AtomicUsize>,
    token_reviews: Arc<AtomicUsize>,
    _server: KubeletServer,
}

async fn setup(auth_on: bool) -> Setup {
    setup_with(auth_on, StreamingConfig::default()).await
}

async fn setup_with(auth_on: bool, streaming: StreamingConfig) -> Setup {
    let reviews = Arc::new(AtomicUsize::new(0));
    let token_reviews = Arc::new(AtomicUsize::new(0));
    let url = fake_apiserver_counting(reviews.clone(), token_reviews.clone()).await;
    let auth = auth_on.then(|| {
        let client = kube::Client::try_from(kube::Config::new(url.parse().unwrap())).unwrap();
        WebhookAuth::new(client, "node-1")
    });
    setup_auth(auth, streaming, reviews, token_reviews).await
}

/// A server whose authentication is `auth` (None: off).
async fn setup_auth(
    auth: Option<WebhookAuth>,
    streaming: StreamingConfig,
    reviews: Arc<AtomicUsize>,
    token_reviews: Arc<AtomicUsize>,
) -> Setup {
    let ca = Ca::new("cluster-ca");
    let (cert, key) = ca.issue("node-1", None, true);
    let auth = match auth {
        Some(w) => Auth::Webhook(Box::new(w)),
        None => Auth::Disabled,
    };
    let config = KubeletServerConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        cert: ServingCert::Pem { cert, key },
        client_ca_pem: Some(ca.0.pem()),
        auth,
        streaming,
    };
    let server = KubeletServer::start(config, FakeBackend::new())
        .await
        .unwrap();
    Setup {
        addr: server.addr(),
        ca,
        reviews,
        token_reviews,
        _server: server,
    }
}

/// One HTTPS request; `cert` is a client certificate and key.
async fn request(
    s: &Setup,
    method: &str,
    path: &str,
    token: Option<&str>,
    cert: Option<(String, String)>,
) -> Result<(u16, String, Option<String>), String> {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(s.ca.0.pem().as_bytes()).unwrap())
        .unwrap();
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots);
    let config = match cert {
        Some((c, k)) => builder
            .with_client_auth_cert(
                vec![CertificateDer::from_pem_slice(c.as_bytes()).unwrap()],
                PrivateKeyDer::from_pem_slice(k.as_bytes()).unwrap(),
            )
            .unwrap(),
        None => builder.with_no_client_auth(),
    };
    let tcp = TcpStream::connect(s.addr)
        .await
        .map_err(|e| e.to_string())?;
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("127.0.0.1").unwrap(), tcp)
        .await
        .map_err(|e| e.to_string())?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let mut req = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header("host", "node-1");
    if let Some(t) = token {
        req = match t.split_once(':') {
            // "raw:<value>": the whole header value, to send malformed ones.
            Some(("raw", value)) => req.header("authorization", value),
            _ => req.header("authorization", format!("Bearer {t}")),
        };
    }
    let resp = sender
        .send_request(req.body(Empty::<Bytes>::new()).unwrap())
        .await
        .map_err(|e| e.to_string())?;
    let status = resp.status().as_u16();
    let allow = resp
        .headers()
        .get("allow")
        .map(|v| v.to_str().unwrap().to_owned());
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok((status, String::from_utf8_lossy(&body).into_owned(), allow))
}

#[tokio::test]
async fn checklist_58_anonymous_and_unknown_tokens_get_401() {
    let s = setup(true).await;
    assert_eq!(
        request(&s, "GET", "/pods", None, None).await.unwrap().0,
        401
    );
    assert_eq!(
        request(&s, "GET", "/pods", Some("nobody"), None)
            .await
            .unwrap()
            .0,
        401
    );
    assert_eq!(
        request(&s, "GET", "/no/such/path", None, None)
            .await
            .unwrap()
            .0,
        401,
        "nothing is revealed before authentication"
    );
}

#[tokio::test]
async fn tokens_are_reviewed_and_authorized_per_user_with_cached_decisions() {
    let s = setup(true).await;
    let (code, body, _) = request(&s, "GET", "/pods", Some("alice-token"), None)
        .await
        .unwrap();
    assert_eq!(code, 200, "{body}");
    let pods: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(pods["kind"], "PodList");
    let (code, body, _) = request(
        &s,
        "GET",
        "/containerLogs/default/web/c",
        Some("bob-token"),
        None,
    )
    .await
    .unwrap();
    assert_eq!(code, 403);
    assert!(
        body.contains("user=bob") && body.contains("subresource(proxy)"),
        "{body}"
    );
    let before = s.reviews.load(Ordering::SeqCst);
    request(&s, "GET", "/pods", Some("alice-token"), None)
        .await
        .unwrap();
    assert_eq!(
        s.reviews.load(Ordering::SeqCst),
        before,
        "the decision was cached"
    );
}

#[tokio::test]
async fn the_api_servers_client_certificate_is_accepted_and_other_cas_are_refused() {
    let s = setup(true).await;
    let cert = s.ca.issue(
        "kube-apiserver-kubelet-client",
        Some("system:masters"),
        false,
    );
    let (code, body, _) = request(
        &s,
        "GET",
        "/containerLogs/default/web/c?tailLines=1",
        None,
        Some(cert),
    )
    .await
    .unwrap();
    assert_eq!((code, body.as_str()), (200, "c line 2\n"));
    // A certificate of another CA passes the handshake and is refused with 401, as by the
    // kubelet, so the refusal can be counted and explained; a token still authenticates.
    let stranger = Ca::new("other-ca").issue("kube-apiserver-kubelet-client", None, false);
    let (code, body, _) = request(&s, "GET", "/pods", None, Some(stranger.clone()))
        .await
        .unwrap();
    assert_eq!((code, body.as_str()), (401, "Unauthorized"));
    let (code, _, _) = request(&s, "GET", "/pods", Some("alice-token"), Some(stranger))
        .await
        .unwrap();
    assert_eq!(code, 200);
}

#[tokio::test]
async fn checklist_62_64_67_routes_methods_and_bad_values() {
    let s = setup(false).await;
    assert_eq!(
        request(&s, "GET", "/healthz", None, None).await.unwrap().1,
        "ok"
    );
    assert_eq!(
        request(&s, "GET", "/unknown", None, None).await.unwrap().0,
        404
    );
    let (code, _, allow) = request(&s, "POST", "/pods", None, None).await.unwrap();
    assert_eq!((code, allow.as_deref()), (405, Some("GET")));
    assert_eq!(
        request(
            &s,
            "GET",
            "/containerLogs/default/web/c?tailLines=-1",
            None,
            None
        )
        .await
        .unwrap()
        .0,
        400
    );
    assert_eq!(
        request(
            &s,
            "GET",
            "/containerLogs/default/web/c?limitBytes=0",
            None,
            None
        )
        .await
        .unwrap()
        .0,
        400
    );
    assert_eq!(
        request(
            &s,
            "GET",
            "/containerLogs/default/web/c?sinceSeconds=5&sinceTime=2026-11-22T10:00:00Z",
            None,
            None
        )
        .await
        .unwrap()
        .0,
        400
    );
    let (code, body, _) = request(&s, "GET", "/stats/summary", None, None)
        .await
        .unwrap();
    assert_eq!(code, 200);
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["node"]["nodeName"],
        "node-1"
    );
    let (code, body, _) = request(&s, "GET", "/metrics/resource", None, None)
        .await
        .unwrap();
    assert_eq!(code, 200);
    assert!(body.contains("resource_scrape_error 0"), "{body}");
    // Streaming routes need an upgrade: a plain GET is a 400 with the reason.
    assert_eq!(
        request(
            &s,
            "GET",
            "/exec/default/web/c?command=ls&output=1",
            None,
            None
        )
        .await
        .unwrap()
        .0,
        400
    );
}

/// A bearer header without a token, or of another scheme, is no credential: 401, as for no
/// header at all. The scheme is case-insensitive, as the kubelet's (`bearer` was refused).
#[tokio::test]
async fn empty_or_malformed_bearer_tokens_get_401() {
    let s = setup(true).await;
    for header in [
        "raw:Bearer ",
        "raw:Bearer",
        "raw:Bearer    ",
        "raw:Basic YWxpY2U6eA==",
    ] {
        let (code, body, _) = request(&s, "GET", "/pods", Some(header), None)
            .await
            .unwrap();
        assert_eq!(code, 401, "{header:?}: {body}");
    }
    let (code, body, _) = request(&s, "GET", "/pods", Some("raw:bearer alice-token"), None)
        .await
        .unwrap();
    assert_eq!(code, 200, "{body}");
}

/// A TLS connection to the kubelet API, trusting the test CA.
async fn tls_connect(s: &Setup) -> tokio_rustls::client::TlsStream<TcpStream> {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(s.ca.0.pem().as_bytes()).unwrap())
        .unwrap();
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let tcp = TcpStream::connect(s.addr).await.unwrap();
    tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("127.0.0.1").unwrap(), tcp)
        .await
        .unwrap()
}

/// Reads until the server closes the connection (or fails it); what it sent before.
async fn until_closed(mut io: impl tokio::io::AsyncRead + Unpin) -> Vec<u8> {
    use tokio::io::AsyncReadExt;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match io.read(&mut buf).await {
            Ok(0) | Err(_) => return got,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
}

/// Slowloris: a client that never finishes its TLS handshake, or its request headers, or that
/// keeps an idle connection, is cut off once the limits pass; the server keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_handshakes_and_headers_are_cut_off() {
    use tokio::io::AsyncWriteExt;
    let mut streaming = StreamingConfig::default();
    streaming.connection.handshake_timeout = std::time::Duration::from_secs(1);
    streaming.connection.header_read_timeout = std::time::Duration::from_secs(1);
    let s = setup_with(false, streaming).await;
    // TCP only, no ClientHello.
    let tcp = TcpStream::connect(s.addr).await.unwrap();
    common::within(
        20,
        "a silent TCP connection to be closed",
        until_closed(tcp),
    )
    .await;
    // Handshake done, headers never finished.
    let mut tls = tls_connect(&s).await;
    tls.write_all(b"GET /healthz HTTP/1.1\r\nHost: node-1\r\n")
        .await
        .unwrap();
    common::within(20, "half-sent headers to be cut off", until_closed(tls)).await;
    // Handshake done, nothing sent.
    let tls = tls_connect(&s).await;
    common::within(20, "an idle connection to be closed", until_closed(tls)).await;
    let (code, body, _) = request(&s, "GET", "/healthz", None, None).await.unwrap();
    assert_eq!((code, body.as_str()), (200, "ok"));
}

/// Garbage instead of HTTP is a 400; the server goes on serving.
#[tokio::test]
async fn garbage_gets_400_and_the_server_goes_on() {
    use tokio::io::AsyncWriteExt;
    let s = setup(true).await;
    for junk in [
        &b"\x16\x03\x01garbage\r\n\r\n"[..],
        b"GET /pods HTTP/1.1\r\nHost: node-1\r\nBad Header\r\n\r\n",
        b"NOT-HTTP\r\n\r\n",
    ] {
        let mut tls = tls_connect(&s).await;
        tls.write_all(junk).await.unwrap();
        let got = common::within(10, "an answer to garbage", until_closed(tls)).await;
        let text = String::from_utf8_lossy(&got);
        assert!(text.starts_with("HTTP/1.1 400"), "{junk:?}: {text}");
    }
    let cert = s.ca.issue("kube-apiserver-kubelet-client", None, false);
    let (code, _, _) = request(&s, "GET", "/pods", None, Some(cert)).await.unwrap();
    assert_eq!(code, 200);
}

/// `--authentication-token-webhook=false`: a bearer token is no credential, even one the API
/// server would accept; the API server is not asked. Client certificates still work.
#[tokio::test]
async fn with_token_reviews_off_a_token_gets_401_without_a_review() {
    let reviews = Arc::new(AtomicUsize::new(0));
    let token_reviews = Arc::new(AtomicUsize::new(0));
    let url = fake_apiserver_counting(reviews.clone(), token_reviews.clone()).await;
    let client = kube::Client::try_from(kube::Config::new(url.parse().unwrap())).unwrap();
    let auth = WebhookAuth::new(client, "node-1").with_token_reviews(false);
    let s = setup_auth(
        Some(auth),
        StreamingConfig::default(),
        reviews,
        token_reviews,
    )
    .await;
    let (code, body, _) = request(&s, "GET", "/pods", Some("alice-token"), None)
        .await
        .unwrap();
    assert_eq!((code, body.as_str()), (401, "Unauthorized"));
    assert_eq!(s.token_reviews.load(Ordering::SeqCst), 0);
    let apiserver = s.ca.issue(
        "kube-apiserver-kubelet-client",
        Some("system:masters"),
        false,
    );
    let (code, body, _) = request(&s, "GET", "/pods", Some("alice-token"), Some(apiserver))
        .await
        .unwrap();
    assert_eq!(code, 200, "{body}");
}

/// A token the API server did not authenticate is not reviewed again while cached.
#[tokio::test]
async fn an_unknown_token_is_reviewed_once_while_its_answer_is_cached() {
    let s = setup(true).await;
    for _ in 0..3 {
        assert_eq!(
            request(&s, "GET", "/pods", Some("nobody"), None)
                .await
                .unwrap()
                .0,
            401
        );
    }
    assert_eq!(s.token_reviews.load(Ordering::SeqCst), 1);
}

/// One request over its own TLS connection: the raw response head and body.
async fn raw_request(s: &Setup, token: &str) -> String {
    use tokio::io::AsyncWriteExt;
    let mut tls = tls_connect(s).await;
    tls.write_all(
        format!(
            "GET /pods HTTP/1.1\r\nHost: node-1\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n"
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    tls.flush().await.unwrap();
    String::from_utf8_lossy(&until_closed(tls).await).into_owned()
}

/// An API server that takes requests and never answers: every review stays in flight.
async fn silent_apiserver() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((tcp, _)) = listener.accept().await {
            held.push(tcp);
        }
    });
    format!("http://{addr}")
}

/// A flood of unknown tokens: at most MAX_REVIEWS_IN_FLIGHT TokenReviews are asked at once;
/// the requests beyond get 429 with Retry-After at once instead of queueing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reviews_beyond_the_bound_get_429_with_retry_after() {
    let url = silent_apiserver().await;
    let client = kube::Client::try_from(kube::Config::new(url.parse().unwrap())).unwrap();
    let s = Arc::new(
        setup_auth(
            Some(WebhookAuth::new(client, "node-1")),
            StreamingConfig::default(),
            Arc::default(),
            Arc::default(),
        )
        .await,
    );
    let extra = 5;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut tasks = Vec::new();
    for i in 0..tensile_kubelet::auth::MAX_REVIEWS_IN_FLIGHT + extra {
        let (s, tx) = (s.clone(), tx.clone());
        tasks.push(tokio::spawn(async move {
            let _ = tx.send(raw_request(&s, &format!("bogus-{i}")).await);
        }));
    }
    for _ in 0..extra {
        let response = common::within(30, "a 429", rx.recv()).await.unwrap();
        assert!(
            response.starts_with("HTTP/1.1 429") && response.contains("retry-after: 1\r\n"),
            "{response}"
        );
    }
    // The others are still waiting for the silent API server.
    assert!(rx.try_recv().is_err());
    for t in tasks {
        t.abort();
    }
}
