//! The README's tour and docs/sandbox.md's commands, run verbatim, in order, with `bash` and
//! the machine's `kubectl`, against `tensile up` started as the README starts it; each
//! command's output is checked. A command the docs gain or change without a check here fails
//! the test, so the docs cannot drift from what the sandbox does.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

mod common;

use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
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
            "kubectl --context lower-1 get pods -A -o wide",
            Shows(&["NAMESPACE"]),
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
        (
            "$K drain vk-lower-1 --pod-selector=app=api --timeout=2m",
            Shows(&["node/vk-lower-1 drained"]),
        ),
        (
            "$K uncordon vk-lower-1",
            Shows(&["node/vk-lower-1 uncordoned"]),
        ),
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

#[test]
fn the_readme_tour_and_the_sandbox_docs_run_verbatim_against_tensile_up() {
    let plan = plan();
    let dir = std::env::temp_dir().join(format!("tensile-docs-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    // The README's `cargo run -p tensile-cli -- up`, with the binary cargo built for the test,
    // in the folder the commands run in (so `./tensile-up.kubeconfig` is where they look).
    let readme = repo_file("README.md");
    assert!(readme.contains("cargo run -p tensile-cli -- up\n"));
    let mut child = Command::new(env!("CARGO_BIN_EXE_tensile"))
        .arg("up")
        .current_dir(&dir)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = Arc::new(Mutex::new(String::new()));
    for stream in [
        Box::new(child.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>,
        Box::new(child.stderr.take().unwrap()),
    ] {
        let out = out.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stream).lines().map_while(Result::ok) {
                let mut o = out.lock().unwrap();
                o.push_str(&line);
                o.push('\n');
            }
        });
    }
    let _up = Killed(child);
    common::until("tensile up to be ready", || {
        out.lock().unwrap().contains("ready in")
    });
    let mut session = Session {
        dir: dir.clone(),
        prelude: String::new(),
        background: Vec::new(),
    };
    for (step, expect) in &plan {
        session.step(step, *expect);
    }
    drop(session);
    let _ = std::fs::remove_dir_all(&dir);
}
