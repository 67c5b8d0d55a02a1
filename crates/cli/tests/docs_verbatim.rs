//! The README's tour and docs/sandbox.md's commands, run verbatim, in order, with `bash` and
//! the machine's `kubectl`, against `tensile up` started as the README starts it; each
//! command's output is checked. A command the docs gain or change without a check here fails
//! the test, so the docs cannot drift from what the sandbox does. The same commands then run
//! on the same clusters built from TestEnv and the `tensile virtual-node` binary (real control
//! planes in the `real` profile), and the two runs' outputs are compared by shape.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::Killed;

/// One command of the docs: its text (a heredoc included), and whether it ends in `&`.
#[derive(Debug, Clone)]
struct Step {
    text: String,
    background: bool,
}

impl Step {
    /// The command without its trailing comment, which is what the checks are keyed by.
    fn key(&self) -> String {
        let first = self.text.lines().next().unwrap_or_default();
        strip_comment(first).trim().to_owned()
    }
}

/// A line without its `# comment` (a `#` outside quotes, after a space).
fn strip_comment(line: &str) -> &str {
    let (mut single, mut double) = (false, false);
    let bytes = line.as_bytes();
    for (i, c) in line.char_indices() {
        match c {
            '\'' if !double => single = !single,
            '"' if !single => double = !double,
            '#' if !single && !double && (i == 0 || bytes[i - 1] == b' ') => return &line[..i],
            _ => {}
        }
    }
    line
}

/// The commands of the ```sh blocks of `markdown` that `pick` selects, in order.
fn steps(markdown: &str, pick: impl Fn(&str) -> bool) -> Vec<Step> {
    let mut blocks = Vec::new();
    let mut current: Option<Vec<&str>> = None;
    for line in markdown.lines() {
        match (&mut current, line.trim_start()) {
            (None, "```sh") => current = Some(Vec::new()),
            (Some(_), "```") => blocks.push(current.take().unwrap_or_default()),
            (Some(lines), _) => lines.push(line),
            (None, _) => {}
        }
    }
    let mut out = Vec::new();
    for block in blocks.iter().filter(|b| pick(&b.join("\n"))) {
        let mut lines = block.iter();
        while let Some(line) = lines.next() {
            if line.trim().is_empty() {
                continue;
            }
            let mut text = (*line).to_owned();
            // A heredoc: the lines up to its terminator belong to the command.
            if let Some(tag) = line
                .split("<<'")
                .nth(1)
                .and_then(|rest| rest.split('\'').next())
            {
                for body in lines.by_ref() {
                    text.push('\n');
                    text.push_str(body);
                    if body.trim() == tag {
                        break;
                    }
                }
            }
            let background = strip_comment(line).trim_end().ends_with('&');
            out.push(Step { text, background });
        }
    }
    out
}

fn repo_file(path: &str) -> String {
    std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../..")
            .join(path),
    )
    .unwrap()
}

/// The tour (the README block after its heading) and every sandbox.md block that uses `$K`.
fn documented() -> Vec<Step> {
    let readme = repo_file("README.md");
    let tour = readme
        .split("## A five-minute tour of the sandbox")
        .nth(1)
        .unwrap();
    let mut all = steps(tour, |b| b.contains("kubectl get nodes"));
    all.extend(steps(&repo_file("docs/sandbox.md"), |b| b.contains("$K")));
    all
}

/// What a command's output must show.
#[derive(Clone, Copy)]
enum Expect {
    /// It sets a variable for the commands after it.
    Sets,
    /// It exits 0.
    Succeeds,
    /// It exits 0 and its output holds each of these; it is run again until it does (a user
    /// re-running `get` until things settle), within the deadline.
    Shows(&'static [&'static str]),
    /// It exits 0 and its output has this many lines holding the text (run again until so).
    Lines(&'static str, usize),
}

