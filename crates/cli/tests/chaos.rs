//! `tensile bench chaos`, short: two minutes of overlapping faults of every kind under churn,
//! with a fixed seed, on real control planes (.config/nextest.toml: the schedule has etcd
//! faults, which the simulator does not have). The benchmark exits 1 on any invariant
//! violation; this test checks that it did not and that its report is whole.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stdout
)] // test code; the report goes to the output

use std::process::Command;

/// The seed: its two minutes have, among others, a node's leader killed, an etcd compaction
/// and a one-way partition (`--dry-run` prints the schedule).
const SEED: &str = "15";

#[test]
fn two_minutes_of_random_faults_under_churn_break_no_invariant() {
    let out = Command::new(env!("CARGO_BIN_EXE_tensile"))
        .args(["bench", "chaos", "--duration", "2m", "--seed", SEED])
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&out.stdout).into_owned();
    let errors = String::from_utf8_lossy(&out.stderr);
    println!("{report}");
    assert!(out.status.success(), "{report}\n{errors}");
    assert!(!report.contains("VIOLATION"), "{report}");
    let last: serde_json::Value =
        serde_json::from_str(report.lines().last().unwrap_or_default()).unwrap();
    assert_eq!(last["seed"], 15, "{last}");
    assert_eq!(last["violations"], 0, "{last}");
    assert!(last["pods_created"].as_u64().unwrap() > 10, "{last}");
    let faults: u64 = last["faults"]
        .as_object()
        .unwrap()
        .values()
        .filter_map(serde_json::Value::as_u64)
        .sum();
    assert!(faults >= 5, "{last}");
    assert_eq!(last["faults_not_injected"], 0, "{last}");
}

/// The schedule is the seed's alone: two dry runs print the same one, another seed another.
#[test]
fn a_seed_replays_its_schedule() {
    let schedule = |seed: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_tensile"))
            .args(["bench", "chaos", "--dry-run", "--duration", "10m"])
            .args(["--seed", seed])
            .output()
            .unwrap();
        assert!(out.status.success());
        String::from_utf8(out.stdout).unwrap()
    };
    let first = schedule(SEED);
    assert!(first.contains("faults planned"), "{first}");
    assert_eq!(first, schedule(SEED));
    assert_ne!(first, schedule("16"));
}
