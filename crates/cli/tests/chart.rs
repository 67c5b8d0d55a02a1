//! The Helm chart (`charts/tensile`) against `deploy/`: with its default values, `helm template`
//! renders the same objects as `kubectl kustomize deploy`; `helm lint` finds nothing; its values
//! change what they say; and `helm install` / `helm uninstall` on a cluster (simulated, or real
//! with `TENSILE_K8S_BIN`) create and remove exactly those objects.
//!
//! helm comes from `TENSILE_HELM` (`.ci/run` sets it from `scripts/helm-bin`, which builds it
//! from Go modules). Without it these tests fail, saying so: they never pass without helm.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;
use tensile_testenv::{ClusterSpec, TestEnv};

mod common;
use common::kubectl;

fn repo(sub: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(sub)
}

/// The helm binary `TENSILE_HELM` names.
fn helm() -> PathBuf {
    let path = std::env::var_os("TENSILE_HELM").map(PathBuf::from).expect(
        "TENSILE_HELM is not set: these tests need helm; build it with \
         `export TENSILE_HELM=$(scripts/helm-bin | tail -1)` (as .ci/run does)",
    );
    assert!(
        path.is_file(),
        "TENSILE_HELM={} is not a file",
        path.display()
    );
    path
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Objects of a multi-document YAML stream, by apiVersion, kind, namespace and name.
fn objects(yaml: &str) -> BTreeMap<String, Value> {
    let docs: Vec<Value> = serde_saphyr::from_multiple(yaml).unwrap();
    let mut out = BTreeMap::new();
    for d in docs.into_iter().filter(Value::is_object) {
        let key = format!(
            "{} {} {}/{}",
            d["apiVersion"].as_str().unwrap(),
            d["kind"].as_str().unwrap(),
            d["metadata"]["namespace"].as_str().unwrap_or(""),
            d["metadata"]["name"].as_str().unwrap()
        );
        assert!(out.insert(key.clone(), d).is_none(), "{key} twice");
    }
    out
}

fn template(args: &[&str]) -> BTreeMap<String, Value> {
    objects(&run(Command::new(helm())
        .args(["template", "tensile"])
        .arg(repo("charts/tensile"))
        .args(args)))
}

#[test]
fn the_chart_with_its_default_values_renders_what_kustomize_renders() {
    let chart = template(&[]);
    let kustomize = objects(&run(Command::new("kubectl")
        .arg("kustomize")
        .arg(repo("deploy"))));
    let only_chart: Vec<&String> = chart
        .keys()
        .filter(|k| !kustomize.contains_key(*k))
        .collect();
    let only_kustomize: Vec<&String> = kustomize
        .keys()
        .filter(|k| !chart.contains_key(*k))
        .collect();
    assert!(
        only_chart.is_empty() && only_kustomize.is_empty(),
        "only in the chart: {only_chart:?}; only in deploy/: {only_kustomize:?}"
    );
    for (key, object) in &kustomize {
        assert_eq!(&chart[key], object, "{key} differs");
    }
}

#[test]
fn helm_lint_finds_nothing() {
    let out = run(Command::new(helm()).arg("lint").arg(repo("charts/tensile")));
    // The only note allowed is helm's recommendation of an icon (no project icon exists).
    for line in out.lines().filter(|l| l.starts_with('[')) {
        assert!(line == "[INFO] Chart.yaml: icon is recommended", "{out}");
    }
    assert!(out.contains("0 chart(s) failed"), "{out}");
}

#[test]
fn the_values_change_what_they_say() {
    let objects = template(&[
        "--set",
        "lowerClusters[0].name=east,lowerClusters[1].name=west,lowerClusters[2].name=north",
        "--set",
        "webhook.enabled=false,descheduler.enabled=false",
        "--set",
        "virtualNode.replicas=1,virtualNode.leaderElect=false,image.tag=9.9.9",
        "--set",
        "scheduler.resources.limits.memory=1Gi",
    ]);
    assert!(
        !objects
            .keys()
            .any(|k| k.contains("webhook") || k.contains("descheduler")),
        "{:?}",
        objects.keys()
    );
    let node = &objects["apps/v1 Deployment kube-system/tensile-virtual-node-north"];
    assert_eq!(node["spec"]["replicas"], 1);
    let c = &node["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(c["image"], "ghcr.io/tensile-kube/tensile:9.9.9");
    assert!(
        !c["args"]
            .as_array()
            .unwrap()
            .contains(&Value::from("--leader-elect"))
    );
    assert_eq!(c["env"][0]["value"], "vk-north");
    let scheduler = &objects["apps/v1 Deployment kube-system/tensile-scheduler"];
    let s = &scheduler["spec"]["template"]["spec"];
    let args = s["containers"][0]["args"].as_array().unwrap();
    for name in ["east", "west", "north"] {
        assert!(args.contains(&Value::from(format!(
            "--cluster={name}=/etc/tensile/{name}/kubeconfig"
        ))));
    }
    assert_eq!(s["volumes"].as_array().unwrap().len(), 3);
    assert_eq!(s["containers"][0]["resources"]["limits"]["memory"], "1Gi");
}

#[test]
fn helm_installs_and_uninstalls_the_chart_on_a_cluster() {
    let helm = helm();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let env = runtime
        .block_on(TestEnv::start_with(vec![ClusterSpec::new("upper", 0)]))
        .unwrap();
    let upper = env.clusters[0].kubeconfig.clone();
    let cache = env.dir().join("helm-cache");
    let helm_cmd = |args: &[&str]| {
        let mut c = Command::new(&helm);
        c.args(args)
            .arg("--kubeconfig")
            .arg(&upper)
            .env("HELM_CACHE_HOME", &cache)
            .env("HELM_CONFIG_HOME", &cache)
            .env("HELM_DATA_HOME", &cache);
        c
    };
    run(
        helm_cmd(&["install", "tensile", "--namespace", "kube-system"]).arg(repo("charts/tensile")),
    );
    for (kind, name) in [
        ("deployment", "tensile-virtual-node-lower-1"),
        ("deployment", "tensile-scheduler"),
        ("deployment", "tensile-webhook"),
        ("clusterrole", "tensile-virtual-node"),
    ] {
        let (ok, _, err) = kubectl(&upper, &["get", kind, name, "-n", "kube-system"]);
        assert!(ok, "{kind} {name} not installed: {err}");
    }
    let (ok, _, err) = kubectl(
        &upper,
        &["get", "mutatingwebhookconfiguration", "tensile-webhook"],
    );
    assert!(ok, "{err}");
    run(&mut helm_cmd(&[
        "uninstall",
        "tensile",
        "--namespace",
        "kube-system",
        "--wait",
    ]));
    for (kind, name) in [
        ("deployment", "tensile-virtual-node-lower-1"),
        ("clusterrole", "tensile-virtual-node"),
        ("mutatingwebhookconfiguration", "tensile-webhook"),
    ] {
        let (ok, out, err) = kubectl(
            &upper,
            &[
                "get",
                kind,
                name,
                "-n",
                "kube-system",
                "--ignore-not-found",
                "-o",
                "name",
            ],
        );
        assert!(
            ok && out.trim().is_empty(),
            "{kind} {name} left after uninstall: {out}{err}"
        );
    }
}
