//! End to end through the real `kubectl`: logs, exec (SPDY and WebSocket), attach,
//! port-forward (both transports) and top, for pods on simulated nodes, going API server ->
//! kubelet API exactly as on a real cluster.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tensile_testenv::kubectl::{Env, Running};

fn pod_manifest() -> &'static str {
    "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\n  labels: {app: web}\nspec:\n  containers:\n  - name: web\n    image: nginx:1.27\n    command: [\"sh\", \"-c\", \"echo hello from web; sleep 100000\"]\n    env: [{name: GREETING, value: hi}]\n    ports: [{containerPort: 8080}, {containerPort: 9090}]\n    resources: {requests: {cpu: 250m, memory: 64Mi}}\n"
}

fn setup() -> Env {
    let env = Env::start();
    let file = env.kubeconfig.with_file_name("web.yaml");
    std::fs::write(&file, pod_manifest()).unwrap();
    env.ok(&["apply", "-f", file.to_str().unwrap()]);
    env.until("pod running", || {
        env.ok(&["get", "pod", "web", "-o", "jsonpath={.status.phase}"]) == "Running"
    });
    env
}

#[test]
fn logs_exec_and_attach_through_the_api_server() {
    let env = setup();
    assert_eq!(
        env.ok(&["logs", "web"]),
        "container web of pod web started (image nginx:1.27)\nhello from web\n"
    );
    assert_eq!(env.ok(&["logs", "web", "--tail=1"]), "hello from web\n");

    // Follow streams new lines as they come.
    let mut follow = Running(
        env.cmd(&["logs", "-f", "web"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let mut stdout = follow.0.stdout.take().unwrap();
    let mut seen = String::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut buf = [0u8; 256];
    while !seen.contains("tick 2") {
        assert!(Instant::now() < deadline, "no streamed lines: {seen}");
        let n = stdout.read(&mut buf).unwrap();
        assert!(n > 0, "log stream ended: {seen}");
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    drop(follow);

    for (mode, envs) in [
        ("SPDY", vec![("KUBECTL_REMOTE_COMMAND_WEBSOCKETS", "false")]),
        ("WebSocket", vec![]),
    ] {
        let out = env.run(&["exec", "web", "--", "echo", "hi", "there"], &envs, None);
        assert_eq!(String::from_utf8_lossy(&out.stdout), "hi there\n", "{mode}");
        let out = env.run(&["exec", "web", "--", "env"], &envs, None);
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("GREETING=hi\n"),
            "{mode}"
        );
        let out = env.run(
            &["exec", "web", "--", "sh", "-c", "echo a; exit 3"],
            &envs,
            None,
        );
        assert_eq!(
            out.status.code(),
            Some(3),
            "{mode}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let out = env.run(
            &["exec", "-i", "web", "--", "cat"],
            &envs,
            Some(b"through stdin\n"),
        );
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "through stdin\n",
            "{mode}"
        );
        let out = env.run(&["exec", "web", "--", "nosuch"], &envs, None);
        assert!(!out.status.success());
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("executable file not found"),
            "{mode}"
        );
        let out = env.run(&["attach", "-i", "web"], &envs, Some(b"echoed\n"));
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains("attached to web") && text.contains("echoed"),
            "{mode}: {text}"
        );
    }
}

