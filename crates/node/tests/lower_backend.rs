//! The virtual node's kubelet backend against a simulated lower cluster: logs, exec, attach,
//! port-forward and stats are forwarded to our lower pods only; anything else is "not found".

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use serde_json::json;
use tensile_kubelet::{
    AttachRequest, Auth, ExecIo, ExecRequest, ExitStatus, KubeletBackend, KubeletServer,
    KubeletServerConfig, LogOptions, PodRef, PortForwardRequest, ServingCert, StreamBackend,
    StreamOptions, StreamingConfig,
};
use tensile_node::lower_backend::LowerBackend;
use tensile_testenv::TestEnv;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

use crate::common;

const NS: &str = "default";
const OURS: &str = "web";
const FOREIGN: &str = "foreign";
const UPPER_UID: &str = "0b7c3f52-upper-uid-web";

fn lower_pod(name: &str, ours: bool) -> Pod {
    let (labels, annotations) = if ours {
        (
            json!({"app": "web", "tensile-kube.io/owner": "vk-1"}),
            json!({"tensile-kube.io/upper-uid": UPPER_UID}),
        )
    } else {
        (json!({"app": "web"}), json!({}))
    };
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": labels, "annotations": annotations},
        "spec": {"containers": [{
            "name": "main",
            "image": "busybox",
            "command": ["sh", "-c", "echo hello; sleep 100000"],
            "resources": {"requests": {"cpu": "250m", "memory": "64Mi"}},
            "ports": [{"containerPort": 8080}]
        }]}
    }))
    .unwrap()
}

fn upper_pod() -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": OURS, "namespace": NS, "uid": UPPER_UID},
        "spec": {"nodeName": "vk-1", "containers": [{"name": "main", "image": "busybox"}]}
    }))
    .unwrap()
}

