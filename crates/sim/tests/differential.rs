//! Differential check: the simulator's `kubectl get` columns against a real Kubernetes API
//! server's, for every kind both serve. What the sandbox's documented commands print is
//! compared with real control planes by `tensile-cli::docs_verbatim` (real profile), and what
//! tensile-kube's components rely on by the whole suite running on both backends; this check
//! covers the kinds a sandbox user may list beyond those.
//!
//! Run it with the real binaries (it fails without them; the default nextest profile leaves it
//! out, the `real` profile runs it):
//!
//! ```sh
//! export TENSILE_K8S_BIN=$(scripts/k8s-bin | tail -1)
//! cargo nextest run -p tensile-sim --test differential
//! ```
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::collections::BTreeSet;
use std::fmt::Write as _;

use serde_json::Value;
use tensile_sim::apiserver::{ApiServer, ApiServerConfig, client_from_kubeconfig};
use tensile_testenv::real;

const TABLE: &str = "application/json;as=Table;v=v1;g=meta.k8s.io";

/// A simulated API server and a real control plane (files in a temporary folder named after
/// `what`), and a client of the real one.
async fn start_both(
    bin: &std::path::Path,
    what: &str,
) -> (
    std::path::PathBuf,
    ApiServer,
    real::RealCluster,
    kube::Client,
) {
    let dir = std::env::temp_dir().join(format!("tensile-{what}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let server = tensile_testenv::start_apiserver(ApiServerConfig::default())
        .await
        .unwrap()
        .0;
    let real_cluster = real::start(bin, &dir, "real").await.unwrap();
    let real_client = client_from_kubeconfig(&real_cluster.kubeconfig)
        .await
        .unwrap();
    (dir, server, real_cluster, real_client)
}

/// The columns of a Table: (name, type, format, priority).
fn columns(table: &Value) -> Vec<(String, String, String, i64)> {
    table["columnDefinitions"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            (
                c["name"].as_str().unwrap_or_default().to_owned(),
                c["type"].as_str().unwrap_or_default().to_owned(),
                c["format"].as_str().unwrap_or_default().to_owned(),
                c["priority"].as_i64().unwrap_or(0),
            )
        })
        .collect()
}

/// Every listable resource of an API server, as list paths, from its discovery.
async fn list_paths(client: &kube::Client) -> BTreeSet<String> {
    let mut paths = BTreeSet::new();
    let mut group_versions = vec![("/api/v1".to_owned(), String::new())];
    let groups = get_json(client, "/apis").await;
    for g in groups["groups"].as_array().into_iter().flatten() {
        if let Some(v) = g["preferredVersion"]["groupVersion"].as_str() {
            group_versions.push((format!("/apis/{v}"), v.to_owned()));
        }
    }
    for (prefix, _) in group_versions {
        let list = get_json(client, &prefix).await;
        for r in list["resources"].as_array().into_iter().flatten() {
            let name = r["name"].as_str().unwrap_or_default();
            let listable = r["verbs"]
                .as_array()
                .is_some_and(|v| v.iter().any(|v| v == "list"));
            if listable && !name.contains('/') {
                paths.insert(format!("{prefix}/{name}"));
            }
        }
    }
    paths
}

async fn get_json(client: &kube::Client, path: &str) -> Value {
    let req = http::Request::get(path).body(Vec::new()).unwrap();
    client.request::<Value>(req).await.unwrap_or(Value::Null)
}

async fn get_table(client: &kube::Client, path: &str) -> Value {
    let req = http::Request::get(path)
        .header("Accept", TABLE)
        .body(Vec::new())
        .unwrap();
    client.request::<Value>(req).await.unwrap_or(Value::Null)
}

/// `kubectl get` shows what the server's Table says: every resource the simulator serves
/// prints the real API server's columns (names, types, formats, priorities: `-o wide` shows
/// priority 1), and each row has as many cells as there are columns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_prints_the_columns_of_a_real_api_server() {
    let Some(bin) = real::bin_dir() else {
        panic!(
            "the differential checks need real Kubernetes binaries: set {} (scripts/k8s-bin)",
            real::BIN_ENV
        );
    };
    let (dir, server, real_cluster, real_client) = start_both(&bin, "tables").await;
    let sim_client = server.client().await.unwrap();
    let sim_paths = list_paths(&sim_client).await;
    let real_paths = list_paths(&real_client).await;
    let mut report = String::new();
    for path in &sim_paths {
        if !real_paths.contains(path) {
            let _ = writeln!(report, "{path}: not served by the real API server");
            continue;
        }
        let (sim, real) = tokio::join!(get_table(&sim_client, path), get_table(&real_client, path));
        let (s, r) = (columns(&sim), columns(&real));
        if s != r {
            let _ = writeln!(report, "{path}:\n  sim:  {s:?}\n  real: {r:?}");
        }
        for row in sim["rows"].as_array().into_iter().flatten() {
            let cells = row["cells"].as_array().map_or(0, Vec::len);
            if cells != s.len() {
                let _ = writeln!(
                    report,
                    "{path}: a simulator row has {cells} cells for {} columns",
                    s.len()
                );
                break;
            }
        }
    }
    drop(real_cluster);
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(report.is_empty(), "Table columns differ:\n{report}");
}
