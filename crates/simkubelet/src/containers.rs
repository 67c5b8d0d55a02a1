//! The life of a simulated pod's containers, as values: each runs its program, ends, and is
//! restarted (or not) by the pod's restart policy with the kubelet's back-off: the first
//! restart at once, then after 10 s, doubling to 5 minutes, reset after 10 minutes of running
//! (`kuberuntime_manager.go`, `doBackOff`). Waiting out a back-off is `CrashLoopBackOff` with
//! the last run in `lastState`, as `kubectl get pods` and `describe` show it.

use std::time::Duration;

use k8s_openapi::api::core::v1::Container;
use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};

use crate::time_string;

/// What a container's process does.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Program {
    /// Runs until the pod is deleted.
    Forever,
    /// Ends with code 0 after this many seconds.
    Sleep(u64),
    /// Ends at once with this code.
    Exit(i32),
}

/// A container's command line: its command, then its args.
pub(super) fn argv(container: &Container) -> Vec<&str> {
    container
        .command
        .iter()
        .flatten()
        .chain(container.args.iter().flatten())
        .map(String::as_str)
        .collect()
}

/// Commands that end by themselves (each statement of a script must be one for the script to
/// end): shell built-ins, the usual file and text tools, and one-shot interpreters.
const FINITE: &[&str] = &[
    "echo", "printf", "true", "false", ":", "date", "env", "printenv", "cat", "ls", "hostname",
    "pwd", "id", "whoami", "uname", "test", "[", "mkdir", "touch", "rm", "cp", "mv", "ln", "wc",
    "head", "grep", "sed", "awk", "sort", "uniq", "cut", "tr", "basename", "dirname", "expr",
    "export", "cd", "set", "nslookup", "wget", "curl", "perl",
];

/// The program of `container`, read from its command and args: `sleep N` and `exit N`
/// (e.g. in `sh -c "echo hi; exit 1"`); a command, or a `sh -c` script, made only of commands
/// that end by themselves ([`FINITE`], no loop) ends at once with the status of its last
/// statement (`false` is 1); anything else (an image's own entrypoint, a server, a loop) runs
/// for ever.
pub(super) fn program(container: &Container) -> Program {
    let words: Vec<&str> = argv(container)
        .into_iter()
        .flat_map(|s| s.split(|c: char| c.is_whitespace() || c == ';'))
        .filter(|w| !w.is_empty())
        .collect();
    for w in words.windows(2) {
        match (w[0], w[1].parse::<u64>()) {
            ("sleep", Ok(n)) => return Program::Sleep(n),
            ("exit", Ok(n)) => return Program::Exit(i32::try_from(n).unwrap_or(255)),
            _ => {}
        }
    }
    finite(container).map_or(Program::Forever, Program::Exit)
}

/// The exit status of a command that ends by itself, `None` for one that may not.
fn finite(container: &Container) -> Option<i32> {
    let argv = argv(container);
    let base = |w: &str| w.rsplit('/').next().unwrap_or(w).to_owned();
    let first = base(argv.first()?);
    let statements: Vec<String> =
        if matches!(first.as_str(), "sh" | "bash" | "ash" | "dash") && argv.get(1) == Some(&"-c") {
            argv.get(2)?
                .split([';', '\n', '&', '|'])
                .map(|s| s.trim().to_owned())
                .filter(|s| !s.is_empty())
                .collect()
        } else {
            vec![argv.join(" ")]
        };
    let mut status = 0;
    for statement in &statements {
        let name = base(statement.split_whitespace().next()?);
        if !FINITE.contains(&name.as_str()) || statement.contains(" -f") && name == "tail" {
            return None;
        }
        status = i32::from(name == "false");
    }
    Some(status)
}

const FIRST_BACK_OFF: Duration = Duration::from_secs(10);
const MAX_BACK_OFF: Duration = Duration::from_secs(300);
/// A container that ran this long starts over with no back-off.
const BACK_OFF_RESET: Duration = Duration::from_secs(600);

/// One finished run of a container.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Ended {
    pub(super) exit_code: i32,
    pub(super) started: Timestamp,
    pub(super) finished: Timestamp,
    pub(super) attempt: i32,
}

