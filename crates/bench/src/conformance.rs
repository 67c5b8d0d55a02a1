//! `tensile bench conformance`: Kubernetes' own end-to-end suite (`e2e.test`, built by
//! `scripts/k8s-bin --conformance`) through the virtual nodes, against the same selection run
//! directly on one lower cluster as the baseline. The clusters are the sandbox's on real
//! control planes with real nodes (`tensile up --k8s-bin DIR --real-nodes`): an upper cluster
//! whose only nodes are two virtual nodes, two lower clusters of one real kubelet each.
//!
//! It writes, under `--out`, each run's JUnit and ginkgo JSON reports and logs, and
//! `summary.md` (a line per test: baseline, through the virtual nodes), and prints one JSON
//! line at the end. docs/conformance.md has the command, the figures and the causes.

#![allow(clippy::print_stdout)] // the report is what the command prints

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context as _, bail};
use serde::Deserialize;

use crate::sandbox::{ExtenderRun, Sandbox, SandboxSpec, StartVirtualNode, VirtualNodeRun};

/// The selection of Kubernetes' conformance runs (as hydrophone and sonobuoy run it).
const FOCUS: &str = r"\[Conformance\]";
const SKIP: &str = r"\[Serial\]|\[Disruptive\]";

#[derive(Debug, clap::Args)]
pub struct ConformanceArgs {
    /// The folder of `scripts/k8s-bin --conformance`: control planes, kubelet, kube-proxy,
    /// CoreDNS, e2e.test, ginkgo, kubectl and the node images.
    #[arg(long, env = "TENSILE_K8S_BIN", value_name = "DIR")]
    k8s_bin: PathBuf,
    /// The tests to run (ginkgo `--focus`), by default every conformance test.
    #[arg(long, default_value = FOCUS)]
    focus: String,
    /// The tests left out (ginkgo `--skip`), by default the serial and disruptive ones.
    #[arg(long, default_value = SKIP)]
    skip: String,
    /// Tests run at once (ginkgo `--procs`).
    #[arg(long, default_value_t = 3)]
    parallel: u32,
    /// Where the reports go.
    #[arg(long, default_value = "conformance-results")]
    out: PathBuf,
    /// Run only one side: `baseline` (the lower cluster directly) or `virtual` (the upper
    /// cluster, through the virtual nodes).
    #[arg(long, value_parser = ["baseline", "virtual"])]
    only: Option<String>,
    /// A whole run's deadline (ginkgo `--timeout`), each side.
    #[arg(long, default_value = "6h")]
    timeout: String,
    /// Start nothing and run nothing: compare the reports already in `--out` (`baseline/` and
    /// `virtual/`, e.g. of two `--only` runs) and write the summary.
    #[arg(long)]
    summarize: bool,
}

/// One spec of a ginkgo JSON report, the part read here.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct SpecReport {
    // ginkgo writes `null` for what a node does not have.
    #[serde(default)]
    container_hierarchy_texts: Option<Vec<String>>,
    #[serde(default)]
    leaf_node_text: Option<String>,
    #[serde(default)]
    leaf_node_type: Option<String>,
    #[serde(default)]
    state: Option<String>,
    #[serde(default)]
    failure: Option<Failure>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Failure {
    #[serde(default)]
    message: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct SuiteReport {
    #[serde(default)]
    spec_reports: Option<Vec<SpecReport>>,
}

/// What happened to one test on one side.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// ginkgo's state: passed, failed, skipped, pending, panicked, timedout, interrupted,
    /// aborted.
    pub state: String,
    /// The first line of its failure, if it failed.
    pub message: String,
}

impl Outcome {
    fn passed(&self) -> bool {
        self.state == "passed"
    }
    fn ran(&self) -> bool {
        self.state != "skipped" && self.state != "pending"
    }
}

/// The tests of a ginkgo JSON report (`It` nodes only, not the suite's set-up), by full name.
pub fn outcomes(json: &[u8]) -> Result<BTreeMap<String, Outcome>, serde_json::Error> {
    let suites: Vec<SuiteReport> = serde_json::from_slice(json)?;
    let mut out = BTreeMap::new();
    for spec in suites
        .into_iter()
        .flat_map(|s| s.spec_reports.unwrap_or_default())
    {
        if spec.leaf_node_type.as_deref() != Some("It") {
            continue;
        }
        let mut name = spec.container_hierarchy_texts.unwrap_or_default().join(" ");
        if !name.is_empty() {
            name.push(' ');
        }
        name.push_str(spec.leaf_node_text.as_deref().unwrap_or_default());
        let message = spec
            .failure
            .and_then(|f| f.message)
            .map(|m| m.lines().next().unwrap_or_default().to_owned())
            .unwrap_or_default();
        out.insert(
            name,
            Outcome {
                state: spec.state.unwrap_or_default(),
                message,
            },
        );
    }
    Ok(out)
}

