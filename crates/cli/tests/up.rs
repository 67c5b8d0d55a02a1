//! The README's first command end to end: `tensile up`, then the tour's kubectl lines with the
//! machine's `kubectl`, `tensile status`, and a clean Ctrl-C. Plus its clear start-up errors.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

mod common;

use std::io::{BufRead as _, BufReader};
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{Killed, kubectl, until};

fn temp_dir(what: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tensile-{what}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `tensile up` with `args`; its stdout collected as it comes.
fn start_up(args: &[&str], kubeconfig: &Path) -> (Killed, Arc<Mutex<String>>) {
    common::spawn_collecting(
        Command::new(env!("CARGO_BIN_EXE_tensile"))
            .arg("up")
            .args(args)
            .arg("--kubeconfig-out")
            .arg(kubeconfig)
            .env("RUST_LOG", "warn"),
    )
}

fn text(out: &Arc<Mutex<String>>) -> String {
    out.lock().unwrap().clone()
}

/// kubectl's stdout; a failure fails the test with its stderr.
fn kubectl_ok(kubeconfig: &Path, args: &[&str]) -> String {
    let (ok, out, err) = kubectl(kubeconfig, args);
    assert!(ok, "kubectl {args:?}: {err}");
    out
}

/// The words of `text` one space apart, so that a table's or describe's columns compare whole.
fn words(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

#[test]
fn tensile_sim_writes_its_kubeconfig_owner_only_even_over_a_world_readable_file() {
    let dir = temp_dir("sim-kubeconfig");
    let kc = dir.join("kubeconfig");
    std::fs::write(&kc, "old").unwrap();
    std::fs::set_permissions(&kc, std::fs::Permissions::from_mode(0o644)).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_tensile"))
        .args(["sim", "--nodes", "0", "--kubeconfig-out"])
        .arg(&kc)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let _sim = Killed(child);
    let out = Arc::new(Mutex::new(String::new()));
    let o = out.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            o.lock().unwrap().push_str(&line);
        }
    });
    // The line saying where it went comes after the write.
    until("tensile sim to write its kubeconfig", || {
        text(&out).contains("kubeconfig written to")
    });
    assert_eq!(mode(&kc), 0o600);
    assert!(
        std::fs::read_to_string(&kc)
            .unwrap()
            .contains("client-key-data")
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn tensile_up_then_the_tour_offloads_a_deployment_with_logs_and_exec_and_stops_on_ctrl_c() {
    let dir = temp_dir("up-tour");
    let kc = dir.join("kubeconfig");
    // A kubeconfig from an earlier run, world-readable: replaced by one only its owner reads.
    std::fs::write(&kc, "old").unwrap();
    std::fs::set_permissions(&kc, std::fs::Permissions::from_mode(0o644)).unwrap();
    let started = Instant::now();
    let (mut up, out) = start_up(&["--port", "0", "--no-table"], &kc);
    until("tensile up to be ready", || text(&out).contains("ready in"));
    assert_eq!(
        mode(&kc),
        0o600,
        "the kubeconfig holds administrator credentials"
    );
    eprintln!("ready after {:?}", started.elapsed());
    let shown = text(&out);
    assert!(shown.contains("kubectl create deployment"), "{shown}");
    assert!(shown.contains(&kc.display().to_string()), "{shown}");

    let (ok, contexts, err) = kubectl(&kc, &["config", "get-contexts", "-o", "name"]);
    assert!(ok, "{err}");
    assert_eq!(
        contexts.split_whitespace().collect::<Vec<_>>(),
        ["lower-1", "lower-2", "upper"]
    );
    let (_, current, _) = kubectl(&kc, &["config", "current-context"]);
    assert_eq!(current.trim(), "upper");
    let (ok, nodes, err) = kubectl(&kc, &["get", "nodes", "--no-headers"]);
    assert!(ok, "{err}");
    for vk in ["vk-lower-1", "vk-lower-2"] {
        assert!(
            nodes
                .lines()
                .any(|l| l.starts_with(vk) && l.contains(" Ready ")),
            "{nodes}"
        );
    }

    let (ok, _, err) = kubectl(
        &kc,
        &[
            "create",
            "deployment",
            "web",
            "--image=nginx",
            "--replicas=4",
            "--port=80",
        ],
    );
    assert!(ok, "{err}");
    let running = || {
        let (_, pods, _) = kubectl(
            &kc,
            &[
                "get",
                "pods",
                "-o",
                "jsonpath={range .items[*]}{.metadata.name} {.status.phase} {.spec.nodeName}{\"\\n\"}{end}",
            ],
        );
        pods.lines()
            .filter(|l| l.contains(" Running vk-lower-"))
            .map(|l| l.split(' ').next().unwrap().to_owned())
            .collect::<Vec<_>>()
    };
    until("4 pods Running on virtual nodes", || running().len() == 4);
    let mut upstairs = running();
    upstairs.sort();
    let mut downstairs = Vec::new();
    for ctx in ["lower-1", "lower-2"] {
        let (ok, pods, err) = pod_names(&kc, ctx);
        assert!(ok, "{err}");
        downstairs.extend(pods.lines().map(str::to_owned));
    }
    downstairs.sort();
    assert_eq!(
        upstairs, downstairs,
        "each upper pod runs in a lower cluster"
    );

    let (ok, logs, err) = kubectl(&kc, &["logs", "deploy/web"]);
    assert!(ok && logs.contains("started"), "{logs}{err}");
    let (ok, host, err) = kubectl(&kc, &["exec", "deploy/web", "--", "hostname"]);
    assert!(ok, "{err}");
    assert!(upstairs.contains(&host.trim().to_owned()), "{host}");
    common::port_forward_echo(&kc, "deploy/web", 80);
    until("kubectl top pods to show the 4 pods", || {
        let (_, top, _) = kubectl(&kc, &["top", "pods", "--no-headers"]);
        top.lines().filter(|l| l.starts_with("web-")).count() == 4
    });

    // The table, from the watches, catches up with the pods.
    until("the table to show 4 running pods", || {
        text(&out).contains("4 total: 4 offloaded to virtual nodes, 4 running")
    });
    let status = Command::new(env!("CARGO_BIN_EXE_tensile"))
        .args(["status", "--once", "--kubeconfig"])
        .arg(&kc)
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&status.stdout);
    assert!(
        status.status.success(),
        "{}",
        String::from_utf8_lossy(&status.stderr)
    );
    assert!(
        table.contains("vk-lower-1") && table.contains("vk-lower-2"),
        "{table}"
    );
    assert!(table.contains("4 total: 4 offloaded"), "{table}");
    // As a kubectl plugin (`kubectl-tensile` on the PATH), with KUBECONFIG listing two files
    // as kubectl merges them (the first one's current context).
    let bin = dir.join("plugin-bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_tensile"), bin.join("kubectl-tensile")).unwrap();
    let other = dir.join("other.kubeconfig");
    std::fs::write(
        &other,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: elsewhere\n  cluster: {server: 'https://127.0.0.1:1'}\n\
         contexts:\n- name: elsewhere\n  context: {cluster: elsewhere, user: nobody}\nusers:\n- name: nobody\n  user: {token: t}\n",
    )
    .unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let plugin = Command::new("kubectl")
        .args(["tensile", "status", "--once"])
        .env("PATH", path)
        .env(
            "KUBECONFIG",
            format!("{}:{}", kc.display(), other.display()),
        )
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&plugin.stdout);
    assert!(
        plugin.status.success() && table.contains("4 total: 4 offloaded"),
        "{table}{}",
        String::from_utf8_lossy(&plugin.stderr)
    );
    // Recent events include where each pod really landed: the lower scheduler's `Scheduled`,
    // mirrored onto the upper pod.
    assert!(
        table.contains("Scheduled") && table.contains("to lower-"),
        "{table}"
    );

    // A claim of the default StorageClass, used by an offloaded pod: bound downstairs, and the
    // binding reflected upstairs on a volume pinned to the virtual node.
    let manifest = dir.join("claim.yaml");
    std::fs::write(
        &manifest,
        "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {name: data}\n\
         spec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 1Gi}}}\n---\n\
         apiVersion: v1\nkind: Pod\nmetadata: {name: db}\nspec:\n  containers: [{name: db, image: postgres:17}]\n  \
         volumes: [{name: data, persistentVolumeClaim: {claimName: data}}]\n",
    )
    .unwrap();
    let (ok, _, err) = kubectl(&kc, &["apply", "-f", &manifest.display().to_string()]);
    assert!(ok, "{err}");
    until("the claim to be Bound upstairs on a virtual node", || {
        let (_, out, _) = kubectl(
            &kc,
            &[
                "get",
                "pvc",
                "data",
                "-o",
                r"jsonpath={.status.phase} {.metadata.annotations.volume\.kubernetes\.io/selected-node}",
            ],
        );
        out.starts_with("Bound vk-lower-")
    });
    let (ok, pv, err) = kubectl(
        &kc,
        &[
            "get",
            "pv",
            "-o",
            "jsonpath={.items[0].spec.nodeAffinity.required.nodeSelectorTerms[0].matchExpressions[0].values[0]}",
        ],
    );
    assert!(ok && pv.starts_with("vk-lower-"), "{pv}{err}");

    // Scaling through the `scale` subresource: the Deployment's pods go, downstairs too.
    let (ok, scaled, err) = kubectl(&kc, &["scale", "deployment", "web", "--replicas=0"]);
    assert!(
        ok && scaled.contains("deployment.apps/web scaled"),
        "{scaled}{err}"
    );
    until(
        "the Deployment's pods to be gone, upstairs and downstairs",
        || {
            ["upper", "lower-1", "lower-2"].iter().all(|ctx| {
                let (ok, pods, _) = pod_names(&kc, ctx);
                ok && !pods.lines().any(|p| p.starts_with("web-"))
            })
        },
    );

    let interrupted = Command::new("kill")
        .args(["-INT", &up.0.id().to_string()])
        .status()
        .unwrap();
    assert!(interrupted.success());
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = up.0.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "tensile up did not stop on Ctrl-C"
        );
        std::thread::park_timeout(Duration::from_millis(100));
    };
    until("the output to be read", || {
        text(&out).contains("tensile up: stopped")
    });
    assert!(status.success(), "{status:?}\n{}", text(&out));
    let _ = std::fs::remove_dir_all(dir);
}

