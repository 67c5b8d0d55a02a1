//! Workloads as a user drives them with the real `kubectl`, on whichever backend TestEnv
//! runs: drains that wait for PodDisruptionBudgets, StatefulSets, DaemonSets and CronJobs, and
//! an ordinary application's manifest (with the kinds nothing acts on in the simulator).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use tensile_testenv::kubectl::Env;

/// The pods of `selector` as `name node ready` lines, sorted.
fn pods(env: &Env, selector: &str) -> Vec<(String, String, bool)> {
    let out = env.jsonpath(
        &["pods", "-l", selector],
        r#"{range .items[*]}{.metadata.name} {.spec.nodeName} {.status.conditions[?(@.type=="Ready")].status} {.metadata.deletionTimestamp}{"\n"}{end}"#,
    );
    let mut v: Vec<_> = out
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            // Terminating pods are left out, as `kubectl get` users read them as leaving.
            (f.len() >= 4 && f[3].is_empty())
                .then(|| (f[0].to_owned(), f[1].to_owned(), f[2] == "True"))
        })
        .collect();
    v.sort();
    v
}

#[test]
fn a_drain_waits_for_the_disruption_budget_and_evicts_once_it_allows() {
    let env = Env::start();
    // Both replicas on node 1.
    env.ok(&["cordon", "c1-node-2"]);
    env.ok(&[
        "create",
        "deployment",
        "db",
        "--image=postgres",
        "--replicas=2",
    ]);
    env.ok(&["rollout", "status", "deployment/db", "--timeout=60s"]);
    env.ok(&["uncordon", "c1-node-2"]);
    env.ok(&[
        "create",
        "poddisruptionbudget",
        "db",
        "--selector=app=db",
        "--min-available=2",
    ]);
    env.until("the budget counting 2 healthy pods", || {
        env.jsonpath(
            &["pdb", "db"],
            "{.status.currentHealthy}/{.status.desiredHealthy}/{.status.disruptionsAllowed}",
        ) == "2/2/0"
    });
    let before = pods(&env, "app=db");
    assert!(
        before.len() == 2 && before.iter().all(|p| p.1 == "c1-node-1"),
        "{before:?}"
    );

    // The budget allows no disruption: the drain retries and gives up, evicting nothing.
    let out = env.run(&["drain", "c1-node-1", "--timeout=12s"], &[], None);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("Cannot evict pod as it would violate the pod's disruption budget."),
        "{stderr}"
    );
    assert_eq!(
        pods(&env, "app=db"),
        before,
        "a refused eviction deletes nothing"
    );
    assert_eq!(
        env.jsonpath(&["node", "c1-node-1"], "{.spec.unschedulable}"),
        "true",
        "the drain cordoned the node"
    );

    // A third replica (on node 2, node 1 is cordoned) leaves room for one disruption at a
    // time: the drain evicts, waits for the replacement, evicts again.
    env.ok(&["scale", "deployment/db", "--replicas=3"]);
    let out = env.run(&["drain", "c1-node-1", "--timeout=120s"], &[], None);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("evicting pod default/db-") && stdout.contains("node/c1-node-1 drained"),
        "{stdout}"
    );
    env.until("three ready replicas on node 2", || {
        let now = pods(&env, "app=db");
        now.len() == 3 && now.iter().all(|p| p.1 == "c1-node-2" && p.2)
    });
}

/// A default class whose volumes a provisioner makes on the pod's node (the sandbox has one;
/// TestEnv runs a provisioner on both backends).
const STATEFULSET: &str = "apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: local
  annotations: {storageclass.kubernetes.io/is-default-class: 'true'}
provisioner: rancher.io/local-path
volumeBindingMode: WaitForFirstConsumer
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: web}
spec:
  serviceName: web
  replicas: 3
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers: [{name: nginx, image: 'nginx:1.27'}]
  volumeClaimTemplates:
  - metadata: {name: data}
    spec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 1Gi}}}
";