#[derive(Clone, Debug, PartialEq)]
pub(super) enum State {
    /// Cannot start: the kubelet's `CreateContainerConfigError` (a missing ConfigMap, ...).
    ConfigError(String),
    Running(Timestamp),
    /// Waiting out the back-off until the given time.
    BackOff(Timestamp, Duration),
    /// Ended for good (the restart policy says so).
    Ended(Ended),
}

/// One container of the pod.
#[derive(Clone, Debug)]
pub(super) struct Run {
    pub(super) name: String,
    pub(super) image: String,
    program: Program,
    /// The attempt of the latest instance, which is the status' `restartCount`.
    pub(super) attempt: i32,
    pub(super) state: State,
    pub(super) last: Option<Ended>,
    back_off: Duration,
    /// Whether it ever started (a pod none of whose containers started is Pending).
    started_once: bool,
}

impl Run {
    /// A container starting at `now`, or held by its configuration `error`.
    fn new(container: &Container, error: Option<String>, now: Timestamp) -> Self {
        Self {
            name: container.name.clone(),
            image: container.image.clone().unwrap_or_default(),
            program: program(container),
            attempt: 0,
            started_once: error.is_none(),
            state: match error {
                Some(e) => State::ConfigError(e),
                None => State::Running(now),
            },
            last: None,
            back_off: Duration::ZERO,
        }
    }
}

/// Something a kubelet records an event for.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Happening {
    /// `BackOff`: the container waits before its next restart.
    BackOff { container: String },
}

/// The containers of one pod.
#[derive(Clone, Debug)]
pub(super) struct Lifecycle {
    policy: String,
    pub(super) runs: Vec<Run>,
}

impl Lifecycle {
    /// The containers, at `now`: each running, or held by its configuration error.
    pub(super) fn start(
        containers: &[Container],
        restart_policy: Option<&str>,
        config_errors: &[Option<String>],
        now: Timestamp,
    ) -> Self {
        let runs = containers
            .iter()
            .enumerate()
            .map(|(i, c)| Run::new(c, config_errors.get(i).cloned().flatten(), now))
            .collect();
        Self {
            policy: restart_policy.unwrap_or("Always").to_owned(),
            runs,
        }
    }

    /// Starts one more container at `now` (an ephemeral container added to a running pod),
    /// held by `error` when its configuration has one.
    pub(super) fn add(&mut self, container: &Container, error: Option<String>, now: Timestamp) {
        self.runs.push(Run::new(container, error, now));
    }

    /// Whether a container of this name runs here.
    pub(super) fn has(&self, name: &str) -> bool {
        self.runs.iter().any(|r| r.name == name)
    }

    /// The indexes of the containers held by a configuration error.
    pub(super) fn blocked(&self) -> Vec<usize> {
        (0..self.runs.len())
            .filter(|&i| matches!(self.runs[i].state, State::ConfigError(_)))
            .collect()
    }

    /// Container `i`'s configuration error is gone (`None`) or is now `error`.
    pub(super) fn set_config_error(&mut self, i: usize, error: Option<String>, now: Timestamp) {
        let Some(run) = self.runs.get_mut(i) else {
            return;
        };
        if !matches!(run.state, State::ConfigError(_)) {
            return;
        }
        match error {
            Some(e) => run.state = State::ConfigError(e),
            None => {
                run.state = State::Running(now);
                run.started_once = true;
            }
        }
    }

    /// When something next happens by itself (a program ends, a back-off is over).
    pub(super) fn next_wake(&self) -> Option<Timestamp> {
        self.runs
            .iter()
            .filter_map(|r| match r.state {
                State::Running(since) => match r.program {
                    Program::Forever => None,
                    Program::Sleep(s) => Some(since + Duration::from_secs(s)),
                    Program::Exit(_) => Some(since),
                },
                State::BackOff(until, _) => Some(until),
                State::ConfigError(_) | State::Ended(_) => None,
            })
            .min()
    }