async fn wait_running(api: &Api<Pod>, name: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let pod = api.get(name).await.unwrap();
        if pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running") {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "pod {name} not Running: {:?}",
            pod.status
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A lower cluster with our pod and a foreign one, both Running, and the backend.
async fn setup() -> (TestEnv, LowerBackend) {
    let env = TestEnv::start(1).await.unwrap();
    let lower = env.clusters[0].client.clone();
    let api: Api<Pod> = Api::namespaced(lower.clone(), NS);
    for (name, ours) in [(OURS, true), (FOREIGN, false)] {
        api.create(&PostParams::default(), &lower_pod(name, ours))
            .await
            .unwrap();
    }
    for name in [OURS, FOREIGN] {
        wait_running(&api, name).await;
    }
    let backend = LowerBackend::new(lower, "vk-1".into(), || vec![upper_pod()]);
    (env, backend)
}

fn pod(name: &str, uid: Option<&str>) -> PodRef {
    PodRef {
        namespace: NS.into(),
        name: name.into(),
        uid: uid.map(str::to_owned),
    }
}

fn out_only() -> StreamOptions {
    StreamOptions {
        stdout: true,
        ..StreamOptions::default()
    }
}

/// Streams for a command: stdout captured in memory, stdin fed from the returned writer when
/// asked for.
struct Pipes {
    io: ExecIo,
    stdin: Option<DuplexStream>,
    stdout: DuplexStream,
}

fn pipes(stdin: bool) -> Pipes {
    let (out_ours, out_theirs) = tokio::io::duplex(64 * 1024);
    let (stdin_ours, stdin_theirs) = if stdin {
        let (a, b) = tokio::io::duplex(64 * 1024);
        (Some(a), Some(b))
    } else {
        (None, None)
    };
    Pipes {
        io: ExecIo {
            stdin: stdin_theirs.map(|s| Box::new(s) as _),
            stdout: Some(Box::new(out_theirs)),
            stderr: None,
            tty: false,
            resize: None,
        },
        stdin: stdin_ours,
        stdout: out_ours,
    }
}

async fn read_all(mut r: DuplexStream) -> String {
    let mut s = String::new();
    tokio::time::timeout(Duration::from_secs(20), r.read_to_string(&mut s))
        .await
        .expect("stdout ends")
        .unwrap();
    s
}

async fn exec(backend: &LowerBackend, pod: PodRef, command: &[&str]) -> (ExitStatus, String) {
    let p = pipes(false);
    let request = ExecRequest {
        pod,
        container: "main".into(),
        command: command.iter().map(|s| (*s).to_owned()).collect(),
        options: out_only(),
    };
    let (status, out) = tokio::join!(
        async {
            tokio::time::timeout(Duration::from_secs(20), backend.exec(request, p.io))
                .await
                .expect("exec ends")
        },
        read_all(p.stdout)
    );
    (status, out)
}

#[tokio::test]
async fn logs_exec_attach_and_port_forward_reach_our_lower_pod() {
    let (_env, backend) = setup().await;

    // Logs, the tail only.
    let stream = backend
        .logs(
            pod(OURS, None),
            "main".into(),
            LogOptions {
                tail_lines: Some(1),
                ..LogOptions::default()
            },
        )
        .await
        .unwrap();
    let chunks: Vec<_> = stream.collect().await;
    let text: String = chunks
        .into_iter()
        .map(|c| String::from_utf8(c.unwrap().to_vec()).unwrap())
        .collect();
    assert_eq!(text, "hello\n");

    // Logs, following: a few chunks, then the client leaves.
    let mut stream = backend
        .logs(
            pod(OURS, None),
            "main".into(),
            LogOptions {
                follow: true,
                ..LogOptions::default()
            },
        )
        .await
        .unwrap();
    let mut seen = String::new();
    while !seen.contains("tick 1\n") {
        let chunk = tokio::time::timeout(Duration::from_secs(10), stream.next())
            .await
            .expect("a chunk within 10 s")
            .expect("the stream goes on")
            .unwrap();
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert!(
        seen.starts_with("container main of pod web started (image busybox)\nhello\n"),
        "{seen}"
    );
    drop(stream);

    // Exec, with the upper UID given as the `{uid}` routes do.
    let (status, out) = exec(
        &backend,
        pod(OURS, Some(UPPER_UID)),
        &["echo", "hi", "there"],
    )
    .await;
    assert_eq!((status, out.as_str()), (ExitStatus::Success, "hi there\n"));
    let (status, _) = exec(&backend, pod(OURS, None), &["exit", "3"]).await;
    assert_eq!(status, ExitStatus::ExitCode(3));
    let (status, _) = exec(&backend, pod(OURS, None), &["no-such-binary"]).await;
    assert!(
        matches!(&status, ExitStatus::Error(m) if m.contains("no-such-binary")),
        "{status:?}"
    );

    // Exec `cat`: stdin until EOF comes back on stdout.
    let p = pipes(true);
    let mut stdin = p.stdin.unwrap();
    let request = ExecRequest {
        pod: pod(OURS, None),
        container: "main".into(),
        command: vec!["cat".into()],
        options: StreamOptions {
            stdin: true,
            stdout: true,
            ..StreamOptions::default()
        },
    };
    let feed = async move {
        stdin.write_all(b"line one\nline two\n").await.unwrap();
        stdin.shutdown().await.unwrap();
        stdin
    };
    let (status, out, _stdin) = tokio::join!(
        async {
            tokio::time::timeout(Duration::from_secs(20), backend.exec(request, p.io))
                .await
                .expect("cat ends at stdin EOF")
        },
        read_all(p.stdout),
        feed
    );
    assert_eq!(
        (status, out.as_str()),
        (ExitStatus::Success, "line one\nline two\n")
    );

    // Attach: the main process greets and echoes stdin.
    let p = pipes(true);
    let mut stdin = p.stdin.unwrap();
    let mut stdout = p.stdout;
    let request = AttachRequest {
        pod: pod(OURS, None),
        container: "main".into(),
        options: StreamOptions {
            stdin: true,
            stdout: true,
            ..StreamOptions::default()
        },
    };
    let client = async move {
        let mut seen = Vec::new();
        let mut buf = [0u8; 1024];
        while !String::from_utf8_lossy(&seen).contains("attached to main\n") {
            let n = stdout.read(&mut buf).await.unwrap();
            assert!(n > 0, "stdout ended early: {seen:?}");
            seen.extend_from_slice(&buf[..n]);
        }
        stdin.write_all(b"ping\n").await.unwrap();
        while !String::from_utf8_lossy(&seen).contains("ping\n") {
            let n = stdout.read(&mut buf).await.unwrap();
            assert!(n > 0, "stdout ended early: {seen:?}");
            seen.extend_from_slice(&buf[..n]);
        }
        stdin.shutdown().await.unwrap();
        let mut rest = String::new();
        stdout.read_to_string(&mut rest).await.unwrap();
        (String::from_utf8(seen).unwrap(), stdin)
    };
    let (status, (seen, _stdin)) = tokio::time::timeout(
        Duration::from_secs(20),
        futures::future::join(backend.attach(request, p.io), client),
    )
    .await
    .expect("attach ends at stdin EOF");
    assert_eq!(status, ExitStatus::Success);
    assert_eq!(seen, "attached to main\nping\n");

    // Port-forward: a round trip through the echo server on the declared port.
    let mut forwarded = backend
        .port_forward(PortForwardRequest {
            pod: pod(OURS, Some(UPPER_UID)),
            port: 8080,
        })
        .await
        .unwrap();
    assert!(forwarded.error.is_some(), "the error channel is passed on");
    forwarded.io.write_all(b"hello port").await.unwrap();
    let mut buf = [0u8; 10];
    tokio::time::timeout(Duration::from_secs(10), forwarded.io.read_exact(&mut buf))
        .await
        .expect("echo within 10 s")
        .unwrap();
    assert_eq!(&buf, b"hello port");
    forwarded.io.shutdown().await.unwrap();
    drop(forwarded);
}

/// A client that sends everything then half-closes (what `nc -q1` does at the end of its input)
/// still gets the whole reply: the half-close reaches the lower pod as the end of its input, and
/// the reply keeps flowing back until the pod's side ends.
#[tokio::test]
async fn port_forward_passes_a_half_close_down_and_the_reply_back() {
    let (_env, backend) = setup().await;
    for round in 0..3 {
        let mut forwarded = backend
            .port_forward(PortForwardRequest {
                pod: pod(OURS, Some(UPPER_UID)),
                port: 8080,
            })
            .await
            .unwrap();
        let msg = format!("hello {round}\n");
        forwarded.io.write_all(msg.as_bytes()).await.unwrap();
        forwarded.io.shutdown().await.unwrap();
        let mut got = Vec::new();
        tokio::time::timeout(Duration::from_secs(20), forwarded.io.read_to_end(&mut got))
            .await
            .expect("the pod's side ends within 20 s")
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&got), msg, "round {round}");
    }
}