#[test]
fn port_forward_over_both_transports_and_top() {
    let env = setup();
    for envs in [vec![("KUBECTL_PORT_FORWARD_WEBSOCKETS", "false")], vec![]] {
        let mut pf = Running(
            env.cmd(&["port-forward", "pod/web", ":8080", ":9090"])
                .envs(envs.iter().copied())
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        );
        let port = tensile_testenv::forwarded_port(pf.0.stdout.take().unwrap()).unwrap();
        let handles: Vec<_> = (0..4)
            .map(|i| {
                std::thread::spawn(move || {
                    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
                    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
                    let msg = format!("connection {i} says hello");
                    s.write_all(msg.as_bytes()).unwrap();
                    let mut got = vec![0u8; msg.len()];
                    s.read_exact(&mut got).unwrap();
                    assert_eq!(got, msg.as_bytes());
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
    }
    env.until("pod metrics", || {
        env.run(&["top", "pod", "web", "--no-headers"], &[], None)
            .status
            .success()
    });
    let top = env.ok(&["top", "pod", "web", "--no-headers"]);
    let cols: Vec<&str> = top.split_whitespace().collect();
    // A real metrics-server derives the rate from two cumulative samples taken at slightly
    // different moments, so a steady 250m reads within a hair of it (251m), not exactly.
    let millicores = cols
        .get(1)
        .and_then(|c| c.strip_suffix('m'))
        .and_then(|m| m.parse::<u64>().ok());
    assert!(
        cols.len() == 3
            && cols[0] == "web"
            && millicores.is_some_and(|m| m.abs_diff(250) <= 5)
            && cols[2] == "64Mi",
        "{top}"
    );
    let nodes = env.ok(&["top", "node", "--no-headers"]);
    assert_eq!(nodes.lines().count(), 2, "{nodes}");
}

#[test]
fn a_crashing_container_backs_off_with_its_last_state_previous_log_and_events() {
    let env = Env::start();
    env.apply(
        "crash",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: crash}\nspec:\n  containers:\n  - name: app\n    \
         image: busybox\n    command: [sh, -c, 'echo boom; exit 1']\n",
    );
    // Ran, failed, restarted at once, failed again: waiting out 10 s.
    env.until("CrashLoopBackOff", || {
        env.jsonpath(
            &["pod", "crash"],
            "{.status.containerStatuses[0].state.waiting.reason}",
        ) == "CrashLoopBackOff"
    });
    let row = env.ok(&["get", "pod", "crash", "--no-headers"]);
    let cols: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cols[1..3], ["0/1", "CrashLoopBackOff"], "{row}");
    let status = |path: &str| env.jsonpath(&["pod", "crash"], path);
    assert_eq!(status("{.status.phase}"), "Running");
    assert_eq!(
        status("{.status.containerStatuses[0].lastState.terminated.exitCode}"),
        "1"
    );
    assert_eq!(
        status("{.status.containerStatuses[0].lastState.terminated.reason}"),
        "Error"
    );
    let restarts: i32 = status("{.status.containerStatuses[0].restartCount}")
        .parse()
        .unwrap();
    assert!(restarts >= 1);
    // RESTARTS says when the last run ended, as on any cluster: `1 (3s ago)`.
    assert!(cols[3].parse::<i32>().is_ok() && cols[5] == "ago)", "{row}");
    assert!(
        status("{.status.containerStatuses[0].state.waiting.message}")
            .starts_with("back-off 10s restarting failed container=app pod=crash_default("),
    );
    // The log of the latest run, and with --previous the one before (read until no restart
    // came between the two reads).
    let attempt = |log: &str| -> Option<i32> {
        let head = log.lines().next()?;
        let rest = head.strip_prefix("container app of pod crash started (image busybox")?;
        match rest.strip_prefix(", restart ") {
            Some(n) => n.strip_suffix(')')?.parse().ok(),
            None => (rest == ")").then_some(0),
        }
    };
    env.until("the current and the previous log", || {
        let current = env.ok(&["logs", "crash"]);
        let previous = env.ok(&["logs", "crash", "--previous"]);
        current.ends_with("boom\n")
            && previous.ends_with("boom\n")
            && matches!((attempt(&current), attempt(&previous)), (Some(c), Some(p)) if c >= 1 && p == c - 1)
    });
    // The kubelet's BackOff event, as `kubectl describe` shows it.
    env.until("the BackOff event", || {
        env.jsonpath(
            &[
                "events",
                "--field-selector",
                "involvedObject.name=crash,reason=BackOff",
            ],
            "{.items[*].message}",
        )
        .contains("Back-off restarting failed container app in pod crash_default(")
    });
    let described = env.ok(&["describe", "pod", "crash"]);
    assert!(
        described.contains("CrashLoopBackOff") && described.contains("Last State:"),
        "{described}"
    );

    // A container that never restarted has no previous log: the kubelet's 400, whose message
    // the API server passes on.
    env.apply(
        "steady",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: steady}\nspec:\n  containers:\n  - name: app\n    \
         image: busybox\n    command: [sleep, '100000']\n",
    );
    env.until("steady running", || {
        env.jsonpath(&["pod", "steady"], "{.status.phase}") == "Running"
    });
    let out = env.run(&["logs", "steady", "--previous"], &[], None);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success()
            && err.contains("previous terminated container \"app\" in pod \"steady\" not found"),
        "{err}"
    );
}