    /// Everything due by `now`: programs that end, back-offs that are over.
    pub(super) fn advance(&mut self, now: Timestamp) -> Vec<Happening> {
        let mut happened = Vec::new();
        // Each pass either ends a run or leaves it waiting out a non-zero back-off, so this
        // stops; the bound only guards against a mistake here.
        for _ in 0..(4 * self.runs.len() + 4) {
            let Some(i) = (0..self.runs.len()).find(|&i| self.due(i, now)) else {
                break;
            };
            let policy = self.policy.clone();
            let run = &mut self.runs[i];
            match run.state.clone() {
                State::BackOff(_, waited) => {
                    run.attempt += 1;
                    run.back_off = (waited * 2).min(MAX_BACK_OFF);
                    run.state = State::Running(now);
                }
                State::Running(since) => {
                    let code = match run.program {
                        Program::Exit(code) => code,
                        _ => 0,
                    };
                    let finished = match run.program {
                        Program::Sleep(s) => since + Duration::from_secs(s),
                        _ => since,
                    }
                    .min(now);
                    let ended = Ended {
                        exit_code: code,
                        started: since,
                        finished,
                        attempt: run.attempt,
                    };
                    let restart = match policy.as_str() {
                        "Always" => true,
                        "OnFailure" => code != 0,
                        _ => false,
                    };
                    if !restart {
                        run.state = State::Ended(ended);
                        continue;
                    }
                    let ran = finished.duration_since(since).as_secs();
                    if u64::try_from(ran).is_ok_and(|r| r >= BACK_OFF_RESET.as_secs()) {
                        run.back_off = Duration::ZERO;
                    }
                    run.last = Some(ended);
                    if run.back_off.is_zero() {
                        run.attempt += 1;
                        run.back_off = FIRST_BACK_OFF;
                        run.state = State::Running(now);
                    } else {
                        run.state = State::BackOff(now + run.back_off, run.back_off);
                        happened.push(Happening::BackOff {
                            container: run.name.clone(),
                        });
                    }
                }
                State::ConfigError(_) | State::Ended(_) => {}
            }
        }
        happened
    }

    fn due(&self, i: usize, now: Timestamp) -> bool {
        let run = &self.runs[i];
        match run.state {
            State::Running(since) => match run.program {
                Program::Forever => false,
                Program::Sleep(s) => since + Duration::from_secs(s) <= now,
                Program::Exit(_) => true,
            },
            State::BackOff(until, _) => until <= now,
            State::ConfigError(_) | State::Ended(_) => false,
        }
    }

    /// The pod's phase: Pending until a container started, Succeeded or Failed once all ended
    /// for good, Running in between.
    pub(super) fn phase(&self) -> &'static str {
        if self.runs.iter().all(|r| !r.started_once) {
            return "Pending";
        }
        let ended: Vec<i32> = self
            .runs
            .iter()
            .filter_map(|r| match &r.state {
                State::Ended(e) => Some(e.exit_code),
                _ => None,
            })
            .collect();
        if ended.len() < self.runs.len() {
            "Running"
        } else if ended.iter().all(|c| *c == 0) {
            "Succeeded"
        } else {
            "Failed"
        }
    }

    /// The containers that are not running (`containers with unready status: [...]`).
    pub(super) fn unready(&self) -> Vec<&str> {
        self.runs
            .iter()
            .filter(|r| !matches!(r.state, State::Running(_)))
            .map(|r| r.name.as_str())
            .collect()
    }

    /// `status.containerStatuses`, for the pod with `pod_uid`, `pod` (name) and `namespace`.
    pub(super) fn container_statuses(&self, pod_uid: &str, pod: &str, namespace: &str) -> Value {
        self.statuses(pod_uid, pod, namespace, false)
    }

    /// `status.ephemeralContainerStatuses`: as [`Self::container_statuses`], but never ready
    /// and without `started` (no prober looks at ephemeral containers).
    pub(super) fn ephemeral_statuses(&self, pod_uid: &str, pod: &str, namespace: &str) -> Value {
        self.statuses(pod_uid, pod, namespace, true)
    }

    fn statuses(&self, pod_uid: &str, pod: &str, namespace: &str, ephemeral: bool) -> Value {
        let terminated = |e: &Ended, name: &str| {
            json!({"terminated": {
                "exitCode": e.exit_code,
                "reason": if e.exit_code == 0 { "Completed" } else { "Error" },
                "startedAt": time_string(e.started),
                "finishedAt": time_string(e.finished),
                "containerID": container_id(pod_uid, name, e.attempt),
            }})
        };
        let list: Vec<Value> = self
            .runs
            .iter()
            .map(|r| {
                let running = matches!(r.state, State::Running(_));
                let state = match &r.state {
                    State::Running(since) => json!({"running": {"startedAt": time_string(*since)}}),
                    State::BackOff(_, wait) => json!({"waiting": {
                        "reason": "CrashLoopBackOff",
                        "message": format!(
                            "back-off {}s restarting failed container={} pod={pod}_{namespace}({pod_uid})",
                            wait.as_secs(), r.name
                        ),
                    }}),
                    State::ConfigError(message) => json!({"waiting": {
                        "reason": "CreateContainerConfigError", "message": message,
                    }}),
                    State::Ended(e) => terminated(e, &r.name),
                };
                let last = r
                    .last
                    .as_ref()
                    .filter(|_| !matches!(r.state, State::Ended(_)))
                    .map_or_else(|| json!({}), |e| terminated(e, &r.name));
                let mut status = json!({
                    "name": r.name, "image": r.image, "imageID": format!("sim://{}", r.image),
                    "ready": running, "restartCount": r.attempt, "started": running,
                    "state": state, "lastState": last,
                });
                if ephemeral && let Some(m) = status.as_object_mut() {
                    m.insert("ready".into(), json!(false));
                    m.remove("started");
                }
                if r.started_once {
                    status["containerID"] = json!(container_id(pod_uid, &r.name, r.attempt));
                }
                status
            })
            .collect();
        Value::Array(list)
    }
}

