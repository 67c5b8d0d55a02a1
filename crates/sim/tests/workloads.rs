//! Workloads as a user drives them with the real `kubectl`, on whichever backend TestEnv
//! runs: drains that wait for PodDisruptionBudgets, StatefulSets, DaemonSets and CronJobs.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

mod common;

use common::kubectl::Env;

/// The pods of `selector` as `name node ready` lines, sorted.
fn pods(env: &Env, selector: &str) -> Vec<(String, String, bool)> {
    let out = env.jsonpath(
        &["pods", "-l", selector],
        r#"{range .items[*]}{.metadata.name} {.spec.nodeName} {.status.conditions[?(@.type=="Ready")].status} {.metadata.deletionTimestamp}{"\n"}{end}"#,
    );
    let mut v: Vec<_> = out
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            // Terminating pods are left out, as `kubectl get` users read them as leaving.
            (f.len() >= 4 && f[3].is_empty())
                .then(|| (f[0].to_owned(), f[1].to_owned(), f[2] == "True"))
        })
        .collect();
    v.sort();
    v
}

#[test]
fn a_drain_waits_for_the_disruption_budget_and_evicts_once_it_allows() {
    let env = Env::start();
    // Both replicas on node 1.
    env.ok(&["cordon", "c1-node-2"]);
    env.ok(&[
        "create",
        "deployment",
        "db",
        "--image=postgres",
        "--replicas=2",
    ]);
    env.ok(&["rollout", "status", "deployment/db", "--timeout=60s"]);
    env.ok(&["uncordon", "c1-node-2"]);
    env.ok(&[
        "create",
        "poddisruptionbudget",
        "db",
        "--selector=app=db",
        "--min-available=2",
    ]);
    env.until("the budget counting 2 healthy pods", || {
        env.jsonpath(
            &["pdb", "db"],
            "{.status.currentHealthy}/{.status.desiredHealthy}/{.status.disruptionsAllowed}",
        ) == "2/2/0"
    });
    let before = pods(&env, "app=db");
    assert!(
        before.len() == 2 && before.iter().all(|p| p.1 == "c1-node-1"),
        "{before:?}"
    );

    // The budget allows no disruption: the drain retries and gives up, evicting nothing.
    let out = env.run(&["drain", "c1-node-1", "--timeout=12s"], &[], None);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("Cannot evict pod as it would violate the pod's disruption budget."),
        "{stderr}"
    );
    assert_eq!(
        pods(&env, "app=db"),
        before,
        "a refused eviction deletes nothing"
    );
    assert_eq!(
        env.jsonpath(&["node", "c1-node-1"], "{.spec.unschedulable}"),
        "true",
        "the drain cordoned the node"
    );

    // A third replica (on node 2, node 1 is cordoned) leaves room for one disruption at a
    // time: the drain evicts, waits for the replacement, evicts again.
    env.ok(&["scale", "deployment/db", "--replicas=3"]);
    let out = env.run(&["drain", "c1-node-1", "--timeout=120s"], &[], None);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("evicting pod default/db-") && stdout.contains("node/c1-node-1 drained"),
        "{stdout}"
    );
    env.until("three ready replicas on node 2", || {
        let now = pods(&env, "app=db");
        now.len() == 3 && now.iter().all(|p| p.1 == "c1-node-2" && p.2)
    });
}