#[test]
fn a_statefulset_has_ordered_pods_with_their_own_claims_scales_and_rolls_out() {
    let env = Env::start();
    env.apply("web", STATEFULSET);
    env.ok(&["rollout", "status", "statefulset/web", "--timeout=90s"]);
    let names: Vec<String> = pods(&env, "app=web").into_iter().map(|p| p.0).collect();
    assert_eq!(names, ["web-0", "web-1", "web-2"]);
    assert_eq!(
        env.ok(&["exec", "web-1", "--", "hostname"]).trim(),
        "web-1",
        "a member's hostname is its name"
    );
    assert_eq!(
        env.jsonpath(
            &["pod", "web-1"],
            "{.metadata.labels.statefulset\\.kubernetes\\.io/pod-name} {.metadata.labels.apps\\.kubernetes\\.io/pod-index} {.spec.subdomain} {.spec.volumes[?(@.name==\"data\")].persistentVolumeClaim.claimName}"
        ),
        "web-1 1 web data-web-1"
    );
    env.until("three bound claims", || {
        env.jsonpath(
            &["pvc"],
            "{range .items[*]}{.metadata.name}={.status.phase} {end}",
        ) == "data-web-0=Bound data-web-1=Bound data-web-2=Bound "
    });

    // Scaled down from the highest ordinal; the claims stay.
    env.ok(&["scale", "statefulset/web", "--replicas=1"]);
    env.until("only web-0 left", || {
        pods(&env, "app=web")
            .into_iter()
            .map(|p| p.0)
            .collect::<Vec<_>>()
            == ["web-0"]
    });
    assert_eq!(
        env.jsonpath(&["pvc"], "{.items[*].metadata.name}"),
        "data-web-0 data-web-1 data-web-2"
    );

    // A new template rolls out; both templates are in the history.
    env.ok(&["set", "image", "statefulset/web", "nginx=nginx:1.28"]);
    env.ok(&["rollout", "status", "statefulset/web", "--timeout=90s"]);
    assert_eq!(
        env.jsonpath(&["pod", "web-0"], "{.spec.containers[0].image}"),
        "nginx:1.28"
    );
    let history = env.ok(&["rollout", "history", "statefulset/web"]);
    let revisions: Vec<&str> = history
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|w| w.parse::<u32>().is_ok())
        .collect();
    assert_eq!(revisions, ["1", "2"], "{history}");

    // A deleted member comes back under its name.
    let uid = env.jsonpath(&["pod", "web-0"], "{.metadata.uid}");
    env.ok(&["delete", "pod", "web-0", "--wait=false"]);
    env.until("web-0 back as a new pod", || {
        let now = env.run(
            &[
                "get",
                "pod",
                "web-0",
                "-o",
                "jsonpath={.metadata.uid} {.status.phase}",
            ],
            &[],
            None,
        );
        let text = String::from_utf8_lossy(&now.stdout).into_owned();
        text.ends_with(" Running") && !text.starts_with(&uid)
    });
}

const DAEMONSET: &str = "apiVersion: apps/v1
kind: DaemonSet
metadata: {name: agent}
spec:
  selector: {matchLabels: {app: agent}}
  template:
    metadata: {labels: {app: agent}}
    spec:
      containers: [{name: agent, image: 'fluent/fluent-bit:3.1'}]
";

#[test]
fn a_daemonset_runs_on_every_node_it_tolerates_cordoned_ones_included() {
    let env = Env::start();
    env.ok(&["taint", "node", "c1-node-2", "dedicated=db:NoSchedule"]);
    env.ok(&["cordon", "c1-node-1"]);
    env.apply("agent", DAEMONSET);
    env.ok(&["rollout", "status", "daemonset/agent", "--timeout=90s"]);
    let placed = |env: &Env| -> Vec<String> {
        let mut nodes: Vec<String> = pods(env, "app=agent")
            .into_iter()
            .filter(|p| p.2)
            .map(|p| p.1)
            .collect();
        nodes.sort();
        nodes
    };
    assert_eq!(
        placed(&env),
        ["c1-node-1"],
        "the cordoned node runs it, the tainted one does not"
    );
    assert_eq!(
        env.jsonpath(
            &["daemonset", "agent"],
            "{.status.desiredNumberScheduled}/{.status.currentNumberScheduled}/{.status.numberReady}"
        ),
        "1/1/1"
    );

    // Tolerating the taint is a new template: it rolls out, and the tainted node gets a pod.
    env.ok(&[
        "patch",
        "daemonset",
        "agent",
        "--type=merge",
        "-p",
        r#"{"spec":{"template":{"spec":{"tolerations":[{"key":"dedicated","operator":"Exists"}]}}}}"#,
    ]);
    env.ok(&["rollout", "status", "daemonset/agent", "--timeout=90s"]);
    env.until("a ready agent on each node", || {
        placed(&env) == ["c1-node-1", "c1-node-2"]
    });
    let hashes = env.jsonpath(
        &["pods", "-l", "app=agent"],
        "{.items[*].metadata.labels.controller-revision-hash}",
    );
    let distinct: std::collections::BTreeSet<&str> = hashes.split_whitespace().collect();
    assert_eq!(distinct.len(), 1, "every pod at the new revision: {hashes}");
    assert_eq!(
        env.jsonpath(
            &["pods", "-l", "app=agent"],
            "{.items[0].spec.tolerations[*].key}"
        )
        .split_whitespace()
        .filter(|k| k.starts_with("node.kubernetes.io/"))
        .count(),
        6,
        "the daemon tolerations"
    );
}

