//! End to end with the `tensile` binary and the machine's `kubectl`: a virtual node started
//! with the original's flags and environment between two simulated clusters; pods created with
//! kubectl upstairs run downstairs, and logs, exec and top work from upstairs.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tensile_sim::env::{ClusterSpec, TestEnv};

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn kubectl(kubeconfig: &Path, args: &[&str]) -> (bool, String, String) {
    let out = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .arg("--request-timeout=20s")
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::park_timeout(Duration::from_millis(200));
    }
}

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
                "--replicas=2"
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
