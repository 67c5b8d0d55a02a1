//! `tensile up`: the sandbox. An upper cluster and N lower clusters (simulated, TLS, on
//! loopback), simulated nodes of different sizes in each lower cluster, one virtual node per lower
//! cluster, one kubeconfig with a context per cluster, and a live status table. Ctrl-C stops it.

use std::fmt::Write as _;
use std::io::Write as _;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use tensile_bench::sandbox::{ExtenderRun, Sandbox, SandboxSpec, VirtualNodeRun};
use tensile_core::quantity::parse_quantity;
use tensile_placement::descheduler::DeschedulerConfig;
use tensile_sim::apiserver::kubeconfig;
use tensile_simkubelet::SimNode;

use crate::status::{ClusterCaches, show};

/// Flags of `tensile up`.
#[derive(Debug, clap::Args)]
pub struct UpArgs {
    /// Lower clusters, each shown upstairs as one virtual node.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u8).range(1..=50))]
    lower_clusters: u8,
    /// The nodes of each lower cluster, one `CPU:MEMORY` per node, comma-separated.
    #[arg(long, default_value = "8:32Gi,4:16Gi", value_delimiter = ',', value_parser = parse_node_size)]
    nodes: Vec<NodeSize>,
    /// Port of the upper cluster's API server; lower cluster i listens on PORT+i. 0: free ports.
    #[arg(long, default_value_t = 7443)]
    port: u16,
    /// Address every server listens on.
    #[arg(long, default_value = "127.0.0.1")]
    address: IpAddr,
    /// Where to write the kubeconfig (contexts `upper`, the current one, and `lower-1`, ...).
    #[arg(long, default_value = "tensile-up.kubeconfig")]
    kubeconfig_out: PathBuf,
    /// No live table: print the summary, then the table each time it changes.
    #[arg(long)]
    no_table: bool,
    /// Run every cluster on real control planes: etcd, kube-apiserver,
    /// kube-controller-manager and kube-scheduler from this folder (`scripts/k8s-bin` builds
    /// them); the nodes stay simulated. Without it the API servers are simulated.
    #[arg(long, env = "TENSILE_K8S_BIN", value_name = "DIR")]
    k8s_bin: Option<PathBuf>,
    /// With --k8s-bin: each lower cluster has one real node instead of the simulated
    /// `--nodes`: kubelet and kube-proxy from the same folder, Debian's containerd, runc and
    /// CNI plugins, CoreDNS, and the images `scripts/node-images` built (docs/sandbox.md).
    /// Needs root.
    #[arg(long)]
    real_nodes: bool,
}

/// One simulated node's size.
#[derive(Clone, Debug)]
struct NodeSize {
    cpu: String,
    memory: String,
}

fn parse_node_size(text: &str) -> Result<NodeSize, String> {
    let (cpu, memory) = text
        .split_once(':')
        .ok_or_else(|| format!("{text:?}: expected CPU:MEMORY, e.g. 8:32Gi"))?;
    for (what, q) in [("CPU", cpu), ("memory", memory)] {
        parse_quantity(q).map_err(|e| format!("{text:?}: invalid {what} {q:?}: {e}"))?;
    }
    Ok(NodeSize {
        cpu: cpu.to_owned(),
        memory: memory.to_owned(),
    })
}

/// The absolute path the kubeconfig will be written to, failing early, before anything starts,
/// when it cannot be written there. Nothing is created yet: a failed start leaves no empty file.
fn kubeconfig_target(path: &Path) -> anyhow::Result<PathBuf> {
    let resolved = (|| {
        let name = path.file_name().ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::InvalidInput, "not the path of a file")
        })?;
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        let target = std::fs::canonicalize(dir)?.join(name);
        tensile_testenv::secret_file::check_secret_writable(&target)?;
        Ok::<_, std::io::Error>(target)
    })();
    resolved.with_context(|| {
        format!(
            "cannot write the kubeconfig to {} (choose another path with --kubeconfig-out)",
            path.display()
        )
    })
}