/// `kubectl port-forward` to a pod of the virtual node, then a client that writes and
/// half-closes (`echo hello | nc -q1 localhost PORT`), over both kubectl transports.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_port_forward_through_the_virtual_node_survives_a_half_close() {
    use std::io::{Read, Write};
    use std::net::{Shutdown, TcpStream};
    use std::process::{Command, Stdio};

    let env = common::clusters().await;
    let stop = common::spawn_node(&env, "vk-lower").await;
    let upper = env.clusters[0].client.clone();
    common::run_pod_spec(
        &upper,
        "web",
        json!({"containers": [{"name": "c", "image": "nginx:1.27",
            "ports": [{"containerPort": 80}]}]}),
    )
    .await;
    let kubeconfig = env.clusters[0].kubeconfig.clone();
    tokio::task::spawn_blocking(move || {
        for websockets in ["false", "true"] {
            let mut pf = Killed(
                Command::new("kubectl")
                    .arg("--kubeconfig")
                    .arg(&kubeconfig)
                    .args(["port-forward", "pod/web", ":80"])
                    .env("KUBECTL_PORT_FORWARD_WEBSOCKETS", websockets)
                    .stdout(Stdio::piped())
                    .stderr(Stdio::null())
                    .spawn()
                    .unwrap(),
            );
            let port = tensile_testenv::forwarded_port(pf.0.stdout.take().unwrap()).unwrap();
            for round in 0..3 {
                let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
                s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
                let msg = format!("hello {round}\n");
                s.write_all(msg.as_bytes()).unwrap();
                s.shutdown(Shutdown::Write).unwrap();
                let mut got = Vec::new();
                s.read_to_end(&mut got).unwrap();
                assert_eq!(
                    String::from_utf8_lossy(&got),
                    msg,
                    "KUBECTL_PORT_FORWARD_WEBSOCKETS={websockets}, round {round}"
                );
            }
        }
    })
    .await
    .unwrap();
    stop.cancel();
}