/// The check of each documented command, by its text without comment.
fn checks() -> Vec<(&'static str, Expect)> {
    use Expect::{Lines, Sets, Shows, Succeeds};
    vec![
        // README tour.
        ("export KUBECONFIG=$PWD/tensile-up.kubeconfig", Sets),
        (
            "kubectl get nodes",
            Shows(&["vk-lower-1   Ready", "vk-lower-2   Ready"]),
        ),
        (
            "kubectl create deployment web --image=nginx --replicas=4 --port=80",
            Succeeds,
        ),
        ("kubectl get pods -o wide", Lines(" Running ", 4)),
        (
            // In lower-1 or lower-2 (or both), as the scheduler placed them.
            "kubectl --context lower-1 get pods -A -o wide",
            Succeeds,
        ),
        ("kubectl logs deploy/web", Shows(&["started (image nginx)"])),
        ("kubectl exec deploy/web -- hostname", Shows(&["web-"])),
        (
            "kubectl port-forward deploy/web 8080:80 &",
            Shows(&["Forwarding from"]),
        ),
        ("echo hello | nc -q1 localhost 8080", Shows(&["hello"])),
        ("kubectl top pods", Lines("web-", 4)),
        (
            "kubectl scale deployment web --replicas=0",
            Shows(&["deployment.apps/web scaled"]),
        ),
        // docs/sandbox.md.
        ("K=\"kubectl --kubeconfig tensile-up.kubeconfig\"", Sets),
        ("$K scale deployment web --replicas=2", Shows(&["scaled"])),
        (
            "$K expose deployment web --port 80 --target-port 8080",
            Shows(&["service/web exposed"]),
        ),
        ("$K --context lower-1 get endpointslices", Shows(&["web-"])),
        (
            "$K describe pod -l app=web",
            Shows(&["lower-", "Scheduled"]),
        ),
        ("$K apply -f - <<'YAML'", Succeeds),
        ("$K get pvc data", Shows(&["Bound"])),
        ("$K describe pv", Shows(&["Node Affinity", "vk-lower-"])),
        ("$K --context lower-1 get pv", Succeeds),
        (
            "$K rollout status statefulset/pg --timeout=2m",
            Shows(&["complete"]),
        ),
        ("$K get pvc data-pg-0 data-pg-1", Lines(" Bound ", 2)),
        ("$K --context lower-1 apply -f - <<'YAML'", Succeeds),
        (
            "$K --context lower-1 rollout status daemonset/agent --timeout=2m",
            Shows(&["successfully rolled out"]),
        ),
        (
            "$K create deployment api --image=nginx --replicas=2",
            Succeeds,
        ),
        (
            "$K create poddisruptionbudget api --selector=app=api --min-available=1",
            Succeeds,
        ),
        (
            "$K rollout status deployment/api --timeout=2m",
            Shows(&["successfully rolled out"]),
        ),
        (DRAIN, Shows(&["drained", "uncordoned"])),
        (
            "$K create job hello --image=busybox -- sh -c 'echo hello from a job'",
            Succeeds,
        ),
        (
            "$K wait --for=condition=Complete job/hello --timeout=2m",
            Shows(&["condition met"]),
        ),
        ("$K logs job/hello", Shows(&["hello from a job"])),
        (
            "$K create cronjob tick --image=busybox --schedule='*/5 * * * *' -- date",
            Succeeds,
        ),
        ("$K get cronjob tick", Shows(&["*/5 * * * *"])),
        (
            "$K run crash --image=busybox -- sh -c 'echo boom; exit 1'",
            Succeeds,
        ),
        ("$K get pod crash", Shows(&["CrashLoopBackOff"])),
        ("$K logs crash --previous", Shows(&["restart 1)", "boom"])),
        ("$K describe pod crash", Shows(&["BackOff", "lower-"])),
        ("$K run app --image=busybox -- sleep 100000", Succeeds),
        ("$K exec -it app -- sh", Succeeds),
        (
            "echo hi > f.txt; $K cp f.txt app:/tmp/f.txt; $K exec app -- cat /tmp/f.txt",
            Shows(&["hi"]),
        ),
        (
            "$K debug app --image=busybox -c dbg -- sh -c 'echo hi from debug'",
            Succeeds,
        ),
        ("$K logs app -c dbg", Shows(&["hi from debug"])),
        ("$K debug -it app --image=busybox -- sh", Succeeds),
        (
            "TOKEN=$($K exec app -- cat /var/run/secrets/kubernetes.io/serviceaccount/token)",
            Sets,
        ),
        (
            r#"echo "{\"apiVersion\":\"authentication.k8s.io/v1\",\"kind\":\"TokenReview\",\"spec\":{\"token\":\"$TOKEN\"}}" | $K create --raw /apis/authentication.k8s.io/v1/tokenreviews -f -"#,
            Shows(&[
                r#""authenticated":true"#,
                "system:serviceaccount:default:default",
            ]),
        ),
        (
            "$K exec app -- env | grep KUBERNETES_SERVICE",
            Shows(&["KUBERNETES_SERVICE_HOST=", "KUBERNETES_SERVICE_PORT="]),
        ),
    ]
}

