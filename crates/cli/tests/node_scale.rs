//! `tensile bench node-scale` at a tiny size, on the backend of the run (simulated, or real
//! control planes with TENSILE_K8S_BIN): every phase runs to its end, and the restart of a node
//! with running pods loses, deletes and duplicates none of them and writes nothing that did
//! not change.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::process::Command;

#[test]
fn every_phase_runs_and_a_restart_loses_and_writes_nothing() {
    let out = Command::new(env!("CARGO_BIN_EXE_tensile"))
        .args([
            "bench",
            "node-scale",
            "--pods",
            "40",
            "--steady",
            "5s",
            "--rolling-percent",
            "10",
            "--phase-timeout",
            "240s",
        ])
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&out.stdout);
    let errors = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{report}\n{errors}");
    let last = report.lines().last().expect("a report");
    let v: serde_json::Value = serde_json::from_str(last).expect("the last line is JSON");
    assert_eq!(v["pods"], 40, "{report}");
    for zero in ["lost", "deleted", "duplicated", "restart_writes"] {
        assert_eq!(v[zero].as_f64(), Some(0.0), "{zero}: {report}");
    }
    for phase in ["burst", "steady", "restart", "rolling", "delete"] {
        assert!(
            v["phases"][phase]["wall_s"].as_f64().is_some(),
            "{phase}: {report}"
        );
    }
    assert!(v["rolling_pods"].as_u64().unwrap() >= 4, "{report}");
    // The node's own allocator says what its state holds (the binary is built with jemalloc).
    let heap = v["steady_heap_mib"].as_f64().expect("the live heap");
    assert!(
        heap > 0.0 && heap < v["steady_rss_mib"].as_f64().unwrap(),
        "{report}"
    );
    assert!(v["heap_kib_per_pod_at_rest"].as_f64().is_some(), "{report}");
}
