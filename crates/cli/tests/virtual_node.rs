//! End to end with the `tensile` binary and the machine's `kubectl`: a virtual node started
//! with the original's flags and environment between two simulated clusters; pods created with
//! kubectl upstairs run downstairs, and logs, exec and top work from upstairs.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::io::{Read as _, Write as _};
use std::path::Path;
use std::process::{Command, Stdio};

use tensile_testenv::{ClusterSpec, TestEnv};

mod common;
use common::{Killed, kubectl, until};

#[test]
fn the_binary_with_the_originals_flags_offloads_a_deployment_and_serves_logs_and_exec() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let env = runtime
        .block_on(TestEnv::start_with(vec![
            ClusterSpec::new("upper", 0),
            ClusterSpec::new("lower", 2),
        ]))
        .unwrap();
    let (upper, lower) = (
        env.clusters[0].kubeconfig.clone(),
        env.clusters[1].kubeconfig.clone(),
    );
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let log = env.dir().join("virtual-node.log");
    let child = Command::new(env!("CARGO_BIN_EXE_tensile"))
        .args([
            "virtual-node",
            "--provider=k8s",
            "--nodename=vk-lower",
            "--disable-taint=true",
        ])
        .arg(format!("--kubeconfig={}", upper.display()))
        .arg(format!("--client-kubeconfig={}", lower.display()))
        .args([
            "--kube-api-qps=500",
            "--kube-api-burst=1000",
            "--client-qps=500",
            "--client-burst=1000",
            "--klog.v=5",
            "--log-level=debug",
            "--kubelet-address=127.0.0.1",
            "--logging-format=json",
        ])
        .env("KUBELET_PORT", port.to_string())
        .env("VKUBELET_POD_IP", "127.0.0.1")
        .env("VKUBELET_NODE_LABEL", "clusterID:lower")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let _vn = Killed(child);
    until("virtual node registered", || {
        kubectl(&upper, &["get", "node", "vk-lower"]).0
    });
    let (_, labels, _) = kubectl(
        &upper,
        &[
            "get",
            "node",
            "vk-lower",
            "-o",
            "jsonpath={.metadata.labels.clusterID}",
        ],
    );
    assert_eq!(labels, "lower");
    assert!(
        kubectl(
            &upper,
            &[
                "create",
                "deployment",
                "web",
                "--image=nginx:1.27",
                "--replicas=2",
                "--port=8080"
            ]
        )
        .0
    );
    until("2 pods running upstairs", || {
        let (_, out, _) = kubectl(
            &upper,
            &[
                "get",
                "pods",
                "-l",
                "app=web",
                "-o",
                "jsonpath={.items[*].status.phase}",
            ],
        );
        out == "Running Running"
    });
    let (_, nodes, _) = kubectl(
        &upper,
        &[
            "get",
            "pods",
            "-l",
            "app=web",
            "-o",
            "jsonpath={.items[*].spec.nodeName}",
        ],
    );
    assert_eq!(nodes, "vk-lower vk-lower");
    // Messages name the lower cluster (its kubeconfig context), not the virtual node.
    until("an event naming the lower cluster", || {
        let (_, notes, _) = kubectl(
            &upper,
            &[
                "get",
                "events",
                "--field-selector",
                "reason=ProviderCreateSuccess",
                "-o",
                "jsonpath={.items[*].message}",
            ],
        );
        assert!(!notes.contains("lower cluster vk-lower"), "{notes}");
        notes.contains("created in lower cluster lower")
    });
    let (_, lower_pods, _) = kubectl(
        &lower,
        &[
            "get",
            "pods",
            "-l",
            "tensile-kube.io/owner=vk-lower",
            "-o",
            "name",
        ],
    );
    assert_eq!(lower_pods.lines().count(), 2, "{lower_pods}");
    let (ok, out, err) = kubectl(&upper, &["logs", "deploy/web"]);
    assert!(
        ok && out.contains("started (image nginx:1.27)"),
        "{out}{err}\n{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    let (ok, out, err) = kubectl(
        &upper,
        &["exec", "deploy/web", "--", "echo", "from", "upstairs"],
    );
    assert!(ok && out == "from upstairs\n", "{out}{err}");
    streams_through_the_virtual_node(&upper);
    // `--logging-format=json`: every line of the log is one JSON object, Kubernetes' names.
    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert!(
        lines.iter().any(|l| l["msg"] == "virtual node running"
            && l["node"] == "vk-lower"
            && l["v"] == 0
            && l["ts"].is_f64()),
        "{text}"
    );
    until("metrics", || {
        kubectl(&upper, &["top", "pods", "--no-headers"])
            .1
            .lines()
            .count()
            == 2
    });
    assert!(kubectl(&upper, &["delete", "deployment", "web"]).0);
    until("pods gone downstairs", || {
        kubectl(
            &lower,
            &[
                "get",
                "pods",
                "-l",
                "tensile-kube.io/owner=vk-lower",
                "-o",
                "name",
            ],
        )
        .1
        .is_empty()
    });
    drop(runtime);
}