/// A shell session in `dir`: variables set by earlier commands, processes left running.
struct Session {
    dir: PathBuf,
    prelude: String,
    background: Vec<(Killed, PathBuf)>,
}

impl Session {
    fn bash(&self, text: &str) -> (bool, String) {
        let out = Command::new("bash")
            .arg("-c")
            .arg(format!("set -o pipefail\n{}{text}", self.prelude))
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.push_str(&String::from_utf8_lossy(&out.stderr));
        (out.status.success(), text)
    }

    /// Runs a documented command and checks it; its final output.
    fn step(&mut self, step: &Step, expect: Expect) -> String {
        let key = step.key();
        if step.background {
            let log = self
                .dir
                .join(format!("background-{}.log", self.background.len()));
            let command = key.trim_end_matches('&').trim();
            let child = Command::new("bash")
                .arg("-c")
                .arg(format!("{}exec {command}", self.prelude))
                .current_dir(&self.dir)
                .stdin(Stdio::null())
                .stdout(std::fs::File::create(&log).unwrap())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            self.background.push((Killed(child), log.clone()));
            return self.wait(&key, expect, || {
                (true, std::fs::read_to_string(&log).unwrap_or_default())
            });
        }
        if matches!(expect, Expect::Sets) {
            let (ok, out) = self.bash(&step.text);
            assert!(ok, "`{key}`: {out}");
            self.prelude.push_str(&step.text);
            self.prelude.push('\n');
            return out;
        }
        let text = step.text.clone();
        self.wait(&key, expect, || self.bash(&text))
    }

    fn wait(&self, key: &str, expect: Expect, mut run: impl FnMut() -> (bool, String)) -> String {
        let deadline = Instant::now() + Duration::from_secs(150);
        loop {
            let (ok, out) = run();
            let good = ok
                && match expect {
                    Expect::Sets | Expect::Succeeds => true,
                    Expect::Shows(all) => all.iter().all(|s| out.contains(s)),
                    Expect::Lines(text, n) => out.lines().filter(|l| l.contains(text)).count() == n,
                };
            if good {
                return out;
            }
            assert!(
                Instant::now() < deadline,
                "`{key}` did not show what the docs say in time; last output:\n{out}\n{}",
                self.bash(
                    "kubectl --kubeconfig tensile-up.kubeconfig get all,pvc,pdb,events -o wide"
                )
                .1
            );
            std::thread::park_timeout(Duration::from_millis(500));
        }
    }
}

/// The docs' commands, each with its check, in order; a documented command without a check,
/// or a check whose command the docs lost, is an error.
fn plan() -> Vec<(Step, Expect)> {
    let checks = checks();
    let docs = documented();
    let mut plan = Vec::new();
    for step in &docs {
        let key = step.key();
        let Some((_, expect)) = checks.iter().find(|(k, _)| *k == key) else {
            panic!("a documented command has no check in docs_verbatim.rs: `{key}`");
        };
        plan.push((step.clone(), *expect));
    }
    for (k, _) in &checks {
        assert!(
            docs.iter().any(|s| s.key() == *k),
            "a check of docs_verbatim.rs names a command the docs no longer have: `{k}`"
        );
    }
    plan
}

#[test]
fn kubectls_stream_race_line_is_not_part_of_a_shape_but_lost_output_is() {
    let race =
        "E1126 06:46:39.979305   24761 websocket.go:297] Unknown stream id 0, discarding message";
    assert_eq!(shape(&format!("hi\n{race}\n")), shape("hi\n"));
    assert_ne!(shape(&format!("{race}\n")), shape("hi\n"));
}

