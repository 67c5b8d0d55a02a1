//! End to end: the machine's real `kubectl` (1.32) against the embedded API server. kubectl's
//! generator commands (`create`, `run`, `expose`) send their objects as protobuf, so these
//! exercise the protobuf body decoder through the whole create path.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::Value;
use tensile_sim::apiserver::protobuf::decode_k8s_protobuf;
use tensile_sim::apiserver::{ApiServer, ApiServerConfig};

/// The API server on its own runtime, so kubectl can be run from the test thread while it
/// serves.
struct Cluster {
    server: ApiServer,
    _runtime: tokio::runtime::Runtime,
    dir: PathBuf,
}

impl Cluster {
    fn start() -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let server = runtime
            .block_on(tensile_testenv::start_apiserver(ApiServerConfig::default()))
            .unwrap()
            .0;
        let dir = std::env::temp_dir().join(format!(
            "tensile-kubectl-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("kubeconfig"), server.kubeconfig("sim")).unwrap();
        Self {
            server,
            _runtime: runtime,
            dir,
        }
    }

    /// Runs kubectl; it ends by itself (`--request-timeout` bounds every request).
    fn run(&self, args: &[&str]) -> Output {
        self.run_with(&self.dir.join("kubeconfig"), args)
    }

    /// Runs kubectl with another kubeconfig.
    fn run_with(&self, kubeconfig: &Path, args: &[&str]) -> Output {
        Command::new(kubectl())
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .arg("--cache-dir")
            .arg(self.dir.join("cache"))
            .arg("--request-timeout=20s")
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("cannot run kubectl: {e}"))
    }

    /// Runs kubectl and returns its stdout; fails the test on a non-zero exit.
    fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "kubectl {} failed ({}):\nstdout: {stdout}\nstderr: {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    }