/// The sandbox runs no horizontal pod autoscaler (docs/sim.md): an HPA made as users make
/// one, `kubectl autoscale` (sent as protobuf), is stored, and `kubectl describe` says why it
/// never scales and where one does. Its fields are documented like any kind's.
#[test]
fn tensile_up_says_in_kubectl_describe_why_an_autoscaler_never_scales() {
    let dir = temp_dir("up-hpa");
    let kc = dir.join("kubeconfig");
    let (up, out) = start_up(&["--port", "0", "--lower-clusters", "1", "--no-table"], &kc);
    until("tensile up to be ready", || text(&out).contains("ready in"));
    let ok = |args: &[&str]| words(&kubectl_ok(&kc, args));
    ok(&[
        "create",
        "deployment",
        "web",
        "--image=nginx",
        "--replicas=2",
    ]);
    let made = ok(&[
        "autoscale",
        "deployment",
        "web",
        "--cpu-percent=60",
        "--min=1",
        "--max=4",
    ]);
    assert_eq!(made, "horizontalpodautoscaler.autoscaling/web autoscaled");
    let described = ok(&["describe", "hpa", "web"]);
    for shown in [
        "Reference: Deployment/web",
        "resource cpu on pods (as a percentage of request): <unknown> / 60%",
        "Min replicas: 1 Max replicas: 4",
        "Conditions: Type Status Reason Message ---- ------ ------ ------- \
         ScalingActive False NoAutoscaler the simulated control plane of the sandbox runs no \
         horizontal pod autoscaler: nothing reads this HPA's metrics or scales its target",
        "On real control planes (`tensile up --k8s-bin DIR`), kube-controller-manager's \
         autoscaler scales from the metrics `kubectl top` shows",
    ] {
        assert!(
            described.contains(shown),
            "`{shown}` missing from:\n{described}"
        );
    }
    let metrics = ok(&["explain", "hpa.spec.metrics"]);
    assert!(
        metrics.contains("FIELD: metrics <[]MetricSpec>")
            && metrics.contains("resource <ResourceMetricSource>"),
        "{metrics}"
    );
    drop(up);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_taken_port_or_an_unwritable_kubeconfig_is_a_clear_error() {
    let dir = temp_dir("up-errors");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let out = Command::new(env!("CARGO_BIN_EXE_tensile"))
        .args(["up", "--port", &port, "--kubeconfig-out"])
        .arg(dir.join("kubeconfig"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains(&format!("cannot listen on 127.0.0.1:{port}")),
        "{err}"
    );
    assert!(err.contains("--port"), "{err}");
    assert!(
        !dir.join("kubeconfig").exists(),
        "a failed start leaves no kubeconfig behind"
    );

    let out = Command::new(env!("CARGO_BIN_EXE_tensile"))
        .args(["up", "--port", "0", "--kubeconfig-out"])
        .arg(dir.join("no-such-dir/kubeconfig"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("cannot write the kubeconfig to"), "{err}");
    assert!(!err.contains("upper cluster on"), "nothing starts: {err}");
    let _ = std::fs::remove_dir_all(dir);
}

/// `kubectl get pods` of the default namespace in a context: the names, a line each.
fn pod_names(kc: &std::path::Path, context: &str) -> (bool, String, String) {
    kubectl(
        kc,
        &[
            "--context",
            context,
            "get",
            "pods",
            "-n",
            "default",
            "-o",
            "jsonpath={range .items[*]}{.metadata.name}{\"\\n\"}{end}",
        ],
    )
}

/// The processes whose command line names `dir` (a `tensile up --k8s-bin` folder).
fn processes_naming(dir: &str) -> usize {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|p| {
            std::fs::read(p.path().join("cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(dir))
        })
        .count()
}

/// Real control planes only (excluded from the simulator profile in .config/nextest.toml):
/// `tensile up --k8s-bin` killed with SIGKILL cannot stop its control planes; the next start
/// stops them and removes their folder, and Ctrl-C stops everything it started.
#[test]
fn a_killed_real_sandbox_is_cleaned_up_by_the_next_start() {
    let bin = std::env::var("TENSILE_K8S_BIN").expect("the real profile sets TENSILE_K8S_BIN");
    let dir = temp_dir("up-real");
    let start = |n: u32| {
        start_up(
            &["--k8s-bin", &bin, "--port", "0", "--no-table"],
            &dir.join(format!("kubeconfig-{n}")),
        )
    };
    let folder_of = |out: &str| -> String {
        let at = out.find("files and logs in ").unwrap() + "files and logs in ".len();
        out[at..].split_whitespace().next().unwrap().to_owned()
    };
    let (first, out) = start(1);
    let ready = Duration::from_secs(240);
    common::until_within(ready, "the first sandbox ready", || {
        text(&out).contains("ready in")
    });
    let first_dir = format!("{}/", folder_of(&text(&out)));
    assert!(processes_naming(&first_dir) >= 12, "{}", text(&out));
    drop(first); // SIGKILL
    let (second, out) = start(2);
    common::until_within(ready, "the second sandbox ready", || {
        text(&out).contains("ready in")
    });
    let said = text(&out);
    assert!(
        said.contains("control-plane processes that a killed `tensile up`"),
        "{said}"
    );
    assert_eq!(processes_naming(&first_dir), 0, "{said}");
    assert!(!Path::new(&first_dir).exists());
    let second_dir = format!("{}/", folder_of(&said));
    second.interrupt(Duration::from_secs(60));
    until("the second sandbox's control planes stopped", || {
        processes_naming(&second_dir) == 0
    });
    assert!(!Path::new(&second_dir).exists());
    let _ = std::fs::remove_dir_all(&dir);
}

/// Real control planes only (excluded from the simulator profile in .config/nextest.toml):
/// what `kubectl describe hpa` promises in the simulated sandbox holds on `tensile up
/// --k8s-bin`: kube-controller-manager's autoscaler reads the metrics `kubectl top` shows
/// (metrics-server scraping the virtual nodes' kubelet API) and scales the Deployment. A
/// simulated container uses what it requests, so at 100% of its request against a 60% target
/// two replicas become the maximum, four.
#[test]
fn on_real_control_planes_an_autoscaler_scales_from_the_metrics_top_shows() {
    let bin = std::env::var("TENSILE_K8S_BIN").expect("the real profile sets TENSILE_K8S_BIN");
    let dir = temp_dir("up-real-hpa");
    let kc = dir.join("kubeconfig");
    let (up, out) = start_up(
        &[
            "--k8s-bin",
            &bin,
            "--port",
            "0",
            "--lower-clusters",
            "1",
            "--no-table",
        ],
        &kc,
    );
    common::until_within(Duration::from_secs(240), "the sandbox ready", || {
        text(&out).contains("ready in")
    });
    let ok = |args: &[&str]| kubectl_ok(&kc, args);
    ok(&[
        "create",
        "deployment",
        "web",
        "--image=nginx",
        "--replicas=2",
    ]);
    ok(&[
        "set",
        "resources",
        "deployment",
        "web",
        "--requests=cpu=100m",
    ]);
    ok(&[
        "autoscale",
        "deployment",
        "web",
        "--cpu-percent=60",
        "--min=1",
        "--max=4",
    ]);
    // metrics-server scrapes every 15 s and the autoscaler syncs every 15 s; new pods' first
    // samples wait for them to be Ready.
    common::until_within(
        Duration::from_secs(300),
        "the autoscaler to scale to 4",
        || {
            let (_, replicas, _) = kubectl(
                &kc,
                &[
                    "get",
                    "deployment",
                    "web",
                    "-o",
                    "jsonpath={.spec.replicas}",
                ],
            );
            replicas.trim() == "4"
        },
    );
    let described = words(&ok(&["describe", "hpa", "web"]));
    for shown in [
        "resource cpu on pods (as a percentage of request): 100% (100m) / 60%",
        "ScalingActive True ValidMetricFound",
        "AbleToScale True SucceededRescale the HPA controller was able to update the target scale to 4",
        "New size: 4; reason: cpu resource utilization (percentage of request) above target",
    ] {
        assert!(
            described.contains(shown),
            "`{shown}` missing from:\n{described}"
        );
    }
    // Ctrl-C, so that the control planes stop too (a SIGKILL would leave them running).
    up.interrupt(Duration::from_secs(60));
    let _ = std::fs::remove_dir_all(dir);
}
