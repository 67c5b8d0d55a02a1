//! Real containers downstairs: lower clusters whose only nodes are real kubelets with
//! containerd and runc (`ClusterSpec::with_real_nodes`), the `tensile virtual-node` binary in
//! front of each, and the machine's `kubectl` against the upper cluster. What a kubelet does is
//! done by a real one here: exec over WebSocket and SPDY, `logs -f` and `--previous` after a
//! restart, attach, port-forward to a real server, top, a liveness probe restarting a
//! container, an init container, a preStop hook and the grace period on delete, a ConfigMap
//! volume updated in place, the projected service-account token read from disk and accepted
//! upstairs, and a pod in one lower cluster reaching a Service whose backend runs in another.
//!
//! Real control planes and root only (.config/nextest.toml; docs/testing.md says why).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use tensile_testenv::{ClusterSpec, TestEnv};

mod common;
use common::{Killed, kubectl, until_within};

/// Real nodes start and pull nothing, but their first containers share two cores with three
/// control planes and the other tests' clusters.
const WAIT: Duration = Duration::from_secs(180);

/// The log of pod `ns/name` read once through a WebSocket from the API server of `client`
/// (`binary.k8s.io`: each message is raw log bytes), until the server closes it.
async fn websocket_log(client: &kube::Client, ns: &str, name: &str) -> String {
    use futures::StreamExt as _;
    use tokio_tungstenite::tungstenite::{Message, handshake::client::generate_key, protocol};
    let request = http::Request::get(format!("/api/v1/namespaces/{ns}/pods/{name}/log"))
        .header(http::header::CONNECTION, "Upgrade")
        .header(http::header::UPGRADE, "websocket")
        .header(http::header::SEC_WEBSOCKET_VERSION, "13")
        .header(http::header::SEC_WEBSOCKET_KEY, generate_key())
        .header(http::header::SEC_WEBSOCKET_PROTOCOL, "binary.k8s.io")
        .body(kube::client::Body::empty())
        .unwrap();
    let response = client.send(request).await.unwrap();
    assert_eq!(response.status(), http::StatusCode::SWITCHING_PROTOCOLS);
    let upgraded = hyper::upgrade::on(response).await.unwrap();
    let mut ws = tokio_tungstenite::WebSocketStream::from_raw_socket(
        hyper_util::rt::TokioIo::new(upgraded),
        protocol::Role::Client,
        None,
    )
    .await;
    let mut log = Vec::new();
    while let Some(message) = ws.next().await {
        match message.unwrap() {
            Message::Binary(bytes) => log.extend_from_slice(&bytes),
            Message::Close(_) => break,
            _ => {}
        }
    }
    String::from_utf8(log).unwrap()
}

