//! `tensile join` and `tensile unjoin` end to end, with the binary and the machine's `kubectl`,
//! on TestEnv clusters (simulated, or real control planes with `TENSILE_K8S_BIN`).
//!
//! The test clusters have no kubelet that could run the virtual node's Deployment, so the test
//! starts `tensile virtual-node` itself, with exactly the lower kubeconfig join stored in the
//! upper Secret and a token of the upper ServiceAccount join's RBAC binds: what the
//! Deployment's pod would run with. On real control planes it runs as shipped, with
//! `--tls-bootstrap` (that token only asks for its node certificate); the simulator has no
//! Node authorizer and signs no certificate requests, so there the ServiceAccount also gets
//! the role-based rights `deploy/virtual-node/rbac-serviceaccount` documents for such clusters.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use serde_json::Value;
use tensile_testenv::{ClusterSpec, TestEnv};

mod common;
use common::{Killed, kubectl, until};

fn deploy_dir(sub: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy")
        .join(sub)
}

fn kustomize(sub: &str) -> Vec<Value> {
    let out = Command::new("kubectl")
        .args(["kustomize"])
        .arg(deploy_dir(sub))
        .output()
        .expect("kubectl is needed to render deploy/");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_saphyr::from_multiple(&String::from_utf8(out.stdout).unwrap()).unwrap()
}

