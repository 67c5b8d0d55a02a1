//! Faults of the control planes in the middle of a burst through one virtual node. The
//! scenarios are `tensile bench faults`, which fails (exit status 1, with VIOLATION lines) when
//! a lower pod is missing, created twice or deleted, an upper pod fails, is deleted or evicted,
//! the node is not Ready with its lower cluster reachable soon after the fault ends, or a
//! lasting outage of the lower cluster does not show (the node's condition, a Warning event on
//! the Node, `tensile status`). These tests run it with small bursts on the backend of the run
//! (simulated, or real control planes with TENSILE_K8S_BIN) and check its report.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stdout
)] // test code; the report goes to the output

use std::process::Command;

fn bench(faults: &str) -> String {
    // `--ready-within 5s`: the node asks an unreachable lower cluster again every second, so
    // it shows it back within a second or two; it used to wait for its next lease renewal
    // (up to 10 s).
    let out = Command::new(env!("CARGO_BIN_EXE_tensile"))
        .args([
            "bench",
            "faults",
            "--fault",
            faults,
            "--pods",
            "20",
            "--outage",
            "20s",
            "--ready-within",
            "5s",
        ])
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&out.stdout).into_owned();
    let errors = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{report}\n{errors}");
    // The times go to the test's output.
    println!("{report}");
    assert!(!report.contains("VIOLATION"), "{report}");
    report
}

/// The faults both backends have: the lower API server stopped (SIGSTOP; frozen connections
/// on the simulator) and killed, the upper one killed, the node's connection to the lower
/// cluster cut, and a third of the lower API requests answered 429/500.
#[test]
fn control_plane_faults_mid_burst_lose_nothing_and_show_while_they_last() {
    let report = bench(
        "lower-apiserver-stop,lower-network-cut,lower-errors,lower-apiserver-kill,upper-apiserver-kill",
    );
    for fault in [
        "lower-apiserver-stop",
        "lower-network-cut",
        "lower-errors",
        "lower-apiserver-kill",
        "upper-apiserver-kill",
    ] {
        let line = report
            .lines()
            .find(|l| l.starts_with(&format!("{fault}:")))
            .unwrap_or_else(|| panic!("no line for {fault}:\n{report}"));
        assert!(
            line.contains("lower pods: 20 listed, 0 created more than once, 0 deleted; upper pods failed 0, deleted 0, evicted 0"),
            "{line}"
        );
    }
    for fault in ["lower-apiserver-stop", "lower-network-cut", "lower-errors"] {
        let line = report
            .lines()
            .find(|l| l.starts_with(&format!("{fault}:")))
            .unwrap();
        assert!(
            line.contains("shown: condition true, event true, tensile status true"),
            "{line}"
        );
    }
}

/// etcd killed and started again on its data: real control planes only (the simulator keeps
/// its objects in memory); listed in the `default` profile's exclusions of
/// `.config/nextest.toml`.
#[test]
fn a_lower_etcd_killed_mid_burst_loses_nothing() {
    let report = bench("lower-etcd-kill");
    assert!(
        report.contains("lower pods: 20 listed, 0 created more than once, 0 deleted; upper pods failed 0, deleted 0, evicted 0"),
        "{report}"
    );
}