/// A line of progress on stderr (stdout is for the summary and the table).
fn say(line: &str) {
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// A port already taken gets a hint on what to do; other errors stay as they are.
fn port_hint(e: anyhow::Error) -> anyhow::Error {
    let taken = e.chain().any(|c| {
        matches!(
            c.downcast_ref::<tensile_sim::apiserver::ApiServerError>(),
            Some(tensile_sim::apiserver::ApiServerError::Bind { .. })
        )
    });
    if taken {
        e.context("(is another `tensile up` running? choose other ports with --port)")
    } else {
        e
    }
}

fn progress(what: &str, started: Instant) {
    say(&format!(
        "  {what} ({:.1} s)",
        started.elapsed().as_secs_f64()
    ));
}

pub async fn run(args: UpArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    if args.nodes.is_empty() {
        bail!("--nodes needs at least one CPU:MEMORY");
    }
    if args.real_nodes
        && args
            .k8s_bin
            .as_ref()
            .is_none_or(|d| d.as_os_str().is_empty())
    {
        bail!(
            "--real-nodes needs real control planes: add --k8s-bin DIR (the folder scripts/k8s-bin prints)"
        );
    }
    let kubeconfig_path = kubeconfig_target(&args.kubeconfig_out)?;
    say("tensile up: starting");

    let spec = SandboxSpec {
        address: args.address,
        port: args.port,
        lowers: (1..=args.lower_clusters)
            .map(|i| {
                args.nodes
                    .iter()
                    .enumerate()
                    .map(|(j, s)| {
                        SimNode::new(format!("lower-{i}-node-{}", j + 1), &s.cpu, &s.memory)
                    })
                    .collect()
            })
            .collect(),
        webhook: true,
        descheduler: Some(DeschedulerConfig::default()),
        extender: Some(ExtenderRun::InProcess(Default::default())),
        k8s_bin: args.k8s_bin.clone().filter(|d| !d.as_os_str().is_empty()),
        virtual_nodes: VirtualNodeRun::InProcess(crate::virtual_node::start_in_sandbox),
        scheduler_qps: None,
        real_nodes: args.real_nodes,
    };
    let sandbox = Sandbox::start(spec, &|line| progress(line, started))
        .await
        .map_err(port_hint)?;
    let (upper, lowers, virtual_nodes) = (&sandbox.upper, &sandbox.lowers, &sandbox.virtual_nodes);

    let mut entries = vec![upper.kubeconfig_entry("upper")];
    entries.extend(lowers.iter().map(|l| l.kubeconfig_entry(&l.name)));
    // It holds administrator credentials.
    tensile_testenv::secret_file::write_secret(&kubeconfig_path, kubeconfig(&entries))
        .with_context(|| format!("writing the kubeconfig to {}", kubeconfig_path.display()))?;
    progress(
        &format!("kubeconfig written to {}", kubeconfig_path.display()),
        started,
    );
    let stop = sandbox.stop_token().clone();

    let upper_client = upper.client().await.context("upper cluster client")?;
    let upper_caches = ClusterCaches::start(&upper_client, true, &stop);
    let mut lower_caches = Vec::new();
    for lower in lowers {
        let client = lower
            .client()
            .await
            .with_context(|| format!("{} client", lower.name))?;
        lower_caches.push((
            lower.name.clone(),
            ClusterCaches::start(&client, false, &stop),
        ));
    }
    sandbox.wait_ready(Duration::from_secs(30)).await?;
    progress(
        &format!("virtual nodes {} Ready", virtual_nodes.join(", ")),
        started,
    );

    let header = header(&sandbox, &kubeconfig_path, started);
    let mut out = std::io::stdout().lock();
    writeln!(out, "{header}")?;
    out.flush()?;
    drop(out);

    let table = show(
        (!args.no_table).then_some(header.as_str()),
        &upper_caches,
        &lower_caches,
        &stop,
    );
    tokio::select! {
        r = table => r?,
        // SIGTERM too: the control planes of --k8s-bin are child processes to stop.
        r = crate::shutdown_signal() => r?,
    }
    say("tensile up: stopping");
    sandbox.stop().await;
    say("tensile up: stopped");
    Ok(())
}

fn header(sandbox: &Sandbox, kubeconfig: &Path, started: Instant) -> String {
    let (upper, lowers, virtual_nodes) = (&sandbox.upper, &sandbox.lowers, &sandbox.virtual_nodes);
    let k = kubeconfig.display();
    let mut h = format!(
        "tensile up: ready in {:.1} s. Ctrl-C stops everything.\n  upper    {}  (context upper, the current one)\n",
        started.elapsed().as_secs_f64(),
        upper.url()
    );
    for lower in lowers {
        let name = &lower.name;
        let _ = writeln!(h, "  {name}  {}  (context {name})", lower.url());
    }
    if let Some(dir) = &sandbox.real_dir {
        let _ = writeln!(
            h,
            "  real control planes (kube-apiserver, etcd, ...); their logs: {}",
            dir.display()
        );
    }
    let _ = write!(
        h,
        "  virtual nodes: {}\n  kubeconfig: {k}\n\nTry:\n  export KUBECONFIG={k}\n  kubectl get nodes\n  kubectl create deployment web --image=nginx --replicas=4 --port=80\n  kubectl get pods -o wide\n  kubectl --context lower-1 get pods -A -o wide\n  kubectl logs deploy/web\n  kubectl exec deploy/web -- hostname",
        virtual_nodes.join(", ")
    );
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{Api, PostParams};
    use serde_json::json;
    use tensile_testenv::eventually;

    #[test]
    fn node_sizes_are_cpu_colon_memory() {
        let s = parse_node_size("8:32Gi").unwrap();
        assert_eq!((s.cpu.as_str(), s.memory.as_str()), ("8", "32Gi"));
        assert!(parse_node_size("8").unwrap_err().contains("CPU:MEMORY"));
        assert!(
            parse_node_size("x:1Gi")
                .unwrap_err()
                .contains("invalid CPU")
        );
        assert!(
            parse_node_size("1:lots")
                .unwrap_err()
                .contains("invalid memory")
        );
    }

    fn pod_running_on(p: &Pod) -> Option<String> {
        let running = p.status.as_ref()?.phase.as_deref() == Some("Running");
        running
            .then(|| p.spec.as_ref()?.node_name.clone())
            .flatten()
    }

    /// The scenario placement is for (docs/placement.md), in the sandbox `tensile up` runs: a pod that cannot fit in lower
    /// cluster A (its nodes are too small, though their sum is not) ends Running in lower
    /// cluster B, through its controller (a Deployment) and re-created by the descheduler (a
    /// bare pod that opted in).
    #[tokio::test]
    async fn a_pod_that_cannot_fit_in_lower_cluster_a_ends_running_in_b() {
        let node = |name: &str, cpu: &str| SimNode::new(name, cpu, "16Gi");
        let descheduler = DeschedulerConfig {
            policy: tensile_core::deschedule::Policy {
                unschedulable_for: k8s_openapi::jiff::SignedDuration::from_secs(2),
                ..Default::default()
            },
            ..Default::default()
        };
        let sandbox = Sandbox::start(
            SandboxSpec {
                address: "127.0.0.1".parse().unwrap(),
                port: 0,
                // Upstairs lower-1 looks bigger (12 CPU) than lower-2 (9 CPU), so the upper
                // scheduler sends a 4-CPU pod there first; no node of lower-1 can hold it.
                // lower-2 holds two.
                lowers: vec![
                    vec![
                        node("a-1", "3"),
                        node("a-2", "3"),
                        node("a-3", "3"),
                        node("a-4", "3"),
                    ],
                    vec![node("b-1", "9")],
                ],
                webhook: true,
                descheduler: Some(descheduler),
                extender: None,
                k8s_bin: None,
                virtual_nodes: VirtualNodeRun::InProcess(crate::virtual_node::start_in_sandbox),
                scheduler_qps: None,
                real_nodes: false,
            },
            &|_| {},
        )
        .await
        .unwrap();
        sandbox.wait_ready(Duration::from_secs(30)).await.unwrap();
        let client = sandbox.upper.client().await.unwrap();
        let template = json!({"metadata": {"labels": {"app": "big", "virtual-pod": "true"}},
            "spec": {"containers": [{"name": "c", "image": "nginx",
                "resources": {"requests": {"cpu": "4", "memory": "1Gi"}}}]}});
        let deployment: k8s_openapi::api::apps::v1::Deployment = serde_json::from_value(json!({
            "metadata": {"name": "big"},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "big"}}, "template": template}
        }))
        .unwrap();
        Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(client.clone(), "default")
            .create(&PostParams::default(), &deployment)
            .await
            .unwrap();
        let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
        // It went to lower-1 first and was found Unschedulable there.
        eventually(
            60,
            "the Deployment's pod is Unschedulable on vk-lower-1",
            || async {
                pods.list(&Default::default())
                    .await
                    .unwrap()
                    .items
                    .iter()
                    .any(|p| {
                        p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some("vk-lower-1")
                            && p.status
                                .as_ref()
                                .and_then(|s| s.conditions.as_ref())
                                .is_some_and(|c| {
                                    c.iter()
                                        .any(|c| c.reason.as_deref() == Some("Unschedulable"))
                                })
                    })
                    .then_some(())
            },
        )
        .await;
        eventually(90, "the Deployment's pod Running on vk-lower-2", || async {
            let list = pods.list(&Default::default()).await.unwrap().items;
            list.iter()
                .any(|p| pod_running_on(p).as_deref() == Some("vk-lower-2"))
                .then_some(())
        })
        .await;

        // A bare pod that opted in is re-created under its name by the descheduler.
        let mut bare: Pod = serde_json::from_value(template).unwrap();
        bare.metadata.name = Some("bare".into());
        bare.metadata.annotations = Some(
            [(
                "descheduler.alpha.kubernetes.io/evict".to_owned(),
                "true".to_owned(),
            )]
            .into(),
        );
        bare.spec.as_mut().unwrap().node_name = Some("vk-lower-1".into());
        pods.create(&PostParams::default(), &bare).await.unwrap();
        let moved = eventually(90, "the bare pod Running on vk-lower-2", || async {
            let p = pods.get_opt("bare").await.unwrap()?;
            (pod_running_on(&p).as_deref() == Some("vk-lower-2")).then_some(p)
        })
        .await;
        let annotations = moved.metadata.annotations.unwrap();
        assert_eq!(annotations["sigs.k8s.io/deschedule-count"], "1");
        assert_eq!(annotations["tensile-kube.io/excluded-nodes"], "vk-lower-1");
        assert_eq!(annotations["descheduler.alpha.kubernetes.io/evict"], "true");
        sandbox.stop().await;
    }
}
