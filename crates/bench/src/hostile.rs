//! `tensile bench hostile-bodies`: the webhook and the scheduler extender, each its own
//! `tensile` process started with the shipped flags (the extender with `--client-ca-file`, as
//! `deploy/` runs it, and this benchmark holding kube-scheduler's certificate: the worst case,
//! an authenticated client), sent `--parallel` large bodies at once: NUL bytes, deeply nested
//! JSON, and valid requests made wide (a pod of empty containers, a pod of many annotations,
//! and for the extender hundreds of large candidate nodes). Bodies are chunked (no
//! `Content-Length`), so the servers must read them to find out how large they are. Reports
//! each server's peak RSS (`VmHWM` of its process, a fresh one per row) and the answers.

#![allow(clippy::print_stdout)] // the report is what the command prints

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::support::{free_port, listening, memory_mib, spawn};
use anyhow::Context as _;
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tensile_testenv::certs::{Ca, Issued};
use tensile_testenv::{ClusterSpec, TestEnv};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Flags of `tensile bench hostile-bodies`.
#[derive(Debug, clap::Args)]
pub struct HostileBodiesArgs {
    /// Requests sent at once, per row.
    #[arg(long, default_value_t = 16)]
    parallel: usize,
    /// Size of each body, MiB (each row is also sent at just under the server's limit, so that
    /// it is read whole and decoded).
    #[arg(long, default_value_t = 8)]
    body_mib: usize,
    /// The `tensile` binary whose servers are measured (default: this one), e.g. an older build
    /// to compare.
    #[arg(long)]
    binary: Option<PathBuf>,
}

/// The webhook's body limit and the extender's (their `max_body`).
const WEBHOOK_LIMIT: usize = tensile_placement::webhook::MAX_ADMISSION_REVIEW;
const EXTENDER_LIMIT: usize = tensile_placement::extender::MAX_EXTENDER_ARGS;

/// Kinds of body.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Zeros,
    Deep,
    EmptyContainers,
    Annotations,
    Nodes,
    /// A virtual pod just within `POD_SHAPE`: decoded and mutated.
    ContainersAtShape,
    AnnotationsAtShape,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Zeros => "NUL bytes",
            Kind::Deep => "nested [[[...",
            Kind::EmptyContainers => "pod of {} containers",
            Kind::Annotations => "pod of annotations",
            Kind::Nodes => "10 KiB candidate nodes",
            Kind::ContainersAtShape => "pod at the object limit",
            Kind::AnnotationsAtShape => "pod at the value limit",
        }
    }

    /// Whether its size is set by the shape limit rather than asked for.
    fn shaped(self) -> bool {
        matches!(self, Kind::ContainersAtShape | Kind::AnnotationsAtShape)
    }
}

