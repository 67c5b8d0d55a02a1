//! `deploy/`: the manifests render with the machine's `kubectl kustomize`, apply to a cluster
//! (`--dry-run=server`), and their RBAC grants every request the components make. The last test
//! runs every component as the `tensile` binary under the service accounts the manifests
//! define, on clusters that enforce RBAC, through a scenario that uses every path (offload with
//! dependencies and a claim, Services, logs, exec, top, the webhook, the extender's bind, a
//! descheduler move, deletion), and fails on any request the manifests do not grant.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::{Value, json};
use tensile_testenv::{ClusterSpec, TestEnv};

mod common;
use common::{Killed, kubectl, until};

fn deploy_dir(sub: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy")
        .join(sub)
}

/// `kubectl kustomize DIR`, as JSON objects.
fn render(sub: &str) -> Vec<Value> {
    let out = Command::new("kubectl")
        .arg("kustomize")
        .arg(deploy_dir(sub))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "kubectl kustomize deploy/{sub}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    text.split("\n---\n")
        .filter(|doc| !doc.trim().is_empty())
        .map(|doc| serde_saphyr::from_str::<Value>(doc).unwrap())
        .collect()
}

/// The node names (`DEFAULTNODE_NAME`) of the shipped virtual-node Deployments.
fn node_names(objects: &[Value]) -> Vec<String> {
    objects
        .iter()
        .filter(|o| o["kind"] == "Deployment")
        .flat_map(|d| {
            d["spec"]["template"]["spec"]["containers"][0]["env"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .filter(|e| e["name"] == "DEFAULTNODE_NAME")
        .filter_map(|e| e["value"].as_str().map(str::to_owned))
        .collect()
}

fn kind_name(o: &Value) -> (String, String) {
    (
        o["kind"].as_str().unwrap_or_default().to_owned(),
        o["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
    )
}

fn has(objects: &[Value], kind: &str, name: &str) -> bool {
    objects
        .iter()
        .any(|o| kind_name(o) == (kind.to_owned(), name.to_owned()))
}

#[test]
fn the_manifests_render_refer_to_what_they_ship_and_start_real_subcommands() {
    let upper = render("");
    let lower = render("lower");
    for (kind, name) in [
        ("Deployment", "tensile-virtual-node-lower-1"),
        ("Deployment", "tensile-virtual-node-lower-2"),
        ("Deployment", "tensile-webhook"),
        ("Deployment", "tensile-descheduler"),
        ("Deployment", "tensile-scheduler"),
        ("Service", "tensile-webhook"),
        ("Service", "tensile-scheduler"),
        ("MutatingWebhookConfiguration", "tensile-webhook"),
    ] {
        assert!(has(&upper, kind, name), "deploy/ lacks {kind} {name}");
    }
    for objects in [&upper, &lower] {
        for o in objects.iter() {
            let (kind, name) = kind_name(o);
            if kind.ends_with("Binding") {
                let role = &o["roleRef"];
                let role_name = role["name"].as_str().unwrap();
                // `system:` ClusterRoles are Kubernetes' own (its bootstrap policy).
                assert!(
                    role_name.starts_with("system:")
                        || has(objects, role["kind"].as_str().unwrap(), role_name),
                    "{kind} {name} refers to a role that is not shipped"
                );
                for s in o["subjects"].as_array().unwrap() {
                    let subject = s["name"].as_str().unwrap();
                    if s["kind"] == "User" {
                        // A virtual node's own user: system:node:<a shipped node's name>.
                        let node = subject.strip_prefix("system:node:").unwrap_or_default();
                        assert!(
                            node_names(objects).contains(&node.to_owned()),
                            "{kind} {name} binds user {subject}, no shipped virtual node's"
                        );
                    } else {
                        assert!(
                            has(objects, "ServiceAccount", subject),
                            "{kind} {name} binds a service account that is not shipped"
                        );
                    }
                }
            }
        }
    }
    let deployments = upper
        .iter()
        .filter(|o| o["kind"] == "Deployment")
        .collect::<Vec<_>>();
    for d in deployments {
        let (_, name) = kind_name(d);
        let spec = &d["spec"]["template"]["spec"];
        let account = spec["serviceAccountName"].as_str().unwrap();
        assert!(
            has(&upper, "ServiceAccount", account),
            "{name} runs as {account}, which is not shipped"
        );
        let container = &spec["containers"][0];
        assert_eq!(
            container["image"], "ghcr.io/tensile-kube/tensile:0.1.0",
            "{name}: the image kustomization sets"
        );
        // clap rejects an unknown flag or a bad value before it looks at --help.
        let mut args: Vec<String> = container["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap().to_owned())
            .collect();
        args.push("--help".into());
        let out = Command::new(env!("CARGO_BIN_EXE_tensile"))
            .args(&args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{name}: `tensile {}` is refused: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        // The extender binds pods: it serves kube-scheduler's client certificate only.
        if name == "tensile-scheduler" {
            assert!(
                args.iter().any(|a| a.starts_with("--client-ca-file=")),
                "{name} ships without --client-ca-file"
            );
        }
        assert_eq!(
            spec["securityContext"]["runAsNonRoot"], true,
            "{name} runs as root"
        );
        // Probes on the plain-HTTP --metrics-addr port: liveness on every component (a
        // standby answers /healthz), readiness only where a not-Ready standby is wanted or
        // there is none (docs/operations.md#high-availability).
        let metrics_port = container["ports"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == "metrics")
            .unwrap_or_else(|| panic!("{name} has no port named metrics"))["containerPort"]
            .clone();
        assert!(
            args.contains(&format!("--metrics-addr=:{metrics_port}")),
            "{name}: --metrics-addr is not its metrics port {metrics_port}"
        );
        assert_eq!(
            container["livenessProbe"]["httpGet"],
            json!({"path": "/healthz", "port": "metrics"}),
            "{name}'s liveness probe"
        );
        let ready = &container["readinessProbe"]["httpGet"];
        if name == "tensile-webhook" || name == "tensile-scheduler" {
            assert_eq!(
                ready,
                &json!({"path": "/readyz", "port": "metrics"}),
                "{name}"
            );
        } else {
            assert!(
                ready.is_null(),
                "{name}: a readiness probe would stall its rollouts"
            );
        }
    }
}

#[test]
fn the_manifests_apply_to_a_cluster_with_server_side_dry_run() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let env = runtime
        .block_on(TestEnv::start_with(vec![ClusterSpec::new("upper", 0)]))
        .unwrap();
    let kc = &env.clusters[0].kubeconfig;
    for dir in ["", "lower"] {
        let path = deploy_dir(dir).display().to_string();
        let (ok, out, err) = kubectl(kc, &["apply", "--dry-run=server", "-k", &path]);
        assert!(ok, "apply --dry-run=server -k deploy/{dir}: {err}");
        assert!(out.contains("(server dry run)"), "{out}");
    }
    let (ok, out, err) = kubectl(
        kc,
        &[
            "get",
            "deployments,serviceaccounts",
            "-n",
            "kube-system",
            "-o",
            "name",
        ],
    );
    assert!(ok, "{err}");
    assert!(!out.contains("tensile"), "a dry run stored objects: {out}");
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A copy of `admin`'s kubeconfig whose user is a token of service account
/// `kube-system/account`, issued by that cluster (TokenRequest).
fn kubeconfig_of(admin: &Path, account: &str, dir: &Path) -> PathBuf {
    let (ok, token, err) = kubectl(
        admin,
        &[
            "create",
            "token",
            account,
            "-n",
            "kube-system",
            "--duration=2h",
        ],
    );
    assert!(ok, "token for {account}: {err}");
    let name = format!(
        "{}-{account}.kubeconfig",
        admin.file_stem().unwrap().to_string_lossy()
    );
    let path = dir.join(name);
    std::fs::copy(admin, &path).unwrap();
    let (ok, _, err) = kubectl(
        &path,
        &[
            "config",
            "set-credentials",
            account,
            &format!("--token={}", token.trim()),
        ],
    );
    assert!(ok, "{err}");
    let (ok, _, err) = kubectl(
        &path,
        &[
            "config",
            "set-context",
            "--current",
            &format!("--user={account}"),
        ],
    );
    assert!(ok, "{err}");
    path
}

/// The RBAC of `deploy/` applied for real (only the RBAC: the Deployments would run images).
fn apply_rbac(kubeconfig: &Path, files: &[&str]) {
    let mut args = vec!["apply".to_owned()];
    for f in files {
        args.push("-f".into());
        args.push(deploy_dir(f).display().to_string());
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (ok, _, err) = kubectl(kubeconfig, &args);
    assert!(ok, "applying {files:?}: {err}");
}

fn spawn(dir: &Path, name: &str, args: &[String], envs: &[(&str, String)]) -> Killed {
    let log = std::fs::File::create(dir.join(format!("{name}.log"))).unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tensile"));
    cmd.args(args)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(log);
    for (k, v) in envs {
        cmd.env(k, v);
    }
    Killed(cmd.spawn().unwrap())
}

/// What a failure needs to be understood: every refusal, the upper pods, the components' logs.
fn diagnose(env: &TestEnv, dir: &Path) -> String {
    let mut out = String::new();
    for cluster in &env.clusters {
        for denial in cluster.server().map(|s| s.forbidden()).unwrap_or_default() {
            out += &format!("{}: refused: {denial}\n", cluster.name);
        }
    }
    let upper = &env.clusters[0].kubeconfig;
    out += &kubectl(upper, &["get", "pods", "-A", "-o", "wide"]).1;
    out += &kubectl(upper, &["get", "pods", "-o", "jsonpath={.items[*].status}"]).1;
    out.push('\n');
    out + &logs(dir)
}

/// [`until`], with [`diagnose`] in the failure.
fn until_or_diagnose(env: &TestEnv, dir: &Path, what: &str, f: impl FnMut() -> bool) {
    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| until(what, f))).is_err() {
        panic!("timed out waiting for {what}:\n{}", diagnose(env, dir));
    }
}

fn logs(dir: &Path) -> String {
    let mut out = String::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.extension().is_some_and(|e| e == "log") {
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(15).collect();
            out += &format!("--- {}\n", path.display());
            for line in tail.into_iter().rev() {
                out += line;
                out.push('\n');
            }
        }
    }
    out
}

fn jsonpath(kc: &Path, what: &[&str], path: &str) -> String {
    let mut args = vec!["get"];
    args.extend_from_slice(what);
    let expr = format!("jsonpath={path}");
    args.extend_from_slice(&["-o", &expr]);
    kubectl(kc, &args).1
}

/// A lower cluster of two 8-CPU nodes: room for a pod no 4-CPU node of the others can hold.
fn big_lower(name: &str) -> ClusterSpec {
    let mut spec = ClusterSpec::new(name, 2);
    if let Some(kubelet) = spec.kubelet.as_mut() {
        kubelet.nodes = (1..=2)
            .map(|i| tensile_simkubelet::SimNode::new(format!("{name}-node-{i}"), "8", "16Gi"))
            .collect();
    }
    spec
}

#[test]
fn every_request_of_every_component_is_granted_by_the_shipped_rbac() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let env = runtime
        .block_on(TestEnv::start_with(vec![
            ClusterSpec::new("upper", 0),
            ClusterSpec::new("lower-1", 2),
            big_lower("lower-2"),
        ]))
        .unwrap();
    // Only the simulator lists what it refused, so this test is excluded from the `real`
    // profile by name (.config/nextest.toml), never skipped here.
    let dir = env.dir().to_path_buf();
    let upper = env.clusters[0].kubeconfig.clone();
    apply_rbac(
        &upper,
        &[
            "virtual-node/rbac-serviceaccount/rbac.yaml",
            "webhook/rbac.yaml",
            "descheduler/rbac.yaml",
            "scheduler/rbac.yaml",
        ],
    );
    let mut lowers = Vec::new();
    for cluster in &env.clusters[1..] {
        apply_rbac(&cluster.kubeconfig, &["lower/rbac.yaml"]);
        lowers.push((
            cluster.name.clone(),
            cluster.kubeconfig.clone(),
            kubeconfig_of(&cluster.kubeconfig, "tensile", &dir),
        ));
    }
    // Every cluster gets a default StorageClass like the sandbox's (volumes provisioned on the
    // pod's node once it is scheduled).
    let class = dir.join("storage-class.yaml");
    std::fs::write(
        &class,
        "apiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata:\n  name: standard\n  \
         annotations: {storageclass.kubernetes.io/is-default-class: \"true\"}\n\
         provisioner: tensile.io/local-path\nvolumeBindingMode: WaitForFirstConsumer\n\
         reclaimPolicy: Delete\n",
    )
    .unwrap();
    for cluster in &env.clusters {
        let (ok, _, err) = kubectl(
            &cluster.kubeconfig,
            &["apply", "-f", &class.display().to_string()],
        );
        assert!(ok, "{err}");
    }
    let as_account = |account: &str| kubeconfig_of(&upper, account, &dir);
    let mut running = Vec::new();

    // The webhook registers itself: the shipped configuration, pointed at this process.
    let webhook_port = free_port();
    let mut config: Value = serde_saphyr::from_str(
        &std::fs::read_to_string(deploy_dir("webhook/mutating-webhook-configuration.yaml"))
            .unwrap(),
    )
    .unwrap();
    for hook in config["webhooks"].as_array_mut().unwrap() {
        hook["clientConfig"] = json!({"url": format!("https://127.0.0.1:{webhook_port}/mutate")});
    }
    let config_file = dir.join("webhook-configuration.json");
    std::fs::write(&config_file, config.to_string()).unwrap();
    let (ok, _, err) = kubectl(&upper, &["apply", "-f", &config_file.display().to_string()]);
    assert!(ok, "{err}");
    running.push(spawn(
        &dir,
        "webhook",
        &[
            "webhook".into(),
            "--address=127.0.0.1".into(),
            format!("--port={webhook_port}"),
            "--webhook-configuration=tensile-webhook".into(),
            // As shipped: the Secret is created, watched and read through the shipped Role.
            "--tls-secret=kube-system/tensile-webhook-tls".into(),
            format!("--kubeconfig={}", as_account("tensile-webhook").display()),
        ],
        &[],
    ));
    until("the webhook to write its caBundle", || {
        !jsonpath(
            &upper,
            &["mutatingwebhookconfiguration", "tensile-webhook"],
            "{.webhooks[0].clientConfig.caBundle}",
        )
        .is_empty()
    });

    let vn = as_account("tensile-virtual-node");
    for (name, _, lower_kc) in &lowers {
        running.push(spawn(
            &dir,
            &format!("virtual-node-{name}"),
            &[
                "virtual-node".into(),
                format!("--nodename=vk-{name}"),
                "--disable-taint".into(),
                "--kubelet-address=127.0.0.1".into(),
                // As shipped: the election Lease is written through the shipped Role too.
                "--leader-elect".into(),
                format!("--kubeconfig={}", vn.display()),
                format!("--client-kubeconfig={}", lower_kc.display()),
            ],
            &[
                ("KUBELET_PORT", free_port().to_string()),
                ("VKUBELET_POD_IP", "127.0.0.1".into()),
                ("VKUBELET_NODE_LABEL", format!("clusterID:{name}")),
            ],
        ));
    }

    let scheduler_port = free_port();
    let ca_file = dir.join("scheduler-ca.pem");
    // kube-scheduler's client certificate (system:kube-scheduler), of a CA of the test's.
    let clients = tensile_testenv::certs::Ca::new("scheduler-clients").unwrap();
    let scheduler_cert = clients.issue_client("system:kube-scheduler", None).unwrap();
    let clients_file = dir.join("scheduler-clients-ca.pem");
    std::fs::write(&clients_file, clients.cert_pem()).unwrap();
    let mut args = vec![
        "scheduler".to_owned(),
        "--address=127.0.0.1".into(),
        format!("--port={scheduler_port}"),
        format!("--client-ca-file={}", clients_file.display()),
        format!("--write-ca={}", ca_file.display()),
        "--leader-elect".into(),
        "--tls-secret=kube-system/tensile-scheduler-tls".into(),
        format!("--kubeconfig={}", as_account("tensile-scheduler").display()),
    ];
    for (name, _, lower_kc) in &lowers {
        args.push(format!("--cluster={name}={}", lower_kc.display()));
    }
    running.push(spawn(&dir, "scheduler", &args, &[]));
    until("the extender's CA", || ca_file.exists());
    until("the extender to listen", || {
        std::net::TcpStream::connect(("127.0.0.1", scheduler_port)).is_ok()
    });
    // The upper scheduler follows the shipped KubeSchedulerConfiguration, pointed here.
    let shipped: Value = serde_saphyr::from_str(
        &std::fs::read_to_string(deploy_dir("scheduler/kube-scheduler-config.yaml")).unwrap(),
    )
    .unwrap();
    let mut extenders =
        tensile_sim::apiserver::controllers::SchedulerExtender::from_scheduler_config(&shipped)
            .unwrap();
    for e in &mut extenders {
        e.url_prefix = format!("https://127.0.0.1:{scheduler_port}");
        e.ca_pem = Some(std::fs::read_to_string(&ca_file).unwrap());
        e.client_cert_pem = Some(scheduler_cert.cert_pem.clone());
        e.client_key_pem = Some(scheduler_cert.key_pem.clone());
    }
    runtime
        .block_on(env.clusters[0].set_scheduler_extenders(extenders))
        .unwrap();

    running.push(spawn(
        &dir,
        "descheduler",
        &[
            "descheduler".into(),
            "--unschedulable-threshold=2s".into(),
            "--leader-elect".into(),
            format!(
                "--kubeconfig={}",
                as_account("tensile-descheduler").display()
            ),
        ],
        &[("POD_NAMESPACE", "kube-system".into())],
    ));

    until("both virtual nodes", || {
        let nodes = jsonpath(&upper, &["nodes"], "{.items[*].metadata.name}");
        nodes.contains("vk-lower-1") && nodes.contains("vk-lower-2")
    });

    // A Deployment whose pods need a ConfigMap, a Secret, a ServiceAccount and a claim, behind a
    // Service; labelled virtual-pod=true so the webhook mutates them.
    let manifest = dir.join("app.yaml");
    std::fs::write(
        &manifest,
        r#"
apiVersion: v1
kind: ConfigMap
metadata: {name: app-config}
data: {greeting: hello}
---
apiVersion: v1
kind: Secret
metadata: {name: app-secret}
stringData: {password: s3cret}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: app}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: app-data}
spec:
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 1Gi}}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: app}
spec:
  replicas: 1
  selector: {matchLabels: {app: app}}
  template:
    metadata: {labels: {app: app, virtual-pod: "true"}}
    spec:
      serviceAccountName: app
      nodeSelector: {clusterID: lower-1, kubernetes.io/os: linux}
      containers:
        - name: app
          image: nginx:1.27
          ports: [{containerPort: 80}]
          envFrom: [{configMapRef: {name: app-config}}, {secretRef: {name: app-secret}}]
          volumeMounts: [{name: data, mountPath: /data}]
      volumes: [{name: data, persistentVolumeClaim: {claimName: app-data}}]