fn kubectl_with_stdin(kubeconfig: &Path, args: &[&str], stdin: &[u8]) -> String {
    let mut child = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .arg("--request-timeout=20s")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    let out = child.wait_with_output().unwrap();
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// `exec -i`, `exec -it` (under a pseudo-terminal from `script`), `attach`, `logs -f` and
/// `port-forward` from the upper cluster, for a pod running in the lower one.
fn streams_through_the_virtual_node(upper: &Path) {
    let (_, pod, _) = kubectl(
        upper,
        &[
            "get",
            "pods",
            "-l",
            "app=web",
            "-o",
            "jsonpath={.items[0].metadata.name}",
        ],
    );
    let out = kubectl_with_stdin(
        upper,
        &["exec", "-i", &pod, "--", "cat"],
        b"through stdin\n",
    );
    assert_eq!(out, "through stdin\n");
    // A real terminal of 40 rows and 100 columns: kubectl sends its size, the lower container
    // sees it.
    let script = format!(
        "stty rows 40 cols 100; kubectl --kubeconfig {} --request-timeout=20s exec -it {pod} -- stty size",
        upper.display()
    );
    let out = Command::new("script")
        .args(["-qec", &script, "/dev/null"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("40 100"), "exec -it: {text}");
    let out = kubectl_with_stdin(upper, &["attach", "-i", &pod], b"echoed\n");
    assert!(
        out.contains("attached to") && out.contains("echoed"),
        "attach: {out}"
    );
    // logs -f: the simulated container writes a tick line every second.
    let mut follow = Killed(
        Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(upper)
            .args(["logs", "-f", &pod])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let mut stdout = follow.0.stdout.take().unwrap();
    let mut seen = String::new();
    let mut buf = [0u8; 256];
    while !seen.contains("tick") {
        let n = stdout.read(&mut buf).unwrap();
        assert!(n > 0, "logs -f ended: {seen}");
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    drop(follow);
    // port-forward: the simulated container echoes on its declared port.
    common::port_forward_echo(upper, &format!("pod/{pod}"), 8080);
}

/// A lower cluster that does not answer when the node starts is an outage like any other: the
/// node starts (it used to exit, and every restart of its pod met the same outage), registers
/// with the lower cluster shown unreachable, and catches up once it answers: its version on the
/// Node, a pod bound meanwhile Running.
#[test]
fn a_node_whose_lower_cluster_does_not_answer_at_start_shows_it_and_catches_up() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let env = runtime
        .block_on(TestEnv::start_with(vec![
            ClusterSpec::new("upper", 0),
            ClusterSpec::new("lower", 1),
        ]))
        .unwrap();
    let (upper, lower) = (
        env.clusters[0].kubeconfig.clone(),
        env.clusters[1].kubeconfig.clone(),
    );
    env.clusters[1].set_available(false);
    let port = tensile_testenv::free_port().unwrap();
    let log = env.dir().join("virtual-node.log");
    let mut vn = Killed(
        Command::new(env!("CARGO_BIN_EXE_tensile"))
            .args(["virtual-node", "--nodename=vk-late", "--disable-taint"])
            .arg(format!("--kubeconfig={}", upper.display()))
            .arg(format!("--client-kubeconfig={}", lower.display()))
            .arg("--kubelet-address=127.0.0.1")
            .env("KUBELET_PORT", port.to_string())
            .env("VKUBELET_POD_IP", "127.0.0.1")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    let jsonpath = |what: &str| {
        kubectl(
            &upper,
            &["get", "node", "vk-late", "-o", &format!("jsonpath={what}")],
        )
        .1
    };
    let reachable =
        "{.status.conditions[?(@.type==\"tensile-kube.io/LowerClusterReachable\")].status}";
    let running = |vn: &mut Killed| {
        if let Some(status) = vn.0.try_wait().unwrap() {
            panic!(
                "the virtual node exited ({status}):\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
    };
    until("the node registered, its lower cluster unreachable", || {
        running(&mut vn);
        jsonpath(reachable) == "False"
    });
    assert_eq!(jsonpath("{.status.nodeInfo.kubeletVersion}"), "");
    // A pod bound to it meanwhile (the taint keeps the scheduler away: bound by name).
    let pod = "apiVersion: v1\nkind: Pod\nmetadata: {name: late}\nspec:\n  nodeName: vk-late\n  containers: [{name: c, image: nginx:1.27}]\n";
    kubectl_with_stdin(&upper, &["apply", "-f", "-"], pod.as_bytes());
    env.clusters[1].set_available(true);
    until("the lower cluster shown reachable", || {
        running(&mut vn);
        jsonpath(reachable) == "True"
    });
    until("the lower version on the node", || {
        !jsonpath("{.status.nodeInfo.kubeletVersion}").is_empty()
    });
    until("the pod Running", || {
        running(&mut vn);
        kubectl(
            &upper,
            &["get", "pod", "late", "-o", "jsonpath={.status.phase}"],
        )
        .1 == "Running"
    });
    drop(vn);
    drop(env);
    drop(runtime);
}

#[test]
fn an_unreadable_lower_kubeconfig_is_a_clear_startup_error() {
    let out = Command::new(env!("CARGO_BIN_EXE_tensile"))
        .args([
            "virtual-node",
            "--client-kubeconfig=/nonexistent/lower.kubeconfig",
            "--kubeconfig=/nonexistent/upper.kubeconfig",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("/nonexistent/upper.kubeconfig"), "{err}");
    let out = Command::new(env!("CARGO_BIN_EXE_tensile"))
        .args(["virtual-node"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("--client-kubeconfig is required"));
}

/// The virtual node as a kubelet's identity (docs/security.md), as shipped: `--tls-bootstrap`
/// with the ServiceAccount of `deploy/virtual-node/rbac` as the bootstrap credential. The
/// binary asks for its certificate, kube-controller-manager approves and signs it, and the node
/// runs as `system:node:vk-lower`: a pod runs, `kubectl logs` reaches it (the kubelet API
/// trusts the CA of the kubeconfig, as a node may not read kube-system's ConfigMaps), and the
/// API server refused the node nothing. Certificates live 30 s here: the node renews its own
/// before it expires and goes on (a pod deleted after the renewal is replaced and runs, its
/// logs reached).
/// Real control planes only (.config/nextest.toml): the simulator has no Node authorizer and
/// signs no certificate requests.
#[test]
fn the_binary_with_tls_bootstrap_runs_as_a_node_identity_and_serves_logs() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let mut upper_spec = ClusterSpec::new("upper", 0);
    upper_spec.certificate_duration = Some(std::time::Duration::from_secs(30));
    let env = runtime
        .block_on(TestEnv::start_with(vec![
            upper_spec,
            ClusterSpec::new("lower", 2),
        ]))
        .unwrap();
    assert!(
        env.clusters[0].is_real(),
        "needs the Node authorizer and a certificate signer: real control planes only"
    );
    let (upper, lower) = (
        env.clusters[0].kubeconfig.clone(),
        env.clusters[1].kubeconfig.clone(),
    );
    let rbac =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/virtual-node/rbac/rbac.yaml");
    let (ok, _, err) = kubectl(&upper, &["apply", "-f", &rbac.display().to_string()]);
    assert!(ok, "{err}");
    let (ok, _, err) = kubectl(
        &upper,
        &[
            "create",
            "clusterrolebinding",
            "tensile-virtual-node",
            "--clusterrole=tensile-virtual-node",
            "--user=system:node:vk-lower",
        ],
    );
    assert!(ok, "{err}");
    // The bootstrap credential: the ServiceAccount's token, as in its pod.
    let (ok, token, err) = kubectl(
        &upper,
        &[
            "create",
            "token",
            "tensile-virtual-node",
            "-n",
            "kube-system",
        ],
    );
    assert!(ok, "{err}");
    let bootstrap = env.dir().join("bootstrap.kubeconfig");
    std::fs::write(
        &bootstrap,
        env.clusters[0].kubeconfig_with(None, Some(token.trim().to_owned())),
    )
    .unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let log = env.dir().join("virtual-node.log");
    let child = Command::new(env!("CARGO_BIN_EXE_tensile"))
        .args([
            "virtual-node",
            "--nodename=vk-lower",
            "--disable-taint",
            "--tls-bootstrap",
            "--leader-elect",
            "--kubelet-address=127.0.0.1",
        ])
        .arg(format!("--kubeconfig={}", bootstrap.display()))
        .arg(format!("--client-kubeconfig={}", lower.display()))
        .env("KUBELET_PORT", port.to_string())
        .env("VKUBELET_POD_IP", "127.0.0.1")
        .env("VKUBELET_NODE_LABEL", "clusterID:lower")
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let _vn = Killed(child);
    let logs = || std::fs::read_to_string(&log).unwrap_or_default();
    until("virtual node registered", || {
        kubectl(&upper, &["get", "node", "vk-lower"]).0
    });
    let (_, csrs, _) = kubectl(
        &upper,
        &[
            "get",
            "csr",
            "-o",
            "jsonpath={range .items[*]}{.metadata.name} {.spec.username} {.status.conditions[0].type}{\"\\n\"}{end}",
        ],
    );
    assert!(
        csrs.lines().any(|l| l.starts_with("tensile-vk-lower-")
            && l.contains("system:serviceaccount:kube-system:tensile-virtual-node Approved")),
        "{csrs}\n{}",
        logs()
    );
    assert!(
        kubectl(
            &upper,
            &["create", "deployment", "web", "--image=nginx:1.27"]
        )
        .0
    );
    until("the pod running upstairs", || {
        kubectl(
            &upper,
            &[
                "get",
                "pods",
                "-l",
                "app=web",
                "-o",
                "jsonpath={.items[*].status.phase}",
            ],
        )
        .1 == "Running"
    });
    let (ok, _, err) = kubectl(&upper, &["logs", "deploy/web"]);
    assert!(ok, "logs: {err}\n{}", logs());
    // Renewed before it expires: a second request issued, and the node works on.
    let issued = || {
        kubectl(
            &upper,
            &[
                "get",
                "csr",
                "-o",
                "jsonpath={range .items[*]}{.metadata.name} {.status.certificate}{\"\\n\"}{end}",
            ],
        )
        .1
        .lines()
        .filter(|l| {
            l.starts_with("tensile-vk-lower-") && l.split(' ').nth(1).is_some_and(|c| !c.is_empty())
        })
        .count()
    };
    until("the certificate renewed", || issued() >= 2);
    assert!(logs().contains("due for renewal"), "{}", logs());
    assert!(kubectl(&upper, &["delete", "pods", "-l", "app=web", "--wait=false"]).0);
    until("the replacement pod running upstairs", || {
        kubectl(
            &upper,
            &[
                "get",
                "pods",
                "-l",
                "app=web",
                "-o",
                "jsonpath={.items[*].status.phase}",
            ],
        )
        .1 == "Running"
    });
    until("logs after the renewal", || {
        kubectl(&upper, &["logs", "deploy/web"]).0
    });
    let (_, labels, _) = kubectl(
        &upper,
        &[
            "get",
            "node",
            "vk-lower",
            "-o",
            "jsonpath={.metadata.labels}",
        ],
    );
    assert!(!labels.contains("kubernetes.io/role"), "{labels}");
    let refused = env.clusters[0].refused_node_requests();
    assert!(refused.is_empty(), "refused: {refused:#?}\n{}", logs());
}