/// `tensile join|unjoin ...` with `KUBECONFIG` naming every cluster's file.
fn tensile(kubeconfigs: &[&Path], args: &[&str]) -> (bool, String, String) {
    let joined = std::env::join_paths(kubeconfigs).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_tensile"))
        .args(args)
        .env("KUBECONFIG", joined)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Drops what join adds to the shipped objects (its label, the token's expiry on the pod
/// template), so they compare with the kustomize output.
fn without_marks(mut o: Value) -> Value {
    if let Some(l) = o
        .pointer_mut("/metadata/labels")
        .and_then(Value::as_object_mut)
    {
        l.remove("app.kubernetes.io/managed-by");
        if l.is_empty() {
            o["metadata"].as_object_mut().unwrap().remove("labels");
        }
    }
    o
}

#[test]
fn a_dry_run_prints_the_shipped_manifests_rendered_for_the_lower_cluster() {
    let dir = std::env::temp_dir().join(format!("tensile-join-dry-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let kc = dir.join("kubeconfig");
    std::fs::write(
        &kc,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: l\n  cluster: {server: 'https://10.0.0.9:6443', certificate-authority-data: Q0E=}\n\
         - name: u\n  cluster: {server: 'https://10.0.0.1:6443'}\ncontexts:\n- name: up\n  context: {cluster: u, user: x}\n\
         - name: low\n  context: {cluster: l, user: x}\nusers:\n- name: x\n  user: {token: t}\ncurrent-context: up\n",
    )
    .unwrap();
    let (ok, out, err) = tensile(
        &[&kc],
        &[
            "join",
            "--upper-context=up",
            "--lower-context=low",
            "--name=lower-1",
            "--image=tensile",
            "--dry-run",
        ],
    );
    assert!(ok, "{err}");
    let printed: Vec<Value> = serde_saphyr::from_multiple(&out).unwrap();
    let printed: Vec<Value> = printed.into_iter().map(without_marks).collect();
    let find = |kind: &str, name: &str| {
        printed
            .iter()
            .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("{kind}/{name} not printed:\n{out}"))
            .clone()
    };
    // Downstairs: deploy/lower as shipped, minus the long-lived token join never makes.
    for o in kustomize("lower") {
        let name = o["metadata"]["name"].as_str().unwrap();
        if o["kind"] == "Secret" {
            assert!(
                !printed.iter().any(|p| p["metadata"]["name"] == name),
                "{out}"
            );
            continue;
        }
        let mut p = find(o["kind"].as_str().unwrap(), name);
        if let Some(l) = p["metadata"]["labels"].as_object_mut() {
            l.remove("tensile-kube.io/lower-cluster");
            if l.is_empty() {
                p["metadata"].as_object_mut().unwrap().remove("labels");
            }
        }
        assert_eq!(p, o);
    }
    // Upstairs: the virtual nodes' RBAC and the overlay deploy/virtual-node/lower-1 gives.
    for o in kustomize("virtual-node/rbac")
        .into_iter()
        .chain(kustomize("virtual-node/lower-1"))
    {
        let p = find(
            o["kind"].as_str().unwrap(),
            o["metadata"]["name"].as_str().unwrap(),
        );
        assert_eq!(p, o);
    }
    // The Secret the Deployment mounts, with a kubeconfig of the lower context's server.
    let secret = find("Secret", "tensile-lower-1-kubeconfig");
    let kubeconfig = secret["stringData"]["kubeconfig"].as_str().unwrap();
    assert!(kubeconfig.contains("https://10.0.0.9:6443"), "{kubeconfig}");
    let _ = std::fs::remove_dir_all(&dir);
}

fn jsonpath(kc: &Path, what: &[&str], path: &str) -> String {
    let mut args = vec!["get"];
    args.extend_from_slice(what);
    let expr = format!("jsonpath={path}");
    args.extend_from_slice(&["-o", &expr]);
    kubectl(kc, &args).1
}

fn exists(kc: &Path, what: &[&str]) -> bool {
    let mut args = vec!["get"];
    args.extend_from_slice(what);
    args.extend_from_slice(&["-o", "name", "--ignore-not-found"]);
    let (ok, out, err) = kubectl(kc, &args);
    assert!(ok, "kubectl get {what:?}: {err}");
    !out.trim().is_empty()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A kubeconfig of the upper cluster whose user is a token of `kube-system/tensile-virtual-node`
/// (what the Deployment's pod runs as).
fn upper_node_kubeconfig(upper: &Path, dir: &Path) -> PathBuf {
    let (ok, token, err) = kubectl(
        upper,
        &[
            "create",
            "token",
            "tensile-virtual-node",
            "-n",
            "kube-system",
            "--duration=2h",
        ],
    );
    assert!(ok, "{err}");
    let path = dir.join("upper-virtual-node.kubeconfig");
    std::fs::copy(upper, &path).unwrap();
    for args in [
        vec![
            "config".to_owned(),
            "set-credentials".into(),
            "vn".into(),
            format!("--token={}", token.trim()),
        ],
        vec![
            "config".into(),
            "set-context".into(),
            "--current".into(),
            "--user=vn".into(),
        ],
    ] {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (ok, _, err) = kubectl(&path, &args);
        assert!(ok, "{err}");
    }
    path
}

/// The lower kubeconfig join stored upstairs, written to a file.
fn stored_kubeconfig(upper: &Path, name: &str, dir: &Path) -> PathBuf {
    let data = jsonpath(
        upper,
        &[
            "secret",
            "-n",
            "kube-system",
            &format!("tensile-{name}-kubeconfig"),
        ],
        "{.data.kubeconfig}",
    );
    use base64::Engine as _;
    let text = base64::engine::general_purpose::STANDARD
        .decode(data.trim())
        .unwrap();
    let path = dir.join(format!("stored-{name}.kubeconfig"));
    std::fs::write(&path, text).unwrap();
    path
}

fn start_node(
    dir: &Path,
    name: &str,
    upper: &Path,
    lower: &Path,
    bootstrap: bool,
    extra: &[&str],
) -> Killed {
    let log = std::fs::File::create(dir.join(format!("virtual-node-{name}.log"))).unwrap();
    let mut args = vec![
        "virtual-node".to_owned(),
        format!("--nodename=vk-{name}"),
        "--disable-taint".into(),
        "--kubelet-address=127.0.0.1".into(),
        format!("--kubeconfig={}", upper.display()),
        format!("--client-kubeconfig={}", lower.display()),
    ];
    if bootstrap {
        // As deploy/virtual-node/base ships it.
        args.extend([
            "--tls-bootstrap".to_owned(),
            "--enable-controllers=ServiceControllers".to_owned(),
        ]);
    }
    args.extend(extra.iter().map(|a| (*a).to_owned()));
    Killed(
        Command::new(env!("CARGO_BIN_EXE_tensile"))
            .args(args)
            .env("KUBELET_PORT", free_port().to_string())
            .env("VKUBELET_POD_IP", "127.0.0.1")
            .env("VKUBELET_NODE_LABEL", format!("clusterID:{name}"))
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap(),
    )
}

fn create_pod(upper: &Path, dir: &Path, pod: &str, node: &str) {
    create_pod_in(upper, dir, "default", pod, node);
}

fn create_pod_in(upper: &Path, dir: &Path, namespace: &str, pod: &str, node: &str) {
    let file = dir.join(format!("{namespace}-{pod}.json"));
    std::fs::write(
        &file,
        serde_json::json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod, "namespace": namespace},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]}})
        .to_string(),
    )
    .unwrap();
    let (ok, _, err) = kubectl(upper, &["apply", "-f", &file.display().to_string()]);
    assert!(ok, "{err}");
}