/// A child process killed when the test ends, pass or fail.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn pods_not_ours_or_of_another_uid_are_not_found_and_nothing_is_forwarded() {
    let (_env, backend) = setup().await;
    let not_found = |m: &str| m.contains("not found");

    for target in [
        pod(FOREIGN, None),
        pod(FOREIGN, Some(UPPER_UID)),
        pod(OURS, Some("another-uid")),
        pod("missing", None),
        pod("..", None),
        pod("", None),
    ] {
        let e = backend
            .logs(target.clone(), "main".into(), LogOptions::default())
            .await
            .err()
            .unwrap_or_else(|| panic!("logs of {target:?} were served"));
        assert!(not_found(&e.0), "{target:?}: {e}");

        let (status, out) = exec(&backend, target.clone(), &["echo", "leak"]).await;
        assert!(
            matches!(&status, ExitStatus::Error(m) if not_found(m)),
            "{target:?}: {status:?}"
        );
        assert_eq!(out, "", "{target:?}: nothing ran");

        let p = pipes(true);
        let status = backend
            .attach(
                AttachRequest {
                    pod: target.clone(),
                    container: "main".into(),
                    options: StreamOptions {
                        stdin: true,
                        stdout: true,
                        ..StreamOptions::default()
                    },
                },
                p.io,
            )
            .await;
        assert!(
            matches!(&status, ExitStatus::Error(m) if not_found(m)),
            "{target:?}: {status:?}"
        );
        assert_eq!(read_all(p.stdout).await, "", "{target:?}: not attached");

        let e = backend
            .port_forward(PortForwardRequest {
                pod: target.clone(),
                port: 8080,
            })
            .await
            .err()
            .unwrap_or_else(|| panic!("port-forward to {target:?} was opened"));
        assert!(not_found(&e.0), "{target:?}: {e}");
    }

    // A foreign pod is indistinguishable from a missing one.
    let foreign = backend
        .logs(pod(FOREIGN, None), "main".into(), LogOptions::default())
        .await
        .err()
        .unwrap();
    let missing = backend
        .logs(
            pod("nothing-here", None),
            "main".into(),
            LogOptions::default(),
        )
        .await
        .err()
        .unwrap();
    assert_eq!(
        foreign.0.replace(FOREIGN, "X"),
        missing.0.replace("nothing-here", "X")
    );
}