#[test]
fn the_docs_commands_are_parsed_with_their_heredocs_and_background_jobs() {
    let parsed = steps(
        "text\n```sh\nK=\"x\"   # set\n$K apply -f - <<'YAML'\na: 1\nYAML\nkubectl port-forward p 1:2 &   # bg\n```\n```sh\nnot picked\n```\n",
        |b| b.contains("$K"),
    );
    let keys: Vec<String> = parsed.iter().map(Step::key).collect();
    assert_eq!(
        keys,
        [
            "K=\"x\"",
            "$K apply -f - <<'YAML'",
            "kubectl port-forward p 1:2 &"
        ]
    );
    assert_eq!(parsed[1].text, "$K apply -f - <<'YAML'\na: 1\nYAML");
    assert!(parsed[2].background && !parsed[1].background);
    assert_eq!(
        strip_comment("echo '# not a comment' # one"),
        "echo '# not a comment' "
    );
    // Every documented command has its check (this holds without starting anything).
    assert!(plan().len() > 30);
}

/// `tensile up` as the README starts it (`cargo run -p tensile-cli -- up`, with the binary
/// cargo built for the test), in `dir`, where the commands then run (so
/// `./tensile-up.kubeconfig` is where they look); ready when it says so. With `k8s_bin`, as
/// docs/sandbox.md starts it on real control planes (`--k8s-bin`); without, simulated whatever
/// the environment says.
fn tensile_up(dir: &Path, k8s_bin: Option<&Path>) -> Killed {
    let readme = repo_file("README.md");
    assert!(readme.contains("cargo run -p tensile-cli -- up\n"));
    let mut command = Command::new(env!("CARGO_BIN_EXE_tensile"));
    command
        .arg("up")
        .current_dir(dir)
        .env("RUST_LOG", "warn")
        .env_remove(tensile_testenv::real::BIN_ENV);
    if let Some(bin) = k8s_bin {
        assert!(repo_file("docs/sandbox.md").contains("tensile-cli -- up --k8s-bin"));
        command.arg("--k8s-bin").arg(bin);
    }
    let (up, out) = common::spawn_collecting(&mut command);
    // Real control planes take longer to start beside other tests.
    common::until_within(Duration::from_secs(240), "tensile up to be ready", || {
        out.lock().unwrap().contains("ready in")
    });
    up
}