/// A test's line of the table: its name, then its outcome on each side (None: not run there).
pub type Row = (String, Option<Outcome>, Option<Outcome>);

/// The counts of the final JSON line.
#[derive(Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Counts {
    pub selected: usize,
    pub baseline_passed: usize,
    pub virtual_passed: usize,
    pub virtual_failed_but_baseline_passed: usize,
}

/// Compares the two sides test by test: what was selected (ran on either side), what passed on
/// each, and what passed directly but not through the virtual nodes.
pub fn compare(
    baseline: &BTreeMap<String, Outcome>,
    virtual_side: &BTreeMap<String, Outcome>,
) -> (Counts, Vec<Row>) {
    let mut names: Vec<&String> = baseline.keys().chain(virtual_side.keys()).collect();
    names.sort();
    names.dedup();
    let mut counts = Counts::default();
    let mut rows = Vec::new();
    for name in names {
        let (b, v) = (baseline.get(name), virtual_side.get(name));
        if !b.is_some_and(Outcome::ran) && !v.is_some_and(Outcome::ran) {
            continue;
        }
        counts.selected += 1;
        let (bp, vp) = (
            b.is_some_and(Outcome::passed),
            v.is_some_and(Outcome::passed),
        );
        counts.baseline_passed += usize::from(bp);
        counts.virtual_passed += usize::from(vp);
        // A test the virtual side never reached (an interrupted run) is not a failure there.
        let v_ran = v.is_some_and(Outcome::ran);
        counts.virtual_failed_but_baseline_passed += usize::from(bp && v_ran && !vp);
        rows.push((name.clone(), b.cloned(), v.cloned()));
    }
    (counts, rows)
}

fn cell(o: &Option<Outcome>) -> String {
    match o {
        None => "not run".into(),
        Some(o) if o.message.is_empty() => o.state.clone(),
        Some(o) => format!("{}: {}", o.state, o.message.replace('|', "\\|")),
    }
}

/// The summary table, failures through the virtual nodes first.
pub fn summary_markdown(counts: &Counts, rows: &[Row]) -> String {
    let mut rows: Vec<_> = rows.iter().collect();
    rows.sort_by_key(|(name, b, v)| {
        let bp = b.as_ref().is_some_and(Outcome::passed);
        let vp = v.as_ref().is_some_and(Outcome::passed);
        // Failed through the virtual nodes but passed the baseline first.
        (!bp || vp, bp || vp, name.clone())
    });
    let mut out = format!(
        "# Conformance: baseline (a lower cluster directly) and through the virtual nodes\n\n\
         selected {}, baseline passed {}, through the virtual nodes passed {}, \
         failed through the virtual nodes but passed the baseline {}\n\n\
         | test | baseline | through the virtual nodes |\n|---|---|---|\n",
        counts.selected,
        counts.baseline_passed,
        counts.virtual_passed,
        counts.virtual_failed_but_baseline_passed
    );
    for (name, b, v) in rows {
        out.push_str(&format!(
            "| {} | {} | {} |\n",
            name.replace('|', "\\|"),
            cell(b),
            cell(v)
        ));
    }
    out
}

