#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stdout
)]
//! Streaming benchmarks (a program, not a test):
//!
//! 1. port-forward throughput through one SPDY session over loopback TCP, one forwarded
//!    connection, pod side in memory: download (pod -> client), upload (client -> pod), echo;
//! 2. exec start-to-first-byte: TCP connect, HTTP/1.1 upgrade to SPDY through hyper, open the
//!    error and stdout streams, first stdout byte of `echo`.
//!
//! Run: `cargo run --release -p tensile-kubelet --example stream_bench [MiB]`

#[path = "../tests/common/spdy_client.rs"]
#[allow(dead_code)]
mod spdy_client;

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use spdy_client::{Client, Event};
use tensile_kubelet::spdy::Headers;
use tensile_kubelet::{
    AttachRequest, BackendError, ExecIo, ExecRequest, ExitStatus, PodRef, PortForwardRequest,
    PortForwardStream, RemoteCommandUpgrade, StreamBackend, StreamOptions, StreamingConfig,
    command_from_query, serve_exec, serve_portforward_spdy,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const CHUNK: usize = 64 * 1024;

/// Port 1 echoes, port 2 sends `size` bytes, port 3 swallows everything.
struct Bench {
    size: usize,
}

impl StreamBackend for Bench {
    async fn exec(&self, request: ExecRequest, mut io: ExecIo) -> ExitStatus {
        if let Some(out) = io.stdout.as_mut() {
            let line = format!("{}\n", request.command[1..].join(" "));
            let _ = out.write_all(line.as_bytes()).await;
        }
        ExitStatus::Success
    }

    async fn attach(&self, _: AttachRequest, _: ExecIo) -> ExitStatus {
        ExitStatus::Success
    }

    async fn port_forward(&self, r: PortForwardRequest) -> Result<PortForwardStream, BackendError> {
        let (ours, mut theirs) = tokio::io::duplex(256 * 1024);
        let size = self.size;
        tokio::spawn(async move {
            match r.port {
                1 => {
                    let (mut rd, mut wr) = tokio::io::split(theirs);
                    let _ = tokio::io::copy(&mut rd, &mut wr).await;
                    let _ = wr.shutdown().await;
                }
                2 => {
                    let block = vec![0x5au8; CHUNK];
                    let mut left = size;
                    while left > 0 {
                        let n = left.min(CHUNK);
                        if theirs.write_all(&block[..n]).await.is_err() {
                            return;
                        }
                        left -= n;
                    }
                    let _ = theirs.shutdown().await;
                }
                _ => {
                    let mut buf = vec![0u8; CHUNK];
                    while let Ok(n) = theirs.read(&mut buf).await {
                        if n == 0 {
                            break;
                        }
                    }
                    let _ = theirs.shutdown().await;
                }
            }
        });
        Ok(PortForwardStream::new(ours))
    }
}

fn pod() -> PodRef {
    PodRef {
        namespace: "bench".into(),
        name: "pod".into(),
        uid: None,
    }
}

async fn forwarding_session(size: usize) -> Client {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        tcp.set_nodelay(true).unwrap();
        let backend = Arc::new(Bench { size });
        let _ = serve_portforward_spdy(tcp, pod(), backend, &StreamingConfig::default()).await;
    });
    let tcp = TcpStream::connect(addr).await.unwrap();
    tcp.set_nodelay(true).unwrap();
    Client::new(tcp)
}

fn pf_headers(kind: &str, port: u16, id: u32) -> Headers {
    Headers::new()
        .with("streamtype", kind)
        .with("port", port.to_string())
        .with("requestid", id.to_string())
}

fn mbps(bytes: usize, d: Duration) -> f64 {
    bytes as f64 / d.as_secs_f64() / 1e6
}

async fn bench_forward(size: usize) {
    let client = forwarding_session(size).await;
    let block = vec![0xa5u8; CHUNK];
    for (id, (port, name)) in [(2u16, "download"), (3, "upload"), (1, "echo")]
        .iter()
        .enumerate()
    {
        let id = id as u32;
        let _error = client.open(pf_headers("error", *port, id)).await;
        let mut data = client.open(pf_headers("data", *port, id)).await;
        let start = Instant::now();
        let (sent, received) = match *port {
            2 => (0, drain(&mut data).await),
            3 => {
                send(&data.sender(), &block, size).await;
                data.fin().await.unwrap();
                (size, drain(&mut data).await)
            }
            _ => {
                let tx = data.sender();
                let writer = async {
                    send(&tx, &block, size).await;
                    tx.fin().await.unwrap();
                };
                let reader = async {
                    let mut n = 0;
                    while let Some(ev) = data_rx(&mut data).await {
                        n += ev;
                    }
                    n
                };
                let ((), n) = tokio::join!(writer, reader);
                (size, n)
            }
        };
        let took = start.elapsed();
        let moved = sent.max(received);
        println!(
            "port-forward {name:>8}: {:>6} MiB in {:>7.1} ms = {:>7.0} MB/s",
            moved >> 20,
            took.as_secs_f64() * 1e3,
            mbps(moved, took)
        );
    }
}