---
apiVersion: v1
kind: Service
metadata: {name: app}
spec:
  selector: {app: app}
  ports: [{port: 80}]
"#,
    )
    .unwrap();
    let (ok, _, err) = kubectl(&upper, &["apply", "-f", &manifest.display().to_string()]);
    assert!(ok, "{err}");
    let running_app = || {
        jsonpath(
            &upper,
            &["pods", "-l", "app=app"],
            "{.items[*].status.phase}",
        ) == "Running"
    };
    until_or_diagnose(&env, &dir, "the app pod to run", running_app);
    let annotations = jsonpath(
        &upper,
        &["pods", "-l", "app=app"],
        "{.items[0].metadata.annotations}",
    );
    assert!(
        annotations.contains("clusterSelector"),
        "the webhook did not mutate the pod: {annotations}"
    );
    let (ok, _, err) = kubectl(&upper, &["logs", "deploy/app"]);
    assert!(ok, "logs: {err}");
    let (ok, out, err) = kubectl(&upper, &["exec", "deploy/app", "--", "hostname"]);
    assert!(ok && !out.is_empty(), "exec: {err}");
    // `kubectl debug`: the ephemeral container goes down through the lower pod's
    // `ephemeralcontainers` subresource and its status comes back up.
    let app_pod = jsonpath(
        &upper,
        &["pods", "-l", "app=app"],
        "{.items[0].metadata.name}",
    );
    let (ok, _, err) = kubectl(
        &upper,
        &[
            "debug",
            &app_pod,
            "--image=busybox",
            "-c",
            "dbg",
            "--",
            "sleep",
            "3600",
        ],
    );
    assert!(ok, "debug: {err}");
    until("the debug container reported upstairs", || {
        jsonpath(
            &upper,
            &["pod", &app_pod],
            "{.status.ephemeralContainerStatuses[0].name}",
        ) == "dbg"
    });
    until("kubectl top pods", || {
        kubectl(&upper, &["top", "pods", "-l", "app=app", "--no-headers"]).0
    });
    until(
        "the Service mirrored into lower-1 with the claim bound",
        || {
            kubectl(&lowers[0].1, &["get", "service", "app"]).0
                && jsonpath(&upper, &["pvc", "app-data"], "{.status.phase}") == "Bound"
        },
    );

    // A bare pod put straight on vk-lower-1, too big for any node there, that its owner lets the
    // descheduler re-create: the descheduler moves it (an intent ConfigMap, a replacement, the deletion), the extender binds the replacement.
    let big = dir.join("big.yaml");
    std::fs::write(
        &big,
        r#"
apiVersion: v1
kind: Pod
metadata:
  name: big
  annotations: {descheduler.alpha.kubernetes.io/evict: "true"}
spec:
  nodeName: vk-lower-1
  containers:
    - name: big
      image: nginx:1.27
      resources: {requests: {cpu: "6"}}
"#,
    )
    .unwrap();
    let (ok, _, err) = kubectl(&upper, &["apply", "-f", &big.display().to_string()]);
    assert!(ok, "{err}");
    let moved = || {
        let out = jsonpath(
            &upper,
            &["pods"],
            "{range .items[*]}{.metadata.name}={.spec.nodeName} {end}",
        );
        out.split_whitespace()
            .any(|p| p.starts_with("big") && p.ends_with("=vk-lower-2"))
    };
    until_or_diagnose(&env, &dir, "the big pod to move to vk-lower-2", moved);

    let (ok, _, err) = kubectl(&upper, &["delete", "deployment", "app", "--wait=false"]);
    assert!(ok, "{err}");
    until("the app pod gone downstairs", || {
        jsonpath(
            &lowers[0].1,
            &["pods", "-A", "-l", "app=app"],
            "{.items[*].metadata.name}",
        )
        .is_empty()
    });

    let mut refused = Vec::new();
    for cluster in &env.clusters {
        for denial in cluster.server().unwrap().forbidden() {
            refused.push(format!("{}: {denial}", cluster.name));
        }
    }
    assert!(
        refused.is_empty(),
        "the shipped RBAC does not grant:\n{}\n{}",
        refused.join("\n"),
        logs(&dir)
    );
    drop(running);
}

