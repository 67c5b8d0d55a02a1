//! Monitoring in the chart (`monitoring.*` of `charts/tensile`), checked against the real thing:
//! `helm template` renders the PodMonitors, the PrometheusRule and the Grafana dashboard;
//! `promtool check rules` accepts the rule's spec and `promtool test rules` passes the unit
//! tests of every alert (`charts/tensile/tests/alerts_test.yaml`); and a real Prometheus
//! scraping the `tensile` components of a running sandbox answers every query of the dashboard
//! with data and evaluates every alert without error.
//!
//! helm comes from `TENSILE_HELM` (`scripts/helm-bin`), promtool and prometheus from the folder
//! `TENSILE_PROMETHEUS` names (`scripts/prometheus-bin` builds them from Go modules; `.ci/run`
//! and `scripts/test` set both). Without them these tests fail, saying so.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use tensile_testenv::{ClusterSpec, TestEnv};

mod common;
use common::{Killed, kubectl, until};

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

/// `promtool` or `prometheus` of the folder `TENSILE_PROMETHEUS` names.
fn prometheus_bin(name: &str) -> PathBuf {
    let dir = std::env::var_os("TENSILE_PROMETHEUS")
        .map(PathBuf::from)
        .expect(
            "TENSILE_PROMETHEUS is not set: these tests need promtool and prometheus; build them \
             with `export TENSILE_PROMETHEUS=$(scripts/prometheus-bin | tail -1)` (as .ci/run \
             and scripts/test do)",
        );
    let path = dir.join(name);
    assert!(
        path.is_file(),
        "TENSILE_PROMETHEUS={} has no {name}: run scripts/prometheus-bin",
        dir.display()
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

/// The chart rendered with every monitoring value on: its objects by kind and name.
fn rendered() -> BTreeMap<String, Value> {
    let yaml = run(Command::new(helm())
        .args(["template", "tensile"])
        .arg(repo("charts/tensile"))
        .args([
            "--set",
            "monitoring.serviceMonitor.enabled=true,monitoring.prometheusRule.enabled=true",
            "--set",
            "monitoring.dashboards.enabled=true",
        ]));
    let docs: Vec<Value> = serde_saphyr::from_multiple(&yaml).unwrap();
    docs.into_iter()
        .filter(Value::is_object)
        .map(|d| {
            let key = format!(
                "{} {}",
                d["kind"].as_str().unwrap(),
                d["metadata"]["name"].as_str().unwrap()
            );
            (key, d)
        })
        .collect()
}

/// A fresh folder under the system's temporary one, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(what: &str) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "tensile-{what}-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_nanos()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The PrometheusRule's spec, as a rule file `tensile-alerts.yaml` in `dir`; its alerts.
fn write_rules(objects: &BTreeMap<String, Value>, dir: &Path) -> Vec<Value> {
    let spec = &objects["PrometheusRule tensile"]["spec"];
    std::fs::write(
        dir.join("tensile-alerts.yaml"),
        serde_json::to_string_pretty(spec).unwrap(),
    )
    .unwrap();
    spec["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap().clone())
        .collect()
}

/// The headings of docs/operations.md as GitHub anchors them.
fn operations_anchors() -> Vec<String> {
    std::fs::read_to_string(repo("docs/operations.md"))
        .unwrap()
        .lines()
        .filter_map(|l| l.strip_prefix('#'))
        .map(|h| {
            h.trim_start_matches('#')
                .trim()
                .to_lowercase()
                .chars()
                .filter_map(|c| match c {
                    ' ' => Some('-'),
                    c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
                    _ => None,
                })
                .collect()
        })
        .collect()
}

#[test]
fn the_chart_renders_monitoring_and_promtool_accepts_its_rules() {
    let objects = rendered();
    // A PodMonitor per component, on its `metrics` port, job named after the component.
    for component in [
        "tensile-virtual-node",
        "tensile-webhook",
        "tensile-scheduler",
        "tensile-descheduler",
    ] {
        let m = &objects[&format!("PodMonitor {component}")];
        assert_eq!(m["apiVersion"], "monitoring.coreos.com/v1");
        assert_eq!(m["spec"]["jobLabel"], "app.kubernetes.io/name");
        assert_eq!(
            m["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"],
            component
        );
        assert_eq!(m["spec"]["podMetricsEndpoints"][0]["port"], "metrics");
        // The port the monitor names is the one the component serves its metrics on.
        let deployments: Vec<&Value> = objects
            .iter()
            .filter(|(k, d)| {
                k.starts_with("Deployment ")
                    && d["metadata"]["labels"]["app.kubernetes.io/name"] == component
            })
            .map(|(_, d)| d)
            .collect();
        assert!(!deployments.is_empty(), "{component}");
        for d in deployments {
            let c = &d["spec"]["template"]["spec"]["containers"][0];
            let port = c["ports"]
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["name"] == "metrics")
                .unwrap_or_else(|| panic!("{component}: no port named metrics"));
            let flag = format!("--metrics-addr=:{}", port["containerPort"]);
            assert!(
                c["args"].as_array().unwrap().contains(&Value::from(flag)),
                "{component}"
            );
        }
    }
    let dashboard = &objects["ConfigMap tensile-dashboard"];
    assert_eq!(dashboard["metadata"]["labels"]["grafana_dashboard"], "1");
    let json: Value =
        serde_json::from_str(dashboard["data"]["tensile.json"].as_str().unwrap()).unwrap();
    assert_eq!(json["uid"], "tensile-kube");

    let dir = TempDir::new("rules");
    let alerts = write_rules(&objects, &dir.0);
    let out = run(Command::new(prometheus_bin("promtool"))
        .args(["check", "rules"])
        .arg(dir.0.join("tensile-alerts.yaml")));
    assert!(out.contains("SUCCESS"), "{out}");
    // Every alert says what, why and where its runbook is: a section of docs/operations.md.
    let anchors = operations_anchors();
    assert_eq!(alerts.len(), 8, "{alerts:?}");
    for alert in &alerts {
        let name = alert["alert"].as_str().unwrap();
        let a = &alert["annotations"];
        for key in ["summary", "description"] {
            assert!(
                a[key].as_str().is_some_and(|s| s.len() > 20),
                "{name}: {key}"
            );
        }
        let url = a["runbook_url"].as_str().unwrap();
        let (page, anchor) = url.split_once('#').unwrap();
        assert!(page.ends_with("/docs/operations.md"), "{name}: {url}");
        assert_eq!(anchor, name.to_lowercase(), "{name}");
        assert!(
            anchors.iter().any(|a| a == anchor),
            "{name}: no section {anchor} in docs/operations.md"
        );
    }
}

#[test]
fn every_alert_fires_when_it_should_and_stays_quiet_otherwise() {
    let objects = rendered();
    let dir = TempDir::new("rule-tests");
    let alerts = write_rules(&objects, &dir.0);
    let tests_file = repo("charts/tensile/tests/alerts_test.yaml");
    let text = std::fs::read_to_string(&tests_file).unwrap();
    std::fs::write(dir.0.join("alerts_test.yaml"), &text).unwrap();
    let out = Command::new(prometheus_bin("promtool"))
        .args(["test", "rules"])
        .arg(dir.0.join("alerts_test.yaml"))
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success() && said.contains("SUCCESS"), "{said}");
    // Each alert has a case where it fires and one where it does not.
    let tests: Value = serde_saphyr::from_str(&text).unwrap();
    let cases: Vec<&Value> = tests["tests"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|t| t["alert_rule_test"].as_array().unwrap())
        .collect();
    for alert in &alerts {
        let name = alert["alert"].as_str().unwrap();
        let of: Vec<&&Value> = cases.iter().filter(|c| c["alertname"] == name).collect();
        let firing = |c: &&&Value| c["exp_alerts"].as_array().is_some_and(|a| !a.is_empty());
        assert!(of.iter().any(firing), "{name}: no case where it fires");
        assert!(
            of.iter().any(|c| !firing(c)),
            "{name}: no case where it stays quiet"
        );
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `tensile ARGS` with its log in `dir/NAME.log`, killed when dropped.
fn tensile(dir: &Path, name: &str, args: &[String], env: &[(&str, String)]) -> Killed {
    Killed(
        Command::new(env!("CARGO_BIN_EXE_tensile"))
            .args(args)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join(format!("{name}.log"))).unwrap())
            .spawn()
            .unwrap(),
    )
}

/// `s` for a URL's query.
fn percent_encoded(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// GET `path` of Prometheus' HTTP API: its `data`, or why not.
fn api(runtime: &tokio::runtime::Runtime, addr: SocketAddr, path: &str) -> Result<Value, String> {
    let (status, body) = runtime
        .block_on(tensile_testenv::http_get(addr, path))
        .map_err(|e| e.to_string())?;
    let v: Value = serde_json::from_str(&body).map_err(|e| format!("{status}: {e}: {body}"))?;
    if v["status"] != "success" {
        return Err(format!("{status}: {body}"));
    }
    Ok(v["data"].clone())
}

/// The instant query `q`: its result vector, or why not.
fn query(
    runtime: &tokio::runtime::Runtime,
    addr: SocketAddr,
    q: &str,
) -> Result<Vec<Value>, String> {
    let data = api(
        runtime,
        addr,
        &format!("/api/v1/query?query={}", percent_encoded(q)),
    )?;
    Ok(data["result"].as_array().cloned().unwrap_or_default())
}

/// The dashboard's queries, with its variables given: the virtual node `node`, a rate window
/// fit for a scrape every second.
fn dashboard_queries(objects: &BTreeMap<String, Value>, node: &str) -> Vec<(String, String)> {
    let json: Value = serde_json::from_str(
        objects["ConfigMap tensile-dashboard"]["data"]["tensile.json"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    let mut out = Vec::new();
    for panel in json["panels"].as_array().unwrap() {
        for t in panel["targets"].as_array().into_iter().flatten() {
            let expr = t["expr"]
                .as_str()
                .unwrap()
                .replace("$node", node)
                .replace("$__rate_interval", "30s");
            assert!(!expr.contains('$'), "a variable left in {expr}");
            out.push((panel["title"].as_str().unwrap().to_owned(), expr));
        }
    }
    assert!(out.len() >= 10, "{out:?}");
    out
}

#[test]
fn a_real_prometheus_scrapes_the_components_and_answers_every_dashboard_query() {
    let prometheus = prometheus_bin("prometheus");
    let objects = rendered();
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
    let dir = env.dir().to_path_buf();
    let kubeconfig = format!("--kubeconfig={}", upper.display());
    let metrics: BTreeMap<&str, u16> = [
        "tensile-virtual-node",
        "tensile-webhook",
        "tensile-scheduler",
        "tensile-descheduler",
    ]
    .into_iter()
    .map(|c| (c, free_port()))
    .collect();
    let metrics_addr = |c: &str| format!("--metrics-addr=127.0.0.1:{}", metrics[c]);
    let s = |v: &[&str]| v.iter().map(|a| (*a).to_owned()).collect::<Vec<_>>();
    // As the chart runs them: elected where the chart elects, metrics on their own port.
    let _node = tensile(
        &dir,
        "virtual-node",
        &[
            s(&[
                "virtual-node",
                "--nodename=vk-lower",
                "--disable-taint=true",
            ]),
            vec![
                kubeconfig.clone(),
                format!("--client-kubeconfig={}", lower.display()),
                "--kubelet-address=127.0.0.1".into(),
                "--leader-elect".into(),
                metrics_addr("tensile-virtual-node"),
            ],
        ]
        .concat(),
        &[
            ("KUBELET_PORT", free_port().to_string()),
            ("VKUBELET_POD_IP", "127.0.0.1".into()),
            ("VKUBELET_NODE_LABEL", "clusterID:lower".into()),
            ("POD_NAMESPACE", "kube-system".into()),
        ],
    );
    let _webhook = tensile(
        &dir,
        "webhook",
        &[
            s(&["webhook", "--address=127.0.0.1"]),
            vec![
                format!("--port={}", free_port()),
                kubeconfig.clone(),
                metrics_addr("tensile-webhook"),
            ],
        ]
        .concat(),
        &[],
    );
    let _scheduler = tensile(
        &dir,
        "scheduler",
        &[
            s(&["scheduler", "--address=127.0.0.1", "--leader-elect"]),
            vec![
                format!("--port={}", free_port()),
                format!("--cluster=lower={}", lower.display()),
                kubeconfig.clone(),
                metrics_addr("tensile-scheduler"),
            ],
        ]
        .concat(),
        &[("POD_NAMESPACE", "kube-system".into())],
    );
    let _descheduler = tensile(
        &dir,
        "descheduler",
        &[
            s(&["descheduler", "--leader-elect"]),
            vec![kubeconfig.clone(), metrics_addr("tensile-descheduler")],
        ]
        .concat(),
        &[("POD_NAMESPACE", "kube-system".into())],
    );
    // A pod offloaded, so the node's create latency and capacity used have data.
    until("virtual node registered", || {
        kubectl(&upper, &["get", "node", "vk-lower"]).0
    });
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

    // Prometheus on loopback, its data in the test's folder, the chart's rules loaded.
    let prom_dir = TempDir::new("prometheus");
    write_rules(&objects, &prom_dir.0);
    let mut config = String::from(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - tensile-alerts.yaml\nscrape_configs:\n",
    );
    for (job, port) in &metrics {
        config.push_str(&format!(
            "  - job_name: {job}\n    static_configs:\n      - targets: ['127.0.0.1:{port}']\n"
        ));
    }
    std::fs::write(prom_dir.0.join("prometheus.yml"), &config).unwrap();
    let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let log = prom_dir.0.join("prometheus.log");
    let _prometheus = Killed(
        Command::new(&prometheus)
            .arg(format!(
                "--config.file={}",
                prom_dir.0.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                prom_dir.0.join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    let prometheus_log = || std::fs::read_to_string(&log).unwrap_or_default();
    // Every target scraped successfully.
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let up = query(&runtime, addr, "up").unwrap_or_default();
        let healthy = up.iter().filter(|s| s["value"][1] == "1").count();
        if healthy == metrics.len() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the scrapes did not all succeed: up = {up:?}\n{}",
            prometheus_log()
        );
        std::thread::park_timeout(Duration::from_millis(500));
    }
    // Every query of the dashboard answers with data (rates need two scrapes of a series).
    let queries = dashboard_queries(&objects, "vk-lower");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let empty: Vec<String> = queries
            .iter()
            .filter_map(|(panel, q)| match query(&runtime, addr, q) {
                Ok(r) if !r.is_empty() => None,
                Ok(_) => Some(format!("{panel}: {q}: no data")),
                Err(e) => Some(format!("{panel}: {q}: {e}")),
            })
            .collect();
        if empty.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "dashboard queries without data:\n{}",
            empty.join("\n")
        );
        std::thread::park_timeout(Duration::from_secs(1));
    }
    // Every alert evaluates against the real series without error.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let groups = api(&runtime, addr, "/api/v1/rules").unwrap();
        let rules: Vec<Value> = groups["groups"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|g| g["rules"].as_array().unwrap().clone())
            .collect();
        assert_eq!(rules.len(), 8, "{groups}");
        let bad: Vec<&Value> = rules.iter().filter(|r| r["health"] != "ok").collect();
        if bad.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "rules not healthy: {bad:?}");
        std::thread::park_timeout(Duration::from_millis(500));
    }
    // The leaders report 1 under their Lease, the virtual node's with its node's name.
    let leaders = query(&runtime, addr, "tensile_leader == 1").unwrap();
    for lease in [
        "kube-system/tensile-virtual-node-vk-lower",
        "kube-system/tensile-scheduler",
        "kube-system/tensile-descheduler",
    ] {
        assert!(
            leaders.iter().any(|s| s["metric"]["lease"] == lease),
            "{lease}: {leaders:?}"
        );
    }
    drop(runtime);
}