/// Runs the suite's selection against `kubeconfig` with ginkgo, reports into `dir`.
async fn run_suite(
    args: &ConformanceArgs,
    side: &str,
    kubeconfig: &Path,
    dir: &Path,
) -> anyhow::Result<BTreeMap<String, Outcome>> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let bin = &args.k8s_bin;
    let log = std::fs::File::create(dir.join("e2e.log"))
        .with_context(|| format!("creating {}", dir.join("e2e.log").display()))?;
    let err = log.try_clone().context("the log file")?;
    let kubectl = bin.join("kubectl");
    let mut command = tokio::process::Command::new(bin.join("ginkgo"));
    command
        .arg(format!("--procs={}", args.parallel.max(1)))
        .arg(format!("--focus={}", args.focus))
        .arg(format!("--skip={}", args.skip))
        .arg(format!("--timeout={}", args.timeout))
        .arg("--no-color")
        .arg(format!("--output-dir={}", dir.display()))
        .arg("--json-report=report.json")
        .arg("--junit-report=junit.xml")
        .arg(bin.join("e2e.test"))
        .arg("--")
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .arg("--provider=skeleton")
        .arg(format!("--report-dir={}", dir.display()))
        .arg("--disable-log-dump")
        .arg("--dump-logs-on-failure=false")
        .stdin(std::process::Stdio::null())
        .stdout(log)
        .stderr(err);
    if kubectl.is_file() {
        command.arg(format!("--kubectl-path={}", kubectl.display()));
    }
    println!(
        "{side}: running e2e.test (log: {})",
        dir.join("e2e.log").display()
    );
    let started = Instant::now();
    let mut ginkgo = Interrupted(command.spawn().context("starting ginkgo")?);
    let status = ginkgo.0.wait().await.context("running ginkgo")?;
    println!(
        "{side}: ginkgo exited {status} after {:.0} s",
        started.elapsed().as_secs_f64()
    );
    read_report(dir).with_context(|| format!("{side}: see {}", dir.join("e2e.log").display()))
}

/// ginkgo, interrupted (SIGINT, as Ctrl-C would) when the benchmark stops before it ends.
/// Killed instead, it left its parallel e2e.test processes running against clusters already
/// gone, waiting for a ginkgo that would never answer; interrupted, it stops them and writes
/// the reports of what ran.
struct Interrupted(tokio::process::Child);

impl Drop for Interrupted {
    fn drop(&mut self) {
        if let (Ok(None), Some(pid)) = (self.0.try_wait(), self.0.id()) {
            // `kill` the program: the standard library sends only SIGKILL.
            let sent = std::process::Command::new("kill")
                .args(["-INT", &pid.to_string()])
                .status();
            if !sent.is_ok_and(|s| s.success()) {
                let _ = self.0.start_kill();
            }
        }
    }
}

/// A side's outcomes from the report a run left in `dir`.
fn read_report(dir: &Path) -> anyhow::Result<BTreeMap<String, Outcome>> {
    let report = dir.join("report.json");
    let bytes = std::fs::read(&report).with_context(|| format!("reading {}", report.display()))?;
    outcomes(&bytes).with_context(|| format!("reading {}", report.display()))
}

/// Writes `summary.md` into `out` and prints the JSON line.
fn report(
    out: &Path,
    baseline: &BTreeMap<String, Outcome>,
    virtual_side: &BTreeMap<String, Outcome>,
    duration: Option<u64>,
) -> anyhow::Result<()> {
    let (counts, rows) = compare(baseline, virtual_side);
    let summary = out.join("summary.md");
    std::fs::write(&summary, summary_markdown(&counts, &rows))
        .with_context(|| format!("writing {}", summary.display()))?;
    println!("summary: {}", summary.display());
    let mut line = serde_json::to_value(&counts).context("the summary line")?;
    line["duration_s"] = serde_json::json!(duration);
    println!("{line}");
    Ok(())
}