#[tokio::test]
async fn stats_cover_only_our_pods_with_upper_identity_and_pods_come_from_the_provider() {
    let (_env, backend) = setup().await;

    let pods = backend.pods().await.unwrap();
    assert_eq!(pods.len(), 1);
    assert_eq!(pods[0].metadata.name.as_deref(), Some(OURS));
    assert_eq!(pods[0].metadata.uid.as_deref(), Some(UPPER_UID));

    // Our running pod is listed at once; the lower metrics API scrapes the simulated
    // kubelets: wait for its usage.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let summary = loop {
        let s = backend.stats().await.unwrap();
        assert_eq!(s.pods.len(), 1, "only ours, at once: {:?}", s.pods);
        let used = |p: &tensile_kubelet::stats::PodStats| {
            p.cpu.as_ref().and_then(|c| c.usage_nano_cores) > Some(0)
        };
        if s.pods.iter().any(used) {
            break s;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no pod metrics: {s:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(summary.node.node_name, "vk-1");
    assert_eq!(summary.pods.len(), 1, "only ours: {:?}", summary.pods);
    let p = &summary.pods[0];
    assert_eq!(
        (
            p.pod_ref.namespace.as_str(),
            p.pod_ref.name.as_str(),
            p.pod_ref.uid.as_str()
        ),
        (NS, OURS, UPPER_UID)
    );
    let cpu = p.cpu.as_ref().unwrap();
    // metrics-server derives the rate from two cumulative samples taken at slightly
    // different moments, so a steady 250m reads within a hair of it, not exactly.
    let near_250m = |n: Option<u64>| n.is_some_and(|n| n.abs_diff(250_000_000) <= 5_000_000);
    assert!(near_250m(cpu.usage_nano_cores), "{cpu:?}");
    assert!(cpu.usage_core_nano_seconds.is_some());
    assert_eq!(p.memory.as_ref().unwrap().working_set_bytes, Some(64 << 20));
    assert_eq!(p.containers.len(), 1);
    assert_eq!(p.containers[0].name, "main");
    assert_eq!(
        summary.node.cpu.as_ref().unwrap().usage_nano_cores,
        cpu.usage_nano_cores,
        "the node is the sum of our pods"
    );
    assert_eq!(
        summary.node.memory.as_ref().unwrap().working_set_bytes,
        Some(64 << 20)
    );

    let named = LowerBackend::new(_env.clusters[0].client.clone(), "vk-1".into(), Vec::new)
        .with_node_name("virtual-node-a");
    assert_eq!(
        named.stats().await.unwrap().node.node_name,
        "virtual-node-a"
    );
}

/// An API server without metrics-server: `metrics.k8s.io` (every path but the pod list) is a
/// 404 `Status`; the pod list is `pods`.
async fn empty_apiserver(pods: serde_json::Value) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut tcp, _)) = listener.accept().await else {
                return;
            };
            let pods = pods.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match tcp.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let (status, body) = if head.starts_with(b"GET /api/v1/pods?") {
                    let list = json!({"kind": "PodList", "apiVersion": "v1",
                        "metadata": {"resourceVersion": "1"}, "items": pods});
                    ("200 OK", list.to_string())
                } else {
                    let status = json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
                        "status": "Failure", "message": "the server could not find the requested resource",
                        "reason": "NotFound", "code": 404});
                    ("404 Not Found", status.to_string())
                };
                let response = format!(
                    "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = tcp.write_all(response.as_bytes()).await;
                let _ = tcp.shutdown().await;
            });
        }
    });
    format!("http://{addr}")
}