/// A body of about `size` bytes of `kind`, for the webhook (an AdmissionReview) or the
/// extender (ExtenderArgs).
fn body(kind: Kind, size: usize, webhook: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(size + 4096);
    let (pod_open, pod_close) = if webhook {
        (
            r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","kind":{"group":"","version":"v1","kind":"Pod"},"operation":"CREATE","namespace":"default","object":"#,
            "}}",
        )
    } else {
        (r#"{"Pod":"#, r#","NodeNames":["n1"]}"#)
    };
    match kind {
        Kind::Zeros => out.resize(size, 0),
        Kind::Deep => out.resize(size, b'['),
        Kind::EmptyContainers => {
            out.extend_from_slice(pod_open.as_bytes());
            out.extend_from_slice(
                br#"{"metadata":{"name":"p","labels":{"virtual-pod":"true"}},"spec":{"containers":["#,
            );
            while out.len() < size {
                out.extend_from_slice(b"{},");
            }
            out.extend_from_slice(b"{}]}}");
            out.extend_from_slice(pod_close.as_bytes());
        }
        Kind::Annotations => {
            out.extend_from_slice(pod_open.as_bytes());
            out.extend_from_slice(br#"{"metadata":{"name":"p","annotations":{"#);
            let mut i = 0u64;
            while out.len() < size {
                out.extend_from_slice(format!(r#""a{i}":"","#).as_bytes());
                i += 1;
            }
            out.extend_from_slice(br#""a":""}},"spec":{"containers":[{"name":"c"}]}}"#);
            out.extend_from_slice(pod_close.as_bytes());
        }
        Kind::ContainersAtShape => {
            let n = tensile_placement::bounded::POD_SHAPE.containers - 16;
            out.extend_from_slice(pod_open.as_bytes());
            out.extend_from_slice(
                br#"{"metadata":{"name":"p","labels":{"virtual-pod":"true"}},"spec":{"nodeSelector":{"disk":"ssd"},"containers":["#,
            );
            out.extend_from_slice(vec![r#"{"name":"c"}"#; n].join(",").as_bytes());
            out.extend_from_slice(b"]}}");
            out.extend_from_slice(pod_close.as_bytes());
        }
        Kind::AnnotationsAtShape => {
            let n = tensile_placement::bounded::POD_SHAPE.values - 64;
            out.extend_from_slice(pod_open.as_bytes());
            out.extend_from_slice(
                br#"{"metadata":{"name":"p","labels":{"virtual-pod":"true"},"annotations":{"#,
            );
            for i in 0..n {
                out.extend_from_slice(format!(r#""annotation-{i}":"value-{i}","#).as_bytes());
            }
            out.extend_from_slice(
                br#""a":""}},"spec":{"nodeSelector":{"disk":"ssd"},"containers":[{"name":"c"}]}}"#,
            );
            out.extend_from_slice(pod_close.as_bytes());
        }
        Kind::Nodes => {
            out.extend_from_slice(
                br#"{"Pod":{"metadata":{"name":"p","uid":"u"},"spec":{"containers":[{"name":"c"}]}},"NodeNames":null,"Nodes":{"items":["#,
            );
            let images: String = (0..50)
                .map(|i| {
                    format!(
                        r#"{{"names":["registry.example.com/team/image-{i}@sha256:{:064x}","registry.example.com/team/image-{i}:v1.2.3"],"sizeBytes":123456789}}"#,
                        i
                    )
                })
                .collect::<Vec<_>>()
                .join(",");
            let mut i = 0u64;
            while out.len() < size {
                if i > 0 {
                    out.push(b',');
                }
                out.extend_from_slice(
                    format!(
                        r#"{{"metadata":{{"name":"node-{i}","labels":{{"kubernetes.io/hostname":"node-{i}","type":"virtual-kubelet","clusterID":"elsewhere"}}}},"status":{{"images":[{images}]}}}}"#
                    )
                    .as_bytes(),
                );
                i += 1;
            }
            out.extend_from_slice(b"]}}");
        }
    }
    out
}

/// A TLS client trusting `ca_pem`, presenting `identity` when given.
fn client(ca_pem: &str, identity: Option<&Issued>) -> anyhow::Result<Arc<rustls::ClientConfig>> {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(c?)?;
    }
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots);
    let mut config = match identity {
        None => builder.with_no_client_auth(),
        Some(id) => builder.with_client_auth_cert(
            CertificateDer::pem_slice_iter(id.cert_pem.as_bytes()).collect::<Result<_, _>>()?,
            PrivateKeyDer::from_pem_slice(id.key_pem.as_bytes())?,
        )?,
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// POSTs `body` chunked and returns the status (0: no answer, the connection was cut).
async fn send(
    addr: SocketAddr,
    tls: Arc<rustls::ClientConfig>,
    path: &str,
    body: Arc<Vec<u8>>,
) -> u16 {
    let exchange = async {
        let tcp = tokio::net::TcpStream::connect(addr).await.ok()?;
        let mut io = tokio_rustls::TlsConnector::from(tls)
            .connect(ServerName::try_from("localhost").ok()?, tcp)
            .await
            .ok()?;
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
             Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
        );
        io.write_all(head.as_bytes()).await.ok()?;
        // The server may answer (413) and close before it has the whole body.
        for chunk in body.chunks(64 << 10) {
            let framed = [format!("{:x}\r\n", chunk.len()).as_bytes(), chunk, b"\r\n"].concat();
            if io.write_all(&framed).await.is_err() {
                break;
            }
        }
        let _ = io.write_all(b"0\r\n\r\n").await;
        let mut answer = Vec::new();
        let _ = io.read_to_end(&mut answer).await;
        let text = String::from_utf8_lossy(&answer[..answer.len().min(64)]).into_owned();
        text.split(' ').nth(1)?.parse().ok()
    };
    tokio::time::timeout(Duration::from_secs(120), exchange)
        .await
        .ok()
        .flatten()
        .unwrap_or(0)
}

pub async fn run(args: HostileBodiesArgs) -> anyhow::Result<()> {
    let binary = match args.binary {
        Some(b) => b,
        None => std::env::current_exe().context("finding the tensile binary")?,
    };
    let env = TestEnv::start_with(vec![
        ClusterSpec::new("upper", 0),
        ClusterSpec::new("c1", 1),
    ])
    .await
    .context("starting the clusters")?;
    let dir = std::env::temp_dir().join(format!("tensile-hostile-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let write = |name: &str, text: &str| -> anyhow::Result<PathBuf> {
        let path = dir.join(name);
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
        Ok(path)
    };
    // Serving certificates of a CA of the benchmark's, so it can verify them; kube-scheduler's
    // client certificate of another.
    let servers = Ca::new("hostile-bodies-servers")?;
    let serving = servers.issue_server("localhost", &["localhost".into(), "127.0.0.1".into()])?;
    let clients = Ca::new("hostile-bodies-clients")?;
    let scheduler = clients.issue_client("system:kube-scheduler", None)?;
    let cert = write("tls.crt", &serving.cert_pem)?;
    let key = write("tls.key", &serving.key_pem)?;
    let client_ca = write("clients.crt", clients.cert_pem())?;
    let path = |p: &Path| p.display().to_string();

    let upper = path(&env.clusters[0].kubeconfig);
    let lower = path(&env.clusters[1].kubeconfig);
    // As shipped, but for the listen address and the certificate files.
    let start = |server: &str, port: u16| -> Vec<String> {
        let mut a = vec![
            if server == "webhook" {
                "webhook"
            } else {
                "scheduler"
            }
            .to_owned(),
            "--address=127.0.0.1".into(),
            format!("--port={port}"),
            format!("--kubeconfig={upper}"),
        ];
        if server == "webhook" {
            a.push(format!("--tlscert={}", path(&cert)));
            a.push(format!("--tlskey={}", path(&key)));
        } else {
            a.push(format!("--cluster=c1={lower}"));
            a.push(format!("--tls-cert-file={}", path(&cert)));
            a.push(format!("--tls-private-key-file={}", path(&key)));
            a.push(format!("--client-ca-file={}", path(&client_ca)));
        }
        a
    };

    let size = args.body_mib << 20;
    println!(
        "hostile bodies: {} at once per row, {} MiB each and just under each server's limit, \
         chunked; a fresh server process per row",
        args.parallel, args.body_mib
    );
    println!(
        "{:<10} {:<24} {:>9} {:>10} {:>10}  answers",
        "server", "body", "size", "idle RSS", "peak RSS"
    );
    let mut worst: BTreeMap<&str, f64> = BTreeMap::new();
    let webhook_kinds = [
        Kind::Zeros,
        Kind::Deep,
        Kind::EmptyContainers,
        Kind::Annotations,
        Kind::ContainersAtShape,
        Kind::AnnotationsAtShape,
    ];
    let extender_kinds = [
        Kind::Zeros,
        Kind::Deep,
        Kind::EmptyContainers,
        Kind::Annotations,
        Kind::ContainersAtShape,
        Kind::AnnotationsAtShape,
        Kind::Nodes,
    ];
    for (server, tls, path, limit, kinds) in [
        (
            "webhook",
            client(servers.cert_pem(), None)?,
            "/mutate",
            WEBHOOK_LIMIT,
            &webhook_kinds[..],
        ),
        (
            "extender",
            client(servers.cert_pem(), Some(&scheduler))?,
            "/filter",
            EXTENDER_LIMIT,
            &extender_kinds[..],
        ),
    ] {
        for kind in kinds {
            let mut sizes = vec![size, limit - (64 << 10)];
            sizes.dedup();
            if kind.shaped() {
                sizes.truncate(1);
            }
            for size in sizes {
                let body = Arc::new(body(*kind, size, server == "webhook"));
                let port = free_port()?;
                let log = dir.join(format!("{server}.log"));
                let child = spawn(&binary, &start(server, port), &log)?;
                let addr: SocketAddr = ([127, 0, 0, 1], port).into();
                listening(addr, &log, Duration::from_secs(60)).await?;
                // Settled: it listed what it watches.
                tokio::time::sleep(Duration::from_secs(1)).await;
                let pid = child.id().context("the server exited")?;
                let idle = memory_mib(pid).1;
                let sends = (0..args.parallel)
                    .map(|_| tokio::spawn(send(addr, tls.clone(), path, body.clone())))
                    .collect::<Vec<_>>();
                let mut answers: BTreeMap<u16, usize> = BTreeMap::new();
                for s in sends {
                    *answers.entry(s.await.unwrap_or(0)).or_default() += 1;
                }
                let peak = memory_mib(pid).1;
                drop(child);
                let e = worst.entry(server).or_insert(0.0);
                *e = e.max(peak);
                let answers = answers
                    .iter()
                    .map(|(code, n)| format!("{n}x {code}"))
                    .collect::<Vec<_>>()
                    .join(", ");
                println!(
                    "{server:<10} {:<24} {:>5.1} MiB {idle:>6.1} MiB {peak:>6.1} MiB  {answers}",
                    kind.name(),
                    body.len() as f64 / f64::from(1 << 20),
                );
            }
        }
    }
    for (server, peak) in &worst {
        println!("{server}: highest peak RSS {peak:.1} MiB (target: under 64 MiB)");
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
