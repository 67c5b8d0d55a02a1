//! Interop with the real Go client: the machine's kubectl (1.32) against an in-test API front
//! whose streaming subresources are served by this crate. Covers SPDY and WebSocket (v5) exec,
//! exit codes, stdin EOF, attach, and port-forward over SPDY and over the SPDY-in-WebSocket
//! tunnel with parallel connections.

use std::process::Stdio;

use crate::common::front::Front;
use crate::common::within;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};

/// kubectl pointed at the front, isolated from any kubeconfig and cache on the machine.
fn kubectl(front: &Front, cache: &std::path::Path, env: &[(&str, &str)]) -> Command {
    let mut cmd = Command::new("kubectl");
    cmd.arg(format!("--server={}", front.url()))
        .arg("--insecure-skip-tls-verify=true")
        .arg("--token=x")
        .arg(format!("--cache-dir={}", cache.display()))
        .arg("--namespace=ns1")
        .env("KUBECONFIG", cache.join("no-kubeconfig"))
        .env("HOME", cache)
        .kill_on_drop(true)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd
}

struct Ran {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

async fn run(mut cmd: Command, stdin: Option<&[u8]>) -> Ran {
    if stdin.is_some() {
        cmd.stdin(Stdio::piped());
    }
    let mut child = cmd.spawn().expect("kubectl is on PATH");
    if let Some(input) = stdin {
        let mut pipe = child.stdin.take().unwrap();
        let input = input.to_vec();
        // kubectl may stop reading early on failure; the assertions on its output tell.
        tokio::spawn(async move {
            let _ = pipe.write_all(&input).await;
        });
    }
    let out = within(60, "kubectl to finish", child.wait_with_output())
        .await
        .unwrap();
    Ran {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

const SPDY: &[(&str, &str)] = &[("KUBECTL_REMOTE_COMMAND_WEBSOCKETS", "false")];
const WEBSOCKET: &[(&str, &str)] = &[("KUBECTL_REMOTE_COMMAND_WEBSOCKETS", "true")];

fn tmp() -> tempdir::Dir {
    tempdir::Dir::new()
}

/// A throwaway directory (no extra crate for it).
mod tempdir {
    pub struct Dir(pub std::path::PathBuf);
    impl Dir {
        pub fn new() -> Self {
            use std::sync::atomic::{AtomicUsize, Ordering};
            static N: AtomicUsize = AtomicUsize::new(0);
            let p = std::env::temp_dir().join(format!(
                "tensile-kubectl-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::SeqCst)
            ));
            std::fs::create_dir_all(&p).unwrap();
            Self(p)
        }
    }
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

async fn exec_echo(env: &[(&str, &str)], transport: &str, protocol: &str) {
    let front = Front::start().await;
    let dir = tmp();
    let mut cmd = kubectl(&front, &dir.0, env);
    cmd.args(["exec", "pod1", "--", "echo", "hello", "world"]);
    let r = run(cmd, None).await;
    assert_eq!(r.code, Some(0), "stderr: {}", r.stderr);
    assert_eq!(r.stdout, "hello world\n");
    let served = front.served();
    assert_eq!(served.len(), 1, "{served:?}");
    assert_eq!(served[0].transport, transport);
    assert_eq!(served[0].protocol.as_deref(), Some(protocol));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_over_spdy() {
    exec_echo(SPDY, "Spdy", "v5.channel.k8s.io").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_over_websocket_v5() {
    exec_echo(WEBSOCKET, "WebSocket", "v5.channel.k8s.io").await;
}

async fn exec_exit_code(env: &[(&str, &str)]) {
    let front = Front::start().await;
    let dir = tmp();
    let mut cmd = kubectl(&front, &dir.0, env);
    cmd.args(["exec", "pod1", "--", "exit", "3"]);
    let r = run(cmd, None).await;
    assert_eq!(r.code, Some(3), "stdout: {} stderr: {}", r.stdout, r.stderr);
    assert!(r.stderr.contains("exit code 3"), "stderr: {}", r.stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_code_over_spdy() {
    exec_exit_code(SPDY).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_code_over_websocket() {
    exec_exit_code(WEBSOCKET).await;
}

async fn exec_stdin(env: &[(&str, &str)]) {
    let front = Front::start().await;
    let dir = tmp();
    let mut cmd = kubectl(&front, &dir.0, env);
    cmd.args(["exec", "-i", "pod1", "--", "cat"]);
    // Larger than any single buffer on the way, so EOF must follow the data through.
    let input: Vec<u8> = (0..300_000u32).map(|i| b'a' + (i % 26) as u8).collect();
    let r = run(cmd, Some(&input)).await;
    assert_eq!(r.code, Some(0), "stderr: {}", r.stderr);
    assert_eq!(r.stdout.len(), input.len(), "stderr {}", r.stderr);
    assert!(r.stdout.as_bytes() == input.as_slice());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdin_eof_over_spdy() {
    exec_stdin(SPDY).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdin_eof_over_websocket_v5() {
    exec_stdin(WEBSOCKET).await;
}

async fn exec_stderr(env: &[(&str, &str)]) {
    let front = Front::start().await;
    let dir = tmp();
    let mut cmd = kubectl(&front, &dir.0, env);
    cmd.args(["exec", "pod1", "--", "err", "to", "stderr"]);
    let r = run(cmd, None).await;
    assert_eq!(r.code, Some(0), "stderr: {}", r.stderr);
    assert_eq!(r.stdout, "");
    assert!(r.stderr.contains("to stderr\n"), "stderr: {}", r.stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stderr_over_spdy_and_websocket() {
    exec_stderr(SPDY).await;
    exec_stderr(WEBSOCKET).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_errors_reach_the_user() {
    for env in [SPDY, WEBSOCKET] {
        let front = Front::start().await;
        let dir = tmp();
        let mut cmd = kubectl(&front, &dir.0, env);
        cmd.args(["exec", "pod1", "--", "no-such-command"]);
        let r = run(cmd, None).await;
        assert_ne!(r.code, Some(0));
        assert!(r.stderr.contains("unknown command"), "stderr: {}", r.stderr);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attach_over_spdy_and_websocket() {
    for (env, transport) in [(SPDY, "Spdy"), (WEBSOCKET, "WebSocket")] {
        let front = Front::start().await;
        let dir = tmp();
        let mut cmd = kubectl(&front, &dir.0, env);
        cmd.args(["attach", "pod1", "-c", "main"]);
        let r = run(cmd, None).await;
        assert_eq!(r.code, Some(0), "stderr: {}", r.stderr);
        assert!(
            r.stdout.contains("attached to main"),
            "stdout: {}",
            r.stdout
        );
        let served = front.served();
        assert_eq!(served.last().map(|s| s.kind.as_str()), Some("attach"));
        assert_eq!(served.last().map(|s| s.transport.as_str()), Some(transport));
    }
}

/// Starts `kubectl port-forward` and returns the child and the local port it listens on.
async fn port_forward(front: &Front, dir: &std::path::Path, env: &[(&str, &str)]) -> (Child, u16) {
    port_forward_to(front, dir, env, 8080).await
}

/// Starts `kubectl port-forward` to `remote` and returns the child and the local port.
async fn port_forward_to(
    front: &Front,
    dir: &std::path::Path,
    env: &[(&str, &str)],
    remote: u16,
) -> (Child, u16) {
    let mut cmd = kubectl(front, dir, env);
    let target = remote.to_string();
    cmd.args([
        "port-forward",
        "--address=127.0.0.1",
        "pod/pod1",
        &format!(":{target}"),
    ]);
    let mut child = cmd.spawn().expect("kubectl is on PATH");
    let stdout = child.stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    let port = within(60, "kubectl port-forward to listen", async {
        while let Some(line) = lines.next_line().await.unwrap() {
            // "Forwarding from 127.0.0.1:PORT -> 8080"
            if let Some(rest) = line.strip_prefix("Forwarding from 127.0.0.1:")
                && let Some((port, target)) = rest.split_once(" -> ")
                && target.trim() == remote.to_string()
            {
                return port.parse::<u16>().unwrap();
            }
        }
        panic!("kubectl port-forward exited without listening");
    })
    .await;
    // Keep draining stdout ("Handling connection for ...") so kubectl never blocks on it.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    (child, port)
}

async fn echo_through(port: u16, payload: Vec<u8>) -> Vec<u8> {
    let mut conn = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let (mut r, mut w) = conn.split();
    let write = async {
        w.write_all(&payload).await.unwrap();
        w.shutdown().await.unwrap();
    };
    let mut got = Vec::new();
    let read = r.read_to_end(&mut got);
    let ((), n) = tokio::join!(write, read);
    n.unwrap();
    got
}

async fn port_forward_parallel(env: &[(&str, &str)], transport: &str, protocol: &str) {
    let front = Front::start().await;
    let dir = tmp();
    let (mut child, port) = port_forward(&front, &dir.0, env).await;
    let mut tasks = Vec::new();
    for i in 0..8u32 {
        // Distinct payloads so crossed connections would show.
        let payload: Vec<u8> = (0..(50_000 + i * 7919))
            .map(|j| (j.wrapping_mul(31) ^ i) as u8)
            .collect();
        tasks.push(tokio::spawn(async move {
            let got = echo_through(port, payload.clone()).await;
            assert_eq!(got.len(), payload.len(), "connection {i}");
            assert!(got == payload, "connection {i} corrupted");
        }));
    }
    within(60, "parallel forwarded connections", async {
        for t in tasks {
            t.await.unwrap();
        }
    })
    .await;
    // A second round on the same session.
    let got = within(
        30,
        "a later connection",
        echo_through(port, b"again".to_vec()),
    )
    .await;
    assert_eq!(got, b"again");
    child.kill().await.unwrap();
    let served = front.served();
    assert_eq!(
        served.len(),
        1,
        "one upgraded connection carries all: {served:?}"
    );
    assert_eq!(served[0].transport, transport);
    assert_eq!(served[0].protocol.as_deref(), Some(protocol));
    assert!(
        front
            .backend
            .forwards
            .load(std::sync::atomic::Ordering::SeqCst)
            >= 9
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn port_forward_over_spdy() {
    let env = &[("KUBECTL_PORT_FORWARD_WEBSOCKETS", "false")];
    port_forward_parallel(env, "Spdy", "portforward.k8s.io").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn port_forward_over_websocket_tunnel() {
    let env = &[("KUBECTL_PORT_FORWARD_WEBSOCKETS", "true")];
    port_forward_parallel(env, "WebSocket", "SPDY/3.1+portforward.k8s.io").await;
}

/// `echo hello | nc -q1 localhost PORT`: the client writes, half-closes, and still reads the
/// reply of a server that answers only once its input ended (port 7070), over both transports.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn port_forward_replies_after_the_client_half_closes() {
    for ws in ["false", "true"] {
        let front = Front::start().await;
        let dir = tmp();
        let env = [("KUBECTL_PORT_FORWARD_WEBSOCKETS", ws)];
        let (mut child, port) = port_forward_to(&front, &dir.0, &env, 7070).await;
        for round in 0..3 {
            let mut conn = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
            conn.write_all(b"hello\n").await.unwrap();
            conn.shutdown().await.unwrap();
            let mut got = Vec::new();
            within(30, "the reply", conn.read_to_end(&mut got))
                .await
                .unwrap();
            assert_eq!(
                String::from_utf8_lossy(&got),
                "got 6 bytes: hello\n",
                "KUBECTL_PORT_FORWARD_WEBSOCKETS={ws}, round {round}"
            );
        }
        child.kill().await.unwrap();
    }
}

/// A backend failure on one forwarded connection reaches the user; kubectl (1.32) then gives
/// up the whole port-forward, as it does against a real kubelet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn port_forward_errors_reach_kubectl() {
    for ws in ["false", "true"] {
        let front = Front::start().await;
        let dir = tmp();
        let mut cmd = kubectl(&front, &dir.0, &[("KUBECTL_PORT_FORWARD_WEBSOCKETS", ws)]);
        cmd.args(["port-forward", "--address=127.0.0.1", "pod/pod1", ":9999"]);
        let mut child = cmd.spawn().expect("kubectl is on PATH");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let line = within(60, "listening", lines.next_line())
            .await
            .unwrap()
            .unwrap();
        let port: u16 = line
            .strip_prefix("Forwarding from 127.0.0.1:")
            .and_then(|r| r.split(' ').next())
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"));
        let mut conn = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        let mut buf = Vec::new();
        // kubectl closes the local connection without data.
        let _ = within(30, "local connection closed", conn.read_to_end(&mut buf)).await;
        assert!(buf.is_empty());
        let status = within(30, "kubectl exits", child.wait()).await.unwrap();
        assert_eq!(status.code(), Some(1));
        let mut err = String::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .await
            .unwrap();
        assert!(
            err.contains("error forwarding port 9999 to pod pod1")
                && err.contains("connection refused"),
            "websockets={ws}: {err}"
        );
    }
}