/// The webhook's failure policy as shipped (`failurePolicy: Fail`, `objectSelector`
/// `virtual-pod=true`): with no webhook answering, creating a virtual pod fails with the
/// webhook named, and every other pod is admitted as if there were no webhook.
#[test]
fn while_the_webhook_is_down_only_virtual_pods_are_refused() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let env = runtime
        .block_on(TestEnv::start_with(vec![ClusterSpec::new("upper", 0)]))
        .unwrap();
    let upper = env.clusters[0].kubeconfig.clone();
    let mut config: Value = serde_saphyr::from_str(
        &std::fs::read_to_string(deploy_dir("webhook/mutating-webhook-configuration.yaml"))
            .unwrap(),
    )
    .unwrap();
    // Nothing listens there.
    let dead = free_port();
    for hook in config["webhooks"].as_array_mut().unwrap() {
        hook["clientConfig"] = json!({"url": format!("https://127.0.0.1:{dead}/mutate")});
    }
    let file = env.dir().join("webhook-configuration.json");
    std::fs::write(&file, config.to_string()).unwrap();
    let (ok, _, err) = kubectl(&upper, &["apply", "-f", &file.display().to_string()]);
    assert!(ok, "{err}");
    let (ok, _, err) = kubectl(
        &upper,
        &["run", "ordinary", "--image=nginx:1.27", "--labels=app=web"],
    );
    assert!(ok, "an ordinary pod is admitted: {err}");
    let (ok, _, err) = kubectl(
        &upper,
        &[
            "run",
            "virtual",
            "--image=nginx:1.27",
            "--labels=virtual-pod=true",
        ],
    );
    assert!(!ok, "a virtual pod is refused while the webhook is down");
    assert!(
        err.contains("failed calling webhook \"pods.webhook.tensile-kube.io\""),
        "{err}"
    );
    let (_, names, _) = kubectl(&upper, &["get", "pods", "-o", "name"]);
    assert_eq!(names.trim(), "pod/ordinary");
}