fn fresh_dir(what: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tensile-docs-{what}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs every documented command in `dir`, checked; their outputs.
fn run_docs(dir: &Path) -> Vec<(String, String)> {
    let mut session = Session {
        dir: dir.to_owned(),
        prelude: String::new(),
        background: Vec::new(),
    };
    plan()
        .iter()
        .map(|(step, expect)| (step.key(), session.step(step, *expect)))
        .collect()
}

/// What is compared of an output: a table's header and row count, a `describe`'s top-level
/// fields, or else the text with numbers and generated name suffixes blanked.
fn shape(out: &str) -> String {
    let first = out.lines().next().unwrap_or_default();
    let is_header = first
        .split_whitespace()
        .next()
        .is_some_and(|w| w.len() > 1 && w.chars().all(|c| c.is_ascii_uppercase() || c == '-'));
    if is_header {
        // Column widths follow the longest name, which differs.
        let header = first.split("  ").filter(|c| !c.trim().is_empty());
        let header: Vec<&str> = header.map(str::trim).collect();
        let rows = out.lines().skip(1).filter(|l| !l.trim().is_empty()).count();
        return format!("{} ({rows} rows)", header.join(" | "));
    }
    let keys: Vec<&str> = out
        .lines()
        .filter(|l| !l.starts_with(' '))
        .filter_map(|l| l.split_once(':').map(|(k, _)| k))
        .filter(|k| !k.is_empty() && k.chars().all(|c| c.is_ascii_alphabetic() || c == ' '))
        .collect();
    if keys.len() >= 5 {
        let mut keys = keys;
        keys.sort_unstable();
        keys.dedup();
        return keys.join(", ");
    }
    // Progress lines (`Waiting for 1 pods to be ready...`) come as often as the wait took;
    // they are left out. So is kubectl 1.32's `Unknown stream id N, discarding message`: its
    // WebSocket client reads before it has made its streams and drops the API server's first
    // (empty) message when it loses that race, on real clusters too (client-go 1.33 waits).
    let mut lines: Vec<String> = Vec::new();
    let noise = |l: &str| {
        l.starts_with("Waiting for ")
            || (l.contains("websocket.go:") && l.contains("] Unknown stream id "))
    };
    for line in out.lines().filter(|l| !noise(l)) {
        let line = line.replace(|c: char| c.is_ascii_digit(), "0");
        if lines.last() != Some(&line) {
            lines.push(line);
        }
    }
    lines
        .join("\n")
        .split_whitespace()
        .map(|w| {
            let mut w: String = w
                .chars()
                .map(|c| if c.is_ascii_digit() { '0' } else { c })
                .collect();
            // `web-7d4b9c5f8d-x2x9z` and the like: the generated parts go (a sentence's
            // punctuation kept).
            let punctuation = w.len() - w.trim_end_matches(['.', ',', ':', ';']).len();
            let end = w.split_off(w.len() - punctuation);
            while let Some((head, tail)) = w.rsplit_once('-') {
                let generated = matches!(tail.len(), 5 | 9 | 10)
                    && tail.chars().all(|c| c.is_ascii_alphanumeric());
                if !generated {
                    break;
                }
                w = head.to_owned();
            }
            w + &end
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The same clusters as `tensile up` (an upper cluster, `lower-1` and `lower-2` with two nodes
/// each, the default StorageClass `standard` everywhere, a virtual node per lower cluster with
/// the sandbox's flags), built from TestEnv and the `tensile virtual-node` binary: simulated,
/// or real control planes in the `real` profile; its kubeconfig `dir/tensile-up.kubeconfig`.
fn stack(
    dir: &Path,
) -> (
    tokio::runtime::Runtime,
    tensile_testenv::TestEnv,
    Vec<Killed>,
) {
    use tensile_testenv::{ClusterSpec, TestEnv};
    let runtime = tokio::runtime::Runtime::new().unwrap();
    // The upper scheduler leaves claims to the lower clusters (docs/virtual-node.md: its
    // VolumeBinding plugin off), as the sandbox's does.
    let mut upper_spec = ClusterSpec::new("upper", 0);
    upper_spec.apiserver.controllers.volume_binding = false;
    let env = runtime
        .block_on(TestEnv::start_with(vec![
            upper_spec,
            ClusterSpec::new("lower-1", 2),
            ClusterSpec::new("lower-2", 2),
        ]))
        .unwrap();
    runtime
        .block_on(env.clusters[0].set_scheduler_config(&serde_json::json!({
            "apiVersion": "kubescheduler.config.k8s.io/v1",
            "kind": "KubeSchedulerConfiguration",
            "profiles": [{"schedulerName": "default-scheduler",
                "plugins": {"multiPoint": {"disabled": [{"name": "VolumeBinding"}]}}}],
        })))
        .unwrap();
    let class = dir.join("standard.yaml");
    std::fs::write(
        &class,
        "apiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata:\n  name: standard\n  \
         annotations: {storageclass.kubernetes.io/is-default-class: 'true'}\n\
         provisioner: tensile.io/local-path\nvolumeBindingMode: WaitForFirstConsumer\n\
         reclaimPolicy: Delete\n",
    )
    .unwrap();
    for c in &env.clusters {
        let (ok, _, err) =
            common::kubectl(&c.kubeconfig, &["apply", "-f", class.to_str().unwrap()]);
        assert!(ok, "{err}");
    }
    let upper = env.clusters[0].kubeconfig.clone();
    let mut virtual_nodes = Vec::new();
    for lower in &env.clusters[1..] {
        let name = lower
            .kubeconfig
            .file_stem()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new(env!("CARGO_BIN_EXE_tensile"))
            .args([
                "virtual-node",
                &format!("--nodename=vk-{name}"),
                "--disable-taint=true",
            ])
            .arg(format!("--kubeconfig={}", upper.display()))
            .arg(format!(
                "--client-kubeconfig={}",
                lower.kubeconfig.display()
            ))
            .arg("--kubelet-address=127.0.0.1")
            .env("KUBELET_PORT", port.to_string())
            .env("VKUBELET_POD_IP", "127.0.0.1")
            .env("VKUBELET_NODE_LABEL", format!("clusterID:{name}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join(format!("vk-{name}.log"))).unwrap())
            .spawn()
            .unwrap();
        virtual_nodes.push(Killed(child));
    }
    let files: Vec<String> = env
        .clusters
        .iter()
        .map(|c| c.kubeconfig.display().to_string())
        .collect();
    let merged = Command::new("kubectl")
        .args(["config", "view", "--flatten"])
        .env("KUBECONFIG", files.join(":"))
        .output()
        .unwrap();
    assert!(merged.status.success());
    let kubeconfig = dir.join("tensile-up.kubeconfig");
    std::fs::write(&kubeconfig, &merged.stdout).unwrap();
    let (ok, _, err) = common::kubectl(&kubeconfig, &["config", "use-context", "upper"]);
    assert!(ok, "{err}");
    common::until("the virtual nodes Ready", || {
        let (_, out, _) = common::kubectl(&kubeconfig, &["get", "nodes", "--no-headers"]);
        out.lines().filter(|l| l.contains(" Ready ")).count() == 2
    });
    (runtime, env, virtual_nodes)
}

/// Outputs that depend on which lower cluster the upper scheduler chose, which differs
/// between the runs: the sandbox's scheduler asks the scheduler extender (spreading by the
/// lower clusters' free room), the built clusters' does not.
const PLACEMENT_DEPENDENT: &[&str] = &[
    "kubectl --context lower-1 get pods -A -o wide",
    "$K --context lower-1 get pv",
    // One or two api pods on the drained node.
    DRAIN,
];

/// Outputs that hold values each run makes anew, beyond digits: a token, the upper API
/// server's port (7443 for `tensile up`, a free one for the built clusters). Each is checked
/// in both runs by its `Expect`.
const RUN_SPECIFIC: &[&str] = &[
    r#"echo "{\"apiVersion\":\"authentication.k8s.io/v1\",\"kind\":\"TokenReview\",\"spec\":{\"token\":\"$TOKEN\"}}" | $K create --raw /apis/authentication.k8s.io/v1/tokenreviews -f -"#,
    "$K exec app -- env | grep KUBERNETES_SERVICE",
];

/// The drain line of docs/sandbox.md.
const DRAIN: &str = "N=$($K get pod -l app=api -o jsonpath='{.items[0].spec.nodeName}'); \
    $K drain $N --pod-selector=app=api --timeout=2m && $K uncordon $N";

/// The shapes in which two runs of the docs differ, but for the outputs that differ by
/// design.
fn differences(a_name: &str, a: &[(String, String)], b: &[(String, String)]) -> String {
    let mut report = String::new();
    for ((command, a), (_, b)) in a.iter().zip(b) {
        if PLACEMENT_DEPENDENT.contains(&command.as_str())
            || RUN_SPECIFIC.contains(&command.as_str())
        {
            continue;
        }
        let (a, b) = (shape(a), shape(b));
        if a != b {
            report.push_str(&format!(
                "`{command}`:\n  {a_name}: {a}\n  binaries:   {b}\n"
            ));
        }
    }
    report
}

/// One test, as every run uses the README's fixed ports (7443.., 8080). In the `real` profile
/// the docs also run on `tensile up --k8s-bin` (real control planes, simulated nodes), and
/// both sandboxes are compared with the clusters of the binaries.
#[test]
fn the_docs_run_verbatim_on_tensile_up_and_give_the_same_shapes_on_clusters_of_the_binaries() {
    let up_dir = fresh_dir("shape-up");
    let up = tensile_up(&up_dir, None);
    let sandbox = run_docs(&up_dir);
    drop(up);
    let real_up = tensile_testenv::real::bin_dir().map(|bin| {
        let dir = fresh_dir("shape-up-real");
        let up = tensile_up(&dir, Some(&bin));
        let outputs = run_docs(&dir);
        // Killed, it would leave its control planes running on the fixed ports.
        up.interrupt(Duration::from_secs(60));
        let _ = std::fs::remove_dir_all(&dir);
        outputs
    });
    let dir = fresh_dir("shape-stack");
    let (runtime, env, virtual_nodes) = stack(&dir);
    let built = run_docs(&dir);
    let mut report = differences("tensile up", &sandbox, &built);
    if let Some(real_up) = &real_up {
        report += &differences("tensile up --k8s-bin", real_up, &built);
    }
    drop(virtual_nodes);
    drop(env);
    drop(runtime);
    let _ = std::fs::remove_dir_all(&up_dir);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(report.is_empty(), "the runs differ in shape:\n{report}");
}
