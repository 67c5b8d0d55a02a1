//! What the `tensile` binary writes to a file or a pipe: no colour codes, and an error as one
//! line without a backtrace, even with `RUST_BACKTRACE=1` in the environment.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

mod common;

use std::io::{BufRead as _, BufReader};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};

use common::{Killed, until};

fn tensile(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_tensile"));
    c.args(args)
        .env("RUST_BACKTRACE", "1")
        .env_remove("NO_COLOR")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

fn plain(text: &str) {
    let start: String = text.chars().take(400).collect();
    assert!(!text.contains("\x1b["), "colour codes in {start:?}...");
    assert!(
        !text.to_lowercase().contains("stack backtrace"),
        "a backtrace in {text}"
    );
}

#[test]
fn an_error_is_one_plain_line_without_a_backtrace() {
    let dir = std::env::temp_dir().join(format!("tensile-output-{}", std::process::id()));
    let missing = dir.join("no-such.kubeconfig");
    let out = tensile(&["webhook", "--kubeconfig", missing.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    plain(&err);
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(lines[0].starts_with("error: "), "{err}");
    assert!(lines[0].contains("no-such.kubeconfig"), "{err}");
    assert!(lines[0].contains(": "), "the causes follow: {err}");

    // A flag value clap refuses.
    let out = tensile(&["up", "--nodes", "8"]).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    plain(&err);
    assert!(err.contains("CPU:MEMORY"), "{err}");
}

#[test]
fn logs_to_a_pipe_have_no_colour_codes() {
    let dir = std::env::temp_dir().join(format!("tensile-output-logs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut child = tensile(&["sim", "--nodes", "1", "--kubeconfig-out"]);
    let mut child = child
        .arg(dir.join("kubeconfig"))
        .env("RUST_LOG", "debug")
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let _sim = Killed(child);
    let logs = Arc::new(Mutex::new(String::new()));
    let l = logs.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let mut l = l.lock().unwrap();
            l.push_str(&line);
            l.push('\n');
        }
    });
    until("debug logs", || logs.lock().unwrap().contains("DEBUG"));
    plain(&logs.lock().unwrap());
    let _ = std::fs::remove_dir_all(dir);
}