const CRONJOBS: &str = "apiVersion: batch/v1
kind: CronJob
metadata: {name: tick}
spec:
  schedule: '@every 5s'
  jobTemplate:
    metadata: {labels: {app: tick}}
    spec:
      template:
        spec:
          restartPolicy: Never
          containers: [{name: tick, image: busybox, command: [sh, -c, 'echo tick']}]
---
apiVersion: batch/v1
kind: CronJob
metadata: {name: sweep}
spec:
  schedule: '@every 5s'
  successfulJobsHistoryLimit: 0
  jobTemplate:
    spec:
      template:
        spec:
          restartPolicy: Never
          containers: [{name: sweep, image: busybox, command: [sh, -c, 'true']}]
";

#[test]
fn a_cronjob_makes_jobs_on_schedule_and_keeps_its_history_to_the_limit() {
    let env = Env::start();
    let refused = env.run(
        &[
            "create",
            "cronjob",
            "bad",
            "--image=busybox",
            "--schedule=61 * * * *",
        ],
        &[],
        None,
    );
    let why = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && why.contains("spec.schedule"),
        "{why}"
    );
    env.apply("cron", CRONJOBS);
    env.until("a completed run of tick", || {
        env.jsonpath(
            &["jobs", "-l", "app=tick"],
            r#"{.items[*].status.conditions[?(@.type=="Complete")].status}"#,
        )
        .contains("True")
    });
    let job = env.jsonpath(&["jobs", "-l", "app=tick"], "{.items[0].metadata.name}");
    let minutes = job
        .strip_prefix("tick-")
        .and_then(|m| m.parse::<u64>().ok());
    assert!(minutes.is_some(), "named after its scheduled minute: {job}");
    assert_eq!(
        env.jsonpath(&["job", &job], "{.metadata.ownerReferences[0].kind}"),
        "CronJob"
    );
    let last_line = |log: String| log.lines().last().unwrap_or_default().to_owned();
    assert_eq!(last_line(env.ok(&["logs", &format!("job/{job}")])), "tick");
    env.until("tick's last schedule and success", || {
        let times = env.jsonpath(
            &["cronjob", "tick"],
            "{.status.lastScheduleTime} {.status.lastSuccessfulTime}",
        );
        times.split(' ').all(|t| !t.is_empty())
    });
    // A history limit of 0 deletes each run once it succeeded.
    env.until("sweep's run deleted after it succeeded", || {
        let events = env.jsonpath(
            &["events", "--field-selector=involvedObject.name=sweep"],
            "{.items[*].reason}",
        );
        events.contains("SuccessfulCreate")
            && events.contains("SuccessfulDelete")
            && env
                .jsonpath(&["jobs"], "{.items[*].metadata.name}")
                .split_whitespace()
                .all(|j| {
                    !j.starts_with("sweep-") || {
                        // A run made after the deletion may be there; it has not succeeded.
                        !env.jsonpath(&["job", j], "{.status.succeeded}")
                            .starts_with('1')
                    }
                })
    });
    // A Job made by hand from the template, as `kubectl create job --from` does.
    env.ok(&["create", "job", "by-hand", "--from=cronjob/tick"]);
    env.ok(&[
        "wait",
        "--for=condition=Complete",
        "job/by-hand",
        "--timeout=60s",
    ]);
    assert_eq!(last_line(env.ok(&["logs", "job/by-hand"])), "tick");
}

/// An ordinary application's manifest: a Deployment behind a Service, published by an
/// Ingress, scaled by a HorizontalPodAutoscaler, fenced by a NetworkPolicy, configured by a
/// ConfigMap (and a VolumeAttributesClass, storage.k8s.io/v1 since 1.34).
const APPLICATION: &str = r#"apiVersion: v1
kind: ConfigMap
metadata: {name: web}
data: {greeting: hello}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  replicas: 2
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers:
      - name: web
        image: nginx:1.27
        ports: [{containerPort: 80}]
        envFrom: [{configMapRef: {name: web}}]
---
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  selector: {app: web}
  ports: [{port: 80, targetPort: 80}]
---
apiVersion: networking.k8s.io/v1
kind: IngressClass
metadata: {name: sandbox}
spec: {controller: example.com/ingress}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: web}
spec:
  ingressClassName: sandbox
  rules:
  - host: web.example.com
    http:
      paths:
      - {path: /, pathType: Prefix, backend: {service: {name: web, port: {number: 80}}}}