/// Without metrics, the running pods are still listed, every container with zero usage (a pod
/// not running yet is not).
#[tokio::test]
async fn a_lower_cluster_without_metrics_lists_the_running_pods_with_no_usage() {
    let mut running = serde_json::to_value(lower_pod(OURS, true)).unwrap();
    running["spec"]["containers"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "side", "image": "busybox"}));
    running["status"] = json!({"phase": "Running"});
    let mut pending = serde_json::to_value(lower_pod("later", true)).unwrap();
    pending["status"] = json!({"phase": "Pending"});
    let url = empty_apiserver(json!([running, pending])).await;
    let client = kube::Client::try_from(kube::Config::new(url.parse().unwrap())).unwrap();
    let backend = LowerBackend::new(client, "vk-1".into(), Vec::new);
    let s = backend.stats().await.unwrap();
    assert_eq!(s.node.node_name, "vk-1");
    assert_eq!(s.pods.len(), 1, "{:?}", s.pods);
    let p = &s.pods[0];
    assert_eq!(
        (p.pod_ref.name.as_str(), p.pod_ref.uid.as_str()),
        (OURS, UPPER_UID)
    );
    let names: Vec<&str> = p.containers.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["main", "side"]);
    for c in &p.containers {
        assert_eq!(c.cpu.as_ref().and_then(|c| c.usage_nano_cores), Some(0));
        assert_eq!(c.memory.as_ref().and_then(|m| m.working_set_bytes), Some(0));
    }
    assert_eq!(
        s.node.cpu.as_ref().and_then(|c| c.usage_nano_cores),
        Some(0)
    );
}

/// A kubelet server over `backend` without authentication (the backend is what is tested), and
/// a plain HTTPS client of it (kube-rs' HTTP stack, nothing Kubernetes-specific in the
/// requests; the certificate is self-signed).
async fn open_kubelet(backend: LowerBackend) -> (KubeletServer, kube::Client) {
    let server = KubeletServer::start(
        KubeletServerConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            cert: ServingCert::SelfSigned {
                sans: vec!["127.0.0.1".into()],
            },
            client_ca_pem: None,
            auth: Auth::Disabled,
            streaming: StreamingConfig::default(),
        },
        Arc::new(backend),
    )
    .await
    .unwrap();
    let mut config = kube::Config::new(
        format!("https://{}", server.addr())
            .parse::<http::Uri>()
            .unwrap(),
    );
    config.accept_invalid_certs = true;
    (server, kube::Client::try_from(config).unwrap())
}

/// On a lower cluster: a pod that has just started is in `/stats/summary` and
/// `/metrics/resource` of the kubelet port at once, with every container, before the lower
/// metrics API has any usage for it (the first scrape is cached: the simulator's for 5 s,
/// metrics-server's until its next round).
#[tokio::test]
async fn a_pod_is_in_the_kubelet_stats_as_soon_as_it_runs_with_every_container() {
    let (env, backend) = setup().await;
    let (_server, client) = open_kubelet(backend).await;
    let get = |path: &str| http::Request::get(path).body(Vec::new()).unwrap();
    let summary = || async {
        let text = client.request_text(get("/stats/summary")).await.unwrap();
        serde_json::from_str::<serde_json::Value>(&text).unwrap()
    };
    // A first scrape, before the new pod exists.
    summary().await;
    let api: Api<Pod> = Api::namespaced(env.clusters[0].client.clone(), NS);
    let mut two = serde_json::to_value(lower_pod("two", true)).unwrap();
    two["spec"]["containers"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "side", "image": "busybox", "command": ["sh", "-c", "sleep 100000"]}));
    api.create(
        &PostParams::default(),
        &serde_json::from_value(two).unwrap(),
    )
    .await
    .unwrap();
    wait_running(&api, "two").await;
    let s = summary().await;
    let pod = s["pods"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["podRef"]["name"] == "two")
        .unwrap_or_else(|| panic!("two is not listed: {s}"))
        .clone();
    let names: Vec<&str> = pod["containers"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect();
    assert_eq!(names, ["main", "side"], "{pod}");
    assert!(pod["cpu"]["usageNanoCores"].is_u64(), "{pod}");
    let resource = client.request_text(get("/metrics/resource")).await.unwrap();
    for series in [
        "pod_cpu_usage_seconds_total{namespace=\"default\",pod=\"two\"}",
        "container_cpu_usage_seconds_total{container=\"main\",namespace=\"default\",pod=\"two\"}",
        "container_memory_working_set_bytes{container=\"side\",namespace=\"default\",pod=\"two\"}",
    ] {
        assert!(resource.contains(series), "{series} in\n{resource}");
    }
}