    fn json(&self, args: &[&str]) -> Value {
        let mut all = args.to_vec();
        all.extend(["-o", "json"]);
        serde_json::from_str(&self.ok(&all)).unwrap()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn kubectl() -> PathBuf {
    let usr_bin = Path::new("/usr/bin/kubectl");
    if usr_bin.exists() {
        usr_bin.to_owned()
    } else {
        PathBuf::from("kubectl")
    }
}

#[test]
fn kubectl_generators_create_through_protobuf() {
    let c = Cluster::start();

    // The requests really are protobuf: kubectl logs the request's content type at -v=8.
    let out = c.run(&["create", "namespace", "shop", "-v=8"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("Content-Type: application/vnd.kubernetes.protobuf"),
        "kubectl did not send protobuf:\n{stderr}"
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("namespace/shop created"));

    let out = c.ok(&[
        "-n",
        "shop",
        "run",
        "web",
        "--image=nginx:1.27",
        "--port=80",
        "--labels=app=web",
    ]);
    assert!(out.contains("pod/web created"), "{out}");
    let out = c.ok(&[
        "-n",
        "shop",
        "create",
        "deployment",
        "api",
        "--image=nginx:1.27",
        "--replicas=2",
    ]);
    assert!(out.contains("deployment.apps/api created"), "{out}");
    let out = c.ok(&[
        "-n",
        "shop",
        "create",
        "configmap",
        "cfg",
        "--from-literal=a=b",
    ]);
    assert!(out.contains("configmap/cfg created"), "{out}");
    let out = c.ok(&[
        "-n",
        "shop",
        "create",
        "secret",
        "generic",
        "s",
        "--from-literal=p=q",
    ]);
    assert!(out.contains("secret/s created"), "{out}");

    let pod = c.json(&["-n", "shop", "get", "pod", "web"]);
    assert_eq!(pod["metadata"]["namespace"], "shop");
    assert_eq!(pod["metadata"]["labels"]["app"], "web");
    let container = &pod["spec"]["containers"][0];
    assert_eq!(container["name"], "web");
    assert_eq!(container["image"], "nginx:1.27");
    assert_eq!(container["ports"][0]["containerPort"], 80);
    // Empty Go fields on the wire did not become empty JSON values: the server defaulted them.
    assert_eq!(pod["spec"]["restartPolicy"], "Always");
    assert_eq!(pod["spec"]["dnsPolicy"], "ClusterFirst");
    assert!(
        pod["metadata"]["uid"]
            .as_str()
            .is_some_and(|u| !u.is_empty())
    );

    let deployment = c.json(&["-n", "shop", "get", "deployment", "api"]);
    assert_eq!(deployment["spec"]["replicas"], 2);
    assert_eq!(deployment["spec"]["selector"]["matchLabels"]["app"], "api");
    assert_eq!(
        deployment["spec"]["template"]["spec"]["containers"][0]["image"],
        "nginx:1.27"
    );
    let cm = c.json(&["-n", "shop", "get", "configmap", "cfg"]);
    assert_eq!(cm["data"]["a"], "b");
    let secret = c.json(&["-n", "shop", "get", "secret", "s"]);
    assert_eq!(secret["data"]["p"], "cQ==");

    // A subresource body: TokenRequest, sent as protobuf to serviceaccounts/default/token.
    let out = c.run(&[
        "-v=8",
        "-n",
        "shop",
        "create",
        "token",
        "default",
        "--duration=10m",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("Content-Type: application/vnd.kubernetes.protobuf"),
        "{stderr}"
    );
    assert!(String::from_utf8_lossy(&out.stdout).trim().len() > 10);

    let namespaces = c.ok(&["get", "ns"]);
    assert!(
        namespaces.lines().any(|l| l.starts_with("shop ")),
        "{namespaces}"
    );
}

/// The last protobuf request body in kubectl's `-v=9` log, which hex-dumps it.
fn sent_protobuf(stderr: &str) -> Option<Vec<u8>> {
    let mut bodies = Vec::new();
    let mut lines = stderr.lines();
    while let Some(line) = lines.next() {
        if !line.contains("\"Request Body\" body=<") {
            continue;
        }
        let mut body = Vec::new();
        for dump in lines.by_ref() {
            // `\t00000010  73 70 61 63 ...  |spac...|`, ended by ` >`.
            let Some(hex) = dump.strip_prefix('\t') else {
                break;
            };
            let hex = hex.split('|').next().unwrap_or_default();
            for byte in hex.split_whitespace().skip(1) {
                body.push(u8::from_str_radix(byte, 16).unwrap());
            }
        }
        bodies.push(body);
    }
    bodies.into_iter().rev().find(|b| b.starts_with(b"k8s\0"))
}

/// For each generator command, the protobuf body kubectl sends decodes to exactly the JSON the
/// same command prints with `--dry-run=client -o json` (the JSON it would send).
#[test]
fn decoded_bodies_equal_what_kubectl_would_send_as_json() {
    let c = Cluster::start();
    c.ok(&["create", "namespace", "shop"]);
    c.ok(&[
        "-n",
        "shop",
        "create",
        "deployment",
        "api",
        "--image=nginx:1.27",
        "--port=8080",
    ]);
    let commands = [
        "create namespace n2",
        "run web --image=nginx:1.27 --port=80 --env=A=B --labels=app=web -- sleep 1",
        "create deployment web --image=nginx --replicas=3 --port=80",
        "create deployment zero --image=nginx --replicas=0",
        "create configmap cfg --from-literal=a=b --from-literal=c=d",
        "create secret generic s --from-literal=p=q --type=Opaque",
        "create secret docker-registry reg --docker-server=r.example --docker-username=u \
         --docker-password=p",
        "create service clusterip svc --tcp=80:8080",
        "create service nodeport np --tcp=80:http --node-port=30080",
        "create job j --image=busybox -- echo hi",
        "create serviceaccount sa",
        "create priorityclass pc --value=1000 --description=d",
        "create poddisruptionbudget pdb --selector=app=web --min-available=50%",
        "create quota q --hard=cpu=1,memory=1G,pods=10",
        "create role r --verb=get,list --resource=pods,deployments.apps",
        "create rolebinding rb --role=r --user=u --serviceaccount=shop:sa",
        "create cronjob cj --image=busybox --schedule=@hourly -- date",
        "expose deployment api --port=80 --target-port=8080 --name=api-svc",
    ];
    for command in commands {
        let mut args = vec!["-n", "shop"];
        args.extend(command.split_whitespace());
        // Flags go before `--`, after which everything is the container's command.
        let at = args.iter().position(|a| *a == "--").unwrap_or(args.len());
        let want: Value = {
            let mut dry = args.clone();
            dry.splice(at..at, ["--dry-run=client", "-o", "json"]);
            serde_json::from_str(&c.ok(&dry)).unwrap()
        };
        // The server does not serve cronjobs: kubectl is refused after the body was sent and
        // logged.
        let mut logged = vec!["-v=9"];
        logged.extend_from_slice(&args);
        let out = c.run(&logged);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let served = !command.starts_with("create cronjob");
        assert!(
            out.status.success() || !served,
            "kubectl {} failed:\n{stderr}",
            args.join(" ")
        );
        let Some(body) = sent_protobuf(&stderr) else {
            // This kubectl sends `run` and `expose` as JSON (they go through its resource
            // helper); every `create` generator must be protobuf.
            assert!(
                command.starts_with("run ") || command.starts_with("expose "),
                "kubectl {} sent no protobuf body:\n{stderr}",
                args.join(" ")
            );
            continue;
        };
        let got = decode_k8s_protobuf(&body)
            .unwrap_or_else(|e| panic!("kubectl {}: {e}", args.join(" ")));
        assert_eq!(got, want, "kubectl {}", args.join(" "));
    }
}

#[test]
fn kubectl_apply_label_patch_get_and_delete() {
    let c = Cluster::start();
    let manifest = c.dir.join("app.yaml");
    std::fs::write(
        &manifest,
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: shop\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cfg\n  namespace: shop\ndata:\n  a: \"1\"\n---\napiVersion: v1\nkind: Pod\nmetadata:\n  name: web\n  namespace: shop\n  labels: {app: web}\nspec:\n  schedulerName: none\n  containers:\n  - name: web\n    image: nginx:1.27\n",
    )
    .unwrap();
    let m = manifest.to_str().unwrap();
    let out = c.ok(&["apply", "-f", m]);
    assert!(
        out.contains("pod/web created") && out.contains("namespace/shop created"),
        "{out}"
    );
    // Applying again is a no-op, changing the file is a patch.
    assert!(c.ok(&["apply", "-f", m]).contains("pod/web unchanged"));
    std::fs::write(
        &manifest,
        std::fs::read_to_string(&manifest)
            .unwrap()
            .replace("a: \"1\"", "a: \"2\""),
    )
    .unwrap();
    assert!(
        c.ok(&["apply", "-f", m])
            .contains("configmap/cfg configured")
    );
    assert_eq!(
        c.ok(&["-n", "shop", "get", "cm", "cfg", "-o", "jsonpath={.data.a}"]),
        "2"
    );
    c.ok(&["-n", "shop", "label", "pod", "web", "tier=front"]);
    c.ok(&[
        "-n",
        "shop",
        "patch",
        "pod",
        "web",
        "-p",
        r#"{"metadata":{"annotations":{"x":"y"}}}"#,
    ]);
    c.ok(&[
        "-n",
        "shop",
        "patch",
        "pod",
        "web",
        "--type=json",
        "-p",
        r#"[{"op":"replace","path":"/spec/containers/0/image","value":"nginx:1.28"}]"#,
    ]);
    let pod: Value =
        serde_json::from_str(&c.ok(&["-n", "shop", "get", "pod", "web", "-o", "json"])).unwrap();
    assert_eq!(pod["metadata"]["labels"]["tier"], "front");
    assert_eq!(pod["metadata"]["annotations"]["x"], "y");
    assert_eq!(pod["spec"]["containers"][0]["image"], "nginx:1.28");
    let table = c.ok(&["-n", "shop", "get", "pods", "-o", "wide"]);
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        [
            "NAME",
            "READY",
            "STATUS",
            "RESTARTS",
            "AGE",
            "IP",
            "NODE",
            "NOMINATED",
            "NODE",
            "READINESS",
            "GATES"
        ]
    );
    assert!(table.contains("Pending"), "{table}");
    // An invalid change is refused with the server's reason.
    let out = c.run(&[
        "-n",
        "shop",
        "patch",
        "pod",
        "web",
        "-p",
        r#"{"spec":{"restartPolicy":"Never"}}"#,
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("pod updates may not change fields"));
    assert!(
        c.ok(&["-n", "shop", "delete", "pod", "web"])
            .contains("pod \"web\" deleted")
    );
    let out = c.run(&["-n", "shop", "get", "pod", "web"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("NotFound"));
    // Server-side dry run writes nothing.
    c.ok(&[
        "-n",
        "shop",
        "create",
        "configmap",
        "dry",
        "--from-literal=a=b",
        "--dry-run=server",
    ]);
    assert!(!c.run(&["-n", "shop", "get", "cm", "dry"]).status.success());
}

#[test]
fn kubectl_get_watch_prints_changes_as_they_happen() {
    use std::io::Read;
    let c = Cluster::start();
    c.ok(&["create", "configmap", "first", "--from-literal=a=b"]);
    let mut watch = Command::new(kubectl())
        .arg("--kubeconfig")
        .arg(c.dir.join("kubeconfig"))
        .args(["get", "configmaps", "-w"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut out = watch.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut seen = String::new();
        let mut buf = [0u8; 512];
        while !seen.contains("second") {
            match out.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => seen.push_str(&String::from_utf8_lossy(&buf[..n])),
            }
        }
        seen
    });
    // Whether the watch has started or not, "second" must show (in the list or as an event).
    c.ok(&["create", "configmap", "second", "--from-literal=a=b"]);
    let waited = std::time::Instant::now();
    while !reader.is_finished() && waited.elapsed() < std::time::Duration::from_secs(30) {
        std::thread::yield_now();
        std::thread::park_timeout(std::time::Duration::from_millis(50));
    }
    let _ = watch.kill();
    let _ = watch.wait();
    let seen = reader.join().unwrap();
    assert!(seen.contains("first") && seen.contains("second"), "{seen}");
    assert!(seen.starts_with("NAME"), "{seen}");
}

/// RBAC objects apply like any other (server-side dry run first, which stores nothing), and a
/// ServiceAccount token from `kubectl create token` then gets exactly what they grant.
#[test]
fn kubectl_applies_rbac_and_its_identities_are_held_to_it() {
    let c = Cluster::start();
    let manifest = c.dir.join("rbac.yaml");
    std::fs::write(
        &manifest,
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: shop\n---\n\
         apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: vn\n  namespace: kube-system\n---\n\
         apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata:\n  name: tensile:reader\n\
         rules:\n  - apiGroups: [\"\"]\n    resources: [\"nodes\"]\n    verbs: [\"get\", \"list\", \"watch\"]\n---\n\
         apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata:\n  name: tensile:reader\n\
         roleRef:\n  apiGroup: rbac.authorization.k8s.io\n  kind: ClusterRole\n  name: tensile:reader\n\
         subjects:\n  - kind: ServiceAccount\n    name: vn\n    namespace: kube-system\n---\n\
         apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata:\n  name: pods\n  namespace: shop\n\
         rules:\n  - apiGroups: [\"\"]\n    resources: [\"pods\"]\n    verbs: [\"get\", \"list\"]\n---\n\
         apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata:\n  name: pods\n  namespace: shop\n\
         roleRef:\n  apiGroup: rbac.authorization.k8s.io\n  kind: Role\n  name: pods\n\
         subjects:\n  - kind: ServiceAccount\n    name: vn\n    namespace: kube-system\n",
    )
    .unwrap();
    let m = manifest.to_str().unwrap();

    // Server-side dry run: validated and admitted, nothing stored. (The namespace does not
    // exist yet either, so only cluster-scoped objects and kube-system's can be checked.)
    let out = c.run(&["apply", "--dry-run=server", "-f", m]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    for object in [
        "clusterrole.rbac.authorization.k8s.io/tensile:reader created (server dry run)",
        "clusterrolebinding.rbac.authorization.k8s.io/tensile:reader created (server dry run)",
    ] {
        assert!(
            stdout.contains(object),
            "{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let out = c.run(&["get", "clusterrole", "tensile:reader"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("NotFound"));

    let out = c.ok(&["apply", "-f", m]);
    for object in [
        "clusterrole.rbac.authorization.k8s.io/tensile:reader created",
        "clusterrolebinding.rbac.authorization.k8s.io/tensile:reader created",
        "role.rbac.authorization.k8s.io/pods created",
        "rolebinding.rbac.authorization.k8s.io/pods created",
    ] {
        assert!(out.contains(object), "{out}");
    }
    // Applying again changes nothing; a dry run of the same is unchanged too.
    let again = c.ok(&["apply", "-f", m]);
    assert!(
        again.contains("rolebinding.rbac.authorization.k8s.io/pods unchanged"),
        "{again}"
    );
    let dry = c.ok(&["apply", "--dry-run=server", "-f", m]);
    assert!(
        dry.contains("role.rbac.authorization.k8s.io/pods unchanged (server dry run)"),
        "{dry}"
    );
    let table = c.ok(&["-n", "shop", "get", "rolebindings", "-o", "wide"]);
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        ["NAME", "ROLE", "AGE", "USERS", "GROUPS", "SERVICEACCOUNTS"]
    );
    assert!(table.contains("Role/pods"), "{table}");
    assert!(table.contains("kube-system/vn"), "{table}");
    let roles = c.ok(&["get", "clusterroles"]);
    assert!(
        roles.lines().next().unwrap().contains("CREATED AT"),
        "{roles}"
    );
    assert!(roles.contains("tensile:reader"), "{roles}");

    // The ServiceAccount's own kubeconfig.
    let token = c.ok(&["-n", "kube-system", "create", "token", "vn"]);
    let kubeconfig = c.dir.join("vn.kubeconfig");
    std::fs::write(
        &kubeconfig,
        c.server.kubeconfig_with_token("vn", token.trim()),
    )
    .unwrap();
    let vn = |args: &[&str]| c.run_with(&kubeconfig, args);
    let out = vn(&["-n", "shop", "get", "pods"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = vn(&["get", "nodes"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        c.server.forbidden().is_empty(),
        "{:?}",
        c.server.forbidden()
    );
    let out = vn(&["-n", "default", "get", "pods"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(
            "pods is forbidden: User \"system:serviceaccount:kube-system:vn\" cannot list resource \"pods\" in API group \"\" in the namespace \"default\""
        ),
        "{stderr}"
    );
    let out = vn(&[
        "-n",
        "shop",
        "create",
        "configmap",
        "x",
        "--from-literal=a=b",
        "--dry-run=server",
    ]);
    assert!(!out.status.success());
    let denied: Vec<String> = c
        .server
        .forbidden()
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        denied,
        [
            "User \"system:serviceaccount:kube-system:vn\" cannot list resource \"pods\" in API group \"\" in the namespace \"default\"",
            "User \"system:serviceaccount:kube-system:vn\" cannot create resource \"configmaps\" in API group \"\" in the namespace \"shop\"",
        ]
    );
}

#[test]
fn kubectl_scale_goes_through_the_scale_subresource() {
    let c = Cluster::start();
    c.ok(&[
        "create",
        "deployment",
        "web",
        "--image=nginx:1.27",
        "--replicas=2",
    ]);
    // A PATCH of deployments/web/scale.
    let out = c.ok(&["scale", "deployment", "web", "--replicas=0"]);
    assert!(out.contains("deployment.apps/web scaled"), "{out}");
    let replicas = || {
        c.ok(&[
            "get",
            "deployment",
            "web",
            "-o",
            "jsonpath={.spec.replicas}",
        ])
    };
    assert_eq!(replicas(), "0");
    // With a precondition kubectl reads the Scale first, then PUTs it back.
    let out = c.ok(&[
        "scale",
        "deployment",
        "web",
        "--current-replicas=0",
        "--replicas=3",
    ]);
    assert!(out.contains("deployment.apps/web scaled"), "{out}");
    assert_eq!(replicas(), "3");
    let out = c.run(&[
        "scale",
        "deployment",
        "web",
        "--current-replicas=1",
        "--replicas=2",
    ]);
    assert!(!out.status.success());
    assert_eq!(replicas(), "3");
    // The Scale itself, printed by the server.
    let table = c.ok(&["get", "deployment", "web", "--subresource=scale"]);
    let mut lines = table.lines();
    let header: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(header, ["NAME", "DESIRED", "AVAILABLE", "AGE"], "{table}");
    let row: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(row[..2], ["web", "3"], "{table}");
}

/// An ordinary application applies as it would on Kubernetes: the kinds the simulator stores
/// without acting on them (Ingress, NetworkPolicy, HorizontalPodAutoscaler...) are served,
/// listed with kubectl's columns, and a review is created through kubectl's client-side
/// validation (which falls back to `/openapi/v2` for kinds without a PATCH operation).
/// What `workloads::an_ordinary_application_applies_runs_and_lists_and_reviews_are_created`
/// (on both backends) leaves out: kinds stored and acted on by nothing, and the simulator's
/// own word on why an autoscaler never scales.
#[test]
fn kubectl_applies_kinds_nothing_acts_on_and_says_why_an_autoscaler_never_scales() {
    let c = Cluster::start();
    let manifest = c.dir.join("app.yaml");
    std::fs::write(
        &manifest,
        r#"apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata: {name: web, namespace: default}
spec:
  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: web}
  minReplicas: 2
  maxReplicas: 5
  metrics:
  - type: Resource
    resource: {name: cpu, target: {type: Utilization, averageUtilization: 60}}
---
apiVersion: v1
kind: PodTemplate
metadata: {name: tpl, namespace: default}
template:
  metadata: {labels: {app: web}}
  spec: {containers: [{name: c, image: nginx:1.27}]}
---
apiVersion: node.k8s.io/v1
kind: RuntimeClass
metadata: {name: gvisor}
handler: runsc
"#,
    )
    .unwrap();
    let m = manifest.to_str().unwrap();
    let out = c.ok(&["apply", "-f", m]);
    for created in [
        "horizontalpodautoscaler.autoscaling/web created",
        "podtemplate/tpl created",
        "runtimeclass.node.k8s.io/gvisor created",
    ] {
        assert!(out.contains(created), "{created} missing from:\n{out}");
    }
    let hpa = c.ok(&["get", "hpa", "web"]);
    assert!(
        hpa.contains("Deployment/web") && hpa.contains("cpu: <unknown>/60%"),
        "{hpa}"
    );
    let described = c.ok(&["describe", "hpa", "web"]);
    assert!(
        described.contains("ScalingActive")
            && described.contains("NoAutoscaler")
            && described.contains("runs no horizontal pod autoscaler"),
        "{described}"
    );
    c.ok(&["delete", "-f", m]);
    assert!(!c.run(&["get", "hpa", "web"]).status.success());
}

/// `kubectl explain` of every kind served, as kubectl finds it: the kind of the resource's
/// operations in its group-version's OpenAPI v3 document, then the schema carrying that kind,
/// with its description and fields.
#[test]
fn kubectl_explains_every_kind_served() {
    use tensile_sim::apiserver::resources::RESOURCES;
    let c = Cluster::start();
    for r in RESOURCES {
        let api_version = format!("--api-version={}", r.api_version());
        let out = c.ok(&["explain", r.plural, &api_version]);
        let words = out.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(
            words.contains(&format!("KIND: {} VERSION: {}", r.kind, r.version))
                && words.contains("DESCRIPTION:")
                && !words.contains("DESCRIPTION: <empty>")
                && words.contains("FIELDS:")
                && words.contains("apiVersion <string>")
                && words.contains("metadata <ObjectMeta>"),
            "kubectl explain {} {api_version}:\n{out}",
            r.plural
        );
    }
}