async fn send(data: &spdy_client::StreamSender, block: &[u8], size: usize) {
    let mut left = size;
    while left > 0 {
        let n = left.min(block.len());
        data.write(&block[..n]).await.unwrap();
        left -= n;
    }
}

async fn data_rx(data: &mut spdy_client::ClientStream) -> Option<usize> {
    loop {
        match data.next_event().await? {
            Event::Data(d) => return Some(d.len()),
            Event::Fin | Event::Reset(_) => return None,
            Event::Reply => {}
        }
    }
}

async fn drain(data: &mut spdy_client::ClientStream) -> usize {
    let mut n = 0;
    while let Some(k) = data_rx(data).await {
        n += k;
    }
    n
}

/// An HTTP/1.1 server that upgrades `/exec` requests like the kubelet API will.
async fn exec_server() -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let backend = Arc::new(Bench { size: 0 });
    tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            tcp.set_nodelay(true).unwrap();
            let backend = Arc::clone(&backend);
            tokio::spawn(async move {
                let svc = service_fn(move |mut req: http::Request<hyper::body::Incoming>| {
                    let backend = Arc::clone(&backend);
                    async move {
                        let query = req.uri().query().unwrap_or_default().to_string();
                        let upgrade = RemoteCommandUpgrade::negotiate(req.headers()).unwrap();
                        let request = ExecRequest {
                            pod: pod(),
                            container: "c".into(),
                            command: command_from_query(&query).unwrap(),
                            options: StreamOptions::from_query(&query).unwrap(),
                        };
                        let response = upgrade.response();
                        let on = hyper::upgrade::on(&mut req);
                        tokio::spawn(async move {
                            let io = TokioIo::new(on.await.unwrap());
                            let config = StreamingConfig::default();
                            let _ = serve_exec(&upgrade, io, request, backend, &config).await;
                        });
                        Ok::<_, Infallible>(response.map(|()| Full::new(Bytes::new())))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tcp), svc)
                    .with_upgrades()
                    .await;
            });
        }
    });
    addr
}

async fn one_exec(addr: std::net::SocketAddr) -> Duration {
    let start = Instant::now();
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    tcp.set_nodelay(true).unwrap();
    tcp.write_all(
        b"POST /exec/bench/pod/c?command=echo&command=hi&output=1 HTTP/1.1\r\n\
          Host: bench\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n\
          X-Stream-Protocol-Version: v4.channel.k8s.io\r\n\r\n",
    )
    .await
    .unwrap();
    // Read the 101 head byte by byte so no SPDY byte is swallowed.
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        tcp.read_exact(&mut b).await.unwrap();
        head.push(b[0]);
    }
    assert!(
        head.starts_with(b"HTTP/1.1 101"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    let client = Client::new(tcp);
    let _error = client
        .open(Headers::new().with("streamtype", "error"))
        .await;
    let mut stdout = client
        .open(Headers::new().with("streamtype", "stdout"))
        .await;
    let first = loop {
        match stdout.next_event().await.unwrap() {
            Event::Data(_) => break start.elapsed(),
            Event::Reply => {}
            other => panic!("unexpected {other:?}"),
        }
    };
    client.close().await;
    first
}

async fn bench_exec(runs: usize) {
    let addr = exec_server().await;
    for _ in 0..20 {
        one_exec(addr).await; // warm up
    }
    let mut times = Vec::with_capacity(runs);
    for _ in 0..runs {
        times.push(one_exec(addr).await);
    }
    times.sort();
    let pct = |p: f64| times[((times.len() as f64 * p) as usize).min(times.len() - 1)];
    println!(
        "exec start-to-first-byte over {runs} runs: p50 {:.3} ms, p90 {:.3} ms, p99 {:.3} ms",
        pct(0.5).as_secs_f64() * 1e3,
        pct(0.9).as_secs_f64() * 1e3,
        pct(0.99).as_secs_f64() * 1e3
    );
}

fn main() {
    let mib: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1024);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        bench_forward(mib << 20).await;
        bench_exec(500).await;
    });
}
