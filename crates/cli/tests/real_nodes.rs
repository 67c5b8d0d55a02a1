//! Real containers downstairs (issue 43, item 5): lower clusters whose only nodes are real
//! kubelets with containerd and runc (`ClusterSpec::with_real_nodes`), the `tensile
//! virtual-node` binary in front of each, and the machine's `kubectl` against the upper
//! cluster. What a kubelet does is done by a real one here: exec over WebSocket and SPDY,
//! `logs -f` and `--previous` after a restart, attach, port-forward to a real server, top, a
//! liveness probe restarting a container, an init container, a preStop hook and the grace
//! period on delete, a ConfigMap volume updated in place, the projected service-account token
//! read from disk and accepted upstairs, and a pod in one lower cluster reaching a Service whose
//! backend runs in another.
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
    let mut pf = Killed(
        Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(upper)
            .args(["port-forward", &format!("pod/{pod}"), ":80"])
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let local = tensile_testenv::forwarded_port(pf.0.stdout.take().unwrap()).unwrap();
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
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let env = runtime
        .block_on(TestEnv::start_with(vec![
            ClusterSpec::new("upper", 0),
            ClusterSpec::with_real_nodes("lower", 1),
        ]))
        .unwrap();
    let upper = env.clusters[0].kubeconfig.clone();
    let lower = env.clusters[1].kubeconfig.clone();
    let (_vn, log) = virtual_node(&env, 1);
    let logs = || std::fs::read_to_string(&log).unwrap_or_default();
    until_within(WAIT, "virtual node vk-lower Ready", || {
        jsonpath(
            &upper,
            "node/vk-lower",
            "{.status.conditions[?(@.type==\"Ready\")].status}",
        ) == "True"
    });
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
                            ],
                        }],
                        "volumes": [
                            {"name": "html", "emptyDir": {}},
                            {"name": "config", "configMap": {"name": "greeting"}},
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
                    "spec": {"containers": [{"name": "idle", "image": busybox(), "command": ["sleep", "3600"]}]},
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
                    "metadata": {"name": "graceful", "namespace": "default"},
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
    // The pods really run downstairs, on the real node, with addresses of its range.
    let node = &env.clusters[1].real_nodes()[0];
    let (_, lower_pods, _) = kubectl(
        &lower,
        &[
            "get",
            "pods",
            "-A",
            "-l",
            "tensile-kube.io/owner=vk-lower",
            "-o",
            "jsonpath={range .items[*]}{.spec.nodeName} {.status.podIP}{\"\\n\"}{end}",
        ],
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
            kubectl(
                &lower,
                &[
                    "get",
                    "pods",
                    "-A",
                    "-l",
                    "tensile-kube.io/owner=vk-lower",
                    "-o",
                    "jsonpath={.items[*].metadata.deletionGracePeriodSeconds}",
                ],
            )
            .1
            .split_whitespace()
            .any(|g| g == "40")
        },
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
        kubectl(
            &lower,
            &[
                "get",
                "pods",
                "-A",
                "-l",
                "tensile-kube.io/owner=vk-lower",
                "-o",
                "name",
            ],
        )
        .1
        .is_empty()
    });
    drop(env);
    drop(runtime);
}

#[test]
fn a_pod_in_one_lower_cluster_reaches_a_service_whose_backend_runs_in_another() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let env = runtime
        .block_on(TestEnv::start_with(vec![
            ClusterSpec::new("upper", 0),
            ClusterSpec::with_real_nodes("lower-a", 1),
            ClusterSpec::with_real_nodes("lower-b", 1),
        ]))
        .unwrap();
    let upper = env.clusters[0].kubeconfig.clone();
    let (_a, _) = virtual_node(&env, 1);
    let (_b, _) = virtual_node(&env, 2);
    for node in ["vk-lower-a", "vk-lower-b"] {
        until_within(WAIT, &format!("{node} Ready"), || {
            jsonpath(
                &upper,
                &format!("node/{node}"),
                "{.status.conditions[?(@.type==\"Ready\")].status}",
            ) == "True"
        });
    }
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
                    "spec": {"selector": {"app": "backend"}, "ports": [{"port": 80}]},
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
    until_within(WAIT, "the Service by name from the other cluster", || {
        let (ok, page, _) = kubectl(
            &upper,
            &[
                "exec",
                "client",
                "--",
                "timeout",
                "5",
                "wget",
                "-qO-",
                "http://backend.default.svc.cluster.local/",
            ],
        );
        ok && page.contains("nginx")
    });
    drop(env);
    drop(runtime);
}
