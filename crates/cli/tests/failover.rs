//! Two `tensile virtual-node --leader-elect` processes for one node; the leader is killed
//! (SIGKILL) in the middle of a 200-pod burst. The scenario is `tensile bench failover`, which
//! fails (exit status 1, with the reason) when a lower pod is missing, created twice or
//! deleted, or an upper pod does not reach Running; this test runs it on the backend of the
//! run (simulated, or real control planes with TENSILE_K8S_BIN) and checks its report.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::process::Command;

/// The number after `label` in the report, up to the next space.
fn number_after(report: &str, label: &str) -> f64 {
    let rest = report
        .split_once(label)
        .unwrap_or_else(|| panic!("no {label:?} in the report:\n{report}"))
        .1;
    rest.split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no number after {label:?} in the report:\n{report}"))
}

#[test]
fn killing_the_leader_mid_burst_loses_duplicates_and_deletes_no_pod() {
    let out = Command::new(env!("CARGO_BIN_EXE_tensile"))
        .args(["bench", "failover", "--pods", "200"])
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&out.stdout);
    let errors = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{report}\n{errors}");
    assert!(
        report.contains("lower pods: 200 listed, 200 seen, 0 created more than once, 0 deleted"),
        "{report}"
    );
    // The standby may take the lease 15 s after the last renewal, which came at most a retry
    // period (2 s) before the kill; the margin is for a loaded machine.
    let acquired = number_after(&report, "election lease held by the standby ");
    assert!((10.0..=20.0).contains(&acquired), "{report}");
    let first_write = number_after(&report, "node kubelet endpoint rewritten) ");
    assert!(first_write >= acquired && first_write <= 30.0, "{report}");
}

/// One `tensile virtual-node` (no `--leader-elect`) killed with SIGKILL in the middle of a
/// burst and started again at once with the same flags takes its dead predecessor's node lease
/// over at once (it used to exit, refused by the lease of the process it replaces), and the
/// burst ends with every pod created downstairs exactly once. Before the kill, a second live
/// process for the node is refused.
#[test]
fn a_node_killed_mid_burst_and_restarted_at_once_resumes_and_loses_nothing() {
    let out = Command::new(env!("CARGO_BIN_EXE_tensile"))
        // Killed once 10 lower pods exist (not the default half): on a fast simulator the
        // creates in flight when the kill lands once finished all 100, leaving the restarted
        // process no lower pod to create, so its first create could not be timed.
        .args([
            "bench",
            "failover",
            "--restart",
            "--pods",
            "100",
            "--kill-after",
            "10",
        ])
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&out.stdout);
    let errors = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{report}\n{errors}");
    // The times (restart -> first lower create among them) go to the test's output.
    println!("{report}");
    assert!(
        report.contains("lower pods: 100 listed, 100 seen, 0 created more than once, 0 deleted"),
        "{report}"
    );
    assert!(
        number_after(&report, "restart -> first lower pod created ").is_finite(),
        "{report}"
    );
    assert!(
        report
            .contains("a second live process for the node on this host: refused (exit status: 1)"),
        "{report}"
    );
}