pub async fn run(
    args: ConformanceArgs,
    start_virtual_node: StartVirtualNode,
) -> anyhow::Result<()> {
    let started = Instant::now();
    if args.summarize {
        let baseline = read_report(&args.out.join("baseline"))?;
        let virtual_side = read_report(&args.out.join("virtual"))?;
        return report(&args.out, &baseline, &virtual_side, None);
    }
    for binary in ["e2e.test", "ginkgo", "kubelet", "kube-apiserver"] {
        if !args.k8s_bin.join(binary).is_file() {
            bail!(
                "{} has no {binary}: build it with `scripts/k8s-bin --conformance`",
                args.k8s_bin.display()
            );
        }
    }
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    // ginkgo runs e2e.test in a folder of its own: every path it is given is absolute.
    let mut args = args;
    args.out = std::fs::canonicalize(&args.out)
        .with_context(|| format!("resolving {}", args.out.display()))?;
    args.k8s_bin = std::fs::canonicalize(&args.k8s_bin)
        .with_context(|| format!("resolving {}", args.k8s_bin.display()))?;
    let spec = SandboxSpec {
        address: std::net::IpAddr::from([127, 0, 0, 1]),
        port: 0,
        lowers: (1..=2)
            .map(|i| {
                vec![tensile_simkubelet::SimNode::new(
                    format!("lower-{i}-node-1"),
                    "2",
                    "8Gi",
                )]
            })
            .collect(),
        webhook: true,
        descheduler: Some(Default::default()),
        extender: Some(ExtenderRun::InProcess(Default::default())),
        k8s_bin: Some(args.k8s_bin.clone()),
        virtual_nodes: VirtualNodeRun::InProcess(start_virtual_node),
        scheduler_qps: None,
        real_nodes: true,
    };
    let sandbox = Sandbox::start(spec, &|line| println!("  {line}")).await?;
    sandbox
        .wait_ready(std::time::Duration::from_secs(120))
        .await?;
    let write = |name: &str, text: String| -> anyhow::Result<PathBuf> {
        let path = args.out.join(name);
        tensile_testenv::secret_file::write_secret(&path, text)
            .with_context(|| format!("writing {}", path.display()))?;
        Ok(path)
    };
    let upper = write("upper.kubeconfig", sandbox.upper.kubeconfig("upper"))?;
    let lower = write(
        "lower-1.kubeconfig",
        sandbox.lowers[0].kubeconfig("lower-1"),
    )?;
    let empty = BTreeMap::new();
    let baseline = match args.only.as_deref() {
        Some("virtual") => empty.clone(),
        _ => run_suite(&args, "baseline", &lower, &args.out.join("baseline")).await?,
    };
    let virtual_side = match args.only.as_deref() {
        Some("baseline") => empty,
        _ => run_suite(&args, "virtual", &upper, &args.out.join("virtual")).await?,
    };
    sandbox.stop().await;
    report(
        &args.out,
        &baseline,
        &virtual_side,
        Some(started.elapsed().as_secs()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const REPORT: &str = r#"[{"SuitePath": "/e2e", "SpecReports": [
        {"ContainerHierarchyTexts": null, "LeafNodeType": "SynchronizedBeforeSuite", "State": "passed", "Failure": null},
        {"ContainerHierarchyTexts": ["[sig-node] Pods"], "LeafNodeText": "should be submitted and removed [NodeConformance] [Conformance]", "LeafNodeType": "It", "State": "passed"},
        {"ContainerHierarchyTexts": ["[sig-network] Services"], "LeafNodeText": "should serve a basic endpoint [Conformance]", "LeafNodeType": "It", "State": "failed", "Failure": {"Message": "timed out\nmore"}},
        {"ContainerHierarchyTexts": ["[sig-apps] Job"], "LeafNodeText": "should run [Serial]", "LeafNodeType": "It", "State": "skipped"}
    ]}]"#;

    #[test]
    fn a_ginkgo_report_gives_each_test_its_state_and_first_failure_line() {
        let o = outcomes(REPORT.as_bytes()).unwrap();
        assert_eq!(o.len(), 3, "the suite's set-up is no test");
        let failed = &o["[sig-network] Services should serve a basic endpoint [Conformance]"];
        assert_eq!(failed.state, "failed");
        assert_eq!(failed.message, "timed out");
        assert!(
            o["[sig-node] Pods should be submitted and removed [NodeConformance] [Conformance]"]
                .passed()
        );
    }

    #[test]
    fn the_comparison_counts_what_ran_on_either_side() {
        let baseline = outcomes(REPORT.as_bytes()).unwrap();
        let mut virtual_side = baseline.clone();
        virtual_side.insert(
            "[sig-node] Pods should be submitted and removed [NodeConformance] [Conformance]"
                .into(),
            Outcome {
                state: "failed".into(),
                message: "x".into(),
            },
        );
        let (counts, rows) = compare(&baseline, &virtual_side);
        assert_eq!(
            counts,
            Counts {
                selected: 2,
                baseline_passed: 1,
                virtual_passed: 0,
                virtual_failed_but_baseline_passed: 1,
            }
        );
        let mut not_reached = virtual_side.clone();
        not_reached.remove(
            "[sig-node] Pods should be submitted and removed [NodeConformance] [Conformance]",
        );
        let (c, _) = compare(&baseline, &not_reached);
        assert_eq!(
            c.virtual_failed_but_baseline_passed, 0,
            "not reached: no failure"
        );
        let md = summary_markdown(&counts, &rows);
        let first_row = md.lines().find(|l| l.starts_with("| [sig")).unwrap();
        assert!(first_row.contains("Pods should be submitted"), "{md}");
    }
}
