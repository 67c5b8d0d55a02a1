//! A real node of a `TestEnv` cluster (`ClusterSpec::with_real_nodes`): it registers, runs a
//! real container with cluster DNS, and leaves nothing behind on this machine once dropped
//! (processes, mounts, cgroups, its network namespace, the host's route, files). Real control
//! planes and root only (.config/nextest.toml).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, AttachParams, PostParams};
use tensile_testenv::{ClusterSpec, TestEnv, eventually};

#[tokio::test]
async fn a_real_node_runs_a_container_with_cluster_dns_and_leaves_nothing_behind() {
    let env = TestEnv::start_with(vec![ClusterSpec::with_real_nodes("c1", 1)])
        .await
        .unwrap();
    let cluster = &env.clusters[0];
    let node = &cluster.real_nodes()[0];
    let (dir, netns, name) = (node.dir.clone(), node.netns(), node.name.clone());
    let pod_range = node.pod_cidr.trim_end_matches("0/24").to_owned();
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), "default");
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "box"},
        "spec": {
            "containers": [{
                "name": "box",
                "image": "registry.k8s.io/e2e-test-images/busybox:1.37.0-1",
                "command": ["sh", "-c", "echo hello from a real container; sleep 3600"],
            }],
        },
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let ip = eventually(180, "box Running on the real node", || async {
        let p = pods.get("box").await.ok()?;
        let status = p.status?;
        (status.phase.as_deref() == Some("Running")
            && p.spec?.node_name.as_deref() == Some(name.as_str()))
        .then_some(status.pod_ip?)
    })
    .await;
    assert!(
        ip.starts_with(&pod_range),
        "pod IP {ip} outside {pod_range}0/24"
    );
    let logs = pods.logs("box", &Default::default()).await.unwrap();
    assert_eq!(logs, "hello from a real container\n");
    // Cluster DNS: the pod's resolver is CoreDNS behind kube-dns, which knows the API's Service.
    let answer = eventually(180, "kubernetes.default resolved in the pod", || async {
        let mut exec = pods
            .exec(
                "box",
                ["nslookup", "kubernetes.default.svc.cluster.local"],
                &AttachParams::default().stderr(false),
            )
            .await
            .ok()?;
        let mut out = String::new();
        tokio::io::AsyncReadExt::read_to_string(&mut exec.stdout()?, &mut out)
            .await
            .ok()?;
        exec.join().await.ok()?;
        out.contains(&tensile_testenv::real_node::KUBERNETES_SERVICE.to_string())
            .then_some(out)
    })
    .await;
    assert!(answer.contains("198.19.0.1"), "{answer}");

    drop(env);
    // Nothing left: the namespace, the route, cgroups, mounts, processes and files.
    let netns_list = std::process::Command::new("ip")
        .args(["netns", "list"])
        .output()
        .unwrap();
    let netns_list = String::from_utf8_lossy(&netns_list.stdout);
    assert!(
        !netns_list
            .lines()
            .any(|l| l.split_whitespace().next() == Some(netns.as_str())),
        "{netns} left: {netns_list}"
    );
    let slot = netns.trim_start_matches("tensile-node-");
    let routes = std::process::Command::new("ip")
        .args(["route", "show", &format!("198.18.{slot}.0/24")])
        .output()
        .unwrap();
    assert!(
        routes.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&routes.stdout)
    );
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !mounts.contains(&dir.display().to_string()),
        "mounts left under {}",
        dir.display()
    );
    for hierarchy in ["cpu", "memory", "pids", "systemd"] {
        let path = std::path::Path::new("/sys/fs/cgroup")
            .join(hierarchy)
            .join(&netns);
        assert!(!path.exists(), "{} left", path.display());
    }
    assert!(!dir.exists(), "{} left", dir.display());
}