fn running(upper: &Path, pod: &str) -> bool {
    jsonpath(upper, &["pod", pod, "-n", "default"], "{.status.phase}") == "Running"
}

#[test]
fn two_lower_clusters_join_run_pods_with_what_join_stored_and_one_unjoins_cleanly() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let env = runtime
        .block_on(TestEnv::start_with(vec![
            ClusterSpec::new("upper", 0),
            ClusterSpec::new("lower-1", 2),
            ClusterSpec::new("lower-2", 2),
        ]))
        .unwrap();
    let dir = env.dir().to_path_buf();
    let files: Vec<&Path> = env
        .clusters
        .iter()
        .map(|c| c.kubeconfig.as_path())
        .collect();
    let upper = env.clusters[0].kubeconfig.clone();
    let join = |name: &str| {
        tensile(
            &files,
            &[
                "join",
                "--upper-context=upper",
                &format!("--lower-context={name}"),
                &format!("--name={name}"),
                "--placement",
            ],
        )
    };

    // The extender as deploy/scheduler ships it, but knowing lower-1 only: join --placement
    // registers lower-2 with it, unjoin removes lower-1.
    let shipped: Vec<Value> = serde_saphyr::from_multiple(
        &std::fs::read_to_string(deploy_dir("scheduler/deployment.yaml")).unwrap(),
    )
    .unwrap();
    let mut extender = shipped
        .into_iter()
        .find(|o| o["kind"] == "Deployment")
        .unwrap();
    let spec = &mut extender["spec"]["template"]["spec"];
    let c = &mut spec["containers"][0];
    c["args"]
        .as_array_mut()
        .unwrap()
        .retain(|a| !a.as_str().unwrap().contains("lower-2"));
    c["volumeMounts"]
        .as_array_mut()
        .unwrap()
        .retain(|m| m["name"] != "lower-2");
    spec["volumes"]
        .as_array_mut()
        .unwrap()
        .retain(|v| v["name"] != "lower-2");
    let file = dir.join("extender.json");
    std::fs::write(&file, extender.to_string()).unwrap();
    let (ok, _, err) = kubectl(&upper, &["apply", "-f", &file.display().to_string()]);
    assert!(ok, "{err}");
    let extender_args = || {
        jsonpath(
            &upper,
            &["deployment", "-n", "kube-system", "tensile-scheduler"],
            "{.spec.template.spec.containers[0].args}",
        )
    };

    for name in ["lower-1", "lower-2"] {
        let started = Instant::now();
        let (ok, out, err) = join(name);
        assert!(ok, "join {name}: {err}\n{out}");
        eprintln!(
            "join {name}: {:.2} s\n{out}",
            started.elapsed().as_secs_f64()
        );
        assert!(
            out.contains(&format!("{name} joined as node vk-{name}")),
            "{out}"
        );
    }
    let args = extender_args();
    assert!(
        args.contains("--cluster=lower-2=/etc/tensile/lower-2/kubeconfig")
            && args.contains("--cluster=lower-1=/etc/tensile/lower-1/kubeconfig"),
        "{args}"
    );
    // A second run changes nothing, and says so.
    let secret_rv = || {
        jsonpath(
            &upper,
            &["secret", "-n", "kube-system", "tensile-lower-1-kubeconfig"],
            "{.metadata.resourceVersion}",
        )
    };
    let before = secret_rv();
    let started = Instant::now();
    let (ok, out, err) = join("lower-1");
    eprintln!(
        "join lower-1 again: {:.2} s",
        started.elapsed().as_secs_f64()
    );
    assert!(ok, "{err}");
    assert!(
        out.contains("lower-1 was already joined: nothing changed"),
        "{out}"
    );
    assert!(
        !out.contains(" created") && !out.contains(" configured"),
        "{out}"
    );
    assert_eq!(secret_rv(), before);

    // The virtual nodes run with exactly what join stored.
    let vn_upper = upper_node_kubeconfig(&upper, &dir);
    let bootstrap = env.clusters[0].is_real();
    if !bootstrap {
        let rbac = deploy_dir("virtual-node/rbac-serviceaccount/rbac.yaml");
        let (ok, _, err) = kubectl(&upper, &["apply", "-f", &rbac.display().to_string()]);
        assert!(ok, "{err}");
    }
    let mut nodes = Vec::new();
    let mut stored = Vec::new();
    for name in ["lower-1", "lower-2"] {
        let lower_kc = stored_kubeconfig(&upper, name, &dir);
        nodes.push(Some(start_node(
            &dir,
            name,
            &vn_upper,
            &lower_kc,
            bootstrap,
            &[],
        )));
        stored.push(lower_kc);
    }
    // Least privilege: the stored identity reads nodes but may not read RBAC or delete nodes.
    let lower1 = env.clusters[1].kubeconfig.clone();
    let (ok, _, err) = kubectl(&stored[0], &["get", "nodes"]);
    assert!(ok, "the stored credential cannot list nodes: {err}");
    let (ok, _, err) = kubectl(&stored[0], &["get", "clusterroles"]);
    assert!(!ok && err.contains("forbidden"), "{err}");
    let (ok, _, err) = kubectl(
        &stored[0],
        &["delete", "node", "lower-1-node-1", "--dry-run=server"],
    );
    assert!(!ok && err.contains("forbidden"), "{err}");

    for (i, name) in ["lower-1", "lower-2"].iter().enumerate() {
        create_pod(&upper, &dir, &format!("p{}", i + 1), &format!("vk-{name}"));
    }
    // A namespace the node creates downstairs (`made`), and one that was there (`found`).
    for ns in ["made", "found"] {
        let (ok, _, err) = kubectl(&upper, &["create", "namespace", ns]);
        assert!(ok, "{err}");
    }
    let (ok, _, err) = kubectl(&lower1, &["create", "namespace", "found"]);
    assert!(ok, "{err}");
    create_pod_in(&upper, &dir, "made", "p3", "vk-lower-1");
    create_pod_in(&upper, &dir, "found", "p4", "vk-lower-1");
    until("both pods running through their virtual nodes", || {
        running(&upper, "p1") && running(&upper, "p2")
    });
    until("the pods in made and found running", || {
        jsonpath(&upper, &["pod", "p3", "-n", "made"], "{.status.phase}") == "Running"
            && jsonpath(&upper, &["pod", "p4", "-n", "found"], "{.status.phase}") == "Running"
    });
    assert!(exists(&lower1, &["pod", "p1", "-n", "default"]));

    // Unjoin refuses while the node runs a pod, naming it, and removes nothing.
    let unjoin = || {
        tensile(
            &files,
            &[
                "unjoin",
                "--upper-context=upper",
                "--lower-context=lower-1",
                "--name=lower-1",
            ],
        )
    };
    let (ok, out, err) = unjoin();
    assert!(!ok, "unjoin went ahead with a pod running: {out}");
    assert!(err.contains("default/p1"), "{err}");
    assert!(exists(
        &upper,
        &[
            "deployment",
            "-n",
            "kube-system",
            "tensile-virtual-node-lower-1"
        ]
    ));

    // Drained, the node deletes its lower pod; then the node process stops, as the
    // Deployment's pod would when unjoin deletes the Deployment.
    for (ns, pod) in [("default", "p1"), ("made", "p3"), ("found", "p4")] {
        let (ok, _, err) = kubectl(&upper, &["delete", "pod", pod, "-n", ns, "--wait=false"]);
        assert!(ok, "{err}");
    }
    until("p1, p3 and p4 gone upstairs and downstairs", || {
        [("default", "p1"), ("made", "p3"), ("found", "p4")]
            .iter()
            .all(|(ns, pod)| {
                !exists(&upper, &["pod", pod, "-n", ns])
                    && !exists(&lower1, &["pod", pod, "-n", ns])
            })
    });
    nodes[0] = None;
    let started = Instant::now();
    let (ok, out, err) = unjoin();
    eprintln!(
        "unjoin lower-1: {:.2} s\n{out}",
        started.elapsed().as_secs_f64()
    );
    assert!(ok, "unjoin: {err}\n{out}");
    assert!(out.contains("lower-1 unjoined"), "{out}");
    // The namespace the node created is deleted (or going); the one it found stays.
    assert!(out.contains("namespace made deleted"), "{out}");
    assert!(exists(&lower1, &["namespace", "found"]), "{out}");
    until("namespace made gone downstairs", || {
        !exists(&lower1, &["namespace", "made"])
    });
    assert!(exists(&lower1, &["namespace", "default"]));
    let (ok, out, err) = unjoin();
    assert!(ok, "{err}");
    assert!(out.contains("nothing of lower-1 was found"), "{out}");

    // Nothing of lower-1 is left upstairs; lower-2's node and the shared RBAC stay.
    for what in [
        &[
            "deployment",
            "-n",
            "kube-system",
            "tensile-virtual-node-lower-1",
        ][..],
        &[
            "poddisruptionbudget",
            "-n",
            "kube-system",
            "tensile-virtual-node-lower-1",
        ],
        &["secret", "-n", "kube-system", "tensile-lower-1-kubeconfig"],
        &["node", "vk-lower-1"],
        &["lease", "-n", "kube-node-lease", "vk-lower-1"],
    ] {
        assert!(!exists(&upper, what), "{what:?} left upstairs");
    }
    assert!(exists(&upper, &["clusterrole", "tensile-virtual-node"]));
    let args = extender_args();
    assert!(
        !args.contains("lower-1") && args.contains("--cluster=lower-2="),
        "{args}"
    );
    assert!(exists(
        &upper,
        &["secret", "-n", "kube-system", "tensile-lower-2-kubeconfig"]
    ));
    // Nothing downstairs: the identity is gone, and with it the stored token; no pod of ours.
    for what in [
        &["serviceaccount", "-n", "kube-system", "tensile"][..],
        &["clusterrole", "tensile-lower"],
        &["clusterrolebinding", "tensile-lower"],
    ] {
        assert!(!exists(&lower1, what), "{what:?} left downstairs");
    }
    let (ok, out, _) = kubectl(
        &lower1,
        &[
            "get",
            "pods",
            "-A",
            "-l",
            "tensile-kube.io/owner",
            "-o",
            "name",
        ],
    );
    assert!(
        ok && out.trim().is_empty(),
        "lower pods of ours left: {out}"
    );
    // Deleting the ServiceAccount revokes the token (a real API server notices through its
    // cache of accounts, a moment later).
    until("the stored token to be refused", || {
        let (ok, _, err) = kubectl(&stored[0], &["get", "nodes"]);
        !ok && (err.contains("Unauthorized") || err.contains("provide credentials"))
    });

    // lower-2 carries on.
    assert!(running(&upper, "p2"));
    drop(nodes);
}