#[test]
fn the_environment_comes_from_configmaps_secrets_and_the_downward_api_and_a_missing_key_holds_the_container()
 {
    let env = Env::start();
    env.ok(&[
        "create",
        "configmap",
        "settings",
        "--from-literal=MODE=fast",
    ]);
    env.ok(&[
        "create",
        "secret",
        "generic",
        "creds",
        "--from-literal=password=s3cr3t",
    ]);
    env.apply(
        "app",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: app, labels: {tier: web}}\nspec:\n  containers:\n  \
         - name: app\n    image: busybox\n    command: [sleep, '100000']\n    \
         envFrom: [{configMapRef: {name: settings}, prefix: CFG_}]\n    env:\n    \
         - {name: PASSWORD, valueFrom: {secretKeyRef: {name: creds, key: password}}}\n    \
         - {name: POD_NAME, valueFrom: {fieldRef: {fieldPath: metadata.name}}}\n    \
         - {name: NODE_NAME, valueFrom: {fieldRef: {fieldPath: spec.nodeName}}}\n    \
         - {name: TIER, valueFrom: {fieldRef: {fieldPath: \"metadata.labels['tier']\"}}}\n    \
         - {name: GREETING, value: 'hello $(POD_NAME)'}\n",
    );
    env.until("app running", || {
        env.jsonpath(&["pod", "app"], "{.status.phase}") == "Running"
    });
    let node = env.jsonpath(&["pod", "app"], "{.spec.nodeName}");
    let vars = env.ok(&["exec", "app", "--", "env"]);
    for want in [
        "PASSWORD=s3cr3t".to_owned(),
        "CFG_MODE=fast".to_owned(),
        "POD_NAME=app".to_owned(),
        format!("NODE_NAME={node}"),
        "TIER=web".to_owned(),
        "GREETING=hello app".to_owned(),
    ] {
        assert!(vars.lines().any(|l| l == want), "{want} in\n{vars}");
    }
    // The API server's service, as every kubelet gives it.
    let api_ip = env.jsonpath(&["service", "kubernetes"], "{.spec.clusterIP}");
    assert!(
        vars.lines()
            .any(|l| l == format!("KUBERNETES_SERVICE_HOST={api_ip}")),
        "{vars}"
    );

    // A key that is not there yet: the container waits with the kubelet's reason, the pod stays
    // Pending, until the key appears.
    env.apply(
        "held",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: held}\nspec:\n  containers:\n  - name: app\n    \
         image: busybox\n    command: [sleep, '100000']\n    \
         env: [{name: LEVEL, valueFrom: {configMapKeyRef: {name: later, key: level}}}]\n",
    );
    env.until("CreateContainerConfigError", || {
        env.jsonpath(
            &["pod", "held"],
            "{.status.containerStatuses[0].state.waiting.reason}",
        ) == "CreateContainerConfigError"
    });
    assert_eq!(env.jsonpath(&["pod", "held"], "{.status.phase}"), "Pending");
    assert_eq!(
        env.jsonpath(
            &["pod", "held"],
            "{.status.containerStatuses[0].state.waiting.message}"
        ),
        "configmap \"later\" not found"
    );
    env.ok(&["create", "configmap", "later", "--from-literal=level=3"]);
    env.until("held running once its key exists", || {
        env.jsonpath(&["pod", "held"], "{.status.phase}") == "Running"
    });
    assert!(
        env.ok(&["exec", "held", "--", "env"])
            .lines()
            .any(|l| l == "LEVEL=3")
    );
}

#[test]
fn a_shell_with_and_without_a_terminal_kubectl_cp_and_attach_without_stdin() {
    let env = setup();
    // `sh` reading a script from stdin: files persist in the container between commands.
    let out = env.run(
        &["exec", "-i", "web", "--", "sh"],
        &[],
        Some(b"cd /tmp\necho \"hi $HOSTNAME\" > a.txt\ncat a.txt\nls\nfalse || echo recovered\nexit 4\necho never\n"),
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "hi web\na.txt\nrecovered\n",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(4));
    assert_eq!(
        env.ok(&["exec", "web", "--", "cat", "/tmp/a.txt"]),
        "hi web\n"
    );
    let out = env.run(&["exec", "web", "--", "sh", "-c", "nosuch"], &[], None);
    assert_eq!(out.status.code(), Some(127));
    assert!(String::from_utf8_lossy(&out.stderr).contains("sh: nosuch: not found"));

    // On a terminal: a prompt, the typed line echoed, CR LF line ends, Ctrl-C drops a line,
    // Ctrl-D ends the session.
    let script = format!(
        "kubectl --kubeconfig {} --request-timeout=20s exec -it web -- sh",
        env.kubeconfig.display()
    );
    let mut child = Running(
        Command::new("script")
            .args(["-qec", &script, "/dev/null"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut stdin = child.0.stdin.take().unwrap();
    let mut stdout = child.0.stdout.take().unwrap();
    let output = std::sync::Arc::new(std::sync::Mutex::new(Vec::<u8>::new()));
    let reader = std::thread::spawn({
        let output = output.clone();
        move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = stdout.read(&mut buf) {
                if n == 0 {
                    break;
                }
                output.lock().unwrap().extend_from_slice(&buf[..n]);
            }
            String::from_utf8_lossy(&output.lock().unwrap()).into_owned()
        }
    });
    // Keys typed before kubectl has put the terminal in raw mode are the local terminal's
    // (Ctrl-C would interrupt kubectl itself): press Enter until a prompt answers (the first
    // one may be dropped, see below), then type.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !String::from_utf8_lossy(&output.lock().unwrap()).contains("/ # ") {
        assert!(Instant::now() < deadline, "no prompt within 30 s");
        stdin.write_all(b"\r").unwrap();
        stdin.flush().unwrap();
        std::thread::park_timeout(Duration::from_millis(500));
    }
    let typed: &[&[u8]] = &[b"echo hi\r", b"echo dropped\x03", b"hostname\r", b"\x04"];
    for keys in typed {
        if let Err(e) = stdin.write_all(keys).and_then(|()| stdin.flush()) {
            let mut err = String::new();
            if let Some(mut stderr) = child.0.stderr.take() {
                let _ = stderr.read_to_string(&mut err);
            }
            panic!("typing {keys:?}: {e}; the session ended early: {err}");
        }
        std::thread::park_timeout(Duration::from_millis(300));
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.0.try_wait().unwrap().is_none() {
        assert!(
            Instant::now() < deadline,
            "the terminal session did not end"
        );
        std::thread::park_timeout(Duration::from_millis(100));
    }
    drop(stdin);
    let seen = reader.join().unwrap();
    // The first prompt is not asserted: kubectl's WebSocket client drops what arrives before
    // it has set up its streams ("Unknown stream id 1, discarding message"); the simulated
    // shell waits a quarter second before it, as a process takes to start, which is enough
    // on a quiet machine but promises nothing on a busy one.
    for want in [
        "hi\r\n/ # echo dropped^C\r\n",
        "/ # hostname\r\nweb\r\n",
        "/ # exit\r\n",
    ] {
        assert!(seen.contains(want), "{want:?} in {seen:?}");
    }
    assert!(!seen.contains("\r\ndropped"), "{seen:?}");

    // kubectl cp, both ways, through `tar` in the container.
    let dir = env.kubeconfig.with_file_name("cp");
    std::fs::create_dir_all(&dir).unwrap();
    let local = dir.join("data.txt");
    std::fs::write(&local, "line one\nline two\n").unwrap();
    env.ok(&["cp", local.to_str().unwrap(), "web:/tmp/data.txt"]);
    assert_eq!(
        env.ok(&["exec", "web", "--", "cat", "/tmp/data.txt"]),
        "line one\nline two\n"
    );
    let back = dir.join("back.txt");
    env.ok(&["cp", "web:/tmp/data.txt", back.to_str().unwrap()]);
    assert_eq!(
        std::fs::read_to_string(&back).unwrap(),
        "line one\nline two\n"
    );

    // attach without stdin streams the container's output until the client goes.
    let mut attach = Running(
        env.cmd(&["attach", "web"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let mut out = attach.0.stdout.take().unwrap();
    let mut seen = String::new();
    let mut buf = [0u8; 256];
    let deadline = Instant::now() + Duration::from_secs(30);
    while !seen.contains("tick 2") {
        assert!(Instant::now() < deadline, "attach: {seen}");
        let n = out.read(&mut buf).unwrap();
        assert!(n > 0, "attach ended: {seen}");
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
}

#[test]
fn kubectl_debug_adds_ephemeral_containers_with_logs_status_exec_and_stdin() {
    let env = setup();
    env.ok(&[
        "debug",
        "web",
        "--image=busybox",
        "-c",
        "dbg",
        "--",
        "sh",
        "-c",
        "echo hi from debug",
    ]);
    env.until("the debug container's log", || {
        let out = env.run(&["logs", "web", "-c", "dbg"], &[], None);
        String::from_utf8_lossy(&out.stdout).contains("hi from debug\n")
    });
    env.until("the debug container's status", || {
        env.ok(&[
            "get",
            "pod",
            "web",
            "-o",
            "jsonpath={.status.ephemeralContainerStatuses[0].name}",
        ]) == "dbg"
    });
    assert_eq!(
        env.ok(&["exec", "web", "-c", "dbg", "--", "echo", "inside"]),
        "inside\n"
    );
    // The pod's own containers are untouched and the pod stays ready.
    assert_eq!(
        env.ok(&[
            "get",
            "pod",
            "web",
            "-o",
            "jsonpath={.spec.containers[*].name} {.status.containerStatuses[0].restartCount} {.status.conditions[?(@.type==\"Ready\")].status}",
        ]),
        "web 0 True"
    );

    // A second debug container reading its stdin: what is piped in reaches its shell.
    let out = env.run(
        &[
            "debug",
            "-i",
            "web",
            "--image=busybox",
            "-c",
            "dbg2",
            "--",
            "sh",
        ],
        &[],
        Some(b"echo hello from stdin\nexit\n"),
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("hello from stdin\n"),
        "kubectl debug -i: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        env.ok(&[
            "get",
            "pod",
            "web",
            "-o",
            "jsonpath={.spec.ephemeralContainers[*].name}",
        ]),
        "dbg dbg2"
    );

    // A name taken by a container is refused by the API server.
    let out = env.run(
        &["debug", "web", "--image=busybox", "-c", "web", "--", "true"],
        &[],
        None,
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("Duplicate value"), "{err}");
}