#[tokio::test]
async fn the_kubelet_server_serves_lower_logs_over_https() {
    let (_env, backend) = setup().await;
    let (_server, client) = open_kubelet(backend).await;
    let get = |path: &str| http::Request::get(path).body(Vec::new()).unwrap();

    let text = client
        .request_text(get("/containerLogs/default/web/main?tailLines=1"))
        .await
        .unwrap();
    assert_eq!(text, "hello\n");
    let text = client
        .request_text(get("/containerLogs/default/web/main?timestamps=true"))
        .await
        .unwrap();
    assert!(text.ends_with(" hello\n"), "{text}");

    let refused = client
        .request_text(get("/containerLogs/default/foreign/main"))
        .await
        .unwrap_err();
    assert!(
        matches!(&refused, kube::Error::Api(s) if s.code == 404),
        "{refused:?}"
    );

    let pods: serde_json::Value =
        serde_json::from_str(&client.request_text(get("/pods")).await.unwrap()).unwrap();
    assert_eq!(pods["items"][0]["metadata"]["uid"], UPPER_UID);
}

#[tokio::test]
async fn stderr_and_terminal_streams_are_passed_through() {
    let (_env, backend) = setup().await;

    // stdout and stderr both requested: each ends when the command does.
    let (out_ours, out_theirs) = tokio::io::duplex(64 * 1024);
    let (err_ours, err_theirs) = tokio::io::duplex(64 * 1024);
    let io = ExecIo {
        stdin: None,
        stdout: Some(Box::new(out_theirs)),
        stderr: Some(Box::new(err_theirs)),
        tty: false,
        resize: None,
    };
    let request = ExecRequest {
        pod: pod(OURS, None),
        container: "main".into(),
        command: vec!["hostname".into()],
        options: StreamOptions {
            stdout: true,
            stderr: true,
            ..StreamOptions::default()
        },
    };
    let (status, out, err) = tokio::join!(
        async {
            tokio::time::timeout(Duration::from_secs(20), backend.exec(request, io))
                .await
                .expect("exec ends")
        },
        read_all(out_ours),
        read_all(err_ours)
    );
    assert_eq!(
        (status, out.as_str(), err.as_str()),
        (ExitStatus::Success, "web\n", "")
    );

    // A terminal: resize events are forwarded while the command runs.
    let (mut stdin, stdin_theirs) = tokio::io::duplex(64 * 1024);
    let (out_ours, out_theirs) = tokio::io::duplex(64 * 1024);
    let (resize_tx, resize_rx) = tokio::sync::mpsc::channel(4);
    let io = ExecIo {
        stdin: Some(Box::new(stdin_theirs)),
        stdout: Some(Box::new(out_theirs)),
        stderr: None,
        tty: true,
        resize: Some(resize_rx),
    };
    let request = ExecRequest {
        pod: pod(OURS, None),
        container: "main".into(),
        command: vec!["cat".into()],
        options: StreamOptions {
            stdin: true,
            stdout: true,
            tty: true,
            ..StreamOptions::default()
        },
    };
    let client = async move {
        resize_tx
            .send(tensile_kubelet::TerminalSize {
                width: 120,
                height: 40,
            })
            .await
            .unwrap();
        stdin.write_all(b"typed\n").await.unwrap();
        stdin.shutdown().await.unwrap();
        (stdin, resize_tx)
    };
    let (status, out, _client) = tokio::join!(
        async {
            tokio::time::timeout(Duration::from_secs(20), backend.exec(request, io))
                .await
                .expect("exec ends")
        },
        read_all(out_ours),
        client
    );
    assert_eq!((status, out.as_str()), (ExitStatus::Success, "typed\n"));
}