/// Starts `tensile virtual-node` for lower cluster `lower` (index `i` of `env`) as `vk-<lower>`,
/// its kubelet API on the test host's address (the upper API server reaches it there).
fn virtual_node(env: &TestEnv, i: usize) -> (Killed, PathBuf) {
    let lower = &env.clusters[i];
    let name = format!("vk-{}", lower.name);
    let address = tensile_testenv::testhost::address().unwrap();
    let port = std::net::TcpListener::bind((address, 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let log = env.dir().join(format!("{name}.log"));
    let child = Command::new(env!("CARGO_BIN_EXE_tensile"))
        .args(["virtual-node", "--disable-taint"])
        .arg(format!("--nodename={name}"))
        .arg(format!(
            "--kubeconfig={}",
            env.clusters[0].kubeconfig.display()
        ))
        .arg(format!(
            "--client-kubeconfig={}",
            lower.kubeconfig.display()
        ))
        .arg(format!("--kubelet-address={address}"))
        .env("KUBELET_PORT", port.to_string())
        .env("VKUBELET_POD_IP", address.to_string())
        .env("VKUBELET_NODE_LABEL", format!("clusterID:{}", lower.name))
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    (Killed(child), log)
}

/// An upper cluster and lower clusters of one real node each, named `lowers`, with a
/// virtual node `vk-<lower>` for each, Ready; the virtual nodes' processes and logs.
fn stack(lowers: &[&str]) -> (tokio::runtime::Runtime, TestEnv, Vec<(Killed, PathBuf)>) {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let specs = std::iter::once(ClusterSpec::new("upper", 0))
        .chain(lowers.iter().map(|l| ClusterSpec::with_real_nodes(*l, 1)))
        .collect();
    let env = runtime.block_on(TestEnv::start_with(specs)).unwrap();
    let nodes: Vec<(Killed, PathBuf)> = (1..=lowers.len()).map(|i| virtual_node(&env, i)).collect();
    for lower in lowers {
        let node = format!("vk-{lower}");
        until_within(WAIT, &format!("virtual node {node} Ready"), || {
            jsonpath(
                &env.clusters[0].kubeconfig,
                &format!("node/{node}"),
                "{.status.conditions[?(@.type==\"Ready\")].status}",
            ) == "True"
        });
    }
    (runtime, env, nodes)
}

fn apply(kubeconfig: &Path, manifest: &serde_json::Value) {
    let mut child = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["apply", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(manifest.to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "kubectl apply: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `kubectl get pods -A -l tensile-kube.io/owner=vk-lower -o OUTPUT` in the lower cluster: the
/// lower pods of virtual node `vk-lower`.
fn ours_downstairs(lower: &Path, output: &str) -> String {
    kubectl(
        lower,
        &[
            "get",
            "pods",
            "-A",
            "-l",
            "tensile-kube.io/owner=vk-lower",
            "-o",
            output,
        ],
    )
    .1
}

fn jsonpath(kubeconfig: &Path, what: &str, path: &str) -> String {
    kubectl(
        kubeconfig,
        &["get", what, "-o", &format!("jsonpath={path}")],
    )
    .1
}

fn running(kubeconfig: &Path, pod: &str) -> bool {
    jsonpath(kubeconfig, &format!("pod/{pod}"), "{.status.phase}") == "Running"
}

fn kubectl_env(
    kubeconfig: &Path,
    env: &[(&str, &str)],
    args: &[&str],
    stdin: &[u8],
) -> (bool, String, String) {
    let mut child = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .arg("--request-timeout=30s")
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn busybox() -> &'static str {
    "registry.k8s.io/e2e-test-images/busybox:1.37.0-1"
}

fn nginx() -> &'static str {
    "registry.k8s.io/e2e-test-images/nginx:1.14-4"
}

/// One HTTP/1.0 GET through `kubectl port-forward pod/POD :80`, the whole answer.
fn http_through_port_forward(upper: &Path, pod: &str, env: &[(&str, &str)]) -> String {
    let (_pf, local) = common::port_forward(upper, &format!("pod/{pod}"), 80, env);
    let mut s = std::net::TcpStream::connect(("127.0.0.1", local)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.write_all(b"GET / HTTP/1.0\r\nHost: web\r\n\r\n").unwrap();
    let mut got = String::new();
    s.read_to_string(&mut got).unwrap();
    got
}

/// `kubectl attach -i POD`: a line written to its stdin comes back from the container (which
/// answers `got <line>`), read while stdin is still open.
fn attach_round_trip(kubeconfig: &Path, pod: &str, env: &[(&str, &str)]) {
    let mut child = Killed(
        Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(["attach", "-i", pod])
            .envs(env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let mut stdin = child.0.stdin.take().unwrap();
    let line = format!("hello {}", env.len());
    stdin.write_all(format!("{line}\n").as_bytes()).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let mut stdout = child.0.stdout.take().unwrap();
    std::thread::spawn(move || {
        let mut buf = [0u8; 256];
        while let Ok(n) = stdout.read(&mut buf) {
            if n == 0 || tx.send(buf[..n].to_vec()).is_err() {
                return;
            }
        }
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let mut seen = String::new();
    while !seen.contains(&format!("got {line}")) {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match rx.recv_timeout(left) {
            Ok(bytes) => seen.push_str(&String::from_utf8_lossy(&bytes)),
            Err(_) => panic!("attach {env:?}: no answer to {line:?}; saw {seen:?}"),
        }
    }
    drop(stdin);
}

#[test]
fn real_containers_run_through_the_virtual_node_and_kubectl_reaches_them() {
    let (runtime, env, nodes) = stack(&["lower"]);
    let upper = env.clusters[0].kubeconfig.clone();
    let lower = env.clusters[1].kubeconfig.clone();
    let log = nodes[0].1.clone();
    let logs = || std::fs::read_to_string(&log).unwrap_or_default();
    let hook_dir = env.dir().join("hook");

    apply(
        &upper,
        &serde_json::json!({
            "apiVersion": "v1",
            "kind": "List",
            "items": [
                {
                    "apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": "greeting", "namespace": "default"},
                    "data": {"greeting": "v1"},
                },
                {
                    // An init container writes the page the real server then serves; a
                    // ConfigMap volume; the service-account token (upper identity) on disk.
                    "apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": "web", "namespace": "default", "labels": {"app": "web"}},
                    "spec": {
                        "initContainers": [{
                            "name": "page", "image": busybox(),
                            "command": ["sh", "-c", "echo from the init container > /html/index.html"],
                            "volumeMounts": [{"name": "html", "mountPath": "/html"}],
                        }],
                        "containers": [{
                            "name": "web", "image": nginx(),
                            "ports": [{"containerPort": 80}],
                            "volumeMounts": [
                                {"name": "html", "mountPath": "/usr/share/nginx/html"},
                                {"name": "config", "mountPath": "/etc/config"},
                                {"name": "later", "mountPath": "/etc/later"},
                            ],
                        }],
                        "volumes": [
                            {"name": "html", "emptyDir": {}},
                            {"name": "config", "configMap": {"name": "greeting"}},
                            // Optional, created upstairs only once the pod runs.
                            {"name": "later", "projected": {"sources": [
                                {"configMap": {"name": "later", "optional": true}},
                            ]}},
                        ],
                    },
                },
                {
                    // A liveness probe that fails after a few seconds: the kubelet restarts
                    // the container; each run says which it is.
                    "apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": "probed", "namespace": "default"},
                    "spec": {
                        "containers": [{
                            "name": "probed", "image": busybox(),
                            "command": ["sh", "-c", "echo run at $(date +%s%N); touch /tmp/healthy; (sleep 6; rm /tmp/healthy) & while true; do echo tick; sleep 1; done"],
                            "livenessProbe": {
                                "exec": {"command": ["cat", "/tmp/healthy"]},
                                "periodSeconds": 2, "failureThreshold": 1,
                            },
                        }],
                    },
                },
                {
                    // Uses no CPU once started: a real kubelet counts what its start cost, the
                    // lower metrics API says 0 cores.
                    "apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": "idle", "namespace": "default"},
                    "spec": {"containers": [{"name": "idle", "image": busybox(),
                        "command": ["sh", "-c", "echo container is alive; exec sleep 3600"]}]},
                },
                {
                    "apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": "talker", "namespace": "default"},
                    "spec": {
                        "containers": [{
                            "name": "talker", "image": busybox(), "stdin": true,
                            "command": ["sh", "-c", "while read line; do echo \"got $line\"; done; sleep 3600"],
                        }],
                    },
                },
                {
                    // preStop runs before SIGTERM; both write to a folder of this machine
                    // (the node is this machine) that the test reads after the delete.
                    "apiVersion": "v1", "kind": "Pod",
                    // A finalizer of the test's own holds the deleted pod upstairs, as a
                    // Job's does, so its last phase can be read.
                    "metadata": {"name": "graceful", "namespace": "default",
                        "finalizers": ["example.com/keep"]},
                    "spec": {
                        "terminationGracePeriodSeconds": 45,
                        "containers": [{
                            "name": "graceful", "image": busybox(),
                            "command": ["sh", "-c", "trap 'echo term >> /hook/log; exit 0' TERM; echo started >> /hook/log; while true; do sleep 1; done"],
                            "lifecycle": {"preStop": {"exec": {"command": ["sh", "-c", "echo prestop >> /hook/log; sleep 3"]}}},
                            "volumeMounts": [{"name": "hook", "mountPath": "/hook"}],
                        }],
                        "volumes": [{"name": "hook", "hostPath": {"path": hook_dir.display().to_string(), "type": "DirectoryOrCreate"}}],
                    },
                },
            ],
        }),
    );
    for pod in ["web", "probed", "talker", "graceful", "idle"] {
        until_within(WAIT, &format!("{pod} Running upstairs"), || {
            running(&upper, pod)
        });
    }

    // The log read through a WebSocket, as the API server serves it (as Kubernetes'
    // conformance test "Pods should support retrieving logs from the container over
    // websockets" reads it, once, as soon as the container runs).
    let client = env.clusters[0].client.clone();
    assert_eq!(
        runtime.block_on(websocket_log(&client, "default", "idle")),
        "container is alive\n"
    );
    // The pods really run downstairs, on the real node, with addresses of its range.
    let node = &env.clusters[1].real_nodes()[0];
    let lower_pods = ours_downstairs(
        &lower,
        "jsonpath={range .items[*]}{.spec.nodeName} {.status.podIP}{\"\\n\"}{end}",
    );
    assert_eq!(lower_pods.lines().count(), 5, "{lower_pods}");
    let prefix = node.pod_cidr.trim_end_matches("0/24");
    for line in lower_pods.lines() {
        assert!(
            line.starts_with(&format!("{} {prefix}", node.name)),
            "{lower_pods}"
        );
    }
    let web_ip = jsonpath(&upper, "pod/web", "{.status.podIP}");
    assert!(web_ip.starts_with(prefix), "upper pod IP {web_ip}");

    // exec over WebSocket (kubectl's default) and over SPDY.
    for env in [
        &[][..],
        &[("KUBECTL_REMOTE_COMMAND_WEBSOCKETS", "false")][..],
    ] {
        let (ok, out, err) = kubectl_env(&upper, env, &["exec", "web", "--", "hostname"], b"");
        assert!(ok && out == "web\n", "exec {env:?}: {out}{err}\n{}", logs());
        let (ok, out, err) = kubectl_env(
            &upper,
            env,
            &["exec", "-i", "web", "--", "cat"],
            b"through stdin\n",
        );
        assert!(
            ok && out == "through stdin\n",
            "exec -i {env:?}: {out}{err}"
        );
        let (ok, out, err) = kubectl_env(
            &upper,
            env,
            &["exec", "web", "--", "sh", "-c", "exit 3"],
            b"",
        );
        assert!(
            !ok && err.contains("command terminated with exit code 3"),
            "exit code {env:?}: {out}{err}"
        );
    }
    // A real server in the container, through port-forward over both protocols.
    for env in [&[][..], &[("KUBECTL_PORT_FORWARD_WEBSOCKETS", "false")][..]] {
        let got = http_through_port_forward(&upper, "web", env);
        assert!(
            got.starts_with("HTTP/1.") && got.contains("from the init container"),
            "port-forward {env:?}: {got}"
        );
    }
    // attach: what is written to the container's stdin comes back on its stdout.
    // kubectl ends an attach when its stdin ends, so stdin stays open until the answer came.
    for env in [
        &[][..],
        &[("KUBECTL_REMOTE_COMMAND_WEBSOCKETS", "false")][..],
    ] {
        attach_round_trip(&upper, "talker", env);
    }

    // The ConfigMap volume follows an update upstairs, in place.
    let cat = || {
        kubectl(
            &upper,
            &["exec", "web", "--", "cat", "/etc/config/greeting"],
        )
        .1
    };
    assert_eq!(cat(), "v1");
    assert!(
        kubectl(
            &upper,
            &[
                "patch",
                "configmap",
                "greeting",
                "-p",
                r#"{"data":{"greeting":"v2"}}"#
            ]
        )
        .0
    );
    until_within(
        WAIT,
        "the ConfigMap update in the running container",
        || cat() == "v2",
    );

    // An optional ConfigMap created upstairs after the pod started reaches its volume, and
    // leaves it when deleted, as a kubelet upstairs would have it.
    let later = || kubectl(&upper, &["exec", "web", "--", "cat", "/etc/later/k"]);
    assert!(!later().0, "/etc/later/k before the ConfigMap exists");
    assert!(
        kubectl(
            &upper,
            &["create", "configmap", "later", "--from-literal=k=appeared"]
        )
        .0
    );
    until_within(
        WAIT,
        "an optional ConfigMap created after the pod, in its volume",
        || later().1 == "appeared",
    );
    assert!(kubectl(&upper, &["delete", "configmap", "later"]).0);
    until_within(
        WAIT,
        "the optional ConfigMap deleted, out of the volume",
        || !later().0,
    );

    // The token on disk is one the upper cluster issued for the upper pod, and accepted there.
    let (ok, token, err) = kubectl(
        &upper,
        &[
            "exec",
            "web",
            "--",
            "cat",
            "/var/run/secrets/kubernetes.io/serviceaccount/token",
        ],
    );
    assert!(ok && !token.is_empty(), "{err}");
    let as_pod = env.dir().join("as-pod.kubeconfig");
    std::fs::write(
        &as_pod,
        env.clusters[0].kubeconfig_with(None, Some(token.trim().to_owned())),
    )
    .unwrap();
    let (ok, out, err) = kubectl(
        &as_pod,
        &[
            "auth",
            "whoami",
            "-o",
            "jsonpath={.status.userInfo.username}",
        ],
    );
    assert!(
        ok && out == "system:serviceaccount:default:default",
        "the pod's token upstairs: {out}{err}"
    );

    // The liveness probe restarted the container: the count and the last state upstairs,
    // and the previous run's log.
    until_within(WAIT, "probed restarted by its liveness probe", || {
        jsonpath(
            &upper,
            "pod/probed",
            "{.status.containerStatuses[0].restartCount}",
        )
        .parse::<u32>()
        .is_ok_and(|n| n >= 1)
    });
    let (ok, previous, err) = kubectl(&upper, &["logs", "probed", "--previous"]);
    assert!(
        ok && previous.starts_with("run at "),
        "--previous: {previous}{err}"
    );
    let (ok, current, err) = kubectl(&upper, &["logs", "probed"]);
    assert!(ok && current.starts_with("run at "), "{current}{err}");
    assert_ne!(
        previous.lines().next(),
        current.lines().next(),
        "two runs, two start lines"
    );
    // logs -f follows the running container.
    let mut follow = Killed(
        Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&upper)
            .args(["logs", "-f", "--tail=1", "probed"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let mut stdout = follow.0.stdout.take().unwrap();
    let mut seen = String::new();
    let mut buf = [0u8; 256];
    while seen.matches("tick").count() < 3 {
        let n = stdout.read(&mut buf).unwrap();
        assert!(n > 0, "logs -f ended: {seen}");
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    drop(follow);

    // top: the lower cluster's figures, through the virtual node, in the upper metrics API;
    // an idle container too (metrics-server drops a container whose CPU counter is zero).
    for pod in ["web", "idle"] {
        until_within(WAIT, &format!("kubectl top pod {pod}"), || {
            let (ok, out, _) = kubectl(&upper, &["top", "pod", pod, "--no-headers"]);
            ok && out.starts_with(&format!("{pod} "))
        });
    }
    until_within(WAIT, "kubectl top node vk-lower", || {
        let (ok, out, _) = kubectl(&upper, &["top", "node", "vk-lower", "--no-headers"]);
        ok && out.starts_with("vk-lower ") && !out.contains("<unknown>")
    });

    // preStop, then SIGTERM, within the grace period given upstairs.
    assert!(
        kubectl(
            &upper,
            &[
                "delete",
                "pod",
                "graceful",
                "--grace-period=40",
                "--wait=false"
            ]
        )
        .0
    );
    until_within(
        WAIT,
        "the lower pod terminating with the upper grace",
        || {
            ours_downstairs(
                &lower,
                "jsonpath={.items[*].metadata.deletionGracePeriodSeconds}",
            )
            .split_whitespace()
            .any(|g| g == "40")
        },
    );
    // The real kubelet's terminal phase comes up (the container exits 0 on SIGTERM: a deleted
    // pod whose containers all succeeded is Succeeded), the lower pod goes, and only then its
    // controller (here the test) lets the upper pod go.
    until_within(WAIT, "graceful Succeeded upstairs, gone downstairs", || {
        kubectl(
            &upper,
            &["get", "pod", "graceful", "-o", "jsonpath={.status.phase}"],
        )
        .1 == "Succeeded"
            && ours_downstairs(&lower, "name")
                .lines()
                .all(|l| !l.contains("graceful"))
    });
    assert!(
        kubectl(
            &upper,
            &[
                "patch",
                "pod",
                "graceful",
                "--type=merge",
                "-p",
                r#"{"metadata":{"finalizers":null}}"#
            ]
        )
        .0
    );
    until_within(WAIT, "graceful gone upstairs", || {
        !kubectl(&upper, &["get", "pod", "graceful"]).0
    });
    let hook = std::fs::read_to_string(hook_dir.join("log")).unwrap_or_default();
    assert_eq!(hook, "started\nprestop\nterm\n", "hook log");

    for pod in ["web", "probed", "talker", "idle"] {
        assert!(kubectl(&upper, &["delete", "pod", pod, "--wait=false"]).0);
    }
    until_within(WAIT, "the lower pods gone", || {
        ours_downstairs(&lower, "name").is_empty()
    });
    drop(nodes);
    drop(env);
    drop(runtime);
}

#[test]
fn a_pod_in_one_lower_cluster_reaches_a_service_whose_backend_runs_in_another() {
    let (runtime, env, nodes) = stack(&["lower-a", "lower-b"]);
    let upper = env.clusters[0].kubeconfig.clone();
    apply(
        &upper,
        &serde_json::json!({
            "apiVersion": "v1",
            "kind": "List",
            "items": [
                {
                    "apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": "backend", "namespace": "default", "labels": {"app": "backend"}},
                    "spec": {
                        "nodeName": "vk-lower-b",
                        "containers": [{"name": "web", "image": nginx(), "ports": [{"containerPort": 80}]}],
                    },
                },
                {
                    "apiVersion": "v1", "kind": "Service",
                    "metadata": {"name": "backend", "namespace": "default"},
                    "spec": {"type": "NodePort", "selector": {"app": "backend"}, "ports": [{"port": 80}]},
                },
                {
                    "apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": "client", "namespace": "default"},
                    "spec": {
                        "nodeName": "vk-lower-a",
                        "containers": [{"name": "client", "image": busybox(), "command": ["sleep", "3600"]}],
                    },
                },
            ],
        }),
    );
    for pod in ["backend", "client"] {
        until_within(WAIT, &format!("{pod} Running"), || running(&upper, pod));
    }
    let backend_ip = jsonpath(&upper, "pod/backend", "{.status.podIP}");
    let b_range = env.clusters[2].real_nodes()[0]
        .pod_cidr
        .trim_end_matches("0/24")
        .to_owned();
    assert!(backend_ip.starts_with(&b_range), "{backend_ip}");
    // By pod IP: the flat network between the two lower clusters.
    let (ok, page, err) = kubectl(
        &upper,
        &[
            "exec",
            "client",
            "--",
            "timeout",
            "10",
            "wget",
            "-qO-",
            &format!("http://{backend_ip}/"),
        ],
    );
    assert!(ok && page.contains("nginx"), "by pod IP: {page}{err}");
    // (Not `wget -T`: the busybox-static of Debian 12 crashes on it; docs/conformance.md.)
    // By Service name: lower-a's CoreDNS resolves the Service mirrored into it, and its
    // kube-proxy sends the connection to the backend in lower-b.
    let serves = |url: &str| {
        let (ok, page, _) = kubectl(
            &upper,
            &["exec", "client", "--", "timeout", "5", "wget", "-qO-", url],
        );
        ok && page.contains("nginx")
    };
    until_within(WAIT, "the Service by name from the other cluster", || {
        serves("http://backend.default.svc.cluster.local/")
    });
    // By the cluster IP the upper cluster gave the Service (the address a user reads upstairs,
    // and Kubernetes' conformance tests connect to): the copy asked for it downstairs too.
    let cluster_ip = jsonpath(&upper, "service/backend", "{.spec.clusterIP}");
    let lower_a = env.clusters[1].kubeconfig.clone();
    assert_eq!(
        jsonpath(&lower_a, "service/backend", "{.spec.clusterIP}"),
        cluster_ip,
        "the copy in lower-a has the upper cluster IP"
    );
    until_within(WAIT, "the Service by its upper cluster IP", || {
        serves(&format!("http://{cluster_ip}/"))
    });
    // By a node port of the client's virtual node, at the address the upper cluster shows for
    // it (docs/virtual-node.md, "Node ports"): the node forwards to the backend in lower-b.
    let node_port = jsonpath(&upper, "service/backend", "{.spec.ports[0].nodePort}");
    let node_ip = jsonpath(
        &upper,
        "node/vk-lower-a",
        r#"{.status.addresses[?(@.type=="InternalIP")].address}"#,
    );
    until_within(
        WAIT,
        "the Service by a node port of the virtual node",
        || serves(&format!("http://{node_ip}:{node_port}/")),
    );
    drop(nodes);
    drop(env);
    drop(runtime);
}

/// The commands of the README's tour, as a user types them (comments dropped).
fn readme_tour() -> Vec<String> {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md"))
            .unwrap();
    let tour = readme
        .split("## A five-minute tour of the sandbox")
        .nth(1)
        .unwrap();
    let block = tour
        .split("```sh\n")
        .skip(1)
        .filter_map(|b| b.split("```").next())
        .find(|b| b.contains("kubectl get nodes"))
        .unwrap();
    block
        .lines()
        .map(|l| match l.find(" #") {
            Some(i) => l[..i].trim_end(),
            None => l.trim_end(),
        })
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect()
}

/// The README's tour, verbatim, on `tensile up --k8s-bin DIR --real-nodes` (docs/sandbox.md):
/// the same commands a user types, on real containers. It uses the README's fixed ports (7443..,
/// 8080), as `docs_verbatim` does, so the two never run at once (.config/nextest.toml).
#[test]
fn the_readme_tour_runs_verbatim_on_real_containers() {
    let bin = tensile_testenv::real::bin_dir().expect("real control planes (TENSILE_K8S_BIN)");
    let dir = std::env::temp_dir().join(format!("tensile-tour-real-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let sandbox_md = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/sandbox.md"),
    )
    .unwrap();
    assert!(sandbox_md.contains("up --k8s-bin \"$(scripts/k8s-bin | tail -1)\" --real-nodes"));
    let mut command = Command::new(env!("CARGO_BIN_EXE_tensile"));
    command
        .arg("up")
        .arg("--k8s-bin")
        .arg(&bin)
        .arg("--real-nodes")
        .current_dir(&dir)
        .env("RUST_LOG", "warn")
        .env_remove(tensile_testenv::real::BIN_ENV);
    let (up, out) = common::spawn_collecting(&mut command);
    until_within(WAIT, "tensile up --real-nodes to be ready", || {
        out.lock().unwrap().contains("ready in")
    });
    let mut env = Vec::new();
    let mut background = Vec::new();
    let run = |line: &str, env: &[(String, String)]| {
        let out = Command::new("bash")
            .args(["-c", line])
            .current_dir(&dir)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .output()
            .unwrap();
        (
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    };
    // What each command must show on real containers (the stand-in for nginx is busybox's
    // httpd: it answers `hello` with an HTTP error, as nginx would).
    let expect = |line: &str| -> &'static [&'static str] {
        match line {
            "kubectl get nodes" => &["vk-lower-1   Ready", "vk-lower-2   Ready"],
            "kubectl get pods -o wide" => &["Running"],
            "kubectl --context lower-1 get pods -A -o wide" => &["lower-1-node-1"],
            "kubectl exec deploy/web -- hostname" => &["web-"],
            "echo hello | nc -q1 localhost 8080" => &["HTTP/1.1 400"],
            "kubectl top pods" => &["web-"],
            "kubectl scale deployment web --replicas=0" => &["deployment.apps/web scaled"],
            _ => &[],
        }
    };
    for line in readme_tour() {
        if let Some(assignment) = line.strip_prefix("export ") {
            let (k, v) = assignment.split_once('=').unwrap();
            let v = v.replace("$PWD", &dir.display().to_string());
            env.push((k.to_owned(), v));
            continue;
        }
        if let Some(job) = line.strip_suffix('&') {
            let child = Command::new("bash")
                .args(["-c", job.trim_end()])
                .current_dir(&dir)
                .envs(env.iter().map(|(k, v)| (k, v)))
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            let mut child = Killed(child);
            let port = tensile_testenv::forwarded_port(child.0.stdout.take().unwrap());
            assert!(port.is_ok(), "{line}: {port:?}");
            background.push(child);
            continue;
        }
        let wants = expect(&line);
        let mut last = String::new();
        until_within(WAIT, &line, || {
            let (ok, text) = run(&line, &env);
            let shown = ok && wants.iter().all(|w| text.contains(w));
            // Four pods, each in the table, once they all run and have figures.
            let four = !matches!(
                line.as_str(),
                "kubectl get pods -o wide" | "kubectl top pods"
            ) || text.lines().filter(|l| l.starts_with("web-")).count() == 4
                && !text.contains("Pending")
                && !text.contains("ContainerCreating");
            last = text;
            shown && four
        });
        let _ = last;
    }
    until_within(WAIT, "the lower pods gone after the scale to 0", || {
        ["lower-1", "lower-2"].iter().all(|c| {
            !run(
                &format!("kubectl --context {c} get pods -n default -o name"),
                &env,
            )
            .1
            .contains("pod/web-")
        })
    });
    drop(background);
    // Ctrl-C, as a user stops it: the nodes and control planes are stopped and cleaned up.
    up.interrupt(Duration::from_secs(90));
    let _ = std::fs::remove_dir_all(&dir);
}

/// `GET path` of a node's kubelet API, through its cluster's API server (`nodes/proxy`).
fn kubelet_get(kubeconfig: &Path, node: &str, path: &str) -> (bool, String) {
    let (ok, out, err) = kubectl(
        kubeconfig,
        &["get", "--raw", &format!("/api/v1/nodes/{node}/proxy{path}")],
    );
    (ok, if ok { out } else { err })
}

/// A pod's containers as a kubelet's `/pods` shows them: name, state kind (with its reason or
/// exit code), ready, and the last termination's exit code.
fn container_view(pod: &serde_json::Value) -> Vec<String> {
    let mut out = Vec::new();
    for key in ["initContainerStatuses", "containerStatuses"] {
        for c in pod["status"][key].as_array().into_iter().flatten() {
            let state = &c["state"];
            let kind = if state["running"].is_object() {
                "running".to_owned()
            } else if state["terminated"].is_object() {
                format!(
                    "terminated {} {}",
                    state["terminated"]["reason"].as_str().unwrap_or_default(),
                    state["terminated"]["exitCode"]
                )
            } else {
                format!(
                    "waiting {}",
                    state["waiting"]["reason"].as_str().unwrap_or_default()
                )
            };
            out.push(format!(
                "{key} {} {kind} ready={} last-exit={}",
                c["name"].as_str().unwrap_or_default(),
                c["ready"],
                c["lastState"]["terminated"]["exitCode"]
            ));
        }
    }
    out
}

fn pod_in<'a>(list: &'a serde_json::Value, name: &str) -> Option<&'a serde_json::Value> {
    list["items"]
        .as_array()?
        .iter()
        .find(|p| p["metadata"]["name"] == name && p["metadata"]["namespace"] == "default")
}

/// The virtual node's kubelet API answers as the real kubelet in front of which it stands, for
/// the same pods (running, completed, crash-looping, waiting for a missing ConfigMap, deleted),
/// field by field where the meaning is the same; the deliberate differences are in
/// docs/differences.md ("The kubelet API beside a real kubelet's").
#[test]
fn the_virtual_nodes_kubelet_api_answers_as_the_real_kubelet_behind_it() {
    let (runtime, env, nodes) = stack(&["lower"]);
    let upper = env.clusters[0].kubeconfig.clone();
    let lower = env.clusters[1].kubeconfig.clone();
    let real = env.clusters[1].real_nodes()[0].name.clone();
    let pod = |name: &str, restart: &str, command: &str, volumes: serde_json::Value| {
        serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {
                "restartPolicy": restart,
                "containers": [{
                    "name": name, "image": busybox(), "command": ["sh", "-c", command],
                    "volumeMounts": if volumes.is_null() { serde_json::json!([]) } else { serde_json::json!([{"name": "config", "mountPath": "/config"}]) },
                }],
                "volumes": if volumes.is_null() { serde_json::json!([]) } else { volumes },
            },
        })
    };
    apply(
        &upper,
        &serde_json::json!({"apiVersion": "v1", "kind": "List", "items": [
            pod("running", "Always", "echo one; echo two; echo three; sleep 3600", serde_json::Value::Null),
            pod("completed", "Never", "echo done", serde_json::Value::Null),
            pod("crashing", "Always", "echo boom; exit 1", serde_json::Value::Null),
            pod("waiting", "Always", "sleep 3600", serde_json::json!([{"name": "config", "configMap": {"name": "missing"}}])),
            pod("deleted", "Always", "sleep 3600", serde_json::Value::Null),
        ]}),
    );
    until_within(WAIT, "running, completed and deleted started", || {
        running(&upper, "running")
            && running(&upper, "deleted")
            && jsonpath(&upper, "pod/completed", "{.status.phase}") == "Succeeded"
    });
    until_within(WAIT, "crashing restarted", || {
        jsonpath(
            &upper,
            "pod/crashing",
            "{.status.containerStatuses[0].restartCount}",
        )
        .parse::<u32>()
        .is_ok_and(|n| n >= 1)
    });
    assert!(
        kubectl(
            &upper,
            &["delete", "pod", "deleted", "--wait=true", "--timeout=120s"]
        )
        .0
    );

    // /healthz.
    for (kc, node) in [(&upper, "vk-lower"), (&lower, real.as_str())] {
        let (ok, body) = kubelet_get(kc, node, "/healthz");
        assert!(ok && body == "ok", "{node} /healthz: {body}");
    }

    // /pods: the same pods, in the same states, once both have seen the same restarts.
    let both_pods = || {
        let v = kubelet_get(&upper, "vk-lower", "/pods");
        let r = kubelet_get(&lower, &real, "/pods");
        assert!(v.0 && r.0, "/pods: {}\n{}", v.1, r.1);
        (
            serde_json::from_str::<serde_json::Value>(&v.1).unwrap(),
            serde_json::from_str::<serde_json::Value>(&r.1).unwrap(),
        )
    };
    let mut report = String::new();
    until_within(WAIT, "/pods alike on both", || {
        let (v, r) = both_pods();
        report.clear();
        assert_eq!(v["kind"], "PodList");
        assert_eq!(r["kind"], "PodList");
        for name in ["running", "completed", "crashing"] {
            let (Some(vp), Some(rp)) = (pod_in(&v, name), pod_in(&r, name)) else {
                report.push_str(&format!(
                    "{name}: virtual {} real {}\n",
                    pod_in(&v, name).is_some(),
                    pod_in(&r, name).is_some()
                ));
                continue;
            };
            for field in ["phase", "podIP", "qosClass"] {
                if vp["status"][field] != rp["status"][field] {
                    report.push_str(&format!(
                        "{name} status.{field}: {} / {}\n",
                        vp["status"][field], rp["status"][field]
                    ));
                }
            }
            let conditions = |p: &serde_json::Value| -> Vec<String> {
                let mut c: Vec<String> = p["status"]["conditions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter(|c| c["type"].as_str().is_some_and(|t| !t.contains('/')))
                    .map(|c| {
                        format!(
                            "{}={}",
                            c["type"].as_str().unwrap_or_default(),
                            c["status"].as_str().unwrap_or_default()
                        )
                    })
                    .collect();
                c.sort();
                c
            };
            if conditions(vp) != conditions(rp) {
                report.push_str(&format!(
                    "{name} conditions: {:?} / {:?}\n",
                    conditions(vp),
                    conditions(rp)
                ));
            }
            let (vc, rc) = (container_view(vp), container_view(rp));
            if vc != rc {
                report.push_str(&format!("{name} containers: {vc:?} / {rc:?}\n"));
            }
        }
        // The deleted pod is on neither.
        for (side, list) in [("virtual", &v), ("real", &r)] {
            if pod_in(list, "deleted").is_some() {
                report.push_str(&format!("deleted still on the {side} kubelet's /pods\n"));
            }
        }
        report.is_empty()
    });
    // Waiting for a ConfigMap that does not exist: the real kubelet holds the pod in
    // ContainerCreating (its volume cannot mount); the virtual node does not create the lower
    // pod before what it mounts exists, so only the virtual node lists it, Pending.
    let (v, r) = both_pods();
    let waiting = pod_in(&v, "waiting").expect("waiting on the virtual node's /pods");
    assert_eq!(waiting["status"]["phase"], "Pending", "{waiting}");
    if let Some(rp) = pod_in(&r, "waiting") {
        assert_eq!(rp["status"]["phase"], "Pending", "{rp}");
    }

    // /runningpods/: the pods with a running container, by name.
    let running_names = |kc: &Path, node: &str| -> Vec<String> {
        let (ok, body) = kubelet_get(kc, node, "/runningpods/");
        assert!(ok, "/runningpods/: {body}");
        let list: serde_json::Value = serde_json::from_str(&body).unwrap();
        let mut names: Vec<String> = list["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|p| p["metadata"]["namespace"] == "default")
            .filter_map(|p| p["metadata"]["name"].as_str().map(str::to_owned))
            .collect();
        names.sort();
        names
    };
    // The real kubelet answers from its runtime cache, refreshed every few seconds, so a pod
    // deleted a moment ago can still be listed there: wait until both have caught up.
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let seen = [
            running_names(&upper, "vk-lower"),
            running_names(&lower, &real),
        ];
        let caught_up = |names: &Vec<String>| {
            names.contains(&"running".to_owned())
                && ["completed", "deleted", "waiting"]
                    .iter()
                    .all(|gone| !names.contains(&(*gone).to_owned()))
        };
        if seen.iter().all(caught_up) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "/runningpods/ virtual {:?} real {:?}",
            seen[0],
            seen[1]
        );
        std::thread::park_timeout(Duration::from_millis(500));
    }

    // /stats/summary: the running pod, its container, and the fields metrics-server and
    // `kubectl top` read, on both.
    for (kc, node) in [(&upper, "vk-lower"), (&lower, real.as_str())] {
        let (ok, body) = kubelet_get(kc, node, "/stats/summary");
        assert!(ok, "{node} /stats/summary: {body}");
        let s: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(s["node"]["nodeName"], node);
        for field in ["usageCoreNanoSeconds", "usageNanoCores"] {
            assert!(
                s["node"]["cpu"][field].is_u64(),
                "{node} node cpu.{field}: {}",
                s["node"]
            );
        }
        let p = s["pods"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["podRef"]["name"] == "running" && p["podRef"]["namespace"] == "default")
            .unwrap_or_else(|| panic!("{node}: running not in /stats/summary: {body}"));
        assert!(p["podRef"]["uid"].is_string());
        assert_eq!(p["containers"][0]["name"], "running", "{node}: {p}");
        assert!(
            p["containers"][0]["cpu"]["usageCoreNanoSeconds"]
                .as_u64()
                .is_some_and(|n| n > 0),
            "{node}: {p}"
        );
        assert!(
            p["containers"][0]["memory"]["workingSetBytes"]
                .as_u64()
                .is_some_and(|n| n > 0),
            "{node}: {p}"
        );
    }

    // /metrics/resource: every family the virtual node serves is one the kubelet serves, with
    // a sample for the running container on both.
    let families = |text: &str| -> Vec<String> {
        let mut f: Vec<String> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
            .collect();
        f.sort();
        f
    };
    let (ok, v_metrics) = kubelet_get(&upper, "vk-lower", "/metrics/resource");
    assert!(ok, "{v_metrics}");
    let (ok, r_metrics) = kubelet_get(&lower, &real, "/metrics/resource");
    assert!(ok, "{r_metrics}");
    let real_families = families(&r_metrics);
    for f in families(&v_metrics) {
        assert!(
            real_families.contains(&f),
            "{f} not served by the kubelet: {real_families:?}"
        );
    }
    for text in [&v_metrics, &r_metrics] {
        assert!(
            text.lines().any(|l| l.starts_with("container_cpu_usage_seconds_total{container=\"running\",namespace=\"default\",pod=\"running\"}")),
            "{text}"
        );
    }

    // Container logs, with each query option the API server passes on.
    for query in [
        "",
        "?tailLines=2",
        "?limitBytes=6",
        "?timestamps=true",
        "?sinceSeconds=3600",
    ] {
        let v = kubelet_get(
            &upper,
            "vk-lower",
            &format!("/containerLogs/default/running/running{query}"),
        );
        let r = kubelet_get(
            &lower,
            &real,
            &format!("/containerLogs/default/running/running{query}"),
        );
        assert!(v.0 && r.0, "logs{query}: {} / {}", v.1, r.1);
        assert_eq!(v.1, r.1, "logs{query}");
    }
    // The previous instance's log: the real kubelet itself answers "unable to retrieve container
    // logs" for a moment while a crash-looping container is replaced and its dead instances are
    // collected (CI saw it), so ask both until the real one has the log, then they must agree.
    until_within(WAIT, "the previous instance's log on both", || {
        let path = "/containerLogs/default/crashing/crashing?previous=true";
        let r = kubelet_get(&lower, &real, path);
        let v = kubelet_get(&upper, "vk-lower", path);
        if !(v.0 && r.0 && v.1 == "boom\n" && r.1 == "boom\n") {
            eprintln!("previous, not yet: {v:?} / {r:?}");
            return false;
        }
        true
    });
    // A container that is not there is an error on both, not an empty log.
    let v = kubelet_get(&upper, "vk-lower", "/containerLogs/default/running/nope");
    let r = kubelet_get(&lower, &real, "/containerLogs/default/running/nope");
    assert!(!v.0 && !r.0, "a missing container: {v:?} / {r:?}");
    drop(nodes);
    drop(env);
    drop(runtime);
}