/// The ID of attempt `attempt` of container `name`.
pub(super) fn container_id(uid: &str, name: &str, attempt: i32) -> String {
    format!("sim://{uid}-{name}-{attempt}")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code
    use super::*;

    fn container(command: &str) -> Container {
        serde_json::from_value(
            json!({"name": "app", "image": "busybox", "command": ["sh", "-c", command]}),
        )
        .unwrap()
    }

    fn t(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap()
    }

    fn waiting_reason(l: &Lifecycle) -> Option<String> {
        let s = l.container_statuses("u", "p", "ns");
        s[0]["state"]["waiting"]["reason"]
            .as_str()
            .map(str::to_owned)
    }

    #[test]
    fn programs_are_read_from_the_command() {
        assert_eq!(program(&container("echo hi; sleep 5")), Program::Sleep(5));
        assert_eq!(program(&container("echo hi;exit 3")), Program::Exit(3));
        assert_eq!(program(&container("echo tick")), Program::Exit(0));
        assert_eq!(
            program(&container("date; echo done && true")),
            Program::Exit(0)
        );
        assert_eq!(program(&container("echo x; false")), Program::Exit(1));
        assert_eq!(
            program(&container("while true; do echo x; done")),
            Program::Forever
        );
        assert_eq!(program(&container("nginx -g daemon off")), Program::Forever);
        let perl: Container = serde_json::from_value(json!({"name": "pi", "image": "perl",
            "command": ["perl", "-Mbignum=bpi", "-wle", "print bpi(20)"]}))
        .unwrap_or_default();
        assert_eq!(program(&perl), Program::Exit(0));
        let image_entrypoint: Container =
            serde_json::from_value(json!({"name": "web", "image": "nginx"})).unwrap_or_default();
        assert_eq!(program(&image_entrypoint), Program::Forever);
        assert_eq!(
            program(&container("nginx -g daemon off;")),
            Program::Forever
        );
    }

    #[test]
    fn a_crashing_container_restarts_at_once_then_backs_off_doubling_to_five_minutes() {
        let mut l = Lifecycle::start(&[container("exit 1")], None, &[], t(0));
        assert_eq!(l.next_wake(), Some(t(0)));
        let happened = l.advance(t(0));
        // Ran, crashed, restarted at once (attempt 1), crashed again: now waiting 10 s.
        assert_eq!(
            happened,
            [Happening::BackOff {
                container: "app".into()
            }]
        );
        assert_eq!(l.runs[0].attempt, 1);
        assert_eq!(waiting_reason(&l).as_deref(), Some("CrashLoopBackOff"));
        assert_eq!(l.phase(), "Running");
        assert_eq!(l.unready(), ["app"]);
        let s = l.container_statuses("u", "p", "ns");
        assert_eq!(s[0]["lastState"]["terminated"]["exitCode"], 1);
        assert_eq!(s[0]["lastState"]["terminated"]["reason"], "Error");
        assert_eq!(
            s[0]["state"]["waiting"]["message"],
            "back-off 10s restarting failed container=app pod=p_ns(u)"
        );
        assert_eq!(s[0]["ready"], false);
        let mut waits = Vec::new();
        let mut now = t(0);
        for _ in 0..7 {
            let wake = l.next_wake().unwrap();
            waits.push(wake.duration_since(now).as_secs());
            now = wake;
            l.advance(now);
        }
        assert_eq!(waits, [10, 20, 40, 80, 160, 300, 300]);
        assert_eq!(l.runs[0].attempt, 8);
    }

    #[test]
    fn a_long_run_resets_the_back_off() {
        let mut l = Lifecycle::start(&[container("sleep 700")], Some("Always"), &[], t(0));
        l.advance(t(700));
        assert_eq!(l.runs[0].attempt, 1, "first restart at once");
        l.advance(t(1400));
        assert_eq!(l.runs[0].attempt, 2, "it ran 700 s: at once again");
        assert_eq!(waiting_reason(&l), None);
        let s = l.container_statuses("u", "p", "ns");
        assert_eq!(s[0]["lastState"]["terminated"]["reason"], "Completed");
        assert_eq!(
            s[0]["lastState"]["terminated"]["containerID"],
            "sim://u-app-1"
        );
        assert_eq!(s[0]["containerID"], "sim://u-app-2");
    }

    #[test]
    fn restart_policy_never_and_on_failure_end_for_good() {
        let mut never = Lifecycle::start(&[container("exit 3")], Some("Never"), &[], t(0));
        never.advance(t(0));
        assert_eq!(never.phase(), "Failed");
        assert_eq!(never.next_wake(), None);
        let mut ok = Lifecycle::start(&[container("sleep 1")], Some("OnFailure"), &[], t(0));
        ok.advance(t(1));
        assert_eq!(ok.phase(), "Succeeded");
        let s = ok.container_statuses("u", "p", "ns");
        assert_eq!(s[0]["state"]["terminated"]["reason"], "Completed");
        assert_eq!(s[0]["lastState"], json!({}));
    }

    #[test]
    fn an_added_ephemeral_container_runs_once_and_is_never_ready_or_restarted() {
        let mut l = Lifecycle::start(&[], Some("Never"), &[], t(0));
        assert!(!l.has("dbg"));
        let mut dbg = container("echo hi; exit 2");
        dbg.name = "dbg".into();
        l.add(&dbg, None, t(5));
        assert!(l.has("dbg"));
        let s = l.ephemeral_statuses("u", "p", "ns");
        assert_eq!(s[0]["state"]["running"]["startedAt"], time_string(t(5)));
        assert_eq!(s[0]["ready"], false);
        assert!(s[0].get("started").is_none());
        l.advance(t(6));
        let s = l.ephemeral_statuses("u", "p", "ns");
        assert_eq!(s[0]["state"]["terminated"]["exitCode"], 2);
        assert_eq!(s[0]["restartCount"], 0);
        assert_eq!(l.next_wake(), None, "never restarted");
    }

    #[test]
    fn a_configuration_error_holds_the_container_and_the_pod_pending_until_it_is_fixed() {
        let errors = [Some("configmap \"cfg\" not found".to_owned())];
        let mut l = Lifecycle::start(&[container("sleep 100000")], None, &errors, t(0));
        assert_eq!(l.phase(), "Pending");
        assert_eq!(
            waiting_reason(&l).as_deref(),
            Some("CreateContainerConfigError")
        );
        assert_eq!(l.blocked(), [0]);
        assert!(
            l.container_statuses("u", "p", "ns")[0]
                .get("containerID")
                .is_none()
        );
        l.set_config_error(0, None, t(5));
        assert_eq!(l.phase(), "Running");
        assert!(l.blocked().is_empty());
        assert_eq!(l.unready(), Vec::<&str>::new());
    }
}