---
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata: {name: web}
spec:
  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: web}
  minReplicas: 2
  maxReplicas: 4
  metrics:
  - type: Resource
    resource: {name: cpu, target: {type: Utilization, averageUtilization: 70}}
---
apiVersion: storage.k8s.io/v1
kind: VolumeAttributesClass
metadata: {name: gold}
driverName: csi.example.com
parameters: {iops: "3000"}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: web}
spec:
  podSelector: {matchLabels: {app: web}}
  policyTypes: [Ingress]
  ingress: [{ports: [{port: 80}]}]
"#;

#[test]
fn an_ordinary_application_applies_runs_and_lists_and_reviews_are_created() {
    let env = Env::start();
    let file = env.kubeconfig.with_file_name("application.yaml");
    std::fs::write(&file, APPLICATION).unwrap();
    let file = file.to_str().unwrap();
    let out = env.ok(&["apply", "-f", file]);
    for created in [
        "configmap/web created",
        "deployment.apps/web created",
        "service/web created",
        "ingressclass.networking.k8s.io/sandbox created",
        "ingress.networking.k8s.io/web created",
        "horizontalpodautoscaler.autoscaling/web created",
        "networkpolicy.networking.k8s.io/web created",
        "volumeattributesclass.storage.k8s.io/gold created",
    ] {
        assert!(out.contains(created), "{created} missing from:\n{out}");
    }
    env.ok(&["rollout", "status", "deployment/web", "--timeout=60s"]);
    assert!(
        env.ok(&["apply", "-f", file])
            .contains("ingress.networking.k8s.io/web unchanged"),
        "a second apply changes nothing"
    );

    let listed = env.ok(&["get", "ingress,hpa,networkpolicy"]);
    let names: Vec<&str> = listed
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| *n != "NAME")
        .collect();
    assert_eq!(
        names,
        [
            "ingress.networking.k8s.io/web",
            "horizontalpodautoscaler.autoscaling/web",
            "networkpolicy.networking.k8s.io/web",
        ],
        "{listed}"
    );
    let ingress: Vec<String> = env
        .ok(&["get", "ingress", "web", "--no-headers"])
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    assert_eq!(ingress[..4], ["web", "sandbox", "web.example.com", "80"]);
    assert!(
        env.ok(&["get", "hpa", "web"]).contains("Deployment/web"),
        "the autoscaler names its target"
    );
    assert_eq!(
        env.jsonpath(
            &["networkpolicy", "web"],
            "{.spec.podSelector.matchLabels.app}"
        ),
        "web"
    );

    // Reviews go through kubectl's client-side validation and are answered, not stored.
    let review = |name: &str, manifest: &str| -> serde_json::Value {
        let path = env.kubeconfig.with_file_name(name);
        std::fs::write(&path, manifest).unwrap();
        let out = env.ok(&["create", "-f", path.to_str().unwrap(), "-o", "json"]);
        serde_json::from_str(&out).unwrap()
    };
    let token = review(
        "token-review.yaml",
        "apiVersion: authentication.k8s.io/v1\nkind: TokenReview\nspec: {token: not-a-token}\n",
    );
    assert_ne!(token["status"]["authenticated"], true, "{token}");
    assert!(token["status"]["error"].is_string(), "{token}");
    let access = review(
        "access-review.yaml",
        "apiVersion: authorization.k8s.io/v1\nkind: SelfSubjectAccessReview\nspec:\n  resourceAttributes: {verb: delete, group: networking.k8s.io, resource: ingresses}\n",
    );
    assert_eq!(access["status"]["allowed"], true, "{access}");
    let local = review(
        "local-review.yaml",
        "apiVersion: authorization.k8s.io/v1\nkind: LocalSubjectAccessReview\nmetadata: {namespace: default}\nspec:\n  user: nobody\n  resourceAttributes: {namespace: default, verb: get, resource: pods}\n",
    );
    assert_eq!(local["status"]["allowed"], false, "{local}");
    let me: serde_json::Value =
        serde_json::from_str(&env.ok(&["auth", "whoami", "-o", "json"])).unwrap();
    let groups = me["status"]["userInfo"]["groups"].to_string();
    assert!(groups.contains("system:masters"), "{me}");

    env.ok(&["delete", "-f", file]);
    let left = env.run(
        &["get", "ingress,hpa,networkpolicy", "-o", "name"],
        &[],
        None,
    );
    assert!(
        left.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&left.stdout)
    );
}
