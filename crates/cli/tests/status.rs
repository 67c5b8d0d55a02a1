//! `tensile status` against an API server that does not answer: one clear error naming the
//! URL, and a non-zero exit within seconds.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code

use std::process::Command;
use std::time::{Duration, Instant};

#[test]
fn status_once_against_an_unreachable_server_fails_at_once_naming_the_url() {
    // A port nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = std::env::temp_dir().join(format!("tensile-status-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:{port}\n    insecure-skip-tls-verify: true\ncontexts:\n- name: c\n  context: {{cluster: c, user: u}}\nusers:\n- name: u\n  user: {{token: t}}\ncurrent-context: c\n"
        ),
    )
    .unwrap();
    let started = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_tensile"))
        .args(["status", "--once", "--kubeconfig"])
        .arg(&kubeconfig)
        .env_remove("RUST_LOG")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Deadline: well above the 5 s it may wait, well below forever.
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "still running after 30 s; stderr so far:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::park_timeout(Duration::from_millis(100));
    }
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "took {:?}",
        started.elapsed()
    );
    assert!(
        stderr.contains(&format!("https://127.0.0.1:{port}")) && stderr.contains("refused"),
        "{stderr}"
    );
    assert!(
        stderr.lines().filter(|l| !l.trim().is_empty()).count() <= 2,
        "one message, not a log line per retry:\n{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