/// The token of the kubeconfig at `path` (its only user's).
fn token_of(kubeconfig: &Path) -> String {
    let (ok, out, err) = kubectl(
        kubeconfig,
        &[
            "config",
            "view",
            "--raw",
            "-o",
            "jsonpath={.users[0].user.token}",
        ],
    );
    assert!(ok, "{err}");
    out.trim().to_owned()
}

#[test]
fn the_virtual_node_renews_its_lower_token_stores_it_upstairs_and_runs_pods_on_it() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let env = runtime
        .block_on(TestEnv::start_with(vec![
            ClusterSpec::new("upper", 0),
            ClusterSpec::new("lower-1", 1),
        ]))
        .unwrap();
    let dir = env.dir().to_path_buf();
    let files: Vec<&Path> = env
        .clusters
        .iter()
        .map(|c| c.kubeconfig.as_path())
        .collect();
    let upper = env.clusters[0].kubeconfig.clone();
    let lower = env.clusters[1].kubeconfig.clone();
    // The shortest life a TokenRequest may ask for.
    let (ok, out, err) = tensile(
        &files,
        &[
            "join",
            "--upper-context=upper",
            "--lower-context=lower-1",
            "--name=lower-1",
            "--token-ttl=10m",
        ],
    );
    assert!(ok, "join: {err}\n{out}");
    let bootstrap = env.clusters[0].is_real();
    if !bootstrap {
        let rbac = deploy_dir("virtual-node/rbac-serviceaccount/rbac.yaml");
        let (ok, _, err) = kubectl(&upper, &["apply", "-f", &rbac.display().to_string()]);
        assert!(ok, "{err}");
    }
    let vn_upper = upper_node_kubeconfig(&upper, &dir);

    // The node starts on a token of the same account that can be revoked alone: bound to a
    // pod downstairs, it dies with that pod. Once the node has renewed, the pod goes, and with
    // it every request still made with the first token.
    let anchor = dir.join("anchor.json");
    std::fs::write(
        &anchor,
        serde_json::json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "anchor", "namespace": "kube-system"},
            "spec": {"serviceAccountName": "tensile", "automountServiceAccountToken": false,
                     "containers": [{"name": "c", "image": "busybox"}]}})
        .to_string(),
    )
    .unwrap();
    let (ok, _, err) = kubectl(&lower, &["apply", "-f", &anchor.display().to_string()]);
    assert!(ok, "{err}");
    let (ok, first, err) = kubectl(
        &lower,
        &[
            "create",
            "token",
            "tensile",
            "-n",
            "kube-system",
            "--duration=10m",
            "--bound-object-kind=Pod",
            "--bound-object-name=anchor",
        ],
    );
    assert!(ok, "{err}");
    let first = first.trim().to_owned();
    // Its own file: stored_kubeconfig rewrites the one it returns.
    let lower_kc = dir.join("first-token.kubeconfig");
    std::fs::copy(stored_kubeconfig(&upper, "lower-1", &dir), &lower_kc).unwrap();
    let joined_token = token_of(&lower_kc);
    let (ok, _, err) = kubectl(
        &lower_kc,
        &[
            "config",
            "set-credentials",
            "tensile",
            &format!("--token={first}"),
        ],
    );
    assert!(ok, "{err}");
    let (ok, _, err) = kubectl(&lower_kc, &["get", "nodes"]);
    assert!(ok, "the first token does not work: {err}");

    let _node = start_node(
        &dir,
        "lower-1",
        &vn_upper,
        &lower_kc,
        bootstrap,
        &[
            "--lower-kubeconfig-secret=kube-system/tensile-lower-1-kubeconfig",
            "--lower-token-renew-after=5s",
        ],
    );
    create_pod(&upper, &dir, "p1", "vk-lower-1");
    until("p1 running", || running(&upper, "p1"));

    // The node renews and writes the new kubeconfig back: a token neither join's nor the
    // first, which works.
    let stored = || token_of(&stored_kubeconfig(&upper, "lower-1", &dir));
    until("a renewed token stored upstairs", || {
        let t = stored();
        !t.is_empty() && t != joined_token && t != first
    });
    let (ok, _, err) = kubectl(
        &stored_kubeconfig(&upper, "lower-1", &dir),
        &["get", "nodes"],
    );
    assert!(ok, "the stored renewed kubeconfig does not work: {err}");
    let (ok, events, err) = kubectl(
        &upper,
        &[
            "get",
            "events",
            "-A",
            "--field-selector=reason=LowerTokenRenewed",
            "-o",
            "name",
        ],
    );
    assert!(ok && !events.trim().is_empty(), "no renewal event: {err}");

    // The first token dies; every lower client must now send a renewed one.
    let (ok, _, err) = kubectl(
        &lower,
        &[
            "delete",
            "pod",
            "anchor",
            "-n",
            "kube-system",
            "--grace-period=0",
            "--force",
        ],
    );
    assert!(ok, "{err}");
    let mut last = String::new();
    until("the first token to be refused", || {
        let (ok, _, err) = kubectl(&lower_kc, &["get", "nodes"]);
        last = err.clone();
        !ok && (err.contains("Unauthorized") || err.contains("provide credentials"))
    });
    eprintln!("first token refused: {last}");
    create_pod(&upper, &dir, "p2", "vk-lower-1");
    until(
        "p2 running, created downstairs with the renewed token",
        || running(&upper, "p2"),
    );
    assert!(exists(&lower, &["pod", "p2", "-n", "default"]));
    assert!(running(&upper, "p1"));

    // A renewal that is refused is a Warning event on the Node; the node goes on.
    let (ok, _, err) = kubectl(
        &lower,
        &[
            "delete",
            "rolebinding",
            "tensile-token-renewal",
            "-n",
            "kube-system",
        ],
    );
    assert!(ok, "{err}");
    until("a Warning event for the refused renewal", || {
        let (ok, out, _) = kubectl(
            &upper,
            &[
                "get",
                "events",
                "-A",
                "--field-selector=reason=LowerTokenRenewalFailed,involvedObject.kind=Node",
                "-o",
                "jsonpath={.items[*].type}",
            ],
        );
        ok && out.contains("Warning")
    });
    create_pod(&upper, &dir, "p3", "vk-lower-1");
    until("p3 running on the last renewed token", || {
        running(&upper, "p3")
    });
}
